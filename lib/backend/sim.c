/* sim.c: the simulated device, a first-class backend.
 *
 * Two modes:
 *  - address-only (default): addresses come from a fake address space of
 *    max(64 TiB, 64 x capacity) with no memory behind them, so an 80 GB
 *    training trace replays on a small machine, and virtual reservations of
 *    the whole capacity (expandable segments, one per stream) always fit.
 *    Only `capacity` limits what can be reserved; it is at most 4 PiB, so
 *    every address stays below 2^59.
 *    Each device ordinal d has its own window of the fake space, so two
 *    simulated devices in one process never hand out the same address (as
 *    CUDA's unified addressing guarantees): window d starts at
 *    SIM_SPACE_BASE + d x SIM_DEVICE_STRIDE; device 0's addresses are those
 *    of a single simulated device.
 *  - host-backed: every reservation is real host memory (posix_memalign, so
 *    AddressSanitizer sees each range separately), and virtual ranges are
 *    PROT_NONE mappings whose pages map() makes readable and writable, so
 *    tests can write patterns into blocks and verify them.
 *    Page reuse (gmr__sim_host_reuse, for fuzzers and soaks that make
 *    millions of reservations): reservations and virtual ranges are carved,
 *    first fit, from one readable, writable arena of 16 x capacity + 64 MiB
 *    (at most 64 GiB; MAP_NORESERVE).  The pages a range touched stay
 *    behind for the next range there: no page fault, no zeroing and no
 *    system call per reserve, release, map or unmap (a range's bytes are
 *    whatever was there, as with cudaMalloc and cuMemMap); page mappings
 *    still map their memfd, and a released page no mapping holds keeps its
 *    memfd for the next page of its size (SIM_POOL_PAGES of them).  Memory
 *    given back then stays readable: the caller checks its accesses with
 *    gmr__sim_covers instead, which also tells one reservation from a later
 *    one at the same address.  Reservations cost no AddressSanitizer shadow
 *    fill then (a heap block of hundreds of MiB costs size/8 bytes of it at
 *    each allocation, free and recycling); under AddressSanitizer the bytes
 *    between a reservation's end and its last page's end are poisoned.  What
 *    the arena cannot hold is reserved as without page reuse.
 *
 * Physical pages (phys_create) are handles that may be mapped at several
 * virtual addresses at once; in host-backed mode each is a memfd, mapped
 * MAP_SHARED at every address, so bytes written through one mapping read back
 * through the others, as on a GPU.  A mapping is inaccessible until
 * set_access covers it.
 *
 * Test controls: a fault schedule (fail the k-th device call that can run
 * out of memory or address space, or every call from the k-th on, fail above
 * N bytes, fail all), streams
 * marked as being captured into a CUDA graph, streams whose work completes only when a test says
 * so, work that uses an address range (gmr__sim_stream_use), an injectable clock, spy counters,
 * and a placement hint (the next reserve at a given address, so a replay can reproduce a recorded
 * device's placement).
 *
 * Queued work and unmapping: on a GPU, cuMemUnmap and cuMemMap are not ordered with a stream's
 * work, so unmapping (or remapping) an address that a queued kernel still uses lets that kernel
 * fault or read another page.  The simulator keeps each unit of work queued with
 * gmr__sim_stream_use as (stream, seq, range) until the stream completes it, and counts every
 * unmap, page unmap or virtual release that touches such a range (counters.unsafe_unmaps);
 * a correct policy keeps that count at 0.
 *
 * Invariants:
 *   bytes_in_use = Σ live reserve sizes + Σ live mapped sizes
 *                  + Σ live page sizes <= capacity <= 4 PiB
 *   every page mapping lies inside one virtual range and overlaps no other
 *   mapping; set_access covers only page mappings.
 *   the space (fake addresses, or the arena) [space_lo, space_hi) is the
 *   head gap and the ranges taken from it, each followed by its gap:
 *   r_0 < r_1 < ... (in chunk order, then in each chunk) with
 *   space_lo + head_gap = r_0.addr, r_j.addr + r_j.size + r_j.gap =
 *   r_{j+1}.addr, and the last one's = space_hi (no range: head_gap =
 *   space_hi - space_lo); r_j.size > 0, so the free ranges (the non-empty
 *   gaps) are disjoint and never adjacent.  The ranges are the
 *   address-only live reservations and the virtual ranges and arena
 *   blocks taken from the space.  Chunks: 1 <= k.n <= SIM_SEG_CAP, and the
 *   bounds chunk_max, group_max and super_max of the address space's
 *   section.
 *   host-backed, a live reservation is a heap block, or lies in the arena.
 *   device d's window: [SIM_SPACE_BASE + d*S, SIM_SPACE_BASE + d*S + space)
 *   with S = SIM_DEVICE_STRIDE = 2^58 and space <= S, so windows of distinct
 *   ordinals never overlap; d < SIM_MAX_DEVICES = 31, so every address is
 *   below SIM_SPACE_BASE + 31*2^58 < 2^63 (no wrap, positive as intptr_t).
 * Synchronization: one lock (gmr_lock_t, core/lock.h) guards everything in
 * gmr_sim_t.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/avl.h"
#include "core/internal.h"
#include "core/lock.h"

#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/asan_interface.h>
#define SIM_POISON(p, n)   __asan_poison_memory_region((p), (n))
#define SIM_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define SIM_POISON(p, n)   ((void)(p), (void)(n))
#define SIM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define SIM_SPACE_BASE          ((uintptr_t)0x7f0000000000ull) /* looks like a CUDA address */
#define SIM_SPACE_MIN           ((uintptr_t)1 << 46)           /* 64 TiB of fake addresses */
#define SIM_SPACE_PER_BYTE      64                             /* addresses per byte of capacity */
#define SIM_MAX_CAPACITY        ((uint64_t)1 << 52)            /* 4 PiB */
#define SIM_DEFAULT_CAPACITY    GMR_SIM_DEFAULT_CAPACITY
#define SIM_DEFAULT_GRANULARITY ((uint64_t)2 << 20)
#define SIM_RESERVE_ALIGN       512                  /* cudaMalloc's minimum */
#define SIM_DEVICE_STRIDE       ((uintptr_t)1 << 58) /* fake addresses per device ordinal */
#define SIM_MAX_DEVICES         31                   /* ordinals 0..30 */
#define SIM_ARENA_PER_BYTE      16                   /* arena bytes per byte of capacity */
#define SIM_ARENA_SLACK         ((size_t)64 << 20)
#define SIM_ARENA_MAX           ((size_t)64 << 30)
#define SIM_SEG_CAP             16 /* ranges per chunk (see the address space's section) */
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
   * with page reuse): [space_lo, space_hi), the free gap at its start, and
   * the ranges taken from it, in address order, in chunks (see the address
   * space's section). */
  uintptr_t space_lo, space_hi;
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
};

static inline gmr_sim_t *sim_of(gmr_backend_t *be) {
  return (gmr_sim_t *)be;
}

static bool use_pending(gmr_sim_t *sim, uintptr_t a, size_t size);

/* ---- growable arrays and the live-range trees ---------------------------- */

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
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

static int live_missing(sim_kind_t kind, uintptr_t a, size_t size);

static gmr_avl_t *live_tree(gmr_sim_t *sim, sim_kind_t kind) {
  return kind == SIM_RESERVED ? &sim->reserved : kind == SIM_VA ? &sim->virt : &sim->mappings;
}

static int live_add(gmr_sim_t *sim, uintptr_t a, size_t size, sim_kind_t kind, gmr_phys_t page) {
  uint32_t aux = kind == SIM_RESERVED ? (uint32_t)sim->counters.reserve_calls
                 : sim->host_reuse && page != 0 && page < SIM_PAGES_TRACKED
                     ? (uint32_t)kind | (uint32_t)page << SIM_PAGE_SHIFT
                     : (uint32_t)kind;
  int err = gmr__avl_insert(live_tree(sim, kind), a, size, aux);
  if (err == GMR_ENOMEM)
    return gmr__error_set(GMR_ENOMEM, "simulated device: out of host memory for its range table");
  if (err != 0) /* the device handed out one address twice: a simulator bug */
    return gmr__error_set(GMR_EDEVICE, "simulated device: %p is already live", (void *)a);
  return 0;
}

