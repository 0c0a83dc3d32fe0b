#!/bin/sh
# compare-snapshot.sh: gmr-compare --snapshot FILE writes each
# configuration's replay as a PyTorch memory snapshot (docs/compare.md).
#
# The pickle loads with python3's own pickle and passes tests/snapshot-check.py
# (PyTorch's keys, the opcodes memory_viz's page reads, a history that
# replays in order); its segments hold the bytes gmr-compare reports at the
# end of the replay (reserved: Σ segment sizes; allocated: Σ active blocks);
# a trace with call sites gives its entries and blocks PyTorch's frames;
# several CONFIGs give one file each; the table is the same bytes with the
# option as without; and bad outputs (an input, a FIFO, a folder that does
# not exist, the --html page) are refused before any replay.  Where
# `import torch` works, PyTorch's own torch.cuda._memory_viz reads the file.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
CF="$SRC/config"
PY=${PYTHON3:-python3}
. "$SRC/tests/tap.sh"
tap_workdir compare-snapshot
if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi
if ! "$PY" -c 'import pickle, pickletools' >/dev/null 2>&1; then
  echo "1..0 # SKIP python3 is not available to read the snapshots"
  exit 0
fi

# figures FILE: "segments TOTAL ALLOCATED ENTRIES" of a snapshot, then one
# line per frame-carrying record kind: "frames KIND WITH WITHOUT".
figures() {
  "$PY" - "$1" <<'EOF'
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
segs = s["segments"]
blocks = [b for x in segs for b in x["blocks"]]
tr = s["device_traces"][-1]
print(len(segs), sum(x["total_size"] for x in segs),
      sum(b["size"] for b in blocks if b["state"] == "active_allocated"), len(tr))
def count(kind, items):
    w = sum(1 for i in items if i["frames"])
    print("frames", kind, w, len(items) - w)
count("alloc", [e for e in tr if e["action"] == "alloc"])
count("free_completed", [e for e in tr if e["action"] == "free_completed"])
count("active", [b for b in blocks if b["state"] != "inactive"])
count("inactive", [b for b in blocks if b["state"] == "inactive"])
count("segment", segs)
EOF
}
# wrote ERR: "RESERVED ALLOCATED" from gmr-compare's "wrote" line.
wrote() {
  sed -n 's/^gmr-compare: wrote .*(\([0-9]*\) bytes reserved, \([0-9]*\) bytes allocated)$/\1 \2/p' "$1"
}
format_ok() { # format_ok FILE NAME: every check of tests/snapshot-check.py passes
  : >"$W/empty.expect"
  "$PY" "$SRC/tests/snapshot-check.py" "$1" "$W/empty.expect" >"$W/check.out" 2>&1
  st=$?
  ! grep -q "^not ok" "$W/check.out" && [ "$st" -eq 0 ] && grep -q "^ok" "$W/check.out"
  ok $? "$2: tests/snapshot-check.py passes ($(grep -c '^ok' "$W/check.out") checks)"
  grep -A3 "^not ok" "$W/check.out" | sed 's/^/#   /' | head -12
}

# ---- a shipped trace, three configurations ------------------------------------------
T="$SRC/traces/gpt2_train.csv"
"$B" --no-timing "$T" "$CF/pytorch.yaml" "$CF/tf-growth.yaml" "$CF/pytorch-expandable.yaml" \
  >"$W/plain.out" 2>/dev/null
"$B" --no-timing --snapshot "$W/g.pickle" "$T" "$CF/pytorch.yaml" "$CF/tf-growth.yaml" \
  "$CF/pytorch-expandable.yaml" >"$W/snap.out" 2>"$W/snap.err"
ok $? "gpt2_train, three configurations: exit 0"
cmp -s "$W/plain.out" "$W/snap.out"
ok $? "  the table is the same bytes with --snapshot as without"
for c in pytorch tf-growth pytorch-expandable; do
  f="$W/g.$c.pickle"
  [ -s "$f" ]
  ok $? "  $c: one file each, g.$c.pickle"
  [ -s "$f" ] || continue
  format_ok "$f" "  $c"
  set -- $(figures "$f" | sed -n 1p)
  got="$2 $3"
  want=$(grep "wrote $f: the memory snapshot of $c " "$W/snap.err" | sed -n 's/.*(\([0-9]*\) bytes reserved, \([0-9]*\) bytes allocated)$/\1 \2/p')
  is "$got" "$want" "  $c: Σ segment sizes and Σ allocated blocks are the replay's final reserved and allocated"
