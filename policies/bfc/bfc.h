/* bfc.h: what the files of the bfc policy share (private to policies/bfc/).
 *
 * The policy (TensorFlow's BFCAllocator) is cut in two: bfc.c, the
 * allocator (regions, chunks, bins, the alloc and free paths, options and
 * construction), and report.c, TensorFlow's words about it: the OOM report
 * (AllocateRawInternal's banner, DumpMemoryLog, RenderOccupancy), the
 * summary built from the same dump, and HumanReadableNumBytes.  This header
 * holds the data model they share, the small inline functions on it, and the
 * functions that cross files.  Invariants and locking are written at the
 * top of bfc.c.
 */
#ifndef GMR_POLICIES_BFC_H
#define GMR_POLICIES_BFC_H

#include <stdatomic.h>

#include "core/lock.h"
#include "policy.h"

#define BFC_MIN_ALLOC_BITS   8
#define BFC_MIN_ALLOC        ((size_t)1 << BFC_MIN_ALLOC_BITS) /* 256 bytes */
#define BFC_NUM_BINS         21
#define BFC_MAX_FRAG_DEFAULT ((size_t)128 << 20) /* 128 MiB */
#define BFC_BACKPEDAL        0.9f                /* float, as TF's kBackpedalFactor */
#define BFC_MAX_FAILURE_LOGS 10
#define BFC_INVALID_HANDLE   ((uint64_t)SIZE_MAX) /* printed as 18446744073709551615 */
#define BFC_SLAB             256                  /* chunk records per host allocation */
#define BFC_FRONT_SLOTS      32                   /* chunks one stream's front cache holds */
#define BFC_FRONT_STREAMS    256                  /* streams with a front cache (a power of two) */

/* ---- options (options.c) ------------------------------------------------------ */

enum { BFC_ENV_NONE = 0, BFC_ENV_TENSORFLOW = 1, BFC_ENV_JAX = 2 };
typedef struct bfc_opts_s {
  bool allow_growth;             /* growth mode (true) or greedy (false) */
  uint64_t memory_limit;         /* bytes; 0: from a fraction or TF's default rule */
  double per_process_fraction;   /* TF: fraction of total device memory; 0: unset */
  double memory_fraction;        /* XLA: fraction of total device memory; 0: unset */
  bool garbage_collection;       /* free wholly free regions at OOM */
  bool allow_retry_on_failure;   /* wait for frees before failing */
  double retry_timeout;          /* seconds to wait for frees */
  double fragmentation_fraction; /* > 0: split cap = fraction * limit; 0: 128 MiB */
  bool vmm;                      /* one virtual range, pages mapped as it grows */
  bool coalesce_regions;         /* merge regions the backend returns contiguously */
  char *name;                    /* allocator name in messages; NULL: GPU_<dev>_bfc */
  int environment;               /* BFC_ENV_*: whose environment variables to honour */
} bfc_opts_t;

/* ---- data model ---------------------------------------------------------------- */

typedef struct bfc_region_s bfc_region_t;

/* One chunk: a piece of a region, wholly in use or wholly free. */
typedef struct bfc_chunk_s {
  uintptr_t ptr;                    /* device address */
  size_t size;                      /* bytes, a multiple of 256 */
  size_t requested;                 /* bytes the user asked for (kept after free, as TF) */
  int64_t allocation_id;            /* -1: free; else unique, from 1 */
  struct bfc_chunk_s *prev, *next;  /* physical neighbours in the region; NULL at its edges */
  struct bfc_chunk_s *left, *right; /* bin tree children while free; free-list link (left) */
  bfc_region_t *region;             /* the region holding the chunk */
  uint32_t handle;                  /* stable number for the dump */
  int8_t height;                    /* AVL height while binned */
  int8_t bin;                       /* bin index while free, -1 while in use */
  uint8_t pending;                  /* freed, its streams' work not yet done (still in use) */
  uint8_t sync_on_free;             /* a stream use could not be recorded: sync at free */
  uintptr_t owner;                  /* while in use: the allocating thread (pthread_self) */
  struct bfc_uses_s *uses;          /* streams recorded besides the allocation's; NULL: none */
} bfc_chunk_t;

/* gmr_record_stream's streams of an in-use chunk (its allocation stream
 * excluded), distinct. */
