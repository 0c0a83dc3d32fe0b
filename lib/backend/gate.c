/* gate.c: the gate between a runtime's policies and its device (gate.h):
 * capture-safe device calls and the memory fraction.
 *
 * Every op is forwarded to the device; the gate changes only what a capture
 * forbids (Note [Calls during capture]) and refuses reservations past the
 * fraction (Note [The fraction]).  A runtime has one gate; its private pools
 * reach it through borrowed faces, which share the state and own nothing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/gate.h"

/* Note [Calls during capture]
 * While a CUDA graph is captured, a call that waits for, or asks about, work
 * on the device invalidates the capture (cudaEventQuery, cudaEventSynchronize,
 * cudaStreamSynchronize, cudaDeviceSynchronize, and cudaFree, which
 * synchronizes), so PyTorch's allocator defers its event processing while a
 * capture is underway.  Between gmr__gate_capture_begin and the last
 * gmr__gate_capture_end the gate:
 *   - answers "not ready" (1) to every event query, without a device call:
 *     a block freed on another stream stays pending until after the capture;
 *   - records no event: event_record hands out a deferred event (the pointer
 *     to a gate_event_t, tagged with its low bit), recorded on its stream at
 *     the end; until then it is "not ready";
 *   - refuses event, stream and device waits with GMR_EDEVICE and a sentence;
 *   - defers `release` (cudaFree) to the end, counting the range as held;
 *   - forwards the rest: reservations (the CUDA backend makes them in relaxed
 *     capture mode), page maps and unmaps, which are not stream work.
 */

/* Note [A pool keeps its addresses]
 * A CUDA graph replays into the addresses it was captured with, so no
 * address a private pool ever handed out may reach another allocation while
 * the pool lives: not through its policy's cache (the pool has a policy of
 * its own) and not through the device (a cudaFree'd range that cudaMalloc
 * hands out again, a virtual range freed and reserved again).  A pool's face
 * of the gate (gmr__gate_borrow) therefore holds every release and virtual
 * release until the face is destroyed with its pool; pages unmapped inside
 * the pool's own virtual ranges go back at once, their addresses staying
 * the pool's.  The bytes held count against the fraction until released.
 */

/* Note [The fraction]
 * gmr__gate_set_fraction(f) sets allowed = floor(f x total); a reserve, map
 * or page creation of n bytes succeeds only if held + n <= allowed, else it
 * fails as out of memory before reaching the device (the policy then frees
 * its cache and retries, as on a full device).  mem_info reports
 * free = min(device free, allowed - held), so the policy's OOM text says what
 * is really left.  f = 1 sets allowed = 0: no fraction.
 */

typedef struct gate_event_s {
  _Atomic(gmr_event_t) real; /* NULL until recorded at the capture's end */
  gmr_stream_t stream;
  _Atomic int state; /* EV_DEFERRED, EV_RECORDED, EV_WAITED (recording failed: waited instead) */
  bool dead;         /* destroyed while deferred: freed at the end */
  struct gate_event_s *next;
} gate_event_t;

enum { EV_DEFERRED = 0, EV_RECORDED = 1, EV_WAITED = 2 };

typedef struct deferred_release_s {
  void *ptr;
  size_t size;
  gmr_stream_t stream;
  bool virtual_range; /* a va_release, not a release */
} deferred_release_t;

typedef struct gate_state_s {
  pthread_mutex_t lock; /* guards the lists and `depth`'s changes */
  _Atomic int depth;    /* captures underway */
  gate_event_t *events; /* deferred, newest first */
  deferred_release_t *releases;
  size_t nreleases, capreleases;
  _Atomic uint64_t held;    /* see the invariant in gate.h */
  _Atomic uint64_t allowed; /* 0: no fraction */
  double fraction;          /* 1.0: none (under `lock`) */
  gmr_backend_t *device;
} gate_state_t;

typedef struct gate_s {
  gmr_backend_t base; /* base.forwards_to == the device */
  gmr_backend_ops_t ops;
  gate_state_t *st;
  bool owner; /* the first face: owns the state and the device */
  /* A pool's face keeps its address space (Note [A pool keeps its
   * addresses]): releases and virtual releases, made when it is destroyed. */
  bool keeps_space;
  deferred_release_t *kept;
  size_t nkept, capkept;
} gate_t;