done
[ ! -e "$W/g.pickle" ]
ok $? "  no file under the bare name with several configurations"
# The caching policy keeps every segment it reserved, so on gpt2_train its
# final reserved bytes are its peak, which the JSON reports.
"$B" --json "$T" "$CF/pytorch.yaml" >"$W/j.json" 2>/dev/null
is "$(figures "$W/g.pytorch.pickle" | sed -n 1p | cut -d' ' -f2)" \
  "$(sed -n 's/^    "peak_reserved": \([0-9]*\),$/\1/p' "$W/j.json")" \
  "  pytorch: the segments hold the JSON's peak_reserved (the cache keeps every segment)"

# ---- call sites become frames ------------------------------------------------------------
cat >"$W/sites.csv" <<'EOF'
Thread,Time,Action,Pointer,Size,Stream,Site
0,10,allocate,0x1000,9437184,0,model.py:10 (embed)
0,20,allocate,0x2000,9437184,0,model.py:20 (attn)
0,30,allocate,0x3000,9437184,0,model.py:20 (attn)
0,40,free,0x2000,9437184,0
0,50,allocate,0x4000,1000,0,a site, with a comma
EOF
"$B" --snapshot "$W/s.pickle" "$W/sites.csv" "$CF/pytorch.yaml" >/dev/null 2>"$W/s.err"
ok $? "a trace with a Site column: exit 0"
grep -q "^gmr-compare: wrote $W/s.pickle: the memory snapshot of pytorch at the end of the replay (" "$W/s.err"
ok $? "  says what it wrote, and which moment"
format_ok "$W/s.pickle" "  sites"
figures "$W/s.pickle" >"$W/s.fig"
is "$(sed -n 's/^frames alloc //p' "$W/s.fig")" "4 0" "  every alloc entry has a frame"
is "$(sed -n 's/^frames free_completed //p' "$W/s.fig")" "1 0" "  the free has its allocation's frame"
is "$(sed -n 's/^frames active //p' "$W/s.fig")" "3 0" "  every active block has a frame"
is "$(sed -n 's/^frames inactive //p' "$W/s.fig")" "0 3" "  inactive blocks have none, as in PyTorch's"
is "$(sed -n 's/^frames segment //p' "$W/s.fig")" "3 0" "  every segment has the frame of the allocation that made it"
got=$("$PY" - "$W/s.pickle" <<'EOF'
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
for e in s["device_traces"][0]:
    if e["action"] == "alloc":
        f = e["frames"][0]
        print("%s|%s|%d|%d" % (f["filename"], f["name"], f["line"], e["size"]))
EOF
)
is "$(echo $got)" "model.py|embed|10|9437184 model.py|attn|20|9437184 model.py|attn|20|9437184 a site, with a comma||0|1000" \
  "  FILE:LINE (NAME) is split into PyTorch's filename, line and name; other text is the file name"
is "$(LC_ALL=C grep -ao 'attn' "$W/s.pickle" | wc -l | tr -d ' ')" 1 \
  "  each frame is written once (the pickle's memo shares it among entries, blocks, segments)"
# A PyTorch snapshot recorded with stacks keeps its frames through the replay.
"$B" --snapshot "$W/p.pickle" "$SRC/tests/fixtures/pytorch-2.11-snapshot.pickle" "$CF/pytorch.yaml" \
  >/dev/null 2>&1
ok $? "a PyTorch snapshot as the trace: exit 0"
format_ok "$W/p.pickle" "  pytorch snapshot"
is "$(figures "$W/p.pickle" | sed -n 's/^frames alloc //p')" "4 0" "  its allocations keep their frames (p.py:LINE)"
# A trace without sites: frames stay empty.
is "$(figures "$W/g.pytorch.pickle" | sed -n 's/^frames alloc \([0-9]*\) .*/\1/p')" 0 \
  "a trace without sites: no frames (memory_viz says the blocks predate the history)"

