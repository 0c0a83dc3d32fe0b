/* runtime.c: the dispatcher.
 *
 * A runtime owns one backend and one policy stack, the pointer -> block map,
 * the locking, the trace recorder and the public entry points.  It checks
 * every argument before a policy sees it, so policies only ever get sizes in
 * (0, GMR_MAX_REQUEST] and blocks they handed out themselves.
 *
 * The struct and its Notes are in runtime-internal.h, the statistics and
 * introspection in runtime-stats.c, the tags' sleep and wake in tags.c.
 * See Note [Runtime locking], Note [Fast and general paths],
 * Note [Map invariant], Note [Shard layout] and Note [Runtime history].
 */
#include "runtime/runtime-internal.h"

/* Tagged pools (Note [Tags]): the frees kept while asleep, the count back. */
static int free_deferred(gmr_runtime_t *rt, gmr_runtime_t *child, void *ptr);
static void sleep_count_back(gmr_runtime_t *c);
/* Private pools (Note [Pools]): a child records into its parent's history. */
static void child_share_history(gmr_runtime_t *rt, gmr_runtime_t *c);

/* ---- the pointer map: sharded open addressing, linear probing ------------- */

/* Note [Map invariant]
 * A pointer is in the map iff it was returned by gmr_alloc and not yet passed
 * to gmr_free; so a double free or a foreign pointer is found before any
 * policy state is touched.
 */

/* The table of a shard that never held an entry: one empty slot (mask 0,
 * grow_at 0), so a lookup needs no test for a missing table. */
static gmr_block_t map_none[1];

/* Multiplicative hashing, then the high half folded into the low one: the
 * shard comes from the top bits and the slot from the low bits, and block
 * addresses share their low bits (512-byte rounding, 2 MiB segments), which
 * a plain product would carry into the slot index and pile every block of a
 * shard into one probe chain. */
static inline uint64_t map_hash(const void *p) {
  uint64_t h = gmr__hash_mul((uint64_t)(uintptr_t)p >> 8);
  return h ^ (h >> 32);
}

static inline size_t map_shard_index(uint64_t h) {
  return (size_t)(h >> (64 - MAP_SHARD_BITS));
}

static inline map_shard_t *map_shard(gmr_runtime_t *rt, uint64_t h) {
  return &rt->shards[map_shard_index(h)];
}

/* The slot of ptr (not NULL) in its shard, or MAP_NONE. */
#define MAP_NONE SIZE_MAX
static RUNTIME_INLINE size_t map_find(const map_shard_t *sh, const void *ptr, uint64_t h) {
  const gmr_block_t *slots = sh->slots;
  const size_t mask = sh->mask;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const void *k = slots[i].ptr;
    if (k == ptr) return i;
    if (k == NULL) return MAP_NONE;
  }
}

/* A shard's table starts on a cache line of its own and ends on one
 * (40-byte slots, capacities of 8 or more): two threads that use two shards
 * write no common line, not even at their tables' edges. */
static int map_grow(map_shard_t *sh) {
  size_t cap = sh->slots != map_none ? (sh->mask + 1) * 2 : MAP_FIRST_SLOTS;
  void *raw = gmr__calloc(1, cap * sizeof(gmr_block_t) + CACHE_LINE - 1);
  if (raw == NULL) return GMR_ENOMEM;
  gmr_block_t *slots = gmr__align_ptr(raw, CACHE_LINE);
  gmr_assert_internal((uintptr_t)slots % CACHE_LINE == 0);
  for (size_t i = 0; i <= sh->mask; ++i) {
    if (sh->slots[i].ptr == NULL) continue;
    size_t j = map_hash(sh->slots[i].ptr) & (cap - 1);
    while (slots[j].ptr != NULL)
      j = (j + 1) & (cap - 1);
    slots[j] = sh->slots[i];
  }
  gmr__free(sh->slots_raw); /* NULL for map_none */
  sh->slots = slots;
  sh->slots_raw = raw;
  sh->mask = cap - 1;
  sh->grow_at = cap / 2;
  return 0;
}

/* Insert blk into a shard with room for it (count < grow_at). */
static RUNTIME_INLINE void map_put(map_shard_t *sh, const gmr_block_t *blk, uint64_t h) {
  size_t i = h & sh->mask;
  while (sh->slots[i].ptr != NULL)
    i = (i + 1) & sh->mask;
  sh->slots[i] = *blk;
  ++sh->count;
}

static RUNTIME_INLINE int map_insert(map_shard_t *sh, const gmr_block_t *blk, uint64_t h) {
  if (GMR_UNLIKELY(sh->count >= sh->grow_at)) {
    if (map_grow(sh) != 0) return GMR_ENOMEM;
  }
  map_put(sh, blk, h);
  return 0;
}

/* Backward-shift deletion of slot i: no tombstones, probes stay short.
 * An entry at j after the gap at i moves into it unless its home lies in
 * (i, j] (cyclically): (j - home) mod cap < (j - i) mod cap. */
static RUNTIME_INLINE void map_erase(map_shard_t *sh, size_t i) {
  gmr_block_t *slots = sh->slots;
  const size_t mask = sh->mask;
  for (size_t j = (i + 1) & mask; slots[j].ptr != NULL; j = (j + 1) & mask) {
    size_t home = map_hash(slots[j].ptr) & mask;
    if (((j - home) & mask) >= ((j - i) & mask)) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i].ptr = NULL;
  --sh->count;
}

/* A shard's lock, unless the policy's lock (held by the caller) guards it. */
static inline void map_lock(gmr_runtime_t *rt, map_shard_t *sh) {
  if (rt->policy_lock == NULL) gmr__spin_lock(&sh->lock);
}
static inline void map_unlock(gmr_runtime_t *rt, map_shard_t *sh) {
  if (rt->policy_lock == NULL) gmr__spin_unlock(&sh->lock);
}

/* A trace line that could not be written: the call itself succeeded, so it
 * returns 0, but the thread's last error on this runtime says what was lost
 * (trace.c logs the first failure and gmr_flush reports it). */
static RUNTIME_COLD void trace_write(gmr_runtime_t *rt, const char *action, const void *ptr,
                                     size_t size, gmr_stream_t s) {
  if (gmr__trace_event(rt->trace, action, ptr, size, s) != 0) gmr__error_tag(rt);
}

/* ---- construction ---------------------------------------------------------- */

static void describe_stack(gmr_runtime_t *rt) {
  char *b = rt->policy_name;
  size_t len = sizeof rt->policy_name, off = 0, depth = 0;
  for (gmr_policy_t *p = rt->policy; p && off < len; p = p->upstream, ++depth)
    off += (size_t)snprintf(b + off, len - off, "%s%s", p->ops->name, p->upstream ? "(" : "");
  while (depth-- > 1 && off < len - 1)
    b[off++] = ')', b[off] = '\0';
}

/* GMR_SNAPSHOT's file for the next runtime: path, then path.1, path.2...
 * (see Note [Runtime history]) */
