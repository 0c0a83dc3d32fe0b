/* compare-diff.c: gmr-compare --diff A B CONFIG..., two runs of the same
 * program (before and after a change) under the same configurations.
 *
 * For each configuration, runs[2 k] replayed trace A and runs[2 k + 1]
 * trace B, each on a fresh device; this prints their peaks, fragmentation
 * and OOMs side by side with the change, and the call sites whose live bytes
 * at the run's peak grew most:
 *   growth(site) = bytes_B(site at B's peak) - bytes_A(site at A's peak)
 * matched by the site's text (the two traces number their sites apart).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "json.h"

#define DIFF_SITES_SCAN  4096 /* sites compared per run (the largest) */
#define DIFF_SITES_SHOWN 5

typedef struct diff_site_s {
  const char *name;
  uint64_t before, after;
} diff_site_t;

static int diff_site_cmp(const void *a, const void *b) {
  const diff_site_t *x = a, *y = b;
  int64_t gx = (int64_t)(x->after - x->before), gy = (int64_t)(y->after - y->before);
  if (gx != gy) return gx < gy ? 1 : -1;
  return strcmp(x->name, y->name);
}

/* The sites that grew from run a to run b, largest growth first; the count. */
static size_t diff_sites(const compare_run_t *a, const compare_run_t *b, diff_site_t **out) {
  *out = NULL;
  compare_site_t *sa = calloc(DIFF_SITES_SCAN, sizeof *sa),
                 *sb = calloc(DIFF_SITES_SCAN, sizeof *sb);
  diff_site_t *d = calloc(2 * DIFF_SITES_SCAN, sizeof *d);
  size_t n = 0;
  if (sa == NULL || sb == NULL || d == NULL) {
    free(d);
    d = NULL;
    goto done;
  }
  size_t na = compare_sites_at(a->trace, a->res.peak_event, sa, DIFF_SITES_SCAN);
  size_t nb = compare_sites_at(b->trace, b->res.peak_event, sb, DIFF_SITES_SCAN);
  for (size_t j = 0; j < nb; ++j)
    d[n++] = (diff_site_t){compare_site_name(b->trace, sb[j].site), 0, sb[j].bytes};
  for (size_t i = 0; i < na; ++i) {
    const char *name = compare_site_name(a->trace, sa[i].site);
    size_t j = 0;
    while (j < n && strcmp(d[j].name, name) != 0)
      ++j;
    if (j == n) d[n++] = (diff_site_t){name, 0, 0};
    d[j].before = sa[i].bytes;
  }
  size_t grew = 0;
  for (size_t j = 0; j < n; ++j)
    if (d[j].after > d[j].before) d[grew++] = d[j];
  n = grew;
  qsort(d, n, sizeof *d, diff_site_cmp);
done:
  free(sa);
  free(sb);
  *out = d;
  return n;
}

static void diff_change(uint64_t a, uint64_t b, char *buf, size_t len) {
  char h[48];
  compare_format_bytes(a > b ? a - b : b - a, h, sizeof h);
  if (a == b)
    snprintf(buf, len, "=");
  else if (a == 0)
    snprintf(buf, len, "+%s", h);
  else
    snprintf(buf, len, "%c%s (%+.1f %%)", b > a ? '+' : '-', h,
             100.0 * ((double)b - (double)a) / (double)a);
}

static void diff_bytes_row(FILE *out, const char *label, uint64_t a, uint64_t b) {
  char x[48], y[48], c[64];
  compare_format_bytes(a, x, sizeof x);
  compare_format_bytes(b, y, sizeof y);
  diff_change(a, b, c, sizeof c);
  fprintf(out, "  %-24s %14s %14s  %s\n", label, x, y, c);
}

