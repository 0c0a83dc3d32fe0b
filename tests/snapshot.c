/* snapshot.c: tests of the memory history (gmr_history_enable, GMR_HISTORY)
 * and of PyTorch memory snapshots (gmr_snapshot_write).
 *
 * Each scenario runs on the simulated device, writes a snapshot, and writes
 * what the snapshot must hold (from the pointers and sizes the scenario used)
 * to an expectation file; tests/snapshot-check.py loads the snapshot with
 * plain python3 pickle, checks the format and compares.  Its "ok"/"not ok"
 * lines become this program's TAP lines.  Skips when python3 is absent.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmr.h"
#include "gmr_replay.h"
#include "observe/history.h"
#include "observe/recording.h"
#include "policy.h"
#include "runtime/config.h" /* the hook test builds a configuration around its own policy */
#include "runtime/runtime.h"
#include "tap.h"

#define MiB  ((size_t)1 << 20)
#define U(x) ((unsigned long long)(uintptr_t)(x))

static const char *python;
static char tmpdir[512];

/* ---- running the checker ---------------------------------------------------- */

typedef struct scenario_s {
  char snap_path[600];
  char expect_path[600];
  FILE *ex; /* the expectation file being written */
} scenario_t;

static void scenario_open(scenario_t *sc, const char *name) {
  snprintf(sc->snap_path, sizeof sc->snap_path, "%s/%s.pickle", tmpdir, name);
  snprintf(sc->expect_path, sizeof sc->expect_path, "%s/%s.expect", tmpdir, name);
  sc->ex = fopen(sc->expect_path, "w");
  if (sc->ex == NULL) {
    printf("Bail out! cannot write %s: %s\n", sc->expect_path, strerror(errno));
    exit(1);
  }
}

/* Write the snapshot of rt, then run the checker and relay its lines. */
static void scenario_check(scenario_t *sc, gmr_runtime_t *rt, const char *label) {
  fclose(sc->ex);
  FILE *f = fopen(sc->snap_path, "wb");
  int err = f ? gmr_snapshot_write(rt, f) : GMR_EIO;
  if (f) fclose(f);
  is_int(err, 0, "%s: gmr_snapshot_write", label);
  if (err != 0) diag("%s", gmr_last_error(rt));
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' '%s/tests/snapshot-check.py' '%s' '%s' 2>&1", python,
           tap_srcdir(), sc->snap_path, sc->expect_path);
  FILE *p = popen(cmd, "r");
  if (p == NULL) {
    ok(0, "%s: run the checker", label);
    return;
  }
  char line[4096];
  int lines = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, "ok ", 3) == 0) {
      ok(1, "%s: %s", label, line + 3);
      ++lines;
    } else if (strncmp(line, "not ok ", 7) == 0) {
      ok(0, "%s: %s", label, line + 7);
      ++lines;
    } else {
      diag("%s", line[0] == '#' ? line + 1 : line);
    }
  }
  int status = pclose(p);
  ok(status == 0 && lines > 10, "%s: the checker ran %d checks and passed", label, lines);
  if (getenv("GMR_KEEP") == NULL) {
    remove(sc->snap_path);
    remove(sc->expect_path);
  }
}

static gmr_runtime_t *new_runtime(const char *yaml) {
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  int err = gmr_config_load_string(yaml, &cfg, &cerr);
  if (err != 0) {
    printf("Bail out! config: %s\n", cerr.message);
    exit(1);
  }
  gmr_runtime_t *rt = NULL;
  err = gmr_runtime_new_sim(cfg, NULL, &rt);
  gmr_config_free(cfg);
  if (err != 0) {
    printf("Bail out! runtime: %s\n", gmr_strerror(err));
    exit(1);
  }
  return rt;
}

static gmr_runtime_t *new_runtime_file(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/config/%s", tap_srcdir(), name);
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  if (gmr_config_load_file(path, &cfg, &cerr) != 0) {
    printf("Bail out! %s\n", cerr.message);
    exit(1);
  }
  gmr_runtime_t *rt = NULL;
  int err = gmr_runtime_new_sim(cfg, NULL, &rt);
  gmr_config_free(cfg);
  if (err != 0) {
    printf("Bail out! runtime: %s\n", gmr_strerror(err));
    exit(1);
  }
  return rt;
}

static void *alloc_ok(gmr_runtime_t *rt, size_t size, gmr_stream_t s) {
  void *p = NULL;
  int err = gmr_alloc(rt, size, s, &p);
  if (err != 0) {
    printf("Bail out! gmr_alloc(%zu): %s\n", size, gmr_last_error(rt));
    exit(1);
  }
  return p;
}

/* ---- scenarios ---------------------------------------------------------------- */

