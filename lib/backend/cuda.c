/* cuda.c: the CUDA backend, the only file with CUDA calls.
 *
 * Physical ranges are cudaMalloc/cudaFree; events and streams are the CUDA
 * runtime's.  The virtual memory calls (cuMemAddressReserve, cuMemCreate,
 * cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree) are
 * driver API, reached through cudaGetDriverEntryPointByVersion as PyTorch
 * does, so the library links only the (static) CUDA runtime and loads on a
 * machine with the toolkit but no driver: there gmr__cuda_available() says
 * 0 and the simulator still works.
 *
 * See Note [CUDA failures] and Note [CUDA mappings].
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend.h"
#include "core/internal.h"

typedef CUresult (*pfn_cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                            unsigned long long);
typedef CUresult (*pfn_cuMemAddressFree)(CUdeviceptr, size_t);
typedef CUresult (*pfn_cuMemCreate)(CUmemGenericAllocationHandle *, size_t,
                                    const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*pfn_cuMemRelease)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                 unsigned long long);
typedef CUresult (*pfn_cuMemUnmap)(CUdeviceptr, size_t);
typedef CUresult (*pfn_cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*pfn_cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                                      CUmemAllocationGranularity_flags);
typedef CUresult (*pfn_cuGetErrorString)(CUresult, const char **);

typedef struct cuda_driver_s {
  pfn_cuMemAddressReserve address_reserve;
  pfn_cuMemAddressFree address_free;
  pfn_cuMemCreate create;
  pfn_cuMemRelease release;
  pfn_cuMemMap map;
  pfn_cuMemUnmap unmap;
  pfn_cuMemSetAccess set_access;
  pfn_cuMemRetainAllocationHandle retain;
  pfn_cuMemGetAllocationGranularity granularity;
  pfn_cuGetErrorString error_string;
} cuda_driver_t;

typedef struct cuda_be_s {
  gmr_backend_t base; /* must be first */
  int ordinal;        /* CUDA device */
  bool vmm;           /* the driver entry points were found and VMM is supported */
  cuda_driver_t drv;
} cuda_be_t;

static inline cuda_be_t *cuda_of(gmr_backend_t *be) {
  return (cuda_be_t *)be;
}

/* Note [CUDA failures]
 * A CUDA failure becomes GMR_EDEVICE with CUDA's own error text in the
 * thread's last error; cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY
 * become GMR_ENOMEM, so policies can free their cache and retry.
 */
