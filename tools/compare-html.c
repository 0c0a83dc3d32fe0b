/* compare-html.c: gmr-compare --html FILE, one self-contained page.
 *
 * The page needs no network: CSS, SVG and a few lines of JavaScript are
 * inline.  It shows an overview (peak reserved against peak requested for
 * every configuration), the table, and per configuration two pictures:
 *  - a timeline of reserved, allocated and requested bytes over the events
 *    (svg.timeline; each point is the maximum over a bucket of events);
 *  - a map of the segments at the peak (svg.segmap): reserved memory laid
 *    out as a strip wrapped into rows, segments in address order, allocated
 *    blocks in blue and free holes in red, so the bytes a policy holds but
 *    cannot use are visible at a glance.
 * Configurations share one scale where their sizes are comparable, so the
 * pictures compare by eye; one far larger than the rest (a greedy BFC that
 * reserves the whole device) gets its own scale, and says so.
 *
 * The script at the end counts the charts that laid out with a non-zero
 * size and writes the count into #render-status (tests read it from the DOM
 * that headless Chromium dumps).
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "outfile.h"

enum {
  HTML_W = 960, /* px, chart width */
  TL_H = 250,   /* px, timeline height */
  TL_LEFT = 72, /* px, room for the y labels */
  TL_RIGHT = 16,
  TL_TOP = 22,
  TL_BOTTOM = 34,
  MAP_ROW_H = 16, /* px, one row of the segment map */
  MAP_GAP = 5,    /* px between rows */
  MAP_ROWS = 24,  /* rows for the largest configuration on the shared scale */
  MAP_MAX_ROWS = 40
};

static void html_text(FILE *out, const char *s) {
  for (; *s; ++s) {
    switch (*s) {
    case '<':
      fputs("&lt;", out);
      break;
    case '>':
      fputs("&gt;", out);
      break;
    case '&':
      fputs("&amp;", out);
      break;
    case '"':
      fputs("&quot;", out);
      break;
    default:
      fputc(*s, out);
    }
  }
}

static void html_bytes(FILE *out, uint64_t b) {
  char buf[48];
  compare_format_bytes(b, buf, sizeof buf);
  fputs(buf, out);
}

/* ---- scales -------------------------------------------------------------------- */

/* A round step of about range / ticks: 1, 2 or 5 times a power of ten of `unit`. */
static double html_nice_step(double range, int ticks) {
  double raw = range / ticks;
  double p = pow(10.0, floor(log10(raw)));
  double m = raw / p;
  return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * p;
}

/* The unit in which to label a byte axis that reaches `max`. */
static void html_byte_unit(uint64_t max, double *unit, const char **name) {
  static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = (double)max;
  while (v >= 1024.0 * 1.5 && u < 4)
    v /= 1024.0, ++u;
  *unit = pow(1024.0, u);
  *name = names[u];
}

/* Shared scales: the largest value among those within `factor` times the
 * median; larger ones get their own scale. */
static uint64_t html_shared_max(const uint64_t *v, size_t n, double factor) {
  uint64_t *s = malloc((n ? n : 1) * sizeof *s);
  if (s == NULL) return 0;
  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (v[i]) s[m++] = v[i];
  uint64_t best = 0;
  if (m) {
    for (size_t i = 1; i < m; ++i)
      for (size_t j = i; j > 0 && s[j - 1] > s[j]; --j) {
        uint64_t x = s[j];
        s[j] = s[j - 1];
        s[j - 1] = x;
      }
    double median = (double)s[m / 2];
    for (size_t i = 0; i < m; ++i)
      if ((double)s[i] <= factor * median && s[i] > best) best = s[i];
  }
  free(s);
  return best;
}

/* A round row size of at least `min` bytes: 1, 1.5, 2, 3, 4 or 6 times a
 * power of two of MiB (or of bytes, below a MiB). */
static uint64_t html_nice_row(uint64_t min) {
  static const double m[] = {1.0, 1.5, 2.0, 3.0};
  for (uint64_t p = 1;; p *= 2)
    for (int i = 0; i < 4; ++i) {
      uint64_t v = (uint64_t)(m[i] * (double)p);
      if (p >= 1048576 ? v >= min : v >= min && m[i] == 1.0) return v;
      if (p > ((uint64_t)1 << 50)) return min;
    }
}

/* ---- the timeline --------------------------------------------------------------- */

static double tl_x(const gmr_trace_data_t *t, double ev) {
  double n = t->n_events > 1 ? (double)(t->n_events - 1) : 1.0;
  return TL_LEFT + ev / n * (HTML_W - TL_LEFT - TL_RIGHT);
}

static double tl_y(uint64_t b, uint64_t ymax) {
  double h = TL_H - TL_TOP - TL_BOTTOM;
  double v = ymax ? (double)b / (double)ymax : 0.0;
  if (v > 1.0) v = 1.0;
  return TL_TOP + h - v * h;
}

/* One series as an SVG path; `area` closes it down to the axis. */
static void tl_path(FILE *out, const gmr_trace_data_t *t, const compare_run_t *r, uint64_t ymax,
                    size_t field, int area, const char *cls) {
  fprintf(out, "<path class=\"%s\" d=\"", cls);
  for (size_t i = 0; i < r->n_points; ++i) {
    const compare_point_t *p = &r->points[i];
    uint64_t v = *(const uint64_t *)((const char *)p + field);
    double x0 = tl_x(t, i == 0 ? 0.0 : (double)r->points[i - 1].event + 1.0);
    double x1 = tl_x(t, (double)p->event);
    fprintf(out, "%s%.1f,%.1f L%.1f,%.1f ", i == 0 ? (area ? "M" : "M") : "L", x0, tl_y(v, ymax),
            x1, tl_y(v, ymax));
  }
  if (area && r->n_points)
    fprintf(out, "L%.1f,%.1f L%.1f,%.1f Z", tl_x(t, (double)r->points[r->n_points - 1].event),
            tl_y(0, ymax), tl_x(t, 0.0), tl_y(0, ymax));
  fputs("\"/>\n", out);
}

/* Each step up of reserved memory as a mark on the reserved line at its
 * request, titled with the request and the rule (Note [Why reserved grew]
 * in compare-replay.c). */
static void tl_steps(FILE *out, const gmr_trace_data_t *t, const compare_run_t *r, uint64_t ymax) {
  for (size_t i = 0; i < r->n_steps; ++i) {
    const compare_step_t *s = &r->steps[i];
    fprintf(out,
            "<path class=\"step\" data-event=\"%" PRIu64 "\" data-rule=\"%u\" "
            "data-grow=\"%" PRIu64 "\" d=\"M%.1f,%.1f l-3.5,-7 h7 z\"><title>event %" PRIu64
            " (line %u): ",
            s->event, (unsigned)s->rule, s->after - s->before, tl_x(t, (double)s->event),
            tl_y(s->after, ymax) - 1.0, s->event, (unsigned)s->line);
    html_bytes(out, s->request);
    fputs(" requested; reserved ", out);
    html_bytes(out, s->before);
    fputs(" &rarr; ", out);
    html_bytes(out, s->after);
    fputs(": ", out);
    html_text(out, compare_rule_text(s->rule));
    fputs("</title></path>\n", out);
  }
}

/* Under the timeline: how many steps each rule made, with the bytes they
 * added and the first request of each. */
