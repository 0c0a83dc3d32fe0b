/* sleep-wake.c: tags, sleep and wake (docs/sleep-wake.md) on the host-backed
 * simulator, under every policy: contents kept bit for bit across 100
 * offload cycles at the same addresses, discard, sleeping and waking twice,
 * allocations and frees while asleep, a wake refused when the memory is not
 * there (with its sentence), the caps and the shared cap, a fault sweep
 * that fails each device call of a sleep and of a wake in turn, and nothing
 * left on the device at the end. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "sim-runtime.h"

#define MiB (1024ull * 1024ull)

static const char *const policies[] = {
    "policy: stitch\n",
    "policy: {name: caching, pytorch_alloc_conf: \"expandable_segments:True\"}\n",
    "policy: caching\n",
    "policy: bfc\n",
    "policy: direct\n",
    "policy: {name: limit, bytes: 1GiB, counts: reserved, upstream: caching}\n",
};

enum { NBLK = 6 };
static const size_t sizes[NBLK] = {512, 4096, 100000, 1 * MiB + 3, 2 * MiB + 5, 5 * MiB + 4096};

static uint64_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
  return x;
}

/* The bytes of a block: word i is mix(seed + i), the tail its low bytes. */
static void fill(void *p, size_t n, uint64_t seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n / 8; ++i) {
    uint64_t w = mix(seed + i);
    memcpy(b + 8 * i, &w, 8);
  }
  uint64_t w = mix(seed + n / 8);
  memcpy(b + n / 8 * 8, &w, n % 8);
}

static bool same(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  uint64_t w, got;
  for (size_t i = 0; i < n / 8; ++i) {
    w = mix(seed + i);
    memcpy(&got, b + 8 * i, 8);
    if (got != w) return false;
  }
  w = mix(seed + n / 8);
  return memcmp(b + n / 8 * 8, &w, n % 8) == 0;
}

static uint64_t in_use(gmr_runtime_t *rt) {
  gmr_sim_counters_t c;
  gmr_sim_counters(rt, &c);
  return c.bytes_in_use;
}

static gmr_tag_info_t info(gmr_runtime_t *rt, const char *tag) {
  gmr_tag_info_t t;
  memset(&t, 0, sizeof t);
  if (gmr_tag_info(rt, tag, &t) != 0) diag("gmr_tag_info: %s", gmr_thread_last_error());
  return t;
}

/* NBLK blocks in tag `tag`, filled; false on a failure. */
static bool alloc_tagged(gmr_runtime_t *rt, const char *tag, void **p) {
  if (gmr_region_begin(rt, tag) != 0) {
    diag("region: %s", gmr_thread_last_error());
    return false;
  }
  bool good = true;
  for (int i = 0; i < NBLK && good; ++i) {
    good = gmr_alloc(rt, sizes[i], GMR_SIM_STREAM(0), &p[i]) == 0;
    if (!good) diag("alloc: %s", gmr_thread_last_error());
    if (good) fill(p[i], sizes[i], (uint64_t)i * 7919);
  }
  gmr_region_end(rt);
  return good;
}

static bool all_same(void **p) {
  for (int i = 0; i < NBLK; ++i)
    if (!same(p[i], sizes[i], (uint64_t)i * 7919)) return false;
  return true;
}

static void free_all(gmr_runtime_t *rt, void **p) {
  for (int i = 0; i < NBLK; ++i)
    gmr_free(rt, p[i]);
}

/* `cycles` offload cycles: same addresses, same bytes, gmr_check passing,
 * the device's memory going and coming back. */
