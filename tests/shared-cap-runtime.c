/* shared-cap-runtime.c: the shared cap seen through the public API: the
 * `limit.shared` configuration and its errors, policies that free their
 * cache and retry when the shared cap refuses (caching, BFC), allocations
 * served from a cache never reaching the shared file, stitch's pages
 * counted there, the statistics the
 * interposer reports from, gmr_shared_cap_read, and a refused mismatch at
 * runtime creation, and a lock timeout's message reaching the caller after
 * one wait.  Runtimes of one process stand for processes here: each
 * has its own slot in the file (tests/shared-cap.c uses real processes).
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sim-runtime.h"

#define MiB ((uint64_t)1 << 20)

static char dir[256];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static char file[300];

static gmr_runtime_t *rt_with(const char *policy, const char *quota, const char *cap,
                              const char *extra) {
  char yaml[1024];
  snprintf(yaml, sizeof yaml,
           "policy: %s\n"
           "limit: {bytes: %s, counts: reserved, shared: {cap: %s, path: '%s'%s}}\n",
           policy, quota, cap, file, extra ? extra : "");
  return sim_runtime(yaml, 1024 * MiB, 0);
}

static int64_t stat_of(gmr_runtime_t *rt, const char *key) {
  int64_t v = -1;
  if (gmr_stat_get(rt, key, &v) != 0) diag("no statistic %s", key);
  return v;
}

static uint64_t slot_ops(const char *label) {
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t s[8];
  size_t n = 0;
  if (gmr_shared_cap_read(file, &info, s, 8, &n) != 0) return UINT64_MAX;
  for (size_t i = 0; i < n; ++i)
    if (strcmp(s[i].label, label) == 0) return s[i].operations;
  return UINT64_MAX;
}

static void test_config_errors(void) {
  static const struct {
    const char *yaml, *want;
  } cases[] = {
      {"policy: caching\nlimit: {bytes: 1GiB, shared: {cap: 2GiB}}\n",
       "<string>:2:8: invalid options for policy 'limit': 'shared' caps device memory across "
       "processes: it needs 'counts: reserved'"},
      {"policy: caching\nlimit:\n  bytes: 1GiB\n  counts: reserved\n  shared: {capp: 2GiB}\n",
       "<string>:5:12: unknown key 'capp' in 'shared'; expected one of: cap, guaranteed, label, "
       "path, timeout"},
      {"policy: caching\nlimit: {bytes: 1GiB, counts: reserved, shared: 2GiB}\n",
       "<string>:2:48: 'shared' is a mapping of options, not a scalar"},
      {"policy: caching\nlimit: {bytes: 1GiB, counts: reserved, shared: {label: x}}\n",
       "'shared' needs 'cap'"},
      {"policy: caching\nlimit: {bytes: 1GiB, counts: reserved, shared: {cap: 4GiB, guaranteed: "
       "2GiB}}\n",
       "'shared.guaranteed' is more than this process's quota 'bytes'"},
      {"policy: caching\nlimit: {bytes: 1GiB, counts: reserved, shared: {cap: 4GiB, timeout: 0}}\n",
       "<string>:2:69: '0' is too small for 'timeout'"},
      {"policy: caching\nlimit: {bytes: 1GiB, counts: reserved, shared: {cap: lots}}\n",
       "<string>:2:54: 'lots' is not a size for 'cap'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    gmr_config_t *cfg = NULL;
    gmr_error_t err = {0};
    int rc = gmr_config_load_string(cases[i].yaml, &cfg, &err);
    is_int(rc, GMR_ECONFIG, "bad shared config %zu is refused", i + 1);
    like(err.message, cases[i].want, "  with file:line:column and why");
    gmr_config_free(cfg);
  }
  gmr_config_t *cfg = NULL;
  gmr_error_t err = {0};
  is_int(gmr_config_load_string("policy: caching\nlimit:\n  bytes: 1GiB\n  counts: reserved\n"
                                "  shared:\n    cap: 4GiB\n    guaranteed: 512MiB\n"
                                "    label: llama-serve\n    path: /tmp/x\n    timeout: 0.5\n",
                                &cfg, &err),
         0, "a full shared block parses");
  gmr_config_free(cfg);
}

/* The caching policy frees its cache and retries when the shared cap refuses. */
static void test_caching_retry(void) {
  gmr_runtime_t *a = rt_with("caching", "600MiB", "800MiB", ", label: A");
  gmr_runtime_t *b = rt_with("caching", "600MiB", "800MiB", ", label: B");
  ok(a && b, "two runtimes share an 800 MiB cap, each with a 600 MiB quota");
  if (!a || !b) return;
  void *pa, *pb, *pb2;
  is_int(gmr_alloc(a, 500 * MiB, NULL, &pa), 0, "A: 500 MiB");
  is_int(gmr_alloc(b, 200 * MiB, NULL, &pb), 0, "B: 200 MiB");
  is_int(gmr_free(b, pb), 0, "B frees it: 200 MiB stay in B's cache");
  gmr_stats_t st;
  gmr_stats(b, &st);
  uint64_t retries = st.alloc_retries;
  is_u64(st.reserved_bytes, 200 * MiB, "B reserved 200 MiB");
  is_int(gmr_alloc(b, 300 * MiB, NULL, &pb2), 0,
         "B: 300 MiB more passes the shared cap (500 + 200 + 300 > 800): B empties its cache "
         "and retries");
  gmr_stats(b, &st);
  ok(st.alloc_retries == retries + 1 && st.reserved_bytes == 300 * MiB,
     "one retry; B now reserves only the 300 MiB");
  is_int(stat_of(b, "limit_shared_cap_bytes"), (int64_t)(800 * MiB), "limit_shared_cap_bytes");
  is_int(stat_of(b, "limit_shared_committed_bytes"), (int64_t)(800 * MiB),
         "limit_shared_committed_bytes: 500 + 300");
  is_int(stat_of(b, "limit_shared_free_bytes"), 0, "limit_shared_free_bytes: nothing left");
  char *sum = summary_string(b);
  like(sum, "shared cap: 800.00 MiB committed of 800.00 MiB by all processes, 0 bytes left",
       "the summary has a line for the shared cap");
  free(sum);
  void *px;
  is_int(gmr_alloc(b, 100 * MiB, NULL, &px), GMR_ENOMEM, "B: 100 MiB more is an OOM");
  like(gmr_last_error(b), "CUDA out of memory. Tried to allocate 100.00 MiB", "in PyTorch's words");
  like(gmr_last_error(b), "of which 0 bytes is free", "with the shared cap's free memory");

  /* Cached allocations never reach the shared cap. */
  is_int(gmr_free(b, pb2), 0, "B frees its 300 MiB (cached)");
  uint64_t ops = slot_ops("B");
  int bad = 0;
  for (int i = 0; i < 1000; ++i) {
    void *p;
    bad += gmr_alloc(b, 300 * MiB, NULL, &p) != 0 || gmr_free(b, p) != 0;
  }
  ok(bad == 0 && slot_ops("B") == ops, "1000 cached alloc/free pairs: no operation in the file");

  /* The caps of the process hold too. */
  is_int(gmr_free(a, pa), 0, "A frees (cached)");
  is_int(gmr_empty_cache(a), 0, "A empties its cache: the shared cap has room again");
  is_int(gmr_alloc(a, 700 * MiB, NULL, &pa), GMR_ENOMEM, "A: 700 MiB is past A's 600 MiB quota");
  is_int(gmr_alloc(a, 500 * MiB, NULL, &pa), 0, "A: 500 MiB fits (300 cached by B + 500)");
  is_int(gmr_free(a, pa), 0, "A frees");
  gmr_runtime_free(a);
  gmr_runtime_free(b);
  gmr_shared_cap_info_t info;
  size_t n;
  is_int(gmr_shared_cap_read(file, &info, NULL, 0, &n), 0, "the file outlives the runtimes");
  ok(info.committed == 0 && info.live == 0, "which gave everything back");
}

