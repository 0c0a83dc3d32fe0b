/* replay-pickle.c: PyTorch memory snapshots as traces.
 *
 * torch.cuda.memory._dump_snapshot writes a pickle of builtin types (Note
 * [Snapshot layout]).  This file reads it with a small stack machine that
 * knows only the opcodes of plain data (protocols 2 to 5), one reader per
 * opcode family, and writes the busiest device's history as trace CSV for
 * gmr_trace_parse: alloc -> allocate (the requested size; the call site from
 * the innermost frame outside torch), free_completed -> free, oom -> a failure
 * (counted, not replayed), anything else -> a comment, so that CSV line N is
 * trace entry N.  The input may be hostile (Note [Hostile pickles]).
 */

/* Note [Snapshot layout]
 * ~~~~~~~~~~~~~~~~~~~~~~
 *   {"segments": [...], "device_traces": [[entry, ...] per device], ...}
 *   entry = {"action": "alloc" | "free_requested" | "free_completed" |
 *            "segment_alloc" | "segment_free" | "segment_map" | "segment_unmap" |
 *            "oom" | "snapshot", "addr": int, "size": int, "stream": int,
 *            "time_us": int, "frames": [{"filename", "line", "name"}, ...]}
 */

/* Note [Hostile pickles]
 * ~~~~~~~~~~~~~~~~~~~~~~
 * Nothing is executed (globals and their calls become inert
 * placeholders), every read is bounds-checked, and memory is bounded by the
 * input: every value, stack slot and container entry comes from at least one
 * opcode byte, memo indices are below the input length, and the walk of the
 * result follows a fixed path (no recursion, so a self-containing list is
 * harmless).
 *   values made <= len;  Σ container entries <= len;  memo size <= len
 * Memo references (BINGET, 2 bytes) share a value by reference, never by
 * copy, so one value can be reached from many places: see Note [Shared
 * values] for why the walk of the result stays linear anyway.
 */

/* Note [Shared values]
 * ~~~~~~~~~~~~~~~~~~~~
 * A 2-byte BINGET puts a value already made in one more place: a history of
 * n entries can be one entry n times, its frames one frame n times, a dict
 * one key n times.  What the walk computes from a shared value it computes
 * once and keeps on the value:
 *   a dict:  where each key the walk asks for sits (an index of PK_NKEYS
 *            slots, built in one pass: pk_get costs O(1) after it);
 *   a list:  its call site as frames (snap_site), its count of allocs as a
 *            device's history (pk_allocs);
 *   a segment, a list of blocks: read once for --reconstruct (a second
 *            reading adds nothing, or, for a list of blocks that two segments
 *            share, which torch never writes, would add n^2 blocks).
 * So the walk costs O(len) whatever is shared, plus one row per entry of
 * the history.  Rows are handed to the caller in chunks as they are made
 * (gmr__snapshot_to_csv's sink), so the text of a trace of n entries is
 * never held whole: 2 bytes of pickle that repeat an entry cost one event
 * (40 bytes) in the trace read, not a 400-byte row in memory.  Tables keyed
 * by what the file chose (live addresses, stream ids) are AVL trees
 * (core/avl.h), O(log n) whatever the keys.  pk_cost counts the steps and
 * bytes for the tests (gmr__snapshot_last_cost).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/avl.h"
#include "core/internal.h"
#include "replay/replay-formats.h"

/* ---- values ----------------------------------------------------------------------- */

typedef enum pk_type_e {
  PK_NONE,
  PK_BOOL,
  PK_INT,
  PK_BIGINT, /* an integer beyond int64 (kept as a placeholder) */
  PK_FLOAT,
  PK_STR, /* text or bytes: points into the input */
  PK_LIST,
  PK_DICT, /* items hold key, value, key, value... */
  PK_TUPLE,
  PK_OBJ /* a global, or what calling one would have made: inert */
} pk_type_t;

/* What the walk kept on a shared value (Note [Shared values]). */
enum {
  PK_F_ALLOCS = 1,       /* a list: i holds its count of alloc entries */
  PK_F_SITE = 2,         /* a list: cache holds its call site as frames */
  PK_F_SEGMENT_READ = 4, /* a dict: read as a segment */
  PK_F_BLOCKS_READ = 8,  /* a list: read as a segment's blocks */
  PK_F_BLOCKS_COUNTED = 16
};

typedef struct pk_val_s pk_val_t;
struct pk_val_s {
  pk_type_t type;
  uint32_t flags; /* PK_F_* */
  union {
    int64_t i; /* PK_INT, PK_BOOL; a list's count of allocs (PK_F_ALLOCS) */
    double f;  /* PK_FLOAT */
  };
  union {
    const char *s;    /* PK_STR: points into the input */
    pk_val_t **items; /* PK_LIST, PK_DICT, PK_TUPLE */
  };
  size_t len; /* PK_STR: bytes */
  size_t n, cap;
  void *cache; /* a dict's key index, a list's call site (Note [Shared values]) */
};

/* The cost of this thread's last conversion, for the tests. */
static _Thread_local gmr__snapshot_cost_t pk_cost;

const gmr__snapshot_cost_t *gmr__snapshot_last_cost(void) {
  return &pk_cost;
}

enum { PK_CHUNK = 4096 };

typedef struct pk_s {
  const unsigned char *p, *end;
  size_t len;
  pk_val_t **chunks; /* every value, PK_CHUNK per chunk */
  size_t n_chunks, used, made, cap_chunks;
  pk_val_t **stack;
  size_t n_stack, cap_stack;
  size_t *marks;
  size_t n_marks, cap_marks;
  pk_val_t **memo;
  size_t n_memo;
  char *err;
  size_t errlen;
  const char *name;
  bool strict; /* refuse globals outside torch and a few builtins (gmr_snapshot_csv) */
} pk_t;

static int pk_fail(pk_t *k, const char *fmt, ...) GMR_PRINTF(2, 3);

