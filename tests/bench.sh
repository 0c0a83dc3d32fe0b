#!/bin/sh
# bench.sh: TAP test of gmr-bench (tools/bench.c) on the simulated device.
#
# A short run must produce one JSON record per configuration and size, with
# one aggregate figure per thread count, and the table must carry the same
# rows; gmr-bench refuses a run whose runtime did not count exactly the
# pairs it made, so exit status 0 also means the counts matched.  Bad input
# gets exit status 2 (options) or 1 (configurations) and a sentence saying
# what was wrong.
set -u
bench="${GMR_BUILDDIR:-.}/tools/gmr-bench"
src="${GMR_SRCDIR:-.}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-bench-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
failed=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

cat >"$tmp/limit-direct.yaml" <<'EOF'
policy:
  name: limit
  bytes: 1GiB
  upstream:
    name: direct
EOF

run="--reps 3 --pairs 2000 --threads 1,2,4 --sizes 4KiB,1MiB"
"$bench" $run --json "$src/config/direct.yaml" "$tmp/limit-direct.yaml" >"$tmp/out.json" 2>"$tmp/err"
ok $? "a JSON run of two configurations exits 0"

if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/out.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
want = [("direct", "direct", 4096), ("direct", "direct", 1048576),
        ("limit-direct", "limit(direct)", 4096), ("limit-direct", "limit(direct)", 1048576)]
got = [(r["contender"], r["policy"], r["size"]) for r in rows]
assert got == want, got
for r in rows:
    assert r["backend"] == "sim" and r["reps"] == 3 and r["pairs_per_rep"] == 2000, r
    assert [t["threads"] for t in r["threads"]] == [1, 2, 4], r
    assert r["ns_per_pair_min"] <= r["ns_per_pair"] <= r["ns_per_pair_max"], r
    assert all(t["ns_per_pair"] > 0 for t in r["threads"]), r
    ratio = r["ns_per_pair"] / r["threads"][-1]["ns_per_pair"]
    assert abs(r["rate_max_threads_vs_one"] - ratio) < 0.01, r
EOF
  ok $? "4 records (2 configs x 4KiB, 1MiB), each with 3 repetitions of 2000 pairs at 1, 2, 4 threads"
else
  grep -c '"contender"' "$tmp/out.json" | grep -qx 4
  ok $? "4 records (2 configs x 2 sizes) (python3 absent: counted only)"
fi

"$bench" --reps 1 --pairs 500 --threads 1,3 --sizes 512 --json-file "$tmp/t.json" \
  "$src/config/direct.yaml" >"$tmp/table" 2>"$tmp/err"
ok $? "a table run with --json-file exits 0"
grep -q '^direct  *direct  *512 bytes ' "$tmp/table"
ok $? "the table has the row: direct, policy direct, 512 bytes"
grep -q '  *1T  *3T | *rate$' "$tmp/table"
ok $? "the table's header names the thread counts 1T and 3T"
grep -q '"threads": 3,' "$tmp/t.json"
ok $? "the JSON file holds the 3-thread figure"

ncpu=$(nproc 2>/dev/null || echo 1)
if [ "$ncpu" -ge 2 ]; then
  "$bench" --pin --reps 1 --pairs 500 --threads 2 --sizes 4KiB --json "$src/config/direct.yaml" \
    >"$tmp/pin.json" 2>"$tmp/err"
  st=$?
  [ "$st" -eq 0 ] && grep -q '"pinned": true' "$tmp/pin.json" && ! grep -q "distinct CPUs" "$tmp/err"
  ok $? "--pin: 2 threads run on 2 distinct CPUs"
else
  n=$((n + 1))
  echo "ok $n # SKIP one CPU: --pin cannot spread threads"
fi

# The churn workloads: random sizes (one record per configuration, per
# thread count) and the live-blocks sweep (one record with one point per
# count); the runtime's own counts must match, or gmr-bench fails.
"$bench" --workloads random,sweep --live 32 --sweep-live 10,100 --pairs 300 --reps 1 \
  --threads 1,2 --json-file "$tmp/churn.json" "$src/config/pytorch.yaml" \
  "$src/config/tf-greedy.yaml" >"$tmp/churn.txt" 2>"$tmp/err"
ok $? "random and sweep workloads of two configurations exit 0"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/churn.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
got = [(r["workload"], r["contender"]) for r in rows]
assert got == [("random", "pytorch"), ("random", "tf-greedy"),
               ("sweep", "pytorch"), ("sweep", "tf-greedy")], got