/* Remove exactly (a, size, kind); GMR_EINVAL when no such live range. */
static int live_remove(gmr_sim_t *sim, uintptr_t a, size_t size, sim_kind_t kind) {
  gmr_avl_t *t = live_tree(sim, kind);
  gmr_avl_node_t *n = gmr__avl_find(t, a);
  if (n != NULL && (kind == SIM_RESERVED || SIM_KIND(n->aux) == (uint32_t)kind) && n->val == size) {
    gmr__avl_erase(t, a);
    return 0;
  }
  return live_missing(kind, a, size);
}

/* GMR_EINVAL: no live range (a, size) of that kind to give back. */
static int live_missing(sim_kind_t kind, uintptr_t a, size_t size) {
  return gmr__error_set(GMR_EINVAL, "simulated device: no %s range of %zu bytes at %p to give back",
                        kind == SIM_RESERVED ? "reserved"
                        : kind == SIM_VA     ? "virtual"
                        : kind == SIM_ALIAS  ? "page-mapped"
                                             : "mapped",
                        size, (void *)a);
}

/* Does the virtual range starting last at or before `a` wholly contain
 * [a, a+size)?  (Virtual ranges never overlap.) */
static bool va_contains(gmr_sim_t *sim, uintptr_t a, size_t size) {
  gmr_avl_node_t *r = gmr__avl_floor(&sim->virt, a);
  return r != NULL && size <= r->val && a - r->key <= r->val - size;
}

/* Is any page of [a, a+size) already mapped?  Mappings never overlap each
 * other, so only the last mapping starting inside or before the range can
 * reach into it. */
static bool mapped_overlaps(gmr_sim_t *sim, uintptr_t a, size_t size) {
  if (size == 0) return false;
  uintptr_t last = a + size - 1 < a ? UINTPTR_MAX : a + size - 1;
  gmr_avl_node_t *r = gmr__avl_floor(&sim->mappings, last);
  return r != NULL && r->key + r->val > a;
}

/* ---- the fake address space (first fit over the gaps between ranges) ---- */

/* The ranges taken from the space (address-only reservations, virtual
 * ranges, arena blocks), in address order, each with the free gap that
 * follows it up to the next range (or the space's end); the gap before
 * the first range is head_gap.  The free ranges are exactly the non-empty
 * gaps, so a release merges with both neighbours by giving its range and
 * its gap to the gap before it, and a take inserts one range into a gap.
 * The ranges are sorted runs of at most SIM_SEG_CAP (chunks); each chunk
 * has a bound on its largest gap (chunk_max), and each group of G =
 * SIM_SEG_GROUP chunks a bound on theirs (group_max), and each S =
 * SIM_SEG_SUPER groups a bound on theirs (super_max):
 *   chunk_max[c] >= max { e.gap : e in chunks[c] }
 *   group_max[g] >= max { chunk_max[c] : g·G <= c < (g+1)·G }
 *   super_max[s] >= max { group_max[g] : s·S <= g < (s+1)·S }
 * A gap that grows raises them; one that shrinks leaves them (still
 * bounds).  First fit skips a super-group, a group, then a chunk, whose
 * bound is below the request, scans the chunks it cannot skip, and makes
 * the bounds of a chunk (group, super-group) it went through without a fit
 * exact.  Groups count places in the arrays, from before the first chunk
 * (`first` places in: chunk c is at place first + c), so the first chunk
 * goes without moving the others; chunks that come or go elsewhere move the
 * groups' members: see groups_moved.  A change moves
 * at most a chunk's worth of ranges (a chunk that fills is split in
 * halves; one that empties is dropped; two neighbours that fit in half a
 * chunk are joined).  Finding an address is a binary search over the
 * chunks' first ranges, then over one chunk. */
static inline sim_seg_t *seg_at(gmr_sim_t *sim, size_t c, size_t i) {
  return &sim->chunks[c]->e[i];
}

/* After chunk c came or went (those after it moved by one place): the
 * bounds of the groups from c's on.  c's group is computed again; a later
 * group lost a chunk at one end and gained the chunk now at the other (or
 * is new: 0), so raising its bound (and its super-group's) by the chunks
 * at both ends keeps them bounds: O(1) a group. */
static void groups_moved(gmr_sim_t *sim, size_t c) {
  const size_t f = sim->first, end = f + sim->n_chunks, G = SIM_SEG_GROUP;
  const size_t *mx = sim->max_mem; /* by place */
  for (size_t g = (f + c) / G; g * G < end; ++g) {
    size_t lo = g * G > f ? g * G : f, hi = (g + 1) * G < end ? (g + 1) * G - 1 : end - 1, m = 0;
    if (g == (f + c) / G) {
      for (size_t j = lo; j <= hi; ++j)
        if (mx[j] > m) m = mx[j];
    } else {
      m = sim->group_max[g];
      if (mx[lo] > m) m = mx[lo];
      if (mx[hi] > m) m = mx[hi];
    }
    sim->group_max[g] = m;
    if (m > sim->super_max[g / SIM_SEG_SUPER]) sim->super_max[g / SIM_SEG_SUPER] = m;
  }
}

/* A gap of chunk c grew to (or appeared with) `size` bytes. */
static void seg_grew(gmr_sim_t *sim, size_t c, size_t size) {
  if (size <= sim->chunk_max[c]) return;
  sim->chunk_max[c] = size;
  size_t g = (sim->first + c) / SIM_SEG_GROUP;
  if (size > sim->group_max[g]) sim->group_max[g] = size;
  if (size > sim->super_max[g / SIM_SEG_SUPER]) sim->super_max[g / SIM_SEG_SUPER] = size;
}

/* Every group's and super-group's bound computed again from the chunks'
 * (after the chunks moved to other places). */
static void groups_rebuild(gmr_sim_t *sim) {
  const size_t f = sim->first, end = f + sim->n_chunks, G = SIM_SEG_GROUP, S = SIM_SEG_SUPER;
  for (size_t g = 0; g * G < end; ++g) {
    size_t m = 0;
    for (size_t j = g * G > f ? g * G : f; j < (g + 1) * G && j < end; ++j)
      if (sim->max_mem[j] > m) m = sim->max_mem[j];
    sim->group_max[g] = m;
    if (g % S == 0 || m > sim->super_max[g / S]) sim->super_max[g / S] = m;
  }
}

/* Make room for chunk index c (an empty chunk there); false when out of
 * host memory (nothing changed).  At the arrays' end, the chunks move back
 * to place 0, into arrays that leave at least half of them free (so a move
 * of n chunks comes after n / 2 others came or went at the front). */
