/* trace.c: the trace recorder behind GMR_TRACE.
 *
 * Each event is one CSV line in RMM's replay-log layout
 *   Thread,Time,Action,Pointer,Size,Stream
 * with Time in microseconds since the epoch, Pointer the device address (an
 * id for replay), Size the requested size, Stream the stream handle as an
 * integer.  Lines are buffered and flushed at close; writes are serialized
 * by the trace's own mutex, so the runtime lock is never held while writing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "observe/trace.h"

struct gmr_trace_s {
  FILE *file;
  pthread_mutex_t lock; /* serializes writes to `file` */
};

static _Atomic unsigned trace_thread_next;
static _Thread_local unsigned trace_thread_id; /* 0: not assigned yet */

static pthread_mutex_t trace_paths_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned trace_opened; /* runtimes that opened a trace so far */

int gmr__trace_open(const char *path, gmr_trace_t **out) {
  char name[4096];
  pthread_mutex_lock(&trace_paths_lock);
  unsigned n = trace_opened++;
  pthread_mutex_unlock(&trace_paths_lock);
  if (n == 0)
    snprintf(name, sizeof name, "%s", path);
  else
    snprintf(name, sizeof name, "%s.%u", path, n);
  gmr_trace_t *t = gmr__calloc(1, sizeof *t);
  if (t == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for the trace");
  t->file = fopen(name, "w");
  if (t->file == NULL) {
    gmr__free(t);
    return gmr__error_set(GMR_EIO, "GMR_TRACE: cannot open %s for writing", name);
  }
  pthread_mutex_init(&t->lock, NULL);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n", t->file);
  *out = t;
  return 0;
}

void gmr__trace_event(gmr_trace_t *t, const char *action, const void *ptr, size_t size,
                      gmr_stream_t s) {
  if (trace_thread_id == 0) trace_thread_id = atomic_fetch_add(&trace_thread_next, 1) + 1;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long us =
      (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
  pthread_mutex_lock(&t->lock);
  fprintf(t->file, "%u,%llu,%s,%#llx,%zu,%llu\n", trace_thread_id - 1, us, action,
          (unsigned long long)(uintptr_t)ptr, size, (unsigned long long)(uintptr_t)s);
  pthread_mutex_unlock(&t->lock);
}

void gmr__trace_close(gmr_trace_t *t) {
  if (t == NULL) return;
  fclose(t->file);
  pthread_mutex_destroy(&t->lock);
  gmr__free(t);
}