/* config/direct.yaml: one segment per allocation; streams and clock exact. */
static void test_direct(void) {
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  is_int(gmr_history_enable(rt, 1000), 0, "direct: gmr_history_enable(1000)");
  gmr_stream_t s7 = GMR_SIM_STREAM(7);
  gmr_sim_set_clock(rt, 1000000); /* 1 ms */
  void *a = alloc_ok(rt, 1000, NULL);
  gmr_sim_set_clock(rt, 1250000);
  void *b = alloc_ok(rt, 3 * MiB, s7);
  gmr_sim_set_clock(rt, 4000000);
  is_int(gmr_free(rt, a), 0, "direct: free a");
  is_int(gmr_free(rt, a), GMR_EBADPTR, "direct: a double free is refused and not recorded");
  void *c = alloc_ok(rt, 5000, NULL);

  scenario_t sc;
  scenario_open(&sc, "direct");
  void *lo = (uintptr_t)b < (uintptr_t)c ? b : c, *hi = lo == b ? c : b;
  fprintf(sc.ex, "segments 2\n");
  for (int i = 0; i < 2; ++i) {
    void *p = i == 0 ? lo : hi;
    size_t n = p == b ? 3 * MiB : 5000;
    unsigned long long st = p == b ? 7 : 0;
    fprintf(sc.ex, "segment %llu %zu %zu %zu %zu %llu large 0 1\n", U(p), n, n, n, n, st);
    fprintf(sc.ex, "block %llu %zu %zu active_allocated\n", U(p), n, n);
  }
  fprintf(sc.ex, "traces 0 10\n");
  fprintf(sc.ex, "trace segment_alloc %llu 1000 0 0\n", U(a));
  fprintf(sc.ex, "trace alloc %llu 1000 0 0\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu %zu 7 250\n", U(b), 3 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 7 250\n", U(b), 3 * MiB);
  fprintf(sc.ex, "trace free_requested %llu 1000 0 3000\n", U(a));
  fprintf(sc.ex, "trace free_completed %llu 1000 0 3000\n", U(a));
  fprintf(sc.ex, "trace segment_free %llu 1000 0 3000\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu 5000 0 3000\n", U(c));
  fprintf(sc.ex, "trace alloc %llu 5000 0 3000\n", U(c));
  fprintf(sc.ex, "trace snapshot 0 %zu 0 3000\n", 3 * MiB + 5000); /* active bytes */
  fprintf(sc.ex, "setting gmr_policy direct\nsetting gmr_backend sim\n");
  fprintf(sc.ex, "setting gmr_history_max_entries 1000\nsetting gmr_history_dropped 0\n");
  scenario_check(&sc, rt, "direct");
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* A limit stack: the capped backend forwards to the real one, and segment
 * entries must be recorded once; refusals are oom entries. */
static void test_limit(const char *counts) {
  char yaml[256], label[64];
  snprintf(yaml, sizeof yaml, "policy: {name: direct}\nlimit: {bytes: 8MiB, counts: %s}\n", counts);
  snprintf(label, sizeof label, "limit(%s)", counts);
  gmr_runtime_t *rt = new_runtime(yaml);
  is_str(gmr_runtime_policy(rt), "limit(direct)", "%s: the stack", label);
  is_int(gmr_history_enable(rt, 64), 0, "%s: gmr_history_enable(64)", label);
  void *a = alloc_ok(rt, 3 * MiB, NULL);
  void *b = NULL;
  is_int(gmr_alloc(rt, 6 * MiB, NULL, &b), GMR_ENOMEM, "%s: 3 MiB + 6 MiB pass the 8 MiB cap",
         label);
  size_t dev_free = 0, total = 0;
  gmr_mem_info(rt, &dev_free, &total);
  void *c = alloc_ok(rt, 4 * MiB, GMR_SIM_STREAM(2));
  is_int(gmr_free(rt, a), 0, "%s: free a", label);

  scenario_t sc;
  scenario_open(&sc, counts);
  fprintf(sc.ex, "segments 1\n");
  fprintf(sc.ex, "segment %llu %zu %zu %zu %zu 2 large 0 1\n", U(c), 4 * MiB, 4 * MiB, 4 * MiB,
          4 * MiB);
  fprintf(sc.ex, "block %llu %zu %zu active_allocated\n", U(c), 4 * MiB, 4 * MiB);
  fprintf(sc.ex, "traces 0 9\n");
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(a), 3 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(a), 3 * MiB);
  fprintf(sc.ex, "trace oom %zu %zu 0\n", dev_free, 6 * MiB);
  fprintf(sc.ex, "trace segment_alloc %llu %zu 2\n", U(c), 4 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 2\n", U(c), 4 * MiB);
  fprintf(sc.ex, "trace free_requested %llu %zu 0\n", U(a), 3 * MiB);
  fprintf(sc.ex, "trace free_completed %llu %zu 0\n", U(a), 3 * MiB);
  fprintf(sc.ex, "trace segment_free %llu %zu 0\n", U(a), 3 * MiB);
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 4 * MiB);
  fprintf(sc.ex, "count segment_alloc 2\ncount oom 1\n");
  fprintf(sc.ex, "setting gmr_policy limit(direct)\n");
  scenario_check(&sc, rt, label);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* TensorFlow's BFC with allow_growth (config/tf-growth.yaml): a 2 MiB region,
 * then a 4 MiB one; a chunk is split only when it is at least twice the
 * request or 128 MiB more, so 3 MiB takes the whole 4 MiB chunk; a freed
 * chunk merges with its free neighbours.  Regions are segments, chunks are
 * blocks. */
static void test_bfc(void) {
  gmr_runtime_t *rt = new_runtime_file("tf-growth.yaml");
  is_int(gmr_history_enable(rt, 100), 0, "bfc: gmr_history_enable(100)");
  void *a = alloc_ok(rt, 1000, NULL);
  void *b = alloc_ok(rt, 3 * MiB, NULL);
  is_int(gmr_free(rt, a), 0, "bfc: free a");
  scenario_t sc;
  scenario_open(&sc, "bfc");
  fprintf(sc.ex, "segments 2\n");
  fprintf(sc.ex, "segment %llu %zu 0 0 0 0 large 0 1\n", U(a), 2 * MiB);
  fprintf(sc.ex, "block %llu %zu 0 inactive\n", U(a), 2 * MiB);
  fprintf(sc.ex, "segment %llu %zu %zu %zu %zu 0 large 0 1\n", U(b), 4 * MiB, 4 * MiB, 4 * MiB,
          3 * MiB);
  fprintf(sc.ex, "block %llu %zu %zu active_allocated\n", U(b), 4 * MiB, 3 * MiB);
  fprintf(sc.ex, "traces 0 7\n");
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(a), 2 * MiB);
  fprintf(sc.ex, "trace alloc %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(b), 4 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 3 * MiB);
  fprintf(sc.ex, "trace free_requested %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace free_completed %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 4 * MiB); /* active: the whole chunk */
  fprintf(sc.ex, "setting gmr_policy bfc\n");
  scenario_check(&sc, rt, "bfc growth");
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  /* vmm: one virtual range, pages mapped at its end: the regions coalesce
   * into one expandable segment of 6 MiB, whose free chunk of 6 MiB - 1024
   * takes the 3 MiB request whole; the history has segment_map entries. */
  rt = new_runtime("policy: {name: bfc, allow_growth: true, vmm: true}\n");
  is_int(gmr_history_enable(rt, 100), 0, "bfc vmm: gmr_history_enable(100)");
  a = alloc_ok(rt, 1000, NULL);
  b = alloc_ok(rt, 3 * MiB, NULL);
  is_ptr(b, (char *)a + 1024, "bfc vmm: the 3 MiB block follows the 1024-byte chunk");
  is_int(gmr_free(rt, a), 0, "bfc vmm: free a");
  scenario_open(&sc, "bfc-vmm");
  fprintf(sc.ex, "segments 1\n");
  fprintf(sc.ex, "segment %llu %zu %zu %zu %zu 0 large 1 2\n", U(a), 6 * MiB, 6 * MiB - 1024,
          6 * MiB - 1024, 3 * MiB);
  fprintf(sc.ex, "block %llu 1024 0 inactive\n", U(a));
  fprintf(sc.ex, "block %llu %zu %zu active_allocated\n", U(b), 6 * MiB - 1024, 3 * MiB);
  fprintf(sc.ex, "traces 0 7\n");
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(a), 2 * MiB);
  fprintf(sc.ex, "trace alloc %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(a) + 2 * MiB, 4 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 3 * MiB);
  fprintf(sc.ex, "trace free_requested %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace free_completed %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 6 * MiB - 1024);
  scenario_check(&sc, rt, "bfc vmm");
  gmr_free(rt, b);
  gmr_runtime_free(rt);
}

/* A runtime on config/NAME, or NULL (with a skip) when that policy is not built. */
static gmr_runtime_t *runtime_if_built(const char *name, const char *label) {
  char path[1024];
  snprintf(path, sizeof path, "%s/config/%s", tap_srcdir(), name);
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  if (gmr_config_load_file(path, &cfg, &cerr) != 0) {
    skip("%s: %s", label, cerr.message);
    return NULL;
  }
  gmr_runtime_t *rt = NULL;
  int err = gmr_runtime_new_sim(cfg, NULL, &rt);
  gmr_config_free(cfg);
  is_int(err, 0, "%s: runtime on %s", label, name);
  return err == 0 ? rt : NULL;
}

static void seg_line(FILE *ex, void *addr, size_t total, size_t allocated, size_t active,
                     size_t requested, unsigned stream, const char *type, int expandable,
                     int nblocks) {
  fprintf(ex, "segment %llu %zu %zu %zu %zu %u %s %d %d\n", U(addr), total, allocated, active,
          requested, stream, type, expandable, nblocks);
}

static void block_line(FILE *ex, void *addr, size_t size, size_t requested, const char *state) {
  fprintf(ex, "block %llu %zu %zu %s\n", U(addr), size, requested, state);
}

/* PyTorch's caching allocator (config/pytorch.yaml): 1000 bytes is a 1024-byte
 * block of a 2 MiB small segment; 5 MiB is split from a 20 MiB large segment;
 * a block freed while a stream still uses it is active_pending_free until the
 * stream's work completes; empty_cache releases the free small segment. */
static void test_caching(void) {
  gmr_runtime_t *rt = runtime_if_built("pytorch.yaml", "caching");
  if (rt == NULL) return;
  gmr_history_enable(rt, 1000);
  gmr_stream_t s3 = GMR_SIM_STREAM(3);
  void *a = alloc_ok(rt, 1000, NULL);
  void *b = alloc_ok(rt, 5 * MiB, NULL);
  gmr_sim_stream_enqueue(rt, s3);
  is_int(gmr_record_stream(rt, b, s3), 0, "caching: record_stream(b, stream 3)");
  is_int(gmr_free(rt, b), 0, "caching: free b while stream 3 is busy");
  scenario_t sc;
  scenario_open(&sc, "caching");
  bool small_first = (uintptr_t)a < (uintptr_t)b;
  fprintf(sc.ex, "segments 2\n");
  for (int i = 0; i < 2; ++i) {
    if ((i == 0) == small_first) {
      seg_line(sc.ex, a, 2 * MiB, 1024, 1024, 1000, 0, "small", 0, 2);
      block_line(sc.ex, a, 1024, 1000, "active_allocated");
      block_line(sc.ex, (char *)a + 1024, 2 * MiB - 1024, 0, "inactive");
    } else {
      /* The caching policy's walk reports no requested bytes for a pending
       * block (PyTorch keeps them: requested_size would be 5 MiB). */
      seg_line(sc.ex, b, 20 * MiB, 0, 5 * MiB, 0, 0, "large", 0, 2);
      block_line(sc.ex, b, 5 * MiB, 0, "active_pending_free");
      block_line(sc.ex, (char *)b + 5 * MiB, 15 * MiB, 0, "inactive");
    }
  }
  fprintf(sc.ex, "traces 0 7\n");
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(a), 2 * MiB);
  fprintf(sc.ex, "trace alloc %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(b), 20 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 5 * MiB);
  fprintf(sc.ex, "trace free_requested %llu %zu 0\n", U(b), 5 * MiB);
  /* the caching policy does not report completions: the runtime does, with the free */
  fprintf(sc.ex, "trace free_completed %llu %zu 0\n", U(b), 5 * MiB);
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 5 * MiB + 1024); /* active bytes */
  fprintf(sc.ex, "setting gmr_policy caching\n");
  scenario_check(&sc, rt, "caching");

  /* Stream 3 completes: the next allocation reuses b's block; then a is freed
   * and empty_cache gives its small segment back. */
  gmr_sim_stream_complete(rt, s3);
  void *c = alloc_ok(rt, 5 * MiB, NULL);
  is_ptr(c, b, "caching: the 5 MiB block is reused once stream 3 is done");
  is_int(gmr_free(rt, a), 0, "caching: free a");
  is_int(gmr_empty_cache(rt), 0, "caching: empty_cache");
  scenario_open(&sc, "caching2");
  fprintf(sc.ex, "segments 1\n");
  seg_line(sc.ex, c, 20 * MiB, 5 * MiB, 5 * MiB, 5 * MiB, 0, "large", 0, 2);
  block_line(sc.ex, c, 5 * MiB, 5 * MiB, "active_allocated");
  block_line(sc.ex, (char *)c + 5 * MiB, 15 * MiB, 0, "inactive");
  fprintf(sc.ex, "traces 0 12\n");
  fprintf(sc.ex, "count alloc 3\ncount segment_alloc 2\ncount segment_free 1\n");
  fprintf(sc.ex, "count free_requested 2\ncount free_completed 2\ncount snapshot 2\n");
  scenario_check(&sc, rt, "caching after empty_cache");
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* expandable_segments:True (config/pytorch-expandable.yaml): the large pool
 * grows one virtual range by 20 MiB pages.  A snapshot shows one segment per
 * contiguous mapped range, unmapped pages left out (PyTorch §7 numbers:
 * 5 MiB maps one page; 16 MiB more maps a second and starts right after the
 * first 5 MiB). */
static void test_expandable(void) {
  gmr_runtime_t *rt = runtime_if_built("pytorch-expandable.yaml", "expandable");
  if (rt == NULL) return;
  gmr_history_enable(rt, 1000);
  void *a = alloc_ok(rt, 5 * MiB, NULL);
  void *b = alloc_ok(rt, 16 * MiB, NULL);
  is_ptr(b, (char *)a + 5 * MiB, "expandable: 16 MiB starts right after the first 5 MiB");
  scenario_t sc;
  scenario_open(&sc, "expandable");
  fprintf(sc.ex, "segments 1\n");
  seg_line(sc.ex, a, 40 * MiB, 21 * MiB, 21 * MiB, 21 * MiB, 0, "large", 1, 3);
  block_line(sc.ex, a, 5 * MiB, 5 * MiB, "active_allocated");
  block_line(sc.ex, b, 16 * MiB, 16 * MiB, "active_allocated");
  block_line(sc.ex, (char *)b + 16 * MiB, 19 * MiB, 0, "inactive");
  fprintf(sc.ex, "traces 0 5\n");
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(a), 5 * MiB);
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(a) + 20 * MiB, 20 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 16 * MiB);
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 21 * MiB);
  scenario_check(&sc, rt, "expandable");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  /* A hole: two whole pages, the first freed and unmapped by empty_cache: the
   * mapped range is the second page alone; mapping the first again joins them. */
  rt = runtime_if_built("pytorch-expandable.yaml", "expandable hole");
  if (rt == NULL) return;
  gmr_history_enable(rt, 1000);
  a = alloc_ok(rt, 20 * MiB, NULL);
  b = alloc_ok(rt, 20 * MiB, NULL);
  is_ptr(b, (char *)a + 20 * MiB, "expandable hole: the second page follows the first");
  is_int(gmr_free(rt, a), 0, "expandable hole: free the first page's block");
  is_int(gmr_empty_cache(rt), 0, "expandable hole: empty_cache unmaps it");
  scenario_open(&sc, "expandable-hole");
  fprintf(sc.ex, "segments 1\n");
  seg_line(sc.ex, b, 20 * MiB, 20 * MiB, 20 * MiB, 20 * MiB, 0, "large", 1, 1);
  block_line(sc.ex, b, 20 * MiB, 20 * MiB, "active_allocated");
  fprintf(sc.ex, "traces 0 8\n");
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace segment_map %llu %zu 0\n", U(b), 20 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 20 * MiB);
  fprintf(sc.ex, "trace free_requested %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace free_completed %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace segment_unmap %llu %zu 0\n", U(a), 20 * MiB);
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 20 * MiB);
  scenario_check(&sc, rt, "expandable hole");
  void *c = alloc_ok(rt, 20 * MiB, NULL);
  is_ptr(c, a, "expandable hole: the lowest address that fits is mapped again");
  scenario_open(&sc, "expandable-joined");
  fprintf(sc.ex, "segments 1\n");
  seg_line(sc.ex, c, 40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB, 0, "large", 1, 2);
  block_line(sc.ex, c, 20 * MiB, 20 * MiB, "active_allocated");
  block_line(sc.ex, b, 20 * MiB, 20 * MiB, "active_allocated");
  fprintf(sc.ex, "traces 0 11\ncount segment_map 3\ncount segment_unmap 1\n");
  scenario_check(&sc, rt, "expandable joined again");
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* The ring keeps the newest entries; resizing keeps the newest; 0 is off. */
static void test_ring(void) {
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  is_int(gmr_history_enable(rt, 4), 0, "ring: gmr_history_enable(4)");
  void *p[3];
  for (int i = 0; i < 3; ++i)
    p[i] = alloc_ok(rt, (size_t)(i + 1) * 4096, NULL);
  /* 3 x (segment_alloc, alloc) + snapshot = 7 entries: the last 4 stay. */
  scenario_t sc;
  scenario_open(&sc, "ring4");
  fprintf(sc.ex, "segments 3\ntraces 0 4\n");
  fprintf(sc.ex, "trace alloc %llu 8192 0\n", U(p[1]));
  fprintf(sc.ex, "trace segment_alloc %llu 12288 0\n", U(p[2]));
  fprintf(sc.ex, "trace alloc %llu 12288 0\n", U(p[2]));
  fprintf(sc.ex, "trace snapshot 0 24576 0\n");
  fprintf(sc.ex, "setting gmr_history_max_entries 4\nsetting gmr_history_dropped 3\n");
  scenario_check(&sc, rt, "ring of 4");

  /* Shrinking to 2 keeps the 2 newest: alloc p[2] and the first snapshot. */
  is_int(gmr_history_enable(rt, 2), 0, "ring: gmr_history_enable(2)");
  is_int(gmr_free(rt, p[0]), 0, "ring: free p[0]");
  scenario_open(&sc, "ring2");
  fprintf(sc.ex, "segments 2\ntraces 0 2\n");
  fprintf(sc.ex, "trace segment_free %llu 4096 0\n", U(p[0]));
  fprintf(sc.ex, "trace snapshot 0 20480 0\n");
  /* 3 dropped before, 2 by the resize, 3 by the free's entries, 1 by the snapshot */
  fprintf(sc.ex, "setting gmr_history_max_entries 2\nsetting gmr_history_dropped 9\n");
  scenario_check(&sc, rt, "ring shrunk to 2");

  /* Growing keeps everything held, and the new bound applies. */
  is_int(gmr_history_enable(rt, 100), 0, "ring: gmr_history_enable(100)");
  is_int(gmr_free(rt, p[1]), 0, "ring: free p[1]");
  scenario_open(&sc, "ring100");
  fprintf(sc.ex, "segments 1\ntraces 0 6\n");
  fprintf(sc.ex, "trace segment_free %llu 4096 0\n", U(p[0]));
  fprintf(sc.ex, "trace snapshot 0 20480 0\n");
  fprintf(sc.ex, "trace free_requested %llu 8192 0\n", U(p[1]));
  fprintf(sc.ex, "trace free_completed %llu 8192 0\n", U(p[1]));
  fprintf(sc.ex, "trace segment_free %llu 8192 0\n", U(p[1]));
  fprintf(sc.ex, "trace snapshot 0 12288 0\n");
  scenario_check(&sc, rt, "ring grown to 100");

  /* Off: no entries, not even the snapshot's; the segments are still there. */
  is_int(gmr_history_enable(rt, 0), 0, "ring: gmr_history_enable(0) turns recording off");
  void *q = alloc_ok(rt, 512, NULL);
  scenario_open(&sc, "off");
  fprintf(sc.ex, "segments 2\ntraces 0 0\n");
  fprintf(sc.ex, "setting gmr_history_max_entries 0\n");
  scenario_check(&sc, rt, "history off");
  gmr_free(rt, q);
  gmr_free(rt, p[2]);
  gmr_runtime_free(rt);
}

/* The ring itself: wrap-around order, resizing a wrapped ring, and a host
 * allocation failure while growing (the ring keeps what it has and
 * overwrites its oldest entry). */
static int ring_sizes(gmr_history_t *h, uint64_t *sizes, size_t max_n) {
  gmr_hist_entry_t *v = NULL;
  size_t n = 0;
  if (gmr__history_copy(h, &v, &n) != 0) return -1;
  for (size_t i = 0; i < n && i < max_n; ++i)
    sizes[i] = v[i].size;
  gmr__free(v);
  return (int)n;
}

static void test_ring_internals(void) {
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  gmr_backend_t *be = gmr__runtime_backend(rt);
  gmr_history_t *h = NULL;
  is_int(gmr__history_new(be, 4, &h), 0, "ring: a ring of 4");
  for (uint64_t i = 1; i <= 6; ++i)
    gmr__history_record(h, GMR_HIST_ALLOC, 0, i, NULL);
  uint64_t v[2048];
  is_int(ring_sizes(h, v, 2048), 4, "ring: 6 recorded, 4 held");
  ok(v[0] == 3 && v[1] == 4 && v[2] == 5 && v[3] == 6, "ring: the newest 4 in order (3 4 5 6)");
  is_u64(h->dropped, 2, "ring: 2 dropped");
  is_int(gmr__history_resize(h, 3), 0, "ring: shrink a wrapped ring to 3");
  is_int(ring_sizes(h, v, 2048), 3, "ring: 3 held");
  ok(v[0] == 4 && v[1] == 5 && v[2] == 6, "ring: the newest 3 in order (4 5 6)");
  is_int(gmr__history_resize(h, 10), 0, "ring: grow to 10");
  gmr__history_record(h, GMR_HIST_ALLOC, 0, 7, NULL);
  is_int(ring_sizes(h, v, 2048), 4, "ring: 4 held after one more");
  ok(v[0] == 4 && v[3] == 7, "ring: 4 5 6 7");
  is_u64(h->recorded, 7, "ring: 7 recorded in all");
  gmr__history_free(h);

  /* Growing past the first 1024 entries needs host memory; refuse it. */
  is_int(gmr__history_new(be, 5000, &h), 0, "ring: a ring of 5000");
  for (uint64_t i = 0; i < 1024; ++i)
    gmr__history_record(h, GMR_HIST_ALLOC, 0, i, NULL);
  gmr__host_fail_nth(1);
  gmr__history_record(h, GMR_HIST_ALLOC, 0, 1024, NULL);
  gmr__host_fail_nth(0);
  is_int(ring_sizes(h, v, 2048), 1024, "ring: no memory to grow: still 1024 entries");
  ok(v[0] == 1 && v[1023] == 1024, "ring: the oldest was overwritten by the newest");
  is_u64(h->max, 1024, "ring: its bound is now what it holds");
  gmr__history_free(h);
  gmr_runtime_free(rt);
}

/* GMR_HISTORY=N turns recording on for new runtimes; junk is refused. */
static void test_env(void) {
  setenv("GMR_HISTORY", "3", 1);
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  void *a = alloc_ok(rt, 2048, NULL);
  void *b = alloc_ok(rt, 4096, NULL);
  scenario_t sc;
  scenario_open(&sc, "env");
  fprintf(sc.ex, "segments 2\ntraces 0 3\n");
  fprintf(sc.ex, "trace segment_alloc %llu 4096 0\n", U(b));
  fprintf(sc.ex, "trace alloc %llu 4096 0\n", U(b));
  fprintf(sc.ex, "trace snapshot 0 6144 0\n");
  fprintf(sc.ex, "setting gmr_history_max_entries 3\nsetting gmr_history_dropped 2\n");
  scenario_check(&sc, rt, "GMR_HISTORY=3");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  gmr_config_t *cfg = NULL;
  gmr_config_load_string("policy: {name: direct}\n", &cfg, NULL);
  const char *bad[] = {"lots", "-5", "12x", "99999999999999999999999"};
  for (int i = 0; i < 4; ++i) {
    setenv("GMR_HISTORY", bad[i], 1);
    rt = NULL;
    int err = gmr_runtime_new_sim(cfg, NULL, &rt);
    is_int(err, GMR_EINVAL, "GMR_HISTORY=%s is refused", bad[i]);
    like(gmr_last_error(NULL), "GMR_HISTORY=", "GMR_HISTORY=%s: the error names the variable",
         bad[i]);
    ok(rt == NULL, "GMR_HISTORY=%s: the out-parameter is untouched", bad[i]);
    gmr_runtime_free(rt);
  }
  setenv("GMR_HISTORY", "0", 1);
  rt = NULL;
  is_int(gmr_runtime_new_sim(cfg, NULL, &rt), 0, "GMR_HISTORY=0 is off");
  void *p = alloc_ok(rt, 100, NULL);
  scenario_open(&sc, "env0");
  fprintf(sc.ex, "segments 1\ntraces 0 0\nsetting gmr_history_max_entries 0\n");
  scenario_check(&sc, rt, "GMR_HISTORY=0");
  gmr_free(rt, p);
  gmr_runtime_free(rt);
  gmr_config_free(cfg);
  unsetenv("GMR_HISTORY");
}

/* Run the checker on a snapshot some other code wrote. */
static void check_file(scenario_t *sc, const char *label) {
  fclose(sc->ex);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' '%s/tests/snapshot-check.py' '%s' '%s' 2>&1", python,
           tap_srcdir(), sc->snap_path, sc->expect_path);
  FILE *p = popen(cmd, "r");
  char line[4096];
  int lines = 0;
  while (p && fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, "ok ", 3) == 0 || strncmp(line, "not ok ", 7) == 0) {
      ok(line[0] == 'o', "%s: %s", label, line + (line[0] == 'o' ? 3 : 7));
      ++lines;
    } else {
      diag("%s", line);
    }
  }
  int status = p ? pclose(p) : -1;
  ok(status == 0 && lines > 10, "%s: the checker ran %d checks and passed", label, lines);
  remove(sc->snap_path);
  remove(sc->expect_path);
}

