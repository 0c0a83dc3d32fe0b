/* stitch.c: the stitch policy: allocation, free, record_stream, empty_cache,
 * quiesce/resume and the ops table (the design is in internal.h).
 *
 * A large request is served from a cached range of its length (no device
 * call) or stitched from whole FREE pages and the open slot of a PARTIAL
 * page, mapped as one transaction at a fresh virtual range; a small one
 * goes to the small pool.  A free keeps the range mapped as CACHED.
 * Map: Note [Allocation], [Free], [Graph capture], [Locking], [Fronts],
 * [Deferred free], [Callbacks].
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gate.h"
#include "stitch/internal.h"

static inline stitch_t *st_of(gmr_policy_t *p) {
  return (stitch_t *)p;
}

/* Note [Allocation]
 * Allocation of `size` bytes on stream s:
 *   size <= small_size: the small pool (small.c);
 *   otherwise len = size rounded up to G, then
 *   1. cache: the oldest CACHED range of exactly len whose spans are free
 *      (or parked under other cached ranges) and usable by s (stream stamps
 *      complete, dead gap <= tau): take it, no device call (ranges.c says
 *      why the oldest);
 *   2. stitch: k = len / P whole FREE pages and, for r = len mod P > 0, the
 *      open slot of a PARTIAL page with the smallest fit whose gap would be
 *      <= tau (a head slot: the block starts at P - r of that page; a tail
 *      slot: it ends at r), else the tail slot of one more FREE page; pages
 *      that are missing are created; the range is mapped as one transaction
 *      (ranges.c) at a fresh virtual range;
 *   3. on GMR_ENOMEM: wait for pending frees, give empty small segments back,
 *      evict cached ranges (address space), retry once;
 *   4. OOM, with live, free, dead-gap bytes, mappings and address space.
 *
 * Note [Free]
 * A block's spans go back to their pages stamped (s, n) and its range stays
 * mapped as CACHED; no device call.  A block used on other streams
 * (record_stream) waits for an event on each of them first.  A free may
 * also wait for the next op, which takes the block back when it is an
 * allocation that the free and it would serve with that very block (Note
 * [Deferred free]); any other op applies the free first.
 *
 * Note [Graph capture]
 * A captured graph replays into the addresses it was captured with, so the
 * pages behind a range whose addresses a graph may use must stay where they
 * are: mapping fresh pages at a fresh virtual range is safe during a capture
 * (the CUDA backend makes those calls in relaxed capture mode), but
 * unmapping a range, mapping one of its pages (or the bytes of its end
 * slots) into another range, or querying, recording or waiting on an event
 * is not.  So a miss is "fresh" (st_fresh) when
 *   - the allocating stream is being captured (`capturing`, for that miss:
 *     cudaStreamIsCapturing is asked on a miss only), or
 *   - the instance serves a private pool (`in_pool`: its backend is a
 *     pool's face of the gate, gmr__gate_keeps_space), whose ranges any of
 *     its graphs may use for as long as the pool lives;
 * and a fresh miss
 *   - takes only FREE pages that no range maps, and creates the rest (no
 *     cached range's page, parked or not, and no open slot: plan D);
 *   - unmaps nothing: no eviction over the caps, no stale range, no OOM
 *     eviction (a pool's instance unmaps only when the runtime trims it,
 *     which gmr_empty_cache does once the pool's use count is 0, i.e. no
 *     graph uses it, or gmr_pool_empty_cache asks, and when it is
 *     destroyed);
 *   - during a capture, reads a stamp of another stream only from what is
 *     known complete, without polling or recording an event, and its OOM
 *     retry waits for nothing.
 * Cache hits (and resizes, Note [Resizing]: the range's own last page) are
 * served as always; a hit records an event only on a stream that is not
 * being captured (pages.c).  The small pool's new segments follow the same
 * rules (small.c).  What a pool gives up: its misses never reuse the pages
 * of its cached ranges of other lengths, and a block's last page is its own
 * (a pool's reserved bytes are those of PyTorch's expandable segments, not
 * stitch's); the default instance shares pages as before outside captures.
 *
 * Note [Locking]
 * `concurrent` (policy.h, rule 5).  One lock, `lock` (a gmr_lock_t), guards
 * everything in stitch_t but the options and P, which are set at creation,
 * and the fronts: every op below takes it on entry and releases it on
 * return (destroy excepted: nobody else holds the policy then), and calls
 * nothing that takes it again; the whole-state ops run under quiesce, which
 * holds it.  So the runtime takes its hot paths (the map under its shard's
 * lock, no runtime lock) and an op runs as it did when the runtime
 * serialized them.
 *
 * Note [Fronts] (front.c)
 * As long as one thread at a time calls the policy, nothing else exists, and
 * every decision is the one above.  The first time a thread finds `lock`
 * held, `contended` is set for good and each stream that allocates gets a
 * front: its user's last free is kept there, still allocated for the pools,
 * and the stream's next allocation of the same length takes it back under
 * the front's own lock; a free into an occupied front frees the block it
 * held under `lock`.  So threads on their own streams that reuse their
 * sizes share no lock.  Invariants:
 *   a block in a front is allocated for the pools and counted as allocated
 *     (its user freed it);
 *   the statistics plus the fronts' unfolded take-backs are the figures;
 * every op that reads or changes the whole state (statistics, walks, checks,
 * summary, trim: the quiesced ops) first flushes the fronts (their blocks
 * freed, their counts folded) and freezes them until it ends, and an
 * allocation that finds no memory flushes them before it retries.  Blocks
 * with record_stream uses, and every free while the history records, take
 * the locked path.
 *
 * Note [Callbacks]
 * Walk, summary and statistics callbacks are the runtime's collectors,
 * which never call back into the policy (the caller's own callbacks run
 * after the op returned: runtime.c, "Re-entrance").  Waits under the lock
 * (cross_stream: sync, the OOM retry, empty_cache) hold it as the runtime's
 * lock did.
 */

