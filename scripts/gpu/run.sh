#!/bin/bash
# run.sh: gmr's framework checks on a CUDA machine, one phase after another.
#
#   scripts/gpu/run.sh DIR PHASE...
#
# DIR holds a build: lib/ (libgmr.so.0, libgmr-preload.so, libyaml-0.so.2),
# bin/gmr-info, python/ (the package), config/.  Phases:
#   info                 gmr-info
#   pool                 PyTorch + CuPy through the hooks, one 4 GiB limit
#   jax                  JAX alone through the interposer, the same limit
#   jaxdiag              JAX under GMR_INTERPOSE_LOG=1: which driver names it
#                        looks up and which calls reach gmr
#   all                  PyTorch + CuPy + JAX in one process (interposer too)
#   jaxpool[:CONFIG]     JAX with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, its buffers
#                        served from gmr's pool through the pool API (jax_pool.py):
#                        JAX's own cuda_async run first (the baseline), then under
#                        the interposer with CONFIG (a file under DIR/config,
#                        default tf-growth.yaml), then the 4 GiB limit's cap test
#   torchasync           PyTorch with backend:cudaMallocAsync under the interposer
#                        and the 4 GiB limit (torch_async.py)
#   cupyasync            CuPy's MemoryAsyncPool under the interposer (4 GiB limit)
#   gpt2:NAME[:CONFIG]   GPT-2 training; NAME native, native-expandable
#                        (PyTorch's allocator with expandable_segments:True),
#                        or gmr with CONFIG (a file under DIR/config, e.g.
#                        stitch.yaml); a trace of gmr runs is replayed on the
#                        simulator (replay_check.py)
#   stitch               the stitch policy's CUDA proofs, built here with nvcc:
#                        alias safety of a page mapped at two addresses
#                        (stitch_alias.cu), bandwidth and SGEMM on stitched
#                        pages against cudaMalloc (stitch_bw.cu)
#   bench                host cost of an allocation + free through torch, native vs gmr
#   bench-all            gmr-bench with every contender, threads pinned (the
#                        H200 run of docs/benchmarks.md): PyTorch's own allocator
#                        (its shim built here), cudaMallocAsync, cudaMalloc (pair,
#                        random; the first two also sweep), gmr's caching and bfc
#                        (pair, random, sweep), stitch (pair, sweep),
#                        and the same pairs on the simulated device (THREADS: the
#                        thread counts, default 1,2,4,8,16)
#   cuda-test            tests/cuda (the backend and the policies on the device)
#   bench-miss           the stitch policy's cache misses on the device: microseconds
#                        per miss by pages mapped (gmr-bench --workloads miss)
#   bench-calls          the driver calls gmr's CUDA backend makes, each timed alone
#                        (gmr-bench --workloads calls): gmr-compare's cost model figures
#   bench-bfc-threads    the bfc policy, 1 and 16 threads on their own streams, pinned
#                        (gmr-bench --threads 1,16, pair and random workloads, every
#                        bfc configuration): the rate column must be >= 1.00
#   compare              bit-exact losses and step times of the gpt2 runs
# Logs go to stdout; JSON results to $RESULTS (default /tmp/gmr-results).
# Without a CUDA device: "SKIP" and exit 0.
set -u
dir=$(cd "$1" && pwd) || exit 2
shift
here=$(cd "$(dirname "$0")" && pwd)
results=${RESULTS:-/tmp/gmr-results}
mkdir -p "$results"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no CUDA device (nvidia-smi -L failed)"
  exit 0
fi
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
preload="$dir/lib/libgmr-preload.so"
limit="$results/limit-4g.yaml"
policy=${POOL_POLICY:-caching}
printf 'policy: %s\nlimit: {bytes: 4GiB, counts: reserved}\n' "$policy" >"$limit"
status=0
phase() { echo; echo "=== $* ($(date +%T))"; }

for p in "$@"; do
  case "$p" in
  info)
    phase "gmr-info"
    timeout 60 "$dir/bin/gmr-info" || status=1
    ;;
  pool)
    phase "PyTorch + CuPy through gmr's hooks, $(tr '\n' ' ' <"$limit")"
    GMR_CONFIG="$limit" timeout 180 python3 "$here/shared_pool.py" torch cupy || status=1
    ;;
  jax)
    phase "JAX through the interposer, $(tr '\n' ' ' <"$limit")"
    LD_PRELOAD="$preload" XLA_PYTHON_CLIENT_ALLOCATOR=platform GMR_CONFIG="$limit" \
      timeout 180 python3 "$here/shared_pool.py" jax || status=1
    ;;
  jaxdiag)
    phase "JAX under the interposer with GMR_INTERPOSE_LOG=1: how it reaches the driver"
    log="$results/jax-interpose.log"
    LD_PRELOAD="$preload" XLA_PYTHON_CLIENT_ALLOCATOR=platform GMR_CONFIG="$limit" \
      GMR_INTERPOSE_LOG=1 timeout 120 python3 -c '