static inline gate_state_t *st_of(gmr_backend_t *be) {
  return ((gate_t *)be)->st;
}
static inline gmr_backend_t *dev_of(gmr_backend_t *be) {
  return st_of(be)->device;
}
static inline bool capturing(const gate_state_t *st) {
  return atomic_load_explicit(&st->depth, memory_order_acquire) > 0;
}
static inline bool is_deferred(gmr_event_t ev) {
  return ((uintptr_t)ev & 1u) != 0;
}
static inline gate_event_t *deferred_of(gmr_event_t ev) {
  return (gate_event_t *)((uintptr_t)ev & ~(uintptr_t)1);
}

/* ---- the fraction: held bytes ------------------------------------------------ */

/* Count n more bytes held, or refuse them past the fraction. */
static int hold(gate_state_t *st, size_t n) {
  uint64_t before = atomic_fetch_add(&st->held, n);
  uint64_t allowed = atomic_load_explicit(&st->allowed, memory_order_relaxed);
  if (allowed == 0 || before + n <= allowed) return 0;
  atomic_fetch_sub(&st->held, n);
  char want[32], cap[32], held[32];
  gmr__format_size(n, want, sizeof want);
  gmr__format_size(allowed, cap, sizeof cap);
  gmr__format_size(before, held, sizeof held);
  return gmr__error_set(GMR_ENOMEM,
                        "the memory fraction %.3g of device %d is reached: %s allowed, %s held, "
                        "%s more asked",
                        st->fraction, st->device->device, cap, held, want);
}

static inline void unhold(gate_state_t *st, size_t n) {
  atomic_fetch_sub(&st->held, n);
}

static int gate_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  gate_state_t *st = st_of(be);
  int err = hold(st, size);
  if (err != 0) return err;
  err = st->device->ops->reserve(st->device, size, s, out_ptr);
  if (err != 0) unhold(st, size);
  return err;
}

static int defer_release(gate_state_t *st, void *ptr, size_t size, gmr_stream_t s) {
  if (st->nreleases == st->capreleases) {
    size_t cap = st->capreleases ? st->capreleases * 2 : 16;
    deferred_release_t *n = gmr__realloc(st->releases, cap * sizeof *n);
    if (n == NULL) return GMR_ENOMEM;
    st->releases = n;
    st->capreleases = cap;
  }
  st->releases[st->nreleases++] = (deferred_release_t){ptr, size, s, false};
  return 0;
}

/* Keep a release or a virtual release of a pool's face for its end
 * (Note [A pool keeps its addresses]). */
static int keep(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s, bool virtual_range) {
  gate_t *g = (gate_t *)be;
  gate_state_t *st = g->st;
  int err = 0;
  pthread_mutex_lock(&st->lock);
  if (g->nkept == g->capkept) {
    size_t cap = g->capkept ? g->capkept * 2 : 16;
    deferred_release_t *n = gmr__realloc(g->kept, cap * sizeof *n);
    if (n == NULL) err = GMR_ENOMEM;
    if (n != NULL) g->kept = n, g->capkept = cap;
  }
  if (err == 0) g->kept[g->nkept++] = (deferred_release_t){ptr, size, s, virtual_range};
  pthread_mutex_unlock(&st->lock);
  return err;
}

static int gate_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  gate_state_t *st = st_of(be);
  if (((gate_t *)be)->keeps_space && keep(be, ptr, size, s, false) == 0) return 0;
  if (GMR_UNLIKELY(capturing(st))) {
    pthread_mutex_lock(&st->lock);
    int err = capturing(st) ? defer_release(st, ptr, size, s) : 1;
    pthread_mutex_unlock(&st->lock);
    if (err == 0) return 0;
    if (err == GMR_ENOMEM)
      return gmr__error_set(GMR_EDEVICE,
                            "cannot give %p back during a CUDA graph capture: out "
                            "of host memory to defer it",
                            ptr);
  }
  int err = st->device->ops->release(st->device, ptr, size, s);
  if (err == 0) unhold(st, size);
  return err;
}

static int gate_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  gate_state_t *st = st_of(be);
  int err = hold(st, size);
  if (err != 0) return err;
  err = st->device->ops->map(st->device, addr, size, s);
  if (err != 0) unhold(st, size);
  return err;
}

static int gate_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  gate_state_t *st = st_of(be);
  int err = st->device->ops->unmap(st->device, addr, size, s);
  if (err == 0) unhold(st, size);
  return err;
}

static int gate_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  gate_state_t *st = st_of(be);
  int err = hold(st, size);
  if (err != 0) return err;
  err = st->device->ops->phys_create(st->device, size, out);
  if (err != 0) unhold(st, size);
  return err;
}

static int gate_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  gate_state_t *st = st_of(be);
  int err = st->device->ops->phys_release(st->device, h, size);
  if (err == 0) unhold(st, size);
  return err;
}

