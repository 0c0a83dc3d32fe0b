/* fake-cuda.c: a stand-in libcuda.so.1 for tests/interpose, so the
 * interposer's symbol resolution runs where there is no driver.
 *
 * It exports the driver entry points the interposer hooks, plus cuInit and
 * cuCtxGetDevice, each counting its calls in fake_cuda_state.  Its functions
 * are file-static and exported through aliases, so the addresses it hands out
 * (fake_cuda_state.fn, cuGetProcAddress) are its own even when the preloaded
 * interposer defines the same names.  cuCtxSynchronize only counts.  Memory: cuMemGetInfo_v2
 * reports 80 GiB free of 80 GiB; cuMemAlloc_v2 hands out addresses from 1 TiB upwards with nothing
 * behind them.  The memory-pool entry points (cuMemPool*, cuDevice*MemPool...) count their calls in
 * fake_pool_state and hand out handles into fake_pool_state.pools; fake_pool_fn(name) is the
 * stand-in's own function of a pool name.
 */
#include <stdint.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

typedef struct fake_cuda_state_s {
  unsigned long allocs, frees, async_allocs, async_frees, get_info, get_proc, inits, syncs;
  unsigned long long next; /* the next address cuMemAlloc_v2 hands out */
  struct {
    void *cuInit, *cuMemAlloc_v2, *cuMemFree_v2, *cuMemGetInfo_v2, *cuMemAllocAsync,
        *cuMemFreeAsync, *cuMemAllocAsync_ptsz, *cuMemFreeAsync_ptsz, *cuGetProcAddress,
        *cuGetProcAddress_v2, *cuCtxGetDevice, *cuDeviceGetAttribute;
  } fn;
  unsigned long creates, releases; /* cuMemCreate / cuMemRelease calls */
  void *cuMemCreate;               /* the stand-in's own cuMemCreate */
} fake_cuda_state_t;

FAKE_EXPORT fake_cuda_state_t fake_cuda_state = {.next = 1ull << 40};

static int fake_init(unsigned flags) {
  (void)flags;
  ++fake_cuda_state.inits;
  return 0;
}
static int fake_alloc(unsigned long long *d, size_t n) {
  ++fake_cuda_state.allocs;
  *d = fake_cuda_state.next;
  fake_cuda_state.next += (n + 0xfffff) & ~0xfffffull;
  return 0;
}
static int fake_free(unsigned long long d) {
  (void)d;
  ++fake_cuda_state.frees;
  return 0;
}
static int fake_get_info(size_t *f, size_t *t) {
  ++fake_cuda_state.get_info;
  *f = *t = (size_t)80 << 30;
  return 0;
}
static int fake_alloc_async(unsigned long long *d, size_t n, void *s) {
  (void)s;
  ++fake_cuda_state.async_allocs;
  *d = fake_cuda_state.next;
  fake_cuda_state.next += (n + 0xfffff) & ~0xfffffull;
  return 0;
}
static int fake_free_async(unsigned long long d, void *s) {
  (void)d, (void)s;
  ++fake_cuda_state.async_frees;
  return 0;
}
static int fake_ctx_synchronize(void) {
  ++fake_cuda_state.syncs;
  return 0;
}
static int fake_ctx_get_device(int *dev) {
  *dev = 0;
  return 0;
}

/* Attribute 102 (VMM supported): 1; any other: 7. */
static int fake_get_attribute(int *value, int attrib, int dev) {
  (void)dev;
  *value = attrib == 102 ? 1 : 7;
  return 0;
}

/* ---- memory pools ---- */

typedef struct fake_pool_state_s {
  unsigned long get_default, get_current, set_current, creates, destroys, allocs_from,
      allocs_from_ptsz, set_attr, get_attr, trims, set_access, get_access, exports, export_ptrs,
      import_ptrs, mem_get_default, mem_get, mem_set;
  void *current;  /* the pool cuDeviceSetMemPool set, NULL for the default */
  char pools[16]; /* handles: &pools[0] the default pool, &pools[i] the i-th created */
  int last_attr;  /* the attribute of the last Set/GetAttribute */
} fake_pool_state_t;

FAKE_EXPORT fake_pool_state_t fake_pool_state;

