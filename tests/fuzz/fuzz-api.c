/* fuzz-api.c: libFuzzer harness for sequences of API calls on every policy
 * stack, on the host-backed simulator, with pattern checks.
 *
 * Input: the first byte picks the stack; then each operation is one opcode
 * byte and five argument bytes (slot, size in three bytes, and a byte of
 * scale and stream): allocate (size, stream), free,
 * record_stream, empty_cache, stats, charge and refund, stream work held
 * back or completed, the history turned on or off, a device fault, a walk
 * (whose callback calls the runtime again); gmr_alloc_size after every
 * allocation, gmr_check after every operation.  Every live block carries a tag pattern checked
 * before it is freed and, with every other live block, after every operation that may move memory
 * (empty_cache); a new block must overlap no live block, and a block must lie in device memory the
 * runtime holds (fuzz_covered) when it is handed out and whenever its pattern is checked, so two
 * live blocks that overlap, memory given back while live, or content lost are found. A walk lists
 * segments in address order, each block inside its segment, and every live block as allocated.
 * Promises: every call returns 0 or its documented error; gmr_check holds
 * after every operation; at the end, with everything freed, the stack holds
 * no allocation and the refunds match the charges. */
#include <stdbool.h>

#include "fuzz.h"

#define SLOTS 32

typedef struct slot_s {
  unsigned char *p;
  size_t size;
  uint64_t tag;
  uint64_t token; /* the reservation under the block (fuzz_covered) */
} slot_t;

static gmr_runtime_t *runtimes[FUZZ_N_STACKS];

/* A live block: in device memory the runtime holds, its pattern intact. */
static void check_live(gmr_runtime_t *rt, const slot_t *sl, const char *when) {
  uint64_t token;
  fuzz_assert(fuzz_covered(rt, sl->p, sl->size, &token) && token == sl->token,
              "%s: block %p (%zu bytes) is not in the device memory it was given", when,
              (void *)sl->p, sl->size);
  fuzz_assert(fuzz_verify(sl->p, sl->size, sl->tag), "%s: pattern of a live block broken", when);
}

/* The walk's callback: segments in address order, blocks inside the last
 * segment, live blocks marked seen; the first entry calls the runtime again
 * (gmr_stats), which must neither deadlock nor fail. */
typedef struct walk_s {
  gmr_runtime_t *rt;
  const slot_t *slot;
  bool seen[SLOTS];
  uintptr_t seg_lo, seg_hi, prev_end;
  long entries;
} walk_t;

static int walk_entry(const gmr_walk_entry_t *e, void *ud) {
  walk_t *w = ud;
  if (w->entries++ == 0) {
    gmr_stats_t st;
    fuzz_assert(gmr_stats(w->rt, &st) == 0, "gmr_stats inside a walk: %s", gmr_last_error(w->rt));
  }
  if (e->is_segment) {
    fuzz_assert(e->address >= w->prev_end && e->size > 0 && e->address + e->size > e->address,
                "walk: segment %#lx (%llu bytes) out of order", (unsigned long)e->address,
                (unsigned long long)e->size);
    w->seg_lo = e->address, w->seg_hi = w->prev_end = e->address + e->size;
    return 0;
  }
  fuzz_assert(e->address >= w->seg_lo && e->size <= w->seg_hi - e->address,
              "walk: block %#lx (%llu bytes) outside its segment", (unsigned long)e->address,
              (unsigned long long)e->size);
  if (e->state != GMR_BLOCK_ALLOCATED) return 0;
  for (int k = 0; k < SLOTS; ++k)
    if ((uintptr_t)w->slot[k].p == e->address && e->size >= w->slot[k].size) w->seen[k] = true;
  return 0;
}

