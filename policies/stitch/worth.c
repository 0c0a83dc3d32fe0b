/* worth.c: the stitch policy's FREE mapped pages kept in the order a miss
 * takes them (ranges.c's gmr__st_collect_free).
 * Map: Note [Worth], [Worth heaps], [Worth invariants].
 */
#include <string.h>

#include "stitch/internal.h"

/* Note [Worth]
 * A miss takes the FREE mapped pages that the cached ranges will want last
 * first (Belady's rule: in a loop, the pages of the range handed out
 * longest ago are the ones the loop wants again soonest), in the order
 *   x before y ⇔ worth(x) > worth(y) ∨ (worth(x) = worth(y) ∧ id(x) < id(y))
 *   worth(p) = min(wa, 2 T + 2 - wb)   (T: the policy's tick)
 * with wa and wb the page's terms (st_page_t; wb = 0 leaves only wa).
 * Scanning every FREE page at each miss costs O(FREE pages); here they stay
 * ordered between misses, and a miss costs O(k log n) for the k pages it
 * looks at.
 */

/* Note [Worth heaps]
 * The b term moves with T, so the pages are kept in heaps by keys that do
 * not:
 *   A: pages whose worth is wa from now on (wb = 0 or 2T + 2 - wb >= wa),
 *      first by (wa desc, id asc), kept as the key ~wa;
 *   B: pages whose worth is 2T + 2 - wb < wa, first by (wb asc, id asc),
 *      which is (worth desc, id asc) at every T;
 *   M: B's pages by T* = ceil((wa + wb - 2) / 2), the tick from which their
 *      worth is wa, soonest first (T only grows: pages move from B to A).
 * A FREE page's terms change only when it becomes FREE or a cached range
 * that maps it is unmapped, and then only if that range set wa or wb (the
 * ranges that map a FREE page are all cached; one that is handed out takes
 * the page, and a new mapping is a new range's, not cached yet).  Those
 * places touch the page (gmr__st_worth_touch, gmr__st_worth_unmapped): it leaves its
 * heap and goes on the dirty list.  A miss files the dirty pages, moves the
 * pages whose T* has come from B to A, then reads A and B in order through
 * a frontier: a heap of the candidates next in line, each popped one
 * replaced by its children in its heap.
 *
 * A page leaving its heap only marks itself out (its entries are skipped
 * when met, dropped when the heap is rebuilt), so a touch costs O(1).
 */

/* Note [Worth invariants]
 * Invariants, outside a miss (p in k: p has a live entry in heap k):
 *   p in A or B ∧ ¬dirty ⇒ p FREE ∧ mapped (cls 1) ∧ its entry's key current
 *   p FREE ∧ mapped ⇒ p in A or B, or dirty
 *   p in B ⇔ p in M;  p is in at most one of A and B, once
 * During a miss the heaps are frozen (a touch only marks the page dirty):
 * the order stays the one at the miss's start while eviction changes other
 * pages' mappings, as a sort at the start would give it.  The pages touched
 * meanwhile stay in their heap, dirty, until their next touch or miss.
 */

enum { W_NONE = 0, W_A = 1, W_B = 2, W_M = 3 };

/* ---- terms ----------------------------------------------------------------------------------- */

/* When a FREE page will next be wanted: the soonest expected hand-out of
 * the cached ranges that map it, a range's next hand-out expected one
 * period (the ticks between its last two hand-outs) after its last one
 * (UINT64_MAX: no cached range maps it).  A range r with no period yet is
 * expected 2 (T - r.tick) + 1 ticks after its last hand-out, so over a
 * page's ranges worth = min(wa, 2 T + 2 - wb) with
 *   wa = min r.tick + r.gap over those with a period (UINT64_MAX: none),
 *   wb = 1 + max r.tick over those without (0: none). */
static void page_terms(const stitch_t *t, uint32_t id, uint64_t *wa, uint64_t *wb) {
  uint64_t a = UINT64_MAX, b = 0;
  for (const st_map_t *m = t->pages[id].maps; m != NULL; m = m->next) {
    const st_range_t *r = m->r;
    if (r->state != ST_R_CACHED) continue;
    if (r->gap != 0) {
      if (r->tick + r->gap < a) a = r->tick + r->gap;
    } else if (r->tick + 1 > b) {
      b = r->tick + 1;
    }
  }
  *wa = a;
  *wb = b;
}

