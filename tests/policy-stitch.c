/* policy-stitch.c: the stitch policy on the simulator.
 *
 * Layout (a page shared by the tail of one block and the head of the next,
 * seen through two virtual addresses), cache hits with no device call (the
 * simulator's spy counters), streams (no cross-stream reuse before an event
 * completes; record_stream), CUDA graph capture (a miss maps fresh pages only;
 * a private pool never unmaps), the OOM
 * message, empty_cache, page sizes other than 2 MiB, a random run with the
 * invariant walk after every event and data patterns, a fault sweep (fail
 * the k-th device call for every k over a script: invariants, no leak, the
 * right error), threads, and the fronts that serve them (turned on here by
 * hand, as the first thread that finds the policy's lock held would).
 * GMR_STITCH_OPS sets the random run's length.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "runtime/runtime.h"
#include "sim-runtime.h"
#include "stitch/internal.h"
#include "tap.h"

#define KiB  (1ull << 10)
#define MiB  (1ull << 20)
#define S(n) GMR_SIM_STREAM(n)

static int64_t stat_of(gmr_runtime_t *rt, const char *key) {
  int64_t v = -1;
  if (gmr_stat_get(rt, key, &v) != 0) diag("no statistic %s", key);
  return v;
}

/* Every device call the simulator counts, summed. */
static uint64_t device_calls(const gmr_sim_counters_t *k) {
  return k->reserve_calls + k->release_calls + k->map_calls + k->unmap_calls + k->va_reserve_calls +
         k->va_release_calls + k->event_records + k->event_queries + k->syncs +
         k->page_create_calls + k->page_release_calls + k->page_map_calls + k->page_unmap_calls +
         k->set_access_calls + k->capture_queries;
}

/* The device agrees with the policy: bytes held = pages, mappings = records. */
static int device_agrees(gmr_runtime_t *rt) {
  gmr_sim_counters_t k;
  gmr_stats_t st;
  gmr_sim_counters(rt, &k);
  gmr_stats(rt, &st);
  /* Pages created together are one handle, slots mapped together one
   * mapping (chunks, policies/stitch/pages.c). */
  int64_t maps = stat_of(rt, "stitch.device_mappings.current");
  int64_t handles = stat_of(rt, "stitch.device_handles.current");
  int64_t pages = stat_of(rt, "stitch.pages.current");
  int64_t P = stat_of(rt, "stitch.page_size");
  if (k.bytes_in_use != st.reserved_bytes || (int64_t)k.page_maps_live != maps ||
      (int64_t)k.pages_live != handles || (int64_t)k.bytes_in_use != pages * P) {
    diag("device %llu bytes, %llu handles, %llu maps; policy %llu bytes, %lld pages in %lld "
         "handles, %lld maps",
         (unsigned long long)k.bytes_in_use, (unsigned long long)k.pages_live,
         (unsigned long long)k.page_maps_live, (unsigned long long)st.reserved_bytes,
         (long long)pages, (long long)handles, (long long)maps);
    return 0;
  }
  return 1;
}

static void test_layout(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 64 * MiB, 1);
  ok(rt != NULL, "stitch on a host-backed 64 MiB simulator");
  if (rt == NULL) return;
  unsigned char *a, *b;
  is_int(gmr_alloc(rt, 3 * MiB, NULL, (void **)&a), 0, "3 MiB: one whole page and a tail");
  is_int(gmr_alloc(rt, 2 * MiB + 512 * KiB, NULL, (void **)&b), 0,
         "2.5 MiB: starts in the open half of the first block's last page");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 6 * MiB, "5.5 MiB in three 2 MiB pages, not four");
  is_int((int)stat_of(rt, "stitch.shared_pages.current"), 1, "one page holds two blocks");
  ok((uintptr_t)a % 512 == 0 && (uintptr_t)b % 512 == 0, "pointers are 512-byte aligned");
  memset(a, 0xA5, 3 * MiB);
  memset(b, 0x5B, 2 * MiB + 512 * KiB);
  int a_ok = 1, b_ok = 1;
  for (size_t i = 0; i < 3 * MiB; ++i)
    a_ok &= a[i] == 0xA5;
  for (size_t i = 0; i < 2 * MiB + 512 * KiB; ++i)
    b_ok &= b[i] == 0x5B;
  ok(a_ok && b_ok, "both blocks keep their bytes");
  /* b starts 1 MiB into its first slot, which maps the page that holds a's
   * last MiB: those bytes read back through b's address range too. */
  ok((uintptr_t)b % (2 * MiB) == MiB, "b starts 1 MiB into its first page");
  ok(memcmp(b - MiB, a + 2 * MiB, MiB) == 0, "a's tail reads back through b's mapping");
  a[3 * MiB - 1] = 0x11;
  is_int(b[-1], 0x11, "a write through one address is seen through the other");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, a);
  gmr_free(rt, b);
  is_int(gmr_check(rt), 0, "invariants hold after the frees");
  gmr_runtime_free(rt);
}

static void test_cache_hit(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  const size_t sizes[] = {5 * MiB + 4096, 4096, 12 * MiB, 700 * KiB};
  for (int i = 0; i < 4; ++i) {
    void *p, *q;
    gmr_alloc(rt, sizes[i], NULL, &p);
    gmr_free(rt, p);
    gmr_sim_counters_t before, after;
    gmr_sim_counters(rt, &before);
    is_int(gmr_alloc(rt, sizes[i], NULL, &q), 0, "alloc %zu bytes again", sizes[i]);
    ok(q == p, "  the cache hands back the same range");
    gmr_free(rt, q);
    gmr_sim_counters(rt, &after);
    is_u64(device_calls(&after), device_calls(&before),
           "  a cached pair of %zu bytes makes no device call", sizes[i]);
  }
  is_int((int)stat_of(rt, "stitch.cache_hits"), 2, "two large hits counted");
  /* A freed range keeps its whole pages parked; a request of another
   * length takes them back rather than creating pages. */
  gmr_empty_cache(rt);
  void *p, *q;
  gmr_alloc(rt, 16 * MiB, NULL, &p);
  gmr_free(rt, p);
  is_int(gmr_check(rt), 0, "a freed 16 MiB range parks its pages (invariants hold)");
  gmr_alloc(rt, 10 * MiB, NULL, &q);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 16 * MiB, "  10 MiB of another length reuses them: no new page");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_free(rt, q);
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
}

