/* policy.h: the contract of allocation policies (strategy only).
 *
 * A policy decides which bytes to hand out; it obtains device memory only
 * through the gmr__backend_* wrappers.  One file per policy in policies/,
 * ending with its table, the file's only non-static symbol.  A new policy is
 * one file, one table, one line in gmr__policies (registry.c), one option
 * table and one tests/policy-NAME.c: nothing else changes.
 *
 * Rules:
 *  1. Ops are called only through the runtime (lib/core/runtime.c), which owns the
 *     pointer -> block map and passes the block back at free time.
 *  2. `self` comes first; out-parameters come last and are never NULL.
 *  3. A NULL slot means "unsupported"; only the runtime tests for it.
 *  4. Ops return 0 or a negative GMR_E*, never abort, and leave *out
 *     untouched on failure.  On GMR_ENOMEM the policy has written the full
 *     message (gmr__error_set) in its framework's words.
 *  5. Synchronization: unless `concurrent` is set, the runtime calls every op
 *     with its policy lock held (one op at a time).  A policy that sets
 *     `concurrent` does its own locking and may be called from any number of
 *     threads at once.
 */
#ifndef GMR_POLICY_H
#define GMR_POLICY_H

#include "backend/backend.h"
#include "core/internal.h"

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
} gmr_policy_ops_t;

/* The first member of every policy instance. */
struct gmr_policy_s {
  const gmr_policy_ops_t *ops;
  gmr_backend_t *backend;
  gmr_policy_t *upstream; /* decorators only */
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

/* Build a policy stack on a backend. */
int gmr__policy_create(const gmr_policy_cfg_t *cfg, gmr_backend_t *be, gmr_policy_t **out);
void gmr__policy_destroy(gmr_policy_t *p);

/* The tables. */
extern const gmr_policy_ops_t gmr_direct_policy_ops;
extern const gmr_policy_ops_t gmr_limit_policy_ops;
extern const gmr_policy_ops_t gmr_caching_policy_ops;
extern const gmr_policy_ops_t gmr_bfc_policy_ops;

#endif /* GMR_POLICY_H */