static int cuda_fail(cudaError_t e, const char *what) {
  cudaGetLastError(); /* clear the sticky-free error state */
  if (e == cudaErrorMemoryAllocation)
    return gmr__error_set(GMR_ENOMEM, "CUDA: %s: %s", what, cudaGetErrorString(e));
  return gmr__error_set(GMR_EDEVICE, "CUDA: %s: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

static int drv_fail(cuda_be_t *c, CUresult r, const char *what) {
  const char *text = NULL;
  if (c->drv.error_string == NULL || c->drv.error_string(r, &text) != CUDA_SUCCESS) text = NULL;
  int code = r == CUDA_ERROR_OUT_OF_MEMORY ? GMR_ENOMEM : GMR_EDEVICE;
  return gmr__error_set(code, "CUDA driver: %s: %s (error %d)", what, text ? text : "unknown",
                        (int)r);
}

/* Make the backend's device current for this thread (cheap when it is);
 * *prev: the device to make current again afterwards (restore_device), -1
 * when nothing changed.  A caller's current device is never left changed, as
 * PyTorch's allocator guards it: in a process with two GPUs, an allocation
 * or empty_cache on device 1 must not move the framework's thread off device 0. */
static int use_device(cuda_be_t *c, int *prev) {
  int cur = -1;
  *prev = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == c->ordinal) return 0;
  e = cudaSetDevice(c->ordinal);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  *prev = cur;
  return 0;
}

static void restore_device(int prev) {
  if (prev >= 0) cudaSetDevice(prev);
}

/* Note [Relaxed capture mode]
 * cudaMalloc and cuMemCreate are "potentially unsafe" calls that invalidate a
 * stream capture in the default (global) capture mode of any thread.  A
 * policy that reserves memory while a CUDA graph is captured (a private pool
 * growing) must not break the capture, so each reservation runs in relaxed
 * mode for this thread, as PyTorch's allocator does around cudaMalloc; the
 * two exchanges cost far less than the call they guard. */
static enum cudaStreamCaptureMode relax_capture(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  return mode;
}
static void restore_capture(enum cudaStreamCaptureMode mode) {
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
}

static int cuda_reserve(gmr_backend_t *be, size_t size, gmr_stream_t s, void **out_ptr) {
  (void)s; /* the device has no use for the request's stream */
  cuda_be_t *c = cuda_of(be);
  int prev, err = use_device(c, &prev);
  if (err != 0) return err;
  void *p = NULL;
  enum cudaStreamCaptureMode mode = relax_capture(); /* see Note [Relaxed capture mode] */
  cudaError_t e = cudaMalloc(&p, size);
  restore_capture(mode);
  restore_device(prev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaMalloc");
  *out_ptr = p;
  return 0;
}

static int cuda_release(gmr_backend_t *be, void *ptr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  cuda_be_t *c = cuda_of(be);
  int prev, err = use_device(c, &prev);
  if (err != 0) return err;
  cudaError_t e = cudaFree(ptr);
  restore_device(prev);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaFree");
}

static int cuda_va_reserve(gmr_backend_t *be, size_t size, void **out_base) {
  cuda_be_t *c = cuda_of(be);
  if (!c->vmm) return gmr__error_set(GMR_ENOTSUP, "CUDA: virtual memory management unavailable");
  CUdeviceptr base = 0;
  CUresult r = c->drv.address_reserve(&base, size, 0, 0, 0);
  if (r != CUDA_SUCCESS) return drv_fail(c, r, "cuMemAddressReserve");
  *out_base = (void *)(uintptr_t)base;
  return 0;
}

static int cuda_va_release(gmr_backend_t *be, void *base, size_t size) {
  cuda_be_t *c = cuda_of(be);
  CUresult r = c->drv.address_free((CUdeviceptr)(uintptr_t)base, size);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemAddressFree");
}

/* Note [CUDA mappings]
 * map() creates one physical allocation per call (cuMemCreate of the whole
 * range), maps it and grants read/write access to this device; unmap() finds
 * the handle again with cuMemRetainAllocationHandle, so no table is kept.
 * The stitch policy's pages are handles of their own (phys_create = one
 * cuMemCreate), mapped at one or more addresses each (phys_map = cuMemMap
 * with no access yet; set_access = one cuMemSetAccess over a whole range).
 */
static void alloc_prop(cuda_be_t *c, CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = c->ordinal;
}

static int map_relaxed(cuda_be_t *c, void *addr, size_t size) {
  CUmemAllocationProp prop;
  alloc_prop(c, &prop);
  CUmemGenericAllocationHandle h;
  CUresult r = c->drv.create(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS) return drv_fail(c, r, "cuMemCreate");
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)addr;
  r = c->drv.map(d, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    c->drv.release(h);
    return drv_fail(c, r, "cuMemMap");
  }
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  r = c->drv.set_access(d, size, &access, 1);
  if (r != CUDA_SUCCESS) {
    c->drv.unmap(d, size);
    c->drv.release(h);
    return drv_fail(c, r, "cuMemSetAccess");
  }
  /* The mapping keeps the memory alive; drop our reference now. */
  c->drv.release(h);
  return 0;
}

static int cuda_map(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  enum cudaStreamCaptureMode mode = relax_capture(); /* see Note [Relaxed capture mode] */
  int err = map_relaxed(cuda_of(be), addr, size);
  restore_capture(mode);
  return err;
}

static int cuda_unmap(gmr_backend_t *be, void *addr, size_t size, gmr_stream_t s) {
  (void)s; /* the device has no use for the request's stream */
  cuda_be_t *c = cuda_of(be);
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)addr;
  CUresult r = c->drv.unmap(d, size);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemUnmap");
}

static int cuda_phys_create(gmr_backend_t *be, size_t size, gmr_phys_t *out) {
  cuda_be_t *c = cuda_of(be);
  CUmemAllocationProp prop;
  alloc_prop(c, &prop);
  CUmemGenericAllocationHandle h;
  enum cudaStreamCaptureMode mode = relax_capture(); /* see Note [Relaxed capture mode] */
  CUresult r = c->drv.create(&h, size, &prop, 0);
  restore_capture(mode);
  if (r != CUDA_SUCCESS) return drv_fail(c, r, "cuMemCreate");
  *out = (gmr_phys_t)h;
  return 0;
}

static int cuda_phys_release(gmr_backend_t *be, gmr_phys_t h, size_t size) {
  (void)size;
  cuda_be_t *c = cuda_of(be);
  CUresult r = c->drv.release((CUmemGenericAllocationHandle)h);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemRelease");
}

