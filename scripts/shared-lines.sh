#!/bin/sh
# shared-lines.sh: which cache lines threads on different streams share on the
# cached alloc+free path, counted from a memory trace (no hardware counters):
#
#   scripts/shared-lines.sh CONFIG [THREADS [SIZE [PAIRS]]]     # 16, 4096, 2000
#
# Builds scripts/shared-lines.c against the build tree's static libgmr (run
# from the build folder after `make`, or set GMR_BUILDDIR), runs it under
# `valgrind --tool=lackey --trace-mem=yes` and reads the trace with
# scripts/shared-lines.py, which prints the lines each thread writes per pair
# and every line that one thread writes and another touches per pair
# (docs/bfc.md, "Under concurrency").  A 16-thread run of 2000 pairs takes
# about a minute.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
b=${GMR_BUILDDIR:-.}
[ $# -ge 1 ] || { echo "usage: $0 CONFIG [THREADS [SIZE [PAIRS]]]" >&2; exit 2; }
config=$1 threads=${2:-16} size=${3:-4096} pairs=${4:-2000}
[ -f "$b/lib/.libs/libgmr.a" ] || { echo "$0: no $b/lib/.libs/libgmr.a: run make first" >&2; exit 1; }
command -v valgrind >/dev/null 2>&1 || { echo "$0: valgrind is needed" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shared-lines.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
libs=$(sed -n 's/^CUDA_LIBS = //p' "$b/Makefile")
${CC:-cc} -O2 -g -std=c11 -D_GNU_SOURCE -I"$b" -I"$src/include" -I"$src/lib" -I"$src/policies" \
  "$src/scripts/shared-lines.c" -static "$b/lib/.libs/libgmr.a" -lyaml $libs -lm -pthread \
  -o "$tmp/shared-lines" 2>"$tmp/cc.log" || { cat "$tmp/cc.log" >&2; exit 1; }
mkfifo "$tmp/trace"
python3 "$src/scripts/shared-lines.py" "$tmp/trace" "$tmp/shared-lines" &
reader=$!
valgrind --tool=lackey --trace-mem=yes "$tmp/shared-lines" "$config" "$threads" "$size" "$pairs" \
  2>"$tmp/trace"
wait $reader
