/* report.c: the stitch policy's figures: statistics (PyTorch's names plus
 * mappings, shared pages, dead gaps and time spent mapping), the summary and
 * the OOM message.  The walk and the invariant checker are in check.c. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "stitch/internal.h"

/* ---- figures ----------------------------------------------------------------------------------
 */

static uint32_t shared_pages(const stitch_t *t) {
  return t->nclosed; /* a closed page holds the tail of one block and the head of another */
}

/* The largest open slot: the highest non-empty class of either index, a
 * page's open bytes being its class times G. */
uint64_t gmr__st_largest_open(const stitch_t *t) {
  uint32_t s = gmr__st_classes_find_last(&t->suffix, t->suffix.n - 1),
           p = gmr__st_classes_find_last(&t->prefix, t->prefix.n - 1);
  uint64_t best = s != ST_NIL ? (uint64_t)s * ST_G : 0;
  if (p != ST_NIL && (uint64_t)p * ST_G > best) best = (uint64_t)p * ST_G;
  return best;
}

/* O(P / G / 64) whatever the number of pages: gmr-compare asks after every
 * event. */
void gmr__st_report_free_bytes(stitch_t *t, uint64_t *free_bytes, uint64_t *largest) {
  uint64_t best = gmr__st_largest_open(t);
  uint64_t whole = (uint64_t)(t->nfree + t->nparked) * t->P; /* parked pages are free too */
  *free_bytes = whole + t->open_bytes + t->small_free_bytes;
  /* The largest block served without growing: every FREE or parked page plus
   * the best open slot (FREE pages can be stitched in any order). */
  *largest = whole + best;
}

/* gmr_stat_t [0] of a figure counted per pool: accumulated counts summed. */
static void sum_pools(gmr_stat_t *a) {
  a[0].allocated = a[1].allocated + a[2].allocated;
  a[0].freed = a[1].freed + a[2].freed;
}

void gmr__st_report_figures(const stitch_t *t, st_figures_t *f) {
  const st_stats_t *s = &t->st;
  memcpy(f->allocated, s->allocated, sizeof f->allocated);
  memcpy(f->requested, s->requested, sizeof f->requested);
  memcpy(f->allocation, s->allocation, sizeof f->allocation);
  memcpy(f->segment, s->segment, sizeof f->segment);
  sum_pools(f->allocated);
  sum_pools(f->requested);
  sum_pools(f->allocation);
  sum_pools(f->segment);
  for (int p = 0; p < 3; ++p) {
    const gmr_stat_t *a = &f->allocated[p];
    int64_t peak = s->active_peak[p] > a->peak ? s->active_peak[p] : a->peak;
    f->active[p] = (gmr_stat_t){a->current + s->pend[p], peak, a->allocated,
                                a->freed - (s->pend[p] - s->pend_at_reset[p])};
  }
}

void gmr__st_stats(gmr_policy_t *self, gmr_stats_t *out) {
  stitch_t *t = (stitch_t *)self;
  st_figures_t fig, *s = &fig;
  gmr__st_report_figures(t, &fig);
  const st_stats_t *st = &t->st;
  out->allocated_bytes = (uint64_t)s->allocated[0].current;
  out->peak_allocated_bytes = (uint64_t)s->allocated[0].peak;
  out->requested_bytes = (uint64_t)s->requested[0].current;
  out->peak_requested_bytes = (uint64_t)s->requested[0].peak;
  out->active_bytes = (uint64_t)s->active[0].current;
  out->peak_active_bytes = (uint64_t)s->active[0].peak;
  out->allocations = (uint64_t)s->allocation[0].current;
  out->peak_allocations = (uint64_t)s->allocation[0].peak;
  out->num_allocs = (uint64_t)s->allocation[0].allocated;
  out->num_frees = (uint64_t)s->allocation[0].freed;
  out->ooms = (uint64_t)st->ooms;
  out->alloc_retries = (uint64_t)st->retries;
  uint64_t fr, largest;
  gmr__st_report_free_bytes(t, &fr, &largest);
  out->largest_free_block = largest;
}

typedef struct kv_s {
  const char *k;
  int64_t v;
} kv_t;

