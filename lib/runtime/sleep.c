/* sleep.c: the public calls of tags, regions, sleep and wake (include/gmr.h,
 * docs/sleep-wake.md).
 *
 * Each call checks its arguments and goes to the runtime's mechanics
 * (runtime.h: a tag is a private pool whose device calls go through a
 * sleepable face, Note [Tags] in runtime.c).
 */
#include <string.h>

#include "core/internal.h"
#include "runtime/runtime.h"

static int tag_bad(const char *fn, const char *tag) {
  if (tag == NULL) return gmr__error_set(GMR_EINVAL, "%s: the tag is NULL", fn);
  size_t n = strlen(tag);
  if (n == 0 || n > GMR_TAG_MAX)
    return gmr__error_set(GMR_EINVAL, "%s: a tag has 1 to %d bytes, not %zu", fn, GMR_TAG_MAX, n);
  return 0;
}

static int rt_null(const char *fn) {
  return gmr__error_set(GMR_EINVAL, "%s: the runtime is NULL", fn);
}

int gmr_region_begin(gmr_runtime_t *rt, const char *tag) {
  if (rt == NULL) return rt_null("gmr_region_begin");
  int err = tag_bad("gmr_region_begin", tag);
  return err != 0 ? err : gmr__runtime_region_begin(rt, tag);
}

int gmr_region_end(gmr_runtime_t *rt) {
  if (rt == NULL) return rt_null("gmr_region_end");
  return gmr__runtime_region_end(rt);
}

const char *gmr_region_current(gmr_runtime_t *rt) {
  return rt != NULL ? gmr__runtime_region_current(rt) : NULL;
}

int gmr_sleep(gmr_runtime_t *rt, const char *tag, int mode) {
  if (rt == NULL) return rt_null("gmr_sleep");
  int err = tag_bad("gmr_sleep", tag);
  if (err != 0) return err;
  if (mode != GMR_SLEEP_OFFLOAD && mode != (GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST) &&
      mode != GMR_SLEEP_DISCARD)
    return gmr__error_set(GMR_EINVAL,
                          "gmr_sleep: mode %d: expected GMR_SLEEP_OFFLOAD (1), "
                          "GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST (5) or GMR_SLEEP_DISCARD (2)",
                          mode);
  return gmr__runtime_sleep(rt, tag, mode);
}

int gmr_wake(gmr_runtime_t *rt, const char *tag) {
  if (rt == NULL) return rt_null("gmr_wake");
  int err = tag_bad("gmr_wake", tag);
  return err != 0 ? err : gmr__runtime_wake(rt, tag);
}

int gmr_tag_info(gmr_runtime_t *rt, const char *tag, gmr_tag_info_t *out) {
  if (rt == NULL) return rt_null("gmr_tag_info");
  int err = tag_bad("gmr_tag_info", tag);
  if (err != 0) return err;
  if (out == NULL) return gmr__error_set(GMR_EINVAL, "gmr_tag_info: the out-parameter is NULL");
  return gmr__runtime_tag_info(rt, tag, out);
}

int gmr_tag_pool(gmr_runtime_t *rt, const char *tag, gmr_pool_t **out) {
  if (rt == NULL) return rt_null("gmr_tag_pool");
  int err = tag_bad("gmr_tag_pool", tag);
  if (err != 0) return err;
  if (out == NULL) return gmr__error_set(GMR_EINVAL, "gmr_tag_pool: the out-parameter is NULL");
  gmr_runtime_t *c = NULL;
  err = gmr__runtime_tag(rt, tag, true, &c);
  if (err == 0) *out = (gmr_pool_t *)c;
  return err;
}
