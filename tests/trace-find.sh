#!/bin/sh
# trace-find.sh: traces by name, as configurations are (gmr_trace_find):
# `gmr-compare gpt2_train direct` in a source tree replays traces/gpt2_train.csv
# and gives the same figures as the path; a name found nowhere fails with a
# message naming it (exit 1); `make install` puts every shipped trace in
# $(pkgdatadir)/traces, where an installed gmr-compare finds them by name
# from any folder (checked here when this build's traces are installed;
# debian/tests/smoke checks it on the packages).
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-trace-find.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
echo "1..5"
peak() { sed -n 's/.*"peak_reserved": \([0-9]*\).*/\1/p' "$1" | head -1; }

(cd "$SRC" && "$B" --json --no-timing traces/gpt2_train.csv direct) >"$W/path.json" 2>"$W/path.err"
(cd "$SRC" && "$B" --json --no-timing gpt2_train direct) >"$W/name.json" 2>"$W/name.err"
rc=$?
if [ $rc -eq 0 ] && [ -n "$(peak "$W/name.json")" ] && [ "$(peak "$W/name.json")" = "$(peak "$W/path.json")" ]; then
  echo "ok 1 - gmr-compare gpt2_train direct replays traces/gpt2_train.csv (peak reserved $(peak "$W/name.json"))"
else
  echo "not ok 1 - gpt2_train by name (exit $rc)"
  sed 's/^/# /' "$W/name.err" | head -10
fi
(cd "$SRC" && "$B" --json --no-timing gpt2_train.csv direct) >"$W/csv.json" 2>/dev/null
if [ "$(peak "$W/csv.json")" = "$(peak "$W/path.json")" ]; then
  echo "ok 2 - gpt2_train.csv by name too"
else
  echo "not ok 2 - gpt2_train.csv by name"
fi
(cd "$W" && "$B" no_such_trace_xyz "$SRC/config/direct.yaml") >"$W/none.out" 2>"$W/none.err"
rc=$?
if [ $rc -eq 1 ] && grep -q 'no_such_trace_xyz' "$W/none.err"; then
  echo "ok 3 - a trace found nowhere: exit 1, named on stderr"
else
  echo "not ok 3 - a trace found nowhere (exit $rc)"
  sed 's/^/# /' "$W/none.err" | head -5
fi
# make install's part for the traces, into a scratch DESTDIR.
if [ -z "${GMR_PKGDATADIR:-}" ] || ! command -v "${MAKE:-make}" >/dev/null 2>&1; then
  echo "ok 4 # SKIP no GMR_PKGDATADIR or make (run through make check)"
elif "${MAKE:-make}" -s -C "$BLD" install-dist_tracesDATA DESTDIR="$W/dest" >"$W/inst.log" 2>&1 &&
  missing=$(for f in "$SRC"/traces/*.csv; do
    [ -f "$W/dest$GMR_PKGDATADIR/traces/${f##*/}" ] || echo "${f##*/}"
  done) && [ -z "$missing" ]; then
  echo "ok 4 - make install puts every traces/*.csv in $GMR_PKGDATADIR/traces"
else
  echo "not ok 4 - make install: traces missing from $GMR_PKGDATADIR/traces: ${missing:-}"
  sed 's/^/# /' "$W/inst.log" | head -10
fi
if [ -n "${GMR_PKGDATADIR:-}" ] && [ -f "$GMR_PKGDATADIR/traces/gpt2_train.csv" ]; then
  (cd "$W" && "$B" --json --no-timing gpt2_train direct) >"$W/inst.json" 2>"$W/inst.err"
  if [ "$(peak "$W/inst.json")" = "$(peak "$W/path.json")" ]; then
    echo "ok 5 - from a folder without ./traces, gpt2_train is $GMR_PKGDATADIR/traces/gpt2_train.csv"
  else
    echo "not ok 5 - the installed gpt2_train by name"
    sed 's/^/# /' "$W/inst.err" | head -5
  fi
else
  echo "ok 5 # SKIP this build's traces are not installed in ${GMR_PKGDATADIR:-PKGDATADIR}/traces"
fi
