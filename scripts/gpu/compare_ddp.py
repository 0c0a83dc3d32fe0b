"""Compare the DDP GPT-2 runs multi-gpu.sh left in a folder (ddp-*.json)
with the run under PyTorch's own allocator (ddp-native.json), rank by rank:
losses bit for bit, median step time (within --tolerance, default 2%), and
peak reserved of each device (equal to PyTorch's for the caching policy,
reported for the others).

    python3 compare_ddp.py RESULTS_DIR [--tolerance 0.02]

Prints a table and one "ok"/"FAIL" line per check; exits 1 on any failure.
"""

import argparse
import glob
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()
    runs = {}
    for path in sorted(glob.glob(os.path.join(a.dir, "ddp-*.json"))):
        with open(path) as f:
            runs[os.path.basename(path)[4:-5]] = json.load(f)
    if "native" not in runs:
        print("compare_ddp: no ddp-native.json in %s" % a.dir)
        return 1
    native = {r["rank"]: r for r in runs["native"]["ranks"]}
    bad = 0
    print("%-16s %4s %6s %8s %11s %10s %16s %16s" % (
        "run", "rank", "device", "losses", "median ms", "vs native", "peak reserved", "native peak"))
    for name, run in runs.items():
        caching = "caching" in name or "pytorch" in name
        for r in run["ranks"]:
            ref = native.get(r["rank"])
            if ref is None:
                print("FAIL - %s: rank %d has no native run" % (name, r["rank"]))
                bad += 1
                continue
            same = r["losses_hex"] == ref["losses_hex"]
            ratio = r["median_step_ms"] / ref["median_step_ms"] - 1.0
            print("%-16s %4d %6d %8s %11.3f %+9.2f%% %16d %16d" % (
                name, r["rank"], r["device"], "same" if same else "DIFFER", r["median_step_ms"],
                100 * ratio, r["peak_reserved"], ref["peak_reserved"]))
            if name == "native":
                continue
            checks = [(same, "%s rank %d: losses bit for bit as PyTorch's allocator" % (name, r["rank"])),
                      (ratio <= a.tolerance, "%s rank %d: median step time %+.2f%% (<= %+.0f%%)" % (
                          name, r["rank"], 100 * ratio, 100 * a.tolerance))]
            if caching:
                checks.append((r["peak_reserved"] == ref["peak_reserved"],
                               "%s rank %d: device %d's peak reserved %d = PyTorch's %d" % (
                                   name, r["rank"], r["device"], r["peak_reserved"],
                                   ref["peak_reserved"])))
            for cond, what in checks:
                print("%s - %s" % ("ok" if cond else "FAIL", what))
                bad += not cond
    print("%d failure(s)" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