/* GMR_SNAPSHOT=path: the snapshot is written when the runtime is freed (live
 * blocks included), then path.1 for the next runtime; and at exit for the
 * process-wide default runtime. */
static void test_snapshot_env(void) {
  char path[520];
  snprintf(path, sizeof path, "%.500s/env-snap", tmpdir);
  setenv("GMR_SNAPSHOT", path, 1);
  setenv("GMR_HISTORY", "50", 1);
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  void *a = alloc_ok(rt, 4096, NULL);
  void *leak = alloc_ok(rt, 8192, GMR_SIM_STREAM(5));
  gmr_free(rt, a);
  gmr_runtime_t *rt2 = new_runtime_file("direct.yaml");
  void *b = alloc_ok(rt2, 100, NULL);
  gmr_runtime_free(rt); /* with `leak` live */
  scenario_t sc;
  scenario_open(&sc, "env-snap-expect");
  snprintf(sc.snap_path, sizeof sc.snap_path, "%s", path);
  fprintf(sc.ex, "segments 1\n");
  fprintf(sc.ex, "segment %llu 8192 8192 8192 8192 5 large 0 1\n", U(leak));
  fprintf(sc.ex, "block %llu 8192 8192 active_allocated\n", U(leak));
  fprintf(sc.ex, "traces 0 8\n");
  fprintf(sc.ex, "count alloc 2\ncount free_completed 1\ncount snapshot 1\n");
  check_file(&sc, "GMR_SNAPSHOT at gmr_runtime_free");
  gmr_free(rt2, b);
  gmr_runtime_free(rt2);
  scenario_open(&sc, "env-snap1-expect");
  snprintf(sc.snap_path, sizeof sc.snap_path, "%s.1", path);
  fprintf(sc.ex, "segments 0\ntraces 0 6\n");
  fprintf(sc.ex, "trace segment_alloc %llu 100 0\ntrace alloc %llu 100 0\n", U(b), U(b));
  check_file(&sc, "GMR_SNAPSHOT of the second runtime: .1");

  /* The default runtime, in a child process, written at exit; the child's
   * runtime is this process's third, so its file is path.2. */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("GMR_SNAPSHOT", path, 1);
    setenv("GMR_CONFIG", "", 1);
    gmr_runtime_t *d = NULL;
    void *p = NULL;
    if (gmr_default_runtime(0, &d) != 0 || gmr_alloc(d, 777, NULL, &p) != 0) _exit(3);
    exit(0); /* atexit handlers run */
  }
  int status = -1;
  waitpid(pid, &status, 0);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "default runtime: the child ran");
  scenario_open(&sc, "env-snap-default");
  snprintf(sc.snap_path, sizeof sc.snap_path, "%s.2", path);
  FILE *f = fopen(sc.snap_path, "rb");
  ok(f != NULL, "default runtime: GMR_SNAPSHOT written at exit");
  if (f) fclose(f);
  fprintf(sc.ex, "segments 1\ntraces 0 3\ncount alloc 1\n");
  check_file(&sc, "GMR_SNAPSHOT of the default runtime");
  unsetenv("GMR_SNAPSHOT");
  unsetenv("GMR_HISTORY");
}

