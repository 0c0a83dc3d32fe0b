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

The conversion is libgmr's (gmr_snapshot_csv, through the gmr package in
python/, which gmr_trace_read shares its pickle reader with): it runs nothing
from the pickle; a global of any module but torch and the builtin containers
is refused, and torch's are read as inert placeholders (no torch code runs).
This file finds the gmr package installed, else in the source tree beside
it (with that tree's lib/.libs/libgmr.so unless GMR_LIBRARY names one).

--sites adds the call-site column (docs/trace-format.md): for each allocation,
the innermost frame of its recorded stack outside torch's own files, as
"file.py:LINE (function)"; it needs a snapshot recorded with stacks
(_record_memory_history(stacks="python"), gmr-record --stacks).

usage: snapshot2csv.py [-o OUT.csv] [--device N] [--reconstruct] [--sites] SNAPSHOT.pickle
"""
import argparse
import os
import sys

__all__ = ["load_snapshot", "convert", "main"]


def _gmr():
    """The gmr package: installed, else the source tree's python/gmr with
    the tree's libgmr (unless GMR_LIBRARY says which)."""
    try:
        import gmr
        return gmr
    except ImportError:
        pass
    here = os.path.dirname(os.path.realpath(__file__))
    tree = os.path.join(here, os.pardir, "python")
    lib = os.path.join(here, os.pardir, "lib", ".libs", "libgmr.so")
    if not os.path.isdir(os.path.join(tree, "gmr")):
        raise SnapshotError("the gmr Python package was not found (pip install gmr-runtime, "
                            "or run this file from gmr's source tree)")
    sys.path.insert(0, tree)
    if os.path.isfile(lib):
        os.environ.setdefault("GMR_LIBRARY", lib)
    import gmr
    return gmr


class SnapshotError(Exception):
    pass


class Snapshot:
    """A snapshot pickle's bytes and the path they were read from."""

    def __init__(self, path, data):
        self.path, self.data = path, data


def load_snapshot(path):
    """Read a snapshot pickle (libgmr reads it at convert())."""
    try:
        with open(path, "rb") as f:
            return Snapshot(path, f.read())
    except OSError as e:
        raise SnapshotError("%s: %s" % (path, e.strerror or e))


def convert(snapshot, out, device=None, reconstruct=False, warn=None, sites=False):
    """Write the CSV of one device's history to the text stream `out`.
    Returns a dict of counts: allocations, frees, live_at_end, peak_requested,
    unknown_frees, reconstructed, device."""
    if warn is None:
        def warn(msg):
            sys.stderr.write("snapshot2csv: warning: %s\n" % msg)
    try:
        csv, warnings, stats = _gmr().snapshot_to_csv(snapshot.data, snapshot.path, device,
                                                      reconstruct, sites)
    except (ValueError, MemoryError, OSError) as e:
        raise SnapshotError(str(e))
    for w in warnings:
        warn(w)
    out.write(csv)
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
