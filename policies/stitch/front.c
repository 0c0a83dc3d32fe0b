/* front.c: the front slots of the stitch policy, its path for several
 * threads (stitch.c, Note [Fronts]; docs/stitch.md).  stitch.c calls
 * these; they call nothing of stitch.c: a block a front gives up goes back
 * to the caller, which frees it under the policy's lock.
 * Map: Note [Front slots], [Front figures], [Front invariants].
 */
#include <string.h>

#include "stitch/internal.h"

/* Note [Front slots]
 * Once two threads have met at the policy's lock (`contended`), each stream
 * that allocates gets a front: one slot holding the last block its user freed
 * on the stream, still allocated for the pools, and kept for the stream's next
 * allocation of the same length (rounded to 512 bytes) in the same pool, which
 * takes it back with no other lock and no device call.  Work ordered on one
 * stream makes that reuse safe, as for the caching policy's blocks.  A free
 * into an occupied front keeps the new block and hands the old one to the
 * caller.
 */

/* Note [Front figures]
 * A take-back counts an allocation and a free of the block's length in the
 * front (`pairs`, `bytes`, `req_in`, `req_out`), folded into the policy's
 * statistics when the front is drained; the block kept stays counted as
 * allocated until then, as it stays allocated for the pools.
 */

/* Note [Front invariants]
 * Invariants (f.lock held):
 *   at most one of f.b, f.r is set; the block kept was allocated on f.s,
 *     has no record_stream use, and is allocated for the pools;
 *   f.frozen: f.b = f.r = NULL, nothing kept or taken;
 *   pairs, bytes, req_in, req_out: the take-backs since the last drain.
 */

static inline size_t front_home(gmr_stream_t s) {
  return (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 58) & (ST_FRONTS - 1);
}

st_front_t *gmr__st_front_find(stitch_t *t, gmr_stream_t s) {
  for (size_t i = front_home(s), n = 0; n < ST_FRONTS; i = (i + 1) & (ST_FRONTS - 1), ++n) {
    st_front_t *f = atomic_load_explicit(&t->fronts[i], memory_order_acquire);
    if (f == NULL || f->s == s) return f;
  }
  return NULL;
}

void gmr__st_front_new(stitch_t *t, gmr_stream_t s) {
  if (t->nfronts >= ST_FRONTS / 2 || gmr__st_front_find(t, s) != NULL) return;
  void *raw = gmr__malloc(sizeof(st_front_t) + 63);
  if (raw == NULL) return;
  st_front_t *f = gmr__align_ptr(raw, 64);
  memset(f, 0, sizeof *f);
  gmr__spin_init(&f->lock);
  f->s = s;
  f->raw = raw;
  size_t i = front_home(s);
  while (atomic_load_explicit(&t->fronts[i], memory_order_relaxed) != NULL)
    i = (i + 1) & (ST_FRONTS - 1);
  atomic_store_explicit(&t->fronts[i], f, memory_order_release);
  ++t->nfronts;
}

/* see Note [Front slots] */
bool gmr__st_front_keep(st_front_t *f, st_small_t *b, st_range_t *r, st_small_t **old_b,
                        st_range_t **old_r) {
  gmr__spin_lock(&f->lock);
  if (f->frozen) {
    gmr__spin_unlock(&f->lock);
    return false;
  }
  *old_b = f->b;
  *old_r = f->r;
  f->b = b;
  f->r = r;
  gmr__spin_unlock(&f->lock);
  return true;
}

/* see Note [Front figures] */
bool gmr__st_front_take(st_front_t *f, uint64_t small_max, size_t size, gmr_block_t *out) {
  uint64_t len = gmr__align_up(size, ST_G);
  gmr__spin_lock(&f->lock);
  st_small_t *b = f->b;
  st_range_t *r = f->r;
  int pool;
  uint64_t old;
  if (b != NULL && size <= small_max && len == b->size) {
    f->b = NULL;
    pool = 1;
    old = b->requested;
    b->requested = size;
  } else if (r != NULL && size > small_max && len == r->len) {
    f->r = NULL;
    pool = 2;
    old = r->requested;
    r->requested = size;
  } else {
    gmr__spin_unlock(&f->lock);
    return false;
  }
  ++f->pairs[pool];
  f->bytes[pool] += (int64_t)len;
  f->req_in[pool] += (int64_t)size;
  f->req_out[pool] += (int64_t)old;
  gmr__spin_unlock(&f->lock);
  *out = st_block_of(pool == 1 ? b : NULL, r, f->s);
  return true;
}

/* A front's take-backs into the statistics: each the free of the block kept
 * (its old requested bytes), then its allocation (the new ones), in that
 * order, so a peak is raised only by what stands after both. */
static void front_fold(stitch_t *t, st_front_t *f) {
  st_stats_t *s = &t->st;
  for (int p = 1; p < 3; ++p) {
    if (f->pairs[p] == 0) continue;
    st_dec(s->allocation, p, f->pairs[p]);
    st_inc(s->allocation, p, f->pairs[p]);
    st_dec(s->allocated, p, f->bytes[p]);
    st_inc(s->allocated, p, f->bytes[p]);
    st_dec(s->requested, p, f->req_out[p]);
    st_inc(s->requested, p, f->req_in[p]);
    if (p == 2) s->hits += f->pairs[p];
    f->pairs[p] = f->bytes[p] = f->req_in[p] = f->req_out[p] = 0;
  }
}

void gmr__st_fronts_drain(stitch_t *t, bool freeze, st_small_t **kb, st_range_t **kr) {
  for (size_t i = 0; i < ST_FRONTS; ++i) {
    st_front_t *f = atomic_load_explicit(&t->fronts[i], memory_order_relaxed);
    kb[i] = NULL;
    kr[i] = NULL;
    if (f == NULL) continue;
    gmr__spin_lock(&f->lock);
    kb[i] = f->b;
    kr[i] = f->r;
    f->b = NULL;
    f->r = NULL;
    front_fold(t, f);
    if (freeze) f->frozen = true;
    gmr__spin_unlock(&f->lock);
  }
}

void gmr__st_fronts_thaw(stitch_t *t) {
  for (size_t i = 0; i < ST_FRONTS; ++i) {
    st_front_t *f = atomic_load_explicit(&t->fronts[i], memory_order_relaxed);
    if (f == NULL) continue;
    gmr__spin_lock(&f->lock);
    f->frozen = false;
    gmr__spin_unlock(&f->lock);
  }
}

void gmr__st_fronts_fini(stitch_t *t) {
  for (size_t i = 0; i < ST_FRONTS; ++i) {
    st_front_t *f = atomic_load_explicit(&t->fronts[i], memory_order_relaxed);
    if (f != NULL) gmr__free(f->raw);
    atomic_store_explicit(&t->fronts[i], NULL, memory_order_relaxed);
  }
  t->nfronts = 0;
}
