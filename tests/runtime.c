/* runtime.c: tests of the public interface on the simulator: arguments,
 * bad pointers, size 0 and absurd sizes, statistics and their resets, the
 * per-thread and per-runtime last error, introspection, the default
 * runtime, and freeing a runtime with live allocations. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "sim-runtime.h"
#include "tap.h"

#define MiB (1ull << 20)

static gmr_runtime_t *new_rt(const char *yaml) {
  return sim_runtime(yaml, 1ull << 30, 0);
}

static int logged;
static char last_log[1024];
static void log_cb(gmr_log_level_t level, const char *msg, void *ud) {
  (void)level, (void)ud;
  ++logged;
  snprintf(last_log, sizeof last_log, "%s", msg);
}

static void *other_thread(void *arg) {
  gmr_runtime_t *rt = arg;
  return (void *)(uintptr_t)(gmr_last_error(rt)[0] == '\0');
}

/* The length of a snapshot of rt, -1 when it cannot be written. */
static long snapshot_len(gmr_runtime_t *rt) {
  FILE *f = tmpfile();
  if (f == NULL || gmr_snapshot_write(rt, f) != 0) return -1;
  long n = ftell(f);
  fclose(f);
  return n;
}

static int count_cb(const gmr_walk_entry_t *e, void *ud) {
  ((int *)ud)[e->is_segment ? 0 : 1]++;
  return 0;
}