static void cycles_under(const char *yaml, int cycles) {
  diag("%s", yaml);
  gmr_runtime_t *rt = sim_runtime(yaml, 2048 * MiB, 1);
  if (!ok(rt != NULL, "  a host-backed runtime")) return;
  void *p[NBLK], *other = NULL;
  bool good = alloc_tagged(rt, "weights", p);
  ok(good, "  blocks allocated inside the region");
  good = good && gmr_alloc(rt, 5 * MiB, GMR_SIM_STREAM(0), &other) == 0;
  if (good) fill(other, 5 * MiB, 42);
  gmr_pool_t *pool = NULL;
  ok(good && gmr_pool_of(rt, p[0], &pool) == 0 && pool != NULL &&
         gmr_pool_id(pool) == info(rt, "weights").pool_id,
     "  a block of the region is in the tag's pool");
  gmr_pool_t *none = (gmr_pool_t *)1;
  ok(good && gmr_pool_of(rt, other, &none) == 0 && none == NULL,
     "  a block outside the region is not");
  if (!good) {
    gmr_runtime_free(rt);
    return;
  }
  uint64_t before = in_use(rt);
  bool kept = true, checked = true, freed = true, same_figures = true;
  uint64_t sleeping = 0;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    if (gmr_sleep(rt, "weights", GMR_SLEEP_OFFLOAD) != 0) {
      diag("sleep: %s", gmr_thread_last_error());
      kept = false;
      break;
    }
    gmr_tag_info_t t = info(rt, "weights");
    if (cycle == 0) sleeping = t.sleeping_bytes;
    same_figures &= t.asleep == 1 && t.mode == GMR_SLEEP_OFFLOAD && t.mapped_bytes == 0 &&
                    t.sleeping_bytes == sleeping && t.offloaded_bytes > 0;
    freed &= in_use(rt) + sleeping <= before && sleeping > 0;
    checked &= gmr_check(rt) == 0;
    if (gmr_wake(rt, "weights") != 0) {
      diag("wake: %s", gmr_thread_last_error());
      kept = false;
      break;
    }
    t = info(rt, "weights");
    same_figures &= t.asleep == 0 && t.sleeping_bytes == 0 && t.offloaded_bytes == 0;
    checked &= gmr_check(rt) == 0;
    kept &= all_same(p) && same(other, 5 * MiB, 42);
    if (!kept) diag("contents differ after cycle %d", cycle);
    if (!kept) break;
  }
  ok(kept, "  contents kept bit for bit across %d sleep/wake cycles", cycles);
  ok(checked, "  gmr_check passes asleep and awake");
  ok(freed, "  sleep gives the tag's device memory back (%" PRIu64 " bytes)", sleeping);
  ok(same_figures, "  gmr_tag_info follows the states");
  is_u64(in_use(rt), before, "  wake takes exactly as much again");
  int64_t v = -1;
  ok(gmr_stat_get(rt, "tag.weights.mapped_bytes", &v) == 0 && v > 0,
     "  gmr_stats_foreach lists the tag's bytes");
  free_all(rt, p);
  gmr_free(rt, other);
  gmr_empty_cache(rt);
  is_u64(in_use(rt), 0, "  nothing left on the device once freed and emptied");
  ok(gmr_check(rt) == 0, "  gmr_check at the end");
  gmr_runtime_free(rt);
}

