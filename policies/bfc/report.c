/* report.c: the bfc policy's reports, in TensorFlow's words.
 *
 * The OOM report that BFCAllocator::AllocateRawInternal logs when a request
 * cannot be met: the banner, DumpMemoryLog (per-bin totals, the chunks of
 * the request's bin, every region's chunks, in-use chunks by size,
 * AllocatorStats::DebugString) and RenderOccupancy (100 characters, '_'
 * free, '*' requested, 'x' waste); gmr_summary's text (the same dump
 * without the request's bin, and the occupancy map); and
 * HumanReadableNumBytes.  Per bin i of the dump:
 *   bytes_in_bin = Σ sizes of chunks c with bfc_bin_for(c.size) = i,
 *   bytes_in_use = the same sum over in-use chunks, requested_in_use <= bytes_in_use.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfc/internal.h"

/* HumanReadableNumBytes of tsl/platform/numbers.cc: "512B", "3.0KiB", "34.10MiB". */
void gmr__bfc_hr(int64_t n, char *buf, size_t len) {
  if (n == INT64_MIN) {
    snprintf(buf, len, "-8E");
    return;
  }
  const char *neg = n < 0 ? "-" : "";
  if (n < 0) n = -n;
  if (n < 1024) {
    snprintf(buf, len, "%s%lldB", neg, (long long)n);
    return;
  }
  static const char units[] = "KMGTPE";
  int u = 0;
  while (n >= (int64_t)1024 * 1024) {
    n /= 1024;
    ++u;
  }
  snprintf(buf, len, u == 0 ? "%s%.1f%ciB" : "%s%.2f%ciB", neg, (double)n / 1024.0, units[u]);
}

/* ---- the OOM report (AllocateRawInternal's banner, DumpMemoryLog, RenderOccupancy) -- */

typedef struct bfc_bin_info_s {
  uint64_t bytes_in_bin, bytes_in_use, requested_in_use;
  uint64_t chunks_in_bin, chunks_in_use;
} bfc_bin_info_t;

static void bfc_bin_infos(const bfc_t *b, bfc_bin_info_t info[BFC_NUM_BINS]) {
  memset(info, 0, sizeof(bfc_bin_info_t) * BFC_NUM_BINS);
  for (size_t i = 0; i < b->n_regions; ++i)
    for (const bfc_chunk_t *c = bfc_first(b->regions[i]); c != bfc_end(b->regions[i]);
         c = c->next) {
      bfc_bin_info_t *bi = &info[bfc_bin_for(c->size)];
      bi->bytes_in_bin += c->size;
      ++bi->chunks_in_bin;
      if (c->in_use) {
        bi->bytes_in_use += c->size;
        bi->requested_in_use += c->requested;
        ++bi->chunks_in_use;
      }
    }
}

static void bfc_chunk_debug(gmr_strbuf_t *sb, const bfc_chunk_t *c, bool recurse) {
  char s[32], r[32];
  gmr__bfc_hr((int64_t)c->size, s, sizeof s);
  gmr__bfc_hr((int64_t)c->requested, r, sizeof r);
  gmr__sb_printf(sb, "  Size: %s | Requested Size: %s | in_use: %d | bin_num: %d", s, r, c->in_use,
                 c->bin);
  if (recurse && bfc_is_chunk(c->prev)) {
    gmr__sb_puts(sb, ", prev: ");
    bfc_chunk_debug(sb, c->prev, false);
  }
  if (recurse && bfc_is_chunk(c->next)) {
    gmr__sb_puts(sb, ", next: ");
    bfc_chunk_debug(sb, c->next, false);
  }
}

static void bfc_inorder_debug(gmr_strbuf_t *sb, const bfc_chunk_t *n) {
  if (n == NULL) return;
  bfc_inorder_debug(sb, n->left);
  bfc_chunk_debug(sb, n, true);
  gmr__sb_puts(sb, "\n");
  bfc_inorder_debug(sb, n->right);
}

static int bfc_cmp_size(const void *x, const void *y) {
  size_t a = *(const size_t *)x, c = *(const size_t *)y;
  return a < c ? -1 : a > c;
}

static void bfc_render_range(char *out, uint64_t total, uint64_t offset, uint64_t size, char ch) {
  uint64_t start = offset * 100 / total, end = (offset + size - 1) * 100 / total;
  for (uint64_t i = start; i <= end && i < 100; ++i)
    out[i] = ch;
}

/* RenderOccupancy: 100 characters, '_' free, '*' requested, 'x' waste. */
static void bfc_render(const bfc_t *b, gmr_strbuf_t *sb) {
  uint64_t total = 0;
  for (size_t i = 0; i < b->n_regions; ++i)
    total += b->regions[i]->size;
  if (total == 0) {
    gmr__sb_puts(sb, "<allocator contains no memory>");
    return;
  }
  char map[101];
  memset(map, '_', 100);
  map[100] = '\0';
  uint64_t offset = 0;
  for (size_t i = 0; i < b->n_regions; ++i) {
    const bfc_region_t *r = b->regions[i];
    for (const bfc_chunk_t *c = bfc_first(r); c != bfc_end(r); c = c->next) {
      if (!c->in_use) continue;
      uint64_t at = offset + (c->ptr - r->ptr);
      if (c->size > c->requested)
        bfc_render_range(map, total, at + c->requested, c->size - c->requested, 'x');
      if (c->requested > 0) bfc_render_range(map, total, at, c->requested, '*');
    }
    offset += r->size;
  }
  gmr__sb_puts(sb, map);
}

