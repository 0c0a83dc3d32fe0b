/* bfc.c: the core of the `bfc` policy, TensorFlow's best-fit-with-coalescing allocator.
 *
 * A faithful C version of tsl::BFCAllocator as TF 2.15-2.16 ships it (the
 * [TSL-M] reference of docs/bfc.md), wrapped the way GPUBFCAllocator and
 * XLA's CreateBFCAllocator build it: regions from the backend, cut into
 * chunks of 256-byte multiples, free chunks in 21 bins of AVL trees (bins.h)
 * for best fit, freed chunks merged at once.  Single-threaded behaviour is
 * TensorFlow's exactly; streams and front caches are gmr's additions.
 * Map: Note [Regions and chunks], [Invariants], [Hot paths],
 * [Records and handles], [Locking], [Fronts], [Streams], [Retry].
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bfc/internal.h"
#include "bins.h"

static atomic_int bfc_failure_logs; /* TF's process-wide kMaxFailureLogs counter */

/* Note [Regions and chunks]
 * Device memory is taken in regions from the backend: greedy mode takes the
 * whole limit in one region at the first allocation; growth mode takes a
 * 2 MiB region, then regions that double.  Each region is cut into chunks
 * (multiples of 256 bytes) kept in address order; free chunks live in 21
 * bins by size class, each bin an AVL tree ordered by (size, address)
 * (bins.h), so best fit with the lowest-address tie-break is one O(log n)
 * descent.  Freed chunks merge with free neighbours at once.
 *
 * Note [Invariants] (checked by gmr__bfc_check_locked, check.c)
 *   for every region R with chunks c_1..c_k (prev/next links, between the
 *   sentinels R.head and R.tail, which are in use and of size 0):
 *     c_1.ptr = R.ptr,  c_i.ptr + c_i.size = c_{i+1}.ptr,  Σ c_i.size = R.size
 *     no two linked neighbours are both free
 *   a chunk is free  <=>  it is in bin bfc_bin_for(size), and in no other
 *   bins[i] is a balanced tree sorted by (size, ptr); bit i of nonempty <=> bins[i] has chunks
 *   bytes_in_use = Σ sizes of in-use chunks;  pool_bytes = Σ region sizes
 *   VMM mode: at most one region, at va_base, of va_used bytes
 *   pending chunks are in use:  pending_bytes = Σ their sizes,
 *   allocations.current = in-use chunks - pending ones (likewise requested)
 *   a record in chunk_pool: !in_use, !pending, !elsewhere, uses = NULL, bin = -1
 *
 * Note [Hot paths]
 * A cached allocation by one thread (bfc_alloc) is one inline function: the
 * lock's one atomic, best fit, the split in place (the free chunk keeps its
 * tree node as the remainder: Note [Records and handles], and bins.h), the
 * statistics, and the unlock; a free (bfc_free) likewise, with the merge in
 * place.  Everything else (Extend, the wait, the report, pending stream
 * frees, the front caches, a split or merge that moves a chunk between
 * bins, bad pointers) is out of line, taken before anything changes.
 */

/* ---- chunk records ------------------------------------------------------------- */

/* Note [Records and handles]
 * A handle is TF's ChunkHandle: the record's number,
 * recycled LIFO (AllocateChunk pops the free list, DeallocateChunk pushes).
 * TF's SplitChunk keeps the lower piece in the split chunk's record and
 * takes a fresh one for the remainder; Merge(h1, h2) keeps h1 and frees
 * h2.  Two in-place cases below swap the roles of the records (the record
 * that stays binned keeps its tree node, so nothing is searched or
 * rebalanced) and then swap the two handles, so every chunk carries the
 * handle TF would give it and the pool hands out handles in TF's order. */

/* A slab of records, 64-byte aligned, pushed on the pool so that the lowest
 * handle comes out first (TF's AllocateChunk order). */
static BFC_COLD int bfc_slab_grow(bfc_t *b) {
  void *raw = gmr__malloc(sizeof(bfc_slab_t) + 63);
  if (raw == NULL)
    return gmr__error_set(GMR_ENOMEM, "%s: out of host memory for chunk records", b->name);
  bfc_slab_t *s = gmr__align_ptr(raw, 64);
  memset(s, 0, sizeof *s);
  s->raw = raw;
  s->next = b->slabs;
  b->slabs = s;
  for (int i = BFC_SLAB - 1; i >= 0; --i) {
    s->chunks[i].handle = b->n_handles + (uint32_t)i;
    s->chunks[i].bin = -1;
    s->chunks[i].left = b->chunk_pool;
    b->chunk_pool = &s->chunks[i];
  }
  b->n_handles += BFC_SLAB;
  return 0;
}

/* A fresh free, unbinned record (the pool's invariant gives the rest);
 * NULL when the host is out of memory. */
static inline bfc_chunk_t *bfc_chunk_get(bfc_t *b) {
  if (GMR_UNLIKELY(b->chunk_pool == NULL) && bfc_slab_grow(b) != 0) return NULL;
  bfc_chunk_t *c = b->chunk_pool;
  b->chunk_pool = c->left;
  c->requested = 0;
  return c;
}

/* Back to the pool: a free, unbinned chunk. */
static inline void bfc_chunk_put(bfc_t *b, bfc_chunk_t *c) {
  gmr_assert_internal(!c->in_use && !c->pending && !c->elsewhere && c->uses == NULL &&
                      c->bin == -1);
  c->left = b->chunk_pool;
  b->chunk_pool = c;
}

static inline void bfc_swap_handles(bfc_chunk_t *a, bfc_chunk_t *c) {
  uint32_t h = a->handle;
  a->handle = c->handle;
  c->handle = h;
}

