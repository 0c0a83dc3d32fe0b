/* sleep.c: the sleepable face (sleep.h), between a tagged pool's policies
 * and its gate face.
 *
 * It forwards every op, and keeps a record of each range the policies have
 * mapped and of each page handle they created, so that gmr_sleep can unmap
 * them all and gmr_wake map them again at the same addresses, with no
 * policy knowing: Note [The sleepable face], Note [Sleep invariants].
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/sleep.h"
#include "core/avl.h"

/* Note [The sleepable face]
 * A policy holds device memory in three shapes, and the face serves each so
 * that its physical memory can go while its addresses stay:
 *   - map/unmap (expandable segments, bfc growth): recorded as they are;
 *   - reserve/release (cudaMalloc'd segments): served through virtual
 *     memory, a virtual range of the size rounded up to the granularity with
 *     memory mapped into it (so every policy can sleep, and a release gives
 *     the memory back at once; the address stays the pool's, Note [A pool
 *     keeps its addresses] in gate.c);
 *   - page handles (stitch): the policy gets a handle of the face (its
 *     record's address) and the face keeps the device's handle behind it,
 *     which sleep releases and wake creates anew; each page mapping is a
 *     range, with whether set_access covered it.
 * Sleep (with the pool's policy quiesced by the runtime) waits for the
 * device, copies every range that holds contents to host memory when
 * offloading (a range of a page is copied only once access was set),
 * synchronizes, then unmaps every range and releases every page: each
 * range and page turns asleep as its own unmap succeeds, so that no second
 * sleep, and no release by the policy, can give memory back twice.  Wake
 * creates the pages, maps every asleep range, sets access, copies back and
 * synchronizes; any failure undoes what that wake did, so a wake either
 * maps everything or leaves everything asleep with its contents.  A policy
 * that releases an asleep range (its pool destroyed while asleep) is
 * answered 0 with no device call: the memory went at sleep.
 */

/* Note [Sleep invariants]
 *   mapped   = Σ physical bytes of awake ranges and live awake pages
 *   sleeping = Σ physical bytes of asleep ranges and asleep pages
 *   offloaded = Σ bytes of host copies; only asleep ranges hold one
 *   the ranges never overlap; a page range names a recorded page
 * where a map range counts its size, a reservation its rounded span, a
 * page range nothing (its page counts its size once).
 */

typedef enum { SW_MAP = 1, SW_RESERVE = 2, SW_PAGE = 3 } sw_kind_t;

typedef struct sw_page_s {
  gmr_phys_t real;  /* the device's handle (stale while asleep) */
  gmr_phys_t fresh; /* wake: the new handle, until the wake commits */
  size_t size;
  size_t nranges; /* page ranges that map it */
  bool asleep;
  bool released; /* the policy released it while mapped: it lives while mapped */
  struct sw_page_s *prev, *next;
} sw_page_t;

typedef struct sw_range_s {
  uintptr_t addr;
  size_t size; /* as the policy gave it */
  size_t span; /* reserve: the virtual range and the memory mapped into it */
  sw_kind_t kind;
  bool asleep;
  bool access; /* page ranges: set_access covered it */
  bool woke;   /* during a wake: mapped by it */
  sw_page_t *page;
  size_t offset;
  void *host; /* asleep, offloaded: the contents */
  struct sw_range_s *prev, *next;
} sw_range_t;

typedef struct sleep_face_s {
  gmr_backend_t base; /* must be first */
  gmr_backend_ops_t ops;
  gmr_backend_t *real;
  pthread_mutex_t lock; /* guards everything below */
  gmr_avl_t by_addr;    /* range address -> sw_range_t * */
  sw_range_t *ranges;
  sw_page_t *pages;
  uint64_t mapped, sleeping, offloaded, nranges, nsleeping;
  uint64_t sleeps, wakes;
  /* Offload: one pinned buffer per sleep, shared by the ranges' copies
   * (one host allocation instead of one per range), freed with its last. */
  unsigned char *host_buf;
  size_t host_buf_size, host_refs;
  /* Note [Releasing the host copy]: the buffer a wake gave up, while its
   * releaser runs (set and joined under the lock). */
  void *released_buf;
  size_t released_size;
  pthread_t releaser;
  bool releasing;
  /* Note [Keeping the host buffer]: the buffer a wake kept, and whether the
   * last sleep asked for that. */
  unsigned char *kept_buf;
  size_t kept_size;
  bool keep_host;
} sleep_face_t;

