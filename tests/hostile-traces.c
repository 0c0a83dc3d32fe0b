/* hostile-traces.c: regression tests for traces and snapshots made to cost
 * more than their size (issue 32, point 4), each with its generator:
 *   memo     a pickle that repeats one entry, one frame and one key by 2-byte
 *            memo references: the walk must stay linear (steps) and the
 *            text of its trace must not be held whole (bytes);
 *   addrs    a pickle whose live addresses collided under the old fixed hash;
 *   segments a --reconstruct pickle whose segments share one list of blocks;
 *   sites    call-site texts that collide under FNV-1a, the old unkeyed hash.
 * The figures are counts, not times: the reader's own counters
 * (gmr__snapshot_last_cost, gmr__sites_probes), bounded by a multiple of the
 * input that a linear reader meets many times over.
 *   hostile-traces --write DIR   writes the inputs, to time the tools on them
 * (sizes from GMR_HOSTILE_N, default 16384).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "gmr_replay.h"
#include "replay/replay-formats.h"
#include "tap.h"

/* ---- writing pickles ---------------------------------------------------------- */

typedef struct pb_s {
  unsigned char *p;
  size_t n, cap;
} pb_t;

static void pb_bytes(pb_t *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 4096;
    b->p = realloc(b->p, b->cap);
    if (b->p == NULL) {
      printf("Bail out! out of memory\n");
      exit(1);
    }
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void pb_op(pb_t *b, unsigned char op) {
  pb_bytes(b, &op, 1);
}

static void pb_str(pb_t *b, const char *s) {
  size_t n = strlen(s);
  unsigned char h[5] = {'X', (unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                        (unsigned char)(n >> 24)};
  pb_bytes(b, h, 5);
  pb_bytes(b, s, n);
}

static void pb_int(pb_t *b, uint64_t v) { /* LONG1 of 8 bytes */
  unsigned char h[10] = {0x8a, 8};
  for (int i = 0; i < 8; ++i)
    h[2 + i] = (unsigned char)(v >> (8 * i));
  if (v >> 63) { /* keep it positive: a ninth byte of 0 */
    h[1] = 9;
    pb_bytes(b, h, 10);
    pb_op(b, 0);
    return;
  }
  pb_bytes(b, h, 10);
}

static void pb_put(pb_t *b, unsigned char idx) {
  unsigned char h[2] = {'q', idx};
  pb_bytes(b, h, 2);
}

static void pb_get(pb_t *b, unsigned char idx) {
  unsigned char h[2] = {'h', idx};
  pb_bytes(b, h, 2);
}

/* The start of {"device_traces": [[ ... and its end. */
static void pb_begin(pb_t *b) {
  pb_bytes(b, "\x80\x04}(", 4);
  pb_str(b, "device_traces");
  pb_bytes(b, "](](", 4);
}

static void pb_end(pb_t *b) {
  pb_bytes(b, "eeu.", 4); /* the history, device_traces, the root */
}

/* memo: one entry, repeated m times, whose dict holds k junk keys before its
 * own and whose frames are one frame (in torch, so every one is looked at)
 * repeated f times; its call site is as long as a site gets. */
static void gen_memo(pb_t *b, size_t k, size_t f, size_t m) {
  pb_begin(b);
  pb_bytes(b, "}(", 2); /* the entry */
  pb_str(b, "junk");
  pb_put(b, 1);
  pb_op(b, 'N');
  pb_put(b, 2);
  for (size_t i = 1; i < k; ++i)
    pb_get(b, 1), pb_get(b, 2);
  pb_str(b, "action");
  pb_str(b, "alloc");
  pb_str(b, "addr");
  pb_int(b, 1ull << 40);
  pb_str(b, "size");
  pb_int(b, 4096);
  pb_str(b, "frames");
  pb_bytes(b, "](}(", 4); /* the frames, the frame */
  char file[256] = "/site-packages/torch/";
  memset(file + strlen(file), 'f', 200);
  pb_str(b, "filename");
  pb_str(b, file);
  pb_str(b, "line");
  pb_int(b, 7);
  pb_str(b, "name");
  char name[121];
  memset(name, 'n', 120);
  name[120] = '\0';
  pb_str(b, name);
  pb_op(b, 'u');
  pb_put(b, 0);
  for (size_t i = 1; i < f; ++i)
    pb_get(b, 0);
  pb_bytes(b, "eu", 2); /* the frames, the entry */
  pb_put(b, 3);
  for (size_t i = 1; i < m; ++i)
    pb_get(b, 3);
  pb_end(b);
}

/* addrs: n allocations at j << 41, which the old hash put in one slot, on n
 * streams, then their frees. */
static void gen_addrs(pb_t *b, size_t n) {
  static const char *const keys[] = {"action", "alloc", "addr", "size", "stream", "free_completed"};
  bool made[6] = {false};
#define KEY(i)                                                                                     \
  (made[i] ? pb_get(b, 10 + (i)) : (pb_str(b, keys[i]), pb_put(b, 10 + (i))), made[i] = true)
  pb_begin(b);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t j = 1; j <= n; ++j) {
      pb_bytes(b, "}(", 2);
      KEY(0), KEY(pass == 0 ? 1 : 5);
      KEY(2), pb_int(b, (uint64_t)j << 41);
      KEY(3), pb_int(b, 4096);
      KEY(4), pb_int(b, j);
      pb_op(b, 'u');
    }
#undef KEY
  pb_end(b);
}

/* segments: s segments of device 0 (the first at `base`), each holding the
 * same list of c allocated blocks of `size` bytes without an address of
 * their own, and a history that frees nothing it allocated. */
static void gen_segments(pb_t *b, size_t s, size_t c, uint64_t base, uint64_t size) {
  pb_bytes(b, "\x80\x04}(", 4);
  pb_str(b, "segments");
  pb_bytes(b, "](", 2);
  for (size_t i = 0; i < s; ++i) {
    pb_bytes(b, "}(", 2);
    if (i == 0) {
      pb_str(b, "device"), pb_put(b, 1), pb_int(b, 0), pb_put(b, 2);
      pb_str(b, "address"), pb_put(b, 3);
    } else {
      pb_get(b, 1), pb_get(b, 2), pb_get(b, 3);
    }
    pb_int(b, base + ((uint64_t)i << 40));
    if (i == 0) {
      pb_str(b, "blocks"), pb_put(b, 4);
      pb_bytes(b, "](}(", 4);
      pb_str(b, "size"), pb_int(b, size);
      pb_str(b, "state"), pb_str(b, "active_allocated");
      pb_op(b, 'u');
      pb_put(b, 5);
      for (size_t j = 1; j < c; ++j)
        pb_get(b, 5);
      pb_op(b, 'e');
      pb_put(b, 6);
    } else {
      pb_get(b, 4), pb_get(b, 6);
    }
    pb_op(b, 'u');
  }
  pb_op(b, 'e');
  pb_str(b, "device_traces");
  pb_bytes(b, "](](}(", 6);
  pb_str(b, "action"), pb_str(b, "alloc");
  pb_str(b, "addr"), pb_int(b, 1ull << 50);
  pb_str(b, "size"), pb_int(b, 512);
  pb_op(b, 'u');
  pb_end(b);
}

/* ---- call sites that collide under FNV-1a ---------------------------------------- */

/* FNV-1a's low bits depend only on the low bits of what came before, so a
 * choice between two blocks that reach the same low 24 bits from the same
 * state, made at each of `blocks` positions, gives 2^blocks texts that all
 * start their probe at one slot of any table up to 2^24 slots. */
enum { FNV_BITS = 24 };

static uint32_t fnv_step(uint32_t h, const char *s, size_t n) {
  uint64_t x = h;
  for (size_t i = 0; i < n; ++i)
    x = (x ^ (unsigned char)s[i]) * 1099511628211ull;
  return (uint32_t)(x & ((1u << FNV_BITS) - 1));
}

static char *gen_sites(unsigned blocks, size_t *out_n) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  char pair[32][2][4];
  const char *prefix = "train.py:";
  uint32_t h =
      fnv_step((uint32_t)(1469598103934665603ull & ((1u << FNV_BITS) - 1)), prefix, strlen(prefix));
  uint32_t *seen = malloc(((size_t)1 << FNV_BITS) * sizeof *seen);
  if (seen == NULL || blocks > 32) {
    free(seen);
    return NULL;
  }
  for (unsigned pos = 0; pos < blocks; ++pos) {
    memset(seen, 0, ((size_t)1 << FNV_BITS) * sizeof *seen);
    bool found = false;
    for (uint32_t c = 0; !found && c < 62 * 62 * 62 * 62; ++c) {
      char blk[4] = {alphabet[c % 62], alphabet[c / 62 % 62], alphabet[c / 3844 % 62],
                     alphabet[c / 238328 % 62]};
      uint32_t to = fnv_step(h, blk, 4);
      if (seen[to] != 0) {
        uint32_t o = seen[to] - 1;
        char other[4] = {alphabet[o % 62], alphabet[o / 62 % 62], alphabet[o / 3844 % 62],
                         alphabet[o / 238328 % 62]};
        memcpy(pair[pos][0], other, 4), memcpy(pair[pos][1], blk, 4);
        h = to;
        found = true;
      } else {
        seen[to] = c + 1;
      }
    }
    if (!found) {
      free(seen);
      return NULL;
    }
  }
  free(seen);
  size_t n = (size_t)1 << blocks, len = strlen(prefix) + 4 * blocks + 1;
  char *texts = malloc(n * len);
  for (size_t i = 0; texts && i < n; ++i) {
    char *t = texts + i * len;
    strcpy(t, prefix);
    for (unsigned pos = 0; pos < blocks; ++pos)
      memcpy(t + strlen(prefix) + 4 * pos, pair[pos][(i >> pos) & 1], 4);
    t[len - 1] = '\0';
  }
  *out_n = n;
  return texts;
}

