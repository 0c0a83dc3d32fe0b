#!/bin/sh
# build-wheel.sh: the gmr-runtime wheel, offline, with the build tools of the
# system's Python (Debian: python3-build or python3-pip, python3-setuptools,
# python3-wheel).  `make wheel` runs it.
#
#   python/build-wheel.sh SRCDIR BUILDDIR OUTDIR
#
# It stages python/ with LICENSE, the build's libgmr.so.0 (and
# libgmr-preload.so when built) and config/*.yaml into OUTDIR/stage, then
# builds a platform wheel from there without network or build isolation, so
# the source tree gets no build/ or *.egg-info.  The wheel's version is
# gmr.__version__, which must equal the library's (configure's VERSION).
# Prints the wheel's path last.
set -eu
src=$1 bld=$2 out=$3

lib="$bld/lib/.libs/libgmr.so.0"
if [ ! -f "$lib" ]; then
  echo "build-wheel.sh: $lib was not built: the wheel needs a shared libgmr (configure without --disable-shared, then make)" >&2
  exit 1
fi

# A Python with setuptools (>= 61), wheel, and a frontend (build, or pip).
py=""
for cand in ${PYTHON3:-} python3 /usr/bin/python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c 'import setuptools, wheel, sys; v = tuple(int(x) for x in setuptools.__version__.split(".")[:2]); sys.exit(v < (61, 0))' 2>/dev/null; then
    if "$cand" -c 'import build' 2>/dev/null; then py=$cand frontend=build; break; fi
    if "$cand" -m pip --version >/dev/null 2>&1; then py=$cand frontend=pip; break; fi
  fi
done
if [ -z "$py" ]; then
  echo "build-wheel.sh: no Python with setuptools >= 61, wheel and build (or pip); on Debian: apt-get install python3-build python3-setuptools python3-wheel" >&2
  exit 1
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/gmr/config" "$stage/gmr/csrc" "$stage/gmr/include"
cp "$src/python/pyproject.toml" "$src/python/setup.py" "$src/python/README.md" "$src/LICENSE" "$stage/"
cp "$src"/python/gmr/*.py "$stage/gmr/"
# The native PyTorch adapter's source and the header it includes: _torch.py
# compiles them against the user's torch on first use.
cp "$src"/python/gmr/csrc/gmr_torch.cpp "$stage/gmr/csrc/"
cp "$src"/include/gmr.h "$stage/gmr/include/"
cp "$src"/config/*.yaml "$stage/gmr/config/"
cp -L "$lib" "$stage/gmr/libgmr.so.0"
# libyaml, for hosts without it (the wheel's libgmr.so.0 gets RUNPATH
# $ORIGIN below; _lib.py loads this copy only when the system has none),
# with its license.
yaml=$(ldd "$lib" 2>/dev/null | awk '/libyaml-0\.so\.2/ {print $3}')
if [ -n "$yaml" ] && [ -f "$yaml" ]; then
  cp -L "$yaml" "$stage/gmr/libyaml-0.so.2"
  for c in /usr/share/doc/libyaml-0-2/copyright /usr/share/doc/libyaml/copyright; do
    if [ -f "$c" ]; then cp "$c" "$stage/gmr/LICENSE.libyaml"; break; fi
  done
  if [ ! -f "$stage/gmr/LICENSE.libyaml" ]; then
    echo "build-wheel.sh: libyaml's license was not found; the wheel will not carry libyaml" >&2
    rm -f "$stage/gmr/libyaml-0.so.2"
  fi
fi
if [ -f "$bld/lib/.libs/libgmr-preload.so" ]; then
  cp -L "$bld/lib/.libs/libgmr-preload.so" "$stage/gmr/libgmr-preload.so"
fi
chmod u+w "$stage"/gmr/*.so* "$stage"/* 2>/dev/null || true
# The build's libgmr.so.0 has no RUNPATH (the system's copy needs none), and
# its libgmr-preload.so searches the build tree before $ORIGIN (libtool's
# uninstalled RUNPATH): in the wheel, both get $ORIGIN alone (with patchelf;
# without it libgmr.so.0 has none, and _lib.py's loading the bundled libyaml
# first still serves hosts without libyaml).
if command -v patchelf >/dev/null 2>&1; then
  for so in "$stage"/gmr/libgmr.so.0 "$stage"/gmr/libgmr-preload.so; do
    [ -f "$so" ] && patchelf --set-rpath '$ORIGIN' "$so"
  done
else
  echo "build-wheel.sh: no patchelf: the wheel's libgmr.so.0 gets no RUNPATH \$ORIGIN (apt-get install patchelf)" >&2
fi

want=$(sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' "$src/python/gmr/__init__.py")
have=$(sed -n 's/^#define GMR_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' "$src/include/gmr.h" | paste -sd. -)
if [ "$want" != "$have" ]; then
  echo "build-wheel.sh: python/gmr/__init__.py says __version__ = $want, include/gmr.h says $have" >&2
  exit 1
fi

(
  cd "$stage"
  export PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
  if [ "$frontend" = build ]; then
    "$py" -m build --wheel --no-isolation --outdir "$out" . >"$out/build.log" 2>&1
  else
    "$py" -m pip wheel --no-deps --no-build-isolation --no-index -w "$out" . >"$out/build.log" 2>&1
  fi
) || { cat "$out/build.log" >&2; exit 1; }
rm -rf "$stage"
whl=$(ls "$out"/gmr_runtime-"$want"-*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "build-wheel.sh: no wheel was written in $out" >&2; exit 1; }
echo "$whl"