static void states(void) {
  diag("states: discard, twice, allocations and frees while asleep");
  gmr_runtime_t *rt = sim_runtime(policies[1], 1024 * MiB, 1);
  if (!ok(rt != NULL, "  a runtime")) return;
  void *p[NBLK];
  if (!alloc_tagged(rt, "kv", p)) {
    gmr_runtime_free(rt);
    return;
  }
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_DISCARD) == 0, "  sleep with discard");
  gmr_tag_info_t t = info(rt, "kv");
  ok(t.asleep && t.offloaded_bytes == 0 && t.mode == GMR_SLEEP_DISCARD,
     "  discard keeps no host copy");
  is_int(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD), 0, "  a second sleep does nothing");
  ok(info(rt, "kv").sleeps == 1 && info(rt, "kv").mode == GMR_SLEEP_DISCARD,
     "  ... and changes nothing");
  void *q = NULL;
  gmr_region_begin(rt, "kv");
  is_int(gmr_alloc(rt, 4096, GMR_SIM_STREAM(0), &q), GMR_EBUSY,
         "  an allocation in a sleeping tag is refused");
  like(gmr_thread_last_error(), "is asleep", "  ... with a sentence");
  gmr_region_end(rt);
  is_int(gmr_free(rt, p[2]), 0, "  a free while asleep is accepted");
  is_int(gmr_free(rt, p[2]), GMR_EBADPTR, "  a second free of it is a double free");
  ok(gmr_check(rt) == 0, "  gmr_check while asleep");
  ok(gmr_wake(rt, "kv") == 0, "  wake after discard");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocations, NBLK - 1, "  the free made while asleep is made at the wake");
  is_int(gmr_wake(rt, "kv"), 0, "  a second wake does nothing");
  is_u64(info(rt, "kv").wakes, 1, "  ... and changes nothing");
  fill(p[0], sizes[0], 1);
  ok(same(p[0], sizes[0], 1), "  woken memory is writable");
  is_int(gmr_sleep(rt, "nope", GMR_SLEEP_OFFLOAD), GMR_EINVAL, "  an unknown tag is refused");
  like(gmr_thread_last_error(), "no tag 'nope'", "  ... by name");
  is_int(gmr_sleep(rt, "kv", 3), GMR_EINVAL, "  a bad mode is refused");
  is_int(gmr_region_end(rt), GMR_EINVAL, "  gmr_region_end without a region");
  /* Nesting: the innermost region wins. */
  gmr_region_begin(rt, "a");
  gmr_region_begin(rt, "b");
  is_str(gmr_region_current(rt), "b", "  the innermost region is current");
  void *in_b = NULL, *in_a = NULL;
  gmr_alloc(rt, 1000, GMR_SIM_STREAM(0), &in_b);
  gmr_region_end(rt);
  gmr_alloc(rt, 1000, GMR_SIM_STREAM(0), &in_a);
  gmr_region_end(rt);
  ok(gmr_region_current(rt) == NULL, "  no region once both end");
  gmr_pool_t *pa = NULL, *pb = NULL;
  gmr_pool_of(rt, in_a, &pa);
  gmr_pool_of(rt, in_b, &pb);
  ok(pa != NULL && pb != NULL && gmr_pool_id(pa) == info(rt, "a").pool_id &&
         gmr_pool_id(pb) == info(rt, "b").pool_id,
     "  nested regions tag their own blocks");
  gmr_free(rt, in_a);
  gmr_free(rt, in_b);
  /* A runtime freed with a tag asleep gives everything back. */
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD) == 0, "  asleep again");
  gmr_runtime_free(rt); /* ASan: no host copy leaks */
  ok(1, "  a runtime freed with a sleeping tag");
}

/* A wake that does not fit is refused before any device call. */
static void short_memory(void) {
  diag("wake refused when the memory is short");
  gmr_runtime_t *rt = sim_runtime(policies[1], 256 * MiB, 1);
  if (!ok(rt != NULL, "  a runtime")) return;
  void *p[NBLK], *big = NULL;
  if (!alloc_tagged(rt, "w", p)) {
    gmr_runtime_free(rt);
    return;
  }
  ok(gmr_sleep(rt, "w", GMR_SLEEP_OFFLOAD) == 0, "  asleep");
  int rc = gmr_alloc(rt, 240 * MiB, GMR_SIM_STREAM(0), &big);
  ok(rc == 0, "  another allocation takes the memory it gave back");
  gmr_sim_counters_t c0, c1;
  gmr_sim_counters(rt, &c0);
  is_int(gmr_wake(rt, "w"), GMR_ENOMEM, "  wake is refused");
  like(gmr_thread_last_error(), "needs", "  ... saying what it needs");
  like(gmr_thread_last_error(), "are free after emptying the caches", "  ... and what is free");
  gmr_sim_counters(rt, &c1);
  ok(c1.map_calls == c0.map_calls && c1.reserve_failures == c0.reserve_failures,
     "  ... with no device call tried");
  ok(info(rt, "w").asleep && gmr_check(rt) == 0, "  the tag sleeps on, consistent");
  gmr_free(rt, big); /* cached, not given back: wake must empty the cache */
  ok(gmr_wake(rt, "w") == 0, "  wake empties the caches to make room");
  ok(all_same(p), "  contents back");
  free_all(rt, p);
  gmr_empty_cache(rt);
  is_u64(in_use(rt), 0, "  nothing left");
  gmr_runtime_free(rt);
}