/* ---- chunks: split and merge ------------------------------------------------------ */

/* SplitChunk: cut `c` (free, unbinned) at `size`; the remainder, in the
 * fresh record `n`, goes to a bin. */
static void bfc_split(bfc_t *b, bfc_chunk_t *c, size_t size, bfc_chunk_t *n) {
  n->ptr = c->ptr + size;
  n->size = c->size - size;
  n->prev = c;
  n->next = c->next;
  c->next->prev = n;
  c->next = n;
  c->size = size;
  bfc_bin_insert(b, n);
}

/* Merge: absorb `n` (= a->next, both free, unbinned) into `a`. */
static inline void bfc_merge(bfc_t *b, bfc_chunk_t *a, bfc_chunk_t *n) {
  gmr_assert_internal(a->next == n && n->prev == a);
  a->size += n->size;
  a->next = n->next;
  n->next->prev = a;
  bfc_chunk_put(b, n);
}

/* TryToCoalesce: absorb a free right neighbour, then be absorbed by a free
 * left one (sentinels are in use).  Returns the surviving chunk (unbinned). */
static bfc_chunk_t *bfc_coalesce(bfc_t *b, bfc_chunk_t *c) {
  bfc_chunk_t *n = c->next;
  if (!n->in_use) {
    bfc_bin_remove(b, n);
    bfc_merge(b, c, n);
  }
  bfc_chunk_t *p = c->prev;
  if (!p->in_use) {
    bfc_bin_remove(b, p);
    bfc_merge(b, p, c);
    c = p;
  }
  return c;
}

/* Whether the binned chunk `nb` may keep its node with the larger key
 * (size, ptr) (bins.h, "In-place bin changes": same bin, still below its
 * in-order successor); with `move`, also when it is the only chunk of its
 * bin and the new key's bin is empty (it moves there: done here).  False:
 * nothing changed.  The fast path passes move = false (fewer registers). */
static BFC_INLINE bool bfc_grows_in_place(bfc_t *b, bfc_chunk_t *nb, size_t size, uintptr_t ptr,
                                          bool move) {
  int bin = nb->bin;
  if (bin < BFC_NUM_BINS - 1 && size >= bfc_bin_size(bin + 1)) {
    if (!move) return false;
    int k = bfc_bin_for(size);
    if (!bfc_bin_sole(nb) || b->bins[k].root != NULL) return false;
    bfc_bin_move_sole(b, nb, k);
    return true;
  }
  const bfc_chunk_t *succ = avl_next(nb);
  return succ == NULL || size < succ->size || (size == succ->size && ptr < succ->ptr);
}

/* The in-place free of `c` (freed, unbinned): true when exactly one
 * neighbour is free and the merged chunk may keep that neighbour's node.
 * A free right neighbour n absorbs c and keeps its node (TF's Merge(c, n)
 * keeps c's handle: swapped); a free left neighbour absorbs c as in TF.
 * False: nothing changed. */
static BFC_INLINE bool bfc_release_in_place(bfc_t *b, bfc_chunk_t *c, bool move) {
  bfc_chunk_t *n = c->next, *p = c->prev;
  if (!n->in_use) {
    if (!p->in_use) return false;
    size_t size = c->size + n->size;
    if (!bfc_grows_in_place(b, n, size, c->ptr, move)) return false;
    n->ptr = c->ptr; /* n takes c's place in the region and keeps its node */
    n->size = size;
    n->prev = p;
    p->next = n;
    n->requested = c->requested; /* the survivor's, as TF's Merge keeps c's */
    bfc_swap_handles(n, c);
    bfc_chunk_put(b, c);
    return true;
  }
  if (p->in_use) return false;
  size_t size = p->size + c->size;
  if (!bfc_grows_in_place(b, p, size, p->ptr, move)) return false;
  bfc_merge(b, p, c);
  return true;
}

/* TryToCoalesce + InsertFreeChunkIntoBin, when the in-place free did not
 * apply. */
static BFC_OUTLINE void bfc_release_general(bfc_t *b, bfc_chunk_t *c) {
  bfc_bin_insert(b, bfc_coalesce(b, c));
}

/* A freed chunk (unbinned) back into the bins, merged with its free
 * neighbours: in place when it can be, else TF's way. */
static BFC_INLINE void bfc_release_chunk(bfc_t *b, bfc_chunk_t *c) {
  if (!bfc_release_in_place(b, c, true)) bfc_release_general(b, c);
}

/* The chunk handed out: marked in use, with TF's statistics (and gmr's:
 * requested bytes and live chunks, current and peak). */
static BFC_INLINE void bfc_mark_used(bfc_t *b, bfc_chunk_t *c, size_t chunk_size,
                                     size_t num_bytes) {
  c->in_use = 1;
  c->requested = num_bytes;
  c->owner = bfc_thread_id();
  ++b->num_allocs;
  int64_t size = (int64_t)chunk_size;
  b->bytes_in_use += size;
  if (b->bytes_in_use > b->peak_bytes_in_use) b->peak_bytes_in_use = b->bytes_in_use;
  if (size > b->largest_alloc_size) b->largest_alloc_size = size;
  b->requested.current += (int64_t)num_bytes;
  if (b->requested.current > b->requested.peak) b->requested.peak = b->requested.current;
  if (++b->allocations.current > b->allocations.peak) b->allocations.peak = b->allocations.current;
}

/* The in-place split of the best fit `c`: when TF would split it and the
 * remainder stays in c's bin above c's in-order predecessor (every chunk
 * before c in the bin is smaller than `rounded`, c being the first fit, or
 * c is its bin's first), or, with `move`, c is the only chunk of its bin
 * and the remainder's bin is empty, c keeps its node as the remainder and a
 * fresh record takes the allocated lower piece (TF's SplitChunk keeps that
 * piece in c's handle: swapped).  NULL: nothing changed. */