static bool chunk_add(gmr_sim_t *sim, size_t c) {
  const size_t G = SIM_SEG_GROUP, S = SIM_SEG_SUPER, nc = sim->n_chunks;
  size_t f = sim->first, need = f + nc + 1;
  bool move = need > sim->cap_chunks && f > 0;
  if (move) f = 0, need = sim->first >= (nc + 1) / 2 ? nc + 1 : 2 * (nc + 1);
  size_t groups = (sim->first + nc + G - 1) / G, now = (f + nc + G) / G;
  size_t ngroups = now > groups ? now : groups;
  bool ok = grow((void **)&sim->chunks_mem, &sim->cap_chunks, need, sizeof *sim->chunks_mem) &&
            grow((void **)&sim->max_mem, &sim->cap_max, need, sizeof *sim->max_mem) &&
            grow((void **)&sim->group_max, &sim->cap_groups, ngroups, sizeof *sim->group_max) &&
            grow((void **)&sim->super_max, &sim->cap_supers, (ngroups + S - 1) / S,
                 sizeof *sim->super_max);
  sim_chunk_t *k = NULL;
  if (ok && (k = sim->chunk_spare) != NULL)
    sim->chunk_spare = NULL;
  else if (ok)
    ok = (k = gmr__malloc(sizeof *k)) != NULL;
  if (ok && move) { /* back to place 0 */
    memmove(sim->chunks_mem, sim->chunks_mem + sim->first, nc * sizeof *sim->chunks_mem);
    memmove(sim->max_mem, sim->max_mem + sim->first, nc * sizeof *sim->max_mem);
    sim->first = 0;
  }
  sim->chunks = sim->chunks_mem + sim->first; /* the arrays may have moved */
  sim->chunk_max = sim->max_mem + sim->first;
  if (!ok) return false;
  k->n = 0;
  if (!move && now > groups) { /* a new group, maybe a new super-group */
    sim->group_max[now - 1] = 0;
    if ((now - 1) % S == 0) sim->super_max[(now - 1) / S] = 0;
  }
  memmove(&sim->chunks[c + 1], &sim->chunks[c], (nc - c) * sizeof *sim->chunks);
  memmove(&sim->chunk_max[c + 1], &sim->chunk_max[c], (nc - c) * sizeof *sim->chunk_max);
  sim->chunks[c] = k;
  sim->chunk_max[c] = 0;
  ++sim->n_chunks;
  if (move) groups_rebuild(sim);
  return true;
}

/* Drop chunk c (its ranges are gone or moved); one is kept for reuse. */
static void chunk_drop(gmr_sim_t *sim, size_t c) {
  sim_chunk_t *k = sim->chunks[c];
  if (sim->chunk_spare == NULL)
    sim->chunk_spare = k;
  else
    gmr__free(k);
  if (--sim->n_chunks == 0) { /* back to place 0 */
    sim->first = 0;
  } else if (c == 0) { /* the others keep their places, and so their groups */
    ++sim->first;
  } else {
    memmove(&sim->chunks[c], &sim->chunks[c + 1], (sim->n_chunks - c) * sizeof *sim->chunks);
    memmove(&sim->chunk_max[c], &sim->chunk_max[c + 1],
            (sim->n_chunks - c) * sizeof *sim->chunk_max);
    groups_moved(sim, c);
  }
  sim->chunks = sim->chunks_mem + sim->first;
  sim->chunk_max = sim->max_mem + sim->first;
}

/* Make room for one range at index *pi of chunk *pc (before the range
 * there, or after the last), which may then be in the chunk after (a full
 * chunk splits in halves; an index above the half moves, with the ranges
 * before it from the half on); with no chunk at all, one is made (*pc =
 * *pi = 0).  0 or GMR_ENOMEM (nothing changed). */
static int seg_room(gmr_sim_t *sim, size_t *pc, size_t *pi) {
  if (sim->n_chunks == 0) {
    if (!chunk_add(sim, 0)) return GMR_ENOMEM;
    groups_moved(sim, 0);
    *pc = *pi = 0;
    return 0;
  }
  sim_chunk_t *k = sim->chunks[*pc];
  if (k->n < SIM_SEG_CAP) return 0;
  if (!chunk_add(sim, *pc + 1)) return GMR_ENOMEM;
  sim_chunk_t *up = sim->chunks[*pc + 1];
  const size_t half = SIM_SEG_CAP / 2;
  memcpy(up->e, &k->e[half], (k->n - half) * sizeof *k->e);
  up->n = k->n - half;
  k->n = half;
  sim->chunk_max[*pc + 1] = sim->chunk_max[*pc]; /* a bound for both halves */
  groups_moved(sim, *pc + 1);
  if (*pi > half) {
    ++*pc;
    *pi -= half;
  }
  return 0;
}

/* Join chunks c and c + 1 when both fit in half a chunk. */
static void seg_tidy(gmr_sim_t *sim, size_t c) {
  if (c + 1 >= sim->n_chunks) return;
  sim_chunk_t *k = sim->chunks[c], *up = sim->chunks[c + 1];
  if (k->n + up->n > SIM_SEG_CAP / 2) return;
  memcpy(&k->e[k->n], up->e, up->n * sizeof *up->e);
  k->n += up->n;
  seg_grew(sim, c, sim->chunk_max[c + 1]); /* c's group may not be c + 1's */
  chunk_drop(sim, c + 1);
}

/* The range with the greatest start <= a: false when none. */
static bool seg_floor(const gmr_sim_t *sim, uintptr_t a, size_t *pc, size_t *pi) {
  size_t lo = 0, hi = sim->n_chunks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sim->chunks[mid]->e[0].addr <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return false;
  const sim_chunk_t *k = sim->chunks[lo - 1];
  size_t i = 0, j = k->n;
  while (i < j) {
    size_t mid = (i + j) / 2;
    if (k->e[mid].addr <= a)
      i = mid + 1;
    else
      j = mid;
  }
  *pc = lo - 1;
  *pi = i - 1;
  return true;
}

/* The gap after range (c, i), or the head gap when `head`: [*from,
 * *from + *gap). */
static void gap_of(const gmr_sim_t *sim, bool head, size_t c, size_t i, uintptr_t *from,
                   size_t *gap) {
  if (head) {
    *from = sim->space_lo;
    *gap = sim->head_gap;
  } else {
    const sim_seg_t *e = &sim->chunks[c]->e[i];
    *from = e->addr + e->size;
    *gap = e->gap;
  }
}

/* Take [a, a+size) out of the gap after range (c, i), or out of the head
 * gap when `head`, which holds it: a range of its own there (`rec`, when
 * not NULL: a reservation's req and aux; else SIM_SEG_OTHER), with the
 * rest of the gap after it. */
static int seg_insert(gmr_sim_t *sim, bool head, size_t c, size_t i, uintptr_t a, size_t size,
                      const sim_seg_t *rec) {
  uintptr_t from;
  size_t gap;
  gap_of(sim, head, c, i, &from, &gap);
  if (head)
    c = i = 0; /* the new range goes first */
  else
    ++i; /* the new range goes after (c, i) */
  if (seg_room(sim, &c, &i) != 0) return GMR_ENOMEM;
  /* The gap before a: head_gap, or that of the range before (c, i), which
   * a split may have moved to chunk c too (then i >= 1). */
  if (head)
    sim->head_gap = a - from;
  else
    seg_at(sim, c, i - 1)->gap = a - from;
  sim_chunk_t *k = sim->chunks[c];
  size_t rest = from + gap - (a + size);
  memmove(&k->e[i + 1], &k->e[i], (k->n - i) * sizeof *k->e);
  k->e[i] = rec != NULL ? (sim_seg_t){a, size, rest, rec->req, rec->aux}
                        : (sim_seg_t){a, size, rest, SIM_SEG_OTHER, 0};
  ++k->n;
  seg_grew(sim, c, rest);
  return 0;
}

/* `size` bytes at `align` out of the gap after range (c, i) (the head gap
 * when `head`), at the gap's lowest such address: 0 (taken, *out), 1 (it
 * does not hold them), GMR_ENOMEM.  `rec`: see seg_insert. */
static int gap_take(gmr_sim_t *sim, bool head, size_t c, size_t i, size_t size, size_t align,
                    const sim_seg_t *rec, uintptr_t *out) {
  uintptr_t from;
  size_t gap;
  gap_of(sim, head, c, i, &from, &gap);
  uintptr_t start = (from + align - 1) / align * align;
  if (start + size > from + gap || start < from) return 1;
  if ((size != 0 || rec != NULL) && seg_insert(sim, head, c, i, start, size, rec) != 0)
    return GMR_ENOMEM; /* size 0 and no record: nothing to take */
  *out = start;
  return 0;
}

/* First fit: the lowest free range that holds `size` bytes at `align`.
 * The gaps of at least `size` bytes come in address order, and the first
 * one that still holds it once its start is aligned up is taken.  `rec`:
 * see seg_insert. */
