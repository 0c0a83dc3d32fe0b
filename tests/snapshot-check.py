#!/usr/bin/env python3
"""snapshot-check.py: check a gmr memory snapshot (gmr_snapshot_write) with
plain python3, for tests/snapshot.c.

usage: snapshot-check.py SNAPSHOT.pickle EXPECT.txt

Prints one line per check, "ok DESCRIPTION" or "not ok DESCRIPTION", with
"# ..." lines of detail after a failure; tests/snapshot.c relays them as TAP.

Two kinds of checks:
 - the format, whatever the scenario: the opcodes are protocol 2 and among
   those PyTorch's MemoryViz.js unpickler reads; the top-level keys; segments
   sorted by address; total_size = sum of block sizes; allocated_size,
   active_size and requested_size as PyTorch defines them; blocks contiguous
   from the segment's address; block states; trace entry keys and times that
   never go back; and the history replayed in order (an address is allocated
   only when not live and inside a live segment, freed only when live;
   segments never overlap) unless the ring dropped entries;
 - the scenario, from EXPECT.txt, written by the C test from the pointers and
   sizes it used, one record a line:
     segments N
     segment ADDR TOTAL ALLOCATED ACTIVE REQUESTED STREAM TYPE EXPANDABLE NBLOCKS
     block ADDR SIZE REQUESTED STATE
     traces DEVICE N              (entries of device DEVICE, N < 0: any number;
                                   the other devices' lists empty)
     trace ACTION ADDR SIZE STREAM [DT_US]  (DT_US: time since the first entry)
     count ACTION N               (entries with that action)
     setting KEY VALUE
     frames ACTION N              (entries with that action that carry frames)
     entryframe I FILE LINE NAME  (entry I, from 0, has that one frame; FILE
     blockframe ADDR FILE LINE NAME   "none": no frames; NAME "-": "")
     segframe ADDR FILE LINE NAME
   Numbers are decimal; ADDR of an oom entry is its device_free.
"""
import pickle
import pickletools
import sys

# The opcodes the unpickler inside PyTorch's MemoryViz.js understands.
JS_OPCODES = {
    "PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "SETITEM", "DICT", "EMPTY_LIST",
    "APPEND", "APPENDS", "LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "NEWTRUE", "NEWFALSE", "NONE", "BININT", "BININT1", "BININT2", "LONG1", "BINUNICODE",
    "SHORT_BINUNICODE", "BINFLOAT", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "MEMOIZE", "FRAME",
}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}

failures = 0


def frames_ok(fr):
    """Frames as PyTorch writes them: a list of {"name", "filename", "line"}."""
    return isinstance(fr, list) and all(
        isinstance(f, dict) and sorted(f) == ["filename", "line", "name"] and
        isinstance(f["name"], str) and isinstance(f["filename"], str) and
        isinstance(f["line"], int) for f in fr)


def check(cond, desc, *detail):
    global failures
    print(("ok " if cond else "not ok ") + desc)
    if not cond:
        failures += 1
        for d in detail:
            print("# " + str(d))
    return cond


