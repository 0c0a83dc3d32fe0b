/* policy.h: the contract of allocation policies (strategy only).
 *
 * A policy decides which bytes to hand out; it obtains device memory only
 * through the gmr__backend_* wrappers.  A new policy adds one line to
 * gmr__policies (registry.c), one option table and one tests/policy-NAME.c:
 * nothing else changes.
 * Map: Note [Policy files], [Policy rules].
 */
#ifndef GMR_POLICY_H
#define GMR_POLICY_H

#include "backend/backend.h"
#include "core/internal.h"
#include "core/lock.h"

/* Note [Policy files]
 * A small policy is one file in policies/ (direct.c, limit.c) ending with its
 * table, gmr__NAME_policy, the file's only non-static symbol.  A larger one
 * is a folder policies/NAME/ with one skeleton: internal.h (what its files
 * share), NAME.c (alloc, free, the ops table), options.c, report.c
 * (statistics, summary, OOM text) and check.c (walk and invariants), plus
 * rooms of its own named in its internal.h; names crossing its files are
 * gmr__NAME_* (nm shows no bare name: tests/nm-internal.sh).
 */

/* Note [Policy rules]
 * Rules:
 *  1. Ops are called only through the gmr__policy_* wrappers below (as
 *     devices are reached only through the gmr__backend_* ones): by the
 *     runtime (lib/runtime/runtime.c), which owns the pointer -> block map and
 *     passes the block back at free time, and by decorators, for their
 *     upstream.
 *  2. `self` comes first; out-parameters come last and are never NULL.
 *  3. A NULL slot means "unsupported"; only the wrappers test for it, and
 *     they apply the one default each slot has (listed at each wrapper).
 *  4. Ops return 0 or a negative GMR_E*, never abort, and leave *out
 *     untouched on failure.  On GMR_ENOMEM the policy has written the full
 *     message (gmr__error_set) in its framework's words.  The wrappers tag a
 *     failure with the runtime the policy serves (gmr_last_error(rt)).
 *  5. Synchronization: unless `concurrent` is set, every op runs with the
 *     instance's own lock held (one op at a time): the wrappers take it, or
 *     the caller holds it (gmr__policy_lock) around the *_locked ones.  A
 *     policy that sets `concurrent` does its own locking and may be called
 *     from any number of threads at once; policy.c holds no lock for it.
 *     Its whole-state ops (trim, stats, reset_peak, reset_accumulated,
 *     stats_foreach, summary, walk, check) run quiesced instead: between its
 *     `quiesce` op, which returns once no other op runs and none can start
 *     (every lock taken, fronts flushed, whatever it owes the state
 *     applied), and its `resume` op, which lets them go again.  The
 *     wrappers call both around the op; a caller that wants several ops at
 *     one moment (a snapshot) calls gmr__policy_quiesce / _resume around
 *     the *_locked ones.  For a policy that is not concurrent, quiescing is
 *     taking its lock.  So *_locked means one thing: the caller holds the
 *     policy quiesced.  Whole-state ops never quiesce themselves, and
 *     nothing called while quiesced may call the policy again.
 */

typedef struct gmr_policy_s gmr_policy_t;
typedef struct gmr_policy_cfg_s gmr_policy_cfg_t;

/* One allocation as the runtime keeps it (value type, copied freely). */
typedef struct gmr_block_s {
  void *ptr;           /* device address handed to the user */
  size_t size;         /* policy-rounded size, >= requested */
  size_t requested;    /* what the user asked for */
  gmr_stream_t stream; /* stream of the allocation */
  void *handle;        /* the policy's own record of the block (opaque) */
} gmr_block_t;