/* The first tick from which a B page's worth is wa. */
static inline uint64_t move_tick(const st_page_t *p) {
  return p->wa == UINT64_MAX ? UINT64_MAX : (p->wa + p->wb - 1) / 2;
}

static inline uint64_t worth_b(uint64_t T, const st_page_t *p) {
  return 2 * T + 2 - p->wb;
}

/* ---- the heaps ------------------------------------------------------------------------------- */

/* An entry is live while its page is still filed in that heap under that
 * filing: a page that leaves its heap only changes its own fields, and its
 * old entries are skipped when met and dropped when the heap is rebuilt.
 * Keys are kept in the entries, so a heap's order never depends on a
 * page's later state:
 *   heap k ⇔ ∀ 0 < i < n: ¬first(h[i], h[(i - 1) / 2])
 * M's page is live there while the page is in B under the same filing. */
static inline bool w_live(const stitch_t *t, int k, st_went_t e) {
  const st_page_t *p = &t->pages[e.id];
  return p->wgen == e.gen && p->wheap == (k == W_M ? W_B : k);
}

/* Does entry x go before entry y: the smaller key, then the lower id (A's
 * key is ~wa, so that its greatest wa comes first). */
static inline bool w_first(st_went_t x, st_went_t y) {
  return x.key != y.key ? x.key < y.key : x.id < y.id;
}

static void w_down(st_went_t *h, uint32_t n, uint32_t i) {
  st_went_t v = h[i];
  for (uint32_t c; (c = 2 * i + 1) < n; i = c) {
    if (c + 1 < n && w_first(h[c + 1], h[c])) ++c;
    if (!w_first(h[c], v)) break;
    h[i] = h[c];
  }
  h[i] = v;
}

static st_went_t w_pop(stitch_t *t, int k) {
  st_went_t *h = t->wheap[k], top = h[0];
  h[0] = h[--t->wn[k]];
  w_down(h, t->wn[k], 0);
  return top;
}

/* Heap k without its dead entries. */
static void w_rebuild(stitch_t *t, int k) {
  st_went_t *h = t->wheap[k];
  uint32_t n = 0;
  for (uint32_t i = 0; i < t->wn[k]; ++i)
    if (w_live(t, k, h[i])) h[n++] = h[i];
  t->wn[k] = n;
  for (uint32_t i = n / 2; i-- > 0;)
    w_down(h, n, i);
}