static int space_take(gmr_sim_t *sim, size_t size, size_t align, const sim_seg_t *rec,
                      uintptr_t *out) {
  const size_t need = size ? size : 1; /* a free range is not empty */
  int got;
  if (sim->head_gap >= need && (got = gap_take(sim, true, 0, 0, size, align, rec, out)) != 1)
    return got;
  /* Over places: chunk c is at place f + c (see the section's top). */
  const size_t f = sim->first, end = f + sim->n_chunks, G = SIM_SEG_GROUP, S = SIM_SEG_SUPER;
  const size_t g0 = f / G, ng = (end + G - 1) / G;
  for (size_t s = g0 / S; s * S < ng; ++s) {
    if (sim->super_max[s] < need) continue;
    size_t gend = (s + 1) * S < ng ? (s + 1) * S : ng, smax = 0;
    for (size_t g = s * S > g0 ? s * S : g0; g < gend; ++g) {
      if (sim->group_max[g] >= need) {
        size_t cend = ((g + 1) * G < end ? (g + 1) * G : end) - f, gmax = 0;
        for (size_t c = (g * G > f ? g * G : f) - f; c < cend; ++c) {
          sim_chunk_t *k = sim->chunks[c];
          if (sim->chunk_max[c] >= need) {
            size_t most = 0;
            for (size_t i = 0; i < k->n; ++i) {
              size_t gap = k->e[i].gap;
              if (gap >= need && (got = gap_take(sim, false, c, i, size, align, rec, out)) != 1)
                return got;
              if (gap > most) most = gap;
            }
            sim->chunk_max[c] = most; /* scanned whole: the bound is exact now */
          }
          if (sim->chunk_max[c] > gmax) gmax = sim->chunk_max[c];
        }
        sim->group_max[g] = gmax; /* every chunk passed: exact over their bounds */
      }
      if (sim->group_max[g] > smax) smax = sim->group_max[g];
    }
    sim->super_max[s] = smax; /* every group passed: exact over their bounds */
  }
  return GMR_ENOMEM;
}

/* Take exactly [a, a+size) when it is free (for placement hints). */
static int space_take_at(gmr_sim_t *sim, uintptr_t a, size_t size, const sim_seg_t *rec) {
  size_t c = 0, i = 0; /* the gap at or before a is the only candidate */
  bool head = !seg_floor(sim, a, &c, &i);
  uintptr_t from;
  size_t gap;
  gap_of(sim, head, c, i, &from, &gap);
  if (a < from || a + size > from + gap || gap == 0) return GMR_ENOMEM;
  return seg_insert(sim, head, c, i, a, size, rec);
}

/* Remove range i of chunk c: it and its gap join the gap before it. */
static void seg_remove(gmr_sim_t *sim, size_t c, size_t i) {
  sim_chunk_t *k = sim->chunks[c];
  size_t freed = k->e[i].size + k->e[i].gap;
  if (i > 0) {
    k->e[i - 1].gap += freed;
    seg_grew(sim, c, k->e[i - 1].gap);
  } else if (c > 0) {
    sim_chunk_t *p = sim->chunks[c - 1];
    p->e[p->n - 1].gap += freed;
    seg_grew(sim, c - 1, p->e[p->n - 1].gap);
  } else {
    sim->head_gap += freed;
  }
  memmove(&k->e[i], &k->e[i + 1], (k->n - i - 1) * sizeof *k->e);
  if (--k->n == 0) {
    chunk_drop(sim, c);
    if (c == sim->n_chunks) {
      if (c == 0) return;
      --c;
    }
  }
  if (sim->chunks[c]->n <= SIM_SEG_CAP / 2) { /* else it joins neither neighbour */
    seg_tidy(sim, c);
    if (c > 0) seg_tidy(sim, c - 1);
  }
}

/* Give back [a, a+size), a range taken for no reservation (a virtual
 * range, arena memory); one never taken is ignored. */
static void space_give(gmr_sim_t *sim, uintptr_t a, size_t size) {
  size_t c, i;
  if (!seg_floor(sim, a, &c, &i)) return;
  sim_seg_t *r = seg_at(sim, c, i);
  if (r->addr == a && r->size == size && r->req == SIM_SEG_OTHER) seg_remove(sim, c, i);
}

/* The reservation (a, size) recorded as a range, or NULL. */
static sim_seg_t *seg_reserved(gmr_sim_t *sim, uintptr_t a, size_t size, size_t *pc, size_t *pi) {
  if (!seg_floor(sim, a, pc, pi)) return NULL;
  sim_seg_t *r = seg_at(sim, *pc, *pi);
  return r->addr == a && r->req == size && r->req != SIM_SEG_OTHER ? r : NULL;
}

static void space_clear(gmr_sim_t *sim) {
  for (size_t c = 0; c < sim->n_chunks; ++c)
    gmr__free(sim->chunks[c]);
  gmr__free(sim->chunk_spare);
  gmr__free(sim->chunks_mem);
  gmr__free(sim->max_mem);
  gmr__free(sim->group_max);
  gmr__free(sim->super_max);
}

/* ---- fault schedule -------------------------------------------------------- */

/* The schedule alone (fail all, the k-th call), for calls that hold no
 * memory (virtual reserve, page map, set access).  Called with the lock. */
static int sim_check_schedule(gmr_sim_t *sim, size_t size, const char *what) {
  if (sim->fail_all)
    return gmr__error_set(GMR_ENOMEM, "simulated device: %s of %zu bytes refused (fail all)", what,
                          size);
  if (sim->fail_countdown != 0 && --sim->fail_countdown == 0) {
    sim->fail_all = sim->fail_sticky;
    return gmr__error_set(GMR_ENOMEM, "simulated device: %s of %zu bytes refused (scheduled)", what,
                          size);
  }
  return 0;
}

/* Called with the lock held for every reserve, map and page create. */
static int sim_check_faults(gmr_sim_t *sim, size_t size, const char *what) {
  if (sim->fail_all)
    return gmr__error_set(GMR_ENOMEM, "simulated device: %s of %zu bytes refused (fail all)", what,
                          size);
  if (sim->fail_above != 0 && size > sim->fail_above)
    return gmr__error_set(GMR_ENOMEM, "simulated device: %s of %zu bytes refused (above %llu)",
                          what, size, (unsigned long long)sim->fail_above);
  if (sim->fail_countdown != 0 && --sim->fail_countdown == 0) {
    sim->fail_all = sim->fail_sticky;
    return gmr__error_set(GMR_ENOMEM, "simulated device: %s of %zu bytes refused (scheduled)", what,
                          size);
  }
  if (size > sim->capacity || sim->bytes_in_use > sim->capacity - size) {
    char need[32], free_[32];
    gmr__format_size(size, need, sizeof need);
    gmr__format_size(sim->capacity - sim->bytes_in_use, free_, sizeof free_);
    return gmr__error_set(GMR_ENOMEM, "simulated device: out of memory (%s %s, %s free)", what,
                          need, free_);
  }
  return 0;
}

/* ---- host memory behind reservations (host-backed) ------------------------- */

static size_t host_page(void) {
  long pg = sysconf(_SC_PAGESIZE);
  return pg > 0 ? (size_t)pg : 4096;
}

/* With page reuse: the arena, mapped at the first reserve, all of it one
 * free range.  Called with the lock. */
static void arena_open(gmr_sim_t *sim) {
  sim->arena_tried = true;
  size_t size = sim->capacity > (SIM_ARENA_MAX - SIM_ARENA_SLACK) / SIM_ARENA_PER_BYTE
                    ? SIM_ARENA_MAX
                    : gmr__align_up((size_t)sim->capacity * SIM_ARENA_PER_BYTE + SIM_ARENA_SLACK,
                                    sim->base.granularity);
  void *p =
      mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return;
  sim->space_lo = (uintptr_t)p;
  sim->space_hi = (uintptr_t)p + size;
  sim->head_gap = size;
  sim->arena = (uintptr_t)p;
  sim->arena_size = size;
}

