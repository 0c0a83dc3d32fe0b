/* pages.c: the stitch policy's page table, slot ownership, page indexes,
 * streams and stamps.
 * Map: Note [Page indexes], [Chunks], [Stamps].
 */
#include <string.h>

#include "stitch/internal.h"

/* Note [Page indexes]
 * Every created page is in exactly one index, the one its fields imply:
 *   free[m]     ⇔ no owner (tail_end = 0, head_start = P); m = 1 when a
 *                 cached range still maps the page, so a stitch takes pages
 *                 that no cached range needs first
 *   suffix[c]   ⇔ only the tail slot owned and c = (P - tail_end) / G
 *   prefix[c]   ⇔ only the head slot owned and c = head_start / G;
 *                 open_bytes = Σ c × G over both (a page's open slot)
 *   CLOSED      ⇔ both slots owned; dead_bytes = Σ (head_start - tail_end)
 *   FULL        ⇔ a full owner
 * The class indexes are two-level bitmaps, so "the smallest open slot of at
 * least r bytes" costs a few word scans whatever the number of pages.
 */

/* Note [Chunks]
 * A miss that creates k >= 2 pages makes them with one phys_create of k x P
 * bytes (a chunk; at most chunk_pages pages each, 0: no cap): page i of the
 * chunk is the handle's bytes [iP, (i+1)P).  Every page keeps its own
 * record (slots, owners, stamps, worth), so nothing above the page table
 * knows; only the device calls change.  Consecutive slots of a range whose
 * pages are consecutive in one chunk are mapped by one phys_map (a run,
 * st_map_t.run) and unmapped by one phys_unmap, as CUDA requires (a mapping
 * goes whole), and a miss puts its whole slots' pages in chunk order
 * (stitch.c, chunk_order: the same pages, the same partial slots), so a
 * fresh range costs one create and one map, and a range stitched from
 * other ranges' pages one map per chunk it spans.
 *
 * What a chunk holds back: its handle is released only when every one of
 * its pages is FREE and unmapped (gmr__st_chunks_trim, by empty_cache), so
 * one live page keeps the whole chunk.  Pages are never released otherwise,
 * so between empty_caches the pool holds the same bytes as with a handle a
 * page, and no peak changes on the shipped traces; after an empty_cache
 * more may stay: at the middle of gpt2_train, 4.12 GB for 1.56 GB live
 * where a handle a page keeps 1.57 GB (docs/stitch.md, "Large blocks:
 * chunks").  chunk_pages: 1 is the handle a page, call for call.  A
 * handle cannot be split (cuMemRelease frees all of it), and no page can
 * move, so a chunk is never split.  A refused chunk create falls back to
 * one page a call.
 */

/* Note [Stamps]
 * A stamp (stream, n) says "the n-th free on that stream released bytes of
 * this page".  Stream s may use the page when every stamp is s's own or has
 * completed: stream->done >= n, learnt from events recorded lazily (only when
 * another stream wants the bytes) and queried without blocking.
 */

/* ---- class bitmaps ----------------------------------------------------------------------------
 */

int gmr__st_classes_init(st_classes_t *c, uint32_t n) {
  memset(c, 0, sizeof *c);
  c->n = n;
  c->n1 = (n + 63) / 64;
  c->n0 = (c->n1 + 63) / 64;
  c->head = gmr__malloc((size_t)n * sizeof *c->head);
  c->l1 = gmr__calloc(c->n1, sizeof *c->l1);
  c->l0 = gmr__calloc(c->n0, sizeof *c->l0);
  if (c->head == NULL || c->l1 == NULL || c->l0 == NULL) {
    gmr__st_classes_free(c);
    return GMR_ENOMEM;
  }
  for (uint32_t i = 0; i < n; ++i)
    c->head[i] = ST_NIL;
  return 0;
}

void gmr__st_classes_free(st_classes_t *c) {
  gmr__free(c->head);
  gmr__free(c->l1);
  gmr__free(c->l0);
  memset(c, 0, sizeof *c);
}