/* ---- pending frees (record_stream) ------------------------------------------------------------
 */

static void pending_finish(stitch_t *t, st_pending_t *q) {
  gmr_backend_t *be = t->base.backend;
  for (uint32_t k = 0; k < q->nev; ++k)
    gmr__backend_event_destroy(be, q->ev[k]);
  if (q->r != NULL) {
    st_range_t *r = q->r;
    t->st.pend[2] -= (int64_t)r->len;
    t->st.pend[0] -= (int64_t)r->len;
    gmr__history_free_completed_at(t->rec, (void *)(r->va + r->first_off), r->requested,
                                   t->streams[r->sidx].s);
    gmr__st_range_release(t, r, q->stamp);
  } else {
    st_small_t *b = q->b;
    t->st.pend[1] -= b->size;
    t->st.pend[0] -= b->size;
    b->pending = false;
    b->nuses = 0;
    gmr__history_free_completed_at(t->rec, (void *)st_small_ptr(b), b->requested,
                                   t->streams[b->seg->sidx].s);
    gmr__st_small_free(t, b);
  }
  gmr__free(q->ev);
  gmr__free(q);
}

/* Record the events of a pending free (not on a stream being captured). */
static void pending_record(stitch_t *t, st_pending_t *q, const uint32_t *uses, uint32_t n) {
  gmr_backend_t *be = t->base.backend;
  for (uint32_t k = 0; k < n; ++k)
    if (gmr__backend_stream_capturing(be, t->streams[uses[k]].s) != 0) return;
  for (uint32_t k = 0; k < n; ++k) {
    if (gmr__backend_event_record(be, t->streams[uses[k]].s, &q->ev[q->nev]) != 0) {
      /* No event: wait for the stream instead (rare: a device error). */
      gmr__backend_stream_sync(be, t->streams[uses[k]].s);
      ++t->st.syncs;
      continue;
    }
    ++t->st.event_records;
    ++q->nev;
  }
  q->recorded = true;
}

/* Finish every pending free whose events completed; wait: synchronise. */
static void pending_process(stitch_t *t, bool wait) {
  gmr_backend_t *be = t->base.backend;
  st_pending_t **pp = &t->pend_head;
  while (*pp != NULL) {
    st_pending_t *q = *pp;
    if (!q->recorded) {
      const uint32_t *uses = q->r ? q->r->uses : q->b->uses;
      uint32_t n = q->r ? q->r->nuses : q->b->nuses;
      pending_record(t, q, uses, n);
    }
    bool done = q->recorded;
    while (done && q->nev > 0) {
      int rc;
      if (wait) {
        ++t->st.syncs;
        rc = gmr__backend_event_sync(be, q->ev[q->nev - 1]);
      } else {
        ++t->st.event_queries;
        rc = gmr__backend_event_query(be, q->ev[q->nev - 1]);
      }
      if (rc != 0) {
        done = false;
        break;
      }
      gmr__backend_event_destroy(be, q->ev[--q->nev]);
    }
    if (done) {
      *pp = q->next;
      pending_finish(t, q);
    } else {
      pp = &q->next;
    }
  }
}

/* Defer a free until the block's other streams complete. */
static int pending_add(stitch_t *t, st_range_t *r, st_small_t *b, uint32_t sidx, uint32_t nuses) {
  st_pending_t *q = gmr__calloc(1, sizeof *q);
  gmr_event_t *ev = gmr__calloc(nuses, sizeof *ev);
  if (q == NULL || ev == NULL) {
    gmr__free(q);
    gmr__free(ev);
    return GMR_ENOMEM;
  }
  q->r = r;
  q->b = b;
  q->ev = ev;
  q->stamp = st_stamp_new(t, sidx);
  pending_record(t, q, r ? r->uses : b->uses, nuses);
  q->next = t->pend_head;
  t->pend_head = q;
  return 0;
}

/* ---- large blocks -----------------------------------------------------------------------------
 */

static void fronts_flush(stitch_t *t, bool freeze); /* see Note [Fronts] */

/* Is page id's tail slot the end of a range that grows (Note [Resizing])? */
static inline bool tail_grows(const stitch_t *t, uint32_t id) {
  const st_range_t *o = t->pages[id].tail_owner;
  return o != NULL && o->grows;
}

/* The PARTIAL page whose open slot fits r best with a gap <= tau (an open
 * suffix after a growing range's tail excepted). */
static uint32_t find_partial(stitch_t *t, st_classes_t *c, uint32_t r, uint32_t sidx,
                             uint32_t *gap) {
  uint32_t want = r / ST_G;
  for (uint32_t k = gmr__st_classes_find(c, want); k != ST_NIL;
       k = gmr__st_classes_find(c, k + 1)) {
    if ((uint64_t)(k - want) * ST_G > t->o.tau) break;
    int tries = 8;
    for (uint32_t id = c->head[k]; id != ST_NIL && tries-- > 0; id = t->pages[id].next)
      if ((int64_t)t->pages[id].nmaps < t->o.max_maps_per_page && !tail_grows(t, id) &&
          st_page_ready(t, id, sidx)) {
        *gap = (k - want) * ST_G;
        return id;
      }
  }
  return ST_NIL;
}