static int gate_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  gate_state_t *st = st_of(be);
  size_t f = 0, t = 0;
  int err = st->device->ops->mem_info(st->device, &f, &t);
  if (err != 0) return err;
  uint64_t allowed = atomic_load_explicit(&st->allowed, memory_order_relaxed);
  if (allowed != 0) {
    uint64_t held = atomic_load_explicit(&st->held, memory_order_relaxed);
    uint64_t left = held < allowed ? allowed - held : 0;
    if (left < f) f = (size_t)left;
  }
  *out_free = f;
  *out_total = t;
  return 0;
}

/* ---- events and waits (Note [Calls during capture]) ----------------------------- */

static int gate_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev) {
  gate_state_t *st = st_of(be);
  if (GMR_UNLIKELY(capturing(st))) {
    gate_event_t *ge = gmr__calloc(1, sizeof *ge);
    if (ge == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for a deferred event");
    ge->stream = s;
    pthread_mutex_lock(&st->lock);
    bool deferred = capturing(st);
    if (deferred) {
      ge->next = st->events;
      st->events = ge;
    }
    pthread_mutex_unlock(&st->lock);
    if (deferred) {
      *out_ev = (gmr_event_t)((uintptr_t)ge | 1u);
      return 0;
    }
    gmr__free(ge);
  }
  int err = st->device->ops->event_record(st->device, s, out_ev);
  gmr_assert_internal(err != 0 || !is_deferred(*out_ev));
  return err;
}

static int refuse_wait(const char *what) {
  return gmr__error_set(GMR_EDEVICE,
                        "cannot wait for %s while a CUDA graph is being captured (it would "
                        "invalidate the capture)",
                        what);
}

static int gate_event_query(gmr_backend_t *be, gmr_event_t ev) {
  gate_state_t *st = st_of(be);
  if (is_deferred(ev)) {
    gate_event_t *ge = deferred_of(ev);
    int state = atomic_load_explicit(&ge->state, memory_order_acquire);
    if (state == EV_DEFERRED) return 1;
    if (state == EV_WAITED) return 0;
    ev = atomic_load_explicit(&ge->real, memory_order_relaxed);
  }
  if (GMR_UNLIKELY(capturing(st))) return 1;
  return st->device->ops->event_query(st->device, ev);
}

static int gate_event_sync(gmr_backend_t *be, gmr_event_t ev) {
  gate_state_t *st = st_of(be);
  if (GMR_UNLIKELY(capturing(st))) return refuse_wait("an event");
  if (is_deferred(ev)) {
    gate_event_t *ge = deferred_of(ev);
    int state = atomic_load_explicit(&ge->state, memory_order_acquire);
    if (state == EV_WAITED) return 0;
    if (state == EV_DEFERRED) return st->device->ops->stream_sync(st->device, ge->stream);
    ev = atomic_load_explicit(&ge->real, memory_order_relaxed);
  }
  return st->device->ops->event_sync(st->device, ev);
}

static void gate_event_destroy(gmr_backend_t *be, gmr_event_t ev) {
  gate_state_t *st = st_of(be);
  if (!is_deferred(ev)) {
    st->device->ops->event_destroy(st->device, ev);
    return;
  }
  gate_event_t *ge = deferred_of(ev);
  pthread_mutex_lock(&st->lock);
  bool still_listed = atomic_load_explicit(&ge->state, memory_order_relaxed) == EV_DEFERRED;
  if (still_listed) ge->dead = true; /* the capture's end frees it */
  pthread_mutex_unlock(&st->lock);
  if (still_listed) return;
  gmr_event_t real = atomic_load_explicit(&ge->real, memory_order_relaxed);
  if (real != NULL) st->device->ops->event_destroy(st->device, real);
  gmr__free(ge);
}

static int gate_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  gate_state_t *st = st_of(be);
  if (GMR_UNLIKELY(capturing(st))) return refuse_wait("a stream");
  return st->device->ops->stream_sync(st->device, s);
}

static int gate_device_sync(gmr_backend_t *be) {
  gate_state_t *st = st_of(be);
  if (GMR_UNLIKELY(capturing(st))) return refuse_wait("the device");
  return st->device->ops->device_sync(st->device);
}

/* ---- plain forwarders -------------------------------------------------------------- */

static int gate_va_release(gmr_backend_t *be, void *base, size_t size) {
  gmr_backend_t *dev = dev_of(be);
  if (((gate_t *)be)->keeps_space && keep(be, base, size, NULL, true) == 0) return 0;
  return dev->ops->va_release(dev, base, size);
}

