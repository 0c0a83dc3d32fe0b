/* replay.c: reading allocation traces and replaying them on a runtime.
 *
 * The reader turns RMM's replay-log CSV into an array of events in which
 * every allocation has a dense id (0, 1, 2, ... in file order), so the
 * replayer maps ids to its own pointers in a flat array and never needs the
 * recorded addresses again.  Every problem names its line.
 *
 * gmr_trace_read streams: it parses the file chunk by chunk (see "the
 * streaming reader"), so a trace costs its events, not its text, and a
 * progress callback sees the bytes read as they go.  The replayer: see
 * Note [Replay peak].
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/avl.h"
#include "core/internal.h"
#include "gmr_replay.h"
#include "observe/history.h"
#include "replay/replay-formats.h"
#include "runtime/runtime.h"

/* ---- live pointer -> id map ------------------------------------------------
 * An AVL tree (core/avl.h): recorded pointers are chosen by whoever wrote the
 * trace, so the map must cost O(log n) per event whatever they are (a hash
 * table keyed by them degrades to a list when they are chosen to collide).
 * Node payload: val = the allocation's id, aux = its line. */

/* ---- the parser -------------------------------------------------------------- */

typedef struct parser_s {
  const char *name;
  char *err;
  size_t errlen;
  uint32_t line;
} parser_t;

static int perr(parser_t *p, const char *fmt, ...) GMR_PRINTF(2, 3);

static int perr(parser_t *p, const char *fmt, ...) {
  if (p->err == NULL || p->errlen == 0) return GMR_EINVAL;
  int n = snprintf(p->err, p->errlen, "%s:%u: ", p->name, (unsigned)p->line);
  if (n < 0 || (size_t)n >= p->errlen) return GMR_EINVAL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return GMR_EINVAL;
}

/* Split one line into its comma-separated fields (trimmed): 6, or 7 when a
 * call site follows (the 7th is the rest of the line, commas included); one
 * pass over the line. */
static int split_fields(char *s, char **f) {
  int n = 0;
  for (;;) {
    while (*s == ' ' || *s == '\t')
      ++s;
    f[n++] = s;
    char *c = s;
    while (*c != '\0' && (*c != ',' || n == 7))
      ++c;
    char *end = c;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
      --end;
    bool more = *c == ',';
    *end = '\0';
    if (!more) break;
    s = c + 1;
  }
  return n;
}

/* strtoull(s, &end, base) over the whole of s, refusing signs and
 * overflow.  Decimal digits, and 0x-hexadecimal with base 0, are parsed
 * inline (the reader's hot path); anything else goes to strtoull. */
static inline bool parse_u64(const char *s, int base, uint64_t *out) {
  if (*s == '\0' || *s == '-' || *s == '+') return false;
  uint64_t v = 0;
  const char *q = s;
  if (base == 0 && q[0] == '0' && (q[1] == 'x' || q[1] == 'X') && q[2] != '\0') {
    for (q += 2; *q != '\0'; ++q) {
      unsigned d = (unsigned)(*q - '0');
      if (d > 9) {
        d = (unsigned)((*q | 0x20) - 'a');
        if (d > 5) goto general;
        d += 10;
      }
      if (v >> 60) return false; /* would overflow */
      v = v << 4 | d;
    }
    *out = v;
    return true;
  }
  if (base == 0 && q[0] == '0' && q[1] != '\0') goto general; /* octal */
  for (int n = 0; *q != '\0'; ++q, ++n) {
    unsigned d = (unsigned)(*q - '0');
    if (d > 9) goto general;
    if (n < 19) /* 19 digits always fit in 64 bits */
      v = v * 10 + d;
    else if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, d, &v))
      return false;
  }
  *out = v;
  return true;
general:;
  char *end;
  errno = 0;
  unsigned long long w = strtoull(s, &end, base);
  if (errno != 0 || *end != '\0') return false;
  *out = w;
  return true;
}

typedef struct streams_s {
  uint64_t ids[64];
  size_t n;
  bool overflow; /* more than 64 distinct: counted approximately */
} streams_t;

