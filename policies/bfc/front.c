/* front.c: the front caches of the bfc policy (gmr's addition for several
 * threads; docs/bfc.md, "Under concurrency").  bfc.c calls these; they call
 * nothing of bfc.c: chunks a cache gives up are handed back to the caller,
 * which frees them under the allocator's lock.
 * Map: Note [Front caches], [Front sharing], [Front invariants].
 */
#include <string.h>

#include "bfc/internal.h"

/* Note [Front caches]
 * Once two threads have met at the allocator's lock (`contended`), each stream
 * that allocates gets a front cache: chunks its user freed, still in use for
 * the allocator, kept for the stream's next allocations.  A cache keeps up to
 * BFC_FRONT_PER_BIN chunks per bin (TF's 21 size classes) with their sizes,
 * oldest first, and at most `front_cap` bytes.  An allocation takes the
 * smallest kept chunk that TF would hand out whole for the request (rounded <=
 * size < 2 rounded and size - rounded < max_internal_fragmentation:  TF would
 * not split it); such a chunk lies in the request's bin or the next one, so
 * two short arrays are scanned, and no chunk record is read until one is
 * taken.  A free into a full bin (or past the byte cap) keeps the chunk and
 * gives back the bin's older half (then, while still over the cap, the older
 * half of the largest bin that holds any): the caller frees them all under one
 * acquisition of the lock, not one per free (their frees are counted then, not
 * when the cache took them: see front_spill_bin).
 */

/* Note [Front sharing]
 * Each cache is 64-byte aligned and guarded by its own lock; `id` is immutable
 * once published.  What one stream's cached pair touches: its cache (written),
 * the policy's read-mostly line (`contended`, `waiters`, `fronts`: read), and
 * the chunk's second line (`requested` and `owner`, written only when they
 * change: a stream that reuses its sizes writes nothing there).  Threads on
 * different streams share no lock and no written cache line.
 */

/* Note [Front invariants]
 * Invariants (f.lock held):
 *   bytes = Σ slot sizes,  Σ count[i] chunks kept, count[i] <= BFC_FRONT_PER_BIN,
 *   every kept chunk c: c.in_use, !c.pending, !c.elsewhere, bfc_bin_for(c.size) = i;
 *   allocs, frees, req_in, req_out: what the cache served since its last
 *     flush (folded into the allocator's figures by gmr__bfc_front_drain).
 */

typedef struct bfc_front_slot_s {
  size_t size;        /* = chunk->size, kept here so a lookup reads no record */
  bfc_chunk_t *chunk; /* in use for the allocator, free for the user */
} bfc_front_slot_t;

struct bfc_front_s {
  _Alignas(64) gmr_lock_t lock;
  gmr_stream_t id;
  bool frozen;                 /* a global operation runs: bypass the cache */
  size_t bytes;                /* Σ kept sizes */
  int64_t allocs, frees;       /* user allocations and frees served here, not folded */
  int64_t req_in, req_out;     /* their requested bytes */
  void *raw;                   /* what the host returned (the cache is aligned in it) */
  uint8_t count[BFC_NUM_BINS]; /* chunks kept per bin */
  bfc_front_slot_t slot[BFC_NUM_BINS][BFC_FRONT_PER_BIN]; /* oldest first */
};

/* A stream's home slot among the fronts: the top 8 bits of its hash. */
static inline size_t front_home(gmr_stream_t s) {
  _Static_assert(BFC_FRONT_STREAMS == 1 << 8, "a front's home slot takes 8 bits");
  return gmr__hash_bits((uint64_t)(uintptr_t)s, 8);
}

bfc_front_t *gmr__bfc_front_find(bfc_t *b, gmr_stream_t s) {
  for (size_t i = front_home(s), n = 0; n < BFC_FRONT_STREAMS;
       i = (i + 1) & (BFC_FRONT_STREAMS - 1), ++n) {
    bfc_front_t *f = atomic_load_explicit(&b->fronts[i], memory_order_acquire);
    if (f == NULL || f->id == s) return f;
  }
  return NULL;
}

void gmr__bfc_front_new(bfc_t *b, gmr_stream_t s) {
  if (b->n_fronts >= BFC_FRONT_STREAMS / 2 || gmr__bfc_front_find(b, s) != NULL) return;
  void *raw = gmr__malloc(sizeof(bfc_front_t) + 63);
  if (raw == NULL) return; /* the stream stays on the shared path */
  bfc_front_t *f = gmr__align_ptr(raw, 64);
  memset(f, 0, sizeof *f);
  f->raw = raw;
  gmr__lock_init(&f->lock);
  f->id = s;
  f->frozen = b->freezes > 0;
  size_t i = front_home(s);
  while (atomic_load_explicit(&b->fronts[i], memory_order_relaxed) != NULL)
    i = (i + 1) & (BFC_FRONT_STREAMS - 1);
  atomic_store_explicit(&b->fronts[i], f, memory_order_release);
  ++b->n_fronts;
}

/* Take slot k of bin i out, keeping the others in age order (the newest,
 * the usual one, moves nothing). */
static void front_take(bfc_front_t *f, int i, int k) {
  f->bytes -= f->slot[i][k].size;
  int n = --f->count[i];
  for (; k < n; ++k)
    f->slot[i][k] = f->slot[i][k + 1];
}