static int fake_device_get_default_pool(void **pool, int dev) {
  (void)dev;
  ++fake_pool_state.get_default;
  *pool = &fake_pool_state.pools[0];
  return 0;
}
static int fake_device_get_pool(void **pool, int dev) {
  (void)dev;
  ++fake_pool_state.get_current;
  *pool = fake_pool_state.current ? fake_pool_state.current : &fake_pool_state.pools[0];
  return 0;
}
static int fake_device_set_pool(int dev, void *pool) {
  (void)dev;
  ++fake_pool_state.set_current;
  fake_pool_state.current = pool;
  return 0;
}
static int fake_mem_get_default_pool(void **pool, const void *loc, int type) {
  (void)loc, (void)type;
  ++fake_pool_state.mem_get_default;
  *pool = &fake_pool_state.pools[0];
  return 0;
}
static int fake_mem_get_pool(void **pool, const void *loc, int type) {
  (void)loc, (void)type;
  ++fake_pool_state.mem_get;
  *pool = &fake_pool_state.pools[0];
  return 0;
}
static int fake_mem_set_pool(const void *loc, int type, void *pool) {
  (void)loc, (void)type, (void)pool;
  ++fake_pool_state.mem_set;
  return 0;
}
static int fake_pool_create(void **pool, const void *props) {
  (void)props;
  ++fake_pool_state.creates;
  *pool = &fake_pool_state.pools[1 + fake_pool_state.creates % 15];
  return 0;
}
static int fake_pool_destroy(void *pool) {
  (void)pool;
  ++fake_pool_state.destroys;
  return 0;
}
static int fake_alloc_from_pool(unsigned long long *d, size_t n, void *pool, void *s) {
  (void)pool, (void)s;
  ++fake_pool_state.allocs_from;
  *d = fake_cuda_state.next;
  fake_cuda_state.next += (n + 0xfffff) & ~0xfffffull;
  return 0;
}
static int fake_alloc_from_pool_ptsz(unsigned long long *d, size_t n, void *pool, void *s) {
  ++fake_pool_state.allocs_from_ptsz;
  return fake_alloc_from_pool(d, n, pool, s);
}
static int fake_pool_set_attr(void *pool, int attr, void *value) {
  (void)pool, (void)value;
  ++fake_pool_state.set_attr;
  fake_pool_state.last_attr = attr;
  return 0;
}
/* Every attribute reads 42 (an int for 1-3, a 64-bit count for the others). */
static int fake_pool_get_attr(void *pool, int attr, void *value) {
  (void)pool;
  ++fake_pool_state.get_attr;
  fake_pool_state.last_attr = attr;
  if (attr >= 1 && attr <= 3)
    *(int *)value = 42;
  else
    *(unsigned long long *)value = 42;
  return 0;
}
static int fake_pool_trim(void *pool, size_t keep) {
  (void)pool, (void)keep;
  ++fake_pool_state.trims;
  return 0;
}
static int fake_pool_set_access(void *pool, const void *map, size_t n) {
  (void)pool, (void)map, (void)n;
  ++fake_pool_state.set_access;
  return 0;
}
static int fake_pool_get_access(int *flags, void *pool, const void *loc) {
  (void)pool, (void)loc;
  ++fake_pool_state.get_access;
  *flags = 1;
  return 0;
}
static int fake_pool_export(void *out, void *pool, int type, unsigned long long flags) {
  (void)out, (void)pool, (void)type, (void)flags;
  ++fake_pool_state.exports;
  return 0;
}
static int fake_pool_export_ptr(void *out, unsigned long long ptr) {
  (void)out, (void)ptr;
  ++fake_pool_state.export_ptrs;
  return 0;
}
static int fake_pool_import_ptr(unsigned long long *ptr, void *pool, void *data) {
  (void)pool, (void)data;
  ++fake_pool_state.import_ptrs;
  *ptr = 0x5000000000ull;
  return 0;
}

static const struct {
  const char *name;
  void *fn;
} fake_pool_table[] = {
    {"cuDeviceGetDefaultMemPool", (void *)fake_device_get_default_pool},
    {"cuDeviceGetMemPool", (void *)fake_device_get_pool},
    {"cuDeviceSetMemPool", (void *)fake_device_set_pool},
    {"cuMemGetDefaultMemPool", (void *)fake_mem_get_default_pool},
    {"cuMemGetMemPool", (void *)fake_mem_get_pool},
    {"cuMemSetMemPool", (void *)fake_mem_set_pool},
    {"cuMemPoolCreate", (void *)fake_pool_create},
    {"cuMemPoolDestroy", (void *)fake_pool_destroy},
    {"cuMemAllocFromPoolAsync", (void *)fake_alloc_from_pool},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)fake_alloc_from_pool_ptsz},
    {"cuMemPoolSetAttribute", (void *)fake_pool_set_attr},
    {"cuMemPoolGetAttribute", (void *)fake_pool_get_attr},
    {"cuMemPoolTrimTo", (void *)fake_pool_trim},
    {"cuMemPoolSetAccess", (void *)fake_pool_set_access},
    {"cuMemPoolGetAccess", (void *)fake_pool_get_access},
    {"cuMemPoolExportToShareableHandle", (void *)fake_pool_export},
    {"cuMemPoolExportPointer", (void *)fake_pool_export_ptr},
    {"cuMemPoolImportPointer", (void *)fake_pool_import_ptr},
};

