/* pools.c: the public calls of private pools, CUDA graph capture, segments,
 * the memory fraction and the history observer (include/gmr.h, docs/pools.md).
 *
 * Each call checks its arguments and goes to the runtime's mechanics
 * (runtime.h: a pool is a child runtime, see Note [Pools] in runtime.c) or to
 * the device gate (backend/gate.h: Note [Calls during capture] and
 * Note [The fraction]).  Nothing here holds a lock of its own.
 */
#include <inttypes.h>
#include <string.h>

#include "backend/gate.h"
#include "core/internal.h"
#include "policy.h"
#include "runtime/runtime.h"

/* A gmr_pool_t is its child runtime. */
static inline gmr_runtime_t *rt_of(const gmr_pool_t *pool) {
  return (gmr_runtime_t *)pool;
}

static int null_pool(const char *fn) {
  return gmr__error_set(GMR_EINVAL, "%s: the pool is NULL", fn);
}

int gmr_pool_create(gmr_runtime_t *rt, gmr_pool_t **out) {
  if (rt == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_pool_create: %s is NULL",
                          rt == NULL ? "the runtime" : "the out-parameter");
  gmr_runtime_t *child = NULL;
  int err = gmr__runtime_pool_new(rt, &child);
  if (err != 0) return err;
  *out = (gmr_pool_t *)child;
  return 0;
}

uint64_t gmr_pool_id(const gmr_pool_t *pool) {
  return pool != NULL ? gmr__runtime_pool_id(rt_of(pool)) : 0;
}

int gmr_pool_retain(gmr_pool_t *pool) {
  if (pool == NULL) return null_pool("gmr_pool_retain");
  if (gmr__runtime_pool_uses(rt_of(pool), 0) == 0)
    return gmr__error_set(GMR_EINVAL, "gmr_pool_retain: pool %" PRIu64 " was released",
                          gmr_pool_id(pool));
  (void)gmr__runtime_pool_uses(rt_of(pool), 1);
  return 0;
}

int gmr_pool_release(gmr_pool_t *pool) {
  if (pool == NULL) return null_pool("gmr_pool_release");
  if (gmr__runtime_pool_uses(rt_of(pool), -1) < 0)
    return gmr__error_set(GMR_EINVAL, "gmr_pool_release: pool %" PRIu64 " was released already",
                          gmr_pool_id(pool));
  return 0;
}

int gmr_pool_use_count(const gmr_pool_t *pool) {
  return pool != NULL ? gmr__runtime_pool_uses(rt_of(pool), 0) : 0;
}

int gmr_pool_begin(gmr_pool_t *pool, gmr_stream_t s) {
  if (pool == NULL) return null_pool("gmr_pool_begin");
  return gmr__runtime_pool_route(rt_of(pool), s, true);
}

int gmr_pool_end(gmr_pool_t *pool, gmr_stream_t s) {
  if (pool == NULL) return null_pool("gmr_pool_end");
  return gmr__runtime_pool_route(rt_of(pool), s, false);
}

int gmr_alloc_in(gmr_runtime_t *rt, gmr_pool_t *pool, size_t size, gmr_stream_t s, void **out_ptr) {
  if (pool == NULL) return gmr_alloc(rt, size, s, out_ptr);
  if (rt == NULL || gmr__runtime_pool_parent(rt_of(pool)) != rt)
    return gmr__error_set(GMR_EINVAL, "gmr_alloc_in: pool %" PRIu64 " is not a pool of %s",
                          gmr_pool_id(pool), rt == NULL ? "a NULL runtime" : "this runtime");
  if (out_ptr == NULL) return gmr__error_set(GMR_EINVAL, "gmr_alloc_in: the out-parameter is NULL");
  return gmr__runtime_pool_alloc(rt_of(pool), size, s, out_ptr);
}

