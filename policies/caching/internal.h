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
 * folder has, and three of its own:
 *   internal.h this header: the data model, the inline operations on it
 *              that the hot path and the other files share (the free trees,
 *              records, the stream table's lookup, statistic journals, the
 *              merge and free of a block), and the functions that cross files
 *   caching.c  the allocator: the alloc and free paths (with this header's
 *              inlines, one translation unit, so the hot path inlines), the
 *              deferred free and its take-back, the global path's locks and
 *              folds, create/destroy, quiesce/resume and the ops table
 *   release.c  malloc past the cache: a new segment, garbage collection,
 *              release-and-retry before OOM; and empty_cache
 *   expandable.c  expandable segments: pages mapped and unmapped in one
 *              growing virtual range per stream and pool
 *   streams.c  the stream table, block records, record_stream, and the
 *              completion of events
 *   options.c  the option table, the PYTORCH_CUDA_ALLOC_CONF tokenizer and
 *              the merging of keys and string (PyTorch's CUDAAllocatorConfig)
 *   report.c   torch.cuda.memory_stats(), memory_summary(), the OOM text
 *   check.c    the walk and the invariant check
 * Calls go one way, down: caching.c calls every other file, release.c calls
 * expandable.c, streams.c and report.c, expandable.c calls streams.c, and
 * streams.c, options.c, report.c and check.c call no file of the folder.
 * Invariants and locking: Note [Invariants], [Locking] in caching.c.
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
 * streams.c).  Its first cache line holds all that a tree search, a tree
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
  void *chunks;          /* the records' memory: chunks of CACHE_CHUNK, linked (streams.c) */
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

/* The policy.  Synchronization: conf and device_total are set at creation
 * and then only read; fraction_set, allowed_max, global_only and defer too,
 * but for set_fraction, which runs quiesced (every lock held; global_only is
 * atomic, read by the fast path before any lock); `st`
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
  _Atomic bool global_only; /* GC on: every alloc takes the global path (set_fraction sets it) */
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

/* ---- the shared inline operations ---------------------------------------------
 * What the hot path (caching.c) and the global path's files both use, inline
 * so that the hot path stays one translation unit's: the free trees, the
 * records, the segment list, the stream table's lookup, the statistic
 * journals, and the merge and free of a block. */

/* The hot path (a cached alloc and its free) is inlined whole into the ops,
 * once with direct statistics (j == NULL) and once with a journal. */
#if defined(__GNUC__)
#define CACHE_HOT      inline __attribute__((always_inline))
#define CACHE_NOINLINE __attribute__((noinline))
#else
#define CACHE_HOT inline
#define CACHE_NOINLINE
#endif

/* ---- treaps ---------------------------------------------------------------------
 * Free trees are ordered by (size, ptr); unmapped trees by ptr.  A block's key
 * never changes while it is in a tree, except in place where its order among
 * its neighbours stays (cache_alloc_found, cache_merge_in_place).  Nodes
 * link to their parent, so an erase needs no search: the node is rotated
 * down below its children (heap order: prio(parent) >= prio(child)) until
 * it has at most one and is spliced out, an expected < 2 rotations; an
 * insert descends by key to a leaf and rotates up while its priority
 * passes its parent's (also < 2 expected).  Neighbours in key order are
 * found from the node itself (treap_successor). */

/* Rotate x above its parent p (x keeps its key order: p becomes x's child). */
static inline void treap_rotate_up(cache_block_t **root, cache_block_t *x) {
  cache_block_t *p = x->parent, *g = p->parent;
  if (p->left == x) {
    p->left = x->right;
    if (x->right) x->right->parent = p;
    x->right = p;
  } else {
    p->right = x->left;
    if (x->left) x->left->parent = p;
    x->left = p;
  }
  p->parent = x;
  x->parent = g;
  if (g == NULL)
    *root = x;
  else if (g->left == p)
    g->left = x;
  else
    g->right = x;
}

/* Insert n below *root by key, then rotate it up past parents of lower
 * priority.  Inline into each caller with by_addr a constant: a free tree's
 * descent compares sizes, and addresses only between equal sizes. */
static inline void treap_insert(cache_block_t **root, cache_block_t *n, bool by_addr) {
  cache_block_t *parent = NULL, **link = root;
  while (*link != NULL) {
    parent = *link;
    link = cache_less(n, parent->size, parent->ptr, by_addr) ? &parent->left : &parent->right;
  }
  n->left = n->right = NULL;
  n->parent = parent;
  *link = n;
  while (n->parent != NULL && n->prio > n->parent->prio)
    treap_rotate_up(root, n);
}