def check_format(raw, snap):
    ops = [op.name for op, _, _ in pickletools.genops(raw)]
    bad = sorted(set(ops) - JS_OPCODES)
    check(not bad, "pickle uses only opcodes MemoryViz.js reads", "unknown to it: %s" % bad)
    check(raw[:2] == b"\x80\x02", "pickle is protocol 2", raw[:2])
    check(isinstance(snap, dict) and sorted(snap) == sorted(
        ["segments", "device_traces", "allocator_settings", "external_annotations"]),
          "top-level keys are PyTorch's", sorted(snap) if isinstance(snap, dict) else type(snap))
    check(snap.get("external_annotations") == [], "external_annotations is []")
    check(isinstance(snap.get("allocator_settings"), dict), "allocator_settings is a dict")

    segs = snap["segments"]
    addrs = [s["address"] for s in segs]
    check(addrs == sorted(addrs), "segments are sorted by address", addrs)
    seg_keys = ["device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"]
    blk_keys = ["address", "size", "requested_size", "state", "frames"]
    keys_ok = sums_ok = contiguous = states_ok = True
    why = []
    for s in segs:
        if sorted(s) != sorted(seg_keys) or not frames_ok(s["frames"]):
            keys_ok = False
            why.append("segment keys %s" % sorted(s))
        blocks = s["blocks"]
        for b in blocks:
            if sorted(b) != sorted(blk_keys) or not frames_ok(b["frames"]) or \
                    (b["state"] == "inactive" and b["frames"] != []):
                keys_ok = False
                why.append("block keys %s" % sorted(b))
            if b["state"] not in STATES:
                states_ok = False
                why.append("state %r" % b["state"])
        active = [b for b in blocks if b["state"] != "inactive"]
        want = (sum(b["size"] for b in blocks),
                sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                sum(b["size"] for b in active), sum(b["requested_size"] for b in active))
        got = (s["total_size"], s["allocated_size"], s["active_size"], s["requested_size"])
        if want != got or not blocks:
            sums_ok = False
            why.append("segment %#x: (total, allocated, active, requested) = %s, blocks say %s"
                       % (s["address"], got, want))
        a = s["address"]
        for b in blocks:
            if b["address"] != a:
                contiguous = False
                why.append("segment %#x: block at %#x, expected %#x" % (s["address"],
                                                                       b["address"], a))
            a += b["size"]
    check(keys_ok, "segments and blocks have PyTorch's keys", *why[:5])
    check(sums_ok, "total/allocated/active/requested sizes are the sums over blocks", *why[:5])
    check(contiguous, "blocks tile each segment from its address", *why[:5])
    check(states_ok, "block states are active_allocated/active_pending_free/inactive", *why[:5])
    for i in range(1, len(segs)):
        p = segs[i - 1]
        if p["address"] + p["total_size"] > segs[i]["address"]:
            check(False, "segments do not overlap", "%#x" % segs[i]["address"])
            break
    else:
        check(True, "segments do not overlap")

    traces = snap["device_traces"]
    check(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
          "device_traces is a list of lists")
    keys_ok, times_ok, why = True, True, []
    for t in traces:
        last = 0
        for e in t:
            k = set(e)
            want = {"action", "size", "stream", "time_us", "frames", "compile_context",
                    "user_metadata", "device_free" if e.get("action") == "oom" else "addr"}
            if k != want or e["action"] not in ACTIONS or not frames_ok(e["frames"]) or \
                    e["compile_context"] != "N/A" or e["user_metadata"] != "":
                keys_ok = False
                why.append(str(e))
            if e["time_us"] < last:
                times_ok = False
            last = e["time_us"]
    check(keys_ok, "trace entries have PyTorch's keys and actions", *why[:5])
    check(times_ok, "trace times never go back")
    return traces


def replay(trace, dropped):
    """Replay the history: every step must be possible in that order."""
    live = {}      # block address -> [size, free_requested]
    segs = {}      # segment range address -> size
    problems = []

    def in_segment(a):
        return any(s <= a < s + n for s, n in segs.items())

    for i, e in enumerate(trace):
        act, a, n = e["action"], e.get("addr"), e["size"]
        if act == "alloc":
            if a in live:
                problems.append("%d: alloc of live %#x" % (i, a))
            if not dropped and not in_segment(a):
                problems.append("%d: alloc %#x outside every segment" % (i, a))
            live[a] = [n, False]
        elif act == "free_requested":
            if a in live:
                if live[a][1]:
                    problems.append("%d: second free_requested of %#x" % (i, a))
                live[a][1] = True
            elif not dropped:
                problems.append("%d: free_requested of %#x, not live" % (i, a))
        elif act == "free_completed":
            if a in live:
                if not live[a][1]:
                    problems.append("%d: free_completed of %#x before free_requested" % (i, a))
                if live[a][0] != n:
                    problems.append("%d: free of %#x with size %d, allocated %d" % (
                        i, a, n, live[a][0]))
                del live[a]
            elif not dropped:
                problems.append("%d: free_completed of %#x, not live" % (i, a))
        elif act in ("segment_alloc", "segment_map"):
            for s, m in segs.items():
                if s < a + n and a < s + m:
                    problems.append("%d: %s [%#x, +%d) overlaps [%#x, +%d)" % (i, act, a, n, s, m))
            segs[a] = n
        elif act in ("segment_free", "segment_unmap"):
            if a in segs and segs[a] == n:
                if any(a <= b < a + n for b in live):
                    problems.append("%d: %s of %#x with live blocks" % (i, act, a))
                del segs[a]
            elif not dropped:
                problems.append("%d: %s of %#x (+%d), not a live range" % (i, act, a, n))
    return problems