# ---- PyTorch's own reader -------------------------------------------------------------
if "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m torch.cuda._memory_viz stats "$W/s.pickle" >"$W/viz.out" 2>&1
  ok $? "torch.cuda._memory_viz stats reads the snapshot"
  "$PY" -m torch.cuda._memory_viz trace_plot "$W/s.pickle" -o "$W/viz.html" >/dev/null 2>&1 &&
    [ -s "$W/viz.html" ]
  ok $? "torch.cuda._memory_viz trace_plot draws it"
else
  echo "ok $((n = n + 1)) - torch.cuda._memory_viz reads the snapshot # SKIP python3 cannot import torch"
fi

# ---- refusals, before any replay ------------------------------------------------------
cp "$SRC/tests/fixtures/compare-small.csv" "$W/t.csv"
cp "$CF/direct.yaml" "$W/c.yaml"
cp "$W/t.csv" "$W/t.orig"
cp "$W/c.yaml" "$W/c.orig"
refused() { # refused STATUS PATTERN NAME ARGS...: exit STATUS, PATTERN on stderr, inputs kept
  want=$1 pat=$2 name=$3
  shift 3
  "$B" "$@" >"$W/out" 2>"$W/err"
  st=$?
  [ "$st" -eq "$want" ] && grep -q -e "$pat" "$W/err" && [ ! -s "$W/out" ]
  ok $? "$name: refused, exit $st"
  [ "$st" -eq "$want" ] && grep -q -e "$pat" "$W/err" || sed 's/^/#   /' "$W/err" | head -5
  cmp -s "$W/t.csv" "$W/t.orig" && cmp -s "$W/c.yaml" "$W/c.orig"
  ok $? "  the trace and the configuration are unchanged"
}
refused 2 "refusing to write over an input (the trace)" "--snapshot over the trace" \
  --snapshot "$W/t.csv" "$W/t.csv" "$W/c.yaml"
refused 2 "refusing to write over an input (a configuration)" "--snapshot over the configuration" \
  --snapshot "$W/c.yaml" "$W/t.csv" "$W/c.yaml"
ln -s t.csv "$W/t-link.csv"
refused 2 "refusing to write over an input" "--snapshot over a symbolic link to the trace" \
  --snapshot "$W/t-link.csv" "$W/t.csv" "$W/c.yaml"
if mkfifo "$W/fifo" 2>/dev/null; then
  refused 2 "it is a FIFO, not a regular file" "--snapshot into a FIFO" \
    --snapshot "$W/fifo" "$W/t.csv" "$W/c.yaml"
  [ -p "$W/fifo" ]
  ok $? "  the FIFO is left as it was"
else
  echo "ok $((n = n + 1)) - --snapshot into a FIFO # SKIP mkfifo failed"
fi
mkdir "$W/dir"
refused 2 "it is a folder, not a regular file" "--snapshot into a folder" \
  --snapshot "$W/dir" "$W/t.csv" "$W/c.yaml"
refused 1 "cannot write $W/nodir/x.pickle" "--snapshot into a folder that does not exist" \
  --snapshot "$W/nodir/x.pickle" "$W/t.csv" "$W/c.yaml"
refused 2 "the --html page is written there too" "--snapshot and --html on one file" \
  --snapshot "$W/x.out" --html "$W/x.out" "$W/t.csv" "$W/c.yaml"
refused 2 "two CONFIGs are named 'c'" "--snapshot with two CONFIGs of one name" \
  --snapshot "$W/x.pickle" "$W/t.csv" "$W/c.yaml" "$W/dir/../c.yaml"
refused 2 "--snapshot takes no --diff" "--snapshot with --diff" \
  --snapshot "$W/x.pickle" --diff "$W/t.csv" "$W/t.csv" "$W/c.yaml"
[ -z "$(find "$W" -name '.x.pickle.*' -o -name '.fifo.*' -o -name '.t.csv.*')" ]
ok $? "no temporary file is left"
echo old >"$W/old.pickle"
"$B" --snapshot "$W/old.pickle" "$W/t.csv" "$W/c.yaml" >/dev/null 2>&1 &&
  "$PY" -c "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))" "$W/old.pickle"
ok $? "an older file is replaced by the snapshot"

tap_end