static void note_stream(streams_t *s, uint64_t id) {
  for (size_t i = 0; i < s->n; ++i)
    if (s->ids[i] == id) return;
  if (s->n < 64)
    s->ids[s->n++] = id;
  else
    s->overflow = true;
}

static int parse_line(parser_t *p, char *line, gmr_trace_data_t *t, gmr_avl_t *live, size_t *cap,
                      streams_t *streams, gmr__sites_t *sites) {
  char *f[7];
  int n = split_fields(line, f);
  if (n < 6)
    return perr(p,
                "expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream), "
                "found %s",
                n < 0    ? "more"
                : n == 1 ? "1"
                : n == 2 ? "2"
                : n == 3 ? "3"
                : n == 4 ? "4"
                         : "5");
  uint64_t thread, time_us, size = 0, stream = 0, ptr = 0;
  if (!parse_u64(f[0], 10, &thread)) return perr(p, "Thread '%s' is not an integer", f[0]);
  if (!gmr__trace_parse_time(f[1], &time_us))
    return perr(p,
                "Time '%s' is not a time (integer microseconds, HH:MM:SS.ffffff, or seconds "
                "with a fraction)",
                f[1]);
  int action = gmr__trace_parse_action(f[2]);
  if (action < 0)
    return perr(p,
                "unknown Action '%s'; expected allocate, free (or deallocate), record_stream, "
                "empty_cache or allocate failure",
                f[2]);
  if (action != GMR_TRACE_EMPTY_CACHE && action != GMR__TRACE_ALLOC_FAILURE &&
      (!gmr__trace_parse_handle(f[3], &ptr) || ptr == 0))
    return perr(p, "Pointer '%s' is not a nonzero integer (hexadecimal with 0x, or decimal)", f[3]);
  /* empty_cache ignores Pointer, Size and Stream (docs/trace-format.md). */
  if (action != GMR_TRACE_EMPTY_CACHE) {
    if (!parse_u64(f[4], 10, &size)) return perr(p, "Size '%s' is not a byte count", f[4]);
    if (!gmr__trace_parse_handle(f[5], &stream))
      return perr(p, "Stream '%s' is not an integer or a pointer", f[5]);
  }
  if (action == GMR__TRACE_ALLOC_FAILURE) {
    /* The recording's allocator failed: counted and reported, not replayed. */
    if (t->n_alloc_failures++ == 0) t->first_alloc_failure_line = p->line;
    t->alloc_failure_bytes += size;
    return 0;
  }
  if (t->n_events == *cap) {
    size_t c = *cap ? *cap * 2 : 4096;
    gmr_trace_event_t *e =
        c <= SIZE_MAX / sizeof *e ? gmr__realloc(t->events, c * sizeof *e) : NULL;
    if (e == NULL) return perr(p, "out of host memory");
    t->events = e;
    *cap = c;
  }
  gmr_trace_event_t *ev = &t->events[t->n_events];
  *ev = (gmr_trace_event_t){.time_us = time_us,
                            .size = size,
                            .stream = stream,
                            .line = p->line,
                            .action = (uint8_t)action,
                            .thread = (uint8_t)thread};
  gmr_avl_node_t *slot = action == GMR_TRACE_EMPTY_CACHE ? NULL : gmr__avl_find(live, ptr);
  switch (action) {
  case GMR_TRACE_ALLOC:
    if (size == 0) return perr(p, "allocation of 0 bytes");
    if (slot != NULL)
      return perr(p, "allocate of %s, which is still live (allocated at line %u and not freed)",
                  f[3], (unsigned)slot->aux);
    if (t->n_ids >= UINT32_MAX) return perr(p, "more than 4 billion allocations");
    ev->id = (uint32_t)t->n_ids++;
    if (gmr__avl_insert(live, ptr, ev->id, p->line) != 0) return perr(p, "out of host memory");
    if (n == 7 && f[6][0] != '\0' && (ev->site = gmr__sites_intern(sites, f[6])) == 0)
      return perr(p, "out of host memory");
    break;
  case GMR_TRACE_FREE:
    if (slot == NULL)
      return perr(p, "free of %s, which is not live (never allocated, or already freed)", f[3]);
    ev->id = (uint32_t)slot->val; /* its size is the allocation's: set in finish() */
    gmr__avl_erase(live, ptr);
    break;
  case GMR_TRACE_RECORD_STREAM:
    if (slot == NULL) return perr(p, "record_stream of %s, which is not live", f[3]);
    ev->id = (uint32_t)slot->val;
    break;
  default:
    break;
  }
  if (action != GMR_TRACE_EMPTY_CACHE) note_stream(streams, stream);
  ++t->n_events;
  return 0;
}