static void test_streams(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  void *a, *b, *c;
  gmr_alloc(rt, 4 * MiB, S(1), &a);
  gmr_sim_stream_enqueue(rt, S(1)); /* a kernel using a, still running */
  gmr_free(rt, a);
  is_int(gmr_alloc(rt, 4 * MiB, S(2), &b), 0, "4 MiB on stream 2 while stream 1 is busy");
  ok(b != a, "  not the bytes stream 1 may still use");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 8 * MiB, "  so two more pages");
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  is_u64(k.page_unmap_calls, 0, "  nothing unmapped while stream 1 runs");
  gmr_sim_stream_complete(rt, S(1));
  is_int(gmr_alloc(rt, 4 * MiB, S(2), &c), 0, "stream 1 done: 4 MiB more on stream 2");
  ok(c == a, "  reuses stream 1's range with no device call");
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 8 * MiB, "  no new page");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);

  /* cross_stream: sync waits on the event instead. */
  rt = sim_runtime("policy: {name: stitch, cross_stream: sync}\n", 256 * MiB, 0);
  if (rt == NULL) return;
  gmr_alloc(rt, 4 * MiB, S(1), &a);
  gmr_sim_stream_enqueue(rt, S(1));
  gmr_free(rt, a);
  gmr_alloc(rt, 4 * MiB, S(2), &b);
  gmr_sim_counters(rt, &k);
  ok(b == a && k.syncs >= 1, "cross_stream: sync waits for stream 1, then reuses its range");
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  /* record_stream, large and small. */
  rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  const size_t sizes[] = {4 * MiB, 64 * KiB};
  for (int i = 0; i < 2; ++i) {
    gmr_alloc(rt, sizes[i], NULL, &a);
    is_int(gmr_record_stream(rt, a, S(2)), 0, "record_stream on stream 2 (%zu bytes)", sizes[i]);
    gmr_sim_stream_enqueue(rt, S(2));
    gmr_free(rt, a);
    gmr_alloc(rt, sizes[i], NULL, &b);
    ok(b != a, "  the block is not reused while stream 2 runs");
    gmr_stats(rt, &st);
    ok(st.active_bytes == st.allocated_bytes + sizes[i] && st.peak_active_bytes >= st.active_bytes,
       "  and stays active: active = allocated + the pending block, at most its peak");
    is_int(gmr_check(rt), 0, "  invariants hold");
    gmr_sim_stream_complete(rt, S(2));
    gmr_alloc(rt, sizes[i], NULL, &c);
    ok(c == a, "  stream 2 done: reused");
    gmr_free(rt, b);
    gmr_free(rt, c);
    gmr_stats(rt, &st);
    ok(st.active_bytes == 0 && st.allocated_bytes == 0, "  all freed: nothing active");
  }
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
}

/* Unmapping is not ordered with a stream's work: an address that queued
 * work still uses must stay mapped to the same page until that work is
 * known complete.  The simulator counts every unmap of such an address. */
static void test_unmap_safety(void) {
  gmr_runtime_t *rt = sim_runtime("policy: {name: stitch, stale_misses: 1}\n", 256 * MiB, 0);
  if (rt == NULL) return;
  void *a, *b, *c, *d;
  gmr_sim_counters_t k;
  /* A cached range one of whose pages another block took is stale after
   * one miss of its length (stale_misses: 1) and would be unmapped. */
  gmr_alloc(rt, 8 * MiB, S(1), &a);
  gmr_sim_stream_use(rt, S(1), a, 8 * MiB); /* a kernel reading a, still queued */
  gmr_free(rt, a);
  is_int(gmr_alloc(rt, 2 * MiB, S(1), &b), 0, "2 MiB on the same stream takes one of a's pages");
  is_int(gmr_alloc(rt, 8 * MiB, S(1), &c), 0, "8 MiB again while the kernel on a is queued");
  gmr_sim_counters(rt, &k);
  ok(c != a && k.unsafe_unmaps == 0, "  a new range: a's addresses stay mapped under the kernel");
  is_int((int)stat_of(rt, "stitch.evictions"), 0, "  so the stale range is not unmapped yet");
  gmr_free(rt, c);
  /* Once the stream is done, the next miss of that length unmaps it. */
  gmr_sim_stream_complete(rt, S(1));
  gmr_alloc(rt, 8 * MiB, S(1), &c);
  gmr_alloc(rt, 8 * MiB, S(1), &d);
  ok(stat_of(rt, "stitch.evictions") >= 1, "stream done: the stale range is unmapped");
  gmr_free(rt, d);
  gmr_free(rt, c);
  gmr_free(rt, b);
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
  rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;

  /* empty_cache with work still queued. */
  gmr_alloc(rt, 6 * MiB, S(2), &a);
  gmr_alloc(rt, 4096, S(2), &b);
  gmr_sim_stream_use(rt, S(2), a, 6 * MiB);
  gmr_sim_stream_use(rt, S(2), b, 4096);
  gmr_free(rt, a);
  gmr_free(rt, b);
  is_int(gmr_empty_cache(rt), 0, "empty_cache while a kernel on stream 2 is queued");
  gmr_sim_counters(rt, &k);
  ok(k.unsafe_unmaps == 0 && k.page_maps_live == 0, "  it waits, then unmaps everything");
  gmr_runtime_free(rt);
}

/* A loop that repeats itself makes no page map after warm-up, even when one
 * length is handed out twice per iteration with different neighbours (each
 * request takes the oldest cached range it can use, so an iteration repeats
 * the one before it). */
