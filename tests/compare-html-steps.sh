#!/bin/sh
# compare-html-steps.sh: the --html timeline marks each step up of reserved
# memory at the request that caused it, and names the rule that made the
# configuration grow (Note [Why reserved grew] in tools/compare-replay.c).
#
# On the shipped gpt2_train: the caching policy steps once per segment (its
# JSON's segments_peak), by rounding, its small pool and its 20 MiB
# segments; with max_split_size, a split limit too; TensorFlow's growing BFC
# by growth doubling only, its greedy BFC once, by its whole limit;
# expandable segments by mapped pages; stitch by pages; and the marks add up
# to the peak reserved bytes of a policy that never gives memory back.  The
# page's text is read; no browser is needed.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
CF="$SRC/config"
. "$SRC/tests/tap.sh"
tap_workdir compare-html-steps
if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi
T="$SRC/traces/gpt2_train.csv"
CFGS="pytorch tf-growth tf-greedy pytorch-expandable pytorch-max-split-128 stitch"
set --
for c in $CFGS; do set -- "$@" "$CF/$c.yaml"; done
"$B" --html "$W/page.html" "$T" "$@" >/dev/null 2>"$W/err"
ok $? "gmr-compare --html on gpt2_train: exit 0"
"$B" --json "$T" "$@" >"$W/j.json" 2>/dev/null
ok $? "  and --json"

jget() { # jget CONFIG KEY
  awk -v c="\"config\": \"$1\"," -v k="\"$2\": " '
    index($0, c) { inobj = 1 }
    inobj && index($0, k) == 5 { v = substr($0, 5 + length(k)); sub(/,$/, "", v); print v; exit }
    /^  }/ { inobj = 0 }' "$W/j.json"
}
section() { # section CONFIG: that configuration's part of the page
  awk -v s="<section class=\"config\" id=\"config-$1\">" '
    index($0, s) { on = 1 } on { print } on && /<\/section>/ { exit }' "$W/page.html"
}
marks() { section "$1" | grep -c '<path class="step"'; }
grown() { section "$1" | grep -o 'data-grow="[0-9]*"' | tr -dc '0-9\n' | awk '{ s += $1 } END { printf "%.0f\n", s }'; }
rule() { # rule CONFIG TEXT: the steps the table gives the rule that starts with TEXT (0: none)
  v=$(section "$1" | grep "^<tr><td>$2" | sed -n 's|^<tr><td>[^<]*</td><td>\([0-9]*\)</td>.*|\1|p')
  echo "${v:-0}"
}
rows() { section "$1" | sed -n '/<table class="steps">/,/<\/table>/p' | grep -c '^<tr><td>'; }

is "$(marks pytorch)" "$(jget pytorch segments_peak)" "pytorch: one mark per segment it reserved (segments_peak)"
is "$(grown pytorch)" "$(jget pytorch peak_reserved)" "  the marks add up to peak_reserved (the cache never gives memory back)"
section pytorch | grep -q "Reserved memory stepped up at $(marks pytorch) requests"
ok $? "  the page says how many requests made it grow"
section pytorch | grep -q '<path class="step" [^>]*><title>event [0-9]* (line [0-9]*): [0-9.]* [KMG]*i*B requested; reserved '
ok $? "  each mark's title names the request, its line and the bytes before and after"
[ "$(rule pytorch 'rounding: a new segment, the request rounded up to 2 MiB')" -gt 0 ] &&
  [ "$(rule pytorch 'small pool: a new 2 MiB segment')" -gt 0 ] &&
  [ "$(rule pytorch 'a new 20 MiB segment')" -gt 0 ]
ok $? "  its rules: rounding, the small pool, the 20 MiB segments"
is "$(rule pytorch 'split limit')" 0 "  and no split limit without max_split_size"
[ "$(rule pytorch-max-split-128 'split limit')" -gt 0 ]
ok $? "pytorch-max-split-128: some steps are the split limit's"
is "$(marks tf-growth)" "$(rule tf-growth 'growth doubling')" "tf-growth: every step is growth doubling"
is "$(rows tf-growth)" 1 "  one rule only"
is "$(grown tf-growth)" "$(jget tf-growth peak_reserved)" "  the marks add up to peak_reserved"
is "$(marks tf-greedy) $(rule tf-greedy 'the whole limit reserved at once')" "1 1" \
  "tf-greedy: one step, its whole limit"
is "$(marks pytorch-expandable)" "$(rule pytorch-expandable 'pages mapped into an expandable segment')" \
  "pytorch-expandable: every step maps pages"
is "$(marks stitch)" "$(rule stitch 'new device pages, no segment')" "stitch: every step is new pages"
[ "$(marks stitch)" -gt 0 ]
ok $? "  and there are some"

# A policy that steps more often than the page marks: the count goes on.
"$B" --html "$W/direct.html" "$T" "$CF/direct.yaml" >/dev/null 2>&1
n_marks=$(grep -c '<path class="step"' "$W/direct.html")
is "$n_marks" 2000 "direct: at most 2000 marks"
grep -q 'Reserved memory stepped up at [0-9]* requests (the red marks on the timeline; hover one for the request); the first 2000 are marked and counted here' "$W/direct.html"
ok $? "  the page says how many there were in all"

tap_end