static inline sleep_face_t *sf_of(gmr_backend_t *be) {
  return (sleep_face_t *)be;
}
static inline sw_page_t *page_of(gmr_phys_t h) {
  return (sw_page_t *)(uintptr_t)h;
}

/* Physical bytes a range holds of its own. */
static size_t range_bytes(const sw_range_t *r) {
  return r->kind == SW_MAP ? r->size : r->kind == SW_RESERVE ? r->span : 0;
}

/* ---- records (lock held) ---------------------------------------------------------- */

static int range_add(sleep_face_t *f, uintptr_t addr, size_t size, size_t span, sw_kind_t kind,
                     sw_page_t *page, size_t offset) {
  sw_range_t *r = gmr__calloc(1, sizeof *r);
  if (r == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory to record a mapping");
  *r = (sw_range_t){
      .addr = addr, .size = size, .span = span, .kind = kind, .page = page, .offset = offset};
  if (gmr__avl_insert(&f->by_addr, addr, (uint64_t)(uintptr_t)r, 0) != 0) {
    gmr__free(r);
    return gmr__error_set(GMR_ENOMEM, "out of host memory to record a mapping");
  }
  r->next = f->ranges;
  if (f->ranges != NULL) f->ranges->prev = r;
  f->ranges = r;
  if (page != NULL) ++page->nranges;
  f->mapped += range_bytes(r);
  ++f->nranges;
  return 0;
}

static sw_range_t *range_find(sleep_face_t *f, const void *addr, sw_kind_t kind) {
  gmr_avl_node_t *n = gmr__avl_find(&f->by_addr, (uint64_t)(uintptr_t)addr);
  sw_range_t *r = n != NULL ? (sw_range_t *)(uintptr_t)n->val : NULL;
  return r != NULL && r->kind == kind ? r : NULL;
}

static void page_drop(sleep_face_t *f, sw_page_t *p) {
  if (p->prev != NULL) p->prev->next = p->next;
  if (p->next != NULL) p->next->prev = p->prev;
  if (f->pages == p) f->pages = p->next;
  gmr__free(p);
}

/* A page that is released and no longer mapped is gone. */
static bool page_gone(const sw_page_t *p) {
  return p->released && p->nranges == 0;
}

/* Note [Releasing the host copy]
 * Giving the pinned buffer back (unregister and unmap: 77 ms for 4 GiB on
 * the H200, Note [Pinned host memory] in cuda.c) costs as much as the copy
 * back, so a wake that ends with every copy done hands the buffer to a
 * thread of its own and returns: the wake then costs its maps and its copy.
 *   at most one buffer is being released: the next sleep, wake and the
 *   face's destroy join the releaser before going on;
 *   its memory is given back once the releaser ends, not at some later call
 *   (vllm-project/vllm#16663: host memory kept after a wake);
 * Where no thread can be started, the wake releases it itself. */
static void *releaser_main(void *arg) {
  sleep_face_t *f = arg;
  gmr__backend_host_free(f->real, f->released_buf, f->released_size);
  return NULL;
}

/* Wait for the releaser of the last wake, if any (lock held). */
static void releaser_join(sleep_face_t *f) {
  if (!f->releasing) return;
  (void)pthread_join(f->releaser, NULL);
  f->releasing = false;
  f->released_buf = NULL;
  f->released_size = 0;
}

/* r's host copy goes; the buffer with the last copy in it, by the releaser
 * when `background` (Note [Releasing the host copy]). */
static void host_unref_in(sleep_face_t *f, sw_range_t *r, bool background) {
  if (r->host == NULL) return;
  r->host = NULL;
  f->offloaded -= r->size;
  if (--f->host_refs > 0) return;
  void *buf = f->host_buf;
  size_t size = f->host_buf_size;
  f->host_buf = NULL;
  f->host_buf_size = 0;
  if (background && f->keep_host && f->kept_buf == NULL) { /* Note [Keeping the host buffer] */
    f->kept_buf = buf;
    f->kept_size = size;
    return;
  }
  if (background) {
    releaser_join(f);
    f->released_buf = buf;
    f->released_size = size;
    sigset_t all, old; /* the releaser takes none of the process's signals */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    f->releasing = pthread_create(&f->releaser, NULL, releaser_main, f) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (f->releasing) return;
    f->released_buf = NULL;
    f->released_size = 0;
  }
  gmr__backend_host_free(f->real, buf, size);
}

static void host_unref(sleep_face_t *f, sw_range_t *r) {
  host_unref_in(f, r, false);
}

/* Note [Keeping the host buffer]
 * Pinning host memory costs about ten times copying into it (0.73-0.89 s
 * against 78 ms for 4 GiB on the H200), so a tag that sleeps and wakes in
 * a loop (a trainer and an inference engine taking turns) may ask, with
 * GMR_SLEEP_KEEP_HOST, that its wake keep the buffer:
 *   kept_buf != NULL  =>  host_buf == NULL and no range holds a copy;
 *   a sleep takes the kept buffer when it is large enough for the copies
 *   (else gives it back and pins a new one), so at most one is held;
 *   a wake after a sleep without the flag releases it (in the background,
 *   Note [Releasing the host copy]); a sleep with GMR_SLEEP_DISCARD and the
 *   face's destroy give it back.
 * The kept bytes are host memory held while awake, reported apart from the
 * offloaded ones (host_kept_bytes). */
static void kept_drop(sleep_face_t *f) {
  if (f->kept_buf == NULL) return;
  gmr__backend_host_free(f->real, f->kept_buf, f->kept_size);
  f->kept_buf = NULL;
  f->kept_size = 0;
}

/* Forget r (its memory is gone, or was given back); its host copy goes. */
static void range_drop(sleep_face_t *f, sw_range_t *r) {
  (void)gmr__avl_erase(&f->by_addr, r->addr);
  if (r->prev != NULL) r->prev->next = r->next;
  if (r->next != NULL) r->next->prev = r->prev;
  if (f->ranges == r) f->ranges = r->next;
  if (r->asleep) {
    f->sleeping -= range_bytes(r);
    --f->nsleeping;
  } else {
    f->mapped -= range_bytes(r);
  }
  --f->nranges;
  host_unref(f, r);
  sw_page_t *p = r->page;
  if (p != NULL && --p->nranges == 0 && p->released) page_drop(f, p); /* out of the figures */
  gmr__free(r);
}

/* ---- the policies' ops -------------------------------------------------------------- */

static int sf_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out) {
  sleep_face_t *f = sf_of(be);
  size_t span = gmr__align_up(size, be->granularity);
  void *base = NULL;
  int err = gmr__backend_va_reserve(f->real, span, &base);
  if (err != 0) return err;
  err = gmr__backend_map(f->real, base, span, s);
  if (err == 0) {
    pthread_mutex_lock(&f->lock);
    err = range_add(f, (uintptr_t)base, size, span, SW_RESERVE, NULL, 0);
    pthread_mutex_unlock(&f->lock);
    if (err != 0) (void)gmr__backend_unmap(f->real, base, span, s);
  }
  if (err != 0) {
    (void)gmr__backend_va_release(f->real, base, span);
    return err;
  }
  *out = base;
  return 0;
}

