#!/bin/bash
# suite.sh: run gmr's whole TAP suite from a build directory on a machine
# where `make check` cannot run (no autotools or libyaml there), e.g. a GPU
# host: every test program and test script the build made, with the source
# tree's data, then a tally.  Exit status 1 when any test failed.
#
#   scripts/gpu/suite.sh BUILD_DIR [SRC_DIR]
set -u
bld=$(cd "$1" && pwd) || exit 2
src=$(cd "${2:-$(dirname "$0")/../..}" && pwd)
export GMR_SRCDIR="$src" GMR_BUILDDIR="$bld"
tests=$(sed -n '/^GMR_TESTS = /,/[^\\]$/p' "$src/Makefile.am" | tr -d '\\' | sed 's/GMR_TESTS = //')
tests="$tests $(sed -n 's/^GMR_TESTS += //p; s/^TESTS += //p' "$src/Makefile.am")"
pass=0 fail=0 skip=0 bad=""
for t in $tests; do
  case "$t" in
  *.sh) cmd=(bash "$src/$t") ;;
  *) [ -x "$bld/$t" ] || { echo "# $t: not built"; continue; }; cmd=("$bld/$t") ;;
  esac
  out=$(cd "$bld" && timeout 600 "${cmd[@]}" 2>&1)
  rc=$?
  p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^not ok' <<<"$out"); s=$(grep -c '# SKIP' <<<"$out")
  pass=$((pass + p - s)); skip=$((skip + s)); fail=$((fail + f))
  [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] || bad="$bad $t"
  printf '%-24s %5d ok %3d not ok %3d skipped%s\n' "$t" "$((p - s))" "$f" "$s" \
    "$(grep -m1 '^1\.\.0 # SKIP' <<<"$out" | sed 's/^1..0/ /')"
  grep '^not ok' <<<"$out" | head -5
done
echo "$pass passed, $fail failed, $skip skipped"
[ -z "$bad" ] || { echo "failing:$bad"; exit 1; }
