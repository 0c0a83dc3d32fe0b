/* compare-report.c: gmr-compare's terminal table and JSON.
 *
 * The table puts one configuration per column and one figure per row, in
 * human units; the JSON is one array with one object per configuration and
 * every byte count as an exact integer.  docs/compare.md defines each figure.
 */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "json.h"

void compare_format_bytes(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
    return;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 6)
    v /= 1024.0, ++u;
  snprintf(buf, len, "%.2f %s", v, units[u]);
}

/* ---- the table ------------------------------------------------------------------- */

enum { TABLE_LABEL = 28, TABLE_MIN_COL = 14 };

typedef enum table_row_e {
  ROW_POLICY,
  ROW_RESERVED,
  ROW_ALLOCATED,
  ROW_REQUESTED,
  ROW_RATIO,
  ROW_FREE,
  ROW_LARGEST,
  ROW_FRAG,
  ROW_ROUNDING,
  ROW_SEGMENTS,
  ROW_DEV_ALLOCS,
  ROW_DEV_FREES,
  ROW_CALLS,
  ROW_CALLS_RESERVE,
  ROW_CALLS_VA,
  ROW_CALLS_MAP,
  ROW_CALLS_PAGE,
  ROW_CALLS_PAGE_MAP,
  ROW_CALLS_ACCESS,
  ROW_CALLS_EVENTS,
  ROW_DEVICE_TIME,
  ROW_OOMS,
  ROW_RETRIES,
  ROW_FIT,
  ROW_SECONDS,
  ROW_SPEED,
  ROW_COUNT
} table_row_t;

static const char *const table_labels[ROW_COUNT] = {
    "policy",
    "peak reserved",
    "peak allocated",
    "peak requested",
    "reserved / requested",
    "free at peak",
    "largest free block at peak",
    "fragmentation at peak",
    "rounding loss at peak",
    "segments (peak)",
    "device allocs",
    "device frees",
    "driver calls",
    "  reserve / release",
    "  virtual reserve / release",
    "  map / unmap",
    "  page create / release",
    "  page map / unmap",
    "  set access",
    "  event rec / query / sync",
    "device time (H200 model)",
    "OOMs",
    "alloc retries",
    "fit capacity (no OOM)",
    "replay time",
    "replay speed",
};

const char *compare_table_label(int row) {
  return row >= 0 && row < ROW_COUNT ? table_labels[row] : NULL;
}

int compare_table_shows(int row, const compare_opts_t *o) {
  if (row == ROW_FIT) return o->fit;
  if (row == ROW_SECONDS || row == ROW_SPEED) return o->timing;
  return row >= 0 && row < ROW_COUNT;
}

/* The driver-call rows: counts as "a / b", and the device time the cost
 * model gives them (the calls it has no figure for: a note under the
 * table). */
static void table_calls_cell(const compare_run_t *r, int row, char *buf, size_t len) {
  compare_cost_t c;
  compare_cost_estimate(r, &c);
  const uint64_t *n = c.calls;
  switch (row) {
  case ROW_CALLS:
    snprintf(buf, len, "%" PRIu64, c.total_calls);
    break;
  case ROW_CALLS_RESERVE:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64, n[COMPARE_CALL_RESERVE], n[COMPARE_CALL_RELEASE]);
    break;
  case ROW_CALLS_VA:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64, n[COMPARE_CALL_VA_RESERVE],
             n[COMPARE_CALL_VA_RELEASE]);
    break;
  case ROW_CALLS_MAP:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64, n[COMPARE_CALL_MAP], n[COMPARE_CALL_UNMAP]);
    break;
  case ROW_CALLS_PAGE:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64, n[COMPARE_CALL_PAGE_CREATE],
             n[COMPARE_CALL_PAGE_RELEASE]);
    break;
  case ROW_CALLS_PAGE_MAP:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64, n[COMPARE_CALL_PAGE_MAP],
             n[COMPARE_CALL_PAGE_UNMAP]);
    break;
  case ROW_CALLS_ACCESS:
    snprintf(buf, len, "%" PRIu64, n[COMPARE_CALL_SET_ACCESS]);
    break;
  case ROW_CALLS_EVENTS:
    snprintf(buf, len, "%" PRIu64 " / %" PRIu64 " / %" PRIu64, n[COMPARE_CALL_EVENT_RECORD],
             n[COMPARE_CALL_EVENT_QUERY], n[COMPARE_CALL_SYNC]);
    break;
  default: {
    char t[32];
    compare_format_us(c.us_total, t, sizeof t);
    snprintf(buf, len, "%s", t);
  }
  }
}

