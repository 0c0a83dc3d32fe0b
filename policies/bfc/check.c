/* check.c: the bfc policy's walk and invariant walker.
 *
 * The walk lists regions in address order, each followed by its chunks.
 * The walker recounts every bin, region, chunk and figure from scratch and
 * compares them with Note [Invariants] (bfc.c) and the invariants in
 * bins.h.  Both run quiesced (policy.h, rule 5).
 */
#include "bfc/internal.h"

int gmr__bfc_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  bfc_t *b = (bfc_t *)self;
  int stop = 0;
  for (size_t i = 0; i < b->n_regions && !stop; ++i) {
    const bfc_region_t *r = b->regions[i];
    gmr_walk_entry_t e = {.is_segment = 1,
                          .address = r->ptr,
                          .size = r->size,
                          .pool = "region",
                          .is_expandable = b->vmm};
    stop = cb(&e, ud);
    for (const bfc_chunk_t *c = bfc_first(r); c != bfc_end(r) && !stop; c = c->next) {
      bool used = c->in_use;
      gmr_walk_entry_t k = {.address = c->ptr,
                            .size = c->size,
                            .requested = used ? c->requested : 0,
                            .state = c->pending ? GMR_BLOCK_PENDING_FREE
                                     : used     ? GMR_BLOCK_ALLOCATED
                                                : GMR_BLOCK_FREE,
                            .pool = "region"};
      stop = cb(&k, ud);
    }
  }
  return 0;
}

#define BFC_CHECK(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) return gmr__error_set(GMR_EINVAL, __VA_ARGS__);                                   \
  } while (0)

/* In-order walk of one bin: sorted, balanced, in its size class. */
static int bfc_check_tree(const bfc_chunk_t *n, int bin, const bfc_chunk_t **prev, size_t *count,
                          int *height) {
  if (n == NULL) return (*height = 0), 0;
  int hl, hr, err;
  if ((err = bfc_check_tree(n->left, bin, prev, count, &hl)) != 0) return err;
  BFC_CHECK(*prev == NULL || bfc_less(*prev, n), "bfc: bin %d is not sorted at chunk %#llx", bin,
            (unsigned long long)n->ptr);
  BFC_CHECK(!n->in_use && n->bin == bin && bfc_bin_for(n->size) == bin,
            "bfc: chunk %#llx of %zu bytes is in bin %d but belongs to bin %d (in use: %d)",
            (unsigned long long)n->ptr, n->size, bin, bfc_bin_for(n->size), n->in_use);
  BFC_CHECK((n->left == NULL || n->left->up == n) && (n->right == NULL || n->right->up == n),
            "bfc: bin %d has a broken parent link under chunk %#llx", bin,
            (unsigned long long)n->ptr);
  *prev = n;
  ++*count;
  if ((err = bfc_check_tree(n->right, bin, prev, count, &hr)) != 0) return err;
  BFC_CHECK(hl - hr <= 1 && hr - hl <= 1 && n->height == 1 + (hl > hr ? hl : hr),
            "bfc: bin %d tree is unbalanced at chunk %#llx", bin, (unsigned long long)n->ptr);
  *height = n->height;
  return 0;
}

