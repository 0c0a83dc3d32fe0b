/* interpose-pools.c: the stream-ordered memory-pool API in libgmr-preload.so
 * (cuDeviceGetDefaultMemPool, cuMemPoolCreate, cuMemAllocFromPoolAsync,
 * cuMemPool{Set,Get}Attribute, cuMemPoolTrimTo... and their cuda* forms), so
 * that allocators built on CUDA's pools (JAX's cuda_async, TensorFlow's
 * cuda_malloc_async, CuPy's MemoryAsyncPool, RMM's cuda_async_memory_resource,
 * PyTorch's backend:cudaMallocAsync) are served by gmr's policies and limits.
 * A pool handle gmr hands out stands for the device's gmr runtime; a pool the
 * driver made is passed to the driver untouched.  Not compiled alone: it is
 * included by interpose.c, whose driver table, runtime cache and recursion
 * rule it uses.  See Note [Memory pools].
 */

/* Note [Memory pools]
 * ~~~~~~~~~~~~~~~~~~~
 * Handles.  A pool handle (CUmemoryPool, cudaMemPool_t) that gmr hands out
 * is the address of an entry of ip_pools[], a static table of this library:
 * entries 0..IP_MAX_DEVICES-1 are the devices' default pools, the rest the
 * pools made by cuMemPoolCreate.  ip_pool_of() knows a handle by its address
 * (inside the table, on an entry boundary) and its tag (IP_POOL_MAGIC); the
 * driver's handles point into the driver's own memory, so one is never taken
 * for the other.  Every call that takes a pool looks at it first: a driver's
 * pool goes to the driver untouched, a gmr pool never reaches the driver.
 *
 * What a gmr pool is.  Every gmr pool of device d, its default pool and the
 * pools made by cuMemPoolCreate alike, allocates from gmr_default_runtime(d),
 * the runtime that cudaMalloc, cuMemAlloc and the PyTorch and CuPy hooks use:
 * one cache, one policy, one limit.  A created pool is not a gmr private pool
 * (gmr_pool_create), because a `limit` of the configuration applies to each
 * private pool's stack separately (docs/pools.md): a framework that makes its
 * own pool would get a second cap.  What a created pool has of its own: its
 * byte counters (USED_MEM_*), its attributes, its access table and its
 * maxSize (a cap on the bytes allocated through it).
 *
 * Which pools gmr makes.  cuMemPoolCreate with allocType PINNED, handleTypes
 * NONE, a device location, usage 0 and no win32 attributes: device memory
 * that gmr can serve.  When gmr has no runtime for that device (a bad
 * GMR_CONFIG), the call and cuDeviceGetDefaultMemPool fail (the driver's
 * error for an invalid device, else CUDA_ERROR_UNKNOWN) rather than hand out
 * the driver's pool, whose memory would escape the limit.  Any other (IPC handle types, host or
 * managed memory, host NUMA, hardware decompression) goes to the driver as asked, and so do its
 * allocations.  cuMemPoolImportFromShareableHandle makes a driver pool. Export and import calls on
 * a gmr pool or a gmr pointer return CUDA_ERROR_NOT_SUPPORTED (801): gmr's blocks are
 * suballocations of larger reservations that cannot be shared alone.
 *
 * Allocations.  cuMemAllocFromPoolAsync(pool, s) is gmr_alloc(rt, size, s)
 * and cuMemFreeAsync(p, s) is gmr_record_stream + gmr_free (ip_free): gmr's
 * policies already make reuse stream-ordered (at once on the allocation's
 * stream, on another once its events completed).  cuMemAllocAsync and
 * cudaMallocAsync allocate from the device's current pool
 * (cuDeviceSetMemPool): a gmr pool (the default one unless set) counts them;
 * a driver's pool set as current sends them to the driver.  Past the limit
 * gmr_alloc fails after the policy freed its cache, and the call returns
 * CUDA_ERROR_OUT_OF_MEMORY / cudaErrorMemoryAllocation (2).
 *
 * Counters.  Each pointer allocated through a gmr pool is kept in ip_ptrs
 * (pointer -> pool, device, policy-rounded size from gmr_alloc_size), so any
 * free (async or not, by any entry point) takes its size off its pool's
 * USED_MEM_CURRENT and frees it in its pool's device runtime, whatever
 * device is current:
 *     pool.used = Σ sizes in ip_ptrs of that pool,
 *     pool.used_high = max of pool.used since creation or the last reset.
 * Attributes (CUmemPool_attribute, cudaMemPoolAttr: the same values):
 *   - USED_MEM_CURRENT / USED_MEM_HIGH: the pool's own counters; setting
 *     USED_MEM_HIGH to 0 resets it to the current value;
 *   - RESERVED_MEM_CURRENT / RESERVED_MEM_HIGH: what the runtime holds from
 *     the device (gmr_stats reserved_bytes, peak_reserved_bytes), shared by
 *     every gmr pool of the device since they share one cache; setting
 *     RESERVED_MEM_HIGH to 0 is gmr_stats_reset_peak, which resets every peak
 *     of the runtime (PyTorch's reset_peak_memory_stats resets both highs);
 *   - RELEASE_THRESHOLD and the three REUSE_* flags: accepted, stored and read
 *     back, with no effect.  The driver releases memory above the threshold
 *     at synchronizations, which this library does not see; gmr's policy
 *     decides when its cache goes back (`policy: direct` at once, `caching`
 *     at gmr_empty_cache or under pressure), and that is the configuration's
 *     to choose, not the framework's.  gmr's reuse is always event-safe, so
 *     turning a reuse flag off makes nothing unsafe, only not more strict;
 *   - the current and high values cannot be set otherwise
 *     (CUDA_ERROR_INVALID_VALUE), as with the driver.
 * cuMemPoolTrimTo(pool, keep): gmr_empty_cache of the runtime when it holds
 * more than `keep` bytes.  gmr cannot give back part of its cache, so it may
 * keep fewer bytes than asked, never more than needed.
 * Access: cuMemPoolSetAccess is recorded and read back by cuMemPoolGetAccess
 * (the pool's own device is always read-write, and cannot be set otherwise).
 * gmr's blocks are cudaMalloc'd or mapped for the pool's device; another
 * device reaches them once peer access is enabled between the contexts
 * (cuCtxEnablePeerAccess), which this call does not do.
 * Destroy: a created pool with live blocks stays until its last block is
 * freed (as the driver's does), then its entry is reused; a destroyed pool
 * that was current makes the default pool current again.
 * The runtime's forms (cudaMemPool*, cudaDevice*MemPool,
 * cudaMallocFromPoolAsync) do the same for a gmr pool and call the real
 * runtime for a driver's pool (the driver's function when no runtime library
 * is loaded: same handles, same error numbers for these calls).
 *
 * Synchronization: ip_pools_lock guards pool creation, destruction, the
 * attributes and the access tables; the counters are atomics;
 * ip_ptrs_lock guards ip_ptrs.
 */

