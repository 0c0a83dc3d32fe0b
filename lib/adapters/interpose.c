/* interpose.c: libgmr-preload.so, an LD_PRELOAD library that routes a whole
 * process's device allocations to gmr, with no change to the program:
 *
 *   LD_PRELOAD=libgmr-preload.so GMR_CONFIG=limit.yaml python3 train.py
 *
 * - The runtime and driver APIs' allocs, frees and memory queries go to the
 *   device's default runtime: see Note [What is routed].  Pointers gmr does
 *   not own go to the real driver or runtime.
 * - gmr's own CUDA calls pass straight through: see Note [Recursion].
 * - Also here: Note [Reported free memory], Note [VMM], Note [dlsym].
 * - The stream-ordered pool API (cuMemPool*, cuMemAllocFromPoolAsync...):
 *   interpose-pools.c, included below, Note [Memory pools].
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"

#define IP_EXPORT __attribute__((visibility("default")))
/* Code that dlsym runs: a sanitizer's runtime calls dlsym before it is set
 * up, so none of it may be instrumented. */
#define IP_RAW    __attribute__((no_sanitize("address", "thread", "undefined")))
#define IP_HIDDEN __attribute__((visibility("hidden")))

/* No CUDA header: the CUDA types are spelled with their ABI (CUresult and
 * cudaError_t are int enums, CUdeviceptr is unsigned long long, streams are
 * pointers, CUdevice is int). */
typedef int CUresult_t;              /* CUresult */
typedef int cudaError_x;             /* cudaError_t */
typedef unsigned long long CUdptr_t; /* CUdeviceptr */
typedef void *stream_t;              /* CUstream, cudaStream_t */

enum {
  IP_CUDA_SUCCESS = 0,
  IP_CUDA_ERROR_INVALID_VALUE = 1,
  IP_CUDA_ERROR_OUT_OF_MEMORY = 2,
  IP_CUDA_ERROR_NOT_INITIALIZED = 3,
  IP_CUDA_ERROR_UNKNOWN = 999,
  IP_cudaSuccess = 0,
  IP_cudaErrorInvalidValue = 1,
  IP_cudaErrorMemoryAllocation = 2,
  IP_cudaErrorInitializationError = 3,
  IP_cudaErrorUnknown = 999,
};
#define IP_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1ull << 1)
#define IP_cudaStreamPerThread                           ((stream_t)(uintptr_t)0x2)

/* ---- the real entry points ---------------------------------------------------- */

typedef void *(*dlsym_fn)(void *, const char *);
IP_HIDDEN dlsym_fn ip_real_dlsym; /* read by the assembly below */

typedef struct ip_driver_s {
  void *handle; /* dlopen("libcuda.so.1") */
  CUresult_t (*mem_alloc)(CUdptr_t *, size_t);
  CUresult_t (*mem_free)(CUdptr_t);
  CUresult_t (*mem_get_info)(size_t *, size_t *);
  CUresult_t (*mem_alloc_async)(CUdptr_t *, size_t, stream_t);
  CUresult_t (*mem_free_async)(CUdptr_t, stream_t);
  CUresult_t (*mem_alloc_async_ptsz)(CUdptr_t *, size_t, stream_t);
  CUresult_t (*mem_free_async_ptsz)(CUdptr_t, stream_t);
  CUresult_t (*get_proc)(const char *, void **, int, unsigned long long);
  CUresult_t (*get_proc_v2)(const char *, void **, int, unsigned long long, int *);
  CUresult_t (*ctx_get_device)(int *);
  CUresult_t (*device_get_attribute)(int *, int, int);
  CUresult_t (*ctx_synchronize)(void);
  CUresult_t (*mem_create)(unsigned long long *, size_t, const void *, unsigned long long);
  CUresult_t (*mem_release)(unsigned long long);
} ip_driver_t;

/* Synchronization: the driver table is filled once under pthread_once; the
 * runtime cache ip_rt[] below is written once per device (NULL -> runtime). */
static ip_driver_t ip_drv;
static pthread_once_t ip_drv_once = PTHREAD_ONCE_INIT;
/* ip_init has run.  ip_init is idempotent (two threads racing write the same
 * values), and runs without pthread_once: dlsym may be called by a sanitizer
 * runtime before it can serve pthread calls. */
static _Atomic bool ip_inited;

/* The loaded segments of an object: [lo, hi). */
typedef struct ip_range_s {
  uintptr_t probe; /* an address inside the object, to find it */
  uintptr_t lo, hi;
} ip_range_t;
static ip_range_t ip_gmr;  /* libgmr.so: see Note [Recursion] */
static ip_range_t ip_self; /* this library */

static bool ip_log_on;   /* GMR_INTERPOSE_LOG=1; set once by the constructor */
static bool ip_hide_vmm; /* GMR_INTERPOSE_HIDE_VMM=1, see Note [VMM]; set once likewise */

/* GMR_INTERPOSE_LOG=1 prints every lookup of a driver name (dlsym and
 * cuGetProcAddress, hooked or not) and every routed call to stderr: the way
 * to see how a framework reaches the driver.  Silent otherwise. */