/* The page with the largest open suffix of more than `above` bytes. */
static uint32_t find_largest_suffix(stitch_t *t, uint32_t above, uint32_t sidx) {
  st_classes_t *c = &t->suffix;
  for (uint32_t k = gmr__st_classes_find_last(c, c->n - 1); k != ST_NIL && k * ST_G > above;
       k = k ? gmr__st_classes_find_last(c, k - 1) : ST_NIL) {
    int tries = 8;
    for (uint32_t id = c->head[k]; id != ST_NIL && tries-- > 0; id = t->pages[id].next)
      if ((int64_t)t->pages[id].nmaps < t->o.max_maps_per_page && !tail_grows(t, id) &&
          st_page_ready(t, id, sidx))
        return id;
  }
  return ST_NIL;
}

/* Where a block of k whole pages and a remainder rem goes:
 *  A. rem in the open suffix of a PARTIAL page (head slot), gap <= tau;
 *  B. rem in the open prefix of a PARTIAL page (tail slot), gap <= tau;
 *  C. (k >= 1) the block starts at the largest open suffix of o > rem bytes,
 *     which it fills, then k - 1 whole pages, then rem' = P + rem - o in an
 *     open prefix (gap <= tau) or at the start of a FREE page: this uses
 *     one page less than D and leaves o - rem open instead of P - rem;
 *  D. rem at the start of a FREE page, whose suffix stays open. */
typedef struct plan_s {
  uint32_t head, tail; /* PARTIAL pages used for the first and last span, or ST_NIL */
  uint32_t first_off;  /* the block's offset in its first slot */
  uint32_t pool;       /* FREE pages needed */
} plan_t;

static plan_t plan_of(stitch_t *t, uint32_t k, uint32_t rem, uint32_t sidx) {
  uint32_t P = (uint32_t)t->P;
  plan_t pl = {ST_NIL, ST_NIL, 0, k + (rem > 0)};
  if (rem == 0 || st_fresh(t)) return pl; /* fresh pages only: Note [Graph capture] */
  uint32_t gh = UINT32_MAX, gt = UINT32_MAX;
  uint32_t h = find_partial(t, &t->suffix, rem, sidx, &gh);
  uint32_t tl = find_partial(t, &t->prefix, rem, sidx, &gt);
  if (h != ST_NIL && gh <= gt) {
    pl.head = h;
    pl.first_off = P - rem;
    pl.pool = k;
    return pl;
  }
  if (tl != ST_NIL) {
    pl.tail = tl;
    pl.pool = k;
    return pl;
  }
  if (k >= 1) {
    h = find_largest_suffix(t, rem, sidx);
    if (h != ST_NIL) {
      uint32_t o = P - t->pages[h].tail_end, rem2 = P + rem - o;
      pl.head = h;
      pl.first_off = t->pages[h].tail_end;
      pl.tail = find_partial(t, &t->prefix, rem2, sidx, &gt);
      pl.pool = k - 1 + (pl.tail == ST_NIL);
    }
  }
  return pl;
}

/* Sort k[0..n) ascending: quicksort on plain keys (no comparison call),
 * insertion sort for short runs; the keys are distinct, so the order is
 * the one any sort gives. */
static void keys_sort(uint64_t *k, uint32_t n) {
  while (n > 16) {
    uint64_t a = k[0], b = k[n / 2], c = k[n - 1];
    uint64_t piv = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
    uint32_t i = 0, j = n - 1;
    for (;;) {
      while (k[i] < piv)
        ++i;
      while (k[j] > piv)
        --j;
      if (i >= j) break;
      uint64_t x = k[i];
      k[i++] = k[j];
      k[j--] = x;
    }
    /* [0, j] <= piv <= [j + 1, n): recurse on the smaller side. */
    uint32_t left = j + 1;
    if (left < n - left) {
      keys_sort(k, left);
      k += left;
      n -= left;
    } else {
      keys_sort(k + left, n - left);
      n = left;
    }
  }
  for (uint32_t i = 1; i < n; ++i) {
    uint64_t x = k[i];
    uint32_t j = i;
    for (; j > 0 && k[j - 1] > x; --j)
      k[j] = k[j - 1];
    k[j] = x;
  }
}

/* Order the n page ids in ids[] by (chunk, offset), pages of their own
 * last by id, so that a chunk's pages taken together map in one call
 * (Note [Chunks], pages.c).  Which pages a range maps is unchanged, and so
 * is every other slot: these are all whole slots.  Already in order or in
 * reverse order (a cached range's pages as the FREE lists give them back):
 * no sort. */
static int chunk_order(stitch_t *t, uint32_t *ids, uint32_t n) {
  if (n < 2 || t->nchunks == 0) return 0;
  uint64_t *key = gmr__malloc((size_t)n * sizeof *key);
  if (key == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a range");
  bool up = true, down = true;
  for (uint32_t i = 0; i < n; ++i) {
    const st_page_t *p = &t->pages[ids[i]];
    key[i] =
        p->chunk != ST_NIL ? (uint64_t)p->chunk << 32 | p->coff : (uint64_t)ST_NIL << 32 | ids[i];
    if (i > 0) {
      up = up && key[i - 1] < key[i];
      down = down && key[i - 1] > key[i];
    }
  }
  if (!up) {
    if (down)
      for (uint32_t i = 0; i < n / 2; ++i) {
        uint64_t k = key[i];
        key[i] = key[n - 1 - i];
        key[n - 1 - i] = k;
      }
    else
      keys_sort(key, n);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t c = (uint32_t)(key[i] >> 32), lo = (uint32_t)key[i];
      ids[i] = c != ST_NIL ? t->chunks[c].ids[lo] : lo;
    }
  }
  gmr__free(key);
  return 0;
}

