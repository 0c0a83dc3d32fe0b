/* sim-internal.h: what the simulator's three files share (private to them).
 *
 * sim.c holds the ops and the test controls, sim-space.c the first-fit
 * address space (it knows only sim_space_t, so it can be tested alone), and
 * sim-host.c the host memory behind a host-backed device (the arena, the
 * memfd pool).  The state of one simulated device is gmr_sim_t below; see
 * Note [Simulator invariants] and Note [Simulator locking].
 */
#ifndef GMR_SIM_INTERNAL_H
#define GMR_SIM_INTERNAL_H

#include "backend/backend.h"
#include "core/avl.h"
#include "core/internal.h"
#include "core/lock.h"

#define SIM_SPACE_BASE          ((uintptr_t)0x7f0000000000ull) /* looks like a CUDA address */
#define SIM_SPACE_MIN           ((uintptr_t)1 << 46)           /* 64 TiB of fake addresses */
#define SIM_SPACE_PER_BYTE      64                             /* addresses per byte of capacity */
#define SIM_MAX_CAPACITY        ((uint64_t)1 << 52)            /* 4 PiB */
#define SIM_DEFAULT_GRANULARITY ((uint64_t)2 << 20)
#define SIM_RESERVE_ALIGN       512                  /* cudaMalloc's minimum */
#define SIM_DEVICE_STRIDE       ((uintptr_t)1 << 58) /* fake addresses per device ordinal */
#define SIM_MAX_DEVICES         31                   /* ordinals 0..30 */
#define SIM_ARENA_PER_BYTE      16                   /* arena bytes per byte of capacity */
#define SIM_ARENA_SLACK         ((size_t)64 << 20)
#define SIM_ARENA_MAX           ((size_t)64 << 30)
#define SIM_SEG_CAP             16 /* ranges per chunk (Note [First-fit index]) */
#define SIM_SEG_GROUP           8  /* chunks per group of the first-fit index */
#define SIM_SEG_SUPER           64 /* groups per super-group of the first-fit index */

/* A range taken from the space [addr, addr+size), and the free gap after it
 * [addr+size, addr+size+gap): an address-only live reservation of req bytes
 * (size: req rounded up to SIM_RESERVE_ALIGN, 512 for 0: no range is
 * empty), aux its serial (reserve_calls mod 2^32), or another range (a
 * virtual range, an arena block: req = SIM_SEG_OTHER). */
typedef struct sim_seg_s {
  uintptr_t addr;
  size_t size;
  size_t gap;
  size_t req;
  uint32_t aux;
} sim_seg_t;
#define SIM_SEG_OTHER SIZE_MAX

typedef struct sim_chunk_s {
  size_t n; /* ranges in e */
  sim_seg_t e[SIM_SEG_CAP];
} sim_chunk_t;

/* The space [lo, hi): the free gap at its start, and the ranges taken from
 * it, in address order, in chunks (Note [First-fit index]). */
typedef struct sim_space_s {
  uintptr_t lo, hi;
  size_t head_gap;
  sim_chunk_t **chunks, *chunk_spare;
  size_t n_chunks, cap_chunks;
  size_t *chunk_max; /* a bound on each chunk's largest gap */
  /* chunks and chunk_max start `first` places into the arrays allocated
   * (chunks_mem, max_mem: cap_chunks and cap_max places), so that the
   * first chunk goes in O(1); groups are over those places. */
  sim_chunk_t **chunks_mem;
  size_t *max_mem;
  size_t first;
  size_t *group_max; /* a bound on the chunk_max of each SIM_SEG_GROUP chunks */
  size_t *super_max; /* a bound on the group_max of each SIM_SEG_SUPER groups */
  size_t cap_max, cap_groups, cap_supers;
} sim_space_t;

typedef enum { SIM_RESERVED = 1, SIM_VA = 2, SIM_MAPPED = 3, SIM_ALIAS = 4 } sim_kind_t;

/* Live ranges: AVL trees (key: address, val: size), so each check costs
 * O(log n) however many ranges are live: one of reserved ranges when
 * host-backed (aux: the reserve's serial, reserve_calls mod 2^32; in
 * address-only mode a reservation is a range of the space's table, found as
 * fast), one of virtual ranges, and one
 * of mappings (SIM_MAPPED and SIM_ALIAS never overlap each other; aux =
 * kind | SIM_ACCESS once set_access covered it | h << SIM_PAGE_SHIFT for a
 * page mapping of page h < SIM_PAGES_TRACKED, 0 above). */