typedef struct bfc_uses_s {
  size_t n, cap;
  gmr_stream_t streams[];
} bfc_uses_t;

/* A freed chunk waiting for the work queued on its recorded streams: one
 * event per stream, FIFO. */
typedef struct bfc_pending_s {
  struct bfc_pending_s *next;
  bfc_chunk_t *chunk;
  size_t n;
  void *events[]; /* gmr_event_t */
} bfc_pending_t;

/* A device range the region was built from (one reserve or one map call). */
typedef struct bfc_piece_s {
  void *ptr;   /* device address */
  size_t size; /* bytes */
} bfc_piece_t;

struct bfc_region_s {
  uintptr_t ptr;       /* device address of the first byte */
  size_t size;         /* bytes = Σ piece sizes */
  bfc_chunk_t *first;  /* the chunk at ptr */
  bfc_chunk_t *last;   /* the chunk ending at ptr + size */
  bfc_piece_t *pieces; /* what to give back to the backend */
  size_t n_pieces, cap_pieces;
};

typedef struct bfc_bin_s {
  bfc_chunk_t *root; /* AVL tree by (size, ptr) */
  size_t count;      /* free chunks */
} bfc_bin_t;

typedef struct bfc_slab_s {
  struct bfc_slab_s *next;
  bfc_chunk_t chunks[BFC_SLAB];
} bfc_slab_t;

/* A stream's front cache (see "Concurrency" at the top of bfc.c): chunks its
 * user freed, kept allocated for its next allocations of a fitting size.
 * Everything is guarded by `lock`; `id` is immutable once published. */
typedef struct bfc_front_s {
  _Alignas(64) gmr_lock_t lock;
  gmr_stream_t id;
  bool frozen;                        /* a global operation runs: bypass the cache */
  uint32_t n;                         /* chunks in slot[0 .. n) */
  int64_t allocs, frees;              /* user allocations and frees served here, not folded */
  int64_t req_in, req_out;            /* their requested bytes */
  bfc_chunk_t *slot[BFC_FRONT_SLOTS]; /* in use for the core, free for the user */
} bfc_front_t;

typedef struct bfc_s {
  gmr_policy_t base;            /* must be first */
  _Alignas(64) gmr_lock_t lock; /* the allocator's lock (TF's one mutex) */
  _Atomic uint32_t freed_seq;   /* bumped by frees while waiters > 0 (gmr__wake_all) */

  /* Read by every fast path, written rarely: a cache line of their own. */
  _Alignas(64) _Atomic bool contended; /* two threads met at `lock`: front caches on */
  _Atomic int waiters;                 /* allocations waiting for frees */
  _Atomic uint32_t arriving;           /* frees on their way to `lock` that saw waiters > 0 */
  _Atomic bool handoff; /* a chunk was freed by a thread other than its allocator's */
  _Atomic(bfc_front_t *) fronts[BFC_FRONT_STREAMS]; /* by stream hash, append-only */
  _Alignas(64) size_t n_fronts;                     /* under lock */
  size_t freezes; /* under lock: bfc_front_freeze calls not yet thawed */

  /* Configuration: immutable after create. */
  char name[128];                /* "GPU_0_bfc" */
  uint64_t limit;                /* memory_limit_, bytes */
  size_t max_frag;               /* split when the waste would be at least this, bytes */
  bool gc, retry, coalesce, vmm; /* garbage_collection, allow_retry, coalescing, VMM */
  uint64_t retry_ns;             /* wait for frees, nanoseconds */
  bool exclusive;                /* one thread makes every call: waiting is pointless */
  uintptr_t va_base;             /* VMM: the reserved virtual range */
  size_t va_size;                /* VMM: bytes of it */

  /* State (under lock). */
  size_t va_used;           /* VMM: bytes mapped from va_base */
  size_t curr_region_bytes; /* next region's target size, bytes */
  bfc_region_t **regions;   /* sorted by address */
  size_t n_regions, cap_regions;
  bfc_bin_t bins[BFC_NUM_BINS];
  uint32_t nonempty;       /* bit i: bins[i].count > 0 */
  bfc_chunk_t *chunk_pool; /* recycled records, linked by left */
  bfc_slab_t *slabs;
  uint32_t n_handles; /* records handed out by slabs so far */
  int64_t next_allocation_id;
  size_t free_chunks; /* chunks in bins */

  /* Statistics (under lock). */
  int64_t num_allocs;   /* since creation or reset_accumulated */
  int64_t bytes_in_use; /* Σ in-use chunk sizes */
  int64_t peak_bytes_in_use;
  int64_t largest_alloc_size; /* largest chunk handed out since the last reset_peak */
  int64_t pool_bytes;         /* Σ region sizes */
  int64_t peak_pool_bytes;
  gmr_stat_t requested;   /* Σ requested bytes of in-use chunks */
  gmr_stat_t allocations; /* in-use chunks */
  uint64_t num_frees, ooms, retries;
  /* Stream uses (under lock): chunks freed while other streams' work on them
   * is pending stay in use until their events complete. */
  bfc_pending_t *pending, *pending_tail;
  size_t n_pending;
  int64_t pending_bytes; /* Σ sizes of pending chunks (part of bytes_in_use) */
  /* The retry (under lock): the threads waiting for frees. */
  uintptr_t *waiting;
  size_t n_waiting, cap_waiting;
  uint64_t stalemates; /* times every holder was found waiting: those waiters give up */
  bool gc_to_log;      /* a garbage collection happened; log it outside the lock */
} bfc_t;