static void html_steps(FILE *out, const compare_run_t *r) {
  if (r->all_steps == 0) return;
  uint64_t count[COMPARE_RULE_KINDS] = {0}, bytes[COMPARE_RULE_KINDS] = {0};
  const compare_step_t *first[COMPARE_RULE_KINDS] = {0};
  for (size_t i = 0; i < r->n_steps; ++i) {
    const compare_step_t *s = &r->steps[i];
    ++count[s->rule];
    bytes[s->rule] += s->after - s->before;
    if (first[s->rule] == NULL) first[s->rule] = s;
  }
  fprintf(out,
          "<h3>Why reserved memory grew</h3>\n<p class=\"scale\">Reserved memory stepped up at "
          "%" PRIu64 " request%s (the red marks on the timeline; hover one for the request)",
          r->all_steps, r->all_steps == 1 ? "" : "s");
  if (r->all_steps > r->n_steps)
    fprintf(out, "; the first %zu are marked and counted here", r->n_steps);
  fputs(".</p>\n<table class=\"steps\"><thead><tr><th>rule</th><th>steps</th><th>bytes added"
        "</th><th>first at</th></tr></thead><tbody>\n",
        out);
  for (int k = 0; k < COMPARE_RULE_KINDS; ++k) {
    if (count[k] == 0) continue;
    fputs("<tr><td>", out);
    html_text(out, compare_rule_text(k));
    fprintf(out, "</td><td>%" PRIu64 "</td><td>", count[k]);
    html_bytes(out, bytes[k]);
    fprintf(out, "</td><td>event %" PRIu64 " (line %u), ", first[k]->event,
            (unsigned)first[k]->line);
    html_bytes(out, first[k]->request);
    fputs("</td></tr>\n", out);
  }
  fputs("</tbody></table>\n", out);
}

static void html_timeline(FILE *out, const gmr_trace_data_t *t, const compare_run_t *r,
                          uint64_t ymax, int own_scale) {
  if (ymax == 0) ymax = 1;
  fprintf(out,
          "<svg class=\"chart timeline\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
          "role=\"img\" data-x0=\"%.1f\" data-x1=\"%.1f\" data-n=\"%zu\" data-top=\"%d\" "
          "data-bottom=\"%d\" aria-label=\"reserved and allocated bytes over the events of ",
          HTML_W, TL_H, HTML_W, TL_H, tl_x(t, 0.0),
          tl_x(t, t->n_events > 1 ? (double)(t->n_events - 1) : 1.0), t->n_events, TL_TOP,
          TL_H - TL_BOTTOM);
  html_text(out, r->name);
  /* The points again, for the hover read-out: "event reserved allocated
   * requested" in KiB, comma-separated. */
  fputs("\" data-pts=\"", out);
  for (size_t i = 0; i < r->n_points; ++i)
    fprintf(out, "%s%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, i ? "," : "", r->points[i].event,
            r->points[i].reserved >> 10, r->points[i].allocated >> 10,
            r->points[i].requested >> 10);
  fputs("\">\n", out);
  double unit;
  const char *uname;
  html_byte_unit(ymax, &unit, &uname);
  double step = html_nice_step((double)ymax / unit, 5);
  for (double v = 0; v <= (double)ymax / unit + 1e-9; v += step) {
    double y = tl_y((uint64_t)(v * unit), ymax);
    fprintf(out,
            "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>"
            "<text class=\"ylab\" x=\"%d\" y=\"%.1f\">%g %s</text>\n",
            TL_LEFT, HTML_W - TL_RIGHT, y, y, TL_LEFT - 6, y + 4, v, uname);
  }
  double xstep = html_nice_step(t->n_events > 1 ? (double)t->n_events : 1.0, 8);
  for (double e = 0; e < (double)t->n_events; e += xstep) {
    double x = tl_x(t, e);
    fprintf(out,
            "<line class=\"tick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>"
            "<text class=\"xlab\" x=\"%.1f\" y=\"%d\">%g</text>\n",
            x, x, TL_H - TL_BOTTOM, TL_H - TL_BOTTOM + 4, x, TL_H - TL_BOTTOM + 17, e);
  }
  fprintf(out, "<text class=\"xname\" x=\"%d\" y=\"%d\">event</text>\n", HTML_W - TL_RIGHT,
          TL_H - 3);
  tl_path(out, t, r, ymax, offsetof(compare_point_t, reserved), 1, "reserved");
  tl_path(out, t, r, ymax, offsetof(compare_point_t, allocated), 1, "allocated");
  tl_path(out, t, r, ymax, offsetof(compare_point_t, requested), 0, "requested");
  /* The peak, and the first OOM. */
  double px = tl_x(t, (double)r->res.peak_event);
  double py = tl_y(r->final.peak_reserved_bytes, ymax);
  fprintf(out, "<line class=\"peak\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>", px, px,
          TL_TOP - 6, TL_H - TL_BOTTOM);
  fprintf(out, "<circle class=\"peakdot\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\"/>", px, py);
  fprintf(out, "<text class=\"peaklab\" x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">peak reserved ",
          px + (px > HTML_W * 0.6 ? -6.0 : 6.0), TL_TOP - 8 + 10,
          px > HTML_W * 0.6 ? "end" : "start");
  html_bytes(out, r->final.peak_reserved_bytes);
  fprintf(out, " at event %zu</text>\n", r->res.peak_event);
  if (r->res.ooms) {
    double ox = tl_x(t, (double)r->res.first_oom_event);
    fprintf(out,
            "<line class=\"oom\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>"
            "<text class=\"oomlab\" x=\"%.1f\" y=\"%d\">first OOM (line %u)</text>\n",
            ox, ox, TL_TOP, TL_H - TL_BOTTOM, ox + 4, TL_H - TL_BOTTOM - 6, r->res.first_oom_line);
  }
  if (own_scale)
    fprintf(out, "<text class=\"own\" x=\"%d\" y=\"%d\">own scale</text>\n", TL_LEFT, TL_H - 3);
  tl_steps(out, t, r, ymax);
  fputs("<g class=\"hover\" visibility=\"hidden\"><line class=\"hl\"/><rect class=\"hb\" "
        "rx=\"4\"/><text class=\"ht\"></text></g>\n",
        out);
  fputs("</svg>\n", out);
}

/* ---- the segment map ------------------------------------------------------------ */

/* The bytes a segment occupies in the strip: its blocks, less unmapped ones
 * (an expandable segment's reserved-but-unmapped tail is not memory). */
static uint64_t map_segment_bytes(const compare_run_t *r, size_t i, size_t *next) {
  uint64_t bytes = 0;
  size_t j = i + 1;
  int blocks = 0;
  for (; j < r->n_map && !r->map[j].is_segment; ++j, blocks = 1)
    if (r->map[j].state != GMR_BLOCK_UNMAPPED) bytes += r->map[j].size;
  *next = j;
  return blocks ? bytes : r->map[i].size;
}

/* Note [The map of a policy that maps pages]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 * stitch's walk lists its ranges, and a range is address space: it maps
 * pages that other ranges may map too (a cached range keeps the pages that
 * a live block now holds through another range), and the slot bytes before
 * and after its block belong to its neighbours.  Summed, the ranges are
 * address space, not memory: drawn as segments they showed 9.78 GiB of
 * free blocks for the 11.54 MiB free of gpt2_train (issue 33).  The map
 * draws the pages held instead, each byte once:
 *   held = Σ live and pending blocks of the large ranges (blue, orange; a
 *          shared page's two ends are in two blocks, outlined)
 *        + Σ small-pool segments (their blocks; free ones red)
 *        + dead gaps (grey: between the two blocks of a shared page,
 *          stitch.dead_gap_bytes)
 *        + the rest: free pages and the free ends of open pages (red)
 * with held = the reserved bytes at the peak (pages x page size).  The
 * rest is the policy's own free figure (stitch.free_bytes) less the small
 * pool's free blocks; the caption says when the two differ.  Cached ranges
 * and the neighbours' slot bytes are counted under the map, not drawn.
 */
