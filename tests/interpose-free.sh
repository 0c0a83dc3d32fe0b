#!/bin/sh
# interpose-free.sh: run tests/interpose with GMR_TEST_DOUBLE_FREE=1 under
# LD_PRELOAD=libgmr-preload.so, the stand-in driver (tests/fake-cuda.c) as
# libcuda.so.1 and `policy: caching` on a simulated device: a second free of a
# cached block is an error and a log line, never a driver call.
. "${GMR_SRCDIR:-.}/tests/interpose-common.sh"
cat >"$dir/gmr.yaml" <<'YAML'
device: {backend: sim, capacity: 1GiB}
policy: caching
limit: {bytes: 64MiB, counts: reserved}
YAML
LD_PRELOAD="$ip_preload" LD_LIBRARY_PATH="$ip_libpath" GMR_CONFIG="$dir/gmr.yaml" \
GMR_INTERPOSE_HIDE_VMM=1 GMR_INTERPOSE_LOG=1 GMR_TEST_DOUBLE_FREE=1 \
  "$b/tests/interpose"
