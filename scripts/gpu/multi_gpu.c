/* multi_gpu.c: gmr on two CUDA devices in one process (TAP).
 *
 *   cc -std=c11 -O2 -pthread -I DIR/include -I $CUDA_HOME/include multi_gpu.c \
 *      -L DIR/lib -lgmr -L $CUDA_HOME/lib64 -lcudart -o multi_gpu
 *   ./multi_gpu [OPS]
 *
 * 1. One thread per device, in parallel, each with its own runtimes (direct,
 *    caching, caching with expandable segments, stitch when its YAML is given
 *    in GMR_STITCH_CONFIG): cudaMemGetInfo, allocations that
 *    cudaPointerGetAttributes places on the runtime's own device, a byte
 *    pattern written and read back, GMR_ENOMEM past the device's total,
 *    gmr_check, empty_cache; then OPS random allocations and frees (default
 *    2000) of which some are first freed through the other device's runtime
 *    (GMR_EBADPTR), each block's pattern checked before its free.
 * 2. Cross-device frees on real devices: a pointer of device 0 freed through
 *    device 1's runtime (and back) is GMR_EBADPTR; stats, summaries and
 *    gmr_check of both are unchanged, and both blocks keep their bytes.
 * 3. The caller's current device: an allocation, a free and an empty_cache on
 *    device 1's runtime from a thread current on device 0 leave it on 0.
 * Results are gathered under a mutex and printed by the main thread.
 * With fewer than two devices: "1..0 # SKIP".
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"

#define MiB      ((size_t)1 << 20)
#define MAX_LIVE 48

static pthread_mutex_t res_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_tests, n_failed;

static int check(int pass, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&res_lock);
  printf("%sok %d - ", pass ? "" : "not ", ++n_tests);
  vprintf(fmt, ap);
  putchar('\n');
  fflush(stdout);
  n_failed += !pass;
  pthread_mutex_unlock(&res_lock);
  va_end(ap);
  return pass;
}

static gmr_runtime_t *make(const char *yaml, int device) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    check(0, "config %s: %s", yaml, err.message);
    return NULL;
  }
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new(cfg, device, &rt);
  gmr_config_free(cfg);
  if (rc != 0) check(0, "device %d: runtime: %s", device, gmr_last_error(NULL));
  return rt;
}

static char *read_file(const char *path) {
  FILE *f = path ? fopen(path, "r") : NULL;
  if (f == NULL) return NULL;
  char *buf = calloc(1, 1 << 16);
  if (buf) buf[fread(buf, 1, (1 << 16) - 1, f)] = '\0';
  fclose(f);
  return buf;
}

static int on_device(void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) return -1;
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

/* Write `byte` over [p, p+n) on the current device, or check that it is there
 * (first and last 4 KiB). */
static int fill(void *p, size_t n, int byte) {
  return cudaMemset(p, byte, n) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}
