/* shared-cap.c: tests of the cross-process cap (lib/core/shared-cap.c), with
 * real processes, SIGKILL and SIGSTOP, on files in a fresh temporary folder.
 *
 *   basic       cap, quota and guarantee arithmetic between two handles;
 *               the public reader; refusals of a file with another cap,
 *               device, version or no magic, which stays unchanged
 *   attach race GMR_SCAP_PROCS (64) processes attach at once: exactly one
 *               makes the file, all get distinct slots
 *   lock holder GMR_SCAP_KILLS (1000) times a process is SIGKILLed while it
 *               holds the lock mid-update: the next locker repairs the totals
 *   quota holder a SIGKILLed process's 90% of the cap comes back at the
 *               next reservation
 *   race        16 processes x GMR_SCAP_OPS (5000) random reservations and
 *               releases, with GMR_SCAP_RACE_KILLS (8) SIGKILLs and respawns:
 *               an audit counter (added after a reservation, taken off before
 *               a release) never passes the cap; nothing is left at the end
 *   fork        fork without exec, then SIGKILL of the parent: its slot is
 *               freed while the child lives; the child gets its own slot
 *   stopped     a SIGSTOPped lock holder: GMR_EBUSY after the timeout, a
 *               release is owed and applied later, SIGCONT recovers
 *   unlinked    the file is unlinked while in use: "domain split", and the
 *               process moves its share to the new file
 *   pid ns      a holder that is pid 1 of its own PID namespace, SIGKILLed
 *               from outside: liveness does not depend on pids (skipped
 *               where unshare(CLONE_NEWPID) is not allowed)
 *   threads     4 threads on one handle
 *   corrupt     a hostile writer: garbage over the header's lock and totals,
 *               the cap rewritten, slots in unknown states, sums that
 *               overflow, the file cut short while mapped: no crash or hang,
 *               the file is rebuilt from the live members
 *   untrusted   files another user could control: writable by others, a
 *               symbolic link, a FIFO, a hard link, another owner, in a
 *               folder others can write: refused, never followed or blocked
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/shared-cap.h"
#include "tap.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

static char dir[256];

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : dflt;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void path_of(const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", dir, name);
}

static gmr_scap_opts_t opts(const char *path, uint64_t cap, uint64_t quota, uint64_t g,
                            const char *label) {
  gmr_scap_opts_t o = {.path = path,
                       .device_id = "sim-test",
                       .cap = cap,
                       .quota = quota,
                       .guaranteed = g,
                       .label = label,
                       .timeout_s = 2.0};
  return o;
}

static gmr_scap_t *attach(const char *path, uint64_t cap, uint64_t quota, uint64_t g,
                          const char *label) {
  gmr_scap_opts_t o = opts(path, cap, quota, g, label);
  gmr_scap_t *h = NULL;
  if (gmr__scap_attach(&o, &h) != 0) diag("attach %s: %s", path, gmr__error_last());
  return h;
}

/* committed recomputed from the public reader's slots. */
static uint64_t committed_from_slots(const char *path, uint64_t *held, size_t *live) {
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[256];
  size_t n = 0;
  if (gmr_shared_cap_read(path, &info, s, 256, &n) != 0) return UINT64_MAX;
  uint64_t c = 0, h = 0;
  for (size_t i = 0; i < n; ++i) {
    c += s[i].held > s[i].guaranteed ? s[i].held : s[i].guaranteed;
    h += s[i].held;
  }
  if (held) *held = h;
  if (live) *live = n;
  return c;
}

static void read_info(const char *path, gmr_shared_cap_info_t *info) {
  size_t n;
  memset(info, 0, sizeof *info);
  if (gmr_shared_cap_read(path, info, NULL, 0, &n) != 0)
    diag("read %s: %s", path, gmr_last_error(NULL));
}

/* A pipe used as a one-byte signal. */
static void signal_fd(int fd) {
  char c = 1;
  ssize_t w = write(fd, &c, 1);
  (void)w;
}
static int wait_fd(int fd) {
  char c;
  return read(fd, &c, 1) == 1 ? 0 : -1;
}

static void reap(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

/* Fork a child that attaches to p (a 10 GiB quota) as `label`, takes n bytes
 * with `take` (gmr__scap_reserve, or gmr__scap_debug_hold: the lock held in
 * the middle of an update) and sleeps until it is killed.  Returns its pid
 * (-1 if none) once it holds them; *held is 1 then, 0 if the child failed. */
static pid_t spawn_holder(const char *p, const char *label, int (*take)(gmr_scap_t *, uint64_t),
                          uint64_t n, int *held) {
  int fds[2];
  *held = 0;
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    gmr_scap_t *h = attach(p, 10 * GiB, 0, 0, label);
    if (!h || take(h, n) != 0) _exit(1);
    signal_fd(fds[1]);
    for (;;)
      pause();
  }
  close(fds[1]);
  if (pid > 0) *held = wait_fd(fds[0]) == 0;
  close(fds[0]);
  return pid;
}

/* ---- basic ------------------------------------------------------------------------- */

