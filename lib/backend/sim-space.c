/* sim-space.c: the simulator's address space, first fit over the gaps.
 *
 * The fake addresses of an address-only device, and the arena of a
 * host-backed one with page reuse, are handed out here: reservations,
 * virtual ranges and arena blocks, first fit at any alignment, with bounds
 * on the largest gap per chunk, group and super-group that let a take skip
 * what cannot hold it, however many ranges a trace keeps live.  Only
 * sim_space_t is touched, so the space can be tested without a device
 * (Note [First-fit index]).
 */
#include <string.h>

#include "backend/sim-internal.h"

/* Note [First-fit index]
 * ~~~~~~~~~~~~~~~~~~~~~~
 * The space [lo, hi) is the head gap and the ranges taken from it, each
 * followed by its gap: r_0 < r_1 < ... (in chunk order, then in each chunk)
 * with lo + head_gap = r_0.addr, r_j.addr + r_j.size + r_j.gap =
 * r_{j+1}.addr, and the last one's = hi (no range: head_gap = hi - lo);
 * r_j.size > 0, so the free ranges (the non-empty gaps) are disjoint and
 * never adjacent.  Chunks: 1 <= k.n <= SIM_SEG_CAP, and the bounds
 * chunk_max, group_max and super_max below.
 *
 * The ranges taken from the space (address-only reservations, virtual
 * ranges, arena blocks), in address order, each with the free gap that
 * follows it up to the next range (or the space's end); the gap before
 * the first range is head_gap.  The free ranges are exactly the non-empty
 * gaps, so a release merges with both neighbours by giving its range and
 * its gap to the gap before it, and a take inserts one range into a gap.
 * The ranges are sorted runs of at most SIM_SEG_CAP (chunks); each chunk
 * has a bound on its largest gap (chunk_max), and each group of G =
 * SIM_SEG_GROUP chunks a bound on theirs (group_max), and each S =
 * SIM_SEG_SUPER groups a bound on theirs (super_max):
 *   chunk_max[c] >= max { e.gap : e in chunks[c] }
 *   group_max[g] >= max { chunk_max[c] : g·G <= c < (g+1)·G }
 *   super_max[s] >= max { group_max[g] : s·S <= g < (s+1)·S }
 * A gap that grows raises them; one that shrinks leaves them (still
 * bounds).  First fit skips a super-group, a group, then a chunk, whose
 * bound is below the request, scans the chunks it cannot skip, and makes
 * the bounds of a chunk (group, super-group) it went through without a fit
 * exact.  Groups count places in the arrays, from before the first chunk
 * (`first` places in: chunk c is at place first + c), so the first chunk
 * goes without moving the others; chunks that come or go elsewhere move the
 * groups' members: see groups_moved.  A change moves
 * at most a chunk's worth of ranges (a chunk that fills is split in
 * halves; one that empties is dropped; two neighbours that fit in half a
 * chunk are joined).  Finding an address is a binary search over the
 * chunks' first ranges, then over one chunk.
 */

/* After chunk c came or went (those after it moved by one place): the
 * bounds of the groups from c's on.  c's group is computed again; a later
 * group lost a chunk at one end and gained the chunk now at the other (or
 * is new: 0), so raising its bound (and its super-group's) by the chunks
 * at both ends keeps them bounds: O(1) a group. */
static void groups_moved(sim_space_t *sp, size_t c) {
  const size_t f = sp->first, end = f + sp->n_chunks, G = SIM_SEG_GROUP;
  const size_t *mx = sp->max_mem; /* by place */
  for (size_t g = (f + c) / G; g * G < end; ++g) {
    size_t lo = g * G > f ? g * G : f, hi = (g + 1) * G < end ? (g + 1) * G - 1 : end - 1, m = 0;
    if (g == (f + c) / G) {
      for (size_t j = lo; j <= hi; ++j)
        if (mx[j] > m) m = mx[j];
    } else {
      m = sp->group_max[g];
      if (mx[lo] > m) m = mx[lo];
      if (mx[hi] > m) m = mx[hi];
    }
    sp->group_max[g] = m;
    if (m > sp->super_max[g / SIM_SEG_SUPER]) sp->super_max[g / SIM_SEG_SUPER] = m;
  }
}

