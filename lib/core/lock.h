/* lock.h: gmr_lock_t, the mutex of the allocation hot paths.
 *
 * The runtime's policy lock, the pointer map's shard locks and the limit
 * policy's upstream lock guard critical sections of tens of nanoseconds.  A
 * pthread mutex costs a library call per lock and per unlock, and under
 * contention glibc's default mutex puts a waiter to sleep at once, so every
 * hand-over becomes a futex system call (microseconds) and the aggregate
 * rate of 16 threads falls far below that of one.
 *
 * See Note [gmr_lock_t], Note [The light unlock], Note [Lock invariants]
 * and Note [Event waits]; gmr_spin_t, the lock of shorter and seldom
 * contended sections, is described where it is defined.
 */
#ifndef GMR_LOCK_H
#define GMR_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

/* Once per process (lock.c): registers for the barrier and chooses the
 * unlock.  Every gmr__lock_init and gmr__spin_init calls it. */
void gmr__lock_setup(void);

/* Note [The light unlock]
 * An unlock must not read `sleepers` before its store of 0 is visible, or a
 * thread could count itself a sleeper, see the lock still held and sleep
 * while the unlocker, having read 0 sleepers, wakes nobody.
 * An exchange orders the two, at the price of a second atomic in every
 * critical section (some 20 cycles on x86, where a store and a later load
 * are otherwise free to pass each other).  Where Linux offers
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), the sleepers pay instead:
 * the unlock is a release store (a plain move on x86), and a thread about
 * to sleep (after it counted itself in `sleepers` or cleared `waking`)
 * first makes every running thread of the process pass a full barrier.  An
 * unlocker either passed it after its store (which the sleeper's futex then
 * sees: it does not sleep) or before its load of `sleepers` (which then
 * sees the sleeper: it wakes one).  `gmr__lock_light` says which unlock is
 * in use; the first lock's initialization registers the process for the
 * barrier (a few microseconds with one thread, some milliseconds once
 * others run; once per process) and sets it, before any lock exists.  A
 * sleeper that cannot make the barrier after all clears the flag and
 * sleeps at most a millisecond at a time from then on, so that no wake-up
 * can be lost.  gmr_spin_t uses the same barrier for its bias (below).
 */

/* 1: gmr_lock_t's unlocks are release stores and sleepers make the barrier
 * (see Note [The light unlock]); 0: unlocks are exchanges. */
extern _Atomic int gmr__lock_light;

#if defined(__linux__)
#define GMR_LOCK_FUTEX 1
#include <stdatomic.h>

/* Note [gmr_lock_t]
 *   lock:   CAS locked 0 -> 1, inline (one atomic, no call).  Failing that,
 *           spin on loads with exponential backoff, taking the lock when it
 *           is seen free; after the spin budget, count oneself in `sleepers`
 *           and sleep on the futex while locked == 1; once woken, clear
 *           `waking` and spin again.
 *   unlock: exchange locked to 0, inline; if sleepers > 0, wake one sleeper
 *           unless a wake-up is already in flight (`waking` == 1).
 * So a thread that keeps the lock busy pays no system call while the others
 * spin, and when some sleep, one wake-up per sleeper's attempt rather than
 * one per unlock (glibc's mutex wakes on every unlock while anyone sleeps).
 */

/* Note [Lock invariants]
 * A thread sleeps only while locked == 1 (the futex checks it) and after
 * counting itself in `sleepers`; the unlock's exchange and its
 * load of `sleepers`, the sleeper's increment and its CAS, and every access
 * to `waking` are sequentially consistent (with the light unlock: ordered
 * as if they were, by the barrier a thread makes between its increment of
 * `sleepers` or its store to `waking` and its next look at `locked`, before
 * a sleep and in a waker's second look).  Hence a sleeper is never left
 * asleep with the lock free: either an unlock after it fell asleep finds
 * waking == 0 and wakes someone, or the thread whose wake-up is in flight
 * clears `waking` (the woken thread, before it tries again; a waker that
 * woke nobody, which then looks again at `sleepers` and `locked`).
 * Not recursive and not fair, like glibc's default mutex.  Acquire/release
 * ordering makes it a full mutex for ThreadSanitizer.  Off Linux it is a
 * pthread mutex.
 */

typedef struct gmr_lock_s {
  _Atomic uint32_t locked;   /* 0 free, 1 held: the futex word */
  _Atomic uint32_t sleepers; /* threads asleep on `locked` or about to be */
  _Atomic uint32_t waking;   /* 1: a sleeper was woken and has not tried again yet */
} gmr_lock_t;

void gmr__lock_slow(gmr_lock_t *l);
void gmr__lock_wake(gmr_lock_t *l);

