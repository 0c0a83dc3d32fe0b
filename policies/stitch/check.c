/* check.c: the stitch policy's walk and invariant checker.
 *
 * The walk lists ranges in address order, each followed by its blocks; the
 * checker recounts the state and compares it with the design's invariants.
 * Map: Note [Stitch invariants].
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "stitch/internal.h"

/* Note [Stitch invariants]
 * The checker walks the design's invariants (internal.h):
 *  1. page partition: tail_end <= head_start, both multiples of G; FREE ⇔ no
 *     owner with tail_end = 0, head_start = P; every owner is a LIVE,
 *     PENDING or SMALL range that claims exactly that span;
 *  2. block coverage: a block's spans sum to its length, interior pages are
 *     its whole pages, at most one span is partial;
 *  3. VA ↔ PA: slot j of a mapped range has one mapping record, on the list
 *     of pages[j]; the block starts at va + first_off; the slots are tiled
 *     by runs, each one slot or pages consecutive in one chunk, mapped or
 *     unmapped whole;
 *  4. mappings: Σ nmaps == list lengths == mappings; nmaps <= the cap;
 *  5. cache: CACHED ⇔ in the LRU list; every range is filed once under
 *     its length, in serial order;
 *  6. accounting: reserved == live pages × P (the backend agrees);
 *     free + allocated + pending + dead gaps == reserved; every gap <= tau;
 *  7. indexes: each page is in the index its fields imply, once; class bits
 *     set ⇔ class list non-empty; small pool blocks tile their segment, no
 *     two free neighbours, free blocks indexed in their stream's class;
 *  8. VA arena: free intervals and ranges tile the reservations.
 * The log-based items (cross-stream reuse and unmap decisions, capture)
 * are enforced where the decisions are made (pages.c gmr__st_stamp_ready,
 * ranges.c gmr__st_evict, stitch.c alloc_large) rather than logged.
 */

/* ---- walk -------------------------------------------------------------------------------------
 */

static int walk_range(stitch_t *t, st_range_t *r, gmr_walk_cb cb, void *ud) {
  gmr_walk_entry_t e = {.is_segment = 1,
                        .address = r->va,
                        .size = (uint64_t)r->nslots * t->P,
                        .stream = t->streams[r->sidx].s,
                        .pool = r->state == ST_R_SMALL ? "small" : "large"};
  int rc = cb(&e, ud);
  if (rc != 0) return rc;
  if (r->state == ST_R_SMALL) {
    for (st_small_t *b = r->seg->first; b != NULL; b = b->next) {
      gmr_walk_entry_t x = {.address = r->va + b->off,
                            .size = b->size,
                            .requested = b->allocated ? b->requested : 0,
                            .state = b->pending     ? GMR_BLOCK_PENDING_FREE
                                     : b->allocated ? GMR_BLOCK_ALLOCATED
                                                    : GMR_BLOCK_FREE,
                            .stream = e.stream};
      if ((rc = cb(&x, ud)) != 0) return rc;
    }
    return 0;
  }
  /* A large range: the slot bytes before and after the block belong to
   * other blocks' spans, or are free; shown as unmapped from this range. */
  if (r->first_off > 0) {
    gmr_walk_entry_t x = {
        .address = r->va, .size = r->first_off, .state = GMR_BLOCK_UNMAPPED, .stream = e.stream};
    if ((rc = cb(&x, ud)) != 0) return rc;
  }
  gmr_walk_entry_t x = {.address = r->va + r->first_off,
                        .size = r->len,
                        .requested = r->state == ST_R_CACHED ? 0 : r->requested,
                        .state = r->state == ST_R_LIVE      ? GMR_BLOCK_ALLOCATED
                                 : r->state == ST_R_PENDING ? GMR_BLOCK_PENDING_FREE
                                                            : GMR_BLOCK_FREE,
                        .stream = e.stream};
  /* A block that holds a partial end slot shares that page with the block
   * holding the page's other slot (a CLOSED page). */
  bool owns = r->state == ST_R_LIVE || r->state == ST_R_PENDING;
  if (owns && r->first_off > 0) {
    const st_page_t *p = &t->pages[r->pages[0]];
    if (p->head_owner == r && p->tail_owner != NULL) {
      x.shared_head = t->P - r->first_off < r->len ? t->P - r->first_off : r->len;
      x.head_page = (uint64_t)r->pages[0] + 1;
    }
  }
  uint64_t last_end = r->first_off + r->len - (uint64_t)(r->nslots - 1) * t->P;
  if (owns && last_end < t->P && (r->nslots > 1 || r->first_off == 0)) {
    const st_page_t *p = &t->pages[r->pages[r->nslots - 1]];
    if (p->tail_owner == r && p->head_owner != NULL) {
      x.shared_tail = last_end;
      x.tail_page = (uint64_t)r->pages[r->nslots - 1] + 1;
    }
  }
  if ((rc = cb(&x, ud)) != 0) return rc;
  uint64_t end = r->first_off + r->len, total = (uint64_t)r->nslots * t->P;
  if (end < total) {
    gmr_walk_entry_t y = {.address = r->va + end,
                          .size = total - end,
                          .state = GMR_BLOCK_UNMAPPED,
                          .stream = e.stream};
    if ((rc = cb(&y, ud)) != 0) return rc;
  }
  return 0;
}

