/* policy-caching.c: the caching policy against PyTorch's behaviour.
 *
 * The fifteen behaviours of the specification's §11, each with the numbers
 * PyTorch's CUDACachingAllocator gives, on the simulated device: rounding,
 * pools, segment sizes, best fit, splitting, stream isolation,
 * record_stream with events, empty_cache, the OOM message, the memory
 * fraction, max_split_size, roundup_power2_divisions, expandable segments,
 * memory_summary() byte for byte, and the resets of the statistics.  Then
 * the PYTORCH_CUDA_ALLOC_CONF parser's errors.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "sim-runtime.h"
#include "tap.h"

/* From lib/core/util.c (this test links the library statically). */
void gmr__host_fail_nth(uint64_t k);
/* policies/caching/report.c: the OOM message's sentence on the device's
 * processes (NVML's, on a GPU; the simulator has none). */
typedef struct gmr_proc_usage_s {
  unsigned pid;
  uint64_t bytes;
} gmr_proc_usage_t;
const char *gmr__cache_proc_info(const gmr_proc_usage_t *p, size_t n, unsigned self, char *buf,
                                 size_t len);

#define MiB  ((size_t)1 << 20)
#define GiB  ((size_t)1 << 30)
#define S(n) GMR_SIM_STREAM(n)

static gmr_runtime_t *make_rt(const char *yaml, uint64_t capacity) {
  return sim_runtime(yaml, capacity, 0);
}

static gmr_runtime_t *fresh(void) {
  return make_rt("policy: caching\n", 0);
}

static int64_t st(gmr_runtime_t *rt, const char *key) {
  int64_t v = -12345;
  if (gmr_stat_get(rt, key, &v) != 0) diag("no statistic %s", key);
  return v;
}

static size_t rounded(gmr_runtime_t *rt, void *p) {
  size_t req = 0, got = 0;
  gmr_alloc_size(rt, p, &req, &got);
  return got;
}

static void *alloc_on(gmr_runtime_t *rt, size_t n, gmr_stream_t s) {
  void *p = NULL;
  int rc = gmr_alloc(rt, n, s, &p);
  if (rc != 0) diag("alloc %zu: %s", n, gmr_last_error(rt));
  return p;
}
static void *alloc(gmr_runtime_t *rt, size_t n) {
  return alloc_on(rt, n, S(0));
}

static gmr_sim_counters_t counters(gmr_runtime_t *rt) {
  gmr_sim_counters_t c;
  memset(&c, 0, sizeof c);
  gmr_sim_counters(rt, &c);
  return c;
}

static char *summary_of(gmr_runtime_t *rt) {
  return summary_string(rt);
}

static const char summary_one_byte[] =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 0                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      |    512 B   |    512 B   |    512 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |    512 B   |    512 B   |    512 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         |    512 B   |    512 B   |    512 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |    512 B   |    512 B   |    512 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      |      1 B   |      1 B   |      1 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      1 B   |      1 B   |      1 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |\n"
    "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |\n"
    "|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory |   2047 KiB |   2047 KiB |   2047 KiB |      0 B   |\n"
    "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |\n"
    "|       from small pool |   2047 KiB |   2047 KiB |   2047 KiB |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |       1    |       1    |       1    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       1    |       1    |       1    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n"
    "|===========================================================================|\n";

