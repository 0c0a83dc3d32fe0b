/* replay-figures.c: one trace under one configuration on a fresh simulated
 * H200, as docs/stitch.md reports it: M events a second by the replaying
 * thread's CPU time (the median of REPS replays, each on a fresh runtime),
 * peak reserved over peak requested, and the simulator's device calls, in
 * all and from event FROM on (page maps per generated token when TOKENS,
 * the tokens generated after FROM, is given).  Build it against a build tree:
 *
 *   cc -O2 -Iinclude scripts/replay-figures.c lib/.libs/libgmr.so \
 *      -Wl,-rpath,$PWD/lib/.libs -o replay-figures
 *   ./replay-figures TRACE CONFIG [REPS [FROM [TOKENS]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gmr.h"
#include "gmr_replay.h"

static size_t from_event;
static gmr_sim_counters_t at_from;

static int on_event(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t i, int status, void *ud) {
  (void)t, (void)status, (void)ud;
  if (i == from_event) gmr_sim_counters(rt, &at_from);
  return 0;
}

static gmr_runtime_t *runtime(const char *path) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_file(path, &cfg, &err) != 0) {
    fprintf(stderr, "replay-figures: %s\n", err.message);
    exit(1);
  }
  gmr_sim_options_t o = {.capacity = (uint64_t)143771 << 20};
  gmr_runtime_t *rt = NULL;
  if (gmr_runtime_new_sim(cfg, &o, &rt) != 0) {
    fprintf(stderr, "replay-figures: %s\n", gmr_last_error(NULL));
    exit(1);
  }
  gmr_config_free(cfg);
  return rt;
}

static double seconds(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: replay-figures TRACE CONFIG [REPS [FROM [TOKENS]]]\n");
    return 2;
  }
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  if (reps < 1 || reps > 64) reps = 5;
  from_event = argc > 4 ? (size_t)atoll(argv[4]) : 0;
  double tokens = argc > 5 ? atof(argv[5]) : 0;
  gmr_trace_data_t *t = NULL;
  char err[512];
  if (gmr_trace_read(argv[1], &t, err, sizeof err) != 0) {
    fprintf(stderr, "replay-figures: %s\n", err);
    return 1;
  }
  double rate[64];
  for (int r = 0; r < reps; ++r) {
    gmr_runtime_t *rt = runtime(argv[2]);
    gmr_replay_options_t ro = {0};
    gmr_replay_result_t res;
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    gmr_replay(rt, t, &ro, &res);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    rate[r] = (double)t->n_events / seconds(&a, &b) / 1e6;
    gmr_runtime_free(rt);
  }
  qsort(rate, (size_t)reps, sizeof *rate, by_value);
  gmr_runtime_t *rt = runtime(argv[2]);
  gmr_replay_options_t ro = {.callback = from_event ? on_event : NULL};
  gmr_replay_result_t res;
  int rc = gmr_replay(rt, t, &ro, &res);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  printf("%s: %zu events, rc %d, %zu OOMs; M events/s %.2f (median of %d; %.2f to %.2f)\n", argv[1],
         t->n_events, rc, res.ooms, rate[reps / 2], reps, rate[0], rate[reps - 1]);
  printf("  peak reserved %llu / requested %llu = %.4f\n",
         (unsigned long long)st.peak_reserved_bytes, (unsigned long long)t->peak_requested,
         (double)st.peak_reserved_bytes / (double)t->peak_requested);
  printf("  device calls: page creates %llu, page maps %llu, page unmaps %llu, set access %llu\n",
         (unsigned long long)k.page_create_calls, (unsigned long long)k.page_map_calls,
         (unsigned long long)k.page_unmap_calls, (unsigned long long)k.set_access_calls);
  if (from_event) {
    unsigned long long maps = k.page_map_calls - at_from.page_map_calls;
    printf("  from event %zu: page maps %llu, page creates %llu", from_event, maps,
           (unsigned long long)(k.page_create_calls - at_from.page_create_calls));
    if (tokens > 0) printf(", %.3f page maps a token", (double)maps / tokens);
    printf("\n");
  }
  gmr_runtime_free(rt);
  gmr_trace_data_free(t);
  return rc != 0;
}
