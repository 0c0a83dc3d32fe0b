/* limit.c: the `limit` policy, a hard cap stacked on any other policy.
 *
 * A decorator (RMM's limiting_resource_adaptor, without exceptions).  The cap
 * is `bytes`, or `fraction` of the device's total memory, and counts the
 * bytes allocated or the bytes the upstream reserved (Note [Counts]).  The
 * cap is on this runtime, not a representation of the device.
 * Map: Note [Counts], [Shared cap], [Credit], [Locking].
 */
#include <stdatomic.h>
#include <string.h>

#include "core/lock.h"
#include "core/shared-cap.h"
#include "policy.h"

/* Note [Counts]
 *  - counts: allocated (default).  The bytes the user has asked for and not
 *    freed.  An allocation that would pass the cap fails with GMR_ENOMEM
 *    before the upstream policy, or the device, is touched:
 *        in_use + size > cap  =>  GMR_ENOMEM, nothing changes
 *  - counts: reserved.  The device memory the upstream policy holds (segments
 *    and mapped pages).  The upstream gets a backend whose reservations fail
 *    past the cap, so it reacts as it would to a full device (a caching
 *    policy frees its cache and retries):
 *        reserved + request > cap  =>  the reservation fails with GMR_ENOMEM
 *    This is the whole-process budget a serving stack wants: what the policy
 *    holds never passes the cap, cache included.
 */

/* Note [Shared cap]
 * With `shared: {cap: ...}` the capped backend also reserves every device byte
 * through the device's shared-cap file (lib/core/shared-cap.c,
 * docs/shared-cap.md), after this process's own cap and before the device:
 *     Σ over processes max(reserved_p, guaranteed_p) <= shared cap
 * A refusal there is an out-of-memory of the backend like the local one, so
 * the upstream frees its cache and retries, then reports its framework's
 * OOM.  Only reservations and page maps pass there: an allocation the
 * upstream serves from its cache never does.  A lock held past the timeout
 * by a stopped process is reported the same way, with its own text.
 */

/* Note [Credit]
 * A counter that every allocation and free of every thread updates is one
 * cache line bouncing between cores: with 16 threads it caps the aggregate
 * rate at the line's transfer time, whatever the upstream policy can do.  So
 * the cap is split into credit: `pool` holds the bytes of the cap that no
 * shard holds, and each of LIMIT_SHARDS shards (chosen by the block's stream)
 * holds `credit`, bytes it may hand out without asking anyone:
 *     pool + Σ shard credit + in_use = cap,   in_use = Σ requested of live blocks
 * An allocation takes its size from its shard's credit (one atomic on the
 * shard's own line); a free gives it back there.  A shard short of credit
 * takes `size + chunk` from the pool under `pool_lock`; if the pool is short
 * too, every shard's credit is drained into it, so pool = cap - in_use
 * exactly, and the request fails only if in_use + size > cap: the same
 * answer as one counter, at the same moment.  A shard holding more than
 * 4 chunks after a free returns the excess to the pool.
 */

/* Note [Locking]
 * Concurrent.  Shard credit, `pool`, `refused` and the reserved count are
 * atomics; `pool` and the drain change only under `pool_lock`.  The upstream
 * is called through the policy.h wrappers, which take its own lock when it is
 * not concurrent and supply its empty slots' defaults; the whole-state ops run
 * with the upstream quiesced (limit_quiesce) and call its *_locked forms.
 */

typedef struct limit_shared_opts_s {
  uint64_t cap;        /* bytes for all processes on the device; 0: not shared */
  uint64_t guaranteed; /* bytes no other process can take from this one */
  char *label;         /* for gmr-top; NULL: none */
  char *path;          /* the file; NULL: one per user and device in /dev/shm */
  double timeout;      /* seconds to wait for the file's lock; 0: 1 s */
  int shared_by;       /* LIMIT_SHARED_BY_*: whom the file may be writable by */
} limit_shared_opts_t;

typedef struct limit_opts_s {
  uint64_t bytes;  /* the cap in bytes; 0: use fraction */
  double fraction; /* of the device's total memory; 0: use bytes */
  int counts;      /* LIMIT_COUNTS_* */
  limit_shared_opts_t shared;
} limit_opts_t;

enum { LIMIT_COUNTS_ALLOCATED = 0, LIMIT_COUNTS_RESERVED = 1 };
static const char *const limit_counts_names[] = {"allocated", "reserved", NULL};
enum { LIMIT_SHARED_BY_USER = 0, LIMIT_SHARED_BY_GROUP = 1 };
static const char *const limit_shared_by_names[] = {"user", "group", NULL};