void gmr__st_classes_mark(st_classes_t *c, uint32_t k, bool nonempty) {
  uint32_t w = k / 64;
  uint64_t bit = (uint64_t)1 << (k % 64);
  if (nonempty) {
    c->nonempty += (c->l1[w] & bit) == 0;
    c->l1[w] |= bit;
    c->l0[w / 64] |= (uint64_t)1 << (w % 64);
  } else {
    c->nonempty -= (c->l1[w] & bit) != 0;
    c->l1[w] &= ~bit;
    if (c->l1[w] == 0) c->l0[w / 64] &= ~((uint64_t)1 << (w % 64));
  }
}

uint32_t gmr__st_classes_find(const st_classes_t *c, uint32_t k) {
  if (k >= c->n) return ST_NIL;
  uint32_t w = k / 64;
  uint64_t bits = c->l1[w] & (~(uint64_t)0 << (k % 64));
  if (bits != 0) return w * 64 + (uint32_t)__builtin_ctzll(bits);
  /* The next non-empty word after w. */
  uint32_t w1 = w + 1;
  for (uint32_t z = w1 / 64; z < c->n0; ++z) {
    uint64_t m = c->l0[z];
    if (z == w1 / 64) m &= w1 % 64 ? (~(uint64_t)0 << (w1 % 64)) : ~(uint64_t)0;
    if (m != 0) {
      uint32_t ww = z * 64 + (uint32_t)__builtin_ctzll(m);
      return ww * 64 + (uint32_t)__builtin_ctzll(c->l1[ww]);
    }
  }
  return ST_NIL;
}

/* The bits of m at positions <= i (i < 64). */
static inline uint64_t bits_upto(uint64_t m, uint32_t i) {
  return i == 63 ? m : m & (((uint64_t)1 << (i + 1)) - 1);
}

uint32_t gmr__st_classes_find_last(const st_classes_t *c, uint32_t k) {
  if (k >= c->n) k = c->n - 1;
  uint32_t w = k / 64;
  uint64_t bits = bits_upto(c->l1[w], k % 64);
  if (bits != 0) return w * 64 + 63 - (uint32_t)__builtin_clzll(bits);
  if (w == 0) return ST_NIL;
  /* The last non-empty word before w, from the words' bitmap. */
  uint32_t w1 = w - 1;
  for (int64_t z = w1 / 64; z >= 0; --z) {
    uint64_t m = (uint32_t)z == w1 / 64 ? bits_upto(c->l0[z], w1 % 64) : c->l0[z];
    if (m != 0) {
      uint32_t ww = (uint32_t)z * 64 + 63 - (uint32_t)__builtin_clzll(m);
      return ww * 64 + 63 - (uint32_t)__builtin_clzll(c->l1[ww]);
    }
  }
  return ST_NIL;
}

/* ---- page table -------------------------------------------------------------------------------
 */

int gmr__st_pages_init(stitch_t *t) {
  uint32_t n = (uint32_t)(t->P / ST_G);
  t->dead_head = ST_NIL;
  t->free_head[0] = t->free_head[1] = t->free_tail[0] = t->free_tail[1] = ST_NIL;
  gmr__st_worth_init(t);
  int err = gmr__st_classes_init(&t->suffix, n);
  if (err == 0 && (err = gmr__st_classes_init(&t->prefix, n)) != 0)
    gmr__st_classes_free(&t->suffix);
  return err;
}

void gmr__st_pages_fini(stitch_t *t) {
  gmr__st_classes_free(&t->suffix);
  gmr__st_classes_free(&t->prefix);
  gmr__st_worth_fini(t);
  for (uint32_t c = 0; c < t->nchunks; ++c)
    gmr__free(t->chunks[c].ids);
  gmr__free(t->chunks);
  t->chunks = NULL;
  t->nchunks = t->capchunks = 0;
  gmr__free(t->pages);
  t->pages = NULL;
}

int gmr__st_pages_reserve(stitch_t *t, uint32_t n) {
  uint32_t spare = 0;
  for (uint32_t d = t->dead_head; d != ST_NIL && spare < n; d = t->pages[d].next)
    ++spare;
  if (spare >= n || t->npages + (n - spare) <= t->cappages) return 0;
  uint32_t cap = t->cappages ? t->cappages : 64;
  while (cap < t->npages + (n - spare))
    cap *= 2;
  if (gmr__st_worth_reserve(t, cap) != 0) return GMR_ENOMEM;
  st_page_t *p = gmr__realloc(t->pages, (size_t)cap * sizeof *p);
  if (p == NULL) return GMR_ENOMEM;
  t->pages = p;
  t->cappages = cap;
  return 0;
}