static void test_loop_steady(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 1024 * MiB, 0);
  if (rt == NULL) return;
  int64_t maps_after_warmup = -1;
  for (int it = 0; it < 12; ++it) {
    if (it == 3) maps_after_warmup = stat_of(rt, "stitch.map_calls");
    void *a, *b, *c, *d, *x, *y, *z;
    gmr_alloc(rt, 40 * MiB + 4096, NULL, &a);
    gmr_alloc(rt, 9 * MiB, NULL, &x);
    gmr_alloc(rt, 40 * MiB + 4096, NULL, &b);
    gmr_free(rt, a);
    gmr_free(rt, x);
    gmr_alloc(rt, 30 * MiB, NULL, &y);
    gmr_alloc(rt, 40 * MiB + 4096, NULL, &c);
    gmr_free(rt, y);
    gmr_alloc(rt, 40 * MiB + 4096, NULL, &d);
    gmr_free(rt, b);
    gmr_free(rt, c);
    gmr_alloc(rt, 70 * MiB, NULL, &z);
    gmr_free(rt, d);
    gmr_free(rt, z);
  }
  is_int((int)(stat_of(rt, "stitch.map_calls") - maps_after_warmup), 0,
         "a repeating loop makes no page map after three warm-up iterations");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* Note [Resizing]: a KV cache that grows by one token a step (12 layers, K
 * and V, batch 4: 6 KiB a token) is served by resizing the ranges freed one
 * allocation before, so after warm-up the page maps per generated token
 * stay near 0 (each step made 24 misses before). */
static void test_growing(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 4096 * MiB, 0);
  if (rt == NULL) return;
  enum { LAYERS = 12, BATCH = 4, STEPS = 400, WARM = 50 };
  const size_t tok = BATCH * 1536;
  void *k[LAYERS], *v[LAYERS], *x;
  size_t len = 300 * tok;
  int fails = 0;
  for (int i = 0; i < LAYERS; ++i)
    fails |= gmr_alloc(rt, len, S(0), &k[i]) | gmr_alloc(rt, len, S(0), &v[i]);
  int64_t maps_warm = 0;
  for (int step = 0; step < STEPS; ++step) {
    if (step == WARM) maps_warm = stat_of(rt, "stitch.map_calls");
    len += tok;
    for (int i = 0; i < LAYERS; ++i) {
      fails |= gmr_alloc(rt, 3 * tok, S(0), &x); /* the step's activations */
      void *nk, *nv;
      fails |= gmr_alloc(rt, len, S(0), &nk);
      gmr_free(rt, k[i]);
      fails |= gmr_alloc(rt, len, S(0), &nv);
      gmr_free(rt, v[i]);
      k[i] = nk, v[i] = nv;
      gmr_free(rt, x);
    }
  }
  is_int(fails, 0, "a growing KV cache: every allocation served");
  int64_t maps = stat_of(rt, "stitch.map_calls") - maps_warm;
  double per_token = (double)maps / ((STEPS - WARM) * BATCH);
  ok(per_token <= 0.1, "  %lld page maps after warm-up, %.3f a generated token (<= 0.1)",
     (long long)maps, per_token);
  ok(stat_of(rt, "stitch.cache_resizes") > (STEPS - WARM) * LAYERS, "  served by resizes");
  for (int i = 0; i < LAYERS; ++i) {
    gmr_free(rt, k[i]);
    gmr_free(rt, v[i]);
  }
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* Note [Graph capture]: a miss during a capture maps fresh pages at a fresh
 * range and takes nothing from the cached ranges (their pages stay where a
 * graph may use them); no event call, no unmap. */
static void test_capture(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  void *a, *b, *c, *d;
  gmr_alloc(rt, 7 * MiB, S(3), &a);
  gmr_alloc(rt, 12 * MiB, S(4), &c);
  gmr_free(rt, a);
  gmr_free(rt, c); /* cached on another stream: its pages FREE, parked */
  gmr_sim_counters_t k0, k1, k2;
  gmr_sim_counters(rt, &k0);
  gmr_sim_stream_capture(rt, S(3), 1);
  is_int(gmr_alloc(rt, 7 * MiB, S(3), &b), 0, "during capture, a cached range is served");
  ok(b == a, "  the same range, no device call");
  is_int(gmr_alloc(rt, 9 * MiB, S(3), &d), 0, "a miss during capture is served");
  gmr_sim_counters(rt, &k1);
  is_int((int)(k1.page_create_calls - k0.page_create_calls), 5, "  from 5 fresh pages");
  is_int((int)(k1.page_map_calls - k0.page_map_calls), 5, "  each mapped once: nothing reused");
  is_int((int)(k1.page_unmap_calls - k0.page_unmap_calls + k1.event_records - k0.event_records +
               k1.event_queries - k0.event_queries + k1.syncs - k0.syncs),
         0, "  no unmap, no event recorded, queried or waited on");
  void *e;
  is_int(gmr_alloc(rt, 600 * KiB, S(3), &e), 0, "a small block during capture is served");
  gmr_sim_counters(rt, &k2);
  is_int((int)(k2.page_create_calls - k1.page_create_calls), 1, "  in a segment on a fresh page");
  gmr_sim_stream_capture(rt, S(3), 0);
  gmr_sim_counters(rt, &k1);
  is_int(gmr_alloc(rt, 12 * MiB, S(4), &a), 0, "after the capture the other stream's length");
  ok(a == c, "  gets its cached range back");
  gmr_sim_counters(rt, &k2);
  is_int((int)(k2.page_map_calls - k1.page_map_calls), 0, "  with no page map");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_free(rt, d);
  gmr_free(rt, e);
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
}

/* A private pool's instance never unmaps, nor reuses a cached range's pages
 * for another range, while the pool lives (Note [Graph capture]). */
static void test_pool(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  gmr_pool_t *pool = NULL;
  if (!ok(gmr_pool_create(rt, &pool) == 0 && gmr_pool_begin(pool, S(5)) == 0, "a pool")) {
    gmr_runtime_free(rt);
    return;
  }
  void *x, *y, *z, *w;
  gmr_alloc(rt, 6 * MiB, S(5), &x);
  gmr_alloc(rt, 10 * MiB, S(5), &y);
  gmr_free(rt, x);
  gmr_free(rt, y);
  gmr_sim_counters_t k0, k1;
  gmr_sim_counters(rt, &k0);
  is_int(gmr_alloc(rt, 7 * MiB, S(5), &z), 0, "a new length in the pool");
  gmr_sim_counters(rt, &k1);
  is_int((int)(k1.page_create_calls - k0.page_create_calls), 4, "  from 4 fresh pages");
  is_int((int)(k1.page_map_calls - k0.page_map_calls), 4, "  each mapped once");
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k1);
  is_int((int)(k1.page_unmap_calls - k0.page_unmap_calls), 0,
         "  empty_cache unmaps nothing of a live pool");
  is_int(gmr_alloc(rt, 6 * MiB, S(5), &w), 0, "  a cached length");
  ok(w == x, "  is its range, still mapped");
  gmr_sim_counters(rt, &k0);
  is_int((int)(k0.page_map_calls - k1.page_map_calls), 0, "  with no page map");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_pool_end(pool, S(5));
  gmr_free(rt, z);
  gmr_free(rt, w);
  gmr_pool_release(pool);
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &k1);
  ok(k1.bytes_in_use == 0 && k1.page_maps_live == 0, "the pool released: nothing held");
  gmr_runtime_free(rt);
}

