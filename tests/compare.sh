#!/bin/sh
# compare.sh: TAP tests of gmr-compare (tools/compare*.c), run by make check.
#
# The table and the JSON for traces/gpt2_train.csv under the direct and limit
# policies; PyTorch's own figures under the caching policy (traces/figures.md)
# once it is registered; malformed traces (line numbers), a free of an unknown
# id, a configuration that does not load, OOMs under a small --capacity while
# another configuration still runs, standard input, usage errors, --check,
# and --suggest (its YAML loads back and gives the figures it promised); the
# usual manners (--help, --version, unknown options, exit 2 before any work);
# configurations by name; --fit (the fit runs with no OOM, 2 MiB less does
# not); --no-timing (identical runs); --suggest over several traces, on the
# --capacity device, in PyTorch's and TensorFlow's syntax; call sites at the
# peak and --diff.
#
# Finds the binary through GMR_BUILDDIR and the data through GMR_SRCDIR.

SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
TR="$SRC/traces"
CF="$SRC/config"
FX="$SRC/tests/fixtures"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-compare-test.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT

n=0
failed=0
ok() { # ok STATUS NAME: STATUS 0 passes
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then
    echo "ok $n - $2"
  else
    echo "not ok $n - $2"
    failed=1
  fi
}
skip() { # skip NAME REASON
  n=$((n + 1))
  echo "ok $n - $1 # SKIP $2"
}
diag() { echo "# $*"; }
# is GOT WANT NAME
is() {
  if [ "x$1" = "x$2" ]; then ok 0 "$3"; else
    ok 1 "$3"
    diag "  got: '$1', expected: '$2'"
  fi
}
# has FILE TEXT NAME: FILE contains TEXT (fixed string)
has() {
  if grep -F -q -- "$2" "$1"; then ok 0 "$3"; else
    ok 1 "$3"
    diag "  '$1' does not contain '$2':"
    sed 's/^/#   /' "$1" | head -20
  fi
}
# jget FILE CONFIG KEY: the value of KEY in the JSON object of CONFIG
# (gmr-compare --json prints one key per line).
jget() {
  awk -v c="\"config\": \"$2\"," -v k="\"$3\": " '
    index($0, c) { inobj = 1 }
    inobj && index($0, k) == 5 { v = substr($0, 5 + length(k)); sub(/,$/, "", v); print v; exit }
    /^  }/ { inobj = 0 }' "$1"
}

if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi

# ---- the table and the JSON for gpt2_train ------------------------------------
cat >"$W/limit-8g.yaml" <<'EOF'
# direct under a hard cap of 8 GiB of allocated bytes
policy:
  name: limit
  bytes: 8GiB
  upstream:
    name: direct
EOF
"$B" "$TR/gpt2_train.csv" "$CF/direct.yaml" "$W/limit-8g.yaml" >"$W/table.out" 2>"$W/table.err"
is "$?" 0 "table: exit status 0 when every configuration ran"
has "$W/table.out" "gpt2_train.csv: 18087 events, 9045 allocations (3 never freed), 1 stream" \
  "table: the trace's heading"
has "$W/table.out" "simulated device of 140.40 GiB" "table: the default capacity is 143771 MiB"
has "$W/table.err" "3 allocations are never freed" "table: allocations never freed are noted"
is "$(grep -c '^peak reserved  *12.66 GiB  *7.99 GiB$' "$W/table.out")" 1 \
  "table: one column per configuration, peak reserved in human units"
is "$(awk '$1 == "direct" && $2 == "limit-8g" { print "yes" }' "$W/table.out")" yes \
  "table: a heading per configuration, in order"
is "$(grep '^device allocs' "$W/table.out" | awk '{ print $3, $4 }')" "9045 8961" \
  "table: device allocs"
is "$(grep '^OOMs' "$W/table.out" | sed 's/  */ /g')" "OOMs 0 84 (ev 840)" "table: OOM counts"
has "$W/table.out" "limit-8g: 84 allocations failed (out of memory); the first at event 840, line 842" \
  "table: where the first OOM happened"
has "$W/table.out" "limit of 8.00 GiB (8589934592 bytes) reached" "table: and the policy's message"

"$B" --json "$TR/gpt2_train.csv" "$CF/direct.yaml" "$W/limit-8g.yaml" >"$W/j.json" 2>/dev/null
is "$?" 0 "json: exit status 0"
is "$(head -c 1 "$W/j.json")$(tail -n 1 "$W/j.json")" "[]" "json: one array"
is "$(grep -c '"config": ' "$W/j.json")" 2 "json: one object per configuration"
missing=""
for k in config policy events peak_reserved peak_allocated peak_requested segments_peak \
  device_allocs device_frees ooms alloc_retries seconds reserved_over_requested \
  fragmentation_at_peak rounding_loss_at_peak free_at_peak largest_free_at_peak first_oom \
  events_per_second peak_event peak_line; do
  [ -n "$(jget "$W/j.json" direct "$k")" ] || missing="$missing $k"
