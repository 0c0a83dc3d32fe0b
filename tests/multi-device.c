/* multi-device.c: two simulated devices in one process, a runtime each.
 *
 * Simulated device d hands out addresses from its own window
 * [0x7f0000000000 + d x 2^58, ... + 2^58), so pointers of two devices never
 * collide (as under CUDA's unified addressing), and device 0's addresses are
 * exactly gmr_runtime_new_sim's.  Checked here: the windows; both runtimes
 * driven in parallel threads (each thread also tries to free its pointers
 * through the other device's runtime, which must be GMR_EBADPTR); a cross-
 * device free changes nothing (stats, summary, gmr_check of both); stats stay
 * per device; gmr_default_runtime(0) and (1) are distinct runtimes on
 * distinct windows; and the PyTorch and CuPy hooks route each device to its
 * own runtime and refuse a free with the wrong device.
 *
 * GMR_MULTIDEV_OPS: operations per thread (default 4000).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"
#include "gmr_hooks.h"
#include "sim-runtime.h"
#include "tap.h"

#define WINDOW_BASE   ((uintptr_t)0x7f0000000000ull)
#define WINDOW_STRIDE ((uintptr_t)1 << 58)
#define MAX_LIVE      64

static int in_window(void *p, int device) {
  uintptr_t lo = WINDOW_BASE + (uintptr_t)device * WINDOW_STRIDE;
  return (uintptr_t)p >= lo && (uintptr_t)p - lo < WINDOW_STRIDE;
}

static gmr_runtime_t *device_rt(const char *yaml, int device) {
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  if (gmr_config_load_string(yaml, &cfg, &cerr) != 0) {
    diag("config: %s", cerr.message);
    return NULL;
  }
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new(cfg, device, &rt);
  gmr_config_free(cfg);
  if (rc != 0) diag("runtime on device %d: %s", device, gmr_last_error(NULL));
  return rt;
}

/* Does a cross-device free leave `rt` as it was?  Compares stats and summary
 * taken before (`st`, `sum`) with now, and runs gmr_check. */
static int unchanged(gmr_runtime_t *rt, const gmr_stats_t *st, const char *sum) {
  gmr_stats_t now;
  char *s = summary_string(rt);
  int same = gmr_stats(rt, &now) == 0 && memcmp(&now, st, sizeof now) == 0 && s != NULL &&
             strcmp(s, sum) == 0 && gmr_check(rt) == 0;
  free(s);
  return same;
}

/* ---- both devices driven in parallel ------------------------------------------- */

typedef struct {
  gmr_runtime_t *own, *other;
  int device;
  size_t ops;
  /* results, checked by the main thread (TAP is not thread-safe) */
  size_t allocs, outside_window, cross_not_refused, errors;
  int check;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  void *live[MAX_LIVE] = {0};
  uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(w->device + 1);
  for (size_t i = 0; i < w->ops; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t slot = (size_t)(x % MAX_LIVE);
    if (live[slot] != NULL) {
      if (x & 0x100) { /* the other device's runtime must refuse it */
        if (gmr_free(w->other, live[slot]) != GMR_EBADPTR) ++w->cross_not_refused;
      }
      if (gmr_free(w->own, live[slot]) != 0) ++w->errors;
      live[slot] = NULL;
    } else {
      /* 512 B to 8 MiB: small and large pools of the caching policy. */
      size_t size = (size_t)512 << ((x >> 20) % 15);
      size += (size_t)((x >> 40) % 4096);
      gmr_stream_t s = GMR_SIM_STREAM((x >> 8) % 3);
      if (gmr_alloc(w->own, size, s, &live[slot]) != 0) {
        ++w->errors;
        live[slot] = NULL;
        continue;
      }
      ++w->allocs;
      if (!in_window(live[slot], w->device)) ++w->outside_window;
    }
  }
  for (size_t i = 0; i < MAX_LIVE; ++i)
    if (live[i] != NULL && gmr_free(w->own, live[i]) != 0) ++w->errors;
  w->check = gmr_check(w->own);
  return NULL;
}