static int sf_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  sleep_face_t *f = sf_of(be);
  pthread_mutex_lock(&f->lock);
  sw_range_t *r = range_find(f, ptr, SW_RESERVE);
  int err = 0;
  if (r == NULL || r->size != size)
    err = gmr__error_set(GMR_EINVAL, "release of %zu bytes at %p: no such reservation", size, ptr);
  size_t span = r != NULL ? r->span : 0;
  if (err == 0 && !r->asleep) err = gmr__backend_unmap(f->real, ptr, span, s);
  if (err == 0) range_drop(f, r);
  pthread_mutex_unlock(&f->lock);
  if (err == 0) (void)gmr__backend_va_release(f->real, ptr, span);
  return err;
}

static int sf_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  sleep_face_t *f = sf_of(be);
  int err = gmr__backend_map(f->real, addr, size, s);
  if (err != 0) return err;
  pthread_mutex_lock(&f->lock);
  err = range_add(f, (uintptr_t)addr, size, size, SW_MAP, NULL, 0);
  pthread_mutex_unlock(&f->lock);
  if (err != 0) (void)gmr__backend_unmap(f->real, addr, size, s);
  return err;
}

static int sf_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  sleep_face_t *f = sf_of(be);
  pthread_mutex_lock(&f->lock);
  sw_range_t *r = range_find(f, addr, SW_MAP);
  int err = 0;
  if (r == NULL || r->size != size)
    err = gmr__error_set(GMR_EINVAL, "unmap of %zu bytes at %p: no such mapping", size, addr);
  if (err == 0 && !r->asleep) err = gmr__backend_unmap(f->real, addr, size, s);
  if (err == 0) range_drop(f, r);
  pthread_mutex_unlock(&f->lock);
  return err;
}

