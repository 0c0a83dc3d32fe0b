/* compare-suggest.c: gmr-compare --suggest POLICY, a search over a policy's
 * options for the configuration with the lowest peak reserved and no OOM.
 *
 * The space comes from the policy's option table (gmr_policy_options): each
 * option with values to tune is a dimension, value 0 being the policy's
 * default (the key left out), and "Kx peak" values become absolute sizes
 * from the trace's peak requested bytes.  Candidates are YAML strings loaded
 * with gmr_config_load_string and replayed like any configuration; those
 * the policy rejects are skipped.  Small spaces (at most SUGGEST_GRID
 * candidates) are searched exhaustively; larger ones by coordinate descent
 * from the defaults and from the three best single-option changes: each pass
 * tries every value of every option with the others fixed and keeps the
 * best, until a pass improves nothing; the best of the descents wins.
 *
 * Order of merit: no OOM first, then lower peak reserved, then fewer device
 * allocations, then fewer options changed from the defaults.  The winner's
 * device time is then weighed against the defaults' (Note [Suggest weighs
 * device time]).
 */

/* Note [Suggest weighs device time]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 * Memory is what the search minimises, but a suggestion must not trade a
 * small saving for a much slower step in silence.  With R the peak reserved
 * and T the device time the cost model gives the driver calls (compare-
 * cost.c, summed over the traces), d the defaults and w the winner,
 *
 *   s = (R_d - R_w) / R_d        (the share of memory saved; 0 when none)
 *   slower  <=>  T_w - T_d >= 1 ms  and  T_w > (1 + 10 s) T_d
 *
 * (COMPARE_SLOWER_FLOOR_US, COMPARE_SLOWER_PER_SAVING): a 2 % saving may
 * cost at most 1.2x the defaults' device time, 10 % at most 2x, 50 % 6x;
 * below a millisecond the difference is noise next to a step.  When the
 * rule says slower, the suggestion says so in its comments, with both
 * figures, and the winner stays what the search found: the user chooses.
 * Calls of kinds the model has no figure for are left out of both T, and
 * counted.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"

#define SUGGEST_MAX_DIMS   8
#define SUGGEST_MAX_VALUES 10
#define SUGGEST_GRID       64
#define SUGGEST_MAX_EVALS  400
#define SUGGEST_MAX_PASSES 4
#define SUGGEST_STARTS     3

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
  size_t rejected;                       /* candidates the policy refused to load */
  char first_reject[1400];               /* why the first one was refused */
  const gmr_trace_data_t *const *traces; /* every candidate replays each of them */
  size_t n_traces;
  uint64_t peak_requested; /* the largest of the traces' */
  compare_opts_t o;        /* progress off: the search draws its own */
  int progress;
} suggest_t;

/* A value "Kx peak" of the option table: K times the trace's peak requested
 * bytes, written as bytes (MiB, rounded up) for a size and as the share of
 * the stated device (rounded up to 0.001) for a number.  0, or -1 when the
 * value does not fit the option (a share above 1). */
static int suggest_scaled(const suggest_t *s, const gmr_option_info_t *opt, double k, char *out,
                          size_t len) {
  double bytes = k * (double)s->peak_requested;
  if (opt->type == GMR_OPTION_SIZE) {
    uint64_t mib = (uint64_t)(bytes / 1048576.0) + 1;
    snprintf(out, len, "%" PRIu64 "MiB", mib);
    return 0;
  }
  if (opt->type != GMR_OPTION_NUMBER) return -1;
  double f = bytes / (double)s->o.capacity;
  f = (double)(long long)(f * 1000.0 + 0.999) / 1000.0; /* round up to 0.001 */
  if (f <= 0.0 || f > 1.0) return -1;
  snprintf(out, len, "%.3f", f);
  return 0;
}

/* The search space: one dimension per option whose table entry has values to
 * tune, value 0 being the option left out (its default). */
