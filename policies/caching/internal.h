/* internal.h: what the files of the caching policy share (private to policies/caching/).
 * Map: Note [Rooms].
 */
#ifndef GMR_POLICIES_CACHING_H
#define GMR_POLICIES_CACHING_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "policy.h"

/* Note [Rooms]
 * The policy (PyTorch's CUDA caching allocator) keeps the rooms every policy
 * folder has:
 *   internal.h this header: the data model, small inline predicates on it,
 *              and the few functions that cross files
 *   caching.c  the allocator: blocks, pools, streams, segments, events, the
 *              alloc and free paths and everything they call (one
 *              translation unit, so the hot path inlines), quiesce/resume
 *              and the ops table
 *   options.c  the option table, the PYTORCH_CUDA_ALLOC_CONF tokenizer and
 *              the merging of keys and string (PyTorch's CUDAAllocatorConfig)
 *   report.c   torch.cuda.memory_stats(), memory_summary(), the OOM text
 *   check.c    the walk and the invariant check
 * Calls go one way: caching.c calls into the others, which call nothing
 * back.  Invariants and locking: Note [Invariants], [Locking] in caching.c.
 */

#define CACHE_MIB             ((size_t)1 << 20)
#define CACHE_MIN_BLOCK       ((size_t)512)    /* kMinBlockSize */
#define CACHE_SMALL_SIZE      CACHE_MIB        /* kSmallSize */
#define CACHE_SMALL_BUFFER    (2 * CACHE_MIB)  /* kSmallBuffer */
#define CACHE_LARGE_BUFFER    (20 * CACHE_MIB) /* kLargeBuffer */
#define CACHE_MIN_LARGE_ALLOC (10 * CACHE_MIB) /* kMinLargeAlloc */
#define CACHE_ROUND_LARGE     (2 * CACHE_MIB)  /* kRoundLarge */
#define CACHE_DIV_BUCKETS     16               /* roundup_power2_divisions intervals */
#define CACHE_UNLIMITED       SIZE_MAX

/* ---- options ------------------------------------------------------------------
 * Every field has a "not given" value, so an option set both as a key and in
 * `pytorch_alloc_conf` is found and refused instead of silently overridden. */

typedef struct cache_divs_s {
  bool given;                      /* set by the key or the string */
  uint32_t div[CACHE_DIV_BUCKETS]; /* divisions per power-of-two interval from 1 MiB */
} cache_divs_t;

typedef struct cache_opts_s {
  uint64_t max_split_size;         /* bytes; 0: not given (unlimited) */
  uint64_t max_non_split_rounding; /* bytes; 0: not given (20 MiB) */
  cache_divs_t roundup_power2_divisions;
  double garbage_collection_threshold; /* in (0, 1); 0: not given (off) */
  int expandable_segments;             /* -1: not given (false), 0, 1 */
  double per_process_memory_fraction;  /* in [0, 1]; -1: not given (no cap) */
  int release_lock_on_cudamalloc;      /* -1: not given, 0, 1 (accepted, no effect) */
  uint64_t large_segment_size;         /* bytes; 0: not given (20 MiB) */
  char *pytorch_alloc_conf;            /* PYTORCH_CUDA_ALLOC_CONF text; NULL: none */
} cache_opts_t;

/* The options in force, after merging keys and the string. */
typedef struct cache_conf_s {
  size_t max_split_size;           /* bytes; CACHE_UNLIMITED when unset */
  size_t max_non_split_rounding;   /* bytes */
  uint32_t div[CACHE_DIV_BUCKETS]; /* 0 or 1: plain 512-byte rounding */
  double gc_threshold;             /* 0: off */
  bool expandable;
  double fraction; /* >= 1.0: no cap */
  bool release_lock;
  size_t large_segment; /* bytes: segment size for 1-10 MiB requests, large page */
} cache_conf_t;

/* ---- blocks, pools, streams, segments ---------------------------------------- */

typedef struct cache_block_s cache_block_t;
typedef struct cache_pool_s cache_pool_t;
typedef struct cache_stream_s cache_stream_t;
typedef struct cache_seg_s cache_seg_t;

/* A block record: 128 bytes, 64-byte aligned (records come in chunks,
 * caching.c).  Its first cache line holds all that a tree search, a tree
 * rotation and a neighbour's merge test read or write (the key, the links,
 * the priority, the state), so that the blocks a free or an allocation
 * reaches besides its own cost one line each; the second holds what only
 * the block's own allocation and free, a split of it (its segment, for the
 * new record) and the global path use.
 *   event_count <= n_uses <= CACHE_STAB / 2 (one event per recorded stream
 *   that has a stream record), so 16 bits hold it;
 *   !allocated => n_uses == 0 (record_stream reaches live blocks only, and
 *   the free that queues their events clears it). */