static int emit_stat(gmr_stat_cb cb, void *ud, char *buf, size_t len, const char *name,
                     const char *pool, const gmr_stat_t *st) {
  static const char *const f[] = {"current", "peak", "allocated", "freed"};
  const int64_t v[] = {st->current, st->peak, st->allocated, st->freed};
  for (int i = 0; i < 4; ++i) {
    snprintf(buf, len, "%s.%s.%s", name, pool, f[i]);
    if (cb(buf, v[i], ud) != 0) return 1;
  }
  return 0;
}

int gmr__st_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  stitch_t *t = (stitch_t *)self;
  static const char *const pools[] = {"all", "small_pool", "large_pool"};
  char buf[96];
  st_stats_t *s = &t->st;
  gmr_backend_t *be = t->base.backend;
  /* reserved: all = pages x P (peak from the device counters), small = the
   * small pool's segments, large = the rest. */
  gmr_stat_t reserved[3];
  reserved[1] = s->reserved[1];
  reserved[0] = (gmr_stat_t){(int64_t)t->live_pages * (int64_t)t->P,
                             (int64_t)atomic_load(&be->counters.peak_reserved_bytes),
                             s->pages_created * (int64_t)t->P, s->pages_released * (int64_t)t->P};
  reserved[2] = (gmr_stat_t){reserved[0].current - reserved[1].current, 0, 0, 0};
  reserved[2].peak = reserved[2].current;
  st_figures_t f;
  gmr__st_report_figures(t, &f);
  for (int p = 0; p < 3; ++p) {
    if (emit_stat(cb, ud, buf, sizeof buf, "allocated_bytes", pools[p], &f.allocated[p]) ||
        emit_stat(cb, ud, buf, sizeof buf, "reserved_bytes", pools[p], &reserved[p]) ||
        emit_stat(cb, ud, buf, sizeof buf, "active_bytes", pools[p], &f.active[p]) ||
        emit_stat(cb, ud, buf, sizeof buf, "requested_bytes", pools[p], &f.requested[p]) ||
        emit_stat(cb, ud, buf, sizeof buf, "allocation", pools[p], &f.allocation[p]) ||
        emit_stat(cb, ud, buf, sizeof buf, "segment", pools[p], &f.segment[p]))
      return 0;
  }
  uint64_t fr, largest;
  gmr__st_report_free_bytes(t, &fr, &largest);
  /* The device's view (Note [Chunks], pages.c): a handle per chunk or
   * page of its own, a mapping per run of slots. */
  int64_t handles = t->live_pages;
  for (uint32_t c = 0; c < t->nchunks; ++c)
    if (t->chunks[c].n != 0) handles -= (int64_t)t->chunks[c].n - 1;
  const kv_t kv[] = {
      {"num_alloc_retries", s->retries},
      {"num_ooms", s->ooms},
      {"num_device_alloc", (int64_t)atomic_load(&be->counters.device_allocs)},
      {"num_device_free", (int64_t)atomic_load(&be->counters.device_frees)},
      {"stitch.page_size", (int64_t)t->P},
      {"stitch.pages.current", t->live_pages},
      {"stitch.pages.free", t->nfree},
      {"stitch.pages.created", s->pages_created},
      {"stitch.pages.released", s->pages_released},
      {"stitch.shared_pages.current", shared_pages(t)},
      {"stitch.dead_gap_bytes.current", s->dead_gap.current},
      {"stitch.dead_gap_bytes.peak", s->dead_gap.peak},
      {"stitch.free_bytes.current", (int64_t)fr},
      {"stitch.pending_bytes.current", s->pend[0]},
      {"stitch.mappings.current", s->mappings.current},
      {"stitch.mappings.peak", s->mappings.peak},
      {"stitch.device_handles.current", handles},
      {"stitch.device_mappings.current", t->nruns},
      {"stitch.va_bytes.current", s->va.current},
      {"stitch.va_bytes.peak", s->va.peak},
      {"stitch.va_reserved_bytes", 0},
      {"stitch.cached_ranges", t->ncached},
      {"stitch.cache_hits", s->hits},
      {"stitch.cache_misses", s->misses},
      {"stitch.cache_resizes", s->resizes},
      {"stitch.partial_placements", s->stitches_partial},
      {"stitch.map_calls", s->map_calls},
      {"stitch.pages_mapped", s->pages_mapped},
      {"stitch.unmap_calls", s->unmap_calls},
      {"stitch.set_access_calls", s->access_calls},
      {"stitch.map_ns", (int64_t)s->map_ns},
      {"stitch.evictions", s->evictions},
      {"stitch.small_reuses", s->small_reuses},
      {"stitch.small_reclaims", s->small_reclaims},
      {"stitch.event_records", s->event_records},
      {"stitch.event_queries", s->event_queries},
      {"stitch.syncs", s->syncs},
  };
  uint64_t va_res = 0;
  for (uint32_t r = 0; r < t->nres; ++r)
    va_res += t->res[r].size;
  for (size_t i = 0; i < sizeof kv / sizeof kv[0]; ++i) {
    int64_t v = strcmp(kv[i].k, "stitch.va_reserved_bytes") == 0 ? (int64_t)va_res : kv[i].v;
    if (cb(kv[i].k, v, ud) != 0) return 0;
  }
  return 0;
}

