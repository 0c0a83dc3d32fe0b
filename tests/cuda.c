/* cuda.c: the CUDA backend on a real device (skipped without one): device
 * reservations through cudaMalloc, virtual memory map/unmap, events, memory
 * info, and errors mapped to GMR_ENOMEM with CUDA's own text. */
#include <string.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

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