/* see Note [Front caches] */
bfc_chunk_t *gmr__bfc_front_alloc(bfc_t *b, bfc_front_t *f, size_t num_bytes, size_t rounded,
                                  uintptr_t me) {
  int lo = bfc_bin_for(rounded), hi = lo + 1 < BFC_NUM_BINS ? lo + 1 : lo;
  bfc_chunk_t *c = NULL;
  gmr__lock(&f->lock);
  if (!f->frozen) {
    int best_bin = -1, best_k = 0;
    size_t best = SIZE_MAX;
    for (int i = lo; i <= hi && best != rounded; ++i)
      for (int k = f->count[i]; k-- > 0;) { /* newest first among equals */
        size_t size = f->slot[i][k].size;
        if (size >= rounded && size < best && size - rounded < rounded &&
            size - rounded < b->max_frag) {
          best = size, best_bin = i, best_k = k;
          if (size == rounded) break; /* nothing fits better */
        }
      }
    if (best_bin >= 0) {
      c = f->slot[best_bin][best_k].chunk;
      front_take(f, best_bin, best_k);
      ++f->allocs;
      f->req_in += (int64_t)num_bytes;
      /* Written under f.lock (a flush reads them after taking it), and only
       * when they change: a stream reusing its sizes writes nothing to the
       * record. */
      if (c->requested != num_bytes) c->requested = num_bytes;
      if (c->owner != me) c->owner = me;
    }
  }
  gmr__unlock(&f->lock);
  return c;
}

/* Give back the oldest `n` chunks of bin i, their frees uncounted again:
 * until the caller frees them under the lock (and counts them), they are
 * live allocations for everyone else, so a flush meanwhile sees the counts
 * agree with the chunks in use. */
static size_t front_spill_bin(bfc_front_t *f, int i, int n, bfc_chunk_t **spill) {
  for (int k = 0; k < n; ++k) {
    bfc_chunk_t *c = f->slot[i][k].chunk;
    spill[k] = c;
    f->bytes -= f->slot[i][k].size;
    --f->frees;
    f->req_out -= (int64_t)c->requested;
  }
  f->count[i] = (uint8_t)(f->count[i] - n);
  memmove(&f->slot[i][0], &f->slot[i][n], (size_t)f->count[i] * sizeof f->slot[i][0]);
  return (size_t)n;
}

/* Keep c in bin i (room made, f.lock held). */
static void front_keep(bfc_front_t *f, int i, bfc_chunk_t *c, size_t size) {
  f->slot[i][f->count[i]++] = (bfc_front_slot_t){size, c};
  f->bytes += size;
  ++f->frees;
  f->req_out += (int64_t)c->requested;
}

/* see Note [Front caches] */
int gmr__bfc_front_free(bfc_t *b, bfc_front_t *f, bfc_chunk_t *c) {
  size_t size = c->size;
  if (size > b->front_cap) return BFC_FRONT_REFUSED;
  int i = bfc_bin_for(size), r = BFC_FRONT_REFUSED;
  gmr__lock(&f->lock);
  if (!f->frozen && atomic_load_explicit(&b->waiters, memory_order_seq_cst) == 0) {
    r = f->count[i] == BFC_FRONT_PER_BIN || f->bytes + size > b->front_cap ? BFC_FRONT_FULL
                                                                           : BFC_FRONT_KEPT;
    if (r == BFC_FRONT_KEPT) front_keep(f, i, c, size);
  }
  gmr__unlock(&f->lock);
  return r;
}

size_t gmr__bfc_front_free_spilling(bfc_t *b, bfc_front_t *f, bfc_chunk_t *c, bfc_chunk_t **spill) {
  size_t size = c->size, n = 0;
  int i = bfc_bin_for(size);
  gmr__lock(&f->lock);
  if (f->frozen || atomic_load_explicit(&b->waiters, memory_order_seq_cst) != 0) {
    n = SIZE_MAX; /* refused after all */
  } else {
    if (f->count[i] == BFC_FRONT_PER_BIN)
      n += front_spill_bin(f, i, BFC_FRONT_PER_BIN / 2, spill + n);
    /* Over the byte cap: the older half of the largest bin that holds
     * anything, again while still over (a bin of one gives it up). */
    for (int j = BFC_NUM_BINS - 1; f->bytes + size > b->front_cap && j >= 0;)
      if (f->count[j] > 0)
        n += front_spill_bin(f, j, (f->count[j] + 1) / 2, spill + n);
      else
        --j;
    front_keep(f, i, c, size);
  }
  gmr__unlock(&f->lock);
  return n;
}

/* see Note [Front invariants] */
size_t gmr__bfc_front_drain(bfc_t *b, bfc_front_t *f, bfc_chunk_t **out) {
  size_t n = 0;
  gmr__lock(&f->lock);
  f->frozen = true;
  for (int i = 0; i < BFC_NUM_BINS; ++i) {
    for (int k = 0; k < f->count[i]; ++k)
      out[n++] = f->slot[i][k].chunk;
    f->count[i] = 0;
  }
  f->bytes = 0;
  b->num_allocs += f->allocs;
  b->num_frees += (uint64_t)f->frees;
  b->requested.current += f->req_in - f->req_out;
  if (b->requested.current > b->requested.peak) b->requested.peak = b->requested.current;
  b->allocations.current += f->allocs - f->frees;
  if (b->allocations.current > b->allocations.peak) b->allocations.peak = b->allocations.current;
  f->allocs = f->frees = f->req_in = f->req_out = 0;
  gmr__unlock(&f->lock);
  return n;
}

void gmr__bfc_front_thaw(bfc_front_t *f) {
  gmr__lock(&f->lock);
  f->frozen = false;
  gmr__unlock(&f->lock);
}

void gmr__bfc_front_release(bfc_front_t *f) {
  if (f == NULL) return;
  gmr__lock_destroy(&f->lock);
  gmr__free(f->raw);
}