/* A backend that forwards to the real one and refuses memory past the cap. */
typedef struct limit_backend_s {
  gmr_backend_t base; /* must be first */
  gmr_backend_t *real;
  uint64_t cap;          /* bytes */
  _Atomic uint64_t held; /* bytes reserved or mapped through this backend */
  gmr_scap_t *shared;    /* the device's shared cap; NULL: none */
} limit_backend_t;

#define LIMIT_SHARDS 64 /* a power of two */

typedef struct limit_shard_s {
  _Alignas(64) _Atomic uint64_t credit; /* bytes of the cap this shard may hand out */
} limit_shard_t;

typedef struct limit_s {
  gmr_policy_t base; /* must be first; base.upstream is the wrapped policy */
  uint64_t cap;      /* bytes */
  int counts;
  uint64_t chunk;           /* bytes a shard takes from the pool beyond its request */
  _Atomic uint64_t refused; /* allocations refused by the cap */
  limit_backend_t *lbe;     /* counts == reserved: the upstream's backend */
  void *raw;                /* what gmr__calloc returned (the limit_t is aligned inside it) */
  _Alignas(64) gmr_lock_t pool_lock; /* guards changes of `pool` and drains */
  _Atomic uint64_t pool;             /* counts == allocated: bytes of the cap held by no shard */
  _Atomic uint64_t external;         /* bytes charged from outside gmr (gmr_charge) */
  limit_shard_t shards[LIMIT_SHARDS];
} limit_t;

static int limit_refusal(uint64_t cap, uint64_t request, uint64_t in_use, const char *what) {
  char c[32], r[32], u[32];
  gmr__format_size(cap, c, sizeof c);
  gmr__format_size(request, r, sizeof r);
  gmr__format_size(in_use, u, sizeof u);
  return gmr__error_set(GMR_ENOMEM,
                        "out of memory: limit of %s (%llu bytes) reached. Tried to allocate %s "
                        "(%llu bytes) with %s (%llu bytes) %s.",
                        c, (unsigned long long)cap, r, (unsigned long long)request, u,
                        (unsigned long long)in_use, what);
}

/* Reserve `n` bytes of the cap; false when that would pass it. */
static bool take(_Atomic uint64_t *held, uint64_t cap, uint64_t n, uint64_t *seen) {
  uint64_t cur = atomic_load(held);
  do {
    *seen = cur;
    if (n > cap || cur > cap - n) return false;
  } while (!atomic_compare_exchange_weak(held, &cur, cur + n));
  return true;
}

/* ---- the capped backend (counts: reserved) -------------------------------- */

static limit_backend_t *lbe_of(gmr_backend_t *be) {
  return (limit_backend_t *)be;
}

/* Count n bytes against this process's cap, then the shared one (if any);
 * on failure nothing is counted. */
static int lbe_take(limit_backend_t *l, uint64_t n) {
  uint64_t seen;
  if (!take(&l->held, l->cap, n, &seen))
    return limit_refusal(l->cap, n, seen, "reserved on the device");
  if (l->shared == NULL) return 0;
  int err = gmr__scap_reserve(l->shared, n);
  if (GMR_LIKELY(err == 0)) return 0;
  atomic_fetch_sub(&l->held, n);
  /* A lock that stayed held is an out-of-memory for the policy too: it
   * frees its cache, retries, then fails with its framework's error. */
  if (err == GMR_EBUSY) err = gmr__error_set(GMR_ENOMEM, "out of memory: %s", gmr__error_last());
  return err;
}

static void lbe_give(limit_backend_t *l, uint64_t n) {
  atomic_fetch_sub(&l->held, n);
  if (l->shared != NULL) gmr__scap_release(l->shared, n);
}

/* see Note [Counts] */
static int lbe_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out) {
  limit_backend_t *l = lbe_of(be);
  int err = lbe_take(l, size);
  if (err != 0) return err;
  err = gmr__backend_reserve(l->real, size, s, out);
  if (err != 0) lbe_give(l, size);
  return err;
}

static int lbe_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  limit_backend_t *l = lbe_of(be);
  int err = gmr__backend_release(l->real, ptr, size, s);
  if (err == 0) lbe_give(l, size);
  return err;
}

static int lbe_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  limit_backend_t *l = lbe_of(be);
  int err = lbe_take(l, size);
  if (err != 0) return err;
  err = gmr__backend_map(l->real, addr, size, s);
  if (err != 0) lbe_give(l, size);
  return err;
}

static int lbe_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  limit_backend_t *l = lbe_of(be);
  int err = gmr__backend_unmap(l->real, addr, size, s);
  if (err == 0) lbe_give(l, size);
  return err;
}

static int lbe_va_reserve(gmr_backend_t *be, size_t size, void **out) {
  return gmr__backend_va_reserve(lbe_of(be)->real, size, out);
}
static int lbe_va_release(gmr_backend_t *be, void *base, size_t size) {
  return gmr__backend_va_release(lbe_of(be)->real, base, size);
}
/* The device as the upstream sees it: `cap` bytes, of which `held` are used;
 * free is also no more than what the shared cap leaves this process. */