/* BFC frees its free regions (garbage collection) and retries. */
static void test_bfc_retry(void) {
  gmr_runtime_t *a = rt_with("direct", "600MiB", "800MiB", ", label: A");
  gmr_runtime_t *c = rt_with("{name: bfc, allow_growth: true}", "600MiB", "800MiB", ", label: C");
  ok(a && c, "a direct runtime and a BFC (allow_growth) one share the cap");
  if (!a || !c) return;
  gmr_runtime_set_exclusive(c, 1); /* no other thread frees: no 10 s wait */
  void *pa, *pc;
  is_int(gmr_alloc(c, 256 * MiB, NULL, &pc), 0, "C: 256 MiB");
  is_int(gmr_free(c, pc), 0, "C frees: its regions stay");
  gmr_stats_t st;
  gmr_stats(c, &st);
  uint64_t held = st.reserved_bytes;
  ok(held >= 256 * MiB, "C keeps %llu MiB of regions", (unsigned long long)(held / MiB));
  uint64_t room = 800 * MiB - held - 200 * MiB;
  is_int(gmr_alloc(a, room, NULL, &pa), 0, "A takes all but 200 MiB of the rest of the cap");
  is_int(gmr_alloc(c, 300 * MiB, NULL, &pc), 0,
         "C: 300 MiB: refused by the shared cap, C gives its free regions back and retries");
  gmr_stats(c, &st);
  ok(st.reserved_bytes < held + 300 * MiB, "C reserves less than before plus 300 MiB");
  is_int(gmr_free(c, pc), 0, "C frees");
  is_int(gmr_free(a, pa), 0, "A frees");
  gmr_runtime_free(a);
  gmr_runtime_free(c);
}

