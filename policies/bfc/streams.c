/* streams.c: what the bfc policy adds to TensorFlow's BFC for several streams
 * and several threads (gmr's additions; bfc.c calls these, they call nothing
 * of bfc.c).
 * Map: Note [Stream uses], [Waiting for frees].
 */
#include "bfc/internal.h"

/* Note [Stream uses]
 * Gmr_record_stream adds a stream to an in-use chunk (`uses`).  The user's
 * free of such a chunk records one event per stream and keeps the chunk in use
 * (`pending`, on the FIFO list `pending`) until every event completes, so no
 * allocation gets the memory while that work may still touch it. bfc.c gives
 * the chunks back to the bins once gmr__bfc_pending_take hands them over.
 * Invariants (under the lock):
 *   c.pending  <=>  c is named by exactly one entry of b.pending
 *   n_pending = |b.pending|,  pending_bytes = Σ sizes of pending chunks
 *   every entry has n >= 1 events, one per stream recorded on its chunk
 *   (a stream whose event could not be recorded was synchronized instead)
 */

/* Note [Waiting for frees]
 * The threads in the retry wait are listed in `waiting` (by pthread_self, as
 * chunk owners are).  Waiting can help (TF's wait) unless the runtime has one
 * caller, and then only when
 *   a free is on its way to the lock (arriving > 0), or
 *   chunks change hands: some chunk was freed by a thread other than the
 *     one that allocated it (handoff; then any thread may free anything,
 *     as in TF's executors, and gmr waits as TF does), or
 *   some in-use chunk that is not pending belongs to a thread not in
 *     `waiting` (it may free it).
 * Otherwise every holder of memory is waiting for memory itself: nobody
 * will free anything, and the waiters fail at once instead of sleeping.
 */

/* ---- stream uses -------------------------------------------------------------------- */

void gmr__bfc_use_add(bfc_chunk_t *c, gmr_stream_t s) {
  bfc_uses_t *u = c->uses;
  for (size_t i = 0; u && i < u->n; ++i)
    if (u->streams[i] == s) return;
  if (u == NULL || u->n == u->cap) {
    size_t cap = u ? u->cap * 2 : 2;
    bfc_uses_t *v = gmr__realloc(u, sizeof *v + cap * sizeof v->streams[0]);
    if (v == NULL) {
      c->sync_on_free = 1; /* the free synchronizes the device instead */
      return;
    }
    if (u == NULL) v->n = 0;
    v->cap = cap;
    c->uses = u = v;
  }
  u->streams[u->n++] = s;
}

/* see Note [Stream uses] */
bool gmr__bfc_hold(bfc_t *b, bfc_chunk_t *c) {
  gmr_backend_t *be = b->base.backend;
  bfc_uses_t *u = c->uses;
  size_t n = u ? u->n : 0;
  bfc_pending_t *e = n ? gmr__malloc(sizeof *e + n * sizeof e->events[0]) : NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    if (e == NULL || gmr__backend_event_record(be, u->streams[i], &e->events[k]) != 0)
      gmr__backend_stream_sync(be, u->streams[i]); /* slower, never unsafe */
    else
      ++k;
  }
  if (c->sync_on_free) gmr__backend_device_sync(be);
  gmr__free(u);
  c->uses = NULL;
  c->sync_on_free = 0;
  if (k == 0) {
    gmr__free(e);
    return false;
  }
  e->next = NULL;
  e->chunk = c;
  e->n = k;
  if (b->pending_tail != NULL)
    b->pending_tail->next = e;
  else
    b->pending = e;
  b->pending_tail = e;
  c->pending = 1;
  b->pending_bytes += (int64_t)c->size;
  ++b->n_pending;
  return true;
}

/* see Note [Stream uses] */
bfc_pending_t *gmr__bfc_pending_take(bfc_t *b, bool sync) {
  gmr_backend_t *be = b->base.backend;
  bfc_pending_t *done = NULL, **done_tail = &done;
  bfc_pending_t **link = &b->pending, *last = NULL;
  while (*link != NULL) {
    bfc_pending_t *e = *link;
    bool complete = true;
    for (size_t i = 0; i < e->n && complete; ++i) {
      if (sync) gmr__backend_event_sync(be, e->events[i]);
      complete = gmr__backend_event_query(be, e->events[i]) != 1; /* an error: given up on */
    }
    if (!complete) {
      last = e;
      link = &e->next;
      continue;
    }
    *link = e->next;
    for (size_t i = 0; i < e->n; ++i)
      gmr__backend_event_destroy(be, e->events[i]);
    e->chunk->pending = 0;
    b->pending_bytes -= (int64_t)e->chunk->size;
    --b->n_pending;
    e->next = NULL;
    *done_tail = e;
    done_tail = &e->next;
  }
  b->pending_tail = last;
  return done;
}

void gmr__bfc_streams_destroy(bfc_t *b) {
  for (bfc_pending_t *e = b->pending, *next; e; e = next) {
    next = e->next;
    for (size_t i = 0; i < e->n; ++i)
      gmr__backend_event_destroy(b->base.backend, e->events[i]);
    gmr__free(e);
  }
  b->pending = b->pending_tail = NULL;
  gmr__free(b->waiting);
  b->waiting = NULL;
  for (size_t i = 0; i < b->n_regions; ++i)
    for (bfc_chunk_t *c = bfc_first(b->regions[i]); c != bfc_end(b->regions[i]); c = c->next) {
      gmr__free(c->uses);
      c->uses = NULL;
    }
}

/* ---- waiting for frees ---------------------------------------------------------------- */

int gmr__bfc_waiting_add(bfc_t *b, uintptr_t me) {
  if (b->n_waiting == b->cap_waiting) {
    size_t cap = b->cap_waiting ? b->cap_waiting * 2 : 16;
    uintptr_t *v = gmr__realloc(b->waiting, cap * sizeof *v);
    if (v == NULL) return GMR_ENOMEM; /* then the caller does not wait */
    b->waiting = v;
    b->cap_waiting = cap;
  }
  b->waiting[b->n_waiting++] = me;
  return 0;
}

void gmr__bfc_waiting_remove(bfc_t *b, uintptr_t me) {
  for (size_t i = 0; i < b->n_waiting; ++i)
    if (b->waiting[i] == me) {
      b->waiting[i] = b->waiting[--b->n_waiting];
      return;
    }
}

/* see Note [Waiting for frees] */
bool gmr__bfc_wait_can_help(const bfc_t *b) {
  if (b->exclusive) return false;
  if (atomic_load_explicit(&b->arriving, memory_order_seq_cst) > 0 ||
      atomic_load_explicit(&b->handoff, memory_order_seq_cst))
    return true;
  for (size_t i = 0; i < b->n_regions; ++i)
    for (const bfc_chunk_t *c = bfc_first(b->regions[i]); c != bfc_end(b->regions[i]);
         c = c->next) {
      if (!c->in_use || c->pending) continue;
      bool waiting = false;
      for (size_t w = 0; w < b->n_waiting && !waiting; ++w)
        waiting = b->waiting[w] == c->owner;
      if (!waiting) return true;
    }
  return false;
}
