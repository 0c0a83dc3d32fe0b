/* runtime.h: the runtime's internal accessors, for the library's own files
 * above it (replay, probe) and the tests. */
#ifndef GMR_RUNTIME_H
#define GMR_RUNTIME_H

#include <stdbool.h>

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
/* The memory history (observe/history.h), NULL while it is off: the
 * replayer names its allocations' call sites there (Note [History frames]). */
struct gmr_history_s *gmr__runtime_history(gmr_runtime_t *rt);
/* The device backend under the recording layer (probes that must leave no
 * trace in the runtime's history or statistics). */
gmr_backend_t *gmr__runtime_device_backend(gmr_runtime_t *rt);

/* Private pools (Note [Pools] in runtime.c; the public calls are pools.c's).
 * A pool is a child runtime of `rt`; these are its mechanics. */
int gmr__runtime_pool_new(gmr_runtime_t *rt, gmr_runtime_t **out);
gmr_runtime_t *gmr__runtime_pool_parent(gmr_runtime_t *pool);
uint64_t gmr__runtime_pool_id(const gmr_runtime_t *pool);
/* Add delta to the use count; the new count, or -1 (it was 0 already). */
int gmr__runtime_pool_uses(gmr_runtime_t *pool, int delta);
int gmr__runtime_pool_route(gmr_runtime_t *pool, gmr_stream_t s, bool on);
int gmr__runtime_pool_alloc(gmr_runtime_t *pool, size_t size, gmr_stream_t s, void **out_ptr);
gmr_runtime_t *gmr__runtime_pool_of(gmr_runtime_t *rt, const void *ptr, bool *in_parent);
int gmr__runtime_pool_foreach_live(gmr_runtime_t *pool, gmr_ptr_cb cb, void *ud);
int gmr__runtime_pool_trim(gmr_runtime_t *pool);
/* Tagged pools, regions, sleep and wake (Note [Tags] in runtime.c; the
 * public calls are sleep.c's).  gmr__runtime_tag: the pool of `tag` (NULL
 * when none and !create). */
int gmr__runtime_tag(gmr_runtime_t *rt, const char *tag, bool create, gmr_runtime_t **out);
int gmr__runtime_region_begin(gmr_runtime_t *rt, const char *tag);
int gmr__runtime_region_end(gmr_runtime_t *rt);
const char *gmr__runtime_region_current(gmr_runtime_t *rt);
int gmr__runtime_sleep(gmr_runtime_t *rt, const char *tag, int mode);
int gmr__runtime_wake(gmr_runtime_t *rt, const char *tag);
int gmr__runtime_tag_info(gmr_runtime_t *rt, const char *tag, gmr_tag_info_t *out);
/* The device gate (backend/gate.h), shared by the runtime and its pools. */
gmr_backend_t *gmr__runtime_gate(gmr_runtime_t *rt);
int gmr__runtime_history_observe(gmr_runtime_t *rt, gmr_history_cb cb, void *ud);
/* GMR_SNAPSHOT or GMR_TRACE is set for rt; write both now (at exit). */
bool gmr__runtime_has_outputs(gmr_runtime_t *rt);
void gmr__runtime_write_outputs(gmr_runtime_t *rt);
#endif /* GMR_RUNTIME_H */
