/* dispatch.c: tests of the dispatcher's hot paths (lib/runtime/runtime.c).
 *
 * What gmr_alloc and gmr_free promise whatever the policy: argument checks
 * with their exact errors and out-parameters untouched; double frees and
 * foreign pointers refused before any state changes; the pointer map keeps
 * short probe sequences however aligned the addresses are; and any number of
 * threads, each on its own stream, can allocate and free on one runtime with
 * exact counts, for a policy the runtime serializes (direct) and for one that
 * locks itself (limit).  Also the records the direct policy reuses, and the
 * limit policy's cap, through the new locks.  And a snapshot of a
 * concurrent policy taken while other threads allocate is one consistent
 * moment (policy.h, rule 5: the policy quiesced around stats and walk).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "gmr.h"
#include "policy.h"
#include "runtime/runtime.h"
#include "runtime/stats.h"
#include "tap.h"

static gmr_runtime_t *new_runtime(const char *yaml) {
  gmr_config_t *cfg;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    diag("config: %s", err.message);
    exit(1);
  }
  gmr_sim_options_t sim = {.capacity = 1ull << 40};
  gmr_runtime_t *rt = NULL;
  if (gmr_runtime_new_sim(cfg, &sim, &rt) != 0) {
    diag("cannot create a runtime: %s", gmr__error_last());
    exit(1);
  }
  gmr_config_free(cfg);
  return rt;
}

static void test_arguments(void) {
  gmr_runtime_t *rt = new_runtime("policy: direct\n");
  void *sentinel = (void *)(uintptr_t)0x5a5a;
  void *p = sentinel;
  is_int(gmr_alloc(NULL, 64, NULL, &p), GMR_EINVAL, "gmr_alloc: NULL runtime is GMR_EINVAL");
  is_int(gmr_alloc(rt, 64, NULL, NULL), GMR_EINVAL, "gmr_alloc: NULL out-parameter is GMR_EINVAL");
  like(gmr_last_error(rt), "the out-parameter is NULL", "... and says which argument");
  is_int(gmr_alloc(rt, 0, NULL, &p), GMR_EINVAL, "gmr_alloc: size 0 is GMR_EINVAL");
  like(gmr_last_error(rt), "size 0", "... and says so");
  is_int(gmr_alloc(rt, (size_t)1 << 60, NULL, &p), GMR_ENOMEM, "gmr_alloc: 1 EiB is GMR_ENOMEM");
  like(gmr_last_error(rt), "more than 1EB memory (1152921504606846976 bytes requested)",
       "... with PyTorch's words and the size");
  is_ptr(p, sentinel, "the out-parameter is untouched by every refusal");
  is_int(gmr_free(NULL, sentinel), GMR_EINVAL, "gmr_free: NULL runtime is GMR_EINVAL");
  is_int(gmr_free(rt, NULL), 0, "gmr_free(NULL) is a no-op");

  gmr_stats_t st;
  is_int(gmr_alloc(rt, 1000, GMR_SIM_STREAM(1), &p), 0, "an allocation of 1000 bytes");
  is_int(gmr_free(rt, (char *)p + 512), GMR_EBADPTR, "a pointer inside a block is foreign");
  like(gmr_last_error(rt), "was not allocated by this runtime, or was already freed",
       "... and the message says so");
  gmr_stats(rt, &st);
  is_u64(st.allocations, 1, "the refused free changed nothing: 1 live allocation");
  is_int(gmr_free(rt, p), 0, "the real free succeeds");
  is_int(gmr_free(rt, p), GMR_EBADPTR, "a double free is GMR_EBADPTR");
  gmr_stats(rt, &st);
  is_u64(st.num_frees, 1, "the double free was not counted: 1 free");
  is_u64(st.allocations, 0, "no live allocation");
  is_int(gmr_check(rt), 0, "the policy's invariants hold");
  gmr_runtime_free(rt);
}

/* Blocks whose addresses share many low bits (each a 2 MiB reservation on the
 * simulator, so 2 MiB apart) must not pile into one probe chain. */
