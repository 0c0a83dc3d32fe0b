"""PyTorch's cudaMallocAsync backend served from gmr's pool.

    LD_PRELOAD=$DIR/lib/libgmr-preload.so PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
    GMR_CONFIG=limit.yaml python3 torch_async.py [--steps 5]

With backend:cudaMallocAsync PyTorch allocates with cudaMallocAsync from
cudaDeviceGetDefaultMemPool's pool, reads torch.cuda.memory_allocated() and
memory_reserved() from cudaMemPoolGetAttribute and empties its cache with
cudaMemPoolTrimTo: the interposer serves all of these from gmr (Note [Memory
pools] in lib/adapters/interpose-pools.c).  The script trains a small MLP for
--steps steps with a fixed seed, printing the losses, then compares PyTorch's
figures with gmr's (read in-process through python/gmr), empties the cache,
and, when GMR_CONFIG has a limit, asks for more than it leaves: PyTorch's
OutOfMemoryError, then it carries on.  Without the preload it prints the same
lines (PyTorch on the driver's pool), gmr's marked "(not loaded)".  Exits 1 on
a failed check.
"""

import argparse
import os
import sys
import time

MiB = 1 << 20
failures = []


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def gmr_stats(gmr, tag):
    if gmr is None:
        print("gmr %s: (not loaded)" % tag)
        return None
    s = gmr.stats(0)
    keys = ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
            "num_allocs", "num_frees", "ooms", "limit_bytes")
    print("gmr %s: %s" % (tag, " ".join("%s=%d" % (k, s.get(k, 0)) for k in keys)))
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    preload = "libgmr-preload" in os.environ.get("LD_PRELOAD", "")
    print("PYTORCH_CUDA_ALLOC_CONF %s, preload %s, GMR_CONFIG %s" % (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)"), preload,
        os.environ.get("GMR_CONFIG", "(unset)")))
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    backend = torch.cuda.get_allocator_backend()
    print("torch %s, allocator backend %s" % (torch.__version__, backend))
    check(backend == "cudaMallocAsync", "PyTorch uses its cudaMallocAsync backend")
    gmr = None
    if preload:
        import gmr as gmr_mod

        gmr = gmr_mod
        print("gmr library: %s, policy %s" % (gmr.library_path(), gmr.policy(0)))
    before = gmr_stats(gmr, "at start")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    state_bytes = 3 * 4 * n_params
    print("model: %d parameters, parameters + Adam state %d bytes" % (n_params, state_bytes))
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")
    for i in range(1, args.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        lv = loss.item()
        print("step %d loss %.9g time %.3f ms" % (i, lv, (time.perf_counter() - t0) * 1e3),
              flush=True)

    allocated = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    peak = torch.cuda.max_memory_allocated()
    print("torch: memory_allocated %d memory_reserved %d max_memory_allocated %d" % (
        allocated, reserved, peak))
    s = gmr_stats(gmr, "after training")
    if s is not None:
        check(s["num_allocs"] > before["num_allocs"], "PyTorch's tensors were allocated by gmr "
              "(%d allocations)" % (s["num_allocs"] - before["num_allocs"]))
        check(s["peak_allocated_bytes"] >= state_bytes,
              "gmr's peak allocated %d >= parameters + Adam state %d" % (
                  s["peak_allocated_bytes"], state_bytes))
        # USED_MEM_CURRENT counts what went through the pool; gmr's figure also
        # holds what CUDA libraries took with cudaMalloc.
        check(0 < allocated <= s["allocated_bytes"],
              "torch.cuda.memory_allocated() %d (USED_MEM_CURRENT) <= gmr's allocated %d" % (
                  allocated, s["allocated_bytes"]))
        check(reserved == s["reserved_bytes"],
              "torch.cuda.memory_reserved() = gmr's reserved bytes (RESERVED_MEM_CURRENT)")

    del model, opt, x, y, loss
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # cudaMemPoolTrimTo(pool, 0)
    print("torch after empty_cache: memory_allocated %d memory_reserved %d" % (
        torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
    s = gmr_stats(gmr, "after empty_cache")
    if s is not None:
        check(s["reserved_bytes"] == torch.cuda.memory_reserved(),
              "empty_cache gave gmr's cache back (reserved %d)" % s["reserved_bytes"])
    torch.cuda.reset_peak_memory_stats()  # USED_MEM_HIGH := 0, RESERVED_MEM_HIGH := 0
    print("torch after reset_peak_memory_stats: max_memory_allocated %d" %
          torch.cuda.max_memory_allocated())

    limit = s["limit_bytes"] if s is not None else 0
    if limit:
        try:
            torch.empty(limit + 256 * MiB, dtype=torch.uint8, device="cuda")
            check(False, "past the limit: torch.OutOfMemoryError")
        except torch.OutOfMemoryError as e:
            check(True, "past the limit: torch.OutOfMemoryError")
            print("   message: %s" % str(e).splitlines()[0][:300])
        z = torch.arange(1000, device="cuda", dtype=torch.float32)
        check(float((z * 2).sum()) == 999000.0, "PyTorch carries on after the OOM")
        s = gmr_stats(gmr, "at the end")
        check(s["peak_reserved_bytes"] <= limit, "gmr's peak reserved %d <= the limit %d" % (
            s["peak_reserved_bytes"], limit))
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
