#!/usr/bin/env python3
"""gen-trace.py: write a synthetic allocation trace in RMM's replay-log layout.

    scripts/gen-trace.py EVENTS OUT.csv [--seed N] [--streams N]

For gmr-compare's speed and memory figures on a trace of any length
(docs/benchmarks.md): a training-like mix of short-lived activations and
long-lived blocks.  Each step allocates with probability 1/2 (always below
64 live blocks, never above 4096 or 24 GiB live), else frees a live block,
most often one of the most recent (geometric over the newest first).  Sizes
are log-uniform: 80 % from 512 B to 1 MiB, 20 % from 1 MiB to 256 MiB.
Every block is freed by the end.  The same arguments give the same file.
"""
import argparse
import math
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("events", type=int, help="number of events (allocations + frees)")
    ap.add_argument("out", help="output file ('-' for standard output)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--streams", type=int, default=1)
    a = ap.parse_args()
    if a.events < 2:
        sys.exit("gen-trace.py: EVENTS must be at least 2")
    rng = random.Random(a.seed)
    out = sys.stdout if a.out == "-" else open(a.out, "w", buffering=1 << 20)
    out.write("Thread,Time,Action,Pointer,Size,Stream\n")
    live = []  # [pointer, size, stream]
    live_bytes = 0
    next_ptr = 0x7F0000000000
    lines = []
    n = 0
    lo_s, hi_s = math.log(512), math.log(1 << 20)
    lo_l, hi_l = math.log(1 << 20), math.log(256 << 20)
    cap_bytes = 24 << 30
    while n < a.events:
        left = a.events - n
        must_free = len(live) >= left  # every block is freed by the end
        alloc = not must_free and (
            len(live) < 64 or (len(live) < 4096 and live_bytes < cap_bytes and rng.random() < 0.5))
        if alloc and left - 1 > len(live):
            if rng.random() < 0.8:
                size = int(math.exp(rng.uniform(lo_s, hi_s)))
            else:
                size = int(math.exp(rng.uniform(lo_l, hi_l)))
            stream = rng.randrange(a.streams)
            ptr = next_ptr
            next_ptr += (size + 511) // 512 * 512 + 512
            live.append([ptr, size, stream])
            live_bytes += size
            lines.append("0,%d,allocate,0x%x,%d,%d\n" % (n, ptr, size, stream))
        else:
            k = min(int(rng.expovariate(0.05)), len(live) - 1)
            ptr, size, stream = live.pop(len(live) - 1 - k)
            live_bytes -= size
            lines.append("0,%d,free,0x%x,%d,%d\n" % (n, ptr, size, stream))
        n += 1
        if len(lines) >= 65536:
            out.write("".join(lines))
            lines.clear()
    out.write("".join(lines))
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
