#!/bin/sh
# interpose-free.sh: run tests/interpose with GMR_TEST_DOUBLE_FREE=1 under
# LD_PRELOAD=libgmr-preload.so, the stand-in driver (tests/fake-cuda.c) as
# libcuda.so.1 and `policy: caching` on a simulated device: a second free of a
# cached block is an error and a log line, never a driver call.
set -u
b=${GMR_BUILDDIR:-.}
preload="$b/lib/.libs/libgmr-preload.so"
fake="$b/tests/.libs/libfakecuda.so"
if [ ! -f "$preload" ] || [ ! -f "$fake" ]; then
  echo "1..0 # SKIP libgmr-preload.so is built only with the CUDA Toolkit"
  exit 0
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmr-interpose-free.XXXXXX") || exit 1
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
GMR_CONFIG="$dir/gmr.yaml" GMR_INTERPOSE_HIDE_VMM=1 GMR_INTERPOSE_LOG=1 GMR_TEST_DOUBLE_FREE=1 \
  "$b/tests/interpose"