/* The stand-in's own function for a pool name, or NULL. */
FAKE_EXPORT void *fake_pool_fn(const char *name) {
  for (size_t i = 0; i < sizeof fake_pool_table / sizeof fake_pool_table[0]; ++i)
    if (strcmp(name, fake_pool_table[i].name) == 0) return fake_pool_table[i].fn;
  return NULL;
}

static void *fake_lookup(const char *name, unsigned long long flags) {
  const int ptds = (flags & 2) != 0;
  if (strcmp(name, "cuMemAllocFromPoolAsync") == 0 && ptds)
    return (void *)fake_alloc_from_pool_ptsz;
  void *pool_fn = fake_pool_fn(name);
  if (pool_fn != NULL) return pool_fn;
  if (strcmp(name, "cuInit") == 0) return (void *)fake_init;
  if (strcmp(name, "cuMemAlloc") == 0) return (void *)fake_alloc;
  if (strcmp(name, "cuMemFree") == 0) return (void *)fake_free;
  if (strcmp(name, "cuMemGetInfo") == 0) return (void *)fake_get_info;
  if (strcmp(name, "cuMemAllocAsync") == 0)
    return ptds ? fake_cuda_state.fn.cuMemAllocAsync_ptsz : (void *)fake_alloc_async;
  if (strcmp(name, "cuMemFreeAsync") == 0)
    return ptds ? fake_cuda_state.fn.cuMemFreeAsync_ptsz : (void *)fake_free_async;
  if (strcmp(name, "cuCtxGetDevice") == 0) return (void *)fake_ctx_get_device;
  if (strcmp(name, "cuDeviceGetAttribute") == 0) return (void *)fake_get_attribute;
  if (strcmp(name, "cuGetProcAddress") == 0) return fake_cuda_state.fn.cuGetProcAddress_v2;
  return NULL;
}

static int fake_get_proc_v2(const char *name, void **pfn, int ver, unsigned long long flags,
                            int *status) {
  (void)ver;
  ++fake_cuda_state.get_proc;
  *pfn = fake_lookup(name, flags);
  if (status) *status = *pfn ? 0 : 1;
  return *pfn ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
static int fake_get_proc(const char *name, void **pfn, int ver, unsigned long long flags) {
  return fake_get_proc_v2(name, pfn, ver, flags, NULL);
}
/* Physical allocations for virtual memory: numbered handles, nothing behind. */
static int fake_mem_create(unsigned long long *h, size_t n, const void *prop,
                           unsigned long long flags) {
  (void)n, (void)prop, (void)flags;
  *h = ++fake_cuda_state.creates;
  return 0;
}
static int fake_mem_release(unsigned long long h) {
  (void)h;
  ++fake_cuda_state.releases;
  return 0;
}
/* The _ptsz variants are the same code under other addresses. */
static int fake_alloc_async_ptsz(unsigned long long *d, size_t n, void *s) {
  return fake_alloc_async(d, n, s);
}
static int fake_free_async_ptsz(unsigned long long d, void *s) {
  return fake_free_async(d, s);
}

FAKE_EXPORT int cuInit(unsigned) __attribute__((alias("fake_init")));
FAKE_EXPORT int cuMemAlloc_v2(unsigned long long *, size_t) __attribute__((alias("fake_alloc")));
FAKE_EXPORT int cuMemFree_v2(unsigned long long) __attribute__((alias("fake_free")));
FAKE_EXPORT int cuMemGetInfo_v2(size_t *, size_t *) __attribute__((alias("fake_get_info")));
FAKE_EXPORT int cuMemAllocAsync(unsigned long long *, size_t, void *)
    __attribute__((alias("fake_alloc_async")));
FAKE_EXPORT int cuMemFreeAsync(unsigned long long, void *)
    __attribute__((alias("fake_free_async")));
FAKE_EXPORT int cuMemAllocAsync_ptsz(unsigned long long *, size_t, void *)
    __attribute__((alias("fake_alloc_async_ptsz")));
FAKE_EXPORT int cuMemFreeAsync_ptsz(unsigned long long, void *)
    __attribute__((alias("fake_free_async_ptsz")));
FAKE_EXPORT int cuGetProcAddress(const char *, void **, int, unsigned long long)
    __attribute__((alias("fake_get_proc")));
FAKE_EXPORT int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *)
    __attribute__((alias("fake_get_proc_v2")));
