#!/bin/sh
# snapshot-viz.sh: check gmr's memory snapshots with PyTorch's own tools, and
# gmr-record on a real PyTorch program.  Run on a machine with PyTorch and a
# CUDA device; prints TAP and skips (1..0 # SKIP) without PyTorch.
#
#   scripts/gpu/snapshot-viz.sh [BUILDDIR]
#
# BUILDDIR is a configured gmr build (default: build a fresh one under the
# output directory, which needs autotools, a C compiler and libyaml).  With
# GMR_SNAPSHOT=FILE, that gmr snapshot is checked instead of one made here.
# Output (snapshots, HTML pages, traces) goes to $OUT, or a temporary folder.
#
#  1. gmr writes a snapshot of gpt2_train.csv replayed on the simulator at its
#     peak of requested bytes (config/pytorch.yaml when the caching policy is
#     built, else config/direct.yaml), with its history;
#  2. python -m torch.cuda._memory_viz stats reads it and reports the number of
#     segments and the reserved and allocated bytes the snapshot holds;
#     trace, trace_plot and segment_plot read it too;
#  2b. gmr-compare --snapshot of a small trace with call sites: memory_viz's
#     trace_plot and segment_plot read it, and its frame formatter names
#     each allocation's site;
#  3. gmr-record runs a small PyTorch program and writes its trace, whose
#     allocations and peak of requested bytes are PyTorch's own
#     (memory_stats()["requested_bytes.all.peak"]).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gmr-viz.XXXXXX")}
mkdir -p "$out"
n=0
failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

if ! "$PY" -c 'import torch, torch.cuda._memory_viz' >/dev/null 2>&1; then
  echo "1..0 # SKIP PyTorch is not installed for $PY"
  exit 0
fi
echo "# $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())')"

# ---- 1. a gmr snapshot ---------------------------------------------------------------
snap=${GMR_SNAPSHOT:-}
if [ -z "$snap" ]; then
  build=${1:-}
  if [ -z "$build" ]; then
    build="$out/build"
    mkdir -p "$build"
    (cd "$here" && ./autogen.sh >/dev/null 2>&1) &&
      (cd "$build" && "$here/configure" >/dev/null 2>&1 && make -j4 >/dev/null 2>&1)
  fi
  (cd "$build" && make tests/snapshot-replay >/dev/null 2>&1)
  if [ -x "$build/tests/snapshot-replay" ]; then
    config="$here/config/direct.yaml"
    "$build/tools/gmr-demo" --reference 2>/dev/null | grep -q "policy \`caching\`" &&
      config="$here/config/pytorch.yaml"
    snap="$out/gmr-gpt2.pickle"
    "$build/tests/snapshot-replay" --config "$config" --stop-at-peak --snapshot "$snap" \
      "$here/traces/gpt2_train.csv" >"$out/replay.txt" 2>&1
    ok $? "gmr writes a snapshot of gpt2_train.csv at its peak under $(basename "$config")"
    sed 's/^/# /' "$out/replay.txt"
  else
    echo "# gmr could not be built here: no gmr snapshot to check (set GMR_SNAPSHOT)"
  fi
fi

if [ -n "$snap" ] && [ -f "$snap" ]; then
  # What the snapshot holds, read with plain pickle, in _memory_viz's words.
  want=$("$PY" - "$snap" <<'PYEOF'
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
def fmt(num):
    for unit in ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"]:
        if abs(num) < 1024.0:
            return f"{num:3.1f}{unit}B"
        num /= 1024.0
    return f"{num:.1f}YiB"
segs = s["segments"]
reserved = sum(x["total_size"] for x in segs)
allocated = sum(b["requested_size"] for x in segs for b in x["blocks"]
                if b["state"] == "active_allocated")
print(f"segments: {len(segs)}|total_reserved: {fmt(reserved)}|total_allocated: {fmt(allocated)}")
PYEOF
)
  "$PY" -m torch.cuda._memory_viz stats "$snap" >"$out/stats.txt" 2>&1
  ok $? "python -m torch.cuda._memory_viz stats reads gmr's snapshot"
  old_ifs=$IFS
  IFS='|'
  for line in $want; do
    grep -qxF "$line" "$out/stats.txt"
    ok $? "  and reports '$line'"
  done
  IFS=$old_ifs
  tail -n 12 "$out/stats.txt" | sed 's/^/# /'
  "$PY" -m torch.cuda._memory_viz trace "$snap" >"$out/trace.txt" 2>&1
  ok $? "python -m torch.cuda._memory_viz trace reads it ($(wc -l <"$out/trace.txt") lines)"
  for kind in trace_plot segment_plot; do
    "$PY" -m torch.cuda._memory_viz $kind "$snap" -o "$out/$kind.html" >"$out/$kind.log" 2>&1
    st=$?
    [ $st -eq 0 ] && grep -q "add_local_files" "$out/$kind.html"
    ok $? "python -m torch.cuda._memory_viz $kind writes $kind.html"
    [ $st -eq 0 ] || sed 's/^/# /' "$out/$kind.log"
  done
