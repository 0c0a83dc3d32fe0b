/* caching-random.c: seeded random operations on the caching policy.
 *
 * Long random sequences of alloc, free, record_stream (with work enqueued on
 * and completed by the recorded streams) and empty_cache on four streams, on
 * the host-backed simulator, under the default options, expandable segments,
 * and max_split_size.  Every block gets a pattern derived from its id (one
 * word per 512 bytes, the policy's granularity, so any overlap of two blocks
 * is caught); the pattern is verified at free, and blocks freed while a
 * recorded stream still has work are verified until that work completes (the
 * policy must not hand them out before).  After every step the policy's
 * invariant walker runs (reserved >= active >= allocated, no two adjacent
 * free blocks, block sizes sum to segment sizes, no overlap, stats equal to
 * what the blocks hold).
 *
 * The seed is printed; GMR_SEED=<n> replays a run.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gmr.h"
#include "tap.h"

#define MiB         ((size_t)1 << 20)
#define N_STREAMS   4
#define MAX_LIVE    48
#define MAX_PENDING 64
#define STEPS       2500

typedef struct blk_s {
  uint64_t *p;
  size_t bytes; /* allocated (rounded) size */
  uint64_t id;
  int stream;
  int uses[N_STREAMS]; /* recorded streams */
} blk_t;

typedef struct pending_s {
  uint64_t *p;
  size_t bytes;
  uint64_t id;
  uint64_t wait[N_STREAMS]; /* enqueued count of each recorded stream at free; 0: none */
} pending_t;

static uint64_t rng_state;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static uint64_t pattern(uint64_t id, size_t k) {
  return (id * 0x9E3779B97F4A7C15ull) ^ k;
}

static void fill(uint64_t *p, size_t bytes, uint64_t id) {
  for (size_t k = 0; k < bytes / 512; ++k)
    p[k * 64] = pattern(id, k);
}

static int verify(const uint64_t *p, size_t bytes, uint64_t id) {
  for (size_t k = 0; k < bytes / 512; ++k)
    if (p[k * 64] != pattern(id, k)) return 0;
  return 1;
}

static size_t random_size(void) {
  uint64_t r = rnd() % 100;
  if (r < 55) return 1 + rnd() % (1 << 20);              /* small pool */
  if (r < 85) return (1 << 20) + 1 + rnd() % (11 * MiB); /* 20 MiB segments, splits */
  if (r < 97) return 11 * MiB + rnd() % (14 * MiB);      /* own segments, oversize */
  return 512 * (1 + rnd() % 8);                          /* exact multiples */
}

static int64_t st(gmr_runtime_t *rt, const char *key) {
  int64_t v = 0;
  gmr_stat_get(rt, key, &v);
  return v;
}