static int cuda_phys_map(gmr_backend_t *be, void *addr, size_t size, gmr_phys_t h, size_t offset) {
  cuda_be_t *c = cuda_of(be);
  CUresult r =
      c->drv.map((CUdeviceptr)(uintptr_t)addr, size, offset, (CUmemGenericAllocationHandle)h, 0);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemMap");
}

static int cuda_set_access(gmr_backend_t *be, void *addr, size_t size) {
  cuda_be_t *c = cuda_of(be);
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUresult r = c->drv.set_access((CUdeviceptr)(uintptr_t)addr, size, &access, 1);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemSetAccess");
}

static int cuda_phys_unmap(gmr_backend_t *be, void *addr, size_t size) {
  cuda_be_t *c = cuda_of(be);
  CUresult r = c->drv.unmap((CUdeviceptr)(uintptr_t)addr, size);
  return r == CUDA_SUCCESS ? 0 : drv_fail(c, r, "cuMemUnmap");
}

static int cuda_stream_capturing(gmr_backend_t *be, gmr_stream_t s) {
  (void)be;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)s, &st);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}

static int cuda_mem_info(gmr_backend_t *be, size_t *out_free, size_t *out_total) {
  cuda_be_t *c = cuda_of(be);
  int prev, err = use_device(c, &prev);
  if (err != 0) return err;
  size_t f = 0, t = 0;
  cudaError_t e = cudaMemGetInfo(&f, &t);
  restore_device(prev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaMemGetInfo");
  *out_free = f;
  *out_total = t;
  return 0;
}

/* The UUID as nvidia-smi writes it: GPU-8-4-4-4-12 hex digits. */
static int cuda_device_id(gmr_backend_t *be, char *buf, size_t len) {
  cuda_be_t *c = cuda_of(be);
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, c->ordinal);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceProperties");
  const unsigned char *u = (const unsigned char *)p.uuid.bytes;
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
  return 0;
}

/* Note [NVML]
 * PyTorch's OOM message names every process that holds memory on the
 * device, from NVML (reportProcessMemoryInfo); the caching policy says the
 * same, so this backend asks NVML too: libnvidia-ml.so.1 opened on the
 * first out-of-memory error (never at start, never closed), initialized
 * once, the device found by its PCI bus id, its compute processes listed
 * (nvmlProcessInfo_v2_t: pid, used bytes, GPU and compute instance).
 * Without NVML, or on any NVML error, nothing is said, as in PyTorch. */
typedef struct nvml_proc_s {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} nvml_proc_t;

static struct {
  int (*init)(void);
  int (*by_pci)(const char *bus, void **dev);
  int (*procs)(void *dev, unsigned int *count, nvml_proc_t *out);
  int ok;
} nvml;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void nvml_open(void) {
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  *(void **)&nvml.init = dlsym(h, "nvmlInit_v2");
  *(void **)&nvml.by_pci = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&nvml.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
  nvml.ok = nvml.init != NULL && nvml.by_pci != NULL && nvml.procs != NULL && nvml.init() == 0;
}

#define NVML_ERROR_INSUFFICIENT_SIZE 7

static int cuda_proc_usage(gmr_backend_t *be, gmr_proc_usage_t *out, size_t max, size_t *n) {
  *n = 0;
  pthread_once(&nvml_once, nvml_open);
  if (!nvml.ok) return gmr__error_set(GMR_ENOTSUP, "NVML is not available");
  char bus[32];
  cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, cuda_of(be)->ordinal);
  if (e != cudaSuccess) return cuda_fail(e, "cudaDeviceGetPCIBusId");
  void *dev = NULL;
  if (nvml.by_pci(bus, &dev) != 0)
    return gmr__error_set(GMR_ENOTSUP, "NVML does not know the device at %s", bus);
  unsigned int count = 8;
  nvml_proc_t *p = NULL;
  int r = NVML_ERROR_INSUFFICIENT_SIZE;
  for (int tries = 0; tries < 4 && r == NVML_ERROR_INSUFFICIENT_SIZE; ++tries) {
    count += 8; /* room for processes that start meanwhile */
    nvml_proc_t *q = realloc(p, count * sizeof *p);
    if (q == NULL) break;
    p = q;
    r = nvml.procs(dev, &count, p);
  }
  if (r == 0)
    for (unsigned int i = 0; i < count && *n < max; ++i)
      out[(*n)++] = (gmr_proc_usage_t){.pid = p[i].pid, .bytes = p[i].used};
  free(p);
  return r == 0 ? 0 : gmr__error_set(GMR_ENOTSUP, "NVML could not list the processes (%d)", r);
}

