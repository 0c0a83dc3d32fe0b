#!/usr/bin/env python3
"""check-layers.py: fail on a cycle between the C files of gmr, or on an
arrow that points up the layers.

Three graphs are built over the files of the source tree (include/, lib/,
policies/, tools/, tests/):

  includes  a -> b  when a has `#include "b"` (quoted includes only, resolved
            the way the Makefile's -I flags do: the including file's folder,
            then include/, lib/, policies/, tools/, the top folder);
  calls     a.c -> b.c  when the object built from a.c has an undefined
            symbol that the object built from b.c defines (nm on the objects
            of the build folder; a symbol defined by several files is
            resolved inside the caller's folder first, then lib/ and
            policies/, else left out);
  modules   the two above with x.c and x.h of one folder as one node: a
            circle that goes through a header and its source.  Reported, not
            failed: a header shared by several sources (one declaring the
            functions of two files) makes circles here that no file has.

Layers.  Each folder has a rank (RANKS below, docs/design.md "The tree"):

  include 0   lib/core 0   lib/backend 1   lib/observe 2   policies 3
  lib/runtime 4   lib/replay 5   lib/adapters 5   tools 6   tests 7

An include or a call from a file to a file of a higher rank fails: the base
never reaches up into what is built on it.  The public headers (include/)
are rank 0: every layer may include them, and they include nothing of ours.
Inside one rank anything goes, as long as it makes no cycle.

Any cycle in the includes or calls graph fails, except one listed in
scripts/layers-known-cycles.txt (a cycle being removed on another line of
work): it is reported as TODO, and a listed cycle that is gone fails until its
line is deleted, so the list only shrinks.

Calls to the symbols an interposer defines in place of another library's
(lib/adapters/interpose.c: cudaMalloc, cuMemAlloc...; every symbol not named
gmr*) are calls to that library, not to the interposer: cuda.c calls CUDA.

Object files are needed for the call graph: run it after `make`; with no
objects found it says so and checks the include graphs only
(`--require-objects` makes that a failure).

Usage: check-layers.py [--srcdir DIR] [--builddir DIR] [--tap] [--graph]
               [--require-objects]
  --tap    write the result as a TAP stream (for `make check`)
  --graph  print the edges of the module graph (for docs and reviews)
Exit status: 0 no cycle and no upward arrow, 1 either (each printed), 2 bad
usage.
"""

import argparse
import os
import re
import subprocess
import sys

SOURCE_DIRS = ("include", "lib", "policies", "tools", "tests")
INTERPOSERS = ("lib/adapters/interpose.c",)
KNOWN_CYCLES = "scripts/layers-known-cycles.txt"
# The longest matching folder prefix gives a file's rank.
RANKS = (
    ("include/", 0),
    ("lib/core/", 0),
    ("lib/backend/", 1),
    ("lib/observe/", 2),
    ("policies/", 3),
    ("lib/runtime/", 4),
    ("lib/replay/", 5),
    ("lib/adapters/", 5),
    ("tools/", 6),
    ("tests/", 7),
)
SEARCH_DIRS = ("include", "lib", "policies", "tools", ".")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def source_files(srcdir):
    out = []
    for top in SOURCE_DIRS:
        root = os.path.join(srcdir, top)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("fixtures", ".libs", ".deps"))
            for name in sorted(filenames):
                if name.endswith((".c", ".h")):
                    out.append(os.path.relpath(os.path.join(dirpath, name), srcdir))
    return out


