#!/bin/sh
# compare-cost.sh: gmr-compare's driver calls and device time (tools/compare-cost.c).
#
# tests/fixtures/compare-cost.csv (the first 199 events of
# traces/gpt2_train.csv) is replayed under every shipped configuration: the
# simulator's call counts are deterministic, so each configuration's
# device_calls object is asserted exactly, and its device_time_us against
# the cost model's figures worked by hand (Note [Device cost model]).  Then:
# every JSON key exists for every configuration; the table has the rows; the
# note on calls the model has no figure for; and --suggest caching, whose
# winner saves 1.4 % of memory for 7.8x the defaults' device time, says so,
# while a suggestion that costs no more says nothing.
#
# When a policy changes the calls it makes, update its line below (the
# figures come from `gmr-compare --json --no-timing FIXTURE CONFIG`).
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
FX="$SRC/tests/fixtures/compare-cost.csv"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-compare-cost.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
. "${GMR_SRCDIR:-.}/tests/tap.sh"
has() {
  if grep -F -q -- "$2" "$1"; then ok 0 "$3"; else
    ok 1 "$3"
    echo "#   '$1' does not contain '$2'"
  fi
}
jget() { # jget FILE CONFIG KEY
  awk -v c="\"config\": \"$2\"," -v k="\"$3\": " '
    index($0, c) { inobj = 1 }
    inobj && index($0, k) == 5 { v = substr($0, 5 + length(k)); sub(/,$/, "", v); print v; exit }
    /^  }/ { inobj = 0 }' "$1"
}
if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi

# ---- the counts under every shipped configuration --------------------------------
# CONFIG | reserve release va_reserve va_release map unmap page_create
#          page_release page_map page_unmap set_access event_record
#          event_query sync | device_time_us
# pytorch: 39 cudaMalloc x 100 us.  pytorch-expandable: 2 x 14 us + 572 pages
# x 53 us.  stitch: 14 us + 562 pages created x 14 + 600 pages mapped x 2 +
# 600 pages made accessible x 37.  direct: 191 x 100 us (the frees are in the
# pairs).
cat >"$W/want" <<'EOF'
pytorch|39 0 0 0 0 0 0 0 0 0 0 0 0 0|3900.0
pytorch-expandable|0 0 2 0 59 0 0 0 0 0 0 0 0 0|30344.0
pytorch-max-split-128|39 0 0 0 0 0 0 0 0 0 0 0 0 0|3900.0
stitch|0 0 1 0 0 0 562 0 600 0 76 0 0 0|31282.0
direct|191 8 0 0 0 0 0 0 0 0 0 0 0 0|19100.0
tf-growth|4 0 0 0 0 0 0 0 0 0 0 0 0 0|400.0
tf-greedy|1 0 0 0 0 0 0 0 0 0 0 0 0 0|100.0
jax|1 0 0 0 0 0 0 0 0 0 0 0 0 0|100.0
EOF
configs=$(cut -d'|' -f1 "$W/want" | tr '\n' ' ')
# shellcheck disable=SC2086
(cd "$SRC" && "$B" --json --no-timing "$FX" $configs) >"$W/out.json" 2>"$W/err"
is "$?" 0 "the replays ran"
keys="reserve release va_reserve va_release map unmap page_create page_release page_map \
page_unmap set_access event_record event_query sync"
while IFS='|' read -r cfg counts us; do
  want="{"
  i=0
  for k in $keys; do
    i=$((i + 1))
    v=$(echo "$counts" | cut -d' ' -f$i)
    [ "$i" -gt 1 ] && want="$want, "
    want="$want\"$k\": $v"
  done
  want="$want}"
  is "$(jget "$W/out.json" "$cfg" device_calls)" "$want" "$cfg: the driver calls, exactly"
  is "$(jget "$W/out.json" "$cfg" device_time_us)" "$us" "$cfg: the device time the model gives them"
  total=0
  for v in $counts; do total=$((total + v)); done
  is "$(jget "$W/out.json" "$cfg" device_calls_total)" "$total" "$cfg: the total"
