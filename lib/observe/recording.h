/* recording.h: the recording layer, a backend decorator that writes the
 * device's part of the memory history (history.h).
 *
 * The runtime puts one recording backend between its policies and its
 * device: every op is forwarded to the device backend, and while a history
 * is attached (gmr__recording_attach), reserve / release / map / unmap that
 * succeed add PyTorch's segment_alloc / segment_free / segment_map /
 * segment_unmap entries, with the stream the policy passed for the request.
 * The device backends know nothing of histories.
 *
 * See Note [Recording rules].
 */
#ifndef GMR_RECORDING_H
#define GMR_RECORDING_H

#include <stdatomic.h>

#include "backend/backend.h"
#include "observe/history.h"

/* Note [Recording rules]
 *   - the decorator has exactly the device's slots (a NULL slot of the device
 *     is a NULL slot of the decorator), its name, granularity and ordinal;
 *   - a release or unmap is recorded under the history lock held across the
 *     device call, so another thread cannot record a reuse of the range
 *     before its release;
 *   - with no history attached each device op pays one load and one
 *     predictable branch (no op of a cached allocation reaches the device).
 * Synchronization: `history` is an atomic pointer; the history a thread
 * loaded stays valid until the runtime is freed (runtime.c keeps it).
 */
typedef struct gmr_recording_s {
  gmr_backend_t base;             /* base.forwards_to == device */
  gmr_backend_ops_t ops;          /* the device's slots, each replaced by a forwarder */
  gmr_backend_t *device;          /* owned: destroyed with the decorator */
  gmr_history_t *_Atomic history; /* NULL: not recording */
} gmr_recording_t;

/* Wrap `device` (owned by the result from now on, even on failure).
 * @return 0, GMR_ENOMEM */
int gmr__recording_new(gmr_backend_t *device, gmr_backend_t **out);
/* The device under a recording backend. */
gmr_backend_t *gmr__recording_device(gmr_backend_t *rec);
/* Start (h != NULL) or stop (NULL) recording segment entries into h. */
void gmr__recording_attach(gmr_backend_t *rec, gmr_history_t *h);
/* The history attached to the recording layer under `be` (be itself, or a
 * backend forwarding to it), else NULL. */
gmr_history_t *gmr__recording_history(gmr_backend_t *be);
/* The recording layer itself (NULL: none), for a policy that keeps it so
 * that its frees look for a history with one load (the *_at forms). */
gmr_recording_t *gmr__recording_find(gmr_backend_t *be);
static inline gmr_history_t *gmr__recording_history_at(gmr_recording_t *rec) {
  return rec != NULL ? atomic_load_explicit(&rec->history, memory_order_acquire) : NULL;
}

/* A policy that holds freed blocks until the work of their streams completes
 * calls this when such a block becomes reusable (PyTorch's free_completed
 * trace entry), and sets `reports_free_completed` in its table; `requested`
 * is the block's requested size, `be` the backend the policy was given (the
 * _at form: the layer gmr__recording_find(be) gave, kept by the policy). */
static inline void gmr__history_free_completed_at(gmr_recording_t *rec, const void *ptr,
                                                  size_t requested, gmr_stream_t s) {
  gmr_history_t *h = gmr__recording_history_at(rec);
  if (GMR_UNLIKELY(h != NULL))
    gmr__history_record(h, GMR_HIST_FREE_COMPLETED, (uintptr_t)ptr, requested, s);
}
static inline void gmr__history_free_completed(gmr_backend_t *be, const void *ptr, size_t requested,
                                               gmr_stream_t s) {
  gmr__history_free_completed_at(gmr__recording_find(be), ptr, requested, s);
}

#endif /* GMR_RECORDING_H */
