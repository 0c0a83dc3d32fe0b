/* stitch-traces.c: the stitch policy on the shipped traces.
 *
 * Replays every trace in traces/ (*.csv) on a simulated H200 (143771 MiB) under
 * config/stitch.yaml and config/pytorch-expandable.yaml, as gmr-compare
 * does, and asserts the policy's goal: peak reserved / peak requested
 * <= 1.02, and below PyTorch's expandable segments on each trace.  The
 * invariant walk runs after every event (GMR_STITCH_CHECK_EVERY=N: every
 * N-th).  It also reports the device calls of the last half of each trace,
 * when the loop repeats itself (map calls after warm-up), and asserts that
 * there are none on gpt2_train, whose steps repeat exactly.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "gmr_replay.h"
#include "sim-runtime.h"
#include "tap.h"

#define H200_BYTES ((uint64_t)143771 << 20)

typedef struct ctx_s {
  size_t every, half, checks_failed;
  int64_t maps_at_half, creates_at_half;
  char why[512];
} ctx_t;

static int64_t stat_of(gmr_runtime_t *rt, const char *key) {
  int64_t v = 0;
  gmr_stat_get(rt, key, &v);
  return v;
}

static int on_event(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t i, int status, void *ud) {
  (void)t;
  (void)status;
  ctx_t *c = ud;
  if (i == c->half) {
    c->maps_at_half = stat_of(rt, "stitch.map_calls");
    c->creates_at_half = stat_of(rt, "stitch.pages.created");
  }
  if (c->every != 0 && i % c->every == 0 && gmr_check(rt) != 0 && c->checks_failed++ == 0)
    snprintf(c->why, sizeof c->why, "event %zu: %s", i, gmr_last_error(rt));
  return 0;
}

static double replay(const gmr_trace_data_t *t, const char *config, ctx_t *c,
                     gmr_runtime_t **keep) {
  gmr_runtime_t *rt = sim_runtime_file(config, H200_BYTES);
  if (rt == NULL) return -1;
  gmr_replay_options_t ro = {.callback = c ? on_event : NULL, .ud = c};
  gmr_replay_result_t res;
  int rc = gmr_replay(rt, t, &ro, &res);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  if (rc != 0 || res.ooms != 0) diag("%s: replay rc %d, %zu OOMs", config, rc, res.ooms);
  if (keep)
    *keep = rt;
  else
    gmr_runtime_free(rt);
  return rc == 0 && res.ooms == 0 ? (double)st.peak_reserved_bytes / (double)t->peak_requested : -1;
}

/* gpt2_train's steps are identical from its third on: a policy that hands
 * every block the range it had one step before maps nothing in the second
 * half of the trace.  Checked twice: replayed as gmr-compare does, and with
 * the device behind the host (every block queues work on its bytes, which
 * completes only every 1000 events, as a GPU that runs a step behind), where
 * no unmap may touch bytes that queued work still uses. */
static void test_steady(const gmr_trace_data_t *t, int64_t maps_second_half) {
  is_int((int)maps_second_half, 0, "gpt2_train: no page map in the second half of the trace");
  gmr_runtime_t *rt = sim_runtime_file("stitch.yaml", H200_BYTES);
  void **ptr = rt ? calloc(t->n_ids, sizeof *ptr) : NULL;
  if (ptr == NULL) {
    ok(0, "gpt2_train with the device behind: no runtime");
    gmr_runtime_free(rt);
    return;
  }
  int64_t maps_at_half = 0;
  size_t fails = 0;
  for (size_t i = 0; i < t->n_events; ++i) {
    const gmr_trace_event_t *e = &t->events[i];
    gmr_stream_t s = GMR_SIM_STREAM(e->stream);
    if (i % 1000 == 0) gmr_sim_stream_complete(rt, GMR_SIM_STREAM(0));
    if (i == t->n_events / 2) maps_at_half = stat_of(rt, "stitch.map_calls");
    if (e->action == GMR_TRACE_ALLOC) {
      if (gmr_alloc(rt, e->size, s, &ptr[e->id]) != 0 ||
          gmr_sim_stream_use(rt, s, ptr[e->id], e->size) != 0)
        ++fails;
    } else if (e->action == GMR_TRACE_FREE && ptr[e->id] != NULL) {
      gmr_free(rt, ptr[e->id]);
      ptr[e->id] = NULL;
    }
  }
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  is_int((int)fails, 0, "gpt2_train with the device behind: every allocation served");
  is_int((int)(stat_of(rt, "stitch.map_calls") - maps_at_half), 0,
         "  no page map in the second half");
  is_int((int)k.unsafe_unmaps, 0, "  no unmap under queued work");
  is_int(gmr_check(rt), 0, "  invariants hold");
  free(ptr);
  gmr_runtime_free(rt);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

int main(void) {
  char traces[32][128];
  int n = 0;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/traces", tap_srcdir());
  DIR *d = opendir(dir);
  for (struct dirent *e; d != NULL && n < 32 && (e = readdir(d)) != NULL;) {
    size_t len = strlen(e->d_name);
    if (len > 4 && len < 128 && strcmp(e->d_name + len - 4, ".csv") == 0) {
      memcpy(traces[n], e->d_name, len - 4);
      traces[n++][len - 4] = '\0';
    }
  }
  if (d != NULL) closedir(d);
  qsort(traces, (size_t)n, sizeof traces[0], name_cmp);
  ok(n >= 4, "%d traces in traces/", n);
  const char *env = getenv("GMR_STITCH_CHECK_EVERY");
  size_t every = env ? (size_t)atol(env) : 1;
  for (int i = 0; i < n; ++i) {
    char path[8400], err[512];
    snprintf(path, sizeof path, "%s/%s.csv", dir, traces[i]);
    gmr_trace_data_t *t = NULL;
    if (gmr_trace_read(path, &t, err, sizeof err) != 0) {
      ok(0, "%s: %s", traces[i], err);
      continue;
    }
    ctx_t c = {.every = every, .half = t->n_events / 2};
    gmr_runtime_t *rt = NULL;
    double s = replay(t, "stitch.yaml", &c, &rt);
    double e = replay(t, "pytorch-expandable.yaml", NULL, NULL);
    ok(s > 0 && s <= 1.02, "%s: stitch peak reserved / peak requested = %.4f <= 1.02", traces[i],
       s);
    ok(s > 0 && e > 0 && s < e, "%s:   below pytorch-expandable's %.4f", traces[i], e);
    is_int((int)c.checks_failed, 0, "%s:   invariants hold after every %sevent", traces[i],
           every == 1 ? "" : "N-th ");
    if (c.checks_failed) diag("%s", c.why);
    if (rt != NULL) {
      int64_t maps = stat_of(rt, "stitch.map_calls") - c.maps_at_half;
      if (strcmp(traces[i], "gpt2_train") == 0) test_steady(t, maps);
      int64_t creates = stat_of(rt, "stitch.pages.created") - c.creates_at_half;
      diag("%s: second half of the trace: %lld page maps, %lld pages created; hits %lld, misses "
           "%lld, peak mappings %lld, dead gaps at most %lld bytes",
           traces[i], (long long)maps, (long long)creates,
           (long long)stat_of(rt, "stitch.cache_hits"),
           (long long)stat_of(rt, "stitch.cache_misses"),
           (long long)stat_of(rt, "stitch.mappings.peak"),
           (long long)stat_of(rt, "stitch.dead_gap_bytes.peak"));
      gmr_runtime_free(rt);
    }
    gmr_trace_data_free(t);
  }
  return done_testing();
}