for r in rows[:2]:
    assert r["live_blocks"] == 32 and r["size_min"] == 512 and r["size_max"] == 64 << 20, r
    assert r["steps_per_rep"] == 300 and [t["threads"] for t in r["threads"]] == [1, 2], r
    assert all(t["ns_per_op"] > 0 for t in r["threads"]), r
for r in rows[2:]:
    pts = r["points"]
    assert [p["live_blocks"] for p in pts] == [10, 100] and r["size_max"] == 4 << 20, r
    assert abs(r["growth"] - max(p["ns_per_op"] for p in pts) / pts[0]["ns_per_op"]) < 0.01, r
EOF
  ok $? "2 random records (32 live, 1 and 2 threads) and 2 sweep records (10 and 100 live)"
  python3 "$src/scripts/sweep-svg.py" "$tmp/churn.json" "$tmp/sweep.svg" "test" &&
    grep -q "<polyline" "$tmp/sweep.svg" && grep -q "tf-greedy (bfc)" "$tmp/sweep.svg"
  ok $? "scripts/sweep-svg.py draws the sweep with one line per configuration"
  cp "$tmp/churn.json" "$tmp/churn2.json"
  python3 "$src/scripts/sweep-svg.py" "$tmp/churn.json" "$tmp/churn2.json" "$tmp/sweep2.svg" &&
    test "$(grep -c "<polyline" "$tmp/sweep2.svg")" = 4 &&
    grep -q 'tf-greedy (bfc): [0-9.]*x, [+-][0-9]* ns' "$tmp/sweep2.svg"
  ok $? "scripts/sweep-svg.py draws the sweeps of two JSON files, with the cost added"
else
  grep -c '"workload": "sweep"' "$tmp/churn.json" | grep -qx 2
  ok $? "2 sweep records (python3 absent: counted only)"
fi
grep -q 'live-blocks sweep' "$tmp/churn.txt" && grep -q 'random sizes' "$tmp/churn.txt"
ok $? "the tables name both workloads"

# The miss workload: microseconds per miss by pages mapped, for a policy that
# maps pages; gmr-bench itself refuses a figure whose page maps are not the
# pages asked for, and the runtime's counts must match.
"$bench" --workloads miss --miss-pages 1,8 --reps 3 --json "$src/config/stitch.yaml" \
  "$src/config/pytorch.yaml" >"$tmp/miss.json" 2>"$tmp/err"
ok $? "the miss workload of stitch (and of a policy that maps no pages) exits 0"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/miss.json" <<'EOF2'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [(r["workload"], r["contender"]) for r in rows] == [("miss", "stitch")], rows
r = rows[0]
assert r["page_size"] == 2 << 20 and [p["pages"] for p in r["points"]] == [1, 8], r
assert all(p["new_us"] > 0 and p["held_us"] > 0 for p in r["points"]), r
EOF2
  ok $? "one miss record: 1 and 8 pages, new and held figures"
else
  grep -q '"workload": "miss"' "$tmp/miss.json"
  ok $? "one miss record (python3 absent: found only)"
fi
"$bench" --workloads miss --miss-pages 2 --reps 1 "$src/config/pytorch.yaml" >"$tmp/miss.txt"
grep -q "no page maps" "$tmp/miss.txt"
ok $? "the miss table says a caching policy maps no pages"

check_refusal() { # expected-status needle description args...
  want=$1 needle=$2 what=$3
  shift 3
  "$bench" "$@" >"$tmp/out" 2>"$tmp/err"
  st=$?
  if [ "$st" -eq "$want" ] && grep -q -- "$needle" "$tmp/err"; then ok 0 "$what"; else
    ok 1 "$what"
    echo "# status $st (expected $want); stderr: $(cat "$tmp/err")"
  fi
}
check_refusal 2 "'0' is not a size in bytes above 0" "--sizes 0 is refused" --sizes 0 x.yaml
check_refusal 2 "'0' is not a thread count in \[1, 64\]" "--threads 0 is refused" --threads 1,0 x.yaml
check_refusal 2 "unknown option '--frobnicate'" "an unknown option is refused" --frobnicate x.yaml
check_refusal 2 "'churn' is not one of pair, random, sweep, miss" "an unknown workload is refused" \
  --workloads pair,churn x.yaml
check_refusal 2 "is not LO,HI with LO <= HI" "a reversed size range is refused" \
  --random-range 64MiB,512 x.yaml
check_refusal 2 "no configuration given" "no configuration is refused" --reps 1
check_refusal 2 "--torch needs --device cuda" "--torch without --device cuda is refused" \
  --torch x.so "$src/config/direct.yaml"
check_refusal 1 "nonexistent.yaml" "a missing configuration file is named" --pairs 10 \
  "$tmp/nonexistent.yaml"
