/* bfc.c: the core of the `bfc` policy, TensorFlow's best-fit-with-coalescing allocator.
 *
 * A faithful C version of tsl::BFCAllocator as TF 2.15-2.16 ships it (the
 * [TSL-M] reference of docs/bfc.md), wrapped the way GPUBFCAllocator and
 * XLA's CreateBFCAllocator build it.  Device memory is taken in regions from
 * the backend: greedy mode takes the whole limit in one region at the first
 * allocation; growth mode takes a 2 MiB region, then regions that double.
 * Each region is cut into chunks (multiples of 256 bytes) kept in address
 * order; free chunks live in 21 bins by size class, each bin an AVL tree
 * ordered by (size, address), so best fit with the lowest-address tie-break
 * is one O(log n) descent.  Freed chunks merge with free neighbours at once.
 *
 * When a request fits no free chunk: Extend (a new region, backpedalling by
 * 0.9x while the device refuses, with XLA's strict-progress fix), then
 * garbage collection of wholly free regions and Extend again, then, when
 * allowed, a bounded wait for frees by other threads (10 s by default) and a
 * last attempt that writes TensorFlow's OOM report (report.c, with the summary).
 *
 * Invariants (checked by bfc_check):
 *   for every region R with chunks c_1..c_k (prev/next links):
 *     c_1.ptr = R.ptr,  c_i.ptr + c_i.size = c_{i+1}.ptr,  Σ c_i.size = R.size
 *     no two linked neighbours are both free
 *   a chunk is free  <=>  it is in bin bfc_bin_for(size), and in no other
 *   bins[i] is sorted by (size, ptr); bit i of nonempty <=> bins[i] has chunks
 *   bytes_in_use = Σ sizes of in-use chunks;  pool_bytes = Σ region sizes
 *   VMM mode: at most one region, at va_base, of va_used bytes
 *   pending chunks are in use:  pending_bytes = Σ their sizes,
 *   allocations.current = in-use chunks - pending ones (likewise requested)
 *
 * Streams (gmr's addition; TensorFlow's BFC has one stream).  gmr_record_stream
 * adds a stream to an in-use chunk; its free then records one event per such
 * stream and keeps the chunk in use (`pending`) until every event completes,
 * so no other allocation gets the memory while that work may still touch it,
 * as gmr.h promises and PyTorch's caching allocator does.  Pending chunks are
 * released when an allocation finds their events complete, and synchronized
 * when memory runs out and by empty_cache.  A chunk never given a stream
 * takes none of these paths: single-stream behaviour is TensorFlow's.
 *
 * The retry waits only when waiting can help: while some in-use chunk belongs
 * to a thread that is not itself waiting (it may free it).  When every
 * in-use chunk belongs to a waiting thread, nothing can be freed, and every
 * waiter makes its last try at once instead of sleeping retry_timeout.
 *
 * Synchronization: concurrent.  One mutex (`lock`) guards everything in
 * bfc_t except the immutable configuration; `freed` is signalled after every
 * free while an allocation waits for memory, and the wait releases `lock`.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bfc.h"

/* ---- options ----------------------------------------------------------------- */

enum { BFC_ENV_NONE = 0, BFC_ENV_TENSORFLOW = 1, BFC_ENV_JAX = 2 };
static const char *const bfc_env_names[] = {"none", "tensorflow", "jax", NULL};

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

static atomic_int bfc_failure_logs; /* TF's process-wide kMaxFailureLogs counter */

/* A number per thread, never reused (0: not assigned yet): who holds a chunk. */
static _Atomic uint32_t bfc_threads;
static _Thread_local uint32_t bfc_thread;
static inline uint32_t bfc_thread_id(void) {
  if (GMR_UNLIKELY(bfc_thread == 0)) bfc_thread = atomic_fetch_add(&bfc_threads, 1) + 1;
  return bfc_thread;
}

/* ---- chunk records ------------------------------------------------------------- */

static int bfc_slab_grow(bfc_t *b) {
  bfc_slab_t *s = gmr__malloc(sizeof *s);
  if (s == NULL)
    return gmr__error_set(GMR_ENOMEM, "%s: out of host memory for chunk records", b->name);
  s->next = b->slabs;
  b->slabs = s;
  for (int i = BFC_SLAB - 1; i >= 0; --i) {
    s->chunks[i].handle = b->n_handles + (uint32_t)i;
    s->chunks[i].left = b->chunk_pool;
    b->chunk_pool = &s->chunks[i];
  }
  b->n_handles += BFC_SLAB;
  return 0;
}

/* A fresh free, unbinned record; NULL when the host is out of memory. */
static bfc_chunk_t *bfc_chunk_get(bfc_t *b) {
  if (b->chunk_pool == NULL && bfc_slab_grow(b) != 0) return NULL;
  bfc_chunk_t *c = b->chunk_pool;
  b->chunk_pool = c->left;
  uint32_t h = c->handle;
  memset(c, 0, sizeof *c);
  c->handle = h;
  c->allocation_id = -1;
  c->bin = -1;
  return c;
}

static void bfc_chunk_put(bfc_t *b, bfc_chunk_t *c) {
  c->allocation_id = -1;
  c->bin = -1;
  c->left = b->chunk_pool;
  b->chunk_pool = c;
}

/* ---- bins: AVL trees ordered by (size, ptr) --------------------------------------- */

static inline int avl_h(const bfc_chunk_t *n) {
  return n ? n->height : 0;
}
static inline bool bfc_less(const bfc_chunk_t *a, const bfc_chunk_t *b) {
  return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}