static bool in_arena(const gmr_sim_t *sim, uintptr_t a) {
  return sim->arena != 0 && a - sim->arena < sim->arena_size;
}

/* Host memory for a reservation of `size` bytes (see the top of the file);
 * NULL when refused.  Called with the lock. */
static void *host_take(gmr_sim_t *sim, size_t size) {
  const size_t pg = host_page();
  if (size > SIZE_MAX - pg) return NULL;
  const size_t body = gmr__align_up(size, pg);
  if (sim->host_reuse && !sim->arena_tried) arena_open(sim);
  uintptr_t a;
  void *p = NULL;
  if (sim->host_reuse && sim->arena != 0 && space_take(sim, body, pg, NULL, &a) == 0) {
    p = (void *)a;
    SIM_POISON((char *)p + size, body - size);
    return p;
  }
  return posix_memalign(&p, SIM_RESERVE_ALIGN, size) == 0 ? p : NULL;
}

static void host_give(gmr_sim_t *sim, void *p, size_t size) {
  if (!in_arena(sim, (uintptr_t)p)) {
    free(p);
    return;
  }
  const size_t body = gmr__align_up(size, host_page());
  SIM_UNPOISON((char *)p + size, body - size);
  space_give(sim, (uintptr_t)p, body);
}

/* ---- ops ------------------------------------------------------------------- */

static int sim_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.reserve_calls;
  int err = sim_check_faults(sim, size, "reserve");
  uintptr_t a = 0;
  void *host = NULL;
  if (err == 0) {
    if (sim->host_backed) {
      if ((host = host_take(sim, size)) == NULL)
        err =
            gmr__error_set(GMR_ENOMEM, "simulated device: host memory for %zu bytes refused", size);
      a = (uintptr_t)host;
    } else {
      /* cudaMalloc hands out 2 MiB-aligned ranges for large sizes.  The
       * reservation is a range of the space's table (no live-range tree). */
      size_t align = size >= sim->base.granularity ? sim->base.granularity : SIM_RESERVE_ALIGN;
      size_t span = size ? gmr__align_up(size, SIM_RESERVE_ALIGN) : SIM_RESERVE_ALIGN;
      const sim_seg_t rec = {.req = size, .aux = (uint32_t)sim->counters.reserve_calls};
      uintptr_t hint = sim->place_next;
      sim->place_next = 0;
      if (hint != 0 && hint % SIM_RESERVE_ALIGN == 0 && space_take_at(sim, hint, span, &rec) == 0)
        a = hint;
      else if (space_take(sim, span, align, &rec, &a) != 0)
        err = gmr__error_set(GMR_ENOMEM, "simulated device: address space exhausted");
    }
  }
  if (err == 0 && sim->host_backed && (err = live_add(sim, a, size, SIM_RESERVED, 0)) != 0)
    host_give(sim, host, size);
  if (err == 0) {
    sim->bytes_in_use += size;
    if (sim->bytes_in_use > sim->counters.peak_bytes_in_use)
      sim->counters.peak_bytes_in_use = sim->bytes_in_use;
    *out_ptr = (void *)a;
  } else {
    ++sim->counters.reserve_failures;
  }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.release_calls;
  int err;
  if (sim->host_backed) {
    if ((err = live_remove(sim, (uintptr_t)ptr, size, SIM_RESERVED)) == 0)
      host_give(sim, ptr, size);
  } else {
    size_t c, i;
    if (seg_reserved(sim, (uintptr_t)ptr, size, &c, &i) != NULL) {
      seg_remove(sim, c, i);
      err = 0;
    } else {
      err = live_missing(SIM_RESERVED, (uintptr_t)ptr, size);
    }
  }
  if (err == 0) sim->bytes_in_use -= size;
  gmr__unlock(&sim->lock);
  return err;
}

/* A virtual range's addresses back where they came from: the space (or
 * the arena), else, host-backed, the host. */
static void va_give(gmr_sim_t *sim, uintptr_t a, size_t size) {
  if (sim->host_backed && !in_arena(sim, a))
    munmap((void *)a, size);
  else
    space_give(sim, a, size);
}

static int sim_va_reserve(gmr_backend_t *be, size_t size, void **out_base) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.va_reserve_calls;
  uintptr_t a = 0;
  int err = sim_check_schedule(sim, size, "virtual reserve");
  if (err != 0) {
  } else if (sim->host_backed) {
    if (sim->host_reuse && !sim->arena_tried) arena_open(sim);
    if (!(sim->host_reuse && sim->arena != 0 &&
          space_take(sim, size, sim->base.granularity, NULL, &a) == 0)) {
      void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED)
        err = gmr__error_set(GMR_ENOMEM, "simulated device: cannot reserve %zu bytes of addresses",
                             size);
      a = (uintptr_t)p;
    }
  } else if (space_take(sim, size, sim->base.granularity, NULL, &a) != 0) {
    err = gmr__error_set(GMR_ENOMEM, "simulated device: address space exhausted");
  }
  if (err == 0 && (err = live_add(sim, a, size, SIM_VA, 0)) != 0) va_give(sim, a, size);
  if (err == 0) *out_base = (void *)a;
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_va_release(gmr_backend_t *be, void *base, size_t size) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.va_release_calls;
  if (use_pending(sim, (uintptr_t)base, size)) ++sim->counters.unsafe_unmaps;
  int err = 0;
  if (mapped_overlaps(sim, (uintptr_t)base, size))
    err = gmr__error_set(GMR_EINVAL, "simulated device: virtual range at %p still has mapped pages",
                         base);
  if (err == 0) err = live_remove(sim, (uintptr_t)base, size, SIM_VA);
  if (err == 0) va_give(sim, (uintptr_t)base, size);
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.map_calls;
  int err = 0;
  if (!va_contains(sim, (uintptr_t)addr, size) || mapped_overlaps(sim, (uintptr_t)addr, size))
    err = gmr__error_set(GMR_EINVAL,
                         "simulated device: cannot map %zu bytes at %p (outside a virtual range, "
                         "or already mapped)",
                         size, addr);
  if (err == 0) err = sim_check_faults(sim, size, "map");
  /* In the arena, the pages are there already (readable and writable). */
  if (err == 0 && sim->host_backed && !in_arena(sim, (uintptr_t)addr) &&
      mmap(addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
          MAP_FAILED)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host pages for %zu bytes refused", size);
  if (err == 0) err = live_add(sim, (uintptr_t)addr, size, SIM_MAPPED, 0);
  if (err == 0) {
    sim->bytes_in_use += size;
    if (sim->bytes_in_use > sim->counters.peak_bytes_in_use)
      sim->counters.peak_bytes_in_use = sim->bytes_in_use;
  } else {
    ++sim->counters.reserve_failures;
  }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.unmap_calls;
  if (use_pending(sim, (uintptr_t)addr, size)) ++sim->counters.unsafe_unmaps;
  int err = live_remove(sim, (uintptr_t)addr, size, SIM_MAPPED);
  if (err == 0) {
    sim->bytes_in_use -= size;
    if (sim->host_backed && !in_arena(sim, (uintptr_t)addr))
      mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  gmr__unlock(&sim->lock);
  return err;
}

/* ---- physical pages ---------------------------------------------------------- */

static sim_page_t *sim_page(gmr_sim_t *sim, gmr_phys_t h) {
  if (h == 0 || h > sim->n_pages || sim->pages[h - 1].size == 0) return NULL;
  return &sim->pages[h - 1];
}

/* A memfd of `size` bytes: a pooled one (page reuse), else a new one; -1
 * when refused. */
static int page_fd_take(gmr_sim_t *sim, size_t size) {
  for (size_t i = sim->n_pool; i-- > 0;)
    if (sim->pool[i].size == size) {
      int fd = sim->pool[i].fd;
      sim->pool[i] = sim->pool[--sim->n_pool];
      return fd;
    }
  int fd = memfd_create("gmr-sim-page", MFD_CLOEXEC);
  if (fd < 0 && sim->n_pool > 0) { /* out of descriptors: give the pooled ones back */
    while (sim->n_pool > 0)
      close(sim->pool[--sim->n_pool].fd);
    fd = memfd_create("gmr-sim-page", MFD_CLOEXEC);
  }
  if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* A released page's memfd: pooled (page reuse, no mapping holds it, room
 * left: at most SIM_POOL_PAGES and capacity bytes), else closed (mappings
 * that remain keep its memory). */
static void page_fd_give(gmr_sim_t *sim, sim_page_t *pg, bool tracked) {
  if (pg->fd < 0) return;
  if (sim->host_reuse && tracked && pg->nmaps == 0 && sim->n_pool < SIM_POOL_PAGES &&
      (uint64_t)pg->size * (sim->n_pool + 1) <= sim->capacity)
    sim->pool[sim->n_pool++] = (sim_pooled_t){pg->size, pg->fd};
  else
    close(pg->fd);
}

static int sim_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.page_create_calls;
  int err = sim_check_faults(sim, size, "page create");
  size_t slot = sim->n_pages;
  for (size_t i = sim->page_low; err == 0 && i < sim->n_pages; ++i)
    if (sim->pages[i].size == 0 && !sim->pages[i].dying) {
      slot = i;
      break;
    }
  if (err == 0 && slot == sim->n_pages &&
      !grow((void **)&sim->pages, &sim->cap_pages, sim->n_pages + 1, sizeof *sim->pages))
    err = gmr__error_set(GMR_ENOMEM, "simulated device: out of host memory for its page table");
  int fd = -1;
  if (err == 0 && sim->host_backed && (fd = page_fd_take(sim, size)) < 0)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host memory for a %zu-byte page refused",
                         size);
  if (err == 0) {
    if (slot == sim->n_pages) ++sim->n_pages;
    sim->pages[slot] = (sim_page_t){.size = size, .fd = fd};
    sim->page_low = slot + 1;
    sim->bytes_in_use += size;
    if (sim->bytes_in_use > sim->counters.peak_bytes_in_use)
      sim->counters.peak_bytes_in_use = sim->bytes_in_use;
    ++sim->counters.pages_live;
    *out = (gmr_phys_t)slot + 1;
  } else {
    ++sim->counters.reserve_failures;
  }
  gmr__unlock(&sim->lock);
  return err;
}

