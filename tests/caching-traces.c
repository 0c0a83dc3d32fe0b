/* caching-traces.c: the caching policy against PyTorch on real traces.
 *
 * Replays traces/gpt2_train.csv, resnet50_train.csv, gpt2_varlen_train.csv
 * and gpt2_generate.csv (recorded from PyTorch 2.11 on an H200 of 143771 MiB)
 * on a simulated device of that size and compares with PyTorch's own figures
 * (traces/figures.md, read at run time): peak reserved bytes and peak
 * segment count exactly under the default settings and max_split_size_mb:128,
 * peak reserved within 1% with expandable segments.  Then the summary after
 * the gpt2_train replay must equal PyTorch's own memory_summary()
 * (traces/gpt2_train.memory_summary.txt) in every row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "gmr_replay.h"
#include "sim-runtime.h"
#include "tap.h"

#define H200_BYTES ((uint64_t)143771 << 20)

typedef struct figure_s {
  char trace[64], conf[64];
  long long peak_reserved, peak_allocated, peak_requested, segments; /* -1: n/a */
} figure_t;

static figure_t figures[32];
static int n_figures;

static long long num_or_na(const char *s) {
  while (*s == ' ')
    ++s;
  return strncmp(s, "n/a", 3) == 0 ? -1 : atoll(s);
}

static int read_figures(void) {
  char path[1024], line[512];
  snprintf(path, sizeof path, "%s/traces/figures.md", tap_srcdir());
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) && n_figures < 32) {
    char *col[8];
    int n = 0;
    for (char *p = strtok(line, "|"); p && n < 8; p = strtok(NULL, "|"))
      col[n++] = p;
    if (n < 7 || strstr(col[0], "trace") || strstr(col[0], "---")) continue;
    figure_t *fg = &figures[n_figures++];
    sscanf(col[0], " %63s", fg->trace);
    sscanf(col[1], " %63s", fg->conf);
    fg->peak_reserved = num_or_na(col[2]);
    fg->peak_allocated = num_or_na(col[3]);
    fg->peak_requested = num_or_na(col[4]);
    fg->segments = num_or_na(col[5]);
  }
  fclose(f);
  return 0;
}

static const figure_t *figure(const char *trace, const char *conf) {
  for (int i = 0; i < n_figures; ++i)
    if (strcmp(figures[i].trace, trace) == 0 && strcmp(figures[i].conf, conf) == 0)
      return &figures[i];
  return NULL;
}

static gmr_runtime_t *runtime_for(const char *config_file) {
  return sim_runtime_file(config_file, H200_BYTES);
}

static int64_t st(gmr_runtime_t *rt, const char *key) {
  int64_t v = -1;
  gmr_stat_get(rt, key, &v);
  return v;
}

/* The recorded pointer of every line of a trace (index: 1-based line). */
static uint64_t *load_pointers(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return NULL;
  size_t cap = 1 << 16, n = 1;
  uint64_t *v = calloc(cap, sizeof *v);
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (n + 1 >= cap) v = realloc(v, (cap *= 2) * sizeof *v);
    char *p = line;
    for (int comma = 0; comma < 3 && p; ++comma)
      p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
    v[n++] = p ? strtoull(p, NULL, 16) : 0;
  }
  fclose(f);
  return v;
}

/* Before each allocation, tell the simulator where PyTorch's device put a
 * new segment for it: PyTorch breaks ties between equal-size free blocks by
 * address, so reproducing every figure needs the recorded placement.  A
 * segment's first block starts at the segment, so the recorded pointer of
 * the allocation that creates a segment is the segment's address. */
typedef struct hints_s {
  const uint64_t *ptr_of_line;
} hints_t;

static void hint_for(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t i, const hints_t *h) {
  if (i < t->n_events && t->events[i].action == GMR_TRACE_ALLOC)
    gmr_sim_place_next(rt, (uintptr_t)h->ptr_of_line[t->events[i].line]);
}

static int hint_cb(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t index, int status,
                   void *ud) {
  (void)status;
  hint_for(rt, t, index + 1, ud);
  return 0;
}

/* Replay `t` under a config; leaves the runtime for more checks (or NULL). */
static gmr_runtime_t *replay(const gmr_trace_data_t *t, const char *config_file,
                             const uint64_t *ptr_of_line) {
  gmr_runtime_t *rt = runtime_for(config_file);
  if (rt == NULL) return NULL;
  gmr_replay_options_t opts = {0};
  hints_t h = {ptr_of_line};
  if (ptr_of_line != NULL) {
    opts.callback = hint_cb;
    opts.ud = &h;
    opts.callback_every = 1;
    hint_for(rt, t, 0, &h);
  }
  gmr_replay_result_t *res = calloc(1, sizeof *res);
  int rc = gmr_replay(rt, t, &opts, res);
  if (rc != 0 || res->ooms != 0) diag("replay: rc %d, %zu OOMs", rc, res->ooms);
  free(res);
  return rt;
}

