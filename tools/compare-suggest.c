/* compare-suggest.c: gmr-compare --suggest POLICY, a search over a policy's
 * options for the configuration with the lowest peak reserved and no OOM.
 *
 * Each option is a dimension with a short list of values, value 0 being the
 * policy's default (the key left out).  Candidates are YAML strings loaded
 * with gmr_config_load_string and replayed like any configuration; those
 * the policy rejects are skipped.  Small spaces (at most SUGGEST_GRID
 * candidates) are searched exhaustively; larger ones by coordinate descent
 * from the defaults: each pass tries every value of every option with the
 * others fixed and keeps the best, until a pass improves nothing.
 *
 * Order of merit: no OOM first, then lower peak reserved, then fewer device
 * allocations, then fewer options changed from the defaults.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"

#define SUGGEST_MAX_DIMS   6
#define SUGGEST_MAX_VALUES 10
#define SUGGEST_GRID       64
#define SUGGEST_MAX_EVALS  400
#define SUGGEST_MAX_PASSES 4

/* One option: its values as YAML lines ("key: value", possibly several
 * lines joined by '\n'); values[0] is "" (the default). */
typedef struct suggest_dim_s {
  const char *label;
  char values[SUGGEST_MAX_VALUES][160];
  int n;
} suggest_dim_t;

/* One evaluated candidate. */
typedef struct suggest_eval_s {
  int pick[SUGGEST_MAX_DIMS]; /* value index per dimension */
  int ok;                     /* loaded and replayed to the end */
  uint64_t ooms, peak_reserved, device_allocs;
  int changed; /* options not at their default */
} suggest_eval_t;

typedef struct suggest_s {
  const char *policy;
  suggest_dim_t dims[SUGGEST_MAX_DIMS];
  int n_dims;
  suggest_eval_t *evals;
  size_t n_evals;
  size_t rejected;         /* candidates the policy refused to load */
  char first_reject[1400]; /* why the first one was refused */
  const gmr_trace_data_t *t;
  compare_opts_t o; /* progress off: the search draws its own */
  int progress;
} suggest_t;

static void suggest_add(suggest_dim_t *d, const char *fmt, double v) {
  if (d->n >= SUGGEST_MAX_VALUES) return;
  snprintf(d->values[d->n++], sizeof d->values[0], fmt, v);
}

static void suggest_dim(suggest_t *s, const char *label, const char *const *values) {
  suggest_dim_t *d = &s->dims[s->n_dims++];
  d->label = label;
  d->n = 1;
  d->values[0][0] = '\0';
  for (; *values && d->n < SUGGEST_MAX_VALUES; ++values)
    snprintf(d->values[d->n++], sizeof d->values[0], "%s", *values);
}

/* The search space of each policy.  The garbage-collection threshold only
 * acts under a memory fraction (as in PyTorch), so it is searched together
 * with fractions that leave 10%, 25% and 50% of headroom over the trace's
 * peak requested bytes. */