static BFC_INLINE bfc_chunk_t *bfc_take_in_place(bfc_t *b, bfc_chunk_t *c, size_t rounded,
                                                 size_t num_bytes, bool move) {
  size_t rest_size = c->size - rounded;
  if (rest_size < rounded || b->chunk_pool == NULL) return NULL;
  if (rest_size < bfc_bin_size(c->bin)) { /* a lower bin */
    if (!move) return NULL;
    int k = bfc_bin_for(rest_size);
    if (!bfc_bin_sole(c) || b->bins[k].root != NULL) return NULL;
    bfc_bin_move_sole(b, c, k);
  }
  bfc_chunk_t *a = bfc_chunk_get(b), *p = c->prev;
  a->ptr = c->ptr;
  a->size = rounded;
  a->prev = p;
  a->next = c;
  p->next = a;
  c->prev = a;
  c->ptr += rounded;
  c->size = rest_size;
  c->requested = 0; /* a fresh remainder's */
  bfc_swap_handles(a, c);
  bfc_mark_used(b, a, rounded, num_bytes);
  return a;
}

/* RemoveFreeChunkFromBin and SplitChunk, when the in-place split did not
 * apply.  Should the host refuse a record for the remainder, the whole chunk
 * is handed out (never observed in practice). */
static BFC_OUTLINE bfc_chunk_t *bfc_take_general(bfc_t *b, bfc_chunk_t *c, size_t rounded,
                                                 size_t num_bytes) {
  bfc_bin_remove(b, c);
  if (c->size >= rounded * 2 || c->size - rounded >= b->max_frag) {
    bfc_chunk_t *rest = bfc_chunk_get(b);
    if (rest != NULL) bfc_split(b, c, rounded, rest);
  }
  bfc_mark_used(b, c, c->size, num_bytes);
  return c;
}

/* FindChunkPtr once the best fit `c` is known: in place when it can be,
 * else TF's way. */
static BFC_INLINE bfc_chunk_t *bfc_take(bfc_t *b, bfc_chunk_t *c, size_t rounded,
                                        size_t num_bytes) {
  bfc_chunk_t *a = bfc_take_in_place(b, c, rounded, num_bytes, true);
  return a != NULL ? a : bfc_take_general(b, c, rounded, num_bytes);
}

