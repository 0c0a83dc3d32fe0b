/* lock.c: the slow paths of gmr_lock_t (lock.h): spinning, sleeping and
 * waking on the futex.  The fast paths are inline in lock.h.
 */
#include "lock.h"

#ifdef GMR_LOCK_FUTEX
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Rounds of spinning before sleeping.  A round is one load and one pause
 * (tens of cycles to ~140 on recent x86), so the spin lasts a few
 * microseconds: longer than many hand-overs of a critical section of tens of
 * nanoseconds, shorter than a sleep and a wake-up. */
#define LOCK_SPINS 400

static inline void lock_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void gmr__lock_slow(gmr_lock_t *l) {
  for (int i = 0; i < LOCK_SPINS; ++i) {
    uint32_t s = atomic_load_explicit(&l->state, memory_order_relaxed);
    /* Taken as 1 even when sleepers exist: the next unlock then wakes
     * nobody, but a sleeper already woken re-marks the state 2 before it
     * sleeps again, so no sleeper is forgotten. */
    if (s == 0 && atomic_compare_exchange_weak_explicit(&l->state, &s, 1, memory_order_acquire,
                                                        memory_order_relaxed))
      return;
    lock_relax();
  }
  /* Mark the lock contended; whoever unlocks it next wakes a sleeper. */
  while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
    syscall(SYS_futex, (uint32_t *)&l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void gmr__lock_wake(gmr_lock_t *l) {
  syscall(SYS_futex, (uint32_t *)&l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
#endif