static inline void avl_update(bfc_chunk_t *n) {
  int l = avl_h(n->left), r = avl_h(n->right);
  n->height = (int8_t)(1 + (l > r ? l : r));
}
static bfc_chunk_t *avl_rot_right(bfc_chunk_t *n) {
  bfc_chunk_t *l = n->left;
  n->left = l->right;
  l->right = n;
  avl_update(n);
  avl_update(l);
  return l;
}
static bfc_chunk_t *avl_rot_left(bfc_chunk_t *n) {
  bfc_chunk_t *r = n->right;
  n->right = r->left;
  r->left = n;
  avl_update(n);
  avl_update(r);
  return r;
}
static bfc_chunk_t *avl_balance(bfc_chunk_t *n) {
  avl_update(n);
  int bf = avl_h(n->left) - avl_h(n->right);
  if (bf > 1) {
    if (avl_h(n->left->left) < avl_h(n->left->right)) n->left = avl_rot_left(n->left);
    return avl_rot_right(n);
  }
  if (bf < -1) {
    if (avl_h(n->right->right) < avl_h(n->right->left)) n->right = avl_rot_right(n->right);
    return avl_rot_left(n);
  }
  return n;
}
static bfc_chunk_t *avl_insert(bfc_chunk_t *root, bfc_chunk_t *c) {
  if (root == NULL) {
    c->left = c->right = NULL;
    c->height = 1;
    return c;
  }
  if (bfc_less(c, root))
    root->left = avl_insert(root->left, c);
  else
    root->right = avl_insert(root->right, c);
  return avl_balance(root);
}
static bfc_chunk_t *avl_remove_min(bfc_chunk_t *n, bfc_chunk_t **min) {
  if (n->left == NULL) {
    *min = n;
    return n->right;
  }
  n->left = avl_remove_min(n->left, min);
  return avl_balance(n);
}
static bfc_chunk_t *avl_remove(bfc_chunk_t *n, const bfc_chunk_t *c) {
  if (n == NULL) return NULL;
  if (n == c) {
    if (n->left == NULL) return n->right;
    if (n->right == NULL) return n->left;
    bfc_chunk_t *m;
    bfc_chunk_t *r = avl_remove_min(n->right, &m);
    m->left = n->left;
    m->right = r;
    return avl_balance(m);
  }
  if (bfc_less(c, n))
    n->left = avl_remove(n->left, c);
  else
    n->right = avl_remove(n->right, c);
  return avl_balance(n);
}
/* The first chunk in (size, ptr) order with size >= `size`. */
static bfc_chunk_t *avl_lower_bound(bfc_chunk_t *n, size_t size) {
  bfc_chunk_t *best = NULL;
  while (n != NULL) {
    if (n->size >= size) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}
static bfc_chunk_t *avl_min(bfc_chunk_t *n) {
  while (n && n->left)
    n = n->left;
  return n;
}

static void bfc_bin_insert(bfc_t *b, bfc_chunk_t *c) {
  gmr_assert_internal(c->allocation_id == -1 && c->bin == -1);
  int i = bfc_bin_for(c->size);
  c->bin = (int8_t)i;
  b->bins[i].root = avl_insert(b->bins[i].root, c);
  ++b->bins[i].count;
  ++b->free_chunks;
  b->nonempty |= 1u << i;
}

static void bfc_bin_remove(bfc_t *b, bfc_chunk_t *c) {
  int i = c->bin;
  gmr_assert_internal(i >= 0 && i < BFC_NUM_BINS && b->bins[i].count > 0);
  b->bins[i].root = avl_remove(b->bins[i].root, c);
  if (--b->bins[i].count == 0) b->nonempty &= ~(1u << i);
  --b->free_chunks;
  c->bin = -1;
}

/* Best fit: the smallest free chunk of at least `rounded` bytes, lowest
 * address among equals, as TF's scan of bins from BinNumForSize upward. */
static bfc_chunk_t *bfc_best_fit(bfc_t *b, size_t rounded) {
  int i = bfc_bin_for(rounded);
  bfc_chunk_t *c = avl_lower_bound(b->bins[i].root, rounded);
  if (c != NULL) return c;
  uint32_t higher = b->nonempty & ~((2u << i) - 1);
  return higher ? avl_min(b->bins[__builtin_ctz(higher)].root) : NULL;
}

/* ---- chunks: split and merge ------------------------------------------------------ */

/* Cut `c` (free, unbinned) at `size`; the remainder, in the fresh record
 * `n`, goes to a bin. */
static void bfc_split(bfc_t *b, bfc_chunk_t *c, size_t size, bfc_chunk_t *n) {
  n->ptr = c->ptr + size;
  n->size = c->size - size;
  n->region = c->region;
  n->prev = c;
  n->next = c->next;
  if (c->next) c->next->prev = n;
  c->next = n;
  c->size = size;
  if (c->region->last == c) c->region->last = n;
  bfc_bin_insert(b, n);
}

/* Absorb `n` (= a->next, both free, unbinned) into `a`. */
static void bfc_merge(bfc_t *b, bfc_chunk_t *a, bfc_chunk_t *n) {
  gmr_assert_internal(a->next == n && n->prev == a);
  a->size += n->size;
  a->next = n->next;
  if (n->next) n->next->prev = a;
  if (a->region->last == n) a->region->last = a;
  bfc_chunk_put(b, n);
}

/* TryToCoalesce: absorb a free right neighbour, then be absorbed by a free
 * left one.  Returns the surviving chunk (unbinned). */
static bfc_chunk_t *bfc_coalesce(bfc_t *b, bfc_chunk_t *c) {
  bfc_chunk_t *n = c->next;
  if (n != NULL && n->allocation_id == -1) {
    bfc_bin_remove(b, n);
    bfc_merge(b, c, n);
  }
  bfc_chunk_t *p = c->prev;
  if (p != NULL && p->allocation_id == -1) {
    bfc_bin_remove(b, p);
    bfc_merge(b, p, c);
    c = p;
  }
  return c;
}

/* FindChunkPtr.  Should the host refuse a record for the remainder of a
 * split, the whole chunk is handed out (never observed in practice). */
static bfc_chunk_t *bfc_find_chunk(bfc_t *b, size_t rounded, size_t num_bytes) {
  bfc_chunk_t *c = bfc_best_fit(b, rounded);
  if (c == NULL) return NULL;
  bfc_bin_remove(b, c);
  if (c->size >= rounded * 2 || c->size - rounded >= b->max_frag) {
    bfc_chunk_t *rest = bfc_chunk_get(b);
    if (rest != NULL) bfc_split(b, c, rounded, rest);
  }
  c->requested = num_bytes;
  c->owner = bfc_thread_id();
  c->allocation_id = b->next_allocation_id++;
  ++b->num_allocs;
  b->bytes_in_use += (int64_t)c->size;
  if (b->bytes_in_use > b->peak_bytes_in_use) b->peak_bytes_in_use = b->bytes_in_use;
  if ((int64_t)c->size > b->largest_alloc_size) b->largest_alloc_size = (int64_t)c->size;
  gmr__stat_increase(&b->requested, (int64_t)num_bytes);
  gmr__stat_increase(&b->allocations, 1);
  return c;
}

/* ---- regions ------------------------------------------------------------------------ */

/* Index of the first region with ptr >= p. */
static size_t bfc_region_lower(const bfc_t *b, uintptr_t p) {
  size_t lo = 0, hi = b->n_regions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (b->regions[mid]->ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int bfc_piece_add(bfc_region_t *r, void *ptr, size_t size) {
  if (r->n_pieces == r->cap_pieces) {
    size_t cap = r->cap_pieces ? r->cap_pieces * 2 : 4;
    bfc_piece_t *p = gmr__realloc(r->pieces, cap * sizeof *p);
    if (p == NULL) return GMR_ENOMEM;
    r->pieces = p;
    r->cap_pieces = cap;
  }
  r->pieces[r->n_pieces++] = (bfc_piece_t){ptr, size};
  return 0;
}

/* Give a device range back to the backend (one reserve or one map).  Regions
 * belong to no stream (TensorFlow's allocator has none): device calls pass NULL. */
static void bfc_sub_free(bfc_t *b, void *ptr, size_t size) {
  int err = b->vmm ? gmr__backend_unmap(b->base.backend, ptr, size, NULL)
                   : gmr__backend_release(b->base.backend, ptr, size, NULL);
  if (err != 0)
    gmr__log(GMR_LOG_ERROR, "%s: the device refused to take back %zu bytes at %p: %s", b->name,
             size, ptr, gmr__error_last());
}

/* SubAllocator::Alloc: 0, GMR_ENOMEM (refused), or another device error. */
static int bfc_sub_alloc(bfc_t *b, size_t bytes, void **out, size_t *received) {
  if (!b->vmm) {
    int err = gmr__backend_reserve(b->base.backend, bytes, NULL, out);
    if (err == 0) *received = bytes;
    return err;
  }
  size_t padded = gmr__align_up(bytes, b->base.backend->granularity);
  if (padded > b->va_size - b->va_used)
    return gmr__error_set(GMR_ENOMEM,
                          "%s: OOM in the virtual memory range (%zu of %zu bytes "
                          "mapped, %zu more asked)",
                          b->name, b->va_used, b->va_size, padded);
  void *at = (void *)(b->va_base + b->va_used);
  int err = gmr__backend_map(b->base.backend, at, padded, NULL);
  if (err != 0) return err;
  b->va_used += padded;
  *out = at;
  *received = padded;
  return 0;
}

/* Record a new device range as a region, or as the tail of the region that
 * ends where it starts (coalescing backends).  Its free chunk is binned. */
static int bfc_region_add(bfc_t *b, void *mem, size_t size) {
  uintptr_t p = (uintptr_t)mem;
  bfc_chunk_t *c = bfc_chunk_get(b);
  if (c == NULL) return GMR_ENOMEM;
  c->ptr = p;
  c->size = size;
  size_t i = bfc_region_lower(b, p);
  bfc_region_t *prev = i > 0 ? b->regions[i - 1] : NULL;
  if (b->coalesce && prev != NULL && prev->ptr + prev->size == p) {
    if (bfc_piece_add(prev, mem, size) != 0) goto fail_chunk;
    prev->size += size;
    c->region = prev;
    c->prev = prev->last;
    prev->last->next = c;
    prev->last = c;
    bfc_bin_insert(b, bfc_coalesce(b, c));
    return 0;
  }
  if (b->n_regions == b->cap_regions) {
    size_t cap = b->cap_regions ? b->cap_regions * 2 : 8;
    bfc_region_t **v = gmr__realloc(b->regions, cap * sizeof *v);
    if (v == NULL) goto fail_chunk;
    b->regions = v;
    b->cap_regions = cap;
  }
  bfc_region_t *r = gmr__calloc(1, sizeof *r);
  if (r == NULL) goto fail_chunk;
  if (bfc_piece_add(r, mem, size) != 0) {
    gmr__free(r);
    goto fail_chunk;
  }
  r->ptr = p;
  r->size = size;
  r->first = r->last = c;
  c->region = r;
  memmove(&b->regions[i + 1], &b->regions[i], (b->n_regions - i) * sizeof *b->regions);
  b->regions[i] = r;
  ++b->n_regions;
  bfc_bin_insert(b, c);
  return 0;
fail_chunk:
  bfc_chunk_put(b, c);
  return GMR_ENOMEM;
}

/* Doubling that saturates instead of wrapping to 0 (limits near 2^63). */
static inline size_t bfc_double(size_t n) {
  return n > SIZE_MAX / 2 ? SIZE_MAX : n * 2;
}

/* Extend: one more region of at least `rounded` bytes.  0 on success;
 * GMR_ENOMEM when the limit or the device says no; another code when the
 * device failed otherwise. */
static int bfc_extend(bfc_t *b, size_t rounded) {
  uint64_t avail = b->limit > (uint64_t)b->pool_bytes ? b->limit - (uint64_t)b->pool_bytes : 0;
  avail = avail / BFC_MIN_ALLOC * BFC_MIN_ALLOC;
  if (rounded > avail) return GMR_ENOMEM;
  bool increased = false;
  while (rounded > b->curr_region_bytes) {
    b->curr_region_bytes = bfc_double(b->curr_region_bytes);
    increased = true;
  }
  size_t bytes = b->curr_region_bytes < avail ? b->curr_region_bytes : (size_t)avail;
  void *mem = NULL;
  size_t received = 0;
  int err = bfc_sub_alloc(b, bytes, &mem, &received);
  while (err == GMR_ENOMEM) {
    /* Backpedal by 0.9 (float, as TF), with XLA's strict-progress fix. */
    size_t next = bfc_rounded((size_t)((float)bytes * BFC_BACKPEDAL));
    if (next >= bytes) next = bytes - BFC_MIN_ALLOC;
    bytes = next;
    if (bytes < rounded) return GMR_ENOMEM;
    err = bfc_sub_alloc(b, bytes, &mem, &received);
  }
  if (err != 0) return err;
  if (!increased) b->curr_region_bytes = bfc_double(b->curr_region_bytes);
  if (bfc_region_add(b, mem, received) != 0) {
    if (b->vmm) b->va_used -= received;
    bfc_sub_free(b, mem, received);
    return gmr__error_set(GMR_ENOMEM, "%s: out of host memory for a region", b->name);
  }
  b->pool_bytes += (int64_t)received;
  if (b->pool_bytes > b->peak_pool_bytes) b->peak_pool_bytes = b->pool_bytes;
  return 0;
}

static inline bool bfc_region_free(const bfc_region_t *r) {
  return r->first->allocation_id == -1 && r->first->size == r->size;
}

static void bfc_region_release(bfc_t *b, size_t i) {
  bfc_region_t *r = b->regions[i];
  bfc_bin_remove(b, r->first);
  bfc_chunk_put(b, r->first);
  for (size_t k = r->n_pieces; k-- > 0;)
    bfc_sub_free(b, r->pieces[k].ptr, r->pieces[k].size);
  if (b->vmm && r->ptr + r->size == b->va_base + b->va_used) b->va_used = r->ptr - b->va_base;
  b->pool_bytes -= (int64_t)r->size;
  memmove(&b->regions[i], &b->regions[i + 1], (b->n_regions - i - 1) * sizeof *b->regions);
  --b->n_regions;
  gmr__free(r->pieces);
  gmr__free(r);
}

/* DeallocateFreeRegions.  `force` (empty_cache) skips the option and the
 * rough estimate.  Returns true when some region was given back. */
static bool bfc_free_regions(bfc_t *b, size_t rounded, bool force) {
  if (!force && !b->gc) return false;
  uint64_t total_free = 0;
  for (size_t i = 0; i < b->n_regions; ++i)
    if (bfc_region_free(b->regions[i])) total_free += b->regions[i]->size;
  if (total_free == 0) return false;
  if (!force && (int64_t)rounded > (int64_t)b->limit - b->pool_bytes + (int64_t)total_free)
    return false;
  if (!force) b->gc_to_log = true; /* logged once the lock is released */
  for (size_t i = b->n_regions; i-- > 0;)
    if (bfc_region_free(b->regions[i])) bfc_region_release(b, i);
  return true;
}

/* AllocateRawInternal without the report.  NULL with *err = 0 when nothing
 * fits; *err < 0 when the device or the host failed. */
static bfc_chunk_t *bfc_try(bfc_t *b, size_t num_bytes, size_t rounded, int *err) {
  *err = 0;
  bfc_chunk_t *c = bfc_find_chunk(b, rounded, num_bytes);
  if (c != NULL) return c;
  int e = bfc_extend(b, rounded);
  if (e == 0) return bfc_find_chunk(b, rounded, num_bytes);
  if (e != GMR_ENOMEM) return (*err = e), NULL;
  if (!bfc_free_regions(b, rounded, false)) return NULL;
  ++b->retries;
  e = bfc_extend(b, rounded);
  if (e == 0) return bfc_find_chunk(b, rounded, num_bytes);
  if (e != GMR_ENOMEM) *err = e;
  return NULL;
}

static int bfc_check_locked(bfc_t *b);

/* ---- stream uses ---------------------------------------------------------------------- */

/* DeallocateRawInternal after the user's free: the chunk goes back to the
 * bins (its statistics of allocations and requested bytes already fell). */
static void bfc_release(bfc_t *b, bfc_chunk_t *c) {
  c->allocation_id = -1;
  b->bytes_in_use -= (int64_t)c->size;
  bfc_bin_insert(b, bfc_coalesce(b, c));
  if (b->waiters > 0) pthread_cond_broadcast(&b->freed);
}

/* Release the pending chunks whose events are complete (all of them, after
 * waiting for their work, when `sync`).  Returns true when one was released. */
static bool bfc_process_pending(bfc_t *b, bool sync) {
  gmr_backend_t *be = b->base.backend;
  bool released = false;
  bfc_pending_t **link = &b->pending, *last = NULL;
  while (*link != NULL) {
    bfc_pending_t *e = *link;
    bool done = true;
    for (size_t i = 0; i < e->n && done; ++i) {
      if (sync) gmr__backend_event_sync(be, e->events[i]);
      done = gmr__backend_event_query(be, e->events[i]) != 1; /* an error: given up on */
    }
    if (!done) {
      last = e;
      link = &e->next;
      continue;
    }
    *link = e->next;
    for (size_t i = 0; i < e->n; ++i)
      gmr__backend_event_destroy(be, e->events[i]);
    bfc_chunk_t *c = e->chunk;
    c->pending = 0;
    b->pending_bytes -= (int64_t)c->size;
    --b->n_pending;
    bfc_release(b, c);
    gmr__free(e);
    released = true;
  }
  b->pending_tail = last;
  return released;
}

/* The user's free of a chunk used on other streams: an event on each, and the
 * chunk stays in use until they complete.  When the host refuses memory for
 * that, or an event cannot be recorded, the stream (or the device) is
 * synchronized instead: slower, never unsafe. */
static void bfc_free_used_elsewhere(bfc_t *b, bfc_chunk_t *c) {
  gmr_backend_t *be = b->base.backend;
  bfc_uses_t *u = c->uses;
  size_t n = u ? u->n : 0;
  bfc_pending_t *e = n ? gmr__malloc(sizeof *e + n * sizeof e->events[0]) : NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (e == NULL || gmr__backend_event_record(be, u->streams[i], &e->events[k]) != 0)
      gmr__backend_stream_sync(be, u->streams[i]);
    else
      ++k;
  }
  if (c->sync_on_free) gmr__backend_device_sync(be);
  gmr__free(u);
  c->uses = NULL;
  c->sync_on_free = 0;
  if (k == 0) {
    gmr__free(e);
    bfc_release(b, c);
    return;
  }
  e->next = NULL;
  e->chunk = c;
  e->n = k;
  if (b->pending_tail) {
    b->pending_tail->next = e;
  } else {
    bfc_pending_t *t = b->pending;
    while (t && t->next)
      t = t->next;
    if (t)
      t->next = e;
    else
      b->pending = e;
  }
  b->pending_tail = e;
  c->pending = 1;
  b->pending_bytes += (int64_t)c->size;
  ++b->n_pending;
}

/* The calling thread joins (or leaves) the threads waiting for frees. */
static int bfc_waiting_add(bfc_t *b) {
  if (b->n_waiting == b->cap_waiting) {
    size_t cap = b->cap_waiting ? b->cap_waiting * 2 : 16;
    uint32_t *v = gmr__realloc(b->waiting, cap * sizeof *v);
    if (v == NULL) return GMR_ENOMEM; /* then it does not wait */
    b->waiting = v;
    b->cap_waiting = cap;
  }
  b->waiting[b->n_waiting++] = bfc_thread_id();
  return 0;
}
static void bfc_waiting_remove(bfc_t *b) {
  uint32_t me = bfc_thread_id();
  for (size_t i = 0; i < b->n_waiting; ++i)
    if (b->waiting[i] == me) {
      b->waiting[i] = b->waiting[--b->n_waiting];
      return;
    }
}

/* Can waiting for frees help?  Only when some in-use chunk is held by a
 * thread that is not waiting too (pending chunks are synchronized before any
 * wait).  Costs one pass over the chunks, on the OOM path only. */
static bool bfc_wait_can_help(const bfc_t *b) {
  if (b->exclusive) return false;
  for (size_t i = 0; i < b->n_regions; ++i)
    for (const bfc_chunk_t *c = b->regions[i]->first; c; c = c->next) {
      if (c->allocation_id == -1 || c->pending) continue;
      bool waiting = false;
      for (size_t w = 0; w < b->n_waiting && !waiting; ++w)
        waiting = b->waiting[w] == c->owner;
      if (!waiting) return true;
    }
  return false;
}

static int bfc_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  bfc_t *b = (bfc_t *)self;
  bfc_chunk_t *c = blk->handle;
  if (s == blk->stream) return 0;
  pthread_mutex_lock(&b->lock);
  if (GMR_UNLIKELY(c == NULL || c->allocation_id == -1 || c->pending ||
                   c->ptr != (uintptr_t)blk->ptr)) {
    pthread_mutex_unlock(&b->lock);
    return gmr__error_set(GMR_EBADPTR, "%s: %p is not the start of a live chunk", b->name,
                          blk->ptr);
  }
  bfc_uses_t *u = c->uses;
  bool known = false;
  for (size_t i = 0; u && i < u->n && !known; ++i)
    known = u->streams[i] == s;
  if (!known) {
    if (u == NULL || u->n == u->cap) {
      size_t cap = u ? u->cap * 2 : 2;
      bfc_uses_t *v = gmr__realloc(u, sizeof *v + cap * sizeof v->streams[0]);
      if (v == NULL) {
        c->sync_on_free = 1; /* the free synchronizes the device instead */
      } else {
        if (u == NULL) v->n = 0;
        v->cap = cap;
        c->uses = u = v;
      }
    }
    if (u != NULL && u->n < u->cap) u->streams[u->n++] = s;
  }
  pthread_mutex_unlock(&b->lock);
  return 0;
}

/* ---- policy ops ----------------------------------------------------------------------- */

static uint64_t bfc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bfc_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  bfc_t *b = (bfc_t *)self;
  (void)s;
  size_t rounded = bfc_rounded(size);
  pthread_mutex_lock(&b->lock);
  if (GMR_UNLIKELY(b->pending != NULL)) bfc_process_pending(b, false);
  int err = 0;
  bfc_chunk_t *c = bfc_try(b, size, rounded, &err);
  /* Memory held only by other streams' work: wait for that work, try again. */
  if (c == NULL && err == 0 && b->pending != NULL && bfc_process_pending(b, true))
    c = bfc_try(b, size, rounded, &err);
  double waited_s = 0;
  if (c == NULL && err == 0 && b->retry) {
    /* AllocatorRetry: wait for frees until the deadline, then a last try. */
    ++b->retries;
    uint64_t start = bfc_now_ns(), deadline = start + b->retry_ns;
    int werr = bfc_waiting_add(b);
    /* This thread now waits: the others re-check whether anyone can free. */
    if (b->waiters > 0) pthread_cond_broadcast(&b->freed);
    uint64_t stalemate = b->stalemates;
    for (;;) {
      uint64_t now = bfc_now_ns();
      bool stuck = b->stalemates != stalemate || werr != 0 || !bfc_wait_can_help(b);
      if (stuck && b->stalemates == stalemate && werr == 0) {
        /* Every holder of memory waits: none will free.  All waiters now
         * give up together (one leaving does not make the others' wait
         * useful: it returns an error, not memory). */
        ++b->stalemates;
        if (b->waiters > 0) pthread_cond_broadcast(&b->freed);
      }
      if (now >= deadline || stuck) {
        c = bfc_try(b, size, rounded, &err);
        break;
      }
      struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
      ++b->waiters;
      pthread_cond_timedwait(&b->freed, &b->lock, &ts);
      --b->waiters;
      c = bfc_try(b, size, rounded, &err);
      if (c != NULL || err != 0) break;
    }
    if (werr == 0) bfc_waiting_remove(b);
    waited_s = (double)(bfc_now_ns() - start) / 1e9;
  }
  /* What to log, decided under the lock and written after it (a log
   * callback may call back into the runtime). */
  bool log_gc = b->gc_to_log, log_fail = false;
  b->gc_to_log = false;
  if (c == NULL && err == 0) {
    ++b->ooms;
    err = gmr__bfc_oom(b, size, rounded);
    log_fail = b->retry || atomic_fetch_add(&bfc_failure_logs, 1) < BFC_MAX_FAILURE_LOGS;
  }
  if (c != NULL) {
    *out = (gmr_block_t){.ptr = (void *)c->ptr, .size = c->size, .handle = c};
    gmr_assert_expensive(bfc_check_locked(b) == 0);
  }
  pthread_mutex_unlock(&b->lock);
  if (log_gc)
    gmr__log(GMR_LOG_WARN,
             "Garbage collection: deallocate free memory regions (i.e., allocations) so that we "
             "can re-allocate a larger region to avoid OOM due to memory fragmentation. If you "
             "see this message frequently, you are running near the threshold of the available "
             "device memory and re-allocation may incur great performance overhead. You may try "
             "smaller batch sizes to observe the performance impact. Set "
             "TF_ENABLE_GPU_GARBAGE_COLLECTION=false if you'd like to disable this feature.");
  if (log_fail) {
    char h[32];
    gmr__bfc_hr((int64_t)size, h, sizeof h);
    if (b->retry)
      gmr__log(GMR_LOG_WARN,
               "Allocator (%s) ran out of memory trying to allocate %s (rounded to %zu) after "
               "waiting %.3f s for memory to be freed",
               b->name, h, rounded, waited_s);
    else
      gmr__log(GMR_LOG_WARN,
               "Allocator (%s) ran out of memory trying to allocate %s with freed_by_count=0.",
               b->name, h);
  }
  return c != NULL ? 0 : err;
}

