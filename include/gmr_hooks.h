/* gmr_hooks.h: C entry points with the signatures frameworks expect of an
 * external allocator, served by the process-wide runtime of each device
 * (gmr_default_runtime, configured by GMR_CONFIG).
 *
 *  - PyTorch: torch.cuda.memory.CUDAPluggableAllocator(libgmr.so,
 *    "gmr_torch_alloc", "gmr_torch_free"), then change_current_allocator(),
 *    before the first CUDA tensor.  gmr_torch_empty_cache and
 *    gmr_torch_record_stream go to the allocator's set_reset_fn and
 *    set_record_stream_fn.  The Python package gmr (python/gmr) does all this:
 *    gmr.use_in_torch(config).
 *  - CuPy: cupy.cuda.memory.CFunctionAllocator(0, &gmr_cupy_malloc,
 *    &gmr_cupy_free, owner); gmr.use_in_cupy(config) wraps it so that a NULL
 *    becomes cupy's OutOfMemoryError.
 *
 * Streams are void * (cudaStream_t), so no CUDA header is needed.  CuPy passes
 * no stream: its blocks belong to the default stream (NULL).
 *
 * Out of memory.  PyTorch does not check what an external allocator returns:
 * a NULL would become a tensor at address 0.  So when torch's libc10 is in
 * the process, gmr_torch_alloc raises torch's own c10::OutOfMemoryError (a
 * C++ exception, built through the C++ ABI from libc10's exported symbols),
 * which Python sees as torch.OutOfMemoryError with gmr's message; where those
 * symbols are missing it raises c10::Error (RuntimeError), and only when no
 * libc10 is loaded at all does it return NULL.  gmr_cupy_malloc returns NULL
 * and leaves the reason in gmr_hooks_last_error().
 */
#ifndef GMR_HOOKS_H
#define GMR_HOOKS_H

#include <stddef.h>
#include <sys/types.h>

#include "gmr.h"

#ifdef __cplusplus
extern "C" {
#endif

/** PyTorch's alloc_fn: `size` bytes on `device` for `stream`.  Size 0 returns
 * NULL without allocating (PyTorch asks for 0-byte tensors). */
GMR_EXTERN void *gmr_torch_alloc(ssize_t size, int device, void *stream);
/** PyTorch's free_fn: size, device and stream are those of the allocation. */
GMR_EXTERN void gmr_torch_free(void *ptr, ssize_t size, int device, void *stream);
/** torch.cuda.empty_cache(): gmr_empty_cache on every device in use. */
GMR_EXTERN void gmr_torch_empty_cache(void);
/** Tensor.record_stream(): gmr_record_stream on the device that owns ptr. */
GMR_EXTERN void gmr_torch_record_stream(void *ptr, void *stream);

/** CuPy's malloc_func_type.  `param` is unused.  NULL on failure or size 0. */
GMR_EXTERN void *gmr_cupy_malloc(void *param, size_t size, int device_id);
/** CuPy's free_func_type. */
GMR_EXTERN void gmr_cupy_free(void *param, void *ptr, int device_id);

/** The calling thread's last failure in a hook (the OOM text, or why the
 * default runtime could not be created).  Never NULL; "" when none. */
GMR_EXTERN const char *gmr_hooks_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* GMR_HOOKS_H */
