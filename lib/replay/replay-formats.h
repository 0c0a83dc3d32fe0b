/* replay-formats.h: the trace reader's helpers for the formats other tools
 * write, shared by replay.c (the reader) and the files that know them:
 * replay-rmm.c (the fields of RMM's logging_resource_adaptor logs, and call
 * sites) and replay-pickle.c (PyTorch memory snapshots).  Neither calls
 * into replay.c: the reader calls them, and parses what the pickle reader
 * writes as any trace.
 */
#ifndef GMR_REPLAY_FORMATS_H
#define GMR_REPLAY_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gmr_replay.h"

/* An action the recording saw fail ("allocate failure"): counted, not an event. */
#define GMR__TRACE_ALLOC_FAILURE 4

/* Time as gmr writes it (integer microseconds), as RMM's logging adaptor
 * writes it (HH:MM:SS.ffffff, microseconds since midnight), or as its
 * documentation shows it (seconds since the epoch with a fraction).  Stored
 * for reference only.  true when `s` is one of them. */
bool gmr__trace_parse_time(const char *s, uint64_t *out_us);
/* allocate, free, deallocate, record_stream, empty_cache (gmr_trace_action_t)
 * or "allocate failure" (GMR__TRACE_ALLOC_FAILURE); -1 for anything else. */
int gmr__trace_parse_action(const char *s);
/* A pointer or a stream as C and C++ print them: 0x hexadecimal, decimal,
 * "(nil)" or "nullptr" (0).  true when `s` is one of them. */
bool gmr__trace_parse_handle(const char *s, uint64_t *out);

/* Call sites, interned: each distinct text gets an index 1, 2, ... (a
 * table under a keyed hash, Note [Call sites] in replay-rmm.c). */
typedef struct gmr__sites_s gmr__sites_t;
gmr__sites_t *gmr__sites_new(void);
/* The index of `text` (added when new); 0 when host memory runs out. */
uint32_t gmr__sites_intern(gmr__sites_t *s, const char *text);
/* The slots looked at so far (Note [Call sites]), for the tests. */
uint64_t gmr__sites_probes(const gmr__sites_t *s);
/* Move the texts into t->sites / t->n_sites and free the table. */
void gmr__sites_finish(gmr__sites_t *s, gmr_trace_data_t *t);

/* Whether `text` starts like a pickle (protocol 2 or later). */
bool gmr__is_pickle(const char *text, size_t len);
/* Where gmr__snapshot_to_csv hands its text: whole lines, len bytes at
 * text (writable, not NUL-terminated); 0 to go on, else an error code that
 * stops the conversion and is returned (with err set by the sink). */
typedef int gmr__csv_sink_fn(void *ud, char *text, size_t len);
/* Turn a PyTorch memory snapshot into trace CSV text, one line per entry of
 * the chosen device's trace (skipped entries become comments, so line N is
 * entry N), handed to sink in chunks as it is made, so that the text is
 * never held whole (Note [Shared values] in replay-pickle.c).  On success
 * *out_note (what was left out, or NULL) is set, and the failures the
 * history records are counted in *failures / *failure_bytes / *first_failure.
 * GMR_EINVAL with a sentence in err for a file that is not a usable snapshot;
 * the sink's error as it returned it. */
int gmr__snapshot_to_csv(const char *text, size_t len, const char *name, gmr__csv_sink_fn *sink,
                         void *ud, char **out_note, size_t *failures, uint64_t *failure_bytes,
                         uint32_t *first_failure, char *err, size_t errlen);

/* What this thread's last conversion of a snapshot (gmr__snapshot_to_csv,
 * gmr_snapshot_csv) cost, for the tests: steps = values visited by the walk
 * of the result, keys compared and levels of its trees descended; bytes =
 * host memory the reader took (values, containers, indexes, tree nodes and
 * the rows it held at once; not gmr_snapshot_csv's result, which is the
 * text asked for).  Both are O(len) (Note [Shared values]). */
typedef struct gmr__snapshot_cost_s {
  uint64_t steps;
  uint64_t bytes;
} gmr__snapshot_cost_t;
const gmr__snapshot_cost_t *gmr__snapshot_last_cost(void);

#endif /* GMR_REPLAY_FORMATS_H */
