#!/usr/bin/env python3
"""sweep-svg.py: draw gmr-bench's live-blocks sweep as an SVG picture.

    gmr-bench --workloads sweep --json-file sweep.json CONFIG...
    scripts/sweep-svg.py sweep.json [more.json ...] OUT.svg ["simulated device, 2-core build host"]

Reads the "sweep" records of one or more gmr-bench JSON files
(docs/benchmarks.md: the arguments ending in .json; the one ending in .svg
is the picture, any other the line under the title) and writes one line per
contender: ns per operation (an alloc or a free) against the number of live
blocks, both axes logarithmic, with the growth (largest figure over the
first) and the cost added from the fewest to the most live blocks in the
legend.  Standard library only.
"""
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]


def main():
    ins = [a for a in sys.argv[1:] if a.endswith(".json")]
    outs = [a for a in sys.argv[1:] if a.endswith(".svg")]
    rest = [a for a in sys.argv[1:] if a not in ins and a not in outs]
    if not ins or len(outs) != 1 or len(rest) > 1:
        sys.exit("usage: " + __doc__.strip().splitlines()[3].strip())
    rows = [r for f in ins for r in json.load(open(f)) if r.get("workload") == "sweep"]
    if not rows:
        sys.exit("sweep-svg.py: %s: no sweep records (gmr-bench --workloads sweep)" % ", ".join(ins))
    where = rest[0] if rest else rows[0]["backend"] + " device"
    labels = [legend(r) for r in rows]
    W, H, L, T, B = 760, 440, 70, 50, 50
    R = max(250, 50 + int(6.3 * max(len(t) for t in labels)))  # the legend: ~6.3 px a character
    W += R - 250
    xs = sorted({p["live_blocks"] for r in rows for p in r["points"]})
    ys = [p["ns_per_op"] for r in rows for p in r["points"] if p["ns_per_op"] > 0]
    x0, x1 = math.log10(xs[0]), math.log10(xs[-1]) if xs[-1] > xs[0] else math.log10(xs[0]) + 1
    y0 = math.floor(math.log10(min(ys)))
    y1 = math.ceil(math.log10(max(ys)))
    if y1 == y0:
        y1 += 1

    def px(x):
        return L + (math.log10(x) - x0) / (x1 - x0) * (W - L - R)

    def py(y):
        return H - B - (math.log10(y) - y0) / (y1 - y0) * (H - T - B)

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14" font-weight="bold">gmr-bench live-blocks sweep: '
         'cost per operation against live blocks</text>' % L,
         '<text x="%d" y="38" fill="#555">%s; sizes log-uniform %d B to %s, one thread, median '
         'of %d</text>' % (L, where, rows[0]["size_min"], human(rows[0]["size_max"]), rows[0]["reps"])]
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y, W - R, y))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%s ns</text>' % (L - 6, y + 4, fmt(10 ** e)))
    for x in xs:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (px(x), T, px(x), H - B))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (px(x), H - B + 16, fmt(x)))
    o.append('<text x="%d" y="%d" text-anchor="middle">live blocks</text>' % ((L + W - R) // 2, H - 12))
    o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>'
             % (L, T, W - L - R, H - T - B))
    for k, r in enumerate(rows):
        c = COLORS[k % len(COLORS)]
        pts = [(p["live_blocks"], p["ns_per_op"]) for p in r["points"] if p["ns_per_op"] > 0]
        o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                 % (c, " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in pts)))
        for x, y in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(x), py(y), c))
        ly = T + 14 + 18 * k
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                 % (W - R + 12, ly - 4, W - R + 32, ly - 4, c))
        o.append('<text x="%d" y="%d">%s</text>' % (W - R + 38, ly, esc(labels[k])))
    o.append("</svg>")
    open(outs[0], "w").write("\n".join(o) + "\n")


def legend(r):
    """contender (policy): growth, +ns added from the first point to the last."""
    p = [q["ns_per_op"] for q in r["points"]]
    return "%s (%s): %.2fx, %+.0f ns" % (r["contender"], r["policy"], r["growth"], p[-1] - p[0])


def fmt(v):
    return "%g" % v if v < 1e4 else "{:,}".format(int(v))


def human(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return "%g %s" % (b, unit)
        b /= 1024.0


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


if __name__ == "__main__":
    main()