static int cuda_event_record(gmr_backend_t *be, gmr_stream_t s, gmr_event_t *out_ev) {
  cuda_be_t *c = cuda_of(be);
  int prev, err = use_device(c, &prev);
  if (err != 0) return err;
  cudaEvent_t ev;
  const char *what = "cudaEventCreateWithFlags";
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    what = "cudaEventRecord";
    e = cudaEventRecord(ev, (cudaStream_t)s);
    if (e != cudaSuccess) cudaEventDestroy(ev);
  }
  restore_device(prev);
  if (e != cudaSuccess) return cuda_fail(e, what);
  *out_ev = ev;
  return 0;
}

static int cuda_event_query(gmr_backend_t *be, gmr_event_t ev) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  if (e == cudaSuccess) return 0;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return 1;
  }
  return cuda_fail(e, "cudaEventQuery");
}

static int cuda_event_sync(gmr_backend_t *be, gmr_event_t ev) {
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaEventSynchronize");
}

static void cuda_event_destroy(gmr_backend_t *be, gmr_event_t ev) {
  cudaEventDestroy((cudaEvent_t)ev);
}

static int cuda_stream_sync(gmr_backend_t *be, gmr_stream_t s) {
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaStreamSynchronize");
}

static int cuda_device_sync(gmr_backend_t *be) {
  int prev, err = use_device(cuda_of(be), &prev);
  if (err != 0) return err;
  cudaError_t e = cudaDeviceSynchronize();
  restore_device(prev);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaDeviceSynchronize");
}

/* Note [Pinned host memory]
 * A sleep's host copy is anonymous memory asked for in huge pages
 * (madvise(MADV_HUGEPAGE)) and pinned with cudaHostRegister, not
 * cudaHostAlloc'd: pinning 2 MiB pages is cheaper than the 4 KiB pages the
 * driver's own allocation pins.  On the H200 (scripts/gpu/pinbench.cu), 4 GiB:
 *   cudaHostAlloc 2.07-2.66 s, cudaFreeHost 0.60-0.65 s;
 *   mmap + MADV_HUGEPAGE + cudaHostRegister 0.73-0.89 s, unregister + munmap 77-80 ms;
 *   the copies run at the same 55 GB/s (77.7 ms each way) from either.
 * Where registering fails (a kernel without huge pages still registers, so
 * this is rare), cudaHostAlloc serves; the free tells the two apart by
 * cudaHostUnregister's answer. */
static int cuda_host_alloc(gmr_backend_t *be, size_t size, void **out) {
  int prev, err = use_device(cuda_of(be), &prev);
  if (err != 0) return err;
  size_t n = size ? size : 1;
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cudaError_t e = cudaErrorMemoryAllocation;
  if (p != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice: plain pages serve too */
#endif
    e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      (void)munmap(p, n);
    }
  }
  if (e != cudaSuccess) {
    p = NULL;
    e = cudaHostAlloc(&p, n, cudaHostAllocPortable);
  }
  restore_device(prev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaHostAlloc");
  *out = p;
  return 0;
}