/* 1, 2 and 15: one byte, its summary, free and reuse. */
static void test_one_byte(void) {
  gmr_runtime_t *rt = fresh();
  void *p = alloc(rt, 1);
  is_u64(rounded(rt, p), 512, "1: malloc(1) is a 512-byte block");
  is_int(st(rt, "reserved_bytes.all.current"), 2097152, "1: reserved = 2 MiB");
  is_int(st(rt, "allocated_bytes.all.current"), 512, "1: allocated = 512");
  is_int(st(rt, "active_bytes.all.current"), 512, "1: active_bytes = 512");
  is_int(st(rt, "requested_bytes.all.current"), 1, "1: requested_bytes = 1");
  is_int(st(rt, "segment.small_pool.current"), 1, "1: one small segment");
  is_int(st(rt, "segment.large_pool.current"), 0, "1: no large segment");
  is_int(st(rt, "inactive_split.all.current"), 1, "1: inactive_split = 1");
  is_int(st(rt, "inactive_split_bytes.all.current"), 2096640, "1: inactive_split_bytes");
  is_int(st(rt, "num_device_alloc"), 1, "1: one device allocation");
  is_int(st(rt, "max_split_size"), -1, "max_split_size is -1 by default");

  char *sum = summary_of(rt);
  is_str(sum, summary_one_byte, "15: memory_summary() matches PyTorch's 47 lines byte for byte");
  int lines = 0, bad = 0;
  for (char *l = sum; l && *l;) {
    char *nl = strchr(l, '\n');
    if (nl == NULL || nl - l != 77) ++bad;
    ++lines;
    l = nl ? nl + 1 : NULL;
  }
  is_int(lines, 47, "15: 47 rows");
  is_int(bad, 0, "15: every row is 77 characters and ends with a newline");
  free(sum);

  gmr_free(rt, p);
  is_int(st(rt, "allocated_bytes.all.current"), 0, "2: allocated = 0 after free");
  is_int(st(rt, "active_bytes.all.current"), 0, "2: active = 0 after free");
  is_int(st(rt, "inactive_split.all.current"), 0, "2: inactive_split = 0");
  is_int(st(rt, "inactive_split_bytes.all.current"), 0, "2: inactive_split_bytes = 0");
  is_int(st(rt, "reserved_bytes.all.current"), 2097152, "2: reserved still 2 MiB");
  void *q = alloc(rt, 1000);
  is_ptr(q, p, "2: malloc(1000) reuses the same address");
  is_u64(rounded(rt, q), 1024, "2: rounded to 1024");
  is_int(st(rt, "num_device_alloc"), 1, "2: no new device allocation");
  is_int(gmr_check(rt), 0, "invariants hold");

  /* 15: resets. */
  void *big = alloc(rt, 30 * MiB);
  gmr_free(rt, big);
  gmr_stats_reset_peak(rt);
  is_int(st(rt, "allocated_bytes.all.peak"), 1024, "15: reset_peak sets allocated peak to current");
  is_int(st(rt, "reserved_bytes.large_pool.peak"), 30 * MiB, "15: reserved peak = current");
  is_int(st(rt, "active.all.peak"), 1, "15: active peak = current");
  gmr_stats_reset_accumulated(rt);
  is_int(st(rt, "allocated_bytes.all.allocated"), 0, "15: reset_accumulated zeroes 'allocated'");
  is_int(st(rt, "allocation.all.freed"), 0, "15: reset_accumulated zeroes 'freed'");
  is_int(st(rt, "num_device_alloc"), 0, "15: and num_device_alloc");
  is_int(st(rt, "allocated_bytes.all.current"), 1024, "15: current untouched");
  is_int(st(rt, "reserved_bytes.all.current"), 32 * MiB, "15: reserved current untouched");
  gmr_free(rt, q);
  gmr_runtime_free(rt);
}

/* 3, 4, 5: pools and segment sizes. */
static void test_segments(void) {
  gmr_runtime_t *rt = fresh();
  void *a = alloc(rt, MiB);
  is_u64(rounded(rt, a), MiB, "3: malloc(1 MiB) is 1 MiB");
  is_int(st(rt, "segment.small_pool.current"), 1, "3: exactly 1 MiB goes to the small pool");
  is_int(st(rt, "reserved_bytes.small_pool.current"), 2 * MiB, "3: in a 2 MiB segment");
  is_int(st(rt, "inactive_split_bytes.small_pool.current"), MiB, "3: 1 MiB remainder stays free");
  void *b = alloc(rt, MiB + 1);
  is_u64(rounded(rt, b), 1049088, "3: malloc(1 MiB + 1) is 1,049,088 bytes");
  is_int(st(rt, "reserved_bytes.large_pool.current"), 20 * MiB, "3: in a new 20 MiB segment");
  is_int(st(rt, "inactive_split_bytes.large_pool.current"), 19922432,
         "3: with a 19,922,432-byte free remainder");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  rt = fresh();
  void *c = alloc(rt, 5 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 20 * MiB, "4: malloc(5 MiB) reserves 20 MiB");
  is_u64(rounded(rt, c), 5 * MiB, "4: block of 5 MiB");
  void *d = alloc(rt, 5 * MiB);
  is_ptr(d, (char *)c + 5 * MiB, "4: second 5 MiB at first + 5 MiB");
  is_int(st(rt, "num_device_alloc"), 1, "4: no new segment");
  is_int(st(rt, "reserved_bytes.all.current"), 20 * MiB, "4: reserved still 20 MiB");
  gmr_free(rt, c);
  gmr_free(rt, d);
  gmr_runtime_free(rt);

  rt = fresh();
  void *e = alloc(rt, 11 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 12 * MiB, "5: malloc(11 MiB) -> 12 MiB segment");
  is_int(st(rt, "allocated_bytes.all.current"), 12 * MiB, "5: allocated_bytes = 12 MiB (no split)");
  is_int(st(rt, "requested_bytes.all.current"), 11 * MiB, "5: requested_bytes = 11 MiB");
  is_int(st(rt, "inactive_split.all.current"), 0, "5: nothing split off");
  void *f = alloc(rt, 10 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 22 * MiB, "5: malloc(10 MiB) -> 10 MiB segment");
  is_u64(rounded(rt, f), 10 * MiB, "5: block of exactly 10 MiB");
  is_int(st(rt, "num_device_alloc"), 2, "5: two segments");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, e);
  gmr_free(rt, f);
  gmr_runtime_free(rt);
}