static void test_oom_and_trim(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 32 * MiB, 0);
  if (rt == NULL) return;
  void *a, *b;
  gmr_alloc(rt, 20 * MiB + 100 * KiB, NULL, &a);
  is_int(gmr_alloc(rt, 12 * MiB, NULL, &b), GMR_ENOMEM, "12 MiB more does not fit in 32 MiB");
  const char *m = gmr_last_error(rt);
  like(m, "out of memory allocating 12.00 MiB", "the OOM message names the request");
  like(m, "live", "  live bytes");
  like(m, "free (", "  free bytes");
  like(m, "dead gaps", "  dead-gap bytes");
  like(m, "mappings", "  mappings");
  like(m, "of address space in use", "  address space");
  is_int((int)stat_of(rt, "num_ooms"), 1, "num_ooms counts it");
  is_int(gmr_check(rt), 0, "invariants hold after the OOM");
  ok(device_agrees(rt), "the device holds what the policy counts");
  gmr_free(rt, a);
  void *s;
  gmr_alloc(rt, 4096, NULL, &s);
  gmr_free(rt, s);
  is_int(gmr_empty_cache(rt), 0, "empty_cache");
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  ok(k.bytes_in_use == 0 && k.pages_live == 0 && k.page_maps_live == 0,
     "empty_cache gives every page and mapping back");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
}

/* Under a limit that counts reserved bytes, created pages count against it. */
static void test_under_limit(void) {
  gmr_runtime_t *rt =
      sim_runtime("policy: stitch\nlimit: {bytes: 64MiB, counts: reserved}\n", 1024 * MiB, 0);
  if (rt == NULL) return;
  void *a, *b, *c;
  is_int(gmr_alloc(rt, 40 * MiB, NULL, &a), 0, "limit(stitch): 40 MiB of a 64 MiB cap");
  is_int(gmr_alloc(rt, 40 * MiB, NULL, &b), GMR_ENOMEM, "  40 MiB more passes the cap");
  like(gmr_last_error(rt), "stitch: out of memory allocating 40.00 MiB", "  stitch's message");
  like(gmr_last_error(rt), "limit of 64.00 MiB", "  naming the limit");
  is_int(gmr_check(rt), 0, "  invariants hold");
  is_int(gmr_alloc(rt, 20 * MiB, NULL, &c), 0, "  20 MiB still fits");
  gmr_free(rt, a);
  gmr_free(rt, c);
  is_int(gmr_check(rt), 0, "  invariants hold after the frees");
  gmr_runtime_free(rt);
}

static void test_page_sizes(void) {
  const uint64_t grans[] = {64 * KiB, 4 * MiB};
  for (int g = 0; g < 2; ++g) {
    gmr_config_t *cfg;
    gmr_error_t err;
    gmr_config_load_string("policy: stitch\n", &cfg, &err);
    gmr_sim_options_t o = {.capacity = 2048 * MiB, .granularity = grans[g]};
    gmr_runtime_t *rt;
    is_int(gmr_runtime_new_sim(cfg, &o, &rt), 0, "a device with %llu KiB pages",
           (unsigned long long)(grans[g] / KiB));
    gmr_config_free(cfg);
    void *p[16];
    int bad = 0;
    for (int i = 0; i < 16; ++i) {
      bad |= gmr_alloc(rt, (size_t)(i * 997 + 1) * 1000 + (size_t)i * grans[g], NULL, &p[i]);
      bad |= gmr_check(rt);
    }
    is_int((int)stat_of(rt, "stitch.page_size"), (int)grans[g], "  pages of the queried size");
    gmr_stats_t st;
    gmr_stats(rt, &st);
    ok(!bad && st.reserved_bytes % grans[g] == 0, "  every allocation served, invariants hold");
    for (int i = 0; i < 16; ++i)
      gmr_free(rt, p[i]);
    is_int(gmr_check(rt), 0, "  invariants hold after the frees");
    gmr_runtime_free(rt);
  }
  gmr_config_t *cfg;
  gmr_error_t err;
  is_int(gmr_config_load_string("policy: {name: stitch, tau: 1000}\n", &cfg, &err), GMR_ECONFIG,
         "tau must be a multiple of 512");
}

/* ---- random run with patterns -------------------------------------------------------------------
 */

