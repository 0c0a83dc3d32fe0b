/* expandable.c: the caching policy's expandable segments
 * (expandable_segments:True): one virtual range per stream and pool, grown
 * by mapping pages under the blocks that need them and shrunk by unmapping
 * the pages wholly inside free blocks (PyTorch's ExpandableSegment,
 * map_block, unmap_block, find_expandable_block).  Global path only (every
 * lock held).  Map: internal.h, Note [Rooms].
 */
#include "caching/internal.h"

/* try_merge_blocks: merge `src` into `dst` (dst is in no tree); returns the
 * bytes subsumed, 0 when refused. */
static size_t cache_try_merge(cache_block_t *dst, cache_block_t *src) {
  return cache_mergeable(dst, src) ? cache_merge_into(dst, src) : 0;
}

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
  int err = gmr__cache_records_reserve(p->stream, 1);
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
int gmr__cache_unmap_block(cache_t *c, cache_block_t *b) {
  cache_seg_t *s = b->seg;
  cache_pool_t *p = b->pool;
  size_t off = b->ptr - s->base;
  size_t first = (off + s->page - 1) / s->page, last = (off + b->size) / s->page;
  if (first >= last) return 0;
  int err = gmr__cache_records_reserve(p->stream, 2);
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

int gmr__cache_release_expandable(cache_t *c, cache_block_t *b) {
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
  int err = gmr__cache_records_reserve(p->stream, 1);
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
int gmr__cache_try_expandable(cache_t *c, cache_pool_t *p, size_t size, cache_block_t **out) {
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

/* cache_destroy's unmap of the expandable segment s: every mapped page,
 * once (two blocks may share one). */
void gmr__cache_unmap_segment(cache_t *c, cache_seg_t *s) {
  size_t next_page = 0;
  for (cache_block_t *b = s->head, *bn; b; b = bn) {
    bn = b->next;
    if (b->mapped) {
      size_t first = (b->ptr - s->base) / s->page;
      size_t last = (b->ptr - s->base + b->size + s->page - 1) / s->page;
      if (first < next_page) first = next_page;
      seg_unmap_pages(c, s, first, last, NULL);
      if (last > next_page) next_page = last;
    }
  }
}
