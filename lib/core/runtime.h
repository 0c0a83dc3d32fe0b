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
gmr_backend_t *gmr__runtime_backend(gmr_runtime_t *rt);
/* The memory history while the runtime records one, else NULL (history.h). */
gmr_history_t *gmr__runtime_history(gmr_runtime_t *rt);
/* For snapshots: under the policy lock, add a `snapshot` entry to the history
 * and copy it (*out_entries: NULL and *out_len 0 when not recording; gmr__free
 * it), then walk the segments (*out_walk_err: the walk's result, GMR_ENOTSUP
 * when the policy keeps no segments).  @return 0, GMR_ENOMEM */
typedef struct gmr_hist_entry_s gmr_hist_entry_t;
int gmr__runtime_capture(gmr_runtime_t *rt, gmr_walk_cb cb, void *ud, int *out_walk_err,
                         gmr_hist_entry_t **out_entries, size_t *out_len);
/* The device ordinal the runtime was created for. */
int gmr__runtime_device(gmr_runtime_t *rt);

#endif /* GMR_RUNTIME_H */
