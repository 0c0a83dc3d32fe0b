/* runtime-stats.c: the runtime's statistics and introspection.
 *
 * gmr_stats and its resets, gmr_stats_foreach and gmr_stat_get, gmr_summary,
 * gmr_walk, gmr_snapshot_write and gmr_check: each asks the policy stack,
 * then adds the private pools, what closed pools counted (Note [Retired
 * pools]) and the tags' figures (Note [Tags]).  Out of runtime.c, which keeps
 * the hot paths; none of this is one, and nothing here calls runtime.c.
 */

#include "runtime/runtime-internal.h"

static void retired_reset(gmr_runtime_t *rt); /* Note [Retired pools] */
/* Tagged pools (Note [Tags]): gmr_check's and gmr_stats_foreach's share. */
static int sleep_check(gmr_runtime_t *c);
static int stat_emit_tags(gmr_runtime_t *rt, gmr_stat_cb cb, void *ud);

/* ---- statistics and introspection ------------------------------------------- */

int gmr_stats(gmr_runtime_t *rt, gmr_stats_t *out) {
  if (rt == NULL || out == NULL) return gmr__error_set(GMR_EINVAL, "gmr_stats: NULL argument");
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  gmr__policy_quiesce(rt->policy); /* the device's figures of the policy's moment */
  gmr__policy_stats_locked(rt->policy, &st);
  gmr__stats_fill_device(rt->backend, &st);
  gmr__policy_resume(rt->policy);
  if (has_pools(rt)) {
    gmr__lock(&rt->lock);
    for (gmr_runtime_t *c = rt->children; c != NULL; c = c->next_child) {
      gmr_stats_t cs;
      gmr_stats(c, &cs);
      gmr__stats_add(&st, &cs);
    }
    gmr__unlock(&rt->lock);
  }
  if (atomic_load(&rt->retired_any)) { /* Note [Retired pools] */
    gmr__lock(&rt->lock);
    gmr__stats_add_accumulated(&st, &rt->retired);
    gmr__unlock(&rt->lock);
  }
  *out = st;
  return 0;
}

void gmr_stats_reset_peak(gmr_runtime_t *rt) {
  if (rt == NULL) return;
  gmr__policy_quiesce(rt->policy); /* the device's peak with the policy's */
  gmr__policy_reset_peak_locked(rt->policy);
  gmr__backend_counters_reset_peak(rt->backend);
  gmr__policy_resume(rt->policy);
  if (!has_pools(rt)) return;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL; c = c->next_child)
    gmr_stats_reset_peak(c);
  gmr__unlock(&rt->lock);
}

void gmr_stats_reset_accumulated(gmr_runtime_t *rt) {
  if (rt == NULL) return;
  gmr__policy_quiesce(rt->policy);
  gmr__policy_reset_accumulated_locked(rt->policy);
  gmr__backend_counters_reset_accumulated(rt->backend);
  gmr__policy_resume(rt->policy);
  retired_reset(rt);
  if (!has_pools(rt)) return;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL; c = c->next_child)
    gmr_stats_reset_accumulated(c);
  gmr__unlock(&rt->lock);
}

/* Re-entrance.  gmr_walk, gmr_stats_foreach and gmr_summary call back into
 * the caller (a walk or statistics callback, the FILE's own write function)
 * while the policy would be locked, and a callback that calls the runtime
 * again (allocates, frees, walks) would wait for that lock forever.  So the
 * policy hands its entries to a collector under the lock, and the caller's
 * callback sees the copies after the lock is released: any callback may call
 * any gmr function.  Costs one host allocation per call, never the hot path. */

typedef struct walk_vec_s {
  gmr_walk_entry_t *v;
  size_t n, cap;
  bool failed;      /* out of host memory */
  uint64_t pool_id; /* stamped on the entries collected now */
} walk_vec_t;

static int walk_collect(const gmr_walk_entry_t *e, void *ud) {
  walk_vec_t *w = ud;
  if (w->n == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 64;
    gmr_walk_entry_t *v = gmr__realloc(w->v, cap * sizeof *v);
    if (v == NULL) {
      w->failed = true;
      return 1;
    }
    w->v = v;
    w->cap = cap;
  }
  w->v[w->n] = *e; /* `pool` names are string literals */
  w->v[w->n++].pool_id = w->pool_id;
  return 0;
}

