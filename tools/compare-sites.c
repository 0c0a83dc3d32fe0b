/* compare-sites.c: which call sites hold the memory at a run's peak.
 *
 * A trace may name each allocation's call site (its Site column, or a
 * snapshot's frames).  At event `at`, the live allocations are those
 * allocated at or before it and not freed by then, as the trace has them
 * (an allocation a configuration failed with an OOM is counted too: the
 * program asked for it there); their requested bytes are summed per site:
 *   bytes(site) = Σ size(id) over ids live after event `at` with site(id) = site
 * and the sites are ranked by bytes, largest first (ties: the site seen
 * first).  Allocations with no site are gathered under "(no call site)".
 */
#include <stdlib.h>
#include <string.h>

#include "compare.h"

const char *compare_site_name(const gmr_trace_data_t *t, uint32_t site) {
  return site >= 1 && site <= t->n_sites ? t->sites[site - 1] : "(no call site)";
}

static int sites_cmp(const void *a, const void *b) {
  const compare_site_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x->site < y->site ? -1 : x->site > y->site;
}

size_t compare_sites_at(const gmr_trace_data_t *t, size_t at, compare_site_t *out, size_t max) {
  if (t->n_sites == 0 || t->n_events == 0) return 0;
  if (at >= t->n_events) at = t->n_events - 1;
  uint8_t *live = calloc(t->n_ids ? t->n_ids : 1, 1);
  compare_site_t *all = calloc(t->n_sites + 1, sizeof *all);
  size_t n = 0;
  if (live == NULL || all == NULL) goto done;
  for (size_t i = 0; i <= at; ++i) {
    const gmr_trace_event_t *e = &t->events[i];
    if (e->action == GMR_TRACE_ALLOC) live[e->id] = 1;
    if (e->action == GMR_TRACE_FREE) live[e->id] = 0;
  }
  for (size_t s = 0; s <= t->n_sites; ++s)
    all[s].site = (uint32_t)s;
  for (size_t i = 0; i <= at; ++i) {
    const gmr_trace_event_t *e = &t->events[i];
    if (e->action != GMR_TRACE_ALLOC || !live[e->id]) continue;
    uint32_t s = e->site <= t->n_sites ? e->site : 0;
    all[s].bytes += e->size;
    all[s].allocations += 1;
  }
  qsort(all, t->n_sites + 1, sizeof *all, sites_cmp);
  for (size_t s = 0; s <= t->n_sites && n < max && all[s].bytes > 0; ++s)
    out[n++] = all[s];
done:
  free(live);
  free(all);
  return n;
}
