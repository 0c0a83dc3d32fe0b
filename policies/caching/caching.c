/* caching.c: the core of the `caching` policy, PyTorch's CUDA caching allocator.
 *
 * A re-implementation, behaviour for behaviour, of
 * c10/cuda/CUDACachingAllocator.cpp's DeviceCachingAllocator (see
 * docs/caching.md and the specification it follows).  This file holds the
 * allocator, its alloc and free paths, quiesce/resume and the ops table;
 * options.c the options and the PYTORCH_CUDA_ALLOC_CONF parser, report.c
 * memory_stats(), memory_summary() and the OOM text, check.c the walk and
 * the check (internal.h).  Map: Note [What PyTorch does], [Structures],
 * [Invariants], [Locking], [Deferred free].
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "caching/internal.h"

/* The hot path (a cached alloc and its free) is inlined whole into the ops,
 * once with direct statistics (j == NULL) and once with a journal. */
#if defined(__GNUC__)
#define CACHE_HOT      inline __attribute__((always_inline))
#define CACHE_NOINLINE __attribute__((noinline))
#else
#define CACHE_HOT inline
#define CACHE_NOINLINE
#endif

/* Note [What PyTorch does]
 * Requests are rounded to 512 bytes (or to power-of-two divisions), go to
 * the small pool (<= 1 MiB) or the large pool, are served best fit by
 * (stream, size, address) from cached free blocks, and otherwise from a new
 * segment of 2 MiB, 20 MiB or the request rounded to 2 MiB (or from pages
 * mapped into one growing virtual range per stream and pool: expandable
 * segments).  Blocks are split and merged exactly as PyTorch does;
 * max_split_size, max_non_split_rounding, garbage_collection_threshold, the
 * memory fraction, record_stream with events, release-and-retry before OOM
 * and empty_cache follow PyTorch, as do torch.cuda.memory_stats() (every
 * key, same name), memory_summary() (byte for byte) and the OOM message.
 *
 * Note [Structures]
 * A segment (cache_seg_t) is a doubly linked list of blocks in address order
 * (prev/next).  Free blocks live in their (stream, pool)'s bins (internal.h:
 * 64 treaps cut by size, a bitmap of the non-empty ones), ordered by (size,
 * address); since PyTorch's one std::set is ordered by (stream, size,
 * address) and a search never leaves its stream, per-stream trees give the
 * identical best fit.  Unmapped ranges of expandable segments live in a
 * second treap per pool, ordered by address.  Block records are recycled,
 * so the hot path (a cached alloc and free) does no host allocation.
 *
 * Note [Invariants] (checked by gmr__cache_check in check.c)
 *   for every segment: Σ block sizes = segment size, blocks contiguous,
 *     no two neighbours both free (not allocated, no pending events, same
 *     mapping state);
 *   a block is in its pool's free tree iff it is free and mapped;
 *   reserved_bytes.all.current = Σ non-expandable segment sizes
 *                                + Σ mapped bytes of expandable segments
 *   reserved >= active >= allocated (bytes, every pool).
 *
 * Note [Locking]
 * The policy is `concurrent` (policy.h, rule 5).  Blocks never cross
 * streams, so each stream has its own lock over its pools and blocks.  The
 * fast path (an alloc served from the stream's cache, a free without
 * recorded streams) takes only that lock.  Everything else (new segments,
 * releasing, events, record_stream, and the quiesced ops: statistics,
 * walks) takes the global path: `glock`, then every stream lock in creation
 * order, which excludes all fast paths.  Statistics: with one stream, the
 * fast path changes the policy's figures under the stream's lock alone
 * (nothing else can touch them); with more, under `slock` when that lock is
 * free (always, with one thread, so every figure and every peak is
 * PyTorch's, exactly); once a fast path finds it busy, fast paths journal
 * their changes into a per-stream delta, folded in by the next global path.
 * Then current, allocated and freed figures stay exact and peaks are those
 * seen at the folds.  With one stream a fast free is deferred to the
 * stream's next operation, which may take the block back
 * (Note [Deferred free]).
 */

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

static size_t treap_collect(cache_block_t *t, cache_block_t **v, size_t n) {
  if (t == NULL) return n;
  n = treap_collect(t->left, v, n);
  v[n++] = t;
  return treap_collect(t->right, v, n);
}

/* A record's treap priority, drawn once when the record is made (an LCG
 * per stream): priorities stay independent of the keys the record takes,
 * and an insert writes none. */
static inline uint16_t cache_prio(cache_stream_t *cs) {
  cs->prio_state = cs->prio_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint16_t)(cs->prio_state >> 48);
}

/* ---- a pool's bins (internal.h): the free tree in pieces ------------------------- */

/* BlockPool::insert_into_blocks' stamp of the GC clock.  The clock runs
 * only with GC on (cache_find_free_block); off, it stays 0, as every
 * record's stamp does (records are made zeroed), so the stamp is not
 * written and the block's second line is not touched. */
