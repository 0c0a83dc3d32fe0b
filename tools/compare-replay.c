/* compare-replay.c: gmr-compare's replays of one configuration.
 *
 * compare_replay runs up to three passes over the trace, each on a fresh
 * simulated device of the stated capacity: a timed one (the figures), one
 * that finds the peak event (and records the timeline for the page), and one
 * that stops at the peak to walk the segments (the page's map).  Every other
 * part of the tool (the command line, --suggest, --fit, --diff) replays
 * through here; this file calls nothing of theirs.  --snapshot adds a pass
 * of its own (compare_replay_snapshot).
 *
 *   peak event = argmax over events i with reserved(i) = max reserved of
 *                allocated(i) (the first such event on ties)
 *   fragmentation = 1 - largest free block / free bytes, at the peak event
 *
 * For --html the peak pass also keeps each step up of reserved memory, with
 * the rule that made it (Note [Why reserved grew]).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compare.h"

static double cmp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- replays ----------------------------------------------------------------- */

/* The passes over the trace: a timed one (figures and speed, no callback
 * but the progress bar), one that finds the peak event (and records the
 * timeline for --html), and one that stops at the peak to walk the segments
 * (--html). */
enum { CMP_PASS_TIMED = 0, CMP_PASS_PEAK = 1, CMP_PASS_MAP = 2 };

/* State of the per-event callback.  Timeline buckets cover `bucket` events:
 * point k holds the maxima of events [k * bucket, (k + 1) * bucket). */
typedef struct cmp_ctx_s {
  compare_run_t *run;
  const char *label;       /* progress bar label */
  int progress;            /* draw a bar once the replay has run a second */
  double start, last_draw; /* seconds (cmp_now) */
  int drawn;               /* a bar is on the screen */
  int pass;                /* CMP_PASS_* */
  uint64_t peak_reserved;  /* CMP_PASS_PEAK: the peak found by the timed pass, bytes */
  int peak_found;          /* CMP_PASS_PEAK: an event at peak_reserved was seen */
  gmr_stats_t at_peak;     /* CMP_PASS_PEAK: the stats at the chosen event */
  size_t peak_event;       /* CMP_PASS_PEAK: the chosen event; CMP_PASS_MAP: where to walk */
  int timeline;            /* CMP_PASS_PEAK: record the timeline too */
  size_t bucket;           /* events per timeline point (>= 1) */
  compare_point_t cur;     /* the open bucket */
  size_t cur_events;       /* events in the open bucket */
  size_t cap_points;       /* run->points capacity */
  size_t cap_map;          /* run->map capacity */
  int oom_host;            /* host memory ran out while recording */
  /* CMP_PASS_PEAK with the timeline: the steps (Note [Why reserved grew]). */
  int policy_kind;        /* CMP_KIND_* */
  int64_t max_split;      /* caching's max_split_size (0: none known) */
  int64_t bfc_limit;      /* bfc's bytes_limit (0: none known) */
  uint64_t prev_reserved; /* bytes, after the previous event */
  uint64_t prev_largest;  /* the largest free block after the previous event */
  uint64_t seen_reserved; /* the device's reservations the event made, bytes */
  uint64_t seen_first;    /* the first one's bytes */
  uint64_t seen_mapped;   /* the pages it mapped, bytes */
  size_t cap_steps;       /* run->steps capacity */
} cmp_ctx_t;

enum { CMP_KIND_OTHER = 0, CMP_KIND_CACHING, CMP_KIND_BFC };

static void cmp_progress_draw(cmp_ctx_t *c, size_t index, size_t total) {
  double now = cmp_now();
  if (now - c->start < 1.0 || now - c->last_draw < 0.1) return;
  c->last_draw = now;
  c->drawn = 1;
  int width = 40, fill = total ? (int)((double)(index + 1) * width / (double)total) : width;
  char bar[64];
  for (int i = 0; i < width; ++i)
    bar[i] = i < fill ? '#' : '.';
  bar[width] = '\0';
  fprintf(stderr, "\r\033[K%-24.24s [%s] %5.1f%%  %zu/%zu events", c->label, bar,
          total ? 100.0 * (double)(index + 1) / (double)total : 100.0, index + 1, total);
  fflush(stderr);
}

