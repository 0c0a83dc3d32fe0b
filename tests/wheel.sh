#!/bin/sh
# wheel.sh: the gmr-runtime wheel, as a user gets it.  First the manylinux
# check (python/manylinux.py) on stubs built here: one that needs a library
# the policy refuses, a too-new version, a RUNPATH outside the wheel or a
# refused symbol fails it; GLIBC_2.17 makes manylinux_2_17 and its
# manylinux2014 alias.  Then builds the wheel offline (python/build-wheel.sh),
# checks that its tag is manylinux_2_X, X the newest GLIBC version its ELF
# files need (by readelf), that its RECORD lists every file with its hash,
# that it carries libgmr.so.0 (RUNPATH $ORIGIN, where the build's has none),
# libyaml-0.so.2, libgmr-preload.so when built, the ready configurations and
# the LICENSE, installs it into a fresh virtual environment with no network,
# and from an empty folder, with nothing set, imports gmr and runs
# gmr.compare: it must load the bundled libgmr and libyaml (/proc/self/maps,
# ldd), by name find the bundled configurations, and give gmr-compare
# --json's figures.  Skips without a shared build; the wheel's steps skip
# without Python's build tools or patchelf (Debian: python3-build
# python3-setuptools python3-wheel python3-venv patchelf).
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

plan() { # the plan line, then exit with $1
  echo "1..$n"
  exit "$1"
}
py0=$(command -v python3 || command -v /usr/bin/python3)
if [ -z "$py0" ]; then
  echo "1..0 # SKIP no python3"
  exit 0
fi
ml() { "$py0" "$SRC/python/manylinux.py" "$@"; }

