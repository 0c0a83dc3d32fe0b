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

/* Why reserved memory stepped up at a request (compare_step_t.rule; Note
 * [Why reserved grew] in compare-replay.c). */
typedef enum compare_rule_e {
  COMPARE_RULE_SEGMENT = 0, /* a new segment of the request's size */
  COMPARE_RULE_ROUNDING,    /* a new segment, the request rounded up to 2 MiB */
  COMPARE_RULE_SMALL_POOL,  /* caching: a 2 MiB segment for requests up to 1 MiB */
  COMPARE_RULE_MID_SEGMENT, /* caching: a 20 MiB segment for requests of 1 to 10 MiB */
  COMPARE_RULE_SPLIT_LIMIT, /* caching: a cached block was large enough, but over max_split_size */
  COMPARE_RULE_DOUBLING,    /* bfc: a new region of the doubled region size (allow_growth) */
  COMPARE_RULE_WHOLE_LIMIT, /* bfc: the whole limit at once (no allow_growth) */
  COMPARE_RULE_EXPANDABLE,  /* pages mapped into an expandable segment */
  COMPARE_RULE_PAGES,       /* device memory with no segment reserved (stitch's pages) */
  COMPARE_RULE_LARGER,      /* a new segment larger than the rules above explain */
  COMPARE_RULE_KINDS
} compare_rule_t;

/* One step up of reserved memory: the request that caused it. */
typedef struct compare_step_s {
  uint64_t event;   /* index of the event (an allocation) */
  uint64_t request; /* bytes it requested */
  uint64_t before;  /* reserved bytes before it */
  uint64_t after;   /* reserved bytes after it */
  uint64_t segment; /* bytes of the first segment or range it reserved, 0 when none */
  uint32_t line;    /* its line in the trace */
  uint8_t rule;     /* compare_rule_t */
} compare_step_t;
#define COMPARE_STEPS_MAX 2000 /* steps kept per configuration; the count goes on */
/* A rule's words ("a new segment: the request rounded up to 2 MiB"). */
const char *compare_rule_text(int rule);

/* One entry of the segment map at the peak (a copy of gmr_walk_entry_t that
 * does not point into the runtime, which is gone by the time we draw). */
typedef struct compare_map_entry_s {
  uint64_t address;   /* device address */
  uint64_t size;      /* bytes */
  uint64_t requested; /* blocks: bytes requested, 0 when free */
  uint8_t is_segment; /* 1: a segment; 0: a block of the last segment */
  uint8_t state;      /* gmr_block_state_t, blocks only */
  uint8_t is_expandable;
  char pool[13];                     /* segments: "small", "large", "region"... */
  uint64_t shared_head, shared_tail; /* blocks: bytes on a page another block holds */
  uint64_t head_page, tail_page;     /* those pages' numbers (gmr_walk_entry_t) */
} compare_map_entry_t;

/* At the peak, the own figures of a policy that maps pages into ranges
 * (stitch's stitch.* statistics, gmr_stat_get), read when the map is
 * walked: the map draws its physical pages from them (compare-html.c,
 * Note [The map of a policy that maps pages]). */
typedef struct compare_pages_s {
  int on;                 /* 1: the policy maps pages; the figures below are set */
  uint64_t page_size;     /* bytes */
  uint64_t pages;         /* pages held (created, not released) */
  uint64_t free_pages;    /* pages no block holds */
  uint64_t shared_pages;  /* pages two blocks hold, one at each end */
  uint64_t dead_gap;      /* bytes between the two blocks of shared pages */
  uint64_t free_bytes;    /* free pages, open page ends, the small pool's free blocks */
  uint64_t pending_bytes; /* freed, waiting for stream work */
  uint64_t va_bytes;      /* address space mapped (every range, cached ones too) */
  uint64_t cached_ranges; /* ranges kept with no block, for reuse */
  uint64_t mappings;      /* page mappings live */
} compare_pages_t;

