/* util.c: host memory for metadata, growable strings, and the one parser of
 * sizes, numbers and booleans (internal.h).
 *
 * All of the library's own host memory goes through gmr__malloc and friends,
 * so a test can fail the k-th host allocation (gmr__host_fail_nth) as it
 * fails device reservations on the simulator.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* ---- host memory ---------------------------------------------------------
 * host_fail_countdown: 0 = disarmed; k = the k-th next allocation fails. */
static _Atomic uint64_t host_fail_countdown;

void gmr__host_fail_nth(uint64_t k) {
  atomic_store(&host_fail_countdown, k);
}

static bool host_should_fail(void) {
  uint64_t c = atomic_load_explicit(&host_fail_countdown, memory_order_relaxed);
  while (c != 0) {
    if (atomic_compare_exchange_weak(&host_fail_countdown, &c, c - 1)) return c == 1;
  }
  return false;
}

void *gmr__malloc(size_t size) {
  return host_should_fail() ? NULL : malloc(size);
}
void *gmr__calloc(size_t n, size_t size) {
  return host_should_fail() ? NULL : calloc(n, size);
}
void *gmr__realloc(void *p, size_t size) {
  return host_should_fail() ? NULL : realloc(p, size);
}
void gmr__free(void *p) {
  free(p);
}

char *gmr__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = gmr__malloc(n);
  if (d != NULL) memcpy(d, s, n);
  return d;
}

/* ---- growable strings ------------------------------------------------------
 * Invariant: data == NULL || data[len] == '\0', and len < cap. */

static bool sb_reserve(gmr_strbuf_t *sb, size_t extra) {
  if (sb->failed) return false;
  if (sb->len + extra + 1 <= sb->cap) return true;
  size_t cap = sb->cap ? sb->cap : 256;
  while (cap < sb->len + extra + 1)
    cap *= 2;
  char *d = realloc(sb->data, cap); /* plain realloc: error text must survive host faults */
  if (d == NULL) {
    sb->failed = true;
    return false;
  }
  sb->data = d;
  sb->cap = cap;
  return true;
}

void gmr__sb_vprintf(gmr_strbuf_t *sb, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0 || !sb_reserve(sb, (size_t)n)) return;
  vsnprintf(sb->data + sb->len, sb->cap - sb->len, fmt, ap);
  sb->len += (size_t)n;
}

void gmr__sb_printf(gmr_strbuf_t *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gmr__sb_vprintf(sb, fmt, ap);
  va_end(ap);
}

void gmr__sb_puts(gmr_strbuf_t *sb, const char *s) {
  size_t n = strlen(s);
  if (!sb_reserve(sb, n)) return;
  memcpy(sb->data + sb->len, s, n + 1);
  sb->len += n;
}

void gmr__sb_free(gmr_strbuf_t *sb) {
  free(sb->data);
  memset(sb, 0, sizeof *sb);
}

/* ---- sizes -------------------------------------------------------------------
 * "4096", "512B", "4KiB", "1.5GiB", "2MB" (decimal), "8 GiB", "0x1000".
 * Binary units: KiB MiB GiB TiB (and K M G T, as PyTorch users write them);
 * decimal units: KB MB GB TB. */

int gmr__parse_size(const char *text, uint64_t *out) {
  bool too_large;
  return gmr__parse_size_why(text, out, &too_large);
}

int gmr__parse_size_why(const char *text, uint64_t *out, bool *too_large) {
  *too_large = false;
  if (text == NULL) return GMR_EINVAL;
  while (isspace((unsigned char)*text))
    ++text;
  if (*text == '\0' || *text == '-') return GMR_EINVAL;
  if (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 16);
    if (end == text + 2) return GMR_EINVAL;
    *too_large = errno == ERANGE;
    if (errno != 0) return GMR_EINVAL;
    while (isspace((unsigned char)*end))
      ++end;
    if (*end != '\0') return GMR_EINVAL;
    *out = v;
    return 0;
  }
  if (!isdigit((unsigned char)*text) && *text != '.') return GMR_EINVAL; /* no "inf", "nan" */
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || !(v >= 0)) return GMR_EINVAL;
  bool huge = isinf(v) || (errno == ERANGE && v > 1.0); /* ERANGE also means underflow */
  if (errno != 0 && !huge) return GMR_EINVAL;
  while (isspace((unsigned char)*end))
    ++end;
  char unit[8];
  size_t ulen = strlen(end);
  while (ulen > 0 && isspace((unsigned char)end[ulen - 1]))
    --ulen;
  if (ulen >= sizeof unit) return GMR_EINVAL;
  memcpy(unit, end, ulen);
  unit[ulen] = '\0';
  static const struct {
    const char *unit;
    double mult;
  } units[] = {
      {"", 1.0},
      {"B", 1.0},
      {"KiB", 1024.0},
      {"MiB", 1048576.0},
      {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0},
      {"PiB", 1125899906842624.0},
      {"EiB", 1152921504606846976.0},
      {"K", 1024.0},
      {"M", 1048576.0},
      {"G", 1073741824.0},
      {"T", 1099511627776.0},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"kB", 1e3},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; ++i) {
    if (strcmp(unit, units[i].unit) == 0) {
      double bytes = v * units[i].mult;
      if (huge || bytes >= 18446744073709551616.0) {
        *too_large = true; /* well formed, but not in 64 bits */
        return GMR_EINVAL;
      }
      if (bytes != floor(bytes)) return GMR_EINVAL; /* fractional bytes */
      *out = (uint64_t)bytes;
      return 0;
    }
  }
  return GMR_EINVAL;
}

/* ---- numbers and booleans ------------------------------------------------ */

int gmr__parse_bool(const char *text, unsigned flags, bool *out) {
  static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On", NULL};
  static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "Off", NULL};
  if (text == NULL) return GMR_EINVAL;
  for (int i = 0; yes[i]; ++i)
    if (strcmp(text, yes[i]) == 0) return (*out = true), 0;
  for (int i = 0; no[i]; ++i)
    if (strcmp(text, no[i]) == 0) return (*out = false), 0;
  if ((flags & GMR_BOOL_DIGITS) && (strcmp(text, "1") == 0 || strcmp(text, "0") == 0))
    return (*out = text[0] == '1'), 0;
  return GMR_EINVAL;
}

int gmr__parse_int(const char *text, int64_t *out) {
  if (text == NULL) return GMR_EINVAL;
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return GMR_EINVAL;
  *out = v;
  return 0;
}

int gmr__parse_u64(const char *text, uint64_t *out) {
  if (text == NULL || text[0] == '-') return GMR_EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return GMR_EINVAL;
  *out = v;
  return 0;
}

int gmr__parse_double(const char *text, double *out) {
  if (text == NULL) return GMR_EINVAL;
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || isnan(v)) return GMR_EINVAL;
  *out = v;
  return 0;
}

int gmr_parse_size(const char *text, uint64_t *out) {
  if (out == NULL) return GMR_EINVAL;
  return gmr__parse_size(text, out);
}

void gmr_format_size(uint64_t bytes, char *buf, size_t len) {
  if (buf != NULL && len > 0) gmr__format_size(bytes, buf, len);
}

void gmr__format_size(uint64_t bytes, char *buf, size_t len) {
  static const char *const names[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%llu bytes", (unsigned long long)bytes);
    return;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  snprintf(buf, len, "%.2f %s", v, names[u]);
}
