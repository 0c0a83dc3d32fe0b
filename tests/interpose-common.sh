# interpose-common.sh: sourced by the tests/interpose*.sh scripts, which run a
# test program under LD_PRELOAD=libgmr-preload.so with the stand-in driver
# (tests/fake-cuda.c) as libcuda.so.1 and a simulated device behind gmr.
# Skips (exit 0) when the interposer or the stand-in was not built. Sets:
#   b             the build folder (GMR_BUILDDIR, else .)
#   dir           a fresh temporary folder, removed at exit, holding the
#                 stand-in as libcuda.so.1; the script writes $dir/gmr.yaml
#   ip_preload    LD_PRELOAD's value: the sanitizer runtime the library needs
#                 first (as the sanitizers require), then libgmr-preload.so
#   ip_libpath    LD_LIBRARY_PATH's value: $dir first, then the library's folder
set -u
b=${GMR_BUILDDIR:-.}
preload="$b/lib/.libs/libgmr-preload.so"
fake="$b/tests/.libs/libfakecuda.so"
if [ ! -f "$preload" ] || [ ! -f "$fake" ]; then
  echo "1..0 # SKIP libgmr-preload.so is built only with the CUDA Toolkit"
  exit 0
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmr-$(basename "$0" .sh).XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
ln -s "$(cd "$(dirname "$fake")" && pwd)/libfakecuda.so" "$dir/libcuda.so.1"
san=$(ldd "$preload" 2>/dev/null | awk '/lib(asan|tsan|ubsan)\.so/ {print $3}' | head -n 1)
ip_preload="${san:+$san:}$(cd "$(dirname "$preload")" && pwd)/libgmr-preload.so"
ip_libpath="$dir:$b/lib/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