static int range_cmp(const void *a, const void *b) {
  uintptr_t x = (*(st_range_t *const *)a)->va, y = (*(st_range_t *const *)b)->va;
  return x < y ? -1 : x > y;
}

int gmr__st_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  stitch_t *t = (stitch_t *)self;
  size_t n = 0;
  for (st_range_t *r = t->all; r != NULL; r = r->all_next)
    n += r->state != ST_R_BROKEN;
  st_range_t **v = gmr__malloc((n ? n : 1) * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for the walk");
  n = 0;
  for (st_range_t *r = t->all; r != NULL; r = r->all_next)
    if (r->state != ST_R_BROKEN) v[n++] = r;
  qsort(v, n, sizeof *v, range_cmp);
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; ++i)
    rc = walk_range(t, v[i], cb, ud);
  gmr__free(v);
  return 0;
}

/* ---- the checker ------------------------------------------------------------------------------
 */

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) return gmr__error_set(GMR_EINVAL, "stitch check: " __VA_ARGS__);                  \
  } while (0)

static int check_owner(stitch_t *t, uint32_t id, st_range_t *o, const char *slot) {
  CHECK(o->state == ST_R_LIVE || o->state == ST_R_PENDING || o->state == ST_R_SMALL ||
            (o->state == ST_R_CACHED && o->parked && slot[0] == 'f'),
        "page %u's %s owner is a range in state %d", id, slot, o->state);
  for (uint32_t j = 0; j < o->nslots; ++j)
    if (o->pages[j] == id) return 0;
  return gmr__error_set(GMR_EINVAL, "stitch check: page %u's %s owner does not map it", id, slot);
}

/* nonempty = Σ popcount(l1[w]) (st_small_deferrable relies on it). */
static bool classes_counted(const st_classes_t *c) {
  uint32_t n = 0;
  for (uint32_t w = 0; w < c->n1; ++w)
    n += (uint32_t)__builtin_popcountll(c->l1[w]);
  return n == c->nonempty;
}

