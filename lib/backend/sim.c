/* sim.c: the simulated device, a first-class backend: its ops and its test controls.
 *
 * Address-only by default: addresses with no memory behind them, so an
 * 80 GB training trace replays on a small machine (Note [Address-only mode],
 * Note [Device windows]).  Host-backed on request, with real memory that tests
 * can write and check (sim-host.c).  Addresses come from a first-fit space
 * (sim-space.c).  Physical pages are handles that may be mapped at several
 * addresses (Note [Physical pages]).  Tests drive faults, streams, the clock
 * and placement (Note [Test controls]), and the simulator counts unmaps that
 * race queued work (Note [Queued work and unmapping]).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/sim-internal.h"

/* Note [Address-only mode]
 * ~~~~~~~~~~~~~~~~~~~~~~~~
 * Addresses come from a fake address space of max(64 TiB, 64 x capacity)
 * with no memory behind them, so an 80 GB training trace replays on a small
 * machine, and virtual reservations of the whole capacity (expandable
 * segments, one per stream) always fit.  Only `capacity` limits what can be
 * reserved; it is at most 4 PiB, so every address stays below 2^59.
 *
 * Note [Device windows]
 * ~~~~~~~~~~~~~~~~~~~~~
 * Each device ordinal d has its own window of the fake space, so two
 * simulated devices in one process never hand out the same address (as
 * CUDA's unified addressing guarantees): window d starts at SIM_SPACE_BASE +
 * d x SIM_DEVICE_STRIDE; device 0's addresses are those of a single
 * simulated device (Note [Simulator invariants]).
 *
 * Note [Physical pages]
 * ~~~~~~~~~~~~~~~~~~~~~
 * Physical pages (phys_create) are handles that may be mapped at several
 * virtual addresses at once; in host-backed mode each is a memfd, mapped
 * MAP_SHARED at every address, so bytes written through one mapping read
 * back through the others, as on a GPU.  A mapping is inaccessible until
 * set_access covers it.
 *
 * Note [Test controls]
 * ~~~~~~~~~~~~~~~~~~~~
 * A fault schedule (fail the k-th device call that can run out of memory or
 * address space, or every call from the k-th on, fail above N bytes, fail
 * all), streams marked as being captured into a CUDA graph, streams whose
 * work completes only when a test says so, work that uses an address range
 * (gmr__sim_stream_use), an injectable clock, spy counters, and a placement
 * hint (the next reserve at a given address, so a replay can reproduce a
 * recorded device's placement).
 *
 * Note [Queued work and unmapping]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 * On a GPU, cuMemUnmap and cuMemMap are not ordered with a stream's work, so
 * unmapping (or remapping) an address that a queued kernel still uses lets
 * that kernel fault or read another page.  The simulator keeps each unit of
 * work queued with gmr__sim_stream_use as (stream, seq, range) until the
 * stream completes it, and counts every unmap, page unmap or virtual release
 * that touches such a range (counters.unsafe_unmaps); a correct policy keeps
 * that count at 0.
 */

static bool use_pending(gmr_sim_t *sim, uintptr_t a, size_t size);
static bool covers_locked(gmr_sim_t *sim, const void *ptr, size_t size, uint64_t *token);

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

/* ---- fault schedule (Note [Test controls]) ---------------------------------- */

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

/* ---- ops ------------------------------------------------------------------- */

/* The tail of every call that takes device memory (reserve, map, page
 * create): on success, `size` bytes more in use and the peak raised; on a
 * failure, one more in the counters.  Returns err. */
static int sim_charge(gmr_sim_t *sim, int err, size_t size) {
  if (err != 0) {
    ++sim->counters.reserve_failures;
    return err;
  }
  sim->bytes_in_use += size;
  if (sim->bytes_in_use > sim->counters.peak_bytes_in_use)
    sim->counters.peak_bytes_in_use = sim->bytes_in_use;
  return 0;
}