typedef struct stat_vec_s {
  gmr_strbuf_t keys; /* the keys, each NUL-terminated, one after another */
  int64_t *values;
  size_t *key_at; /* offsets into keys */
  size_t n, cap;
  bool failed;
} stat_vec_t;

static int stat_collect(const char *key, int64_t value, void *ud) {
  stat_vec_t *v = ud;
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 128;
    int64_t *values = gmr__realloc(v->values, cap * sizeof *values);
    if (values != NULL) v->values = values;
    size_t *key_at = values ? gmr__realloc(v->key_at, cap * sizeof *key_at) : NULL;
    if (key_at != NULL) v->key_at = key_at;
    if (values == NULL || key_at == NULL) {
      v->failed = true;
      return 1;
    }
    v->cap = cap;
  }
  v->key_at[v->n] = v->keys.len;
  gmr__sb_puts(&v->keys, key);
  gmr__sb_puts(&v->keys, "\x01"); /* a separator, made NUL below */
  if (v->keys.failed) {
    v->failed = true;
    return 1;
  }
  v->values[v->n++] = value;
  return 0;
}

/* Note [Retired pools]
 * PyTorch's statistics are the device's: a private pool's allocations stay
 * counted in num_device_alloc, allocation.all.allocated and the rest after
 * the pool is gone.  A gmr pool is a child runtime with counters of its own,
 * so when one closes its accumulated counts (gmr__stats_is_accumulated,
 * gmr__stats_add_accumulated) are folded into its parent's `retired` and
 * `retired_named`, which gmr_stats and gmr_stats_foreach add in and
 * gmr_stats_reset_accumulated clears:
 *   accumulated(rt) = own(rt) + sum over live pools + retired(rt).
 * Its current values and peaks go with it, as its memory does. */

static void stat_vec_free(stat_vec_t *v) {
  gmr__sb_free(&v->keys);
  gmr__free(v->values);
  gmr__free(v->key_at);
  memset(v, 0, sizeof *v);
}

/* The separators stat_collect writes, made NULs. */
static void stat_vec_terminate(stat_vec_t *v) {
  for (size_t i = 0; i < v->keys.len; ++i)
    if (v->keys.data[i] == '\x01') v->keys.data[i] = '\0';
}

static const char *stat_vec_key(const stat_vec_t *v, size_t i) {
  return v->keys.data + v->key_at[i];
}

/* Add value to key's entry in v (terminated), appending it when missing. */
static void stat_vec_add(stat_vec_t *v, const char *key, int64_t value) {
  for (size_t i = 0; i < v->n; ++i)
    if (strcmp(stat_vec_key(v, i), key) == 0) {
      v->values[i] += value;
      return;
    }
  if (stat_collect(key, value, v) == 0) v->keys.data[v->keys.len - 1] = '\0';
}

/* Fold pool c's accumulated counts into rt's (under rt's `lock`); a failure
 * to allocate host memory loses the named counts, never the common ones. */
void gmr__runtime_pool_retire(gmr_runtime_t *rt, gmr_runtime_t *c) {
  gmr_stats_t cs;
  gmr_stats(c, &cs);
  gmr__stats_add_accumulated(&rt->retired, &cs);
  if (rt->retired_named == NULL) rt->retired_named = gmr__calloc(1, sizeof *rt->retired_named);
  stat_vec_t cv;
  memset(&cv, 0, sizeof cv);
  if (rt->retired_named != NULL && gmr__policy_stats_foreach(c->policy, stat_collect, &cv) == 0 &&
      !cv.failed) {
    stat_vec_terminate(&cv);
    for (size_t i = 0; i < cv.n; ++i)
      if (gmr__stats_is_accumulated(stat_vec_key(&cv, i)))
        stat_vec_add(rt->retired_named, stat_vec_key(&cv, i), cv.values[i]);
  }
  stat_vec_free(&cv);
  atomic_store(&rt->retired_any, true);
}

void gmr__runtime_retired_free(gmr_runtime_t *rt) {
  if (rt->retired_named != NULL) stat_vec_free(rt->retired_named);
  gmr__free(rt->retired_named);
}

