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
# gmr-info links libgmr.so: the real binary (not libtool's wrapper), run with
# run.sh's LD_LIBRARY_PATH.
if [ -f "$b/tools/.libs/gmr-info" ]; then cp "$b/tools/.libs/gmr-info" "$dest/bin/"; else cp "$b/tools/gmr-info" "$dest/bin/"; fi
# gmr-compare (snapshot_compare.sh): the real program, not libtool's wrapper.
if [ -f "$b/tools/.libs/gmr-compare" ]; then cp "$b/tools/.libs/gmr-compare" "$dest/bin/"; else
  cp "$b/tools/gmr-compare" "$dest/bin/"
fi
cp -r "$src/python/gmr" "$dest/python/"
# The public headers, for programs built on the GPU host (multi-gpu.sh).
mkdir -p "$dest/include"
cp "$src"/include/*.h "$dest/include/"
cp "$src"/config/*.yaml "$dest/config/"
cp -r "$src/scripts/gpu" "$dest/scripts/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