static void test_map_probes(void) {
  enum { N = 8192 };
  gmr_runtime_t *rt = new_runtime("policy: direct\n");
  void **p = malloc(N * sizeof *p);
  int failed = 0;
  for (int i = 0; i < N; ++i)
    failed += gmr_alloc(rt, (size_t)2 << 20, NULL, &p[i]) != 0;
  is_int(failed, 0, "%d live blocks of 2 MiB", N);
  is_u64((uintptr_t)p[1] - (uintptr_t)p[0], (uint64_t)2 << 20,
         "consecutive blocks are 2 MiB apart (21 low address bits in common)");
  size_t longest = gmr__runtime_map_longest_probe(rt);
  ok(longest >= 1 && longest <= 12, "the longest probe in the pointer map is %zu slots (<= 12)",
     longest);
  size_t req = 0, alloc = 0;
  int wrong = 0;
  for (int i = 0; i < N; ++i) {
    wrong += gmr_alloc_size(rt, p[i], &req, &alloc) != 0 || req != (size_t)2 << 20;
  }
  is_int(wrong, 0, "every live block is found with its requested size");
  /* Free in a scattered order: backward-shift deletion must keep every
   * remaining entry reachable. */
  for (int i = 0; i < N; i += 2)
    failed += gmr_free(rt, p[i]) != 0;
  for (int i = N - 1; i > 0; i -= 2)
    failed += gmr_free(rt, p[i]) != 0;
  is_int(failed, 0, "all %d blocks free, in a scattered order", N);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.num_allocs, N, "num_allocs = %d", N);
  is_u64(st.num_frees, N, "num_frees = %d", N);
  is_u64(st.allocations, 0, "nothing live");
  is_u64(gmr__runtime_map_longest_probe(rt), 0, "the map is empty");
  free(p);
  gmr_runtime_free(rt);

  /* 512-byte steps: 8 low address bits in common. */
  rt = new_runtime("policy: direct\n");
  p = malloc(N * sizeof *p);
  for (int i = 0; i < N; ++i)
    failed += gmr_alloc(rt, 512, NULL, &p[i]) != 0;
  longest = gmr__runtime_map_longest_probe(rt);
  ok(failed == 0 && longest >= 1 && longest <= 12,
     "%d live blocks of 512 bytes: the longest probe is %zu slots (<= 12)", N, longest);
  for (int i = 0; i < N; ++i)
    failed += gmr_free(rt, p[i]) != 0;
  is_int(failed, 0, "and all free");
  free(p);
  gmr_runtime_free(rt);
}

/* Threads on their own streams use neighbouring blocks at one stride (a
 * BFC region cut into equal chunks): 16 such blocks must fall in 16
 * distinct shards of the pointer map, or two threads share a shard's lock
 * at every call.  Strides 256 B, 768 B and 1280 B times 2^k, up to 1 GiB,
 * from bases at 2 MiB boundaries plus 256-byte offsets. */
static void test_map_shards(void) {
  int bad = 0, first_bad_stride = 0;
  const size_t unit[3] = {256, 768, 1280};
  for (int u = 0; u < 3; ++u) {
    for (size_t stride = unit[u]; stride <= ((size_t)1 << 30); stride *= 2) {
      for (uint64_t b = 0; b < 64; ++b) {
        uintptr_t base = (uintptr_t)0x7f0000000000ull +
                         (uintptr_t)(b * 0x9E3779B1ull % 4096) * (2u << 20) +
                         (uintptr_t)(b * 40503u % 8192) * 256;
        size_t seen[16];
        int clash = 0;
        for (int i = 0; i < 16; ++i) {
          seen[i] = gmr__runtime_map_shard_of((const void *)(base + (uintptr_t)i * stride));
          for (int j = 0; j < i; ++j)
            clash |= seen[j] == seen[i];
        }
        if (clash && bad++ == 0) first_bad_stride = (int)(stride >> 8);
      }
    }
  }
  ok(bad == 0,
     "16 blocks at one stride lie in 16 shards (%d bases and strides clash; first: %d x 256 B)",
     bad, first_bad_stride);
}

/* ---- threads ---------------------------------------------------------------- */