/* Give every free its allocation's size, and compute the peak of requested
 * bytes: peak_requested = max over events of Σ sizes of live allocations,
 * summed in 128 bits (up to 2^32 sizes of up to 2^64 - 1 bytes) and reported
 * as UINT64_MAX when it does not fit in 64. */
static int finish(gmr_trace_data_t *t) {
  uint64_t *size_of = gmr__malloc((t->n_ids ? t->n_ids : 1) * sizeof *size_of);
  if (size_of == NULL) return GMR_ENOMEM;
  unsigned __int128 cur = 0, peak = 0;
  for (size_t i = 0; i < t->n_events; ++i) {
    gmr_trace_event_t *e = &t->events[i];
    if (e->action == GMR_TRACE_ALLOC) size_of[e->id] = e->size, cur += e->size;
    if (e->action == GMR_TRACE_FREE) e->size = size_of[e->id], cur -= e->size;
    if (cur > peak) peak = cur;
  }
  t->peak_requested = peak > UINT64_MAX ? UINT64_MAX : (uint64_t)peak;
  gmr__free(size_of);
  return 0;
}

/* The 1-based line of text[off]. */
static uint32_t line_at(const char *text, size_t off) {
  uint32_t line = 1;
  for (size_t i = 0; i < off; ++i)
    if (text[i] == '\n' && line < UINT32_MAX) ++line;
  return line;
}

static int parse_snapshot(const char *text, size_t len, const char *name, gmr_trace_data_t **out,
                          char *err, size_t errlen);

