#!/usr/bin/env python3
"""trace2rmm.py: write a gmr trace as RMM's logging_resource_adaptor writes its log.

RMM's adaptor (rmm/mr/logging_resource_adaptor, cpp/src/mr/detail/
logging_resource_adaptor_impl.cpp) writes the header
"Thread,Time,Action,Pointer,Size,Stream", then one line per call with the
logger pattern "%t,%H:%M:%S.%f," followed by "allocate,%p,%zu,STREAM" or
"free,%p,%zu,STREAM": the OS thread id in decimal, the wall-clock time of day
with microseconds, the pointer as printf's %p prints it, the size in bytes and
the stream as a C++ ostream prints a cudaStream_t ("0" for the default
stream, "0x..." otherwise).  A failed allocation is "allocate failure" with a
null pointer.

This turns a gmr trace into such a log, event for event: record_stream and
empty_cache, which RMM does not log, are left out (there are none in the
shipped traces); the time of day is the trace's microseconds since the epoch,
in UTC; every event gets the same thread id.  It made
tests/fixtures/resnet50_train.rmm.csv from traces/resnet50_train.csv:

    scripts/trace2rmm.py traces/resnet50_train.csv > tests/fixtures/resnet50_train.rmm.csv

usage: trace2rmm.py [--thread ID] TRACE.csv > LOG.csv
"""
import argparse
import csv
import sys


def stream_text(s):
    """A cudaStream_t as `std::hex << stream` prints it: 0 alone, else 0x..."""
    return "0" if s == 0 else "%#x" % (0x7f3a5c000000 + 0x10 * s)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a gmr trace as an RMM logging_resource_adaptor log.")
    ap.add_argument("trace")
    ap.add_argument("--thread", type=int, default=140120123451136,
                    help="the OS thread id to write (default: %(default)d)")
    args = ap.parse_args(argv)
    out = sys.stdout
    out.write("Thread,Time,Action,Pointer,Size,Stream\n")
    with open(args.trace, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].startswith("#") or row[0] == "Thread":
                continue
            _, t, action, ptr, size, stream = row[:6]
            if action not in ("allocate", "free"):
                continue
            us = int(t) % 86_400_000_000
            clock = "%02d:%02d:%02d.%06d" % (us // 3_600_000_000, us // 60_000_000 % 60,
                                             us // 1_000_000 % 60, us % 1_000_000)
            out.write("%d,%s,%s,%#x,%d,%s\n" % (args.thread, clock, action, int(ptr, 0),
                                                int(size), stream_text(int(stream, 0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