static int lbe_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  limit_backend_t *l = lbe_of(be);
  size_t f, t;
  int err = gmr__backend_mem_info(l->real, &f, &t);
  if (err != 0) return err;
  uint64_t held = atomic_load(&l->held);
  uint64_t room = l->cap > held ? l->cap - held : 0;
  if (l->shared != NULL) {
    gmr_scap_view_t v;
    gmr__scap_view(l->shared, &v);
    if (v.room < room) room = v.room;
  }
  *out_free = f < room ? f : room;
  *out_total = t < l->cap ? t : l->cap;
  return 0;
}
static int lbe_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out) {
  return gmr__backend_event_record(lbe_of(be)->real, s, out);
}
static int lbe_event_query(gmr_backend_t *be, gmr_event_t ev) {
  return gmr__backend_event_query(lbe_of(be)->real, ev);
}
static int lbe_event_sync(gmr_backend_t *be, gmr_event_t ev) {
  return gmr__backend_event_sync(lbe_of(be)->real, ev);
}
static void lbe_event_destroy(gmr_backend_t *be, gmr_event_t ev) {
  gmr__backend_event_destroy(lbe_of(be)->real, ev);
}
static int lbe_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  return gmr__backend_stream_sync(lbe_of(be)->real, s);
}
static int lbe_device_sync(gmr_backend_t *be) {
  return gmr__backend_device_sync(lbe_of(be)->real);
}
static uint64_t lbe_now_ns(gmr_backend_t *be) {
  return gmr__backend_now_ns(lbe_of(be)->real);
}
/* Page handles (the stitch policy): a created page counts against the cap
 * like a reservation; mappings of it hold no memory of their own. */
static int lbe_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  limit_backend_t *l = lbe_of(be);
  int err = lbe_take(l, size);
  if (err != 0) return err;
  err = gmr__backend_phys_create(l->real, size, out);
  if (err != 0) lbe_give(l, size);
  return err;
}
static int lbe_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  limit_backend_t *l = lbe_of(be);
  int err = gmr__backend_phys_release(l->real, h, size);
  if (err == 0) lbe_give(l, size);
  return err;
}
static int lbe_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t off) {
  return gmr__backend_phys_map(lbe_of(be)->real, addr, size, h, off);
}
static int lbe_set_access(gmr_backend_t *be, void *addr, size_t size) {
  return gmr__backend_set_access(lbe_of(be)->real, addr, size);
}
static int lbe_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  return gmr__backend_phys_unmap(lbe_of(be)->real, addr, size);
}
static int lbe_stream_capturing(gmr_backend_t *be, gmr_stream_t s) {
  return gmr__backend_stream_capturing(lbe_of(be)->real, s);
}
static void lbe_destroy(gmr_backend_t *be) {
  gmr__free(be);
}

static const gmr_backend_ops_t lbe_ops = {
    .name = "limit",
    .reserve = lbe_reserve,
    .release = lbe_release,
    .va_reserve = lbe_va_reserve,
    .va_release = lbe_va_release,
    .map = lbe_map,
    .unmap = lbe_unmap,
    .mem_info = lbe_mem_info,
    .phys_create = lbe_phys_create,
    .phys_release = lbe_phys_release,
    .phys_map = lbe_phys_map,
    .set_access = lbe_set_access,
    .phys_unmap = lbe_phys_unmap,
    .stream_capturing = lbe_stream_capturing,
    .event_record = lbe_event_record,
    .event_query = lbe_event_query,
    .event_sync = lbe_event_sync,
    .event_destroy = lbe_event_destroy,
    .stream_sync = lbe_stream_sync,
    .device_sync = lbe_device_sync,
    .now_ns = lbe_now_ns,
    .destroy = lbe_destroy,
};

/* ---- the policy -------------------------------------------------------------- */

