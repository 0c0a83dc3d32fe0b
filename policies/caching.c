/* caching.c: the `caching` policy, PyTorch's CUDA caching allocator.
 *
 * A re-implementation, behaviour for behaviour, of
 * c10/cuda/CUDACachingAllocator.cpp's DeviceCachingAllocator (see
 * docs/caching.md and the specification it follows): requests are rounded
 * to 512 bytes (or to power-of-two divisions), go to the small pool
 * (<= 1 MiB) or the large pool, are served best fit by (stream, size,
 * address) from cached free blocks, and otherwise from a new segment of
 * 2 MiB, 20 MiB or the request rounded to 2 MiB (or from pages mapped into
 * one growing virtual range per stream and pool: expandable segments).
 * Blocks are split and merged exactly as PyTorch does; max_split_size,
 * max_non_split_rounding, garbage_collection_threshold, the memory fraction,
 * record_stream with events, release-and-retry before OOM and empty_cache
 * follow PyTorch, as do torch.cuda.memory_stats() (every key, same name),
 * memory_summary() (byte for byte) and the OOM message.
 *
 * Structures.  A segment (cache_seg_t) is a doubly linked list of blocks in
 * address order (prev/next).  Free blocks live in their (stream, pool)'s
 * treap ordered by (size, address); since PyTorch's one std::set is ordered
 * by (stream, size, address) and a search never leaves its stream, per-stream
 * trees give the identical best fit.  Unmapped ranges of expandable segments
 * live in a second treap per pool, ordered by address.  Block records are
 * recycled, so the hot path (a cached alloc and free) does no host
 * allocation.
 *
 * Invariants (checked by cache_check):
 *   for every segment: Σ block sizes = segment size, blocks contiguous,
 *     no two neighbours both free (not allocated, no pending events, same
 *     mapping state);
 *   a block is in its pool's free tree iff it is free and mapped;
 *   reserved_bytes.all.current = Σ non-expandable segment sizes
 *                                + Σ mapped bytes of expandable segments
 *   reserved >= active >= allocated (bytes, every pool).
 *
 * Locking (the policy is `concurrent`).  Blocks never cross streams, so
 * each stream has its own lock over its pools and blocks.  The fast path (an
 * alloc served from the stream's cache, a free without recorded streams)
 * takes only that lock.  Everything else (new segments, releasing, events,
 * record_stream, statistics, walks) takes the global path: `glock`, then
 * every stream lock in creation order, which excludes all fast paths.
 * Statistics: the fast path changes the policy's figures under `slock`
 * when that lock is free (always, with one thread, so every figure and
 * every peak is PyTorch's, exactly); once a fast path finds it busy, fast
 * paths journal their changes into a per-stream delta, folded in by the
 * next global path.  Then current, allocated and freed
 * figures stay exact and peaks are those seen at the folds.
 */
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

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

static const cache_opts_t cache_opts_default = {
    .expandable_segments = -1,
    .per_process_memory_fraction = -1.0,
    .release_lock_on_cudamalloc = -1,
};

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

struct cache_block_s {
  uintptr_t ptr;               /* device address */
  size_t size;                 /* bytes */
  size_t requested;            /* bytes the user asked for (live blocks) */
  cache_pool_t *pool;          /* the (stream, small|large) pool */
  cache_seg_t *seg;            /* the segment it is part of */
  cache_block_t *prev, *next;  /* neighbours in the segment, by address */
  cache_block_t *left, *right; /* treap children while in a free or unmapped tree */
  uint32_t prio;               /* treap priority */
  bool allocated;              /* handed to the user */
  bool mapped;                 /* false only for unmapped expandable ranges */
  bool in_tree;                /* in pool->blocks (mapped) or pool->unmapped */
  int event_count;             /* events still pending since the free */
  gmr_stream_t *uses;          /* streams from record_stream (not the own one) */
  uint32_t n_uses, cap_uses;   /* entries */
  int64_t gc_count_base;       /* the pool's GC clock when it became free */
};

struct cache_pool_s {
  cache_block_t *blocks;   /* treap of free mapped blocks by (size, ptr) */
  cache_block_t *unmapped; /* treap of unmapped expandable ranges by ptr */
  size_t n_blocks;         /* entries in `blocks` */
  cache_stream_t *stream;
  bool is_small;
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
 * spare records, prio_state and delta; ev_head/ev_tail are guarded by the
 * policy's glock; id is immutable. */
struct cache_stream_s {
  char pad_front[64]; /* keeps streams off each other's cache lines */
  gmr_stream_t id;
  _Atomic int lock;      /* a spin lock: 0 free, 1 held */
  cache_pool_t pools[2]; /* [0] large, [1] small */
  cache_block_t *spare;  /* recycled block records, linked by `next` */
  size_t n_spare;
  uint64_t prio_state;              /* treap priorities (an LCG) */
  bool dirty;                       /* delta holds something */
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
  pthread_mutex_t glock;    /* the global lock (see "Locking" above) */
  atomic_flag slock;        /* guards `st` for the fast path's commits (try only) */
  _Atomic bool sharded;     /* a commit found slock busy: fast paths keep deltas */
  _Atomic(cache_stream_t *) stab[CACHE_STAB]; /* stream lookup, lock-free */
} cache_t;

static inline int cache_stat_type(const cache_pool_t *p) {
  return p->is_small ? CS_SMALL : CS_LARGE;
}
static inline void cache_inc(gmr_stat_t *a, int t, int64_t n) {
  gmr__stat_increase(&a[CS_ALL], n);
  gmr__stat_increase(&a[t], n);
}
static inline void cache_dec(gmr_stat_t *a, int t, int64_t n) {
  gmr__stat_decrease(&a[CS_ALL], n);
  gmr__stat_decrease(&a[t], n);
}

/* ---- treaps ---------------------------------------------------------------------
 * Free trees are ordered by (size, ptr); unmapped trees by ptr.  A block's key
 * never changes while it is in a tree. */

static inline bool cache_less(const cache_block_t *a, size_t size, uintptr_t ptr, bool by_addr) {
  if (!by_addr && a->size != size) return a->size < size;
  return a->ptr < ptr;
}

static cache_block_t *treap_join(cache_block_t *l, cache_block_t *r) {
  if (l == NULL) return r;
  if (r == NULL) return l;
  if (l->prio > r->prio) {
    l->right = treap_join(l->right, r);
    return l;
  }
  r->left = treap_join(l, r->left);
  return r;
}

/* Split t into keys < (size, ptr) and keys >= (size, ptr). */
static void treap_split(cache_block_t *t, size_t size, uintptr_t ptr, bool by_addr,
                        cache_block_t **l, cache_block_t **r) {
  if (t == NULL) {
    *l = *r = NULL;
  } else if (cache_less(t, size, ptr, by_addr)) {
    treap_split(t->right, size, ptr, by_addr, &t->right, r);
    *l = t;
  } else {
    treap_split(t->left, size, ptr, by_addr, l, &t->left);
    *r = t;
  }
}

static cache_block_t *treap_insert(cache_block_t *t, cache_block_t *n, bool by_addr) {
  if (t == NULL) {
    n->left = n->right = NULL;
    return n;
  }
  if (n->prio > t->prio) {
    treap_split(t, n->size, n->ptr, by_addr, &n->left, &n->right);
    return n;
  }
  if (cache_less(n, t->size, t->ptr, by_addr))
    t->left = treap_insert(t->left, n, by_addr);
  else
    t->right = treap_insert(t->right, n, by_addr);
  return t;
}

static cache_block_t *treap_erase(cache_block_t *t, cache_block_t *n, bool by_addr) {
  if (t == n) return treap_join(n->left, n->right);
  if (cache_less(n, t->size, t->ptr, by_addr))
    t->left = treap_erase(t->left, n, by_addr);
  else
    t->right = treap_erase(t->right, n, by_addr);
  return t;
}

/* The first block whose key is >= (size, ptr), or NULL. */
static cache_block_t *treap_lower_bound(cache_block_t *t, size_t size, uintptr_t ptr,
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

static cache_block_t *treap_last(cache_block_t *t) {
  while (t && t->right)
    t = t->right;
  return t;
}

static size_t treap_collect(cache_block_t *t, cache_block_t **v, size_t n) {
  if (t == NULL) return n;
  n = treap_collect(t->left, v, n);
  v[n++] = t;
  return treap_collect(t->right, v, n);
}

static inline uint32_t cache_prio(cache_stream_t *cs) {
  cs->prio_state = cs->prio_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(cs->prio_state >> 33);
}

/* BlockPool::insert_into_blocks: stamps the GC clock. */
static void pool_insert(cache_t *c, cache_pool_t *p, cache_block_t *b) {
  b->gc_count_base = c->gc_clock[p->is_small];
  b->prio = cache_prio(p->stream);
  p->blocks = treap_insert(p->blocks, b, false);
  b->in_tree = true;
  ++p->n_blocks;
}

static void pool_erase(cache_pool_t *p, cache_block_t *b) {
  p->blocks = treap_erase(p->blocks, b, false);
  b->in_tree = false;
  --p->n_blocks;
}

static void unmapped_insert(cache_t *c, cache_pool_t *p, cache_block_t *b) {
  b->prio = cache_prio(p->stream);
  p->unmapped = treap_insert(p->unmapped, b, true);
  b->in_tree = true;
}

static void unmapped_erase(cache_pool_t *p, cache_block_t *b) {
  p->unmapped = treap_erase(p->unmapped, b, true);
  b->in_tree = false;
}

/* ---- records ---------------------------------------------------------------------- */

/* Keep at least n spare block records in a stream, so that a step that
 * needs some cannot fail half way.  Caller holds the stream's lock. */
static int cache_records_reserve(cache_stream_t *cs, size_t n) {
  while (cs->n_spare < n) {
    cache_block_t *b = gmr__calloc(1, sizeof *b);
    if (b == NULL)
      return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for block records");
    b->next = cs->spare;
    cs->spare = b;
    ++cs->n_spare;
  }
  return 0;
}

/* A blank record from the pool's stream; the caller has reserved it. */
static cache_block_t *cache_record(cache_pool_t *p, cache_seg_t *seg, uintptr_t ptr, size_t size) {
  cache_stream_t *cs = p->stream;
  cache_block_t *b = cs->spare;
  cs->spare = b->next;
  --cs->n_spare;
  gmr_stream_t *uses = b->uses;
  uint32_t cap = b->cap_uses;
  memset(b, 0, sizeof *b);
  b->uses = uses;
  b->cap_uses = cap;
  b->pool = p;
  b->seg = seg;
  b->ptr = ptr;
  b->size = size;
  b->mapped = true;
  return b;
}

static void cache_recycle(cache_block_t *b) {
  cache_stream_t *cs = b->pool->stream;
  b->next = cs->spare;
  cs->spare = b;
  ++cs->n_spare;
}

/* ---- streams ----------------------------------------------------------------------- */

/* Stream locks are spin locks: the fast path holds one for a few tens of
 * nanoseconds; a waiter yields the processor after a short spin, so a global
 * path that holds every stream lock through a device call costs waiters
 * little. */
static inline void cache_spin_lock(_Atomic int *l) {
  for (unsigned n = 0;;) {
    if (!atomic_exchange_explicit(l, 1, memory_order_acquire)) return;
    while (atomic_load_explicit(l, memory_order_relaxed)) {
      if (++n < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        n = 0;
        sched_yield();
      }
    }
  }
}

static inline void cache_spin_unlock(_Atomic int *l) {
  atomic_store_explicit(l, 0, memory_order_release);
}

static inline size_t cache_stab_home(gmr_stream_t s) {
  return (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 52) & (CACHE_STAB - 1);
}

/* Lock-free lookup (the table is append-only; entries are published with
 * release stores after they are built). */
static cache_stream_t *cache_stream_find(cache_t *c, gmr_stream_t s) {
  for (size_t i = cache_stab_home(s), n = 0; n < CACHE_STAB; i = (i + 1) & (CACHE_STAB - 1), ++n) {
    cache_stream_t *cs = atomic_load_explicit(&c->stab[i], memory_order_acquire);
    if (cs == NULL || cs->id == s) return cs;
  }
  return NULL;
}

/* Find or create (global path only).  A new stream is created with its lock
 * held, as the global path holds every stream's lock. */
static cache_stream_t *cache_stream(cache_t *c, gmr_stream_t s) {
  cache_stream_t *cs = cache_stream_find(c, s);
  if (cs != NULL) return cs;
  if (c->n_streams >= CACHE_STAB / 2) {
    gmr__error_set(GMR_ENOMEM, "caching: more than %d streams", CACHE_STAB / 2);
    return NULL;
  }
  if (c->n_streams == c->cap_streams) {
    size_t cap = c->cap_streams ? c->cap_streams * 2 : 8;
    cache_stream_t **v = gmr__realloc(c->streams, cap * sizeof *v);
    if (v == NULL) goto nomem;
    c->streams = v;
    c->cap_streams = cap;
  }
  cs = gmr__calloc(1, sizeof *cs);
  if (cs == NULL) goto nomem;
  cache_spin_lock(&cs->lock);
  cs->id = s;
  cs->prio_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)c->n_streams;
  for (int i = 0; i < 2; ++i) {
    cs->pools[i].stream = cs;
    cs->pools[i].is_small = i == 1;
  }
  c->streams[c->n_streams++] = cs;
  size_t i = cache_stab_home(s);
  while (atomic_load_explicit(&c->stab[i], memory_order_relaxed) != NULL)
    i = (i + 1) & (CACHE_STAB - 1);
  atomic_store_explicit(&c->stab[i], cs, memory_order_release);
  return cs;
nomem:
  gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a stream");
  return NULL;
}

/* The global path: glock, then every stream's lock in creation order; the
 * fast paths' stat deltas are folded in first. */
static void cache_fold(cache_t *c);
static void cache_lock_all(cache_t *c) {
  pthread_mutex_lock(&c->glock);
  for (size_t i = 0; i < c->n_streams; ++i)
    cache_spin_lock(&c->streams[i]->lock);
  cache_fold(c);
}

static void cache_unlock_all(cache_t *c) {
  for (size_t i = c->n_streams; i-- > 0;)
    cache_spin_unlock(&c->streams[i]->lock);
  pthread_mutex_unlock(&c->glock);
}

/* ---- statistic journals ------------------------------------------------------------
 * A fast path that found slock busy records its stat changes and keeps them
 * in its stream's delta (see "Locking" at the top); otherwise changes are
 * applied directly (j NULL).
 * t < 0: a single record (oversize_*) rather than an [all, small, large]
 * array.  A stat changes at most once per op, so a journal gives the same
 * peaks as direct updates. */

typedef struct cache_journal_s {
  int n;
  struct {
    gmr_stat_t *stat; /* into cache_t.st */
    int t;
    int64_t d; /* > 0: increase; < 0: decrease */
  } e[16];
} cache_journal_t;

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

static inline void cache_delta_one(gmr_stat_t *x, int64_t d) {
  x->current += d;
  if (d > 0)
    x->allocated += d;
  else
    x->freed += -d;
}

/* A fast path that is about to change statistics: NULL when it may change
 * the policy's figures directly (it then holds slock until cache_commit),
 * else the journal to fill.  Caller holds cs->lock. */
static cache_journal_t *cache_begin(cache_t *c, cache_journal_t *j) {
  j->n = 0;
  if (!atomic_load_explicit(&c->sharded, memory_order_relaxed)) {
    if (!atomic_flag_test_and_set_explicit(&c->slock, memory_order_acquire)) return NULL;
    atomic_store_explicit(&c->sharded, true, memory_order_relaxed);
  }
  return j;
}

/* Release slock, or keep the journal in the stream's delta. */
static void cache_commit(cache_t *c, cache_stream_t *cs, const cache_journal_t *j) {
  if (j == NULL) {
    atomic_flag_clear_explicit(&c->slock, memory_order_release);
    return;
  }
  for (int i = 0; i < j->n; ++i) {
    gmr_stat_t *a = (gmr_stat_t *)((char *)&cs->delta + ((char *)j->e[i].stat - (char *)&c->st));
    cache_delta_one(&a[0], j->e[i].d);
    if (j->e[i].t >= 0) cache_delta_one(&a[j->e[i].t], j->e[i].d);
  }
  cs->dirty = true;
}

/* Fold every stream's delta into the figures; global path only. */
static void cache_fold(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    if (!cs->dirty) continue;
    gmr_stat_t *dst = (gmr_stat_t *)&c->st, *src = (gmr_stat_t *)&cs->delta;
    for (int k = 0; k < CACHE_N_STATS; ++k) {
      dst[k].current += src[k].current;
      dst[k].allocated += src[k].allocated;
      dst[k].freed += src[k].freed;
      if (dst[k].current > dst[k].peak) dst[k].peak = dst[k].current;
      src[k] = (gmr_stat_t){0, 0, 0, 0};
    }
    cs->dirty = false;
  }
}

