/* pools.c: private pools, CUDA graph capture, the memory fraction, segments
 * and the history observer (docs/pools.md), on the simulator, under every
 * policy: routing, no aliasing between a pool and eager memory, statistics
 * and walks that cover the pools, the pools' end of life, the device calls a
 * capture forbids, and concurrent use. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "sim-runtime.h"

#define MiB (1024u * 1024u)

static const char *const policies[] = {
    "policy: caching\n",
    "policy: {name: caching, pytorch_alloc_conf: \"expandable_segments:True\"}\n",
    "policy: bfc\n",
    "policy: stitch\n",
    "policy: direct\n",
    "policy: {name: limit, bytes: 512MiB, upstream: caching}\n",
};

typedef struct live_s {
  void *want[8];
  int n, seen, foreign;
} live_t;

static int live_cb(void *ptr, size_t size, void *ud) {
  live_t *l = ud;
  (void)size;
  int hit = 0;
  for (int i = 0; i < l->n; ++i)
    hit |= l->want[i] == ptr;
  if (hit)
    ++l->seen;
  else
    ++l->foreign;
  return 0;
}

typedef struct walk_pools_s {
  uint64_t pool_id;
  uint64_t pool_segments, default_segments;
} walk_pools_t;

static int walk_cb(const gmr_walk_entry_t *e, void *ud) {
  walk_pools_t *w = ud;
  if (!e->is_segment) return 0;
  if (e->pool_id == w->pool_id)
    ++w->pool_segments;
  else if (e->pool_id == 0)
    ++w->default_segments;
  return 0;
}

static void pools_under(const char *yaml) {
  diag("%s", yaml);
  gmr_runtime_t *rt = sim_runtime(yaml, 4096ull * MiB, 0);
  if (!ok(rt != NULL, "  a runtime")) return;
  gmr_stream_t cap = (gmr_stream_t)(uintptr_t)0x10, other = (gmr_stream_t)(uintptr_t)0x20;
  gmr_pool_t *pool = NULL;
  ok(gmr_pool_create(rt, &pool) == 0 && pool != NULL, "  gmr_pool_create");
  ok(gmr_pool_id(pool) != 0 && gmr_pool_use_count(pool) == 1, "  its id is not 0, its use count 1");
  ok(gmr_pool_begin(pool, cap) == 0, "  route the capture stream to it");
  void *p[4] = {0}, *q = NULL;
  int rc = 0;
  rc |= gmr_alloc(rt, 3 * MiB, cap, &p[0]);
  rc |= gmr_alloc(rt, 700, cap, &p[1]);
  rc |= gmr_alloc(rt, 40 * MiB, cap, &p[2]);
  rc |= gmr_alloc(rt, 3 * MiB, other, &q);
  ok(rc == 0, "  allocations on both streams");
  gmr_pool_t *of = NULL;
  ok(gmr_pool_of(rt, p[0], &of) == 0 && of == pool, "  the capture stream's blocks are the pool's");
  of = pool;
  ok(gmr_pool_of(rt, q, &of) == 0 && of == NULL,
     "  the other stream's block is the default pool's");
  ok(gmr_pool_end(pool, cap) == 0, "  end the route");
  ok(gmr_pool_end(pool, cap) == GMR_EINVAL, "  ending it twice is GMR_EINVAL");

  gmr_stats_t pst, all, none;
  gmr_pool_stats(pool, &pst);
  gmr_stats(rt, &all);
  ok(pst.allocations == 3 && all.allocations == 4,
     "  pool statistics: 3 live of 4 in all (%" PRIu64 ", %" PRIu64 ")", pst.allocations,
     all.allocations);
  ok(all.reserved_bytes >= pst.reserved_bytes + 3 * MiB,
     "  the runtime's reserved covers the pool");
  walk_pools_t w = {gmr_pool_id(pool), 0, 0};
  ok(gmr_walk(rt, walk_cb, &w) == 0 && w.pool_segments > 0 && w.default_segments > 0,
     "  the walk shows the pool's segments with its id (%" PRIu64 ") and the default's (%" PRIu64
     ")",
     w.pool_segments, w.default_segments);
  live_t l = {{p[0], p[1], p[2]}, 3, 0, 0};
  ok(gmr_pool_foreach_live(pool, live_cb, &l) == 0 && l.seen == 3 && l.foreign == 0,
     "  gmr_pool_foreach_live lists exactly the pool's live blocks");

  /* A block freed in the pool is not handed to an eager allocation. */
  ok(gmr_free(rt, p[0]) == 0 && gmr_free(rt, p[1]) == 0,
     "  free two pool blocks through the runtime");
  void *e1 = NULL, *e2 = NULL;
  ok(gmr_alloc(rt, 3 * MiB, cap, &e1) == 0 && gmr_alloc(rt, 700, cap, &e2) == 0,
     "  eager allocations of the same sizes");
  ok(e1 != p[0] && e2 != p[1], "  they do not reuse the pool's freed blocks");
  void *r0 = NULL;
  ok(gmr_alloc_in(rt, pool, 3 * MiB, cap, &r0) == 0, "  gmr_alloc_in the pool");
  gmr_pool_of(rt, r0, &of);
  ok(of == pool, "  it lands in the pool");
  ok(gmr_check(rt) == 0, "  the invariants hold, pools included: %s", gmr_last_error(rt));

  /* Shared by two graphs, then released. */
  ok(gmr_pool_retain(pool) == 0 && gmr_pool_use_count(pool) == 2, "  retain: use count 2");
  ok(gmr_pool_release(pool) == 0 && gmr_pool_release(pool) == 0 && gmr_pool_use_count(pool) == 0,
     "  two releases: use count 0");
  ok(gmr_pool_begin(pool, cap) == GMR_EINVAL, "  a released pool takes no route");
  void *x = NULL;
  ok(gmr_alloc_in(rt, pool, 100, cap, &x) == GMR_EINVAL && x == NULL,
     "  nor an allocation, with a sentence: %s", gmr_last_error(rt));
  gmr_empty_cache(rt);
  gmr_stats(rt, &all);
  ok(all.allocations == 5,
     "  an empty_cache keeps a released pool with live blocks (%" PRIu64 " live)", all.allocations);
  ok(gmr_free(rt, p[2]) == 0 && gmr_free(rt, r0) == 0, "  its last blocks freed");
  ok(gmr_free(rt, r0) == GMR_EBADPTR, "  a second free of a pool block is GMR_EBADPTR");
  ok(gmr_empty_cache(rt) == 0, "  empty_cache");
  gmr_free(rt, q);
  gmr_free(rt, e1);
  gmr_free(rt, e2);
  gmr_empty_cache(rt);
  gmr_stats(rt, &none);
  ok(none.allocations == 0 && none.reserved_bytes == 0,
     "  nothing is left reserved: the pool is gone (%" PRIu64 " bytes)", none.reserved_bytes);
  gmr_sim_counters_t sc;
  gmr_sim_counters(rt, &sc);
  ok(sc.bytes_in_use == 0, "  and the device holds nothing");
  gmr_runtime_free(rt);
}

