/* compare.c: gmr-compare's command line.
 *
 *   gmr-compare [OPTIONS] TRACE CONFIG...
 *   gmr-compare [OPTIONS] --suggest POLICY TRACE [CONFIG...]
 *
 * Each configuration replays the trace on a fresh simulated device of
 * --capacity bytes (141 GiB by default), whatever the file says about the
 * device (compare-replay.c), and the figures come out side by side
 * (compare-report.c), as JSON, or as an HTML page with a timeline and a
 * segment map per configuration (compare-html.c); --suggest searches a
 * policy's options (compare-suggest.c); --snapshot writes each replay as a
 * PyTorch memory snapshot (compare-snapshot.c).  This file parses the arguments,
 * finds the configurations (a file, or a name looked up in ./config and then
 * in the installed share directory) and calls the others; none calls back.
 *
 * Usage errors are found before any trace is read.  Exit status: 0 when every
 * configuration ran, 1 when some could not (they are named on stderr; an OOM
 * is a result, not a failure), 2 for usage errors.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compare.h"

#ifndef GMR_PKGDATADIR
#define GMR_PKGDATADIR "/usr/local/share/gmr"
#endif

static const char cmp_usage[] =
    "usage: gmr-compare [OPTIONS] TRACE CONFIG...\n"
    "       gmr-compare [OPTIONS] --suggest POLICY TRACE... [CONFIG...]\n"
    "       gmr-compare [OPTIONS] --diff BEFORE AFTER CONFIG...\n"
    "\n"
    "Replay TRACE under each CONFIG on a fresh simulated device, and print the\n"
    "figures side by side: memory, and the driver calls each replay made with\n"
    "the device time they cost on an H200 (a model of measured per-call\n"
    "costs).  TRACE is a CSV in RMM's layout (gmr's traces, or\n"
    "RMM's logging_resource_adaptor logs), a PyTorch memory snapshot pickle\n"
    "(torch.cuda.memory._dump_snapshot), or - for standard input.  CONFIG is\n"
    "a YAML file, or a name (pytorch, tf-growth...) looked up as NAME.yaml in\n"
    "./config, then in " GMR_PKGDATADIR ".\n"
    "\n"
    "  --json            one JSON array of objects, byte counts as integers\n"
    "  --check           run the policy's invariant walker after every event\n"
    "  --capacity SIZE   simulated device memory (default 143771MiB, an H200)\n"
    "  --html FILE       also write a self-contained page: timelines (each step\n"
    "                    up of reserved memory marked, with the rule that made\n"
    "                    it) and segment maps at the peak\n"
    "  --snapshot FILE   also write the replay as a PyTorch memory snapshot\n"
    "                    (the pickle of torch.cuda.memory._dump_snapshot, for\n"
    "                    memory_viz): the state at the end of the replay and\n"
    "                    its whole history, each allocation with the trace's\n"
    "                    call site as its frame; with several CONFIGs, one\n"
    "                    file each, NAME put before .pickle (run.pickle:\n"
    "                    run.pytorch.pickle, run.tf-growth.pickle...)\n"
    "  --suggest POLICY  search POLICY's options (caching, bfc, stitch) for the\n"
    "                    lowest peak reserved with no OOM on every TRACE on\n"
    "                    the --capacity device; print it as YAML and in the\n"
    "                    framework's own syntax, saying so when it costs\n"
    "                    much more device time than the defaults\n"
    "  --diff            compare two traces of one program (before and after a\n"
    "                    change) under each CONFIG: peaks, fragmentation, and\n"
    "                    the call sites that grew\n"
    "  --fit             also find, per CONFIG, the smallest device on which\n"
    "                    the trace runs with no OOM (fit capacity)\n"
    "  --no-timing       leave out the replay times, so that two runs give\n"
    "                    identical output (the default with --html;\n"
    "                    --timing puts them back)\n"
    "  --width N         characters per line of the table (default: the\n"
    "                    terminal's, else 160)\n"
    "  -h, --help        this text\n"
    "  -V, --version     the version\n"
    "\n"
    "Exit status: 0 when every configuration ran, 1 when some could not,\n"
    "2 for usage errors.\n";

/* The table's width: the terminal's, else 160. */
static size_t cmp_columns(void) {
  struct winsize ws;
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
    return ws.ws_col;
  return 160;
}

