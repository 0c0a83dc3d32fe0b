/* trace.c: recording a runtime's trace (GMR_TRACE) and reading traces back:
 * the reader's dense ids, its errors with line numbers, and the replayer's
 * results (OOMs, peaks) on the simulator. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"
#include "gmr_replay.h"
#include "tap.h"

#define MiB (1ull << 20)

static void parse_fails(const char *text, const char *needle, const char *what) {
  gmr_trace_data_t *t = NULL;
  char err[512] = "";
  is_int(gmr_trace_parse(text, strlen(text), "t.csv", &t, err, sizeof err), GMR_EINVAL,
         "rejects %s", what);
  like(err, needle, "  %s", needle);
  ok(t == NULL, "  and returns no trace");
}

typedef struct progress_s {
  uint64_t last, total;
  int calls;
} progress_t;

static int progress_cb(uint64_t done, uint64_t total, size_t events, void *ud) {
  progress_t *p = ud;
  (void)events;
  p->last = done, p->total = total, ++p->calls;
  return 0;
}

int main(void) {
  /* Record. */
  char path[256];
  snprintf(path, sizeof path, "/tmp/gmr-trace-test-%d.csv", (int)getpid());
  setenv("GMR_TRACE", path, 1);
  gmr_config_t *cfg;
  gmr_error_t err;
  gmr_config_load_string("policy: direct\n", &cfg, &err);
  gmr_runtime_t *rt;
  is_int(gmr_runtime_new_sim(cfg, NULL, &rt), 0, "a runtime that records its trace");
  unsetenv("GMR_TRACE");
  void *a, *b;
  gmr_alloc(rt, 1000, GMR_SIM_STREAM(0), &a);
  gmr_alloc(rt, 3 * MiB, GMR_SIM_STREAM(2), &b);
  gmr_record_stream(rt, b, GMR_SIM_STREAM(3));
  gmr_free(rt, a);
  gmr_empty_cache(rt);
  gmr_runtime_free(rt);

  gmr_trace_data_t *t = NULL;
  char msg[512];
  is_int(gmr_trace_read(path, &t, msg, sizeof msg), 0, "the recorded trace reads back");
  if (t == NULL) return done_testing();
  is_int(t->n_events, 5, "five events");
  is_int(t->n_ids, 2, "two allocations");
  is_int(t->n_live_at_end, 1, "one still live at the end");
  ok(t->events[0].action == GMR_TRACE_ALLOC && t->events[0].size == 1000 && t->events[0].id == 0,
     "event 0: allocate 1000 bytes, id 0");
  ok(t->events[1].stream == 2 && t->events[1].id == 1, "event 1: stream 2, id 1");
  ok(t->events[2].action == GMR_TRACE_RECORD_STREAM && t->events[2].stream == 3 &&
         t->events[2].id == 1,
     "event 2: record_stream of id 1 on stream 3");
  ok(t->events[3].action == GMR_TRACE_FREE && t->events[3].id == 0 && t->events[3].size == 1000,
     "event 3: free of id 0 (size 1000)");
  ok(t->events[4].action == GMR_TRACE_EMPTY_CACHE, "event 4: empty_cache");
  is_u64(t->peak_requested, 3 * MiB + 1000, "peak requested");
  is_int(t->events[4].line, 6, "line numbers count the header");
  gmr_trace_data_free(t);
  remove(path);

  /* Reader errors name the line. */
  parse_fails(
      "Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,0x10,100,0\n0,2,free,0x20,100,0\n",
      "t.csv:3: free of 0x20, which is not live", "a free of an unknown id");
  parse_fails("0,1,allocate,0x10,100,0\n0,1,allocate,0x10,100,0\n",
              "t.csv:2: allocate of 0x10, which is still live (allocated at line 1",
              "an allocation of a live id");
  parse_fails("0,1,allocate,0x10,100\n", "t.csv:1: expected 6 comma-separated fields",
              "a short line");
  {
    /* A 7th field is the allocation's call site: the rest of the line. */
    const char *sited = "0,1,allocate,0x10,100,0,train.py:7 (step, inner)\n0,2,free,0x10,100,0\n";
    gmr_trace_data_t *ts = NULL;
    is_int(gmr_trace_parse(sited, strlen(sited), "t.csv", &ts, NULL, 0), 0,
           "a 7th field is read as the call site");
    ok(ts && ts->n_sites == 1 && ts->events[0].site == 1 &&
           strcmp(ts->sites[0], "train.py:7 (step, inner)") == 0 && ts->events[1].site == 0,
       "  the rest of the line, commas included, on the allocation only");
    gmr_trace_data_free(ts);
  }
  parse_fails("0,1,alloc,0x10,100,0\n", "t.csv:1: unknown Action 'alloc'", "an unknown action");
  parse_fails("0,1,allocate,0x10,-5,0\n", "Size '-5' is not a byte count", "a negative size");
  parse_fails("0,1,allocate,0x10,0,0\n", "allocation of 0 bytes", "a zero size");
  parse_fails("0,x,allocate,0x10,1,0\n", "Time 'x' is not a time", "a bad time");
  parse_fails("0,1,allocate,zz,1,0\n", "Pointer 'zz'", "a bad pointer");
  gmr_trace_data_t *t2 = NULL;
  is_int(gmr_trace_read("/nonexistent.csv", &t2, msg, sizeof msg), GMR_EIO, "a missing file");
  like(msg, "/nonexistent.csv: cannot open the trace", "  is named");

  /* Replay: OOMs are results; the others go on. */
  const char *text = "Thread,Time,Action,Pointer,Size,Stream\n"
                     "0,1,allocate,0x10,4194304,0\n"
                     "0,2,allocate,0x20,8388608,0\n"
                     "0,3,free,0x10,4194304,0\n"
                     "0,4,allocate,0x30,2097152,0\n"
                     "0,5,free,0x20,8388608,0\n";
  is_int(gmr_trace_parse(text, strlen(text), "r.csv", &t, msg, sizeof msg), 0, "a small trace");
  gmr_sim_options_t small = {.capacity = 10 * MiB};
  gmr_runtime_new_sim(cfg, &small, &rt);
  gmr_replay_result_t res;
  is_int(gmr_replay(rt, t, NULL, &res), 0, "replay on a 10 MiB device");
  is_int(res.events_done, 5, "all five events were replayed");
  is_int(res.ooms, 1, "one allocation ran out of memory");
  is_int(res.first_oom_event, 1, "  event 1");
  is_int(res.first_oom_line, 3, "  line 3");
  like(res.first_oom_message, "Tried to allocate 8.00 MiB", "  with the policy's message");
  is_u64(res.at_peak.reserved_bytes, 4 * MiB, "peak reserved 4 MiB");
  gmr_runtime_free(rt);
  gmr_runtime_new_sim(cfg, NULL, &rt);
  gmr_replay_options_t o = {.check = 1};
  gmr_replay(rt, t, &o, &res);
  ok(res.ooms == 0 && !res.check_failed, "on a large device: no OOM, invariants hold");
  is_u64(res.at_peak.reserved_bytes, 12 * MiB, "peak reserved 12 MiB");
  is_int(res.peak_event, 1, "at event 1");
  gmr_runtime_free(rt);
  gmr_trace_data_free(t);

  /* The shipped real traces parse. */
  const char *names[] = {"gpt2_train.csv", "resnet50_train.csv", "gpt2_varlen_train.csv"};
  const size_t events[] = {18087, 8635, 83527};
  const uint64_t peak_req[] = {13594206920ull, 3192592912ull, 16776574672ull};
  for (int i = 0; i < 3; ++i) {
    snprintf(path, sizeof path, "%s/traces/%s", tap_srcdir(), names[i]);
    t = NULL;
    is_int(gmr_trace_read(path, &t, msg, sizeof msg), 0, "traces/%s parses", names[i]);
    if (t == NULL) continue;
    is_int(t->n_events, events[i], "  %zu events", events[i]);
    is_u64(t->peak_requested, peak_req[i], "  peak requested = PyTorch's (figures.md)");
    gmr_trace_data_free(t);
  }
  /* The streaming reader: a file of several 1 MiB chunks, with lines cut by
   * chunk ends, a BOM, CRLF endings and comments, gives the same events as
   * parsing the text in memory, and reports its progress up to the whole
   * file. */
  size_t cap = 5u << 20, len = 0;
  char *big = malloc(cap);
  len += (size_t)snprintf(big + len, cap - len,
                          "\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream\r\n");
  for (unsigned i = 0; len + 200 < cap - 200; ++i) {
    len += (size_t)snprintf(big + len, cap - len, "%u,%u,allocate,0x%x,%u,%u\r\n", i % 7, i,
                            0x1000 + 0x200 * i, 512 + (i * 7919u) % 100000u, i % 3);
    if (i % 97 == 0) len += (size_t)snprintf(big + len, cap - len, "# a comment\n");
    len += (size_t)snprintf(big + len, cap - len, "%u,%u,free,%u,0,%u\n", i % 7, i,
                            0x1000 + 0x200 * i, i % 3);
  }
  snprintf(path, sizeof path, "/tmp/gmr-trace-stream-%d.csv", (int)getpid());
  FILE *f = fopen(path, "wb");
  fwrite(big, 1, len, f);
  fclose(f);
  gmr_trace_data_t *ta = NULL, *tb = NULL;
  is_int(gmr_trace_parse(big + 3, len - 3, "mem", &ta, msg, sizeof msg), 0,
         "a %zu-byte trace parses in memory", len);
  progress_t prog = {0, 0, 0};
  gmr_trace_read_options_t ro = {.progress = progress_cb, .ud = &prog, .progress_every = 1};
  is_int(gmr_trace_read_with(path, &ro, &tb, msg, sizeof msg), 0, "and streams from a file");
  if (ta != NULL && tb != NULL) {
    is_int(tb->n_events, ta->n_events, "  the same %zu events", ta->n_events);
    size_t same = 0;
    for (size_t i = 0; i < ta->n_events && i < tb->n_events; ++i) {
      const gmr_trace_event_t *x = &ta->events[i], *y = &tb->events[i];
      same += x->time_us == y->time_us && x->size == y->size && x->stream == y->stream &&
              x->id == y->id && x->line == y->line && x->action == y->action &&
              x->thread == y->thread;
    }
    is_int(same, ta->n_events, "  field for field (lines cut by the 1 MiB chunks included)");
    is_u64(tb->peak_requested, ta->peak_requested, "  the same peak requested");
  }
  ok(prog.calls >= 5 && prog.last == len && prog.total == len,
     "  progress reported %d times, up to the whole file", prog.calls);
  gmr_trace_data_free(ta);
  gmr_trace_data_free(tb);
  unlink(path);
  free(big);
  gmr_config_free(cfg);
  return done_testing();
}