static int sf_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  sleep_face_t *f = sf_of(be);
  sw_page_t *p = gmr__calloc(1, sizeof *p);
  if (p == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory to record a page");
  int err = gmr__backend_phys_create(f->real, size, &p->real);
  if (err != 0) {
    gmr__free(p);
    return err;
  }
  p->size = size;
  pthread_mutex_lock(&f->lock);
  p->next = f->pages;
  if (f->pages != NULL) f->pages->prev = p;
  f->pages = p;
  f->mapped += size;
  pthread_mutex_unlock(&f->lock);
  *out = (gmr_phys_t)(uintptr_t)p;
  return 0;
}

static int sf_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  sleep_face_t *f = sf_of(be);
  sw_page_t *p = page_of(h);
  pthread_mutex_lock(&f->lock);
  int err = 0;
  if (p == NULL || p->size != size || p->released)
    err = gmr__error_set(GMR_EINVAL, "release of a %zu-byte page: no such page", size);
  if (err == 0 && !p->asleep) err = gmr__backend_phys_release(f->real, p->real, size);
  if (err == 0) {
    /* A released page's memory lives while it is mapped; its bytes leave
     * the figures now, as the device's counters see it. */
    if (p->asleep)
      f->sleeping -= size;
    else
      f->mapped -= size;
    p->released = true;
    if (page_gone(p)) page_drop(f, p);
  }
  pthread_mutex_unlock(&f->lock);
  return err;
}

static int sf_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t off) {
  sleep_face_t *f = sf_of(be);
  sw_page_t *p = page_of(h);
  pthread_mutex_lock(&f->lock);
  int err = p == NULL || p->asleep || p->released
                ? gmr__error_set(GMR_EINVAL, "page map at %p: no such page", addr)
                : gmr__backend_phys_map(f->real, addr, size, p->real, off);
  if (err == 0) {
    err = range_add(f, (uintptr_t)addr, size, 0, SW_PAGE, p, off);
    if (err != 0) (void)gmr__backend_phys_unmap(f->real, addr, size);
  }
  pthread_mutex_unlock(&f->lock);
  return err;
}

static int sf_set_access(gmr_backend_t *be, void *addr, size_t size) {
  sleep_face_t *f = sf_of(be);
  pthread_mutex_lock(&f->lock);
  int err = gmr__backend_set_access(f->real, addr, size);
  /* [addr, addr + size) is tiled by page ranges (the device checked it). */
  for (uintptr_t at = (uintptr_t)addr, end = at + size; err == 0 && at < end;) {
    sw_range_t *r = range_find(f, (void *)at, SW_PAGE);
    if (r == NULL) break;
    r->access = true;
    at += r->size;
  }
  pthread_mutex_unlock(&f->lock);
  return err;
}

static int sf_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  sleep_face_t *f = sf_of(be);
  pthread_mutex_lock(&f->lock);
  sw_range_t *r = range_find(f, addr, SW_PAGE);
  int err = 0;
  if (r == NULL || r->size != size)
    err = gmr__error_set(GMR_EINVAL, "page unmap of %zu bytes at %p: no such mapping", size, addr);
  if (err == 0 && !r->asleep) err = gmr__backend_phys_unmap(f->real, addr, size);
  if (err == 0) range_drop(f, r);
  pthread_mutex_unlock(&f->lock);
  return err;
}

/* The pool goes: its policies gave back what was awake; asleep records and
 * host copies go here. */
static void sf_destroy(gmr_backend_t *be) {
  sleep_face_t *f = sf_of(be);
  releaser_join(f);
  kept_drop(f);
  while (f->ranges != NULL)
    range_drop(f, f->ranges);
  while (f->pages != NULL)
    page_drop(f, f->pages);
  gmr__avl_clear(&f->by_addr, NULL, NULL);
  pthread_mutex_destroy(&f->lock);
  gmr__backend_free(f->real);
  gmr__free(f);
}

/* An op the device lacks stays NULL; the ops the face does not change are
 * the plain forwarders (backend.h), which reach f->real through forwards_to. */
#define SF_SLOT(slot, fn) f->ops.slot = d->slot ? fn : NULL

