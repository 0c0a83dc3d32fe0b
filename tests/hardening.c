/* hardening.c: regression tests for the defects a hostile caller, trace or
 * device found (issue 15), one section per class: each check failed before
 * its fix.  Bounds and messages are the documented ones (docs/design.md,
 * docs/trace-format.md, gmr.h). */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "fuzz/fuzz.h"
#include "gmr.h"
#include "gmr_replay.h"
#include "sim-runtime.h"
#include "tap.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse(const char *text, size_t len, gmr_trace_data_t **t, char *err, size_t errlen) {
  *t = NULL;
  return gmr_trace_parse(text, len, "t.csv", t, err, errlen);
}

/* Class 4 and 12: a trace is read whole or rejected with a line number; a
 * byte order mark is skipped; empty_cache ignores Pointer, Size and Stream. */
static void trace_reader(void) {
  gmr_trace_data_t *t;
  char err[512];
  static const char nul[] = "0,1,allocate,0x10,100,0\n0,2,free,0x10,100,0\n0,3,allo\0cate,0x20,"
                            "100,0\n0,4,allocate,0x30,100,0\n";
  is_int(parse(nul, sizeof nul - 1, &t, err, sizeof err), GMR_EINVAL,
         "a NUL byte inside a trace rejects it");
  like(err, "t.csv:3: a NUL byte", "  with its line");
  ok(t == NULL, "  and no partial trace");

  static const char bom[] = "\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream\n"
                            "0,1,allocate,0x10,100,0\n";
  is_int(parse(bom, sizeof bom - 1, &t, err, sizeof err), 0, "a UTF-8 byte order mark is skipped");
  if (t) is_int(t->n_events, 1, "  one event after the header");
  gmr_trace_data_free(t);
  static const char bom2[] = "\xEF\xBB\xBF"
                             "0,1,allocate,0x10,100,0\n";
  is_int(parse(bom2, sizeof bom2 - 1, &t, err, sizeof err), 0, "  also with no header");
  gmr_trace_data_free(t);

  static const char ec[] = "0,1,allocate,0x10,100,0\n0,2,empty_cache,zz,-1,bad\n";
  is_int(parse(ec, sizeof ec - 1, &t, err, sizeof err), 0,
         "empty_cache ignores Pointer, Size and Stream, as documented");
  if (t) ok(t->n_events == 2 && t->events[1].size == 0, "  and records size 0");
  gmr_trace_data_free(t);

  /* Class 5: Σ requested bytes in 128 bits, reported saturated. */
  static const char big[] = "0,1,allocate,0x10,9223372036854775808,0\n"
                            "0,2,allocate,0x20,9223372036854775808,0\n"
                            "0,3,allocate,0x30,9223372036854775808,0\n";
  is_int(parse(big, sizeof big - 1, &t, err, sizeof err), 0, "three 2^63-byte allocations parse");
  if (t) is_u64(t->peak_requested, UINT64_MAX, "  their peak saturates instead of wrapping");
  gmr_trace_data_free(t);
}

/* Class 3: pointers chosen to collide cost the reader O(log n) each. */
static void trace_collisions(void) {
  size_t n = 100000;
  const char *env = getenv("GMR_HARDEN_TRACE_N");
  if (env && *env) n = strtoull(env, NULL, 10);
  size_t cap = n * 2 * 48 + 64, len = 0;
  char *text = malloc(cap);
  if (text == NULL) return;
  for (size_t i = 0; i < n; ++i)
    len += (size_t)snprintf(text + len, cap - len, "0,%zu,allocate,%#llx,4096,0\n", i,
                            (unsigned long long)(i + 1) << 44);
  for (size_t i = 0; i < n; ++i)
    len += (size_t)snprintf(text + len, cap - len, "0,%zu,free,%#llx,4096,0\n", n + i,
                            (unsigned long long)(i + 1) << 44);
  gmr_trace_data_t *t;
  char err[256];
  double t0 = now_s();
  int rc = parse(text, len, &t, err, sizeof err);
  double took = now_s() - t0;
  is_int(rc, 0, "%zu allocations at addresses 2^44 apart parse", n);
  ok(took < 5.0, "  in %.3f s (< 5 s; 19 s with the old hash)", took);
  if (t) is_u64(t->peak_requested, (uint64_t)n * 4096, "  peak requested");
  gmr_trace_data_free(t);
  free(text);
}

