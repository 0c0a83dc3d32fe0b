#!/bin/sh
# bench-torch.sh: build tools/bench-torch.cpp, PyTorch's allocator for
# gmr-bench --torch, against the PyTorch that PYTHON (default python3) imports.
#
#   tools/bench-torch.sh [OUT.so] [PYTHON]      (default OUT: ./libgmr-bench-torch.so)
#
# Needs a C++ compiler (CXX, default g++) and the CUDA runtime headers
# (CUDA_HOME, /usr/local/cuda, or next to nvcc).  libtorch's headers and
# libraries come from the installed wheel (torch/include, torch/lib).
set -eu
out=${1:-./libgmr-bench-torch.so}
py=${2:-python3}
src=$(dirname "$0")/bench-torch.cpp

info=$("$py" -c '
import os, torch
print(os.path.dirname(torch.__file__))
print(torch.__version__)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
') || { echo "bench-torch.sh: $py cannot import torch" >&2; exit 1; }
torch_dir=$(echo "$info" | sed -n 1p)
torch_version=$(echo "$info" | sed -n 2p)
abi=$(echo "$info" | sed -n 3p)

cuda_inc=
nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")
for d in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include "$nvcc_dir/../include"; do
  if [ -f "$d/cuda_runtime_api.h" ]; then cuda_inc=$d; break; fi
done
[ -n "$cuda_inc" ] || { echo "bench-torch.sh: cuda_runtime_api.h not found (set CUDA_HOME)" >&2; exit 1; }

cxx=${CXX:-g++}
for std in c++20 c++17; do
  if "$cxx" -std=$std -O2 -fPIC -shared -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI="$abi" \
      -DGMR_TORCH_VERSION="\"$torch_version\"" \
      -I"$torch_dir/include" -I"$cuda_inc" "$src" -o "$out" \
      -L"$torch_dir/lib" -lc10_cuda -lc10 -Wl,-rpath,"$torch_dir/lib"; then
    echo "bench-torch.sh: built $out against PyTorch $torch_version ($std)"
    exit 0
  fi
done
echo "bench-torch.sh: the build failed" >&2
exit 1