static int pk_fail(pk_t *k, const char *fmt, ...) {
  if (k->err && k->errlen) {
    int n = snprintf(k->err, k->errlen, "%s: ", k->name);
    if (n >= 0 && (size_t)n < k->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(k->err + n, k->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return GMR_EINVAL;
}

static bool pk_grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16;
  while (c < need)
    c *= 2;
  void *a = gmr__realloc(*arr, c * elem);
  if (a == NULL) return false;
  pk_cost.bytes += (c - *cap) * elem;
  *arr = a;
  *cap = c;
  return true;
}

static pk_val_t *pk_new(pk_t *k, pk_type_t type) {
  if (++k->made > k->len) return NULL; /* cannot happen on a well-formed count */
  if (k->n_chunks == 0 || k->used == PK_CHUNK) {
    if (!pk_grow((void **)&k->chunks, &k->cap_chunks, k->n_chunks + 1, sizeof *k->chunks))
      return NULL;
    pk_val_t *c = gmr__malloc(PK_CHUNK * sizeof *c);
    if (c == NULL) return NULL;
    pk_cost.bytes += PK_CHUNK * sizeof *c;
    k->chunks[k->n_chunks++] = c;
    k->used = 0;
  }
  pk_val_t *v = &k->chunks[k->n_chunks - 1][k->used++];
  memset(v, 0, sizeof *v);
  v->type = type;
  return v;
}

static void pk_release(pk_t *k) {
  for (size_t c = 0; c < k->n_chunks; ++c) {
    size_t n = c + 1 == k->n_chunks ? k->used : PK_CHUNK;
    for (size_t i = 0; i < n; ++i) {
      pk_val_t *v = &k->chunks[c][i];
      if (v->type == PK_LIST || v->type == PK_DICT || v->type == PK_TUPLE) gmr__free(v->items);
      gmr__free(v->cache);
    }
    gmr__free(k->chunks[c]);
  }
  gmr__free(k->chunks);
  gmr__free(k->stack);
  gmr__free(k->marks);
  gmr__free(k->memo);
}

static int pk_push(pk_t *k, pk_val_t *v) {
  if (v == NULL) return pk_fail(k, "out of host memory reading the snapshot");
  if (!pk_grow((void **)&k->stack, &k->cap_stack, k->n_stack + 1, sizeof *k->stack))
    return pk_fail(k, "out of host memory reading the snapshot");
  k->stack[k->n_stack++] = v;
  return 0;
}

/* The bottom of the current frame: the last mark, or 0. */
static size_t pk_base(const pk_t *k) {
  return k->n_marks ? k->marks[k->n_marks - 1] : 0;
}

static pk_val_t *pk_pop(pk_t *k) {
  if (k->n_stack <= pk_base(k)) return NULL;
  return k->stack[--k->n_stack];
}

static int pk_append(pk_t *k, pk_val_t *c, pk_val_t *v) {
  if (!pk_grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items))
    return pk_fail(k, "out of host memory reading the snapshot");
  c->items[c->n++] = v;
  return 0;
}

/* ---- the opcodes ------------------------------------------------------------------- */

static bool pk_need(const pk_t *k, size_t n) {
  return (size_t)(k->end - k->p) >= n;
}

static uint64_t pk_le(const unsigned char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = (v << 8) | p[i];
  return v;
}

/* Pop items down to the last mark into a new container (the mark is removed). */
static int pk_collect(pk_t *k, pk_val_t *into) {
  if (k->n_marks == 0) return pk_fail(k, "malformed pickle: no MARK before a collection");
  size_t base = k->marks[--k->n_marks];
  for (size_t i = base; i < k->n_stack; ++i)
    if (pk_append(k, into, k->stack[i]) != 0) return GMR_EINVAL;
  k->n_stack = base;
  return 0;
}

static int pk_string(pk_t *k, size_t lenbytes) {
  if (!pk_need(k, lenbytes)) return pk_fail(k, "truncated pickle");
  uint64_t n = pk_le(k->p, lenbytes);
  k->p += lenbytes;
  if (!pk_need(k, n)) return pk_fail(k, "truncated pickle (a string runs past the end)");
  pk_val_t *v = pk_new(k, PK_STR);
  if (v) v->s = (const char *)k->p, v->len = (size_t)n;
  k->p += n;
  return pk_push(k, v);
}

static int pk_int(pk_t *k, int64_t value) {
  pk_val_t *v = pk_new(k, PK_INT);
  if (v) v->i = value;
  return pk_push(k, v);
}

/* LONG1 / LONG4: little-endian two's complement of n bytes. */
static int pk_long(pk_t *k, size_t lenbytes) {
  if (!pk_need(k, lenbytes)) return pk_fail(k, "truncated pickle");
  uint64_t n = pk_le(k->p, lenbytes);
  k->p += lenbytes;
  if (!pk_need(k, n)) return pk_fail(k, "truncated pickle (an integer runs past the end)");
  const unsigned char *b = k->p;
  k->p += n;
  if (n > 8) {
    /* Beyond 64 bits unless the extra bytes only extend the sign. */
    bool neg = b[n - 1] & 0x80;
    bool fits = true;
    for (size_t i = 8; i < n; ++i)
      fits &= b[i] == (neg ? 0xff : 0x00);
    fits &= ((b[7] & 0x80) != 0) == neg;
    if (!fits) return pk_push(k, pk_new(k, PK_BIGINT));
    n = 8;
  }
  uint64_t u = pk_le(b, (size_t)n);
  if (n > 0 && n < 8 && (b[n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
  return pk_int(k, (int64_t)u);
}

static int pk_memo_put(pk_t *k, uint64_t idx) {
  if (k->n_stack == 0) return pk_fail(k, "malformed pickle: memoizing an empty stack");
  if (idx >= k->len) return pk_fail(k, "malformed pickle: memo index %" PRIu64 " too large", idx);
  if (idx >= k->n_memo) {
    size_t cap = k->n_memo;
    if (!pk_grow((void **)&k->memo, &cap, (size_t)idx + 1, sizeof *k->memo))
      return pk_fail(k, "out of host memory reading the snapshot");
    for (size_t i = k->n_memo; i < cap; ++i)
      k->memo[i] = NULL;
    k->n_memo = cap;
  }
  k->memo[idx] = k->stack[k->n_stack - 1];
  return 0;
}

static int pk_memo_get(pk_t *k, uint64_t idx) {
  if (idx >= k->n_memo || k->memo[idx] == NULL)
    return pk_fail(k, "malformed pickle: memo entry %" PRIu64 " was never stored", idx);
  return pk_push(k, k->memo[idx]);
}

/* An opcode family's reader: op was read (k->p is past it); 1 at STOP, 0
 * to go on, GMR_EINVAL on error.  memo_next: MEMOIZE's next index. */
typedef int pk_op_fn(pk_t *k, unsigned char op, size_t *memo_next);

static int pk_unknown(pk_t *k, unsigned char op) {
  return pk_fail(k,
                 "unsupported pickle opcode 0x%02x at byte %zu: not a memory snapshot of "
                 "plain data",
                 op, (size_t)(k->p - 1 - (k->end - k->len)));
}

/* PROTO, FRAME, STOP and MARK: the framing. */
static int pk_op_control(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  switch (op) {
  case 0x80: /* PROTO */
    if (!pk_need(k, 1)) return pk_fail(k, "truncated pickle");
    if (*k->p++ > 5) return pk_fail(k, "pickle protocol newer than 5");
    return 0;
  case 0x95: /* FRAME */
    if (!pk_need(k, 8)) return pk_fail(k, "truncated pickle");
    k->p += 8;
    return 0;
  case '.': /* STOP */
    return 1;
  case '(': /* MARK */
    if (!pk_grow((void **)&k->marks, &k->cap_marks, k->n_marks + 1, sizeof *k->marks))
      return pk_fail(k, "out of host memory reading the snapshot");
    k->marks[k->n_marks++] = k->n_stack;
    return 0;
  default:
    return pk_unknown(k, op);
  }
}

/* The containers made whole: empty ones, and tuples and frozensets of the stack. */
static int pk_op_container(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  pk_val_t *c;
  switch (op) {
  case '}': /* EMPTY_DICT */
    return pk_push(k, pk_new(k, PK_DICT));
  case ']':  /* EMPTY_LIST */
  case 0x8f: /* EMPTY_SET: read as a list */
    return pk_push(k, pk_new(k, PK_LIST));
  case ')': /* EMPTY_TUPLE */
    return pk_push(k, pk_new(k, PK_TUPLE));
  case 't':  /* TUPLE */
  case 0x91: /* FROZENSET */
    c = pk_new(k, op == 't' ? PK_TUPLE : PK_LIST);
    if (c == NULL) return pk_push(k, NULL);
    if (pk_collect(k, c) != 0) return GMR_EINVAL;
    return pk_push(k, c);
  case 0x85: /* TUPLE1 */
  case 0x86: /* TUPLE2 */
  case 0x87: /* TUPLE3 */ {
    size_t n = (size_t)(op - 0x84);
    if (k->n_stack < pk_base(k) + n) return pk_fail(k, "malformed pickle: short stack");
    c = pk_new(k, PK_TUPLE);
    if (c == NULL) return pk_push(k, NULL);
    for (size_t i = k->n_stack - n; i < k->n_stack; ++i)
      if (pk_append(k, c, k->stack[i]) != 0) return GMR_EINVAL;
    k->n_stack -= n;
    return pk_push(k, c);
  }
  default:
    return pk_unknown(k, op);
  }
}

/* Items into the container below them: APPEND(S), ADDITEMS, SETITEM(S). */
static int pk_op_fill(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  pk_val_t *v, *w, *c;
  switch (op) {
  case 'a': /* APPEND */
    v = pk_pop(k);
    if (v == NULL || k->n_stack <= pk_base(k)) return pk_fail(k, "malformed pickle: short stack");
    c = k->stack[k->n_stack - 1];
    if (c->type != PK_LIST) return pk_fail(k, "malformed pickle: APPEND to a non-list");
    return pk_append(k, c, v);
  case 'e': /* APPENDS */
  case 0x90: /* ADDITEMS */ {
    if (k->n_marks == 0) return pk_fail(k, "malformed pickle: no MARK");
    size_t base = k->marks[--k->n_marks];
    if (base == 0 || base > k->n_stack) return pk_fail(k, "malformed pickle: short stack");
    c = k->stack[base - 1];
    if (c->type != PK_LIST) return pk_fail(k, "malformed pickle: APPENDS to a non-list");
    for (size_t i = base; i < k->n_stack; ++i)
      if (pk_append(k, c, k->stack[i]) != 0) return GMR_EINVAL;
    k->n_stack = base;
    return 0;
  }
  case 's': /* SETITEM */
    w = pk_pop(k);
    v = pk_pop(k);
    if (w == NULL || v == NULL || k->n_stack <= pk_base(k))
      return pk_fail(k, "malformed pickle: short stack");
    c = k->stack[k->n_stack - 1];
    if (c->type != PK_DICT) return pk_fail(k, "malformed pickle: SETITEM on a non-dict");
    return pk_append(k, c, v) != 0 ? GMR_EINVAL : pk_append(k, c, w);
  case 'u': /* SETITEMS */ {
    if (k->n_marks == 0) return pk_fail(k, "malformed pickle: no MARK");
    size_t base = k->marks[--k->n_marks];
    if (base == 0 || base > k->n_stack || (k->n_stack - base) % 2 != 0)
      return pk_fail(k, "malformed pickle: SETITEMS with a short or odd stack");
    c = k->stack[base - 1];
    if (c->type != PK_DICT) return pk_fail(k, "malformed pickle: SETITEMS on a non-dict");
    for (size_t i = base; i < k->n_stack; ++i)
      if (pk_append(k, c, k->stack[i]) != 0) return GMR_EINVAL;
    k->n_stack = base;
    return 0;
  }
  default:
    return pk_unknown(k, op);
  }
}

/* None, booleans, integers and floats. */
static int pk_op_scalar(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  pk_val_t *v;
  switch (op) {
  case 'N':
    return pk_push(k, pk_new(k, PK_NONE));
  case 0x88: /* NEWTRUE */
  case 0x89: /* NEWFALSE */
    v = pk_new(k, PK_BOOL);
    if (v) v->i = op == 0x88;
    return pk_push(k, v);
  case 'K': /* BININT1 */
    if (!pk_need(k, 1)) return pk_fail(k, "truncated pickle");
    return pk_int(k, *k->p++);
  case 'M': /* BININT2 */
    if (!pk_need(k, 2)) return pk_fail(k, "truncated pickle");
    k->p += 2;
    return pk_int(k, (int64_t)pk_le(k->p - 2, 2));
  case 'J': /* BININT: signed 32 bits */
    if (!pk_need(k, 4)) return pk_fail(k, "truncated pickle");
    k->p += 4;
    return pk_int(k, (int64_t)(int32_t)(uint32_t)pk_le(k->p - 4, 4));
  case 0x8a: /* LONG1 */
    return pk_long(k, 1);
  case 0x8b: /* LONG4 */
    return pk_long(k, 4);
  case 'G': { /* BINFLOAT: big-endian double */
    if (!pk_need(k, 8)) return pk_fail(k, "truncated pickle");
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i)
      u = (u << 8) | k->p[i];
    k->p += 8;
    v = pk_new(k, PK_FLOAT);
    if (v) memcpy(&v->f, &u, sizeof v->f);
    return pk_push(k, v);
  }
  default:
    return pk_unknown(k, op);
  }
}

/* Text and bytes, by the width of their length. */
static int pk_op_string(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  switch (op) {
  case 0x8c: /* SHORT_BINUNICODE */
  case 'C':  /* SHORT_BINBYTES */
  case 'U':  /* SHORT_BINSTRING */
    return pk_string(k, 1);
  case 'X': /* BINUNICODE */
  case 'B': /* BINBYTES */
  case 'T': /* BINSTRING */
    return pk_string(k, 4);
  case 0x8d: /* BINUNICODE8 */
  case 0x8e: /* BINBYTES8 */
  case 0x96: /* BYTEARRAY8 */
    return pk_string(k, 8);
  default:
    return pk_unknown(k, op);
  }
}

/* The memo: MEMOIZE, (LONG_)BINPUT and (LONG_)BINGET. */
static int pk_op_memo(pk_t *k, unsigned char op, size_t *memo_next) {
  switch (op) {
  case 0x94: /* MEMOIZE */
    return pk_memo_put(k, (*memo_next)++);
  case 'q': /* BINPUT */
    if (!pk_need(k, 1)) return pk_fail(k, "truncated pickle");
    return pk_memo_put(k, *k->p++);
  case 'r': /* LONG_BINPUT */
    if (!pk_need(k, 4)) return pk_fail(k, "truncated pickle");
    k->p += 4;
    return pk_memo_put(k, pk_le(k->p - 4, 4));
  case 'h': /* BINGET */
    if (!pk_need(k, 1)) return pk_fail(k, "truncated pickle");
    return pk_memo_get(k, *k->p++);
  case 'j': /* LONG_BINGET */
    if (!pk_need(k, 4)) return pk_fail(k, "truncated pickle");
    k->p += 4;
    return pk_memo_get(k, pk_le(k->p - 4, 4));
  default:
    return pk_unknown(k, op);
  }
}

/* The stack itself: POP, POP_MARK, DUP. */
static int pk_op_stack(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  switch (op) {
  case '0': /* POP */
    if (pk_pop(k) == NULL) return pk_fail(k, "malformed pickle: short stack");
    return 0;
  case '1': /* POP_MARK */
    if (k->n_marks == 0) return pk_fail(k, "malformed pickle: no MARK");
    k->n_stack = k->marks[--k->n_marks];
    return 0;
  case '2': /* DUP */
    if (k->n_stack <= pk_base(k)) return pk_fail(k, "malformed pickle: short stack");
    return pk_push(k, k->stack[k->n_stack - 1]);
  default:
    return pk_unknown(k, op);
  }
}

static bool pk_is(const pk_val_t *v, const char *s);

/* Strict reading (gmr_snapshot_csv): a global outside torch and the
 * builtin containers is refused, with the error set, as snapshot2csv.py's
 * unpickler always did.  Either way no global is ever called. */
static bool pk_global_refused(pk_t *k, const pk_val_t *mod, const pk_val_t *name) {
  static const char *const safe[][2] = {{"builtins", "set"},   {"builtins", "frozenset"},
                                        {"builtins", "tuple"}, {"builtins", "list"},
                                        {"builtins", "dict"},  {"collections", "OrderedDict"}};
  if (mod->type == PK_STR && name->type == PK_STR) {
    if (pk_is(mod, "torch") || (mod->len > 6 && memcmp(mod->s, "torch.", 6) == 0)) return false;
    for (size_t i = 0; i < sizeof safe / sizeof *safe; ++i)
      if (pk_is(mod, safe[i][0]) && pk_is(name, safe[i][1])) return false;
  }
  bool text = mod->type == PK_STR && name->type == PK_STR;
  pk_fail(k, "refusing to load %.*s.%.*s: a memory snapshot holds only builtin types",
          text ? (int)(mod->len > 200 ? 200 : mod->len) : 1, text ? mod->s : "?",
          text ? (int)(name->len > 200 ? 200 : name->len) : 1, text ? name->s : "?");
  return true;
}

/* Globals, calls and BUILD: inert placeholders (Note [Hostile pickles]). */
static int pk_op_object(pk_t *k, unsigned char op, size_t *memo_next) {
  (void)memo_next;
  switch (op) {
  case 'c': { /* GLOBAL "module\nname\n": an inert placeholder */
    const unsigned char *at[3] = {k->p};
    for (int line = 0; line < 2; ++line) {
      const unsigned char *nl = memchr(k->p, '\n', (size_t)(k->end - k->p));
      if (nl == NULL) return pk_fail(k, "truncated pickle");
      k->p = nl + 1;
      at[line + 1] = k->p;
    }
    pk_val_t mod = {.type = PK_STR, .s = (const char *)at[0], .len = (size_t)(at[1] - at[0] - 1)};
    pk_val_t name = {.type = PK_STR, .s = (const char *)at[1], .len = (size_t)(at[2] - at[1] - 1)};
    if (k->strict && pk_global_refused(k, &mod, &name)) return GMR_EINVAL;
    return pk_push(k, pk_new(k, PK_OBJ));
  }
  case 0x93: { /* STACK_GLOBAL */
    pk_val_t *name = pk_pop(k), *mod = pk_pop(k);
    if (name == NULL || mod == NULL) return pk_fail(k, "malformed pickle: short stack");
    if (k->strict && pk_global_refused(k, mod, name)) return GMR_EINVAL;
    return pk_push(k, pk_new(k, PK_OBJ));
  }
  case 'R':  /* REDUCE */
  case 0x81: /* NEWOBJ */
    if (pk_pop(k) == NULL || pk_pop(k) == NULL) return pk_fail(k, "malformed pickle: short stack");
    return pk_push(k, pk_new(k, PK_OBJ)); /* nothing is called */
  case 0x92:                              /* NEWOBJ_EX */
    if (pk_pop(k) == NULL || pk_pop(k) == NULL || pk_pop(k) == NULL)
      return pk_fail(k, "malformed pickle: short stack");
    return pk_push(k, pk_new(k, PK_OBJ));
  case 'b': /* BUILD: the state is dropped; the object stays */
    if (pk_pop(k) == NULL || k->n_stack <= pk_base(k))
      return pk_fail(k, "malformed pickle: short stack");
    return 0;
  default:
    return pk_unknown(k, op);
  }
}

/* The reader of each opcode of plain data (protocols 2 to 5), by family;
 * NULL: not one (Note [Hostile pickles]). */
static pk_op_fn *const pk_ops[256] = {
    [0x80] = pk_op_control,   [0x95] = pk_op_control,   ['.'] = pk_op_control,
    ['('] = pk_op_control,    ['}'] = pk_op_container,  [']'] = pk_op_container,
    [0x8f] = pk_op_container, [')'] = pk_op_container,  ['t'] = pk_op_container,
    [0x91] = pk_op_container, [0x85] = pk_op_container, [0x86] = pk_op_container,
    [0x87] = pk_op_container, ['a'] = pk_op_fill,       ['e'] = pk_op_fill,
    [0x90] = pk_op_fill,      ['s'] = pk_op_fill,       ['u'] = pk_op_fill,
    ['N'] = pk_op_scalar,     [0x88] = pk_op_scalar,    [0x89] = pk_op_scalar,
    ['K'] = pk_op_scalar,     ['M'] = pk_op_scalar,     ['J'] = pk_op_scalar,
    [0x8a] = pk_op_scalar,    [0x8b] = pk_op_scalar,    ['G'] = pk_op_scalar,
    [0x8c] = pk_op_string,    ['C'] = pk_op_string,     ['U'] = pk_op_string,
    ['X'] = pk_op_string,     ['B'] = pk_op_string,     ['T'] = pk_op_string,
    [0x8d] = pk_op_string,    [0x8e] = pk_op_string,    [0x96] = pk_op_string,
    [0x94] = pk_op_memo,      ['q'] = pk_op_memo,       ['r'] = pk_op_memo,
    ['h'] = pk_op_memo,       ['j'] = pk_op_memo,       ['0'] = pk_op_stack,
    ['1'] = pk_op_stack,      ['2'] = pk_op_stack,      ['c'] = pk_op_object,
    [0x93] = pk_op_object,    ['R'] = pk_op_object,     [0x81] = pk_op_object,
    [0x92] = pk_op_object,    ['b'] = pk_op_object};

/* One opcode; 1 at STOP, 0 to go on, GMR_EINVAL on error. */
static int pk_step(pk_t *k, size_t *memo_next) {
  unsigned char op = *k->p++;
  pk_op_fn *f = pk_ops[op];
  return f != NULL ? f(k, op, memo_next) : pk_unknown(k, op);
}

/* Run the machine; the root value, or NULL with the error set. */
static pk_val_t *pk_load(pk_t *k) {
  size_t memo_next = 0;
  while (k->p < k->end) {
    int rc = pk_step(k, &memo_next);
    if (rc < 0) return NULL;
    if (rc == 1) {
      if (k->n_stack != 1 || k->n_marks != 0) {
        pk_fail(k, "malformed pickle: %zu values left at STOP", k->n_stack);
        return NULL;
      }
      return k->stack[0];
    }
  }
  pk_fail(k, "truncated pickle: no STOP before the end of the file");
  return NULL;
}

/* ---- the snapshot ------------------------------------------------------------------ */

static bool pk_is(const pk_val_t *v, const char *s) {
  return v && v->type == PK_STR && v->len == strlen(s) && memcmp(v->s, s, v->len) == 0;
}

/* The keys the walk asks for; a dict's index holds, for each, the value
 * of its first occurrence (Note [Shared values]). */
static const char *const pk_keys[] = {"action",  "addr",          "size",     "stream",
                                      "time_us", "frames",        "filename", "line",
                                      "name",    "device_traces", "segments", "blocks",
                                      "address", "device",        "state",    "requested_size"};
enum { PK_NKEYS = sizeof pk_keys / sizeof *pk_keys };

/* Index dict's known keys in one pass; false when host memory runs out. */
static bool pk_index(pk_val_t *dict) {
  const pk_val_t **index = gmr__calloc(PK_NKEYS, sizeof *index);
  if (index == NULL) return false;
  pk_cost.bytes += PK_NKEYS * sizeof *index;
  for (size_t i = 0; i + 1 < dict->n; i += 2) {
    const pk_val_t *key = dict->items[i];
    ++pk_cost.steps;
    if (key->type != PK_STR || key->len > 14) continue;
    for (size_t j = 0; j < PK_NKEYS; ++j)
      if (index[j] == NULL && pk_is(key, pk_keys[j])) index[j] = dict->items[i + 1];
  }
  dict->cache = (void *)index;
  return true;
}

static const pk_val_t *pk_get(const pk_val_t *dict, const char *key) {
  if (dict == NULL || dict->type != PK_DICT) return NULL;
  size_t j = 0;
  while (j < PK_NKEYS && strcmp(pk_keys[j], key) != 0)
    ++j;
  gmr_assert(j < PK_NKEYS);
  /* The dict is one of the reader's own values, in its chunks. */
  if (j < PK_NKEYS && (dict->cache != NULL || pk_index((pk_val_t *)dict))) {
    ++pk_cost.steps;
    return ((const pk_val_t *const *)dict->cache)[j];
  }
  for (size_t i = 0; i + 1 < dict->n; i += 2) { /* no memory for the index */
    ++pk_cost.steps;
    if (pk_is(dict->items[i], key)) return dict->items[i + 1];
  }
  return NULL;
}

/* The count of alloc entries of a device's history, counted once per list. */
static size_t pk_allocs(const pk_val_t *tr) {
  pk_val_t *t = (pk_val_t *)tr; /* one of the reader's own values */
  if (!(t->flags & PK_F_ALLOCS)) {
    size_t n = 0;
    for (size_t i = 0; i < t->n; ++i, ++pk_cost.steps)
      n += pk_is(pk_get(t->items[i], "action"), "alloc");
    t->i = (int64_t)n;
    t->flags |= PK_F_ALLOCS;
  }
  return (size_t)t->i;
}

static bool pk_int_of(const pk_val_t *v, int64_t *out) {
  if (v == NULL || (v->type != PK_INT && v->type != PK_BOOL)) return false;
  *out = v->i;
  return true;
}

/* Growing output text. */
typedef struct buf_s {
  char *p;
  size_t n, cap;
  bool oom;
} buf_t;

static void bprintf(buf_t *b, const char *fmt, ...) GMR_PRINTF(2, 3);

static void bprintf(buf_t *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if (b->p && b->n + (size_t)n < b->cap) {
      b->n += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap <= b->n + (size_t)n)
      cap *= 2;
    char *p = gmr__realloc(b->p, cap);
    if (p == NULL) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

/* The call site of an allocation: the innermost frame outside torch's own
 * files, else the innermost, as "file.py:LINE (name)" with the file's base
 * name; control characters become '?'.  Computed once per list of frames
 * (Note [Shared values]); out holds SNAP_SITE bytes. */
enum { SNAP_SITE = 400 };

static void snap_site_of(const pk_val_t *frames, char *out, size_t len);

static void snap_site(const pk_val_t *frames, char *out) {
  out[0] = '\0';
  if (frames == NULL || frames->type != PK_LIST || frames->n == 0) return;
  pk_val_t *f = (pk_val_t *)frames; /* one of the reader's own values */
  if (f->flags & PK_F_SITE) {
    if (f->cache != NULL) strcpy(out, f->cache);
    return;
  }
  snap_site_of(frames, out, SNAP_SITE);
  if (out[0] != '\0' && f->cache == NULL) {
    size_t n = strlen(out) + 1;
    if ((f->cache = gmr__malloc(n)) == NULL) return; /* computed again next time */
    memcpy(f->cache, out, n);
    pk_cost.bytes += n;
  }
  f->flags |= PK_F_SITE;
}

static void snap_site_of(const pk_val_t *frames, char *out, size_t len) {
  const pk_val_t *pick = NULL;
  for (size_t i = 0; i < frames->n && pick == NULL; ++i, ++pk_cost.steps) {
    const pk_val_t *fn = pk_get(frames->items[i], "filename");
    if (fn && fn->type == PK_STR && memmem(fn->s, fn->len, "/torch/", 7) == NULL)
      pick = frames->items[i];
  }
  if (pick == NULL) pick = frames->items[0];
  const pk_val_t *fn = pk_get(pick, "filename"), *name = pk_get(pick, "name");
  int64_t line = 0;
  pk_int_of(pk_get(pick, "line"), &line);
  if (fn == NULL || fn->type != PK_STR) return;
  const char *base = fn->s;
  size_t blen = fn->len;
  for (size_t i = 0; i < fn->len; ++i)
    if (fn->s[i] == '/') base = fn->s + i + 1, blen = fn->len - i - 1;
  int n = snprintf(out, len, "%.*s:%" PRId64, (int)(blen > 200 ? 200 : blen), base, line);
  if (name && name->type == PK_STR && n > 0 && (size_t)n < len)
    snprintf(out + n, len - (size_t)n, " (%.*s)", (int)(name->len > 120 ? 120 : name->len),
             name->s);
  for (char *c = out; *c; ++c)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
}

/* Live addresses of the history, for frees of allocations it never saw: an
 * AVL tree like the trace reader's (core/avl.h; a hash of chosen addresses
 * made them collide: Note [Shared values]).  pk_cost counts a step per
 * level of the tree for each operation. */
static void live_cost(const gmr_avl_t *l) {
  pk_cost.steps += l->root ? (uint64_t)l->root->height : 1;
}

static bool live_has(const gmr_avl_t *l, int64_t a) {
  live_cost(l);
  return gmr__avl_find(l, (uint64_t)a) != NULL;
}

static bool live_add(gmr_avl_t *l, int64_t a) {
  live_cost(l);
  if (l->spare == NULL) pk_cost.bytes += sizeof(gmr_avl_node_t); /* a new node */
  return gmr__avl_insert(l, (uint64_t)a, 0, 0) >= 0;
}

static void live_remove(gmr_avl_t *l, int64_t a) {
  live_cost(l);
  gmr__avl_erase(l, (uint64_t)a);
}

bool gmr__is_pickle(const char *text, size_t len) {
  return len >= 2 && (unsigned char)text[0] == 0x80 && (unsigned char)text[1] >= 2 &&
         (unsigned char)text[1] <= 5;
}

/* The device whose trace has the most alloc entries; -1 when none has any. */
static int snap_busiest(const pk_val_t *traces, size_t *out_allocs, int *out_busy) {
  int best = -1;
  size_t most = 0;
  *out_busy = 0;
  for (size_t d = 0; d < traces->n; ++d) {
    const pk_val_t *tr = traces->items[d];
    ++pk_cost.steps;
    if (tr->type != PK_LIST) continue;
    size_t n = pk_allocs(tr);
    if (n > 0) ++*out_busy;
    if (n > most) most = n, best = (int)d;
  }
  *out_allocs = most;
  return best;
}

/* The stream's number: 0 for the default stream, then 1, 2... in order of
 * first use (as snapshot2csv.py numbers them); streams beyond the
 * SNAP_STREAMS-th share the last number (no program uses that many). */
enum { SNAP_STREAMS = 256 };

static int64_t snap_stream(gmr_avl_t *seen, bool *oom, int64_t s) {
  if (s == 0) return 0;
  live_cost(seen);
  const gmr_avl_node_t *n = gmr__avl_find(seen, (uint64_t)s);
  if (n != NULL) return (int64_t)n->val;
  if (seen->count < SNAP_STREAMS &&
      gmr__avl_insert(seen, (uint64_t)s, (uint64_t)seen->count + 1, 0) < 0)
    *oom = true;
  return (int64_t)seen->count;
}

/* The root of the snapshot and the history of its busiest device (*dev,
 * with *allocs allocations; *busy devices have some); NULL with the error
 * set when the pickle holds no such history. */
static const pk_val_t *snap_history(pk_t *k, size_t *allocs, int *busy, int *dev) {
  const pk_val_t *root = pk_load(k);
  if (root == NULL) return NULL;
  if (root->type == PK_LIST) {
    pk_fail(k, "this pickle is a list (torch.cuda.memory_snapshot()'s segments), which has no "
               "history; dump the snapshot with torch.cuda.memory._dump_snapshot() after "
               "torch.cuda.memory._record_memory_history(max_entries=N)");
    return NULL;
  }
  if (root->type != PK_DICT) {
    pk_fail(k, "not a memory snapshot: the pickle does not hold a dict");
    return NULL;
  }
  const pk_val_t *traces = pk_get(root, "device_traces");
  if (traces == NULL || traces->type != PK_LIST) {
    pk_fail(k, "the snapshot has no device_traces: the history was not recorded; call "
               "torch.cuda.memory._record_memory_history(max_entries=N) before the program "
               "allocates, then torch.cuda.memory._dump_snapshot()");
    return NULL;
  }
  *dev = snap_busiest(traces, allocs, busy);
  if (*dev < 0) {
    pk_fail(k,
            "the snapshot's device_traces hold no alloc entry (%zu device%s): the history was "
            "not recording while the program allocated (record it with "
            "torch.cuda.memory._record_memory_history before the first allocation)",
            traces->n, traces->n == 1 ? "" : "s");
    return NULL;
  }
  return traces->items[*dev];
}

/* What the reader left out or assumed, as one note (NULL when nothing was;
 * *oom when it could not be kept). */
static char *snap_note(int busy, int dev, size_t allocs, size_t unknown, size_t supplied,
                       bool *oom) {
  char note[1024] = "";
  size_t off = 0;
  if (busy > 1)
    off += (size_t)snprintf(note + off, sizeof note - off,
                            "%d devices have allocations; device %d has the most (%zu) and is "
                            "the one replayed. ",
                            busy, dev, allocs);
  if (unknown)
    off += (size_t)snprintf(
        note + off, sizeof note - off,
        "The history starts in the middle of the run: %zu free%s of allocations made before "
        "it began %s left out (PyTorch's ring buffer dropped the beginning; record with a "
        "larger _record_memory_history(max_entries=N), or convert with snapshot2csv.py "
        "--reconstruct). ",
        unknown, unknown == 1 ? "" : "s", unknown == 1 ? "is" : "are");
  if (supplied && off < sizeof note)
    off += (size_t)snprintf(note + off, sizeof note - off,
                            "%zu allocation%s of an address still live had no free_completed "
                            "before %s: one was supplied. ",
                            supplied, supplied == 1 ? "" : "s", supplied == 1 ? "it" : "them");
  if (off > 0 && off < sizeof note) note[off - 1] = '\0'; /* the last space */
  char *out = note[0] ? gmr__strdup(note) : NULL;
  *oom = note[0] && out == NULL;
  return out;
}

/* Rows made so far go to the sink once SNAP_FLUSH bytes of them are waiting
 * (Note [Shared values]); 0, or the sink's error. */
enum { SNAP_FLUSH = 1 << 16 };

static int snap_flush(buf_t *b, gmr__csv_sink_fn *sink, void *ud, bool last) {
  if (b->oom || b->n == 0 || (!last && b->n < SNAP_FLUSH)) return 0;
  int rc = sink(ud, b->p, b->n);
  b->n = 0;
  return rc;
}

/* The snapshot as trace CSV (Note [Snapshot layout]), handed to sink in
 * chunks of whole lines. */
int gmr__snapshot_to_csv(const char *text, size_t len, const char *name, gmr__csv_sink_fn *sink,
                         void *ud, char **out_note, size_t *failures, uint64_t *failure_bytes,
                         uint32_t *first_failure, char *err, size_t errlen) {
  pk_cost = (gmr__snapshot_cost_t){0};
  pk_t k = {.p = (const unsigned char *)text,
            .end = (const unsigned char *)text + len,
            .len = len,
            .err = err,
            .errlen = errlen,
            .name = name};
  buf_t b = {0};
  gmr_avl_t live = {0}, streams = {0};
  bool oom = false;
  int rc = GMR_EINVAL;
  size_t allocs = 0;
  int busy = 0, dev = 0;
  const pk_val_t *tr = snap_history(&k, &allocs, &busy, &dev);
  if (tr == NULL) goto done;
  size_t unknown = 0, supplied = 0;
  *failures = 0, *failure_bytes = 0, *first_failure = 0;
  for (size_t i = 0; i < tr->n && !b.oom && !oom; ++i) {
    const pk_val_t *e = tr->items[i], *act = pk_get(e, "action");
    int64_t addr = 0, size = 0, stream = 0, time_us = 0;
    ++pk_cost.steps;
    bool has_addr = pk_int_of(pk_get(e, "addr"), &addr);
    pk_int_of(pk_get(e, "size"), &size);
    pk_int_of(pk_get(e, "stream"), &stream);
    pk_int_of(pk_get(e, "time_us"), &time_us);
    if (time_us < 0) time_us = 0;
    if (pk_is(act, "alloc")) {
      if (!has_addr || addr <= 0 || size <= 0) {
        pk_fail(&k, "trace entry %zu: an alloc without a positive addr and size", i + 1);
        goto done;
      }
      if (live_has(&live, addr)) { /* its free_completed is missing: free it first */
        bprintf(&b, "0,%" PRId64 ",free,%#" PRIx64 ",0,0\n", time_us, (uint64_t)addr);
        live_remove(&live, addr);
        ++supplied;
      }
      char site[SNAP_SITE];
      snap_site(pk_get(e, "frames"), site);
      bprintf(&b, "0,%" PRId64 ",allocate,%#" PRIx64 ",%" PRId64 ",%" PRId64 "%s%s\n", time_us,
              (uint64_t)addr, size, snap_stream(&streams, &oom, stream), site[0] ? "," : "", site);
      if (!live_add(&live, addr)) b.oom = true;
    } else if (pk_is(act, "free_completed") || pk_is(act, "free")) {
      if (has_addr && addr > 0 && live_has(&live, addr)) {
        bprintf(&b, "0,%" PRId64 ",free,%#" PRIx64 ",%" PRId64 ",%" PRId64 "\n", time_us,
                (uint64_t)addr, size, snap_stream(&streams, &oom, stream));
        live_remove(&live, addr);
      } else {
        bprintf(&b, "# free of %#" PRIx64 ", allocated before the history starts: left out\n",
                (uint64_t)addr);
        ++unknown;
      }
    } else if (pk_is(act, "oom")) {
      if ((*failures)++ == 0) *first_failure = (uint32_t)(i + 1);
      *failure_bytes += size > 0 ? (uint64_t)size : 0;
      bprintf(&b, "# oom: the allocation of %" PRId64 " bytes failed in the recording\n", size);
    } else {
      /* The action's name as a comment: one line, whatever bytes it holds. */
      char what[64] = "?";
      if (act && act->type == PK_STR && act->len < sizeof what) {
        for (size_t c = 0; c < act->len; ++c)
          what[c] = (unsigned char)act->s[c] < 0x20 || act->s[c] == 0x7f ? '?' : act->s[c];
        what[act->len] = '\0';
      }
      bprintf(&b, "# %s\n", what);
    }
    if ((rc = snap_flush(&b, sink, ud, false)) != 0) goto done;
    rc = GMR_EINVAL;
  }
  if (b.oom || oom) {
    pk_fail(&k, "out of host memory converting the snapshot");
    goto done;
  }
  bool note_oom = false;
  *out_note = snap_note(busy, dev, allocs, unknown, supplied, &note_oom);
  if (note_oom) {
    pk_fail(&k, "out of host memory converting the snapshot");
    goto done;
  }
  if ((rc = snap_flush(&b, sink, ud, true)) != 0) {
    gmr__free(*out_note);
    *out_note = NULL;
  }
done:
  pk_cost.bytes += b.cap; /* the rows waiting for the sink */
  gmr__free(b.p);
  gmr__avl_clear(&live, NULL, NULL);
  gmr__avl_clear(&streams, NULL, NULL);
  pk_release(&k);
  return rc;
}

/* ---- snapshot2csv's CSV (gmr_snapshot_csv) --------------------------------------- */

/* Note [Two CSVs of a snapshot]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 * gmr_trace_read's CSV (gmr__snapshot_to_csv above) keeps CSV line N = trace
 * entry N, with a comment for each entry it skips, so that messages can
 * name entries.  gmr_snapshot_csv writes the CSV of tools/snapshot2csv.py
 * for people to keep: one chosen device, allocations and frees only (a free
 * carries its allocation's size and stream), the call sites on request,
 * and, with reconstruct, an allocation at the start for each free of an
 * address the history never allocated and each block the snapshot shows
 * allocated that the history never allocated (in address order, at the
 * first entry's time).  Its reader is strict (Note [Hostile pickles],
 * pk_global_refused), and its messages and warnings are snapshot2csv's. */

typedef struct sx_s {
  const gmr_snapshot_csv_options_t *o;
  buf_t csv, warn;
  gmr_avl_t live;    /* address -> val: size, aux: index into sizes of the stream number */
  gmr_avl_t streams; /* raw stream id -> its number, 1, 2... by first use (0 stays 0) */
  uint64_t requested;
  gmr_snapshot_csv_t *out;
  bool oom;
} sx_t;

static int64_t sx_stream(sx_t *x, int64_t s) {
  if (s == 0) return 0;
  live_cost(&x->streams);
  const gmr_avl_node_t *n = gmr__avl_find(&x->streams, (uint64_t)s);
  if (n != NULL) return (int64_t)n->val;
  if (gmr__avl_insert(&x->streams, (uint64_t)s, (uint64_t)x->streams.count + 1, 0) < 0) {
    x->oom = true;
    return 0;
  }
  return (int64_t)x->streams.count;
}

static void sx_allocate(sx_t *x, int64_t t, int64_t a, int64_t size, int64_t stream,
                        const char *site) {
  bprintf(&x->csv, "0,%" PRId64 ",allocate,%#" PRIx64 ",%" PRId64 ",%" PRId64 "%s%s\n", t,
          (uint64_t)a, size, stream, site[0] ? "," : "", site);
  if (gmr__avl_insert(&x->live, (uint64_t)a, (uint64_t)size, (uint32_t)stream) != 0) x->oom = true;
  x->requested += (uint64_t)size;
  if (x->requested > x->out->peak_requested) x->out->peak_requested = x->requested;
  ++x->out->allocations;
}

/* The free of live address a (its node n). */
static void sx_free(sx_t *x, int64_t t, gmr_avl_node_t *n) {
  int64_t a = (int64_t)n->key, size = (int64_t)n->val, stream = (int64_t)n->aux;
  bprintf(&x->csv, "0,%" PRId64 ",free,%#" PRIx64 ",%" PRId64 ",%" PRId64 "\n", t, (uint64_t)a,
          size, stream);
  gmr__avl_erase(&x->live, (uint64_t)a);
  x->requested -= (uint64_t)size;
  ++x->out->frees;
}

static int64_t sx_int(const pk_val_t *v, int64_t dflt) {
  int64_t i = dflt;
  return pk_int_of(v, &i) ? i : dflt;
}

/* The device to convert: the one asked for, or the one with the most
 * allocations (a warning when several have some); -1 with err set. */
static int sx_device(sx_t *x, const pk_val_t *traces, char *err, size_t errlen) {
  int best = -1;
  size_t most = 0, busy = 0;
  char list[512] = "";
  size_t off = 0;
  for (size_t d = 0; d < traces->n; ++d) {
    size_t n = pk_allocs(traces->items[d]);
    ++pk_cost.steps;
    if (n > 0 && off < sizeof list)
      off += (size_t)snprintf(list + off, sizeof list - off, "%s%zu", busy ? ", " : "", d);
    busy += n > 0;
    if (n > most) most = n, best = (int)d;
  }
  if (x->o && x->o->has_device) {
    if (x->o->device < 0 || (size_t)x->o->device >= traces->n) {
      snprintf(err, errlen, "device %d: the snapshot has traces for devices 0..%d", x->o->device,
               (int)traces->n - 1);
      return -1;
    }
    return x->o->device;
  }
  if (best < 0) {
    snprintf(err, errlen,
             "no device has any alloc entry: was the history recorded "
             "(_record_memory_history) while the program allocated?");
    return -1;
  }
  if (busy > 1)
    bprintf(&x->warn,
            "devices [%s] have allocations; converting device %d (the most: %zu); choose "
            "another with --device\n",
            list, best, most);
  return best;
}

/* An allocation at the start for each (address, size, raw stream) in
 * `start`, in address order. */
static void sx_start_walk(sx_t *x, const gmr_avl_node_t *n, int64_t t0, const int64_t *raw) {
  if (n == NULL) return;
  sx_start_walk(x, n->child[0], t0, raw);
  sx_allocate(x, t0, (int64_t)n->key, (int64_t)n->val, sx_stream(x, raw[n->aux]), "");
  sx_start_walk(x, n->child[1], t0, raw);
}

/* Reconstruct: what the history missed, allocated at its start (Note [Two
 * CSVs of a snapshot]). */
static void sx_reconstruct(sx_t *x, const pk_val_t *root, const pk_val_t *tr, int64_t device) {
  gmr_avl_t seen = {0}, allocated = {0}, start = {0};
  int64_t *raw = gmr__malloc((tr->n + 1) * sizeof *raw);
  size_t n_raw = 0;
  if (raw == NULL) x->oom = true;
  for (size_t i = 0; raw && i < tr->n; ++i) {
    const pk_val_t *e = tr->items[i], *act = pk_get(e, "action");
    uint64_t a = (uint64_t)sx_int(pk_get(e, "addr"), 0);
    ++pk_cost.steps;
    if (pk_is(act, "alloc")) {
      if (gmr__avl_find(&seen, a) == NULL && gmr__avl_insert(&seen, a, 0, 0) != 0) x->oom = true;
      if (gmr__avl_find(&allocated, a) == NULL && gmr__avl_insert(&allocated, a, 0, 0) != 0)
        x->oom = true;
    } else if (pk_is(act, "free_completed") || pk_is(act, "free")) {
      if (gmr__avl_find(&seen, a) != NULL) {
        gmr__avl_erase(&seen, a);
      } else if (gmr__avl_find(&start, a) == NULL) {
        raw[n_raw] = sx_int(pk_get(e, "stream"), 0);
        if (gmr__avl_insert(&start, a, (uint64_t)sx_int(pk_get(e, "size"), 0), (uint32_t)n_raw++) !=
            0)
          x->oom = true;
      }
    }
  }
  /* Blocks the snapshot shows allocated that the history never allocated:
   * each segment and each list of blocks read once (Note [Shared values]). */
  const pk_val_t *segs = pk_get(root, "segments");
  size_t n_blocks = 0;
  for (size_t s = 0; segs && segs->type == PK_LIST && s < segs->n; ++s) {
    pk_val_t *blocks = (pk_val_t *)pk_get(segs->items[s], "blocks");
    ++pk_cost.steps;
    if (blocks && blocks->type == PK_LIST && !(blocks->flags & PK_F_BLOCKS_COUNTED)) {
      n_blocks += blocks->n;
      blocks->flags |= PK_F_BLOCKS_COUNTED;
    }
  }
  int64_t *more = raw ? gmr__realloc(raw, (tr->n + n_blocks + 1) * sizeof *raw) : NULL;
  if (more == NULL) x->oom = true;
  raw = more ? more : raw;
  for (size_t s = 0; more && segs && segs->type == PK_LIST && s < segs->n; ++s) {
    pk_val_t *seg = segs->items[s], *blocks = (pk_val_t *)pk_get(seg, "blocks");
    ++pk_cost.steps;
    if (sx_int(pk_get(seg, "device"), device) != device || (seg->flags & PK_F_SEGMENT_READ))
      continue;
    seg->flags |= PK_F_SEGMENT_READ;
    if (blocks && blocks->type == PK_LIST) {
      if (blocks->flags & PK_F_BLOCKS_READ) continue;
      blocks->flags |= PK_F_BLOCKS_READ;
    }
    int64_t addr = sx_int(pk_get(seg, "address"), 0);
    for (size_t b = 0; blocks && blocks->type == PK_LIST && b < blocks->n; ++b) {
      const pk_val_t *blk = blocks->items[b];
      ++pk_cost.steps;
      int64_t a = sx_int(pk_get(blk, "address"), addr), size = sx_int(pk_get(blk, "size"), 0);
      int64_t req = sx_int(pk_get(blk, "requested_size"), 0);
      if (pk_is(pk_get(blk, "state"), "active_allocated") &&
          gmr__avl_find(&allocated, (uint64_t)a) == NULL &&
          gmr__avl_find(&start, (uint64_t)a) == NULL) {
        raw[n_raw] = sx_int(pk_get(seg, "stream"), 0);
        if (gmr__avl_insert(&start, (uint64_t)a, (uint64_t)(req ? req : size), (uint32_t)n_raw++))
          x->oom = true;
      }
      addr = (int64_t)((uint64_t)a + (uint64_t)size); /* wraps: the file chose both */
    }
  }
  int64_t t0 = tr->n ? sx_int(pk_get(tr->items[0], "time_us"), 0) : 0;
  if (!x->oom) sx_start_walk(x, start.root, t0, raw);
  x->out->reconstructed = start.count;
  gmr__avl_clear(&seen, NULL, NULL);
  gmr__avl_clear(&allocated, NULL, NULL);
  gmr__avl_clear(&start, NULL, NULL);
  gmr__free(raw);
}

/* The history's entries as rows (Note [Two CSVs of a snapshot]); GMR_EINVAL
 * with err set on an alloc it cannot write. */
static int sx_entries(sx_t *x, const pk_val_t *tr, char *err, size_t errlen) {
  bool sites = x->o && x->o->sites;
  for (size_t i = 0; i < tr->n && !x->oom && !x->csv.oom; ++i) {
    const pk_val_t *e = tr->items[i], *act = pk_get(e, "action");
    ++pk_cost.steps;
    int64_t t = sx_int(pk_get(e, "time_us"), (int64_t)i), a = sx_int(pk_get(e, "addr"), 0);
    if (pk_is(act, "alloc")) {
      int64_t size = sx_int(pk_get(e, "size"), 0);
      if (a <= 0 || size <= 0) {
        snprintf(err, errlen, "trace entry %zu: an alloc without a positive addr and size", i);
        return GMR_EINVAL;
      }
      gmr_avl_node_t *n = gmr__avl_find(&x->live, (uint64_t)a);
      if (n != NULL) { /* its free was never recorded: free it here */
        bprintf(&x->warn,
                "entry %zu: alloc of %#" PRIx64 ", which is still live: a free_completed is "
                "missing; freeing it first\n",
                i, (uint64_t)a);
        sx_free(x, t, n);
      }
      char site[SNAP_SITE] = "";
      if (sites) snap_site(pk_get(e, "frames"), site);
      sx_allocate(x, t, a, size, sx_stream(x, sx_int(pk_get(e, "stream"), 0)), site);
    } else if (pk_is(act, "free_completed") || pk_is(act, "free")) {
      gmr_avl_node_t *n = a > 0 ? gmr__avl_find(&x->live, (uint64_t)a) : NULL;
      if (n != NULL)
        sx_free(x, t, n);
      else
        ++x->out->unknown_frees;
    }
  }
  return 0;
}

/* The root's checks, in snapshot2csv's words; the trace list, or NULL with
 * err set. */
static const pk_val_t *sx_traces(const pk_val_t *root, const char *name, char *err, size_t errlen) {
  static const char *const type_names[] = {"NoneType", "bool", "int",  "int",   "float",
                                           "str",      "list", "dict", "tuple", "object"};
  if (root->type != PK_DICT) {
    snprintf(err, errlen, "%s: a memory snapshot is a dict, this pickle holds a %s", name,
             type_names[root->type]);
    return NULL;
  }
  const pk_val_t *traces = pk_get(root, "device_traces");
  if (traces == NULL) {
    snprintf(err, errlen,
             "%s: the snapshot has no device_traces: record the history before dumping it, "
             "with torch.cuda.memory._record_memory_history(max_entries=N)",
             name);
    return NULL;
  }
  bool lists = traces->type == PK_LIST;
  for (size_t d = 0; lists && d < traces->n; ++d)
    lists = traces->items[d]->type == PK_LIST;
  if (!lists) snprintf(err, errlen, "device_traces is not a list of lists of trace entries");
  return lists ? traces : NULL;
}

int gmr_snapshot_csv(const void *data, size_t len, const char *name,
                     const gmr_snapshot_csv_options_t *opts, gmr_snapshot_csv_t **out, char *err,
                     size_t errlen) {
  char why[1024] = "";
  if (err == NULL || errlen == 0) err = why, errlen = sizeof why;
  err[0] = '\0';
  if (name == NULL) name = "snapshot";
  *out = NULL;
  pk_cost = (gmr__snapshot_cost_t){0};
  pk_t k = {.p = data,
            .end = (const unsigned char *)data + len,
            .len = len,
            .err = why,
            .errlen = sizeof why,
            .name = name,
            .strict = true};
  sx_t x = {.o = opts, .out = gmr__calloc(1, sizeof *x.out)};
  int rc = GMR_EINVAL;
  const pk_val_t *root = NULL, *traces = NULL;
  if (x.out == NULL) {
    snprintf(err, errlen, "%s: out of host memory reading the snapshot", name);
    rc = GMR_ENOMEM;
  } else if (!gmr__is_pickle(data, len)) {
    snprintf(err, errlen, "%s: not a readable memory snapshot pickle (it does not start like one)",
             name);
  } else if ((root = pk_load(&k)) == NULL) {
    size_t skip = strlen(name) + 2; /* pk_fail's "NAME: " */
    snprintf(err, errlen, "%s: not a readable memory snapshot pickle (%s)", name,
             strlen(why) > skip ? why + skip : why);
  } else if ((traces = sx_traces(root, name, err, errlen)) != NULL) {
    int device = sx_device(&x, traces, err, errlen);
    if (device >= 0) {
      const pk_val_t *tr = traces->items[device];
      x.out->device = device;
      bprintf(&x.csv, "Thread,Time,Action,Pointer,Size,Stream%s\n",
              opts && opts->sites ? ",Site" : "");
      if (opts && opts->reconstruct) sx_reconstruct(&x, root, tr, device);
      rc = sx_entries(&x, tr, err, errlen);
    }
  }
  if (rc == 0) {
    if (x.out->unknown_frees && !(opts && opts->reconstruct))
      bprintf(&x.warn,
              "%zu frees of addresses the history never allocated: the ring buffer dropped the "
              "beginning of the run (record with a larger max_entries, or pass --reconstruct "
              "to allocate them at the start); those frees are left out\n",
              x.out->unknown_frees);
    else if (x.out->unknown_frees)
      bprintf(&x.warn,
              "the ring buffer dropped the beginning of the run: %zu allocations made before "
              "the history starts were put at its start\n",
              x.out->reconstructed);
    bprintf(&x.csv, "%s", "");
    bprintf(&x.warn, "%s", "");
    if (x.oom || x.csv.oom || x.warn.oom) {
      snprintf(err, errlen, "%s: out of host memory converting the snapshot", name);
      rc = GMR_ENOMEM;
    }
  }
  if (rc == 0) {
    x.out->live_at_end = x.live.count;
    x.out->csv = x.csv.p, x.out->csv_len = x.csv.n, x.out->warnings = x.warn.p;
    x.csv.p = x.warn.p = NULL;
    *out = x.out;
    x.out = NULL;
  }
  gmr_snapshot_csv_free(x.out);
  gmr__free(x.csv.p);
  gmr__free(x.warn.p);
  gmr__avl_clear(&x.streams, NULL, NULL);
  gmr__avl_clear(&x.live, NULL, NULL);
  pk_release(&k);
  return rc;
}

void gmr_snapshot_csv_free(gmr_snapshot_csv_t *s) {
  if (s == NULL) return;
  gmr__free(s->csv);
  gmr__free(s->warnings);
  gmr__free(s);
}
