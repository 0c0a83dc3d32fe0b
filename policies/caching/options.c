/* options.c: the caching policy's options: YAML keys and PYTORCH_CUDA_ALLOC_CONF.
 *
 * The option table (keys, types, limits, help for docs/config.md), the
 * defaults, the tokenizer of PYTORCH_CUDA_ALLOC_CONF strings and their
 * parser with PyTorch's error messages (c10's CUDAAllocatorConfig and
 * AcceleratorAllocatorConfig), and the merging of keys and string into the
 * options in force (cache_conf_t).  Every option has a "not given" value, so
 * an option given both as a key and in the string is refused:
 *   given(key) and given(string)  =>  GMR_ECONFIG
 *   in force = key if given(key), else string if given(string), else PyTorch's default.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "caching/internal.h"

const cache_opts_t gmr__cache_opts_default = {
    .expandable_segments = -1,
    .per_process_memory_fraction = -1.0,
    .release_lock_on_cudamalloc = -1,
};

/* ---- options: YAML keys and PYTORCH_CUDA_ALLOC_CONF ------------------------------------------ */

/* PyTorch's option strings take 1 and 0 as well as YAML's words. */
static int cache_parse_bool_text(const char *t, int *out) {
  bool b;
  if (gmr__parse_bool(t, GMR_BOOL_DIGITS, &b) != 0) return GMR_EINVAL;
  *out = b;
  return 0;
}

static int cache_parse_tribool(const char *text, void *field, char *err, size_t errlen) {
  if (cache_parse_bool_text(text, (int *)field) != 0) {
    snprintf(err, errlen, "expected true or false");
    return GMR_EINVAL;
  }
  return 0;
}

/* One "[<MB>:<N>, ..., >:<N>]" list, or a single power of two, as
 * AcceleratorAllocatorConfig (PyTorch 2.9+) reads them.  `tok` are the
 * tokens of the whole string (or of the YAML value), `*i` the index of the
 * value's first token; on return *i is the index of its last token. */
typedef struct cache_tok_s {
  const char *s; /* not NUL-terminated */
  size_t len;
} cache_tok_t;

static bool tok_is(const cache_tok_t *t, const char *w) {
  return t->len == strlen(w) && memcmp(t->s, w, t->len) == 0;
}

/* A token as a C string, for the parsers of util.c; GMR_EINVAL when empty
 * or too long to be a number. */
static int tok_text(const cache_tok_t *t, char *buf, size_t len) {
  if (t->len == 0 || t->len >= len) return GMR_EINVAL;
  memcpy(buf, t->s, t->len);
  buf[t->len] = '\0';
  return 0;
}

/* Digits only (no sign, no blanks), at most 19 of them. */
static int tok_u64(const cache_tok_t *t, uint64_t *out) {
  char buf[20];
  if (tok_text(t, buf, sizeof buf) != 0) return GMR_EINVAL;
  for (size_t k = 0; k < t->len; ++k)
    if (!isdigit((unsigned char)buf[k])) return GMR_EINVAL;
  return gmr__parse_u64(buf, out);
}

static int tok_double(const cache_tok_t *t, double *out) {
  char buf[64];
  if (tok_text(t, buf, sizeof buf) != 0) return GMR_EINVAL;
  return gmr__parse_double(buf, out);
}

/* Split on , : [ ] (each its own token); whitespace is dropped. */
static size_t cache_tokenize(const char *s, cache_tok_t *tok) {
  size_t n = 0;
  for (const char *p = s; *p;) {
    if (isspace((unsigned char)*p)) {
      ++p;
    } else if (strchr(",:[]", *p)) {
      tok[n++] = (cache_tok_t){p, 1};
      ++p;
    } else {
      const char *q = p;
      while (*q && !isspace((unsigned char)*q) && !strchr(",:[]", *q))
        ++q;
      tok[n++] = (cache_tok_t){p, (size_t)(q - p)};
      p = q;
    }
  }
  return n;
}

