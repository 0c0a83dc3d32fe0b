#!/bin/sh
# compare-html-bytes.sh: the --html page's segment maps draw the bytes the
# table reports, for every policy (issue 33: stitch's map drew 96 GiB of
# "free" blocks for 100 MiB).
#
# Every rect of a map carries the bytes it stands for (data-bytes).  For
# each shipped configuration on each trace below, the bytes drawn as
# memory (allocated, free, pending, dead gaps; not the outlines of shared
# pages, which lie over blocks already drawn) must be the JSON's
# peak_reserved, and the bytes drawn as unusable (free and dead gaps) its
# free_at_peak, each within 1 % (8 KiB when the table's figure is 0).  For
# stitch, the caption speaks in pages and ranges, never in segments, and
# says when the free total is too small to matter.  No browser is needed:
# the page's text is read.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-html-bytes.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
. "${GMR_SRCDIR:-.}/tests/tap.sh"
if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi
jget() { # jget FILE CONFIG KEY
  awk -v c="\"config\": \"$2\"," -v k="\"$3\": " '
    index($0, c) { inobj = 1 }
    inobj && index($0, k) == 5 { v = substr($0, 5 + length(k)); sub(/,$/, "", v); print v; exit }
    /^  }/ { inobj = 0 }' "$1"
}
# drawn PAGE: one line per map, "NAME MEMORY UNUSABLE" (bytes).
drawn() {
  awk '
    /<svg class="chart segmap"/ {
      match($0, /aria-label="segments of [^"]* at the peak"/)
      name = substr($0, RSTART + 24, RLENGTH - 37); on = 1; order[++k] = name
    }
    on {
      s = $0
      while (match(s, /<rect class="[a-z]+"[^>]*data-bytes="[0-9]+"/)) {
        r = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        match(r, /class="[a-z]+"/); c = substr(r, RSTART + 7, RLENGTH - 8)
        match(r, /data-bytes="[0-9]+"/); b = substr(r, RSTART + 12, RLENGTH - 13) + 0
        if (c != "sh") mem[name] += b
        if (c == "f" || c == "dg") bad[name] += b
      }
    }
    /<\/svg>/ { on = 0 }
    END { for (i = 1; i <= k; ++i) printf "%s %.0f %.0f\n", order[i], mem[order[i]], bad[order[i]] }
  ' "$1"
}
# near GOT WANT: within 1 % of WANT, or 8 KiB of 0.
near() {
  awk -v g="$1" -v w="$2" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(w == 0 ? d <= 8192 : d <= 0.01 * w) }'
}

# Every shipped configuration, and stitch under a cap (a policy stack).
printf 'policy:\n  name: limit\n  bytes: 40GiB\n  upstream:\n    name: stitch\n' >"$W/limit-stitch.yaml"
configs="pytorch pytorch-expandable pytorch-max-split-128 stitch direct tf-growth tf-greedy jax"
for trace in gpt2_train gpt2_varlen_train resnet50_train; do
  # shellcheck disable=SC2086
  (cd "$SRC" && "$B" --html "$W/$trace.html" --json "traces/$trace.csv" $configs \
    "$W/limit-stitch.yaml") >"$W/$trace.json" 2>/dev/null
  ok $? "$trace: the page and the JSON are written"
  drawn "$W/$trace.html" >"$W/$trace.drawn"
  for cfg in $configs limit-stitch; do
    line=$(grep "^$cfg " "$W/$trace.drawn")
    if [ -z "$line" ]; then
      ok 1 "$trace, $cfg: has a segment map"
      continue
    fi
    mem=$(echo "$line" | cut -d' ' -f2)
    bad=$(echo "$line" | cut -d' ' -f3)
    reserved=$(jget "$W/$trace.json" "$cfg" peak_reserved)
    free=$(jget "$W/$trace.json" "$cfg" free_at_peak)
    near "$mem" "$reserved"
    ok $? "$trace, $cfg: the map draws $mem bytes of memory for the table's peak reserved $reserved"
    near "$bad" "$free"
    ok $? "$trace, $cfg: and $bad bytes free or dead for the table's free at peak $free"
  done
done

# stitch's caption, in its own terms.
(cd "$SRC" && "$B" --html "$W/st.html" traces/gpt2_varlen_train.csv stitch) >/dev/null 2>&1
sed -n 's/<[^>]*>//g; /^At its peak/p' "$W/st.html" >"$W/st.caption"
grep -q 'stitch held 15.72 GiB in 8049 pages of 2.00 MiB (' "$W/st.caption"
ok $? "stitch's caption: held in pages, not segments"
grep -q ' segments for \| needs a new segment' "$W/st.caption"
ok $((!$?)) "stitch's caption: never 'in N segments' nor 'needs a new segment'"
grep -q 'in dead gaps between the two blocks of a shared page (grey)' "$W/st.caption"
ok $? "stitch's caption: names the dead gaps"
grep -q 'The free total is 0.61 % of what it holds: too little for its fragmentation figure (98 %) to matter.' \
  "$W/st.caption"
ok $? "stitch's caption: the fragmentation figure does not matter for so little free"
grep -q 'Not drawn, because it is address space and holds no memory of its own: .* in [0-9]* cached ranges' \
  "$W/st.html"
ok $? "stitch's map: the address space of its cached ranges is told apart, not drawn"
tap_end