int gmr_trace_parse(const char *text, size_t len, const char *name, gmr_trace_data_t **out,
                    char *err, size_t errlen) {
  if (text == NULL || out == NULL) return GMR_EINVAL;
  if (gmr__is_pickle(text, len))
    return parse_snapshot(text, len, name ? name : "<trace>", out, err, errlen);
  parser_t p = {name ? name : "<trace>", err, errlen, 0};
  if (err && errlen) err[0] = '\0';
  /* A trace is read whole or not at all: a NUL byte would end the text
   * early and silently drop the rest of the file. */
  const char *nul = memchr(text, '\0', len);
  if (nul != NULL) {
    p.line = line_at(text, (size_t)(nul - text));
    return perr(&p, "a NUL byte (at byte %zu of the file): not a text trace",
                (size_t)(nul - text) + 1);
  }
  /* A UTF-8 byte order mark, as some editors write, is not part of the text. */
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, len -= 3;
  gmr_trace_data_t *t = gmr__calloc(1, sizeof *t);
  char *buf = len < SIZE_MAX ? gmr__malloc(len + 1) : NULL;
  gmr_avl_t live = {0};
  streams_t streams = {.n = 0};
  gmr__sites_t *sites = gmr__sites_new();
  int rc = 0;
  if (t == NULL || buf == NULL || sites == NULL || (t->source = gmr__strdup(p.name)) == NULL) {
    rc = perr(&p, "out of host memory");
    goto done;
  }
  memcpy(buf, text, len);
  buf[len] = '\0';
  size_t cap = 0;
  char *s = buf;
  while (*s != '\0' && rc == 0) {
    char *nl = strchr(s, '\n');
    if (nl) *nl = '\0';
    if (p.line == UINT32_MAX) {
      rc = perr(&p, "more than 4 billion lines");
      break;
    }
    ++p.line;
    char *q = s;
    while (*q == ' ' || *q == '\t' || *q == '\r')
      ++q;
    bool blank = *q == '\0' || *q == '#';
    bool header = p.line == 1 && strncmp(q, "Thread", 6) == 0;
    if (!blank && !header) rc = parse_line(&p, s, t, &live, &cap, &streams, sites);
    s = nl ? nl + 1 : s + strlen(s);
  }
  if (rc == 0 && finish(t) != 0) rc = perr(&p, "out of host memory");
  if (rc == 0) {
    t->n_live_at_end = live.count;
    t->n_streams = streams.n;
  }
done:
  gmr__avl_clear(&live, NULL, NULL);
  gmr__free(buf);
  gmr__sites_finish(sites, rc == 0 ? t : NULL);
  if (rc != 0) {
    gmr_trace_data_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

/* ---- the streaming reader ------------------------------------------------------
 * gmr_trace_read_with reads the file in chunks of READ_CHUNK bytes and parses
 * the complete lines of each chunk in place, so the text is never held
 * whole: what stays is the events (40 bytes each) and the live map.  A line
 * cut by the end of a chunk is moved to the front of the buffer and
 * completed by the next read; a line longer than the buffer grows it. */

#define READ_CHUNK ((size_t)1 << 20)

typedef struct reader_s {
  parser_t p;
  gmr_trace_data_t *t;
  gmr_avl_t live;
  streams_t streams;
  size_t cap;
  uint64_t offset;     /* bytes of the file consumed so far */
  gmr__sites_t *sites; /* call sites, interned */
  bool snapshot;       /* a pickled snapshot, parsed whole into t */
} reader_t;

/* Parse the complete lines of buf[0, len); returns the bytes consumed (up
 * to and including the last newline; all of it when `last`), or sets *rc. */
static size_t reader_lines(reader_t *r, char *buf, size_t len, bool last, int *rc) {
  size_t pos = 0;
  while (pos < len && *rc == 0) {
    char *s = buf + pos;
    char *nl = memchr(s, '\n', len - pos);
    if (nl == NULL && !last) break;
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    if (r->p.line == UINT32_MAX) {
      *rc = perr(&r->p, "more than 4 billion lines");
      break;
    }
    ++r->p.line;
    if (memchr(s, '\0', n) != NULL) {
      *rc = perr(&r->p, "a NUL byte (at byte %llu of the file): not a text trace",
                 (unsigned long long)(r->offset + pos + (size_t)((char *)memchr(s, '\0', n) - s)) +
                     1);
      break;
    }
    s[n] = '\0'; /* the newline, or the byte after the text (the buffer has room) */
    if (r->p.line == 1 && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3; /* a BOM */
    char *q = s;
    while (*q == ' ' || *q == '\t' || *q == '\r')
      ++q;
    bool blank = *q == '\0' || *q == '#';
    bool header = r->p.line == 1 && strncmp(q, "Thread", 6) == 0;
    if (!blank && !header)
      *rc = parse_line(&r->p, s, r->t, &r->live, &r->cap, &r->streams, r->sites);
    pos += n + (nl != NULL);
  }
  return pos;
}

/* A PyTorch memory snapshot: its history as CSV text, parsed as any trace
 * line by line as the converter hands it over (so the text is never held
 * whole: Note [Shared values] in replay-pickle.c). */
static int snapshot_lines(void *ud, char *text, size_t len) {
  reader_t *r = ud;
  int rc = 0;
  reader_lines(r, text, len, true, &rc);
  r->offset += len;
  return rc;
}

static int parse_snapshot(const char *text, size_t len, const char *name, gmr_trace_data_t **out,
                          char *err, size_t errlen) {
  char *note = NULL;
  size_t failures = 0;
  uint64_t failure_bytes = 0;
  uint32_t first_failure = 0;
  reader_t r = {.p = {name, err, errlen, 0}};
  r.t = gmr__calloc(1, sizeof *r.t);
  r.sites = gmr__sites_new();
  int rc = 0;
  if (r.t == NULL || r.sites == NULL || (r.t->source = gmr__strdup(name)) == NULL)
    rc = perr(&r.p, "out of host memory");
  if (rc == 0)
    rc = gmr__snapshot_to_csv(text, len, name, snapshot_lines, &r, &note, &failures, &failure_bytes,
                              &first_failure, err, errlen);
  if (rc == 0 && finish(r.t) != 0) rc = perr(&r.p, "out of host memory");
  size_t live_at_end = r.live.count;
  gmr__avl_clear(&r.live, NULL, NULL);
  if (rc != 0) {
    gmr__sites_finish(r.sites, NULL);
    gmr_trace_data_free(r.t);
    gmr__free(note);
    return rc;
  }
  gmr_trace_data_t *t = r.t;
  gmr__sites_finish(r.sites, t);
  t->n_live_at_end = live_at_end;
  t->n_streams = r.streams.n;
  gmr_trace_event_t *fit = t->n_events ? gmr__realloc(t->events, t->n_events * sizeof *fit) : NULL;
  if (fit != NULL) t->events = fit;
  t->format = GMR_TRACE_FORMAT_SNAPSHOT;
  t->note = note;
  t->n_alloc_failures = failures;
  t->alloc_failure_bytes = failure_bytes;
  t->first_alloc_failure_line = first_failure;
  *out = t;
  return 0;
}

/* A pickled snapshot is binary and parsed whole (parse_snapshot): read the
 * rest of the file after buf[0, *have), parse it, and put the result in
 * r->t (the streaming state is dropped).  *buf may be reallocated. */
static int read_whole_snapshot(FILE *f, char **buf, size_t *have, size_t *cap, const char *name,
                               reader_t *r, char *err, size_t errlen) {
  for (;;) {
    if (*have == *cap) {
      char *bigger = *cap < SIZE_MAX / 4 ? gmr__realloc(*buf, *cap * 2 + 1) : NULL;
      if (bigger == NULL) return perr(&r->p, "out of host memory reading the snapshot");
      *buf = bigger;
      *cap *= 2;
    }
    size_t got = fread(*buf + *have, 1, *cap - *have, f);
    if (got == 0) break;
    *have += got;
  }
  if (ferror(f)) return perr(&r->p, "cannot read the trace: %s", strerror(errno));
  gmr_trace_data_t *t = NULL;
  int rc = gmr_trace_parse(*buf, *have, name, &t, err, errlen);
  if (rc != 0) return rc;
  gmr_trace_data_free(r->t);
  r->t = t;
  r->snapshot = true;
  return 0;
}

int gmr_trace_read_with(const char *path, const gmr_trace_read_options_t *opts,
                        gmr_trace_data_t **out, char *err, size_t errlen) {
  if (path == NULL || out == NULL) return GMR_EINVAL;
  gmr_trace_read_options_t o = {0};
  if (opts != NULL) o = *opts;
  bool is_stdin = strcmp(path, "-") == 0;
  const char *name = is_stdin ? "-" : path;
  if (err && errlen) err[0] = '\0';
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (f == NULL) {
    if (err && errlen)
      snprintf(err, errlen, "%s: cannot open the trace: %s", path, strerror(errno));
    return GMR_EIO;
  }
  uint64_t total = 0;
  struct stat sb;
  if (!is_stdin && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode)) total = (uint64_t)sb.st_size;
  reader_t r = {.p = {name, err, errlen, 0}};
  size_t cap = READ_CHUNK, have = 0;
  char *buf = gmr__malloc(cap + 1);
  int rc = 0;
  r.t = gmr__calloc(1, sizeof *r.t);
  r.sites = gmr__sites_new();
  if (buf == NULL || r.t == NULL || r.sites == NULL || (r.t->source = gmr__strdup(name)) == NULL)
    rc = perr(&r.p, "out of host memory");
  uint64_t next_report = 0;
  while (rc == 0) {
    if (have == cap) { /* one line fills the buffer: make room */
      char *bigger = cap < SIZE_MAX / 4 ? gmr__realloc(buf, cap * 2 + 1) : NULL;
      if (bigger == NULL) {
        rc = perr(&r.p, "out of host memory (a line of more than %zu bytes)", cap);
        break;
      }
      buf = bigger;
      cap *= 2;
    }
    size_t got = fread(buf + have, 1, cap - have, f);
    if (got == 0 && ferror(f)) {
      if (err && errlen)
        snprintf(err, errlen, "%s: cannot read the trace: %s", path, strerror(errno));
      rc = GMR_EIO;
      break;
    }
    have += got;
    bool last = got == 0;
    if (r.offset == 0 && gmr__is_pickle(buf, have)) { /* a PyTorch snapshot: read whole */
      rc = read_whole_snapshot(f, &buf, &have, &cap, name, &r, err, errlen);
      break;
    }
    size_t used = reader_lines(&r, buf, have, last, &rc);
    memmove(buf, buf + used, have - used);
    have -= used;
    r.offset += used;
    if (o.progress != NULL && rc == 0 && (last || r.offset >= next_report)) {
      next_report = r.offset + (o.progress_every ? o.progress_every : ((uint64_t)16 << 20));
      if (o.progress(r.offset, total, r.t->n_events, o.ud) != 0) {
        if (err && errlen) snprintf(err, errlen, "%s: reading stopped", path);
        rc = GMR_EINVAL;
      }
    }
    if (last) break;
  }
  if (!is_stdin) fclose(f);
  gmr__free(buf);
  if (rc == 0 && r.snapshot) {
    gmr__avl_clear(&r.live, NULL, NULL);
    gmr__sites_finish(r.sites, NULL);
    *out = r.t;
    return 0;
  }
  if (rc == 0 && finish(r.t) != 0) rc = perr(&r.p, "out of host memory");
  if (rc == 0) {
    r.t->n_live_at_end = r.live.count;
    r.t->n_streams = r.streams.n;
    /* The events array was grown by doubling: give back what is unused. */
    gmr_trace_event_t *fit =
        r.t->n_events ? gmr__realloc(r.t->events, r.t->n_events * sizeof *fit) : NULL;
    if (fit != NULL) r.t->events = fit;
  }
  gmr__avl_clear(&r.live, NULL, NULL);
  gmr__sites_finish(r.sites, rc == 0 ? r.t : NULL);
  if (rc != 0) {
    gmr_trace_data_free(r.t);
    return rc;
  }
  *out = r.t;
  return 0;
}

int gmr_trace_read(const char *path, gmr_trace_data_t **out, char *err, size_t errlen) {
  return gmr_trace_read_with(path, NULL, out, err, errlen);
}

void gmr_trace_data_free(gmr_trace_data_t *t) {
  if (t == NULL) return;
  for (size_t k = 0; k < t->n_sites; ++k)
    gmr__free(t->sites[k]);
  gmr__free(t->sites);
  gmr__free(t->note);
  gmr__free(t->events);
  gmr__free(t->source);
  gmr__free(t);
}

/* ---- the replayer --------------------------------------------------------------- */

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Note [Replay peak]
 * The replayer drives gmr_alloc / gmr_free / gmr_record_stream /
 * gmr_empty_cache, counts OOMs without stopping (unless asked), and keeps
 * the statistics at the event where reserved bytes peaked.  Its per-event
 * cost is one call into the runtime plus an atomic load: the peak test reads
 * the backend's reserved-bytes counter and takes a full gmr_stats snapshot
 * only when that counter reaches a new maximum.
 *
 * That load is the replayer's one step past the public API: it takes the
 * counter from gmr__runtime_backend(rt) (runtime/runtime.h, the recording
 * layer the policies were given, whose wrappers in lib/backend/backend.c
 * keep `counters`), a read of an atomic, never a call: a deliberate speed
 * path, since a full gmr_stats per event would cost far more than the load.
 * docs/design.md, rule 3, says so.
 *
 * Its second step past the API: when the runtime records its history and
 * the trace names call sites, each site becomes a frame of the history and
 * each allocation is made with its site's frame named (Note [History
 * frames] in observe/history.h, through gmr__runtime_history), so the
 * runtime's snapshot says which code holds each block; see replay_frames.
 */

