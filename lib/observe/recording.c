/* recording.c: the recording layer around the device backend (see
 * Note [Recording rules] in recording.h).
 *
 * Each forwarder calls the device's op directly (not the gmr__backend_*
 * wrappers): the wrappers count device operations once, on the backend the
 * policies were given, which is this decorator.  Entries recorded here:
 *   reserve ok   -> segment_alloc (addr, size, s)
 *   release ok   -> segment_free  (addr, size, s)
 *   map ok       -> segment_map   (addr, size, s)
 *   unmap ok     -> segment_unmap (addr, size, s)
 */
#include <pthread.h>
#include <string.h>

#include "observe/recording.h"

static inline gmr_recording_t *rec_of(gmr_backend_t *be) {
  return (gmr_recording_t *)be;
}
static inline gmr_backend_t *dev_of(gmr_backend_t *be) {
  return rec_of(be)->device;
}
/* Acquire, paired with the release in gmr__recording_attach: a thread that
 * sees the history sees it initialized (correct on aarch64, not only x86). */
static inline gmr_history_t *history_of(gmr_backend_t *be) {
  return atomic_load_explicit(&rec_of(be)->history, memory_order_acquire);
}

static int rec_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  gmr_backend_t *dev = dev_of(be);
  int err = dev->ops->reserve(dev, size, s, out_ptr);
  gmr_history_t *h = history_of(be);
  if (GMR_UNLIKELY(h != NULL) && err == 0)
    gmr__history_record(h, GMR_HIST_SEGMENT_ALLOC, (uintptr_t)*out_ptr, size, s);
  return err;
}

static int rec_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  gmr_backend_t *dev = dev_of(be);
  int err = dev->ops->map(dev, addr, size, s);
  gmr_history_t *h = history_of(be);
  if (GMR_UNLIKELY(h != NULL) && err == 0)
    gmr__history_record(h, GMR_HIST_SEGMENT_MAP, (uintptr_t)addr, size, s);
  return err;
}

/* Release or unmap, recorded with the history lock held across the call
 * (see Note [Recording rules]). */
static int release_recorded(gmr_backend_t *dev, gmr_history_t *h, int action, void *ptr,
                            size_t size, gmr_stream_t s) {
  pthread_mutex_lock(&h->lock);
  int err = action == GMR_HIST_SEGMENT_FREE ? dev->ops->release(dev, ptr, size, s)
                                            : dev->ops->unmap(dev, ptr, size, s);
  if (err == 0) gmr__history_record_locked(h, action, (uintptr_t)ptr, size, s);
  pthread_mutex_unlock(&h->lock);
  return err;
}

static int rec_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  gmr_backend_t *dev = dev_of(be);
  gmr_history_t *h = history_of(be);
  if (GMR_UNLIKELY(h != NULL)) return release_recorded(dev, h, GMR_HIST_SEGMENT_FREE, ptr, size, s);
  return dev->ops->release(dev, ptr, size, s);
}

static int rec_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  gmr_backend_t *dev = dev_of(be);
  gmr_history_t *h = history_of(be);
  if (GMR_UNLIKELY(h != NULL))
    return release_recorded(dev, h, GMR_HIST_SEGMENT_UNMAP, addr, size, s);
  return dev->ops->unmap(dev, addr, size, s);
}

/* ---- plain forwarders ------------------------------------------------------- */

/* Page handles (the stitch policy): forwarded, not recorded.  A page may be
 * mapped at several addresses, which PyTorch's segment entries cannot say;
 * the policy's walk shows its ranges instead. */

static void rec_destroy(gmr_backend_t *be) {
  gmr_recording_t *r = rec_of(be);
  gmr__backend_free(r->device);
  gmr__free(r);
}

/* Take the device's slot `f` through forwarder `fwd`, NULL staying NULL. */
#define REC_SLOT(f, fwd) r->ops.f = d->f ? fwd : NULL

int gmr__recording_new(gmr_backend_t *device, gmr_backend_t **out) {
  gmr_recording_t *r = gmr__calloc(1, sizeof *r);
  if (r == NULL) {
    gmr__backend_free(device);
    return gmr__error_set(GMR_ENOMEM, "out of host memory for the recording layer");
  }
  const gmr_backend_ops_t *d = device->ops;
  r->ops.name = d->name;
  REC_SLOT(reserve, rec_reserve);
  REC_SLOT(release, rec_release);
  REC_SLOT(va_reserve, gmr__backend_forward_va_reserve);
  REC_SLOT(va_release, gmr__backend_forward_va_release);
  REC_SLOT(map, rec_map);
  REC_SLOT(unmap, rec_unmap);
  REC_SLOT(mem_info, gmr__backend_forward_mem_info);
  REC_SLOT(event_record, gmr__backend_forward_event_record);
  REC_SLOT(event_query, gmr__backend_forward_event_query);
  REC_SLOT(event_sync, gmr__backend_forward_event_sync);
  REC_SLOT(event_destroy, gmr__backend_forward_event_destroy);
  REC_SLOT(stream_sync, gmr__backend_forward_stream_sync);
  REC_SLOT(device_sync, gmr__backend_forward_device_sync);
  REC_SLOT(now_ns, gmr__backend_forward_now_ns);
  REC_SLOT(phys_create, gmr__backend_forward_phys_create);
  REC_SLOT(phys_release, gmr__backend_forward_phys_release);
  REC_SLOT(phys_map, gmr__backend_forward_phys_map);
  REC_SLOT(set_access, gmr__backend_forward_set_access);
  REC_SLOT(phys_unmap, gmr__backend_forward_phys_unmap);
  REC_SLOT(stream_capturing, gmr__backend_forward_stream_capturing);
  r->ops.destroy = rec_destroy;
  r->base.ops = &r->ops;
  r->base.granularity = device->granularity;
  r->base.device = device->device;
  r->base.forwards_to = device;
  r->device = device;
  atomic_init(&r->history, NULL);
  *out = &r->base;
  return 0;
}

static inline bool is_recording(const gmr_backend_t *be) {
  return be->ops->destroy == rec_destroy;
}

gmr_backend_t *gmr__recording_device(gmr_backend_t *rec) {
  gmr_assert(is_recording(rec));
  return rec_of(rec)->device;
}

void gmr__recording_attach(gmr_backend_t *rec, gmr_history_t *h) {
  gmr_assert(is_recording(rec));
  atomic_store_explicit(&rec_of(rec)->history, h, memory_order_release);
}

gmr_recording_t *gmr__recording_find(gmr_backend_t *be) {
  for (; be != NULL; be = be->forwards_to)
    if (is_recording(be)) return rec_of(be);
  return NULL;
}

gmr_history_t *gmr__recording_history(gmr_backend_t *be) {
  return gmr__recording_history_at(gmr__recording_find(be));
}