static void cmp_progress_clear(cmp_ctx_t *c) {
  if (c->drawn) fprintf(stderr, "\r\033[K");
  c->drawn = 0;
}

static int cmp_map_cb(const gmr_walk_entry_t *e, void *ud) {
  cmp_ctx_t *c = ud;
  compare_run_t *run = c->run;
  if (run->n_map == c->cap_map) {
    size_t cap = c->cap_map ? c->cap_map * 2 : 256;
    compare_map_entry_t *m = realloc(run->map, cap * sizeof *m);
    if (m == NULL) {
      c->oom_host = 1;
      return 1;
    }
    run->map = m;
    c->cap_map = cap;
  }
  compare_map_entry_t *m = &run->map[run->n_map++];
  memset(m, 0, sizeof *m);
  m->address = e->address;
  m->size = e->size;
  m->requested = e->requested;
  m->is_segment = (uint8_t)(e->is_segment != 0);
  m->state = (uint8_t)e->state;
  m->is_expandable = (uint8_t)(e->is_expandable != 0);
  m->shared_head = e->shared_head;
  m->shared_tail = e->shared_tail;
  m->head_page = e->head_page;
  m->tail_page = e->tail_page;
  if (e->is_segment && e->pool) snprintf(m->pool, sizeof m->pool, "%s", e->pool);
  return 0;
}

static void cmp_point_close(cmp_ctx_t *c) {
  compare_run_t *run = c->run;
  if (c->cur_events == 0) return;
  if (run->n_points == c->cap_points) {
    size_t cap = c->cap_points ? c->cap_points * 2 : 256;
    compare_point_t *p = realloc(run->points, cap * sizeof *p);
    if (p == NULL) {
      c->oom_host = 1;
      return;
    }
    run->points = p;
    c->cap_points = cap;
  }
  run->points[run->n_points++] = c->cur;
  memset(&c->cur, 0, sizeof c->cur);
  c->cur_events = 0;
}

/* The peak event: reserved bytes at their maximum and, among the events
 * where they are (a greedy policy stays there from its first allocation),
 * the one with the most bytes allocated, so the picture shows the policy at
 * its fullest rather than at the instant it grew. */
static void cmp_peak_track(cmp_ctx_t *c, size_t index, const gmr_stats_t *st) {
  if (st->reserved_bytes != c->peak_reserved) return;
  if (c->peak_found && st->allocated_bytes <= c->at_peak.allocated_bytes) return;
  c->peak_found = 1;
  c->at_peak = *st;
  c->peak_event = index;
}

/* A policy that maps pages (stitch) names its figures stitch.*; any other
 * policy has no stitch.page_size, and pages->on stays 0. */
static void cmp_pages(gmr_runtime_t *rt, compare_pages_t *pages) {
  static const struct {
    const char *key;
    size_t at;
  } keys[] = {
      {"stitch.pages.current", offsetof(compare_pages_t, pages)},
      {"stitch.pages.free", offsetof(compare_pages_t, free_pages)},
      {"stitch.shared_pages.current", offsetof(compare_pages_t, shared_pages)},
      {"stitch.dead_gap_bytes.current", offsetof(compare_pages_t, dead_gap)},
      {"stitch.free_bytes.current", offsetof(compare_pages_t, free_bytes)},
      {"stitch.pending_bytes.current", offsetof(compare_pages_t, pending_bytes)},
      {"stitch.va_bytes.current", offsetof(compare_pages_t, va_bytes)},
      {"stitch.cached_ranges", offsetof(compare_pages_t, cached_ranges)},
      {"stitch.mappings.current", offsetof(compare_pages_t, mappings)},
  };
  memset(pages, 0, sizeof *pages);
  int64_t v = 0;
  if (gmr_stat_get(rt, "stitch.page_size", &v) != 0 || v <= 0) return;
  pages->on = 1;
  pages->page_size = (uint64_t)v;
  for (size_t i = 0; i < sizeof keys / sizeof *keys; ++i)
    if (gmr_stat_get(rt, keys[i].key, &v) == 0 && v > 0)
      *(uint64_t *)((char *)pages + keys[i].at) = (uint64_t)v;
}

