/* gate.h: the gate, a backend decorator that keeps the device calls of a
 * runtime legal during CUDA graph capture and holds the runtime under a
 * memory fraction (gmr_capture_begin, gmr_set_memory_fraction).
 *
 * The runtime builds device -> gate -> recording -> policies; each private
 * pool's policy stack gets a borrowed face of the same gate (one capture
 * depth, one fraction, one count of held bytes for the runtime and its
 * pools).  See Note [Calls during capture] in gate.c for what is deferred.
 *
 * Invariant: held == reserved + mapped + created pages - released -
 * unmapped - released pages, over every face, where a release deferred by a
 * capture counts as held until it is made; with a fraction f < 1,
 * held <= f x total after every call that succeeded.
 */
#ifndef GMR_GATE_H
#define GMR_GATE_H

#include "backend/backend.h"

/* Wrap `device` (owned by the result from now on, even on failure).
 * @return 0, GMR_ENOMEM */
int gmr__gate_new(gmr_backend_t *device, gmr_backend_t **out);
/* A private pool's face of `gate` (which must outlive it): every op goes to
 * the same device under the same capture and fraction, but releases of
 * address space wait until the face is destroyed (Note [A pool keeps its
 * addresses] in gate.c); destroying it leaves the gate and the device alone.
 * @return 0, GMR_ENOMEM */
int gmr__gate_borrow(gmr_backend_t *gate, gmr_backend_t **out);
/* The gate under `be` (be itself, or a decorator forwarding to it), or NULL. */
gmr_backend_t *gmr__gate_find(gmr_backend_t *be);

/* Is `be` (or the gate under it) a private pool's face (gmr__gate_borrow)? */
bool gmr__gate_keeps_space(gmr_backend_t *be);

/* A capture starts (calls nest).  @return 0 */
int gmr__gate_capture_begin(gmr_backend_t *gate);
/* One capture ends; the last end records the deferred events and makes the
 * deferred releases.  @return 0, GMR_EINVAL (no capture underway),
 * GMR_EDEVICE (a deferred call failed; the others were made) */
int gmr__gate_capture_end(gmr_backend_t *gate);
/* The capture depth (0: none underway). */
int gmr__gate_capture_depth(gmr_backend_t *gate);

/* Hold what every face reserves at `fraction` (0, 1] of the device's total
 * memory.  @return 0, GMR_EINVAL, or the device's mem_info error */
int gmr__gate_set_fraction(gmr_backend_t *gate, double fraction);
double gmr__gate_fraction(gmr_backend_t *gate);

#endif /* GMR_GATE_H */
