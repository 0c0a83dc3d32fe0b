/* compare-cost.c: gmr-compare's device-call cost model (the H200 figures).
 *
 * Each replay runs on the simulator, which counts the driver calls a policy
 * makes and the bytes each call names (gmr_sim_counters, gmr_sim_call_bytes).
 * This file turns those into an estimate of the device time they would cost
 * on an NVIDIA H200: one table, cost_model below, gives each call kind its
 * figure and the measurement it comes from.  A call kind with no measured
 * figure says "not measured" and is left out of the estimate (the count of
 * such calls is reported beside it), never guessed.  Note [Device cost model].
 */
#include <string.h>

#include "compare.h"

/* Note [Device cost model]
 * ~~~~~~~~~~~~~~~~~~~~~~~~
 * estimate (µs) = Σ over call kinds k with a measured figure of
 *                   calls(k) × per_call(k) + pages(k) × per_page(k),
 *   pages(k) = bytes named by the calls of kind k / 2,097,152
 *              (the H200's VMM granularity, measured-on-h200.md line 8).
 * The figures are host wall-clock times of single driver calls measured on
 * one H200 (driver 580, CUDA 13.0), from /work/shared/specs/measured-on-h200.md
 * (cited as mh:LINE) and the probe tables that repeat them in
 * shared/specs/stitching.md (st:LINE).  `gmr-bench --workloads calls
 * --device cuda` times the same calls again on any GPU (Note [Bench
 * workloads] in tools/bench.c); its JSON gives one figure per row of this
 * table, to replace these when a newer device or driver is measured.
 *
 * What the simulator's call kinds stand for on the CUDA backend
 * (lib/backend/cuda.c):
 *  - reserve / release: cudaMalloc / cudaFree.  Measured only as a pair
 *    (alloc + free, 100 µs at 4 KiB and 1 MiB, 214 µs at 64 MiB, mh:15), so
 *    the pair's 100 µs is charged to each reserve and a release costs 0: a
 *    segment never released is charged its free as well, and segments of
 *    64 MiB and more cost up to twice the figure (mh:15): an underestimate
 *    for large segments.
 *  - map / unmap (expandable segments): map is cuMemCreate + cuMemMap +
 *    cuMemSetAccess of new memory, 14 + 2 + 37 µs per page (mh:11-12); unmap
 *    is cuMemUnmap, 22 µs per page (mh:12; the handle was released at map).
 *  - page create / release: cuMemCreate, 14 µs per page (mh:11);
 *    cuMemRelease, 15 µs per page, derived: unmap + release 37 µs less
 *    unmap 22 µs (mh:12-13).
 *  - page map / unmap: cuMemMap 2 µs per page (mh:11, st:374); cuMemUnmap
 *    22 µs per page (mh:12).
 *  - set access: cuMemSetAccess on a freshly mapped range, 37 µs per page
 *    (2.37 ms for 64 pages, mh:11-12, st:373); gmr sets access only on
 *    ranges it has just mapped.  Re-mapping handles elsewhere (map + one set
 *    access) was measured at 34 µs per page (mh:13), and issue 31 quotes
 *    "about 35 µs" a page map: the model's 2 + 37 = 39 µs is within 15 %.
 *  - virtual reserve: cuMemAddressReserve, 14 µs (1 TiB, mh:14).
 *  - virtual release (cuMemAddressFree), event record, query and
 *    synchronize (cudaEventRecord, cudaEventQuery, cudaEventSynchronize or a
 *    stream/device synchronize): not measured.
 */
