// pinbench.cu: what each way of getting pinned host memory for a sleep's
// offload costs (lib/backend/cuda.c, Note [Pinned host memory]), twice each:
// cudaHostAlloc / cudaFreeHost; mmap + cudaHostRegister / cudaHostUnregister +
// munmap, with plain pages, with MADV_HUGEPAGE, and with MAP_POPULATE too; and
// copies from pageable memory.  Every way copies N GiB (default 4) to the
// host and back from one cudaMalloc'd buffer.
//   nvcc -O2 -o pinbench scripts/gpu/pinbench.cu && ./pinbench [GiB]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
int main(int argc, char **argv) {
  size_t n = (size_t)(argc > 1 ? atof(argv[1]) : 4.0) * (1ull << 30);
  void *d; CK(cudaMalloc(&d, n)); CK(cudaMemset(d, 1, n)); CK(cudaDeviceSynchronize());
  for (int rep = 0; rep < 2; ++rep) {
    double t0, t1, t2, t3, t4;
    void *h;
    t0 = now(); CK(cudaHostAlloc(&h, n, cudaHostAllocPortable)); t1 = now();
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); t2 = now();
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); t3 = now();
    CK(cudaFreeHost(h)); t4 = now();
    printf("rep %d hostalloc: alloc %.1f ms d2h %.1f ms h2d %.1f ms free %.1f ms\n", rep, 1e3*(t1-t0), 1e3*(t2-t1), 1e3*(t3-t2), 1e3*(t4-t3));
    for (int flags = 0; flags < 3; ++flags) {
      t0 = now();
      void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (flags == 2 ? MAP_POPULATE : 0), -1, 0);
      if (flags >= 1) madvise(m, n, MADV_HUGEPAGE);
      t1 = now();
      CK(cudaHostRegister(m, n, cudaHostRegisterPortable)); t2 = now();
      CK(cudaMemcpy(m, d, n, cudaMemcpyDeviceToHost)); t3 = now();
      double t5 = now(); CK(cudaMemcpy(d, m, n, cudaMemcpyHostToDevice)); double t6 = now();
      CK(cudaHostUnregister(m)); munmap(m, n); t4 = now();
      printf("rep %d register%s: mmap %.1f reg %.1f d2h %.1f h2d %.1f unreg+munmap %.1f ms\n", rep,
             flags == 0 ? "" : flags == 1 ? "+thp" : "+thp+populate", 1e3*(t1-t0), 1e3*(t2-t1), 1e3*(t3-t2), 1e3*(t6-t5), 1e3*(t4-t6));
    }
    void *p = malloc(n); memset(p, 0, n);
    t0 = now(); CK(cudaMemcpy(p, d, n, cudaMemcpyDeviceToHost)); t1 = now();
    CK(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice)); t2 = now();
    free(p);
    printf("rep %d pageable: d2h %.1f ms h2d %.1f ms\n", rep, 1e3*(t1-t0), 1e3*(t2-t1));
  }
  return 0;
}