/* FindChunkPtr: best fit, split, mark in use.  NULL: nothing fits. */
static BFC_OUTLINE bfc_chunk_t *bfc_find_chunk(bfc_t *b, size_t rounded, size_t num_bytes) {
  bfc_chunk_t *c = bfc_best_fit(b, rounded);
  return c == NULL ? NULL : bfc_take(b, c, rounded, num_bytes);
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
    bfc_chunk_t *last = prev->tail.prev;
    prev->size += size;
    c->prev = last;
    c->next = &prev->tail;
    last->next = c;
    prev->tail.prev = c;
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
  void *raw = gmr__calloc(1, sizeof(bfc_region_t) + 63);
  if (raw == NULL) goto fail_chunk;
  bfc_region_t *r = gmr__align_ptr(raw, 64);
  r->raw = raw;
  if (bfc_piece_add(r, mem, size) != 0) {
    gmr__free(raw);
    goto fail_chunk;
  }
  r->ptr = p;
  r->size = size;
  r->head = r->tail = (bfc_chunk_t){.in_use = 1, .bin = -1, .handle = UINT32_MAX};
  r->head.next = c;
  r->tail.prev = c;
  c->prev = &r->head;
  c->next = &r->tail;
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
 * device failed otherwise.  With `only_try` (the attempt before the front
 * caches are flushed, bfc_alloc_slow): no backpedal, and nothing changes
 * unless a region comes. */
static int bfc_extend(bfc_t *b, size_t rounded, bool only_try) {
  uint64_t avail = b->limit > (uint64_t)b->pool_bytes ? b->limit - (uint64_t)b->pool_bytes : 0;
  avail = avail / BFC_MIN_ALLOC * BFC_MIN_ALLOC;
  if (rounded > avail) return GMR_ENOMEM;
  bool increased = false;
  size_t curr = b->curr_region_bytes;
  while (rounded > curr) {
    curr = bfc_double(curr);
    increased = true;
  }
  if (!only_try) b->curr_region_bytes = curr; /* TF's target rises even if the device says no */
  size_t bytes = curr < avail ? curr : (size_t)avail;
  void *mem = NULL;
  size_t received = 0;
  int err = bfc_sub_alloc(b, bytes, &mem, &received);
  while (err == GMR_ENOMEM && !only_try) {
    /* Backpedal by 0.9 (float, as TF), with XLA's strict-progress fix. */
    size_t next = bfc_rounded((size_t)((float)bytes * BFC_BACKPEDAL));
    if (next >= bytes) next = bytes - BFC_MIN_ALLOC;
    bytes = next;
    if (bytes < rounded) return GMR_ENOMEM;
    err = bfc_sub_alloc(b, bytes, &mem, &received);
  }
  if (err != 0) return err;
  b->curr_region_bytes = increased ? curr : bfc_double(curr);
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
  return !bfc_first(r)->in_use && bfc_first(r)->size == r->size;
}

static void bfc_region_release(bfc_t *b, size_t i) {
  bfc_region_t *r = b->regions[i];
  bfc_bin_remove(b, bfc_first(r));
  bfc_chunk_put(b, bfc_first(r));
  for (size_t k = r->n_pieces; k-- > 0;)
    bfc_sub_free(b, r->pieces[k].ptr, r->pieces[k].size);
  if (b->vmm && r->ptr + r->size == b->va_base + b->va_used) b->va_used = r->ptr - b->va_base;
  b->pool_bytes -= (int64_t)r->size;
  memmove(&b->regions[i], &b->regions[i + 1], (b->n_regions - i - 1) * sizeof *b->regions);
  --b->n_regions;
  gmr__free(r->pieces);
  gmr__free(r->raw);
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

  int e = bfc_extend(b, rounded, false);
  if (e == 0) return bfc_find_chunk(b, rounded, num_bytes);
  if (e != GMR_ENOMEM) return (*err = e), NULL;
  if (!bfc_free_regions(b, rounded, false)) return NULL;
  ++b->retries;
  e = bfc_extend(b, rounded, false);
  if (e == 0) return bfc_find_chunk(b, rounded, num_bytes);
  if (e != GMR_ENOMEM) *err = e;
  return NULL;
}

/* The invariant walk of gmr_assert_expensive (--enable-debug=3) after an op:
 * only while no front cache can hold chunks or uncounted figures (none
 * exists, or all are frozen, hence flushed); gmr_check flushes them first
 * (see Note [Fronts]). */
static int bfc_check_settled(bfc_t *b) {
  return b->n_fronts == 0 || b->freezes > 0 ? gmr__bfc_check_locked(b) : 0;
}

/* ---- the lock and the front caches --------------------------------------------------- */

/* Note [Locking]
 * The policy is concurrent (policy.h, rule 5).  One lock (`lock`, a
 * gmr_lock_t) guards everything in bfc_t except the immutable configuration
 * and the front caches; an allocation that waits for frees sleeps on
 * `freed_seq`, which every free bumps while `waiters` > 0, and the wait
 * releases `lock`.
 *
 * Note [Fronts] (front.c)
 * As long as one thread at a time calls the allocator, nothing else exists:
 * every call takes `lock` and runs TF's code, so single-threaded behaviour
 * is TensorFlow's exactly.  The first time a thread finds `lock` held,
 * `contended` is set (for good) and each stream gets a front cache: a free
 * on that stream keeps the chunk there instead of taking `lock`, and an
 * allocation on the stream takes a kept chunk that TF would hand out whole
 * before it takes `lock`.  So threads on different streams that reuse their
 * sizes share no lock and no written cache line.  Invariants:
 *   a chunk in a front cache is in use for the core (in_use, counted in
 *     bytes_in_use) and freed for its user;
 *   num_allocs, num_frees, requested and allocations of the core plus the
 *     caches' unfolded counts are TF's figures.
 * An allocation that finds no chunk first tries to grow the pool (Extend,
 * no backpedal), as TF's would with the cached chunks in use.  Every
 * operation that reads or changes the whole state (the quiesced ops:
 * statistics, walks, checks, summary, trim; and an allocation that finds no
 * chunk once the pool cannot grow: TF's Extend, the wait, the report) first
 * freezes the caches: their chunks go back to the bins through TF's free,
 * their counts are folded in, and they are bypassed until it ends
 * (bfc_front_freeze / thaw, nested by a count), so nothing outside `lock`
 * writes a chunk while the whole state is read.  A chunk with stream uses
 * never enters a front cache (its free always takes the lock).
 */

/* Try the allocator's lock once; a thread that finds it held turns the front
 * caches on for good (and then takes the shared path, which waits). */
static BFC_INLINE bool bfc_trylock(bfc_t *b) {
  uint32_t free_state = 0;
  if (GMR_LIKELY(atomic_compare_exchange_weak_explicit(&b->lock.locked, &free_state, 1,
                                                       memory_order_acquire, memory_order_relaxed)))
    return true;
  if (!atomic_load_explicit(&b->contended, memory_order_relaxed))
    atomic_store_explicit(&b->contended, true, memory_order_relaxed);
  return false;
}

static inline void bfc_lock(bfc_t *b) {
  if (!bfc_trylock(b)) gmr__lock_slow(&b->lock);
}

static inline void bfc_unlock(bfc_t *b) {
  gmr__unlock(&b->lock);
}

static BFC_COLD int bfc_wake_one(bfc_t *b) {
  gmr__lock_wake(&b->lock);
  return 0;
}

/* gmr__unlock and `return 0` for the fast paths: the wake-up of a sleeper
 * is a tail call, so nothing stays live across a call there. */
static BFC_INLINE int bfc_unlock_done(bfc_t *b) {
  if (GMR_UNLIKELY(gmr__unlock_sees_sleepers(&b->lock))) return bfc_wake_one(b);
  return 0;
}

static void bfc_free_chunk(bfc_t *b, bfc_chunk_t *c);

/* Under lock: flush the front caches (their chunks back to the bins through
 * TF's free, their counts folded in) and keep them bypassed until the
 * matching bfc_front_thaw (nested freezes count), so that nothing outside
 * `lock` writes a chunk while the whole state is read or changed. */
static void bfc_front_freeze(bfc_t *b) {
  if (b->freezes++ > 0) return;
  for (size_t i = 0; i < BFC_FRONT_STREAMS && b->n_fronts > 0; ++i) {
    bfc_front_t *f = atomic_load_explicit(&b->fronts[i], memory_order_relaxed);
    if (f == NULL) continue;
    bfc_chunk_t *held[BFC_FRONT_MAX];
    size_t n = gmr__bfc_front_drain(b, f, held);
    for (size_t k = 0; k < n; ++k)
      bfc_free_chunk(b, held[k]);
  }
}

static void bfc_front_thaw(bfc_t *b) {
  if (--b->freezes > 0) return;
  for (size_t i = 0; i < BFC_FRONT_STREAMS && b->n_fronts > 0; ++i) {
    bfc_front_t *f = atomic_load_explicit(&b->fronts[i], memory_order_relaxed);
    if (f != NULL) gmr__bfc_front_thaw(f);
  }
}

/* Quiesced (policy.h, rule 5), for the ops that read or change everything
 * (statistics, walks, checks, trim): the lock, the front caches flushed and
 * bypassed meanwhile (see Note [Fronts]). */
static void bfc_quiesce(gmr_policy_t *self) {
  bfc_lock((bfc_t *)self);
  bfc_front_freeze((bfc_t *)self);
}

static void bfc_resume(gmr_policy_t *self) {
  bfc_front_thaw((bfc_t *)self);
  bfc_unlock((bfc_t *)self);
}

/* ---- policy ops ----------------------------------------------------------------------- */

static uint64_t bfc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Note [Streams]
 * gmr's addition; TensorFlow's BFC has one stream.  gmr_record_stream adds a
 * stream to an in-use chunk; its free then records one event per such
 * stream and keeps the chunk in use (`pending`) until every event
 * completes, so no other allocation gets the memory while that work may
 * still touch it, as gmr.h promises and PyTorch's caching allocator does.
 * Pending chunks are released when an allocation finds their events
 * complete, and synchronized when memory runs out and by empty_cache.  A
 * chunk never given a stream takes none of these paths: single-stream
 * behaviour is TensorFlow's.
 */

/* Release the pending chunks whose streams' work is done (after waiting for
 * it when `sync`).  Under lock; true when one was released (see Note [Streams]). */
static bool bfc_release_pending(bfc_t *b, bool sync) {
  bfc_pending_t *e = gmr__bfc_pending_take(b, sync);
  bool released = e != NULL;
  while (e != NULL) {
    bfc_pending_t *next = e->next;
    bfc_free_chunk(b, e->chunk);
    gmr__free(e);
    e = next;
  }
  return released;
}

/* Note [Retry]
 * When a request fits no free chunk: Extend (a new region, backpedalling by
 * 0.9x while the device refuses, with XLA's strict-progress fix), then
 * garbage collection of wholly free regions and Extend again, then, when
 * allowed, a bounded wait for frees by other threads (10 s by default) and
 * a last attempt that writes TensorFlow's OOM report (report.c, with the
 * summary).  The retry waits only when waiting can help (streams.c says
 * when: a free on its way, chunks that change hands between threads, or an
 * in-use chunk of a thread that is not itself waiting).  When every in-use
 * chunk belongs to a waiting thread and each thread frees its own, nothing
 * can be freed, and every waiter makes its last try at once instead of
 * sleeping retry_timeout.  The front caches are frozen during the wait, so
 * the waiters see every free and every chunk's owner (Note [Fronts]).
 */

/* AllocatorRetry (see Note [Retry]): wait for frees until the deadline, then a last try.  Every
 * wake-up tries again (after waiting for other streams' work on pending
 * chunks).  The caller has frozen the front caches (under concurrency), so
 * every free meanwhile goes to the lock and wakes the waiters.
 * gmr's addition: the wait lasts only while waiting can help
 * (gmr__bfc_wait_can_help: some holder of memory is not itself waiting, or a
 * free is on its way).  When every holder waits, nobody will free: all the
 * waiters give up together (one leaving returns an error, not memory, so it
 * does not make the others' wait useful).  With one caller
 * (set_exclusive) the last try comes at once, as before. */
static bfc_chunk_t *bfc_wait_for_frees(bfc_t *b, size_t size, size_t rounded, int *err,
                                       double *waited_s) {
  ++b->retries;
  uintptr_t me = bfc_thread_id();
  uint64_t start = bfc_now_ns(), deadline = start + b->retry_ns;
  bfc_chunk_t *c = NULL;
  int werr = gmr__bfc_waiting_add(b, me);
  /* This thread now waits: the others look again whether anyone can free. */
  if (atomic_fetch_add_explicit(&b->waiters, 1, memory_order_seq_cst) > 0)
    gmr__wake_all(&b->freed_seq);
  uint64_t stalemate = b->stalemates;
  for (;;) {
    uint32_t seen = atomic_load_explicit(&b->freed_seq, memory_order_seq_cst);
    bool stuck = b->stalemates != stalemate || werr != 0 || !gmr__bfc_wait_can_help(b);
    if (stuck && b->stalemates == stalemate && werr == 0 && !b->exclusive) {
      ++b->stalemates; /* every waiter that saw the old count gives up */
      gmr__wake_all(&b->freed_seq);
    }
    if (stuck || bfc_now_ns() >= deadline) {
      c = bfc_try(b, size, rounded, err);
      break;
    }
    gmr__lock_wait_until(&b->lock, &b->freed_seq, seen, deadline);
    if (b->pending != NULL) bfc_release_pending(b, true);
    c = bfc_try(b, size, rounded, err);
    if (c != NULL || *err != 0) break;
  }
  if (werr == 0) gmr__bfc_waiting_remove(b, me);
  atomic_fetch_sub_explicit(&b->waiters, 1, memory_order_seq_cst);
  *waited_s = b->exclusive ? 0.0 : (double)(bfc_now_ns() - start) / 1e9;
  return c;
}

/* An allocation that found no chunk, with lock held: Extend, garbage
 * collection, the pending stream frees, the wait, the report.  Under
 * concurrency the pool first tries to grow, as TF's would with the front
 * caches' chunks in use (their streams take them again next; flushing them
 * instead would hand the same chunks from cache to cache, a flush each
 * time, and a growth-mode pool would never grow past them); when it cannot,
 * the front caches give their chunks back and stay bypassed until this
 * allocation ends (then TF's path, the wait and the report see every chunk
 * as TF would, and the report reads chunks nobody else writes). */
static BFC_COLD int bfc_alloc_slow(bfc_t *b, size_t size, size_t rounded, gmr_stream_t s,
                                   gmr_block_t *out) {
  int err = 0;
  bool contended = atomic_load_explicit(&b->contended, memory_order_relaxed);
  bfc_chunk_t *c = NULL;
  if (contended && b->n_fronts > 0 && bfc_extend(b, rounded, true) == 0)
    c = bfc_find_chunk(b, rounded, size);
  bool frozen = contended && c == NULL;
  if (frozen) bfc_front_freeze(b);
  if (c == NULL) c = bfc_try(b, size, rounded, &err);
  /* Memory held only by other streams' work: wait for that work, try again. */
  if (c == NULL && err == 0 && b->pending != NULL && bfc_release_pending(b, true))
    c = bfc_try(b, size, rounded, &err);
  double waited_s = 0;
  if (c == NULL && err == 0 && b->retry) c = bfc_wait_for_frees(b, size, rounded, &err, &waited_s);
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
    gmr_assert_expensive(bfc_check_settled(b) == 0);
  }
  if (frozen) bfc_front_thaw(b);
  if (contended) gmr__bfc_front_new(b, s);
  bfc_unlock(b);
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

/* Every allocation but a cached one by one thread, with lock held when
 * `locked` (the fast path found pending frees), else without: the stream's
 * front cache first (under concurrency), then TF's path under the lock. */
static BFC_OUTLINE int bfc_alloc_shared(bfc_t *b, size_t size, size_t rounded, gmr_stream_t s,
                                        bool locked, gmr_block_t *out) {
  bfc_chunk_t *c;
  bool contended = atomic_load_explicit(&b->contended, memory_order_relaxed);
  if (!locked) {
    bfc_front_t *f = contended ? gmr__bfc_front_find(b, s) : NULL;
    if (f != NULL && (c = gmr__bfc_front_alloc(b, f, size, rounded, bfc_thread_id())) != NULL) {
      *out = (gmr_block_t){.ptr = (void *)c->ptr, .size = c->size, .handle = c};
      return 0;
    }
    bfc_lock(b);
  }
  if (GMR_UNLIKELY(b->pending != NULL)) bfc_release_pending(b, false);
  c = bfc_find_chunk(b, rounded, size);
  if (c == NULL) return bfc_alloc_slow(b, size, rounded, s, out);
  *out = (gmr_block_t){.ptr = (void *)c->ptr, .size = c->size, .handle = c};
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  if (atomic_load_explicit(&b->contended, memory_order_relaxed)) gmr__bfc_front_new(b, s);
  bfc_unlock(b);
  return 0;
}

/* The best fit `c` taken out of its bin (the in-place split did not apply),
 * with lock held: the rest of the fast path, out of line. */
static BFC_OUTLINE int bfc_alloc_take(bfc_t *b, bfc_chunk_t *c, size_t size, size_t rounded,
                                      gmr_block_t *out) {
  c = bfc_take(b, c, rounded, size);
  *out = (gmr_block_t){.ptr = (void *)c->ptr, .size = c->size, .handle = c};
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  return bfc_unlock_done(b);
}

/* The fast path: one thread, no contention, no pending stream frees, and a
 * best fit that splits in place; anything else goes out of line (each
 * branch is taken before anything changes; see Note [Hot paths]). */
static int bfc_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  bfc_t *b = (bfc_t *)self;
  size_t rounded = bfc_rounded(size);
  if (GMR_UNLIKELY(atomic_load_explicit(&b->contended, memory_order_relaxed) || !bfc_trylock(b)))
    return bfc_alloc_shared(b, size, rounded, s, false, out);
  if (GMR_UNLIKELY(b->pending != NULL)) return bfc_alloc_shared(b, size, rounded, s, true, out);
  bfc_chunk_t *c = bfc_best_fit(b, rounded);
  if (GMR_UNLIKELY(c == NULL)) return bfc_alloc_slow(b, size, rounded, s, out);
  bfc_chunk_t *a = bfc_take_in_place(b, c, rounded, size, false);
  if (GMR_UNLIKELY(a == NULL)) return bfc_alloc_take(b, c, size, rounded, out);
  out->ptr = (void *)a->ptr;
  out->size = rounded;
  out->handle = a;
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  return bfc_unlock_done(b);
}

