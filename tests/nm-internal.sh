#!/bin/sh
# nm-internal.sh: the static library defines no bare global name.  Every
# defined global symbol of libgmr.a is public (gmr_*) or internal (gmr__*):
# a name crossing a policy's files is gmr__NAME_* (policies/policy.h), so
# linking libgmr.a into a program cannot clash with the program's own names.
# Names the compiler makes itself (two leading underscores: sanitizers,
# coverage; DW.ref.__gcc_personality_v0, the unwinder's reference that a
# sanitizer build's cleanups need) are not the library's and are let through.  The interposer's
# cuda* and cu* hooks live in libgmr-preload, a separate shared library.
set -u
b=${GMR_BUILDDIR:-.}
lib="$b/lib/.libs/libgmr.a"
if [ ! -f "$lib" ]; then
  echo "1..0 # SKIP no static library was built ($lib: configured with --disable-static?)"
  exit 0
fi
if ! command -v nm >/dev/null 2>&1; then
  echo "1..0 # SKIP nm is not installed"
  exit 0
fi
n=0
fail=0
check() { # check COND_STATUS "name"
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}
syms=$(nm "$lib" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[A-TV-Z]$/ { print $3 }' | sort -u)
[ -n "$syms" ]
check $? "nm lists the library's defined global symbols"
echo "$syms" | grep -q '^gmr_alloc$'
check $? "gmr_alloc is among them"
bare=$(echo "$syms" | grep -v -e '^gmr_' -e '^__' -e '^DW\.ref\.__')
[ -z "$bare" ]
check $? "every defined global symbol is gmr_* or gmr__*"
for s in $bare; do echo "# bare global symbol: $s"; done
# The internal tier: the policies' tables and cross-file names are gmr__*.
echo "$syms" | grep -q '^gmr__caching_policy$' && echo "$syms" | grep -q '^gmr__stitch_policy$'
check $? "the policies' ops tables are gmr__NAME_policy"
echo "1..$n"
[ $fail -eq 0 ]