/* Everything gmr-compare learns about one configuration. */
typedef struct compare_run_s {
  char name[128];                /* the file's base name without .yaml */
  char source[1024];             /* the path as given, or a description */
  char *yaml;                    /* generated configurations: the YAML text (owned), else NULL */
  const gmr_trace_data_t *trace; /* the trace it replays (the JSON names it) */
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
  int map_status;        /* 0, or why the map is missing (GMR_ENOTSUP...) */
  gmr_stats_t map_stats; /* gmr_stats when the map was walked (the peak event) */
  compare_pages_t pages; /* a policy that maps pages: its figures there */
  compare_step_t *steps; /* the steps up of reserved memory, in event order (at most
                            COMPARE_STEPS_MAX) */
  size_t n_steps;
  uint64_t all_steps; /* the steps, all of them */
  /* The driver calls of the timed replay, runtime creation included
   * (the simulator's counters just before the runtime is freed): */
  gmr_sim_counters_t calls;
  gmr_sim_call_bytes_t call_bytes;
  /* Filled only for --fit: */
  uint64_t fit_capacity; /* bytes: the smallest device with no OOM; 0 when none up to fit_max */
  uint64_t fit_max;      /* bytes: the largest device tried */
  unsigned fit_replays;  /* replays the search took */
  /* --snapshot: this configuration's file ("" when none), and 1 when it
   * could not be written (said on stderr). */
  char snapshot[4096];
  int snapshot_failed;
} compare_run_t;