struct cache_block_s {
  _Alignas(64) size_t size;    /* bytes */
  uintptr_t ptr;               /* device address */
  cache_block_t *left, *right; /* treap children while in a free or unmapped tree */
  cache_block_t *parent;       /* treap parent (NULL: the root) while in a tree */
  cache_block_t *prev, *next;  /* neighbours in the segment, by address */
  uint16_t event_count;        /* events still pending since the free */
  uint16_t prio;               /* treap priority, drawn once for the record */
  bool allocated;              /* handed to the user */
  bool mapped;                 /* false only for unmapped expandable ranges */
  bool in_tree;                /* in a bin of its pool (mapped) or pool->unmapped */
  uint8_t bin;                 /* in a bin: cache_bin(size) when it entered */
  /* -- second line */
  cache_pool_t *pool;        /* the (stream, small|large) pool */
  cache_seg_t *seg;          /* the segment it is part of */
  size_t requested;          /* bytes the user asked for (live blocks) */
  uint32_t n_uses, cap_uses; /* entries */
  gmr_stream_t *uses;        /* streams from record_stream (not the own one) */
  int64_t gc_count_base;     /* the pool's GC clock when it became free (GC on only) */
};

/* What take-backs (caching.c, Note [Deferred free]) add to the figures'
 * totals, kept per stream and pool until the next global path counts it:
 * each of them added `n` to the allocated and freed totals of allocation
 * and active, `bytes` to those of allocated_bytes and active_bytes, and so
 * on; their current figures and peaks it left as they were. */
typedef struct cache_back_s {
  int64_t n, bytes, requested, isplit, isplit_bytes, oversize;
} cache_back_t;

/* A pool's free mapped blocks, ordered by (size, ptr), are cut by size into
 * 64 bins: bin k holds the blocks with cache_bin(pool, size) == k, a treap by
 * (size, ptr), and bins[] in index order is the whole order (cache_bin
 * never decreases with size).  Four bins per power of two above the pool's
 * smallest sizes (bin 0: up to 1 KiB in the small pool, 2 MiB in the large
 * one), the largest sizes sharing the last bin: a search descends one small
 * tree, and the bitmap `nonempty` finds the next bin with blocks in one
 * instruction.
 *   nonempty bit k == (bins[k] != NULL);  n_blocks = Σ blocks in bins */
#define CACHE_BIN_SUB 2 /* bins per power of two: 2^CACHE_BIN_SUB */
#define CACHE_BINS    64

struct cache_pool_s {
  cache_block_t *bins[CACHE_BINS]; /* treaps of free mapped blocks by (size, ptr) */
  uint64_t nonempty;               /* bit k: bins[k] != NULL */
  unsigned base;                   /* bin 0: sizes up to 2^(base + 1); 9 small, 20 large */
  int64_t bin_off;                 /* cache_bin's: ((1023 + base) << CACHE_BIN_SUB) + 3 */
  const size_t *floor;             /* bin k: sizes in [floor[k], floor[k + 1]) (cache_t) */
  cache_block_t *unmapped;         /* treap of unmapped expandable ranges by ptr */
  size_t n_blocks;                 /* entries in the bins */
  cache_stream_t *stream;
  bool is_small;
  cache_back_t back; /* take-backs not yet counted (the stream's lock) */
};

typedef struct cache_event_s {
  gmr_event_t ev;
  cache_block_t *block;
  struct cache_event_s *next;
} cache_event_t;

struct cache_seg_s {
  uintptr_t base; /* device address (reservation or virtual range) */
  size_t size;    /* bytes (reservation, or the whole virtual range) */
  cache_pool_t *pool;
  cache_block_t *head;              /* the block at `base` */
  bool expandable;                  /* a virtual range grown by mapping pages */
  size_t page;                      /* expandable: bytes per mapped page */
  cache_seg_t *prev_seg, *next_seg; /* all segments */
};

/* ---- statistics (c10 DeviceStats) ------------------------------------------- */

enum { CS_ALL = 0, CS_SMALL = 1, CS_LARGE = 2 };

typedef struct cache_stats_s {
  gmr_stat_t allocation[3], segment[3], active[3], inactive_split[3]; /* counts */
  gmr_stat_t allocated_bytes[3], reserved_bytes[3], active_bytes[3];  /* bytes */
  gmr_stat_t inactive_split_bytes[3], requested_bytes[3];             /* bytes */
  gmr_stat_t oversize_allocations, oversize_segments;                 /* counts */
  int64_t num_alloc_retries, num_ooms, num_sync_all_streams;          /* events */
  int64_t num_device_alloc, num_device_free;                          /* events */
  int64_t max_split_size;                                             /* bytes; -1 */
} cache_stats_t;

