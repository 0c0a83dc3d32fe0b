/* bfc-random.c: seeded random allocation sequences on the bfc policy.
 *
 * Every allocation is filled with a pattern on the host-backed simulator and
 * verified at free, so two live blocks that overlap are caught at once; the
 * invariant walker (gmr_check: chunks tile their region, no two adjacent
 * free chunks, bins sorted and in their size class, stats add up) runs after
 * every step.  Greedy, growth, coalescing, VMM and a small split cap are
 * covered, then four threads share one runtime, waiting for each other's
 * frees, on one stream and on four (front caches, their give-backs and the
 * byte cap, with flushes by every gmr_check).  The seed is printed;
 * GMR_SEED=<n> replays a run.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Log-uniform sizes from 1 byte to about `max`. */
static size_t random_size(uint64_t *s, size_t max) {
  int bits = 1 + (int)(splitmix(s) % 63);
  size_t cap = (size_t)1 << (bits % 24);
  size_t n = 1 + (size_t)(splitmix(s) % cap);
  return n > max ? max : n;
}

typedef struct live_s {
  unsigned char *p;
  size_t n;
  unsigned char tag;
} live_t;

static void fill(live_t *l) {
  memset(l->p, l->tag, l->n);
}

static int intact(const live_t *l) {
  for (size_t i = 0; i < l->n; ++i)
    if (l->p[i] != l->tag) return 0;
  return 1;
}

static gmr_runtime_t *make(const char *yaml) {
  gmr_config_t *cfg;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    diag("%s", err.message);
    return NULL;
  }
  gmr_runtime_t *rt = NULL;
  gmr_sim_options_t o = {.capacity = 256 * MiB, .granularity = 2 * MiB, .host_backed = 1};
  if (gmr_runtime_new_sim(cfg, &o, &rt) != 0) diag("%s", gmr_last_error(NULL));
  gmr_config_free(cfg);
  return rt;
}

#define MAX_LIVE 512

static void run_single(const char *label, const char *yaml, uint64_t seed, int steps) {
  gmr_runtime_t *rt = make(yaml);
  if (!ok(rt != NULL, "%s: runtime", label)) return;
  static live_t live[MAX_LIVE];
  int n = 0, ooms = 0, allocs = 0, bad_pattern = 0, check_failed = 0;
  uint64_t s = seed;
  for (int step = 0; step < steps && !check_failed; ++step) {
    uint64_t r = splitmix(&s) % 100;
    if (n > 0 && (r < 45 || n == MAX_LIVE)) {
      int i = (int)(splitmix(&s) % (uint64_t)n);
      bad_pattern += !intact(&live[i]);
      gmr_free(rt, live[i].p);
      live[i] = live[--n];
    } else if (r < 98) {
      live_t l = {NULL, random_size(&s, 6 * MiB), (unsigned char)(1 + step % 251)};
      int err = gmr_alloc(rt, l.n, NULL, (void **)&l.p);
      if (err == GMR_ENOMEM) {
        ++ooms;
      } else if (err == 0) {
        ++allocs;
        fill(&l);
        live[n++] = l;
      } else {
        diag("%s: step %d: %s", label, step, gmr_err_name(err));
        check_failed = 1;
      }
    } else {
      gmr_empty_cache(rt);
    }
    if (gmr_check(rt) != 0) {
      diag("%s: step %d: %s", label, step, gmr_last_error(rt));
      check_failed = 1;
    }
  }
  ok(!check_failed, "%s: invariants hold after each of %d steps (%d allocations, %d OOMs)", label,
     steps, allocs, ooms);
  is_int(bad_pattern, 0, "%s: no block was overwritten by another", label);
  while (n > 0) {
    bad_pattern += !intact(&live[n - 1]);
    gmr_free(rt, live[--n].p);
  }
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocated_bytes, 0, "%s: everything freed", label);
  is_int(gmr_check(rt), 0, "%s: invariants hold at the end", label);
  gmr_runtime_free(rt);
}

/* ---- threads ------------------------------------------------------------------ */