typedef struct map_pages_parts_s {
  uint64_t held, live, pending, small, small_free, dead, free_rest;
  uint64_t cached_va, slot_va;           /* address space, not drawn */
  uint64_t ranges, cached, small_ranges; /* counts */
} map_pages_parts_t;

static void map_pages_parts(const compare_run_t *r, map_pages_parts_t *m) {
  memset(m, 0, sizeof *m);
  int small = 0;
  for (size_t i = 0; i < r->n_map; ++i) {
    const compare_map_entry_t *e = &r->map[i];
    if (e->is_segment) {
      small = strcmp(e->pool, "small") == 0;
      if (small)
        m->small += e->size, ++m->small_ranges;
      else
        ++m->ranges;
      continue;
    }
    if (small) {
      if (e->state == GMR_BLOCK_FREE) m->small_free += e->size;
    } else if (e->state == GMR_BLOCK_ALLOCATED) {
      m->live += e->size;
    } else if (e->state == GMR_BLOCK_PENDING_FREE) {
      m->pending += e->size;
    } else if (e->state == GMR_BLOCK_FREE) {
      m->cached_va += e->size, ++m->cached;
    } else {
      m->slot_va += e->size;
    }
  }
  m->held = r->map_stats.reserved_bytes;
  m->dead = r->pages.dead_gap;
  uint64_t drawn = m->live + m->pending + m->small + m->dead;
  m->free_rest = m->held > drawn ? m->held - drawn : 0;
}

static uint64_t map_total(const compare_run_t *r) {
  if (r->pages.on) {
    map_pages_parts_t m;
    map_pages_parts(r, &m);
    return m.live + m.pending + m.small + m.dead + m.free_rest;
  }
  uint64_t total = 0;
  size_t next;
  for (size_t i = 0; i < r->n_map; i = next) {
    if (!r->map[i].is_segment) {
      next = i + 1;
      continue;
    }
    total += map_segment_bytes(r, i, &next);
  }
  return total;
}

static const char *map_state_class(int state) {
  switch (state) {
  case GMR_BLOCK_ALLOCATED:
    return "a";
  case GMR_BLOCK_PENDING_FREE:
    return "p";
  default:
    return "f";
  }
}

static const char *map_state_name(int state) {
  switch (state) {
  case GMR_BLOCK_ALLOCATED:
    return "allocated";
  case GMR_BLOCK_PENDING_FREE:
    return "freed, waiting for its stream";
  default:
    return "free";
  }
}

/* Draw [off, off + len) of the strip as rects, split where rows wrap. */
static void map_rects(FILE *out, uint64_t off, uint64_t len, uint64_t row_bytes, const char *cls,
                      const char *title) {
  while (len > 0) {
    uint64_t row = off / row_bytes, in_row = off % row_bytes;
    uint64_t n = row_bytes - in_row < len ? row_bytes - in_row : len;
    double x = (double)in_row / (double)row_bytes * HTML_W;
    double w = (double)n / (double)row_bytes * HTML_W;
    if (w < 0.4) w = 0.4;
    fprintf(out,
            "<rect class=\"%s\" x=\"%.2f\" y=\"%" PRIu64 "\" width=\"%.2f\" height=\"%d\" "
            "data-bytes=\"%" PRIu64 "\"><title>%s</title></rect>",
            cls, x, row * (MAP_ROW_H + MAP_GAP), w, MAP_ROW_H, n, title);
    off += n;
    len -= n;
  }
}

/* The map's <svg> and its empty rows, as many as the run's bytes need at
 * row_bytes a row; returns row_bytes (at least 1). */
static uint64_t segmap_open(FILE *out, const compare_run_t *r, uint64_t row_bytes) {
  uint64_t total = map_total(r);
  if (row_bytes == 0) row_bytes = 1;
  uint64_t rows = total ? (total + row_bytes - 1) / row_bytes : 1;
  int height = (int)rows * (MAP_ROW_H + MAP_GAP);
  fprintf(out,
          "<svg class=\"chart segmap\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
          "role=\"img\" aria-label=\"segments of %s at the peak\">\n",
          HTML_W, height, HTML_W, height, r->name);
  for (uint64_t k = 0; k < rows; ++k)
    fprintf(out, "<rect class=\"row\" x=\"0\" y=\"%" PRIu64 "\" width=\"%d\" height=\"%d\"/>",
            k * (MAP_ROW_H + MAP_GAP), HTML_W, MAP_ROW_H);
  fputc('\n', out);
  return row_bytes;
}

static void html_segmap(FILE *out, const compare_run_t *r, uint64_t row_bytes, int own_scale) {
  row_bytes = segmap_open(out, r, row_bytes);
  uint64_t off = 0;
  size_t next;
  char title[256], a[48], b[48];
  for (size_t i = 0; i < r->n_map; i = next) {
    const compare_map_entry_t *seg = &r->map[i];
    if (!seg->is_segment) {
      next = i + 1;
      continue;
    }
    uint64_t seg_bytes = map_segment_bytes(r, i, &next);
    uint64_t seg_off = off;
    if (next == i + 1) { /* a segment with no blocks listed: one allocated range */
      compare_format_bytes(seg->size, a, sizeof a);
      snprintf(title, sizeof title, "segment 0x%" PRIx64 ": %s", seg->address, a);
      map_rects(out, off, seg_bytes, row_bytes, "a", title);
      off += seg_bytes;
    }
    /* Runs of blocks in the same state are drawn as one rect. */
    for (size_t j = i + 1; j < next;) {
      if (r->map[j].state == GMR_BLOCK_UNMAPPED) {
        ++j;
        continue;
      }
      int state = r->map[j].state;
      uint64_t run = 0, req = 0;
      size_t count = 0;
      for (; j < next && (int)r->map[j].state == state; ++j, ++count)
        run += r->map[j].size, req += r->map[j].requested;
      compare_format_bytes(run, a, sizeof a);
      compare_format_bytes(req, b, sizeof b);
      if (state == GMR_BLOCK_ALLOCATED)
        snprintf(title, sizeof title,
                 "%zu allocated block%s: %s (%s requested) in %s segment 0x%" PRIx64, count,
                 count == 1 ? "" : "s", a, b, seg->pool[0] ? seg->pool : "a", seg->address);
      else
        snprintf(title, sizeof title, "%s: %s in %zu block%s, %s segment 0x%" PRIx64,
                 map_state_name(state), a, count, count == 1 ? "" : "s",
                 seg->pool[0] ? seg->pool : "a", seg->address);
      map_rects(out, off, run, row_bytes, map_state_class(state), title);
      /* Pages shared with a neighbour (stitch): outlined, the page's number
       * in the title, so the two blocks that hold one page can be matched. */
      uint64_t at = off;
      for (size_t q = j - count; q < j; ++q) {
        const compare_map_entry_t *blk = &r->map[q];
        if (blk->shared_head) {
          snprintf(title, sizeof title,
                   "page #%" PRIu64 ", shared: its tail holds another block, its head the "
                   "first %" PRIu64 " bytes of this one",
                   blk->head_page, blk->shared_head);
          map_rects(out, at, blk->shared_head, row_bytes, "sh", title);
        }
        if (blk->shared_tail) {
          snprintf(title, sizeof title,
                   "page #%" PRIu64 ", shared: its tail holds the last %" PRIu64
                   " bytes of this block, its head another block",
                   blk->tail_page, blk->shared_tail);
          map_rects(out, at + blk->size - blk->shared_tail, blk->shared_tail, row_bytes, "sh",
                    title);
        }
        at += blk->size;
      }
      off += run;
    }
    /* The segment's start, as a thin gap, where the segment is wide enough to show it. */
    if ((double)seg_bytes / (double)row_bytes * HTML_W >= 3.0 && seg_off % row_bytes != 0) {
      uint64_t row = seg_off / row_bytes;
      double x = (double)(seg_off % row_bytes) / (double)row_bytes * HTML_W;
      fprintf(out,
              "<line class=\"seg\" x1=\"%.2f\" x2=\"%.2f\" y1=\"%" PRIu64 "\" y2=\"%" PRIu64
              "\"/>\n",
              x, x, row * (MAP_ROW_H + MAP_GAP), row * (MAP_ROW_H + MAP_GAP) + MAP_ROW_H);
    }
    (void)seg_bytes;
  }
  fputs("</svg>\n", out);
  compare_format_bytes(row_bytes, a, sizeof a);
  fprintf(out,
          "<p class=\"scale\">Each row is %s%s; a white gap marks the start of a segment wide "
          "enough to show one.</p>\n",
          a, own_scale ? " (own scale: this configuration is far larger than the others)" : "");
}

