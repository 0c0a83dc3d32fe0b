/* internal.h: the stitch policy's shared state (policies/stitch/): device
 * pages stitched into contiguous virtual ranges, a page shared by the tail
 * of one block and the head of the next.
 * Map: Note [Stitch pages], [Rooms], [Slot terms], [Stream stamps].
 */
#ifndef GMR_STITCH_INTERNAL_H
#define GMR_STITCH_INTERNAL_H

#include "observe/recording.h"
#include "policy.h"

/* Note [Stitch pages]
 * Physical memory is a pool of device pages of P bytes (the backend's
 * granularity, queried).  A large block is [the free head slot of one page]
 * [whole pages] or [whole pages][the free tail slot of one page], mapped into
 * one contiguous virtual range; a page whose tail and head slots belong to two
 * blocks is mapped twice, at the end of one range and the start of the other,
 * so no page is lost to rounding.  Requests of at most `small_size` go to a
 * small pool of one-page segments with PyTorch's rules.  A freed range keeps
 * its mappings (CACHED) and serves a later request of the same length with no
 * device call; only a miss maps.  Of the cached ranges of a length whose pages
 * are free, the oldest serves (ranges.c says why: a loop then makes no page
 * map after it has run twice).
 */

/* Note [Rooms]
 * Rooms (the skeleton every policy folder shares, then stitch's own), each
 * calling only those listed before it (no cycles):
 *   internal.h this header: the data model the files share
 *   options.c  the option table, the defaults and the cross-field checks
 *   worth.c    the FREE mapped pages in the order a miss takes them
 *   pages.c    page table, slot ownership, the FREE lists and the prefix and
 *              suffix indexes of partial pages, streams and stamps
 *   ranges.c   the virtual address arena, ranges and their mapping records,
 *              the map transaction, eviction, the cache index
 *   small.c    the small pool
 *   front.c    the per-stream fronts (the locked path's bypass)
 *   report.c   statistics, summary, OOM text
 *   check.c    the walk and the invariant checker
 *   stitch.c   alloc/free/record_stream/trim, quiescing and the ops table
 */

/* Note [Slot terms]
 * A page's tail slot is [0, tail_end), owned by a block's last span; its head
 * slot [head_start, P), owned by a block's first span; a whole page has a full
 * owner (a large block's interior page or a small segment).
 *   FREE    ⇔ no owner: tail_end = 0, head_start = P
 *   PARTIAL ⇔ no full owner and exactly one slot owned: the other is "open"
 *   CLOSED  ⇔ both slots owned: [tail_end, head_start) is a dead gap <= tau
 *   FULL    ⇔ a full owner (a CACHED range's whole page is "parked" under
 *             it: free memory, taken back by gmr__st_unpark_all; ranges.c)
 * Offsets are multiples of G = 512 bytes, so no 32-byte sector is ever
 * shared by two blocks.
 */

/* Note [Stream stamps]
 * Each stream counts its frees; a page keeps up to ST_STAMPS (stream, count)
 * stamps of releases on it.  A page may be used by stream s once every stamp
 * is of s or known complete (an event recorded after it, queried without
 * blocking, or waited on with cross_stream: sync).  Unmapping and remapping
 * are not ordered with a stream's work: a range's slot is unmapped or remapped
 * only once the range's last free (last_use) is known complete
 * (gmr__st_stamp_ready with no stream of its own).
 */

#define ST_G      ((uint32_t)512)
#define ST_NIL    UINT32_MAX
#define ST_STAMPS 2
/* Note [Resizing]: how far (bytes) a cached range's length may be from a
 * request's for the range to be resized to it. */
#define ST_RESIZE ((uint64_t)64 << 10)
/* Cached ranges counted by len / ST_LENF_BYTES, folded into ST_LENF
 * counters (a filter: a resize probes only lengths whose counter is not 0). */
#define ST_LENF       4096u
#define ST_LENF_SHIFT 12

/* ---- options ----------------------------------------------------------------------------------
 */

enum { ST_CROSS_QUERY = 0, ST_CROSS_SYNC = 1 };

typedef struct st_opts_s {
  uint64_t tau;         /* largest dead gap a placement may leave, bytes */
  uint64_t small_size;  /* requests up to this go to the small pool */
  int64_t max_mappings; /* cap on page mappings; LRU cached ranges are evicted above it */
  int64_t max_maps_per_page;
  uint64_t va_budget; /* cap on virtual bytes held by ranges; 0: 4 x device memory */
  uint64_t va_chunk;  /* virtual bytes per reservation; 0: 2 x device memory */
  int64_t cache_candidates;
  int64_t stale_misses; /* unmap a cached range after this many misses of its length (0: never) */
  int64_t chunk_pages;  /* pages one phys_create makes at most (0: all a miss needs) */
  int64_t chunk_min_pages; /* a miss that creates fewer makes a page a call */
  int cross_stream;        /* ST_CROSS_* */
} st_opts_t;