/* 6, 7: best fit and stream isolation. */
static void test_best_fit(void) {
  gmr_runtime_t *rt = fresh();
  void *a = alloc(rt, 14 * MiB), *b = alloc(rt, 40 * MiB);
  gmr_free(rt, a);
  gmr_free(rt, b);
  void *c = alloc(rt, 12 * MiB);
  is_ptr(c, a, "6: malloc(12 MiB) takes the 14 MiB block");
  is_u64(rounded(rt, c), 12 * MiB, "6: and splits it (12 MiB)");
  is_int(st(rt, "inactive_split_bytes.large_pool.current"), 2 * MiB, "6: 2 MiB remainder");
  is_int(st(rt, "num_device_alloc"), 2, "6: no new segment");
  gmr_free(rt, c);
  gmr_runtime_free(rt);

  rt = fresh();
  void *x = alloc(rt, 14 * MiB), *y = alloc(rt, 14 * MiB);
  void *lo = (uintptr_t)x < (uintptr_t)y ? x : y;
  gmr_free(rt, y);
  gmr_free(rt, x);
  void *z = alloc(rt, 14 * MiB);
  is_ptr(z, lo, "6: equal sizes: the lower address wins");
  gmr_free(rt, z);
  gmr_runtime_free(rt);

  rt = fresh();
  void *s1 = alloc_on(rt, 20 * MiB, S(1));
  gmr_free(rt, s1);
  void *s2 = alloc_on(rt, 20 * MiB, S(2));
  ok(s2 != s1, "7: a block freed on S1 is not reused on S2");
  is_int(st(rt, "reserved_bytes.all.current"), 40 * MiB, "7: reserved += 20 MiB");
  is_int(st(rt, "num_device_alloc"), 2, "7: a new device allocation");
  void *s1b = alloc_on(rt, 20 * MiB, S(1));
  is_ptr(s1b, s1, "7: but is reused on S1");
  gmr_free(rt, s2);
  gmr_free(rt, s1b);
  gmr_runtime_free(rt);
}

static int find_state_cb(const gmr_walk_entry_t *e, void *ud) {
  gmr_walk_entry_t *want = ud;
  if (!e->is_segment && e->address == want->address) want->state = e->state;
  return 0;
}

/* 8: record_stream. */
static void test_record_stream(void) {
  gmr_runtime_t *rt = fresh();
  void *x = alloc_on(rt, 4 * MiB, S(1));
  is_int(gmr_record_stream(rt, x, S(2)), 0, "8: record_stream on another stream");
  gmr_sim_stream_enqueue(rt, S(2));
  gmr_sim_counters_t c0 = counters(rt);
  gmr_free(rt, x);
  is_u64(counters(rt).event_records, c0.event_records + 1, "8: one event recorded at free");
  is_int(st(rt, "allocated_bytes.all.current"), 0, "8: allocated drops at free");
  is_int(st(rt, "active_bytes.all.current"), 4 * MiB, "8: active does not");
  gmr_walk_entry_t w = {.address = (uintptr_t)x, .state = GMR_BLOCK_FREE};
  gmr_walk(rt, find_state_cb, &w);
  is_int(w.state, GMR_BLOCK_PENDING_FREE, "8: the block is active_pending_free");
  void *y = alloc_on(rt, 512, S(1));
  is_int(st(rt, "active_bytes.all.current"), 4 * MiB + 512, "8: still pending while S2 runs");
  void *z = alloc_on(rt, 4 * MiB, S(1));
  ok(z != x, "8: the pending block is not handed out");
  gmr_free(rt, z);
  gmr_sim_stream_complete(rt, S(2));
  is_int(st(rt, "active_bytes.all.current"), 4 * MiB + 512, "8: nothing happens until a malloc");
  void *v = alloc_on(rt, 512, S(3));
  is_int(st(rt, "active_bytes.all.current"), 1024, "8: the next malloc returns it to the pool");
  w.state = GMR_BLOCK_ALLOCATED;
  gmr_walk(rt, find_state_cb, &w);
  is_int(w.state, GMR_BLOCK_FREE, "8: the block is inactive again");
  is_int(gmr_check(rt), 0, "invariants hold");
  void *u = alloc_on(rt, 4 * MiB, S(1));
  is_ptr(u, x, "8: and reusable on its stream");
  gmr_sim_counters_t c1 = counters(rt);
  is_int(gmr_record_stream(rt, u, S(1)), 0, "8: record_stream on its own stream");
  gmr_free(rt, u);
  is_u64(counters(rt).event_records, c1.event_records, "8: is a no-op (no event)");
  is_int(st(rt, "active_bytes.all.current"), 1024, "8: and the block is freed at once");
  gmr_free(rt, y);
  gmr_free(rt, v);
  gmr_runtime_free(rt);
}

