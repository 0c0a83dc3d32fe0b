/* shared-cap-bench.c: what the shared cap adds to a device reservation.
 *
 *   tests/shared-cap-bench [REPS]
 *
 * Uncontended, one thread, on files in a fresh temporary folder; each figure
 * is the median of REPS (default 21) timed loops of 200,000 operations, the
 * runs of each pair of contenders interleaved so that drift of a shared
 * machine hits both:
 *   module:  gmr__scap_reserve alone, gmr__scap_release alone;
 *   runtime: gmr_alloc + gmr_free of 1 MiB under `policy: direct` (every
 *            allocation is a device reservation of the simulator) with
 *            `limit: {counts: reserved}`, without and with `shared:`; the
 *            difference is what the shared cap adds per reservation + release;
 *   cached:  the same under `policy: caching` (served from the cache: the
 *            shared cap is never reached, so the two should be equal).
 * Not a test (it asserts nothing); its figures are in docs/shared-cap.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/shared-cap.h"
#include "gmr.h"

#define OPS 200000
#define MiB ((uint64_t)1 << 20)

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static gmr_runtime_t *runtime(const char *policy, const char *path) {
  char yaml[512];
  if (path)
    snprintf(yaml, sizeof yaml,
             "policy: %s\nlimit: {bytes: 60GiB, counts: reserved, shared: {cap: 70GiB, path: "
             "'%s'}}\n",
             policy, path);
  else
    snprintf(yaml, sizeof yaml, "policy: %s\nlimit: {bytes: 60GiB, counts: reserved}\n", policy);
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  gmr_runtime_t *rt = NULL;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0 || gmr_runtime_new_sim(cfg, NULL, &rt) != 0) {
    fprintf(stderr, "shared-cap-bench: %s %s\n", err.message, gmr_last_error(NULL));
    exit(1);
  }
  gmr_config_free(cfg);
  return rt;
}

static double pairs(gmr_runtime_t *rt) {
  void *p;
  double t0 = now_ns();
  for (int i = 0; i < OPS; ++i)
    if (gmr_alloc(rt, MiB, NULL, &p) != 0 || gmr_free(rt, p) != 0) exit(1);
  return (now_ns() - t0) / OPS;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 21;
  if (reps < 1 || reps > 1001) reps = 21;
  char dir[] = "/tmp/gmr-scap-bench-XXXXXX", file[64], file2[64];
  if (mkdtemp(dir) == NULL) return 1;
  snprintf(file, sizeof file, "%s/cap", dir);
  snprintf(file2, sizeof file2, "%s/cap2", dir);
  gmr_scap_opts_t o = {.path = file, .device_id = "bench", .cap = (uint64_t)1 << 50};
  gmr_scap_t *h = NULL;
  if (gmr__scap_attach(&o, &h) != 0) return 1;
  double *res = calloc((size_t)reps, sizeof *res), *rel = calloc((size_t)reps, sizeof *rel);
  double *d0 = calloc((size_t)reps, sizeof *d0), *d1 = calloc((size_t)reps, sizeof *d1);
  double *c0 = calloc((size_t)reps, sizeof *c0), *c1 = calloc((size_t)reps, sizeof *c1);
  gmr_runtime_t *direct = runtime("direct", NULL), *direct_s = runtime("direct", file2);
  gmr_runtime_t *cached = runtime("caching", NULL), *cached_s = runtime("caching", file2);
  for (int r = 0; r < reps; ++r) {
    double t0 = now_ns();
    for (int i = 0; i < OPS; ++i)
      gmr__scap_reserve(h, MiB);
    double t1 = now_ns();
    for (int i = 0; i < OPS; ++i)
      gmr__scap_release(h, MiB);
    res[r] = (t1 - t0) / OPS;
    rel[r] = (now_ns() - t1) / OPS;
    d0[r] = pairs(direct);
    d1[r] = pairs(direct_s);
    c0[r] = pairs(cached);
    c1[r] = pairs(cached_s);
  }
  double mr = median(res, reps), ml = median(rel, reps);
  double md0 = median(d0, reps), md1 = median(d1, reps);
  double mc0 = median(c0, reps), mc1 = median(c1, reps);
  printf("shared cap, uncontended, one thread; median of %d loops of %d operations\n", reps, OPS);
  printf("  module:  gmr__scap_reserve %.1f ns, gmr__scap_release %.1f ns\n", mr, ml);
  printf("  direct:  alloc+free (a device reservation + release each) %.1f ns without, %.1f ns "
         "with the shared cap: +%.1f ns\n",
         md0, md1, md1 - md0);
  printf("  caching: alloc+free served from the cache %.1f ns without, %.1f ns with: %+.1f ns\n",
         mc0, mc1, mc1 - mc0);
  gmr_runtime_free(direct);
  gmr_runtime_free(direct_s);
  gmr_runtime_free(cached);
  gmr_runtime_free(cached_s);
  gmr__scap_detach(h);
  unlink(file);
  unlink(file2);
  rmdir(dir);
  return 0;
}