printf 'policy:\n  name: direct\n  frobs: 1\n' >"$tmp/bad.yaml"
check_refusal 1 "bad.yaml:3" "a bad configuration is reported with its line" --pairs 10 \
  "$tmp/bad.yaml"
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  n=$((n + 1))
  echo "ok $n # SKIP a GPU is present: --device cuda would run"
else
  "$bench" --device cuda "$src/config/direct.yaml" >"$tmp/out" 2>"$tmp/err"
  st=$?
  [ "$st" -ne 0 ] && grep -q -e "--device cuda: no CUDA device" \
    -e "--device cuda: this gmr-bench was built without CUDA" "$tmp/err"
  ok $? "--device cuda without a device (or without CUDA) says so"
fi

# scripts/bench-across.py: the same run in several processes, min <= median
# <= max of each figure over them; its own usage and failure exits.
if command -v python3 >/dev/null 2>&1; then
  across="$src/scripts/bench-across.py"
  python3 "$across" --json-out "$tmp/across.json" 3 "$bench" --reps 1 --pairs 500 --threads 1,2 \
    --sizes 4KiB --workloads pair,random --live 16 "$src/config/direct.yaml" >"$tmp/across" 2>&1
  ok $? "bench-across.py: three processes exit 0"
  python3 - "$tmp/across.json" <<'EOF2'
import json, sys
rows = json.load(open(sys.argv[1]))
keys = [(r["workload"], r["policy"], r["what"], r["threads"]) for r in rows]
assert keys == [("pair", "direct", "4096 B", "single"), ("pair", "direct", "4096 B", "1T"),
                ("pair", "direct", "4096 B", "2T"), ("random", "direct", "16 live", "single"),
                ("random", "direct", "16 live", "1T"), ("random", "direct", "16 live", "2T")], keys
for r in rows:
    assert r["runs"] == 3 and len(r["ns"]) == 3, r
    assert 0 < r["ns_min"] <= r["ns_median"] <= r["ns_max"], r
    assert r["ns_median"] == sorted(r["ns"])[1], r
EOF2
  ok $? "bench-across.py: one row per figure, each over the three runs, in order"
  grep -q "^pair .*direct .*4096 B .*single" "$tmp/across"
  ok $? "bench-across.py: the table names each figure"
  python3 "$across" 0 "$bench" >/dev/null 2>"$tmp/err"
  [ $? -eq 2 ] && grep -q "N must be at least 1" "$tmp/err"
  ok $? "bench-across.py: N below 1 is a usage error"
  python3 "$across" 2 "$bench" --reps 1 "$tmp/nonexistent.yaml" >/dev/null 2>"$tmp/err"
  [ $? -eq 1 ] && grep -q "run 1 of 2 exited 1" "$tmp/err"
  ok $? "bench-across.py: a failing run of gmr-bench fails it"
fi

# The driver-call workload times CUDA calls; without a GPU it says why and
# exits 0, in the table and in the JSON, and needs no configuration.
"$bench" --workloads calls >"$tmp/calls" 2>"$tmp/err"
ok $? "calls: exits 0 on the simulator (nothing to time)"
grep -q -e '^gmr-bench: driver calls: skipped: the driver calls are timed on a GPU only (--device cuda)$' \
  -e '^gmr-bench: driver calls: skipped: this gmr-bench was built without CUDA$' "$tmp/calls"
ok $? "calls: says why it was skipped"
"$bench" --workloads calls --json --call-pages 1,4 >"$tmp/calls.json" 2>"$tmp/err"
ok $? "calls --json: exits 0"
grep -q '{"workload": "calls", "skipped": "' "$tmp/calls.json"
ok $? "calls --json: one record saying why"
"$bench" --workloads calls --device cuda --json >"$tmp/calls-cuda.json" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 2 ] && grep -q 'built without CUDA' "$tmp/err"; then
  ok 0 "calls --device cuda: refused as a usage error by a build without CUDA"
elif grep -q '"skipped"' "$tmp/calls-cuda.json"; then
  ok "$rc" "calls --device cuda: skipped cleanly where there is no GPU (or no CUDA build)"
else
  # A GPU: every call kind timed at both sizes, each figure positive.
  [ "$rc" -eq 0 ] && [ "$(grep -c '"call": ' "$tmp/calls-cuda.json")" -eq 24 ]
  ok $? "calls --device cuda: 10 call kinds at 2 sizes and 4 event calls, timed"
fi
"$bench" --workloads calls --call-pages 0 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ]
ok $? "calls: --call-pages 0 is a usage error"

echo "1..$n"
exit $failed