static int bfc_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  bfc_t *b = (bfc_t *)self;
  bfc_chunk_t *c = blk->handle;
  if (s == blk->stream) return 0;
  bfc_lock(b);
  if (GMR_UNLIKELY(c == NULL || !c->in_use || c->pending || c->ptr != (uintptr_t)blk->ptr)) {
    bfc_unlock(b);
    return gmr__error_set(GMR_EBADPTR, "%s: %p is not the start of a live chunk", b->name,
                          blk->ptr);
  }
  gmr__bfc_use_add(c, s);
  c->elsewhere = c->uses != NULL || c->sync_on_free;
  bfc_unlock(b);
  return 0;
}

static void bfc_set_exclusive(gmr_policy_t *self, int exclusive) {
  bfc_t *b = (bfc_t *)self;
  bfc_lock(b);
  b->exclusive = exclusive != 0;
  bfc_unlock(b);
}

/* TF's DeallocateRawInternal without the counts: back to a bin, merged with
 * free neighbours; waiters are woken.  Under lock. */
static void bfc_free_chunk(bfc_t *b, bfc_chunk_t *c) {
  c->in_use = 0;
  b->bytes_in_use -= (int64_t)c->size;
  bfc_release_chunk(b, c);
  if (atomic_load_explicit(&b->waiters, memory_order_relaxed) > 0) gmr__wake_all(&b->freed_seq);
}

