#!/bin/sh
# interpose-pools.sh: run tests/interpose-pools under LD_PRELOAD=libgmr-preload.so, with
# the stand-in driver (tests/fake-cuda.c) as libcuda.so.1 and a simulated
# device behind gmr.  A sanitizer runtime the library needs goes first in
# LD_PRELOAD, as the sanitizers require.
set -u
b=${GMR_BUILDDIR:-.}
preload="$b/lib/.libs/libgmr-preload.so"
fake="$b/tests/.libs/libfakecuda.so"
if [ ! -f "$preload" ] || [ ! -f "$fake" ]; then
  echo "1..0 # SKIP libgmr-preload.so is built only with the CUDA Toolkit"
  exit 0
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmr-interpose-pools.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
ln -s "$(cd "$(dirname "$fake")" && pwd)/libfakecuda.so" "$dir/libcuda.so.1"
cat >"$dir/gmr.yaml" <<'YAML'
device: {backend: sim, capacity: 1GiB}
policy: caching
limit: {bytes: 64MiB, counts: reserved}
YAML
san=$(ldd "$preload" 2>/dev/null | awk '/lib(asan|tsan|ubsan)\.so/ {print $3}' | head -n 1)
LD_PRELOAD="${san:+$san:}$(cd "$(dirname "$preload")" && pwd)/libgmr-preload.so" \
LD_LIBRARY_PATH="$dir:$b/lib/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
GMR_CONFIG="$dir/gmr.yaml" \
  "$b/tests/interpose-pools"