typedef void *mempool_t; /* CUmemoryPool, cudaMemPool_t */

typedef struct ip_mem_location_s { /* CUmemLocation, cudaMemLocation */
  int type;
  int id;
} ip_mem_location_t;

typedef struct ip_pool_props_s { /* CUmemPoolProps, cudaMemPoolProps */
  int alloc_type;
  int handle_types;
  ip_mem_location_t location;
  void *win32_security_attributes;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
} ip_pool_props_t;

typedef struct ip_access_desc_s { /* CUmemAccessDesc, cudaMemAccessDesc */
  ip_mem_location_t location;
  int flags;
} ip_access_desc_t;

enum {
  IP_CUDA_ERROR_INVALID_DEVICE = 101, /* = cudaErrorInvalidDevice */
  IP_CUDA_ERROR_NOT_SUPPORTED = 801,  /* = cudaErrorNotSupported */
  IP_MEM_ALLOCATION_TYPE_PINNED = 1,
  IP_MEM_LOCATION_TYPE_DEVICE = 1,
  IP_MEM_ACCESS_FLAGS_PROT_NONE = 0,
  IP_MEM_ACCESS_FLAGS_PROT_READ = 1,
  IP_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
  /* CUmemPool_attribute (cudaMemPoolAttr has the same values) */
  IP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
  IP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
  IP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
  IP_POOL_ATTR_RELEASE_THRESHOLD = 4,
  IP_POOL_ATTR_RESERVED_MEM_CURRENT = 5,
  IP_POOL_ATTR_RESERVED_MEM_HIGH = 6,
  IP_POOL_ATTR_USED_MEM_CURRENT = 7,
  IP_POOL_ATTR_USED_MEM_HIGH = 8,
};

/* ---- the driver's pool entry points ----------------------------------------------- */

typedef struct ip_pool_driver_s {
  CUresult_t (*device_get_default)(mempool_t *, int);
  CUresult_t (*device_get)(mempool_t *, int);
  CUresult_t (*device_set)(int, mempool_t);
  CUresult_t (*mem_get_default)(mempool_t *, ip_mem_location_t *, int);
  CUresult_t (*mem_get)(mempool_t *, ip_mem_location_t *, int);
  CUresult_t (*mem_set)(ip_mem_location_t *, int, mempool_t);
  CUresult_t (*create)(mempool_t *, const ip_pool_props_t *);
  CUresult_t (*destroy)(mempool_t);
  CUresult_t (*alloc_from)(CUdptr_t *, size_t, mempool_t, stream_t);
  CUresult_t (*alloc_from_ptsz)(CUdptr_t *, size_t, mempool_t, stream_t);
  CUresult_t (*set_attribute)(mempool_t, int, void *);
  CUresult_t (*get_attribute)(mempool_t, int, void *);
  CUresult_t (*trim_to)(mempool_t, size_t);
  CUresult_t (*set_access)(mempool_t, const ip_access_desc_t *, size_t);
  CUresult_t (*get_access)(int *, mempool_t, ip_mem_location_t *);
  CUresult_t (*export_handle)(void *, mempool_t, int, unsigned long long);
  CUresult_t (*export_pointer)(void *, CUdptr_t);
  CUresult_t (*import_pointer)(CUdptr_t *, mempool_t, void *);
} ip_pool_driver_t;

static ip_pool_driver_t ip_pdrv;
static pthread_once_t ip_pdrv_once = PTHREAD_ONCE_INIT;

static void ip_pool_driver_load(void) {
  const ip_driver_t *d = ip_driver();
  ip_pool_driver_t p;
  memset(&p, 0, sizeof p);
  if (d->handle != NULL && ip_real_dlsym != NULL) {
#define IP_LOAD(field, name) *(void **)&p.field = ip_real_dlsym(d->handle, name)
    IP_LOAD(device_get_default, "cuDeviceGetDefaultMemPool");
    IP_LOAD(device_get, "cuDeviceGetMemPool");
    IP_LOAD(device_set, "cuDeviceSetMemPool");
    IP_LOAD(mem_get_default, "cuMemGetDefaultMemPool");
    IP_LOAD(mem_get, "cuMemGetMemPool");
    IP_LOAD(mem_set, "cuMemSetMemPool");
    IP_LOAD(create, "cuMemPoolCreate");
    IP_LOAD(destroy, "cuMemPoolDestroy");
    IP_LOAD(alloc_from, "cuMemAllocFromPoolAsync");
    IP_LOAD(alloc_from_ptsz, "cuMemAllocFromPoolAsync_ptsz");
    IP_LOAD(set_attribute, "cuMemPoolSetAttribute");
    IP_LOAD(get_attribute, "cuMemPoolGetAttribute");
    IP_LOAD(trim_to, "cuMemPoolTrimTo");
    IP_LOAD(set_access, "cuMemPoolSetAccess");
    IP_LOAD(get_access, "cuMemPoolGetAccess");
    IP_LOAD(export_handle, "cuMemPoolExportToShareableHandle");
    IP_LOAD(export_pointer, "cuMemPoolExportPointer");
    IP_LOAD(import_pointer, "cuMemPoolImportPointer");
#undef IP_LOAD
  }
  ip_pdrv = p;
}

static inline const ip_pool_driver_t *ip_pool_driver(void) {
  pthread_once(&ip_pdrv_once, ip_pool_driver_load);
  return &ip_pdrv;
}

/* The driver's function `f`, or CUDA_ERROR_NOT_INITIALIZED when it has none. */
#define IP_PDRV(f, ...)                                                                            \
  (ip_pool_driver()->f ? ip_pool_driver()->f(__VA_ARGS__) : IP_CUDA_ERROR_NOT_INITIALIZED)

/* ---- gmr's pools -------------------------------------------------------------------- */

#define IP_POOL_MAGIC        0x676d722d706f6f6cull /* "gmr-pool" */
#define IP_MAX_CREATED_POOLS 1024
#define IP_N_POOLS           (IP_MAX_DEVICES + IP_MAX_CREATED_POOLS)

enum { IP_POOL_FREE = 0, IP_POOL_LIVE, IP_POOL_DESTROYED };

typedef struct ip_pool_s {
  uint64_t magic;    /* IP_POOL_MAGIC once the entry was ever used */
  _Atomic int state; /* IP_POOL_*; changed under ip_pools_lock */
  int device;        /* the runtime it allocates from */
  size_t max_size;   /* 0: none; else a cap on `used` */
  _Atomic uint64_t used, used_high;
  _Atomic uint64_t live; /* live allocations */
  /* Under ip_pools_lock: */
  uint64_t release_threshold;
  int reuse[3]; /* the REUSE_* flags, in attribute order */
  unsigned char access[IP_MAX_DEVICES];
} ip_pool_t;

