// stitch_bw.cu: do kernels run as fast on memory stitched from scattered
// pages as on cudaMalloc'ed memory?
//
// Three buffers of BYTES (default 1 GiB) are built three ways: with
// cudaMalloc; "in order": pages of the device's granularity P (cuMemCreate,
// one handle each) mapped in the order they were made, one cuMemSetAccess
// per range (PyTorch's expandable segments' shape); and stitched: 2 x BYTES /
// P pages created, shuffled, and BYTES / P of them mapped in that scattered
// order (the stitch policy's shape).  On each it measures, median of REPS:
//   copy    device-to-device cudaMemcpyAsync, GB/s (read + write)
//   kcopy   the same copy by a kernel (16-byte loads and stores), GB/s
//   read    a reduction kernel, GB/s
//   write   a fill kernel, GB/s
//   sgemm   cuBLAS SGEMM, N x N (default 8192; FP32, TF32 off), TFLOP/s
// and the stitched / cudaMalloc ratio of each.
//
//   nvcc -arch=sm_90 -O2 -o stitch_bw stitch_bw.cu -lcuda -lcublas
//   ./stitch_bw [BYTES_MIB] [N] [REPS]      (defaults 1024 8192 20)
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_check.h"

#define CB(x)                                                                                      \
  do {                                                                                             \
    cublasStatus_t s_ = (x);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_);           \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

__global__ void reduce(const float4 *p, size_t n, float *out) {
  float acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float4 v = p[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 123.456f) *out = acc; // keeps the loads
}

__global__ void kcopy(const float4 *src, float4 *dst, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void fill(float4 *p, size_t n, float v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_float4(v, v, v, v);
}

struct set_t {
  float *buf[3];
};

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void measure(const char *name, set_t s, size_t bytes, int n, int reps, cublasHandle_t h,
                    double out[5]) {
  cudaEvent_t a, b;
  CR(cudaEventCreate(&a));
  CR(cudaEventCreate(&b));
  float *sink;
  CR(cudaMalloc(&sink, sizeof(float)));
  int sms = 0;
  CR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t n4 = bytes / sizeof(float4);
  std::vector<double> t[5];
  // Warm up every path once.
  fill<<<sms * 8, 512>>>((float4 *)s.buf[0], n4, 1.0f);
  fill<<<sms * 8, 512>>>((float4 *)s.buf[1], n4, 0.5f);
  fill<<<sms * 8, 512>>>((float4 *)s.buf[2], n4, 0.0f);
  const float one = 1.0f, zero = 0.0f;
  CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, s.buf[0], n, s.buf[1], n, &zero,
                 s.buf[2], n));
  CR(cudaDeviceSynchronize());
  for (int r = 0; r < reps; ++r) {
    float ms;
    CR(cudaEventRecord(a));
    CR(cudaMemcpyAsync(s.buf[1], s.buf[0], bytes, cudaMemcpyDeviceToDevice));
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    CR(cudaEventElapsedTime(&ms, a, b));
    t[0].push_back(2.0 * bytes / (ms * 1e6));
    CR(cudaEventRecord(a));
    reduce<<<sms * 8, 512>>>((const float4 *)s.buf[0], n4, sink);
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    CR(cudaEventElapsedTime(&ms, a, b));
    t[1].push_back(bytes / (ms * 1e6));
    CR(cudaEventRecord(a));
    fill<<<sms * 8, 512>>>((float4 *)s.buf[2], n4, 2.0f);
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    CR(cudaEventElapsedTime(&ms, a, b));
    t[2].push_back(bytes / (ms * 1e6));
    CR(cudaEventRecord(a));
    CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, s.buf[0], n, s.buf[1], n, &zero,
                   s.buf[2], n));
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    CR(cudaEventElapsedTime(&ms, a, b));
    t[3].push_back(2.0 * n * (double)n * n / (ms * 1e9));
    CR(cudaEventRecord(a));
    kcopy<<<sms * 8, 512>>>((const float4 *)s.buf[0], (float4 *)s.buf[1], n4);
    CR(cudaEventRecord(b));
    CR(cudaEventSynchronize(b));
    CR(cudaEventElapsedTime(&ms, a, b));
    t[4].push_back(2.0 * bytes / (ms * 1e6));
  }
  CR(cudaGetLastError());
  for (int i = 0; i < 5; ++i)
    out[i] = median(t[i]);
  printf("%-10s copy %8.1f GB/s  kcopy %8.1f GB/s  read %8.1f GB/s  write %8.1f GB/s  sgemm(%d) "
         "%6.2f TFLOP/s\n",
         name, out[0], out[4], out[1], out[2], n, out[3]);
  cudaFree(sink);
}

