/* bench.c: gmr-bench, the host cost of the allocation hot path.
 *
 *   gmr-bench [--device sim|cuda] [--sizes LIST] [--threads LIST] [--reps N]
 *             [--min-time MS] [--torch SHIM.so] [--no-baselines] [--json] CONFIG...
 *
 * For each configuration (a file or a name, gmr_config_find) it times cached
 * alloc+free pairs on one thread and on N, and, on request, churn, sweep and
 * miss workloads (Note [Bench workloads]), against the CUDA contenders with
 * --device cuda (Note [Bench contenders]); every gmr figure is checked
 * (Note [Bench self-check]).  Options come from one table, bench_options,
 * which also makes --help; usage errors exit 2 before anything runs.
 */

/* Note [Bench workloads]
 * ~~~~~~~~~~~~~~~~~~~~~~
 *  - pair: the host time of one cached alloc+free pair on one stream: a
 *    warm-up pair primes the cache, then a loop of gmr_alloc + gmr_free of
 *    the same size is timed, repeated --reps times; the median is reported;
 *  - the aggregate rate with 1, 2, 4, 8, 16 threads, each allocating and
 *    freeing on its own stream: every thread runs the same number of pairs,
 *    and aggregate ns/pair = wall time / (threads x pairs per thread), where
 *    the wall time runs from the first thread's start to the last one's end.
 *    A rate that holds up under threads keeps this figure at or below the
 *    one-thread figure.
 * Two more workloads (--workloads pair,random,sweep), each alloc and free
 * timed the same way for every contender (docs/benchmarks.md):
 *  - random: each thread keeps --live blocks (512) live on its stream, sizes
 *    log-uniform in --random-range (512 B to 64 MiB); one step frees a block
 *    chosen at random and allocates a new random size in its place; the
 *    figure is ns per operation (an alloc or a free), one thread and N;
 *  - sweep: the random workload on one thread with 10 to 100,000 live blocks
 *    (--sweep-live), sizes in --sweep-range (512 B to 4 MiB): how the cost
 *    per operation grows with the number of live blocks (every contender
 *    but plain cudaMalloc, which caches nothing);
 *  - miss (policies that map pages: stitch): microseconds per cache miss by
 *    the pages it maps (--miss-pages, default 1,4,16,64,256 pages): "new",
 *    a request of k pages after empty_cache (k pages created, mapped and
 *    made accessible), and "held", a request of k pages less 512 bytes right
 *    after a k-page block was freed (no cached range of that length: the
 *    held pages are mapped again at a new address).  Each untimed set-up
 *    is outside the timed call; the median of --reps is reported, with the
 *    pages the policy mapped (k, or the figure is refused; pages in a row
 *    of one chunk map in one call: stitch's Note [Chunks]).
 *  - calls (--device cuda): each driver call of the CUDA backend timed
 *    alone, for gmr-compare's cost model (Note [Bench calls] in
 *    bench-calls.c).
 * The steps (which block, which size) are drawn before the timed loop from
 * a fixed seed, so every contender makes the same requests.
 *
 * Note [Bench contenders]
 * ~~~~~~~~~~~~~~~~~~~~~~~
 * With --device cuda (a build with the CUDA backend, on a machine with a
 * GPU) it also measures the contenders gmr is judged against: cudaMalloc +
 * cudaFree, cudaMallocAsync + cudaFreeAsync on the device's default pool
 * with its release threshold at UINT64_MAX, and, given --torch, PyTorch's
 * own caching allocator through the small C++ shim tools/bench-torch.cpp
 * (loaded with dlopen, so gmr-bench itself needs no libtorch).  This file
 * includes the CUDA runtime header for those contenders only; gmr itself
 * reaches CUDA through lib/backend/cuda.c alone.
 *
 * Note [Bench self-check]
 * ~~~~~~~~~~~~~~~~~~~~~~~
 * Every gmr run checks itself afterwards: the runtime's statistics must show
 * exactly as many allocations and frees as the benchmark made, and none
 * live, or the figure is refused.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench-calls.h"
#include "cli.h"
#include "gmr.h"
#include "json.h"
#include "outfile.h"

#ifdef GMR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define BENCH_MAX_THREADS 64
#define BENCH_MAX_SIZES   16
#define BENCH_MAX_REPS    101
#define BENCH_MAX_SWEEP   16
#define BENCH_MAX_MISS    16
#define BENCH_MAX_CALLS   8

/* The workloads (Note [Bench workloads]). */
typedef enum bench_kind_e { WL_PAIR, WL_RANDOM, WL_SWEEP, WL_MISS } bench_kind_t;

/* A churn workload: `live` blocks per thread, sizes log-uniform in [lo, hi]. */
typedef struct churn_spec_s {
  size_t live;
  size_t lo, hi; /* bytes */
} churn_spec_t;

/* ---- options -------------------------------------------------------------- */

typedef struct bench_opts_s {
  bool cuda;                     /* --device cuda */
  bool json;                     /* JSON on stdout instead of the table */
  const char *json_path;         /* --json-file PATH */
  FILE *json_file;               /* PATH opened, once the command line is good */
  bool baselines;                /* the CUDA contenders (with --device cuda) */
  bool pin;                      /* --pin: thread t runs on CPU t mod the CPUs allowed */
  int reps;                      /* repetitions; the median is reported */
  double min_time_ns;            /* one repetition on one thread lasts at least this */
  uint64_t fixed_pairs;          /* --pairs: pairs per thread per repetition; 0: calibrate */
  size_t sizes[BENCH_MAX_SIZES]; /* bytes */
  int n_sizes;
  int threads[BENCH_MAX_THREADS]; /* thread counts, ascending as given */
  int n_threads;
  int max_threads;                                /* max of threads[] */
  const char *torch_shim;                         /* path of the shim, or NULL */
  uint64_t capacity;                              /* simulated device, bytes */
  bool run_pair, run_random, run_sweep, run_miss; /* --workloads */
  bool run_calls;                                 /* --workloads calls */
  size_t call_pages[BENCH_MAX_CALLS];             /* --call-pages */
  int n_call_pages;
  size_t miss_pages[BENCH_MAX_MISS]; /* --miss-pages */
  int n_miss;
  churn_spec_t random;                /* --live, --random-range */
  size_t sweep_live[BENCH_MAX_SWEEP]; /* --sweep-live */
  int n_sweep;
  size_t sweep_lo, sweep_hi; /* --sweep-range */
} bench_opts_t;

/* ---- contenders ----------------------------------------------------------- */

typedef struct contender_s contender_t;

/* Run `n` alloc+free pairs of `size` bytes on `stream`; 0 or an error text. */
typedef const char *(*pairs_fn)(contender_t *c, void *stream, size_t size, uint64_t n);
/* One allocation, one free, and the end of a timed loop (asynchronous
 * contenders wait for their stream there; NULL: nothing to wait for). */
typedef const char *(*alloc_fn)(contender_t *c, void *stream, size_t size, void **out);
typedef const char *(*free_fn)(contender_t *c, void *stream, void *ptr);
typedef const char *(*sync_fn)(contender_t *c, void *stream);

/* One thread's live set in a churn workload, kept across repetitions: the
 * blocks, and the steps (block index, new size) drawn up front and cycled. */
typedef struct churn_s {
  void **ptrs;    /* live blocks */
  size_t live;    /* entries of ptrs */
  uint32_t *slot; /* step i frees ptrs[slot[i]] ... */
  size_t *size;   /* ... and allocates size[i] bytes there */
  size_t m, pos;  /* steps drawn; the next one */
} churn_t;