static void run(const char *name, const char *yaml, uint64_t seed) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    ok(0, "%s: config (%s)", name, err.message);
    return;
  }
  gmr_sim_options_t o = {.capacity = 192 * MiB, .host_backed = 1};
  gmr_runtime_t *rt = NULL;
  if (!ok(gmr_runtime_new_sim(cfg, &o, &rt) == 0, "%s: runtime on the host-backed simulator", name))
    return;
  gmr_config_free(cfg);
  rng_state = seed ? seed : 1;

  blk_t live[MAX_LIVE];
  pending_t pend[MAX_PENDING];
  int n_live = 0, n_pend = 0;
  uint64_t enq[N_STREAMS] = {0}, done[N_STREAMS] = {0};
  uint64_t next_id = 1, allocs = 0, frees = 0, ooms = 0, records = 0, empties = 0;
  int64_t syncs = 0;
  int failed_step = -1;
  char why[1024] = "";

  for (int step = 0; step < STEPS && failed_step < 0; ++step) {
    uint64_t op = rnd() % 100;
    if (op < 45 && n_live < MAX_LIVE) {
      size_t size = random_size();
      int s = (int)(rnd() % N_STREAMS);
      void *p = NULL;
      int rc = gmr_alloc(rt, size, GMR_SIM_STREAM(s), &p);
      if (rc == GMR_ENOMEM) {
        ++ooms;
      } else if (rc != 0) {
        snprintf(why, sizeof why, "alloc %zu: %s", size, gmr_last_error(rt));
        failed_step = step;
      } else {
        size_t req, bytes;
        gmr_alloc_size(rt, p, &req, &bytes);
        blk_t *b = &live[n_live++];
        memset(b, 0, sizeof *b);
        *b = (blk_t){(uint64_t *)p, bytes, next_id++, s, {0}};
        fill(b->p, b->bytes, b->id);
        ++allocs;
      }
    } else if (op < 80 && n_live > 0) {
      int i = (int)(rnd() % (uint64_t)n_live);
      blk_t b = live[i];
      live[i] = live[--n_live];
      if (!verify(b.p, b.bytes, b.id)) {
        snprintf(why, sizeof why, "block %llu at %p (%zu bytes) was overwritten while live",
                 (unsigned long long)b.id, (void *)b.p, b.bytes);
        failed_step = step;
        break;
      }
      pending_t pe = {b.p, b.bytes, b.id, {0}};
      int busy = 0;
      for (int s = 0; s < N_STREAMS; ++s)
        if (b.uses[s] && enq[s] > done[s]) pe.wait[s] = enq[s], busy = 1;
      if (gmr_free(rt, b.p) != 0) {
        snprintf(why, sizeof why, "free: %s", gmr_last_error(rt));
        failed_step = step;
      }
      if (busy && n_pend < MAX_PENDING) pend[n_pend++] = pe;
      ++frees;
    } else if (op < 88 && n_live > 0) {
      int i = (int)(rnd() % (uint64_t)n_live);
      int s = (int)(rnd() % N_STREAMS);
      if (gmr_record_stream(rt, live[i].p, GMR_SIM_STREAM(s)) != 0) {
        snprintf(why, sizeof why, "record_stream: %s", gmr_last_error(rt));
        failed_step = step;
      }
      if (s != live[i].stream) live[i].uses[s] = 1;
      ++records;
    } else if (op < 93) {
      int s = (int)(rnd() % N_STREAMS);
      gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(s));
      ++enq[s];
    } else if (op < 98) {
      int s = (int)(rnd() % N_STREAMS);
      gmr_sim_stream_complete(rt, GMR_SIM_STREAM(s));
      done[s] = enq[s];
    } else {
      if (gmr_empty_cache(rt) != 0) {
        snprintf(why, sizeof why, "empty_cache: %s", gmr_last_error(rt));
        failed_step = step;
      }
      ++empties;
    }
    /* A sync of all events (empty_cache, the OOM retry) completes the work
     * the pending blocks wait for; so does completing their streams.  After
     * one, the test completes every stream, so that its model of the streams
     * stays exact (the sync completed an unknown part of their work). */
    int64_t now_syncs = st(rt, "num_sync_all_streams");
    if (now_syncs != syncs) {
      n_pend = 0;
      syncs = now_syncs;
      for (int s = 0; s < N_STREAMS; ++s) {
        gmr_sim_stream_complete(rt, GMR_SIM_STREAM(s));
        done[s] = enq[s];
      }
    }
    for (int k = 0; k < n_pend; ++k) {
      int waiting = 0;
      for (int s = 0; s < N_STREAMS; ++s)
        waiting |= pend[k].wait[s] > done[s];
      if (!waiting) {
        pend[k--] = pend[--n_pend];
        continue;
      }
      if (failed_step < 0 && !verify(pend[k].p, pend[k].bytes, pend[k].id)) {
        snprintf(why, sizeof why, "block %llu was reused while its stream work was pending",
                 (unsigned long long)pend[k].id);
        failed_step = step;
      }
    }
    if (failed_step < 0 && gmr_check(rt) != 0) {
      snprintf(why, sizeof why, "invariant: %s", gmr_last_error(rt));
      failed_step = step;
    }
    gmr_stats_t sts;
    gmr_stats(rt, &sts);
    if (failed_step < 0 &&
        !(sts.reserved_bytes >= sts.active_bytes && sts.active_bytes >= sts.allocated_bytes)) {
      snprintf(why, sizeof why, "reserved %llu, active %llu, allocated %llu",
               (unsigned long long)sts.reserved_bytes, (unsigned long long)sts.active_bytes,
               (unsigned long long)sts.allocated_bytes);
      failed_step = step;
    }
  }
  if (!ok(failed_step < 0, "%s: %d random steps keep every invariant and every pattern", name,
          STEPS))
    diag("step %d: %s (GMR_SEED=%llu)", failed_step, why, (unsigned long long)seed);
  diag("%s: %llu allocs, %llu frees, %llu OOMs, %llu record_stream, %llu empty_cache", name,
       (unsigned long long)allocs, (unsigned long long)frees, (unsigned long long)ooms,
       (unsigned long long)records, (unsigned long long)empties);
  ok(allocs > 500 && frees > 400 && records > 50, "%s: the run exercised every operation", name);

  int bad = 0;
  for (int i = 0; i < n_live; ++i) {
    bad += !verify(live[i].p, live[i].bytes, live[i].id);
    gmr_free(rt, live[i].p);
  }
  is_int(bad, 0, "%s: the last live blocks kept their patterns", name);
  for (int s = 0; s < N_STREAMS; ++s)
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(s));
  gmr_empty_cache(rt);
  is_int(st(rt, "reserved_bytes.all.current"), 0, "%s: all freed + empty_cache -> reserved 0",
         name);
  is_int(st(rt, "active_bytes.all.current"), 0, "%s: nothing active", name);
  is_int(gmr_check(rt), 0, "%s: invariants at the end", name);
  gmr_runtime_free(rt);
}

/* ---- threads: each on its own stream (the fast path), with global-path
 * operations (record_stream across streams, empty_cache, gmr_check) mixed
 * in; the counts must add up exactly afterwards. */

#define N_THREADS  8
#define THREAD_OPS 2000