static void test_basic(void) {
  char p[300];
  path_of("basic", p, sizeof p);
  gmr_scap_t *a = attach(p, 100 * MiB, 60 * MiB, 0, "alpha");
  gmr_scap_t *b = attach(p, 100 * MiB, 60 * MiB, 0, "beta");
  ok(a && b, "two handles attach to one file");
  if (!a || !b) return;
  gmr_scap_debug_t da, db;
  gmr__scap_debug(a, &da);
  gmr__scap_debug(b, &db);
  ok(da.created && !db.created, "the first made the file, the second found it");
  ok(da.slot >= 0 && db.slot >= 0 && da.slot != db.slot, "distinct slots (%d, %d)", da.slot,
     db.slot);

  is_int(gmr__scap_reserve(a, 50 * MiB), 0, "a: 50 MiB");
  is_int(gmr__scap_reserve(b, 40 * MiB), 0, "b: 40 MiB");
  is_int(gmr__scap_reserve(a, 11 * MiB), GMR_ENOMEM, "a: 11 MiB more passes the cap (101 > 100)");
  like(gmr__error_last(), "Shared cap of 100.00 MiB", "the refusal names the cap");
  like(gmr__error_last(), "Tried to reserve 11.00 MiB", "and the request");
  is_int(gmr__scap_reserve(a, 10 * MiB), 0, "a: 10 MiB more fits exactly");
  gmr__scap_release(b, 40 * MiB);
  is_int(gmr__scap_reserve(a, 1 * MiB), GMR_ENOMEM, "a: past its 60 MiB quota");
  like(gmr__error_last(), "past this process's quota", "the refusal says quota");
  gmr_scap_view_t v;
  gmr__scap_view(b, &v);
  is_u64(v.committed, 60 * MiB, "committed: 60 MiB");
  is_u64(v.room, 40 * MiB, "b's room: the cap's 40 MiB left");

  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[8];
  size_t n = 0;
  is_int(gmr_shared_cap_read(p, &info, s, 8, &n), 0, "the public reader reads the file");
  is_u64(info.cap, 100 * MiB, "cap");
  is_u64(info.committed, 60 * MiB, "committed");
  is_int(info.live, 2, "two live slots");
  is_str(info.device_id, "sim-test", "device id");
  int found = 0;
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(s[i].label, "alpha") == 0 && s[i].held == 60 * MiB && s[i].quota == 60 * MiB &&
        s[i].alive == 1 && s[i].pid == getpid())
      ++found;
    if (strcmp(s[i].label, "beta") == 0 && s[i].held == 0 && s[i].alive == 1) ++found;
  }
  is_int(found, 2, "both slots: label, held, quota, pid, alive");

  /* Guarantees. */
  gmr_scap_t *c = attach(p, 100 * MiB, 0, 30 * MiB, "gamma");
  ok(c != NULL, "a guarantee of 30 MiB is admitted (Σ guaranteed 30 <= cap 100)");
  gmr_scap_opts_t o = opts(p, 100 * MiB, 0, 80 * MiB, "delta");
  gmr_scap_t *d = NULL;
  is_int(gmr__scap_attach(&o, &d), GMR_ECONFIG, "80 MiB more of guarantees: refused");
  like(gmr__error_last(), "cannot guarantee 80.00 MiB", "the refusal says why");
  if (c) {
    gmr__scap_view(b, &v);
    is_u64(v.committed, 90 * MiB, "committed counts gamma's guarantee: 60 + 30");
    is_int(gmr__scap_reserve(b, 11 * MiB), GMR_ENOMEM, "beta cannot take gamma's guarantee");
    gmr__scap_view(c, &v);
    is_u64(v.room, 40 * MiB, "gamma's room: its 30 MiB guarantee + the 10 MiB the cap has left");
    is_int(gmr__scap_reserve(c, 30 * MiB), 0, "gamma gets its 30 MiB");
    gmr__scap_view(c, &v);
    is_u64(v.committed, 90 * MiB, "which cost nothing more");
    gmr__scap_release(c, 30 * MiB);
    gmr__scap_detach(c);
    gmr__scap_view(b, &v);
    is_u64(v.committed, 60 * MiB, "gamma detached: its guarantee is gone");
  }

  /* Mismatches are refused and change nothing. */
  o = opts(p, 200 * MiB, 0, 0, "wrong");
  is_int(gmr__scap_attach(&o, &d), GMR_ECONFIG, "another cap: refused");
  like(gmr__error_last(), "holds a cap of 100.00 MiB", "the refusal names both caps");
  like(gmr__error_last(), "asks for 200.00 MiB", "...");
  o = opts(p, 100 * MiB, 0, 0, "wrong");
  o.device_id = "GPU-other";
  is_int(gmr__scap_attach(&o, &d), GMR_ECONFIG, "another device: refused");
  like(gmr__error_last(), "belongs to device sim-test", "the refusal names the device");
  read_info(p, &info);
  ok(info.cap == 100 * MiB && info.committed == 60 * MiB && info.live == 2,
     "the file is unchanged after the refusals");

  /* Another version: a copy of the file with its version field changed. */
  char q[300];
  path_of("basic-v2", q, sizeof q);
  int in = open(p, O_RDONLY), out = open(q, O_RDWR | O_CREAT | O_TRUNC, 0600);
  char buf[65536];
  ssize_t len = read(in, buf, sizeof buf);
  uint32_t v2 = 3;
  memcpy(buf + 8, &v2, 4); /* magic (8 bytes), then version */
  ok(len > 0 && write(out, buf, (size_t)len) == len, "a copy with version 3");
  close(in), close(out);
  o = opts(q, 100 * MiB, 0, 0, "wrong");
  is_int(gmr__scap_attach(&o, &d), GMR_ECONFIG, "another version: refused");
  like(gmr__error_last(), "another version of gmr (version 3", "the refusal names the versions");
  int fd = open(q, O_RDONLY);
  uint32_t ver = 0;
  ok(pread(fd, &ver, 4, 8) == 4 && ver == 3, "and the file keeps version 3");
  close(fd);
  /* Not a shared-cap file at all. */
  path_of("basic-junk", q, sizeof q);
  fd = open(q, O_RDWR | O_CREAT | O_TRUNC, 0600);
  ok(write(fd, "hello, this is not a cap file\n", 30) == 30, "a file of text");
  close(fd);
  is_int(gmr__scap_attach(&o, &d), GMR_ECONFIG, "a foreign file: refused");
  like(gmr__error_last(), "not a gmr shared-cap file", "the refusal says so");
  ok(gmr_shared_cap_read(q, &info, NULL, 0, &n) == GMR_EINVAL, "the reader refuses it too");

  usleep(60000); /* past the link check's period: detach must not wait for itself */
  gmr__scap_detach(a);
  gmr__scap_detach(b);
  read_info(p, &info);
  ok(info.committed == 0 && info.held == 0 && info.live == 0, "all detached: nothing committed");
}

/* ---- attach race ------------------------------------------------------------------- */

typedef struct race_rec_s {
  int created, slot, err;
} race_rec_t;