/* A gap of chunk c grew to (or appeared with) `size` bytes. */
static void seg_grew(sim_space_t *sp, size_t c, size_t size) {
  if (size <= sp->chunk_max[c]) return;
  sp->chunk_max[c] = size;
  size_t g = (sp->first + c) / SIM_SEG_GROUP;
  if (size > sp->group_max[g]) sp->group_max[g] = size;
  if (size > sp->super_max[g / SIM_SEG_SUPER]) sp->super_max[g / SIM_SEG_SUPER] = size;
}

/* Every group's and super-group's bound computed again from the chunks'
 * (after the chunks moved to other places). */
static void groups_rebuild(sim_space_t *sp) {
  const size_t f = sp->first, end = f + sp->n_chunks, G = SIM_SEG_GROUP, S = SIM_SEG_SUPER;
  for (size_t g = 0; g * G < end; ++g) {
    size_t m = 0;
    for (size_t j = g * G > f ? g * G : f; j < (g + 1) * G && j < end; ++j)
      if (sp->max_mem[j] > m) m = sp->max_mem[j];
    sp->group_max[g] = m;
    if (g % S == 0 || m > sp->super_max[g / S]) sp->super_max[g / S] = m;
  }
}

/* Make room for chunk index c (an empty chunk there); false when out of
 * host memory (nothing changed).  At the arrays' end, the chunks move back
 * to place 0, into arrays that leave at least half of them free (so a move
 * of n chunks comes after n / 2 others came or went at the front). */
static bool chunk_add(sim_space_t *sp, size_t c) {
  const size_t G = SIM_SEG_GROUP, S = SIM_SEG_SUPER, nc = sp->n_chunks;
  size_t f = sp->first, need = f + nc + 1;
  bool move = need > sp->cap_chunks && f > 0;
  if (move) f = 0, need = sp->first >= (nc + 1) / 2 ? nc + 1 : 2 * (nc + 1);
  size_t groups = (sp->first + nc + G - 1) / G, now = (f + nc + G) / G;
  size_t ngroups = now > groups ? now : groups;
  bool ok =
      gmr__sim_grow((void **)&sp->chunks_mem, &sp->cap_chunks, need, sizeof *sp->chunks_mem) &&
      gmr__sim_grow((void **)&sp->max_mem, &sp->cap_max, need, sizeof *sp->max_mem) &&
      gmr__sim_grow((void **)&sp->group_max, &sp->cap_groups, ngroups, sizeof *sp->group_max) &&
      gmr__sim_grow((void **)&sp->super_max, &sp->cap_supers, (ngroups + S - 1) / S,
                    sizeof *sp->super_max);
  sim_chunk_t *k = NULL;
  if (ok && (k = sp->chunk_spare) != NULL)
    sp->chunk_spare = NULL;
  else if (ok)
    ok = (k = gmr__malloc(sizeof *k)) != NULL;
  if (ok && move) { /* back to place 0 */
    memmove(sp->chunks_mem, sp->chunks_mem + sp->first, nc * sizeof *sp->chunks_mem);
    memmove(sp->max_mem, sp->max_mem + sp->first, nc * sizeof *sp->max_mem);
    sp->first = 0;
  }
  sp->chunks = sp->chunks_mem + sp->first; /* the arrays may have moved */
  sp->chunk_max = sp->max_mem + sp->first;
  if (!ok) return false;
  k->n = 0;
  if (!move && now > groups) { /* a new group, maybe a new super-group */
    sp->group_max[now - 1] = 0;
    if ((now - 1) % S == 0) sp->super_max[(now - 1) / S] = 0;
  }
  memmove(&sp->chunks[c + 1], &sp->chunks[c], (nc - c) * sizeof *sp->chunks);
  memmove(&sp->chunk_max[c + 1], &sp->chunk_max[c], (nc - c) * sizeof *sp->chunk_max);
  sp->chunks[c] = k;
  sp->chunk_max[c] = 0;
  ++sp->n_chunks;
  if (move) groups_rebuild(sp);
  return true;
}