static int log_errors;
static void count_errors(gmr_log_level_t level, const char *msg, void *ud) {
  (void)msg, (void)ud;
  if (level == GMR_LOG_ERROR) ++log_errors;
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Class 6, in a child whose file size limit makes the disk "full" after
 * 4 KiB (the parent's TAP output must not be limited).  Exit status bits:
 * 1 allocations failed, 2 no last error, 4 gmr_flush succeeded, 8
 * gmr_runtime_close succeeded, 16 not exactly one log line, 32 lines lost
 * before the failure were not flushed. */
static int trace_full_disk_child(const char *path) {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {4096, 4096};
  setrlimit(RLIMIT_FSIZE, &rl);
  gmr_set_log(count_errors, NULL);
  setenv("GMR_TRACE", path, 1);
  gmr_runtime_t *rt = sim_runtime("policy: direct\n", 0, 0);
  unsetenv("GMR_TRACE");
  if (rt == NULL) return 1;
  int bits = 0;
  void *p;
  for (int i = 0; i < 300; ++i) {
    if (gmr_alloc(rt, 4096, NULL, &p) != 0 || gmr_free(rt, p) != 0) bits |= 1;
  }
  if (strstr(gmr_last_error(rt), "File too large") == NULL) bits |= 2;
  if (gmr_flush(rt) != GMR_EIO) bits |= 4;
  if (file_size(path) < 4096 - 64) bits |= 32; /* flushed up to the limit */
  if (gmr_runtime_close(rt) != GMR_EIO) bits |= 8;
  if (log_errors != 1) bits |= 16;
  return bits;
}

/* GMR_TRACE=/dev/full: the header cannot be written.  Bits: 1 not GMR_EIO,
 * 2 no reason given. */
static int trace_dev_full_child(const char *unused) {
  (void)unused;
  setenv("GMR_TRACE", "/dev/full", 1);
  gmr_config_t *cfg;
  gmr_error_t cerr;
  gmr_config_load_string("policy: direct\n", &cfg, &cerr);
  gmr_runtime_t *rt = NULL;
  int bits = gmr_runtime_new_sim(cfg, NULL, &rt) == GMR_EIO ? 0 : 1;
  if (strstr(gmr_last_error(NULL), "No space left on device") == NULL) bits |= 2;
  gmr_runtime_free(rt);
  gmr_config_free(cfg);
  return bits;
}

/* Run fn in a child, so that the trace it opens is the process's first (a
 * later one would be named path.1) and its limits stay there. */
static int in_child(int (*fn)(const char *), const char *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(fn(arg));
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

static void trace_write_failures(void) {
  char path[256];
  snprintf(path, sizeof path, "/tmp/gmr-harden-%d.csv", (int)getpid());
  is_int(in_child(trace_dev_full_child, NULL), 0,
         "GMR_TRACE=/dev/full: runtime creation fails with GMR_EIO, saying why");
  is_int(in_child(trace_full_disk_child, path), 0,
         "a trace on a full disk: allocations go on, the last error, gmr_flush and "
         "gmr_runtime_close say GMR_EIO, one log line");
  remove(path);

  /* Periodic flush: the lines are in the file before the runtime is closed. */
  setenv("GMR_TRACE", path, 1);
  gmr_runtime_t *rt = sim_runtime("policy: direct\n", 0, 0);
  unsetenv("GMR_TRACE");
  void *p;
  for (int i = 0; i < 300 && rt; ++i)
    if (gmr_alloc(rt, 4096, NULL, &p) == 0) gmr_free(rt, p);
  ok(file_size(path) >= 256 * 20, "the trace is flushed every 256 lines (%lld bytes on disk)",
     (long long)file_size(path));
  is_int(gmr_flush(rt), 0, "gmr_flush on a healthy trace");
  is_int(gmr_runtime_close(rt), 0, "gmr_runtime_close on a healthy trace");
  remove(path);

  gmr_config_t *cfg;
  gmr_error_t cerr;
  gmr_config_load_string("policy: direct\n", &cfg, &cerr);
  log_errors = 0;
  gmr_set_log(count_errors, NULL);
  setenv("GMR_SNAPSHOT", "/dev/full", 1);
  setenv("GMR_HISTORY", "1000", 1);
  gmr_runtime_new_sim(cfg, NULL, &rt);
  unsetenv("GMR_SNAPSHOT");
  unsetenv("GMR_HISTORY");
  if (rt && gmr_alloc(rt, 4096, NULL, &p) == 0) gmr_free(rt, p);
  is_int(gmr_runtime_close(rt), GMR_EIO, "GMR_SNAPSHOT=/dev/full: gmr_runtime_close says GMR_EIO");
  like(gmr_last_error(NULL), "GMR_SNAPSHOT: cannot write /dev/full", "  naming the file");
  like(gmr_last_error(NULL), "No space left on device", "  and why");
  is_int(log_errors, 1, "  in one log line");
  gmr_set_log(NULL, NULL);
  gmr_config_free(cfg);
}

/* Class 5: refunds beyond the charges are refused, so no count wraps. */
static void charge_refunds(void) {
  static const char *const stacks[] = {"policy: direct\nlimit: {bytes: 1GiB}\n",
                                       "policy: direct\nlimit: {bytes: 1GiB, counts: reserved}\n"};
  for (int k = 0; k < 2; ++k) {
    gmr_runtime_t *rt = sim_runtime(stacks[k], 0, 0);
    if (rt == NULL) continue;
    const char *name = k ? "counts: reserved" : "counts: allocated";
    is_int(gmr_charge(rt, 100 << 20), 0, "%s: charge 100 MiB", name);
    is_int(gmr_charge(rt, -(200 << 20)), GMR_EINVAL, "  a refund of 200 MiB is refused");
    like(gmr_last_error(rt), "more than the 100.00 MiB", "  saying what is charged");
    is_int(gmr_charge(rt, INT64_MIN), GMR_EINVAL, "  so is a refund of 2^63 bytes");
    void *p = NULL, *q = NULL;
    is_int(gmr_alloc(rt, (1u << 30) - (100u << 20), NULL, &p), 0,
           "  the rest of the cap can be allocated");
    is_int(gmr_alloc(rt, 2 << 20, NULL, &q), GMR_ENOMEM, "  and nothing more: the cap holds");
    gmr_free(rt, p);
    is_int(gmr_charge(rt, -(100 << 20)), 0, "  the charge is refunded");
    is_int(gmr_charge(rt, -1), GMR_EINVAL, "  once");
    is_int(gmr_alloc(rt, 1u << 30, NULL, &p), 0, "  then the whole cap is free");
    is_int(gmr_alloc(rt, 2 << 20, NULL, &q), GMR_ENOMEM, "  and still holds");
    gmr_free(rt, p);
    gmr_runtime_free(rt);
  }
}

/* Class 7: the simulator's capacity is bounded (4 PiB) and every capacity it
 * accepts works: its address space grows with it. */
static void sim_capacity(void) {
  static const char *const stacks[] = {
      "policy: caching\n", "policy: {name: caching, expandable_segments: true}\n", "policy: bfc\n",
      "policy: {name: bfc, allow_growth: false}\n", "policy: direct\n"};
  static const uint64_t caps[] = {57ull << 40, 1ull << 50, 1ull << 52};
  for (int c = 0; c < 3; ++c) {
    int bad = 0;
    for (int k = 0; k < 5; ++k) {
      gmr_runtime_t *rt = sim_runtime(stacks[k], caps[c], 0);
      void *p = NULL, *q = NULL;
      if (rt == NULL || gmr_alloc(rt, 1 << 20, NULL, &p) != 0 ||
          gmr_alloc(rt, (size_t)1 << 40, NULL, &q) != 0 || gmr_check(rt) != 0) {
        diag("%s: %s", stacks[k], rt ? gmr_last_error(rt) : "no runtime");
        ++bad;
      }
      if (rt) gmr_free(rt, p), gmr_free(rt, q);
      gmr_runtime_free(rt);
    }
    is_int(bad, 0, "capacity %llu TiB: every stack allocates 1 MiB and 1 TiB",
           (unsigned long long)(caps[c] >> 40));
  }
  gmr_config_t *cfg;
  gmr_error_t cerr;
  gmr_config_load_string("policy: direct\n", &cfg, &cerr);
  gmr_sim_options_t o = {.capacity = (1ull << 52) + 1};
  gmr_runtime_t *rt = NULL;
  is_int(gmr_runtime_new_sim(cfg, &o, &rt), GMR_EINVAL, "a capacity above 4 PiB is refused");
  like(gmr_last_error(NULL), "more than the simulator's limit of 4 PiB", "  saying so");
  o.capacity = UINT64_MAX;
  is_int(gmr_runtime_new_sim(cfg, &o, &rt), GMR_EINVAL, "  also 16 EiB");
  gmr_config_free(cfg);
}

/* The simulator's live ranges: O(log n) per reserve and release, whatever
 * the order (a sorted array moved every range behind the one removed). */
static void sim_many_ranges(void) {
  size_t n = 200000;
  gmr_runtime_t *rt = sim_runtime("policy: direct\n", 1ull << 40, 0);
  void **p = calloc(n, sizeof *p);
  if (rt == NULL || p == NULL) return;
  double t0 = now_s();
  int bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += gmr_alloc(rt, 4096, NULL, &p[i]) != 0;
  for (size_t i = 0; i < n; ++i) /* oldest first: the worst order for a sorted array */
    bad += gmr_free(rt, p[i]) != 0;
  double took = now_s() - t0;
  is_int(bad, 0, "%zu ranges reserved and released", n);
  /* O(log n) takes well under a second; the sorted array it replaced took
   * minutes (it moved every range behind the one removed), so a bound that a
   * loaded or instrumented host cannot reach by accident. */
  ok(took < 30.0, "  in %.3f s (< 30 s)", took);
  free(p);
  gmr_runtime_free(rt);
}

/* Callbacks that call the runtime again (gmr_walk, gmr_stats_foreach, and a
 * FILE whose writes allocate, for gmr_summary) neither deadlock nor see a
 * half-changed state; alarm() turns a hang into a failure. */
typedef struct reenter_s {
  gmr_runtime_t *rt;
  int calls, errors, depth;
} reenter_t;

static void reenter(reenter_t *r) {
  void *p = NULL;
  gmr_stats_t st;
  if (gmr_alloc(r->rt, 4096, NULL, &p) != 0 || gmr_free(r->rt, p) != 0 ||
      gmr_stats(r->rt, &st) != 0 || gmr_check(r->rt) != 0)
    ++r->errors;
  ++r->calls;
}

static int walk_reenter(const gmr_walk_entry_t *e, void *ud) {
  reenter_t *r = ud;
  (void)e;
  reenter(r);
  if (r->depth++ == 0) { /* a walk inside the walk */
    int rc = gmr_walk(r->rt, walk_reenter, r);
    if (rc != 0 && rc != GMR_ENOTSUP) ++r->errors;
  }
  return 0;
}

static int stat_reenter(const char *key, int64_t value, void *ud) {
  (void)key, (void)value;
  reenter(ud);
  int64_t v;
  if (gmr_stat_get(((reenter_t *)ud)->rt, "num_allocs", &v) != 0) ++((reenter_t *)ud)->errors;
  return 0;
}

static ssize_t file_reenter(void *cookie, const char *buf, size_t size) {
  (void)buf;
  reenter(cookie);
  return (ssize_t)size;
}

static void callbacks_reenter(void) {
  static const char *const stacks[] = {
      "policy: direct\n", "policy: caching\n", "policy: bfc\n",
      "policy: {name: caching, expandable_segments: true}\nlimit: {bytes: 1GiB}\n"};
  alarm(60);
  for (int k = 0; k < 4; ++k) {
    gmr_runtime_t *rt = sim_runtime(stacks[k], 1ull << 30, 0);
    if (rt == NULL) continue;
    void *keep = NULL;
    gmr_alloc(rt, 1 << 20, NULL, &keep);
    const char *name = gmr_runtime_policy(rt);
    reenter_t r = {rt, 0, 0, 0};
    int rc = gmr_walk(rt, walk_reenter, &r);
    ok((rc == 0 && r.calls > 0 && r.errors == 0) || rc == GMR_ENOTSUP,
       "%s: a gmr_walk callback allocates, frees, checks and walks (%d calls)", name, r.calls);
    r = (reenter_t){rt, 0, 0, 0};
    rc = gmr_stats_foreach(rt, stat_reenter, &r);
    ok(rc == 0 && r.calls > 0 && r.errors == 0, "  a gmr_stats_foreach callback too (%d calls)",
       r.calls);
    r = (reenter_t){rt, 0, 0, 0};
    FILE *f = fopencookie(&r, "w", (cookie_io_functions_t){.write = file_reenter});
    setvbuf(f, NULL, _IONBF, 0);
    rc = gmr_summary(rt, f);
    ok(rc == 0 && r.calls > 0 && r.errors == 0,
       "  and a FILE given to gmr_summary whose writes allocate (%d calls)", r.calls);
    fclose(f);
    gmr_free(rt, keep);
    gmr_runtime_free(rt);
  }
  alarm(0);
}

/* Class 12: a well-formed size past 64 bits is "too large", not "not a size". */
static void size_parsing(void) {
  static const char *const big[] = {"16EiB", "0x10000000000000000", "1e30", "17179869184GiB"};
  for (int i = 0; i < 4; ++i) {
    uint64_t v = 7;
    bool too_large = false;
    int rc = gmr__parse_size_why(big[i], &v, &too_large);
    ok(rc == GMR_EINVAL && too_large && v == 7, "'%s' is too large for 64 bits", big[i]);
  }
  static const char *const bad[] = {"inf", "nan", "12x", "-1", ""};
  for (int i = 0; i < 5; ++i) {
    uint64_t v = 7;
    bool too_large = true;
    int rc = gmr__parse_size_why(bad[i], &v, &too_large);
    ok(rc == GMR_EINVAL && !too_large && v == 7, "'%s' is not a size", bad[i]);
  }
  uint64_t v = 0;
  ok(gmr_parse_size("15.5EiB", &v) == 0 && v == 17870283321406128128ull, "15.5EiB still fits");
}

/* Class 2: limits on depth, size and breadth, checked as events arrive, so a
 * hostile file costs time linear in what is read; GMR_CONFIG too. */
static void config_limits(void) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  size_t depth = 50000; /* 100 KB of '[': 47 s before */
  char *deep = malloc(2 * depth + 64);
  strcpy(deep, "policy: direct\nx: ");
  size_t at = strlen(deep);
  for (size_t i = 0; i < depth; ++i)
    deep[at++] = '[';
  for (size_t i = 0; i < depth; ++i)
    deep[at++] = ']';
  deep[at++] = '\n', deep[at] = '\0';
  double t0 = now_s();
  int rc = gmr_config_load_string(deep, &cfg, &err);
  double took = now_s() - t0;
  is_int(rc, GMR_ECONFIG, "YAML nested %zu deep is refused", depth);
  like(err.message, "<string>:2:", "  at its line");
  like(err.message, "nested more than 32 deep", "  saying why");
  ok(took < 5.0, "  in %.3f s (< 5 s; 47 s before the limit)", took);
  free(deep);

  size_t big = (size_t)2 << 20;
  char *large = malloc(big + 1);
  memset(large, ' ', big);
  memcpy(large, "policy: direct\n#", 16);
  large[big] = '\0';
  t0 = now_s();
  rc = gmr_config_load_string(large, &cfg, &err);
  is_int(rc, GMR_ECONFIG, "a 2 MiB configuration is refused before it is parsed");
  like(err.message, "larger than 1 MiB", "  saying why");
  free(large);

  size_t keys = 60000;
  char *wide = malloc(keys * 12 + 64);
  at = (size_t)sprintf(wide, "policy: direct\nx: {");
  for (size_t i = 0; i < keys; ++i)
    at += (size_t)sprintf(wide + at, "k%zu: 1, ", i);
  strcpy(wide + at, "}\n");
  t0 = now_s();
  rc = gmr_config_load_string(wide, &cfg, &err);
  took = now_s() - t0;
  is_int(rc, GMR_ECONFIG, "a mapping of %zu keys is refused", keys);
  like(err.message, "more than 1000 entries", "  saying why");
  ok(took < 1.0, "  in %.3f s (< 1 s; its duplicate-key check is quadratic)", took);
  free(wide);

  rc = gmr_config_load_file("/dev/zero", &cfg, &err);
  is_int(rc, GMR_ECONFIG, "/dev/zero as a configuration (GMR_CONFIG=/dev/zero) is refused");
  like(err.message, "must be a regular file, not a character device", "  without reading it");

  /* A FIFO (GMR_CONFIG read at the first allocation): open() blocked forever. */
  char fifo[] = "/tmp/gmr-fifo-XXXXXX";
  if (mkdtemp(fifo) != NULL) {
    char fp[64];
    snprintf(fp, sizeof fp, "%s/config", fifo);
    mkfifo(fp, 0600);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(5);
      gmr_config_t *c2 = NULL;
      gmr_error_t e2;
      int r2 = gmr_config_load_file(fp, &c2, &e2);
      _exit(r2 == GMR_ECONFIG && strstr(e2.message, "not a FIFO") ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
       "a FIFO as a configuration is refused at once (%s %d; SIGALRM 14: it blocked)",
       WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    unlink(fp);
    rmdir(fifo);
  }

  static const char nul[] = "policy: direct\n\0limit: {bytes: 1}\n";
  FILE *f = tmpfile();
  fwrite(nul, 1, sizeof nul - 1, f);
  fflush(f);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fileno(f));
  rc = gmr_config_load_file(path, &cfg, &err);
  is_int(rc, GMR_ECONFIG, "a NUL byte in a configuration file is refused, not a silent end");
  like(err.message, "NUL byte", "  saying why");
  fclose(f);

  rc = gmr_config_load_string("policy: direct\nlimit: {bytes: 16EiB}\n", &cfg, &err);
  is_int(rc, GMR_ECONFIG, "16EiB is refused");
  like(err.message, "'16EiB' is too large for 'bytes'", "  as too large, not as 'not a size'");
  rc = gmr_config_load_string("policy: direct\nlimit: {bytes: 2EiB}\n", &cfg, &err);
  like(err.message, "a size is at most 1 EiB", "2EiB: every size option is at most 1 EiB");
  rc = gmr_config_load_string("policy: {name: caching, pytorch_alloc_conf: "
                              "\"expandable_segments:True,large_segment_size_mb:"
                              "99999999999999999\"}\n",
                              &cfg, &err);
  is_int(rc, 0, "a huge large_segment_size_mb is clamped, as PyTorch clamps it");
  gmr_config_free(cfg);
}

/* Class 1: a size option at its extreme never makes an address computation
 * overflow: every policy allocates, or says OOM, and its invariants hold. */
static void size_extremes(void) {
  static const char *const yaml[] = {
      "policy: {name: caching, expandable_segments: true, large_segment_size: 1EiB}\n",
      "policy: {name: caching, pytorch_alloc_conf: \"expandable_segments:True,"
      "large_segment_size_mb:99999999999999999\"}\n",
      "policy: {name: caching, large_segment_size: 1EiB, max_split_size: 1EiB, "
      "max_non_split_rounding: 1EiB}\n",
      "policy: {name: bfc, memory_limit: 1EiB}\n",
      "policy: {name: bfc, allow_growth: false, memory_limit: 1EiB}\n",
      "policy: {name: bfc, vmm: true, memory_limit: 1EiB}\n",
      "policy: direct\nlimit: {bytes: 1EiB}\n",
      "policy: caching\nlimit: {bytes: 1EiB, counts: reserved}\n",
      "device: {backend: sim, capacity: 4PiB, granularity: 1GiB}\n"
      "policy: {name: caching, expandable_segments: true}\n",
  };
  for (size_t k = 0; k < sizeof yaml / sizeof yaml[0]; ++k) {
    gmr_config_t *cfg = NULL;
    gmr_error_t cerr;
    gmr_runtime_t *rt = NULL;
    int rc = gmr_config_load_string(yaml[k], &cfg, &cerr);
    if (rc == 0) rc = gmr_runtime_new_sim(cfg, NULL, &rt);
    gmr_config_free(cfg);
    if (rt == NULL) { /* refused up front, with a reason: as good */
      ok(rc == GMR_ECONFIG || rc == GMR_ENOMEM || rc == GMR_EINVAL,
         "extreme configuration %zu: refused at creation (%s: %s)", k, gmr_err_name(rc),
         rc == GMR_ECONFIG && cfg == NULL ? cerr.message : gmr_last_error(NULL));
      continue;
    }
    int bad = 0;
    static const size_t sizes[] = {
        1, 4096, 3 << 20, 30 << 20, (size_t)1 << 40, ((size_t)1 << 60) - 1};
    void *p[6] = {0};
    for (int i = 0; i < 6; ++i) {
      int rc = gmr_alloc(rt, sizes[i], NULL, &p[i]);
      if (rc != 0 && rc != GMR_ENOMEM) ++bad, diag("%zu: %s", sizes[i], gmr_last_error(rt));
      if (rc != 0) p[i] = NULL;
      if (gmr_check(rt) != 0) ++bad, diag("check: %s", gmr_last_error(rt));
    }
    for (int i = 0; i < 6; ++i)
      if (p[i] != NULL && gmr_free(rt, p[i]) != 0) ++bad;
    gmr_empty_cache(rt);
    if (gmr_check(rt) != 0) ++bad;
    ok(bad == 0, "%s: allocations up to 1 EiB - 1 succeed or are OOMs; invariants hold",
       gmr_runtime_policy(rt));
    gmr_runtime_free(rt);
  }
}

/* Class 9: the BFC policy honours gmr_record_stream: a block freed while
 * another stream's work on it is pending is not handed out again until that
 * work completes. */
typedef struct seen_s {
  uintptr_t addr;
  int state;
} seen_t;
static int find_block(const gmr_walk_entry_t *e, void *ud) {
  seen_t *s = ud;
  if (!e->is_segment && e->address == s->addr) s->state = (int)e->state;
  return 0;
}

static void bfc_record_stream(void) {
  static const char *const stacks[] = {
      "policy: {name: bfc, allow_growth: false, memory_limit: 64MiB}\n",
      "policy: {name: bfc, allow_growth: true, memory_limit: 64MiB}\n",
      "policy: {name: bfc, memory_limit: 64MiB}\nlimit: {bytes: 32MiB}\n"};
  for (int k = 0; k < 3; ++k) {
    gmr_runtime_t *rt = sim_runtime(stacks[k], 1ull << 30, 0);
    if (rt == NULL) continue;
    const char *name = gmr_runtime_policy(rt);
    void *p = NULL, *q = NULL, *r = NULL;
    gmr_alloc(rt, 1 << 20, GMR_SIM_STREAM(0), &p);
    is_int(gmr_record_stream(rt, p, GMR_SIM_STREAM(1)), 0, "%s: record_stream on stream 1", name);
    gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(1)); /* work on stream 1, not done */
    gmr_free(rt, p);
    seen_t seen = {(uintptr_t)p, -1};
    gmr_walk(rt, find_block, &seen);
    is_int(seen.state, GMR_BLOCK_PENDING_FREE, "  the freed block waits for stream 1");
    gmr_stats_t st;
    gmr_stats(rt, &st);
    ok(st.active_bytes == st.allocated_bytes + (1 << 20) && st.allocations == 0,
       "  counted active, not allocated");
    gmr_alloc(rt, 1 << 20, GMR_SIM_STREAM(0), &q);
    ok(q != NULL &&
           ((uintptr_t)q + (1 << 20) <= (uintptr_t)p || (uintptr_t)q >= (uintptr_t)p + (1 << 20)),
       "  an allocation meanwhile gets other memory");
    is_int(gmr_check(rt), 0, "  invariants hold %s", gmr_last_error(rt));
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(1));
    gmr_alloc(rt, 1 << 20, GMR_SIM_STREAM(0), &r);
    ok(r == p, "  once the work is done the block is reused (best fit, lowest address)");
    gmr_free(rt, q);
    gmr_free(rt, r);
    /* Frees with pending work, then empty_cache: it waits for the work. */
    gmr_alloc(rt, 1 << 20, GMR_SIM_STREAM(0), &p);
    gmr_record_stream(rt, p, GMR_SIM_STREAM(2));
    gmr_record_stream(rt, p, GMR_SIM_STREAM(0)); /* its own stream: nothing to do */
    gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(2));
    gmr_free(rt, p);
    is_int(gmr_empty_cache(rt), 0, "  empty_cache with a pending free");
    gmr_stats(rt, &st);
    ok(st.active_bytes == 0 && gmr_check(rt) == 0, "  waits for its work and releases it");
    gmr_runtime_free(rt);
  }
}

