#!/bin/bash
# shared-cap.sh: the proof on a GPU machine that one cap holds across
# processes (limit.shared, docs/shared-cap.md).
#
#   scripts/gpu/shared-cap.sh DIR [race] [bench] [gpu]
#
# DIR is a bundle from scripts/gpu/bundle.sh (lib/, bin/gmr-top,
# bin/gmr-shared-cap-test, bin/gmr-shared-cap-bench, python/).  Phases (all
# three by default):
#   race  the process tests of tests/shared-cap on every core, at full size:
#         64 processes attach at once; 1000 lock holders SIGKILLed mid-update;
#         16 processes x 200,000 random reservations and releases with 200
#         SIGKILLs and respawns (audit counter never above the cap, nothing
#         left at the end); fork, SIGSTOP, unlink.  Sizes: PROCS, KILLS, OPS,
#         RACE_KILLS in the environment.
#   bench what an uncontended reservation through the shared cap adds
#         (tests/shared-cap-bench: module calls, direct and cached pairs)
#   gpu   two processes on GPU 0, PyTorch and CuPy through gmr's hooks under
#         the interposer, quotas QUOTA_GIB (40) each under one CAP_GIB (60)
#         cap: scripts/gpu/shared_cap.py (NVML per-process figures, each
#         framework's OOM, memory info, gmr-top, kill -9 and regrowth).
# Logs go to stdout, JSON to $RESULTS (default /tmp/gmr-results).  Without a
# CUDA device the gpu phase says SKIP.
set -u
dir=$(cd "$1" && pwd) || exit 2
shift
here=$(cd "$(dirname "$0")" && pwd)
results=${RESULTS:-/tmp/gmr-results}
mkdir -p "$results"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
phases=${*:-race bench gpu}
status=0
for p in $phases; do
  case "$p" in
  race)
    echo "=== shared cap: process tests at full size on $(nproc) cores ($(date +%T))"
    GMR_SCAP_PROCS=${PROCS:-64} GMR_SCAP_KILLS=${KILLS:-1000} GMR_SCAP_OPS=${OPS:-200000} \
      GMR_SCAP_RACE_KILLS=${RACE_KILLS:-200} timeout 600 "$dir/bin/gmr-shared-cap-test" |
      tee "$results/shared-cap-race.tap" | grep -Ev '^ok '
    grep -q '^not ok' "$results/shared-cap-race.tap" && status=1
    grep -q '^1\.\.' "$results/shared-cap-race.tap" || status=1
    ;;
  bench)
    echo "=== shared cap: what it adds to a device reservation ($(date +%T))"
    timeout 300 "$dir/bin/gmr-shared-cap-bench" 31 | tee "$results/shared-cap-bench.txt" || status=1
    ;;
  gpu)
    echo "=== shared cap: PyTorch + CuPy processes under one cap on GPU 0 ($(date +%T))"
    timeout 900 python3 "$here/shared_cap.py" --top "$dir/bin/gmr-top" \
      --preload "$dir/lib/libgmr-preload.so" --cap-gib "${CAP_GIB:-60}" \
      --quota-gib "${QUOTA_GIB:-40}" --hold-gib "${HOLD_GIB:-30}" --results "$results" || status=1
    ;;
  *)
    echo "shared-cap.sh: unknown phase '$p'"
    status=2
    ;;
  esac
done
exit $status
