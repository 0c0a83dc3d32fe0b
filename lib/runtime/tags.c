/* tags.c: tagged pools that sleep and wake (docs/sleep-wake.md).
 *
 * A tag is a private pool over a sleepable face of the backend (Note [Tags]):
 * gmr_sleep and gmr_wake (trim, unmap or map, charge the caps), the frees
 * kept while asleep made after the wake, and gmr_tag_info.  Making and
 * finding a tag, the thread's region stack and the kept frees stay in
 * runtime.c, whose allocation and free paths read them, so that no call
 * goes from runtime.c to here; the tags' statistics and checks are in
 * runtime-stats.c.
 */

#include "runtime/runtime-internal.h"

/* Note [Tags]
 * A tag is a private pool (Note [Pools]) whose device calls go through a
 * sleepable face (backend/sleep.h) under its recording layer, created by the
 * first gmr_region_begin(rt, tag) and kept, with use count 1, until the
 * runtime goes.  A region is a thread-local stack of (runtime, tag pool):
 * gmr_alloc on rt, on that thread, goes to the innermost region's pool,
 * after the pool routes of gmr_pool_begin (a CUDA graph capture names its
 * own pool).  Sleep, with the pool's policy quiesced: its cache is trimmed
 * (cached blocks are released as usual), the face unmaps everything else,
 * and what it gave back leaves the pool's caps (gmr__policy_sleep_charge:
 * the limit's cap and the shared cap count it as free).  While asleep an
 * allocation in the tag is refused, a free is kept and made after the
 * wake (a policy may give memory back at a free, and the memory is not
 * there), and the pool's cache is not trimmed.  Wake empties the other
 * caches, refuses when the device (under the fraction) has less free than
 * the tag needs, charges the caps again (a refusal is the cap's sentence),
 * then maps; nothing fails inside a driver call for lack of memory unless
 * another process took it meanwhile, and then the wake is undone whole.  A
 * pool freed while asleep is counted back in first (forced), so that its
 * policy's releases, which the face answers with no device call, balance.
 * Sleeping twice, or waking an awake tag, does nothing and returns 0.
 */

/* The tag pool named `tag`, or NULL (gmr__runtime_tag, which looks only). */
static gmr_runtime_t *tag_find(gmr_runtime_t *rt, const char *tag) {
  gmr_runtime_t *c = NULL;
  (void)gmr__runtime_tag(rt, tag, false, &c);
  return c;
}

/* The frees kept while c slept, made now that it is awake. */
static void frees_replay(gmr_runtime_t *rt, gmr_runtime_t *c) {
  gmr__lock(&rt->lock);
  void **v = c->deferred;
  size_t n = c->ndeferred;
  c->deferred = NULL;
  c->ndeferred = c->capdeferred = 0;
  gmr__unlock(&rt->lock);
  for (size_t i = 0; i < n; ++i)
    (void)gmr_free(c, v[i]);
  gmr__free(v);
}

static int tag_missing(gmr_runtime_t *rt, const char *fn, const char *tag) {
  return fail(rt, gmr__error_set(GMR_EINVAL,
                                 "%s: this runtime has no tag '%s' (allocate inside "
                                 "gmr_region_begin(rt, \"%s\") first)",
                                 fn, tag, tag));
}

int gmr__runtime_sleep(gmr_runtime_t *rt, const char *tag, int mode) {
  gmr_runtime_t *c = tag_find(rt, tag);
  if (c == NULL) return tag_missing(rt, "gmr_sleep", tag);
  if (gmr__gate_capture_depth(rt->gate) > 0)
    return fail(rt, gmr__error_set(GMR_EBUSY,
                                   "gmr_sleep: tag '%s' cannot sleep while a CUDA graph is "
                                   "being captured",
                                   tag));
  bool keep = (mode & GMR_SLEEP_OFFLOAD) != 0, keep_host = (mode & GMR_SLEEP_KEEP_HOST) != 0;
  mode &= ~GMR_SLEEP_KEEP_HOST; /* the tag's mode: offload or discard */
  if (keep && !gmr__backend_has_copies(c->sleep_face))
    return fail(rt, gmr__error_set(GMR_ENOTSUP,
                                   "gmr_sleep: the %s backend cannot copy device memory to the "
                                   "host, so tag '%s' can sleep only with GMR_SLEEP_DISCARD",
                                   c->sleep_face->ops->name, tag));
  gmr__lock(&rt->sleep_lock);
  if (atomic_load(&c->asleep)) { /* asleep already: nothing to do */
    gmr__unlock(&rt->sleep_lock);
    return 0;
  }
  uint64_t released = 0;
  gmr__policy_quiesce(c->policy);
  int err = gmr__policy_trim_locked(c->policy); /* cached blocks are simply released */
  if (err == 0) err = gmr__sleep_face_sleep(c->sleep_face, keep, keep_host, NULL, &released);
  if (released > 0) {
    (void)gmr__policy_sleep_charge(c->policy, -(int64_t)released, true);
    atomic_store(&c->asleep, 1); /* even after a failure part-way: wake maps the rest */
    c->sleep_mode = mode;
  }
  if (err == 0) {
    atomic_store(&c->asleep, 1);
    c->sleep_mode = mode;
  }
  gmr__policy_resume(c->policy);
  gmr__unlock(&rt->sleep_lock);
  if (err != 0)
    return fail(rt, gmr__error_set(err, "gmr_sleep: tag '%s': %s", tag, gmr__error_last()));
  return 0;
}

