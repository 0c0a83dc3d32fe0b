// cuda_check.h: the error checks of the CUDA proofs in scripts/gpu (a
// failing driver or runtime call prints where and why, and exits 2).
#ifndef GMR_SCRIPTS_CUDA_CHECK_H
#define GMR_SCRIPTS_CUDA_CHECK_H
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                      \
  do {                                                                                             \
    CUresult r_ = (x);                                                                             \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      const char *s_ = nullptr;                                                                    \
      cuGetErrorString(r_, &s_);                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");                   \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)
#define CR(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

#endif
