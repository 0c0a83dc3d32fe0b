/* trace.c: the trace recorder behind GMR_TRACE.
 *
 * Each event is one CSV line in RMM's replay-log layout
 *   Thread,Time,Action,Pointer,Size,Stream
 * with Time in microseconds since the epoch, Pointer the device address (an
 * id for replay), Size the requested size, Stream the stream handle as an
 * integer.  Writes are serialized by the trace's own mutex, so the runtime
 * lock is never held while writing.
 *
 * Nothing is lost silently: see Note [Failed writes].
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "observe/trace.h"

/* Note [Failed writes]
 * Lines are buffered and flushed every TRACE_FLUSH_LINES lines or
 * TRACE_FLUSH_US microseconds, whichever comes first, so a crash loses at
 * most that tail.  The first failed write (a full
 * disk, GMR_TRACE=/dev/full) is logged once at GMR_LOG_ERROR and makes the
 * trace `failed`: later events are dropped (the file could only hold a trace
 * with a hole), each one reports GMR_EIO to its caller, which sets the
 * thread's last error while the allocation itself succeeds, and
 * gmr_flush / gmr_runtime_close return GMR_EIO, so a tool exits non-zero.
 *   failed == 0  =>  every event so far is in the file or in its buffer.
 */
#define TRACE_FLUSH_LINES 256
#define TRACE_FLUSH_US    100000 /* 0.1 s */

struct gmr_trace_s {
  FILE *file;
  pthread_mutex_t lock; /* serializes writes to `file` and guards what follows */
  char *name;           /* the file's name, for messages */
  unsigned pending;     /* lines written since the last flush */
  uint64_t flushed_us;  /* time of the last flush */
  int failed;           /* errno of the first failed write; 0: none */
};

static _Atomic unsigned trace_thread_next;
static _Thread_local unsigned trace_thread_id; /* 0: not assigned yet */

static pthread_mutex_t trace_paths_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned trace_opened; /* runtimes that opened a trace so far */

static int trace_error(const gmr_trace_t *t) {
  return gmr__error_set(GMR_EIO, "GMR_TRACE: cannot write %s: %s; the trace is incomplete", t->name,
                        strerror(t->failed));
}

/* Note a failed write (lock held): the first one is logged.  See
 * Note [Failed writes]. */
static int trace_fail(gmr_trace_t *t, int err) {
  if (t->failed == 0) {
    t->failed = err ? err : EIO;
    trace_error(t);
    gmr__log(GMR_LOG_ERROR, "%s", gmr__error_last());
  }
  return GMR_EIO;
}

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

int gmr__trace_open(const char *path, gmr_trace_t **out) {
  pthread_mutex_lock(&trace_paths_lock);
  unsigned n = trace_opened++;
  pthread_mutex_unlock(&trace_paths_lock);
  size_t len = strlen(path) + 16;
  gmr_trace_t *t = gmr__calloc(1, sizeof *t);
  char *name = gmr__malloc(len);
  if (t == NULL || name == NULL) {
    gmr__free(t);
    gmr__free(name);
    return gmr__error_set(GMR_ENOMEM, "out of host memory for the trace");
  }
  if (n == 0)
    snprintf(name, len, "%s", path);
  else
    snprintf(name, len, "%s.%u", path, n);
  t->name = name;
  t->file = fopen(name, "w");
  if (t->file == NULL) {
    int e = errno;
    gmr__error_set(GMR_EIO, "GMR_TRACE: cannot open %s for writing: %s", name, strerror(e));
    gmr__free(name);
    gmr__free(t);
    return GMR_EIO;
  }
  pthread_mutex_init(&t->lock, NULL);
  t->flushed_us = now_us();
  errno = 0;
  if (fputs("Thread,Time,Action,Pointer,Size,Stream\n", t->file) < 0 || fflush(t->file) != 0) {
    int err = trace_fail(t, errno);
    gmr__trace_close(t);
    return err;
  }
  *out = t;
  return 0;
}

int gmr__trace_event(gmr_trace_t *t, const char *action, const void *ptr, size_t size,
                     gmr_stream_t s) {
  if (trace_thread_id == 0) trace_thread_id = atomic_fetch_add(&trace_thread_next, 1) + 1;
  uint64_t us = now_us();
  int err = 0;
  pthread_mutex_lock(&t->lock);
  if (t->failed != 0) {
    err = trace_error(t);
  } else {
    errno = 0;
    if (fprintf(t->file, "%u,%llu,%s,%#llx,%zu,%llu\n", trace_thread_id - 1, (unsigned long long)us,
                action, (unsigned long long)(uintptr_t)ptr, size,
                (unsigned long long)(uintptr_t)s) < 0)
      err = trace_fail(t, errno);
    else if (++t->pending >= TRACE_FLUSH_LINES || us - t->flushed_us >= TRACE_FLUSH_US) {
      t->pending = 0;
      t->flushed_us = us;
      if (fflush(t->file) != 0) err = trace_fail(t, errno);
    }
  }
  pthread_mutex_unlock(&t->lock);
  return err;
}

int gmr__trace_flush(gmr_trace_t *t) {
  pthread_mutex_lock(&t->lock);
  errno = 0;
  if (t->failed == 0 && fflush(t->file) != 0) trace_fail(t, errno);
  t->pending = 0;
  int err = t->failed ? trace_error(t) : 0;
  pthread_mutex_unlock(&t->lock);
  return err;
}

int gmr__trace_close(gmr_trace_t *t) {
  if (t == NULL) return 0;
  errno = 0;
  if (t->failed == 0 && fflush(t->file) != 0) trace_fail(t, errno);
  errno = 0;
  if (fclose(t->file) != 0 && t->failed == 0) trace_fail(t, errno);
  int err = t->failed ? trace_error(t) : 0;
  pthread_mutex_destroy(&t->lock);
  gmr__free(t->name);
  gmr__free(t);
  return err;
}
