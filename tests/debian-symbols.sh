#!/bin/sh
# debian-symbols.sh: debian/libgmr0.symbols lists exactly the symbols the
# built libgmr.so.0 exports (nm -D --defined-only), each with a version, so
# that dpkg-gensymbols -c4 (debian/rules) passes, and an addition to gmr.h
# without its line here fails here first; and the library carries no
# RUNPATH $ORIGIN (only the wheel's copy gets one, python/build-wheel.sh).
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
so="$BLD/lib/.libs/libgmr.so"
echo "1..4"
if [ ! -f "$so" ]; then
  for i in 1 2 3 4; do echo "ok $i # SKIP no $so (a --disable-shared build)"; done
  exit 0
fi
if ! command -v nm >/dev/null 2>&1; then
  for i in 1 2 3 4; do echo "ok $i # SKIP nm is not installed (binutils)"; done
  exit 0
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-symbols.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
sym="$SRC/debian/libgmr0.symbols"
nm -D --defined-only "$so" | awk 'NF == 3 && $2 ~ /^[TDBRVWi]$/ {print $3}' | sort -u >"$W/built"
sed -n 's/^ \([^@ ]*\)@Base [0-9][^ ]*$/\1/p' "$sym" | sort -u >"$W/listed"
if head -1 "$sym" | grep -q '^libgmr\.so\.0 libgmr0 #MINVER#$' &&
  [ "$(grep -c '^ ' "$sym")" -eq "$(wc -l <"$W/listed")" ]; then
  echo "ok 1 - $sym: libgmr.so.0 libgmr0, $(wc -l <"$W/listed") symbols, each NAME@Base VERSION"
else
  echo "not ok 1 - $sym: a header other than 'libgmr.so.0 libgmr0 #MINVER#', or a line not ' NAME@Base VERSION'"
  grep '^ ' "$sym" | grep -v '^ [^@ ]*@Base [0-9][^ ]*$' | sed 's/^/# /' | head
fi
comm -23 "$W/built" "$W/listed" >"$W/unlisted"
if [ ! -s "$W/unlisted" ]; then
  echo "ok 2 - every symbol libgmr.so.0 exports is listed ($(wc -l <"$W/built"))"
else
  echo "not ok 2 - exported but not in debian/libgmr0.symbols (add ' NAME@Base VERSION'):"
  sed 's/^/#   /' "$W/unlisted"
fi
comm -13 "$W/built" "$W/listed" >"$W/gone"
if [ ! -s "$W/gone" ]; then
  echo "ok 3 - every listed symbol is exported"
else
  echo "not ok 3 - listed in debian/libgmr0.symbols but not exported (an ABI break):"
  sed 's/^/#   /' "$W/gone"
fi
if ! command -v readelf >/dev/null 2>&1; then
  echo "ok 4 # SKIP readelf is not installed (binutils)"
elif readelf -d "$so" | grep -E 'R(UN)?PATH' | grep -q 'ORIGIN'; then
  echo "not ok 4 - libgmr.so carries \$ORIGIN: $(readelf -d "$so" | grep -E 'R(UN)?PATH')"
else
  echo "ok 4 - libgmr.so carries no RUNPATH \$ORIGIN"
fi
