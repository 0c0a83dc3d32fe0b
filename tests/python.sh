#!/bin/sh
# python.sh: the Python package's tests (python/tests, pytest) as one TAP
# stream (python/tests/tap.py, a pytest plugin), on the simulated device,
# against the build tree's libgmr.  Skips without a Python that has pytest
# (Debian: python3-pytest).
set -u
src=${GMR_SRCDIR:-.}
b=${GMR_BUILDDIR:-.}
py=""
for cand in ${PYTHON3:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import pytest" 2>/dev/null; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "1..0 # SKIP no python3 with pytest (apt-get install python3-pytest)"
  exit 0
fi
GMR_LIBRARY="$b/lib/.libs/libgmr.so"
if [ ! -f "$GMR_LIBRARY" ]; then
  echo "1..0 # SKIP libgmr.so was not built (--disable-shared?)"
  exit 0
fi
GMR_BUILDDIR=$b GMR_SRCDIR=$src
export GMR_LIBRARY GMR_BUILDDIR GMR_SRCDIR
PYTHONPATH="$src/python:$src/python/tests${PYTHONPATH:+:$PYTHONPATH}"
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
# No cache, no configuration file, no terminal report: TAP only.
cd "$src/python/tests" || exit 1
exec "$py" -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -p no:terminal -p tap .