/* ---- call sites as frames (Note [History frames], Note [Snapshot frames]) ---- */

typedef struct frames_blocks_s {
  uint64_t addr[8], size[8];
  int n;
} frames_blocks_t;

static int frames_walk(const gmr_walk_entry_t *e, void *ud) {
  frames_blocks_t *b = ud;
  if (!e->is_segment && e->state == GMR_BLOCK_ALLOCATED && b->n < 8) {
    b->addr[b->n] = e->address;
    b->size[b->n++] = e->size;
  }
  return 0;
}

static void *frames_thread_alloc(void *arg) {
  void *p = NULL;
  gmr_alloc(arg, 4096, NULL, &p);
  return p;
}

/* The frame of the last alloc entry of h (0 when none). */
static uint32_t frames_last_alloc(gmr_history_t *h) {
  gmr_hist_entry_t *v = NULL;
  size_t n = 0;
  uint32_t f = UINT32_MAX;
  if (gmr__history_copy(h, &v, &n) != 0) return f;
  for (size_t i = n; i-- > 0;)
    if (v[i].action == GMR_HIST_ALLOC) {
      f = v[i].frame;
      break;
    }
  gmr__free(v);
  return f;
}

static void test_frames(void) {
  static const char csv[] = "Thread,Time,Action,Pointer,Size,Stream,Site\n"
                            "0,1,allocate,0x1,1048576,0,model.py:10 (embed)\n"
                            "0,2,allocate,0x2,2097152,0,odd-site\n"
                            "0,3,free,0x1,1048576,0\n"
                            "0,4,allocate,0x3,3145728,0\n";
  char err[256] = "";
  gmr_trace_data_t *t = NULL;
  if (gmr_trace_parse(csv, sizeof csv - 1, "frames.csv", &t, err, sizeof err) != 0) {
    printf("Bail out! %s\n", err);
    exit(1);
  }
  /* Without the history the replay names nothing. */
  gmr_runtime_t *rt = new_runtime("policy: {name: direct}\n");
  gmr_replay_result_t *res = calloc(1, sizeof *res);
  if (res == NULL) exit(1);
  is_int(gmr_replay(rt, t, NULL, res), 0, "frames: a replay without the history");
  ok(gmr__runtime_history(rt) == NULL, "frames: ... leaves the history off");
  gmr_runtime_free(rt);

  rt = new_runtime("policy: {name: direct}\n");
  is_int(gmr_history_enable(rt, 1000), 0, "frames: gmr_history_enable(1000)");
  is_int(gmr_replay(rt, t, NULL, res), 0, "frames: the replay of a trace with sites");
  gmr_history_t *h = gmr__runtime_history(rt);
  ok(h != NULL && h->n_frames == 2, "frames: each site of the trace became a frame");
  if (h != NULL && h->n_frames == 2) {
    ok(strcmp(h->frames[0].filename, "model.py") == 0 && h->frames[0].line == 10 &&
           strcmp(h->frames[0].name, "embed") == 0,
       "frames: 'model.py:10 (embed)' is file model.py, line 10, name embed");
    ok(strcmp(h->frames[1].filename, "odd-site") == 0 && h->frames[1].line == 0 &&
           strcmp(h->frames[1].name, "") == 0,
       "frames: a site of another shape is the file name, line 0");
  }
  frames_blocks_t b = {0};
  gmr_walk(rt, frames_walk, &b);
  is_int(b.n, 2, "frames: two blocks live at the end");
  scenario_t sc;
  scenario_open(&sc, "frames");
  /* direct: segment_alloc + alloc per allocation, free_requested +
   * free_completed + segment_free per free, then the snapshot entry. */
  fprintf(sc.ex, "traces 0 10\n");
  fprintf(sc.ex, "entryframe 0 model.py 10 embed\nentryframe 1 model.py 10 embed\n");
  fprintf(sc.ex, "entryframe 2 odd-site 0 -\nentryframe 3 odd-site 0 -\n");
  fprintf(sc.ex, "entryframe 4 model.py 10 embed\nentryframe 5 model.py 10 embed\n");
  fprintf(sc.ex, "entryframe 6 none\nentryframe 7 none\nentryframe 8 none\nentryframe 9 none\n");
  fprintf(sc.ex, "frames alloc 2\nframes free_completed 1\nframes snapshot 0\n");
  for (int i = 0; i < b.n; ++i) {
    const char *f = b.size[i] == 2 * MiB ? "odd-site 0 -" : "none";
    fprintf(sc.ex, "blockframe %llu %s\nsegframe %llu %s\n", (unsigned long long)b.addr[i], f,
            (unsigned long long)b.addr[i], f);
  }
  scenario_check(&sc, rt, "frames");

  /* The frame is the naming thread's, and this history's only. */
  uint32_t id = 0;
  is_int(gmr__history_add_frame(h, "t.py", 7, "step", &id), 0, "frames: add a frame");
  is_int((int)id, 3, "frames: ids go on from the trace's");
  gmr_runtime_t *other = new_runtime("policy: {name: direct}\n");
  gmr_history_enable(other, 100);
  gmr__history_use_frame(h, id);
  void *p = NULL, *q = NULL;
  pthread_t th;
  pthread_create(&th, NULL, frames_thread_alloc, rt);
  pthread_join(th, &q);
  is_int((int)frames_last_alloc(h), 0, "frames: another thread's allocation has none");
  gmr_alloc(rt, 4096, NULL, &p);
  is_int((int)frames_last_alloc(h), (int)id, "frames: the naming thread's has it");
  void *r = NULL;
  gmr_alloc(other, 4096, NULL, &r);
  is_int((int)frames_last_alloc(gmr__runtime_history(other)), 0,
         "frames: an allocation on another runtime has none");
  gmr__history_use_frame(h, 0);
  void *p2 = NULL;
  gmr_alloc(rt, 4096, NULL, &p2);
  is_int((int)frames_last_alloc(h), 0, "frames: none once the thread names none");
  /* Turning the history off and on keeps the frames (ids stay valid). */
  gmr_history_enable(rt, 0);
  gmr_history_enable(rt, 100);
  h = gmr__runtime_history(rt);
  ok(h != NULL && h->n_frames == 3, "frames: kept while the history is off");
  gmr_free(rt, p);
  gmr_free(rt, p2);
  gmr_free(rt, q);
  gmr_free(other, r);
  gmr_runtime_free(other);
  gmr_runtime_free(rt);
  gmr_trace_data_free(t);

  /* The shapes of a site's text. */
  static const char shapes[] = "Thread,Time,Action,Pointer,Size,Stream,Site\n"
                               "0,1,allocate,0x1,512,0,x.py:7\n"
                               "0,2,allocate,0x2,512,0,C:/w/m.py:3 (f (g))\n"
                               "0,3,allocate,0x3,512,0,a:b (c)\n"
                               "0,4,allocate,0x4,512,0,m.py:99999999999 (big)\n"
                               "0,5,allocate,0x5,512,0,:5 (nofile)\n";
  static const struct {
    const char *file, *name;
    uint32_t line;
  } want[] = {{"x.py", "", 7},
              {"C:/w/m.py", "f (g)", 3},
              {"a:b (c)", "", 0},
              {"m.py:99999999999 (big)", "", 0},
              {":5 (nofile)", "", 0}};
  if (gmr_trace_parse(shapes, sizeof shapes - 1, "shapes.csv", &t, err, sizeof err) != 0) {
    printf("Bail out! %s\n", err);
    exit(1);
  }
  rt = new_runtime("policy: {name: direct}\n");
  gmr_history_enable(rt, 100);
  is_int(gmr_replay(rt, t, NULL, res), 0, "frames: the replay of sites of every shape");
  h = gmr__runtime_history(rt);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) {
    const gmr_hist_frame_t *f = h && i < h->n_frames ? &h->frames[i] : NULL;
    ok(f && strcmp(f->filename, want[i].file) == 0 && strcmp(f->name, want[i].name) == 0 &&
           f->line == want[i].line,
       "frames: site %zu is file '%s', line %u, name '%s'", i + 1, want[i].file,
       (unsigned)want[i].line, want[i].name);
  }
  gmr_runtime_free(rt);
  free(res);
  gmr_trace_data_free(t);
}