int gmr__sleep_face_new(gmr_backend_t *real, gmr_backend_t **out) {
  if (!gmr__backend_has_vmm(real)) {
    const char *name = real->ops->name;
    gmr__backend_free(real);
    return gmr__error_set(GMR_ENOTSUP,
                          "sleep and wake need the device's virtual memory calls "
                          "(cuMemAddressReserve, cuMemMap), which the %s backend lacks",
                          name);
  }
  sleep_face_t *f = gmr__calloc(1, sizeof *f);
  if (f == NULL || pthread_mutex_init(&f->lock, NULL) != 0) {
    gmr__free(f);
    gmr__backend_free(real);
    return gmr__error_set(GMR_ENOMEM, "out of host memory for a sleepable pool");
  }
  const gmr_backend_ops_t *d = real->ops;
  f->ops.name = d->name;
  f->ops.reserve = sf_reserve; /* served through virtual memory */
  f->ops.release = sf_release;
  SF_SLOT(va_reserve, gmr__backend_forward_va_reserve);
  SF_SLOT(va_release, gmr__backend_forward_va_release);
  SF_SLOT(map, sf_map);
  SF_SLOT(unmap, sf_unmap);
  SF_SLOT(mem_info, gmr__backend_forward_mem_info);
  SF_SLOT(device_id, gmr__backend_forward_device_id);
  SF_SLOT(phys_create, sf_phys_create);
  SF_SLOT(phys_release, sf_phys_release);
  SF_SLOT(phys_map, sf_phys_map);
  SF_SLOT(set_access, sf_set_access);
  SF_SLOT(phys_unmap, sf_phys_unmap);
  SF_SLOT(stream_capturing, gmr__backend_forward_stream_capturing);
  SF_SLOT(event_record, gmr__backend_forward_event_record);
  SF_SLOT(event_query, gmr__backend_forward_event_query);
  SF_SLOT(event_sync, gmr__backend_forward_event_sync);
  SF_SLOT(event_destroy, gmr__backend_forward_event_destroy);
  SF_SLOT(stream_sync, gmr__backend_forward_stream_sync);
  SF_SLOT(device_sync, gmr__backend_forward_device_sync);
  SF_SLOT(now_ns, gmr__backend_forward_now_ns);
  SF_SLOT(host_alloc, gmr__backend_forward_host_alloc);
  SF_SLOT(host_free, gmr__backend_forward_host_free);
  SF_SLOT(copy_to_host, gmr__backend_forward_copy_to_host);
  SF_SLOT(copy_to_device, gmr__backend_forward_copy_to_device);
  f->ops.destroy = sf_destroy;
  f->base.ops = &f->ops;
  f->base.granularity = real->granularity;
  f->base.device = real->device;
  f->base.forwards_to = real;
  f->real = real;
  *out = &f->base;
  return 0;
}

gmr_backend_t *gmr__sleep_face_find(gmr_backend_t *be) {
  for (; be != NULL; be = be->forwards_to)
    if (be->ops->destroy == sf_destroy) return be;
  return NULL;
}

/* ---- sleep ------------------------------------------------------------------------------ */

/* Bytes of r that hold contents worth keeping (a page range without access
 * holds none that a kernel could have written). */
static size_t range_contents(const sw_range_t *r) {
  return r->kind == SW_PAGE && !r->access ? 0 : r->size;
}

/* Give back the host copies made by a sleep that failed before unmapping. */
static void copies_drop(sleep_face_t *f) {
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next)
    if (!r->asleep) host_unref(f, r);
}

#define HOST_ALIGN 256 /* each range's copy starts on its own 256 bytes */

/* Note [Runs of ranges]
 * stitch maps a tag page by page: GPT-2 medium's 4.3 GB is some 2,000
 * ranges, and a wake that set access and copied range by range spent 2.8x
 * the copy (225 ms against 80 ms on the H200).  So the copies and the
 * access go by runs: ranges in address order, each starting where the one
 * before ends, copied in one call when their host copies are contiguous too
 * (the host buffer is laid out in address order, each copy 256-aligned, so
 * a run breaks only after a size that is not a multiple of 256), access set
 * in one call over a run of page ranges that need it.  A reservation's
 * range (served through virtual memory for a policy that reserves segments)
 * is its own virtual range, so it runs alone: two of them that happen to lie
 * side by side are two address reservations, which no one call spans. */
static int by_addr_cmp(const void *a, const void *b) {
  uintptr_t x = (*(sw_range_t *const *)a)->addr, y = (*(sw_range_t *const *)b)->addr;
  return x < y ? -1 : x > y;
}

/* The ranges that `want` picks, in address order, in a new array (*n of
 * them); NULL with *n == 0 when none, NULL with GMR_ENOMEM set otherwise. */