/* Whether s[0 .. end) ends with ":LINE" after a non-empty file name: the
 * colon and the line. */
static bool site_line_before(char *s, char *end, char **colon, uint32_t *line) {
  char *d = end;
  while (d > s && d[-1] >= '0' && d[-1] <= '9')
    --d;
  if (d == end || end - d > 10 || d - 1 <= s || d[-1] != ':') return false;
  uint64_t v = 0;
  for (const char *p = d; p < end; ++p)
    v = v * 10 + (uint64_t)(*p - '0');
  if (v > UINT32_MAX) return false;
  *colon = d - 1;
  *line = (uint32_t)v;
  return true;
}

/* Split a call site's text in place, as the readers write it:
 * "FILE:LINE (NAME)" (the name may hold parentheses) or "FILE:LINE".  true
 * with its parts; false for any other text, which is then the frame's file
 * name, with line 0 and no name. */
static bool site_split(char *s, uint32_t *line, const char **name) {
  size_t n = strlen(s);
  char *colon = NULL;
  if (n > 0 && s[n - 1] == ')')
    for (char *p = strstr(s, " ("); p != NULL; p = strstr(p + 1, " ("))
      if (site_line_before(s, p, &colon, line)) {
        s[n - 1] = '\0';
        *colon = '\0';
        *name = p + 2;
        return true;
      }
  if (!site_line_before(s, s + n, &colon, line)) return false;
  *colon = '\0';
  *name = "";
  return true;
}

