#!/bin/bash
# completion.sh: the bash completion of gmr-compare (completion/gmr-compare),
# driven as bash-completion drives it.  Skips without bash-completion.
BLD=${GMR_BUILDDIR:-.}
SRC=${GMR_SRCDIR:-.}
bc=/usr/share/bash-completion/bash_completion
if [ ! -f "$bc" ]; then
  echo "1..0 # SKIP bash-completion is not installed"
  exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gmr-completion.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/work/config" "$tmp/share/traces"
: >"$tmp/share/traces/shipped.csv"
: >"$tmp/work/config/mine.yaml"
: >"$tmp/share/theirs.yaml"
: >"$tmp/work/run.csv"
: >"$tmp/work/page.html"
: >"$tmp/work/run.pickle"
# The completion as built, pointed at a stand-in installed directory.
sed "s|@pkgdatadir@|$tmp/share|g" "$SRC/completion/gmr-compare.in" >"$tmp/gmr-compare.bash"
. "$bc" 2>/dev/null
. "$tmp/gmr-compare.bash"
cd "$tmp/work" || exit 1

n=0
fails=0
# complete WORDS...: COMPREPLY for the last word, sorted, on one line.
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE="${COMP_WORDS[*]}"
  COMP_POINT=${#COMP_LINE}
  COMPREPLY=()
  _gmr_compare gmr-compare "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  printf '%s\n' "${COMPREPLY[@]}" | sort | paste -sd' ' -
}
check() {
  local want=$1 what=$2
  shift 2
  local got
  got=$(complete_line "$@")
  n=$((n + 1))
  if [ "$got" = "$want" ]; then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what"
    echo "#   got:  '$got'"
    echo "#   want: '$want'"
  fi
}

check "--capacity= --check" "options by prefix" gmr-compare --c
check "--no-timing" "--no-timing" gmr-compare --no
check "120 160" "--width takes columns" gmr-compare --width 1
check "--help --html=" "more options" gmr-compare --j --h
check "- config run.csv run.pickle shipped" "the first argument is a trace (a CSV, a snapshot, -, or a shipped trace's name), or a folder on the way" gmr-compare ""
check "shipped" "a shipped trace by prefix" gmr-compare sh
check "config mine theirs" "then configurations by name: ./config and the installed directory" gmr-compare run.csv ""
check "mine" "names by prefix" gmr-compare run.csv mi
check "bfc caching stitch" "--suggest takes a policy" gmr-compare --suggest ""
check "143771MiB" "--capacity suggests the default first" gmr-compare --capacity 14
check "page.html" "--html takes a file" gmr-compare --html pa
check "--snapshot= --suggest=" "--snapshot and --suggest by prefix" gmr-compare --s
check "run.pickle" "--snapshot takes a .pickle file" gmr-compare --snapshot ru
check "config mine theirs" "--snapshot's value is not counted as an argument" gmr-compare --snapshot run.pickle run.csv ""
check "config mine theirs" "option values are not counted as arguments" gmr-compare --capacity 80GiB run.csv ""
echo "1..$n"
