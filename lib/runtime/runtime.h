/* runtime.h: the runtime's internal accessors, for the library's own files
 * above it (replay, probe) and the tests. */
#ifndef GMR_RUNTIME_H
#define GMR_RUNTIME_H

#include "backend/backend.h"
#include "gmr.h"

typedef struct gmr_policy_s gmr_policy_t;

gmr_policy_t *gmr__runtime_policy(gmr_runtime_t *rt);
/* The longest probe sequence in the pointer map, in slots (1: every live
 * pointer sits in its home slot; 0: the map is empty).  For tests. */
size_t gmr__runtime_map_longest_probe(gmr_runtime_t *rt);
/* The pointer map's shard of ptr, of 1024.  For tests. */
size_t gmr__runtime_map_shard_of(const void *ptr);
/* The backend the policies were given (the recording layer over the device). */
gmr_backend_t *gmr__runtime_backend(gmr_runtime_t *rt);
/* The device backend under the recording layer (probes that must leave no
 * trace in the runtime's history or statistics). */
gmr_backend_t *gmr__runtime_device_backend(gmr_runtime_t *rt);
#endif /* GMR_RUNTIME_H */