static int suggest_space(suggest_t *s) {
  if (strcmp(s->policy, "caching") == 0) {
    static const char *const split[] = {"max_split_size: 64MiB",
                                        "max_split_size: 128MiB",
                                        "max_split_size: 256MiB",
                                        "max_split_size: 512MiB",
                                        "max_split_size: 1GiB",
                                        "max_split_size: 4GiB",
                                        NULL};
    static const char *const div[] = {"roundup_power2_divisions: 1",  "roundup_power2_divisions: 2",
                                      "roundup_power2_divisions: 4",  "roundup_power2_divisions: 8",
                                      "roundup_power2_divisions: 16", NULL};
    static const char *const exp[] = {"expandable_segments: true", NULL};
    suggest_dim(s, "max_split_size", split);
    suggest_dim(s, "roundup_power2_divisions", div);
    suggest_dim(s, "expandable_segments", exp);
    static const char *const none[] = {NULL};
    suggest_dim(s, "garbage_collection_threshold", none);
    suggest_dim_t *gc = &s->dims[s->n_dims - 1];
    static const double headroom[] = {1.1, 1.25, 1.5};
    static const double threshold[] = {0.6, 0.8};
    for (int h = 0; h < 3; ++h) {
      double f = (double)s->t->peak_requested * headroom[h] / (double)s->o.capacity;
      f = (double)(long long)(f * 1000.0 + 0.999) / 1000.0; /* round up to 0.001 */
      if (f <= 0.0 || f > 1.0) continue;
      for (int k = 0; k < 2; ++k) {
        char fmt[160];
        snprintf(fmt, sizeof fmt,
                 "garbage_collection_threshold: %.2f\nper_process_memory_fraction: %%.3f",
                 threshold[k]);
        suggest_add(gc, fmt, f);
      }
    }
    return 0;
  }
  if (strcmp(s->policy, "bfc") == 0) {
    static const char *const growth[] = {"allow_growth: true", "allow_growth: false",
                                         "allow_growth: true\nvmm: true", NULL};
    static const char *const frag[] = {
        "fragmentation_fraction: 0.001", "fragmentation_fraction: 0.01",
        "fragmentation_fraction: 0.05", "fragmentation_fraction: 0.1", NULL};
    static const char *const gc[] = {"garbage_collection: true", "garbage_collection: false", NULL};
    suggest_dim(s, "allow_growth", growth);
    suggest_dim(s, "fragmentation_fraction", frag);
    suggest_dim(s, "garbage_collection", gc);
    return 0;
  }
  if (strcmp(s->policy, "stitch") == 0) {
    static const char *const tau[] = {"tau: 16KiB", "tau: 32KiB", "tau: 128KiB", "tau: 256KiB",
                                      NULL};
    static const char *const small[] = {"small_size: 256KiB", "small_size: 512KiB", NULL};
    static const char *const cands[] = {"cache_candidates: 4", "cache_candidates: 64", NULL};
    suggest_dim(s, "tau", tau);
    suggest_dim(s, "small_size", small);
    suggest_dim(s, "cache_candidates", cands);
    return 0;
  }
  return -1;
}

/* The YAML of a candidate. */
static char *suggest_yaml(const suggest_t *s, const int *pick) {
  size_t cap = 256;
  for (int d = 0; d < s->n_dims; ++d)
    cap += strlen(s->dims[d].values[pick[d]]) + 8;
  char *y = malloc(cap);
  if (y == NULL) return NULL;
  size_t off = (size_t)snprintf(y, cap, "policy:\n  name: %s\n", s->policy);
  for (int d = 0; d < s->n_dims; ++d) {
    const char *v = s->dims[d].values[pick[d]];
    while (*v) {
      const char *nl = strchr(v, '\n');
      size_t n = nl ? (size_t)(nl - v) : strlen(v);
      off += (size_t)snprintf(y + off, cap - off, "  %.*s\n", (int)n, v);
      v += n + (nl != NULL);
    }
  }
  return y;
}

static int suggest_changed(const suggest_t *s, const int *pick) {
  int c = 0;
  for (int d = 0; d < s->n_dims; ++d)
    c += pick[d] != 0;
  return c;
}

/* Load and replay one candidate into `run` (name and source set by the caller). */
static int suggest_run(suggest_t *s, const int *pick, compare_run_t *run, int detail) {
  run->yaml = suggest_yaml(s, pick);
  if (run->yaml == NULL) {
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "out of host memory");
    return -1;
  }
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  memset(&err, 0, sizeof err);
  if (gmr_config_load_string(run->yaml, &cfg, &err) != 0) {
    run->status = COMPARE_ELOAD;
    snprintf(run->error, sizeof run->error, "%s", err.message);
    return -1;
  }
  int rc = compare_replay(run, cfg, s->t, &s->o, detail);
  gmr_config_free(cfg);
  return rc;
}

static int suggest_better(const suggest_eval_t *a, const suggest_eval_t *b) {
  if (!a->ok || a->ooms) return 0;
  if (!b->ok || b->ooms) return 1;
  if (a->peak_reserved != b->peak_reserved) return a->peak_reserved < b->peak_reserved;
  if (a->device_allocs != b->device_allocs) return a->device_allocs < b->device_allocs;
  return a->changed < b->changed;
}