/* ---- reading the trace -------------------------------------------------------------
 * The reader streams the file; once it has run for a second a bar shows the
 * bytes parsed (or, from a pipe, the events so far). */

static double cmp_read_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct cmp_read_ctx_s {
  double start, last_draw;
  int progress, drawn;
} cmp_read_ctx_t;

static int cmp_read_progress(uint64_t done, uint64_t total, size_t events, void *ud) {
  cmp_read_ctx_t *c = ud;
  double now = cmp_read_now();
  if (!c->progress || now - c->start < 1.0 || now - c->last_draw < 0.1) return 0;
  c->last_draw = now;
  c->drawn = 1;
  if (total > 0) {
    int width = 40, fill = (int)((double)done * width / (double)total);
    char bar[64];
    for (int i = 0; i < width; ++i)
      bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r\033[K%-24.24s [%s] %5.1f%%  %zu events", "reading the trace", bar,
            100.0 * (double)done / (double)total, events);
  } else {
    fprintf(stderr, "\r\033[K%-24.24s %.1f MiB, %zu events", "reading the trace",
            (double)done / 1048576.0, events);
  }
  fflush(stderr);
  return 0;
}

/* ---- the command line ------------------------------------------------------------ */

static int cmp_usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gmr-compare: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%.*s(gmr-compare --help for more)\n",
          (int)(strstr(cmp_usage, "\n\n") - cmp_usage + 1), cmp_usage);
  return 2;
}

/* Whether `s` ends with `suffix` (and has something before it). */
static int cmp_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && memcmp(s + (n - k), suffix, k) == 0;
}

static int cmp_is_yaml_name(const char *s) {
  return cmp_ends_with(s, ".yaml") || cmp_ends_with(s, ".yml");
}

static void cmp_base_name(const char *path, char *out, size_t len) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  size_t n = strlen(b);
  if (cmp_ends_with(b, ".yaml"))
    n -= 5;
  else if (cmp_ends_with(b, ".yml"))
    n -= 4;
  if (n >= len) n = len - 1;
  memcpy(out, b, n);
  out[n] = '\0';
}

static int cmp_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

/* Where configuration `arg` is: the file itself when it names one (or looks
 * like a path), else NAME.yaml in ./config, then in the share directory.
 * 0 with the path in `out`, or -1 with a sentence in `why`. */
static int cmp_find_config(const char *arg, char *out, size_t len, char *why, size_t whylen) {
  int pathlike = strchr(arg, '/') != NULL || cmp_is_yaml_name(arg);
  if (pathlike || cmp_is_file(arg)) {
    snprintf(out, len, "%s", arg);
    return 0;
  }
  static const char *const dirs[] = {"config", GMR_PKGDATADIR, GMR_PKGDATADIR "/config"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; ++i) {
    snprintf(out, len, "%s/%s.yaml", dirs[i], arg);
    if (cmp_is_file(out)) return 0;
  }
  snprintf(why, whylen,
           "no configuration named '%s': not a file, and neither ./config/%s.yaml nor "
           "%s/%s.yaml exists",
           arg, arg, GMR_PKGDATADIR, arg);
  return -1;
}

/* Load and replay one configuration; failures are recorded in the run. */
static void cmp_run_config(compare_run_t *run, const char *arg, const gmr_trace_data_t *t,
                           const compare_opts_t *o) {
  char path[1000], why[1000];
  cmp_base_name(arg, run->name, sizeof run->name);
  if (cmp_find_config(arg, path, sizeof path, why, sizeof why) != 0) {
    snprintf(run->source, sizeof run->source, "%s", arg);
    run->status = COMPARE_ELOAD;
    snprintf(run->error, sizeof run->error, "%s", why);
    return;
  }
  snprintf(run->source, sizeof run->source, "%s", path);
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  memset(&cerr, 0, sizeof cerr);
  int err = gmr_config_load_file(path, &cfg, &cerr);
  if (err != 0) {
    run->status = COMPARE_ELOAD;
    snprintf(run->error, sizeof run->error, "%s",
             cerr.message[0] ? cerr.message : gmr_strerror(err));
    return;
  }
  if (compare_replay(run, cfg, t, o, o->html ? COMPARE_DETAIL : COMPARE_PEAK) == 0) {
    if (o->fit) compare_fit(run, cfg, t, o);
    if (run->snapshot[0] && run->status == COMPARE_OK &&
        compare_snapshot_write(run, cfg, t, o, run->snapshot) != 0)
      run->snapshot_failed = 1;
  }
  gmr_config_free(cfg);
}

