/* avl.c: the AVL tree of avl.h.
 *
 * Insertion and removal descend recursively (the depth is bounded by the
 * height, <= 1.44 log2(n + 2): at most 92 levels for 2^64 nodes) and
 * rebalance on the way back up with single or double rotations.  Removal of
 * a node with two children moves its in-order successor into its place.
 */
#include "core/avl.h"
#include "core/internal.h"

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
 * height by at most 2. */
static gmr_avl_node_t *balance(gmr_avl_node_t *n) {
  update(n);
  int32_t diff = height(n->child[1]) - height(n->child[0]);
  if (diff >= -1 && diff <= 1) return n;
  int dir = diff > 0; /* the heavy side */
  gmr_avl_node_t *c = n->child[dir];
  if (height(c->child[!dir]) > height(c->child[dir])) n->child[dir] = rotate(c, !dir);
  return rotate(n, dir);
}

static gmr_avl_node_t *insert(gmr_avl_node_t *n, gmr_avl_node_t *fresh, int *found) {
  if (n == NULL) return fresh;
  if (fresh->key == n->key) {
    *found = 1;
    return n;
  }
  int dir = fresh->key > n->key;
  n->child[dir] = insert(n->child[dir], fresh, found);
  return *found ? n : balance(n);
}

int gmr__avl_insert(gmr_avl_t *t, uint64_t key, uint64_t val, uint32_t aux) {
  if (gmr__avl_find(t, key) != NULL) return 1;
  gmr_avl_node_t *fresh = t->spare;
  if (fresh != NULL)
    t->spare = fresh->child[0];
  else if ((fresh = gmr__malloc(sizeof *fresh)) == NULL)
    return GMR_ENOMEM;
  *fresh = (gmr_avl_node_t){key, val, aux, 1, {NULL, NULL}};
  int found = 0;
  t->root = insert(t->root, fresh, &found);
  ++t->count;
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

/* Detach the smallest node of subtree n into *min; returns the new subtree. */
static gmr_avl_node_t *detach_min(gmr_avl_node_t *n, gmr_avl_node_t **min) {
  if (n->child[0] == NULL) {
    *min = n;
    return n->child[1];
  }
  n->child[0] = detach_min(n->child[0], min);
  return balance(n);
}

static gmr_avl_node_t *erase(gmr_avl_node_t *n, uint64_t key, gmr_avl_node_t **gone) {
  if (n == NULL) return NULL;
  if (key != n->key) {
    int dir = key > n->key;
    n->child[dir] = erase(n->child[dir], key, gone);
    return *gone ? balance(n) : n;
  }
  *gone = n;
  if (n->child[0] == NULL) return n->child[1];
  if (n->child[1] == NULL) return n->child[0];
  gmr_avl_node_t *succ = NULL;
  gmr_avl_node_t *right = detach_min(n->child[1], &succ);
  succ->child[0] = n->child[0];
  succ->child[1] = right;
  return balance(succ);
}

int gmr__avl_erase(gmr_avl_t *t, uint64_t key) {
  gmr_avl_node_t *gone = NULL;
  t->root = erase(t->root, key, &gone);
  if (gone == NULL) return 0;
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