static int holds(void *p, size_t n, int byte) {
  static __thread unsigned char buf[2][4096];
  size_t k = n < 4096 ? n : 4096;
  if (cudaMemcpy(buf[0], p, k, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(buf[1], (char *)p + n - k, k, cudaMemcpyDeviceToHost) != cudaSuccess)
    return 0;
  for (size_t i = 0; i < k; ++i)
    if (buf[0][i] != (unsigned char)byte || buf[1][i] != (unsigned char)byte) return 0;
  return 1;
}

typedef struct {
  int device;
  size_t ops;
  gmr_runtime_t *rt, *other; /* caching runtimes for the random phase */
  const char *stitch_yaml;
} worker_t;

/* A fixed set of allocations on `rt`: each on the right device, patterned. */
static void basic(gmr_runtime_t *rt, int d, const char *name) {
  void *a[12] = {0};
  int ok = 1, where = 1, bytes = 1;
  for (int i = 0; i < 12; ++i) {
    size_t n = (size_t)(i + 1) * 3 * MiB + 4096 * (size_t)i;
    if (gmr_alloc(rt, n, NULL, &a[i]) != 0) {
      ok = 0;
      break;
    }
    where &= on_device(a[i]) == d;
    bytes &= fill(a[i], n, 0x10 * (d + 1) + i) && holds(a[i], n, 0x10 * (d + 1) + i);
  }
  check(ok, "device %d: %s: 12 allocations of 3 to 36 MiB", d, name);
  check(where, "device %d: %s: every block is on device %d", d, name, d);
  check(bytes, "device %d: %s: every block holds its pattern", d, name);
  for (int i = 0; i < 12; ++i)
    gmr_free(rt, a[i]);
  check(gmr_check(rt) == 0, "device %d: %s: gmr_check", d, name);
  check(gmr_empty_cache(rt) == 0, "device %d: %s: empty_cache", d, name);
}

static void *worker(void *arg) {
  worker_t *w = arg;
  int d = w->device;
  cudaSetDevice(d); /* as a framework's thread for this device */
  gmr_runtime_t *rt = make("device: {backend: cuda}\npolicy: direct\n", d);
  if (rt != NULL) {
    size_t f = 0, t = 0;
    check(gmr_mem_info(rt, &f, &t) == 0 && t > 0 && f <= t,
          "device %d: direct: cudaMemGetInfo (%zu MiB free of %zu)", d, f / MiB, t / MiB);
    void *p = NULL;
    check(gmr_alloc(rt, t + ((size_t)1 << 30), NULL, &p) == GMR_ENOMEM,
          "device %d: direct: more than the device holds is GMR_ENOMEM", d);
    basic(rt, d, "direct");
    gmr_runtime_free(rt);
  }
  const char *stacks[][2] = {
      {"caching", "device: {backend: cuda}\npolicy: caching\n"},
      {"expandable",
       "device: {backend: cuda}\npolicy: {name: caching, expandable_segments: true}\n"},
      {"stitch", w->stitch_yaml},
  };
  for (int s = 0; s < 3; ++s) {
    if (stacks[s][1] == NULL) continue;
    rt = make(stacks[s][1], d);
    if (rt == NULL) continue;
    if (strcmp(gmr_runtime_backend(rt), "cuda") != 0) {
      check(0, "device %d: %s: backend %s, not cuda", d, stacks[s][0], gmr_runtime_backend(rt));
    } else {
      basic(rt, d, stacks[s][0]);
    }
    gmr_runtime_free(rt);
  }

  /* Random allocations and frees; some first go to the other device's runtime. */
  void *live[MAX_LIVE] = {0};
  size_t size[MAX_LIVE] = {0};
  size_t allocs = 0, cross_bad = 0, wrong_dev = 0, lost = 0, errors = 0;
  uint64_t x = 0x2545f4914f6cdd1dull * (uint64_t)(d + 7);
  for (size_t i = 0; i < w->ops; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t k = (size_t)(x % MAX_LIVE);
    int byte = (int)(k + 1) ^ (d ? 0xa0 : 0x50);
    if (live[k] != NULL) {
      if ((x & 0x300) == 0 && gmr_free(w->other, live[k]) != GMR_EBADPTR) ++cross_bad;
      if (!holds(live[k], size[k], byte)) ++lost;
      if (gmr_free(w->rt, live[k]) != 0) ++errors;
      live[k] = NULL;
    } else {
      size[k] = (size_t)512 << ((x >> 24) % 16); /* 512 B to 16 MiB */
      size[k] += (size_t)((x >> 44) % 8192);
      if (gmr_alloc(w->rt, size[k], NULL, &live[k]) != 0) {
        ++errors;
        live[k] = NULL;
        continue;
      }
      ++allocs;
      wrong_dev += on_device(live[k]) != d;
      if (!fill(live[k], size[k], byte)) ++errors;
    }
  }
  for (int k = 0; k < MAX_LIVE; ++k)
    if (live[k] != NULL && gmr_free(w->rt, live[k]) != 0) ++errors;
  check(errors == 0 && allocs > w->ops / 4, "device %d: random: %zu allocations, no error", d,
        allocs);
  check(wrong_dev == 0, "device %d: random: every block on device %d", d, d);
  check(cross_bad == 0, "device %d: random: frees through device %d's runtime are GMR_EBADPTR", d,
        1 - d);
  check(lost == 0, "device %d: random: every block kept its pattern until its free", d);
  check(gmr_check(w->rt) == 0, "device %d: random: gmr_check", d);
  return NULL;
}

static char *summary_of(gmr_runtime_t *rt) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return NULL;
  gmr_summary(rt, f);
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    printf("1..0 # SKIP %d CUDA device%s, two needed\n", n, n == 1 ? "" : "s");
    return 0;
  }
  size_t ops = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000;
  char *stitch = read_file(getenv("GMR_STITCH_CONFIG"));
  char *stitch_yaml = NULL;
  if (stitch && asprintf(&stitch_yaml, "device: {backend: cuda}\n%s", stitch) < 0) stitch_yaml = 0;

  /* 1. both devices in parallel threads */
  gmr_runtime_t *rt[2];
  for (int d = 0; d < 2; ++d)
    rt[d] = make("device: {backend: cuda}\npolicy: caching\n", d);
  if (!rt[0] || !rt[1]) return printf("1..%d\n", n_tests), 1;
  worker_t w[2];
  pthread_t th[2];
  for (int d = 0; d < 2; ++d) {
    w[d] = (worker_t){
        .device = d, .ops = ops, .rt = rt[d], .other = rt[1 - d], .stitch_yaml = stitch_yaml};
    pthread_create(&th[d], NULL, worker, &w[d]);
  }
  for (int d = 0; d < 2; ++d)
    pthread_join(th[d], NULL);

  /* 2. cross-device frees on real devices */
  void *p[2] = {0};
  for (int d = 0; d < 2; ++d) {
    cudaSetDevice(d);
    if (gmr_alloc(rt[d], 24 * MiB, NULL, &p[d]) != 0 || !fill(p[d], 24 * MiB, 0x3c + d)) p[d] = 0;
  }
  check(p[0] && p[1] && on_device(p[0]) == 0 && on_device(p[1]) == 1,
        "cross: a 24 MiB block on each device");
  if (!p[0] || !p[1]) return printf("1..%d\n", n_tests), 1;
  gmr_stats_t st[2], now;
  char *sum[2];
  for (int d = 0; d < 2; ++d) {
    gmr_stats(rt[d], &st[d]);
    sum[d] = summary_of(rt[d]);
  }
  check(gmr_free(rt[1], p[0]) == GMR_EBADPTR, "cross: device 0's block freed through device 1: "
                                              "GMR_EBADPTR");
  check(gmr_free(rt[0], p[1]) == GMR_EBADPTR, "cross: device 1's block freed through device 0: "
                                              "GMR_EBADPTR");
  for (int d = 0; d < 2; ++d) {
    char *s = summary_of(rt[d]);
    check(gmr_stats(rt[d], &now) == 0 && memcmp(&now, &st[d], sizeof now) == 0,
          "cross: device %d: stats unchanged", d);
    check(s && sum[d] && strcmp(s, sum[d]) == 0, "cross: device %d: summary unchanged", d);
    check(gmr_check(rt[d]) == 0, "cross: device %d: gmr_check", d);
    cudaSetDevice(d);
    check(holds(p[d], 24 * MiB, 0x3c + d), "cross: device %d: its block kept its bytes", d);
    check(gmr_free(rt[d], p[d]) == 0, "cross: device %d: its own runtime frees it", d);
    free(s);
    free(sum[d]);
  }

  /* 3. the caller's current device is left alone */
  cudaSetDevice(0);
  void *q = NULL;
  int cur = -1;
  check(gmr_alloc(rt[1], 200 * MiB, NULL, &q) == 0 && on_device(q) == 1,
        "current device 0: an allocation on device 1's runtime is on device 1");
  cudaGetDevice(&cur);
  check(cur == 0, "  and the thread is still on device 0 (%d)", cur);
  gmr_free(rt[1], q);
  gmr_empty_cache(rt[1]);
  size_t f, t;
  gmr_mem_info(rt[1], &f, &t);
  cudaGetDevice(&cur);
  check(cur == 0, "  free, empty_cache and mem_info on device 1 leave it on device 0 (%d)", cur);

  gmr_runtime_free(rt[0]);
  gmr_runtime_free(rt[1]);
  free(stitch);
  free(stitch_yaml);
  printf("1..%d\n", n_tests);
  return n_failed != 0;
}