static void check_trace(const char *name) {
  char path[1024], err[512] = "";
  snprintf(path, sizeof path, "%s/traces/%s.csv", tap_srcdir(), name);
  gmr_trace_data_t *t = NULL;
  if (gmr_trace_read(path, &t, err, sizeof err) != 0) {
    ok(0, "%s: read (%s)", name, err);
    return;
  }
  uint64_t *ptrs = load_pointers(path);
  static const struct {
    const char *conf, *file;
  } confs[] = {{"default", "pytorch.yaml"},
               {"max_split_size_mb:128", "pytorch-max-split-128.yaml"},
               {"expandable_segments:True", "pytorch-expandable.yaml"}};
  for (int k = 0; k < 3; ++k) {
    const figure_t *fg = figure(name, confs[k].conf);
    if (!ok(fg != NULL, "%s, %s: PyTorch's figures are in figures.md", name, confs[k].conf))
      continue;
    gmr_runtime_t *rt = replay(t, confs[k].file, k < 2 ? ptrs : NULL);
    if (!ok(rt != NULL, "%s, %s: replayed", name, confs[k].conf)) continue;
    int64_t reserved = st(rt, "reserved_bytes.all.peak");
    if (k < 2) {
      is_int(reserved, fg->peak_reserved, "%s, %s: peak reserved bytes exactly", name,
             confs[k].conf);
      is_int(st(rt, "segment.all.peak"), fg->segments, "%s, %s: peak segments exactly", name,
             confs[k].conf);
      is_int(st(rt, "allocated_bytes.all.peak"), fg->peak_allocated,
             "%s, %s: peak allocated bytes exactly", name, confs[k].conf);
    } else {
      double rel = fabs((double)reserved - (double)fg->peak_reserved) / (double)fg->peak_reserved;
      ok(rel < 0.01, "%s, %s: peak reserved %lld within 1%% of PyTorch's %lld (%.3f%%)", name,
         confs[k].conf, (long long)reserved, fg->peak_reserved, rel * 100);
      is_int(st(rt, "segment.all.peak"), 0, "%s, %s: no cudaMalloc segments", name, confs[k].conf);
    }
    is_int(st(rt, "requested_bytes.all.peak"), fg->peak_requested,
           "%s, %s: peak requested bytes exactly", name, confs[k].conf);
    is_int(gmr_check(rt), 0, "%s, %s: invariants hold at the end", name, confs[k].conf);
    gmr_runtime_free(rt);
    if (k == 2) continue;
    /* The peaks do not depend on where the device places segments. */
    rt = replay(t, confs[k].file, NULL);
    is_int(st(rt, "reserved_bytes.all.peak"), fg->peak_reserved,
           "%s, %s: peak reserved bytes exactly, simulator's own placement", name, confs[k].conf);
    is_int(st(rt, "segment.all.peak"), fg->segments,
           "%s, %s: peak segments exactly, simulator's own placement", name, confs[k].conf);
    gmr_runtime_free(rt);
  }
  free(ptrs);
  gmr_trace_data_free(t);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  return buf;
}

static void check_summary(void) {
  char path[1024], err[512] = "";
  snprintf(path, sizeof path, "%s/traces/gpt2_train.csv", tap_srcdir());
  gmr_trace_data_t *t = NULL;
  if (gmr_trace_read(path, &t, err, sizeof err) != 0) {
    ok(0, "gpt2_train: read (%s)", err);
    return;
  }
  uint64_t *ptrs = load_pointers(path);
  gmr_runtime_t *rt = replay(t, "pytorch.yaml", ptrs);
  free(ptrs);
  char *mine = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&mine, &len);
  gmr_summary(rt, f);
  fclose(f);
  snprintf(path, sizeof path, "%s/traces/gpt2_train.memory_summary.txt", tap_srcdir());
  char *theirs = read_file(path);
  ok(theirs != NULL, "PyTorch's summary is readable");
  /* Row by row, so a difference names its row. */
  char *a = mine, *b = theirs;
  int row = 0, differ = 0;
  while (a && b && *a && *b) {
    char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    ++row;
    if (la != lb || memcmp(a, b, la) != 0) {
      ++differ;
      diag("row %d differs:\n#   gmr:     %.*s\n#   PyTorch: %.*s", row, (int)la, a, (int)lb, b);
    }
    a = ea ? ea + 1 : NULL;
    b = eb ? eb + 1 : NULL;
  }
  is_int(row, 47, "gpt2_train summary: 47 rows compared");
  is_int(differ, 0, "gpt2_train summary: every row equals PyTorch's memory_summary()");
  ok(theirs && strcmp(mine, theirs) == 0, "gpt2_train summary: byte for byte");
  free(theirs);
  free(mine);
  gmr_runtime_free(rt);
  gmr_trace_data_free(t);
}

int main(void) {
  if (!ok(read_figures() == 0 && n_figures >= 9, "traces/figures.md has PyTorch's figures"))
    return done_testing();
  check_trace("gpt2_train");
  check_trace("resnet50_train");
  check_trace("gpt2_varlen_train");
  check_trace("gpt2_generate");
  check_summary();
  return done_testing();
}