static inline void treap_erase(cache_block_t **root, cache_block_t *n) {
  while (n->left != NULL && n->right != NULL)
    treap_rotate_up(root, n->left->prio > n->right->prio ? n->left : n->right);
  cache_block_t *child = n->left != NULL ? n->left : n->right, *parent = n->parent;
  if (child != NULL) child->parent = parent;
  if (parent == NULL)
    *root = child;
  else if (parent->left == n)
    parent->left = child;
  else
    parent->right = child;
}

/* The first block whose key is >= (size, ptr), or NULL. */
static inline cache_block_t *treap_lower_bound(cache_block_t *t, size_t size, uintptr_t ptr,
                                               bool by_addr) {
  cache_block_t *best = NULL;
  while (t != NULL) {
    if (cache_less(t, size, ptr, by_addr)) {
      t = t->right;
    } else {
      best = t;
      t = t->left;
    }
  }
  return best;
}

/* The first block whose key is >= (size, 0) in a free tree, and in *pred the
 * last block before it (NULL: none). */
static inline cache_block_t *treap_fit(cache_block_t *t, size_t size, cache_block_t **pred) {
  cache_block_t *best = NULL, *before = NULL;
  while (t != NULL) {
    if (t->size < size) {
      before = t;
      t = t->right;
    } else {
      best = t;
      t = t->left;
    }
  }
  *pred = before;
  return best;
}

/* The block after `n` in its tree's order, or NULL. */
static inline cache_block_t *treap_successor(const cache_block_t *n) {
  if (n->right != NULL) {
    cache_block_t *m = n->right;
    while (m->left != NULL)
      m = m->left;
    return m;
  }
  while (n->parent != NULL && n->parent->right == n)
    n = n->parent;
  return n->parent;
}

/* The block before `n` in its tree's order, or NULL. */
static inline cache_block_t *treap_predecessor(const cache_block_t *n) {
  if (n->left != NULL) {
    cache_block_t *m = n->left;
    while (m->right != NULL)
      m = m->right;
    return m;
  }
  while (n->parent != NULL && n->parent->left == n)
    n = n->parent;
  return n->parent;
}

/* ---- a pool's bins: the free tree in pieces ------------------------------------- */

/* BlockPool::insert_into_blocks' stamp of the GC clock.  The clock runs
 * only with GC on (cache_find_free_block); off, it stays 0, as every
 * record's stamp does (records are made zeroed), so the stamp is not
 * written and the block's second line is not touched. */
static inline void cache_gc_stamp(const cache_t *c, const cache_pool_t *p, cache_block_t *b) {
  if (GMR_UNLIKELY(atomic_load_explicit(&c->global_only, memory_order_relaxed)))
    b->gc_count_base = c->gc_clock[p->is_small];
}

/* BlockPool::insert_into_blocks: stamps the GC clock. */
static inline void pool_insert(cache_t *c, cache_pool_t *p, cache_block_t *b) {
  cache_gc_stamp(c, p, b);
  unsigned k = cache_bin(p, b->size);
  b->bin = (uint8_t)k;
  treap_insert(&p->bins[k], b, false);
  p->nonempty |= 1ull << k;
  b->in_tree = true;
  ++p->n_blocks;
}

/* Not `inline`: gcc weighs inlining it as it did when it was local to
 * caching.c, which keeps the hot path's instruction counts
 * (docs/benchmarks.md); `unused` for the files that do not call it. */
static __attribute__((unused)) void pool_erase(cache_pool_t *p, cache_block_t *b) {
  unsigned k = b->bin;
  treap_erase(&p->bins[k], b);
  if (p->bins[k] == NULL) p->nonempty &= ~(1ull << k);
  b->in_tree = false;
  --p->n_blocks;
}

static inline cache_block_t *treap_first(cache_block_t *t) {
  while (t != NULL && t->left != NULL)
    t = t->left;
  return t;
}

static inline cache_block_t *treap_last(cache_block_t *t) {
  while (t != NULL && t->right != NULL)
    t = t->right;
  return t;
}

/* The first block of the first bin at or after k, or NULL. */
static inline cache_block_t *pool_first_from(const cache_pool_t *p, unsigned k) {
  int b = cache_bin_next(p, k);
  return b < 0 ? NULL : treap_first(p->bins[b]);
}

