#!/bin/sh
# compare-formats.sh: TAP tests of gmr-compare on the traces users already
# have: RMM logging_resource_adaptor logs and PyTorch memory snapshots.
#
#  1. tests/fixtures/resnet50_train.rmm.csv, traces/resnet50_train.csv written
#     as RMM's adaptor writes its log (scripts/trace2rmm.py: OS thread ids,
#     clock times, %p pointers), replays to exactly the figures of the gmr
#     trace under four policies, and to PyTorch's own peak (traces/figures.md).
#  2. Every variant of the log: seconds since the epoch, deallocate, allocate
#     failure with a (nil) or 0x0 pointer (counted and reported, not
#     replayed), pointer streams; a bad time names its line.
#  3. Real PyTorch 2.11 snapshots (tests/fixtures) read directly give the
#     figures of the CSV snapshot2csv.py makes of them; a synthetic one whose
#     ring buffer dropped the beginning says what is missing.
#  4. Snapshots that cannot be replayed say why: no history, a list, no
#     alloc entry; hostile pickles (truncated, garbage, huge lengths and memo
#     indices, a self-containing list, a global) fail cleanly.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
PY=${PYTHON3:-python3}
TR="$SRC/traces"
CF="$SRC/config"
FX="$SRC/tests/fixtures"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-compare-formats.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT

. "${GMR_SRCDIR:-.}/tests/tap.sh"
skip() {
  n=$((n + 1))
  echo "ok $n - $1 # SKIP $2"
}
has() {
  if grep -F -q -- "$2" "$1"; then ok 0 "$3"; else
    ok 1 "$3"
    echo "#   '$1' does not contain '$2':"
    sed 's/^/#   /' "$1" | head -10
  fi
}
jget() {
  awk -v c="\"config\": \"$2\"," -v k="\"$3\": " '
    index($0, c) { inobj = 1 }
    inobj && index($0, k) == 5 { v = substr($0, 5 + length(k)); sub(/,$/, "", v); print v; exit }
    /^  }/ { inobj = 0 }' "$1"
}
# The figures of a --json output, without what names the input or times it
# (and the failures the recording saw, which a CSV cannot carry; checked apart).
figures() {
  grep -v -e '"trace": ' -e '"trace_format": ' -e '"seconds": ' -e '"events_per_second": ' \
    -e '"peak_line": ' -e '"trace_alloc_failures": ' "$1"
}
same() { # same A.json B.json NAME
  figures "$1" >"$1.fig"
  figures "$2" >"$2.fig"
  if cmp -s "$1.fig" "$2.fig"; then ok 0 "$3"; else
    ok 1 "$3"
    diff "$1.fig" "$2.fig" | head -20 | sed 's/^/#   /'
  fi
}

if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi

# ---- 1. a real RMM log -------------------------------------------------------------
L="$FX/resnet50_train.rmm.csv"
is "$(head -n 1 "$L")" "Thread,Time,Action,Pointer,Size,Stream" "rmm log: RMM's header"
is "$(sed -n 2p "$L")" "140120123451136,13:05:59.938609,allocate,0x7f8543e00000,37632,0" \
  "rmm log: thread id, clock time, %p pointer, size, stream as RMM writes them"
cfgs="$CF/direct.yaml $CF/pytorch.yaml $CF/pytorch-expandable.yaml $CF/tf-growth.yaml"
# shellcheck disable=SC2086
"$B" --json "$L" $cfgs >"$W/rmm.json" 2>"$W/rmm.err"
is "$?" 0 "rmm log: replays (exit status 0)"
# shellcheck disable=SC2086
"$B" --json "$TR/resnet50_train.csv" $cfgs >"$W/csv.json" 2>/dev/null
same "$W/rmm.json" "$W/csv.json" "rmm log: every figure of every policy equals the gmr trace's"
is "$(jget "$W/rmm.json" pytorch peak_reserved)" 3797942272 \
  "rmm log: caching reproduces PyTorch's 3797942272 bytes reserved"
is "$(jget "$W/rmm.json" pytorch events)/$(jget "$W/rmm.json" pytorch trace_alloc_failures)" \
  8635/0 "rmm log: 8635 events, no failure"
is "$(jget "$W/rmm.json" pytorch peak_line)" "$(jget "$W/csv.json" pytorch peak_line)" \
  "rmm log: the peak on the same line"