#define THREADS 8
#define PAIRS   20000
#define KEEP    16 /* blocks each thread keeps live while it churns */

typedef struct worker_s {
  gmr_runtime_t *rt;
  int id;
  int errors;
} worker_t;

static void *churn(void *arg) {
  worker_t *w = arg;
  gmr_stream_t s = GMR_SIM_STREAM(w->id + 1);
  void *keep[KEEP];
  for (int i = 0; i < KEEP; ++i)
    w->errors += gmr_alloc(w->rt, 4096 + i, s, &keep[i]) != 0;
  for (int i = 0; i < PAIRS; ++i) {
    void *p;
    size_t size = 512 + (size_t)((i * 7 + w->id) % 64) * 512;
    if (gmr_alloc(w->rt, size, s, &p) != 0) {
      ++w->errors;
      continue;
    }
    size_t req = 0, alloc = 0;
    w->errors += gmr_alloc_size(w->rt, p, &req, &alloc) != 0 || req != size;
    w->errors += gmr_free(w->rt, p) != 0;
    /* No double free of p here: another thread may own that address by now.
     * A byte inside one of this thread's live blocks is never a block start. */
    w->errors += gmr_free(w->rt, (char *)keep[i % KEEP] + 1) != GMR_EBADPTR;
  }
  for (int i = 0; i < KEEP; ++i)
    w->errors += gmr_free(w->rt, keep[i]) != 0;
  return NULL;
}

static void test_threads(const char *name, const char *yaml) {
  gmr_runtime_t *rt = new_runtime(yaml);
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    w[i] = (worker_t){rt, i, 0};
    pthread_create(&t[i], NULL, churn, &w[i]);
  }
  int errors = 0;
  for (int i = 0; i < THREADS; ++i) {
    pthread_join(t[i], NULL);
    errors += w[i].errors;
  }
  is_int(errors, 0, "%s: %d threads on their own streams, no unexpected result", name, THREADS);
  gmr_stats_t st;
  gmr_stats(rt, &st);
  uint64_t want = (uint64_t)THREADS * (PAIRS + KEEP);
  is_u64(st.num_allocs, want, "%s: num_allocs = %d x (%d + %d)", name, THREADS, PAIRS, KEEP);
  is_u64(st.num_frees, want, "%s: num_frees the same (refused frees not counted)", name);
  is_u64(st.allocations, 0, "%s: nothing live", name);
  is_int(gmr_check(rt), 0, "%s: the invariants hold", name);
  gmr_runtime_free(rt);
}

/* ---- direct and limit through the new paths ---------------------------------- */

static void test_direct_records(void) {
  gmr_runtime_t *rt = new_runtime("policy: direct\n");
  void *p, *q = NULL;
  gmr_stats_t st;
  /* A fresh runtime has no record to reuse: the host failure is an OOM. */
  gmr__host_fail_nth(1);
  int rc = gmr_alloc(rt, 4096, NULL, &q);
  gmr__host_fail_nth(0);
  is_int(rc, GMR_ENOMEM, "direct: no host memory for a record is GMR_ENOMEM");
  like(gmr_last_error(rt), "direct: out of host memory", "... and says so");
  is_ptr(q, NULL, "... with the out-parameter untouched");
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 0, "... and nothing reserved on the device");
  is_int(gmr_alloc(rt, 4096, NULL, &p), 0, "an allocation");
  is_int(gmr_free(rt, p), 0, "its free keeps the record");
  gmr__host_fail_nth(1);
  rc = gmr_alloc(rt, 8192, NULL, &q);
  gmr__host_fail_nth(0);
  is_int(rc, 0, "direct: the next allocation reuses it, with no host allocation");
  gmr_stats(rt, &st);
  is_u64(st.allocated_bytes, 8192, "allocated_bytes = 8192");
  is_u64(st.reserved_bytes, 8192, "reserved_bytes = 8192");
  is_int(gmr_check(rt), 0, "the live list and the stats agree");
  is_int(gmr_free(rt, q), 0, "free");
  gmr_runtime_free(rt);
}