static void bfc_set_exclusive(gmr_policy_t *self, int exclusive) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  b->exclusive = exclusive != 0;
  pthread_mutex_unlock(&b->lock);
}

static int bfc_free(gmr_policy_t *self, const gmr_block_t *blk) {
  bfc_t *b = (bfc_t *)self;
  bfc_chunk_t *c = blk->handle;
  pthread_mutex_lock(&b->lock);
  if (GMR_UNLIKELY(c == NULL || c->allocation_id == -1 || c->pending ||
                   c->ptr != (uintptr_t)blk->ptr)) {
    pthread_mutex_unlock(&b->lock);
    return gmr__error_set(GMR_EBADPTR, "%s: %p is not the start of a live chunk", b->name,
                          blk->ptr);
  }
  gmr__stat_decrease(&b->requested, (int64_t)c->requested);
  gmr__stat_decrease(&b->allocations, 1);
  ++b->num_frees;
  if (GMR_UNLIKELY(c->uses != NULL || c->sync_on_free))
    bfc_free_used_elsewhere(b, c);
  else
    bfc_release(b, c);
  gmr_assert_expensive(bfc_check_locked(b) == 0);
  pthread_mutex_unlock(&b->lock);
  return 0;
}

static int bfc_trim(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  if (b->pending != NULL) bfc_process_pending(b, true); /* as PyTorch's empty_cache */
  bfc_free_regions(b, 0, true);
  pthread_mutex_unlock(&b->lock);
  return 0;
}