void compare_table_cell(const compare_run_t *r, int row, char *buf, size_t len) {
  const gmr_stats_t *f = &r->final;
  if (r->status == COMPARE_ELOAD || r->status == COMPARE_ERUNTIME) {
    snprintf(buf, len, "%s", row != ROW_POLICY ? "-" : r->policy[0] ? r->policy : "(not run)");
    return;
  }
  switch ((table_row_t)row) {
  case ROW_POLICY:
    snprintf(buf, len, "%s", r->policy[0] ? r->policy : "(not run)");
    break;
  case ROW_RESERVED:
    compare_format_bytes(f->peak_reserved_bytes, buf, len);
    break;
  case ROW_ALLOCATED:
    compare_format_bytes(f->peak_allocated_bytes, buf, len);
    break;
  case ROW_REQUESTED:
    compare_format_bytes(f->peak_requested_bytes, buf, len);
    break;
  case ROW_RATIO:
    if (f->peak_requested_bytes)
      snprintf(buf, len, "%.4f", (double)f->peak_reserved_bytes / (double)f->peak_requested_bytes);
    else
      snprintf(buf, len, "-");
    break;
  case ROW_FREE:
    compare_format_bytes(r->free_at_peak, buf, len);
    break;
  case ROW_LARGEST:
    compare_format_bytes(r->largest_at_peak, buf, len);
    break;
  case ROW_FRAG:
    snprintf(buf, len, "%.1f %%", 100.0 * r->fragmentation);
    break;
  case ROW_ROUNDING:
    compare_format_bytes(r->rounding_at_peak, buf, len);
    break;
  case ROW_SEGMENTS:
    /* Memory that came only from pages mapped into virtual ranges
     * (expandable segments) has no segments to count. */
    if (f->peak_segments == 0 && f->peak_reserved_bytes > 0)
      snprintf(buf, len, "n/a (mapped)");
    else
      snprintf(buf, len, "%" PRIu64, f->peak_segments);
    break;
  case ROW_DEV_ALLOCS:
    snprintf(buf, len, "%" PRIu64, f->device_allocs);
    break;
  case ROW_DEV_FREES:
    snprintf(buf, len, "%" PRIu64, f->device_frees);
    break;
  case ROW_CALLS:
  case ROW_CALLS_RESERVE:
  case ROW_CALLS_VA:
  case ROW_CALLS_MAP:
  case ROW_CALLS_PAGE:
  case ROW_CALLS_PAGE_MAP:
  case ROW_CALLS_ACCESS:
  case ROW_CALLS_EVENTS:
  case ROW_DEVICE_TIME:
    table_calls_cell(r, row, buf, len);
    break;
  case ROW_OOMS:
    if (r->res.ooms)
      snprintf(buf, len, "%zu (ev %zu)", r->res.ooms, r->res.first_oom_event);
    else
      snprintf(buf, len, "0");
    break;
  case ROW_RETRIES:
    snprintf(buf, len, "%" PRIu64, f->alloc_retries);
    break;
  case ROW_FIT:
    if (r->fit_capacity)
      compare_format_bytes(r->fit_capacity, buf, len);
    else if (r->fit_max) {
      char m[40];
      compare_format_bytes(r->fit_max, m, sizeof m);
      snprintf(buf, len, "> %s", m);
    } else
      snprintf(buf, len, "-");
    break;
  case ROW_SECONDS:
    snprintf(buf, len, "%.3f s", r->res.seconds);
    break;
  case ROW_SPEED:
    if (r->res.seconds > 0)
      snprintf(buf, len, "%.2f M ev/s", (double)r->res.events_done / r->res.seconds / 1e6);
    else
      snprintf(buf, len, "-");
    break;
  case ROW_COUNT:
    buf[0] = '\0';
    break;
  }
}

