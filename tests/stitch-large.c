/* stitch-large.c: the stitch policy's device calls for large blocks grow
 * with the blocks' ends, not with their pages (docs/stitch.md, "Large
 * blocks"; policies/stitch/pages.c, Note [Chunks]).  Under config/stitch.yaml
 * on the simulated H200, blocks of about 100 GiB and of about 10 GiB, each
 * a new length more than 64 KiB from every other (so no resize serves it),
 * make a few page creates, maps and unmaps a block, where one a page was
 * 51,200 (5,120) map calls a block; a chunk's pages sleep and wake with
 * their contents.  Counts only, never times. */
#include <string.h>

#include "sim-runtime.h"

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

typedef struct calls_s {
  uint64_t creates, maps, unmaps, access, create_bytes;
  int64_t misses, resizes;
  int failed, checked;
} calls_t;

/* n blocks of about base bytes, one live at a time (each freed before the
 * next), of lengths base + d_i with d_i drawn from [0, 1 GiB) (a fixed
 * seed, the same for every base), more than 64 KiB apart. */
static calls_t run(uint64_t base, int n) {
  calls_t c = {0};
  gmr_runtime_t *rt = sim_runtime_file("stitch.yaml", 0);
  if (rt == NULL) {
    c.failed = 1;
    return c;
  }
  gmr_sim_counters_t k0, k1;
  gmr_sim_call_bytes_t y0, y1;
  gmr_sim_counters(rt, &k0);
  gmr_sim_call_bytes(rt, &y0);
  uint64_t x = 31;
  for (int i = 0; i < n; ++i) {
    void *p = NULL;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t size = base + ((x >> 34) % 8192) * 128 * 1024 + 12345;
    if (gmr_alloc(rt, size, GMR_SIM_STREAM(0), &p) != 0) {
      diag("alloc %d of %llu bytes: %s", i, (unsigned long long)size, gmr_last_error(rt));
      ++c.failed;
      continue;
    }
    c.checked += gmr_check(rt) != 0;
    gmr_free(rt, p);
  }
  gmr_sim_counters(rt, &k1);
  gmr_sim_call_bytes(rt, &y1);
  c.creates = k1.page_create_calls - k0.page_create_calls;
  c.maps = k1.page_map_calls - k0.page_map_calls;
  c.unmaps = k1.page_unmap_calls - k0.page_unmap_calls;
  c.access = k1.set_access_calls - k0.set_access_calls;
  c.create_bytes = y1.page_create - y0.page_create;
  gmr_stat_get(rt, "stitch.cache_misses", &c.misses);
  gmr_stat_get(rt, "stitch.cache_resizes", &c.resizes);
  c.checked += gmr_check(rt) != 0;
  if (gmr_empty_cache(rt) != 0) ++c.failed;
  gmr_sim_counters(rt, &k1);
  if (k1.pages_live != 0 || k1.page_maps_live != 0 || k1.bytes_in_use != 0) {
    diag("left on the device: %llu handles, %llu mappings, %llu bytes",
         (unsigned long long)k1.pages_live, (unsigned long long)k1.page_maps_live,
         (unsigned long long)k1.bytes_in_use);
    ++c.failed;
  }
  gmr_runtime_free(rt);
  return c;
}

/* The calls of one run, asserted a few a block. */
static void calls_per_block(const char *what, calls_t c, int n, uint64_t pages) {
  diag("%s: %llu creates (%llu bytes), %llu maps, %llu unmaps, %llu set access", what,
       (unsigned long long)c.creates, (unsigned long long)c.create_bytes,
       (unsigned long long)c.maps, (unsigned long long)c.unmaps, (unsigned long long)c.access);
  is_int(c.failed, 0, "%d blocks of %s, each a new length", n, what);
  is_int(c.checked, 0, "  invariants hold after each");
  ok(c.misses == n && c.resizes == 0, "  each a miss (%lld), none resized (%lld)",
     (long long)c.misses, (long long)c.resizes);
  ok(c.creates <= (uint64_t)n, "  page creates %llu <= 1 a block (%llu pages a block)",
     (unsigned long long)c.creates, (unsigned long long)pages);
  ok(c.maps <= 4 * (uint64_t)n, "  page maps %llu <= 4 a block", (unsigned long long)c.maps);
  ok(c.unmaps <= 4 * (uint64_t)n, "  page unmaps %llu <= 4 a block", (unsigned long long)c.unmaps);
  is_u64(c.access, n, "  one set access a block");
}

static void large_blocks(void) {
  enum { N = 12 };
  calls_t big = run(100 * GiB, N), small = run(10 * GiB, N);
  calls_per_block("~100 GiB", big, N, 100 * GiB / (2 * MiB));
  ok(big.create_bytes >= 100 * GiB, "  the pages of a 100 GiB block were created");
  calls_per_block("~10 GiB", small, N, 10 * GiB / (2 * MiB));
}

/* A block stitched from fresh pages: one chunk, one map; its bytes sleep
 * and wake with it. */
