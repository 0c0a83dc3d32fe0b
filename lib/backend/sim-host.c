/* sim-host.c: the host memory behind a host-backed simulated device.
 *
 * A host-backed device gives real memory, so tests can write patterns into
 * blocks and verify them (Note [Host-backed mode]).  For fuzzers and soaks
 * that make millions of reservations, page reuse carves them from one arena
 * and keeps released pages' memfds in a pool (Note [Page reuse]).  The ops
 * in sim.c call these with the device's lock held.
 */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/sim-internal.h"

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

/* Note [Host-backed mode]
 * ~~~~~~~~~~~~~~~~~~~~~~~
 * Every reservation is real host memory (posix_memalign, so
 * AddressSanitizer sees each range separately), and virtual ranges are
 * PROT_NONE mappings whose pages map() makes readable and writable, so
 * tests can write patterns into blocks and verify them.  A physical page is
 * a memfd, mapped MAP_SHARED at every address (Note [Physical pages]).
 *
 * Note [Page reuse]
 * ~~~~~~~~~~~~~~~~~
 * gmr__sim_host_reuse, for fuzzers and soaks that make millions of
 * reservations: reservations and virtual ranges are carved, first fit, from
 * one readable, writable arena of 16 x capacity + 64 MiB (at most 64 GiB;
 * MAP_NORESERVE).  The pages a range touched stay behind for the next range
 * there: no page fault, no zeroing and no system call per reserve, release,
 * map or unmap (a range's bytes are whatever was there, as with cudaMalloc
 * and cuMemMap); page mappings still map their memfd, and a released page no
 * mapping holds keeps its memfd for the next page of its size
 * (SIM_POOL_PAGES of them).  Memory given back then stays readable: the
 * caller checks its accesses with gmr__sim_covers instead, which also tells
 * one reservation from a later one at the same address.  Reservations cost
 * no AddressSanitizer shadow fill then (a heap block of hundreds of MiB costs
 * size/8 bytes of it at each allocation, free and recycling); under
 * AddressSanitizer the bytes between a reservation's end and its last page's
 * end are poisoned.  What the arena cannot hold is reserved as without page
 * reuse.
 */

static size_t host_page(void) {
  long pg = sysconf(_SC_PAGESIZE);
  return pg > 0 ? (size_t)pg : 4096;
}

/* With page reuse: the arena, mapped at the first reserve, all of it one
 * free range (Note [Page reuse]).  Called with the lock. */
static void arena_open(gmr_sim_t *sim) {
  sim->arena_tried = true;
  size_t size = sim->capacity > (SIM_ARENA_MAX - SIM_ARENA_SLACK) / SIM_ARENA_PER_BYTE
                    ? SIM_ARENA_MAX
                    : gmr__align_up((size_t)sim->capacity * SIM_ARENA_PER_BYTE + SIM_ARENA_SLACK,
                                    sim->base.granularity);
  void *p =
      mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return;
  sim->space.lo = (uintptr_t)p;
  sim->space.hi = (uintptr_t)p + size;
  sim->space.head_gap = size;
  sim->arena = (uintptr_t)p;
  sim->arena_size = size;
}

/* Host memory for a reservation of `size` bytes (Note [Page reuse]);
 * NULL when refused.  Called with the lock. */
void *gmr__sim_host_take(gmr_sim_t *sim, size_t size) {
  const size_t pg = host_page();
  if (size > SIZE_MAX - pg) return NULL;
  const size_t body = gmr__align_up(size, pg);
  if (sim->host_reuse && !sim->arena_tried) arena_open(sim);
  uintptr_t a;
  void *p = NULL;
  if (sim->host_reuse && sim->arena != 0 &&
      gmr__sim_space_take(&sim->space, body, pg, NULL, &a) == 0) {
    p = (void *)a;
    SIM_POISON((char *)p + size, body - size);
    return p;
  }
  return posix_memalign(&p, SIM_RESERVE_ALIGN, size) == 0 ? p : NULL;
}

void gmr__sim_host_give(gmr_sim_t *sim, void *p, size_t size) {
  if (!gmr__sim_in_arena(sim, (uintptr_t)p)) {
    free(p);
    return;
  }
  const size_t body = gmr__align_up(size, host_page());
  SIM_UNPOISON((char *)p + size, body - size);
  gmr__sim_space_give(&sim->space, (uintptr_t)p, body);
}

int gmr__sim_host_va_take(gmr_sim_t *sim, size_t size, uintptr_t *out) {
  if (sim->host_reuse && !sim->arena_tried) arena_open(sim);
  if (sim->host_reuse && sim->arena != 0 &&
      gmr__sim_space_take(&sim->space, size, sim->base.granularity, NULL, out) == 0)
    return 0;
  void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return gmr__error_set(GMR_ENOMEM, "simulated device: cannot reserve %zu bytes of addresses",
                          size);
  *out = (uintptr_t)p;
  return 0;
}

/* A virtual range's addresses back where they came from: the space (or
 * the arena), else, host-backed, the host. */
void gmr__sim_va_give(gmr_sim_t *sim, uintptr_t a, size_t size) {
  if (sim->host_backed && !gmr__sim_in_arena(sim, a))
    munmap((void *)a, size);
  else
    gmr__sim_space_give(&sim->space, a, size);
}

/* A memfd of `size` bytes: a pooled one (Note [Page reuse]), else a new one; -1
 * when refused. */
int gmr__sim_page_fd_take(gmr_sim_t *sim, size_t size) {
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
void gmr__sim_page_fd_give(gmr_sim_t *sim, sim_page_t *pg, bool tracked) {
  if (pg->fd < 0) return;
  if (sim->host_reuse && tracked && pg->nmaps == 0 && sim->n_pool < SIM_POOL_PAGES &&
      (uint64_t)pg->size * (sim->n_pool + 1) <= sim->capacity)
    sim->pool[sim->n_pool++] = (sim_pooled_t){pg->size, pg->fd};
  else
    close(pg->fd);
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
  if (!gmr__sim_in_arena(sim, (uintptr_t)n->key)) return;
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
  if (sim->arena != 0 && sim->space.head_gap != 0)
    madvise((void *)sim->space.lo, sim->space.head_gap, MADV_DONTNEED);
  for (size_t c = 0; sim->arena != 0 && c < sim->space.n_chunks; ++c)
    for (size_t i = 0; i < sim->space.chunks[c]->n; ++i) {
      const sim_seg_t *e = &sim->space.chunks[c]->e[i];
      if (e->gap != 0) madvise((void *)(e->addr + e->size), e->gap, MADV_DONTNEED);
    }
  if (sim->arena != 0) trim_va(sim, sim->virt.root);
  while (sim->n_pool > 0)
    close(sim->pool[--sim->n_pool].fd);
  gmr__unlock(&sim->lock);
}