static void bfc_stats(gmr_policy_t *self, gmr_stats_t *st) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  st->allocated_bytes = (uint64_t)(b->bytes_in_use - b->pending_bytes);
  st->active_bytes = (uint64_t)b->bytes_in_use; /* pending frees included */
  st->peak_allocated_bytes = st->peak_active_bytes = (uint64_t)b->peak_bytes_in_use;
  st->requested_bytes = (uint64_t)b->requested.current;
  st->peak_requested_bytes = (uint64_t)b->requested.peak;
  st->allocations = (uint64_t)b->allocations.current;
  st->peak_allocations = (uint64_t)b->allocations.peak;
  st->num_allocs = (uint64_t)b->num_allocs;
  st->num_frees = b->num_frees;
  st->ooms = b->ooms;
  st->alloc_retries = b->retries;
  st->largest_free_block = bfc_largest_free(b);
  st->limit_bytes = b->limit;
  pthread_mutex_unlock(&b->lock);
}

/* ClearStats() is reset_peak + reset_accumulated. */
static void bfc_reset_peak(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  b->peak_bytes_in_use = b->bytes_in_use;
  b->largest_alloc_size = 0;
  b->peak_pool_bytes = b->pool_bytes;
  gmr__stat_reset_peak(&b->requested);
  gmr__stat_reset_peak(&b->allocations);
  pthread_mutex_unlock(&b->lock);
}

