#!/bin/sh
# generate.sh: write every man page of gmr into OUTDIR, from the built tools'
# --help and the configuration reference (gmr-demo --reference), with
# man/mkman.awk.  `make update-man` writes them into man/; tests/man.sh
# writes them into a temporary folder and compares.
#
#   man/generate.sh BUILDDIR SRCDIR OUTDIR [PAGE...]
#
# GMR_PKGDATADIR (the build's installed-configurations directory, which a
# --help may name) is written /usr/share/gmr, the packages' directory, so
# the pages do not depend on --prefix; `make install` under another prefix
# writes that prefix's directory into the installed pages (install-data-hook).
# A tool's man/NAME.extra (sections such as FILES and EXAMPLES, in --help's
# layout under a "SECTION" line) follows its --help.
set -eu
b=$1 src=$2 out=$3
shift 3
version=$(sed -n 's/^#define GMR_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' "$src/include/gmr.h" | paste -sd. -)
AWK=${AWK:-awk}
# --help texts must not depend on the terminal.
COLUMNS=80 LC_ALL=C
export COLUMNS LC_ALL
unset GMR_CONFIG GMR_LOG GMR_TRACE GMR_HISTORY GMR_SNAPSHOT 2>/dev/null || true

# page section summary see-also command...
page() {
  name=$1 section=$2 summary=$3 seealso=$4
  shift 4
  case " ${pages:-} " in "  ") ;; *" $name.$section "*) ;; *) return 0 ;; esac
  tmp="$out/$name.$section.tmp"
  if [ "$section" = 5 ]; then
    { "$@"; cat "$src/man/gmr-config.extra.md"; } |
      "$AWK" -f "$src/man/mkman.awk" -v mode=markdown -v name="$name" -v section="$section" \
        -v summary="$summary" -v version="$version" -v seealso="$seealso" >"$tmp"
  else
    { "$@" --help; if [ -f "$src/man/$name.extra" ]; then echo; cat "$src/man/$name.extra"; fi; } |
      sed "s|${GMR_PKGDATADIR:-@pkgdatadir@}|/usr/share/gmr|g" |
      "$AWK" -f "$src/man/mkman.awk" -v mode=help -v name="$name" \
      -v section="$section" -v summary="$summary" -v version="$version" -v seealso="$seealso" >"$tmp"
  fi
  mv "$tmp" "$out/$name.$section"
}

pages="$*"
mkdir -p "$out"
page gmr-compare 1 "replay an allocation trace under several gmr configurations, side by side" \
  "gmr-config(5), gmr-record(1), gmr-bench(1)" "$b/tools/gmr-compare"
page gmr-info 1 "what the GPU offers and what gmr's CUDA backend can do on it" \
  "gmr-bench(1), gmr-compare(1)" "$b/tools/gmr-info"
page gmr-bench 1 "the host cost of gmr's allocation hot path, against the CUDA allocators" \
  "gmr-config(5), gmr-info(1)" "$b/tools/gmr-bench"
page gmr-record 1 "record a PyTorch program's GPU allocations as a gmr trace" \
  "gmr-compare(1)" "${PYTHON3:-python3}" "$src/tools/gmr-record"
page gmr-demo 1 "a short tour of gmr's C interface on a simulated device" \
  "gmr-config(5), gmr-compare(1)" "$b/tools/gmr-demo"
page gmr-top 1 "the processes sharing a GPU's memory under gmr's shared cap" \
  "gmr-config(5), gmr-info(1)" "$b/tools/gmr-top"
page gmr-config 5 "gmr's YAML configuration files: the device, the policy and its options" \
  "gmr-compare(1), gmr-bench(1), gmr-demo(1)" "$b/tools/gmr-demo" --reference