/* DumpMemoryLog(rounded) into `sb`, one LOG line per text line; `rounded`
 * 0 leaves out the "Bin for" section (gmr_summary). */
static void bfc_dump(const bfc_t *b, size_t rounded, gmr_strbuf_t *sb) {
  bfc_bin_info_t info[BFC_NUM_BINS];
  bfc_bin_infos(b, info);
  char h1[32], h2[32], h3[32];
  gmr__sb_printf(sb, "BFCAllocator dump for %s\n", b->name);
  for (int i = 0; i < BFC_NUM_BINS; ++i) {
    gmr__bfc_hr((int64_t)info[i].bytes_in_bin, h1, sizeof h1);
    gmr__bfc_hr((int64_t)info[i].bytes_in_use, h2, sizeof h2);
    gmr__bfc_hr((int64_t)info[i].requested_in_use, h3, sizeof h3);
    gmr__sb_printf(sb,
                   "Bin (%zu): \tTotal Chunks: %llu, Chunks in use: %llu. %s allocated for "
                   "chunks. %s in use in bin. %s client-requested in use in bin.\n",
                   bfc_bin_size(i), (unsigned long long)info[i].chunks_in_bin,
                   (unsigned long long)info[i].chunks_in_use, h1, h2, h3);
  }
  if (rounded > 0) { /* 0: a summary, not a failed request */
    int want = bfc_bin_for(rounded);
    gmr__bfc_hr((int64_t)rounded, h1, sizeof h1);
    gmr__bfc_hr((int64_t)bfc_bin_size(want), h2, sizeof h2);
    gmr__sb_printf(sb, "Bin for %s was %s, Chunk State: \n", h1, h2);
    bfc_inorder_debug(sb, b->bins[want].root);
  }
  size_t n_in_use = (size_t)b->allocations.current, k = 0;
  size_t *sizes = gmr__malloc((n_in_use ? n_in_use : 1) * sizeof *sizes);
  for (size_t i = 0; i < b->n_regions; ++i) {
    gmr__sb_printf(sb, "Next region of size %zu\n", b->regions[i]->size);
    for (const bfc_chunk_t *c = bfc_first(b->regions[i]); c != bfc_end(b->regions[i]);
         c = c->next) {
      bool used = c->in_use;
      if (used && sizes && k < n_in_use) sizes[k++] = c->size;
      gmr__sb_printf(
          sb, "%s at %llx of size %zu next %llu\n", used ? "InUse" : "Free ",
          (unsigned long long)c->ptr, c->size,
          (unsigned long long)(bfc_is_chunk(c->next) ? c->next->handle : BFC_INVALID_HANDLE));
    }
  }
  gmr__sb_puts(sb, "     Summary of in-use Chunks by size: \n");
  uint64_t total = 0;
  if (sizes != NULL) {
    qsort(sizes, k, sizeof *sizes, bfc_cmp_size);
    for (size_t i = 0; i < k;) {
      size_t j = i;
      while (j < k && sizes[j] == sizes[i])
        ++j;
      gmr__bfc_hr((int64_t)(sizes[i] * (j - i)), h1, sizeof h1);
      gmr__sb_printf(sb, "%zu Chunks of size %zu totalling %s\n", j - i, sizes[i], h1);
      total += sizes[i] * (j - i);
      i = j;
    }
    gmr__free(sizes);
  }
  gmr__bfc_hr((int64_t)total, h1, sizeof h1);
  gmr__sb_printf(sb, "Sum Total of in-use chunks: %s\n", h1);
  gmr__sb_printf(sb,
                 "Total bytes in pool: %lld memory_limit_: %llu available bytes: %lld "
                 "curr_region_allocation_bytes_: %zu\n",
                 (long long)b->pool_bytes, (unsigned long long)b->limit,
                 (long long)((int64_t)b->limit - b->pool_bytes), b->curr_region_bytes);
  /* tsl::AllocatorStats::DebugString (raw integers, as tsl prints them). */
  gmr__sb_printf(sb,
                 "Stats: \nLimit:            %20lld\nInUse:            %20lld\n"
                 "MaxInUse:         %20lld\nNumAllocs:        %20lld\n"
                 "MaxAllocSize:     %20lld\nReserved:         %20lld\n"
                 "PeakReserved:     %20lld\nLargestFreeBlock: %20lld\n\n",
                 (long long)b->limit, (long long)b->bytes_in_use, (long long)b->peak_bytes_in_use,
                 (long long)b->num_allocs, (long long)b->largest_alloc_size, 0LL, 0LL,
                 (long long)bfc_largest_free(b));
}