uint32_t gmr__st_page_new(stitch_t *t, gmr_phys_t h) {
  uint32_t id;
  bool recycled = t->dead_head != ST_NIL;
  if (recycled) {
    id = t->dead_head;
    t->dead_head = t->pages[id].next;
  } else {
    gmr_assert(t->npages < t->cappages);
    id = t->npages++;
  }
  st_page_t *p = &t->pages[id];
  /* A recycled id may still be on worth.c's dirty list and have dead
   * entries in its heaps: its filing number goes on. */
  bool dirty = false;
  uint32_t wnext = ST_NIL, wgen = 0;
  if (recycled) {
    gmr_assert(p->wheap == 0);
    dirty = p->wdirty;
    wnext = p->wnext;
    wgen = p->wgen;
  }
  memset(p, 0, sizeof *p);
  p->wdirty = dirty;
  p->wnext = dirty ? wnext : ST_NIL;
  p->wgen = wgen;
  p->h = h;
  p->chunk = ST_NIL;
  p->head_start = (uint32_t)t->P;
  p->where = ST_W_DEAD;
  p->prev = p->next = ST_NIL;
  ++t->live_pages;
  return id;
}

/* A FREE, unmapped page's id back to the dead list. */
static void page_bury(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  gmr_assert(p->where == ST_W_FREE && p->nmaps == 0);
  gmr__st_page_unindex(t, id);
  p->where = ST_W_DEAD;
  p->chunk = ST_NIL;
  p->next = t->dead_head;
  t->dead_head = id;
  --t->live_pages;
  ++t->st.pages_released;
}

int gmr__st_page_release(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  gmr_assert(p->where == ST_W_FREE && p->nmaps == 0 && p->chunk == ST_NIL);
  int err = gmr__backend_phys_release(t->base.backend, p->h, t->P);
  if (err != 0) return err;
  page_bury(t, id);
  return 0;
}

/* ---- chunks (Note [Chunks]) -------------------------------------------------------------------
 */

int gmr__st_chunk_new(stitch_t *t, gmr_phys_t h, uint32_t n, uint32_t *ids) {
  uint32_t c = 0;
  while (c < t->nchunks && t->chunks[c].n != 0)
    ++c;
  if (c == t->capchunks) {
    uint32_t cap = t->capchunks ? t->capchunks * 2 : 8;
    st_chunk_t *q = gmr__realloc(t->chunks, (size_t)cap * sizeof *q);
    if (q == NULL) return GMR_ENOMEM;
    t->chunks = q;
    t->capchunks = cap;
  }
  uint32_t *own = gmr__malloc((size_t)n * sizeof *own);
  if (own == NULL) return GMR_ENOMEM;
  if (c == t->nchunks) ++t->nchunks;
  t->chunks[c] = (st_chunk_t){.h = h, .n = n, .ids = own};
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t id = gmr__st_page_new(t, h);
    t->pages[id].chunk = c;
    t->pages[id].coff = i;
    own[i] = ids[i] = id;
  }
  return 0;
}

int gmr__st_chunk_release(stitch_t *t, uint32_t c) {
  st_chunk_t *k = &t->chunks[c];
  int err = gmr__backend_phys_release(t->base.backend, k->h, (uint64_t)k->n * t->P);
  if (err != 0) return err;
  for (uint32_t i = 0; i < k->n; ++i)
    page_bury(t, k->ids[i]);
  gmr__free(k->ids);
  *k = (st_chunk_t){0};
  while (t->nchunks > 0 && t->chunks[t->nchunks - 1].n == 0)
    --t->nchunks;
  return 0;
}

int gmr__st_chunks_trim(stitch_t *t) {
  int err = 0;
  for (uint32_t c = 0; c < t->nchunks; ++c) {
    st_chunk_t *k = &t->chunks[c];
    bool idle = k->n != 0;
    for (uint32_t i = 0; idle && i < k->n; ++i) {
      const st_page_t *p = &t->pages[k->ids[i]];
      idle = p->where == ST_W_FREE && p->nmaps == 0;
    }
    if (idle) {
      int e = gmr__st_chunk_release(t, c);
      if (err == 0) err = e;
    }
  }
  return err;
}