static ip_pool_t ip_pools[IP_N_POOLS];
static pthread_mutex_t ip_pools_lock = PTHREAD_MUTEX_INITIALIZER;
/* The device's current pool (cuDeviceSetMemPool): NULL for its gmr default
 * pool, else a gmr or a driver's handle. */
static _Atomic(mempool_t) ip_pool_current[IP_MAX_DEVICES];

/* The gmr pool behind a handle, or NULL when the driver made it. */
static ip_pool_t *ip_pool_of(mempool_t h) {
  uintptr_t a = (uintptr_t)h, lo = (uintptr_t)ip_pools;
  if (a < lo || a >= lo + sizeof ip_pools || (a - lo) % sizeof(ip_pool_t) != 0) return NULL;
  ip_pool_t *p = (ip_pool_t *)h;
  return p->magic == IP_POOL_MAGIC ? p : NULL;
}

static inline bool ip_pool_live(const ip_pool_t *p) {
  return atomic_load_explicit(&p->state, memory_order_acquire) == IP_POOL_LIVE;
}

/* Under ip_pools_lock. */
static void ip_pool_init(ip_pool_t *p, int device, size_t max_size) {
  p->magic = IP_POOL_MAGIC;
  p->device = device;
  p->max_size = max_size;
  atomic_store(&p->used, 0);
  atomic_store(&p->used_high, 0);
  atomic_store(&p->live, 0);
  p->release_threshold = 0;
  p->reuse[0] = p->reuse[1] = p->reuse[2] = 1; /* the driver's defaults */
  memset(p->access, IP_MEM_ACCESS_FLAGS_PROT_NONE, sizeof p->access);
  p->access[device] = IP_MEM_ACCESS_FLAGS_PROT_READWRITE;
  atomic_store_explicit(&p->state, IP_POOL_LIVE, memory_order_release);
}

/* The default gmr pool of `device`, or NULL when gmr has no runtime for it. */
static ip_pool_t *ip_pool_default(int device) {
  if (device < 0 || device >= IP_MAX_DEVICES || ip_runtime(device) == NULL) return NULL;
  ip_pool_t *p = &ip_pools[device];
  if (ip_pool_live(p)) return p;
  pthread_mutex_lock(&ip_pools_lock);
  if (!ip_pool_live(p)) ip_pool_init(p, device, 0);
  pthread_mutex_unlock(&ip_pools_lock);
  return p;
}

static bool ip_pool_current_foreign(int device) {
  if (device < 0 || device >= IP_MAX_DEVICES) return false;
  mempool_t cur = atomic_load_explicit(&ip_pool_current[device], memory_order_acquire);
  return cur != NULL && ip_pool_of(cur) == NULL;
}

/* ---- pointers allocated through gmr pools -------------------------------------------- */

typedef struct ip_ptr_s {
  uintptr_t ptr; /* 0: empty slot */
  uint32_t pool; /* index in ip_pools */
  int device;
  uint64_t size;
} ip_ptr_t;

static pthread_mutex_t ip_ptrs_lock = PTHREAD_MUTEX_INITIALIZER;
static ip_ptr_t *ip_ptrs; /* open addressing, linear probing; capacity a power of 2 */
static size_t ip_ptrs_cap, ip_ptrs_n;
static unsigned ip_ptrs_bits;       /* ip_ptrs_cap = 1 << ip_ptrs_bits */
static _Atomic size_t ip_ptrs_live; /* = ip_ptrs_n, read without the lock */

