/* interpose-pools.c: TAP test of the memory-pool API in libgmr-preload.so
 * (lib/adapters/interpose-pools.c), on the simulator and a stand-in
 * libcuda.so.1 (tests/fake-cuda.c).
 *
 * Run by tests/interpose-pools.sh with LD_PRELOAD=libgmr-preload.so and
 * GMR_CONFIG naming a simulated device of 1 GiB under `policy: caching` with
 * `limit: {bytes: 64MiB, counts: reserved}`.  Checks every pool entry point
 * reached every way (symbol, cuGetProcAddress, cuGetProcAddress_v2, dlsym on
 * the driver's handle), gmr's pools and their attributes, TrimTo, the current
 * pool, destroy, pools gmr cannot serve and the driver's own pools passed
 * through untouched, export refused, and out of memory past the limit.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

typedef struct fake_cuda_state_s {
  unsigned long allocs, frees, async_allocs, async_frees, get_info, get_proc, inits, syncs;
  unsigned long long next;
} fake_cuda_state_t;

typedef struct fake_pool_state_s {
  unsigned long get_default, get_current, set_current, creates, destroys, allocs_from,
      allocs_from_ptsz, set_attr, get_attr, trims, set_access, get_access, exports, export_ptrs,
      import_ptrs, mem_get_default, mem_get, mem_set;
  void *current;
  char pools[16];
  int last_attr;
} fake_pool_state_t;

typedef struct {
  int type, id;
} loc_t;
typedef struct {
  int alloc_type, handle_types;
  loc_t location;
  void *win32;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
} props_t;
typedef struct {
  loc_t location;
  int flags;
} access_t;

enum {
  FOLLOW_EVENTS = 1,
  OPPORTUNISTIC,
  INTERNAL_DEPS,
  RELEASE_THRESHOLD,
  RESERVED_CURRENT,
  RESERVED_HIGH,
  USED_CURRENT,
  USED_HIGH
};

typedef unsigned long long dptr_t;
typedef int (*get_default_fn)(void **, int);
typedef int (*set_pool_fn)(int, void *);
typedef int (*create_fn)(void **, const props_t *);
typedef int (*destroy_fn)(void *);
typedef int (*alloc_from_fn)(dptr_t *, size_t, void *, void *);
typedef int (*attr_fn)(void *, int, void *);
typedef int (*trim_fn)(void *, size_t);
typedef int (*set_access_fn)(void *, const access_t *, size_t);
typedef int (*get_access_fn)(int *, void *, const loc_t *);
typedef int (*export_fn)(void *, void *, int, unsigned long long);
typedef int (*export_ptr_fn)(void *, dptr_t);
typedef int (*import_ptr_fn)(dptr_t *, void *, void *);
typedef int (*mem_get_fn)(void **, const loc_t *, int);
typedef int (*mem_set_fn)(const loc_t *, int, void *);
typedef int (*alloc_async_fn)(dptr_t *, size_t, void *);
typedef int (*free_async_fn)(dptr_t, void *);
typedef int (*proc_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*proc_fn)(const char *, void **, int, unsigned long long);
typedef void *(*pool_fn_fn)(const char *);
typedef int (*rt_alloc_from_fn)(void **, size_t, void *, void *);
typedef int (*rt_free_fn)(void *);
typedef int (*rt_alloc_async_fn)(void **, size_t, void *);

static gmr_stats_t stats(void) {
  gmr_runtime_t *rt = NULL;
  gmr_stats_t st;
  memset(&st, 0, sizeof st);
  if (gmr_default_runtime(0, &rt) == 0) gmr_stats(rt, &st);
  return st;
}

static uint64_t attr64(attr_fn get, void *pool, int attr) {
  uint64_t v = UINT64_MAX;
  if (get(pool, attr, &v) != 0) return UINT64_MAX - 1;
  return v;
}

static const char *const driver_names[] = {
    "cuDeviceGetDefaultMemPool", "cuDeviceGetMemPool",
    "cuDeviceSetMemPool",        "cuMemGetDefaultMemPool",
    "cuMemGetMemPool",           "cuMemSetMemPool",
    "cuMemPoolCreate",           "cuMemPoolDestroy",
    "cuMemAllocFromPoolAsync",   "cuMemAllocFromPoolAsync_ptsz",
    "cuMemPoolSetAttribute",     "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",           "cuMemPoolSetAccess",
    "cuMemPoolGetAccess",        "cuMemPoolExportToShareableHandle",
    "cuMemPoolExportPointer",    "cuMemPoolImportPointer",
};

static const char *const runtime_names[] = {
    "cudaDeviceGetDefaultMemPool",
    "cudaDeviceGetMemPool",
    "cudaDeviceSetMemPool",
    "cudaMemPoolCreate",
    "cudaMemPoolDestroy",
    "cudaMallocFromPoolAsync",
    "cudaMallocFromPoolAsync_ptsz",
    "cudaMemPoolSetAttribute",
    "cudaMemPoolGetAttribute",
    "cudaMemPoolTrimTo",
    "cudaMemPoolSetAccess",
    "cudaMemPoolGetAccess",
    "cudaMemPoolExportToShareableHandle",
    "cudaMemPoolExportPointer",
    "cudaMemPoolImportPointer",
};

int main(void) {
  if (getenv("LD_PRELOAD") == NULL || strstr(getenv("LD_PRELOAD"), "libgmr-preload") == NULL) {
    printf("1..0 # SKIP run through tests/interpose-pools.sh (needs LD_PRELOAD)\n");
    return 0;
  }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ok(cu != NULL, "dlopen(\"libcuda.so.1\") finds the stand-in driver")) return 1;
  fake_cuda_state_t *fake = dlsym(cu, "fake_cuda_state");
  fake_pool_state_t *fp = dlsym(cu, "fake_pool_state");
  pool_fn_fn own = (pool_fn_fn)dlsym(cu, "fake_pool_fn");
  if (!ok(fake && fp && own, "the stand-in's state")) return 1;

  /* ---- no gmr runtime (a bad GMR_CONFIG, in a child): no pool, not the driver's ---- */
  {
    int up[2];
    if (pipe(up) != 0) return 1;
    pid_t child = fork();
    if (child == 0) {
      setenv("GMR_CONFIG", "/nonexistent/gmr.yaml", 1);
      get_default_fn gd = (get_default_fn)dlsym(cu, "cuDeviceGetDefaultMemPool");
      create_fn cr = (create_fn)dlsym(cu, "cuMemPoolCreate");
      props_t pr;
      memset(&pr, 0, sizeof pr);
      pr.alloc_type = 1;
      pr.location = (loc_t){1, 0};
      void *h = NULL;
      int out[4] = {gd(&h, 0), cr(&h, &pr), (int)fp->get_default, (int)fp->creates};
      _exit(write(up[1], out, sizeof out) == (ssize_t)sizeof out ? 0 : 1);
    }
    int res[4] = {-1, -1, -1, -1};
    ok(read(up[0], res, sizeof res) == (ssize_t)sizeof res && waitpid(child, NULL, 0) == child,
       "without a gmr runtime (GMR_CONFIG names no file):");
    is_int(res[0], 999, "  cuDeviceGetDefaultMemPool is CUDA_ERROR_UNKNOWN");
    is_int(res[1], 999, "  so is cuMemPoolCreate of device memory");
    is_int(res[2], 2, "  after the driver said the device is valid");
    is_int(res[3], 0, "  and the driver made no pool");
    close(up[0]);
    close(up[1]);
  }

  /* ---- every way to reach every entry point ---- */
  proc_v2_fn gp2 = (proc_v2_fn)dlsym(cu, "cuGetProcAddress_v2");
  proc_fn gp1 = (proc_fn)dlsym(cu, "cuGetProcAddress");
  int hooked = 0, same = 0, by_proc = 0, by_proc1 = 0;
  const size_t n_driver = sizeof driver_names / sizeof driver_names[0];
  for (size_t i = 0; i < n_driver; ++i) {
    const char *name = driver_names[i];
    void *mine = dlsym(cu, name), *pfn = NULL, *pfn1 = NULL;
    int status = -1;
    hooked += mine != NULL && mine != own(name);
    same += mine == dlsym(RTLD_DEFAULT, name);
    if (strcmp(name, "cuMemAllocFromPoolAsync_ptsz") == 0) {
      gp2("cuMemAllocFromPoolAsync", &pfn, 13000, 2, &status);
      gp1("cuMemAllocFromPoolAsync", &pfn1, 13000, 2);
    } else {
      gp2(name, &pfn, 13000, 0, &status);
      gp1(name, &pfn1, 13000, 0);
    }
    by_proc += pfn == mine && status == 0;
    by_proc1 += pfn1 == mine;
  }
  is_int(hooked, (int)n_driver, "dlsym(libcuda, ...) is the interposer's for all %zu pool calls",
         n_driver);
  is_int(same, (int)n_driver, "  the same as the global symbols");
  is_int(by_proc, (int)n_driver,
         "  cuGetProcAddress_v2 hands out the same (the _ptsz one "
         "with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)");
  is_int(by_proc1, (int)n_driver, "  and so does cuGetProcAddress");
  int rt_defined = 0;
  for (size_t i = 0; i < sizeof runtime_names / sizeof runtime_names[0]; ++i)
    rt_defined += dlsym(RTLD_DEFAULT, runtime_names[i]) != NULL;
  is_int(rt_defined, (int)(sizeof runtime_names / sizeof runtime_names[0]),
         "the interposer defines the runtime's pool calls");

  get_default_fn get_default = (get_default_fn)dlsym(cu, "cuDeviceGetDefaultMemPool");
  get_default_fn get_current = (get_default_fn)dlsym(cu, "cuDeviceGetMemPool");
  set_pool_fn set_current = (set_pool_fn)dlsym(cu, "cuDeviceSetMemPool");
  create_fn create = (create_fn)dlsym(cu, "cuMemPoolCreate");
  destroy_fn destroy = (destroy_fn)dlsym(cu, "cuMemPoolDestroy");
  alloc_from_fn alloc_from = (alloc_from_fn)dlsym(cu, "cuMemAllocFromPoolAsync");
  alloc_from_fn alloc_from_ptsz = (alloc_from_fn)dlsym(cu, "cuMemAllocFromPoolAsync_ptsz");
  attr_fn set_attr = (attr_fn)dlsym(cu, "cuMemPoolSetAttribute");
  attr_fn get_attr = (attr_fn)dlsym(cu, "cuMemPoolGetAttribute");
  trim_fn trim = (trim_fn)dlsym(cu, "cuMemPoolTrimTo");
  set_access_fn set_access = (set_access_fn)dlsym(cu, "cuMemPoolSetAccess");
  get_access_fn get_access = (get_access_fn)dlsym(cu, "cuMemPoolGetAccess");
  export_fn export_handle = (export_fn)dlsym(cu, "cuMemPoolExportToShareableHandle");
  export_ptr_fn export_ptr = (export_ptr_fn)dlsym(cu, "cuMemPoolExportPointer");
  import_ptr_fn import_ptr = (import_ptr_fn)dlsym(cu, "cuMemPoolImportPointer");
  mem_get_fn mem_get_default = (mem_get_fn)dlsym(cu, "cuMemGetDefaultMemPool");
  mem_get_fn mem_get = (mem_get_fn)dlsym(cu, "cuMemGetMemPool");
  mem_set_fn mem_set = (mem_set_fn)dlsym(cu, "cuMemSetMemPool");
  alloc_async_fn alloc_async = (alloc_async_fn)dlsym(cu, "cuMemAllocAsync");
  free_async_fn free_async = (free_async_fn)dlsym(cu, "cuMemFreeAsync");
  free_async_fn free_async_ptsz = (free_async_fn)dlsym(cu, "cuMemFreeAsync_ptsz");
  void *stream = (void *)(uintptr_t)7;

  /* ---- the default pool is gmr's ---- */
  void *pool = NULL, *p2 = NULL;
  is_int(get_default(&pool, 0), 0, "cuDeviceGetDefaultMemPool(0)");
  ok(pool != NULL && (pool < (void *)fp->pools || pool >= (void *)(fp->pools + 16)),
     "  is a gmr pool, not the driver's");
  is_u64(fp->get_default, 0, "  the driver was not asked");
  is_int(get_default(&p2, 0), 0, "cuDeviceGetDefaultMemPool(0) again");
  ok(p2 == pool, "  the same handle");
  p2 = NULL;
  is_int(get_current(&p2, 0), 0, "cuDeviceGetMemPool(0)");
  ok(p2 == pool, "  the current pool is the default one");
  is_int(get_default(NULL, 0), 1, "a NULL out-parameter: CUDA_ERROR_INVALID_VALUE");
  is_int(get_default(&p2, -1), 101, "device -1: CUDA_ERROR_INVALID_DEVICE");
  get_default_fn rt_get_default =
      (get_default_fn)dlsym(RTLD_DEFAULT, "cudaDeviceGetDefaultMemPool");
  p2 = NULL;
  is_int(rt_get_default(&p2, 0), 0, "cudaDeviceGetDefaultMemPool(0)");
  ok(p2 == pool, "  the same gmr pool");
  loc_t dev0 = {1, 0}, host = {2, 0};
  p2 = NULL;
  is_int(mem_get_default(&p2, &dev0, 1), 0, "cuMemGetDefaultMemPool(device 0, pinned)");
  ok(p2 == pool, "  the same gmr pool");
  p2 = NULL;
  is_int(mem_get(&p2, &dev0, 1), 0, "cuMemGetMemPool(device 0, pinned)");
  ok(p2 == pool, "  is the current gmr pool");
  is_u64(fp->mem_get_default + fp->mem_get, 0, "  the driver was not asked");
  is_int(mem_get_default(&p2, &host, 1), 0, "cuMemGetDefaultMemPool(host)");
  ok(p2 == (void *)&fp->pools[0] && fp->mem_get_default == 1, "  is the driver's");

  /* ---- attributes before ---- */
  int flag = -1;
  is_u64(attr64(get_attr, pool, USED_CURRENT), 0, "USED_MEM_CURRENT = 0");
  is_u64(attr64(get_attr, pool, USED_HIGH), 0, "USED_MEM_HIGH = 0");
  is_u64(attr64(get_attr, pool, RESERVED_CURRENT), 0, "RESERVED_MEM_CURRENT = 0");
  is_u64(attr64(get_attr, pool, RELEASE_THRESHOLD), 0, "RELEASE_THRESHOLD = 0");
  is_int(get_attr(pool, OPPORTUNISTIC, &flag), 0, "REUSE_ALLOW_OPPORTUNISTIC");
  is_int(flag, 1, "  is on, as the driver's default");
  uint64_t v = UINT64_MAX;
  is_int(set_attr(pool, RELEASE_THRESHOLD, &v), 0, "RELEASE_THRESHOLD := UINT64_MAX");
  is_u64(attr64(get_attr, pool, RELEASE_THRESHOLD), UINT64_MAX, "  reads back");
  flag = 0;
  is_int(set_attr(pool, OPPORTUNISTIC, &flag), 0, "REUSE_ALLOW_OPPORTUNISTIC := 0");
  flag = -1;
  get_attr(pool, OPPORTUNISTIC, &flag);
  is_int(flag, 0, "  reads back");
  v = 5;
  is_int(set_attr(pool, USED_HIGH, &v), 1, "USED_MEM_HIGH := 5 is CUDA_ERROR_INVALID_VALUE");
  v = 0;
  is_int(set_attr(pool, USED_CURRENT, &v), 1, "USED_MEM_CURRENT is read-only");
  is_int(set_attr(pool, 99, &v), 1, "an unknown attribute: CUDA_ERROR_INVALID_VALUE");
  is_u64(fp->set_attr + fp->get_attr, 0, "  the driver saw none of these");

  /* ---- allocations, stream-ordered ---- */
  dptr_t a = 0, b = 0, c = 0;
  is_int(alloc_from(&a, 3 * MiB, pool, stream), 0, "cuMemAllocFromPoolAsync(3 MiB, stream 7)");
  gmr_stats_t st = stats();
  is_u64(st.requested_bytes, 3 * MiB, "  gmr allocated it");
  is_u64(fp->allocs_from, 0, "  the driver was not asked");
  is_u64(attr64(get_attr, pool, USED_CURRENT), st.allocated_bytes,
         "  USED_MEM_CURRENT = gmr's allocated bytes");
  is_u64(attr64(get_attr, pool, RESERVED_CURRENT), st.reserved_bytes,
         "  RESERVED_MEM_CURRENT = gmr's reserved bytes (%llu)",
         (unsigned long long)st.reserved_bytes);
  uint64_t used_a = st.allocated_bytes;
  is_int(alloc_async(&b, 1 * MiB, stream), 0, "cuMemAllocAsync(1 MiB): from the current pool");
  st = stats();
  is_u64(attr64(get_attr, pool, USED_CURRENT), st.allocated_bytes, "  is counted in it");
  uint64_t peak = st.allocated_bytes;
  is_int(alloc_from_ptsz(&c, 1 * MiB, pool, NULL), 0, "cuMemAllocFromPoolAsync_ptsz");
  is_u64(fp->allocs_from_ptsz, 0, "  gmr's too");
  is_int(free_async_ptsz(c, NULL), 0, "cuMemFreeAsync_ptsz of it");
  is_u64(attr64(get_attr, pool, USED_CURRENT), peak, "  USED_MEM_CURRENT back");
  peak = attr64(get_attr, pool, USED_HIGH);
  is_int(free_async(b, (void *)(uintptr_t)8), 0, "cuMemFreeAsync on another stream");
  is_u64(attr64(get_attr, pool, USED_CURRENT), used_a, "  USED_MEM_CURRENT drops");
  is_u64(attr64(get_attr, pool, USED_HIGH), peak, "  USED_MEM_HIGH stays");
  v = 0;
  is_int(set_attr(pool, USED_HIGH, &v), 0, "USED_MEM_HIGH := 0");
  is_u64(attr64(get_attr, pool, USED_HIGH), used_a, "  resets it to the current value");
  rt_free_fn cuda_free = (rt_free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
  is_int(cuda_free((void *)(uintptr_t)a), 0, "cudaFree of a pool block");
  is_u64(attr64(get_attr, pool, USED_CURRENT), 0, "  USED_MEM_CURRENT = 0");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_u64(fake->frees + fake->async_frees, 0, "  no free reached the driver");

  /* ---- TrimTo and RESERVED_MEM_HIGH ---- */
  uint64_t reserved = attr64(get_attr, pool, RESERVED_CURRENT);
  ok(reserved > 0 && reserved == stats().reserved_bytes, "caching keeps %llu bytes reserved",
     (unsigned long long)reserved);
  is_int(trim(pool, 1ull << 40), 0, "cuMemPoolTrimTo(1 TiB to keep)");
  is_u64(attr64(get_attr, pool, RESERVED_CURRENT), reserved, "  keeps it all");
  is_int(trim(pool, 0), 0, "cuMemPoolTrimTo(0)");
  is_u64(attr64(get_attr, pool, RESERVED_CURRENT), 0, "  gives it all back");
  is_u64(fp->trims, 0, "  the driver was not asked");
  is_u64(attr64(get_attr, pool, RESERVED_HIGH), reserved, "RESERVED_MEM_HIGH = the peak");
  v = 0;
  is_int(set_attr(pool, RESERVED_HIGH, &v), 0, "RESERVED_MEM_HIGH := 0");
  is_u64(attr64(get_attr, pool, RESERVED_HIGH), 0, "  resets it to the current value");

  /* ---- access ---- */
  int access = -1;
  is_int(get_access(&access, pool, &dev0), 0, "cuMemPoolGetAccess(device 0)");
  is_int(access, 3, "  read-write on its own device");
  loc_t dev1 = {1, 1};
  get_access(&access, pool, &dev1);
  is_int(access, 0, "  none from device 1");
  access_t rw1 = {{1, 1}, 3}, none0 = {{1, 0}, 0};
  is_int(set_access(pool, &rw1, 1), 0, "cuMemPoolSetAccess(device 1, read-write)");
  get_access(&access, pool, &dev1);
  is_int(access, 3, "  reads back");
  is_int(set_access(pool, &none0, 1), 1, "  its own device cannot be made inaccessible");
  is_u64(fp->set_access + fp->get_access, 0, "  the driver was not asked");

  /* ---- export and import refuse gmr pools ---- */
  char blob[64];
  is_int(export_handle(blob, pool, 1, 0), 801,
         "cuMemPoolExportToShareableHandle(gmr pool): CUDA_ERROR_NOT_SUPPORTED");
  is_int(alloc_from(&a, 1 * MiB, pool, stream), 0, "a block");
  is_int(export_ptr(blob, a), 801, "cuMemPoolExportPointer(a gmr block): CUDA_ERROR_NOT_SUPPORTED");
  is_int(import_ptr(&b, pool, blob), 801, "cuMemPoolImportPointer(gmr pool): NOT_SUPPORTED");
  is_u64(fp->exports + fp->export_ptrs + fp->import_ptrs, 0, "  the driver was not asked");
  free_async(a, stream);

  /* ---- pools made by cuMemPoolCreate ---- */
  props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = 1;           /* pinned */
  props.location = (loc_t){1, 0}; /* device 0 */
  void *mine = NULL;
  is_int(create(&mine, &props), 0, "cuMemPoolCreate(device memory of device 0)");
  ok(mine != NULL && mine != pool && fp->creates == 0, "  a new gmr pool, not the driver's");
  is_int(alloc_from(&a, 2 * MiB, mine, stream), 0, "  2 MiB from it");
  st = stats();
  is_u64(attr64(get_attr, mine, USED_CURRENT), st.allocated_bytes, "  counted in it");
  is_u64(attr64(get_attr, pool, USED_CURRENT), 0, "  not in the default pool");
  is_u64(attr64(get_attr, mine, RESERVED_CURRENT), st.reserved_bytes,
         "  RESERVED_MEM_CURRENT: the runtime's, shared by the device's gmr pools");
  is_int(set_current(0, mine), 0, "cuDeviceSetMemPool(0, it)");
  get_current(&p2, 0);
  ok(p2 == mine, "  cuDeviceGetMemPool says so");
  is_int(alloc_async(&b, 1 * MiB, stream), 0, "  cuMemAllocAsync");
  is_u64(attr64(get_attr, mine, USED_CURRENT), stats().allocated_bytes, "  counts in it");
  is_int(set_current(1, mine), 1, "a pool of device 0 cannot be device 1's");
  set_pool_fn rt_set_current = (set_pool_fn)dlsym(RTLD_DEFAULT, "cudaDeviceSetMemPool");
  is_int(rt_set_current(0, pool), 0, "cudaDeviceSetMemPool(0, the default pool)");
  get_current(&p2, 0);
  ok(p2 == pool, "  is current again");
  is_int(mem_set(&dev0, 1, mine), 0, "cuMemSetMemPool(device 0, pinned, it)");
  get_current(&p2, 0);
  ok(p2 == mine && fp->mem_set == 0, "  is current, the driver not asked");
  is_int(destroy(mine), 0, "cuMemPoolDestroy with two live blocks");
  get_current(&p2, 0);
  ok(p2 == pool, "  the default pool is current again");
  is_int(alloc_from(&c, 1 * MiB, mine, stream), 1, "  a destroyed pool takes no allocation");
  is_int(free_async(a, stream), 0, "  its blocks are still freed by gmr");
  is_int(free_async(b, stream), 0, "  both");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_u64(fake->async_frees + fp->destroys, 0, "  the driver was not asked");
  is_int(destroy(pool), 1, "the default pool cannot be destroyed");
  create_fn rt_create = (create_fn)dlsym(RTLD_DEFAULT, "cudaMemPoolCreate");
  props.max_size = 4 * MiB;
  is_int(rt_create(&mine, &props), 0, "cudaMemPoolCreate(maxSize 4 MiB)");
  rt_alloc_from_fn rt_alloc_from = (rt_alloc_from_fn)dlsym(RTLD_DEFAULT, "cudaMallocFromPoolAsync");
  void *q = NULL, *q2 = NULL;
  is_int(rt_alloc_from(&q, 3 * MiB, mine, stream), 0, "cudaMallocFromPoolAsync(3 MiB)");
  is_int(rt_alloc_from(&q2, 3 * MiB, mine, stream), 2,
         "  3 MiB more passes maxSize: cudaErrorMemoryAllocation");
  cuda_free(q);
  destroy_fn rt_destroy = (destroy_fn)dlsym(RTLD_DEFAULT, "cudaMemPoolDestroy");
  is_int(rt_destroy(mine), 0, "cudaMemPoolDestroy");
  trim_fn rt_trim = (trim_fn)dlsym(RTLD_DEFAULT, "cudaMemPoolTrimTo");
  is_int(rt_trim(pool, 0), 0, "cudaMemPoolTrimTo(default pool, 0)");
  is_u64(stats().reserved_bytes, 0, "  nothing reserved");

  /* ---- what gmr cannot serve goes to the driver, and the driver's pools stay its own ---- */
  props.max_size = 0;
  props.handle_types = 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
  void *theirs = NULL;
  is_int(create(&theirs, &props), 0, "cuMemPoolCreate(an IPC handle type)");
  ok(fp->creates == 1 && theirs == (void *)&fp->pools[2], "  is the driver's pool");
  props.handle_types = 0;
  props.location = (loc_t){2, 0};
  void *host_pool = NULL;
  is_int(create(&host_pool, &props), 0, "cuMemPoolCreate(host memory)");
  ok(fp->creates == 2, "  is the driver's too");
  unsigned long long next = fake->next;
  is_int(alloc_from(&a, 1 * MiB, theirs, stream), 0, "cuMemAllocFromPoolAsync(the driver's pool)");
  ok(fp->allocs_from == 1 && a == next, "  the driver allocated it");
  is_int(free_async(a, stream), 0, "cuMemFreeAsync of it");
  is_u64(fake->async_frees, 1, "  the driver freed it");
  is_u64(attr64(get_attr, theirs, USED_CURRENT), 42, "cuMemPoolGetAttribute: the driver's answer");
  v = 0;
  set_attr(theirs, RELEASE_THRESHOLD, &v);
  ok(fp->set_attr == 1 && fp->last_attr == RELEASE_THRESHOLD, "cuMemPoolSetAttribute: the driver");
  trim(theirs, 0);
  is_u64(fp->trims, 1, "cuMemPoolTrimTo: the driver");
  rt_trim(theirs, 0);
  is_u64(fp->trims, 2, "cudaMemPoolTrimTo without a runtime library: the driver");
  set_access(theirs, &rw1, 1);
  get_access(&access, theirs, &dev1);
  ok(fp->set_access == 1 && fp->get_access == 1 && access == 1,
     "cuMemPoolSet/GetAccess: the driver");
  is_int(export_handle(blob, theirs, 1, 0), 0, "cuMemPoolExportToShareableHandle: the driver");
  export_ptr(blob, next);
  import_ptr(&b, theirs, blob);
  ok(fp->exports == 1 && fp->export_ptrs == 1 && fp->import_ptrs == 1,
     "  export and import pointers: the driver");
  is_int(set_current(0, theirs), 0, "cuDeviceSetMemPool(0, the driver's pool)");
  is_u64(fp->set_current, 1, "  reaches the driver");
  get_current(&p2, 0);
  ok(p2 == theirs, "  cuDeviceGetMemPool says so");
  next = fake->next;
  is_int(alloc_async(&a, 1 * MiB, stream), 0, "  cuMemAllocAsync");
  ok(fake->async_allocs == 1 && a == next, "  is the driver's then");
  free_async(a, stream);
  is_int(destroy(theirs), 0, "cuMemPoolDestroy(the driver's current pool)");
  get_current(&p2, 0);
  ok(fp->destroys == 1 && p2 == pool, "  the driver destroyed it; gmr's default is current again");
  destroy(host_pool);

  /* ---- many blocks: the pointer table grows and shrinks ---- */
  enum { N_MANY = 3000 };
  static dptr_t many[N_MANY];
  int many_ok = 0, many_freed = 0;
  unsigned long async_frees = fake->async_frees;
  for (int i = 0; i < N_MANY; ++i)
    many_ok += alloc_from(&many[i], 4096, pool, stream) == 0;
  is_int(many_ok, N_MANY, "%d blocks of 4 KiB from the pool", N_MANY);
  is_u64(attr64(get_attr, pool, USED_CURRENT), stats().allocated_bytes, "  all counted");
  for (unsigned i = 0, x = 12345; i < N_MANY; ++i) { /* a shuffled order */
    x = x * 1103515245u + 12345u;
    unsigned j = i + (x >> 8) % (N_MANY - i);
    dptr_t t = many[i];
    many[i] = many[j];
    many[j] = t;
    many_freed += free_async(many[i], stream) == 0;
  }
  is_int(many_freed, N_MANY, "  freed in a shuffled order");
  is_u64(attr64(get_attr, pool, USED_CURRENT), 0, "  USED_MEM_CURRENT = 0");
  is_u64(stats().allocated_bytes, 0, "  gmr allocated 0");
  is_u64(fake->async_frees, async_frees, "  none reached the driver");
  trim(pool, 0);

  /* ---- the limit holds: out of memory after the policy freed its cache ---- */
  is_int(alloc_from(&a, 30 * MiB, pool, stream), 0, "30 MiB from the pool");
  is_int(free_async(a, stream), 0, "  freed: cached");
  is_u64(stats().reserved_bytes, 30 * MiB, "  30 MiB reserved");
  is_int(alloc_from(&a, 40 * MiB, pool, stream), 0,
         "40 MiB: past the 64 MiB limit with the cache, fits once it is freed");
  is_u64(stats().reserved_bytes, 40 * MiB, "  40 MiB reserved");
  is_int(alloc_from(&b, 30 * MiB, pool, stream), 2,
         "30 MiB more: CUDA_ERROR_OUT_OF_MEMORY from cuMemAllocFromPoolAsync");
  is_int(rt_alloc_from(&q, 30 * MiB, pool, stream), 2,
         "  cudaErrorMemoryAllocation from the runtime's");
  rt_alloc_async_fn rt_alloc_async = (rt_alloc_async_fn)dlsym(RTLD_DEFAULT, "cudaMallocAsync");
  is_int(rt_alloc_async(&q, 30 * MiB, stream), 2, "  and from cudaMallocAsync");
  is_u64(attr64(get_attr, pool, USED_CURRENT), 40 * MiB, "  USED_MEM_CURRENT counts the 40 MiB");
  is_int(free_async(a, stream), 0, "  which go back");
  is_u64(attr64(get_attr, pool, USED_CURRENT), 0, "  USED_MEM_CURRENT = 0");
  is_int(alloc_from(&b, 30 * MiB, pool, stream), 0, "  then 30 MiB fit: the program carries on");
  free_async(b, stream);

  /* ---- the handles gmr gives cuGetProcAddress's callers are the same pools ---- */
  void *pfn = NULL;
  int status = -1;
  gp2("cuMemPoolGetAttribute", &pfn, 12000, 0, &status);
  uint64_t got = UINT64_MAX;
  ok(pfn != NULL && ((attr_fn)pfn)(pool, USED_CURRENT, &got) == 0 && got == 0,
     "cuGetProcAddress_v2(cuMemPoolGetAttribute) answers for gmr's pool");
  return done_testing();
}