typedef struct compare_opts_s {
  int json;             /* --json */
  int check;            /* --check */
  int progress;         /* stderr is a terminal: draw progress bars */
  size_t columns;       /* characters per line of the table (the terminal's width) */
  uint64_t capacity;    /* --capacity, bytes */
  const char *html;     /* --html FILE, or NULL */
  const char *suggest;  /* --suggest POLICY, or NULL */
  int timing;           /* replay time and speed shown (not with --no-timing; off in --html) */
  int fit;              /* --fit */
  int diff;             /* --diff */
  const char *snapshot; /* --snapshot FILE, or NULL */
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

/* compare-replay.c: --snapshot's replay, on a fresh runtime with the
 * memory history recorded and the simulated clock following the trace's
 * times; at the end, its snapshot (gmr_snapshot_write) to `out`.  0, or -1
 * with the reason in `why`. */
int compare_replay_snapshot(const gmr_config_t *cfg, const gmr_trace_data_t *t,
                            const compare_opts_t *o, FILE *out, char *why, size_t len);

/* compare-snapshot.c: --snapshot's files (Note [Snapshot file names]).
 * The file of configuration `name`, into out. */
void compare_snapshot_path(const char *file, const char *name, int several, char *out, size_t len);
/* Before any replay: 0 when `path` may be written (not one of inputs[0..n),
 * not a FIFO or other odd file, not the --html page, its folder writable);
 * else says why on stderr and returns the exit status (2 or 1). */
int compare_snapshot_check(const char *path, const char *const *inputs, size_t n_inputs,
                           const char *html);
/* Replay and write run's snapshot to `path`, saying on stderr what was
 * written; 0, or -1 (said on stderr). */
int compare_snapshot_write(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                           const compare_opts_t *o, const char *path);

/* compare-report.c */
void compare_print_table(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n,
                         const compare_opts_t *o);
void compare_print_json(FILE *out, const gmr_trace_data_t *t, const compare_run_t *runs, size_t n,
                        const compare_opts_t *o);
/* The table's rows: label of row `row` (NULL past the last row), whether
 * the options show it, and the text of one cell. */
const char *compare_table_label(int row);
int compare_table_shows(int row, const compare_opts_t *o);
void compare_table_cell(const compare_run_t *r, int row, char *buf, size_t len);
/* Human units: "14.24 GiB", "512 B". */
void compare_format_bytes(uint64_t bytes, char *buf, size_t len);

/* compare-cost.c: the device-call cost model (Note [Device cost model]).
 * The call kinds, in the order the table and the JSON list them. */
enum {
  COMPARE_CALL_RESERVE,
  COMPARE_CALL_RELEASE,
  COMPARE_CALL_VA_RESERVE,
  COMPARE_CALL_VA_RELEASE,
  COMPARE_CALL_MAP,
  COMPARE_CALL_UNMAP,
  COMPARE_CALL_PAGE_CREATE,
  COMPARE_CALL_PAGE_RELEASE,
  COMPARE_CALL_PAGE_MAP,
  COMPARE_CALL_PAGE_UNMAP,
  COMPARE_CALL_SET_ACCESS,
  COMPARE_CALL_EVENT_RECORD,
  COMPARE_CALL_EVENT_QUERY,
  COMPARE_CALL_SYNC,
  COMPARE_CALL_KINDS
};
typedef struct compare_cost_entry_s {
  const char *key;    /* the JSON key, e.g. "page_map" */
  const char *driver; /* what the CUDA backend calls for it */
  int measured;       /* 0: no figure, left out of the estimate */
  double us_per_call; /* microseconds per call */
  double us_per_page; /* microseconds per 2 MiB page the call names */
  const char *source; /* where the figures come from */
} compare_cost_entry_t;
typedef struct compare_cost_s {
  uint64_t calls[COMPARE_CALL_KINDS];
  uint64_t bytes[COMPARE_CALL_KINDS];
  double us[COMPARE_CALL_KINDS]; /* 0 for a kind not measured */
  uint64_t total_calls;
  uint64_t unmeasured_calls; /* calls of kinds with no figure */
  double us_total;           /* the estimate, microseconds */
} compare_cost_t;
/* The model's entry for call kind `kind` (NULL out of range). */
const compare_cost_entry_t *compare_cost_model(int kind);
void compare_cost_estimate(const compare_run_t *r, compare_cost_t *out);
/* "850 us", "12.34 ms", "3.21 s". */
void compare_format_us(double us, char *buf, size_t len);
/* Note [Suggest weighs device time] (compare-suggest.c): 1 when going from
 * the first configuration to the second trades memory for device time
 * beyond the rule
 *   T1 - T0 >= COMPARE_SLOWER_FLOOR_US  and  T1 > (1 + K s) T0,
 *   s = (R0 - R1) / R0 (the memory saved, 0 when none), K = COMPARE_SLOWER_PER_SAVING. */
#define COMPARE_SLOWER_FLOOR_US   1000.0
#define COMPARE_SLOWER_PER_SAVING 10.0
int compare_cost_says_slower(uint64_t reserved_before, uint64_t reserved_after, double us_before,
                             double us_after);

/* compare-fit.c: the smallest device capacity on which `cfg` replays `t`
 * with no OOM (a binary search on the simulator, to 2 MiB), into
 * run->fit_capacity (0 when even fit_max OOMs).  0, or -1 when a replay
 * could not run (run->status and run->error set). */
int compare_fit(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                const compare_opts_t *o);

/* compare-sites.c: the call sites holding the most requested bytes among
 * the allocations live after event `at`, largest first: up to `max` into
 * `out`, returning how many (0 when the trace names no sites). */
typedef struct compare_site_s {
  uint32_t site;        /* index into the trace's sites (1-based), 0: none */
  uint64_t bytes;       /* requested bytes live there */
  uint64_t allocations; /* live allocations there */
} compare_site_t;
#define COMPARE_TOP_SITES 5
size_t compare_sites_at(const gmr_trace_data_t *t, size_t at, compare_site_t *out, size_t max);
/* A site's text ("(no call site)" for 0). */
const char *compare_site_name(const gmr_trace_data_t *t, uint32_t site);

/* compare-diff.c: --diff, runs[2 k] on the trace before and runs[2 k + 1]
 * on the trace after, for configuration k: a table, or JSON. */
void compare_print_diff(FILE *out, const compare_run_t *runs, size_t n_cfg,
                        const compare_opts_t *o);
void compare_print_diff_json(FILE *out, const compare_run_t *runs, size_t n_cfg);

/* compare-html.c: 0, or -1 with a message on stderr. */
int compare_write_html(const char *path, const gmr_trace_data_t *t, const compare_run_t *runs,
                       size_t n, const compare_opts_t *o);

/* compare-suggest.c: search `policy`'s options (from its option table) for
 * the lowest peak reserved with no OOM on every trace.  Fills runs[2 k] (the
 * defaults) and runs[2 k + 1] (the winner, whose yaml is its configuration)
 * for trace k, and returns 0; or -1 with a message on stderr when no
 * candidate replays every trace without an OOM on the --capacity device. */
int compare_suggest(const char *policy, const gmr_trace_data_t *const *traces, size_t n_traces,
                    const compare_opts_t *o, compare_run_t *runs);
/* Print the winner as YAML: the figures in comments next to the defaults',
 * per trace, then the framework's own settings (compare-deploy.c). */
void compare_print_suggestion(FILE *out, const char *policy, const gmr_trace_data_t *const *traces,
                              size_t n_traces, const compare_run_t *runs, const compare_opts_t *o);
/* compare-deploy.c: the winner's YAML in the framework's syntax, as comments. */
void compare_print_deploy(FILE *out, const char *policy, const char *yaml, uint64_t capacity);

/* compare-config.c: 0 when every CONFIG argument names a file (itself, or
 * NAME.yaml where compare.c looks); else says which one on stderr, with the
 * nearest shipped name ("did you mean pytorch?"), and returns 2. */
int compare_check_configs(char *const *args, int n);

#endif /* GMR_COMPARE_H */
