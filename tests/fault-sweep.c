/* fault-sweep.c: fail the k-th device call (reserve, virtual reserve, map, page create,
 * page map, set access) of a replay, for
 * every k, on every policy stack (tests/fuzz/fuzz.h).
 *
 * For each stack, a replay without faults counts its device calls D and
 * leaves R bytes reserved once everything is freed and the cache emptied.
 * Then, for k = 1 .. D, a fresh runtime fails the k-th call and replays the
 * same trace with gmr_check after every event.  After each:
 *   - the replay reports no invariant broken and no error other than OOM
 *     (a failed reservation is an OOM, or is absorbed by a cache flush and
 *     retry, never GMR_EDEVICE, GMR_EINVAL or a crash);
 *   - once every allocation is freed and the cache emptied, the device holds
 *     exactly R bytes again (no leaked segment or page), and the policy
 *     counts no live allocation;
 *   - under AddressSanitizer, no host memory leaks.
 * The trace (GMR_SWEEP_EVENTS events, default 600, seeded) mixes small and
 * large sizes on three streams, record_stream and empty_cache, and frees
 * everything at its end.  The same sweep across gmr_sleep and gmr_wake,
 * failing each of their device calls in turn, is tests/sleep-wake.c's. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "gmr_replay.h"
#include "tap.h"

static uint64_t next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* A synthetic trace of n events, every allocation freed at the end. */
static char *make_trace(size_t n, uint64_t seed, size_t *len) {
  size_t cap = (n + 64) * 64 + 256, at = 0;
  char *t = malloc(cap);
  if (t == NULL) return NULL;
  at += (size_t)snprintf(t + at, cap - at, "Thread,Time,Action,Pointer,Size,Stream\n");
  enum { LIVE = 160 };
  uint64_t live[LIVE] = {0}, next_ptr = 0x1000;
  uint64_t s = seed;
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = next(&s) % 100;
    int k = (int)(next(&s) % LIVE);
    if (r < 3) {
      at += (size_t)snprintf(t + at, cap - at, "0,%zu,empty_cache,0,0,0\n", i);
    } else if (r < 8 && live[k] != 0) {
      at += (size_t)snprintf(t + at, cap - at, "0,%zu,record_stream,%#llx,0,%llu\n", i,
                             (unsigned long long)live[k], (unsigned long long)(next(&s) % 3));
    } else if (live[k] != 0) {
      at += (size_t)snprintf(t + at, cap - at, "0,%zu,free,%#llx,0,0\n", i,
                             (unsigned long long)live[k]);
      live[k] = 0;
    } else {
      uint64_t size = next(&s) % 10 < 7 ? 1 + next(&s) % (1u << 20) : 1 + next(&s) % (24u << 20);
      live[k] = next_ptr++;
      at += (size_t)snprintf(t + at, cap - at, "0,%zu,allocate,%#llx,%llu,%llu\n", i,
                             (unsigned long long)live[k], (unsigned long long)size,
                             (unsigned long long)(next(&s) % 3));
    }
  }
  for (int k = 0; k < LIVE; ++k)
    if (live[k] != 0)
      at += (size_t)snprintf(t + at, cap - at, "0,%zu,free,%#llx,0,0\n", n + (size_t)k,
                             (unsigned long long)live[k]);
  *len = at;
  return t;
}

typedef struct outcome_s {
  int replay_rc, check_failed;
  char message[1024];
  size_t ooms;
  uint64_t device_calls; /* calls the fault schedule counts */
  uint64_t held_after;   /* bytes the device holds once all is freed and emptied */
  uint64_t allocations;  /* live allocations the policy counts at the end */
} outcome_t;

static int run(size_t stack, const gmr_trace_data_t *t, uint64_t fail_k, outcome_t *o) {
  gmr_runtime_t *rt = fuzz_runtime(stack, 4ull << 30, 0);
  if (fail_k) gmr_sim_fail_nth(rt, fail_k);
  gmr_replay_options_t opts = {.check = 1};
  gmr_replay_result_t r;
  memset(o, 0, sizeof *o);
  o->replay_rc = gmr_replay(rt, t, &opts, &r);
  o->check_failed = r.check_failed;
  snprintf(o->message, sizeof o->message, "%s", r.check_message);
  o->ooms = r.ooms;
  gmr_sim_fail_nth(rt, 0);
  for (int s = 0; s < 3; ++s)
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(s));
  gmr_empty_cache(rt);
  if (gmr_check(rt) != 0) {
    o->check_failed = 1;
    snprintf(o->message, sizeof o->message, "at the end: %s", gmr_last_error(rt));
  }
  gmr_sim_counters_t c;
  gmr_sim_counters(rt, &c);
  /* every call the simulator's fault schedule counts */
  o->device_calls = c.reserve_calls + c.va_reserve_calls + c.map_calls + c.page_create_calls +
                    c.page_map_calls + c.set_access_calls;
  o->held_after = c.bytes_in_use;
  gmr_stats_t st;
  gmr_stats(rt, &st);
  o->allocations = st.allocations;
  gmr_runtime_free(rt);
  return 0;
}

int main(void) {
  size_t n = 600;
  const char *env = getenv("GMR_SWEEP_EVENTS");
  if (env && *env) n = strtoull(env, NULL, 10);
  size_t len = 0;
  char *text = make_trace(n, 15, &len);
  gmr_trace_data_t *t = NULL;
  char err[256];
  if (text == NULL || gmr_trace_parse(text, len, "sweep.csv", &t, err, sizeof err) != 0) {
    ok(0, "the sweep's trace parses: %s", err);
    return done_testing();
  }
  free(text);
  is_int(t->n_live_at_end, 0, "the sweep's trace (%zu events) frees everything", t->n_events);
  uint64_t total = 0;
  for (size_t s = 0; s < FUZZ_N_STACKS; ++s) {
    outcome_t base, o;
    run(s, t, 0, &base);
    char name[160];
    snprintf(name, sizeof name, "%s", fuzz_stacks[s]);
    for (char *c = name; *c; ++c)
      if (*c == '\n') *c = ' ';
    if (!ok(base.replay_rc == 0 && !base.check_failed && base.allocations == 0,
            "%s: the replay without faults (%llu device calls, %zu OOMs)", name,
            (unsigned long long)base.device_calls, base.ooms))
      diag("%s", base.message);
    long bad = 0;
    for (uint64_t k = 1; k <= base.device_calls; ++k) {
      run(s, t, k, &o);
      bool good = o.replay_rc == 0 && !o.check_failed && o.allocations == 0 &&
                  o.held_after == base.held_after;
      if (!good && bad++ < 3)
        diag("k=%llu: rc %d, %s, %llu allocations left, %llu bytes held (%llu without faults)",
             (unsigned long long)k, o.replay_rc, o.check_failed ? o.message : "checks hold",
             (unsigned long long)o.allocations, (unsigned long long)o.held_after,
             (unsigned long long)base.held_after);
    }
    total += base.device_calls;
    is_int(bad, 0,
           "  each of its %llu device calls failed in turn: invariants hold, only OOMs, "
           "nothing leaked",
           (unsigned long long)base.device_calls);
  }
  diag("%llu faulted replays in all", (unsigned long long)total);
  gmr_trace_data_free(t);
  return done_testing();
}
