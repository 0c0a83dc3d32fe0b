/* backend.c: the non-virtual wrappers around gmr_backend_ops_t.
 *
 * Every policy reaches the device through these, so the device-level figures
 * of gmr_stats_t (reserved bytes, segments, device allocations and frees) are
 * counted once, here, the same way for every policy: Note [Device counters].
 *
 * The stream argument of reserve, release, map and unmap is passed on to the
 * ops untouched: devices ignore it, decorators (the recording layer,
 * lib/observe/recording.c) use it.
 */
#include "core/internal.h"

#include "backend/backend.h"

/* Note [Device counters]
 *   reserved_bytes = Σ live reserve sizes + Σ live mapped sizes
 *   segments       = number of live reserve ranges
 * Virtual reservations (va_reserve) hold no memory and are not counted.
 */
static void counter_add_peak(_Atomic uint64_t *cur, _Atomic uint64_t *peak, uint64_t n) {
  uint64_t now = atomic_fetch_add(cur, n) + n;
  uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);
  while (now > p && !atomic_compare_exchange_weak(peak, &p, now)) {
  }
}

int gmr__backend_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  gmr_assert(size > 0 && out_ptr != NULL);
  void *p = NULL;
  int err = be->ops->reserve(be, size, s, &p);
  if (err != 0) return err;
  counter_add_peak(&be->counters.reserved_bytes, &be->counters.peak_reserved_bytes, size);
  counter_add_peak(&be->counters.segments, &be->counters.peak_segments, 1);
  atomic_fetch_add(&be->counters.device_allocs, 1);
  *out_ptr = p;
  return 0;
}

int gmr__backend_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  int err = be->ops->release(be, ptr, size, s);
  if (err != 0) return err;
  atomic_fetch_sub(&be->counters.reserved_bytes, size);
  atomic_fetch_sub(&be->counters.segments, 1);
  atomic_fetch_add(&be->counters.device_frees, 1);
  return 0;
}

int gmr__backend_va_reserve(gmr_backend_t *be, size_t size, void **out_base) {
  if (be->ops->va_reserve == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot reserve virtual address ranges",
                          be->ops->name);
  void *p = NULL;
  int err = be->ops->va_reserve(be, size, &p);
  if (err == 0) *out_base = p;
  return err;
}

int gmr__backend_va_release(gmr_backend_t *be, void *base, size_t size) {
  if (be->ops->va_release == NULL) return GMR_ENOTSUP;
  return be->ops->va_release(be, base, size);
}

int gmr__backend_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  if (be->ops->map == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot map pages", be->ops->name);
  gmr_assert(size % be->granularity == 0);
  int err = be->ops->map(be, addr, size, s);
  if (err != 0) return err;
  counter_add_peak(&be->counters.reserved_bytes, &be->counters.peak_reserved_bytes, size);
  atomic_fetch_add(&be->counters.device_allocs, 1);
  return 0;
}

int gmr__backend_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  if (be->ops->unmap == NULL) return GMR_ENOTSUP;
  int err = be->ops->unmap(be, addr, size, s);
  if (err != 0) return err;
  atomic_fetch_sub(&be->counters.reserved_bytes, size);
  atomic_fetch_add(&be->counters.device_frees, 1);
  return 0;
}

int gmr__backend_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  return be->ops->mem_info(be, out_free, out_total);
}

int gmr__backend_device_id(gmr_backend_t *be, char *buf, size_t len) {
  while (be->ops->device_id == NULL && be->forwards_to != NULL)
    be = be->forwards_to;
  if (be->ops->device_id == NULL)
    return gmr__error_set(GMR_ENOTSUP, "backend %s has no device id", be->ops->name);
  return be->ops->device_id(be, buf, len);
}