/* Columns [lo, hi) of the table, under their headings. */
static void table_block(FILE *out, const compare_run_t *runs, const size_t *width, size_t lo,
                        size_t hi, const compare_opts_t *o) {
  char cell[96];
  fprintf(out, "%-*s", TABLE_LABEL, "");
  for (size_t k = lo; k < hi; ++k)
    fprintf(out, "  %*s", (int)width[k], runs[k].name);
  fprintf(out, "\n%-*s", TABLE_LABEL, "");
  for (size_t k = lo; k < hi; ++k) {
    fputs("  ", out);
    for (size_t c = 0; c < width[k]; ++c)
      fputc('-', out);
  }
  fputc('\n', out);
  for (int row = 0; row < ROW_COUNT; ++row) {
    if (!compare_table_shows(row, o)) continue;
    fprintf(out, "%-*s", TABLE_LABEL, table_labels[row]);
    for (size_t k = lo; k < hi; ++k) {
      compare_table_cell(&runs[k], row, cell, sizeof cell);
      fprintf(out, "  %*s", (int)width[k], cell);
    }
    fputc('\n', out);
  }
}

/* The first line of a (possibly long) message, and how many lines follow. */
static size_t table_first_line(const char *msg, char *buf, size_t len) {
  const char *nl = strchr(msg, '\n');
  size_t n = nl ? (size_t)(nl - msg) : strlen(msg);
  if (n >= len) n = len - 1;
  memcpy(buf, msg, n);
  buf[n] = '\0';
  size_t more = 0;
  for (const char *p = nl; p && p[1]; p = strchr(p + 1, '\n'))
    ++more;
  return more;
}

/* The call sites holding the most memory at each configuration's peak. */
static void table_sites(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n) {
  if (t->n_sites == 0) return;
  fputs("\nCall sites holding the most memory at each configuration's peak (requested bytes of "
        "the live allocations):\n",
        out);
  for (size_t k = 0; k < n; ++k) {
    const compare_run_t *r = &runs[k];
    if (r->status != COMPARE_OK) continue;
    compare_site_t top[COMPARE_TOP_SITES];
    size_t m = compare_sites_at(t, r->res.peak_event, top, COMPARE_TOP_SITES);
    fprintf(out, "  %s (peak at event %zu, line %u):\n", r->name, r->res.peak_event,
            r->res.peak_event < t->n_events ? t->events[r->res.peak_event].line : 0);
    for (size_t j = 0; j < m; ++j) {
      char b[48];
      compare_format_bytes(top[j].bytes, b, sizeof b);
      fprintf(out, "    %12s  %6" PRIu64 " allocation%s  %s\n", b, top[j].allocations,
              top[j].allocations == 1 ? " " : "s", compare_site_name(t, top[j].site));
    }
  }
}

void compare_print_table(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n,
                         const compare_opts_t *o) {
  char a[48], b[48];
  compare_format_bytes(t->peak_requested, a, sizeof a);
  compare_format_bytes(o->capacity, b, sizeof b);
  fprintf(out, "gmr-compare: %s: %zu events, %zu allocations (%zu never freed), %zu stream%s\n",
          t->source, t->n_events, t->n_ids, t->n_live_at_end, t->n_streams,
          t->n_streams == 1 ? "" : "s");
  if (t->n_alloc_failures)
    fprintf(out, "the recording saw %zu allocation%s fail: counted, not replayed\n",
            t->n_alloc_failures, t->n_alloc_failures == 1 ? "" : "s");
  fprintf(out,
          "trace peak requested %s; each configuration on a fresh simulated device of %s%s\n\n", a,
          b, o->check ? "; invariants checked after every event" : "");

  size_t *width = calloc(n ? n : 1, sizeof *width);
  if (width == NULL) return;
  char cell[96];
  for (size_t k = 0; k < n; ++k) {
    width[k] = strlen(runs[k].name);
    for (int row = 0; row < ROW_COUNT; ++row) {
      if (!compare_table_shows(row, o)) continue;
      compare_table_cell(&runs[k], row, cell, sizeof cell);
      if (strlen(cell) > width[k]) width[k] = strlen(cell);
    }
    if (width[k] < TABLE_MIN_COL) width[k] = TABLE_MIN_COL;
  }
  /* Columns that do not fit in o->columns go to a further block. */
  for (size_t lo = 0, hi; lo < n; lo = hi) {
    size_t used = TABLE_LABEL + 2 + width[lo];
    for (hi = lo + 1; hi < n && used + 2 + width[hi] <= o->columns; ++hi)
      used += 2 + width[hi];
    if (lo > 0) fputc('\n', out);
    table_block(out, runs, width, lo, hi, o);
  }
  free(width);

  /* The calls the estimate leaves out, once for the whole table. */
  uint64_t unmeasured = 0;
  for (size_t k = 0; k < n; ++k) {
    compare_cost_t c;
    compare_cost_estimate(&runs[k], &c);
    if (runs[k].status == COMPARE_OK || runs[k].status == COMPARE_ECHECK)
      unmeasured += c.unmeasured_calls;
  }
  if (unmeasured)
    fprintf(out,
            "\ndevice time: the H200 cost model (docs/compare.md), which has no measured "
            "figure for\nthe %" PRIu64
            " event, synchronize and virtual-release call%s: left out.\n",
            unmeasured, unmeasured == 1 ? "" : "s");

  /* Notes: where and why each OOM and each failure happened. */
  int first = 1;
  for (size_t k = 0; k < n; ++k) {
    const compare_run_t *r = &runs[k];
    char line[600];
    if (r->status != COMPARE_OK) {
      fprintf(out, "%s%s: could not run: %s\n", first ? "\n" : "", r->name, r->error);
      first = 0;
    } else if (r->res.ooms) {
      size_t more = table_first_line(r->res.first_oom_message, line, sizeof line);
      fprintf(out,
              "%s%s: %zu allocation%s failed (out of memory); the first at event %zu, line %u "
              "of the trace:\n    %s\n",
              first ? "\n" : "", r->name, r->res.ooms, r->res.ooms == 1 ? "" : "s",
              r->res.first_oom_event, r->res.first_oom_line, line);
      if (more)
        fprintf(out, "    (%zu more line%s of the policy's report in --json)\n", more,
                more == 1 ? "" : "s");
      first = 0;
    }
  }
  table_sites(out, t, runs, n);
}