static int snapshot_path_new(const char *path, char **out) {
  static _Atomic unsigned snapshots_named;
  unsigned n = atomic_fetch_add(&snapshots_named, 1);
  size_t len = strlen(path) + 16;
  char *p = gmr__malloc(len);
  if (p == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for GMR_SNAPSHOT");
  if (n == 0)
    snprintf(p, len, "%s", path);
  else
    snprintf(p, len, "%s.%u", path, n);
  *out = p;
  return 0;
}

/* Write GMR_SNAPSHOT's file.  Nobody may be there to ask, so a failure is
 * logged (one line at GMR_LOG_ERROR) and left as the thread's last error;
 * gmr_runtime_close returns it.  @return 0, GMR_EIO, GMR_ENOMEM */
static int snapshot_at_end(gmr_runtime_t *rt) {
  errno = 0;
  FILE *f = fopen(rt->snapshot_path, "wb");
  int open_errno = errno;
  int err = f ? gmr_snapshot_write(rt, f) : GMR_EIO;
  errno = 0;
  if (f != NULL && fclose(f) != 0 && err == 0) {
    err = gmr__error_set(GMR_EIO, "%s", strerror(errno));
  }
  if (err != 0) {
    if (f == NULL)
      gmr__error_set(GMR_EIO, "GMR_SNAPSHOT: cannot open %s for writing: %s", rt->snapshot_path,
                     strerror(open_errno));
    else
      gmr__error_set(err, "GMR_SNAPSHOT: cannot write %s: %s", rt->snapshot_path,
                     gmr__error_last());
    gmr__log(GMR_LOG_ERROR, "%s", gmr__error_last());
  }
  return err;
}

/* Build a runtime on `dev` (owned from now on), or, with `parent`, a private
 * pool of parent (dev NULL: the parent's gate and device are borrowed; no
 * trace, no GMR_HISTORY or GMR_SNAPSHOT of its own). */
static int runtime_build(const gmr_config_t *cfg, gmr_backend_t *dev, int device,
                         gmr_runtime_t *parent, bool sleepable, gmr_runtime_t **out) {
  gmr_backend_t *gate = NULL, *be = NULL, *face = NULL;
  int gate_err = parent != NULL ? gmr__gate_borrow(parent->gate, &gate) : gmr__gate_new(dev, &gate);
  if (gate_err != 0) return gate_err;
  if (sleepable) { /* Note [Tags]: the pool's own device calls go through it */
    int face_err = gmr__sleep_face_new(gate, &face);
    if (face_err != 0) return face_err;
    gate = face;
  }
  int rec_err = gmr__recording_new(gate, &be);
  if (rec_err != 0) return rec_err;
  void *raw = gmr__calloc(1, sizeof(gmr_runtime_t) + CACHE_LINE - 1);
  if (raw == NULL) {
    gmr__backend_free(be);
    return gmr__error_set(GMR_ENOMEM, "out of host memory for a runtime");
  }
  gmr_runtime_t *rt = gmr__align_ptr(raw, CACHE_LINE);
  gmr_assert_internal((uintptr_t)&rt->shards[0] % CACHE_LINE == 0 &&
                      (uintptr_t)&rt->lock % CACHE_LINE == 0);
  rt->raw = raw;
  rt->backend = be;
  rt->dev = parent != NULL ? parent->dev : dev;
  rt->gate = parent != NULL ? parent->gate : gate;
  rt->parent = parent;
  rt->device = device;
  rt->sleep_face = face;
  int err = GMR_ENOMEM;
  if (gmr__lock_init(&rt->lock) != 0) goto fail_lock;
  if (gmr__lock_init(&rt->sleep_lock) != 0) {
    gmr__lock_destroy(&rt->lock);
    goto fail_lock;
  }
  for (int k = 0; k < MAP_SHARDS; ++k) {
    gmr__spin_init(&rt->shards[k].lock);
    rt->shards[k].slots = map_none;
  }
  err = gmr__policy_create(cfg->policy, be, &rt->policy);
  if (err != 0) goto fail_policy;
  gmr__policy_set_owner(rt->policy, rt);
  rt->policy_lock = gmr__policy_lock_ptr(rt->policy);
  describe_stack(rt);
  rt->history_completes = true;
  for (gmr_policy_t *p = rt->policy; p; p = p->upstream)
    if (p->ops->reports_free_completed) rt->history_completes = false;
  rt->cfg = gmr__config_retain(cfg);
  if (parent != NULL) {
    atomic_init(&rt->slow, rt->policy_lock != NULL ? RUNTIME_SLOW_SERIAL : 0u);
    *out = rt;
    return 0;
  }
  const char *trace_path = cfg->trace_path ? cfg->trace_path : gmr__env(GMR_ENV_TRACE);
  if (trace_path != NULL && *trace_path != '\0') {
    err = gmr__trace_open(trace_path, &rt->trace);
    if (err != 0) goto fail_trace;
  }
  atomic_init(&rt->slow, (rt->policy_lock != NULL ? RUNTIME_SLOW_SERIAL : 0u) |
                             (rt->trace != NULL ? RUNTIME_SLOW_TRACE : 0u));
  const char *hist;
  size_t n;
  if (gmr__env_history(&n, &hist) != 0) {
    err = gmr__error_set(GMR_EINVAL,
                         "GMR_HISTORY=%s: expected the number of trace entries to keep, "
                         "e.g. GMR_HISTORY=100000 (0: off)",
                         hist);
    gmr__log(GMR_LOG_ERROR, "%s", gmr__error_last());
    goto fail_history;
  }
  if (n > 0 && (err = gmr_history_enable(rt, n)) != 0) goto fail_history;
  const char *snap = gmr__env(GMR_ENV_SNAPSHOT);
  if (snap != NULL && (err = snapshot_path_new(snap, &rt->snapshot_path)) != 0) goto fail_history;
  *out = rt;
  return 0;
fail_history:
  gmr__recording_attach(be, NULL);
  gmr__history_free(rt->history_store);
  gmr__trace_close(rt->trace);
fail_trace:
  gmr_config_free(rt->cfg);
  gmr__policy_destroy(rt->policy);
fail_policy:
  gmr__lock_destroy(&rt->sleep_lock);
  gmr__lock_destroy(&rt->lock);
fail_lock:
  gmr__backend_free(be);
  gmr__free(raw);
  if (err == GMR_ENOMEM && gmr__error_last()[0] == '\0')
    gmr__error_set(GMR_ENOMEM, "out of host memory for a runtime");
  return err;
}

static void sim_options_of(const gmr_config_t *cfg, gmr_sim_options_t *o) {
  o->capacity = cfg->device.capacity;
  o->granularity = cfg->device.granularity;
  o->host_backed = cfg->device.host_backed;
}

int gmr_runtime_new(const gmr_config_t *cfg, int device, gmr_runtime_t **out) {
  if (cfg == NULL || out == NULL || device < 0)
    return gmr__error_set(GMR_EINVAL, "gmr_runtime_new: %s",
                          cfg == NULL   ? "the configuration is NULL"
                          : out == NULL ? "the out-parameter is NULL"
                                        : "the device ordinal is negative");
  gmr__error_clear();
  gmr_backend_t *be = NULL;
  int err;
  int kind = cfg->device.backend;
  if (kind == GMR_DEVICE_AUTO) kind = gmr__cuda_available() ? GMR_DEVICE_CUDA : GMR_DEVICE_SIM;
  if (kind == GMR_DEVICE_CUDA) {
    err = gmr__cuda_backend_new(device, &be);
  } else {
    gmr_sim_options_t o;
    sim_options_of(cfg, &o);
    err = gmr__sim_backend_new_on(&o, device, &be);
  }
  if (err != 0) return err;
  return runtime_build(cfg, be, device, NULL, false, out);
}

int gmr_runtime_new_sim(const gmr_config_t *cfg, const gmr_sim_options_t *opts,
                        gmr_runtime_t **out) {
  if (cfg == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_runtime_new_sim: NULL argument");
  gmr__error_clear();
  gmr_sim_options_t o;
  sim_options_of(cfg, &o);
  if (opts != NULL) {
    if (opts->capacity) o.capacity = opts->capacity;
    if (opts->granularity) o.granularity = opts->granularity;
    o.host_backed = opts->host_backed || o.host_backed;
  }
  gmr_backend_t *be = NULL;
  int err = gmr__sim_backend_new(&o, &be);
  if (err != 0) return err;
  return runtime_build(cfg, be, 0, NULL, false, out);
}

int gmr_runtime_close(gmr_runtime_t *rt) {
  if (rt == NULL) return 0;
  gmr__error_clear();
  int err = 0;
  if (rt->snapshot_path != NULL) err = snapshot_at_end(rt); /* live blocks included */
  for (gmr_runtime_t *c = rt->children, *next; c != NULL; c = next) {
    next = c->next_child;
    (void)gmr_runtime_close(c); /* before the gate they borrow goes */
  }
  gmr__free(rt->routes);
  size_t live = 0, bytes = 0;
  for (int s = 0; s < MAP_SHARDS; ++s) {
    map_shard_t *sh = &rt->shards[s];
    for (size_t i = 0; i <= sh->mask; ++i)
      if (sh->slots[i].ptr != NULL) ++live, bytes += sh->slots[i].requested;
    gmr__free(sh->slots_raw);
  }
  if (live != 0)
    gmr__log(GMR_LOG_WARN,
             "runtime (%s on %s) freed with %zu live allocation%s (%zu bytes requested); "
             "their device memory is released",
             rt->policy_name, rt->backend->ops->name, live, live == 1 ? "" : "s", bytes);
  if (rt->sleep_face != NULL) sleep_count_back(rt); /* Note [Tags] */
  gmr__policy_destroy(rt->policy);
  if (err == 0)
    err = gmr__trace_close(rt->trace);
  else
    (void)gmr__trace_close(rt->trace); /* the snapshot's message stays */
  gmr__backend_free(rt->backend);
  gmr__history_free(rt->history_store);
  gmr__runtime_retired_free(rt);
  gmr__free(rt->snapshot_path);
  gmr_config_free(rt->cfg);
  gmr__free(rt->tag);
  gmr__free(rt->deferred);
  gmr__lock_destroy(&rt->sleep_lock);
  gmr__lock_destroy(&rt->lock);
  gmr__free(rt->raw);
  return err;
}

void gmr_runtime_free(gmr_runtime_t *rt) {
  (void)gmr_runtime_close(rt);
}

int gmr_flush(gmr_runtime_t *rt) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_flush: the runtime is NULL");
  if (rt->trace == NULL) return 0;
  int err = gmr__trace_flush(rt->trace);
  return err ? fail(rt, err) : 0;
}

/* ---- allocation ---------------------------------------------------------------- */

/* The refusals of gmr_alloc, out of line so the hot path stays small. */
static RUNTIME_COLD int alloc_refused(gmr_runtime_t *rt, size_t size, void **out_ptr) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_alloc: the runtime is NULL");
  if (out_ptr == NULL)
    return fail(rt, gmr__error_set(GMR_EINVAL, "gmr_alloc: the out-parameter is NULL"));
  if (size == 0)
    return fail(rt, gmr__error_set(GMR_EINVAL, "gmr_alloc: size 0; gmr never hands out "
                                               "zero-byte blocks"));
  return fail(rt, gmr__error_set(GMR_ENOMEM,
                                 "out of memory. Tried to allocate more than 1EB "
                                 "memory (%zu bytes requested).",
                                 size));
}