# The build's libgmr.so.0 finds libyaml where the system keeps it: no RUNPATH
# (only the wheel's copy gets $ORIGIN).  readelf, where it is, reads the
# same needs as the check.
ml show "$BLD/lib/.libs/libgmr.so.0" >"$tmp/show" 2>&1
grep -qx '  runpath -' "$tmp/show" && grep -qx '  rpath -' "$tmp/show"
result $([ $? -eq 0 ] && echo ok || echo fail) "the build's libgmr.so.0 has no RUNPATH"
if command -v readelf >/dev/null 2>&1; then
  readelf -d "$BLD/lib/.libs/libgmr.so.0" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' | sort >"$tmp/needed.readelf"
  sed -n 's/^  needed //p' "$tmp/show" | tr ' ' '\n' | sort >"$tmp/needed.ml"
  readelf -V --wide "$BLD/lib/.libs/libgmr.so.0" | awk '/^Version needs/ {v = 1; next} /^Version/ {v = 0}
    v && $4 == "File:" {f = $5} v && $2 == "Name:" {print f, $3}' | sort >"$tmp/versions.readelf"
  sed -n 's/^  version //p' "$tmp/show" | sort >"$tmp/versions.ml"
  cmp -s "$tmp/needed.readelf" "$tmp/needed.ml" && cmp -s "$tmp/versions.readelf" "$tmp/versions.ml" \
    && [ -s "$tmp/versions.ml" ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "the check reads libgmr.so.0's DT_NEEDED and version needs as readelf does"
fi

# Stubs: libc.so.6 and libstdc++.so.6 stand-ins defining versions, and ELF
# files needing them (linked with -nostdlib: nothing else in them).
cc=${CC:-cc}
f="$tmp/fake"
mkdir -p "$f/c" "$f/old" "$f/new" "$f/cxx" "$f/foo" "$f/foo-bundled" "$f/foo-norunpath" "$f/abs" "$f/black"
{
  echo 'GLIBC_2.2.5 { global: gmr_fake_base; __cxa_thread_atexit_impl; local: *; };'
  echo 'GLIBC_2.17 { global: gmr_fake_old; } GLIBC_2.2.5;'
  echo 'GLIBC_2.99 { global: gmr_fake_new; } GLIBC_2.17;'
} >"$f/c.map"
echo 'GLIBCXX_3.4.99 { global: gmr_fake_cxx; local: *; };' >"$f/cxx.map"
for fn in gmr_fake_base gmr_fake_old gmr_fake_new __cxa_thread_atexit_impl; do
  echo "int $fn(void) { return 0; }"
done >"$f/c.c"
echo 'int gmr_fake_cxx(void) { return 4; }' >"$f/libcxx.c"
echo 'int gmr_fake_foo(void) { return 5; }' >"$f/libfoo.c"
so() { # out source [more link arguments]
  o=$1 c=$2
  shift 2
  $cc -shared -fPIC -nostdlib -o "$o" "$c" "$@" 2>>"$f/cc.log"
}
call() { # source file calling the function $2
  printf 'extern int %s(void);\nint gmr_stub(void) { return %s(); }\n' "$2" "$2" >"$1"
}
if so "$f/c/libc.so.6" "$f/c.c" -Wl,-soname,libc.so.6 -Wl,--version-script,"$f/c.map" \
  && so "$f/c/libstdc++.so.6" "$f/libcxx.c" -Wl,-soname,libstdc++.so.6 -Wl,--version-script,"$f/cxx.map" \
  && so "$f/c/libfoo.so.1" "$f/libfoo.c" -Wl,-soname,libfoo.so.1 \
  && call "$f/old.c" gmr_fake_old && so "$f/old/old.so" "$f/old.c" "$f/c/libc.so.6" \
  && call "$f/new.c" gmr_fake_new && so "$f/new/new.so" "$f/new.c" "$f/c/libc.so.6" \
  && call "$f/cxx.c" gmr_fake_cxx && so "$f/cxx/cxx.so" "$f/cxx.c" "$f/c/libstdc++.so.6" \
  && call "$f/foo.c" gmr_fake_foo && so "$f/foo/foo.so" "$f/foo.c" "$f/c/libfoo.so.1" \
  && so "$f/foo-bundled/foo.so" "$f/foo.c" "$f/c/libfoo.so.1" -Wl,-rpath,'$ORIGIN' \
  && cp "$f/c/libfoo.so.1" "$f/foo-bundled/" \
  && cp "$f/foo/foo.so" "$f/c/libfoo.so.1" "$f/foo-norunpath/" \
  && so "$f/abs/old.so" "$f/old.c" "$f/c/libc.so.6" -Wl,-rpath,/usr/local/lib \
  && call "$f/black.c" __cxa_thread_atexit_impl && so "$f/black/black.so" "$f/black.c" "$f/c/libc.so.6"; then
  refused() { # description pattern tag-arguments...: the check fails, saying pattern
    d=$1 p=$2
    shift 2
    if ml tag "$@" >"$tmp/ml.out" 2>"$tmp/ml.err"; then
      result fail "$d (it passed: $(cat "$tmp/ml.out"))"
    elif grep -q "$p" "$tmp/ml.err"; then
      result ok "$d"
    else
      result fail "$d"
      sed 's/^/# /' "$tmp/ml.err"
    fi
  }
  tag=$(ml tag "$f/old" 2>&1)
  [ "$tag" = manylinux_2_17_x86_64.manylinux2014_x86_64 ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "GLIBC_2.17 makes manylinux_2_17 with its legacy alias ($tag)"
  tag=$(ml tag "$f/new" 2>&1)
  [ "$tag" = manylinux_2_99_x86_64 ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "GLIBC_2.99 makes manylinux_2_99, no alias ($tag)"
  refused "a stub needing GLIBC_2.99 fails --plat manylinux2014" \
    "newer than --plat manylinux2014_x86_64: new.so needs GLIBC_2.99" "$f/new" --plat manylinux2014_x86_64
  refused "a stub needing GLIBCXX_3.4.99 fails the check" \
    "cxx.so needs GLIBCXX_3.4.99, newer than any manylinux tag allows" "$f/cxx"
  refused "a stub needing libfoo.so.1 from the system fails the check" \
    "foo.so needs libfoo.so.1, which the manylinux policy does not allow" "$f/foo"
  tag=$(ml tag "$f/foo-bundled" 2>&1)
  [ "$tag" = manylinux_2_5_x86_64.manylinux1_x86_64 ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "libfoo.so.1 bundled, found through RUNPATH \$ORIGIN: passes ($tag)"
  refused "libfoo.so.1 bundled, but no RUNPATH \$ORIGIN: fails" "does not look there" "$f/foo-norunpath"
  refused "a RUNPATH outside the wheel fails" "RUNPATH /usr/local/lib points outside the wheel" "$f/abs"
  refused "a refused libc symbol fails" "uses __cxa_thread_atexit_impl" "$f/black"
  # The build's own ELF files against manylinux2014, where they need newer.
  mkdir "$tmp/own" && cp "$BLD/lib/.libs/libgmr.so.0" "$tmp/own/"
  x=$(sed -n 's/^  version .* GLIBC_2\.\([0-9]*\).*/\1/p' "$tmp/show" | sort -n | tail -1)
  if [ "${x:-0}" -gt 17 ]; then
    refused "the build's libgmr.so.0 (GLIBC_2.$x) fails --plat manylinux2014" \
      "newer than --plat manylinux2014_x86_64: libgmr.so.0 needs GLIBC_2.$x" "$tmp/own" --plat manylinux2014_x86_64
  fi
else
  n=$((n + 1))
  echo "ok $n - the check on stubs # SKIP $cc cannot build them: $(tail -1 "$f/cc.log")"
fi

if ! whl=$(sh "$SRC/python/build-wheel.sh" "$SRC" "$BLD" "$tmp/dist" 2>"$tmp/build.err"); then
  if grep -q "no Python with setuptools\|no patchelf" "$tmp/build.err"; then
    n=$((n + 1))
    echo "ok $n - the wheel builds # SKIP $(cat "$tmp/build.err")"
    plan 0
  fi
  result fail "the wheel builds"
  sed 's/^/# /' "$tmp/build.err" | tail -30
  plan 1
fi
result ok "the wheel builds offline: $(basename "$whl")"
mkdir "$tmp/x" && (cd "$tmp/x" && "$py0" -m zipfile -e "$whl" . >/dev/null 2>&1)
# The tag: manylinux_2_X, X the newest GLIBC_2.X any of its ELF files needs
# (readelf's reading, not the check's), at least 5; the legacy alias when X <= 17.
if command -v readelf >/dev/null 2>&1; then
  x=$(for e in "$tmp"/x/gmr/*.so*; do readelf -V --wide "$e"; done \
    | sed -n 's/.*Name: GLIBC_2\.\([0-9]*\).*/\1/p' | sort -n | tail -1)
  [ "${x:-0}" -ge 5 ] || x=5
  want="manylinux_2_${x}_x86_64"
  if [ "$x" -le 5 ]; then want="$want.manylinux1_x86_64"
  elif [ "$x" -le 12 ]; then want="$want.manylinux2010_x86_64"
  elif [ "$x" -le 17 ]; then want="$want.manylinux2014_x86_64"; fi
  [ "$(basename "$whl")" = "gmr_runtime-$version-py3-none-$want.whl" ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "a manylinux wheel: py3-none-$want (its newest GLIBC need is 2.$x)"
else
  case $(basename "$whl") in
  *-py3-none-manylinux_2_*_x86_64*.whl) result ok "a manylinux wheel" ;;
  *) result fail "a manylinux wheel: $(basename "$whl")" ;;
  esac
fi
ml check "$whl" >"$tmp/check.out" 2>&1
result $([ $? -eq 0 ] && echo ok || echo fail) "the manylinux check passes on the wheel: $(cat "$tmp/check.out")"
# Its RECORD, read here: every file, libyaml's copy included, with its hash.
"$py0" - "$whl" >"$tmp/record.log" 2>&1 <<'PYEOF'
import base64, csv, hashlib, io, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
rec = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")][0]
rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(z.read(rec).decode())) if r}
for name in z.namelist():
    if name == rec:
        continue
    data = z.read(name)
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert rows.get(name) == ["sha256=" + h, str(len(data))], (name, rows.get(name))
print("RECORD:", "gmr/libyaml-0.so.2", ",".join(rows["gmr/libyaml-0.so.2"]))
PYEOF
result $([ $? -eq 0 ] && echo ok || echo fail) "RECORD lists every file with its sha256 and size, libyaml-0.so.2 included"
sed 's/^/# /' "$tmp/record.log"
# A wheel renamed to another tag, or with a file changed after RECORD, fails.
mkdir "$tmp/bad"
cp "$whl" "$tmp/bad/gmr_runtime-$version-py3-none-linux_x86_64.whl"
if ! ml check "$tmp/bad/gmr_runtime-$version-py3-none-linux_x86_64.whl" >/dev/null 2>"$tmp/bad.err" \
  && grep -q "its name says linux_x86_64" "$tmp/bad.err"; then
  result ok "the check refuses the wheel renamed linux_x86_64"
else result fail "the check refuses the wheel renamed linux_x86_64"; fi
"$py0" - "$whl" "$tmp/bad/$(basename "$whl")" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], "w") as b:
    for i in a.infolist():
        data = a.read(i)
        b.writestr(i, data + b"\n" if i.filename == "gmr/__init__.py" else data)
