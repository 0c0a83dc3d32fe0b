#!/bin/sh
# torch-native.sh: torch.cuda's memory API under gmr's native PyTorch adapter
# (python/gmr/csrc/gmr_torch.cpp), the checks of scripts/gpu/torch_native.py
# under the caching policy, one TAP line each.  Needs PyTorch and a CUDA
# device: skips without them (CI has neither), and on the sanitizer builds.
set -u
src=${GMR_SRCDIR:-.}
b=${GMR_BUILDDIR:-.}
lib="$b/lib/.libs/libgmr.so"
py=${PYTHON3:-python3}
if [ ! -f "$lib" ]; then
  echo "1..0 # SKIP libgmr.so was not built (--disable-shared?)"
  exit 0
fi
if ldd "$lib" 2>/dev/null | grep -Eq 'lib(asan|tsan|ubsan)\.so'; then
  echo "1..0 # SKIP a sanitizer build: torch is not loaded under a sanitizer"
  exit 0
fi
if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "1..0 # SKIP no python3 with torch"
  exit 0
fi
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "1..0 # SKIP no CUDA device"
  exit 0
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmr-torch-native.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
GMR_LIBRARY=$lib GMR_CACHE_DIR="$dir/cache" PYTHONDONTWRITEBYTECODE=1 \
  "$py" "$src/scripts/gpu/torch_native.py" --policy caching --out "$dir" >"$dir/out.log" 2>&1
rc=$?
n=$(grep -c '^CHECK ' "$dir/out.log")
if [ "$n" -eq 0 ]; then
  echo "1..1"
  echo "not ok 1 - torch_native.py ran no check (exit $rc): $(tail -c 600 "$dir/out.log" | tr '\n' ' ')"
  exit 0
fi
echo "1..$n"
i=0
grep '^CHECK ' "$dir/out.log" | while read -r _ name verdict rest; do
  i=$((i + 1))
  if [ "$verdict" = ok ]; then echo "ok $i - $name"; else echo "not ok $i - $name: $rest"; fi
done
