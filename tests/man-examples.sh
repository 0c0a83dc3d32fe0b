#!/bin/sh
# man-examples.sh: gmr-compare(1)'s EXAMPLES (man/gmr-compare.extra) run as
# printed, from the source tree, where the shipped traces and configurations
# are found by name as they are installed (the ones that need a program's
# own recording are left out); and no man page names PREFIX/share/gmr
# instead of the real share directory.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-man-examples.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
sed -n '/^EXAMPLES$/,$p' "$SRC/man/gmr-compare.extra" | sed -n 's/^    \(gmr-compare .*\)/\1/p' |
  grep -v -e 'mine\.csv' -e 'before\.csv' >"$W/examples"
n=0
echo "1..$(($(wc -l <"$W/examples") + 2))"
n=$((n + 1))
if grep -q '^EXAMPLES$' "$SRC/man/gmr-compare.extra" && grep -q '^\.SH EXAMPLES' "$SRC/man/gmr-compare.1"; then
  echo "ok $n - gmr-compare(1) has an EXAMPLES section"
else
  echo "not ok $n - gmr-compare(1) has no EXAMPLES section"
fi
while read -r cmd; do
  n=$((n + 1))
  args=$(printf '%s\n' "${cmd#gmr-compare }" | sed -e "s|page\.html|$W/page.html|" \
    -e "s|--snapshot \([^ ]*\)|--snapshot $W/\1|")
  # shellcheck disable=SC2086
  if (cd "$SRC" && "$BLD/tools/gmr-compare" $args) >"$W/out" 2>"$W/err"; then
    echo "ok $n - $cmd"
  else
    echo "not ok $n - $cmd"
    sed 's/^/# /' "$W/err" | tail -5
  fi
done <"$W/examples"
n=$((n + 1))
if grep -l 'PREFIX/share' "$SRC"/man/*.[15] >"$W/prefix"; then
  echo "not ok $n - man pages name PREFIX/share/gmr: $(tr '\n' ' ' <"$W/prefix")"
else
  echo "ok $n - every man page names the real share directory (/usr/share/gmr; make install rewrites it)"
fi