/* Drop chunk c (its ranges are gone or moved); one is kept for reuse. */
static void chunk_drop(sim_space_t *sp, size_t c) {
  sim_chunk_t *k = sp->chunks[c];
  if (sp->chunk_spare == NULL)
    sp->chunk_spare = k;
  else
    gmr__free(k);
  if (--sp->n_chunks == 0) { /* back to place 0 */
    sp->first = 0;
  } else if (c == 0) { /* the others keep their places, and so their groups */
    ++sp->first;
  } else {
    memmove(&sp->chunks[c], &sp->chunks[c + 1], (sp->n_chunks - c) * sizeof *sp->chunks);
    memmove(&sp->chunk_max[c], &sp->chunk_max[c + 1], (sp->n_chunks - c) * sizeof *sp->chunk_max);
    groups_moved(sp, c);
  }
  sp->chunks = sp->chunks_mem + sp->first;
  sp->chunk_max = sp->max_mem + sp->first;
}

/* Make room for one range at index *pi of chunk *pc (before the range
 * there, or after the last), which may then be in the chunk after (a full
 * chunk splits in halves; an index above the half moves, with the ranges
 * before it from the half on); with no chunk at all, one is made (*pc =
 * *pi = 0).  0 or GMR_ENOMEM (nothing changed). */
static int seg_room(sim_space_t *sp, size_t *pc, size_t *pi) {
  if (sp->n_chunks == 0) {
    if (!chunk_add(sp, 0)) return GMR_ENOMEM;
    groups_moved(sp, 0);
    *pc = *pi = 0;
    return 0;
  }
  sim_chunk_t *k = sp->chunks[*pc];
  if (k->n < SIM_SEG_CAP) return 0;
  if (!chunk_add(sp, *pc + 1)) return GMR_ENOMEM;
  sim_chunk_t *up = sp->chunks[*pc + 1];
  const size_t half = SIM_SEG_CAP / 2;
  memcpy(up->e, &k->e[half], (k->n - half) * sizeof *k->e);
  up->n = k->n - half;
  k->n = half;
  sp->chunk_max[*pc + 1] = sp->chunk_max[*pc]; /* a bound for both halves */
  groups_moved(sp, *pc + 1);
  if (*pi > half) {
    ++*pc;
    *pi -= half;
  }
  return 0;
}

/* Join chunks c and c + 1 when both fit in half a chunk. */
static void seg_tidy(sim_space_t *sp, size_t c) {
  if (c + 1 >= sp->n_chunks) return;
  sim_chunk_t *k = sp->chunks[c], *up = sp->chunks[c + 1];
  if (k->n + up->n > SIM_SEG_CAP / 2) return;
  memcpy(&k->e[k->n], up->e, up->n * sizeof *up->e);
  k->n += up->n;
  seg_grew(sp, c, sp->chunk_max[c + 1]); /* c's group may not be c + 1's */
  chunk_drop(sp, c + 1);
}

/* The range with the greatest start <= a: false when none. */
bool gmr__sim_seg_floor(const sim_space_t *sp, uintptr_t a, size_t *pc, size_t *pi) {
  size_t lo = 0, hi = sp->n_chunks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sp->chunks[mid]->e[0].addr <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return false;
  const sim_chunk_t *k = sp->chunks[lo - 1];
  size_t i = 0, j = k->n;
  while (i < j) {
    size_t mid = (i + j) / 2;
    if (k->e[mid].addr <= a)
      i = mid + 1;
    else
      j = mid;
  }
  *pc = lo - 1;
  *pi = i - 1;
  return true;
}

/* The gap after range (c, i), or the head gap when `head`: [*from,
 * *from + *gap). */