/* Class 10: BFC's retry waits only when waiting can help.  16 threads fill a
 * capped BFC, try 5 more times each while keeping what they got, then free
 * it: whenever all of them wait, nobody can free, and they fail at once
 * instead of sleeping 10 s each (TensorFlow's retry: a minute or more). */
typedef struct filler_s {
  gmr_runtime_t *rt;
  int got, ooms, errors;
  void *p[256];
} filler_t;
static void *fill_until_refused(void *arg) {
  filler_t *f = arg;
  for (int tries = 0; f->got < 256 && tries < 6;) {
    int rc = gmr_alloc(f->rt, 1 << 20, NULL, &f->p[f->got]);
    if (rc == 0)
      ++f->got;
    else if (rc == GMR_ENOMEM)
      ++f->ooms, ++tries;
    else
      ++f->errors, ++tries;
  }
  for (int j = 0; j < f->got; ++j)
    if (gmr_free(f->rt, f->p[j]) != 0) ++f->errors;
  return NULL;
}

static void bfc_retry_when_useful(void) {
  static const char *const stacks[] = {
      "policy: {name: bfc, allow_growth: true, memory_limit: 1GiB}\n"
      "limit: {bytes: 64MiB, counts: reserved}\n",
      "policy: {name: bfc, allow_growth: true, memory_limit: 64MiB}\n",
      "policy: {name: bfc, allow_growth: false, memory_limit: 64MiB}\n"};
  for (int k = 0; k < 3; ++k) {
    gmr_runtime_t *rt = sim_runtime(stacks[k], 1ull << 30, 0);
    if (rt == NULL) continue;
    filler_t f[16];
    pthread_t th[16];
    double t0 = now_s();
    for (int i = 0; i < 16; ++i) {
      f[i] = (filler_t){.rt = rt};
      pthread_create(&th[i], NULL, fill_until_refused, &f[i]);
    }
    int got = 0, ooms = 0, errors = 0;
    for (int i = 0; i < 16; ++i) {
      pthread_join(th[i], NULL);
      got += f[i].got, ooms += f[i].ooms, errors += f[i].errors;
    }
    double took = now_s() - t0;
    ok(ooms >= 16 && got >= 40 && errors == 0, "stack %d: 16 threads fill it (%d MiB), %d OOMs", k,
       got, ooms);
    ok(took < 5.0, "  in %.2f s, not 10 s per refusal", took);
    gmr_stats_t st;
    gmr_stats(rt, &st);
    is_u64(st.allocations, 0, "  all freed");
    is_int(gmr_check(rt), 0, "  invariants hold");
    gmr_runtime_free(rt);
  }
}