static inline void cache_gc_stamp(const cache_t *c, const cache_pool_t *p, cache_block_t *b) {
  if (GMR_UNLIKELY(c->global_only)) b->gc_count_base = c->gc_clock[p->is_small];
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

static void pool_erase(cache_pool_t *p, cache_block_t *b) {
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

/* The first free block whose key is >= (size, ptr), or NULL. */
static cache_block_t *pool_lower_bound(const cache_pool_t *p, size_t size, uintptr_t ptr) {
  unsigned k = cache_bin(p, size);
  cache_block_t *b = treap_lower_bound(p->bins[k], size, ptr, false);
  return b != NULL ? b : pool_first_from(p, k + 1);
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

/* Every free block of the pool in order into v from v[n] (p->n_blocks
 * entries); returns n + p->n_blocks. */
static size_t pool_collect(const cache_pool_t *p, cache_block_t **v, size_t n) {
  for (int k = cache_bin_next(p, 0); k >= 0; k = cache_bin_next(p, (unsigned)k + 1))
    n = treap_collect(p->bins[k], v, n);
  return n;
}

static void unmapped_insert(cache_pool_t *p, cache_block_t *b) {
  treap_insert(&p->unmapped, b, true);
  b->in_tree = true;
}

static void unmapped_erase(cache_pool_t *p, cache_block_t *b) {
  treap_erase(&p->unmapped, b);
  b->in_tree = false;
}

/* ---- records ---------------------------------------------------------------------- */

/* Records come in chunks of CACHE_CHUNK, 64-byte aligned, one host
 * allocation each, linked from their stream and freed with it: a record's
 * first line is a whole cache line, and records made together lie
 * together. */
#define CACHE_CHUNK 32
typedef struct cache_chunk_s {
  struct cache_chunk_s *next;
} cache_chunk_t;

static cache_block_t *chunk_records(cache_chunk_t *k) {
  return gmr__align_ptr(k + 1, 64);
}

/* Keep at least n spare block records in a stream, so that a step that
 * needs some cannot fail half way.  Caller holds the stream's lock. */
static int cache_records_reserve(cache_stream_t *cs, size_t n) {
  _Static_assert(sizeof(cache_block_t) == 128, "a block record is two cache lines");
  while (cs->n_spare < n) {
    cache_chunk_t *k = gmr__calloc(1, sizeof *k + 63 + CACHE_CHUNK * sizeof(cache_block_t));
    if (k == NULL)
      return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for block records");
    k->next = cs->chunks;
    cs->chunks = k;
    cache_block_t *r = chunk_records(k);
    for (int i = CACHE_CHUNK; i-- > 0;) {
      r[i].prio = cache_prio(cs);
      r[i].next = cs->spare;
      cs->spare = &r[i];
    }
    cs->n_spare += CACHE_CHUNK;
  }
  return 0;
}

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
static void cache_recycle(cache_stream_t *cs, cache_block_t *b) {
  b->next = cs->spare;
  cs->spare = b;
  ++cs->n_spare;
}

/* ---- streams ----------------------------------------------------------------------- */

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
  gmr__spin_init(&cs->lock);
  cache_spin_lock(&cs->lock);
  cs->id = s;
  cs->prio_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)c->n_streams;
  for (int i = 0; i < 2; ++i) {
    cs->pools[i].stream = cs;
    cs->pools[i].is_small = i == 1;
    cs->pools[i].base = i == 1 ? 9 : 20;
    cs->pools[i].bin_off =
        ((1023 + (int64_t)cs->pools[i].base) << CACHE_BIN_SUB) + (1 << CACHE_BIN_SUB) - 1;
    cs->pools[i].floor = c->bin_floor[i];
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
 * fast paths' stat deltas are folded in first.  cache_lock_all then applies
 * every stream's deferred free (see Note [Deferred free]), so the global
 * path sees the state PyTorch would have; the check alone looks at the
 * state as it stands (a deferred block is still allocated there, and every
 * invariant holds). */
typedef struct cache_journal_s cache_journal_t;
static void cache_fold(cache_t *c);
static void cache_lock_all_as_is(cache_t *c) {
  pthread_mutex_lock(&c->glock);
  for (size_t i = 0; i < c->n_streams; ++i)
    cache_spin_lock(&c->streams[i]->lock);
  cache_fold(c);
}

static void cache_free_locked(cache_t *c, cache_block_t *b, cache_journal_t *j);
static void cache_apply_deferred(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    cache_block_t *b = cs->deferred;
    if (b == NULL) continue;
    cache_stats_t *st = &c->st;
    cs->deferred = NULL;
    cache_free_locked(c, b, NULL);
    if (!c->events_seen) { /* as cache_fold */
      memcpy(st->active, st->allocation, sizeof st->active);
      memcpy(st->active_bytes, st->allocated_bytes, sizeof st->active_bytes);
    }
    cache_sync_all(st);
  }
}
static void cache_lock_all(cache_t *c) {
  cache_lock_all_as_is(c);
  cache_apply_deferred(c);
}

static void cache_unlock_all(cache_t *c) {
  for (size_t i = c->n_streams; i-- > 0;)
    cache_spin_unlock(&c->streams[i]->lock);
  pthread_mutex_unlock(&c->glock);
}

/* The invariant check between two ops (gmr_assert_expensive). */
static __attribute__((unused)) int cache_check_now(cache_t *c) {
  cache_lock_all_as_is(c);
  int err = gmr__cache_check(&c->base);
  cache_unlock_all(c);
  return err;
}

/* ---- statistic journals ------------------------------------------------------------
 * A fast path that found slock busy records its stat changes and keeps them
 * in its stream's delta (see Note [Locking]); otherwise changes are
 * applied directly (j NULL).
 * t < 0: a single record (oversize_*) rather than an [all, small, large]
 * array.  A stat changes at most once per op, so a journal gives the same
 * peaks as direct updates. */

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

static inline void cache_delta_one(gmr_stat_t *x, int64_t d) {
  x->current += d;
  if (d > 0)
    x->allocated += d;
  else
    x->freed += -d;
}

/* A fast path that is about to change statistics: NULL when it may change
 * the policy's figures directly, else the journal to fill.  Caller holds
 * cs->lock.  With one stream that lock excludes every other path that
 * touches the figures (fast paths hold a stream's lock, the global path
 * all of them, and n_streams changes only there), so the figures are the
 * caller's; with more, it takes slock, held until cache_commit. */
static inline cache_journal_t *cache_begin(cache_t *c, cache_journal_t *j) {
  if (GMR_LIKELY(c->n_streams == 1)) return NULL;
  j->n = 0;
  if (!atomic_load_explicit(&c->sharded, memory_order_relaxed)) {
    if (!atomic_flag_test_and_set_explicit(&c->slock, memory_order_acquire)) return NULL;
    atomic_store_explicit(&c->sharded, true, memory_order_relaxed);
  }
  return j;
}

/* Release slock, or keep the journal in the stream's delta. */
static void cache_keep(cache_t *c, cache_stream_t *cs, const cache_journal_t *j);
static inline void cache_commit(cache_t *c, cache_stream_t *cs, const cache_journal_t *j) {
  if (GMR_LIKELY(j == NULL)) {
    if (c->n_streams != 1) atomic_flag_clear_explicit(&c->slock, memory_order_release);
    return;
  }
  cache_keep(c, cs, j);
}

static void cache_keep(cache_t *c, cache_stream_t *cs, const cache_journal_t *j) {
  for (int i = 0; i < j->n; ++i) {
    gmr_stat_t *a = (gmr_stat_t *)((char *)&cs->delta + ((char *)j->e[i].stat - (char *)&c->st));
    cache_delta_one(&a[j->e[i].t >= 0 ? j->e[i].t : 0], j->e[i].d); /* aggregates: synced */
  }
  cs->dirty = true;
}

/* Fold every stream's delta into the figures, then write the aggregates
 * (cache_sync_all); global path only. */
static void cache_fold_backs(cache_t *c, cache_stream_t *cs) {
  cache_stats_t *st = &c->st;
  for (int i = 0; i < 2; ++i) {
    cache_back_t *k = &cs->pools[i].back;
    int t = cache_stat_type(&cs->pools[i]);
    gmr_stat_t *both[] = {&st->allocation[t],           &st->active[t],
                          &st->allocated_bytes[t],      &st->active_bytes[t],
                          &st->requested_bytes[t],      &st->inactive_split[t],
                          &st->inactive_split_bytes[t], &st->oversize_allocations};
    int64_t by[] = {k->n,         k->n,      k->bytes,        k->bytes,
                    k->requested, k->isplit, k->isplit_bytes, k->oversize};
    for (size_t m = 0; m < sizeof by / sizeof by[0]; ++m) {
      both[m]->allocated += by[m];
      both[m]->freed += by[m];
    }
    *k = (cache_back_t){0, 0, 0, 0, 0, 0};
  }
  cs->backed = false;
}

static void cache_fold(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    if (cs->backed) cache_fold_backs(c, cs);
    if (!cs->dirty) continue;
    gmr_stat_t *dst = (gmr_stat_t *)&c->st, *src = (gmr_stat_t *)&cs->delta;
    for (int k = 0; k < CACHE_N_STATS; ++k) {
      if (k < CACHE_N_TRIPLES * 3 && k % 3 == CS_ALL) continue; /* synced below */
      dst[k].current += src[k].current;
      dst[k].allocated += src[k].allocated;
      dst[k].freed += src[k].freed;
      if (dst[k].current > dst[k].peak) dst[k].peak = dst[k].current;
      src[k] = (gmr_stat_t){0, 0, 0, 0};
    }
    cs->dirty = false;
  }
  if (!c->events_seen) { /* active is allocation until a stream is recorded */
    memcpy(c->st.active, c->st.allocation, sizeof c->st.active);
    memcpy(c->st.active_bytes, c->st.allocated_bytes, sizeof c->st.active_bytes);
  }
  cache_sync_all(&c->st);
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
static inline size_t cache_round_size(const cache_t *c, size_t size) {
  if (GMR_LIKELY(!c->divisions)) return gmr__align_up(size, CACHE_MIN_BLOCK); /* size >= 1 */
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

/* try_merge_blocks' test: may `src` merge into the freed block `dst`?
 * PyTorch's also asks for no recorded streams, which a block that is not
 * allocated never has (internal.h): the test reads src's first line only. */
static inline bool cache_mergeable(const cache_block_t *dst, const cache_block_t *src) {
  gmr_assert_internal(src == NULL || src->allocated || src->n_uses == 0);
  return src != NULL && !src->allocated && src->event_count == 0 && dst->mapped == src->mapped;
}

/* try_merge_blocks' merge, the test passed: merge `src` into `dst` (dst is
 * in no tree); returns the bytes subsumed. */
static size_t cache_merge_into(cache_block_t *dst, cache_block_t *src) {
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

/* try_merge_blocks: merge `src` into `dst` (dst is in no tree); returns the
 * bytes subsumed, 0 when refused. */
static size_t cache_try_merge(cache_block_t *dst, cache_block_t *src) {
  return cache_mergeable(dst, src) ? cache_merge_into(dst, src) : 0;
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

/* release_block: cudaFree a whole free non-expandable segment. */
static int cache_release_block(cache_t *c, cache_block_t *b) {
  cache_seg_t *s = b->seg;
  int err = gmr__backend_release(c->base.backend, (void *)s->base, s->size, b->pool->stream->id);
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
  cache_recycle(b->pool->stream, b);
  return 0;
}

/* ---- expandable segments ------------------------------------------------------------- */

/* Unmap pages [first, last) of s, for stream `st` (the history's entries). */
static void seg_unmap_pages(cache_t *c, cache_seg_t *s, size_t first, size_t last,
                            gmr_stream_t st) {
  for (size_t i = first; i < last; ++i)
    gmr__backend_unmap(c->base.backend, (void *)(s->base + i * s->page), s->page, st);
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
    err =
        gmr__backend_map(c->base.backend, (void *)(s->base + i * s->page), s->page, p->stream->id);
    if (err != 0) {
      seg_unmap_pages(c, s, first, i, p->stream->id);
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
    unmapped_insert(p, rest);
    b->size = bytes;
  }
  cache_try_merge(b, b->prev);
  cache_try_merge(b, b->next);
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
  seg_unmap_pages(c, s, first, last, p->stream->id);
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
  cache_try_merge(b, b->prev);
  cache_try_merge(b, b->next);
  unmapped_insert(p, b);
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
  cache_recycle(b->pool->stream, b);
  return 0;
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
  unmapped_insert(p, b);
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
  size_t n = pool_collect(p, v, 0);
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
  cache_block_t *b = pool_lower_bound(p, key, 0);
  if (b != NULL && !b->seg->expandable) {
    int err = cache_release_block(c, b);
    if (err == 0) *released = true;
    return err;
  }
  if (p->n_blocks == 0) return 0;
  cache_block_t **v = gmr__malloc(p->n_blocks * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  size_t n = pool_collect(p, v, 0), total = 0;
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
    n = pool_collect(&c->streams[i]->pools[0], v, n);
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

/* get_free_block without taking the block out of its tree: the smallest
 * fitting cached block, or NULL; *pred is the block before it in the tree
 * when the plain best fit was taken, else the block itself (no in-place
 * split then: see cache_alloc_found). */
static CACHE_HOT cache_block_t *cache_find_free_block(cache_t *c, cache_pool_t *p, size_t size,
                                                      cache_block_t **pred) {
  if (c->fraction_set && c->conf.gc_threshold > 0) ++c->gc_clock[p->is_small];
  cache_block_t *b = pool_fit(p, size, pred);
  if (b == NULL) return NULL;
  if (c->conf.expandable) { /* every segment is expandable then, and only then */
    /* Best fit by the size a block can grow to (its unmapped successor). */
    for (;;) {
      cache_block_t *nx = pool_next(p, b);
      if (nx == NULL) break;
      size_t es_b = b->size + (b->next && !b->next->mapped ? b->next->size : 0);
      size_t es_n = nx->size + (nx->next && !nx->next->mapped ? nx->next->size : 0);
      if (!(es_n < es_b)) break;
      b = nx;
      *pred = b;
    }
  }
  size_t mss = c->conf.max_split_size;
  if (size < mss && b->size >= mss) return NULL;
  if (size >= mss && b->size >= size + c->conf.max_non_split_rounding) return NULL;
  return b;
}

/* get_free_block: the smallest fitting cached block, out of its tree, or NULL. */
static cache_block_t *cache_get_free_block(cache_t *c, cache_pool_t *p, size_t size) {
  cache_block_t *pred;
  cache_block_t *b = cache_find_free_block(c, p, size, &pred);
  if (b != NULL) pool_erase(p, b);
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
  int err = gmr__backend_reserve(c->base.backend, alloc_size, p->stream->id, &ptr);
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

/* should_split of b, a block of pool p. */
static bool cache_should_split(const cache_t *c, const cache_pool_t *p, const cache_block_t *b,
                               size_t size) {
  size_t remaining = b->size - size;
  if (p->is_small || c->conf.expandable) return remaining >= CACHE_MIN_BLOCK;
  return size < c->conf.max_split_size && remaining > CACHE_SMALL_SIZE;
}

/* alloc_found_block of b, a block of pool p.  `in_tree`: b is still in its
 * free tree, and `pred` is the block before it there (see
 * cache_find_free_block); a split remainder then keeps b's node when its key
 * stays above pred's (the key only shrinks, so nothing else can pass it),
 * instead of leaving the tree and entering it again; otherwise b leaves the
 * tree first. */
static CACHE_HOT cache_block_t *cache_alloc_found(cache_t *c, cache_pool_t *p, cache_block_t *b,
                                                  size_t size, size_t orig, bool split,
                                                  cache_journal_t *j, bool in_tree,
                                                  const cache_block_t *pred) {
  int t = cache_stat_type(p);
  bool already_split = cache_is_split(b), expandable = c->conf.expandable; /* b->seg's */
  if (in_tree) {
    size_t rest_size = b->size - size;
    uintptr_t rest_ptr = b->ptr + size;
    bool keep = split && pred != b && rest_size >= p->floor[b->bin] &&
                (pred == NULL || pred->size < rest_size ||
                 (pred->size == rest_size && pred->ptr < rest_ptr));
    if (!keep) pool_erase(p, b);
    in_tree = keep;
  }
  if (split) {
    cache_block_t *rest = b;
    b = cache_record(p, rest->seg, rest->ptr, size);
    b->prev = rest->prev;
    if (b->prev) b->prev->next = b;
    b->next = rest;
    rest->prev = b;
    if (b->prev == NULL) rest->seg->head = b;
    rest->ptr += size;
    rest->size -= size;
    if (in_tree)
      cache_gc_stamp(c, p, rest); /* insert_into_blocks' */
    else
      pool_insert(c, p, rest);
    if (already_split && !expandable) {
      cache_down(j, c->st.inactive_split_bytes, t, (int64_t)size);
    } else if (!expandable) {
      cache_up(j, c->st.inactive_split_bytes, t, (int64_t)rest->size);
      cache_up(j, c->st.inactive_split, t, 1);
    }
  } else if (already_split && !expandable) {
    cache_down(j, c->st.inactive_split_bytes, t, (int64_t)b->size);
    cache_down(j, c->st.inactive_split, t, 1);
  }
  b->allocated = true;
  b->requested = orig;
  cache_up(j, c->st.allocation, t, 1);
  cache_up(j, c->st.allocated_bytes, t, (int64_t)b->size);
  if (c->events_seen) {
    cache_up(j, c->st.active, t, 1);
    cache_up(j, c->st.active_bytes, t, (int64_t)b->size);
  }
  cache_up(j, c->st.requested_bytes, t, (int64_t)orig);
  if (b->size >= c->conf.max_split_size) cache_add(j, &c->st.oversize_allocations, -1, 1);
  return b;
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
    if (b == NULL) return gmr__cache_oom(c, alloc_size);
  }
  /* The releases and maps above may have used the records reserved at the
   * top (an expandable segment unmapped, then mapped again); a split needs
   * one more.  Should the host refuse it, the whole block is handed out. */
  bool split = cache_should_split(c, p, b, size);
  if (split && cache_records_reserve(p->stream, 1) != 0) split = false;
  b = cache_alloc_found(c, p, b, size, orig, split, NULL, false, NULL);
  *out = (gmr_block_t){.ptr = (void *)b->ptr, .size = b->size, .handle = b};
  return 0;
}

/* ---- the deferred free --------------------------------------------------------------- */

/* Note [Deferred free]
 * While the policy has one stream, a fast free is not applied at once: the
 * block waits in the stream's `deferred` slot, still allocated as far as
 * the policy's structures and figures go (the runtime's map no longer has
 * it, so nobody can free it again), until the stream's next operation;
 * every global path applies it first (cache_lock_all).  So the free is
 * applied before anything else can see or change the pools or the figures,
 * in PyTorch's order: with one stream, only that stream's operations and
 * the global path change the figures (a second stream is made on the
 * global path, which applies the deferred free first; with two or more,
 * frees are applied at once, as a free on one stream followed by an
 * allocation on another must see the figures of the free).
 * When that next operation is an allocation that PyTorch would serve with
 * this very block (its free merges it into M with the free block after it,
 * or with nothing; M is the best fit, and the split gives back the block's
 * extent), PyTorch's free and malloc together change no block, no tree and
 * no current figure but requested_bytes: the allocation takes the block
 * back, and only the figures' totals (and a peak the free raised) move.  A
 * take-back is PyTorch's malloc, not an approximation of it. */

/* A stat that goes up by n and down again: the rise may be a new peak. */
static CACHE_HOT void cache_bump(cache_journal_t *j, gmr_stat_t *a, int t, int64_t n) {
  if (GMR_LIKELY(j == NULL)) {
    cache_inc(a, t, n);
    cache_dec(a, t, n);
  } else {
    cache_add(j, a, t, n);
    cache_add(j, a, t, -n);
  }
}

/* The figures of a take-back of d that change now (see
 * cache_take_back_figures): the rise of a split block's inactive bytes
 * (and count, when d stands alone), a new request. */
static CACHE_NOINLINE void cache_take_back_live(cache_t *c, cache_stream_t *cs,
                                                const cache_block_t *d, bool mn, bool msplit,
                                                size_t orig) {
  int t = cache_stat_type(d->pool);
  cache_journal_t jbuf, *j = cache_begin(c, &jbuf);
  if (msplit) {
    if (!mn) cache_bump(j, c->st.inactive_split, t, 1);
    cache_bump(j, c->st.inactive_split_bytes, t, (int64_t)d->size);
  }
  if (orig != d->requested) {
    cache_down(j, c->st.requested_bytes, t, (int64_t)d->requested);
    cache_up(j, c->st.requested_bytes, t, (int64_t)orig);
  }
  cache_commit(c, cs, j);
}

/* The figures of a take-back: those of PyTorch's free of d
 * (cache_free_locked, cache_free_block) and of its malloc of M
 * (cache_alloc_found), nothing else.  mn: d's successor n merges; M is
 * split when it has a neighbour.  Every figure goes down and up by the same
 * amount, or up and down (the free's rise of a split M's inactive bytes),
 * but requested_bytes when the request differs: the totals go to the
 * pool's `back` (counted at the next global path), and only a rise or a new
 * request touches the figures now. */
static CACHE_HOT void cache_take_back_figures(cache_t *c, cache_stream_t *cs, cache_block_t *d,
                                              bool mn, size_t orig) {
  const cache_block_t *n = d->next;
  bool msplit = d->prev != NULL || (mn ? n->next : n) != NULL;
  cache_back_t *k = &d->pool->back;
  cs->backed = true;
  k->n += 1;
  k->bytes += (int64_t)d->size;
  if (GMR_UNLIKELY(d->size >= c->conf.max_split_size)) k->oversize += 1;
  if (mn && !msplit) {
    /* M is a whole segment: the free ends n's split, the split makes it again. */
    k->isplit += 1;
    k->isplit_bytes += (int64_t)n->size;
  }
  if (GMR_LIKELY(orig == d->requested)) {
    k->requested += (int64_t)orig;
    if (GMR_LIKELY(!msplit)) return;
  }
  cache_take_back_live(c, cs, d, mn, msplit, orig);
}

/* Without expandable segments (the take-back is off with them) every block
 * is mapped, and a block that is not allocated has no recorded streams:
 * cache_mergeable(any, x) is this. */
static inline bool cache_free_now(const cache_block_t *x) {
  gmr_assert_internal(x == NULL || x->allocated || (x->mapped && x->n_uses == 0));
  return x != NULL && !x->allocated && x->event_count == 0;
}

/* Would PyTorch serve an allocation of `size` (rounded) bytes with the
 * deferred block d, d's free applied first?  Its free merges d with its
 * free neighbours into M; its malloc takes the best fit for `size` and
 * splits it.  The answer is d itself, with d's extent, iff:
 *   `size` is for d's pool, and d's predecessor does not merge (else M
 *   starts below d);
 *   M is d and its successor n when n merges (then the split must be made
 *   and size == |d|), else d alone (then no split, and size <= |d|);
 *   M passes max_split_size's tests, and no other free block of the pool
 *   has a key in [(size, 0), (|M|, d->ptr)).
 * *mn: n merges.  Caller holds the stream's lock. */
static CACHE_HOT bool cache_takes_back(const cache_t *c, const cache_block_t *d, size_t size,
                                       bool *mn) {
  if (size > d->size) return false; /* d could not hold it, merged or not */
  const cache_pool_t *p = d->pool;
  if ((size <= CACHE_SMALL_SIZE) != p->is_small || cache_free_now(d->prev)) return false;
  const cache_block_t *n = d->next;
  size_t mss = c->conf.max_split_size;
  if ((*mn = cache_free_now(n))) {
    size_t m = size + n->size;
    /* should_split: a small block's rest is >= 512 bytes, as every block. */
    if (size != d->size || (!p->is_small && !(size < mss && n->size > CACHE_SMALL_SIZE)))
      return false;
    if (size < mss ? m >= mss : m >= size + c->conf.max_non_split_rounding) return false;
    const cache_block_t *f;
    if (n->size >= size) {
      /* n is in [(size, 0), M): nothing else may be, before or after it. */
      f = pool_prev(p, n);
      if (f != NULL && f->size >= size) return false;
      f = pool_next(p, n);
    } else {
      cache_block_t *pred;
      f = pool_fit(p, size, &pred);
    }
    return f == NULL || m < f->size || (m == f->size && d->ptr < f->ptr);
  }
  size_t m = d->size;
  if (p->is_small ? m - size >= CACHE_MIN_BLOCK
                  : size < mss && m - size > CACHE_SMALL_SIZE) /* should_split */
    return false;
  if (size < mss ? m >= mss : m >= size + c->conf.max_non_split_rounding) return false;
  cache_block_t *pred, *f = pool_fit(p, size, &pred);
  return f == NULL || m < f->size || (m == f->size && d->ptr < f->ptr);
}

/* Apply the deferred free of b now (fast path: cs->lock held). */
static CACHE_HOT void cache_free_apply(cache_t *c, cache_stream_t *cs, cache_block_t *b) {
  cache_journal_t jbuf, *j = cache_begin(c, &jbuf);
  if (GMR_LIKELY(j == NULL))
    cache_free_locked(c, b, NULL);
  else
    cache_free_locked(c, b, j);
  cache_commit(c, cs, j);
}

/* ---- the ops' alloc and free ---------------------------------------------------------- */

static CACHE_NOINLINE int cache_alloc_slow(cache_t *c, size_t orig, gmr_stream_t s,
                                           gmr_block_t *out) {
  cache_lock_all(c);
  int err = cache_alloc_global(c, orig, s, out);
  cache_unlock_all(c);
  gmr_assert_expensive(err != 0 || cache_check_now(c) != GMR_EINVAL);
  return err;
}

/* The fast path without a take-back: the deferred free applied, a block of
 * the free tree; else the global path.  cs->lock held, released here. */
static CACHE_HOT int cache_alloc_cached(cache_t *c, cache_stream_t *cs, size_t size, size_t orig,
                                        gmr_stream_t s, gmr_block_t *out) {
  cache_block_t *b = cs->deferred;
  if (b != NULL) {
    cs->deferred = NULL;
    cache_free_apply(c, cs, b);
  }
  if (GMR_UNLIKELY(cs->n_spare == 0) && cache_records_reserve(cs, 4) != 0) goto slow;
  cache_pool_t *p = &cs->pools[size <= CACHE_SMALL_SIZE];
  cache_block_t *pred;
  b = cache_find_free_block(c, p, size, &pred);
  if (GMR_UNLIKELY(b == NULL)) goto slow;
  bool split = cache_should_split(c, p, b, size);
  cache_journal_t jbuf, *j = cache_begin(c, &jbuf);
  if (GMR_LIKELY(j == NULL))
    b = cache_alloc_found(c, p, b, size, orig, split, NULL, true, pred);
  else
    b = cache_alloc_found(c, p, b, size, orig, split, j, true, pred);
  cache_commit(c, cs, j);
  cache_spin_unlock(&cs->lock);
  out->ptr = (void *)b->ptr; /* requested and stream: the runtime's */
  out->size = b->size;
  out->handle = b;
  gmr_assert_expensive(cache_check_now(c) != GMR_EINVAL); /* ENOMEM: host */
  return 0;
slow:
  cache_spin_unlock(&cs->lock);
  return cache_alloc_slow(c, orig, s, out);
}

/* The fast path serves a cached block of the stream under its lock alone:
 * the deferred block taken back, or a block of the free tree; anything else
 * (no fitting block, events pending, a new stream, GC on) takes the global
 * path, which runs the search again: a failed search changes nothing, so
 * the answers are PyTorch's either way. */
/* see Note [Locking], Note [Deferred free] */
static int cache_alloc(gmr_policy_t *self, size_t orig, gmr_stream_t s, gmr_block_t *out) {
  cache_t *c = (cache_t *)self;
  cache_stream_t *cs;
  if (GMR_UNLIKELY(c->global_only ||
                   atomic_load_explicit(&c->n_pending, memory_order_acquire) != 0 ||
                   (cs = cache_stream_find(c, s)) == NULL))
    return cache_alloc_slow(c, orig, s, out);
  cache_spin_lock(&cs->lock);
  size_t size = cache_round_size(c, orig);
  cache_block_t *d = cs->deferred;
  bool mn;
  if (d == NULL || !cache_takes_back(c, d, size, &mn))
    return cache_alloc_cached(c, cs, size, orig, s, out);
  cs->deferred = NULL;
  cache_take_back_figures(c, cs, d, mn, orig);
  d->requested = orig;
  cache_spin_unlock(&cs->lock);
  out->ptr = (void *)d->ptr;
  out->size = d->size;
  out->handle = d;
  gmr_assert_expensive(cache_check_now(c) != GMR_EINVAL); /* ENOMEM: host */
  return 0;
}

/* free(); j NULL on the global path. */
static CACHE_HOT void cache_free_locked(cache_t *c, cache_block_t *b, cache_journal_t *j) {
  int t = cache_stat_type(b->pool);
  b->allocated = false;
  cache_down(j, c->st.allocation, t, 1);
  cache_down(j, c->st.allocated_bytes, t, (int64_t)b->size);
  if (b->size >= c->conf.max_split_size) cache_add(j, &c->st.oversize_allocations, -1, -1);
  if (b->n_uses > 0)
    cache_insert_events(c, b);
  else
    cache_free_block(c, b, j);
}

/* The rest of cache_free: cs->lock held, released here. */
static CACHE_NOINLINE int cache_free_rest(cache_t *c, cache_stream_t *cs, cache_block_t *b) {
  if (GMR_LIKELY(b->n_uses == 0)) {
    if (GMR_LIKELY(c->defer && c->n_streams == 1)) {
      cache_block_t *earlier = cs->deferred; /* applied first: PyTorch's order */
      cs->deferred = b;
      b = earlier;
    }
    if (b != NULL) cache_free_apply(c, cs, b);
    cache_spin_unlock(&cs->lock);
  } else {
    /* Events: the global path (record_stream changed n_uses under it). */
    cache_spin_unlock(&cs->lock);
    cache_lock_all(c);
    cache_free_locked(c, b, NULL);
    cache_unlock_all(c);
  }
  gmr_assert_expensive(cache_check_now(c) != GMR_EINVAL); /* ENOMEM: host */
  return 0;
}

/* see Note [Deferred free] */
static int cache_free(gmr_policy_t *self, const gmr_block_t *blk) {
  cache_t *c = (cache_t *)self;
  cache_block_t *b = blk->handle;
  cache_stream_t *cs = b->pool->stream;
  cache_spin_lock(&cs->lock);
  if (GMR_UNLIKELY(b->n_uses != 0 || !c->defer || c->n_streams != 1 || cs->deferred != NULL))
    return cache_free_rest(c, cs, b);
  cs->deferred = b;
  cache_spin_unlock(&cs->lock);
  gmr_assert_expensive(cache_check_now(c) != GMR_EINVAL); /* ENOMEM: host */
  return 0;
}

static int cache_record_stream_locked(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  cache_t *c = (cache_t *)self;
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
  c->events_seen = true; /* active figures may leave allocation's from now on */
  return 0;
}

static int cache_trim_locked(gmr_policy_t *self) {
  return cache_release_cached((cache_t *)self);
}

/* ---- create and destroy ------------------------------------------------------------------ */

/* The smallest size of each bin of a pool whose bin 0 ends at 2^(base + 1)
 * (cache_bin's inverse): floor[k] <= size < floor[k + 1] iff size is in
 * bin k. */
static void cache_bin_floors(unsigned base, size_t *floor) {
  const unsigned per = 1u << CACHE_BIN_SUB;
  floor[0] = 0;
  for (unsigned k = 1; k < CACHE_BINS; ++k) {
    unsigned raw = k + per - 1, e = base + (raw >> CACHE_BIN_SUB);
    floor[k] = ((size_t)(per + (raw & (per - 1))) << (e - CACHE_BIN_SUB)) + 1;
  }
  floor[CACHE_BINS] = SIZE_MAX;
}

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
        seg_unmap_pages(c, s, first, last, NULL);
        if (last > next_page) next_page = last;
      }
    }
    if (s->expandable)
      gmr__backend_va_release(be, (void *)s->base, s->size);
    else
      gmr__backend_release(be, (void *)s->base, s->size, NULL);
    gmr__free(s);
  }
  for (cache_event_t *e = c->spare_ev, *nx; e; e = nx) {
    nx = e->next;
    gmr__free(e);
  }
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    for (cache_chunk_t *k = cs->chunks, *nx; k; k = nx) {
      nx = k->next;
      cache_block_t *r = chunk_records(k);
      for (int j = 0; j < CACHE_CHUNK; ++j)
        gmr__free(r[j].uses);
      gmr__free(k);
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
  if (gmr__cache_resolve(opts, &conf, why, sizeof why) != 0)
    return gmr__error_set(GMR_ECONFIG, "caching: %s", why);
  cache_t *c = gmr__calloc(1, sizeof *c);
  if (c == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  c->base.ops = &gmr__caching_policy;
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
  c->defer = !c->global_only && !c->conf.expandable;
  for (int i = 0; i < 2; ++i)
    cache_bin_floors(i == 1 ? 9 : 20, c->bin_floor[i]);
  for (int i = 0; i < CACHE_DIV_BUCKETS; ++i)
    if (c->conf.div[i] > 1) c->divisions = true;
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

/* ---- the global path as ops: record_stream, quiesce and resume ---------------------------- */

static int cache_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  cache_lock_all((cache_t *)self);
  int err = cache_record_stream_locked(self, blk, s);
  cache_unlock_all((cache_t *)self);
  return err;
}

/* Quiesced (policy.h, rule 5; see Note [Locking]): every lock held and the fast paths' deltas
 * folded, the deferred frees not applied: the check looks at the state as
 * it stands; every other whole-state op applies them first, below. */
static void cache_quiesce(gmr_policy_t *self) {
  cache_lock_all_as_is((cache_t *)self);
}
static void cache_resume(gmr_policy_t *self) {
  cache_unlock_all((cache_t *)self);
}

static int cache_trim(gmr_policy_t *self) {
  cache_apply_deferred((cache_t *)self);
  return cache_trim_locked(self);
}
static void cache_stats(gmr_policy_t *self, gmr_stats_t *out) {
  cache_apply_deferred((cache_t *)self);
  gmr__cache_stats(self, out);
}
static void cache_reset_peak(gmr_policy_t *self) {
  cache_apply_deferred((cache_t *)self);
  gmr__cache_reset_peak(self);
}
static void cache_reset_accumulated(gmr_policy_t *self) {
  cache_apply_deferred((cache_t *)self);
  gmr__cache_reset_accumulated(self);
}
static int cache_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  cache_apply_deferred((cache_t *)self);
  return gmr__cache_stats_foreach(self, cb, ud);
}
static int cache_summary(gmr_policy_t *self, FILE *out) {
  cache_apply_deferred((cache_t *)self);
  return gmr__cache_summary(self, out);
}
static int cache_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  cache_apply_deferred((cache_t *)self);
  return gmr__cache_walk(self, cb, ud);
}

const gmr_policy_ops_t gmr__caching_policy = {
    .name = "caching",
    .help = "PyTorch's CUDA caching allocator, behaviour for behaviour: 512-byte rounding, "
            "small and large pools, best fit per stream, split and merge, max_split_size, "
            "expandable segments, record_stream, memory_stats() and memory_summary().",
    .opts_size = sizeof(cache_opts_t),
    .opts_default = &gmr__cache_opts_default,
    .opts_desc = gmr__cache_opts_desc,
    .validate = gmr__cache_validate,
    .opts_release = gmr__cache_opts_release,
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
    .check = gmr__cache_check,
    .quiesce = cache_quiesce,
    .resume = cache_resume,
};
