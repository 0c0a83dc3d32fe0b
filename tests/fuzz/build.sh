#!/bin/sh
# build.sh: build the libFuzzer harnesses of tests/fuzz/ with clang, from the
# library's sources, under AddressSanitizer + UndefinedBehaviorSanitizer and
# the library's own expensive assertions (GMR_DEBUG=3).
#   tests/fuzz/build.sh [OUTDIR]      (default: build-fuzz)
# Needs clang with libFuzzer (Debian: clang) and libyaml.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-build-fuzz}
mkdir -p "$out"
CC=${FUZZ_CC:-clang}
# Every library source but the CUDA backend and the framework adapters
# (which need CUDA or a framework): found, not listed, so files may move.
srcs=$(cd "$top" && find lib policies -name '*.c' ! -name 'cuda.c' ! -path 'lib/adapters/*' | sort)
incs=""
for d in include lib policies; do incs="$incs -I$top/$d"; done
for d in $(cd "$top" && find policies lib -type d); do incs="$incs -I$top/$d"; done
flags="-g -O2 -std=c11 -D_GNU_SOURCE -DGMR_DEBUG=3 -DGMR_STATIC_BUILD \
  -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# The library once, instrumented for coverage, then each harness.  The
# invariant checkers (coverage-ignore.txt: gmr_check and what it calls) are
# compiled under the sanitizers like the rest but without coverage
# instrumentation: they run after every operation, their branches only say
# "consistent" and their loops count pages and blocks, which would make most
# of the run time and no coverage worth steering by.
objs=""
# A header newer than the last build rebuilds everything.
if [ -f "$out/.stamp" ] && [ -n "$(cd "$top" && find include lib policies tests/fuzz/coverage-ignore.txt \( -name '*.h' -o -name '*.txt' \) -newer "$out/.stamp")" ]; then
  rm -f "$out"/*.o
fi
for s in $srcs; do
  o="$out/$(echo "$s" | tr / _ | sed 's/\.c$/.o/')"
  if [ ! -f "$o" ] || [ "$top/$s" -nt "$o" ]; then
    $CC $flags -fsanitize=fuzzer-no-link -fsanitize-coverage-ignorelist="$top/tests/fuzz/coverage-ignore.txt" \
      $incs -c "$top/$s" -o "$o"
  fi
  objs="$objs $o"
done
for h in config trace api scap pickle; do
  $CC $flags -fsanitize=fuzzer $incs "$top/tests/fuzz/fuzz-$h.c" $objs -lyaml -lpthread -lm \
    -o "$out/fuzz-$h"
done
touch "$out/.stamp"
echo "built $out/fuzz-config $out/fuzz-trace $out/fuzz-api $out/fuzz-scap $out/fuzz-pickle"