/* Like cuMemRelease, a page may be released while still mapped: its memory
 * then lives on behind the mappings (host-backed: the mmaps keep the memfd). */
static int sim_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.page_release_calls;
  sim_page_t *pg = sim_page(sim, h);
  int err = 0;
  if (pg == NULL || pg->size != size)
    err = gmr__error_set(GMR_EINVAL, "simulated device: no page %llu of %zu bytes to release",
                         (unsigned long long)h, size);
  if (err == 0) {
    bool tracked = sim->host_reuse && h < SIM_PAGES_TRACKED;
    page_fd_give(sim, pg, tracked);
    *pg = (sim_page_t){.fd = -1, .nmaps = pg->nmaps, .dying = tracked && pg->nmaps > 0};
    if (!pg->dying && h - 1 < sim->page_low) sim->page_low = h - 1;
    sim->bytes_in_use -= size;
    --sim->counters.pages_live;
  }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t offset) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.page_map_calls;
  sim_page_t *pg = sim_page(sim, h);
  int err = 0;
  if (pg == NULL || offset + size > pg->size || size == 0)
    err = gmr__error_set(GMR_EINVAL,
                         "simulated device: cannot map %zu bytes at offset %zu of page "
                         "%llu",
                         size, offset, (unsigned long long)h);
  else if (!va_contains(sim, (uintptr_t)addr, size) || mapped_overlaps(sim, (uintptr_t)addr, size))
    err = gmr__error_set(GMR_EINVAL,
                         "simulated device: cannot map a page at %p (outside a virtual range, or "
                         "already mapped)",
                         addr);
  if (err == 0) err = sim_check_schedule(sim, size, "page map");
  if (err == 0 && sim->host_backed &&
      mmap(addr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, pg->fd, (off_t)offset) == MAP_FAILED)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host mapping of %zu bytes refused", size);
  if (err == 0) err = live_add(sim, (uintptr_t)addr, size, SIM_ALIAS, h);
  if (err == 0) {
    ++sim->counters.page_maps_live;
    if (sim->host_reuse && h < SIM_PAGES_TRACKED) ++pg->nmaps;
  }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_set_access(gmr_backend_t *be, void *addr, size_t size) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.set_access_calls;
  /* [addr, addr+size) must be tiled by page mappings. */
  uintptr_t a = (uintptr_t)addr, end = a + size;
  int err = 0;
  for (uintptr_t at = a; err == 0 && at < end;) {
    gmr_avl_node_t *n = gmr__avl_find(&sim->mappings, at);
    if (n == NULL || SIM_KIND(n->aux) != SIM_ALIAS || n->val > end - at)
      err = gmr__error_set(GMR_EINVAL,
                           "simulated device: set access on %zu bytes at %p that page "
                           "mappings do not cover",
                           size, addr);
    else
      at += n->val;
  }
  if (err == 0) err = sim_check_schedule(sim, size, "set access");
  if (err == 0 && sim->host_backed && mprotect(addr, size, PROT_READ | PROT_WRITE) != 0)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host access to %zu bytes refused", size);
  if (err == 0)
    for (uintptr_t at = a; at < end;) { /* tiled by page mappings (checked above) */
      gmr_avl_node_t *n = gmr__avl_find(&sim->mappings, at);
      n->aux |= SIM_ACCESS;
      at += n->val;
    }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.page_unmap_calls;
  if (use_pending(sim, (uintptr_t)addr, size)) ++sim->counters.unsafe_unmaps;
  gmr_avl_node_t *n = gmr__avl_find(&sim->mappings, (uintptr_t)addr);
  gmr_phys_t h = n != NULL && SIM_KIND(n->aux) == SIM_ALIAS ? n->aux >> SIM_PAGE_SHIFT : 0;
  int err = live_remove(sim, (uintptr_t)addr, size, SIM_ALIAS);
  if (err == 0) {
    --sim->counters.page_maps_live;
    if (h != 0 && h <= sim->n_pages) {
      sim_page_t *pg = &sim->pages[h - 1];
      if (pg->nmaps > 0) --pg->nmaps;
      if (pg->dying && pg->nmaps == 0) { /* the slot is free now */
        pg->dying = false;
        if (h - 1 < sim->page_low) sim->page_low = h - 1;
      }
    }
    /* Addresses in the arena go back to plain readable, writable pages. */
    if (in_arena(sim, (uintptr_t)addr))
      mmap(addr, size, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    else if (sim->host_backed)
      mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  *out_free = sim->capacity - sim->bytes_in_use;
  *out_total = sim->capacity;
  gmr__unlock(&sim->lock);
  return 0;
}

/* The same simulated device in every process: named by its ordinal and
 * capacity, "sim0-85899345920". */
static int sim_device_id(gmr_backend_t *be, char *buf, size_t len) {
  gmr_sim_t *sim = sim_of(be);
  snprintf(buf, len, "sim%d-%llu", be->device, (unsigned long long)sim->capacity);
  return 0;
}

/* Streams: looked up by id; created on first use.  Called with the lock. */
static sim_stream_t *sim_stream(gmr_sim_t *sim, gmr_stream_t s) {
  uintptr_t id = (uintptr_t)s;
  for (size_t i = 0; i < sim->n_streams; ++i)
    if (sim->streams[i].id == id) return &sim->streams[i];
  if (!grow((void **)&sim->streams, &sim->cap_streams, sim->n_streams + 1, sizeof *sim->streams))
    return NULL;
  sim_stream_t *st = &sim->streams[sim->n_streams++];
  *st = (sim_stream_t){.id = id};
  return st;
}

/* Does work still queued use any byte of [a, a+size)?  Drops the uses that
 * completed on the way.  Called with the lock. */
static bool use_pending(gmr_sim_t *sim, uintptr_t a, size_t size) {
  bool hit = false;
  size_t k = 0;
  for (size_t i = 0; i < sim->n_uses; ++i) {
    sim_use_t *u = &sim->uses[i];
    sim_stream_t *st = sim_stream(sim, (gmr_stream_t)u->stream);
    if (st == NULL || st->completed >= u->seq) continue; /* done: drop */
    if (u->addr < a + size && a < u->addr + u->size) hit = true;
    sim->uses[k++] = *u;
  }
  sim->n_uses = k;
  return hit;
}

static int sim_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev) {
  gmr_sim_t *sim = sim_of(be);
  sim_event_t *ev = gmr__malloc(sizeof *ev);
  if (ev == NULL)
    return gmr__error_set(GMR_ENOMEM, "simulated device: no host memory for an event");
  gmr__lock(&sim->lock);
  ++sim->counters.event_records;
  sim_stream_t *st = sim_stream(sim, s);
  int err = 0;
  if (st == NULL)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: no host memory for a stream");
  else
    *ev = (sim_event_t){st->id, st->enqueued};
  gmr__unlock(&sim->lock);
  if (err != 0) {
    gmr__free(ev);
    return err;
  }
  *out_ev = ev;
  return 0;
}