static void bfc_reset_accumulated(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  b->num_allocs = 0;
  b->num_frees = b->ooms = b->retries = 0;
  gmr__stat_reset_accumulated(&b->requested);
  gmr__stat_reset_accumulated(&b->allocations);
  pthread_mutex_unlock(&b->lock);
}

enum { BFC_N_KEYS = 16 };
typedef struct bfc_kv_s {
  const char *key;
  int64_t value;
} bfc_kv_t;

static int bfc_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  bfc_t *b = (bfc_t *)self;
  bfc_kv_t kv[BFC_N_KEYS];
  int n = 0;
  pthread_mutex_lock(&b->lock);
  int64_t largest = (int64_t)bfc_largest_free(b), free_b = b->pool_bytes - b->bytes_in_use;
#define KV(k, v) kv[n++] = (bfc_kv_t){k, (int64_t)(v)}
  KV("num_allocs", b->num_allocs);
  KV("bytes_in_use", b->bytes_in_use);
  KV("peak_bytes_in_use", b->peak_bytes_in_use);
  KV("largest_alloc_size", b->largest_alloc_size);
  KV("bytes_limit", b->limit);
  KV("bytes_reserved", 0);
  KV("peak_bytes_reserved", 0);
  KV("largest_free_block_bytes", largest);
  KV("pool_bytes", b->pool_bytes);
  KV("peak_pool_bytes", b->peak_pool_bytes);
  /* GetFragmentation() in parts per million; 0 when nothing is free. */
  KV("fragmentation_metric_ppm",
     free_b > 0 ? llround(1e6 * (double)(free_b - largest) / (double)free_b) : 0);
  KV("curr_region_allocation_bytes", b->curr_region_bytes);
  KV("regions", b->n_regions);
  KV("free_chunks", b->free_chunks);
  KV("num_frees", b->num_frees);
  KV("ooms", b->ooms);
#undef KV
  pthread_mutex_unlock(&b->lock);
  for (int i = 0; i < n; ++i)
    if (cb(kv[i].key, kv[i].value, ud) != 0) break;
  return 0;
}

static int bfc_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  int stop = 0;
  for (size_t i = 0; i < b->n_regions && !stop; ++i) {
    const bfc_region_t *r = b->regions[i];
    gmr_walk_entry_t e = {.is_segment = 1,
                          .address = r->ptr,
                          .size = r->size,
                          .pool = "region",
                          .is_expandable = b->vmm};
    stop = cb(&e, ud);
    for (const bfc_chunk_t *c = r->first; c && !stop; c = c->next) {
      bool used = c->allocation_id != -1;
      gmr_walk_entry_t k = {.address = c->ptr,
                            .size = c->size,
                            .requested = used ? c->requested : 0,
                            .state = c->pending ? GMR_BLOCK_PENDING_FREE
                                     : used     ? GMR_BLOCK_ALLOCATED
                                                : GMR_BLOCK_FREE,
                            .pool = "region"};
      stop = cb(&k, ud);
    }
  }
  pthread_mutex_unlock(&b->lock);
  return 0;
}

/* ---- invariant walker -------------------------------------------------------------- */

#define BFC_CHECK(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) return gmr__error_set(GMR_EINVAL, __VA_ARGS__);                                   \
  } while (0)

