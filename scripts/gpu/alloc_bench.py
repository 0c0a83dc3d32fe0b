"""Host cost of one allocation + free through PyTorch, with its own allocator
or with gmr (the pluggable path: gmr_torch_alloc / gmr_torch_free).

    python3 alloc_bench.py native|gmr [CONFIG] [N]

Times N rounds of torch.empty(1 MiB, device="cuda") + del (after a warm-up),
so both allocators serve every request from their cache; prints µs per pair.
The difference between the two runs is what the pluggable path costs.
"""

import json
import sys
import time


def main():
    mode = sys.argv[1]
    cfg = sys.argv[2] if len(sys.argv) > 2 else None
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    if mode == "gmr":
        import gmr

        gmr.use_in_torch(cfg)
    for _ in range(1000):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del x
    torch.cuda.synchronize()
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            del x
        dt = (time.perf_counter() - t0) / n * 1e6
        best = dt if best is None else min(best, dt)
    print(json.dumps({"allocator": mode, "config": cfg, "pairs": n, "us_per_pair_best_of_3": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
