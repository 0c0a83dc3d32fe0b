/* fuzz-pickle.c: libFuzzer harness for the snapshot reader (replay-pickle.c)
 * with a dictionary of pickle opcodes and snapshot keys (pickle.dict).
 *
 * Input: a flags byte, then a pickle (PROTO is prepended when it does not
 * start with one, so mutations keep reaching the reader).  Promises checked:
 * gmr_trace_parse reads it into a trace with dense ids or rejects it with
 * "NAME: ..." and no trace; gmr_snapshot_csv (sites, reconstruct and the
 * device from the flags) converts it or says why; and each costs O(len)
 * steps and bytes whatever the input (Note [Shared values]): a memo
 * reference that repeats an entry, a frame or a key must not make either
 * grow faster than the input. */
#include "fuzz.h"
#include "gmr_replay.h"
#include "replay/replay-formats.h"

/* Steps and bytes per input byte, and the fixed part (one chunk of values,
 * the first text buffer, the indexes of a few dicts). */
#define FUZZ_STEPS_PER_BYTE 64
#define FUZZ_BYTES_PER_BYTE 128
#define FUZZ_FIXED_BYTES    (1u << 20)

static void check_cost(const char *what, size_t len) {
  const gmr__snapshot_cost_t *c = gmr__snapshot_last_cost();
  fuzz_assert(c->steps <= FUZZ_STEPS_PER_BYTE * (uint64_t)len + 4096,
              "%s: %llu steps for %zu bytes", what, (unsigned long long)c->steps, len);
  fuzz_assert(c->bytes <= FUZZ_BYTES_PER_BYTE * (uint64_t)len + FUZZ_FIXED_BYTES,
              "%s: %llu bytes for %zu bytes", what, (unsigned long long)c->bytes, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t flags = data[0];
  ++data, --size;
  unsigned char *p = malloc(size + 2);
  if (p == NULL) return 0;
  size_t len = 0;
  if (size < 2 || data[0] != 0x80) p[len++] = 0x80, p[len++] = 4;
  memcpy(p + len, data, size);
  len += size;

  gmr_trace_data_t *t = NULL;
  char err[512];
  int rc = gmr_trace_parse((const char *)p, len, "fuzz.pickle", &t, err, sizeof err);
  if (rc != 0) {
    fuzz_assert(rc == GMR_EINVAL || rc == GMR_ENOMEM, "rc %d", rc);
    fuzz_assert(t == NULL, "a rejected snapshot was returned");
    fuzz_assert(strncmp(err, "fuzz.pickle:", 12) == 0, "message without the name: %s", err);
  } else {
    fuzz_assert(t->format == GMR_TRACE_FORMAT_SNAPSHOT, "format %d", (int)t->format);
    size_t live = 0;
    for (size_t i = 0; i < t->n_events; ++i) {
      const gmr_trace_event_t *e = &t->events[i];
      if (e->action == GMR_TRACE_ALLOC) fuzz_assert(e->id == live++, "ids are dense: %u", e->id);
      if (e->action != GMR_TRACE_EMPTY_CACHE) fuzz_assert(e->id < t->n_ids, "id %u", e->id);
      fuzz_assert(e->site <= t->n_sites, "site %u of %zu", e->site, t->n_sites);
    }
    fuzz_assert(live == t->n_ids, "ids");
    gmr_trace_data_free(t);
  }
  check_cost("gmr_trace_parse", len);

  gmr_snapshot_csv_options_t o = {.sites = flags & 1,
                                  .reconstruct = (flags >> 1) & 1,
                                  .has_device = (flags >> 2) & 1,
                                  .device = (flags >> 3) & 3};
  gmr_snapshot_csv_t *s = NULL;
  rc = gmr_snapshot_csv(p, len, "fuzz.pickle", &o, &s, err, sizeof err);
  if (rc != 0) {
    fuzz_assert(rc == GMR_EINVAL || rc == GMR_ENOMEM, "rc %d", rc);
    fuzz_assert(s == NULL && err[0] != '\0', "a refusal says why");
  } else {
    fuzz_assert(s->csv != NULL && strlen(s->csv) == s->csv_len, "the CSV is its length");
    fuzz_assert(s->live_at_end <= s->allocations, "live %zu of %zu", s->live_at_end,
                s->allocations);
    gmr_snapshot_csv_free(s);
  }
  check_cost("gmr_snapshot_csv", len);
  free(p);
  return 0;
}