#define TOKF    "%.*s"
#define TOKA(t) (int)(t).len, (t).s

static int cache_parse_divs_tokens(const cache_tok_t *tok, size_t n, size_t *i, const char *where,
                                   cache_divs_t *out, char *err, size_t errlen) {
  cache_divs_t d = {.given = true};
  uint64_t v;
  if (*i >= n) {
    snprintf(err, errlen, "%sexpected a value for roundup_power2_divisions at index %zu", where,
             *i);
    return GMR_EINVAL;
  }
  if (!tok_is(&tok[*i], "[")) {
    if (tok_u64(&tok[*i], &v) != 0 || !gmr__is_pow2(v) || v > (1u << 30)) {
      snprintf(err, errlen,
               "%sFor roundups, the divisions has to be power of 2, got '" TOKF
               "' at index %zu for roundup_power2_divisions",
               where, TOKA(tok[*i]), *i);
      return GMR_EINVAL;
    }
    for (int k = 0; k < CACHE_DIV_BUCKETS; ++k)
      d.div[k] = (uint32_t)v;
    *out = d;
    return 0;
  }
  bool first = true;
  size_t last = 0;
  bool any = false;
  for (++*i;; ++*i) {
    if (*i >= n) {
      snprintf(err, errlen, "%sexpected ']' to close the roundup_power2_divisions list", where);
      return GMR_EINVAL;
    }
    if (tok_is(&tok[*i], "]")) break;
    if (any) {
      if (!tok_is(&tok[*i], ",")) {
        snprintf(err, errlen,
                 "%sexpected ',' or ']' at index %zu in roundup_power2_divisions, got '" TOKF "'",
                 where, *i, TOKA(tok[*i]));
        return GMR_EINVAL;
      }
      ++*i;
    }
    any = true;
    if (*i + 2 >= n || !tok_is(&tok[*i + 1], ":")) {
      snprintf(err, errlen,
               "%sexpected '<MB>:<divisions>' or '>:<divisions>' at index %zu in "
               "roundup_power2_divisions",
               where, *i);
      return GMR_EINVAL;
    }
    const cache_tok_t *key = &tok[*i];
    const cache_tok_t *val = &tok[*i + 2];
    if (tok_u64(val, &v) != 0 || (v != 0 && !gmr__is_pow2(v)) || v > (1u << 30)) {
      snprintf(err, errlen,
               "%sFor roundups, the divisions has to be 0 or a power of 2, got '" TOKF
               "' at index %zu in roundup_power2_divisions",
               where, TOKA(*val), *i + 2);
      return GMR_EINVAL;
    }
    if (tok_is(key, ">")) {
      for (size_t k = first ? 0 : last + 1; k < CACHE_DIV_BUCKETS; ++k)
        d.div[k] = (uint32_t)v;
    } else {
      uint64_t mb;
      if (tok_u64(key, &mb) != 0 || !gmr__is_pow2(mb)) {
        snprintf(err, errlen,
                 "%sFor roundups, the intervals have to be power of 2 but got '" TOKF
                 "' at index %zu in roundup_power2_divisions",
                 where, TOKA(*key), *i);
        return GMR_EINVAL;
      }
      size_t idx = (size_t)(63 - __builtin_clzll(mb));
      if (idx > CACHE_DIV_BUCKETS - 1) idx = CACHE_DIV_BUCKETS - 1;
      if (first)
        for (size_t k = 0; k < idx; ++k)
          d.div[k] = (uint32_t)v;
      first = false;
      d.div[idx] = (uint32_t)v;
      last = idx;
    }
    *i += 2;
  }
  *out = d;
  return 0;
}

