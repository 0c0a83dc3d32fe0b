/* soak.c: 16 threads x N operations on every policy stack, on the
 * host-backed simulator, with pattern checks; one more thread churns the
 * runtime meanwhile (empty_cache, stats, walks, the memory history turned on
 * and off, stream work held back and completed).
 *
 * Each worker owns SLOTS slots; an operation picks one at random: a free
 * slot is allocated (random size and stream) and its block filled with a tag
 * pattern, a full slot has its pattern verified and is freed.  Between them:
 * record_stream on another stream, gmr_alloc_size, gmr_stats, and a charge
 * and its refund.  Every block handed out must overlap no block live in any
 * thread (a table of live blocks under a lock), and must lie in device
 * memory the simulator holds, in the same reservation from its allocation
 * to its free (gmr__sim_covers: the simulator reuses host pages, so memory
 * given back stays readable); a block whose memory is lost or handed out
 * twice breaks its pattern.  At the end every stack must pass gmr_check and
 * hold no allocation.
 *
 * N = GMR_SOAK_OPS per thread (default 2000, so `make check` stays fast);
 * GMR_SOAK_SECONDS, when set, also ends each stack's run after that many
 * seconds (the report gives the operations made); GMR_SEED fixes the seed;
 * GMR_SOAK_STACKS picks stacks (see main).  The last stack shares a cap with
 * other processes through a file that a hostile writer keeps rewriting.  The history toggling makes
 * this the regression test of the history's publication under ThreadSanitizer (GMR_TSAN_TESTS). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/avl.h"
#include "gmr.h"
#include "runtime/runtime.h"
#include "sim-runtime.h"
#include "tap.h"

#define THREADS 16
#define SLOTS   24
#define STREAMS 4

static const char *const stacks[] = {
    "policy: direct\n",
    "policy: direct\nlimit: {bytes: 256MiB}\n",
    "policy: direct\nlimit: {bytes: 512MiB, counts: reserved}\n",
    "policy: caching\n",
    "policy: {name: caching, expandable_segments: true}\n",
    "policy: caching\nlimit: {bytes: 512MiB, counts: reserved}\n",
    "policy: {name: bfc, memory_limit: 512MiB}\n",
    "policy: {name: bfc, allow_growth: false, memory_limit: 512MiB}\n",
    "policy: {name: bfc, memory_limit: 512MiB}\nlimit: {bytes: 256MiB}\n",
    "policy: stitch\n",
    "policy: stitch\nlimit: {bytes: 512MiB, counts: reserved}\n",
    /* A shared cap whose file a hostile writer keeps rewriting (see hostile). */
    "policy: caching\nlimit: {bytes: 512MiB, counts: reserved, shared: {cap: 640MiB, path: '%s', "
    "timeout: 0.2}}\n",
    NULL,
};

/* The blocks live in every thread (key: address, val: size). */
static gmr_avl_t live;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

/* Add [p, p + n) unless it overlaps a live block: 0, or -1. */
static int live_add(void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&live_lock);
  gmr_avl_node_t *f = gmr__avl_floor(&live, a + n - 1);
  int rc = f != NULL && f->key + f->val > a ? -1 : gmr__avl_insert(&live, a, n, 0) == 0 ? 0 : -1;
  pthread_mutex_unlock(&live_lock);
  return rc;
}
static void live_remove(void *p) {
  pthread_mutex_lock(&live_lock);
  gmr__avl_erase(&live, (uintptr_t)p);
  pthread_mutex_unlock(&live_lock);
}

typedef struct worker_s {
  gmr_runtime_t *rt;
  gmr_sim_t *sim;
  uint64_t seed;
  uint64_t ops;
  int index;
  long corrupt;  /* pattern mismatches */
  long overlaps; /* blocks handed out over a live one */
  long outside;  /* blocks not in (the same) device memory */
  long errors;   /* unexpected return codes */
  long ooms;
  uint64_t done; /* operations made */
} worker_t;

static _Atomic int workers_running;
static _Atomic bool out_of_time; /* GMR_SOAK_SECONDS passed: workers stop */

static uint64_t next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Small blocks are filled whole; larger ones get a word at each end and one
 * every 4 KiB (a page each), so that large blocks stay cheap. */