/* ... and still waits, as TensorFlow does, when memory changes hands: once
 * some thread has freed a chunk another thread allocated, a thread that
 * holds everything and waits may be given memory by another thread's free
 * (TF's executors free tensors on whichever thread drops the last
 * reference). */
typedef struct handoff_s {
  gmr_runtime_t *rt;
  void *p;
  int delay_ms, rc;
} handoff_t;
static void *free_later(void *arg) {
  handoff_t *h = arg;
  struct timespec ts = {0, (long)h->delay_ms * 1000000L};
  nanosleep(&ts, NULL);
  h->rc = gmr_free(h->rt, h->p);
  return NULL;
}

static void bfc_retry_after_handoff(void) {
  gmr_runtime_t *rt = sim_runtime(
      "policy: {name: bfc, allow_growth: false, memory_limit: 64MiB, retry_timeout: 5s}\n",
      1ull << 30, 0);
  if (rt == NULL) return;
  void *warm = NULL, *all = NULL, *more = NULL;
  gmr_alloc(rt, 1 << 20, NULL, &warm);
  handoff_t h = {rt, warm, 0, -1};
  pthread_t th;
  pthread_create(&th, NULL, free_later, &h); /* frees this thread's chunk */
  pthread_join(th, NULL);
  is_int(gmr_alloc(rt, 64 << 20, NULL, &all), 0, "handoff: this thread holds the whole limit");
  h = (handoff_t){rt, all, 200, -1};
  pthread_create(&th, NULL, free_later, &h); /* frees it in 0.2 s */
  double t0 = now_s();
  int rc = gmr_alloc(rt, 1 << 20, NULL, &more);
  double took = now_s() - t0;
  pthread_join(th, NULL);
  is_int(rc, 0, "  an allocation waits for another thread's free of this thread's chunk");
  ok(took >= 0.1 && took < 4.0, "  for about 0.2 s (%.3f s)", took);
  if (rc == 0) gmr_free(rt, more);
  is_int(h.rc, 0, "  the other thread's free succeeded");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

/* fuzz-api's "requested > allocated" (caching with max_split_size and GC):
 * PyTorch's own accounting, kept by the faithful policy.  free() takes the
 * block out of allocated_bytes at once; free_block, which takes it out of
 * active_bytes and requested_bytes, runs only once the events of its
 * recorded streams complete.  So a block freed while another stream's work
 * on it is queued counts in requested and active, not in allocated. */
static void caching_requested_above_allocated(void) {
  static const char *const stacks[] = {
      "policy: caching\n",
      "policy: {name: caching, max_split_size: 128MiB, garbage_collection_threshold: 0.5}\n",
      "policy: {name: caching, expandable_segments: true}\n"};
  for (int k = 0; k < 3; ++k) {
    gmr_runtime_t *rt = sim_runtime(stacks[k], 1ull << 30, 0);
    if (rt == NULL) continue;
    void *p = NULL, *q = NULL;
    gmr_alloc(rt, 1000, GMR_SIM_STREAM(0), &p); /* a 1024-byte block */
    gmr_record_stream(rt, p, GMR_SIM_STREAM(1));
    gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(1));
    gmr_free(rt, p);
    gmr_stats_t st;
    gmr_stats(rt, &st);
    ok(st.allocated_bytes == 0 && st.requested_bytes == 1000 && st.active_bytes == 1024,
       "caching %d: a free with queued work on another stream: allocated %llu, requested %llu, "
       "active %llu (PyTorch: 0, 1000, 1024)",
       k, (unsigned long long)st.allocated_bytes, (unsigned long long)st.requested_bytes,
       (unsigned long long)st.active_bytes);
    is_int(gmr_check(rt), 0, "  the invariants say the same");
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(1));
    gmr_alloc(rt, 1000, GMR_SIM_STREAM(0), &q); /* malloc processes the events first */
    gmr_free(rt, q);
    gmr_stats(rt, &st);
    ok(st.allocated_bytes == 0 && st.requested_bytes == 0 && st.active_bytes == 0,
       "  once the work completes, the next allocation's free_block drops them");
    gmr_runtime_free(rt);
  }
}

