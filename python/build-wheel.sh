#!/bin/sh
# build-wheel.sh: the gmr-runtime wheel, offline, with the build tools of the
# system's Python (Debian: python3-build or python3-pip, python3-setuptools,
# python3-wheel) and patchelf.  `make wheel` runs it.
#
#   python/build-wheel.sh SRCDIR BUILDDIR OUTDIR
#
# It stages python/ with LICENSE, the build's libgmr.so.0 (and
# libgmr-preload.so when built), the system's libyaml-0.so.2 with its license
# and config/*.yaml into OUTDIR/stage, gives the wheel's libgmr RUNPATH
# $ORIGIN, computes the manylinux tag from what the ELF files need
# (python/manylinux.py, Note [Manylinux policy]; GMR_MANYLINUX=TAG asks for
# a tag and fails if the build needs a newer one), then builds the wheel from
# there without network or build isolation, so the source tree gets no build/
# or *.egg-info, and checks the wheel itself (its tag, RECORD, ELF files).
# The wheel's version is gmr.__version__, which must equal the library's
# (configure's VERSION).  Prints the wheel's path last.
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
# An older build's wheel (another version or tag) would be taken for this
# one by the globs that pick dist/gmr_runtime-*.whl (scripts/gpu/bundle.sh).
rm -f "$out"/gmr_runtime-*.whl
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gmr/config" "$stage/gmr/csrc" "$stage/gmr/include"
cp "$src/python/pyproject.toml" "$src/python/setup.py" "$src/python/README.md" "$src/LICENSE" "$stage/"
cp "$src"/python/gmr/*.py "$stage/gmr/"
# The native PyTorch adapter's source and the header it includes: _torch.py
# compiles them against the user's torch on first use.
cp "$src"/python/gmr/csrc/gmr_torch.cpp "$stage/gmr/csrc/"
cp "$src"/include/gmr.h "$stage/gmr/include/"
cp "$src"/config/*.yaml "$stage/gmr/config/"
cp -L "$lib" "$stage/gmr/libgmr.so.0"
# libyaml, the one library libgmr needs that the manylinux policy does not
# allow from the system: the wheel carries the system's copy, with its
# license, beside libgmr.so.0, which finds it through RUNPATH $ORIGIN.
yaml=$(ldd "$lib" 2>/dev/null | awk '/libyaml-0\.so\.2/ {print $3}')
if [ -z "$yaml" ] || [ ! -f "$yaml" ]; then
  echo "build-wheel.sh: ldd $lib names no libyaml-0.so.2 to bundle (apt-get install libyaml-0-2)" >&2
  exit 1
fi
cp -L "$yaml" "$stage/gmr/libyaml-0.so.2"
for c in /usr/share/doc/libyaml-0-2/copyright /usr/share/doc/libyaml/copyright; do
  if [ -f "$c" ]; then cp "$c" "$stage/gmr/LICENSE.libyaml"; break; fi
done
if [ ! -f "$stage/gmr/LICENSE.libyaml" ]; then
  echo "build-wheel.sh: libyaml's license (/usr/share/doc/libyaml-0-2/copyright) was not found: the wheel carries libyaml, so it needs it" >&2
  exit 1
fi
if [ -f "$bld/lib/.libs/libgmr-preload.so" ]; then
  cp -L "$bld/lib/.libs/libgmr-preload.so" "$stage/gmr/libgmr-preload.so"
fi
chmod u+w "$stage"/gmr/*.so* "$stage"/* 2>/dev/null || true
# The build's libgmr.so.0 has no RUNPATH (the system's copy needs none), and
# its libgmr-preload.so searches the build tree before $ORIGIN (libtool's
# uninstalled RUNPATH): in the wheel, both get $ORIGIN alone.
if ! command -v patchelf >/dev/null 2>&1; then
  echo "build-wheel.sh: no patchelf: the wheel's libgmr.so.0 needs RUNPATH \$ORIGIN to find its libyaml (apt-get install patchelf)" >&2
  exit 1
fi
for so in "$stage"/gmr/libgmr.so.0 "$stage"/gmr/libgmr-preload.so; do
  if [ -f "$so" ]; then patchelf --set-rpath '$ORIGIN' "$so"; fi
done
GMR_WHEEL_PLAT=$("$py" "$src/python/manylinux.py" tag "$stage/gmr" ${GMR_MANYLINUX:+--plat "$GMR_MANYLINUX"}) || {
  echo "build-wheel.sh: the wheel breaks the manylinux policy (above)" >&2
  exit 1
}
export GMR_WHEEL_PLAT

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
whl=$(ls "$out"/gmr_runtime-"$want"-py3-none-"$GMR_WHEEL_PLAT".whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "build-wheel.sh: no gmr_runtime-$want-py3-none-$GMR_WHEEL_PLAT.whl was written in $out" >&2; exit 1; }
if ! "$py" "$src/python/manylinux.py" check "$whl" ${GMR_MANYLINUX:+--plat "$GMR_MANYLINUX"} >/dev/null; then
  echo "build-wheel.sh: $whl fails the manylinux check (above): removed" >&2
  rm -f "$whl"
  exit 1
fi
echo "$whl"