# ---- 2. the variants ---------------------------------------------------------------
cat >"$W/variants.log" <<'EOF2'
Thread,Time,Action,Pointer,Size,Stream
140573312345856,1634567890.234567,allocate,0x7f8a40000000,1024,0x7f8a38001020
140573312345857,1634567890.334567,allocate failure,(nil),1099511627776,0x7f8a38001020
140573312345856,13:05:59.1,allocate,0x7f8a40000400,2048,0
140573312345856,1634567890.345678,deallocate,0x7f8a40000000,1024,0x7f8a38001020
140573312345856,13:06:00.000001,allocate failure,0x0,4096,0
140573312345856,13:06:00.000002,free,0x7f8a40000400,2048,0
EOF2
"$B" --json "$W/variants.log" "$CF/direct.yaml" >"$W/v.json" 2>"$W/v.err"
is "$?" 0 "variants: epoch and clock times, deallocate and free, (nil) and 0x0 failures"
is "$(jget "$W/v.json" direct events)" 4 "variants: 4 events replayed (failures are not)"
is "$(jget "$W/v.json" direct trace_alloc_failures)" 2 "variants: 2 failures counted (JSON)"
is "$(jget "$W/v.json" direct peak_requested)" 3072 "variants: 1 KiB and 2 KiB live at once"
has "$W/v.err" "the recording saw 2 allocations fail (1.00 TiB requested; the first at line 3); counted, not replayed" \
  "variants: the failures are reported with their line"
"$B" "$W/variants.log" "$CF/direct.yaml" >"$W/v.out" 2>/dev/null
has "$W/v.out" "the recording saw 2 allocations fail: counted, not replayed" \
  "variants: and stated above the table"
has "$W/v.out" "4 events, 2 allocations (0 never freed), 2 streams" \
  "variants: a pointer stream and the default stream"
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,12:61:00.5,allocate,0x10,8,0\n' >"$W/badtime.log"
"$B" "$W/badtime.log" "$CF/direct.yaml" >/dev/null 2>"$W/bt.err"
is "$?" 1 "variants: a bad clock time is an error"
has "$W/bt.err" "badtime.log:2: Time '12:61:00.5' is not a time" "variants: it names the line"

# ---- 3. PyTorch snapshots ---------------------------------------------------------
. "$SRC/tests/snapshot2csv-env.sh"
s2c_env "$SRC" "$BLD"
if [ -n "$S2C_SKIP" ]; then
  echo "# snapshot2csv.py cannot run here ($S2C_SKIP): no snapshots"
elif "$PY" -c 'import pickle' >/dev/null 2>&1; then
  for fx in pytorch-2.11-snapshot pytorch-2.11-snapshot-expandable; do
    gpy "$SRC/tools/snapshot2csv.py" -q --sites -o "$W/$fx.csv" "$FX/$fx.pickle"
    "$B" --json "$FX/$fx.pickle" "$CF/direct.yaml" "$CF/pytorch.yaml" >"$W/$fx.p.json" 2>"$W/$fx.err"
    is "$?" 0 "$fx.pickle: read directly (exit status 0)"
    "$B" --json "$W/$fx.csv" "$CF/direct.yaml" "$CF/pytorch.yaml" >"$W/$fx.c.json" 2>/dev/null
    same "$W/$fx.p.json" "$W/$fx.c.json" "$fx.pickle: the figures of snapshot2csv.py's CSV"
    is "$(jget "$W/$fx.p.json" pytorch peak_requested)" 10490760 \
      "$fx.pickle: PyTorch's requested_bytes.all.peak, 10490760"
    is "$(jget "$W/$fx.p.json" pytorch trace_format)" '"pytorch_snapshot"' "$fx.pickle: the format"
    is "$(jget "$W/$fx.p.json" pytorch top_sites)" \
      '[{"site": "p.py:8 (<module>)", "bytes": 7340032, "allocations": 1}, {"site": "p.py:5 (<module>)", "bytes": 3145728, "allocations": 1}, {"site": "p.py:7 (<module>)", "bytes": 5000, "allocations": 1}]' \
      "$fx.pickle: the call sites at the peak, from the frames"
  done

  "$PY" - "$W" <<'EOF2'
import os, pickle, sys
w = sys.argv[1]
MiB = 1 << 20
S = 0x7f3a40000000
A, B, C = S, S + 0xf4400, S + 0x500000
U = 0x7f3a00100000
fr = [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125,
       "name": "forward"}, {"filename": "/home/u/train.py", "line": 12, "name": "step"}]
