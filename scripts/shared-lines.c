/* shared-lines.c: the workload of scripts/shared-lines.sh.
 *
 *   shared-lines CONFIG THREADS SIZE PAIRS
 *
 * THREADS threads, each on its own stream, run PAIRS cached alloc+free pairs
 * of SIZE bytes on one runtime (simulated device), after one warm-up pair
 * each and a barrier; the measured pairs are the calls of measured_pairs(),
 * which the trace analysis recognizes by their call sites.  For a bfc
 * runtime the threads first meet at the allocator's lock (the main thread
 * holds it while another thread allocates), so its front caches are on, as
 * on a many-core machine (under valgrind, which runs one thread at a time,
 * the threads would otherwise never meet).  Built by scripts/shared-lines.sh
 * against the build tree's static library and the internal headers.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bfc/internal.h"
#include "gmr.h"

gmr_policy_t *gmr__runtime_policy(gmr_runtime_t *rt);

static gmr_runtime_t *rt;
static size_t size;
static int pairs;
static pthread_barrier_t barrier;

__attribute__((noinline)) void measured_pairs(gmr_stream_t s, int n) {
  for (int i = 0; i < n; ++i) {
    void *p;
    if (gmr_alloc(rt, size, s, &p) != 0 || gmr_free(rt, p) != 0) {
      fprintf(stderr, "shared-lines: %s\n", gmr_last_error(rt));
      exit(1);
    }
  }
}

static void *worker(void *arg) {
  gmr_stream_t s = arg;
  void *p;
  if (gmr_alloc(rt, size, s, &p) == 0) gmr_free(rt, p); /* the stream's cache, warm */
  pthread_barrier_wait(&barrier);
  measured_pairs(s, pairs);
  return NULL;
}

static void *meet(void *arg) {
  void *p;
  if (gmr_alloc(rt, 256, arg, &p) == 0) gmr_free(rt, p);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: shared-lines CONFIG THREADS SIZE PAIRS\n");
    return 2;
  }
  int n = atoi(argv[2]);
  size = strtoul(argv[3], NULL, 0);
  pairs = atoi(argv[4]);
  gmr_config_t *cfg;
  gmr_error_t e;
  if (n < 1 || n > 64 || size == 0 || pairs < 1)
    return fprintf(stderr, "shared-lines: bad args\n"), 2;
  if (gmr_config_load_file(argv[1], &cfg, &e) != 0) return fprintf(stderr, "%s\n", e.message), 1;
  if (gmr_runtime_new_sim(cfg, NULL, &rt) != 0)
    return fprintf(stderr, "%s\n", gmr_last_error(NULL)), 1;
  gmr_config_free(cfg);
  if (strcmp(gmr_runtime_policy(rt), "bfc") == 0) {
    bfc_t *b = (bfc_t *)gmr__runtime_policy(rt);
    pthread_t t;
    gmr__lock(&b->lock);
    pthread_create(&t, NULL, meet, GMR_SIM_STREAM(1000));
    while (!atomic_load(&b->contended))
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    gmr__unlock(&b->lock);
    pthread_join(t, NULL);
  }
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  pthread_t th[64];
  for (int i = 0; i < n; ++i)
    pthread_create(&th[i], NULL, worker, GMR_SIM_STREAM(i + 1));
  for (int i = 0; i < n; ++i)
    pthread_join(th[i], NULL);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  printf("shared-lines: %llu allocations, %llu frees, %llu live\n",
         (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees,
         (unsigned long long)st.allocations);
  gmr_runtime_free(rt);
  return 0;
}
