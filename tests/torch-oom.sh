#!/bin/sh
# torch-oom.sh: gmr_torch_alloc raises torch's c10::OutOfMemoryError through
# the C++ ABI (lib/adapters/hooks.c), checked against a stand-in libc10 built here
# from tests/fixtures/torch-oom with the C++ compiler.  Skips without one.
set -u
src=${GMR_SRCDIR:-.}
b=${GMR_BUILDDIR:-.}
cxx=${CXX:-c++}
lib="$b/lib/.libs"
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "1..0 # SKIP no C++ compiler ($cxx) for the stand-in libc10"
  exit 0
fi
if [ ! -f "$lib/libgmr.so" ]; then
  echo "1..0 # SKIP libgmr.so was not built"
  exit 0
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmr-torch-oom.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
f="$src/tests/fixtures/torch-oom"
# -fvisibility-inlines-hidden as PyTorch builds: the implicit destructor is not exported.
if ! "$cxx" -shared -fPIC -O1 -fvisibility-inlines-hidden -o "$dir/libc10.so" -Wl,-soname,libc10.so "$f/c10.cpp" \
     >"$dir/build.log" 2>&1 ||
   ! "$cxx" -O1 -o "$dir/main" "$f/main.cpp" -L"$lib" -lgmr "$dir/libc10.so" \
     -Wl,-rpath,"$dir" -Wl,-rpath,"$(cd "$lib" && pwd)" >>"$dir/build.log" 2>&1; then
  echo "1..0 # SKIP the stand-in libc10 does not build here: $(head -c 300 "$dir/build.log")"
  exit 0
fi
printf 'device: {backend: sim, capacity: 1GiB}\npolicy: direct\n' >"$dir/gmr.yaml"
san=$(ldd "$lib/libgmr.so" 2>/dev/null | awk '/lib(asan|tsan)\.so/ {print $3}' | head -n 1)
GMR_CONFIG="$dir/gmr.yaml" LD_PRELOAD="${san:+$san}" ASAN_OPTIONS=detect_leaks=0 "$dir/main"