/* Evaluate a candidate once (later calls return the remembered result). */
static const suggest_eval_t *suggest_eval(suggest_t *s, const int *pick) {
  for (size_t i = 0; i < s->n_evals; ++i)
    if (memcmp(s->evals[i].pick, pick, sizeof s->evals[i].pick) == 0) return &s->evals[i];
  if (s->n_evals == SUGGEST_MAX_EVALS) return NULL;
  suggest_eval_t *e = &s->evals[s->n_evals++];
  memset(e, 0, sizeof *e);
  memcpy(e->pick, pick, sizeof e->pick);
  e->changed = suggest_changed(s, pick);
  compare_run_t *run = calloc(1, sizeof *run);
  if (run == NULL) return e;
  snprintf(run->name, sizeof run->name, "candidate");
  if (suggest_run(s, pick, run, COMPARE_TIMED) == 0) {
    e->ok = 1;
    e->ooms = run->res.ooms;
    e->peak_reserved = run->final.peak_reserved_bytes;
    e->device_allocs = run->final.device_allocs;
  } else if (run->status == COMPARE_ELOAD) {
    if (s->rejected++ == 0) snprintf(s->first_reject, sizeof s->first_reject, "%s", run->error);
  }
  compare_run_release(run);
  free(run);
  if (s->progress) {
    fprintf(stderr, "\r\033[Ksuggest %s: %zu candidates tried", s->policy, s->n_evals);
    fflush(stderr);
  }
  return e;
}

/* Exhaustive search: every combination. */
static void suggest_grid(suggest_t *s, int *best) {
  int pick[SUGGEST_MAX_DIMS] = {0};
  const suggest_eval_t *b = suggest_eval(s, pick);
  suggest_eval_t bv = b ? *b : (suggest_eval_t){0};
  for (;;) {
    int d = 0;
    while (d < s->n_dims && ++pick[d] == s->dims[d].n)
      pick[d++] = 0;
    if (d == s->n_dims) break;
    const suggest_eval_t *e = suggest_eval(s, pick);
    if (e && suggest_better(e, &bv)) {
      bv = *e;
      memcpy(best, pick, sizeof pick);
    }
  }
}

/* Coordinate descent from the defaults. */
static void suggest_descend(suggest_t *s, int *best) {
  const suggest_eval_t *b = suggest_eval(s, best);
  suggest_eval_t bv = b ? *b : (suggest_eval_t){0};
  for (int pass = 0; pass < SUGGEST_MAX_PASSES; ++pass) {
    int improved = 0;
    for (int d = 0; d < s->n_dims; ++d) {
      int pick[SUGGEST_MAX_DIMS];
      memcpy(pick, best, sizeof pick);
      for (int v = 0; v < s->dims[d].n; ++v) {
        pick[d] = v;
        const suggest_eval_t *e = suggest_eval(s, pick);
        if (e && suggest_better(e, &bv)) {
          bv = *e;
          best[d] = v;
          improved = 1;
        }
      }
    }
    if (!improved) break;
  }
}

int compare_suggest(const char *policy, const gmr_trace_data_t *t, const compare_opts_t *o,
                    compare_run_t *defaults, compare_run_t *best) {
  suggest_t s = {.policy = policy, .t = t, .o = *o};
  s.o.progress = 0;
  s.progress = o->progress;
  if (suggest_space(&s) != 0) {
    fprintf(stderr,
            "gmr-compare: --suggest %s: no search space for this policy (caching, bfc "
            "and stitch have one)\n",
            policy);
    return -1;
  }
  /* The policy must exist: its defaults must load. */
  char yaml[128];
  snprintf(yaml, sizeof yaml, "policy:\n  name: %s\n", policy);
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  memset(&err, 0, sizeof err);
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    fprintf(stderr, "gmr-compare: --suggest %s: the policy is not available: %s\n", policy,
            err.message);
    return -1;
  }
  gmr_config_free(cfg);
  s.evals = calloc(SUGGEST_MAX_EVALS, sizeof *s.evals);
  if (s.evals == NULL) return -1;

  size_t space = 1;
  for (int d = 0; d < s.n_dims; ++d)
    space *= (size_t)s.dims[d].n;
  int pick[SUGGEST_MAX_DIMS] = {0};
  if (space <= SUGGEST_GRID)
    suggest_grid(&s, pick);
  else
    suggest_descend(&s, pick);
  if (s.progress) fprintf(stderr, "\r\033[K");
  if (s.rejected)
    fprintf(stderr,
            "gmr-compare: note: --suggest %s: %zu candidate%s rejected by the policy, "
            "e.g. %s\n",
            policy, s.rejected, s.rejected == 1 ? " was" : "s were", s.first_reject);
  const suggest_eval_t *w = suggest_eval(&s, pick);
  int found = w && w->ok && w->ooms == 0;
  size_t tried = s.n_evals;
  free(s.evals);
  if (!found) {
    char cap[48];
    compare_format_bytes(o->capacity, cap, sizeof cap);
    fprintf(stderr,
            "gmr-compare: --suggest %s: none of the %zu configurations tried replays "
            "the trace without OOM on a device of %s\n",
            policy, tried, cap);
    return -1;
  }

  /* The two finalists, replayed in full (with the detail the page needs). */
  int zero[SUGGEST_MAX_DIMS] = {0};
  s.o.progress = o->progress;
  snprintf(defaults->name, sizeof defaults->name, "%s-defaults", policy);
  snprintf(defaults->source, sizeof defaults->source, "--suggest %s: the policy's defaults",
           policy);
  snprintf(best->name, sizeof best->name, "%s-suggested", policy);
  snprintf(best->source, sizeof best->source, "--suggest %s: the best of %zu configurations tried",
           policy, tried);
  int detail = o->html ? COMPARE_DETAIL : COMPARE_PEAK;
  suggest_run(&s, zero, defaults, detail);
  if (suggest_run(&s, pick, best, detail) != 0) {
    fprintf(stderr, "gmr-compare: --suggest %s: the winner failed on its second run: %s\n", policy,
            best->error);
    return -1;
  }
  return 0;
}