static uint64_t rng = 88172645463325252ull;
static uint64_t xs(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static size_t pick_size(void) {
  uint64_t r = xs() % 100;
  if (r < 55) return 1 + xs() % (1 << 20);         /* small pool */
  if (r < 90) return (1 << 20) + xs() % (9 << 20); /* 1-10 MiB */
  return (10 << 20) + xs() % (30 << 20);           /* 10-40 MiB */
}

/* Lengths near each other (Note [Resizing]): a few bases, each + 0-64 KiB. */
static size_t pick_near_size(void) {
  static const size_t base[] = {3 << 20, 5 << 20, 9 << 20, 17 << 20};
  if (xs() % 100 < 40) return 1 + xs() % (1 << 20);
  return base[xs() % 4] + xs() % (64 * KiB);
}

typedef struct live_s {
  unsigned char *p;
  size_t n;
  unsigned char tag;
  gmr_stream_t s;
} live_t;

static void stamp(live_t *l) {
  /* The first and last bytes and every 64 KiB in between. */
  for (size_t i = 0; i < l->n; i += 64 * KiB)
    l->p[i] = l->tag;
  l->p[l->n - 1] = l->tag;
}
static int stamped(const live_t *l) {
  for (size_t i = 0; i < l->n; i += 64 * KiB)
    if (l->p[i] != l->tag) return 0;
  return l->p[l->n - 1] == l->tag;
}

static void test_random(bool near) {
  const char *env = getenv("GMR_STITCH_OPS");
  int ops = env ? atoi(env) : 3000;
  gmr_runtime_t *rt = sim_runtime("policy: {name: stitch, max_mappings: 512}\n", 512 * MiB, 1);
  if (rt == NULL) return;
  live_t live[64];
  int n = 0, bad_check = 0, bad_data = 0, bad_err = 0;
  for (int i = 0; i < ops; ++i) {
    if (n < 64 && (n == 0 || xs() % 100 < 55)) {
      live_t *l = &live[n];
      l->n = near ? pick_near_size() : pick_size();
      l->tag = (unsigned char)(1 + xs() % 250);
      l->s = S(xs() % 3);
      int rc = gmr_alloc(rt, l->n, l->s, (void **)&l->p);
      if (rc == 0) {
        stamp(l);
        if (xs() % 2) gmr_sim_stream_use(rt, l->s, l->p, l->n); /* a kernel on it, queued */
        ++n;
      } else if (rc != GMR_ENOMEM) {
        ++bad_err;
      }
    } else {
      int j = (int)(xs() % (uint64_t)n);
      bad_data += !stamped(&live[j]);
      gmr_free(rt, live[j].p);
      live[j] = live[--n];
    }
    if (xs() % 16 == 0) gmr_sim_stream_complete(rt, S(xs() % 3));
    if (i % 97 == 0) gmr_empty_cache(rt);
    if (gmr_check(rt) != 0 && bad_check++ == 0) diag("event %d: %s", i, gmr_last_error(rt));
  }
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  for (int j = 0; j < n; ++j) {
    bad_data += !stamped(&live[j]);
    gmr_free(rt, live[j].p);
  }
  is_int(bad_check, 0, "random run of %d events%s: invariants hold after each", ops,
         near ? ", lengths near each other" : "");
  if (near) ok(stat_of(rt, "stitch.cache_resizes") > 0, "  cached ranges were resized");
  is_int(bad_data, 0, "  no block's bytes were overwritten by another");
  is_int(bad_err, 0, "  every failure was GMR_ENOMEM");
  is_u64(k.unsafe_unmaps, 0, "  no address was unmapped while queued work used it");
  ok(device_agrees(rt), "  the device holds what the policy counts");
  ok(stat_of(rt, "stitch.shared_pages.current") >= 0 && stat_of(rt, "stitch.map_calls") > 0,
     "  pages were mapped and shared");
  gmr_runtime_free(rt);
}

/* ---- the take-back ------------------------------------------------------------------------------
 *
 * A small free waits for the next op, which takes the block back when it
 * allocates the block's size on its stream (policies/stitch/small.c).  The
 * same seeded operations run twice: reading the statistics after every
 * operation (each waiting free applied at once: no take-back) and not; both
 * must hand out the same addresses and end with the same statistics and
 * segments. */

typedef struct tb_out_s {
  uint64_t addrs;     /* a hash of every address handed out, in order */
  char text[1 << 16]; /* the statistics and the walk at the end */
  size_t len;
  int check; /* gmr_check at the end */
} tb_out_t;

static int tb_stat(const char *key, int64_t value, void *ud) {
  tb_out_t *o = ud;
  if (strstr(key, "_ns") == NULL && o->len < sizeof o->text)
    o->len += (size_t)snprintf(o->text + o->len, sizeof o->text - o->len, "%s=%lld\n", key,
                               (long long)value);
  return 0;
}
static int tb_walk(const gmr_walk_entry_t *e, void *ud) {
  tb_out_t *o = ud;
  if (o->len < sizeof o->text)
    o->len +=
        (size_t)snprintf(o->text + o->len, sizeof o->text - o->len, "%d %llx %llu %llu %d %p\n",
                         e->is_segment, (unsigned long long)e->address, (unsigned long long)e->size,
                         (unsigned long long)e->requested, (int)e->state, e->stream);
  return 0;
}

static void take_back_run(int observe, tb_out_t *o) {
  memset(o, 0, sizeof *o);
  o->check = -1;
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 256 * MiB, 0);
  if (rt == NULL) return;
  static const size_t sizes[] = {512,     4 * KiB, 4 * KiB + 1, 8 * KiB, 100 * KiB,
                                 1 * MiB, 3 * MiB, 4 * MiB,     6 * MiB, 6 * MiB - 100};
  uint64_t r = 0x2545F4914F6CDD1Dull;
  void *p[24];
  size_t n[24];
  gmr_stream_t st[24];
  int live = 0;
  o->addrs = 1469598103934665603ull;
  for (int i = 0; i < 6000; ++i) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    int rc = 0;
    if (live < 24 && (live == 0 || r % 100 < 50)) {
      n[live] = sizes[(r >> 8) % 10];
      st[live] = S(1 + (r >> 16) % 2);
      rc = gmr_alloc(rt, n[live], st[live], &p[live]);
      if (rc == 0) {
        o->addrs = (o->addrs ^ (uintptr_t)p[live]) * 1099511628211ull;
        if ((r >> 24) % 16 == 0) gmr_record_stream(rt, p[live], S(2 - (r >> 16) % 2));
        ++live;
      }
    } else {
      int j = (int)((r >> 8) % (uint64_t)live);
      size_t size = n[j];
      gmr_stream_t s = st[j];
      rc = gmr_free(rt, p[j]);
      p[j] = p[--live], n[j] = n[live], st[j] = st[live];
      if ((r >> 20) % 2 && rc == 0) { /* the same size again: a take-back unless observed */
        if (observe) gmr_check(rt);
        rc = gmr_alloc(rt, size, s, &p[live]);
        if (rc == 0) {
          o->addrs = (o->addrs ^ (uintptr_t)p[live]) * 1099511628211ull;
          n[live] = size, st[live] = s, ++live;
        }
      }
    }
    if (rc != 0) o->addrs = o->addrs * 31 + (uint64_t)-rc;
    if ((r >> 28) % 64 == 0) gmr_sim_stream_complete(rt, S(1 + (r >> 34) % 3));
    if (observe) {
      gmr_stats_t stats;
      gmr_stats(rt, &stats);
    }
  }
  gmr_stats_foreach(rt, tb_stat, o);
  gmr_walk(rt, tb_walk, o);
  o->check = gmr_check(rt);
  for (int j = 0; j < live; ++j)
    gmr_free(rt, p[j]);
  gmr_runtime_free(rt);
}

