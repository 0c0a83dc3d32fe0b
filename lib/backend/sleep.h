/* sleep.h: the sleepable face, a backend decorator that lets a private pool
 * give its physical memory back and take it again at the same addresses
 * (gmr_sleep and gmr_wake, docs/sleep-wake.md).
 *
 * A tagged pool's policies reach the device through it: it records every
 * range they have mapped (expandable maps, page maps of page handles it
 * virtualizes, and cudaMalloc-style reservations, which it serves as a
 * virtual range with memory mapped into it), each with a mapped or asleep
 * state.  See Note [The sleepable face] in sleep.c.
 */
#ifndef GMR_SLEEP_H
#define GMR_SLEEP_H

#include "backend/backend.h"

/* Wrap `real` (owned by the result from now on, even on failure).
 * @return 0, GMR_ENOMEM, GMR_ENOTSUP (real has no virtual memory calls) */
int gmr__sleep_face_new(gmr_backend_t *real, gmr_backend_t **out);
/* The sleepable face under `be` (be itself, or a decorator over it), or NULL. */
gmr_backend_t *gmr__sleep_face_find(gmr_backend_t *be);

/* Copy what is mapped to host memory (offload) or not, then unmap it and
 * give its memory back, keeping every address; work queued on the device
 * is waited for first.  keep_host (with offload): the wake keeps the host
 * buffer for the next sleep (Note [Keeping the host buffer] in sleep.c).  A range asleep already is
 * left alone.  *released: the physical bytes given back.  On a failure before the first unmap
 * nothing changed; after it, the ranges keep their own states.
 * @return 0, or the device's error */
int gmr__sleep_face_sleep(gmr_backend_t *face, bool offload, bool keep_host, gmr_stream_t s,
                          uint64_t *released);
/* Map new memory at every asleep range and copy offloaded contents back on
 * s (synchronized before the return).  All or nothing: on failure every
 * range is asleep again, its contents kept.  *taken: the bytes mapped. */
int gmr__sleep_face_wake(gmr_backend_t *face, gmr_stream_t s, uint64_t *taken);

typedef struct gmr_sleep_figures_s {
  uint64_t mapped_bytes;    /* physical bytes behind the face's ranges now */
  uint64_t sleeping_bytes;  /* physical bytes given back by sleep, to map at wake */
  uint64_t offloaded_bytes; /* host bytes holding asleep contents */
  uint64_t ranges, sleeping_ranges;
  uint64_t sleeps, wakes;   /* completed, accumulated */
  uint64_t host_kept_bytes; /* the host buffer kept for the next sleep */
} gmr_sleep_figures_t;
void gmr__sleep_face_figures(gmr_backend_t *face, gmr_sleep_figures_t *out);
/* Walk the face's invariants (Note [Sleep invariants]); GMR_EINVAL and a
 * sentence on failure. */
int gmr__sleep_face_check(gmr_backend_t *face);

#endif /* GMR_SLEEP_H */