#define SIM_KIND(aux)     ((aux)&0xffu)
#define SIM_ACCESS        0x100u
#define SIM_PAGE_SHIFT    9
#define SIM_PAGES_TRACKED ((gmr_phys_t)1 << (32 - SIM_PAGE_SHIFT))
#define SIM_POOL_PAGES    256 /* released pages kept for reuse (page reuse) */

/* A page slot: free (size 0, not dying), live (size > 0), or dying: released
 * while still mapped, kept until its last mapping goes so that no new page
 * takes its handle meanwhile.  With page reuse, nmaps counts the page's
 * mappings (handles below SIM_PAGES_TRACKED; pages above, and all pages
 * without page reuse, are never pooled nor kept dying). */
typedef struct sim_page_s {
  size_t size; /* 0: the slot is free or dying */
  int fd;      /* host-backed: the memfd behind the page; -1 otherwise */
  uint32_t nmaps;
  bool dying;
} sim_page_t;

typedef struct sim_pooled_s {
  size_t size;
  int fd;
} sim_pooled_t;

typedef struct sim_stream_s {
  uintptr_t id;
  bool capturing;
  uint64_t enqueued;  /* units of work queued so far */
  uint64_t completed; /* units of work completed so far (<= enqueued) */
} sim_stream_t;

/* A unit of queued work that uses [addr, addr + size): pending while the
 * stream's completed < seq. */
typedef struct sim_use_s {
  uintptr_t stream;
  uint64_t seq;
  uintptr_t addr;
  size_t size;
} sim_use_t;

typedef struct sim_event_s {
  uintptr_t stream;
  uint64_t seq; /* complete when the stream's completed >= seq */
} sim_event_t;

struct gmr_sim_s {
  gmr_backend_t base; /* must be first */
  gmr_lock_t lock;
  uint64_t capacity; /* bytes */
  bool host_backed;
  uint64_t bytes_in_use; /* physical bytes reserved or mapped */
  /* Host-backed with page reuse: the arena (0: not mapped yet, or refused). */
  bool host_reuse, arena_tried;
  uintptr_t arena;
  size_t arena_size;
  /* With page reuse: memfds of released pages that no mapping holds. */
  sim_pooled_t pool[SIM_POOL_PAGES];
  size_t n_pool;
  /* The fake address space (address-only mode) or the arena (host-backed
   * with page reuse); see Note [First-fit index]. */
  sim_space_t space;
  /* Live ranges, to validate release/unmap, map and set_access. */
  gmr_avl_t reserved, virt, mappings;
  /* Physical pages: handle = index + 1; every slot below page_low is live
   * or dying, so a new page takes the lowest free slot at or above it. */
  sim_page_t *pages;
  size_t n_pages, cap_pages, page_low;
  /* Streams. */
  sim_stream_t *streams;
  size_t n_streams, cap_streams;
  /* Queued work that uses address ranges (pending ones only). */
  sim_use_t *uses;
  size_t n_uses, cap_uses;
  /* Fault schedule. */
  uint64_t fail_countdown; /* 0: off; 1: the next reserve/map fails */
  bool fail_sticky;        /* when the countdown fires, fail every call from then on */
  uint64_t fail_above;     /* 0: off */
  uintptr_t place_next;    /* address-only: the next reserve's address if free; 0: none */
  bool fail_all;
  /* Clock. */
  bool clock_fixed;
  uint64_t clock_ns;
  gmr_sim_counters_t counters;
  gmr_sim_call_bytes_t call_bytes; /* bytes asked of each call kind (gmr_sim_call_bytes) */
};

