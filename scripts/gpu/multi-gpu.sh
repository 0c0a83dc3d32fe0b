#!/bin/bash
# multi-gpu.sh: gmr on two GPUs of one host (docs/multi-device.md).
#
#   scripts/gpu/multi-gpu.sh DIR [PHASE...]      (default: c torch ddp sharedcap)
#
# DIR is a bundle from scripts/gpu/bundle.sh.  Phases:
#   c          multi_gpu.c, built here with cc against DIR/include and DIR/lib:
#              the CUDA checks on both devices in one process, a thread per
#              device, each with its own runtimes (direct, caching, expandable,
#              stitch); frees through the other device's runtime are
#              GMR_EBADPTR and change nothing; the caller's current device is
#              left alone.  OPS (default 2000) random operations per device.
#   torch      multi_gpu_torch.py: PyTorch on cuda:0 and cuda:1 in one process
#              through gmr's hooks, a thread per device, per-device stats.
#   ddp        gpt2_ddp.py under torchrun --nproc_per_node=2: PyTorch's
#              allocator, gmr caching (config/pytorch.yaml), gmr stitch
#              (config/stitch.yaml); then compare_ddp.py: losses bit for bit,
#              step time within 2%, per-device peak reserved = PyTorch's
#              (caching).  STEPS (default 10).
#   sharedcap  the shared cap with a process per GPU (one cap file per GPU):
#              shared_cap.py on each GPU at once, when the bundle has it.
# Logs go to stdout; JSON results to $RESULTS (default /tmp/gmr-results).
# With fewer than two GPUs: "SKIP" and exit 0.
set -u
dir=$(cd "$1" && pwd) || exit 2
shift
[ $# -gt 0 ] || set -- c torch ddp sharedcap
here=$(cd "$(dirname "$0")" && pwd)
results=${RESULTS:-/tmp/gmr-results}
mkdir -p "$results"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "SKIP: ${ngpu:-0} GPU(s), two needed"
  exit 0
fi
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these hosts
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cuda=${CUDA_HOME:-/usr/local/cuda}
inc="$dir/include"
[ -d "$inc" ] || inc="$here/../../include"
status=0
phase() { echo; echo "=== $* ($(date +%T))"; }

for p in "$@"; do
  case "$p" in
  c)
    phase "two CUDA devices in one process, a thread per device (multi_gpu.c)"
    bin="$results/multi_gpu"
    ${CC:-cc} -std=c11 -O2 -pthread -I"$inc" -I"$cuda/include" -o "$bin" "$here/multi_gpu.c" \
      -L"$dir/lib" -lgmr -L"$cuda/lib64" -lcudart -Wl,-rpath,"$cuda/lib64" || { status=1; continue; }
    GMR_STITCH_CONFIG="$dir/config/stitch.yaml" timeout 600 "$bin" "${OPS:-2000}" |
      tee "$results/multi_gpu.tap"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    echo "$(grep -c '^ok' "$results/multi_gpu.tap") ok, $(grep -c '^not ok' "$results/multi_gpu.tap") not ok"
    ;;
  torch)
    phase "PyTorch on cuda:0 and cuda:1 in one process through gmr's hooks"
    timeout 300 python3 "$here/multi_gpu_torch.py" "$dir/config/pytorch.yaml" || status=1
    ;;
  ddp)
    for run in native caching:pytorch.yaml stitch:stitch.yaml; do
      IFS=: read -r name cfg <<<"$run"
      phase "GPT-2 DDP on 2 GPUs: $name ${cfg:-}"
      args=(--allocator native)
      [ -z "$cfg" ] || args=(--allocator gmr --config "$dir/config/$cfg")
      timeout 600 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        "$here/gpt2_ddp.py" "${args[@]}" --steps "${STEPS:-10}" \
        --json "$results/ddp-$name.json" || status=1
    done
    phase "compare the DDP runs"
    python3 "$here/compare_ddp.py" "$results" || status=1
    ;;
  sharedcap)
    phase "the shared cap, a process per GPU (one cap file per GPU)"
    if [ ! -f "$here/shared_cap.py" ] || [ ! -x "$dir/bin/gmr-top" ]; then
      echo "TODO: shared_cap.py or gmr-top is not in this bundle (the shared cap has not landed)"
      continue
    fi
    pids=()
    for g in 0 1; do
      mkdir -p "$results/shared-cap-gpu$g"
      CUDA_VISIBLE_DEVICES=$g timeout 600 python3 "$here/shared_cap.py" --top "$dir/bin/gmr-top" \
        --preload "$dir/lib/libgmr-preload.so" --results "$results/shared-cap-gpu$g" \
        >"$results/shared-cap-gpu$g.log" 2>&1 &
      pids+=($!)
    done
    for g in 0 1; do
      wait "${pids[$g]}" || status=1
      echo "--- GPU $g"
      cat "$results/shared-cap-gpu$g.log"
    done
    ;;
  *)
    echo "multi-gpu.sh: unknown phase '$p'"
    status=2
    ;;
  esac
done
exit $status
