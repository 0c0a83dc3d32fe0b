/* shared-cap.c: one cap on a device's memory across processes, daemon-free
 * and safe against kill -9 (the design: docs/shared-cap.md).
 *
 * The file (one per device, by default /dev/shm/gmr-cap-<uid>-<device id>)
 * is a header and SCAP_SLOTS fixed slots; a slot's index is its identity for
 * its whole life (no compaction), and `gen` counts its claims.
 *
 *   header: magic (stored last when the file is made), version, layout sizes,
 *           device id, cap; `mu`, a robust process-shared mutex; the derived
 *           totals committed, held, guaranteed, live; counters for tools.
 *   slot i: state (FREE/LIVE), gen, quota, guaranteed, used, pid (for
 *           display only), label.
 *   byte SCAP_LOCK_BASE + i of the file: an OFD write lock held by the
 *           process that owns slot i, through a descriptor that is never
 *           mapped (a MAP_SHARED mapping keeps its open file description
 *           alive, and with it the lock).  The kernel drops it when the
 *           process dies, whatever its pid or PID namespace: "can I take that
 *           byte?" is the liveness test.
 *   byte SCAP_LOCK_INIT: held while a process makes or checks the header.
 *
 * Invariants, between lock holds of `mu` (over LIVE slots):
 *   committed  = Σ max(used_i, guaranteed_i)     guaranteed_sum = Σ guaranteed_i <= cap
 *   held       = Σ used_i <= cap                 used_i <= quota_i (quota 0: none)
 *   committed <= cap, except after a claim whose guarantee others were using:
 *              then nobody grows past their guarantee until frees bring it back.
 * Every change is made under `mu`.  A process that dies holding `mu` leaves
 * the next locker EOWNERDEAD; it then runs the sweep, which frees the slots
 * of dead processes and recomputes every total from the slots (so a half-done
 * update, say `used` raised but not `committed`, is repaired), and marks the
 * mutex consistent.  The sweep also runs when a reservation would pass the
 * cap, and at every claim, so a dead process's share returns to the others at
 * their next reservation.
 *
 * Waiting: the mutex is tried first, then waited for with
 * pthread_mutex_timedlock up to the handle's timeout; past it the caller gets
 * GMR_EBUSY and a sentence naming the holder's pid, never a hang.
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
 * Synchronization in the process: the reservation path takes only the
 * current file's `mu` (h->slot, h->gen and the file change under it).  A
 * move to a new file publishes h->f while holding the old file's `mu`, so a
 * thread that locked the old one meanwhile sees h->f changed and tries
 * again; the old mapping stays until detach.  `local` (one per handle)
 * serializes the slow paths (a new lock descriptor after fork, moves,
 * detach) and keeps fork from copying a half-made one.  The registry of
 * handles (for fork) has its own mutex, taken before any `local`.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

/* ThreadSanitizer's pthread_mutex_timedlock does not count a lock it returns
 * with EOWNERDEAD as taken (its trylock does): tell it, or the unlock that
 * follows is reported as the unlock of an unlocked mutex. */
#if defined(__SANITIZE_THREAD__)
#define SCAP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SCAP_TSAN 1
#endif
#endif
#ifdef SCAP_TSAN
#include <sanitizer/tsan_interface.h>
#define SCAP_TSAN_TAKEN(m)                                                                         \
  (__tsan_mutex_pre_lock((m), __tsan_mutex_try_lock),                                              \
   __tsan_mutex_post_lock((m), __tsan_mutex_try_lock, 0))
#else
#define SCAP_TSAN_TAKEN(m) ((void)0)
#endif

#define SCAP_MAGIC         0x3170614372756d67ull /* "gmurCap1" */
#define SCAP_VERSION       1u
#define SCAP_SLOTS         256u
#define SCAP_HEADER_SIZE   4096u
#define SCAP_SLOT_SIZE     128u
#define SCAP_FILE_SIZE     (SCAP_HEADER_SIZE + SCAP_SLOTS * SCAP_SLOT_SIZE)
#define SCAP_LOCK_BASE     ((off_t)1 << 30) /* liveness byte of slot i: BASE + i */
#define SCAP_LOCK_INIT     (SCAP_LOCK_BASE - 1)
#define SCAP_LINK_CHECK_NS 50000000ull /* 50 ms */
#define SCAP_LABEL         64
#define SCAP_DEVICE_ID     96