static size_t arg_size(const uint8_t *a) {
  /* Mostly small (a 3-byte value: up to 16 MiB, host memory touched only
   * where the pattern goes), one time in 16 up to 256 MiB, and so past the
   * 512 MiB device when several are live. */
  size_t v = (size_t)a[0] | (size_t)a[1] << 8 | (size_t)a[2] << 16;
  if (a[3] % 16 == 15) v <<= 4;
  return v ? v : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t s = data[0] % FUZZ_N_STACKS;
  if (runtimes[s] == NULL) runtimes[s] = fuzz_runtime(s, 512ull << 20, 1);
  gmr_runtime_t *rt = runtimes[s];
  slot_t slot[SLOTS];
  memset(slot, 0, sizeof slot);
  int64_t charged = 0;
  const bool limited = strncmp(gmr_runtime_policy(rt), "limit", 5) == 0;
  uint64_t serial = 0;
  size_t i = 1;
  while (i + 6 <= size) { /* one opcode byte, five argument bytes */
    uint8_t op = data[i] % 16, k = data[i + 1] % SLOTS;
    const uint8_t *a = data + i + 1;
    i += 6;
    slot_t *sl = &slot[k];
    int rc = 0;
    switch (op) {
    case 0:
    case 1:
    case 2:
    case 3: /* allocate into slot k (freeing what it holds) */
      if (sl->p != NULL) {
        check_live(rt, sl, "free");
        fuzz_assert(gmr_free(rt, sl->p) == 0, "free: %s", gmr_last_error(rt));
        sl->p = NULL;
      }
      {
        size_t n = arg_size(a + 1);
        void *p = NULL;
        rc = gmr_alloc(rt, n, GMR_SIM_STREAM(a[4] % 3), &p);
        fuzz_assert(rc == 0 || rc == GMR_ENOMEM, "alloc %zu: %s: %s", n, gmr_err_name(rc),
                    gmr_last_error(rt));
        if (rc == 0) {
          size_t req = 0, got = 0;
          fuzz_assert(gmr_alloc_size(rt, p, &req, &got) == 0 && req == n && got >= n, "alloc_size");
          uint64_t token;
          fuzz_assert(fuzz_covered(rt, p, n, &token), "alloc: %p (%zu bytes) is not device memory",
                      p, n);
          for (int j = 0; j < SLOTS; ++j) {
            uintptr_t b = (uintptr_t)slot[j].p, q = (uintptr_t)p;
            fuzz_assert(slot[j].p == NULL || q + n <= b || b + slot[j].size <= q,
                        "alloc: %p (%zu bytes) overlaps live %p (%zu bytes)", p, n,
                        (void *)slot[j].p, slot[j].size);
          }
          sl->p = p, sl->size = n, sl->tag = ++serial * 0x9E3779B97F4A7C15ull, sl->token = token;
          fuzz_fill(sl->p, n, sl->tag);
        }
      }
      break;
    case 4:
    case 5: /* free */
      if (sl->p == NULL) break;
      check_live(rt, sl, "free");
      fuzz_assert(gmr_free(rt, sl->p) == 0, "free: %s", gmr_last_error(rt));
      sl->p = NULL;
      break;
    case 6: /* record_stream */
      if (sl->p == NULL) break;
      rc = gmr_record_stream(rt, sl->p, GMR_SIM_STREAM(a[1] % 4));
      fuzz_assert(rc == 0, "record_stream: %s", gmr_last_error(rt));
      break;
    case 7:
      fuzz_assert(gmr_empty_cache(rt) == 0, "empty_cache: %s", gmr_last_error(rt));
      for (int j = 0; j < SLOTS; ++j)
        if (slot[j].p != NULL) check_live(rt, &slot[j], "empty_cache");
      break;
    case 8: { /* charge, or refund part of the charges */
      int64_t n = (int64_t)(arg_size(a + 1) & 0xffffffff);
      if (a[4] & 1) {
        rc = gmr_charge(rt, n);
        fuzz_assert(rc == 0 || rc == GMR_ENOMEM, "charge: %s", gmr_last_error(rt));
        if (rc == 0) charged += n;
      } else {
        rc = gmr_charge(rt, -n);
        /* stacks without a limit accept every refund */
        fuzz_assert(limited ? (rc == 0) == (n <= charged) : rc == 0, "refund of %lld of %lld: %s",
                    (long long)n, (long long)charged, gmr_last_error(rt));
        if (rc == 0 && n <= charged) charged -= n;
      }
      break;
    }
    case 9: {
      gmr_stats_t st;
      fuzz_assert(gmr_stats(rt, &st) == 0, "stats");
      /* A block's request is at most its size, so requested <= active.  Not
       * requested <= allocated: PyTorch's caching allocator takes a freed
       * block out of allocated_bytes at once (free()) but out of
       * requested_bytes and active_bytes only in free_block, once the events
       * of its recorded streams complete; a block freed while another
       * stream's work on it is queued counts in requested and not in
       * allocated (tests/fuzz/corpus/api/finding-requested-above-allocated.bin,
       * pinned by tests/hardening), and the faithful policy keeps that. */
      fuzz_assert(st.requested_bytes <= st.active_bytes, "requested > active");
      fuzz_assert(st.allocated_bytes <= st.active_bytes, "allocated > active");
      break;
    }
    case 10: /* hold back, or complete, a stream's work */
      if (a[1] & 1)
        gmr_sim_stream_enqueue(rt, GMR_SIM_STREAM(a[2] % 4));
      else
        gmr_sim_stream_complete(rt, GMR_SIM_STREAM(a[2] % 4));
      break;
    case 11:
      fuzz_assert(gmr_history_enable(rt, (a[1] & 1) ? 64 : 0) == 0, "history");
      break;
    case 12: /* a device fault on the next reserve or map */
      gmr_sim_fail_nth(rt, 1 + a[1] % 3);
      break;
    case 13: { /* a walk */
      walk_t w = {.rt = rt, .slot = slot};
      rc = gmr_walk(rt, walk_entry, &w);
      fuzz_assert(rc == 0 || rc == GMR_ENOTSUP, "walk: %s", gmr_last_error(rt));
      for (int j = 0; rc == 0 && j < SLOTS; ++j)
        fuzz_assert(slot[j].p == NULL || w.seen[j], "walk: live block %p (%zu bytes) not listed",
                    (void *)slot[j].p, slot[j].size);
      break;
    }
    default:
      break;
    }
    fuzz_assert(gmr_check(rt) == 0, "after op %u: %s", op, gmr_last_error(rt));
  }
  gmr_sim_fail_nth(rt, 0);
  for (int k = 0; k < SLOTS; ++k) {
    if (slot[k].p == NULL) continue;
    check_live(rt, &slot[k], "at the end");
    fuzz_assert(gmr_free(rt, slot[k].p) == 0, "free: %s", gmr_last_error(rt));
  }
  if (charged > 0) fuzz_assert(gmr_charge(rt, -charged) == 0, "refund of the rest");
  for (int st = 0; st < 4; ++st)
    gmr_sim_stream_complete(rt, GMR_SIM_STREAM(st));
  gmr_history_enable(rt, 0);
  fuzz_assert(gmr_empty_cache(rt) == 0, "empty_cache");
  fuzz_assert(gmr_check(rt) == 0, "at the end: %s", gmr_last_error(rt));
  gmr_stats_t st;
  gmr_stats(rt, &st);
  fuzz_assert(st.allocations == 0 && st.allocated_bytes == 0, "%llu allocations left",
              (unsigned long long)st.allocations);
  fuzz_bound_memory(runtimes, FUZZ_N_STACKS);
  return 0;
}