static void test_limit(void) {
  gmr_runtime_t *rt = new_runtime("policy: {name: limit, bytes: 1MiB, upstream: {name: direct}}\n");
  void *a, *b, *c = NULL;
  is_int(gmr_alloc(rt, 512 << 10, NULL, &a), 0, "limit 1 MiB: 512 KiB");
  is_int(gmr_alloc(rt, 512 << 10, NULL, &b), 0, "limit 1 MiB: another 512 KiB");
  is_int(gmr_alloc(rt, 1, NULL, &c), GMR_ENOMEM, "limit 1 MiB: one byte more is GMR_ENOMEM");
  like(gmr_last_error(rt),
       "limit of 1.00 MiB (1048576 bytes) reached. Tried to allocate 1 bytes (1 bytes) with "
       "1.00 MiB (1048576 bytes) already allocated.",
       "... naming the cap, the request and the bytes in use");
  is_ptr(c, NULL, "... with the out-parameter untouched");
  is_int(gmr_free(rt, a), 0, "free 512 KiB");
  is_int(gmr_alloc(rt, 512 << 10, NULL, &c), 0, "512 KiB fits again");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.ooms, 1, "ooms = 1");
  is_u64(st.limit_bytes, 1 << 20, "limit_bytes = 1048576");
  is_u64(st.allocated_bytes, 1 << 20, "allocated_bytes = 1048576");
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* The cap is exact across streams (each stream's credit sits in its own
 * shard): a refusal drains every shard first. */
static void test_limit_streams(void) {
  gmr_runtime_t *rt = new_runtime("policy: {name: limit, bytes: 1MiB, upstream: {name: direct}}\n");
  void *a, *b, *c = NULL;
  is_int(gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(1), &a), 0, "limit 1 MiB: 512 KiB on stream 1");
  is_int(gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(2), &b), 0, "limit 1 MiB: 512 KiB on stream 2");
  is_int(gmr_alloc(rt, 1, GMR_SIM_STREAM(3), &c), GMR_ENOMEM, "one byte on stream 3 is refused");
  like(gmr_last_error(rt), "with 1.00 MiB (1048576 bytes) already allocated",
       "... counting both streams' bytes");
  is_int(gmr_free(rt, a), 0, "free stream 1's block");
  is_int(gmr_alloc(rt, 512 << 10, GMR_SIM_STREAM(3), &c), 0,
         "512 KiB on stream 3 fits: stream 1's freed credit was drained to it");
  int64_t in_use = -1, refused = -1;
  gmr_stat_get(rt, "limit_in_use_bytes", &in_use);
  gmr_stat_get(rt, "limit_refused", &refused);
  is_int(in_use, 1 << 20, "limit_in_use_bytes = 1048576");
  is_int(refused, 1, "limit_refused = 1");
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_stat_get(rt, "limit_in_use_bytes", &in_use);
  is_int(in_use, 0, "limit_in_use_bytes = 0 after the frees");
  is_int(gmr_check(rt), 0, "the limit's invariants hold");
  gmr_runtime_free(rt);
}

/* Threads whose quotas add up to the cap exactly: none may ever be refused,
 * however the credit is spread over the shards when one runs short. */
#define QUOTA 64
static void *quota_worker(void *arg) {
  worker_t *w = arg;
  gmr_stream_t s = GMR_SIM_STREAM(w->id + 1);
  void *p[QUOTA];
  for (int round = 0; round < 300; ++round) {
    int n = 0;
    for (; n < QUOTA; ++n)
      if (gmr_alloc(w->rt, 4096, s, &p[n]) != 0) {
        ++w->errors;
        break;
      }
    for (int i = 0; i < n; ++i)
      w->errors += gmr_free(w->rt, p[i]) != 0;
  }
  return NULL;
}

