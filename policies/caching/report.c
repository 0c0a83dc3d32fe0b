/* report.c: the caching policy's statistics: memory_stats() and memory_summary().
 *
 * The gmr_stats_t figures, peak and accumulated resets, the 122 keys of
 * torch.cuda.memory_stats() (c10's DeviceStats: [all, small_pool,
 * large_pool] x {current, peak, allocated, freed} and the event counters,
 * sorted as Python sorts them), and memory_summary() byte for byte.  They
 * run quiesced (policy.h, rule 5: every lock held, the fast paths' deltas
 * folded in, the deferred frees applied: caching.c), so for every record
 *   current = allocated - freed,  peak >= current,
 *   stat[all] = stat[small_pool] + stat[large_pool].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caching/internal.h"

/* The largest free block of a pool: the last of its last bin. */
static cache_block_t *pool_last(const cache_pool_t *p) {
  int k = cache_bin_prev(p, CACHE_BINS - 1);
  return k < 0 ? NULL : treap_last(p->bins[k]);
}

/* ---- statistics ------------------------------------------------------------------------ */

static uint64_t cache_largest_free(const cache_t *c) {
  uint64_t best = 0;
  for (size_t i = 0; i < c->n_streams; ++i)
    for (int k = 0; k < 2; ++k) {
      const cache_block_t *b = pool_last(&c->streams[i]->pools[k]);
      if (b && b->size > best) best = b->size;
    }
  return best;
}

void gmr__cache_stats(gmr_policy_t *self, gmr_stats_t *out) {
  cache_t *c = (cache_t *)self;
  const cache_stats_t *st = &c->st;
  out->reserved_bytes = (uint64_t)st->reserved_bytes[CS_ALL].current;
  out->peak_reserved_bytes = (uint64_t)st->reserved_bytes[CS_ALL].peak;
  out->allocated_bytes = (uint64_t)st->allocated_bytes[CS_ALL].current;
  out->peak_allocated_bytes = (uint64_t)st->allocated_bytes[CS_ALL].peak;
  out->requested_bytes = (uint64_t)st->requested_bytes[CS_ALL].current;
  out->peak_requested_bytes = (uint64_t)st->requested_bytes[CS_ALL].peak;
  out->active_bytes = (uint64_t)st->active_bytes[CS_ALL].current;
  out->peak_active_bytes = (uint64_t)st->active_bytes[CS_ALL].peak;
  out->segments = (uint64_t)st->segment[CS_ALL].current;
  out->peak_segments = (uint64_t)st->segment[CS_ALL].peak;
  out->allocations = (uint64_t)st->allocation[CS_ALL].current;
  out->peak_allocations = (uint64_t)st->allocation[CS_ALL].peak;
  out->num_allocs = (uint64_t)st->allocation[CS_ALL].allocated;
  out->num_frees = (uint64_t)st->allocation[CS_ALL].freed;
  out->device_allocs = (uint64_t)st->num_device_alloc;
  out->device_frees = (uint64_t)st->num_device_free;
  out->ooms = (uint64_t)st->num_ooms;
  out->alloc_retries = (uint64_t)st->num_alloc_retries;
  out->largest_free_block = cache_largest_free(c);
  out->limit_bytes = c->fraction_set ? c->allowed_max : 0;
}

#define CACHE_ARRAYS(X)                                                                            \
  X(allocation)                                                                                    \
  X(segment)                                                                                       \
  X(active)                                                                                        \
  X(inactive_split)                                                                                \
  X(allocated_bytes) X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)

void gmr__cache_reset_peak(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  for (int t = 0; t < 3; ++t) {
#define RESET(name) gmr__stat_reset_peak(&c->st.name[t]);
    CACHE_ARRAYS(RESET)
#undef RESET
  }
  gmr__stat_reset_peak(&c->st.oversize_allocations);
  gmr__stat_reset_peak(&c->st.oversize_segments);
}

void gmr__cache_reset_accumulated(gmr_policy_t *self) {
  cache_t *c = (cache_t *)self;
  for (int t = 0; t < 3; ++t) {
#define RESET(name) gmr__stat_reset_accumulated(&c->st.name[t]);
    CACHE_ARRAYS(RESET)
#undef RESET
  }
  gmr__stat_reset_accumulated(&c->st.oversize_allocations);
  gmr__stat_reset_accumulated(&c->st.oversize_segments);
  c->st.num_alloc_retries = c->st.num_ooms = c->st.num_sync_all_streams = 0;
  c->st.num_device_alloc = c->st.num_device_free = 0;
}

static int cache_kv_cmp(const void *a, const void *b) {
  return strcmp(((const cache_kv_t *)a)->key, ((const cache_kv_t *)b)->key);
}

static size_t cache_put_stat(cache_kv_t *kv, size_t n, const char *prefix, const gmr_stat_t *s) {
  static const char *const metric[] = {"current", "peak", "allocated", "freed"};
  const int64_t v[] = {s->current, s->peak, s->allocated, s->freed};
  for (int m = 0; m < 4; ++m) {
    snprintf(kv[n].key, sizeof kv[n].key, "%s.%s", prefix, metric[m]);
    kv[n++].value = v[m];
  }
  return n;
}