static void test_attach_race(void) {
  char p[300];
  path_of("attach-race", p, sizeof p);
  int nproc = (int)env_long("GMR_SCAP_PROCS", 64);
  race_rec_t *rec = mmap(NULL, sizeof *rec * (size_t)nproc, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int go[2], done[2], hold[2];
  if (pipe(go) || pipe(done) || pipe(hold)) return;
  pid_t *pids = calloc((size_t)nproc, sizeof *pids);
  for (int i = 0; i < nproc; ++i) {
    pids[i] = fork();
    if (pids[i] == 0) {
      close(go[1]), close(hold[1]);
      char c;
      ssize_t r = read(go[0], &c, 1); /* EOF for all at once */
      (void)r;
      gmr_scap_opts_t o = opts(p, 64 * GiB, 0, 0, "racer");
      gmr_scap_t *h = NULL;
      rec[i].err = gmr__scap_attach(&o, &h);
      if (h) {
        gmr_scap_debug_t d;
        gmr__scap_debug(h, &d);
        rec[i].created = d.created;
        rec[i].slot = d.slot;
        if (gmr__scap_reserve(h, MiB) != 0) rec[i].err = -100;
      }
      signal_fd(done[1]);
      r = read(hold[0], &c, 1); /* stay attached until all are counted */
      _exit(0);
    }
  }
  close(go[0]), close(go[1]);
  int ready = 0;
  for (int i = 0; i < nproc; ++i)
    ready += wait_fd(done[0]) == 0;
  int created = 0, errors = 0;
  unsigned char seen[256] = {0};
  int dup = 0;
  for (int i = 0; i < nproc; ++i) {
    created += rec[i].created;
    errors += rec[i].err != 0;
    if (rec[i].slot >= 0 && rec[i].slot < 256) dup += seen[rec[i].slot]++ != 0;
  }
  is_int(ready, nproc, "%d processes attached at once", nproc);
  is_int(errors, 0, "none failed");
  is_int(created, 1, "exactly one made the file");
  is_int(dup, 0, "all slots distinct");
  gmr_shared_cap_info_t info;
  read_info(p, &info);
  ok(info.live == (unsigned)nproc && info.held == (uint64_t)nproc * MiB &&
         info.committed == (uint64_t)nproc * MiB,
     "the file shows %u live slots, %llu MiB held and committed", info.live,
     (unsigned long long)(info.held / MiB));
  /* A latecomer with another cap is refused while they live. */
  gmr_scap_opts_t o = opts(p, 32 * GiB, 0, 0, "late");
  gmr_scap_t *h = NULL;
  is_int(gmr__scap_attach(&o, &h), GMR_ECONFIG, "a latecomer with another cap is refused");
  close(hold[0]), close(hold[1]), close(done[0]), close(done[1]);
  for (int i = 0; i < nproc; ++i)
    reap(pids[i]);
  h = attach(p, 64 * GiB, 0, 0, "after");
  gmr_scap_view_t v;
  if (h) gmr__scap_view(h, &v);
  ok(h && v.committed == 0, "once they exited (without detaching), nothing is committed");
  read_info(p, &info);
  is_int(info.live, 1, "and only the new slot is live");
  gmr__scap_detach(h);
  free(pids);
  munmap(rec, sizeof *rec * (size_t)nproc);
}

/* ---- a lock holder killed mid-update ---------------------------------------------- */

static void test_dead_lock_holder(void) {
  char p[300];
  path_of("dead-holder", p, sizeof p);
  long kills = env_long("GMR_SCAP_KILLS", 1000);
  gmr_scap_t *me = attach(p, 10 * GiB, 0, 0, "survivor");
  if (!me) return;
  gmr_scap_debug_t d0, d1;
  gmr__scap_debug(me, &d0);
  long bad_rc = 0, bad_totals = 0, bad_repairs = 0;
  double t0 = now_s();
  for (long k = 0; k < kills; ++k) {
    int fds[2];
    if (pipe(fds)) break;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      gmr_scap_t *h = attach(p, 10 * GiB, 0, 0, "victim");
      if (!h || gmr__scap_reserve(h, 100 * MiB) != 0) _exit(1);
      if (gmr__scap_debug_hold(h, 50 * MiB) != 0) _exit(1); /* used += 50 MiB, committed not */
      signal_fd(fds[1]);
      for (;;)
        pause();
    }
    close(fds[1]);
    int w = wait_fd(fds[0]);
    close(fds[0]);
    kill(pid, SIGKILL);
    reap(pid);
    if (w != 0) {
      ++bad_rc;
      continue;
    }
    uint64_t before;
    gmr__scap_debug(me, &d1);
    before = d1.repairs;
    if (gmr__scap_reserve(me, MiB) != 0) ++bad_rc; /* the dead holder's busy mark: a repair */
    gmr__scap_debug(me, &d1);
    if (d1.repairs != before + 1) ++bad_repairs;
    uint64_t held;
    size_t live;
    uint64_t c = committed_from_slots(p, &held, &live);
    gmr_scap_view_t v;
    gmr__scap_view(me, &v);
    if (c != MiB || held != MiB || v.committed != MiB || live != 1) ++bad_totals;
    gmr__scap_release(me, MiB);
  }
  gmr__scap_debug(me, &d1);
  diag("%ld lock holders killed in %.2f s", kills, now_s() - t0);
  is_int(bad_rc, 0,
         "%ld times: the victim held the lock mid-update when killed, and the next "
         "reservation succeeded",
         kills);
  is_int(bad_repairs, 0, "each time the next locker saw the dead holder's mark and repaired");
  is_int(bad_totals, 0,
         "each time committed = held = Σ over live slots = 1 MiB (the victim's "
         "150 MiB, half-counted, are gone)");
  is_u64(d1.repairs - d0.repairs, kills, "repairs counted");
  is_int(gmr__scap_reserve(me, 10 * GiB - MiB), 0, "the whole cap (less 1 MiB) is free again");
  gmr__scap_release(me, 10 * GiB - MiB);

  /* Once more with this process already waiting for the lock when the
   * holder dies (the kernel drops its lock). */
  int held;
  pid_t holder = spawn_holder(p, "victim", gmr__scap_debug_hold, 50 * MiB, &held);
  if (holder > 0) {
    pid_t killer = fork();
    if (killer == 0) {
      usleep(100000);
      kill(holder, SIGKILL);
      _exit(0);
    }
    gmr__scap_debug(me, &d0);
    double t1 = now_s();
    int rc = gmr__scap_reserve(me, MiB);
    double waited = now_s() - t1;
    gmr__scap_debug(me, &d1);
    ok(held && rc == 0 && d1.repairs == d0.repairs + 1 && waited >= 0.05,
       "a reservation waiting for the lock when its holder is killed gets it, repaired (%.3f s)",
       waited);
    gmr__scap_release(me, MiB);
    reap(killer);
    reap(holder);
  }
  gmr__scap_detach(me);
}

/* ---- a quota holder killed ---------------------------------------------------------- */

static void test_dead_quota_holder(void) {
  char p[300];
  path_of("dead-quota", p, sizeof p);
  gmr_scap_t *me = attach(p, 10 * GiB, 0, 0, "survivor");
  if (!me) return;
  int held;
  pid_t pid = spawn_holder(p, "holder", gmr__scap_reserve, 9 * GiB, &held);
  if (pid < 0) return;
  ok(held, "a child holds 90%% of the cap");
  is_int(gmr__scap_reserve(me, 2 * GiB), GMR_ENOMEM, "the rest cannot take 20%% while it lives");
  kill(pid, SIGKILL);
  reap(pid);
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[4];
  size_t n = 0;
  gmr_shared_cap_read(p, &info, s, 4, &n);
  int dead_seen = 0;
  for (size_t i = 0; i < n; ++i)
    dead_seen += s[i].pid == pid && s[i].alive == 0 && s[i].held == 9 * GiB;
  ok(info.committed == 9 * GiB && dead_seen == 1,
     "killed: its 9 GiB are still committed, and the reader shows its slot dead");
  gmr_scap_debug_t d0, d1;
  gmr__scap_debug(me, &d0);
  is_int(gmr__scap_reserve(me, 9 * GiB), 0, "the next reservation of 90%% succeeds");
  gmr__scap_debug(me, &d1);
  ok(d1.sweeps > d0.sweeps && d1.freed == d0.freed + 1, "after a sweep freed the dead slot");
  gmr__scap_release(me, 9 * GiB);
  gmr__scap_detach(me);
  read_info(p, &info);
  ok(info.committed == 0 && info.live == 0, "everyone gone: committed 0");
}