/* Fibonacci hashing: the top `bits` bits of the product. */
static inline size_t ip_ptr_slot(uintptr_t p, unsigned bits) {
  return (size_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

/* Under ip_ptrs_lock. */
static bool ip_ptrs_grow(void) {
  unsigned bits = ip_ptrs_cap ? ip_ptrs_bits + 1 : 10;
  size_t cap = (size_t)1 << bits;
  ip_ptr_t *t = calloc(cap, sizeof *t);
  if (t == NULL) return false;
  for (size_t i = 0; i < ip_ptrs_cap; ++i) {
    if (ip_ptrs[i].ptr == 0) continue;
    size_t j = ip_ptr_slot(ip_ptrs[i].ptr, bits);
    while (t[j].ptr != 0)
      j = (j + 1) & (cap - 1);
    t[j] = ip_ptrs[i];
  }
  free(ip_ptrs);
  ip_ptrs = t;
  ip_ptrs_cap = cap;
  ip_ptrs_bits = bits;
  return true;
}

static bool ip_ptr_add(const ip_ptr_t *e) {
  pthread_mutex_lock(&ip_ptrs_lock);
  bool ok = (ip_ptrs_n + 1) * 2 <= ip_ptrs_cap || ip_ptrs_grow();
  if (ok) {
    size_t j = ip_ptr_slot(e->ptr, ip_ptrs_bits);
    while (ip_ptrs[j].ptr != 0)
      j = (j + 1) & (ip_ptrs_cap - 1);
    ip_ptrs[j] = *e;
    atomic_store(&ip_ptrs_live, ++ip_ptrs_n);
  }
  pthread_mutex_unlock(&ip_ptrs_lock);
  return ok;
}

/* Remove `ptr`; false when no gmr pool allocated it. */
static bool ip_ptr_take(uintptr_t ptr, ip_ptr_t *out) {
  if (atomic_load_explicit(&ip_ptrs_live, memory_order_relaxed) == 0) return false;
  pthread_mutex_lock(&ip_ptrs_lock);
  bool found = false;
  if (ip_ptrs_cap != 0) {
    size_t mask = ip_ptrs_cap - 1, i = ip_ptr_slot(ptr, ip_ptrs_bits);
    while (ip_ptrs[i].ptr != 0 && ip_ptrs[i].ptr != ptr)
      i = (i + 1) & mask;
    if (ip_ptrs[i].ptr == ptr) {
      found = true;
      *out = ip_ptrs[i];
      /* Backward-shift deletion: no tombstones. */
      size_t j = i;
      for (;;) {
        ip_ptrs[i].ptr = 0;
        size_t k;
        do {
          j = (j + 1) & mask;
          if (ip_ptrs[j].ptr == 0) goto out;
          k = ip_ptr_slot(ip_ptrs[j].ptr, ip_ptrs_bits);
        } while (i <= j ? (i < k && k <= j) : (i < k || k <= j));
        ip_ptrs[i] = ip_ptrs[j];
        i = j;
      }
    out:
      atomic_store(&ip_ptrs_live, --ip_ptrs_n);
    }
  }
  pthread_mutex_unlock(&ip_ptrs_lock);
  return found;
}

static bool ip_ptr_known(uintptr_t ptr) {
  if (atomic_load_explicit(&ip_ptrs_live, memory_order_relaxed) == 0) return false;
  pthread_mutex_lock(&ip_ptrs_lock);
  bool found = false;
  if (ip_ptrs_cap != 0) {
    size_t i = ip_ptr_slot(ptr, ip_ptrs_bits);
    while (ip_ptrs[i].ptr != 0 && ip_ptrs[i].ptr != ptr)
      i = (i + 1) & (ip_ptrs_cap - 1);
    found = ip_ptrs[i].ptr == ptr;
  }
  pthread_mutex_unlock(&ip_ptrs_lock);
  return found;
}

static void ip_pool_note_high(ip_pool_t *p, uint64_t used) {
  uint64_t high = atomic_load(&p->used_high);
  while (used > high && !atomic_compare_exchange_weak(&p->used_high, &high, used)) {
  }
}

/* Allocate through gmr pool p on stream s.  0 or a GMR_E* code. */
static int ip_pool_alloc(ip_pool_t *p, size_t size, stream_t s, void **out) {
  if (!ip_pool_live(p)) return GMR_EINVAL;
  gmr_runtime_t *rt = ip_runtime(p->device);
  if (rt == NULL) return GMR_EDEVICE;
  if (p->max_size != 0 && atomic_load(&p->used) + size > p->max_size) return GMR_ENOMEM;
  void *ptr = NULL;
  int err = gmr_alloc(rt, size, s, &ptr);
  if (err != 0) return err;
  size_t req = size, got = size;
  gmr_alloc_size(rt, ptr, &req, &got);
  ip_ptr_t e = {(uintptr_t)ptr, (uint32_t)(p - ip_pools), p->device, got};
  if (!ip_ptr_add(&e)) {
    gmr_free(rt, ptr);
    return GMR_ENOMEM;
  }
  atomic_fetch_add(&p->live, 1);
  ip_pool_note_high(p, atomic_fetch_add(&p->used, got) + got);
  *out = ptr;
  return 0;
}

/* cuMemAllocAsync and cudaMallocAsync: the device's current pool, a gmr one
 * (ip_pool_current_foreign is false). */
static int ip_pool_alloc_current(int device, size_t size, stream_t s, void **out) {
  ip_pool_t *p = NULL;
  if (device >= 0 && device < IP_MAX_DEVICES)
    p = ip_pool_of(atomic_load_explicit(&ip_pool_current[device], memory_order_acquire));
  if (p == NULL) p = ip_pool_default(device);
  if (p == NULL) return ip_alloc(device, size, s, out);
  return ip_pool_alloc(p, size, s, out);
}

/* A free of `ptr` is coming: take it off its pool's counters.  Returns the
 * device whose runtime holds it, or -1 when no gmr pool allocated it. */
static int ip_pool_forget(const void *ptr) {
  ip_ptr_t e;
  if (!ip_ptr_take((uintptr_t)ptr, &e)) return -1;
  ip_pool_t *p = &ip_pools[e.pool];
  atomic_fetch_sub(&p->used, e.size);
  if (atomic_fetch_sub(&p->live, 1) == 1) {
    /* A destroyed pool goes once its last block is freed. */
    pthread_mutex_lock(&ip_pools_lock);
    if (atomic_load(&p->state) == IP_POOL_DESTROYED && atomic_load(&p->live) == 0)
      atomic_store(&p->state, IP_POOL_FREE);
    pthread_mutex_unlock(&ip_pools_lock);
  }
  return e.device;
}

/* ---- the calls, on gmr pools (CUresult; cudaError_t has the same numbers) ------------- */

static CUresult_t ip_pool_get_default(mempool_t *out, int device) {
  if (out == NULL) return IP_CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= IP_MAX_DEVICES) return IP_CUDA_ERROR_INVALID_DEVICE;
  ip_pool_t *p = ip_pool_default(device);
  if (p == NULL) {
    /* No gmr runtime for the device: the driver's error when the device is
     * not valid, else CUDA_ERROR_UNKNOWN, as gmr's allocations would fail
     * (never the driver's pool: its memory would escape the limit). */
    mempool_t drv = NULL;
    CUresult_t r = IP_PDRV(device_get_default, &drv, device);
    IP_LOG("gmr-preload: cuDeviceGetDefaultMemPool(%d): gmr has no runtime: %s", device,
           gmr_thread_last_error());
    return r != IP_CUDA_SUCCESS ? r : IP_CUDA_ERROR_UNKNOWN;
  }
  *out = p;
  return IP_CUDA_SUCCESS;
}

static CUresult_t ip_pool_get_current(mempool_t *out, int device) {
  if (out == NULL) return IP_CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= IP_MAX_DEVICES) return IP_CUDA_ERROR_INVALID_DEVICE;
  mempool_t cur = atomic_load_explicit(&ip_pool_current[device], memory_order_acquire);
  if (cur != NULL) {
    *out = cur;
    return IP_CUDA_SUCCESS;
  }
  return ip_pool_get_default(out, device);
}

static CUresult_t ip_pool_set_current(int device, ip_pool_t *p) {
  if (device < 0 || device >= IP_MAX_DEVICES) return IP_CUDA_ERROR_INVALID_DEVICE;
  if (!ip_pool_live(p) || p->device != device) return IP_CUDA_ERROR_INVALID_VALUE;
  atomic_store_explicit(&ip_pool_current[device], p == &ip_pools[device] ? NULL : (mempool_t)p,
                        memory_order_release);
  return IP_CUDA_SUCCESS;
}

/* Properties gmr can serve: device memory, no export, no special usage. */
static bool ip_pool_servable(const ip_pool_props_t *pr) {
  return pr->alloc_type == IP_MEM_ALLOCATION_TYPE_PINNED && pr->handle_types == 0 &&
         pr->location.type == IP_MEM_LOCATION_TYPE_DEVICE && pr->usage == 0 &&
         pr->win32_security_attributes == NULL;
}

static CUresult_t ip_pool_create(mempool_t *out, const ip_pool_props_t *pr) {
  mempool_t def = NULL;
  CUresult_t r = ip_pool_get_default(&def, pr->location.id); /* the device is gmr's */
  if (r != IP_CUDA_SUCCESS) return r;
  ip_pool_t *p = NULL;
  pthread_mutex_lock(&ip_pools_lock);
  for (size_t i = IP_MAX_DEVICES; i < IP_N_POOLS && p == NULL; ++i)
    if (atomic_load(&ip_pools[i].state) == IP_POOL_FREE) p = &ip_pools[i];
  if (p != NULL) ip_pool_init(p, pr->location.id, pr->max_size);
  pthread_mutex_unlock(&ip_pools_lock);
  IP_LOG("gmr-preload: cuMemPoolCreate(device %d, maxSize %zu) -> gmr pool %p", pr->location.id,
         pr->max_size, (void *)p);
  if (p == NULL) return IP_CUDA_ERROR_OUT_OF_MEMORY; /* IP_MAX_CREATED_POOLS live */
  *out = p;
  return IP_CUDA_SUCCESS;
}

