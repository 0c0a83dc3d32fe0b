/* gmr_replay.h: reading allocation traces and replaying them on a runtime.
 *
 * Traces use RMM's replay-log layout (docs/trace-format.md):
 *   Thread,Time,Action,Pointer,Size,Stream[,Site]
 * Action is allocate, free, record_stream or empty_cache.  Pointer is an
 * opaque id of a live allocation (addresses differ between policies, so the
 * replayer maps ids to its own pointers and never reuses recorded ones).
 * The reader also takes the logs RMM's logging_resource_adaptor writes
 * (clock times, deallocate, "allocate failure": counted, not replayed) and
 * PyTorch memory snapshots (the pickle of torch.cuda.memory._dump_snapshot),
 * whose device_traces it replays.
 */
#ifndef GMR_REPLAY_H
#define GMR_REPLAY_H

#include "gmr.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gmr_trace_action_e {
  GMR_TRACE_ALLOC = 0,
  GMR_TRACE_FREE = 1,
  GMR_TRACE_RECORD_STREAM = 2,
  GMR_TRACE_EMPTY_CACHE = 3
} gmr_trace_action_t;

/* One event of a parsed trace. */
typedef struct gmr_trace_event_s {
  uint64_t time_us; /* as recorded */
  uint64_t size;    /* requested bytes (allocate), as recorded otherwise */
  uint64_t stream;  /* stream id as recorded */
  uint32_t id;      /* dense allocation id: 0..n_ids-1, one per allocate event */
  uint32_t line;    /* 1-based line in the file */
  uint8_t action;   /* gmr_trace_action_t */
  uint8_t thread;   /* recorded thread id, truncated */
  uint32_t site;    /* allocate: its call site, sites[site - 1]; 0 when none */
} gmr_trace_event_t;

/* What a trace was read from (gmr_trace_data_t.format). */
typedef enum gmr_trace_format_e {
  GMR_TRACE_FORMAT_CSV = 0,     /* gmr's CSV, or an RMM log */
  GMR_TRACE_FORMAT_SNAPSHOT = 1 /* a PyTorch memory snapshot (pickle) */
} gmr_trace_format_t;

typedef struct gmr_trace_data_s {
  gmr_trace_event_t *events; /* in file order */
  size_t n_events;
  size_t n_ids;            /* number of allocate events */
  size_t n_live_at_end;    /* allocations never freed */
  size_t n_streams;        /* distinct stream ids */
  uint64_t peak_requested; /* max over time of Σ live requested bytes */
  char *source;            /* file name, "-" for standard input */
  /* Since 0.2 (the fields above keep their places): */
  char **sites;                      /* distinct call sites, in order of first use */
  size_t n_sites;                    /* entries of sites */
  size_t n_alloc_failures;           /* allocations the recording saw fail ("allocate
                                        failure" in an RMM log, "oom" in a snapshot):
                                        counted, not replayed */
  uint64_t alloc_failure_bytes;      /* Σ their sizes */
  uint32_t first_alloc_failure_line; /* the first one's line (snapshots: entry) */
  int format;                        /* gmr_trace_format_t */
  char *note;                        /* what the reader left out or assumed, or NULL */
} gmr_trace_data_t;

/** Parse a trace file ("-": standard input).  A malformed line, a free of an
 * id that is not live, or an allocation of size 0 fails with GMR_EINVAL and a
 * message "FILE:LINE: what is wrong" in `err` (may be NULL).  Allocations
 * never freed are allowed (counted in n_live_at_end).  A file that starts
 * like a pickle is read as a PyTorch memory snapshot: its device_traces of
 * the busiest device become the events (alloc: allocate; free_completed:
 * free; the rest is skipped), "line" N being trace entry N (1-based); a
 * snapshot with no usable history fails with GMR_EINVAL and says what is
 * missing, and frees of allocations older than the history are left out and
 * said in `note`. */
GMR_EXTERN int gmr_trace_read(const char *path, gmr_trace_data_t **out, char *err, size_t errlen);

/* Called while a trace is read: bytes of the file parsed so far, the file's
 * size (0 when unknown: standard input, a pipe), events so far.  Return
 * nonzero to stop reading (gmr_trace_read_with then fails with GMR_EINVAL). */
typedef int (*gmr_trace_progress_cb)(uint64_t bytes_read, uint64_t bytes_total, size_t events,
                                     void *ud);

typedef struct gmr_trace_read_options_s {
  gmr_trace_progress_cb progress; /* may be NULL */
  void *ud;
  uint64_t progress_every; /* call after every N bytes (0: 16 MiB), and at the end */
} gmr_trace_read_options_t;

/** gmr_trace_read with options.  The file is read and parsed in chunks (the
 * text is never held whole), so memory is the events' (40 bytes each) and
 * the live allocations'. */
GMR_EXTERN int gmr_trace_read_with(const char *path, const gmr_trace_read_options_t *opts,
                                   gmr_trace_data_t **out, char *err, size_t errlen);