/* ---- JSON ------------------------------------------------------------------------ */

static const char *json_status(compare_status_t s) {
  switch (s) {
  case COMPARE_OK:
    return "ok";
  case COMPARE_ELOAD:
    return "load_error";
  case COMPARE_ERUNTIME:
    return "runtime_error";
  case COMPARE_ECHECK:
    return "check_failed";
  }
  return "unknown";
}

static void json_u64(FILE *out, const char *key, uint64_t v) {
  fprintf(out, ",\n    \"%s\": %" PRIu64, key, v);
}

/* The driver calls and the device time the cost model gives them
 * (compare-cost.c): counts and bytes per call kind, then the estimate. */
static void json_calls(FILE *out, const compare_run_t *r) {
  compare_cost_t c;
  compare_cost_estimate(r, &c);
  const char *what[2] = {"device_calls", "device_call_bytes"};
  for (int w = 0; w < 2; ++w) {
    fprintf(out, ",\n    \"%s\": {", what[w]);
    /* Events name no bytes: their kinds are left out of the bytes. */
    int kinds = w ? COMPARE_CALL_EVENT_RECORD : COMPARE_CALL_KINDS;
    for (int k = 0; k < kinds; ++k)
      fprintf(out, "%s\"%s\": %" PRIu64, k ? ", " : "", compare_cost_model(k)->key,
              w ? c.bytes[k] : c.calls[k]);
    fputc('}', out);
  }
  json_u64(out, "device_calls_total", c.total_calls);
  fprintf(out, ",\n    \"device_time_us\": %.1f", c.us_total);
  fputs(",\n    \"device_time_us_by_call\": {", out);
  for (int k = 0, first = 1; k < COMPARE_CALL_KINDS; ++k) {
    if (!compare_cost_model(k)->measured) continue;
    fprintf(out, "%s\"%s\": %.1f", first ? "" : ", ", compare_cost_model(k)->key, c.us[k]);
    first = 0;
  }
  fputc('}', out);
  json_u64(out, "device_calls_not_estimated", c.unmeasured_calls);
  fputs(",\n    \"device_time_model\": \"H200, tools/compare-cost.c\"", out);
}

