#!/bin/bash
# soak.sh: the long soak of issue 15 on a many-core host: every stack of
# tests/soak in a process of its own, under AddressSanitizer+UBSan and
# ThreadSanitizer at once (22 processes of 17 threads), each stack's run
# ended by its operation count or by a time bound, whichever comes first.
#
#   scripts/soak.sh ASAN_SOAK TSAN_SOAK SECONDS OPS [OUTDIR]
#
# ASAN_SOAK, TSAN_SOAK: tests/soak of a build configured with
# --enable-sanitizers=address,undefined and with --enable-sanitizers=thread
# (the soak is linked statically against libgmr, so the binary travels with
# the sanitizer runtimes alone: put them on LD_LIBRARY_PATH).  OPS is
# GMR_SOAK_OPS (per thread), SECONDS GMR_SOAK_SECONDS.  One log per process
# in OUTDIR (default /tmp/gmr-soak), then one summary line each; exit 1 when
# a check failed or a sanitizer reported.  ASLR is turned off for the
# processes (setarch -R): older sanitizer runtimes reject the mappings of
# kernels with 32 bits of mmap randomness.
set -u
[ $# -ge 4 ] || { echo "usage: $0 ASAN_SOAK TSAN_SOAK SECONDS OPS [OUTDIR]" >&2; exit 2; }
asan=$1 tsan=$2 secs=$3 ops=$4 out=${5:-/tmp/gmr-soak}
mkdir -p "$out"
stacks=$(GMR_SOAK_OPS=0 "$asan" 2>/dev/null | grep -c 'nothing left allocated')
for n in $(seq 1 "$stacks"); do
  GMR_SEED=$((1000 + n)) GMR_SOAK_OPS=$ops GMR_SOAK_SECONDS=$secs GMR_SOAK_STACKS=$n \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    setarch "$(uname -m)" -R "$asan" >"$out/soak-asan-$n.txt" 2>&1 &
  GMR_SEED=$((2000 + n)) GMR_SOAK_OPS=$ops GMR_SOAK_SECONDS=$secs GMR_SOAK_STACKS=$n \
    TSAN_OPTIONS=halt_on_error=1 \
    setarch "$(uname -m)" -R "$tsan" >"$out/soak-tsan-$n.txt" 2>&1 &
done
wait
rc=0
for f in "$out"/soak-asan-*.txt "$out"/soak-tsan-*.txt; do
  bad=$(grep -c '^not ok' "$f")
  printf '%s: %s ok, %s not ok; %s\n' "$(basename "$f" .txt)" "$(grep -c '^ok' "$f")" "$bad" \
    "$(grep 'operations in' "$f" | sed 's/.*\]: //')"
  if [ "$bad" != 0 ] || grep -q 'Sanitizer\|runtime error' "$f"; then
    echo "  $f: a check failed or a sanitizer reported"
    rc=1
  fi
done
exit $rc