def check_expect(snap, expect):
    segs = snap["segments"]
    want_segs, want_blocks = [], []
    for rec in expect:
        if rec[0] == "segments":
            check(len(segs) == int(rec[1]), "%s segments" % rec[1], "got %d" % len(segs))
        elif rec[0] == "segment":
            want_segs.append(rec)
            want_blocks.append([])
        elif rec[0] == "block":
            want_blocks[-1].append(rec)
    for i, (rec, blocks) in enumerate(zip(want_segs, want_blocks)):
        if i >= len(segs):
            break
        s = segs[i]
        got = (s["address"], s["total_size"], s["allocated_size"], s["active_size"],
               s["requested_size"], s["stream"], s["segment_type"], int(s["is_expandable"]),
               len(s["blocks"]))
        want = tuple(int(x) for x in rec[1:7]) + (rec[7], int(rec[8]), int(rec[9]))
        check(got == want, "segment %d: address %#x, total %s, allocated %s, active %s, "
              "requested %s, stream %s, %s, expandable %s, %s blocks" % (
                  i, int(rec[1]), *rec[2:]), "got  %s" % (got,), "want %s" % (want,))
        gotb = [(b["address"], b["size"], b["requested_size"], b["state"]) for b in s["blocks"]]
        wantb = [(int(b[1]), int(b[2]), int(b[3]), b[4]) for b in blocks]
        check(gotb == wantb, "segment %d: blocks (address, size, requested, state)" % i,
              "got  %s" % gotb, "want %s" % wantb)

    traces = snap["device_traces"]
    want_trace, device = None, None
    for rec in expect:
        if rec[0] == "traces":
            device, n = int(rec[1]), int(rec[2])
            check(len(traces) == device + 1, "device_traces has %d lists" % (device + 1),
                  "got %d" % len(traces))
            check(all(not t for j, t in enumerate(traces) if j != device),
                  "only device %d has entries" % device)
            got_n = len(traces[device]) if device < len(traces) else -1
            if n >= 0:  # -1: any number
                check(got_n == n, "device %d: %d trace entries" % (device, n), "got %d" % got_n)
            want_trace = []
        elif rec[0] == "trace":
            want_trace.append(rec[1:])
        elif rec[0] == "count":
            t = traces[device] if device is not None and device < len(traces) else []
            got_n = sum(1 for e in t if e["action"] == rec[1])
            check(got_n == int(rec[2]), "%s %s entries" % (rec[2], rec[1]), "got %d" % got_n)
        elif rec[0] == "frames":
            t = traces[device] if device is not None and device < len(traces) else []
            got_n = sum(1 for e in t if e["action"] == rec[1] and e["frames"])
            check(got_n == int(rec[2]), "%s %s entries carry frames" % (rec[2], rec[1]),
                  "got %d" % got_n)
        elif rec[0] in ("entryframe", "blockframe", "segframe"):
            if rec[0] == "entryframe":
                t = traces[device] if device is not None and device < len(traces) else []
                item = t[int(rec[1])] if int(rec[1]) < len(t) else None
            elif rec[0] == "blockframe":
                item = next((b for x in segs for b in x["blocks"] if b["address"] == int(rec[1])),
                            None)
            else:
                item = next((x for x in segs if x["address"] == int(rec[1])), None)
            want = [] if rec[2] == "none" else [
                {"filename": rec[2], "line": int(rec[3]), "name": "" if rec[4] == "-" else rec[4]}]
            got = item["frames"] if item is not None else None
            check(got == want, "%s %s: frames %s" % (rec[0], rec[1], want), "got %s" % (got,))
        elif rec[0] == "setting":
            v = snap["allocator_settings"].get(rec[1])
            check(str(v) == rec[2], "allocator_settings[%s] = %s" % (rec[1], rec[2]),
                  "got %r" % (v,))
    if want_trace:
        t = traces[device]
        t0 = t[0]["time_us"] if t else 0
        got = []
        for e, w in zip(t, want_trace):
            g = [e["action"], str(e["device_free"] if e["action"] == "oom" else e["addr"]),
                 str(e["size"]), str(e["stream"])]
            if len(w) > 4:
                g.append(str(e["time_us"] - t0))
            got.append(g)
        want = [list(w) for w in want_trace]
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        check(got == want, "trace entries in order: action, address, size, stream, time",
              *["entry %d: got %s, want %s" % (i, got[i], want[i]) for i in bad[:6]])


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: snapshot-check.py SNAPSHOT.pickle EXPECT.txt\n")
        return 2
    with open(sys.argv[1], "rb") as f:
        raw = f.read()
    try:
        snap = pickle.loads(raw)
    except Exception as e:  # the check itself reports it
        check(False, "the snapshot unpickles", repr(e))
        return 1
    check(True, "the snapshot unpickles with plain python3")
    traces = check_format(raw, snap)
    dropped = snap["allocator_settings"].get("gmr_history_dropped", 0)
    for d, t in enumerate(traces):
        problems = replay(t, dropped)
        check(not problems, "device %d: the history replays in order" % d, *problems[:8])
    with open(sys.argv[2]) as f:
        expect = [line.split() for line in f if line.strip() and not line.startswith("#")]
    check_expect(snap, expect)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