/* ---- indexes ----------------------------------------------------------------------------------
 */

static uint32_t *list_head(stitch_t *t, uint8_t where, uint32_t cls) {
  if (where == ST_W_FREE) return &t->free_head[cls];
  if (where == ST_W_SUFFIX) return &t->suffix.head[cls];
  return &t->prefix.head[cls];
}

void gmr__st_page_unindex(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  switch (p->where) {
  case ST_W_FREE:
    gmr__st_worth_touch(t, id);
    /* fall through */
  case ST_W_SUFFIX:
  case ST_W_PREFIX: {
    uint32_t *head = list_head(t, p->where, p->cls);
    if (p->prev != ST_NIL)
      t->pages[p->prev].next = p->next;
    else
      *head = p->next;
    if (p->next != ST_NIL)
      t->pages[p->next].prev = p->prev;
    else if (p->where == ST_W_FREE)
      t->free_tail[p->cls] = p->prev;
    if (p->where == ST_W_FREE) {
      --t->nfree;
    } else {
      t->open_bytes -= (uint64_t)p->cls * ST_G;
      if (*head == ST_NIL)
        gmr__st_classes_mark(p->where == ST_W_SUFFIX ? &t->suffix : &t->prefix, p->cls, false);
    }
    break;
  }
  case ST_W_CLOSED:
    --t->nclosed;
    t->dead_bytes -= (uint64_t)p->cls * ST_G;
    t->st.dead_gap.current = (int64_t)t->dead_bytes;
    break;
  case ST_W_FULL:
    --t->nfull;
    break;
  default:
    break;
  }
  p->where = ST_W_DEAD;
  p->prev = p->next = ST_NIL;
}

static void list_push(stitch_t *t, uint32_t id, uint32_t *head) {
  st_page_t *p = &t->pages[id];
  p->prev = ST_NIL;
  p->next = *head;
  if (*head != ST_NIL) t->pages[*head].prev = id;
  *head = id;
}

/* FREE pages: cls 0 = unmapped (LIFO), cls 1 = mapped (FIFO: the page whose
 * cached ranges were used longest ago is taken first). */
static void free_push(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  gmr__st_worth_touch(t, id);
  p->cls = p->nmaps != 0;
  if (p->cls == 0) {
    list_push(t, id, &t->free_head[0]);
    if (t->free_tail[0] == ST_NIL) t->free_tail[0] = id;
    return;
  }
  p->next = ST_NIL;
  p->prev = t->free_tail[1];
  if (p->prev != ST_NIL)
    t->pages[p->prev].next = id;
  else
    t->free_head[1] = id;
  t->free_tail[1] = id;
}

/* see Note [Page indexes] */
void gmr__st_page_reindex(stitch_t *t, uint32_t id) {
  gmr__st_page_unindex(t, id);
  st_page_t *p = &t->pages[id];
  uint32_t P = (uint32_t)t->P;
  if (p->full_owner != NULL) {
    p->where = ST_W_FULL;
    ++t->nfull;
  } else if (p->tail_owner == NULL && p->head_owner == NULL) {
    p->where = ST_W_FREE;
    free_push(t, id);
    ++t->nfree;
  } else if (p->tail_owner != NULL && p->head_owner != NULL) {
    p->where = ST_W_CLOSED;
    p->cls = (p->head_start - p->tail_end) / ST_G;
    t->dead_bytes += (uint64_t)p->cls * ST_G;
    ++t->nclosed;
    t->st.dead_gap.current = (int64_t)t->dead_bytes;
    if (t->st.dead_gap.current > t->st.dead_gap.peak) t->st.dead_gap.peak = t->st.dead_gap.current;
  } else {
    bool suffix = p->tail_owner != NULL;
    p->where = suffix ? ST_W_SUFFIX : ST_W_PREFIX;
    p->cls = (suffix ? P - p->tail_end : p->head_start) / ST_G;
    st_classes_t *c = suffix ? &t->suffix : &t->prefix;
    uint32_t *head = &c->head[p->cls];
    bool was_empty = *head == ST_NIL;
    list_push(t, id, head);
    if (was_empty) gmr__st_classes_mark(c, p->cls, true);
    t->open_bytes += (uint64_t)p->cls * ST_G;
  }
}