static void ip_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
IP_RAW static void ip_log(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(2, buf, (size_t)n); /* no stdio: this may run inside the loader */
  (void)w;
}
#define IP_LOG(...)                                                                                \
  do {                                                                                             \
    if (ip_log_on) ip_log(__VA_ARGS__);                                                            \
  } while (0)

/* The environment switches, read once the C library is set up (a sanitizer
 * runtime may call dlsym, hence ip_init, before getenv can see anything). */
static void ip_read_env(void) {
  const char *v = getenv("GMR_INTERPOSE_LOG");
  ip_log_on = v != NULL && v[0] == '1';
  v = getenv("GMR_INTERPOSE_HIDE_VMM");
  ip_hide_vmm = v != NULL && v[0] == '1';
}

/* Finds the real dlsym: see Note [dlsym]. */
IP_RAW static void ip_init(void) {
  dlsym_fn d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (d == NULL) d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (d == NULL) d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64 */
  ip_real_dlsym = d;
  atomic_store_explicit(&ip_inited, true, memory_order_release);
}

IP_RAW static inline void ip_init_once(void) {
  if (!atomic_load_explicit(&ip_inited, memory_order_acquire)) ip_init();
}

static void ip_drv_load(void) {
  ip_init_once();
  ip_driver_t d;
  memset(&d, 0, sizeof d);
  d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (d.handle != NULL && ip_real_dlsym != NULL) {
#define IP_LOAD(field, name) *(void **)&d.field = ip_real_dlsym(d.handle, name)
    IP_LOAD(mem_alloc, "cuMemAlloc_v2");
    IP_LOAD(mem_free, "cuMemFree_v2");
    IP_LOAD(mem_get_info, "cuMemGetInfo_v2");
    IP_LOAD(mem_alloc_async, "cuMemAllocAsync");
    IP_LOAD(mem_free_async, "cuMemFreeAsync");
    IP_LOAD(mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz");
    IP_LOAD(mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
    IP_LOAD(get_proc, "cuGetProcAddress");
    IP_LOAD(get_proc_v2, "cuGetProcAddress_v2");
    IP_LOAD(ctx_get_device, "cuCtxGetDevice");
    IP_LOAD(device_get_attribute, "cuDeviceGetAttribute");
    IP_LOAD(ctx_synchronize, "cuCtxSynchronize");
    IP_LOAD(mem_create, "cuMemCreate");
    IP_LOAD(mem_release, "cuMemRelease");
#undef IP_LOAD
  }
  ip_drv = d;
}

static inline const ip_driver_t *ip_driver(void) {
  pthread_once(&ip_drv_once, ip_drv_load);
  return &ip_drv;
}

/* The runtime API's real functions: the next definition after this library
 * in the global scope, else the one the calling library itself would see
 * (its libcudart may have been loaded with RTLD_LOCAL). */
static void *ip_runtime_real(_Atomic(void *) *cache, const char *name, const void *caller) {
  void *fn = atomic_load_explicit(cache, memory_order_acquire);
  if (fn != NULL) return fn;
  ip_init_once();
  if (ip_real_dlsym == NULL) return NULL;
  fn = ip_real_dlsym(RTLD_NEXT, name);
  if (fn == NULL) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) != 0 && lm != NULL)
      fn = ip_real_dlsym(lm, name);
  }
  /* The caller's scope may hold this library first: never our own hook. */
  if ((uintptr_t)fn >= ip_self.lo && (uintptr_t)fn < ip_self.hi) fn = NULL;
  if (fn != NULL) atomic_store_explicit(cache, fn, memory_order_release);
  return fn;
}

/* ---- is the caller gmr itself? --------------------------------------------------- */

/* Note [Recursion]
 * gmr's CUDA backend (lib/backend/cuda.c, inside libgmr.so with a static
 * libcudart) calls cudaMalloc, which reaches the driver through the hooked
 * cuGetProcAddress table, that is, back here.  Every hook first looks at its
 * return address: a call from libgmr.so's own code (the range
 * [ip_gmr.lo, ip_gmr.hi) of its loaded segments) goes straight to the real
 * driver.  No flag has to be kept right across threads or callbacks.
 */

static int ip_find_segments(struct dl_phdr_info *info, size_t size, void *ud) {
  (void)size;
  ip_range_t *r = ud;
  uintptr_t probe = r->probe, lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (a < lo) lo = a;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (probe < lo || probe >= hi) return 0;
  r->lo = lo;
  r->hi = hi;
  return 1;
}

__attribute__((constructor)) static void ip_constructor(void) {
  ip_init_once();
  ip_read_env();
  ip_gmr.probe = (uintptr_t)&gmr_alloc;
  dl_iterate_phdr(ip_find_segments, &ip_gmr);
  ip_self.probe = (uintptr_t)&ip_init;
  dl_iterate_phdr(ip_find_segments, &ip_self);
}

