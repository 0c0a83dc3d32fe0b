/* interpose.c: TAP test of libgmr-preload.so's symbol resolution, on the
 * simulator and a stand-in libcuda.so.1 (tests/fake-cuda.c).
 *
 * Run by tests/interpose.sh with LD_PRELOAD=libgmr-preload.so, the fake
 * driver first on LD_LIBRARY_PATH, GMR_INTERPOSE_HIDE_VMM=1, and GMR_CONFIG
 * naming a simulated device of 1 GiB under `policy: direct` with
 * `limit: {bytes: 64MiB, counts: reserved}`.
 * Checks that every way a framework reaches the allocation entry points
 * (dlsym on the driver's handle as JAX does, cuGetProcAddress(_v2) as cudart
 * does, plain symbols) lands in gmr, that memory info reports the limit, that
 * pointers gmr does not own reach the real driver, and that other lookups,
 * RTLD_NEXT included, resolve as without the interposer.  With
 * GMR_TEST_DOUBLE_FREE=1 (tests/interpose-free.sh) it checks double frees.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

typedef struct fake_cuda_state_s {
  unsigned long allocs, frees, async_allocs, async_frees, get_info, get_proc, inits, syncs;
  unsigned long long next;
  struct {
    void *cuInit, *cuMemAlloc_v2, *cuMemFree_v2, *cuMemGetInfo_v2, *cuMemAllocAsync,
        *cuMemFreeAsync, *cuMemAllocAsync_ptsz, *cuMemFreeAsync_ptsz, *cuGetProcAddress,
        *cuGetProcAddress_v2, *cuCtxGetDevice, *cuDeviceGetAttribute;
  } fn;
  unsigned long creates, releases;
  void *cuMemCreate;
} fake_cuda_state_t;

typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);
typedef int (*info_fn)(size_t *, size_t *);
typedef int (*alloc_async_fn)(unsigned long long *, size_t, void *);
typedef int (*free_async_fn)(unsigned long long, void *);
typedef int (*proc_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*proc_fn)(const char *, void **, int, unsigned long long);
typedef int (*rt_alloc_fn)(void **, size_t);
typedef int (*rt_free_fn)(void *);
typedef int (*rt_info_fn)(size_t *, size_t *);
typedef int (*rt_alloc_async_fn)(void **, size_t, void *);
typedef int (*rt_free_async_fn)(void *, void *);

static gmr_stats_t stats(void) {
  gmr_runtime_t *rt = NULL;
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  if (gmr_default_runtime(0, &rt) == 0) gmr_stats(rt, &st);
  return st;
}

/* GMR_TEST_DOUBLE_FREE=1 (tests/interpose-free.sh, `policy: caching`): a
 * second free of a block gmr cached, or a free of an address inside one of
 * its segments, is an error and a log line, and never reaches the driver. */
