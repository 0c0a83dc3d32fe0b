#!/bin/bash
# snapshot_compare.sh: a real PyTorch memory snapshot, read by gmr-compare
# directly, replays to PyTorch's own figures for the same run.
#
#   scripts/gpu/snapshot_compare.sh DIR      (DIR: a bundle from bundle.sh)
#
# Records GPT-2 training under PyTorch's own allocator with the history on
# (snapshot_record.py: the snapshot pickle and memory_stats()), then replays
# the pickle with DIR/bin/gmr-compare under config/pytorch.yaml on a
# simulated device of the GPU's size, and checks that gmr's peak reserved,
# peak requested and peak segments equal PyTorch's reserved_bytes.all.peak,
# requested_bytes.all.peak and segment.all.peak.  Prints "ok"/"not ok" per
# figure and exits 1 on a mismatch.  Results in $RESULTS (default
# /tmp/gmr-results): gpt2.snapshot.pickle, gpt2.snapshot.json (PyTorch),
# gpt2.snapshot.compare.json (gmr-compare).
set -u
dir=$(cd "$1" && pwd) || exit 2
here=$(cd "$(dirname "$0")" && pwd)
results=${RESULTS:-/tmp/gmr-results}
mkdir -p "$results"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no CUDA device (nvidia-smi -L failed)"
  exit 0
fi
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pk="$results/gpt2.snapshot.pickle"
pt="$results/gpt2.snapshot.json"
gc="$results/gpt2.snapshot.compare.json"
python3 "$here/snapshot_record.py" "$pk" "$pt" || exit 1
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
"$dir/bin/gmr-compare" --json --no-timing --capacity "${total}MiB" "$pk" \
  "$dir/config/pytorch.yaml" >"$gc" || exit 1
get() { sed -n "s/^ *\"$1\": \([0-9]*\),*$/\1/p" "$2" | head -n 1; }
status=0
check() { # check NAME GOT WANT
  if [ "$2" = "$3" ]; then echo "ok - $1: $2"; else
    echo "not ok - $1: gmr-compare $2, PyTorch $3"
    status=1
  fi
}
check "peak reserved" "$(get peak_reserved "$gc")" "$(get 'reserved_bytes.all.peak' "$pt")"
check "peak requested" "$(get peak_requested "$gc")" "$(get 'requested_bytes.all.peak' "$pt")"
check "peak segments" "$(get segments_peak "$gc")" "$(get 'segment.all.peak' "$pt")"
grep -A6 '"top_sites"' "$gc" | head -n 1
exit $status
