/* backend.h: the contract between policies and devices (mechanism only).
 *
 * A backend reserves and releases raw device ranges, maps physical pages
 * into a reserved virtual range (for expandable segments and VMM growth),
 * creates physical pages as handles that may be mapped at several virtual
 * addresses at once (the stitch policy's aliasing), tells whether a stream
 * is being captured into a CUDA graph, reports memory info, records and
 * queries events on streams, and keeps a clock.  Implementations: sim.c
 * (the simulated device) and cuda.c (the only file with CUDA calls); gate.c
 * is a decorator between a runtime's policies and its device.  A NULL slot
 * means "unsupported".
 *
 * Rules and synchronization: see Note [Backend rules].
 */
#ifndef GMR_BACKEND_H
#define GMR_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>

#include "core/internal.h"
#include "gmr.h"

typedef struct gmr_backend_s gmr_backend_t;
typedef void *gmr_event_t;
typedef uint64_t gmr_phys_t; /* a physical page handle (CUmemGenericAllocationHandle) */

/* Note [Backend rules]
 *  - ops are called only through the gmr__backend_* wrappers below, which
 *    count device operations and reserved bytes for every policy;
 *  - reserve takes any size > 0 (like cudaMalloc); sizes given to map and
 *    va_reserve are multiples of `granularity`;
 *  - unmap takes exactly a range that one map call mapped;
 *  - 0 is success; GMR_ENOMEM means the device is out of memory (a policy may
 *    free its cache and retry); GMR_EDEVICE is any other device failure, with
 *    the device's own text in the thread's last error.
 *
 * Synchronization: backends are thread-safe; the wrappers' counters are
 * atomics.
 */
/* One process's memory on the device (proc_usage). */
typedef struct gmr_proc_usage_s {
  unsigned pid;
  uint64_t bytes;
} gmr_proc_usage_t;

typedef struct gmr_backend_ops_s {
  const char *name; /* "sim", "cuda" */
  /* Physical ranges: reserve `size` bytes of device memory.  `s` is the
   * stream of the request the range is reserved, released, mapped or
   * unmapped for (NULL: none, or every stream's); a device ignores it, a
   * decorator may use it. */
  int (*reserve)(gmr_backend_t *self, size_t size, gmr_stream_t s, void **out_ptr);
  int (*release)(gmr_backend_t *self, void *ptr, size_t size, gmr_stream_t s);
  /* Virtual ranges: address space only, no memory behind it. */
  int (*va_reserve)(gmr_backend_t *self, size_t size, void **out_base);
  int (*va_release)(gmr_backend_t *self, void *base, size_t size);
  /* Back [addr, addr+size) of a reserved virtual range with new memory, and
   * make it accessible; undo with unmap of the same range. */
  int (*map)(gmr_backend_t *self, void *addr, size_t size, gmr_stream_t s);
  int (*unmap)(gmr_backend_t *self, void *addr, size_t size, gmr_stream_t s);
  int (*mem_info)(gmr_backend_t *self, size_t *out_free, size_t *out_total);
  /* A name of the device that is the same in every process: the GPU UUID
   * ("GPU-xxxxxxxx-...") for CUDA, "sim<ordinal>-<capacity>" for the simulator. */
  int (*device_id)(gmr_backend_t *self, char *buf, size_t len);
  /* The processes holding memory on the device, as NVML's compute
   * processes: up to `max` into out, *n written (PyTorch's OOM message names
   * them).  NULL or an error: not known (no NVML). */
  int (*proc_usage)(gmr_backend_t *self, gmr_proc_usage_t *out, size_t max, size_t *n);
  /* Physical pages as handles (cuMemCreate / cuMemRelease): `size` is a
   * multiple of `granularity`.  A handle holds memory until released; it may
   * be mapped at any number of virtual addresses meanwhile. */
  int (*phys_create)(gmr_backend_t *self, size_t size, gmr_phys_t *out);
  int (*phys_release)(gmr_backend_t *self, gmr_phys_t h, size_t size);
  /* Map [offset, offset+size) of handle h at addr, inside a reserved
   * virtual range, without access rights yet (cuMemMap); set_access makes
   * [addr, addr+size) readable and writable (one cuMemSetAccess, which may
   * span several maps); phys_unmap undoes exactly one phys_map. */
  int (*phys_map)(gmr_backend_t *self, void *addr, size_t size, gmr_phys_t h, size_t offset);
  int (*set_access)(gmr_backend_t *self, void *addr, size_t size);
  int (*phys_unmap)(gmr_backend_t *self, void *addr, size_t size);
  /* 1 while stream s is being captured into a CUDA graph, 0 otherwise. */
  int (*stream_capturing)(gmr_backend_t *self, gmr_stream_t s);
  /* Events: record on a stream; query returns 0 (complete), 1 (not ready) or
   * an error; sync waits for completion. */
  int (*event_record)(gmr_backend_t *self, gmr_stream_t s, gmr_event_t *out_ev);
  int (*event_query)(gmr_backend_t *self, gmr_event_t ev);
  int (*event_sync)(gmr_backend_t *self, gmr_event_t ev);
  void (*event_destroy)(gmr_backend_t *self, gmr_event_t ev);
  int (*stream_sync)(gmr_backend_t *self, gmr_stream_t s);
  int (*device_sync)(gmr_backend_t *self);
  uint64_t (*now_ns)(gmr_backend_t *self);
  void (*destroy)(gmr_backend_t *self);
  /* Pinned host memory (cuMemHostAlloc / cuMemFreeHost) and copies between
   * it and mapped device memory, queued on stream s (cuMemcpyDtoHAsync,
   * cuMemcpyHtoDAsync): the copy is complete once s is synchronized.  For
   * sleep and wake (lib/backend/sleep.c); NULL: unsupported. */
  int (*host_alloc)(gmr_backend_t *self, size_t size, void **out);
  void (*host_free)(gmr_backend_t *self, void *p, size_t size);
  int (*copy_to_host)(gmr_backend_t *self, void *dst, const void *src, size_t size, gmr_stream_t s);
  int (*copy_to_device)(gmr_backend_t *self, void *dst, const void *src, size_t size,
                        gmr_stream_t s);
} gmr_backend_ops_t;