/* ---- capture: no event query, wait or cudaFree reaches the device -------------- */

static void capture_under(const char *yaml) {
  diag("capture: %s", yaml);
  gmr_runtime_t *rt = sim_runtime(yaml, 4096ull * MiB, 0);
  if (!ok(rt != NULL, "  a runtime")) return;
  gmr_stream_t s1 = (gmr_stream_t)(uintptr_t)0x10, s2 = (gmr_stream_t)(uintptr_t)0x20;
  void *a = NULL, *b = NULL;
  gmr_alloc(rt, 8 * MiB, s1, &a);
  gmr_alloc(rt, 1 * MiB, s1, &b);
  gmr_sim_stream_use(rt, s2, a, 8 * MiB); /* work queued on s2 still reads a */
  gmr_record_stream(rt, a, s2);
  ok(gmr_capture_begin(rt) == 0, "  gmr_capture_begin");
  gmr_sim_counters_t before, after;
  gmr_sim_counters(rt, &before);
  ok(gmr_free(rt, a) == 0 && gmr_free(rt, b) == 0, "  frees during the capture");
  void *c = NULL;
  ok(gmr_alloc(rt, 8 * MiB, s1, &c) == 0, "  an allocation during the capture");
  ok(c != a, "  a block still used by s2 is not reused");
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &after);
  ok(after.event_queries == before.event_queries && after.syncs == before.syncs,
     "  no event query or wait reached the device (%" PRIu64 " -> %" PRIu64 " queries)",
     before.event_queries, after.event_queries);
  ok(after.release_calls == before.release_calls, "  nor any release (%" PRIu64 " -> %" PRIu64 ")",
     before.release_calls, after.release_calls);
  ok(gmr_capture_end(rt) == 0, "  gmr_capture_end");
  ok(gmr_capture_end(rt) == GMR_EINVAL, "  a second end is GMR_EINVAL");
  gmr_sim_stream_complete(rt, s2);
  gmr_free(rt, c);
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &after);
  ok(after.bytes_in_use == 0,
     "  after the capture everything deferred was given back (%" PRIu64 " bytes held)",
     after.bytes_in_use);
  ok(gmr_check(rt) == 0, "  the invariants hold: %s", gmr_last_error(rt));
  gmr_runtime_free(rt);
}

