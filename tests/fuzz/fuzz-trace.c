/* fuzz-trace.c: libFuzzer harness for the trace reader, then a replay of
 * what it accepts under every policy stack with gmr_check after each event.
 *
 * Input: trace text (any bytes).  Promises checked: the reader accepts the
 * input whole or rejects it with "NAME:LINE: ..." and no trace; an accepted
 * trace has dense ids and frees of live ids; its replay on each stack never
 * fails other than by OOM, gmr_check holds after every event, and the
 * runtime holds nothing once the live allocations are freed.  Replays are
 * cut at FUZZ_MAX_EVENTS events to keep executions fast. */
#include "fuzz.h"
#include "gmr_replay.h"

#define FUZZ_MAX_EVENTS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gmr_trace_data_t *t = NULL;
  char err[512];
  int rc = gmr_trace_parse((const char *)data, size, "fuzz.csv", &t, err, sizeof err);
  if (rc != 0) {
    fuzz_assert(rc == GMR_EINVAL || rc == GMR_ENOMEM, "rc %d", rc);
    fuzz_assert(t == NULL, "a rejected trace was returned");
    fuzz_assert(strncmp(err, "fuzz.csv:", 9) == 0, "message without the name: %s", err);
    return 0;
  }
  size_t live = 0;
  for (size_t i = 0; i < t->n_events; ++i) {
    const gmr_trace_event_t *e = &t->events[i];
    if (e->action == GMR_TRACE_ALLOC) fuzz_assert(e->id == live++, "ids are dense: %u", e->id);
    if (e->action != GMR_TRACE_EMPTY_CACHE) fuzz_assert(e->id < t->n_ids, "id %u", e->id);
  }
  fuzz_assert(live == t->n_ids, "ids");
  if (t->n_events > FUZZ_MAX_EVENTS) t->n_events = FUZZ_MAX_EVENTS;
  for (size_t s = 0; s < FUZZ_N_STACKS; ++s) {
    gmr_runtime_t *rt = fuzz_runtime(s, 1ull << 30, 0);
    gmr_replay_options_t o = {.check = 1};
    gmr_replay_result_t r;
    rc = gmr_replay(rt, t, &o, &r);
    fuzz_assert(rc == 0, "replay: %s", gmr_err_name(rc));
    fuzz_assert(!r.check_failed, "%s: %s", fuzz_stacks[s], r.check_message);
    fuzz_assert(r.events_done == t->n_events, "stopped early");
    gmr_runtime_free(rt);
  }
  gmr_trace_data_free(t);
  return 0;
}