/* ---- spans ------------------------------------------------------------------------------------
 */

bool gmr__st_span_usable(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, uint32_t sidx) {
  st_page_t *p = &t->pages[id];
  uint32_t P = (uint32_t)t->P;
  if (p->where == ST_W_DEAD || p->full_owner != NULL) return false;
  if (a == 0 && b == P) {
    if (p->tail_owner != NULL || p->head_owner != NULL) return false;
  } else if (a == 0) { /* a tail span */
    if (p->tail_owner != NULL) return false;
    if (p->head_owner != NULL && (p->head_start < b || p->head_start - b > t->o.tau)) return false;
  } else { /* a head span, b == P */
    if (p->head_owner != NULL) return false;
    if (p->tail_owner != NULL && (p->tail_end > a || a - p->tail_end > t->o.tau)) return false;
  }
  return st_page_ready(t, id, sidx);
}

/* A FREE page leaves its FREE list (the common case of a whole span). */
static void free_unlink(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  if (p->prev != ST_NIL)
    t->pages[p->prev].next = p->next;
  else
    t->free_head[p->cls] = p->next;
  if (p->next != ST_NIL)
    t->pages[p->next].prev = p->prev;
  else
    t->free_tail[p->cls] = p->prev;
  p->prev = p->next = ST_NIL;
  --t->nfree;
  gmr__st_worth_touch(t, id);
}

void gmr__st_span_take(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, st_range_t *owner) {
  st_page_t *p = &t->pages[id];
  uint32_t P = (uint32_t)t->P;
  if (a == 0 && b == P) {
    p->full_owner = owner;
    if (p->where == ST_W_FREE) { /* FREE -> FULL without a general re-file */
      free_unlink(t, id);
      p->where = ST_W_FULL;
      ++t->nfull;
      return;
    }
  } else if (a == 0) {
    p->tail_owner = owner;
    p->tail_end = b;
  } else {
    p->head_owner = owner;
    p->head_start = a;
  }
  gmr__st_page_reindex(t, id);
}

static void stamp_add(stitch_t *t, st_page_t *p, st_stamp_t s) {
  if (s.stream == 0) return;
  for (int i = 0; i < ST_STAMPS; ++i)
    if (p->stamp[i].stream == s.stream) {
      if (p->stamp[i].seq < s.seq) p->stamp[i].seq = s.seq;
      return;
    }
  for (int i = 0; i < ST_STAMPS; ++i) /* drop stamps that completed */
    if (p->stamp[i].stream != 0 && t->streams[p->stamp[i].stream - 1].done >= p->stamp[i].seq)
      p->stamp[i].stream = 0;
  for (int i = 0; i < ST_STAMPS; ++i)
    if (p->stamp[i].stream == 0) {
      p->stamp[i] = s;
      return;
    }
  /* More streams than slots on one page (rare): wait for the oldest. */
  int old = 0;
  for (int i = 1; i < ST_STAMPS; ++i)
    if (p->stamp[i].seq < p->stamp[old].seq) old = i;
  gmr__st_stamp_ready(t, p->stamp[old], UINT32_MAX, true);
  p->stamp[old] = s;
}

void gmr__st_span_give(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, st_stamp_t stamp) {
  st_page_t *p = &t->pages[id];
  uint32_t P = (uint32_t)t->P;
  if (a == 0 && b == P) {
    p->full_owner = NULL;
    stamp_add(t, p, stamp);
    --t->nfull; /* FULL -> FREE without a general re-file */
    p->where = ST_W_FREE;
    free_push(t, id);
    ++t->nfree;
    return;
  } else if (a == 0) {
    p->tail_owner = NULL;
    p->tail_end = 0;
  } else {
    p->head_owner = NULL;
    p->head_start = P;
  }
  stamp_add(t, p, stamp);
  gmr__st_page_reindex(t, id);
}

/* ---- streams ----------------------------------------------------------------------------------
 */