static void w_push(stitch_t *t, int k, uint64_t key, uint32_t id) {
  /* Room for capw live entries and as many dead ones: a rebuild comes
   * after at least capw pushes. */
  if (t->wn[k] == 2 * t->capw) w_rebuild(t, k);
  gmr_assert(t->wn[k] < 2 * t->capw);
  st_went_t *h = t->wheap[k], v = {key, id, t->pages[id].wgen};
  uint32_t i = t->wn[k]++;
  while (i > 0 && w_first(v, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = v;
}

static inline void w_leave(stitch_t *t, st_page_t *p) {
  if (p->wheap != W_NONE) --t->wlive[p->wheap];
  p->wheap = W_NONE;
}

/* A FREE mapped page into A or B by its terms now. */
static void w_file(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  page_terms(t, id, &p->wa, &p->wb);
  ++p->wgen;
  if (p->wb != 0 && worth_b(t->tick, p) < p->wa) {
    p->wheap = W_B;
    w_push(t, W_B, p->wb, id);
    w_push(t, W_M, move_tick(p), id);
  } else {
    p->wheap = W_A;
    w_push(t, W_A, ~p->wa, id);
  }
  ++t->wlive[p->wheap];
}

/* ---- upkeep ---------------------------------------------------------------------------------- */

void gmr__st_worth_init(stitch_t *t) {
  t->wdirty_head = ST_NIL;
}

int gmr__st_worth_reserve(stitch_t *t, uint32_t cap) {
  if (cap <= t->capw) return 0;
  for (int k = W_A; k <= W_M; ++k) {
    st_went_t *h = gmr__realloc(t->wheap[k], 2 * (size_t)cap * sizeof *h);
    if (h == NULL) return GMR_ENOMEM;
    t->wheap[k] = h;
  }
  t->capw = cap;
  return 0;
}

void gmr__st_worth_fini(stitch_t *t) {
  for (int k = W_A; k <= W_M; ++k) {
    gmr__free(t->wheap[k]);
    t->wheap[k] = NULL;
    t->wn[k] = t->wlive[k] = 0;
  }
  t->capw = 0;
}

/* see Note [Worth heaps] */
void gmr__st_worth_touch(stitch_t *t, uint32_t id) {
  st_page_t *p = &t->pages[id];
  if (!t->wfrozen) w_leave(t, p);
  if (!p->wdirty) {
    p->wdirty = true;
    p->wnext = t->wdirty_head;
    t->wdirty_head = id;
  }
}

void gmr__st_worth_unmapped(stitch_t *t, uint32_t id, const st_range_t *r) {
  const st_page_t *p = &t->pages[id];
  /* Only a filed page's terms are kept (a dirty one is filed again anyway,
   * and one in no heap is not FREE and mapped); they change only if r, a
   * cached range, set one. */
  if (p->wheap == W_NONE || p->wdirty || r->state != ST_R_CACHED) return;
  if (r->gap != 0 ? r->tick + r->gap == p->wa : r->tick + 1 == p->wb) gmr__st_worth_touch(t, id);
}

/* Every dirty page out of its heap, and back in by its terms if it is a
 * FREE mapped page. */
static void file_dirty(stitch_t *t) {
  for (uint32_t id = t->wdirty_head; id != ST_NIL;) {
    st_page_t *p = &t->pages[id];
    uint32_t next = p->wnext;
    p->wdirty = false;
    w_leave(t, p);
    if (p->where == ST_W_FREE && p->cls == 1) w_file(t, id);
    id = next;
  }
  t->wdirty_head = ST_NIL;
}

/* The invariants at the top of the file (outside a miss), and the heaps'
 * order.  A page in A stays there as T grows; one in B may be due to move
 * (the next miss moves it). */
/* see Note [Worth invariants] */
bool gmr__st_worth_holds(const stitch_t *t) {
  uint32_t listed = 0, filed = 0; /* FREE mapped pages not dirty; their live entries */
  for (uint32_t id = t->free_head[1]; id != ST_NIL; id = t->pages[id].next) {
    const st_page_t *p = &t->pages[id];
    if (p->wdirty) continue;
    ++listed;
    uint64_t a, b;
    page_terms(t, id, &a, &b);
    if (p->wheap == W_NONE || a != p->wa || b != p->wb) return false;
    if (p->wheap == W_A && p->wb != 0 && worth_b(t->tick, p) < p->wa) return false;
    if (p->wheap == W_B && p->wb == 0) return false;
  }
  for (int k = W_A; k <= W_M; ++k) {
    uint32_t live = 0;
    for (uint32_t i = 0; i < t->wn[k]; ++i) {
      st_went_t e = t->wheap[k][i];
      if (i > 0 && w_first(e, t->wheap[k][(i - 1) / 2])) return false;
      if (!w_live(t, k, e)) continue;
      const st_page_t *p = &t->pages[e.id];
      ++live;
      if (p->wdirty) continue; /* touched during a miss: filed at the next */
      if (p->where != ST_W_FREE || p->cls != 1) return false;
      if (e.key != (k == W_A ? ~p->wa : k == W_B ? p->wb : move_tick(p))) return false;
      filed += k != W_M;
    }
    if (live != t->wlive[k == W_M ? W_B : k]) return false;
  }
  return filed == listed;
}

/* ---- reading in order ------------------------------------------------------------------------ */

typedef struct st_worth_cand_s {
  uint64_t worth;
  uint32_t id;
  uint32_t pos; /* in heap k */
  int k;
} cand_t;

static inline bool cand_before(cand_t x, cand_t y) {
  return x.worth != y.worth ? x.worth > y.worth : x.id < y.id;
}

static void cand_up(cand_t *c, uint32_t i) {
  cand_t v = c[i];
  while (i > 0 && cand_before(v, c[(i - 1) / 2])) {
    c[i] = c[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  c[i] = v;
}

static void cand_down(cand_t *c, uint32_t n, uint32_t i) {
  cand_t v = c[i];
  for (uint32_t k; (k = 2 * i + 1) < n; i = k) {
    if (k + 1 < n && cand_before(c[k + 1], c[k])) ++k;
    if (!cand_before(c[k], v)) break;
    c[i] = c[k];
  }
  c[i] = v;
}

/* Place i of heap k into the frontier, if the heap has it. */
static bool frontier_add(stitch_t *t, st_worth_iter_t *it, int k, uint32_t i) {
  if (i >= t->wn[k]) return true;
  if (it->n == it->cap) {
    uint32_t cap = it->cap * 2;
    cand_t *f = gmr__realloc(it->f, (size_t)cap * sizeof *f);
    if (f == NULL) return false;
    it->f = f;
    it->cap = cap;
  }
  st_went_t e = t->wheap[k][i];
  it->f[it->n] = (cand_t){k == W_A ? ~e.key : 2 * it->T + 2 - e.key, e.id, i, k};
  cand_up(it->f, it->n++);
  return true;
}

/* see Note [Worth] */
int gmr__st_worth_begin(stitch_t *t, st_worth_iter_t *it, uint32_t want) {
  file_dirty(t);
  /* B's pages whose worth is now wa move to A; M's dead entries go. */
  while (t->wn[W_M] > 0 && t->wheap[W_M][0].key <= t->tick) {
    st_went_t e = w_pop(t, W_M);
    if (!w_live(t, W_M, e)) continue;
    st_page_t *p = &t->pages[e.id];
    w_leave(t, p);
    ++p->wgen;
    p->wheap = W_A;
    ++t->wlive[W_A];
    w_push(t, W_A, ~p->wa, e.id);
  }
  /* Dead entries go: all of them once they outnumber the live ones (a
   * rebuild costs O(entries), paid for by as many fillings), and those at
   * the top (the pages the last misses took), so the reading below meets
   * few of them. */
  for (int k = W_A; k <= W_M; ++k)
    if (t->wn[k] > 2 * t->wlive[k == W_M ? W_B : k] + 64) w_rebuild(t, k);
  for (int k = W_A; k <= W_B; ++k)
    while (t->wn[k] > 0 && !w_live(t, k, t->wheap[k][0]))
      w_pop(t, k);
  gmr_assert_expensive(t->wdirty_head == ST_NIL && gmr__st_worth_holds(t));
  it->T = t->tick;
  it->n = 0;
  it->cap = 2 * want + 8;
  it->f = gmr__malloc((size_t)it->cap * sizeof *it->f);
  if (it->f == NULL) return GMR_ENOMEM;
  frontier_add(t, it, W_A, 0);
  frontier_add(t, it, W_B, 0);
  t->wfrozen = true;
  return 0;
}

bool gmr__st_worth_next(stitch_t *t, st_worth_iter_t *it, uint32_t *id) {
  while (it->n > 0) {
    cand_t x = it->f[0];
    it->f[0] = it->f[--it->n];
    cand_down(it->f, it->n, 0);
    /* Out of host memory for the frontier: the pages after x are not read. */
    if (!frontier_add(t, it, x.k, 2 * x.pos + 1) || !frontier_add(t, it, x.k, 2 * x.pos + 2))
      it->n = 0;
    if (w_live(t, x.k, t->wheap[x.k][x.pos])) {
      *id = x.id;
      return true;
    }
  }
  return false;
}

/* The pages touched meanwhile stay where they were, dirty: filed again at
 * the next miss, or out of their heap at their next touch. */
void gmr__st_worth_end(stitch_t *t, st_worth_iter_t *it) {
  gmr__free(it->f);
  it->f = NULL;
  t->wfrozen = false;
}