/* The YAML key `roundup_power2_divisions`: "4" or "[256:1,>:8]". */
static int cache_parse_divs(const char *text, void *field, char *err, size_t errlen) {
  size_t len = strlen(text);
  cache_tok_t *tok = gmr__malloc((len + 1) * sizeof *tok);
  if (tok == NULL) return snprintf(err, errlen, "out of host memory"), GMR_ENOMEM;
  size_t n = cache_tokenize(text, tok), i = 0;
  int rc = cache_parse_divs_tokens(tok, n, &i, "", (cache_divs_t *)field, err, errlen);
  if (rc == 0 && i + 1 != n) {
    snprintf(err, errlen, "unexpected '" TOKF "' at index %zu after the value", TOKA(tok[i + 1]),
             i + 1);
    rc = GMR_EINVAL;
  }
  gmr__free(tok);
  return rc;
}

static int cache_conf_bool(const cache_tok_t *t, size_t i, const char *key, int *out, char *err,
                           size_t errlen) {
  if (tok_is(t, "True")) return (*out = 1), 0;
  if (tok_is(t, "False")) return (*out = 0), 0;
  snprintf(err, errlen,
           "pytorch_alloc_conf: Expected 'True' or 'False' at index %zu for %s, got '" TOKF "'", i,
           key, TOKA(*t));
  return GMR_EINVAL;
}

static int cache_conf_mb(const cache_tok_t *t, size_t i, const char *key, uint64_t *out, char *err,
                         size_t errlen) {
  uint64_t v;
  if (tok_u64(t, &v) != 0) {
    snprintf(err, errlen,
             "pytorch_alloc_conf: expected a whole number of MB at index %zu for %s, got '" TOKF
             "'",
             i, key, TOKA(*t));
    return GMR_EINVAL;
  }
  /* PyTorch clamps to SIZE_MAX; gmr to its largest size option (1 EiB), as
   * unlimited for every purpose, and small enough that no rounding of it
   * overflows (issue 15's expandable segments with a huge segment size). */
  if (v > (GMR_MAX_SIZE_OPTION >> 20)) v = GMR_MAX_SIZE_OPTION >> 20;
  *out = v;
  return 0;
}

/* One option of the string: the key k, its value at tok[*ip] (the
 * divisions' list runs on: *ip is left at its last token). */