static CUresult_t ip_pool_destroy(ip_pool_t *p) {
  if (p < &ip_pools[IP_MAX_DEVICES]) return IP_CUDA_ERROR_INVALID_VALUE; /* a default pool */
  pthread_mutex_lock(&ip_pools_lock);
  CUresult_t r = IP_CUDA_ERROR_INVALID_VALUE;
  if (atomic_load(&p->state) == IP_POOL_LIVE) {
    mempool_t self = p;
    atomic_compare_exchange_strong(&ip_pool_current[p->device], &self, NULL);
    atomic_store(&p->state, atomic_load(&p->live) ? IP_POOL_DESTROYED : IP_POOL_FREE);
    r = IP_CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&ip_pools_lock);
  return r;
}

static CUresult_t ip_pool_alloc_cu(CUdptr_t *dptr, size_t size, ip_pool_t *p, stream_t s) {
  if (dptr == NULL || size == 0 || !ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  void *ptr = NULL;
  int err = ip_pool_alloc(p, size, s, &ptr);
  IP_LOG("gmr-preload: cuMemAllocFromPoolAsync(%zu, pool %p, %p) -> %p (%d)", size, (void *)p, s,
         ptr, err);
  if (err == 0) *dptr = (CUdptr_t)(uintptr_t)ptr;
  return ip_cu_status(err);
}

static CUresult_t ip_pool_set_attr(ip_pool_t *p, int attr, const void *value) {
  if (value == NULL || !ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  CUresult_t r = IP_CUDA_SUCCESS;
  pthread_mutex_lock(&ip_pools_lock);
  switch (attr) {
  case IP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case IP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case IP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    p->reuse[attr - 1] = *(const int *)value != 0;
    break;
  case IP_POOL_ATTR_RELEASE_THRESHOLD:
    p->release_threshold = *(const uint64_t *)value;
    break;
  case IP_POOL_ATTR_RESERVED_MEM_HIGH:
    if (*(const uint64_t *)value != 0) {
      r = IP_CUDA_ERROR_INVALID_VALUE;
    } else {
      gmr_runtime_t *rt = ip_runtime(p->device);
      if (rt != NULL) gmr_stats_reset_peak(rt);
    }
    break;
  case IP_POOL_ATTR_USED_MEM_HIGH:
    if (*(const uint64_t *)value != 0)
      r = IP_CUDA_ERROR_INVALID_VALUE;
    else
      atomic_store(&p->used_high, atomic_load(&p->used));
    break;
  default: /* the current values are read-only */
    r = IP_CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&ip_pools_lock);
  IP_LOG("gmr-preload: cuMemPoolSetAttribute(gmr pool %p, %d): %d", (void *)p, attr, r);
  return r;
}

static CUresult_t ip_pool_get_attr(ip_pool_t *p, int attr, void *value) {
  if (value == NULL || !ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  if (attr == IP_POOL_ATTR_RESERVED_MEM_CURRENT || attr == IP_POOL_ATTR_RESERVED_MEM_HIGH) {
    gmr_runtime_t *rt = ip_runtime(p->device);
    if (rt == NULL || gmr_stats(rt, &st) != 0) return IP_CUDA_ERROR_UNKNOWN;
  }
  CUresult_t r = IP_CUDA_SUCCESS;
  pthread_mutex_lock(&ip_pools_lock);
  switch (attr) {
  case IP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case IP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case IP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    *(int *)value = p->reuse[attr - 1];
    break;
  case IP_POOL_ATTR_RELEASE_THRESHOLD:
    *(uint64_t *)value = p->release_threshold;
    break;
  case IP_POOL_ATTR_RESERVED_MEM_CURRENT:
    *(uint64_t *)value = st.reserved_bytes;
    break;
  case IP_POOL_ATTR_RESERVED_MEM_HIGH:
    *(uint64_t *)value = st.peak_reserved_bytes;
    break;
  case IP_POOL_ATTR_USED_MEM_CURRENT:
    *(uint64_t *)value = atomic_load(&p->used);
    break;
  case IP_POOL_ATTR_USED_MEM_HIGH:
    *(uint64_t *)value = atomic_load(&p->used_high);
    break;
  default:
    r = IP_CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&ip_pools_lock);
  return r;
}

static CUresult_t ip_pool_trim(ip_pool_t *p, size_t keep) {
  if (!ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  gmr_runtime_t *rt = ip_runtime(p->device);
  gmr_stats_t st;
  if (rt == NULL || gmr_stats(rt, &st) != 0) return IP_CUDA_ERROR_UNKNOWN;
  int err = st.reserved_bytes > keep ? gmr_empty_cache(rt) : 0;
  IP_LOG("gmr-preload: cuMemPoolTrimTo(gmr pool %p, %zu): %llu bytes reserved, emptied: %d",
         (void *)p, keep, (unsigned long long)st.reserved_bytes, err);
  return err == 0 ? IP_CUDA_SUCCESS : IP_CUDA_ERROR_UNKNOWN;
}

static CUresult_t ip_pool_set_access(ip_pool_t *p, const ip_access_desc_t *map, size_t count) {
  if ((map == NULL && count != 0) || !ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    const ip_access_desc_t *a = &map[i];
    if (a->location.type != IP_MEM_LOCATION_TYPE_DEVICE || a->location.id < 0 ||
        a->location.id >= IP_MAX_DEVICES ||
        (a->flags != IP_MEM_ACCESS_FLAGS_PROT_NONE && a->flags != IP_MEM_ACCESS_FLAGS_PROT_READ &&
         a->flags != IP_MEM_ACCESS_FLAGS_PROT_READWRITE) ||
        (a->location.id == p->device && a->flags != IP_MEM_ACCESS_FLAGS_PROT_READWRITE))
      return IP_CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_lock(&ip_pools_lock);
  for (size_t i = 0; i < count; ++i)
    p->access[map[i].location.id] = (unsigned char)map[i].flags;
  pthread_mutex_unlock(&ip_pools_lock);
  IP_LOG("gmr-preload: cuMemPoolSetAccess(gmr pool %p, %zu entries)", (void *)p, count);
  return IP_CUDA_SUCCESS;
}

static CUresult_t ip_pool_get_access(int *flags, ip_pool_t *p, const ip_mem_location_t *loc) {
  if (flags == NULL || loc == NULL || !ip_pool_live(p)) return IP_CUDA_ERROR_INVALID_VALUE;
  if (loc->type != IP_MEM_LOCATION_TYPE_DEVICE || loc->id < 0 || loc->id >= IP_MAX_DEVICES)
    return IP_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&ip_pools_lock);
  *flags = p->access[loc->id];
  pthread_mutex_unlock(&ip_pools_lock);
  return IP_CUDA_SUCCESS;
}

/* cuMem{Get,Set}*MemPool name a location and a kind: device memory is gmr's. */
static inline bool ip_pool_location_is_gmr(const ip_mem_location_t *loc, int type) {
  return loc != NULL && loc->type == IP_MEM_LOCATION_TYPE_DEVICE &&
         type == IP_MEM_ALLOCATION_TYPE_PINNED;
}

/* ---- the driver API ----------------------------------------------------------------- */

IP_EXPORT CUresult_t cuDeviceGetDefaultMemPool(mempool_t *pool_out, int dev) {
  if (ip_from_gmr(IP_CALLER())) return IP_PDRV(device_get_default, pool_out, dev);
  return ip_pool_get_default(pool_out, dev);
}

IP_EXPORT CUresult_t cuDeviceGetMemPool(mempool_t *pool, int dev) {
  if (ip_from_gmr(IP_CALLER())) return IP_PDRV(device_get, pool, dev);
  return ip_pool_get_current(pool, dev);
}

IP_EXPORT CUresult_t cuDeviceSetMemPool(int dev, mempool_t pool) {
  ip_pool_t *p = ip_pool_of(pool);
  if (ip_from_gmr(IP_CALLER()) || (p == NULL && (dev < 0 || dev >= IP_MAX_DEVICES)))
    return IP_PDRV(device_set, dev, pool);
  if (p != NULL) return ip_pool_set_current(dev, p);
  CUresult_t r = IP_PDRV(device_set, dev, pool);
  if (r == IP_CUDA_SUCCESS) atomic_store(&ip_pool_current[dev], pool);
  IP_LOG("gmr-preload: cuDeviceSetMemPool(%d, driver's pool %p): %d", dev, pool, r);
  return r;
}

IP_EXPORT CUresult_t cuMemGetDefaultMemPool(mempool_t *pool_out, ip_mem_location_t *location,
                                            int type) {
  if (ip_from_gmr(IP_CALLER()) || !ip_pool_location_is_gmr(location, type))
    return IP_PDRV(mem_get_default, pool_out, location, type);
  return ip_pool_get_default(pool_out, location->id);
}

IP_EXPORT CUresult_t cuMemGetMemPool(mempool_t *pool, ip_mem_location_t *location, int type) {
  if (ip_from_gmr(IP_CALLER()) || !ip_pool_location_is_gmr(location, type))
    return IP_PDRV(mem_get, pool, location, type);
  return ip_pool_get_current(pool, location->id);
}

IP_EXPORT CUresult_t cuMemSetMemPool(ip_mem_location_t *location, int type, mempool_t pool) {
  ip_pool_t *p = ip_pool_of(pool);
  if (ip_from_gmr(IP_CALLER()) || !ip_pool_location_is_gmr(location, type)) {
    if (p != NULL) return IP_CUDA_ERROR_INVALID_VALUE; /* a gmr pool holds device memory */
    return IP_PDRV(mem_set, location, type, pool);
  }
  if (p != NULL) return ip_pool_set_current(location->id, p);
  if (location->id < 0 || location->id >= IP_MAX_DEVICES)
    return IP_PDRV(mem_set, location, type, pool);
  CUresult_t r = IP_PDRV(mem_set, location, type, pool);
  if (r == IP_CUDA_SUCCESS) atomic_store(&ip_pool_current[location->id], pool);
  return r;
}

IP_EXPORT CUresult_t cuMemPoolCreate(mempool_t *pool, const ip_pool_props_t *props) {
  if (ip_from_gmr(IP_CALLER()) || pool == NULL || props == NULL || !ip_pool_servable(props)) {
    CUresult_t r = IP_PDRV(create, pool, props);
    IP_LOG("gmr-preload: cuMemPoolCreate: not gmr's to serve, the driver's pool: %d", r);
    return r;
  }
  return ip_pool_create(pool, props);
}

IP_EXPORT CUresult_t cuMemPoolDestroy(mempool_t pool) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) {
    CUresult_t r = IP_PDRV(destroy, pool);
    /* A destroyed current pool: the device's default one is current again. */
    for (int d = 0; r == IP_CUDA_SUCCESS && d < IP_MAX_DEVICES; ++d) {
      mempool_t self = pool;
      atomic_compare_exchange_strong(&ip_pool_current[d], &self, NULL);
    }
    return r;
  }
  return ip_pool_destroy(p);
}

IP_EXPORT CUresult_t cuMemAllocFromPoolAsync(CUdptr_t *dptr, size_t bytesize, mempool_t pool,
                                             stream_t s) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(alloc_from, dptr, bytesize, pool, s);
  return ip_pool_alloc_cu(dptr, bytesize, p, s);
}

IP_EXPORT CUresult_t cuMemAllocFromPoolAsync_ptsz(CUdptr_t *dptr, size_t bytesize, mempool_t pool,
                                                  stream_t s) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER()))
    return IP_PDRV(alloc_from_ptsz, dptr, bytesize, pool, s);
  return ip_pool_alloc_cu(dptr, bytesize, p, s ? s : IP_cudaStreamPerThread);
}

