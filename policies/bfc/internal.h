/* internal.h: what the files of the bfc policy share (private to policies/bfc/).
 * Map: Note [Rooms].
 */
#ifndef GMR_POLICIES_BFC_H
#define GMR_POLICIES_BFC_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/lock.h"
#include "policy.h"

/* Note [Rooms]
 * The policy (TensorFlow's BFCAllocator) keeps the rooms every policy folder
 * has, and three of its own:
 *   internal.h this header: the data model, the small inline functions on
 *              it, and the functions that cross files
 *   bfc.c      the allocator: regions, chunks, the alloc and free paths,
 *              construction, quiesce/resume and the ops table
 *   options.c  the options
 *   report.c   TensorFlow's words: the statistics, the OOM report
 *              (AllocateRawInternal's banner, DumpMemoryLog,
 *              RenderOccupancy), the summary built from the same dump,
 *              HumanReadableNumBytes
 *   check.c    the walk and the invariant walker
 *   bins.h     the free chunks' AVL trees that bfc.c runs on
 *   streams.c  gmr's stream uses and the retry's rule
 *   front.c    the per-stream front caches that exist only under concurrency
 * Invariants and locking: Note [Invariants], [Locking] and [Fronts] in bfc.c.
 */

#define BFC_MIN_ALLOC_BITS   8
#define BFC_MIN_ALLOC        ((size_t)1 << BFC_MIN_ALLOC_BITS) /* 256 bytes */
#define BFC_NUM_BINS         21
#define BFC_MAX_FRAG_DEFAULT ((size_t)128 << 20) /* 128 MiB */
#define BFC_BACKPEDAL        0.9f                /* float, as TF's kBackpedalFactor */
#define BFC_MAX_FAILURE_LOGS 10
#define BFC_INVALID_HANDLE   ((uint64_t)SIZE_MAX) /* printed as 18446744073709551615 */
#define BFC_SLAB             256                  /* chunk records per host allocation */
#define BFC_FRONT_PER_BIN    32                   /* chunks one front cache keeps per bin (even) */
#define BFC_FRONT_MAX        (BFC_NUM_BINS * BFC_FRONT_PER_BIN) /* chunks one keeps in all */
#define BFC_FRONT_STREAMS    256               /* streams with a front cache (a power of two) */
#define BFC_FRONT_CAP_SHARE  256               /* by default a front cache keeps <= limit / this */
#define BFC_FRONT_CAP_MIN    ((size_t)1 << 20) /* ... or this, whichever is larger */

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
  uint64_t front_cache_bytes;    /* bytes one front cache may keep; 0: max(limit / 256, 1 MiB) */
  bool vmm;                      /* one virtual range, pages mapped as it grows */
  bool coalesce_regions;         /* merge regions the backend returns contiguously */
  char *name;                    /* allocator name in messages; NULL: GPU_<dev>_bfc */
  int environment;               /* BFC_ENV_*: whose environment variables to honour */
} bfc_opts_t;

/* BFC_INLINE: the hot paths' helpers (inlined whatever the compiler's
 * estimate); BFC_COLD: the rare paths (optimized for size); BFC_OUTLINE:
 * paths taken often in some modes (a growth-mode pair crosses bins), kept
 * out of the fast paths' registers but optimized for speed. */
#if defined(__GNUC__)
#define BFC_INLINE  inline __attribute__((always_inline))
#define BFC_COLD    __attribute__((cold, noinline))
#define BFC_OUTLINE __attribute__((noinline))
#else
#define BFC_INLINE inline
#define BFC_COLD
#define BFC_OUTLINE
#endif

/* ---- data model ---------------------------------------------------------------- */

typedef struct bfc_region_s bfc_region_t;

/* One chunk: a piece of a region, wholly in use or wholly free.  A record
 * is two cache lines, 64-byte aligned (slabs are): the first holds what the
 * bins and the neighbours read (the tree descent, a merge's look at its
 * neighbours), the second what the chunk's user path reads and writes.  So
 * two threads that hold neighbouring chunks never write a line the other
 * reads (docs/bfc.md, "Under concurrency"). */