static int cache_conf_option(const char *k, const cache_tok_t *tok, size_t n, size_t *ip,
                             cache_opts_t *o, char *err, size_t errlen) {
  size_t i = *ip;
  const cache_tok_t *v = &tok[i];
  uint64_t mb;
  double d;
  int rc = 0;
  if (strcmp(k, "max_split_size_mb") == 0) {
    rc = cache_conf_mb(v, i, k, &mb, err, errlen);
    if (rc == 0 && mb <= 20) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: CachingAllocator option max_split_size_mb too "
               "small, must be > 20 (got %llu at index %zu)",
               (unsigned long long)mb, i);
      rc = GMR_EINVAL;
    }
    if (rc == 0) o->max_split_size = mb << 20;
  } else if (strcmp(k, "max_non_split_rounding_mb") == 0) {
    rc = cache_conf_mb(v, i, k, &mb, err, errlen);
    if (rc == 0 && mb < 20) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: CachingAllocator option "
               "max_non_split_rounding_mb too small, must be >= 20 (got %llu at index %zu)",
               (unsigned long long)mb, i);
      rc = GMR_EINVAL;
    }
    if (rc == 0) o->max_non_split_rounding = mb << 20;
  } else if (strcmp(k, "large_segment_size_mb") == 0) {
    rc = cache_conf_mb(v, i, k, &mb, err, errlen);
    if (rc == 0 && mb <= 10) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: large_segment_size_mb must be > 10 MB (got "
               "%llu at index %zu)",
               (unsigned long long)mb, i);
      rc = GMR_EINVAL;
    }
    if (rc == 0) o->large_segment_size = mb << 20;
  } else if (strcmp(k, "roundup_power2_divisions") == 0) {
    rc = cache_parse_divs_tokens(tok, n, &i, "pytorch_alloc_conf: ", &o->roundup_power2_divisions,
                                 err, errlen);
  } else if (strcmp(k, "garbage_collection_threshold") == 0) {
    if (tok_double(v, &d) != 0 || !(d > 0.0 && d < 1.0)) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: garbage_collect_threshold is invalid, set it "
               "in (0.0, 1.0) (got '" TOKF "' at index %zu)",
               TOKA(*v), i);
      rc = GMR_EINVAL;
    } else {
      o->garbage_collection_threshold = d;
    }
  } else if (strcmp(k, "per_process_memory_fraction") == 0) {
    if (tok_double(v, &d) != 0 || !(d >= 0.0 && d <= 1.0)) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: per_process_memory_fraction is invalid, set "
               "it in [0.0, 1.0] (got '" TOKF "' at index %zu)",
               TOKA(*v), i);
      rc = GMR_EINVAL;
    } else {
      o->per_process_memory_fraction = d;
    }
  } else if (strcmp(k, "expandable_segments") == 0) {
    rc = cache_conf_bool(v, i, k, &o->expandable_segments, err, errlen);
  } else if (strcmp(k, "release_lock_on_cudamalloc") == 0 ||
             strcmp(k, "release_lock_on_hipmalloc") == 0) {
    rc = cache_conf_bool(v, i, k, &o->release_lock_on_cudamalloc, err, errlen);
  } else if (strcmp(k, "backend") == 0) {
    if (!tok_is(v, "native")) {
      snprintf(err, errlen,
               "pytorch_alloc_conf: backend '" TOKF "' at index %zu is not the "
               "caching allocator; only backend:native is accepted here",
               TOKA(*v), i);
      rc = GMR_EINVAL;
    }
  } else if (strcmp(k, "pinned_use_cuda_host_register") == 0 ||
             strcmp(k, "pinned_use_hip_host_register") == 0 ||
             strcmp(k, "pinned_use_background_threads") == 0 ||
             strcmp(k, "graph_capture_record_stream_reuse") == 0) {
    int ignored;
    rc = cache_conf_bool(v, i, k, &ignored, err, errlen);
  } else if (strcmp(k, "pinned_num_register_threads") == 0 ||
             strcmp(k, "pinned_reserve_segment_size_mb") == 0) {
    rc = cache_conf_mb(v, i, k, &mb, err, errlen);
  } else {
    snprintf(err, errlen,
             "pytorch_alloc_conf: Unrecognized key '%s' in CUDA allocator config "
             "(index %zu).",
             k, i - 2);
    rc = GMR_EINVAL;
  }
  *ip = i;
  return rc;
}

/* Parse a PYTORCH_CUDA_ALLOC_CONF string into `o` (fields "not given" unless
 * the string sets them). */
static int cache_parse_conf(const char *s, cache_opts_t *o, char *err, size_t errlen) {
  size_t len = strlen(s);
  cache_tok_t *tok = gmr__malloc((len + 1) * sizeof *tok);
  if (tok == NULL) return snprintf(err, errlen, "out of host memory"), GMR_ENOMEM;
  size_t n = cache_tokenize(s, tok);
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; ++i) {
    cache_tok_t key = tok[i];
    char k[64];
    snprintf(k, sizeof k, TOKF, TOKA(key));
    if (key.len == 1 && strchr(",:[]", key.s[0])) {
      snprintf(err, errlen, "pytorch_alloc_conf: expected an option name at index %zu, got '%s'", i,
               k);
      rc = GMR_EINVAL;
      break;
    }
    if (i + 2 > n || !tok_is(&tok[i + 1], ":") || i + 2 >= n) {
      snprintf(err, errlen, "pytorch_alloc_conf: expected ':' and a value after '%s' at index %zu",
               k, i + 1);
      rc = GMR_EINVAL;
      break;
    }
    i += 2;
    rc = cache_conf_option(k, tok, n, &i, o, err, errlen);
    if (rc == 0 && i + 1 < n) {
      if (!tok_is(&tok[i + 1], ",")) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: expected ',' at index %zu after the value of "
                 "%s, got '" TOKF "'",
                 i + 1, k, TOKA(tok[i + 1]));
        rc = GMR_EINVAL;
      } else if (i + 2 >= n) {
        snprintf(err, errlen, "pytorch_alloc_conf: expected an option after ',' at index %zu",
                 i + 1);
        rc = GMR_EINVAL;
      }
      ++i;
    }
  }
  gmr__free(tok);
  return rc;
}