static int large_stitch(stitch_t *t, uint64_t len, uint32_t sidx, bool grows, st_range_t **out) {
  uint64_t P = t->P;
  uint32_t k = (uint32_t)(len / P), rem = (uint32_t)(len % P);
  /* Make room for the new mappings and address space first. */
  gmr__st_evict(t, k + 2, (k + 2) * P, false);
  plan_t pl = plan_of(t, k, rem, sidx);
  uint32_t nslots = pl.pool + (pl.head != ST_NIL) + (pl.tail != ST_NIL);
  st_range_t *r = gmr__st_range_alloc(nslots);
  if (r == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for a range");
  uint32_t need = pl.pool;
  uint32_t *whole = r->pages + (pl.head != ST_NIL);
  uint32_t got = gmr__st_collect_free(t, need, sidx, whole);
  if (got < need && t->empty_head != NULL && !st_fresh(t)) {
    /* Empty small segments give their pages back before the pool grows. */
    gmr__st_small_reclaim(t, false);
    got = gmr__st_collect_free(t, need, sidx, whole);
  }
  uint32_t nnew = need - got, made = 0;
  int err = gmr__st_pages_reserve(t, nnew);
  /* The pages this attempt creates, for the undo (chunk_order moves them
   * in whole[]). */
  uint32_t *fresh = err == 0 && nnew > 0 ? gmr__malloc((size_t)nnew * sizeof *fresh) : NULL;
  if (err != 0 || (nnew > 0 && fresh == NULL))
    err = gmr__error_set(GMR_ENOMEM, "stitch: out of host memory for the page table");
  /* Chunks of up to chunk_pages pages for a block of chunk_min_pages whole
   * pages or more (Note [Chunks], pages.c); a refused one leaves the rest to
   * one page a call, below. */
  uint32_t cap = t->o.chunk_pages > 0 ? (uint32_t)t->o.chunk_pages : UINT32_MAX;
  if ((int64_t)need < t->o.chunk_min_pages) cap = 1;
  while (err == 0 && nnew - made >= 2) {
    uint32_t n = nnew - made < cap ? nnew - made : cap;
    gmr_phys_t h;
    if (n < 2 || gmr__backend_phys_create(t->base.backend, (uint64_t)n * P, &h) != 0) break;
    if (gmr__st_chunk_new(t, h, n, whole + got + made) != 0) {
      gmr__backend_phys_release(t->base.backend, h, (uint64_t)n * P);
      break;
    }
    t->st.pages_created += n;
    for (uint32_t i = 0; i < n; ++i, ++made) {
      gmr__st_page_reindex(t, whole[got + made]);
      fresh[made] = whole[got + made];
    }
  }
  for (; err == 0 && made < nnew; ++made) {
    gmr_phys_t h;
    err = gmr__backend_phys_create(t->base.backend, P, &h);
    if (err != 0) break;
    ++t->st.pages_created;
    uint32_t id = gmr__st_page_new(t, h);
    gmr__st_page_reindex(t, id);
    whole[got + made] = fresh[made] = id;
  }
  if (err == 0) { /* the whole slots' pages in chunk order: one map a run (Note [Chunks]) */
    bool last_partial = pl.tail == ST_NIL && (pl.first_off + len) % P != 0;
    err = chunk_order(t, whole, need - (need > 0 && last_partial));
  }
  if (err == 0) {
    if (pl.head != ST_NIL) r->pages[0] = pl.head;
    if (pl.tail != ST_NIL) r->pages[nslots - 1] = pl.tail;
    r->first_off = pl.first_off;
    r->len = len;
    r->sidx = sidx;
    for (uint32_t j = 0; j < nslots; ++j) {
      uint32_t a, b;
      st_span(t, r, j, &a, &b);
      bool whole = a == 0 && b == (uint32_t)P;
      r->nwhole += whole;
      if (!whole) r->ends |= j == 0 ? 1 : 2;
    }
    err = gmr__st_range_link(t, r);
    if (err == 0) err = gmr__st_map_range(t, r);
  }
  if (err != 0) { /* undo: the pages this attempt created, the range record */
    for (uint32_t i = 0; i < made; ++i) {
      const st_page_t *p = &t->pages[fresh[i]];
      if (p->where == ST_W_DEAD) /* released with its chunk */
        continue;
      if (p->chunk == ST_NIL)
        gmr__st_page_release(t, fresh[i]);
      else if (p->coff == 0) /* every page of it made by this attempt */
        gmr__st_chunk_release(t, p->chunk);
    }
    gmr__free(fresh);
    gmr__st_range_destroy(t, r);
    return err;
  }
  gmr__free(fresh);
  if (pl.head != ST_NIL || pl.tail != ST_NIL) ++t->st.stitches_partial;
  r->grows = grows;
  gmr__st_range_own(t, r);
  *out = r;
  return 0;
}

/* A cached range handed out again: its period and tick (Belady's rule,
 * ranges.c), a hit. */
static inline void large_hit(stitch_t *t, st_range_t *r) {
  r->gap = t->tick + 1 - r->tick;
  r->tick = ++t->tick;
  r->stale = 0;
  ++t->st.hits;
}

/* b, allocated, handed out for size bytes. */
static inline void small_out(stitch_t *t, st_small_t *b, size_t size, gmr_block_t *out) {
  st_count_alloc(&t->st, 1, b->size, (int64_t)size);
  out->ptr = (void *)st_small_ptr(b);
  out->size = b->size;
  out->handle = b;
}

/* r, LIVE, handed out for size bytes (len = r->len). */
static inline void large_out(stitch_t *t, st_range_t *r, size_t size, gmr_block_t *out) {
  r->requested = size;
  st_count_alloc(&t->st, 2, (int64_t)r->len, (int64_t)size);
  out->ptr = (void *)(r->va + r->first_off);
  out->size = r->len;
  out->handle = r;
}

/* The free of a range with no partial end slot (gmr__st_range_release's case,
 * inline): cached, its whole pages parked under it, stamped. */
static inline void large_park(stitch_t *t, st_range_t *r) {
  r->parked = r->nwhole > 0;
  t->nparked += r->nwhole;
  r->last_use = st_stamp_new(t, r->sidx);
  r->nuses = 0;
  st_cache_put(t, r);
}

/* see Note [Allocation] */
static int alloc_large(stitch_t *t, size_t size, uint32_t sidx, gmr_stream_t s, gmr_block_t *out) {
  /* More than the device holds can never be mapped: refused before any page
   * table or range is sized by it (a 1 PB request wanted 18 GB of host
   * memory), and so len / P fits the 32-bit page counts below. */
  if (size > t->device_total)
    return gmr__st_report_oom(t, size, s, "the request is larger than the device's memory");
  uint64_t len = gmr__align_up(size, ST_G);
  /* The common hit, inline: the oldest cached range of len is parked under
   * itself with no partial end slot and its last free is complete for s
   * (gmr__st_range_usable's first case); anything else takes the lookup. */
  st_len_t *e = st_len_find(t, len);
  st_range_t *r = e != NULL ? e->first : NULL;
  while (r != NULL && r->state != ST_R_CACHED)
    r = r->len_next;
  if (r != NULL && r->parked && r->ends == 0 && st_stamp_ready_now(t, r->last_use, sidx)) {
    st_cache_remove(t, r);
    r->parked = false;
    t->nparked -= r->nwhole;
    r->state = ST_R_LIVE;
  } else if (r != NULL && (r = gmr__st_cache_lookup(t, len, sidx)) != NULL) {
    st_cache_remove(t, r);
    gmr__st_range_own(t, r);
  }
  bool grows = false;
  if (r == NULL && (r = gmr__st_cache_resize(t, len, sidx, &grows)) != NULL) {
    st_cache_remove(t, r); /* see Note [Resizing] (ranges.c) */
    gmr__st_range_own(t, r);
    ++t->st.resizes;
  }
  if (r != NULL) {
    large_hit(t, r);
  } else {
    /* see Note [Graph capture] */
    t->capturing = gmr__backend_stream_capturing(t->base.backend, s) != 0;
    ++t->st.misses;
    gmr__st_cache_miss(t, len, sidx);
    int err = large_stitch(t, len, sidx, grows, &r);
    if (err == GMR_ENOMEM) {
      ++t->st.retries;
      fronts_flush(t, false);
      if (!t->capturing) { /* no wait during a capture */
        pending_process(t, true);
        gmr__st_small_reclaim(t, true);
      }
      gmr__st_evict(t, 0, 0, true);
      err = large_stitch(t, len, sidx, grows, &r);
    }
    t->capturing = false;
    if (err == 0) r->tick = ++t->tick;
    if (err == GMR_ENOMEM) return gmr__st_report_oom(t, len, s, gmr__error_last());
    if (err != 0) return err;
  }
  r->sidx = sidx; /* a cached range may have served another stream's block */
  large_out(t, r, size, out);
  return 0;
}

static int alloc_small(stitch_t *t, size_t size, uint32_t sidx, gmr_stream_t s, gmr_block_t *out) {
  uint32_t len = (uint32_t)gmr__align_up(size, ST_G);
  st_small_t *b = NULL;
  int err = gmr__st_small_alloc(t, len, size, sidx, &b);
  if (err == GMR_ENOMEM) {
    ++t->st.retries;
    fronts_flush(t, false);
    if (gmr__backend_stream_capturing(t->base.backend, s) == 0) { /* see Note [Graph capture] */
      pending_process(t, true);
      gmr__st_small_reclaim(t, true);
    }
    gmr__st_evict(t, 0, 0, true);
    err = gmr__st_small_alloc(t, len, size, sidx, &b);
    if (err == GMR_ENOMEM) return gmr__st_report_oom(t, len, s, gmr__error_last());
  }
  if (err != 0) return err;
  small_out(t, b, size, out);
  return 0;
}

/* ---- the take-back ----------------------------------------------------------------------------
 */

/* Note [Deferred free] (the take-back)
 * A free may wait for the next op (t->deferred: a small block, t->deferred_r:
 * a large range; at most one of them set), which takes the block back when
 * it is an allocation that the free followed by it would serve with that
 * block, leaving everything else as it was.  Every other op applies the free
 * first (st_enter), as it would have been applied at once: the figures, the
 * history's free_completed and the stream's free count are the free's own
 * at once or in that op, before anything else, so the stamps keep their
 * order.  The small pool's case: small.c, Note [Small take-back].  A large range
 * with no partial end slot, with no record_stream use and at least one whole
 * page (large_park would park it), none of whose older ranges of its length
 * is CACHED: the allocation of its length on its stream right after its
 * free takes the oldest cached range of the length, which is it, parked
 * under itself with its own stream's stamp (alloc_large's inline hit), and
 * unparks it: the LRU list, nparked and the range are as before but for its
 * stamp, its tick and the hit.  The older ranges are looked at up to
 * ST_DEFER_WALK of them; past that the free is applied at once. */
#define ST_DEFER_WALK 8

static inline bool large_deferrable(const st_range_t *r) {
  if (r->ends != 0 || r->nwhole == 0 || r->nuses != 0) return false;
  const st_range_t *q = r->len_prev;
  for (int k = 0; q != NULL; q = q->len_prev)
    if (q->state == ST_R_CACHED || ++k > ST_DEFER_WALK) return false;
  return true;
}

/* The waiting free, applied (every op but an allocation, on entry). */
static inline void deferred_apply(stitch_t *t) {
  st_small_t *b = t->deferred;
  st_range_t *r = t->deferred_r;
  if (GMR_UNLIKELY(b != NULL)) {
    t->deferred = NULL;
    gmr__st_small_free(t, b);
  } else if (GMR_UNLIKELY(r != NULL)) {
    t->deferred_r = NULL;
    large_park(t, r);
  }
}

/* The lock; a thread that finds it held turns the fronts on for good
 * (see Note [Locking], Note [Fronts]). */
static inline void st_lock(stitch_t *t) {
  if (GMR_LIKELY(gmr__lock_try(&t->lock))) return;
  if (!atomic_load_explicit(&t->contended, memory_order_relaxed))
    atomic_store_explicit(&t->contended, true, memory_order_relaxed);
  gmr__lock(&t->lock);
}

/* Every op but an allocation starts here: the lock, then the waiting free
 * applied, so nothing reads or changes the pools with it pending. */
static inline stitch_t *st_enter(gmr_policy_t *self) {
  stitch_t *t = st_of(self);
  st_lock(t);
  deferred_apply(t);
  return t;
}

/* An allocation of size bytes on stream sidx with a free waiting: take the
 * block back (true, *out written) or apply the free (false).  pend_head must
 * be empty: the allocation would process pending frees after the free. */
static inline __attribute__((always_inline)) bool take_back(stitch_t *t, size_t size, uint32_t sidx,
                                                            gmr_block_t *out) {
  st_small_t *b = t->deferred;
  st_range_t *r = t->deferred_r;
  uint64_t len = gmr__align_up(size, ST_G);
  bool pending = t->pend_head != NULL;
  if (b != NULL && !pending && size <= t->small_max && len == b->size && b->seg->sidx == sidx) {
    t->deferred = NULL;
    st_small_take_back(t, b, size);
    small_out(t, b, size, out);
    return true;
  }
  if (r != NULL && !pending && size > t->small_max && len == r->len && r->sidx == sidx) {
    t->deferred_r = NULL;
    r->last_use = st_stamp_new(t, r->sidx);
    large_hit(t, r);
    large_out(t, r, size, out);
    return true;
  }
  deferred_apply(t);
  return false;
}

static inline __attribute__((always_inline)) int alloc_locked(stitch_t *t, size_t size,
                                                              gmr_stream_t s, gmr_block_t *out) {
  uint32_t sidx;
  int err = st_stream_of(t, s, &sidx);
  if (err != 0) return err;
  if ((t->deferred != NULL || t->deferred_r != NULL) && take_back(t, size, sidx, out)) {
    out->stream = s;
    out->requested = size;
    return 0;
  }
  if (t->pend_head != NULL) pending_process(t, false);
  /* Each writes out->ptr, size and handle on success only (rule 4). */
  err = size <= t->small_max ? alloc_small(t, size, sidx, s, out)
                             : alloc_large(t, size, sidx, s, out);
  if (err != 0) {
    if (err == GMR_ENOMEM) ++t->st.ooms;
    return err;
  }
  out->stream = s;
  out->requested = size;
  return 0;
}

/* An allocation once the fronts are on: the stream's front, then the
 * locked path, which gives the stream a front if it has none. */
static __attribute__((noinline)) int alloc_contended(stitch_t *t, size_t size, gmr_stream_t s,
                                                     gmr_block_t *out) {
  st_front_t *f = gmr__st_front_find(t, s);
  if (f != NULL && gmr__st_front_take(f, t->small_max, size, out)) return 0;
  st_lock(t);
  int err = alloc_locked(t, size, s, out);
  if (f == NULL) gmr__st_front_new(t, s);
  gmr__unlock(&t->lock);
  return err;
}

static int st_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  stitch_t *t = st_of(self);
  if (GMR_UNLIKELY(atomic_load_explicit(&t->contended, memory_order_relaxed)))
    return alloc_contended(t, size, s, out);
  st_lock(t);
  int err = alloc_locked(t, size, s, out);
  gmr__unlock(&t->lock);
  return err;
}