int main(int argc, char **argv) {
  size_t bytes = (size_t)(argc > 1 ? atoll(argv[1]) : 1024) << 20;
  int n = argc > 2 ? atoi(argv[2]) : 8192;
  int reps = argc > 3 ? atoi(argv[3]) : 20;
  if ((size_t)n * n * sizeof(float) > bytes) {
    fprintf(stderr, "an %d x %d matrix does not fit in %zu bytes\n", n, n, bytes);
    return 2;
  }
  CK(cuInit(0));
  CR(cudaSetDevice(0));
  CR(cudaFree(0));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)); // FP32, no TF32

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t P = 0;
  CK(cuMemGetAllocationGranularity(&P, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  bytes = (bytes + P - 1) / P * P;
  size_t per = bytes / P;

  // cudaMalloc'ed.
  set_t plain;
  for (int i = 0; i < 3; ++i)
    CR(cudaMalloc(&plain.buf[i], bytes));
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // In order: 3 x BYTES / P pages, each buffer's mapped as they were made.
  std::vector<CUmemGenericAllocationHandle> inorder(3 * per);
  set_t io;
  CUdeviceptr iova[3];
  for (int b = 0; b < 3; ++b) {
    CK(cuMemAddressReserve(&iova[b], bytes, P, 0, 0));
    for (size_t j = 0; j < per; ++j) {
      CK(cuMemCreate(&inorder[b * per + j], P, &prop, 0));
      CK(cuMemMap(iova[b] + j * P, P, 0, inorder[b * per + j], 0));
    }
    CK(cuMemSetAccess(iova[b], bytes, &acc, 1));
    io.buf[b] = (float *)iova[b];
  }
  // Stitched: 2x the pages needed, shuffled; every buffer gets a scattered subset.
  std::vector<CUmemGenericAllocationHandle> pages(2 * 3 * per);
  for (auto &pg : pages)
    CK(cuMemCreate(&pg, P, &prop, 0));
  std::vector<size_t> order(pages.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::mt19937_64 rng(42);
  std::shuffle(order.begin(), order.end(), rng);
  set_t st;
  CUdeviceptr va[3];
  for (int b = 0; b < 3; ++b) {
    CK(cuMemAddressReserve(&va[b], bytes, P, 0, 0));
    for (size_t j = 0; j < per; ++j)
      CK(cuMemMap(va[b] + j * P, P, 0, pages[order[b * per + j]], 0));
    CK(cuMemSetAccess(va[b], bytes, &acc, 1));
    st.buf[b] = (float *)va[b];
  }
  printf("buffers of %zu MiB; stitched from %zu scattered pages of %zu bytes each (of %zu "
         "created)\n",
         bytes >> 20, per, P, pages.size());
  double a[5], o[5], s[5];
  measure("cudaMalloc", plain, bytes, n, reps, h, a);
  measure("in order", io, bytes, n, reps, h, o);
  measure("stitched", st, bytes, n, reps, h, s);
  measure("cudaMalloc", plain, bytes, n, reps, h, a); // again: order effects
  printf("in order / cudaMalloc: copy %.3f  kcopy %.3f  read %.3f  write %.3f  sgemm %.3f\n",
         o[0] / a[0], o[4] / a[4], o[1] / a[1], o[2] / a[2], o[3] / a[3]);
  printf("stitched / cudaMalloc: copy %.3f  kcopy %.3f  read %.3f  write %.3f  sgemm %.3f\n",
         s[0] / a[0], s[4] / a[4], s[1] / a[1], s[2] / a[2], s[3] / a[3]);

  for (int b = 0; b < 3; ++b) {
    for (size_t j = 0; j < per; ++j)
      CK(cuMemUnmap(va[b] + j * P, P));
    CK(cuMemAddressFree(va[b], bytes));
    cudaFree(plain.buf[b]);
  }
  for (int b = 0; b < 3; ++b) {
    for (size_t j = 0; j < per; ++j)
      CK(cuMemUnmap(iova[b] + j * P, P));
    CK(cuMemAddressFree(iova[b], bytes));
  }
  for (auto &pg : pages)
    CK(cuMemRelease(pg));
  for (auto &pg : inorder)
    CK(cuMemRelease(pg));
  cublasDestroy(h);
  return 0;
}