/* Whether a hook was called from libgmr.so: see Note [Recursion]. */
static inline bool ip_from_gmr(const void *ret) {
  uintptr_t a = (uintptr_t)ret;
  return a >= ip_gmr.lo && a < ip_gmr.hi;
}
#define IP_CALLER() __builtin_return_address(0)

/* ---- gmr side -------------------------------------------------------------------- */

/* Note [What is routed]
 * Each routed call goes to gmr_default_runtime(device), the one runtime per
 * device that gmr's PyTorch and CuPy hooks use too, so all share one pool:
 *   - the runtime API: cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync
 *     (and their _ptsz forms), cudaMemGetInfo, by symbol interposition (a
 *     program or library linked against a shared libcudart binds to these);
 *   - the driver API: cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync(_ptsz),
 *     cuMemFreeAsync(_ptsz), cuMemGetInfo_v2, whichever way they are reached:
 *       * by symbol (a program linked with -lcuda);
 *       * through cuGetProcAddress / cuGetProcAddress_v2, which current CUDA
 *         runtimes (static or shared) use for every driver call: both are
 *         hooked, call the driver, then swap in our function for the names
 *         above (and for cuGetProcAddress itself);
 *       * through dlsym(handle, name), which JAX's CUDA plugin uses after
 *         dlopen("libcuda.so.1"): this library defines dlsym (Note [dlsym]).
 *         (JAX 0.11 itself maps its buffers with cuMemCreate/cuMemMap, which
 *         are not routed: see Note [VMM].)
 * Pointers gmr does not own (made before, or by the driver directly) are
 * freed by the real driver or runtime.  A synchronous free (cudaFree,
 * cuMemFree) of gmr's memory waits for the device (cuCtxSynchronize) as the
 * real one does, then returns the block to gmr's pool.
 */

#define IP_MAX_DEVICES 64
static _Atomic(gmr_runtime_t *) ip_rt[IP_MAX_DEVICES];

static gmr_runtime_t *ip_runtime(int device) {
  if (device < 0 || device >= IP_MAX_DEVICES) return NULL;
  gmr_runtime_t *rt = atomic_load_explicit(&ip_rt[device], memory_order_acquire);
  if (rt != NULL) return rt;
  if (gmr_default_runtime(device, &rt) != 0) return NULL;
  atomic_store_explicit(&ip_rt[device], rt, memory_order_release);
  return rt;
}

/* The device of the calling thread's current context; 0 when none. */
static int ip_driver_device(void) {
  const ip_driver_t *d = ip_driver();
  int dev = 0;
  if (d->ctx_get_device == NULL || d->ctx_get_device(&dev) != IP_CUDA_SUCCESS) dev = 0;
  return dev;
}

static _Atomic(void *) ip_real_cudaGetDevice;

static int ip_runtime_device(const void *caller) {
  cudaError_x (*get)(int *) = ip_runtime_real(&ip_real_cudaGetDevice, "cudaGetDevice", caller);
  int dev = 0;
  if (get != NULL && get(&dev) == IP_cudaSuccess) return dev;
  return ip_driver_device();
}

/* 0, GMR_ENOMEM, or another GMR_E* code. */
static int ip_alloc(int device, size_t size, stream_t s, void **out) {
  gmr_runtime_t *rt = ip_runtime(device);
  if (rt == NULL) return GMR_EDEVICE;
  return gmr_alloc(rt, size, s, out);
}

/* Is ptr inside one of the segments gmr holds (cached ones included)?  Asked
 * only of pointers that are no live block of gmr's: a free of one of those
 * is a second free (or a free of an address gmr never handed out), which
 * must never reach the driver: on a GPU it would free a live gmr segment,
 * whose addresses gmr later hands out again. */
static bool ip_in_segment(gmr_runtime_t *rt, void *ptr) {
  gmr_segment_info_t seg;
  return gmr_segment_of(rt, ptr, &seg) == 0;
}

/* The memory-pool API (interpose-pools.c, included below): Note [Memory pools]. */
static int ip_pool_forget(const void *ptr);
static bool ip_pool_current_foreign(int device);
static int ip_pool_alloc_current(int device, size_t size, stream_t s, void **out);
static void *ip_pool_proc_hook(const char *name, unsigned long long flags);
static void *ip_pool_dlsym_hook(const char *name);

/* 0 when gmr owned and freed ptr; GMR_EBADPTR when it is not gmr's;
 * GMR_EINVAL when it lies in a segment of gmr's but is no live block (a
 * double free: an error, logged, never passed to the driver). */