static void test_limit_exact_under_threads(void) {
  gmr_runtime_t *rt = new_runtime(
      "policy: {name: limit, bytes: 2MiB, upstream: {name: direct}}\n"); /* 8 x 64 x 4 KiB */
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    w[i] = (worker_t){rt, i, 0};
    pthread_create(&t[i], NULL, quota_worker, &w[i]);
  }
  int errors = 0;
  for (int i = 0; i < THREADS; ++i) {
    pthread_join(t[i], NULL);
    errors += w[i].errors;
  }
  is_int(errors, 0, "limit 2 MiB, %d threads each holding up to %d x 4 KiB: never refused", THREADS,
         QUOTA);
  int64_t in_use = -1, refused = -1;
  gmr_stat_get(rt, "limit_in_use_bytes", &in_use);
  gmr_stat_get(rt, "limit_refused", &refused);
  is_int(in_use, 0, "limit_in_use_bytes = 0 at the end");
  is_int(refused, 0, "limit_refused = 0");
  void *p[THREADS * QUOTA];
  int ok_n = 0;
  for (int i = 0; i < THREADS * QUOTA; ++i)
    ok_n += gmr_alloc(rt, 4096, GMR_SIM_STREAM(i % 5), &p[i]) == 0;
  is_int(ok_n, THREADS * QUOTA, "the whole cap is still there: %d x 4 KiB on 5 streams",
         THREADS * QUOTA);
  void *q = NULL;
  is_int(gmr_alloc(rt, 1, GMR_SIM_STREAM(7), &q), GMR_ENOMEM, "and not one byte more");
  for (int i = 0; i < THREADS * QUOTA; ++i)
    gmr_free(rt, p[i]);
  gmr_runtime_free(rt);
}

/* ---- a snapshot while other threads allocate ---------------------------------- */

typedef struct snap_worker_s {
  gmr_runtime_t *rt;
  int id;
  _Atomic int *stop;
  _Atomic long *ops; /* all workers' */
  int errors;
} snap_worker_t;

/* Allocations of many sizes on the thread's own stream, small and large (so
 * that segments come and go), some kept live a while. */
static void *snap_churn(void *arg) {
  snap_worker_t *w = arg;
  gmr_stream_t s = GMR_SIM_STREAM(w->id + 1);
  enum { LIVE = 24 };
  void *live[LIVE] = {NULL};
  uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
  while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int k = (int)(x % LIVE);
    if (live[k] != NULL) {
      w->errors += gmr_free(w->rt, live[k]) != 0;
      live[k] = NULL;
    } else {
      size_t size = (x >> 8) % 4 == 0 ? ((size_t)1 << 20) + (size_t)((x >> 16) % (12u << 20))
                                      : 512 + (size_t)((x >> 16) % 8192) * 64;
      w->errors += gmr_alloc(w->rt, size, s, &live[k]) != 0;
    }
    atomic_fetch_add_explicit(w->ops, 1, memory_order_relaxed);
  }
  for (int k = 0; k < LIVE; ++k)
    if (live[k] != NULL) w->errors += gmr_free(w->rt, live[k]) != 0;
  return NULL;
}

typedef struct snap_sums_s {
  uint64_t segments, allocated;
  uint64_t seg_size, seg_blocks; /* the segment being walked */
  int untiled;                   /* segments whose blocks do not tile them */
} snap_sums_t;

static void snap_seg_end(snap_sums_t *m) {
  if (m->seg_size != 0 && m->seg_blocks != m->seg_size) ++m->untiled;
  m->seg_size = m->seg_blocks = 0;
}

static int snap_walk(const gmr_walk_entry_t *e, void *ud) {
  snap_sums_t *m = ud;
  if (e->is_segment) {
    snap_seg_end(m);
    m->segments += e->size;
    m->seg_size = e->size;
    return 0;
  }
  m->seg_blocks += e->size;
  if (e->state == GMR_BLOCK_ALLOCATED) m->allocated += e->size;
  return 0;
}

/* One capture as runtime_capture makes it: the policy quiesced once around
 * its statistics (with the device's figures) and its walk. */
static int snap_capture(gmr_runtime_t *rt, gmr_stats_t *st, snap_sums_t *m) {
  gmr_policy_t *p = gmr__runtime_policy(rt);
  memset(st, 0, sizeof *st);
  memset(m, 0, sizeof *m);
  gmr__policy_quiesce(p);
  gmr__policy_stats_locked(p, st);
  gmr__stats_fill_device(gmr__runtime_backend(rt), st);
  int err = gmr__policy_walk_locked(p, snap_walk, m);
  gmr__policy_resume(p);
  snap_seg_end(m);
  return err;
}

