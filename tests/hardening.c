/* hardening.c: regression tests for the defects a hostile caller, trace or
 * device found (issue 15), one section per class: each check failed before
 * its fix.  Bounds and messages are the documented ones (docs/design.md,
 * docs/trace-format.md, gmr.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int main(void) {
  trace_reader();
  trace_collisions();
  return done_testing();
}