/* Host memory and copies (sleep and wake): stream work, forwarded. */

static void state_free(gate_state_t *st) {
  for (gate_event_t *ge = st->events, *next; ge != NULL; ge = next) {
    next = ge->next;
    gmr__free(ge);
  }
  gmr__free(st->releases);
  pthread_mutex_destroy(&st->lock);
  gmr__backend_free(st->device);
  gmr__free(st);
}

/* A pool's face goes: what it kept goes back now (a release during a
 * capture joins the capture's deferred ones). */
static void release_kept(gate_t *g) {
  gate_state_t *st = g->st;
  gmr_backend_t *dev = st->device;
  for (size_t i = 0; i < g->nkept; ++i) {
    deferred_release_t *r = &g->kept[i];
    if (r->virtual_range) {
      (void)dev->ops->va_release(dev, r->ptr, r->size);
      continue;
    }
    pthread_mutex_lock(&st->lock);
    bool deferred = capturing(st) && defer_release(st, r->ptr, r->size, r->stream) == 0;
    pthread_mutex_unlock(&st->lock);
    if (!deferred && dev->ops->release(dev, r->ptr, r->size, r->stream) == 0) unhold(st, r->size);
  }
  gmr__free(g->kept);
}

static void gate_destroy(gmr_backend_t *be) {
  gate_t *g = (gate_t *)be;
  release_kept(g);
  if (g->owner) state_free(g->st);
  gmr__free(g);
}

/* Take the device's slot `f` through forwarder `fwd`, NULL staying NULL. */
#define GATE_SLOT(f, fwd) g->ops.f = d->f ? fwd : NULL