/* The full OOM text: banner, dump, occupancy map.  Sets the thread's error. */
int gmr__bfc_oom(bfc_t *b, size_t num_bytes, size_t rounded) {
  gmr_strbuf_t sb = {0};
  char h[32];
  gmr__bfc_hr((int64_t)num_bytes, h, sizeof h);
  gmr__sb_printf(&sb,
                 "Allocator (%s) ran out of memory trying to allocate %s (rounded to %zu)"
                 "requested by op \n"
                 "If the cause is memory fragmentation maybe the environment variable "
                 "'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation. \n"
                 "Current allocation summary follows.\n"
                 "Current allocation summary follows.\n",
                 b->name, h, rounded);
  bfc_dump(b, rounded, &sb);
  bfc_render(b, &sb);
  int err = sb.failed ? gmr__error_set(GMR_ENOMEM,
                                       "Allocator (%s) ran out of memory trying to allocate %s "
                                       "(rounded to %zu) (the full report did not fit in host "
                                       "memory)",
                                       b->name, h, rounded)
                      : gmr__error_set_text(GMR_ENOMEM, gmr__sb_str(&sb));
  gmr__sb_free(&sb);
  return err;
}

void gmr__bfc_summary_locked(bfc_t *b, gmr_strbuf_t *sb) {
  bfc_dump(b, 0, sb);
  bfc_render(b, sb);
}

/* ---- statistics (quiesced: policy.h, rule 5) ------------------------------------------ */

void gmr__bfc_stats(gmr_policy_t *self, gmr_stats_t *st) {
  bfc_t *b = (bfc_t *)self;
  st->allocated_bytes = (uint64_t)(b->bytes_in_use - b->pending_bytes);
  st->active_bytes = (uint64_t)b->bytes_in_use; /* pending frees included */
  st->peak_allocated_bytes = st->peak_active_bytes = (uint64_t)b->peak_bytes_in_use;
  st->requested_bytes = (uint64_t)b->requested.current;
  st->peak_requested_bytes = (uint64_t)b->requested.peak;
  st->allocations = (uint64_t)b->allocations.current;
  st->peak_allocations = (uint64_t)b->allocations.peak;
  st->num_allocs = (uint64_t)b->num_allocs;
  st->num_frees = b->num_frees;
  st->ooms = b->ooms;
  st->alloc_retries = b->retries;
  st->largest_free_block = bfc_largest_free(b);
  st->limit_bytes = b->limit;
}

/* ClearStats() is reset_peak + reset_accumulated. */
void gmr__bfc_reset_peak(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  b->peak_bytes_in_use = b->bytes_in_use;
  b->largest_alloc_size = 0;
  b->peak_pool_bytes = b->pool_bytes;
  b->requested.peak = b->requested.current;
  b->allocations.peak = b->allocations.current;
}

void gmr__bfc_reset_accumulated(gmr_policy_t *self) {
  bfc_t *b = (bfc_t *)self;
  b->num_allocs = 0;
  b->num_frees = b->ooms = b->retries = 0;
}

enum { BFC_N_KEYS = 16 };
typedef struct bfc_kv_s {
  const char *key;
  int64_t value;
} bfc_kv_t;

int gmr__bfc_stats_foreach(gmr_policy_t *self, gmr_stat_cb cb, void *ud) {
  bfc_t *b = (bfc_t *)self;
  bfc_kv_t kv[BFC_N_KEYS];
  int n = 0;
  int64_t largest = (int64_t)bfc_largest_free(b), free_b = b->pool_bytes - b->bytes_in_use;
#define KV(k, v) kv[n++] = (bfc_kv_t){k, (int64_t)(v)}
  KV("num_allocs", b->num_allocs);
  KV("bytes_in_use", b->bytes_in_use);
  KV("peak_bytes_in_use", b->peak_bytes_in_use);
  KV("largest_alloc_size", b->largest_alloc_size);
  KV("bytes_limit", b->limit);
  KV("bytes_reserved", 0);
  KV("peak_bytes_reserved", 0);
  KV("largest_free_block_bytes", largest);
  KV("pool_bytes", b->pool_bytes);
  KV("peak_pool_bytes", b->peak_pool_bytes);
  /* GetFragmentation() in parts per million; 0 when nothing is free. */
  KV("fragmentation_metric_ppm",
     free_b > 0 ? llround(1e6 * (double)(free_b - largest) / (double)free_b) : 0);
  KV("curr_region_allocation_bytes", b->curr_region_bytes);
  KV("regions", b->n_regions);
  KV("free_chunks", b->free_chunks);
  KV("num_frees", b->num_frees);
  KV("ooms", b->ooms);
#undef KV
  for (int i = 0; i < n; ++i)
    if (cb(kv[i].key, kv[i].value, ud) != 0) break;
  return 0;
}

int gmr__bfc_summary(gmr_policy_t *self, FILE *out) {
  gmr_strbuf_t sb = {0};
  gmr__bfc_summary_locked((bfc_t *)self, &sb);
  fprintf(out, "%s\n", gmr__sb_str(&sb));
  gmr__sb_free(&sb);
  return ferror(out) ? GMR_EIO : 0;
}