/* ---- why reserved grew ------------------------------------------------------------
 * Note [Why reserved grew]
 * The peak pass of --html watches the device calls of each event through
 * the history's observer (gmr_history_observe: segment_alloc is a device
 * reservation, segment_map pages mapped into a range), and after each event
 * compares reserved bytes with the event before.  A step up is put down to
 * its request (the event) and to the first rule below that holds, with R the
 * request, G the first segment it reserved, L the largest free block before
 * it, S caching's max_split_size, 2M(x) x rounded up to 2 MiB:
 *   nothing reserved, pages mapped       -> expandable (pages mapped into a range)
 *   nothing reserved or mapped           -> pages (stitch makes pages, no segment)
 *   caching, 0 < S < L, R <= L           -> split limit (a block over S stays whole)
 *   caching, R <= 1 MiB, G = 2 MiB       -> small pool
 *   caching, R <= 10 MiB, G = 20 MiB     -> the 20 MiB segments of 1-10 MiB requests
 *   bfc, G >= its limit                  -> the whole limit at once
 *   G = R                                -> a segment of the request's size
 *   G <= 2M(R)                           -> rounding
 *   bfc                                  -> growth doubling (the region size doubles)
 *   otherwise                            -> larger than these rules explain
 * The rules are the imitated allocators' (docs/caching.md, docs/bfc.md); the
 * policy's own figures (max_split_size, bytes_limit) come from its report
 * (gmr_stat_get), read once when the runtime is made.
 */

static const char *const cmp_rule_texts[COMPARE_RULE_KINDS] = {
    [COMPARE_RULE_SEGMENT] = "a new segment of the request's size",
    [COMPARE_RULE_ROUNDING] = "rounding: a new segment, the request rounded up to 2 MiB",
    [COMPARE_RULE_SMALL_POOL] = "small pool: a new 2 MiB segment for requests up to 1 MiB",
    [COMPARE_RULE_MID_SEGMENT] = "a new 20 MiB segment, as for every request of 1 to 10 MiB",
    [COMPARE_RULE_SPLIT_LIMIT] = "split limit: a cached block was large enough, but blocks over "
                                 "max_split_size are never split",
    [COMPARE_RULE_DOUBLING] = "growth doubling: a new region, the region size doubled "
                              "until the request fits (allow_growth)",
    [COMPARE_RULE_WHOLE_LIMIT] = "the whole limit reserved at once (no allow_growth)",
    [COMPARE_RULE_EXPANDABLE] = "pages mapped into an expandable segment",
    [COMPARE_RULE_PAGES] = "new device pages, no segment (the policy maps pages)",
    [COMPARE_RULE_LARGER] = "a new segment larger than the request and its rounding",
};

const char *compare_rule_text(int rule) {
  return rule >= 0 && rule < COMPARE_RULE_KINDS ? cmp_rule_texts[rule] : "?";
}

/* Called with the runtime's history lock held: count, never call gmr. */
static void cmp_step_observe(const gmr_history_event_t *ev, void *ud) {
  cmp_ctx_t *c = ud;
  if (ev->action == GMR_HISTORY_SEGMENT_ALLOC) {
    if (c->seen_reserved == 0) c->seen_first = ev->size;
    c->seen_reserved += ev->size;
  } else if (ev->action == GMR_HISTORY_SEGMENT_MAP) {
    c->seen_mapped += ev->size;
  }
}