static void test_bad_input(void) {
  gmr_runtime_t *rt = new_runtime_file("direct.yaml");
  is_int(gmr_snapshot_write(NULL, stdout), GMR_EINVAL, "gmr_snapshot_write(NULL, f)");
  is_int(gmr_snapshot_write(rt, NULL), GMR_EINVAL, "gmr_snapshot_write(rt, NULL)");
  like(gmr_last_error(rt), "output file", "the error names the NULL file");
  is_int(gmr_history_enable(NULL, 10), GMR_EINVAL, "gmr_history_enable(NULL, 10)");
  FILE *full = fopen("/dev/full", "wb");
  if (full != NULL) {
    void *p = alloc_ok(rt, 4096, NULL);
    is_int(gmr_snapshot_write(rt, full), GMR_EIO, "a snapshot to a full device is GMR_EIO");
    like(gmr_last_error(rt), "failed", "the error says the write failed");
    fclose(full);
    gmr_free(rt, p);
  }
  gmr_runtime_free(rt);
}

/* ---- a policy that reports free_completed itself ------------------------------ */

/* `deferred`: one reservation per allocation, like direct, but a freed block
 * stays pending until the next allocation, which completes every pending free
 * (gmr__history_free_completed) and releases it: PyTorch's free of a block
 * with recorded streams, in miniature. */