static RUNTIME_COLD int alloc_unmapped(gmr_runtime_t *rt, gmr_block_t *blk) {
  gmr__policy_free_locked(rt->policy, blk);
  return fail(rt, gmr__error_set(GMR_ENOMEM, "gmr_alloc: out of host memory for the pointer map"));
}

/* Note [Runtime history]
 * See history.h.  While `history` is set, gmr_alloc records alloc (or oom)
 * once the block is in the map, and gmr_free records free_requested (and
 * free_completed, unless the policy stack reports it) before the policy sees
 * the block, so the address cannot be handed out again before its free is in
 * the history.  With no history, no trace and a concurrent policy each entry
 * point pays one load and one predictable branch.  The device's entries
 * (segment_*) are recorded by the recording layer (observe/recording.h) that
 * the runtime puts between its policies and the device; snapshots are written
 * by observe/snapshot.c, which reads the runtime through a
 * gmr_snapshot_source_t and never calls back.  GMR_SNAPSHOT=path writes the
 * memory snapshot when the runtime is freed (at exit for the default
 * runtimes), to path, path.1, path.2... in the order the runtimes were
 * created.
 */

/* A failed policy allocation: tagged with the policy, and an out-of-memory
 * that a shared cap's lock timeout caused says so first (Note [A timeout
 * reaches the caller] in lib/core/shared-cap.c). */
static RUNTIME_COLD int alloc_failed(gmr_runtime_t *rt, int err) {
  const char *note = err == GMR_ENOMEM ? gmr__scap_take_note() : NULL;
  if (note != NULL) {
    char why[1024];
    snprintf(why, sizeof why, "%s", gmr__error_last());
    gmr__error_set(GMR_ENOMEM, "out of memory: %s. %s", note, why);
  }
  return gmr__policy_failed(rt->policy, err);
}

/* The general path's policy allocation and map insertion, under the locks. */
static RUNTIME_INLINE int alloc_core(gmr_runtime_t *rt, size_t size, gmr_stream_t s,
                                     gmr_block_t *blk) {
  gmr_lock_t *const pl = rt->policy_lock;
  if (pl != NULL) gmr__lock(pl);
  int err = gmr__policy_alloc_locked(rt->policy, size, s, blk);
  if (GMR_LIKELY(err == 0)) {
    gmr_assert(blk->ptr != NULL && blk->size >= size);
    blk->requested = size;
    blk->stream = s;
    uint64_t h = map_hash(blk->ptr);
    map_shard_t *sh = map_shard(rt, h);
    if (pl == NULL) gmr__spin_lock(&sh->lock);
    err = map_insert(sh, blk, h);
    if (pl == NULL) gmr__spin_unlock(&sh->lock);
    if (GMR_UNLIKELY(err != 0)) err = alloc_unmapped(rt, blk);
  } else {
    err = alloc_failed(rt, err);
  }
  if (pl != NULL) gmr__unlock(pl);
  return err;
}

static RUNTIME_COLD int bad_pointer(gmr_runtime_t *rt, const char *fn, void *ptr) {
  return fail(rt, gmr__error_set(GMR_EBADPTR,
                                 "%s: %p was not allocated by this runtime, or was already freed",
                                 fn, ptr));
}

/* ---- private pools: routing (Note [Pools]) ------------------------------------ */

