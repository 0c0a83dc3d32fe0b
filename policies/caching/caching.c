/* caching.c: the core of the `caching` policy, PyTorch's CUDA caching allocator.
 *
 * A re-implementation, behaviour for behaviour, of
 * c10/cuda/CUDACachingAllocator.cpp's DeviceCachingAllocator (see
 * docs/caching.md and the specification it follows).  This file holds the
 * alloc and free paths, the deferred free, the global path's locks and
 * folds, create/destroy, quiesce/resume and the ops table; the other rooms
 * are listed in internal.h, Note [Rooms].  Map: Note [What PyTorch does],
 * [Structures], [Invariants], [Locking], [Deferred free].
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "caching/internal.h"

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

/* ---- the global path ---------------------------------------------------------------- */

/* The global path: glock, then every stream's lock in creation order; the
 * fast paths' stat deltas are folded in first.  cache_lock_all then applies
 * every stream's deferred free (see Note [Deferred free]), so the global
 * path sees the state PyTorch would have; the check alone looks at the
 * state as it stands (a deferred block is still allocated there, and every
 * invariant holds). */
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

/* ---- statistic journals: keeping and folding ---------------------------------------- */

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
      (err = gmr__cache_process_events(c)) != 0)
    return err;
  cache_stream_t *cs = gmr__cache_stream(c, s);
  if (GMR_UNLIKELY(cs == NULL)) return GMR_ENOMEM;
  if ((err = gmr__cache_records_reserve(cs, 4)) != 0) return err;
  size_t size = cache_round_size(c, orig);
  cache_pool_t *p = &cs->pools[size <= CACHE_SMALL_SIZE];
  size_t alloc_size = cache_allocation_size(c, size);
  cache_block_t *b = cache_get_free_block(c, p, size);
  if (b == NULL && (err = gmr__cache_alloc_new(c, p, size, alloc_size, &b)) != 0) return err;
  /* The releases and maps above may have used the records reserved at the
   * top (an expandable segment unmapped, then mapped again); a split needs
   * one more.  Should the host refuse it, the whole block is handed out. */
  bool split = cache_should_split(c, p, b, size);
  if (split && gmr__cache_records_reserve(p->stream, 1) != 0) split = false;
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
  if (GMR_UNLIKELY(cs->n_spare == 0) && gmr__cache_records_reserve(cs, 4) != 0) goto slow;
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
  if (GMR_UNLIKELY(atomic_load_explicit(&c->global_only, memory_order_relaxed) ||
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

/* insert_events: one event per recorded stream; the block stays active until
 * all complete.  When an event cannot be recorded, that stream is waited for
 * instead, so the block is never reused early. */
static void cache_insert_events(cache_t *c, cache_block_t *b) {
  for (uint32_t i = 0; i < b->n_uses; ++i) {
    gmr_stream_t s = b->uses[i];
    cache_stream_t *cs = gmr__cache_stream(c, s);
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
  gmr__cache_events_destroy(c);
  for (cache_seg_t *s = c->segs, *nx; s; s = nx) {
    nx = s->next_seg;
    if (s->expandable) {
      gmr__cache_unmap_segment(c, s);
      gmr__backend_va_release(be, (void *)s->base, s->size);
    } else {
      gmr__backend_release(be, (void *)s->base, s->size, NULL);
    }
    gmr__free(s);
  }
  gmr__cache_streams_free(c);
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
  bool gc = c->fraction_set && c->conf.gc_threshold > 0;
  atomic_init(&c->global_only, gc);
  c->defer = !gc && !c->conf.expandable;
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
  int err = gmr__cache_record_stream(self, blk, s);
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

/* setMemoryFraction: allowed_memory_maximum = floor(fraction x total) and
 * set_fraction, from then on (1.0 included), as PyTorch's allocator; so
 * garbage_collection_threshold takes effect from then on too (PyTorch's GC
 * runs when set_fraction and a threshold): every allocation takes the
 * global path and frees are no longer deferred.  Quiesced (every lock
 * held): the deferred frees are applied first; global_only is atomic for
 * the fast path, which reads it before its stream's lock (an allocation
 * that read it just before serves one cached block without the GC's
 * check, as one made a moment earlier would have). */
static void cache_set_fraction(gmr_policy_t *self, double fraction) {
  cache_t *c = (cache_t *)self;
  c->fraction_set = true;
  c->allowed_max = (size_t)(fraction * (double)c->device_total);
  if (c->conf.gc_threshold > 0 && !atomic_load_explicit(&c->global_only, memory_order_relaxed)) {
    cache_apply_deferred(c);
    c->defer = false;
    atomic_store_explicit(&c->global_only, true, memory_order_relaxed);
  }
}

static int cache_trim(gmr_policy_t *self) {
  cache_apply_deferred((cache_t *)self);
  return gmr__cache_release_cached((cache_t *)self);
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
    .set_fraction = cache_set_fraction,
    .resume = cache_resume,
};