static int cmp_step_rule(const cmp_ctx_t *c, uint64_t req) {
  const uint64_t mib = (uint64_t)1 << 20, g = c->seen_first;
  const uint64_t rounded = (req + 2 * mib - 1) / (2 * mib) * (2 * mib);
  if (c->seen_reserved == 0) return c->seen_mapped ? COMPARE_RULE_EXPANDABLE : COMPARE_RULE_PAGES;
  if (c->policy_kind == CMP_KIND_CACHING) {
    if (c->max_split > 0 && (uint64_t)c->max_split < c->prev_largest && req <= c->prev_largest)
      return COMPARE_RULE_SPLIT_LIMIT;
    if (req <= mib && g == 2 * mib) return COMPARE_RULE_SMALL_POOL;
    if (req <= 10 * mib && g == 20 * mib) return COMPARE_RULE_MID_SEGMENT;
  }
  if (c->policy_kind == CMP_KIND_BFC && c->bfc_limit > 0 && g >= (uint64_t)c->bfc_limit)
    return COMPARE_RULE_WHOLE_LIMIT;
  if (g == req) return COMPARE_RULE_SEGMENT;
  if (g <= rounded) return COMPARE_RULE_ROUNDING;
  return c->policy_kind == CMP_KIND_BFC ? COMPARE_RULE_DOUBLING : COMPARE_RULE_LARGER;
}

/* After event `index`: a step up of reserved memory is kept with its rule. */
static void cmp_step_track(cmp_ctx_t *c, const gmr_trace_data_t *t, size_t index,
                           const gmr_stats_t *st) {
  compare_run_t *run = c->run;
  const gmr_trace_event_t *e = &t->events[index];
  if (st->reserved_bytes > c->prev_reserved && e->action == GMR_TRACE_ALLOC) {
    ++run->all_steps;
    if (run->n_steps < COMPARE_STEPS_MAX) {
      if (run->n_steps == c->cap_steps) {
        size_t cap = c->cap_steps ? c->cap_steps * 2 : 64;
        compare_step_t *v = realloc(run->steps, cap * sizeof *v);
        if (v == NULL) {
          c->oom_host = 1;
          return;
        }
        run->steps = v;
        c->cap_steps = cap;
      }
      run->steps[run->n_steps++] = (compare_step_t){.event = index,
                                                    .request = e->size,
                                                    .before = c->prev_reserved,
                                                    .after = st->reserved_bytes,
                                                    .segment = c->seen_first,
                                                    .line = e->line,
                                                    .rule = (uint8_t)cmp_step_rule(c, e->size)};
    }
  }
  c->prev_reserved = st->reserved_bytes;
  c->prev_largest = st->largest_free_block;
  c->seen_reserved = c->seen_first = c->seen_mapped = 0;
}

/* The peak pass with the timeline: watch the device calls, and read the
 * policy's figures the rules need (Note [Why reserved grew]). */
static void cmp_step_start(cmp_ctx_t *c, gmr_runtime_t *rt) {
  const char *p = gmr_runtime_policy(rt);
  c->policy_kind = strstr(p, "caching") ? CMP_KIND_CACHING
                   : strstr(p, "bfc")   ? CMP_KIND_BFC
                                        : CMP_KIND_OTHER;
  int64_t v = 0;
  c->max_split = gmr_stat_get(rt, "max_split_size", &v) == 0 && v > 0 && v < INT64_MAX ? v : 0;
  c->bfc_limit = gmr_stat_get(rt, "bytes_limit", &v) == 0 && v > 0 ? v : 0;
  gmr_stats_t st;
  if (gmr_stats(rt, &st) == 0) {
    c->prev_reserved = st.reserved_bytes;
    c->prev_largest = st.largest_free_block;
  }
  if (gmr_history_observe(rt, cmp_step_observe, c) != 0) c->oom_host = 1;
}

