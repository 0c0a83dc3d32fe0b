#!/usr/bin/env python3
"""bench-across.py: gmr-bench in several processes, and the spread across them.

    scripts/bench-across.py [--json-out FILE] N GMR_BENCH [ARGS...]

One process's median of repetitions can move by half from one process to
the next for the same code and the same requests (docs/benchmarks.md, "how
much one process tells"): what sets it lasts a process's life.  This runs
`GMR_BENCH ARGS --json` N times, one process after another, and prints for
every figure (workload, contender, size or live blocks, thread count) the
minimum, median and maximum over the processes.  --json-out writes the
same as a JSON array.  Sweep points are figures of their own; the miss
workload is left out (it times device calls, not the host).

Exit status: 0, 1 when a run of gmr-bench fails or prints no JSON, 2 for
usage errors.
"""
import json
import statistics
import subprocess
import sys


def usage(msg):
    print("bench-across.py: " + msg, file=sys.stderr)
    print("usage: bench-across.py [--json-out FILE] N GMR_BENCH [ARGS...]", file=sys.stderr)
    sys.exit(2)


def figures(rows):
    """(key, ns) for every figure of one process's rows."""
    for r in rows:
        w = r.get("workload")
        base = (w, r.get("contender"), r.get("policy"))
        if w == "pair" or w == "random":
            unit = "ns_per_pair" if w == "pair" else "ns_per_op"
            what = "%d B" % r["size"] if w == "pair" else "%d live" % r["live_blocks"]
            yield base + (what, "single"), r[unit]
            for t in r.get("threads", []):
                yield base + (what, "%dT" % t["threads"]), t[unit]
        elif w == "sweep":
            for p in r.get("points", []):
                yield base + ("%d live" % p["live_blocks"], "1T"), p["ns_per_op"]


def main(argv):
    json_out = None
    if argv[:1] == ["--json-out"]:
        if len(argv) < 2:
            usage("--json-out needs a file")
        json_out, argv = argv[1], argv[2:]
    if len(argv) < 2:
        usage("N and GMR_BENCH are needed")
    try:
        n = int(argv[0])
    except ValueError:
        usage("N must be a number, not %r" % argv[0])
    if n < 1:
        usage("N must be at least 1")
    cmd = argv[1:] + ["--json"]
    seen = {}  # key -> [ns per process]
    order = []
    for i in range(n):
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print("bench-across.py: run %d of %d exited %d" % (i + 1, n, p.returncode),
                  file=sys.stderr)
            return 1
        try:
            rows = json.loads(p.stdout)
        except ValueError as e:
            print("bench-across.py: run %d printed no JSON (%s)" % (i + 1, e), file=sys.stderr)
            return 1
        for key, ns in figures(rows):
            if key not in seen:
                seen[key] = []
                order.append(key)
            seen[key].append(ns)
    out = []
    print("%-9s %-18s %-14s %-14s %-7s %10s %10s %10s %4s" %
          ("workload", "contender", "policy", "what", "threads", "min ns", "median ns", "max ns",
           "runs"))
    for key in order:
        v = seen[key]
        w, contender, policy, what, threads = key
        row = {"workload": w, "contender": contender, "policy": policy, "what": what,
               "threads": threads, "runs": len(v), "ns_min": min(v),
               "ns_median": statistics.median(v), "ns_max": max(v), "ns": v}
        out.append(row)
        print("%-9s %-18s %-14s %-14s %-7s %10.1f %10.1f %10.1f %4d" %
              (w, contender[:18], policy[:14], what, threads, row["ns_min"], row["ns_median"],
               row["ns_max"], len(v)))
    if json_out is not None:
        with open(json_out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