/* ---- sizes -------------------------------------------------------------------------- */

static size_t cache_next_division(size_t size, uint32_t divisions) {
  if (gmr__is_pow2(size)) return size;
  size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
  size_t step = floor2 >> (31 - __builtin_clz(divisions));
  if (step == 0) return floor2 << 1;
  size_t f = size & ~(step - 1);
  return f == size ? size : f + step;
}

/* round_size */
static size_t cache_round_size(const cache_t *c, size_t size) {
  if (size < CACHE_MIN_BLOCK) return CACHE_MIN_BLOCK;
  int lg = 63 - __builtin_clzll((unsigned long long)size);
  int idx = lg > 20 ? lg - 20 : 0;
  if (idx > CACHE_DIV_BUCKETS - 1) idx = CACHE_DIV_BUCKETS - 1;
  uint32_t div = c->conf.div[idx];
  if (div > 1 && size > CACHE_MIN_BLOCK * div) return cache_next_division(size, div);
  return gmr__align_up(size, CACHE_MIN_BLOCK);
}

/* get_allocation_size */
static size_t cache_allocation_size(const cache_t *c, size_t size) {
  if (size <= CACHE_SMALL_SIZE) return CACHE_SMALL_BUFFER;
  if (size < CACHE_MIN_LARGE_ALLOC) return c->conf.large_segment;
  return gmr__align_up(size, CACHE_ROUND_LARGE);
}