static sw_range_t **ranges_sorted(sleep_face_t *f, bool (*want)(const sw_range_t *), size_t *n,
                                  int *err) {
  size_t k = 0;
  *n = 0;
  *err = 0;
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next)
    k += want(r);
  if (k == 0) return NULL;
  sw_range_t **v = gmr__malloc(k * sizeof *v);
  if (v == NULL) {
    *err = gmr__error_set(GMR_ENOMEM, "out of host memory to order %zu ranges", k);
    return NULL;
  }
  k = 0;
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next)
    if (want(r)) v[k++] = r;
  qsort(v, k, sizeof *v, by_addr_cmp);
  *n = k;
  return v;
}

/* Where the run that starts at v[i] ends (one past its last range):
 * contiguous addresses and, with `host`, contiguous host copies. */
static size_t run_end(sw_range_t *const *v, size_t n, size_t i, bool host) {
  size_t j = i + 1;
  for (; j < n; ++j) {
    const sw_range_t *a = v[j - 1], *b = v[j];
    if (a->kind == SW_RESERVE || b->kind == SW_RESERVE) break; /* each its own reservation */
    if (a->addr + a->size != b->addr) break;
    if (host &&
        (a->host == NULL || b->host == NULL || (const unsigned char *)a->host + a->size != b->host))
      break;
  }
  return j;
}

static bool awake_with_contents(const sw_range_t *r) {
  return !r->asleep && range_contents(r) > 0;
}

static int offload(sleep_face_t *f, gmr_stream_t s) {
  size_t total = 0;
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next)
    if (awake_with_contents(r)) total += gmr__align_up(r->size, HOST_ALIGN);
  if (total == 0) return 0;
  if (f->host_buf != NULL) /* a sleep that failed part-way kept copies: none shares theirs */
    return gmr__error_set(GMR_EBUSY, "ranges still keep host copies of a sleep that failed "
                                     "part-way: wake first");
  void *buf = NULL;
  size_t size = total;
  int err = 0;
  if (f->kept_buf != NULL && f->kept_size >= total) { /* Note [Keeping the host buffer] */
    buf = f->kept_buf;
    size = f->kept_size;
    f->kept_buf = NULL;
    f->kept_size = 0;
  } else {
    kept_drop(f);
    err = gmr__backend_host_alloc(f->real, total, &buf);
  }
  if (err != 0) return err;
  f->host_buf = buf;
  f->host_buf_size = size;
  size_t n = 0;
  sw_range_t **v = ranges_sorted(f, awake_with_contents, &n, &err);
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) { /* the host buffer in address order */
    v[i]->host = f->host_buf + at;
    at += gmr__align_up(v[i]->size, HOST_ALIGN);
    ++f->host_refs;
    f->offloaded += v[i]->size;
  }
  for (size_t i = 0, j; i < n && err == 0; i = j) { /* Note [Runs of ranges] */
    j = run_end(v, n, i, true);
    size_t bytes = v[j - 1]->addr + v[j - 1]->size - v[i]->addr;
    err = gmr__backend_copy_to_host(f->real, v[i]->host, (const void *)v[i]->addr, bytes, s);
  }
  gmr__free(v);
  if (err == 0) err = gmr__backend_stream_sync(f->real, s);
  if (err != 0) copies_drop(f);
  if (err != 0 && f->host_buf != NULL) { /* ordering failed before any copy was taken */
    gmr__backend_host_free(f->real, f->host_buf, f->host_buf_size);
    f->host_buf = NULL;
    f->host_buf_size = 0;
  }
  return err;
}

int gmr__sleep_face_sleep(gmr_backend_t *be, bool keep, bool keep_host, gmr_stream_t s,
                          uint64_t *released) {
  sleep_face_t *f = sf_of(be);
  *released = 0;
  pthread_mutex_lock(&f->lock);
  releaser_join(f);
  f->keep_host = keep && keep_host;
  if (!keep) kept_drop(f);
  int err = gmr__backend_device_sync(f->real); /* no kernel may still use the memory */
  if (err == 0 && keep) err = offload(f, s);
  for (sw_range_t *r = f->ranges; r != NULL && err == 0; r = r->next) {
    if (r->asleep) continue;
    if (r->kind == SW_PAGE)
      err = gmr__backend_phys_unmap(f->real, (void *)r->addr, r->size);
    else
      err = gmr__backend_unmap(f->real, (void *)r->addr, r->span, s);
    if (err != 0) break;
    r->asleep = true;
    f->mapped -= range_bytes(r);
    f->sleeping += range_bytes(r);
    *released += range_bytes(r);
    ++f->nsleeping;
  }
  for (sw_page_t *p = f->pages; p != NULL && err == 0; p = p->next) {
    if (p->asleep) continue;
    if (p->released) { /* its memory went with its last mapping */
      p->asleep = true;
      continue;
    }
    err = gmr__backend_phys_release(f->real, p->real, p->size);
    if (err != 0) break;
    p->asleep = true;
    f->mapped -= p->size;
    f->sleeping += p->size;
    *released += p->size;
  }
  if (err != 0) copies_drop(f); /* ranges still mapped keep their contents there */
  if (err == 0) ++f->sleeps;
  pthread_mutex_unlock(&f->lock);
  return err;
}

