/* fuzz.h: what the libFuzzer harnesses share: the policy stacks they run
 * on, the runtimes on the simulator (with page reuse when host-backed) and
 * its test of what is device memory now, and the tag pattern that catches
 * memory handed out twice or lost.
 *
 * The harnesses are built by tests/fuzz/build.sh with clang's libFuzzer
 * and AddressSanitizer + UndefinedBehaviorSanitizer, from the library's
 * sources; tests/fuzz/run.sh runs each for a bounded time (docs/fuzzing.md). */
#ifndef GMR_FUZZ_H
#define GMR_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"
#include "runtime/runtime.h"

/* Every policy, alone and under both kinds of limit. */
static const char *const fuzz_stacks[] = {
    "policy: direct\n",
    "policy: caching\n",
    "policy: {name: caching, expandable_segments: true}\n",
    "policy: {name: caching, max_split_size: 128MiB, garbage_collection_threshold: 0.5}\n",
    "policy: {name: bfc, allow_growth: true, memory_limit: 512MiB}\n",
    "policy: {name: bfc, allow_growth: false, memory_limit: 256MiB}\n",
    "policy: direct\nlimit: {bytes: 64MiB}\n",
    "policy: caching\nlimit: {bytes: 128MiB, counts: reserved}\n",
    "policy: {name: caching, expandable_segments: true}\nlimit: {bytes: 128MiB}\n",
    "policy: {name: bfc, allow_growth: true}\nlimit: {bytes: 96MiB}\n",
    "policy: {name: bfc, memory_limit: 256MiB}\nlimit: {bytes: 128MiB, counts: reserved}\n",
    "policy: stitch\n",
    "policy: {name: stitch, cross_stream: sync}\nlimit: {bytes: 128MiB, counts: reserved}\n",
};
#define FUZZ_N_STACKS (sizeof fuzz_stacks / sizeof fuzz_stacks[0])

/* A fuzzer stops at the first broken promise: abort() is what libFuzzer
 * reports as a crash, with the input that caused it. */
#define fuzz_assert(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* One runtime per stack on a simulated device, created once per process
 * (creating a runtime per input would dominate the time).  Host-backed, the
 * simulator reuses host pages (gmr__sim_host_reuse: no page fault or system
 * call per reservation), so a released range stays readable: the harness
 * checks every block it touches with fuzz_covered instead. */
static inline gmr_runtime_t *fuzz_runtime(size_t stack, uint64_t capacity, int host_backed) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_string(fuzz_stacks[stack], &cfg, &err) != 0) {
    fprintf(stderr, "fuzz: %s", err.message);
    abort();
  }
  gmr_sim_options_t o = {.capacity = capacity, .host_backed = host_backed};
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  fuzz_assert(rc == 0, "%s", gmr_last_error(NULL));
  if (host_backed)
    fuzz_assert(gmr__sim_host_reuse(gmr__sim_of(gmr__runtime_device_backend(rt))) == 0,
                "page reuse");
  return rt;
}

/* Page reuse keeps what the runtimes' blocks touched: every new input may
 * touch free arena pages no earlier one did, so the resident set climbs
 * towards every runtime's whole used span (several GiB).  Every 64 inputs,
 * when the process holds more than 1.5 GiB, give the free pages back to the
 * host (the next inputs fault them in again), so a long run stays below
 * libFuzzer's default -rss_limit_mb=2048 (libFuzzer compares its peak RSS),
 * not only below run.sh's 4096. */
static inline void fuzz_bound_memory(gmr_runtime_t *const *rts, size_t n) {
  static unsigned calls;
  if (++calls % 64 != 0) return;
  unsigned long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return;
  int got = fscanf(f, "%lu %lu", &pages, &resident);
  fclose(f);
  long pg = sysconf(_SC_PAGESIZE);
  if (got != 2 || resident * (unsigned long)(pg > 0 ? pg : 4096) < (3ul << 29)) return;
  for (size_t i = 0; i < n; ++i)
    if (rts[i] != NULL) gmr__sim_host_trim(gmr__sim_of(gmr__runtime_device_backend(rts[i])));
}

/* Is [p, p + n) device memory the runtime holds now (inside one live
 * reservation, or on mappings with access)?  *token tells which reservation
 * (0: on mappings), so a block whose reservation was released and another
 * reserved at its address is found. */
static inline int fuzz_covered(gmr_runtime_t *rt, const void *p, size_t n, uint64_t *token) {
  return gmr__sim_covers(gmr__sim_of(gmr__runtime_device_backend(rt)), p, n, token);
}

/* The tag pattern: blocks under 256 bytes are filled whole; larger ones get
 * a word at each end and at 14 offsets between, so that a large block costs
 * a few page touches, not one per page.  Memory handed out twice breaks
 * the words of one of them; memory whose content a policy loses (unmapped
 * and mapped again, remapped to other pages) breaks its own.  (Two blocks
 * that overlap only partly need not touch each other's words: the harness
 * checks overlaps by address.) */
#define FUZZ_SAMPLES 16
static inline size_t fuzz_at(size_t n, int i) {
  /* n >= 256: consecutive offsets are >= 16 bytes apart, so words never overlap */
  return i == FUZZ_SAMPLES - 1 ? n - 8 : ((n - 8) * (size_t)i / (FUZZ_SAMPLES - 1)) & ~(size_t)7;
}
static inline void fuzz_fill(unsigned char *p, size_t n, uint64_t tag) {
  if (n < 256) {
    memset(p, (int)(tag & 0xff), n);
    return;
  }
  for (int i = 0; i < FUZZ_SAMPLES; ++i) {
    uint64_t v = tag ^ (uint64_t)i;
    memcpy(p + fuzz_at(n, i), &v, 8);
  }
}
static inline int fuzz_verify(const unsigned char *p, size_t n, uint64_t tag) {
  if (n < 256) {
    for (size_t i = 0; i < n; ++i)
      if (p[i] != (unsigned char)(tag & 0xff)) return 0;
    return 1;
  }
  for (int i = 0; i < FUZZ_SAMPLES; ++i) {
    uint64_t v;
    memcpy(&v, p + fuzz_at(n, i), 8);
    if (v != (tag ^ (uint64_t)i)) return 0;
  }
  return 1;
}

#endif /* GMR_FUZZ_H */
