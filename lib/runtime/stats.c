/* stats.c: the common statistics (gmr_stats_t): device-level figures from
 * the backend counters, enumeration by name, and the generic summary that
 * policies without a framework layout of their own print. */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "core/internal.h"
#include "runtime/stats.h"

void gmr__stats_fill_device(gmr_backend_t *be, gmr_stats_t *st) {
  st->reserved_bytes = atomic_load(&be->counters.reserved_bytes);
  st->peak_reserved_bytes = atomic_load(&be->counters.peak_reserved_bytes);
  st->segments = atomic_load(&be->counters.segments);
  st->peak_segments = atomic_load(&be->counters.peak_segments);
  st->device_allocs = atomic_load(&be->counters.device_allocs);
  st->device_frees = atomic_load(&be->counters.device_frees);
  st->free_cached_bytes =
      st->reserved_bytes > st->active_bytes ? st->reserved_bytes - st->active_bytes : 0;
}

/* One field per line, in the order of gmr_stats_t. */
// clang-format off
#define COMMON_FIELDS(X) \
  X(reserved_bytes) \
  X(peak_reserved_bytes) \
  X(allocated_bytes) \
  X(peak_allocated_bytes) \
  X(requested_bytes) \
  X(peak_requested_bytes) \
  X(active_bytes) \
  X(peak_active_bytes) \
  X(segments) \
  X(peak_segments) \
  X(allocations) \
  X(peak_allocations) \
  X(num_allocs) \
  X(num_frees) \
  X(device_allocs) \
  X(device_frees) \
  X(ooms) \
  X(alloc_retries) \
  X(largest_free_block) \
  X(free_cached_bytes) \
  X(limit_bytes)
// clang-format on

void gmr__stats_add(gmr_stats_t *a, const gmr_stats_t *b) {
  uint64_t largest =
      a->largest_free_block > b->largest_free_block ? a->largest_free_block : b->largest_free_block;
  uint64_t limit = a->limit_bytes;
#define ADD(f) a->f += b->f;
  COMMON_FIELDS(ADD)
#undef ADD
  a->largest_free_block = largest;
  a->limit_bytes = limit;
}

int gmr__stats_is_setting(const char *key) {
  return strstr(key, "max_split_size") != NULL;
}

void gmr__stats_add_accumulated(gmr_stats_t *a, const gmr_stats_t *b) {
  a->num_allocs += b->num_allocs;
  a->num_frees += b->num_frees;
  a->device_allocs += b->device_allocs;
  a->device_frees += b->device_frees;
  a->ooms += b->ooms;
  a->alloc_retries += b->alloc_retries;
}

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && memcmp(s + n - m, tail, m) == 0;
}

int gmr__stats_is_accumulated(const char *key) {
  return strncmp(key, "num_", 4) == 0 || strcmp(key, "ooms") == 0 || ends_with(key, ".allocated") ||
         ends_with(key, ".freed") || ends_with(key, ".created") || ends_with(key, ".released");
}

int gmr__stats_foreach_common(const gmr_stats_t *st, gmr_stat_cb cb, void *ud) {
#define EMIT(f)                                                                                    \
  if (cb(#f, (int64_t)st->f, ud) != 0) return 0;
  COMMON_FIELDS(EMIT)
#undef EMIT
  return 0;
}

int gmr__stats_print(const gmr_stats_t *st, const char *policy, const char *backend, FILE *out) {
  char a[32], b[32];
  fprintf(out, "gmr memory summary: policy %s on %s\n", policy, backend);
  fprintf(out, "  %-22s %16s %16s\n", "", "current", "peak");
#define ROW(label, cur, peak)                                                                      \
  gmr__format_size(cur, a, sizeof a);                                                              \
  gmr__format_size(peak, b, sizeof b);                                                             \
  fprintf(out, "  %-22s %16s %16s\n", label, a, b);
  ROW("reserved", st->reserved_bytes, st->peak_reserved_bytes)
  ROW("allocated", st->allocated_bytes, st->peak_allocated_bytes)
  ROW("requested", st->requested_bytes, st->peak_requested_bytes)
  ROW("active", st->active_bytes, st->peak_active_bytes)
#undef ROW
  fprintf(out, "  %-22s %16" PRIu64 " %16" PRIu64 "\n", "segments", st->segments,
          st->peak_segments);
  fprintf(out, "  %-22s %16" PRIu64 " %16" PRIu64 "\n", "allocations", st->allocations,
          st->peak_allocations);
  fprintf(out,
          "  allocs %" PRIu64 ", frees %" PRIu64 ", device allocs %" PRIu64
          ", device frees %" PRIu64 ", OOMs %" PRIu64 ", retries %" PRIu64 "\n",
          st->num_allocs, st->num_frees, st->device_allocs, st->device_frees, st->ooms,
          st->alloc_retries);
  if (st->limit_bytes) {
    gmr__format_size(st->limit_bytes, a, sizeof a);
    fprintf(out, "  limit %s\n", a);
  }
  return ferror(out) ? GMR_EIO : 0;
}