static inline int gmr__lock_init(gmr_lock_t *l) {
  gmr__lock_setup();
  atomic_init(&l->locked, 0);
  atomic_init(&l->sleepers, 0);
  atomic_init(&l->waking, 0);
  return 0;
}
static inline void gmr__lock_destroy(gmr_lock_t *l) {
  (void)l;
}

static inline void gmr__lock(gmr_lock_t *l) {
  uint32_t free_state = 0;
  if (GMR_LIKELY(atomic_compare_exchange_weak_explicit(&l->locked, &free_state, 1,
                                                       memory_order_acquire, memory_order_relaxed)))
    return;
  gmr__lock_slow(l);
}

/* Take l if it is free, without waiting: true when taken. */
static inline bool gmr__lock_try(gmr_lock_t *l) {
  uint32_t free_state = 0;
  return atomic_compare_exchange_strong_explicit(&l->locked, &free_state, 1, memory_order_acquire,
                                                 memory_order_relaxed);
}

/* Release l; true when a sleeper must then be woken (gmr__lock_wake), for
 * callers that make the wake-up a tail call. */
static inline bool gmr__unlock_sees_sleepers(gmr_lock_t *l) {
  if (GMR_LIKELY(atomic_load_explicit(&gmr__lock_light, memory_order_relaxed))) {
    atomic_store_explicit(&l->locked, 0, memory_order_release);
    /* Only the compiler is held back here: the sleepers' barrier orders the
     * store and the load below for the processor. */
    atomic_signal_fence(memory_order_seq_cst);
  } else {
    atomic_exchange_explicit(&l->locked, 0, memory_order_seq_cst);
  }
  return atomic_load_explicit(&l->sleepers, memory_order_seq_cst) != 0;
}

static inline void gmr__unlock(gmr_lock_t *l) {
  if (GMR_UNLIKELY(gmr__unlock_sees_sleepers(l))) gmr__lock_wake(l);
}

#else /* !__linux__ */
#include <pthread.h>
#include <stdatomic.h>

typedef struct gmr_lock_s {
  pthread_mutex_t m;
} gmr_lock_t;

static inline int gmr__lock_init(gmr_lock_t *l) {
  return pthread_mutex_init(&l->m, NULL) == 0 ? 0 : GMR_ENOMEM;
}
static inline void gmr__lock_destroy(gmr_lock_t *l) {
  pthread_mutex_destroy(&l->m);
}
static inline void gmr__lock(gmr_lock_t *l) {
  pthread_mutex_lock(&l->m);
}
static inline bool gmr__lock_try(gmr_lock_t *l) {
  return pthread_mutex_trylock(&l->m) == 0;
}
static inline void gmr__unlock(gmr_lock_t *l) {
  pthread_mutex_unlock(&l->m);
}
#endif

/* The calling thread's identity, unique among live threads: the thread
 * pointer (one register read) where the compiler has it, else pthread_self
 * (a call; a thread-local variable would cost a __tls_get_addr call in a
 * shared library, and the initial-exec model fails when Python loads it).
 * A finished thread's identity may be reused by a new thread. */
#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer) && (defined(__x86_64__) || defined(__aarch64__))
#define GMR_THREAD_POINTER 1
#endif
#endif
#ifndef GMR_THREAD_POINTER
#include <pthread.h>
#endif
static inline uintptr_t gmr__thread_id(void) {
#ifdef GMR_THREAD_POINTER
  return (uintptr_t)__builtin_thread_pointer();
#else
  return (uintptr_t)pthread_self();
#endif
}

/* gmr_spin_t: the lock of sections of a few tens of nanoseconds that are
 * seldom contended (the pointer map's 1024 shards, the caching policy's
 * streams).  Unbiased (below): lock one exchange, inline; unlock one
 * release store.  A waiter spins on loads with a pause between two, and yields the processor
 * every 64 looks (gmr__spin_wait): it never sleeps in the kernel, so there
 * is no wake-up to send and none to miss; a holder that is preempted costs
 * its waiters their time slices.  Acquire/release: a full mutex for
 * ThreadSanitizer.
 *
 * Biased to its first thread.  Most of these locks are only ever taken by
 * one thread (a shard or a stream used by one thread), and the exchange is
 * most of what an uncontended lock costs (some 20 cycles on x86).  Where
 * the sleepers' barrier of gmr_lock_t exists (membarrier, see
 * Note [The light unlock]), a spin lock starts UNCLAIMED; the first thread to take it
 * becomes its `owner`, and from then on takes and releases it without an
 * atomic read-modify-write: it stores its identity in `inside`, then reads
 * `locked`, and holds the lock if that still says BIASED (releasing it
 * stores inside = 0).  Any other thread's exchange finds BIASED, which
 * revokes the bias for good: that thread now holds the lock (HELD), makes
 * every running thread pass a full barrier, then waits for inside == 0.
 * The owner either passed the barrier before its read of `locked` (which
 * then sees HELD: it clears `inside` and takes the exchange path like
 * anyone else) or after its store to `inside` (which the revoker then
 * sees: it waits until the owner's section ends).
 *   locked: FREE 0, HELD 1 (by exchange), BIASED 2, UNCLAIMED 3;
 *   `inside` is written by the owner only, and
 *   the owner holds it biased  <=>  inside == owner (and then, until a
 *     revoker's exchange, locked == BIASED);
 *   BIASED and UNCLAIMED occur only while the barrier is available, and
 *   no state returns to them. */
