/* stress.c: 16 threads allocating and freeing on one runtime over the
 * host-backed simulator.  Every block is filled with a pattern derived from
 * its allocation id and verified at free, so two blocks that overlap are
 * caught at once.  Runs for every registered policy it can load; seeded
 * (GMR_SEED overrides), and the seed is printed. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gmr.h"
#include "tap.h"

#define THREADS 16
#define SLOTS   64
#define ROUNDS  3000

typedef struct worker_s {
  gmr_runtime_t *rt;
  uint64_t seed;
  int index;
  long failures; /* pattern mismatches or unexpected errors */
  long ooms;
} worker_t;

static uint64_t next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static void fill(void *p, size_t n, uint64_t tag) {
  uint64_t *w = p;
  for (size_t i = 0; i < n / 8; ++i)
    w[i] = tag ^ (i * 0x9E3779B97F4A7C15ull);
  for (size_t i = n / 8 * 8; i < n; ++i)
    ((unsigned char *)p)[i] = (unsigned char)tag;
}

static int verify(const void *p, size_t n, uint64_t tag) {
  const uint64_t *w = p;
  for (size_t i = 0; i < n / 8; ++i)
    if (w[i] != (tag ^ (i * 0x9E3779B97F4A7C15ull))) return 0;
  for (size_t i = n / 8 * 8; i < n; ++i)
    if (((const unsigned char *)p)[i] != (unsigned char)tag) return 0;
  return 1;
}

static void *work(void *arg) {
  worker_t *w = arg;
  void *ptr[SLOTS] = {0};
  size_t size[SLOTS] = {0};
  uint64_t tag[SLOTS] = {0};
  uint64_t s = w->seed;
  gmr_stream_t stream = GMR_SIM_STREAM(w->index % 4);
  for (int r = 0; r < ROUNDS; ++r) {
    int k = (int)(next(&s) % SLOTS);
    if (ptr[k] != NULL) {
      if (!verify(ptr[k], size[k], tag[k])) ++w->failures;
      if (gmr_free(w->rt, ptr[k]) != 0) ++w->failures;
      ptr[k] = NULL;
    } else {
      uint64_t x = next(&s);
      size[k] = x % 4 == 0 ? 1 + x % (4u << 20) : 1 + x % 65536;
      tag[k] = next(&s);
      int rc = gmr_alloc(w->rt, size[k], stream, &ptr[k]);
      if (rc == GMR_ENOMEM) {
        ++w->ooms;
        ptr[k] = NULL;
      } else if (rc != 0) {
        ++w->failures;
      } else {
        fill(ptr[k], size[k], tag[k]);
      }
    }
  }
  for (int k = 0; k < SLOTS; ++k) {
    if (ptr[k] == NULL) continue;
    if (!verify(ptr[k], size[k], tag[k])) ++w->failures;
    if (gmr_free(w->rt, ptr[k]) != 0) ++w->failures;
  }
  return NULL;
}

static void run(const char *name, const char *yaml, uint64_t seed) {
  gmr_config_t *cfg;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    skip("%s: %s", name, err.message);
    return;
  }
  gmr_runtime_t *rt;
  gmr_sim_options_t o = {.capacity = 2ull << 30, .host_backed = 1};
  int rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  if (!ok(rc == 0, "%s: a runtime on the host-backed simulator", name)) return;
  pthread_t th[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    w[i] = (worker_t){rt, seed + (uint64_t)i * 7919, i, 0, 0};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  long failures = 0, ooms = 0;
  for (int i = 0; i < THREADS; ++i) {
    pthread_join(th[i], NULL);
    failures += w[i].failures;
    ooms += w[i].ooms;
  }
  is_int(failures, 0, "%s: %d threads x %d rounds, every pattern intact", name, THREADS, ROUNDS);
  is_int(gmr_check(rt), 0, "%s: invariants hold afterwards", name);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.allocated_bytes, 0, "%s: nothing left allocated", name);
  if (ooms) diag("%s: %ld allocations ran out of memory (allowed)", name, ooms);
  gmr_runtime_free(rt);
}

int main(void) {
  const char *env = getenv("GMR_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  if (seed == 0) seed = 1;
  diag("seed %llu (set GMR_SEED to repeat)", (unsigned long long)seed);
  run("direct", "policy: direct\n", seed);
  run("limit(direct)", "policy: direct\nlimit: {bytes: 1GiB}\n", seed);
  run("caching", "policy: caching\n", seed);
  run("caching expandable", "policy: {name: caching, expandable_segments: true}\n", seed);
  run("bfc greedy", "policy: {name: bfc, allow_growth: false, memory_limit: 1GiB}\n", seed);
  run("bfc growth", "policy: {name: bfc, allow_growth: true, memory_limit: 1GiB}\n", seed);
  run("limit(caching) reserved", "policy: caching\nlimit: {bytes: 1GiB, counts: reserved}\n", seed);
  return done_testing();
}