/* 9: empty_cache. */
static void test_empty_cache(void) {
  gmr_runtime_t *rt = fresh();
  void *a = alloc(rt, 30 * MiB); /* its own segment, freed whole */
  void *b = alloc(rt, 5 * MiB);  /* 20 MiB segment, stays partly live */
  void *c = alloc(rt, 5 * MiB);
  gmr_free(rt, a);
  gmr_free(rt, c);
  int64_t split_bytes = st(rt, "inactive_split_bytes.all.current");
  is_int(split_bytes, 15 * MiB, "9: 15 MiB free slices in the live segment");
  gmr_sim_counters_t c0 = counters(rt);
  is_int(gmr_empty_cache(rt), 0, "9: empty_cache");
  is_u64(counters(rt).release_calls, c0.release_calls + 1, "9: one cudaFree");
  is_int(st(rt, "num_device_free"), 1, "9: num_device_free = 1");
  is_int(st(rt, "reserved_bytes.all.current"), 20 * MiB, "9: reserved -= 30 MiB");
  is_int(st(rt, "inactive_split_bytes.all.current"), split_bytes, "9: free slices stay");
  is_int(st(rt, "num_sync_all_streams"), 1, "9: num_sync_all_streams = 1");
  gmr_free(rt, b);
  gmr_empty_cache(rt);
  is_int(st(rt, "reserved_bytes.all.current"), 0, "9: all released once free");
  is_int(st(rt, "num_sync_all_streams"), 2, "9: num_sync_all_streams = 2");
  gmr_runtime_free(rt);
}

/* 10: the OOM message. */
static void test_oom(void) {
  gmr_runtime_t *rt = make_rt("policy: caching\n", 80 * GiB); /* the device of the message */
  gmr_sim_fail_all(rt, 1);
  void *p = NULL;
  is_int(gmr_alloc(rt, 5 * MiB, S(0), &p), GMR_ENOMEM, "10: malloc(5 MiB) fails");
  ok(p == NULL, "10: out-parameter untouched");
  const char *msg = gmr_last_error(rt);
  is_str(msg,
         "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 "
         "GiB of which 80.00 GiB is free. Of the allocated memory 0 bytes is allocated by "
         "PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but "
         "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
         "True to avoid fragmentation.  See documentation for Memory Management  "
         "(https://docs.pytorch.org/docs/stable/notes/"
         "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
         "10: PyTorch's OOM message");
  is_int(st(rt, "num_ooms"), 1, "10: num_ooms = 1");
  is_int(st(rt, "num_alloc_retries"), 1, "10: num_alloc_retries = 1");
  is_int(st(rt, "num_sync_all_streams"), 1, "10: num_sync_all_streams = 1");
  is_u64(counters(rt).reserve_calls, 2, "10: two cudaMalloc attempts");
  gmr_stats_t s;
  gmr_stats(rt, &s);
  is_u64(s.ooms, 1, "10: gmr_stats ooms = 1");
  is_u64(s.alloc_retries, 1, "10: gmr_stats alloc_retries = 1");
  gmr_sim_fail_all(rt, 0);
  void *a = alloc(rt, 100);
  void *b = alloc(rt, 30 * MiB);
  gmr_sim_fail_all(rt, 1);
  is_int(gmr_alloc(rt, 100, S(0), &p), 0, "10: a cached block is still handed out");
  is_int(gmr_alloc(rt, 30 * MiB, S(0), &p), GMR_ENOMEM, "10: a new segment is not");
  like(gmr_last_error(rt), "Tried to allocate 30.00 MiB. GPU 0",
       "10: 'Tried to allocate' shows the segment size");
  like(gmr_last_error(rt),
       "Of the allocated memory 30.00 MiB is allocated by PyTorch, and 2.00 "
       "MiB is reserved by PyTorch but unallocated.",
       "10: allocated and reserved-but-unallocated");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);
}

/* 11: the memory fraction. */
static void test_fraction(void) {
  gmr_runtime_t *rt =
      make_rt("policy: {name: caching, per_process_memory_fraction: 0.5}\n", 3 * GiB);
  void *v[3];
  for (int i = 0; i < 3; ++i)
    v[i] = alloc(rt, 500 * MiB);
  ok(v[0] && v[1] && v[2], "11: 1500 MiB fit under 1.5 GiB");
  void *p = NULL;
  is_int(gmr_alloc(rt, 500 * MiB, S(0), &p), GMR_ENOMEM, "11: the fourth 500 MiB is refused");
  is_u64(counters(rt).reserve_calls, 3, "11: without calling the device");
  like(gmr_last_error(rt), "1.50 GiB allowed; Of the allocated memory",
       "11: the message says what is allowed");
  is_int(st(rt, "num_alloc_retries"), 1, "11: after the release-and-retry step");
  void *q = alloc(rt, 30 * MiB);
  ok(q != NULL, "11: 1530 MiB still fit");
  is_int(gmr_alloc(rt, 8 * MiB, S(0), &p), GMR_ENOMEM,
         "11: a 20 MiB segment does not, though 8 MiB would");
  like(gmr_last_error(rt), "Tried to allocate 20.00 MiB", "11: the segment size is reported");
  gmr_stats_t s;
  gmr_stats(rt, &s);
  is_u64(s.limit_bytes, 3 * GiB / 2, "11: gmr_stats reports the cap");
  for (int i = 0; i < 3; ++i)
    gmr_free(rt, v[i]);
  gmr_free(rt, q);
  gmr_runtime_free(rt);

  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  is_int(gmr_config_load_string("policy: {name: caching, per_process_memory_fraction: 1.5}\n", &cfg,
                                &err),
         GMR_ECONFIG, "11: a fraction of 1.5 is refused");
  like(err.message, "per_process_memory_fraction", "11: naming the key");
  is_int(gmr_config_load_string("policy: {name: caching, pytorch_alloc_conf: "
                                "'per_process_memory_fraction:1.5'}\n",
                                &cfg, &err),
         GMR_ECONFIG, "11: also in the string");
  like(err.message, "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
       "11: with PyTorch's words");
}

