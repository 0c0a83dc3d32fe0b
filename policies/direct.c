/* direct.c: the `direct` policy, every allocation one device reservation.
 *
 * No caching, no rounding beyond the device's own: gmr_alloc is cudaMalloc
 * and gmr_free is cudaFree.  It is the baseline every report compares
 * against (reserved == requested), and what JAX calls the `platform`
 * allocator.  Each reservation is its own segment holding one block.
 *
 * Records of freed blocks are kept for reuse (up to DIRECT_SPARE_MAX), so
 * the host allocator stays off the path of an allocation.
 * Map: Note [Invariants].
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"

/* Note [Invariants]
 * Invariants:
 *   allocated_bytes.current = requested_bytes.current = Σ live sizes
 *   allocations.current = number of records in the live list
 *   n_spare = number of records in the spare list <= DIRECT_SPARE_MAX
 * Synchronization: not concurrent; every op runs under the instance's lock,
 * taken by the policy.h wrappers (one op at a time).
 */

#define DIRECT_SPARE_MAX 4096 /* records kept for reuse, at most */

typedef struct direct_rec_s {
  void *ptr;
  size_t size;
  gmr_stream_t stream;
  struct direct_rec_s *prev, *next; /* the live list */
} direct_rec_t;

typedef struct direct_s {
  gmr_policy_t base;      /* must be first */
  direct_rec_t *live;     /* head of the live list */
  direct_rec_t *spare;    /* records for reuse, linked through `next` */
  size_t n_spare;         /* records in the spare list */
  gmr_stat_t allocated;   /* bytes */
  gmr_stat_t allocations; /* count */
  uint64_t num_allocs, num_frees, ooms;
} direct_t;

static int direct_create(const void *opts, gmr_backend_t *be, const gmr_policy_cfg_t *upstream,
                         gmr_policy_t **out) {
  direct_t *d = gmr__calloc(1, sizeof *d);
  if (d == NULL) return gmr__error_set(GMR_ENOMEM, "direct: out of host memory");
  d->base.ops = &gmr__direct_policy;
  d->base.backend = be;
  *out = &d->base;
  return 0;
}

static void direct_destroy(gmr_policy_t *self) {
  direct_t *d = (direct_t *)self;
  for (direct_rec_t *r = d->live, *next; r; r = next) {
    next = r->next;
    gmr__backend_release(self->backend, r->ptr, r->size, r->stream);
    gmr__free(r);
  }
  for (direct_rec_t *r = d->spare, *next; r; r = next) {
    next = r->next;
    gmr__free(r);
  }
  gmr__free(d);
}

static direct_rec_t *direct_rec_new(direct_t *d) {
  direct_rec_t *r = d->spare;
  if (r == NULL) return gmr__malloc(sizeof *r);
  d->spare = r->next;
  --d->n_spare;
  return r;
}

static void direct_rec_release(direct_t *d, direct_rec_t *r) {
  if (d->n_spare == DIRECT_SPARE_MAX) {
    gmr__free(r);
    return;
  }
  r->next = d->spare;
  d->spare = r;
  ++d->n_spare;
}

/* see Note [Invariants] */
static int direct_alloc(gmr_policy_t *self, size_t size, gmr_stream_t s, gmr_block_t *out) {
  direct_t *d = (direct_t *)self;
  direct_rec_t *r = direct_rec_new(d);
  if (r == NULL) return gmr__error_set(GMR_ENOMEM, "direct: out of host memory");
  void *ptr;
  int err = gmr__backend_reserve(self->backend, size, s, &ptr);
  if (err != 0) {
    direct_rec_release(d, r);
    if (err == GMR_ENOMEM) {
      ++d->ooms;
      size_t free_b = 0, total = 0;
      gmr__backend_mem_info(self->backend, &free_b, &total);
      char want[32], fr[32], tot[32], held[32];
      gmr__format_size(size, want, sizeof want);
      gmr__format_size(free_b, fr, sizeof fr);
      gmr__format_size(total, tot, sizeof tot);
      gmr__format_size((uint64_t)d->allocated.current, held, sizeof held);
      return gmr__error_set(GMR_ENOMEM,
                            "out of memory. Tried to allocate %s. The device has a total "
                            "capacity of %s of which %s is free; this runtime holds %s "
                            "(policy direct: no cache to release).",
                            want, tot, fr, held);
    }
    return err;
  }
  *r = (direct_rec_t){ptr, size, s, NULL, d->live};
  if (d->live) d->live->prev = r;
  d->live = r;
  gmr__stat_increase(&d->allocated, (int64_t)size);
  gmr__stat_increase(&d->allocations, 1);
  ++d->num_allocs;
  *out = (gmr_block_t){.ptr = ptr, .size = size, .handle = r};
  return 0;
}