/* tiles: each segment is its blocks; reserved: the segments are the
 * reserved bytes (not for stitch, whose shared pages are in two ranges). */
static void test_snapshot_while_allocating(const char *name, const char *yaml, bool reserved) {
  enum { SNAPS = 300, WORKERS = 4, OPS = 40000 };
  gmr_runtime_t *rt = new_runtime(yaml);
  _Atomic int stop = 0;
  _Atomic long ops = 0;
  pthread_t t[WORKERS];
  snap_worker_t w[WORKERS];
  for (int i = 0; i < WORKERS; ++i) {
    w[i] = (snap_worker_t){rt, i, &stop, &ops, 0};
    pthread_create(&t[i], NULL, snap_churn, &w[i]);
  }
  int bad_alloc = 0, bad_reserved = 0, untiled = 0, errs = 0, bad_snap = 0;
  char *buf = NULL;
  size_t len = 0;
  while (atomic_load(&ops) < WORKERS) /* every worker under way */
    sched_yield();
  int snaps = 0;
  for (int i = 0; i < SNAPS || atomic_load(&ops) < OPS; ++i, ++snaps) {
    gmr_stats_t st;
    snap_sums_t m;
    errs += snap_capture(rt, &st, &m) != 0;
    if (m.allocated != st.allocated_bytes && bad_alloc++ == 0)
      diag("%s: walked %llu allocated bytes, the statistics %llu", name,
           (unsigned long long)m.allocated, (unsigned long long)st.allocated_bytes);
    if (reserved && m.segments != st.reserved_bytes && bad_reserved++ == 0)
      diag("%s: walked %llu bytes of segments, %llu reserved", name, (unsigned long long)m.segments,
           (unsigned long long)st.reserved_bytes);
    untiled += m.untiled;
    if (i % 10 == 0) { /* the public snapshot, the trim and the check meanwhile */
      FILE *f = open_memstream(&buf, &len);
      bad_snap += f == NULL || gmr_snapshot_write(rt, f) != 0;
      if (f != NULL) fclose(f);
      free(buf); /* each open_memstream makes a buffer of its own */
      buf = NULL;
      errs += gmr_empty_cache(rt) != 0;
      errs += gmr_check(rt) != 0;
    }
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; ++i) {
    pthread_join(t[i], NULL);
    errs += w[i].errors;
  }
  free(buf);
  is_int(errs, 0, "%s: %d snapshots while %d threads allocate (%ld ops), no error", name, snaps,
         WORKERS, atomic_load(&ops));
  is_int(bad_alloc, 0, "%s: in each, the walked allocated bytes are the statistics'", name);
  if (reserved)
    is_int(bad_reserved, 0, "%s: in each, the walked segments are the reserved bytes", name);
  is_int(untiled, 0, "%s: in each, every segment is tiled by its blocks", name);
  is_int(bad_snap, 0, "%s: gmr_snapshot_write meanwhile succeeds", name);
  is_int(gmr_check(rt), 0, "%s: the invariants hold after", name);
  gmr_runtime_free(rt);
}

int main(void) {
  test_arguments();
  test_map_probes();
  test_map_shards();
  test_threads("direct (serialized)", "policy: direct\n");
  test_threads("limit(direct) (concurrent)",
               "policy: {name: limit, bytes: 64GiB, upstream: {name: direct}}\n");
  test_direct_records();
  test_limit();
  test_limit_streams();
  test_limit_exact_under_threads();
  test_snapshot_while_allocating("caching", "policy: caching\n", true);
  test_snapshot_while_allocating("bfc", "policy: {name: bfc, allow_growth: true}\n", true);
  test_snapshot_while_allocating("stitch", "policy: stitch\n", false);
  test_snapshot_while_allocating(
      "limit(caching)", "policy: {name: limit, bytes: 64GiB, upstream: {name: caching}}\n", true);
  return done_testing();
}