/* What the fuzzers found, kept as seeds and replayed here under every stack:
 * a trace whose 10th allocation split a block with no spare record left
 * (caching with expandable segments, after an unmap and a map), and a trace
 * asking for 1 PB on a 1 GiB device (the stitch policy sized its range and
 * page table by the request: 18 GB of host memory). */
static void fuzz_findings(void) {
  static const char *const files[] = {"finding-expandable-split.csv", "finding-stitch-huge.csv"};
  for (size_t f = 0; f < sizeof files / sizeof files[0]; ++f) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus/trace/%s", tap_srcdir(), files[f]);
    gmr_trace_data_t *t = NULL;
    char err[256];
    if (!ok(gmr_trace_read(path, &t, err, sizeof err) == 0, "the fuzzer's trace %s reads",
            files[f])) {
      diag("%s", err);
      continue;
    }
    int bad = 0;
    for (size_t s = 0; s < FUZZ_N_STACKS; ++s) {
      gmr_runtime_t *rt = fuzz_runtime(s, 1ull << 30, 0);
      gmr_replay_options_t o = {.check = 1};
      gmr_replay_result_t r;
      if (gmr_replay(rt, t, &o, &r) != 0 || r.check_failed) ++bad, diag("%s", r.check_message);
      gmr_runtime_free(rt);
    }
    is_int(bad, 0, "  replays under every stack with its invariants");
    gmr_trace_data_free(t);
  }
  /* The stitch policy refuses more than the device at once, as an OOM. */
  gmr_runtime_t *rt = sim_runtime("policy: stitch\n", 1ull << 30, 0);
  if (rt == NULL) return;
  void *p = NULL;
  double t0 = now_s();
  int rc = gmr_alloc(rt, (size_t)1 << 50, NULL, &p);
  double took = now_s() - t0;
  is_int(rc, GMR_ENOMEM, "stitch: 1 PiB on a 1 GiB device is an OOM");
  ok(strstr(gmr_last_error(rt), "larger than the device") != NULL, "  saying why: %s",
     gmr_last_error(rt));
  ok(took < 5.0, "  at once (%.3f s; mapping its pages would never end)", took);
  rc = gmr_alloc(rt, SIZE_MAX, NULL, &p);
  is_int(rc, GMR_ENOMEM, "  so is SIZE_MAX bytes (its rounding would wrap)");
  is_int(gmr_check(rt), 0, "  invariants hold");
  gmr_runtime_free(rt);
}

int main(void) {
  fuzz_findings();
  caching_requested_above_allocated();
  bfc_record_stream();
  bfc_retry_when_useful();
  bfc_retry_after_handoff();
  config_limits();
  size_extremes();
  size_parsing();
  callbacks_reenter();
  sim_capacity();
  sim_many_ranges();
  charge_refunds();
  trace_write_failures();
  trace_reader();
  trace_collisions();
  return done_testing();
}