def include_graph(srcdir, files):
    known = set(files)
    graph = {f: set() for f in files}
    for f in files:
        with open(os.path.join(srcdir, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE_RE.findall(text):
            for base in (os.path.dirname(f),) + SEARCH_DIRS:
                cand = os.path.normpath(os.path.join(base, inc))
                if cand in known:
                    if cand != f:
                        graph[f].add(cand)
                    break
    return graph


def object_source(obj_rel, sources_by_dir):
    """The source file an Automake object was built from, or None."""
    d, name = os.path.split(obj_rel)
    if os.path.basename(d) == ".libs":
        d = os.path.dirname(d)
    stem = name[:-2]
    cands = sources_by_dir.get(d, {})
    if stem in cands:
        return cands[stem]
    # Automake prefixes per-target objects: <target>-<stem>.o
    parts = stem.split("-")
    for i in range(1, len(parts)):
        s = "-".join(parts[i:])
        if s in cands:
            return cands[s]
    return None


def nm_symbols(path):
    try:
        res = subprocess.run(["nm", "-P", "-g", path], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return set(), set()
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        sym, kind = f[0], f[1]
        if kind == "U":
            undefined.add(sym)
        elif kind in "TDBRVWCtdbr":
            defined.add(sym)
    return defined, undefined


def call_graph(builddir, files):
    sources_by_dir = {}
    for f in files:
        if f.endswith(".c"):
            sources_by_dir.setdefault(os.path.dirname(f), {})[os.path.basename(f)[:-2]] = f
    defs, undefs = {}, {}
    n_objects = 0
    for top in SOURCE_DIRS:
        root = os.path.join(builddir, top)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".o"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), builddir)
                src = object_source(rel, sources_by_dir)
                if src is None:
                    continue
                n_objects += 1
                d, u = nm_symbols(os.path.join(builddir, rel))
                for sym in d:
                    if src in INTERPOSERS and not sym.startswith("gmr"):
                        continue  # another library's symbol, defined in its place
                    defs.setdefault(sym, set()).add(src)
                undefs.setdefault(src, set()).update(u)
    graph = {f: set() for f in files if f.endswith(".c")}
    for src, syms in undefs.items():
        for sym in syms:
            owners = defs.get(sym, set()) - {src}
            if not owners:
                continue
            if len(owners) > 1:
                near = {o for o in owners if os.path.dirname(o) == os.path.dirname(src)}
                if len(near) != 1:
                    near = {o for o in owners if o.startswith(("lib/", "policies/"))}
                if len(near) != 1:
                    continue
                owners = near
            graph[src].update(owners)
    return graph, n_objects


def rank_of(f):
    """(rank, folder) of a file, by the longest folder of RANKS it is in;
    (None, None) for a file outside every ranked folder."""
    best = (None, None)
    for folder, rank in RANKS:
        if f.startswith(folder) and (best[1] is None or len(folder) > len(best[1])):
            best = (rank, folder)
    return best


def upward_arrows(graph):
    """[(a, b)]: the edges a -> b where b's layer is above a's."""
    out = []
    for a in sorted(graph):
        ra, _ = rank_of(a)
        for b in sorted(graph[a]):
            rb, _ = rank_of(b)
            if ra is not None and rb is not None and rb > ra:
                out.append((a, b))
    return out


def module_of(f):
    return f[:-2] if f.endswith((".c", ".h")) else f


def module_graph(*graphs):
    g = {}
    for graph in graphs:
        for a, bs in graph.items():
            ma = module_of(a)
            g.setdefault(ma, set())
            for b in bs:
                mb = module_of(b)
                g.setdefault(mb, set())
                if ma != mb:
                    g[ma].add(mb)
    return g


def cycles(graph):
    """The strongly connected components with more than one node (Tarjan),
    each with one cycle through it as an example."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def strongconnect(v):
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [(c, example_cycle(graph, c)) for c in sorted(comps)]


def example_cycle(graph, comp):
    members = set(comp)
    start = comp[0]
    # breadth-first from start back to start inside the component
    prev = {}
    queue = [start]
    seen = {start}
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in seen:
                seen.add(w)
                prev[w] = v
                queue.append(w)
    return comp


def main():
    ap = argparse.ArgumentParser(description="Fail on a cycle of includes or calls between files.")
    ap.add_argument("--srcdir", default=".")
    ap.add_argument("--builddir", default=None)
    ap.add_argument("--tap", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--require-objects", action="store_true")
    args = ap.parse_args()
    srcdir = args.srcdir
    builddir = args.builddir or srcdir
    if not os.path.isdir(os.path.join(srcdir, "lib")):
        print("check-layers.py: %s is not gmr's source folder (no lib/)" % srcdir, file=sys.stderr)
        return 2

    files = source_files(srcdir)
    inc = include_graph(srcdir, files)
    calls, n_objects = call_graph(builddir, files)
    mods = module_graph(inc, calls)
    results = [("includes", inc), ("calls", calls)]

    if args.graph:
        for a in sorted(mods):
            for b in sorted(mods[a]):
                print("%s -> %s" % (a, b))

    known = read_known(os.path.join(srcdir, KNOWN_CYCLES))
    failed = False
    lines = []
    n = 0

    def report(ok, desc):
        nonlocal n, failed
        n += 1
        if not ok and "# TODO" not in desc:
            failed = True
        if args.tap:
            lines.append("%s %d - %s" % ("ok" if ok else "not ok", n, desc))
        else:
            lines.append("%s: %s" % ("ok" if ok else ("todo" if "# TODO" in desc else "FAIL"), desc))

    for name, graph in results:
        n_edges = sum(len(v) for v in graph.values())
        unknown = 0
        seen_known = set()
        for comp, path in cycles(graph):
            key = (name, tuple(comp))
            desc = "a cycle in the %s graph: %s" % (name, " -> ".join(path))
            if len(comp) > len(path) - 1:
                desc += " (the whole circle: %s)" % ", ".join(comp)
            if key in known:
                seen_known.add(key)
                desc += " # TODO listed in %s" % KNOWN_CYCLES
            else:
                unknown += 1
            report(False, desc)
        for key in sorted(k for k in known if k[0] == name and k not in seen_known):
            report(False, "%s lists a cycle of the %s graph that is gone: delete its line (%s)"
                   % (KNOWN_CYCLES, name, ", ".join(key[1])))
        if unknown:
            desc = "%d cycle%s not listed in %s, in the %s graph (%d nodes, %d edges)" % (
                unknown, "" if unknown == 1 else "s", KNOWN_CYCLES, name, len(graph), n_edges)
        else:
            desc = "no %scycle in the %s graph (%d nodes, %d edges)" % (
                "other " if seen_known else "", name, len(graph), n_edges)
        if name == "calls" and n_objects == 0:
            desc += " # SKIP no object files under %s: run make first" % builddir
        report(unknown == 0, desc)
        up = upward_arrows(graph)
        for a, b in up:
            report(False, "an arrow up the layers in the %s graph: %s (%s, rank %d) -> %s (%s, rank %d)"
                   % ((name, a) + rank_of(a)[::-1] + (b,) + rank_of(b)[::-1]))
        if not up:
            report(True, "no arrow up the layers in the %s graph" % name)
    for comp, path in cycles(mods):
        lines.append("# note: x.c and x.h as one node: %s%s" % (
            " -> ".join(path),
            " (the whole circle: %s)" % ", ".join(comp) if len(comp) > len(path) - 1 else ""))
    objs_ok = n_objects > 0 or not args.require_objects
    report(objs_ok, "%d object files read with nm" % n_objects)
    if args.tap:
        lines.append("1..%d" % n)
    print("\n".join(lines))
    return 1 if failed else 0


def read_known(path):
    """{(graph, (node, ...))}: lines `graph: node, node, ...`; # comments."""
    known = set()
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                graph, _, nodes = line.partition(":")
                known.add((graph.strip(), tuple(sorted(x.strip() for x in nodes.split(",")))))
    except FileNotFoundError:
        pass
    return known


if __name__ == "__main__":
    sys.exit(main())