int gmr__backend_proc_usage(gmr_backend_t *be, gmr_proc_usage_t *out, size_t max, size_t *n) {
  *n = 0;
  while (be->ops->proc_usage == NULL && be->forwards_to != NULL)
    be = be->forwards_to;
  if (be->ops->proc_usage == NULL)
    return gmr__error_set(GMR_ENOTSUP, "backend %s does not know the device's processes",
                          be->ops->name);
  return be->ops->proc_usage(be, out, max, n);
}

int gmr__backend_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  if (be->ops->phys_create == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot create physical pages",
                          be->ops->name);
  gmr_assert(size > 0 && size % be->granularity == 0);
  gmr_phys_t h = 0;
  int err = be->ops->phys_create(be, size, &h);
  if (err != 0) return err;
  counter_add_peak(&be->counters.reserved_bytes, &be->counters.peak_reserved_bytes, size);
  atomic_fetch_add(&be->counters.device_allocs, 1);
  *out = h;
  return 0;
}

int gmr__backend_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  if (be->ops->phys_release == NULL) return GMR_ENOTSUP;
  int err = be->ops->phys_release(be, h, size);
  if (err != 0) return err;
  atomic_fetch_sub(&be->counters.reserved_bytes, size);
  atomic_fetch_add(&be->counters.device_frees, 1);
  return 0;
}

int gmr__backend_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t offset) {
  if (be->ops->phys_map == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot map physical pages", be->ops->name);
  gmr_assert(size % be->granularity == 0 && offset % be->granularity == 0);
  return be->ops->phys_map(be, addr, size, h, offset);
}

int gmr__backend_set_access(gmr_backend_t *be, void *addr, size_t size) {
  if (be->ops->set_access == NULL) return 0;
  return be->ops->set_access(be, addr, size);
}

int gmr__backend_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  if (be->ops->phys_unmap == NULL) return GMR_ENOTSUP;
  return be->ops->phys_unmap(be, addr, size);
}

int gmr__backend_stream_capturing(gmr_backend_t *be, gmr_stream_t s) {
  if (be->ops->stream_capturing == NULL) return 0;
  return be->ops->stream_capturing(be, s);
}

int gmr__backend_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev) {
  if (be->ops->event_record == NULL) return GMR_ENOTSUP;
  return be->ops->event_record(be, s, out_ev);
}

int gmr__backend_event_query(gmr_backend_t *be, gmr_event_t ev) {
  if (be->ops->event_query == NULL) return 0;
  return be->ops->event_query(be, ev);
}

int gmr__backend_event_sync(gmr_backend_t *be, gmr_event_t ev) {
  if (be->ops->event_sync == NULL) return 0;
  return be->ops->event_sync(be, ev);
}

void gmr__backend_event_destroy(gmr_backend_t *be, gmr_event_t ev) {
  if (be->ops->event_destroy != NULL) be->ops->event_destroy(be, ev);
}

int gmr__backend_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  if (be->ops->stream_sync == NULL) return 0;
  return be->ops->stream_sync(be, s);
}

int gmr__backend_device_sync(gmr_backend_t *be) {
  if (be->ops->device_sync == NULL) return 0;
  return be->ops->device_sync(be);
}

uint64_t gmr__backend_now_ns(gmr_backend_t *be) {
  return be->ops->now_ns(be);
}

int gmr__backend_host_alloc(gmr_backend_t *be, size_t size, void **out) {
  if (be->ops->host_alloc == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot allocate pinned host memory",
                          be->ops->name);
  void *p = NULL;
  int err = be->ops->host_alloc(be, size, &p);
  if (err == 0) *out = p;
  return err;
}

void gmr__backend_host_free(gmr_backend_t *be, void *p, size_t size) {
  if (p != NULL && be->ops->host_free != NULL) be->ops->host_free(be, p, size);
}

int gmr__backend_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                              gmr_stream_t s) {
  if (be->ops->copy_to_host == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot copy device memory to the host",
                          be->ops->name);
  return be->ops->copy_to_host(be, dst, src, size, s);
}