/* The limit's cap and the shared cap count sleeping memory as free. */
static void caps(void) {
  diag("caps: the limit and the shared cap");
  char path[256], yaml[1024];
  snprintf(path, sizeof path, "/tmp/gmr-sleep-cap-%d", (int)getpid());
  unlink(path);
  snprintf(yaml, sizeof yaml,
           "policy: {name: limit, bytes: 192MiB, counts: reserved, shared: {cap: 192MiB, "
           "path: %s}, upstream: {name: caching, pytorch_alloc_conf: "
           "\"expandable_segments:True\"}}\n",
           path);
  gmr_runtime_t *a = sim_runtime(yaml, 1024 * MiB, 1);
  gmr_runtime_t *b = sim_runtime(yaml, 1024 * MiB, 1);
  if (!ok(a != NULL && b != NULL, "  two runtimes on one shared cap")) {
    gmr_runtime_free(a);
    gmr_runtime_free(b);
    return;
  }
  void *p[NBLK], *x = NULL;
  ok(alloc_tagged(a, "m", p), "  a's tag allocated");
  gmr_shared_cap_info_t si0, si1;
  size_t n;
  gmr_shared_cap_read(path, &si0, NULL, 0, &n);
  ok(gmr_sleep(a, "m", GMR_SLEEP_OFFLOAD) == 0, "  a's tag asleep");
  gmr_shared_cap_read(path, &si1, NULL, 0, &n);
  uint64_t sleeping = info(a, "m").sleeping_bytes;
  is_u64(si0.held - si1.held, sleeping, "  the shared cap counts sleeping memory as free");
  ok(gmr_alloc(b, 192 * MiB - sleeping + 2 * MiB, GMR_SIM_STREAM(0), &x) == 0,
     "  so b can take it");
  is_int(gmr_wake(a, "m"), GMR_ENOMEM, "  a's wake is refused while b holds it");
  like(gmr_thread_last_error(), "out of memory", "  ... with the cap's sentence");
  ok(info(a, "m").asleep && gmr_check(a) == 0, "  a's tag sleeps on, consistent");
  gmr_free(b, x);
  gmr_empty_cache(b);
  ok(gmr_wake(a, "m") == 0, "  a wakes once b gave it back");
  gmr_shared_cap_info_t si2;
  gmr_shared_cap_read(path, &si2, NULL, 0, &n);
  is_u64(si2.held, si0.held, "  the wake charges it again");
  ok(all_same(p), "  contents back");
  free_all(a, p);
  gmr_empty_cache(a);
  ok(gmr_check(a) == 0, "  gmr_check at the end");
  gmr_runtime_free(a);
  gmr_runtime_free(b);
  unlink(path);
}

/* One case of the sweep: fail the k-th device call of a sleep (in_wake 0)
 * or of a wake (1).  *fired: a call failed.  Every case ends with a
 * passing gmr_check, the contents back after a clean wake, and nothing left
 * on the device once everything is freed. */