/* ---- the tests --------------------------------------------------------------------- */

static size_t hostile_n(void) {
  const char *env = getenv("GMR_HOSTILE_N");
  size_t n = env && *env ? strtoull(env, NULL, 10) : 0;
  return n ? n : 16384;
}

/* The reader's figures for one input, by gmr_trace_parse. */
static gmr_trace_data_t *read_pickle(const pb_t *b, const char *what, gmr__snapshot_cost_t *cost) {
  gmr_trace_data_t *t = NULL;
  char err[512] = "";
  int rc = gmr_trace_parse((const char *)b->p, b->n, what, &t, err, sizeof err);
  is_int(rc, 0, "%s: a %zu-byte pickle reads", what, b->n);
  if (rc != 0) diag("%s", err);
  *cost = *gmr__snapshot_last_cost();
  return t;
}

static void test_memo(size_t n) {
  pb_t b = {0};
  gen_memo(&b, n, n, n);
  gmr__snapshot_cost_t c;
  gmr_trace_data_t *t = read_pickle(&b, "memo", &c);
  if (t) {
    is_u64(t->n_ids, n, "  one entry repeated: %zu allocations", n);
    is_u64(t->n_sites, 1, "  of one call site");
  }
  /* Old: each entry looked at every key and every frame: n^2 steps. */
  ok(c.steps <= 8 * b.n,
     "  %llu steps for %zu bytes: <= 8 per byte (the repeats share what "
     "was computed; %zu^2 before)",
     (unsigned long long)c.steps, b.n, n);
  gmr_snapshot_csv_options_t o = {.sites = 1, .reconstruct = 1};
  gmr_snapshot_csv_t *s = NULL;
  char err[512];
  is_int(gmr_snapshot_csv(b.p, b.n, "memo", &o, &s, err, sizeof err), 0,
         "  gmr_snapshot_csv with sites and --reconstruct converts it");
  c = *gmr__snapshot_last_cost();
  ok(c.steps <= 8 * b.n, "  in %llu steps (<= 8 per byte)", (unsigned long long)c.steps);
  gmr_snapshot_csv_free(s);
  gmr_trace_data_free(t);
  free(b.p);

  /* Memory: one entry m times costs 2 bytes each, and a row of ~400
   * bytes each in the text; the text must not be held whole. */
  size_t m = n * 16;
  b = (pb_t){0};
  gen_memo(&b, 1, 1, m);
  t = read_pickle(&b, "memo-rows", &c);
  if (t)
    is_u64(t->n_events, 2 * m - 1, "  %zu repeats: %zu events (a free supplied before each)", m,
           2 * m - 1);
  uint64_t trace_bytes = t ? t->n_events * sizeof *t->events : 0;
  ok(c.bytes <= 32 * b.n + (1u << 20),
     "  the reader took %llu bytes for %zu: <= 32 per byte + 1 MiB (the rows were %zu bytes)",
     (unsigned long long)c.bytes, b.n, m * 400);
  ok(c.bytes + trace_bytes <= 96 * b.n + (1u << 20),
     "  with the trace's %llu: <= 96 per byte + 1 MiB", (unsigned long long)trace_bytes);
  gmr_trace_data_free(t);
  free(b.p);
}

