"""PyTorch on two GPUs in one process through gmr's hooks (gmr.use_in_torch).

    python3 multi_gpu_torch.py [CONFIG]

One runtime per device, behind one pluggable allocator: tensors on cuda:0
and cuda:1, computed in two threads at once (one per device), copies across
devices checked against the CPU bit for bit; gmr.stats(0) and gmr.stats(1)
each count only their own device's memory; torch.cuda.empty_cache() (which
reaches every device's runtime) leaves the thread's current device alone.
Prints one "ok"/"FAIL" line per check; exits 1 on any failure, 0 with "SKIP"
with fewer than two devices.
"""

import sys
import threading

failures = []
MiB = 1 << 20


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def main():
    import torch

    if torch.cuda.device_count() < 2:
        print("SKIP: %d CUDA device(s), two needed" % torch.cuda.device_count())
        return 0
    import gmr

    gmr.use_in_torch(sys.argv[1] if len(sys.argv) > 1 else None)
    torch.manual_seed(0)
    a_cpu = torch.randn(1024, 1024)
    results, errors = {}, []

    def work(d):
        try:
            with torch.cuda.device(d):
                a = a_cpu.to(d)
                keep = [torch.empty((i + 1) * MiB, dtype=torch.uint8, device=d).fill_(i)
                        for i in range(32)]
                for _ in range(50):
                    b = a @ a
                    c = torch.relu(b) - b
                    del b, c
                x = (a * (d + 2)).sum().item()
                ok = all(int(t[0]) == i and int(t[-1]) == i for i, t in enumerate(keep))
                torch.cuda.synchronize(d)
                results[d] = (x, ok, [t.device.index for t in keep])
        except Exception as e:  # reported by the main thread
            errors.append("device %d: %r" % (d, e))

    th = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(not errors, "both threads ran (%s)" % "; ".join(errors))
    for d in (0, 1):
        if d not in results:
            continue
        x, ok, devs = results[d]
        check(abs(x - float((a_cpu * (d + 2)).sum())) < 1e-1 * abs(x) + 1,
              "device %d: the thread's result matches the CPU" % d)
        check(ok and set(devs) == {d}, "device %d: 32 tensors on cuda:%d keep their bytes" % (d, d))

    torch.cuda.set_device(0)
    x0 = torch.arange(1 << 20, dtype=torch.float32, device=0)
    x1 = x0.to(1)
    back = x1.to("cpu")
    check(torch.equal(back, torch.arange(1 << 20, dtype=torch.float32)),
          "cuda:0 -> cuda:1 -> cpu copies are exact")
    s0, s1 = gmr.stats(0), gmr.stats(1)
    check(s0["allocations"] > 0 and s1["allocations"] > 0,
          "gmr.stats: live allocations on both devices (%d, %d)" % (s0["allocations"],
                                                                   s1["allocations"]))
    check(s1["requested_bytes"] >= 4 * MiB and s0["requested_bytes"] >= 4 * MiB,
          "each device counts its own tensors (%d, %d requested bytes)" % (
              s0["requested_bytes"], s1["requested_bytes"]))
    del x1
    req0 = gmr.stats(0)["requested_bytes"]
    check(gmr.stats(1)["requested_bytes"] == s1["requested_bytes"] - 4 * MiB and req0 ==
          s0["requested_bytes"], "freeing a cuda:1 tensor changes device 1's figures only")
    torch.cuda.empty_cache()
    check(torch.cuda.current_device() == 0, "torch.cuda.empty_cache() leaves the current device on 0")
    with torch.cuda.device(1):
        y = torch.ones(8 * MiB, device=1)
        del y
    torch.cuda.empty_cache()
    check(torch.cuda.current_device() == 0, "  also after work on cuda:1")
    for d in (0, 1):
        s = gmr.stats(d)
        print("device %d: %s, peak reserved %d, peak allocated %d, reserved now %d" % (
            d, gmr.policy(d), s["peak_reserved_bytes"], s["peak_allocated_bytes"],
            s["reserved_bytes"]))
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
