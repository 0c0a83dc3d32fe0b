/* avl.c: the AVL tree of avl.h.
 *
 * Insertion and removal descend in a loop that keeps the links they
 * followed (as many as the height, <= 1.44 log2(n + 2): at most 92 for 2^64
 * nodes), then rebalance on the way back up with single or double
 * rotations, stopping at the first node whose height comes out as it was:
 *   height(n) unchanged ⇒ every ancestor keeps its height and balance
 * so balance() above it would change nothing.  Removal of a node with two
 * children moves its in-order successor into its place.
 */
#include "core/avl.h"
#include "core/internal.h"

#define AVL_MAX_HEIGHT 92 /* 1.44 log2(2^64 + 2) */

static inline int32_t height(const gmr_avl_node_t *n) {
  return n ? n->height : 0;
}

static inline void update(gmr_avl_node_t *n) {
  int32_t a = height(n->child[0]), b = height(n->child[1]);
  n->height = (a > b ? a : b) + 1;
}

/* Rotate so that n->child[dir] becomes the subtree's root. */
static gmr_avl_node_t *rotate(gmr_avl_node_t *n, int dir) {
  gmr_avl_node_t *c = n->child[dir];
  n->child[dir] = c->child[!dir];
  c->child[!dir] = n;
  update(n);
  update(c);
  return c;
}

/* Restore the balance of n, whose children are balanced and differ in
 * height by at most 2 (see Note [AVL invariants] in avl.h). */
static gmr_avl_node_t *balance(gmr_avl_node_t *n) {
  update(n);
  int32_t diff = height(n->child[1]) - height(n->child[0]);
  if (diff >= -1 && diff <= 1) return n;
  int dir = diff > 0; /* the heavy side */
  gmr_avl_node_t *c = n->child[dir];
  if (height(c->child[!dir]) > height(c->child[dir])) n->child[dir] = rotate(c, !dir);
  return rotate(n, dir);
}

/* balance(n) on the way up; *done once n's subtree has its old height. */
static gmr_avl_node_t *settle(gmr_avl_node_t *n, int *done) {
  int32_t old = n->height;
  n = balance(n);
  *done = n->height == old;
  return n;
}

int gmr__avl_insert(gmr_avl_t *t, uint64_t key, uint64_t val, uint32_t aux) {
  /* Down: the links followed (height <= AVL_MAX_HEIGHT); up: balance each
   * node of the path until one keeps its height. */
  gmr_avl_node_t **path[AVL_MAX_HEIGHT], **link = &t->root;
  size_t depth = 0;
  for (gmr_avl_node_t *n; (n = *link) != NULL; link = &n->child[key > n->key]) {
    if (n->key == key) return 1;
    path[depth++] = link;
  }
  gmr_avl_node_t *fresh = t->spare;
  if (fresh != NULL)
    t->spare = fresh->child[0];
  else if ((fresh = gmr__malloc(sizeof *fresh)) == NULL)
    return GMR_ENOMEM;
  *fresh = (gmr_avl_node_t){key, val, aux, 1, {NULL, NULL}};
  *link = fresh;
  ++t->count;
  for (int done = 0; !done && depth > 0;) {
    link = path[--depth];
    *link = settle(*link, &done);
  }
  return 0;
}

gmr_avl_node_t *gmr__avl_find(const gmr_avl_t *t, uint64_t key) {
  gmr_avl_node_t *n = t->root;
  while (n != NULL && n->key != key)
    n = n->child[key > n->key];
  return n;
}

gmr_avl_node_t *gmr__avl_floor(const gmr_avl_t *t, uint64_t key) {
  gmr_avl_node_t *n = t->root, *best = NULL;
  while (n != NULL) {
    if (n->key == key) return n;
    if (n->key < key) {
      best = n;
      n = n->child[1];
    } else {
      n = n->child[0];
    }
  }
  return best;
}

int gmr__avl_erase(gmr_avl_t *t, uint64_t key) {
  gmr_avl_node_t **path[AVL_MAX_HEIGHT], **link = &t->root, *gone;
  size_t depth = 0;
  for (; (gone = *link) != NULL && gone->key != key; link = &gone->child[key > gone->key])
    path[depth++] = link;
  if (gone == NULL) return 0;
  if (gone->child[0] == NULL || gone->child[1] == NULL) {
    *link = gone->child[gone->child[0] == NULL];
  } else {
    /* The in-order successor takes the node's place and height; the path
     * goes on down to where the successor was, its right subtree there. */
    size_t at = depth;
    path[depth++] = link;
    gmr_avl_node_t **s = &gone->child[1];
    for (; (*s)->child[0] != NULL; s = &(*s)->child[0])
      path[depth++] = s;
    gmr_avl_node_t *succ = *s;
    *s = succ->child[1];
    succ->child[0] = gone->child[0];
    succ->child[1] = gone->child[1];
    succ->height = gone->height;
    *link = succ;
    if (depth > at + 1) path[at + 1] = &succ->child[1]; /* was &gone->child[1] */
  }
  for (int done = 0; !done && depth > 0;) {
    link = path[--depth];
    *link = settle(*link, &done);
  }
  gone->child[0] = t->spare;
  t->spare = gone;
  --t->count;
  return 1;
}

static void clear(gmr_avl_node_t *n, void (*fn)(gmr_avl_node_t *n, void *ud), void *ud) {
  while (n != NULL) { /* recurse on the left, loop on the right */
    clear(n->child[0], fn, ud);
    gmr_avl_node_t *right = n->child[1];
    if (fn != NULL) fn(n, ud);
    gmr__free(n);
    n = right;
  }
}

void gmr__avl_clear(gmr_avl_t *t, void (*fn)(gmr_avl_node_t *n, void *ud), void *ud) {
  clear(t->root, fn, ud);
  while (t->spare != NULL) {
    gmr_avl_node_t *n = t->spare;
    t->spare = n->child[0];
    gmr__free(n);
  }
  t->root = NULL;
  t->count = 0;
}