static void gap_of(const sim_space_t *sp, bool head, size_t c, size_t i, uintptr_t *from,
                   size_t *gap) {
  if (head) {
    *from = sp->lo;
    *gap = sp->head_gap;
  } else {
    const sim_seg_t *e = &sp->chunks[c]->e[i];
    *from = e->addr + e->size;
    *gap = e->gap;
  }
}

/* Take [a, a+size) out of the gap after range (c, i), or out of the head
 * gap when `head`, which holds it: a range of its own there (`rec`, when
 * not NULL: a reservation's req and aux; else SIM_SEG_OTHER), with the
 * rest of the gap after it. */
static int seg_insert(sim_space_t *sp, bool head, size_t c, size_t i, uintptr_t a, size_t size,
                      const sim_seg_t *rec) {
  uintptr_t from;
  size_t gap;
  gap_of(sp, head, c, i, &from, &gap);
  if (head)
    c = i = 0; /* the new range goes first */
  else
    ++i; /* the new range goes after (c, i) */
  if (seg_room(sp, &c, &i) != 0) return GMR_ENOMEM;
  /* The gap before a: head_gap, or that of the range before (c, i), which
   * a split may have moved to chunk c too (then i >= 1). */
  if (head)
    sp->head_gap = a - from;
  else
    gmr__sim_seg_at(sp, c, i - 1)->gap = a - from;
  sim_chunk_t *k = sp->chunks[c];
  size_t rest = from + gap - (a + size);
  memmove(&k->e[i + 1], &k->e[i], (k->n - i) * sizeof *k->e);
  k->e[i] = rec != NULL ? (sim_seg_t){a, size, rest, rec->req, rec->aux}
                        : (sim_seg_t){a, size, rest, SIM_SEG_OTHER, 0};
  ++k->n;
  seg_grew(sp, c, rest);
  return 0;
}

/* `size` bytes at `align` out of the gap after range (c, i) (the head gap
 * when `head`), at the gap's lowest such address: 0 (taken, *out), 1 (it
 * does not hold them), GMR_ENOMEM.  `rec`: see seg_insert. */
static int gap_take(sim_space_t *sp, bool head, size_t c, size_t i, size_t size, size_t align,
                    const sim_seg_t *rec, uintptr_t *out) {
  uintptr_t from;
  size_t gap;
  gap_of(sp, head, c, i, &from, &gap);
  uintptr_t start = (from + align - 1) / align * align;
  if (start + size > from + gap || start < from) return 1;
  if ((size != 0 || rec != NULL) && seg_insert(sp, head, c, i, start, size, rec) != 0)
    return GMR_ENOMEM; /* size 0 and no record: nothing to take */
  *out = start;
  return 0;
}

/* First fit: the lowest free range that holds `size` bytes at `align`.
 * The gaps of at least `size` bytes come in address order, and the first
 * one that still holds it once its start is aligned up is taken.  `rec`:
 * see seg_insert. */
int gmr__sim_space_take(sim_space_t *sp, size_t size, size_t align, const sim_seg_t *rec,
                        uintptr_t *out) {
  const size_t need = size ? size : 1; /* a free range is not empty */
  int got;
  if (sp->head_gap >= need && (got = gap_take(sp, true, 0, 0, size, align, rec, out)) != 1)
    return got;
  /* Over places: chunk c is at place f + c (Note [First-fit index]). */
  const size_t f = sp->first, end = f + sp->n_chunks, G = SIM_SEG_GROUP, S = SIM_SEG_SUPER;
  const size_t g0 = f / G, ng = (end + G - 1) / G;
  for (size_t s = g0 / S; s * S < ng; ++s) {
    if (sp->super_max[s] < need) continue;
    size_t gend = (s + 1) * S < ng ? (s + 1) * S : ng, smax = 0;
    for (size_t g = s * S > g0 ? s * S : g0; g < gend; ++g) {
      if (sp->group_max[g] >= need) {
        size_t cend = ((g + 1) * G < end ? (g + 1) * G : end) - f, gmax = 0;
        for (size_t c = (g * G > f ? g * G : f) - f; c < cend; ++c) {
          sim_chunk_t *k = sp->chunks[c];
          if (sp->chunk_max[c] >= need) {
            size_t most = 0;
            for (size_t i = 0; i < k->n; ++i) {
              size_t gap = k->e[i].gap;
              if (gap >= need && (got = gap_take(sp, false, c, i, size, align, rec, out)) != 1)
                return got;
              if (gap > most) most = gap;
            }
            sp->chunk_max[c] = most; /* scanned whole: the bound is exact now */
          }
          if (sp->chunk_max[c] > gmax) gmax = sp->chunk_max[c];
        }
        sp->group_max[g] = gmax; /* every chunk passed: exact over their bounds */
      }
      if (sp->group_max[g] > smax) smax = sp->group_max[g];
    }
    sp->super_max[s] = smax; /* every group passed: exact over their bounds */
  }
  return GMR_ENOMEM;
}