/* The thread's open regions (gmr_region_begin), innermost last: Note [Tags]. */
#define REGION_DEPTH 32
typedef struct region_s {
  gmr_runtime_t *rt, *child;
} region_t;
static _Thread_local region_t tl_regions[REGION_DEPTH];
static _Thread_local int tl_depth;

/* The tag pool of the thread's innermost region on rt, or NULL. */
static gmr_runtime_t *region_child(gmr_runtime_t *rt) {
  for (int i = tl_depth; i-- > 0;)
    if (tl_regions[i].rt == rt) return tl_regions[i].child;
  return NULL;
}

/* ---- tagged pools: regions, lookup, the frees kept while asleep (Note [Tags]) --- */

int gmr__runtime_region_begin(gmr_runtime_t *rt, const char *tag) {
  if (rt->parent != NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_region_begin: a pool has no regions of its own");
  if (tl_depth == REGION_DEPTH)
    return fail(rt, gmr__error_set(GMR_EINVAL,
                                   "gmr_region_begin: %d regions are open on this thread already",
                                   REGION_DEPTH));
  gmr_runtime_t *c = NULL;
  int err = gmr__runtime_tag(rt, tag, true, &c);
  if (err != 0) return err;
  tl_regions[tl_depth++] = (region_t){rt, c};
  return 0;
}

int gmr__runtime_region_end(gmr_runtime_t *rt) {
  int i = tl_depth;
  while (i-- > 0 && tl_regions[i].rt != rt) {
  }
  if (i < 0)
    return fail(rt, gmr__error_set(GMR_EINVAL,
                                   "gmr_region_end: no region is open on this runtime on this "
                                   "thread"));
  memmove(&tl_regions[i], &tl_regions[i + 1], (size_t)(tl_depth - i - 1) * sizeof tl_regions[0]);
  --tl_depth;
  return 0;
}

const char *gmr__runtime_region_current(gmr_runtime_t *rt) {
  gmr_runtime_t *c = region_child(rt);
  return c != NULL ? c->tag : NULL;
}

/* The tag pool named `tag`, made busy-free (tag pools live as long as rt);
 * NULL when none.  Under rt's `lock`. */
static gmr_runtime_t *tag_find_locked(gmr_runtime_t *rt, const char *tag) {
  for (gmr_runtime_t *c = rt->children; c != NULL; c = c->next_child)
    if (c->tag != NULL && strcmp(c->tag, tag) == 0) return c;
  return NULL;
}

static gmr_runtime_t *tag_find(gmr_runtime_t *rt, const char *tag) {
  gmr__lock(&rt->lock);
  gmr_runtime_t *c = tag_find_locked(rt, tag);
  gmr__unlock(&rt->lock);
  return c;
}

int gmr__runtime_tag(gmr_runtime_t *rt, const char *tag, bool create, gmr_runtime_t **out) {
  gmr_runtime_t *c = tag_find(rt, tag);
  if (c != NULL || !create) {
    *out = c;
    return 0;
  }
  static _Atomic uint64_t tag_ids = (uint64_t)1 << 62; /* apart from gmr_pool_create's */
  int err = runtime_build(rt->cfg, NULL, rt->device, rt, true, &c);
  if (err != 0) return fail(rt, err);
  c->tag = gmr__strdup(tag);
  if (c->tag == NULL) {
    (void)gmr_runtime_close(c);
    return fail(rt, gmr__error_set(GMR_ENOMEM, "gmr_region_begin: out of host memory"));
  }
  c->pool_id = atomic_fetch_add(&tag_ids, 1) + 1;
  c->pool_uses = 1;
  gmr__lock(&rt->lock);
  gmr_runtime_t *other = tag_find_locked(rt, tag); /* another thread made it meanwhile */
  if (other == NULL) {
    child_share_history(rt, c);
    c->next_child = rt->children;
    rt->children = c;
    atomic_fetch_or_explicit(&rt->slow, RUNTIME_SLOW_POOLS, memory_order_release);
  }
  gmr__unlock(&rt->lock);
  if (other != NULL) {
    (void)gmr_runtime_close(c);
    c = other;
  }
  *out = c;
  return 0;
}

/* A free while the tag sleeps: kept for the wake (Note [Tags]).  A second
 * free of the same pointer is refused as a double free. */
static int free_deferred(gmr_runtime_t *rt, gmr_runtime_t *child, void *ptr) {
  int err = 0;
  gmr__lock(&rt->lock);
  for (size_t i = 0; i < child->ndeferred && err == 0; ++i)
    if (child->deferred[i] == ptr) err = GMR_EBADPTR;
  if (err == 0 && child->ndeferred == child->capdeferred) {
    size_t cap = child->capdeferred ? child->capdeferred * 2 : 16;
    void **v = gmr__realloc(child->deferred, cap * sizeof *v);
    if (v == NULL) err = GMR_ENOMEM;
    if (v != NULL) child->deferred = v, child->capdeferred = cap;
  }
  if (err == 0) child->deferred[child->ndeferred++] = ptr;
  gmr__unlock(&rt->lock);
  if (err == GMR_EBADPTR) return bad_pointer(rt, "gmr_free", ptr);
  if (err == GMR_ENOMEM)
    return fail(rt, gmr__error_set(GMR_ENOMEM,
                                   "gmr_free: out of host memory to keep a free of %p until tag "
                                   "'%s' wakes",
                                   ptr, child->tag));
  return 0;
}

/* A pool that goes asleep: its memory is counted back in (Note [Tags]). */
static void sleep_count_back(gmr_runtime_t *c) {
  if (!atomic_load(&c->asleep)) return;
  gmr_sleep_figures_t fig;
  gmr__sleep_face_figures(c->sleep_face, &fig);
  if (fig.sleeping_bytes > 0)
    (void)gmr__policy_sleep_charge(c->policy, (int64_t)fig.sleeping_bytes, true);
}

/* ---- private pools: routing, continued ---------------------------------------- */

/* The child that the newest route matching s names (use count > 0), made
 * busy; NULL when none matches. */
static RUNTIME_COLD gmr_runtime_t *route_find(gmr_runtime_t *rt, gmr_stream_t s) {
  gmr_runtime_t *found = NULL;
  gmr__lock(&rt->lock);
  for (size_t i = atomic_load_explicit(&rt->nroutes, memory_order_relaxed); i-- > 0;) {
    pool_route_t *r = &rt->routes[i];
    if ((r->stream == s || r->stream == GMR_STREAM_ANY) && r->child->pool_uses > 0) {
      found = r->child;
      atomic_fetch_add(&found->busy, 1);
      break;
    }
  }
  gmr__unlock(&rt->lock);
  return found;
}

/* The bytes rt's policy holds from the device (its backend's counter). */
static RUNTIME_COLD uint64_t policy_reserved(gmr_runtime_t *rt) {
  return atomic_load(&rt->backend->counters.reserved_bytes);
}

/* gmr_alloc in a busy child; the child's failure text is the parent's too.
 * Out of memory, the parent's cache and the released pools' go back to the
 * device and, when that gave anything back, the allocation is tried once
 * more, as PyTorch frees every pool's cached blocks before it gives up on a
 * private pool's request (Note [One retry]). */
static RUNTIME_COLD int alloc_in_child(gmr_runtime_t *rt, gmr_runtime_t *child, size_t size,
                                       gmr_stream_t s, void **out_ptr) {
  if (child->sleep_face != NULL && atomic_load(&child->asleep)) {
    atomic_fetch_sub(&child->busy, 1);
    return fail(rt, gmr__error_set(GMR_EBUSY,
                                   "gmr_alloc: tag '%s' is asleep: gmr_wake it before allocating "
                                   "in it",
                                   child->tag));
  }
  int err = gmr_alloc(child, size, s, out_ptr);
  if (err == GMR_ENOMEM) {
    uint64_t released = 0, before = policy_reserved(rt);
    if (gmr__policy_trim(rt->policy) == 0 && gmr__runtime_pools_trim(rt, &released) == 0 &&
        (released > 0 || policy_reserved(rt) < before))
      err = gmr_alloc(child, size, s, out_ptr);
  }
  atomic_fetch_sub(&child->busy, 1);
  return err != 0 ? fail(rt, err) : 0;
}

/* The child whose map holds ptr, made busy; NULL when none does. */
static RUNTIME_COLD gmr_runtime_t *child_holding(gmr_runtime_t *rt, const void *ptr) {
  uint64_t h = map_hash(ptr);
  gmr_runtime_t *found = NULL;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t *c = rt->children; c != NULL && found == NULL; c = c->next_child) {
    map_shard_t *sh = map_shard(c, h);
    gmr__policy_lock(c->policy);
    map_lock(c, sh);
    if (map_find(sh, ptr, h) != MAP_NONE) found = c;
    map_unlock(c, sh);
    gmr__policy_unlock(c->policy);
  }
  if (found != NULL) atomic_fetch_add(&found->busy, 1);
  gmr__unlock(&rt->lock);
  return found;
}

