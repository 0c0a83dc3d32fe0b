// bench-torch.cpp: PyTorch's CUDA caching allocator behind four C functions,
// for `gmr-bench --device cuda --torch libgmr-bench-torch.so`.
//
// gmr-bench loads this library with dlopen, so gmr itself never needs
// libtorch.  The calls are the ones PyTorch's own code makes for raw device
// memory: c10::cuda::CUDACachingAllocator::raw_alloc_with_stream and
// raw_delete (what CUDAPluggableAllocator users and torch.cuda.caching_allocator_alloc
// reach), on the allocator PyTorch installs at load time (the native one
// unless PYTORCH_CUDA_ALLOC_CONF says otherwise).  C++ exceptions stop here:
// a failure is a NULL pointer and a message on stderr.
//
// Build: tools/bench-torch.sh OUT.so (finds an installed PyTorch through python3).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstddef>
#include <cstdio>
#include <exception>

#ifndef GMR_TORCH_VERSION
#define GMR_TORCH_VERSION "unknown"
#endif

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace alloc = c10::cuda::CUDACachingAllocator;

// Make `device` current and make sure the allocator has a pool for it (the
// Python module does this at its lazy CUDA init; a bare c10 user must).
SHIM_EXPORT int gmr_bench_torch_init(int device, char *err, size_t len) {
  try {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    alloc::get()->init(static_cast<int>(c10::cuda::device_count()));
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, len, "%s", e.what());
    return 1;
  }
}

SHIM_EXPORT void *gmr_bench_torch_alloc(size_t size, void *stream) {
  try {
    return alloc::raw_alloc_with_stream(size, static_cast<cudaStream_t>(stream));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "gmr-bench-torch: raw_alloc_with_stream(%zu): %s\n", size, e.what());
    return nullptr;
  }
}

SHIM_EXPORT void gmr_bench_torch_free(void *ptr) {
  try {
    alloc::raw_delete(ptr);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "gmr-bench-torch: raw_delete(%p): %s\n", ptr, e.what());
  }
}

SHIM_EXPORT const char *gmr_bench_torch_version(void) { return GMR_TORCH_VERSION; }