PYEOF
if ! ml check "$tmp/bad/$(basename "$whl")" >/dev/null 2>"$tmp/bad.err" \
  && grep -q "RECORD says .* for gmr/__init__.py" "$tmp/bad.err"; then
  result ok "the check refuses a wheel whose file differs from its RECORD"
else result fail "the check refuses a wheel whose file differs from its RECORD"; fi

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
for so in libgmr.so.0 libgmr-preload.so; do
  [ -f "$tmp/x/gmr/$so" ] || continue
  rp=$(ml show "$tmp/x/gmr/$so" | sed -n 's/^  runpath //p')
  [ "$rp" = '$ORIGIN' ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "its $so looks beside itself only (RUNPATH $rp)"
done
rp=$(ml show "$tmp/x/gmr/libyaml-0.so.2" | sed -n 's/^  runpath //p')
result $([ "$rp" = - ] && echo ok || echo fail) "its libyaml-0.so.2 has no RUNPATH ($rp)"
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
# The libyaml in the process is the wheel's copy, beside its libgmr.
maps = open("/proc/self/maps").read().splitlines()
yaml = sorted({l.split(None, 5)[5] for l in maps if len(l.split(None, 5)) == 6 and "libyaml" in l})
print("libyaml", yaml)
assert yaml == [os.path.join(os.path.dirname(os.path.realpath(lib.path)), "libyaml-0.so.2")], yaml
got = gmr.compare(sys.argv[1], ["pytorch", "tf-growth"])
want = json.load(open(sys.argv[2]))
drop = {"seconds", "events_per_second", "source"}
strip = lambda runs: [{k: v for k, v in r.items() if k not in drop} for r in runs]
assert strip(got) == strip(want), (got, want)
assert all(r["source"].startswith(site) for r in got), [r["source"] for r in got]
print("compare", [(r["config"], r["peak_reserved"]) for r in got])
PYEOF
) && ok=ok || ok=fail
result $ok "from an empty folder with nothing set: import gmr loads the bundled libgmr and libyaml (/proc/self/maps), and gmr.compare gives gmr-compare's figures"
sed 's/^/# /' "$tmp/run.log" | tail -20
# The installed libgmr alone, through the loader: RUNPATH $ORIGIN finds the
# wheel's libyaml before the system's.
inst=$("$tmp/venv/bin/python" -c 'import os, gmr; print(os.path.dirname(os.path.realpath(gmr.__file__)))' 2>/dev/null)
if command -v ldd >/dev/null 2>&1 && [ -n "$inst" ]; then
  got=$(env -u LD_LIBRARY_PATH ldd "$inst/libgmr.so.0" 2>&1 | awk '/libyaml-0\.so\.2/ {print $3}')
  [ "$got" = "$inst/libyaml-0.so.2" ]
  result $([ $? -eq 0 ] && echo ok || echo fail) "ldd on the installed libgmr.so.0: libyaml-0.so.2 => $got"
fi
(cd "$tmp/empty" && env -u GMR_LIBRARY -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONPATH \
  "$tmp/venv/bin/python" -m gmr >"$tmp/m.log" 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "^libgmr $version: .*/site-packages/gmr/libgmr.so.0 (bundled)$" "$tmp/m.log"
result $([ $? -eq 0 ] && echo ok || echo fail) "python -m gmr says it loaded the bundled libgmr"
sed 's/^/# /' "$tmp/m.log"
echo "1..$n"