/* gmr_free of a pointer the parent's map does not hold. */

static RUNTIME_COLD int free_in_child(gmr_runtime_t *rt, void *ptr) {
  gmr_runtime_t *child = child_holding(rt, ptr);
  if (child == NULL) return bad_pointer(rt, "gmr_free", ptr);
  if (child->sleep_face != NULL && atomic_load(&child->asleep)) {
    int derr = free_deferred(rt, child, ptr);
    atomic_fetch_sub(&child->busy, 1);
    return derr;
  }
  int err = gmr_free(child, ptr);
  atomic_fetch_sub(&child->busy, 1);
  return err != 0 ? fail(rt, err) : 0;
}

/* gmr_alloc's general path: a serialized policy, the trace, the history
 * (alloc on success, oom on GMR_ENOMEM: PyTorch's OOM entry, the device's
 * free bytes and the request). */
static RUNTIME_NOINLINE int alloc_general(gmr_runtime_t *rt, size_t size, gmr_stream_t s,
                                          void **out_ptr) {
  if (atomic_load_explicit(&rt->nroutes, memory_order_acquire) != 0) {
    gmr_runtime_t *child = route_find(rt, s);
    if (child != NULL) return alloc_in_child(rt, child, size, s, out_ptr);
  }
  if (GMR_UNLIKELY(tl_depth > 0)) {
    gmr_runtime_t *child = region_child(rt);
    if (child != NULL) {
      atomic_fetch_add(&child->busy, 1);
      return alloc_in_child(rt, child, size, s, out_ptr);
    }
  }
  gmr_history_t *hist = history_of(rt);
  gmr_block_t blk;
  int err = alloc_core(rt, size, s, &blk);
  uint64_t released = 0; /* the released pools' cache: see Note [One retry] */
  if (err == GMR_ENOMEM && has_pools(rt) && gmr__runtime_pools_trim(rt, &released) == 0 &&
      released > 0)
    err = alloc_core(rt, size, s, &blk);
  if (err == GMR_ENOMEM && hist != NULL) {
    size_t free_b = 0, total = 0;
    gmr__backend_mem_info(rt->backend, &free_b, &total);
    gmr__history_record(hist, GMR_HIST_OOM, free_b, size, s);
  }
  if (err != 0) return hist != NULL ? fail(rt, err) : err; /* tagged by alloc_core */
  if (hist != NULL) gmr__history_record(hist, GMR_HIST_ALLOC, (uintptr_t)blk.ptr, size, s);
  if (rt->trace != NULL) trace_write(rt, "allocate", blk.ptr, size, s);
  *out_ptr = blk.ptr;
  return 0;
}

/* alloc_fast's map insertion when the shard's lock is not biased to this
 * thread, or the shard must grow: the lock taken by exchange (or waited
 * for), out of line. */
static RUNTIME_NOINLINE int alloc_map_locking(gmr_runtime_t *rt, gmr_block_t *blk, uint64_t h,
                                              void **out_ptr) {
  map_shard_t *sh = map_shard(rt, h);
  bool biased = gmr__spin_take(&sh->lock);
  bool mapped = map_insert(sh, blk, h) == 0;
  gmr__spin_release(&sh->lock, biased);
  if (GMR_UNLIKELY(!mapped)) return alloc_unmapped(rt, blk);
  *out_ptr = blk->ptr;
  return 0;
}

/* The hot path: a concurrent policy (it locks itself), no trace, no history;
 * the map is touched under its shard's lock, taken inline when it is biased
 * to this thread (a shard one thread uses) and out of line otherwise.
 * Anything else is `slow`.  Out of line, so that gmr_alloc reaches either
 * path by a jump, before any frame is built. */
static RUNTIME_NOINLINE int alloc_fast(gmr_runtime_t *rt, size_t size, gmr_stream_t s,
                                       void **out_ptr) {
  gmr_block_t blk;
  int err = gmr__policy_alloc_locked(rt->policy, size, s, &blk);
  if (GMR_UNLIKELY(err != 0)) return alloc_failed(rt, err);
  gmr_assert(blk.ptr != NULL && blk.size >= size);
  blk.requested = size;
  blk.stream = s;
  uint64_t h = map_hash(blk.ptr);
  map_shard_t *sh = map_shard(rt, h);
  if (GMR_UNLIKELY(!gmr__spin_try_biased(&sh->lock)))
    return alloc_map_locking(rt, &blk, h, out_ptr);
  if (GMR_UNLIKELY(sh->count >= sh->grow_at)) {
    gmr__spin_release(&sh->lock, true);
    return alloc_map_locking(rt, &blk, h, out_ptr);
  }
  map_put(sh, &blk, h);
  gmr__spin_release(&sh->lock, true);
  *out_ptr = blk.ptr;
  return 0;
}

/* see Note [Fast and general paths] */
int gmr_alloc(gmr_runtime_t *rt, size_t size, gmr_stream_t s, void **out_ptr) {
  if (GMR_UNLIKELY(rt == NULL || out_ptr == NULL || size - 1 >= GMR_MAX_REQUEST - 1))
    return alloc_refused(rt, size, out_ptr);
  if (GMR_UNLIKELY(atomic_load_explicit(&rt->slow, memory_order_acquire) != 0))
    return alloc_general(rt, size, s, out_ptr);
  return alloc_fast(rt, size, s, out_ptr);
}

/* gmr_free's general path (see gmr_alloc): the free is recorded in the
 * history before the policy sees the block (see the file comment). */