/* ---- the memory fraction ---------------------------------------------------------- */

static void fraction_under(const char *yaml) {
  diag("fraction: %s", yaml);
  gmr_runtime_t *rt = sim_runtime(yaml, 1024ull * MiB, 0);
  if (!ok(rt != NULL, "  a runtime")) return;
  ok(gmr_memory_fraction(rt) == 1.0, "  no fraction at first");
  ok(gmr_set_memory_fraction(rt, 0.0) == GMR_EINVAL &&
         gmr_set_memory_fraction(rt, 1.5) == GMR_EINVAL,
     "  fractions outside (0, 1] are GMR_EINVAL");
  ok(gmr_set_memory_fraction(rt, 0.25) == 0 && gmr_memory_fraction(rt) == 0.25, "  set 0.25");
  void *p = NULL, *q = NULL;
  ok(gmr_alloc(rt, 300 * MiB, NULL, &p) == GMR_ENOMEM && p == NULL,
     "  300 MiB of a 1 GiB device is refused");
  ok(strstr(gmr_last_error(rt), "out of memory") != NULL || strstr(gmr_last_error(rt), "OOM") ||
         strstr(gmr_last_error(rt), "fraction") != NULL,
     "  as out of memory: %.160s", gmr_last_error(rt));
  if (strstr(yaml, "caching") != NULL) {
    gmr_stats_t st;
    memset(&st, 0, sizeof st);
    int rc = gmr_stats(rt, &st);
    ok(rc == 0 && st.ooms == 1 && st.alloc_retries == 1 && st.limit_bytes == 256 * MiB,
       "  caching counts it as PyTorch: one OOM, one retry, limit 256 MiB (%" PRIu64 ", %" PRIu64
       ", %" PRIu64 ")",
       st.ooms, st.alloc_retries, st.limit_bytes);
    ok(strstr(gmr_last_error(rt), "256.00 MiB allowed; Of the allocated memory") != NULL,
       "  and names the fraction in PyTorch's words");
    ok(strstr(gmr_last_error(rt),
              "total capacity of 1024.00 MiB of which 1024.00 MiB is free. 256.00") != NULL,
       "  its free figure is the device's (cudaMemGetInfo's), not what the fraction leaves");
  }
  ok(gmr_alloc(rt, 200 * MiB, NULL, &q) == 0, "  200 MiB fits");
  gmr_pool_t *pool = NULL;
  gmr_pool_create(rt, &pool);
  void *r = NULL;
  ok(gmr_alloc_in(rt, pool, 100 * MiB, NULL, &r) == GMR_ENOMEM,
     "  the fraction holds the pools too (100 MiB more refused)");
  ok(gmr_set_memory_fraction(rt, 1.0) == 0 && gmr_alloc(rt, 300 * MiB, NULL, &p) == 0,
     "  1.0 lifts it");
  gmr_free(rt, p);
  gmr_free(rt, q);
  gmr_pool_release(pool);
  gmr_runtime_free(rt);
}

