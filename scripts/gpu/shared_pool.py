"""PyTorch, CuPy and JAX in one process on one gmr pool under one limit.

    GMR_CONFIG=limit.yaml python3 shared_pool.py [torch] [cupy] [jax]

PyTorch goes through gmr.use_in_torch, CuPy through gmr.use_in_cupy, JAX
through the interposer (run under LD_PRELOAD=libgmr-preload.so with
XLA_PYTHON_CLIENT_ALLOCATOR=platform).  For each framework: allocate and
compute, then ask for more than the limit leaves and check that the
framework's own out-of-memory error is raised, then allocate and compute
again (the process carries on).  Prints one "ok"/"FAIL" line per check and
gmr's figures; exits 1 on any failure, 0 with "SKIP" without a device.
With XLA_PYTHON_CLIENT_ALLOCATOR=platform, JAX 0.11 maps its buffers itself
(cuMemCreate + cuMemMap): they cannot come from gmr's pool, so the
interposer counts them against the same limit (gmr_charge); gmr's figures
show them as limit_external_bytes.  With cuda_async (and
XLA_PYTHON_CLIENT_PREALLOCATE=false) JAX allocates through the stream-ordered
pool API, which the interposer serves from gmr's pool: its buffers are then
in allocated_bytes, and the script checks that they are.
"""

import os
import sys

GiB = 1 << 30
failures = []


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def main():
    which = set(sys.argv[1:]) or {"torch", "cupy", "jax"}
    cfg = os.environ.get("GMR_CONFIG")
    if not cfg:
        print("shared_pool.py: set GMR_CONFIG to a YAML with a limit")
        return 2
    import gmr

    preload = "libgmr-preload" in os.environ.get("LD_PRELOAD", "")
    torch = cupy = jax = None
    if "torch" in which:
        import torch

        if not torch.cuda.is_available():
            print("SKIP: no CUDA device")
            return 0
        gmr.use_in_torch(cfg)
    if "cupy" in which:
        import cupy

        gmr.use_in_cupy(cfg)
    if "jax" in which:
        if not preload or os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") not in ("platform",
                                                                                "cuda_async"):
            print("shared_pool.py: jax needs LD_PRELOAD=libgmr-preload.so and "
                  "XLA_PYTHON_CLIENT_ALLOCATOR=platform or cuda_async")
            return 2
        import jax
        import jax.numpy as jnp

    print("gmr library: %s, policy %s, preload %s" % (gmr.library_path(), gmr.policy(0), preload))
    limit = gmr.stats(0)["limit_bytes"]
    check(limit > 0, "a limit is configured (%d bytes)" % limit)

    held = []
    if torch is not None:
        a = torch.ones(256 << 20, device="cuda")  # 1 GiB
        check(float(a.sum()) == float(256 << 20), "torch: 1 GiB tensor, sum right")
        held.append(a)
        free, total = torch.cuda.mem_get_info()
        print("torch.cuda.mem_get_info: free %d total %d" % (free, total))
        if preload:
            check(total == limit, "torch.cuda.mem_get_info reports the limit as total")
    if cupy is not None:
        b = cupy.ones(128 << 20, dtype=cupy.float32)  # 512 MiB
        check(float(b.sum()) == float(128 << 20), "cupy: 512 MiB array, sum right")
        held.append(b)
    if jax is not None:
        before_jax = gmr.stats(0)["allocated_bytes"]
        c = jnp.ones(64 << 20, dtype=jnp.float32)  # 256 MiB
        check(float(c.sum()) == float(64 << 20), "jax: 256 MiB array, sum right")
        held.append(c)
        if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "cuda_async":
            grew = gmr.stats(0)["allocated_bytes"] - before_jax
            check(grew >= GiB // 4, "jax: the array is served from gmr's pool (allocated "
                  "+%d bytes)" % grew)
    s = gmr.stats(0)
    print("gmr after the allocations: reserved %d allocated %d segments %d" %
          (s["reserved_bytes"], s["allocated_bytes"], s["segments"]))
    want = (GiB if torch is not None else 0) + (GiB // 2 if cupy is not None else 0) + \
        (GiB // 4 if jax is not None else 0)
    external = s.get("limit_external_bytes", 0)
    print("gmr: memory mapped by frameworks themselves, counted under the limit: %d" % external)
    check(s["allocated_bytes"] + external >= want, "all frameworks' arrays are under gmr's one "
          "limit (allocated %d + external %d >= %d)" % (s["allocated_bytes"], external, want))

    big = limit  # more than what is left under the limit
    if torch is not None:
        try:
            torch.empty(big, dtype=torch.uint8, device="cuda")
            check(False, "torch: over the limit raises torch.OutOfMemoryError")
        except torch.OutOfMemoryError as e:
            check(True, "torch: over the limit raises torch.OutOfMemoryError")
            print("   message: %s" % str(e).splitlines()[0][:300])
        except Exception as e:  # noqa: BLE001
            check(False, "torch: over the limit raises torch.OutOfMemoryError (got %s: %s)" %
                  (type(e).__name__, str(e)[:200]))
        x = torch.arange(1000, device="cuda", dtype=torch.float32)
        check(float((x * 2).sum()) == 999000.0, "torch carries on after the OOM")
    if cupy is not None:
        try:
            cupy.empty(big, dtype=cupy.uint8)
            check(False, "cupy: over the limit raises cupy OutOfMemoryError")
        except cupy.cuda.memory.OutOfMemoryError as e:
            check(True, "cupy: over the limit raises cupy OutOfMemoryError")
            print("   message: %s" % str(e)[:300])
        y = cupy.arange(1000, dtype=cupy.float32)
        check(float((y * 2).sum()) == 999000.0, "cupy carries on after the OOM")
    if jax is not None:
        try:
            z = jnp.zeros(big, dtype=jnp.uint8)
            z.block_until_ready()
            check(False, "jax: over the limit raises RESOURCE_EXHAUSTED")
        except Exception as e:  # noqa: BLE001 (jaxlib's XlaRuntimeError / JaxRuntimeError)
            ok = "RESOURCE_EXHAUSTED" in str(e)
            check(ok, "jax: over the limit raises RESOURCE_EXHAUSTED (%s)" % type(e).__name__)
            print("   message: %s" % str(e).splitlines()[0][:300])
        w = jnp.arange(1000, dtype=jnp.float32)
        check(float((w * 2).sum()) == 999000.0, "jax carries on after the OOM")

    if hasattr(gmr._library(), "gmr_snapshot_write"):
        import pickle
        path = os.path.join(os.environ.get("RESULTS", "/tmp"), "snapshot.pickle")
        gmr.snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        segs = snap.get("segments", []) if isinstance(snap, dict) else []
        check(len(segs) > 0, "gmr.snapshot wrote PyTorch's snapshot pickle (%d segments, "
              "%d bytes in segments)" % (len(segs), sum(x.get("total_size", 0) for x in segs)))

    s = gmr.stats(0)
    check(s["peak_reserved_bytes"] <= limit,
          "peak reserved %d <= limit %d" % (s["peak_reserved_bytes"], limit))
    check(s["ooms"] >= 1, "gmr counted the refusals (ooms = %d)" % s["ooms"])
    print(gmr.summary(0)[:3000])
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