static void parallel(const char *yaml, const char *name) {
  gmr_runtime_t *rt[2] = {device_rt(yaml, 0), device_rt(yaml, 1)};
  if (rt[0] == NULL || rt[1] == NULL) {
    ok(0, "%s: two runtimes", name);
    gmr_runtime_free(rt[0]);
    gmr_runtime_free(rt[1]);
    return;
  }
  const char *env = getenv("GMR_MULTIDEV_OPS");
  size_t ops = env ? strtoull(env, NULL, 10) : 4000;
  worker_t w[2];
  pthread_t th[2];
  for (int d = 0; d < 2; ++d) {
    w[d] = (worker_t){.own = rt[d], .other = rt[1 - d], .device = d, .ops = ops};
    pthread_create(&th[d], NULL, worker, &w[d]);
  }
  for (int d = 0; d < 2; ++d)
    pthread_join(th[d], NULL);
  for (int d = 0; d < 2; ++d) {
    ok(w[d].allocs > ops / 4 && w[d].errors == 0, "%s: device %d: %zu allocations, no error", name,
       d, w[d].allocs);
    is_u64(w[d].outside_window, 0, "%s: device %d: every pointer in its own window", name, d);
    is_u64(w[d].cross_not_refused, 0,
           "%s: device %d: every free through the other device's runtime is GMR_EBADPTR", name, d);
    is_int(w[d].check, 0, "%s: device %d: gmr_check after the run", name, d);
    gmr_stats_t st;
    gmr_stats(rt[d], &st);
    ok(st.allocations == 0 && st.num_allocs == w[d].allocs && st.num_frees == w[d].allocs,
       "%s: device %d: its stats count its own %zu allocations and frees only", name, d,
       w[d].allocs);
  }
  gmr_runtime_free(rt[0]);
  gmr_runtime_free(rt[1]);
}

/* ---- the log, for the hooks' refusals ----------------------------------------- */

static char last_log[4096];
static int n_log;
static void capture_log(gmr_log_level_t level, const char *msg, void *ud) {
  (void)level, (void)ud;
  snprintf(last_log, sizeof last_log, "%s", msg);
  ++n_log;
}