/* ---- segments and the history observer ------------------------------------------------ */

typedef struct seen_s {
  int alloc, free_requested, segment_alloc;
} seen_t;

static void observe_cb(const gmr_history_event_t *ev, void *ud) {
  seen_t *s = ud;
  s->alloc += ev->action == GMR_HISTORY_ALLOC;
  s->free_requested += ev->action == GMR_HISTORY_FREE_REQUESTED;
  s->segment_alloc += ev->action == GMR_HISTORY_SEGMENT_ALLOC;
}

static void observe_and_segments(void) {
  gmr_runtime_t *rt = sim_runtime("policy: caching\n", 1024ull * MiB, 0);
  if (!ok(rt != NULL, "a caching runtime")) return;
  seen_t seen = {0, 0, 0};
  ok(gmr_history_observe(rt, observe_cb, &seen) == 0, "gmr_history_observe");
  void *p = NULL, *q = NULL;
  gmr_alloc(rt, 5 * MiB, NULL, &p);
  gmr_pool_t *pool = NULL;
  gmr_pool_create(rt, &pool);
  gmr_alloc_in(rt, pool, 1000, NULL, &q);
  gmr_free(rt, p);
  ok(seen.alloc == 2 && seen.free_requested == 1 && seen.segment_alloc == 2,
     "the observer saw 2 allocs (one in a pool), 1 free, 2 segments (%d, %d, %d)", seen.alloc,
     seen.free_requested, seen.segment_alloc);
  gmr_segment_info_t si;
  ok(gmr_segment_of(rt, (char *)q + 10, &si) == 0 && si.base <= (uintptr_t)q &&
         (uintptr_t)q < si.base + si.size && si.pool_id == gmr_pool_id(pool),
     "gmr_segment_of an interior pointer of a pool block: its segment, with the pool's id");
  int x;
  ok(gmr_segment_of(rt, &x, &si) == GMR_EBADPTR, "a host pointer is in no segment");
  ok(gmr_history_observe(rt, NULL, NULL) == 0, "stop observing");
  gmr_free(rt, q);
  ok(seen.free_requested == 1, "no call after it stopped");
  gmr_pool_release(pool);
  gmr_runtime_free(rt);
}

/* ---- out of memory: the other pools' caches go back first --------------------------- */

static void oom_trims_others(const char *yaml) {
  gmr_runtime_t *rt = sim_runtime(yaml, 1024ull * MiB, 0);
  if (!ok(rt != NULL, "oom: %s", yaml)) return;
  void *p = NULL, *q = NULL;
  gmr_alloc(rt, 600 * MiB, NULL, &p);
  gmr_free(rt, p); /* cached by the default pool */
  gmr_pool_t *pool = NULL;
  gmr_pool_create(rt, &pool);
  ok(gmr_alloc_in(rt, pool, 600 * MiB, NULL, &q) == 0,
     "  a pool's request that needs the default pool's cache gets it");
  gmr_free(rt, q); /* cached by the pool, which is then released */
  gmr_pool_release(pool);
  ok(gmr_alloc(rt, 600 * MiB, NULL, &p) == 0,
     "  and the default pool's request gets a released pool's cache");
  gmr_free(rt, p);
  gmr_runtime_free(rt);
}

/* A failed allocation beside a pool that has nothing to give back counts one
 * retry and one OOM, as PyTorch's does (runtime.c Note [One retry]). */
