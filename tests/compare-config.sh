#!/bin/sh
# compare-config.sh: a CONFIG that names no file is a usage error of
# gmr-compare (tools/compare-config.c): exit status 2, before the trace is
# read or anything replayed, one line on stderr with the nearest shipped
# name ("did you mean pytorch?") or, with none close, the names; a file that
# exists but does not load still runs beside the others (tests/compare.sh).
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
B="$BLD/tools/gmr-compare"
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-compare-config.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
n=0
ok() { # ok STATUS NAME
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
    echo "not ok $n - $2"
    [ -f "$W/err" ] && sed 's/^/#   /' "$W/err" | head -5
  fi
}
# typo ARG WANT: gmr-compare gpt2_train.csv direct ARG from the source tree
typo() {
  (cd "$SRC" && "$B" traces/gpt2_train.csv direct "$1") >"$W/out" 2>"$W/err"
  rc=$?
  ok $((rc != 2)) "'$1': exit status 2 (got $rc)"
  ok "$([ "$(wc -l <"$W/err")" -eq 1 ] && echo 0 || echo 1)" "'$1': one line on stderr"
  ok "$(grep -q -- "$2" "$W/err" && echo 0 || echo 1)" "'$1': says '$2'"
  ok "$([ -s "$W/out" ] && echo 1 || echo 0)" "'$1': no table, nothing replayed"
}
typo pytorh "did you mean pytorch?"
typo pytroch "did you mean pytorch?"
typo tf-grwth "did you mean tf-growth?"
typo config/pytorch-expandible.yaml "no configuration file 'config/pytorch-expandible.yaml'; did you mean pytorch-expandable?"
typo zzzzzzz "the configurations are: direct, jax, pytorch,"
# Before the trace is read: a trace that does not exist is not the error.
(cd "$SRC" && "$B" "$W/no-such.csv" pytorh) >/dev/null 2>"$W/err"
rc=$?
ok $((rc != 2)) "a typo and a missing trace: exit 2, the typo first"
ok "$(grep -q 'no-such.csv' "$W/err" && echo 1 || echo 0)" "the trace was not opened"
# --json says nothing on stdout either.
(cd "$SRC" && "$B" --json traces/gpt2_train.csv pytorh) >"$W/out" 2>"$W/err"
ok "$([ -s "$W/out" ] && echo 1 || echo 0)" "--json: nothing on stdout"
echo "1..$n"
