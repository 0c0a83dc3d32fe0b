/* snapshot.c: gmr_snapshot_write, a runtime's state and history as
 * PyTorch's memory snapshot (the pickle of torch.cuda.memory._dump_snapshot,
 * read by PyTorch's memory_viz page and torch.cuda._memory_viz).
 *
 * See Note [Snapshot layout], Note [Snapshot pickle] and Note [Snapshot frames].
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/avl.h"
#include "core/internal.h"
#include "observe/history.h"
#include "observe/snapshot.h"

/* ---- the pickle writer ------------------------------------------------------ */

/* Note [Snapshot pickle]
 * The pickle is written by hand with protocol 2 opcodes, and only those that
 * the unpickler inside PyTorch's MemoryViz.js also reads (lists appended in
 * batches of 1000, as Python's pickler does).  The memo holds the frames
 * only: each frame's dict is written once and fetched again by every entry
 * and block that names it, as PyTorch's own snapshots share their frames.
 */

enum {
  PKL_PROTO = 0x80,
  PKL_STOP = '.',
  PKL_MARK = '(',
  PKL_EMPTY_DICT = '}',
  PKL_SETITEMS = 'u',
  PKL_EMPTY_LIST = ']',
  PKL_APPENDS = 'e',
  PKL_TUPLE2 = 0x86,
  PKL_NEWTRUE = 0x88,
  PKL_NEWFALSE = 0x89,
  PKL_NONE = 'N',
  PKL_BININT = 'J',
  PKL_BININT1 = 'K',
  PKL_BININT2 = 'M',
  PKL_LONG1 = 0x8a,
  PKL_BINUNICODE = 'X',
  PKL_BINFLOAT = 'G',
  PKL_APPEND = 'a',
  PKL_BINPUT = 'q',
  PKL_LONG_BINPUT = 'r',
  PKL_BINGET = 'h',
  PKL_LONG_BINGET = 'j',
};

#define PKL_BATCH 1000 /* list items per APPENDS, as Python's pickler (Note [Snapshot pickle]) */

static inline void pkl_op(FILE *f, int op) {
  putc(op, f);
}

/* A non-negative int, in the smallest form Python's pickler would use. */
static void pkl_uint(FILE *f, uint64_t v) {
  if (v <= 0xff) {
    pkl_op(f, PKL_BININT1);
    putc((int)v, f);
  } else if (v <= 0xffff) {
    pkl_op(f, PKL_BININT2);
    putc((int)(v & 0xff), f);
    putc((int)(v >> 8), f);
  } else if (v <= 0x7fffffff) {
    pkl_op(f, PKL_BININT);
    for (int i = 0; i < 4; ++i)
      putc((int)((v >> (8 * i)) & 0xff), f);
  } else {
    /* LONG1: little-endian two's complement, as few bytes as keep it positive. */
    unsigned char b[9];
    int n = 0;
    for (uint64_t x = v; x != 0; x >>= 8)
      b[n++] = (unsigned char)(x & 0xff);
    if (b[n - 1] & 0x80) b[n++] = 0;
    pkl_op(f, PKL_LONG1);
    putc(n, f);
    fwrite(b, 1, (size_t)n, f);
  }
}

static void pkl_str(FILE *f, const char *s) {
  size_t n = strlen(s);
  pkl_op(f, PKL_BINUNICODE);
  for (int i = 0; i < 4; ++i)
    putc((int)((n >> (8 * i)) & 0xff), f);
  fwrite(s, 1, n, f);
}

/* The length of the well-formed UTF-8 sequence at s[0 .. n), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
  if (len == 0 || len > n) return 0;
  for (size_t i = 1; i < len; ++i)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (len == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
  if (len == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
  return len;
}

/* A text from outside (a trace's call site): each byte that is not part of
 * well-formed UTF-8 becomes '?', so that Python's unpickler decodes it. */
static void pkl_text(FILE *f, const char *s) {
  size_t n = strlen(s);
  pkl_op(f, PKL_BINUNICODE);
  for (int i = 0; i < 4; ++i)
    putc((int)((n >> (8 * i)) & 0xff), f);
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(u + i, n - i);
    if (k == 0) {
      putc('?', f);
      ++i;
    } else {
      fwrite(u + i, 1, k, f);
      i += k;
    }
  }
}

static void pkl_bool(FILE *f, bool b) {
  pkl_op(f, b ? PKL_NEWTRUE : PKL_NEWFALSE);
}

static void pkl_key_uint(FILE *f, const char *k, uint64_t v) {
  pkl_str(f, k);
  pkl_uint(f, v);
}