static int limit_validate(void *o, char *err, size_t len) {
  limit_opts_t *opts = o;
  if ((opts->bytes == 0) == (opts->fraction == 0)) {
    snprintf(err, len, "give exactly one of 'bytes' (e.g. 8GiB) or 'fraction' (in (0, 1])");
    return GMR_ECONFIG;
  }
  const limit_shared_opts_t *sh = &opts->shared;
  bool shared = sh->guaranteed || sh->label || sh->path || sh->timeout != 0 || sh->shared_by;
  if (sh->cap == 0 && shared) {
    snprintf(err, len, "'shared' needs 'cap': the bytes all processes on the device may hold");
    return GMR_ECONFIG;
  }
  if (sh->cap == 0) return 0;
  if (opts->counts != LIMIT_COUNTS_RESERVED) {
    snprintf(err, len, "'shared' caps device memory across processes: it needs 'counts: reserved'");
    return GMR_ECONFIG;
  }
  if (sh->guaranteed > sh->cap) {
    snprintf(err, len, "'shared.guaranteed' is more than 'shared.cap'");
    return GMR_ECONFIG;
  }
  if (opts->bytes != 0 && sh->guaranteed > opts->bytes) {
    snprintf(err, len, "'shared.guaranteed' is more than this process's quota 'bytes'");
    return GMR_ECONFIG;
  }
  if (sh->label && strlen(sh->label) > 63) {
    snprintf(err, len, "'shared.label' is longer than 63 bytes");
    return GMR_ECONFIG;
  }
  if (sh->path && (sh->path[0] == '\0' || strlen(sh->path) > 511)) {
    snprintf(err, len, "'shared.path' must be a file name of 1 to 511 bytes");
    return GMR_ECONFIG;
  }
  return 0;
}

static void limit_opts_release(void *o) {
  limit_opts_t *opts = o;
  gmr__free(opts->shared.label);
  gmr__free(opts->shared.path);
  opts->shared.label = opts->shared.path = NULL;
}

/* Attach the capped backend to the device's shared cap. */
/* see Note [Shared cap] */
static int limit_share(limit_backend_t *lbe, const limit_shared_opts_t *sh) {
  char id[128];
  int err = gmr__backend_device_id(lbe->real, id, sizeof id);
  if (err != 0) return err;
  if (sh->guaranteed > lbe->cap)
    return gmr__error_set(GMR_ECONFIG,
                          "limit: 'shared.guaranteed' (%llu bytes) is more than this process's "
                          "cap (%llu bytes)",
                          (unsigned long long)sh->guaranteed, (unsigned long long)lbe->cap);
  gmr_scap_opts_t so = {.path = sh->path,
                        .device_id = id,
                        .cap = sh->cap,
                        .quota = lbe->cap,
                        .guaranteed = sh->guaranteed,
                        .label = sh->label,
                        .timeout_s = sh->timeout,
                        .group = sh->shared_by == LIMIT_SHARED_BY_GROUP};
  return gmr__scap_attach(&so, &lbe->shared);
}

static int limit_create(const void *o, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                        gmr_policy_t **out) {
  const limit_opts_t *opts = o;
  uint64_t cap = opts->bytes;
  if (cap == 0) {
    size_t f, total;
    int err = gmr__backend_mem_info(be, &f, &total);
    if (err != 0) return err;
    cap = (uint64_t)(opts->fraction * (double)total);
  }
  void *raw = gmr__calloc(1, sizeof(limit_t) + 63);
  if (raw == NULL) return gmr__error_set(GMR_ENOMEM, "limit: out of host memory");
  limit_t *l = gmr__align_ptr(raw, 64);
  l->raw = raw;
  l->base.ops = &gmr__limit_policy;
  l->base.backend = be;
  l->cap = cap;
  l->counts = opts->counts;
  /* A shard's refill: enough for many allocations, small beside the cap. */
  l->chunk = cap / (8 * LIMIT_SHARDS);
  if (l->chunk > ((uint64_t)64 << 20)) l->chunk = (uint64_t)64 << 20;
  atomic_init(&l->pool, cap);
  for (int i = 0; i < LIMIT_SHARDS; ++i)
    atomic_init(&l->shards[i].credit, 0);
  gmr_backend_t *up_be = be;
  int err = GMR_ENOMEM;
  if (gmr__lock_init(&l->pool_lock) != 0) goto fail_pool_lock;
  if (l->counts == LIMIT_COUNTS_RESERVED) {
    l->lbe = gmr__calloc(1, sizeof *l->lbe);
    if (l->lbe == NULL) goto fail_lbe;
    l->lbe->base.ops = &lbe_ops;
    l->lbe->base.granularity = be->granularity;
    l->lbe->base.device = be->device;
    l->lbe->real = be;
    l->lbe->base.forwards_to = be;
    l->lbe->cap = cap;
    up_be = &l->lbe->base;
    if (opts->shared.cap != 0 && (err = limit_share(l->lbe, &opts->shared)) != 0) goto fail_share;
  }
  err = gmr__policy_create(upstream, up_be, &l->base.upstream);
  if (err != 0) goto fail_upstream;
  *out = &l->base;
  return 0;
fail_upstream:
  if (l->lbe) gmr__scap_detach(l->lbe->shared);
fail_share:
  gmr__free(l->lbe);
fail_lbe:
  gmr__lock_destroy(&l->pool_lock);
fail_pool_lock:
  gmr__free(raw);
  if (err == GMR_ENOMEM && gmr__error_last()[0] == '\0')
    gmr__error_set(GMR_ENOMEM, "limit: out of host memory");
  return err;
}

