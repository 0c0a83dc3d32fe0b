#!/bin/sh
# info.sh: gmr-info exits 0 with or without a GPU, and prints the figures it
# promises (the simulated device's when there is no CUDA device).
set -u
b=${GMR_BUILDDIR:-.}
out=$("$b/tools/gmr-info" 2>&1)
rc=$?
n=0
fail=0
check() { # check COND_STATUS "name"
  n=$((n + 1))
  if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}
check $rc "gmr-info exits 0"
echo "$out" | grep -q "allocation granularity .* 2097152 bytes"
check $? "it prints the allocation granularity (2 MiB)"
echo "$out" | grep -q "reserve/release (cudaMalloc) *works"
check $? "reserve/release works"
echo "$out" | grep -q "VMM map/unmap *works"
check $? "VMM map/unmap works"
echo "$out" | grep -q "events (record/sync/query) *work"
check $? "events work"
if echo "$out" | grep -q "^no CUDA device"; then
  echo "$out" | grep -q "total memory (backend) *150754820096 bytes"
  check $? "without a device: the simulator's default 143771 MiB"
else
  echo "$out" | grep -q "CUDA context"
  check $? "with a device: the context's cost"
fi
"$b/tools/gmr-info" --device x >/dev/null 2>&1
[ $? -eq 2 ]
check $? "a bad --device is refused with status 2"
echo "1..$n"
[ $fail -eq 0 ] || { echo "$out" | sed 's/^/# /'; exit 1; }