static void pkl_key_str(FILE *f, const char *k, const char *v) {
  pkl_str(f, k);
  pkl_str(f, v);
}

/* Item `i` of `n` of a list opened with PKL_EMPTY_LIST: call before and after
 * writing the item. */
static inline void pkl_list_item_begin(FILE *f, size_t i) {
  if (i % PKL_BATCH == 0) pkl_op(f, PKL_MARK);
}
static inline void pkl_list_item_end(FILE *f, size_t i, size_t n) {
  if (i % PKL_BATCH == PKL_BATCH - 1 || i == n - 1) pkl_op(f, PKL_APPENDS);
}

static void pkl_empty_list(FILE *f) {
  pkl_op(f, PKL_EMPTY_LIST);
}

/* ---- segments from the walk -------------------------------------------------- */

/* Note [Snapshot layout]
 * The snapshot is one dict:
 *   {"segments": [Segment], "device_traces": [[TraceEntry] per device],
 *    "allocator_settings": {...}, "external_annotations": []}
 *   Segment = {device, address, total_size, allocated_size, active_size,
 *              requested_size, stream, segment_type, segment_pool_id,
 *              is_expandable, frames, blocks: [Block]}
 *   Block   = {address, size, requested_size, state, frames}
 *   TraceEntry = {action, addr (oom: device_free), size, stream, time_us, frames,
 *                 compile_context: "N/A", user_metadata: ""}
 * Segments are the maximal runs of address-contiguous, mapped blocks of each
 * segment gmr_walk reports, sorted by address: a plain segment is one run; an
 * expandable segment gives one segment per contiguous mapped range, and its
 * unmapped blocks are left out, as PyTorch does.  For each segment:
 *   total_size     = Σ block sizes
 *   allocated_size = Σ sizes of active_allocated blocks
 *   active_size    = Σ sizes of active_allocated and active_pending_free blocks
 *   requested_size = Σ requested sizes of those active blocks
 * Frames: Note [Snapshot frames].
 */

/* Note [Snapshot frames]
 * Each entry, block and segment has "frames": [] unless the history names
 * a call site (Note [History frames] in history.h), and then one frame
 * {"name", "filename", "line"}.  An entry has its own frame, else (for
 * free_requested and free_completed) the frame of the alloc of its address
 * before it; an active block, the frame of the alloc that is live at its
 * address at the end of the history; a segment, the frame of the
 * segment_alloc or segment_map at its address that is still live.
 * Inactive blocks have none, as in PyTorch's snapshots.
 */

typedef struct snap_block_s {
  uint64_t addr;      /* device address */
  uint64_t size;      /* bytes */
  uint64_t requested; /* bytes; 0 when inactive */
  int state;          /* gmr_block_state_t, never GMR_BLOCK_UNMAPPED */
  uint32_t frame;     /* Note [Snapshot frames]; 0: none */
} snap_block_t;

typedef struct snap_seg_s {
  uint64_t addr;                                /* device address of the first block */
  uint64_t total, allocated, active, requested; /* bytes (see the file comment) */
  uint64_t stream;                              /* stream handle as an integer */
  bool small;                                   /* the walk's pool is "small" */
  bool expandable;
  size_t first, n; /* blocks[first .. first + n) */
  uint32_t frame;  /* Note [Snapshot frames]; 0: none */
} snap_seg_t;

typedef struct snap_s {
  snap_block_t *blocks;
  size_t n_blocks, cap_blocks;
  snap_seg_t *segs;
  size_t n_segs, cap_segs;
  gmr_walk_entry_t hdr; /* the segment the walk is in */
  bool small;           /* hdr's pool is "small" */
  bool have_hdr;
  bool in_run; /* segs[n_segs - 1] is open for more blocks */
  bool failed; /* out of host memory */
} snap_t;

static bool snap_grow(void **v, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t cap2 = *cap ? *cap * 2 : 64;
  while (cap2 < need)
    cap2 *= 2;
  void *p = gmr__realloc(*v, cap2 * elem);
  if (p == NULL) return false;
  *v = p;
  *cap = cap2;
  return true;
}