/* 12: max_split_size_mb:200. */
static void test_max_split(void) {
  gmr_runtime_t *rt =
      make_rt("policy: {name: caching, pytorch_alloc_conf: 'max_split_size_mb:200'}\n", 0);
  is_int(st(rt, "max_split_size"), 209715200, "12: max_split_size = 209,715,200");
  void *a = alloc(rt, 300 * MiB);
  gmr_free(rt, a);
  void *b = alloc(rt, 100 * MiB);
  ok(b != a, "12: malloc(100 MiB) does not take the cached 300 MiB block");
  is_int(st(rt, "reserved_bytes.all.current"), 400 * MiB, "12: a new 100 MiB segment");
  void *c = alloc(rt, 290 * MiB);
  is_ptr(c, a, "12: malloc(290 MiB) reuses the 300 MiB block");
  is_u64(rounded(rt, c), 300 * MiB, "12: without splitting it");
  is_int(st(rt, "allocated_bytes.all.current"), 400 * MiB, "12: allocated_bytes += 300 MiB");
  is_int(st(rt, "oversize_allocations.current"), 1, "12: oversize_allocations = 1");
  is_int(st(rt, "oversize_segments.current"), 1, "12: oversize_segments = 1");
  gmr_free(rt, c);
  void *d = alloc(rt, 250 * MiB);
  ok(d != a, "12: malloc(250 MiB) does not take it (50 MiB waste)");
  is_int(st(rt, "reserved_bytes.all.current"), 650 * MiB, "12: a new 250 MiB segment");
  is_int(st(rt, "oversize_segments.current"), 2, "12: two oversize segments");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, b);
  gmr_free(rt, d);
  gmr_runtime_free(rt);

  /* release_available_cached_blocks: with max_split set, an OOM first frees
   * oversize blocks of this stream, then retries without a full flush. */
  rt = make_rt("policy: {name: caching, max_split_size: 200MiB}\n", 800 * MiB);
  a = alloc(rt, 600 * MiB);
  gmr_free(rt, a);
  b = alloc(rt, 300 * MiB);
  ok(b != NULL, "12: the cached 600 MiB oversize block is released to fit 300 MiB");
  is_int(st(rt, "num_alloc_retries"), 0, "12: without the full release-and-retry");
  is_int(st(rt, "num_device_free"), 1, "12: one cudaFree");
  is_int(st(rt, "reserved_bytes.all.current"), 300 * MiB, "12: reserved = 300 MiB");
  gmr_free(rt, b);
  gmr_runtime_free(rt);
}

/* 13: roundup_power2_divisions. */
static void test_divisions(void) {
  gmr_runtime_t *rt = make_rt("policy: {name: caching, roundup_power2_divisions: 4}\n", 0);
  void *a = alloc(rt, 5000), *b = alloc(rt, 1200), *c = alloc(rt, 3 * MiB + 1);
  is_u64(rounded(rt, a), 5120, "13: 5000 -> 5120");
  is_u64(rounded(rt, b), 1536, "13: 1200 -> 1536");
  is_u64(rounded(rt, c), 3 * MiB + MiB / 2, "13: 3 MiB + 1 -> 3.5 MiB");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);

  rt = make_rt("policy: {name: caching, pytorch_alloc_conf: "
               "'roundup_power2_divisions:[256:1,>:8]'}\n",
               0);
  a = alloc(rt, 300 * MiB + 1);
  b = alloc(rt, 600 * MiB + 1);
  c = alloc(rt, 5000);
  is_u64(rounded(rt, a), 300 * MiB + 512, "13: [256:1,>:8]: 300 MiB + 1 rounds to 512 bytes");
  is_u64(rounded(rt, b), 640 * MiB, "13: 600 MiB + 1 -> 640 MiB (8 divisions from 512 MiB)");
  is_u64(rounded(rt, c), 5120, "13: small sizes take the first entry's 1 division");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_free(rt, c);
  gmr_runtime_free(rt);
}