/* ---- wake ------------------------------------------------------------------------------- */

/* Undo what a failed wake mapped and created. */
static void wake_undo(sleep_face_t *f, gmr_stream_t s) {
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next) {
    if (!r->woke) continue;
    if (r->kind == SW_PAGE)
      (void)gmr__backend_phys_unmap(f->real, (void *)r->addr, r->size);
    else
      (void)gmr__backend_unmap(f->real, (void *)r->addr, r->span, s);
    r->woke = false;
  }
  for (sw_page_t *p = f->pages; p != NULL; p = p->next)
    if (p->fresh != 0) {
      (void)gmr__backend_phys_release(f->real, p->fresh, p->size);
      p->fresh = 0;
    }
}

static bool woke_page_with_access(const sw_range_t *r) {
  return r->woke && r->kind == SW_PAGE && r->access;
}

static bool woke_with_copy(const sw_range_t *r) {
  return r->woke && r->host != NULL;
}

static int wake_map(sleep_face_t *f, gmr_stream_t s) {
  int err = 0;
  for (sw_page_t *p = f->pages; p != NULL && err == 0; p = p->next)
    if (p->asleep && (!p->released || p->nranges > 0))
      err = gmr__backend_phys_create(f->real, p->size, &p->fresh);
  for (sw_range_t *r = f->ranges; r != NULL && err == 0; r = r->next) {
    if (!r->asleep) continue;
    if (r->kind == SW_PAGE)
      err = gmr__backend_phys_map(f->real, (void *)r->addr, r->size, r->page->fresh, r->offset);
    else
      err = gmr__backend_map(f->real, (void *)r->addr, r->span, s);
    if (err == 0) r->woke = true;
  }
  size_t n = 0;
  sw_range_t **v = err == 0 ? ranges_sorted(f, woke_page_with_access, &n, &err) : NULL;
  for (size_t i = 0, j; i < n && err == 0; i = j) { /* Note [Runs of ranges] */
    j = run_end(v, n, i, false);
    err = gmr__backend_set_access(f->real, (void *)v[i]->addr,
                                  v[j - 1]->addr + v[j - 1]->size - v[i]->addr);
  }
  gmr__free(v);
  v = err == 0 ? ranges_sorted(f, woke_with_copy, &n, &err) : NULL;
  for (size_t i = 0, j; i < n && err == 0; i = j) {
    j = run_end(v, n, i, true);
    err = gmr__backend_copy_to_device(f->real, (void *)v[i]->addr, v[i]->host,
                                      v[j - 1]->addr + v[j - 1]->size - v[i]->addr, s);
  }
  gmr__free(v);
  if (err == 0) err = gmr__backend_stream_sync(f->real, s);
  return err;
}

int gmr__sleep_face_wake(gmr_backend_t *be, gmr_stream_t s, uint64_t *taken) {
  sleep_face_t *f = sf_of(be);
  *taken = 0;
  pthread_mutex_lock(&f->lock);
  releaser_join(f);
  int err = f->nsleeping == 0 && f->sleeping == 0 ? 0 : wake_map(f, s);
  if (err != 0) {
    wake_undo(f, s);
    pthread_mutex_unlock(&f->lock);
    return err;
  }
  for (sw_page_t *p = f->pages; p != NULL; p = p->next) {
    if (!p->asleep) continue;
    p->real = p->fresh;
    p->fresh = 0;
    p->asleep = false;
    if (p->released) { /* released while mapped: its mappings hold it again */
      if (p->real != 0) (void)gmr__backend_phys_release(f->real, p->real, p->size);
      continue;
    }
    f->sleeping -= p->size;
    f->mapped += p->size;
    *taken += p->size;
  }
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next) {
    if (!r->woke) continue;
    r->woke = false;
    r->asleep = false;
    --f->nsleeping;
    f->sleeping -= range_bytes(r);
    f->mapped += range_bytes(r);
    *taken += range_bytes(r);
    host_unref_in(f, r, true); /* every copy back is done: wake_map synchronized */
  }
  ++f->wakes;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

