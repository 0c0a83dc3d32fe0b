/* caching-deferred.c: the caching policy's deferred frees and take-backs
 * give PyTorch's answers.
 *
 * A fast free waits in its stream's deferred slot, and an allocation that
 * PyTorch would serve with that very block takes it back without splitting
 * or merging (policies/caching/caching.c, Note [Deferred free]).  Every
 * global path applies the deferred frees first, so reading the statistics
 * after every free turns the take-back off.  Here the same seeded
 * operations run on two runtimes: A as it is, B reading its statistics
 * after every free.  Ops lean to what the take-back serves (a free, then an
 * allocation of the same rounded size on the same stream, often with
 * another requested size) and to what it must refuse (a neighbour merging
 * before the block, a better fit elsewhere, max_split_size, another pool),
 * on one stream (frees deferred) and on three (a second stream ends the
 * deferral), with record_stream, empty_cache and OOMs on a small device.
 * After every step both must have answered the same: the same address or
 * the same OOM message; every 97 steps, and at the end, all of
 * memory_stats() (each figure: current, peak, allocated, freed),
 * memory_summary() byte for byte and every block of every segment.  Under
 * --enable-debug=3 the invariant walker runs after every op of both.  Last,
 * four threads share one stream (the deferred slot under its lock; run
 * under ThreadSanitizer by .ci/run), and the books must balance.
 *
 * The seed is printed; GMR_SEED=<n> replays a run.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gmr.h"
#include "sim-runtime.h"
#include "tap.h"

#define MiB      ((size_t)1 << 20)
#define MAX_LIVE 64
#define STEPS    6000
#define CHECK_AT 97

static uint64_t rng_state;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Sizes around the pools' edges and PyTorch's roundings, so that same-size
 * reallocations are frequent and blocks have every kind of neighbour. */
static size_t pick_size(void) {
  static const size_t sizes[] = {
      1,   512,     700,     4096,    4097,         65536,    300000,   MiB - 512,
      MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB + 7, 25 * MiB, 70 * MiB, 130 * MiB};
  return sizes[rnd() % (sizeof sizes / sizeof sizes[0])];
}

typedef struct live_s {
  void *p;
  size_t size;
  int stream;
} live_t;

typedef struct world_s {
  gmr_runtime_t *rt[2]; /* A: as is; B: statistics read after every free */
  live_t live[MAX_LIVE];
  int n_live;
  int bad;       /* steps whose answers differed */
  int n_streams; /* 1: frees are deferred; more: applied at once */
} world_t;

static gmr_stream_t stream_of(int k) {
  return GMR_SIM_STREAM(k + 1);
}

typedef struct stat_vec_s {
  char keys[256][64];
  int64_t v[256];
  int n;
} stat_vec_t;

static int stat_cb(const char *key, int64_t value, void *ud) {
  stat_vec_t *s = ud;
  if (s->n < 256) {
    snprintf(s->keys[s->n], sizeof s->keys[s->n], "%s", key);
    s->v[s->n++] = value;
  }
  return 0;
}

typedef struct walk_vec_s {
  uint64_t a[4096][4];
  int n;
} walk_vec_t;

static int walk_cb(const gmr_walk_entry_t *e, void *ud) {
  walk_vec_t *w = ud;
  if (w->n < 4096) {
    w->a[w->n][0] = e->address;
    w->a[w->n][1] = e->size;
    w->a[w->n][2] = e->is_segment ? 1000 : (uint64_t)e->state;
    w->a[w->n][3] = e->requested;
    ++w->n;
  }
  return 0;
}

/* Both runtimes' figures, summaries and segments, equal? */
static int same_state(world_t *w, int step) {
  static stat_vec_t s[2];
  static walk_vec_t wv[2];
  char *sum[2];
  for (int r = 0; r < 2; ++r) {
    s[r].n = 0;
    wv[r].n = 0;
    gmr_stats_foreach(w->rt[r], stat_cb, &s[r]);
    gmr_walk(w->rt[r], walk_cb, &wv[r]);
    sum[r] = summary_string(w->rt[r]);
  }
  int same = s[0].n == s[1].n && s[0].n > 100;
  for (int i = 0; same && i < s[0].n; ++i)
    if (strcmp(s[0].keys[i], s[1].keys[i]) != 0 || s[0].v[i] != s[1].v[i]) {
      diag("step %d: %s = %lld with take-backs, %lld without", step, s[0].keys[i],
           (long long)s[0].v[i], (long long)s[1].v[i]);
      same = 0;
    }
  if (same && (wv[0].n != wv[1].n || memcmp(wv[0].a, wv[1].a, sizeof wv[0].a[0] * wv[0].n) != 0)) {
    diag("step %d: the segments differ", step);
    same = 0;
  }
  if (same && (sum[0] == NULL || sum[1] == NULL || strcmp(sum[0], sum[1]) != 0)) {
    diag("step %d: memory_summary() differs", step);
    same = 0;
  }
  free(sum[0]);
  free(sum[1]);
  return same;
}