static int check_pages(stitch_t *t, uint64_t *free_b) {
  uint32_t P = (uint32_t)t->P, nfree = 0, nclosed = 0, nfull = 0, live = 0, nparked = 0;
  uint64_t dead = 0, open = 0, best_open = 0, maps = 0;
  for (uint32_t id = 0; id < t->npages; ++id) {
    st_page_t *p = &t->pages[id];
    if (p->where == ST_W_DEAD) continue;
    ++live;
    CHECK(p->tail_end % ST_G == 0 && p->head_start % ST_G == 0 && p->tail_end <= p->head_start &&
              p->head_start <= P,
          "page %u: tail_end %u, head_start %u", id, p->tail_end, p->head_start);
    CHECK((p->tail_owner == NULL) == (p->tail_end == 0), "page %u: tail owner vs tail_end %u", id,
          p->tail_end);
    CHECK((p->head_owner == NULL) == (p->head_start == P), "page %u: head owner vs head_start %u",
          id, p->head_start);
    int err;
    if (p->full_owner != NULL) {
      CHECK(p->tail_owner == NULL && p->head_owner == NULL, "page %u: full and partly owned", id);
      CHECK(p->where == ST_W_FULL, "page %u: full but filed as %d", id, p->where);
      if ((err = check_owner(t, id, p->full_owner, "full")) != 0) return err;
      ++nfull;
      nparked += p->full_owner->state == ST_R_CACHED;
    } else if (p->tail_owner == NULL && p->head_owner == NULL) {
      CHECK(p->where == ST_W_FREE && p->cls == (p->nmaps != 0), "page %u: free but filed as %d/%u",
            id, p->where, p->cls);
      ++nfree;
    } else if (p->tail_owner != NULL && p->head_owner != NULL) {
      CHECK(p->where == ST_W_CLOSED && p->cls * ST_G == p->head_start - p->tail_end,
            "page %u: closed but filed as %d", id, p->where);
      CHECK(p->head_start - p->tail_end <= t->o.tau, "page %u: dead gap %u > tau", id,
            p->head_start - p->tail_end);
      dead += p->head_start - p->tail_end;
      ++nclosed;
    } else {
      bool suffix = p->tail_owner != NULL;
      CHECK(p->where == (suffix ? ST_W_SUFFIX : ST_W_PREFIX), "page %u: partial, filed as %d", id,
            p->where);
      uint32_t cls = (suffix ? P - p->tail_end : p->head_start) / ST_G;
      CHECK(p->cls == cls, "page %u: in class %u, not %u", id, p->cls, cls);
      uint64_t o = suffix ? P - p->tail_end : p->head_start;
      open += o;
      if (o > best_open) best_open = o;
    }
    if (p->tail_owner && (err = check_owner(t, id, p->tail_owner, "tail")) != 0) return err;
    if (p->head_owner && (err = check_owner(t, id, p->head_owner, "head")) != 0) return err;
    uint32_t n = 0;
    for (st_map_t *m = p->maps; m != NULL; m = m->next, ++n) {
      CHECK(m->page == id && m->slot < m->r->nslots && &m->r->maps[m->slot] == m &&
                m->r->pages[m->slot] == id,
            "page %u: a mapping record that does not point back", id);
      CHECK(m->next == NULL || m->next->prev == m, "page %u: broken mapping list", id);
    }
    CHECK(n == p->nmaps, "page %u: %u mapping records, nmaps %u", id, n, p->nmaps);
    CHECK((int64_t)p->nmaps <= t->o.max_maps_per_page, "page %u: %u mappings > cap", id, p->nmaps);
    maps += n;
  }
  CHECK(live == t->live_pages && nfree == t->nfree && nclosed == t->nclosed && nfull == t->nfull,
        "page counts: live %u/%u free %u/%u closed %u/%u full %u/%u", live, t->live_pages, nfree,
        t->nfree, nclosed, t->nclosed, nfull, t->nfull);
  CHECK(nparked == t->nparked, "parked pages %u != %u", nparked, t->nparked);
  CHECK(dead == t->dead_bytes, "dead gaps %" PRIu64 " != %" PRIu64, dead, t->dead_bytes);
  CHECK(open == t->open_bytes, "open slots %" PRIu64 " != %" PRIu64, open, t->open_bytes);
  CHECK(best_open == gmr__st_largest_open(t), "largest open slot %" PRIu64 " != %" PRIu64,
        best_open, gmr__st_largest_open(t));
  CHECK(maps == t->nmappings && (int64_t)maps == t->st.mappings.current,
        "mappings %" PRIu64 " != %u", maps, t->nmappings);
  /* Index lists: every listed page is filed there; bits mirror the lists. */
  uint32_t listed = 0;
  for (int m = 0; m < 2; ++m)
    for (uint32_t id = t->free_head[m], prev = ST_NIL; id != ST_NIL;
         prev = id, id = t->pages[id].next) {
      CHECK(t->pages[id].where == ST_W_FREE && t->pages[id].cls == (uint32_t)m &&
                t->pages[id].prev == prev,
            "free list %d: page %u misfiled", m, id);
      if (t->pages[id].next == ST_NIL) CHECK(t->free_tail[m] == id, "free list %d: tail", m);
      CHECK(++listed <= t->nfree, "free lists longer than the free pages");
    }
  CHECK(listed == t->nfree, "free lists hold %u of %u free pages", listed, t->nfree);
  CHECK(gmr__st_worth_holds(t), "the FREE mapped pages by worth are out of order or stale");
  for (int w = 0; w < 2; ++w) {
    st_classes_t *c = w ? &t->prefix : &t->suffix;
    for (uint32_t k = 0; k < c->n; ++k) {
      /* A run of empty bitmap words: its heads must all be ST_NIL, which one
       * memcmp of the run against itself shifted by one says (all equal to
       * the first); a run that is not goes class by class, for the message. */
      if (k % 64 == 0 && c->l1[k / 64] == 0) {
        uint32_t end = k;
        while (end < c->n && c->l1[end / 64] == 0)
          end = end + 64 < c->n ? end + 64 : c->n;
        if (c->head[k] == ST_NIL &&
            memcmp(&c->head[k], &c->head[k + 1], (size_t)(end - k - 1) * sizeof *c->head) == 0) {
          k = end - 1;
          continue;
        }
      }
      bool bit = (c->l1[k / 64] >> (k % 64)) & 1;
      CHECK(bit == (c->head[k] != ST_NIL), "%s class %u: bit %d", w ? "prefix" : "suffix", k, bit);
      for (uint32_t id = c->head[k]; id != ST_NIL; id = t->pages[id].next)
        CHECK(t->pages[id].where == (w ? ST_W_PREFIX : ST_W_SUFFIX) && t->pages[id].cls == k,
              "page %u misfiled in %s class %u", id, w ? "prefix" : "suffix", k);
    }
    for (uint32_t z = 0; z < c->n1; ++z)
      CHECK(((c->l0[z / 64] >> (z % 64)) & 1) == (c->l1[z] != 0), "class summary word %u", z);
    CHECK(classes_counted(c), "%s classes: the count of non-empty ones", w ? "prefix" : "suffix");
  }
  *free_b = (uint64_t)(nfree + nparked) * P + open;
  return 0;
}