static void test_take_back(void) {
  static tb_out_t seen, unseen;
  take_back_run(1, &seen);
  take_back_run(0, &unseen);
  ok(seen.len > 0 && seen.check == 0 && unseen.check == 0, "take-back: two runs, invariants hold");
  ok(seen.addrs == unseen.addrs, "  the same addresses with and without take-backs");
  ok(seen.len == unseen.len && memcmp(seen.text, unseen.text, seen.len) == 0,
     "  the same statistics and segments at the end");
}

/* ---- fault sweep
 * ---------------------------------------------------------------------------------- */

static uint64_t fallible_calls(const gmr_sim_counters_t *k) {
  return k->page_create_calls + k->page_map_calls + k->set_access_calls + k->va_reserve_calls;
}

/* A fixed script over two streams; returns the number of events that broke
 * a rule (wrong error, invariant walk failed, device disagrees).  sticky_k >
 * 0: every device call from the sticky_k-th on fails during the event that
 * makes it (so the policy's retry fails too), and that event must be an
 * allocation that fails with GMR_ENOMEM; *fired says whether it happened. */
static int script_k(gmr_runtime_t *rt, int *nooms, uint64_t sticky_k, int *fired) {
  void *p[24] = {0};
  uint64_t r = 12345;
  int bad = 0;
  for (int i = 0; i < 120; ++i) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    int j = (int)((r >> 33) % 24);
    uint64_t before = 0;
    if (sticky_k > 0 && !*fired) {
      gmr_sim_counters_t k;
      gmr_sim_counters(rt, &k);
      before = fallible_calls(&k);
      if (sticky_k > before) gmr_sim_fail_from(rt, sticky_k - before);
    }
    int ooms_before = *nooms;
    if (p[j] == NULL) {
      static const size_t sz[] = {3000,    200000,          1 << 20, (1 << 20) + 512,
                                  3 << 20, (5 << 20) + 777, 9 << 20, (17 << 20) + 4096};
      size_t n = sz[(r >> 20) % 8];
      int rc = gmr_alloc(rt, n, S((r >> 40) % 2), &p[j]);
      if (rc == GMR_ENOMEM) {
        ++*nooms;
        if (strstr(gmr_last_error(rt), "out of memory allocating") == NULL) ++bad;
        p[j] = NULL;
      } else if (rc != 0) {
        diag("event %d: %s: %s", i, gmr_err_name(rc), gmr_last_error(rt));
        ++bad;
        p[j] = NULL;
      }
    } else {
      gmr_free(rt, p[j]);
      p[j] = NULL;
    }
    if (sticky_k > 0 && !*fired) {
      gmr_sim_counters_t k;
      gmr_sim_fail_all(rt, 0);
      gmr_sim_fail_nth(rt, 0);
      gmr_sim_counters(rt, &k);
      if (fallible_calls(&k) >= sticky_k) { /* the k-th call was made in this event */
        *fired = 1;
        if (*nooms != ooms_before + 1) {
          diag("event %d: device call %llu failed for good, but no GMR_ENOMEM", i,
               (unsigned long long)sticky_k);
          ++bad;
        }
      }
    }
    if (gmr_check(rt) != 0) {
      diag("event %d: %s", i, gmr_last_error(rt));
      ++bad;
    }
    if (!device_agrees(rt)) ++bad;
  }
  for (int j = 0; j < 24; ++j)
    if (p[j] != NULL) gmr_free(rt, p[j]);
  gmr_empty_cache(rt);
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  if (k.bytes_in_use != 0 || k.pages_live != 0 || k.page_maps_live != 0) {
    diag("leak: %llu bytes, %llu pages, %llu mappings", (unsigned long long)k.bytes_in_use,
         (unsigned long long)k.pages_live, (unsigned long long)k.page_maps_live);
    ++bad;
  }
  return bad;
}

static int script(gmr_runtime_t *rt, int *nooms) {
  int fired = 0;
  return script_k(rt, nooms, 0, &fired);
}

static void test_fault_sweep(void) {
  const char *yaml = "policy: {name: stitch, max_mappings: 64, va_chunk: 64MiB}\n";
  gmr_runtime_t *rt = sim_runtime(yaml, 128 * MiB, 0);
  if (rt == NULL) return;
  int nooms = 0;
  is_int(script(rt, &nooms), 0, "the script runs clean without faults");
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  uint64_t calls = fallible_calls(&k);
  gmr_runtime_free(rt);
  int bad = 0, failed_runs = 0, oom_runs = 0;
  for (uint64_t f = 1; f <= calls; ++f) {
    rt = sim_runtime(yaml, 128 * MiB, 0);
    if (rt == NULL) break;
    gmr_sim_fail_nth(rt, f);
    int o = 0, b = script(rt, &o);
    if (b != 0) {
      diag("fault at device call %llu: %d broken events", (unsigned long long)f, b);
      ++failed_runs;
    }
    bad += b;
    oom_runs += o > 0;
    gmr_runtime_free(rt);
  }
  is_int(failed_runs, 0,
         "fault sweep: the k-th of %llu device calls failed once, for every k: the retry "
         "recovers, invariants hold after every event, no leak (%d runs still ended an "
         "allocation in OOM)",
         (unsigned long long)calls, oom_runs);

  /* Every call from the k-th on fails during that event: its allocation
   * must fail with GMR_ENOMEM and the full message, undo exactly, and the
   * runtime must work afterwards. */
  failed_runs = 0;
  int fired_runs = 0;
  for (uint64_t f = 1; f <= calls; ++f) {
    rt = sim_runtime(yaml, 128 * MiB, 0);
    if (rt == NULL) break;
    int o = 0, fired = 0, b = script_k(rt, &o, f, &fired);
    if (b != 0) {
      diag("failing from device call %llu on: %d broken events", (unsigned long long)f, b);
      ++failed_runs;
    }
    fired_runs += fired;
    gmr_runtime_free(rt);
  }
  is_int(failed_runs, 0,
         "fault sweep: every device call from the k-th on failed during its event, for every k "
         "of %llu: GMR_ENOMEM with the full message, invariants, no leak",
         (unsigned long long)calls);
  ok(fired_runs > 0 && (uint64_t)fired_runs <= calls, "  the failure happened in %d of %llu runs",
     fired_runs, (unsigned long long)calls);

  /* Every call refused: clean OOMs, nothing held. */
  rt = sim_runtime(yaml, 128 * MiB, 0);
  if (rt == NULL) return;
  gmr_sim_fail_all(rt, 1);
  void *p;
  is_int(gmr_alloc(rt, 5 * MiB, NULL, &p), GMR_ENOMEM, "fail all: large allocation is GMR_ENOMEM");
  is_int(gmr_alloc(rt, 5000, NULL, &p), GMR_ENOMEM, "fail all: small allocation is GMR_ENOMEM");
  like(gmr_last_error(rt), "fail all", "  the device's words are in the message");
  gmr_sim_counters(rt, &k);
  ok(k.bytes_in_use == 0 && k.page_maps_live == 0 && gmr_check(rt) == 0,
     "  nothing is held, invariants hold");
  gmr_sim_fail_all(rt, 0);
  is_int(gmr_alloc(rt, 5 * MiB, NULL, &p), 0, "  and the runtime works afterwards");
  gmr_free(rt, p);
  gmr_runtime_free(rt);
}

