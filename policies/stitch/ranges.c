/* ranges.c: the stitch policy's virtual address arena, ranges and their
 * mapping records, the map transaction, the cache of freed ranges and
 * eviction.
 *
 * Arena: a few large virtual reservations (va_chunk each, halved until the
 * device accepts); free intervals are kept sorted by address and merged
 * only within one reservation, so
 *   Σ free intervals + Σ ranges' nslots × P == Σ reservations (tiling).
 *
 * Map transaction (st_map_range): take the VA, phys_map each slot, then one
 * set_access over the whole range.  A failure at any step unmaps exactly the
 * slots mapped so far and gives the VA back; the pages and the indexes are
 * untouched, since ownership is committed only after the device calls.
 *
 * Cache: CACHED ranges are in an LRU list and a hash of their length; a hit
 * validates the range's spans lazily (free, stream-ready, dead gap <= tau).
 * Eviction unmaps a range only once the free that cached it has completed on
 * its stream (st_stamp_ready), least recently used first.
 */
#include <string.h>

#include "stitch/stitch.h"

/* ---- the arena --------------------------------------------------------------------------------
 */

static int va_insert(stitch_t *t, uint32_t i, st_va_t v) {
  if (t->nva == t->capva) {
    uint32_t cap = t->capva ? t->capva * 2 : 16;
    st_va_t *n = gmr__realloc(t->va, (size_t)cap * sizeof *n);
    if (n == NULL) return GMR_ENOMEM;
    t->va = n;
    t->capva = cap;
  }
  memmove(&t->va[i + 1], &t->va[i], (t->nva - i) * sizeof *t->va);
  t->va[i] = v;
  ++t->nva;
  return 0;
}