static inline __attribute__((always_inline)) void free_locked(stitch_t *t, const gmr_block_t *blk) {
  if (blk->size <= t->small_max) {
    st_small_t *b = blk->handle;
    st_count_free(&t->st, 1, b->size, (int64_t)b->requested);
    if (b->nuses > 0 && pending_add(t, NULL, b, b->seg->sidx, b->nuses) == 0) {
      b->pending = true;
      t->st.pend[1] += b->size;
      t->st.pend[0] += b->size;
      return;
    }
    b->nuses = 0;
    gmr__history_free_completed_at(t->rec, blk->ptr, b->requested, blk->stream);
    if (st_small_deferrable(t, b))
      t->deferred = b;
    else
      gmr__st_small_free(t, b);
    return;
  }
  st_range_t *r = blk->handle;
  st_count_free(&t->st, 2, (int64_t)r->len, (int64_t)r->requested);
  if (r->nuses > 0 && pending_add(t, r, NULL, r->sidx, r->nuses) == 0) {
    r->state = ST_R_PENDING;
    t->st.pend[2] += (int64_t)r->len;
    t->st.pend[0] += (int64_t)r->len;
    return;
  }
  gmr__history_free_completed_at(t->rec, blk->ptr, r->requested, blk->stream);
  if (GMR_LIKELY(r->ends == 0)) {
    if (large_deferrable(r))
      t->deferred_r = r;
    else
      large_park(t, r);
    return;
  }
  gmr__st_range_release(t, r, st_stamp_new(t, r->sidx));
}

