/* lock.h: gmr_lock_t, the mutex of the allocation hot paths.
 *
 * The runtime's policy lock, the pointer map's shard locks and the limit
 * policy's upstream lock guard critical sections of tens of nanoseconds.  A
 * pthread mutex costs a library call per lock and per unlock, and under
 * contention glibc's default mutex puts a waiter to sleep at once, so every
 * hand-over becomes a futex system call (microseconds): the aggregate rate
 * of 16 threads falls far below that of one.
 *
 * gmr_lock_t is the three-state futex mutex of Drepper's "Futexes Are
 * Tricky" (mutex 2) with a bounded spin before sleeping:
 *   state = 0: free;  1: held;  2: held, and a thread may sleep on it.
 *   lock:   CAS 0 -> 1 inline (one atomic, no call); else spin on loads for a
 *           while, taking it when it is seen free; then exchange in 2 and
 *           sleep on the futex until the exchange returns 0.
 *   unlock: exchange in 0 inline; wake one sleeper only if the state was 2.
 * Invariant: a thread sleeps only while state == 2, so an unlock that sees
 * 1 has nobody to wake.  Not recursive and not fair, like glibc's default
 * mutex.  Acquire/release ordering makes it a full mutex for ThreadSanitizer.
 * Off Linux it is a pthread mutex.
 */
#ifndef GMR_LOCK_H
#define GMR_LOCK_H

#include <stdint.h>

#include "internal.h"

#if defined(__linux__)
#define GMR_LOCK_FUTEX 1
#include <stdatomic.h>

typedef struct gmr_lock_s {
  _Atomic uint32_t state; /* 0 free, 1 held, 2 held with possible sleepers */
} gmr_lock_t;

void gmr__lock_slow(gmr_lock_t *l);
void gmr__lock_wake(gmr_lock_t *l);

static inline int gmr__lock_init(gmr_lock_t *l) {
  atomic_init(&l->state, 0);
  return 0;
}
static inline void gmr__lock_destroy(gmr_lock_t *l) {
  (void)l;
}

static inline void gmr__lock(gmr_lock_t *l) {
  uint32_t free_state = 0;
  if (GMR_LIKELY(atomic_compare_exchange_weak_explicit(&l->state, &free_state, 1,
                                                       memory_order_acquire, memory_order_relaxed)))
    return;
  gmr__lock_slow(l);
}

static inline void gmr__unlock(gmr_lock_t *l) {
  if (GMR_UNLIKELY(atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2))
    gmr__lock_wake(l);
}

#else /* !__linux__ */
#include <pthread.h>

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
static inline void gmr__unlock(gmr_lock_t *l) {
  pthread_mutex_unlock(&l->m);
}
#endif

#endif /* GMR_LOCK_H */