static int sim_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.reserve_calls;
  sim->call_bytes.reserve += size;
  int err = sim_check_faults(sim, size, "reserve");
  uintptr_t a = 0;
  void *host = NULL;
  if (err == 0) {
    if (sim->host_backed) {
      if ((host = gmr__sim_host_take(sim, size)) == NULL)
        err =
            gmr__error_set(GMR_ENOMEM, "simulated device: host memory for %zu bytes refused", size);
      a = (uintptr_t)host;
    } else {
      /* cudaMalloc hands out 2 MiB-aligned ranges for large sizes.  The
       * reservation is a range of the space's table (no live-range tree). */
      size_t align = size >= sim->base.granularity ? sim->base.granularity : SIM_RESERVE_ALIGN;
      size_t span = size ? gmr__align_up(size, SIM_RESERVE_ALIGN) : SIM_RESERVE_ALIGN;
      const sim_seg_t rec = {.req = size, .aux = (uint32_t)sim->counters.reserve_calls};
      uintptr_t hint = sim->place_next; /* Note [Test controls] */
      sim->place_next = 0;
      if (hint != 0 && hint % SIM_RESERVE_ALIGN == 0 &&
          gmr__sim_space_take_at(&sim->space, hint, span, &rec) == 0)
        a = hint;
      else if (gmr__sim_space_take(&sim->space, span, align, &rec, &a) != 0)
        err = gmr__error_set(GMR_ENOMEM, "simulated device: address space exhausted");
    }
  }
  if (err == 0 && sim->host_backed && (err = live_add(sim, a, size, SIM_RESERVED, 0)) != 0)
    gmr__sim_host_give(sim, host, size);
  if (sim_charge(sim, err, size) == 0) *out_ptr = (void *)a;
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.release_calls;
  sim->call_bytes.release += size;
  int err;
  if (sim->host_backed) {
    if ((err = live_remove(sim, (uintptr_t)ptr, size, SIM_RESERVED)) == 0)
      gmr__sim_host_give(sim, ptr, size);
  } else {
    size_t c, i;
    if (gmr__sim_seg_reserved(&sim->space, (uintptr_t)ptr, size, &c, &i) != NULL) {
      gmr__sim_seg_remove(&sim->space, c, i);
      err = 0;
    } else {
      err = live_missing(SIM_RESERVED, (uintptr_t)ptr, size);
    }
  }
  if (err == 0) sim->bytes_in_use -= size;
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_va_reserve(gmr_backend_t *be, size_t size, void **out_base) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.va_reserve_calls;
  sim->call_bytes.va_reserve += size;
  uintptr_t a = 0;
  int err = sim_check_schedule(sim, size, "virtual reserve");
  if (err != 0) {
  } else if (sim->host_backed) {
    err = gmr__sim_host_va_take(sim, size, &a);
  } else if (gmr__sim_space_take(&sim->space, size, sim->base.granularity, NULL, &a) != 0) {
    err = gmr__error_set(GMR_ENOMEM, "simulated device: address space exhausted");
  }
  if (err == 0 && (err = live_add(sim, a, size, SIM_VA, 0)) != 0) gmr__sim_va_give(sim, a, size);
  if (err == 0) *out_base = (void *)a;
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_va_release(gmr_backend_t *be, void *base, size_t size) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.va_release_calls;
  sim->call_bytes.va_release += size;
  if (use_pending(sim, (uintptr_t)base, size)) ++sim->counters.unsafe_unmaps;
  int err = 0;
  if (mapped_overlaps(sim, (uintptr_t)base, size))
    err = gmr__error_set(GMR_EINVAL, "simulated device: virtual range at %p still has mapped pages",
                         base);
  if (err == 0) err = live_remove(sim, (uintptr_t)base, size, SIM_VA);
  if (err == 0) gmr__sim_va_give(sim, (uintptr_t)base, size);
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.map_calls;
  sim->call_bytes.map += size;
  int err = 0;
  if (!va_contains(sim, (uintptr_t)addr, size) || mapped_overlaps(sim, (uintptr_t)addr, size))
    err = gmr__error_set(GMR_EINVAL,
                         "simulated device: cannot map %zu bytes at %p (outside a virtual range, "
                         "or already mapped)",
                         size, addr);
  if (err == 0) err = sim_check_faults(sim, size, "map");
  /* In the arena, the pages are there already (readable and writable). */
  if (err == 0 && sim->host_backed && !gmr__sim_in_arena(sim, (uintptr_t)addr) &&
      mmap(addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
          MAP_FAILED)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host pages for %zu bytes refused", size);
  if (err == 0) err = live_add(sim, (uintptr_t)addr, size, SIM_MAPPED, 0);
  sim_charge(sim, err, size);
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.unmap_calls;
  sim->call_bytes.unmap += size;
  if (use_pending(sim, (uintptr_t)addr, size)) ++sim->counters.unsafe_unmaps;
  int err = live_remove(sim, (uintptr_t)addr, size, SIM_MAPPED);
  if (err == 0) {
    sim->bytes_in_use -= size;
    if (sim->host_backed && !gmr__sim_in_arena(sim, (uintptr_t)addr))
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

/* Note [Physical pages]. */
static int sim_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  ++sim->counters.page_create_calls;
  sim->call_bytes.page_create += size;
  int err = sim_check_faults(sim, size, "page create");
  size_t slot = sim->n_pages;
  for (size_t i = sim->page_low; err == 0 && i < sim->n_pages; ++i)
    if (sim->pages[i].size == 0 && !sim->pages[i].dying) {
      slot = i;
      break;
    }
  if (err == 0 && slot == sim->n_pages &&
      !gmr__sim_grow((void **)&sim->pages, &sim->cap_pages, sim->n_pages + 1, sizeof *sim->pages))
    err = gmr__error_set(GMR_ENOMEM, "simulated device: out of host memory for its page table");
  int fd = -1;
  if (err == 0 && sim->host_backed && (fd = gmr__sim_page_fd_take(sim, size)) < 0)
    err = gmr__error_set(GMR_ENOMEM, "simulated device: host memory for a %zu-byte page refused",
                         size);
  if (sim_charge(sim, err, size) == 0) {
    if (slot == sim->n_pages) ++sim->n_pages;
    sim->pages[slot] = (sim_page_t){.size = size, .fd = fd};
    sim->page_low = slot + 1;
    ++sim->counters.pages_live;
    *out = (gmr_phys_t)slot + 1;
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
  sim->call_bytes.page_release += size;
  sim_page_t *pg = sim_page(sim, h);
  int err = 0;
  if (pg == NULL || pg->size != size)
    err = gmr__error_set(GMR_EINVAL, "simulated device: no page %llu of %zu bytes to release",
                         (unsigned long long)h, size);
  if (err == 0) {
    bool tracked = sim->host_reuse && h < SIM_PAGES_TRACKED;
    gmr__sim_page_fd_give(sim, pg, tracked);
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
  sim->call_bytes.page_map += size;
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
  sim->call_bytes.set_access += size;
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
  sim->call_bytes.page_unmap += size;
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
    if (gmr__sim_in_arena(sim, (uintptr_t)addr))
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
  if (!gmr__sim_grow((void **)&sim->streams, &sim->cap_streams, sim->n_streams + 1,
                     sizeof *sim->streams))
    return NULL;
  sim_stream_t *st = &sim->streams[sim->n_streams++];
  *st = (sim_stream_t){.id = id};
  return st;
}

/* Does work still queued use any byte of [a, a+size)?  Drops the uses that
 * completed on the way (Note [Queued work and unmapping]).  Called with the lock. */
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

/* ---- host memory and copies (sleep and wake) ----------------------------------- */

/* Note [Simulated copies]
 * Pinned host memory is plain host memory; a copy is a memcpy when the
 * device is host-backed (its addresses are host addresses), and checks that
 * the device side is memory a kernel could touch (gmr__sim_covers) in
 * either mode, so a copy from an unmapped range fails as CUDA's would.  Host
 * allocations and copies follow the fault schedule (gmr_sim_fail_nth), so
 * a sweep can fail each of them; the copies are done when issued (the
 * stream's sync has nothing left to wait for). */
static int sim_host_alloc(gmr_backend_t *be, size_t size, void **out) {
  gmr_sim_t *sim = sim_of(be);
  gmr__lock(&sim->lock);
  int err = sim_check_schedule(sim, size, "pinned host allocation");
  gmr__unlock(&sim->lock);
  if (err != 0) return err;
  void *p = gmr__malloc(size ? size : 1);
  if (p == NULL)
    return gmr__error_set(GMR_ENOMEM, "simulated device: no host memory for %zu pinned bytes",
                          size);
  *out = p;
  return 0;
}

static void sim_host_free(gmr_backend_t *be, void *p, size_t size) {
  (void)be;
  (void)size;
  gmr__free(p);
}

static int sim_copy(gmr_backend_t *be, void *dst, const void *src, size_t size, bool to_host) {
  gmr_sim_t *sim = sim_of(be);
  const void *dev = to_host ? src : dst;
  uint64_t token;
  gmr__lock(&sim->lock);
  int err = sim_check_schedule(sim, size, to_host ? "copy to the host" : "copy to the device");
  if (err == 0 && !covers_locked(sim, dev, size, &token))
    err = gmr__error_set(GMR_EINVAL,
                         "simulated device: copy of %zu bytes at %p: not mapped device memory",
                         size, dev);
  if (err == 0 && sim->host_backed) memcpy(dst, src, size);
  gmr__unlock(&sim->lock);
  return err;
}

static int sim_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                            gmr_stream_t s) {
  (void)s;
  return sim_copy(be, dst, src, size, true);
}

static int sim_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                              gmr_stream_t s) {
  (void)s;
  return sim_copy(be, dst, src, size, false);
}

static void free_reserved(gmr_avl_node_t *n, void *ud) {
  gmr__sim_host_give(ud, (void *)(uintptr_t)n->key, n->val);
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
  gmr__sim_space_clear(&sim->space);
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
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_to_host = sim_copy_to_host,
    .copy_to_device = sim_copy_to_device,
};

int gmr__sim_backend_new(const gmr_sim_options_t *opts, gmr_backend_t **out) {
  uint64_t granularity = opts && opts->granularity ? opts->granularity : SIM_DEFAULT_GRANULARITY;
  if (!gmr__is_pow2(granularity) || granularity < 4096 || granularity > ((uint64_t)1 << 30))
    return gmr__error_set(GMR_EINVAL,
                          "simulated device: granularity %llu is not a power of two "
                          "in [4096, 1 GiB]",
                          (unsigned long long)granularity);
  uint64_t capacity = opts && opts->capacity ? opts->capacity : GMR_SIM_DEFAULT_CAPACITY;
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
  if (!sim->host_backed) { /* Note [Address-only mode] */
    uintptr_t space = (uintptr_t)sim->capacity * SIM_SPACE_PER_BYTE;
    if (space < SIM_SPACE_MIN) space = SIM_SPACE_MIN;
    sim->space.lo = SIM_SPACE_BASE;
    sim->space.hi = SIM_SPACE_BASE + space;
    sim->space.head_gap = space;
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
  if (!sim->host_backed) { /* the fresh, whole space to the device's window (Note [Device windows])
                            */
    size_t space = sim->space.head_gap; /* the one free range */
    if (space > SIM_DEVICE_STRIDE) {
      sim_destroy(*out);
      *out = NULL;
      return gmr__error_set(GMR_EINVAL,
                            "simulated device: an address space of %zu bytes does not fit a "
                            "device's window of %llu bytes",
                            space, (unsigned long long)SIM_DEVICE_STRIDE);
    }
    sim->space.lo += (uintptr_t)device * SIM_DEVICE_STRIDE;
    sim->space.hi += (uintptr_t)device * SIM_DEVICE_STRIDE;
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
  int err = st != NULL && gmr__sim_grow((void **)&sim->uses, &sim->cap_uses, sim->n_uses + 1,
                                        sizeof *sim->uses)
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

/* gmr__sim_covers with the lock held. */
static bool covers_locked(gmr_sim_t *sim, const void *ptr, size_t size, uint64_t *token) {
  uintptr_t a = (uintptr_t)ptr;
  *token = 0;
  if (size == 0 || a + size < a) return false;
  const uintptr_t end = a + size;
  bool ok;
  if (sim->host_backed) {
    gmr_avl_node_t *r = gmr__avl_floor(&sim->reserved, a);
    ok = r != NULL && a - r->key < r->val && size <= r->val - (a - r->key);
    if (ok) *token = (uint64_t)r->aux + 1;
  } else { /* address-only: reservations are ranges of the space's table */
    size_t c, i;
    const sim_seg_t *r =
        gmr__sim_seg_floor(&sim->space, a, &c, &i) ? gmr__sim_seg_at(&sim->space, c, i) : NULL;
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
  return ok;
}

bool gmr__sim_covers(gmr_sim_t *sim, const void *ptr, size_t size, uint64_t *token) {
  gmr__lock(&sim->lock);
  bool ok = covers_locked(sim, ptr, size, token);
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

void gmr__sim_call_bytes(gmr_sim_t *sim, gmr_sim_call_bytes_t *out) {
  gmr__lock(&sim->lock);
  *out = sim->call_bytes;
  gmr__unlock(&sim->lock);
}

void gmr__sim_counters(gmr_sim_t *sim, gmr_sim_counters_t *out) {
  gmr__lock(&sim->lock);
  *out = sim->counters;
  out->bytes_in_use = sim->bytes_in_use;
  gmr__unlock(&sim->lock);
}