static int check_range(stitch_t *t, st_range_t *r, uint64_t *live_b, uint64_t *pend_b) {
  uint64_t P = t->P;
  CHECK(r->va % P == 0 && r->first_off % ST_G == 0 && r->first_off < P && r->len > 0 &&
            r->first_off + r->len <= (uint64_t)r->nslots * P &&
            r->first_off + r->len > (uint64_t)(r->nslots - 1) * P,
        "range at %#" PRIxPTR ": layout (off %u, len %" PRIu64 ", %u slots)", r->va, r->first_off,
        r->len, r->nslots);
  if (r->state != ST_R_BROKEN) {
    CHECK(r->nmapped == r->nslots, "range at %#" PRIxPTR ": %u of %u slots mapped", r->va,
          r->nmapped, r->nslots);
    uint64_t end = r->first_off + r->len - (uint64_t)(r->nslots - 1) * P;
    CHECK(r->nslots > 1 || r->first_off == 0 || end == P,
          "range at %#" PRIxPTR ": a one-slot block inside a page", r->va);
  }
  uint32_t mapped = 0;
  for (uint32_t j = 0; j < r->nslots; ++j) {
    if (r->maps[j].r == NULL && r->state == ST_R_BROKEN) continue;
    CHECK(r->maps[j].r == r && r->maps[j].slot == j && r->maps[j].page == r->pages[j] &&
              t->pages[r->pages[j]].where != ST_W_DEAD,
          "range at %#" PRIxPTR ": slot %u's mapping record", r->va, j);
    ++mapped;
  }
  CHECK(mapped == r->nmapped, "range at %#" PRIxPTR ": %u slots mapped, counted %u", r->va, mapped,
        r->nmapped);
  /* Runs (Note [Chunks], pages.c): they tile the slots, each of pages
   * consecutive in one chunk (or one slot), mapped or unmapped whole. */
  for (uint32_t j = 0, n; j < r->nslots; j += n) {
    n = r->maps[j].run;
    CHECK(n >= 1 && j + n <= r->nslots, "range at %#" PRIxPTR ": no run at slot %u", r->va, j);
    const st_page_t *p = &t->pages[r->pages[j]];
    for (uint32_t i = 1; i < n; ++i) {
      const st_page_t *q = &t->pages[r->pages[j + i]];
      CHECK(r->maps[j + i].run == 0 && p->chunk != ST_NIL && q->chunk == p->chunk &&
                q->coff == p->coff + i && (r->maps[j + i].r == NULL) == (r->maps[j].r == NULL),
            "range at %#" PRIxPTR ": slot %u in the run from slot %u", r->va, j + i, j);
    }
  }
  bool owns = r->state == ST_R_LIVE || r->state == ST_R_PENDING || r->state == ST_R_SMALL;
  uint32_t whole = 0;
  for (uint32_t j = 0; j < r->nslots; ++j) {
    uint32_t a, b;
    st_span(t, r, j, &a, &b);
    if (a != 0 || b != (uint32_t)P) continue;
    ++whole;
    if (r->parked)
      CHECK(t->pages[r->pages[j]].full_owner == r,
            "parked range at %#" PRIxPTR ": slot %u's page is not parked under it", r->va, j);
  }
  CHECK(r->seg != NULL || r->state == ST_R_SMALL || whole == r->nwhole,
        "range at %#" PRIxPTR ": %u whole slots, counted %u", r->va, whole, r->nwhole);
  CHECK(!r->parked || r->state == ST_R_CACHED, "range at %#" PRIxPTR ": parked but not cached",
        r->va);
  if (!owns) return 0;
  uint64_t sum = 0;
  for (uint32_t j = 0; j < r->nslots; ++j) {
    uint32_t a, b;
    st_span(t, r, j, &a, &b);
    st_page_t *p = &t->pages[r->pages[j]];
    bool ok = (a == 0 && b == P)   ? p->full_owner == r
              : (a == 0)           ? p->tail_owner == r && p->tail_end == b
              : (b == (uint32_t)P) ? p->head_owner == r && p->head_start == a
                                   : false;
    CHECK(ok, "range at %#" PRIxPTR ": slot %u's span [%u, %u) not owned by it", r->va, j, a, b);
    sum += b - a;
  }
  CHECK(sum == r->len, "range at %#" PRIxPTR ": spans cover %" PRIu64 " of %" PRIu64, r->va, sum,
        r->len);
  if (r->state == ST_R_LIVE) *live_b += r->len;
  if (r->state == ST_R_PENDING) *pend_b += r->len;
  return 0;
}

