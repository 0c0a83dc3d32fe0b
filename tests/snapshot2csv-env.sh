# snapshot2csv-env.sh: sourced by the tests that run tools/snapshot2csv.py
# or tools/gmr-record.  snapshot2csv.py converts with libgmr
# (gmr_snapshot_csv) through the gmr package in python/: s2c_env points both
# at this build, and gpy runs python3 with the sanitizer runtime first when
# libgmr was built with one (as tests/python.sh does).  S2C_SKIP: why
# python3 cannot load this libgmr, or empty.
s2c_env() { # s2c_env SRCDIR BUILDDIR
  S2C_SKIP=""
  S2C_PRELOAD=""
  GMR_LIBRARY=${GMR_LIBRARY:-$2/lib/.libs/libgmr.so}
  if [ ! -f "$GMR_LIBRARY" ]; then
    S2C_SKIP="libgmr.so was not built (--disable-shared?)"
    return
  fi
  PYTHONPATH="$1/python${PYTHONPATH:+:$PYTHONPATH}"
  PYTHONDONTWRITEBYTECODE=1 # keep the source tree clean (it may be read-only)
  export GMR_LIBRARY PYTHONPATH PYTHONDONTWRITEBYTECODE
  S2C_PRELOAD=$(ldd "$GMR_LIBRARY" 2>/dev/null | awk '/lib(asan|tsan)\.so/ {print $3}' | head -n 1)
  case "$S2C_PRELOAD" in
  *tsan*) S2C_SKIP="python3 does not run with the ThreadSanitizer runtime preloaded" ;;
  esac
}
gpy() { # gpy ARGS...: "$PY" ARGS..., with the sanitizer runtime libgmr needs
  if [ -n "$S2C_PRELOAD" ]; then
    LD_PRELOAD="$S2C_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}" \
      ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$PY" "$@"
  else
    "$PY" "$@"
  fi
}