static int replay_add_frame(gmr_history_t *h, const char *site, uint32_t *out) {
  char *copy = gmr__strdup(site);
  if (copy == NULL) return gmr__error_set(GMR_ENOMEM, "gmr_replay: out of host memory");
  uint32_t line = 0;
  const char *name = "";
  int err = site_split(copy, &line, &name) ? gmr__history_add_frame(h, copy, line, name, out)
                                           : gmr__history_add_frame(h, site, 0, "", out);
  gmr__free(copy);
  return err;
}

/* The frame of each site of t in h: frames[s] for site s (frames[0] = 0),
 * in a new array (gmr__free it); NULL when the history is off or t names no
 * sites (or on a failure, said in *err). */
static uint32_t *replay_frames(gmr_runtime_t *rt, const gmr_trace_data_t *t, gmr_history_t **h,
                               int *err) {
  *h = t->n_sites > 0 ? gmr__runtime_history(rt) : NULL;
  *err = 0;
  if (*h == NULL) return NULL;
  uint32_t *frames = gmr__calloc(t->n_sites + 1, sizeof *frames);
  if (frames == NULL) {
    *err = gmr__error_set(GMR_ENOMEM, "gmr_replay: out of host memory");
    return NULL;
  }
  for (size_t s = 0; s < t->n_sites && *err == 0; ++s)
    *err = replay_add_frame(*h, t->sites[s], &frames[s + 1]);
  if (*err == 0) return frames;
  gmr__free(frames);
  return NULL;
}

