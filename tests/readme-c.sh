#!/bin/sh
# readme-c.sh: the README's C example ("Using gmr from C", the block after
# the readme-c-example marker) is a whole program: compiled as it stands
# against the build tree's library (through libtool, so shared and static
# builds alike) with -Wall -Wextra -Werror, run from the source tree, where
# gmr_config_find finds ./config/pytorch.yaml.  debian/tests/smoke compiles
# the same text against the installed package.  A sanitizer build's
# library needs its runtime linked first: GMR_LINK_FLAGS carries the
# build's own link flags (-fsanitize=...) from make check.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
CC=${CC:-cc}
echo "1..3"
if ! command -v "$CC" >/dev/null 2>&1; then
  for i in 1 2 3; do echo "ok $i # SKIP no C compiler ($CC)"; done
  exit 0
fi
if [ ! -x "$BLD/libtool" ] || [ ! -f "$BLD/lib/libgmr.la" ]; then
  for i in 1 2 3; do echo "ok $i # SKIP no libtool or lib/libgmr.la in $BLD (run make first)"; done
  exit 0
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-readme-c.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
sed -n '/^<!-- readme-c-example/,/^```$/p' "$SRC/README.md" | sed '1,2d;$d' >"$W/example.c"
if grep -q 'int main' "$W/example.c"; then
  echo "ok 1 - README.md has the marked C example, with a main ($(wc -l <"$W/example.c") lines)"
else
  echo "not ok 1 - README.md: no '<!-- readme-c-example' marker before a C block with a main"
  exit 0
fi
if "$BLD/libtool" --quiet --tag=CC --mode=link "$CC" -std=c11 -Wall -Wextra -Werror \
  ${GMR_LINK_FLAGS:-} -I"$SRC/include" -o "$W/example" "$W/example.c" "$BLD/lib/libgmr.la" >"$W/cc.log" 2>&1; then
  echo "ok 2 - the README's C example compiles as written (-std=c11 -Wall -Wextra -Werror)"
else
  echo "not ok 2 - the README's C example does not compile as written"
  sed 's/^/# /' "$W/cc.log" | head -30
  exit 0
fi
if (cd "$SRC" && "$W/example") >"$W/out.txt" 2>"$W/err.txt" &&
  grep -q "PyTorch CUDA memory summary" "$W/out.txt" &&
  grep -qx "peak reserved 67108864" "$W/out.txt"; then
  echo "ok 3 - it runs: the summary, and 64 MiB reserved at the peak"
else
  echo "not ok 3 - the README's C example did not run as expected"
  sed 's/^/# /' "$W/out.txt" "$W/err.txt" | tail -20
fi