typedef struct worker_s {
  gmr_runtime_t *rt;
  uint64_t seed;
  int steps;
  gmr_stream_t stream; /* NULL: every thread on the default stream */
  bool few_sizes;      /* 8 size classes, so freed chunks are reused (front caches) */
  size_t max_size;     /* not few_sizes: log-uniform sizes up to this (0: 2 MiB) */
  int bad_pattern, errors, ooms, check_failed;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  live_t live[64];
  int n = 0;
  uint64_t s = w->seed;
  for (int step = 0; step < w->steps; ++step) {
    if (n > 0 && (splitmix(&s) % 2 == 0 || n == 64)) {
      int i = (int)(splitmix(&s) % (uint64_t)n);
      w->bad_pattern += !intact(&live[i]);
      gmr_free(w->rt, live[i].p);
      live[i] = live[--n];
    } else {
      size_t n_bytes = w->few_sizes ? (1 + splitmix(&s) % 8) * 4096 - splitmix(&s) % 200
                                    : random_size(&s, w->max_size ? w->max_size : 2 * MiB);
      live_t l = {NULL, n_bytes, (unsigned char)(1 + (w->seed + step) % 251)};
      int err = gmr_alloc(w->rt, l.n, w->stream, (void **)&l.p);
      if (err == 0) {
        fill(&l);
        live[n++] = l;
      } else if (err == GMR_ENOMEM) {
        ++w->ooms;
      } else {
        ++w->errors;
      }
    }
    if (step % 128 == 0 && gmr_check(w->rt) != 0) {
      ++w->check_failed;
      diag("check: %s", gmr_last_error(w->rt));
    }
  }
  while (n > 0) {
    w->bad_pattern += !intact(&live[n - 1]);
    gmr_free(w->rt, live[--n].p);
  }
  return NULL;
}

static void run_threads_sized(const char *label, const char *yaml, uint64_t seed, bool streams,
                              bool few_sizes, size_t max_size) {
  gmr_runtime_t *rt = make(yaml);
  if (!ok(rt != NULL, "%s: runtime", label)) return;
  enum { N = 4 };
  worker_t w[N];
  pthread_t th[N];
  for (int i = 0; i < N; ++i) {
    w[i] = (worker_t){.rt = rt,
                      .seed = seed + 1000u * (uint64_t)(i + 1),
                      .steps = 3000,
                      .stream = streams ? GMR_SIM_STREAM(i + 1) : NULL,
                      .few_sizes = few_sizes,
                      .max_size = max_size};
    pthread_create(&th[i], NULL, worker, &w[i]);
  }
  int bad = 0, errors = 0, ooms = 0, checks = 0;
  for (int i = 0; i < N; ++i) {
    pthread_join(th[i], NULL);
    bad += w[i].bad_pattern;
    errors += w[i].errors;
    ooms += w[i].ooms;
    checks += w[i].check_failed;
  }
  is_int(bad, 0, "%s: 4 threads, no block overwritten", label);
  is_int(errors, 0, "%s: no error other than OOM (%d OOMs)", label, ooms);
  is_int(checks, 0, "%s: invariants hold while the threads run", label);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocated_bytes, 0, "%s: everything freed", label);
  is_u64(st.num_allocs, st.num_frees, "%s: as many frees as allocations", label);
  is_int(gmr_check(rt), 0, "%s: invariants hold at the end", label);
  gmr_runtime_free(rt);
}

static void run_threads_on(const char *label, const char *yaml, uint64_t seed, bool streams) {
  run_threads_sized(label, yaml, seed, streams, streams, 0);
}

static void run_threads(const char *label, const char *yaml, uint64_t seed) {
  run_threads_on(label, yaml, seed, false);
}

/* Front caches do not defeat gmr_record_stream (issue 15, class 9): once the
 * threads have met at the lock, a chunk freed on its stream is normally kept
 * by that stream's front cache and handed to the stream's next allocation of
 * a fitting size; a chunk used on another stream whose work is still queued
 * must not be.  Whether front caches are on is seen from outside: a 1 KiB
 * chunk freed, then 768 bytes asked for on the same stream, come back whole
 * (1 KiB) from a front cache, but split (768 B) by TF's path, which merges
 * the chunk into the free rest of the region first. */