static void limit_destroy(gmr_policy_t *self) {
  limit_t *l = (limit_t *)self;
  gmr__policy_destroy(self->upstream);
  if (l->lbe) gmr__scap_detach(l->lbe->shared); /* after the upstream gave its memory back */
  gmr__free(l->lbe);
  gmr__lock_destroy(&l->pool_lock);
  gmr__free(l->raw);
}

/* ---- the allocated-bytes count: shard credit and the pool ---------------------- */

/* A shard's credit while a drain holds it: takes and gives wait for the drain
 * (they go through pool_lock), so the drain sees every shard at rest. */
#define LIMIT_FROZEN UINT64_MAX

/* The shard that charges from outside gmr count in (no real stream). */
#define LIMIT_EXTERNAL_STREAM ((gmr_stream_t)(uintptr_t)0x6578746572ull)

static inline limit_shard_t *shard_of(limit_t *l, gmr_stream_t s) {
  _Static_assert(LIMIT_SHARDS == 1 << 6, "a stream's shard takes 6 bits");
  return &l->shards[gmr__hash_bits((uint64_t)(uintptr_t)s, 6)]; /* the top 6 bits of its hash */
}

/* Take n bytes of the shard's credit; false when it holds less, or is frozen. */
static inline bool shard_take(limit_shard_t *sh, uint64_t n) {
  uint64_t c = atomic_load_explicit(&sh->credit, memory_order_relaxed);
  while (c >= n && c != LIMIT_FROZEN)
    if (atomic_compare_exchange_weak_explicit(&sh->credit, &c, c - n, memory_order_acq_rel,
                                              memory_order_relaxed))
      return true;
  return false;
}

/* pool + Σ credit: the part of the cap not in use (<= cap). */
static uint64_t limit_unused(limit_t *l) {
  gmr__lock(&l->pool_lock); /* no shard is frozen while this is held */
  uint64_t unused = atomic_load(&l->pool);
  for (int i = 0; i < LIMIT_SHARDS; ++i)
    unused += atomic_load(&l->shards[i].credit);
  gmr__unlock(&l->pool_lock);
  return unused;
}

/* The bytes in use: cap - pool - Σ credit.  Exact when no allocation or free
 * is under way; a snapshot otherwise. */
static uint64_t limit_in_use(limit_t *l) {
  uint64_t unused = limit_unused(l);
  return unused < l->cap ? l->cap - unused : 0;
}

/* n bytes for an allocation whose shard is short: from the pool (with up to a
 * chunk more for the shard), else after draining every shard into the pool.
 * During the drain every shard is frozen, so once all are drained
 *     pool = cap - in_use   exactly;
 * false, with in_use in *seen, when in_use + n > cap.  Caller: no lock held. */
/* see Note [Credit] */
static bool limit_refill(limit_t *l, limit_shard_t *sh, uint64_t n, uint64_t *seen) {
  gmr__lock(&l->pool_lock);
  uint64_t pool = atomic_load(&l->pool);
  if (pool < n) {
    for (int i = 0; i < LIMIT_SHARDS; ++i)
      pool += atomic_exchange(&l->shards[i].credit, LIMIT_FROZEN);
    bool fits = pool >= n;
    if (!fits) *seen = l->cap - pool;
    for (int i = 0; i < LIMIT_SHARDS; ++i)
      atomic_store(&l->shards[i].credit, 0);
    if (!fits) {
      atomic_store(&l->pool, pool);
      gmr__unlock(&l->pool_lock);
      return false;
    }
  }
  uint64_t extra = pool - n < l->chunk ? pool - n : l->chunk;
  atomic_store(&l->pool, pool - n - extra);
  if (extra != 0) atomic_fetch_add(&sh->credit, extra);
  gmr__unlock(&l->pool_lock);
  return true;
}

/* The rest of limit_give: n bytes (0 if already given) go to the pool, and
 * the shard's credit past one chunk too. */
static void limit_give_slow(limit_t *l, limit_shard_t *sh, uint64_t n) {
  gmr__lock(&l->pool_lock); /* waits for a drain to end */
  uint64_t c = atomic_load(&sh->credit);
  while (c > l->chunk && !atomic_compare_exchange_weak(&sh->credit, &c, l->chunk)) {
  }
  uint64_t excess = c > l->chunk ? c - l->chunk : 0;
  atomic_fetch_add(&l->pool, n + excess);
  gmr__unlock(&l->pool_lock);
}

/* Give n bytes back: to the shard; to the pool while a drain freezes the
 * shard; and past 4 chunks in the shard, the excess goes to the pool so that
 * credit does not pile up where nobody allocates. */