static int direct_free(gmr_policy_t *self, const gmr_block_t *blk) {
  direct_t *d = (direct_t *)self;
  direct_rec_t *r = blk->handle;
  int err = gmr__backend_release(self->backend, r->ptr, r->size, blk->stream);
  if (err != 0) return err;
  if (r->prev)
    r->prev->next = r->next;
  else
    d->live = r->next;
  if (r->next) r->next->prev = r->prev;
  gmr__stat_decrease(&d->allocated, (int64_t)r->size);
  gmr__stat_decrease(&d->allocations, 1);
  ++d->num_frees;
  direct_rec_release(d, r);
  return 0;
}

static void direct_stats(gmr_policy_t *self, gmr_stats_t *st) {
  direct_t *d = (direct_t *)self;
  st->allocated_bytes = st->requested_bytes = st->active_bytes = (uint64_t)d->allocated.current;
  st->peak_allocated_bytes = st->peak_requested_bytes = st->peak_active_bytes =
      (uint64_t)d->allocated.peak;
  st->allocations = (uint64_t)d->allocations.current;
  st->peak_allocations = (uint64_t)d->allocations.peak;
  st->num_allocs = d->num_allocs;
  st->num_frees = d->num_frees;
  st->ooms = d->ooms;
}

static void direct_reset_peak(gmr_policy_t *self) {
  direct_t *d = (direct_t *)self;
  gmr__stat_reset_peak(&d->allocated);
  gmr__stat_reset_peak(&d->allocations);
}

static void direct_reset_accumulated(gmr_policy_t *self) {
  direct_t *d = (direct_t *)self;
  gmr__stat_reset_accumulated(&d->allocated);
  gmr__stat_reset_accumulated(&d->allocations);
  d->num_allocs = d->num_frees = d->ooms = 0;
}

static int rec_by_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)(*(direct_rec_t *const *)a)->ptr;
  uintptr_t y = (uintptr_t)(*(direct_rec_t *const *)b)->ptr;
  return x < y ? -1 : x > y;
}

static int direct_walk(gmr_policy_t *self, gmr_walk_cb cb, void *ud) {
  direct_t *d = (direct_t *)self;
  size_t n = (size_t)d->allocations.current;
  direct_rec_t **v = gmr__malloc((n ? n : 1) * sizeof *v);
  if (v == NULL) return gmr__error_set(GMR_ENOMEM, "direct: out of host memory");
  size_t i = 0;
  for (direct_rec_t *r = d->live; r; r = r->next)
    v[i++] = r;
  qsort(v, n, sizeof *v, rec_by_address);
  int stop = 0;
  for (i = 0; i < n && !stop; ++i) {
    gmr_walk_entry_t seg = {.is_segment = 1,
                            .address = (uintptr_t)v[i]->ptr,
                            .size = v[i]->size,
                            .stream = v[i]->stream,
                            .pool = "device"};
    gmr_walk_entry_t blk = seg;
    blk.is_segment = 0;
    blk.requested = v[i]->size;
    blk.state = GMR_BLOCK_ALLOCATED;
    stop = cb(&seg, ud) || cb(&blk, ud);
  }
  gmr__free(v);
  return 0;
}

static int direct_check(gmr_policy_t *self) {
  direct_t *d = (direct_t *)self;
  int64_t n = 0, bytes = 0;
  for (direct_rec_t *r = d->live; r; r = r->next) {
    ++n;
    bytes += (int64_t)r->size;
    if (r->next && r->next->prev != r)
      return gmr__error_set(GMR_EINVAL, "direct: the live list is broken at %p", r->ptr);
  }
  if (n != d->allocations.current || bytes != d->allocated.current)
    return gmr__error_set(GMR_EINVAL,
                          "direct: %lld live records of %lld bytes, but the stats say %lld "
                          "allocations of %lld bytes",
                          (long long)n, (long long)bytes, (long long)d->allocations.current,
                          (long long)d->allocated.current);
  return 0;
}

static const gmr_opt_desc_t direct_opts_desc[] = {{.key = NULL}};

const gmr_policy_ops_t gmr__direct_policy = {
    .name = "direct",
    .help = "Every allocation is one device reservation (cudaMalloc), every free gives it back "
            "(cudaFree): the baseline with no cache, like JAX's `platform` allocator.",
    .opts_size = 0,
    .opts_desc = direct_opts_desc,
    .create = direct_create,
    .destroy = direct_destroy,
    .alloc = direct_alloc,
    .free = direct_free,
    .stats = direct_stats,
    .reset_peak = direct_reset_peak,
    .reset_accumulated = direct_reset_accumulated,
    .walk = direct_walk,
    .check = direct_check,
};