/* ---- streams ----------------------------------------------------------------------------------
 */

typedef struct st_stamp_s {
  uint32_t stream; /* stream index + 1; 0: none */
  uint64_t seq;    /* the stream's free count at the release */
} st_stamp_t;

typedef struct st_evrec_s {
  gmr_event_t ev;
  uint64_t seq; /* the event covers every stamp <= seq */
} st_evrec_t;

typedef struct st_small_index_s st_small_index_t; /* small.c */

typedef struct st_stream_s {
  gmr_stream_t s;
  uint64_t frees; /* stamps issued */
  uint64_t done;  /* stamps known complete: done <= frees */
  st_evrec_t *evs;
  uint32_t nev, capev;
  st_small_index_t *small; /* this stream's free small blocks (NULL until used) */
} st_stream_t;

/* ---- pages ---------------------------------------------------------------------------------- */

typedef struct st_range_s st_range_t;
typedef struct st_map_s st_map_t;

enum { ST_W_DEAD = 0, ST_W_FREE, ST_W_SUFFIX, ST_W_PREFIX, ST_W_CLOSED, ST_W_FULL };

typedef struct st_page_s {
  gmr_phys_t h;   /* its handle, or its chunk's (Note [Chunks], pages.c) */
  uint32_t chunk; /* index in the chunk table, or ST_NIL: a handle of its own */
  uint32_t coff;  /* in a chunk: its offset there, in pages */
  uint32_t tail_end, head_start;
  st_range_t *tail_owner, *head_owner, *full_owner;
  st_map_t *maps; /* this page's mapping records */
  uint32_t nmaps;
  uint8_t where; /* ST_W_*: the index the page is in */
  /* When the page is next wanted (worth.c): the terms of its worth, kept
   * while it is filed in heap `wheap` (A or B; B's pages also in M) under
   * filing number wgen; `wdirty`: on the dirty list (wnext), filed again at
   * the next miss. */
  uint64_t wa, wb;
  uint8_t wheap;
  bool wdirty;
  uint32_t wgen, wnext;
  uint32_t cls;        /* SUFFIX/PREFIX: the class (open bytes / G) */
  uint32_t prev, next; /* links in that index (page ids) */
  st_stamp_t stamp[ST_STAMPS];
} st_page_t;

/* Pages created by one phys_create of n x P bytes (Note [Chunks]). */
typedef struct st_chunk_s {
  gmr_phys_t h;
  uint32_t n;    /* pages; 0: an empty entry */
  uint32_t *ids; /* page id by offset */
} st_chunk_t;

/* A two-level bitmap over classes 0..n-1, each a list of page ids. */
typedef struct st_classes_s {
  uint32_t n;
  uint32_t *head; /* n list heads */
  uint64_t *l1;   /* bit c: class c non-empty */
  uint64_t *l0;   /* bit w: l1[w] non-zero */
  uint32_t n1, n0;
  uint32_t nonempty; /* classes non-empty: Σ popcount(l1[w]) */
} st_classes_t;

/* ---- ranges ---------------------------------------------------------------------------------- */

enum { ST_R_LIVE = 1, ST_R_CACHED, ST_R_PENDING, ST_R_SMALL, ST_R_BROKEN };

struct st_map_s { /* slot `slot` of range r -> page `page` */
  st_range_t *r;
  uint32_t slot, page;
  uint32_t run;          /* slots one phys_map call maps from this slot on; 0 inside a run */
  st_map_t *prev, *next; /* on the page's list */
};

typedef struct st_small_seg_s st_small_seg_t;

struct st_range_s {
  uintptr_t va;             /* slot 0's address, P-aligned; the block is at va + first_off */
  uint32_t nslots, nmapped; /* mapped slots; < nslots only when BROKEN */
  uint32_t first_off;       /* multiple of G, < P */
  uint64_t len;             /* bytes owned by the block (rounded) */
  uint64_t requested;
  uint8_t state;
  uint32_t sidx;       /* stream index of the allocation */
  st_stamp_t last_use; /* CACHED: the free's stamp */
  uint64_t tick;       /* the policy's tick when last handed out */
  uint64_t gap;        /* ticks between its last two hand-outs (0: handed out once) */
  uint64_t serial;     /* a number never reused: ranges of a length are made in serial order */
  uint8_t ends;        /* bit 0: slot 0 is a partial span; bit 1: the last slot is */
  uint32_t stale;      /* CACHED: misses of its length it could not serve in a row */
  uint32_t nwhole;     /* slots whose span is a whole page */
  bool parked;         /* CACHED: its whole pages stay owned by it (full_owner), see ranges.c */
  bool grows;     /* its length grows (Note [Resizing]): no other block's head on its last page */
  uint32_t *uses; /* record_stream: other stream indexes */
  uint32_t nuses, capuses;
  st_range_t *lru_prev, *lru_next; /* CACHED: LRU (most recent first) */
  st_range_t *len_prev, *len_next; /* every range of its length, by serial (st_len_t) */
  st_range_t *all_prev, *all_next; /* every range */
  st_small_seg_t *seg;             /* SMALL: its segment */
  uint32_t *pages;                 /* page id per slot */
  st_map_t *maps;                  /* mapping record per slot */
};