static void json_run(FILE *out, const gmr_trace_data_t *t, const compare_run_t *r,
                     const compare_opts_t *o) {
  if (r->trace) t = r->trace;
  fputs("  {\n    \"config\": ", out);
  tool_json_string(out, r->name);
  fputs(",\n    \"source\": ", out);
  tool_json_string(out, r->source);
  fprintf(out, ",\n    \"status\": \"%s\"", json_status(r->status));
  fputs(",\n    \"error\": ", out);
  if (r->status == COMPARE_OK)
    fputs("null", out);
  else
    tool_json_string(out, r->error);
  fputs(",\n    \"trace\": ", out);
  tool_json_string(out, t->source);
  fprintf(out, ",\n    \"trace_format\": \"%s\"",
          t->format == GMR_TRACE_FORMAT_SNAPSHOT ? "pytorch_snapshot" : "csv");
  fprintf(out, ",\n    \"trace_alloc_failures\": %zu", t->n_alloc_failures);
  if (r->yaml) {
    fputs(",\n    \"yaml\": ", out);
    tool_json_string(out, r->yaml);
  }
  if (r->status == COMPARE_ELOAD || r->status == COMPARE_ERUNTIME) {
    fputs("\n  }", out);
    return;
  }
  const gmr_stats_t *f = &r->final;
  fputs(",\n    \"policy\": ", out);
  tool_json_string(out, r->policy);
  json_u64(out, "events", r->res.events_done);
  json_u64(out, "peak_reserved", f->peak_reserved_bytes);
  json_u64(out, "peak_allocated", f->peak_allocated_bytes);
  json_u64(out, "peak_requested", f->peak_requested_bytes);
  if (f->peak_requested_bytes)
    fprintf(out, ",\n    \"reserved_over_requested\": %.4f",
            (double)f->peak_reserved_bytes / (double)f->peak_requested_bytes);
  else
    fputs(",\n    \"reserved_over_requested\": null", out);
  json_u64(out, "peak_event", r->res.peak_event);
  json_u64(out, "peak_line",
           r->res.peak_event < t->n_events ? t->events[r->res.peak_event].line : 0);
  json_u64(out, "free_at_peak", r->free_at_peak);
  json_u64(out, "largest_free_at_peak", r->largest_at_peak);
  fprintf(out, ",\n    \"fragmentation_at_peak\": %.4f", r->fragmentation);
  json_u64(out, "rounding_loss_at_peak", r->rounding_at_peak);
  json_u64(out, "segments_peak", f->peak_segments);
  json_u64(out, "device_allocs", f->device_allocs);
  json_u64(out, "device_frees", f->device_frees);
  json_u64(out, "ooms", r->res.ooms);
  if (r->res.ooms) {
    fprintf(out, ",\n    \"first_oom\": {\"event\": %zu, \"line\": %u, \"message\": ",
            r->res.first_oom_event, r->res.first_oom_line);
    tool_json_string(out, r->res.first_oom_message);
    fputc('}', out);
  } else {
    fputs(",\n    \"first_oom\": null", out);
  }
  json_u64(out, "alloc_retries", f->alloc_retries);
  json_calls(out, r);
  compare_site_t top[COMPARE_TOP_SITES];
  size_t m = compare_sites_at(t, r->res.peak_event, top, COMPARE_TOP_SITES);
  fputs(",\n    \"top_sites\": [", out);
  for (size_t j = 0; j < m; ++j) {
    fputs(j ? ", {\"site\": " : "{\"site\": ", out);
    tool_json_string(out, compare_site_name(t, top[j].site));
    fprintf(out, ", \"bytes\": %" PRIu64 ", \"allocations\": %" PRIu64 "}", top[j].bytes,
            top[j].allocations);
  }
  fputc(']', out);
  if (o->fit) {
    if (r->fit_capacity)
      json_u64(out, "fit_capacity", r->fit_capacity);
    else
      fputs(",\n    \"fit_capacity\": null", out);
    json_u64(out, "fit_max_tried", r->fit_max);
  }
  if (o->timing) {
    fprintf(out, ",\n    \"seconds\": %.6f", r->res.seconds);
    fprintf(out, ",\n    \"events_per_second\": %.0f",
            r->res.seconds > 0 ? (double)r->res.events_done / r->res.seconds : 0.0);
  } else {
    fputs(",\n    \"seconds\": null,\n    \"events_per_second\": null", out);
  }
  fputs("\n  }", out);
}

void compare_print_json(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n,
                        const compare_opts_t *o) {
  fputs("[\n", out);
  for (size_t k = 0; k < n; ++k) {
    json_run(out, t, &runs[k], o);
    fputs(k + 1 < n ? ",\n" : "\n", out);
  }
  fputs("]\n", out);
}
