#!/bin/sh
# wheel.sh: the gmr-runtime wheel, as a user gets it.  Builds it offline
# (python/build-wheel.sh), checks that it is a platform wheel carrying
# libgmr.so.0 (and libgmr-preload.so when built), the ready configurations
# and the LICENSE, installs it into a fresh virtual environment with no
# network, and from an empty folder, with nothing set, imports gmr and runs
# gmr.compare: it must load the bundled library, by name find the bundled
# configurations, and give gmr-compare --json's figures.  Skips without a
# shared build or without Python's build tools (Debian: python3-build
# python3-setuptools python3-wheel python3-venv).
BLD=${GMR_BUILDDIR:-.}
SRC=$(cd "${GMR_SRCDIR:-.}" && pwd)
BLD=$(cd "$BLD" && pwd)
if [ ! -f "$BLD/lib/.libs/libgmr.so.0" ]; then
  echo "1..0 # SKIP libgmr.so was not built (--disable-shared?)"
  exit 0
fi
if ldd "$BLD/lib/.libs/libgmr.so.0" 2>/dev/null | grep -q 'lib[at]san'; then
  echo "1..0 # SKIP a sanitizer build: the wheel is tested on the plain build"
  exit 0
fi
version=$(sed -n 's/^#define GMR_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' "$SRC/include/gmr.h" | paste -sd. -)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-wheel.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

n=0
result() { # ok|fail description
  n=$((n + 1))
  if [ "$1" = ok ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}

if ! whl=$(sh "$SRC/python/build-wheel.sh" "$SRC" "$BLD" "$tmp/dist" 2>"$tmp/build.err"); then
  if grep -q "no Python with setuptools" "$tmp/build.err"; then
    echo "1..0 # SKIP $(cat "$tmp/build.err")"
    exit 0
  fi
  echo "not ok 1 - the wheel builds"
  sed 's/^/# /' "$tmp/build.err" | tail -30
  echo "1..1"
  exit 1
fi
result ok "the wheel builds offline: $(basename "$whl")"
case $(basename "$whl") in
*-py3-none-any.whl) result fail "a platform wheel (not 'any')" ;;
*-py3-none-linux_*.whl) result ok "a platform wheel" ;;
*) result fail "a platform wheel: $(basename "$whl")" ;;
esac

# The Python that built it (it has venv and ensurepip on Debian).
py=""
for cand in ${PYTHON3:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import build, ensurepip, venv' 2>/dev/null; then
    py=$cand; break
  fi
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import ensurepip, venv, setuptools, wheel' 2>/dev/null; then
    py=$cand; break
  fi
done

"${py:-python3}" - "$whl" >"$tmp/contents" 2>&1 <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
print("\n".join(sorted(names)))
PYEOF
for f in gmr/libgmr.so.0 gmr/__init__.py gmr/_replay.py gmr/_torch.py gmr/csrc/gmr_torch.cpp gmr/include/gmr.h gmr/config/pytorch.yaml gmr/config/tf-growth.yaml; do
  if grep -qx "$f" "$tmp/contents"; then result ok "it carries $f"; else result fail "it carries $f"; fi
done
if [ -f "$BLD/lib/.libs/libgmr-preload.so" ]; then
  if grep -qx gmr/libgmr-preload.so "$tmp/contents"; then result ok "it carries gmr/libgmr-preload.so"
  else result fail "it carries gmr/libgmr-preload.so"; fi
fi
if grep -qx gmr/libyaml-0.so.2 "$tmp/contents" && grep -qx gmr/LICENSE.libyaml "$tmp/contents"; then
  result ok "it carries libyaml-0.so.2 and its license"
else result fail "it carries libyaml-0.so.2 and its license"; fi
if command -v patchelf >/dev/null 2>&1; then
  mkdir "$tmp/x" && (cd "$tmp/x" && "${py:-python3}" -m zipfile -e "$whl" . >/dev/null 2>&1)
  for so in libgmr.so.0 libgmr-preload.so; do
    [ -f "$tmp/x/gmr/$so" ] || continue
    rp=$(patchelf --print-rpath "$tmp/x/gmr/$so" 2>/dev/null)
    [ "$rp" = '$ORIGIN' ]
    result $([ $? -eq 0 ] && echo ok || echo fail) "its $so looks beside itself only (RUNPATH $rp)"
  done
fi
if grep -q '\.dist-info/.*LICENSE' "$tmp/contents"; then result ok "it carries the LICENSE"
else result fail "it carries the LICENSE"; fi

if [ -z "$py" ]; then
  echo "ok $((n + 1)) - installs in a fresh venv # SKIP no python3 with venv and ensurepip (python3-venv)"
  echo "1..$((n + 1))"
  exit 0
fi
if ! "$py" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  result fail "a fresh virtual environment"
  sed 's/^/# /' "$tmp/venv.log"
  echo "1..$n"
  exit 1
fi
if PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$tmp/venv/bin/python" -m pip install --no-index \
  --no-deps -q "$whl" >"$tmp/pip.log" 2>&1; then
  result ok "pip installs it in a fresh venv with no index"
else
  result fail "pip installs it in a fresh venv with no index"
  sed 's/^/# /' "$tmp/pip.log" | tail -20
fi

# The figures gmr-compare prints, for the same trace and configurations.
"$BLD/tools/gmr-compare" --json "$SRC/tests/fixtures/compare-small.csv" \
  "$SRC/config/pytorch.yaml" "$SRC/config/tf-growth.yaml" >"$tmp/want.json" 2>/dev/null
mkdir "$tmp/empty"
(cd "$tmp/empty" && env -u GMR_LIBRARY -u GMR_CONFIG -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONPATH \
  -u PYTHONHOME "$tmp/venv/bin/python" - "$SRC/tests/fixtures/compare-small.csv" "$tmp/want.json" \
  "$tmp/venv" >"$tmp/run.log" 2>&1 <<'PYEOF'
import json, os, sys
import gmr
lib = gmr.library()
site = os.path.realpath(sys.argv[3])
print("library", lib.origin, lib.path)
assert lib.origin == "bundled", lib
assert os.path.realpath(lib.path).startswith(site), (lib.path, site)
assert gmr.__version__ == lib.version
got = gmr.compare(sys.argv[1], ["pytorch", "tf-growth"])
want = json.load(open(sys.argv[2]))
drop = {"seconds", "events_per_second", "source"}
strip = lambda runs: [{k: v for k, v in r.items() if k not in drop} for r in runs]
assert strip(got) == strip(want), (got, want)
assert all(r["source"].startswith(site) for r in got), [r["source"] for r in got]
print("compare", [(r["config"], r["peak_reserved"]) for r in got])
PYEOF
) && ok=ok || ok=fail
result $ok "from an empty folder with nothing set: import gmr loads the bundled libgmr and gmr.compare gives gmr-compare's figures"
sed 's/^/# /' "$tmp/run.log" | tail -20
(cd "$tmp/empty" && env -u GMR_LIBRARY -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONPATH \
  "$tmp/venv/bin/python" -m gmr >"$tmp/m.log" 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "^libgmr $version: .*/site-packages/gmr/libgmr.so.0 (bundled)$" "$tmp/m.log"
result $([ $? -eq 0 ] && echo ok || echo fail) "python -m gmr says it loaded the bundled libgmr"
sed 's/^/# /' "$tmp/m.log"
echo "1..$n"