/* c10's format_size, for the OOM message. */
static void cache_format_size(uint64_t size, char *buf, size_t len) {
  if (size <= 1024)
    snprintf(buf, len, "%llu bytes", (unsigned long long)size);
  else if (size <= 1048576)
    snprintf(buf, len, "%.2f KiB", (double)size / 1024.0);
  else if (size <= 1073741824ull)
    snprintf(buf, len, "%.2f MiB", (double)size / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", (double)size / 1073741824.0);
}

/* ---- segments ----------------------------------------------------------------------- */

static void seg_link(cache_t *c, cache_seg_t *s) {
  s->prev_seg = NULL;
  s->next_seg = c->segs;
  if (c->segs) c->segs->prev_seg = s;
  c->segs = s;
  ++c->n_segs;
}

static void seg_unlink(cache_t *c, cache_seg_t *s) {
  if (s->prev_seg)
    s->prev_seg->next_seg = s->next_seg;
  else
    c->segs = s->next_seg;
  if (s->next_seg) s->next_seg->prev_seg = s->prev_seg;
  --c->n_segs;
}

static inline bool cache_is_split(const cache_block_t *b) {
  return b->prev || b->next;
}

/* try_merge_blocks: merge `src` into `dst` (dst is in no tree); returns the
 * bytes subsumed, 0 when refused. */
static size_t cache_try_merge(cache_t *c, cache_block_t *dst, cache_block_t *src) {
  if (src == NULL || src->allocated || src->event_count > 0 || src->n_uses > 0 ||
      dst->mapped != src->mapped)
    return 0;
  if (dst->prev == src) { /* [src dst] */
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    if (dst->seg->head == src) dst->seg->head = dst;
  } else { /* [dst src] */
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  size_t subsumed = src->size;
  dst->size += subsumed;
  if (src->mapped)
    pool_erase(src->pool, src);
  else
    unmapped_erase(src->pool, src);
  cache_recycle(src);
  return subsumed;
}

/* free_block: return a block with no pending uses to its pool, merging it. */
static void cache_free_block(cache_t *c, cache_block_t *b, cache_journal_t *j) {
  size_t orig = b->size, requested = b->requested;
  cache_pool_t *p = b->pool;
  int64_t net_n = 0, net_bytes = 0;
  cache_block_t *cand[2] = {b->prev, b->next};
  for (int i = 0; i < 2; ++i) {
    size_t sub = cache_try_merge(c, b, cand[i]);
    if (sub > 0) {
      net_n -= 1;
      net_bytes -= (int64_t)sub;
    }
  }
  pool_insert(c, p, b);
  if (cache_is_split(b)) {
    net_n += 1;
    net_bytes += (int64_t)b->size;
  }
  int t = cache_stat_type(p);
  if (!b->seg->expandable) {
    if (net_n != 0) cache_add(j, c->st.inactive_split, t, net_n);
    if (net_bytes != 0) cache_add(j, c->st.inactive_split_bytes, t, net_bytes);
  }
  cache_add(j, c->st.active, t, -1);
  cache_add(j, c->st.active_bytes, t, -(int64_t)orig);
  cache_add(j, c->st.requested_bytes, t, -(int64_t)requested);
}

/* release_block: cudaFree a whole free non-expandable segment. */
static int cache_release_block(cache_t *c, cache_block_t *b) {
  cache_seg_t *s = b->seg;
  int err = gmr__backend_release(c->base.backend, (void *)s->base, s->size);
  if (err != 0) return err;
  ++c->st.num_device_free;
  c->total_allocated -= b->size;
  int t = cache_stat_type(b->pool);
  cache_dec(c->st.segment, t, 1);
  cache_dec(c->st.reserved_bytes, t, (int64_t)b->size);
  if (b->size >= c->conf.max_split_size) gmr__stat_decrease(&c->st.oversize_segments, 1);
  pool_erase(b->pool, b);
  seg_unlink(c, s);
  gmr__free(s);
  cache_recycle(b);
  return 0;
}

/* ---- expandable segments ------------------------------------------------------------- */

/* Unmap pages [first, last) of s. */
static void seg_unmap_pages(cache_t *c, cache_seg_t *s, size_t first, size_t last) {
  for (size_t i = first; i < last; ++i)
    gmr__backend_unmap(c->base.backend, (void *)(s->base + i * s->page), s->page);
}

/* map_block: back the first `size` bytes of the unmapped block b with pages.
 * 0 with *mapped false when the device is out of memory. */
static int cache_map_block(cache_t *c, cache_block_t *b, size_t size, bool *mapped) {
  cache_seg_t *s = b->seg;
  cache_pool_t *p = b->pool;
  *mapped = false;
  int err = cache_records_reserve(p->stream, 1);
  if (err != 0) return err;
  size_t first = (b->ptr - s->base) / s->page;
  size_t last = (b->ptr - s->base + size + s->page - 1) / s->page;
  for (size_t i = first; i < last; ++i) {
    err = gmr__backend_map(c->base.backend, (void *)(s->base + i * s->page), s->page);
    if (err != 0) {
      seg_unmap_pages(c, s, first, i);
      return err == GMR_ENOMEM ? 0 : err;
    }
  }
  size_t bytes = (last - first) * s->page;
  unmapped_erase(p, b);
  b->mapped = true;
  if (bytes < b->size) {
    cache_block_t *rest = cache_record(p, s, b->ptr + bytes, b->size - bytes);
    rest->mapped = false;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    unmapped_insert(c, p, rest);
    b->size = bytes;
  }
  cache_try_merge(c, b, b->prev);
  cache_try_merge(c, b, b->next);
  pool_insert(c, p, b);
  c->total_allocated += bytes;
  cache_inc(c->st.reserved_bytes, cache_stat_type(p), (int64_t)bytes);
  ++c->st.num_device_alloc;
  *mapped = true;
  return 0;
}

/* unmap_block: give back the pages wholly inside the free block b. */
static int cache_unmap_block(cache_t *c, cache_block_t *b) {
  cache_seg_t *s = b->seg;
  cache_pool_t *p = b->pool;
  size_t off = b->ptr - s->base;
  size_t first = (off + s->page - 1) / s->page, last = (off + b->size) / s->page;
  if (first >= last) return 0;
  int err = cache_records_reserve(p->stream, 2);
  if (err != 0) return err;
  err = gmr__backend_stream_sync(c->base.backend, p->stream->id);
  if (err != 0) return err;
  seg_unmap_pages(c, s, first, last);
  uintptr_t uptr = s->base + first * s->page;
  size_t bytes = (last - first) * s->page;
  pool_erase(p, b);
  size_t before = uptr - b->ptr;
  if (before > 0) {
    cache_block_t *bf = cache_record(p, s, b->ptr, before);
    bf->prev = b->prev;
    bf->next = b;
    if (b->prev) b->prev->next = bf;
    b->prev = bf;
    if (s->head == b) s->head = bf;
    pool_insert(c, p, bf);
  }
  size_t after = b->size - before - bytes;
  if (after > 0) {
    cache_block_t *af = cache_record(p, s, uptr + bytes, after);
    af->prev = b;
    af->next = b->next;
    if (b->next) b->next->prev = af;
    b->next = af;
    pool_insert(c, p, af);
  }
  b->ptr = uptr;
  b->size = bytes;
  b->mapped = false;
  cache_try_merge(c, b, b->prev);
  cache_try_merge(c, b, b->next);
  unmapped_insert(c, p, b);
  c->total_allocated -= bytes;
  cache_dec(c->st.reserved_bytes, cache_stat_type(p), (int64_t)bytes);
  ++c->st.num_device_free;
  return 0;
}

static int cache_release_expandable(cache_t *c, cache_block_t *b) {
  cache_seg_t *s = b->seg;
  int err = gmr__backend_va_release(c->base.backend, (void *)s->base, s->size);
  if (err != 0) return err;
  unmapped_erase(b->pool, b);
  seg_unlink(c, s);
  gmr__free(s);
  cache_recycle(b);
  return 0;
}

static inline bool cache_allocatable(const cache_block_t *b) {
  return b && !b->allocated && b->event_count == 0 && b->n_uses == 0;
}

/* find_expandable_block: the lowest-address run of free and unmapped blocks of
 * this pool holding `size` bytes, or a new virtual range. */
static int cache_find_expandable(cache_t *c, cache_pool_t *p, size_t size, cache_block_t **out) {
  for (cache_block_t *u = treap_lower_bound(p->unmapped, 0, 0, true); u != NULL;
       u = treap_lower_bound(p->unmapped, 0, u->ptr + 1, true)) {
    cache_block_t *cand = cache_allocatable(u->prev) ? u->prev : u;
    size_t bytes = 0;
    for (cache_block_t *b = cand; bytes < size && cache_allocatable(b); b = b->next)
      bytes += b->size;
    if (bytes >= size) {
      *out = cand;
      return 0;
    }
  }
  size_t page = p->is_small ? CACHE_SMALL_BUFFER : c->conf.large_segment;
  size_t want = c->device_total + c->device_total / 8;
  size_t va = (want + page - 1) / page * page;
  int err = cache_records_reserve(p->stream, 1);
  if (err != 0) return err;
  cache_seg_t *s = gmr__calloc(1, sizeof *s);
  if (s == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a segment");
  void *base;
  err = gmr__backend_va_reserve(c->base.backend, va, &base);
  if (err != 0) {
    gmr__free(s);
    *out = NULL;
    return err == GMR_ENOMEM ? 0 : err;
  }
  *s = (cache_seg_t){
      .base = (uintptr_t)base, .size = va, .pool = p, .expandable = true, .page = page};
  cache_block_t *b = cache_record(p, s, s->base, va);
  b->mapped = false;
  s->head = b;
  seg_link(c, s);
  unmapped_insert(c, p, b);
  *out = b;
  return 0;
}

/* try_allocate_expandable_block */
static int cache_try_expandable(cache_t *c, cache_pool_t *p, size_t size, cache_block_t **out) {
  cache_block_t *cand = NULL;
  int err = cache_find_expandable(c, p, size, &cand);
  if (err != 0 || cand == NULL) return err;
  bool ok = true;
  if (!cand->mapped) {
    err = cache_map_block(c, cand, cand->size < size ? cand->size : size, &ok);
    if (err != 0 || !ok) return err;
  }
  while (cand->size < size) {
    size_t remaining = size - cand->size;
    cache_block_t *nc = cand->next;
    err = cache_map_block(c, nc, remaining < nc->size ? remaining : nc->size, &ok);
    if (err != 0 || !ok) return err;
    cand = nc;
  }
  pool_erase(p, cand);
  *out = cand;
  return 0;
}

/* ---- events ------------------------------------------------------------------------- */

static void cache_event_done(cache_t *c, cache_stream_t *cs) {
  cache_event_t *e = cs->ev_head;
  cs->ev_head = e->next;
  if (cs->ev_head == NULL) cs->ev_tail = NULL;
  gmr__backend_event_destroy(c->base.backend, e->ev);
  atomic_fetch_sub_explicit(&c->n_pending, 1, memory_order_relaxed);
  cache_block_t *b = e->block;
  e->next = c->spare_ev;
  c->spare_ev = e;
  if (--b->event_count == 0) cache_free_block(c, b, NULL);
}

/* process_events: return blocks whose every event has completed. */
static int cache_process_events(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    while (cs->ev_head != NULL) {
      int q = gmr__backend_event_query(c->base.backend, cs->ev_head->ev);
      if (q == 1) break;
      if (q < 0) return q;
      cache_event_done(c, cs);
    }
  }
  return 0;
}

/* synchronize_and_free_events */
static int cache_sync_events(cache_t *c) {
  ++c->st.num_sync_all_streams;
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    while (cs->ev_head != NULL) {
      int err = gmr__backend_event_sync(c->base.backend, cs->ev_head->ev);
      if (err != 0) return err;
      cache_event_done(c, cs);
    }
  }
  return 0;
}

/* insert_events: one event per recorded stream; the block stays active until
 * all complete.  When an event cannot be recorded, that stream is waited for
 * instead, so the block is never reused early. */
static void cache_insert_events(cache_t *c, cache_block_t *b) {
  for (uint32_t i = 0; i < b->n_uses; ++i) {
    gmr_stream_t s = b->uses[i];
    cache_stream_t *cs = cache_stream(c, s);
    cache_event_t *e = c->spare_ev;
    if (e == NULL)
      e = gmr__malloc(sizeof *e);
    else
      c->spare_ev = e->next;
    gmr_event_t ev;
    if (cs == NULL || e == NULL || gmr__backend_event_record(c->base.backend, s, &ev) != 0) {
      if (e != NULL) {
        e->next = c->spare_ev;
        c->spare_ev = e;
      }
      gmr__backend_stream_sync(c->base.backend, s);
      continue;
    }
    *e = (cache_event_t){ev, b, NULL};
    if (cs->ev_tail)
      cs->ev_tail->next = e;
    else
      cs->ev_head = e;
    cs->ev_tail = e;
    ++b->event_count;
    atomic_fetch_add_explicit(&c->n_pending, 1, memory_order_relaxed);
  }
  b->n_uses = 0;
  if (b->event_count == 0) cache_free_block(c, b, NULL);
}

/* ---- releasing cached memory ---------------------------------------------------------- */

/* release_blocks: every whole free segment of a pool; free pages of expandable ones. */
static int cache_release_pool(cache_t *c, cache_pool_t *p) {
  if (p->n_blocks == 0) return 0;
  cache_block_t **v = gmr__malloc(p->n_blocks * sizeof *v);
  if (v == NULL)
    return gmr__error_set(GMR_ENOMEM, "caching: out of host memory to empty the cache");
  size_t n = treap_collect(p->blocks, v, 0);
  int err = 0;
  for (size_t i = 0; i < n && err == 0; ++i) {
    if (v[i]->seg->expandable || cache_is_split(v[i])) continue;
    err = cache_release_block(c, v[i]);
    v[i] = NULL; /* recycled */
  }
  for (size_t i = 0; i < n && err == 0; ++i) {
    cache_block_t *b = v[i];
    if (b == NULL || !b->seg->expandable) continue;
    err = cache_unmap_block(c, b);
    if (err == 0 && !cache_is_split(b) && !b->mapped) err = cache_release_expandable(c, b);
  }
  gmr__free(v);
  return err;
}

/* release_cached_blocks: wait for every event, then release. */
static int cache_release_cached(cache_t *c) {
  int err = cache_sync_events(c);
  for (int small = 0; small < 2 && err == 0; ++small)
    for (size_t i = 0; i < c->n_streams && err == 0; ++i)
      err = cache_release_pool(c, &c->streams[i]->pools[small]);
  return err;
}

/* release_available_cached_blocks (only with max_split_size set): free one
 * oversize block big enough, or the largest oversize blocks until enough. */
static int cache_release_available(cache_t *c, cache_pool_t *p, size_t size, bool *released) {
  *released = false;
  size_t mss = c->conf.max_split_size;
  if (mss == CACHE_UNLIMITED) return 0;
  size_t key = size < mss ? mss : size;
  cache_block_t *b = treap_lower_bound(p->blocks, key, 0, false);
  if (b != NULL && !b->seg->expandable) {
    int err = cache_release_block(c, b);
    if (err == 0) *released = true;
    return err;
  }
  if (p->n_blocks == 0) return 0;
  cache_block_t **v = gmr__malloc(p->n_blocks * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  size_t n = treap_collect(p->blocks, v, 0), total = 0;
  int err = 0;
  for (size_t i = n; i-- > 0 && total < key && err == 0;) {
    if (v[i]->size < mss) break;
    if (v[i]->seg->expandable || cache_is_split(v[i])) continue;
    total += v[i]->size;
    err = cache_release_block(c, v[i]);
  }
  gmr__free(v);
  *released = err == 0 && total >= key;
  return err;
}

/* garbage_collect_cached_blocks (only with a fraction and a threshold). */
static int cache_garbage_collect(cache_t *c) {
  size_t threshold = (size_t)(c->conf.gc_threshold * (double)c->allowed_max);
  if (c->total_allocated <= threshold) return 0;
  size_t target = c->total_allocated - threshold, reclaimed = 0, total_age = 0, count = 0, n = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    n += c->streams[i]->pools[0].n_blocks;
  if (n == 0) return 0;
  cache_block_t **v = gmr__malloc(n * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  n = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    n = treap_collect(c->streams[i]->pools[0].blocks, v, n);
  int64_t clock = c->gc_clock[0];
  for (size_t i = 0; i < n; ++i) {
    if (cache_is_split(v[i]) || v[i]->seg->expandable) continue;
    total_age += (size_t)(clock - v[i]->gc_count_base);
    ++count;
  }
  bool freed = true;
  int err = 0;
  while (reclaimed < target && freed && count > 0 && err == 0) {
    double age_threshold = (double)total_age / (double)count;
    freed = false;
    for (size_t i = 0; i < n && err == 0; ++i) {
      cache_block_t *b = v[i];
      if (b == NULL || cache_is_split(b) || b->seg->expandable) continue;
      size_t age = (size_t)(clock - b->gc_count_base);
      if ((double)age < age_threshold) continue;
      freed = true;
      reclaimed += b->size;
      total_age -= age;
      --count;
      v[i] = NULL;
      err = cache_release_block(c, b);
    }
  }
  gmr__free(v);
  return err;
}

/* ---- allocation ------------------------------------------------------------------------- */

/* get_free_block: the smallest fitting cached block, or NULL. */
static cache_block_t *cache_get_free_block(cache_t *c, cache_pool_t *p, size_t size) {
  if (c->fraction_set && c->conf.gc_threshold > 0) ++c->gc_clock[p->is_small];
  cache_block_t *b = treap_lower_bound(p->blocks, size, 0, false);
  if (b == NULL) return NULL;
  if (b->seg->expandable) {
    /* Best fit by the size a block can grow to (its unmapped successor). */
    for (;;) {
      cache_block_t *nx = treap_lower_bound(p->blocks, b->size, b->ptr + 1, false);
      if (nx == NULL) break;
      size_t es_b = b->size + (b->next && !b->next->mapped ? b->next->size : 0);
      size_t es_n = nx->size + (nx->next && !nx->next->mapped ? nx->next->size : 0);
      if (!(es_n < es_b)) break;
      b = nx;
    }
  }
  size_t mss = c->conf.max_split_size;
  if (size < mss && b->size >= mss) return NULL;
  if (size >= mss && b->size >= size + c->conf.max_non_split_rounding) return NULL;
  pool_erase(p, b);
  return b;
}

/* alloc_block: a new segment (or mapped pages).  0 with *out NULL when the
 * device, or the memory fraction, refuses. */
static int cache_alloc_block(cache_t *c, cache_pool_t *p, size_t size, size_t alloc_size,
                             bool retry, cache_block_t **out) {
  *out = NULL;
  if (retry) ++c->st.num_alloc_retries;
  if (c->fraction_set && c->total_allocated + alloc_size > c->allowed_max) return 0;
  if (c->conf.expandable) return cache_try_expandable(c, p, size, out);
  cache_seg_t *s = gmr__calloc(1, sizeof *s);
  if (s == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a segment");
  void *ptr;
  int err = gmr__backend_reserve(c->base.backend, alloc_size, &ptr);
  if (err != 0) {
    gmr__free(s);
    return err == GMR_ENOMEM ? 0 : err;
  }
  *s = (cache_seg_t){.base = (uintptr_t)ptr, .size = alloc_size, .pool = p};
  cache_block_t *b = cache_record(p, s, s->base, alloc_size);
  s->head = b;
  seg_link(c, s);
  c->total_allocated += alloc_size;
  int t = cache_stat_type(p);
  cache_inc(c->st.segment, t, 1);
  cache_inc(c->st.reserved_bytes, t, (int64_t)alloc_size);
  if (alloc_size >= c->conf.max_split_size) gmr__stat_increase(&c->st.oversize_segments, 1);
  ++c->st.num_device_alloc;
  *out = b;
  return 0;
}

static bool cache_should_split(const cache_t *c, const cache_block_t *b, size_t size) {
  size_t remaining = b->size - size;
  if (b->pool->is_small || c->conf.expandable) return remaining >= CACHE_MIN_BLOCK;
  return size < c->conf.max_split_size && remaining > CACHE_SMALL_SIZE;
}

/* alloc_found_block */
static cache_block_t *cache_alloc_found(cache_t *c, cache_block_t *b, size_t size, size_t orig,
                                        bool split, cache_journal_t *j) {
  cache_pool_t *p = b->pool;
  int t = cache_stat_type(p);
  bool already_split = cache_is_split(b), expandable = b->seg->expandable;
  if (split) {
    cache_block_t *rest = b;
    b = cache_record(p, rest->seg, rest->ptr, size);
    b->prev = rest->prev;
    if (b->prev) b->prev->next = b;
    b->next = rest;
    rest->prev = b;
    if (rest->seg->head == rest) rest->seg->head = b;
    rest->ptr += size;
    rest->size -= size;
    pool_insert(c, p, rest);
    if (already_split && !expandable) {
      cache_add(j, c->st.inactive_split_bytes, t, -(int64_t)size);
    } else if (!expandable) {
      cache_add(j, c->st.inactive_split_bytes, t, (int64_t)rest->size);
      cache_add(j, c->st.inactive_split, t, 1);
    }
  } else if (already_split && !expandable) {
    cache_add(j, c->st.inactive_split_bytes, t, -(int64_t)b->size);
    cache_add(j, c->st.inactive_split, t, -1);
  }
  b->allocated = true;
  b->requested = orig;
  cache_add(j, c->st.allocation, t, 1);
  cache_add(j, c->st.allocated_bytes, t, (int64_t)b->size);
  cache_add(j, c->st.active, t, 1);
  cache_add(j, c->st.active_bytes, t, (int64_t)b->size);
  cache_add(j, c->st.requested_bytes, t, (int64_t)orig);
  if (b->size >= c->conf.max_split_size) cache_add(j, &c->st.oversize_allocations, -1, 1);
  return b;
}

/* The OOM error, in PyTorch's words (CUDACachingAllocator.cpp, malloc). */
static int cache_oom(cache_t *c, size_t alloc_size) {
  size_t dev_free = 0, dev_total = 0;
  gmr__backend_mem_info(c->base.backend, &dev_free, &dev_total);
  ++c->st.num_ooms;
  char want[40], total[40], fr[40], cap[40], allowed[64] = "", alloc[40], unalloc[40];
  cache_format_size(alloc_size, want, sizeof want);
  cache_format_size(dev_total, total, sizeof total);
  cache_format_size(dev_free, fr, sizeof fr);
  if (c->fraction_set) {
    cache_format_size(c->allowed_max, cap, sizeof cap);
    snprintf(allowed, sizeof allowed, "%s allowed; ", cap);
  }
  int64_t allocated = c->st.allocated_bytes[CS_ALL].current;
  int64_t reserved = c->st.reserved_bytes[CS_ALL].current;
  cache_format_size((uint64_t)allocated, alloc, sizeof alloc);
  cache_format_size((uint64_t)(reserved - allocated), unalloc, sizeof unalloc);
  return gmr__error_set(
      GMR_ENOMEM,
      "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s "
      "is free. %sOf the allocated memory %s is allocated by PyTorch, and %s is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
      "documentation for Memory Management  "
      "(https://docs.pytorch.org/docs/stable/notes/"
      "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
      want, c->base.backend->device, total, fr, allowed, alloc, unalloc);
}

/* The whole of PyTorch's malloc; global path (every lock held). */
static int cache_alloc_global(cache_t *c, size_t orig, gmr_stream_t s, gmr_block_t *out) {
  int err;
  if (GMR_UNLIKELY(atomic_load_explicit(&c->n_pending, memory_order_relaxed) > 0) &&
      (err = cache_process_events(c)) != 0)
    return err;
  cache_stream_t *cs = cache_stream(c, s);
  if (GMR_UNLIKELY(cs == NULL)) return GMR_ENOMEM;
  if ((err = cache_records_reserve(cs, 4)) != 0) return err;
  size_t size = cache_round_size(c, orig);
  cache_pool_t *p = &cs->pools[size <= CACHE_SMALL_SIZE];
  size_t alloc_size = cache_allocation_size(c, size);
  cache_block_t *b = cache_get_free_block(c, p, size);
  if (b == NULL) {
    if (c->fraction_set && c->conf.gc_threshold > 0 && (err = cache_garbage_collect(c)) != 0)
      return err;
    if ((err = cache_alloc_block(c, p, size, alloc_size, false, &b)) != 0) return err;
    if (b == NULL) {
      bool released;
      if ((err = cache_release_available(c, p, size, &released)) != 0) return err;
      if (released && (err = cache_alloc_block(c, p, size, alloc_size, false, &b)) != 0) return err;
    }
    if (b == NULL) {
      if ((err = cache_release_cached(c)) != 0) return err;
      if ((err = cache_alloc_block(c, p, size, alloc_size, true, &b)) != 0) return err;
    }
    if (b == NULL) return cache_oom(c, alloc_size);
  }
  b = cache_alloc_found(c, b, size, orig, cache_should_split(c, b, size), NULL);
  *out = (gmr_block_t){.ptr = (void *)b->ptr, .size = b->size, .handle = b};
  return 0;
}

/* The fast path serves a cached block of the stream under its lock alone;
 * anything else (no fitting block, events pending, a new stream, GC on)
 * takes the global path, which runs the search again: a failed search
 * changes nothing, so the answers are PyTorch's either way. */
static int cache_alloc(gmr_policy_t *self, size_t orig, gmr_stream_t s, gmr_block_t *out) {
  cache_t *c = (cache_t *)self;
  cache_stream_t *cs;
  if (GMR_LIKELY(!c->global_only &&
                 atomic_load_explicit(&c->n_pending, memory_order_acquire) == 0 &&
                 (cs = cache_stream_find(c, s)) != NULL)) {
    cache_spin_lock(&cs->lock);
    if (GMR_LIKELY(cs->n_spare >= 1 || cache_records_reserve(cs, 4) == 0)) {
      size_t size = cache_round_size(c, orig);
      cache_pool_t *p = &cs->pools[size <= CACHE_SMALL_SIZE];
      cache_block_t *b = cache_get_free_block(c, p, size);
      if (GMR_LIKELY(b != NULL)) {
        cache_journal_t jbuf, *j = cache_begin(c, &jbuf);
        b = cache_alloc_found(c, b, size, orig, cache_should_split(c, b, size), j);
        cache_commit(c, cs, j);
        cache_spin_unlock(&cs->lock);
        *out = (gmr_block_t){.ptr = (void *)b->ptr, .size = b->size, .handle = b};
        gmr_assert_expensive(self->ops->check(self) != GMR_EINVAL); /* ENOMEM: host */
        return 0;
      }
    }
    cache_spin_unlock(&cs->lock);
  }
  cache_lock_all(c);
  int err = cache_alloc_global(c, orig, s, out);
  cache_unlock_all(c);
  gmr_assert_expensive(err != 0 || self->ops->check(self) != GMR_EINVAL);
  return err;
}

/* free(); j NULL on the global path. */
static void cache_free_locked(cache_t *c, cache_block_t *b, cache_journal_t *j) {
  int t = cache_stat_type(b->pool);
  b->allocated = false;
  cache_add(j, c->st.allocation, t, -1);
  cache_add(j, c->st.allocated_bytes, t, -(int64_t)b->size);
  if (b->size >= c->conf.max_split_size) cache_add(j, &c->st.oversize_allocations, -1, -1);
  if (b->n_uses > 0)
    cache_insert_events(c, b);
  else
    cache_free_block(c, b, j);
}

static int cache_free(gmr_policy_t *self, const gmr_block_t *blk) {
  cache_t *c = (cache_t *)self;
  cache_block_t *b = blk->handle;
  cache_stream_t *cs = b->pool->stream;
  cache_spin_lock(&cs->lock);
  if (GMR_LIKELY(b->n_uses == 0)) {
    cache_journal_t jbuf, *j = cache_begin(c, &jbuf);
    cache_free_locked(c, b, j);
    cache_commit(c, cs, j);
    cache_spin_unlock(&cs->lock);
  } else {
    /* Events: the global path (record_stream changed n_uses under it). */
    cache_spin_unlock(&cs->lock);
    cache_lock_all(c);
    cache_free_locked(c, b, NULL);
    cache_unlock_all(c);
  }
  gmr_assert_expensive(self->ops->check(self) != GMR_EINVAL); /* ENOMEM: host */
  return 0;
}

static int cache_record_stream_locked(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  (void)self;
  cache_block_t *b = blk->handle;
  if (s == b->pool->stream->id) return 0;
  for (uint32_t i = 0; i < b->n_uses; ++i)
    if (b->uses[i] == s) return 0;
  if (b->n_uses == b->cap_uses) {
    uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
    gmr_stream_t *u = gmr__realloc(b->uses, cap * sizeof *u);
    if (u == NULL)
      return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a stream use");
    b->uses = u;
    b->cap_uses = cap;
  }
  b->uses[b->n_uses++] = s;
  return 0;
}

static int cache_trim_locked(gmr_policy_t *self) {
  return cache_release_cached((cache_t *)self);
}

/* ---- statistics ------------------------------------------------------------------------ */

static uint64_t cache_largest_free(const cache_t *c) {
  uint64_t best = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    for (int k = 0; k < 2; ++k) {
      const cache_block_t *b = treap_last(c->streams[i]->pools[k].blocks);
      if (b && b->size > best) best = b->size;
    }
  return best;
}

static void cache_stats_locked(gmr_policy_t *self, gmr_stats_t *out) {
  cache_t *c = (cache_t *)self;
  const cache_stats_t *st = &c->st;
  out->reserved_bytes = (uint64_t)st->reserved_bytes[CS_ALL].current;
  out->peak_reserved_bytes = (uint64_t)st->reserved_bytes[CS_ALL].peak;
  out->allocated_bytes = (uint64_t)st->allocated_bytes[CS_ALL].current;
  out->peak_allocated_bytes = (uint64_t)st->allocated_bytes[CS_ALL].peak;
  out->requested_bytes = (uint64_t)st->requested_bytes[CS_ALL].current;
  out->peak_requested_bytes = (uint64_t)st->requested_bytes[CS_ALL].peak;
  out->active_bytes = (uint64_t)st->active_bytes[CS_ALL].current;
  out->peak_active_bytes = (uint64_t)st->active_bytes[CS_ALL].peak;
  out->segments = (uint64_t)st->segment[CS_ALL].current;
  out->peak_segments = (uint64_t)st->segment[CS_ALL].peak;
  out->allocations = (uint64_t)st->allocation[CS_ALL].current;
  out->peak_allocations = (uint64_t)st->allocation[CS_ALL].peak;
  out->num_allocs = (uint64_t)st->allocation[CS_ALL].allocated;
  out->num_frees = (uint64_t)st->allocation[CS_ALL].freed;
  out->device_allocs = (uint64_t)st->num_device_alloc;
  out->device_frees = (uint64_t)st->num_device_free;
  out->ooms = (uint64_t)st->num_ooms;
  out->alloc_retries = (uint64_t)st->num_alloc_retries;
  out->largest_free_block = cache_largest_free(c);
  out->limit_bytes = c->fraction_set ? c->allowed_max : 0;
}

#define CACHE_ARRAYS(X)                                                                            \
  X(allocation)                                                                                    \
  X(segment)                                                                                       \
  X(active)                                                                                        \
  X(inactive_split)                                                                                \
  X(allocated_bytes) X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)

static void cache_reset_peak_locked(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  for (int t = 0; t < 3; ++t) {
#define RESET(name) gmr__stat_reset_peak(&c->st.name[t]);
    CACHE_ARRAYS(RESET)
#undef RESET
  }
  gmr__stat_reset_peak(&c->st.oversize_allocations);
  gmr__stat_reset_peak(&c->st.oversize_segments);
}

static void cache_reset_accumulated_locked(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  for (int t = 0; t < 3; ++t) {
#define RESET(name) gmr__stat_reset_accumulated(&c->st.name[t]);
    CACHE_ARRAYS(RESET)
#undef RESET
  }
  gmr__stat_reset_accumulated(&c->st.oversize_allocations);
  gmr__stat_reset_accumulated(&c->st.oversize_segments);
  c->st.num_alloc_retries = c->st.num_ooms = c->st.num_sync_all_streams = 0;
  c->st.num_device_alloc = c->st.num_device_free = 0;
}

/* torch.cuda.memory_stats(): 122 keys, sorted as Python sorts them. */
typedef struct cache_kv_s {
  char key[48];
  int64_t value;
} cache_kv_t;

static int cache_kv_cmp(const void *a, const void *b) {
  return strcmp(((const cache_kv_t *)a)->key, ((const cache_kv_t *)b)->key);
}

static size_t cache_put_stat(cache_kv_t *kv, size_t n, const char *prefix, const gmr_stat_t *s) {
  static const char *const metric[] = {"current", "peak", "allocated", "freed"};
  const int64_t v[] = {s->current, s->peak, s->allocated, s->freed};
  for (int m = 0; m < 4; ++m) {
    snprintf(kv[n].key, sizeof kv[n].key, "%s.%s", prefix, metric[m]);
    kv[n++].value = v[m];
  }
  return n;
}

static size_t cache_all_stats(const cache_t *c, cache_kv_t *kv) {
  static const char *const pool[] = {"all", "small_pool", "large_pool"};
  size_t n = 0;
  char prefix[40];
  for (int t = 0; t < 3; ++t) {
#define PUT(name)                                                                                  \
  snprintf(prefix, sizeof prefix, "%s.%s", #name, pool[t]);                                        \
  n = cache_put_stat(kv, n, prefix, &c->st.name[t]);
    CACHE_ARRAYS(PUT)
#undef PUT
  }
  n = cache_put_stat(kv, n, "oversize_allocations", &c->st.oversize_allocations);
  n = cache_put_stat(kv, n, "oversize_segments", &c->st.oversize_segments);
  const struct {
    const char *k;
    int64_t v;
  } scalars[] = {
      {"num_alloc_retries", c->st.num_alloc_retries},
      {"num_ooms", c->st.num_ooms},
      {"num_sync_all_streams", c->st.num_sync_all_streams},
      {"num_device_alloc", c->st.num_device_alloc},
      {"num_device_free", c->st.num_device_free},
      {"max_split_size", c->st.max_split_size},
  };
  for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; ++i) {
    snprintf(kv[n].key, sizeof kv[n].key, "%s", scalars[i].k);
    kv[n++].value = scalars[i].v;
  }
  qsort(kv, n, sizeof *kv, cache_kv_cmp);
  return n;
}

#define CACHE_N_KEYS 122

static int cache_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  cache_t *c = (cache_t *)self;
  cache_kv_t kv[CACHE_N_KEYS];
  cache_lock_all(c);
  size_t n = cache_all_stats(c, kv);
  cache_unlock_all(c);
  for (size_t i = 0; i < n; ++i)
    if (cb(kv[i].key, kv[i].value, ud) != 0) break;
  return 0;
}

/* ---- memory_summary() ----------------------------------------------------------------- */

static void cache_fmt_size(char *buf, size_t len, int64_t sz, double pref) {
  static const char *const prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int k = 0;
  for (int i = 1; i < 6; ++i) {
    if (pref < 768.0 * 1024.0) break;
    k = i;
    sz /= 1024;
    pref /= 1024.0;
  }
  snprintf(buf, len, "%6lld %s", (long long)sz, prefixes[k]);
}

static void cache_fmt_count(char *buf, size_t len, int64_t cnt, double pref) {
  static const char *const prefixes[] = {" ", "K", "M"};
  int k = 0;
  for (int i = 1; i < 3; ++i) {
    if (pref < 750.0 * 1000.0) break;
    k = i;
    cnt /= 1000;
    pref /= 1000.0;
  }
  snprintf(buf, len, "%7lld %s ", (long long)cnt, prefixes[k]);
}

typedef void (*cache_fmt_fn)(char *, size_t, int64_t, double);

static void cache_summary_row(FILE *out, const char *name, const gmr_stat_t *s,
                              const gmr_stat_t *pref, cache_fmt_fn fmt) {
  char f[4][32];
  fmt(f[0], sizeof f[0], s->current, (double)pref->current);
  fmt(f[1], sizeof f[1], s->peak, (double)pref->peak);
  fmt(f[2], sizeof f[2], s->allocated, (double)pref->allocated);
  fmt(f[3], sizeof f[3], s->freed, (double)pref->freed);
  fprintf(out, "| %-21s | %s | %s | %s | %s |\n", name, f[0], f[1], f[2], f[3]);
}

static int cache_summary(gmr_policy_t *self, FILE *out) {
  cache_t *c = (cache_t *)self;
  cache_stats_t snap;
  cache_lock_all(c);
  snap = c->st;
  cache_unlock_all(c);
  const cache_stats_t *st = &snap;
  static const char eq[] = "|==========================================================="
                           "================|\n";
  static const char dash[] = "|-----------------------------------------------------------"
                             "----------------|\n";
  fputs(eq, out);
  fprintf(out, "| %16s PyTorch CUDA memory summary, device ID %-17d |\n", "",
          c->base.backend->device);
  fputs(dash, out);
  fprintf(out, "|  %9s CUDA OOMs: %-12lld | %6s cudaMalloc retries: %-8lld  |\n", "",
          (long long)st->num_ooms, "", (long long)st->num_alloc_retries);
  fputs(eq, out);
  fputs("|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n", out);
  const struct {
    const gmr_stat_t *a;
    const char *name;
    cache_fmt_fn fmt;
  } metrics[] = {
      {st->allocated_bytes, "Allocated memory", cache_fmt_size},
      {st->active_bytes, "Active memory", cache_fmt_size},
      {st->requested_bytes, "Requested memory", cache_fmt_size},
      {st->reserved_bytes, "GPU reserved memory", cache_fmt_size},
      {st->inactive_split_bytes, "Non-releasable memory", cache_fmt_size},
      {st->allocation, "Allocations", cache_fmt_count},
      {st->active, "Active allocs", cache_fmt_count},
      {st->segment, "GPU reserved segments", cache_fmt_count},
      {st->inactive_split, "Non-releasable allocs", cache_fmt_count},
  };
  for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; ++i) {
    fputs(dash, out);
    cache_summary_row(out, metrics[i].name, &metrics[i].a[CS_ALL], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
    cache_summary_row(out, "      from large pool", &metrics[i].a[CS_LARGE], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
    cache_summary_row(out, "      from small pool", &metrics[i].a[CS_SMALL], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
  }
  fputs(dash, out);
  cache_summary_row(out, "Oversize allocations", &st->oversize_allocations,
                    &st->oversize_allocations, cache_fmt_count);
  fputs(dash, out);
  cache_summary_row(out, "Oversize GPU segments", &st->oversize_segments, &st->oversize_segments,
                    cache_fmt_count);
  fputs(eq, out);
  return ferror(out) ? GMR_EIO : 0;
}

/* ---- walk and check ----------------------------------------------------------------------- */

static int cache_seg_cmp(const void *a, const void *b) {
  uintptr_t x = (*(cache_seg_t *const *)a)->base, y = (*(cache_seg_t *const *)b)->base;
  return x < y ? -1 : x > y;
}

/* The segments sorted by address (caller frees). */
static cache_seg_t **cache_sorted_segs(cache_t *c) {
  cache_seg_t **v = gmr__malloc((c->n_segs ? c->n_segs : 1) * sizeof *v);
  if (v == NULL) return NULL;
  size_t n = 0;
  for (cache_seg_t *s = c->segs; s; s = s->next_seg)
    v[n++] = s;
  qsort(v, n, sizeof *v, cache_seg_cmp);
  return v;
}

static gmr_block_state_t cache_state(const cache_block_t *b) {
  if (b->allocated) return GMR_BLOCK_ALLOCATED;
  if (b->event_count > 0 || b->n_uses > 0) return GMR_BLOCK_PENDING_FREE;
  return b->mapped ? GMR_BLOCK_FREE : GMR_BLOCK_UNMAPPED;
}

/* Segments in address order, each followed by its blocks.  An expandable
 * segment is shown as one segment per contiguous mapped range, as PyTorch's
 * snapshot shows it. */
static int cache_walk_locked(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  cache_t *c = (cache_t *)self;
  cache_seg_t **v = cache_sorted_segs(c);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  int stop = 0;
  for (size_t i = 0; i < c->n_segs && !stop; ++i) {
    cache_seg_t *s = v[i];
    for (cache_block_t *b = s->head; b && !stop;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      size_t run = 0;
      for (cache_block_t *x = b; x && x->mapped; x = x->next)
        run += x->size;
      gmr_walk_entry_t e = {.is_segment = 1,
                            .address = b->ptr,
                            .size = run,
                            .stream = s->pool->stream->id,
                            .pool = s->pool->is_small ? "small" : "large",
                            .is_expandable = s->expandable};
      stop = cb(&e, ud);
      for (; b && b->mapped && !stop; b = b->next) {
        gmr_walk_entry_t be = {.is_segment = 0,
                               .address = b->ptr,
                               .size = b->size,
                               .requested = b->allocated ? b->requested : 0,
                               .state = cache_state(b),
                               .stream = s->pool->stream->id,
                               .pool = e.pool,
                               .is_expandable = s->expandable};
        stop = cb(&be, ud);
      }
    }
  }
  gmr__free(v);
  return 0;
}

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      gmr__free(segs);                                                                             \
      return gmr__error_set(GMR_EINVAL, "caching: " __VA_ARGS__);                                  \
    }                                                                                              \
  } while (0)

static size_t treap_check(cache_block_t *t, bool by_addr, const cache_block_t *lo,
                          const cache_block_t *hi, bool *ok) {
  if (t == NULL) return 0;
  if ((lo && !cache_less(lo, t->size, t->ptr, by_addr)) ||
      (hi && !cache_less(t, hi->size, hi->ptr, by_addr)) || !t->in_tree ||
      (t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio))
    *ok = false;
  return 1 + treap_check(t->left, by_addr, lo, t, ok) + treap_check(t->right, by_addr, t, hi, ok);
}

static int cache_check_locked(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  cache_seg_t **segs = cache_sorted_segs(c);
  if (segs == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  int64_t reserved[3] = {0}, allocated[3] = {0}, active[3] = {0}, requested[3] = {0};
  int64_t segments[3] = {0}, isplit[3] = {0}, isplit_bytes[3] = {0}, allocs[3] = {0};
  size_t free_mapped = 0, unmapped = 0, pending_events = 0;
  for (size_t i = 0; i < c->n_segs; ++i) {
    cache_seg_t *s = segs[i];
    int t = cache_stat_type(s->pool);
    CHECK(i == 0 || segs[i - 1]->base + segs[i - 1]->size <= s->base,
          "segments at %p and %p overlap", (void *)segs[i - 1]->base, (void *)s->base);
    CHECK(s->head && s->head->prev == NULL && s->head->ptr == s->base,
          "segment %p does not start with its head block", (void *)s->base);
    size_t sum = 0;
    if (!s->expandable) segments[t]++, reserved[t] += (int64_t)s->size;
    for (cache_block_t *b = s->head; b; b = b->next) {
      CHECK(b->seg == s && b->pool == s->pool, "block %p is in the wrong segment", (void *)b->ptr);
      CHECK(b->ptr == s->base + sum, "block %p is not contiguous in its segment", (void *)b->ptr);
      CHECK(b->next == NULL || b->next->prev == b, "block %p has a broken next link",
            (void *)b->ptr);
      CHECK(b->size > 0 && (s->expandable || b->size % CACHE_MIN_BLOCK == 0),
            "block %p has size %zu", (void *)b->ptr, b->size);
      sum += b->size;
      bool is_free = cache_allocatable(b);
      CHECK(!(is_free && b->mapped) || b->in_tree, "free block %p is not in its pool",
            (void *)b->ptr);
      CHECK(is_free || !b->in_tree, "busy block %p is in a free tree", (void *)b->ptr);
      if (b->next)
        CHECK(!(is_free && cache_allocatable(b->next) && b->mapped == b->next->mapped),
              "adjacent free blocks at %p and %p were not merged", (void *)b->ptr,
              (void *)b->next->ptr);
      if (s->expandable && b->mapped) reserved[t] += (int64_t)b->size;
      if (b->allocated) allocated[t] += (int64_t)b->size, allocs[t]++;
      if (b->allocated || b->event_count > 0) {
        active[t] += (int64_t)b->size;
        requested[t] += (int64_t)b->requested;
      }
      pending_events += (size_t)b->event_count;
      if (is_free && b->mapped) ++free_mapped;
      if (!b->mapped) ++unmapped;
      if (is_free && !s->expandable && cache_is_split(b))
        isplit[t]++, isplit_bytes[t] += (int64_t)b->size;
    }
    CHECK(sum == s->size, "segment %p holds %zu bytes of blocks but is %zu bytes", (void *)s->base,
          sum, s->size);
  }
  size_t in_trees = 0, in_unmapped = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    for (int k = 0; k < 2; ++k) {
      cache_pool_t *p = &c->streams[i]->pools[k];
      bool ok = true;
      size_t n = treap_check(p->blocks, false, NULL, NULL, &ok);
      CHECK(ok && n == p->n_blocks, "the free tree of a pool is out of order or miscounted");
      in_trees += n;
      in_unmapped += treap_check(p->unmapped, true, NULL, NULL, &ok);
      CHECK(ok, "the unmapped tree of a pool is out of order");
    }
  CHECK(in_trees == free_mapped, "%zu blocks in free trees, %zu free mapped blocks", in_trees,
        free_mapped);
  CHECK(in_unmapped == unmapped, "%zu blocks in unmapped trees, %zu unmapped", in_unmapped,
        unmapped);
  CHECK(pending_events == c->n_pending, "%zu events on blocks, %zu pending", pending_events,
        c->n_pending);
  for (int t = 1; t < 3; ++t) {
    const cache_stats_t *st = &c->st;
    const char *pn = t == CS_SMALL ? "small" : "large";
    CHECK(st->reserved_bytes[t].current == reserved[t], "%s reserved %lld, segments hold %lld", pn,
          (long long)st->reserved_bytes[t].current, (long long)reserved[t]);
    CHECK(st->segment[t].current == segments[t], "%s segments %lld, counted %lld", pn,
          (long long)st->segment[t].current, (long long)segments[t]);
    CHECK(st->allocated_bytes[t].current == allocated[t], "%s allocated %lld, blocks %lld", pn,
          (long long)st->allocated_bytes[t].current, (long long)allocated[t]);
    CHECK(st->allocation[t].current == allocs[t], "%s allocations %lld, blocks %lld", pn,
          (long long)st->allocation[t].current, (long long)allocs[t]);
    CHECK(st->active_bytes[t].current == active[t], "%s active %lld, blocks %lld", pn,
          (long long)st->active_bytes[t].current, (long long)active[t]);
    CHECK(st->requested_bytes[t].current == requested[t], "%s requested %lld, blocks %lld", pn,
          (long long)st->requested_bytes[t].current, (long long)requested[t]);
    CHECK(st->inactive_split[t].current == isplit[t] &&
              st->inactive_split_bytes[t].current == isplit_bytes[t],
          "%s inactive_split %lld/%lld bytes, blocks %lld/%lld", pn,
          (long long)st->inactive_split[t].current, (long long)st->inactive_split_bytes[t].current,
          (long long)isplit[t], (long long)isplit_bytes[t]);
    CHECK(reserved[t] >= active[t] && active[t] >= allocated[t],
          "%s pool breaks reserved >= active >= allocated", pn);
  }
  CHECK((int64_t)c->total_allocated == reserved[1] + reserved[2],
        "total_allocated_memory %zu, reserved %lld", c->total_allocated,
        (long long)(reserved[1] + reserved[2]));
  gmr__free(segs);
  return 0;
}
#undef CHECK

/* ---- options: YAML keys and PYTORCH_CUDA_ALLOC_CONF ------------------------------------------ */

static int cache_parse_bool_text(const char *t, int *out) {
  static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On", "1", NULL};
  static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "Off", "0", NULL};
  for (int i = 0; yes[i]; ++i)
    if (strcmp(t, yes[i]) == 0) return (*out = 1), 0;
  for (int i = 0; no[i]; ++i)
    if (strcmp(t, no[i]) == 0) return (*out = 0), 0;
  return GMR_EINVAL;
}

static int cache_parse_tribool(const char *text, void *field, char *err, size_t errlen) {
  if (cache_parse_bool_text(text, (int *)field) != 0) {
    snprintf(err, errlen, "expected true or false");
    return GMR_EINVAL;
  }
  return 0;
}

/* One "[<MB>:<N>, ..., >:<N>]" list, or a single power of two, as
 * AcceleratorAllocatorConfig (PyTorch 2.9+) reads them.  `tok` are the
 * tokens of the whole string (or of the YAML value), `*i` the index of the
 * value's first token; on return *i is the index of its last token. */
typedef struct cache_tok_s {
  const char *s; /* not NUL-terminated */
  size_t len;
} cache_tok_t;

static bool tok_is(const cache_tok_t *t, const char *w) {
  return t->len == strlen(w) && memcmp(t->s, w, t->len) == 0;
}

static int tok_u64(const cache_tok_t *t, uint64_t *out) {
  if (t->len == 0 || t->len > 19) return GMR_EINVAL;
  uint64_t v = 0;
  for (size_t k = 0; k < t->len; ++k) {
    if (!isdigit((unsigned char)t->s[k])) return GMR_EINVAL;
    v = v * 10 + (uint64_t)(t->s[k] - '0');
  }
  *out = v;
  return 0;
}

static int tok_double(const cache_tok_t *t, double *out) {
  char buf[64];
  if (t->len == 0 || t->len >= sizeof buf) return GMR_EINVAL;
  memcpy(buf, t->s, t->len);
  buf[t->len] = '\0';
  char *end;
  double v = strtod(buf, &end);
  if (*end != '\0' || isnan(v)) return GMR_EINVAL;
  *out = v;
  return 0;
}

/* Split on , : [ ] (each its own token); whitespace is dropped. */
static size_t cache_tokenize(const char *s, cache_tok_t *tok) {
  size_t n = 0;
  for (const char *p = s; *p;) {
    if (isspace((unsigned char)*p)) {
      ++p;
    } else if (strchr(",:[]", *p)) {
      tok[n++] = (cache_tok_t){p, 1};
      ++p;
    } else {
      const char *q = p;
      while (*q && !isspace((unsigned char)*q) && !strchr(",:[]", *q))
        ++q;
      tok[n++] = (cache_tok_t){p, (size_t)(q - p)};
      p = q;
    }
  }
  return n;
}

#define TOKF    "%.*s"
#define TOKA(t) (int)(t).len, (t).s

static int cache_parse_divs_tokens(const cache_tok_t *tok, size_t n, size_t *i, const char *where,
                                   cache_divs_t *out, char *err, size_t errlen) {
  cache_divs_t d = {.given = true};
  uint64_t v;
  if (*i >= n) {
    snprintf(err, errlen, "%sexpected a value for roundup_power2_divisions at index %zu", where,
             *i);
    return GMR_EINVAL;
  }
  if (!tok_is(&tok[*i], "[")) {
    if (tok_u64(&tok[*i], &v) != 0 || !gmr__is_pow2(v) || v > (1u << 30)) {
      snprintf(err, errlen,
               "%sFor roundups, the divisions has to be power of 2, got '" TOKF
               "' at index %zu for roundup_power2_divisions",
               where, TOKA(tok[*i]), *i);
      return GMR_EINVAL;
    }
    for (int k = 0; k < CACHE_DIV_BUCKETS; ++k)
      d.div[k] = (uint32_t)v;
    *out = d;
    return 0;
  }
  bool first = true;
  size_t last = 0;
  bool any = false;
  for (++*i;; ++*i) {
    if (*i >= n) {
      snprintf(err, errlen, "%sexpected ']' to close the roundup_power2_divisions list", where);
      return GMR_EINVAL;
    }
    if (tok_is(&tok[*i], "]")) break;
    if (any) {
      if (!tok_is(&tok[*i], ",")) {
        snprintf(err, errlen,
                 "%sexpected ',' or ']' at index %zu in roundup_power2_divisions, got '" TOKF "'",
                 where, *i, TOKA(tok[*i]));
        return GMR_EINVAL;
      }
      ++*i;
    }
    any = true;
    if (*i + 2 >= n || !tok_is(&tok[*i + 1], ":")) {
      snprintf(err, errlen,
               "%sexpected '<MB>:<divisions>' or '>:<divisions>' at index %zu in "
               "roundup_power2_divisions",
               where, *i);
      return GMR_EINVAL;
    }
    const cache_tok_t *key = &tok[*i];
    const cache_tok_t *val = &tok[*i + 2];
    if (tok_u64(val, &v) != 0 || (v != 0 && !gmr__is_pow2(v)) || v > (1u << 30)) {
      snprintf(err, errlen,
               "%sFor roundups, the divisions has to be 0 or a power of 2, got '" TOKF
               "' at index %zu in roundup_power2_divisions",
               where, TOKA(*val), *i + 2);
      return GMR_EINVAL;
    }
    if (tok_is(key, ">")) {
      for (size_t k = first ? 0 : last + 1; k < CACHE_DIV_BUCKETS; ++k)
        d.div[k] = (uint32_t)v;
    } else {
      uint64_t mb;
      if (tok_u64(key, &mb) != 0 || !gmr__is_pow2(mb)) {
        snprintf(err, errlen,
                 "%sFor roundups, the intervals have to be power of 2 but got '" TOKF
                 "' at index %zu in roundup_power2_divisions",
                 where, TOKA(*key), *i);
        return GMR_EINVAL;
      }
      size_t idx = (size_t)(63 - __builtin_clzll(mb));
      if (idx > CACHE_DIV_BUCKETS - 1) idx = CACHE_DIV_BUCKETS - 1;
      if (first)
        for (size_t k = 0; k < idx; ++k)
          d.div[k] = (uint32_t)v;
      first = false;
      d.div[idx] = (uint32_t)v;
      last = idx;
    }
    *i += 2;
  }
  *out = d;
  return 0;
}

/* The YAML key `roundup_power2_divisions`: "4" or "[256:1,>:8]". */
static int cache_parse_divs(const char *text, void *field, char *err, size_t errlen) {
  size_t len = strlen(text);
  cache_tok_t *tok = gmr__malloc((len + 1) * sizeof *tok);
  if (tok == NULL) return snprintf(err, errlen, "out of host memory"), GMR_ENOMEM;
  size_t n = cache_tokenize(text, tok), i = 0;
  int rc = cache_parse_divs_tokens(tok, n, &i, "", (cache_divs_t *)field, err, errlen);
  if (rc == 0 && i + 1 != n) {
    snprintf(err, errlen, "unexpected '" TOKF "' at index %zu after the value", TOKA(tok[i + 1]),
             i + 1);
    rc = GMR_EINVAL;
  }
  gmr__free(tok);
  return rc;
}

static int cache_conf_bool(const cache_tok_t *t, size_t i, const char *key, int *out, char *err,
                           size_t errlen) {
  if (tok_is(t, "True")) return (*out = 1), 0;
  if (tok_is(t, "False")) return (*out = 0), 0;
  snprintf(err, errlen,
           "pytorch_alloc_conf: Expected 'True' or 'False' at index %zu for %s, got '" TOKF "'", i,
           key, TOKA(*t));
  return GMR_EINVAL;
}

static int cache_conf_mb(const cache_tok_t *t, size_t i, const char *key, uint64_t *out, char *err,
                         size_t errlen) {
  uint64_t v;
  if (tok_u64(t, &v) != 0) {
    snprintf(err, errlen,
             "pytorch_alloc_conf: expected a whole number of MB at index %zu for %s, got '" TOKF
             "'",
             i, key, TOKA(*t));
    return GMR_EINVAL;
  }
  if (v > (SIZE_MAX >> 20)) v = SIZE_MAX >> 20;
  *out = v;
  return 0;
}

/* Parse a PYTORCH_CUDA_ALLOC_CONF string into `o` (fields "not given" unless
 * the string sets them). */
static int cache_parse_conf(const char *s, cache_opts_t *o, char *err, size_t errlen) {
  size_t len = strlen(s);
  cache_tok_t *tok = gmr__malloc((len + 1) * sizeof *tok);
  if (tok == NULL) return snprintf(err, errlen, "out of host memory"), GMR_ENOMEM;
  size_t n = cache_tokenize(s, tok);
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; ++i) {
    cache_tok_t key = tok[i];
    char k[64];
    snprintf(k, sizeof k, TOKF, TOKA(key));
    if (key.len == 1 && strchr(",:[]", key.s[0])) {
      snprintf(err, errlen, "pytorch_alloc_conf: expected an option name at index %zu, got '%s'", i,
               k);
      rc = GMR_EINVAL;
      break;
    }
    if (i + 2 > n || !tok_is(&tok[i + 1], ":") || i + 2 >= n) {
      snprintf(err, errlen, "pytorch_alloc_conf: expected ':' and a value after '%s' at index %zu",
               k, i + 1);
      rc = GMR_EINVAL;
      break;
    }
    i += 2;
    const cache_tok_t *v = &tok[i];
    uint64_t mb;
    double d;
    if (strcmp(k, "max_split_size_mb") == 0) {
      rc = cache_conf_mb(v, i, k, &mb, err, errlen);
      if (rc == 0 && mb <= 20) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: CachingAllocator option max_split_size_mb too "
                 "small, must be > 20 (got %llu at index %zu)",
                 (unsigned long long)mb, i);
        rc = GMR_EINVAL;
      }
      if (rc == 0) o->max_split_size = mb << 20;
    } else if (strcmp(k, "max_non_split_rounding_mb") == 0) {
      rc = cache_conf_mb(v, i, k, &mb, err, errlen);
      if (rc == 0 && mb < 20) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: CachingAllocator option "
                 "max_non_split_rounding_mb too small, must be >= 20 (got %llu at index %zu)",
                 (unsigned long long)mb, i);
        rc = GMR_EINVAL;
      }
      if (rc == 0) o->max_non_split_rounding = mb << 20;
    } else if (strcmp(k, "large_segment_size_mb") == 0) {
      rc = cache_conf_mb(v, i, k, &mb, err, errlen);
      if (rc == 0 && mb <= 10) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: large_segment_size_mb must be > 10 MB (got "
                 "%llu at index %zu)",
                 (unsigned long long)mb, i);
        rc = GMR_EINVAL;
      }
      if (rc == 0) o->large_segment_size = mb << 20;
    } else if (strcmp(k, "roundup_power2_divisions") == 0) {
      rc = cache_parse_divs_tokens(tok, n, &i, "pytorch_alloc_conf: ", &o->roundup_power2_divisions,
                                   err, errlen);
    } else if (strcmp(k, "garbage_collection_threshold") == 0) {
      if (tok_double(v, &d) != 0 || !(d > 0.0 && d < 1.0)) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: garbage_collect_threshold is invalid, set it "
                 "in (0.0, 1.0) (got '" TOKF "' at index %zu)",
                 TOKA(*v), i);
        rc = GMR_EINVAL;
      } else {
        o->garbage_collection_threshold = d;
      }
    } else if (strcmp(k, "per_process_memory_fraction") == 0) {
      if (tok_double(v, &d) != 0 || !(d >= 0.0 && d <= 1.0)) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: per_process_memory_fraction is invalid, set "
                 "it in [0.0, 1.0] (got '" TOKF "' at index %zu)",
                 TOKA(*v), i);
        rc = GMR_EINVAL;
      } else {
        o->per_process_memory_fraction = d;
      }
    } else if (strcmp(k, "expandable_segments") == 0) {
      rc = cache_conf_bool(v, i, k, &o->expandable_segments, err, errlen);
    } else if (strcmp(k, "release_lock_on_cudamalloc") == 0 ||
               strcmp(k, "release_lock_on_hipmalloc") == 0) {
      rc = cache_conf_bool(v, i, k, &o->release_lock_on_cudamalloc, err, errlen);
    } else if (strcmp(k, "backend") == 0) {
      if (!tok_is(v, "native")) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: backend '" TOKF "' at index %zu is not the "
                 "caching allocator; only backend:native is accepted here",
                 TOKA(*v), i);
        rc = GMR_EINVAL;
      }
    } else if (strcmp(k, "pinned_use_cuda_host_register") == 0 ||
               strcmp(k, "pinned_use_hip_host_register") == 0 ||
               strcmp(k, "pinned_use_background_threads") == 0 ||
               strcmp(k, "graph_capture_record_stream_reuse") == 0) {
      int ignored;
      rc = cache_conf_bool(v, i, k, &ignored, err, errlen);
    } else if (strcmp(k, "pinned_num_register_threads") == 0 ||
               strcmp(k, "pinned_reserve_segment_size_mb") == 0) {
      rc = cache_conf_mb(v, i, k, &mb, err, errlen);
    } else {
      snprintf(err, errlen,
               "pytorch_alloc_conf: Unrecognized key '%s' in CUDA allocator config "
               "(index %zu).",
               k, i - 2);
      rc = GMR_EINVAL;
    }
    if (rc == 0 && i + 1 < n) {
      if (!tok_is(&tok[i + 1], ",")) {
        snprintf(err, errlen,
                 "pytorch_alloc_conf: expected ',' at index %zu after the value of "
                 "%s, got '" TOKF "'",
                 i + 1, k, TOKA(tok[i + 1]));
        rc = GMR_EINVAL;
      } else if (i + 2 >= n) {
        snprintf(err, errlen, "pytorch_alloc_conf: expected an option after ',' at index %zu",
                 i + 1);
        rc = GMR_EINVAL;
      }
      ++i;
    }
  }
  gmr__free(tok);
  return rc;
}