/* Under lock: the free of a block a front kept (its user freed it then). */
static void free_kept(stitch_t *t, st_small_t *b, st_range_t *r) {
  gmr_block_t blk = st_block_of(b, r, t->streams[b != NULL ? b->seg->sidx : r->sidx].s);
  free_locked(t, &blk);
}

/* Under lock: every front emptied, its blocks freed (and the fronts
 * frozen when freeze, until gmr__st_fronts_thaw; see Note [Fronts]). */
static void fronts_flush(stitch_t *t, bool freeze) {
  if (t->nfronts == 0) return;
  st_small_t *kb[ST_FRONTS];
  st_range_t *kr[ST_FRONTS];
  gmr__st_fronts_drain(t, freeze, kb, kr);
  for (size_t i = 0; i < ST_FRONTS; ++i)
    if (kb[i] != NULL || kr[i] != NULL) {
      deferred_apply(t);
      free_kept(t, kb[i], kr[i]);
    }
  deferred_apply(t);
}

/* Quiesced (policy.h, rule 5), for the ops that read or change the whole
 * state: the lock, the fronts flushed and frozen, the waiting free
 * applied; st_resume undoes it (see Note [Locking], Note [Fronts]). */
static void st_quiesce(gmr_policy_t *self) {
  stitch_t *t = st_enter(self);
  fronts_flush(t, true);
}
static void st_resume(gmr_policy_t *self) {
  stitch_t *t = st_of(self);
  if (t->nfronts != 0) gmr__st_fronts_thaw(t);
  gmr__unlock(&t->lock);
}