static inline void limit_give(limit_t *l, limit_shard_t *sh, uint64_t n) {
  uint64_t c = atomic_load_explicit(&sh->credit, memory_order_relaxed);
  while (c != LIMIT_FROZEN) {
    if (atomic_compare_exchange_weak_explicit(&sh->credit, &c, c + n, memory_order_acq_rel,
                                              memory_order_relaxed)) {
      if (GMR_LIKELY(c + n <= 4 * l->chunk)) return;
      limit_give_slow(l, sh, 0);
      return;
    }
  }
  limit_give_slow(l, sh, n);
}

/* see Note [Credit] */
static int limit_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  limit_t *l = (limit_t *)self;
  limit_shard_t *sh = NULL;
  if (l->counts == LIMIT_COUNTS_ALLOCATED) {
    sh = shard_of(l, s);
    uint64_t seen;
    if (!shard_take(sh, size) && !limit_refill(l, sh, size, &seen)) {
      atomic_fetch_add(&l->refused, 1);
      return limit_refusal(l->cap, size, seen, "already allocated");
    }
  }
  int err = gmr__policy_alloc(self->upstream, size, s, out);
  if (err != 0) {
    if (sh != NULL) limit_give(l, sh, size);
    if (err == GMR_ENOMEM && l->counts == LIMIT_COUNTS_RESERVED) atomic_fetch_add(&l->refused, 1);
  }
  return err;
}

static int limit_free(gmr_policy_t *self, const gmr_block_t *blk) {
  limit_t *l = (limit_t *)self;
  int err = gmr__policy_free(self->upstream, blk);
  if (err == 0 && l->counts == LIMIT_COUNTS_ALLOCATED)
    limit_give(l, shard_of(l, blk->stream), blk->requested);
  return err;
}

/* Device memory obtained outside gmr, counted against the cap like an
 * allocation (counts: allocated) or a reservation (counts: reserved):
 *     external = Σ charges - Σ refunds,  0 <= external <= cap,
 * and it is part of in_use or held. */
static int limit_charge(gmr_policy_t *self, int64_t bytes) {
  limit_t *l = (limit_t *)self;
  uint64_t n = bytes > 0 ? (uint64_t)bytes : (uint64_t)(-(bytes + 1)) + 1;
  if (bytes < 0) {
    /* A refund gives back only what was charged:  n <= external,  so no
     * count below ever wraps (a wrapped count would refuse everything, or
     * nothing). */
    uint64_t ext = atomic_load(&l->external);
    do {
      if (n > ext) {
        char r[32], c[32];
        gmr__format_size(n, r, sizeof r);
        gmr__format_size(ext, c, sizeof c);
        return gmr__error_set(GMR_EINVAL,
                              "gmr_charge: a refund of %s (%llu bytes) is more than the %s "
                              "(%llu bytes) charged and not yet refunded",
                              r, (unsigned long long)n, c, (unsigned long long)ext);
      }
    } while (!atomic_compare_exchange_weak(&l->external, &ext, ext - n));
    if (l->counts == LIMIT_COUNTS_ALLOCATED)
      limit_give(l, shard_of(l, LIMIT_EXTERNAL_STREAM), n);
    else
      lbe_give(l->lbe, n);
    return 0;
  }
  uint64_t seen;
  bool ok;
  if (l->counts == LIMIT_COUNTS_ALLOCATED) {
    limit_shard_t *sh = shard_of(l, LIMIT_EXTERNAL_STREAM);
    ok = shard_take(sh, n) || limit_refill(l, sh, n, &seen);
  } else {
    int err = lbe_take(l->lbe, n);
    if (err != 0) {
      atomic_fetch_add(&l->refused, 1);
      return err;
    }
    ok = true;
  }
  if (!ok) {
    atomic_fetch_add(&l->refused, 1);
    return limit_refusal(l->cap, n, seen,
                         l->counts == LIMIT_COUNTS_ALLOCATED ? "already allocated"
                                                             : "reserved on the device");
  }
  atomic_fetch_add(&l->external, n);
  return 0;
}

/* Sleep and wake (counts: reserved): memory a sleep gave back below the
 * capped backend leaves the cap, and the shared cap, at once (the other
 * processes may use it); a wake takes it again first, and is refused with
 * the cap's sentence when it no longer fits.  Forced (the pool goes while
 * asleep), the bytes are counted back whatever the cap, for the releases
 * that follow. */
static int limit_sleep_charge(gmr_policy_t *self, int64_t bytes, bool force) {
  limit_t *l = (limit_t *)self;
  if (l->counts != LIMIT_COUNTS_RESERVED || bytes == 0) return 0;
  if (bytes < 0) {
    lbe_give(l->lbe, (uint64_t)(-(bytes + 1)) + 1);
    return 0;
  }
  uint64_t n = (uint64_t)bytes;
  if (!force) return lbe_take(l->lbe, n);
  atomic_fetch_add(&l->lbe->held, n);
  if (l->lbe->shared != NULL)
    (void)gmr__scap_reserve(l->lbe->shared, n); /* a refusal: the
                                                  releases clamp */
  return 0;
}