/* ---- threads
 * ------------------------------------------------------------------------------------- */

typedef struct targ_s {
  gmr_runtime_t *rt;
  int id, ops, bad;
} targ_t;

static void *worker(void *arg) {
  targ_t *a = arg;
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(a->id + 1);
  live_t live[8];
  int n = 0;
  for (int i = 0; i < a->ops; ++i) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    if (n < 8 && (n == 0 || r % 2)) {
      live_t *l = &live[n];
      l->n = r % 4 ? 1 + (r >> 8) % (512 * KiB) : (1 << 20) + (r >> 8) % (6 << 20);
      l->tag = (unsigned char)(a->id * 31 + i);
      if (gmr_alloc(a->rt, l->n, S(a->id + 1), (void **)&l->p) == 0) {
        stamp(l);
        ++n;
      }
    } else {
      int j = (int)((r >> 20) % (uint64_t)n);
      a->bad += !stamped(&live[j]);
      gmr_free(a->rt, live[j].p);
      live[j] = live[--n];
    }
  }
  for (int j = 0; j < n; ++j) {
    a->bad += !stamped(&live[j]);
    gmr_free(a->rt, live[j].p);
  }
  return NULL;
}

static void test_threads(void) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 1024 * MiB, 1);
  if (rt == NULL) return;
  pthread_t th[4];
  targ_t args[4];
  for (int i = 0; i < 4; ++i) {
    args[i] = (targ_t){rt, i, 400, 0};
    pthread_create(&th[i], NULL, worker, &args[i]);
  }
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    pthread_join(th[i], NULL);
    bad += args[i].bad;
  }
  is_int(bad, 0, "4 threads on 4 streams: every block keeps its bytes");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  ok(st.allocations == 0 && st.num_allocs == st.num_frees, "  every allocation freed");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* ---- fronts
 * -------------------------------------------------------------------------------------- */

/* A stitch runtime whose fronts are on, as after two threads met at its lock. */
static gmr_runtime_t *fronts_runtime(uint64_t capacity) {
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", capacity, 1);
  if (rt != NULL) atomic_store(&((stitch_t *)gmr__runtime_policy(rt))->contended, true);
  return rt;
}

static void test_fronts(void) {
  gmr_runtime_t *rt = fronts_runtime(256 * MiB);
  if (!ok(rt != NULL, "fronts: runtime")) return;
  /* The first allocation on a stream takes the lock and gives it a front;
   * its free is kept there; an allocation of the same length on the same
   * stream takes it back with no device call, whatever its requested size. */
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  gmr_alloc(rt, 4096, S(1), &a);
  gmr_free(rt, a);
  gmr_sim_counters_t k0, k1;
  gmr_sim_counters(rt, &k0);
  gmr_alloc(rt, 4000, S(1), &b);
  gmr_sim_counters(rt, &k1);
  ok(b == a && device_calls(&k1) == device_calls(&k0), "a small block kept is taken back");
  size_t req = 0, got = 0;
  gmr_alloc_size(rt, b, &req, &got);
  ok(req == 4000 && got == 4096, "  with the new requested size");
  gmr_free(rt, b);
  gmr_alloc(rt, 8 * MiB + 512, S(2), &c);
  gmr_free(rt, c);
  gmr_alloc(rt, 8 * MiB + 100, S(2), &d);
  ok(d == c, "a large range kept is taken back");
  gmr_free(rt, d);
  /* Another length, or another stream: the locked path. */
  gmr_alloc(rt, 8 * MiB + 4096, S(2), &a);
  ok(a != d, "a different length is not served by the front");
  gmr_alloc(rt, 4096, S(3), &b);
  gmr_free(rt, b);
  gmr_free(rt, a);
  /* The figures count every take-back as an allocation and a free. */
  is_int((int)stat_of(rt, "allocation.all.allocated"), 6, "six allocations counted");
  is_int((int)stat_of(rt, "allocation.all.freed"), 6, "  six frees");
  is_int((int)stat_of(rt, "allocation.small_pool.allocated"), 3, "  three small");
  is_int((int)stat_of(rt, "requested_bytes.small_pool.allocated"), 4096 + 4000 + 4096,
         "  their requested bytes, handed out");
  is_int((int)stat_of(rt, "requested_bytes.small_pool.freed"), 4096 + 4000 + 4096, "  and freed");
  is_int((int)stat_of(rt, "requested_bytes.large_pool.allocated"),
         (int)(3 * 8 * MiB + 512 + 100 + 4096), "  large, handed out");
  is_int((int)stat_of(rt, "requested_bytes.all.current"), 0, "  nothing requested now");
  is_int((int)stat_of(rt, "allocated_bytes.all.current"), 0, "  nothing allocated now");
  is_int((int)stat_of(rt, "stitch.cache_hits"), 1, "  the large take-back is a hit");
  /* A block used on another stream is not kept: it waits for that stream. */
  gmr_alloc(rt, 4096, S(1), &a);
  gmr_record_stream(rt, a, S(4));
  gmr_sim_stream_enqueue(rt, S(4));
  gmr_free(rt, a);
  gmr_alloc(rt, 4096, S(1), &b);
  ok(b != a, "a block with record_stream uses is not taken back while they run");
  gmr_free(rt, b);
  gmr_sim_stream_complete(rt, S(4));
  gmr_alloc(rt, 65536, S(5), &c); /* the locked path looks at pending frees */
  gmr_free(rt, c);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.active_bytes, 0, "  released once stream 4's work completes");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);

  /* Memory kept by a front serves other streams when the device is full:
   * an allocation that does not fit flushes the fronts and retries. */
  rt = fronts_runtime(64 * MiB);
  if (rt == NULL) return;
  gmr_alloc(rt, 40 * MiB, S(1), &a);
  gmr_free(rt, a);
  is_int(gmr_alloc(rt, 40 * MiB, S(2), &b), 0,
         "a block kept on stream 1 serves stream 2 when full");
  gmr_free(rt, b);
  is_int(gmr_empty_cache(rt), 0, "empty_cache");
  gmr_sim_counters(rt, &k1);
  ok(k1.bytes_in_use == 0 && k1.page_maps_live == 0, "  gives every page back, kept ones too");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* Threads hammering pairs on their own streams, with some of their sizes
 * shared, a stats thread flushing the fronts meanwhile: every block keeps its
 * bytes, and the figures add up. */