static const compare_cost_entry_t cost_model[COMPARE_CALL_KINDS] = {
    [COMPARE_CALL_RESERVE] = {"reserve", "cudaMalloc", 1, 100.0, 0.0,
                              "cudaMalloc+cudaFree pair, 4 KiB-1 MiB (measured-on-h200.md:15)"},
    [COMPARE_CALL_RELEASE] = {"release", "cudaFree", 1, 0.0, 0.0,
                              "in the reserve's pair (measured-on-h200.md:15)"},
    [COMPARE_CALL_VA_RESERVE] = {"va_reserve", "cuMemAddressReserve", 1, 14.0, 0.0,
                                 "1 TiB reserved (measured-on-h200.md:14)"},
    [COMPARE_CALL_VA_RELEASE] = {"va_release", "cuMemAddressFree", 0, 0.0, 0.0, "not measured"},
    [COMPARE_CALL_MAP] = {"map", "cuMemCreate+cuMemMap+cuMemSetAccess", 1, 0.0, 53.0,
                          "14 + 2 + 37 us per page (measured-on-h200.md:11-12)"},
    [COMPARE_CALL_UNMAP] = {"unmap", "cuMemUnmap", 1, 0.0, 22.0,
                            "per page (measured-on-h200.md:12)"},
    [COMPARE_CALL_PAGE_CREATE] = {"page_create", "cuMemCreate", 1, 0.0, 14.0,
                                  "per page (measured-on-h200.md:11)"},
    [COMPARE_CALL_PAGE_RELEASE] =
        {"page_release", "cuMemRelease", 1, 0.0, 15.0,
         "unmap+release 37 us less unmap 22 us (measured-on-h200.md:12-13)"},
    [COMPARE_CALL_PAGE_MAP] = {"page_map", "cuMemMap", 1, 0.0, 2.0,
                               "per page (measured-on-h200.md:11, stitching.md:374)"},
    [COMPARE_CALL_PAGE_UNMAP] = {"page_unmap", "cuMemUnmap", 1, 0.0, 22.0,
                                 "per page (measured-on-h200.md:12)"},
    [COMPARE_CALL_SET_ACCESS] = {"set_access", "cuMemSetAccess", 1, 0.0, 37.0,
                                 "per freshly mapped page (measured-on-h200.md:11-12, "
                                 "stitching.md:373)"},
    [COMPARE_CALL_EVENT_RECORD] = {"event_record", "cudaEventRecord", 0, 0.0, 0.0, "not measured"},
    [COMPARE_CALL_EVENT_QUERY] = {"event_query", "cudaEventQuery", 0, 0.0, 0.0, "not measured"},
    [COMPARE_CALL_SYNC] = {"sync", "cudaEventSynchronize, stream or device synchronize", 0, 0.0,
                           0.0, "not measured"},
};

/* The H200's VMM granularity: the page the per-page figures are for. */
#define COST_PAGE_BYTES 2097152.0

const compare_cost_entry_t *compare_cost_model(int kind) {
  return kind >= 0 && kind < COMPARE_CALL_KINDS ? &cost_model[kind] : NULL;
}

void compare_cost_estimate(const compare_run_t *r, compare_cost_t *out) {
  memset(out, 0, sizeof *out);
  const gmr_sim_counters_t *c = &r->calls;
  const gmr_sim_call_bytes_t *b = &r->call_bytes;
  const uint64_t calls[COMPARE_CALL_KINDS] = {c->reserve_calls,     c->release_calls,
                                              c->va_reserve_calls,  c->va_release_calls,
                                              c->map_calls,         c->unmap_calls,
                                              c->page_create_calls, c->page_release_calls,
                                              c->page_map_calls,    c->page_unmap_calls,
                                              c->set_access_calls,  c->event_records,
                                              c->event_queries,     c->syncs};
  const uint64_t bytes[COMPARE_CALL_KINDS] = {
      b->reserve,      b->release,  b->va_reserve, b->va_release, b->map, b->unmap, b->page_create,
      b->page_release, b->page_map, b->page_unmap, b->set_access, 0,      0,        0};
  for (int k = 0; k < COMPARE_CALL_KINDS; ++k) {
    const compare_cost_entry_t *m = &cost_model[k];
    out->calls[k] = calls[k];
    out->bytes[k] = bytes[k];
    out->total_calls += calls[k];
    if (!m->measured) {
      out->unmeasured_calls += calls[k];
      continue;
    }
    out->us[k] =
        (double)calls[k] * m->us_per_call + (double)bytes[k] / COST_PAGE_BYTES * m->us_per_page;
    out->us_total += out->us[k];
  }
}

void compare_format_us(double us, char *buf, size_t len) {
  if (us < 1000.0)
    snprintf(buf, len, "%.0f us", us);
  else if (us < 1e6)
    snprintf(buf, len, "%.2f ms", us / 1e3);
  else
    snprintf(buf, len, "%.2f s", us / 1e6);
}

/* Note [Suggest weighs device time]: the rule, in one place. */
int compare_cost_says_slower(uint64_t reserved_before, uint64_t reserved_after, double us_before,
                             double us_after) {
  double saving = reserved_before > reserved_after && reserved_before > 0
                      ? (double)(reserved_before - reserved_after) / (double)reserved_before
                      : 0.0;
  return us_after - us_before >= COMPARE_SLOWER_FLOOR_US &&
         us_after > (1.0 + COMPARE_SLOWER_PER_SAVING * saving) * us_before;
}
