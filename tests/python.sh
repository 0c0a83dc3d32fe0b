#!/bin/sh
# python.sh: the Python package's tests (python/tests) as one TAP stream, on
# the simulated device.  Skips when python3 is missing.
set -u
py=${PYTHON3:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "1..0 # SKIP python3 not found"
  exit 0
fi
src=${GMR_SRCDIR:-.}
b=${GMR_BUILDDIR:-.}
GMR_LIBRARY="$b/lib/.libs/libgmr.so"
if [ ! -f "$GMR_LIBRARY" ]; then
  echo "1..0 # SKIP libgmr.so was not built (--disable-shared?)"
  exit 0
fi
export GMR_LIBRARY
PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
PYTHONDONTWRITEBYTECODE=1 # keep the source tree clean (it may be read-only)
export PYTHONDONTWRITEBYTECODE
# Sanitizer builds: the sanitizer runtime libgmr needs must be loaded first.
san=$(ldd "$GMR_LIBRARY" 2>/dev/null | awk '/lib(asan|tsan)\.so/ {print $3}' | head -n 1)
case "$san" in
*tsan*)
  echo "1..0 # SKIP python3 does not run with the ThreadSanitizer runtime preloaded"
  exit 0
  ;;
esac
if [ -n "$san" ]; then
  LD_PRELOAD="$san${LD_PRELOAD:+:$LD_PRELOAD}"
  export LD_PRELOAD
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  export ASAN_OPTIONS
fi
exec "$py" "$src/python/tests/tap.py" "$src/python/tests"
