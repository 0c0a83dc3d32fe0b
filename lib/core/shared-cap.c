/* shared-cap.c: one cap on a device's memory across processes, daemon-free
 * and safe against kill -9 (the design: docs/shared-cap.md).
 *
 * The file (one per device, by default /dev/shm/gmr-cap-<uid>-<device id>)
 * is a header and SCAP_SLOTS fixed slots; a slot's index is its identity for
 * its whole life (no compaction).  Every change is made under the file's
 * lock, a kernel-held OFD lock on a byte of the file (Note [The file's
 * lock]); nothing read from the mapping is trusted (Note [Validating the
 * file]), and only files no one outside the trust domain can write are used
 * (Note [Trusting the file]).  Liveness, forks and unlinks: Note [Liveness].
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/lock.h"
#include "core/shared-cap.h"

#define SCAP_MAGIC         0x3170614372756d67ull /* "gmurCap1" */
#define SCAP_VERSION       2u                    /* 1: a robust pthread mutex in the header */
#define SCAP_SLOTS         256u
#define SCAP_HEADER_SIZE   4096u
#define SCAP_SLOT_SIZE     128u
#define SCAP_FILE_SIZE     (SCAP_HEADER_SIZE + SCAP_SLOTS * SCAP_SLOT_SIZE)
#define SCAP_LOCK_BASE     ((off_t)1 << 30)     /* liveness byte of slot i: BASE + i */
#define SCAP_LOCK_MU       (SCAP_LOCK_BASE - 2) /* the file's lock */
#define SCAP_LINK_CHECK_NS 50000000ull          /* 50 ms */
#define SCAP_LABEL         64
#define SCAP_DEVICE_ID     96

enum { SLOT_FREE = 0, SLOT_LIVE = 1 };

/* Note [Liveness]
 * Byte SCAP_LOCK_BASE + i of the file carries an OFD write lock held by the
 * process that owns slot i, through a descriptor that is never mapped (a
 * MAP_SHARED mapping keeps its open file description alive, and with it the
 * lock).  The kernel drops it when the process dies, whatever its pid or PID
 * namespace: "can I take that byte?" is the liveness test; pids are kept for
 * display only.  The file's lock (Note [The file's lock]) is held while a
 * process makes or checks the header.
 *
 * Invariants, between holds of the file's lock (over LIVE slots):
 *   committed  = Σ max(used_i, guaranteed_i)     guaranteed_sum = Σ guaranteed_i <= cap
 *   held       = Σ used_i <= cap                 used_i <= quota_i (quota 0: none)
 *   committed <= cap, except after a claim whose guarantee others were using:
 *              then nobody grows past their guarantee until frees bring it back.
 * The totals are derived: the sweep (at every claim, when a reservation
 * would pass the cap, after a holder died in the lock, and when a total
 * looks wrong) frees the slots of dead processes and recomputes them.
 *
 * Fork: a child inherits the lock descriptor, and with it the parent's
 * liveness byte.  A pthread_atfork handler closes it in the child and forgets
 * the slot; the child claims its own on its next reservation.
 *
 * Unlink: a file unlinked while processes use it splits the domain (those
 * that attach later make a new file).  At most every SCAP_LINK_CHECK_NS on
 * the reservation path the link count is looked at; at 0 the process logs
 * "domain split" and moves its slot, with its bytes, to the file now at the
 * path.
 *
 * Synchronization in the process: `op` (one per handle) is taken before the
 * file's lock, since an OFD lock does not exclude the threads that share its
 * descriptor; h->f, h->lockfd, h->slot, h->gen and h->used change under it.
 * `local` serializes the slow paths (a new lock descriptor after fork, moves,
 * detach) and is taken before `op`; the registry of handles (for fork) has
 * its own mutex, taken before any `local`.  A retired mapping (after a move)
 * stays until detach: a view may still read it without the lock.
 */

typedef struct scap_slot_s {
  _Atomic uint32_t state; /* SLOT_* */
  _Atomic uint32_t gen;   /* + 1 at every claim */
  _Atomic uint64_t quota;
  _Atomic uint64_t guaranteed;
  _Atomic uint64_t used; /* bytes reserved */
  _Atomic int32_t pid;   /* display only */
  uint32_t pad;
  _Atomic uint64_t claimed_at; /* CLOCK_REALTIME seconds */
  _Atomic uint64_t ops;        /* reservations and releases applied */
  uint64_t spare;
  char label[SCAP_LABEL];
} scap_slot_t;
_Static_assert(sizeof(scap_slot_t) == SCAP_SLOT_SIZE, "slot layout");

typedef struct scap_header_s {
  _Atomic uint64_t magic;
  uint32_t version, header_size, slot_size, nslots;
  uint64_t file_size;
  uint64_t cap;
  char device_id[SCAP_DEVICE_ID];
  _Alignas(64) _Atomic uint32_t busy; /* 1 while a process holds the lock */
  _Atomic int32_t holder_pid;         /* the pid that last took it (for messages) */
  _Atomic uint64_t committed;         /* Σ max(used, guaranteed) */
  _Atomic uint64_t held;              /* Σ used */
  _Atomic uint64_t guaranteed_sum;
  _Atomic uint32_t live;
  _Alignas(64) _Atomic uint64_t sweeps;
  _Atomic uint64_t repairs;  /* a holder died in the lock: totals rebuilt */
  _Atomic uint64_t timeouts; /* waits for the lock that gave up */
  _Atomic uint64_t ops;      /* reservations and releases applied */
  _Atomic uint64_t freed;    /* slots of dead processes freed by sweeps */
  _Atomic uint64_t corrupt;  /* times the file was found corrupt and rebuilt */
} scap_header_t;
/* The fixed part of the header, compared at every lock (Note [Validating the file]). */
#define SCAP_HEADER_FIXED offsetof(scap_header_t, busy)
_Static_assert(sizeof(scap_header_t) <= SCAP_HEADER_SIZE, "header layout");

typedef struct scap_file_s {
  scap_header_t h;
  char pad[SCAP_HEADER_SIZE - sizeof(scap_header_t)];
  scap_slot_t slot[SCAP_SLOTS];
} scap_file_t;
_Static_assert(sizeof(scap_file_t) == SCAP_FILE_SIZE, "file layout");

/* A retired mapping (after a move to a new file): kept until detach, since
 * another thread may still be about to lock its mutex. */
typedef struct scap_retired_s {
  scap_file_t *f;
  struct scap_retired_s *next;
} scap_retired_t;

struct gmr_scap_s {
  gmr_lock_t local;   /* the slow paths: reclaim after fork, moves, detach */
  pthread_mutex_t op; /* taken before the file's lock (Note [Liveness]) */
  _Atomic(scap_file_t *) f;
  int mapfd;                        /* under local */
  _Atomic int lockfd;               /* < 0: no lock descriptor (after fork) */
  _Atomic int slot;                 /* -1: none; changes under op */
  uint32_t gen;                     /* under op */
  _Atomic uint64_t used;            /* bytes this process reserved: the truth; under op */
  uint64_t next_corrupt_log;        /* CLOCK_MONOTONIC_COARSE ns; under op */
  scap_header_t expect;             /* the fixed part of the header */
  bool created;                     /* this handle made the file */
  int32_t pid;                      /* getpid(), kept: it is a system call */
  _Atomic uint64_t next_link_check; /* CLOCK_MONOTONIC_COARSE ns */
  _Atomic uint64_t owed;            /* releases that could not get the lock in time */
  scap_retired_t *retired;          /* under local */
  gmr_scap_opts_t o;                /* strings below */
  char path[512];
  char device_id[SCAP_DEVICE_ID];
  char label[SCAP_LABEL];
  struct gmr_scap_s *next; /* registry */
};

/* ---- small helpers ----------------------------------------------------------- */

