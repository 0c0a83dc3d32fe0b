/* interpose-shared.c: TAP test of the interposer's memory info under a cap
 * shared with another process (limit.shared), on the simulator and the
 * stand-in libcuda.so.1.
 *
 * Run by tests/interpose-shared.sh under LD_PRELOAD=libgmr-preload.so with
 * GMR_CONFIG naming `policy: direct`, `limit: {bytes: 64MiB, counts:
 * reserved, shared: {cap: 96MiB, ...}}`.  A child (its own process, its own
 * runtime and slot) takes 48 MiB through cuMemAlloc; then in the parent
 * cuMemGetInfo and cudaMemGetInfo report the 64 MiB quota as total and what
 * the shared cap leaves as free, allocations past it fail as a device OOM,
 * and after kill -9 of the child the parent grows into the freed memory.
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);
typedef int (*info_fn)(size_t *, size_t *);

int main(void) {
  if (getenv("LD_PRELOAD") == NULL || strstr(getenv("LD_PRELOAD"), "libgmr-preload") == NULL) {
    printf("1..0 # SKIP run through tests/interpose-shared.sh (needs LD_PRELOAD)\n");
    return 0;
  }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ok(cu != NULL, "dlopen(\"libcuda.so.1\") finds the stand-in driver")) return 1;
  alloc_fn alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
  free_fn dfree = (free_fn)dlsym(cu, "cuMemFree_v2");
  info_fn info = (info_fn)dlsym(cu, "cuMemGetInfo_v2");
  info_fn rt_info = (info_fn)dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
  if (!ok(alloc && dfree && info && rt_info, "the hooked entry points")) return 1;

  /* The other process, before this one makes its runtime. */
  int up[2];
  if (pipe(up) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    unsigned long long p = 0;
    char c = alloc(&p, 48 * MiB) == 0 ? 1 : 2;
    if (write(up[1], &c, 1) != 1) _exit(1);
    for (;;)
      pause();
  }
  char c = 0;
  ok(read(up[0], &c, 1) == 1 && c == 1, "another process holds 48 MiB of the 96 MiB cap");

  size_t f = 0, t = 0;
  is_int(info(&f, &t), 0, "cuMemGetInfo_v2");
  is_u64(t, 64 * MiB, "  total = this process's 64 MiB quota");
  is_u64(f, 48 * MiB, "  free = what the shared cap leaves: 96 - 48 MiB");
  unsigned long long a = 0, b = 0;
  is_int(alloc(&a, 50 * MiB), 2,
         "cuMemAlloc(50 MiB) past the shared cap: CUDA_ERROR_OUT_OF_MEMORY");
  is_int(alloc(&a, 40 * MiB), 0, "cuMemAlloc(40 MiB) fits");
  is_int(rt_info(&f, &t), 0, "cudaMemGetInfo");
  is_u64(t, 64 * MiB, "  total = the quota");
  is_u64(f, 8 * MiB, "  free = min(64 - 40, 96 - 88) = 8 MiB");
  gmr_runtime_t *rt = NULL;
  int64_t v = 0;
  ok(gmr_default_runtime(0, &rt) == 0 &&
         gmr_stat_get(rt, "limit_shared_committed_bytes", &v) == 0 && v == (int64_t)(88 * MiB),
     "limit_shared_committed_bytes = 88 MiB");

  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  is_int(info(&f, &t), 0, "the other process is killed (kill -9)");
  is_u64(f, 24 * MiB, "  free = min(64 - 40, 96 - 40) = 24 MiB: its share is back");
  is_int(alloc(&b, 24 * MiB), 0, "cuMemAlloc(24 MiB): this process grows into it");
  is_int(dfree(a), 0, "cuMemFree");
  is_int(dfree(b), 0, "cuMemFree");
  return done_testing();
}