/* Merge the keys and the string into the options in force.  An option set in
 * both places is an error: neither silently wins. */
static int cache_resolve(const cache_opts_t *o, cache_conf_t *conf, char *err, size_t errlen) {
  cache_opts_t s = cache_opts_default;
  if (o->pytorch_alloc_conf != NULL &&
      cache_parse_conf(o->pytorch_alloc_conf, &s, err, errlen) != 0)
    return GMR_ECONFIG;
  const char *both = NULL;
  if (o->max_split_size && s.max_split_size) both = "max_split_size (max_split_size_mb)";
  if (o->max_non_split_rounding && s.max_non_split_rounding)
    both = "max_non_split_rounding (max_non_split_rounding_mb)";
  if (o->roundup_power2_divisions.given && s.roundup_power2_divisions.given)
    both = "roundup_power2_divisions";
  if (o->garbage_collection_threshold > 0 && s.garbage_collection_threshold > 0)
    both = "garbage_collection_threshold";
  if (o->expandable_segments >= 0 && s.expandable_segments >= 0) both = "expandable_segments";
  if (o->per_process_memory_fraction >= 0 && s.per_process_memory_fraction >= 0)
    both = "per_process_memory_fraction";
  if (o->release_lock_on_cudamalloc >= 0 && s.release_lock_on_cudamalloc >= 0)
    both = "release_lock_on_cudamalloc";
  if (o->large_segment_size && s.large_segment_size)
    both = "large_segment_size (large_segment_size_mb)";
  if (both != NULL) {
    snprintf(err, errlen,
             "%s is set both as a key and in pytorch_alloc_conf ('%s'); set it in "
             "one place",
             both, o->pytorch_alloc_conf);
    return GMR_ECONFIG;
  }
#define PICK(f, unset) (o->f != (unset) ? o->f : s.f)
  uint64_t mss = o->max_split_size ? o->max_split_size : s.max_split_size;
  uint64_t nsr = o->max_non_split_rounding ? o->max_non_split_rounding : s.max_non_split_rounding;
  uint64_t lss = o->large_segment_size ? o->large_segment_size : s.large_segment_size;
  const cache_divs_t *dv = o->roundup_power2_divisions.given ? &o->roundup_power2_divisions
                                                             : &s.roundup_power2_divisions;
  cache_conf_t r = {
      .max_split_size = mss ? (size_t)mss : CACHE_UNLIMITED,
      .max_non_split_rounding = nsr ? (size_t)nsr : CACHE_LARGE_BUFFER,
      .gc_threshold = o->garbage_collection_threshold > 0 ? o->garbage_collection_threshold
                                                          : s.garbage_collection_threshold,
      .expandable = PICK(expandable_segments, -1) == 1,
      .fraction = PICK(per_process_memory_fraction, -1.0),
      .release_lock = PICK(release_lock_on_cudamalloc, -1) == 1,
      .large_segment = lss ? (size_t)lss : CACHE_LARGE_BUFFER,
  };
#undef PICK
  if (r.fraction < 0) r.fraction = 1.0;
  memcpy(r.div, dv->div, sizeof r.div);
  if (r.gc_threshold >= 1.0) {
    snprintf(err, errlen, "garbage_collection_threshold is invalid, set it in (0.0, 1.0)");
    return GMR_ECONFIG;
  }
  if (r.large_segment % CACHE_ROUND_LARGE != 0) {
    snprintf(err, errlen, "large_segment_size must be a multiple of 2 MiB");
    return GMR_ECONFIG;
  }
  *conf = r;
  return 0;
}