enum { SLOT_FREE = 0, SLOT_LIVE = 1 };

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
  _Alignas(64) pthread_mutex_t mu;
  _Atomic uint64_t committed; /* Σ max(used, guaranteed) */
  _Atomic uint64_t held;      /* Σ used */
  _Atomic uint64_t guaranteed_sum;
  _Atomic uint32_t live;
  _Atomic int32_t holder_pid; /* the pid that last took mu (for messages) */
  _Alignas(64) _Atomic uint64_t sweeps;
  _Atomic uint64_t repairs;  /* EOWNERDEAD recoveries */
  _Atomic uint64_t timeouts; /* waits for mu that gave up */
  _Atomic uint64_t ops;      /* reservations and releases applied */
  _Atomic uint64_t freed;    /* slots of dead processes freed by sweeps */
} scap_header_t;
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
  gmr_lock_t local; /* the slow paths: reclaim after fork, moves, detach */
  _Atomic(scap_file_t *) f;
  int mapfd;                        /* under local */
  _Atomic int lockfd;               /* < 0: no lock descriptor (after fork) */
  _Atomic int slot;                 /* -1: none; changes under f's mu */
  uint32_t gen;                     /* under f's mu */
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
  for (gmr_scap_t *h = reg_head; h; h = h->next)
    gmr__lock(&h->local);
}
static void reg_parent(void) {
  for (gmr_scap_t *h = reg_head; h; h = h->next)
    gmr__unlock(&h->local);
  pthread_mutex_unlock(&reg_mu);
}
/* The child owns no slot: the parent's liveness byte must not live on in it. */
static void reg_child(void) {
  for (gmr_scap_t *h = reg_head; h; h = h->next) {
    if (h->lockfd >= 0) close(h->lockfd);
    h->lockfd = -1;
    h->slot = -1;
    h->pid = (int32_t)getpid();
    atomic_store(&h->owed, 0);
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

/* ---- the mutex, the sweep ------------------------------------------------------------- */

/* Recompute every total from the slots, freeing those of dead processes.
 * Caller: holds mu. */
static void sweep(gmr_scap_t *h) {
  scap_file_t *f = h->f;
  uint64_t committed = 0, held = 0, gsum = 0;
  uint32_t live = 0;
  for (unsigned i = 0; i < SCAP_SLOTS; ++i) {
    scap_slot_t *s = &f->slot[i];
    if (atomic_load_explicit(&s->state, memory_order_relaxed) != SLOT_LIVE) continue;
    if ((int)i != h->slot && slot_dead(h->lockfd, i)) {
      atomic_store_explicit(&s->used, 0, memory_order_relaxed);
      atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
      atomic_fetch_add_explicit(&f->h.freed, 1, memory_order_relaxed);
      continue;
    }
    uint64_t u = atomic_load_explicit(&s->used, memory_order_relaxed);
    uint64_t g = atomic_load_explicit(&s->guaranteed, memory_order_relaxed);
    committed += max64(u, g);
    held += u;
    gsum += g;
    ++live;
  }
  atomic_store_explicit(&f->h.committed, committed, memory_order_relaxed);
  atomic_store_explicit(&f->h.held, held, memory_order_relaxed);
  atomic_store_explicit(&f->h.guaranteed_sum, gsum, memory_order_relaxed);
  atomic_store_explicit(&f->h.live, live, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->h.sweeps, 1, memory_order_relaxed);
}

/* Take f's mu: at once when free, else (wait) up to the timeout.  A dead
 * holder is repaired by a sweep (f must be h's file then).  Without wait, a
 * busy mutex is GMR_EBUSY with no message. */
static int scap_lock_f(gmr_scap_t *h, scap_file_t *f, bool wait) {
  int r = pthread_mutex_trylock(&f->h.mu);
  if (GMR_UNLIKELY(r == EBUSY) && !wait) return GMR_EBUSY;
  if (GMR_UNLIKELY(r == EBUSY)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = h->o.timeout_s;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec += 1, ts.tv_nsec -= 1000000000L;
    r = pthread_mutex_timedlock(&f->h.mu, &ts);
    if (r == EOWNERDEAD) SCAP_TSAN_TAKEN(&f->h.mu);
  }
  if (GMR_LIKELY(r == 0)) {
    atomic_store_explicit(&f->h.holder_pid, h->pid, memory_order_relaxed);
    return 0;
  }
  if (r == EOWNERDEAD) {
    int dead = atomic_load_explicit(&f->h.holder_pid, memory_order_relaxed);
    atomic_store_explicit(&f->h.holder_pid, h->pid, memory_order_relaxed);
    sweep(h);
    atomic_fetch_add_explicit(&f->h.repairs, 1, memory_order_relaxed);
    pthread_mutex_consistent(&f->h.mu);
    gmr__log(GMR_LOG_INFO,
             "shared cap: process %d died holding the lock of %s; totals rebuilt from the slots",
             dead, h->path);
    return 0;
  }
  if (r == ETIMEDOUT || r == EBUSY) {
    atomic_fetch_add_explicit(&f->h.timeouts, 1, memory_order_relaxed);
    return gmr__error_set(GMR_EBUSY,
                          "shared cap: waited %.3g s for the lock of %s, held by process %d "
                          "(stopped or stalled?); giving up",
                          h->o.timeout_s, h->path,
                          (int)atomic_load_explicit(&f->h.holder_pid, memory_order_relaxed));
  }
  if (r == ENOTRECOVERABLE)
    return gmr__error_set(GMR_EIO,
                          "shared cap: the lock of %s cannot be recovered; remove the file once "
                          "no process uses it",
                          h->path);
  return gmr__error_set(GMR_EIO, "shared cap: locking %s: %s", h->path, strerror(r));
}

static inline int scap_lock(gmr_scap_t *h) {
  return scap_lock_f(h, h->f, true);
}

static inline void scap_unlock(gmr_scap_t *h) {
  pthread_mutex_unlock(&h->f->h.mu);
}

/* ---- claims --------------------------------------------------------------------------- */

/* Claim a free slot with `used0` bytes already held.  Caller: holds mu. */
static int claim(gmr_scap_t *h, uint64_t used0) {
  scap_file_t *f = h->f;
  sweep(h);
  uint64_t g = h->o.guaranteed, cap = f->h.cap;
  uint64_t gsum = atomic_load_explicit(&f->h.guaranteed_sum, memory_order_relaxed);
  if (g > cap - gsum) {
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
    uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->gen, gen, memory_order_relaxed);
    atomic_store_explicit(&s->quota, h->o.quota, memory_order_relaxed);
    atomic_store_explicit(&s->guaranteed, g, memory_order_relaxed);
    atomic_store_explicit(&s->used, used0, memory_order_relaxed);
    atomic_store_explicit(&s->pid, h->pid, memory_order_relaxed);
    atomic_store_explicit(&s->claimed_at, (uint64_t)time(NULL), memory_order_relaxed);
    atomic_store_explicit(&s->ops, 0, memory_order_relaxed);
    memset(s->label, 0, sizeof s->label);
    snprintf(s->label, sizeof s->label, "%s", h->label);
    atomic_store_explicit(&s->state, SLOT_LIVE, memory_order_release);
    atomic_fetch_add_explicit(&f->h.committed, max64(used0, g), memory_order_relaxed);
    atomic_fetch_add_explicit(&f->h.held, used0, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->h.guaranteed_sum, g, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->h.live, 1, memory_order_relaxed);
    h->slot = (int)i;
    h->gen = gen;
    return 0;
  }
  return gmr__error_set(GMR_ENOMEM, "shared cap: all %u slots of %s are taken by live processes",
                        SCAP_SLOTS, h->path);
}

/* Give our slot back.  Caller: holds mu. */
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
                          "bytes); refusing to use or change it. Stop the processes using it, or "
                          "give this one another path",
                          h->path, hd->version, hd->nslots, hd->slot_size, SCAP_VERSION, SCAP_SLOTS,
                          SCAP_SLOT_SIZE);
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