done
is "$missing" "" "json: every key is there"
is "$(jget "$W/j.json" direct policy)" '"direct"' "json: policy"
is "$(jget "$W/j.json" direct events)" 18087 "json: events"
# direct reserves exactly what is requested: PyTorch's peak requested for gpt2_train.
is "$(jget "$W/j.json" direct peak_reserved)" 13594206920 "json: direct peak reserved, exact"
is "$(jget "$W/j.json" direct peak_requested)" 13594206920 "json: peak requested = figures.md"
is "$(jget "$W/j.json" direct reserved_over_requested)" 1.0000 "json: reserved / requested"
is "$(jget "$W/j.json" direct segments_peak)" 824 "json: segments at the peak"
is "$(jget "$W/j.json" direct device_allocs)/$(jget "$W/j.json" direct device_frees)" 9045/9042 \
  "json: device allocs and frees (3 never freed)"
is "$(jget "$W/j.json" direct peak_line)" 4067 "json: the peak's line in the trace"
is "$(jget "$W/j.json" limit-8g policy)" '"limit(direct)"' "json: the stack of a decorator"
is "$(jget "$W/j.json" limit-8g ooms)" 84 "json: OOMs under the cap"
is "$(jget "$W/j.json" limit-8g peak_reserved)" 8578542348 "json: peak reserved under the cap"
has "$W/j.json" '"first_oom": {"event": 840, "line": 842, "message": "out of memory: limit of 8.00 GiB' \
  "json: first OOM with event, line and message"

"$B" --width 50 "$TR/gpt2_train.csv" "$CF/direct.yaml" "$W/limit-8g.yaml" >"$W/narrow.out" 2>/dev/null
is "$(grep -c '^peak reserved' "$W/narrow.out")/$(awk '$1 == "limit-8g" && NF == 1' "$W/narrow.out" | wc -l | tr -d ' ')" \
  "2/1" "table: a narrow terminal gets one block of columns per configuration that fits"

# ---- standard input, --check --------------------------------------------------
"$B" --json --check - "$CF/direct.yaml" <"$TR/resnet50_train.csv" >"$W/stdin.json" 2>"$W/stdin.err"
is "$?" 0 "stdin: '-' reads the trace from standard input; --check passes"
is "$(jget "$W/stdin.json" direct events)" 8635 "stdin: every event replayed"
is "$(jget "$W/stdin.json" direct peak_requested)" 3192592912 "stdin: resnet50 peak requested = figures.md"

# ---- malformed traces: the line is named, nothing runs, status 1 ---------------
H='Thread,Time,Action,Pointer,Size,Stream'
printf '%s\n0,1,allocate,0x10,256,0\n0,2,alocate,0x20,256,0\n' "$H" >"$W/bad-action.csv"
printf '%s\n0,1,allocate,0x10,256,0\n0,2,allocate,0x20,12x,0\n' "$H" >"$W/bad-size.csv"
printf '%s\n0,1,allocate,0x10,256,0\n0,2,allocate,0x20,256\n' "$H" >"$W/bad-fields.csv"
printf '%s\n0,1,allocate,0x10,256,0\n0,2,free,0x10,256,0\n0,3,free,0x30,256,0\n' "$H" \
  >"$W/bad-free.csv"