static int ip_free(int device, void *ptr, stream_t s, bool stream_ordered) {
  int pool_device = ip_pool_forget(ptr); /* allocated through a gmr pool: its device */
  if (pool_device >= 0) device = pool_device;
  gmr_runtime_t *rt = ip_runtime(device);
  if (rt == NULL) return GMR_EBADPTR;
  if (stream_ordered) {
    /* On another stream than the allocation's, reuse must wait for that
     * stream's work (a no-op on the allocation's stream). */
    if (gmr_record_stream(rt, ptr, s) == GMR_EBADPTR) goto not_live;
  } else {
    /* cudaFree and cuMemFree wait for the device, and callers rely on it (any
     * stream may still read the block): so does this free, once the pointer
     * is known to be gmr's. */
    size_t req, got;
    if (gmr_alloc_size(rt, ptr, &req, &got) != 0) goto not_live;
    const ip_driver_t *d = ip_driver();
    if (d->ctx_synchronize != NULL) d->ctx_synchronize();
  }
  return gmr_free(rt, ptr);
not_live:
  if (!ip_in_segment(rt, ptr)) return GMR_EBADPTR;
  IP_LOG("gmr-preload: free of %p: inside a segment gmr holds but no live block (freed "
         "already?): refused, not passed to the driver",
         ptr);
  return GMR_EINVAL;
}

/* Note [Reported free memory]
 * cudaMemGetInfo and cuMemGetInfo_v2 report the configured limit: with a cap
 * of L bytes (gmr_stats().limit_bytes) and R bytes reserved by gmr,
 *     total = L,  free = min(driver's free, L - R)   (0 when R >= L);
 * under a cap shared with other processes (limit.shared), free is also no
 * more than what that cap leaves this process (limit_shared_free_bytes:
 * cap - committed by all, plus what is left of its own guarantee), so a
 * framework that sizes itself as a fraction of total or takes what is free
 * gets what it can really have.
 */

/* The limit in force on the device's gmr runtime, applied to the driver's
 * figures.  Returns false when gmr has no runtime or no limit. */
static bool ip_limit_info(int device, size_t *f, size_t *t) {
  gmr_runtime_t *rt = ip_runtime(device);
  int64_t cap = 0, used = 0;
  if (rt == NULL || gmr_stat_get(rt, "limit_bytes", &cap) != 0 || cap <= 0 ||
      gmr_stat_get(rt, "limit_in_use_bytes", &used) != 0)
    return false;
  /* What the limit counts: reserved or allocated bytes, and charged ones. */
  uint64_t left = (uint64_t)cap > (uint64_t)used ? (uint64_t)cap - (uint64_t)used : 0;
  int64_t shared_left = 0;
  if (gmr_stat_get(rt, "limit_shared_free_bytes", &shared_left) == 0 && shared_left >= 0 &&
      (uint64_t)shared_left < left)
    left = (uint64_t)shared_left;
  *t = (size_t)cap;
  if ((uint64_t)*f > left) *f = (size_t)left;
  return true;
}

static CUresult_t ip_cu_status(int err) {
  return err == 0            ? IP_CUDA_SUCCESS
         : err == GMR_ENOMEM ? IP_CUDA_ERROR_OUT_OF_MEMORY
         : err == GMR_EINVAL ? IP_CUDA_ERROR_INVALID_VALUE
                             : IP_CUDA_ERROR_UNKNOWN;
}

static cudaError_x ip_rt_status(int err) {
  return err == 0            ? IP_cudaSuccess
         : err == GMR_ENOMEM ? IP_cudaErrorMemoryAllocation
         : err == GMR_EINVAL ? IP_cudaErrorInvalidValue
                             : IP_cudaErrorUnknown;
}

/* ---- the driver API ------------------------------------------------------------- */

IP_EXPORT CUresult_t cuMemAlloc_v2(CUdptr_t *dptr, size_t bytesize) {
  const ip_driver_t *d = ip_driver();
  if (ip_from_gmr(IP_CALLER()))
    return d->mem_alloc ? d->mem_alloc(dptr, bytesize) : IP_CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == NULL || bytesize == 0) return IP_CUDA_ERROR_INVALID_VALUE;
  void *p = NULL;
  int err = ip_alloc(ip_driver_device(), bytesize, NULL, &p);
  IP_LOG("gmr-preload: cuMemAlloc_v2(%zu) -> %p (%d)", bytesize, p, err);
  if (err == 0) *dptr = (CUdptr_t)(uintptr_t)p;
  return ip_cu_status(err);
}