int gmr__st_summary(gmr_policy_t *self, FILE *out) {
  stitch_t *t = (stitch_t *)self;
  char a[32], b[32], c[32], d[32];
  st_stats_t *s = &t->st;
  uint64_t fr, largest;
  gmr__st_report_free_bytes(t, &fr, &largest);
  gmr_backend_t *be = t->base.backend;
  fprintf(out, "stitch memory summary (page %" PRIu64 " bytes)\n", t->P);
  fprintf(out, "  %-26s %14s %14s\n", "", "current", "peak");
#define ROW(label, cur, peak)                                                                      \
  gmr__format_size((uint64_t)(cur), a, sizeof a);                                                  \
  gmr__format_size((uint64_t)(peak), b, sizeof b);                                                 \
  fprintf(out, "  %-26s %14s %14s\n", label, a, b);
  ROW("reserved (pages)", (uint64_t)t->live_pages * t->P,
      atomic_load(&be->counters.peak_reserved_bytes))
  ROW("allocated", s->allocated[0].current, s->allocated[0].peak)
  ROW("requested", s->requested[0].current, s->requested[0].peak)
  ROW("active", s->allocated[0].current + s->pend[0],
      s->active_peak[0] > s->allocated[0].peak ? s->active_peak[0] : s->allocated[0].peak)
  ROW("small pool reserved", s->reserved[1].current, s->reserved[1].peak)
  ROW("dead gaps", s->dead_gap.current, s->dead_gap.peak)
  ROW("address space mapped", s->va.current, s->va.peak)
#undef ROW
  gmr__format_size(fr, a, sizeof a);
  gmr__format_size(largest, b, sizeof b);
  fprintf(out, "  free %s (largest without growing %s), %u FREE pages, %u shared\n", a, b, t->nfree,
          shared_pages(t));
  fprintf(out, "  mappings %" PRId64 " (peak %" PRId64 "), cached ranges %u\n", s->mappings.current,
          s->mappings.peak, t->ncached);
  fprintf(out,
          "  allocs %" PRId64 ", frees %" PRId64 ", cache hits %" PRId64 ", misses %" PRId64
          ", partial placements %" PRId64 ", small segments reused %" PRId64 "\n",
          s->allocation[1].allocated + s->allocation[2].allocated,
          s->allocation[1].freed + s->allocation[2].freed, s->hits, s->misses, s->stitches_partial,
          s->small_reuses);
  gmr__format_size(s->map_ns / 1000, c, sizeof c);
  snprintf(d, sizeof d, "%.3f ms", (double)s->map_ns / 1e6);
  fprintf(out,
          "  device: pages created %" PRId64 ", released %" PRId64 ", maps %" PRId64
          ", unmaps %" PRId64 ", set access %" PRId64 ", time mapping %s\n",
          s->pages_created, s->pages_released, s->map_calls, s->unmap_calls, s->access_calls, d);
  fprintf(out,
          "  evictions %" PRId64 ", small segments returned %" PRId64 ", events %" PRId64
          " recorded / %" PRId64 " queried, syncs %" PRId64 ", OOMs %" PRId64 "\n",
          s->evictions, s->small_reclaims, s->event_records, s->event_queries, s->syncs, s->ooms);
  return ferror(out) ? GMR_EIO : 0;
}