/* ---- small pool
 * ---------------------------------------------------------------------------------- */

typedef struct st_small_s st_small_t; /* a small block */
struct st_small_s {
  st_small_seg_t *seg;
  uint32_t off, size;
  uint64_t requested;
  bool allocated, pending;
  uint32_t *uses; /* record_stream: other stream indexes */
  uint32_t nuses, capuses;
  st_small_t *prev, *next;   /* address order in the segment */
  st_small_t *fprev, *fnext; /* free list of its class */
};

struct st_small_seg_s {
  st_range_t *r; /* the one-slot range that maps the page */
  st_small_t *first;
  uint32_t live; /* allocated blocks */
  uint64_t live_bytes;
  uint32_t sidx;
  st_stamp_t last_free;
  st_small_seg_t *e_prev, *e_next; /* empty segments (reclaimable) */
  bool on_empty;
};

struct st_small_index_s {
  st_classes_t cls;   /* class = size / G, capped at n-1 */
  st_small_t **heads; /* per class */
};

/* A freed block used on other streams (record_stream): it stays owned until
 * an event recorded on each of those streams at the free has completed. */
typedef struct st_pending_s st_pending_t;
struct st_pending_s {
  st_range_t *r; /* a large block, or */
  st_small_t *b; /* a small one */
  gmr_event_t *ev;
  uint32_t nev;
  bool recorded; /* the events exist (not while a use stream was capturing) */
  st_stamp_t stamp;
  st_pending_t *next;
};

/* ---- the policy
 * ---------------------------------------------------------------------------------- */

typedef struct st_va_s { /* a free interval of the arena */
  uintptr_t addr;
  uint64_t size;
  uint32_t res; /* reservation index */
} st_va_t;

typedef struct st_res_s {
  uintptr_t base;
  uint64_t size;
} st_res_t;

/* Per length: every range of that length (large ranges, and small
 * segments' one-page ranges under len = P), oldest first. */
typedef struct st_len_s {
  uint64_t len; /* 0: an empty slot */
  st_range_t *first, *last;
} st_len_t;

typedef struct st_stats_s {
  /* Per pool ([1] small, [2] large) whole; [0] ("all") keeps only its
   * current figure and peak as things happen, its accumulated counts are the
   * pools' sums (gmr__st_report_figures).  Active bytes are not counted apart:
   *   active[p] = allocated[p] + pend[p]
   * (a freed block stays active while a record_stream use is pending); its
   * peak is max(allocated[p].peak, active_peak[p]), active_peak[p] raised
   * by allocations made while something is pending (only then can active
   * peak above allocated). */
  gmr_stat_t allocated[3], requested[3], allocation[3], reserved[3], segment[3];
  int64_t pend[3];          /* bytes of PENDING blocks ([0]: both pools) */
  int64_t active_peak[3];   /* see above */
  int64_t pend_at_reset[3]; /* pend when the accumulated counts were reset:
                             * active freed = allocated freed - (pend - this) */
  gmr_stat_t mappings, dead_gap, va;
  int64_t ooms, retries; /* allocations and frees: the pools' allocation counts */
  int64_t hits, misses, stitches_partial, map_calls, unmap_calls, access_calls, pages_created,
      pages_released, pages_mapped, evictions, event_records, event_queries, syncs, small_reclaims,
      small_reuses, resizes;
  uint64_t map_ns;
} st_stats_t;

/* A stream's front slot (front.c): under concurrency, the last block freed
 * on the stream, kept for the stream's next allocation of its length.  64
 * bytes aligned, guarded by its own lock; `s` immutable once published. */
