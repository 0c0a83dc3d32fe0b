#!/bin/sh
# run.sh: build the fuzzers (build.sh) and run each for a bounded time on its
# seed corpus (tests/fuzz/corpus/NAME), stopping at the first finding.
#   tests/fuzz/run.sh [SECONDS] [OUTDIR] [NAMES...]
# SECONDS per fuzzer (default 60); OUTDIR (default build-fuzz) receives the
# binaries, the grown corpora (OUTDIR/corpus-NAME: the repo's seeds stay as
# they are), logs and any crash input (OUTDIR/crash-NAME-*).  NAMES: config,
# trace, api, scap, pickle (default all).  A dictionary tests/fuzz/NAME.dict,
# where there is one, is passed with -dict.  Exit status: 0 when no fuzzer found anything.
# FUZZ_JOBS=N runs N processes per fuzzer (-fork=N).
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-60}
out=${2:-build-fuzz}
[ $# -ge 2 ] && shift 2 || shift $#
names=${*:-config trace api scap pickle}
"$top/tests/fuzz/build.sh" "$out" >/dev/null
# CPU seconds of the children waited for so far: the second line of
# `times`, run in this shell (in a subshell it would count none).
cpu_file="$out/.times"
cpu() { awk 'NR == 2 { split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$cpu_file"; }
status=0
for n in $names; do
  mkdir -p "$out/corpus-$n"
  case $n in
  config) max_len=4096 ;;
  trace) max_len=4096 ;;
  scap) max_len=40960 ;; # up to the whole 36 KiB file
  pickle) max_len=8192 ;; # the real snapshots of the seeds are 2 KiB
  *) max_len=2048 ;;
  esac
  dict=""
  [ -f "$top/tests/fuzz/$n.dict" ] && dict="-dict=$top/tests/fuzz/$n.dict"
  fork=""
  [ -n "${FUZZ_JOBS:-}" ] && fork="-fork=$FUZZ_JOBS -ignore_crashes=0"
  rc=0
  times >"$cpu_file"
  cpu0=$(cpu)
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:quarantine_size_mb=32 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out/fuzz-$n" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -max_len=$max_len \
    -print_final_stats=1 -artifact_prefix="$out/crash-$n-" $dict $fork \
    "$out/corpus-$n" "$top/tests/fuzz/corpus/$n" >"$out/fuzz-$n.log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz-$n.log" | tail -1)
  [ -z "$runs" ] && runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$out/fuzz-$n.log" | tail -1)
  # On a shared machine the CPU time, not the wall time, says how fast it is.
  times >"$cpu_file"
  used=$(awk -v a="$cpu0" -v b="$(cpu)" -v r="${runs:-0}" \
    'BEGIN { c = b - a; printf "%.1f CPU s, %d executions per CPU second", c, (c > 0 ? r / c : 0) }')
  if [ "$rc" -eq 0 ]; then
    echo "fuzz-$n: ${runs:-?} executions in ${secs} s ($used), no finding"
  else
    echo "fuzz-$n: FINDING (exit $rc) after ${runs:-?} executions; log $out/fuzz-$n.log:"
    grep -A25 "ERROR\|fuzz:\|runtime error\|deadly signal\|timeout" "$out/fuzz-$n.log" | head -60
    status=1
  fi
done
exit $status