IP_EXPORT CUresult_t cuMemPoolSetAttribute(mempool_t pool, int attr, void *value) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(set_attribute, pool, attr, value);
  return ip_pool_set_attr(p, attr, value);
}

IP_EXPORT CUresult_t cuMemPoolGetAttribute(mempool_t pool, int attr, void *value) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(get_attribute, pool, attr, value);
  return ip_pool_get_attr(p, attr, value);
}

IP_EXPORT CUresult_t cuMemPoolTrimTo(mempool_t pool, size_t minBytesToKeep) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(trim_to, pool, minBytesToKeep);
  return ip_pool_trim(p, minBytesToKeep);
}

IP_EXPORT CUresult_t cuMemPoolSetAccess(mempool_t pool, const ip_access_desc_t *map, size_t count) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(set_access, pool, map, count);
  return ip_pool_set_access(p, map, count);
}

IP_EXPORT CUresult_t cuMemPoolGetAccess(int *flags, mempool_t pool, ip_mem_location_t *location) {
  ip_pool_t *p = ip_pool_of(pool);
  if (p == NULL || ip_from_gmr(IP_CALLER())) return IP_PDRV(get_access, flags, pool, location);
  return ip_pool_get_access(flags, p, location);
}

IP_EXPORT CUresult_t cuMemPoolExportToShareableHandle(void *handle_out, mempool_t pool,
                                                      int handleType, unsigned long long flags) {
  if (ip_pool_of(pool) != NULL) return IP_CUDA_ERROR_NOT_SUPPORTED;
  return IP_PDRV(export_handle, handle_out, pool, handleType, flags);
}

IP_EXPORT CUresult_t cuMemPoolExportPointer(void *shareData_out, CUdptr_t ptr) {
  if (ip_ptr_known((uintptr_t)ptr)) return IP_CUDA_ERROR_NOT_SUPPORTED;
  return IP_PDRV(export_pointer, shareData_out, ptr);
}

