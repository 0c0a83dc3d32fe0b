/* check.c: the caching policy's walk and invariant check.
 *
 * The walk lists segments in address order, each followed by its blocks, as
 * PyTorch's memory snapshot shows them; the check recounts the state and
 * compares.  Map: Note [Caching check].
 */
#include <stdlib.h>

#include "caching/internal.h"

/* Note [Caching check]
 * The check recounts every segment, block, tree and statistic from scratch and
 * compares (the invariants of Note [Invariants] in caching.c):
 *   for every segment: Σ block sizes = segment size, blocks contiguous,
 *     no two neighbours both free with the same mapping state;
 *   a block is in its pool's free tree  <=>  it is free and mapped;
 *   reserved_bytes[pool].current = Σ non-expandable segment sizes
 *                                  + Σ mapped bytes of expandable segments;
 *   reserved >= active >= allocated (bytes, every pool);
 *   total_allocated = reserved[small] + reserved[large].
 * Both run quiesced (policy.h, rule 5: every lock held, deltas folded).
 */

/* ---- walk and check ----------------------------------------------------------------------- */

static int cache_seg_cmp(const void *a, const void *b) {
  uintptr_t x = (*(cache_seg_t *const *)a)->base, y = (*(cache_seg_t *const *)b)->base;
  return x < y ? -1 : x > y;
}

/* The segments sorted by address (caller frees). */
static cache_seg_t **cache_sorted_segs(cache_t *c) {
  cache_seg_t **v = gmr__malloc((c->n_segs ? c->n_segs : 1) * sizeof *v);
  if (v == NULL) return NULL;
  size_t n = 0;
  for (cache_seg_t *s = c->segs; s; s = s->next_seg)
    v[n++] = s;
  qsort(v, n, sizeof *v, cache_seg_cmp);
  return v;
}

static gmr_block_state_t cache_state(const cache_block_t *b) {
  if (b->allocated) return GMR_BLOCK_ALLOCATED;
  if (b->event_count > 0 || b->n_uses > 0) return GMR_BLOCK_PENDING_FREE;
  return b->mapped ? GMR_BLOCK_FREE : GMR_BLOCK_UNMAPPED;
}

/* Segments in address order, each followed by its blocks.  An expandable
 * segment is shown as one segment per contiguous mapped range, as PyTorch's
 * snapshot shows it. */
int gmr__cache_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  cache_t *c = (cache_t *)self;
  cache_seg_t **v = cache_sorted_segs(c);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  int stop = 0;
  for (size_t i = 0; i < c->n_segs && !stop; ++i) {
    cache_seg_t *s = v[i];
    for (cache_block_t *b = s->head; b && !stop;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      size_t run = 0;
      for (cache_block_t *x = b; x && x->mapped; x = x->next)
        run += x->size;
      gmr_walk_entry_t e = {.is_segment = 1,
                            .address = b->ptr,
                            .size = run,
                            .stream = s->pool->stream->id,
                            .pool = s->pool->is_small ? "small" : "large",
                            .is_expandable = s->expandable};
      stop = cb(&e, ud);
      for (; b && b->mapped && !stop; b = b->next) {
        gmr_walk_entry_t be = {.is_segment = 0,
                               .address = b->ptr,
                               .size = b->size,
                               .requested = b->allocated ? b->requested : 0,
                               .state = cache_state(b),
                               .stream = s->pool->stream->id,
                               .pool = e.pool,
                               .is_expandable = s->expandable};
        stop = cb(&be, ud);
      }
    }
  }
  gmr__free(v);
  return 0;
}

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      gmr__free(segs);                                                                             \
      return gmr__error_set(GMR_EINVAL, "caching: " __VA_ARGS__);                                  \
    }                                                                                              \
  } while (0)

/* A treap's order, heap order and links; in a free tree (bin >= 0) every
 * block is in its bin.  Returns the blocks counted. */
static size_t treap_check(const cache_pool_t *p, cache_block_t *t, bool by_addr,
                          const cache_block_t *lo, const cache_block_t *hi, int bin, bool *ok) {
  if (t == NULL) return 0;
  if (bin >= 0 && (t->bin != bin || cache_bin(p, t->size) != (unsigned)bin ||
                   t->size < p->floor[bin] || t->size >= p->floor[bin + 1]))
    *ok = false;
  if ((lo && !cache_less(lo, t->size, t->ptr, by_addr)) ||
      (hi && !cache_less(t, hi->size, hi->ptr, by_addr)) || !t->in_tree ||
      (t->left && (t->left->prio > t->prio || t->left->parent != t)) ||
      (t->right && (t->right->prio > t->prio || t->right->parent != t)))
    *ok = false;
  return 1 + treap_check(p, t->left, by_addr, lo, t, bin, ok) +
         treap_check(p, t->right, by_addr, t, hi, bin, ok);
}