/* One allocation on both; the same answer? */
static void both_alloc(world_t *w, size_t size, int stream) {
  void *p[2] = {NULL, NULL};
  int rc[2];
  char msg[2][512];
  for (int r = 0; r < 2; ++r) {
    rc[r] = gmr_alloc(w->rt[r], size, stream_of(stream), &p[r]);
    snprintf(msg[r], sizeof msg[r], "%s", rc[r] ? gmr_last_error(w->rt[r]) : "");
  }
  if (rc[0] != rc[1] || p[0] != p[1] || strcmp(msg[0], msg[1]) != 0) {
    if (w->bad++ < 5)
      diag("alloc %zu on stream %d: %p (%d, %s) with take-backs, %p (%d, %s) without", size, stream,
           p[0], rc[0], msg[0], p[1], rc[1], msg[1]);
    return;
  }
  if (rc[0] == 0 && w->n_live < MAX_LIVE)
    w->live[w->n_live++] = (live_t){p[0], size, stream};
  else if (rc[0] == 0) /* full: give it back at once */
    for (int r = 0; r < 2; ++r)
      gmr_free(w->rt[r], p[0]);
}

static void both_free(world_t *w, int k) {
  live_t b = w->live[k];
  w->live[k] = w->live[--w->n_live];
  int rc0 = gmr_free(w->rt[0], b.p), rc1 = gmr_free(w->rt[1], b.p);
  gmr_stats_t st;
  gmr_stats(w->rt[1], &st); /* B: the free is applied now */
  if ((rc0 != 0 || rc1 != 0) && w->bad++ < 5) diag("free %p: %d and %d", b.p, rc0, rc1);
}

static void run_on(const char *name, const char *yaml, uint64_t capacity, int n_streams) {
  world_t *w = calloc(1, sizeof *w);
  w->n_streams = n_streams;
  w->rt[0] = sim_runtime(yaml, capacity, 0);
  w->rt[1] = sim_runtime(yaml, capacity, 0);
  if (!ok(w->rt[0] && w->rt[1], "%s: two runtimes", name)) {
    gmr_runtime_free(w->rt[0]);
    gmr_runtime_free(w->rt[1]);
    free(w);
    return;
  }
  int checks = 0, checks_ok = 0;
  for (int step = 0; step < STEPS; ++step) {
    unsigned op = (unsigned)(rnd() % 100);
    if (w->n_live > 0 && op < 45) {
      /* Free, then allocate what rounds the same (or nearly) on its stream. */
      int k = (int)(rnd() % (unsigned)w->n_live);
      live_t b = w->live[k];
      both_free(w, k);
      size_t size = b.size;
      unsigned how = (unsigned)(rnd() % 8);
      if (how == 1 && size > 1) size -= 1; /* same rounding, another request */
      if (how == 2) size += 1;             /* maybe the next rounding */
      if (how == 3) size = pick_size();    /* anything */
      if (how == 4 && w->n_live > 0) both_free(w, (int)(rnd() % (unsigned)w->n_live));
      both_alloc(w, size, how == 5 ? (b.stream + 1) % w->n_streams : b.stream);
    } else if (w->n_live > 0 && op < 70) {
      both_free(w, (int)(rnd() % (unsigned)w->n_live));
    } else if (op < 96) {
      both_alloc(w, pick_size(), (int)(rnd() % (unsigned)w->n_streams));
    } else if (op < 98 && w->n_live > 0) {
      live_t b = w->live[rnd() % (unsigned)w->n_live];
      gmr_stream_t s = stream_of((int)(rnd() % (unsigned)w->n_streams));
      for (int r = 0; r < 2; ++r)
        gmr_record_stream(w->rt[r], b.p, s);
    } else if (op < 99) {
      for (int r = 0; r < 2; ++r)
        gmr_empty_cache(w->rt[r]);
    } else {
      for (int r = 0; r < 2; ++r)
        gmr_stats_reset_peak(w->rt[r]);
    }
    if (step % CHECK_AT == CHECK_AT - 1 || step == STEPS - 1) {
      ++checks;
      checks_ok += same_state(w, step);
    }
  }
  is_int(w->bad, 0, "%s: %d steps, every answer the same with and without take-backs", name, STEPS);
  is_int(checks_ok, checks,
         "%s: memory_stats(), memory_summary() and the segments the same at %d "
         "checkpoints",
         name, checks);
  while (w->n_live > 0)
    both_free(w, 0);
  is_int(same_state(w, STEPS), 1, "%s: all freed: the same", name);
  is_int(gmr_check(w->rt[0]), 0, "%s: invariants hold", name);
  gmr_runtime_free(w->rt[0]);
  gmr_runtime_free(w->rt[1]);
  free(w);
}