/* The best fit: the first free block whose key is >= (size, 0), and in
 * *pred the block before it in its bin (NULL: the first of its bin), or
 * NULL. */
static inline cache_block_t *pool_fit(const cache_pool_t *p, size_t size, cache_block_t **pred) {
  unsigned k = cache_bin(p, size);
  cache_block_t *b = treap_fit(p->bins[k], size, pred);
  if (GMR_LIKELY(b != NULL)) return b;
  *pred = NULL;
  return pool_first_from(p, k + 1);
}

/* The free blocks after and before n in the pool's order, or NULL. */
static inline cache_block_t *pool_next(const cache_pool_t *p, const cache_block_t *n) {
  cache_block_t *s = treap_successor(n);
  return s != NULL ? s : pool_first_from(p, n->bin + 1u);
}

static inline cache_block_t *pool_prev(const cache_pool_t *p, const cache_block_t *n) {
  cache_block_t *s = treap_predecessor(n);
  if (s != NULL) return s;
  int b = cache_bin_prev(p, (int)n->bin - 1);
  return b < 0 ? NULL : treap_last(p->bins[b]);
}

static inline void unmapped_insert(cache_pool_t *p, cache_block_t *b) {
  treap_insert(&p->unmapped, b, true);
  b->in_tree = true;
}

static inline void unmapped_erase(cache_pool_t *p, cache_block_t *b) {
  treap_erase(&p->unmapped, b);
  b->in_tree = false;
}

/* ---- records and segments --------------------------------------------------------- */

/* A blank record from the pool's stream; the caller has reserved it. */
static inline cache_block_t *cache_record(cache_pool_t *p, cache_seg_t *seg, uintptr_t ptr,
                                          size_t size) {
  cache_stream_t *cs = p->stream;
  cache_block_t *b = cs->spare;
  cs->spare = b->next;
  --cs->n_spare;
  /* Every field but the ones its user sets next (prev, next, requested,
   * allocated; tree links, priority and GC stamp at insertion) and the
   * recorded-streams array it keeps for reuse. */
  b->ptr = ptr;
  b->size = size;
  b->requested = 0;
  b->pool = p;
  b->seg = seg;
  b->prev = b->next = NULL;
  b->allocated = false;
  b->mapped = true;
  b->in_tree = false;
  b->event_count = 0;
  b->n_uses = 0;
  return b;
}

/* Give b back to the spare records of its stream cs. */
static inline void cache_recycle(cache_stream_t *cs, cache_block_t *b) {
  b->next = cs->spare;
  cs->spare = b;
  ++cs->n_spare;
}

static inline void seg_link(cache_t *c, cache_seg_t *s) {
  s->prev_seg = NULL;
  s->next_seg = c->segs;
  if (c->segs) c->segs->prev_seg = s;
  c->segs = s;
  ++c->n_segs;
}

static inline void seg_unlink(cache_t *c, cache_seg_t *s) {
  if (s->prev_seg)
    s->prev_seg->next_seg = s->next_seg;
  else
    c->segs = s->next_seg;
  if (s->next_seg) s->next_seg->prev_seg = s->prev_seg;
  --c->n_segs;
}

/* ---- the stream table ------------------------------------------------------------- */

/* Stream locks are gmr_spin_t (core/lock.h): the fast path holds one for a
 * few tens of nanoseconds; a waiter yields the processor after a short
 * spin, so a global path that holds every stream lock through a device call
 * costs waiters little. */
static inline void cache_spin_lock(gmr_spin_t *l) {
  gmr__spin_lock(l);
}

static inline void cache_spin_unlock(gmr_spin_t *l) {
  gmr__spin_unlock(l);
}

/* A stream's home slot in the table: the top 12 bits of its hash. */
static inline size_t cache_stab_home(gmr_stream_t s) {
  _Static_assert(CACHE_STAB == 1 << 12, "the stream table's home slot takes 12 bits");
  return gmr__hash_bits((uint64_t)(uintptr_t)s, 12);
}

/* Lock-free lookup (the table is append-only; entries are published with
 * release stores after they are built). */
static inline cache_stream_t *cache_stream_find(cache_t *c, gmr_stream_t s) {
  for (size_t i = cache_stab_home(s), n = 0; n < CACHE_STAB; i = (i + 1) & (CACHE_STAB - 1), ++n) {
    cache_stream_t *cs = atomic_load_explicit(&c->stab[i], memory_order_acquire);
    if (cs == NULL || cs->id == s) return cs;
  }
  return NULL;
}

