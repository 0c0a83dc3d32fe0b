/* snapshot-replay.c: replay a gmr trace on a simulated runtime with the
 * library's reader and replayer (gmr_trace_read, gmr_replay), print what
 * happened, and optionally write the runtime's memory snapshot.
 *
 *   snapshot-replay [--config FILE] [--history N] [--snapshot OUT.pickle]
 *                   [--stop-at-peak] TRACE.csv
 *
 * Prints one line from the runtime's own statistics (gmr_stats):
 *   events E allocations A frees F live L peak_requested P ooms O
 * Used by tests/snapshot2csv.sh (a converted PyTorch snapshot replays with the
 * counts it should have) and scripts/gpu/snapshot-viz.sh (a gmr snapshot of a
 * real trace for PyTorch's memory_viz).  The simulated clock follows the
 * trace's Time column, so the snapshot's timeline is the trace's.
 * --stop-at-peak stops after the event where the requested bytes peak, so the
 * snapshot shows the segments at that moment.  The default configuration is
 * the direct policy; the simulated device has 141 GiB.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "gmr_replay.h"

typedef struct drive_s {
  size_t stop_after; /* event index to stop after; SIZE_MAX: none */
} drive_t;

/* After each event: move the clock to the next event's time; stop at the peak. */
static int on_event(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t i, int status, void *ud) {
  (void)status;
  const drive_t *d = ud;
  if (i == d->stop_after) return 1;
  if (i + 1 < t->n_events) gmr_sim_set_clock(rt, t->events[i + 1].time_us * 1000);
  return 0;
}

/* The index of the event after which Σ live requested bytes is largest. */
static size_t peak_index(const gmr_trace_data_t *t) {
  uint64_t *size = calloc(t->n_ids ? t->n_ids : 1, sizeof *size);
  if (size == NULL) return SIZE_MAX;
  uint64_t cur = 0, peak = 0;
  size_t at = SIZE_MAX;
  for (size_t i = 0; i < t->n_events; ++i) {
    const gmr_trace_event_t *e = &t->events[i];
    if (e->action == GMR_TRACE_ALLOC) {
      size[e->id] = e->size;
      cur += e->size;
      if (cur > peak) peak = cur, at = i;
    } else if (e->action == GMR_TRACE_FREE) {
      cur -= size[e->id];
    }
  }
  free(size);
  return at;
}

static int usage(void) {
  fprintf(stderr, "usage: snapshot-replay [--config FILE] [--history N] [--snapshot OUT.pickle] "
                  "[--stop-at-peak] TRACE.csv\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *config = NULL, *snap = NULL, *path = NULL;
  size_t history = 0;
  int stop_at_peak = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
      config = argv[++i];
    else if (strcmp(argv[i], "--snapshot") == 0 && i + 1 < argc)
      snap = argv[++i];
    else if (strcmp(argv[i], "--history") == 0 && i + 1 < argc)
      history = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--stop-at-peak") == 0)
      stop_at_peak = 1;
    else if ((argv[i][0] == '-' && argv[i][1] != '\0') || path != NULL)
      return usage();
    else
      path = argv[i];
  }
  if (path == NULL) return usage();
  if (snap != NULL && history == 0) history = (size_t)1 << 24;

  char err_text[1024];
  gmr_trace_data_t *t = NULL;
  if (gmr_trace_read(path, &t, err_text, sizeof err_text) != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", err_text);
    return 1;
  }
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  int err = config ? gmr_config_load_file(config, &cfg, &cerr)
                   : gmr_config_load_string("policy: {name: direct}\n", &cfg, &cerr);
  if (err != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", cerr.message);
    return 1;
  }
  gmr_sim_options_t so = {.capacity = (uint64_t)141 << 30};
  gmr_runtime_t *rt = NULL;
  err = gmr_runtime_new_sim(cfg, &so, &rt);
  gmr_config_free(cfg);
  if (err != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", gmr_last_error(NULL));
    return 1;
  }

  drive_t d = {.stop_after = stop_at_peak ? peak_index(t) : SIZE_MAX};
  gmr_replay_options_t opts = {.callback = on_event, .ud = &d};
  gmr_replay_result_t *res = calloc(1, sizeof *res);
  if (res == NULL) return 1;
  /* The clock first: the history times its entries from now on, by the
   * simulated clock's differences. */
  if (t->n_events > 0) gmr_sim_set_clock(rt, t->events[0].time_us * 1000);
  if (history && gmr_history_enable(rt, history) != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", gmr_last_error(rt));
    return 1;
  }
  if (gmr_replay(rt, t, &opts, res) != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", gmr_last_error(rt));
    return 1;
  }
  gmr_stats_t st;
  gmr_stats(rt, &st);
  printf("events %zu allocations %" PRIu64 " frees %" PRIu64 " live %" PRIu64
         " peak_requested %" PRIu64 " ooms %zu\n",
         res->events_done, st.num_allocs, st.num_frees, st.allocations, st.peak_requested_bytes,
         res->ooms);
  int rc = 0;
  if (snap != NULL) {
    FILE *f = fopen(snap, "wb");
    if (f == NULL || gmr_snapshot_write(rt, f) != 0) {
      fprintf(stderr, "snapshot-replay: %s: %s\n", snap,
              f ? gmr_last_error(rt) : "cannot open for writing");
      rc = 1;
    }
    if (f) fclose(f);
  }
  free(res);
  gmr_runtime_free(rt);
  gmr_trace_data_free(t);
  return rc;
}