static void test_addrs(size_t n) {
  pb_t b = {0};
  gen_addrs(&b, n);
  gmr__snapshot_cost_t c;
  gmr_trace_data_t *t = read_pickle(&b, "addrs", &c);
  if (t) {
    is_u64(t->n_ids, n, "  %zu allocations at addresses j << 41", n);
    is_u64(t->n_live_at_end, 0, "  all freed");
    is_u64(t->peak_requested, (uint64_t)n * 4096, "  peak requested");
  }
  /* Old: the fixed hash put every address in one slot: n^2 / 2 probes. */
  ok(c.steps <= 16 * b.n, "  %llu steps for %zu bytes: <= 16 per byte (%zu^2 / 2 probes before)",
     (unsigned long long)c.steps, b.n, n);
  gmr_snapshot_csv_t *s = NULL;
  char err[512];
  is_int(gmr_snapshot_csv(b.p, b.n, "addrs", NULL, &s, err, sizeof err), 0,
         "  gmr_snapshot_csv converts it");
  c = *gmr__snapshot_last_cost();
  ok(c.steps <= 16 * b.n, "  in %llu steps, %zu streams numbered (<= 16 per byte)",
     (unsigned long long)c.steps, n);
  gmr_snapshot_csv_free(s);
  gmr_trace_data_free(t);
  free(b.p);
}