static int check_small(stitch_t *t, st_range_t *r, uint64_t *live_b, uint64_t *free_b,
                       uint64_t *pend_b) {
  st_small_seg_t *g = r->seg;
  CHECK(g != NULL && g->r == r && r->nslots == 1 && r->len == t->P,
        "small segment at %#" PRIxPTR ": shape", r->va);
  st_small_index_t *x = t->streams[g->sidx].small;
  CHECK(classes_counted(&x->cls), "small segment at %#" PRIxPTR ": its stream's class count",
        r->va);
  uint32_t off = 0, live = 0;
  for (st_small_t *b = g->first, *prev = NULL; b != NULL; prev = b, b = b->next) {
    CHECK(b->seg == g && b->off == off && b->prev == prev && b->size % ST_G == 0 && b->size > 0,
          "small segment at %#" PRIxPTR ": block at %u", r->va, b->off);
    if (!b->allocated) {
      CHECK(prev == NULL || prev->allocated, "small segment at %#" PRIxPTR ": two free neighbours",
            r->va);
      uint32_t c = b->size / ST_G < x->cls.n ? b->size / ST_G : x->cls.n - 1;
      bool found = false;
      for (st_small_t *f = x->heads[c]; f != NULL && !found; f = f->fnext)
        found = f == b;
      CHECK(found, "small segment at %#" PRIxPTR ": free block at %u not indexed", r->va, b->off);
      *free_b += b->size;
    } else {
      ++live;
      if (b->pending)
        *pend_b += b->size;
      else
        *live_b += b->size;
    }
    off += b->size;
  }
  CHECK(off == t->P, "small segment at %#" PRIxPTR ": blocks cover %u bytes", r->va, off);
  CHECK(live == g->live && g->on_empty == (live == 0), "small segment at %#" PRIxPTR ": live %u",
        r->va, live);
  return 0;
}