fi

# ---- 2b. gmr-compare --snapshot: call sites as frames --------------------------------
if [ -n "${build:-}" ] && [ -x "$build/tools/gmr-compare" ]; then
  cat >"$out/sites.csv" <<'CSVEOF'
Thread,Time,Action,Pointer,Size,Stream,Site
0,10,allocate,0x1000,9437184,0,model.py:10 (embed)
0,20,allocate,0x2000,9437184,0,model.py:20 (attn)
0,30,free,0x1000,9437184,0
CSVEOF
  "$build/tools/gmr-compare" --snapshot "$out/sites.pickle" "$out/sites.csv" \
    "$here/config/pytorch.yaml" >/dev/null 2>"$out/sites.err"
  ok $? "gmr-compare --snapshot writes a snapshot of a trace with call sites"
  for kind in trace_plot segment_plot; do
    "$PY" -m torch.cuda._memory_viz $kind "$out/sites.pickle" -o "$out/sites-$kind.html" \
      >"$out/sites-$kind.log" 2>&1
    ok $? "  python -m torch.cuda._memory_viz $kind reads it"
  done
  "$PY" - "$out/sites.pickle" >"$out/sites-frames.txt" 2>&1 <<'PYEOF'
import pickle, sys
import torch.cuda._memory_viz as viz
s = pickle.load(open(sys.argv[1], "rb"))
fmt = getattr(viz, "_frame_fmt", None)
for e in s["device_traces"][0]:
    if e["action"] == "alloc":
        f = e["frames"][0]
        print(fmt(f) if fmt else "%s:%s:%s" % (f["filename"], f["line"], f["name"]))
PYEOF
  grep -q "model.py.*20.*attn" "$out/sites-frames.txt"
  ok $? "  memory_viz's frame formatter names the allocation's site ($(head -n 1 "$out/sites-frames.txt"))"
fi

# ---- 3. gmr-record on a real program --------------------------------------------------
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  cat >"$out/prog.py" <<'PYEOF'
import json, sys, torch
x = torch.empty(1000, dtype=torch.uint8, device="cuda")
y = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    z = torch.empty(5000, dtype=torch.uint8, device="cuda")
del x
w = torch.empty(7 << 20, dtype=torch.uint8, device="cuda")
y.record_stream(s)          # the free of y waits for s: free_requested, then free_completed
del y
stats = torch.cuda.memory_stats()
json.dump({"requested_peak": stats["requested_bytes.all.peak"],
           "allocs": stats["allocation.all.allocated"]}, open(sys.argv[1], "w"))
PYEOF
  (cd "$out" && "$PY" "$here/tools/gmr-record" -o prog.csv --snapshot prog.pickle \
      prog.py prog.json >prog.log 2>&1)
  ok $? "gmr-record runs a PyTorch program on the GPU"
  sed 's/^/# /' "$out/prog.log"
  got=$(cut -d, -f3,5,6 "$out/prog.csv" | tail -n +2 | tr '\n' ' ')
  want="allocate,1000,0 allocate,3145728,0 allocate,5000,1 free,1000,0 allocate,7340032,0 free,3145728,0 "
  [ "${got#"$want"}" != "$got" ]
  ok $? "its trace starts with the program's allocations and frees, streams renumbered"
  echo "# got: $got"
  peak=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["requested_peak"])' "$out/prog.json")
  grep -q "peak requested $peak bytes" "$out/prog.log"
  ok $? "its peak requested is PyTorch's requested_bytes.all.peak ($peak)"
  "$PY" -m torch.cuda._memory_viz stats "$out/prog.pickle" >/dev/null 2>&1
  ok $? "PyTorch reads the snapshot gmr-record kept"
fi

echo "# output in $out"
echo "1..$n"
exit $failed