/* 14: expandable segments. */
static void test_expandable(void) {
  gmr_runtime_t *rt = make_rt("policy: {name: caching, expandable_segments: true}\n", 0);
  void *a = alloc(rt, 5 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 20 * MiB, "14: malloc(5 MiB) maps one 20 MiB page");
  is_int(st(rt, "segment.all.current"), 0, "14: segment.all.current = 0");
  is_int(st(rt, "num_device_alloc"), 1, "14: num_device_alloc = 1");
  gmr_sim_counters_t c = counters(rt);
  is_u64(c.map_calls, 1, "14: one page mapped");
  is_u64(c.va_reserve_calls, 1, "14: in one virtual range");
  is_u64(c.reserve_calls, 0, "14: no cudaMalloc");
  void *b = alloc(rt, 16 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 40 * MiB, "14: malloc(16 MiB) -> 40 MiB");
  is_ptr(b, (char *)a + 5 * MiB, "14: contiguous after the first block");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, a);
  gmr_free(rt, b);
  is_int(st(rt, "reserved_bytes.all.current"), 40 * MiB, "14: free keeps the pages");
  gmr_empty_cache(rt);
  is_int(st(rt, "reserved_bytes.all.current"), 0, "14: empty_cache -> reserved = 0");
  c = counters(rt);
  is_u64(c.unmap_calls, 2, "14: both pages unmapped, one call each");
  is_u64(c.va_release_calls, 1, "14: and the virtual range freed");
  is_int(st(rt, "num_device_free"), 1, "14: one unmap_block");
  is_int(gmr_check(rt), 0, "invariants hold");
  void *s = alloc(rt, 100);
  is_int(st(rt, "reserved_bytes.small_pool.current"), 2 * MiB, "14: small pool pages are 2 MiB");
  gmr_free(rt, s);
  gmr_runtime_free(rt);
}

static void conf_error(const char *conf, const char *needle, const char *what) {
  char yaml[512];
  snprintf(yaml, sizeof yaml, "policy: {name: caching, pytorch_alloc_conf: \"%s\"}\n", conf);
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  memset(&err, 0, sizeof err);
  int rc = gmr_config_load_string(yaml, &cfg, &err);
  is_int(rc, GMR_ECONFIG, "conf '%s' is refused (%s)", conf, what);
  like(err.message, needle, "  ... saying %s", what);
  gmr_config_free(cfg);
}

static void test_option_errors(void) {
  conf_error("max_split_size_mb:10", "max_split_size_mb too small, must be > 20",
             "max_split_size_mb must be > 20");
  conf_error("expandable_segments:true", "Expected 'True' or 'False' at index 2",
             "booleans are True or False");
  conf_error("foo:1", "Unrecognized key 'foo' in CUDA allocator config", "unknown keys");
  conf_error("roundup_power2_divisions:[256:3]", "divisions has to be 0 or a power of 2",
             "divisions are powers of two");
  conf_error("roundup_power2_divisions:[100:2]", "intervals have to be power of 2 but got '100'",
             "intervals are powers of two");
  conf_error("max_split_size_mb:128,", "expected an option after ',' at index 3",
             "a trailing comma");
  conf_error("max_split_size_mb", "expected ':' and a value after 'max_split_size_mb'",
             "a missing value");
  conf_error("max_split_size_mb:12x", "expected a whole number of MB at index 2",
             "a malformed number");
  conf_error("garbage_collection_threshold:1.0", "garbage_collect_threshold is invalid",
             "the GC threshold range");
  conf_error("backend:cudaMallocAsync", "only backend:native", "other backends");

  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  memset(&err, 0, sizeof err);
  is_int(gmr_config_load_string("policy: {name: caching, max_split_size: 256MiB, "
                                "pytorch_alloc_conf: 'max_split_size_mb:128'}\n",
                                &cfg, &err),
         GMR_ECONFIG, "a key and the string may not both set an option");
  like(err.message,
       "max_split_size (max_split_size_mb) is set both as a key and in "
       "pytorch_alloc_conf",
       "  ... saying which");
  is_int(gmr_config_load_string("policy: {name: caching, max_split_size: 20MiB}\n", &cfg, &err),
         GMR_ECONFIG, "max_split_size of 20 MiB is refused (PyTorch: > 20)");
  is_int(gmr_config_load_string("policy: {name: caching, garbage_collection_threshold: 1.0}\n",
                                &cfg, &err),
         GMR_ECONFIG, "garbage_collection_threshold of 1.0 is refused");
  is_int(
      gmr_config_load_string("policy: {name: caching, roundup_power2_divisions: 3}\n", &cfg, &err),
      GMR_ECONFIG, "roundup_power2_divisions: 3 is refused");
  is_int(gmr_config_load_string(
             "policy: {name: caching, pytorch_alloc_conf: ' expandable_segments : True , "
             "max_split_size_mb : 128 ', roundup_power2_divisions: '[64:2,>:4]'}\n",
             &cfg, &err),
         0, "whitespace is dropped, and string and keys combine");
  gmr_config_free(cfg);

  static const char *const files[] = {"pytorch.yaml", "pytorch-expandable.yaml",
                                      "pytorch-max-split-128.yaml"};
  for (int i = 0; i < 3; ++i) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config/%s", tap_srcdir(), files[i]);
    cfg = NULL;
    int rc = gmr_config_load_file(path, &cfg, &err);
    is_int(rc, 0, "config/%s loads", files[i]);
    if (rc != 0) diag("%s", err.message);
    gmr_runtime_t *rt = NULL;
    if (cfg) gmr_runtime_new_sim(cfg, NULL, &rt);
    if (rt && i == 2) is_int(st(rt, "max_split_size"), 128 * MiB, "max-split-128 sets 128 MiB");
    gmr_runtime_free(rt);
    gmr_config_free(cfg);
  }
}