static void put(unsigned char *p, size_t off, uint64_t v) {
  memcpy(p + off, &v, 8);
}
static uint64_t get(const unsigned char *p, size_t off) {
  uint64_t v;
  memcpy(&v, p + off, 8);
  return v;
}
static void fill(void *p, size_t n, uint64_t tag) {
  unsigned char *b = p;
  if (n < 4096) {
    for (size_t i = 0; i + 8 <= n; i += 8)
      put(b, i, tag ^ i);
    for (size_t i = n / 8 * 8; i < n; ++i)
      b[i] = (unsigned char)tag;
    return;
  }
  for (size_t i = 0; i + 16 <= n; i += 4096) /* clear of the last word */
    put(b, i, tag ^ i);
  put(b, n - 8, ~tag);
}
static int verify(const void *p, size_t n, uint64_t tag) {
  const unsigned char *b = p;
  if (n < 4096) {
    for (size_t i = 0; i + 8 <= n; i += 8)
      if (get(b, i) != (tag ^ i)) return 0;
    for (size_t i = n / 8 * 8; i < n; ++i)
      if (b[i] != (unsigned char)tag) return 0;
    return 1;
  }
  for (size_t i = 0; i + 16 <= n; i += 4096)
    if (get(b, i) != (tag ^ i)) return 0;
  return get(b, n - 8) == ~tag;
}

static size_t pick_size(uint64_t *s) {
  uint64_t r = next(s);
  if (r % 10 != 0) return 1 + (size_t)(next(s) % 65536); /* 90%: up to 64 KiB */
  return 65536 + (size_t)(next(s) % (2u << 20));         /* 10%: up to 2 MiB */
}

static void *work(void *arg) {
  worker_t *w = arg;
  void *ptr[SLOTS] = {0};
  size_t size[SLOTS] = {0};
  uint64_t tag[SLOTS] = {0}, token[SLOTS] = {0}, t;
  uint64_t s = w->seed;
  for (uint64_t op = 0; op < w->ops; ++op) {
    if ((op & 1023) == 0 && atomic_load_explicit(&out_of_time, memory_order_relaxed)) break;
    uint64_t r = next(&s) % 100;
    int k = (int)(next(&s) % SLOTS);
    if (r < 5 && ptr[k] != NULL) {
      if (gmr_record_stream(w->rt, ptr[k], GMR_SIM_STREAM(next(&s) % STREAMS)) != 0) ++w->errors;
    } else if (r < 7 && ptr[k] != NULL) {
      size_t req = 0, got = 0;
      if (gmr_alloc_size(w->rt, ptr[k], &req, &got) != 0 || req != size[k] || got < req)
        ++w->errors;
    } else if (r < 8) {
      gmr_stats_t st;
      if (gmr_stats(w->rt, &st) != 0) ++w->errors;
    } else if (r < 9) {
      int64_t n = (int64_t)(next(&s) % (1u << 20)) + 1;
      int rc = gmr_charge(w->rt, n);
      if (rc == 0 && gmr_charge(w->rt, -n) != 0) ++w->errors;
      if (rc == GMR_ENOMEM) ++w->ooms;
      if (rc != 0 && rc != GMR_ENOMEM) ++w->errors;
    } else if (ptr[k] != NULL) {
      if (!gmr__sim_covers(w->sim, ptr[k], size[k], &t) || t != token[k]) ++w->outside;
      if (!verify(ptr[k], size[k], tag[k])) ++w->corrupt;
      live_remove(ptr[k]);
      if (gmr_free(w->rt, ptr[k]) != 0) ++w->errors;
      ptr[k] = NULL;
    } else {
      size_t n = pick_size(&s);
      gmr_stream_t st = GMR_SIM_STREAM((w->index + next(&s) % 2) % STREAMS);
      int rc = gmr_alloc(w->rt, n, st, &ptr[k]);
      if (rc == 0) {
        size[k] = n;
        tag[k] = ((uint64_t)w->index << 56) ^ (op * 0x9E3779B97F4A7C15ull);
        if (!gmr__sim_covers(w->sim, ptr[k], n, &token[k])) ++w->outside;
        if (live_add(ptr[k], n) != 0) ++w->overlaps;
        fill(ptr[k], n, tag[k]);
      } else {
        ptr[k] = NULL;
        if (rc == GMR_ENOMEM)
          ++w->ooms;
        else
          ++w->errors;
      }
    }
    ++w->done;
  }
  for (int k = 0; k < SLOTS; ++k) {
    if (ptr[k] == NULL) continue;
    if (!gmr__sim_covers(w->sim, ptr[k], size[k], &t) || t != token[k]) ++w->outside;
    if (!verify(ptr[k], size[k], tag[k])) ++w->corrupt;
    live_remove(ptr[k]);
    if (gmr_free(w->rt, ptr[k]) != 0) ++w->errors;
  }
  atomic_fetch_sub(&workers_running, 1);
  return NULL;
}