static void oom_counts_once(void) {
  gmr_runtime_t *rt = sim_runtime("policy: caching\n", 1024ull * MiB, 0);
  if (!ok(rt != NULL, "one retry: a caching runtime")) return;
  gmr_pool_t *pool = NULL;
  void *p = NULL, *q = NULL, *r = NULL;
  gmr_pool_create(rt, &pool);
  ok(gmr_alloc_in(rt, pool, MiB, NULL, &p) == 0, "  a live block in a pool in use");
  ok(gmr_alloc(rt, 300 * MiB, NULL, &r) == 0, "  300 MiB live in the default pool");
  ok(gmr_alloc(rt, 800 * MiB, NULL, &q) == GMR_ENOMEM, "  800 MiB more of a 1 GiB device fails");
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  int rc = gmr_stats(rt, &st);
  ok(rc == 0 && st.ooms == 1 && st.alloc_retries == 1,
     "  counted as one OOM and one retry (ooms %" PRIu64 ", retries %" PRIu64 ")", st.ooms,
     st.alloc_retries);
  gmr_free(rt, p);
  gmr_free(rt, r);
  gmr_pool_release(pool);
  gmr_runtime_free(rt);
}

/* A closed pool's accumulated counts stay in its runtime's (runtime.c Note
 * [Retired pools]), as a private pool's stay in PyTorch's device statistics. */
static void retired_counts(const char *yaml, const char *key) {
  gmr_runtime_t *rt = sim_runtime(yaml, 1024ull * MiB, 0);
  if (!ok(rt != NULL, "retired pools: %s", yaml)) return;
  gmr_pool_t *pool = NULL;
  void *p[3] = {0}, *q = NULL;
  gmr_pool_create(rt, &pool);
  gmr_alloc(rt, 5 * MiB, NULL, &q);
  for (int i = 0; i < 3; ++i)
    gmr_alloc_in(rt, pool, (size_t)(i + 1) * 3 * MiB, NULL, &p[i]);
  for (int i = 0; i < 3; ++i)
    gmr_free(rt, p[i]);
  gmr_stats_t live, after;
  int64_t named_live = -1, named_after = -2;
  gmr_stats(rt, &live);
  gmr_stat_get(rt, key, &named_live);
  gmr_pool_release(pool);
  ok(gmr_empty_cache(rt) == 0, "  the released pool closes at empty_cache");
  gmr_stats(rt, &after);
  gmr_stat_get(rt, key, &named_after);
  ok(live.num_allocs == 4 && after.num_allocs == 4 && after.num_frees == 3,
     "  num_allocs %" PRIu64 " -> %" PRIu64 ", num_frees %" PRIu64, live.num_allocs,
     after.num_allocs, after.num_frees);
  ok(after.device_allocs == live.device_allocs && after.device_allocs >= 2,
     "  device_allocs %" PRIu64 " -> %" PRIu64, live.device_allocs, after.device_allocs);
  ok(named_live > 0 && named_after == named_live, "  %s %" PRId64 " -> %" PRId64, key, named_live,
     named_after);
  gmr_stats_reset_accumulated(rt);
  gmr_stats(rt, &after);
  ok(after.num_allocs == 0 && after.device_allocs == 0, "  and reset_accumulated clears them");
  gmr_free(rt, q);
  gmr_runtime_free(rt);
}

/* ---- threads: pools and the default pool at once ------------------------------------- */

typedef struct worker_s {
  gmr_runtime_t *rt;
  gmr_pool_t *pool;
  int id, failures;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  gmr_stream_t s = (gmr_stream_t)(uintptr_t)(0x100 + w->id);
  void *held[16] = {0};
  for (int i = 0; i < 4000; ++i) {
    int k = i % 16;
    if (held[k] != NULL && gmr_free(w->rt, held[k]) != 0) ++w->failures;
    held[k] = NULL;
    size_t size = 512u * (size_t)(1 + (i * 7 + w->id) % 300);
    int rc = (w->id & 1) ? gmr_alloc_in(w->rt, w->pool, size, s, &held[k])
                         : gmr_alloc(w->rt, size, s, &held[k]);
    if (rc != 0) ++w->failures;
    gmr_pool_t *of = NULL;
    if (rc == 0 && (gmr_pool_of(w->rt, held[k], &of) != 0 || of != ((w->id & 1) ? w->pool : NULL)))
      ++w->failures;
  }
  for (int k = 0; k < 16; ++k)
    if (held[k] != NULL && gmr_free(w->rt, held[k]) != 0) ++w->failures;
  return NULL;
}