/* garbage_collection_threshold: inert without a fraction (PyTorch issue
 * #106660); with one, frees the whole free large segments whose age (in
 * large-pool searches) is at least the average, before a new segment; a
 * fraction set at run time (torch.cuda.set_per_process_memory_fraction)
 * turns it on as one in the configuration does. */
static void test_gc(void) {
  const char *yaml[3] = {"policy: {name: caching, garbage_collection_threshold: 0.5}\n",
                         "policy: {name: caching, garbage_collection_threshold: 0.5, "
                         "per_process_memory_fraction: 0.5}\n",
                         "policy: {name: caching, garbage_collection_threshold: 0.5}\n"};
  for (int run = 0; run < 3; ++run) {
    int with_fraction = run > 0;
    gmr_runtime_t *rt = make_rt(yaml[run], 1 << 30);
    if (run == 2) {
      void *early = alloc(rt, 30 * MiB); /* a deferred free pending when the fraction comes */
      gmr_free(rt, early);
      ok(gmr_set_memory_fraction(rt, 0.5) == 0, "GC: the fraction set at run time");
      early = alloc(rt, 30 * MiB);
      gmr_free(rt, early);
      gmr_empty_cache(rt);
    }
    void *a = alloc(rt, 100 * MiB), *b = alloc(rt, 120 * MiB), *c = alloc(rt, 140 * MiB);
    gmr_free(rt, a);
    gmr_free(rt, b);
    for (int i = 0; i < 5; ++i) { /* C is reused, so it stays young */
      gmr_free(rt, c);
      c = alloc(rt, 140 * MiB);
    }
    gmr_free(rt, c);
    void *d = alloc(rt, 200 * MiB);
    if (with_fraction) {
      is_int(st(rt, "num_device_free") - (run == 2), 2,
             "GC: the two old segments (100, 120 MiB) are freed");
      is_int(st(rt, "reserved_bytes.all.current"), 340 * MiB, "GC: the young 140 MiB one stays");
      is_int(st(rt, "num_alloc_retries"), 0, "GC: before any retry");
    } else {
      is_int(st(rt, "num_device_free"), 0, "GC: without a fraction it does nothing (as PyTorch)");
      is_int(st(rt, "reserved_bytes.all.current"), 560 * MiB, "GC: everything stays cached");
    }
    is_int(gmr_check(rt), 0, "invariants hold");
    gmr_free(rt, d);
    gmr_runtime_free(rt);
  }
}

/* large_segment_size (large_segment_size_mb). */
static void test_large_segment(void) {
  gmr_runtime_t *rt = make_rt("policy: {name: caching, large_segment_size: 32MiB}\n", 0);
  void *a = alloc(rt, 5 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 32 * MiB, "large_segment_size: 5 MiB -> 32 MiB");
  gmr_free(rt, a);
  gmr_runtime_free(rt);
  rt = make_rt("policy: {name: caching, pytorch_alloc_conf: "
               "'expandable_segments:True,large_segment_size_mb:32'}\n",
               0);
  a = alloc(rt, 5 * MiB);
  is_int(st(rt, "reserved_bytes.all.current"), 32 * MiB, "large_segment_size: 32 MiB pages");
  gmr_free(rt, a);
  gmr_runtime_free(rt);
}

/* Fail the k-th host allocation, for every k: every call returns 0 or
 * GMR_ENOMEM, and the state stays whole. */
static void test_host_oom_sweep(void) {
  static const char *const yaml[] = {"policy: caching\n",
                                     "policy: {name: caching, expandable_segments: true}\n"};
  for (int y = 0; y < 2; ++y) {
    gmr_config_t *cfg = NULL;
    gmr_error_t err;
    gmr_config_load_string(yaml[y], &cfg, &err);
    int bad = 0, failures = 0, k;
    for (k = 1; k <= 400; ++k) {
      gmr__host_fail_nth((uint64_t)k);
      gmr_runtime_t *rt = NULL;
      int rc = gmr_runtime_new_sim(cfg, NULL, &rt);
      if (rc != 0) {
        bad += rc != GMR_ENOMEM;
        ++failures;
        continue;
      }
      static const size_t sizes[] = {100, 5 * MiB, 30 * MiB, MiB, 700, 12 * MiB};
      void *p[6] = {0};
      for (int i = 0; i < 6; ++i) {
        rc = gmr_alloc(rt, sizes[i], S(i % 3), &p[i]);
        if (rc != 0) p[i] = NULL, bad += rc != GMR_ENOMEM, ++failures;
      }
      for (int i = 0; i < 3; ++i)
        if (p[i] && (rc = gmr_record_stream(rt, p[i], S(3))) != 0) bad += rc != GMR_ENOMEM;
      gmr_sim_stream_enqueue(rt, S(3));
      for (int i = 0; i < 3; ++i)
        if (p[i]) bad += gmr_free(rt, p[i]) != 0, p[i] = NULL;
      rc = gmr_alloc(rt, 5 * MiB, S(0), &p[0]);
      if (rc != 0) p[0] = NULL, bad += rc != GMR_ENOMEM;
      rc = gmr_empty_cache(rt);
      bad += rc != 0 && rc != GMR_ENOMEM;
      gmr__host_fail_nth(0);
      if (gmr_check(rt) != 0) {
        diag("k=%d: %s", k, gmr_last_error(rt));
        ++bad;
      }
      gmr_sim_stream_complete(rt, S(3));
      for (int i = 0; i < 6; ++i)
        gmr_free(rt, p[i]);
      gmr_empty_cache(rt);
      bad += st(rt, "reserved_bytes.all.current") != 0;
      gmr_runtime_free(rt);
    }
    gmr__host_fail_nth(0);
    is_int(bad, 0, "host OOM sweep (%s): only 0 or GMR_ENOMEM, state whole, all released",
           y ? "expandable" : "default");
    ok(failures > 10, "host OOM sweep (%s): %d injected failures were seen",
       y ? "expandable" : "default", failures);
    gmr_config_free(cfg);
  }
}