IP_EXPORT CUresult_t cuMemPoolImportPointer(CUdptr_t *ptr_out, mempool_t pool, void *shareData) {
  if (ip_pool_of(pool) != NULL) return IP_CUDA_ERROR_NOT_SUPPORTED;
  return IP_PDRV(import_pointer, ptr_out, pool, shareData);
}

/* ---- the runtime API ---------------------------------------------------------------- */

/* The real runtime's `name`, else the driver's `drv` (same handles and numbers). */
#define IP_POOL_RT(name, caller, drv, ...)                                                         \
  do {                                                                                             \
    __typeof__(&name) real_ = IP_REAL(name, caller);                                               \
    if (real_ != NULL) return real_(__VA_ARGS__);                                                  \
    return IP_PDRV(drv, __VA_ARGS__);                                                              \
  } while (0)

static _Atomic(void *) ip_real_cudaDeviceGetDefaultMemPool, ip_real_cudaDeviceGetMemPool,
    ip_real_cudaDeviceSetMemPool, ip_real_cudaMemPoolCreate, ip_real_cudaMemPoolDestroy,
    ip_real_cudaMallocFromPoolAsync, ip_real_cudaMallocFromPoolAsync_ptsz,
    ip_real_cudaMemPoolSetAttribute, ip_real_cudaMemPoolGetAttribute, ip_real_cudaMemPoolTrimTo,
    ip_real_cudaMemPoolSetAccess, ip_real_cudaMemPoolGetAccess,
    ip_real_cudaMemPoolExportToShareableHandle, ip_real_cudaMemPoolExportPointer,
    ip_real_cudaMemPoolImportPointer;

IP_EXPORT cudaError_x cudaDeviceGetDefaultMemPool(mempool_t *memPool, int device) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller))
    IP_POOL_RT(cudaDeviceGetDefaultMemPool, caller, device_get_default, memPool, device);
  return ip_pool_get_default(memPool, device);
}

IP_EXPORT cudaError_x cudaDeviceGetMemPool(mempool_t *memPool, int device) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller)) IP_POOL_RT(cudaDeviceGetMemPool, caller, device_get, memPool, device);
  return ip_pool_get_current(memPool, device);
}

IP_EXPORT cudaError_x cudaDeviceSetMemPool(int device, mempool_t memPool) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p != NULL && !ip_from_gmr(caller)) return ip_pool_set_current(device, p);
  cudaError_x (*real)(int, mempool_t) = IP_REAL(cudaDeviceSetMemPool, caller);
  cudaError_x r = real ? real(device, memPool) : IP_PDRV(device_set, device, memPool);
  if (r == IP_cudaSuccess && !ip_from_gmr(caller) && device >= 0 && device < IP_MAX_DEVICES)
    atomic_store(&ip_pool_current[device], memPool);
  return r;
}

IP_EXPORT cudaError_x cudaMemPoolCreate(mempool_t *memPool, const ip_pool_props_t *poolProps) {
  const void *caller = IP_CALLER();
  if (ip_from_gmr(caller) || memPool == NULL || poolProps == NULL || !ip_pool_servable(poolProps))
    IP_POOL_RT(cudaMemPoolCreate, caller, create, memPool, poolProps);
  return ip_pool_create(memPool, poolProps);
}

IP_EXPORT cudaError_x cudaMemPoolDestroy(mempool_t memPool) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p != NULL && !ip_from_gmr(caller)) return ip_pool_destroy(p);
  cudaError_x (*real)(mempool_t) = IP_REAL(cudaMemPoolDestroy, caller);
  cudaError_x r = real ? real(memPool) : IP_PDRV(destroy, memPool);
  for (int d = 0; r == IP_cudaSuccess && d < IP_MAX_DEVICES; ++d) {
    mempool_t self = memPool;
    atomic_compare_exchange_strong(&ip_pool_current[d], &self, NULL);
  }
  return r;
}

static cudaError_x ip_pool_alloc_rt(void **ptr, size_t size, ip_pool_t *p, stream_t s) {
  if (ptr == NULL || !ip_pool_live(p)) return IP_cudaErrorInvalidValue;
  if (size == 0) {
    *ptr = NULL;
    return IP_cudaSuccess;
  }
  void *out = NULL;
  int err = ip_pool_alloc(p, size, s, &out);
  IP_LOG("gmr-preload: cudaMallocFromPoolAsync(%zu, pool %p, %p) -> %p (%d)", size, (void *)p, s,
         out, err);
  if (err == 0) *ptr = out;
  return ip_rt_status(err);
}

IP_EXPORT cudaError_x cudaMallocFromPoolAsync(void **ptr, size_t size, mempool_t memPool,
                                              stream_t stream) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller)) {
    cudaError_x (*real)(void **, size_t, mempool_t, stream_t) =
        IP_REAL(cudaMallocFromPoolAsync, caller);
    return real ? real(ptr, size, memPool, stream)
                : IP_PDRV(alloc_from, (CUdptr_t *)(void *)ptr, size, memPool, stream);
  }
  return ip_pool_alloc_rt(ptr, size, p, stream);
}

IP_EXPORT cudaError_x cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, mempool_t memPool,
                                                   stream_t stream) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller)) {
    cudaError_x (*real)(void **, size_t, mempool_t, stream_t) =
        IP_REAL(cudaMallocFromPoolAsync_ptsz, caller);
    return real ? real(ptr, size, memPool, stream)
                : IP_PDRV(alloc_from_ptsz, (CUdptr_t *)(void *)ptr, size, memPool, stream);
  }
  return ip_pool_alloc_rt(ptr, size, p, stream ? stream : IP_cudaStreamPerThread);
}

IP_EXPORT cudaError_x cudaMemPoolSetAttribute(mempool_t memPool, int attr, void *value) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller))
    IP_POOL_RT(cudaMemPoolSetAttribute, caller, set_attribute, memPool, attr, value);
  return ip_pool_set_attr(p, attr, value);
}

IP_EXPORT cudaError_x cudaMemPoolGetAttribute(mempool_t memPool, int attr, void *value) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller))
    IP_POOL_RT(cudaMemPoolGetAttribute, caller, get_attribute, memPool, attr, value);
  return ip_pool_get_attr(p, attr, value);
}

IP_EXPORT cudaError_x cudaMemPoolTrimTo(mempool_t memPool, size_t minBytesToKeep) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller))
    IP_POOL_RT(cudaMemPoolTrimTo, caller, trim_to, memPool, minBytesToKeep);
  return ip_pool_trim(p, minBytesToKeep);
}

IP_EXPORT cudaError_x cudaMemPoolSetAccess(mempool_t memPool, const ip_access_desc_t *descList,
                                           size_t count) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller))
    IP_POOL_RT(cudaMemPoolSetAccess, caller, set_access, memPool, descList, count);
  return ip_pool_set_access(p, descList, count);
}