/* ---- statistic journals ------------------------------------------------------------
 * A fast path that found slock busy records its stat changes and keeps them
 * in its stream's delta (caching.c, Note [Locking]); otherwise changes are
 * applied directly (j NULL).
 * t < 0: a single record (oversize_*) rather than an [all, small, large]
 * array.  A stat changes at most once per op, so a journal gives the same
 * peaks as direct updates. */

typedef struct cache_journal_s cache_journal_t;
struct cache_journal_s {
  int n;
  struct {
    gmr_stat_t *stat; /* into cache_t.st */
    int t;
    int64_t d; /* > 0: increase; < 0: decrease */
  } e[16];
};

static inline void cache_apply(gmr_stat_t *a, int t, int64_t d) {
  if (t < 0 && d > 0)
    gmr__stat_increase(a, d);
  else if (t < 0)
    gmr__stat_decrease(a, -d);
  else if (d > 0)
    cache_inc(a, t, d);
  else
    cache_dec(a, t, -d);
}

static inline void cache_add(cache_journal_t *j, gmr_stat_t *a, int t, int64_t d) {
  if (j == NULL) {
    cache_apply(a, t, d);
  } else {
    j->e[j->n].stat = a;
    j->e[j->n].t = t;
    j->e[j->n].d = d;
    ++j->n;
  }
}

/* cache_add with the sign known: n > 0 is added (up) or taken away (down). */
static inline void cache_up(cache_journal_t *j, gmr_stat_t *a, int t, int64_t n) {
  if (GMR_LIKELY(j == NULL))
    cache_inc(a, t, n);
  else
    cache_add(j, a, t, n);
}

static inline void cache_down(cache_journal_t *j, gmr_stat_t *a, int t, int64_t n) {
  if (GMR_LIKELY(j == NULL))
    cache_dec(a, t, n);
  else
    cache_add(j, a, t, -n);
}

/* ---- merging and freeing a block -------------------------------------------------- */

/* try_merge_blocks' test: may `src` merge into the freed block `dst`?
 * PyTorch's also asks for no recorded streams, which a block that is not
 * allocated never has (internal.h): the test reads src's first line only. */
static inline bool cache_mergeable(const cache_block_t *dst, const cache_block_t *src) {
  gmr_assert_internal(src == NULL || src->allocated || src->n_uses == 0);
  return src != NULL && !src->allocated && src->event_count == 0 && dst->mapped == src->mapped;
}

/* try_merge_blocks' merge, the test passed: merge `src` into `dst` (dst is
 * in no tree); returns the bytes subsumed. */
