/* lock.c: tests of gmr_lock_t (lib/lock.h), the hot-path mutex.
 *
 * Mutual exclusion under contention (an unprotected read-modify-write would
 * lose increments), the sleeping path (a waiter that outlasts its spin marks
 * the lock contended and sleeps, and the unlock wakes it), and the state
 * word's three values.
 */
#include <pthread.h>
#include <time.h>

#include "lock.h"
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

int main(void) {
  is_int(gmr__lock_init(&lock), 0, "a lock initializes");
  pthread_t t[WORKERS];

  counter = 0;
  for (int i = 0; i < WORKERS; ++i)
    pthread_create(&t[i], NULL, hammer, NULL);
  for (int i = 0; i < WORKERS; ++i)
    pthread_join(t[i], NULL);
  is_u64(counter, (uint64_t)WORKERS * ROUNDS, "%d threads x %d locked increments lose none",
         WORKERS, ROUNDS);

#ifdef GMR_LOCK_FUTEX
  is_int(atomic_load(&lock.state), 0, "a released lock reads 0 (free)");
  gmr__lock(&lock);
  is_int(atomic_load(&lock.state), 1, "a lock taken without contention reads 1 (held)");

  /* Waiters that outlast their spin mark the lock 2 and sleep on the futex. */
  counter = 0;
  for (int i = 0; i < WORKERS; ++i)
    pthread_create(&t[i], NULL, once, NULL);
  int waited = 0;
  while (atomic_load(&lock.state) != 2 && waited < 10000)
    sleep_ms(1), ++waited;
  is_int(atomic_load(&lock.state), 2, "blocked waiters mark the lock contended (2)");
  sleep_ms(20);
  is_u64(counter, 0, "no waiter passes a held lock");
  gmr__unlock(&lock);
  for (int i = 0; i < WORKERS; ++i)
    pthread_join(t[i], NULL);
  is_u64(counter, WORKERS, "each unlock wakes a sleeper: all %d waiters got the lock", WORKERS);
  is_int(atomic_load(&lock.state), 0, "the lock is free once they are done");
#else
  gmr__lock(&lock);
  gmr__unlock(&lock);
  ok(1, "pthread fallback: lock and unlock");
#endif
  gmr__lock_destroy(&lock);
  return done_testing();
}