/* --suggest POLICY is a usage error unless the policy exists and its table
 * names options to tune. */
static int cmp_check_suggest(const char *policy) {
  size_t n = 0;
  if (gmr_policy_options(policy, NULL, 0, &n) != 0) {
    char names[512] = "";
    size_t off = 0;
    for (size_t i = 0; gmr_policy_name(i) && off < sizeof names; ++i)
      off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "",
                              gmr_policy_name(i));
    fprintf(stderr, "gmr-compare: --suggest %s: unknown policy; the policies are: %s\n", policy,
            names);
    return 2;
  }
  gmr_option_info_t opts[64];
  if (n > 64) n = 64;
  gmr_policy_options(policy, opts, n, &n);
  for (size_t i = 0; i < n; ++i)
    if (opts[i].tune) return 0;
  fprintf(stderr,
          "gmr-compare: --suggest %s: no search space: the policy's option table marks no "
          "option to tune\n",
          policy);
  return 2;
}

/* With --suggest, the arguments after TRACE that are traces too: "-" or an
 * existing file that is not YAML. */
static int cmp_is_trace_arg(const char *arg) {
  if (cmp_is_yaml_name(arg)) return 0;
  return strcmp(arg, "-") == 0 || cmp_is_file(arg);
}

/* Read a trace and say on stderr what the reader noted; NULL on failure
 * (said on stderr). */
static gmr_trace_data_t *cmp_read_trace(const char *path) {
  char found[4096], msg[1024] = "";
  if (gmr_trace_find(path, found, sizeof found) == 0) path = found; /* a shipped trace's name */
  gmr_trace_data_t *t = NULL;
  cmp_read_ctx_t rctx = {.start = cmp_read_now(), .progress = isatty(STDERR_FILENO)};
  gmr_trace_read_options_t ropts = {
      .progress = cmp_read_progress, .ud = &rctx, .progress_every = (uint64_t)4 << 20};
  int err = gmr_trace_read_with(path, &ropts, &t, msg, sizeof msg);
  if (rctx.drawn) fprintf(stderr, "\r\033[K");
  if (err != 0) {
    fprintf(stderr, "gmr-compare: %s\n", msg[0] ? msg : gmr_strerror(err));
    return NULL;
  }
  if (t->note) fprintf(stderr, "gmr-compare: note: %s: %s\n", path, t->note);
  if (t->n_alloc_failures > 0) {
    char b[48];
    compare_format_bytes(t->alloc_failure_bytes, b, sizeof b);
    fprintf(stderr,
            "gmr-compare: note: %s: the recording saw %zu allocation%s fail (%s requested; the "
            "first at %s %u); counted, not replayed\n",
            path, t->n_alloc_failures, t->n_alloc_failures == 1 ? "" : "s", b,
            t->format == GMR_TRACE_FORMAT_SNAPSHOT ? "trace entry" : "line",
            (unsigned)t->first_alloc_failure_line);
  }
  if (t->n_live_at_end > 0)
    fprintf(stderr,
            "gmr-compare: note: %s: %zu allocation%s never freed (still live at the end of "
            "the trace)\n",
            path, t->n_live_at_end, t->n_live_at_end == 1 ? " is" : "s are");
  return t;
}

/* What the command line asks for: the options, the traces and the
 * configurations. */
typedef struct cmp_args_s {
  compare_opts_t o;
  const char **paths; /* n_traces of them */
  size_t n_traces;
  char **cfg_args; /* n_cfg of them */
  int n_cfg;
} cmp_args_t;

#define CMP_RUN (-1) /* cmp_parse_args: go on (else the exit status) */

/* --snapshot with several CONFIGs: each name once (Note [Snapshot file
 * names] in compare-snapshot.c); 0, or a usage error. */
static int cmp_snapshot_names(const cmp_args_t *a) {
  for (int i = 0; i < a->n_cfg; ++i)
    for (int j = 0; j < i; ++j) {
      char x[128], y[128];
      cmp_base_name(a->cfg_args[i], x, sizeof x);
      cmp_base_name(a->cfg_args[j], y, sizeof y);
      if (strcmp(x, y) == 0) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "--snapshot: two CONFIGs are named '%s' (%s, %s): their snapshots would be one "
                 "file; give them one at a time",
                 x, a->cfg_args[j], a->cfg_args[i]);
        return cmp_usage_error("%s", msg);
      }
    }
  return 0;
}