/* In-order walk of one bin: sorted, balanced, in its size class. */
static int bfc_check_tree(const bfc_chunk_t *n, int bin, const bfc_chunk_t **prev, size_t *count,
                          int *height) {
  if (n == NULL) return (*height = 0), 0;
  int hl, hr, err;
  if ((err = bfc_check_tree(n->left, bin, prev, count, &hl)) != 0) return err;
  BFC_CHECK(*prev == NULL || bfc_less(*prev, n), "bfc: bin %d is not sorted at chunk %#llx", bin,
            (unsigned long long)n->ptr);
  BFC_CHECK(n->allocation_id == -1 && n->bin == bin && bfc_bin_for(n->size) == bin,
            "bfc: chunk %#llx of %zu bytes is in bin %d but belongs to bin %d (in use: %d)",
            (unsigned long long)n->ptr, n->size, bin, bfc_bin_for(n->size), n->allocation_id != -1);
  *prev = n;
  ++*count;
  if ((err = bfc_check_tree(n->right, bin, prev, count, &hr)) != 0) return err;
  BFC_CHECK(hl - hr <= 1 && hr - hl <= 1 && n->height == 1 + (hl > hr ? hl : hr),
            "bfc: bin %d tree is unbalanced at chunk %#llx", bin, (unsigned long long)n->ptr);
  *height = n->height;
  return 0;
}

static int bfc_check_locked(bfc_t *b) {
  size_t binned = 0;
  for (int i = 0; i < BFC_NUM_BINS; ++i) {
    const bfc_chunk_t *prev = NULL;
    size_t count = 0;
    int h, err = bfc_check_tree(b->bins[i].root, i, &prev, &count, &h);
    if (err != 0) return err;
    BFC_CHECK(count == b->bins[i].count, "bfc: bin %d holds %zu chunks but counts %zu", i, count,
              b->bins[i].count);
    BFC_CHECK(((b->nonempty >> i) & 1) == (count > 0),
              "bfc: the non-empty mask is wrong for bin %d", i);
    binned += count;
  }
  BFC_CHECK(binned == b->free_chunks, "bfc: %zu chunks in bins, %zu counted", binned,
            b->free_chunks);
  int64_t pool = 0, in_use = 0, n_used = 0, req = 0, pend = 0;
  size_t n_pend = 0;
  size_t n_free = 0;
  for (size_t i = 0; i < b->n_regions; ++i) {
    const bfc_region_t *r = b->regions[i];
    BFC_CHECK(i == 0 || b->regions[i - 1]->ptr + b->regions[i - 1]->size <= r->ptr,
              "bfc: regions %zu and %zu overlap or are out of order", i - 1, i);
    BFC_CHECK(r->first && r->first->ptr == r->ptr && r->first->prev == NULL,
              "bfc: region %#llx does not start with its first chunk", (unsigned long long)r->ptr);
    size_t sum = 0, pieces = 0;
    for (size_t k = 0; k < r->n_pieces; ++k)
      pieces += r->pieces[k].size;
    BFC_CHECK(pieces == r->size, "bfc: region %#llx is %zu bytes but its pieces add to %zu",
              (unsigned long long)r->ptr, r->size, pieces);
    const bfc_chunk_t *c = r->first, *last = NULL;
    for (; c; last = c, c = c->next) {
      BFC_CHECK(c->region == r && c->size > 0 && c->size % BFC_MIN_ALLOC == 0,
                "bfc: chunk %#llx has a bad size %zu or region", (unsigned long long)c->ptr,
                c->size);
      BFC_CHECK(c->ptr == r->ptr + sum, "bfc: chunk %#llx is not at region offset %zu",
                (unsigned long long)c->ptr, sum);
      BFC_CHECK(c->next == NULL || c->next->prev == c, "bfc: broken links after chunk %#llx",
                (unsigned long long)c->ptr);
      bool used = c->allocation_id != -1;
      BFC_CHECK(used || !c->next || c->next->allocation_id != -1,
                "bfc: adjacent free chunks at %#llx and %#llx", (unsigned long long)c->ptr,
                (unsigned long long)c->next->ptr);
      BFC_CHECK(used ? c->bin == -1 : c->bin == bfc_bin_for(c->size),
                "bfc: chunk %#llx (in use: %d) has bin %d", (unsigned long long)c->ptr, used,
                c->bin);
      if (used && c->pending) {
        ++n_pend;
        pend += (int64_t)c->size;
        in_use += (int64_t)c->size;
      } else if (used) {
        BFC_CHECK(c->uses == NULL || c->uses->n <= c->uses->cap,
                  "bfc: chunk %#llx has a bad stream list", (unsigned long long)c->ptr);
        ++n_used;
        in_use += (int64_t)c->size;
        req += (int64_t)c->requested;
        BFC_CHECK(c->requested > 0 && c->requested <= c->size,
                  "bfc: chunk %#llx holds %zu requested bytes in %zu", (unsigned long long)c->ptr,
                  c->requested, c->size);
      } else {
        ++n_free;
      }
      sum += c->size;
    }
    BFC_CHECK(sum == r->size && last == r->last,
              "bfc: the chunks of region %#llx add to %zu bytes, not %zu",
              (unsigned long long)r->ptr, sum, r->size);
    pool += (int64_t)r->size;
  }
  BFC_CHECK(n_free == binned, "bfc: %zu free chunks in regions, %zu in bins", n_free, binned);
  BFC_CHECK(pool == b->pool_bytes, "bfc: regions add to %lld bytes, pool_bytes is %lld",
            (long long)pool, (long long)b->pool_bytes);
  BFC_CHECK(in_use == b->bytes_in_use && n_used == b->allocations.current &&
                req == b->requested.current,
            "bfc: %lld chunks of %lld bytes (%lld requested) in use, stats say %lld of %lld (%lld)",
            (long long)n_used, (long long)in_use, (long long)req, (long long)b->allocations.current,
            (long long)b->bytes_in_use, (long long)b->requested.current);
  BFC_CHECK(b->peak_bytes_in_use >= b->bytes_in_use, "bfc: peak below current");
  size_t listed = 0;
  for (const bfc_pending_t *e = b->pending; e; e = e->next, ++listed)
    BFC_CHECK(e->chunk->pending && e->chunk->allocation_id != -1 && e->n > 0,
              "bfc: pending entry %zu names chunk %#llx, which is not pending", listed,
              (unsigned long long)e->chunk->ptr);
  BFC_CHECK(listed == n_pend && n_pend == b->n_pending && pend == b->pending_bytes,
            "bfc: %zu pending chunks of %lld bytes, %zu listed, counts say %zu of %lld", n_pend,
            (long long)pend, listed, b->n_pending, (long long)b->pending_bytes);
  if (b->vmm)
    BFC_CHECK(b->n_regions <= 1 && (b->n_regions == 0 || (b->regions[0]->ptr == b->va_base &&
                                                          b->regions[0]->size == b->va_used)),
              "bfc: the VMM range is not one region at its base");
  return 0;
}

static int bfc_check(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  pthread_mutex_lock(&b->lock);
  int err = bfc_check_locked(b);
  pthread_mutex_unlock(&b->lock);
  return err;
}

/* ---- construction ---------------------------------------------------------------- */

/* MinSystemMemory of TF's gpu_device.cc for compute capability 9.x (the
 * backends do not report it; see docs/bfc.md). */
static uint64_t bfc_min_system_memory(uint64_t available) {
  return available < ((uint64_t)2 << 30) ? (uint64_t)225 << 20 : (uint64_t)1800 << 20;
}