static RUNTIME_NOINLINE int free_general(gmr_runtime_t *rt, void *ptr) {
  uint64_t h = map_hash(ptr);
  map_shard_t *sh = map_shard(rt, h);
  gmr_lock_t *const pl = rt->policy_lock;
  /* One lock either way: the policy lock guards the map too when it is held. */
  if (pl == NULL)
    gmr__spin_lock(&sh->lock);
  else
    gmr__lock(pl);
  size_t slot = map_find(sh, ptr, h);
  gmr_block_t blk;
  if (slot != MAP_NONE) {
    blk = sh->slots[slot];
    map_erase(sh, slot);
  }
  if (pl == NULL) gmr__spin_unlock(&sh->lock);
  if (slot == MAP_NONE) {
    if (pl != NULL) gmr__unlock(pl);
    if (has_pools(rt)) return free_in_child(rt, ptr);
    return bad_pointer(rt, "gmr_free", ptr);
  }
  gmr_history_t *hist = history_of(rt);
  if (hist != NULL) {
    gmr__history_record(hist, GMR_HIST_FREE_REQUESTED, (uintptr_t)blk.ptr, blk.requested,
                        blk.stream);
    if (rt->history_completes)
      gmr__history_record(hist, GMR_HIST_FREE_COMPLETED, (uintptr_t)blk.ptr, blk.requested,
                          blk.stream);
  }
  int err = gmr__policy_free_locked(rt->policy, &blk);
  if (pl != NULL) gmr__unlock(pl);
  if (err != 0) return gmr__policy_failed(rt->policy, err);
  if (rt->trace != NULL) trace_write(rt, "free", ptr, blk.requested, blk.stream);
  return 0;
}

/* Take ptr's entry out of its shard into *blk (shard lock held); false
 * when the shard has none. */
static RUNTIME_INLINE bool map_remove(map_shard_t *sh, const void *ptr, uint64_t h,
                                      gmr_block_t *blk) {
  size_t slot = map_find(sh, ptr, h);
  if (GMR_UNLIKELY(slot == MAP_NONE)) return false;
  *blk = sh->slots[slot];
#if defined(__GNUC__)
  __builtin_prefetch(blk->handle); /* the policy's record: fetched while the map is updated */
#endif
  map_erase(sh, slot);
  return true;
}

/* The policy's free of a block taken out of the map (gmr_free's hot path). */
static RUNTIME_INLINE int free_block(gmr_runtime_t *rt, const gmr_block_t *blk) {
  int err = gmr__policy_free_locked(rt->policy, blk);
  return GMR_UNLIKELY(err != 0) ? gmr__policy_failed(rt->policy, err) : 0;
}

/* free_fast when the shard's lock is not biased to this thread (see
 * alloc_map_locking). */
static RUNTIME_NOINLINE int free_map_locking(gmr_runtime_t *rt, void *ptr, uint64_t h) {
  map_shard_t *sh = map_shard(rt, h);
  bool biased = gmr__spin_take(&sh->lock);
  gmr_block_t blk;
  bool found = map_remove(sh, ptr, h, &blk);
  gmr__spin_release(&sh->lock, biased);
  if (GMR_UNLIKELY(!found)) return bad_pointer(rt, "gmr_free", ptr);
  return free_block(rt, &blk);
}

/* gmr_free's hot path (see alloc_fast). */
static RUNTIME_NOINLINE int free_fast(gmr_runtime_t *rt, void *ptr) {
  uint64_t h = map_hash(ptr);
  map_shard_t *sh = map_shard(rt, h);
  if (GMR_UNLIKELY(!gmr__spin_try_biased(&sh->lock))) return free_map_locking(rt, ptr, h);
  gmr_block_t blk;
  bool found = map_remove(sh, ptr, h, &blk);
  gmr__spin_release(&sh->lock, true);
  if (GMR_UNLIKELY(!found)) return bad_pointer(rt, "gmr_free", ptr);
  return free_block(rt, &blk);
}

/* see Note [Fast and general paths] and Note [Map invariant] */
int gmr_free(gmr_runtime_t *rt, void *ptr) {
  if (GMR_UNLIKELY(rt == NULL)) return gmr__error_set(GMR_EINVAL, "gmr_free: the runtime is NULL");
  if (GMR_UNLIKELY(ptr == NULL)) return 0;
  if (GMR_UNLIKELY(atomic_load_explicit(&rt->slow, memory_order_acquire) != 0))
    return free_general(rt, ptr);
  return free_fast(rt, ptr);
}

int gmr_record_stream(gmr_runtime_t *rt, void *ptr, gmr_stream_t s) {
  if (rt == NULL || ptr == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_record_stream: %s is NULL",
                          rt == NULL ? "the runtime" : "the pointer");
  uint64_t h = map_hash(ptr);
  map_shard_t *sh = map_shard(rt, h);
  gmr__policy_lock(rt->policy);
  map_lock(rt, sh);
  size_t slot = map_find(sh, ptr, h);
  gmr_block_t blk;
  if (slot != MAP_NONE) blk = sh->slots[slot];
  map_unlock(rt, sh);
  int err = slot == MAP_NONE ? GMR_EBADPTR : gmr__policy_record_stream_locked(rt->policy, &blk, s);
  gmr__policy_unlock(rt->policy);
  if (slot == MAP_NONE) {
    gmr_runtime_t *child = has_pools(rt) ? child_holding(rt, ptr) : NULL;
    if (child == NULL) return bad_pointer(rt, "gmr_record_stream", ptr);
    err = gmr_record_stream(child, ptr, s);
    atomic_fetch_sub(&child->busy, 1);
    return err != 0 ? fail(rt, err) : 0;
  }
  if (err != 0) return err;
  if (rt->trace) trace_write(rt, "record_stream", ptr, blk.requested, s);
  return 0;
}

/* ---- private pools: lifecycle (Note [Pools]; the public calls are pools.c's) -- */

/* A child records into its parent's history (under the parent's `lock`). */
static void child_share_history(gmr_runtime_t *rt, gmr_runtime_t *c) {
  gmr_history_t *h = atomic_load_explicit(&rt->history, memory_order_relaxed);
  gmr__recording_attach(c->backend, h);
  atomic_store_explicit(&c->history, h, memory_order_release);
  if (h != NULL)
    atomic_fetch_or_explicit(&c->slow, RUNTIME_SLOW_HISTORY, memory_order_release);
  else
    atomic_fetch_and_explicit(&c->slow, ~RUNTIME_SLOW_HISTORY, memory_order_release);
}

int gmr__runtime_pool_new(gmr_runtime_t *rt, gmr_runtime_t **out) {
  static _Atomic uint64_t pool_ids;
  if (rt->parent != NULL)
    return fail(rt, gmr__error_set(GMR_EINVAL, "gmr_pool_create: a pool has no pools of its own"));
  gmr_runtime_t *c = NULL;
  int err = runtime_build(rt->cfg, NULL, rt->device, rt, false, &c);
  if (err != 0) return fail(rt, err);
  c->pool_id = atomic_fetch_add(&pool_ids, 1) + 1;
  c->pool_uses = 1;
  gmr__lock(&rt->lock);
  child_share_history(rt, c);
  c->next_child = rt->children;
  rt->children = c;
  atomic_fetch_or_explicit(&rt->slow, RUNTIME_SLOW_POOLS, memory_order_release);
  gmr__unlock(&rt->lock);
  *out = c;
  return 0;
}