static void threads_under(const char *yaml) {
  gmr_runtime_t *rt = sim_runtime(yaml, 4096ull * MiB, 0);
  if (!ok(rt != NULL, "threads: %s", yaml)) return;
  gmr_pool_t *pool = NULL;
  gmr_pool_create(rt, &pool);
  pthread_t t[4];
  worker_t w[4];
  for (int i = 0; i < 4; ++i) {
    w[i] = (worker_t){rt, pool, i, 0};
    pthread_create(&t[i], NULL, worker, &w[i]);
  }
  gmr_stats_t st;
  for (int i = 0; i < 200; ++i)
    gmr_stats(rt, &st);
  int failures = 0;
  for (int i = 0; i < 4; ++i) {
    pthread_join(t[i], NULL);
    failures += w[i].failures;
  }
  ok(failures == 0, "  4 threads, two in a pool: every call right (%d wrong)", failures);
  ok(gmr_check(rt) == 0, "  the invariants hold: %s", gmr_last_error(rt));
  gmr_pool_release(pool);
  gmr_empty_cache(rt);
  gmr_stats(rt, &st);
  ok(st.allocations == 0 && st.reserved_bytes == 0, "  all given back");
  gmr_runtime_free(rt);
}

/* A fraction set while threads allocate and free (caching with a GC
 * threshold switches every allocation to the global path then, quiesced):
 * nothing is lost, the invariants hold (run under TSan too). */
typedef struct churn_s {
  gmr_runtime_t *rt;
  int errors;
} churn_t;

static void *churn(void *arg) {
  churn_t *c = arg;
  for (int i = 0; i < 2000; ++i) {
    void *p = NULL;
    size_t n = (size_t)(1 + (i * 7919) % 4096) * 1024;
    if (gmr_alloc(c->rt, n, GMR_SIM_STREAM(0), &p) != 0 || gmr_free(c->rt, p) != 0) ++c->errors;
  }
  return NULL;
}

static void fraction_while_threads(void) {
  gmr_runtime_t *rt =
      sim_runtime("policy: {name: caching, garbage_collection_threshold: 0.5}\n", 1024 * MiB, 0);
  if (!ok(rt != NULL, "a caching runtime with a GC threshold")) return;
  pthread_t t[4];
  churn_t c[4];
  for (int i = 0; i < 4; ++i) {
    c[i] = (churn_t){rt, 0};
    pthread_create(&t[i], NULL, churn, &c[i]);
  }
  int rc = gmr_set_memory_fraction(rt, 0.5);
  int errors = 0;
  for (int i = 0; i < 4; ++i) {
    pthread_join(t[i], NULL);
    errors += c[i].errors;
  }
  ok(rc == 0 && errors == 0, "  the fraction set while 4 threads allocate: every call served");
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  ok(gmr_stats(rt, &st) == 0 && st.allocated_bytes == 0 && gmr_check(rt) == 0,
     "  nothing left allocated, the invariants hold");
  gmr_runtime_free(rt);
}

int main(void) {
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; ++i)
    pools_under(policies[i]);
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; ++i)
    capture_under(policies[i]);
  fraction_under("policy: caching\n");
  fraction_under("policy: stitch\n");
  fraction_under("policy: bfc\n");
  observe_and_segments();
  oom_trims_others("policy: caching\n");
  /* Not bfc: like TensorFlow's, a bfc instance's limit is the device's free
   * memory when it is made, so a pool made beside a full cache has less. */
  oom_trims_others("policy: stitch\n");
  oom_counts_once();
  retired_counts("policy: caching\n", "allocation.all.allocated");
  retired_counts("policy: caching\n", "num_device_alloc");
  retired_counts("policy: stitch\n", "stitch.pages.created");
  retired_counts("policy: bfc\n", "num_allocs");
  threads_under("policy: caching\n");
  threads_under("policy: stitch\n");
  threads_under("policy: bfc\n");
  fraction_while_threads();
  return done_testing();
}