IP_EXPORT CUresult_t cuMemFree_v2(CUdptr_t dptr) {
  const ip_driver_t *d = ip_driver();
  int err;
  if (!ip_from_gmr(IP_CALLER()) && dptr != 0 &&
      (err = ip_free(ip_driver_device(), (void *)(uintptr_t)dptr, NULL, false)) != GMR_EBADPTR)
    return ip_cu_status(err);
  return d->mem_free ? d->mem_free(dptr) : IP_CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult_t ip_cu_alloc_async(CUdptr_t *dptr, size_t bytesize, stream_t s) {
  if (dptr == NULL || bytesize == 0) return IP_CUDA_ERROR_INVALID_VALUE;
  void *p = NULL;
  int err = ip_pool_alloc_current(ip_driver_device(), bytesize, s, &p);
  IP_LOG("gmr-preload: cuMemAllocAsync(%zu, %p) -> %p (%d)", bytesize, s, p, err);
  if (err == 0) *dptr = (CUdptr_t)(uintptr_t)p;
  return ip_cu_status(err);
}

IP_EXPORT CUresult_t cuMemAllocAsync(CUdptr_t *dptr, size_t bytesize, stream_t s) {
  const ip_driver_t *d = ip_driver();
  if (ip_from_gmr(IP_CALLER()) || ip_pool_current_foreign(ip_driver_device()))
    return d->mem_alloc_async ? d->mem_alloc_async(dptr, bytesize, s)
                              : IP_CUDA_ERROR_NOT_INITIALIZED;
  return ip_cu_alloc_async(dptr, bytesize, s);
}

IP_EXPORT CUresult_t cuMemAllocAsync_ptsz(CUdptr_t *dptr, size_t bytesize, stream_t s) {
  const ip_driver_t *d = ip_driver();
  if (ip_from_gmr(IP_CALLER()) || ip_pool_current_foreign(ip_driver_device()))
    return d->mem_alloc_async_ptsz ? d->mem_alloc_async_ptsz(dptr, bytesize, s)
                                   : IP_CUDA_ERROR_NOT_INITIALIZED;
  return ip_cu_alloc_async(dptr, bytesize, s ? s : IP_cudaStreamPerThread);
}

IP_EXPORT CUresult_t cuMemFreeAsync(CUdptr_t dptr, stream_t s) {
  const ip_driver_t *d = ip_driver();
  int err;
  if (!ip_from_gmr(IP_CALLER()) && dptr != 0 &&
      (err = ip_free(ip_driver_device(), (void *)(uintptr_t)dptr, s, true)) != GMR_EBADPTR)
    return ip_cu_status(err);
  return d->mem_free_async ? d->mem_free_async(dptr, s) : IP_CUDA_ERROR_NOT_INITIALIZED;
}

IP_EXPORT CUresult_t cuMemFreeAsync_ptsz(CUdptr_t dptr, stream_t s) {
  const ip_driver_t *d = ip_driver();
  int err;
  if (!ip_from_gmr(IP_CALLER()) && dptr != 0 &&
      (err = ip_free(ip_driver_device(), (void *)(uintptr_t)dptr, s ? s : IP_cudaStreamPerThread,
                     true)) != GMR_EBADPTR)
    return ip_cu_status(err);
  return d->mem_free_async_ptsz ? d->mem_free_async_ptsz(dptr, s) : IP_CUDA_ERROR_NOT_INITIALIZED;
}

IP_EXPORT CUresult_t cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  const ip_driver_t *d = ip_driver();
  if (d->mem_get_info == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  if (ip_from_gmr(IP_CALLER())) return d->mem_get_info(free_bytes, total_bytes);
  if (free_bytes == NULL || total_bytes == NULL) return IP_CUDA_ERROR_INVALID_VALUE;
  size_t f = 0, t = 0;
  CUresult_t r = d->mem_get_info(&f, &t);
  if (r != IP_CUDA_SUCCESS) return r;
  ip_limit_info(ip_driver_device(), &f, &t); /* see Note [Reported free memory] */
  *free_bytes = f;
  *total_bytes = t;
  return IP_CUDA_SUCCESS;
}

/* Physical allocations that frameworks make themselves (XLA maps its buffers
 * with cuMemCreate + cuMemMap): they cannot come from gmr's pool, but they are
 * counted against the runtime's limit (gmr_charge), so one cap holds for every
 * framework in the process.  A handle's size is remembered until its release:
 *     Σ sizes in ip_handles = bytes charged by this library.
 * Synchronization: ip_handles_lock guards the table. */
typedef struct ip_handle_s {
  unsigned long long handle;
  size_t size;
  int device;
} ip_handle_t;
static pthread_mutex_t ip_handles_lock = PTHREAD_MUTEX_INITIALIZER;
static ip_handle_t *ip_handles;
static size_t ip_n_handles, ip_cap_handles;

static bool ip_handle_add(unsigned long long h, size_t size, int device) {
  pthread_mutex_lock(&ip_handles_lock);
  bool ok = true;
  if (ip_n_handles == ip_cap_handles) {
    size_t cap = ip_cap_handles ? ip_cap_handles * 2 : 256;
    ip_handle_t *n = realloc(ip_handles, cap * sizeof *n);
    if (n == NULL)
      ok = false;
    else
      ip_handles = n, ip_cap_handles = cap;
  }
  if (ok) ip_handles[ip_n_handles++] = (ip_handle_t){h, size, device};
  pthread_mutex_unlock(&ip_handles_lock);
  return ok;
}

/* Forget a handle; false when this library did not charge it. */
static bool ip_handle_take(unsigned long long h, ip_handle_t *out) {
  pthread_mutex_lock(&ip_handles_lock);
  bool found = false;
  for (size_t i = ip_n_handles; i-- > 0;) {
    if (ip_handles[i].handle != h) continue;
    *out = ip_handles[i];
    ip_handles[i] = ip_handles[--ip_n_handles];
    found = true;
    break;
  }
  pthread_mutex_unlock(&ip_handles_lock);
  return found;
}

IP_EXPORT CUresult_t cuMemCreate(unsigned long long *handle, size_t size, const void *prop,
                                 unsigned long long flags) {
  const ip_driver_t *d = ip_driver();
  if (d->mem_create == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  if (ip_from_gmr(IP_CALLER()) || handle == NULL || size == 0)
    return d->mem_create(handle, size, prop, flags);
  int device = ip_driver_device();
  gmr_runtime_t *rt = ip_runtime(device);
  int err = rt ? gmr_charge(rt, (int64_t)size) : 0;
  IP_LOG("gmr-preload: cuMemCreate(%zu) charged: %d", size, err);
  if (err == GMR_ENOMEM) return IP_CUDA_ERROR_OUT_OF_MEMORY;
  CUresult_t r = d->mem_create(handle, size, prop, flags);
  if (rt != NULL && (r != IP_CUDA_SUCCESS || !ip_handle_add(*handle, size, device)))
    gmr_charge(rt, -(int64_t)size); /* not created, or not trackable: not counted */
  return r;
}

IP_EXPORT CUresult_t cuMemRelease(unsigned long long handle) {
  const ip_driver_t *d = ip_driver();
  if (d->mem_release == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  CUresult_t r = d->mem_release(handle);
  ip_handle_t rec;
  if (r == IP_CUDA_SUCCESS && !ip_from_gmr(IP_CALLER()) && ip_handle_take(handle, &rec)) {
    gmr_runtime_t *rt = ip_runtime(rec.device);
    if (rt != NULL) gmr_charge(rt, -(int64_t)rec.size);
    IP_LOG("gmr-preload: cuMemRelease: %zu bytes given back", rec.size);
  }
  return r;
}

/* Note [VMM]
 * A framework that finds virtual memory management supported may map its
 * buffers itself (cuMemCreate/cuMemMap), which no allocator can serve from
 * its pool.  With GMR_INTERPOSE_HIDE_VMM=1, cuDeviceGetAttribute answers 0
 * for CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (102) to every
 * caller but gmr, so that frameworks which can fall back to cuMemAlloc do.
 * Off by default: XLA in JAX 0.11 cannot (it refuses the device: "VMM is
 * required for device memory allocation in XLA"), so its buffers bypass gmr
 * (their sizes are still charged: see cuMemCreate above).
 */
#define IP_ATTR_VMM_SUPPORTED 102 /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */

IP_EXPORT CUresult_t cuDeviceGetAttribute(int *value, int attrib, int dev) {
  const ip_driver_t *d = ip_driver();
  if (d->device_get_attribute == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  CUresult_t r = d->device_get_attribute(value, attrib, dev);
  if (r == IP_CUDA_SUCCESS && attrib == IP_ATTR_VMM_SUPPORTED && ip_hide_vmm &&
      !ip_from_gmr(IP_CALLER())) {
    IP_LOG("gmr-preload: cuDeviceGetAttribute(VMM supported, %d): %d, reported as 0", dev, *value);
    *value = 0;
  }
  return r;
}

/* Our function for a name looked up through cuGetProcAddress, or NULL.
 * `version` is the caller's CUDA version (cuMemAlloc etc. mean their _v2
 * from 3.2 on); `flags` may ask for per-thread default stream variants. */
static void *ip_proc_hook(const char *name, int version, unsigned long long flags);

IP_EXPORT CUresult_t cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         unsigned long long flags, int *status) {
  const ip_driver_t *d = ip_driver();
  if (d->get_proc_v2 == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  CUresult_t r = d->get_proc_v2(symbol, pfn, version, flags, status);
  if (r == IP_CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL) {
    void *mine = ip_proc_hook(symbol, version, flags);
    if (mine != NULL) *pfn = mine;
    IP_LOG("gmr-preload: cuGetProcAddress_v2(%s, %d, %llu)%s", symbol, version, flags,
           mine ? " hooked" : "");
  }
  return r;
}

IP_EXPORT CUresult_t cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      unsigned long long flags) {
  const ip_driver_t *d = ip_driver();
  if (d->get_proc == NULL) return IP_CUDA_ERROR_NOT_INITIALIZED;
  CUresult_t r = d->get_proc(symbol, pfn, version, flags);
  if (r == IP_CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL) {
    void *mine = ip_proc_hook(symbol, version, flags);
    if (mine != NULL) *pfn = mine;
  }
  return r;
}

static void *ip_proc_hook(const char *name, int version, unsigned long long flags) {
  bool ptds = (flags & IP_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (strncmp(name, "cu", 2) != 0) return NULL;
  if (version >= 3020) {
    if (strcmp(name, "cuMemAlloc") == 0) return (void *)cuMemAlloc_v2;
    if (strcmp(name, "cuMemFree") == 0) return (void *)cuMemFree_v2;
    if (strcmp(name, "cuMemGetInfo") == 0) return (void *)cuMemGetInfo_v2;
  }
  if (strcmp(name, "cuMemAllocAsync") == 0)
    return ptds ? (void *)cuMemAllocAsync_ptsz : (void *)cuMemAllocAsync;
  if (strcmp(name, "cuMemFreeAsync") == 0)
    return ptds ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
  if (strcmp(name, "cuGetProcAddress") == 0)
    return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
  if (strcmp(name, "cuDeviceGetAttribute") == 0) return (void *)cuDeviceGetAttribute;
  if (strcmp(name, "cuMemCreate") == 0) return (void *)cuMemCreate;
  if (strcmp(name, "cuMemRelease") == 0) return (void *)cuMemRelease;
  return ip_pool_proc_hook(name, flags);
}

/* ---- the runtime API -------------------------------------------------------------- */

static _Atomic(void *) ip_real_cudaMalloc, ip_real_cudaFree, ip_real_cudaMallocAsync,
    ip_real_cudaFreeAsync, ip_real_cudaMallocAsync_ptsz, ip_real_cudaFreeAsync_ptsz,
    ip_real_cudaMemGetInfo;

#define IP_REAL(name, caller) ip_runtime_real(&ip_real_##name, #name, caller)

IP_EXPORT cudaError_x cudaMalloc(void **devPtr, size_t size) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller)) {
    cudaError_x (*real)(void **, size_t) = IP_REAL(cudaMalloc, caller);
    return real ? real(devPtr, size) : IP_cudaErrorInitializationError;
  }
  if (devPtr == NULL) return IP_cudaErrorInvalidValue;
  if (size == 0) {
    *devPtr = NULL; /* as cudaMalloc(0) */
    return IP_cudaSuccess;
  }
  void *p = NULL;
  int err = ip_alloc(ip_runtime_device(caller), size, NULL, &p);
  IP_LOG("gmr-preload: cudaMalloc(%zu) -> %p (%d)", size, p, err);
  if (err == 0) *devPtr = p;
  return ip_rt_status(err);
}

IP_EXPORT cudaError_x cudaFree(void *devPtr) {
  const void *caller = IP_CALLER();
  /* cudaFree(NULL) initializes the context: always the real one. */
  int err;
  if (devPtr != NULL && !ip_from_gmr(caller) &&
      (err = ip_free(ip_runtime_device(caller), devPtr, NULL, false)) != GMR_EBADPTR)
    return ip_rt_status(err);
  cudaError_x (*real)(void *) = IP_REAL(cudaFree, caller);
  return real ? real(devPtr) : (devPtr ? IP_cudaErrorInvalidValue : IP_cudaSuccess);
}

static cudaError_x ip_rt_alloc_async(void **devPtr, size_t size, stream_t s, const void *caller) {
  if (devPtr == NULL) return IP_cudaErrorInvalidValue;
  if (size == 0) {
    *devPtr = NULL;
    return IP_cudaSuccess;
  }
  void *p = NULL;
  int err = ip_pool_alloc_current(ip_runtime_device(caller), size, s, &p);
  if (err == 0) *devPtr = p;
  return ip_rt_status(err);
}

IP_EXPORT cudaError_x cudaMallocAsync(void **devPtr, size_t size, stream_t s) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller) || ip_pool_current_foreign(ip_runtime_device(caller))) {
    cudaError_x (*real)(void **, size_t, stream_t) = IP_REAL(cudaMallocAsync, caller);
    return real ? real(devPtr, size, s) : IP_cudaErrorInitializationError;
  }
  return ip_rt_alloc_async(devPtr, size, s, caller);
}