int gmr_pool_of(gmr_runtime_t *rt, const void *ptr, gmr_pool_t **out) {
  if (rt == NULL || ptr == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_pool_of: NULL argument");
  bool in_parent = false;
  gmr_runtime_t *child = gmr__runtime_pool_of(rt, ptr, &in_parent);
  if (!in_parent && child == NULL)
    return gmr__error_set(GMR_EBADPTR, "gmr_pool_of: %p is not a live allocation of this runtime",
                          ptr);
  *out = (gmr_pool_t *)child;
  return 0;
}

int gmr_pool_empty_cache(gmr_pool_t *pool) {
  if (pool == NULL) return null_pool("gmr_pool_empty_cache");
  return gmr__runtime_pool_trim(rt_of(pool));
}

int gmr_pool_stats(gmr_pool_t *pool, gmr_stats_t *out) {
  if (pool == NULL) return null_pool("gmr_pool_stats");
  return gmr_stats(rt_of(pool), out);
}

int gmr_pool_foreach_live(gmr_pool_t *pool, gmr_ptr_cb cb, void *ud) {
  if (pool == NULL || cb == NULL) return gmr__error_set(GMR_EINVAL, "gmr_pool_foreach_live: NULL");
  return gmr__runtime_pool_foreach_live(rt_of(pool), cb, ud);
}

/* ---- capture ------------------------------------------------------------------ */

int gmr_capture_begin(gmr_runtime_t *rt) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_capture_begin: the runtime is NULL");
  return gmr__gate_capture_begin(gmr__runtime_gate(rt));
}

int gmr_capture_end(gmr_runtime_t *rt) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_capture_end: the runtime is NULL");
  return gmr__gate_capture_end(gmr__runtime_gate(rt));
}

/* ---- segments and the fraction ------------------------------------------------------ */

typedef struct segment_find_s {
  uintptr_t p;
  gmr_segment_info_t *out;
  bool found;
} segment_find_t;

static int segment_find_cb(const gmr_walk_entry_t *e, void *ud) {
  segment_find_t *f = ud;
  if (!e->is_segment || f->p < e->address || f->p - e->address >= e->size) return 0;
  *f->out = (gmr_segment_info_t){.base = e->address,
                                 .size = e->size,
                                 .pool_id = e->pool_id,
                                 .flags = e->is_expandable ? GMR_SEGMENT_EXPANDABLE : 0,
                                 .stream = e->stream};
  f->found = true;
  return 1;
}

int gmr_segment_of(gmr_runtime_t *rt, const void *ptr, gmr_segment_info_t *out) {
  if (rt == NULL || ptr == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_segment_of: NULL argument");
  gmr_segment_info_t info;
  segment_find_t f = {(uintptr_t)ptr, &info, false};
  int err = gmr_walk(rt, segment_find_cb, &f);
  if (err != 0) return err;
  if (!f.found)
    return gmr__error_set(GMR_EBADPTR, "gmr_segment_of: %p lies in no segment of this runtime",
                          ptr);
  *out = info;
  return 0;
}

/* The gate holds the runtime and its pools together under the fraction; a
 * policy that enforces one itself (caching, as PyTorch's allocator) is told
 * too, for its own accounting and its OOM text. */
int gmr_set_memory_fraction(gmr_runtime_t *rt, double fraction) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_set_memory_fraction: the runtime is NULL");
  int err = gmr__gate_set_fraction(gmr__runtime_gate(rt), fraction);
  if (err == 0) gmr__policy_set_fraction(gmr__runtime_policy(rt), fraction);
  return err;
}

double gmr_memory_fraction(gmr_runtime_t *rt) {
  return rt != NULL ? gmr__gate_fraction(gmr__runtime_gate(rt)) : 1.0;
}

int gmr_history_observe(gmr_runtime_t *rt, gmr_history_cb cb, void *ud) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_history_observe: the runtime is NULL");
  return gmr__runtime_history_observe(rt, cb, ud);
}