typedef struct gmr_policy_ops_s {
  const char *name;                /* the YAML `name:` */
  const char *help;                /* one sentence for the reference */
  size_t opts_size;                /* sizeof(the policy's options struct) */
  const void *opts_default;        /* the defaults, copied before parsing */
  const gmr_opt_desc_t *opts_desc; /* terminated by an entry with key NULL */
  bool is_decorator;               /* takes an `upstream:` policy */
  bool concurrent;                 /* does its own locking (rule 5) */
  /* Calls gmr__history_free_completed (observe/recording.h) when a freed block becomes
   * reusable; otherwise the runtime records free_completed with the free. */
  bool reports_free_completed;
  /* Cross-field checks after parsing; write a sentence to err on failure. */
  int (*validate)(void *opts, char *err, size_t errlen);
  /* Release what the options own (strings); NULL when nothing. */
  void (*opts_release)(void *opts);

  /* Build an instance.  Decorators create their upstream themselves with
   * gmr__policy_create(upstream, be_for_upstream, &up). */
  int (*create)(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                gmr_policy_t **out);
  /* Return all device memory, including live blocks. */
  void (*destroy)(gmr_policy_t *self);
  int (*alloc)(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out);
  int (*free)(gmr_policy_t *self, const gmr_block_t *blk);
  int (*record_stream)(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s);
  int (*trim)(gmr_policy_t *self); /* empty_cache */
  /* Count `bytes` of device memory obtained outside the policy (negative:
   * give them back) against what the policy enforces; GMR_ENOMEM when that
   * would pass a cap, and then nothing is counted.  NULL: nothing to enforce. */
  int (*charge)(gmr_policy_t *self, int64_t bytes);
  /* One thread makes every call from now on (exclusive != 0): nothing can be
   * freed while a call waits, so a policy must not wait for other threads'
   * frees (BFC's retry).  Decorators pass it on.  NULL: the policy never
   * waits. */
  void (*set_exclusive)(gmr_policy_t *self, int exclusive);
  /* The per-process memory fraction f was set (gmr_set_memory_fraction,
   * torch.cuda.set_per_process_memory_fraction): the policy caps itself at
   * floor(f x total) and names that in its OOM text, as PyTorch's allocator
   * does.  Called quiesced.  Decorators pass it on.  NULL: the runtime's gate
   * enforces the fraction alone (backend/gate.c, Note [The fraction]). */
  void (*set_fraction)(gmr_policy_t *self, double fraction);
  /* Fill the allocation-level fields of gmr_stats_t; the runtime fills the
   * device-level ones (reserved, segments, device_allocs/frees) from the
   * backend counters unless the policy already set them. */
  void (*stats)(gmr_policy_t *self, gmr_stats_t *out);
  void (*reset_peak)(gmr_policy_t *self);
  void (*reset_accumulated)(gmr_policy_t *self);
  int (*stats_foreach)(gmr_policy_t *self, gmr_stat_cb cb, void *ud);
  int (*summary)(gmr_policy_t *self, FILE *out);
  int (*walk)(gmr_policy_t *self, gmr_walk_cb cb, void *ud);
  /* Walk every invariant; on failure gmr__error_set(GMR_EINVAL, why). */
  int (*check)(gmr_policy_t *self);
  /* Concurrent policies only (rule 5): stop every other op until resume,
   * so that the whole-state ops above see one consistent moment.  Both
   * NULL: the policy's whole-state ops need nothing stopped. */
  void (*quiesce)(gmr_policy_t *self);
  void (*resume)(gmr_policy_t *self);
  /* Sleep and wake (docs/sleep-wake.md): `bytes` of device memory the
   * policy holds were given back by a sleep (negative) or are about to be
   * mapped again by a wake (positive), below the policy's backend, which
   * never saw it.  A wake's charge may be refused (GMR_ENOMEM, nothing
   * counted) unless `force` (the pool goes: its memory is counted back in
   * whatever the cap, so that the releases that follow balance).  NULL:
   * nothing to count (a cap on allocated bytes is not changed by sleep). */
  int (*sleep_charge)(gmr_policy_t *self, int64_t bytes, bool force);
} gmr_policy_ops_t;

/* The first member of every policy instance.  The policy's create sets
 * `ops`, `backend` and `upstream`; gmr__policy_create sets the rest. */
struct gmr_policy_s {
  const gmr_policy_ops_t *ops;
  gmr_backend_t *backend;
  gmr_policy_t *upstream; /* decorators only */
  const void *owner;      /* the runtime served: failures are tagged with it */
  bool serialize;         /* !ops->concurrent: the wrappers take `lock` */
  gmr_lock_t lock;        /* one op at a time when serialize (rule 5) */
};

