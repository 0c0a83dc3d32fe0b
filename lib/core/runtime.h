/* runtime.h: internal entry points shared by runtime.c, stats.c and the tools
 * that link the library statically. */
#ifndef GMR_RUNTIME_H
#define GMR_RUNTIME_H

#include "backend/backend.h"
#include "gmr.h"

typedef struct gmr_policy_s gmr_policy_t;

/* Fill the device-level fields of a gmr_stats_t from the backend counters:
 * reserved and segments (current and peak), device allocations and frees,
 * and free_cached_bytes = reserved - active. */
void gmr__stats_fill_device(gmr_backend_t *be, gmr_stats_t *st);
/* Call cb for every field of a gmr_stats_t, named as in the struct. */
int gmr__stats_foreach_common(const gmr_stats_t *st, gmr_stat_cb cb, void *ud);
/* The generic summary, for policies that have none of their own. */
int gmr__stats_print(const gmr_stats_t *st, const char *policy, const char *backend, FILE *out);

gmr_policy_t *gmr__runtime_policy(gmr_runtime_t *rt);
/* The longest probe sequence in the pointer map, in slots (1: every live
 * pointer sits in its home slot; 0: the map is empty).  For tests. */
size_t gmr__runtime_map_longest_probe(gmr_runtime_t *rt);
/* The backend the policies were given (the recording layer over the device). */
gmr_backend_t *gmr__runtime_backend(gmr_runtime_t *rt);
/* The device backend under the recording layer (probes that must leave no
 * trace in the runtime's history or statistics). */
gmr_backend_t *gmr__runtime_device_backend(gmr_runtime_t *rt);
#endif /* GMR_RUNTIME_H */