/* see Note [Caching check] */
int gmr__cache_check(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  cache_seg_t **segs = cache_sorted_segs(c);
  if (segs == NULL) return gmr__error_set(GMR_ENOMEM, "caching: out of host memory");
  int64_t reserved[3] = {0}, allocated[3] = {0}, active[3] = {0}, requested[3] = {0};
  int64_t segments[3] = {0}, isplit[3] = {0}, isplit_bytes[3] = {0}, allocs[3] = {0};
  size_t free_mapped = 0, unmapped = 0, pending_events = 0;
  for (size_t i = 0; i < c->n_segs; ++i) {
    cache_seg_t *s = segs[i];
    int t = cache_stat_type(s->pool);
    CHECK(i == 0 || segs[i - 1]->base + segs[i - 1]->size <= s->base,
          "segments at %p and %p overlap", (void *)segs[i - 1]->base, (void *)s->base);
    CHECK(s->head && s->head->prev == NULL && s->head->ptr == s->base,
          "segment %p does not start with its head block", (void *)s->base);
    size_t sum = 0;
    if (!s->expandable) segments[t]++, reserved[t] += (int64_t)s->size;
    for (cache_block_t *b = s->head; b; b = b->next) {
      CHECK(b->seg == s && b->pool == s->pool, "block %p is in the wrong segment", (void *)b->ptr);
      CHECK(b->ptr == s->base + sum, "block %p is not contiguous in its segment", (void *)b->ptr);
      CHECK(b->next == NULL || b->next->prev == b, "block %p has a broken next link",
            (void *)b->ptr);
      CHECK(b->size > 0 && (s->expandable || b->size % CACHE_MIN_BLOCK == 0),
            "block %p has size %zu", (void *)b->ptr, b->size);
      sum += b->size;
      CHECK(b->allocated || b->n_uses == 0, "free block %p has recorded streams", (void *)b->ptr);
      bool is_free = cache_allocatable(b);
      CHECK(!(is_free && b->mapped) || b->in_tree, "free block %p is not in its pool",
            (void *)b->ptr);
      CHECK(is_free || !b->in_tree, "busy block %p is in a free tree", (void *)b->ptr);
      if (b->next)
        CHECK(!(is_free && cache_allocatable(b->next) && b->mapped == b->next->mapped),
              "adjacent free blocks at %p and %p were not merged", (void *)b->ptr,
              (void *)b->next->ptr);
      if (s->expandable && b->mapped) reserved[t] += (int64_t)b->size;
      if (b->allocated) allocated[t] += (int64_t)b->size, allocs[t]++;
      if (b->allocated || b->event_count > 0) {
        active[t] += (int64_t)b->size;
        requested[t] += (int64_t)b->requested;
      }
      pending_events += (size_t)b->event_count;
      if (is_free && b->mapped) ++free_mapped;
      if (!b->mapped) ++unmapped;
      if (is_free && !s->expandable && cache_is_split(b))
        isplit[t]++, isplit_bytes[t] += (int64_t)b->size;
    }
    CHECK(sum == s->size, "segment %p holds %zu bytes of blocks but is %zu bytes", (void *)s->base,
          sum, s->size);
  }
  size_t in_trees = 0, in_unmapped = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    for (int k = 0; k < 2; ++k) {
      cache_pool_t *p = &c->streams[i]->pools[k];
      bool ok = true;
      ok = p->unmapped == NULL || p->unmapped->parent == NULL;
      size_t n = 0;
      for (int k = 0; k < CACHE_BINS; ++k) {
        cache_block_t *t = p->bins[k];
        ok = ok && (t == NULL || t->parent == NULL) && (t != NULL) == ((p->nonempty >> k) & 1);
        n += treap_check(p, t, false, NULL, NULL, k, &ok);
      }
      CHECK(ok && n == p->n_blocks, "the free tree of a pool is out of order or miscounted");
      in_trees += n;
      in_unmapped += treap_check(p, p->unmapped, true, NULL, NULL, -1, &ok);
      CHECK(ok, "the unmapped tree of a pool is out of order");
    }
  CHECK(in_trees == free_mapped, "%zu blocks in free trees, %zu free mapped blocks", in_trees,
        free_mapped);
  CHECK(in_unmapped == unmapped, "%zu blocks in unmapped trees, %zu unmapped", in_unmapped,
        unmapped);
  CHECK(pending_events == c->n_pending, "%zu events on blocks, %zu pending", pending_events,
        c->n_pending);
  for (int t = 1; t < 3; ++t) {
    const cache_stats_t *st = &c->st;
    const char *pn = t == CS_SMALL ? "small" : "large";
    CHECK(st->reserved_bytes[t].current == reserved[t], "%s reserved %lld, segments hold %lld", pn,
          (long long)st->reserved_bytes[t].current, (long long)reserved[t]);
    CHECK(st->segment[t].current == segments[t], "%s segments %lld, counted %lld", pn,
          (long long)st->segment[t].current, (long long)segments[t]);
    CHECK(st->allocated_bytes[t].current == allocated[t], "%s allocated %lld, blocks %lld", pn,
          (long long)st->allocated_bytes[t].current, (long long)allocated[t]);
    CHECK(st->allocation[t].current == allocs[t], "%s allocations %lld, blocks %lld", pn,
          (long long)st->allocation[t].current, (long long)allocs[t]);
    CHECK(st->active_bytes[t].current == active[t], "%s active %lld, blocks %lld", pn,
          (long long)st->active_bytes[t].current, (long long)active[t]);
    CHECK(st->requested_bytes[t].current == requested[t], "%s requested %lld, blocks %lld", pn,
          (long long)st->requested_bytes[t].current, (long long)requested[t]);
    CHECK(st->inactive_split[t].current == isplit[t] &&
              st->inactive_split_bytes[t].current == isplit_bytes[t],
          "%s inactive_split %lld/%lld bytes, blocks %lld/%lld", pn,
          (long long)st->inactive_split[t].current, (long long)st->inactive_split_bytes[t].current,
          (long long)isplit[t], (long long)isplit_bytes[t]);
    CHECK(reserved[t] >= active[t] && active[t] >= allocated[t],
          "%s pool breaks reserved >= active >= allocated", pn);
  }
  CHECK((int64_t)c->total_allocated == reserved[1] + reserved[2],
        "total_allocated_memory %zu, reserved %lld", c->total_allocated,
        (long long)(reserved[1] + reserved[2]));
  gmr__free(segs);
  return 0;
}
#undef CHECK
