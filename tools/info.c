/* info.c: gmr-info, what the device offers and what gmr's CUDA backend can do.
 *
 *   gmr-info [--device N]        (getopt_long; --help, --version: tools/cli.h)
 *
 * Prints the device's total and free memory, what the CUDA context costs, the
 * allocation granularity, and which backend features work (cudaMalloc, VMM
 * map/unmap, events).  Without a driver or a device it says so, prints the
 * simulated device's figures instead, and exits 0.
 *
 * How the context's cost is measured.  The driver can only report free memory
 * (cuMemGetInfo) once a context exists, so it cannot see what that context
 * took.  NVML can: it reads the device's used memory without a context.  So:
 *   used0 = NVML used, after cuInit (which creates no context);
 *   retain and make current the primary context (the one the CUDA runtime,
 *   PyTorch, CuPy and JAX all use);
 *   used1 = NVML used;              context cost = used1 - used0
 *   create gmr's runtime on it (gmr's static CUDA runtime attaches to that
 *   context and loads its own module);
 *   used2 = NVML used;              runtime cost = used2 - used1
 * NVML's figure is device-wide: another process allocating at the same time
 * would be counted too (the tool says how many processes NVML saw).  Without
 * NVML the tool prints total - free right after the context, an upper bound
 * that includes every other user of the device.
 *
 * The driver and NVML are reached with dlopen, so the tool needs no CUDA
 * header and runs on machines without them.  The backend's features
 * (reserve/release, map/unmap, events) are tried through the public
 * gmr_backend_probe; the tool uses gmr.h only.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "gmr.h"

#define MiB (1024.0 * 1024.0)

typedef struct nvml_memory_s {
  unsigned long long total, free, used; /* bytes */
} nvml_memory_t;

typedef struct probe_s {
  void *cuda, *nvml;
  int (*cuInit)(unsigned);
  int (*cuDriverGetVersion)(int *);
  int (*cuDeviceGetCount)(int *);
  int (*cuDeviceGet)(int *, int);
  int (*cuDeviceGetName)(char *, int, int);
  int (*cuDeviceGetPCIBusId)(char *, int, int);
  int (*cuDeviceTotalMem)(size_t *, int);
  int (*cuDevicePrimaryCtxRetain)(void **, int);
  int (*cuCtxSetCurrent)(void *);
  int (*cuMemGetInfo)(size_t *, size_t *);
  int (*nvmlInit)(void);
  int (*nvmlByBusId)(const char *, void **);
  int (*nvmlMemoryInfo)(void *, nvml_memory_t *);
  int (*nvmlProcesses)(void *, unsigned *, void *);
  void *nvml_dev;
} probe_t;

static void *sym(void *h, const char *name) {
  return h ? dlsym(h, name) : NULL;
}

