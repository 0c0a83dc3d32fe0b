/* history.c: the bounded ring buffer of trace entries behind
 * gmr_history_enable (see history.h: Note [Who records what], and
 * Note [History ring] for the ring's invariants).
 *
 * The ring grows by doubling, from 1024 entries up to its bound, so a bound
 * as large as PyTorch's default (sys.maxsize) costs only what is recorded.
 * Once `max` entries are held, each new entry overwrites the oldest one.
 * Entries are timed by the backend's clock moved to the epoch: on the
 * simulator with a set clock (gmr_sim_set_clock) the differences between
 * entries are exactly the simulated time that passed.
 */
#include <string.h>
#include <time.h>

#include "observe/history.h"

#define HISTORY_FIRST_CAP 1024 /* entries */

static const char *const history_action_names[GMR_HIST_N_ACTIONS] = {
    [GMR_HIST_ALLOC] = "alloc",
    [GMR_HIST_FREE_REQUESTED] = "free_requested",
    [GMR_HIST_FREE_COMPLETED] = "free_completed",
    [GMR_HIST_SEGMENT_ALLOC] = "segment_alloc",
    [GMR_HIST_SEGMENT_FREE] = "segment_free",
    [GMR_HIST_SEGMENT_MAP] = "segment_map",
    [GMR_HIST_SEGMENT_UNMAP] = "segment_unmap",
    [GMR_HIST_OOM] = "oom",
    [GMR_HIST_SNAPSHOT] = "snapshot",
};

const char *gmr__history_action_name(int action) {
  return action >= 0 && action < GMR_HIST_N_ACTIONS ? history_action_names[action] : "unknown";
}