/* --snapshot: each configuration's file, into runs[k].snapshot, checked
 * before any replay (compare_snapshot_check); 0, or the exit status. */
static int cmp_snapshot_prepare(const cmp_args_t *a, const gmr_trace_data_t *t,
                                compare_run_t *runs) {
  const char **inputs = calloc((size_t)a->n_cfg + 1, sizeof *inputs);
  char(*paths)[1000] = calloc((size_t)a->n_cfg + 1, sizeof *paths);
  int st = 0;
  if (inputs == NULL || paths == NULL) {
    fprintf(stderr, "gmr-compare: out of memory\n");
    st = 1;
    goto done;
  }
  inputs[0] = t->source;
  for (int k = 0; k < a->n_cfg; ++k) {
    char why[1000];
    if (cmp_find_config(a->cfg_args[k], paths[k], sizeof paths[k], why, sizeof why) == 0)
      inputs[k + 1] = paths[k];
  }
  for (int k = 0; k < a->n_cfg && st == 0; ++k) {
    char name[128];
    cmp_base_name(a->cfg_args[k], name, sizeof name);
    compare_snapshot_path(a->o.snapshot, name, a->n_cfg > 1, runs[k].snapshot,
                          sizeof runs[k].snapshot);
    st = compare_snapshot_check(runs[k].snapshot, inputs, (size_t)a->n_cfg + 1, a->o.html);
  }
done:
  free(inputs);
  free(paths);
  return st;
}

/* The options, into a->o; CMP_RUN, or the exit status (help, version, a
 * usage error).  *timing: -1 (the default), 0 or 1. */