struct contender_s {
  char name[128];      /* the config's base name, or "cudaMalloc"... */
  char policy[128];    /* the policy stack, or what the contender is */
  const char *backend; /* "sim", "cuda" */
  pairs_fn pairs;
  alloc_fn alloc1;
  free_fn free1;
  sync_fn sync;
  churn_t churn[BENCH_MAX_THREADS]; /* per thread, while a churn workload runs */
  gmr_runtime_t *rt;                /* gmr contenders */
  void *streams[BENCH_MAX_THREADS]; /* one per thread */
  uint64_t pairs_done;              /* allocations (each freed) so far, warm-ups included */
  pthread_mutex_t count_lock;       /* guards pairs_done */
  /* PyTorch shim. */
  void *(*torch_alloc)(size_t size, void *stream);
  void (*torch_free)(void *ptr);
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *gmr_pairs(contender_t *c, void *stream, size_t size, uint64_t n) {
  gmr_runtime_t *rt = c->rt;
  for (uint64_t i = 0; i < n; ++i) {
    void *p;
    if (gmr_alloc(rt, size, stream, &p) != 0) return gmr_last_error(rt);
    if (gmr_free(rt, p) != 0) return gmr_last_error(rt);
  }
  return NULL;
}

static const char *gmr_alloc1(contender_t *c, void *stream, size_t size, void **out) {
  return gmr_alloc(c->rt, size, stream, out) == 0 ? NULL : gmr_last_error(c->rt);
}

static const char *gmr_free1(contender_t *c, void *stream, void *ptr) {
  (void)stream;
  return gmr_free(c->rt, ptr) == 0 ? NULL : gmr_last_error(c->rt);
}

#ifdef GMR_HAVE_CUDA
static const char *cuda_malloc1(contender_t *c, void *stream, size_t size, void **out) {
  (void)c, (void)stream;
  cudaError_t e = cudaMalloc(out, size);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *cuda_free1(contender_t *c, void *stream, void *ptr) {
  (void)c, (void)stream;
  cudaError_t e = cudaFree(ptr);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *cuda_async1(contender_t *c, void *stream, size_t size, void **out) {
  (void)c;
  cudaError_t e = cudaMallocAsync(out, size, (cudaStream_t)stream);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *cuda_async_free1(contender_t *c, void *stream, void *ptr) {
  (void)c;
  cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)stream);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *cuda_async_sync(contender_t *c, void *stream) {
  (void)c;
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *torch_alloc1(contender_t *c, void *stream, size_t size, void **out) {
  *out = c->torch_alloc(size, stream);
  return *out ? NULL : "PyTorch's allocator failed (see the shim's message above)";
}

static const char *torch_free1(contender_t *c, void *stream, void *ptr) {
  (void)stream;
  c->torch_free(ptr);
  return NULL;
}

static const char *cuda_malloc_pairs(contender_t *c, void *stream, size_t size, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    void *p;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  return NULL;
}

static const char *cuda_async_pairs(contender_t *c, void *stream, size_t size, uint64_t n) {
  cudaStream_t s = stream;
  for (uint64_t i = 0; i < n; ++i) {
    void *p;
    cudaError_t e = cudaMallocAsync(&p, size, s);
    if (e == cudaSuccess) e = cudaFreeAsync(p, s);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  cudaError_t e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *torch_pairs(contender_t *c, void *stream, size_t size, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    void *p = c->torch_alloc(size, stream);
    if (p == NULL) return "PyTorch's allocator failed (see the shim's message above)";
    c->torch_free(p);
  }
  return NULL;
}
#endif

/* ---- one measurement -------------------------------------------------------- */

typedef struct worker_s {
  contender_t *c;
  int cpu;    /* the CPU to run on, -1: anywhere */
  int ran_on; /* the CPU it was on at the end of its loop (sched_getcpu) */
  pthread_barrier_t *barrier;
  atomic_int *running; /* threads past the barrier (start_together) */
  int threads;
  void *stream;
  size_t size;              /* WL_PAIR: bytes */
  const churn_spec_t *spec; /* churn workloads: the live set; NULL: pairs */
  churn_t *churn;           /* churn workloads: this thread's live set */
  uint64_t pairs;           /* pairs, or churn steps (one free + one alloc) */
  uint64_t t0, t1;          /* ns, the timed loop's start and end */
  const char *error;        /* NULL: fine */
} worker_t;

/* Start the timed loops together: a thread woken from the barrier may run
 * milliseconds after the others (its CPU was idle), which the aggregate
 * (first start to last end) would count as time.  So after the barrier each
 * thread says it is running and spins until all are, yielding now and then
 * in case threads share CPUs. */
static void start_together(worker_t *w) {
  pthread_barrier_wait(w->barrier);
  atomic_fetch_add_explicit(w->running, 1, memory_order_acq_rel);
  for (unsigned spins = 1; atomic_load_explicit(w->running, memory_order_acquire) < w->threads;
       ++spins)
    if (spins % 1024 == 0) sched_yield();
}

static void count_pairs(contender_t *c, uint64_t n) {
  pthread_mutex_lock(&c->count_lock);
  c->pairs_done += n;
  pthread_mutex_unlock(&c->count_lock);
}

/* ---- churn workloads ---------------------------------------------------------- */

/* xorshift64*: the steps are the same for every contender and every run. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* A size log-uniform in [lo, hi]: exp of a uniform draw in [ln lo, ln hi]. */
static size_t rng_size(uint64_t *s, size_t lo, size_t hi) {
  double u = (double)(rng_next(s) >> 11) / 9007199254740992.0; /* [0, 1) */
  double v = exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
  size_t n = (size_t)v;
  return n < lo ? lo : n > hi ? hi : n;
}

static const char *churn_steps(contender_t *c, void *stream, churn_t *ch, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    size_t k = ch->slot[ch->pos];
    const char *e = c->free1(c, stream, ch->ptrs[k]);
    if (e == NULL) e = c->alloc1(c, stream, ch->size[ch->pos], &ch->ptrs[k]);
    if (e != NULL) {
      ch->ptrs[k] = NULL; /* freed, not replaced */
      return e;
    }
    if (++ch->pos == ch->m) ch->pos = 0;
  }
  return NULL;
}

/* Build a thread's live set (untimed): `live` blocks, the steps drawn from
 * a seed of the thread's index, and one pass over the steps so the
 * contender's caches reach their steady state before anything is timed. */
static const char *churn_setup(contender_t *c, void *stream, churn_t *ch, const churn_spec_t *sp,
                               int thread) {
  uint64_t seed = 0x9E3779B97F4A7C15ull ^ ((uint64_t)(thread + 1) * 0xD1B54A32D192ED03ull);
  ch->live = sp->live;
  ch->m = sp->live * 2 > 8192 ? sp->live * 2 : 8192;
  ch->pos = 0;
  ch->ptrs = calloc(ch->live, sizeof *ch->ptrs);
  ch->slot = malloc(ch->m * sizeof *ch->slot);
  ch->size = malloc(ch->m * sizeof *ch->size);
  if (ch->ptrs == NULL || ch->slot == NULL || ch->size == NULL) return "out of host memory";
  for (size_t i = 0; i < ch->m; ++i) {
    ch->slot[i] = (uint32_t)(rng_next(&seed) % ch->live);
    ch->size[i] = rng_size(&seed, sp->lo, sp->hi);
  }
  for (size_t i = 0; i < ch->live; ++i) {
    const char *e = c->alloc1(c, stream, rng_size(&seed, sp->lo, sp->hi), &ch->ptrs[i]);
    if (e != NULL) return e;
    count_pairs(c, 1);
  }
  const char *e = churn_steps(c, stream, ch, ch->m);
  count_pairs(c, ch->m);
  return e;
}

/* Free a thread's live set. */
static const char *churn_teardown(contender_t *c, void *stream, churn_t *ch) {
  const char *err = NULL;
  for (size_t i = 0; ch->ptrs && i < ch->live; ++i) {
    const char *e = ch->ptrs[i] ? c->free1(c, stream, ch->ptrs[i]) : NULL;
    if (err == NULL) err = e;
  }
  if (err == NULL && c->sync != NULL) err = c->sync(c, stream);
  free(ch->ptrs);
  free(ch->slot);
  free(ch->size);
  memset(ch, 0, sizeof *ch);
  return err;
}

/* The CPUs this process may use (sched_getaffinity at start), for --pin. */
static cpu_set_t bench_allowed;
static int bench_cpus[1024];
static int bench_n_cpus;

static void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* Give the calling thread every allowed CPU again. */
static void unpin(void) {
  pthread_setaffinity_np(pthread_self(), sizeof bench_allowed, &bench_allowed);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  contender_t *c = w->c;
  if (w->cpu >= 0) pin_to(w->cpu);
  if (w->spec != NULL) {
    /* A churn workload: the live set is built once (untimed) and kept. */
    if (w->churn->ptrs == NULL)
      w->error = churn_setup(c, w->stream, w->churn, w->spec, (int)(w->churn - c->churn));
    start_together(w);
    if (w->error != NULL) return NULL;
    w->t0 = now_ns();
    w->error = churn_steps(c, w->stream, w->churn, w->pairs);
    if (w->error == NULL && c->sync != NULL) w->error = c->sync(c, w->stream);
    w->t1 = now_ns();
    w->ran_on = sched_getcpu();
    count_pairs(c, w->pairs);
    return NULL;
  }
  /* One untimed pair first: it primes this stream's cache (a cached pair is
   * what is measured) and makes the thread's first-touch costs untimed. */
  w->error = c->pairs(c, w->stream, w->size, 1);
  start_together(w);
  if (w->error != NULL) return NULL;
  w->t0 = now_ns();
  w->error = c->pairs(c, w->stream, w->size, w->pairs);
  w->t1 = now_ns();
  w->ran_on = sched_getcpu();
  count_pairs(c, 1 + w->pairs);
  return NULL;
}

/* Aggregate ns per pair of `threads` threads running `pairs` pairs each. */
static int run_threads(contender_t *c, size_t size, const churn_spec_t *spec, int threads,
                       uint64_t pairs, double *out_ns, bool pin) {
  worker_t w[BENCH_MAX_THREADS];
  pthread_t tid[BENCH_MAX_THREADS];
  pthread_barrier_t barrier;
  if (pthread_barrier_init(&barrier, NULL, (unsigned)threads) != 0) {
    fprintf(stderr, "gmr-bench: cannot create a barrier\n");
    return 1;
  }
  atomic_int running = 0;
  int started = 0;
  for (int t = 0; t < threads; ++t) {
    w[t] = (worker_t){.c = c,
                      .cpu = pin && bench_n_cpus > 0 ? bench_cpus[t % bench_n_cpus] : -1,
                      .barrier = &barrier,
                      .running = &running,
                      .threads = threads,
                      .stream = c->streams[t],
                      .size = size,
                      .spec = spec,
                      .churn = &c->churn[t],
                      .pairs = pairs};
    if (threads == 1) {
      /* One thread runs on the main thread, pinned for the run only: threads
       * started later must not inherit the pin (each pins itself). */
      worker_main(&w[0]); /* the barrier of one thread does not wait */
      if (w[0].cpu >= 0) unpin();
      started = 1;
      break;
    }
    if (pthread_create(&tid[t], NULL, worker_main, &w[t]) != 0) {
      fprintf(stderr, "gmr-bench: cannot start thread %d: %s\n", t, strerror(errno));
      exit(1); /* the others wait on the barrier forever */
    }
    ++started;
  }
  if (threads > 1)
    for (int t = 0; t < started; ++t)
      pthread_join(tid[t], NULL);
  pthread_barrier_destroy(&barrier);
  if (pin && threads > 1 && threads <= bench_n_cpus) {
    /* Pinned threads must have run on as many CPUs as there are threads. */
    int distinct = 0;
    for (int t = 0; t < threads; ++t) {
      int seen = 0;
      for (int u = 0; u < t; ++u)
        seen |= w[u].ran_on == w[t].ran_on;
      distinct += !seen;
    }
    if (distinct != threads)
      fprintf(stderr, "gmr-bench: --pin: %d threads ran on %d distinct CPUs (affinity ignored?)\n",
              threads, distinct);
  }
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (int t = 0; t < threads; ++t) {
    if (w[t].error != NULL) {
      if (spec != NULL)
        fprintf(stderr, "gmr-bench: %s, %zu live blocks of %zu to %zu bytes, %d threads: %s\n",
                c->name, spec->live, spec->lo, spec->hi, threads, w[t].error);
      else
        fprintf(stderr, "gmr-bench: %s, %zu bytes, %d threads: %s\n", c->name, size, threads,
                w[t].error);
      return 1;
    }
    if (w[t].t0 < t0) t0 = w[t].t0;
    if (w[t].t1 > t1) t1 = w[t].t1;
  }
  /* Pairs: ns per pair; churn: ns per operation (a step is a free and an alloc). */
  *out_ns = (double)(t1 - t0) / ((double)threads * (double)pairs * (spec ? 2.0 : 1.0));
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- results -------------------------------------------------------------- */

typedef struct result_s {
  double single;                 /* median ns per pair, one thread */
  double single_min, single_max; /* over the repetitions */
  uint64_t pairs;                /* pairs per thread per repetition */
  double agg[BENCH_MAX_THREADS]; /* median aggregate ns per pair, per threads[i] */
} result_t;

/* Pairs (or churn steps) per repetition such that one thread runs for at
 * least min_time. */
static int calibrate(contender_t *c, const bench_opts_t *o, size_t size, const churn_spec_t *spec,
                     uint64_t *out) {
  if (o->fixed_pairs != 0) {
    *out = o->fixed_pairs;
    return 0;
  }
  uint64_t n = 64;
  for (;;) {
    double ns;
    if (run_threads(c, size, spec, 1, n, &ns, o->pin) != 0) return 1;
    double per = ns * (spec ? 2.0 : 1.0); /* ns per pair or per step */
    double total = per * (double)n;
    if (total >= o->min_time_ns || n >= (1ull << 32)) break;
    double want = o->min_time_ns / (per > 1 ? per : 1) * 1.1;
    n = want > (double)(n * 16) ? n * 16 : (uint64_t)want + 1;
  }
  *out = n;
  return 0;
}

/* Free every thread's live set of a churn workload. */
static int churn_end(contender_t *c, const bench_opts_t *o) {
  int rc = 0;
  for (int t = 0; t < o->max_threads; ++t) {
    const char *e = c->churn[t].ptrs ? churn_teardown(c, c->streams[t], &c->churn[t]) : NULL;
    if (e != NULL) {
      fprintf(stderr, "gmr-bench: %s: freeing the live blocks: %s\n", c->name, e);
      rc = 1;
    }
  }
  return rc;
}

/* One thread (median of the repetitions), then every thread count unless
 * one_thread; churn workloads keep their live sets until churn_end. */
static int measure(contender_t *c, const bench_opts_t *o, size_t size, const churn_spec_t *spec,
                   bool one_thread, result_t *r) {
  double v[BENCH_MAX_REPS];
  if (calibrate(c, o, size, spec, &r->pairs) != 0) return 1;
  for (int i = 0; i < o->reps; ++i)
    if (run_threads(c, size, spec, 1, r->pairs, &v[i], o->pin) != 0) return 1;
  r->single = median(v, o->reps);
  r->single_min = v[0];
  r->single_max = v[o->reps - 1];
  for (int k = 0; k < o->n_threads && !one_thread; ++k) {
    for (int i = 0; i < o->reps; ++i)
      if (run_threads(c, size, spec, o->threads[k], r->pairs, &v[i], o->pin) != 0) return 1;
    r->agg[k] = median(v, o->reps);
  }
  return 0;
}

/* A gmr runtime must have seen exactly the pairs the benchmark made (Note [Bench self-check]). */
static int gmr_self_check(contender_t *c) {
  gmr_stats_t st;
  if (gmr_stats(c->rt, &st) != 0) return 1;
  if (st.num_allocs != c->pairs_done || st.num_frees != c->pairs_done || st.allocations != 0) {
    fprintf(stderr,
            "gmr-bench: %s: the runtime counted %" PRIu64 " allocations, %" PRIu64
            " frees and %" PRIu64 " live, but the benchmark made %" PRIu64
            " allocations and freed them all\n",
            c->name, st.num_allocs, st.num_frees, st.allocations, c->pairs_done);
    return 1;
  }
  return 0;
}

/* ---- output --------------------------------------------------------------- */

/* Tables: one per workload, each with its header before its first row. */
static void print_header(const bench_opts_t *o, bench_kind_t kind) {
  static bool printed[4];
  if (printed[kind]) return;
  printed[kind] = true;
  if (kind == WL_MISS) {
    printf("\ngmr-bench: cache misses, microseconds per miss by the pages it maps, median of %d\n"
           "  repetitions, %s device: new: k pages created, mapped, made accessible;\n"
           "  held: k held pages mapped again at a new address (docs/benchmarks.md).\n\n",
           o->reps, o->cuda ? "CUDA" : "simulated");
    printf("%-18s %-28s %9s %9s | %10s %8s | %10s %8s\n", "contender", "policy", "page", "pages",
           "new us", "us/page", "held us", "us/page");
    return;
  }
  if (kind == WL_SWEEP) {
    printf("\ngmr-bench: live-blocks sweep, one thread, ns per operation (an alloc or a free),\n"
           "  random workload with sizes log-uniform in [%zu, %zu] bytes, median of %d\n"
           "  repetitions; growth: the largest figure over the one at the fewest live blocks.\n\n",
           o->sweep_lo, o->sweep_hi, o->reps);
    printf("%-18s %-28s |", "contender", "policy");
    for (int k = 0; k < o->n_sweep; ++k)
      printf(" %8zu", o->sweep_live[k]);
    printf(" | %6s\n", "growth");
    return;
  }
  if (kind == WL_PAIR)
    printf("gmr-bench: host time per alloc+free pair, median of %d repetitions, %s device%s\n"
           "  1T: one thread on one stream; NT: aggregate time per pair with N threads, each on\n"
           "  its own stream (wall time / all pairs); rate: the rate at %d threads over one.\n\n",
           o->reps, o->cuda ? "CUDA" : "simulated", o->pin ? ", threads pinned" : "",
           o->threads[o->n_threads - 1]);
  else
    printf("\ngmr-bench: random sizes, ns per operation (an alloc or a free), median of %d\n"
           "  repetitions, %s device%s: each thread keeps %zu blocks live on its own stream,\n"
           "  sizes log-uniform in [%zu, %zu] bytes, one free and one allocation per step;\n"
           "  NT: aggregate ns per operation with N threads; rate: %d threads over one.\n\n",
           o->reps, o->cuda ? "CUDA" : "simulated", o->pin ? ", threads pinned" : "",
           o->random.live, o->random.lo, o->random.hi, o->threads[o->n_threads - 1]);
  printf("%-18s %-28s %9s %9s |", "contender", "policy", kind == WL_PAIR ? "size" : "live",
         kind == WL_PAIR ? "1T ns" : "1T ns/op");
  for (int k = 0; k < o->n_threads; ++k)
    printf(" %7dT", o->threads[k]);
  printf(" | %5s\n", "rate");
}

static void print_row(const bench_opts_t *o, const contender_t *c, size_t size,
                      const churn_spec_t *spec, const result_t *r) {
  char sz[32];
  if (spec != NULL)
    snprintf(sz, sizeof sz, "%zu", spec->live);
  else
    gmr_format_size(size, sz, sizeof sz);
  printf("%-18s %-28s %9s %9.1f |", c->name, c->policy, sz, r->single);
  for (int k = 0; k < o->n_threads; ++k)
    printf(" %8.1f", r->agg[k]);
  printf(" | %4.2fx\n", r->single / r->agg[o->n_threads - 1]);
  fflush(stdout);
}

/* The sweep's growth: the largest figure over the first (fewest live blocks). */
static double sweep_growth(const double *ns, int n) {
  double hi = ns[0];
  for (int k = 1; k < n; ++k)
    if (ns[k] > hi) hi = ns[k];
  return hi / ns[0];
}

static void print_sweep_row(const bench_opts_t *o, const contender_t *c, const double *ns) {
  printf("%-18s %-28s |", c->name, c->policy);
  for (int k = 0; k < o->n_sweep; ++k)
    printf(" %8.1f", ns[k]);
  printf(" | %5.2fx\n", sweep_growth(ns, o->n_sweep));
  fflush(stdout);
}

static void print_json(FILE *f, const bench_opts_t *o, const contender_t *c, size_t size,
                       const churn_spec_t *spec, const result_t *r, bool first) {
  const char *unit = spec ? "ns_per_op" : "ns_per_pair";
  fprintf(f, "%s\n  {\"workload\": \"%s\", \"contender\": ", first ? "" : ",",
          spec ? "random" : "pair");
  tool_json_string(f, c->name);
  fprintf(f, ", \"policy\": ");
  tool_json_string(f, c->policy);
  fprintf(f, ", \"backend\": \"%s\", \"pinned\": %s, ", c->backend, o->pin ? "true" : "false");
  if (spec != NULL)
    fprintf(f, "\"live_blocks\": %zu, \"size_min\": %zu, \"size_max\": %zu, \"steps_per_rep\"",
            spec->live, spec->lo, spec->hi);
  else
    fprintf(f, "\"size\": %zu, \"pairs_per_rep\"", size);
  fprintf(f,
          ": %" PRIu64 ", \"reps\": %d, \"%s\": %.2f, \"%s_min\": %.2f, \"%s_max\": %.2f, "
          "\"threads\": [",
          r->pairs, o->reps, unit, r->single, unit, r->single_min, unit, r->single_max);
  for (int k = 0; k < o->n_threads; ++k)
    fprintf(f, "%s{\"threads\": %d, \"%s\": %.2f, \"%s\": %.0f}", k ? ", " : "", o->threads[k],
            unit, r->agg[k], spec ? "ops_per_second" : "pairs_per_second", 1e9 / r->agg[k]);
  fprintf(f, "], \"rate_max_threads_vs_one\": %.3f}", r->single / r->agg[o->n_threads - 1]);
  fflush(f);
}

static void print_sweep_json(FILE *f, const bench_opts_t *o, const contender_t *c, const double *ns,
                             const double *lo, const double *hi, bool first) {
  fprintf(f, "%s\n  {\"workload\": \"sweep\", \"contender\": ", first ? "" : ",");
  tool_json_string(f, c->name);
  fprintf(f, ", \"policy\": ");
  tool_json_string(f, c->policy);
  fprintf(f,
          ", \"backend\": \"%s\", \"pinned\": %s, \"size_min\": %zu, \"size_max\": %zu, "
          "\"reps\": %d, \"points\": [",
          c->backend, o->pin ? "true" : "false", o->sweep_lo, o->sweep_hi, o->reps);
  for (int k = 0; k < o->n_sweep; ++k)
    fprintf(f,
            "%s{\"live_blocks\": %zu, \"ns_per_op\": %.2f, \"ns_per_op_min\": %.2f, "
            "\"ns_per_op_max\": %.2f}",
            k ? ", " : "", o->sweep_live[k], ns[k], lo[k], hi[k]);
  fprintf(f, "], \"growth\": %.3f}", sweep_growth(ns, o->n_sweep));
  fflush(f);
}

/* ---- contender set-up ------------------------------------------------------- */

static int streams_new(contender_t *c, const bench_opts_t *o) {
  for (int t = 0; t < o->max_threads; ++t) {
    if (!o->cuda) {
      c->streams[t] = GMR_SIM_STREAM(t + 1);
      continue;
    }
#ifdef GMR_HAVE_CUDA
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      fprintf(stderr, "gmr-bench: cudaStreamCreate: %s\n", cudaGetErrorString(e));
      return 1;
    }
    c->streams[t] = s;
#endif
  }
  return 0;
}

static void streams_free(contender_t *c, const bench_opts_t *o) {
#ifdef GMR_HAVE_CUDA
  if (o->cuda)
    for (int t = 0; t < o->max_threads; ++t)
      cudaStreamDestroy(c->streams[t]);
#endif
}

static void base_name(const char *path, char *out, size_t len) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  size_t n = strlen(b) < len ? strlen(b) : len - 1; /* truncated to fit */
  memcpy(out, b, n);
  out[n] = '\0';
  char *dot = strrchr(out, '.');
  if (dot && (strcmp(dot, ".yaml") == 0 || strcmp(dot, ".yml") == 0)) *dot = '\0';
}

static int gmr_contender_new(const char *arg, const bench_opts_t *o, contender_t *c) {
  gmr_config_t *cfg;
  gmr_error_t err;
  char path[4096];
  if (gmr_config_find(arg, path, sizeof path) != 0) {
    fprintf(stderr, "gmr-bench: no configuration '%s' (not a file, nor a name in ./config or %s)\n",
            arg, gmr_config_dir());
    return 1;
  }
  int rc = gmr_config_load_file(path, &cfg, &err);
  if (rc != 0) {
    fprintf(stderr, "gmr-bench: %s\n", err.message);
    return 1;
  }
  if (o->cuda) {
    rc = gmr_runtime_new(cfg, 0, &c->rt);
  } else {
    gmr_sim_options_t sim = {.capacity = o->capacity};
    rc = gmr_runtime_new_sim(cfg, &sim, &c->rt);
  }
  gmr_config_free(cfg);
  if (rc != 0) {
    fprintf(stderr, "gmr-bench: %s: cannot create the runtime: %s (%s)\n", path, gmr_strerror(rc),
            gmr_thread_last_error());
    return 1;
  }
  c->backend = gmr_runtime_backend(c->rt);
  if (o->cuda && strcmp(c->backend, "cuda") != 0) {
    fprintf(stderr, "gmr-bench: %s runs on the %s device, not on CUDA\n", path, c->backend);
    gmr_runtime_free(c->rt);
    return 1;
  }
  base_name(path, c->name, sizeof c->name);
  snprintf(c->policy, sizeof c->policy, "%s", gmr_runtime_policy(c->rt));
  c->pairs = gmr_pairs;
  c->alloc1 = gmr_alloc1;
  c->free1 = gmr_free1;
  return 0;
}

static void emit(const bench_opts_t *o, const contender_t *c, size_t size, const churn_spec_t *spec,
                 const result_t *r, bool *first) {
  if (o->json) {
    print_json(stdout, o, c, size, spec, r, *first);
  } else {
    print_header(o, spec ? WL_RANDOM : WL_PAIR);
    print_row(o, c, size, spec, r);
  }
  if (o->json_file != NULL) print_json(o->json_file, o, c, size, spec, r, *first);
  *first = false;
}

/* The live-blocks sweep of one contender: the random workload on one
 * thread at each live-block count. */
static int sweep(contender_t *c, const bench_opts_t *o, bool *first) {
  double ns[BENCH_MAX_SWEEP], lo[BENCH_MAX_SWEEP], hi[BENCH_MAX_SWEEP];
  for (int k = 0; k < o->n_sweep; ++k) {
    churn_spec_t spec = {.live = o->sweep_live[k], .lo = o->sweep_lo, .hi = o->sweep_hi};
    result_t r;
    memset(&r, 0, sizeof r);
    int rc = measure(c, o, 0, &spec, true, &r);
    if (churn_end(c, o) != 0 || rc != 0) return 1;
    ns[k] = r.single, lo[k] = r.single_min, hi[k] = r.single_max;
  }
  if (o->json) {
    print_sweep_json(stdout, o, c, ns, lo, hi, *first);
  } else {
    print_header(o, WL_SWEEP);
    print_sweep_row(o, c, ns);
  }
  if (o->json_file != NULL) print_sweep_json(o->json_file, o, c, ns, lo, hi, *first);
  *first = false;
  return 0;
}

/* The miss workload of one gmr contender whose policy maps pages. */
static int miss_bench(contender_t *c, const bench_opts_t *o, bool *first) {
  gmr_runtime_t *rt = c->rt;
  int64_t P = 0;
  if (gmr_stat_get(rt, "stitch.page_size", &P) != 0 || P <= 0) {
    if (!o->json) {
      print_header(o, WL_MISS);
      printf("%-18s %-28s | no page maps: the workload is for policies that map pages\n", c->name,
             c->policy);
    }
    return 0;
  }
  void *s = c->streams[0];
  double med[BENCH_MAX_MISS][2];
  for (int k = 0; k < o->n_miss; ++k) {
    size_t pages = o->miss_pages[k], size = pages * (size_t)P;
    double t[2][BENCH_MAX_REPS];
    for (int r = 0; r < o->reps; ++r) {
      for (int w = 0; w < 2; ++w) {
        size_t n = w == 0 ? size : size - 512;
        void *p = NULL;
        if (w == 0 && gmr_empty_cache(rt) != 0) goto fail;
        int64_t m0 = 0, m1 = 0;
        gmr_stat_get(rt, "stitch.pages_mapped", &m0);
        uint64_t t0 = now_ns();
        int rc = gmr_alloc(rt, n, s, &p);
        uint64_t t1 = now_ns();
        gmr_stat_get(rt, "stitch.pages_mapped", &m1);
        if (rc != 0) goto fail;
        if (gmr_free(rt, p) != 0) goto fail;
        count_pairs(c, 1);
        if ((size_t)(m1 - m0) != pages) {
          fprintf(stderr, "gmr-bench: %s: a miss of %zu pages mapped %lld pages\n", c->name, pages,
                  (long long)(m1 - m0));
          return 1;
        }
        t[w][r] = (double)(t1 - t0) / 1e3;
      }
    }
    med[k][0] = median(t[0], o->reps);
    med[k][1] = median(t[1], o->reps);
  }
  gmr_empty_cache(rt);
  for (int f = 0; f < 2; ++f) {
    FILE *out = f == 0 ? (o->json ? stdout : NULL) : o->json_file;
    if (out == NULL) continue;
    fprintf(out, "%s\n  {\"workload\": \"miss\", \"contender\": ", *first ? "" : ",");
    tool_json_string(out, c->name);
    fprintf(out, ", \"policy\": ");
    tool_json_string(out, c->policy);
    fprintf(out, ", \"backend\": \"%s\", \"page_size\": %lld, \"reps\": %d, \"points\": [",
            c->backend, (long long)P, o->reps);
    for (int k = 0; k < o->n_miss; ++k)
      fprintf(out, "%s{\"pages\": %zu, \"new_us\": %.2f, \"held_us\": %.2f}", k ? ", " : "",
              o->miss_pages[k], med[k][0], med[k][1]);
    fprintf(out, "]}");
    fflush(out);
  }
  if (!o->json) {
    print_header(o, WL_MISS);
    for (int k = 0; k < o->n_miss; ++k)
      printf("%-18s %-28s %9lld %9zu | %10.1f %8.2f | %10.1f %8.2f\n", k ? "" : c->name,
             k ? "" : c->policy, (long long)P, o->miss_pages[k], med[k][0],
             med[k][0] / (double)o->miss_pages[k], med[k][1], med[k][1] / (double)o->miss_pages[k]);
  }
  *first = false;
  return 0;
fail:
  fprintf(stderr, "gmr-bench: %s: miss workload: %s\n", c->name, gmr_last_error(rt));
  return 1;
}

/* Measure one contender in one workload and print its rows. */
/* The measurements of a workload for one contender: a size each for pairs,
 * else one. */
static int runs_of(const bench_opts_t *o, bench_kind_t kind) {
  return kind == WL_PAIR ? o->n_sizes : 1;
}

/* One workload of one contender: for pairs, the size o->sizes[size_i]. */
static int bench_contender(contender_t *c, const bench_opts_t *o, bench_kind_t kind, int size_i,
                           bool *first) {
  /* The miss workload counts a policy's page maps: gmr runtimes only. */
  if (kind == WL_MISS && c->rt == NULL) return 0;
  pthread_mutex_init(&c->count_lock, NULL);
  int rc = streams_new(c, o);
  if (rc == 0 && kind == WL_PAIR) {
    result_t r;
    memset(&r, 0, sizeof r);
    rc = measure(c, o, o->sizes[size_i], NULL, false, &r);
    if (rc == 0 && c->rt != NULL) rc = gmr_self_check(c);
    if (rc == 0) emit(o, c, o->sizes[size_i], NULL, &r, first);
  }
  if (rc == 0 && kind == WL_RANDOM) {
    result_t r;
    memset(&r, 0, sizeof r);
    rc = measure(c, o, 0, &o->random, false, &r);
    if (churn_end(c, o) != 0) rc = 1;
    if (rc == 0 && c->rt != NULL) rc = gmr_self_check(c);
    if (rc == 0) emit(o, c, 0, &o->random, &r, first);
  }
  if (rc == 0 && kind == WL_SWEEP) {
    rc = sweep(c, o, first);
    if (rc == 0 && c->rt != NULL) rc = gmr_self_check(c);
  }
  if (rc == 0 && kind == WL_MISS) {
    rc = miss_bench(c, o, first);
    if (rc == 0) rc = gmr_self_check(c);
  }
  streams_free(c, o);
  pthread_mutex_destroy(&c->count_lock);
  return rc;
}

#ifdef GMR_HAVE_CUDA
/* A baseline keeps its state from one size to the next (PyTorch's
 * allocator is the process's own, and cannot be made again). */
static int bench_sizes(contender_t *c, const bench_opts_t *o, bench_kind_t kind, bool *first) {
  for (int s = 0; s < runs_of(o, kind); ++s)
    if (bench_contender(c, o, kind, s, first) != 0) return 1;
  return 0;
}

/* The CUDA contenders of one workload (Note [Bench contenders]). */
static int cuda_baselines(const bench_opts_t *o, bench_kind_t kind, bool *first) {
  static bool torch_ready; /* the shim is initialized once */
  contender_t c;
  memset(&c, 0, sizeof c);
  c.backend = "cuda";
  snprintf(c.name, sizeof c.name, "cudaMalloc");
  snprintf(c.policy, sizeof c.policy, "cudaMalloc+cudaFree");
  c.pairs = cuda_malloc_pairs;
  c.alloc1 = cuda_malloc1;
  c.free1 = cuda_free1;
  /* Not in the sweep: 100,000 live blocks through cudaMalloc take minutes
   * of set-up, and a call that caches nothing has no live set to slow it. */
  if (kind != WL_SWEEP && bench_sizes(&c, o, kind, first) != 0) return 1;

  cudaMemPool_t pool;
  uint64_t threshold = UINT64_MAX;
  cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, 0);
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (e != cudaSuccess) {
    fprintf(stderr, "gmr-bench: the default memory pool: %s\n", cudaGetErrorString(e));
    return 1;
  }
  memset(&c, 0, sizeof c);
  c.backend = "cuda";
  snprintf(c.name, sizeof c.name, "cudaMallocAsync");
  snprintf(c.policy, sizeof c.policy, "default pool, keeps all");
  c.pairs = cuda_async_pairs;
  c.alloc1 = cuda_async1;
  c.free1 = cuda_async_free1;
  c.sync = cuda_async_sync;
  if (bench_sizes(&c, o, kind, first) != 0) return 1;
  /* The pool keeps every byte it was given (the threshold above): hand it
   * back, so that PyTorch's allocator after it starts on an empty device. */
  e = cudaMemPoolTrimTo(pool, 0);
  if (e != cudaSuccess) {
    fprintf(stderr, "gmr-bench: trimming the default memory pool: %s\n", cudaGetErrorString(e));
    return 1;
  }

  if (o->torch_shim == NULL) return 0;
  void *h = dlopen(o->torch_shim, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "gmr-bench: --torch %s: %s\n", o->torch_shim, dlerror());
    return 1;
  }
  int (*init)(int, char *, size_t) = (int (*)(int, char *, size_t))dlsym(h, "gmr_bench_torch_init");
  memset(&c, 0, sizeof c);
  c.torch_alloc = (void *(*)(size_t, void *))dlsym(h, "gmr_bench_torch_alloc");
  c.torch_free = (void (*)(void *))dlsym(h, "gmr_bench_torch_free");
  const char *(*version)(void) = (const char *(*)(void))dlsym(h, "gmr_bench_torch_version");
  char why[512] = "";
  if (init == NULL || c.torch_alloc == NULL || c.torch_free == NULL || version == NULL) {
    fprintf(stderr, "gmr-bench: --torch %s: not a gmr-bench shim (tools/bench-torch.cpp)\n",
            o->torch_shim);
    return 1;
  }
  if (!torch_ready && init(0, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-bench: PyTorch's allocator: %s\n", why);
    return 1;
  }
  torch_ready = true;
  c.backend = "cuda";
  snprintf(c.name, sizeof c.name, "pytorch-native");
  snprintf(c.policy, sizeof c.policy, "c10 CUDACachingAllocator %s", version());
  c.pairs = torch_pairs;
  c.alloc1 = torch_alloc1;
  c.free1 = torch_free1;
  return bench_sizes(&c, o, kind, first); /* the shim stays loaded: c10 has no unload */
}
#endif

/* ---- command line ------------------------------------------------------------ */

/* The usage text is made from bench_options below: this, then one entry
 * per option, then bench_usage_tail. */
static const char bench_usage_head[] =
    "usage: gmr-bench [OPTIONS] CONFIG...\n"
    "\n"
    "Host time per cached alloc+free pair on one stream, and aggregate time per\n"
    "pair with N threads each on its own stream (median of the repetitions), for\n"
    "each CONFIG (a YAML file, or the name of a configuration in ./config or the\n"
    "installed ones, e.g. pytorch).\n"
    "\n";
static const char bench_usage_tail[] =
    "\n"
    "Exit status: 0 when every measurement ran, 1 when one could not (a\n"
    "configuration that does not load, a runtime that miscounts), 2 for usage\n"
    "errors.\n";

static int parse_list(const char *opt, const char *text, bool sizes, void *out, int max, int *n) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", text);
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (*n == max) {
      fprintf(stderr, "gmr-bench: %s: at most %d values\n", opt, max);
      return 1;
    }
    uint64_t v;
    if (sizes) {
      if (gmr_parse_size(tok, &v) != 0 || v == 0) {
        fprintf(stderr, "gmr-bench: %s: '%s' is not a size in bytes above 0 (e.g. 4KiB)\n", opt,
                tok);
        return 1;
      }
      ((size_t *)out)[(*n)++] = (size_t)v;
    } else {
      char *end;
      long t = strtol(tok, &end, 10);
      if (*end != '\0' || t < 1 || t > BENCH_MAX_THREADS) {
        fprintf(stderr, "gmr-bench: %s: '%s' is not a thread count in [1, %d]\n", opt, tok,
                BENCH_MAX_THREADS);
        return 1;
      }
      ((int *)out)[(*n)++] = (int)t;
    }
  }
  if (*n == 0) {
    fprintf(stderr, "gmr-bench: %s: the list is empty\n", opt);
    return 1;
  }
  return 0;
}