int gmr__backend_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                gmr_stream_t s) {
  if (be->ops->copy_to_device == NULL)
    return gmr__error_set(GMR_ENOTSUP, "the %s backend cannot copy host memory to the device",
                          be->ops->name);
  return be->ops->copy_to_device(be, dst, src, size, s);
}

void gmr__backend_counters_reset_peak(gmr_backend_t *be) {
  atomic_store(&be->counters.peak_reserved_bytes, atomic_load(&be->counters.reserved_bytes));
  atomic_store(&be->counters.peak_segments, atomic_load(&be->counters.segments));
}

void gmr__backend_counters_reset_accumulated(gmr_backend_t *be) {
  atomic_store(&be->counters.device_allocs, 0);
  atomic_store(&be->counters.device_frees, 0);
}

void gmr__backend_free(gmr_backend_t *be) {
  if (be != NULL) be->ops->destroy(be);
}

#ifndef GMR_HAVE_CUDA
/* Built without the CUDA Toolkit: the simulator is the only device. */
int gmr__cuda_available(void) {
  return 0;
}

int gmr__cuda_backend_new(int device, gmr_backend_t **out) {
  (void)device;
  (void)out;
  return gmr__error_set(GMR_EDEVICE, "gmr was built without CUDA (configure found no CUDA "
                                     "Toolkit); only the simulated device is available");
}
#endif

/* ---- pass-through ops for decorators (backend.h) ---------------------------- */

int gmr__backend_forward_va_reserve(gmr_backend_t *be, size_t size, void **out_base) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->va_reserve(next, size, out_base);
}

int gmr__backend_forward_va_release(gmr_backend_t *be, void *base, size_t size) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->va_release(next, base, size);
}

int gmr__backend_forward_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->mem_info(next, out_free, out_total);
}

int gmr__backend_forward_device_id(gmr_backend_t *be, char *buf, size_t len) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->device_id(next, buf, len);
}

int gmr__backend_forward_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->phys_create(next, size, out);
}

int gmr__backend_forward_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->phys_release(next, h, size);
}

int gmr__backend_forward_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h,
                                  size_t off) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->phys_map(next, addr, size, h, off);
}

int gmr__backend_forward_set_access(gmr_backend_t *be, void *addr, size_t size) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->set_access(next, addr, size);
}

int gmr__backend_forward_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->phys_unmap(next, addr, size);
}

int gmr__backend_forward_stream_capturing(gmr_backend_t *be, gmr_stream_t s) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->stream_capturing(next, s);
}

int gmr__backend_forward_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->event_record(next, s, out_ev);
}

int gmr__backend_forward_event_query(gmr_backend_t *be, gmr_event_t ev) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->event_query(next, ev);
}

int gmr__backend_forward_event_sync(gmr_backend_t *be, gmr_event_t ev) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->event_sync(next, ev);
}

void gmr__backend_forward_event_destroy(gmr_backend_t *be, gmr_event_t ev) {
  gmr_backend_t *next = be->forwards_to;
  next->ops->event_destroy(next, ev);
}

int gmr__backend_forward_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->stream_sync(next, s);
}

int gmr__backend_forward_device_sync(gmr_backend_t *be) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->device_sync(next);
}

uint64_t gmr__backend_forward_now_ns(gmr_backend_t *be) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->now_ns(next);
}

int gmr__backend_forward_host_alloc(gmr_backend_t *be, size_t size, void **out) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->host_alloc(next, size, out);
}

void gmr__backend_forward_host_free(gmr_backend_t *be, void *p, size_t size) {
  gmr_backend_t *next = be->forwards_to;
  next->ops->host_free(next, p, size);
}

int gmr__backend_forward_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                      gmr_stream_t s) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->copy_to_host(next, dst, src, size, s);
}

int gmr__backend_forward_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                        gmr_stream_t s) {
  gmr_backend_t *next = be->forwards_to;
  return next->ops->copy_to_device(next, dst, src, size, s);
}