static int suggest_space(suggest_t *s) {
  gmr_option_info_t opts[64];
  size_t n = 0;
  if (gmr_policy_options(s->policy, opts, 64, &n) != 0) return -1;
  if (n > 64) n = 64;
  for (size_t i = 0; i < n && s->n_dims < SUGGEST_MAX_DIMS; ++i) {
    if (opts[i].tune == NULL) continue;
    suggest_dim_t *d = &s->dims[s->n_dims];
    d->label = opts[i].key;
    d->n = 1;
    d->values[0][0] = '\0';
    for (const char *const *v = opts[i].tune; *v && d->n < SUGGEST_MAX_VALUES; ++v) {
      char text[64];
      double k;
      char tail[16];
      if (sscanf(*v, "%lfx %15s", &k, tail) == 2 && strcmp(tail, "peak") == 0) {
        if (suggest_scaled(s, &opts[i], k, text, sizeof text) != 0) continue;
      } else {
        snprintf(text, sizeof text, "%s", *v);
      }
      snprintf(d->values[d->n++], sizeof d->values[0], "%s: %s", opts[i].key, text);
    }
    if (d->n > 1) ++s->n_dims;
  }
  return s->n_dims > 0 ? 0 : -1;
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

/* Load and replay one candidate on trace `tr` into `run` (name and source
 * set by the caller). */
static int suggest_run(suggest_t *s, const int *pick, size_t tr, compare_run_t *run, int detail) {
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
  int rc = compare_replay(run, cfg, s->traces[tr], &s->o, detail);
  if (rc == 0 && detail != COMPARE_TIMED && s->o.fit) compare_fit(run, cfg, s->traces[tr], &s->o);
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
  /* Over several traces: every one must run; OOMs and device allocations
   * add up; the peak is the largest (the device must hold each run). */
  e->ok = 1;
  for (size_t tr = 0; tr < s->n_traces && e->ok && e->ooms == 0; ++tr) {
    compare_run_t *run = calloc(1, sizeof *run);
    if (run == NULL) {
      e->ok = 0;
      break;
    }
    snprintf(run->name, sizeof run->name, "candidate");
    if (suggest_run(s, pick, tr, run, COMPARE_TIMED) == 0) {
      e->ooms += run->res.ooms;
      if (run->final.peak_reserved_bytes > e->peak_reserved)
        e->peak_reserved = run->final.peak_reserved_bytes;
      e->device_allocs += run->final.device_allocs;
    } else {
      e->ok = 0;
      if (run->status == COMPARE_ELOAD && s->rejected++ == 0)
        snprintf(s->first_reject, sizeof s->first_reject, "%s", run->error);
    }
    compare_run_release(run);
    free(run);
  }
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

/* Coordinate descent from `best` (updated in place to the local optimum). */
static void suggest_descend_from(suggest_t *s, int *best) {
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

/* Coordinate descent from several starts: the defaults, and the
 * SUGGEST_STARTS best configurations that change one option only (a descent
 * from the defaults alone stops at the first option that helps, and may
 * never try a better one that helps only alone). */
static void suggest_descend(suggest_t *s, int *best) {
  int starts[SUGGEST_STARTS + 1][SUGGEST_MAX_DIMS];
  suggest_eval_t merit[SUGGEST_STARTS + 1];
  int n = 1;
  memset(starts, 0, sizeof starts);
  const suggest_eval_t *def = suggest_eval(s, starts[0]);
  merit[0] = def ? *def : (suggest_eval_t){0};
  for (int d = 0; d < s->n_dims; ++d)
    for (int v = 1; v < s->dims[d].n; ++v) {
      int pick[SUGGEST_MAX_DIMS] = {0};
      pick[d] = v;
      const suggest_eval_t *e = suggest_eval(s, pick);
      if (e == NULL || !e->ok || e->ooms) continue;
      /* Keep the SUGGEST_STARTS best singles, in order, after the defaults. */
      int at = n;
      while (at > 1 && suggest_better(e, &merit[at - 1]))
        --at;
      if (at > SUGGEST_STARTS) continue;
      int last = n < SUGGEST_STARTS + 1 ? n : SUGGEST_STARTS;
      for (int k = last; k > at; --k) {
        memcpy(starts[k], starts[k - 1], sizeof starts[k]);
        merit[k] = merit[k - 1];
      }
      memcpy(starts[at], pick, sizeof pick);
      merit[at] = *e;
      if (n < SUGGEST_STARTS + 1) ++n;
    }
  suggest_eval_t bv = merit[0];
  memcpy(best, starts[0], sizeof starts[0]);
  for (int k = 0; k < n; ++k) {
    suggest_descend_from(s, starts[k]);
    const suggest_eval_t *e = suggest_eval(s, starts[k]);
    if (e && (k == 0 || suggest_better(e, &bv))) {
      bv = *e;
      memcpy(best, starts[k], sizeof starts[k]);
    }
  }
}

int compare_suggest(const char *policy, const gmr_trace_data_t *const *traces, size_t n_traces,
                    const compare_opts_t *o, compare_run_t *runs) {
  suggest_t s = {.policy = policy, .traces = traces, .n_traces = n_traces, .o = *o};
  for (size_t tr = 0; tr < n_traces; ++tr)
    if (traces[tr]->peak_requested > s.peak_requested)
      s.peak_requested = traces[tr]->peak_requested;
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
            "gmr-compare: --suggest %s: none of the %zu configurations tried replays %s "
            "without OOM on a device of %s, so none is suggested\n",
            policy, tried, n_traces == 1 ? "the trace" : "every trace", cap);
    return -1;
  }

  /* The two finalists, replayed in full on each trace (with the detail the
   * page needs): runs[2 tr] the defaults, runs[2 tr + 1] the winner. */
  int zero[SUGGEST_MAX_DIMS] = {0};
  s.o.progress = o->progress;
  int detail = o->html ? COMPARE_DETAIL : COMPARE_PEAK;
  for (size_t tr = 0; tr < n_traces; ++tr) {
    compare_run_t *defaults = &runs[2 * tr], *best = &runs[2 * tr + 1];
    snprintf(defaults->name, sizeof defaults->name, "%s-defaults", policy);
    snprintf(defaults->source, sizeof defaults->source, "--suggest %s: the policy's defaults",
             policy);
    snprintf(best->name, sizeof best->name, "%s-suggested", policy);
    snprintf(best->source, sizeof best->source,
             "--suggest %s: the best of %zu configurations tried", policy, tried);
    suggest_run(&s, zero, tr, defaults, detail);
    if (suggest_run(&s, pick, tr, best, detail) != 0 || best->res.ooms != 0) {
      fprintf(stderr, "gmr-compare: --suggest %s: the winner failed on its second run: %s\n",
              policy, best->status != COMPARE_OK ? best->error : "an OOM");
      return -1;
    }
  }
  return 0;
}

/* The figures of one trace's defaults and winner, as comment lines. */
static void suggest_print_figures(FILE *out, const compare_run_t *defaults,
                                  const compare_run_t *best) {
  const gmr_stats_t *d = &defaults->final, *b = &best->final;
  int d_ok = defaults->status == COMPARE_OK;
  char x[48], y[48];
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
  compare_cost_t dc, bc;
  compare_cost_estimate(defaults, &dc);
  compare_cost_estimate(best, &bc);
  fprintf(out, "#   %-22s %24" PRIu64 " %24" PRIu64 "\n", "driver calls", dc.total_calls,
          bc.total_calls);
  compare_format_us(dc.us_total, x, sizeof x);
  compare_format_us(bc.us_total, y, sizeof y);
  fprintf(out, "#   %-22s %24s %24s\n", "device time (H200)", d_ok ? x : "-", y);
}

/* Note [Suggest weighs device time]: the sentence when the rule fires. */
static void suggest_print_cost(FILE *out, const compare_run_t *runs, size_t n_traces,
                               uint64_t d_peak, uint64_t b_peak) {
  double d_us = 0, b_us = 0;
  uint64_t unmeasured = 0;
  for (size_t tr = 0; tr < n_traces; ++tr) {
    compare_cost_t dc, bc;
    compare_cost_estimate(&runs[2 * tr], &dc);
    compare_cost_estimate(&runs[2 * tr + 1], &bc);
    d_us += dc.us_total, b_us += bc.us_total;
    unmeasured += dc.unmeasured_calls + bc.unmeasured_calls;
  }
  if (!compare_cost_says_slower(d_peak, b_peak, d_us, b_us)) return;
  char x[32], y[32];
  compare_format_us(d_us, x, sizeof x);
  compare_format_us(b_us, y, sizeof y);
  double saving = d_peak > b_peak ? 100.0 * (double)(d_peak - b_peak) / (double)d_peak : 0.0;
  fprintf(out, "#\n# Slower: its driver calls cost %s of device time against the defaults' %s", y,
          x);
  if (d_us > 0) fprintf(out, " (%.1fx)", b_us / d_us);
  fprintf(out,
          ",\n# for %.1f %% less memory (H200 cost model; the rule: more than 1 ms and\n"
          "# more than 1 + 10 x the share saved times the defaults' time).\n",
          saving);
  if (unmeasured)
    fprintf(out,
            "# %" PRIu64 " event, synchronize and virtual-release calls have no measured cost and "
            "are\n# left out.\n",
            unmeasured);
}

void compare_print_suggestion(FILE *out, const char *policy, const gmr_trace_data_t *const *traces,
                              size_t n_traces, const compare_run_t *runs, const compare_opts_t *o) {
  const compare_run_t *best = &runs[1];
  char cap[48];
  compare_format_bytes(o->capacity, cap, sizeof cap);
  const char *how = strstr(best->source, ": ");
  fprintf(out, "# gmr-compare --suggest %s: the lowest peak reserved with no OOM\n", policy);
  fprintf(out, "# on a device of %s: %s.\n", cap, how ? how + 2 : "");
  uint64_t d_peak = 0, b_peak = 0;
  int d_ok = 1, same = 1;
  for (size_t tr = 0; tr < n_traces; ++tr) {
    const compare_run_t *d = &runs[2 * tr], *b = &runs[2 * tr + 1];
    fprintf(out, "#\n# %s (%zu events):\n", traces[tr]->source, traces[tr]->n_events);
    suggest_print_figures(out, d, b);
    d_ok &= d->status == COMPARE_OK && d->res.ooms == 0;
    if (d->final.peak_reserved_bytes > d_peak) d_peak = d->final.peak_reserved_bytes;
    if (b->final.peak_reserved_bytes > b_peak) b_peak = b->final.peak_reserved_bytes;
    same &= d->yaml && b->yaml && strcmp(d->yaml, b->yaml) == 0;
  }
  const char *over = n_traces > 1 ? " (the largest over the traces)" : "";
  if (d_ok && d_peak > b_peak)
    fprintf(out, "#\n# It saves %.1f %% of the defaults' peak reserved%s.\n",
            100.0 * (double)(d_peak - b_peak) / (double)d_peak, over);
  else if (d_ok && same)
    fprintf(out, "#\n# The defaults are already the best configuration tried.\n");
  else if (!d_ok)
    fprintf(out, "#\n# The defaults run out of memory on this device; this does not.\n");
  if (d_ok) suggest_print_cost(out, runs, n_traces, d_peak, b_peak);
  compare_print_deploy(out, policy, best->yaml, o->capacity);
  fputs(best->yaml, out);
}
