/* snapshot.h: the snapshot writer reads a runtime through this interface.
 *
 * The writer (snapshot.c) knows nothing of the runtime: gmr_snapshot_write
 * (runtime.c) hands it a source, whose capture call takes the runtime's
 * state at one instant, and the writer turns that into PyTorch's pickle.
 * So the runtime calls the writer, and the writer never calls the runtime.
 */
#ifndef GMR_SNAPSHOT_H
#define GMR_SNAPSHOT_H

#include <stdint.h>
#include <stdio.h>

#include "gmr.h"
#include "observe/history.h"

/* What one capture gives: the history's entries, oldest first (entries:
 * NULL and n_entries 0 when not recording; gmr__free it), its frames (the
 * same; the texts stay the history's), the history's bound and drop count
 * (0 when not recording), and the result of the segment walk (GMR_ENOTSUP
 * when the policy keeps no segments). */
typedef struct gmr_snapshot_capture_s {
  gmr_hist_entry_t *entries;
  size_t n_entries;
  gmr_hist_frame_t *frames;
  size_t n_frames;
  uint64_t history_max;
  uint64_t history_dropped;
  int walk_err;
} gmr_snapshot_capture_t;

typedef struct gmr_snapshot_source_s {
  void *ctx;           /* the runtime */
  int device;          /* its device ordinal */
  const char *policy;  /* gmr_runtime_policy */
  const char *backend; /* gmr_runtime_backend */
  /* At one instant (under the runtime's policy lock): add a `snapshot` entry
   * to the history (size: active bytes), copy the history, and walk the
   * segments with cb.  @return 0, GMR_ENOMEM */
  int (*capture)(void *ctx, gmr_walk_cb cb, void *ud, gmr_snapshot_capture_t *out);
} gmr_snapshot_source_t;

/* Write the snapshot of `src` to `out` (the error is not tagged: the caller
 * tags it with its runtime).  @return 0, GMR_ENOMEM, GMR_EIO, a walk error */
int gmr__snapshot_write(const gmr_snapshot_source_t *src, FILE *out);

#endif /* GMR_SNAPSHOT_H */
