/* lock.c: the process-wide barrier (membarrier) that lets unlocks and biased locks skip
 * their atomics; the slow paths of gmr_spin_t (claiming the bias, revoking it,
 * spinning); the slow paths of gmr_lock_t (lock.h): spinning with backoff,
 * the sleepers' barrier, sleeping on the futex, and waking one sleeper; and
 * the event waits (gmr__lock_wait_until, gmr__wake_all).  The fast paths are
 * inline in lock.h.
 */
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "core/lock.h"

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static inline void lock_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- the barrier ---------------------------------------------------------------
 * lock_barrier() makes every running thread of the process pass a full memory
 * barrier (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)).  The process
 * registers for it once, at the first lock's initialization (a few
 * microseconds in a process of one thread, some milliseconds once it runs
 * others); a fork's child inherits the registration.  barrier_state: 1 when
 * registered, 0 when the barrier is not available, -1 once one failed
 * after all.  gmr__lock_light (lock.h) is 1 while barrier_state is 1. */
_Atomic int gmr__lock_light = 0;
static pthread_once_t lock_setup_once = PTHREAD_ONCE_INIT;
static _Atomic int barrier_state = 0;

static void lock_setup_barrier(void) {
#if defined(__linux__) && defined(SYS_membarrier)
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
      (cmds & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0 &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
    atomic_store_explicit(&barrier_state, 1, memory_order_relaxed);
    atomic_store_explicit(&gmr__lock_light, 1, memory_order_relaxed);
  }
#endif
}

void gmr__lock_setup(void) {
  pthread_once(&lock_setup_once, lock_setup_barrier);
}

/* True when every running thread passed a full barrier; false when the
 * barrier is not available (then nothing relies on it: light unlocks and
 * biased locks stop being made, and the callers fall back). */
static bool lock_barrier(void) {
  if (atomic_load_explicit(&barrier_state, memory_order_acquire) != 1) return false;
#if defined(__linux__) && defined(SYS_membarrier)
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return true;
#endif
  atomic_store_explicit(&gmr__lock_light, 0, memory_order_relaxed);
  atomic_store_explicit(&barrier_state, -1, memory_order_release);
  return false;
}

/* ---- gmr_spin_t's slow paths ------------------------------------------------- */

int gmr__spin_initial_state(void) {
  gmr__lock_setup();
  return atomic_load_explicit(&barrier_state, memory_order_acquire) == 1 ? GMR_SPIN_UNCLAIMED
                                                                         : GMR_SPIN_FREE;
}

/* One look's wait: a pause, and every 64th time the processor yielded. */
static void spin_relax_or_yield(unsigned *n) {
  if (++*n < 64) {
    lock_relax();
  } else {
    *n = 0;
    sched_yield();
  }
}

bool gmr__spin_wait(gmr_spin_t *l, int seen) {
  for (;;) {
    switch (seen) {
    case GMR_SPIN_FREE:
      return false;
    case GMR_SPIN_UNCLAIMED:
      /* The first taker: the lock is ours by exchange, and becomes ours by
       * bias; others' exchanges meanwhile see HELD and wait. */
      atomic_store_explicit(&l->owner, gmr__thread_id(), memory_order_relaxed);
      atomic_store_explicit(&l->inside, gmr__thread_id(), memory_order_relaxed);
      atomic_store_explicit(&l->locked, GMR_SPIN_BIASED, memory_order_release);
      return true;
    case GMR_SPIN_BIASED:
      /* Revoked: held by exchange now.  After the barrier the owner is either
       * seen inside (wait until it leaves) or will see HELD. */
      if (!lock_barrier()) {
        /* No barrier after all (it did exist when the bias was given): an
         * owner's store to `inside` leaves its store buffer long before a
         * millisecond has passed. */
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
      }
      for (unsigned n = 0; atomic_load_explicit(&l->inside, memory_order_acquire) != 0;)
        spin_relax_or_yield(&n);
      return false;
    default: /* HELD */
      for (unsigned n = 0; atomic_load_explicit(&l->locked, memory_order_relaxed) == GMR_SPIN_HELD;)
        spin_relax_or_yield(&n);
      seen = atomic_exchange_explicit(&l->locked, GMR_SPIN_HELD, memory_order_acquire);
    }
  }
}

static uint64_t lock_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#ifdef GMR_LOCK_FUTEX
#include <linux/futex.h>

/* Called between a store the unlockers must see (a sleeper's increment of
 * `sleepers`, a cleared `waking`) and the next look at `locked`: with light
 * unlocks, every running thread passes a full barrier.  True when a sleep
 * may last until a wake-up; false when it must be bounded (an unlock that
 * read gmr__lock_light before a failed barrier cleared it may still be a
 * light one). */
static bool lock_fence(void) {
  int state = atomic_load_explicit(&barrier_state, memory_order_acquire);
  if (state == 0) return true; /* never light: unlocks are exchanges */
  return state == 1 && lock_barrier();
}

/* The longest sleep when no barrier could be made. */
#define LOCK_BOUNDED_SLEEP_NS 1000000L