IP_EXPORT cudaError_x cudaMallocAsync_ptsz(void **devPtr, size_t size, stream_t s) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller) || ip_pool_current_foreign(ip_runtime_device(caller))) {
    cudaError_x (*real)(void **, size_t, stream_t) = IP_REAL(cudaMallocAsync_ptsz, caller);
    return real ? real(devPtr, size, s) : IP_cudaErrorInitializationError;
  }
  return ip_rt_alloc_async(devPtr, size, s ? s : IP_cudaStreamPerThread, caller);
}

IP_EXPORT cudaError_x cudaFreeAsync(void *devPtr, stream_t s) {
  const void *caller = IP_CALLER();
  int err;
  if (devPtr != NULL && !ip_from_gmr(caller) &&
      (err = ip_free(ip_runtime_device(caller), devPtr, s, true)) != GMR_EBADPTR)
    return ip_rt_status(err);
  cudaError_x (*real)(void *, stream_t) = IP_REAL(cudaFreeAsync, caller);
  return real ? real(devPtr, s) : IP_cudaErrorInvalidValue;
}

IP_EXPORT cudaError_x cudaFreeAsync_ptsz(void *devPtr, stream_t s) {
  const void *caller = IP_CALLER();
  int err;
  if (devPtr != NULL && !ip_from_gmr(caller) &&
      (err = ip_free(ip_runtime_device(caller), devPtr, s ? s : IP_cudaStreamPerThread, true)) !=
          GMR_EBADPTR)
    return ip_rt_status(err);
  cudaError_x (*real)(void *, stream_t) = IP_REAL(cudaFreeAsync_ptsz, caller);
  return real ? real(devPtr, s) : IP_cudaErrorInvalidValue;
}