/* The map of a policy that maps pages (Note [The map of a policy that maps
 * pages]): the blocks in address order, then the dead gaps and the free
 * pages; the address space that holds no memory of its own, under it. */
static void html_segmap_pages(FILE *out, const compare_run_t *r, uint64_t row_bytes,
                              int own_scale) {
  map_pages_parts_t m;
  map_pages_parts(r, &m);
  row_bytes = segmap_open(out, r, row_bytes);
  uint64_t off = 0;
  char title[320], a[48], b[48];
  int small = 0;
  uint64_t range = 0;
  for (size_t i = 0; i < r->n_map; ++i) {
    const compare_map_entry_t *e = &r->map[i];
    if (e->is_segment) {
      small = strcmp(e->pool, "small") == 0;
      range = e->address;
      continue;
    }
    /* Large ranges: only the block is memory of the range's own; a cached
     * range's pages are another block's or free, and its slots' other bytes
     * are its neighbours'. */
    if (!small && (e->state == GMR_BLOCK_FREE || e->state == GMR_BLOCK_UNMAPPED)) continue;
    if (small && e->state == GMR_BLOCK_UNMAPPED) continue;
    compare_format_bytes(e->size, a, sizeof a);
    compare_format_bytes(e->requested, b, sizeof b);
    if (e->state == GMR_BLOCK_ALLOCATED)
      snprintf(
          title, sizeof title, "%s block: %s (%s requested) at 0x%" PRIx64 ", %s range 0x%" PRIx64,
          small ? "small-pool" : "allocated", a, b, e->address, small ? "small-pool" : "a", range);
    else
      snprintf(title, sizeof title, "%s: %s at 0x%" PRIx64 "%s", map_state_name(e->state), a,
               e->address, small ? " in a small-pool segment" : "");
    map_rects(out, off, e->size, row_bytes, map_state_class(e->state), title);
    if (e->shared_head) {
      snprintf(title, sizeof title,
               "page #%" PRIu64
               ", shared: its tail holds another block, its head the first %" PRIu64
               " bytes of this one",
               e->head_page, e->shared_head);
      map_rects(out, off, e->shared_head, row_bytes, "sh", title);
    }
    if (e->shared_tail) {
      snprintf(title, sizeof title,
               "page #%" PRIu64 ", shared: its tail holds the last %" PRIu64
               " bytes of this block, its head another block",
               e->tail_page, e->shared_tail);
      map_rects(out, off + e->size - e->shared_tail, e->shared_tail, row_bytes, "sh", title);
    }
    off += e->size;
  }
  if (m.dead) {
    compare_format_bytes(m.dead, a, sizeof a);
    snprintf(title, sizeof title,
             "dead gaps: %s between the two blocks of %" PRIu64
             " shared pages (held, usable by neither)",
             a, r->pages.shared_pages);
    map_rects(out, off, m.dead, row_bytes, "dg", title);
    off += m.dead;
  }
  if (m.free_rest) {
    compare_format_bytes(m.free_rest, a, sizeof a);
    snprintf(title, sizeof title,
             "free: %s in %" PRIu64 " whole free pages and the free ends of pages (whole "
             "pages stitch into a range of any length)",
             a, r->pages.free_pages);
    map_rects(out, off, m.free_rest, row_bytes, "f", title);
  }
  fputs("</svg>\n", out);
  compare_format_bytes(row_bytes, a, sizeof a);
  fprintf(out,
          "<p class=\"scale\">Each row is %s%s of the %" PRIu64 " pages held (%s each), each "
          "byte once: the blocks in address order, then the dead gaps and the free pages.",
          a, own_scale ? " (own scale: this configuration is far larger than the others)" : "",
          r->pages.pages, (compare_format_bytes(r->pages.page_size, b, sizeof b), b));
  compare_format_bytes(m.cached_va, a, sizeof a);
  compare_format_bytes(m.slot_va, b, sizeof b);
  fprintf(out,
          " Not drawn, because it is address space and holds no memory of its own: %s in %" PRIu64
          " cached range%s (their pages are held by the blocks above, or free) and %s of the "
          "ranges' end pages outside their blocks (another block's end, or a free page end "
          "drawn above).</p>\n",
          a, m.cached, m.cached == 1 ? "" : "s", b);
}

/* ---- captions ------------------------------------------------------------------- */

/* The free total is too small to matter when it is under 1 % of what the
 * policy holds: its fragmentation, however high, costs at most that. */
static int caption_free_small(uint64_t free_bytes, uint64_t held) {
  return free_bytes > 0 && (double)free_bytes < 0.01 * (double)held;
}

/* What a policy's reservations are called, in its own terms. */
static const char *caption_noun(const compare_run_t *r, uint64_t n, int *expandable) {
  *expandable = 0;
  for (size_t i = 0; i < r->n_map; ++i)
    if (r->map[i].is_segment && r->map[i].is_expandable) *expandable = 1;
  if (*expandable && r->res.at_peak.segments == 0)
    return n == 1 ? "expandable segment (a virtual range mapped page by page)"
                  : "expandable segments (virtual ranges mapped page by page)";
  *expandable = 0;
  if (strstr(r->policy, "bfc")) return n == 1 ? "region" : "regions";
  if (strstr(r->policy, "direct")) return n == 1 ? "reservation" : "reservations";
  return n == 1 ? "segment" : "segments";
}

/* Stitch's peak in its own terms: pages, shared pages, dead gaps, ranges
 * (Note [The map of a policy that maps pages]). */