static size_t cache_all_stats(const cache_t *c, cache_kv_t *kv) {
  static const char *const pool[] = {"all", "small_pool", "large_pool"};
  size_t n = 0;
  char prefix[40];
  for (int t = 0; t < 3; ++t) {
#define PUT(name)                                                                                  \
  snprintf(prefix, sizeof prefix, "%s.%s", #name, pool[t]);                                        \
  n = cache_put_stat(kv, n, prefix, &c->st.name[t]);
    CACHE_ARRAYS(PUT)
#undef PUT
  }
  n = cache_put_stat(kv, n, "oversize_allocations", &c->st.oversize_allocations);
  n = cache_put_stat(kv, n, "oversize_segments", &c->st.oversize_segments);
  const struct {
    const char *k;
    int64_t v;
  } scalars[] = {
      {"num_alloc_retries", c->st.num_alloc_retries},
      {"num_ooms", c->st.num_ooms},
      {"num_sync_all_streams", c->st.num_sync_all_streams},
      {"num_device_alloc", c->st.num_device_alloc},
      {"num_device_free", c->st.num_device_free},
      {"max_split_size", c->st.max_split_size},
  };
  for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; ++i) {
    snprintf(kv[n].key, sizeof kv[n].key, "%s", scalars[i].k);
    kv[n++].value = scalars[i].v;
  }
  qsort(kv, n, sizeof *kv, cache_kv_cmp);
  return n;
}

/* ---- memory_summary() ----------------------------------------------------------------- */

static void cache_fmt_size(char *buf, size_t len, int64_t sz, double pref) {
  static const char *const prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int k = 0;
  for (int i = 1; i < 6; ++i) {
    if (pref < 768.0 * 1024.0) break;
    k = i;
    sz /= 1024;
    pref /= 1024.0;
  }
  snprintf(buf, len, "%6lld %s", (long long)sz, prefixes[k]);
}

static void cache_fmt_count(char *buf, size_t len, int64_t cnt, double pref) {
  static const char *const prefixes[] = {" ", "K", "M"};
  int k = 0;
  for (int i = 1; i < 3; ++i) {
    if (pref < 750.0 * 1000.0) break;
    k = i;
    cnt /= 1000;
    pref /= 1000.0;
  }
  snprintf(buf, len, "%7lld %s ", (long long)cnt, prefixes[k]);
}

typedef void (*cache_fmt_fn)(char *, size_t, int64_t, double);

static void cache_summary_row(FILE *out, const char *name, const gmr_stat_t *s,
                              const gmr_stat_t *pref, cache_fmt_fn fmt) {
  char f[4][32];
  fmt(f[0], sizeof f[0], s->current, (double)pref->current);
  fmt(f[1], sizeof f[1], s->peak, (double)pref->peak);
  fmt(f[2], sizeof f[2], s->allocated, (double)pref->allocated);
  fmt(f[3], sizeof f[3], s->freed, (double)pref->freed);
  fprintf(out, "| %-21s | %s | %s | %s | %s |\n", name, f[0], f[1], f[2], f[3]);
}

/* memory_summary() of `st`, a snapshot of c->st. */
static int cache_summary_write(const cache_t *c, const cache_stats_t *st, FILE *out) {
  static const char eq[] = "|==========================================================="
                           "================|\n";
  static const char dash[] = "|-----------------------------------------------------------"
                             "----------------|\n";
  fputs(eq, out);
  fprintf(out, "| %16s PyTorch CUDA memory summary, device ID %-17d |\n", "",
          c->base.backend->device);
  fputs(dash, out);
  fprintf(out, "|  %9s CUDA OOMs: %-12lld | %6s cudaMalloc retries: %-8lld  |\n", "",
          (long long)st->num_ooms, "", (long long)st->num_alloc_retries);
  fputs(eq, out);
  fputs("|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n", out);
  const struct {
    const gmr_stat_t *a;
    const char *name;
    cache_fmt_fn fmt;
  } metrics[] = {
      {st->allocated_bytes, "Allocated memory", cache_fmt_size},
      {st->active_bytes, "Active memory", cache_fmt_size},
      {st->requested_bytes, "Requested memory", cache_fmt_size},
      {st->reserved_bytes, "GPU reserved memory", cache_fmt_size},
      {st->inactive_split_bytes, "Non-releasable memory", cache_fmt_size},
      {st->allocation, "Allocations", cache_fmt_count},
      {st->active, "Active allocs", cache_fmt_count},
      {st->segment, "GPU reserved segments", cache_fmt_count},
      {st->inactive_split, "Non-releasable allocs", cache_fmt_count},
  };
  for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; ++i) {
    fputs(dash, out);
    cache_summary_row(out, metrics[i].name, &metrics[i].a[CS_ALL], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
    cache_summary_row(out, "      from large pool", &metrics[i].a[CS_LARGE], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
    cache_summary_row(out, "      from small pool", &metrics[i].a[CS_SMALL], &metrics[i].a[CS_ALL],
                      metrics[i].fmt);
  }
  fputs(dash, out);
  cache_summary_row(out, "Oversize allocations", &st->oversize_allocations,
                    &st->oversize_allocations, cache_fmt_count);
  fputs(dash, out);
  cache_summary_row(out, "Oversize GPU segments", &st->oversize_segments, &st->oversize_segments,
                    cache_fmt_count);
  fputs(eq, out);
  return ferror(out) ? GMR_EIO : 0;
}

int gmr__cache_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  cache_t *c = (cache_t *)self;
  cache_kv_t kv[CACHE_N_KEYS];
  size_t n = cache_all_stats(c, kv);
  for (size_t i = 0; i < n; ++i)
    if (cb(kv[i].key, kv[i].value, ud) != 0) break;
  return 0;
}

