/* lock.c: tests of gmr_lock_t (lib/core/lock.h), the hot-path mutex.
 *
 * Mutual exclusion under contention (an unprotected read-modify-write would
 * lose increments), the sleeping path (a waiter that outlasts its spin
 * counts itself a sleeper and sleeps, and unlocks wake the sleepers one at a
 * time), and no sleeper left behind when holders keep the lock for long
 * stretches while others come and go (a lost wake-up hangs this test); each
 * with both unlocks, the release store and the exchange, where the kernel
 * allows the first.
 */
#include <pthread.h>
#include <time.h>

#include "core/lock.h"
#include "tap.h"

#define WORKERS 4
#define ROUNDS  100000

static gmr_lock_t lock;
static uint64_t counter; /* guarded by lock */

static void *hammer(void *arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS; ++i) {
    gmr__lock(&lock);
    uint64_t v = counter; /* a read and a write apart, as a race would split them */
    counter = v + 1;
    gmr__unlock(&lock);
  }
  return NULL;
}

/* Like hammer, but every 500th round holds the lock for 300 us, long enough
 * for the others to give up spinning and sleep. */
static void *hammer_and_hold(void *arg) {
  (void)arg;
  for (int i = 0; i < ROUNDS / 10; ++i) {
    gmr__lock(&lock);
    uint64_t v = counter;
    if (i % 500 == 0) {
      struct timespec ts = {0, 300000};
      nanosleep(&ts, NULL);
    }
    counter = v + 1;
    gmr__unlock(&lock);
  }
  return NULL;
}

static void *once(void *arg) {
  (void)arg;
  gmr__lock(&lock);
  ++counter;
  gmr__unlock(&lock);
  return NULL;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Every case, with the unlock `light` names (lock.h: "The light unlock"). */
static void cases(const char *unlock) {
  pthread_t t[WORKERS];
  diag("unlocks: %s", unlock);

  counter = 0;
  for (int i = 0; i < WORKERS; ++i)
    pthread_create(&t[i], NULL, hammer, NULL);
  for (int i = 0; i < WORKERS; ++i)
    pthread_join(t[i], NULL);
  is_u64(counter, (uint64_t)WORKERS * ROUNDS, "%s: %d threads x %d locked increments lose none",
         unlock, WORKERS, ROUNDS);

  enum { MANY = 3 * WORKERS };
  pthread_t m[MANY];
  counter = 0;
  for (int i = 0; i < MANY; ++i)
    pthread_create(&m[i], NULL, hammer_and_hold, NULL);
  for (int i = 0; i < MANY; ++i)
    pthread_join(m[i], NULL);
  is_u64(counter, (uint64_t)MANY * (ROUNDS / 10),
         "%s: %d threads, holders sleeping inside now and then: every increment, nobody stuck",
         unlock, MANY);

#ifdef GMR_LOCK_FUTEX
  is_int(atomic_load(&lock.locked), 0, "a released lock reads locked = 0");
  is_int(atomic_load(&lock.sleepers), 0, "no sleeper is left counted");
  is_int(atomic_load(&lock.waking), 0, "no wake-up is left in flight");
  gmr__lock(&lock);
  is_int(atomic_load(&lock.locked), 1, "a lock taken reads locked = 1");

  /* Waiters that outlast their spin count themselves and sleep on the futex. */
  counter = 0;
  for (int i = 0; i < WORKERS; ++i)
    pthread_create(&t[i], NULL, once, NULL);
  int waited = 0;
  while (atomic_load(&lock.sleepers) != WORKERS && waited < 10000)
    sleep_ms(1), ++waited;
  is_int(atomic_load(&lock.sleepers), WORKERS, "%d blocked waiters count themselves sleepers",
         WORKERS);
  sleep_ms(20);
  is_u64(counter, 0, "no waiter passes a held lock");
  gmr__unlock(&lock);
  for (int i = 0; i < WORKERS; ++i)
    pthread_join(t[i], NULL);
  is_u64(counter, WORKERS, "unlocks wake the sleepers: all %d waiters got the lock", WORKERS);
  is_int(atomic_load(&lock.locked), 0, "the lock is free once they are done");
  is_int(atomic_load(&lock.sleepers), 0, "with no sleeper counted");
  is_int(atomic_load(&lock.waking), 0, "and no wake-up in flight");
#else
  gmr__lock(&lock);
  gmr__unlock(&lock);
  ok(1, "pthread fallback: lock and unlock");
#endif
}

int main(void) {
  is_int(gmr__lock_init(&lock), 0, "a lock initializes");
#ifdef GMR_LOCK_FUTEX
  /* The first init chose the unlock: a release store where the kernel offers
   * the sleepers' barrier.  Run every case with it, then with exchanges. */
  bool light = atomic_load(&gmr__lock_light) != 0;
  cases(light ? "release stores, sleepers make the barrier" : "exchanges (no barrier here)");
  if (light) {
    atomic_store(&gmr__lock_light, 0);
    cases("exchanges");
  }
#else
  cases("pthread mutex");
#endif
  gmr__lock_destroy(&lock);
  return done_testing();
}