static int cache_validate(void *opts, char *err, size_t errlen) {
  cache_conf_t conf;
  return cache_resolve(opts, &conf, err, errlen);
}

static void cache_opts_release(void *opts) {
  cache_opts_t *o = opts;
  gmr__free(o->pytorch_alloc_conf);
  o->pytorch_alloc_conf = NULL;
}

/* ---- create and destroy ------------------------------------------------------------------ */

static void cache_destroy(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  gmr_backend_t *be = self->backend;
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    for (cache_event_t *e = cs->ev_head, *nx; e; e = nx) {
      nx = e->next;
      gmr__backend_event_destroy(be, e->ev);
      gmr__free(e);
    }
  }
  for (cache_seg_t *s = c->segs, *nx; s; s = nx) {
    nx = s->next_seg;
    size_t next_page = 0;
    for (cache_block_t *b = s->head, *bn; b; b = bn) {
      bn = b->next;
      if (s->expandable && b->mapped) {
        size_t first = (b->ptr - s->base) / s->page;
        size_t last = (b->ptr - s->base + b->size + s->page - 1) / s->page;
        if (first < next_page) first = next_page;
        seg_unmap_pages(c, s, first, last);
        if (last > next_page) next_page = last;
      }
      gmr__free(b->uses);
      gmr__free(b);
    }
    if (s->expandable)
      gmr__backend_va_release(be, (void *)s->base, s->size);
    else
      gmr__backend_release(be, (void *)s->base, s->size);
    gmr__free(s);
  }
  for (cache_event_t *e = c->spare_ev, *nx; e; e = nx) {
    nx = e->next;
    gmr__free(e);
  }
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    for (cache_block_t *b = cs->spare, *nx; b; b = nx) {
      nx = b->next;
      gmr__free(b->uses);
      gmr__free(b);
    }
    gmr__free(cs);
  }
  gmr__free(c->streams);
  pthread_mutex_destroy(&c->glock);
  gmr__free(c);
}

