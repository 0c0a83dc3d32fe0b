/* avl.h: an ordered map from 64-bit keys to two payload words, as an AVL tree.
 *
 * For tables whose keys come from outside (a trace's recorded pointers, the
 * ranges a policy asks the simulator for): every operation costs
 * O(log n) whatever the keys are, unlike a hash table, whose chosen keys can
 * all collide.  Nodes come from gmr__malloc, so a host fault injected by a
 * test reaches gmr__avl_insert as GMR_ENOMEM.  Removed nodes are kept and
 * reused, so a table whose size goes up and down allocates only at new
 * peaks (an allocation that reuses a range needs no host memory).
 * Synchronization: none; the owner locks.  See Note [AVL invariants].
 */
#ifndef GMR_AVL_H
#define GMR_AVL_H

#include <stddef.h>
#include <stdint.h>

/* Note [AVL invariants]
 * For every node n:
 *   keys in n->child[0] < n->key < keys in n->child[1]
 *   n->height = 1 + max(height(child[0]), height(child[1])),  height(NULL) = 0
 *   |height(child[0]) - height(child[1])| <= 1
 * so height <= 1.44 log2(count + 2).
 */
typedef struct gmr_avl_node_s {
  uint64_t key;
  uint64_t val; /* payload */
  uint32_t aux; /* payload */
  int32_t height;
  struct gmr_avl_node_s *child[2];
} gmr_avl_node_t;

typedef struct gmr_avl_s {
  gmr_avl_node_t *root;
  size_t count;
  gmr_avl_node_t *spare; /* removed nodes kept for reuse, linked by child[0] */
} gmr_avl_t;

/* Add key -> (val, aux).  @return 0, 1 (the key is present; nothing changes),
 * GMR_ENOMEM */
int gmr__avl_insert(gmr_avl_t *t, uint64_t key, uint64_t val, uint32_t aux);
/* The node of `key`, or NULL.  Its payload may be changed in place. */
gmr_avl_node_t *gmr__avl_find(const gmr_avl_t *t, uint64_t key);
/* The node with the greatest key <= `key`, or NULL. */
gmr_avl_node_t *gmr__avl_floor(const gmr_avl_t *t, uint64_t key);
/* Remove `key`.  @return 1 when it was present, 0 otherwise. */
int gmr__avl_erase(gmr_avl_t *t, uint64_t key);
/* Remove every node, calling fn (when not NULL) on each first, and free
 * every node, the kept ones included. */
void gmr__avl_clear(gmr_avl_t *t, void (*fn)(gmr_avl_node_t *n, void *ud), void *ud);

#endif /* GMR_AVL_H */
