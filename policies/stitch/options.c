/* options.c: the stitch policy's options: the YAML keys with their limits,
 * defaults and help (docs/config.md and --suggest's search space are made
 * from this table), and the cross-field checks after parsing. */
#include <stddef.h>
#include <stdio.h>

#include "stitch/internal.h"

const st_opts_t gmr__st_opts_default = {
    .tau = 64 * 1024,
    .small_size = 1 << 20,
    .max_mappings = 65536,
    .max_maps_per_page = 64,
    .va_budget = 0,
    .va_chunk = 0,
    .cache_candidates = 256,
    .stale_misses = 0,
    .chunk_pages = 0,
    .chunk_min_pages = 512,
    .cross_stream = ST_CROSS_QUERY,
};

int gmr__st_validate(void *opts, char *err, size_t errlen) {
  st_opts_t *o = opts;
  if (o->tau % ST_G != 0) {
    snprintf(err, errlen, "tau must be a multiple of 512 bytes");
    return GMR_ECONFIG;
  }
  if (o->small_size % ST_G != 0) {
    snprintf(err, errlen, "small_size must be a multiple of 512 bytes");
    return GMR_ECONFIG;
  }
  return 0;
}

static const char *const st_cross_choices[] = {"query", "sync", NULL};

const gmr_opt_desc_t gmr__st_opts_desc[] = {
    {.key = "tau",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(st_opts_t, tau),
     .default_text = "64KiB",
     .help = "The largest dead gap a placement may leave between two blocks sharing a page "
             "(a multiple of 512 bytes).",
     .tune = (const char *const[]){"16KiB", "32KiB", "128KiB", "256KiB", NULL}},
    {.key = "small_size",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(st_opts_t, small_size),
     .min = 512,
     .default_text = "1MiB",
     .help = "Requests of at most this many bytes go to the small pool (at most half a page).",
     .tune = (const char *const[]){"256KiB", "512KiB", NULL}},
    {.key = "max_mappings",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, max_mappings),
     .min = 16,
     .default_text = "65536",
     .help = "Cap on page mappings; least recently used cached ranges are unmapped above it."},
    {.key = "max_maps_per_page",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, max_maps_per_page),
     .min = 2,
     .default_text = "64",
     .help = "Cap on the virtual addresses one page is mapped at."},
    {.key = "va_budget",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(st_opts_t, va_budget),
     .default_text = "4 x device memory",
     .help = "Cap on the address space held by mapped ranges; LRU cached ranges are unmapped "
             "above it (0: four times the device's memory)."},
    {.key = "va_chunk",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(st_opts_t, va_chunk),
     .default_text = "2 x device memory",
     .help = "Address space reserved at a time (halved until the device accepts; 0: twice the "
             "device's memory)."},
    {.key = "cache_candidates",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, cache_candidates),
     .min = 1,
     .max = 1024,
     .default_text = "256",
     .help = "Cached ranges of the requested length tried, oldest first, before stitching a "
             "new one.",
     .tune = (const char *const[]){"16", "1024", NULL}},
    {.key = "stale_misses",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, stale_misses),
     .min = 0,
     .default_text = "0",
     .help = "Unmap a cached range once this many misses of its length in a row could not use "
             "it (0: only the mapping caps unmap cached ranges).",
     .tune = (const char *const[]){"4", NULL}},
    {.key = "chunk_pages",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, chunk_pages),
     .min = 0,
     .default_text = "0",
     .help = "Pages one device allocation holds at most: a miss creates its fresh pages in "
             "chunks of this many and maps each run of a chunk's pages in one call; a chunk goes "
             "back only when all its pages are free (0: no cap; 1: a page each, as empty_cache "
             "can give back one by one)."},
    {.key = "chunk_min_pages",
     .type = GMR_OPT_INT,
     .offset = offsetof(st_opts_t, chunk_min_pages),
     .min = 2,
     .default_text = "512",
     .help = "Whole pages a block must span for its fresh pages to be made in chunks; a smaller "
             "block's are made a page a call, which empty_cache gives back page by page (512 "
             "pages of 2 MiB: blocks of 1 GiB and more)."},
    {.key = "cross_stream",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(st_opts_t, cross_stream),
     .choices = st_cross_choices,
     .default_text = "query",
     .help = "Bytes freed on one stream are reused by another once an event shows that "
             "stream's work done: query (never block; use other bytes meanwhile) or sync "
             "(wait on the event)."},
    {.key = NULL},
};