/* The gmr_stat_t records at the start of cache_stats_t. */
#define CACHE_N_STATS ((int)(offsetof(cache_stats_t, num_alloc_retries) / sizeof(gmr_stat_t)))

/* A stream: its pools, and what the fast path touches without the global
 * lock.  Synchronization: `lock` guards pools, the blocks of its segments,
 * spare records, prio_state, deferred, back and delta; ev_head/ev_tail are guarded by the
 * policy's glock; id is immutable. */
struct cache_stream_s {
  char pad_front[64]; /* keeps streams off each other's cache lines */
  gmr_stream_t id;
  gmr_spin_t lock;       /* core/lock.h */
  cache_pool_t pools[2]; /* [0] large, [1] small */
  cache_block_t *spare;  /* recycled block records, linked by `next` */
  void *chunks;          /* the records' memory: chunks of CACHE_CHUNK, linked (caching.c) */
  size_t n_spare;
  uint64_t prio_state;              /* treap priorities (an LCG) */
  cache_block_t *deferred;          /* a free not yet applied (caching.c, Note [Deferred free]) */
  bool dirty;                       /* delta holds something */
  bool backed;                      /* a pool's `back` holds something */
  cache_stats_t delta;              /* stat changes not yet folded into the policy's */
  cache_event_t *ev_head, *ev_tail; /* events recorded on this stream, FIFO (glock) */
  char pad_back[64];
};

/* The stream table: open addressing over stream handles, append-only, read
 * without locks by the fast path. */
#define CACHE_STAB 4096

/* The policy.  Synchronization: conf, fraction_set, allowed_max,
 * device_total and global_only are set at creation and then only read; `st`
 * is changed by fast paths under slock and by the global path; n_pending,
 * sharded and stab are atomics read by fast paths; everything else belongs
 * to the global path (glock and every stream lock held). */
typedef struct cache_s {
  gmr_policy_t base; /* must be first */
  cache_conf_t conf;
  bool fraction_set;      /* a memory fraction < 1 caps the cache */
  size_t allowed_max;     /* bytes: floor(fraction * total) */
  size_t device_total;    /* bytes */
  size_t total_allocated; /* bytes held from the device (segments + mapped pages) */
  cache_stats_t st;
  int64_t gc_clock[2];      /* get_free_blocks_call_count: [0] large, [1] small */
  cache_stream_t **streams; /* in creation order */
  size_t n_streams, cap_streams;
  cache_seg_t *segs; /* every segment */
  size_t n_segs;
  cache_event_t *spare_ev;  /* recycled event records */
  _Atomic size_t n_pending; /* events recorded and not yet completed */
  bool global_only;         /* GC on: every alloc takes the global path */
  bool defer;               /* fast frees wait for the stream's next op (not expandable, no GC) */
  bool divisions;           /* some roundup_power2_divisions > 1 */
  /* A stream was recorded on a block (record_stream): from then on a freed
   * block stays active until its events complete.  Until then active and
   * active_bytes are allocation and allocated_bytes, figure for figure
   * (both change at the same moments by the same amounts): the hot paths
   * count the latter only, and cache_fold copies them (global path). */
  bool events_seen;
  pthread_mutex_t glock; /* the global lock (caching.c, Note [Locking]) */
  atomic_flag slock;     /* guards `st` for the fast path's commits (try only) */
  _Atomic bool sharded;  /* a commit found slock busy: fast paths keep deltas */
  _Atomic(cache_stream_t *) stab[CACHE_STAB]; /* stream lookup, lock-free */
  size_t bin_floor[2][CACHE_BINS + 1];        /* each pool's floors: [0] large, [1] small */
} cache_t;

static inline int cache_stat_type(const cache_pool_t *p) {
  return p->is_small ? CS_SMALL : CS_LARGE;
}
/* An [all, small, large] statistic.  Only the pools' records are counted as
 * things happen; the aggregate's current, allocated and freed are their
 * sums, written by cache_sync_all on the global path before anyone reads
 * them, and its peak is kept as things happen:
 *   a[ALL].peak = max over time of a[SMALL].current + a[LARGE].current
 * (an increase is the only change that can raise it). */
static inline void cache_inc(gmr_stat_t *a, int t, int64_t n) {
  gmr__stat_increase(&a[t], n);
  int64_t all = a[CS_SMALL].current + a[CS_LARGE].current;
  if (all > a[CS_ALL].peak) a[CS_ALL].peak = all;
}
static inline void cache_dec(gmr_stat_t *a, int t, int64_t n) {
  gmr__stat_decrease(&a[t], n);
}