static void chunk_sleeps(void) {
  gmr_runtime_t *rt = sim_runtime("policy: {name: stitch, chunk_min_pages: 2}\n", 256 * MiB, 1);
  if (!ok(rt != NULL, "a host-backed runtime")) return;
  gmr_sim_counters_t k0, k1;
  gmr_sim_counters(rt, &k0);
  void *p = NULL;
  size_t n = 9 * MiB + 4096;
  int rc = gmr_region_begin(rt, "w");
  if (rc == 0) rc = gmr_alloc(rt, n, GMR_SIM_STREAM(0), &p);
  gmr_region_end(rt);
  gmr_sim_counters(rt, &k1);
  is_int(rc, 0, "9 MiB in a tag");
  if (rc != 0) {
    gmr_runtime_free(rt);
    return;
  }
  is_u64(k1.page_create_calls - k0.page_create_calls, 1, "  five pages, one create");
  is_u64(k1.page_map_calls - k0.page_map_calls, 1, "  one map");
  memset(p, 0x5a, n);
  is_int(gmr_sleep(rt, "w", GMR_SLEEP_OFFLOAD), 0, "  the chunk sleeps");
  is_int(gmr_check(rt), 0, "  invariants hold asleep");
  is_int(gmr_wake(rt, "w"), 0, "  and wakes");
  const unsigned char *b = p;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += b[i] != 0x5a;
  is_u64(bad, 0, "  with its bytes");
  is_int(gmr_check(rt), 0, "  invariants hold awake");
  gmr_free(rt, p);
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k1);
  is_u64(k1.bytes_in_use, 0, "  empty_cache releases the chunk");
  gmr_runtime_free(rt);
}

/* What a chunk holds back (Note [Chunks]): empty_cache releases a chunk
 * only once none of its pages is used; chunk_pages caps a chunk. */
static void chunk_release(const char *yaml, uint64_t creates, uint64_t held) {
  diag("%s", yaml);
  gmr_runtime_t *rt = sim_runtime(yaml, 256 * MiB, 0);
  if (!ok(rt != NULL, "a runtime")) return;
  gmr_sim_counters_t k;
  void *a = NULL, *b = NULL;
  int rc = gmr_alloc(rt, 8 * MiB, GMR_SIM_STREAM(0), &a);
  gmr_sim_counters(rt, &k);
  is_u64(k.page_create_calls, creates, "  8 MiB: four pages in %llu creates",
         (unsigned long long)creates);
  if (rc == 0) gmr_free(rt, a);
  rc |= gmr_alloc(rt, 2 * MiB, GMR_SIM_STREAM(0), &b); /* one of the four pages */
  gmr_sim_counters(rt, &k);
  is_u64(k.page_create_calls, creates, "  2 MiB after it takes one of them");
  rc |= gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k);
  is_u64(k.bytes_in_use, held, "  empty_cache keeps %llu MiB while it is live",
         (unsigned long long)(held / MiB));
  is_int(gmr_check(rt), 0, "  invariants hold");
  if (b != NULL) gmr_free(rt, b);
  rc |= gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k);
  is_u64(k.bytes_in_use, 0, "  and nothing once it is freed");
  is_int(rc, 0, "  every call succeeded");
  gmr_runtime_free(rt);
}

/* A miss whose map fails after its chunk was made gives the chunk back
 * (the undo), and the retry makes another. */
static void chunk_undo(void) {
  gmr_runtime_t *rt = sim_runtime("policy: {name: stitch, chunk_min_pages: 2}\n", 256 * MiB, 0);
  if (!ok(rt != NULL, "a runtime")) return;
  void *p = NULL;
  int rc = gmr_alloc(rt, 4 * MiB, GMR_SIM_STREAM(0), &p); /* the address space, reserved */
  if (rc == 0) gmr_free(rt, p);
  rc |= gmr_empty_cache(rt);
  gmr_sim_fail_nth(rt, 2); /* the chunk's create, then its map fails */
  rc |= gmr_alloc(rt, 9 * MiB + 4096, GMR_SIM_STREAM(0), &p);
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  is_int(rc, 0, "9 MiB whose first map fails is served by the retry");
  is_u64(k.page_create_calls, 3, "  one create for the first block, two for this one");
  is_u64(k.page_release_calls, 2, "  the first block's chunk and the failed attempt's");
  ok(k.pages_live == 1 && k.bytes_in_use == 10 * MiB, "  one chunk of 5 pages held (%llu, %llu)",
     (unsigned long long)k.pages_live, (unsigned long long)k.bytes_in_use);
  is_int(gmr_check(rt), 0, "  invariants hold");
  if (p != NULL) gmr_free(rt, p);
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k);
  is_u64(k.bytes_in_use, 0, "  nothing left");
  gmr_runtime_free(rt);
}

int main(void) {
  chunk_undo();
  large_blocks();
  chunk_sleeps();
  chunk_release("policy: stitch\n", 4, 2 * MiB); /* 4 pages: below chunk_min_pages */
  chunk_release("policy: {name: stitch, chunk_min_pages: 2}\n", 1, 8 * MiB);
  chunk_release("policy: {name: stitch, chunk_min_pages: 2, chunk_pages: 2}\n", 2, 4 * MiB);
  chunk_release("policy: {name: stitch, chunk_min_pages: 2, chunk_pages: 1}\n", 4, 2 * MiB);
  return done_testing();
}
