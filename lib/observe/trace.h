/* trace.h: recording a runtime's allocations and frees (GMR_TRACE=path) in
 * RMM's replay-log layout: Thread,Time,Action,Pointer,Size,Stream. */
#ifndef GMR_TRACE_H
#define GMR_TRACE_H

#include "gmr.h"

typedef struct gmr_trace_s gmr_trace_t;

/* Open `path` for writing (a second runtime in the same process that names
 * the same path writes to "path.1", "path.2", ...). */
int gmr__trace_open(const char *path, gmr_trace_t **out);
/* Append one event; `action` is allocate, free, record_stream or empty_cache. */
void gmr__trace_event(gmr_trace_t *t, const char *action, const void *ptr, size_t size,
                      gmr_stream_t s);
void gmr__trace_close(gmr_trace_t *t);

#endif /* GMR_TRACE_H */