static inline uint64_t max64(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

static uint64_t coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int sys_fail(const char *what, const char *path) {
  int e = errno;
  return gmr__error_set(GMR_EIO, "shared cap: %s %s: %s", what, path, strerror(e));
}

/* An OFD lock on one byte: F_WRLCK or F_UNLCK; 0, or -1 with errno. */
static int ofd_lock(int fd, off_t at, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Is slot i's liveness byte free (its owner gone)?  Takes and drops it. */
static bool slot_dead(int fd, unsigned i) {
  if (ofd_lock(fd, SCAP_LOCK_BASE + (off_t)i, F_WRLCK) != 0) return false;
  ofd_lock(fd, SCAP_LOCK_BASE + (off_t)i, F_UNLCK);
  return true;
}

static void fmt_size(uint64_t b, char *buf, size_t len) {
  gmr__format_size(b, buf, len);
}

/* ---- the registry of handles (fork) ------------------------------------------------ */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static gmr_scap_t *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void reg_prepare(void) {
  pthread_mutex_lock(&reg_mu);
  for (gmr_scap_t *h = reg_head; h; h = h->next) {
    gmr__lock(&h->local);
    pthread_mutex_lock(&h->op);
  }
}
static void reg_parent(void) {
  for (gmr_scap_t *h = reg_head; h; h = h->next) {
    pthread_mutex_unlock(&h->op);
    gmr__unlock(&h->local);
  }
  pthread_mutex_unlock(&reg_mu);
}
/* The child owns no slot: the parent's liveness byte must not live on in it. */
static void reg_child(void) {
  for (gmr_scap_t *h = reg_head; h; h = h->next) {
    if (h->lockfd >= 0) close(h->lockfd);
    h->lockfd = -1;
    h->slot = -1;
    h->used = 0; /* the parent's reservations stay the parent's */
    h->pid = (int32_t)getpid();
    atomic_store(&h->owed, 0);
    pthread_mutex_unlock(&h->op);
    gmr__unlock(&h->local);
  }
  pthread_mutex_unlock(&reg_mu);
}
static void reg_init(void) {
  pthread_atfork(reg_prepare, reg_parent, reg_child);
}
static void reg_add(gmr_scap_t *h) {
  pthread_once(&reg_once, reg_init);
  pthread_mutex_lock(&reg_mu);
  h->next = reg_head;
  reg_head = h;
  pthread_mutex_unlock(&reg_mu);
}
static void reg_remove(gmr_scap_t *h) {
  pthread_mutex_lock(&reg_mu);
  for (gmr_scap_t **p = &reg_head; *p; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      break;
    }
  pthread_mutex_unlock(&reg_mu);
}

/* ---- the lock, the sweep ------------------------------------------------------------- */

/* Note [Validating the file]
 * Any writer of the file (a buggy process of this user, a member of the
 * group under shared_by: group) can write anything into it at any time, so
 * nothing read from the mapping decides more than a refusal, and nothing in
 * it can crash or hang a reader:
 *   - no lock lives there (Note [The file's lock]); `busy` and `holder_pid`
 *     are hints for repair and messages;
 *   - at every lock: fstat (a file that was cut or grown is sized back
 *     before the mapping is touched, Note [A file that shrinks]), the fixed
 *     part of the header against this process's own copy (magic, version,
 *     layout, device, cap: the cap is always this process's configured one,
 *     never the file's), and the totals against each other (held <= cap,
 *     held <= committed <= held + guaranteed_sum, live <= slots);
 *   - this process's own slot against what it knows (h->used, quota,
 *     guarantee, gen): the process, not the file, is the truth of its share;
 *   - the sweep frees slots in an unknown state, clamps what another live
 *     slot claims to the cap, and adds with saturation (no sum overflows).
 * Anything found wrong is logged as corrupt (at most once a second), counted
 * in the header, and rebuilt: the header from this process's copy, its slot
 * from its own figures, the totals by a sweep; every other live member
 * rewrites its own slot at its next lock.  Between a hostile write and the
 * repair the totals can be wrong (the cap may be passed or refuse early);
 * a file that keeps being rewritten cannot hold a cap, and docs/shared-cap.md
 * ("Trust") says who can write it.
 */

static inline uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Say (at most once a second per handle) that the file was corrupt. */
static void corrupt(gmr_scap_t *h, scap_file_t *f, const char *what) {
  atomic_fetch_add_explicit(&f->h.corrupt, 1, memory_order_relaxed);
  uint64_t now = coarse_ns();
  if (now < h->next_corrupt_log) return;
  h->next_corrupt_log = now + 1000000000ull;
  gmr__log(GMR_LOG_WARN, "shared cap: %s is corrupt (%s); rebuilt from the live members", h->path,
           what);
}

/* Write this process's slot from what it knows.  Caller: holds the lock. */
static void slot_write(gmr_scap_t *h, scap_slot_t *s) {
  atomic_store_explicit(&s->gen, h->gen, memory_order_relaxed);
  atomic_store_explicit(&s->quota, h->o.quota, memory_order_relaxed);
  atomic_store_explicit(&s->guaranteed, h->o.guaranteed, memory_order_relaxed);
  atomic_store_explicit(&s->used, h->used, memory_order_relaxed);
  atomic_store_explicit(&s->pid, h->pid, memory_order_relaxed);
  memset(s->label, 0, sizeof s->label);
  snprintf(s->label, sizeof s->label, "%s", h->label);
  atomic_store_explicit(&s->state, SLOT_LIVE, memory_order_release);
}

/* Recompute every total from the slots, freeing those of dead processes and
 * those in no known state (Note [Validating the file]).  Caller: holds the
 * lock. */
static void sweep(gmr_scap_t *h) {
  scap_file_t *f = h->f;
  uint64_t cap = h->o.cap, committed = 0, held = 0, gsum = 0;
  uint32_t live = 0;
  for (unsigned i = 0; i < SCAP_SLOTS; ++i) {
    scap_slot_t *s = &f->slot[i];
    uint32_t state = atomic_load_explicit(&s->state, memory_order_relaxed);
    uint64_t u, g;
    if ((int)i == h->slot) {
      u = h->used, g = h->o.guaranteed; /* ours: what we know */
      if (state != SLOT_LIVE || atomic_load_explicit(&s->used, memory_order_relaxed) != u ||
          atomic_load_explicit(&s->guaranteed, memory_order_relaxed) != g ||
          atomic_load_explicit(&s->gen, memory_order_relaxed) != h->gen) {
        corrupt(h, f, "this process's slot was changed");
        slot_write(h, s);
      }
    } else if (state == SLOT_FREE) {
      continue;
    } else if (state != SLOT_LIVE) {
      corrupt(h, f, "a slot in an unknown state");
      atomic_store_explicit(&s->used, 0, memory_order_relaxed);
      atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
      continue; /* a live owner writes it back at its next lock */
    } else if (slot_dead(h->lockfd, i)) {
      atomic_store_explicit(&s->used, 0, memory_order_relaxed);
      atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
      atomic_fetch_add_explicit(&f->h.freed, 1, memory_order_relaxed);
      continue;
    } else {
      u = atomic_load_explicit(&s->used, memory_order_relaxed);
      g = atomic_load_explicit(&s->guaranteed, memory_order_relaxed);
      if (u > cap || g > cap) {
        corrupt(h, f, "a slot holds more than the cap");
        u = u > cap ? cap : u;
        g = g > cap ? cap : g;
      }
    }
    committed = sat_add(committed, max64(u, g));
    held = sat_add(held, u);
    gsum = sat_add(gsum, g);
    ++live;
  }
  atomic_store_explicit(&f->h.committed, committed, memory_order_relaxed);
  atomic_store_explicit(&f->h.held, held, memory_order_relaxed);
  atomic_store_explicit(&f->h.guaranteed_sum, gsum, memory_order_relaxed);
  atomic_store_explicit(&f->h.live, live, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->h.sweeps, 1, memory_order_relaxed);
}

/* Note [The file's lock]
 * An OFD write lock on byte SCAP_LOCK_MU of the file, through the lock
 * descriptor, with the handle's `op` mutex taken first (an OFD lock does not
 * exclude threads sharing its descriptor).  The kernel holds it, so no write
 * into the file can corrupt it, and drops it when its holder dies.  It is
 * tried at once, then polled with a backoff (yields, then sleeps from 1 us
 * doubling to SCAP_POLL_MAX_NS) until the handle's timeout: there is no
 * timed F_OFD_SETLKW, and a signal to interrupt one is not a library's to
 * take.  Past the timeout the caller gets GMR_EBUSY and "waited T s for the
 * lock of PATH, held by process N", never a hang.  The holder sets `busy`
 * in the header while it holds the lock; a locker that finds it set (the
 * holder died mid-update) repairs the totals by a sweep and counts a repair.
 */
#define SCAP_POLL_MAX_NS 200000L

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Note [A file that shrinks]
 * A mapped page past the end of the file gives SIGBUS.  Who can cut the
 * file?  Only its writers, which Note [Trusting the file] limits to this
 * user (or the group under shared_by: group): gmr itself never shrinks a
 * file it has made.  At every lock, before the mapping is touched, fstat
 * checks the size; a file of another size is sized back (ftruncate), its
 * lost header rebuilt and its totals swept.  What is left is a writer that
 * cuts the file during the few instructions a lock hold lasts: that writer
 * could as well kill this process, and is inside the trust domain.  Readers
 * that are not members (gmr_shared_cap_read, gmr-top) never map the file:
 * they read it with pread into memory of their own, so a file that shrinks
 * is only a short read.
 */
static int file_check(gmr_scap_t *h, scap_file_t *f, int fd) {
  struct stat st;
  if (GMR_UNLIKELY(fstat(fd, &st) != 0)) return sys_fail("cannot stat", h->path);
  bool sweep_needed = false;
  if (GMR_UNLIKELY(st.st_size != (off_t)SCAP_FILE_SIZE)) {
    /* Sized back before anything in the mapping is touched. */
    if (ftruncate(fd, SCAP_FILE_SIZE) != 0) return sys_fail("cannot size", h->path);
    corrupt(h, f, st.st_size < (off_t)SCAP_FILE_SIZE ? "cut short" : "grown");
    sweep_needed = true;
  }
  if (GMR_UNLIKELY(memcmp(&f->h, &h->expect, SCAP_HEADER_FIXED) != 0)) {
    corrupt(h, f, "its header was changed");
    memcpy(&f->h, &h->expect, SCAP_HEADER_FIXED);
    sweep_needed = true;
  }
  uint64_t cap = h->o.cap;
  uint64_t c = atomic_load_explicit(&f->h.committed, memory_order_relaxed);
  uint64_t held = atomic_load_explicit(&f->h.held, memory_order_relaxed);
  uint64_t g = atomic_load_explicit(&f->h.guaranteed_sum, memory_order_relaxed);
  if (GMR_UNLIKELY(held > cap || g > cap || c < held || c - held > g ||
                   atomic_load_explicit(&f->h.live, memory_order_relaxed) > SCAP_SLOTS)) {
    corrupt(h, f, "its totals do not add up");
    sweep_needed = true;
  }
  if (GMR_UNLIKELY(sweep_needed)) sweep(h);
  return 0;
}

/* Does the file still cover the mapping (Note [A file that shrinks])? */
static bool file_whole(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_size >= (off_t)SCAP_FILE_SIZE;
}

/* Take file f's lock through fd (the handle's op already held), waiting up
 * to `deadline` (mono_ns) when `wait`.  h->f must be f (a repair sweeps it).
 * Without wait, a busy lock is GMR_EBUSY with no message. */
static int file_lock(gmr_scap_t *h, scap_file_t *f, int fd, bool wait, uint64_t deadline) {
  for (unsigned i = 0; ofd_lock(fd, SCAP_LOCK_MU, F_WRLCK) != 0; ++i) {
    if (errno != EAGAIN && errno != EACCES) return sys_fail("cannot lock", h->path);
    if (!wait) return GMR_EBUSY;
    if (mono_ns() >= deadline) {
      int holder = -1; /* not read from a file that was cut short */
      if (file_whole(fd)) {
        atomic_fetch_add_explicit(&f->h.timeouts, 1, memory_order_relaxed);
        holder = atomic_load_explicit(&f->h.holder_pid, memory_order_relaxed);
      }
      return gmr__error_set(GMR_EBUSY,
                            "shared cap: waited %.3g s for the lock of %s, held by process %d "
                            "(stopped or stalled?); giving up",
                            h->o.timeout_s, h->path, holder);
    }
    if (i < 8) {
      sched_yield();
    } else {
      long ns = i - 8 < 18 ? 1000L << (i - 8) : SCAP_POLL_MAX_NS;
      struct timespec ts = {0, ns < SCAP_POLL_MAX_NS ? ns : SCAP_POLL_MAX_NS};
      nanosleep(&ts, NULL);
    }
  }
  int err = file_check(h, f, fd);
  if (GMR_UNLIKELY(err != 0)) {
    ofd_lock(fd, SCAP_LOCK_MU, F_UNLCK);
    return err;
  }
  int prev = atomic_load_explicit(&f->h.holder_pid, memory_order_relaxed);
  atomic_store_explicit(&f->h.holder_pid, h->pid, memory_order_relaxed);
  if (GMR_UNLIKELY(atomic_exchange_explicit(&f->h.busy, 1, memory_order_acquire) != 0)) {
    sweep(h);
    atomic_fetch_add_explicit(&f->h.repairs, 1, memory_order_relaxed);
    gmr__log(GMR_LOG_INFO,
             "shared cap: process %d died holding the lock of %s; totals rebuilt from the slots",
             prev, h->path);
  }
  return 0;
}

static void file_unlock(scap_file_t *f, int fd) {
  atomic_store_explicit(&f->h.busy, 0, memory_order_release);
  ofd_lock(fd, SCAP_LOCK_MU, F_UNLCK);
}

/* Note [A timeout reaches the caller]
 * A reservation that gives up on the lock is an out-of-memory to the policy
 * (so frameworks raise their OOM), which then frees its cache, retries, and
 * writes its own OOM text over the reason.  So (1) the thread keeps the
 * timeout's sentence (scap_note) until a reservation succeeds, and the
 * runtime puts it first in the allocation's error (gmr__scap_take_note);
 * (2) a thread that gave up less than a timeout ago does not wait again, it
 * only tries: the policy's retry inside the same allocation, and the
 * allocations right after it, fail at once while the holder stays stalled.
 */
static _Thread_local char scap_note[640];
static _Thread_local uint64_t scap_gave_up_at; /* mono_ns; 0: never */

const char *gmr__scap_take_note(void) {
  if (scap_note[0] == '\0') return NULL;
  static _Thread_local char taken[sizeof scap_note];
  memcpy(taken, scap_note, sizeof taken);
  scap_note[0] = '\0';
  return taken;
}

/* Take the handle's op, then its file's lock, up to the timeout (wait) or
 * only if both are free at once. */
static int scap_lock_wait(gmr_scap_t *h, bool wait) {
  uint64_t now = mono_ns(), timeout_ns = (uint64_t)(h->o.timeout_s * 1e9);
  uint64_t deadline = now + timeout_ns;
  if (GMR_UNLIKELY(scap_gave_up_at != 0) && now - scap_gave_up_at < timeout_ns)
    deadline = now; /* Note [A timeout reaches the caller] */
  int r = pthread_mutex_trylock(&h->op);
  if (GMR_UNLIKELY(r == EBUSY)) {
    if (!wait) return GMR_EBUSY;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = h->o.timeout_s;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec += 1, ts.tv_nsec -= 1000000000L;
    r = deadline == now ? EBUSY : pthread_mutex_timedlock(&h->op, &ts);
    if (r == EBUSY) r = ETIMEDOUT;
    if (r == ETIMEDOUT)
      return gmr__error_set(GMR_EBUSY,
                            "shared cap: waited %.3g s for the lock of %s, held by another thread "
                            "of this process (process %d); giving up",
                            h->o.timeout_s, h->path, (int)h->pid);
  }
  if (r != 0) return gmr__error_set(GMR_EIO, "shared cap: locking %s: %s", h->path, strerror(r));
  int err = file_lock(h, h->f, h->lockfd, wait, deadline);
  if (err != 0) pthread_mutex_unlock(&h->op);
  return err;
}

static inline int scap_lock(gmr_scap_t *h) {
  return scap_lock_wait(h, true);
}

static inline void scap_unlock(gmr_scap_t *h) {
  file_unlock(h->f, h->lockfd);
  pthread_mutex_unlock(&h->op);
}

/* ---- claims --------------------------------------------------------------------------- */

/* Claim a free slot, with the h->used bytes this process holds already.
 * Caller: holds the lock. */
static int claim(gmr_scap_t *h) {
  scap_file_t *f = h->f;
  sweep(h);
  uint64_t g = h->o.guaranteed, cap = h->o.cap;
  uint64_t gsum = atomic_load_explicit(&f->h.guaranteed_sum, memory_order_relaxed);
  if (g > 0 && (gsum > cap || g > cap - gsum)) {
    char a[32], b[32], c[32];
    fmt_size(g, a, sizeof a);
    fmt_size(gsum, b, sizeof b);
    fmt_size(cap, c, sizeof c);
    return gmr__error_set(GMR_ECONFIG,
                          "shared cap: cannot guarantee %s in %s: the processes attached already "
                          "guarantee %s of its cap of %s",
                          a, h->path, b, c);
  }
  for (unsigned i = 0; i < SCAP_SLOTS; ++i) {
    scap_slot_t *s = &f->slot[i];
    if (atomic_load_explicit(&s->state, memory_order_relaxed) != SLOT_FREE) continue;
    if (ofd_lock(h->lockfd, SCAP_LOCK_BASE + (off_t)i, F_WRLCK) != 0) continue;
    h->gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->claimed_at, (uint64_t)time(NULL), memory_order_relaxed);
    atomic_store_explicit(&s->ops, 0, memory_order_relaxed);
    slot_write(h, s);
    h->slot = (int)i;
    sweep(h); /* the totals with us (the file's are not trusted for arithmetic) */
    return 0;
  }
  return gmr__error_set(GMR_ENOMEM, "shared cap: all %u slots of %s are taken by live processes",
                        SCAP_SLOTS, h->path);
}

/* Give our slot back.  Caller: holds the lock. */
static void unclaim(gmr_scap_t *h) {
  if (h->slot < 0) return;
  scap_file_t *f = h->f;
  scap_slot_t *s = &f->slot[h->slot];
  if (atomic_load_explicit(&s->state, memory_order_relaxed) == SLOT_LIVE &&
      atomic_load_explicit(&s->gen, memory_order_relaxed) == h->gen) {
    atomic_store_explicit(&s->used, 0, memory_order_relaxed);
    atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
  }
  int mine = h->slot;
  h->slot = -1;
  sweep(h); /* totals without us */
  ofd_lock(h->lockfd, SCAP_LOCK_BASE + (off_t)mine, F_UNLCK);
}

/* ---- trusting the file ------------------------------------------------------------------ */

/* Note [Trusting the file]
 * The default path is guessable (uid and GPU UUID are public) and lives in
 * /dev/shm, where every user may create names.  Whoever can write the file
 * or replace it can make the cap fail or split it, so a process uses a file
 * only when no one outside its trust domain can:
 *   - the folder: reached with its symbolic links followed, but a symbolic
 *     link at the folder's own name must belong to root or this user; the
 *     folder must belong to root or this user, and if others (or a group not
 *     trusted) may write it, it must be sticky (/dev/shm, /tmp), where no one
 *     can rename or remove a name they do not own;
 *   - the file: opened with O_NOFOLLOW (a planted symbolic link, which would
 *     make root create or overwrite the file it names, is refused) and
 *     O_NONBLOCK (a FIFO never blocks the open), looked at first with
 *     fstatat so that a device is never opened; then, through the open
 *     descriptor, it must be a regular file with one link (no hard link to
 *     another file of this user), owned by this user (effective uid), with
 *     no write permission for group or others.
 * With `shared_by: group` (opts.group) the trust domain is a group: the file
 * and the folder may be owned by another user and be group-writable, when
 * their group is one of this process's groups; never writable by others.
 * Refusals are GMR_ECONFIG with a message naming the path, owner and mode.
 * What the file's writers can still do is in docs/shared-cap.md ("Trust").
 */

static bool gid_ours(gid_t g) {
  if (g == getegid()) return true;
  gid_t list[256];
  int n = getgroups(256, list);
  for (int i = 0; i < n; ++i)
    if (list[i] == g) return true;
  return false;
}

static const char *file_kind(mode_t m) {
  return S_ISLNK(m)    ? "a symbolic link"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
         : S_ISDIR(m)  ? "a folder"
                       : "not a regular file";
}

static int distrust(const gmr_scap_t *h, const char *what, const struct stat *st, const char *why) {
  return gmr__error_set(GMR_ECONFIG,
                        "shared cap: refusing %s %s: it is owned by uid %u, group %u, mode 0%03o: "
                        "%s (this process is uid %u; see 'Trust' in docs/shared-cap.md%s)",
                        what, h->path, (unsigned)st->st_uid, (unsigned)st->st_gid,
                        (unsigned)(st->st_mode & 07777), why, (unsigned)geteuid(),
                        h->o.group ? "" : "; `shared_by: group` shares with a group");
}

/* The folder of h->path, opened and checked; its descriptor or < 0 with the
 * error set (*err).  *base: the file's name in it. */
static int open_dir(const gmr_scap_t *h, const char **base, int *err) {
  char dir[sizeof h->path];
  const char *slash = strrchr(h->path, '/');
  if (slash == NULL) {
    snprintf(dir, sizeof dir, ".");
    *base = h->path;
  } else {
    snprintf(dir, sizeof dir, "%.*s", slash == h->path ? 1 : (int)(slash - h->path), h->path);
    *base = slash + 1;
  }
  if (**base == '\0') {
    *err = gmr__error_set(GMR_ECONFIG, "shared cap: %s names a folder, not a file", h->path);
    return -1;
  }
  struct stat st;
  uid_t me = geteuid();
  if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode) && st.st_uid != 0 && st.st_uid != me) {
    *err = gmr__error_set(GMR_ECONFIG,
                          "shared cap: refusing %s: its folder %s is a symbolic link owned by uid "
                          "%u, neither root nor this user (uid %u)",
                          h->path, dir, (unsigned)st.st_uid, (unsigned)me);
    return -1;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    *err = sys_fail("cannot open the folder of", h->path);
    return -1;
  }
  if (fstat(dfd, &st) != 0) {
    *err = sys_fail("cannot stat the folder of", h->path);
    close(dfd);
    return -1;
  }
  bool group_ok = h->o.group && gid_ours(st.st_gid);
  bool owner_ok = st.st_uid == 0 || st.st_uid == me || group_ok;
  bool sticky = (st.st_mode & S_ISVTX) != 0;
  const char *why = NULL;
  if (!owner_ok)
    why = "its folder belongs to another user";
  else if ((st.st_mode & S_IWOTH) && !sticky)
    why = "its folder is writable by every user and not sticky";
  else if ((st.st_mode & S_IWGRP) && !sticky && !group_ok && st.st_uid != me)
    why = "its folder is writable by a group and not sticky";
  if (why) {
    *err = gmr__error_set(GMR_ECONFIG,
                          "shared cap: refusing %s: its folder %s is owned by uid %u, group %u, "
                          "mode 0%03o: %s (this process is uid %u; see 'Trust' in "
                          "docs/shared-cap.md)",
                          h->path, dir, (unsigned)st.st_uid, (unsigned)st.st_gid,
                          (unsigned)(st.st_mode & 07777), why, (unsigned)me);
    close(dfd);
    return -1;
  }
  return dfd;
}