static int count_entries(const gmr_walk_entry_t *e, void *ud) {
  (void)e;
  ++*(long *)ud;
  return 0;
}

typedef struct churn_s {
  gmr_runtime_t *rt;
  struct timespec deadline; /* tv_sec 0: none */
  long errors;
  long rounds;
} churn_t;

/* A writer of the shared-cap file beside its members: random bytes at random
 * offsets (header and slots alike), a busy mark forged, the file grown; and,
 * holding the file's lock as the trust model requires of a writer that cuts
 * it (Note [A file that shrinks]), the file cut short.  The members must
 * never crash or hang, and heal the file (Note [Validating the file]). */
typedef struct hostile_s {
  const char *path;
  uint64_t seed;
  long writes, cuts;
} hostile_t;

#define SCAP_FILE_BYTES (4096 + 256 * 128)

static void *hostile(void *arg) {
  hostile_t *h = arg;
  int fd = open(h->path, O_RDWR);
  if (fd < 0) return NULL;
  uint64_t s = h->seed;
  while (atomic_load(&workers_running) > 0) {
    uint64_t r = next(&s);
    if (r % 64 == 0) {
      struct flock fl = {
          .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (1 << 30) - 2, .l_len = 1};
      if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
        if (ftruncate(fd, (off_t)(next(&s) % SCAP_FILE_BYTES)) == 0) ++h->cuts;
        fl.l_type = F_UNLCK;
        fcntl(fd, F_OFD_SETLK, &fl);
      }
    } else if (r % 64 == 1) {
      if (ftruncate(fd, SCAP_FILE_BYTES + 4096) == 0) ++h->writes;
    } else {
      unsigned char junk[16];
      uint64_t v = next(&s);
      memcpy(junk, &v, 8);
      v = next(&s);
      memcpy(junk + 8, &v, 8);
      size_t n = 1 + (size_t)(next(&s) % 16);
      off_t at = (off_t)(next(&s) % 3 == 0 ? next(&s) % 256 : next(&s) % SCAP_FILE_BYTES);
      if (pwrite(fd, junk, n, at) == (ssize_t)n) ++h->writes;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  close(fd);
  return NULL;
}

static void *churn(void *arg) {
  churn_t *c = arg;
  while (atomic_load(&workers_running) > 0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (c->deadline.tv_sec != 0 &&
        (now.tv_sec > c->deadline.tv_sec ||
         (now.tv_sec == c->deadline.tv_sec && now.tv_nsec >= c->deadline.tv_nsec)))
      atomic_store_explicit(&out_of_time, true, memory_order_relaxed);
    long entries = 0;
    gmr_stats_t st;
    if (gmr_empty_cache(c->rt) != 0) ++c->errors;
    if (gmr_stats(c->rt, &st) != 0) ++c->errors;
    int rc = gmr_walk(c->rt, count_entries, &entries);
    if (rc != 0 && rc != GMR_ENOTSUP) ++c->errors;
    if (gmr_history_enable(c->rt, (c->rounds & 1) ? 0 : 4096) != 0) ++c->errors;
    /* Hold stream 3's work back for a round: frees recorded on it wait. */
    if (c->rounds % 3 == 0)
      gmr_sim_stream_enqueue(c->rt, GMR_SIM_STREAM(3));
    else
      gmr_sim_stream_complete(c->rt, GMR_SIM_STREAM(3));
    ++c->rounds;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  gmr_sim_stream_complete(c->rt, GMR_SIM_STREAM(3));
  gmr_history_enable(c->rt, 0);
  return NULL;
}

int main(void) {
  uint64_t ops = 2000;
  const char *env = getenv("GMR_SOAK_OPS");
  if (env && *env) ops = strtoull(env, NULL, 10);
  long seconds = 0;
  env = getenv("GMR_SOAK_SECONDS");
  if (env && *env) seconds = strtol(env, NULL, 10);
  uint64_t seed = (uint64_t)time(NULL);
  env = getenv("GMR_SEED");
  if (env && *env) seed = strtoull(env, NULL, 10);
  diag("seed %llu (GMR_SEED), %llu operations per thread (GMR_SOAK_OPS)", (unsigned long long)seed,
       (unsigned long long)ops);
  /* GMR_SOAK_STACKS=WORD runs the stacks whose configuration contains WORD,
   * !WORD the others, and a number N the Nth stack alone (from 1): a long
   * run split by stack, or one process per stack. */
  const char *only = getenv("GMR_SOAK_STACKS");
  bool invert = only != NULL && only[0] == '!';
  if (invert) ++only;
  int number = only != NULL && *only >= '1' && *only <= '9' ? atoi(only) : 0;
  for (int i = 0; stacks[i]; ++i) {
    if (number != 0 ? (i + 1 == number) == invert
                    : only != NULL && *only != '\0' && (strstr(stacks[i], only) != NULL) == invert)
      continue;
    char yaml[512], dir[64] = "";
    const char *stack = stacks[i];
    bool shared = strstr(stack, "%s") != NULL;
    if (shared) {
      snprintf(dir, sizeof dir, "/tmp/gmr-soak-XXXXXX");
      if (mkdtemp(dir) == NULL) continue;
      char file[96];
      snprintf(file, sizeof file, "%s/cap", dir);
      snprintf(yaml, sizeof yaml, stack, file);
      stack = yaml;
    }
    gmr_runtime_t *rt = sim_runtime(stack, 1ull << 30, 1);
    if (rt == NULL) {
      ok(0, "%s: a runtime", stack);
      continue;
    }
    const char *name = gmr_runtime_policy(rt);
    gmr_sim_t *sim = gmr__sim_of(gmr__runtime_device_backend(rt));
    is_int(gmr__sim_host_reuse(sim), 0, "%s: the simulator reuses host pages", stack);
    worker_t w[THREADS];
    pthread_t th[THREADS], ct;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    churn_t c = {.rt = rt, .deadline = {seconds > 0 ? t0.tv_sec + seconds : 0, t0.tv_nsec}};
    atomic_store(&workers_running, THREADS);
    atomic_store(&out_of_time, false);
    for (int t = 0; t < THREADS; ++t) {
      w[t] = (worker_t){.rt = rt,
                        .sim = sim,
                        .seed = seed * 1000003u + (uint64_t)(i * THREADS + t) + 1,
                        .ops = ops,
                        .index = t};
      pthread_create(&th[t], NULL, work, &w[t]);
    }
    pthread_create(&ct, NULL, churn, &c);
    char capfile[96];
    snprintf(capfile, sizeof capfile, "%s/cap", dir);
    hostile_t hw = {.path = capfile, .seed = seed ^ 0x5eedull};
    pthread_t ht;
    if (shared) pthread_create(&ht, NULL, hostile, &hw);
    long corrupt = 0, overlaps = 0, outside = 0, errors = 0, ooms = 0;
    uint64_t done = 0;
    for (int t = 0; t < THREADS; ++t) {
      pthread_join(th[t], NULL);
      corrupt += w[t].corrupt, errors += w[t].errors, ooms += w[t].ooms, done += w[t].done;
      overlaps += w[t].overlaps, outside += w[t].outside;
    }
    pthread_join(ct, NULL);
    if (shared) pthread_join(ht, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    gmr_empty_cache(rt);
    gmr_stats_t st;
    gmr_stats(rt, &st);
    char conf[512];
    snprintf(conf, sizeof conf, "%s", stack);
    for (char *p = conf; *p; ++p)
      if (*p == '\n') *p = ' ';
    diag("%s[ %s]: %llu operations in %.2f s, %ld OOMs, %ld churn rounds", name, conf,
         (unsigned long long)done, secs, ooms, c.rounds);
    is_int(corrupt, 0, "%s: no pattern broken in %llu operations", name, (unsigned long long)done);
    is_int(overlaps, 0, "  no block handed out over a live one");
    is_int(outside, 0, "  every block in the device memory it was given, until freed");
    is_int(errors + c.errors, 0, "  no unexpected error");
    is_int(gmr_check(rt), 0, "  invariants hold %s", gmr_last_error(rt));
    is_u64(st.allocations, 0, "  nothing left allocated");
    if (shared) {
      diag("  a hostile writer made %ld writes and %ld cuts of the shared-cap file", hw.writes,
           hw.cuts);
      int64_t committed = -1;
      gmr_stat_get(rt, "limit_shared_committed_bytes", &committed); /* a sweep */
      gmr_shared_cap_info_t info;
      size_t n = 0;
      int rc = gmr_shared_cap_read(capfile, &info, NULL, 0, &n);
      ok(committed == 0 && rc == 0 && info.committed == 0 && info.live == 1 &&
             info.cap == 640ull << 20,
         "  the file, healed: committed %lld (0), %u live (1), cap %llu", (long long)committed,
         info.live, (unsigned long long)info.cap);
    }
    gmr_runtime_free(rt);
    if (shared) {
      unlink(capfile);
      rmdir(dir);
    }
  }
  gmr__avl_clear(&live, NULL, NULL);
  return done_testing();
}
