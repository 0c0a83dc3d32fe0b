/* bins.h: the free chunks of the bfc policy (included by bfc.c alone).
 *
 * TensorFlow keeps each of its 21 bins as a std::set ordered by (size, ptr)
 * and scans it from the first element; here each bin is an AVL tree on the
 * same order, with parent links (`up`), so that best fit is one descent, a
 * binned chunk is found from its record (no search by key), and removal and
 * insertion rebalance bottom-up only as far as heights change (amortized a
 * level or two, where a recursive insert or remove rebalances every level
 * of the path).  Inline: the cached allocation and free run on these.
 * Map: Note [Bin invariants].
 */
#ifndef GMR_POLICIES_BFC_BINS_H
#define GMR_POLICIES_BFC_BINS_H

#include "bfc/internal.h"

/* Note [Bin invariants]
 * Invariants (checked by bfc_check_tree in check.c), for every bin i:
 *   in-order walk = the bin's chunks sorted by (size, ptr), every chunk c in
 *     it has c.bin = i = bfc_bin_for(c.size), and c is free;
 *   c.left.up = c.right.up = c,  root.up = NULL;
 *   c.height = 1 + max(height(c.left), height(c.right)), |balance| <= 1.
 */

static inline int avl_h(const bfc_chunk_t *n) {
  return n ? n->height : 0;
}

static inline void avl_update(bfc_chunk_t *n) {
  int l = avl_h(n->left), r = avl_h(n->right);
  n->height = (int8_t)(1 + (l > r ? l : r));
}

/* The link that points to n: its parent's child pointer, or the root. */
static BFC_INLINE bfc_chunk_t **avl_link(bfc_bin_t *bin, bfc_chunk_t *n) {
  bfc_chunk_t *up = n->up;
  return up == NULL ? &bin->root : up->left == n ? &up->left : &up->right;
}

static inline bfc_chunk_t *avl_min(bfc_chunk_t *n) {
  while (n->left != NULL)
    n = n->left;
  return n;
}

/* The in-order successor of n in its bin, or NULL. */
static BFC_INLINE bfc_chunk_t *avl_next(bfc_chunk_t *n) {
  if (n->right != NULL) return avl_min(n->right);
  bfc_chunk_t *up = n->up;
  while (up != NULL && up->right == n) {
    n = up;
    up = up->up;
  }
  return up;
}

/* Rotate n's left child (right child) into n's place; returns it. */
static bfc_chunk_t *avl_rot_right(bfc_bin_t *bin, bfc_chunk_t *n) {
  bfc_chunk_t *l = n->left;
  *avl_link(bin, n) = l;
  l->up = n->up;
  n->left = l->right;
  if (l->right != NULL) l->right->up = n;
  l->right = n;
  n->up = l;
  avl_update(n);
  avl_update(l);
  return l;
}
static bfc_chunk_t *avl_rot_left(bfc_bin_t *bin, bfc_chunk_t *n) {
  bfc_chunk_t *r = n->right;
  *avl_link(bin, n) = r;
  r->up = n->up;
  n->right = r->left;
  if (r->left != NULL) r->left->up = n;
  r->left = n;
  n->up = r;
  avl_update(n);
  avl_update(r);
  return r;
}

/* Restore balance at n, whose subtrees are balanced and whose children's
 * heights differ by d = 2 (left higher) or -2; returns the root of the
 * subtree now where n was, its height updated. */
static bfc_chunk_t *avl_rebalance(bfc_bin_t *bin, bfc_chunk_t *n, int d) {
  if (d > 0) {
    if (avl_h(n->left->left) < avl_h(n->left->right)) avl_rot_left(bin, n->left);
    return avl_rot_right(bin, n);
  }
  if (avl_h(n->right->right) < avl_h(n->right->left)) avl_rot_right(bin, n->right);
  return avl_rot_left(bin, n);
}

/* After a change below n (one leaf added or one node taken out): restore
 * heights and balance from n towards the root while subtree heights change.
 * A subtree whose height is what it was leaves every ancestor as it was, so
 * the walk stops there (n's stored height is the one from before the
 * change); that is after a level or two on average. */
static void avl_fix(bfc_bin_t *bin, bfc_chunk_t *n) {
  while (n != NULL) {
    int hl = avl_h(n->left), hr = avl_h(n->right), d = hl - hr, before = n->height;
    if (d > 1 || d < -1) {
      n = avl_rebalance(bin, n, d);
      if (n->height == before) return;
    } else {
      int h = 1 + (d > 0 ? hl : hr);
      if (h == before) return;
      n->height = (int8_t)h;
    }
    n = n->up;
  }
}