static bool sweep_case(const char *yaml, uint64_t k, int in_wake, bool *fired) {
  *fired = false;
  gmr_runtime_t *rt = sim_runtime(yaml, 1024 * MiB, 1);
  void *p[NBLK];
  if (rt == NULL || !alloc_tagged(rt, "t", p)) {
    gmr_runtime_free(rt);
    return false;
  }
  bool good = true;
  gmr_sim_counters_t c;
  if (in_wake) good &= gmr_sleep(rt, "t", GMR_SLEEP_OFFLOAD) == 0;
  gmr_sim_fail_nth(rt, k);
  int rc = in_wake ? gmr_wake(rt, "t") : gmr_sleep(rt, "t", GMR_SLEEP_OFFLOAD);
  gmr_sim_fail_nth(rt, 0);
  if (rc != 0) {
    *fired = true;
    gmr_tag_info_t t = info(rt, "t");
    gmr_sim_counters(rt, &c);
    /* A refused sleep changed nothing; a refused wake left all asleep. */
    good &= rc == GMR_ENOMEM && gmr_check(rt) == 0;
    good &= in_wake ? t.asleep && t.mapped_bytes == 0 && c.pages_live == 0 && c.page_maps_live == 0
                    : !t.asleep && t.offloaded_bytes == 0 && all_same(p);
    like(gmr_thread_last_error(), in_wake ? "gmr_wake" : "gmr_sleep",
         "    k=%" PRIu64 ": the %s's error names it", k, in_wake ? "wake" : "sleep");
    if (!good) diag("  k=%" PRIu64 ": failed with %d: %s", k, rc, gmr_thread_last_error());
    if (!in_wake) good &= gmr_sleep(rt, "t", GMR_SLEEP_OFFLOAD) == 0;
  }
  good &= gmr_wake(rt, "t") == 0 && all_same(p) && gmr_check(rt) == 0;
  free_all(rt, p);
  gmr_empty_cache(rt);
  gmr_sim_counters(rt, &c);
  good &= in_use(rt) == 0 && c.pages_live == 0 && c.page_maps_live == 0;
  if (!good) diag("  k=%" PRIu64 " (%s) broke something", k, in_wake ? "wake" : "sleep");
  gmr_runtime_free(rt);
  return good;
}

static void sweep_under(const char *yaml) {
  diag("fault sweep: %s", yaml);
  for (int in_wake = 0; in_wake < 2; ++in_wake) {
    bool all_good = true, fired = true;
    int cases = 0;
    for (uint64_t k = 1; fired && k < 400; ++k) {
      all_good &= sweep_case(yaml, k, in_wake, &fired);
      cases += fired;
    }
    ok(all_good && cases >= 2,
       "  each of the %d device calls of a %s failed in turn: refused cleanly, contents kept, "
       "nothing leaked",
       cases, in_wake ? "wake" : "sleep");
  }
}

/* Regions are per thread: two threads, two tags, one runtime. */
typedef struct region_thread_s {
  gmr_runtime_t *rt;
  const char *tag;
  void *p[64];
  int failures;
} region_thread_t;

static void *region_thread(void *ud) {
  region_thread_t *t = ud;
  if (gmr_region_begin(t->rt, t->tag) != 0) ++t->failures;
  for (int i = 0; i < 64; ++i) {
    if (gmr_alloc(t->rt, 1000 + 4096 * (size_t)i, GMR_SIM_STREAM(0), &t->p[i]) != 0) {
      t->p[i] = NULL;
      ++t->failures;
    }
    if (strcmp(gmr_region_current(t->rt), t->tag) != 0) ++t->failures;
  }
  gmr_region_end(t->rt);
  return NULL;
}

