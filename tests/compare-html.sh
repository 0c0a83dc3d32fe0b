#!/bin/sh
# compare-html.sh: gmr-compare --html renders in headless Chromium, with one
# timeline and one segment map per configuration, and needs no network.
#
# Skips where Chromium is absent (CHROMIUM may name the browser).  The page's
# own script counts the charts that laid out with a non-zero size and writes
# the counts into #render-status, which --dump-dom shows.

SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
TR="$SRC/traces"
CF="$SRC/config"

if [ ! -x "$B" ]; then
  echo "1..0 # SKIP $B is not built"
  exit 0
fi
BROWSER=${CHROMIUM:-}
if [ -z "$BROWSER" ]; then
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then
      BROWSER=$c
      break
    fi
  done
fi
if [ -z "$BROWSER" ]; then
  echo "1..0 # SKIP no chromium to render the page (Debian package 'chromium')"
  exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-compare-html.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
. "${GMR_SRCDIR:-.}/tests/tap.sh"
browse() { # browse OUTPUT-OPTION...: headless, offline, a fresh profile
  timeout 90 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$W/profile" --window-size=1100,1400 "$@" 2>>"$W/browser.err"
}

cat >"$W/limit-2g.yaml" <<'EOF'
policy:
  name: limit
  bytes: 2GiB
  upstream:
    name: direct
EOF
configs="$CF/direct.yaml $W/limit-2g.yaml"
expect=2
if "$B" "$TR/resnet50_train.csv" "$CF/pytorch.yaml" >/dev/null 2>&1; then
  configs="$configs $CF/pytorch.yaml $CF/pytorch-expandable.yaml"
  expect=4
fi
greedy=0
if "$B" "$TR/resnet50_train.csv" "$CF/tf-greedy.yaml" >/dev/null 2>&1; then
  configs="$configs $CF/tf-growth.yaml $CF/tf-greedy.yaml"
  expect=$((expect + 2))
  greedy=1
fi
echo "# $expect configurations: $configs"
# shellcheck disable=SC2086
"$B" --html "$W/page.html" "$TR/resnet50_train.csv" $configs >"$W/table.out" 2>"$W/err"
is "$?" 0 "gmr-compare --html: exit status 0"
[ -s "$W/page.html" ]
ok $? "the page is written"
is "$(grep -c -E 'https?://|<link |src=' "$W/page.html")" 0 \
  "self-contained: no link, no src, no URL"
is "$(grep -c '<svg class="chart timeline"' "$W/page.html")" "$expect" \
  "one timeline per configuration in the file"

browse --dump-dom "file://$W/page.html" >"$W/dom.html"
ok $? "chromium loads the page"
status=$(grep -o '<p id="render-status"[^>]*>' "$W/dom.html")
echo "# $status"
is "$(echo "$status" | sed -n 's/.*data-timelines="\([0-9]*\)".*/\1/p')" "$expect" \
  "chromium laid out one timeline per configuration"
is "$(echo "$status" | sed -n 's/.*data-segmaps="\([0-9]*\)".*/\1/p')" "$expect" \
  "and one segment map per configuration"
is "$(grep -o '<svg class="chart timeline"' "$W/dom.html" | wc -l | tr -d ' ')" "$expect" \
  "the rendered DOM holds one chart per configuration"
is "$(grep -o '<section class="config"' "$W/dom.html" | wc -l | tr -d ' ')" "$expect" \
  "one section per configuration"
is "$(grep -c 'first OOM (line' "$W/dom.html")" 1 "the OOM of limit-2g is marked on its timeline"

if [ "$greedy" = 1 ]; then
  # 138.64 GiB reserved up front against about 3 GiB for the others.
  is "$(grep -c '>own scale</text>' "$W/dom.html")" 1 \
    "tf-greedy's timeline gets its own scale, the others share one"
  grep -q 'tf-greedy</b> held <b>138.64 GiB</b> in 1 region' "$W/dom.html"
  ok $? "tf-greedy's caption: one region of 138.64 GiB"
else
  ok 0 "own scale # SKIP bfc policy not available"
  ok 0 "greedy caption # SKIP bfc policy not available"
fi

browse --screenshot="$W/page.png" "file://$W/page.html" >/dev/null
[ "$(head -c 4 "$W/page.png" 2>/dev/null | od -An -c | tr -d ' ')" = "211PNG" ]
ok $? "a screenshot can be taken"

tap_end
