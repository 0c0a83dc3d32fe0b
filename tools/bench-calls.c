/* bench-calls.c: gmr-bench --workloads calls, the host time of each driver
 * call the CUDA backend makes, one kind at a time.
 *
 * These are the figures gmr-compare's cost model prices a replay's calls
 * with (tools/compare-cost.c, Note [Device cost model]): cudaMalloc and
 * cudaFree, cuMemAddressReserve and cuMemAddressFree, cuMemCreate, cuMemMap,
 * cuMemSetAccess (fresh and repeated), cuMemUnmap, cuMemRelease, and
 * cudaEventRecord, cudaEventQuery, cudaEventSynchronize and
 * cudaStreamSynchronize, each at every --call-pages size.  Without a CUDA
 * build or a device, or without --device cuda, the workload says why and is
 * skipped (exit status 0).  Note [Bench calls].
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench-calls.h"
#include "json.h"

#ifdef GMR_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

/* Note [Bench calls]
 * ~~~~~~~~~~~~~~~~~~
 * For each size of k pages (P = cuMemGetAllocationGranularity, minimum),
 * one repetition times, each call alone (CLOCK_MONOTONIC around the call,
 * no other work queued):
 *   cudaMalloc(kP), cudaFree;
 *   cuMemAddressReserve(kP), then cuMemCreate(kP) of one handle,
 *   cuMemMap of it, cuMemSetAccess over the fresh mapping, cuMemSetAccess
 *   again (repeated), cuMemUnmap, cuMemRelease, cuMemAddressFree;
 * and, once per repetition, cudaEventRecord on an idle stream,
 * cudaEventQuery of it, cudaEventSynchronize, cudaStreamSynchronize.
 * The median over --reps is reported, per call and per page; a failed call
 * stops the workload with the driver's error (exit status 1).  The JSON's
 * `model_key` names the row of gmr-compare's cost model each figure is for.
 */

#ifdef GMR_HAVE_CUDA
typedef CUresult (*pfn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*pfn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*pfn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult (*pfn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                            unsigned long long);
typedef CUresult (*pfn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*pfn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_gran)(size_t *, const CUmemAllocationProp *,
                             CUmemAllocationGranularity_flags);

typedef struct calls_drv_s {
  pfn_reserve reserve;
  pfn_addr_free addr_free;
  pfn_create create;
  pfn_release release;
  pfn_map map;
  pfn_unmap unmap;
  pfn_access access;
  pfn_gran gran;
} calls_drv_t;

static int calls_entry(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult q;
  *fn = NULL;
  if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    *fn = NULL;
  }
  return *fn != NULL;
}
#endif

/* The call kinds timed, in the order they are printed. */
enum {
  CK_MALLOC,
  CK_FREE,
  CK_VA_RESERVE,
  CK_CREATE,
  CK_MAP,
  CK_ACCESS,
  CK_ACCESS_AGAIN,
  CK_UNMAP,
  CK_RELEASE,
  CK_VA_FREE,
  CK_SIZED, /* the kinds above are timed at each size; those below once */
  CK_EVENT_RECORD = CK_SIZED,
  CK_EVENT_QUERY,
  CK_EVENT_SYNC,
  CK_STREAM_SYNC,
  CK_COUNT
};

static const struct {
  const char *call, *model_key; /* model_key: gmr-compare's row (compare-cost.c) */
} calls_kinds[CK_COUNT] = {
    [CK_MALLOC] = {"cudaMalloc", "reserve"},
    [CK_FREE] = {"cudaFree", "release"},
    [CK_VA_RESERVE] = {"cuMemAddressReserve", "va_reserve"},
    [CK_CREATE] = {"cuMemCreate", "page_create"},
    [CK_MAP] = {"cuMemMap", "page_map"},
    [CK_ACCESS] = {"cuMemSetAccess (fresh)", "set_access"},
    [CK_ACCESS_AGAIN] = {"cuMemSetAccess (again)", "-"},
    [CK_UNMAP] = {"cuMemUnmap", "page_unmap"},
    [CK_RELEASE] = {"cuMemRelease", "page_release"},
    [CK_VA_FREE] = {"cuMemAddressFree", "va_release"},
    [CK_EVENT_RECORD] = {"cudaEventRecord", "event_record"},
    [CK_EVENT_QUERY] = {"cudaEventQuery", "event_query"},
    [CK_EVENT_SYNC] = {"cudaEventSynchronize", "sync"},
    [CK_STREAM_SYNC] = {"cudaStreamSynchronize", "sync"},
};

