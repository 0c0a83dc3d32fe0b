/* small.c: the stitch policy's small pool (requests <= small_size), with
 * PyTorch's small-pool rules on pages shared with the large blocks.
 * Map: Note [Small rules], [Small index].
 */
#include <string.h>

#include "stitch/internal.h"

/* Note [Small rules]
 * PyTorch's small-pool rules: sizes rounded up to 512 bytes; blocks carved
 * from segments of one page (P bytes, 2 MiB on the H200, like kSmallBuffer);
 * best fit per stream (the smallest free block that holds the request); a
 * block is split when at least 512 bytes remain; a freed block merges with its
 * free neighbours.  What differs: a segment's page comes from the same page
 * pool as large blocks, and a wholly free segment gives its page back to that
 * pool (gmr__st_small_reclaim) before the policy grows, instead of being held
 * until empty_cache; so memory that small tensors used at one time serves
 * large ones at another.
 */

/* Note [Small index]
 * Per stream, free blocks by class size / G (the last class holds every block
 * of small_size bytes or more), a two-level bitmap over the classes, LIFO
 * within a class.
 *   Σ free block sizes == small_free_bytes
 *   Σ block sizes of a segment == P; neighbours are never both free.
 */

static st_small_index_t *index_of(stitch_t *t, uint32_t sidx) {
  st_stream_t *st = &t->streams[sidx];
  if (st->small != NULL) return st->small;
  st_small_index_t *x = gmr__calloc(1, sizeof *x);
  if (x == NULL) return NULL;
  uint32_t n = (uint32_t)(t->small_max / ST_G) + 1;
  x->heads = gmr__calloc(n, sizeof *x->heads);
  if (x->heads == NULL || gmr__st_classes_init(&x->cls, n) != 0) {
    gmr__free(x->heads);
    gmr__free(x);
    return NULL;
  }
  st->small = x;
  return x;
}

static void idx_push(stitch_t *t, st_small_index_t *x, st_small_t *b) {
  uint32_t c = st_small_class(x, b->size);
  b->fprev = NULL;
  b->fnext = x->heads[c];
  if (b->fnext != NULL)
    b->fnext->fprev = b;
  else
    gmr__st_classes_mark(&x->cls, c, true);
  x->heads[c] = b;
}

static void idx_remove(stitch_t *t, st_small_index_t *x, st_small_t *b) {
  uint32_t c = st_small_class(x, b->size);
  if (b->fprev != NULL)
    b->fprev->fnext = b->fnext;
  else
    x->heads[c] = b->fnext;
  if (b->fnext != NULL) b->fnext->fprev = b->fprev;
  if (x->heads[c] == NULL) gmr__st_classes_mark(&x->cls, c, false);
}

/* Free block nb takes free block b's place in b's class list (nb is of the
 * same class: no bitmap change). */
static void idx_replace(stitch_t *t, st_small_index_t *x, st_small_t *b, st_small_t *nb) {
  uint32_t c = st_small_class(x, b->size);
  nb->fprev = b->fprev;
  nb->fnext = b->fnext;
  if (nb->fprev != NULL)
    nb->fprev->fnext = nb;
  else
    x->heads[c] = nb;
  if (nb->fnext != NULL) nb->fnext->fprev = nb;
  b->fprev = b->fnext = NULL;
}

static st_small_t *block_new(stitch_t *t) {
  st_small_t *b = t->small_recycle;
  if (b != NULL) {
    t->small_recycle = b->next;
    memset(b, 0, sizeof *b);
    return b;
  }
  return gmr__calloc(1, sizeof *b);
}

static void block_recycle(stitch_t *t, st_small_t *b) {
  gmr__free(b->uses);
  b->uses = NULL;
  b->next = t->small_recycle;
  t->small_recycle = b;
}

static void empty_remove(stitch_t *t, st_small_seg_t *g) {
  if (!g->on_empty) return;
  if (g->e_prev != NULL)
    g->e_prev->e_next = g->e_next;
  else
    t->empty_head = g->e_next;
  if (g->e_next != NULL) g->e_next->e_prev = g->e_prev;
  g->e_prev = g->e_next = NULL;
  g->on_empty = false;
}

/* A new one-page segment for stream sidx: the oldest cached one-page range
 * whose page it can take (an empty segment's, or a 2 MiB block's) with no
 * device call, else a FREE page (created when there is none) mapped at a
 * fresh address. */