/* LO,HI: two sizes with 0 < LO <= HI. */
static int parse_range(const char *opt, const char *text, size_t *lo, size_t *hi) {
  size_t v[2];
  int n;
  if (parse_list(opt, text, true, v, 2, &n) != 0) return 1;
  if (n != 2 || v[0] > v[1]) {
    fprintf(stderr, "gmr-bench: %s: '%s' is not LO,HI with LO <= HI (e.g. 512,64MiB)\n", opt, text);
    return 1;
  }
  *lo = v[0], *hi = v[1];
  return 0;
}

static int parse_workloads(const char *opt, const char *text, bench_opts_t *o) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", text);
  o->run_pair = o->run_random = o->run_sweep = o->run_miss = o->run_calls = false;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcmp(tok, "pair") == 0)
      o->run_pair = true;
    else if (strcmp(tok, "random") == 0)
      o->run_random = true;
    else if (strcmp(tok, "sweep") == 0)
      o->run_sweep = true;
    else if (strcmp(tok, "miss") == 0)
      o->run_miss = true;
    else if (strcmp(tok, "calls") == 0)
      o->run_calls = true;
    else {
      fprintf(stderr, "gmr-bench: %s: '%s' is not one of pair, random, sweep, miss, calls\n", opt,
              tok);
      return 1;
    }
  }
  if (!o->run_pair && !o->run_random && !o->run_sweep && !o->run_miss && !o->run_calls) {
    fprintf(stderr, "gmr-bench: %s: the list is empty\n", opt);
    return 1;
  }
  return 0;
}

