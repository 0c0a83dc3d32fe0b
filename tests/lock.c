/* lock.c: tests of gmr_lock_t (lib/core/lock.h), the hot-path mutex.
 *
 * Mutual exclusion under contention (an unprotected read-modify-write would
 * lose increments), the sleeping path (a waiter that outlasts its spin
 * counts itself a sleeper and sleeps, and unlocks wake the sleepers one at a
 * time), and no sleeper left behind when holders keep the lock for long
 * stretches while others come and go (a lost wake-up hangs this test); each
 * with both unlocks, the release store and the exchange, where the kernel
 * allows the first.  gmr_spin_t: the bias to its first thread (claimed,
 * kept, revoked for good by a second thread), and no increment lost when
 * others revoke it while its owner keeps taking it.
 */
#include <pthread.h>
#include <sched.h>
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

/* Every case, with the unlock `light` names (lock.h: Note [The light unlock]). */
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

/* ---- gmr_spin_t, biased and not ---- */

static gmr_spin_t spin;
static uint64_t spin_counter; /* guarded by spin */
static _Atomic int owner_running;

static void *spin_hammer(void *arg) {
  int rounds = *(const int *)arg;
  for (int i = 0; i < rounds; ++i) {
    gmr__spin_lock(&spin);
    uint64_t v = spin_counter;
    spin_counter = v + 1;
    gmr__spin_unlock(&spin);
  }
  return NULL;
}

/* The owner's side of a revocation race: it claims the lock, says so, and
 * keeps taking it while the others come and revoke the bias. */
static _Atomic int owner_stop;
static uint64_t owner_rounds; /* written by the owner, read after its join */

static void *spin_owner(void *arg) {
  (void)arg;
  uint64_t n = 0;
  do {
    gmr__spin_lock(&spin);
    uint64_t v = spin_counter;
    for (volatile int k = 0; k < 200; ++k) /* a section long enough to be found inside */
      ;
    spin_counter = v + 1;
    gmr__spin_unlock(&spin);
    if (n++ == 0) atomic_store(&owner_running, 1);
  } while (!atomic_load_explicit(&owner_stop, memory_order_relaxed));
  owner_rounds = n;
  return NULL;
}

static void spin_cases(void) {
  gmr__spin_init(&spin);
  bool biased = atomic_load(&spin.locked) == GMR_SPIN_UNCLAIMED;
  diag("spin locks: %s", biased ? "biased to their first thread" : "exchanges only");
  gmr__spin_lock(&spin);
  if (biased) {
    is_int(atomic_load(&spin.locked), GMR_SPIN_BIASED, "the first taker claims the bias");
    ok(atomic_load(&spin.owner) == gmr__thread_id() &&
           atomic_load(&spin.inside) == gmr__thread_id(),
       "and holds it biased: owner = inside = its identity");
  } else {
    is_int(atomic_load(&spin.locked), GMR_SPIN_HELD, "a spin lock taken reads HELD");
  }
  gmr__spin_unlock(&spin);
  gmr__spin_lock(&spin);
  gmr__spin_unlock(&spin);
  if (biased) {
    ok(atomic_load(&spin.locked) == GMR_SPIN_BIASED && atomic_load(&spin.inside) == 0,
       "released and taken again by its owner: still BIASED, nobody inside");
  }

  /* A second thread revokes the bias once; the lock is an exchange lock from then on. */
  int one = 1;
  spin_counter = 0;
  pthread_t t;
  pthread_create(&t, NULL, spin_hammer, &one);
  pthread_join(t, NULL);
  is_u64(spin_counter, 1, "another thread takes it");
  is_int(atomic_load(&spin.locked), GMR_SPIN_FREE, "and leaves it FREE: the bias is gone for good");
  gmr__spin_lock(&spin);
  is_int(atomic_load(&spin.locked), GMR_SPIN_HELD, "the former owner now takes it by exchange");
  gmr__spin_unlock(&spin);

  /* Races: an owner that keeps taking a fresh lock while WORKERS others
   * arrive and revoke its bias; no increment may be lost (RACES fresh locks). */
  enum { RACES = 40, OTHER_ROUNDS = 200 };
  int other_rounds = OTHER_ROUNDS;
  uint64_t lost = 0;
  for (int r = 0; r < RACES; ++r) {
    gmr__spin_init(&spin);
    spin_counter = 0;
    atomic_store(&owner_running, 0);
    atomic_store(&owner_stop, 0);
    pthread_t o, w[WORKERS];
    pthread_create(&o, NULL, spin_owner, NULL);
    while (!atomic_load(&owner_running))
      sched_yield();
    for (int i = 0; i < WORKERS; ++i)
      pthread_create(&w[i], NULL, spin_hammer, &other_rounds);
    for (int i = 0; i < WORKERS; ++i)
      pthread_join(w[i], NULL);
    atomic_store(&owner_stop, 1);
    pthread_join(o, NULL);
    lost += owner_rounds + (uint64_t)WORKERS * OTHER_ROUNDS - spin_counter;
  }
  is_u64(lost, 0, "%d revocations during the owner's run, %d threads each: no increment lost",
         RACES, WORKERS);
  is_int(atomic_load(&spin.locked), GMR_SPIN_FREE, "the last lock ends FREE");
  ok(atomic_load(&spin.inside) == 0, "with nobody inside");
}

int main(void) {
  spin_cases();
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