def e(action, addr, size, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 1700000000000000 + t, "frames": fr}
trace = [e("free_requested", U, 512, t=1), e("free_completed", U, 512, t=2),
         e("segment_alloc", S, 20 * MiB, t=3), e("alloc", A, 1000000, t=4),
         e("alloc", B, 3000000, t=5), e("alloc", C, 500, stream=140234000, t=6),
         e("free_requested", A, 1000000, t=7), e("free_completed", A, 1000000, t=7),
         {"action": "oom", "device_free": 1234, "size": 20 * MiB, "stream": 0,
          "time_us": 1700000000000008, "frames": fr},
         e("alloc", A, 700000, t=9)]
snap = {"segments": [], "device_traces": [trace, []]}
pickle.dump(snap, open(os.path.join(w, "ring.pickle"), "wb"))
pickle.dump(snap, open(os.path.join(w, "ring-p2.pickle"), "wb"), protocol=2)
pickle.dump({"segments": []}, open(os.path.join(w, "nohistory.pickle"), "wb"))
pickle.dump([{"address": S}], open(os.path.join(w, "list.pickle"), "wb"))
pickle.dump({"device_traces": [[e("segment_alloc", S, MiB)]]},
            open(os.path.join(w, "noalloc.pickle"), "wb"))
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(w, "pwned"),))
pickle.dump({"device_traces": [[Evil()]]}, open(os.path.join(w, "evil.pickle"), "wb"))
loop = []
loop.append(loop)
pickle.dump({"device_traces": [loop]}, open(os.path.join(w, "loop.pickle"), "wb"))
good = open(os.path.join(w, "ring.pickle"), "rb").read()
open(os.path.join(w, "truncated.pickle"), "wb").write(good[:len(good) // 2])
open(os.path.join(w, "garbage.pickle"), "wb").write(b"\x80\x04" + bytes(range(256)) * 4)
open(os.path.join(w, "hugestr.pickle"), "wb").write(b"\x80\x04X\xff\xff\xff\x7fabc.")
open(os.path.join(w, "hugememo.pickle"), "wb").write(b"\x80\x04Nr\xff\xff\xff\x7f.")
open(os.path.join(w, "getnone.pickle"), "wb").write(b"\x80\x04h\x05.")
open(os.path.join(w, "deep.pickle"), "wb").write(b"\x80\x04" + b"]" * 100000 + b"a" * 99999 + b".")
EOF2
  ok $? "build synthetic and hostile snapshots with python3"
  gpy "$SRC/tools/snapshot2csv.py" -q --sites -o "$W/ring.csv" "$W/ring.pickle" 2>/dev/null
  "$B" --json "$W/ring.pickle" "$CF/direct.yaml" >"$W/ring.json" 2>"$W/ring.err"
  is "$?" 0 "ring: a history that lost its beginning still replays"
  "$B" --json "$W/ring.csv" "$CF/direct.yaml" >"$W/ringc.json" 2>/dev/null
  same "$W/ring.json" "$W/ringc.json" "ring: the figures of snapshot2csv.py's CSV"
  has "$W/ring.err" "The history starts in the middle of the run: 1 free of allocations made before it began is left out" \
    "ring: says what is missing"
  has "$W/ring.err" "_record_memory_history(max_entries=N)" "ring: and how to record it whole"
  is "$(jget "$W/ring.json" direct top_sites | cut -c 1-40)" '[{"site": "train.py:12 (step)", "bytes":' \
    "ring: the call site is the innermost frame outside torch"
  has "$W/ring.err" "the recording saw 1 allocation fail (20.00 MiB requested; the first at trace entry 9)" \
    "ring: the oom entry is a failure, counted, not replayed"
  "$B" --json "$W/ring-p2.pickle" "$CF/direct.yaml" >"$W/ring2.json" 2>/dev/null
  same "$W/ring2.json" "$W/ring.json" "ring: pickle protocol 2 reads the same"
  for c in "nohistory:no device_traces: the history was not recorded" \
    "list:is a list (torch.cuda.memory_snapshot()'s segments), which has no history" \
    "noalloc:hold no alloc entry" "evil:hold no alloc entry" "loop:hold no alloc entry" \
    "truncated:truncated pickle" "garbage:" "hugestr:runs past the end" \
    "hugememo:memo index" "getnone:memo entry 5 was never stored" "deep:is a list"; do
    f=${c%%:*}
    msg=${c#*:}
    "$B" "$W/$f.pickle" "$CF/direct.yaml" >/dev/null 2>"$W/$f.err"
    st=$?
    is "$st" 1 "$f.pickle: refused with exit status 1"
    [ -n "$msg" ] && has "$W/$f.err" "$msg" "$f.pickle: says why"
  done
  test ! -e "$W/pwned"
  ok $? "evil.pickle: nothing ran"
else
  skip "snapshots" "python3 is not available"
fi

tap_end
