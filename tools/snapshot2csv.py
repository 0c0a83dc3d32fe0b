#!/usr/bin/env python3
"""snapshot2csv.py: convert a PyTorch memory snapshot to a gmr trace.

A memory snapshot is the pickle torch.cuda.memory._dump_snapshot() writes
after torch.cuda.memory._record_memory_history(max_entries=N) (or the one
gmr_snapshot_write writes).  Its device_traces hold the allocator's history;
this tool turns one device's history into gmr's trace CSV (RMM's replay-log
layout, docs/trace-format.md):

    Thread,Time,Action,Pointer,Size,Stream

  alloc          -> allocate, Size = the size the program requested
  free_completed -> free (the memory is reusable from then on)
  anything else  -> skipped (free_requested, segment_*, oom, snapshot)

Time is the entry's time_us; Pointer its address (an id, as in every gmr
trace); Stream the stream, renumbered 0, 1, 2... in order of appearance with
the default stream (0) kept as 0; Thread is 0 (snapshots do not say).

When the ring buffer was too small, the history starts in the middle of the
run: frees of addresses with no recorded allocation say so.  They are left
out, with a warning, unless --reconstruct is given, which puts an allocation
for each of them at the start of the trace (in address order, with the size
the free reports), and also one for each block the snapshot shows allocated
that the history never allocated.

Plain python3, no third-party packages: the snapshot holds only builtin types;
a global of any other module is refused, except torch's, which are read as
inert placeholders (no torch code runs).  Never unpickle files you do not
trust with anything but this restricted reader.

--sites adds the call-site column (docs/trace-format.md): for each allocation,
the innermost frame of its recorded stack outside torch's own files, as
"file.py:LINE (function)"; it needs a snapshot recorded with stacks
(_record_memory_history(stacks="python"), gmr-record --stacks).

usage: snapshot2csv.py [-o OUT.csv] [--device N] [--reconstruct] [--sites] SNAPSHOT.pickle
"""
import argparse
import pickle
import sys

__all__ = ["load_snapshot", "convert", "main"]


class _TorchPlaceholder:
    """Stands for any torch object in a snapshot: records its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state

    def __reduce__(self):  # never pickled again
        raise TypeError("placeholder of a torch object")


class _SnapshotUnpickler(pickle.Unpickler):
    SAFE = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "tuple"),
            ("builtins", "list"), ("builtins", "dict"), ("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self.SAFE:
            return super().find_class(module, name)
        if module == "torch" or module.startswith("torch."):
            return type(name, (_TorchPlaceholder,), {"__module__": module})
        raise pickle.UnpicklingError(
            "refusing to load %s.%s: a memory snapshot holds only builtin types" % (module, name))


class SnapshotError(Exception):
    pass


def load_snapshot(path):
    """Read a snapshot pickle with the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            data = _SnapshotUnpickler(f).load()
    except OSError as e:
        raise SnapshotError("%s: %s" % (path, e.strerror or e))
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as e:
        raise SnapshotError("%s: not a readable memory snapshot pickle (%s)" % (path, e))
    if not isinstance(data, dict):
        raise SnapshotError("%s: a memory snapshot is a dict, this pickle holds a %s"
                            % (path, type(data).__name__))
    if "device_traces" not in data:
        raise SnapshotError(
            "%s: the snapshot has no device_traces: record the history before dumping it, "
            "with torch.cuda.memory._record_memory_history(max_entries=N)" % path)
    return data


def _pick_device(traces, device, warn):
    allocs = [sum(1 for e in t if e.get("action") == "alloc") for t in traces]
    if device is not None:
        if not 0 <= device < len(traces):
            raise SnapshotError("device %d: the snapshot has traces for devices 0..%d"
                                % (device, len(traces) - 1))
        return device
    busy = [d for d, n in enumerate(allocs) if n > 0]
    if not busy:
        raise SnapshotError("no device has any alloc entry: was the history recorded "
                            "(_record_memory_history) while the program allocated?")
    best = max(busy, key=lambda d: allocs[d])
    if len(busy) > 1:
        warn("devices %s have allocations; converting device %d (the most: %d); "
             "choose another with --device" % (busy, best, allocs[best]))
    return best


def site_of(frames):
    """The call site of an allocation: the innermost frame outside torch's
    own files (else the innermost) as "file.py:LINE (name)", control
    characters replaced; "" when there is no frame."""
    if not isinstance(frames, list) or not frames:
        return ""
    pick = next((f for f in frames if isinstance(f, dict)
                 and "/torch/" not in str(f.get("filename", ""))), frames[0])
    if not isinstance(pick, dict):
        return ""
    name = str(pick.get("filename", "")).rsplit("/", 1)[-1][:200]
    text = "%s:%d" % (name, int(pick.get("line", 0) or 0))
    if pick.get("name") is not None:
        text += " (%s)" % str(pick["name"])[:120]
    return "".join("?" if ord(c) < 0x20 or c == "\x7f" else c for c in text)