static void retired_reset(gmr_runtime_t *rt) {
  gmr__lock(&rt->lock);
  memset(&rt->retired, 0, sizeof rt->retired);
  for (size_t i = 0; rt->retired_named != NULL && i < rt->retired_named->n; ++i)
    rt->retired_named->values[i] = 0;
  gmr__unlock(&rt->lock);
}

/* Add the retired pools' named counts to v (terminated), key by key. */
static void stat_vec_add_retired(gmr_runtime_t *rt, stat_vec_t *v) {
  gmr__lock(&rt->lock);
  const stat_vec_t *r = rt->retired_named;
  for (size_t i = 0; r != NULL && i < v->n; ++i)
    for (size_t j = 0; j < r->n; ++j)
      if (strcmp(stat_vec_key(v, i), stat_vec_key(r, j)) == 0) {
        v->values[i] += r->values[j];
        break;
      }
  gmr__unlock(&rt->lock);
}

/* Add each pool's named statistics to v, key by key (the pools run the same
 * policy, so the same keys); settings such as max_split_size stay. */
static int stat_vec_add_pools(gmr_runtime_t *rt, stat_vec_t *v) {
  int err = 0;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL && err == 0; c = c->next_child) {
    stat_vec_t cv;
    memset(&cv, 0, sizeof cv);
    err = gmr__policy_stats_foreach(c->policy, stat_collect, &cv);
    if (err == 0 && cv.failed) err = GMR_ENOMEM;
    stat_vec_terminate(&cv);
    for (size_t i = 0; err == 0 && i < v->n && i < cv.n; ++i) {
      const char *key = stat_vec_key(v, i);
      if (strcmp(key, stat_vec_key(&cv, i)) == 0 && !gmr__stats_is_setting(key))
        v->values[i] += cv.values[i];
    }
    stat_vec_free(&cv);
  }
  gmr__unlock(&rt->lock);
  return err == GMR_ENOMEM
             ? gmr__error_set(err, "gmr_stats_foreach: out of host memory for the statistics")
             : err;
}

int gmr_stats_foreach(gmr_runtime_t *rt, gmr_stat_cb cb, void *ud) {
  if (rt == NULL || cb == NULL) return gmr__error_set(GMR_EINVAL, "gmr_stats_foreach: NULL");
  stat_vec_t v;
  memset(&v, 0, sizeof v);
  int err = gmr__policy_stats_foreach(rt->policy, stat_collect, &v);
  if (err == GMR_POLICY_NONE) {
    gmr__sb_free(&v.keys);
    gmr_stats_t st;
    gmr_stats(rt, &st);
    int cerr = gmr__stats_foreach_common(&st, cb, ud); /* no lock is held */
    if (cerr == 0 && has_pools(rt)) cerr = stat_emit_tags(rt, cb, ud);
    return cerr;
  }
  if (err == 0 && v.failed)
    err = gmr__error_set(GMR_ENOMEM, "gmr_stats_foreach: out of host memory for the statistics");
  stat_vec_terminate(&v);
  if (err == 0 && has_pools(rt)) err = stat_vec_add_pools(rt, &v);
  if (err == 0 && atomic_load(&rt->retired_any)) stat_vec_add_retired(rt, &v);
  size_t i = 0;
  for (; err == 0 && i < v.n; ++i)
    if (cb(stat_vec_key(&v, i), v.values[i], ud) != 0) break;
  if (err == 0 && i == v.n && has_pools(rt)) err = stat_emit_tags(rt, cb, ud);
  stat_vec_free(&v);
  return err ? fail(rt, err) : 0;
}

typedef struct stat_find_s {
  const char *key;
  int64_t value;
  bool found;
} stat_find_t;

static int stat_find_cb(const char *key, int64_t value, void *ud) {
  stat_find_t *f = ud;
  if (strcmp(key, f->key) != 0) return 0;
  f->value = value;
  f->found = true;
  return 1;
}