/* A parsed policy section of a configuration (owned by gmr_config_t). */
struct gmr_policy_cfg_s {
  const gmr_policy_ops_t *ops;
  void *opts;                 /* ops->opts_size bytes */
  gmr_policy_cfg_t *upstream; /* decorators only */
};

/* Registry (registry.c). */
extern const gmr_policy_ops_t *const gmr__policies[];
const gmr_policy_ops_t *gmr__policy_lookup(const char *name);

/* Build a policy stack on a backend (policy.c); its failures are tagged
 * with `owner` from now on (the runtime sets it for the whole stack). */
int gmr__policy_create(const gmr_policy_cfg_t *cfg, gmr_backend_t *be, gmr_policy_t **out);
void gmr__policy_destroy(gmr_policy_t *p);
void gmr__policy_set_owner(gmr_policy_t *p, const void *owner);

/* ---- the wrappers: the only way to call the ops ------------------------------
 *
 * Inline, for the hot path: a call costs what a direct one did, plus one
 * predictable branch on the lock.  The *_locked forms are for a caller that
 * already holds gmr__policy_lock(p) across other work (the runtime's pointer
 * map, for a policy that is not concurrent).  Each wrapper tags a failure
 * with p's runtime, except the runtime's hot path, alloc_locked and
 * free_locked: their caller passes a failure to gmr__policy_failed(p, err)
 * itself, so that p need not stay in a register across the call (that costs
 * the runtime 3 instructions a pair, as callgrind counts them). */

#if defined(__GNUC__)
#define GMR_POLICY_INLINE static inline __attribute__((always_inline))
#else
#define GMR_POLICY_INLINE static inline
#endif

/* The result of the optional output ops (stats_foreach, summary) when the
 * slot is empty: the caller writes its own default.  Positive, so never an
 * op's result (rule 4). */
#define GMR_POLICY_NONE 1

/* Out of line: tag a failure with p's runtime (gmr__error_tag); returns err. */
int gmr__policy_failed(const gmr_policy_t *p, int err);

GMR_POLICY_INLINE bool gmr__policy_serialized(const gmr_policy_t *p) {
  return p->serialize;
}
GMR_POLICY_INLINE void gmr__policy_lock(gmr_policy_t *p) {
  if (p->serialize) gmr__lock(&p->lock);
}
GMR_POLICY_INLINE void gmr__policy_unlock(gmr_policy_t *p) {
  if (p->serialize) gmr__unlock(&p->lock);
}
/* p's lock when p is not concurrent, else NULL: for a caller that holds it
 * across work of its own and the *_locked calls, and keeps the pointer
 * rather than the policy at hand (the runtime's hot paths). */
GMR_POLICY_INLINE gmr_lock_t *gmr__policy_lock_ptr(gmr_policy_t *p) {
  return p->serialize ? &p->lock : NULL;
}
GMR_POLICY_INLINE int gmr__policy_tag(const gmr_policy_t *p, int err) {
  return GMR_UNLIKELY(err != 0) ? gmr__policy_failed(p, err) : 0;
}

/* alloc and free: required slots. */
GMR_POLICY_INLINE int gmr__policy_alloc_locked(gmr_policy_t *p, size_t size, gmr_stream_t s,
                                               gmr_block_t *out) {
  return p->ops->alloc(p, size, s, out); /* untagged: see above */
}
GMR_POLICY_INLINE int gmr__policy_alloc(gmr_policy_t *p, size_t size, gmr_stream_t s,
                                        gmr_block_t *out) {
  gmr__policy_lock(p);
  int err = p->ops->alloc(p, size, s, out);
  gmr__policy_unlock(p);
  return gmr__policy_tag(p, err);
}
GMR_POLICY_INLINE int gmr__policy_free_locked(gmr_policy_t *p, const gmr_block_t *blk) {
  return p->ops->free(p, blk); /* untagged: see above */
}
GMR_POLICY_INLINE int gmr__policy_free(gmr_policy_t *p, const gmr_block_t *blk) {
  gmr__policy_lock(p);
  int err = p->ops->free(p, blk);
  gmr__policy_unlock(p);
  return gmr__policy_tag(p, err);
}