typedef struct worker_s {
  gmr_runtime_t *rt;
  int index;
  uint64_t seed;
  uint64_t allocs, frees, ooms, bad;
  char why[256];
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  uint64_t x = w->seed * 2654435761u + (uint64_t)w->index + 1;
  blk_t live[16];
  int n = 0;
  gmr_stream_t own = GMR_SIM_STREAM(w->index + 1);
  for (int op = 0; op < THREAD_OPS; ++op) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t r = x % 100;
    if (r < 50 && n < 16) {
      size_t size = x % 3 ? 1 + (x >> 8) % (256 << 10) : (1 << 20) + (x >> 8) % (3 << 20);
      void *p = NULL;
      int rc = gmr_alloc(w->rt, size, own, &p);
      if (rc == GMR_ENOMEM) {
        ++w->ooms;
        continue;
      }
      if (rc != 0) {
        snprintf(w->why, sizeof w->why, "alloc: %s", gmr_strerror(rc));
        ++w->bad;
        break;
      }
      size_t req, bytes;
      gmr_alloc_size(w->rt, p, &req, &bytes);
      live[n] = (blk_t){(uint64_t *)p, bytes, ((uint64_t)w->index << 48) | (uint64_t)op, 0, {0}};
      fill(live[n].p, live[n].bytes, live[n].id);
      ++n;
      ++w->allocs;
    } else if (r < 96 && n > 0) {
      int i = (int)((x >> 16) % (uint64_t)n);
      if (!verify(live[i].p, live[i].bytes, live[i].id)) {
        snprintf(w->why, sizeof w->why, "block %p overwritten while live", (void *)live[i].p);
        ++w->bad;
        break;
      }
      if ((x >> 24) % 8 == 0) /* used on another thread's stream too */
        gmr_record_stream(w->rt, live[i].p, GMR_SIM_STREAM((w->index + 1) % N_THREADS + 1));
      if (gmr_free(w->rt, live[i].p) != 0) ++w->bad;
      live[i] = live[--n];
      ++w->frees;
    } else if (r < 98 && w->index == 0) {
      gmr_empty_cache(w->rt);
    } else if (w->index == 1) {
      if (gmr_check(w->rt) != 0) {
        snprintf(w->why, sizeof w->why, "check: %s", gmr_last_error(w->rt));
        ++w->bad;
        break;
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    w->bad += !verify(live[i].p, live[i].bytes, live[i].id);
    gmr_free(w->rt, live[i].p);
    ++w->frees;
  }
  return NULL;
}

static void run_threads(uint64_t seed) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  gmr_config_load_string("policy: caching\n", &cfg, &err);
  gmr_sim_options_t o = {.capacity = 512 * MiB, .host_backed = 1};
  gmr_runtime_t *rt = NULL;
  gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  pthread_t th[N_THREADS];
  worker_t w[N_THREADS];
  for (int i = 0; i < N_THREADS; ++i) {
    w[i] = (worker_t){.rt = rt, .index = i, .seed = seed};
    pthread_create(&th[i], NULL, worker, &w[i]);
  }
  uint64_t allocs = 0, frees = 0, ooms = 0, bad = 0;
  for (int i = 0; i < N_THREADS; ++i) {
    pthread_join(th[i], NULL);
    allocs += w[i].allocs, frees += w[i].frees, ooms += w[i].ooms, bad += w[i].bad;
    if (w[i].bad) diag("thread %d: %s", i, w[i].why);
  }
  diag("threads: %llu allocs, %llu frees, %llu OOMs", (unsigned long long)allocs,
       (unsigned long long)frees, (unsigned long long)ooms);
  is_u64(bad, 0, "threads: %d threads on their own streams keep every pattern and invariant",
         N_THREADS);
  is_int(st(rt, "allocation.all.allocated"), (int64_t)allocs,
         "threads: allocation.all.allocated counts every allocation exactly");
  is_int(st(rt, "allocation.all.freed"), (int64_t)frees, "threads: and every free");
  is_int(st(rt, "allocated_bytes.all.current"), 0, "threads: nothing allocated at the end");
  is_int(st(rt, "allocated_bytes.all.allocated"), st(rt, "allocated_bytes.all.freed"),
         "threads: allocated bytes in = out");
  for (int s = 0; s <= N_THREADS; ++s)
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(s));
  gmr_empty_cache(rt);
  is_int(st(rt, "active_bytes.all.current"), 0, "threads: nothing active after empty_cache");
  is_int(st(rt, "reserved_bytes.all.current"), 0, "threads: nothing reserved after empty_cache");
  ok(st(rt, "allocated_bytes.all.peak") > 0, "threads: a peak was recorded");
  is_int(gmr_check(rt), 0, "threads: invariants at the end");
  gmr_runtime_free(rt);
}

int main(void) {
  const char *env = getenv("GMR_SEED");
  uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  diag("seed %llu (GMR_SEED=%llu to replay)", (unsigned long long)seed, (unsigned long long)seed);
  run("default", "policy: caching\n", seed);
  run("expandable", "policy: {name: caching, expandable_segments: true}\n", seed + 1);
  run("max_split", "policy: {name: caching, max_split_size: 22MiB}\n", seed + 2);
  run_threads(seed);
  run("max_split+expandable",
      "policy: {name: caching, max_split_size: 22MiB, expandable_segments: true}\n", seed + 3);
  return done_testing();
}
