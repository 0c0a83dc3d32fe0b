#!/bin/sh
# layers.sh: no cycle of includes or calls between the files of gmr and no
# arrow up the layers (scripts/check-layers.py on the source tree and the
# objects just built), and the checker itself finds a cycle of each kind and
# an upward arrow in small trees made for it, so a checker that sees nothing
# cannot pass.
set -u
src=${GMR_SRCDIR:-${srcdir:-.}}
b=${GMR_BUILDDIR:-.}
command -v python3 >/dev/null 2>&1 || { echo "1..0 # SKIP no python3"; exit 0; }
command -v nm >/dev/null 2>&1 || { echo "1..0 # SKIP no nm"; exit 0; }
out=$(python3 "$src/scripts/check-layers.py" --srcdir "$src" --builddir "$b" --tap --require-objects)
rc=$?
# The checker's own TAP, renumbered after the self-tests below.
n=0
fail=0
check() { # check COND_STATUS "name"
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}
echo "$out" | grep -v "^1\.\."
n=$(echo "$out" | grep -c '^\(not \)\{0,1\}ok ')
[ $rc -eq 0 ] || fail=1

t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/lib/a" "$t/lib/b" "$t/include"
printf '#include "b/y.h"\nint x(void);\n' >"$t/lib/a/x.h"
printf '#include "a/x.h"\nint y(void);\n' >"$t/lib/b/y.h"
python3 "$src/scripts/check-layers.py" --srcdir "$t" >"$t/out1" 2>&1
check $([ $? -eq 1 ] && grep -q "cycle in the includes graph" "$t/out1"; echo $?) \
  "self-test: two headers that include each other are a cycle"
printf 'int x(void);\n' >"$t/lib/a/x.h"
printf 'int y(void);\n' >"$t/lib/b/y.h"
printf '#include "a/x.h"\nint x(void) { return 1; }\n' >"$t/lib/a/x.c"
printf '#include "b/y.h"\n#include "a/x.h"\nint y(void) { return x(); }\n' >"$t/lib/b/y.c"
printf '#include "b/y.h"\nint z(void) { return y(); }\n' >>"$t/lib/a/x.c"
if command -v cc >/dev/null 2>&1 && cc -c -I"$t/lib" -o "$t/lib/a/x.o" "$t/lib/a/x.c" &&
  cc -c -I"$t/lib" -o "$t/lib/b/y.o" "$t/lib/b/y.c"; then
  python3 "$src/scripts/check-layers.py" --srcdir "$t" >"$t/out2" 2>&1
  check $([ $? -eq 1 ] && grep -q "cycle in the calls graph" "$t/out2"; echo $?) \
    "self-test: two files that call each other are a cycle"
  grep -q "^# note: x.c and x.h as one node: lib/a/x -> lib/b/y -> lib/a/x" "$t/out2"
  check $? "self-test: and their modules are noted"
else
  n=$((n + 1))
  echo "ok $n # SKIP no C compiler for the call-graph self-test"
fi
# An arrow up the layers fails although it makes no cycle: the base
# (lib/core) including a header of the runtime above it.
u="$t/up"
mkdir -p "$u/lib/core" "$u/lib/runtime" "$u/include"
printf 'int r(void);\n' >"$u/lib/runtime/r.h"
printf '#include "runtime/r.h"\nint b(void);\n' >"$u/lib/core/b.h"
python3 "$src/scripts/check-layers.py" --srcdir "$u" >"$u/out" 2>&1
check $([ $? -eq 1 ] && grep -q "arrow up the layers in the includes graph: lib/core/b.h" "$u/out"; echo $?) \
  "self-test: the base including the runtime is an arrow up the layers"
printf 'int b(void);\n' >"$u/lib/core/b.h"
printf '#include "core/b.h"\nint r(void);\n' >"$u/lib/runtime/r.h"
python3 "$src/scripts/check-layers.py" --srcdir "$u" >"$u/out" 2>&1
check $? "self-test: the runtime including the base is not"
echo "1..$n"
exit $fail