IP_EXPORT cudaError_x cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  const void *caller = IP_CALLER();
  cudaError_x (*real)(size_t *, size_t *) = IP_REAL(cudaMemGetInfo, caller);
  size_t f = 0, t = 0;
  cudaError_x r = IP_cudaErrorInitializationError;
  if (real != NULL) {
    r = real(&f, &t);
  } else {
    /* No runtime library next to us: ask the driver. */
    const ip_driver_t *d = ip_driver();
    if (d->mem_get_info != NULL && d->mem_get_info(&f, &t) == IP_CUDA_SUCCESS) r = IP_cudaSuccess;
  }
  if (r != IP_cudaSuccess) return r;
  if (free_bytes == NULL || total_bytes == NULL) return IP_cudaErrorInvalidValue;
  /* see Note [Reported free memory] */
  if (!ip_from_gmr(caller)) ip_limit_info(ip_runtime_device(caller), &f, &t);
  *free_bytes = f;
  *total_bytes = t;
  return IP_cudaSuccess;
}

/* ---- the memory-pool API ----------------------------------------------------------- */

#include "interpose-pools.c"

/* ---- dlsym ------------------------------------------------------------------------- */

/* Note [dlsym]
 * Our dlsym answers the hooked names itself and passes every other lookup
 * to the real dlsym (found with dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), or
 * "GLIBC_2.2.5" before glibc 2.34).  The real dlsym resolves RTLD_NEXT and
 * RTLD_DEFAULT relative to its caller's return address, so on x86-64 that
 * pass-through is a tail jump (a few lines of assembly): the real dlsym sees
 * the original caller.  Elsewhere it is a C call, and RTLD_NEXT from other
 * libraries resolves as if asked from here.
 */