static int cache_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                        gmr_policy_t **out) {
  (void)upstream;
  cache_conf_t conf;
  char why[512];
  if (cache_resolve(opts, &conf, why, sizeof why) != 0)
    return gmr__error_set(GMR_ECONFIG, "caching: %s", why);
  cache_t *c = gmr__calloc(1, sizeof *c);
  if (c == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  c->base.ops = &gmr_caching_policy_ops;
  c->base.backend = be;
  c->conf = conf;
  c->st.max_split_size = (int64_t)conf.max_split_size; /* -1 when unlimited, as PyTorch */
  size_t dev_free = 0, total = 0;
  int err = gmr__backend_mem_info(be, &dev_free, &total);
  if (err == 0 && pthread_mutex_init(&c->glock, NULL) != 0) err = GMR_ENOMEM;
  atomic_flag_clear(&c->slock);
  if (err != 0) {
    gmr__free(c);
    return err == GMR_ENOMEM ? gmr__error_set(err, "caching: cannot create locks") : err;
  }
  c->device_total = total;
  if (conf.fraction < 1.0) {
    c->fraction_set = true;
    c->allowed_max = (size_t)(conf.fraction * (double)total);
  }
  if (conf.expandable && !gmr__backend_has_vmm(be)) {
    gmr__log(GMR_LOG_WARN,
             "caching: the %s backend cannot map pages; expandable_segments is "
             "off",
             be->ops->name);
    c->conf.expandable = false;
  }
  c->global_only = c->fraction_set && c->conf.gc_threshold > 0;
  if (c->conf.expandable &&
      (c->conf.large_segment % be->granularity != 0 || CACHE_SMALL_BUFFER % be->granularity != 0)) {
    cache_destroy(&c->base);
    return gmr__error_set(GMR_ECONFIG,
                          "caching: expandable segments need pages of 2 MiB and "
                          "large_segment_size that are multiples of the device "
                          "granularity (%zu bytes)",
                          be->granularity);
  }
  *out = &c->base;
  return 0;
}

/* ---- the ops the runtime calls: the global path around the bodies above ---------------- */

static int cache_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  cache_lock_all((cache_t *)self);
  int err = cache_record_stream_locked(self, blk, s);
  cache_unlock_all((cache_t *)self);
  return err;
}