#define ST_FRONTS 64 /* the table of fronts (open addressing, at most half used) */
typedef struct st_front_s {
  _Alignas(64) gmr_spin_t lock;
  bool frozen; /* a whole-state op runs: keep and take nothing */
  gmr_stream_t s;
  st_small_t *b; /* the block kept: a small one, or */
  st_range_t *r; /* a large one (at most one of b and r) */
  /* Take-backs since the last drain, per pool ([1] small, [2] large): the
   * pairs, their bytes, the requested bytes handed out and those freed. */
  int64_t pairs[3], bytes[3], req_in[3], req_out[3];
  void *raw; /* what the host returned (the front is aligned in it) */
} st_front_t;

/* An entry of worth.c's heaps: a page filed under key (wa, wb or the tick
 * it moves at) by its filing number gen. */
typedef struct st_went_s {
  uint64_t key;
  uint32_t id, gen;
} st_went_t;

typedef struct stitch_s {
  gmr_policy_t base;
  gmr_lock_t lock; /* every op's (stitch.c): guards all below but o, P, small_max */
  st_opts_t o;
  gmr_recording_t *rec; /* the recording layer under the backend (NULL: none), for free_completed */
  uint64_t P;           /* page size (backend granularity) */
  uint64_t small_max;
  uint64_t device_total;
  /* Note [Graph capture] (stitch.c): in_pool, set at creation: a private
   * pool's instance; capturing: during one miss on a stream being captured.
   * Either: fresh pages only, nothing unmapped, no event recorded, queried
   * or waited on for a stamp (st_fresh). */
  bool in_pool, capturing;

  st_page_t *pages;
  uint32_t npages, cappages;
  uint32_t dead_head; /* recycled page ids */
  st_chunk_t *chunks; /* Note [Chunks] (pages.c) */
  uint32_t nchunks, capchunks;
  uint32_t nruns;                      /* runs of slots mapped: the device's page mappings */
  uint32_t live_pages;                 /* created and not released */
  uint32_t free_head[2], free_tail[2]; /* FREE pages: [0] unmapped, [1] mapped */
  uint32_t nfree;
  /* The FREE mapped pages by worth (worth.c): heaps A, B and M
   * (wheap[1..3], wn[k] entries, wlive[k] of them live, room for 2 capw),
   * the dirty list, and whether a miss is reading them (frozen). */
  st_went_t *wheap[4];
  uint32_t wn[4], wlive[4], capw;
  uint32_t wdirty_head;
  bool wfrozen;
  st_classes_t suffix, prefix; /* PARTIAL pages by open bytes / G */
  uint32_t nclosed, nfull;
  uint32_t nparked; /* whole pages parked under cached ranges (counted in nfull too) */
  uint64_t dead_bytes;
  uint64_t open_bytes; /* Σ open slot bytes of SUFFIX and PREFIX pages = Σ cls × G */

  st_stream_t *streams;
  uint32_t nstreams, capstreams, last_stream;

  st_res_t *res;
  uint32_t nres, capres;
  st_va_t *va;
  uint32_t nva, capva;
  uint64_t va_used;

  st_range_t *all;
  st_range_t *lru_head, *lru_tail;
  uint32_t ncached;
  uint32_t lenf[ST_LENF]; /* CACHED ranges per (len >> ST_LENF_SHIFT) mod ST_LENF */
  st_len_t *lens;         /* open addressing by len, at most half full */
  uint32_t nlens, caplens;
  st_pending_t *pend_head;
  uint32_t nmappings;

  st_small_seg_t *empty_head;
  uint32_t nsmall_segs;
  uint64_t small_free_bytes;
  st_small_t *small_recycle;
  st_small_t *deferred;   /* a small block freed whose gmr__st_small_free waits (stitch.c) */
  st_range_t *deferred_r; /* a large range freed whose parking waits (stitch.c) */

  uint64_t serials; /* ranges made so far */

  uint64_t tick; /* large blocks handed out so far */
  st_stats_t st;

  /* Under concurrency (stitch.c): set for good once a thread found `lock`
   * held; then each stream that allocates gets a front. */
  _Atomic bool contended;
  _Atomic(st_front_t *) fronts[ST_FRONTS];
  uint32_t nfronts;
} stitch_t;

/* stat index: 0 all, 1 small pool, 2 large pool (see st_stats_t). */
static inline void st_inc(gmr_stat_t *a, int pool, int64_t n) {
  gmr__stat_increase(&a[pool], n);
  a[0].current += n;
  if (a[0].current > a[0].peak) a[0].peak = a[0].current;
}
static inline void st_dec(gmr_stat_t *a, int pool, int64_t n) {
  gmr__stat_decrease(&a[pool], n);
  a[0].current -= n;
}
/* An allocation of len bytes (requested: size) in pool. */
static inline void st_count_alloc(st_stats_t *s, int pool, int64_t len, int64_t size) {
  st_inc(s->allocated, pool, len);
  st_inc(s->requested, pool, size);
  st_inc(s->allocation, pool, 1);
  if (GMR_UNLIKELY(s->pend[0] != 0)) { /* active may peak above allocated */
    for (int p = 0; p < 3; p += pool)
      if (s->allocated[p].current + s->pend[p] > s->active_peak[p])
        s->active_peak[p] = s->allocated[p].current + s->pend[p];
  }
}
static inline void st_count_free(st_stats_t *s, int pool, int64_t len, int64_t size) {
  st_dec(s->allocated, pool, len);
  st_dec(s->requested, pool, size);
  st_dec(s->allocation, pool, 1);
}