/* The stitch policy: its pages count against the shared cap, it reuses
 * its own free pages without asking, and past the cap its OOM names it. */
static void test_stitch(void) {
  gmr_runtime_t *a = rt_with("direct", "600MiB", "800MiB", ", label: A");
  gmr_runtime_t *s = rt_with("stitch", "600MiB", "800MiB", ", label: S");
  ok(a && s, "a direct runtime and a stitch one share the cap");
  if (!a || !s) return;
  void *pa, *ps, *px;
  is_int(gmr_alloc(s, 300 * MiB, NULL, &ps), 0, "S: 300 MiB");
  is_int(gmr_free(s, ps), 0, "S frees: its pages stay in its pool");
  is_int(gmr_alloc(a, 510 * MiB, NULL, &pa), GMR_ENOMEM,
         "A cannot take S's pages (300 + 510 > 800)");
  is_int(gmr_alloc(a, 480 * MiB, NULL, &pa), 0, "A: 480 MiB fits");
  uint64_t ops = slot_ops("S");
  is_int(gmr_alloc(s, 300 * MiB, NULL, &ps), 0, "S: 300 MiB again, from its own pages");
  ok(slot_ops("S") == ops, "  without a reservation in the file");
  is_int(gmr_alloc(s, 30 * MiB, NULL, &px), GMR_ENOMEM, "S: 30 MiB more passes the cap");
  like(gmr_last_error(s), "stitch: out of memory allocating 30.00 MiB", "  stitch's message");
  like(gmr_last_error(s), "Shared cap of 800.00 MiB", "  naming the shared cap");
  is_int(gmr_check(s), 0, "  invariants hold");
  is_int(gmr_free(a, pa), 0, "A frees its 480 MiB");
  is_int(gmr_alloc(s, 30 * MiB, NULL, &px), 0, "S grows into them");
  gmr_free(s, px);
  gmr_free(s, ps);
  gmr_runtime_free(a);
  gmr_runtime_free(s);
}