/* Builds the segments of Note [Snapshot layout] from the walk. */
static int snap_walk_cb(const gmr_walk_entry_t *e, void *ud) {
  snap_t *sn = ud;
  if (e->is_segment) {
    sn->hdr = *e;
    sn->hdr.pool = NULL; /* not kept past the walk */
    sn->small = e->pool != NULL && strcmp(e->pool, "small") == 0;
    sn->have_hdr = true;
    sn->in_run = false;
    return 0;
  }
  if (!sn->have_hdr || e->state == GMR_BLOCK_UNMAPPED || e->size == 0) {
    sn->in_run = false;
    return 0;
  }
  snap_seg_t *seg = sn->in_run ? &sn->segs[sn->n_segs - 1] : NULL;
  if (seg != NULL && seg->addr + seg->total != e->address) seg = NULL; /* a gap: a new range */
  if (seg == NULL) {
    if (!snap_grow((void **)&sn->segs, &sn->cap_segs, sn->n_segs + 1, sizeof *sn->segs)) {
      sn->failed = true;
      return 1;
    }
    seg = &sn->segs[sn->n_segs++];
    *seg = (snap_seg_t){.addr = e->address,
                        .stream = (uint64_t)(uintptr_t)sn->hdr.stream,
                        .small = sn->small,
                        .expandable = sn->hdr.is_expandable != 0,
                        .first = sn->n_blocks};
    sn->in_run = true;
  }
  if (!snap_grow((void **)&sn->blocks, &sn->cap_blocks, sn->n_blocks + 1, sizeof *sn->blocks)) {
    sn->failed = true;
    return 1;
  }
  bool active = e->state == GMR_BLOCK_ALLOCATED || e->state == GMR_BLOCK_PENDING_FREE;
  sn->blocks[sn->n_blocks++] =
      (snap_block_t){e->address, e->size, active ? e->requested : 0, (int)e->state, 0};
  ++seg->n;
  seg->total += e->size;
  if (e->state == GMR_BLOCK_ALLOCATED) seg->allocated += e->size;
  if (active) {
    seg->active += e->size;
    seg->requested += e->requested;
  }
  return 0;
}

static int seg_by_address(const void *a, const void *b) {
  uint64_t x = ((const snap_seg_t *)a)->addr, y = ((const snap_seg_t *)b)->addr;
  return x < y ? -1 : x > y;
}

static const char *block_state_name(int state) {
  switch (state) {
  case GMR_BLOCK_ALLOCATED:
    return "active_allocated";
  case GMR_BLOCK_PENDING_FREE:
    return "active_pending_free";
  default:
    return "inactive";
  }
}

/* ---- frames ------------------------------------------------------------------------ */

/* key -> frame in t: set (frame != 0) or erase.  0, or GMR_ENOMEM. */
static int frame_set(gmr_avl_t *t, uint64_t key, uint32_t frame) {
  if (frame == 0) {
    gmr__avl_erase(t, key);
    return 0;
  }
  int r = gmr__avl_insert(t, key, frame, 0);
  if (r == 1) gmr__avl_find(t, key)->val = frame;
  return r == 1 ? 0 : r;
}

static uint32_t frame_get(const gmr_avl_t *t, uint64_t key) {
  const gmr_avl_node_t *n = gmr__avl_find(t, key);
  return n ? (uint32_t)n->val : 0;
}

/* Note [Snapshot frames]: the entries' frames in place, then the blocks'
 * and the segments'.  0, or GMR_ENOMEM. */
static int snap_resolve_frames(snap_t *sn, gmr_snapshot_capture_t *cap) {
  if (cap->n_frames == 0) {
    for (size_t i = 0; i < cap->n_entries; ++i)
      cap->entries[i].frame = 0;
    return 0;
  }
  gmr_avl_t blocks = {0}, segs = {0}; /* address -> frame */
  int err = 0;
  for (size_t i = 0; i < cap->n_entries && err == 0; ++i) {
    gmr_hist_entry_t *e = &cap->entries[i];
    if (e->frame > cap->n_frames) e->frame = 0;
    switch (e->action) {
    case GMR_HIST_ALLOC:
      err = frame_set(&blocks, e->addr, e->frame);
      break;
    case GMR_HIST_FREE_REQUESTED:
    case GMR_HIST_FREE_COMPLETED:
      if (e->frame == 0) e->frame = frame_get(&blocks, e->addr);
      if (e->action == GMR_HIST_FREE_COMPLETED) gmr__avl_erase(&blocks, e->addr);
      break;
    case GMR_HIST_SEGMENT_ALLOC:
    case GMR_HIST_SEGMENT_MAP:
      err = frame_set(&segs, e->addr, e->frame);
      break;
    case GMR_HIST_SEGMENT_FREE:
    case GMR_HIST_SEGMENT_UNMAP:
      gmr__avl_erase(&segs, e->addr);
      break;
    default:
      break;
    }
  }
  for (size_t i = 0; i < sn->n_blocks && err == 0; ++i)
    if (sn->blocks[i].state != GMR_BLOCK_FREE)
      sn->blocks[i].frame = frame_get(&blocks, sn->blocks[i].addr);
  for (size_t i = 0; i < sn->n_segs && err == 0; ++i)
    sn->segs[i].frame = frame_get(&segs, sn->segs[i].addr);
  gmr__avl_clear(&blocks, NULL, NULL);
  gmr__avl_clear(&segs, NULL, NULL);
  return err ? gmr__error_set(GMR_ENOMEM, "gmr_snapshot_write: out of host memory for the frames")
             : 0;
}

