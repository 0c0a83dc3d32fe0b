#!/bin/sh
# snapshot2csv.sh: TAP tests of tools/snapshot2csv.py (PyTorch memory snapshot
# -> gmr trace CSV, converted by libgmr's gmr_snapshot_csv through python/gmr),
# replaying what it writes with the library
# (tests/snapshot-replay, and gmr-compare when it is built).
#
#  1. A synthetic snapshot shaped like PyTorch's (dicts of builtins, frames,
#     several streams, an oom, a free delayed by record_stream, a ring that
#     dropped the beginning): the exact CSV, the warning, and the replay's
#     allocation count and peak requested bytes.
#  2. --reconstruct puts what the history missed at the start.
#  3. Bad input: not a pickle, no device_traces, a global that is not torch's
#     (refused, never run); torch globals are read as placeholders.
#  4. Round trip on a real PyTorch trace: replay with gmr's history on, write
#     gmr's snapshot, convert it back: the same allocations and PyTorch's own
#     peak requested bytes (traces/figures.md).
srcdir=${GMR_SRCDIR:-.}
builddir=${GMR_BUILDDIR:-.}
PY=${PYTHON3:-python3}
n=0
failed=0

ok() { # ok COND-STATUS DESCRIPTION
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi
}
is() { # is GOT WANT DESCRIPTION
  if [ "$1" = "$2" ]; then ok 0 "$3"; else ok 1 "$3"; echo "#   got: $1"; echo "#  want: $2"; fi
}

if ! "$PY" -c 'import pickle' >/dev/null 2>&1; then
  echo "1..0 # SKIP python3 is not available"
  exit 0
fi
replay="$builddir/tests/snapshot-replay"
if [ ! -x "$replay" ]; then
  echo "1..0 # SKIP $replay is not built"
  exit 0
fi
conv="$srcdir/tools/snapshot2csv.py"
. "$srcdir/tests/snapshot2csv-env.sh"
s2c_env "$srcdir" "$builddir"
if [ -n "$S2C_SKIP" ]; then
  echo "1..0 # SKIP $S2C_SKIP"
  exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-s2c.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# ---- 1. a synthetic snapshot ---------------------------------------------------
"$PY" - "$tmp" <<'EOF'
import os, pickle, sys, types
tmp = sys.argv[1]
MiB = 1 << 20
S = 0x7f3a40000000               # a 20 MiB segment, as PyTorch's large pool makes
A, B, C, X = S, S + 0xf4400, S + 0x500000, S + 0x600000
U = 0x7f3a00100000               # freed, but allocated before the history started
s1 = 140234000                   # a cudaStream_t handle
fr = [{"filename": "train.py", "line": 12, "name": "forward"}]
def e(action, addr, size, stream=0, t=0, **kw):
    d = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": 1700000000000000 + t, "frames": fr}
    d.update(kw)
    return d
trace = [
    e("free_requested", U, 512, t=1), e("free_completed", U, 512, t=2),
    e("segment_alloc", S, 20 * MiB, t=3),
    e("alloc", A, 1000000, t=4), e("alloc", B, 3000000, t=5),
    e("alloc", C, 500, stream=s1, t=6),
    e("free_requested", A, 1000000, t=7), e("free_completed", A, 1000000, t=7),
    {"action": "oom", "device_free": 1234, "size": 20 * MiB, "stream": 0,
     "time_us": 1700000000000008, "frames": fr},
    e("alloc", A, 700000, t=9),                      # the same address again
    e("free_requested", B, 3000000, t=10),           # pending: record_stream
    e("alloc", C + 0x10000, 4000000, stream=s1, t=11),
    e("free_completed", B, 3000000, t=12),
    e("free_requested", C, 500, stream=s1, t=13), e("free_completed", C, 500, stream=s1, t=13),
    e("segment_map", S + 20 * MiB, 2 * MiB, t=14), e("segment_unmap", S + 20 * MiB, 2 * MiB, t=15),
    {"action": "snapshot", "addr": 0, "size": 4702048, "stream": 0,
     "time_us": 1700000000000016, "frames": []},
]
def blk(a, size, req, state):
    return {"address": a, "size": size, "requested_size": req, "state": state, "frames": fr}