gmr_runtime_t *gmr__runtime_pool_parent(gmr_runtime_t *c) {
  return c->parent;
}
uint64_t gmr__runtime_pool_id(const gmr_runtime_t *c) {
  return c->pool_id;
}

int gmr__runtime_pool_uses(gmr_runtime_t *c, int delta) {
  gmr_runtime_t *rt = c->parent;
  gmr__lock(&rt->lock);
  int uses = c->pool_uses;
  if (delta < 0 && uses == 0) {
    gmr__unlock(&rt->lock);
    return -1;
  }
  c->pool_uses = uses + delta;
  gmr__unlock(&rt->lock);
  return uses + delta;
}

int gmr__runtime_pool_route(gmr_runtime_t *c, gmr_stream_t s, bool on) {
  gmr_runtime_t *rt = c->parent;
  int err = 0;
  gmr__lock(&rt->lock);
  size_t n = atomic_load_explicit(&rt->nroutes, memory_order_relaxed);
  if (on && c->pool_uses == 0) {
    err = gmr__error_set(GMR_EINVAL, "gmr_pool_begin: the pool was released (use count 0)");
  } else if (on) {
    if (n == rt->nroutes_cap) {
      size_t cap = n ? 2 * n : 4;
      pool_route_t *v = gmr__realloc(rt->routes, cap * sizeof *v);
      if (v == NULL) err = gmr__error_set(GMR_ENOMEM, "gmr_pool_begin: out of host memory");
      if (v != NULL) rt->routes = v, rt->nroutes_cap = cap;
    }
    if (err == 0) {
      rt->routes[n] = (pool_route_t){c, s};
      atomic_store_explicit(&rt->nroutes, n + 1, memory_order_release);
    }
  } else {
    size_t i = n;
    while (i-- > 0 && !(rt->routes[i].child == c && rt->routes[i].stream == s)) {
    }
    if (i == SIZE_MAX) {
      err = gmr__error_set(GMR_EINVAL, "gmr_pool_end: pool %" PRIu64 " has no route for stream %p",
                           c->pool_id, s);
    } else {
      memmove(&rt->routes[i], &rt->routes[i + 1], (n - i - 1) * sizeof rt->routes[0]);
      atomic_store_explicit(&rt->nroutes, n - 1, memory_order_release);
    }
  }
  gmr__unlock(&rt->lock);
  return err != 0 ? fail(rt, err) : 0;
}

/* gmr_alloc in pool c, unless its use count is 0. */
int gmr__runtime_pool_alloc(gmr_runtime_t *c, size_t size, gmr_stream_t s, void **out_ptr) {
  gmr_runtime_t *rt = c->parent;
  gmr__lock(&rt->lock);
  bool open = c->pool_uses > 0;
  if (open) atomic_fetch_add(&c->busy, 1);
  gmr__unlock(&rt->lock);
  if (!open)
    return fail(
        rt, gmr__error_set(GMR_EINVAL, "gmr_alloc_in: pool %" PRIu64 " was released", c->pool_id));
  return alloc_in_child(rt, c, size, s, out_ptr);
}

/* The pool whose map holds ptr (NULL: none); *in_parent when the parent's does. */
gmr_runtime_t *gmr__runtime_pool_of(gmr_runtime_t *rt, const void *ptr, bool *in_parent) {
  uint64_t h = map_hash(ptr);
  map_shard_t *sh = map_shard(rt, h);
  gmr__policy_lock(rt->policy);
  map_lock(rt, sh);
  *in_parent = map_find(sh, ptr, h) != MAP_NONE;
  map_unlock(rt, sh);
  gmr__policy_unlock(rt->policy);
  if (*in_parent || !has_pools(rt)) return NULL;
  gmr_runtime_t *c = child_holding(rt, ptr);
  if (c != NULL) atomic_fetch_sub(&c->busy, 1);
  return c;
}

/* Live allocations in rt's map. */
static size_t map_live(gmr_runtime_t *rt) {
  size_t live = 0;
  gmr__policy_lock(rt->policy);
  for (int k = 0; k < MAP_SHARDS; ++k) {
    map_lock(rt, &rt->shards[k]);
    live += rt->shards[k].count;
    map_unlock(rt, &rt->shards[k]);
  }
  gmr__policy_unlock(rt->policy);
  return live;
}

/* Visit the live allocations of pool c (pointer, requested size). */
int gmr__runtime_pool_foreach_live(gmr_runtime_t *c, gmr_ptr_cb cb, void *ud) {
  size_t n = 0, cap = map_live(c) + 16;
  gmr_block_t *v = gmr__malloc(cap * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "gmr_pool_foreach_live: out of host memory");
  gmr__policy_lock(c->policy);
  for (int k = 0; k < MAP_SHARDS; ++k) {
    map_shard_t *sh = &c->shards[k];
    map_lock(c, sh);
    for (size_t i = 0; i <= sh->mask && n < cap; ++i)
      if (sh->slots[i].ptr != NULL) v[n++] = sh->slots[i];
    map_unlock(c, sh);
  }
  gmr__policy_unlock(c->policy);
  for (size_t i = 0; i < n; ++i)
    if (cb(v[i].ptr, v[i].requested, ud) != 0) break;
  gmr__free(v);
  return 0;
}

/* Note [One retry]
 * PyTorch retries a failed allocation once, after freeing every pool's
 * cached blocks, and counts one retry and one OOM (num_alloc_retries,
 * num_ooms).  A gmr policy makes that retry itself with its own cache; the
 * runtime tries the allocation again only when trimming the released pools
 * (and, for a pool's request, the parent) gave bytes back to the device, so
 * a failed allocation with nothing more to free counts once, as PyTorch's.
 */

/* gmr_empty_cache's part for the pools: trim the released ones (use count
 * 0), and close those that then hold nothing (PyTorch frees a private pool's
 * cached blocks once no graph uses it).  *released (if not NULL) gets the
 * bytes the trimmed pools held from the device before and not after. */
int gmr__runtime_pools_trim(gmr_runtime_t *rt, uint64_t *released) {
  int err = 0;
  uint64_t gave = 0;
  gmr__lock(&rt->lock);
  for (gmr_runtime_t **pc = &rt->children, *c; (c = *pc) != NULL;) {
    if (c->sleep_face != NULL && !atomic_load(&c->asleep)) { /* an awake tag's cache goes too */
      int e = gmr__policy_trim(c->policy);
      if (e != 0 && err == 0) err = e;
    }
    if (c->pool_uses > 0 || atomic_load(&c->busy) > 0 || c->tag != NULL) { /* tags stay */
      pc = &c->next_child;
      continue;
    }
    uint64_t held = released != NULL ? policy_reserved(c) : 0;
    int e = gmr__policy_trim(c->policy);
    if (e != 0 && err == 0) err = e;
    if (released != NULL) {
      uint64_t now = policy_reserved(c);
      gave += held > now ? held - now : 0;
    }
    if (e != 0 || map_live(c) != 0) {
      pc = &c->next_child;
      continue;
    }
    *pc = c->next_child;
    size_t n = atomic_load_explicit(&rt->nroutes, memory_order_relaxed), kept = 0;
    for (size_t i = 0; i < n; ++i)
      if (rt->routes[i].child != c) rt->routes[kept++] = rt->routes[i];
    atomic_store_explicit(&rt->nroutes, kept, memory_order_release);
    gmr__runtime_pool_retire(rt, c);
    (void)gmr_runtime_close(c);
  }
  if (rt->children == NULL)
    atomic_fetch_and_explicit(&rt->slow, ~RUNTIME_SLOW_POOLS, memory_order_release);
  gmr__unlock(&rt->lock);
  if (released != NULL) *released = gave;
  return err;
}