/* A runtime freed with live blocks, pending events and mapped pages gives
 * everything back (the simulator counts what is still held). */
static void test_destroy_live(void) {
  static const char *const yaml[] = {"policy: caching\n",
                                     "policy: {name: caching, expandable_segments: true}\n"};
  for (int y = 0; y < 2; ++y) {
    gmr_runtime_t *rt = make_rt(yaml[y], 0);
    void *a = alloc_on(rt, 3 * MiB, S(1)), *b = alloc_on(rt, 100, S(1));
    void *c = alloc_on(rt, 40 * MiB, S(2));
    gmr_record_stream(rt, a, S(2));
    gmr_sim_stream_enqueue(rt, S(2));
    gmr_free(rt, a);
    gmr_free(rt, c);
    ok(b != NULL, "destroy (%s): one block live, one pending, one cached",
       y ? "expandable" : "default");
    gmr_runtime_free(rt); /* ASan and the simulator's range table check the rest */
  }
}

/* Every key of torch.cuda.memory_stats(). */
static int count_cb(const char *key, int64_t value, void *ud) {
  (void)key;
  (void)value;
  ++*(int *)ud;
  return 0;
}

static void test_keys(void) {
  gmr_runtime_t *rt = fresh();
  int n = 0;
  gmr_stats_foreach(rt, count_cb, &n);
  is_int(n, 122, "memory_stats() has 122 keys");
  static const char *const keys[] = {"active.all.current",
                                     "active_bytes.large_pool.peak",
                                     "allocation.small_pool.freed",
                                     "inactive_split_bytes.all.allocated",
                                     "requested_bytes.all.peak",
                                     "reserved_bytes.small_pool.current",
                                     "segment.large_pool.allocated",
                                     "oversize_allocations.peak",
                                     "oversize_segments.freed",
                                     "num_alloc_retries",
                                     "num_ooms",
                                     "num_sync_all_streams",
                                     "num_device_alloc",
                                     "num_device_free",
                                     "max_split_size"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; ++i) {
    int64_t v;
    is_int(gmr_stat_get(rt, keys[i], &v), 0, "key %s", keys[i]);
  }
  gmr_runtime_free(rt);
}

/* reportProcessMemoryInfo's words (the spec, 2.9 step 4): every process on
 * the device, this one as "Including non-PyTorch memory, this process". */
static void test_proc_info(void) {
  gmr_proc_usage_t p[3] = {{41, 6580ull << 20}, {7, 512}, {99, 3ull << 30}};
  char buf[512];
  is_str(gmr__cache_proc_info(p, 3, 7, buf, sizeof buf),
         "Process 41 has 6.43 GiB memory in use. Including non-PyTorch memory, this process has "
         "512 bytes memory in use. Process 99 has 3.00 GiB memory in use. ",
         "OOM: the device's processes in PyTorch's words");
  is_str(gmr__cache_proc_info(p, 0, 7, buf, sizeof buf), "", "OOM: no process known, nothing said");
  is_str(gmr__cache_proc_info(p, 3, 7, buf, 60), "Process 41 has 6.43 GiB memory in use. ",
         "OOM: whole sentences only when the buffer is short");
  gmr_runtime_t *rt = make_rt("policy: caching\n", 1 << 30);
  void *a = NULL;
  is_int(gmr_alloc(rt, 2ull << 30, NULL, &a), GMR_ENOMEM, "OOM on the simulator");
  like(gmr_last_error(rt), "is free. Of the allocated memory",
       "  which knows no processes: nothing between the free bytes and the allocated ones");
  gmr_runtime_free(rt);
}

int main(void) {
  test_one_byte();
  test_segments();
  test_best_fit();
  test_record_stream();
  test_empty_cache();
  test_oom();
  test_fraction();
  test_max_split();
  test_divisions();
  test_expandable();
  test_option_errors();
  test_keys();
  test_gc();
  test_proc_info();
  test_large_segment();
  test_host_oom_sweep();
  test_destroy_live();
  return done_testing();
}
