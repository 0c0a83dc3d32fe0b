/* cuda.c: the CUDA backend on a real device (skipped without one): device
 * reservations through cudaMalloc, virtual memory map/unmap, events, memory
 * info, and errors mapped to GMR_ENOMEM with CUDA's own text; the stitch
 * policy on the device (two blocks sharing a page through two addresses keep
 * their bytes, a cache hit maps nothing). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

static int64_t stat_of(gmr_runtime_t *rt, const char *key) {
  int64_t v = -1;
  gmr_stat_get(rt, key, &v);
  return v;
}

/* The driver's memset and copy, looked up at run time (the test links no
 * CUDA library of its own; gmr's runtime made the primary context current
 * on this thread). */
typedef int (*memset_fn)(unsigned long long, unsigned char, size_t);
typedef int (*dtoh_fn)(void *, unsigned long long, size_t);

/* Bytes [0, n) of device address d all equal v. */
static int device_all(dtoh_fn dtoh, void *d, size_t n, unsigned char v) {
  unsigned char *h = malloc(n);
  int good = h != NULL && dtoh(h, (unsigned long long)(uintptr_t)d, n) == 0;
  for (size_t i = 0; good && i < n; ++i)
    good = h[i] == v;
  free(h);
  return good;
}

static void test_stitch(gmr_runtime_t *rt) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL) lib = dlopen("libcuda.so.1", RTLD_NOW);
  memset_fn set = lib ? (memset_fn)dlsym(lib, "cuMemsetD8_v2") : NULL;
  dtoh_fn dtoh = lib ? (dtoh_fn)dlsym(lib, "cuMemcpyDtoH_v2") : NULL;
  /* 3 MiB is one whole page and 1 MiB of the next (2 MiB pages); the second
   * block's first 1 MiB goes in that page's open suffix. */
  void *a, *b, *c;
  is_int(gmr_alloc(rt, 3 * MiB, NULL, &a), 0, "stitch on CUDA: 3 MiB");
  is_int(gmr_alloc(rt, 3 * MiB, NULL, &b), 0, "stitch on CUDA: 3 MiB more");
  ok(stat_of(rt, "stitch.shared_pages.current") >= 1, "  the two share a page");
  if (set != NULL && dtoh != NULL) {
    ok(set((unsigned long long)(uintptr_t)a, 0xA5, 3 * MiB) == 0 &&
           set((unsigned long long)(uintptr_t)b, 0x5A, 3 * MiB) == 0,
       "  each written whole through its own address");
    ok(device_all(dtoh, a, 3 * MiB, 0xA5) && device_all(dtoh, b, 3 * MiB, 0x5A),
       "  and each reads back its own bytes (the shared page's tail and head)");
  } else {
    skip("no cuMemsetD8_v2 / cuMemcpyDtoH_v2 in libcuda.so.1");
    skip("no cuMemsetD8_v2 / cuMemcpyDtoH_v2 in libcuda.so.1");
  }
  int64_t maps = stat_of(rt, "stitch.map_calls");
  gmr_free(rt, a);
  is_int(gmr_alloc(rt, 3 * MiB, NULL, &c), 0, "stitch on CUDA: 3 MiB again");
  ok(c == a && stat_of(rt, "stitch.map_calls") == maps, "  the cached range, no page mapped");
  gmr_free(rt, b);
  gmr_free(rt, c);
  is_int(gmr_check(rt), 0, "stitch on CUDA: invariants hold");
  is_int(gmr_empty_cache(rt), 0, "stitch on CUDA: empty_cache");
  is_int((int)stat_of(rt, "reserved_bytes.all.current"), 0, "  and nothing is reserved");
  gmr_runtime_free(rt);
  if (lib != NULL) dlclose(lib);
}

static gmr_runtime_t *make(const char *yaml) {
  gmr_config_t *cfg;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) return NULL;
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new(cfg, 0, &rt);
  gmr_config_free(cfg);
  if (rc != 0) diag("runtime: %s", gmr_strerror(rc));
  return rt;
}

int main(void) {
  gmr_runtime_t *rt = make("device: {backend: auto}\npolicy: direct\n");
  if (rt == NULL || strcmp(gmr_runtime_backend(rt), "cuda") != 0) {
    gmr_runtime_free(rt);
    skip_all("no CUDA device");
  }
  size_t f, t;
  is_int(gmr_mem_info(rt, &f, &t), 0, "cudaMemGetInfo through the backend");
  ok(t > 0 && f <= t, "total %zu, free %zu", t, f);
  void *p;
  is_int(gmr_alloc(rt, 64 * MiB, NULL, &p), 0, "cudaMalloc 64 MiB");
  size_t f2, t2;
  gmr_mem_info(rt, &f2, &t2);
  ok(f2 <= f - 64 * MiB, "free memory dropped by at least 64 MiB");
  is_int(gmr_free(rt, p), 0, "cudaFree");
  void *huge;
  is_int(gmr_alloc(rt, t + (1ull << 30), NULL, &huge), GMR_ENOMEM,
         "more than the device holds is GMR_ENOMEM");
  like(gmr_last_error(rt), "out of memory", "  with CUDA's words");
  is_int(gmr_alloc(rt, 1 * MiB, NULL, &p), 0, "and the device still works");
  gmr_free(rt, p);
  gmr_runtime_free(rt);

  rt = make("device: {backend: cuda}\npolicy: caching\n");
  if (rt != NULL) {
    void *a[16];
    for (int i = 0; i < 16; ++i)
      is_int(gmr_alloc(rt, (size_t)(i + 1) * MiB, NULL, &a[i]), 0, "caching on CUDA: alloc %d MiB",
             i + 1);
    for (int i = 0; i < 16; ++i)
      gmr_free(rt, a[i]);
    is_int(gmr_check(rt), 0, "caching on CUDA: invariants hold");
    is_int(gmr_empty_cache(rt), 0, "caching on CUDA: empty_cache");
    gmr_runtime_free(rt);
  }
  rt = make("device: {backend: cuda}\npolicy: {name: caching, expandable_segments: true}\n");
  if (rt != NULL) {
    void *a, *b;
    is_int(gmr_alloc(rt, 5 * MiB, NULL, &a), 0, "expandable on CUDA: 5 MiB maps a page");
    is_int(gmr_alloc(rt, 16 * MiB, NULL, &b), 0, "expandable on CUDA: 16 MiB maps the next");
    ok((char *)b == (char *)a + 5 * MiB, "  contiguous after the first block");
    gmr_free(rt, a);
    gmr_free(rt, b);
    is_int(gmr_empty_cache(rt), 0, "expandable on CUDA: empty_cache unmaps");
    gmr_stats_t st;
    gmr_stats(rt, &st);
    is_u64(st.reserved_bytes, 0, "  and nothing is reserved");
    gmr_runtime_free(rt);
  }
  rt = make("device: {backend: cuda}\npolicy: stitch\n");
  if (rt != NULL) test_stitch(rt);
  rt = make(
      "device: {backend: cuda}\npolicy: {name: bfc, allow_growth: true, memory_limit: 1GiB}\n");
  if (rt != NULL) {
    void *a;
    is_int(gmr_alloc(rt, 3 * MiB, NULL, &a), 0, "bfc on CUDA: alloc");
    gmr_free(rt, a);
    gmr_runtime_free(rt);
  }
  return done_testing();
}
