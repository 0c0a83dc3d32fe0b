// stitch_alias.cu: alias safety of the stitch policy's shared pages on a GPU.
//
// One physical page (cuMemCreate, the device's granularity) is mapped at two
// virtual addresses: as the last slot of range A and as the first slot of
// range B, the way the stitch policy shares a page between the tail of one
// block and the head of the next.  Every round, a kernel on stream 1 writes
// A's tail [0, split) through A's mapping while a kernel on stream 2 writes
// B's head [split, P) through B's mapping, concurrently; split moves by
// multiples of 512 bytes.  Then both views are read back and must hold
// exactly what each kernel wrote.  A second part hands bytes from A to B
// across streams: stream 1 writes through A, records an event, stream 2
// waits on it, then reads through B and writes its own pattern, which stream
// 1 reads back through A after an event the other way.
//
//   nvcc -arch=sm_90 -O2 -o stitch_alias stitch_alias.cu -lcuda
//   ./stitch_alias [rounds]          (default 2000)
//
// Prints "alias: N rounds, M bytes checked, 0 mismatches" and exits 0 when
// every byte verifies; 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_check.h"

// Write v(i) = seed * 2654435761 + i over [lo, hi) of p (32-bit words), many
// times over so the two kernels overlap in time.
__global__ void fill(unsigned *p, size_t lo, size_t hi, unsigned seed, int reps) {
  for (int r = 0; r < reps; ++r)
    for (size_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi;
         i += (size_t)gridDim.x * blockDim.x)
      p[i] = seed * 2654435761u + (unsigned)i;
}

// Count words of [lo, hi) that differ from the pattern of `seed`.
__global__ void verify(const unsigned *p, size_t lo, size_t hi, unsigned seed,
                       unsigned long long *bad) {
  unsigned long long n = 0;
  for (size_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi;
       i += (size_t)gridDim.x * blockDim.x)
    n += p[i] != seed * 2654435761u + (unsigned)i;
  if (n) atomicAdd(bad, n);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 2000;
  CK(cuInit(0));
  CR(cudaSetDevice(0));
  CR(cudaFree(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t P = 0;
  CK(cuMemGetAllocationGranularity(&P, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  printf("page (granularity) %zu bytes\n", P);

  // Pages: A = [a0][S], B = [S][b1].
  CUmemGenericAllocationHandle a0, s, b1;
  CK(cuMemCreate(&a0, P, &prop, 0));
  CK(cuMemCreate(&s, P, &prop, 0));
  CK(cuMemCreate(&b1, P, &prop, 0));
  CUdeviceptr va, vb;
  CK(cuMemAddressReserve(&va, 2 * P, P, 0, 0));
  CK(cuMemAddressReserve(&vb, 2 * P, P, 0, 0));
  CK(cuMemMap(va, P, 0, a0, 0));
  CK(cuMemMap(va + P, P, 0, s, 0));
  CK(cuMemMap(vb, P, 0, s, 0));
  CK(cuMemMap(vb + P, P, 0, b1, 0));
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, 2 * P, &acc, 1));
  CK(cuMemSetAccess(vb, 2 * P, &acc, 1));

  unsigned *viewA = (unsigned *)(va + P); // the shared page through A
  unsigned *viewB = (unsigned *)vb;       // the same page through B
  size_t words = P / 4;
  cudaStream_t s1, s2;
  CR(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CR(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned long long *bad;
  CR(cudaMallocManaged(&bad, sizeof *bad));
  *bad = 0;
  srand(7);
  unsigned long long checked = 0;
  for (int r = 0; r < rounds; ++r) {
    size_t split = (size_t)(1 + rand() % (int)(P / 512 - 1)) * 512 / 4; // in words
    unsigned sa = 2 * r + 1, sb = 2 * r + 2;
    fill<<<64, 256, 0, s1>>>(viewA, 0, split, sa, 4);     // A's tail through A
    fill<<<64, 256, 0, s2>>>(viewB, split, words, sb, 4); // B's head through B
    CR(cudaStreamSynchronize(s1));
    CR(cudaStreamSynchronize(s2));
    // Both views, both halves.
    verify<<<64, 256, 0, s1>>>(viewA, 0, split, sa, bad);
    verify<<<64, 256, 0, s1>>>(viewA, split, words, sb, bad);
    verify<<<64, 256, 0, s1>>>(viewB, 0, split, sa, bad);
    verify<<<64, 256, 0, s1>>>(viewB, split, words, sb, bad);
    CR(cudaStreamSynchronize(s1));
    checked += 2 * P;
  }
  unsigned long long bad_concurrent = *bad;

  // Hand-over across streams, ordered by events.
  cudaEvent_t e1, e2;
  CR(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  CR(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  for (int r = 0; r < rounds / 4; ++r) {
    unsigned sa = 100000 + 2 * r, sb = 100001 + 2 * r;
    fill<<<64, 256, 0, s1>>>(viewA, 0, words, sa, 1); // A writes the whole page
    CR(cudaEventRecord(e1, s1));
    CR(cudaStreamWaitEvent(s2, e1, 0));
    verify<<<64, 256, 0, s2>>>(viewB, 0, words, sa, bad); // B sees A's bytes
    fill<<<64, 256, 0, s2>>>(viewB, 0, words, sb, 1);     // then writes its own
    CR(cudaEventRecord(e2, s2));
    CR(cudaStreamWaitEvent(s1, e2, 0));
    verify<<<64, 256, 0, s1>>>(viewA, 0, words, sb, bad); // A sees B's bytes
    checked += 2 * P;
  }
  CR(cudaDeviceSynchronize());
  unsigned long long total_bad = *bad;
  printf("alias: %d concurrent rounds (tail via A on stream 1, head via B on stream 2), "
         "%d hand-overs; %llu bytes checked, %llu mismatches (%llu in the concurrent part)\n",
         rounds, rounds / 4, checked, total_bad, bad_concurrent);

  for (int i = 0; i < 2; ++i) { // one unmap per map call
    CK(cuMemUnmap(va + i * P, P));
    CK(cuMemUnmap(vb + i * P, P));
  }
  CK(cuMemRelease(a0));
  CK(cuMemRelease(s));
  CK(cuMemRelease(b1));
  CK(cuMemAddressFree(va, 2 * P));
  CK(cuMemAddressFree(vb, 2 * P));
  return total_bad == 0 ? 0 : 1;
}