/* Take exactly [a, a+size) when it is free (for placement hints). */
int gmr__sim_space_take_at(sim_space_t *sp, uintptr_t a, size_t size, const sim_seg_t *rec) {
  size_t c = 0, i = 0; /* the gap at or before a is the only candidate */
  bool head = !gmr__sim_seg_floor(sp, a, &c, &i);
  uintptr_t from;
  size_t gap;
  gap_of(sp, head, c, i, &from, &gap);
  if (a < from || a + size > from + gap || gap == 0) return GMR_ENOMEM;
  return seg_insert(sp, head, c, i, a, size, rec);
}

/* Remove range i of chunk c: it and its gap join the gap before it. */
void gmr__sim_seg_remove(sim_space_t *sp, size_t c, size_t i) {
  sim_chunk_t *k = sp->chunks[c];
  size_t freed = k->e[i].size + k->e[i].gap;
  if (i > 0) {
    k->e[i - 1].gap += freed;
    seg_grew(sp, c, k->e[i - 1].gap);
  } else if (c > 0) {
    sim_chunk_t *p = sp->chunks[c - 1];
    p->e[p->n - 1].gap += freed;
    seg_grew(sp, c - 1, p->e[p->n - 1].gap);
  } else {
    sp->head_gap += freed;
  }
  memmove(&k->e[i], &k->e[i + 1], (k->n - i - 1) * sizeof *k->e);
  if (--k->n == 0) {
    chunk_drop(sp, c);
    if (c == sp->n_chunks) {
      if (c == 0) return;
      --c;
    }
  }
  if (sp->chunks[c]->n <= SIM_SEG_CAP / 2) { /* else it joins neither neighbour */
    seg_tidy(sp, c);
    if (c > 0) seg_tidy(sp, c - 1);
  }
}

/* Give back [a, a+size), a range taken for no reservation (a virtual
 * range, arena memory); one never taken is ignored. */
void gmr__sim_space_give(sim_space_t *sp, uintptr_t a, size_t size) {
  size_t c, i;
  if (!gmr__sim_seg_floor(sp, a, &c, &i)) return;
  sim_seg_t *r = gmr__sim_seg_at(sp, c, i);
  if (r->addr == a && r->size == size && r->req == SIM_SEG_OTHER) gmr__sim_seg_remove(sp, c, i);
}

/* The reservation (a, size) recorded as a range, or NULL. */
sim_seg_t *gmr__sim_seg_reserved(sim_space_t *sp, uintptr_t a, size_t size, size_t *pc,
                                 size_t *pi) {
  if (!gmr__sim_seg_floor(sp, a, pc, pi)) return NULL;
  sim_seg_t *r = gmr__sim_seg_at(sp, *pc, *pi);
  return r->addr == a && r->req == size && r->req != SIM_SEG_OTHER ? r : NULL;
}

void gmr__sim_space_clear(sim_space_t *sp) {
  for (size_t c = 0; c < sp->n_chunks; ++c)
    gmr__free(sp->chunks[c]);
  gmr__free(sp->chunk_spare);
  gmr__free(sp->chunks_mem);
  gmr__free(sp->max_mem);
  gmr__free(sp->group_max);
  gmr__free(sp->super_max);
}