typedef struct deferred_rec_s {
  void *ptr;
  size_t size, requested;
  gmr_stream_t stream;
  bool pending;
} deferred_rec_t;

static const gmr_policy_ops_t deferred_ops;

typedef struct deferred_s {
  gmr_policy_t base;
  deferred_rec_t rec[16];
  int n;
} deferred_t;

static int deferred_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *up,
                           gmr_policy_t **out) {
  deferred_t *d = calloc(1, sizeof *d);
  if (d == NULL) return GMR_ENOMEM;
  d->base.ops = &deferred_ops;
  d->base.backend = be;
  *out = &d->base;
  return 0;
}

static void deferred_destroy(gmr_policy_t *self) {
  deferred_t *d = (deferred_t *)self;
  for (int i = 0; i < d->n; ++i)
    gmr__backend_release(self->backend, d->rec[i].ptr, d->rec[i].size, NULL);
  free(d);
}

static int deferred_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  deferred_t *d = (deferred_t *)self;
  for (int i = 0; i < d->n;) {
    deferred_rec_t *r = &d->rec[i];
    if (!r->pending) {
      ++i;
      continue;
    }
    gmr__history_free_completed(self->backend, r->ptr, r->requested, r->stream);
    gmr__backend_release(self->backend, r->ptr, r->size, s);
    *r = d->rec[--d->n];
  }
  if (d->n == 16) return GMR_ENOMEM;
  void *p;
  int err = gmr__backend_reserve(self->backend, size, s, &p);
  if (err != 0) return err;
  d->rec[d->n++] = (deferred_rec_t){p, size, 0, s, false};
  *out = (gmr_block_t){.ptr = p, .size = size, .handle = &d->rec[d->n - 1]};
  return 0;
}