static int parse_int(const char *opt, const char *text, long lo, long hi, long *out) {
  char *end;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "gmr-bench: %s: '%s' is not an integer in [%ld, %ld]\n", opt, text, lo, hi);
    return 1;
  }
  *out = v;
  return 0;
}

/* What an option's value is, and how it is stored at its destination. */
typedef enum bench_arg_e {
  BA_SET,       /* no value: the bool becomes true */
  BA_CLEAR,     /* no value: the bool becomes false */
  BA_DEVICE,    /* sim or cuda: the bool (cuda) */
  BA_SIZES,     /* a list of sizes (size_t[]; count: int at dest_n) */
  BA_PAGES,     /* a list of page counts, each <= 65536 (size_t[]; count at dest_n) */
  BA_THREADS,   /* a list of thread counts in [1, BENCH_MAX_THREADS] (int[]; count at dest_n) */
  BA_INT,       /* an integer in [lo, hi] (int) */
  BA_COUNT,     /* an integer in [lo, hi] (size_t) */
  BA_COUNT64,   /* an integer in [lo, hi] (uint64_t) */
  BA_MS,        /* milliseconds in [lo, hi] (double, in ns) */
  BA_CAPACITY,  /* a size of 1MiB or more (uint64_t) */
  BA_RANGE,     /* LO,HI: two sizes (size_t at dest, size_t at dest_n) */
  BA_WORKLOADS, /* a list of workload names (the run_* bools) */
  BA_TEXT,      /* kept as given (const char *) */
  BA_HELP,      /* no value: the usage text, exit 0 */
  BA_VERSION    /* no value: the version, exit 0 */
} bench_arg_t;

