/* probe.c: gmr_backend_probe, what a runtime's backend can do, found by
 * trying each feature once on its device.
 *
 * The probe drives the device backend under the runtime's recording layer,
 * so it adds nothing to the runtime's memory history; the device counters it
 * touches are the device's own, not the runtime's statistics.  Each feature
 * is tried as a pair that undoes itself:
 *   reserve(g) ; release(g)                       g = granularity
 *   va_reserve(32 g) ; map(2 pages) ; unmap ; va_release
 *   event_record(default stream) ; event_sync ; event_query ; event_destroy
 * so the device holds after the probe what it held before.
 */
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "runtime/runtime.h"

#define PROBE_SPAN_PAGES 32 /* granules in the virtual range tried */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void probe_vmm(gmr_backend_t *be, gmr_backend_probe_t *p) {
  size_t g = be->granularity;
  p->vmm_span = PROBE_SPAN_PAGES * g;
  if (!gmr__backend_has_vmm(be)) {
    p->vmm_err = GMR_ENOTSUP;
    p->vmm_step = "reserve a virtual range";
    return;
  }
  void *base = NULL;
  p->vmm_step = "reserve a virtual range";
  int err = gmr__backend_va_reserve(be, p->vmm_span, &base);
  if (err == 0) {
    p->vmm_step = "map a page";
    err = gmr__backend_map(be, base, g, NULL);
    if (err == 0) {
      p->vmm_step = "map the next page";
      err = gmr__backend_map(be, (char *)base + g, g, NULL);
      if (err == 0) gmr__backend_unmap(be, (char *)base + g, g, NULL);
      int e2 = gmr__backend_unmap(be, base, g, NULL);
      if (err == 0 && e2 != 0) p->vmm_step = "unmap", err = e2;
    }
    gmr__backend_va_release(be, base, p->vmm_span);
  }
  p->vmm_err = err;
  if (err == 0) p->vmm_step = "";
}

int gmr_backend_probe(gmr_runtime_t *rt, gmr_backend_probe_t *out) {
  if (rt == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_backend_probe: NULL argument");
  gmr_backend_t *be = gmr__runtime_device_backend(rt);
  gmr_backend_probe_t p;
  memset(&p, 0, sizeof p);
  p.granularity = be->granularity;

  void *ptr = NULL;
  double t0 = now_us();
  p.reserve_err = gmr__backend_reserve(be, p.granularity, NULL, &ptr);
  if (p.reserve_err == 0) p.reserve_err = gmr__backend_release(be, ptr, p.granularity, NULL);
  if (p.reserve_err == 0) p.reserve_us = now_us() - t0;

  probe_vmm(be, &p);

  gmr_event_t ev = NULL;
  p.event_err = gmr__backend_event_record(be, NULL, &ev);
  if (p.event_err == 0) {
    p.event_sync_err = gmr__backend_event_sync(be, ev);
    p.event_query_err = gmr__backend_event_query(be, ev);
    gmr__backend_event_destroy(be, ev);
  }
  *out = p;
  return 0;
}