static void caption_pages(FILE *out, const compare_run_t *r) {
  const gmr_stats_t *p = &r->res.at_peak;
  const compare_pages_t *pg = &r->pages;
  map_pages_parts_t m;
  map_pages_parts(r, &m);
  uint64_t requested = p->requested_bytes;
  fputs("</b> in ", out);
  fprintf(out, "%" PRIu64 " page%s of ", pg->pages, pg->pages == 1 ? "" : "s");
  html_bytes(out, pg->page_size);
  fprintf(out, " (%" PRIu64 " shared by two blocks, one at each end) for ", pg->shared_pages);
  html_bytes(out, requested);
  fprintf(out,
          " requested, mapped into %" PRIu64 " range%s (%" PRIu64 " of them cached for reuse) and "
          "%" PRIu64 " small-pool segment%s. ",
          m.ranges, m.ranges == 1 ? "" : "s", m.cached, m.small_ranges,
          m.small_ranges == 1 ? "" : "s");
  uint64_t overhead = m.held > requested ? m.held - requested : 0;
  if (overhead == 0) return;
  char free_what[128];
  if (pg->free_pages)
    snprintf(free_what, sizeof free_what,
             " in %" PRIu64 " whole free page%s and the free ends of pages (red)", pg->free_pages,
             pg->free_pages == 1 ? "" : "s");
  else
    snprintf(free_what, sizeof free_what,
             " in the free ends of pages (red; no whole page is free)");
  const struct {
    uint64_t bytes;
    const char *what;
  } part[5] = {{m.free_rest, free_what},
               {m.small_free, " in the small pool's free blocks (red, inside its segments)"},
               {m.dead, " in dead gaps between the two blocks of a shared page (grey)"},
               {r->rounding_at_peak, " lost to rounding requests up"},
               {m.pending, " freed but waiting for stream work (orange)"}};
  int n_parts = 0, done = 0;
  for (int i = 0; i < 5; ++i)
    n_parts += part[i].bytes != 0;
  fputs("The ", out);
  html_bytes(out, overhead);
  fputs(" above the request is ", out);
  for (int i = 0; i < 5; ++i) {
    if (part[i].bytes == 0) continue;
    if (done) fputs(done + 1 == n_parts ? " and " : ", ", out);
    html_bytes(out, part[i].bytes);
    fputs(part[i].what, out);
    ++done;
  }
  fputs(". ", out);
  uint64_t free_all = m.free_rest + m.small_free + m.dead;
  if (free_all == 0) return;
  fputs("A request of up to ", out);
  html_bytes(out, r->largest_at_peak);
  fputs(" is served without mapping new pages (whole free pages stitch into one range in any "
        "order, with the largest free page end); a larger one maps new pages. ",
        out);
  if (caption_free_small(free_all, m.held)) {
    fprintf(out,
            "The free total is %.2f %% of what it holds: too little for its fragmentation "
            "figure (%.0f %%) to matter. ",
            100.0 * (double)free_all / (double)m.held, 100.0 * r->fragmentation);
  }
}

/* Why this configuration needs what it needs, in its own numbers and next
 * to the configuration that needed least. */
static void html_caption(FILE *out, const compare_run_t *r, const compare_run_t *least) {
  const gmr_stats_t *p = &r->res.at_peak;
  uint64_t reserved = p->reserved_bytes, requested = p->requested_bytes;
  uint64_t overhead = reserved > requested ? reserved - requested : 0;
  uint64_t pending =
      p->active_bytes > p->allocated_bytes ? p->active_bytes - p->allocated_bytes : 0;
  fputs("<p class=\"caption\">At its peak (event ", out);
  fprintf(out, "%zu) <b>", r->res.peak_event);
  html_text(out, r->name);
  fputs("</b> held <b>", out);
  html_bytes(out, reserved);
  uint64_t segments = 0;
  for (size_t i = 0; i < r->n_map; ++i)
    segments += r->map[i].is_segment;
  if (segments == 0) segments = p->segments;
  int expandable = 0;
  const char *noun = caption_noun(r, segments, &expandable);
  if (r->pages.on && r->map_status == 0) {
    caption_pages(out, r);
  } else {
    if (segments)
      fprintf(out, "</b> %s %" PRIu64 " %s for ", expandable ? "mapped into" : "in", segments,
              noun);
    else
      fputs("</b> for ", out);
    html_bytes(out, requested);
    fputs(" requested. ", out);
  }
  if (r->pages.on && r->map_status == 0) {
    /* said above, in the policy's own terms */
  } else if (overhead == 0) {
    fputs("It holds nothing beyond what the program asked for: no cache, no rounding", out);
    if (r->final.device_allocs > 1)
      fprintf(out,
              "; the price is a device call for every allocation and every free "
              "(%" PRIu64 " reservations)",
              r->final.device_allocs);
    fputs(". ", out);
  } else {
    /* The overhead, in its nonzero parts. */
    char inside[96];
    snprintf(inside, sizeof inside, " in free blocks inside its %s (red)",
             strstr(r->policy, "bfc") ? "regions" : "segments");
    const struct {
      uint64_t bytes;
      const char *what;
    } part[3] = {{r->free_at_peak - (pending < r->free_at_peak ? pending : 0), inside},
                 {r->rounding_at_peak, " lost to rounding requests up"},
                 {pending, " freed but waiting for stream work (orange)"}};
    int n_parts = 0, done = 0;
    for (int i = 0; i < 3; ++i)
      n_parts += part[i].bytes != 0;
    fputs("The ", out);
    html_bytes(out, overhead);
    fputs(" above the request ", out);
    fputs(n_parts ? "is " : "is not broken down at this event", out);
    for (int i = 0; i < 3; ++i) {
      if (part[i].bytes == 0) continue;
      if (done) fputs(done + 1 == n_parts ? " and " : ", ", out);
      html_bytes(out, part[i].bytes);
      fputs(part[i].what, out);
      ++done;
    }
    fputs(". ", out);
    if (r->free_at_peak > 0 && caption_free_small(r->free_at_peak, reserved)) {
      fputs("Only ", out);
      html_bytes(out, r->free_at_peak);
      fprintf(out,
              " is free (%.2f %% of what it holds): too little for its fragmentation figure "
              "(%.0f %%) to matter. ",
              100.0 * (double)r->free_at_peak / (double)reserved, 100.0 * r->fragmentation);
    } else if (r->free_at_peak > 0) {
      if (r->largest_at_peak * 2 >= r->free_at_peak && r->fragmentation < 0.5) {
        fputs("Most of the free space is one block of ", out);
        html_bytes(out, r->largest_at_peak);
        fputs(": memory reserved ahead of need (or kept from an earlier, larger phase) "
              "rather than fragmentation. ",
              out);
      } else {
        fprintf(out, "It is split into many holes (fragmentation %.0f%%: the largest is ",
                100.0 * r->fragmentation);
        html_bytes(out, r->largest_at_peak);
        fprintf(out,
                "), so a request larger than the largest hole %s even though the free total "
                "would cover it. ",
                expandable                 ? "maps more pages at a segment's end"
                : strstr(r->policy, "bfc") ? "needs a new region"
                                           : "needs a new segment");
      }
    }
  }
  if (r->res.ooms) {
    char line[400];
    const char *m = r->res.first_oom_message, *nl = strchr(m, '\n');
    snprintf(line, sizeof line, "%.*s", nl ? (int)(nl - m) : (int)strlen(m), m);
    fprintf(out, "<b>%zu allocation%s failed</b>; the first at event %zu (line %u of the trace): ",
            r->res.ooms, r->res.ooms == 1 ? "" : "s", r->res.first_oom_event,
            r->res.first_oom_line);
    fputs("<q>", out);
    html_text(out, line);
    fputs("</q> ", out);
  }
  if (least && least != r && least->final.peak_reserved_bytes < r->final.peak_reserved_bytes) {
    fprintf(out, "Its peak reserved is %.2f times that of <b>",
            (double)r->final.peak_reserved_bytes / (double)least->final.peak_reserved_bytes);
    html_text(out, least->name);
    fputs("</b> (", out);
    html_bytes(out, r->final.peak_reserved_bytes - least->final.peak_reserved_bytes);
    fputs(" more), the least of this comparison.", out);
  } else if (least == r) {
    fputs("This is the least peak reserved of this comparison.", out);
  }
  compare_cost_t c;
  compare_cost_estimate(r, &c);
  char t[32];
  compare_format_us(c.us_total, t, sizeof t);
  fprintf(out,
          " Its %" PRIu64 " driver call%s would take about <b>%s</b> of device time on an H200 "
          "(the cost model of docs/compare.md",
          c.total_calls, c.total_calls == 1 ? "" : "s", t);
  if (c.unmeasured_calls)
    fprintf(out,
            "; %" PRIu64
            " event, synchronize and virtual-release calls have no figure and are left out",
            c.unmeasured_calls);
  fputs(").</p>\n", out);
}

/* ---- the page ------------------------------------------------------------------- */

