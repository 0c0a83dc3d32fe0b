/* tap.h: a small TAP producer for gmr's test programs.
 *
 * Each test program prints "1..N" at the end (done_testing), one "ok N - name"
 * or "not ok N - name" per check, and "# ..." diagnostics.  Typed comparisons
 * print both values on failure.  skip_all() ends the program with a reason
 * (used when no CUDA device is present).
 */
#ifndef GMR_TAP_H
#define GMR_TAP_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count;
static int tap_failed;

static inline void tap_vresult(int pass, const char *fmt, va_list ap) {
  ++tap_count;
  if (!pass) ++tap_failed;
  printf("%s %d - ", pass ? "ok" : "not ok", tap_count);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
}

static inline int ok(int pass, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tap_vresult(pass, fmt, ap);
  va_end(ap);
  return pass;
}

static inline void diag(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("# ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

#define is_int(got, want, ...)                                                                     \
  do {                                                                                             \
    long long tap_g_ = (long long)(got), tap_w_ = (long long)(want);                               \
    if (!ok(tap_g_ == tap_w_, __VA_ARGS__))                                                        \
      diag("  got: %lld, expected: %lld (%s:%d)", tap_g_, tap_w_, __FILE__, __LINE__);             \
  } while (0)

#define is_u64(got, want, ...)                                                                     \
  do {                                                                                             \
    unsigned long long tap_g_ = (unsigned long long)(got), tap_w_ = (unsigned long long)(want);    \
    if (!ok(tap_g_ == tap_w_, __VA_ARGS__))                                                        \
      diag("  got: %llu, expected: %llu (%s:%d)", tap_g_, tap_w_, __FILE__, __LINE__);             \
  } while (0)

#define is_ptr(got, want, ...)                                                                     \
  do {                                                                                             \
    const void *tap_g_ = (const void *)(got), *tap_w_ = (const void *)(want);                      \
    if (!ok(tap_g_ == tap_w_, __VA_ARGS__))                                                        \
      diag("  got: %p, expected: %p (%s:%d)", tap_g_, tap_w_, __FILE__, __LINE__);                 \
  } while (0)

#define is_str(got, want, ...)                                                                     \
  do {                                                                                             \
    const char *tap_g_ = (got), *tap_w_ = (want);                                                  \
    if (!ok(tap_g_ && tap_w_ && strcmp(tap_g_, tap_w_) == 0, __VA_ARGS__))                         \
      diag("  got: \"%s\"\n#   expected: \"%s\" (%s:%d)", tap_g_ ? tap_g_ : "(null)",              \
           tap_w_ ? tap_w_ : "(null)", __FILE__, __LINE__);                                        \
  } while (0)

#define like(got, needle, ...)                                                                     \
  do {                                                                                             \
    const char *tap_g_ = (got), *tap_n_ = (needle);                                                \
    if (!ok(tap_g_ && strstr(tap_g_, tap_n_) != NULL, __VA_ARGS__))                                \
      diag("  \"%s\"\n#   does not contain \"%s\" (%s:%d)", tap_g_ ? tap_g_ : "(null)", tap_n_,    \
           __FILE__, __LINE__);                                                                    \
  } while (0)

/* One skipped check, with a reason. */
static inline void skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ++tap_count;
  printf("ok %d # SKIP ", tap_count);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

static inline int done_testing(void) {
  printf("1..%d\n", tap_count);
  return tap_failed ? 1 : 0;
}

static inline void skip_all(const char *reason) {
  printf("1..0 # SKIP %s\n", reason);
  exit(0);
}

/* The source tree, for fixtures and shipped files. */
static inline const char *tap_srcdir(void) {
  const char *d = getenv("GMR_SRCDIR");
  return d && *d ? d : ".";
}

#endif /* GMR_TAP_H */