/* Device-level counters, kept by the wrappers for every backend (see
 * Note [Device counters] in backend.c). */
typedef struct gmr_backend_counters_s {
  _Atomic uint64_t reserved_bytes; /* reserve + map, minus release + unmap */
  _Atomic uint64_t peak_reserved_bytes;
  _Atomic uint64_t segments; /* live reserve ranges */
  _Atomic uint64_t peak_segments;
  _Atomic uint64_t device_allocs; /* successful reserve + map calls */
  _Atomic uint64_t device_frees;  /* release + unmap calls */
} gmr_backend_counters_t;

struct gmr_backend_s {
  const gmr_backend_ops_t *ops;
  size_t granularity; /* bytes; reserve/map sizes are multiples of it */
  int device;         /* the device ordinal (CUDA's, or the simulated device's) */
  gmr_backend_counters_t counters;
  /* A backend that forwards to another one (a decorator: the limit policy's
   * capped backend, the recording layer): that one; NULL otherwise. */
  gmr_backend_t *forwards_to;
};

/* The ops of a decorator that only pass a call on, unchanged, to the backend
 * it forwards to (be->forwards_to): a decorator names these in its ops table
 * for every op it does not change (the gate, the recording layer). */
int gmr__backend_forward_va_reserve(gmr_backend_t *be, size_t size, void **out_base);
int gmr__backend_forward_va_release(gmr_backend_t *be, void *base, size_t size);
int gmr__backend_forward_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total);
int gmr__backend_forward_device_id(gmr_backend_t *be, char *buf, size_t len);
int gmr__backend_forward_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out);
int gmr__backend_forward_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size);
int gmr__backend_forward_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h,
                                  size_t off);
int gmr__backend_forward_set_access(gmr_backend_t *be, void *addr, size_t size);
int gmr__backend_forward_phys_unmap(gmr_backend_t *be, void *addr, size_t size);
int gmr__backend_forward_stream_capturing(gmr_backend_t *be, gmr_stream_t s);
int gmr__backend_forward_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev);
int gmr__backend_forward_event_query(gmr_backend_t *be, gmr_event_t ev);
int gmr__backend_forward_event_sync(gmr_backend_t *be, gmr_event_t ev);
void gmr__backend_forward_event_destroy(gmr_backend_t *be, gmr_event_t ev);
int gmr__backend_forward_stream_sync(gmr_backend_t *be, gmr_stream_t s);
int gmr__backend_forward_device_sync(gmr_backend_t *be);
uint64_t gmr__backend_forward_now_ns(gmr_backend_t *be);
int gmr__backend_forward_host_alloc(gmr_backend_t *be, size_t size, void **out);
void gmr__backend_forward_host_free(gmr_backend_t *be, void *p, size_t size);
int gmr__backend_forward_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                      gmr_stream_t s);
int gmr__backend_forward_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                        gmr_stream_t s);

/* Constructors (one per backend). */
int gmr__sim_backend_new(const gmr_sim_options_t *opts, gmr_backend_t **out); /* device 0 */
/* Simulated device `device` (0..30): address-only, its addresses come from
 * its own window, so no two ordinals share an address; GMR_EINVAL otherwise. */
int gmr__sim_backend_new_on(const gmr_sim_options_t *opts, int device, gmr_backend_t **out);
int gmr__cuda_backend_new(int device, gmr_backend_t **out);
/* 1 when a CUDA device can be used, 0 otherwise (no toolkit, no driver...). */
int gmr__cuda_available(void);
bool gmr__backend_is_sim(const gmr_backend_t *be);
void gmr__backend_free(gmr_backend_t *be);