/* May this miss take only fresh pages, unmapping nothing (Note [Graph
 * capture])? */
static inline bool st_fresh(const stitch_t *t) {
  return t->in_pool || t->capturing;
}

/* ---- worth.c ----------------------------------------------------------------------------------
 */

void gmr__st_worth_init(stitch_t *t);
/* Room in the heaps for cap pages. */
int gmr__st_worth_reserve(stitch_t *t, uint32_t cap);
void gmr__st_worth_fini(stitch_t *t);
/* Page id became FREE or stopped being FREE, or its worth changed: it is
 * filed again at the next miss. */
void gmr__st_worth_touch(stitch_t *t, uint32_t id);
/* Page id is about to lose cached range r's mapping: touched if that
 * changes its worth. */
void gmr__st_worth_unmapped(stitch_t *t, uint32_t id, const st_range_t *r);
/* A miss's reading of the FREE mapped pages, first to last (see worth.c):
 * begin (room for about `want` pages; GMR_ENOMEM: nothing to read), next
 * until it returns false or enough are taken, then end.  Between begin and
 * end the order is the one at begin, whatever evictions change. */
typedef struct st_worth_iter_s {
  struct st_worth_cand_s *f; /* the frontier, a heap */
  uint32_t n, cap;
  uint64_t T; /* the tick at begin */
} st_worth_iter_t;
int gmr__st_worth_begin(stitch_t *t, st_worth_iter_t *it, uint32_t want);
bool gmr__st_worth_next(stitch_t *t, st_worth_iter_t *it, uint32_t *id);
void gmr__st_worth_end(stitch_t *t, st_worth_iter_t *it);
/* The invariants of worth.c, outside a miss (for the checker). */
bool gmr__st_worth_holds(const stitch_t *t);

/* ---- pages.c ----------------------------------------------------------------------------------
 */

int gmr__st_classes_init(st_classes_t *c, uint32_t n);
void gmr__st_classes_free(st_classes_t *c);
void gmr__st_classes_mark(st_classes_t *c, uint32_t k, bool nonempty);
/* The first non-empty class >= k, or ST_NIL. */
uint32_t gmr__st_classes_find(const st_classes_t *c, uint32_t k);
/* The last non-empty class <= k, or ST_NIL. */
uint32_t gmr__st_classes_find_last(const st_classes_t *c, uint32_t k);

int gmr__st_pages_init(stitch_t *t);
void gmr__st_pages_fini(stitch_t *t);
/* Make room for n more page ids (no device call). */
int gmr__st_pages_reserve(stitch_t *t, uint32_t n);
/* A new page id for handle h (after gmr__st_pages_reserve); FREE, unindexed. */
uint32_t gmr__st_page_new(stitch_t *t, gmr_phys_t h);
/* Release a FREE, unmapped page's handle and recycle its id (a page with a
 * handle of its own). */
int gmr__st_page_release(stitch_t *t, uint32_t id);
/* n new page ids (after gmr__st_pages_reserve(t, n)) behind handle h of
 * n x P bytes, FREE and unindexed, into ids[] by offset (Note [Chunks]). */
int gmr__st_chunk_new(stitch_t *t, gmr_phys_t h, uint32_t n, uint32_t *ids);
/* Release chunk c's handle and recycle its page ids, every one FREE and
 * unmapped. */
int gmr__st_chunk_release(stitch_t *t, uint32_t c);
/* Release every chunk whose pages are all FREE and unmapped. */
int gmr__st_chunks_trim(stitch_t *t);
/* Re-file a page in the index its fields imply; keeps dead_bytes and counts. */
void gmr__st_page_reindex(stitch_t *t, uint32_t id);
void gmr__st_page_unindex(stitch_t *t, uint32_t id);

/* Span of slot j of r: [*a, *b). */
static inline void st_span(const stitch_t *t, const st_range_t *r, uint32_t j, uint32_t *a,
                           uint32_t *b) {
  uint64_t end = (uint64_t)r->first_off + r->len - (uint64_t)(r->nslots - 1) * t->P;
  *a = j == 0 ? r->first_off : 0;
  *b = j == r->nslots - 1 ? (uint32_t)end : (uint32_t)t->P;
}
/* Is [a, b) of page id free and can stream sidx use it now (no device call
 * unless a cross-stream stamp needs an event)?  gap_ok: the dead gap the
 * span would leave is <= tau. */
