#!/bin/sh
# bundle.sh: gather what scripts/gpu/run.sh needs on a CUDA machine into one
# folder: scripts/gpu/bundle.sh BUILD_DIR SRC_DIR YAML_LIB_DIR DEST
set -eu
b=$1 src=$2 yaml=$3 dest=$4
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/bin" "$dest/python" "$dest/config" "$dest/scripts"
cp -L "$b/lib/.libs/libgmr.so.0" "$dest/lib/libgmr.so.0"
ln -s libgmr.so.0 "$dest/lib/libgmr.so"
cp -L "$b/lib/.libs/libgmr-preload.so" "$dest/lib/"
cp -L "$yaml"/libyaml-0.so.2 "$dest/lib/"
# gmr-info, gmr-top and gmr-bench link libgmr.so: the real binaries (not libtool's
# wrappers), run with run.sh's LD_LIBRARY_PATH.
for t in gmr-info gmr-top gmr-bench; do
  if [ -f "$b/tools/.libs/$t" ]; then cp "$b/tools/.libs/$t" "$dest/bin/"; else cp "$b/tools/$t" "$dest/bin/"; fi
done
# gmr-compare (snapshot_compare.sh): the real program, not libtool's wrapper.
if [ -f "$b/tools/.libs/gmr-compare" ]; then cp "$b/tools/.libs/gmr-compare" "$dest/bin/"; else
  cp "$b/tools/gmr-compare" "$dest/bin/"
fi
# The CUDA backend's test (tests/cuda: caching, expandable segments, bfc and
# stitch on the device), linked with libgmr.so.
if [ -f "$b/tests/.libs/cuda" ]; then cp "$b/tests/.libs/cuda" "$dest/bin/gmr-cuda-test"; else
  cp "$b/tests/cuda" "$dest/bin/gmr-cuda-test"
fi
# The shared cap's process tests and its benchmark (linked statically with gmr).
cp "$b/tests/shared-cap" "$dest/bin/gmr-shared-cap-test"
cp "$b/tests/shared-cap-bench" "$dest/bin/gmr-shared-cap-bench"
cp -r "$src/python/gmr" "$dest/python/"
# The public headers, for programs built on the GPU host (multi-gpu.sh).
mkdir -p "$dest/include"
cp "$src"/include/*.h "$dest/include/"
cp "$src"/config/*.yaml "$dest/config/"
cp -r "$src/scripts/gpu" "$dest/scripts/"
# PyTorch's allocator for gmr-bench --torch, built on the GPU host (bench-all).
mkdir -p "$dest/tools"
cp "$src/tools/bench-torch.sh" "$src/tools/bench-torch.cpp" "$dest/tools/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
# The gmr-runtime wheel, when `make wheel` made one: scripts/gpu/wheel.sh tests it.
for w in "$b"/dist/gmr_runtime-*.whl; do
  if [ -f "$w" ]; then cp "$w" "$dest/"; fi
done