static int sim_event_query(gmr_backend_t *be, gmr_event_t e) {
  gmr_sim_t *sim = sim_of(be);
  sim_event_t *ev = e;
  gmr__lock(&sim->lock);
  ++sim->counters.event_queries;
  sim_stream_t *st = sim_stream(sim, (gmr_stream_t)ev->stream);
  int done = st == NULL || st->completed >= ev->seq;
  gmr__unlock(&sim->lock);
  return done ? 0 : 1;
}

/* Waiting on an event completes the work it follows, as the GPU would. */
static int sim_event_sync(gmr_backend_t *be, gmr_event_t e) {
  gmr_sim_t *sim = sim_of(be);
  sim_event_t *ev = e;
  gmr__lock(&sim->lock);
  ++sim->counters.syncs;
  sim_stream_t *st = sim_stream(sim, (gmr_stream_t)ev->stream);
  if (st != NULL && st->completed < ev->seq) st->completed = ev->seq;
  gmr__unlock(&sim->lock);
  return 0;
}

static void sim_event_destroy(gmr_backend_t *be, gmr_event_t e) {
  gmr__free(e);
}

static int sim_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.syncs;
  sim_stream_t *st = sim_stream(sim, s);
  if (st != NULL) st->completed = st->enqueued;
  gmr__unlock(&sim->lock);
  return 0;
}

static int sim_device_sync(gmr_backend_t *be) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.syncs;
  for (size_t i = 0; i < sim->n_streams; ++i)
    sim->streams[i].completed = sim->streams[i].enqueued;
  gmr__unlock(&sim->lock);
  return 0;
}

static int sim_stream_capturing(gmr_backend_t *be, gmr_stream_t s) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.capture_queries;
  sim_stream_t *st = sim_stream(sim, s);
  int on = st != NULL && st->capturing;
  gmr__unlock(&sim->lock);
  return on;
}