static void bfc_bin_insert(bfc_t *b, bfc_chunk_t *c) {
  gmr_assert_internal(!c->in_use && c->bin == -1);
  int i = bfc_bin_for(c->size);
  bfc_bin_t *bin = &b->bins[i];
  bfc_chunk_t *up = NULL, **at = &bin->root;
  while (*at != NULL) {
    up = *at;
    at = bfc_less(c, up) ? &up->left : &up->right;
  }
  c->left = c->right = NULL;
  c->up = up;
  c->height = 1;
  c->bin = (int8_t)i;
  *at = c;
  avl_fix(bin, up);
  ++bin->count;
  ++b->free_chunks;
  b->nonempty |= 1u << i;
}

static void bfc_bin_remove(bfc_t *b, bfc_chunk_t *c) {
  int i = c->bin;
  gmr_assert_internal(i >= 0 && i < BFC_NUM_BINS && b->bins[i].count > 0);
  bfc_bin_t *bin = &b->bins[i];
  bfc_chunk_t *fix;
  if (c->left == NULL || c->right == NULL) {
    bfc_chunk_t *child = c->left != NULL ? c->left : c->right;
    fix = c->up;
    *avl_link(bin, c) = child;
    if (child != NULL) child->up = c->up;
  } else {
    /* The successor s (leftmost of the right subtree) takes c's node. */
    bfc_chunk_t *s = avl_min(c->right);
    if (s->up == c) {
      fix = s; /* s keeps its right subtree */
    } else {
      fix = s->up;
      s->up->left = s->right;
      if (s->right != NULL) s->right->up = s->up;
      s->right = c->right;
      s->right->up = s;
    }
    *avl_link(bin, c) = s;
    s->up = c->up;
    s->left = c->left;
    s->left->up = s;
    s->height = c->height; /* the node's height before the removal, for avl_fix */
  }
  avl_fix(bin, fix);
  if (--bin->count == 0) b->nonempty &= ~(1u << i);
  --b->free_chunks;
  c->bin = -1;
}

/* Best fit: the smallest free chunk of at least `rounded` bytes, lowest
 * address among equals, as TF's scan of bins from BinNumForSize upward: the
 * first in (size, ptr) order of the request's bin with size >= rounded, or
 * the first chunk of the next non-empty bin.  NULL: none. */
static BFC_INLINE bfc_chunk_t *bfc_best_fit(bfc_t *b, size_t rounded) {
  int i = bfc_bin_for(rounded);
  bfc_chunk_t *best = NULL;
  for (bfc_chunk_t *n = b->bins[i].root; n != NULL;) {
    if (n->size >= rounded) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  if (best != NULL) return best;
  uint32_t higher = b->nonempty & (~1u << i);
  return higher == 0 ? NULL : avl_min(b->bins[__builtin_ctz(higher)].root);
}

/* In-place bin changes.  A binned chunk whose key (size, ptr) changes may
 * stay at its node when the new key still lies between the node's in-order
 * neighbours and maps to the same bin: then the tree keeps its shape and
 * balance, and nothing is searched or rotated.  This is the common case of
 * a cached allocation (the free chunk that is split keeps its node as the
 * remainder) and of its free (the free neighbour that absorbs the chunk
 * keeps its node); bfc.c checks the bounds (avl_next for the successor).
 * A chunk alone in its bin may also move to an empty bin: */

/* Whether c is the only chunk of its bin (a root without children). */
static BFC_INLINE bool bfc_bin_sole(const bfc_chunk_t *c) {
  return c->up == NULL && c->left == NULL && c->right == NULL;
}

/* Move the only chunk of its bin, c, to the empty bin k: the in-place
 * change for a key that crosses into another bin where both bins hold just
 * that chunk (a region of 2^k bytes and its remainder, in growth mode). */
static BFC_INLINE void bfc_bin_move_sole(bfc_t *b, bfc_chunk_t *c, int k) {
  int j = c->bin;
  gmr_assert_internal(bfc_bin_sole(c) && b->bins[j].count == 1 && b->bins[k].root == NULL);
  b->bins[j].root = NULL;
  b->bins[j].count = 0;
  b->bins[k].root = c;
  b->bins[k].count = 1;
  b->nonempty ^= (1u << j) | (1u << k);
  c->bin = (int8_t)k;
}

#endif /* GMR_POLICIES_BFC_BINS_H */