/* Merge the keys and the string into the options in force.  An option set in
 * both places is an error: neither silently wins. */
int gmr__cache_resolve(const cache_opts_t *o, cache_conf_t *conf, char *err, size_t errlen) {
  cache_opts_t s = gmr__cache_opts_default;
  if (o->pytorch_alloc_conf != NULL &&
      cache_parse_conf(o->pytorch_alloc_conf, &s, err, errlen) != 0)
    return GMR_ECONFIG;
  const char *both = NULL;
  if (o->max_split_size && s.max_split_size) both = "max_split_size (max_split_size_mb)";
  if (o->max_non_split_rounding && s.max_non_split_rounding)
    both = "max_non_split_rounding (max_non_split_rounding_mb)";
  if (o->roundup_power2_divisions.given && s.roundup_power2_divisions.given)
    both = "roundup_power2_divisions";
  if (o->garbage_collection_threshold > 0 && s.garbage_collection_threshold > 0)
    both = "garbage_collection_threshold";
  if (o->expandable_segments >= 0 && s.expandable_segments >= 0) both = "expandable_segments";
  if (o->per_process_memory_fraction >= 0 && s.per_process_memory_fraction >= 0)
    both = "per_process_memory_fraction";
  if (o->release_lock_on_cudamalloc >= 0 && s.release_lock_on_cudamalloc >= 0)
    both = "release_lock_on_cudamalloc";
  if (o->large_segment_size && s.large_segment_size)
    both = "large_segment_size (large_segment_size_mb)";
  if (both != NULL) {
    snprintf(err, errlen,
             "%s is set both as a key and in pytorch_alloc_conf ('%s'); set it in "
             "one place",
             both, o->pytorch_alloc_conf);
    return GMR_ECONFIG;
  }
#define PICK(f, unset) (o->f != (unset) ? o->f : s.f)
  uint64_t mss = o->max_split_size ? o->max_split_size : s.max_split_size;
  uint64_t nsr = o->max_non_split_rounding ? o->max_non_split_rounding : s.max_non_split_rounding;
  uint64_t lss = o->large_segment_size ? o->large_segment_size : s.large_segment_size;
  const cache_divs_t *dv = o->roundup_power2_divisions.given ? &o->roundup_power2_divisions
                                                             : &s.roundup_power2_divisions;
  cache_conf_t r = {
      .max_split_size = mss ? (size_t)mss : CACHE_UNLIMITED,
      .max_non_split_rounding = nsr ? (size_t)nsr : CACHE_LARGE_BUFFER,
      .gc_threshold = o->garbage_collection_threshold > 0 ? o->garbage_collection_threshold
                                                          : s.garbage_collection_threshold,
      .expandable = PICK(expandable_segments, -1) == 1,
      .fraction = PICK(per_process_memory_fraction, -1.0),
      .release_lock = PICK(release_lock_on_cudamalloc, -1) == 1,
      .large_segment = lss ? (size_t)lss : CACHE_LARGE_BUFFER,
  };
#undef PICK
  if (r.fraction < 0) r.fraction = 1.0;
  memcpy(r.div, dv->div, sizeof r.div);
  if (r.gc_threshold >= 1.0) {
    snprintf(err, errlen, "garbage_collection_threshold is invalid, set it in (0.0, 1.0)");
    return GMR_ECONFIG;
  }
  if (r.large_segment % CACHE_ROUND_LARGE != 0) {
    snprintf(err, errlen, "large_segment_size must be a multiple of 2 MiB");
    return GMR_ECONFIG;
  }
  *conf = r;
  return 0;
}