static void threads_and_graphs(void) {
  diag("regions on two threads; a graph's pool routed into a tag");
  gmr_runtime_t *rt = sim_runtime(policies[0], 1024 * MiB, 1);
  if (!ok(rt != NULL, "  a runtime")) return;
  region_thread_t t[2] = {{.rt = rt, .tag = "left"}, {.rt = rt, .tag = "right"}};
  pthread_t th[2];
  for (int i = 0; i < 2; ++i)
    pthread_create(&th[i], NULL, region_thread, &t[i]);
  for (int i = 0; i < 2; ++i)
    pthread_join(th[i], NULL);
  int misplaced = 0;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 64; ++k) {
      gmr_pool_t *pool = NULL;
      if (t[i].p[k] == NULL || gmr_pool_of(rt, t[i].p[k], &pool) != 0 || pool == NULL ||
          gmr_pool_id(pool) != info(rt, t[i].tag).pool_id)
        ++misplaced;
    }
  ok(t[0].failures == 0 && t[1].failures == 0 && misplaced == 0,
     "  each thread's blocks are in its own tag (%d misplaced)", misplaced);
  ok(gmr_region_current(rt) == NULL, "  the main thread has no region");
  ok(gmr_sleep(rt, "left", GMR_SLEEP_OFFLOAD) == 0 && !info(rt, "right").asleep,
     "  one tag sleeps, the other stays awake");
  ok(gmr_wake(rt, "left") == 0 && gmr_check(rt) == 0, "  and wakes");
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 64; ++k)
      gmr_free(rt, t[i].p[k]);
  /* A CUDA graph's allocations, routed to the tag's pool during capture. */
  gmr_pool_t *tp = NULL;
  ok(gmr_tag_pool(rt, "graph", &tp) == 0 && gmr_pool_id(tp) == info(rt, "graph").pool_id,
     "  gmr_tag_pool gives the tag's pool");
  void *g = NULL;
  gmr_capture_begin(rt);
  gmr_pool_begin(tp, GMR_SIM_STREAM(5));
  int rc = gmr_alloc(rt, 3 * MiB, GMR_SIM_STREAM(5), &g);
  gmr_pool_end(tp, GMR_SIM_STREAM(5));
  is_int(gmr_sleep(rt, "graph", GMR_SLEEP_OFFLOAD), GMR_EBUSY, "  no sleep during a capture");
  gmr_capture_end(rt);
  ok(rc == 0, "  a captured allocation in the tag");
  if (rc == 0) fill(g, 3 * MiB, 99);
  ok(gmr_sleep(rt, "graph", GMR_SLEEP_OFFLOAD) == 0 && gmr_wake(rt, "graph") == 0 && rc == 0 &&
         same(g, 3 * MiB, 99),
     "  the graph's memory sleeps and wakes with its contents");
  gmr_free(rt, g);
  gmr_empty_cache(rt);
  is_u64(in_use(rt), 0, "  nothing left");
  gmr_runtime_free(rt);
}

/* GMR_SLEEP_KEEP_HOST (Note [Keeping the host buffer]): the wake keeps
 * the pinned buffer and the next sleep copies into it with no host
 * allocation (its first failing call is then a copy, not an allocation); a
 * sleep without the flag uses it once and its wake gives it back; a discard
 * gives it back at once. */
/* Note [Runs of ranges]: a block stitched from 5 pages is 5 page ranges
 * side by side; the wake sets their access in one call, not one a range. */
static void wake_by_runs(void) {
  diag("a wake sets access by runs of ranges");
  gmr_runtime_t *rt = sim_runtime(policies[0], 256 * MiB, 1);
  if (!ok(rt != NULL, "  a host-backed stitch runtime")) return;
  void *p = NULL;
  size_t n = 9 * MiB + 4096;
  int rc = gmr_region_begin(rt, "w");
  if (rc == 0) rc = gmr_alloc(rt, n, GMR_SIM_STREAM(0), &p);
  gmr_region_end(rt);
  if (!ok(rc == 0, "  9 MiB in a tag: 5 pages")) {
    gmr_runtime_free(rt);
    return;
  }
  fill(p, n, 99);
  gmr_sim_counters_t k0, k1;
  rc = gmr_sleep(rt, "w", GMR_SLEEP_OFFLOAD);
  gmr_sim_counters(rt, &k0);
  rc |= gmr_wake(rt, "w");
  gmr_sim_counters(rt, &k1);
  ok(rc == 0 && k1.page_map_calls - k0.page_map_calls == 5 &&
         k1.set_access_calls - k0.set_access_calls == 1,
     "  5 page maps, one set-access call (%llu, %llu)",
     (unsigned long long)(k1.page_map_calls - k0.page_map_calls),
     (unsigned long long)(k1.set_access_calls - k0.set_access_calls));
  ok(same(p, n, 99) && gmr_check(rt) == 0, "  the contents back, the invariants hold");
  gmr_free(rt, p);
  gmr_runtime_free(rt);
}