/* The user's free counted (TF's DeallocateRawInternal counts), under lock. */
static BFC_INLINE void bfc_free_counts(bfc_t *b, const bfc_chunk_t *c) {
  b->requested.current -= (int64_t)c->requested;
  --b->allocations.current;
  ++b->num_frees;
}

static inline bool bfc_live(const bfc_chunk_t *c, const gmr_block_t *blk) {
  return c != NULL && c->in_use && !c->pending && c->ptr == (uintptr_t)blk->ptr;
}

static BFC_COLD int bfc_bad_free(bfc_t *b, const gmr_block_t *blk) {
  return gmr__error_set(GMR_EBADPTR, "%s: %p is not the start of a live chunk", b->name, blk->ptr);
}

static BFC_COLD int bfc_bad_free_locked(bfc_t *b, const gmr_block_t *blk) {
  bfc_unlock(b);
  return bfc_bad_free(b, blk);
}

/* Every free but a cached one by the allocating thread: the stream's front
 * cache first (under concurrency), stream uses, waiters, bad pointers. */
/* A free under the lock: TF's (with the stream uses), after freeing and
 * counting the `n_spill` chunks a front cache gave back (then c was kept:
 * `kept`); `f` is the stream's front cache (NULL: give it one). */
static BFC_OUTLINE int bfc_free_locked(bfc_t *b, const gmr_block_t *blk, bfc_front_t *f, bool kept,
                                       bfc_chunk_t **spill, size_t n_spill) {
  bfc_chunk_t *c = blk->handle;
  /* A free that finds allocations waiting says so before it queues for the
   * lock: they keep waiting for it (gmr__bfc_wait_can_help). */
  bool announce = atomic_load_explicit(&b->waiters, memory_order_seq_cst) > 0;
  if (GMR_UNLIKELY(announce)) atomic_fetch_add_explicit(&b->arriving, 1, memory_order_seq_cst);
  bfc_lock(b);
  if (GMR_UNLIKELY(announce)) atomic_fetch_sub_explicit(&b->arriving, 1, memory_order_seq_cst);
  for (size_t k = 0; k < n_spill; ++k) { /* the front cache left their frees to count */
    bfc_free_counts(b, spill[k]);
    bfc_free_chunk(b, spill[k]);
  }
  if (!kept) {
    if (GMR_UNLIKELY(!bfc_live(c, blk))) {
      if (announce) gmr__wake_all(&b->freed_seq); /* the waiters look again */
      bfc_unlock(b);
      return bfc_bad_free(b, blk);
    }
    bfc_free_counts(b, c);
    bool elsewhere = c->elsewhere;
    c->elsewhere = 0; /* gmr__bfc_hold drops the uses */
    if (GMR_UNLIKELY(elsewhere) && gmr__bfc_hold(b, c)) {
      /* Pending: waiters look again (they may wait for that work). */
      if (atomic_load_explicit(&b->waiters, memory_order_relaxed) > 0) gmr__wake_all(&b->freed_seq);
    } else {
      bfc_free_chunk(b, c);
    }
  }
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  if (f == NULL && atomic_load_explicit(&b->contended, memory_order_relaxed))
    gmr__bfc_front_new(b, blk->stream);
  bfc_unlock(b);
  return 0;
}