static int cmp_parse_options(int argc, char **argv, cmp_args_t *a, int *timing) {
  compare_opts_t *o = &a->o;
  enum {
    OPT_JSON = 256,
    OPT_CHECK,
    OPT_CAPACITY,
    OPT_HTML,
    OPT_SUGGEST,
    OPT_WIDTH,
    OPT_FIT,
    OPT_NO_TIMING,
    OPT_TIMING,
    OPT_DIFF,
    OPT_SNAPSHOT
  };
  static const struct option longs[] = {
      {"json", no_argument, NULL, OPT_JSON},
      {"check", no_argument, NULL, OPT_CHECK},
      {"capacity", required_argument, NULL, OPT_CAPACITY},
      {"html", required_argument, NULL, OPT_HTML},
      {"suggest", required_argument, NULL, OPT_SUGGEST},
      {"width", required_argument, NULL, OPT_WIDTH},
      {"fit", no_argument, NULL, OPT_FIT},
      {"no-timing", no_argument, NULL, OPT_NO_TIMING},
      {"timing", no_argument, NULL, OPT_TIMING},
      {"diff", no_argument, NULL, OPT_DIFF},
      {"snapshot", required_argument, NULL, OPT_SNAPSHOT},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  opterr = 0; /* our own messages */
  int c;
  while ((c = getopt_long(argc, argv, ":hV", longs, NULL)) != -1) {
    const char *arg = argv[optind - 1];
    switch (c) {
    case 'h':
      fputs(cmp_usage, stdout);
      return fflush(stdout) == 0 ? 0 : 1;
    case 'V':
      printf("gmr-compare (gmr) %d.%d.%d\n", GMR_VERSION_MAJOR, GMR_VERSION_MINOR,
             GMR_VERSION_PATCH);
      return fflush(stdout) == 0 ? 0 : 1;
    case OPT_JSON:
      o->json = 1;
      break;
    case OPT_CHECK:
      o->check = 1;
      break;
    case OPT_CAPACITY:
      if (gmr_parse_size(optarg, &o->capacity) != 0 || o->capacity < ((uint64_t)2 << 20))
        return cmp_usage_error("--capacity: '%s' is not a size of at least 2MiB (e.g. 80GiB, "
                               "143771MiB)",
                               optarg);
      break;
    case OPT_HTML:
      o->html = optarg;
      break;
    case OPT_FIT:
      o->fit = 1;
      break;
    case OPT_NO_TIMING:
      *timing = 0;
      break;
    case OPT_TIMING:
      *timing = 1;
      break;
    case OPT_DIFF:
      o->diff = 1;
      break;
    case OPT_SNAPSHOT:
      if (optarg[0] == '\0') return cmp_usage_error("%s", "--snapshot needs a file name");
      o->snapshot = optarg;
      break;
    case OPT_SUGGEST:
      o->suggest = optarg;
      break;
    case OPT_WIDTH: {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (errno != 0 || end == optarg || *end != '\0' || v < 40 || v > 10000)
        return cmp_usage_error("--width: '%s' is not a number of columns in [40, 10000]", optarg);
      o->columns = (size_t)v;
      break;
    }
    case ':':
      return cmp_usage_error("%s needs a value", arg);
    default:
      if (optopt != 0 && optopt < 256) {
        char opt[3] = {'-', (char)optopt, '\0'};
        return cmp_usage_error("unknown option '%s'", opt);
      }
      return cmp_usage_error("unknown option '%s'", arg);
    }
  }
  return CMP_RUN;
}

/* The whole command line: the options, then TRACE, then (with --suggest)
 * more traces, then the CONFIGs; CMP_RUN, or the exit status.  Every usage
 * error is found here, before any trace is read. */
static int cmp_parse_args(int argc, char **argv, cmp_args_t *a) {
  *a = (cmp_args_t){.o = {.capacity = GMR_SIM_DEFAULT_CAPACITY}};
  compare_opts_t *o = &a->o;
  int timing = -1; /* -1: the default (on, off in --html) */
  int st = cmp_parse_options(argc, argv, a, &timing);
  if (st != CMP_RUN) return st;
  int i = optind;
  if (i >= argc) return cmp_usage_error("%s", "no TRACE given");
  a->paths = (const char **)&argv[i];
  a->n_traces = o->diff ? 2 : 1;
  if (o->diff && (o->suggest || o->html))
    return cmp_usage_error("%s", "--diff takes no --suggest and no --html");
  if (o->snapshot && (o->diff || o->suggest))
    return cmp_usage_error("%s", "--snapshot takes no --diff and no --suggest");
  if (o->diff && argc - i < 3)
    return cmp_usage_error("%s", "--diff needs two traces and a CONFIG: --diff A B CONFIG...");
  while (o->suggest && i + (int)a->n_traces < argc && cmp_is_trace_arg(argv[i + (int)a->n_traces]))
    ++a->n_traces;
  a->n_cfg = argc - i - (int)a->n_traces;
  a->cfg_args = &argv[i + (int)a->n_traces];
  if (a->n_cfg == 0 && o->suggest == NULL)
    return cmp_usage_error("%s", "no CONFIG given (a YAML file or a name, or --suggest POLICY)");
  if (o->suggest && a->n_traces > 1 && (a->n_cfg > 0 || o->html))
    return cmp_usage_error("%s", "--suggest over several traces takes no CONFIG and no --html");
  if (o->suggest && cmp_check_suggest(o->suggest) != 0) return 2;
  if (compare_check_configs(a->cfg_args, a->n_cfg) != 0) return 2; /* a typo, before any replay */
  if (o->snapshot && cmp_snapshot_names(a) != 0) return 2;
  o->timing = timing >= 0 ? timing : o->html == NULL;
  o->progress = isatty(STDERR_FILENO);
  if (o->columns == 0) o->columns = cmp_columns();
  return CMP_RUN;
}

/* --diff: each CONFIG on both traces (runs: 2 x n_cfg), then the diff. */
static int cmp_mode_diff(const cmp_args_t *a, gmr_trace_data_t **traces, compare_run_t *runs) {
  for (int k = 0; k < 2 * a->n_cfg; ++k) {
    runs[k].trace = traces[k % 2];
    cmp_run_config(&runs[k], a->cfg_args[k / 2], traces[k % 2], &a->o);
  }
  if (a->o.json)
    compare_print_diff_json(stdout, runs, (size_t)a->n_cfg);
  else
    compare_print_diff(stdout, runs, (size_t)a->n_cfg, &a->o);
  return 0;
}

/* --suggest: the search over every trace, into sr (2 x n_traces runs);
 * true when it found a suggestion (else sr is released). */
static bool cmp_mode_suggest(const cmp_args_t *a, gmr_trace_data_t **traces, compare_run_t *sr) {
  for (size_t k = 0; k < 2 * a->n_traces; ++k)
    sr[k].trace = traces[k / 2];
  if (compare_suggest(a->o.suggest, (const gmr_trace_data_t *const *)traces, a->n_traces, &a->o,
                      sr) == 0)
    return true;
  for (size_t k = 0; k < 2 * a->n_traces; ++k)
    compare_run_release(&sr[k]);
  return false;
}

/* The plain comparison: each CONFIG on the trace, then (with --suggest) the
 * search, then the table or JSON and the HTML page; the exit status so far.
 * *n_runs drops to n_cfg when the search found nothing. */
static int cmp_mode_compare(const cmp_args_t *a, gmr_trace_data_t **traces, compare_run_t *runs,
                            size_t *n_runs) {
  const compare_opts_t *o = &a->o;
  const gmr_trace_data_t *t = traces[0];
  const int n_cfg = a->n_cfg;
  int rc = 0;
  if (o->snapshot && (rc = cmp_snapshot_prepare(a, t, runs)) != 0) return rc;
  for (int k = 0; k < n_cfg; ++k) {
    runs[k].trace = t;
    cmp_run_config(&runs[k], a->cfg_args[k], t, o);
    if (runs[k].snapshot_failed) rc = 1;
  }
  bool suggested = o->suggest && cmp_mode_suggest(a, traces, &runs[n_cfg]);
  if (o->suggest && !suggested) *n_runs = (size_t)n_cfg;
  if (o->json)
    compare_print_json(stdout, t, runs, *n_runs, o);
  else if (n_cfg > 0)
    compare_print_table(stdout, t, runs, (size_t)n_cfg, o);
  if (suggested && !o->json) {
    if (n_cfg > 0) fputc('\n', stdout);
    compare_print_suggestion(stdout, o->suggest, (const gmr_trace_data_t *const *)traces,
                             a->n_traces, &runs[n_cfg], o);
  }
  if (o->html && compare_write_html(o->html, t, runs, *n_runs, o) != 0) rc = 1;
  if (o->suggest && !suggested) rc = 1;
  return rc;
}

/* The configurations that could not run, named on stderr, and the output
 * flushed: 1 when either went wrong, else 0. */
static int cmp_report_failures(const compare_run_t *runs, size_t n_runs) {
  int rc = 0;
  size_t failed = 0;
  for (size_t k = 0; k < n_runs; ++k)
    if (runs[k].status != COMPARE_OK) {
      fprintf(stderr, "gmr-compare: %s could not run: %s\n", runs[k].source, runs[k].error);
      ++failed;
    }
  if (failed) {
    fprintf(stderr, "gmr-compare: %zu of %zu configuration%s could not run:", failed, n_runs,
            n_runs == 1 ? "" : "s");
    for (size_t k = 0; k < n_runs; ++k)
      if (runs[k].status != COMPARE_OK) fprintf(stderr, " %s", runs[k].name);
    fputc('\n', stderr);
    rc = 1;
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "gmr-compare: cannot write the output: %s\n", strerror(errno));
    rc = 1;
  }
  return rc;
}