static int cmp_replay_cb(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t index, int status,
                         void *ud) {
  (void)status;
  cmp_ctx_t *c = ud;
  if (c->pass == CMP_PASS_PEAK) {
    gmr_stats_t st;
    if (gmr_stats(rt, &st) == 0) {
      cmp_peak_track(c, index, &st);
      if (c->timeline) cmp_step_track(c, t, index, &st);
      if (c->timeline) {
        if (st.reserved_bytes > c->cur.reserved) c->cur.reserved = st.reserved_bytes;
        if (st.allocated_bytes > c->cur.allocated) c->cur.allocated = st.allocated_bytes;
        if (st.requested_bytes > c->cur.requested) c->cur.requested = st.requested_bytes;
      }
    }
    if (c->timeline) {
      c->cur.event = index;
      if (++c->cur_events == c->bucket) cmp_point_close(c);
    }
  } else if (c->pass == CMP_PASS_MAP && index == c->peak_event) {
    c->run->n_map = 0;
    c->run->map_status = gmr_walk(rt, cmp_map_cb, c);
    if (gmr_stats(rt, &c->run->map_stats) != 0)
      memset(&c->run->map_stats, 0, sizeof c->run->map_stats);
    cmp_pages(rt, &c->run->pages);
    return 1; /* stop at the peak */
  }
  if (c->progress) cmp_progress_draw(c, index, t->n_events);
  return c->oom_host;
}

static int cmp_new_runtime(compare_run_t *run, const gmr_config_t *cfg, const compare_opts_t *o,
                           gmr_runtime_t **out) {
  gmr_sim_options_t sim = {.capacity = o->capacity};
  int err = gmr_runtime_new_sim(cfg, &sim, out);
  if (err != 0) {
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "cannot create the runtime: %s", gmr_strerror(err));
  }
  return err;
}

/* At the peak: fragmentation = 1 - largest free block / free bytes. */
static void cmp_peak_figures(compare_run_t *run) {
  const gmr_stats_t *p = &run->res.at_peak;
  run->free_at_peak = p->free_cached_bytes;
  run->largest_at_peak = p->largest_free_block;
  if (run->largest_at_peak > run->free_at_peak) run->largest_at_peak = run->free_at_peak;
  run->rounding_at_peak =
      p->allocated_bytes > p->requested_bytes ? p->allocated_bytes - p->requested_bytes : 0;
  run->fragmentation =
      run->free_at_peak ? 1.0 - (double)run->largest_at_peak / (double)run->free_at_peak : 0.0;
}

/* One pass on a fresh runtime; 0, or -1 with run->status and run->error set. */
static int cmp_pass(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                    const compare_opts_t *o, cmp_ctx_t *ctx, gmr_replay_result_t *res) {
  gmr_runtime_t *rt = NULL;
  if (cmp_new_runtime(run, cfg, o, &rt) != 0) return -1;
  snprintf(run->policy, sizeof run->policy, "%s", gmr_runtime_policy(rt));
  if (ctx->pass == CMP_PASS_PEAK && ctx->timeline) cmp_step_start(ctx, rt);
  gmr_replay_options_t ro = {.stop_at_oom = 0, .ud = ctx};
  if (ctx->pass == CMP_PASS_TIMED) {
    ro.check = o->check;
    if (o->progress) ro.callback = cmp_replay_cb, ro.callback_every = 4096;
  } else {
    ro.callback = cmp_replay_cb; /* every event */
  }
  ctx->start = cmp_now();
  int err = gmr_replay(rt, t, &ro, res);
  cmp_progress_clear(ctx);
  if (err == 0 && ctx->pass == CMP_PASS_TIMED) {
    gmr_stats(rt, &run->final);
    /* The driver calls the replay made (the simulator counts them). */
    if (gmr_sim_counters(rt, &run->calls) != 0) memset(&run->calls, 0, sizeof run->calls);
    if (gmr_sim_call_bytes(rt, &run->call_bytes) != 0)
      memset(&run->call_bytes, 0, sizeof run->call_bytes);
  }
  gmr_runtime_free(rt);
  if (err != 0 || ctx->oom_host) {
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "the replay failed: %s",
             err ? gmr_strerror(err) : "out of host memory");
    return -1;
  }
  return 0;
}