bool gmr__st_span_usable(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, uint32_t sidx);
void gmr__st_span_take(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, st_range_t *owner);
void gmr__st_span_give(stitch_t *t, uint32_t id, uint32_t a, uint32_t b, st_stamp_t stamp);

/* Streams. */
int gmr__st_stream_index(stitch_t *t, gmr_stream_t s, uint32_t *out);
/* Has the stamp completed (from stream sidx's view: its own stamps always
 * have)?  May record or query an event; never blocks unless wait. */
bool gmr__st_stamp_ready(stitch_t *t, st_stamp_t st, uint32_t sidx, bool wait);
/* gmr__st_stamp_ready without waiting, inline for the common case of no stamp
 * or one of sidx's own. */
static inline bool st_stamp_ready_now(stitch_t *t, st_stamp_t st, uint32_t sidx) {
  return st.stream == 0 || st.stream - 1 == sidx || gmr__st_stamp_ready(t, st, sidx, false);
}
bool gmr__st_page_ready_slow(stitch_t *t, uint32_t id, uint32_t sidx);
/* May stream sidx use page id now?  Inline when every stamp is sidx's own
 * or none (one stream: always). */
static inline bool st_page_ready(stitch_t *t, uint32_t id, uint32_t sidx) {
  const st_page_t *p = &t->pages[id];
  uint32_t own = sidx + 1;
  if ((p->stamp[0].stream == 0 || p->stamp[0].stream == own) &&
      (p->stamp[1].stream == 0 || p->stamp[1].stream == own))
    return true;
  return gmr__st_page_ready_slow(t, id, sidx);
}
/* The stamp of a free on stream sidx: its free count, raised. */
static inline st_stamp_t st_stamp_new(stitch_t *t, uint32_t sidx) {
  return (st_stamp_t){sidx + 1, ++t->streams[sidx].frees};
}
/* gmr__st_stream_index, inline when s is the stream of the last call. */
static inline int st_stream_of(stitch_t *t, gmr_stream_t s, uint32_t *out) {
  if (GMR_LIKELY(t->last_stream < t->nstreams && t->streams[t->last_stream].s == s)) {
    *out = t->last_stream;
    return 0;
  }
  return gmr__st_stream_index(t, s, out);
}
void gmr__st_streams_fini(stitch_t *t);

/* ---- ranges.c ----------------------------------------------------------------------------------
 */

int gmr__st_va_take(stitch_t *t, uint64_t size, uintptr_t *out);
void gmr__st_va_give(stitch_t *t, uintptr_t addr, uint64_t size);
void gmr__st_va_fini(stitch_t *t);

st_range_t *gmr__st_range_alloc(uint32_t nslots);
/* Give r its serial and file it under its length (before it is mapped, so
 * that nothing can fail after the device calls). */
int gmr__st_range_link(stitch_t *t, st_range_t *r);
void gmr__st_range_destroy(stitch_t *t, st_range_t *r);
/* Map pages[0..n) at a fresh address range as one transaction: on failure
 * everything done is undone (no mapping record, no VA, pages untouched). */
int gmr__st_map_range(stitch_t *t, st_range_t *r);
/* Unmap the run of slots that starts at slot j (one call); an unmapped
 * slot has maps[j].r == NULL. */
int gmr__st_run_unmap(stitch_t *t, st_range_t *r, uint32_t j);
/* Unmap every mapped slot of a range, give back its VA and free it. */
int gmr__st_unmap_range(stitch_t *t, st_range_t *r);

/* The entry of len in the table of lengths, or NULL. */
static inline st_len_t *st_len_slot(const stitch_t *t, uint64_t len) {
  uint64_t h = (len / ST_G) * 0x9E3779B97F4A7C15ull;
  for (uint32_t i = (uint32_t)(h >> 32) & (t->caplens - 1);; i = (i + 1) & (t->caplens - 1))
    if (t->lens[i].len == len || t->lens[i].len == 0) return &t->lens[i];
}
static inline st_len_t *st_len_find(const stitch_t *t, uint64_t len) {
  if (t->caplens == 0) return NULL;
  st_len_t *e = st_len_slot(t, len);
  return e->len == len ? e : NULL;
}

/* Every range is filed under its length from gmr__st_range_link to
 * gmr__st_range_destroy, in serial order; a CACHED one is also on the LRU list
 * (most recent first). */
