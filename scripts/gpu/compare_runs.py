"""Compare the GPT-2 runs that run.sh left in a folder: losses bit for bit
against the native run, step times against the native run, and each gmr
run's peak reserved against its replay on the simulator (and PyTorch's own).

    python3 compare_runs.py RESULTS_DIR
"""

import glob
import json
import os
import sys


def main():
    d = sys.argv[1]
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "gpt2-*.json"))):
        with open(path) as f:
            runs[os.path.basename(path)[5:-5]] = json.load(f)
    native = [k for k in runs if k.startswith("native")]
    if not native:
        print("compare_runs: no native run in %s" % d)
        return 1
    # Each run is compared with the native run of the same length (the
    # earlier steps of a longer run must match too).
    by_len = {}
    for k in sorted(native, key=lambda k: k != "native"):  # PyTorch's defaults first
        by_len.setdefault(len(runs[k]["losses_hex"]), runs[k])
    bad = 0
    print("%-22s %-6s %-8s %14s %16s %16s %12s" % ("run", "steps", "losses", "median ms", "vs native",
                                              "peak reserved", "replay"))
    for name, r in runs.items():
        n = len(r["losses_hex"])
        ref = by_len.get(n) or runs[native[0]]
        longest = max((runs[k] for k in native), key=lambda x: len(x["losses_hex"]))
        same = r["losses_hex"] == ref["losses_hex"] and \
            r["losses_hex"] == longest["losses_hex"][:n]
        bad += not same
        ratio = r["median_step_ms"] / ref["median_step_ms"] - 1.0
        replay = "-"
        rp = os.path.join(d, "replay-%s.json" % name.split("-")[0])
        if r["allocator"] == "gmr" and os.path.exists(rp):
            with open(rp) as f:
                rr = json.load(f)
            if rr["peak_reserved"] == r["peak_reserved"]:
                replay = "equal"
            elif r.get("gmr_policy") == "stitch":
                # The stitch policy declines to remap a range while the
                # device may still use it (an event query): on the GPU its
                # choices follow the device's progress, which the
                # simulator's replay (every free complete at once) does
                # not model, so only the replay's own ratio is checked.
                replay = "%+.3f%% (timed)" % (100.0 * (r["peak_reserved"] / rr["peak_reserved"] - 1))
                bad += rr["peak_reserved"] > 1.02 * r["peak_requested"]
            else:
                replay = "DIFFERS (%d)" % rr["peak_reserved"]
                bad += 1
        print("%-22s %-6d %-8s %14.3f %+15.2f%% %16d %12s" % (
            name, n, "same" if same else "DIFFER", r["median_step_ms"], 100 * ratio,
            r["peak_reserved"], replay))
    print("native peak reserved (torch.cuda.max_memory_reserved): %s" %
          sorted({runs[k]["peak_reserved"] for k in native}))
    # The stitch policy: device memory mapped at the peak against what was
    # requested and against PyTorch's expandable segments in the same batch.
    exp = [runs[k] for k in runs if k.startswith("native-expandable")]
    for name, r in runs.items():
        if "map_calls_per_step" not in r:
            continue
        line = "%s: peak mapped %d / peak requested %d = %.4f" % (
            name, r["peak_reserved"], r["peak_requested"], r["peak_reserved_over_requested"])
        if exp:
            e = exp[0]
            line += "; native expandable reserved %d (%.4f of its requested)" % (
                e["peak_reserved"], e["peak_reserved"] / max(1, e.get("peak_requested", 0) or 1))
            line += "; stitch below expandable: %s" % (r["peak_reserved"] < e["peak_reserved"])
        print(line)
        print("%s: map calls per step %s; after warm-up %s; time mapping %.1f ms in all" % (
            name, r["map_calls_per_step"], r["map_calls_per_step_after_warmup"],
            r.get("stitch_map_ms", 0.0)))
    print("%d mismatch(es)" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
