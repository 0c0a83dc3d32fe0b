#!/bin/sh
# pkgconfig-static.sh: `pkg-config --static --libs gmr` names every library a
# static link needs (Libs.private and Requires.private: libm for llround,
# pthreads, libdl where dlopen is not in libc, libyaml, CUDA's static runtime
# when built with it).  The build tree's gmr.pc, pointed at lib/.libs and
# include/, links a small program two ways and runs it: the whole program
# -static, when libc.a and libyaml.a are there, and libgmr.a alone static
# (-Wl,-Bstatic -lgmr), which needs every Libs.private entry too.
SRC=${GMR_SRCDIR:-.}
BLD=${GMR_BUILDDIR:-.}
CC=${CC:-cc}
echo "1..3"
skip_all() {
  for i in 1 2 3; do echo "ok $i # SKIP $1"; done
  exit 0
}
command -v pkg-config >/dev/null 2>&1 || skip_all "pkg-config is not installed"
command -v "$CC" >/dev/null 2>&1 || skip_all "no C compiler ($CC)"
[ -f "$BLD/lib/.libs/libgmr.a" ] || skip_all "no static library (configured with --disable-static?)"
[ -f "$BLD/gmr.pc" ] || skip_all "no gmr.pc in $BLD (run configure)"
# make check's GMR_LINK_FLAGS: the build's own link flags.  A sanitizer
# build's archive needs the sanitizer's runtime, which has no -static form.
sanitized=no
case "${GMR_LINK_FLAGS:-}" in *-fsanitize=*) sanitized=yes ;; esac
W=$(mktemp -d "${TMPDIR:-/tmp}/gmr-pc-static.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
sed -e "s|^libdir=.*|libdir=$BLD/lib/.libs|" -e "s|^includedir=.*|includedir=$SRC/include|" \
  "$BLD/gmr.pc" >"$W/gmr.pc"
# Something from every part that pulls a library: llround (libm) in the
# summary, YAML, threads and the simulator.
cat >"$W/t.c" <<'C'
#include <gmr.h>
#include <stdio.h>
static const char yaml[] = "policy: caching\n";
int main(void) {
  gmr_config_t *cfg;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) return 2;
  gmr_runtime_t *rt;
  if (gmr_runtime_new(cfg, 0, &rt) != 0) return 3;
  gmr_config_free(cfg);
  void *p;
  if (gmr_alloc(rt, 3u << 20, NULL, &p) != 0) return 4;
  gmr_free(rt, p);
  FILE *null = fopen("/dev/null", "w");
  if (null == NULL || gmr_summary(rt, null) != 0) return 5;
  fclose(null);
  gmr_runtime_free(rt);
  puts("static ok");
  return 0;
}
C
if libs=$(PKG_CONFIG_PATH="$W" pkg-config --static --libs gmr 2>"$W/pc.err") &&
  cflags=$(PKG_CONFIG_PATH="$W" pkg-config --cflags gmr 2>>"$W/pc.err"); then
  echo "ok 1 - pkg-config --static --libs gmr: $libs"
else
  echo "not ok 1 - pkg-config --static --libs gmr failed"
  sed 's/^/# /' "$W/pc.err"
  exit 0
fi
# try N NAME LINK-ARGS...: link t.c with LINK-ARGS and run it
try() {
  n=$1 name=$2
  shift 2
  # shellcheck disable=SC2086
  if ! $CC -std=c11 $cflags -o "$W/t$n" "$W/t.c" "$@" >"$W/cc$n.log" 2>&1; then
    echo "not ok $n - $name: the link fails"
    sed 's/^/# /' "$W/cc$n.log" | grep -v 'statically linked applications' | head -20
  elif [ "$("$W/t$n" 2>&1)" = "static ok" ]; then
    echo "ok $n - $name: links and runs"
  else
    echo "not ok $n - $name: links, but does not run"
  fi
}
libc_a=$($CC -print-file-name=libc.a)
yaml_a=$($CC -print-file-name=libyaml.a)
if [ "$sanitized" = yes ]; then
  echo "ok 2 - cc -static # SKIP a sanitizer build: the sanitizer's runtime cannot be linked -static"
elif [ "$libc_a" = libc.a ] || [ "$yaml_a" = libyaml.a ]; then
  echo "ok 2 - cc -static # SKIP no libc.a or libyaml.a for a fully static link"
else
  # shellcheck disable=SC2086
  try 2 "cc -static \$(pkg-config --static --libs gmr)" -static $libs
fi
# -lgmr alone from the archive; the libraries after it as pkg-config says.
# shellcheck disable=SC2086
try 3 "libgmr.a with the rest shared" ${GMR_LINK_FLAGS:-} $(printf '%s\n' $libs | sed 's|^-lgmr$|-Wl,-Bstatic -lgmr -Wl,-Bdynamic|')
