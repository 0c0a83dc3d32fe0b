/* internal.h: helpers shared by the files of libgmr (prefix gmr__).
 *
 * Host memory hook, the per-thread error buffer, a growable string builder,
 * assertions by debug level, PyTorch-style statistic records, and the option
 * tables that drive the YAML loader.
 */
#ifndef GMR_INTERNAL_H
#define GMR_INTERNAL_H

#ifdef HAVE_CONFIG_H
#include "build-config.h"
#endif

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gmr.h"

#if defined(__GNUC__)
#define GMR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define GMR_LIKELY(x)    __builtin_expect(!!(x), 1)
#define GMR_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#else
#define GMR_PRINTF(a, b)
#define GMR_LIKELY(x)   (x)
#define GMR_UNLIKELY(x) (x)
#endif

/* ---- Debug levels: --enable-debug[=1|2|3] sets GMR_DEBUG. ---------------- */
#ifndef GMR_DEBUG
#define GMR_DEBUG 0
#endif
void gmr__assert_fail(const char *expr, const char *file, int line);
#define gmr__assert_at(level, x)                                                                   \
  ((GMR_DEBUG >= (level) && !(x)) ? gmr__assert_fail(#x, __FILE__, __LINE__) : (void)0)
#define gmr_assert(x)           gmr__assert_at(1, x)
#define gmr_assert_internal(x)  gmr__assert_at(2, x)
#define gmr_assert_expensive(x) gmr__assert_at(3, x)

/* ---- Host memory for the library's own metadata (replaceable in tests). -- */
void *gmr__malloc(size_t size);
void *gmr__calloc(size_t n, size_t size);
void *gmr__realloc(void *p, size_t size);
void gmr__free(void *p);
char *gmr__strdup(const char *s);
/* Fail the k-th host allocation from now on (tests); 0 disarms. */
void gmr__host_fail_nth(uint64_t k);

/* ---- Growable strings. --------------------------------------------------- */
typedef struct gmr_strbuf_s {
  char *data;  /* NUL-terminated; NULL until the first append */
  size_t len;  /* bytes, without the NUL */
  size_t cap;  /* bytes allocated */
  bool failed; /* a host allocation failed; the text is truncated */
} gmr_strbuf_t;
void gmr__sb_printf(gmr_strbuf_t *sb, const char *fmt, ...) GMR_PRINTF(2, 3);
void gmr__sb_vprintf(gmr_strbuf_t *sb, const char *fmt, va_list ap);
void gmr__sb_puts(gmr_strbuf_t *sb, const char *s);
void gmr__sb_free(gmr_strbuf_t *sb);
static inline const char *gmr__sb_str(const gmr_strbuf_t *sb) {
  return sb->data ? sb->data : "";
}

/* ---- Per-thread last error. ---------------------------------------------
 * Policies and backends describe a failure with gmr__error_set; the runtime
 * tags it with the runtime that failed, so gmr_last_error(rt) is per thread
 * and per runtime. */
int gmr__error_set(int code, const char *fmt, ...) GMR_PRINTF(2, 3); /* returns code */
int gmr__error_set_text(int code, const char *text);                 /* returns code */
void gmr__error_clear(void);
void gmr__error_tag(const void *owner);
const char *gmr__error_text(const void *owner);
const char *gmr__error_last(void); /* the thread's last text, whoever set it */

/* ---- Logging (silent unless asked). -------------------------------------- */
void gmr__log(gmr_log_level_t level, const char *fmt, ...) GMR_PRINTF(2, 3);

/* ---- Sizes. --------------------------------------------------------------- */
/* Largest request any policy considers: larger ones fail up front. */
#define GMR_MAX_REQUEST ((size_t)1 << 60) /* 1 EiB, PyTorch's limit */
/* Largest value of any size option (the configuration loader refuses more),
 * so that sums and roundings of a few sizes stay below 2^64. */
#define GMR_MAX_SIZE_OPTION ((uint64_t)1 << 60) /* 1 EiB */
static inline size_t gmr__align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}
/* p rounded up to a multiple of a (a power of two): an aligned object
 * inside a host allocation made a - 1 bytes larger. */
static inline void *gmr__align_ptr(void *p, size_t a) {
  return (void *)(((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1));
}
static inline bool gmr__is_pow2(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

/* ---- Hashing. ------------------------------------------------------------- */
/* Fibonacci hashing (Knuth, TAOCP 6.4): multiply by 2^64 / phi, the golden
 * ratio, and take the top bits, which mix every bit of the key.  The one
 * constant of every hash table keyed by a pointer, a stream or a length:
 *     gmr__hash_bits(x, b) = floor(x * GMR_HASH_GOLDEN mod 2^64 / 2^(64 - b)),
 * a value in [0, 2^b), for 1 <= b <= 63. */
#define GMR_HASH_GOLDEN 0x9E3779B97F4A7C15ull
static inline uint64_t gmr__hash_mul(uint64_t x) {
  return x * GMR_HASH_GOLDEN;
}
static inline size_t gmr__hash_bits(uint64_t x, unsigned bits) {
  return (size_t)(gmr__hash_mul(x) >> (64 - bits));
}
/* A keyed hash (hash.c, Note [Keyed hashing]) for tables whose keys come
 * from outside, so that nobody can choose keys that collide: SipHash-1-3
 * of data[0, len) under a 128-bit key, which gmr__hash_key_new draws at
 * random. */
typedef struct gmr_hash_key_s {
  uint64_t k[2];
} gmr_hash_key_t;
void gmr__hash_key_new(gmr_hash_key_t *key);
uint64_t gmr__hash_keyed(const gmr_hash_key_t *key, const void *data, size_t len);
/* The one parser of scalars (util.c), for YAML values, PyTorch-style option
 * strings and environment variables alike.  Each takes the whole string
 * and returns 0, or GMR_EINVAL and leaves *out untouched. */
/* Parse "512MiB", "8GiB", "1.5GB", "4096", "0x1000". */
int gmr__parse_size(const char *text, uint64_t *out);
/* The same; on GMR_EINVAL, *too_large tells a well-formed size past 2^64 - 1
 * ("16EiB", "0x10000000000000000") from malformed text. */
int gmr__parse_size_why(const char *text, uint64_t *out, bool *too_large);
/* true/True/TRUE/yes/Yes/on/On and false/False/FALSE/no/No/off/Off; with
 * GMR_BOOL_DIGITS also 1 and 0 (as PyTorch's option strings take them). */
#define GMR_BOOL_DIGITS 1u
int gmr__parse_bool(const char *text, unsigned flags, bool *out);
/* A decimal integer (strtoll: optional sign, leading blanks), in range. */
int gmr__parse_int(const char *text, int64_t *out);
/* A decimal count (strtoull), no minus sign, in range. */
int gmr__parse_u64(const char *text, uint64_t *out);
/* A number (strtod), finite or infinite but not NaN, in range. */
int gmr__parse_double(const char *text, double *out);
/* "1.50 GiB" style, for messages. */
void gmr__format_size(uint64_t bytes, char *buf, size_t len);

/* ---- PyTorch-style statistic record (c10 Stat). ---------------------------
 * increase: current += n; peak = max(peak, current); allocated += n.
 * decrease: current -= n; freed += n. */
typedef struct gmr_stat_s {
  int64_t current, peak, allocated, freed;
} gmr_stat_t;
static inline void gmr__stat_increase(gmr_stat_t *s, int64_t n) {
  s->current += n;
  if (s->current > s->peak) s->peak = s->current;
  s->allocated += n;
}
static inline void gmr__stat_decrease(gmr_stat_t *s, int64_t n) {
  s->current -= n;
  s->freed += n;
}
static inline void gmr__stat_reset_peak(gmr_stat_t *s) {
  s->peak = s->current;
}
static inline void gmr__stat_reset_accumulated(gmr_stat_t *s) {
  s->allocated = s->freed = 0;
}

/* ---- Option tables (one per policy and for the device section). ---------- */
typedef enum gmr_opt_type_e {
  GMR_OPT_BOOL,   /* bool */
  GMR_OPT_SIZE,   /* uint64_t bytes; accepts units ("512MiB") */
  GMR_OPT_INT,    /* int64_t */
  GMR_OPT_DOUBLE, /* double */
  GMR_OPT_STRING, /* char * (owned by the options; freed by gmr__opts_free) */
  GMR_OPT_ENUM,   /* int: index into `choices` */
  GMR_OPT_CUSTOM, /* parsed by `parse` from the scalar's text */
  GMR_OPT_TABLE   /* a nested mapping: a struct at `offset` described by `sub` */
} gmr_opt_type_t;

typedef struct gmr_opt_desc_s {
  const char *key; /* YAML key */
  gmr_opt_type_t type;
  size_t offset;              /* offsetof(options struct, field) */
  double min, max;            /* inclusive range for INT/SIZE/DOUBLE (max 0: none) */
  const char *const *choices; /* ENUM: NULL-terminated names */
  /* CUSTOM: parse `text` into the field; on error write a sentence to err. */
  int (*parse)(const char *text, void *field, char *err, size_t errlen);
  const struct gmr_opt_desc_s *sub; /* TABLE: the nested keys (offsets in the struct) */
  const char *default_text;         /* for the reference */
  const char *help;                 /* one sentence */
  bool min_exclusive;               /* the range's lower bound is exclusive */
  /* The environment variable(s) that override this option when a runtime is
   * created, separated by spaces (NULL: none); shown in docs/config.md.  The
   * config layer reads them (gmr__config_apply_env, config-env.c) and, when
   * one is set, calls env_apply with their values in that order (NULL:
   * unset) and the device the runtime is created for.  env_apply returns 0,
   * or GMR_ECONFIG with a sentence in err. */
  const char *env;
  int (*env_apply)(const char *const *values, void *opts, int device, char *err, size_t errlen);
  /* Values worth trying when tuning the option for a workload (gmr-compare
   * --suggest reads them through gmr_policy_options): YAML scalars, NULL-
   * terminated; "1.25x peak" scales the workload's peak requested bytes (see
   * gmr_option_info_t).  NULL: the option is not tuned. */
  const char *const *tune;
} gmr_opt_desc_t;

#endif /* GMR_INTERNAL_H */