int gmr__bfc_check_locked(bfc_t *b) {
  size_t binned = 0;
  for (int i = 0; i < BFC_NUM_BINS; ++i) {
    const bfc_chunk_t *prev = NULL;
    size_t count = 0;
    int h, err = bfc_check_tree(b->bins[i].root, i, &prev, &count, &h);
    if (err != 0) return err;
    BFC_CHECK(b->bins[i].root == NULL || b->bins[i].root->up == NULL,
              "bfc: the root of bin %d has a parent", i);
    BFC_CHECK(count == b->bins[i].count, "bfc: bin %d holds %zu chunks but counts %zu", i, count,
              b->bins[i].count);
    BFC_CHECK(((b->nonempty >> i) & 1) == (count > 0),
              "bfc: the non-empty mask is wrong for bin %d", i);
    binned += count;
  }
  BFC_CHECK(binned == b->free_chunks, "bfc: %zu chunks in bins, %zu counted", binned,
            b->free_chunks);
  int64_t pool = 0, in_use = 0, n_used = 0, req = 0, pend = 0;
  size_t n_pend = 0;
  size_t n_free = 0;
  for (size_t i = 0; i < b->n_regions; ++i) {
    const bfc_region_t *r = b->regions[i];
    BFC_CHECK(i == 0 || b->regions[i - 1]->ptr + b->regions[i - 1]->size <= r->ptr,
              "bfc: regions %zu and %zu overlap or are out of order", i - 1, i);
    BFC_CHECK(r->head.in_use && r->tail.in_use && r->head.size == 0 && r->tail.size == 0 &&
                  bfc_first(r) != bfc_end(r) && bfc_first(r)->ptr == r->ptr &&
                  bfc_first(r)->prev == &r->head && r->tail.prev->next == &r->tail,
              "bfc: region %#llx does not start with its first chunk", (unsigned long long)r->ptr);
    size_t sum = 0, pieces = 0;
    for (size_t k = 0; k < r->n_pieces; ++k)
      pieces += r->pieces[k].size;
    BFC_CHECK(pieces == r->size, "bfc: region %#llx is %zu bytes but its pieces add to %zu",
              (unsigned long long)r->ptr, r->size, pieces);
    const bfc_chunk_t *c = bfc_first(r), *last = NULL;
    for (; c != bfc_end(r); last = c, c = c->next) {
      BFC_CHECK(c->size > 0 && c->size % BFC_MIN_ALLOC == 0, "bfc: chunk %#llx has a bad size %zu",
                (unsigned long long)c->ptr, c->size);
      BFC_CHECK(c->ptr == r->ptr + sum, "bfc: chunk %#llx is not at region offset %zu",
                (unsigned long long)c->ptr, sum);
      BFC_CHECK(c->next->prev == c, "bfc: broken links after chunk %#llx",
                (unsigned long long)c->ptr);
      bool used = c->in_use;
      BFC_CHECK(used || c->next->in_use, "bfc: adjacent free chunks at %#llx and %#llx",
                (unsigned long long)c->ptr, (unsigned long long)c->next->ptr);
      BFC_CHECK(used ? c->bin == -1 : c->bin == bfc_bin_for(c->size),
                "bfc: chunk %#llx (in use: %d) has bin %d", (unsigned long long)c->ptr, used,
                c->bin);
      BFC_CHECK(c->elsewhere == (c->uses != NULL || c->sync_on_free) && (used || !c->elsewhere),
                "bfc: chunk %#llx has a stale stream-use flag", (unsigned long long)c->ptr);
      if (used && c->pending) {
        ++n_pend;
        pend += (int64_t)c->size;
        in_use += (int64_t)c->size;
      } else if (used) {
        BFC_CHECK(c->uses == NULL || c->uses->n <= c->uses->cap,
                  "bfc: chunk %#llx has a bad stream list", (unsigned long long)c->ptr);
        ++n_used;
        in_use += (int64_t)c->size;
        req += (int64_t)c->requested;
        BFC_CHECK(c->requested > 0 && c->requested <= c->size,
                  "bfc: chunk %#llx holds %zu requested bytes in %zu", (unsigned long long)c->ptr,
                  c->requested, c->size);
      } else {
        ++n_free;
      }
      sum += c->size;
    }
    BFC_CHECK(sum == r->size && last == r->tail.prev,
              "bfc: the chunks of region %#llx add to %zu bytes, not %zu",
              (unsigned long long)r->ptr, sum, r->size);
    pool += (int64_t)r->size;
  }
  BFC_CHECK(n_free == binned, "bfc: %zu free chunks in regions, %zu in bins", n_free, binned);
  BFC_CHECK(pool == b->pool_bytes, "bfc: regions add to %lld bytes, pool_bytes is %lld",
            (long long)pool, (long long)b->pool_bytes);
  BFC_CHECK(in_use == b->bytes_in_use && n_used == b->allocations.current &&
                req == b->requested.current,
            "bfc: %lld chunks of %lld bytes (%lld requested) in use, stats say %lld of %lld (%lld)",
            (long long)n_used, (long long)in_use, (long long)req, (long long)b->allocations.current,
            (long long)b->bytes_in_use, (long long)b->requested.current);
  BFC_CHECK(b->peak_bytes_in_use >= b->bytes_in_use, "bfc: peak below current");
  size_t listed = 0;
  for (const bfc_pending_t *e = b->pending; e; e = e->next, ++listed)
    BFC_CHECK(e->chunk->pending && e->chunk->in_use && e->n > 0,
              "bfc: pending entry %zu names chunk %#llx, which is not pending", listed,
              (unsigned long long)e->chunk->ptr);
  BFC_CHECK(listed == n_pend && n_pend == b->n_pending && pend == b->pending_bytes,
            "bfc: %zu pending chunks of %lld bytes, %zu listed, counts say %zu of %lld", n_pend,
            (long long)pend, listed, b->n_pending, (long long)b->pending_bytes);
  if (b->vmm)
    BFC_CHECK(b->n_regions <= 1 && (b->n_regions == 0 || (b->regions[0]->ptr == b->va_base &&
                                                          b->regions[0]->size == b->va_used)),
              "bfc: the VMM range is not one region at its base");
  return 0;
}

int gmr__bfc_check(gmr_policy_t *self) {
  return gmr__bfc_check_locked((bfc_t *)self);
}