/* ---- the race ------------------------------------------------------------------------ */

#define RACE_PROCS 16
#define RACE_HELD  64

typedef struct race_shared_s {
  _Atomic int64_t audit; /* Σ bytes reserved, added after commit, taken off before release */
  _Atomic int64_t audit_max;
  _Atomic int64_t violations;     /* audit > cap */
  _Atomic int64_t cap_violations; /* the file's committed seen > cap */
  _Atomic int64_t quota_violations;
  _Atomic int64_t errors;
  _Atomic int64_t done;    /* operations made */
  _Atomic int64_t started; /* workers of the first round past attach */
  _Atomic int64_t refused;
  _Atomic int64_t held[RACE_PROCS]; /* per worker: bytes in the audit */
} race_shared_t;

static void race_worker(const char *path, race_shared_t *sh, int w, long total, uint64_t cap,
                        uint64_t quota, unsigned seed) {
  gmr_scap_t *h = attach(path, cap, quota, 0, "racer");
  if (!h) {
    atomic_fetch_add(&sh->errors, 1);
    _exit(1);
  }
  /* The first round starts together, so that all 16 hold memory at once. */
  if (atomic_fetch_add(&sh->started, 1) < RACE_PROCS)
    while (atomic_load(&sh->started) < RACE_PROCS)
      usleep(100);
  uint64_t mine[RACE_HELD];
  int n = 0;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  while (atomic_load(&sh->done) < total) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    bool grow = n == 0 || (n < RACE_HELD && (x % 100) < 55);
    if (grow) {
      uint64_t sz = (1 + (x >> 8) % 64) * MiB;
      int rc = gmr__scap_reserve(h, sz);
      if (rc == 0) {
        mine[n++] = sz;
        atomic_fetch_add(&sh->held[w], (int64_t)sz);
        int64_t a = atomic_fetch_add(&sh->audit, (int64_t)sz) + (int64_t)sz;
        if (a > (int64_t)cap) atomic_fetch_add(&sh->violations, 1);
        int64_t m = atomic_load(&sh->audit_max);
        while (a > m && !atomic_compare_exchange_weak(&sh->audit_max, &m, a)) {
        }
        if (atomic_load(&sh->held[w]) > (int64_t)quota) atomic_fetch_add(&sh->quota_violations, 1);
      } else if (rc == GMR_ENOMEM) {
        atomic_fetch_add(&sh->refused, 1);
      } else {
        atomic_fetch_add(&sh->errors, 1);
      }
    } else {
      int i = (int)((x >> 16) % (uint64_t)n);
      uint64_t sz = mine[i];
      mine[i] = mine[--n];
      atomic_fetch_sub(&sh->audit, (int64_t)sz);
      atomic_fetch_sub(&sh->held[w], (int64_t)sz);
      gmr__scap_release(h, sz);
    }
    if ((x & 7) == 0) { /* a view sweeps (a lock probe per slot): not every time */
      gmr_scap_view_t v;
      gmr__scap_view(h, &v);
      if (v.committed > cap) atomic_fetch_add(&sh->cap_violations, 1);
    }
    atomic_fetch_add(&sh->done, 1);
  }
  /* Off the audit before the file lets go of it; then half detach, half just
   * exit holding their bytes (the kernel's lock release gives them back). */
  atomic_fetch_sub(&sh->audit, atomic_exchange(&sh->held[w], 0));
  if (seed & 1) gmr__scap_detach(h);
  _exit(0);
}

static void test_race(void) {
  char p[300];
  path_of("race", p, sizeof p);
  long ops = env_long("GMR_SCAP_OPS", 5000);
  long kills = env_long("GMR_SCAP_RACE_KILLS", 8);
  long total = ops * RACE_PROCS;
  uint64_t cap = 4 * GiB, quota = 3 * GiB;
  race_shared_t *sh =
      mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(sh, 0, sizeof *sh);
  pid_t pids[RACE_PROCS];
  unsigned seed = 1;
  double t0 = now_s();
  for (int w = 0; w < RACE_PROCS; ++w) {
    pids[w] = fork();
    if (pids[w] == 0) race_worker(p, sh, w, total, cap, quota, seed + (unsigned)w);
  }
  seed += RACE_PROCS;
  long killed = 0;
  uint64_t x = 88172645463325252ull;
  for (long k = 1; k <= kills; ++k) {
    /* Kill at evenly spread points of progress, a random worker each time. */
    while (atomic_load(&sh->done) < total * k / (kills + 1))
      usleep(200);
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int w = (int)(x % RACE_PROCS);
    /* Stop it, take its bytes off the audit, then kill it: the audit never
     * counts bytes the file no longer does (its slot may be swept as soon as
     * it is dead), only, for a moment, fewer. */
    int st;
    kill(pids[w], SIGSTOP);
    waitpid(pids[w], &st, WUNTRACED);
    atomic_fetch_sub(&sh->audit, atomic_exchange(&sh->held[w], 0));
    kill(pids[w], SIGKILL);
    reap(pids[w]);
    ++killed;
    pids[w] = fork();
    if (pids[w] == 0) race_worker(p, sh, w, total, cap, quota, seed);
    ++seed;
  }
  for (int w = 0; w < RACE_PROCS; ++w)
    reap(pids[w]);
  double dt = now_s() - t0;
  diag("%d processes x %ld operations, %ld SIGKILLs and respawns: %.2f s, %lld refused, audit "
       "max %.2f GiB of a %.0f GiB cap",
       RACE_PROCS, ops, killed, dt, (long long)atomic_load(&sh->refused),
       (double)atomic_load(&sh->audit_max) / (double)GiB, (double)cap / (double)GiB);
  is_int(atomic_load(&sh->errors), 0, "no errors");
  is_int(atomic_load(&sh->violations), 0, "the audit counter never passed the cap");
  is_int(atomic_load(&sh->cap_violations), 0, "the file's committed never passed the cap");
  is_int(atomic_load(&sh->quota_violations), 0, "no process passed its quota");
  ok(atomic_load(&sh->refused) > 0 && atomic_load(&sh->audit_max) > (int64_t)(cap / 2),
     "the cap was reached and refused (the test pressed on it)");
  gmr_scap_t *h = attach(p, cap, 0, 0, "after");
  gmr_scap_view_t v;
  if (h) gmr__scap_view(h, &v);
  ok(h && v.committed == 0, "after the last exited: nothing committed");
  gmr_shared_cap_info_t info;
  read_info(p, &info);
  ok(info.held == 0 && info.live == 1, "nothing held, only the new slot live");
  diag("the file's counters: %llu sweeps, %llu repairs after a death inside the lock, %llu "
       "timeouts",
       (unsigned long long)info.sweeps, (unsigned long long)info.repairs,
       (unsigned long long)info.timeouts);
  gmr__scap_detach(h);
  munmap(sh, sizeof *sh);
}