int gmr__history_new(gmr_backend_t *clock, size_t max, gmr_history_t **out) {
  gmr_assert(max > 0);
  gmr_history_t *h = gmr__calloc(1, sizeof *h);
  if (h == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for the memory history");
  if (pthread_mutex_init(&h->lock, NULL) != 0) {
    gmr__free(h);
    return gmr__error_set(GMR_ENOMEM, "cannot create the memory history's mutex");
  }
  h->max = max;
  h->clock = clock;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t epoch_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  h->epoch_offset_ns = epoch_ns - (int64_t)gmr__backend_now_ns(clock);
  *out = h;
  return 0;
}

_Static_assert(GMR_HISTORY_ALLOC == (int)GMR_HIST_ALLOC &&
                   GMR_HISTORY_SEGMENT_UNMAP == (int)GMR_HIST_SEGMENT_UNMAP &&
                   GMR_HISTORY_SNAPSHOT == (int)GMR_HIST_SNAPSHOT,
               "the public history actions are the internal ones");

void gmr__history_set_observer(gmr_history_t *h, gmr_history_cb cb, void *ud) {
  pthread_mutex_lock(&h->lock);
  h->observer = cb;
  h->observer_ud = ud;
  pthread_mutex_unlock(&h->lock);
}

void gmr__history_free(gmr_history_t *h) {
  if (h == NULL) return;
  for (size_t i = 0; i < h->n_frames; ++i) {
    gmr__free(h->frames[i].filename);
    gmr__free(h->frames[i].name);
  }
  gmr__free(h->frames);
  gmr__free(h->ring);
  pthread_mutex_destroy(&h->lock);
  gmr__free(h);
}

/* Copy the entries to dst[0 .. len), oldest first.  Called with the lock. */
static void history_linearize(gmr_history_t *h, gmr_hist_entry_t *dst) {
  if (h->len < h->max || h->head == 0) {
    memmove(dst, h->ring, h->len * sizeof *dst);
  } else {
    size_t tail = h->len - h->head; /* oldest part: ring[head .. len) */
    memcpy(dst, h->ring + h->head, tail * sizeof *dst);
    memcpy(dst + tail, h->ring, h->head * sizeof *dst);
  }
}

void gmr__history_clear(gmr_history_t *h) {
  pthread_mutex_lock(&h->lock);
  gmr__free(h->ring);
  h->ring = NULL;
  h->cap = h->len = h->head = 0;
  pthread_mutex_unlock(&h->lock);
}

int gmr__history_resize(gmr_history_t *h, size_t max) {
  gmr_assert(max > 0);
  pthread_mutex_lock(&h->lock);
  int err = 0;
  if (max == h->max) goto out;
  size_t keep = h->len < max ? h->len : max;
  size_t cap =
      keep > HISTORY_FIRST_CAP ? keep : (max < HISTORY_FIRST_CAP ? max : HISTORY_FIRST_CAP);
  gmr_hist_entry_t *ring = NULL, *all = NULL;
  if (h->len > 0) {
    all = gmr__malloc(h->len * sizeof *all);
    ring = gmr__malloc(cap * sizeof *ring);
    if (all == NULL || ring == NULL) {
      gmr__free(all);
      gmr__free(ring);
      err = gmr__error_set(GMR_ENOMEM, "out of host memory for the memory history");
      goto out;
    }
    history_linearize(h, all);
    memcpy(ring, all + (h->len - keep), keep * sizeof *ring);
    gmr__free(all);
  }
  h->dropped += h->len - keep;
  gmr__free(h->ring);
  h->ring = ring;
  h->cap = ring ? cap : 0;
  h->len = keep;
  h->head = 0;
  h->max = max;
out:
  pthread_mutex_unlock(&h->lock);
  return err;
}

/* The calling thread's current frame and the history it is for (Note
 * [History frames]). */
static _Thread_local const gmr_history_t *tl_frame_history;
static _Thread_local uint32_t tl_frame;

void gmr__history_use_frame(gmr_history_t *h, uint32_t id) {
  tl_frame_history = id != 0 ? h : NULL;
  tl_frame = id;
}

int gmr__history_add_frame(gmr_history_t *h, const char *filename, uint32_t line, const char *name,
                           uint32_t *out) {
  char *fn = gmr__strdup(filename ? filename : ""), *nm = gmr__strdup(name ? name : "");
  int err = 0;
  pthread_mutex_lock(&h->lock);
  if (fn == NULL || nm == NULL || h->n_frames >= UINT32_MAX - 1) {
    err = GMR_ENOMEM;
  } else if (h->n_frames == h->cap_frames) {
    size_t cap = h->cap_frames ? h->cap_frames * 2 : 64;
    gmr_hist_frame_t *v = gmr__realloc(h->frames, cap * sizeof *v);
    if (v == NULL)
      err = GMR_ENOMEM;
    else
      h->frames = v, h->cap_frames = cap;
  }
  if (err == 0) {
    h->frames[h->n_frames++] = (gmr_hist_frame_t){fn, nm, line};
    *out = (uint32_t)h->n_frames;
  }
  pthread_mutex_unlock(&h->lock);
  if (err == 0) return 0;
  gmr__free(fn);
  gmr__free(nm);
  return gmr__error_set(GMR_ENOMEM, "out of host memory for the memory history's frames");
}

int gmr__history_copy_frames(gmr_history_t *h, gmr_hist_frame_t **out, size_t *out_len) {
  pthread_mutex_lock(&h->lock);
  size_t n = h->n_frames;
  gmr_hist_frame_t *v = gmr__malloc((n ? n : 1) * sizeof *v);
  if (v != NULL && n > 0) memcpy(v, h->frames, n * sizeof *v);
  pthread_mutex_unlock(&h->lock);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory to copy the frames");
  *out = v;
  *out_len = n;
  return 0;
}

void gmr__history_record_locked(gmr_history_t *h, int action, uint64_t addr, uint64_t size,
                                gmr_stream_t s) {
  int64_t ns = (int64_t)gmr__backend_now_ns(h->clock) + h->epoch_offset_ns;
  gmr_hist_entry_t e = {.addr = addr,
                        .size = size,
                        .stream = (uint64_t)(uintptr_t)s,
                        .time_us = ns > 0 ? (uint64_t)ns / 1000 : 0,
                        .action = (uint8_t)action,
                        .frame = tl_frame_history == h ? tl_frame : 0};
  ++h->recorded;
  if (GMR_UNLIKELY(h->observer != NULL)) {
    gmr_history_event_t ev = {(gmr_history_action_t)action, (uintptr_t)addr, size, s, e.time_us};
    h->observer(&ev, h->observer_ud);
  }
  if (h->len < h->max) {
    if (h->len == h->cap) {
      size_t cap = h->cap ? h->cap * 2 : HISTORY_FIRST_CAP;
      if (cap > h->max || cap < h->cap) cap = h->max;
      gmr_hist_entry_t *ring = gmr__realloc(h->ring, cap * sizeof *ring);
      if (ring == NULL) { /* keep what we have: the oldest entry makes room */
        if (h->len == 0) {
          ++h->dropped;
          return;
        }
        h->max = h->len;
        goto overwrite;
      }
      h->ring = ring;
      h->cap = cap;
    }
    h->ring[h->len++] = e;
    return;
  }
overwrite:
  h->ring[h->head] = e;
  h->head = (h->head + 1) % h->max;
  ++h->dropped;
}

void gmr__history_record(gmr_history_t *h, int action, uint64_t addr, uint64_t size,
                         gmr_stream_t s) {
  pthread_mutex_lock(&h->lock);
  gmr__history_record_locked(h, action, addr, size, s);
  pthread_mutex_unlock(&h->lock);
}

int gmr__history_copy(gmr_history_t *h, gmr_hist_entry_t **out, size_t *out_len) {
  pthread_mutex_lock(&h->lock);
  size_t n = h->len;
  gmr_hist_entry_t *v = gmr__malloc((n ? n : 1) * sizeof *v);
  if (v != NULL) history_linearize(h, v);
  pthread_mutex_unlock(&h->lock);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory to copy the history");
  *out = v;
  *out_len = n;
  return 0;
}