typedef struct bfc_chunk_s {
  /* Interleaved so that the hot paths' stores to a record are never to
   * adjacent words: gcc -O2 pairs adjacent stores of separate values into
   * vector stores that cost more instructions than they save. */
  _Alignas(64) uintptr_t ptr; /* device address */
  struct bfc_chunk_s *left;   /* bin tree while free; pool link */
  size_t size;                /* bytes, a multiple of 256 */
  struct bfc_chunk_s *right;  /* bin tree while free */
  struct bfc_chunk_s *prev;   /* physical neighbours (at the region's edges: its sentinels) */
  struct bfc_chunk_s *up;     /* bin tree while free: the parent */
  struct bfc_chunk_s *next;
  int8_t height;                 /* AVL height while binned */
  int8_t bin;                    /* bin index while free, -1 while in use */
  uint8_t in_use;                /* TF's allocation_id != -1 */
  uint8_t pending;               /* freed, its streams' work not yet done (still in use) */
  uint8_t sync_on_free;          /* a stream use could not be recorded: sync at free */
  uint8_t elsewhere;             /* uses != NULL or sync_on_free: the free takes the lock */
  _Alignas(64) size_t requested; /* bytes the user asked for (kept after free, as TF) */
  uintptr_t owner;               /* while in use: the allocating thread (bfc_thread_id) */
  struct bfc_uses_s *uses;       /* streams recorded besides the allocation's; NULL: none */
  uint32_t handle; /* TF's chunk handle, for the dump (see Note [Records and handles], bfc.c) */
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

/* A region: its chunks run from head.next along the next links to tail.
 * `head` and `tail` are sentinels, never chunks: in use, size 0, no handle;
 * so every chunk has both neighbours (no NULL test on the hot paths), and a
 * split or merge at the region's edge changes no region field. */
struct bfc_region_s {
  bfc_chunk_t head, tail; /* sentinels: head.next is the chunk at ptr, tail.prev the last */
  uintptr_t ptr;          /* device address of the first byte */
  size_t size;            /* bytes = Σ piece sizes */
  bfc_piece_t *pieces;    /* what to give back to the backend */
  size_t n_pieces, cap_pieces;
  void *raw; /* what the host returned (the region is 64-byte aligned in it) */
};

/* The region's chunks: for (c = bfc_first(r); c != bfc_end(r); c = c->next). */
static inline bfc_chunk_t *bfc_first(const bfc_region_t *r) {
  return r->head.next;
}
static inline const bfc_chunk_t *bfc_end(const bfc_region_t *r) {
  return &r->tail;
}
/* A neighbour that is a chunk, not a sentinel (only sentinels have size 0). */
static inline bool bfc_is_chunk(const bfc_chunk_t *c) {
  return c->size != 0;
}

typedef struct bfc_bin_s {
  bfc_chunk_t *root; /* AVL tree by (size, ptr), with parent links (bins.h) */
  size_t count;      /* free chunks */
} bfc_bin_t;

/* A slab of chunk records; the records come first, so that they are 64-byte
 * aligned in a 64-byte aligned slab (`raw` is what the host returned). */
typedef struct bfc_slab_s {
  bfc_chunk_t chunks[BFC_SLAB];
  struct bfc_slab_s *next;
  void *raw;
} bfc_slab_t;

/* A current figure and its peak (the statistics that TF keeps both of). */
typedef struct bfc_count_s {
  int64_t current, peak;
} bfc_count_t;

typedef struct bfc_front_s bfc_front_t; /* front.c */

typedef struct bfc_s {
  gmr_policy_t base;            /* must be first */
  _Alignas(64) gmr_lock_t lock; /* the allocator's lock (TF's one mutex) */
  _Atomic uint32_t freed_seq;   /* bumped by frees while waiters > 0 (gmr__wake_all) */

  /* Read by every fast path, written rarely: a cache line of their own. */
  _Alignas(64) _Atomic bool contended; /* two threads met at `lock`: front caches on */
  _Atomic int waiters;                 /* allocations waiting for frees */
  _Atomic uint32_t arriving;           /* frees on their way to `lock` that saw waiters > 0 */
  _Atomic bool handoff; /* a chunk was freed by a thread other than its allocator's */
  size_t front_cap;     /* immutable: bytes one front cache may keep */
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
  void *raw; /* what the host returned for this struct (64-byte aligned in it) */

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
  size_t free_chunks; /* chunks in bins */

  /* Statistics (under lock). */
  int64_t num_allocs;   /* since creation or reset_accumulated */
  int64_t bytes_in_use; /* Σ in-use chunk sizes */
  int64_t peak_bytes_in_use;
  int64_t largest_alloc_size; /* largest chunk handed out since the last reset_peak */
  int64_t pool_bytes;         /* Σ region sizes */
  int64_t peak_pool_bytes;
  bfc_count_t requested;   /* Σ requested bytes of in-use chunks */
  bfc_count_t allocations; /* in-use chunks */
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
/* BinNumForSize: floor(log2(size / 256)), at most 20 (sizes below 256 are bin 0). */
/* (size, ptr) order. */
static inline bool bfc_less(const bfc_chunk_t *a, const bfc_chunk_t *b) {
  return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}

static inline int bfc_bin_for(size_t size) {
  int b = 63 - __builtin_clzll((unsigned long long)(size >> BFC_MIN_ALLOC_BITS) | 1);
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

/* Who holds a chunk: the calling thread's identity (core/lock.h).  A
 * finished thread's identity may be reused by a new thread; the retry's
 * rule (streams.c) only errs towards TF's wait then. */
static inline uintptr_t bfc_thread_id(void) {
  return gmr__thread_id();
}

/* ---- across files -------------------------------------------------------------- */

/* report.c, all called with the policy's lock held (and the front caches
 * flushed: quiesced, policy.h rule 5) except gmr__bfc_hr. */
void gmr__bfc_hr(int64_t n, char *buf, size_t len);
int gmr__bfc_oom(bfc_t *b, size_t num_bytes, size_t rounded);
void gmr__bfc_summary_locked(bfc_t *b, gmr_strbuf_t *sb);
/* The statistics ops' bodies (ClearStats() is reset_peak + reset_accumulated). */
void gmr__bfc_stats(gmr_policy_t *self, gmr_stats_t *st);
void gmr__bfc_reset_peak(gmr_policy_t *self);
void gmr__bfc_reset_accumulated(gmr_policy_t *self);
int gmr__bfc_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud);
int gmr__bfc_summary(gmr_policy_t *self, FILE *out);

/* check.c, called with the policy's lock held and the front caches flushed:
 * the walk's body, and every invariant (GMR_EINVAL and why on failure). */
int gmr__bfc_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud);
int gmr__bfc_check_locked(bfc_t *b);
int gmr__bfc_check(gmr_policy_t *self);

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

/* front.c, the front caches (see the top of front.c).  gmr__bfc_front_find
 * looks a stream's cache up without a lock (NULL: none);
 * gmr__bfc_front_alloc takes a kept chunk TF would hand out whole for the
 * request (NULL: none, or the cache is frozen); gmr__bfc_front_free keeps a
 * freed chunk (BFC_FRONT_KEPT), refuses it (BFC_FRONT_REFUSED: frozen, too
 * large, or an allocation waits for memory: take the lock) or says it would
 * keep it after giving chunks back (BFC_FRONT_FULL), which
 * gmr__bfc_front_free_spilling does: it keeps c and hands back in `spill`
 * (BFC_FRONT_MAX entries) the chunks it gave up, for the caller to free and
 * count under the lock, and returns their number (SIZE_MAX: refused after
 * all).  Under the lock: gmr__bfc_front_new gives a stream a cache (quietly
 * none when the host refuses); gmr__bfc_front_drain freezes one cache, folds
 * its counts into the allocator's figures and hands back its chunks (the
 * caller frees them); gmr__bfc_front_thaw ends the freeze. */
enum { BFC_FRONT_REFUSED = 0, BFC_FRONT_KEPT = 1, BFC_FRONT_FULL = 2 };
bfc_front_t *gmr__bfc_front_find(bfc_t *b, gmr_stream_t s);
bfc_chunk_t *gmr__bfc_front_alloc(bfc_t *b, bfc_front_t *f, size_t num_bytes, size_t rounded,
                                  uintptr_t me);
int gmr__bfc_front_free(bfc_t *b, bfc_front_t *f, bfc_chunk_t *c);
size_t gmr__bfc_front_free_spilling(bfc_t *b, bfc_front_t *f, bfc_chunk_t *c, bfc_chunk_t **spill);
void gmr__bfc_front_new(bfc_t *b, gmr_stream_t s);
size_t gmr__bfc_front_drain(bfc_t *b, bfc_front_t *f, bfc_chunk_t **out);
void gmr__bfc_front_thaw(bfc_front_t *f);
void gmr__bfc_front_release(bfc_front_t *f);

#endif /* GMR_POLICIES_BFC_H */