typedef struct fpair_s {
  gmr_runtime_t *rt;
  int id, bad, allocs;
} fpair_t;
static _Atomic int fronts_running;
static void *front_worker(void *arg) {
  fpair_t *a = arg;
  uint64_t r = 0x2545F4914F6CDD1Dull * (uint64_t)(a->id + 1);
  for (int i = 0; i < 20000; ++i) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    live_t l = {.n = r % 3 ? 4096 + (r >> 8) % 2 * 512 : 2 * MiB + 4096 * (r >> 8) % 3,
                .tag = (unsigned char)(a->id * 17 + i)};
    if (gmr_alloc(a->rt, l.n, S(a->id + 1), (void **)&l.p) != 0) continue;
    ++a->allocs;
    stamp(&l);
    a->bad += !stamped(&l);
    gmr_free(a->rt, l.p);
  }
  atomic_fetch_sub(&fronts_running, 1);
  return NULL;
}
static void test_fronts_threads(void) {
  gmr_runtime_t *rt = fronts_runtime(1024 * MiB);
  if (rt == NULL) return;
  pthread_t th[4];
  fpair_t args[4];
  atomic_store(&fronts_running, 4);
  for (int i = 0; i < 4; ++i) {
    args[i] = (fpair_t){rt, i, 0, 0};
    pthread_create(&th[i], NULL, front_worker, &args[i]);
  }
  int rounds = 0;
  while (atomic_load(&fronts_running) > 0) {
    gmr_stats_t st;
    gmr_stats(rt, &st);
    if (++rounds % 8 == 0) gmr_empty_cache(rt);
  }
  int bad = 0, allocs = 0;
  for (int i = 0; i < 4; ++i) {
    pthread_join(th[i], NULL);
    bad += args[i].bad;
    allocs += args[i].allocs;
  }
  is_int(bad, 0, "fronts, 4 threads and a stats thread: every block keeps its bytes");
  is_int((int)stat_of(rt, "allocation.all.allocated"), allocs, "  every allocation counted");
  is_int((int)stat_of(rt, "allocation.all.freed"), allocs, "  every free counted");
  is_int((int)stat_of(rt, "allocated_bytes.all.current"), 0, "  nothing allocated at the end");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* The class bitmaps (pages.c): gmr__st_classes_find (the first non-empty class
 * >= k) and gmr__st_classes_find_last (the last <= k) against a plain array,
 * over random marks, at sizes that leave the last words partial and that
 * need a second word of the words' bitmap. */
static uint32_t naive_find(const bool *on, uint32_t n, uint32_t k) {
  for (uint32_t i = k; i < n; ++i)
    if (on[i]) return i;
  return ST_NIL;
}
static uint32_t naive_find_last(const bool *on, uint32_t n, uint32_t k) {
  for (int64_t i = k < n ? k : n - 1; i >= 0; --i)
    if (on[i]) return (uint32_t)i;
  return ST_NIL;
}
static void test_class_bitmaps(void) {
  static const uint32_t sizes[] = {1, 63, 64, 65, 4096, 4100, 5000};
  uint64_t rng = 0x243F6A8885A308D3ull;
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; ++z) {
    uint32_t n = sizes[z];
    st_classes_t c;
    bool *on = calloc(n, sizeof *on);
    if (!ok(on != NULL && gmr__st_classes_init(&c, n) == 0, "class bitmaps of %u classes", n)) {
      free(on);
      continue;
    }
    uint32_t bad = 0, count = 0;
    for (int step = 0; step < 4000; ++step) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t k = (uint32_t)(rng >> 33) % n;
      /* Mostly few classes set (sparse), now and then many. */
      bool set = ((rng >> 20) & 7) < (step % 1000 < 500 ? 1u : 6u);
      if (on[k] != set) count += set ? 1 : (uint32_t)-1;
      on[k] = set;
      gmr__st_classes_mark(&c, k, set);
      uint32_t q = (uint32_t)(rng >> 7) % (n + 2);
      bad += gmr__st_classes_find(&c, q) != (q < n ? naive_find(on, n, q) : ST_NIL);
      bad += gmr__st_classes_find_last(&c, q) != naive_find_last(on, n, q);
      bad += c.nonempty != count;
    }
    is_int((int)bad, 0, "  find and find_last agree with a plain scan over 4000 random marks");
    gmr__st_classes_free(&c);
    free(on);
  }
}

int main(void) {
  test_class_bitmaps();
  test_layout();
  test_cache_hit();
  test_streams();
  test_unmap_safety();
  test_loop_steady();
  test_growing();
  test_capture();
  test_pool();
  test_oom_and_trim();
  test_under_limit();
  test_page_sizes();
  test_random(false);
  test_random(true);
  test_take_back();
  test_fault_sweep();
  test_threads();
  test_fronts();
  test_fronts_threads();
  return done_testing();
}