/* ---- the environment (applied by the config layer: `env` in the table) ------------ */

/* The allocator's name in messages: allocator_name, else GPU_<device>_bfc. */
static void bfc_name(const bfc_opts_t *o, int device, char *buf, size_t len) {
  if (o->name != NULL && o->name[0] != '\0')
    snprintf(buf, len, "%s", o->name);
  else
    snprintf(buf, len, "GPU_%d_bfc", device);
}

/* TF's "true"/"false" environment booleans (case-sensitive); -1 unset, -2 bad. */
static int bfc_env_bool(const char *v) {
  if (v == NULL) return -1;
  if (strcmp(v, "true") == 0) return 1;
  if (strcmp(v, "false") == 0) return 0;
  return -2;
}

/* allow_growth: TF_FORCE_GPU_ALLOW_GROWTH (environment: tensorflow), or
 * XLA_PYTHON_CLIENT_PREALLOCATE (environment: jax; false or 0: grow). */
static int bfc_env_growth(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  (void)device, (void)err, (void)len;
  if (o->environment == BFC_ENV_TENSORFLOW) {
    int g = bfc_env_bool(v[0]);
    if (g == -2)
      gmr__log(GMR_LOG_ERROR,
               "The TF_FORCE_GPU_ALLOW_GROWTH environment variable is set but could not be "
               "parsed: \"%s\". Valid values are \"true\" or \"false\". Using original config "
               "value of %s.",
               v[0], o->allow_growth ? "true" : "false");
    if (g >= 0 && (g == 1) != o->allow_growth)
      gmr__log(GMR_LOG_WARN,
               "Overriding orig_value setting because the TF_FORCE_GPU_ALLOW_GROWTH environment "
               "variable is set. Original config value was %s.",
               o->allow_growth ? "true" : "false");
    if (g >= 0) o->allow_growth = g == 1;
  } else if (o->environment == BFC_ENV_JAX && v[1] != NULL) {
    char low[16] = "";
    size_t i = 0;
    for (; v[1][i] && i < sizeof low - 1; ++i)
      low[i] = (char)(v[1][i] >= 'A' && v[1][i] <= 'Z' ? v[1][i] + 32 : v[1][i]);
    low[i] = '\0';
    o->allow_growth = strcmp(low, "false") == 0 || strcmp(low, "0") == 0;
  }
  return 0;
}

/* garbage_collection: TF_ENABLE_GPU_GARBAGE_COLLECTION (environment: tensorflow). */
static int bfc_env_gc(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  (void)device, (void)err, (void)len;
  if (o->environment != BFC_ENV_TENSORFLOW) return 0;
  int gc = bfc_env_bool(v[0]);
  if (gc == -2)
    gmr__log(GMR_LOG_ERROR,
             "The TF_ENABLE_GPU_GARBAGE_COLLECTION environment variable is set but could not "
             "be parsed: \"%s\". Valid values are \"true\" or \"false\". Using true.",
             v[0]);
  if (gc != -1) o->garbage_collection = gc != 0;
  return 0;
}

/* memory_fraction: XLA_CLIENT_MEM_FRACTION, or its old name
 * XLA_PYTHON_CLIENT_MEM_FRACTION (environment: jax); it replaces the other
 * limit options. */
static int bfc_env_fraction(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  if (o->environment != BFC_ENV_JAX) return 0;
  char name[128];
  bfc_name(o, device, name, sizeof name);
  if (v[0] && v[1]) {
    snprintf(err, len,
             "%s: both XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are set; set "
             "only XLA_CLIENT_MEM_FRACTION",
             name);
    return GMR_ECONFIG;
  }
  const char *f = v[0] ? v[0] : v[1];
  double x = 0;
  if (gmr__parse_double(f, &x) != 0 || !(x > 0) || x > 1) {
    snprintf(err, len, "%s: %s=\"%s\" is not a fraction in (0, 1]", name,
             v[0] ? "XLA_CLIENT_MEM_FRACTION" : "XLA_PYTHON_CLIENT_MEM_FRACTION", f);
    return GMR_ECONFIG;
  }
  o->memory_fraction = x;
  o->memory_limit = 0;
  o->per_process_fraction = 0;
  return 0;
}

static int bfc_validate(void *opts, char *err, size_t len) {
  bfc_opts_t *o = opts;
  int n = (o->memory_limit != 0) + (o->per_process_fraction != 0) + (o->memory_fraction != 0);
  if (n > 1) {
    snprintf(err, len,
             "give at most one of 'memory_limit', 'per_process_gpu_memory_fraction' "
             "and 'memory_fraction'");
    return GMR_ECONFIG;
  }
  return 0;
}

static void bfc_opts_release(void *opts) {
  bfc_opts_t *o = opts;
  gmr__free(o->name);
  o->name = NULL;
}

static void bfc_destroy(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  for (bfc_pending_t *e = b->pending, *next; e; e = next) {
    next = e->next;
    for (size_t i = 0; i < e->n; ++i)
      gmr__backend_event_destroy(self->backend, e->events[i]);
    gmr__free(e);
  }
  gmr__free(b->waiting);
  for (size_t i = 0; i < b->n_regions; ++i) {
    bfc_region_t *r = b->regions[i];
    for (bfc_chunk_t *c = r->first; c; c = c->next)
      gmr__free(c->uses);
    for (size_t k = r->n_pieces; k-- > 0;)
      bfc_sub_free(b, r->pieces[k].ptr, r->pieces[k].size);
    gmr__free(r->pieces);
    gmr__free(r);
  }
  if (b->vmm && b->va_size) gmr__backend_va_release(self->backend, (void *)b->va_base, b->va_size);
  gmr__free(b->regions);
  for (bfc_slab_t *s = b->slabs, *next; s; s = next) {
    next = s->next;
    gmr__free(s);
  }
  pthread_cond_destroy(&b->freed);
  pthread_mutex_destroy(&b->lock);
  gmr__free(b);
}

static int bfc_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                      gmr_policy_t **out) {
  (void)upstream;
  bfc_opts_t o = *(const bfc_opts_t *)opts; /* the environment already applied */
  char name[128];
  bfc_name(&o, be->device, name, sizeof name);
  size_t free_b = 0, total = 0;
  int err = gmr__backend_mem_info(be, &free_b, &total);
  if (err != 0) return err;
  uint64_t limit;
  if (o.memory_limit != 0)
    limit = o.memory_limit;
  else if (o.per_process_fraction != 0)
    limit = (uint64_t)((double)total * o.per_process_fraction);
  else if (o.memory_fraction != 0)
    limit = (uint64_t)((double)total * o.memory_fraction);
  else {
    uint64_t min_sys = bfc_min_system_memory(free_b);
    limit = min_sys < free_b ? free_b - min_sys : free_b;
  }
  if (o.vmm && !gmr__backend_has_vmm(be))
    return gmr__error_set(GMR_ENOTSUP,
                          "%s: vmm: the %s backend cannot map pages into a "
                          "reserved virtual range",
                          name, be->ops->name);

  bfc_t *b = gmr__calloc(1, sizeof *b);
  if (b == NULL) return gmr__error_set(GMR_ENOMEM, "%s: out of host memory", name);
  b->base.ops = &gmr_bfc_policy_ops;
  b->base.backend = be;
  snprintf(b->name, sizeof b->name, "%s", name);
  b->limit = limit;
  b->max_frag = o.fragmentation_fraction > 0 ? (size_t)(o.fragmentation_fraction * (double)limit)
                                             : BFC_MAX_FRAG_DEFAULT;
  b->gc = o.garbage_collection;
  b->retry = o.allow_retry_on_failure;
  b->retry_ns = (uint64_t)(o.retry_timeout * 1e9);
  b->vmm = o.vmm;
  b->coalesce = o.coalesce_regions || o.vmm;
  uint64_t first =
      o.allow_growth ? (limit < ((uint64_t)2 << 20) ? limit : (uint64_t)2 << 20) : limit;
  b->curr_region_bytes = bfc_rounded((size_t)first);
  if (b->curr_region_bytes == 0) b->curr_region_bytes = BFC_MIN_ALLOC;
  b->next_allocation_id = 1;
  err = GMR_ENOMEM;
  if (pthread_mutex_init(&b->lock, NULL) != 0) goto fail_lock;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) goto fail_cond;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int cerr = pthread_cond_init(&b->freed, &ca);
  pthread_condattr_destroy(&ca);
  if (cerr != 0) goto fail_cond;
  if (b->vmm) {
    size_t g = be->granularity;
    b->va_size = gmr__align_up((size_t)limit, g) + g;
    void *base = NULL;
    err = gmr__backend_va_reserve(be, b->va_size, &base);
    if (err != 0) {
      b->va_size = 0;
      goto fail_va;
    }
    b->va_base = (uintptr_t)base;
  }
  *out = &b->base;
  return 0;