/* The frames being written: each frame's dict goes to the memo the first
 * time (Note [Snapshot pickle]). */
typedef struct snap_frames_s {
  const gmr_hist_frame_t *frames;
  size_t n;
  uint32_t *memo; /* n: 1 + the frame's memo index once written; 0 before */
  uint32_t next;  /* memo indices used */
} snap_frames_t;

static void pkl_index(FILE *f, int short_op, int long_op, uint32_t i) {
  if (i <= 0xff) {
    pkl_op(f, short_op);
    putc((int)i, f);
  } else {
    pkl_op(f, long_op);
    for (int k = 0; k < 4; ++k)
      putc((int)((i >> (8 * k)) & 0xff), f);
  }
}

/* "frames": [] or [frame `id`]. */
static void write_frames(FILE *f, snap_frames_t *fr, uint32_t id) {
  pkl_str(f, "frames");
  pkl_empty_list(f);
  if (id == 0 || id > fr->n) return;
  uint32_t m = fr->memo[id - 1];
  if (m != 0) {
    pkl_index(f, PKL_BINGET, PKL_LONG_BINGET, m - 1);
  } else {
    const gmr_hist_frame_t *x = &fr->frames[id - 1];
    pkl_op(f, PKL_EMPTY_DICT);
    pkl_op(f, PKL_MARK);
    pkl_str(f, "name"); /* PyTorch 2.11's order */
    pkl_text(f, x->name);
    pkl_str(f, "filename");
    pkl_text(f, x->filename);
    pkl_key_uint(f, "line", x->line);
    pkl_op(f, PKL_SETITEMS);
    pkl_index(f, PKL_BINPUT, PKL_LONG_BINPUT, fr->next);
    fr->memo[id - 1] = ++fr->next;
  }
  pkl_op(f, PKL_APPEND);
}

/* ---- writing ------------------------------------------------------------------- */

static void write_segment(FILE *f, const snap_t *sn, const snap_seg_t *seg, int device,
                          snap_frames_t *fr) {
  pkl_op(f, PKL_EMPTY_DICT);
  pkl_op(f, PKL_MARK);
  pkl_key_uint(f, "device", (uint64_t)device);
  pkl_key_uint(f, "address", seg->addr);
  pkl_key_uint(f, "total_size", seg->total);
  pkl_key_uint(f, "allocated_size", seg->allocated);
  pkl_key_uint(f, "active_size", seg->active);
  pkl_key_uint(f, "requested_size", seg->requested);
  pkl_key_uint(f, "stream", seg->stream);
  pkl_key_str(f, "segment_type", seg->small ? "small" : "large");
  pkl_str(f, "segment_pool_id");
  pkl_uint(f, 0);
  pkl_uint(f, 0);
  pkl_op(f, PKL_TUPLE2);
  pkl_str(f, "is_expandable");
  pkl_bool(f, seg->expandable);
  write_frames(f, fr, seg->frame);
  pkl_str(f, "blocks");
  pkl_empty_list(f);
  for (size_t i = 0; i < seg->n; ++i) {
    const snap_block_t *b = &sn->blocks[seg->first + i];
    pkl_list_item_begin(f, i);
    pkl_op(f, PKL_EMPTY_DICT);
    pkl_op(f, PKL_MARK);
    pkl_key_uint(f, "address", b->addr);
    pkl_key_uint(f, "size", b->size);
    pkl_key_uint(f, "requested_size", b->requested);
    pkl_key_str(f, "state", block_state_name(b->state));
    write_frames(f, fr, b->frame);
    pkl_op(f, PKL_SETITEMS);
    pkl_list_item_end(f, i, seg->n);
  }
  pkl_op(f, PKL_SETITEMS);
}