int gmr__cache_summary(gmr_policy_t *self, FILE *out) {
  cache_t *c = (cache_t *)self;
  cache_stats_t snap = c->st;
  return cache_summary_write(c, &snap, out);
}

/* ---- the OOM message ----------------------------------------------------------------- */

/* c10's format_size, for the OOM message. */
static void cache_format_size(uint64_t size, char *buf, size_t len) {
  if (size <= 1024)
    snprintf(buf, len, "%llu bytes", (unsigned long long)size);
  else if (size <= 1048576)
    snprintf(buf, len, "%.2f KiB", (double)size / 1024.0);
  else if (size <= 1073741824ull)
    snprintf(buf, len, "%.2f MiB", (double)size / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", (double)size / 1073741824.0);
}

/* reportProcessMemoryInfo's sentence, from the device's processes: "Process
 * <pid> has <size> memory in use. " each, or, for this process, "Including
 * non-PyTorch memory, this process has ..."; "" for none.  Returns buf. */
const char *gmr__cache_proc_info(const gmr_proc_usage_t *p, size_t n, unsigned self, char *buf,
                                 size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && at < len; ++i) {
    char used[40], who[64];
    cache_format_size(p[i].bytes, used, sizeof used);
    if (p[i].pid == self)
      snprintf(who, sizeof who, "Including non-PyTorch memory, this process");
    else
      snprintf(who, sizeof who, "Process %u", p[i].pid);
    int k = snprintf(buf + at, len - at, "%s has %s memory in use. ", who, used);
    if (k < 0 || (size_t)k >= len - at) { /* no room: the whole sentences only */
      buf[at] = '\0';
      break;
    }
    at += (size_t)k;
  }
  return buf;
}

/* The OOM error, in PyTorch's words (CUDACachingAllocator.cpp, malloc).
 * Its free figure is what the policy's backend says is free: the device's,
 * under a `limit` or the shared cap what they leave; under a memory
 * fraction, cudaMemGetInfo's, the device's own (the innermost backend's),
 * as PyTorch's, the fraction being named apart ("X allowed; "). */
int gmr__cache_oom(cache_t *c, size_t alloc_size) {
  size_t dev_free = 0, dev_total = 0;
  gmr_backend_t *dev = c->base.backend, *be = dev;
  while (dev->forwards_to != NULL)
    dev = dev->forwards_to;
  gmr__backend_mem_info(c->fraction_set ? dev : be, &dev_free, &dev_total);
  gmr_proc_usage_t procs[32];
  size_t nprocs = 0;
  char proc_info[32 * 96];
  if (gmr__backend_proc_usage(dev, procs, 32, &nprocs) != 0) nprocs = 0;
  gmr__cache_proc_info(procs, nprocs, (unsigned)getpid(), proc_info, sizeof proc_info);
  ++c->st.num_ooms;
  char want[40], total[40], fr[40], cap[40], allowed[64] = "", alloc[40], unalloc[40];
  cache_format_size(alloc_size, want, sizeof want);
  cache_format_size(dev_total, total, sizeof total);
  cache_format_size(dev_free, fr, sizeof fr);
  if (c->fraction_set) {
    cache_format_size(c->allowed_max, cap, sizeof cap);
    snprintf(allowed, sizeof allowed, "%s allowed; ", cap);
  }
  cache_sync_all(&c->st); /* the aggregates, as of now */
  int64_t allocated = c->st.allocated_bytes[CS_ALL].current;
  int64_t reserved = c->st.reserved_bytes[CS_ALL].current;
  cache_format_size((uint64_t)allocated, alloc, sizeof alloc);
  cache_format_size((uint64_t)(reserved - allocated), unalloc, sizeof unalloc);
  return gmr__error_set(
      GMR_ENOMEM,
      "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s "
      "is free. %s%sOf the allocated memory %s is allocated by PyTorch, and %s is reserved by "
      "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
      "documentation for Memory Management  "
      "(https://docs.pytorch.org/docs/stable/notes/"
      "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
      want, c->base.backend->device, total, fr, proc_info, allowed, alloc, unalloc);
}