static const char html_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;"
    "background:#f4f6f9;margin:0}\n"
    "main{max-width:1180px;margin:0 auto;padding:24px 20px 40px}\n"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:0 0 6px}\n"
    "h2 small{font-weight:400;color:#5b6475;font-size:13px;margin-left:8px}\n"
    ".sub{color:#5b6475;margin:0 0 18px}\n"
    "section{background:#fff;border:1px solid #dfe3ea;border-radius:10px;padding:16px 18px;"
    "margin:0 0 20px;box-shadow:0 1px 2px rgba(20,30,50,.05)}\n"
    "h3{font-size:14px;margin:14px 0 4px;color:#333b4d}\n"
    ".scroll{overflow-x:auto;margin-top:10px}\n"
    "table{border-collapse:collapse;font-variant-numeric:tabular-nums;width:100%;font-size:13px}\n"
    "th,td{padding:3px 7px;text-align:right;border-bottom:1px solid #eef0f4;white-space:nowrap}\n"
    "td.sub{padding-left:22px}\n"
    "th:first-child,td:first-child{text-align:left;color:#5b6475}\n"
    "thead th{color:#1d2330;border-bottom:2px solid #cfd5df}\n"
    ".chart{display:block;width:100%;height:auto;font:11px system-ui,sans-serif}\n"
    ".grid{stroke:#e7eaf0}.tick{stroke:#9aa3b2}.ylab{text-anchor:end;fill:#5b6475}\n"
    ".xlab{text-anchor:middle;fill:#5b6475}.xname{text-anchor:end;fill:#5b6475}\n"
    "path.reserved{fill:#cfe0f5;stroke:#3b75c4;stroke-width:1.4}\n"
    "path.allocated{fill:#8fd0a6;fill-opacity:.85;stroke:#2b8a4b;stroke-width:1.2}\n"
    "path.requested{fill:none;stroke:#1d2330;stroke-width:1;stroke-dasharray:4 3}\n"
    ".peak{stroke:#c0392b;stroke-width:1;stroke-dasharray:2 2}.peakdot{fill:#c0392b}\n"
    ".peaklab{fill:#c0392b;font-weight:600}path.step{fill:#c0392b;fill-opacity:.75}"
    "path.step:hover{fill-opacity:1}.oom{stroke:#8e44ad;stroke-width:2}"
    ".oomlab{fill:#8e44ad;font-weight:600}.own{fill:#b9770e;font-weight:600}\n"
    ".segmap .row{fill:#eef0f4}.segmap .a{fill:#3b75c4}.segmap .f{fill:#e4572e}"
    ".segmap .p{fill:#f0a202}.segmap .dg{fill:#8a8f99}.segmap .seg{stroke:#fff;stroke-width:1.5}\n"
    ".segmap .sh{fill:#7b3fa0;fill-opacity:.55;stroke:#4b1f66;stroke-width:1}\n"
    ".segmap rect:hover{opacity:.7}\n"
    ".hover .hl{stroke:#1d2330;stroke-width:1;stroke-dasharray:3 2}"
    ".hover .hb{fill:#fff;stroke:#9aa3b2;fill-opacity:.95}.hover .ht{fill:#1d2330;font-size:11px}\n"
    ".legend{display:flex;gap:16px;flex-wrap:wrap;color:#5b6475;font-size:12px;margin:4px 0}\n"
    ".legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;"
    "vertical-align:-2px}\n"
    ".caption{margin:8px 0 0;color:#333b4d}.scale{margin:4px 0 0;color:#5b6475;font-size:12px}\n"
    ".error{color:#b03a2e;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}\n"
    ".ovl{fill:#1d2330}.ovr{fill:#3b75c4}.ovq{fill:#2b8a4b}.ovv{fill:#5b6475}"
    ".ovin{fill:#fff;font-weight:600}.ovt{fill:#8a5a00}\n"
    "#render-status{color:#8a93a3;font-size:12px;text-align:center}\n";

static const char html_js[] =
    "(function(){\n"
    "  function fmt(k){var b=k*1024,u=['B','KiB','MiB','GiB','TiB'],i=0;\n"
    "    while(b>=1024&&i<4){b/=1024;i++;}return (i?b.toFixed(2):b)+' '+u[i];}\n"
    "  document.querySelectorAll('svg.chart.timeline').forEach(function(s){\n"
    "    var d=s.getAttribute('data-pts');if(!d)return;\n"
    "    var p=d.split(',').map(function(t){return t.split(' ').map(Number);});\n"
    "    var x0=+s.dataset.x0,x1=+s.dataset.x1,n=+s.dataset.n,top=+s.dataset.top,\n"
    "      bot=+s.dataset.bottom,g=s.querySelector('g.hover'),l=g.querySelector('line'),\n"
    "      r=g.querySelector('rect'),t=g.querySelector('text');\n"
    "    s.addEventListener('mousemove',function(ev){\n"
    "      var pt=s.createSVGPoint();pt.x=ev.clientX;pt.y=ev.clientY;\n"
    "      var q=pt.matrixTransform(s.getScreenCTM().inverse());\n"
    "      if(q.x<x0||q.x>x1){g.setAttribute('visibility','hidden');return;}\n"
    "      var e=(q.x-x0)/(x1-x0)*Math.max(n-1,1),lo=0,hi=p.length-1;\n"
    "      while(lo<hi){var m=(lo+hi)>>1;if(p[m][0]<e)lo=m+1;else hi=m;}\n"
    "      var v=p[lo];\n"
    "      l.setAttribute('x1',q.x);l.setAttribute('x2',q.x);l.setAttribute('y1',top);\n"
    "      l.setAttribute('y2',bot);\n"
    "      t.textContent='event '+v[0]+': reserved '+fmt(v[1])+', allocated '+fmt(v[2])+\n"
    "        ', requested '+fmt(v[3]);\n"
    "      var w=t.getComputedTextLength()+12,bx=q.x+8>x1-w?q.x-8-w:q.x+8;\n"
    "      r.setAttribute('x',bx);r.setAttribute('y',top+4);r.setAttribute('width',w);\n"
    "      r.setAttribute('height',18);t.setAttribute('x',bx+6);t.setAttribute('y',top+17);\n"
    "      g.setAttribute('visibility','visible');});\n"
    "    s.addEventListener('mouseleave',function(){g.setAttribute('visibility','hidden');});\n"
    "  });\n"
    "  function laid(sel){var n=0;document.querySelectorAll(sel).forEach(function(s){\n"
    "    var b=s.getBoundingClientRect();if(b.width>0&&b.height>0)n++;});return n;}\n"
    "  var t=laid('svg.chart.timeline'),m=laid('svg.chart.segmap');\n"
    "  var s=document.getElementById('render-status');\n"
    "  s.setAttribute('data-timelines',t);s.setAttribute('data-segmaps',m);\n"
    "  s.textContent='Rendered '+t+' timelines and '+m+' segment maps.';\n"
    "})();\n";

/* An overview row's label, the configuration's name, with "did not run"
 * after it when the configuration has no figures (false then). */
static bool overview_label(FILE *out, const compare_run_t *r, int left, int baseline) {
  fprintf(out, "<text class=\"ovl\" x=\"%d\" y=\"%d\" text-anchor=\"end\">", left - 8, baseline);
  html_text(out, r->name);
  fputs("</text>", out);
  if (r->status == COMPARE_OK || r->status == COMPARE_ECHECK) return true;
  fprintf(out, "<text class=\"ovv\" x=\"%d\" y=\"%d\">did not run</text>\n", left, baseline);
  return false;
}