int gmr_stat_get(gmr_runtime_t *rt, const char *key, int64_t *out) {
  if (rt == NULL || key == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_stat_get: NULL argument");
  stat_find_t f = {key, 0, false};
  gmr_stats_foreach(rt, stat_find_cb, &f);
  if (!f.found) {
    gmr_stats_t st;
    gmr_stats(rt, &st);
    gmr__stats_foreach_common(&st, stat_find_cb, &f);
  }
  if (!f.found)
    return fail(rt, gmr__error_set(GMR_EINVAL, "gmr_stat_get: policy %s has no statistic '%s'",
                                   rt->policy_name, key));
  *out = f.value;
  return 0;
}

int gmr_summary(gmr_runtime_t *rt, FILE *out) {
  if (rt == NULL || out == NULL) return gmr__error_set(GMR_EINVAL, "gmr_summary: NULL argument");
  /* The text is written to memory under the policy's lock and to `out` after
   * it (a FILE may have write functions of its own that call gmr). */
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (mem == NULL)
    return fail(rt, gmr__error_set(GMR_ENOMEM, "gmr_summary: out of host memory for the text"));
  int err = gmr__policy_summary(rt->policy, mem);
  if (fclose(mem) != 0 && (err == 0 || err == GMR_POLICY_NONE))
    err = gmr__error_set(GMR_ENOMEM, "gmr_summary: out of host memory for the text");
  if (err == 0 && len > 0 && (fwrite(text, 1, len, out) != len || ferror(out)))
    err = gmr__error_set(GMR_EIO, "gmr_summary: writing the summary failed: %s", strerror(errno));
  free(text);
  if (err == GMR_POLICY_NONE) {
    gmr_stats_t st;
    gmr_stats(rt, &st);
    return gmr__stats_print(&st, rt->policy_name, rt->backend->ops->name, out);
  }
  return err ? fail(rt, err) : 0;
}

const char *gmr_last_error(gmr_runtime_t *rt) {
  return gmr__error_text(rt);
}

int gmr_walk(gmr_runtime_t *rt, gmr_walk_cb cb, void *ud) {
  if (rt == NULL || cb == NULL) return gmr__error_set(GMR_EINVAL, "gmr_walk: NULL argument");
  walk_vec_t w = {NULL, 0, 0, false, 0};
  int err = gmr__policy_walk(rt->policy, walk_collect, &w);
  if (err == 0 && has_pools(rt)) {
    gmr__lock(&rt->lock);
    for (gmr_runtime_t *c = rt->children; c != NULL && err == 0 && !w.failed; c = c->next_child) {
      w.pool_id = c->pool_id;
      err = gmr__policy_walk(c->policy, walk_collect, &w);
    }
    gmr__unlock(&rt->lock);
  }
  if (err == 0 && w.failed)
    err = fail(rt, gmr__error_set(GMR_ENOMEM, "gmr_walk: out of host memory for the segments"));
  for (size_t i = 0; err == 0 && i < w.n; ++i)
    if (cb(&w.v[i], ud) != 0) break;
  gmr__free(w.v);
  return err;
}

/* The snapshot source's capture (snapshot.h): the history's snapshot entry,
 * its active bytes and the walk are of one moment, the policy quiesced once
 * around all three (policy.h, rule 5). */
static int runtime_capture(void *ctx, gmr_walk_cb cb, void *ud, gmr_snapshot_capture_t *out) {
  gmr_runtime_t *rt = ctx;
  int err = 0;
  gmr__policy_quiesce(rt->policy);
  gmr_history_t *hist = history_of(rt);
  if (hist != NULL) {
    gmr_stats_t st;
    memset(&st, 0, sizeof st);
    gmr__policy_stats_locked(rt->policy, &st);
    gmr__history_record(hist, GMR_HIST_SNAPSHOT, 0, st.active_bytes, NULL);
    err = gmr__history_copy(hist, &out->entries, &out->n_entries);
    if (err == 0) err = gmr__history_copy_frames(hist, &out->frames, &out->n_frames);
    pthread_mutex_lock(&hist->lock);
    out->history_max = hist->max;
    out->history_dropped = hist->dropped;
    pthread_mutex_unlock(&hist->lock);
  }
  out->walk_err = err == 0 ? gmr__policy_walk_locked(rt->policy, cb, ud) : GMR_ENOTSUP;
  gmr__policy_resume(rt->policy);
  if (out->walk_err == 0 && has_pools(rt)) {
    gmr__lock(&rt->lock); /* the pools' segments follow, each stamped with its pool */
    for (gmr_runtime_t *c = rt->children; c != NULL && out->walk_err == 0; c = c->next_child)
      out->walk_err = gmr_walk(c, cb, ud);
    gmr__unlock(&rt->lock);
  }
  return err;
}

int gmr_snapshot_write(gmr_runtime_t *rt, FILE *out) {
  if (rt == NULL || out == NULL) {
    gmr__error_set(GMR_EINVAL, "gmr_snapshot_write: %s is NULL",
                   rt == NULL ? "the runtime" : "the output file");
    return rt != NULL ? fail(rt, GMR_EINVAL) : GMR_EINVAL;
  }
  gmr_snapshot_source_t src = {.ctx = rt,
                               .device = rt->device,
                               .policy = rt->policy_name,
                               .backend = rt->backend->ops->name,
                               .capture = runtime_capture};
  int err = gmr__snapshot_write(&src, out);
  return err ? fail(rt, err) : 0;
}

int gmr_check(gmr_runtime_t *rt) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_check: the runtime is NULL");
  int err = gmr__policy_check(rt->policy);
  if (err == 0 && rt->sleep_face != NULL) err = sleep_check(rt);
  if (err != 0 || !has_pools(rt)) return err;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL && err == 0; c = c->next_child)
    err = gmr_check(c);
  gmr__unlock(&rt->lock);
  return err;
}