enum { GMR_SPIN_FREE = 0, GMR_SPIN_HELD = 1, GMR_SPIN_BIASED = 2, GMR_SPIN_UNCLAIMED = 3 };

typedef struct gmr_spin_s {
  _Atomic int locked;       /* GMR_SPIN_* */
  _Atomic uintptr_t owner;  /* gmr__thread_id of the thread it is biased to (0: none) */
  _Atomic uintptr_t inside; /* the owner's identity while it holds it biased, else 0 */
} gmr_spin_t;

/* lock.c: take it after an exchange that returned `seen` (not FREE), true
 * when taken biased (claimed); the initial state of `locked`. */
bool gmr__spin_wait(gmr_spin_t *l, int seen);
int gmr__spin_initial_state(void);

static inline void gmr__spin_init(gmr_spin_t *l) {
  atomic_init(&l->locked, gmr__spin_initial_state());
  atomic_init(&l->owner, 0);
  atomic_init(&l->inside, 0);
}
/* Take l if it is biased to the calling thread (and not revoked), with no
 * read-modify-write; false: nothing is taken.  Hot paths try this inline
 * and take the lock out of line otherwise (gmr__spin_take), so that the
 * exchange, the wait and their registers stay off the common path. */
static inline bool gmr__spin_try_biased(gmr_spin_t *l) {
  const uintptr_t me = gmr__thread_id();
  if (GMR_LIKELY(atomic_load_explicit(&l->owner, memory_order_relaxed) == me)) {
    atomic_store_explicit(&l->inside, me, memory_order_relaxed);
    /* The compiler keeps the store before the load; a revoker's barrier
     * orders them for the processor. */
    atomic_signal_fence(memory_order_seq_cst);
    if (GMR_LIKELY(atomic_load_explicit(&l->locked, memory_order_acquire) == GMR_SPIN_BIASED))
      return true;
    atomic_store_explicit(&l->inside, 0, memory_order_release); /* revoked */
  }
  return false;
}
/* Take l; true when it is held biased.  A caller that releases it in the
 * same function passes that to gmr__spin_release (which then need not ask
 * who holds it); others call gmr__spin_lock and gmr__spin_unlock. */
static inline bool gmr__spin_take(gmr_spin_t *l) {
  if (GMR_LIKELY(gmr__spin_try_biased(l))) return true;
  int seen = atomic_exchange_explicit(&l->locked, GMR_SPIN_HELD, memory_order_acquire);
  if (GMR_LIKELY(seen == GMR_SPIN_FREE)) return false;
  return gmr__spin_wait(l, seen);
}
static inline void gmr__spin_release(gmr_spin_t *l, bool biased) {
  if (biased)
    atomic_store_explicit(&l->inside, 0, memory_order_release);
  else
    atomic_store_explicit(&l->locked, GMR_SPIN_FREE, memory_order_release);
}
static inline void gmr__spin_lock(gmr_spin_t *l) {
  (void)gmr__spin_take(l);
}
/* Held biased  <=>  inside == the caller's identity (only the owner writes it). */
static inline void gmr__spin_unlock(gmr_spin_t *l) {
  gmr__spin_release(l, atomic_load_explicit(&l->inside, memory_order_relaxed) == gmr__thread_id());
}

/* Note [Event waits]
 * Waiting for an event under the lock (a condition variable that uses the
 * lock itself): the waiter reads an event counter under the lock, then calls
 * gmr__lock_wait_until(l, &counter, seen, deadline), which unlocks, sleeps
 * while the counter still equals `seen` (at most until `deadline`, in
 * CLOCK_MONOTONIC nanoseconds) and locks again; whoever makes the event
 * happen calls gmr__wake_all(&counter), which bumps the counter and wakes
 * every sleeper.  A return does not promise the event: callers look again.
 */

/* Event waits (see Note [Event waits]); lock.c. */
void gmr__lock_wait_until(gmr_lock_t *l, _Atomic uint32_t *counter, uint32_t seen,
                          uint64_t deadline_ns);
void gmr__wake_all(_Atomic uint32_t *counter);

#endif /* GMR_LOCK_H */
