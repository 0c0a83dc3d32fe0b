#!/bin/sh
# compare-labs.sh: the labs (docs/labs/*.md) stay true.
#
# Each lab page shows one command, the output it prints, a picture and a
# verdict.  For each page this runs the command from the source tree (with
# the built gmr-compare first on the PATH) and checks that
#   1. it prints exactly the output the page shows (every figure of the
#      table and the notes, recomputed);
#   2. every figure the verdict quotes (a code span starting with a digit or
#      a sign) is in that output; a lab measured on a GPU names the file
#      holding its recorded figures ("<!-- gpu figures: FILE -->"), where
#      the figures the replay cannot produce must be;
#   3. its picture exists.
# docs/labs/update.py refreshes outputs and pictures when the code changes.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-labs.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
. "${GMR_SRCDIR:-.}/tests/tap.sh"
if [ ! -x "$BLD/tools/gmr-compare" ]; then
  echo "1..0 # SKIP gmr-compare is not built"
  exit 0
fi
BLDABS=$(cd "$BLD" && pwd)
# With --enable-debug=3 every operation walks the policy's invariants, which
# makes the labs' replays (tens of millions of events with --fit) a hundred
# times slower; the plain build checks every figure.
if grep -q '^#define GMR_DEBUG [3-9]' "$BLD/build-config.h" 2>/dev/null; then
  echo "1..0 # SKIP invariant walks after every operation (--enable-debug=3): the plain build checks the labs"
  exit 0
fi

for lab in "$SRC"/docs/labs/*.md; do
  name=$(basename "$lab" .md)
  [ "$name" = README ] && continue
  awk '/^```sh$/ { on = 1; next } on && /^\$ / { print substr($0, 3); exit }' "$lab" >"$W/cmd"
  awk '/^```text$/ { on = 1; next } on && /^```$/ { exit } on { print }' "$lab" >"$W/want"
  if [ ! -s "$W/cmd" ]; then
    ok 1 "$name: has a command"
    continue
  fi
  (cd "$SRC" && PATH="$BLDABS/tools:$PATH" sh "$W/cmd") >"$W/got" 2>/dev/null
  if cmp -s "$W/want" "$W/got"; then ok 0 "$name: prints exactly what the page shows"; else
    ok 1 "$name: prints exactly what the page shows"
    diff "$W/want" "$W/got" | head -20 | sed 's/^/#   /'
  fi
  gpu=$(sed -n 's/^<!-- gpu figures: \(.*\) -->$/\1/p' "$lab")
  awk '/^\*\*Verdict/ { on = 1 } on' "$lab" | tr '\n' ' ' |
    grep -o '`[-+]\{0,1\}[0-9][^`]*`' | tr -d '`' >"$W/figures"
  missing=""
  count=0
  while IFS= read -r f; do
    count=$((count + 1))
    grep -F -q -- "$f" "$W/got" && continue
    [ -n "$gpu" ] && grep -F -q -- "$f" "$SRC/$gpu" && continue
    missing="$missing [$f]"
  done <"$W/figures"
  if [ -z "$missing" ] && [ "$count" -gt 0 ]; then
    ok 0 "$name: the $count figures its verdict quotes are in the output${gpu:+ or $gpu}"
  else
    ok 1 "$name: the figures its verdict quotes are in the output"
    echo "#   not found:$missing (of $count)"
  fi
  test -s "$SRC/docs/labs/$name.png"
  ok $? "$name: its picture exists"
done
tap_end
