/* replay-rmm.c: the fields of RMM's logging_resource_adaptor logs, and the
 * call-site column, for the trace reader (replay.c).
 *
 * RMM's adaptor writes "Thread,Time,Action,Pointer,Size,Stream" with Time as
 * a clock time (HH:MM:SS.ffffff; its documentation also shows seconds since
 * the epoch with a fraction), Action allocate, free (deallocate in some
 * versions and documents) or "allocate failure" (with a null pointer, printed
 * "(nil)" or "0x0"), and pointers and streams as C or C++ print them.  gmr's
 * own traces are the same layout with integer microseconds.  Time is kept
 * for reference only: a replay runs the events in file order.
 * Call sites are interned: see Note [Call sites].
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "replay/replay-formats.h"

static bool all_digits(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* Digits [s, s + n) as a number below 10^18. */
static uint64_t digits_value(const char *s, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i)
    v = v * 10 + (uint64_t)(s[i] - '0');
  return v;
}

/* The fraction ".ffffff" (up to 9 digits) as microseconds. */
static bool fraction_us(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 9 || !all_digits(s, n)) return false;
  uint64_t v = digits_value(s, n);
  for (size_t i = n; i < 6; ++i)
    v *= 10;
  for (size_t i = 6; i < n; ++i)
    v /= 10;
  *out = v;
  return true;
}

bool gmr__trace_parse_time(const char *s, uint64_t *out_us) {
  size_t n = strlen(s);
  const char *dot = strchr(s, '.');
  if (strchr(s, ':') != NULL) {
    /* HH:MM:SS[.ffffff] */
    if (n < 8 || !all_digits(s, 2) || s[2] != ':' || !all_digits(s + 3, 2) || s[5] != ':' ||
        !all_digits(s + 6, 2))
      return false;
    uint64_t h = digits_value(s, 2), m = digits_value(s + 3, 2), sec = digits_value(s + 6, 2);
    if (h > 23 || m > 59 || sec > 60) return false;
    uint64_t frac = 0;
    if (n > 8 && (s[8] != '.' || !fraction_us(s + 9, &frac))) return false;
    *out_us = ((h * 60 + m) * 60 + sec) * 1000000 + frac;
    return true;
  }
  size_t whole = dot ? (size_t)(dot - s) : n;
  if (whole > 18 || !all_digits(s, whole)) return false;
  uint64_t frac = 0;
  if (dot) {
    /* seconds since the epoch with a fraction */
    if (whole > 12 || !fraction_us(dot + 1, &frac)) return false;
    *out_us = digits_value(s, whole) * 1000000 + frac;
    return true;
  }
  *out_us = digits_value(s, whole); /* gmr: integer microseconds */
  return true;
}

int gmr__trace_parse_action(const char *s) {
  if (strcmp(s, "allocate") == 0) return GMR_TRACE_ALLOC;
  if (strcmp(s, "free") == 0 || strcmp(s, "deallocate") == 0) return GMR_TRACE_FREE;
  if (strcmp(s, "record_stream") == 0) return GMR_TRACE_RECORD_STREAM;
  if (strcmp(s, "empty_cache") == 0) return GMR_TRACE_EMPTY_CACHE;
  if (strcmp(s, "allocate failure") == 0 || strcmp(s, "allocate_failure") == 0)
    return GMR__TRACE_ALLOC_FAILURE;
  return -1;
}

bool gmr__trace_parse_handle(const char *s, uint64_t *out) {
  if (strcmp(s, "(nil)") == 0 || strcmp(s, "nullptr") == 0 || strcmp(s, "(null)") == 0) {
    *out = 0;
    return true;
  }
  if (*s == '\0' || *s == '-' || *s == '+' || *s == ' ') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

/* ---- call sites -------------------------------------------------------------- */

/* Note [Call sites]
 * Call sites are interned in an open-addressing table:
 *   index(text) = 1 + position of text among the distinct texts, in order
 *   of first use;  load <= 1/2.
 * The texts come from the trace, so the slot of a text is a keyed hash of it
 * (core/hash.c, Note [Keyed hashing]) under a key drawn for each table:
 * texts chosen to collide under a fixed hash (131,072 of them took 44 s
 * under FNV-1a) spread like any others.  The key decides only slots, never
 * an index, so the trace read is the same under every key.  `probes` counts
 * the slots looked at, for the tests (tests/hardening.c).
 */
struct gmr__sites_s {
  char **texts;    /* texts[k - 1] for index k */
  size_t n, cap;   /* texts in use, allocated */
  uint32_t *slots; /* 0: empty; else an index */
  size_t mask;     /* slots - 1, a power of two minus one */
  gmr_hash_key_t key;
  uint64_t probes;
};

static size_t sites_home(const gmr__sites_t *s, const char *text, size_t len, size_t mask) {
  return (size_t)gmr__hash_keyed(&s->key, text, len) & mask;
}

gmr__sites_t *gmr__sites_new(void) {
  gmr__sites_t *s = gmr__calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->slots = gmr__calloc(64, sizeof *s->slots);
  if (s->slots == NULL) {
    gmr__free(s);
    return NULL;
  }
  s->mask = 63;
  gmr__hash_key_new(&s->key);
  return s;
}

static bool sites_rehash(gmr__sites_t *s) {
  size_t cap = (s->mask + 1) * 2;
  uint32_t *slots = gmr__calloc(cap, sizeof *slots);
  if (slots == NULL) return false;
  for (size_t k = 1; k <= s->n; ++k) {
    const char *text = s->texts[k - 1];
    size_t i = sites_home(s, text, strlen(text), cap - 1);
    for (++s->probes; slots[i] != 0; ++s->probes)
      i = (i + 1) & (cap - 1);
    slots[i] = (uint32_t)k;
  }
  gmr__free(s->slots);
  s->slots = slots;
  s->mask = cap - 1;
  return true;
}

uint32_t gmr__sites_intern(gmr__sites_t *s, const char *text) {
  size_t i = sites_home(s, text, strlen(text), s->mask);
  for (++s->probes; s->slots[i] != 0; i = (i + 1) & s->mask, ++s->probes)
    if (strcmp(s->texts[s->slots[i] - 1], text) == 0) return s->slots[i];
  if (s->n >= UINT32_MAX - 1) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    char **t = gmr__realloc(s->texts, cap * sizeof *t);
    if (t == NULL) return 0;
    s->texts = t;
    s->cap = cap;
  }
  char *copy = gmr__strdup(text);
  if (copy == NULL) return 0;
  s->texts[s->n++] = copy;
  s->slots[i] = (uint32_t)s->n;
  if (s->n * 2 > s->mask + 1 && !sites_rehash(s)) {
    gmr__free(s->texts[--s->n]);
    s->slots[i] = 0;
    return 0;
  }
  return (uint32_t)s->n;
}

uint64_t gmr__sites_probes(const gmr__sites_t *s) {
  return s->probes;
}

void gmr__sites_finish(gmr__sites_t *s, gmr_trace_data_t *t) {
  if (s == NULL) return;
  if (t != NULL) {
    t->sites = s->texts;
    t->n_sites = s->n;
  } else {
    for (size_t k = 0; k < s->n; ++k)
      gmr__free(s->texts[k]);
    gmr__free(s->texts);
  }
  gmr__free(s->slots);
  gmr__free(s);
}