FAKE_EXPORT int cuCtxGetDevice(int *) __attribute__((alias("fake_ctx_get_device")));
FAKE_EXPORT int cuCtxSynchronize(void) __attribute__((alias("fake_ctx_synchronize")));
FAKE_EXPORT int cuDeviceGetAttribute(int *, int, int) __attribute__((alias("fake_get_attribute")));
FAKE_EXPORT int cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long)
    __attribute__((alias("fake_mem_create")));
FAKE_EXPORT int cuMemRelease(unsigned long long) __attribute__((alias("fake_mem_release")));
FAKE_EXPORT int cuDeviceGetDefaultMemPool(void **, int)
    __attribute__((alias("fake_device_get_default_pool")));
FAKE_EXPORT int cuDeviceGetMemPool(void **, int) __attribute__((alias("fake_device_get_pool")));
FAKE_EXPORT int cuDeviceSetMemPool(int, void *) __attribute__((alias("fake_device_set_pool")));
FAKE_EXPORT int cuMemGetDefaultMemPool(void **, const void *, int)
    __attribute__((alias("fake_mem_get_default_pool")));
FAKE_EXPORT int cuMemGetMemPool(void **, const void *, int)
    __attribute__((alias("fake_mem_get_pool")));
FAKE_EXPORT int cuMemSetMemPool(const void *, int, void *)
    __attribute__((alias("fake_mem_set_pool")));
FAKE_EXPORT int cuMemPoolCreate(void **, const void *) __attribute__((alias("fake_pool_create")));
FAKE_EXPORT int cuMemPoolDestroy(void *) __attribute__((alias("fake_pool_destroy")));
FAKE_EXPORT int cuMemAllocFromPoolAsync(unsigned long long *, size_t, void *, void *)
    __attribute__((alias("fake_alloc_from_pool")));
FAKE_EXPORT int cuMemAllocFromPoolAsync_ptsz(unsigned long long *, size_t, void *, void *)
    __attribute__((alias("fake_alloc_from_pool_ptsz")));
FAKE_EXPORT int cuMemPoolSetAttribute(void *, int, void *)
    __attribute__((alias("fake_pool_set_attr")));
FAKE_EXPORT int cuMemPoolGetAttribute(void *, int, void *)
    __attribute__((alias("fake_pool_get_attr")));
FAKE_EXPORT int cuMemPoolTrimTo(void *, size_t) __attribute__((alias("fake_pool_trim")));
FAKE_EXPORT int cuMemPoolSetAccess(void *, const void *, size_t)
    __attribute__((alias("fake_pool_set_access")));
FAKE_EXPORT int cuMemPoolGetAccess(int *, void *, const void *)
    __attribute__((alias("fake_pool_get_access")));
FAKE_EXPORT int cuMemPoolExportToShareableHandle(void *, void *, int, unsigned long long)
    __attribute__((alias("fake_pool_export")));
FAKE_EXPORT int cuMemPoolExportPointer(void *, unsigned long long)
    __attribute__((alias("fake_pool_export_ptr")));
FAKE_EXPORT int cuMemPoolImportPointer(unsigned long long *, void *, void *)
    __attribute__((alias("fake_pool_import_ptr")));

__attribute__((constructor)) static void fake_cuda_setup(void) {
  fake_cuda_state.fn.cuInit = (void *)fake_init;
  fake_cuda_state.fn.cuMemAlloc_v2 = (void *)fake_alloc;
  fake_cuda_state.fn.cuMemFree_v2 = (void *)fake_free;
  fake_cuda_state.fn.cuMemGetInfo_v2 = (void *)fake_get_info;
  fake_cuda_state.fn.cuMemAllocAsync = (void *)fake_alloc_async;
  fake_cuda_state.fn.cuMemFreeAsync = (void *)fake_free_async;
  fake_cuda_state.fn.cuMemAllocAsync_ptsz = (void *)fake_alloc_async_ptsz;
  fake_cuda_state.fn.cuMemFreeAsync_ptsz = (void *)fake_free_async_ptsz;
  fake_cuda_state.fn.cuGetProcAddress = (void *)fake_get_proc;
  fake_cuda_state.fn.cuGetProcAddress_v2 = (void *)fake_get_proc_v2;
  fake_cuda_state.fn.cuCtxGetDevice = (void *)fake_ctx_get_device;
  fake_cuda_state.fn.cuDeviceGetAttribute = (void *)fake_get_attribute;
  fake_cuda_state.cuMemCreate = (void *)fake_mem_create;
}