/* see Note [Stitch invariants] */
int gmr__st_check(gmr_policy_t *self) {
  stitch_t *t = (stitch_t *)self;
  uint64_t page_free = 0, live_b = 0, pend_b = 0, small_free = 0;
  int err = check_pages(t, &page_free);
  if (err != 0) return err;
  uint32_t cached = 0, smalls = 0;
  uint64_t va = 0;
  for (st_range_t *r = t->all; r != NULL; r = r->all_next) {
    CHECK(r->all_next == NULL || r->all_next->all_prev == r, "broken range list");
    if ((err = check_range(t, r, &live_b, &pend_b)) != 0) return err;
    if (r->state == ST_R_SMALL) {
      ++smalls;
      if ((err = check_small(t, r, &live_b, &small_free, &pend_b)) != 0) return err;
    }
    if (r->state == ST_R_CACHED) {
      ++cached;
    } else {
      CHECK(r->lru_prev == NULL && r->lru_next == NULL && t->lru_head != r,
            "range at %#" PRIxPTR " in state %d is on the LRU list", r->va, r->state);
    }
    va += (uint64_t)r->nslots * t->P;
  }
  uint32_t lru = 0;
  for (st_range_t *r = t->lru_head; r != NULL; r = r->lru_next) {
    CHECK(r->state == ST_R_CACHED, "a range in state %d on the LRU list", r->state);
    CHECK(++lru <= cached, "LRU list longer than the cached ranges");
  }
  CHECK(lru == cached && cached == t->ncached, "cache: %u on the LRU list, %u cached, count %u",
        lru, cached, t->ncached);
  { /* the resize filter (Note [Resizing]): subtract every cached range, leaving 0s */
    uint32_t left[ST_LENF];
    memcpy(left, t->lenf, sizeof left);
    for (st_range_t *r = t->lru_head; r != NULL; r = r->lru_next)
      --left[(r->len >> ST_LENF_SHIFT) & (ST_LENF - 1)];
    for (uint32_t f = 0; f < ST_LENF; ++f)
      CHECK(left[f] == 0, "resize filter: class %u counts %u cached ranges, %u more than are", f,
            t->lenf[f], left[f]);
  }
  /* Every linked range is filed once under its length, oldest first. */
  uint32_t filed = 0, linked = 0;
  for (st_range_t *r = t->all; r != NULL; r = r->all_next)
    linked += r->serial != 0;
  for (uint32_t k = 0; k < t->caplens; ++k) {
    const st_len_t *e = &t->lens[k];
    for (st_range_t *r = e->first, *prev = NULL; r != NULL; prev = r, r = r->len_next) {
      CHECK(e->len != 0 && r->len == e->len && r->len_prev == prev &&
                (prev == NULL || prev->serial < r->serial),
            "range at %#" PRIxPTR " misfiled under length %" PRIu64, r->va, e->len);
      CHECK(++filed <= linked, "the length lists hold more ranges than there are");
      CHECK(r->len_next != NULL || e->last == r, "length %" PRIu64 ": wrong last range", e->len);
    }
  }
  CHECK(filed == linked, "the length lists hold %u of %u ranges", filed, linked);
  CHECK(smalls == t->nsmall_segs, "small segments %u != %u", smalls, t->nsmall_segs);
  CHECK(small_free == t->small_free_bytes, "small pool free bytes %" PRIu64 " != %" PRIu64,
        small_free, t->small_free_bytes);
  /* Accounting. */
  uint64_t reserved = (uint64_t)t->live_pages * t->P;
  gmr_backend_t *be = t->base.backend;
  CHECK(atomic_load(&be->counters.reserved_bytes) == reserved,
        "device counts %" PRIu64 " bytes reserved, pages %" PRIu64,
        (uint64_t)atomic_load(&be->counters.reserved_bytes), reserved);
  CHECK(live_b == (uint64_t)t->st.allocated[0].current,
        "allocated %" PRIu64 " != Σ live blocks %" PRIu64, (uint64_t)t->st.allocated[0].current,
        live_b);
  CHECK(pend_b == (uint64_t)t->st.pend[0], "pending %" PRIu64 " != %" PRId64, pend_b,
        t->st.pend[0]);
  CHECK(t->st.pend[0] == t->st.pend[1] + t->st.pend[2], "pending bytes of the pools do not add up");
  for (int p = 0; p < 3; ++p) {
    const gmr_stat_t *a = &t->st.allocated[p];
    CHECK(a->peak >= a->current && t->st.pend[p] >= 0,
          "allocated bytes of pool %d: current %" PRId64 " above its peak", p, a->current);
  }
  CHECK(t->st.allocated[0].current == t->st.allocated[1].current + t->st.allocated[2].current,
        "allocated bytes of the pools do not add up");
  CHECK(page_free + small_free + live_b + pend_b + t->dead_bytes == reserved,
        "free %" PRIu64 " + allocated %" PRIu64 " + pending %" PRIu64 " + dead %" PRIu64
        " != reserved %" PRIu64,
        page_free + small_free, live_b, pend_b, t->dead_bytes, reserved);
  /* The arena. */
  CHECK(va == t->va_used, "ranges hold %" PRIu64 " bytes of address space, counted %" PRIu64, va,
        t->va_used);
  uint64_t res = 0, fr = 0;
  for (uint32_t k = 0; k < t->nres; ++k)
    res += t->res[k].size;
  for (uint32_t i = 0; i < t->nva; ++i) {
    st_va_t *v = &t->va[i];
    CHECK(v->res < t->nres && v->addr >= t->res[v->res].base &&
              v->addr + v->size <= t->res[v->res].base + t->res[v->res].size && v->size > 0 &&
              v->addr % t->P == 0 && v->size % t->P == 0,
          "free interval %u outside its reservation", i);
    CHECK(i == 0 || t->va[i - 1].addr + t->va[i - 1].size <= v->addr,
          "free intervals %u and %u overlap", i - 1, i);
    fr += v->size;
  }
  CHECK(fr + va == res, "address space: free %" PRIu64 " + ranges %" PRIu64 " != reserved %" PRIu64,
        fr, va, res);
  return 0;
}
