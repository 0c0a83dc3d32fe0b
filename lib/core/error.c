/* error.c: error codes, the per-thread last-error buffer, and logging.
 *
 * The last error is kept per thread in a growable buffer (an OOM report of
 * the BFC policy runs to thousands of lines), tagged with the runtime that
 * set it, so gmr_last_error(rt) never shows another runtime's failure.  The
 * buffer is released at thread exit through a pthread key destructor.
 *
 * Logging is silent unless a callback is set (gmr_set_log) or GMR_LOG=1
 * (read by the config layer, config-env.c).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config-env.h"
#include "core/internal.h"

const char *gmr_strerror(int err) {
  switch (err) {
  case GMR_OK:
    return "success";
#define GMR__ERR_STR(name, value, msg)                                                             \
  case GMR_##name:                                                                                 \
    return msg;
    GMR_ERRNO_MAP(GMR__ERR_STR)
#undef GMR__ERR_STR
  default:
    return "unknown error";
  }
}

const char *gmr_err_name(int err) {
  switch (err) {
  case GMR_OK:
    return "GMR_OK";
#define GMR__ERR_NAME(name, value, msg)                                                            \
  case GMR_##name:                                                                                 \
    return "GMR_" #name;
    GMR_ERRNO_MAP(GMR__ERR_NAME)
#undef GMR__ERR_NAME
  default:
    return "GMR_EUNKNOWN";
  }
}

/* ---- per-thread error ----------------------------------------------------- */

typedef struct error_tls_s {
  gmr_strbuf_t text; /* the message */
  const void *owner; /* the runtime it belongs to (NULL: not tagged yet) */
} error_tls_t;

static pthread_key_t error_key;
static pthread_once_t error_once = PTHREAD_ONCE_INIT;

static void error_tls_destroy(void *p) {
  error_tls_t *e = p;
  if (e == NULL) return;
  free(e->text.data);
  free(e);
}

static void error_key_init(void) {
  (void)pthread_key_create(&error_key, error_tls_destroy);
}

/* Uses plain malloc, not gmr__malloc: an error must be recordable while the
 * host-allocation fault injection of a test is failing gmr__malloc. */
static error_tls_t *error_tls(void) {
  (void)pthread_once(&error_once, error_key_init);
  error_tls_t *e = pthread_getspecific(error_key);
  if (e == NULL) {
    e = calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    if (pthread_setspecific(error_key, e) != 0) {
      free(e);
      return NULL;
    }
  }
  return e;
}

static void error_store(const char *text, size_t len) {
  error_tls_t *e = error_tls();
  if (e == NULL) return;
  if (len + 1 > e->text.cap) {
    size_t cap = len + 1 < 256 ? 256 : len + 1;
    char *d = realloc(e->text.data, cap);
    if (d == NULL) return; /* keep the previous text rather than fail */
    e->text.data = d;
    e->text.cap = cap;
  }
  memcpy(e->text.data, text, len);
  e->text.data[len] = '\0';
  e->text.len = len;
  e->owner = NULL;
}

int gmr__error_set(int code, const char *fmt, ...) {
  char small[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return code;
  if ((size_t)n < sizeof small) {
    error_store(small, (size_t)n);
    return code;
  }
  char *big = malloc((size_t)n + 1);
  if (big == NULL) {
    error_store(small, sizeof small - 1);
    return code;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  error_store(big, (size_t)n);
  free(big);
  return code;
}

int gmr__error_set_text(int code, const char *text) {
  error_store(text, strlen(text));
  return code;
}

void gmr__error_clear(void) {
  error_tls_t *e = error_tls();
  if (e == NULL || e->text.data == NULL) return;
  e->text.data[0] = '\0';
  e->text.len = 0;
  e->owner = NULL;
}

void gmr__error_tag(const void *owner) {
  error_tls_t *e = error_tls();
  if (e != NULL && e->owner == NULL) e->owner = owner;
}

const char *gmr__error_text(const void *owner) {
  error_tls_t *e = error_tls();
  if (e == NULL || e->text.data == NULL || e->owner != owner) return "";
  return e->text.data;
}

const char *gmr_thread_last_error(void) {
  return gmr__error_last();
}

const char *gmr__error_last(void) {
  error_tls_t *e = error_tls();
  return e && e->text.data ? e->text.data : "";
}

/* ---- logging ----------------------------------------------------------------
 * Synchronization: log_fn/log_ud are set once by the application, normally
 * before any runtime exists; reads are racy-by-design only if the
 * application changes them while logging, which it must not do. */

static gmr_log_fn log_fn;
static void *log_ud;
static int log_env = -1; /* -1: GMR_LOG not read yet */

void gmr_set_log(gmr_log_fn fn, void *ud) {
  log_fn = fn;
  log_ud = ud;
}

void gmr__log(gmr_log_level_t level, const char *fmt, ...) {
  if (log_fn == NULL) {
    if (log_env < 0) log_env = gmr__env_log() ? 1 : 0;
    if (!log_env || level > GMR_LOG_WARN) return;
  }
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (log_fn != NULL)
    log_fn(level, buf, log_ud);
  else
    fprintf(stderr, "gmr: %s: %s\n", level == GMR_LOG_ERROR ? "error" : "warning", buf);
}

void gmr__assert_fail(const char *expr, const char *file, int line) {
  /* Writes without allocating or locking. */
  char buf[512];
  int n = snprintf(buf, sizeof buf, "gmr: assertion failed: %s (%s:%d)\n", expr, file, line);
  if (n > 0) fwrite(buf, 1, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, stderr);
  abort();
}
