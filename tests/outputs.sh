#!/bin/sh
# outputs.sh: a tool's output file (gmr-compare --html, gmr-bench
# --json-file) is never one of its inputs, whatever the path (the same name,
# another name through a symbolic or hard link): the tool refuses and the
# input stays byte for byte; an output is written to a temporary file beside
# it and renamed into place (no temporary file is left, a symbolic link at the
# output's path is replaced, not followed).  tools/outfile.h.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
C="$BLD/tools/gmr-compare"
B="$BLD/tools/gmr-bench"
FX="$SRC/tests/fixtures"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-outputs.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
. "${GMR_SRCDIR:-.}/tests/tap.sh"
cp "$FX/compare-small.csv" "$W/t.csv"
cp "$SRC/config/direct.yaml" "$W/c.yaml"
cp "$W/t.csv" "$W/t.orig"
cp "$W/c.yaml" "$W/c.orig"
ln -s t.csv "$W/t-link.csv"
ln "$W/c.yaml" "$W/c-hard.yaml"

refuses() { # refuses OUTPUT NAME: --html OUTPUT over t.csv and c.yaml is refused
  "$C" --html "$1" "$W/t.csv" "$W/c.yaml" >"$W/out" 2>"$W/err"
  st=$?
  [ "$st" -ne 0 ] && grep -q "refusing to write over an input" "$W/err"
  ok $? "gmr-compare --html $2: refused (exit $st)"
  cmp -s "$W/t.csv" "$W/t.orig" && cmp -s "$W/c.yaml" "$W/c.orig"
  ok $? "  the trace and the configuration are unchanged"
}
refuses "$W/t.csv" "the trace itself"
refuses "$W/c.yaml" "the configuration"
refuses "$W/t-link.csv" "a symbolic link to the trace"
refuses "$W/c-hard.yaml" "a hard link to the configuration"
mkdir -p "$W/sub"
refuses "$W/sub/../t.csv" "another spelling of the trace's path"

echo old >"$W/page.html"
"$C" --html "$W/page.html" "$W/t.csv" "$W/c.yaml" >/dev/null 2>"$W/err"
ok $? "gmr-compare --html over an older page: exit 0"
grep -q "<!DOCTYPE html>" "$W/page.html"
ok $? "  the page is replaced"
[ -z "$(find "$W" -name '.page.html.*')" ]
ok $? "  no temporary file is left"
echo keep >"$W/target.txt"
ln -s target.txt "$W/page-link.html"
"$C" --html "$W/page-link.html" "$W/t.csv" "$W/c.yaml" >/dev/null 2>&1 &&
  [ "$(cat "$W/target.txt")" = keep ] && [ ! -L "$W/page-link.html" ]
ok $? "  a symbolic link at the output is replaced by the page, its target untouched"
"$C" --html "$W/nodir/page.html" "$W/t.csv" "$W/c.yaml" >/dev/null 2>"$W/err"
[ $? -ne 0 ] && grep -q "cannot write" "$W/err"
ok $? "  a folder that does not exist: an error"

"$B" --reps 1 --pairs 100 --threads 1 --sizes 512 --json-file "$W/c.yaml" "$W/c.yaml" \
  >/dev/null 2>"$W/err"
st=$?
[ "$st" -ne 0 ] && grep -q "refusing to write over an input" "$W/err" && cmp -s "$W/c.yaml" "$W/c.orig"
ok $? "gmr-bench --json-file CONFIG CONFIG: refused, the configuration unchanged (exit $st)"
"$B" --reps 1 --pairs 100 --threads 1 --sizes 512 --json-file "$W/b.json" "$W/c.yaml" \
  >/dev/null 2>&1 && grep -q '^\[' "$W/b.json" && [ -z "$(find "$W" -name '.b.json.*')" ]
ok $? "gmr-bench --json-file: written, no temporary file left"

tap_end