static inline size_t cache_merge_into(cache_block_t *dst, cache_block_t *src) {
  if (dst->prev == src) { /* [src dst] */
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    if (dst->prev == NULL) dst->seg->head = dst; /* the head: the block with no prev */
  } else {                                       /* [dst src] */
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  size_t subsumed = src->size;
  dst->size += subsumed;
  cache_pool_t *p = dst->pool; /* the segment's, src's too */
  if (src->mapped)
    pool_erase(p, src);
  else
    unmapped_erase(p, src);
  cache_recycle(p->stream, src);
  return subsumed;
}

/* free_block when exactly one neighbour of the mapped block b merges (mp:
 * the one before it, else the one after): the neighbour's record
 * becomes the merged block (PyTorch keeps the freed block's record; which
 * record survives is not observable).  When the merged key (size, ptr),
 * which only grows, stays in the neighbour's bin and below its successor
 * there, it keeps the neighbour's node and no tree changes shape; else the
 * node leaves its tree and enters again.  Returns the merged block and in
 * *subsumed the neighbour's old size. */
static CACHE_HOT cache_block_t *cache_merge_in_place(cache_t *c, cache_block_t *b, bool mp,
                                                     size_t *subsumed) {
  cache_block_t *pv = b->prev, *nx = b->next;
  bool mn = !mp;
  cache_block_t *host = mp ? pv : nx;
  size_t size = host->size + b->size;
  uintptr_t ptr = mp ? pv->ptr : b->ptr;
  cache_pool_t *p = b->pool; /* the segment's, host's too */
  const cache_block_t *succ = treap_successor(host);
  bool stays = size < p->floor[host->bin + 1] &&
               (succ == NULL || size < succ->size || (size == succ->size && ptr < succ->ptr));
  if (!stays) pool_erase(p, host);
  *subsumed = host->size;
  if (mn) { /* [b host] */
    host->ptr = b->ptr;
    host->prev = b->prev;
    if (host->prev) host->prev->next = host;
    if (host->prev == NULL) b->seg->head = host;
  } else { /* [host b] */
    host->next = b->next;
    if (host->next) host->next->prev = host;
  }
  host->size = size; /* its `requested` is not b's: a free block's is never read (check.c) */
  if (stays)
    cache_gc_stamp(c, p, host); /* insert_into_blocks' */
  else
    pool_insert(c, p, host);
  cache_recycle(p->stream, b);
  return host;
}

/* free_block: return a block with no pending uses to its pool, merging it. */
static CACHE_HOT void cache_free_block(cache_t *c, cache_block_t *b, cache_journal_t *j) {
  size_t orig = b->size, requested = b->requested;
  cache_pool_t *p = b->pool;
  int64_t net_n = 0, net_bytes = 0;
  cache_block_t *pv = b->prev, *nx = b->next, *m = b;
  bool mp = cache_mergeable(b, pv), mn = cache_mergeable(b, nx); /* before any merge */
  if (mp != mn && b->mapped) {
    size_t sub;
    m = cache_merge_in_place(c, b, mp, &sub); /* b is recycled */
    net_n = -1;
    net_bytes = -(int64_t)sub;
  } else {
    if (mp) {
      net_n -= 1;
      net_bytes -= (int64_t)cache_merge_into(b, pv);
    }
    if (mn) {
      net_n -= 1;
      net_bytes -= (int64_t)cache_merge_into(b, nx);
    }
    pool_insert(c, p, b);
  }
  if (cache_is_split(m)) {
    net_n += 1;
    net_bytes += (int64_t)m->size;
  }
  int t = cache_stat_type(p);
  if (!c->conf.expandable) { /* b's segment is not expandable */
    if (net_n != 0) cache_add(j, c->st.inactive_split, t, net_n);
    if (net_bytes != 0) cache_add(j, c->st.inactive_split_bytes, t, net_bytes);
  }
  if (c->events_seen) {
    cache_down(j, c->st.active, t, 1);
    cache_down(j, c->st.active_bytes, t, (int64_t)orig);
  }
  cache_down(j, c->st.requested_bytes, t, (int64_t)requested);
}

/* ---- across files -------------------------------------------------------------- */

/* release.c (global path: every lock held, the deferred frees applied):
 * malloc past the cached blocks (a new segment, garbage collection,
 * release-and-retry, the OOM error; 0 with *out a block in no tree), and
 * empty_cache. */
int gmr__cache_alloc_new(cache_t *c, cache_pool_t *p, size_t size, size_t alloc_size,
                         cache_block_t **out);
int gmr__cache_release_cached(cache_t *c);

/* expandable.c (global path): a block of `size` bytes of pool p from an
 * expandable segment (0 with *out NULL when the device refuses), the unmap
 * of the pages wholly inside a free block, the release of a segment wholly
 * unmapped, and the unmap of every page of a segment (destroy). */
int gmr__cache_try_expandable(cache_t *c, cache_pool_t *p, size_t size, cache_block_t **out);
int gmr__cache_unmap_block(cache_t *c, cache_block_t *b);
int gmr__cache_release_expandable(cache_t *c, cache_block_t *b);
void gmr__cache_unmap_segment(cache_t *c, cache_seg_t *s);

/* streams.c: at least n spare records in a stream (its lock held); on the
 * global path, a stream found or made, record_stream, the blocks whose
 * events have all completed freed (or every event waited for first), and
 * destroy's first and last steps.  The events of a free are recorded by
 * caching.c (cache_insert_events, on the free path). */
int gmr__cache_records_reserve(cache_stream_t *cs, size_t n);
cache_stream_t *gmr__cache_stream(cache_t *c, gmr_stream_t s);
int gmr__cache_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s);
int gmr__cache_process_events(cache_t *c);
int gmr__cache_sync_events(cache_t *c);
void gmr__cache_events_destroy(cache_t *c);
void gmr__cache_streams_free(cache_t *c);

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
/* PyTorch's sentence on the device's processes, in the OOM message (report.c). */
const char *gmr__cache_proc_info(const gmr_proc_usage_t *p, size_t n, unsigned self, char *buf,
                                 size_t len);

/* check.c: the walk (deferred frees applied first, as above) and the
 * invariant check (the state as it stands), run quiesced. */
int gmr__cache_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud);
int gmr__cache_check(gmr_policy_t *self);

#endif /* GMR_POLICIES_CACHING_H */