int main(void) {
  const char *caching = "policy: caching\ndevice: {backend: sim, capacity: 4GiB}\n";

  /* ---- windows ---- */
  gmr_runtime_t *sim = sim_runtime(caching, 0, 0);
  gmr_runtime_t *d0 = device_rt(caching, 0), *d1 = device_rt(caching, 1);
  ok(sim && d0 && d1, "runtimes on gmr_runtime_new_sim, device 0 and device 1");
  if (!sim || !d0 || !d1) return done_testing();
  void *ps = NULL, *p0 = NULL, *p1 = NULL;
  gmr_alloc(sim, 3 << 20, NULL, &ps);
  gmr_alloc(d0, 3 << 20, NULL, &p0);
  gmr_alloc(d1, 3 << 20, NULL, &p1);
  is_ptr(ps, (void *)WINDOW_BASE, "gmr_runtime_new_sim's first block is at 0x7f0000000000");
  is_ptr(p0, ps, "device 0 hands out the same address (replays rely on it)");
  is_ptr(p1, (void *)(WINDOW_BASE + WINDOW_STRIDE), "device 1's first block is 2^58 higher");
  is_str(gmr_runtime_backend(d1), "sim", "device 1 is simulated");
  gmr_runtime_free(sim);

  gmr_runtime_t *bad = device_rt(caching, 31);
  ok(bad == NULL, "simulated device 31 is refused");
  like(gmr_last_error(NULL), "ordinal 31 is out of range", "  with the reason");
  gmr_runtime_free(bad);
  gmr_runtime_t *d30 = device_rt(caching, 30);
  void *p30 = NULL;
  is_int(d30 ? gmr_alloc(d30, 1 << 20, NULL, &p30) : -1, 0, "simulated device 30 allocates");
  ok(in_window(p30, 30) && (intptr_t)p30 > 0, "  in its window, below 2^63");
  gmr_runtime_free(d30); /* reports the live block through the (silent) log */

  /* ---- a cross-device free changes nothing ---- */
  void *q1 = NULL;
  gmr_alloc(d1, 1000, GMR_SIM_STREAM(1), &q1);
  gmr_stats_t st0, st1;
  gmr_stats(d0, &st0);
  gmr_stats(d1, &st1);
  ok(st0.allocated_bytes == (3 << 20) && st1.allocated_bytes == (3 << 20) + 1024,
     "stats are per device (device 0: 3 MiB, device 1: 3 MiB + 1 KiB)");
  char *sum0 = summary_string(d0), *sum1 = summary_string(d1);
  ok(sum0 && sum1 && strcmp(sum0, sum1) != 0, "summaries are per device");
  is_int(gmr_free(d1, p0), GMR_EBADPTR, "device 0's pointer freed through device 1: GMR_EBADPTR");
  like(gmr_last_error(d1), "was not allocated by this runtime", "  with the reason");
  is_int(gmr_free(d0, q1), GMR_EBADPTR, "device 1's pointer freed through device 0: GMR_EBADPTR");
  is_int(gmr_record_stream(d0, p1, GMR_SIM_STREAM(2)), GMR_EBADPTR,
         "device 1's pointer recorded on device 0's runtime: GMR_EBADPTR");
  ok(unchanged(d0, &st0, sum0), "device 0: stats, summary and gmr_check unchanged");
  ok(unchanged(d1, &st1, sum1), "device 1: stats, summary and gmr_check unchanged");
  is_int(gmr_free(d0, p0), 0, "device 0's pointer frees through its own runtime");
  is_int(gmr_free(d1, p1), 0, "device 1's pointer frees through its own runtime");
  is_int(gmr_free(d1, q1), 0, "  and so does its second one");
  is_int(gmr_free(d1, p1), GMR_EBADPTR, "  a second free is GMR_EBADPTR");
  gmr_stats(d0, &st0);
  gmr_stats(d1, &st1);
  ok(st0.allocations == 0 && st0.num_frees == 1 && st1.allocations == 0 && st1.num_frees == 2,
     "each device counts its own frees only");
  free(sum0);
  free(sum1);
  gmr_runtime_free(d0);
  gmr_runtime_free(d1);

  /* ---- both devices in parallel threads ---- */
  parallel(caching, "caching");
  parallel("policy: bfc\ndevice: {backend: sim, capacity: 4GiB}\n", "bfc");
  parallel("policy: caching\nlimit: {bytes: 2GiB}\ndevice: {backend: sim, capacity: 4GiB}\n",
           "limit(caching)");

  /* ---- the default runtimes and the framework hooks ---- */
  char dir[] = "/tmp/gmr-multidev-XXXXXX";
  if (mkdtemp(dir) == NULL) return ok(0, "a temporary directory"), done_testing();
  char path[sizeof dir + 32];
  snprintf(path, sizeof path, "%s/sim.yaml", dir);
  FILE *f = fopen(path, "w");
  if (f != NULL) {
    fputs(caching, f);
    fclose(f);
  }
  setenv("GMR_CONFIG", path, 1);
  gmr_runtime_t *def0 = NULL, *def1 = NULL;
  is_int(gmr_default_runtime(0, &def0), 0, "gmr_default_runtime(0) from GMR_CONFIG");
  is_int(gmr_default_runtime(1, &def1), 0, "gmr_default_runtime(1) from GMR_CONFIG");
  unlink(path);
  rmdir(dir);
  ok(def0 && def1 && def0 != def1, "  two distinct runtimes");
  if (!def0 || !def1) return done_testing();
  void *a0 = NULL, *a1 = NULL;
  gmr_alloc(def0, 4096, NULL, &a0);
  gmr_alloc(def1, 4096, NULL, &a1);
  ok(in_window(a0, 0) && in_window(a1, 1), "  on distinct windows (%p, %p)", a0, a1);
  gmr_free(def0, a0);
  gmr_free(def1, a1);

  gmr_set_log(capture_log, NULL);
  void *t0 = gmr_torch_alloc(5 << 20, 0, NULL);
  void *t1 = gmr_torch_alloc(5 << 20, 1, NULL);
  void *c1 = gmr_cupy_malloc(NULL, 70000, 1);
  ok(t0 && in_window(t0, 0), "gmr_torch_alloc on device 0: device 0's window");
  ok(t1 && in_window(t1, 1), "gmr_torch_alloc on device 1: device 1's window");
  ok(c1 && in_window(c1, 1), "gmr_cupy_malloc on device 1: device 1's window");
  gmr_stats(def0, &st0);
  gmr_stats(def1, &st1);
  ok(st0.allocations == 1 && st0.requested_bytes == 5 << 20 && st1.allocations == 2 &&
         st1.requested_bytes == (5 << 20) + 70000,
     "each hook reached its device's default runtime");
  sum0 = summary_string(def0);
  sum1 = summary_string(def1);
  n_log = 0;
  gmr_torch_free(t1, 5 << 20, 0, NULL);
  ok(n_log == 1 && strstr(last_log, "gmr_torch_free") && strstr(last_log, "device 0") &&
         strstr(last_log, "not allocated by this runtime"),
     "gmr_torch_free with the wrong device is refused and logged");
  gmr_cupy_free(NULL, t0, 1);
  ok(n_log == 2 && strstr(last_log, "gmr_cupy_free") && strstr(last_log, "device 1"),
     "gmr_cupy_free with the wrong device is refused and logged");
  ok(unchanged(def0, &st0, sum0), "  device 0: stats, summary and gmr_check unchanged");
  ok(unchanged(def1, &st1, sum1), "  device 1: stats, summary and gmr_check unchanged");
  n_log = 0;
  gmr_torch_record_stream(t1, GMR_SIM_STREAM(1));
  is_int(n_log, 0, "gmr_torch_record_stream finds device 1's pointer");
  gmr_torch_free(t0, 5 << 20, 0, NULL);
  gmr_torch_free(t1, 5 << 20, 1, GMR_SIM_STREAM(0));
  gmr_cupy_free(NULL, c1, 1);
  is_int(n_log, 0, "the right devices free them silently");
  gmr_stats(def0, &st0);
  gmr_stats(def1, &st1);
  ok(st0.allocations == 0 && st1.allocations == 0 && gmr_check(def0) == 0 && gmr_check(def1) == 0,
     "both default runtimes end with nothing live and consistent");
  free(sum0);
  free(sum1);
  gmr_set_log(NULL, NULL);
  return done_testing();
}