static void html_overview(FILE *out, const compare_run_t *runs, size_t n, uint64_t vmax) {
  int bar_h = 18, gap = 10, left = 190, right = 200;
  int h = (int)n * (bar_h + gap) + 10;
  fprintf(out,
          "<svg class=\"chart overview\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
          "role=\"img\" aria-label=\"peak reserved and requested per configuration\">\n",
          HTML_W, h, HTML_W, h);
  if (vmax == 0) vmax = 1;
  for (size_t k = 0; k < n; ++k) {
    const compare_run_t *r = &runs[k];
    int y = 5 + (int)k * (bar_h + gap);
    if (!overview_label(out, r, left, y + bar_h - 5)) continue;
    double span = HTML_W - left - right;
    double wr = span * fmin(1.0, (double)r->final.peak_reserved_bytes / (double)vmax);
    double wq = span * fmin(1.0, (double)r->final.peak_requested_bytes / (double)vmax);
    fprintf(out, "<rect class=\"ovr\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" rx=\"3\"/>",
            left, y, fmax(wr, 1.0), bar_h);
    fprintf(out, "<rect class=\"ovq\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" rx=\"2\"/>",
            left, y + bar_h / 2 - 3, fmax(wq, 1.0), 6);
    if (wr > span * 0.62)
      fprintf(out, "<text class=\"ovin\" x=\"%.1f\" y=\"%d\" text-anchor=\"end\">", left + wr - 8,
              y + bar_h - 5);
    else
      fprintf(out, "<text class=\"ovv\" x=\"%.1f\" y=\"%d\">", left + fmax(wr, 1.0) + 8,
              y + bar_h - 5);
    html_bytes(out, r->final.peak_reserved_bytes);
    if (r->final.peak_requested_bytes)
      fprintf(out, " (%.4f x requested)",
              (double)r->final.peak_reserved_bytes / (double)r->final.peak_requested_bytes);
    if (r->res.ooms) fprintf(out, ", %zu OOM%s", r->res.ooms, r->res.ooms == 1 ? "" : "s");
    fputs("</text>\n", out);
  }
  fputs("</svg>\n", out);
}

/* The device time of each configuration's driver calls (the H200 cost
 * model, compare-cost.c), on one linear scale, beside the memory above:
 * what the memory costs in time. */
static void html_overview_cost(FILE *out, const compare_run_t *runs, size_t n) {
  int bar_h = 18, gap = 10, left = 190, right = 200;
  int h = (int)n * (bar_h + gap) + 10;
  double tmax = 0;
  for (size_t k = 0; k < n; ++k) {
    compare_cost_t c;
    compare_cost_estimate(&runs[k], &c);
    if ((runs[k].status == COMPARE_OK || runs[k].status == COMPARE_ECHECK) && c.us_total > tmax)
      tmax = c.us_total;
  }
  fprintf(out,
          "<svg class=\"chart overview cost\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
          "role=\"img\" aria-label=\"device time of the driver calls per configuration\">\n",
          HTML_W, h, HTML_W, h);
  for (size_t k = 0; k < n; ++k) {
    const compare_run_t *r = &runs[k];
    int y = 5 + (int)k * (bar_h + gap);
    if (!overview_label(out, r, left, y + bar_h - 5)) continue;
    compare_cost_t c;
    compare_cost_estimate(r, &c);
    double span = HTML_W - left - right;
    double w = tmax > 0 ? span * c.us_total / tmax : 0.0;
    char t[32];
    compare_format_us(c.us_total, t, sizeof t);
    fprintf(out,
            "<rect class=\"ovt\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" rx=\"3\">"
            "<title>%" PRIu64 " driver calls: %s</title></rect>",
            left, y, fmax(w, 1.0), bar_h, c.total_calls, t);
    if (w > span * 0.62) /* a long bar holds its label, as the memory bars do */
      fprintf(out, "<text class=\"ovin\" x=\"%.1f\" y=\"%d\" text-anchor=\"end\">", left + w - 8,
              y + bar_h - 5);
    else
      fprintf(out, "<text class=\"ovv\" x=\"%.1f\" y=\"%d\">", left + fmax(w, 1.0) + 8,
              y + bar_h - 5);
    fprintf(out, "%s in %" PRIu64 " driver call%s", t, c.total_calls,
            c.total_calls == 1 ? "" : "s");
    if (c.unmeasured_calls) fprintf(out, " (%" PRIu64 " not priced)", c.unmeasured_calls);
    fputs("</text>\n", out);
  }
  fputs("</svg>\n", out);
}

static void html_table(FILE *out, const compare_run_t *runs, size_t n, const compare_opts_t *o) {
  fputs("<div class=\"scroll\"><table><thead><tr><th></th>", out);
  for (size_t k = 0; k < n; ++k) {
    fputs("<th>", out);
    html_text(out, runs[k].name);
    fputs("</th>", out);
  }
  fputs("</tr></thead><tbody>\n", out);
  char cell[96];
  for (int row = 0; compare_table_label(row); ++row) {
    if (!compare_table_shows(row, o)) continue;
    const char *label = compare_table_label(row);
    if (label[0] == ' ') /* a breakdown of the row above: indented */
      fprintf(out, "<tr><td class=\"sub\">%s</td>", label + strspn(label, " "));
    else
      fprintf(out, "<tr><td>%s</td>", label);
    for (size_t k = 0; k < n; ++k) {
      compare_table_cell(&runs[k], row, cell, sizeof cell);
      fputs("<td>", out);
      html_text(out, cell);
      fputs("</td>", out);
    }
    fputs("</tr>\n", out);
  }
  fputs("</tbody></table></div>\n", out);
}