/* Threads sharing one stream: the deferred slot and the take-back under
 * the stream's lock, each thread freeing and allocating again what it
 * holds.  The answers depend on the interleaving; the books must balance. */
#define T_THREADS 4
#define T_STEPS   20000

typedef struct tworker_s {
  gmr_runtime_t *rt;
  uint64_t seed;
  int failures;
} tworker_t;

static void *tworker_main(void *arg) {
  tworker_t *w = arg;
  void *held[16] = {NULL};
  size_t size[16] = {0};
  uint64_t x = w->seed;
  for (int i = 0; i < T_STEPS; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int k = (int)(x % 16);
    if (held[k] != NULL && gmr_free(w->rt, held[k]) != 0) ++w->failures;
    if (size[k] == 0 || x % 8 == 0) size[k] = (size_t)512 << (x >> 8) % 13; /* 512 B to 2 MiB */
    held[k] = NULL;
    if (gmr_alloc(w->rt, size[k] - (x >> 20) % 3, GMR_SIM_STREAM(1), &held[k]) != 0) ++w->failures;
  }
  for (int k = 0; k < 16; ++k)
    if (held[k] != NULL && gmr_free(w->rt, held[k]) != 0) ++w->failures;
  return NULL;
}

static void threads_on_one_stream(void) {
  gmr_runtime_t *rt = sim_runtime("policy: caching\n", (uint64_t)64 << 30, 0);
  if (!ok(rt != NULL, "threads: a runtime")) return;
  pthread_t th[T_THREADS];
  tworker_t w[T_THREADS];
  for (int t = 0; t < T_THREADS; ++t) {
    w[t] = (tworker_t){rt, rnd() | 1, 0};
    pthread_create(&th[t], NULL, tworker_main, &w[t]);
  }
  int failures = 0;
  for (int t = 0; t < T_THREADS; ++t) {
    pthread_join(th[t], NULL);
    failures += w[t].failures;
  }
  is_int(failures, 0, "threads: %d threads on one stream, %d steps each, every call succeeded",
         T_THREADS, T_STEPS);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocations, 0, "threads: nothing live");
  is_u64(st.num_allocs, st.num_frees, "threads: as many frees as allocations");
  is_u64(st.num_allocs, (uint64_t)T_THREADS * T_STEPS, "threads: every allocation counted");
  is_u64(st.active_bytes + st.allocated_bytes + st.requested_bytes, 0,
         "threads: no active, allocated or requested bytes left");
  is_int(gmr_check(rt), 0, "threads: invariants hold");
  gmr_runtime_free(rt);
}

static void run(const char *name, const char *yaml, uint64_t capacity) {
  char label[64];
  snprintf(label, sizeof label, "%s, one stream", name);
  run_on(label, yaml, capacity, 1);
  snprintf(label, sizeof label, "%s, three streams", name);
  run_on(label, yaml, capacity, 3);
}

int main(void) {
  const char *seed_env = getenv("GMR_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
  diag("seed %llu (GMR_SEED=%llu replays this run)", (unsigned long long)seed,
       (unsigned long long)seed);
  rng_state = seed * 2654435761u + 1;
  const uint64_t dev = (uint64_t)2 << 30; /* 2 GiB: OOMs, releases and retries happen */
  run("default", "policy: caching\n", dev);
  run("max_split_size", "policy: {name: caching, max_split_size: 40MiB}\n", dev);
  run("divisions", "policy: {name: caching, roundup_power2_divisions: 4}\n", dev);
  run("gc",
      "policy: {name: caching, garbage_collection_threshold: 0.6,\n"
      "         per_process_memory_fraction: 0.8}\n",
      dev);
  run("expandable", "policy: {name: caching, expandable_segments: true}\n", dev);
  threads_on_one_stream();
  done_testing();
}