static void test_mismatch(void) {
  gmr_runtime_t *a = rt_with("caching", "600MiB", "800MiB", NULL);
  char yaml[1024];
  snprintf(yaml, sizeof yaml,
           "policy: caching\nlimit: {bytes: 600MiB, counts: reserved, shared: {cap: 900MiB, path: "
           "'%s'}}\n",
           file);
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  gmr_runtime_t *b = NULL;
  gmr_sim_options_t o = {.capacity = 1024 * MiB};
  ok(gmr_config_load_string(yaml, &cfg, &err) == 0, "a configuration with a 900 MiB cap");
  is_int(gmr_runtime_new_sim(cfg, &o, &b), GMR_ECONFIG,
         "its runtime is refused while the file says 800 MiB");
  like(gmr_last_error(NULL), "holds a cap of 800.00 MiB", "with both caps in the error");
  gmr_config_free(cfg);
  gmr_runtime_free(b);
  gmr_runtime_free(a);
  /* Another simulated device (capacity) is another device id. */
  a = rt_with("caching", "600MiB", "800MiB", NULL);
  snprintf(yaml, sizeof yaml,
           "policy: caching\nlimit: {bytes: 600MiB, counts: reserved, shared: {cap: 800MiB, path: "
           "'%s'}}\n",
           file);
  ok(gmr_config_load_string(yaml, &cfg, &err) == 0, "the same cap");
  o.capacity = 2048 * MiB;
  is_int(gmr_runtime_new_sim(cfg, &o, &b), GMR_ECONFIG, "on another device: refused");
  like(gmr_last_error(NULL), "belongs to device sim0-1073741824", "naming the file's device");
  gmr_config_free(cfg);
  gmr_runtime_free(a);
}

/* A stalled lock holder: the caller reads the timeout, and waits once. */
static void test_lock_timeout(void) {
  gmr_runtime_t *a = rt_with("caching", "600MiB", "800MiB", ", label: A, timeout: 0.3");
  ok(a != NULL, "a caching runtime with a 0.3 s lock timeout");
  if (!a) return;
  void *p;
  is_int(gmr_alloc(a, 100 * MiB, NULL, &p), 0, "A: 100 MiB");
  is_int(gmr_free(a, p), 0, "freed into the cache");
  int fds[2];
  if (pipe(fds)) return;
  pid_t holder = fork();
  if (holder == 0) { /* another process takes the file's lock and stalls */
    int fd = open(file, O_RDWR);
    struct flock fl = {
        .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (1 << 30) - 2, .l_len = 1};
    char c = fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) == 0;
    ssize_t w = write(fds[1], &c, 1);
    (void)w;
    for (;;)
      pause();
  }
  char c = 0;
  ok(read(fds[0], &c, 1) == 1 && c == 1, "another process holds the file's lock");
  double t0 = now_s();
  int rc = gmr_alloc(a, 300 * MiB, NULL, &p); /* a new segment: a reservation */
  double took = now_s() - t0;
  is_int(rc, GMR_ENOMEM, "A: 300 MiB is an out-of-memory");
  like(gmr_last_error(a), "waited 0.3 s for the lock of", "  the caller reads the lock timeout");
  like(gmr_last_error(a), "held by process", "  and the holder");
  like(gmr_last_error(a), "CUDA out of memory", "  then the policy's words");
  ok(took >= 0.29 && took < 0.55, "  it waited once, not once more for the retry (%.3f s)", took);
  kill(holder, SIGKILL);
  waitpid(holder, NULL, 0);
  close(fds[0]), close(fds[1]);
  usleep(310000);
  is_int(gmr_alloc(a, 300 * MiB, NULL, &p), 0, "the holder is gone: A gets its 300 MiB");
  gmr_free(a, p);
  gmr_runtime_free(a);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/gmr-scap-rt-XXXXXX");
  const char *t = getenv("TMPDIR");
  if (t && *t) snprintf(dir, sizeof dir, "%s/gmr-scap-rt-XXXXXX", t);
  if (mkdtemp(dir) == NULL) skip_all("cannot make a temporary folder");
  snprintf(file, sizeof file, "%s/cap", dir);
  test_config_errors();
  test_caching_retry();
  unlink(file);
  test_bfc_retry();
  unlink(file);
  test_stitch();
  unlink(file);
  test_mismatch();
  unlink(file);
  test_lock_timeout();
  unlink(file);
  rmdir(dir);
  return done_testing();
}