def convert(snapshot, out, device=None, reconstruct=False, warn=None, sites=False):
    """Write the CSV of one device's history to the text stream `out`.
    Returns a dict of counts: allocations, frees, live_at_end, peak_requested,
    unknown_frees, reconstructed, skipped (by action), device."""
    if warn is None:
        def warn(msg):
            sys.stderr.write("snapshot2csv: warning: %s\n" % msg)
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError("device_traces is not a list of lists of trace entries")
    device = _pick_device(traces, device, warn)
    trace = traces[device]

    # First pass: which frees refer to allocations the history never saw.
    seen, unknown = set(), {}
    for e in trace:
        act = e.get("action")
        if act == "alloc":
            seen.add(e["addr"])
        elif act in ("free_completed", "free"):
            a = e["addr"]
            if a in seen:
                seen.discard(a)
            elif a not in unknown:
                unknown[a] = (e["size"], e.get("stream"))

    streams = {0: 0}

    def stream_id(s):
        if s is None:
            s = 0
        if s not in streams:
            streams[s] = len(streams)
        return streams[s]

    rows, live = [], {}
    stats = {"allocations": 0, "frees": 0, "unknown_frees": 0, "reconstructed": 0,
             "skipped": {}, "device": device}
    requested = peak = 0
    t0 = trace[0].get("time_us", 0) if trace else 0

    def allocate(t, addr, size, stream, site=""):
        nonlocal requested, peak
        rows.append((t, "allocate", addr, size, stream, site))
        live[addr] = (size, stream)
        requested += size
        peak = max(peak, requested)
        stats["allocations"] += 1

    if reconstruct:
        start = dict(unknown)
        # Blocks the snapshot shows allocated that the history never allocated
        # (and does not free): live since before the history started.
        allocated_in_trace = {e["addr"] for e in trace if e.get("action") == "alloc"}
        for seg in snapshot.get("segments", []):
            if seg.get("device", device) != device:
                continue
            addr = seg["address"]
            for b in seg.get("blocks", []):
                a = b.get("address", addr)
                if b.get("state") == "active_allocated" and a not in allocated_in_trace \
                        and a not in start:
                    start[a] = (b.get("requested_size") or b["size"], seg.get("stream"))
                addr = a + b["size"]
        for a in sorted(start):
            allocate(t0, a, start[a][0], stream_id(start[a][1]))
        stats["reconstructed"] = len(start)

    for i, e in enumerate(trace):
        act = e.get("action")
        t = e.get("time_us", i)
        if act == "alloc":
            a = e["addr"]
            if a in live:  # its free was never recorded: free it here
                warn("entry %d: alloc of %#x, which is still live: a free_completed is "
                     "missing; freeing it first" % (i, a))
                size, s = live.pop(a)
                rows.append((t, "free", a, size, s, ""))
                requested -= size
                stats["frees"] += 1
            allocate(t, a, e["size"], stream_id(e.get("stream")),
                     site_of(e.get("frames")) if sites else "")
        elif act in ("free_completed", "free"):  # "free": a free_requested and completed pair
            a = e["addr"]
            if a in live:
                size, s = live.pop(a)
                rows.append((t, "free", a, size, s, ""))
                requested -= size
                stats["frees"] += 1
            else:
                stats["unknown_frees"] += 1
        else:
            stats["skipped"][act] = stats["skipped"].get(act, 0) + 1

    if stats["unknown_frees"] and not reconstruct:
        warn("%d frees of addresses the history never allocated: the ring buffer dropped the "
             "beginning of the run (record with a larger max_entries, or pass --reconstruct "
             "to allocate them at the start); those frees are left out"
             % stats["unknown_frees"])
    elif stats["unknown_frees"]:
        warn("the ring buffer dropped the beginning of the run: %d allocations made before "
             "the history starts were put at its start" % stats["reconstructed"])

    out.write("Thread,Time,Action,Pointer,Size,Stream%s\n" % (",Site" if sites else ""))
    for t, act, a, size, s, site in rows:
        out.write("0,%d,%s,%#x,%d,%d%s\n" % (t, act, a, size, s, "," + site if site else ""))
    stats["live_at_end"] = len(live)
    stats["peak_requested"] = peak
    return stats


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="snapshot2csv.py",
        description="Convert a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot, "
                    "recorded with _record_memory_history) to a gmr trace CSV.")
    ap.add_argument("snapshot", help="the snapshot pickle")
    ap.add_argument("-o", "--output", default="-", help="the CSV to write (default: stdout)")
    ap.add_argument("--device", type=int, default=None,
                    help="the device whose history to convert (default: the one with the "
                         "most allocations)")
    ap.add_argument("--reconstruct", action="store_true",
                    help="allocate at the start what was allocated before the history starts")
    ap.add_argument("--sites", action="store_true",
                    help="add the call-site column from the recorded stacks")
    ap.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    args = ap.parse_args(argv)
    try:
        snap = load_snapshot(args.snapshot)
        if args.output == "-":
            stats = convert(snap, sys.stdout, args.device, args.reconstruct, sites=args.sites)
        else:
            with open(args.output, "w") as out:
                stats = convert(snap, out, args.device, args.reconstruct, sites=args.sites)
    except SnapshotError as e:
        sys.stderr.write("snapshot2csv: %s\n" % e)
        return 1
    except OSError as e:
        sys.stderr.write("snapshot2csv: %s: %s\n" % (args.output, e.strerror or e))
        return 1
    if not args.quiet:
        sys.stderr.write(
            "snapshot2csv: device %d: %d allocations, %d frees, %d live at the end, "
            "peak requested %d bytes%s\n"
            % (stats["device"], stats["allocations"], stats["frees"], stats["live_at_end"],
               stats["peak_requested"],
               "" if args.output == "-" else "; wrote " + args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
