/* ranges.c: the stitch policy's virtual address arena, ranges and their
 * mapping records, the map transaction, the cache of freed ranges and
 * eviction.
 * Map: Note [Arena], [Map transaction], [Cache order], [Parking].
 */
#include <stdlib.h>
#include <string.h>

#include "stitch/internal.h"

/* Note [Arena]
 * A few large virtual reservations (va_chunk each, halved until the device
 * accepts); free intervals are kept sorted by address and merged only within
 * one reservation, so
 *   Σ free intervals + Σ ranges' nslots × P == Σ reservations (tiling).
 */

/* Note [Map transaction]
 * Map transaction (gmr__st_map_range): take the VA, phys_map each run of
 * slots (one slot, or slots whose pages are consecutive in one chunk: Note
 * [Chunks], pages.c), then one set_access over the whole range.  A failure
 * at any step unmaps exactly the runs mapped so far and gives the VA back;
 * the pages and the indexes are untouched, since ownership is committed
 * only after the device calls.
 */

/* Note [Cache order]
 * Every range is filed under its length in serial (creation) order; CACHED
 * ranges are also in an LRU list.  A request takes the OLDEST cached range of
 * its length that it can use now (its slots free, or parked under other cached
 * ranges, stream stamps complete, dead gaps <= tau); only if there is none
 * does it stitch a new range, which is younger than all.  In a loop that
 * repeats itself this converges: if an iteration hands out the same ranges as
 * the one before up to some request, the pages owned at that request are the
 * same, so the same older ranges are unusable and the same one is the oldest
 * usable (ranges made later in the last iteration are younger and never
 * preferred); where the last iteration missed and stitched a range, that range
 * is now the oldest usable one.  By induction the iteration after one with a
 * miss repeats it with none: no page map once a loop has run twice.
 * (Preferring the most recently freed range, or predicting each range's
 * successor, permutes the pages that stay free between allocations and keeps
 * breaking the ranges of later blocks.)
 */

/* Note [Resizing]
 * Lengths that never repeat (a KV cache growing by one token a step, every
 * request a new batch and prompt) would miss every time.  On a miss, a cached
 * range whose length is within ST_RESIZE of the request's and whose last
 * slot is a partial tail span [0, b) of its page that can end at the new
 * b' in (0, P) of the same page serves it: the page is mapped whole at that
 * slot, so growing or shrinking the span is no device call; only the bytes
 * [b, b') (growing) must be free and ready for the stream, with the dead
 * gap to a head slot on the page <= tau.  No range is resized to a length
 * of whole pages (it would have two partial ends; a range of length P must
 * be one whole page for the small pool, which takes those).  The nearest length is tried
 * first, the shorter before the longer.  The range is filed again under its
 * new length with a new serial (the youngest of that length, as a stitched
 * range would be), so Note [Cache order] still holds for every length; a
 * length that repeats hits its own ranges first, and only a miss resizes.
 * A growing cache then moves to a new range only when its block crosses a
 * page boundary, once every P / (bytes per step) steps.  A range that grew,
 * or that a miss stitched while a shorter cached range was near (the length
 * grows), is marked `grows`, and no other block's head slot is placed on
 * its last page while it owns that page's tail (stitch.c, find_partial):
 * the next step grows into those bytes.  A miss probes only the lengths
 * whose counter in `lenf` (cached ranges by len / 4 KiB, folded into 4096
 * counters, kept by st_cache_put and st_cache_remove) is not 0, so a miss
 * with no cached length near it costs 256 array reads, not 256 lookups.
 */

/* Note [Parking]
 * A freed range keeps its whole pages (full_owner = the CACHED range, nparked
 * counts them) and gives back only its partial end slots, so a free and the
 * next hit touch at most two pages whatever the length.  Parked pages are free
 * memory: a cached range that maps a page parked under another counts it free,
 * and taking it unparks the other range first; a FREE page wanted for a stitch
 * or a small segment unparks every cached range (gmr__st_unpark_all).
 * Unparking files a range's whole pages FREE, stamped with the range's last
 * free.
 *   parked(r) ⇒ r CACHED ∧ ∀ whole slot j: pages[j].full_owner = r
 *   nparked = Σ_{parked r} r.nwhole
 * Eviction unmaps a range only once the free that cached it has completed on
 * its stream (gmr__st_stamp_ready), least recently used first.
 */

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