typedef struct hammer_s {
  gmr_runtime_t *rt;
  gmr_stream_t stream;
} hammer_t;
static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* At least 20,000 pairs and 20 ms: longer than a scheduler's time slice, so
 * that threads sharing one core (a loaded machine) are preempted mid-run,
 * some of them while they hold the allocator's lock. */
static void *hammer(void *arg) {
  hammer_t *h = arg;
  uint64_t end = now_ms() + 20;
  for (int i = 0; i < 20000 || now_ms() < end; ++i) {
    void *p = NULL;
    if (gmr_alloc(h->rt, 4096, h->stream, &p) == 0) gmr_free(h->rt, p);
  }
  return NULL;
}

static bool front_cache_on(gmr_runtime_t *rt) {
  gmr_stats_t st;
  gmr_stats(rt, &st); /* flushes the front caches: the region is one free chunk again */
  void *a = NULL, *b = NULL;
  size_t req = 0, got = 0;
  if (gmr_alloc(rt, 1024, GMR_SIM_STREAM(1), &a) != 0) return false;
  gmr_free(rt, a);
  if (gmr_alloc(rt, 768, GMR_SIM_STREAM(1), &b) != 0) return false;
  gmr_alloc_size(rt, b, &req, &got);
  gmr_free(rt, b);
  return b == a && got == 1024;
}

/* Up to `rounds` rounds of 4 threads hammering streams 1 to 4, until the
 * front caches are on; whether they are. */
static bool hammer_until_on(gmr_runtime_t *rt, int rounds) {
  bool on = false;
  for (int round = 0; round < rounds && !on; ++round) {
    hammer_t h[4];
    pthread_t th[4];
    for (int i = 0; i < 4; ++i) {
      h[i] = (hammer_t){rt, GMR_SIM_STREAM(i + 1)};
      pthread_create(&th[i], NULL, hammer, &h[i]);
    }
    for (int i = 0; i < 4; ++i)
      pthread_join(th[i], NULL);
    on = front_cache_on(rt);
  }
  return on;
}

static void front_caches_and_streams(void) {
  gmr_runtime_t *rt =
      make("policy: {name: bfc, memory_limit: 32MiB, allow_retry_on_failure: false}\n");
  if (!ok(rt != NULL, "front caches and record_stream: runtime")) return;
  bool on = hammer_until_on(rt, 50);
  if (!ok(on, "front caches and record_stream: the threads turned the front caches on")) {
    gmr_runtime_free(rt);
    return;
  }
  gmr_stats_t st;
  gmr_stats(rt, &st);
  void *p = NULL, *q = NULL, *r = NULL;
  gmr_alloc(rt, 1024, GMR_SIM_STREAM(1), &p);
  is_int(gmr_record_stream(rt, p, GMR_SIM_STREAM(2)), 0, "  a chunk used on stream 2 too");
  gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(2)); /* its work there is not done */
  gmr_free(rt, p);
  gmr_alloc(rt, 1024, GMR_SIM_STREAM(1), &q);
  ok(q != NULL && q != p, "  is not handed out again while stream 2's work is queued");
  gmr_free(rt, q);
  gmr_stats(rt, &st);
  is_u64(st.active_bytes - st.allocated_bytes, 1024, "  it is pending: active, not allocated");
  gmr_sim_stream_complete(rt, GMR_SIM_STREAM(2));
  /* An allocation no front cache serves takes the lock and releases it. */
  gmr_alloc(rt, 65536, GMR_SIM_STREAM(3), &r);
  gmr_stats(rt, &st);
  is_u64(st.active_bytes, st.allocated_bytes, "  released once stream 2's work completes");
  gmr_free(rt, r);
  gmr_stats(rt, &st);
  is_u64(st.active_bytes, 0, "  everything freed");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* The end of a front-cache case: nothing live, every allocation freed,
 * the invariants hold; then the runtime goes. */
static void end_all_freed(gmr_runtime_t *rt) {
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocations, 0, "  everything freed");
  is_u64(st.num_allocs, st.num_frees, "  as many frees as allocations");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* A runtime whose front caches are on: threads hammered it until a chunk
 * freed on stream 1 comes back whole (front_cache_on); then everything is
 * flushed (gmr_stats), so the region is one free chunk again. */