/* ---- fork without exec ---------------------------------------------------------------- */

static void test_fork(void) {
  char p[300];
  path_of("fork", p, sizeof p);
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return;
  pid_t parent = fork();
  if (parent == 0) {
    gmr_scap_t *h = attach(p, GiB, 0, 0, "parent");
    if (!h || gmr__scap_reserve(h, 100 * MiB) != 0) _exit(1);
    pid_t child = fork();
    if (child == 0) {
      /* The grandchild: wait until told, then reserve through the inherited handle. */
      close(up[0]);
      signal_fd(up[1]);
      if (wait_fd(down[0]) != 0) _exit(1);
      int rc = gmr__scap_reserve(h, 10 * MiB);
      gmr_scap_debug_t d;
      gmr__scap_debug(h, &d);
      char c = rc == 0 && d.slot >= 0 ? 1 : 2;
      ssize_t wr = write(up[1], &c, 1);
      (void)wr;
      wait_fd(down[0]);
      _exit(0);
    }
    for (;;)
      pause();
  }
  close(up[1]);
  ok(wait_fd(up[0]) == 0, "a process with a slot forked a child (no exec)");
  kill(parent, SIGKILL);
  reap(parent);
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[4];
  size_t n = 0;
  gmr_shared_cap_read(p, &info, s, 4, &n);
  ok(n == 1 && s[0].pid == parent && s[0].alive == 0,
     "the parent is killed: its slot is dead though the child lives with its descriptors");
  signal_fd(down[1]);
  char c = 0;
  ok(read(up[0], &c, 1) == 1 && c == 1, "the child reserves through the inherited handle");
  gmr_shared_cap_read(p, &info, s, 4, &n);
  int child_slot = 0;
  for (size_t i = 0; i < n; ++i)
    child_slot += s[i].pid != parent && s[i].alive && s[i].held == 10 * MiB;
  ok(child_slot == 1, "in a slot of its own, holding 10 MiB");
  ok(info.committed == 10 * MiB && info.live == 1,
     "the parent's 100 MiB were swept at that reservation");
  signal_fd(down[1]);
  close(down[1]);
  close(up[0]), close(down[0]);
}

/* ---- a stopped lock holder -------------------------------------------------------------- */

static void test_stopped(void) {
  char p[300];
  path_of("stopped", p, sizeof p);
  gmr_scap_opts_t o = opts(p, GiB, 0, 0, "waiter");
  o.timeout_s = 0.2;
  gmr_scap_t *me = NULL;
  if (gmr__scap_attach(&o, &me) != 0) return;
  is_int(gmr__scap_reserve(me, 100 * MiB), 0, "100 MiB reserved");
  int fds[2];
  if (pipe(fds)) return;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    gmr_scap_t *h = attach(p, GiB, 0, 0, "sleeper");
    if (!h || gmr__scap_debug_hold(h, 0) != 0) _exit(1);
    signal_fd(fds[1]);
    raise(SIGSTOP);
    gmr__scap_debug_unhold(h);
    _exit(0);
  }
  close(fds[1]);
  ok(wait_fd(fds[0]) == 0, "a child holds the lock");
  int st;
  waitpid(pid, &st, WUNTRACED);
  ok(WIFSTOPPED(st), "and is stopped");
  double t0 = now_s();
  int rc = gmr__scap_reserve(me, MiB);
  double dt = now_s() - t0;
  is_int(rc, GMR_EBUSY, "a reservation gives up with GMR_EBUSY");
  ok(dt >= 0.19 && dt < 10.0, "after the 0.2 s timeout (%.3f s; < 10: it does not hang)", dt);
  char pidtext[32];
  snprintf(pidtext, sizeof pidtext, "held by process %d", (int)pid);
  like(gmr__error_last(), pidtext, "the error names the holder");
  like(gmr__error_last(), "waited 0.2 s", "and the wait");
  gmr__scap_release(me, 100 * MiB); /* cannot get the lock: owed */
  gmr_scap_view_t v;
  gmr__scap_view(me, &v);
  is_u64(v.used, 100 * MiB, "a release meanwhile is owed, not lost");
  kill(pid, SIGCONT);
  reap(pid);
  is_int(gmr__scap_reserve(me, 5 * MiB), 0, "SIGCONT: the holder let go, reservations work");
  gmr__scap_view(me, &v);
  ok(v.used == 5 * MiB && v.committed == 5 * MiB, "and the owed release was applied");
  gmr__scap_detach(me);
  close(fds[0]);
}

/* ---- an unlinked file --------------------------------------------------------------------- */

static char log_text[4096];
static void log_to_buf(gmr_log_level_t level, const char *msg, void *ud) {
  (void)level, (void)ud;
  size_t len = strlen(log_text);
  snprintf(log_text + len, sizeof log_text - len, "%s\n", msg);
}

static void test_unlinked(void) {
  char p[300];
  path_of("unlinked", p, sizeof p);
  gmr_scap_t *a = attach(p, GiB, 0, 0, "old");
  if (!a) return;
  is_int(gmr__scap_reserve(a, 300 * MiB), 0, "a holds 300 MiB");
  ok(unlink(p) == 0, "the file is unlinked");
  gmr_scap_t *b = attach(p, GiB, 0, 0, "new");
  gmr_scap_debug_t d;
  if (b) gmr__scap_debug(b, &d);
  ok(b && d.created, "a newcomer makes a new file: the domain is split");
  gmr_scap_view_t v;
  gmr__scap_view(b, &v);
  is_u64(v.committed, 0, "the newcomer does not see a's 300 MiB");
  log_text[0] = '\0';
  gmr_set_log(log_to_buf, NULL);
  is_int(gmr__scap_check_link(a), 0, "a looks at its file's link count");
  gmr_set_log(NULL, NULL);
  like(log_text, "domain split", "and logs the split");
  gmr__scap_view(b, &v);
  is_u64(v.committed, 300 * MiB, "a moved its 300 MiB to the new file");
  is_int(gmr__scap_reserve(b, 800 * MiB), GMR_ENOMEM, "so the cap holds for both again");
  is_int(gmr__scap_reserve(b, 724 * MiB), 0, "up to the cap");
  /* Later checks on the reservation path find the new file linked. */
  usleep(60000);
  is_int(gmr__scap_reserve(a, MiB), GMR_ENOMEM,
         "a's next reservation is refused by the shared cap");
  gmr__scap_release(a, 300 * MiB);
  gmr__scap_view(b, &v);
  is_u64(v.committed, 724 * MiB, "a's release lands in the new file");
  gmr__scap_detach(a);
  gmr__scap_detach(b);
}