done <"$W/want"

# ---- the JSON keys -----------------------------------------------------------------
for key in device_calls device_call_bytes device_calls_total device_time_us \
  device_time_us_by_call device_calls_not_estimated device_time_model; do
  is "$(grep -c "^    \"$key\": " "$W/out.json")" 8 "JSON: \"$key\" for every configuration"
done
is "$(jget "$W/out.json" stitch device_call_bytes)" \
  '{"reserve": 0, "release": 0, "va_reserve": 301511737344, "va_release": 0, "map": 0, "unmap": 0, "page_create": 1178599424, "page_release": 0, "page_map": 1258291200, "page_unmap": 0, "set_access": 1258291200}' \
  "JSON: stitch's bytes per call kind"
is "$(jget "$W/out.json" stitch device_time_us_by_call)" \
  '{"reserve": 0.0, "release": 0.0, "va_reserve": 14.0, "map": 0.0, "unmap": 0.0, "page_create": 7868.0, "page_release": 0.0, "page_map": 1200.0, "page_unmap": 0.0, "set_access": 22200.0}' \
  "JSON: stitch's time per call kind (the kinds with a figure)"

# ---- the table ---------------------------------------------------------------------
(cd "$SRC" && "$B" --no-timing "$FX" pytorch stitch) >"$W/table" 2>/dev/null
for row in "driver calls" "  reserve / release" "  virtual reserve / release" "  map / unmap" \
  "  page create / release" "  page map / unmap" "  set access" "  event rec / query / sync" \
  "device time (H200 model)"; do
  has "$W/table" "$row  " "table: the row '$row'"
done
is "$(grep '^  page map / unmap' "$W/table" | awk '{print $5 $6 $7 $8 $9 $10}')" "0/0600/0" \
  "table: stitch's page maps"
is "$(grep '^device time' "$W/table" | sed 's/  */ /g')" "device time (H200 model) 3.90 ms 31.28 ms" \
  "table: the device times"
grep -q "no measured figure" "$W/table"
ok $((!$?)) "table: no note when every call has a figure"

# A stream use makes events, which the model has no figure for: said once.
printf 'Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,0x1,4194304,0\n0,2,record_stream,0x1,4194304,1\n0,3,free,0x1,4194304,0\n0,4,allocate,0x2,4194304,0\n0,5,free,0x2,4194304,0\n' >"$W/ev.csv"
(cd "$SRC" && "$B" --no-timing "$W/ev.csv" pytorch) >"$W/ev" 2>/dev/null
has "$W/ev" "  event rec / query / sync         1 / 1 / 0" "events: counted"
has "$W/ev" "the 2 event, synchronize and virtual-release calls: left out." \
  "events: the calls with no figure are said, not priced"
(cd "$SRC" && "$B" --json --no-timing "$W/ev.csv" pytorch) >"$W/ev.json" 2>/dev/null
is "$(jget "$W/ev.json" pytorch device_calls_not_estimated)" 2 "events: JSON counts them"

# ---- --suggest weighs the device time ------------------------------------------------
(cd "$SRC" && "$B" --suggest caching "$FX") >"$W/suggest" 2>/dev/null
is "$?" 0 "suggest caching: exit status 0"
has "$W/suggest" "#   device time (H200)                      3.90 ms                 30.34 ms" \
  "suggest caching: both device times"
has "$W/suggest" "# It saves 1.4 % of the defaults' peak reserved." "suggest caching: the saving"
has "$W/suggest" "# Slower: its driver calls cost 30.34 ms of device time against the defaults' 3.90 ms (7.8x)," \
  "suggest caching: says the winner is slower, by how much"
has "$W/suggest" "# for 1.4 % less memory (H200 cost model; the rule: more than 1 ms and" \
  "suggest caching: for how little memory, and the rule"
(cd "$SRC" && "$B" --suggest bfc "$FX") >"$W/suggest-bfc" 2>/dev/null
grep -q "^# Slower" "$W/suggest-bfc"
ok $((!$?)) "suggest bfc: no warning when the winner costs no more device time"
tap_end