static void keep_host(void) {
  diag("keeping the host buffer between cycles");
  gmr_runtime_t *rt = sim_runtime(policies[0], 1024 * MiB, 1);
  if (!ok(rt != NULL, "  a runtime")) return;
  void *p[NBLK];
  if (!alloc_tagged(rt, "kv", p)) {
    gmr_runtime_free(rt);
    return;
  }
  uint64_t want = 0;
  for (int i = 0; i < NBLK; ++i)
    want += sizes[i];
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_DISCARD | GMR_SLEEP_KEEP_HOST) == GMR_EINVAL &&
         !info(rt, "kv").asleep,
     "  keep-host with discard is refused, nothing done");
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) == 0 &&
         info(rt, "kv").mode == GMR_SLEEP_OFFLOAD && info(rt, "kv").host_kept_bytes == 0,
     "  a sleep keeping the host buffer: its mode is offload, nothing kept while asleep");
  ok(gmr_wake(rt, "kv") == 0 && all_same(p), "  woken, contents kept");
  uint64_t kept = info(rt, "kv").host_kept_bytes;
  ok(kept >= want && info(rt, "kv").offloaded_bytes == 0,
     "  the wake kept the buffer (%" PRIu64 " bytes for %" PRIu64 ")", kept, want);
  ok(gmr_check(rt) == 0, "  gmr_check with a kept buffer");
  for (int i = 0; i < 3; ++i)
    ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) == 0 &&
           gmr_wake(rt, "kv") == 0 && all_same(p) && info(rt, "kv").host_kept_bytes == kept,
       "  cycle %d through the same buffer, contents kept", i + 1);
  gmr_sim_fail_nth(rt, 1);
  int rc = gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST);
  const char *why = gmr_thread_last_error();
  ok(rc == GMR_ENOMEM && strstr(why, "copy to the host") != NULL &&
         strstr(why, "pinned host allocation") == NULL,
     "  the next sleep allocates no host memory: its first device call is a copy (%s)", why);
  gmr_sim_fail_nth(rt, 0);
  ok(!info(rt, "kv").asleep && info(rt, "kv").host_kept_bytes == 0 && all_same(p) &&
         gmr_check(rt) == 0,
     "  after that failed sleep the tag is awake, contents in place, the buffer given back");
  gmr_sim_fail_nth(rt, 1);
  rc = gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD);
  ok(rc == GMR_ENOMEM && strstr(gmr_thread_last_error(), "pinned host allocation") != NULL,
     "  with nothing kept, a sleep's first device call is the host allocation");
  gmr_sim_fail_nth(rt, 0);
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) == 0 && gmr_wake(rt, "kv") == 0 &&
         info(rt, "kv").host_kept_bytes > 0,
     "  kept again");
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD) == 0 && gmr_wake(rt, "kv") == 0 && all_same(p) &&
         info(rt, "kv").host_kept_bytes == 0,
     "  a sleep without the flag uses the buffer once; its wake gives it back");
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) == 0 && gmr_wake(rt, "kv") == 0 &&
         info(rt, "kv").host_kept_bytes > 0 && gmr_sleep(rt, "kv", GMR_SLEEP_DISCARD) == 0 &&
         info(rt, "kv").host_kept_bytes == 0 && gmr_wake(rt, "kv") == 0 && gmr_check(rt) == 0,
     "  a discard gives the kept buffer back");
  ok(gmr_sleep(rt, "kv", GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) == 0 && gmr_wake(rt, "kv") == 0 &&
         info(rt, "kv").host_kept_bytes > 0,
     "  kept at the end: the runtime's free gives it back (a leak checker would say)");
  free_all(rt, p);
  gmr_runtime_free(rt);
}

int main(void) {
  /* 100 cycles where pages are mapped (stitch, expandable segments); the
   * others reserve whole segments (bfc a large region), copied each time. */
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; ++i)
    cycles_under(policies[i], i < 2 ? 100 : 4);
  states();
  keep_host();
  wake_by_runs();
  short_memory();
  caps();
  threads_and_graphs();
  sweep_under(policies[0]);
  sweep_under(policies[1]);
  sweep_under(policies[2]);
  return done_testing();
}
