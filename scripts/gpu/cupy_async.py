"""CuPy's MemoryAsyncPool served from gmr's pool.

    LD_PRELOAD=$DIR/lib/libgmr-preload.so GMR_CONFIG=limit.yaml python3 cupy_async.py

cupy.cuda.MemoryAsyncPool allocates with cudaMallocFromPoolAsync (or
cudaMallocAsync) from the device's current memory pool, frees with
cudaFreeAsync, reads used_bytes() and total_bytes() from
cudaMemPoolGetAttribute and frees its cache with cudaMemPoolTrimTo: the
interposer serves each from gmr (Note [Memory pools] in
lib/adapters/interpose-pools.c).  The script allocates a 1 GiB array and
twenty 64 MiB arrays, checks their values and that gmr's allocated bytes grew
by them (gmr's figures read in-process through python/gmr), compares the
pool's figures with gmr's, frees them and trims the pool; then, when
GMR_CONFIG has a limit, asks for more than it leaves: CuPy's
OutOfMemoryError, then it carries on.  Without the preload it prints the same
lines (CuPy on the driver's pool), gmr's marked "(not loaded)".  Exits 1 on a
failed check, 0 with "SKIP" without CuPy or a device.
"""

import os
import sys

MiB = 1 << 20
GiB = 1 << 30
failures = []


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def main():
    try:
        import cupy
    except ImportError:
        print("SKIP: no cupy")
        return 0
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001: no driver or no device
        print("SKIP: no CUDA device (%s)" % e)
        return 0
    preload = "libgmr-preload" in os.environ.get("LD_PRELOAD", "")
    gmr = None
    if preload:
        import gmr as gmr_mod

        gmr = gmr_mod
        print("gmr library %s, policy %s" % (gmr.library().path, gmr.policy(0)))
    pool = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(pool.malloc)
    print("cupy %s, allocator MemoryAsyncPool, preload %s" % (cupy.__version__, preload))

    def figures(tag):
        s = gmr.stats(0) if gmr is not None else None
        print("%s: pool used %d total %d; gmr %s" % (
            tag, pool.used_bytes(), pool.total_bytes(),
            "(not loaded)" if s is None else "allocated %d reserved %d limit %d" % (
                s["allocated_bytes"], s["reserved_bytes"], s.get("limit_bytes", 0))))
        return s

    before = figures("at start")
    held = [cupy.ones(GiB // 4, dtype=cupy.float32)]
    held += [cupy.full(16 * MiB, float(j), dtype=cupy.float32) for j in range(20)]
    total = sum(float(x[0]) for x in held)
    check(total == 1.0 + sum(range(20)), "1 GiB + 20 x 64 MiB arrays, values right")
    check(float(held[0].sum()) == float(GiB // 4), "the 1 GiB array sums right")
    s = figures("with the arrays")
    check(pool.used_bytes() >= GiB + 20 * 64 * MiB,
          "the pool counts the arrays in use (%d bytes)" % pool.used_bytes())
    if s is not None:
        grew = s["allocated_bytes"] - before["allocated_bytes"]
        check(grew >= GiB + 20 * 64 * MiB,
              "the arrays' 2.25 GiB are allocated from gmr's pool (+%d bytes)" % grew)
        check(pool.total_bytes() == s["reserved_bytes"],
              "the pool's total_bytes() is gmr's reserved (%d, %d)" % (
                  pool.total_bytes(), s["reserved_bytes"]))
    del held
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()  # cudaMemPoolTrimTo(pool, 0)
    s = figures("freed and trimmed")
    if s is not None:
        check(s["allocated_bytes"] <= before["allocated_bytes"],
              "gmr's allocated bytes are back (%d)" % s["allocated_bytes"])
    limit = (s or {}).get("limit_bytes", 0)
    if limit:
        try:
            cupy.empty(limit + 256 * MiB, dtype=cupy.uint8)
            check(False, "past the limit raises cupy's OutOfMemoryError")
        except cupy.cuda.memory.OutOfMemoryError as e:
            check(True, "past the limit raises cupy's OutOfMemoryError (%s)" % str(e)[:120])
        c = cupy.arange(1000, dtype=cupy.float64)
        check(float((c * 2).sum()) == 999000.0, "cupy carries on after the error")
        check(gmr.stats(0)["ooms"] >= 1, "gmr counted the refusal")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