/* One option of the command line: its getopt_long entry, how its value is
 * parsed and where it goes, and its lines of the usage text. */
typedef struct bench_option_s {
  const char *name;    /* the long option, without "--" */
  char short_name;     /* its short option, or 0 */
  bench_arg_t arg;     /* what its value is */
  size_t dest, dest_n; /* offsetof(bench_opts_t, ...): the value; a list's count, a range's HI */
  long lo, hi;         /* integers: the bounds; lists: hi = the most values */
  const char *metavar; /* the value's name in the usage text; NULL: it takes none */
  const char *help;    /* its usage text, lines apart by '\n' */
} bench_option_t;

#define BO(field) offsetof(bench_opts_t, field)
static const bench_option_t bench_options[] = {
    {"device", 0, BA_DEVICE, BO(cuda), 0, 0, 0, "sim|cuda",
     "where the runtimes run (default sim); cuda also measures\n"
     "cudaMalloc, cudaMallocAsync and, with --torch, PyTorch"},
    {"sizes", 0, BA_SIZES, BO(sizes), BO(n_sizes), 0, BENCH_MAX_SIZES, "LIST",
     "request sizes, e.g. 4KiB,1MiB (the default)"},
    {"threads", 0, BA_THREADS, BO(threads), BO(n_threads), 0, BENCH_MAX_THREADS, "LIST",
     "thread counts (default 1,2,4,8,16)"},
    {"reps", 0, BA_INT, BO(reps), 0, 1, BENCH_MAX_REPS, "N",
     "repetitions, median reported (default 7)"},
    {"min-time", 0, BA_MS, BO(min_time_ns), 0, 1, 60000, "MS",
     "one repetition on one thread lasts at least MS ms\n"
     "(default 20)"},
    {"pairs", 0, BA_COUNT64, BO(fixed_pairs), 0, 1, 1L << 40, "N",
     "pairs per thread per repetition instead of --min-time\n"
     "(for instruction counts: valgrind --tool=callgrind)"},
    {"capacity", 0, BA_CAPACITY, BO(capacity), 0, 0, 0, "SIZE",
     "memory of the simulated device (default 143771MiB, an\n"
     "H200, as every gmr tool)"},
    {"torch", 0, BA_TEXT, BO(torch_shim), 0, 0, 0, "SHIM.so",
     "PyTorch's allocator through tools/bench-torch.cpp"},
    {"no-baselines", 0, BA_CLEAR, BO(baselines), 0, 0, 0, NULL,
     "with --device cuda, measure the configurations only"},
    {"pin", 0, BA_SET, BO(pin), 0, 0, 0, NULL,
     "run thread t on CPU t (mod the CPUs allowed): steadier\n"
     "figures"},
    {"json", 0, BA_SET, BO(json), 0, 0, 0, NULL, "one JSON array instead of the table"},
    {"json-file", 0, BA_TEXT, BO(json_path), 0, 0, 0, "PATH",
     "the table, and the JSON array written to PATH"},
    {"workloads", 0, BA_WORKLOADS, 0, 0, 0, 0, "LIST",
     "pair, random, sweep, miss, calls (default pair;\n"
     "docs/benchmarks.md)"},
    {"live", 0, BA_COUNT, BO(random.live), 0, 1, 1L << 24, "N",
     "random: blocks each thread keeps live (default 512)"},
    {"random-range", 0, BA_RANGE, BO(random.lo), BO(random.hi), 0, 0, "LO,HI",
     "random: sizes, log-uniform (default 512,64MiB)"},
    {"sweep-live", 0, BA_SIZES, BO(sweep_live), BO(n_sweep), 0, BENCH_MAX_SWEEP, "LIST",
     "sweep: live-block counts (default\n"
     "10,100,1000,10000,100000)"},
    {"sweep-range", 0, BA_RANGE, BO(sweep_lo), BO(sweep_hi), 0, 0, "LO,HI",
     "sweep: sizes, log-uniform (default 512,4MiB)"},
    {"miss-pages", 0, BA_PAGES, BO(miss_pages), BO(n_miss), 0, BENCH_MAX_MISS, "LIST",
     "miss: pages per miss (default 1,4,16,64,256)"},
    {"call-pages", 0, BA_PAGES, BO(call_pages), BO(n_call_pages), 0, BENCH_MAX_CALLS, "LIST",
     "calls: pages per timed call (default 1,64)"},
    {"help", 'h', BA_HELP, 0, 0, 0, 0, NULL, "print this help and exit"},
    {"version", 'V', BA_VERSION, 0, 0, 0, 0, NULL, "print the version and exit"},
};
#undef BO
#define BENCH_N_OPTIONS (sizeof bench_options / sizeof *bench_options)
#define BENCH_OPT_VAL   256 /* getopt_long's value for bench_options[i]: BENCH_OPT_VAL + i */

