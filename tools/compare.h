/* compare.h: the pieces of gmr-compare shared by its files.
 *
 * gmr-compare replays one trace under several configurations, each on a
 * fresh simulated device, and reports them side by side.  compare.c holds
 * the command line and the replays, compare-report.c the terminal table and
 * the JSON, compare-html.c the self-contained HTML page, compare-suggest.c
 * the search for a policy's best options.  Everything here is single
 * threaded: one replay at a time, owned by main().
 */
#ifndef GMR_COMPARE_H
#define GMR_COMPARE_H

#include <stdint.h>
#include <stdio.h>

#include "gmr.h"
#include "gmr_replay.h"

/* 141 GiB, the H200's 143771 MiB as CUDA reports it. */
#define COMPARE_DEFAULT_CAPACITY ((uint64_t)143771 << 20)
/* The HTML timeline keeps at most this many points per configuration. */
#define COMPARE_TIMELINE_POINTS 2000

/* Why a configuration did not run to the end (compare_run_t.status). */
typedef enum compare_status_e {
  COMPARE_OK = 0,       /* replayed every event (OOMs are results, not failures) */
  COMPARE_ELOAD = 1,    /* the configuration did not load */
  COMPARE_ERUNTIME = 2, /* the runtime could not be created, or the replay failed */
  COMPARE_ECHECK = 3    /* --check: an invariant walk failed */
} compare_status_t;

/* One sample of the timeline: the maxima over a bucket of consecutive events. */
typedef struct compare_point_s {
  uint64_t event;     /* index of the bucket's last event */
  uint64_t reserved;  /* bytes, max over the bucket */
  uint64_t allocated; /* bytes, max over the bucket */
  uint64_t requested; /* bytes, max over the bucket */
} compare_point_t;

/* One entry of the segment map at the peak (a copy of gmr_walk_entry_t that
 * does not point into the runtime, which is gone by the time we draw). */
typedef struct compare_map_entry_s {
  uint64_t address;   /* device address */
  uint64_t size;      /* bytes */
  uint64_t requested; /* blocks: bytes requested, 0 when free */
  uint8_t is_segment; /* 1: a segment; 0: a block of the last segment */
  uint8_t state;      /* gmr_block_state_t, blocks only */
  uint8_t is_expandable;
  char pool[13]; /* segments: "small", "large", "region"... */
} compare_map_entry_t;

/* Everything gmr-compare learns about one configuration. */
typedef struct compare_run_s {
  char name[128];   /* the file's base name without .yaml */
  char source[512]; /* the path as given, or a description */
  char *yaml;       /* generated configurations: the YAML text (owned), else NULL */
  compare_status_t status;
  char error[1400];        /* why it did not run (status != COMPARE_OK) */
  char policy[128];        /* the policy stack, e.g. "limit(caching)" */
  gmr_replay_result_t res; /* the timed replay's; with COMPARE_PEAK, peak_event and at_peak
                              are the peak event's as compare_replay chooses it (the most
                              allocated among the events at peak reserved) */
  gmr_stats_t final;       /* gmr_stats after the last event */
  /* At the peak event (res.peak_event): */
  uint64_t free_at_peak;     /* bytes reserved but not active */
  uint64_t largest_at_peak;  /* bytes, the largest free block */
  uint64_t rounding_at_peak; /* bytes, allocated - requested */
  double fragmentation;      /* 1 - largest / free, 0 when nothing is free */
  /* Filled only for --html (a second replay): */
  compare_point_t *points; /* n_points samples in event order */
  size_t n_points;
  compare_map_entry_t *map; /* segments in address order, each followed by its blocks */
  size_t n_map;
  int map_status; /* 0, or why the map is missing (GMR_ENOTSUP...) */
} compare_run_t;

typedef struct compare_opts_s {
  int json;            /* --json */
  int check;           /* --check */
  int progress;        /* stderr is a terminal: draw progress bars */
  size_t columns;      /* characters per line of the table (the terminal's width) */
  uint64_t capacity;   /* --capacity, bytes */
  const char *html;    /* --html FILE, or NULL */
  const char *suggest; /* --suggest POLICY, or NULL */
} compare_opts_t;

/* How much compare_replay learns (each level adds a replay). */
enum {
  COMPARE_TIMED = 0, /* the figures of one timed replay */
  COMPARE_PEAK = 1,  /* and the state at the peak (free, largest block, fragmentation) */
  COMPARE_DETAIL = 2 /* and the timeline and the segment map, for --html */
};
/* compare.c: replay `cfg` (already loaded) into `run`, `detail` deep.
 * Sets run->status and run->error; returns 0 when the run completed. */
int compare_replay(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                   const compare_opts_t *o, int detail);
/* Release what a run owns (not the run itself). */
void compare_run_release(compare_run_t *run);

/* compare-report.c */
void compare_print_table(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n,
                         const compare_opts_t *o);
void compare_print_json(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n);
/* The table's rows: label of row `row` (NULL past the last row), and the
 * text of one cell. */
const char *compare_table_label(int row);
void compare_table_cell(const compare_run_t *r, int row, char *buf, size_t len);
/* Human units: "14.24 GiB", "512 B". */
void compare_format_bytes(uint64_t bytes, char *buf, size_t len);

/* compare-html.c: 0, or -1 with a message on stderr. */
int compare_write_html(const char *path, const gmr_trace_data_t *t, const compare_run_t *runs,
                       size_t n, const compare_opts_t *o);

/* compare-suggest.c: search `policy`'s options for the lowest peak reserved
 * with no OOM.  Fills `defaults` and `best` (whose yaml is the winner's
 * configuration) and returns 0, or -1 with a message on stderr. */
int compare_suggest(const char *policy, const gmr_trace_data_t *t, const compare_opts_t *o,
                    compare_run_t *defaults, compare_run_t *best);
/* Print the winner as YAML, the figures in comments next to the default's. */
void compare_print_suggestion(FILE *out, const char *policy, const gmr_trace_data_t *t,
                              const compare_run_t *defaults, const compare_run_t *best);

#endif /* GMR_COMPARE_H */