static int deferred_free(gmr_policy_t *self, const gmr_block_t *blk) {
  deferred_t *d = (deferred_t *)self;
  for (int i = 0; i < d->n; ++i)
    if (d->rec[i].ptr == blk->ptr) {
      d->rec[i].pending = true;
      d->rec[i].requested = blk->requested;
    }
  return 0;
}

static void deferred_stats(gmr_policy_t *self, gmr_stats_t *st) {
  deferred_t *d = (deferred_t *)self;
  for (int i = 0; i < d->n; ++i)
    st->active_bytes += d->rec[i].size;
}

static int deferred_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  deferred_t *d = (deferred_t *)self;
  for (int i = 0; i < d->n; ++i) { /* the test keeps them in address order */
    deferred_rec_t *r = &d->rec[i];
    gmr_walk_entry_t seg = {.is_segment = 1,
                            .address = (uintptr_t)r->ptr,
                            .size = r->size,
                            .stream = r->stream,
                            .pool = "large"};
    gmr_walk_entry_t blk = seg;
    blk.is_segment = 0;
    blk.requested = r->size;
    blk.state = r->pending ? GMR_BLOCK_PENDING_FREE : GMR_BLOCK_ALLOCATED;
    if (cb(&seg, ud) || cb(&blk, ud)) break;
  }
  return 0;
}

static const gmr_opt_desc_t deferred_opts[] = {{.key = NULL}};
static const gmr_policy_ops_t deferred_ops = {
    .name = "deferred",
    .opts_desc = deferred_opts,
    .reports_free_completed = true,
    .create = deferred_create,
    .destroy = deferred_destroy,
    .alloc = deferred_alloc,
    .free = deferred_free,
    .stats = deferred_stats,
    .walk = deferred_walk,
};