int gmr__cache_validate(void *opts, char *err, size_t errlen) {
  cache_conf_t conf;
  return gmr__cache_resolve(opts, &conf, err, errlen);
}

void gmr__cache_opts_release(void *opts) {
  cache_opts_t *o = opts;
  gmr__free(o->pytorch_alloc_conf);
  o->pytorch_alloc_conf = NULL;
}

/* ---- the table ------------------------------------------------------------------------------- */

const gmr_opt_desc_t gmr__cache_opts_desc[] = {
    {.key = "max_split_size",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, max_split_size),
     .min = 20.0 * 1048576.0,
     .min_exclusive = true,
     .default_text = "unlimited",
     .help = "max_split_size_mb: blocks of this size and more are never split, never serve "
             "smaller requests, and are released first when memory runs out (> 20MiB).",
     .tune = (const char *const[]){"64MiB", "128MiB", "256MiB", "512MiB", "1GiB", "4GiB", NULL}},
    {.key = "max_non_split_rounding",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, max_non_split_rounding),
     .min = 20.0 * 1048576.0,
     .default_text = "20MiB",
     .help = "max_non_split_rounding_mb: the most waste an oversize request may take from an "
             "oversize cached block (>= 20MiB)."},
    {.key = "roundup_power2_divisions",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, roundup_power2_divisions),
     .parse = cache_parse_divs,
     .default_text = "0",
     .help = "Round requests up to one of N divisions of their power-of-two interval: a power "
             "of two, or PyTorch's list \"[256:1,>:8]\" (MB interval:divisions).",
     .tune = (const char *const[]){"1", "2", "4", "8", "16", NULL}},
    {.key = "garbage_collection_threshold",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(cache_opts_t, garbage_collection_threshold),
     .min = 0.0,
     .max = 1.0,
     .min_exclusive = true,
     .default_text = "off",
     .help = "In (0, 1): free the oldest unused whole large segments when the cache holds more "
             "than this share of the allowed memory; active only under a memory fraction "
             "(per_process_memory_fraction, or one set at run time), as in PyTorch.",
     .tune = (const char *const[]){"0.6", "0.8", NULL}},
    {.key = "expandable_segments",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, expandable_segments),
     .parse = cache_parse_tribool,
     .default_text = "false",
     .help = "One growing virtual range per stream and pool, mapped in pages of 2 MiB (small) "
             "and 20 MiB (large).",
     .tune = (const char *const[]){"true", NULL}},
    {.key = "per_process_memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(cache_opts_t, per_process_memory_fraction),
     .min = 0.0,
     .max = 1.0,
     .default_text = "1.0",
     .help = "Cap the device memory the cache holds at this share of the device's total "
             "(torch.cuda.set_per_process_memory_fraction); 1.0: no cap.",
     .tune = (const char *const[]){"1.1x peak", "1.25x peak", "1.5x peak", NULL}},
    {.key = "release_lock_on_cudamalloc",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, release_lock_on_cudamalloc),
     .parse = cache_parse_tribool,
     .default_text = "false",
     .help = "Accepted for compatibility; device reservations are made under the lock."},
    {.key = "large_segment_size",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, large_segment_size),
     .min = 10.0 * 1048576.0,
     .min_exclusive = true,
     .default_text = "20MiB",
     .help = "large_segment_size_mb: the segment for requests of 1 to 10 MiB and the large "
             "pool's page (> 10MiB, a multiple of 2 MiB)."},
    {.key = "pytorch_alloc_conf",
     .type = GMR_OPT_STRING,
     .offset = offsetof(cache_opts_t, pytorch_alloc_conf),
     .default_text = "",
     .help = "A PYTORCH_CUDA_ALLOC_CONF string, e.g. \"expandable_segments:True,"
             "max_split_size_mb:128\"; an option may be set here or as a key, not both."},
    {.key = NULL},
};