static void cuda_host_free(gmr_backend_t *be, void *p, size_t size) {
  int prev;
  if (use_device(cuda_of(be), &prev) != 0) return; /* the thread's device, for the runtime */
  cudaError_t e = cudaHostUnregister(p);
  if (e == cudaSuccess) {
    (void)munmap(p, size ? size : 1);
  } else {
    (void)cudaGetLastError(); /* not registered: cudaHostAlloc's */
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
  restore_device(prev);
}

static int cuda_copy(gmr_backend_t *be, void *dst, const void *src, size_t size, gmr_stream_t s,
                     enum cudaMemcpyKind kind, const char *what) {
  int prev, err = use_device(cuda_of(be), &prev);
  if (err != 0) return err;
  cudaError_t e = cudaMemcpyAsync(dst, src, size, kind, (cudaStream_t)s);
  restore_device(prev);
  return e == cudaSuccess ? 0 : cuda_fail(e, what);
}

static int cuda_copy_to_host(gmr_backend_t *be, void *dst, const void *src, size_t size,
                             gmr_stream_t s) {
  return cuda_copy(be, dst, src, size, s, cudaMemcpyDeviceToHost, "cudaMemcpyAsync to the host");
}

static int cuda_copy_to_device(gmr_backend_t *be, void *dst, const void *src, size_t size,
                               gmr_stream_t s) {
  return cuda_copy(be, dst, src, size, s, cudaMemcpyHostToDevice, "cudaMemcpyAsync to the device");
}

static uint64_t cuda_now_ns(gmr_backend_t *be) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void cuda_destroy(gmr_backend_t *be) {
  gmr__free(be);
}

static const gmr_backend_ops_t cuda_ops = {
    .name = "cuda",
    .reserve = cuda_reserve,
    .release = cuda_release,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .mem_info = cuda_mem_info,
    .device_id = cuda_device_id,
    .proc_usage = cuda_proc_usage,
    .phys_create = cuda_phys_create,
    .phys_release = cuda_phys_release,
    .phys_map = cuda_phys_map,
    .set_access = cuda_set_access,
    .phys_unmap = cuda_phys_unmap,
    .stream_capturing = cuda_stream_capturing,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_destroy = cuda_event_destroy,
    .stream_sync = cuda_stream_sync,
    .device_sync = cuda_device_sync,
    .now_ns = cuda_now_ns,
    .destroy = cuda_destroy,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_to_host = cuda_copy_to_host,
    .copy_to_device = cuda_copy_to_device,
};

/* The same ops without the virtual memory calls, when the driver lacks them. */
static const gmr_backend_ops_t cuda_ops_novmm = {
    .name = "cuda",
    .reserve = cuda_reserve,
    .release = cuda_release,
    .mem_info = cuda_mem_info,
    .device_id = cuda_device_id,
    .proc_usage = cuda_proc_usage,
    .stream_capturing = cuda_stream_capturing,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_destroy = cuda_event_destroy,
    .stream_sync = cuda_stream_sync,
    .device_sync = cuda_device_sync,
    .now_ns = cuda_now_ns,
    .destroy = cuda_destroy,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_to_host = cuda_copy_to_host,
    .copy_to_device = cuda_copy_to_device,
};

static bool entry(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult q;
  *fn = NULL;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    *fn = NULL;
  }
  return *fn != NULL;
}

static bool load_driver(cuda_be_t *c) {
  bool ok = true;
  ok &= entry("cuMemAddressReserve", (void **)&c->drv.address_reserve);
  ok &= entry("cuMemAddressFree", (void **)&c->drv.address_free);
  ok &= entry("cuMemCreate", (void **)&c->drv.create);
  ok &= entry("cuMemRelease", (void **)&c->drv.release);
  ok &= entry("cuMemMap", (void **)&c->drv.map);
  ok &= entry("cuMemUnmap", (void **)&c->drv.unmap);
  ok &= entry("cuMemSetAccess", (void **)&c->drv.set_access);
  ok &= entry("cuMemRetainAllocationHandle", (void **)&c->drv.retain);
  ok &= entry("cuMemGetAllocationGranularity", (void **)&c->drv.granularity);
  entry("cuGetErrorString", (void **)&c->drv.error_string);
  return ok;
}

int gmr__cuda_available(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

int gmr__cuda_backend_new(int device, gmr_backend_t **out) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(e, "no usable CUDA device (cudaGetDeviceCount)");
  if (device >= n)
    return gmr__error_set(GMR_EDEVICE, "CUDA: device %d does not exist (%d device%s)", device, n,
                          n == 1 ? "" : "s");
  cuda_be_t *c = gmr__calloc(1, sizeof *c);
  if (c == NULL) return gmr__error_set(GMR_ENOMEM, "out of host memory for the CUDA backend");
  c->ordinal = device;
  c->base.device = device;
  c->base.granularity = (size_t)2 << 20;
  int prev, err = use_device(c, &prev); /* creates the device's primary context */
  if (err != 0) {
    gmr__free(c);
    return err;
  }
  restore_device(prev);
  c->vmm = load_driver(c);
  if (c->vmm) {
    typedef CUresult (*pfn_attr)(int *, CUdevice_attribute, CUdevice);
    pfn_attr attr = NULL;
    int supported = 0;
    c->vmm = entry("cuDeviceGetAttribute", (void **)&attr) &&
             attr(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) ==
                 CUDA_SUCCESS &&
             supported;
  }
  if (c->vmm) {
    CUmemAllocationProp prop;
    alloc_prop(c, &prop);
    size_t g = 0;
    if (c->drv.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g)
      c->base.granularity = g;
  }
  c->base.ops = c->vmm ? &cuda_ops : &cuda_ops_novmm;
  *out = &c->base;
  return 0;
}