static void limit_set_exclusive(gmr_policy_t *self, int exclusive) {
  gmr__policy_set_exclusive(self->upstream, exclusive);
}

static void limit_set_fraction(gmr_policy_t *self, double fraction) {
  gmr__policy_set_fraction(self->upstream, fraction);
}

static int limit_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  return gmr__policy_record_stream(self->upstream, blk, s);
}

/* Quiesced (policy.h, rule 5; see Note [Locking]): the upstream quiesced, so that the
 * whole-state ops below see it at one moment; they call its *_locked forms.
 * The limit's own figures are atomic counters. */
static void limit_quiesce(gmr_policy_t *self) {
  gmr__policy_quiesce(self->upstream);
}

static void limit_resume(gmr_policy_t *self) {
  gmr__policy_resume(self->upstream);
}

static int limit_trim(gmr_policy_t *self) {
  return gmr__policy_trim_locked(self->upstream);
}

static void limit_stats(gmr_policy_t *self, gmr_stats_t *st) {
  limit_t *l = (limit_t *)self;
  gmr__policy_stats_locked(self->upstream, st);
  st->limit_bytes = l->cap;
  /* Refusals by the capped backend are counted by the upstream as its OOMs. */
  if (l->counts == LIMIT_COUNTS_ALLOCATED) st->ooms += atomic_load(&l->refused);
}

static void limit_reset_peak(gmr_policy_t *self) {
  gmr__policy_reset_peak_locked(self->upstream);
}

static void limit_reset_accumulated(gmr_policy_t *self) {
  limit_t *l = (limit_t *)self;
  atomic_store(&l->refused, 0);
  gmr__policy_reset_accumulated_locked(self->upstream);
}

static int limit_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  limit_t *l = (limit_t *)self;
  if (cb("limit_bytes", (int64_t)l->cap, ud) != 0) return 0;
  if (cb("limit_in_use_bytes",
         (int64_t)(l->counts == LIMIT_COUNTS_ALLOCATED ? limit_in_use(l)
                                                       : atomic_load(&l->lbe->held)),
         ud) != 0)
    return 0;
  if (cb("limit_refused", (int64_t)atomic_load(&l->refused), ud) != 0) return 0;
  if (cb("limit_external_bytes", (int64_t)atomic_load(&l->external), ud) != 0) return 0;
  if (l->lbe != NULL && l->lbe->shared != NULL) {
    gmr_scap_view_t v;
    gmr__scap_view(l->lbe->shared, &v);
    if (cb("limit_shared_cap_bytes", (int64_t)v.cap, ud) != 0) return 0;
    if (cb("limit_shared_committed_bytes", (int64_t)v.committed, ud) != 0) return 0;
    if (cb("limit_shared_free_bytes", (int64_t)v.room, ud) != 0) return 0;
  }
  int err = gmr__policy_stats_foreach_locked(self->upstream, cb, ud);
  return err == GMR_POLICY_NONE ? 0 : err;
}

static int limit_summary(gmr_policy_t *self, FILE *out) {
  limit_t *l = (limit_t *)self;
  char c[32], u[32];
  gmr__format_size(l->cap, c, sizeof c);
  gmr__format_size(l->counts == LIMIT_COUNTS_ALLOCATED ? limit_in_use(l)
                                                       : atomic_load(&l->lbe->held),
                   u, sizeof u);
  fprintf(out, "limit: %s of %s %s (%llu allocations refused)\n", u, c,
          l->counts == LIMIT_COUNTS_ALLOCATED ? "allocated" : "reserved",
          (unsigned long long)atomic_load(&l->refused));
  if (l->lbe != NULL && l->lbe->shared != NULL) {
    gmr_scap_view_t v;
    gmr__scap_view(l->lbe->shared, &v);
    char sc[32], sm[32], sr[32];
    gmr__format_size(v.cap, sc, sizeof sc);
    gmr__format_size(v.committed, sm, sizeof sm);
    gmr__format_size(v.room, sr, sizeof sr);
    fprintf(out, "shared cap: %s committed of %s by all processes, %s left to this one (%s)\n", sm,
            sc, sr, gmr__scap_path(l->lbe->shared));
  }
  int err = gmr__policy_summary_locked(self->upstream, out);
  return err == GMR_POLICY_NONE ? 0 : err;
}

static int limit_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  return gmr__policy_walk_locked(self->upstream, cb, ud);
}

