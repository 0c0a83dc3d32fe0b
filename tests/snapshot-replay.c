/* snapshot-replay.c: replay a gmr trace CSV on a simulated runtime, print
 * what happened, and optionally write the runtime's memory snapshot.
 *
 *   snapshot-replay [--config FILE] [--history N] [--snapshot OUT.pickle]
 *                   [--stop-at-peak] TRACE.csv
 *
 * Prints one line:
 *   events E allocations A frees F live L peak_requested P ooms O
 * with peak_requested from the runtime's own statistics (gmr_stats).  Used by
 * tests/snapshot2csv.sh (a converted PyTorch snapshot replays with the counts
 * it should have) and scripts/gpu/snapshot-viz.sh (a gmr snapshot of a real
 * trace for PyTorch's memory_viz).  The simulated clock follows the trace's
 * Time column, so the snapshot's timeline is the trace's.  --stop-at-peak
 * replays up to the event where the requested bytes peak, so the snapshot
 * shows the segments at the peak.
 *
 * The CSV reader here is deliberately minimal (the header, then
 * Thread,Time,Action,Pointer,Size,Stream lines with allocate and free);
 * pointers are ids of live allocations, mapped to the runtime's own.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"

typedef struct slot_s {
  uint64_t id; /* the trace's pointer; 0: empty */
  void *ptr;   /* ours */
  uint64_t size;
} slot_t;

static slot_t *slots;
static size_t mask;
static size_t used;

static uint64_t hash(uint64_t x) {
  return (x >> 4) * 0x9E3779B97F4A7C15ull;
}

static slot_t *find(uint64_t id) {
  for (size_t i = hash(id) & mask;; i = (i + 1) & mask)
    if (slots[i].id == id || slots[i].id == 0) return &slots[i];
}

static void grow(void) {
  size_t cap = slots ? (mask + 1) * 2 : 1024;
  slot_t *old = slots;
  size_t old_cap = slots ? mask + 1 : 0;
  slots = calloc(cap, sizeof *slots);
  if (slots == NULL) {
    fprintf(stderr, "snapshot-replay: out of memory\n");
    exit(2);
  }
  mask = cap - 1;
  for (size_t i = 0; i < old_cap; ++i)
    if (old[i].id != 0) *find(old[i].id) = old[i];
  free(old);
}

static void erase(slot_t *s) {
  size_t i = (size_t)(s - slots), j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (slots[j].id == 0) break;
    size_t home = hash(slots[j].id) & mask;
    int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i].id = 0;
  --used;
}

