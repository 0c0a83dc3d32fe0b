#!/bin/sh
# interpose-pools.sh: run tests/interpose-pools under LD_PRELOAD=libgmr-preload.so, with
# the stand-in driver (tests/fake-cuda.c) as libcuda.so.1 and a simulated
# device behind gmr.  A sanitizer runtime the library needs goes first in
# LD_PRELOAD, as the sanitizers require.
. "${GMR_SRCDIR:-.}/tests/interpose-common.sh"
cat >"$dir/gmr.yaml" <<'YAML'
device: {backend: sim, capacity: 1GiB}
policy: caching
limit: {bytes: 64MiB, counts: reserved}
YAML
LD_PRELOAD="$ip_preload" LD_LIBRARY_PATH="$ip_libpath" GMR_CONFIG="$dir/gmr.yaml" \
  "$b/tests/interpose-pools"