static int face_new(gate_state_t *st, bool owner, gmr_backend_t **out) {
  gate_t *g = gmr__calloc(1, sizeof *g);
  if (g == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for the device gate");
  const gmr_backend_ops_t *d = st->device->ops;
  g->ops.name = d->name;
  GATE_SLOT(reserve, gate_reserve);
  GATE_SLOT(release, gate_release);
  GATE_SLOT(va_reserve, gmr__backend_forward_va_reserve);
  GATE_SLOT(va_release, gate_va_release);
  GATE_SLOT(map, gate_map);
  GATE_SLOT(unmap, gate_unmap);
  GATE_SLOT(mem_info, gate_mem_info);
  GATE_SLOT(device_id, gmr__backend_forward_device_id);
  GATE_SLOT(phys_create, gate_phys_create);
  GATE_SLOT(phys_release, gate_phys_release);
  GATE_SLOT(phys_map, gmr__backend_forward_phys_map);
  GATE_SLOT(set_access, gmr__backend_forward_set_access);
  GATE_SLOT(phys_unmap, gmr__backend_forward_phys_unmap);
  GATE_SLOT(stream_capturing, gmr__backend_forward_stream_capturing);
  GATE_SLOT(event_record, gate_event_record);
  GATE_SLOT(event_query, gate_event_query);
  GATE_SLOT(event_sync, gate_event_sync);
  GATE_SLOT(event_destroy, gate_event_destroy);
  GATE_SLOT(stream_sync, gate_stream_sync);
  GATE_SLOT(device_sync, gate_device_sync);
  GATE_SLOT(now_ns, gmr__backend_forward_now_ns);
  GATE_SLOT(host_alloc, gmr__backend_forward_host_alloc);
  GATE_SLOT(host_free, gmr__backend_forward_host_free);
  GATE_SLOT(copy_to_host, gmr__backend_forward_copy_to_host);
  GATE_SLOT(copy_to_device, gmr__backend_forward_copy_to_device);
  g->ops.destroy = gate_destroy;
  g->base.ops = &g->ops;
  g->base.granularity = st->device->granularity;
  g->base.device = st->device->device;
  g->base.forwards_to = st->device;
  g->st = st;
  g->owner = owner;
  g->keeps_space = !owner;
  *out = &g->base;
  return 0;
}

int gmr__gate_new(gmr_backend_t *device, gmr_backend_t **out) {
  gate_state_t *st = gmr__calloc(1, sizeof *st);
  if (st == NULL || pthread_mutex_init(&st->lock, NULL) != 0) {
    gmr__free(st);
    gmr__backend_free(device);
    return gmr__error_set(GMR_ENOMEM, "out of host memory for the device gate");
  }
  st->device = device;
  st->fraction = 1.0;
  atomic_init(&st->depth, 0);
  atomic_init(&st->held, 0);
  atomic_init(&st->allowed, 0);
  int err = face_new(st, true, out);
  if (err != 0) state_free(st);
  return err;
}

static inline bool is_gate(const gmr_backend_t *be) {
  return be->ops->destroy == gate_destroy;
}

gmr_backend_t *gmr__gate_find(gmr_backend_t *be) {
  for (; be != NULL; be = be->forwards_to)
    if (is_gate(be)) return be;
  return NULL;
}

bool gmr__gate_keeps_space(gmr_backend_t *be) {
  gmr_backend_t *g = gmr__gate_find(be);
  return g != NULL && ((gate_t *)g)->keeps_space;
}

int gmr__gate_borrow(gmr_backend_t *gate, gmr_backend_t **out) {
  gmr_assert(is_gate(gate));
  return face_new(st_of(gate), false, out);
}

/* ---- captures ------------------------------------------------------------------------- */

int gmr__gate_capture_begin(gmr_backend_t *gate) {
  gate_state_t *st = st_of(gate);
  pthread_mutex_lock(&st->lock);
  atomic_fetch_add_explicit(&st->depth, 1, memory_order_release);
  pthread_mutex_unlock(&st->lock);
  return 0;
}

/* Record one deferred event now that no capture is underway; if the device
 * cannot, wait for its stream instead, so the event reads as complete. */
static int event_settle(gate_state_t *st, gate_event_t *ge) {
  gmr_backend_t *dev = st->device;
  gmr_event_t real = NULL;
  int err = dev->ops->event_record(dev, ge->stream, &real);
  if (err == 0) {
    atomic_store_explicit(&ge->real, real, memory_order_relaxed);
    atomic_store_explicit(&ge->state, EV_RECORDED, memory_order_release);
    return 0;
  }
  int werr = dev->ops->stream_sync(dev, ge->stream);
  atomic_store_explicit(&ge->state, EV_WAITED, memory_order_release);
  return werr != 0 ? werr : err;
}

int gmr__gate_capture_end(gmr_backend_t *gate) {
  gate_state_t *st = st_of(gate);
  pthread_mutex_lock(&st->lock);
  int depth = atomic_load_explicit(&st->depth, memory_order_relaxed);
  if (depth == 0) {
    pthread_mutex_unlock(&st->lock);
    return gmr__error_set(GMR_EINVAL, "gmr_capture_end: no capture is underway");
  }
  atomic_store_explicit(&st->depth, depth - 1, memory_order_release);
  int err = 0;
  if (depth == 1) {
    /* Under the lock: a destroy of a deferred event waits for its state. */
    for (gate_event_t *ge = st->events, *next; ge != NULL; ge = next) {
      next = ge->next;
      if (ge->dead) {
        gmr__free(ge);
        continue;
      }
      int e = event_settle(st, ge);
      if (e != 0 && err == 0) err = e;
    }
    st->events = NULL;
    for (size_t i = 0; i < st->nreleases; ++i) {
      deferred_release_t *r = &st->releases[i];
      int e = st->device->ops->release(st->device, r->ptr, r->size, r->stream);
      if (e == 0)
        unhold(st, r->size);
      else if (err == 0)
        err = e;
    }
    st->nreleases = 0;
  }
  pthread_mutex_unlock(&st->lock);
  if (err != 0)
    return gmr__error_set(GMR_EDEVICE, "gmr_capture_end: a deferred device call failed: %s",
                          gmr__error_last());
  return 0;
}

int gmr__gate_capture_depth(gmr_backend_t *gate) {
  return atomic_load_explicit(&st_of(gate)->depth, memory_order_acquire);
}

/* ---- the fraction ---------------------------------------------------------------------- */

int gmr__gate_set_fraction(gmr_backend_t *gate, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    return gmr__error_set(GMR_EINVAL, "memory fraction %g: expected a number in (0, 1]", fraction);
  gate_state_t *st = st_of(gate);
  size_t f = 0, total = 0;
  int err = st->device->ops->mem_info(st->device, &f, &total);
  if (err != 0) return err;
  pthread_mutex_lock(&st->lock);
  st->fraction = fraction;
  uint64_t allowed = fraction >= 1.0 ? 0 : (uint64_t)(fraction * (double)total);
  if (fraction < 1.0 && allowed == 0) allowed = 1; /* a fraction that rounds to nothing */
  atomic_store_explicit(&st->allowed, allowed, memory_order_relaxed);
  pthread_mutex_unlock(&st->lock);
  return 0;
}

double gmr__gate_fraction(gmr_backend_t *gate) {
  gate_state_t *st = st_of(gate);
  pthread_mutex_lock(&st->lock);
  double f = st->fraction;
  pthread_mutex_unlock(&st->lock);
  return f;
}