void compare_print_suggestion(FILE *out, const char *policy, const gmr_trace_data_t *t,
                              const compare_run_t *defaults, const compare_run_t *best) {
  const gmr_stats_t *d = &defaults->final, *b = &best->final;
  int d_ok = defaults->status == COMPARE_OK;
  char x[48], y[48];
  fprintf(out, "# gmr-compare --suggest %s: the lowest peak reserved with no OOM\n", policy);
  const char *how = strstr(best->source, ": ");
  fprintf(out, "# on %s (%zu events): %s.\n", t->source, t->n_events, how ? how + 2 : "");
  fprintf(out, "#\n#   %-22s %24s %24s\n", "", "defaults", "suggested");
#define SUGGEST_BYTES_ROW(label, dv, bv)                                                           \
  do {                                                                                             \
    compare_format_bytes(dv, x, sizeof x);                                                         \
    compare_format_bytes(bv, y, sizeof y);                                                         \
    fprintf(out, "#   %-22s %24s %24s\n", label, d_ok ? x : "-", y);                               \
  } while (0)
  SUGGEST_BYTES_ROW("peak reserved", d->peak_reserved_bytes, b->peak_reserved_bytes);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "peak reserved (bytes)",
          d_ok ? d->peak_reserved_bytes : 0, b->peak_reserved_bytes);
  SUGGEST_BYTES_ROW("peak allocated", d->peak_allocated_bytes, b->peak_allocated_bytes);
  SUGGEST_BYTES_ROW("peak requested", d->peak_requested_bytes, b->peak_requested_bytes);
#undef SUGGEST_BYTES_ROW
  if (d->peak_requested_bytes && b->peak_requested_bytes)
    fprintf(out, "#   %-22s %24.4f %24.4f\n", "reserved / requested",
            (double)d->peak_reserved_bytes / (double)d->peak_requested_bytes,
            (double)b->peak_reserved_bytes / (double)b->peak_requested_bytes);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "segments (peak)", d->peak_segments,
          b->peak_segments);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "device allocs", d->device_allocs,
          b->device_allocs);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "device frees", d->device_frees,
          b->device_frees);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "alloc retries", d->alloc_retries,
          b->alloc_retries);
  fprintf(out, "#   %-22s %24zu %24zu\n", "OOMs", defaults->res.ooms, best->res.ooms);
  if (d_ok && defaults->res.ooms == 0 && d->peak_reserved_bytes > b->peak_reserved_bytes)
    fprintf(out, "#\n# It saves %.1f %% of the defaults' peak reserved.\n",
            100.0 * (double)(d->peak_reserved_bytes - b->peak_reserved_bytes) /
                (double)d->peak_reserved_bytes);
  else if (d_ok && defaults->res.ooms == 0 && strcmp(defaults->yaml, best->yaml) == 0)
    fprintf(out, "#\n# The defaults are already the best configuration tried.\n");
  else if (d_ok && defaults->res.ooms)
    fprintf(out, "#\n# The defaults run out of memory on this device; this does not.\n");
  fputs(best->yaml, out);
}