for c in "bad-action:3:unknown Action 'alocate'" "bad-size:3:Size '12x'" \
  "bad-fields:3:expected 6 comma-separated fields" "bad-free:4:free of 0x30, which is not live"; do
  f=${c%%:*}
  rest=${c#*:}
  line=${rest%%:*}
  what=${rest#*:}
  "$B" "$W/$f.csv" "$CF/direct.yaml" >"$W/$f.out" 2>"$W/$f.err"
  is "$?" 1 "$f: exit status 1"
  has "$W/$f.err" "$W/$f.csv:$line: $what" "$f: the message names line $line"
done

# ---- a configuration that does not load: the others still run ------------------
printf 'policy:\n  name: direct\n  bogus: [1\n' >"$W/broken.yaml"
printf 'policy:\n  name: nosuchpolicy\n' >"$W/unknown.yaml"
"$B" --json "$FX/compare-small.csv" "$W/broken.yaml" "$CF/direct.yaml" "$W/unknown.yaml" \
  >"$W/bad-cfg.json" 2>"$W/bad-cfg.err"
is "$?" 1 "bad config: exit status 1"
has "$W/bad-cfg.err" "$W/broken.yaml:4:1: malformed YAML" "bad config: file:line:column"
has "$W/bad-cfg.err" "$W/unknown.yaml:2:9: unknown policy 'nosuchpolicy'" \
  "bad config: an unknown policy, with its position"
has "$W/bad-cfg.err" "2 of 3 configurations could not run: broken unknown" \
  "bad config: says which could not run"
is "$(jget "$W/bad-cfg.json" broken status)" '"load_error"' "bad config: status in the JSON"
is "$(jget "$W/bad-cfg.json" direct status)/$(jget "$W/bad-cfg.json" direct peak_reserved)" \
  '"ok"/56623104' "bad config: the good one still ran (6 x 9 MiB)"
"$B" "$FX/compare-small.csv" "$W/broken.yaml" "$CF/direct.yaml" >"$W/bad-cfg.out" 2>/dev/null
has "$W/bad-cfg.out" "broken: could not run: $W/broken.yaml:4:1:" "bad config: noted under the table"

# ---- the page's captions, without a browser (tests/compare-html.sh renders it) ----
"$B" --html "$W/small.html" "$FX/compare-small.csv" "$CF/direct.yaml" >/dev/null 2>&1
is "$?" 0 "html: written"
has "$W/small.html" '<b>direct</b> held <b>54.00 MiB</b> in 6 reservations for 54.00 MiB requested' \
  "html: the caption states the peak (6 x 9 MiB, one reservation each)"
is "$(grep -c '<svg class="chart timeline"' "$W/small.html")/$(grep -c '<svg class="chart segmap"' "$W/small.html")" \
  1/1 "html: one timeline and one segment map"
has "$W/small.html" 'data-pts="0 9216 9216 9216,1 18432 18432 18432,' \
  "html: the timeline's points, one per event on a short trace (KiB)"

# ---- OOM under a small --capacity; the other configurations still run ----------
"$B" --capacity 40MiB --json "$FX/compare-small.csv" "$CF/direct.yaml" "$W/limit-8g.yaml" \
  >"$W/oom.json" 2>"$W/oom.err"
is "$?" 0 "oom: an OOM is a result (exit status 0)"
is "$(jget "$W/oom.json" direct ooms)" 2 "oom: 2 of 6 allocations of 9 MiB fail on 40 MiB"
has "$W/oom.json" '"first_oom": {"event": 4, "line": 6, "message": "out of memory. Tried to allocate 9.00 MiB. The device has a total capacity of 40.00 MiB' \
  "oom: event, line and the policy's message"
is "$(jget "$W/oom.json" limit-8g status)/$(jget "$W/oom.json" limit-8g ooms)" '"ok"/2' \
  "oom: the next configuration still runs on its own fresh device"
"$B" --capacity 1x "$FX/compare-small.csv" "$CF/direct.yaml" >/dev/null 2>"$W/cap.err"
is "$?" 2 "usage: a bad --capacity is a usage error"
has "$W/cap.err" "--capacity: '1x' is not a size" "usage: and says why"
"$B" "$FX/compare-small.csv" >/dev/null 2>&1
is "$?" 2 "usage: no CONFIG"
"$B" --frobnicate "$FX/compare-small.csv" "$CF/direct.yaml" >/dev/null 2>&1
is "$?" 2 "usage: unknown option"
"$B" "$W/no-such.csv" "$CF/direct.yaml" >/dev/null 2>"$W/nofile.err"
is "$?" 1 "a missing trace: exit status 1"

# ---- the caching policy: PyTorch's own figures ---------------------------------
if "$B" "$FX/compare-small.csv" "$CF/pytorch.yaml" >/dev/null 2>"$W/probe.err"; then
  "$B" --json "$TR/gpt2_train.csv" "$CF/pytorch.yaml" "$CF/direct.yaml" >"$W/pt.json" 2>/dev/null
  is "$(jget "$W/pt.json" pytorch peak_reserved)" 15286140928 \
    "caching: gpt2_train peak reserved = PyTorch's 15286140928"
  is "$(jget "$W/pt.json" pytorch segments_peak)" 154 "caching: gpt2_train peak segments = 154"
  is "$(jget "$W/pt.json" pytorch reserved_over_requested)" 1.1245 "caching: gpt2_train 1.1245"
  "$B" --json "$TR/gpt2_varlen_train.csv" "$CF/pytorch-max-split-128.yaml" >"$W/ms.json" 2>/dev/null
  c=pytorch-max-split-128
  is "$(jget "$W/ms.json" $c peak_reserved)" 58812530688 \
    "caching: max_split_size_mb:128 on gpt2_varlen reserves 58812530688"
  is "$(jget "$W/ms.json" $c peak_requested)" 16776574672 \
    "caching: of 16776574672 requested"
  is "$(jget "$W/ms.json" $c reserved_over_requested)" 3.5056 "caching: 3.5056 times"
  # 6 x 9 MiB: caching takes three 20 MiB segments, which 56 MiB cannot hold;
  # direct needs 54 MiB and still runs.
  "$B" --json --capacity 56MiB "$FX/compare-small.csv" "$CF/pytorch.yaml" "$CF/direct.yaml" \
    >"$W/pt-oom.json" 2>/dev/null
  is "$?" 0 "caching oom: exit status 0"
  is "$(jget "$W/pt-oom.json" pytorch ooms)" 2 "caching oom: 2 OOMs on 56 MiB"
  has "$W/pt-oom.json" '"first_oom": {"event": 4, "line": 6, "message": ' "caching oom: where"
  is "$(jget "$W/pt-oom.json" direct ooms)/$(jget "$W/pt-oom.json" direct peak_reserved)" \
    0/56623104 "caching oom: direct fits in 54 MiB and still runs"

  # Fragmentation at the peak: three 20 MiB segments, each with two 9 MiB
  # blocks and a 2 MiB hole: 1 - 2 MiB / 6 MiB.
  "$B" --json --html "$W/pt-small.html" "$FX/compare-small.csv" "$CF/pytorch.yaml" \
    >"$W/pt-small.json" 2>/dev/null
  is "$(jget "$W/pt-small.json" pytorch free_at_peak)/$(jget "$W/pt-small.json" pytorch largest_free_at_peak)" \
    6291456/2097152 "caching: free and largest free block at the peak"
  is "$(jget "$W/pt-small.json" pytorch fragmentation_at_peak)" 0.6667 \
    "caching: fragmentation at the peak = 1 - 2/6"
  has "$W/pt-small.html" 'held <b>60.00 MiB</b> in 3 segments for 54.00 MiB requested' \
    "caching: the caption counts the segments of the map"
  has "$W/pt-small.html" 'It is split into many holes (fragmentation 67%: the largest is 2.00 MiB)' \
    "caching: and explains the holes"

  # --suggest: the YAML loads back and gives the figures it printed.
  "$B" --suggest caching "$TR/gpt2_train.csv" >"$W/best.yaml" 2>"$W/suggest.err"
  is "$?" 0 "suggest: exit status 0"
  has "$W/best.yaml" "name: caching" "suggest: prints a caching configuration"
  promised=$(awk '/^#   peak reserved \(bytes\)/ { print $NF }' "$W/best.yaml")
  default=$(awk '/^#   peak reserved \(bytes\)/ { print $(NF-1) }' "$W/best.yaml")
  is "$default" 15286140928 "suggest: next to the defaults' figures"
  "$B" --json "$TR/gpt2_train.csv" "$W/best.yaml" >"$W/best.json" 2>"$W/best.err"
  is "$?" 0 "suggest: the YAML loads back"
  is "$(jget "$W/best.json" best peak_reserved)" "$promised" \
    "suggest: and replays to the peak reserved it promised ($promised)"
  is "$(jget "$W/best.json" best ooms)" 0 "suggest: with no OOM"
  [ -n "$promised" ] && [ "$promised" -le 15286140928 ]
  ok $? "suggest: no worse than the defaults"
  "$B" --json --suggest caching "$TR/gpt2_train.csv" "$CF/direct.yaml" >"$W/sj.json" 2>/dev/null
  is "$(grep -c '"config": ' "$W/sj.json")" 3 "suggest --json: the configs, the defaults, the winner"
  is "$(jget "$W/sj.json" caching-defaults peak_reserved)" 15286140928 \
    "suggest --json: the defaults' figures"
  is "$(jget "$W/sj.json" caching-suggested peak_reserved)" "$promised" \
    "suggest --json: the winner's figures"
  has "$W/sj.json" '"yaml": "policy:\n  name: caching\n' "suggest --json: with its YAML"

  # --check: the caching policy's invariant walker after every event.
  "$B" --json --check "$TR/resnet50_train.csv" "$CF/pytorch.yaml" "$CF/pytorch-expandable.yaml" \
    >"$W/check.json" 2>/dev/null
  is "$?" 0 "check: every invariant holds after every event of resnet50_train"
  is "$(jget "$W/check.json" pytorch peak_reserved)" 3797942272 \
    "check: resnet50 peak reserved = PyTorch's 3797942272"
else
  why=$(grep -o "unknown policy '[a-z]*'" "$W/probe.err" | head -n 1)
  reason="caching policy not available: ${why:-$(head -n 1 "$W/probe.err" | cut -c 1-100)}"
  for t in "gpt2_train default" "gpt2_train segments" "gpt2_train ratio" "max-split-128 reserved" \
    "max-split-128 requested" "max-split-128 ratio" "oom status" "oom count" "oom where" \
    "oom direct" "suggest status" "suggest yaml" "suggest defaults" "suggest loads" \
    "suggest figures" "suggest no OOM" "suggest no worse" "suggest json count" \
    "suggest json defaults" "suggest json winner" "suggest json yaml" "check status" \
    "check resnet50" "small free" "small fragmentation" "small caption" "small holes"; do
    skip "caching: $t" "$reason"
  done
fi

# ---- the BFC policy: --suggest finds growth, not the greedy default ------------
if "$B" "$FX/compare-small.csv" "$CF/tf-growth.yaml" >/dev/null 2>&1; then
  "$B" --suggest bfc "$TR/gpt2_train.csv" >"$W/bfc.yaml" 2>/dev/null
  is "$?" 0 "suggest bfc: exit status 0"
  promised=$(awk '/^#   peak reserved \(bytes\)/ { print $NF }' "$W/bfc.yaml")
  default=$(awk '/^#   peak reserved \(bytes\)/ { print $(NF-1) }' "$W/bfc.yaml")
  "$B" --json "$TR/gpt2_train.csv" "$W/bfc.yaml" "$CF/tf-greedy.yaml" >"$W/bfc.json" 2>/dev/null
  is "$?" 0 "suggest bfc: the YAML loads back"
  is "$(jget "$W/bfc.json" bfc peak_reserved)" "$promised" \
    "suggest bfc: and replays to the peak it promised ($promised)"
  is "$(jget "$W/bfc.json" tf-greedy peak_reserved)" "$default" \
    "suggest bfc: the defaults are TensorFlow's greedy ($default)"
  [ -n "$promised" ] && [ -n "$default" ] && [ "$promised" -lt "$default" ]
  ok $? "suggest bfc: reserves less than greedy"
else
  for t in status loads figures defaults less; do skip "suggest bfc: $t" "bfc policy not available"; done
fi

# ---- --fit: the smallest device with no OOM, the same measure for every policy --
"$B" --json --fit --no-timing "$FX/compare-small.csv" "$CF/direct.yaml" >"$W/fit.json" 2>/dev/null
is "$?" 0 "fit: exit status 0"
is "$(jget "$W/fit.json" direct fit_capacity)" 56623104 "fit: direct needs exactly 6 x 9 MiB"
"$B" --fit --no-timing "$FX/compare-small.csv" "$CF/direct.yaml" >"$W/fit.out" 2>/dev/null
is "$(grep '^fit capacity' "$W/fit.out" | sed 's/  */ /g')" "fit capacity (no OOM) 54.00 MiB" \
  "fit: a row of the table"
"$B" --html "$W/fit.html" --fit "$FX/compare-small.csv" "$CF/direct.yaml" >/dev/null 2>&1
has "$W/fit.html" "<tr><td>fit capacity (no OOM)</td><td>54.00 MiB</td></tr>" "fit: and of the page"
for c in pytorch tf-growth tf-greedy; do
  if "$B" "$FX/compare-small.csv" "$CF/$c.yaml" >/dev/null 2>&1; then
    "$B" --json --fit "$TR/resnet50_train.csv" "$CF/$c.yaml" >"$W/fit-$c.json" 2>/dev/null
    fit=$(jget "$W/fit-$c.json" "$c" fit_capacity)
    below=$((fit - 2097152))
    "$B" --json --capacity "$fit" "$TR/resnet50_train.csv" "$CF/$c.yaml" >"$W/at.json" 2>/dev/null
    "$B" --json --capacity "$below" "$TR/resnet50_train.csv" "$CF/$c.yaml" >"$W/below.json" 2>/dev/null
    is "$(jget "$W/at.json" "$c" ooms)" 0 "fit: $c runs resnet50_train with no OOM on its fit ($fit)"
    [ "$(jget "$W/below.json" "$c" ooms)" -gt 0 ]
    ok $? "fit: $c OOMs 2 MiB below it"
  else
    skip "fit: $c at its fit" "policy not available"
    skip "fit: $c below its fit" "policy not available"
  fi
done
"$B" --json --fit --capacity 40MiB "$FX/compare-small.csv" "$CF/direct.yaml" >"$W/fitup.json" 2>/dev/null
is "$(jget "$W/fitup.json" direct fit_capacity)/$(jget "$W/fitup.json" direct ooms)" 56623104/2 \
  "fit: found above --capacity when the stated device is too small"

# ---- stable output: --no-timing, and --html by default --------------------------
for k in 1 2; do
  "$B" --json --no-timing "$TR/resnet50_train.csv" "$CF/direct.yaml" >"$W/st$k.json" 2>/dev/null
  "$B" --no-timing "$TR/resnet50_train.csv" "$CF/direct.yaml" >"$W/st$k.out" 2>/dev/null
  "$B" --html "$W/st$k.html" "$TR/resnet50_train.csv" "$CF/direct.yaml" >/dev/null 2>&1
done
cmp -s "$W/st1.json" "$W/st2.json"
ok $? "no-timing: two runs give identical JSON"
cmp -s "$W/st1.out" "$W/st2.out"
ok $? "no-timing: two runs give identical tables"
cmp -s "$W/st1.html" "$W/st2.html"
ok $? "html: two runs give identical pages (no timing by default)"
is "$(jget "$W/st1.json" direct seconds)/$(grep -c 'replay time' "$W/st1.out")/$(grep -c 'replay time' "$W/st1.html")" \
  "null/0/0" "no-timing: no replay time in the JSON, the table or the page"
"$B" --html "$W/t.html" --timing "$FX/compare-small.csv" "$CF/direct.yaml" >/dev/null 2>&1
has "$W/t.html" "<td>replay time</td>" "html: --timing puts the times back"

# ---- --suggest that can be deployed: several traces, --capacity, the framework's syntax --
if "$B" "$FX/compare-small.csv" "$CF/pytorch.yaml" >/dev/null 2>&1; then
  "$B" --suggest caching "$TR/gpt2_train.csv" "$TR/resnet50_train.csv" >"$W/multi.yaml" 2>/dev/null
  is "$?" 0 "suggest over two traces: exit status 0"
  is "$(grep -c '^#   peak reserved (bytes)' "$W/multi.yaml")" 2 "suggest over two traces: figures for each"
  for tr in gpt2_train resnet50_train; do
    promised=$(awk -v t="# $TR/$tr.csv " 'index($0, t) == 1 { on = 1 } on && /^#   peak reserved \(bytes\)/ { print $NF; exit }' "$W/multi.yaml")
    "$B" --json "$TR/$tr.csv" "$W/multi.yaml" >"$W/multi-$tr.json" 2>/dev/null
    is "$(jget "$W/multi-$tr.json" multi peak_reserved)/$(jget "$W/multi-$tr.json" multi ooms)" \
      "$promised/0" "suggest over two traces: on $tr it replays to what it promised, no OOM"
  done
  conf=$(sed -n 's/^#   export PYTORCH_CUDA_ALLOC_CONF=//p' "$W/multi.yaml")
  [ -n "$conf" ]
  ok $? "suggest: PyTorch's syntax, PYTORCH_CUDA_ALLOC_CONF=$conf"
  printf 'policy:\n  name: caching\n  pytorch_alloc_conf: "%s"\n' "$conf" >"$W/conf.yaml"
  frac=$(sed -n 's/^  per_process_memory_fraction: //p' "$W/multi.yaml")
  [ -n "$frac" ] && printf '  per_process_memory_fraction: %s\n' "$frac" >>"$W/conf.yaml"
  "$B" --json "$TR/gpt2_train.csv" "$W/conf.yaml" "$W/multi.yaml" >"$W/conf.json" 2>/dev/null
  is "$(jget "$W/conf.json" conf peak_reserved)" "$(jget "$W/conf.json" multi peak_reserved)" \
    "suggest: the PYTORCH_CUDA_ALLOC_CONF string gives the YAML's figures"
  if [ -n "$frac" ]; then
    cap=$(sed -n 's/^#   torch.cuda.set_per_process_memory_fraction(\([0-9]*\) .*/\1/p' "$W/multi.yaml")
    want=$(awk -v f="$frac" 'BEGIN { printf "%.0f", int(f * 143771 * 1048576) }')
    is "$cap" "$want" "suggest: the memory cap as absolute bytes over the device's total"
  else
    skip "suggest: the memory cap as absolute bytes" "no fraction suggested"
  fi
  "$B" --json --fit --suggest caching "$FX/compare-small.csv" >"$W/sfit.json" 2>/dev/null
  is "$(jget "$W/sfit.json" caching-defaults fit_capacity)" 62914560 \
    "suggest --fit: the defaults' fit (three 20 MiB segments)"
  "$B" --suggest caching "$TR/gpt2_train.csv" "$TR/resnet50_train.csv" "$CF/direct.yaml" \
    >/dev/null 2>"$W/multi-cfg.err"
  is "$?" 2 "suggest over two traces with a CONFIG: a usage error"

  # --capacity honoured: on 14 GiB the defaults (14.24 GiB) OOM; the suggestion must not.
  "$B" --capacity 14GiB --suggest caching "$TR/gpt2_train.csv" >"$W/cap14.yaml" 2>/dev/null
  is "$?" 0 "suggest --capacity 14GiB: found one"
  has "$W/cap14.yaml" "# on a device of 14.00 GiB" "suggest --capacity 14GiB: says for which device"
  has "$W/cap14.yaml" "The defaults run out of memory on this device; this does not." \
    "suggest --capacity 14GiB: the defaults OOM there"
  "$B" --json --capacity 14GiB "$TR/gpt2_train.csv" "$W/cap14.yaml" >"$W/cap14.json" 2>/dev/null
  is "$(jget "$W/cap14.json" cap14 ooms)" 0 "suggest --capacity 14GiB: the suggestion runs with no OOM on 14 GiB"
  "$B" --capacity 12GiB --suggest caching "$TR/gpt2_train.csv" >"$W/cap12.yaml" 2>"$W/cap12.err"
  is "$?" 1 "suggest --capacity 12GiB (below the 12.66 GiB requested): exit status 1"
  is "$(wc -c <"$W/cap12.yaml" | tr -d ' ')" 0 "suggest --capacity 12GiB: nothing printed that would OOM"
  has "$W/cap12.err" "so none is suggested" "suggest --capacity 12GiB: says so"
else
  for t in status figures gpt2 resnet50 conf conf-figures cap-bytes sfit usage c14 c14-device c14-defaults c14-ooms c12 c12-empty c12-says; do
    skip "suggest deploy: $t" "caching policy not available"
  done
fi
if "$B" "$FX/compare-small.csv" "$CF/tf-growth.yaml" >/dev/null 2>&1; then
  "$B" --suggest bfc "$TR/gpt2_train.csv" >"$W/bfcd.yaml" 2>/dev/null
  lim=$(sed -n 's/^  memory_limit: \([0-9]*\)MiB$/\1/p' "$W/bfcd.yaml")
  if [ -n "$lim" ]; then
    has "$W/bfcd.yaml" "LogicalDeviceConfiguration(memory_limit=$lim)" \
      "suggest bfc: TensorFlow's memory_limit in MiB, as the YAML's"
    has "$W/bfcd.yaml" "export XLA_PYTHON_CLIENT_MEM_FRACTION=" "suggest bfc: and JAX's variable"
  else
    has "$W/bfcd.yaml" "# TensorFlow:" "suggest bfc: TensorFlow's settings"
    has "$W/bfcd.yaml" "# JAX:" "suggest bfc: and JAX's"
  fi
fi

# ---- call sites and --diff -------------------------------------------------------
cat >"$W/before.csv" <<'EOF2'
Thread,Time,Action,Pointer,Size,Stream,Site
0,1,allocate,0x10,9437184,0,model.py:10 (embed)
0,2,allocate,0x20,9437184,0,model.py:20 (attn)
0,3,allocate,0x30,9437184,0,model.py:20 (attn)
0,4,free,0x20,9437184,0
0,5,allocate,0x40,4194304,0,train.py:5 (loss, scaled)
0,6,free,0x30,9437184,0
EOF2
cat >"$W/after.csv" <<'EOF2'
Thread,Time,Action,Pointer,Size,Stream,Site
0,1,allocate,0x10,9437184,0,model.py:10 (embed)
0,2,allocate,0x20,9437184,0,model.py:20 (attn)
0,3,allocate,0x30,9437184,0,model.py:20 (attn)
0,3,allocate,0x50,9437184,0,model.py:20 (attn)
0,4,free,0x20,9437184,0
0,5,allocate,0x40,8388608,0,train.py:5 (loss, scaled)
0,6,free,0x30,9437184,0
EOF2
"$B" --no-timing "$W/before.csv" "$CF/direct.yaml" >"$W/sites.out" 2>/dev/null
is "$?" 0 "sites: a trace with a Site column replays"
has "$W/sites.out" "Call sites holding the most memory at each configuration's peak" "sites: the table names them"
is "$(grep -A2 '^  direct (peak at event 2, line 4):' "$W/sites.out" | tail -n 2 | sed 's/  */ /g')" \
  " 18.00 MiB 2 allocations model.py:20 (attn)
 9.00 MiB 1 allocation model.py:10 (embed)" "sites: largest first, with their live allocations"
"$B" --json "$W/before.csv" "$CF/direct.yaml" >"$W/sites.json" 2>/dev/null
is "$(jget "$W/sites.json" direct top_sites)" \
  '[{"site": "model.py:20 (attn)", "bytes": 18874368, "allocations": 2}, {"site": "model.py:10 (embed)", "bytes": 9437184, "allocations": 1}]' \
  "sites: top_sites in the JSON"
"$B" --html "$W/sites.html" "$W/before.csv" "$CF/direct.yaml" >/dev/null 2>&1
has "$W/sites.html" "<tr><td>18.00 MiB</td><td>2</td><td>model.py:20 (attn)</td></tr>" "sites: and the page"
is "$(jget "$W/j.json" direct top_sites)" "[]" "sites: none in a trace without the column"

"$B" --diff --fit "$W/before.csv" "$W/after.csv" "$CF/direct.yaml" >"$W/diff.out" 2>/dev/null
is "$?" 0 "diff: exit status 0"
is "$(grep '^  peak reserved' "$W/diff.out" | sed 's/  */ /g')" \
  " peak reserved 27.00 MiB 36.00 MiB +9.00 MiB (+33.3 %)" "diff: the peaks and the change"
has "$W/diff.out" "+9.00 MiB     model.py:20 (attn) (18.00 MiB -> 27.00 MiB)" "diff: the call site that grew"
has "$W/diff.out" "  fit capacity (no OOM)" "diff: with --fit, the fit of each"
"$B" --json --diff "$W/before.csv" "$W/after.csv" "$CF/direct.yaml" >"$W/diff.json" 2>/dev/null
is "$(jget "$W/diff.json" direct peak_reserved_change)" 9437184 "diff json: the change in bytes"
is "$(jget "$W/diff.json" direct sites_grew)" '[{"site": "model.py:20 (attn)", "before": 18874368, "after": 28311552}]' \
  "diff json: the sites that grew"
"$B" --diff "$W/before.csv" "$W/after.csv" >/dev/null 2>&1
is "$?" 2 "diff without a CONFIG: a usage error"

# ---- the stitch policy: config/stitch.yaml runs like the others ------------------
"$B" --json --check "$TR/resnet50_train.csv" "$CF/stitch.yaml" "$CF/pytorch-expandable.yaml" \
  >"$W/stitch.json" 2>/dev/null
is "$?" 0 "stitch: config/stitch.yaml replays resnet50 with --check"
st=$(jget "$W/stitch.json" stitch peak_reserved)
ex=$(jget "$W/stitch.json" pytorch-expandable peak_reserved)
[ -n "$st" ] && [ -n "$ex" ] && [ "$st" -lt "$ex" ] && [ "$st" -le $((3192592912 * 102 / 100)) ]
ok $? "stitch: peak reserved $st <= 1.02 x requested and below expandable ($ex)"
"$B" --suggest stitch "$TR/resnet50_train.csv" >"$W/sst.yaml" 2>/dev/null
is "$?" 0 "suggest stitch: exit status 0"
promised=$(awk '/^#   peak reserved \(bytes\)/ { print $NF }' "$W/sst.yaml")
"$B" --json "$TR/resnet50_train.csv" "$W/sst.yaml" >"$W/stitch2.json" 2>/dev/null
is "$(jget "$W/stitch2.json" sst peak_reserved)" "$promised" \
  "suggest stitch: the YAML loads back and replays to the peak it promised ($promised)"
[ -n "$promised" ] && [ "$promised" -le "$st" ]
ok $? "suggest stitch: no worse than the defaults ($st)"

# The page draws the pages two stitched blocks share: outlined at both
# blocks, each titled with the page's number, so the halves can be matched.
"$B" --html "$W/stitch.html" "$TR/resnet50_train.csv" "$CF/stitch.yaml" >/dev/null 2>&1
is "$?" 0 "stitch: --html writes the page"
grep -q "a page shared by two blocks" "$W/stitch.html"
ok $? "stitch: the segment map's legend names shared pages"
grep -o '<title>page #[0-9]*, shared: its tail holds [a-z]*' "$W/stitch.html" |
  sed 's/<title>page #//; s/, shared: its tail holds / /' | sort -u |
  awk '{ n[$1]++; pages++ } END { for (p in n) if (n[p] != 2) bad++; exit (pages && !bad) ? 0 : 1 }'
ok $? "stitch: every shared page is drawn at both of its blocks (one half each)"

# ---- --suggest of a policy without a search space --------------------------------
"$B" --suggest direct "$W/no-such.csv" >/dev/null 2>"$W/sd.err"
is "$?" 2 "suggest: a policy with nothing to search is a usage error, found before the trace is read"
has "$W/sd.err" "--suggest direct: no search space" "suggest: and says so"
"$B" --suggest nosuch "$W/no-such.csv" >/dev/null 2>"$W/sn.err"
is "$?" 2 "suggest: an unknown policy is a usage error"
has "$W/sn.err" "--suggest nosuch: unknown policy; the policies are: direct, limit, caching, bfc" \
  "suggest: and names the policies"

# ---- the usual manners: --help, --version, unknown options, usage errors ---------
"$B" --help >"$W/help.out" 2>&1
is "$?" 0 "--help: exit status 0"
has "$W/help.out" "usage: gmr-compare [OPTIONS] TRACE CONFIG..." "--help: prints the usage"
"$B" -h >/dev/null 2>&1
is "$?" 0 "-h: exit status 0"
"$B" --version >"$W/version.out" 2>&1
is "$?" 0 "--version: exit status 0"
is "$(cat "$W/version.out")" "gmr-compare (gmr) $(sed -n 's/^#define GMR_VERSION_MAJOR //p' "$SRC/include/gmr.h").$(sed -n 's/^#define GMR_VERSION_MINOR //p' "$SRC/include/gmr.h").$(sed -n 's/^#define GMR_VERSION_PATCH //p' "$SRC/include/gmr.h")" \
  "--version: the library's version"
"$B" --foo "$W/no-such.csv" direct >/dev/null 2>"$W/foo.err"
is "$?" 2 "unknown option: exit status 2, before the trace is read"
has "$W/foo.err" "unknown option '--foo'" "unknown option: says so"
"$B" -x "$W/no-such.csv" direct >/dev/null 2>"$W/x.err"
has "$W/x.err" "unknown option '-x'" "unknown short option: says so"
"$B" "$W/no-such.csv" direct --capacity >/dev/null 2>"$W/nv.err"
is "$?" 2 "an option without its value: exit status 2"
has "$W/nv.err" "--capacity needs a value" "an option without its value: says so"
"$B" --width 5 "$W/no-such.csv" direct >/dev/null 2>&1
is "$?" 2 "--width out of range: exit status 2"

# ---- configurations by name: ./config, then the share directory ----------------
(cd "$SRC" && "$B" --json "$FX/compare-small.csv" direct) >"$W/byname.json" 2>/dev/null
is "$(jget "$W/byname.json" direct peak_reserved)" 56623104 "config by name: ./config/direct.yaml"
has "$W/byname.json" '"source": "config/direct.yaml"' "config by name: the path it found"
(cd "$W" && "$B" --json "$FX/compare-small.csv" nosuchname) >"$W/noname.json" 2>"$W/noname.err"
is "$?" 2 "config by name: an unknown name is a usage error (tests/compare-config.sh)"
has "$W/noname.err" "no configuration named 'nosuchname': not a file, and neither ./config/nosuchname.yaml nor" \
  "config by name: says where it looked"

echo "1..$n"
exit $failed
