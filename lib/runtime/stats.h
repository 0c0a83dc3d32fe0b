/* stats.h: the statistics shared by every policy (stats.c): the device-level
 * figures kept by the backend wrappers, the generic foreach and summary. */
#ifndef GMR_STATS_H
#define GMR_STATS_H

#include <stdio.h>

#include "backend/backend.h"
#include "gmr.h"

/* Fill the device-level fields of a gmr_stats_t from the backend counters:
 * reserved and segments (current and peak), device allocations and frees,
 * and free_cached_bytes = reserved - active. */
void gmr__stats_fill_device(gmr_backend_t *be, gmr_stats_t *st);
/* Call cb for every field of a gmr_stats_t, named as in the struct. */
int gmr__stats_foreach_common(const gmr_stats_t *st, gmr_stat_cb cb, void *ud);
/* The generic summary, for policies that have none of their own. */
int gmr__stats_print(const gmr_stats_t *st, const char *policy, const char *backend, FILE *out);

/* Add b's figures to a (a runtime and its private pools): sums, peaks
 * summed (an upper bound of the peak of the sum), the largest free block
 * the larger, the limit a's. */
void gmr__stats_add(gmr_stats_t *a, const gmr_stats_t *b);
/* 1 for a named statistic that is a setting, not a count (max_split_size):
 * not summed over pools. */
int gmr__stats_is_setting(const char *key);
/* Add b's accumulated counts (allocations, frees, device calls, OOMs,
 * retries) to a: what a closed pool leaves to its runtime. */
void gmr__stats_add_accumulated(gmr_stats_t *a, const gmr_stats_t *b);
/* 1 for a named statistic that accumulates over time (a count of events:
 * "*.allocated", "*.freed", "*.created", "*.released", "num_*", "ooms"), as
 * opposed to a current value, a peak or a setting. */
int gmr__stats_is_accumulated(const char *key);

#endif /* GMR_STATS_H */
