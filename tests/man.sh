#!/bin/sh
# man.sh: the man pages in man/ are what man/generate.sh makes from the tools'
# --help and the option tables now, so they never drift from the programs;
# each one is also well-formed roff (man --warnings, when man is there).
BLD=${GMR_BUILDDIR:-.}
SRC=${GMR_SRCDIR:-.}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-man.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
pages="gmr-compare.1 gmr-info.1 gmr-bench.1 gmr-record.1 gmr-demo.1 gmr-top.1 gmr-config.5"
set -- $pages
echo "1..$(($# * 2))"
n=0
for p in $pages; do
  n=$((n + 1))
  if [ "$p" = gmr-record.1 ] && ! command -v "${PYTHON3:-python3}" >/dev/null 2>&1; then
    echo "ok $n - $p # SKIP no python3 to run gmr-record --help"
    n=$((n + 1))
    echo "ok $n - $p renders # SKIP"
    continue
  fi
  if ! AWK=${AWK:-awk} sh "$SRC/man/generate.sh" "$BLD" "$SRC" "$tmp" "$p" 2>"$tmp/err"; then
    echo "not ok $n - $p could not be generated"
    sed 's/^/# /' "$tmp/err"
  elif diff -u "$SRC/man/$p" "$tmp/$p" >"$tmp/diff" 2>&1; then
    echo "ok $n - man/$p matches the program"
  else
    echo "not ok $n - man/$p is out of date: run make update-man"
    sed 's/^/# /' "$tmp/diff" | head -40
  fi
  n=$((n + 1))
  if ! command -v man >/dev/null 2>&1; then
    echo "ok $n - $p renders # SKIP man is not installed"
  elif warn=$(MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l "$SRC/man/$p" 2>&1 >/dev/null) && [ -z "$warn" ]; then
    echo "ok $n - $p renders without warnings"
  else
    echo "not ok $n - $p: roff warnings"
    printf '%s\n' "$warn" | sed 's/^/# /' | head -20
  fi
done