void compare_print_diff(FILE *out, const compare_run_t *runs, size_t n_cfg,
                        const compare_opts_t *o) {
  const gmr_trace_data_t *ta = runs[0].trace, *tb = runs[1].trace;
  char c[48];
  compare_format_bytes(o->capacity, c, sizeof c);
  fprintf(out, "gmr-compare --diff: before %s (%zu events), after %s (%zu events)\n", ta->source,
          ta->n_events, tb->source, tb->n_events);
  fprintf(out, "each replay on a fresh simulated device of %s\n", c);
  for (size_t k = 0; k < n_cfg; ++k) {
    const compare_run_t *a = &runs[2 * k], *b = &runs[2 * k + 1];
    fprintf(out, "\n%s (%s)%*s %14s %14s  change\n", a->name, a->policy[0] ? a->policy : "-",
            (int)(22 > strlen(a->name) + strlen(a->policy)
                      ? 22 - strlen(a->name) - strlen(a->policy)
                      : 0),
            "", "before", "after");
    if (a->status != COMPARE_OK || b->status != COMPARE_OK) {
      fprintf(out, "  could not run: %s\n", a->status != COMPARE_OK ? a->error : b->error);
      continue;
    }
    diff_bytes_row(out, "peak reserved", a->final.peak_reserved_bytes,
                   b->final.peak_reserved_bytes);
    diff_bytes_row(out, "peak requested", a->final.peak_requested_bytes,
                   b->final.peak_requested_bytes);
    fprintf(out, "  %-24s %14.4f %14.4f\n", "reserved / requested",
            a->final.peak_requested_bytes
                ? (double)a->final.peak_reserved_bytes / (double)a->final.peak_requested_bytes
                : 0.0,
            b->final.peak_requested_bytes
                ? (double)b->final.peak_reserved_bytes / (double)b->final.peak_requested_bytes
                : 0.0);
    diff_bytes_row(out, "free at peak", a->free_at_peak, b->free_at_peak);
    fprintf(out, "  %-24s %12.1f %% %12.1f %%  %+.1f points\n", "fragmentation at peak",
            100.0 * a->fragmentation, 100.0 * b->fragmentation,
            100.0 * (b->fragmentation - a->fragmentation));
    fprintf(out, "  %-24s %14" PRIu64 " %14" PRIu64 "\n", "segments (peak)", a->final.peak_segments,
            b->final.peak_segments);
    fprintf(out, "  %-24s %14" PRIu64 " %14" PRIu64 "\n", "device allocs", a->final.device_allocs,
            b->final.device_allocs);
    fprintf(out, "  %-24s %14" PRIu64 " %14" PRIu64 "\n", "device frees", a->final.device_frees,
            b->final.device_frees);
    compare_cost_t ca, cb;
    compare_cost_estimate(a, &ca);
    compare_cost_estimate(b, &cb);
    fprintf(out, "  %-24s %14" PRIu64 " %14" PRIu64 "\n", "driver calls", ca.total_calls,
            cb.total_calls);
    char ta_us[32], tb_us[32];
    compare_format_us(ca.us_total, ta_us, sizeof ta_us);
    compare_format_us(cb.us_total, tb_us, sizeof tb_us);
    fprintf(out, "  %-24s %14s %14s", "device time (H200 model)", ta_us, tb_us);
    if (ca.us_total > 0)
      fprintf(out, "  %+.1f %%", 100.0 * (cb.us_total - ca.us_total) / ca.us_total);
    fputc('\n', out);
    fprintf(out, "  %-24s %14zu %14zu\n", "OOMs", a->res.ooms, b->res.ooms);
    if (o->fit) diff_bytes_row(out, "fit capacity (no OOM)", a->fit_capacity, b->fit_capacity);
    diff_site_t *d = NULL;
    size_t n = diff_sites(a, b, &d);
    if (ta->n_sites == 0 && tb->n_sites == 0) {
      fputs("  (the traces name no call sites)\n", out);
    } else if (n == 0) {
      fputs("  no call site holds more at the peak\n", out);
    } else {
      fputs("  call sites that grew at the peak (requested bytes live):\n", out);
      for (size_t j = 0; j < n && j < DIFF_SITES_SHOWN; ++j) {
        char g[48], x[48], y[48];
        compare_format_bytes(d[j].after - d[j].before, g, sizeof g);
        compare_format_bytes(d[j].before, x, sizeof x);
        compare_format_bytes(d[j].after, y, sizeof y);
        fprintf(out, "    +%-12s %s (%s -> %s)\n", g, d[j].name, x, y);
      }
    }
    free(d);
  }
}

static void diff_json_side(FILE *out, const char *key, const compare_run_t *r) {
  fprintf(out, ",\n    \"%s\": {\"trace\": ", key);
  tool_json_string(out, r->trace->source);
  fprintf(out,
          ", \"peak_reserved\": %" PRIu64 ", \"peak_requested\": %" PRIu64
          ", \"free_at_peak\": %" PRIu64
          ", \"fragmentation_at_peak\": %.4f, \"segments_peak\": %" PRIu64
          ", \"device_allocs\": %" PRIu64 ", \"device_frees\": %" PRIu64
          ", \"ooms\": %zu, \"peak_event\": %zu",
          r->final.peak_reserved_bytes, r->final.peak_requested_bytes, r->free_at_peak,
          r->fragmentation, r->final.peak_segments, r->final.device_allocs, r->final.device_frees,
          r->res.ooms, r->res.peak_event);
  compare_cost_t c;
  compare_cost_estimate(r, &c);
  fprintf(out, ", \"device_calls_total\": %" PRIu64 ", \"device_time_us\": %.1f", c.total_calls,
          c.us_total);
  if (r->fit_max) {
    if (r->fit_capacity)
      fprintf(out, ", \"fit_capacity\": %" PRIu64, r->fit_capacity);
    else
      fputs(", \"fit_capacity\": null", out);
  }
  fputc('}', out);
}

void compare_print_diff_json(FILE *out, const compare_run_t *runs, size_t n_cfg) {
  fputs("[\n", out);
  for (size_t k = 0; k < n_cfg; ++k) {
    const compare_run_t *a = &runs[2 * k], *b = &runs[2 * k + 1];
    fputs("  {\n    \"config\": ", out);
    tool_json_string(out, a->name);
    fputs(",\n    \"source\": ", out);
    tool_json_string(out, a->source);
    int ok = a->status == COMPARE_OK && b->status == COMPARE_OK;
    fprintf(out, ",\n    \"status\": \"%s\"", ok ? "ok" : "error");
    if (!ok) {
      fputs(",\n    \"error\": ", out);
      tool_json_string(out, a->status != COMPARE_OK ? a->error : b->error);
      fputs("\n  }", out);
      fputs(k + 1 < n_cfg ? ",\n" : "\n", out);
      continue;
    }
    fputs(",\n    \"policy\": ", out);
    tool_json_string(out, a->policy);
    diff_json_side(out, "before", a);
    diff_json_side(out, "after", b);
    fprintf(out, ",\n    \"peak_reserved_change\": %" PRId64,
            (int64_t)(b->final.peak_reserved_bytes - a->final.peak_reserved_bytes));
    diff_site_t *d = NULL;
    size_t n = diff_sites(a, b, &d);
    fputs(",\n    \"sites_grew\": [", out);
    for (size_t j = 0; j < n; ++j) {
      fputs(j ? ", {\"site\": " : "{\"site\": ", out);
      tool_json_string(out, d[j].name);
      fprintf(out, ", \"before\": %" PRIu64 ", \"after\": %" PRIu64 "}", d[j].before, d[j].after);
    }
    free(d);
    fputs("]\n  }", out);
    fputs(k + 1 < n_cfg ? ",\n" : "\n", out);
  }
  fputs("]\n", out);
}