/* Empty every cache but the sleeping tags' (Note [Tags]). */
static void room_make(gmr_runtime_t *rt) {
  (void)gmr__policy_trim(rt->policy);
  (void)gmr__runtime_pools_trim(rt, NULL);
}

int gmr__runtime_wake(gmr_runtime_t *rt, const char *tag) {
  gmr_runtime_t *c = tag_find(rt, tag);
  if (c == NULL) return tag_missing(rt, "gmr_wake", tag);
  if (gmr__gate_capture_depth(rt->gate) > 0)
    return fail(rt, gmr__error_set(GMR_EBUSY,
                                   "gmr_wake: tag '%s' cannot wake while a CUDA graph is being "
                                   "captured",
                                   tag));
  gmr__lock(&rt->sleep_lock);
  if (!atomic_load(&c->asleep)) { /* awake already: nothing to do */
    gmr__unlock(&rt->sleep_lock);
    return 0;
  }
  gmr_sleep_figures_t fig;
  gmr__sleep_face_figures(c->sleep_face, &fig);
  uint64_t need = fig.sleeping_bytes;
  room_make(rt);
  size_t free_b = 0, total = 0;
  int err = gmr__backend_mem_info(c->backend, &free_b, &total);
  if (err == 0 && free_b < need) {
    char n[32], f[32];
    gmr__format_size(need, n, sizeof n);
    gmr__format_size(free_b, f, sizeof f);
    err = gmr__error_set(GMR_ENOMEM,
                         "gmr_wake: tag '%s' needs %s (%llu bytes) of device memory and %s "
                         "(%llu bytes) are free after emptying the caches; nothing was mapped "
                         "and the tag sleeps on (free memory, or put another tag to sleep, "
                         "then wake it again)",
                         tag, n, (unsigned long long)need, f, (unsigned long long)free_b);
  }
  gmr__policy_quiesce(c->policy);
  if (err == 0 && need > 0) err = gmr__policy_sleep_charge(c->policy, (int64_t)need, false);
  uint64_t taken = 0;
  if (err == 0) {
    err = gmr__sleep_face_wake(c->sleep_face, NULL, &taken);
    if (err != 0 && need > 0) (void)gmr__policy_sleep_charge(c->policy, -(int64_t)need, true);
  }
  gmr_assert_internal(err != 0 || taken == need);
  if (err == 0) atomic_store(&c->asleep, 0);
  gmr__policy_resume(c->policy);
  gmr__unlock(&rt->sleep_lock);
  if (err != 0) {
    if (strncmp(gmr__error_last(), "gmr_wake", 8) == 0) return fail(rt, err);
    return fail(rt, gmr__error_set(err, "gmr_wake: tag '%s': %s", tag, gmr__error_last()));
  }
  frees_replay(rt, c);
  return 0;
}

int gmr__runtime_tag_info(gmr_runtime_t *rt, const char *tag, gmr_tag_info_t *out) {
  gmr_runtime_t *c = tag_find(rt, tag);
  if (c == NULL) return tag_missing(rt, "gmr_tag_info", tag);
  gmr_sleep_figures_t fig;
  gmr__sleep_face_figures(c->sleep_face, &fig);
  gmr_tag_info_t t;
  memset(&t, 0, sizeof t);
  snprintf(t.tag, sizeof t.tag, "%s", c->tag);
  t.pool_id = c->pool_id;
  t.asleep = atomic_load(&c->asleep);
  t.mode = t.asleep ? c->sleep_mode : 0;
  t.mapped_bytes = fig.mapped_bytes;
  t.sleeping_bytes = fig.sleeping_bytes;
  t.offloaded_bytes = fig.offloaded_bytes;
  t.sleeps = fig.sleeps;
  t.wakes = fig.wakes;
  t.host_kept_bytes = fig.host_kept_bytes;
  *out = t;
  return 0;
}
