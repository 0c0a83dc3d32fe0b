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

/* Call sites, interned: each distinct text gets an index 1, 2, ... */
typedef struct gmr__sites_s gmr__sites_t;
gmr__sites_t *gmr__sites_new(void);
/* The index of `text` (added when new); 0 when host memory runs out. */
uint32_t gmr__sites_intern(gmr__sites_t *s, const char *text);
/* Move the texts into t->sites / t->n_sites and free the table. */
void gmr__sites_finish(gmr__sites_t *s, gmr_trace_data_t *t);

/* Whether `text` starts like a pickle (protocol 2 or later). */
bool gmr__is_pickle(const char *text, size_t len);
/* Turn a PyTorch memory snapshot into trace CSV text, one line per entry of
 * the chosen device's trace (skipped entries become comments, so line N is
 * entry N).  On success *out_csv (gmr__malloc'd, NUL-terminated) and
 * *out_note (what was left out, or NULL) are set, and the failures the
 * history records are counted in *failures / *failure_bytes / *first_failure.
 * GMR_EINVAL with a sentence in err for a file that is not a usable snapshot. */
int gmr__snapshot_to_csv(const char *text, size_t len, const char *name, char **out_csv,
                         size_t *out_len, char **out_note, size_t *failures,
                         uint64_t *failure_bytes, uint32_t *first_failure, char *err,
                         size_t errlen);

#endif /* GMR_REPLAY_FORMATS_H */