/* The usage text: an option's first line starts at column 21 (24 when its
 * name and value are too long for that), the others at column 21. */
static void bench_usage(FILE *f) {
  fputs(bench_usage_head, f);
  for (size_t i = 0; i < BENCH_N_OPTIONS; ++i) {
    const bench_option_t *d = &bench_options[i];
    char left[64] = "";
    if (d->short_name) snprintf(left, sizeof left, "-%c, ", d->short_name);
    size_t len = strlen(left);
    snprintf(left + len, sizeof left - len, "--%s%s%s", d->name, d->metavar ? " " : "",
             d->metavar ? d->metavar : "");
    const char *line = d->help;
    size_t cut = strcspn(line, "\n");
    fprintf(f, "  %-*s%.*s\n", strlen(left) <= 18 ? 19 : 22, left, (int)cut, line);
    for (line += cut; *line == '\n'; line += cut) {
      ++line;
      cut = strcspn(line, "\n");
      fprintf(f, "%21s%.*s\n", "", (int)cut, line);
    }
  }
  fputs(bench_usage_tail, f);
}

/* The entry of bench_options that getopt_long's value c stands for; NULL
 * for '?' and ':' (an unknown option, a missing value). */
static const bench_option_t *bench_option_of(int c) {
  if (c >= BENCH_OPT_VAL && c < BENCH_OPT_VAL + (int)BENCH_N_OPTIONS)
    return &bench_options[c - BENCH_OPT_VAL];
  for (size_t i = 0; i < BENCH_N_OPTIONS; ++i)
    if (c != 0 && bench_options[i].short_name == c) return &bench_options[i];
  return NULL;
}

