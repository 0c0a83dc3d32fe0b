/* runtime-internal.h: what the runtime's own files share.
 *
 * The runtime struct (struct gmr_runtime_s) with its map shards and pool
 * routes, the small inline helpers more than one file needs, and the calls
 * between runtime.c (the dispatcher, the pointer map, the pools), runtime-stats.c
 * (statistics and introspection) and tags.c (tagged pools: sleep and wake).
 * Private to lib/runtime: the other layers call runtime.h.
 */
#ifndef GMR_RUNTIME_INTERNAL_H
#define GMR_RUNTIME_INTERNAL_H

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gate.h"
#include "backend/sleep.h"
#include "core/config-env.h"
#include "core/internal.h"
#include "core/lock.h"
#include "core/shared-cap.h"
#include "observe/history.h"
#include "observe/recording.h"
#include "observe/snapshot.h"
#include "observe/trace.h"
#include "policy.h"
#include "runtime/config.h"
#include "runtime/runtime.h"
#include "runtime/stats.h"

/* Out of line: the refusals and the history's recording paths; inline: the
 * helpers of the hot path, so it stays as it is without the history. */
#if defined(__GNUC__)
#define RUNTIME_COLD     __attribute__((cold, noinline))
#define RUNTIME_NOINLINE __attribute__((noinline))
#define RUNTIME_INLINE   inline __attribute__((always_inline))
#else
#define RUNTIME_COLD
#define RUNTIME_NOINLINE
#define RUNTIME_INLINE inline
#endif

/* 1024 shards: the blocks that threads use at once are often neighbours
 * at one stride (a BFC region cut into equal chunks, one per stream), and
 * runtime.c's map_hash sends 16 blocks at a stride of 256 B, 768 B or 1280 B
 * times any power of two up to 1 GiB to 16 distinct shards (tests/dispatch
 * checks it); with 256 shards strides of 3, 4, 6 and 12 KiB put two of 16
 * blocks in one shard, whose two threads then hand its lock and table
 * lines back and forth at every call (ten times a pair's cost, measured). */
#define MAP_SHARD_BITS  10
#define MAP_SHARDS      (1 << MAP_SHARD_BITS)
#define CACHE_LINE      64
#define MAP_FIRST_SLOTS 8 /* a shard's first table (its first 4 entries): 320 bytes */

typedef struct map_shard_s {
  _Alignas(CACHE_LINE) gmr_spin_t lock; /* used only with concurrent policies */
  size_t mask;                          /* capacity - 1 (capacity a power of two) */
  size_t count;                         /* live entries; count <= capacity / 2 */
  size_t grow_at;                       /* capacity / 2 (0 before the first insert): an insert at
                                           count == grow_at doubles the table first */
  gmr_block_t *slots;                   /* ptr == NULL: empty; map_none before the first insert */
  void *slots_raw;                      /* what the host returned (slots are aligned in it) */
} map_shard_t;

/* Note [Shard layout]
 * Each shard fills one cache line of its own, and the runtime lock has one
 * too, so threads working on different shards never write to a line another
 * thread reads (the runtime is allocated 64-byte aligned).  The layout is
 * checked by the assertions below.
 */

/* Layout, checked where it is built (runtime.c: runtime_build, map_grow) and here:
 *   sizeof(map_shard_t) == CACHE_LINE,  (uintptr_t)&rt->shards[i] % CACHE_LINE == 0,
 *   (uintptr_t)sh->slots % CACHE_LINE == 0,  capacity x 40 % CACHE_LINE == 0. */
_Static_assert(sizeof(map_shard_t) == CACHE_LINE, "a shard fills one cache line");
_Static_assert(MAP_FIRST_SLOTS * sizeof(gmr_block_t) % CACHE_LINE == 0,
               "a shard's table ends on a cache line");

/* Note [Fast and general paths]
 * gmr_alloc and gmr_free check their arguments, then test one word, `slow` (a
 * serialized policy, the trace, the history): 0 jumps to the hot path
 * (alloc_fast, free_fast: the policy, the shard), anything else to the general
 * one (alloc_general, free_general), both before a frame is built.
 */
#define RUNTIME_SLOW_HISTORY 1u /* `history` is set */
#define RUNTIME_SLOW_TRACE   2u /* `trace` is set */
#define RUNTIME_SLOW_SERIAL  4u /* `policy_lock` is set: the policy is not concurrent */
#define RUNTIME_SLOW_POOLS   8u /* `children` is set: private pools exist (Note [Pools]) */

/* Note [Pools]
 * A private pool (gmr_pool_create, pools.c) is a child runtime: a second
 * instance of the runtime's policy stack, built from the same configuration
 * (kept in `cfg`) over a borrowed face of the same gate and device (gate.h),
 * with its own pointer map.  The parent keeps its children in a list and the
 * routes (stream -> child) that gmr_pool_begin made, both under `lock`.  So:
 *   - a block freed in a pool goes back to the child's policy, and only an
 *     allocation in that pool can get it again;
 *   - gmr_free of a pool's block finds its child after the parent's map
 *     misses (only while children exist: RUNTIME_SLOW_POOLS);
 *   - a child lives while uses > 0, or it holds live blocks, or `busy` > 0
 *     (a call into it is underway); gmr_empty_cache closes the others;
 *   - the history is the parent's: a child records into the parent's store;
 *   - statistics, walks and checks of the parent cover its children; peaks
 *     are sums of each instance's peak, an upper bound of the true peak.
 * Lock order: parent `lock`, then a child's locks; never the reverse. */