static inline void st_cache_put(stitch_t *t, st_range_t *r) {
  r->state = ST_R_CACHED;
  r->lru_prev = NULL;
  r->lru_next = t->lru_head;
  if (t->lru_head != NULL)
    t->lru_head->lru_prev = r;
  else
    t->lru_tail = r;
  t->lru_head = r;
  ++t->ncached;
  ++t->lenf[(r->len >> ST_LENF_SHIFT) & (ST_LENF - 1)];
}
static inline void st_cache_remove(stitch_t *t, st_range_t *r) {
  if (r->lru_prev != NULL)
    r->lru_prev->lru_next = r->lru_next;
  else
    t->lru_head = r->lru_next;
  if (r->lru_next != NULL)
    r->lru_next->lru_prev = r->lru_prev;
  else
    t->lru_tail = r->lru_prev;
  r->lru_prev = r->lru_next = NULL;
  --t->ncached;
  --t->lenf[(r->len >> ST_LENF_SHIFT) & (ST_LENF - 1)];
}
/* The oldest cached range of len that stream sidx can take now (its pages
 * free, or parked under cached ranges; stamps complete), or NULL. */
st_range_t *gmr__st_cache_lookup(stitch_t *t, uint64_t len, uint32_t sidx);
/* A miss of len: the cached range nearest in length (within ST_RESIZE) whose
 * last slot can end the block in the same page, usable by stream sidx with
 * its new length, filed again under len; NULL if none (ranges.c, Note
 * [Resizing]); *grows: a cached range shorter than len by at most ST_RESIZE
 * exists (the length grows). */
st_range_t *gmr__st_cache_resize(stitch_t *t, uint64_t len, uint32_t sidx, bool *grows);
/* A miss of len: cached ranges of that length that could not serve it
 * stale_misses times in a row are unmapped (the loop that used them has
 * moved on). */
void gmr__st_cache_miss(stitch_t *t, uint64_t len, uint32_t sidx);
/* Take a range gmr__st_cache_lookup found (or a new one) for its block: cached
 * ranges whose parked pages it maps are unparked first. */
void gmr__st_range_own(stitch_t *t, st_range_t *r);
void gmr__st_range_release(stitch_t *t, st_range_t *r, st_stamp_t stamp);
bool gmr__st_range_usable(stitch_t *t, const st_range_t *r, uint32_t sidx);
/* Give a parked range's whole pages back to the FREE lists (stamped with
 * its last free); every parked range. */
void gmr__st_unpark(stitch_t *t, st_range_t *r);
void gmr__st_unpark_all(stitch_t *t);
/* Up to n FREE pages usable by sidx into out[] (every cached range
 * unparked first if the unmapped ones do not suffice), those the cached
 * ranges will want last first; returns how many.  Pages at the per-page
 * mapping cap are taken after evicting cached ranges on them. */
uint32_t gmr__st_collect_free(stitch_t *t, uint32_t n, uint32_t sidx, uint32_t *out);
/* Evict LRU cached ranges whose last use completed until the caps hold
 * (need_maps more mappings and need_va more bytes fit); all: every one. */
int gmr__st_evict(stitch_t *t, uint32_t need_maps, uint64_t need_va, bool all);
/* Evict cached ranges that map page id (to respect max_maps_per_page). */
bool gmr__st_evict_page(stitch_t *t, uint32_t id);
void gmr__st_ranges_fini(stitch_t *t);

/* ---- small.c ----------------------------------------------------------------------------------
 */

int gmr__st_small_alloc(stitch_t *t, uint32_t size, uint64_t requested, uint32_t sidx,
                        st_small_t **out);
void gmr__st_small_free(stitch_t *t, st_small_t *b);
/* A small block's class in its stream's index: size / G, capped at n - 1. */
static inline uint32_t st_small_class(const st_small_index_t *x, uint32_t size) {
  uint32_t c = size / ST_G;
  return c < x->cls.n ? c : x->cls.n - 1;
}
/* May the free of allocated block b wait for the next op, which takes it
 * back if it allocates b->size bytes on b's stream?  The conditions are
 * small.c's Note [Small take-back]: every class in [class(b), class(n)) empty,
 * i.e. the first non-empty class from class(b) is n's (with one non-empty
 * class, it is). */
static inline bool st_small_deferrable(const stitch_t *t, const st_small_t *b) {
  const st_small_t *p = b->prev, *n = b->next;
  if (p != NULL && !p->allocated) return false;
  if (n == NULL || n->allocated) return true;
  const st_small_index_t *x = t->streams[b->seg->sidx].small;
  uint32_t cn = st_small_class(x, n->size);
  return st_small_class(x, b->size + n->size) == cn && x->heads[cn] == n &&
         (x->cls.nonempty == 1 || gmr__st_classes_find(&x->cls, st_small_class(x, b->size)) == cn);
}
/* The take-back: what the free and that allocation change for good (the
 * segment's stamp, when it would have emptied). */