static void write_trace_entry(FILE *f, const gmr_hist_entry_t *e, snap_frames_t *fr) {
  pkl_op(f, PKL_EMPTY_DICT);
  pkl_op(f, PKL_MARK);
  pkl_key_str(f, "action", gmr__history_action_name(e->action));
  pkl_key_uint(f, e->action == GMR_HIST_OOM ? "device_free" : "addr", e->addr);
  pkl_key_uint(f, "size", e->size);
  pkl_key_uint(f, "stream", e->stream);
  pkl_key_uint(f, "time_us", e->time_us);
  write_frames(f, fr, e->frame);
  pkl_key_str(f, "compile_context", "N/A"); /* as PyTorch 2.11 writes when it has none */
  pkl_key_str(f, "user_metadata", "");
  pkl_op(f, PKL_SETITEMS);
}

static void write_snapshot(FILE *f, const gmr_snapshot_source_t *src, const snap_t *sn,
                           const gmr_snapshot_capture_t *cap, snap_frames_t *fr) {
  int device = src->device;
  const gmr_hist_entry_t *entries = cap->entries;
  size_t n_entries = cap->n_entries;
  pkl_op(f, PKL_PROTO);
  putc(2, f);
  pkl_op(f, PKL_EMPTY_DICT);
  pkl_op(f, PKL_MARK);

  pkl_str(f, "segments");
  pkl_empty_list(f);
  for (size_t i = 0; i < sn->n_segs; ++i) {
    pkl_list_item_begin(f, i);
    write_segment(f, sn, &sn->segs[i], device, fr);
    pkl_list_item_end(f, i, sn->n_segs);
  }

  /* One list per device up to this runtime's; the others stay empty. */
  pkl_str(f, "device_traces");
  pkl_empty_list(f);
  size_t n_devices = (size_t)device + 1;
  for (size_t d = 0; d < n_devices; ++d) {
    pkl_list_item_begin(f, d);
    pkl_empty_list(f);
    if (d == (size_t)device) {
      for (size_t i = 0; i < n_entries; ++i) {
        pkl_list_item_begin(f, i);
        write_trace_entry(f, &entries[i], fr);
        pkl_list_item_end(f, i, n_entries);
      }
    }
    pkl_list_item_end(f, d, n_devices);
  }

  /* gmr's own settings: PyTorch's keys describe PyTorch's allocator only. */
  pkl_str(f, "allocator_settings");
  pkl_op(f, PKL_EMPTY_DICT);
  pkl_op(f, PKL_MARK);
  pkl_key_str(f, "gmr_policy", src->policy);
  pkl_key_str(f, "gmr_backend", src->backend);
  pkl_key_uint(f, "gmr_history_max_entries", cap->history_max);
  pkl_key_uint(f, "gmr_history_dropped", cap->history_dropped);
  pkl_op(f, PKL_SETITEMS);

  pkl_str(f, "external_annotations");
  pkl_empty_list(f);
  pkl_op(f, PKL_SETITEMS);
  pkl_op(f, PKL_STOP);
}

int gmr__snapshot_write(const gmr_snapshot_source_t *src, FILE *out) {
  snap_t sn;
  memset(&sn, 0, sizeof sn);
  gmr_snapshot_capture_t cap;
  memset(&cap, 0, sizeof cap);
  snap_frames_t fr = {0};
  int err = src->capture(src->ctx, snap_walk_cb, &sn, &cap);
  if (err != 0) goto out;
  if (sn.failed) {
    err = gmr__error_set(GMR_ENOMEM, "gmr_snapshot_write: out of host memory for the segments");
    goto out;
  }
  if (cap.walk_err != 0 && cap.walk_err != GMR_ENOTSUP) {
    err = cap.walk_err;
    goto out;
  }
  if (sn.n_segs > 1) qsort(sn.segs, sn.n_segs, sizeof *sn.segs, seg_by_address);
  if ((err = snap_resolve_frames(&sn, &cap)) != 0) goto out;
  fr.frames = cap.frames;
  fr.n = cap.n_frames;
  if (fr.n > 0 && (fr.memo = gmr__calloc(fr.n, sizeof *fr.memo)) == NULL) {
    err = gmr__error_set(GMR_ENOMEM, "gmr_snapshot_write: out of host memory for the frames");
    goto out;
  }
  errno = 0;
  write_snapshot(out, src, &sn, &cap, &fr);
  if (fflush(out) != 0 || ferror(out))
    err = gmr__error_set(GMR_EIO, "gmr_snapshot_write: writing the snapshot failed: %s",
                         strerror(errno ? errno : EIO));
out:
  gmr__free(fr.memo);
  gmr__free(cap.frames);
  gmr__free(cap.entries);
  gmr__free(sn.blocks);
  gmr__free(sn.segs);
  return err;
}