/* Our function for a name looked up by dlsym, or NULL. */
IP_RAW static void *ip_dlsym_hook(const char *name) {
  if (name[0] != 'c' || name[1] != 'u') return NULL;
  static const struct {
    const char *name;
    void *fn;
  } table[] = {
      {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
      {"cuMemFree_v2", (void *)cuMemFree_v2},
      {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
      {"cuMemAllocAsync", (void *)cuMemAllocAsync},
      {"cuMemFreeAsync", (void *)cuMemFreeAsync},
      {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
      {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz},
      {"cuGetProcAddress", (void *)cuGetProcAddress},
      {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2},
      {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
      {"cuMemCreate", (void *)cuMemCreate},
      {"cuMemRelease", (void *)cuMemRelease},
      {"cudaMalloc", (void *)cudaMalloc},
      {"cudaFree", (void *)cudaFree},
      {"cudaMallocAsync", (void *)cudaMallocAsync},
      {"cudaFreeAsync", (void *)cudaFreeAsync},
      {"cudaMallocAsync_ptsz", (void *)cudaMallocAsync_ptsz},
      {"cudaFreeAsync_ptsz", (void *)cudaFreeAsync_ptsz},
      {"cudaMemGetInfo", (void *)cudaMemGetInfo},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (strcmp(name, table[i].name) == 0) return table[i].fn;
  return ip_pool_dlsym_hook(name);
}

/* Called by dlsym: our function when `name` is hooked and `handle` really
 * provides it (so a library without the name still answers NULL), else NULL
 * and the caller passes the lookup to the real dlsym. */
IP_HIDDEN IP_RAW __attribute__((used)) void *ip_dlsym_lookup(void *handle, const char *name) {
  ip_init_once();
  if (name == NULL || ip_real_dlsym == NULL) return NULL;
  void *mine = ip_dlsym_hook(name);
  if (ip_log_on && name[0] == 'c' && name[1] == 'u')
    ip_log("gmr-preload: dlsym(%p, %s)%s", handle, name, mine ? " hooked" : "");
  if (mine == NULL) return NULL;
  if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && ip_real_dlsym(handle, name) == NULL)
    return NULL;
  return mine;
}

#if defined(__x86_64__)
/* dlsym(handle, name): ask ip_dlsym_lookup; on NULL jump to the real dlsym
 * with the caller's own return address still on the stack (Note [dlsym]). */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
        "  endbr64\n"
        "  pushq %rdi\n"
        "  pushq %rsi\n"
        "  subq $8, %rsp\n"
        "  call ip_dlsym_lookup\n"
        "  addq $8, %rsp\n"
        "  popq %rsi\n"
        "  popq %rdi\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  movq ip_real_dlsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  jz 2f\n"
        "  jmpq *%rax\n"
        "2:\n"
        "  ret\n"
        ".size dlsym, .-dlsym\n");
#else
IP_EXPORT void *dlsym(void *handle, const char *name) {
  void *mine = ip_dlsym_lookup(handle, name);
  if (mine != NULL) return mine;
  return ip_real_dlsym ? ip_real_dlsym(handle, name) : NULL;
}
#endif