static int segment_new(stitch_t *t, uint32_t sidx, st_small_index_t *x) {
  st_small_seg_t *g = gmr__calloc(1, sizeof *g);
  st_small_t *b = block_new(t);
  st_range_t *r = NULL;
  int err = (g && b) ? gmr__st_pages_reserve(t, 1) : GMR_ENOMEM;
  if (err == 0 && (r = gmr__st_cache_lookup(t, t->P, sidx)) != NULL) {
    st_cache_remove(t, r);
    gmr__st_range_own(t, r);
    r->gap = t->tick + 1 - r->tick;
    r->tick = ++t->tick;
    ++t->st.small_reuses;
  } else if (err == 0) {
    r = gmr__st_range_alloc(1);
    if (r == NULL) err = GMR_ENOMEM;
  }
  if (err != 0) {
    gmr__free(g);
    gmr__free(b);
    gmr__free(r);
    return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a small segment");
  }
  if (r->serial == 0) { /* a new range; see Note [Graph capture] (stitch.c) */
    bool was = t->capturing;
    if (!st_fresh(t))
      t->capturing = gmr__backend_stream_capturing(t->base.backend, t->streams[sidx].s) != 0;
    gmr__st_evict(t, 1, t->P, false);
    uint32_t id;
    bool created = false;
    if (gmr__st_collect_free(t, 1, sidx, &id) == 0) {
      gmr_phys_t h;
      err = gmr__backend_phys_create(t->base.backend, t->P, &h);
      if (err == 0) {
        ++t->st.pages_created;
        id = gmr__st_page_new(t, h);
        gmr__st_page_reindex(t, id);
        created = true;
      }
    }
    if (err == 0) {
      r->pages[0] = id;
      r->len = t->P;
      r->nwhole = 1;
      err = gmr__st_range_link(t, r);
      if (err == 0) err = gmr__st_map_range(t, r);
      if (err != 0 && created) gmr__st_page_release(t, id);
    }
    t->capturing = was;
    if (err != 0) {
      gmr__free(g);
      gmr__free(b);
      gmr__st_range_destroy(t, r);
      return err;
    }
    gmr__st_span_take(t, id, 0, (uint32_t)t->P, r);
    r->tick = ++t->tick;
  }
  r->sidx = sidx;
  r->state = ST_R_SMALL;
  r->seg = g;
  g->r = r;
  g->sidx = sidx;
  g->first = b;
  b->seg = g;
  b->off = 0;
  b->size = (uint32_t)t->P;
  idx_push(t, x, b);
  t->small_free_bytes += t->P;
  ++t->nsmall_segs;
  st_inc(t->st.segment, 1, 1);
  st_inc(t->st.reserved, 1, (int64_t)t->P);
  return 0;
}

/* see Note [Small index] */
int gmr__st_small_alloc(stitch_t *t, uint32_t size, uint64_t requested, uint32_t sidx,
                        st_small_t **out) {
  st_small_index_t *x = index_of(t, sidx);
  if (x == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a stream");
  uint32_t c = gmr__st_classes_find(&x->cls, st_small_class(x, size));
  if (c == ST_NIL) {
    int err = segment_new(t, sidx, x);
    if (err != 0) return err;
    c = gmr__st_classes_find(&x->cls, st_small_class(x, size));
  }
  st_small_t *b = x->heads[c];
  if (b->size - size >= ST_G) {
    /* Sizes are multiples of G, so no split means b->size == size: a small
     * block is never handed out larger than small_max, which is how free
     * tells small blocks from large ones. */
    st_small_t *rest = block_new(t);
    if (rest == NULL)
      return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a small block");
    rest->seg = b->seg;
    rest->off = b->off + size;
    rest->size = b->size - size;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != NULL) b->next->prev = rest;
    b->next = rest;
    if (st_small_class(x, rest->size) == c) { /* the rest keeps b's place */
      idx_replace(t, x, b, rest);
    } else {
      idx_remove(t, x, b);
      idx_push(t, x, rest);
    }
    b->size = size;
  } else {
    idx_remove(t, x, b);
  }
  t->small_free_bytes -= size;
  b->allocated = true;
  b->requested = requested;
  st_small_seg_t *g = b->seg;
  ++g->live;
  g->live_bytes += b->size;
  empty_remove(t, g);
  *out = b;
  return 0;
}