seg = {"device": 0, "address": S, "total_size": 20 * MiB, "allocated_size": 0,
       "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
       "blocks": [blk(A, 700416, 700000, "active_allocated"),
                  blk(A + 700416, 0x500000 - 700416, 0, "inactive"),
                  blk(C, 0x10000, 0, "inactive"),
                  blk(C + 0x10000, 4000256, 4000000, "active_allocated"),
                  blk(X, 2048, 2048, "active_allocated"),        # from before the history
                  blk(X + 2048, 20 * MiB - 0x600000 - 2048, 0, "inactive")]}
snap = {"segments": [seg], "device_traces": [trace, []],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                               "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0}},
        "external_annotations": []}
with open(os.path.join(tmp, "synthetic.pickle"), "wb") as f:
    pickle.dump(snap, f)        # the default protocol, as _dump_snapshot
with open(os.path.join(tmp, "empty.pickle"), "wb") as f:
    pickle.dump({"segments": []}, f)
with open(os.path.join(tmp, "list.pickle"), "wb") as f:
    pickle.dump([1, 2], f)
# A global that is not torch's must be refused, never called.
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(tmp, "pwned"),))
with open(os.path.join(tmp, "evil.pickle"), "wb") as f:
    pickle.dump({"device_traces": [[Evil()]]}, f)
# torch objects: a fake torch module makes the pickle; the converter has no torch.
torch = types.ModuleType("torch")
class Size(tuple):
    pass
Size.__module__ = "torch"
torch.Size = Size
sys.modules["torch"] = torch
t2 = [dict(x) for x in trace[2:6]]
t2[1]["shape"] = Size((2, 3))
with open(os.path.join(tmp, "torch.pickle"), "wb") as f:
    pickle.dump({"segments": [], "device_traces": [t2]}, f)
EOF
ok $? "build synthetic PyTorch-shaped snapshots with python3"

gpy "$conv" -o "$tmp/synthetic.csv" "$tmp/synthetic.pickle" 2>"$tmp/err"
ok $? "snapshot2csv.py converts the synthetic snapshot"
grep -q "1 frees of addresses the history never allocated: the ring buffer dropped the beginning" \
  "$tmp/err"
ok $? "it warns that the ring buffer dropped the beginning"
grep -q "device 0: 5 allocations, 3 frees, 2 live at the end, peak requested 7700500 bytes" \
  "$tmp/err"
ok $? "its summary: 5 allocations, 3 frees, 2 live, peak requested 7700500"
cat >"$tmp/want.csv" <<'EOF'
Thread,Time,Action,Pointer,Size,Stream
0,1700000000000004,allocate,0x7f3a40000000,1000000,0
0,1700000000000005,allocate,0x7f3a400f4400,3000000,0
0,1700000000000006,allocate,0x7f3a40500000,500,1
0,1700000000000007,free,0x7f3a40000000,1000000,0
0,1700000000000009,allocate,0x7f3a40000000,700000,0
0,1700000000000011,allocate,0x7f3a40510000,4000000,1
0,1700000000000012,free,0x7f3a400f4400,3000000,0
0,1700000000000013,free,0x7f3a40500000,500,1
EOF
if cmp -s "$tmp/synthetic.csv" "$tmp/want.csv"; then ok 0 "the CSV is exactly the expected one"
else ok 1 "the CSV is exactly the expected one"; diff "$tmp/want.csv" "$tmp/synthetic.csv" | sed 's/^/# /'; fi

got=$("$replay" "$tmp/synthetic.csv" 2>&1)
is "$got" "events 8 allocations 5 frees 3 live 2 peak_requested 7700500 ooms 0" \
  "the library replays it: 5 allocations, peak requested 7700500 bytes"

gpy "$conv" "$tmp/synthetic.pickle" 2>/dev/null | cmp -s - "$tmp/want.csv"
ok $? "without -o the CSV goes to standard output"

# ---- 2. --reconstruct --------------------------------------------------------------
gpy "$conv" --reconstruct -o "$tmp/rec.csv" "$tmp/synthetic.pickle" 2>"$tmp/err"
ok $? "--reconstruct converts"
got=$(sed -n '2,3p' "$tmp/rec.csv" | tr '\n' ' ')
is "$got" "0,1700000000000001,allocate,0x7f3a00100000,512,0 0,1700000000000001,allocate,0x7f3a40600000,2048,0 " \
  "--reconstruct allocates the freed-unknown block and the block live before the history, first"