static int double_free(void *cu, fake_cuda_state_t *fake) {
  alloc_fn alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
  free_fn dfree = (free_fn)dlsym(cu, "cuMemFree_v2");
  free_async_fn fa = (free_async_fn)dlsym(cu, "cuMemFreeAsync");
  rt_alloc_fn cm = (rt_alloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
  rt_free_fn cf = (rt_free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
  /* The interposer's log (GMR_INTERPOSE_LOG=1) goes to fd 2: catch it. */
  char logp[] = "/tmp/gmr-interpose-log-XXXXXX";
  int logfd = mkstemp(logp), saved = dup(2);
  dup2(logfd, 2);
  unsigned long long d = 0;
  int a1 = alloc(&d, 1 * MiB);
  int f1 = dfree(d);
  unsigned long frees = fake->frees, async_frees = fake->async_frees;
  int f2 = dfree(d);
  int f3 = dfree(d + 4096);
  int f4 = fa(d, NULL);
  void *p = NULL;
  int a2 = cm(&p, 1 * MiB);
  int f5 = cf(p);
  int f6 = cf(p);
  unsigned long frees_after = fake->frees, async_after = fake->async_frees;
  int f7 = dfree(0x7f0000000ull);
  dup2(saved, 2);
  close(saved);
  char log[8192] = "";
  ssize_t n = pread(logfd, log, sizeof log - 1, 0);
  log[n > 0 ? n : 0] = '\0';
  close(logfd);
  unlink(logp);
  ok(a1 == 0 && f1 == 0, "cuMemAlloc_v2(1 MiB), cuMemFree_v2: cached by gmr");
  is_int(f2, 1, "a second cuMemFree_v2 of it: CUDA_ERROR_INVALID_VALUE");
  is_int(f3, 1, "a cuMemFree_v2 inside its segment, never handed out: CUDA_ERROR_INVALID_VALUE");
  is_int(f4, 1, "a cuMemFreeAsync of it: CUDA_ERROR_INVALID_VALUE");
  is_u64(frees_after, frees, "  none reached the driver's cuMemFree");
  is_u64(async_after, async_frees, "  nor its cuMemFreeAsync");
  ok(a2 == 0 && f5 == 0, "cudaMalloc(1 MiB), cudaFree");
  is_int(f6, 1, "a second cudaFree: cudaErrorInvalidValue");
  like(log, "inside a segment gmr holds but no live block (freed already?): refused",
       "  each logged under GMR_INTERPOSE_LOG");
  is_int(f7, 0, "a pointer outside gmr's segments still goes to the driver");
  is_u64(fake->frees, frees_after + 1, "  which frees it");
  gmr_stats_t st = stats();
  is_u64(st.allocated_bytes, 0, "gmr's figures are intact: nothing allocated");
  return done_testing();
}

int main(void) {
  if (getenv("LD_PRELOAD") == NULL || strstr(getenv("LD_PRELOAD"), "libgmr-preload") == NULL) {
    printf("1..0 # SKIP run through tests/interpose.sh (needs LD_PRELOAD)\n");
    return 0;
  }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ok(cu != NULL, "dlopen(\"libcuda.so.1\") finds the stand-in driver")) {
    diag("%s", dlerror());
    return 1;
  }
  fake_cuda_state_t *fake = dlsym(cu, "fake_cuda_state");
  ok(fake != NULL, "a name the interposer does not hook resolves as usual");
  if (fake == NULL) return 1;
  if (getenv("GMR_TEST_DOUBLE_FREE")) return double_free(cu, fake);

  /* ---- dlsym on the driver's handle, as JAX's plugin does ---- */
  alloc_fn alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
  free_fn dfree = (free_fn)dlsym(cu, "cuMemFree_v2");
  info_fn info = (info_fn)dlsym(cu, "cuMemGetInfo_v2");
  ok(alloc != NULL && (void *)alloc != fake->fn.cuMemAlloc_v2,
     "dlsym(libcuda, cuMemAlloc_v2) is the interposer's");
  ok((void *)alloc == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "  the same as the global symbol");
  ok(dfree != NULL && (void *)dfree != fake->fn.cuMemFree_v2, "dlsym(libcuda, cuMemFree_v2) too");
  ok(info != NULL && (void *)info != fake->fn.cuMemGetInfo_v2,
     "dlsym(libcuda, cuMemGetInfo_v2) too");
  ok(dlsym(cu, "cuInit") == fake->fn.cuInit, "cuInit is the driver's own");
  ok(dlsym(cu, "cuNoSuchFunction") == NULL && dlerror() != NULL,
     "an unknown name is NULL with a dlerror()");
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ok(libc != NULL && dlsym(libc, "cuMemAlloc_v2") == NULL,
     "a library without cuMemAlloc_v2 still answers NULL");

  unsigned long long d = 0;
  is_int(alloc(&d, 3 * MiB), 0, "cuMemAlloc_v2(3 MiB) succeeds");
  gmr_stats_t st = stats();
  is_u64(st.allocated_bytes, 3 * MiB, "  gmr allocated 3 MiB");
  is_u64(st.reserved_bytes, 3 * MiB, "  gmr reserved 3 MiB (direct)");
  is_u64(fake->allocs, 0, "  the driver was not asked");
  ok(d != 0 && fake->next == 1ull << 40, "  the address is gmr's, not the driver's");

  size_t f = 0, t = 0;
  is_int(info(&f, &t), 0, "cuMemGetInfo_v2 succeeds");
  is_u64(t, 64 * MiB, "  total = the 64 MiB limit");
  is_u64(f, 61 * MiB, "  free = 64 MiB - 3 MiB reserved");
  is_u64(fake->get_info, 1, "  after asking the driver once");

  unsigned long long big = 0;
  is_int(alloc(&big, 62 * MiB), 2, "62 MiB more is CUDA_ERROR_OUT_OF_MEMORY");
  ok(big == 0, "  and the out-parameter is untouched");
  is_int(alloc(&big, 0), 1, "0 bytes is CUDA_ERROR_INVALID_VALUE");

  is_int(dfree(d), 0, "cuMemFree_v2 of gmr's pointer");
  st = stats();
  is_u64(st.allocated_bytes, 0, "  gmr allocated 0");
  is_u64(st.num_frees, 1, "  one free in gmr");
  is_u64(fake->frees, 0, "  the driver was not asked");
  is_u64(fake->syncs, 1, "  after waiting for the device, as cuMemFree does");
  is_int(dfree(0x7f0000000ull), 0, "cuMemFree_v2 of a pointer gmr does not own");
  is_u64(fake->frees, 1, "  goes to the driver");

  /* ---- cuGetProcAddress, as the CUDA runtime does ---- */
  proc_v2_fn gp2 = (proc_v2_fn)dlsym(cu, "cuGetProcAddress_v2");
  proc_fn gp1 = (proc_fn)dlsym(cu, "cuGetProcAddress");
  ok(gp2 != NULL && (void *)gp2 != fake->fn.cuGetProcAddress_v2,
     "dlsym(libcuda, cuGetProcAddress_v2) is the interposer's");
  ok(gp1 != NULL && (void *)gp1 != fake->fn.cuGetProcAddress,
     "dlsym(libcuda, cuGetProcAddress) is the interposer's");
  void *pfn = NULL;
  int status = -1;
  is_int(gp2("cuMemAlloc", &pfn, 13000, 0, &status), 0, "cuGetProcAddress_v2(cuMemAlloc)");
  ok(pfn == (void *)alloc, "  hands out the interposer's cuMemAlloc_v2");
  is_int(status, 0, "  with the driver's status");
  gp2("cuMemFree", &pfn, 13000, 0, &status);
  ok(pfn == (void *)dfree, "cuGetProcAddress_v2(cuMemFree) is hooked");
  gp2("cuMemGetInfo", &pfn, 13000, 0, &status);
  ok(pfn == (void *)info, "cuGetProcAddress_v2(cuMemGetInfo) is hooked");
  gp2("cuMemAllocAsync", &pfn, 13000, 0, &status);
  ok(pfn == dlsym(cu, "cuMemAllocAsync") && pfn != fake->fn.cuMemAllocAsync,
     "cuGetProcAddress_v2(cuMemAllocAsync) is hooked");
  gp2("cuMemAllocAsync", &pfn, 13000, 2, &status);
  ok(pfn == dlsym(cu, "cuMemAllocAsync_ptsz") && pfn != fake->fn.cuMemAllocAsync_ptsz,
     "  per-thread default stream: the _ptsz hook");
  gp2("cuGetProcAddress", &pfn, 13000, 0, &status);
  ok(pfn == (void *)gp2, "cuGetProcAddress_v2(cuGetProcAddress) returns the hook itself");
  gp2("cuInit", &pfn, 13000, 0, &status);
  ok(pfn == fake->fn.cuInit, "cuGetProcAddress_v2(cuInit) is the driver's");
  gp2("cuMemAlloc", &pfn, 3000, 0, &status);
  ok(pfn == fake->fn.cuMemAlloc_v2, "a CUDA 3.0 caller gets the driver's old cuMemAlloc");
  status = -1;
  is_int(gp2("cuNoSuch", &pfn, 13000, 0, &status), 500, "an unknown name: the driver's error");
  is_int(status, 1, "  and status");
  gp1("cuMemFree", &pfn, 12000, 0);
  ok(pfn == (void *)dfree, "cuGetProcAddress (v1) hooks too");

  /* ---- GMR_INTERPOSE_HIDE_VMM=1: VMM support is hidden from everyone but gmr ---- */
  typedef int (*attr_fn)(int *, int, int);
  attr_fn attr = (attr_fn)dlsym(cu, "cuDeviceGetAttribute");
  ok(attr != NULL && (void *)attr != fake->fn.cuDeviceGetAttribute,
     "dlsym(libcuda, cuDeviceGetAttribute) is the interposer's");
  int v = -1;
  is_int(attr(&v, 102, 0), 0, "cuDeviceGetAttribute(VMM supported)");
  is_int(v, 0, "  reports 0 under GMR_INTERPOSE_HIDE_VMM=1 (the driver says 1)");
  attr(&v, 1, 0);
  is_int(v, 7, "  other attributes are the driver's");
  gp2("cuDeviceGetAttribute", &pfn, 13000, 0, &status);
  ok(pfn == (void *)attr, "cuGetProcAddress_v2(cuDeviceGetAttribute) is hooked");

  alloc_async_fn aa = (alloc_async_fn)dlsym(cu, "cuMemAllocAsync");
  free_async_fn fa = (free_async_fn)dlsym(cu, "cuMemFreeAsync");
  void *stream = (void *)(uintptr_t)7;
  is_int(aa(&d, 5 * MiB, stream), 0, "cuMemAllocAsync(5 MiB, stream 7)");
  is_u64(stats().allocated_bytes, 5 * MiB, "  gmr allocated 5 MiB");
  is_int(fa(d, stream), 0, "cuMemFreeAsync");
  is_u64(fake->syncs, 1, "  does not wait for the device");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_u64(fake->async_allocs + fake->async_frees, 0, "  the driver was not asked");

  /* ---- the runtime API, by symbol ---- */
  rt_alloc_fn cm = (rt_alloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
  rt_free_fn cf = (rt_free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
  rt_info_fn ci = (rt_info_fn)dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
  rt_alloc_async_fn cma = (rt_alloc_async_fn)dlsym(RTLD_DEFAULT, "cudaMallocAsync");
  rt_free_async_fn cfa = (rt_free_async_fn)dlsym(RTLD_DEFAULT, "cudaFreeAsync");
  ok(cm && cf && ci && cma && cfa, "the interposer defines the runtime API's entry points");
  void *p = (void *)1;
  is_int(cm(&p, 0), 0, "cudaMalloc(0) succeeds");
  ok(p == NULL, "  with NULL");
  is_u64(stats().num_allocs, 2, "  and allocates nothing");
  is_int(cm(&p, 10 * MiB), 0, "cudaMalloc(10 MiB)");
  is_u64(stats().allocated_bytes, 10 * MiB, "  gmr allocated 10 MiB");
  is_int(ci(&f, &t), 0, "cudaMemGetInfo (no runtime library: the driver's figures)");
  is_u64(t, 64 * MiB, "  total = the limit");
  is_u64(f, 54 * MiB, "  free = 64 - 10 MiB");
  void *q = NULL;
  is_int(cm(&q, 60 * MiB), 2, "cudaMalloc past the limit is cudaErrorMemoryAllocation");
  is_int(cf(p), 0, "cudaFree");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_int(cma(&p, 1 * MiB, stream), 0, "cudaMallocAsync");
  is_int(cfa(p, (void *)(uintptr_t)8), 0, "cudaFreeAsync on another stream");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_int(cf((void *)0x1000), 1, "cudaFree of a foreign pointer without a runtime library");

  /* ---- memory a framework maps itself (XLA: cuMemCreate) counts against the limit ---- */
  typedef int (*create_fn)(unsigned long long *, size_t, const void *, unsigned long long);
  typedef int (*release_fn)(unsigned long long);
  create_fn mc = (create_fn)dlsym(cu, "cuMemCreate");
  release_fn mr = (release_fn)dlsym(cu, "cuMemRelease");
  ok(mc != NULL && (void *)mc != fake->cuMemCreate,
     "dlsym(libcuda, cuMemCreate) is the interposer's");
  ok(mr != NULL, "dlsym(libcuda, cuMemRelease) resolves");
  unsigned long long h1 = 0, h2 = 0;
  is_int(mc(&h1, 40 * MiB, NULL, 0), 0, "cuMemCreate(40 MiB)");
  is_u64(fake->creates, 1, "  is created by the driver");
  info(&f, &t);
  is_u64(f, 24 * MiB, "  cuMemGetInfo: free = 64 - 40 MiB");
  is_int(mc(&h2, 30 * MiB, NULL, 0), 2,
         "cuMemCreate(30 MiB) past the limit: CUDA_ERROR_OUT_OF_MEMORY");
  is_u64(fake->creates, 1, "  without asking the driver");
  is_int(cm(&p, 30 * MiB), 2, "cudaMalloc(30 MiB) is refused too: one limit for both");
  is_int(mr(h1), 0, "cuMemRelease");
  is_u64(fake->releases, 1, "  reaches the driver");
  is_int(mc(&h2, 30 * MiB, NULL, 0), 0, "then cuMemCreate(30 MiB) fits");
  is_int(mr(h2), 0, "  and is released");
  is_int(mr(12345), 0, "releasing a handle gmr did not count goes to the driver alone");
  info(&f, &t);
  is_u64(f, 64 * MiB, "  and all 64 MiB are free again");

#if defined(__x86_64__)
  /* RTLD_NEXT from here must see the interposer's dlsym (it comes right after
   * the program), as it would without the interposer's own dlsym. */
  ok(dlsym(RTLD_NEXT, "dlsym") == dlsym(RTLD_DEFAULT, "dlsym"),
     "dlsym(RTLD_NEXT) resolves relative to its real caller");
  ok(libc != NULL && dlsym(RTLD_NEXT, "dlsym") != dlsym(libc, "dlsym"),
     "  not relative to the interposer (which would find libc's)");
#endif
  return done_testing();
}