int main(void) {
  gmr_runtime_t *rt = new_rt("policy: direct\n");
  ok(rt != NULL, "a runtime on the simulator");
  is_str(gmr_runtime_backend(rt), "sim", "its backend is the simulator");
  is_str(gmr_runtime_policy(rt), "direct", "its policy is direct");

  void *p = (void *)0x1, *q;
  is_int(gmr_alloc(rt, 0, NULL, &p), GMR_EINVAL, "size 0 is GMR_EINVAL");
  is_ptr(p, (void *)0x1, "  and the out-parameter is untouched");
  like(gmr_last_error(rt), "size 0", "  the last error says why");
  is_int(gmr_alloc(rt, SIZE_MAX, NULL, &p), GMR_ENOMEM, "SIZE_MAX is GMR_ENOMEM");
  like(gmr_last_error(rt), "more than 1EB", "  as PyTorch says it");
  is_int(gmr_alloc(rt, SIZE_MAX / 2 + 1, NULL, &p), GMR_ENOMEM, "SIZE_MAX/2+1 is GMR_ENOMEM");
  is_int(gmr_alloc(rt, 2ull << 30, NULL, &p), GMR_ENOMEM, "more than the device is GMR_ENOMEM");
  like(gmr_last_error(rt), "Tried to allocate 2.00 GiB", "  naming the request");
  is_int(gmr_alloc(NULL, 1, NULL, &p), GMR_EINVAL, "a NULL runtime is GMR_EINVAL");
  is_int(gmr_alloc(rt, 1, NULL, NULL), GMR_EINVAL, "a NULL out-parameter is GMR_EINVAL");

  pthread_t th;
  void *clean;
  pthread_create(&th, NULL, other_thread, rt);
  pthread_join(th, &clean);
  ok(clean != NULL, "the last error is per thread: another thread sees none");
  gmr_runtime_t *rt2 = new_rt("policy: direct\n");
  is_str(gmr_last_error(rt2), "", "and per runtime: a second runtime shows none");

  is_int(gmr_alloc(rt, 1000, NULL, &p), 0, "allocate 1000 bytes");
  is_int(gmr_alloc(rt, 3 * MiB, NULL, &q), 0, "allocate 3 MiB");
  size_t req, got;
  is_int(gmr_alloc_size(rt, q, &req, &got), 0, "its sizes are known");
  ok(req == 3 * MiB && got == 3 * MiB, "  requested and allocated 3 MiB");

  /* Bad pointers change nothing. */
  gmr_stats_t before, after;
  gmr_stats(rt, &before);
  is_int(gmr_free(rt, (char *)p + 8), GMR_EBADPTR, "an interior pointer is GMR_EBADPTR");
  like(gmr_last_error(rt), "was not allocated by this runtime", "  with a sentence");
  is_int(gmr_free(rt, (void *)0xdeadbeef000), GMR_EBADPTR, "a foreign pointer is GMR_EBADPTR");
  is_int(gmr_free(rt2, p), GMR_EBADPTR, "another runtime's pointer is GMR_EBADPTR");
  is_int(gmr_record_stream(rt, (void *)0x1234, NULL), GMR_EBADPTR,
         "record_stream of a foreign pointer is GMR_EBADPTR");
  gmr_stats(rt, &after);
  ok(memcmp(&before, &after, sizeof before) == 0, "the statistics did not move");
  is_int(gmr_free(rt, NULL), 0, "freeing NULL is a no-op");
  is_int(gmr_free(rt, p), 0, "free the 1000 bytes");
  is_int(gmr_free(rt, p), GMR_EBADPTR, "a double free is GMR_EBADPTR");
  is_int(gmr_check(rt), 0, "the invariants hold after all that");

  gmr_stats(rt, &after);
  is_u64(after.allocated_bytes, 3 * MiB, "allocated = 3 MiB");
  is_u64(after.peak_allocated_bytes, 3 * MiB + 1000, "peak allocated = 3 MiB + 1000");
  is_u64(after.reserved_bytes, 3 * MiB, "reserved = 3 MiB (direct)");
  is_u64(after.num_allocs, 2, "two allocations");
  is_u64(after.num_frees, 1, "one free");
  is_u64(after.device_allocs, 2, "two device reservations");
  is_u64(after.ooms, 1, "one OOM (the 2 GiB request)");
  gmr_stats_reset_peak(rt);
  gmr_stats(rt, &after);
  is_u64(after.peak_allocated_bytes, 3 * MiB, "reset_peak: peak = current");
  is_u64(after.peak_reserved_bytes, 3 * MiB, "  for reserved too");
  gmr_stats_reset_accumulated(rt);
  gmr_stats(rt, &after);
  ok(after.num_allocs == 0 && after.device_allocs == 0 && after.ooms == 0,
     "reset_accumulated zeroes the counters");
  is_u64(after.allocated_bytes, 3 * MiB, "  and leaves current values");

  int64_t v = 0;
  is_int(gmr_stat_get(rt, "allocated_bytes", &v), 0, "a common statistic by name");
  is_int(v, 3 * MiB, "  = 3 MiB");
  is_int(gmr_stat_get(rt, "no.such.stat", &v), GMR_EINVAL, "an unknown name is GMR_EINVAL");

  int counts[2] = {0, 0};
  is_int(gmr_walk(rt, count_cb, counts), 0, "walk the segments");
  ok(counts[0] == 1 && counts[1] == 1, "  one segment holding one block");

  FILE *out = tmpfile();
  is_int(gmr_summary(rt, out), 0, "a summary is printed");
  rewind(out);
  char text[4096];
  text[fread(text, 1, sizeof text - 1, out)] = '\0';
  fclose(out);
  like(text, "policy direct on sim", "  naming the policy and the device");

  size_t f, t;
  is_int(gmr_mem_info(rt, &f, &t), 0, "mem_info");
  ok(t == 1ull << 30 && f == t - 3 * MiB, "  reports the simulated device");

  /* Freeing a runtime with live allocations: reported, no crash. */
  gmr_set_log(log_cb, NULL);
  gmr_runtime_free(rt);
  is_int(logged, 1, "freeing a runtime with a live allocation is reported");
  like(last_log, "1 live allocation", "  counting it");
  gmr_set_log(NULL, NULL);
  gmr_runtime_free(rt2);
  gmr_runtime_free(NULL);
  ok(1, "gmr_runtime_free(NULL) is a no-op");

  /* Simulator controls refuse non-simulated runtimes only. */
  is_int(gmr_sim_fail_all(NULL, 1), GMR_EINVAL, "sim controls need a runtime");

  /* The default runtime comes from GMR_CONFIG. */
  setenv("GMR_CONFIG", "/nonexistent.yaml", 1);
  gmr_runtime_t *def = NULL;
  is_int(gmr_default_runtime(0, &def), GMR_EIO, "a missing GMR_CONFIG file is reported");
  char path[4096];
  snprintf(path, sizeof path, "%s/config/direct.yaml", tap_srcdir());
  setenv("GMR_CONFIG", path, 1);
  is_int(gmr_default_runtime(0, &def), 0, "the default runtime loads GMR_CONFIG");
  gmr_runtime_t *def2 = NULL;
  gmr_default_runtime(0, &def2);
  is_ptr(def2, def, "  and is created once");
  is_int(gmr_default_runtime(-1, &def), GMR_EINVAL, "a negative device is refused");

  /* Why gmr_runtime_new failed, through the public API. */
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  is_int(gmr_config_load_string("policy: direct\n", &cfg, &cerr), 0, "a configuration");
  gmr_runtime_t *none = NULL;
  is_int(gmr_runtime_new(cfg, -3, &none), GMR_EINVAL, "gmr_runtime_new refuses device -3");
  like(gmr_thread_last_error(), "the device ordinal is negative",
       "  gmr_thread_last_error says why");
  like(gmr_last_error(NULL), "the device ordinal is negative",
       "  and so does gmr_last_error(NULL)");
  gmr_config_free(cfg);

  /* The backend probe: every feature of the simulator works, and the probe
   * leaves no trace in the runtime's statistics or history. */
  gmr_runtime_t *pr = new_rt("policy: direct\n");
  is_int(gmr_history_enable(pr, 100), 0, "probe: history on");
  long len0 = snapshot_len(pr);
  gmr_backend_probe_t bp;
  memset(&bp, 0xff, sizeof bp);
  is_int(gmr_backend_probe(pr, &bp), 0, "gmr_backend_probe on the simulator");
  is_u64(bp.granularity, 2 * MiB, "  granularity 2 MiB");
  is_int(bp.reserve_err, 0, "  reserve/release works");
  ok(bp.reserve_us >= 0, "  and was timed");
  is_int(bp.vmm_err, 0, "  VMM map/unmap works");
  is_u64(bp.vmm_span, 64 * MiB, "  in a range of 32 granules");
  is_int(bp.event_err, 0, "  events can be recorded");
  is_int(bp.event_sync_err, 0, "  synchronized");
  is_int(bp.event_query_err, 0, "  and queried");
  gmr_stats_t pst;
  gmr_stats(pr, &pst);
  is_u64(pst.peak_reserved_bytes + pst.device_allocs + pst.device_frees, 0,
         "  the runtime's device counters did not move");
  /* Each snapshot adds one entry of the same length: one snapshot entry
   * between the first two files means the probe recorded nothing. */
  long len1 = snapshot_len(pr), len2 = snapshot_len(pr);
  ok(len0 > 0 && len1 - len0 == len2 - len1,
     "  the history holds no entry of the probe (%ld, %ld, %ld bytes)", len0, len1, len2);
  is_int(gmr_backend_probe(NULL, &bp), GMR_EINVAL, "gmr_backend_probe(NULL) is refused");
  gmr_runtime_free(pr);
  return done_testing();
}
