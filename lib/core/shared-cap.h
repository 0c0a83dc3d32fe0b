/* shared-cap.h: one memory cap shared by every process on a device, without
 * a daemon (lib/core/shared-cap.c; the design is in docs/shared-cap.md).
 *
 * Each process attaches to a mapped file per device, claims a slot there and
 * reserves device bytes through it before it asks the device for them
 * (see Note [Shared cap]).  The limit policy calls this from its capped
 * backend (counts: reserved), so only device reservations pass here, never
 * allocations served from a cache.  Every call is thread-safe; a handle may
 * be used by any number of threads at once.
 */
#ifndef GMR_SHARED_CAP_H
#define GMR_SHARED_CAP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

/* Note [Shared cap]
 *     committed = Σ over live slots of max(used_i, guaranteed_i) <= cap
 *     used_i <= quota_i  (0: no quota)
 * The check-and-add is one step under a robust process-shared mutex; a
 * process's liveness is an OFD lock on a byte of the file that the kernel
 * drops when the process dies, and the committed total is rebuilt from the
 * slots whenever a dead process is noticed.
 */
typedef struct gmr_scap_s gmr_scap_t;

typedef struct gmr_scap_opts_s {
  const char *path;      /* the file; NULL or "": the default for device_id */
  const char *device_id; /* GPU UUID ("GPU-..."), or the simulator's id; required */
  uint64_t cap;          /* bytes all processes may commit together; > 0 */
  uint64_t quota;        /* this process's hard quota; 0: none besides the cap */
  uint64_t guaranteed;   /* bytes no other process can take from this one */
  const char *label;     /* shown by gmr-top; NULL: none */
  double timeout_s;      /* longest wait for the file's lock; 0: 1 s */
} gmr_scap_opts_t;

/* Attach to (or create) the file and claim a slot.  GMR_ECONFIG when the
 * file disagrees (cap, version, layout, device) or the guaranteed bytes do
 * not fit; GMR_EBUSY when its lock stays held past the timeout; GMR_EIO for
 * a system error; GMR_ENOMEM when every slot is taken.  The text is in the
 * thread's last error. */
int gmr__scap_attach(const gmr_scap_opts_t *opts, gmr_scap_t **out);
/* Give the slot back and unmap (NULL: no-op). */
void gmr__scap_detach(gmr_scap_t *h);

/* Count n more bytes against the cap: 0, GMR_ENOMEM (the cap or the quota
 * would be passed; nothing changes), GMR_EBUSY (the lock stayed held past
 * the timeout), GMR_EIO. */
int gmr__scap_reserve(gmr_scap_t *h, uint64_t n);
/* Give n bytes back.  Never fails: when the lock cannot be had in time the
 * bytes are owed and given back at the next call that gets it. */
void gmr__scap_release(gmr_scap_t *h, uint64_t n);

/* Figures for stats and memory info, after a sweep (the shares of dead
 * processes are not counted); without the lock when it cannot be had. */
typedef struct gmr_scap_view_s {
  uint64_t cap, committed, used, quota, guaranteed;
  uint64_t room; /* what this process may still reserve: min(quota - used,
                    cap - committed + max(used, guaranteed) - used) */
} gmr_scap_view_t;
void gmr__scap_view(gmr_scap_t *h, gmr_scap_view_t *out);
const char *gmr__scap_path(const gmr_scap_t *h);

/* The default file of a device: /dev/shm/gmr-cap-<uid>-<device_id>. */
int gmr__scap_default_path(const char *device_id, char *buf, size_t len);

/* Look at the file's link count now (normally done at most every 50 ms on
 * the reservation path): if it was unlinked, move this process's slot to a
 * new file at the same path and log "domain split".  0 or an error code. */
int gmr__scap_check_link(gmr_scap_t *h);

/* Test hooks.  hold: take the file's lock and add n to this process's
 * `used` without updating `committed` (a half-done update), returning with
 * the lock held; unhold: repair and drop it. */
int gmr__scap_debug_hold(gmr_scap_t *h, uint64_t n);
void gmr__scap_debug_unhold(gmr_scap_t *h);
typedef struct gmr_scap_debug_s {
  uint64_t sweeps, repairs, timeouts, ops, freed; /* the file's counters */
  uint64_t held;                                  /* Σ used over live slots */
  int slot;                                       /* this process's slot, -1: none */
  bool created;                                   /* this handle made the file */
} gmr_scap_debug_t;
void gmr__scap_debug(gmr_scap_t *h, gmr_scap_debug_t *out);

#endif /* GMR_SHARED_CAP_H */