static void load(probe_t *p) {
  memset(p, 0, sizeof *p);
  p->cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  p->nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
#define S(h, f, name) *(void **)&p->f = sym(p->h, name)
  S(cuda, cuInit, "cuInit");
  S(cuda, cuDriverGetVersion, "cuDriverGetVersion");
  S(cuda, cuDeviceGetCount, "cuDeviceGetCount");
  S(cuda, cuDeviceGet, "cuDeviceGet");
  S(cuda, cuDeviceGetName, "cuDeviceGetName");
  S(cuda, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
  S(cuda, cuDeviceTotalMem, "cuDeviceTotalMem_v2");
  S(cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  S(cuda, cuCtxSetCurrent, "cuCtxSetCurrent");
  S(cuda, cuMemGetInfo, "cuMemGetInfo_v2");
  S(nvml, nvmlInit, "nvmlInit_v2");
  S(nvml, nvmlByBusId, "nvmlDeviceGetHandleByPciBusId_v2");
  S(nvml, nvmlMemoryInfo, "nvmlDeviceGetMemoryInfo");
  S(nvml, nvmlProcesses, "nvmlDeviceGetComputeRunningProcesses");
#undef S
}

/* NVML's used bytes of the device, or -1. */
static long long nvml_used(const probe_t *p) {
  nvml_memory_t m;
  if (p->nvml_dev == NULL || p->nvmlMemoryInfo(p->nvml_dev, &m) != 0) return -1;
  return (long long)m.used;
}

static void print_size(const char *what, double bytes) {
  printf("  %-34s %16.0f bytes  (%.1f MiB)\n", what, bytes, bytes / MiB);
}

static void features(gmr_runtime_t *rt) {
  gmr_backend_probe_t p;
  if (gmr_backend_probe(rt, &p) != 0) {
    printf("  the backend could not be probed: %s\n", gmr_last_error(rt));
    return;
  }
  size_t f = 0, t = 0;
  if (gmr_mem_info(rt, &f, &t) == 0) {
    print_size("total memory (backend)", (double)t);
    print_size("free memory (backend)", (double)f);
  }
  print_size("allocation granularity", (double)p.granularity);
  printf("backend features (%s):\n", gmr_runtime_backend(rt));

  if (p.reserve_err == 0)
    printf("  reserve/release (cudaMalloc)     works: %.1f us for a %zu-byte pair\n", p.reserve_us,
           p.granularity);
  else
    printf("  reserve/release (cudaMalloc)     FAILS: %s\n", gmr_strerror(p.reserve_err));

  if (p.vmm_err == GMR_ENOTSUP)
    printf("  VMM map/unmap                    not available on this backend\n");
  else if (p.vmm_err == 0)
    printf("  VMM map/unmap                    works (%zu-byte pages in a %zu-byte range)\n",
           p.granularity, p.vmm_span);
  else
    printf("  VMM map/unmap                    FAILS to %s: %s\n", p.vmm_step,
           gmr_strerror(p.vmm_err));

  if (p.event_err != 0)
    printf("  events (record/sync/query)       FAIL: %s\n", gmr_strerror(p.event_err));
  else if (p.event_sync_err == 0 && p.event_query_err == 0)
    printf("  events (record/sync/query)       work\n");
  else
    printf("  events (record/sync/query)       FAIL: sync %d, query %d\n", p.event_sync_err,
           p.event_query_err);
}

static int simulator(const char *why) {
  printf("no CUDA device: %s\n", why);
  printf("simulated device (what gmr-compare and the tests use; capacity and "
         "granularity are configurable):\n");
  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  gmr_runtime_t *rt = NULL;
  if (gmr_config_load_string("device: {backend: sim}\npolicy: direct\n", &cfg, &cerr) != 0 ||
      gmr_runtime_new(cfg, 0, &rt) != 0) {
    printf("  the simulator could not be created: %s\n", gmr_thread_last_error());
    gmr_config_free(cfg);
    return 0;
  }
  features(rt);
  gmr_runtime_free(rt);
  gmr_config_free(cfg);
  return 0;
}

static const char info_usage[] =
    "usage: gmr-info [--device N]\n"
    "\n"
    "Print what CUDA device N offers (total and free memory, what the CUDA\n"
    "context and gmr's runtime cost, the allocation granularity) and which\n"
    "features of gmr's CUDA backend work on it (cudaMalloc, VMM map/unmap,\n"
    "events).  Without a driver or a device it says so and prints the simulated\n"
    "device's figures instead (143771 MiB, gmr's default).\n"
    "\n"
    "  -d, --device N   the CUDA ordinal to look at (default 0)\n"
    "  -h, --help       print this help and exit\n"
    "  -V, --version    print the version and exit\n"
    "\n"
    "Exit status: 0 (also without a GPU), 2 for usage errors and for a device\n"
    "that does not exist.\n";

int main(int argc, char **argv) {
  static const struct option longopts[] = {{"device", required_argument, NULL, 'd'},
                                           {"help", no_argument, NULL, 'h'},
                                           {"version", no_argument, NULL, 'V'},
                                           {NULL, 0, NULL, 0}};
  int ordinal = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":d:hV", longopts, NULL)) != -1) {
    switch (c) {
    case 'd': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (optarg[0] == '\0' || *end != '\0' || v < 0 || v > 1024)
        return cli_usage_error("gmr-info", "--device takes a CUDA ordinal, not '%s'", optarg);
      ordinal = (int)v;
      break;
    }
    case 'h':
      fputs(info_usage, stdout);
      return 0;
    case 'V':
      return cli_version("gmr-info");
    default:
      return cli_bad_option("gmr-info", argv, c, longopts);
    }
  }
  if (optind < argc) return cli_usage_error("gmr-info", "unexpected argument '%s'", argv[optind]);
  probe_t p;
  load(&p);
  if (p.cuda == NULL || p.cuInit == NULL)
    return simulator("no CUDA driver (libcuda.so.1 not found)");
  int r = p.cuInit(0);
  if (r != 0) {
    char why[96];
    snprintf(why, sizeof why, "cuInit failed with CUDA error %d", r);
    return simulator(why);
  }
  int count = 0, dev = 0, drv = 0;
  if (p.cuDeviceGetCount(&count) != 0 || count == 0) return simulator("the driver sees no device");
  if (ordinal >= count) {
    fprintf(stderr, "gmr-info: device %d does not exist (%d device%s)\n", ordinal, count,
            count == 1 ? "" : "s");
    return 2;
  }
  p.cuDeviceGet(&dev, ordinal);
  char name[128] = "?", bus[32] = "";
  size_t total = 0;
  p.cuDeviceGetName(name, sizeof name, dev);
  p.cuDeviceTotalMem(&total, dev);
  if (p.cuDriverGetVersion) p.cuDriverGetVersion(&drv);
  if (p.cuDeviceGetPCIBusId) p.cuDeviceGetPCIBusId(bus, sizeof bus, dev);
  if (p.nvmlInit && p.nvmlByBusId && p.nvmlMemoryInfo && p.nvmlInit() == 0 &&
      p.nvmlByBusId(bus, &p.nvml_dev) != 0)
    p.nvml_dev = NULL;
  printf("device %d: %s (PCI %s), driver API %d.%d\n", ordinal, name, bus, drv / 1000,
         drv % 1000 / 10);
  print_size("total memory", (double)total);

  long long used0 = nvml_used(&p);
  void *ctx = NULL;
  if (p.cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || p.cuCtxSetCurrent(ctx) != 0)
    return simulator("the primary context could not be created");
  size_t f = 0, t = 0;
  p.cuMemGetInfo(&f, &t);
  long long used1 = nvml_used(&p);
  print_size("free memory (with a context)", (double)f);
  if (used0 >= 0 && used1 >= 0) {
    unsigned nproc = 0;
    if (p.nvmlProcesses) p.nvmlProcesses(p.nvml_dev, &nproc, NULL);
    print_size("CUDA context (NVML, before/after)", (double)(used1 - used0));
    printf("  %-34s %16lld bytes before the context; %u other process%s on the device\n",
           "device memory in use (NVML)", used0, nproc > 0 ? nproc - 1 : 0, nproc == 2 ? "" : "es");
  } else {
    print_size("in use after the context (bound)", (double)(t - f));
    printf("  (NVML unavailable: this bound also counts every other user of the device)\n");
  }

  gmr_config_t *cfg = NULL;
  gmr_error_t cerr;
  gmr_runtime_t *rt = NULL;
  if (gmr_config_load_string("device: {backend: cuda}\npolicy: direct\n", &cfg, &cerr) != 0 ||
      gmr_runtime_new(cfg, ordinal, &rt) != 0) {
    printf("gmr's CUDA backend could not start: %s\n", gmr_thread_last_error());
    gmr_config_free(cfg);
    return 0;
  }
  long long used2 = nvml_used(&p);
  if (used1 >= 0 && used2 >= 0)
    print_size("gmr's CUDA runtime on top (NVML)", (double)(used2 - used1));
  features(rt);
  gmr_runtime_free(rt);
  gmr_config_free(cfg);
  return 0;
}