/* One option's value into *o (bench_options[i]): 0, or CLI_USAGE_ERROR with
 * the message printed; --help and --version exit here. */
static int bench_apply(const bench_option_t *d, const char *v, bench_opts_t *o) {
  char *at = (char *)o + d->dest, opt[32];
  snprintf(opt, sizeof opt, "--%s", d->name);
  long n = 0;
  int bad = 0;
  switch (d->arg) {
  case BA_SET:
  case BA_CLEAR:
    *(bool *)at = d->arg == BA_SET;
    break;
  case BA_DEVICE:
    if (strcmp(v, "sim") != 0 && strcmp(v, "cuda") != 0)
      return cli_usage_error("gmr-bench", "--device: '%s' is neither sim nor cuda", v);
    *(bool *)at = strcmp(v, "cuda") == 0;
    break;
  case BA_SIZES:
  case BA_PAGES:
  case BA_THREADS:
    bad = parse_list(opt, v, d->arg != BA_THREADS, at, (int)d->hi, (int *)((char *)o + d->dest_n));
    for (int k = 0; !bad && d->arg == BA_PAGES && k < *(int *)((char *)o + d->dest_n); ++k)
      if (((size_t *)at)[k] > 65536) {
        fprintf(stderr, "gmr-bench: %s: %zu is more than 65536 pages\n", opt, ((size_t *)at)[k]);
        bad = 1;
      }
    break;
  case BA_INT:
  case BA_COUNT:
  case BA_COUNT64:
  case BA_MS:
    if ((bad = parse_int(opt, v, d->lo, d->hi, &n)) != 0) break;
    if (d->arg == BA_INT) *(int *)at = (int)n;
    if (d->arg == BA_COUNT) *(size_t *)at = (size_t)n;
    if (d->arg == BA_COUNT64) *(uint64_t *)at = (uint64_t)n;
    if (d->arg == BA_MS) *(double *)at = (double)n * 1e6;
    break;
  case BA_CAPACITY:
    if (gmr_parse_size(v, (uint64_t *)at) != 0 || *(uint64_t *)at < (1u << 20))
      return cli_usage_error("gmr-bench", "--capacity: '%s' is not a size of 1MiB or more", v);
    break;
  case BA_RANGE:
    bad = parse_range(opt, v, (size_t *)at, (size_t *)((char *)o + d->dest_n));
    break;
  case BA_WORKLOADS:
    bad = parse_workloads(opt, v, o);
    break;
  case BA_TEXT:
    *(const char **)at = v;
    break;
  case BA_HELP:
    bench_usage(stdout);
    exit(0);
  case BA_VERSION:
    exit(cli_version("gmr-bench"));
  }
  return bad ? CLI_USAGE_ERROR : 0;
}