/* ---- a holder in another PID namespace ------------------------------------------------ */

static void test_pid_namespace(void) {
  char p[300];
  path_of("pidns", p, sizeof p);
  int pids[2], oks[2]; /* the inner pid from the outer child; the inner's result */
  if (pipe(pids) || pipe(oks)) return;
  pid_t outer = fork();
  if (outer == 0) {
    close(pids[0]), close(oks[0]);
    if (unshare(CLONE_NEWPID) != 0) {
      pid_t none = -1;
      ssize_t w = write(pids[1], &none, sizeof none);
      (void)w;
      _exit(0);
    }
    pid_t inner = fork(); /* pid 1 of the new namespace */
    if (inner == 0) {
      gmr_scap_t *h = attach(p, 10 * GiB, 0, 0, "namespaced");
      char ok1 = h && getpid() == 1 && gmr__scap_reserve(h, 9 * GiB) == 0;
      ssize_t w = write(oks[1], &ok1, 1);
      (void)w;
      for (;;)
        pause();
    }
    ssize_t w = write(pids[1], &inner, sizeof inner); /* its pid out here */
    (void)w;
    reap(inner);
    _exit(0);
  }
  close(pids[1]), close(oks[1]);
  pid_t inner = -1;
  if (read(pids[0], &inner, sizeof inner) != sizeof inner || inner <= 1) {
    skip("unshare(CLONE_NEWPID) is not allowed here");
    reap(outer);
    close(pids[0]), close(oks[0]);
    return;
  }
  char ok1 = 0;
  ok(read(oks[0], &ok1, 1) == 1 && ok1 == 1, "pid 1 of a new PID namespace holds 9 GiB");
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[4];
  size_t n = 0;
  gmr_shared_cap_read(p, &info, s, 4, &n);
  ok(n == 1 && s[0].pid == 1 && s[0].alive == 1, "its slot says pid 1, alive");
  kill(inner, SIGKILL);
  reap(outer);
  gmr_shared_cap_read(p, &info, s, 4, &n);
  ok(n == 1 && s[0].alive == 0, "SIGKILLed from outside: dead, though pid 1 exists here too");
  gmr_scap_t *me = attach(p, 10 * GiB, 0, 0, "outside");
  ok(me && gmr__scap_reserve(me, 9 * GiB) == 0, "its 9 GiB come back");
  gmr__scap_detach(me);
  close(pids[0]), close(oks[0]);
}

/* ---- files not to be trusted ------------------------------------------------------------ */

/* An attach to p that must be refused with a message containing `want`. */
static void refused(const char *p, bool group, const char *want, const char *what) {
  gmr_scap_opts_t o = opts(p, GiB, 0, 0, "victim");
  o.group = group;
  gmr_scap_t *h = NULL;
  double t0 = now_s();
  int rc = gmr__scap_attach(&o, &h);
  ok(rc == GMR_ECONFIG && h == NULL && now_s() - t0 < 5, "%s: refused (%d)", what, rc);
  like(gmr__error_last(), want, "  the message says why");
  if (h) gmr__scap_detach(h);
}

static void test_untrusted(void) {
  char p[640], q[300], sub[300], text[64];
  /* Writable by every user: another user could have planted it. */
  path_of("untrusted-0666", p, sizeof p);
  gmr_scap_t *a = attach(p, GiB, 0, 0, "maker");
  gmr__scap_detach(a);
  struct stat st;
  int src = stat(p, &st);
  ok(src == 0 && (st.st_mode & 077) == 0, "a new file is made 0600 (0%o)",
     (unsigned)(st.st_mode & 0777));
  ok(chmod(p, 0666) == 0, "chmod 0666");
  snprintf(text, sizeof text, "owned by uid %u", (unsigned)geteuid());
  refused(p, false, "mode 0666: every user may write it", "a file every user may write");
  like(gmr__error_last(), text, "  and names the owner");
  refused(p, true, "every user may write it", "  even with shared_by: group");
  /* Group-writable. */
  ok(chmod(p, 0660) == 0, "chmod 0660");
  refused(p, false, "its group may write it", "a group-writable file");
  gmr_scap_opts_t o = opts(p, GiB, 0, 0, "grouped");
  o.group = true;
  gmr_scap_t *h = NULL;
  is_int(gmr__scap_attach(&o, &h), 0, "with shared_by: group and our group, it is used");
  gmr__scap_detach(h);
  ok(chmod(p, 0640) == 0, "chmod 0640");
  h = attach(p, GiB, 0, 0, "readable");
  ok(h != NULL, "readable by the group but not writable: used");
  gmr__scap_detach(h);
  /* A symbolic link planted at the path: never followed, its target untouched. */
  path_of("untrusted-target", q, sizeof q);
  path_of("untrusted-link", p, sizeof p);
  int fd = open(q, O_RDWR | O_CREAT | O_TRUNC, 0600);
  close(fd);
  ok(symlink(q, p) == 0, "a symbolic link at the path");
  refused(p, false, "refusing a symbolic link", "a symbolic link");
  ok(stat(q, &st) == 0 && st.st_size == 0, "  its target is not written");
  unlink(q);
  refused(p, false, "refusing a symbolic link", "a dangling symbolic link (would create)");
  ok(access(q, F_OK) != 0, "  its target is not created");
  /* A FIFO: no hang in open. */
  path_of("untrusted-fifo", p, sizeof p);
  ok(mkfifo(p, 0600) == 0, "a FIFO at the path");
  refused(p, false, "refusing a FIFO", "a FIFO (at once, no hang)");
  /* A hard link to another file of this user. */
  path_of("untrusted-hard", p, sizeof p);
  path_of("untrusted-other", q, sizeof q);
  fd = open(q, O_RDWR | O_CREAT | O_TRUNC, 0600);
  close(fd);
  ok(link(q, p) == 0, "a hard link at the path");
  refused(p, false, "more than one name", "a file with two names");
  ok(stat(q, &st) == 0 && st.st_size == 0, "  the other file is not written");
  /* A folder every user may write, not sticky. */
  path_of("untrusted-dir", sub, sizeof sub);
  mkdir(sub, 0700);
  snprintf(p, sizeof p, "%s/cap", sub);
  ok(chmod(sub, 0777) == 0, "a folder of mode 0777");
  refused(p, false, "writable by every user and not sticky", "a file in it");
  ok(access(p, F_OK) != 0, "  not created");
  ok(chmod(sub, 01777) == 0, "made sticky (like /dev/shm)");
  h = attach(p, GiB, 0, 0, "sticky");
  ok(h != NULL, "a file in a sticky folder is used");
  gmr__scap_detach(h);
  if (geteuid() == 0) {
    /* Another user's file (root can make one). */
    ok(chown(p, 65534, 65534) == 0, "the file now belongs to uid 65534");
    refused(p, false, "owned by uid 65534", "another user's file");
    like(gmr__error_last(), "it belongs to another user", "  ...");
    refused(p, true, "not to one of this process's groups", "  and with shared_by: group");
    /* A symbolic link to a folder, owned by another user. */
    path_of("untrusted-dirlink", q, sizeof q);
    ok(symlink(sub, q) == 0 && lchown(q, 65534, 65534) == 0,
       "a symbolic link to a folder, owned by uid 65534");
    snprintf(p, sizeof p, "%s/cap2", q);
    refused(p, false, "is a symbolic link owned by uid 65534", "a file through it");
  } else {
    skip("another user's file and link: needs root");
  }
}