static void html_config(FILE *out, const gmr_trace_data_t *t, const compare_run_t *r,
                        const compare_run_t *least, uint64_t tl_shared, uint64_t row_shared) {
  fprintf(out, "<section class=\"config\" id=\"config-");
  html_text(out, r->name);
  fputs("\">\n<h2>", out);
  html_text(out, r->name);
  fputs("<small>", out);
  html_text(out, r->policy[0] ? r->policy : "");
  fputs(" &middot; ", out);
  html_text(out, r->source);
  fputs("</small></h2>\n", out);
  if (r->status != COMPARE_OK) {
    fputs("<p class=\"error\">", out);
    html_text(out, r->error);
    fputs("</p>\n", out);
    if (r->status != COMPARE_ECHECK || r->n_points == 0) {
      fputs("</section>\n", out);
      return;
    }
  }
  if (r->yaml) {
    fputs("<pre class=\"scale\">", out);
    html_text(out, r->yaml);
    fputs("</pre>\n", out);
  }
  uint64_t own = r->final.peak_reserved_bytes;
  int tl_own = own > tl_shared;
  fputs("<h3>Timeline</h3>\n<div class=\"legend\"><span><i style=\"background:#cfe0f5;"
        "border:1px solid #3b75c4\"></i>reserved (held from the device)</span><span><i "
        "style=\"background:#8fd0a6\"></i>allocated (live blocks, rounded)</span><span><i "
        "style=\"border-top:2px dashed #1d2330;height:0;width:16px\"></i>requested</span></div>\n",
        out);
  html_timeline(out, t, r, tl_own ? own : tl_shared, tl_own);
  size_t bucket = (t->n_events + COMPARE_TIMELINE_POINTS - 1) / COMPARE_TIMELINE_POINTS;
  fprintf(out,
          "<p class=\"scale\">Each step of the lines is the maximum over %zu event%s. The "
          "gap between reserved and allocated is memory the policy holds for reuse.",
          bucket ? bucket : 1, bucket == 1 ? "" : "s");
  if (r->res.ooms)
    fprintf(out,
            " The purple line is the first allocation that failed (event %zu, line %u of "
            "the trace).",
            r->res.first_oom_event, r->res.first_oom_line);
  fputs("</p>\n", out);
  html_steps(out, r);
  fputs("<h3>Segments at the peak</h3>\n", out);
  if (r->map_status != 0 || r->n_map == 0) {
    fprintf(out, "<p class=\"scale\">No segment map: %s.</p>\n",
            r->map_status == GMR_ENOTSUP ? "this policy keeps no segments to walk"
            : r->map_status != 0         ? gmr_strerror(r->map_status)
                                         : "nothing was reserved at the peak");
  } else if (r->pages.on) {
    fputs("<div class=\"legend\"><span><i style=\"background:#3b75c4\"></i>allocated (the "
          "pages its blocks hold)</span><span><i style=\"background:#7b3fa0\"></i>a page shared "
          "by two blocks (at both ends; the title names the page)</span><span><i "
          "style=\"background:#8a8f99\"></i>dead gap (on a shared page, between its two "
          "blocks)</span><span><i style=\"background:#e4572e\"></i>free pages and page ends"
          "</span><span><i style=\"background:#f0a202\"></i>freed, waiting for stream "
          "work</span></div>\n",
          out);
    uint64_t total = map_total(r);
    uint64_t rows_shared = row_shared ? (total + row_shared - 1) / row_shared : 0;
    int map_own = row_shared == 0 || rows_shared > MAP_MAX_ROWS;
    uint64_t row_bytes = map_own ? html_nice_row((total + MAP_ROWS - 1) / MAP_ROWS) : row_shared;
    html_segmap_pages(out, r, row_bytes ? row_bytes : 1, map_own && row_shared != 0);
  } else {
    fputs("<div class=\"legend\"><span><i style=\"background:#3b75c4\"></i>allocated</span>"
          "<span><i style=\"background:#e4572e\"></i>free (cached, unused)</span><span><i "
          "style=\"background:#f0a202\"></i>freed, waiting for stream work</span>",
          out);
    int shares = 0;
    for (size_t q = 0; q < r->n_map && !shares; ++q)
      shares = r->map[q].shared_head != 0 || r->map[q].shared_tail != 0;
    if (shares)
      fputs("<span><i style=\"background:#7b3fa0\"></i>a page shared by two blocks (drawn at "
            "both; the title names the page)</span>",
            out);
    fputs("</div>\n", out);
    uint64_t total = map_total(r);
    uint64_t rows_shared = row_shared ? (total + row_shared - 1) / row_shared : 0;
    int map_own = row_shared == 0 || rows_shared > MAP_MAX_ROWS;
    uint64_t row_bytes = map_own ? html_nice_row((total + MAP_ROWS - 1) / MAP_ROWS) : row_shared;
    html_segmap(out, r, row_bytes ? row_bytes : 1, map_own && row_shared != 0);
  }
  html_caption(out, r, least);
  compare_site_t top[COMPARE_TOP_SITES];
  size_t m = compare_sites_at(t, r->res.peak_event, top, COMPARE_TOP_SITES);
  if (m > 0) {
    fputs("<h3>Call sites at the peak</h3>\n<table class=\"sites\"><thead><tr><th>requested"
          "</th><th>allocations</th><th>call site</th></tr></thead><tbody>\n",
          out);
    for (size_t j = 0; j < m; ++j) {
      char b[48];
      compare_format_bytes(top[j].bytes, b, sizeof b);
      fprintf(out, "<tr><td>%s</td><td>%" PRIu64 "</td><td>", b, top[j].allocations);
      html_text(out, compare_site_name(t, top[j].site));
      fputs("</td></tr>\n", out);
    }
    fputs("</tbody></table>\n", out);
  }
  fputs("</section>\n", out);
}

int compare_write_html(const char *path, const gmr_trace_data_t *t, const compare_run_t *runs,
                       size_t n, const compare_opts_t *o) {
  /* Never over an input (tools/outfile.h): the traces and the configurations. */
  const char **inputs = calloc(2 * n + 1, sizeof *inputs);
  if (inputs == NULL) return -1;
  size_t n_in = 0;
  inputs[n_in++] = t->source;
  for (size_t k = 0; k < n; ++k) {
    inputs[n_in++] = runs[k].source;
    if (runs[k].trace != NULL) inputs[n_in++] = runs[k].trace->source;
  }
  long same = tool_out_input(path, inputs, n_in);
  free(inputs);
  if (same >= 0) {
    fprintf(stderr, "gmr-compare: --html %s: refusing to write over an input (%s)\n", path,
            same == 0 ? "the trace" : "one of the traces or configurations");
    return -1;
  }
  tool_out_t to;
  char why[4200];
  if (tool_out_open(&to, path, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-compare: --html: cannot write %s: %s\n", path, why);
    return -1;
  }
  FILE *out = to.f;
  uint64_t *peaks = calloc(n ? n : 1, sizeof *peaks);
  uint64_t *totals = calloc(n ? n : 1, sizeof *totals);
  if (peaks == NULL || totals == NULL) {
    free(peaks);
    free(totals);
    tool_out_abort(&to);
    return -1;
  }
  const compare_run_t *least = NULL;
  uint64_t vmax = 0;
  for (size_t k = 0; k < n; ++k) {
    if (runs[k].status != COMPARE_OK) continue;
    peaks[k] = runs[k].final.peak_reserved_bytes;
    totals[k] = map_total(&runs[k]);
    if (peaks[k] > vmax) vmax = peaks[k];
    if (runs[k].res.ooms == 0 && (least == NULL || peaks[k] < least->final.peak_reserved_bytes))
      least = &runs[k];
  }
  uint64_t tl_shared = html_shared_max(peaks, n, 2.5);
  uint64_t map_shared = html_shared_max(totals, n, 2.5);
  uint64_t row_shared = map_shared ? html_nice_row((map_shared + MAP_ROWS - 1) / MAP_ROWS) : 0;
  free(peaks);
  free(totals);

  fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, "
        "initial-scale=1\">\n<title>gmr-compare: ",
        out);
  html_text(out, t->source);
  fprintf(out,
          "</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n<h1>gmr-compare</h1>\n"
          "<p class=\"sub\">",
          html_css);
  html_text(out, t->source);
  char cap[48], req[48];
  compare_format_bytes(o->capacity, cap, sizeof cap);
  compare_format_bytes(t->peak_requested, req, sizeof req);
  fprintf(out,
          ": %zu events, %zu allocations (%zu never freed), peak requested %s. Every "
          "configuration replayed the trace on a fresh simulated device of %s.</p>\n",
          t->n_events, t->n_ids, t->n_live_at_end, req, cap);
  fputs("<section class=\"summary\">\n<h2>Peak reserved against peak requested</h2>\n"
        "<div class=\"legend\"><span><i style=\"background:#3b75c4\"></i>peak reserved</span>"
        "<span><i style=\"background:#2b8a4b\"></i>peak requested</span></div>\n",
        out);
  html_overview(out, runs, n, vmax);
  fputs("<h2>Device time of the driver calls</h2>\n"
        "<div class=\"legend\"><span><i style=\"background:#8a5a00\"></i>device time of the "
        "replay's driver calls, estimated from per-call costs measured on an H200 "
        "(docs/compare.md)</span></div>\n",
        out);
  html_overview_cost(out, runs, n);
  html_table(out, runs, n, o);
  fputs("</section>\n", out);
  for (size_t k = 0; k < n; ++k)
    html_config(out, t, &runs[k], least, tl_shared, row_shared);
  fprintf(out,
          "<p id=\"render-status\" data-configs=\"%zu\">Rendering needs JavaScript for "
          "this line only; the charts are plain SVG.</p>\n</main>\n<script>\n%s</script>\n"
          "</body>\n</html>\n",
          n, html_js);
  if (tool_out_commit(&to, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-compare: --html: %s: %s\n", path, why);
    return -1;
  }
  return 0;
}