static int init_file(gmr_scap_t *h, scap_file_t *f) {
  memset(f, 0, sizeof *f);
  pthread_mutexattr_t a;
  if (pthread_mutexattr_init(&a) != 0) return gmr__error_set(GMR_EIO, "shared cap: mutexattr");
  int r = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  if (r == 0) r = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  if (r == 0) r = pthread_mutex_init(&f->h.mu, &a);
  pthread_mutexattr_destroy(&a);
  if (r != 0)
    return gmr__error_set(GMR_EIO, "shared cap: cannot make the lock of %s: %s", h->path,
                          strerror(r));
  f->h.version = SCAP_VERSION;
  f->h.header_size = SCAP_HEADER_SIZE;
  f->h.slot_size = SCAP_SLOT_SIZE;
  f->h.nslots = SCAP_SLOTS;
  f->h.file_size = SCAP_FILE_SIZE;
  f->h.cap = h->o.cap;
  snprintf(f->h.device_id, sizeof f->h.device_id, "%s", h->device_id);
  atomic_store_explicit(&f->h.magic, SCAP_MAGIC, memory_order_release);
  return 0;
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
    /* Serialize making and checking the header. */
    uint64_t deadline = coarse_ns() + (uint64_t)(h->o.timeout_s * 1e9);
    while (ofd_lock(lfd, SCAP_LOCK_INIT, F_WRLCK) != 0) {
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
         * (no one else is making it: we hold SCAP_LOCK_INIT). */
        if (!fresh && len == SCAP_FILE_SIZE && atomic_load(&f->h.magic) == 0 && f->h.version == 0)
          fresh = true;
        if (fresh)
          err = init_file(h, f);
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
    ofd_lock(lfd, SCAP_LOCK_INIT, F_UNLCK);
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
  bool created = false;
  if (err == 0) err = open_file(h, &created);
  if (err == 0) {
    err = scap_lock(h);
    if (err == 0) {
      err = claim(h, 0);
      scap_unlock(h);
    }
    if (err != 0) close_file(h);
  }
  if (err != 0) {
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
  gmr__lock_destroy(&h->local);
  gmr__free(h);
}

const char *gmr__scap_path(const gmr_scap_t *h) {
  return h->path;
}

/* ---- split domains and forks ---------------------------------------------------------------- */

/* Move our slot (with its `used` bytes) to the file now at the path.  The
 * new file is published (h->f) while the old one's mu is held, so a thread
 * that locked the old mu meanwhile sees the change and tries again.  The old
 * mapping stays until detach.  Caller: holds local, not mu. */
static int migrate(gmr_scap_t *h) {
  scap_retired_t *r = gmr__calloc(1, sizeof *r);
  if (r == NULL) return gmr__error_set(GMR_ENOMEM, "shared cap: out of host memory");
  gmr_scap_t fresh = *h;
  fresh.f = NULL;
  fresh.lockfd = -1;
  fresh.mapfd = -1;
  fresh.slot = -1;
  scap_file_t *old = h->f;
  int old_mapfd = h->mapfd, old_lockfd = h->lockfd;
  int err = scap_lock_f(h, old, true);
  if (err != 0) {
    gmr__free(r);
    return err;
  }
  uint64_t used = h->slot >= 0 ? atomic_load(&old->slot[h->slot].used) : 0;
  bool created;
  err = open_file(&fresh, &created);
  if (err == 0) {
    err = scap_lock(&fresh);
    if (err == 0) {
      err = claim(&fresh, used);
      scap_unlock(&fresh);
    }
    if (err != 0) close_file(&fresh);
  }
  if (err != 0) {
    pthread_mutex_unlock(&old->h.mu);
    gmr__free(r);
    return err;
  }
  unclaim(h);
  atomic_store(&h->slot, fresh.slot);
  h->gen = fresh.gen;
  h->mapfd = fresh.mapfd;
  atomic_store(&h->lockfd, fresh.lockfd);
  atomic_store_explicit(&h->f, fresh.f, memory_order_release);
  pthread_mutex_unlock(&old->h.mu);
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

/* A forked child: open our own lock descriptor on the mapped file and claim
 * a slot.  Caller: holds local. */
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
 * its link count.  The slot is claimed by slot_check.  Returns holding the
 * current file's mu. */
static inline int enter(gmr_scap_t *h) {
  for (;;) {
    if (GMR_UNLIKELY(atomic_load_explicit(&h->lockfd, memory_order_acquire) < 0)) {
      gmr__lock(&h->local);
      int err = h->lockfd < 0 ? reclaim(h) : 0;
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
    scap_file_t *f = atomic_load_explicit(&h->f, memory_order_acquire);
    int err = scap_lock_f(h, f, true);
    if (GMR_UNLIKELY(err != 0)) return err;
    /* Moved meanwhile (the mover published while holding this mu)? */
    if (GMR_LIKELY(atomic_load_explicit(&h->f, memory_order_relaxed) == f)) return 0;
    pthread_mutex_unlock(&f->h.mu);
  }
}

/* ---- reserve, release ------------------------------------------------------------------------ */

/* Apply a release of n bytes to our slot.  Caller: holds mu. */
static void apply_release(gmr_scap_t *h, uint64_t n) {
  scap_file_t *f = h->f;
  scap_slot_t *s = &f->slot[h->slot];
  uint64_t u = atomic_load_explicit(&s->used, memory_order_relaxed);
  uint64_t g = atomic_load_explicit(&s->guaranteed, memory_order_relaxed);
  if (n > u) n = u; /* memory inherited over fork, reserved by the parent's slot */
  uint64_t d = max64(u, g) - max64(u - n, g);
  atomic_store_explicit(&s->used, u - n, memory_order_relaxed);
  atomic_store_explicit(&f->h.committed,
                        atomic_load_explicit(&f->h.committed, memory_order_relaxed) - d,
                        memory_order_relaxed);
  atomic_store_explicit(&f->h.held, atomic_load_explicit(&f->h.held, memory_order_relaxed) - n,
                        memory_order_relaxed);
  atomic_store_explicit(&s->ops, atomic_load_explicit(&s->ops, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* Our slot is still ours (a sweep never frees a live process's slot, but a
 * process that closed our lock descriptor behind our back loses it), or we
 * claim one: a forked child, or after such a loss.  Caller: holds mu. */
static inline int slot_check(gmr_scap_t *h) {
  if (GMR_LIKELY(h->slot >= 0)) {
    scap_slot_t *s = &h->f->slot[h->slot];
    if (GMR_LIKELY(atomic_load_explicit(&s->state, memory_order_relaxed) == SLOT_LIVE &&
                   atomic_load_explicit(&s->gen, memory_order_relaxed) == h->gen))
      return 0;
    gmr__log(GMR_LOG_WARN, "shared cap: this process's slot in %s was freed; claiming a new one",
             h->path);
    ofd_lock(h->lockfd, SCAP_LOCK_BASE + h->slot, F_UNLCK);
    h->slot = -1;
  }
  return claim(h, 0);
}

static int refusal(gmr_scap_t *h, uint64_t n, uint64_t committed, uint64_t held, uint64_t used,
                   const char *why) {
  char c[32], r[32], m[32], u[32], q[32], hb[32];
  fmt_size(h->f->h.cap, c, sizeof c);
  fmt_size(n, r, sizeof r);
  fmt_size(committed, m, sizeof m);
  fmt_size(held, hb, sizeof hb);
  fmt_size(used, u, sizeof u);
  fmt_size(h->o.quota, q, sizeof q);
  return gmr__error_set(GMR_ENOMEM,
                        "out of memory: %s. Shared cap of %s (%llu bytes) on device %s (%s): %s "
                        "committed by %u processes (%s held); this process holds %s of its quota "
                        "of %s. Tried to reserve %s (%llu bytes).",
                        why, c, (unsigned long long)h->f->h.cap, h->device_id, h->path, m,
                        (unsigned)atomic_load_explicit(&h->f->h.live, memory_order_relaxed), hb, u,
                        h->o.quota ? q : "(none)", r, (unsigned long long)n);
}

int gmr__scap_reserve(gmr_scap_t *h, uint64_t n) {
  int err = enter(h);
  if (GMR_UNLIKELY(err != 0)) return err;
  err = slot_check(h);
  uint64_t owed = atomic_load_explicit(&h->owed, memory_order_relaxed);
  if (GMR_UNLIKELY(owed != 0) && err == 0) {
    owed = atomic_exchange(&h->owed, 0);
    apply_release(h, owed);
  }
  scap_file_t *f = h->f;
  if (GMR_LIKELY(err == 0)) {
    scap_slot_t *s = &f->slot[h->slot];
    uint64_t u = atomic_load_explicit(&s->used, memory_order_relaxed);
    uint64_t g = h->o.guaranteed, cap = f->h.cap;
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
      atomic_store_explicit(&s->used, u + n, memory_order_relaxed);
      atomic_store_explicit(&f->h.committed, c + d, memory_order_relaxed);
      atomic_store_explicit(&f->h.held, held + n, memory_order_relaxed);
      atomic_store_explicit(&s->ops, atomic_load_explicit(&s->ops, memory_order_relaxed) + 1,
                            memory_order_relaxed);
      atomic_store_explicit(&f->h.ops, atomic_load_explicit(&f->h.ops, memory_order_relaxed) + 1,
                            memory_order_relaxed);
    }
  }
  pthread_mutex_unlock(&f->h.mu);
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
    atomic_store_explicit(&f->h.ops, atomic_load_explicit(&f->h.ops, memory_order_relaxed) + 1,
                          memory_order_relaxed);
  }
  pthread_mutex_unlock(&f->h.mu);
}

void gmr__scap_view(gmr_scap_t *h, gmr_scap_view_t *out) {
  /* Fresh totals: the shares of processes that died since the last sweep
   * are not counted (one lock probe per live slot).  When the lock is busy,
   * the figures as they are: a view never waits. */
  scap_file_t *f = atomic_load_explicit(&h->f, memory_order_acquire);
  bool locked = atomic_load_explicit(&h->lockfd, memory_order_acquire) >= 0 &&
                atomic_load_explicit(&h->slot, memory_order_relaxed) >= 0 &&
                scap_lock_f(h, f, false) == 0;
  if (locked && atomic_load_explicit(&h->f, memory_order_relaxed) != f) {
    pthread_mutex_unlock(&f->h.mu); /* moved meanwhile: the old file's figures */
    locked = false;
  }
  if (locked) sweep(h);
  int slot = atomic_load_explicit(&h->slot, memory_order_relaxed);
  uint64_t u = slot >= 0 ? atomic_load_explicit(&f->slot[slot].used, memory_order_relaxed) : 0;
  uint64_t c = atomic_load_explicit(&f->h.committed, memory_order_relaxed);
  uint64_t held = atomic_load_explicit(&f->h.held, memory_order_relaxed);
  if (locked) pthread_mutex_unlock(&f->h.mu);
  uint64_t g = h->o.guaranteed, cap = f->h.cap;
  out->cap = cap;
  out->committed = c;
  out->used = u;
  out->quota = h->o.quota;
  out->guaranteed = g;
  /* Growth by r costs max(u + r, g) - max(u, g) of committed: the first
   * g - u bytes are free of charge. */
  uint64_t cap_left = c < cap ? cap - c : 0;
  uint64_t room = cap_left + (max64(u, g) - u);
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
  atomic_fetch_add(&h->f->slot[h->slot].used, n); /* committed is not updated */
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
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_fail("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = sys_fail("cannot stat", path);
    close(fd);
    return err;
  }
  if (st.st_size != (off_t)SCAP_FILE_SIZE) {
    close(fd);
    return gmr__error_set(GMR_EINVAL,
                          "%s is not a shared-cap file of this version of gmr (%lld bytes, "
                          "expected %u)",
                          path, (long long)st.st_size, SCAP_FILE_SIZE);
  }
  scap_file_t *f = mmap(NULL, SCAP_FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
  if (f == MAP_FAILED) {
    int err = sys_fail("cannot map", path);
    close(fd);
    return err;
  }
  int err = 0;
  const scap_header_t *hd = &f->h;
  if (atomic_load(&hd->magic) != SCAP_MAGIC || hd->version != SCAP_VERSION ||
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
      uint32_t gen = atomic_load_explicit(&s->gen, memory_order_acquire);
      if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_LIVE) continue;
      gmr_shared_cap_slot_t e;
      memset(&e, 0, sizeof e);
      e.index = (int)i;
      e.generation = gen;
      e.pid = atomic_load(&s->pid);
      e.quota = atomic_load(&s->quota);
      e.guaranteed = atomic_load(&s->guaranteed);
      e.held = atomic_load(&s->used);
      e.operations = atomic_load(&s->ops);
      e.since = atomic_load(&s->claimed_at);
      memcpy(e.label, s->label, sizeof e.label - 1);
      /* Alive: its owner still holds the liveness byte. */
      struct flock fl = {.l_type = F_WRLCK,
                         .l_whence = SEEK_SET,
                         .l_start = SCAP_LOCK_BASE + (off_t)i,
                         .l_len = 1};
      e.alive = fcntl(fd, F_OFD_GETLK, &fl) == 0 ? fl.l_type != F_UNLCK : 1;
      if (atomic_load_explicit(&s->gen, memory_order_acquire) != gen) continue; /* reclaimed */
      ++info->live;
      if (n < max_slots) slots[n++] = e;
    }
    *out_n = n;
  }
  munmap(f, SCAP_FILE_SIZE);
  close(fd);
  return err;
}
