/* release.c: the device side of the caching policy's allocation: a new
 * segment (PyTorch's alloc_block) and what malloc does when none can be had
 * (garbage collection, the release of oversize cached blocks, the release
 * of every cached block and one retry, then the OOM error); and
 * empty_cache (release_cached_blocks).  Global path only (every lock held).
 * Map: internal.h, Note [Rooms].
 */
#include <stdlib.h>

#include "caching/internal.h"

/* ---- a pool's free blocks ---------------------------------------------------------- */

static size_t treap_collect(cache_block_t *t, cache_block_t **v, size_t n) {
  if (t == NULL) return n;
  n = treap_collect(t->left, v, n);
  v[n++] = t;
  return treap_collect(t->right, v, n);
}

/* Every free block of the pool in order into v from v[n] (p->n_blocks
 * entries); returns n + p->n_blocks. */
static size_t pool_collect(const cache_pool_t *p, cache_block_t **v, size_t n) {
  for (int k = cache_bin_next(p, 0); k >= 0; k = cache_bin_next(p, (unsigned)k + 1))
    n = treap_collect(p->bins[k], v, n);
  return n;
}

/* The first free block whose key is >= (size, ptr), or NULL. */
static cache_block_t *pool_lower_bound(const cache_pool_t *p, size_t size, uintptr_t ptr) {
  unsigned k = cache_bin(p, size);
  cache_block_t *b = treap_lower_bound(p->bins[k], size, ptr, false);
  return b != NULL ? b : pool_first_from(p, k + 1);
}

/* ---- releasing cached memory ------------------------------------------------------ */

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
    err = gmr__cache_unmap_block(c, b);
    if (err == 0 && !cache_is_split(b) && !b->mapped) err = gmr__cache_release_expandable(c, b);
  }
  gmr__free(v);
  return err;
}

/* release_cached_blocks: wait for every event, then release. */
int gmr__cache_release_cached(cache_t *c) {
  int err = gmr__cache_sync_events(c);
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

/* ---- a new segment, and the retry before OOM ---------------------------------------- */

/* alloc_block: a new segment (or mapped pages).  0 with *out NULL when the
 * device, or the memory fraction, refuses. */
static int cache_alloc_block(cache_t *c, cache_pool_t *p, size_t size, size_t alloc_size,
                             bool retry, cache_block_t **out) {
  *out = NULL;
  if (retry) ++c->st.num_alloc_retries;
  if (c->fraction_set && c->total_allocated + alloc_size > c->allowed_max) return 0;
  if (c->conf.expandable) return gmr__cache_try_expandable(c, p, size, out);
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

/* malloc when no cached block of pool p fits `size` bytes: a new segment of
 * alloc_size bytes, after garbage collection when it is on; else one after
 * releasing oversize cached blocks; else one after releasing every cached
 * block (a retry); else the OOM error.  0 with *out the new block (in no
 * tree), or the error. */
int gmr__cache_alloc_new(cache_t *c, cache_pool_t *p, size_t size, size_t alloc_size,
                         cache_block_t **out) {
  int err;
  cache_block_t *b = NULL;
  if (c->fraction_set && c->conf.gc_threshold > 0 && (err = cache_garbage_collect(c)) != 0)
    return err;
  if ((err = cache_alloc_block(c, p, size, alloc_size, false, &b)) != 0) return err;
  if (b == NULL) {
    bool released;
    if ((err = cache_release_available(c, p, size, &released)) != 0) return err;
    if (released && (err = cache_alloc_block(c, p, size, alloc_size, false, &b)) != 0) return err;
  }
  if (b == NULL) {
    if ((err = gmr__cache_release_cached(c)) != 0) return err;
    if ((err = cache_alloc_block(c, p, size, alloc_size, true, &b)) != 0) return err;
  }
  if (b == NULL) return gmr__cache_oom(c, alloc_size);
  *out = b;
  return 0;
}