static int cache_trim(gmr_policy_t *self) {
  cache_lock_all((cache_t *)self);
  int err = cache_trim_locked(self);
  cache_unlock_all((cache_t *)self);
  return err;
}

static void cache_stats(gmr_policy_t *self, gmr_stats_t *out) {
  cache_lock_all((cache_t *)self);
  cache_stats_locked(self, out);
  cache_unlock_all((cache_t *)self);
}

static void cache_reset_peak(gmr_policy_t *self) {
  cache_lock_all((cache_t *)self);
  cache_reset_peak_locked(self);
  cache_unlock_all((cache_t *)self);
}

static void cache_reset_accumulated(gmr_policy_t *self) {
  cache_lock_all((cache_t *)self);
  cache_reset_accumulated_locked(self);
  cache_unlock_all((cache_t *)self);
}

static int cache_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  cache_lock_all((cache_t *)self);
  int err = cache_walk_locked(self, cb, ud);
  cache_unlock_all((cache_t *)self);
  return err;
}

static int cache_check(gmr_policy_t *self) {
  cache_lock_all((cache_t *)self);
  int err = cache_check_locked(self);
  cache_unlock_all((cache_t *)self);
  return err;
}

/* ---- the table ------------------------------------------------------------------------------- */

static const gmr_opt_desc_t cache_opts_desc[] = {
    {.key = "max_split_size",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, max_split_size),
     .min = 20.0 * 1048576.0,
     .min_exclusive = true,
     .default_text = "unlimited",
     .help = "max_split_size_mb: blocks of this size and more are never split, never serve "
             "smaller requests, and are released first when memory runs out (> 20MiB).",
     .tune = (const char *const[]){"64MiB", "128MiB", "256MiB", "512MiB", "1GiB", "4GiB", NULL}},
    {.key = "max_non_split_rounding",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, max_non_split_rounding),
     .min = 20.0 * 1048576.0,
     .default_text = "20MiB",
     .help = "max_non_split_rounding_mb: the most waste an oversize request may take from an "
             "oversize cached block (>= 20MiB)."},
    {.key = "roundup_power2_divisions",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, roundup_power2_divisions),
     .parse = cache_parse_divs,
     .default_text = "0",
     .help = "Round requests up to one of N divisions of their power-of-two interval: a power "
             "of two, or PyTorch's list \"[256:1,>:8]\" (MB interval:divisions).",
     .tune = (const char *const[]){"1", "2", "4", "8", "16", NULL}},
    {.key = "garbage_collection_threshold",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(cache_opts_t, garbage_collection_threshold),
     .min = 0.0,
     .max = 1.0,
     .min_exclusive = true,
     .default_text = "off",
     .help = "In (0, 1): free the oldest unused whole large segments when the cache holds more "
             "than this share of the allowed memory; active only with "
             "per_process_memory_fraction, as in PyTorch.",
     .tune = (const char *const[]){"0.6", "0.8", NULL}},
    {.key = "expandable_segments",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, expandable_segments),
     .parse = cache_parse_tribool,
     .default_text = "false",
     .help = "One growing virtual range per stream and pool, mapped in pages of 2 MiB (small) "
             "and 20 MiB (large).",
     .tune = (const char *const[]){"true", NULL}},
    {.key = "per_process_memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(cache_opts_t, per_process_memory_fraction),
     .min = 0.0,
     .max = 1.0,
     .default_text = "1.0",
     .help = "Cap the device memory the cache holds at this share of the device's total "
             "(torch.cuda.set_per_process_memory_fraction); 1.0: no cap.",
     .tune = (const char *const[]){"1.1x peak", "1.25x peak", "1.5x peak", NULL}},
    {.key = "release_lock_on_cudamalloc",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(cache_opts_t, release_lock_on_cudamalloc),
     .parse = cache_parse_tribool,
     .default_text = "false",
     .help = "Accepted for compatibility; device reservations are made under the lock."},
    {.key = "large_segment_size",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(cache_opts_t, large_segment_size),
     .min = 10.0 * 1048576.0,
     .min_exclusive = true,
     .default_text = "20MiB",
     .help = "large_segment_size_mb: the segment for requests of 1 to 10 MiB and the large "
             "pool's page (> 10MiB, a multiple of 2 MiB)."},
    {.key = "pytorch_alloc_conf",
     .type = GMR_OPT_STRING,
     .offset = offsetof(cache_opts_t, pytorch_alloc_conf),
     .default_text = "",
     .help = "A PYTORCH_CUDA_ALLOC_CONF string, e.g. \"expandable_segments:True,"
             "max_split_size_mb:128\"; an option may be set here or as a key, not both."},
    {.key = NULL},
};

const gmr_policy_ops_t gmr_caching_policy_ops = {
    .name = "caching",
    .help = "PyTorch's CUDA caching allocator, behaviour for behaviour: 512-byte rounding, "
            "small and large pools, best fit per stream, split and merge, max_split_size, "
            "expandable segments, record_stream, memory_stats() and memory_summary().",
    .opts_size = sizeof(cache_opts_t),
    .opts_default = &cache_opts_default,
    .opts_desc = cache_opts_desc,
    .validate = cache_validate,
    .opts_release = cache_opts_release,
    .concurrent = true,
    .create = cache_create,
    .destroy = cache_destroy,
    .alloc = cache_alloc,
    .free = cache_free,
    .record_stream = cache_record_stream,
    .trim = cache_trim,
    .stats = cache_stats,
    .reset_peak = cache_reset_peak,
    .reset_accumulated = cache_reset_accumulated,
    .stats_foreach = cache_stats_foreach,
    .summary = cache_summary,
    .walk = cache_walk,
    .check = cache_check,
};