/* record_stream: empty slot, nothing to do (0). */
GMR_POLICY_INLINE int gmr__policy_record_stream_locked(gmr_policy_t *p, const gmr_block_t *blk,
                                                       gmr_stream_t s) {
  if (p->ops->record_stream == NULL) return 0;
  return gmr__policy_tag(p, p->ops->record_stream(p, blk, s));
}
GMR_POLICY_INLINE int gmr__policy_record_stream(gmr_policy_t *p, const gmr_block_t *blk,
                                                gmr_stream_t s) {
  if (p->ops->record_stream == NULL) return 0;
  gmr__policy_lock(p);
  int err = p->ops->record_stream(p, blk, s);
  gmr__policy_unlock(p);
  return gmr__policy_tag(p, err);
}

/* Empty slot: nothing to enforce, every charge is accepted (0). */
int gmr__policy_charge(gmr_policy_t *p, int64_t bytes);
/* sleep_charge on p and every policy under it that has the slot; a refusal
 * undoes what the others counted. */
int gmr__policy_sleep_charge(gmr_policy_t *p, int64_t bytes, bool force);
/* Empty slot: the policy never waits for other threads. */
void gmr__policy_set_exclusive(gmr_policy_t *p, int exclusive);
/* Quiesced.  Empty slot: nothing to do (the gate enforces the fraction). */
void gmr__policy_set_fraction(gmr_policy_t *p, double fraction);

/* The whole-state ops (rule 5).  gmr__policy_quiesce(p) stops every other
 * op of p until gmr__policy_resume(p): p's lock when p is not concurrent,
 * else p's quiesce op (nothing when it has none).  Each wrapper below runs
 * its op quiesced; its *_locked form is for a caller that holds p quiesced
 * across several (the runtime's snapshot, a decorator's own quiesce). */
void gmr__policy_quiesce(gmr_policy_t *p);
void gmr__policy_resume(gmr_policy_t *p);
/* Empty slot: nothing to release (0). */
int gmr__policy_trim_locked(gmr_policy_t *p);
int gmr__policy_trim(gmr_policy_t *p);
/* Empty slot: the fields stay as the caller set them. */
void gmr__policy_stats_locked(gmr_policy_t *p, gmr_stats_t *st);
void gmr__policy_stats(gmr_policy_t *p, gmr_stats_t *st);
/* Empty slots: nothing to reset. */
void gmr__policy_reset_peak_locked(gmr_policy_t *p);
void gmr__policy_reset_peak(gmr_policy_t *p);
void gmr__policy_reset_accumulated_locked(gmr_policy_t *p);
void gmr__policy_reset_accumulated(gmr_policy_t *p);
/* Empty slots: GMR_POLICY_NONE, nothing written.  Otherwise the op's result
 * as is (a callback's stop value, GMR_EIO), untagged. */
int gmr__policy_stats_foreach_locked(gmr_policy_t *p, gmr_stat_cb cb, void *ud);
int gmr__policy_stats_foreach(gmr_policy_t *p, gmr_stat_cb cb, void *ud);
int gmr__policy_summary_locked(gmr_policy_t *p, FILE *out);
int gmr__policy_summary(gmr_policy_t *p, FILE *out);
/* Empty slot: GMR_ENOTSUP, "policy NAME keeps no segments to walk". */
int gmr__policy_walk_locked(gmr_policy_t *p, gmr_walk_cb cb, void *ud);
int gmr__policy_walk(gmr_policy_t *p, gmr_walk_cb cb, void *ud);
/* Empty slot: no invariant to check (0). */
int gmr__policy_check_locked(gmr_policy_t *p);
int gmr__policy_check(gmr_policy_t *p);

/* The tables. */
extern const gmr_policy_ops_t gmr__direct_policy;
extern const gmr_policy_ops_t gmr__limit_policy;
extern const gmr_policy_ops_t gmr__caching_policy;
extern const gmr_policy_ops_t gmr__bfc_policy;
extern const gmr_policy_ops_t gmr__stitch_policy;

#endif /* GMR_POLICY_H */