/* ---- a hostile writer of the file --------------------------------------------------------- */

/* The file's layout, as a writer sees it (lib/core/shared-cap.c). */
#define F_VERSION 8
#define F_CAP     32
#define F_DYNAMIC 136 /* after the device id: the lock's old place, the totals */
#define F_SLOT(i) (4096 + 128 * (i))
#define F_STATE   0
#define F_USED    24
#define F_SIZE    (4096 + 256 * 128)

typedef struct corrupt_res_s {
  int step;         /* steps done (a crash or hang shows where) */
  int rc[8];        /* return codes */
  uint64_t v[8];    /* figures */
  uint64_t corrupt; /* the file's corruption counter */
} corrupt_res_t;

static void poke(const char *p, off_t at, const void *bytes, size_t n) {
  int fd = open(p, O_WRONLY);
  if (fd < 0 || pwrite(fd, bytes, n, at) != (ssize_t)n)
    diag("poke %s at %lld failed", p, (long long)at);
  close(fd);
}

static void poke64(const char *p, off_t at, uint64_t v) {
  poke(p, at, &v, sizeof v);
}

/* Run body(p, res) in a child with a 20 s alarm; its exit status. */
static int isolated(void (*body)(const char *, corrupt_res_t *), const char *p,
                    corrupt_res_t *res) {
  memset(res, 0, sizeof *res);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    body(p, res);
    _exit(0);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

static void report(int st, const corrupt_res_t *r, const char *what) {
  ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: no crash, no hang (%s %d, after step %d)", what,
     WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
     r->step);
}

/* Garbage over everything after the device id: the lock's old place, the totals. */
static void body_header(const char *p, corrupt_res_t *r) {
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a"), *b = attach(p, GiB, 0, 0, "b");
  if (!a || !b) return;
  r->rc[0] = gmr__scap_reserve(a, 100 * MiB) | gmr__scap_reserve(b, 50 * MiB);
  r->step = 1;
  unsigned char junk[4096 - F_DYNAMIC];
  memset(junk, 0xa5, sizeof junk);
  poke(p, F_DYNAMIC, junk, sizeof junk);
  r->step = 2;
  r->rc[1] = gmr__scap_reserve(a, 10 * MiB);
  r->step = 3;
  gmr__scap_release(b, 50 * MiB);
  r->step = 4;
  gmr_scap_view_t v;
  gmr__scap_view(a, &v);
  r->v[0] = v.committed;
  gmr_scap_debug_t d;
  gmr__scap_debug(a, &d);
  r->corrupt = d.corrupt;
  r->v[1] = d.held;
  r->step = 5;
}

/* The cap and version rewritten: this process's configured cap holds. */
static void body_cap(const char *p, corrupt_res_t *r) {
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a");
  if (!a) return;
  poke64(p, F_CAP, (uint64_t)1 << 60);
  uint32_t v9 = 9;
  poke(p, F_VERSION, &v9, sizeof v9);
  r->step = 1;
  r->rc[0] = gmr__scap_reserve(a, 2 * GiB);
  r->rc[1] = gmr__scap_reserve(a, GiB);
  r->step = 2;
  gmr_shared_cap_info_t info;
  size_t n;
  r->rc[2] = gmr_shared_cap_read(p, &info, NULL, 0, &n);
  r->v[0] = info.cap;
  gmr_scap_debug_t d;
  gmr__scap_debug(a, &d);
  r->corrupt = d.corrupt;
  r->step = 3;
}

/* Every slot in an unknown state, the members' too. */
static void body_states(const char *p, corrupt_res_t *r) {
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a"), *b = attach(p, GiB, 0, 0, "b");
  if (!a || !b) return;
  r->rc[0] = gmr__scap_reserve(a, 100 * MiB) | gmr__scap_reserve(b, 50 * MiB);
  for (int i = 0; i < 256; ++i) {
    uint32_t junk = 0xdeadbeefu + (uint32_t)i;
    poke(p, F_SLOT(i) + F_STATE, &junk, sizeof junk);
  }
  r->step = 1;
  gmr_scap_t *c = attach(p, GiB, 0, 0, "c");
  r->rc[1] = c ? 0 : -1;
  r->step = 2;
  r->rc[2] = gmr__scap_reserve(a, MiB) | gmr__scap_reserve(b, MiB);
  gmr_scap_view_t v;
  gmr__scap_view(a, &v);
  r->v[0] = v.committed; /* a 101 + b 51 */
  gmr_scap_debug_t d;
  gmr__scap_debug(a, &d);
  r->corrupt = d.corrupt;
  r->step = 3;
}

/* A slot whose bytes make the sums overflow. */
static void body_overflow(const char *p, corrupt_res_t *r) {
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a"), *b = attach(p, GiB, 0, 0, "b");
  if (!a || !b) return;
  r->rc[0] = gmr__scap_reserve(a, 100 * MiB) | gmr__scap_reserve(b, 50 * MiB);
  gmr_scap_debug_t d;
  gmr__scap_debug(b, &d);
  poke64(p, F_SLOT(d.slot) + F_USED, UINT64_MAX - 50 * MiB + 1); /* + a's 100 MiB wraps to 50 */
  r->step = 1;
  r->rc[1] = gmr__scap_reserve(a, 800 * MiB); /* 100 + 800 + b's 50 fits; the wrap would too */
  r->rc[2] = gmr__scap_reserve(b, MiB);       /* b rewrites its slot */
  r->rc[3] = gmr__scap_reserve(a, 100 * MiB); /* 900 + 51 + 100 > 1024: refused */
  gmr_scap_view_t v;
  gmr__scap_view(a, &v);
  r->v[0] = v.committed; /* a 900 + b 51 */
  gmr__scap_debug(a, &d);
  r->corrupt = d.corrupt;
  r->step = 2;
}