/* Say why the workload did not run, in the table or the JSON. */
static void calls_skip(const bench_calls_args_t *a, const char *why) {
  FILE *outs[2] = {a->json ? stdout : NULL, a->json_file};
  for (int f = 0; f < 2; ++f) {
    if (outs[f] == NULL) continue;
    fprintf(outs[f], "%s\n  {\"workload\": \"calls\", \"skipped\": ", *a->first ? "" : ",");
    tool_json_string(outs[f], why);
    fputc('}', outs[f]);
  }
  if (!a->json) printf("\ngmr-bench: driver calls: skipped: %s\n", why);
  *a->first = false;
}

#ifdef GMR_HAVE_CUDA
static uint64_t calls_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int calls_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double calls_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, calls_cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Time one call into t (µs); on failure say which and return 1. */
#define CALLS_TIME(slot, expr, ok)                                                                 \
  do {                                                                                             \
    uint64_t t0_ = calls_now_ns();                                                                 \
    int good_ = (expr) == (ok);                                                                    \
    t[slot] = (double)(calls_now_ns() - t0_) / 1e3;                                                \
    if (!good_) {                                                                                  \
      fprintf(stderr, "gmr-bench: calls: %s of %zu bytes failed\n", calls_kinds[slot].call,        \
              bytes);                                                                              \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* One repetition at `bytes`: the sized kinds into t[0 .. CK_SIZED). */
static int calls_sized(const calls_drv_t *d, int dev, size_t bytes, double *t) {
  void *p = NULL;
  CALLS_TIME(CK_MALLOC, cudaMalloc(&p, bytes), cudaSuccess);
  CALLS_TIME(CK_FREE, cudaFree(p), cudaSuccess);
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CALLS_TIME(CK_VA_RESERVE, d->reserve(&va, bytes, 0, 0, 0), CUDA_SUCCESS);
  CALLS_TIME(CK_CREATE, d->create(&h, bytes, &prop, 0), CUDA_SUCCESS);
  CALLS_TIME(CK_MAP, d->map(va, bytes, 0, h, 0), CUDA_SUCCESS);
  CALLS_TIME(CK_ACCESS, d->access(va, bytes, &acc, 1), CUDA_SUCCESS);
  CALLS_TIME(CK_ACCESS_AGAIN, d->access(va, bytes, &acc, 1), CUDA_SUCCESS);
  CALLS_TIME(CK_UNMAP, d->unmap(va, bytes), CUDA_SUCCESS);
  CALLS_TIME(CK_RELEASE, d->release(h), CUDA_SUCCESS);
  CALLS_TIME(CK_VA_FREE, d->addr_free(va, bytes), CUDA_SUCCESS);
  return 0;
}

/* One repetition of the event and synchronize calls into t[CK_SIZED ..). */
static int calls_events(cudaStream_t s, cudaEvent_t ev, double *t) {
  size_t bytes = 0; /* for CALLS_TIME's message */
  CALLS_TIME(CK_EVENT_RECORD, cudaEventRecord(ev, s), cudaSuccess);
  uint64_t t0 = calls_now_ns();
  cudaError_t q = cudaEventQuery(ev);
  t[CK_EVENT_QUERY] = (double)(calls_now_ns() - t0) / 1e3;
  if (q != cudaSuccess && q != cudaErrorNotReady) {
    fprintf(stderr, "gmr-bench: calls: cudaEventQuery failed: %s\n", cudaGetErrorString(q));
    return 1;
  }
  cudaGetLastError();
  CALLS_TIME(CK_EVENT_SYNC, cudaEventSynchronize(ev), cudaSuccess);
  CALLS_TIME(CK_STREAM_SYNC, cudaStreamSynchronize(s), cudaSuccess);
  return 0;
}

static void calls_print(const bench_calls_args_t *a, size_t P, double med[][CK_COUNT]) {
  FILE *outs[2] = {a->json ? stdout : NULL, a->json_file};
  for (int f = 0; f < 2; ++f) {
    FILE *out = outs[f];
    if (out == NULL) continue;
    fprintf(out,
            "%s\n  {\"workload\": \"calls\", \"backend\": \"cuda\", \"page_size\": %zu, "
            "\"reps\": %d, \"points\": [",
            *a->first ? "" : ",", P, a->reps);
    int first = 1;
    for (int k = 0; k < CK_COUNT; ++k)
      for (int s = 0; s < (k < CK_SIZED ? a->n_pages : 1); ++s) {
        size_t pages = k < CK_SIZED ? a->pages[s] : 0;
        double us = med[k < CK_SIZED ? s : 0][k];
        fprintf(out,
                "%s\n    {\"call\": \"%s\", \"model_key\": \"%s\", \"pages\": %zu, "
                "\"us\": %.2f, \"us_per_page\": ",
                first ? "" : ",", calls_kinds[k].call, calls_kinds[k].model_key, pages, us);
        if (pages)
          fprintf(out, "%.2f}", us / (double)pages);
        else
          fputs("null}", out);
        first = 0;
      }
    fputs("]}", out);
    fflush(out);
  }
  if (!a->json) {
    printf("\ngmr-bench: driver calls, host microseconds per call (median of %d repetitions),\n"
           "  CUDA device, page %zu bytes; each call timed alone (docs/benchmarks.md): the\n"
           "  figures of gmr-compare's device-time model (tools/compare-cost.c).\n\n",
           a->reps, P);
    printf("%-26s %-13s", "call", "model row");
    for (int s = 0; s < a->n_pages; ++s)
      printf(" %8zu pg %7s", a->pages[s], "us/pg");
    putchar('\n');
    for (int k = 0; k < CK_COUNT; ++k) {
      printf("%-26s %-13s", calls_kinds[k].call, calls_kinds[k].model_key);
      if (k >= CK_SIZED) {
        printf(" %11.2f us\n", med[0][k]);
        continue;
      }
      for (int s = 0; s < a->n_pages; ++s)
        printf(" %11.2f %7.2f", med[s][k], med[s][k] / (double)a->pages[s]);
      putchar('\n');
    }
  }
  *a->first = false;
}
#endif

int bench_calls(const bench_calls_args_t *a) {
#ifndef GMR_HAVE_CUDA
  calls_skip(a, "this gmr-bench was built without CUDA");
  return 0;
#else
  if (!a->cuda) {
    calls_skip(a, "the driver calls are timed on a GPU only (--device cuda)");
    return 0;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    calls_skip(a, "no CUDA device");
    return 0;
  }
  calls_drv_t d;
  memset(&d, 0, sizeof d);
  int ok = calls_entry("cuMemAddressReserve", (void **)&d.reserve) &
           calls_entry("cuMemAddressFree", (void **)&d.addr_free) &
           calls_entry("cuMemCreate", (void **)&d.create) &
           calls_entry("cuMemRelease", (void **)&d.release) &
           calls_entry("cuMemMap", (void **)&d.map) & calls_entry("cuMemUnmap", (void **)&d.unmap) &
           calls_entry("cuMemSetAccess", (void **)&d.access) &
           calls_entry("cuMemGetAllocationGranularity", (void **)&d.gran);
  if (!ok) {
    calls_skip(a, "the driver has no virtual memory management entry points");
    return 0;
  }
  int dev = 0;
  cudaSetDevice(dev);
  cudaFree(0); /* the context, outside the timings */
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t P = 0;
  if (d.gran(&P, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || P == 0) {
    calls_skip(a, "cuMemGetAllocationGranularity failed");
    return 0;
  }
  cudaStream_t s;
  cudaEvent_t ev;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "gmr-bench: calls: cudaStreamCreate failed\n");
    return 1;
  }
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    fprintf(stderr, "gmr-bench: calls: cudaEventCreate failed\n");
    cudaStreamDestroy(s);
    return 1;
  }
  double(*med)[CK_COUNT] = calloc((size_t)a->n_pages, sizeof *med);
  double(*t)[CK_COUNT] = calloc((size_t)a->reps, sizeof *t);
  double *col = calloc((size_t)a->reps, sizeof *col);
  int rc = med && t && col ? 0 : 1;
  /* One untimed round first: the driver's first VMM calls set things up. */
  if (rc == 0) rc = calls_sized(&d, dev, P, t[0]);
  for (int sz = 0; sz < a->n_pages && rc == 0; ++sz) {
    for (int r = 0; r < a->reps && rc == 0; ++r) {
      rc = calls_sized(&d, dev, a->pages[sz] * P, t[r]);
      if (rc == 0 && sz == 0) rc = calls_events(s, ev, t[r]);
    }
    for (int k = 0; k < CK_COUNT && rc == 0; ++k) {
      if (k >= CK_SIZED && sz > 0) break;
      for (int r = 0; r < a->reps; ++r)
        col[r] = t[r][k];
      med[sz][k] = calls_median(col, a->reps);
    }
  }
  if (rc == 0) calls_print(a, P, med);
  free(med);
  free(t);
  free(col);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return rc;
#endif
}