/* The loop pays per event one action dispatch, the call, one load of the
 * device's reserved bytes and three predictable branches (a failure, a new
 * peak, checks or a callback); the callback's period is a countdown. */
int gmr_replay(gmr_runtime_t *rt, const gmr_trace_data_t *t, const gmr_replay_options_t *opts,
               gmr_replay_result_t *out) {
  if (rt == NULL || t == NULL || out == NULL)
    return gmr__error_set(GMR_EINVAL, "gmr_replay: NULL argument");
  gmr_replay_options_t o = {0};
  if (opts) o = *opts;
  const size_t every = o.callback_every ? o.callback_every : 1;
  void **ptrs = gmr__calloc(t->n_ids ? t->n_ids : 1, sizeof *ptrs);
  if (ptrs == NULL) return gmr__error_set(GMR_ENOMEM, "gmr_replay: out of host memory");
  gmr_history_t *hist = NULL;
  int ferr = 0;
  uint32_t *const frames = replay_frames(rt, t, &hist, &ferr);
  if (ferr != 0) {
    gmr__free(ptrs);
    return ferr;
  }
  const size_t n_sites = t->n_sites;
  gmr_replay_result_t r;
  memset(&r, 0, sizeof r);
  /* see Note [Replay peak] */
  const _Atomic uint64_t *reserved = &gmr__runtime_backend(rt)->counters.reserved_bytes;
  uint64_t best = 0;
  gmr_stats(rt, &r.at_peak);
  gmr_runtime_set_exclusive(rt, 1); /* this thread makes every call */
  const bool extras = o.check || o.callback != NULL;
  size_t until_callback = 1; /* the callback runs at events 0, every, 2 every, ... and the last */
  const gmr_trace_event_t *const events = t->events;
  const size_t n = t->n_events;
  double t0 = now_seconds();
  size_t i = 0;
  for (; i < n; ++i) {
    const gmr_trace_event_t *e = &events[i];
    int st = 0;
    switch (e->action) {
    case GMR_TRACE_ALLOC:
      if (GMR_UNLIKELY(frames != NULL))
        gmr__history_use_frame(hist, frames[e->site <= n_sites ? e->site : 0]);
      st = gmr_alloc(rt, e->size, GMR_SIM_STREAM(e->stream), &ptrs[e->id]);
      if (GMR_UNLIKELY(frames != NULL)) gmr__history_use_frame(hist, 0);
      if (GMR_UNLIKELY(st == GMR_ENOMEM)) {
        ptrs[e->id] = NULL;
        if (r.ooms++ == 0) {
          r.first_oom_event = i;
          r.first_oom_line = e->line;
          snprintf(r.first_oom_message, sizeof r.first_oom_message, "%s", gmr_last_error(rt));
        }
      }
      break;
    case GMR_TRACE_FREE:
      if (GMR_LIKELY(ptrs[e->id] != NULL)) st = gmr_free(rt, ptrs[e->id]);
      ptrs[e->id] = NULL;
      break;
    case GMR_TRACE_RECORD_STREAM:
      if (ptrs[e->id] != NULL) st = gmr_record_stream(rt, ptrs[e->id], GMR_SIM_STREAM(e->stream));
      break;
    case GMR_TRACE_EMPTY_CACHE:
      st = gmr_empty_cache(rt);
      break;
    }
    uint64_t now = atomic_load_explicit(reserved, memory_order_relaxed);
    if (GMR_UNLIKELY(now > best)) {
      best = now;
      gmr_stats(rt, &r.at_peak);
      r.peak_event = i;
    }
    if (GMR_UNLIKELY(st != 0)) {
      if (st != GMR_ENOMEM) {
        /* A device error or a policy bug: report it like a failed check. */
        r.check_failed = 1;
        r.check_event = i;
        snprintf(r.check_message, sizeof r.check_message, "%s:%u: %s: %s", t->source,
                 (unsigned)e->line, gmr_err_name(st), gmr_last_error(rt));
        ++i;
        break;
      }
      if (o.stop_at_oom && !o.check) {
        ++i;
        break;
      }
    }
    if (GMR_UNLIKELY(extras)) {
      if (o.check && gmr_check(rt) != 0) {
        r.check_failed = 1;
        r.check_event = i;
        snprintf(r.check_message, sizeof r.check_message, "%s:%u: invariant broken: %s", t->source,
                 (unsigned)e->line, gmr_last_error(rt));
        ++i;
        break;
      }
      if (st == GMR_ENOMEM && o.stop_at_oom) {
        ++i;
        break;
      }
      if (o.callback && (--until_callback == 0 || i + 1 == n)) {
        until_callback = every;
        if (o.callback(rt, t, i, st, o.ud) != 0) {
          ++i;
          break;
        }
      }
    }
  }
  r.events_done = i;
  r.seconds = now_seconds() - t0;
  gmr__free(ptrs);
  gmr__free(frames);
  *out = r;
  return 0;
}