/* Wrappers: the only way policies reach the ops. */
int gmr__backend_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr);
int gmr__backend_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s);
int gmr__backend_va_reserve(gmr_backend_t *be, size_t size, void **out_base);
int gmr__backend_va_release(gmr_backend_t *be, void *base, size_t size);
int gmr__backend_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s);
int gmr__backend_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s);
int gmr__backend_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total);
int gmr__backend_device_id(gmr_backend_t *be, char *buf, size_t len);
/* The first backend down the chain that has proc_usage answers; GMR_ENOTSUP
 * when none has (the simulator). */
int gmr__backend_proc_usage(gmr_backend_t *be, gmr_proc_usage_t *out, size_t max, size_t *n);
/* Physical pages: create/release count as reserved bytes and device
 * allocations/frees; map/unmap of a handle count as device calls only. */
int gmr__backend_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out);
int gmr__backend_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size);
int gmr__backend_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t offset);
int gmr__backend_set_access(gmr_backend_t *be, void *addr, size_t size);
int gmr__backend_phys_unmap(gmr_backend_t *be, void *addr, size_t size);
int gmr__backend_stream_capturing(gmr_backend_t *be, gmr_stream_t s);
static inline bool gmr__backend_has_phys(const gmr_backend_t *be) {
  return be->ops->phys_create != NULL && be->ops->phys_map != NULL && be->ops->va_reserve != NULL;
}
int gmr__backend_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev);
int gmr__backend_event_query(gmr_backend_t *be, gmr_event_t ev);
int gmr__backend_event_sync(gmr_backend_t *be, gmr_event_t ev);
void gmr__backend_event_destroy(gmr_backend_t *be, gmr_event_t ev);
int gmr__backend_stream_sync(gmr_backend_t *be, gmr_stream_t s);
int gmr__backend_device_sync(gmr_backend_t *be);
uint64_t gmr__backend_now_ns(gmr_backend_t *be);
static inline bool gmr__backend_has_vmm(const gmr_backend_t *be) {
  return be->ops->va_reserve != NULL && be->ops->map != NULL;
}
void gmr__backend_counters_reset_peak(gmr_backend_t *be);
/* Pinned host memory and copies (GMR_ENOTSUP when the backend has none). */
int gmr__backend_host_alloc(gmr_backend_t *be, size_t size, void **out);
void gmr__backend_host_free(gmr_backend_t *be, void *p, size_t size);
int gmr__backend_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                              gmr_stream_t s);
int gmr__backend_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                                gmr_stream_t s);
static inline bool gmr__backend_has_copies(const gmr_backend_t *be) {
  return be->ops->host_alloc != NULL && be->ops->copy_to_host != NULL &&
         be->ops->copy_to_device != NULL;
}

void gmr__backend_counters_reset_accumulated(gmr_backend_t *be);

/* Simulator controls used by the public gmr_sim_* calls. */
typedef struct gmr_sim_s gmr_sim_t;
gmr_sim_t *gmr__sim_of(gmr_backend_t *be); /* NULL unless a simulator */
void gmr__sim_fail_nth(gmr_sim_t *sim, uint64_t k);
void gmr__sim_fail_from(gmr_sim_t *sim, uint64_t k); /* the k-th and every later call */
void gmr__sim_fail_above(gmr_sim_t *sim, uint64_t bytes);
void gmr__sim_fail_all(gmr_sim_t *sim, int on);
int gmr__sim_stream_enqueue(gmr_sim_t *sim, gmr_stream_t s);
int gmr__sim_stream_complete(gmr_sim_t *sim, gmr_stream_t s);
/* One unit of work on s that uses [ptr, ptr + size) until it completes. */
int gmr__sim_stream_use(gmr_sim_t *sim, gmr_stream_t s, const void *ptr, size_t size);
void gmr__sim_set_clock(gmr_sim_t *sim, uint64_t ns);
void gmr__sim_place_next(gmr_sim_t *sim, uintptr_t addr);
/* Host-backed: reuse host pages (see sim.c); a caller that writes into
 * blocks then checks each access with gmr__sim_covers.  GMR_EINVAL (and no
 * change) unless host-backed and no page is live or mapped yet. */
int gmr__sim_host_reuse(gmr_sim_t *sim);
/* With page reuse: give the host back the pages of the arena that hold no
 * device memory (free ranges, unmapped parts of virtual ranges) and the
 * pooled pages (a long run bounds its memory so). */
void gmr__sim_host_trim(gmr_sim_t *sim);
/* Does [ptr, ptr + size) lie inside one live reservation, or on mappings
 * that tile it, each backed or page-mapped with access set?  *token: which
 * reservation (> 0; another one reserved later at the same address has
 * another token, unless 2^32 reservations came between), or 0 on mappings. */
bool gmr__sim_covers(gmr_sim_t *sim, const void *ptr, size_t size, uint64_t *token);
void gmr__sim_stream_capture(gmr_sim_t *sim, gmr_stream_t s, int on);
void gmr__sim_counters(gmr_sim_t *sim, gmr_sim_counters_t *out);
void gmr__sim_call_bytes(gmr_sim_t *sim, gmr_sim_call_bytes_t *out);

#endif /* GMR_BACKEND_H */