static gmr_runtime_t *front_runtime(const char *yaml, const char *label) {
  gmr_runtime_t *rt = make(yaml);
  if (!ok(rt != NULL, "%s: runtime", label)) return NULL;
  bool on = hammer_until_on(rt, 50);
  if (!ok(on, "%s: the threads turned the front caches on", label)) {
    gmr_runtime_free(rt);
    return NULL;
  }
  gmr_stats_t st;
  gmr_stats(rt, &st);
  return rt;
}

/* A front cache keeps at most FRONT_PER_BIN chunks of a bin
 * (BFC_FRONT_PER_BIN); the free of one more keeps it and gives the older
 * half back to the allocator, where another stream's best fit finds them
 * (the lowest addresses); the stream's own next allocation takes its newest
 * kept chunk.  Blocks in between stay allocated, so no freed chunk merges
 * with a neighbour. */
#define FRONT_PER_BIN 32
static void front_caches_spill_a_full_bin(void) {
  enum { N = 2 * FRONT_PER_BIN + 4, HALF = FRONT_PER_BIN / 2 };
  const char *label = "front caches: a full bin gives back its older half";
  gmr_runtime_t *rt = front_runtime(
      "policy: {name: bfc, memory_limit: 64MiB, allow_retry_on_failure: false}\n", label);
  if (rt == NULL) return;
  void *a[N], *p[HALF + 1], *q = NULL;
  bool ascending = true;
  for (int i = 0; i < N; ++i) {
    a[i] = NULL;
    gmr_alloc(rt, 4096, GMR_SIM_STREAM(1), &a[i]);
    if (i > 0 && (char *)a[i] != (char *)a[i - 1] + 4096) ascending = false;
  }
  ok(ascending, "  %d blocks of 4 KiB, one after another", N);
  /* FRONT_PER_BIN + 1 frees on stream 1: the last spills a[0], a[2], ... */
  for (int i = 0; i <= 2 * FRONT_PER_BIN; i += 2)
    gmr_free(rt, a[i]);
  for (int k = 0; k <= HALF; ++k) {
    p[k] = NULL;
    gmr_alloc(rt, 4096, GMR_SIM_STREAM(2), &p[k]);
  }
  bool given_back = true;
  for (int k = 0; k < HALF; ++k)
    given_back = given_back && p[k] == a[2 * k];
  ok(given_back, "  stream 2 gets the %d chunks given back, lowest address first", HALF);
  ok((char *)p[HALF] > (char *)a[N - 1], "  then new memory: the %d others stay with stream 1",
     HALF + 1);
  gmr_alloc(rt, 4096, GMR_SIM_STREAM(1), &q);
  ok(q == a[2 * FRONT_PER_BIN], "  stream 1 gets its newest kept chunk");
  gmr_free(rt, q);
  for (int i = 2 * FRONT_PER_BIN + 2; i < N; i += 2)
    gmr_free(rt, a[i]);
  for (int i = 1; i < N; i += 2)
    gmr_free(rt, a[i]);
  for (int k = 0; k <= HALF; ++k)
    gmr_free(rt, p[k]);
  end_all_freed(rt);
}

/* A front cache keeps at most front_cache_bytes, by default max(limit / 256,
 * 1 MiB): with a 64 MiB limit, two freed 512 KiB chunks fill it (`kept`
 * chunks for a cap set in `yaml`), and the free of one more gives back the
 * older half of the largest bin, the only one here (half of `kept`, rounded
 * up, is enough to make room), before keeping it. */