void gmr__st_reset_peak(gmr_policy_t *self) {
  stitch_t *t = (stitch_t *)self;
  for (int i = 0; i < 3; ++i) {
    gmr__stat_reset_peak(&t->st.allocated[i]);
    gmr__stat_reset_peak(&t->st.requested[i]);
    t->st.active_peak[i] = t->st.allocated[i].current + t->st.pend[i];
    gmr__stat_reset_peak(&t->st.allocation[i]);
    gmr__stat_reset_peak(&t->st.reserved[i]);
    gmr__stat_reset_peak(&t->st.segment[i]);
  }
  gmr__stat_reset_peak(&t->st.mappings);
  gmr__stat_reset_peak(&t->st.dead_gap);
  gmr__stat_reset_peak(&t->st.va);
}

void gmr__st_reset_accumulated(gmr_policy_t *self) {
  stitch_t *t = (stitch_t *)self;
  st_stats_t *s = &t->st;
  for (int i = 0; i < 3; ++i) {
    gmr__stat_reset_accumulated(&s->allocated[i]);
    gmr__stat_reset_accumulated(&s->requested[i]);
    s->pend_at_reset[i] = s->pend[i];
    gmr__stat_reset_accumulated(&s->allocation[i]);
    gmr__stat_reset_accumulated(&s->reserved[i]);
    gmr__stat_reset_accumulated(&s->segment[i]);
  }
  gmr__stat_reset_accumulated(&s->mappings);
  gmr__stat_reset_accumulated(&s->va);
  s->ooms = s->retries = 0;
  s->hits = s->misses = s->resizes = s->stitches_partial = s->map_calls = s->unmap_calls =
      s->access_calls = 0;
  s->pages_created = s->pages_released = s->pages_mapped = s->evictions = s->event_records =
      s->event_queries = 0;
  s->syncs = s->small_reclaims = 0;
  s->map_ns = 0;
}

/* ---- OOM --------------------------------------------------------------------------------------
 */

int gmr__st_report_oom(stitch_t *t, uint64_t size, gmr_stream_t s, const char *why) {
  char want[32], live[32], fr[32], dead[32], res[32], va[32], pend[32], dtot[32], dfree[32];
  uint64_t free_b, largest;
  gmr__st_report_free_bytes(t, &free_b, &largest);
  size_t df = 0, dt = 0;
  gmr__backend_mem_info(t->base.backend, &df, &dt);
  char whybuf[256];
  snprintf(whybuf, sizeof whybuf, "%s", why ? why : "");
  uint32_t nranges = 0;
  for (const st_range_t *r = t->all; r != NULL; r = r->all_next)
    ++nranges;
  gmr__format_size(size, want, sizeof want);
  gmr__format_size((uint64_t)t->st.allocated[0].current, live, sizeof live);
  gmr__format_size(free_b, fr, sizeof fr);
  gmr__format_size(t->dead_bytes, dead, sizeof dead);
  gmr__format_size((uint64_t)t->live_pages * t->P, res, sizeof res);
  gmr__format_size(t->va_used, va, sizeof va);
  gmr__format_size((uint64_t)t->st.pend[0], pend, sizeof pend);
  gmr__format_size(dt, dtot, sizeof dtot);
  gmr__format_size(df, dfree, sizeof dfree);
  return gmr__error_set(GMR_ENOMEM,
                        "stitch: out of memory allocating %s on stream %p. Device %d: %s total, "
                        "%s free. Held: %s in %u pages of %" PRIu64 " bytes: %s live in %" PRId64
                        " blocks, %s free (%u whole pages; "
                        "largest without growing %" PRIu64 " bytes), %s in dead gaps, %s "
                        "waiting for other streams; %u mappings, %s of address space in use "
                        "in %u ranges (%u of them cached). Device said: %s",
                        want, s, t->base.backend->device, dtot, dfree, res, t->live_pages, t->P,
                        live, t->st.allocation[0].current, fr, t->nfree, largest, dead, pend,
                        t->nmappings, va, nranges, t->ncached, whybuf);
}