IP_EXPORT cudaError_x cudaMemPoolGetAccess(int *flags, mempool_t memPool,
                                           ip_mem_location_t *location) {
  const void *caller = IP_CALLER();
  ip_pool_t *p = ip_pool_of(memPool);
  if (p == NULL || ip_from_gmr(caller))
    IP_POOL_RT(cudaMemPoolGetAccess, caller, get_access, flags, memPool, location);
  return ip_pool_get_access(flags, p, location);
}

IP_EXPORT cudaError_x cudaMemPoolExportToShareableHandle(void *shareableHandle, mempool_t memPool,
                                                         int handleType, unsigned int flags) {
  const void *caller = IP_CALLER();
  if (ip_pool_of(memPool) != NULL) return IP_CUDA_ERROR_NOT_SUPPORTED;
  cudaError_x (*real)(void *, mempool_t, int, unsigned) =
      IP_REAL(cudaMemPoolExportToShareableHandle, caller);
  return real ? real(shareableHandle, memPool, handleType, flags)
              : IP_PDRV(export_handle, shareableHandle, memPool, handleType, flags);
}

IP_EXPORT cudaError_x cudaMemPoolExportPointer(void *exportData, void *ptr) {
  const void *caller = IP_CALLER();
  if (ip_ptr_known((uintptr_t)ptr)) return IP_CUDA_ERROR_NOT_SUPPORTED;
  cudaError_x (*real)(void *, void *) = IP_REAL(cudaMemPoolExportPointer, caller);
  return real ? real(exportData, ptr)
              : IP_PDRV(export_pointer, exportData, (CUdptr_t)(uintptr_t)ptr);
}

IP_EXPORT cudaError_x cudaMemPoolImportPointer(void **ptr, mempool_t memPool, void *exportData) {
  const void *caller = IP_CALLER();
  if (ip_pool_of(memPool) != NULL) return IP_CUDA_ERROR_NOT_SUPPORTED;
  cudaError_x (*real)(void **, mempool_t, void *) = IP_REAL(cudaMemPoolImportPointer, caller);
  return real ? real(ptr, memPool, exportData)
              : IP_PDRV(import_pointer, (CUdptr_t *)(void *)ptr, memPool, exportData);
}

/* ---- lookups ------------------------------------------------------------------------ */

/* The driver's pool names that both lookups answer with our function
 * (cuMemAllocFromPoolAsync, which depends on the lookup, aside). */
typedef struct ip_pool_name_s {
  const char *name;
  void *fn;
} ip_pool_name_t;

static const ip_pool_name_t ip_pool_driver_names[] = {
    {"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool},
    {"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool},
    {"cuDeviceSetMemPool", (void *)cuDeviceSetMemPool},
    {"cuMemGetDefaultMemPool", (void *)cuMemGetDefaultMemPool},
    {"cuMemGetMemPool", (void *)cuMemGetMemPool},
    {"cuMemSetMemPool", (void *)cuMemSetMemPool},
    {"cuMemPoolCreate", (void *)cuMemPoolCreate},
    {"cuMemPoolDestroy", (void *)cuMemPoolDestroy},
    {"cuMemPoolSetAttribute", (void *)cuMemPoolSetAttribute},
    {"cuMemPoolGetAttribute", (void *)cuMemPoolGetAttribute},
    {"cuMemPoolTrimTo", (void *)cuMemPoolTrimTo},
    {"cuMemPoolSetAccess", (void *)cuMemPoolSetAccess},
    {"cuMemPoolGetAccess", (void *)cuMemPoolGetAccess},
    {"cuMemPoolExportToShareableHandle", (void *)cuMemPoolExportToShareableHandle},
    {"cuMemPoolExportPointer", (void *)cuMemPoolExportPointer},
    {"cuMemPoolImportPointer", (void *)cuMemPoolImportPointer},
};

IP_RAW static void *ip_pool_find(const ip_pool_name_t *t, size_t n, const char *name) {
  for (size_t i = 0; i < n; ++i) {
    const char *a = name, *b = t[i].name; /* no strcmp: see IP_RAW */
    while (*a != '\0' && *a == *b)
      ++a, ++b;
    if (*a == *b) return t[i].fn;
  }
  return NULL;
}

/* Our function for a pool name looked up through cuGetProcAddress, or NULL. */
static void *ip_pool_proc_hook(const char *name, unsigned long long flags) {
  bool ptds = (flags & IP_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (strcmp(name, "cuMemAllocFromPoolAsync") == 0)
    return ptds ? (void *)cuMemAllocFromPoolAsync_ptsz : (void *)cuMemAllocFromPoolAsync;
  return ip_pool_find(ip_pool_driver_names,
                      sizeof ip_pool_driver_names / sizeof ip_pool_driver_names[0], name);
}

/* Our function for a pool name looked up by dlsym, or NULL: the driver's
 * names, both forms of cuMemAllocFromPoolAsync, and the runtime's. */
IP_RAW static void *ip_pool_dlsym_hook(const char *name) {
  static const ip_pool_name_t more[] = {
      {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
      {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz},
      {"cudaDeviceGetDefaultMemPool", (void *)cudaDeviceGetDefaultMemPool},
      {"cudaDeviceGetMemPool", (void *)cudaDeviceGetMemPool},
      {"cudaDeviceSetMemPool", (void *)cudaDeviceSetMemPool},
      {"cudaMemPoolCreate", (void *)cudaMemPoolCreate},
      {"cudaMemPoolDestroy", (void *)cudaMemPoolDestroy},
      {"cudaMallocFromPoolAsync", (void *)cudaMallocFromPoolAsync},
      {"cudaMallocFromPoolAsync_ptsz", (void *)cudaMallocFromPoolAsync_ptsz},
      {"cudaMemPoolSetAttribute", (void *)cudaMemPoolSetAttribute},
      {"cudaMemPoolGetAttribute", (void *)cudaMemPoolGetAttribute},
      {"cudaMemPoolTrimTo", (void *)cudaMemPoolTrimTo},
      {"cudaMemPoolSetAccess", (void *)cudaMemPoolSetAccess},
      {"cudaMemPoolGetAccess", (void *)cudaMemPoolGetAccess},
      {"cudaMemPoolExportToShareableHandle", (void *)cudaMemPoolExportToShareableHandle},
      {"cudaMemPoolExportPointer", (void *)cudaMemPoolExportPointer},
      {"cudaMemPoolImportPointer", (void *)cudaMemPoolImportPointer},
  };
  void *fn = ip_pool_find(ip_pool_driver_names,
                          sizeof ip_pool_driver_names / sizeof ip_pool_driver_names[0], name);
  return fn != NULL ? fn : ip_pool_find(more, sizeof more / sizeof more[0], name);
}