void gmr__st_small_free(stitch_t *t, st_small_t *b) {
  st_small_seg_t *g = b->seg;
  st_small_index_t *x = t->streams[g->sidx].small;
  b->allocated = false;
  --g->live;
  g->live_bytes -= b->size;
  st_small_t *p = b->prev, *n = b->next;
  t->small_free_bytes += b->size;
  /* The merged block keeps the list place of a free neighbour when it stays
   * in that neighbour's class (no bitmap change: the common case of a
   * segment whose one free block grows back to the whole page). */
  bool filed = false;               /* b is on its class list */
  if (p != NULL && !p->allocated) { /* merge into the previous block */
    uint32_t c = st_small_class(x, p->size);
    if (st_small_class(x, p->size + b->size) == c)
      filed = true;
    else
      idx_remove(t, x, p);
    p->size += b->size;
    p->next = n;
    if (n != NULL) n->prev = p;
    block_recycle(t, b);
    b = p;
  }
  if (n != NULL && !n->allocated) {
    uint32_t merged = b->size + n->size, c = st_small_class(x, merged);
    if (!filed && c == st_small_class(x, n->size)) {
      idx_replace(t, x, n, b); /* b takes n's place */
      filed = true;
    } else {
      idx_remove(t, x, n);
      if (filed && c != st_small_class(x, b->size)) {
        idx_remove(t, x, b);
        filed = false;
      }
    }
    b->size = merged;
    b->next = n->next;
    if (n->next != NULL) n->next->prev = b;
    block_recycle(t, n);
  }
  if (!filed) idx_push(t, x, b);
  if (g->live == 0) {
    g->last_free = st_stamp_new(t, g->sidx);
    g->e_prev = NULL;
    g->e_next = t->empty_head;
    if (t->empty_head != NULL) t->empty_head->e_prev = g;
    t->empty_head = g;
    g->on_empty = true;
  }
}

/* ---- the take-back -----------------------------------------------------------------------------
 */

/* Note [Small take-back] (stitch.c's Note [Deferred free], in the small pool)
 * The free of b may wait (stitch.c keeps it in t->deferred; every op but an
 * allocation that takes it back applies it first, with gmr__st_small_free)
 * when an allocation of b->size bytes on b's stream right after it would get b
 * back with every record, list and bitmap as they are now:
 *   gmr__st_small_alloc(b->size) after gmr__st_small_free(b) = the state before the free
 * That holds iff b's previous block is allocated or none (a merge with it
 * would move b's start) and b's next block n is
 *   - allocated or none: the free files b at the head of class(b), the
 *     allocation finds that class first and takes b out again; or
 *   - free, with class(b + n) = class(n), n at the head of class(n) and every
 *     class in [class(b), class(n)) empty: the free puts b + n in n's place
 *     and recycles n's record, the allocation finds b + n first and splits it
 *     into b and that record again, which takes n's place.
 * Left for good by the pair: the segment's stamp when it would have emptied
 * (st_small_take_back).  Fields that differ are never read on a free block:
 * n's requested bytes and its record_stream array (freed by the recycle).
 * Both tests are inline in internal.h (st_small_deferrable, st_small_take_back). */

int gmr__st_small_reclaim(stitch_t *t, bool wait) {
  st_small_seg_t *g = t->empty_head;
  while (g != NULL) {
    st_small_seg_t *next = g->e_next;
    if (gmr__st_stamp_ready(t, g->last_free, UINT32_MAX, wait)) {
      st_range_t *r = g->r;
      st_stamp_t last = g->last_free;
      st_small_index_t *x = t->streams[g->sidx].small;
      empty_remove(t, g);
      idx_remove(t, x, g->first);
      t->small_free_bytes -= t->P;
      block_recycle(t, g->first);
      r->seg = NULL;
      --t->nsmall_segs;
      st_dec(t->st.segment, 1, 1);
      st_dec(t->st.reserved, 1, (int64_t)t->P);
      ++t->st.small_reclaims;
      gmr__free(g);
      gmr__st_range_release(t, r, last); /* cached, its page parked under it */
    }
    g = next;
  }
  return 0;
}

void gmr__st_small_fini(stitch_t *t) {
  /* Segments: free every block record; the ranges go with gmr__st_ranges_fini. */
  for (st_range_t *r = t->all; r != NULL; r = r->all_next) {
    if (r->seg == NULL) continue;
    st_small_t *b = r->seg->first;
    while (b != NULL) {
      st_small_t *n = b->next;
      gmr__free(b->uses);
      gmr__free(b);
      b = n;
    }
    gmr__free(r->seg);
    r->seg = NULL;
  }
  while (t->small_recycle != NULL) {
    st_small_t *n = t->small_recycle->next;
    gmr__free(t->small_recycle);
    t->small_recycle = n;
  }
  for (uint32_t i = 0; i < t->nstreams; ++i) {
    st_small_index_t *x = t->streams[i].small;
    if (x == NULL) continue;
    gmr__st_classes_free(&x->cls);
    gmr__free(x->heads);
    gmr__free(x);
    t->streams[i].small = NULL;
  }
}