got=$("$replay" "$tmp/rec.csv" 2>&1)
is "$got" "events 11 allocations 7 frees 4 live 3 peak_requested 7702548 ooms 0" \
  "the reconstructed trace replays: 7 allocations, peak requested 7702548 bytes"

# ---- 3. bad input ------------------------------------------------------------------
gpy "$conv" "$tmp/want.csv" >/dev/null 2>"$tmp/err"
st=$?
ok $((st != 1)) "a CSV is not a snapshot: exit status 1"
grep -q "not a readable memory snapshot pickle" "$tmp/err"
ok $? "  and the message says so"
gpy "$conv" "$tmp/empty.pickle" >/dev/null 2>"$tmp/err"
ok $(($? != 1)) "a snapshot without device_traces: exit status 1"
grep -q "_record_memory_history" "$tmp/err"
ok $? "  and the message says how to record the history"
gpy "$conv" "$tmp/list.pickle" >/dev/null 2>"$tmp/err"
ok $(($? != 1)) "a pickle of a list: exit status 1"
gpy "$conv" "$tmp/evil.pickle" >/dev/null 2>"$tmp/err"
ok $(($? != 1)) "a pickle calling os.system is refused"
grep -q "refusing to load posix.system\|refusing to load os.system\|refusing to load nt.system" "$tmp/err"
ok $? "  and the message names the global"
test ! -e "$tmp/pwned"
ok $? "  and nothing ran"
gpy "$conv" "$tmp/torch.pickle" 2>"$tmp/err" >"$tmp/torch.csv"
ok $? "torch globals are read as placeholders"
is "$(wc -l <"$tmp/torch.csv" | tr -d ' ')" "4" "  and its 3 allocations are converted"
gpy "$conv" --device 1 "$tmp/synthetic.pickle" >/dev/null 2>"$tmp/err"
ok $? "--device 1 (empty) converts to an empty trace"
gpy "$conv" --device 5 "$tmp/synthetic.pickle" >/dev/null 2>"$tmp/err"
ok $(($? != 1)) "--device 5 is refused"
grep -q "devices 0..1" "$tmp/err"
ok $? "  and the message gives the devices there are"
gpy "$conv" "$tmp/missing.pickle" >/dev/null 2>"$tmp/err"
ok $(($? != 1)) "a missing file: exit status 1"

# ---- 3b. real PyTorch snapshots ---------------------------------------------------------
# tests/fixtures/pytorch-2.11-snapshot*.pickle: torch 2.11.0+cu130 on an H200,
# _record_memory_history(max_entries=99999, context="all", stacks="python"),
# then (uint8 tensors) x = 1000 B, y = 3 MiB, z = 5000 B on a side stream,
# del x, w = 7 MiB, y.record_stream(side), del y, memory_stats(), synchronize,
# empty_cache, _dump_snapshot; the second with expandable_segments:True.  That
# run's memory_stats()["requested_bytes.all.peak"] was 10490760.
for fx in pytorch-2.11-snapshot pytorch-2.11-snapshot-expandable; do
  gpy "$conv" -q -o "$tmp/$fx.csv" "$srcdir/tests/fixtures/$fx.pickle"
  ok $? "$fx.pickle (real PyTorch) converts"
  got=$(cut -d, -f3,5,6 "$tmp/$fx.csv" | tail -n +2 | tr '\n' ' ')
  is "$got" "allocate,1000,0 allocate,3145728,0 allocate,5000,1 free,1000,0 allocate,7340032,0 free,3145728,0 " \
    "  to the program's allocations and frees, the side stream as 1"
  got=$("$replay" "$tmp/$fx.csv" 2>&1)
  is "$got" "events 6 allocations 4 frees 2 live 2 peak_requested 10490760 ooms 0" \
    "  and replays to PyTorch's requested_bytes.all.peak, 10490760"
done

# ---- 4. round trip on a real trace --------------------------------------------------
trace="$srcdir/traces/resnet50_train.csv"
if [ -f "$trace" ]; then
  first=$("$replay" --snapshot "$tmp/gmr.pickle" "$trace" 2>&1)
  ok $? "replay resnet50_train.csv under direct with the history on, write gmr's snapshot"
  case "$first" in
  *"peak_requested 3192592912 "*) ok 0 "its peak requested is PyTorch's: 3192592912 bytes" ;;
  *) ok 1 "its peak requested is PyTorch's: 3192592912 bytes"; echo "# $first" ;;
  esac
  "$PY" - "$tmp/gmr.pickle" "$srcdir/tests/fixtures/pytorch-2.11-snapshot.pickle" <<'PYEOF'