static uint32_t va_lower(const stitch_t *t, uintptr_t a) {
  uint32_t lo = 0, hi = t->nva;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (t->va[mid].addr < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int va_reserve_more(stitch_t *t, uint64_t size) {
  uint64_t want = t->o.va_chunk ? t->o.va_chunk : 2 * t->device_total;
  if (want < size) want = size;
  want = gmr__align_up(want, t->P);
  if (t->nres == t->capres) {
    uint32_t cap = t->capres ? t->capres * 2 : 4;
    st_res_t *n = gmr__realloc(t->res, (size_t)cap * sizeof *n);
    if (n == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for the arena");
    t->res = n;
    t->capres = cap;
  }
  /* Keep room for the new free interval before reserving. */
  if (t->nva == t->capva) {
    uint32_t cap = t->capva ? t->capva * 2 : 16;
    st_va_t *n = gmr__realloc(t->va, (size_t)cap * sizeof *n);
    if (n == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for the arena");
    t->va = n;
    t->capva = cap;
  }
  for (;;) {
    void *base = NULL;
    int err = gmr__backend_va_reserve(t->base.backend, want, &base);
    if (err == 0) {
      t->res[t->nres] = (st_res_t){(uintptr_t)base, want};
      va_insert(t, va_lower(t, (uintptr_t)base), (st_va_t){(uintptr_t)base, want, t->nres});
      ++t->nres;
      return 0;
    }
    if (err != GMR_ENOMEM || want / 2 < size) return err;
    want = gmr__align_up(want / 2, t->P);
  }
}

int st_va_take(stitch_t *t, uint64_t size, uintptr_t *out) {
  for (int round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < t->nva; ++i) {
      st_va_t *v = &t->va[i];
      if (v->size < size) continue;
      *out = v->addr;
      v->addr += size;
      v->size -= size;
      if (v->size == 0) {
        memmove(&t->va[i], &t->va[i + 1], (t->nva - i - 1) * sizeof *t->va);
        --t->nva;
      }
      t->va_used += size;
      return 0;
    }
    if (round == 0) {
      int err = va_reserve_more(t, size);
      if (err != 0) return err;
    }
  }
  return gmr__error_set(GMR_ENOMEM, "stitch: no virtual range of %llu bytes",
                        (unsigned long long)size);
}

static uint32_t res_of(const stitch_t *t, uintptr_t a) {
  for (uint32_t r = 0; r < t->nres; ++r)
    if (a >= t->res[r].base && a < t->res[r].base + t->res[r].size) return r;
  return ST_NIL;
}

void st_va_give(stitch_t *t, uintptr_t addr, uint64_t size) {
  uint32_t res = res_of(t, addr);
  gmr_assert(res != ST_NIL);
  t->va_used -= size;
  uint32_t i = va_lower(t, addr);
  bool prev = i > 0 && t->va[i - 1].res == res && t->va[i - 1].addr + t->va[i - 1].size == addr;
  bool next = i < t->nva && t->va[i].res == res && addr + size == t->va[i].addr;
  if (prev && next) {
    t->va[i - 1].size += size + t->va[i].size;
    memmove(&t->va[i], &t->va[i + 1], (t->nva - i - 1) * sizeof *t->va);
    --t->nva;
  } else if (prev) {
    t->va[i - 1].size += size;
  } else if (next) {
    t->va[i].addr = addr;
    t->va[i].size += size;
  } else if (va_insert(t, i, (st_va_t){addr, size, res}) != 0) {
    /* Out of host memory: the addresses stay unusable until the reservation
     * goes; the tiling check counts them as lost. */
  }
}

void st_va_fini(stitch_t *t) {
  for (uint32_t r = 0; r < t->nres; ++r)
    gmr__backend_va_release(t->base.backend, (void *)t->res[r].base, t->res[r].size);
  gmr__free(t->res);
  gmr__free(t->va);
  t->res = NULL;
  t->va = NULL;
  t->nres = t->nva = 0;
}

/* ---- ranges -----------------------------------------------------------------------------------
 */

st_range_t *st_range_alloc(uint32_t nslots) {
  size_t sz = sizeof(st_range_t) + nslots * (sizeof(st_map_t) + sizeof(uint32_t));
  st_range_t *r = gmr__calloc(1, sz);
  if (r == NULL) return NULL;
  r->nslots = nslots;
  r->maps = (st_map_t *)(r + 1);
  r->pages = (uint32_t *)(r->maps + nslots);
  return r;
}

void st_range_link(stitch_t *t, st_range_t *r) {
  r->all_prev = NULL;
  r->all_next = t->all;
  if (t->all != NULL) t->all->all_prev = r;
  t->all = r;
}

void st_range_destroy(stitch_t *t, st_range_t *r) {
  if (r->all_prev != NULL)
    r->all_prev->all_next = r->all_next;
  else if (t->all == r)
    t->all = r->all_next;
  if (r->all_next != NULL) r->all_next->all_prev = r->all_prev;
  gmr__free(r->uses);
  gmr__free(r);
}

static void map_unlink(stitch_t *t, st_map_t *m) {
  st_page_t *p = &t->pages[m->page];
  if (m->prev != NULL)
    m->prev->next = m->next;
  else
    p->maps = m->next;
  if (m->next != NULL) m->next->prev = m->prev;
  --p->nmaps;
  --t->nmappings;
  gmr__stat_decrease(&t->st.mappings, 1);
  /* A FREE page that no range maps any more moves to the unmapped list. */
  if (p->where == ST_W_FREE && p->nmaps == 0) st_page_reindex(t, m->page);
}

int st_map_range(stitch_t *t, st_range_t *r) {
  gmr_backend_t *be = t->base.backend;
  uint64_t bytes = (uint64_t)r->nslots * t->P;
  uint64_t t0 = gmr__backend_now_ns(be);
  uintptr_t va = 0;
  int err = st_va_take(t, bytes, &va);
  if (err != 0) return err;
  uint32_t j = 0;
  for (; j < r->nslots; ++j) {
    err = gmr__backend_phys_map(be, (void *)(va + j * t->P), t->P, t->pages[r->pages[j]].h, 0);
    ++t->st.map_calls;
    if (err != 0) break;
  }
  if (err == 0) {
    err = gmr__backend_set_access(be, (void *)va, bytes);
    ++t->st.access_calls;
  }
  if (err != 0) { /* undo exactly the slots mapped */
    while (j > 0) {
      --j;
      gmr__backend_phys_unmap(be, (void *)(va + j * t->P), t->P);
      ++t->st.unmap_calls;
    }
    st_va_give(t, va, bytes);
    t->st.map_ns += gmr__backend_now_ns(be) - t0;
    return err;
  }
  r->va = va;
  r->nmapped = r->nslots;
  for (j = 0; j < r->nslots; ++j) {
    st_map_t *m = &r->maps[j];
    st_page_t *p = &t->pages[r->pages[j]];
    *m = (st_map_t){.r = r, .slot = j, .page = r->pages[j], .prev = NULL, .next = p->maps};
    if (p->maps != NULL) p->maps->prev = m;
    p->maps = m;
    ++p->nmaps;
  }
  t->nmappings += r->nslots;
  gmr__stat_increase(&t->st.mappings, r->nslots);
  gmr__stat_increase(&t->st.va, (int64_t)bytes);
  t->st.map_ns += gmr__backend_now_ns(be) - t0;
  return 0;
}

int st_slot_unmap(stitch_t *t, st_range_t *r, uint32_t j) {
  int err = gmr__backend_phys_unmap(t->base.backend, (void *)(r->va + j * t->P), t->P);
  ++t->st.unmap_calls;
  if (err != 0) return err;
  map_unlink(t, &r->maps[j]);
  r->maps[j].r = NULL;
  --r->nmapped;
  return 0;
}

int st_slot_map(stitch_t *t, st_range_t *r, uint32_t j, uint32_t page) {
  gmr_backend_t *be = t->base.backend;
  void *at = (void *)(r->va + j * t->P);
  uint64_t t0 = gmr__backend_now_ns(be);
  int err = gmr__backend_phys_map(be, at, t->P, t->pages[page].h, 0);
  ++t->st.map_calls;
  if (err == 0) {
    err = gmr__backend_set_access(be, at, t->P);
    ++t->st.access_calls;
    if (err != 0) {
      gmr__backend_phys_unmap(be, at, t->P);
      ++t->st.unmap_calls;
    }
  }
  t->st.map_ns += gmr__backend_now_ns(be) - t0;
  if (err != 0) return err;
  st_page_t *p = &t->pages[page];
  st_map_t *m = &r->maps[j];
  r->pages[j] = page;
  *m = (st_map_t){.r = r, .slot = j, .page = page, .prev = NULL, .next = p->maps};
  if (p->maps != NULL) p->maps->prev = m;
  p->maps = m;
  ++p->nmaps;
  ++r->nmapped;
  ++t->nmappings;
  gmr__stat_increase(&t->st.mappings, 1);
  return 0;
}

int st_unmap_range(stitch_t *t, st_range_t *r) {
  for (uint32_t j = r->nslots; j > 0 && r->nmapped > 0; --j) {
    if (r->maps[j - 1].r == NULL) continue; /* a slot left empty by a failed repair */
    int err = st_slot_unmap(t, r, j - 1);
    if (err != 0) {
      /* Keep the slots still mapped on record; the range is never used again. */
      r->state = ST_R_BROKEN;
      return err;
    }
  }
  uint64_t bytes = (uint64_t)r->nslots * t->P;
  st_va_give(t, r->va, bytes);
  gmr__stat_decrease(&t->st.va, (int64_t)bytes);
  st_range_destroy(t, r);
  return 0;
}

/* ---- the cache --------------------------------------------------------------------------------
 */

uint32_t st_cache_bucket(const stitch_t *t, uint64_t len) {
  uint64_t h = (len / ST_G) * 0x9E3779B97F4A7C15ull;
  return (uint32_t)((h ^ (h >> 29)) & (t->nbuckets - 1));
}

/* Chains are kept in the order the ranges were last handed out, so that of
 * several usable cached ranges of one length, the one handed out first in
 * the last iteration of a loop is handed out first again: every block gets
 * the range it had, whatever order the loop freed them in, and the pages
 * that stay free between allocations are the same in every iteration (the
 * most recently freed range would permute them, and a permutation breaks
 * the ranges of blocks that come later). */
static void bucket_insert(st_range_t **head, st_range_t *r) {
  st_range_t *prev = NULL, *at = *head;
  while (at != NULL && at->tick < r->tick) {
    prev = at;
    at = at->b_next;
  }
  r->b_prev = prev;
  r->b_next = at;
  if (at != NULL) at->b_prev = r;
  if (prev != NULL)
    prev->b_next = r;
  else
    *head = r;
}

static void buckets_grow(stitch_t *t) {
  uint32_t n = t->nbuckets ? t->nbuckets * 2 : 256;
  st_range_t **b = gmr__calloc(n, sizeof *b);
  if (b == NULL) return; /* keep the old table: longer chains, still correct */
  st_range_t **old = t->buckets;
  uint32_t nold = t->nbuckets;
  t->buckets = b;
  t->nbuckets = n;
  for (uint32_t i = 0; i < nold; ++i) {
    st_range_t *r = old[i];
    while (r != NULL) {
      st_range_t *next = r->b_next;
      bucket_insert(&b[st_cache_bucket(t, r->len)], r);
      r = next;
    }
  }
  gmr__free(old);
}

void st_cache_put(stitch_t *t, st_range_t *r) {
  if (t->ncached + 1 > 2 * t->nbuckets) buckets_grow(t);
  r->state = ST_R_CACHED;
  bucket_insert(&t->buckets[st_cache_bucket(t, r->len)], r);
  r->lru_prev = NULL;
  r->lru_next = t->lru_head;
  if (t->lru_head != NULL)
    t->lru_head->lru_prev = r;
  else
    t->lru_tail = r;
  t->lru_head = r;
  ++t->ncached;
}

void st_cache_remove(stitch_t *t, st_range_t *r) {
  if (r->b_prev != NULL)
    r->b_prev->b_next = r->b_next;
  else
    t->buckets[st_cache_bucket(t, r->len)] = r->b_next;
  if (r->b_next != NULL) r->b_next->b_prev = r->b_prev;
  if (r->lru_prev != NULL)
    r->lru_prev->lru_next = r->lru_next;
  else
    t->lru_head = r->lru_next;
  if (r->lru_next != NULL)
    r->lru_next->lru_prev = r->lru_prev;
  else
    t->lru_tail = r->lru_prev;
  r->b_prev = r->b_next = r->lru_prev = r->lru_next = NULL;
  --t->ncached;
}

bool st_range_usable(stitch_t *t, const st_range_t *r, uint32_t sidx) {
  for (uint32_t j = 0; j < r->nslots; ++j) {
    uint32_t a, b;
    st_span(t, r, j, &a, &b);
    if (!st_span_usable(t, r->pages[j], a, b, sidx)) return false;
  }
  return true;
}

st_range_t *st_cache_lookup(stitch_t *t, uint64_t len, uint32_t sidx) {
  if (t->ncached == 0) return NULL;
  int64_t tries = t->o.cache_candidates;
  for (st_range_t *r = t->buckets[st_cache_bucket(t, len)]; r != NULL && tries > 0; r = r->b_next) {
    if (r->len != len) continue;
    --tries;
    if (st_range_usable(t, r, sidx)) return r;
  }
  return NULL;
}

void st_cache_miss(stitch_t *t, uint64_t len, uint32_t sidx) {
  st_range_t *r = t->buckets[st_cache_bucket(t, len)];
  while (r != NULL) {
    st_range_t *next = r->b_next;
    if (r->len == len && t->o.stale_misses > 0 && !st_range_usable(t, r, sidx) &&
        ++r->stale >= (uint32_t)t->o.stale_misses &&
        st_stamp_ready(t, r->last_use, UINT32_MAX, false)) {
      st_cache_remove(t, r);
      ++t->st.evictions;
      st_unmap_range(t, r);
    }
    r = next;
  }
}

void st_range_own(stitch_t *t, st_range_t *r) {
  for (uint32_t j = 0; j < r->nslots; ++j) {
    uint32_t a, b;
    st_span(t, r, j, &a, &b);
    st_span_take(t, r->pages[j], a, b, r);
  }
  r->state = ST_R_LIVE;
}

void st_range_release(stitch_t *t, st_range_t *r, st_stamp_t stamp) {
  for (uint32_t j = 0; j < r->nslots; ++j) {
    uint32_t a, b;
    st_span(t, r, j, &a, &b);
    st_span_give(t, r->pages[j], a, b, stamp);
  }
  r->last_use = stamp;
  r->nuses = 0;
  st_cache_put(t, r);
}

/* ---- eviction ---------------------------------------------------------------------------------
 */

static bool over_caps(const stitch_t *t, uint32_t need_maps, uint64_t need_va) {
  uint64_t budget = t->o.va_budget ? t->o.va_budget : 4 * t->device_total;
  return (int64_t)(t->nmappings + need_maps) > t->o.max_mappings || t->va_used + need_va > budget;
}

int st_evict(stitch_t *t, uint32_t need_maps, uint64_t need_va, bool all) {
  st_range_t *r = t->lru_tail;
  int err = 0;
  while (r != NULL && (all || over_caps(t, need_maps, need_va))) {
    st_range_t *prev = r->lru_prev;
    if (st_stamp_ready(t, r->last_use, UINT32_MAX, all)) {
      st_cache_remove(t, r);
      ++t->st.evictions;
      int e = st_unmap_range(t, r);
      if (e != 0 && err == 0) err = e;
    }
    r = prev;
  }
  return err;
}

bool st_evict_page(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  st_map_t *m = p->maps;
  while (m != NULL && (int64_t)p->nmaps >= t->o.max_maps_per_page) {
    st_map_t *next = m->next;
    st_range_t *r = m->r;
    if (r->state == ST_R_CACHED && st_stamp_ready(t, r->last_use, UINT32_MAX, false)) {
      /* The range's own records on this page go with it; restart the walk,
       * since `next` may belong to the range being unmapped. */
      st_cache_remove(t, r);
      ++t->st.evictions;
      if (st_unmap_range(t, r) != 0) return false;
      m = p->maps;
      continue;
    }
    m = next;
  }
  return (int64_t)p->nmaps < t->o.max_maps_per_page;
}

void st_ranges_fini(stitch_t *t) {
  /* Every range, whatever its state: unmap and free. */
  while (t->all != NULL) {
    st_range_t *r = t->all;
    if (r->state == ST_R_CACHED) st_cache_remove(t, r);
    if (st_unmap_range(t, r) != 0) st_range_destroy(t, r); /* device refused: forget it */
  }
  gmr__free(t->buckets);
  t->buckets = NULL;
  t->nbuckets = 0;
}