static void front_caches_byte_cap(const char *label, const char *yaml, int kept) {
  gmr_runtime_t *rt = front_runtime(yaml, label);
  if (rt == NULL) return;
  enum { MAX = 8 };
  void *a[2 * MAX + 2], *p[MAX + 1], *q = NULL;
  int n = 2 * kept + 2;
  for (int i = 0; i < n; ++i) {
    a[i] = NULL;
    gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(1), &a[i]);
  }
  for (int i = 0; i <= 2 * kept; i += 2)
    gmr_free(rt, a[i]); /* the last is over the cap: the others go back, it is kept */
  for (int k = 0; k <= kept; ++k) {
    p[k] = NULL;
    gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(2), &p[k]);
  }
  int back = (kept + 1) / 2;
  bool given_back = true;
  for (int k = 0; k < back; ++k)
    given_back = given_back && p[k] == a[2 * k];
  ok(given_back, "  stream 2 gets the %d oldest chunks, given back", back);
  ok((char *)p[back] > (char *)a[n - 1], "  then new memory: the %d others stay with stream 1",
     kept + 1 - back);
  for (int k = back + 1; k <= kept; ++k)
    gmr_free(rt, p[k]); /* new memory too: back to stream 2's cache */
  bool kept_here = true;
  for (int i = 2 * kept; i >= 2 * back; i -= 2) { /* newest first */
    gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(1), &q);
    kept_here = kept_here && q == a[i];
    a[i] = q;
  }
  ok(kept_here, "  stream 1 gets the chunks it kept, newest first");
  for (int i = 2 * back; i <= 2 * kept; i += 2)
    gmr_free(rt, a[i]);
  for (int i = 1; i < n; i += 2)
    gmr_free(rt, a[i]);
  for (int k = 0; k <= back; ++k)
    gmr_free(rt, p[k]);
  end_all_freed(rt);
}

/* Over the byte cap with several bins, the largest bin gives back its older
 * half, again while still over: with a 3 MiB cap and two 256 KiB and two
 * 1 MiB chunks kept (2.5 MiB), the free of a third 1 MiB chunk gives back
 * the oldest 1 MiB chunk only (1.5 + 1 MiB is under the cap); the 256 KiB
 * chunks and the newer 1 MiB chunks stay.  4 KiB blocks between them stay
 * allocated, so nothing given back merges. */
static void front_caches_byte_cap_bins(void) {
  const char *label = "front caches: over the cap, the largest bin gives back first";
  gmr_runtime_t *rt = front_runtime("policy: {name: bfc, memory_limit: 64MiB, front_cache_bytes: "
                                    "3MiB, allow_retry_on_failure: false}\n",
                                    label);
  if (rt == NULL) return;
  enum { N = 5 };
  static const size_t sizes[N] = {256 << 10, 256 << 10, 1 << 20, 1 << 20, 1 << 20};
  void *a[N], *pad[N], *p[2] = {NULL, NULL}, *q = NULL;
  for (int i = 0; i < N; ++i) {
    a[i] = pad[i] = NULL;
    gmr_alloc(rt, sizes[i], GMR_SIM_STREAM(1), &a[i]);
    gmr_alloc(rt, 4096, GMR_SIM_STREAM(1), &pad[i]);
  }
  for (int i = 0; i < N; ++i)
    gmr_free(rt, a[i]); /* the last is over the cap: a[2] goes back */
  for (int k = 0; k < 2; ++k)
    gmr_alloc(rt, 1 << 20, GMR_SIM_STREAM(2), &p[k]);
  ok(p[0] == a[2], "  stream 2 gets the oldest 1 MiB chunk, given back");
  ok((char *)p[1] > (char *)pad[N - 1], "  then new memory: the other two stay with stream 1");
  bool kept = true;
  for (int i = N - 1; i >= 0; --i) { /* each size newest first */
    if (i == 2) continue;
    q = NULL;
    gmr_alloc(rt, sizes[i], GMR_SIM_STREAM(1), &q);
    kept = kept && q == a[i];
  }
  ok(kept, "  stream 1 gets its two 256 KiB and two 1 MiB chunks back, newest first");
  for (int i = 0; i < N; ++i) {
    if (i != 2) gmr_free(rt, a[i]);
    gmr_free(rt, pad[i]);
  }
  gmr_free(rt, p[0]);
  gmr_free(rt, p[1]);
  end_all_freed(rt);
}

/* front_cache_bytes: 1 keeps nothing in the front caches: after threads
 * have met at the lock, a freed 1 KiB chunk is merged by TF's path and 768
 * bytes asked next are split from it (front_cache_on is false). */