/* Note [Simulator invariants]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~
 *   bytes_in_use = Σ live reserve sizes + Σ live mapped sizes
 *                  + Σ live page sizes <= capacity <= 4 PiB
 *   every page mapping lies inside one virtual range and overlaps no other
 *   mapping; set_access covers only page mappings.
 *   the space (fake addresses, or the arena) obeys Note [First-fit index];
 *   its ranges are the address-only live reservations and the virtual
 *   ranges and arena blocks taken from it.
 *   host-backed, a live reservation is a heap block, or lies in the arena.
 *   device d's window: [SIM_SPACE_BASE + d*S, SIM_SPACE_BASE + d*S + space)
 *   with S = SIM_DEVICE_STRIDE = 2^58 and space <= S, so windows of distinct
 *   ordinals never overlap; d < SIM_MAX_DEVICES = 31, so every address is
 *   below SIM_SPACE_BASE + 31*2^58 < 2^63 (no wrap, positive as intptr_t).
 *
 * Note [Simulator locking]
 * ~~~~~~~~~~~~~~~~~~~~~~~~
 * One lock (gmr_lock_t, core/lock.h) guards everything in gmr_sim_t.  Every
 * function of this header that takes a gmr_sim_t or a sim_space_t is
 * called with it held.
 */

static inline gmr_sim_t *sim_of(gmr_backend_t *be) {
  return (gmr_sim_t *)be;
}

/* Grow *arr (of *cap elements of `elem` bytes) to hold `need`, doubling;
 * false when out of host memory (nothing changed). */
static inline bool gmr__sim_grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap * 2 : 16;
  while (c < need)
    c *= 2;
  void *n = gmr__realloc(*arr, c * elem);
  if (n == NULL) return false;
  *arr = n;
  *cap = c;
  return true;
}

/* ---- the address space (sim-space.c; Note [First-fit index]) ------------- */

static inline sim_seg_t *gmr__sim_seg_at(const sim_space_t *sp, size_t c, size_t i) {
  return &sp->chunks[c]->e[i];
}
/* First fit: `size` bytes at `align` (a range recorded with `rec`'s req and
 * aux, or SIM_SEG_OTHER when NULL): 0 (*out) or GMR_ENOMEM. */
int gmr__sim_space_take(sim_space_t *sp, size_t size, size_t align, const sim_seg_t *rec,
                        uintptr_t *out);
/* Exactly [a, a+size) when it is free (placement hints): 0 or GMR_ENOMEM. */
int gmr__sim_space_take_at(sim_space_t *sp, uintptr_t a, size_t size, const sim_seg_t *rec);
/* Give back a range taken with no record; one never taken is ignored. */
void gmr__sim_space_give(sim_space_t *sp, uintptr_t a, size_t size);
/* The range with the greatest start <= a (chunk *pc, index *pi): false when none. */
bool gmr__sim_seg_floor(const sim_space_t *sp, uintptr_t a, size_t *pc, size_t *pi);
/* The reservation (a, size) recorded as a range, or NULL. */
sim_seg_t *gmr__sim_seg_reserved(sim_space_t *sp, uintptr_t a, size_t size, size_t *pc, size_t *pi);
/* Remove range i of chunk c: it and its gap join the gap before it. */
void gmr__sim_seg_remove(sim_space_t *sp, size_t c, size_t i);
/* Free the space's tables (the ranges are forgotten). */
void gmr__sim_space_clear(sim_space_t *sp);

/* ---- host memory (sim-host.c; Note [Host-backed mode], Note [Page reuse]) */

static inline bool gmr__sim_in_arena(const gmr_sim_t *sim, uintptr_t a) {
  return sim->arena != 0 && a - sim->arena < sim->arena_size;
}
/* Host memory for a reservation of `size` bytes; NULL when refused. */
void *gmr__sim_host_take(gmr_sim_t *sim, size_t size);
void gmr__sim_host_give(gmr_sim_t *sim, void *p, size_t size);
/* Host addresses for a virtual range of `size` bytes: in the arena (page
 * reuse) or a PROT_NONE mapping of their own; 0 (*out) or GMR_ENOMEM. */
int gmr__sim_host_va_take(gmr_sim_t *sim, size_t size, uintptr_t *out);
/* A virtual range's addresses back where they came from: the space (or the
 * arena), else, host-backed, the host. */
void gmr__sim_va_give(gmr_sim_t *sim, uintptr_t a, size_t size);
/* A memfd of `size` bytes for a page (pooled or new); -1 when refused. */
int gmr__sim_page_fd_take(gmr_sim_t *sim, size_t size);
/* A released page's memfd: pooled, or closed. */
void gmr__sim_page_fd_give(gmr_sim_t *sim, sim_page_t *pg, bool tracked);

#endif
