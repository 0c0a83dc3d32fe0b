#!/usr/bin/env python3
"""shared-lines.py: the cache lines that threads share, from a memory trace.

    shared-lines.py TRACE BINARY

TRACE is the output of `valgrind --tool=lackey --trace-mem=yes BINARY ...`
where BINARY is scripts/shared-lines.c built statically (scripts/shared-lines.sh
does both; TRACE may be a pipe).  The measured phase is the calls of gmr_alloc
and gmr_free that measured_pairs() makes, found by their call sites in BINARY.
A thread is known by its stack: the return address that such a `call` pushes
lands in the calling thread's stack, and any later access to a known stack
sets the current thread (valgrind runs one thread at a time).  Stack lines are
left out (private), and so is the main thread (it runs set-up and teardown,
not the measured pairs).  Only accesses by instructions of BINARY count
(libgmr, and the statically linked libc).

It prints, per thread, the 64-byte lines it writes at least once per 100 of
its pairs that no other thread touches as often, and every line that one
thread writes and another touches, both at least once per 100 pairs: the
lines whose traffic between cores grows with the number of threads, with the
functions that touch them.  Standard library and binutils (nm, objdump) only.
"""
import bisect
import collections
import re
import subprocess
import sys

MAIN_STACK = 0x1000000000  # valgrind puts the main thread's stack above this
RATE = 0.01  # "per operation": at least once per 100 pairs


def symbols(binary):
    """Sorted (start, size, name) of the functions of a non-PIE binary."""
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True,
                         text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tT":
            syms.append((int(p[0], 16), int(p[1], 16), p[3]))
    return sorted(syms)


def call_sites(binary):
    """The addresses of measured_pairs' calls of gmr_alloc and gmr_free."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True,
                         text=True, check=True).stdout
    body = dis[dis.index("<measured_pairs>:"):]
    body = body[:body.index("\n\n")]
    sites = {}
    for m in re.finditer(r"^\s*([0-9a-f]+):\s+call\s+[0-9a-f]+ <(gmr_alloc|gmr_free)>", body, re.M):
        sites[int(m.group(1), 16)] = m.group(2)
    return sites


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: shared-lines.py TRACE BINARY")
    trace, binary = sys.argv[1], sys.argv[2]
    syms = symbols(binary)
    starts = [s[0] for s in syms]
    lo, hi = syms[0][0], syms[-1][0] + syms[-1][1]
    sites = call_sites(binary)

    def function(a):
        i = bisect.bisect_right(starts, a) - 1
        return syms[i][2] if i >= 0 and a < syms[i][0] + syms[i][1] else "?"

    stacks = {}  # address >> 20 -> thread number
    cur = None  # the running thread; -1: the main thread
    ins = 0  # the instruction the next data accesses belong to
    push = None  # a measured call's return-address push comes next
    pairs = collections.Counter()
    writes = collections.defaultdict(collections.Counter)  # line -> thread -> count
    reads = collections.defaultdict(collections.Counter)
    who = collections.defaultdict(set)  # line -> functions that touched it
    with open(trace) as f:
        for line in f:
            if line[0] == "I":
                ins = int(line[3:line.index(",")], 16)
                push = sites.get(ins)
                continue
            if line[0] != " " or line[1] not in "LSM":
                continue
            kind = line[1]
            comma = line.index(",")
            addr, size = int(line[3:comma], 16), int(line[comma + 1:])
            region = addr >> 20
            if push is not None and kind == "S":
                cur = stacks.setdefault(region, len(stacks))
                if push == "gmr_alloc":
                    pairs[cur] += 1
                push = None
                continue
            if region in stacks:
                cur = stacks[region]
                continue
            if addr >= MAIN_STACK:
                cur = -1
                continue
            if cur is None or cur < 0 or not lo <= ins < hi:
                continue
            for ln in range(addr >> 6, ((addr + size - 1) >> 6) + 1):
                if kind in "SM":
                    writes[ln][cur] += 1
                if kind in "LM":
                    reads[ln][cur] += 1
                who[ln].add(function(ins))
    threads = sorted(pairs)
    if not threads:
        sys.exit("shared-lines.py: no measured pairs in the trace")
    n = min(pairs[t] for t in threads)
    print(f"{len(threads)} threads, {n} measured pairs each")
    private = collections.Counter()
    shared = []
    for ln in writes:
        w, r = writes[ln], reads[ln]
        writers = [t for t in threads if w[t] / n >= RATE]
        touchers = [t for t in threads if (w[t] + r[t]) / n >= RATE]
        if not writers:
            continue
        if len(touchers) < 2:
            private[writers[0]] += 1
            continue
        rate = max(min(w[a], w[b] + r[b]) for a in writers for b in touchers if b != a) / n
        shared.append((rate, ln, w, r, sorted(who[ln])))
    print("lines written per pair by one thread alone: " +
          ", ".join(f"{private[t]}" for t in threads))
    print(f"lines one thread writes and another touches, per pair: {len(shared)}")
    for rate, ln, w, r, fns in sorted(shared, reverse=True):
        wt = ", ".join(f"t{t}: {w[t]}" for t in threads if w[t])
        rt = ", ".join(f"t{t}: {r[t]}" for t in threads if r[t])
        print(f"  {ln << 6:#x}: {rate:.2f} per pair; writes {wt}; reads {rt}; by {', '.join(fns)}")


if __name__ == "__main__":
    main()