static int sleep_check(gmr_runtime_t *c) {
  int err = gmr__sleep_face_check(c->sleep_face);
  if (err != 0) return err;
  gmr_sleep_figures_t fig;
  gmr__sleep_face_figures(c->sleep_face, &fig);
  if (!atomic_load(&c->asleep) && (fig.sleeping_bytes != 0 || fig.sleeping_ranges != 0))
    return gmr__error_set(GMR_EINVAL, "tag '%s' is awake with %llu bytes in %llu ranges asleep",
                          c->tag, (unsigned long long)fig.sleeping_bytes,
                          (unsigned long long)fig.sleeping_ranges);
  if (!atomic_load(&c->asleep) && fig.offloaded_bytes != 0)
    return gmr__error_set(GMR_EINVAL, "tag '%s' is awake with %llu bytes of host copies", c->tag,
                          (unsigned long long)fig.offloaded_bytes);
  if (atomic_load(&c->asleep) && c->sleep_mode == GMR_SLEEP_DISCARD && fig.offloaded_bytes != 0)
    return gmr__error_set(GMR_EINVAL, "tag '%s' sleeps discarded with %llu bytes of host copies",
                          c->tag, (unsigned long long)fig.offloaded_bytes);
  return 0;
}

/* gmr_stats_foreach's keys of the tags: tag.<name>.{mapped,sleeping,offloaded}_bytes,
 * tag.<name>.asleep, and sleeping_bytes over them all. */
static int stat_emit_tags(gmr_runtime_t *rt, gmr_stat_cb cb, void *ud) {
  gmr_tag_info_t v[64];
  size_t n = 0;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL && n < 64; c = c->next_child) {
    if (c->tag == NULL) continue;
    gmr_sleep_figures_t fig;
    gmr__sleep_face_figures(c->sleep_face, &fig);
    gmr_tag_info_t *t = &v[n++];
    memset(t, 0, sizeof *t);
    snprintf(t->tag, sizeof t->tag, "%s", c->tag);
    t->asleep = atomic_load(&c->asleep);
    t->mapped_bytes = fig.mapped_bytes;
    t->sleeping_bytes = fig.sleeping_bytes;
    t->offloaded_bytes = fig.offloaded_bytes;
  }
  gmr__unlock(&rt->lock);
  if (n == 0) return 0;
  uint64_t sleeping = 0;
  char key[GMR_TAG_MAX + 32];
  for (size_t i = 0; i < n; ++i) {
    sleeping += v[i].sleeping_bytes;
#define TAG_KEY(field, value)                                                                      \
  snprintf(key, sizeof key, "tag.%.63s." field, v[i].tag);                                         \
  if (cb(key, (int64_t)(value), ud) != 0) return 0;
    TAG_KEY("mapped_bytes", v[i].mapped_bytes)
    TAG_KEY("sleeping_bytes", v[i].sleeping_bytes)
    TAG_KEY("offloaded_bytes", v[i].offloaded_bytes)
    TAG_KEY("asleep", v[i].asleep)
#undef TAG_KEY
  }
  (void)cb("sleeping_bytes", (int64_t)sleeping, ud);
  return 0;
}