/* The command line, with getopt_long over bench_options: 0, or
 * CLI_USAGE_ERROR with the message printed.  Nothing is opened or measured
 * here (--json-file is opened by main once the whole line is known to be
 * good). */
static int parse_args(int argc, char **argv, bench_opts_t *o, int *first_config) {
  *o = (bench_opts_t){.reps = 7,
                      .min_time_ns = 20e6,
                      .baselines = true,
                      .sizes = {4096, 1 << 20},
                      .n_sizes = 2,
                      .threads = {1, 2, 4, 8, 16},
                      .n_threads = 5,
                      .capacity = GMR_SIM_DEFAULT_CAPACITY,
                      .run_pair = true,
                      .random = {.live = 512, .lo = 512, .hi = (size_t)64 << 20},
                      .sweep_live = {10, 100, 1000, 10000, 100000},
                      .n_sweep = 5,
                      .sweep_lo = 512,
                      .sweep_hi = (size_t)4 << 20,
                      .miss_pages = {1, 4, 16, 64, 256},
                      .n_miss = 5,
                      .call_pages = {1, 64},
                      .n_call_pages = 2};
  struct option longopts[BENCH_N_OPTIONS + 1];
  char shorts[2 * BENCH_N_OPTIONS + 2] = ":";
  for (size_t i = 0; i < BENCH_N_OPTIONS; ++i) {
    const bench_option_t *d = &bench_options[i];
    longopts[i] = (struct option){d->name, d->metavar ? required_argument : no_argument, NULL,
                                  BENCH_OPT_VAL + (int)i};
    size_t len = strlen(shorts);
    if (d->short_name) shorts[len++] = d->short_name;
    if (d->short_name && d->metavar) shorts[len++] = ':';
    shorts[len] = '\0';
  }
  longopts[BENCH_N_OPTIONS] = (struct option){NULL, 0, NULL, 0};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
    const bench_option_t *d = bench_option_of(c);
    if (d == NULL) return cli_bad_option("gmr-bench", argv, c, longopts);
    int err = bench_apply(d, optarg, o);
    if (err != 0) return err;
  }
  o->max_threads = 1;
  for (int k = 0; k < o->n_threads; ++k)
    if (o->threads[k] > o->max_threads) o->max_threads = o->threads[k];
  if (o->torch_shim != NULL && !o->cuda)
    return cli_usage_error("gmr-bench", "%s", "--torch needs --device cuda");
#ifndef GMR_HAVE_CUDA
  if (o->cuda)
    return cli_usage_error("gmr-bench", "%s",
                           "--device cuda: this gmr-bench was built without CUDA");
#endif
  bool calls_only = o->run_calls && !o->run_pair && !o->run_random && !o->run_sweep && !o->run_miss;
  if (optind == argc && !(o->cuda && o->baselines) && !calls_only)
    return cli_usage_error("gmr-bench", "%s",
                           "no configuration given (a YAML file or a name, e.g. pytorch)");
  *first_config = optind;
  return 0;
}

int main(int argc, char **argv) {
  bench_opts_t o;
  int first_config = 0;
  if (parse_args(argc, argv, &o, &first_config) != 0) return CLI_USAGE_ERROR;
  tool_out_t json_out; /* tools/outfile.h: never over a CONFIG, renamed into place */
  if (o.json_path != NULL) {
    char why[4200];
    if (tool_out_input(o.json_path, (const char *const *)&argv[first_config],
                       (size_t)(argc - first_config)) >= 0) {
      fprintf(stderr, "gmr-bench: --json-file %s: refusing to write over an input\n", o.json_path);
      return 1;
    }
    if (tool_out_open(&json_out, o.json_path, why, sizeof why) != 0) {
      fprintf(stderr, "gmr-bench: --json-file %s: %s\n", o.json_path, why);
      return 1;
    }
    o.json_file = json_out.f;
  }
  bool first = true;
#ifdef GMR_HAVE_CUDA
  int devices = 0;
  bool calls_only = o.run_calls && !o.run_pair && !o.run_random && !o.run_sweep && !o.run_miss;
  if (o.cuda && !calls_only && (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)) {
    fprintf(stderr, "gmr-bench: --device cuda: no CUDA device\n");
    if (o.json_file != NULL) tool_out_abort(&json_out);
    return 1;
  }
#endif
  if (o.pin) {
    if (sched_getaffinity(0, sizeof bench_allowed, &bench_allowed) == 0)
      for (int cpu = 0; cpu < CPU_SETSIZE && bench_n_cpus < 1024; ++cpu)
        if (CPU_ISSET(cpu, &bench_allowed)) bench_cpus[bench_n_cpus++] = cpu;
  }
  if (o.json) printf("[");
  if (o.json_file != NULL) fprintf(o.json_file, "[");
  int rc = 0;
  /* Workload by workload, so each table is whole; a fresh runtime for each
   * workload and, for pairs, each size: a runtime that has run N threads on
   * N streams is not one that has seen one stream (the caching policy's
   * one-stream deferred free, for one, stops once a second stream comes),
   * so no size's one-thread figure is taken after another size's threads. */
  const bool run[4] = {o.run_pair, o.run_random, o.run_sweep, o.run_miss};
  for (int kind = WL_PAIR; kind <= WL_MISS && rc == 0; ++kind) {
    if (!run[kind]) continue;
    for (int i = first_config; i < argc && rc == 0; ++i) {
      for (int s = 0; s < runs_of(&o, (bench_kind_t)kind) && rc == 0; ++s) {
        contender_t *c = calloc(1, sizeof *c);
        if (c == NULL || gmr_contender_new(argv[i], &o, c) != 0) {
          free(c);
          rc = 1;
          break;
        }
        rc = bench_contender(c, &o, (bench_kind_t)kind, s, &first);
        gmr_runtime_free(c->rt);
        free(c);
      }
    }
#ifdef GMR_HAVE_CUDA
    if (rc == 0 && o.cuda && o.baselines) rc = cuda_baselines(&o, (bench_kind_t)kind, &first);
#endif
  }
  if (rc == 0 && o.run_calls) {
    bench_calls_args_t ca = {.cuda = o.cuda,
                             .json = o.json,
                             .json_file = o.json_file,
                             .reps = o.reps,
                             .pages = o.call_pages,
                             .n_pages = o.n_call_pages,
                             .first = &first};
    rc = bench_calls(&ca);
  }
  if (o.json) printf("\n]\n");
  if (o.json_file != NULL) {
    fprintf(o.json_file, "\n]\n");
    char why[4200];
    if (tool_out_commit(&json_out, why, sizeof why) != 0) {
      fprintf(stderr, "gmr-bench: --json-file %s: %s\n", o.json_path, why);
      rc = 1;
    }
  }
  return rc;
}