/* The free of blk kept in its stream's front (true), and the block kept
 * there before freed under lock; false: the front is off, frozen, or
 * the block has record_stream uses or the history is on (its
 * free_completed entry belongs at the free). */
static __attribute__((noinline)) bool free_to_front(stitch_t *t, const gmr_block_t *blk) {
  st_front_t *f = gmr__st_front_find(t, blk->stream);
  if (f == NULL || gmr__recording_history_at(t->rec) != NULL) return false;
  st_small_t *b = NULL, *old_b;
  st_range_t *r = NULL, *old_r;
  if (blk->size <= t->small_max)
    b = blk->handle;
  else
    r = blk->handle;
  if ((b != NULL ? b->nuses : r->nuses) != 0 || !gmr__st_front_keep(f, b, r, &old_b, &old_r))
    return false;
  if (old_b != NULL || old_r != NULL) {
    st_enter(&t->base);
    free_kept(t, old_b, old_r);
    gmr__unlock(&t->lock);
  }
  return true;
}

/* see Note [Free] */
static int st_free(gmr_policy_t *self, const gmr_block_t *blk) {
  stitch_t *t = st_of(self);
  if (GMR_UNLIKELY(atomic_load_explicit(&t->contended, memory_order_relaxed)) &&
      free_to_front(t, blk))
    return 0;
  t = st_enter(self);
  free_locked(t, blk);
  gmr__unlock(&t->lock);
  return 0;
}

static int uses_add(uint32_t **uses, uint32_t *n, uint32_t *cap, uint32_t sidx) {
  for (uint32_t i = 0; i < *n; ++i)
    if ((*uses)[i] == sidx) return 0;
  if (*n == *cap) {
    uint32_t c = *cap ? *cap * 2 : 2;
    uint32_t *u = gmr__realloc(*uses, c * sizeof *u);
    if (u == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory (record_stream)");
    *uses = u;
    *cap = c;
  }
  (*uses)[(*n)++] = sidx;
  return 0;
}

static int record_stream_locked(stitch_t *t, const gmr_block_t *blk, gmr_stream_t s) {
  uint32_t sidx;
  int err = gmr__st_stream_index(t, s, &sidx);
  if (err != 0) return err;
  if (blk->size <= t->small_max) {
    st_small_t *b = blk->handle;
    if (sidx == b->seg->sidx) return 0;
    return uses_add(&b->uses, &b->nuses, &b->capuses, sidx);
  }
  st_range_t *r = blk->handle;
  if (sidx == r->sidx) return 0;
  return uses_add(&r->uses, &r->nuses, &r->capuses, sidx);
}

static int st_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  stitch_t *t = st_enter(self);
  int err = record_stream_locked(t, blk, s);
  gmr__unlock(&t->lock);
  return err;
}