typedef struct pool_route_s {
  gmr_runtime_t *child;
  gmr_stream_t stream; /* GMR_STREAM_ANY: every stream */
} pool_route_t;

/* Note [Runtime locking]
 * Policies are called through the policy.h wrappers, which own the lock of a
 * policy that is not `concurrent` (one op at a time); the map is then touched
 * under that same lock, held across the op and the map (gmr__policy_lock and
 * the *_locked calls).  A concurrent policy locks itself, and the map is
 * touched under its shard's lock.  The policy lock is a gmr_lock_t, a shard's
 * a gmr_spin_t (lock.h): an uncontended lock and unlock are one atomic
 * instruction each, inline (a spin unlock is a plain release store).  Which
 * lock guards what: the Synchronization comment of struct gmr_runtime_s below.
 */

/* Synchronization: `policy`, `policy_lock`, `backend`, `trace` and the names
 * are written once by runtime_build and only read afterwards; each shard's
 * entries are guarded by `policy_lock` when there is one, else by the shard's
 * own lock; `lock` serializes gmr_history_enable. */
struct gmr_runtime_s {
  gmr_policy_t *policy;
  gmr_lock_t *policy_lock; /* gmr__policy_lock_ptr(policy): NULL when concurrent */
  gmr_backend_t *backend;  /* the recording layer the policies were given */
  gmr_backend_t *dev;      /* the device under it (owned by `backend`) */
  gmr_trace_t *trace;      /* NULL unless recording */
  /* RUNTIME_SLOW_* bits: gmr_alloc and gmr_free take their general path
   * unless it is 0 (a concurrent policy, no trace, no history). */
  _Atomic uint32_t slow;
  void *raw; /* what gmr__calloc returned (the runtime is aligned inside) */
  /* The memory history: `history` is NULL when off and `history_store` while
   * on; the store lives until the runtime is freed, so a thread that loaded
   * `history` just before it was turned off still records into valid memory.
   * Both written by gmr_history_enable only, under `lock`. */
  gmr_history_t *_Atomic history;
  gmr_history_t *history_store;
  bool history_completes; /* no policy of the stack reports free_completed */
  char *snapshot_path;    /* GMR_SNAPSHOT: written when the runtime is freed; NULL: none */
  int device;
  char policy_name[128];
  gmr_config_t *cfg;   /* retained: the private pools are built from it */
  gmr_backend_t *gate; /* the device gate under the recording layer (gate.h) */
  /* Private pools (Note [Pools]); a child's `parent` is set, its `children` NULL. */
  gmr_runtime_t *parent;
  gmr_runtime_t *children, *next_child; /* under the parent's `lock` */
  pool_route_t *routes;                 /* under `lock`, newest last */
  size_t nroutes_cap;
  _Atomic size_t nroutes;
  uint64_t pool_id; /* children: unique in the process, never 0 */
  int pool_uses;    /* children: under the parent's `lock` */
  _Atomic int busy; /* children: calls into it underway through the parent */
  /* What closed pools counted (Note [Retired pools]), under `lock`;
   * `retired_any` is set once the first pool closes. */
  gmr_stats_t retired;
  struct stat_vec_s *retired_named;
  _Atomic bool retired_any;
  /* Tagged pools (Note [Tags]): the tag, the sleepable face under the
   * recording layer, whether asleep and how (GMR_SLEEP_*), and the frees
   * made while asleep (under the parent's `lock`).  The parent's
   * `sleep_lock` serializes gmr_sleep and gmr_wake. */
  char *tag;
  gmr_backend_t *sleep_face;
  _Atomic int asleep;
  int sleep_mode;
  void **deferred;
  size_t ndeferred, capdeferred;
  gmr_lock_t sleep_lock;
  /* gmr_history_enable's, and the pools' (children, routes, uses). */
  _Alignas(CACHE_LINE) gmr_lock_t lock;
  map_shard_t shards[MAP_SHARDS];
};

/* Tag the thread's last error as rt's; returns err. */
static inline int fail(gmr_runtime_t *rt, int err) {
  gmr__error_tag(rt);
  return err;
}

/* Acquire: pairs with the release of gmr_history_enable's store, so a thread
 * that sees the history also sees it initialized (its mutex, ring and clock),
 * on every memory model (aarch64 included), not only on x86. */
static inline gmr_history_t *history_of(gmr_runtime_t *rt) {
  return atomic_load_explicit(&rt->history, memory_order_acquire);
}

static inline bool has_pools(gmr_runtime_t *rt) {
  return (atomic_load_explicit(&rt->slow, memory_order_acquire) & RUNTIME_SLOW_POOLS) != 0;
}

/* runtime.c: Note [One retry]; trims the pools, closes those that then hold nothing. */
int gmr__runtime_pools_trim(gmr_runtime_t *rt, uint64_t *released);

/* runtime-stats.c: Note [Retired pools] */
void gmr__runtime_pool_retire(gmr_runtime_t *rt, gmr_runtime_t *c);
void gmr__runtime_retired_free(gmr_runtime_t *rt);

#endif
