/* trace.h: recording a runtime's allocations and frees (GMR_TRACE=path) in
 * RMM's replay-log layout: Thread,Time,Action,Pointer,Size,Stream. */
#ifndef GMR_TRACE_H
#define GMR_TRACE_H

#include "gmr.h"

typedef struct gmr_trace_s gmr_trace_t;

/* Open `path` for writing (a second runtime in the same process that names
 * the same path writes to "path.1", "path.2", ...).  @return 0, GMR_ENOMEM,
 * GMR_EIO (the file cannot be opened or written) */
int gmr__trace_open(const char *path, gmr_trace_t **out);
/* Append one event; `action` is allocate, free, record_stream or empty_cache.
 * @return 0, GMR_EIO (this or an earlier write failed: the thread's last
 * error says why; the event is lost) */
int gmr__trace_event(gmr_trace_t *t, const char *action, const void *ptr, size_t size,
                     gmr_stream_t s);
/* Write out the buffered lines.  @return 0, GMR_EIO (a write failed, now or
 * before; the thread's last error says why) */
int gmr__trace_flush(gmr_trace_t *t);
/* Flush and close (NULL: nothing).  @return as gmr__trace_flush */
int gmr__trace_close(gmr_trace_t *t);

#endif /* GMR_TRACE_H */