/* The file cut to nothing while mapped (SIGBUS unless the size is checked). */
static void body_truncated(const char *p, corrupt_res_t *r) {
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a"), *b = attach(p, GiB, 0, 0, "b");
  if (!a || !b) return;
  r->rc[0] = gmr__scap_reserve(a, 100 * MiB) | gmr__scap_reserve(b, 50 * MiB);
  r->step = 1;
  if (truncate(p, 0) != 0) return;
  r->step = 2;
  r->rc[1] = gmr__scap_reserve(a, MiB);
  r->step = 3;
  r->rc[2] = gmr__scap_reserve(b, MiB);
  gmr_scap_view_t v;
  gmr__scap_view(a, &v);
  r->v[0] = v.committed; /* a 101 + b 51 */
  struct stat st;
  r->v[1] = stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
  gmr_scap_debug_t d;
  gmr__scap_debug(a, &d);
  r->corrupt = d.corrupt;
  r->step = 4;
}

static void test_corrupt(void) {
  corrupt_res_t *r =
      mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char p[300];
  char log_path[320];
  path_of("corrupt-log", log_path, sizeof log_path);

  path_of("corrupt-header", p, sizeof p);
  int st = isolated(body_header, p, r);
  report(st, r, "garbage over the header's lock and totals");
  ok(r->step == 5 && r->rc[0] == 0 && r->rc[1] == 0, "  the next reservation works");
  is_u64(r->v[0], 110 * MiB, "  committed rebuilt from the live members: a's 110 MiB");
  is_u64(r->v[1], 110 * MiB, "  held too");
  ok(r->corrupt >= 1, "  the corruption is counted (%llu)", (unsigned long long)r->corrupt);

  path_of("corrupt-cap", p, sizeof p);
  st = isolated(body_cap, p, r);
  report(st, r, "the file's cap and version rewritten");
  is_int(r->rc[0], GMR_ENOMEM, "  2 GiB is still refused: the cap is this process's 1 GiB");
  is_int(r->rc[1], 0, "  1 GiB fits");
  ok(r->rc[2] == 0 && r->v[0] == GiB, "  the header was rebuilt (cap %llu)",
     (unsigned long long)r->v[0]);

  path_of("corrupt-states", p, sizeof p);
  st = isolated(body_states, p, r);
  report(st, r, "every slot in an unknown state");
  is_int(r->rc[1], 0, "  they are swept: a newcomer finds a slot");
  is_int(r->rc[2], 0, "  the members go on");
  is_u64(r->v[0], 152 * MiB, "  and rewrite their slots: committed = 101 + 51 MiB");
  ok(r->corrupt >= 1, "  the corruption is counted");

  path_of("corrupt-overflow", p, sizeof p);
  st = isolated(body_overflow, p, r);
  report(st, r, "a slot whose bytes overflow the sums");
  is_int(r->rc[2], 0, "  its owner goes on");
  is_int(r->rc[3], GMR_ENOMEM, "  the cap holds once it rewrote its slot");
  is_u64(r->v[0], 951 * MiB, "  committed exact: max of the real shares (a %s, b 51 MiB)",
         r->rc[1] == 0 ? "900" : "100");

  path_of("corrupt-truncated", p, sizeof p);
  st = isolated(body_truncated, p, r);
  report(st, r, "the file cut to 0 bytes while mapped");
  ok(r->rc[1] == 0 && r->rc[2] == 0, "  both members go on");
  is_u64(r->v[1], F_SIZE, "  the file is sized back");
  is_u64(r->v[0], 152 * MiB, "  and rebuilt from the live members: 101 + 51 MiB");
  ok(r->corrupt >= 1, "  the corruption is counted");

  /* A file of the old format (a mutex in the file) is refused clearly. */
  path_of("corrupt-v1", p, sizeof p);
  gmr_scap_t *a = attach(p, GiB, 0, 0, "a");
  gmr__scap_detach(a);
  uint32_t v1 = 1;
  poke(p, F_VERSION, &v1, sizeof v1);
  gmr_scap_opts_t o = opts(p, GiB, 0, 0, "v2");
  is_int(gmr__scap_attach(&o, &a), GMR_ECONFIG, "a file of version 1 is refused");
  like(gmr__error_last(), "version 1 keeps a pthread mutex in the file", "  saying why");
  munmap(r, sizeof *r);
}

/* ---- threads ------------------------------------------------------------------------------ */

static gmr_scap_t *thread_h;
static _Atomic int thread_bad;

static void *thread_body(void *arg) {
  uint64_t sz = (uint64_t)(uintptr_t)arg * MiB;
  for (int i = 0; i < 2000; ++i) {
    int rc = gmr__scap_reserve(thread_h, sz);
    if (rc == 0)
      gmr__scap_release(thread_h, sz);
    else if (rc != GMR_ENOMEM)
      atomic_fetch_add(&thread_bad, 1);
  }
  return NULL;
}

static void test_threads(void) {
  char p[300];
  path_of("threads", p, sizeof p);
  thread_h = attach(p, 8 * MiB, 0, 0, "threads");
  if (!thread_h) return;
  pthread_t t[4];
  for (int i = 0; i < 4; ++i)
    pthread_create(&t[i], NULL, thread_body, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < 4; ++i)
    pthread_join(t[i], NULL);
  gmr_scap_view_t v;
  gmr__scap_view(thread_h, &v);
  ok(thread_bad == 0 && v.used == 0 && v.committed == 0,
     "4 threads on one handle: no errors, nothing left");
  gmr__scap_detach(thread_h);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s", "/tmp/gmr-scap-XXXXXX");
  const char *t = getenv("TMPDIR");
  if (t && *t) snprintf(dir, sizeof dir, "%s/gmr-scap-XXXXXX", t);
  if (mkdtemp(dir) == NULL) skip_all("cannot make a temporary folder");
  signal(SIGPIPE, SIG_IGN);
  test_basic();
  test_attach_race();
  test_dead_lock_holder();
  test_dead_quota_holder();
  test_race();
  test_fork();
  test_stopped();
  test_unlinked();
  test_pid_namespace();
  test_threads();
  test_untrusted();
  test_corrupt();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) diag("could not remove %s", dir);
  return done_testing();
}
