/* sim-controls.c: the public controls of the simulated device (gmr_sim_*
 * in include/gmr.h): fault schedules, streams, the clock, placement and the
 * counters, each passed to the runtime's simulator backend; GMR_ENOTSUP with
 * a sentence on any other device. */
#include "core/internal.h"
#include "runtime/runtime.h"

static gmr_sim_t *sim_or_fail(gmr_runtime_t *rt) {
  if (rt == NULL) return NULL;
  gmr_sim_t *sim = gmr__sim_of(gmr__runtime_device_backend(rt));
  if (sim == NULL) {
    gmr__error_set(GMR_ENOTSUP, "this runtime runs on %s, not on the simulator",
                   gmr_runtime_backend(rt));
    gmr__error_tag(rt);
  }
  return sim;
}

#define SIM_CALL(call)                                                                             \
  do {                                                                                             \
    gmr_sim_t *sim = sim_or_fail(rt);                                                              \
    if (sim == NULL) return rt ? GMR_ENOTSUP : GMR_EINVAL;                                         \
    call;                                                                                          \
    return 0;                                                                                      \
  } while (0)

int gmr_sim_fail_nth(gmr_runtime_t *rt, uint64_t k) {
  SIM_CALL(gmr__sim_fail_nth(sim, k));
}
int gmr_sim_fail_from(gmr_runtime_t *rt, uint64_t k) {
  SIM_CALL(gmr__sim_fail_from(sim, k));
}
int gmr_sim_fail_above(gmr_runtime_t *rt, uint64_t b) {
  SIM_CALL(gmr__sim_fail_above(sim, b));
}
int gmr_sim_fail_all(gmr_runtime_t *rt, int on) {
  SIM_CALL(gmr__sim_fail_all(sim, on));
}
int gmr_sim_stream_enqueue(gmr_runtime_t *rt, gmr_stream_t s) {
  SIM_CALL(gmr__sim_stream_enqueue(sim, s));
}
int gmr_sim_stream_use(gmr_runtime_t *rt, gmr_stream_t s, const void *ptr, size_t size) {
  SIM_CALL(gmr__sim_stream_use(sim, s, ptr, size));
}
int gmr_sim_stream_complete(gmr_runtime_t *rt, gmr_stream_t s) {
  SIM_CALL(gmr__sim_stream_complete(sim, s));
}
int gmr_sim_set_clock(gmr_runtime_t *rt, uint64_t ns) {
  SIM_CALL(gmr__sim_set_clock(sim, ns));
}
int gmr_sim_place_next(gmr_runtime_t *rt, uintptr_t addr) {
  SIM_CALL(gmr__sim_place_next(sim, addr));
}
int gmr_sim_stream_capture(gmr_runtime_t *rt, gmr_stream_t s, int on) {
  SIM_CALL(gmr__sim_stream_capture(sim, s, on));
}
int gmr_sim_counters(gmr_runtime_t *rt, gmr_sim_counters_t *out) {
  if (out == NULL) return GMR_EINVAL;
  SIM_CALL(gmr__sim_counters(sim, out));
}
int gmr_sim_call_bytes(gmr_runtime_t *rt, gmr_sim_call_bytes_t *out) {
  if (out == NULL) return GMR_EINVAL;
  SIM_CALL(gmr__sim_call_bytes(sim, out));
}

/* ---- the process-wide default runtimes ----------------------------------------- */