int gmr__runtime_pool_trim(gmr_runtime_t *c) {
  if (c->sleep_face != NULL && atomic_load(&c->asleep)) return 0; /* its memory went at sleep */
  int err = gmr__policy_trim(c->policy);
  return err != 0 ? fail(c->parent, err) : 0;
}

gmr_backend_t *gmr__runtime_gate(gmr_runtime_t *rt) {
  return rt->gate;
}

int gmr__runtime_history_observe(gmr_runtime_t *rt, gmr_history_cb cb, void *ud) {
  if (cb != NULL && history_of(rt) == NULL) {
    int err = gmr_history_enable(rt, 1);
    if (err != 0) return err;
  }
  gmr__lock(&rt->lock);
  if (rt->history_store != NULL) gmr__history_set_observer(rt->history_store, cb, ud);
  gmr__unlock(&rt->lock);
  return 0;
}

int gmr_empty_cache(gmr_runtime_t *rt) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_empty_cache: the runtime is NULL");
  int err = gmr__policy_trim(rt->policy);
  if (err != 0) return err;
  if (has_pools(rt) && (err = gmr__runtime_pools_trim(rt, NULL)) != 0) return fail(rt, err);
  if (rt->trace) trace_write(rt, "empty_cache", NULL, 0, NULL);
  return 0;
}

void gmr_runtime_set_exclusive(gmr_runtime_t *rt, int exclusive) {
  if (rt != NULL) gmr__policy_set_exclusive(rt->policy, exclusive);
}

int gmr_charge(gmr_runtime_t *rt, int64_t bytes) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_charge: the runtime is NULL");
  return bytes == 0 ? 0 : gmr__policy_charge(rt->policy, bytes);
}

int gmr_alloc_size(gmr_runtime_t *rt, void *ptr, size_t *out_requested, size_t *out_allocated) {
  if (rt == NULL || ptr == NULL || out_requested == NULL || out_allocated == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_alloc_size: NULL argument");
  uint64_t h = map_hash(ptr);
  map_shard_t *sh = map_shard(rt, h);
  gmr__policy_lock(rt->policy);
  map_lock(rt, sh);
  size_t slot = map_find(sh, ptr, h);
  if (slot != MAP_NONE) {
    *out_requested = sh->slots[slot].requested;
    *out_allocated = sh->slots[slot].size;
  }
  map_unlock(rt, sh);
  gmr__policy_unlock(rt->policy);
  if (slot != MAP_NONE) return 0;
  gmr_runtime_t *child = has_pools(rt) ? child_holding(rt, ptr) : NULL;
  if (child == NULL) return bad_pointer(rt, "gmr_alloc_size", ptr);
  int err = gmr_alloc_size(child, ptr, out_requested, out_allocated);
  atomic_fetch_sub(&child->busy, 1);
  return err;
}

const char *gmr_runtime_policy(gmr_runtime_t *rt) {
  return rt ? rt->policy_name : "";
}
const char *gmr_runtime_backend(gmr_runtime_t *rt) {
  return rt ? rt->backend->ops->name : "";
}

int gmr_mem_info(gmr_runtime_t *rt, size_t *out_free, size_t *out_total) {
  if (rt == NULL || out_free == NULL || out_total == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_mem_info: NULL argument");
  size_t f, t;
  int err = gmr__backend_mem_info(rt->backend, &f, &t);
  if (err != 0) return fail(rt, err);
  *out_free = f;
  *out_total = t;
  return 0;
}

int gmr_history_enable(gmr_runtime_t *rt, size_t max_entries) {
  if (rt == NULL) return gmr__error_set(GMR_EINVAL, "gmr_history_enable: the runtime is NULL");
  int err = 0;
  gmr__lock(&rt->lock);
  if (rt->parent != NULL) {
    gmr__unlock(&rt->lock);
    return fail(rt, gmr__error_set(GMR_EINVAL, "gmr_history_enable: a pool records into its "
                                               "runtime's history"));
  }
  if (max_entries == 0) {
    atomic_store(&rt->history, NULL);
    atomic_fetch_and(&rt->slow, ~RUNTIME_SLOW_HISTORY);
    gmr__recording_attach(rt->backend, NULL);
    if (rt->history_store != NULL) {
      gmr__history_clear(rt->history_store);
      gmr__history_set_observer(rt->history_store, NULL, NULL);
    }
  } else {
    if (rt->history_store == NULL)
      err = gmr__history_new(rt->backend, max_entries, &rt->history_store);
    else
      err = gmr__history_resize(rt->history_store, max_entries);
    if (err == 0) {
      gmr__recording_attach(rt->backend, rt->history_store); /* release, too */
      /* Release: publishes the history's initialization (history_of). */
      atomic_store_explicit(&rt->history, rt->history_store, memory_order_release);
      atomic_fetch_or_explicit(&rt->slow, RUNTIME_SLOW_HISTORY, memory_order_release);
    }
  }
  for (gmr_runtime_t *c = rt->children; c != NULL; c = c->next_child)
    child_share_history(rt, c);
  gmr__unlock(&rt->lock);
  return err ? fail(rt, err) : 0;
}

gmr_policy_t *gmr__runtime_policy(gmr_runtime_t *rt) {
  return rt->policy;
}
gmr_backend_t *gmr__runtime_backend(gmr_runtime_t *rt) {
  return rt->backend;
}
struct gmr_history_s *gmr__runtime_history(gmr_runtime_t *rt) {
  return history_of(rt);
}
gmr_backend_t *gmr__runtime_device_backend(gmr_runtime_t *rt) {
  return rt->dev;
}

size_t gmr__runtime_map_shard_of(const void *ptr) {
  return map_shard_index(map_hash(ptr));
}

size_t gmr__runtime_map_longest_probe(gmr_runtime_t *rt) {
  size_t longest = 0;
  gmr__policy_lock(rt->policy);
  for (int s = 0; s < MAP_SHARDS; ++s) {
    map_shard_t *sh = &rt->shards[s];
    map_lock(rt, sh);
    for (size_t i = 0; i <= sh->mask; ++i) {
      if (sh->slots[i].ptr == NULL) continue;
      size_t home = map_hash(sh->slots[i].ptr) & sh->mask;
      size_t probe = ((i - home) & sh->mask) + 1;
      if (probe > longest) longest = probe;
    }
    map_unlock(rt, sh);
  }
  gmr__policy_unlock(rt->policy);
  return longest;
}

bool gmr__runtime_has_outputs(gmr_runtime_t *rt) {
  return rt->snapshot_path != NULL || rt->trace != NULL;
}

void gmr__runtime_write_outputs(gmr_runtime_t *rt) {
  if (rt->snapshot_path != NULL) (void)snapshot_at_end(rt);
  if (rt->trace != NULL) (void)gmr__trace_flush(rt->trace);
}
