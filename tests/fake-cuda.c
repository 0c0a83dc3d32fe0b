/* fake-cuda.c: a stand-in libcuda.so.1 for tests/interpose, so the
 * interposer's symbol resolution runs where there is no driver.
 *
 * It exports the driver entry points the interposer hooks, plus cuInit and
 * cuCtxGetDevice, each counting its calls in fake_cuda_state.  Its functions
 * are file-static and exported through aliases, so the addresses it hands out
 * (fake_cuda_state.fn, cuGetProcAddress) are its own even when the preloaded
 * interposer defines the same names.  cuCtxSynchronize only counts.  Memory: cuMemGetInfo_v2
 * reports 80 GiB free of 80 GiB; cuMemAlloc_v2 hands out addresses from 1 TiB upwards with nothing
 * behind them.
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

static void *fake_lookup(const char *name, unsigned long long flags) {
  const int ptds = (flags & 2) != 0;
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