static inline void st_small_take_back(stitch_t *t, st_small_t *b, uint64_t requested) {
  st_small_seg_t *g = b->seg;
  if (g->live == 1) g->last_free = st_stamp_new(t, g->sidx);
  b->requested = requested;
}
/* Return empty small segments whose last free completed to the cache (their
 * one-page range stays mapped, its page parked under it, so the next
 * segment or a 2 MiB block reuses it with no device call); wait:
 * synchronise when not complete. */
int gmr__st_small_reclaim(stitch_t *t, bool wait);
void gmr__st_small_fini(stitch_t *t);
static inline uintptr_t st_small_ptr(const st_small_t *b) {
  return b->seg->r->va + b->off;
}
/* Small block b, or else large range r, as the runtime knows it (its user
 * allocated it on stream s). */
static inline gmr_block_t st_block_of(st_small_t *b, st_range_t *r, gmr_stream_t s) {
  if (b != NULL)
    return (gmr_block_t){.ptr = (void *)st_small_ptr(b),
                         .size = b->size,
                         .requested = b->requested,
                         .stream = s,
                         .handle = b};
  return (gmr_block_t){.ptr = (void *)(r->va + r->first_off),
                       .size = r->len,
                       .requested = r->requested,
                       .stream = s,
                       .handle = r};
}

/* ---- front.c ----------------------------------------------------------------------------------
 */

/* The front of stream s, or NULL (no lock: fronts are published once). */
st_front_t *gmr__st_front_find(stitch_t *t, gmr_stream_t s);
/* Give stream s a front (under lock; nothing when the table is half full
 * or the host refuses: the stream stays on the locked path). */
void gmr__st_front_new(stitch_t *t, gmr_stream_t s);
/* Keep the block of b or r, freed by its user, in f: false when f is
 * frozen; else the block kept before, if any, in *old_b or *old_r, for the
 * caller to free under lock. */
bool gmr__st_front_keep(st_front_t *f, st_small_t *b, st_range_t *r, st_small_t **old_b,
                        st_range_t **old_r);
/* An allocation of size bytes on f's stream served by the block kept, when
 * it has size's length in size's pool: true, *out written. */
bool gmr__st_front_take(st_front_t *f, uint64_t small_max, size_t size, gmr_block_t *out);
/* Under lock: empty every front into kb[] / kr[] (ST_FRONTS entries each,
 * NULL where none), fold their take-backs into t->st, and, when freeze,
 * leave them frozen until gmr__st_fronts_thaw. */
void gmr__st_fronts_drain(stitch_t *t, bool freeze, st_small_t **kb, st_range_t **kr);
void gmr__st_fronts_thaw(stitch_t *t);
void gmr__st_fronts_fini(stitch_t *t);

/* ---- report.c ----------------------------------------------------------------------------------
 */

/* The statistics as PyTorch names them: [0]'s accumulated counts summed
 * from the pools, active bytes from allocated and pending (st_stats_t). */
typedef struct st_figures_s {
  gmr_stat_t allocated[3], requested[3], active[3], allocation[3], segment[3];
} st_figures_t;
void gmr__st_report_figures(const stitch_t *t, st_figures_t *f);
/* The statistics ops, run quiesced (policy.h, rule 5). */
void gmr__st_stats(gmr_policy_t *self, gmr_stats_t *out);
void gmr__st_reset_peak(gmr_policy_t *self);
void gmr__st_reset_accumulated(gmr_policy_t *self);
int gmr__st_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud);
int gmr__st_summary(gmr_policy_t *self, FILE *out);
int gmr__st_report_oom(stitch_t *t, uint64_t size, gmr_stream_t s, const char *why);
void gmr__st_report_free_bytes(stitch_t *t, uint64_t *free_bytes, uint64_t *largest);
/* The largest open slot of a partial page, in bytes (0: none). */
uint64_t gmr__st_largest_open(const stitch_t *t);

/* ---- check.c -----------------------------------------------------------------------------------
 */

/* Run quiesced: every range in address order, each followed by its
 * blocks; every invariant (check.c's list), GMR_EINVAL and why on failure. */
int gmr__st_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud);
int gmr__st_check(gmr_policy_t *self);

/* ---- options.c ---------------------------------------------------------------------------------
 */

extern const st_opts_t gmr__st_opts_default;
extern const gmr_opt_desc_t gmr__st_opts_desc[];
int gmr__st_validate(void *opts, char *err, size_t errlen);

#endif /* GMR_STITCH_INTERNAL_H */