static void front_caches_off(void) {
  gmr_runtime_t *rt = make("policy: {name: bfc, memory_limit: 32MiB, front_cache_bytes: 1, "
                           "allow_retry_on_failure: false}\n");
  if (!ok(rt != NULL, "front_cache_bytes 1: runtime")) return;
  bool on = hammer_until_on(rt, 3);
  ok(!on, "  after threads on 4 streams, a freed chunk still goes back to TF's bins");
  end_all_freed(rt);
}

int main(void) {
  const char *env = getenv("GMR_SEED");
  uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  diag("seed %llu (GMR_SEED=%llu replays this run)", (unsigned long long)seed,
       (unsigned long long)seed);
  run_single("greedy 64 MiB",
             "policy: {name: bfc, memory_limit: 64MiB, allow_retry_on_failure: false}\n", seed,
             3000);
  run_single("growth 64 MiB, GC",
             "policy: {name: bfc, memory_limit: 64MiB, allow_growth: true, "
             "garbage_collection: true, allow_retry_on_failure: false}\n",
             seed + 1, 3000);
  run_single("growth, coalesce_regions",
             "policy: {name: bfc, memory_limit: 48MiB, allow_growth: true, coalesce_regions: "
             "true, allow_retry_on_failure: false}\n",
             seed + 2, 3000);
  run_single("growth, vmm",
             "policy: {name: bfc, memory_limit: 64MiB, allow_growth: true, vmm: true, "
             "allow_retry_on_failure: false}\n",
             seed + 3, 3000);
  run_single("greedy, fragmentation_fraction 0.01",
             "policy: {name: bfc, memory_limit: 64MiB, fragmentation_fraction: 0.01, "
             "allow_retry_on_failure: false}\n",
             seed + 4, 3000);
  run_threads("threads, growth, retry 2ms",
              "policy: {name: bfc, memory_limit: 48MiB, allow_growth: true, retry_timeout: 2ms}\n",
              seed + 5);
  run_threads("threads, greedy, no retry",
              "policy: {name: bfc, memory_limit: 32MiB, allow_retry_on_failure: false}\n",
              seed + 6);
  /* One stream per thread and few sizes: once the threads meet at the lock,
   * freed chunks are kept and reused by the streams' front caches
   * (docs/bfc.md, "Under concurrency"); counts stay exact and every flush
   * leaves TF's invariants. */
  run_threads_on("threads on 4 streams, front caches, greedy",
                 "policy: {name: bfc, memory_limit: 32MiB, allow_retry_on_failure: false}\n",
                 seed + 7, true);
  run_threads_on(
      "threads on 4 streams, front caches, growth, retry 2ms",
      "policy: {name: bfc, memory_limit: 8MiB, allow_growth: true, retry_timeout: 2ms}\n", seed + 8,
      true);
  /* Sizes up to 1 MiB on 4 streams: full bins and the byte cap make the
   * front caches give chunks back while other threads flush them (every
   * gmr_check): counts stay exact and no chunk is lost or handed out twice. */
  run_threads_sized("threads on 4 streams, front caches give back, greedy",
                    "policy: {name: bfc, memory_limit: 64MiB, allow_retry_on_failure: false}\n",
                    seed + 9, true, false, 1 * MiB);
  run_threads_sized(
      "threads on 4 streams, front caches give back, growth, retry 2ms",
      "policy: {name: bfc, memory_limit: 16MiB, allow_growth: true, retry_timeout: 2ms}\n",
      seed + 10, true, false, 1 * MiB);
  front_caches_and_streams();
  front_caches_spill_a_full_bin();
  front_caches_byte_cap("front caches: the byte cap, max(limit / 256, 1 MiB)",
                        "policy: {name: bfc, memory_limit: 64MiB, allow_retry_on_failure: false}\n",
                        2);
  front_caches_byte_cap("front caches: front_cache_bytes 3MiB",
                        "policy: {name: bfc, memory_limit: 64MiB, front_cache_bytes: 3MiB, "
                        "allow_retry_on_failure: false}\n",
                        6);
  front_caches_byte_cap_bins();
  front_caches_off();
  return done_testing();
}