import pickle, sys
g, t = (pickle.load(open(p, "rb")) for p in sys.argv[1:3])
def keys(s):
    seg = s["segments"][0]
    return (sorted(s), sorted(seg), sorted(seg["blocks"][0]), sorted(s["device_traces"][0][0]))
sys.exit(0 if keys(g) == keys(t) else 1)
PYEOF
  ok $? "gmr's snapshot has the keys of PyTorch 2.11's: top level, segments, blocks, trace entries"
  gpy "$conv" -q -o "$tmp/back.csv" "$tmp/gmr.pickle"
  ok $? "snapshot2csv.py converts gmr's own snapshot"
  second=$("$replay" "$tmp/back.csv" 2>&1)
  is "$second" "$first" "the converted trace replays to the same counts and peak"
  cut -d, -f3,5 "$trace" | tail -n +2 >"$tmp/a"
  cut -d, -f3,5 "$tmp/back.csv" | tail -n +2 >"$tmp/b"
  cmp -s "$tmp/a" "$tmp/b"
  ok $? "and to the same actions and sizes, in the same order"
  # The simulated clock followed the trace: the times differ by one constant.
  "$PY" - "$trace" "$tmp/back.csv" <<'PYEOF'
import sys
t = [[int(l.split(",")[1]) for l in open(p).readlines()[1:]] for p in sys.argv[1:3]]
sys.exit(0 if [x - t[0][0] for x in t[0]] == [x - t[1][0] for x in t[1]] else 1)
PYEOF
  ok $? "and to the same times, from its own start"
  if [ -x "$builddir/tools/gmr-compare" ]; then
    json=$("$builddir/tools/gmr-compare" --json "$tmp/back.csv" "$srcdir/config/direct.yaml" 2>"$tmp/compare.err")
    got=$(printf '%s' "$json" | "$PY" -c 'import json,sys; r=json.load(sys.stdin)[0]; print(r["events"], r["peak_requested"])')
    is "$got" "$(wc -l <"$tmp/a" | tr -d ' ') 3192592912" "gmr-compare replays it: events and peak requested"
  fi
else
  echo "# $trace is missing: no round trip"
fi

# ---- 4b. gmr's snapshots at the peak, against PyTorch's figures ----------------------------
# gpt2_train.csv replayed to its peak of requested bytes under PyTorch's
# policy: the snapshot's segments are PyTorch's peak segments and peak reserved
# bytes (traces/figures.md: default 154 segments, 15286140928 bytes;
# expandable_segments 14543749120 bytes).
gpt2="$srcdir/traces/gpt2_train.csv"
for case in "pytorch 154 15286140928" "pytorch-expandable - 14543749120"; do
  set -- $case
  if ! "$replay" --config "$srcdir/config/$1.yaml" --stop-at-peak --snapshot "$tmp/$1.pickle" \
      "$gpt2" >"$tmp/$1.out" 2>&1; then
    if grep -q "unknown policy" "$tmp/$1.out"; then
      n=$((n + 1)); echo "ok $n # SKIP $1: the caching policy is not built"; continue
    fi
    ok 1 "replay gpt2_train.csv under $1 to its peak"; sed 's/^/# /' "$tmp/$1.out"; continue
  fi
  got=$("$PY" - "$tmp/$1.pickle" <<'PYEOF'
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
segs = s["segments"]
print(len(segs), sum(x["total_size"] for x in segs),
      sum(b["requested_size"] for x in segs for b in x["blocks"] if b["state"] == "active_allocated"))
PYEOF
)
  set -- $case
  if [ "$2" = "-" ]; then got=$(echo "$got" | cut -d' ' -f2-); want="$3 13594206920"
  else want="$2 $3 13594206920"; fi
  is "$got" "$want" "gpt2 at its peak under $1: segments, reserved and requested bytes are PyTorch's"
done