static void test_segments(size_t n) {
  pb_t b = {0};
  gen_segments(&b, n, n, 1ull << 40, 4096);
  gmr_snapshot_csv_options_t o = {.reconstruct = 1};
  gmr_snapshot_csv_t *s = NULL;
  char err[512];
  is_int(gmr_snapshot_csv(b.p, b.n, "segments", &o, &s, err, sizeof err), 0,
         "segments: %zu segments sharing one list of %zu blocks convert with --reconstruct", n, n);
  gmr__snapshot_cost_t c = *gmr__snapshot_last_cost();
  if (s) is_u64(s->reconstructed, n, "  the list is read once: %zu blocks put at the start", n);
  ok(c.steps <= 16 * b.n && c.bytes <= 64 * b.n + (1u << 20),
     "  in %llu steps and %llu bytes for %zu bytes (<= 16 and 64 per byte; %zu^2 blocks before)",
     (unsigned long long)c.steps, (unsigned long long)c.bytes, b.n, n);
  gmr_snapshot_csv_free(s);

  /* Found by fuzz-pickle: blocks whose sizes carry the next block's address
   * past 2^63 (signed overflow, caught by UBSan); it wraps instead. */
  b.n = 0;
  gen_segments(&b, 1, 3, 1ull << 62, 0x7000000000000000ull);
  s = NULL;
  is_int(gmr_snapshot_csv(b.p, b.n, "wrap", &o, &s, err, sizeof err), 0,
         "segments: blocks of 2^62.8 bytes from address 2^62 convert with --reconstruct");
  if (s) is_u64(s->reconstructed, 3, "  their addresses wrap: 3 blocks put at the start");
  gmr_snapshot_csv_free(s);
  free(b.p);
}