import jax, jax.numpy as jnp
x = jnp.ones(64 << 20, dtype=jnp.float32); x.block_until_ready()
print("sum", float(x.sum()), "device", jax.devices()[0], "backend", jax.default_backend())
' 2>"$log" || status=1
    echo "--- driver names looked up (count name):"
    grep -o 'dlsym([^)]*)[^ ]*\( hooked\)\?' "$log" | sed 's/dlsym(0x[0-9a-f]*, //' | sort | uniq -c | sort -rn | head -40
    echo "--- cuGetProcAddress lookups that were hooked:"
    grep 'cuGetProcAddress.*hooked' "$log" | sort | uniq -c | head
    echo "--- routed calls:"
    grep -E 'cuMemAlloc|cudaMalloc' "$log" | head -20
    grep -vE 'gmr-preload' "$log" | tail -5
    ;;
  all)
    phase "PyTorch + CuPy + JAX in one process, $(tr '\n' ' ' <"$limit")"
    LD_PRELOAD="$preload" XLA_PYTHON_CLIENT_ALLOCATOR=platform GMR_CONFIG="$limit" \
      timeout 240 python3 "$here/shared_pool.py" torch cupy jax || status=1
    ;;
  jaxpool | jaxpool:*)
    cfg=${p#jaxpool}
    cfg=${cfg#:}
    cfg="$dir/config/${cfg:-tf-growth.yaml}"
    phase "JAX cuda_async, its own pool (the baseline)"
    XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async XLA_PYTHON_CLIENT_PREALLOCATE=false \
      timeout 300 python3 "$here/jax_pool.py" || status=1
    phase "JAX cuda_async served by gmr, $cfg"
    LD_PRELOAD="$preload" XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async \
      XLA_PYTHON_CLIENT_PREALLOCATE=false GMR_CONFIG="$cfg" \
      timeout 300 python3 "$here/jax_pool.py" || status=1
    phase "JAX cuda_async served by gmr, cap test: $(tr '\n' ' ' <"$limit")"
    LD_PRELOAD="$preload" XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async \
      XLA_PYTHON_CLIENT_PREALLOCATE=false GMR_CONFIG="$limit" \
      timeout 300 python3 "$here/jax_pool.py" --steps 3 || status=1
    ;;
  cupyasync)
    phase "CuPy MemoryAsyncPool served by gmr, $(tr '\n' ' ' <"$limit")"
    LD_PRELOAD="$preload" GMR_CONFIG="$limit" timeout 180 python3 "$here/cupy_async.py" || status=1
    ;;
  torchasync)
    phase "PyTorch backend:cudaMallocAsync served by gmr, $(tr '\n' ' ' <"$limit")"
    LD_PRELOAD="$preload" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync GMR_CONFIG="$limit" \
      timeout 240 python3 "$here/torch_async.py" || status=1
    ;;
  gpt2:*)
    IFS=: read -r _ name cfg <<<"$p"
    phase "GPT-2 training: $name ${cfg:-}"
    if [ "$name" = native ]; then
      timeout 240 python3 "$here/gpt2_train.py" --allocator native --steps "${STEPS:-10}" \
        --json "$results/gpt2-native${RUN:+-$RUN}.json" || status=1
    elif [ "$name" = native-expandable ]; then
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 240 python3 "$here/gpt2_train.py" \
        --allocator native --steps "${STEPS:-10}" \
        --json "$results/gpt2-native-expandable${RUN:+-$RUN}.json" || status=1
    else
      trace="$results/gpt2-$name.trace.csv"
      timeout 240 python3 "$here/gpt2_train.py" --allocator gmr --config "$dir/config/$cfg" \
        --steps "${STEPS:-10}" --json "$results/gpt2-$name${RUN:+-$RUN}.json" \
        ${TRACE:+--trace "$trace"} || status=1
      if [ -n "${TRACE:-}" ] && [ -s "$trace" ]; then
        echo "--- replay of the recorded trace on the simulator, $cfg"
        python3 "$here/replay_check.py" "$trace" "$dir/config/$cfg" | tee "$results/replay-$name.json"
      fi
    fi
    ;;
  bench)
    phase "host cost of torch.empty(1 MiB) + del: PyTorch's allocator, then gmr caching"
    timeout 120 python3 "$here/alloc_bench.py" native || status=1
    timeout 120 python3 "$here/alloc_bench.py" gmr "$dir/config/pytorch.yaml" || status=1
    ;;
  bench-all)
    phase "gmr-bench: every contender, pinned, median of ${REPS:-7}"
    shim="$results/libgmr-bench-torch.so"
    sh "$dir/tools/bench-torch.sh" "$shim" python3 || status=1
    timeout 480 "$dir/bin/gmr-bench" --device cuda --pin --reps "${REPS:-7}" --min-time 20 \
      --threads "${THREADS:-1,2,4,8,16}" --workloads pair,random,sweep --torch "$shim" \
      --json-file "$results/bench-all.json" "$dir/config/pytorch.yaml" \
      "$dir/config/tf-greedy.yaml" || status=1
    timeout 240 "$dir/bin/gmr-bench" --device cuda --pin --reps "${REPS:-7}" --min-time 20 \
      --threads "${THREADS:-1,2,4,8,16}" --workloads pair,sweep --no-baselines \
      --json-file "$results/bench-stitch.json" "$dir/config/stitch.yaml" || status=1
    # The same pairs on the simulated device, on the same host: what the
    # backend adds to the host's cost (a cached pair makes no device call).
    timeout 120 "$dir/bin/gmr-bench" --device sim --pin --reps "${REPS:-7}" --min-time 20 \
      --threads 1 --sizes 4KiB,1MiB --workloads pair,random \
      --json-file "$results/bench-sim.json" "$dir/config/pytorch.yaml" \
      "$dir/config/tf-greedy.yaml" "$dir/config/stitch.yaml" || status=1
    ;;
  cuda-test)
    phase "tests/cuda on the device"
    timeout 300 "$dir/bin/gmr-cuda-test" || status=1
    ;;
  bench-miss)
    phase "stitch: microseconds per cache miss by pages mapped (gmr-bench --device cuda)"
    timeout 300 "$dir/bin/gmr-bench" --device cuda --workloads miss --reps 7 \
      --json-file "$results/bench-miss.json" "$dir/config/stitch.yaml" || status=1
    ;;
  bench-calls)
    phase "driver calls: microseconds per call (gmr-bench --device cuda --workloads calls)"
    timeout 300 "$dir/bin/gmr-bench" --device cuda --workloads calls --reps 21 \
      --call-pages 1,4,64 --json-file "$results/bench-calls.json" |
      tee "$results/bench-calls.txt" || status=1
    ;;
  bench-bfc-threads)
    phase "bfc: 16 threads on 16 streams against one (gmr-bench --device cuda --threads 1,16)"
    timeout 600 "$dir/bin/gmr-bench" --device cuda --pin --reps 7 --min-time 20 --threads 1,16 \
      --sizes 4KiB,1MiB --workloads pair,random --json-file "$results/bench-bfc-threads.json" \
      "$dir/config/tf-greedy.yaml" "$dir/config/tf-growth.yaml" "$dir/config/jax.yaml" |
      tee "$results/bench-bfc-threads.txt" || status=1
    ;;
  stitch)
    phase "stitch: alias safety and bandwidth/SGEMM on stitched pages (nvcc -arch=sm_90)"
    bin="$results/stitch-bin"
    mkdir -p "$bin"
    nvcc -arch=sm_90 -O2 -o "$bin/stitch_alias" "$here/stitch_alias.cu" -lcuda &&
      nvcc -arch=sm_90 -O2 -o "$bin/stitch_bw" "$here/stitch_bw.cu" -lcuda -lcublas || status=1
    timeout 300 "$bin/stitch_alias" "${ROUNDS:-2000}" | tee "$results/stitch-alias.txt" || status=1
    timeout 300 "$bin/stitch_bw" 1024 8192 20 | tee "$results/stitch-bw.txt" || status=1
    ;;
  compare)
    phase "compare the GPT-2 runs"
    python3 "$here/compare_runs.py" "$results" || status=1
    ;;
  *)
    echo "run.sh: unknown phase '$p'"
    status=2
    ;;
  esac
done
exit $status
