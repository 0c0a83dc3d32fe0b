/* streams.c: the caching policy's streams: the stream table, the block
 * records each stream keeps, record_stream, and the completion of the
 * events that keep a freed block busy until every stream that used it has
 * passed (PyTorch's process_events, synchronize_and_free_events; the free
 * path records them: caching.c, cache_insert_events).  The global path's
 * (every lock held), but for gmr__cache_records_reserve, which a fast path
 * calls under its stream's lock.  Map: internal.h, Note [Rooms].
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "caching/internal.h"

/* ---- records ---------------------------------------------------------------------- */

/* A record's treap priority, drawn once when the record is made (an LCG
 * per stream): priorities stay independent of the keys the record takes,
 * and an insert writes none. */
static inline uint16_t cache_prio(cache_stream_t *cs) {
  cs->prio_state = cs->prio_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint16_t)(cs->prio_state >> 48);
}

/* Records come in chunks of CACHE_CHUNK, 64-byte aligned, one host
 * allocation each, linked from their stream and freed with it: a record's
 * first line is a whole cache line, and records made together lie
 * together. */
#define CACHE_CHUNK 32
typedef struct cache_chunk_s {
  struct cache_chunk_s *next;
} cache_chunk_t;

static cache_block_t *chunk_records(cache_chunk_t *k) {
  return gmr__align_ptr(k + 1, 64);
}

/* Keep at least n spare block records in a stream, so that a step that
 * needs some cannot fail half way.  Caller holds the stream's lock. */
int gmr__cache_records_reserve(cache_stream_t *cs, size_t n) {
  _Static_assert(sizeof(cache_block_t) == 128, "a block record is two cache lines");
  while (cs->n_spare < n) {
    cache_chunk_t *k = gmr__calloc(1, sizeof *k + 63 + CACHE_CHUNK * sizeof(cache_block_t));
    if (k == NULL)
      return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for block records");
    k->next = cs->chunks;
    cs->chunks = k;
    cache_block_t *r = chunk_records(k);
    for (int i = CACHE_CHUNK; i-- > 0;) {
      r[i].prio = cache_prio(cs);
      r[i].next = cs->spare;
      cs->spare = &r[i];
    }
    cs->n_spare += CACHE_CHUNK;
  }
  return 0;
}

/* ---- the stream table ------------------------------------------------------------- */

/* Find or create (global path only).  A new stream is created with its lock
 * held, as the global path holds every stream's lock. */
cache_stream_t *gmr__cache_stream(cache_t *c, gmr_stream_t s) {
  cache_stream_t *cs = cache_stream_find(c, s);
  if (cs != NULL) return cs;
  if (c->n_streams >= CACHE_STAB / 2) {
    gmr__error_set(GMR_ENOMEM, "caching: more than %d streams", CACHE_STAB / 2);
    return NULL;
  }
  if (c->n_streams == c->cap_streams) {
    size_t cap = c->cap_streams ? c->cap_streams * 2 : 8;
    cache_stream_t **v = gmr__realloc(c->streams, cap * sizeof *v);
    if (v == NULL) goto nomem;
    c->streams = v;
    c->cap_streams = cap;
  }
  cs = gmr__calloc(1, sizeof *cs);
  if (cs == NULL) goto nomem;
  gmr__spin_init(&cs->lock);
  cache_spin_lock(&cs->lock);
  cs->id = s;
  cs->prio_state = GMR_HASH_GOLDEN ^ (uint64_t)c->n_streams; /* a seed per stream */
  for (int i = 0; i < 2; ++i) {
    cs->pools[i].stream = cs;
    cs->pools[i].is_small = i == 1;
    cs->pools[i].base = i == 1 ? 9 : 20;
    cs->pools[i].bin_off =
        ((1023 + (int64_t)cs->pools[i].base) << CACHE_BIN_SUB) + (1 << CACHE_BIN_SUB) - 1;
    cs->pools[i].floor = c->bin_floor[i];
  }
  c->streams[c->n_streams++] = cs;
  size_t i = cache_stab_home(s);
  while (atomic_load_explicit(&c->stab[i], memory_order_relaxed) != NULL)
    i = (i + 1) & (CACHE_STAB - 1);
  atomic_store_explicit(&c->stab[i], cs, memory_order_release);
  return cs;
nomem:
  gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a stream");
  return NULL;
}

/* ---- record_stream and events ------------------------------------------------------ */

int gmr__cache_record_stream(gmr_policy_t *self, const gmr_block_t *blk, gmr_stream_t s) {
  cache_t *c = (cache_t *)self;
  cache_block_t *b = blk->handle;
  if (s == b->pool->stream->id) return 0;
  for (uint32_t i = 0; i < b->n_uses; ++i)
    if (b->uses[i] == s) return 0;
  if (b->n_uses == b->cap_uses) {
    uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
    gmr_stream_t *u = gmr__realloc(b->uses, cap * sizeof *u);
    if (u == NULL)
      return gmr__error_set(GMR_ENOMEM, "caching: out of host memory for a stream use");
    b->uses = u;
    b->cap_uses = cap;
  }
  b->uses[b->n_uses++] = s;
  c->events_seen = true; /* active figures may leave allocation's from now on */
  return 0;
}

static void cache_event_done(cache_t *c, cache_stream_t *cs) {
  cache_event_t *e = cs->ev_head;
  cs->ev_head = e->next;
  if (cs->ev_head == NULL) cs->ev_tail = NULL;
  gmr__backend_event_destroy(c->base.backend, e->ev);
  atomic_fetch_sub_explicit(&c->n_pending, 1, memory_order_relaxed);
  cache_block_t *b = e->block;
  e->next = c->spare_ev;
  c->spare_ev = e;
  if (--b->event_count == 0) cache_free_block(c, b, NULL);
}

/* process_events: return blocks whose every event has completed. */
int gmr__cache_process_events(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    while (cs->ev_head != NULL) {
      int q = gmr__backend_event_query(c->base.backend, cs->ev_head->ev);
      if (q == 1) break;
      if (q < 0) return q;
      cache_event_done(c, cs);
    }
  }
  return 0;
}

/* synchronize_and_free_events */
int gmr__cache_sync_events(cache_t *c) {
  ++c->st.num_sync_all_streams;
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    while (cs->ev_head != NULL) {
      int err = gmr__backend_event_sync(c->base.backend, cs->ev_head->ev);
      if (err != 0) return err;
      cache_event_done(c, cs);
    }
  }
  return 0;
}

/* ---- destroy ----------------------------------------------------------------------- */

/* cache_destroy's first step: destroy the events still pending (their
 * blocks go with their segments). */
void gmr__cache_events_destroy(cache_t *c) {
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    for (cache_event_t *e = cs->ev_head, *nx; e; e = nx) {
      nx = e->next;
      gmr__backend_event_destroy(c->base.backend, e->ev);
      gmr__free(e);
    }
  }
}

/* cache_destroy's last step: the spare event records, and every stream with
 * its block records. */
void gmr__cache_streams_free(cache_t *c) {
  for (cache_event_t *e = c->spare_ev, *nx; e; e = nx) {
    nx = e->next;
    gmr__free(e);
  }
  for (size_t i = 0; i < c->n_streams; ++i) {
    cache_stream_t *cs = c->streams[i];
    for (cache_chunk_t *k = cs->chunks, *nx; k; k = nx) {
      nx = k->next;
      cache_block_t *r = chunk_records(k);
      for (int j = 0; j < CACHE_CHUNK; ++j)
        gmr__free(r[j].uses);
      gmr__free(k);
    }
    gmr__free(cs);
  }
  gmr__free(c->streams);
}
