#!/bin/sh
# man3.sh: the API reference in man/man3 is what man/mkman3.py makes of the
# public headers now (so it never drifts from their comments); every public
# call of gmr.h, gmr_replay.h and gmr_hooks.h has a page of its own name (its
# group's page, or one that sources it) that names it and is installed
# (man/man3/pages.am); and each group page is well-formed roff (man
# --warnings and groff -ww, each skipped when not installed).
SRC=${GMR_SRCDIR:-.}
PY=${PYTHON3:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-man3.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
result() { # ok|not-ok description
  n=$((n + 1))
  if [ "$1" = ok ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}

if ! command -v "$PY" >/dev/null 2>&1; then
  n=$((n + 1))
  echo "ok $n - man/man3 matches the headers # SKIP no python3 to run man/mkman3.py"
elif ! "$PY" "$SRC/man/mkman3.py" "$SRC" "$tmp/man3" 2>"$tmp/err"; then
  result not-ok "man/mkman3.py runs"
  sed 's/^/# /' "$tmp/err"
elif diff -ru "$SRC/man/man3" "$tmp/man3" >"$tmp/diff" 2>&1; then
  result ok "man/man3 matches the headers ($(ls "$tmp/man3" | wc -l) files)"
else
  result not-ok "man/man3 is out of date: run make update-man"
  sed 's/^/# /' "$tmp/diff" | head -40
fi

calls=$(sed -n 's/^GMR_EXTERN[^(]*[ *]\(gmr_[a-z0-9_]*\)(.*/\1/p' "$SRC/include/gmr.h" \
  "$SRC/include/gmr_replay.h" "$SRC/include/gmr_hooks.h")
[ -n "$calls" ] || result not-ok "the headers declare calls"
for c in $calls; do
  page="$SRC/man/man3/$c.3"
  group=$page
  if [ -f "$page" ] && so=$(sed -n 's/^\.so man3\///p' "$page") && [ -n "$so" ]; then
    group="$SRC/man/man3/$so"
  fi
  if [ ! -f "$page" ]; then
    result not-ok "$c has no page (man/man3/$c.3)"
  elif [ ! -f "$group" ]; then
    result not-ok "$c: its page sources a missing $group"
  elif ! sed -n '/^\.SH NAME/,/^\.SH/p' "$group" | grep -Eq "(^|[ ,])$c(,| \\\\-)"; then
    result not-ok "$c: $(basename "$group") does not name it in NAME"
  elif ! grep -q "man/man3/$c.3" "$SRC/man/man3/pages.am"; then
    result not-ok "$c: man/man3/$c.3 is not installed (man/man3/pages.am)"
  else
    result ok "$c: man 3 $c ($(basename "$group"))"
  fi
done

for page in "$SRC"/man/man3/*.3; do
  grep -q '^\.so ' "$page" && continue
  p=$(basename "$page")
  if ! command -v man >/dev/null 2>&1; then
    n=$((n + 1))
    echo "ok $n - $p renders (man) # SKIP man is not installed"
  elif warn=$(MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l "$page" 2>&1 >/dev/null) && [ -z "$warn" ]; then
    result ok "$p renders without warnings (man --warnings)"
  else
    result not-ok "$p: man --warnings"
    printf '%s\n' "$warn" | sed 's/^/# /' | head -20
  fi
  if ! command -v groff >/dev/null 2>&1; then
    n=$((n + 1))
    echo "ok $n - $p renders (groff) # SKIP groff is not installed"
  elif warn=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page" 2>&1) && [ -z "$warn" ]; then
    result ok "$p renders without warnings (groff -man -Tutf8 -ww)"
  else
    result not-ok "$p: groff -ww"
    printf '%s\n' "$warn" | sed 's/^/# /' | head -20
  fi
done
echo "1..$n"
