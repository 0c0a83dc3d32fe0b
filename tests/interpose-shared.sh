#!/bin/sh
# interpose-shared.sh: run tests/interpose-shared under LD_PRELOAD=libgmr-preload.so
# with the stand-in driver as libcuda.so.1, a simulated device, and a cap
# shared across processes in a file of a fresh temporary folder.
. "${GMR_SRCDIR:-.}/tests/interpose-common.sh"
cat >"$dir/gmr.yaml" <<YAML
device: {backend: sim, capacity: 1GiB}
policy: direct
limit: {bytes: 64MiB, counts: reserved, shared: {cap: 96MiB, path: '$dir/cap', label: test}}
YAML
LD_PRELOAD="$ip_preload" LD_LIBRARY_PATH="$ip_libpath" GMR_CONFIG="$dir/gmr.yaml" \
  "$b/tests/interpose-shared"