/* see Note [Arena] */
int gmr__st_va_take(stitch_t *t, uint64_t size, uintptr_t *out) {
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

void gmr__st_va_give(stitch_t *t, uintptr_t addr, uint64_t size) {
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

void gmr__st_va_fini(stitch_t *t) {
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

st_range_t *gmr__st_range_alloc(uint32_t nslots) {
  size_t sz = sizeof(st_range_t) + nslots * (sizeof(st_map_t) + sizeof(uint32_t));
  st_range_t *r = gmr__calloc(1, sz);
  if (r == NULL) return NULL;
  r->nslots = nslots;
  r->maps = (st_map_t *)(r + 1);
  r->pages = (uint32_t *)(r->maps + nslots);
  return r;
}

/* ---- ranges by length --------------------------------------------------------------------------
 */

/* The entry of len, made if missing (NULL: out of host memory).  Growing
 * drops the entries of lengths that have no range any more. */
static st_len_t *len_get(stitch_t *t, uint64_t len) {
  st_len_t *e = st_len_find(t, len);
  if (e != NULL) return e;
  if (2 * (t->nlens + 1) > t->caplens) {
    uint32_t live = 1;
    for (uint32_t i = 0; i < t->caplens; ++i)
      live += t->lens[i].first != NULL;
    uint32_t cap = 256;
    while (2 * live > cap / 2)
      cap *= 2; /* at most a quarter full after growing */
    st_len_t *n = gmr__calloc(cap, sizeof *n), *old = t->lens;
    if (n == NULL) return NULL;
    uint32_t oldcap = t->caplens;
    t->lens = n;
    t->caplens = cap;
    t->nlens = 0;
    for (uint32_t i = 0; i < oldcap; ++i)
      if (old[i].first != NULL) {
        *st_len_slot(t, old[i].len) = old[i];
        ++t->nlens;
      }
    gmr__free(old);
  }
  e = st_len_slot(t, len);
  e->len = len;
  ++t->nlens;
  return e;
}

/* r, the youngest of its length: last in e's list, with a new serial. */
static void len_append(stitch_t *t, st_len_t *e, st_range_t *r) {
  r->serial = ++t->serials;
  r->len_prev = e->last;
  r->len_next = NULL;
  if (e->last != NULL)
    e->last->len_next = r;
  else
    e->first = r;
  e->last = r;
}

/* r out of e's list. */
static void len_unlink(st_len_t *e, st_range_t *r) {
  if (r->len_prev != NULL)
    r->len_prev->len_next = r->len_next;
  else
    e->first = r->len_next;
  if (r->len_next != NULL)
    r->len_next->len_prev = r->len_prev;
  else
    e->last = r->len_prev;
}

int gmr__st_range_link(stitch_t *t, st_range_t *r) {
  st_len_t *e = len_get(t, r->len);
  if (e == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a range");
  len_append(t, e, r);
  r->all_prev = NULL;
  r->all_next = t->all;
  if (t->all != NULL) t->all->all_prev = r;
  t->all = r;
  return 0;
}

void gmr__st_range_destroy(stitch_t *t, st_range_t *r) {
  if (r->serial != 0) { /* linked */
    st_len_t *e = st_len_find(t, r->len);
    gmr_assert(e != NULL);
    len_unlink(e, r);
  }
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
  gmr__st_worth_unmapped(t, m->page, m->r);
  if (m->prev != NULL)
    m->prev->next = m->next;
  else
    p->maps = m->next;
  if (m->next != NULL) m->next->prev = m->prev;
  --p->nmaps;
  --t->nmappings;
  gmr__stat_decrease(&t->st.mappings, 1);
  /* A FREE page that no range maps any more moves to the unmapped list. */
  if (p->where == ST_W_FREE && p->nmaps == 0) gmr__st_page_reindex(t, m->page);
}

/* Slots [j, j + n) of r map pages consecutive in one chunk (Note [Chunks],
 * pages.c): the run of slots one phys_map call maps from slot j. */
static uint32_t run_from(const stitch_t *t, const st_range_t *r, uint32_t j) {
  const st_page_t *p = &t->pages[r->pages[j]];
  uint32_t n = 1;
  if (p->chunk != ST_NIL)
    while (j + n < r->nslots && t->pages[r->pages[j + n]].chunk == p->chunk &&
           t->pages[r->pages[j + n]].coff == p->coff + n)
      ++n;
  return n;
}

/* see Note [Map transaction] */
int gmr__st_map_range(stitch_t *t, st_range_t *r) {
  gmr_backend_t *be = t->base.backend;
  uint64_t bytes = (uint64_t)r->nslots * t->P;
  uint64_t t0 = gmr__backend_now_ns(be);
  uintptr_t va = 0;
  int err = gmr__st_va_take(t, bytes, &va);
  if (err != 0) return err;
  uint32_t j = 0;
  for (uint32_t n; j < r->nslots; j += n) {
    const st_page_t *p = &t->pages[r->pages[j]];
    n = run_from(t, r, j);
    err = gmr__backend_phys_map(be, (void *)(va + j * t->P), n * t->P, p->h,
                                p->chunk != ST_NIL ? p->coff * t->P : 0);
    ++t->st.map_calls;
    if (err != 0) break;
    r->maps[j].run = n;
    ++t->nruns;
  }
  if (err == 0) {
    err = gmr__backend_set_access(be, (void *)va, bytes);
    ++t->st.access_calls;
  }
  if (err != 0) { /* undo exactly the runs mapped, the last first */
    while (j > 0) {
      do
        --j;
      while (r->maps[j].run == 0);
      gmr__backend_phys_unmap(be, (void *)(va + j * t->P), r->maps[j].run * t->P);
      ++t->st.unmap_calls;
      r->maps[j].run = 0;
      --t->nruns;
    }
    gmr__st_va_give(t, va, bytes);
    t->st.map_ns += gmr__backend_now_ns(be) - t0;
    return err;
  }
  r->va = va;
  r->nmapped = r->nslots;
  for (j = 0; j < r->nslots; ++j) {
    st_map_t *m = &r->maps[j];
    st_page_t *p = &t->pages[r->pages[j]];
    *m = (st_map_t){
        .r = r, .slot = j, .page = r->pages[j], .run = m->run, .prev = NULL, .next = p->maps};
    if (p->maps != NULL) p->maps->prev = m;
    p->maps = m;
    ++p->nmaps; /* r is not cached: the page's worth stays (worth.c) */
  }
  t->nmappings += r->nslots;
  t->st.pages_mapped += r->nslots;
  gmr__stat_increase(&t->st.mappings, r->nslots);
  gmr__stat_increase(&t->st.va, (int64_t)bytes);
  t->st.map_ns += gmr__backend_now_ns(be) - t0;
  return 0;
}

int gmr__st_run_unmap(stitch_t *t, st_range_t *r, uint32_t j) {
  uint32_t n = r->maps[j].run;
  int err = gmr__backend_phys_unmap(t->base.backend, (void *)(r->va + j * t->P), n * t->P);
  ++t->st.unmap_calls;
  if (err != 0) return err;
  --t->nruns;
  for (uint32_t i = j + n; i > j; --i) { /* the last first, as the slots were unmapped one a call */
    map_unlink(t, &r->maps[i - 1]);
    r->maps[i - 1].r = NULL;
  }
  r->nmapped -= n;
  return 0;
}

int gmr__st_unmap_range(stitch_t *t, st_range_t *r) {
  gmr__st_unpark(t, r);
  for (uint32_t j = r->nslots; j > 0 && r->nmapped > 0;) {
    do /* the start of the run that ends at slot j - 1 */
      --j;
    while (r->maps[j].run == 0);
    if (r->maps[j].r == NULL) continue; /* unmapped by an earlier failed attempt */
    int err = gmr__st_run_unmap(t, r, j);
    if (err != 0) {
      /* Keep the slots still mapped on record; the range is never used
       * again, so its pages' worths change. */
      r->state = ST_R_BROKEN;
      for (uint32_t i = 0; i < r->nslots; ++i)
        if (r->maps[i].r != NULL) gmr__st_worth_touch(t, r->pages[i]);
      return err;
    }
  }
  uint64_t bytes = (uint64_t)r->nslots * t->P;
  gmr__st_va_give(t, r->va, bytes);
  gmr__stat_decrease(&t->st.va, (int64_t)bytes);
  gmr__st_range_destroy(t, r);
  return 0;
}

/* ---- the cache --------------------------------------------------------------------------------
 */

static inline bool slot_whole(const stitch_t *t, const st_range_t *r, uint32_t j) {
  uint32_t a, b;
  st_span(t, r, j, &a, &b);
  return a == 0 && b == (uint32_t)t->P;
}

/* May a block of r's take slot j for stream sidx?  A page parked under
 * another cached range counts free (unparked, it would be FREE) once that
 * range's last free is complete from sidx's view. */
static bool slot_free(stitch_t *t, const st_range_t *r, uint32_t j, uint32_t sidx) {
  uint32_t a, b, id = r->pages[j];
  st_span(t, r, j, &a, &b);
  const st_range_t *q = t->pages[id].full_owner;
  if (q == NULL) return gmr__st_span_usable(t, id, a, b, sidx);
  if (q == r) return st_stamp_ready_now(t, r->last_use, sidx); /* parked under r */
  return q->state == ST_R_CACHED && st_stamp_ready_now(t, q->last_use, sidx) &&
         st_page_ready(t, id, sidx);
}

bool gmr__st_range_usable(stitch_t *t, const st_range_t *r, uint32_t sidx) {
  if (r->parked) /* its whole pages are its own: the stream and the partial end slots */
    return st_stamp_ready_now(t, r->last_use, sidx) &&
           (!(r->ends & 1) || slot_free(t, r, 0, sidx)) &&
           (!(r->ends & 2) || slot_free(t, r, r->nslots - 1, sidx));
  for (uint32_t j = 0; j < r->nslots; ++j)
    if (!slot_free(t, r, j, sidx)) return false;
  return true;
}

/* see Note [Parking] */
void gmr__st_unpark(stitch_t *t, st_range_t *r) {
  if (!r->parked) return;
  for (uint32_t j = 0; j < r->nslots; ++j)
    if (slot_whole(t, r, j)) gmr__st_span_give(t, r->pages[j], 0, (uint32_t)t->P, r->last_use);
  r->parked = false;
  t->nparked -= r->nwhole;
}

/* see Note [Parking] */
void gmr__st_unpark_all(stitch_t *t) {
  for (st_range_t *r = t->lru_head; r != NULL && t->nparked > 0; r = r->lru_next)
    gmr__st_unpark(t, r);
}

/* see Note [Cache order] */
st_range_t *gmr__st_cache_lookup(stitch_t *t, uint64_t len, uint32_t sidx) {
  if (t->ncached == 0) return NULL;
  st_len_t *e = st_len_find(t, len);
  if (e == NULL) return NULL;
  int64_t tries = t->o.cache_candidates;
  for (st_range_t *r = e->first; r != NULL && tries > 0; r = r->len_next) {
    if (r->state != ST_R_CACHED) continue;
    --tries;
    if (gmr__st_range_usable(t, r, sidx)) return r;
  }
  return NULL;
}

/* Can r's block be len bytes with its last slot a partial tail span of the
 * same page? */
static bool resizable(const stitch_t *t, const st_range_t *r, uint64_t len) {
  if (r->state != ST_R_CACHED || r->nmapped != r->nslots) return false;
  if (r->nslots == 1 ? r->first_off != 0 || !(r->ends & 1) : !(r->ends & 2)) return false;
  uint64_t end = (uint64_t)r->first_off + len, last = (uint64_t)(r->nslots - 1) * t->P;
  return end > last && end < last + t->P;
}

/* File r under len, the youngest of that length. */
static int range_relen(stitch_t *t, st_range_t *r, uint64_t len) {
  if (len_get(t, len) == NULL) return GMR_ENOMEM; /* may move the table's entries */
  len_unlink(st_len_find(t, r->len), r);
  if (r->state == ST_R_CACHED) {
    --t->lenf[(r->len >> ST_LENF_SHIFT) & (ST_LENF - 1)];
    ++t->lenf[(len >> ST_LENF_SHIFT) & (ST_LENF - 1)];
  }
  r->len = len;
  len_append(t, st_len_find(t, len), r);
  return 0;
}

/* From length `was` on, going up (or down) by G to `lim`, the first length
 * whose filter counter is not 0 (empty 4 KiB classes skipped whole), or 0. */
static uint64_t resize_next(const stitch_t *t, uint64_t was, bool up, uint64_t lim) {
  while (up ? was <= lim : was >= lim) {
    uint64_t c = was >> ST_LENF_SHIFT;
    if (t->lenf[c & (ST_LENF - 1)] != 0) return was;
    if (up)
      was = (c + 1) << ST_LENF_SHIFT;
    else if (c == 0)
      return 0;
    else
      was = (c << ST_LENF_SHIFT) - ST_G;
  }
  return 0;
}

/* see Note [Resizing] */
st_range_t *gmr__st_cache_resize(stitch_t *t, uint64_t len, uint32_t sidx, bool *grows) {
  *grows = false;
  /* A length of whole pages stays a range of whole pages: the small pool
   * takes a cached range of length P as one whole page. */
  if (t->ncached == 0 || len % t->P == 0) return NULL;
  /* Lengths len -+ d for d = G, 2G, ..., ST_RESIZE, the shorter first. */
  uint64_t lo = len > ST_RESIZE + ST_G ? len - ST_RESIZE : ST_G, hi = len + ST_RESIZE;
  uint64_t dn = len > lo ? resize_next(t, len - ST_G, false, lo) : 0;
  uint64_t up = resize_next(t, len + ST_G, true, hi);
  while (dn != 0 || up != 0) {
    bool longer = dn == 0 || (up != 0 && up - len < len - dn);
    uint64_t was = longer ? up : dn;
    if (longer)
      up = resize_next(t, up + ST_G, true, hi);
    else
      dn = dn > lo ? resize_next(t, dn - ST_G, false, lo) : 0;
    st_len_t *e = st_len_find(t, was);
    if (e == NULL) continue;
    int64_t tries = t->o.cache_candidates;
    for (st_range_t *r = e->first; r != NULL && tries > 0; r = r->len_next) {
      if (!longer && r->state == ST_R_CACHED) *grows = true;
      if (!resizable(t, r, len)) continue;
      --tries;
      r->len = len;
      bool ok = gmr__st_range_usable(t, r, sidx);
      r->len = was;
      if (ok && range_relen(t, r, len) == 0) {
        r->grows = !longer;
        return r;
      }
    }
  }
  return NULL;
}

void gmr__st_cache_miss(stitch_t *t, uint64_t len, uint32_t sidx) {
  st_len_t *e = t->o.stale_misses > 0 && !st_fresh(t) ? st_len_find(t, len) : NULL;
  st_range_t *r = e != NULL ? e->first : NULL;
  while (r != NULL) {
    st_range_t *next = r->len_next;
    /* A range that recurs (handed out every `gap` ticks) is not stale
     * before it is two periods overdue. */
    bool due = r->gap == 0 || t->tick >= r->tick + 2 * r->gap;
    if (r->state == ST_R_CACHED && due && !gmr__st_range_usable(t, r, sidx) &&
        ++r->stale >= (uint32_t)t->o.stale_misses &&
        gmr__st_stamp_ready(t, r->last_use, UINT32_MAX, false)) {
      st_cache_remove(t, r);
      ++t->st.evictions;
      gmr__st_unmap_range(t, r);
    }
    r = next;
  }
}

/* r takes slot j's span, unparking the cached range the page is parked
 * under if it is another's. */
static void slot_take(stitch_t *t, st_range_t *r, uint32_t j) {
  uint32_t a, b;
  st_span(t, r, j, &a, &b);
  st_range_t *q = t->pages[r->pages[j]].full_owner;
  if (q != NULL && q != r) gmr__st_unpark(t, q);
  gmr__st_span_take(t, r->pages[j], a, b, r);
}

void gmr__st_range_own(stitch_t *t, st_range_t *r) {
  if (r->parked) { /* only the partial end slots change hands */
    r->parked = false;
    t->nparked -= r->nwhole;
    if (r->ends & 1) slot_take(t, r, 0);
    if ((r->ends & 2) && r->nslots > 1) slot_take(t, r, r->nslots - 1);
  } else {
    for (uint32_t j = 0; j < r->nslots; ++j)
      slot_take(t, r, j);
  }
  r->state = ST_R_LIVE;
}

void gmr__st_range_release(stitch_t *t, st_range_t *r, st_stamp_t stamp) {
  /* The partial end slots go back to their pages; the whole pages stay
   * parked under the range. */
  uint32_t a, b;
  if (r->ends & 1) {
    st_span(t, r, 0, &a, &b);
    gmr__st_span_give(t, r->pages[0], a, b, stamp);
  }
  if ((r->ends & 2) && r->nslots > 1) {
    st_span(t, r, r->nslots - 1, &a, &b);
    gmr__st_span_give(t, r->pages[r->nslots - 1], a, b, stamp);
  }
  r->parked = r->nwhole > 0;
  t->nparked += r->nwhole;
  r->last_use = stamp;
  r->nuses = 0;
  st_cache_put(t, r);
}

/* ---- FREE pages for a miss --------------------------------------------------------------------
 */

/* Take the FREE mapped pages in worth.c's order (the page wanted last
 * first), as they were at the start: eviction changes other pages'
 * mappings as we go.  Eviction only moves FREE pages between the two FREE
 * lists, so the ids read stay FREE. */
uint32_t gmr__st_collect_free(stitch_t *t, uint32_t n, uint32_t sidx, uint32_t *out) {
  uint32_t got = 0;
  /* Unmapped pages are worth nothing: take them first, as they come. */
  for (uint32_t id = t->free_head[0]; id != ST_NIL && got < n; id = t->pages[id].next)
    if (st_page_ready(t, id, sidx)) out[got++] = id;
  if (st_fresh(t)) return got;        /* no page of a cached range (Note [Graph capture]) */
  if (got < n) gmr__st_unpark_all(t); /* unparked pages are FREE and mapped: never in out[] yet */
  if (got == n || t->free_head[1] == ST_NIL) return got;
  st_worth_iter_t it;
  if (gmr__st_worth_begin(t, &it, n - got) != 0) return got;
  uint32_t id;
  while (got < n && gmr__st_worth_next(t, &it, &id))
    if (st_page_ready(t, id, sidx) &&
        ((int64_t)t->pages[id].nmaps < t->o.max_maps_per_page || gmr__st_evict_page(t, id)))
      out[got++] = id;
  gmr__st_worth_end(t, &it);
  return got;
}

/* ---- eviction ---------------------------------------------------------------------------------
 */

static bool over_caps(const stitch_t *t, uint32_t need_maps, uint64_t need_va) {
  uint64_t budget = t->o.va_budget ? t->o.va_budget : 4 * t->device_total;
  return (int64_t)(t->nmappings + need_maps) > t->o.max_mappings || t->va_used + need_va > budget;
}

/* see Note [Parking] */
int gmr__st_evict(stitch_t *t, uint32_t need_maps, uint64_t need_va, bool all) {
  st_range_t *r = st_fresh(t) ? NULL : t->lru_tail; /* see Note [Graph capture] */
  int err = 0;
  while (r != NULL && (all || over_caps(t, need_maps, need_va))) {
    st_range_t *prev = r->lru_prev;
    if (gmr__st_stamp_ready(t, r->last_use, UINT32_MAX, all)) {
      st_cache_remove(t, r);
      ++t->st.evictions;
      int e = gmr__st_unmap_range(t, r);
      if (e != 0 && err == 0) err = e;
    }
    r = prev;
  }
  return err;
}

bool gmr__st_evict_page(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  st_map_t *m = st_fresh(t) ? NULL : p->maps;
  while (m != NULL && (int64_t)p->nmaps >= t->o.max_maps_per_page) {
    st_map_t *next = m->next;
    st_range_t *r = m->r;
    if (r->state == ST_R_CACHED && gmr__st_stamp_ready(t, r->last_use, UINT32_MAX, false)) {
      /* The range's own records on this page go with it; restart the walk,
       * since `next` may belong to the range being unmapped. */
      st_cache_remove(t, r);
      ++t->st.evictions;
      if (gmr__st_unmap_range(t, r) != 0) return false;
      m = p->maps;
      continue;
    }
    m = next;
  }
  return (int64_t)p->nmaps < t->o.max_maps_per_page;
}

void gmr__st_ranges_fini(stitch_t *t) {
  /* Every range, whatever its state: unmap and free. */
  while (t->all != NULL) {
    st_range_t *r = t->all;
    if (r->state == ST_R_CACHED) st_cache_remove(t, r);
    if (gmr__st_unmap_range(t, r) != 0) gmr__st_range_destroy(t, r); /* device refused: forget it */
  }
  gmr__free(t->lens);
  t->lens = NULL;
  t->caplens = t->nlens = 0;
}