/* The stream's front cache is full: it keeps c and gives chunks back. */
static BFC_COLD int bfc_free_spilling(bfc_t *b, const gmr_block_t *blk, bfc_front_t *f) {
  bfc_chunk_t *spill[BFC_FRONT_MAX];
  size_t n = gmr__bfc_front_free_spilling(b, f, blk->handle, spill);
  if (n == SIZE_MAX) return bfc_free_locked(b, blk, f, false, NULL, 0);
  return bfc_free_locked(b, blk, f, true, spill, n);
}

/* Every free but a cached one by the allocating thread: the stream's front
 * cache first (under concurrency), else under the lock. */
static BFC_OUTLINE int bfc_free_shared(bfc_t *b, const gmr_block_t *blk) {
  bfc_chunk_t *c = blk->handle;
  /* Chunks change hands between threads: the retry then waits as TF's. */
  if (c != NULL && c->owner != bfc_thread_id() &&
      !atomic_load_explicit(&b->handoff, memory_order_relaxed))
    atomic_store_explicit(&b->handoff, true, memory_order_seq_cst);
  bfc_front_t *f = NULL;
  /* A chunk used on other streams never stays in a front cache: its memory
   * must wait for that work (gmr__bfc_hold), whichever stream asks next. */
  if (atomic_load_explicit(&b->contended, memory_order_relaxed) && bfc_live(c, blk) &&
      !c->elsewhere && (f = gmr__bfc_front_find(b, blk->stream)) != NULL) {
    int r = gmr__bfc_front_free(b, f, c);
    if (r == BFC_FRONT_KEPT) return 0;
    if (r == BFC_FRONT_FULL) return bfc_free_spilling(b, blk, f);
  }
  return bfc_free_locked(b, blk, f, false, NULL, 0);
}

/* The rest of the fast free, out of line, with lock held and the counts
 * taken: a merge that is not in place, or allocations waiting (woken). */
static BFC_OUTLINE int bfc_free_finish(bfc_t *b, bfc_chunk_t *c) {
  if (c->in_use) {
    bfc_free_chunk(b, c);
  } else {
    bfc_release_chunk(b, c);
    if (atomic_load_explicit(&b->waiters, memory_order_relaxed) > 0) gmr__wake_all(&b->freed_seq);
  }
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  return bfc_unlock_done(b);
}