static int usage(void) {
  fprintf(stderr, "usage: snapshot-replay [--config FILE] [--history N] [--snapshot OUT.pickle] "
                  "[--stop-at-peak] TRACE.csv\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *config = NULL, *snap = NULL, *trace = NULL;
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
    else if (argv[i][0] == '-' || trace != NULL)
      return usage();
    else
      trace = argv[i];
  }
  if (trace == NULL) return usage();
  if (snap != NULL && history == 0) history = (size_t)1 << 24;

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
  if (history && gmr_history_enable(rt, history) != 0) {
    fprintf(stderr, "snapshot-replay: %s\n", gmr_last_error(rt));
    return 1;
  }

  FILE *in = strcmp(trace, "-") == 0 ? stdin : fopen(trace, "r");
  if (in == NULL) {
    perror(trace);
    return 1;
  }
  grow();
  char line[512];
  unsigned long lineno = 0;
  uint64_t events = 0, allocs = 0, frees = 0, ooms = 0;
  uint64_t requested = 0, peak = 0, peak_event = 0;
  /* First pass for --stop-at-peak: find the event where requested peaks. */
  if (stop_at_peak) {
    FILE *scan = fopen(trace, "r");
    if (scan == NULL) {
      perror(trace);
      return 1;
    }
    uint64_t n = 0, req = 0;
    while (fgets(line, sizeof line, scan)) {
      unsigned long long t, p, size, s;
      char act[32];
      unsigned th;
      if (sscanf(line, "%u,%llu,%31[^,],%llx,%llu,%llu", &th, &t, act, &p, &size, &s) != 6)
        continue;
      ++n;
      if (strcmp(act, "allocate") == 0) {
        slot_t *sl = find(p);
        sl->id = p, sl->size = size;
        if (++used * 2 > mask + 1) grow();
        req += size;
        if (req > peak) peak = req, peak_event = n;
      } else if (strcmp(act, "free") == 0) {
        slot_t *sl = find(p);
        if (sl->id != 0) req -= sl->size, erase(sl);
      }
    }
    fclose(scan);
    memset(slots, 0, (mask + 1) * sizeof *slots);
    used = 0;
    peak = 0;
  }
  while (fgets(line, sizeof line, in)) {
    ++lineno;
    if (lineno == 1 && strncmp(line, "Thread,", 7) == 0) continue;
    unsigned long long t, p, size, s;
    char act[32];
    unsigned th;
    if (sscanf(line, "%u,%llu,%31[^,],%llx,%llu,%llu", &th, &t, act, &p, &size, &s) != 6 ||
        p == 0) {
      fprintf(stderr, "%s:%lu: malformed line: %s", trace, lineno, line);
      return 1;
    }
    ++events;
    gmr_sim_set_clock(rt, t * 1000);
    slot_t *sl = find(p);
    if (strcmp(act, "allocate") == 0) {
      if (sl->id != 0) {
        fprintf(stderr, "%s:%lu: allocate of %#llx, which is live\n", trace, lineno, p);
        return 1;
      }
      void *ptr = NULL;
      err = gmr_alloc(rt, size, GMR_SIM_STREAM(s), &ptr);
      if (err == GMR_ENOMEM) {
        ++ooms;
      } else if (err != 0) {
        fprintf(stderr, "%s:%lu: %s\n", trace, lineno, gmr_last_error(rt));
        return 1;
      } else {
        *sl = (slot_t){p, ptr, size};
        if (++used * 2 > mask + 1) grow();
        ++allocs;
        requested += size;
        if (requested > peak) peak = requested;
      }
    } else if (strcmp(act, "free") == 0) {
      if (sl->id == 0) {
        fprintf(stderr, "%s:%lu: free of %#llx, which is not live\n", trace, lineno, p);
        return 1;
      }
      if (gmr_free(rt, sl->ptr) != 0) {
        fprintf(stderr, "%s:%lu: %s\n", trace, lineno, gmr_last_error(rt));
        return 1;
      }
      requested -= sl->size;
      erase(sl);
      ++frees;
    } else {
      fprintf(stderr, "%s:%lu: unknown action '%s'\n", trace, lineno, act);
      return 1;
    }
    if (stop_at_peak && events == peak_event) break;
  }
  if (in != stdin) fclose(in);

  gmr_stats_t st;
  gmr_stats(rt, &st);
  if (st.peak_requested_bytes != peak)
    fprintf(stderr,
            "snapshot-replay: the runtime's peak requested (%" PRIu64
            ") differs from the trace's (%" PRIu64 ")\n",
            st.peak_requested_bytes, peak);
  printf("events %" PRIu64 " allocations %" PRIu64 " frees %" PRIu64 " live %zu "
         "peak_requested %" PRIu64 " ooms %" PRIu64 "\n",
         events, allocs, frees, used, st.peak_requested_bytes, ooms);
  if (snap != NULL) {
    FILE *f = fopen(snap, "wb");
    if (f == NULL || gmr_snapshot_write(rt, f) != 0) {
      fprintf(stderr, "snapshot-replay: %s: %s\n", snap,
              f ? gmr_last_error(rt) : "cannot open for writing");
      return 1;
    }
    fclose(f);
  }
  /* Give the live allocations back before freeing the runtime. */
  for (size_t i = 0; i <= mask; ++i)
    if (slots[i].id != 0) gmr_free(rt, slots[i].ptr);
  free(slots);
  gmr_runtime_free(rt);
  return 0;
}