static uint64_t sim_now_ns(gmr_backend_t *be) {
  gmr_sim_t *sim = sim_of(be);
  if (sim->clock_fixed) return sim->clock_ns;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void free_reserved(gmr_avl_node_t *n, void *ud) {
  host_give(ud, (void *)(uintptr_t)n->key, n->val);
}
static void unmap_va(gmr_avl_node_t *n, void *ud) {
  (void)ud;
  munmap((void *)(uintptr_t)n->key, n->val);
}

static void sim_destroy(gmr_backend_t *be) {
  gmr_sim_t *sim = sim_of(be);
  for (size_t i = 0; i < sim->n_pages; ++i)
    if (sim->pages[i].size != 0 && sim->pages[i].fd >= 0) close(sim->pages[i].fd);
  for (size_t i = 0; i < sim->n_pool; ++i)
    close(sim->pool[i].fd);
  gmr__free(sim->pages);
  /* Give back whatever a policy left behind (it should leave nothing). */
  gmr__avl_clear(&sim->reserved, sim->host_backed ? free_reserved : NULL, sim);
  if (sim->arena != 0) munmap((void *)sim->arena, sim->arena_size);
  gmr__avl_clear(&sim->mappings, NULL, NULL);
  gmr__avl_clear(&sim->virt, sim->host_backed ? unmap_va : NULL, NULL);
  space_clear(sim);
  gmr__free(sim->streams);
  gmr__free(sim->uses);
  gmr__lock_destroy(&sim->lock);
  gmr__free(sim);
}

static const gmr_backend_ops_t sim_ops = {
    .name = "sim",
    .reserve = sim_reserve,
    .release = sim_release,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .mem_info = sim_mem_info,
    .device_id = sim_device_id,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .phys_map = sim_phys_map,
    .set_access = sim_set_access,
    .phys_unmap = sim_phys_unmap,
    .stream_capturing = sim_stream_capturing,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_destroy = sim_event_destroy,
    .stream_sync = sim_stream_sync,
    .device_sync = sim_device_sync,
    .now_ns = sim_now_ns,
    .destroy = sim_destroy,
};

int gmr__sim_backend_new(const gmr_sim_options_t *opts, gmr_backend_t **out) {
  uint64_t granularity = opts && opts->granularity ? opts->granularity : SIM_DEFAULT_GRANULARITY;
  if (!gmr__is_pow2(granularity) || granularity < 4096 || granularity > ((uint64_t)1 << 30))
    return gmr__error_set(GMR_EINVAL,
                          "simulated device: granularity %llu is not a power of two "
                          "in [4096, 1 GiB]",
                          (unsigned long long)granularity);
  uint64_t capacity = opts && opts->capacity ? opts->capacity : SIM_DEFAULT_CAPACITY;
  if (capacity > SIM_MAX_CAPACITY) {
    char c[32];
    gmr__format_size(capacity, c, sizeof c);
    return gmr__error_set(GMR_EINVAL,
                          "simulated device: a capacity of %s (%llu bytes) is more than the "
                          "simulator's limit of 4 PiB",
                          c, (unsigned long long)capacity);
  }
  gmr_sim_t *sim = gmr__calloc(1, sizeof *sim);
  if (sim == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for the simulator");
  sim->base.ops = &sim_ops;
  sim->base.granularity = granularity;
  sim->capacity = capacity;
  sim->host_backed = opts && opts->host_backed;
  if (gmr__lock_init(&sim->lock) != 0) goto fail_lock;
  if (!sim->host_backed) {
    uintptr_t space = (uintptr_t)sim->capacity * SIM_SPACE_PER_BYTE;
    if (space < SIM_SPACE_MIN) space = SIM_SPACE_MIN;
    sim->space_lo = SIM_SPACE_BASE;
    sim->space_hi = SIM_SPACE_BASE + space;
    sim->head_gap = space;
  }
  *out = &sim->base;
  return 0;
fail_lock:
  gmr__free(sim);
  return gmr__error_set(GMR_ENOMEM, "out of host memory for the simulator");
}

int gmr__sim_backend_new_on(const gmr_sim_options_t *opts, int device, gmr_backend_t **out) {
  if (device < 0 || device >= SIM_MAX_DEVICES)
    return gmr__error_set(GMR_EINVAL,
                          "simulated device: ordinal %d is out of range (the simulator has "
                          "devices 0 to %d)",
                          device, SIM_MAX_DEVICES - 1);
  int err = gmr__sim_backend_new(opts, out);
  if (err != 0) return err;
  gmr_sim_t *sim = sim_of(*out);
  sim->base.device = device;
  if (!sim->host_backed) {        /* move the fresh, whole space to the device's window */
    size_t space = sim->head_gap; /* the one free range */
    if (space > SIM_DEVICE_STRIDE) {
      sim_destroy(*out);
      *out = NULL;
      return gmr__error_set(GMR_EINVAL,
                            "simulated device: an address space of %zu bytes does not fit a "
                            "device's window of %llu bytes",
                            space, (unsigned long long)SIM_DEVICE_STRIDE);
    }
    sim->space_lo += (uintptr_t)device * SIM_DEVICE_STRIDE;
    sim->space_hi += (uintptr_t)device * SIM_DEVICE_STRIDE;
  }
  return 0;
}

bool gmr__backend_is_sim(const gmr_backend_t *be) {
  return be->ops == &sim_ops;
}
gmr_sim_t *gmr__sim_of(gmr_backend_t *be) {
  return be->ops == &sim_ops ? sim_of(be) : NULL;
}

void gmr__sim_fail_nth(gmr_sim_t *sim, uint64_t k) {
  gmr__lock(&sim->lock);
  sim->fail_countdown = k;
  sim->fail_sticky = false;
  gmr__unlock(&sim->lock);
}

void gmr__sim_fail_from(gmr_sim_t *sim, uint64_t k) {
  gmr__lock(&sim->lock);
  sim->fail_countdown = k;
  sim->fail_sticky = true;
  gmr__unlock(&sim->lock);
}

void gmr__sim_fail_above(gmr_sim_t *sim, uint64_t bytes) {
  gmr__lock(&sim->lock);
  sim->fail_above = bytes;
  gmr__unlock(&sim->lock);
}

void gmr__sim_fail_all(gmr_sim_t *sim, int on) {
  gmr__lock(&sim->lock);
  sim->fail_all = on != 0;
  gmr__unlock(&sim->lock);
}

int gmr__sim_stream_enqueue(gmr_sim_t *sim, gmr_stream_t s) {
  gmr__lock(&sim->lock);
  sim_stream_t *st = sim_stream(sim, s);
  if (st != NULL) ++st->enqueued;
  gmr__unlock(&sim->lock);
  return st ? 0 : GMR_ENOMEM;
}

int gmr__sim_stream_use(gmr_sim_t *sim, gmr_stream_t s, const void *ptr, size_t size) {
  gmr__lock(&sim->lock);
  sim_stream_t *st = sim_stream(sim, s);
  int err =
      st != NULL && grow((void **)&sim->uses, &sim->cap_uses, sim->n_uses + 1, sizeof *sim->uses)
          ? 0
          : GMR_ENOMEM;
  if (err == 0) {
    ++st->enqueued;
    sim->uses[sim->n_uses++] = (sim_use_t){st->id, st->enqueued, (uintptr_t)ptr, size};
  }
  gmr__unlock(&sim->lock);
  return err;
}

int gmr__sim_stream_complete(gmr_sim_t *sim, gmr_stream_t s) {
  gmr__lock(&sim->lock);
  sim_stream_t *st = sim_stream(sim, s);
  if (st != NULL) st->completed = st->enqueued;
  gmr__unlock(&sim->lock);
  return st ? 0 : GMR_ENOMEM;
}

int gmr__sim_host_reuse(gmr_sim_t *sim) {
  gmr__lock(&sim->lock);
  /* Pages created or mapped before would not be counted: refuse then. */
  int err = !sim->host_backed || sim->counters.pages_live != 0 || sim->counters.page_maps_live != 0
                ? GMR_EINVAL
                : 0;
  if (err == 0) sim->host_reuse = true;
  gmr__unlock(&sim->lock);
  return err;
}

/* Drop the pages of the unmapped parts of the arena's virtual range n and of
 * every range in its subtree; mappings are found from the range's end down
 * (gmr__avl_floor), so this costs O(mappings x log n).  With the lock. */
static void trim_va(gmr_sim_t *sim, const gmr_avl_node_t *n) {
  if (n == NULL) return;
  trim_va(sim, n->child[0]);
  trim_va(sim, n->child[1]);
  if (!in_arena(sim, (uintptr_t)n->key)) return;
  uintptr_t lo = (uintptr_t)n->key, hi = lo + n->val; /* [lo, hi): still to look at */
  while (hi > lo) {
    gmr_avl_node_t *m = gmr__avl_floor(&sim->mappings, hi - 1);
    uintptr_t gap = m != NULL && m->key >= lo ? (uintptr_t)(m->key + m->val) : lo;
    if (gap < hi) madvise((void *)gap, hi - gap, MADV_DONTNEED);
    if (m == NULL || m->key < lo) break;
    hi = m->key;
  }
}

void gmr__sim_host_trim(gmr_sim_t *sim) {
  gmr__lock(&sim->lock);
  if (sim->arena != 0 && sim->head_gap != 0)
    madvise((void *)sim->space_lo, sim->head_gap, MADV_DONTNEED);
  for (size_t c = 0; sim->arena != 0 && c < sim->n_chunks; ++c)
    for (size_t i = 0; i < sim->chunks[c]->n; ++i) {
      const sim_seg_t *e = &sim->chunks[c]->e[i];
      if (e->gap != 0) madvise((void *)(e->addr + e->size), e->gap, MADV_DONTNEED);
    }
  if (sim->arena != 0) trim_va(sim, sim->virt.root);
  while (sim->n_pool > 0)
    close(sim->pool[--sim->n_pool].fd);
  gmr__unlock(&sim->lock);
}

bool gmr__sim_covers(gmr_sim_t *sim, const void *ptr, size_t size, uint64_t *token) {
  uintptr_t a = (uintptr_t)ptr;
  *token = 0;
  if (size == 0 || a + size < a) return false;
  const uintptr_t end = a + size;
  gmr__lock(&sim->lock);
  bool ok;
  if (sim->host_backed) {
    gmr_avl_node_t *r = gmr__avl_floor(&sim->reserved, a);
    ok = r != NULL && a - r->key < r->val && size <= r->val - (a - r->key);
    if (ok) *token = (uint64_t)r->aux + 1;
  } else { /* address-only: reservations are ranges of the space's table */
    size_t c, i;
    const sim_seg_t *r = seg_floor(sim, a, &c, &i) ? seg_at(sim, c, i) : NULL;
    ok = r != NULL && r->req != SIM_SEG_OTHER && a - r->addr < r->req &&
         size <= r->req - (a - r->addr);
    if (ok) *token = (uint64_t)r->aux + 1;
  }
  /* Else mappings that tile [a, end), each backed (map) or page-mapped with
   * access set. */
  for (uintptr_t at = a; !ok && at < end;) {
    gmr_avl_node_t *m = gmr__avl_floor(&sim->mappings, at);
    if (m == NULL || at - m->key >= m->val ||
        !(SIM_KIND(m->aux) == SIM_MAPPED || (m->aux & SIM_ACCESS) != 0))
      break;
    at = m->key + m->val;
    ok = at >= end;
  }
  gmr__unlock(&sim->lock);
  return ok;
}

void gmr__sim_place_next(gmr_sim_t *sim, uintptr_t addr) {
  gmr__lock(&sim->lock);
  sim->place_next = addr;
  gmr__unlock(&sim->lock);
}

void gmr__sim_stream_capture(gmr_sim_t *sim, gmr_stream_t s, int on) {
  gmr__lock(&sim->lock);
  sim_stream_t *st = sim_stream(sim, s);
  if (st != NULL) st->capturing = on != 0;
  gmr__unlock(&sim->lock);
}

void gmr__sim_set_clock(gmr_sim_t *sim, uint64_t ns) {
  gmr__lock(&sim->lock);
  sim->clock_fixed = true;
  sim->clock_ns = ns;
  gmr__unlock(&sim->lock);
}

void gmr__sim_counters(gmr_sim_t *sim, gmr_sim_counters_t *out) {
  gmr__lock(&sim->lock);
  *out = sim->counters;
  out->bytes_in_use = sim->bytes_in_use;
  gmr__unlock(&sim->lock);
}
