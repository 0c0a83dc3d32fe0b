# tap.sh: sourced by the shell tests that count their checks as they go
# (TAP, the plan at the end). After `. "$SRC/tests/tap.sh"`:
#   ok STATUS NAME       "ok N - NAME" when STATUS is 0, else "not ok N - NAME"
#   is GOT WANT NAME     ok when the two strings are equal; says both if not
#   tap_workdir NAME     sets W to a fresh temporary folder, removed at exit
#   tap_end              prints the plan "1..N" and exits 1 if a check failed
n=0
failed=0
ok() {
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
    echo "not ok $n - $2"
    failed=1
  fi
}
is() {
  if [ "x$1" = "x$2" ]; then ok 0 "$3"; else
    ok 1 "$3"
    echo "#   got:      '$1'"
    echo "#   expected: '$2'"
  fi
}
tap_workdir() {
  W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-$1.XXXXXX") || exit 1
  trap 'rm -rf "$W"' EXIT
}
tap_end() {
  echo "1..$n"
  exit $failed
}
