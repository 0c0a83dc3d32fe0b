/* history.h: the memory history of a runtime, PyTorch's trace ring buffer.
 *
 * When recording is on (gmr_history_enable, or GMR_HISTORY=N), every
 * allocation, free and device operation of the runtime is kept as one entry
 * of a bounded ring buffer, in the order it happened, with PyTorch's action
 * names (torch.cuda.memory._record_memory_history): alloc, free_requested,
 * free_completed, segment_alloc, segment_free, segment_map, segment_unmap,
 * oom and snapshot.  gmr_snapshot_write (snapshot.c) writes them out as the
 * snapshot's device_traces.
 *
 * See Note [Who records what], Note [History ring] and Note [History frames].
 */
#ifndef GMR_HISTORY_H
#define GMR_HISTORY_H

#include <pthread.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/internal.h"

/* Note [Who records what]
 *   runtime.c   alloc, free_requested, oom; free_completed right after
 *               free_requested unless the policy stack reports completions
 *               itself (gmr_policy_ops_t.reports_free_completed);
 *   recording.c segment_alloc / segment_free (reserve / release) and
 *               segment_map / segment_unmap (map / unmap), with the stream
 *               the policy passed to the backend call;
 *   policies    free_completed through gmr__history_free_completed (recording.h) when a
 *               block held for stream work becomes reusable;
 *   snapshot.c  snapshot (size: active bytes) each time a snapshot is written.
 */
typedef enum gmr_hist_action_e {
  GMR_HIST_ALLOC = 0,
  GMR_HIST_FREE_REQUESTED,
  GMR_HIST_FREE_COMPLETED,
  GMR_HIST_SEGMENT_ALLOC,
  GMR_HIST_SEGMENT_FREE,
  GMR_HIST_SEGMENT_MAP,
  GMR_HIST_SEGMENT_UNMAP,
  GMR_HIST_OOM,
  GMR_HIST_SNAPSHOT,
  GMR_HIST_N_ACTIONS
} gmr_hist_action_t;

/* One trace entry (PyTorch's TraceEntry; its frames: Note [History frames]). */
typedef struct gmr_hist_entry_s {
  uint64_t addr;    /* device address; oom: the device's free bytes; snapshot: 0 */
  uint64_t size;    /* bytes: requested (alloc, free_*), range size (segment_*),
                       request (oom), active bytes (snapshot) */
  uint64_t stream;  /* the stream handle as an integer */
  uint64_t time_us; /* microseconds since the epoch */
  uint8_t action;   /* gmr_hist_action_t */
  uint32_t frame;   /* the call site, frames[frame - 1] of the history; 0: none */
} gmr_hist_entry_t;

/* Note [History frames]
 * An entry may name the call site that caused it, as one frame of PyTorch's
 * ({"name", "filename", "line"}).  A caller that knows its allocations'
 * sites (the replayer: a trace's Site column, a snapshot's frames) adds each
 * site once (gmr__history_add_frame, ids 1, 2, ...) and names it on its own
 * thread around the call (gmr__history_use_frame): every entry that thread
 * records into this history meanwhile carries it (the alloc or the oom, and
 * the segment_* entries the policy made for it).  The snapshot writer gives
 * free_requested and free_completed their block's alloc frame, and blocks
 * and segments theirs (snapshot.c).  Frames are kept until the history is
 * freed (clear and resize keep them), so an id stays valid.
 */
typedef struct gmr_hist_frame_s {
  char *filename;
  char *name;
  uint32_t line;
} gmr_hist_frame_t;

/* Note [History ring]
 * Under `lock`:
 *   len <= cap <= max;  len < max  =>  the entries are ring[0 .. len) in order
 *   len == max          =>  oldest at ring[head], newest at ring[head - 1]
 *   recorded - dropped = len
 * Synchronization: `lock` guards every field; it is a leaf lock except in the
 * recording layer's release / unmap (recording.c), which hold it across the
 * device call so that no other thread can record a reuse of the address
 * before its release.
 */
typedef struct gmr_history_s gmr_history_t;
struct gmr_history_s {
  pthread_mutex_t lock;
  gmr_hist_entry_t *ring;  /* cap entries */
  size_t cap;              /* entries allocated; grows by doubling up to max */
  size_t max;              /* entries kept at most (max_entries) */
  size_t len;              /* entries held */
  size_t head;             /* len == max: index of the oldest entry */
  uint64_t recorded;       /* entries ever recorded, accumulated */
  uint64_t dropped;        /* entries overwritten by newer ones, accumulated */
  gmr_backend_t *clock;    /* the runtime's backend, whose clock times entries */
  int64_t epoch_offset_ns; /* epoch ns - backend clock ns, taken at creation */
  gmr_history_cb observer; /* called with each entry as it is recorded (lock held); NULL: none */
  void *observer_ud;
  gmr_hist_frame_t *frames; /* n_frames call sites (Note [History frames]) */
  size_t n_frames, cap_frames;
};

/* Call cb (NULL: none) with every entry recorded from now on. */
void gmr__history_set_observer(gmr_history_t *h, gmr_history_cb cb, void *ud);

/* PyTorch's name of an action ("alloc", "segment_map"...). */
const char *gmr__history_action_name(int action);

int gmr__history_new(gmr_backend_t *clock, size_t max, gmr_history_t **out);
void gmr__history_free(gmr_history_t *h);
/* Change the bound (max > 0), keeping the newest entries.  @return 0, GMR_ENOMEM */
int gmr__history_resize(gmr_history_t *h, size_t max);
/* Drop every entry (the bound stays). */
void gmr__history_clear(gmr_history_t *h);
/* Append one entry (takes the lock). */
void gmr__history_record(gmr_history_t *h, int action, uint64_t addr, uint64_t size,
                         gmr_stream_t s);
/* The same, for a caller that holds h->lock. */
void gmr__history_record_locked(gmr_history_t *h, int action, uint64_t addr, uint64_t size,
                                gmr_stream_t s);
/* Copy the entries, oldest first, into a new array (gmr__free it).
 * @return 0, GMR_ENOMEM */
int gmr__history_copy(gmr_history_t *h, gmr_hist_entry_t **out, size_t *out_len);

/* Note [History frames]: add a call site (copied); its id in *out.
 * @return 0, GMR_ENOMEM */
int gmr__history_add_frame(gmr_history_t *h, const char *filename, uint32_t line, const char *name,
                           uint32_t *out);
/* The entries the calling thread records into h from now on carry frame
 * `id` (0: none, as before the first call). */
void gmr__history_use_frame(gmr_history_t *h, uint32_t id);
/* Copy the frames into a new array (gmr__free it; the texts stay the
 * history's, valid until it is freed).  @return 0, GMR_ENOMEM */
int gmr__history_copy_frames(gmr_history_t *h, gmr_hist_frame_t **out, size_t *out_len);

#endif /* GMR_HISTORY_H */