/* The fast path: a chunk freed by the thread that allocated it, with no
 * other stream's work on it and no contention: TF's free under the lock,
 * merged in place when it can be.  Waiters are looked at under the lock
 * (they register under it); anything else goes out of line before anything
 * changes (see Note [Hot paths]). */
static int bfc_free(gmr_policy_t *self, const gmr_block_t *blk) {
  bfc_t *b = (bfc_t *)self;
  bfc_chunk_t *c = blk->handle;
  if (GMR_UNLIKELY(c == NULL || c->elsewhere || c->owner != bfc_thread_id() ||
                   atomic_load_explicit(&b->contended, memory_order_relaxed) || !bfc_trylock(b)))
    return bfc_free_shared(b, blk);
  if (GMR_UNLIKELY(!bfc_live(c, blk))) return bfc_bad_free_locked(b, blk);
  bfc_free_counts(b, c);
  if (GMR_UNLIKELY(atomic_load_explicit(&b->waiters, memory_order_relaxed) != 0))
    return bfc_free_finish(b, c);
  c->in_use = 0;
  b->bytes_in_use -= (int64_t)c->size;
  if (GMR_UNLIKELY(!bfc_release_in_place(b, c, false))) return bfc_free_finish(b, c);
  gmr_assert_expensive(bfc_check_settled(b) == 0);
  return bfc_unlock_done(b);
}

static int bfc_trim(gmr_policy_t *self) { /* quiesced */
  bfc_t *b = (bfc_t *)self;
  if (b->pending != NULL) bfc_release_pending(b, true); /* as PyTorch's empty_cache */
  bfc_free_regions(b, 0, true);
  return 0;
}

/* ---- construction ---------------------------------------------------------------- */

/* MinSystemMemory of TF's gpu_device.cc for compute capability 9.x (the
 * backends do not report it; see docs/bfc.md). */
static uint64_t bfc_min_system_memory(uint64_t available) {
  return available < ((uint64_t)2 << 30) ? (uint64_t)225 << 20 : (uint64_t)1800 << 20;
}

static void bfc_destroy(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  gmr__bfc_streams_destroy(b);
  for (size_t i = 0; i < b->n_regions; ++i) {
    bfc_region_t *r = b->regions[i];
    for (size_t k = r->n_pieces; k-- > 0;)
      bfc_sub_free(b, r->pieces[k].ptr, r->pieces[k].size);
    gmr__free(r->pieces);
    gmr__free(r->raw);
  }
  if (b->vmm && b->va_size) gmr__backend_va_release(self->backend, (void *)b->va_base, b->va_size);
  gmr__free(b->regions);
  for (bfc_slab_t *s = b->slabs, *next; s; s = next) {
    next = s->next;
    gmr__free(s->raw);
  }
  for (size_t i = 0; i < BFC_FRONT_STREAMS; ++i)
    gmr__bfc_front_release(atomic_load_explicit(&b->fronts[i], memory_order_relaxed));
  gmr__lock_destroy(&b->lock);
  gmr__free(b->raw);
}

static int bfc_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                      gmr_policy_t **out) {
  (void)upstream;
  bfc_opts_t o = *(const bfc_opts_t *)opts; /* the environment already applied */
  char name[128];
  gmr__bfc_name(&o, be->device, name, sizeof name);
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

  /* 64-byte aligned, so that the lock and the read-mostly line are lines of
   * their own. */
  void *raw = gmr__calloc(1, sizeof(bfc_t) + 63);
  if (raw == NULL) return gmr__error_set(GMR_ENOMEM, "%s: out of host memory", name);
  bfc_t *b = gmr__align_ptr(raw, 64);
  b->raw = raw;
  b->base.ops = &gmr__bfc_policy;
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
  b->front_cap = (size_t)(limit / BFC_FRONT_CAP_SHARE);
  if (b->front_cap < BFC_FRONT_CAP_MIN) b->front_cap = BFC_FRONT_CAP_MIN;
  if (o.front_cache_bytes != 0) b->front_cap = (size_t)o.front_cache_bytes;
  err = GMR_ENOMEM;
  if (gmr__lock_init(&b->lock) != 0) goto fail_lock;
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
  gmr__lock_destroy(&b->lock);
fail_lock:
  gmr__free(raw);
  if (err == GMR_ENOMEM && gmr__error_last()[0] == '\0')
    gmr__error_set(GMR_ENOMEM, "%s: out of host memory", name);
  return err;
}

const gmr_policy_ops_t gmr__bfc_policy = {
    .name = "bfc",
    .help = "TensorFlow's best-fit-with-coalescing allocator (GPU_0_bfc): 256-byte chunks in "
            "21 bins, greedy or growing regions, garbage collection and retry at OOM.",
    .opts_size = sizeof(bfc_opts_t),
    .opts_default = &gmr__bfc_opts_default,
    .opts_desc = gmr__bfc_opts_desc,
    .concurrent = true,
    .validate = gmr__bfc_validate,
    .opts_release = gmr__bfc_opts_release,
    .create = bfc_create,
    .destroy = bfc_destroy,
    .alloc = bfc_alloc,
    .free = bfc_free,
    .record_stream = bfc_record_stream,
    .set_exclusive = bfc_set_exclusive,
    .trim = bfc_trim,
    .stats = gmr__bfc_stats,
    .reset_peak = gmr__bfc_reset_peak,
    .reset_accumulated = gmr__bfc_reset_accumulated,
    .stats_foreach = gmr__bfc_stats_foreach,
    .summary = gmr__bfc_summary,
    .walk = gmr__bfc_walk,
    .check = gmr__bfc_check,
    .quiesce = bfc_quiesce,
    .resume = bfc_resume,
};