static void test_sites(unsigned blocks) {
  size_t n = 0;
  char *texts = gen_sites(blocks, &n);
  if (texts == NULL) {
    ok(0, "sites: could not make the colliding texts");
    return;
  }
  size_t len = strlen(texts) + 1;
  gmr__sites_t *s = gmr__sites_new();
  bool dense = s != NULL;
  for (size_t i = 0; dense && i < n; ++i)
    dense = gmr__sites_intern(s, texts + i * len) == i + 1;
  for (size_t i = 0; dense && i < n; ++i) /* and found again */
    dense = gmr__sites_intern(s, texts + i * len) == i + 1;
  ok(dense, "sites: %zu texts that collide under FNV-1a get the indexes 1..%zu, twice", n, n);
  uint64_t probes = s ? gmr__sites_probes(s) : 0;
  /* Old: every text probed past all those before it: n^2 / 2 each way. */
  ok(probes <= 8 * 2 * (uint64_t)n,
     "  %llu slots looked at for %zu lookups: <= 8 each (the slots are keyed; %zu^2 / 2 "
     "before)",
     (unsigned long long)probes, 2 * n, n);
  gmr__sites_finish(s, NULL);

  /* Through the reader: the trace keeps each site once. */
  size_t cap = n * (len + 48), off = 0;
  char *csv = malloc(cap);
  for (size_t i = 0; csv && i < n; ++i)
    off += (size_t)snprintf(csv + off, cap - off, "0,%zu,allocate,%#zx,64,0,%s\n", i, (i + 1) << 12,
                            texts + i * len);
  gmr_trace_data_t *t = NULL;
  char err[512] = "";
  int rc = csv ? gmr_trace_parse(csv, off, "sites.csv", &t, err, sizeof err) : GMR_ENOMEM;
  is_int(rc, 0, "  a CSV of them reads");
  if (t) is_u64(t->n_sites, n, "  with %zu distinct call sites", n);
  gmr_trace_data_free(t);
  free(csv);
  free(texts);
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "hostile-traces: cannot write %s\n", path);
    return 1;
  }
  printf("%s: %zu bytes\n", path, n);
  return 0;
}

/* The inputs as files, for timing the tools on them. */
static int write_inputs(const char *dir, size_t n) {
  pb_t b = {0};
  int bad = 0;
  gen_memo(&b, n, n, n);
  bad |= write_file(dir, "memo.pickle", b.p, b.n);
  b.n = 0;
  gen_memo(&b, 1, 1, 16 * n);
  bad |= write_file(dir, "memo-rows.pickle", b.p, b.n);
  b.n = 0;
  gen_addrs(&b, n);
  bad |= write_file(dir, "addrs.pickle", b.p, b.n);
  b.n = 0;
  gen_segments(&b, n, n, 1ull << 40, 4096);
  bad |= write_file(dir, "segments.pickle", b.p, b.n);
  b.n = 0;
  gen_segments(&b, 1, 3, 1ull << 62, 0x7000000000000000ull);
  bad |= write_file(dir, "wrap.pickle", b.p, b.n);
  free(b.p);
  unsigned blocks = 0;
  while (((size_t)2 << blocks) <= n * 8 && blocks < 20)
    ++blocks;
  size_t m = 0;
  char *texts = gen_sites(blocks, &m);
  if (texts == NULL) return 1;
  size_t len = strlen(texts) + 1, cap = m * (len + 48), off = 0;
  char *csv = malloc(cap);
  for (size_t i = 0; csv && i < m; ++i)
    off += (size_t)snprintf(csv + off, cap - off, "0,%zu,allocate,%#zx,64,0,%s\n", i, (i + 1) << 12,
                            texts + i * len);
  bad |= csv == NULL || write_file(dir, "sites.csv", csv, off);
  free(csv);
  free(texts);
  return bad;
}

int main(int argc, char **argv) {
  size_t n = hostile_n();
  if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_inputs(argv[2], n);
  test_memo(n);
  test_addrs(n);
  test_segments(n / 4);
  test_sites(14);
  return done_testing();
}