/* `yaml` names direct as the innermost policy; it is replaced by deferred. */
static void test_hook(const char *yaml, const char *label) {
  gmr_config_t *cfg = NULL;
  if (gmr_config_load_string(yaml, &cfg, NULL) != 0) {
    printf("Bail out! %s: config\n", label);
    exit(1);
  }
  gmr_policy_cfg_t *pc = cfg->policy;
  while (pc->upstream)
    pc = pc->upstream;
  pc->ops = &deferred_ops;
  gmr_runtime_t *rt = NULL;
  is_int(gmr_runtime_new_sim(cfg, NULL, &rt), 0, "%s: a runtime around the deferred policy", label);
  gmr_config_free(cfg);
  if (rt == NULL) return;
  is_int(gmr_history_enable(rt, 100), 0, "%s: gmr_history_enable", label);
  void *a = alloc_ok(rt, 1000, GMR_SIM_STREAM(4));
  void *b = alloc_ok(rt, 2 * MiB, NULL);
  is_int(gmr_free(rt, a), 0, "%s: free a", label);
  /* a is pending: free_requested only, and the block is active_pending_free. */
  scenario_t sc;
  scenario_open(&sc, "hook1");
  fprintf(sc.ex, "segments 2\n");
  fprintf(sc.ex, "segment %llu 1000 0 1000 1000 4 large 0 1\n", U(a));
  fprintf(sc.ex, "block %llu 1000 1000 active_pending_free\n", U(a));
  fprintf(sc.ex, "segment %llu %zu %zu %zu %zu 0 large 0 1\n", U(b), 2 * MiB, 2 * MiB, 2 * MiB,
          2 * MiB);
  fprintf(sc.ex, "block %llu %zu %zu active_allocated\n", U(b), 2 * MiB, 2 * MiB);
  fprintf(sc.ex, "traces 0 6\n");
  fprintf(sc.ex, "trace segment_alloc %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace alloc %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(b), 2 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 2 * MiB);
  fprintf(sc.ex, "trace free_requested %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 2 * MiB + 1000);
  fprintf(sc.ex, "count free_completed 0\n");
  scenario_check(&sc, rt, label);
  /* The next allocation completes it: free_completed from the policy, once. */
  void *c = alloc_ok(rt, 3000, NULL);
  scenario_open(&sc, "hook2");
  fprintf(sc.ex, "traces 0 11\n");
  fprintf(sc.ex, "trace segment_alloc %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace alloc %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu %zu 0\n", U(b), 2 * MiB);
  fprintf(sc.ex, "trace alloc %llu %zu 0\n", U(b), 2 * MiB);
  fprintf(sc.ex, "trace free_requested %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 2 * MiB + 1000);
  fprintf(sc.ex, "trace free_completed %llu 1000 4\n", U(a));
  fprintf(sc.ex, "trace segment_free %llu 1000 0\n", U(a));
  fprintf(sc.ex, "trace segment_alloc %llu 3000 0\n", U(c));
  fprintf(sc.ex, "trace alloc %llu 3000 0\n", U(c));
  fprintf(sc.ex, "trace snapshot 0 %zu 0\n", 2 * MiB + 3000);
  scenario_check(&sc, rt, label);
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* ---- threads: the history stays consistent under concurrent use ------------- */

#define T_THREADS 4
#define T_ITERS   1500

typedef struct worker_s {
  gmr_runtime_t *rt;
  unsigned seed;
  int failures;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  void *held[8] = {0};
  for (int i = 0; i < T_ITERS; ++i) {
    int k = (int)(rand_r(&w->seed) % 8);
    if (held[k] == NULL) {
      size_t size = 1 + rand_r(&w->seed) % (64 * 1024);
      gmr_stream_t s = GMR_SIM_STREAM(rand_r(&w->seed) % 3);
      if (gmr_alloc(w->rt, size, s, &held[k]) != 0) ++w->failures;
    } else {
      if (gmr_free(w->rt, held[k]) != 0) ++w->failures;
      held[k] = NULL;
    }
  }
  for (int k = 0; k < 8; ++k)
    if (held[k] && gmr_free(w->rt, held[k]) != 0) ++w->failures;
  return NULL;
}

static void test_threads(const char *yaml, const char *label) {
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  if (gmr_config_load_string(yaml, &cfg, &cerr) != 0) {
    skip("%s: %s", label, cerr.message);
    return;
  }
  gmr_config_free(cfg);
  gmr_runtime_t *rt = new_runtime(yaml);
  bool direct = strstr(yaml, "direct") != NULL;
  is_int(gmr_history_enable(rt, (size_t)1 << 20), 0, "%s: gmr_history_enable", label);
  unsigned seed = (unsigned)getpid();
  diag("%s: seed %u", label, seed);
  pthread_t th[T_THREADS];
  worker_t w[T_THREADS];
  for (int i = 0; i < T_THREADS; ++i) {
    w[i] = (worker_t){rt, seed + (unsigned)i, 0};
    pthread_create(&th[i], NULL, worker, &w[i]);
  }
  int failures = 0;
  for (int i = 0; i < T_THREADS; ++i) {
    pthread_join(th[i], NULL);
    failures += w[i].failures;
  }
  is_int(failures, 0, "%s: every allocation and free succeeded", label);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  scenario_t sc;
  scenario_open(&sc, "threads");
  /* direct: each allocation is segment_alloc + alloc, each free
   * free_requested + free_completed + segment_free; all were freed.  A
   * caching policy keeps its segments: only the allocations are counted. */
  unsigned long long n = st.num_allocs;
  if (direct) {
    fprintf(sc.ex, "segments 0\ntraces 0 %llu\n", 5 * n + 1);
    fprintf(sc.ex, "count segment_alloc %llu\ncount segment_free %llu\n", n, n);
  } else {
    fprintf(sc.ex, "traces 0 -1\n");
  }
  fprintf(sc.ex, "count alloc %llu\ncount free_requested %llu\n", n, n);
  fprintf(sc.ex, "count free_completed %llu\ncount snapshot 1\n", n);
  fprintf(sc.ex, "setting gmr_history_dropped 0\n");
  scenario_check(&sc, rt, label);
  gmr_runtime_free(rt);
}

int main(void) {
  python = getenv("PYTHON3");
  if (python == NULL || *python == '\0') python = "python3";
  char probe[600];
  snprintf(probe, sizeof probe, "'%s' -c 'import pickle, pickletools' >/dev/null 2>&1", python);
  if (system(probe) != 0) skip_all("python3 is not available to read the snapshots");
  const char *t = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/gmr-snapshot-XXXXXX", t && *t ? t : "/tmp");
  if (mkdtemp(tmpdir) == NULL) {
    printf("Bail out! mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  unsetenv("GMR_HISTORY");

  test_direct();
  test_limit("reserved");
  test_limit("allocated");
  test_bfc();
  test_caching();
  test_expandable();
  test_hook("policy: {name: direct}\n", "hook");
  test_hook("policy: {name: direct}\nlimit: {bytes: 1GiB, counts: reserved}\n",
            "hook under limit(reserved)");
  test_ring();
  test_ring_internals();
  test_env();
  test_snapshot_env();
  test_bad_input();
  test_frames();
  test_threads("policy: {name: direct}\n", "threads direct");
  test_threads("policy: {name: direct}\nlimit: {bytes: 1GiB, counts: reserved}\n",
               "threads limit(direct)");
  test_threads("policy: {name: caching}\n", "threads caching");
  test_threads("policy: {name: caching, expandable_segments: true}\n",
               "threads caching expandable");
  test_threads("policy: {name: bfc, allow_growth: true}\n", "threads bfc");

  if (getenv("GMR_KEEP") == NULL) rmdir(tmpdir);
  return done_testing();
}