int gmr__st_stream_index(stitch_t *t, gmr_stream_t s, uint32_t *out) {
  if (t->last_stream < t->nstreams && t->streams[t->last_stream].s == s) {
    *out = t->last_stream;
    return 0;
  }
  for (uint32_t i = 0; i < t->nstreams; ++i)
    if (t->streams[i].s == s) {
      *out = t->last_stream = i;
      return 0;
    }
  if (t->nstreams == t->capstreams) {
    uint32_t cap = t->capstreams ? t->capstreams * 2 : 4;
    st_stream_t *n = gmr__realloc(t->streams, (size_t)cap * sizeof *n);
    if (n == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a stream");
    t->streams = n;
    t->capstreams = cap;
  }
  st_stream_t *st = &t->streams[t->nstreams];
  memset(st, 0, sizeof *st);
  st->s = s;
  *out = t->last_stream = t->nstreams++;
  return 0;
}

/* Query the stream's events, oldest first; they complete in order. */
static void stream_poll(stitch_t *t, st_stream_t *st) {
  uint32_t k = 0;
  for (; k < st->nev; ++k) {
    ++t->st.event_queries;
    if (gmr__backend_event_query(t->base.backend, st->evs[k].ev) != 0) break;
    if (st->evs[k].seq > st->done) st->done = st->evs[k].seq;
    gmr__backend_event_destroy(t->base.backend, st->evs[k].ev);
  }
  if (k > 0) {
    memmove(st->evs, st->evs + k, (st->nev - k) * sizeof *st->evs);
    st->nev -= k;
  }
}

/* see Note [Stamps] */
bool gmr__st_stamp_ready(stitch_t *t, st_stamp_t s, uint32_t sidx, bool wait) {
  if (s.stream == 0 || s.stream - 1 == sidx) return true;
  st_stream_t *st = &t->streams[s.stream - 1];
  if (st->done >= s.seq) return true;
  if (t->capturing) return false; /* no event query or record (Note [Graph capture]) */
  if (st->nev > 0) stream_poll(t, st);
  if (st->done >= s.seq) return true;
  gmr_backend_t *be = t->base.backend;
  /* No event covers the stamp yet: record one now (never on a stream that is
   * being captured into a graph: the event would become a graph node). */
  if (st->nev == 0 || st->evs[st->nev - 1].seq < s.seq) {
    if (gmr__backend_stream_capturing(be, st->s) != 0) return false;
    if (st->nev == st->capev) {
      uint32_t cap = st->capev ? st->capev * 2 : 4;
      st_evrec_t *n = gmr__realloc(st->evs, (size_t)cap * sizeof *n);
      if (n == NULL) return false;
      st->evs = n;
      st->capev = cap;
    }
    gmr_event_t ev;
    if (gmr__backend_event_record(be, st->s, &ev) != 0) return false;
    ++t->st.event_records;
    st->evs[st->nev++] = (st_evrec_t){ev, st->frees};
    stream_poll(t, st);
    if (st->done >= s.seq) return true;
  }
  if (!wait && t->o.cross_stream != ST_CROSS_SYNC) return false;
  /* Wait on the newest event, which covers the stamp. */
  st_evrec_t *e = &st->evs[st->nev - 1];
  ++t->st.syncs;
  if (gmr__backend_event_sync(be, e->ev) != 0) return false;
  stream_poll(t, st);
  return st->done >= s.seq;
}

bool gmr__st_page_ready_slow(stitch_t *t, uint32_t id, uint32_t sidx) {
  st_page_t *p = &t->pages[id];
  for (int i = 0; i < ST_STAMPS; ++i) {
    st_stamp_t s = p->stamp[i];
    if (s.stream == 0 || s.stream - 1 == sidx) continue;
    if (!gmr__st_stamp_ready(t, s, sidx, false)) return false;
    p->stamp[i].stream = 0; /* complete for every stream */
  }
  return true;
}

void gmr__st_streams_fini(stitch_t *t) {
  for (uint32_t i = 0; i < t->nstreams; ++i) {
    st_stream_t *st = &t->streams[i];
    for (uint32_t k = 0; k < st->nev; ++k)
      gmr__backend_event_destroy(t->base.backend, st->evs[k].ev);
    gmr__free(st->evs);
  }
  gmr__free(t->streams);
  t->streams = NULL;
  t->nstreams = 0;
}