static inline size_t bfc_rounded(size_t n) {
  return (n + BFC_MIN_ALLOC - 1) / BFC_MIN_ALLOC * BFC_MIN_ALLOC;
}
static inline int bfc_bin_for(size_t size) {
  size_t v = size >> BFC_MIN_ALLOC_BITS;
  int b = v ? 63 - __builtin_clzll((unsigned long long)v) : 0;
  return b < BFC_NUM_BINS - 1 ? b : BFC_NUM_BINS - 1;
}
static inline size_t bfc_bin_size(int b) {
  return BFC_MIN_ALLOC << b;
}

static inline bfc_chunk_t *avl_max(bfc_chunk_t *n) {
  while (n && n->right)
    n = n->right;
  return n;
}

/* The largest free chunk: the last of the highest nonempty bin. */
static inline size_t bfc_largest_free(const bfc_t *b) {
  if (b->nonempty == 0) return 0;
  int i = 31 - __builtin_clz(b->nonempty);
  return avl_max(b->bins[i].root)->size;
}

/* ---- across files -------------------------------------------------------------- */

/* report.c, all called with the policy's lock held (and the front caches
 * flushed) except gmr__bfc_hr. */
void gmr__bfc_hr(int64_t n, char *buf, size_t len);
int gmr__bfc_oom(bfc_t *b, size_t num_bytes, size_t rounded);
void gmr__bfc_summary_locked(bfc_t *b, gmr_strbuf_t *sb);

/* options.c: the defaults, the option table (with the environment
 * variables each option honours), the check that at most one limit option
 * is given, the options' release, and the allocator's name in messages. */
extern const bfc_opts_t gmr__bfc_opts_default;
extern const gmr_opt_desc_t gmr__bfc_opts_desc[];
int gmr__bfc_validate(void *opts, char *err, size_t len);
void gmr__bfc_opts_release(void *opts);
void gmr__bfc_name(const bfc_opts_t *o, int device, char *buf, size_t len);

/* streams.c, all called with the policy's lock held.  Stream uses:
 * gmr__bfc_use_add records stream `s` on the in-use chunk `c`;
 * gmr__bfc_hold, at the user's free of a chunk with uses, records their
 * events and returns true when the chunk is now pending (false: every stream
 * was synchronized, release it now); gmr__bfc_pending_take unlinks the
 * pending entries whose events are complete (after waiting for them when
 * `sync`) and returns them as a list: the caller releases each chunk and
 * frees the entry.  Waiting: the waiting set of the retry by thread,
 * and whether waiting can help (see streams.c). */
void gmr__bfc_use_add(bfc_chunk_t *c, gmr_stream_t s);
bool gmr__bfc_hold(bfc_t *b, bfc_chunk_t *c);
bfc_pending_t *gmr__bfc_pending_take(bfc_t *b, bool sync);
void gmr__bfc_streams_destroy(bfc_t *b);
int gmr__bfc_waiting_add(bfc_t *b, uintptr_t me);
void gmr__bfc_waiting_remove(bfc_t *b, uintptr_t me);
bool gmr__bfc_wait_can_help(const bfc_t *b);

#endif /* GMR_POLICIES_BFC_H */