/* Open h->path (creating it if `create`) as Note [Trusting the file] says:
 * a descriptor, or < 0 with the error set (*err). */
static int open_trusted(const gmr_scap_t *h, bool create, int *err) {
  const char *base;
  int dfd = open_dir(h, &base, err);
  if (dfd < 0) return -1;
  struct stat st;
  if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
    *err = distrust(h, file_kind(st.st_mode), &st, "a shared-cap file must be a regular file");
    close(dfd);
    return -1;
  }
  int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = openat(dfd, base, flags, h->o.group ? 0660 : 0600);
  if (fd < 0) {
    int e = errno;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (e == ELOOP || e == EACCES || e == EPERM || e == ENXIO))
      *err =
          distrust(h, S_ISREG(st.st_mode) ? "the file" : file_kind(st.st_mode), &st, strerror(e));
    else
      *err = (errno = e), sys_fail("cannot open", h->path);
    close(dfd);
    return -1;
  }
  close(dfd);
  const char *why = NULL;
  if (fstat(fd, &st) != 0) {
    *err = sys_fail("cannot stat", h->path);
    close(fd);
    return -1;
  }
  bool group_ok = h->o.group && gid_ours(st.st_gid);
  if (!S_ISREG(st.st_mode))
    why = "a shared-cap file must be a regular file";
  else if (st.st_uid != geteuid() && !group_ok)
    why = h->o.group ? "it belongs to another user and not to one of this process's groups"
                     : "it belongs to another user";
  else if (st.st_mode & S_IWOTH)
    why = "every user may write it";
  else if ((st.st_mode & S_IWGRP) && !group_ok)
    why = h->o.group ? "its group, not one of this process's, may write it"
                     : "its group may write it";
  else if (st.st_nlink > 1)
    why = "it has more than one name (a hard link)";
  if (why) {
    *err = distrust(h, S_ISREG(st.st_mode) ? "the file" : file_kind(st.st_mode), &st, why);
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- opening the file ---------------------------------------------------------------------- */

static int check_header(gmr_scap_t *h, const scap_header_t *hd) {
  if (atomic_load(&hd->magic) != SCAP_MAGIC)
    return gmr__error_set(GMR_ECONFIG,
                          "shared cap: %s is not a gmr shared-cap file (wrong magic number); "
                          "refusing to use or change it",
                          h->path);
  if (hd->version != SCAP_VERSION || hd->header_size != SCAP_HEADER_SIZE ||
      hd->slot_size != SCAP_SLOT_SIZE || hd->nslots != SCAP_SLOTS ||
      hd->file_size != SCAP_FILE_SIZE)
    return gmr__error_set(GMR_ECONFIG,
                          "shared cap: %s was made by another version of gmr (version %u, "
                          "%u slots of %u bytes; this library uses version %u, %u slots of %u "
                          "bytes); refusing to use or change it%s. Stop the processes using it, "
                          "or give this one another path",
                          h->path, hd->version, hd->nslots, hd->slot_size, SCAP_VERSION, SCAP_SLOTS,
                          SCAP_SLOT_SIZE,
                          hd->version == 1 ? " (version 1 keeps a pthread mutex in the file, which "
                                             "any writer of it could corrupt; gmr no longer uses "
                                             "one)"
                                           : "");
  if (strncmp(hd->device_id, h->device_id, SCAP_DEVICE_ID) != 0)
    return gmr__error_set(GMR_ECONFIG,
                          "shared cap: %s belongs to device %.96s, not to this process's device "
                          "%s; refusing to use it",
                          h->path, hd->device_id, h->device_id);
  if (hd->cap != h->o.cap) {
    char a[32], b[32];
    fmt_size(hd->cap, a, sizeof a);
    fmt_size(h->o.cap, b, sizeof b);
    return gmr__error_set(GMR_ECONFIG,
                          "shared cap: %s holds a cap of %s (%llu bytes) but this process asks "
                          "for %s (%llu bytes); every process sharing device %s must give the "
                          "same cap. The file is left as it is",
                          h->path, a, (unsigned long long)hd->cap, b, (unsigned long long)h->o.cap,
                          h->device_id);
  }
  return 0;
}

static void init_file(gmr_scap_t *h, scap_file_t *f) {
  memset(f, 0, sizeof *f);
  memcpy(&f->h, &h->expect, SCAP_HEADER_FIXED);
  atomic_store_explicit(&f->h.magic, 0, memory_order_relaxed);
  atomic_store_explicit(&f->h.magic, SCAP_MAGIC, memory_order_release); /* last */
}

/* The fixed part of the header this process expects (Note [Validating the file]). */
static void expect_init(gmr_scap_t *h) {
  scap_header_t *e = &h->expect;
  memset(e, 0, sizeof *e);
  atomic_init(&e->magic, SCAP_MAGIC);
  e->version = SCAP_VERSION;
  e->header_size = SCAP_HEADER_SIZE;
  e->slot_size = SCAP_SLOT_SIZE;
  e->nslots = SCAP_SLOTS;
  e->file_size = SCAP_FILE_SIZE;
  e->cap = h->o.cap;
  snprintf(e->device_id, sizeof e->device_id, "%s", h->device_id);
}

/* Open, make or check, and map the file at h->path; sets f, mapfd, lockfd.
 * *created tells whether this call made it. */
static int open_file(gmr_scap_t *h, bool *created) {
  *created = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    int err = 0;
    int mfd = open_trusted(h, true, &err);
    if (mfd < 0) return err;
    int lfd = open_trusted(h, false, &err);
    struct stat a, b;
    if (lfd < 0 || fstat(mfd, &a) != 0 || fstat(lfd, &b) != 0 || a.st_ino != b.st_ino ||
        a.st_dev != b.st_dev) {
      /* Replaced between the two opens: try again. */
      int e = errno;
      if (lfd >= 0) close(lfd);
      close(mfd);
      if (lfd < 0 && e != ENOENT) return err;
      continue;
    }
    /* Making and checking the header is done under the file's lock. */
    uint64_t deadline = coarse_ns() + (uint64_t)(h->o.timeout_s * 1e9);
    while (ofd_lock(lfd, SCAP_LOCK_MU, F_WRLCK) != 0) {
      if (errno != EAGAIN && errno != EACCES) {
        int err = sys_fail("cannot lock", h->path);
        close(lfd), close(mfd);
        return err;
      }
      if (coarse_ns() > deadline) {
        close(lfd), close(mfd);
        return gmr__error_set(GMR_EBUSY,
                              "shared cap: waited %.3g s for another process to set up %s "
                              "(stopped?); giving up",
                              h->o.timeout_s, h->path);
      }
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
    if (fstat(mfd, &a) != 0) err = sys_fail("cannot stat", h->path);
    if (err == 0 && a.st_nlink == 0) { /* unlinked meanwhile */
      close(lfd), close(mfd);
      continue;
    }
    bool fresh = false;
    if (err == 0 && a.st_size == 0) {
      if (ftruncate(mfd, SCAP_FILE_SIZE) != 0) err = sys_fail("cannot size", h->path);
      fresh = true;
    } else if (err == 0 && a.st_size < (off_t)sizeof(scap_header_t)) {
      err = gmr__error_set(GMR_ECONFIG,
                           "shared cap: %s is not a gmr shared-cap file (%lld bytes); refusing to "
                           "use or change it",
                           h->path, (long long)a.st_size);
    }
    scap_file_t *f = NULL;
    if (err == 0) {
      size_t len = fresh || a.st_size >= (off_t)SCAP_FILE_SIZE ? SCAP_FILE_SIZE : (size_t)a.st_size;
      void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
      if (m == MAP_FAILED) {
        err = sys_fail("cannot map", h->path);
      } else {
        f = m;
        /* A maker that died before storing magic left a sized file of zeros
         * (no one else is making it: we hold the lock). */
        if (!fresh && len == SCAP_FILE_SIZE && atomic_load(&f->h.magic) == 0 && f->h.version == 0)
          fresh = true;
        if (fresh)
          init_file(h, f);
        else
          err = check_header(h, &f->h);
        if (err == 0 && !fresh && a.st_size != (off_t)SCAP_FILE_SIZE)
          err = gmr__error_set(GMR_ECONFIG,
                               "shared cap: %s has %lld bytes, not %u; refusing to use or change "
                               "it",
                               h->path, (long long)a.st_size, SCAP_FILE_SIZE);
        if (err != 0) {
          munmap(m, len);
          f = NULL;
        }
      }
    }
    ofd_lock(lfd, SCAP_LOCK_MU, F_UNLCK);
    if (err != 0) {
      close(lfd), close(mfd);
      return err;
    }
    h->f = f;
    h->mapfd = mfd;
    h->lockfd = lfd;
    *created = fresh;
    return 0;
  }
  return gmr__error_set(GMR_EIO, "shared cap: %s keeps being replaced while opening it", h->path);
}

static void close_file(gmr_scap_t *h) {
  while (h->retired) {
    scap_retired_t *r = h->retired;
    h->retired = r->next;
    munmap(r->f, SCAP_FILE_SIZE);
    gmr__free(r);
  }
  if (h->f) munmap(h->f, SCAP_FILE_SIZE);
  if (h->lockfd >= 0) close(h->lockfd);
  if (h->mapfd >= 0) close(h->mapfd);
  h->f = NULL;
  h->lockfd = h->mapfd = -1;
}

/* ---- attach, detach ------------------------------------------------------------------------ */

int gmr__scap_default_path(const char *device_id, char *buf, size_t len) {
  if (device_id == NULL || buf == NULL) return GMR_EINVAL;
  int n = snprintf(buf, len, "/dev/shm/gmr-cap-%u-%s", (unsigned)getuid(), device_id);
  if (n < 0 || (size_t)n >= len) return GMR_EINVAL;
  /* A device id is a file name part: no slashes. */
  for (char *p = buf + strlen("/dev/shm/"); *p; ++p)
    if (*p == '/') *p = '_';
  return 0;
}

int gmr__scap_attach(const gmr_scap_opts_t *o, gmr_scap_t **out) {
  if (o == NULL || out == NULL || o->device_id == NULL || o->device_id[0] == '\0' || o->cap == 0)
    return gmr__error_set(GMR_EINVAL, "shared cap: a device id and a cap > 0 are needed");
  gmr_scap_t *h = gmr__calloc(1, sizeof *h);
  if (h == NULL) return gmr__error_set(GMR_ENOMEM, "shared cap: out of host memory");
  gmr__lock_init(&h->local);
  pthread_mutex_init(&h->op, NULL);
  h->o = *o;
  h->lockfd = -1;
  h->mapfd = -1;
  h->slot = -1;
  h->pid = (int32_t)getpid();
  if (h->o.timeout_s <= 0) h->o.timeout_s = 1.0;
  snprintf(h->device_id, sizeof h->device_id, "%s", o->device_id);
  snprintf(h->label, sizeof h->label, "%s", o->label ? o->label : "");
  int err = 0;
  if (o->path && o->path[0]) {
    if (strlen(o->path) >= sizeof h->path)
      err = gmr__error_set(GMR_EINVAL, "shared cap: the path is longer than %zu bytes",
                           sizeof h->path - 1);
    else
      snprintf(h->path, sizeof h->path, "%s", o->path);
  } else if (gmr__scap_default_path(h->device_id, h->path, sizeof h->path) != 0) {
    err = gmr__error_set(GMR_EINVAL, "shared cap: device id too long: %s", h->device_id);
  }
  h->o.path = h->path;
  h->o.device_id = h->device_id;
  h->o.label = h->label;
  expect_init(h);
  bool created = false;
  if (err == 0) err = open_file(h, &created);
  if (err == 0) {
    err = scap_lock(h);
    if (err == 0) {
      err = claim(h);
      scap_unlock(h);
    }
    if (err != 0) close_file(h);
  }
  if (err != 0) {
    pthread_mutex_destroy(&h->op);
    gmr__lock_destroy(&h->local);
    gmr__free(h);
    return err;
  }
  h->next_link_check = coarse_ns() + SCAP_LINK_CHECK_NS;
  h->created = created;
  reg_add(h);
  gmr__log(GMR_LOG_INFO, "shared cap: %s %s, slot %d", created ? "made" : "attached to", h->path,
           h->slot);
  *out = h;
  return 0;
}

void gmr__scap_detach(gmr_scap_t *h) {
  if (h == NULL) return;
  reg_remove(h);
  gmr__lock(&h->local); /* no move can happen now: scap_lock, not enter */
  if (h->lockfd >= 0 && scap_lock(h) == 0) {
    unclaim(h);
    scap_unlock(h);
  }
  close_file(h); /* else the closed lock byte frees the slot at the next sweep */
  gmr__unlock(&h->local);
  pthread_mutex_destroy(&h->op);
  gmr__lock_destroy(&h->local);
  gmr__free(h);
}

const char *gmr__scap_path(const gmr_scap_t *h) {
  return h->path;
}

/* ---- split domains and forks ---------------------------------------------------------------- */

/* Move our slot (with its h->used bytes) to the file now at the path, under
 * the handle's op (so no other thread of ours is in either file's lock) and
 * the old file's lock.  The old mapping stays until detach (a view may read
 * it unlocked).  Caller: holds local, not op. */
static int migrate(gmr_scap_t *h) {
  scap_retired_t *r = gmr__calloc(1, sizeof *r);
  if (r == NULL) return gmr__error_set(GMR_ENOMEM, "shared cap: out of host memory");
  int err = scap_lock(h);
  if (err != 0) {
    gmr__free(r);
    return err;
  }
  scap_file_t *old = h->f;
  int old_mapfd = h->mapfd, old_lockfd = h->lockfd;
  gmr_scap_t fresh = *h; /* for its file fields: its op is never used */
  fresh.f = NULL;
  fresh.lockfd = -1;
  fresh.mapfd = -1;
  fresh.slot = -1;
  bool created;
  err = open_file(&fresh, &created);
  if (err == 0) {
    err = file_lock(&fresh, fresh.f, fresh.lockfd, true,
                    mono_ns() + (uint64_t)(h->o.timeout_s * 1e9));
    if (err == 0) {
      err = claim(&fresh);
      file_unlock(fresh.f, fresh.lockfd);
    }
    if (err != 0) close_file(&fresh);
  }
  if (err != 0) {
    scap_unlock(h);
    gmr__free(r);
    return err;
  }
  unclaim(h);
  file_unlock(old, old_lockfd);
  atomic_store(&h->slot, fresh.slot);
  h->gen = fresh.gen;
  h->mapfd = fresh.mapfd;
  atomic_store(&h->lockfd, fresh.lockfd);
  atomic_store_explicit(&h->f, fresh.f, memory_order_release);
  pthread_mutex_unlock(&h->op);
  close(old_lockfd);
  close(old_mapfd);
  r->f = old;
  r->next = h->retired;
  h->retired = r;
  return 0;
}

static int check_link_locked(gmr_scap_t *h) {
  struct stat st;
  if (h->mapfd < 0 || fstat(h->mapfd, &st) != 0 || st.st_nlink != 0) return 0;
  gmr__log(GMR_LOG_WARN,
           "shared cap: domain split: %s was unlinked while in use; this process moves its share "
           "to a new file at the same path",
           h->path);
  int err = migrate(h);
  if (err != 0)
    gmr__log(GMR_LOG_ERROR, "shared cap: could not move to the new %s: %s", h->path,
             gmr__error_last());
  return err;
}

int gmr__scap_check_link(gmr_scap_t *h) {
  gmr__lock(&h->local);
  int err = check_link_locked(h);
  gmr__unlock(&h->local);
  return err;
}

/* A forked child: open our own lock descriptor on the mapped file (the slot
 * is claimed by slot_check).  Caller: holds local and op. */
static int reclaim(gmr_scap_t *h) {
  int ignored;
  int lfd = open_trusted(h, false, &ignored);
  struct stat a, b;
  if (lfd >= 0 && fstat(lfd, &a) == 0 && fstat(h->mapfd, &b) == 0 &&
      (a.st_ino != b.st_ino || a.st_dev != b.st_dev)) {
    close(lfd);
    lfd = -1;
    errno = ENOENT;
  }
  if (lfd < 0) {
    /* The file at the path is another one now: start over there. */
    scap_retired_t *r = gmr__calloc(1, sizeof *r);
    if (r == NULL) return gmr__error_set(GMR_ENOMEM, "shared cap: out of host memory");
    gmr_scap_t fresh = *h;
    bool created;
    int err = open_file(&fresh, &created);
    if (err != 0) {
      gmr__free(r);
      return err;
    }
    r->f = h->f;
    r->next = h->retired;
    h->retired = r;
    close(h->mapfd);
    h->mapfd = fresh.mapfd;
    atomic_store_explicit(&h->f, fresh.f, memory_order_release);
    lfd = fresh.lockfd;
  }
  atomic_store(&h->lockfd, lfd);
  return 0;
}

/* Lock the file at the path, with a lock descriptor of our own (after a
 * fork, a new one) and, at most every SCAP_LINK_CHECK_NS, after a look at
 * its link count.  The slot is claimed by slot_check.  Returns holding op
 * and the current file's lock. */
static inline int enter(gmr_scap_t *h) {
  if (GMR_UNLIKELY(atomic_load_explicit(&h->lockfd, memory_order_acquire) < 0)) {
    gmr__lock(&h->local);
    pthread_mutex_lock(&h->op);
    int err = h->lockfd < 0 ? reclaim(h) : 0;
    pthread_mutex_unlock(&h->op);
    gmr__unlock(&h->local);
    if (err != 0) return err;
  }
  uint64_t now = coarse_ns();
  uint64_t next = atomic_load_explicit(&h->next_link_check, memory_order_relaxed);
  if (GMR_UNLIKELY(now >= next) &&
      atomic_compare_exchange_strong(&h->next_link_check, &next, now + SCAP_LINK_CHECK_NS)) {
    gmr__lock(&h->local);
    check_link_locked(h);
    gmr__unlock(&h->local);
  }
  return scap_lock(h);
}

/* ---- reserve, release ------------------------------------------------------------------------ */

static inline uint64_t sat_sub(uint64_t a, uint64_t b) {
  return a > b ? a - b : 0;
}

static inline void count_op(_Atomic uint64_t *c) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Apply a release of n bytes to our slot.  Caller: holds the lock. */
static void apply_release(gmr_scap_t *h, uint64_t n) {
  scap_file_t *f = h->f;
  scap_slot_t *s = &f->slot[h->slot];
  uint64_t u = h->used, g = h->o.guaranteed;
  if (n > u) n = u; /* memory inherited over fork, reserved by the parent's slot */
  uint64_t d = max64(u, g) - max64(u - n, g);
  atomic_store_explicit(&h->used, u - n, memory_order_relaxed);
  atomic_store_explicit(&s->used, u - n, memory_order_relaxed);
  atomic_store_explicit(&f->h.committed,
                        sat_sub(atomic_load_explicit(&f->h.committed, memory_order_relaxed), d),
                        memory_order_relaxed);
  atomic_store_explicit(&f->h.held,
                        sat_sub(atomic_load_explicit(&f->h.held, memory_order_relaxed), n),
                        memory_order_relaxed);
  count_op(&s->ops);
}

/* Our slot is still as we left it, or it is rewritten from what we know
 * (Note [Validating the file]); a forked child, or a process whose liveness
 * byte was lost (its lock descriptor closed behind its back), claims one.
 * Caller: holds the lock. */
static inline int slot_check(gmr_scap_t *h) {
  if (GMR_LIKELY(h->slot >= 0)) {
    scap_slot_t *s = &h->f->slot[h->slot];
    if (GMR_LIKELY(atomic_load_explicit(&s->state, memory_order_relaxed) == SLOT_LIVE &&
                   atomic_load_explicit(&s->gen, memory_order_relaxed) == h->gen &&
                   atomic_load_explicit(&s->used, memory_order_relaxed) == h->used &&
                   atomic_load_explicit(&s->quota, memory_order_relaxed) == h->o.quota &&
                   atomic_load_explicit(&s->guaranteed, memory_order_relaxed) == h->o.guaranteed))
      return 0;
    /* Our byte: still ours (taking it again is a no-op), or lost. */
    if (ofd_lock(h->lockfd, SCAP_LOCK_BASE + h->slot, F_WRLCK) == 0) {
      sweep(h); /* rewrites our slot, rebuilds the totals */
      return 0;
    }
    gmr__log(GMR_LOG_WARN, "shared cap: this process's slot in %s was lost; claiming a new one",
             h->path);
    h->slot = -1;
  }
  return claim(h);
}

static int refusal(gmr_scap_t *h, uint64_t n, uint64_t committed, uint64_t held, uint64_t used,
                   const char *why) {
  char c[32], r[32], m[32], u[32], q[32], hb[32];
  fmt_size(h->o.cap, c, sizeof c);
  fmt_size(n, r, sizeof r);
  fmt_size(committed, m, sizeof m);
  fmt_size(held, hb, sizeof hb);
  fmt_size(used, u, sizeof u);
  fmt_size(h->o.quota, q, sizeof q);
  unsigned live = atomic_load_explicit(&h->f->h.live, memory_order_relaxed);
  return gmr__error_set(GMR_ENOMEM,
                        "out of memory: %s. Shared cap of %s (%llu bytes) on device %s (%s): %s "
                        "committed by %u processes (%s held); this process holds %s of its quota "
                        "of %s. Tried to reserve %s (%llu bytes).",
                        why, c, (unsigned long long)h->o.cap, h->device_id, h->path, m,
                        live > SCAP_SLOTS ? SCAP_SLOTS : live, hb, u, h->o.quota ? q : "(none)", r,
                        (unsigned long long)n);
}

int gmr__scap_reserve(gmr_scap_t *h, uint64_t n) {
  int err = enter(h);
  if (GMR_UNLIKELY(err != 0)) {
    if (err == GMR_EBUSY) { /* Note [A timeout reaches the caller] */
      snprintf(scap_note, sizeof scap_note, "%s", gmr__error_last());
      scap_gave_up_at = mono_ns();
    }
    return err;
  }
  if (GMR_UNLIKELY(scap_note[0] != '\0')) scap_note[0] = '\0';
  scap_gave_up_at = 0;
  err = slot_check(h);
  uint64_t owed = atomic_load_explicit(&h->owed, memory_order_relaxed);
  if (GMR_UNLIKELY(owed != 0) && err == 0) {
    owed = atomic_exchange(&h->owed, 0);
    apply_release(h, owed);
  }
  scap_file_t *f = h->f;
  if (GMR_LIKELY(err == 0)) {
    scap_slot_t *s = &f->slot[h->slot];
    uint64_t u = h->used, g = h->o.guaranteed, cap = h->o.cap;
    uint64_t d = n > UINT64_MAX - u ? UINT64_MAX : max64(u + n, g) - max64(u, g);
    uint64_t c = atomic_load_explicit(&f->h.committed, memory_order_relaxed);
    uint64_t held = atomic_load_explicit(&f->h.held, memory_order_relaxed);
    if (h->o.quota != 0 && (n > h->o.quota || u > h->o.quota - n)) {
      err = refusal(h, n, c, held, u, "past this process's quota");
    } else if (GMR_UNLIKELY(d > cap || c > cap - d || n > cap || held > cap - n)) {
      sweep(h); /* dead processes' shares come back */
      c = atomic_load_explicit(&f->h.committed, memory_order_relaxed);
      held = atomic_load_explicit(&f->h.held, memory_order_relaxed);
      if (d > cap || c > cap - d || n > cap || held > cap - n)
        err = refusal(h, n, c, held, u, "the processes sharing this device hold the whole cap");
    }
    if (GMR_LIKELY(err == 0)) {
      atomic_store_explicit(&h->used, u + n, memory_order_relaxed);
      atomic_store_explicit(&s->used, u + n, memory_order_relaxed);
      atomic_store_explicit(&f->h.committed, c + d, memory_order_relaxed);
      atomic_store_explicit(&f->h.held, held + n, memory_order_relaxed);
      count_op(&s->ops);
      count_op(&f->h.ops);
    }
  }
  scap_unlock(h);
  return err;
}

void gmr__scap_release(gmr_scap_t *h, uint64_t n) {
  if (n == 0) return;
  if (GMR_UNLIKELY(enter(h) != 0)) {
    atomic_fetch_add(&h->owed, n); /* given back by the next call that gets the lock */
    return;
  }
  scap_file_t *f = h->f;
  uint64_t owed = atomic_load_explicit(&h->owed, memory_order_relaxed);
  if (GMR_UNLIKELY(owed != 0)) owed = atomic_exchange(&h->owed, 0);
  /* (A forked child claims a slot here, holding nothing: apply_release clamps.) */
  if (GMR_LIKELY(slot_check(h) == 0)) {
    apply_release(h, n + owed);
    count_op(&f->h.ops);
  }
  scap_unlock(h);
}

void gmr__scap_view(gmr_scap_t *h, gmr_scap_view_t *out) {
  /* Fresh totals: the shares of processes that died since the last sweep
   * are not counted (one lock probe per live slot).  When the lock is busy,
   * the figures as they are: a view never waits. */
  bool locked = atomic_load_explicit(&h->lockfd, memory_order_acquire) >= 0 &&
                atomic_load_explicit(&h->slot, memory_order_relaxed) >= 0 &&
                scap_lock_wait(h, false) == 0;
  if (locked) sweep(h);
  scap_file_t *f = atomic_load_explicit(&h->f, memory_order_acquire);
  uint64_t u = atomic_load_explicit(&h->used, memory_order_relaxed), c = u, held = u;
  int mapfd = h->mapfd;
  if (locked || (mapfd >= 0 && file_whole(mapfd))) { /* unlocked: not past the end */
    c = atomic_load_explicit(&f->h.committed, memory_order_relaxed);
    held = atomic_load_explicit(&f->h.held, memory_order_relaxed);
  }
  if (locked) scap_unlock(h);
  uint64_t g = h->o.guaranteed, cap = h->o.cap;
  out->cap = cap;
  out->committed = c;
  out->used = u;
  out->quota = h->o.quota;
  out->guaranteed = g;
  /* Growth by r costs max(u + r, g) - max(u, g) of committed: the first
   * g - u bytes are free of charge. */
  uint64_t cap_left = c < cap ? cap - c : 0;
  uint64_t room = sat_add(cap_left, max64(u, g) - u);
  uint64_t phys = held < cap ? cap - held : 0;
  if (room > phys) room = phys;
  if (h->o.quota != 0) {
    uint64_t q = h->o.quota > u ? h->o.quota - u : 0;
    if (room > q) room = q;
  }
  out->room = room;
}

/* ---- test hooks ----------------------------------------------------------------------------- */

int gmr__scap_debug_hold(gmr_scap_t *h, uint64_t n) {
  int err = enter(h);
  if (err == 0 && (err = slot_check(h)) != 0) scap_unlock(h);
  if (err != 0) return err;
  /* A half-done update: used raised, committed and held not.  (h->used too,
   * so the repair keeps it: the process, not the file, is the truth.) */
  atomic_fetch_add(&h->used, n);
  atomic_fetch_add(&h->f->slot[h->slot].used, n);
  return 0;
}

void gmr__scap_debug_unhold(gmr_scap_t *h) {
  sweep(h); /* repair the half-done update */
  scap_unlock(h);
}

void gmr__scap_debug(gmr_scap_t *h, gmr_scap_debug_t *out) {
  scap_header_t *hd = &atomic_load(&h->f)->h;
  out->sweeps = atomic_load(&hd->sweeps);
  out->repairs = atomic_load(&hd->repairs);
  out->timeouts = atomic_load(&hd->timeouts);
  out->ops = atomic_load(&hd->ops);
  out->freed = atomic_load(&hd->freed);
  out->corrupt = atomic_load(&hd->corrupt);
  out->held = atomic_load(&hd->held);
  out->slot = atomic_load(&h->slot);
  out->created = h->created;
}

/* ---- the public reader (gmr-top) ------------------------------------------------------------ */

int gmr_shared_cap_default_path(const char *device_id, char *buf, size_t len) {
  if (device_id == NULL || buf == NULL || len == 0)
    return gmr__error_set(GMR_EINVAL, "gmr_shared_cap_default_path: NULL argument");
  if (gmr__scap_default_path(device_id, buf, len) != 0)
    return gmr__error_set(GMR_EINVAL, "gmr_shared_cap_default_path: buffer too small");
  return 0;
}

int gmr_shared_cap_read(const char *path, gmr_shared_cap_info_t *info, gmr_shared_cap_slot_t *slots,
                        size_t max_slots, size_t *out_n) {
  if (path == NULL || info == NULL || out_n == NULL || (slots == NULL && max_slots != 0))
    return gmr__error_set(GMR_EINVAL, "gmr_shared_cap_read: NULL argument");
  /* Note [A file that shrinks]: never mapped, never a device opened, never
   * a FIFO waited for (gmr-top scans /dev/shm, where anyone makes names). */
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return gmr__error_set(GMR_EINVAL, "%s is not a shared-cap file: it is %s", path,
                          file_kind(st.st_mode));
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return sys_fail("cannot open", path);
  if (fstat(fd, &st) != 0) {
    int err = sys_fail("cannot stat", path);
    close(fd);
    return err;
  }
  if (!S_ISREG(st.st_mode) || st.st_size != (off_t)SCAP_FILE_SIZE) {
    close(fd);
    if (!S_ISREG(st.st_mode))
      return gmr__error_set(GMR_EINVAL, "%s is not a shared-cap file: it is %s", path,
                            file_kind(st.st_mode));
    return gmr__error_set(GMR_EINVAL,
                          "%s is not a shared-cap file of this version of gmr (%lld bytes, "
                          "expected %u)",
                          path, (long long)st.st_size, SCAP_FILE_SIZE);
  }
  scap_file_t *f = gmr__malloc(sizeof *f);
  if (f == NULL) {
    close(fd);
    return gmr__error_set(GMR_ENOMEM, "gmr_shared_cap_read: out of host memory");
  }
  size_t got = 0;
  while (got < sizeof *f) {
    ssize_t r = pread(fd, (char *)f + got, sizeof *f - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  int err = 0;
  const scap_header_t *hd = &f->h;
  if (got != sizeof *f) {
    err = gmr__error_set(GMR_EINVAL, "%s shrank while being read (%zu of %u bytes)", path, got,
                         SCAP_FILE_SIZE);
  } else if (atomic_load(&hd->magic) != SCAP_MAGIC || hd->version != SCAP_VERSION ||
             hd->nslots != SCAP_SLOTS || hd->slot_size != SCAP_SLOT_SIZE) {
    err = gmr__error_set(GMR_EINVAL, "%s is not a shared-cap file of this version of gmr", path);
  } else {
    memset(info, 0, sizeof *info);
    snprintf(info->device_id, sizeof info->device_id, "%.*s", (int)sizeof hd->device_id,
             hd->device_id);
    info->version = hd->version;
    info->cap = hd->cap;
    info->committed = atomic_load(&hd->committed);
    info->held = atomic_load(&hd->held);
    info->guaranteed = atomic_load(&hd->guaranteed_sum);
    info->slots = hd->nslots;
    info->sweeps = atomic_load(&hd->sweeps);
    info->repairs = atomic_load(&hd->repairs);
    info->timeouts = atomic_load(&hd->timeouts);
    size_t n = 0;
    for (unsigned i = 0; i < SCAP_SLOTS; ++i) {
      const scap_slot_t *s = &f->slot[i];
      if (atomic_load_explicit(&s->state, memory_order_relaxed) != SLOT_LIVE) continue;
      gmr_shared_cap_slot_t e;
      memset(&e, 0, sizeof e);
      e.index = (int)i;
      e.generation = atomic_load(&s->gen);
      e.pid = atomic_load(&s->pid);
      e.quota = atomic_load(&s->quota);
      e.guaranteed = atomic_load(&s->guaranteed);
      e.held = atomic_load(&s->used);
      e.operations = atomic_load(&s->ops);
      e.since = atomic_load(&s->claimed_at);
      memcpy(e.label, s->label, sizeof e.label - 1); /* the copy's last byte stays 0 */
      /* Alive: its owner still holds the liveness byte. */
      struct flock fl = {.l_type = F_WRLCK,
                         .l_whence = SEEK_SET,
                         .l_start = SCAP_LOCK_BASE + (off_t)i,
                         .l_len = 1};
      e.alive = fcntl(fd, F_OFD_GETLK, &fl) == 0 ? fl.l_type != F_UNLCK : 1;
      ++info->live;
      if (n < max_slots) slots[n++] = e;
    }
    *out_n = n;
  }
  gmr__free(f);
  close(fd);
  return err;
}
