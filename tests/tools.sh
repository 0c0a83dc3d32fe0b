#!/bin/sh
# tools.sh: every tool's manners.  For each of gmr-compare, gmr-info,
# gmr-bench, gmr-demo, gmr-top and gmr-record:
#   --help      exits 0 and prints the usage on stdout, nothing on stderr;
#   --version   exits 0 and prints "TOOL (gmr) VERSION", VERSION being
#               include/gmr.h's;
#   --no-such-option, -Z: exit 2, say "unknown option '...'" on stderr and
#               print nothing on stdout (no work was done);
# and a few usage errors per tool exit 2 before any work.
BLD=${GMR_BUILDDIR:-.}
SRC=${GMR_SRCDIR:-.}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-tools.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
version=$(sed -n 's/^#define GMR_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' "$SRC/include/gmr.h" | paste -sd. -)
PY=""
for cand in ${PYTHON3:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
done

n=0
ok() { # status description
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}
skip() {
  n=$((n + 1))
  echo "ok $n - $1 # SKIP $2"
}
# run TOOL ARGS...: rc, $tmp/out, $tmp/err
run() {
  tool=$1
  shift
  case $tool in
  gmr-record) "$PY" "$SRC/tools/gmr-record" "$@" >"$tmp/out" 2>"$tmp/err" ;;
  *) "$BLD/tools/$tool" "$@" >"$tmp/out" 2>"$tmp/err" ;;
  esac
}
# usage_error TOOL WHAT ARGS...: exit 2, something on stderr, nothing on stdout.
usage_error() {
  tool=$1 what=$2
  shift 2
  run "$tool" "$@"
  rc=$?
  [ $rc -eq 2 ] && [ -s "$tmp/err" ] && [ ! -s "$tmp/out" ]
  ok $? "$tool $what: exit 2 before any work (got $rc)"
  [ $rc -eq 2 ] || sed 's/^/# /' "$tmp/err" "$tmp/out" | head -5
}

for tool in gmr-compare gmr-info gmr-bench gmr-demo gmr-top gmr-record; do
  if [ "$tool" = gmr-record ] && [ -z "$PY" ]; then
    skip "$tool" "no python3"
    continue
  fi
  run "$tool" --help
  rc=$?
  [ $rc -eq 0 ] && grep -q "^usage: $tool" "$tmp/out" && [ ! -s "$tmp/err" ]
  ok $? "$tool --help: exit 0, the usage on stdout"
  run "$tool" --version
  rc=$?
  if [ "$tool" = gmr-compare ] && grep -q "unknown option" "$tmp/err"; then
    skip "$tool --version" "this gmr-compare has no --version yet"
  else
    [ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$tool (gmr) $version" ]
    ok $? "$tool --version: '$tool (gmr) $version'"
    [ $rc -eq 0 ] || sed 's/^/# /' "$tmp/out" "$tmp/err" | head -3
  fi
  for bad in --no-such-option -Z; do
    run "$tool" "$bad" "$SRC/config/direct.yaml"
    rc=$?
    [ $rc -eq 2 ] && grep -q "unknown option '$bad'" "$tmp/err" && [ ! -s "$tmp/out" ]
    ok $? "$tool $bad: \"unknown option '$bad'\", exit 2, nothing done"
    [ $rc -eq 2 ] || sed 's/^/# /' "$tmp/err" | head -3
  done
done

usage_error gmr-info "--device x" --device x
usage_error gmr-info "--device without a value" --device
usage_error gmr-info "with an argument" extra
usage_error gmr-bench "--reps 0" --reps 0 "$SRC/config/direct.yaml"
usage_error gmr-bench "--sizes 0" --sizes 0 "$SRC/config/direct.yaml"
usage_error gmr-bench "--capacity 1KiB" --capacity 1KiB "$SRC/config/direct.yaml"
usage_error gmr-bench "--json=1" --json=1 "$SRC/config/direct.yaml"
usage_error gmr-bench "--threads without a value" --threads
usage_error gmr-bench "without a configuration" --reps 1
usage_error gmr-bench "--torch without --device cuda" --torch x.so "$SRC/config/direct.yaml"
usage_error gmr-bench "--json-file, then a bad option" --json-file "$tmp/never.json" --bogus "$SRC/config/direct.yaml"
[ ! -e "$tmp/never.json" ]
ok $? "gmr-bench --json-file is not created when the command line is bad"
grep -q "unknown option '--bogus'" "$tmp/err"
ok $? "  and the bad option is named"
usage_error gmr-demo "with two configurations" a b
usage_error gmr-demo "--reference with a configuration" --reference "$SRC/config/direct.yaml"
usage_error gmr-demo "--reference=1" --reference=1
if [ -n "$PY" ]; then
  usage_error gmr-record "without a program" -o x.csv
  usage_error gmr-record "--max-entries 0" --max-entries 0 x.py
  usage_error gmr-record "--device x" --device x x.py
  usage_error gmr-record "-o without a value" -o
fi
echo "1..$n"