int main(int argc, char **argv) {
  cmp_args_t a;
  int st = cmp_parse_args(argc, argv, &a);
  if (st != CMP_RUN) return st;
  const size_t n_traces = a.n_traces;
  gmr_trace_data_t **traces = calloc(n_traces, sizeof *traces);
  size_t n_runs = (size_t)a.n_cfg * (a.o.diff ? 2 : 1) + (a.o.suggest ? 2 * n_traces : 0);
  compare_run_t *runs = calloc(n_runs ? n_runs : 1, sizeof *runs);
  int rc = 0;
  if (traces == NULL || runs == NULL) {
    fprintf(stderr, "gmr-compare: out of memory\n");
    rc = 1;
    goto done;
  }
  for (size_t k = 0; k < n_traces; ++k)
    if ((traces[k] = cmp_read_trace(a.paths[k])) == NULL) {
      rc = 1;
      goto done;
    }
  rc = a.o.diff ? cmp_mode_diff(&a, traces, runs) : cmp_mode_compare(&a, traces, runs, &n_runs);
  if (cmp_report_failures(runs, n_runs) != 0) rc = 1;
done:
  for (size_t k = 0; runs && k < n_runs; ++k)
    compare_run_release(&runs[k]);
  free(runs);
  for (size_t k = 0; traces && k < n_traces; ++k)
    gmr_trace_data_free(traces[k]);
  free(traces);
  return rc;
}