/** Parse a trace held in memory; `name` is used in messages. */
GMR_EXTERN int gmr_trace_parse(const char *text, size_t len, const char *name,
                               gmr_trace_data_t **out, char *err, size_t errlen);
GMR_EXTERN void gmr_trace_data_free(gmr_trace_data_t *t);
/** Find a trace by file or by name, as the tools take them (configurations:
 * gmr_config_find).  A `name` that is "-", contains a '/' or names an
 * existing file is that file.  Otherwise NAME, then NAME.csv, is looked for
 * in ./traces (a source tree) and then in the installed traces,
 * gmr_trace_dir() (e.g. /usr/share/gmr/traces): "gpt2_train" finds
 * traces/gpt2_train.csv, else /usr/share/gmr/traces/gpt2_train.csv.  The
 * path is written to `out` (`len` bytes, NUL-terminated).
 * @return 0, GMR_EINVAL (NULL or empty name, NULL out, or the path does not
 *         fit in `len`), GMR_EIO (found nowhere) */
GMR_EXTERN int gmr_trace_find(const char *name, char *out, size_t len);
/** The directory of the installed traces (never NULL). */
GMR_EXTERN const char *gmr_trace_dir(void);

/* A PyTorch memory snapshot as a trace CSV to keep (tools/snapshot2csv.py's):
 * one device's allocations and frees, each free with its allocation's size
 * and stream, streams numbered 0 (the default), 1, 2... by first use.
 * gmr_trace_read reads snapshots without this step. */
typedef struct gmr_snapshot_csv_options_s {
  int has_device;  /* 0: the device with the most allocations */
  int device;      /* with has_device: the device whose history to convert */
  int reconstruct; /* allocate at the start what was allocated before the history starts */
  int sites;       /* add the call-site column (needs a snapshot recorded with stacks) */
} gmr_snapshot_csv_options_t;

typedef struct gmr_snapshot_csv_s {
  char *csv; /* the CSV text, NUL-terminated */
  size_t csv_len;
  char *warnings; /* what was assumed or left out, one sentence a line, or NULL */
  int device;     /* the device converted */
  size_t allocations, frees, live_at_end;
  size_t unknown_frees;    /* frees of addresses the history never allocated */
  size_t reconstructed;    /* allocations put at the start (reconstruct) */
  uint64_t peak_requested; /* bytes */
} gmr_snapshot_csv_t;

/** Convert the snapshot pickle data[0, len) (`name` in messages); opts may be
 * NULL.  0 and *out (free with gmr_snapshot_csv_free), or GMR_EINVAL (not a
 * usable snapshot; a global outside torch and the builtin containers is
 * refused, never called) or GMR_ENOMEM, with a sentence in `err`. */
GMR_EXTERN int gmr_snapshot_csv(const void *data, size_t len, const char *name,
                                const gmr_snapshot_csv_options_t *opts, gmr_snapshot_csv_t **out,
                                char *err, size_t errlen);
GMR_EXTERN void gmr_snapshot_csv_free(gmr_snapshot_csv_t *s);

/* Called after every event of a replay (for progress bars, invariant walks
 * and timelines).  `index` is the event's index; return nonzero to stop. */
typedef int (*gmr_replay_cb)(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t index, int status,
                             void *ud);

typedef struct gmr_replay_options_s {
  int check;              /* 1: gmr_check after every event; stop at the first failure */
  int stop_at_oom;        /* 1: stop at the first OOM; 0: skip the failed allocation, go on */
  gmr_replay_cb callback; /* may be NULL */
  void *ud;
  size_t callback_every; /* call every N events (0: 1) */
} gmr_replay_options_t;

typedef struct gmr_replay_result_s {
  size_t events_done;           /* events replayed */
  size_t ooms;                  /* allocations that failed with GMR_ENOMEM */
  size_t first_oom_event;       /* index of the first OOM (valid when ooms > 0) */
  uint32_t first_oom_line;      /* its line in the file */
  char first_oom_message[4096]; /* gmr_last_error at the first OOM (truncated) */
  int check_failed;             /* 1: an invariant walk failed */
  size_t check_event;           /* where */
  char check_message[1024];
  double seconds;      /* wall time of the replay itself */
  gmr_stats_t at_peak; /* stats at the event where reserved bytes peaked */
  size_t peak_event;   /* index of that event */
} gmr_replay_result_t;

/** Replay a parsed trace on a runtime (normally a fresh simulated one).
 * Stream id k of the trace becomes GMR_SIM_STREAM(k) (the default stream for
 * k = 0).  Allocations still live at the end stay live; gmr_runtime_free
 * releases them.  To look at the state at the peak (segment maps,
 * fragmentation), replay a second time on a fresh runtime and stop at
 * `peak_event` from the callback.
 * @return 0 (OOMs are results, not errors), GMR_EINVAL, GMR_ENOMEM (host) */
GMR_EXTERN int gmr_replay(gmr_runtime_t *rt, const gmr_trace_data_t *t,
                          const gmr_replay_options_t *opts, gmr_replay_result_t *out);

#ifdef __cplusplus
}
#endif
#endif /* GMR_REPLAY_H */