# ---- 5. gmr-record, with a stand-in for torch -----------------------------------------
# No torch here: a fake torch package records allocations the way PyTorch's
# memory history does, so gmr-record's whole path runs: recording on before
# the script, the script run as __main__ with its argv, its exit status, the
# snapshot dumped and converted.
rec="$srcdir/tools/gmr-record"
mkdir -p "$tmp/fake/torch/cuda" "$tmp/run"
cat >"$tmp/fake/torch/__init__.py" <<'PYEOF'
from . import cuda
class Tensor:
    def __init__(self, n):
        self.n, self.addr = n, cuda.memory._alloc(n)
    def __del__(self):
        cuda.memory._free(self.addr, self.n)
def empty(n):
    return Tensor(n)
PYEOF
cat >"$tmp/fake/torch/cuda/__init__.py" <<'PYEOF'
from . import memory
def is_available():
    return True
def synchronize():
    memory._calls.append("synchronize")
def empty_cache():
    memory._calls.append("empty_cache")
PYEOF
cat >"$tmp/fake/torch/cuda/memory.py" <<'PYEOF'
import pickle
_history, _calls, _next, _t = None, [], 0x7f0000000000, 0
def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None,
                           device=None):
    global _history
    _calls.append("record %s %s %s" % (enabled, context, max_entries))
    _history = [] if enabled else None
def _entry(action, addr, size):
    global _t
    _t += 1
    if _history is not None:
        _history.append({"action": action, "addr": addr, "size": size, "stream": 0,
                         "time_us": _t, "frames": []})
def _alloc(n):
    global _next
    a, _next = _next, _next + 4096 * ((n + 4095) // 4096)
    _entry("alloc", a, n)
    return a
def _free(a, n):
    _entry("free_requested", a, n)
    _entry("free_completed", a, n)
def _dump_snapshot(path):
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [list(_history)], "calls": list(_calls)},
                    f)
PYEOF
cat >"$tmp/run/user.py" <<'PYEOF'
import os, sys
import torch
assert __name__ == "__main__"
print("argv:" + " ".join(sys.argv[1:]))
a = torch.empty(1000)
b = torch.empty(2000)
del a
c = torch.empty(300)
os.chdir("/")
sys.exit(int(sys.argv[1]))
PYEOF
(cd "$tmp/run" && PYTHONPATH="$tmp/fake" gpy "$rec" --max-entries 5000 --snapshot s.pickle \
  user.py 3 --flag >"$tmp/out" 2>"$tmp/err")
is "$?" "3" "gmr-record returns the program's exit status"
is "$(cat "$tmp/out")" "argv:3 --flag" "the program runs with its own arguments"
grep -q "gmr-record: wrote $tmp/run/user.trace.csv: device 0, 3 allocations, 3 frees, peak requested 3000 bytes" "$tmp/err"
ok $? "gmr-record says where the trace went, and what is in it"
cat "$tmp/err" | sed 's/^/# /'
got=$(cut -d, -f3,5 "$tmp/run/user.trace.csv" | head -5 | tr '\n' ' ')
is "$got" "Action,Size allocate,1000 allocate,2000 free,1000 allocate,300 " "the trace holds the program's allocations"
got=$("$PY" -c 'import pickle,sys; print(pickle.load(open(sys.argv[1],"rb"))["calls"])' "$tmp/run/s.pickle")
is "$got" "['record all None 5000', 'synchronize', 'empty_cache']" \
  "recording was on (max_entries 5000, no stacks) before the program; synchronize, empty_cache, dump"
(cd "$tmp/run" && PYTHONPATH="$tmp/fake" gpy "$rec" -o "$tmp/m.csv" --stacks \
  -m user 0 >/dev/null 2>"$tmp/err")
is "$?" "0" "gmr-record -m runs a module"
gpy "$rec" >/dev/null 2>&1
is "$?" "2" "gmr-record without a program is a usage error"
(cd "$tmp/run" && PYTHONPATH="$tmp/fake" gpy "$rec" nosuch.py >/dev/null 2>"$tmp/err")
ok $(($? == 0)) "gmr-record of a missing script fails"
grep -q "nosuch.py: no such script" "$tmp/err"
ok $? "  and says so"
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  (cd "$tmp/run" && gpy "$rec" user.py 0 >/dev/null 2>"$tmp/err")
  ok $(($? == 0)) "gmr-record without PyTorch fails"
  grep -q "PyTorch is needed" "$tmp/err"
  ok $? "  and says PyTorch is needed"
fi

echo "1..$n"
exit $failed