fail_va:
  pthread_cond_destroy(&b->freed);
fail_cond:
  pthread_mutex_destroy(&b->lock);
fail_lock:
  gmr__free(b);
  if (err == GMR_ENOMEM && gmr__error_last()[0] == '\0')
    gmr__error_set(GMR_ENOMEM, "%s: out of host memory", name);
  return err;
}

/* retry_timeout: seconds, with an optional unit (s, ms, us). */
static int bfc_parse_seconds(const char *text, void *field, char *err, size_t len) {
  char *end;
  double v = strtod(text, &end);
  if (end == text || !(v >= 0) || v > 1e6) {
    snprintf(err, len, "expected a duration from 0 to 1e6 s, such as 10, 10s, 250ms or 0");
    return GMR_EINVAL;
  }
  if (strcmp(end, "ms") == 0)
    v /= 1e3;
  else if (strcmp(end, "us") == 0)
    v /= 1e6;
  else if (*end != '\0' && strcmp(end, "s") != 0) {
    snprintf(err, len, "unknown unit '%s'; expected s, ms or us", end);
    return GMR_EINVAL;
  }
  *(double *)field = v;
  return 0;
}

static const bfc_opts_t bfc_defaults = {
    .allow_growth = false,
    .garbage_collection = true,
    .allow_retry_on_failure = true,
    .retry_timeout = 10.0,
    .environment = BFC_ENV_NONE,
};

static const gmr_opt_desc_t bfc_opts_desc[] = {
    {.key = "allow_growth",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, allow_growth),
     .default_text = "false",
     .help = "Start with a 2 MiB region and double (TF allow_growth); false takes the whole "
             "limit in one region at the first allocation.",
     .env = "TF_FORCE_GPU_ALLOW_GROWTH XLA_PYTHON_CLIENT_PREALLOCATE",
     .env_apply = bfc_env_growth,
     .tune = (const char *const[]){"true", NULL}},
    {.key = "memory_limit",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(bfc_opts_t, memory_limit),
     .min = 1,
     .default_text = "",
     .help = "The allocator's limit in bytes (a virtual device's memory_limit).",
     .tune = (const char *const[]){"1.1x peak", "1.25x peak", "1.5x peak", NULL}},
    {.key = "per_process_gpu_memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, per_process_fraction),
     .min = 0,
     .max = 1,
     .min_exclusive = true,
     .default_text = "",
     .help = "TensorFlow: the limit is this fraction of the device's total memory. With no "
             "limit option, the limit is free memory minus TF's MinSystemMemory."},
    {.key = "memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, memory_fraction),
     .min = 0,
     .max = 1,
     .min_exclusive = true,
     .default_text = "",
     .help = "XLA/JAX: the limit is this fraction of total memory (0.75).",
     .env = "XLA_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_MEM_FRACTION",
     .env_apply = bfc_env_fraction},
    {.key = "garbage_collection",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, garbage_collection),
     .default_text = "true",
     .help = "At OOM, give wholly free regions back to the device and extend again.",
     .env = "TF_ENABLE_GPU_GARBAGE_COLLECTION",
     .env_apply = bfc_env_gc,
     .tune = (const char *const[]){"false", NULL}},
    {.key = "allow_retry_on_failure",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, allow_retry_on_failure),
     .default_text = "true",
     .help = "Before failing, wait up to retry_timeout for other threads to free memory."},
    {.key = "retry_timeout",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(bfc_opts_t, retry_timeout),
     .parse = bfc_parse_seconds,
     .default_text = "10s",
     .help = "How long a failing allocation waits for frees (10, 10s, 250ms)."},
    {.key = "fragmentation_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, fragmentation_fraction),
     .min = 0,
     .max = 1,
     .default_text = "0",
     .help = "When > 0, a chunk is split if the waste would reach this fraction of the limit "
             "(instead of 128 MiB).",
     .tune = (const char *const[]){"0.001", "0.01", "0.05", "0.1", NULL}},
    {.key = "vmm",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, vmm),
     .default_text = "false",
     .help = "Grow by mapping pages into one reserved virtual range, so regions coalesce into "
             "one (TF's GpuVirtualMemAllocator).",
     .tune = (const char *const[]){"true", NULL}},
    {.key = "coalesce_regions",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, coalesce_regions),
     .default_text = "false",
     .help = "Merge a new region into the one just before it when the device returns "
             "contiguous addresses (SupportsCoalescing)."},
    {.key = "allocator_name",
     .type = GMR_OPT_STRING,
     .offset = offsetof(bfc_opts_t, name),
     .default_text = "GPU_<device>_bfc",
     .help = "The allocator's name in messages."},
    {.key = "environment",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(bfc_opts_t, environment),
     .choices = bfc_env_names,
     .default_text = "none",
     .help = "Honour a framework's environment variables at runtime creation: tensorflow "
             "(TF_FORCE_GPU_ALLOW_GROWTH, TF_ENABLE_GPU_GARBAGE_COLLECTION) or jax "
             "(XLA_PYTHON_CLIENT_PREALLOCATE, XLA_CLIENT_MEM_FRACTION or "
             "XLA_PYTHON_CLIENT_MEM_FRACTION); each is listed with the option it overrides."},
    {.key = NULL},
};

const gmr_policy_ops_t gmr_bfc_policy_ops = {
    .name = "bfc",
    .help = "TensorFlow's best-fit-with-coalescing allocator (GPU_0_bfc): 256-byte chunks in "
            "21 bins, greedy or growing regions, garbage collection and retry at OOM.",
    .opts_size = sizeof(bfc_opts_t),
    .opts_default = &bfc_defaults,
    .opts_desc = bfc_opts_desc,
    .concurrent = true,
    .validate = bfc_validate,
    .opts_release = bfc_opts_release,
    .create = bfc_create,
    .destroy = bfc_destroy,
    .alloc = bfc_alloc,
    .free = bfc_free,
    .record_stream = bfc_record_stream,
    .set_exclusive = bfc_set_exclusive,
    .trim = bfc_trim,
    .stats = bfc_stats,
    .reset_peak = bfc_reset_peak,
    .reset_accumulated = bfc_reset_accumulated,
    .stats_foreach = bfc_stats_foreach,
    .summary = gmr__bfc_summary,
    .walk = bfc_walk,
    .check = bfc_check,
};