int compare_replay(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                   const compare_opts_t *o, int detail) {
  cmp_ctx_t ctx = {.run = run, .label = run->name, .progress = o->progress};
  if (cmp_pass(run, cfg, t, o, &ctx, &run->res) != 0) return -1;
  if (run->res.check_failed) {
    cmp_peak_figures(run);
    run->status = COMPARE_ECHECK;
    snprintf(run->error, sizeof run->error, "stopped after event %zu: %s", run->res.check_event,
             run->res.check_message);
    return -1;
  }
  if (detail == COMPARE_TIMED) {
    cmp_peak_figures(run);
    return 0;
  }

  /* The peak event (and the timeline). */
  gmr_replay_result_t again;
  size_t n = t->n_events ? t->n_events : 1;
  ctx = (cmp_ctx_t){.run = run,
                    .label = run->name,
                    .progress = o->progress,
                    .pass = CMP_PASS_PEAK,
                    .peak_reserved = run->final.peak_reserved_bytes,
                    .timeline = detail == COMPARE_DETAIL,
                    .bucket = (n + COMPARE_TIMELINE_POINTS - 1) / COMPARE_TIMELINE_POINTS};
  if (cmp_pass(run, cfg, t, o, &ctx, &again) != 0) return -1;
  cmp_point_close(&ctx);
  if (ctx.oom_host) return -1;
  if (ctx.peak_found) {
    run->res.at_peak = ctx.at_peak;
    run->res.peak_event = ctx.peak_event;
  }
  cmp_peak_figures(run);
  if (detail != COMPARE_DETAIL) return 0;

  /* The segments at the peak: replay up to it and walk. */
  size_t peak = run->res.peak_event;
  ctx = (cmp_ctx_t){.run = run,
                    .label = run->name,
                    .progress = o->progress,
                    .pass = CMP_PASS_MAP,
                    .peak_event = peak};
  run->map_status = GMR_EINVAL; /* until the walk runs */
  return cmp_pass(run, cfg, t, o, &ctx, &again);
}

void compare_run_release(compare_run_t *run) {
  free(run->steps);
  run->steps = NULL;
  run->n_steps = 0;
  free(run->points);
  free(run->map);
  free(run->yaml);
  run->points = NULL;
  run->map = NULL;
  run->yaml = NULL;
  run->n_points = run->n_map = 0;
}

/* ---- --snapshot ------------------------------------------------------------------ */

/* After each event: the simulated clock moves to the next event's time, so
 * the snapshot's times are the trace's. */
static int cmp_snapshot_cb(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t index, int status,
                           void *ud) {
  (void)status;
  (void)ud;
  if (index + 1 < t->n_events) gmr_sim_set_clock(rt, t->events[index + 1].time_us * 1000);
  return 0;
}

int compare_replay_snapshot(const gmr_config_t *cfg, const gmr_trace_data_t *t,
                            const compare_opts_t *o, FILE *out, char *why, size_t len) {
  gmr_sim_options_t sim = {.capacity = o->capacity};
  gmr_runtime_t *rt = NULL;
  int err = gmr_runtime_new_sim(cfg, &sim, &rt);
  if (err != 0) {
    snprintf(why, len, "cannot create the runtime: %s", gmr_strerror(err));
    return -1;
  }
  /* The clock first: the history times its entries by it from now on.  The
   * bound is PyTorch's default (sys.maxsize): the whole replay is kept. */
  if (t->n_events > 0) gmr_sim_set_clock(rt, t->events[0].time_us * 1000);
  err = gmr_history_enable(rt, SIZE_MAX >> 1);
  gmr_replay_result_t *res = err == 0 ? calloc(1, sizeof *res) : NULL;
  if (err == 0 && res == NULL) err = GMR_ENOMEM;
  gmr_replay_options_t ro = {.stop_at_oom = 0, .callback = cmp_snapshot_cb};
  if (err == 0) err = gmr_replay(rt, t, &ro, res);
  int failed = 0; /* the replay stopped on a device error: said in why */
  if (err == 0 && res->check_failed) {
    snprintf(why, len, "the replay failed: %s", res->check_message);
    failed = 1;
  } else if (err == 0) {
    err = gmr_snapshot_write(rt, out);
  }
  if (err != 0) snprintf(why, len, "%s: %s", gmr_strerror(err), gmr_last_error(rt));
  free(res);
  gmr_runtime_free(rt);
  return err != 0 || failed ? -1 : 0;
}