/* The spin budget: LOCK_SPIN_ROUNDS looks at the lock, with 1, 2, 4 ... up to
 * LOCK_SPIN_MAX_PAUSES pauses between two looks (a pause is ~10 to ~140
 * cycles, depending on the processor), so a waiter spins for some 10 to
 * 100 microseconds: many hand-overs of a critical section of tens of
 * nanoseconds, and less than a sleep and a wake-up cost the holder. */
#define LOCK_SPIN_ROUNDS     64
#define LOCK_SPIN_MAX_PAUSES 16

static inline bool lock_try(gmr_lock_t *l) {
  uint32_t free_state = 0;
  return atomic_load_explicit(&l->locked, memory_order_relaxed) == 0 &&
         atomic_compare_exchange_strong_explicit(&l->locked, &free_state, 1, memory_order_seq_cst,
                                                 memory_order_relaxed);
}

/* Spin for the budget; true when the lock was taken. */
static bool lock_spin(gmr_lock_t *l) {
  unsigned pauses = 1;
  for (int round = 0; round < LOCK_SPIN_ROUNDS; ++round) {
    if (lock_try(l)) return true;
    for (unsigned i = 0; i < pauses; ++i)
      lock_relax();
    if (pauses < LOCK_SPIN_MAX_PAUSES) pauses *= 2;
  }
  return false;
}

void gmr__lock_slow(gmr_lock_t *l) {
  if (lock_spin(l)) return;
  atomic_fetch_add_explicit(&l->sleepers, 1, memory_order_seq_cst);
  for (;;) {
    if (lock_try(l)) break;
    /* Sleeps only while locked == 1; an unlock after the increment above
     * (or after the store to `waking` below) sees this sleeper and wakes
     * one. */
    static const struct timespec bound = {0, LOCK_BOUNDED_SLEEP_NS};
    const struct timespec *timeout = lock_fence() ? NULL : &bound;
    syscall(SYS_futex, (uint32_t *)&l->locked, FUTEX_WAIT_PRIVATE, 1, timeout, NULL, 0);
    /* Woken (or the lock changed before the sleep): let the next unlock wake
     * another sleeper if this one loses again, then compete by spinning. */
    atomic_store_explicit(&l->waking, 0, memory_order_seq_cst);
    if (lock_spin(l)) break;
  }
  atomic_fetch_sub_explicit(&l->sleepers, 1, memory_order_relaxed);
}

void gmr__lock_wake(gmr_lock_t *l) {
  for (;;) {
    /* One wake-up in flight at a time; whoever set `waking` finishes the job. */
    if (atomic_load_explicit(&l->waking, memory_order_seq_cst) != 0 ||
        atomic_exchange_explicit(&l->waking, 1, memory_order_seq_cst) != 0)
      return;
    /* A woken thread clears `waking` itself before it tries again. */
    if (syscall(SYS_futex, (uint32_t *)&l->locked, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0) > 0)
      return;
    /* Nobody was asleep yet.  Unlocks since the exchange above skipped their
     * wake-up, so a thread that fell asleep meanwhile under one of them could
     * be left asleep with the lock free: look again. */
    atomic_store_explicit(&l->waking, 0, memory_order_seq_cst);
    (void)lock_fence(); /* when it fails, every sleeper wakes within the bound */
    if (atomic_load_explicit(&l->sleepers, memory_order_seq_cst) == 0 ||
        atomic_load_explicit(&l->locked, memory_order_seq_cst) != 0)
      return; /* no sleeper, or a holder whose unlock comes after the store above */
  }
}

void gmr__lock_wait_until(gmr_lock_t *l, _Atomic uint32_t *counter, uint32_t seen,
                          uint64_t deadline_ns) {
  uint64_t now = lock_now_ns();
  gmr__unlock(l);
  if (now < deadline_ns && atomic_load_explicit(counter, memory_order_seq_cst) == seen) {
    uint64_t left = deadline_ns - now;
    struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
    /* Sleeps only while *counter == seen: a wake-up after the load above is
     * not lost. */
    syscall(SYS_futex, (uint32_t *)counter, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
  }
  gmr__lock(l);
}

void gmr__wake_all(_Atomic uint32_t *counter) {
  atomic_fetch_add_explicit(counter, 1, memory_order_seq_cst);
  syscall(SYS_futex, (uint32_t *)counter, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

#else /* !GMR_LOCK_FUTEX: poll the counter every millisecond */

void gmr__lock_wait_until(gmr_lock_t *l, _Atomic uint32_t *counter, uint32_t seen,
                          uint64_t deadline_ns) {
  gmr__unlock(l);
  for (uint64_t now = lock_now_ns();
       now < deadline_ns && atomic_load_explicit(counter, memory_order_seq_cst) == seen;
       now = lock_now_ns()) {
    uint64_t left = deadline_ns - now < 1000000 ? deadline_ns - now : 1000000;
    struct timespec ts = {0, (long)left};
    nanosleep(&ts, NULL);
  }
  gmr__lock(l);
}

void gmr__wake_all(_Atomic uint32_t *counter) {
  atomic_fetch_add_explicit(counter, 1, memory_order_seq_cst);
}
#endif