/* ---- figures and checks ------------------------------------------------------------------ */

void gmr__sleep_face_figures(gmr_backend_t *be, gmr_sleep_figures_t *out) {
  sleep_face_t *f = sf_of(be);
  pthread_mutex_lock(&f->lock);
  *out = (gmr_sleep_figures_t){.mapped_bytes = f->mapped,
                               .sleeping_bytes = f->sleeping,
                               .offloaded_bytes = f->offloaded,
                               .ranges = f->nranges,
                               .sleeping_ranges = f->nsleeping,
                               .sleeps = f->sleeps,
                               .wakes = f->wakes,
                               .host_kept_bytes = f->kept_size};
  pthread_mutex_unlock(&f->lock);
}

#define SF_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      err = gmr__error_set(GMR_EINVAL, "sleepable pool: " __VA_ARGS__);                            \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

/* see Note [Sleep invariants] */
int gmr__sleep_face_check(gmr_backend_t *be) {
  sleep_face_t *f = sf_of(be);
  int err = 0;
  uint64_t mapped = 0, sleeping = 0, offloaded = 0, n = 0, nsleeping = 0;
  pthread_mutex_lock(&f->lock);
  for (sw_page_t *p = f->pages; p != NULL; p = p->next) {
    SF_CHECK(p->fresh == 0, "a page keeps a handle of a wake that ended");
    SF_CHECK(!page_gone(p), "a released page that nothing maps is still recorded");
    if (p->released) continue;
    if (p->asleep)
      sleeping += p->size;
    else
      mapped += p->size;
  }
  for (sw_range_t *r = f->ranges; r != NULL; r = r->next) {
    ++n;
    SF_CHECK(!r->woke, "the range at %p is marked by a wake that ended", (void *)r->addr);
    SF_CHECK(r->asleep || r->host == NULL, "the mapped range at %p holds a host copy",
             (void *)r->addr);
    SF_CHECK(r->kind != SW_PAGE || r->page != NULL, "the page range at %p names no page",
             (void *)r->addr);
    SF_CHECK(r->kind != SW_PAGE || r->asleep == r->page->asleep,
             "the page range at %p and its page disagree on being asleep", (void *)r->addr);
    gmr_avl_node_t *node = gmr__avl_find(&f->by_addr, r->addr);
    SF_CHECK(node != NULL && node->val == (uint64_t)(uintptr_t)r,
             "the range at %p is missing from the address index", (void *)r->addr);
    gmr_avl_node_t *below = r->addr > 0 ? gmr__avl_floor(&f->by_addr, r->addr - 1) : NULL;
    if (below != NULL) {
      const sw_range_t *b = (const sw_range_t *)(uintptr_t)below->val;
      size_t blen = b->kind == SW_RESERVE ? b->span : b->size;
      SF_CHECK(b->addr + blen <= r->addr, "the ranges at %p and %p overlap", (void *)b->addr,
               (void *)r->addr);
    }
    if (r->asleep) {
      ++nsleeping;
      sleeping += range_bytes(r);
    } else {
      mapped += range_bytes(r);
    }
    if (r->host != NULL) offloaded += r->size;
  }
  SF_CHECK(n == f->nranges && n == f->by_addr.count, "%llu ranges listed, %llu counted",
           (unsigned long long)n, (unsigned long long)f->nranges);
  SF_CHECK(nsleeping == f->nsleeping, "%llu ranges asleep, %llu counted",
           (unsigned long long)nsleeping, (unsigned long long)f->nsleeping);
  SF_CHECK(mapped == f->mapped, "%llu bytes mapped, %llu counted", (unsigned long long)mapped,
           (unsigned long long)f->mapped);
  SF_CHECK(sleeping == f->sleeping, "%llu bytes asleep, %llu counted", (unsigned long long)sleeping,
           (unsigned long long)f->sleeping);
  SF_CHECK(offloaded == f->offloaded, "%llu bytes offloaded, %llu counted",
           (unsigned long long)offloaded, (unsigned long long)f->offloaded);
  SF_CHECK((f->host_refs == 0) == (f->host_buf == NULL) && (offloaded == 0) == (f->host_refs == 0),
           "the host buffer and the copies in it disagree");
  SF_CHECK((f->kept_buf == NULL) == (f->kept_size == 0) &&
               (f->kept_buf == NULL || f->host_buf == NULL),
           "a kept host buffer beside one in use"); /* Note [Keeping the host buffer] */
out:
  pthread_mutex_unlock(&f->lock);
  return err;
}