static int limit_check(gmr_policy_t *self) {
  limit_t *l = (limit_t *)self;
  uint64_t unused = l->counts == LIMIT_COUNTS_ALLOCATED ? limit_unused(l) : 0;
  if (unused > l->cap)
    return gmr__error_set(GMR_EINVAL,
                          "limit: the pool and the shards hold %llu bytes of credit, more than "
                          "the cap of %llu",
                          (unsigned long long)unused, (unsigned long long)l->cap);
  uint64_t used =
      l->counts == LIMIT_COUNTS_ALLOCATED ? l->cap - unused : atomic_load(&l->lbe->held);
  if (used > l->cap)
    return gmr__error_set(GMR_EINVAL, "limit: %llu bytes in use pass the cap of %llu",
                          (unsigned long long)used, (unsigned long long)l->cap);
  return gmr__policy_check_locked(self->upstream);
}

static const limit_opts_t limit_defaults = {.bytes = 0, .fraction = 0, .counts = 0};

static const gmr_opt_desc_t limit_shared_desc[] = {
    {.key = "cap",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(limit_shared_opts_t, cap),
     .min = 1,
     .default_text = "",
     .help = "Bytes that all processes sharing the device may hold together (required); every "
             "process must give the same cap."},
    {.key = "guaranteed",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(limit_shared_opts_t, guaranteed),
     .default_text = "0",
     .help = "Bytes no other process can take from this one, at most `bytes`; the guarantees of "
             "all processes must fit in the cap."},
    {.key = "label",
     .type = GMR_OPT_STRING,
     .offset = offsetof(limit_shared_opts_t, label),
     .default_text = "",
     .help = "A name for this process in gmr-top (up to 63 bytes)."},
    {.key = "path",
     .type = GMR_OPT_STRING,
     .offset = offsetof(limit_shared_opts_t, path),
     .default_text = "/dev/shm/gmr-cap-UID-DEVICE",
     .help = "The file the processes share; by default one per user and device (GPU UUID)."},
    {.key = "timeout",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(limit_shared_opts_t, timeout),
     .min = 0,
     .max = 3600,
     .min_exclusive = true,
     .default_text = "1",
     .help = "Seconds to wait for the file's lock before a reservation fails (a stopped holder)."},
    {.key = "shared_by",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(limit_shared_opts_t, shared_by),
     .choices = limit_shared_by_names,
     .default_text = "user",
     .help = "user: the file and its folder must be this user's, writable by no one else; "
             "group: they may be group-writable when their group is one of this process's "
             "(processes of several users; docs/shared-cap.md, 'Trust')."},
    {.key = NULL},
};

static const gmr_opt_desc_t limit_opts_desc[] = {
    {.key = "bytes",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(limit_opts_t, bytes),
     .min = 1,
     .default_text = "",
     .help = "The cap in bytes, e.g. 8GiB."},
    {.key = "fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(limit_opts_t, fraction),
     .min = 0,
     .max = 1,
     .min_exclusive = true,
     .default_text = "",
     .help = "The cap as a fraction of the device's total memory, in (0, 1]."},
    {.key = "counts",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(limit_opts_t, counts),
     .choices = limit_counts_names,
     .default_text = "allocated",
     .help = "allocated: live requested bytes (checked before the policy runs); reserved: "
             "device memory the policy holds, cache included."},
    {.key = "shared",
     .type = GMR_OPT_TABLE,
     .offset = offsetof(limit_opts_t, shared),
     .sub = limit_shared_desc,
     .default_text = "",
     .help = "One cap for all processes on the device, on top of this one's (counts: reserved "
             "only; docs/shared-cap.md)."},
    {.key = NULL},
};

const gmr_policy_ops_t gmr__limit_policy = {
    .name = "limit",
    .help = "A hard memory cap stacked on any policy: an allocation that would pass it fails "
            "with GMR_ENOMEM and a message naming the cap, the request and the bytes in use.",
    .opts_size = sizeof(limit_opts_t),
    .opts_default = &limit_defaults,
    .opts_desc = limit_opts_desc,
    .is_decorator = true,
    .concurrent = true,
    .quiesce = limit_quiesce,
    .resume = limit_resume,
    .validate = limit_validate,
    .opts_release = limit_opts_release,
    .create = limit_create,
    .destroy = limit_destroy,
    .alloc = limit_alloc,
    .free = limit_free,
    .record_stream = limit_record_stream,
    .trim = limit_trim,
    .charge = limit_charge,
    .sleep_charge = limit_sleep_charge,
    .set_exclusive = limit_set_exclusive,
    .set_fraction = limit_set_fraction,
    .stats = limit_stats,
    .reset_peak = limit_reset_peak,
    .reset_accumulated = limit_reset_accumulated,
    .stats_foreach = limit_stats_foreach,
    .summary = limit_summary,
    .walk = limit_walk,
    .check = limit_check,
};