/* empty_cache: wait for pending frees, give empty small segments back, unmap
 * every cached range (waiting for its stream), release every FREE page. */
static int trim_locked(stitch_t *t) {
  pending_process(t, true);
  int err = gmr__st_small_reclaim(t, true);
  bool in_pool = t->in_pool; /* a pool is trimmed once no graph uses it: Note [Graph capture] */
  t->in_pool = false;
  int e = gmr__st_evict(t, 0, 0, true);
  t->in_pool = in_pool;
  if (err == 0) err = e;
  for (int m = 0; m < 2; ++m) {
    uint32_t id = t->free_head[m];
    while (id != ST_NIL) {
      uint32_t next = t->pages[id].next;
      if (t->pages[id].nmaps == 0 && t->pages[id].chunk == ST_NIL) {
        e = gmr__st_page_release(t, id);
        if (err == 0) err = e;
      }
      id = next;
    }
  }
  e = gmr__st_chunks_trim(t);
  if (err == 0) err = e;
  return err;
}

static int st_trim(gmr_policy_t *self) { /* quiesced */
  return trim_locked(st_of(self));
}

/* ---- creation ---------------------------------------------------------------------------------
 */

static void st_destroy(gmr_policy_t *self) {
  stitch_t *t = st_of(self);
  fronts_flush(t, false);
  gmr__st_fronts_fini(t);
  deferred_apply(t);
  /* Unmapping is not ordered with the streams: wait for every free's work,
   * with one synchronisation of the device rather than an event on each
   * stream: the caller may have destroyed its streams already (a
   * destroyed stream's handle must not be used again). */
  for (uint32_t i = 0; i < t->nstreams; ++i)
    if (t->streams[i].frees > t->streams[i].done) {
      ++t->st.syncs;
      gmr__backend_device_sync(t->base.backend);
      break;
    }
  while (t->pend_head != NULL) {
    st_pending_t *q = t->pend_head;
    t->pend_head = q->next;
    for (uint32_t k = 0; k < q->nev; ++k)
      gmr__backend_event_destroy(t->base.backend, q->ev[k]);
    gmr__free(q->ev);
    gmr__free(q);
  }
  gmr__st_small_fini(t);
  gmr__st_ranges_fini(t);
  for (uint32_t id = 0; id < t->npages; ++id)
    if (t->pages[id].where != ST_W_DEAD && t->pages[id].chunk == ST_NIL)
      gmr__backend_phys_release(t->base.backend, t->pages[id].h, t->P);
  for (uint32_t c = 0; c < t->nchunks; ++c)
    if (t->chunks[c].n != 0)
      gmr__backend_phys_release(t->base.backend, t->chunks[c].h, (uint64_t)t->chunks[c].n * t->P);
  gmr__st_va_fini(t);
  gmr__st_pages_fini(t);
  gmr__st_streams_fini(t);
  gmr__lock_destroy(&t->lock);
  gmr__free(t);
}

static int st_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                     gmr_policy_t **out) {
  (void)upstream;
  if (!gmr__backend_has_phys(be))
    return gmr__error_set(GMR_ENOTSUP,
                          "stitch: the %s backend cannot create and map physical pages (the "
                          "policy needs CUDA virtual memory management: cuMemCreate, cuMemMap)",
                          be->ops->name);
  stitch_t *t = gmr__calloc(1, sizeof *t);
  if (t == NULL) return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory");
  t->base.ops = &gmr__stitch_policy;
  t->base.backend = be;
  t->o = *(const st_opts_t *)opts;
  t->P = be->granularity;
  t->rec = gmr__recording_find(be);
  t->small_max = t->o.small_size < t->P / 2 ? t->o.small_size : t->P / 2;
  size_t dfree = 0, dtotal = 0;
  if (gmr__backend_mem_info(be, &dfree, &dtotal) != 0 || dtotal == 0) dtotal = (size_t)80 << 30;
  t->device_total = gmr__align_up(dtotal, t->P);
  t->in_pool = gmr__gate_keeps_space(be); /* see Note [Graph capture] */
  t->last_stream = UINT32_MAX;
  if (gmr__lock_init(&t->lock) != 0 || gmr__st_pages_init(t) != 0) {
    gmr__free(t);
    return gmr__error_set(GMR_ENOMEM, "stitch: out of host memory");
  }
  *out = &t->base;
  return 0;
}

/* ---- the table --------------------------------------------------------------------------------
 */

const gmr_policy_ops_t gmr__stitch_policy = {
    .name = "stitch",
    .help = "Device pages stitched into contiguous virtual ranges, a page shared by the tail of "
            "one block and the head of the next; cached ranges served with no device call; a "
            "small pool with PyTorch's rules.",
    .opts_size = sizeof(st_opts_t),
    .opts_default = &gmr__st_opts_default,
    .opts_desc = gmr__st_opts_desc,
    .validate = gmr__st_validate,
    .concurrent = true,
    .reports_free_completed = true,
    .create = st_create,
    .destroy = st_destroy,
    .alloc = st_alloc,
    .free = st_free,
    .record_stream = st_record_stream,
    .trim = st_trim,
    .stats = gmr__st_stats,
    .reset_peak = gmr__st_reset_peak,
    .reset_accumulated = gmr__st_reset_accumulated,
    .stats_foreach = gmr__st_stats_foreach,
    .summary = gmr__st_summary,
    .walk = gmr__st_walk,
    .check = gmr__st_check,
    .quiesce = st_quiesce,
    .resume = st_resume,
};