/* The [all, small, large] arrays at the start of cache_stats_t. */
#define CACHE_N_TRIPLES 9

/* Write every aggregate from its pools (and raise its peak to it). */
static inline void cache_sync_all(cache_stats_t *st) {
  gmr_stat_t *a = (gmr_stat_t *)st;
  for (int k = 0; k < CACHE_N_TRIPLES * 3; k += 3) {
    a[k].current = a[k + 1].current + a[k + 2].current;
    a[k].allocated = a[k + 1].allocated + a[k + 2].allocated;
    a[k].freed = a[k + 1].freed + a[k + 2].freed;
    if (a[k].current > a[k].peak) a[k].peak = a[k].current;
  }
}

/* The order of the treaps: free trees by (size, ptr), unmapped trees by ptr. */
static inline bool cache_less(const cache_block_t *a, size_t size, uintptr_t ptr, bool by_addr) {
  if (!by_addr && a->size != size) return a->size < size;
  return a->ptr < ptr;
}

/* The bin of `size`: with x = size - 1, k = (e - base) * 4 + s - 3 in
 * [0, 63], where 2^e <= x < 2^(e + 1) and s is the two bits of x after its
 * first: the exponent and the top of the mantissa of x as a double, one
 * shift (exact below 2^53; every larger size is in bin 63).  Bins end, not
 * start, at the round sizes (2 MiB, 20 MiB: whole segments), so a whole
 * segment and what is left of it after a small split share a bin. */
static inline unsigned cache_bin(const cache_pool_t *p, size_t size) {
  double d = (double)(int64_t)(size - 1); /* 1 <= size < GMR_MAX_REQUEST < 2^63 */
  uint64_t bits;
  memcpy(&bits, &d, sizeof bits);
  int64_t k = (int64_t)(bits >> (52 - CACHE_BIN_SUB)) - p->bin_off;
  if (GMR_LIKELY((uint64_t)k < CACHE_BINS)) return (unsigned)k; /* one test for both ends */
  return k < 0 ? 0u : CACHE_BINS - 1u;
}

/* The first bin at or after k (<= CACHE_BINS) that holds blocks, or -1. */
static inline int cache_bin_next(const cache_pool_t *p, unsigned k) {
  uint64_t m = k < CACHE_BINS ? p->nonempty & (~0ull << k) : 0;
  return m != 0 ? __builtin_ctzll(m) : -1;
}

/* The last bin at or before k (>= -1) that holds blocks, or -1. */
static inline int cache_bin_prev(const cache_pool_t *p, int k) {
  uint64_t m = k < 0 ? 0 : p->nonempty & (~0ull >> (63 - k));
  return m != 0 ? 63 - __builtin_clzll(m) : -1;
}

static inline bool cache_is_split(const cache_block_t *b) {
  return b->prev || b->next;
}

/* A block that is not allocated has no recorded streams (see the record). */
static inline bool cache_allocatable(const cache_block_t *b) {
  return b && !b->allocated && b->event_count == 0;
}

/* torch.cuda.memory_stats(): 122 keys, sorted as Python sorts them. */
typedef struct cache_kv_s {
  char key[48];
  int64_t value;
} cache_kv_t;
#define CACHE_N_KEYS 122

/* ---- across files -------------------------------------------------------------- */

/* options.c: the defaults, the option table, and the merging of keys and the
 * PYTORCH_CUDA_ALLOC_CONF string into the options in force. */
extern const cache_opts_t gmr__cache_opts_default;
extern const gmr_opt_desc_t gmr__cache_opts_desc[];
int gmr__cache_resolve(const cache_opts_t *o, cache_conf_t *conf, char *err, size_t errlen);
int gmr__cache_validate(void *opts, char *err, size_t errlen);
void gmr__cache_opts_release(void *opts);

/* report.c: the statistics ops, run quiesced (policy.h, rule 5: glock and
 * every stream lock held, the fast paths' deltas folded in) and the
 * deferred frees applied (caching.c calls them so); and the OOM
 * error in PyTorch's words (CUDACachingAllocator.cpp, malloc), which counts
 * the OOM. */
void gmr__cache_stats(gmr_policy_t *self, gmr_stats_t *out);
void gmr__cache_reset_peak(gmr_policy_t *self);
void gmr__cache_reset_accumulated(gmr_policy_t *self);
int gmr__cache_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud);
int gmr__cache_summary(gmr_policy_t *self, FILE *out);
int gmr__cache_oom(cache_t *c, size_t alloc_size);

/* check.c: the walk (deferred frees applied first, as above) and the
 * invariant check (the state as it stands), run quiesced. */
int gmr__cache_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud);
int gmr__cache_check(gmr_policy_t *self);

#endif /* GMR_POLICIES_CACHING_H */
