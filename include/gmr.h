/* gmr.h: the one public header of gmr, a GPU memory runtime.
 *
 * A runtime (gmr_runtime_t) is one stack of allocation policies on one device,
 * chosen by a YAML configuration (gmr_config_t).  Policies decide which bytes
 * to hand out (PyTorch-style caching, TensorFlow-style BFC, gmr's own stitch,
 * direct, limit); backends reserve raw device ranges (CUDA, or a simulated
 * device).
 *
 * Conventions:
 *  - every call returns 0 or a negative GMR_E* code; out-parameters come last,
 *    are never NULL, and are left untouched on failure;
 *  - the library never aborts and never prints unless asked (gmr_set_log);
 *  - every *_free accepts NULL;
 *  - all runtime calls are thread-safe: any number of threads may allocate
 *    and free on one runtime;
 *  - no call is async-signal-safe: a signal handler must not call gmr (as
 *    with malloc), since the call it interrupted may hold the runtime's
 *    locks.
 */
#ifndef GMR_H
#define GMR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(GMR_STATIC_BUILD)
#define GMR_EXTERN __attribute__((visibility("default")))
#else
#define GMR_EXTERN
#endif

/* The version: configure.ac reads it from these three lines, the Python
 * package and the Debian packages follow it.  gmr_version() gives the
 * library's at run time, which may differ from the header's a program was
 * built with. */
#define GMR_VERSION_MAJOR 0
#define GMR_VERSION_MINOR 1
#define GMR_VERSION_PATCH 0

/** The library's version, "MAJOR.MINOR.PATCH" (never NULL). */
GMR_EXTERN const char *gmr_version(void);

/* Error codes: X(name, value, message).  Functions return -value. */
#define GMR_ERRNO_MAP(X)                                                                           \
  X(ENOMEM, 1, "out of memory")                                                                    \
  X(EINVAL, 2, "invalid argument")                                                                 \
  X(EBADPTR, 3, "pointer not owned by this runtime, or already freed")                             \
  X(EDEVICE, 4, "device error")                                                                    \
  X(ECONFIG, 5, "invalid configuration")                                                           \
  X(ENOTSUP, 6, "operation not supported by this policy or backend")                               \
  X(EIO, 7, "input/output error")                                                                  \
  X(EBUSY, 8, "resource busy")

enum {
  GMR_OK = 0,
#define GMR__ERR_ENUM(name, value, msg) GMR_##name = -(value),
  GMR_ERRNO_MAP(GMR__ERR_ENUM)
#undef GMR__ERR_ENUM
};

/** A human-readable sentence for an error code (never NULL). */
GMR_EXTERN const char *gmr_strerror(int err);
/** The symbolic name of an error code, e.g. "GMR_ENOMEM" (never NULL). */
GMR_EXTERN const char *gmr_err_name(int err);

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */

typedef struct gmr_config_s gmr_config_t;   /* parsed YAML, immutable */
typedef struct gmr_runtime_s gmr_runtime_t; /* one policy stack on one device */
typedef void *gmr_stream_t;                 /* cudaStream_t, or a sim stream id */

/** Where and why a configuration was rejected. */
typedef struct gmr_error_s {
  int code;           /* GMR_E* */
  int line;           /* 1-based; 0 when not tied to a position */
  int column;         /* 1-based; 0 when not tied to a position */
  char file[256];     /* the file name, or "<string>" */
  char message[1024]; /* "file:line:column: sentence", ready to print */
} gmr_error_t;

/** Parse a YAML configuration file.
 * @param[in]  path  file to read
 * @param[out] out   the new configuration; free with gmr_config_free
 * @param[out] err   filled on failure (may be NULL)
 * @return 0, GMR_EIO (unreadable file), GMR_ECONFIG (invalid content, or not
 * a regular file: a FIFO or device is refused without blocking) */
GMR_EXTERN int gmr_config_load_file(const char *path, gmr_config_t **out, gmr_error_t *err);
/** Parse a YAML configuration held in a NUL-terminated string. */
GMR_EXTERN int gmr_config_load_string(const char *yaml, gmr_config_t **out, gmr_error_t *err);
GMR_EXTERN void gmr_config_free(gmr_config_t *cfg);
/** The name of the outermost policy of a configuration ("caching", "limit"...). */
GMR_EXTERN const char *gmr_config_policy_name(const gmr_config_t *cfg);
/** Find a configuration by file or by name, as the tools take them.
 * A `name` that contains a '/' or names an existing file is that file.
 * Otherwise NAME, then NAME.yaml, is looked for in ./config (a source tree)
 * and then in the installed configurations (the package data directory,
 * e.g. /usr/share/gmr): "pytorch" finds config/pytorch.yaml, else
 * /usr/share/gmr/pytorch.yaml.  The path is written to `out` (`len` bytes,
 * NUL-terminated); gmr_config_dir() names the installed directory.
 * @return 0, GMR_EINVAL (NULL or empty name, NULL out, or the path does not
 *         fit in `len`; *out untouched), GMR_EIO (found nowhere) */
GMR_EXTERN int gmr_config_find(const char *name, char *out, size_t len);
/** The directory of the installed configurations (never NULL). */
GMR_EXTERN const char *gmr_config_dir(void);
/** Write the configuration reference (every policy, every option) as Markdown. */
GMR_EXTERN int gmr_config_write_reference(FILE *out);

/** The type of an option (gmr_option_info_t.type). */
typedef enum gmr_option_type_e {
  GMR_OPTION_BOOL = 0,   /* true or false */
  GMR_OPTION_SIZE = 1,   /* bytes, with an optional unit ("512MiB") */
  GMR_OPTION_INT = 2,    /* an integer */
  GMR_OPTION_NUMBER = 3, /* a real number */
  GMR_OPTION_STRING = 4, /* free text */
  GMR_OPTION_CHOICE = 5, /* one of `choices` */
  GMR_OPTION_TEXT = 6,   /* text with a syntax of its own (see `help`) */
  GMR_OPTION_MAPPING = 7 /* a nested mapping of options (limit's `shared`; see docs/config.md) */
} gmr_option_type_t;

/** One option of a policy, as the table that parses the YAML describes it.
 * Strings point into the library's tables (static; never freed). */
typedef struct gmr_option_info_s {
  const char *key;            /* the YAML key */
  gmr_option_type_t type;     /* GMR_OPTION_* */
  double min, max;            /* SIZE, INT, NUMBER: the range (max 0: no upper bound) */
  int min_exclusive;          /* 1: the range excludes min */
  const char *const *choices; /* CHOICE: NULL-terminated names; else NULL */
  const char *default_text;   /* the default as the reference writes it ("" when derived) */
  const char *help;           /* one sentence */
  /* Values worth trying when tuning the option for a workload, YAML scalars,
   * NULL-terminated; NULL when the option is not tuned.  A value "Kx peak"
   * stands for K times the workload's peak requested bytes: that many bytes
   * for a SIZE, and that share of the device's memory for a NUMBER (a
   * fraction of the device). */
  const char *const *tune;
} gmr_option_info_t;

/** The name of policy number `index` of the registry (0, 1, ...); NULL past
 * the last. */
GMR_EXTERN const char *gmr_policy_name(size_t index);
/** The options of policy `policy`, in the order of its table: fills
 * out[0 .. min(cap, n) - 1] and sets *out_count to n (call with cap 0 to
 * learn n).  @return 0, GMR_EINVAL (unknown policy, or out NULL with cap > 0) */
GMR_EXTERN int gmr_policy_options(const char *policy, gmr_option_info_t *out, size_t cap,
                                  size_t *out_count);

/** Parse a size as configuration files write them: "4096", "512MiB", "8GiB",
 * "1.5GiB", "2MB" (decimal), "0x1000".  @return 0, GMR_EINVAL (malformed;
 * *out untouched) */
GMR_EXTERN int gmr_parse_size(const char *text, uint64_t *out);
/** Write `bytes` as gmr's messages do: "512 bytes" below 1 KiB, else two
 * decimals in the largest binary unit that keeps the value >= 1 ("1.50
 * GiB", up to EiB), NUL-terminated and truncated to len bytes (len 0:
 * nothing written). */
GMR_EXTERN void gmr_format_size(uint64_t bytes, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Runtime                                                                  */

/** Create a runtime for `device` (the CUDA ordinal, or the simulated device's).
 * The backend is the one the configuration names; `auto` (the default) picks
 * CUDA when a device is present and the simulator otherwise.  Simulated
 * devices 0 to 30 exist; each hands out addresses from its own window, so
 * pointers of two devices never collide (as under CUDA's unified addressing),
 * and device 0's addresses are gmr_runtime_new_sim's.  On failure
 * gmr_thread_last_error() (or gmr_last_error(NULL)) says why.
 * @return 0, GMR_EINVAL, GMR_ENOMEM, GMR_EDEVICE, GMR_ECONFIG */
GMR_EXTERN int gmr_runtime_new(const gmr_config_t *cfg, int device, gmr_runtime_t **out);

/** The memory of a simulated device unless a configuration (device:
 * capacity) or a tool (--capacity) says otherwise: 143771 MiB, what CUDA
 * reports for an NVIDIA H200.  Every tool uses this default. */
#define GMR_SIM_DEFAULT_CAPACITY ((uint64_t)143771 << 20)

/** Options of a simulated device, for tools and tests that force one. */
typedef struct gmr_sim_options_s {
  uint64_t capacity;    /* bytes of device memory; 0: GMR_SIM_DEFAULT_CAPACITY */
  uint64_t granularity; /* reservation granularity in bytes; 0: 2 MiB */
  int host_backed;      /* 1: real host memory behind every range */
} gmr_sim_options_t;

/** Create a runtime on a fresh simulated device 0, whatever the configuration
 * says about the device (`opts` may be NULL for the configuration's or the
 * default simulated device). */
GMR_EXTERN int gmr_runtime_new_sim(const gmr_config_t *cfg, const gmr_sim_options_t *opts,
                                   gmr_runtime_t **out);

/** Destroy a runtime and return all its device memory.  Live allocations are
 * reported through the log (gmr_set_log) and their memory released.  The
 * streams it was given may be destroyed already: it waits for their work
 * on freed memory without using them (one device-wide synchronisation). */
GMR_EXTERN void gmr_runtime_free(gmr_runtime_t *rt);
/** gmr_runtime_free, reporting whether what the runtime wrote on its own
 * reached its files: GMR_TRACE's trace (flushed and closed here) and
 * GMR_SNAPSHOT's snapshot (written here).  A tool exits non-zero on failure.
 * @return 0, GMR_EIO or GMR_ENOMEM (the file, the reason and what was lost in
 * gmr_last_error(NULL); also logged once at GMR_LOG_ERROR) */
GMR_EXTERN int gmr_runtime_close(gmr_runtime_t *rt);
/** Write out GMR_TRACE's buffered lines now (they are flushed every 256 lines
 * or 0.1 s anyway, so a crash loses at most that tail).  A trace line that
 * cannot be written never fails the call it records: that call returns 0 and
 * sets the thread's last error; from then on the trace drops its lines and
 * this call returns GMR_EIO.  @return 0 (no trace, or every line written),
 * GMR_EIO (a write failed; gmr_last_error says which file and why) */
GMR_EXTERN int gmr_flush(gmr_runtime_t *rt);

/** The process-wide runtime of `device`, created on first use from the file
 * named by GMR_CONFIG (PyTorch-style caching when unset).  Never freed. */
GMR_EXTERN int gmr_default_runtime(int device, gmr_runtime_t **out);

/** Allocate `size` bytes (size > 0) for use on stream `s`.
 * Size 0 is GMR_EINVAL: gmr never hands out zero-byte blocks.  A CUDA stream
 * `s` must stay valid until the last call on the runtime but
 * gmr_runtime_free: a policy may record an event on it after a free on it,
 * to learn when the freed memory is idle (PyTorch's streams, likewise, live
 * as long as the process).
 * @return 0, GMR_EINVAL, GMR_ENOMEM (see gmr_last_error), GMR_EDEVICE */
GMR_EXTERN int gmr_alloc(gmr_runtime_t *rt, size_t size, gmr_stream_t s, void **out_ptr);
/** Free a pointer returned by gmr_alloc.  NULL is a no-op.
 * @return 0, GMR_EBADPTR (foreign pointer or double free; nothing changes) */
GMR_EXTERN int gmr_free(gmr_runtime_t *rt, void *ptr);
/** Mark `ptr` as used on stream `s`: its memory is reused only after the work
 * queued on `s` before the free has completed.  @return 0, GMR_EBADPTR */
GMR_EXTERN int gmr_record_stream(gmr_runtime_t *rt, void *ptr, gmr_stream_t s);
/** Return every cached, wholly free range to the device. */
GMR_EXTERN int gmr_empty_cache(gmr_runtime_t *rt);
/** Count `bytes` of device memory that a framework obtained outside gmr
 * (the interposer charges JAX's cuMemCreate this way) against the runtime's
 * limit; a negative count gives them back.  A stack without a limit accepts
 * every charge.  A refund gives back at most what is charged and not yet
 * refunded.  @return 0, GMR_ENOMEM (the limit would be passed; nothing is
 * counted, and gmr_last_error says so), GMR_EINVAL (a refund beyond the
 * charges; nothing changes) */
GMR_EXTERN int gmr_charge(gmr_runtime_t *rt, int64_t bytes);
/** Declare that one thread makes every call on this runtime (exclusive != 0),
 * as a trace replay does, or that this no longer holds (0).  Policies then
 * never wait for frees from other threads: TensorFlow's BFC retry fails at
 * once instead of waiting its retry_timeout, with the same result, since no
 * other thread can free anything meanwhile.  gmr_replay sets it. */
GMR_EXTERN void gmr_runtime_set_exclusive(gmr_runtime_t *rt, int exclusive);
/** The requested and the policy-rounded size of a live allocation. */
GMR_EXTERN int gmr_alloc_size(gmr_runtime_t *rt, void *ptr, size_t *out_requested,
                              size_t *out_allocated);

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */

/** Figures common to every policy, so tools compare them on one scale.
 * Byte counts are bytes; "peak" values are maxima since creation or the last
 * gmr_stats_reset_peak. */
typedef struct gmr_stats_s {
  uint64_t reserved_bytes; /* held from the device (segments, mapped pages) */
  uint64_t peak_reserved_bytes;
  uint64_t allocated_bytes; /* live blocks, policy-rounded sizes */
  uint64_t peak_allocated_bytes;
  uint64_t requested_bytes; /* live blocks, sizes as requested */
  uint64_t peak_requested_bytes;
  uint64_t active_bytes; /* allocated + freed-but-pending (stream uses) */
  uint64_t peak_active_bytes;
  uint64_t segments; /* device reservations currently held */
  uint64_t peak_segments;
  uint64_t allocations; /* live allocations */
  uint64_t peak_allocations;
  uint64_t num_allocs;         /* successful allocations, accumulated */
  uint64_t num_frees;          /* frees, accumulated */
  uint64_t device_allocs;      /* device reservations and page maps, accumulated */
  uint64_t device_frees;       /* device releases and page unmaps, accumulated */
  uint64_t ooms;               /* allocations that failed with GMR_ENOMEM */
  uint64_t alloc_retries;      /* allocations retried after freeing the cache */
  uint64_t largest_free_block; /* largest cached free block, bytes */
  uint64_t free_cached_bytes;  /* reserved but not active, bytes */
  uint64_t limit_bytes;        /* the cap in force, 0 when none */
} gmr_stats_t;

GMR_EXTERN int gmr_stats(gmr_runtime_t *rt, gmr_stats_t *out);
GMR_EXTERN void gmr_stats_reset_peak(gmr_runtime_t *rt);
GMR_EXTERN void gmr_stats_reset_accumulated(gmr_runtime_t *rt);

/** Policy-specific statistics, named as the imitated framework names them
 * (e.g. "allocated_bytes.all.current" for caching, "peak_bytes_in_use" for
 * BFC).  The callback returns 0 to continue; any other value stops the walk. */
typedef int (*gmr_stat_cb)(const char *key, int64_t value, void *ud);
GMR_EXTERN int gmr_stats_foreach(gmr_runtime_t *rt, gmr_stat_cb cb, void *ud);
/** One named statistic.  @return 0, GMR_EINVAL (unknown key) */
GMR_EXTERN int gmr_stat_get(gmr_runtime_t *rt, const char *key, int64_t *out);

/** Print the policy's summary (the caching policy prints
 * torch.cuda.memory_summary()'s layout). */
GMR_EXTERN int gmr_summary(gmr_runtime_t *rt, FILE *out);

/** The last error of the calling thread on this runtime: the full OOM text
 * or a sentence naming the bad argument.  Never NULL; "" when none.  With rt
 * NULL: the thread's last error that belongs to no runtime (why
 * gmr_runtime_new, gmr_runtime_new_sim or gmr_default_runtime failed). */
GMR_EXTERN const char *gmr_last_error(gmr_runtime_t *rt);
/** The calling thread's last error text, whichever call set it (on any
 * runtime, or on none).  Never NULL; "" when none. */
GMR_EXTERN const char *gmr_thread_last_error(void);

/* ------------------------------------------------------------------------ */
/* Introspection: segments and blocks, for maps, snapshots and checks        */

typedef enum gmr_block_state_e {
  GMR_BLOCK_FREE = 0,         /* cached, can be handed out */
  GMR_BLOCK_ALLOCATED = 1,    /* live */
  GMR_BLOCK_PENDING_FREE = 2, /* freed, waiting for stream work */
  GMR_BLOCK_UNMAPPED = 3      /* reserved address space with no memory behind */
} gmr_block_state_t;

typedef struct gmr_walk_entry_s {
  int is_segment;          /* 1: a segment header; 0: a block inside the last segment */
  uintptr_t address;       /* device address */
  uint64_t size;           /* bytes */
  uint64_t requested;      /* blocks: bytes requested (0 when free) */
  gmr_block_state_t state; /* blocks only */
  gmr_stream_t stream;     /* the stream the segment or block belongs to */
  const char *pool;        /* segments: "small", "large", "region"... */
  int is_expandable;       /* segments: grows by mapping pages */
  /* Blocks of a policy that shares pages between neighbours (stitch): the
   * bytes at the block's start and at its end that lie on a page another
   * block also holds, and those pages' numbers (the same number on both
   * blocks of a page; 0 and 0 when nothing is shared). */
  uint64_t shared_head, shared_tail;
  uint64_t head_page, tail_page;
  uint64_t pool_id; /* 0: the default pool; else gmr_pool_id of the private pool */
} gmr_walk_entry_t;

typedef int (*gmr_walk_cb)(const gmr_walk_entry_t *e, void *ud);
/** Visit every segment in address order, each followed by its blocks.
 * @return 0, GMR_ENOTSUP (the policy keeps no segments) */
GMR_EXTERN int gmr_walk(gmr_runtime_t *rt, gmr_walk_cb cb, void *ud);

/** Walk the policy's invariants.  @return 0, or GMR_EINVAL with the broken
 * invariant in gmr_last_error. */
GMR_EXTERN int gmr_check(gmr_runtime_t *rt);

/** The policy stack, e.g. "limit(caching)". */
GMR_EXTERN const char *gmr_runtime_policy(gmr_runtime_t *rt);
/** The backend name: "cuda" or "sim". */
GMR_EXTERN const char *gmr_runtime_backend(gmr_runtime_t *rt);
/** Device memory as the backend reports it. */
GMR_EXTERN int gmr_mem_info(gmr_runtime_t *rt, size_t *out_free, size_t *out_total);

/** What the runtime's backend can do, found by trying it (gmr_backend_probe).
 * Each *_err is 0 when the feature works, else the error of the step that
 * failed (GMR_ENOTSUP: the backend has no such feature). */
typedef struct gmr_backend_probe_s {
  size_t granularity;   /* bytes: reservations and mapped pages are multiples */
  int reserve_err;      /* reserve + release one granule (cudaMalloc/cudaFree) */
  double reserve_us;    /* microseconds that pair took (reserve_err == 0) */
  int vmm_err;          /* reserve a virtual range of vmm_span bytes, map two
                           pages, unmap them, release the range */
  const char *vmm_step; /* vmm_err != 0: the step that failed, e.g. "map a page" */
  size_t vmm_span;      /* bytes of the virtual range tried: 32 granules */
  int event_err;        /* record an event on the default stream */
  int event_sync_err;   /* event_err == 0: synchronizing on it */
  int event_query_err;  /* event_err == 0: querying it (0: complete) */
} gmr_backend_probe_t;

/** Try the backend's features on `rt`'s device: one granule reserved and
 * released, a virtual range mapped and unmapped, an event recorded.  Leaves
 * the device as it found it; safe while other threads use the runtime.
 * @return 0 (the results are in *out, failures included), GMR_EINVAL */
GMR_EXTERN int gmr_backend_probe(gmr_runtime_t *rt, gmr_backend_probe_t *out);

/* ------------------------------------------------------------------------ */
/* Memory history and PyTorch memory snapshots (docs/snapshots.md)           */

/** Record the runtime's memory history, as torch.cuda.memory.
 * _record_memory_history(max_entries=N) does: a ring buffer of the last
 * `max_entries` trace entries (alloc, free_requested, free_completed,
 * segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot).
 * Off by default; GMR_HISTORY=N in the environment turns it on for every new
 * runtime, and GMR_SNAPSHOT=path writes each runtime's snapshot when it is
 * freed (the default runtimes' at exit).  Calling it again changes the bound and keeps the newest
 * entries; 0 turns recording off and drops the entries.
 * @return 0, GMR_EINVAL, GMR_ENOMEM */
GMR_EXTERN int gmr_history_enable(gmr_runtime_t *rt, size_t max_entries);

/** Write the runtime's state and history as PyTorch's memory snapshot, the
 * pickle torch.cuda.memory._dump_snapshot writes and PyTorch's memory_viz
 * (https://pytorch.org/memory_viz, python -m torch.cuda._memory_viz) reads:
 * {"segments": [...], "device_traces": [[...]], "allocator_settings": {...},
 * "external_annotations": []}.  Segments and blocks come from gmr_walk (none
 * when the policy keeps no segments); the traces are empty unless the history
 * is recorded (gmr_history_enable), and a `snapshot` entry is added to it.
 * `out` must be open for binary writing.
 * @return 0, GMR_EINVAL, GMR_ENOMEM, GMR_EIO (a write failed) */
GMR_EXTERN int gmr_snapshot_write(gmr_runtime_t *rt, FILE *out);

/** One entry of the memory history as it is recorded, for an observer
 * (gmr_history_observe).  The actions are gmr_snapshot_write's: */
typedef enum gmr_history_action_e {
  GMR_HISTORY_ALLOC = 0,          /* a block handed out */
  GMR_HISTORY_FREE_REQUESTED = 1, /* gmr_free called */
  GMR_HISTORY_FREE_COMPLETED = 2, /* the block can be reused (stream work done) */
  GMR_HISTORY_SEGMENT_ALLOC = 3,  /* memory reserved from the device */
  GMR_HISTORY_SEGMENT_FREE = 4,   /* memory given back to the device */
  GMR_HISTORY_SEGMENT_MAP = 5,    /* pages mapped into a reserved range */
  GMR_HISTORY_SEGMENT_UNMAP = 6,  /* pages unmapped */
  GMR_HISTORY_OOM = 7,            /* an allocation failed: addr is the device's free bytes */
  GMR_HISTORY_SNAPSHOT = 8        /* a snapshot was taken */
} gmr_history_action_t;

typedef struct gmr_history_event_s {
  gmr_history_action_t action;
  uintptr_t address;   /* device address (oom: free bytes; snapshot: 0) */
  uint64_t size;       /* bytes: requested (alloc, free_*), range (segment_*), request (oom) */
  gmr_stream_t stream; /* the stream of the call */
  uint64_t time_us;    /* microseconds since the epoch */
} gmr_history_event_t;

/** Called for every history entry as it is recorded, on the thread whose
 * call caused it, with the runtime's history lock held: it must return
 * quickly and must not call gmr. */
typedef void (*gmr_history_cb)(const gmr_history_event_t *ev, void *ud);

/** Call `cb` for every entry of rt's memory history from now on (a
 * framework adapter that keeps its own trace, with its own frames, the way
 * PyTorch's allocator does); NULL stops.  Observing turns the history on
 * (gmr_history_enable(rt, 1) when it is off), and turning the history off
 * (max_entries 0) stops the observer too.  One observer per runtime: a
 * second call replaces the first.  @return 0, GMR_EINVAL, GMR_ENOMEM */
GMR_EXTERN int gmr_history_observe(gmr_runtime_t *rt, gmr_history_cb cb, void *ud);

/* ------------------------------------------------------------------------ */
/* Private pools and CUDA graph capture (docs/pools.md)                      */

/** A private pool: memory of its own inside a runtime, for CUDA graphs
 * (PyTorch's graph pools, torch.cuda.MemPool).  A pool is a second instance
 * of the runtime's policy stack, built from the same configuration, on the
 * same device and under the same caps; its segments are its own:
 *   - a block freed in a pool is reused only by allocations in that pool;
 *   - no pool memory reaches an allocation outside the pool while the pool
 *     lives (use count > 0 or live blocks);
 *   - statistics, walks, snapshots and checks of the runtime cover every
 *     pool (gmr_walk_entry_t.pool_id tells them apart).
 * Under `caching` a pool follows PyTorch's PrivatePool: the same rounding,
 * splitting and best fit as the default pool, on segments of its own. */
typedef struct gmr_pool_s gmr_pool_t;

/** Every stream, for gmr_pool_begin. */
#define GMR_STREAM_ANY ((gmr_stream_t)(uintptr_t)-1)

/** Create a pool in rt with use count 1.  @return 0, GMR_EINVAL, GMR_ENOMEM */
GMR_EXTERN int gmr_pool_create(gmr_runtime_t *rt, gmr_pool_t **out);
/** The pool's id: unique in the process, never 0 (0 is the default pool). */
GMR_EXTERN uint64_t gmr_pool_id(const gmr_pool_t *pool);
/** Add one use (a graph that shares the pool).  @return 0, GMR_EINVAL */
GMR_EXTERN int gmr_pool_retain(gmr_pool_t *pool);
/** Drop one use.  At 0 the pool takes no new allocations, its cached memory
 * goes back at the next gmr_empty_cache, and it is destroyed once its last
 * block is freed and its cache emptied (so `pool` must not be used after
 * the call that drops its last use).  @return 0, GMR_EINVAL */
GMR_EXTERN int gmr_pool_release(gmr_pool_t *pool);
/** The pool's use count (0 after its last release). */
GMR_EXTERN int gmr_pool_use_count(const gmr_pool_t *pool);
/** Route gmr_alloc calls on stream `s` (GMR_STREAM_ANY: every stream) to
 * `pool` until gmr_pool_end(pool, s).  The latest begin that matches a call
 * wins.  @return 0, GMR_EINVAL (use count 0), GMR_ENOMEM */
GMR_EXTERN int gmr_pool_begin(gmr_pool_t *pool, gmr_stream_t s);
/** End a route made by gmr_pool_begin(pool, s).  @return 0, GMR_EINVAL (no such route) */
GMR_EXTERN int gmr_pool_end(gmr_pool_t *pool, gmr_stream_t s);
/** gmr_alloc in `pool` (NULL: the runtime's default pool), whatever the routes.
 * @return as gmr_alloc; GMR_EINVAL for a pool of use count 0 */
GMR_EXTERN int gmr_alloc_in(gmr_runtime_t *rt, gmr_pool_t *pool, size_t size, gmr_stream_t s,
                            void **out_ptr);
/** The pool of a live allocation: *out NULL for the default pool.
 * @return 0, GMR_EBADPTR (not a live allocation of rt) */
GMR_EXTERN int gmr_pool_of(gmr_runtime_t *rt, const void *ptr, gmr_pool_t **out);
/** Return the pool's cached, wholly free memory to the device. */
GMR_EXTERN int gmr_pool_empty_cache(gmr_pool_t *pool);
/** Statistics of the pool alone (gmr_stats covers the runtime and every pool). */
GMR_EXTERN int gmr_pool_stats(gmr_pool_t *pool, gmr_stats_t *out);
/** Visit the pool's live allocations (pointer, requested size), in no order.
 * The callback must not call gmr; it returns 0 to go on.  @return 0, GMR_EINVAL */
typedef int (*gmr_ptr_cb)(void *ptr, size_t size, void *ud);
GMR_EXTERN int gmr_pool_foreach_live(gmr_pool_t *pool, gmr_ptr_cb cb, void *ud);

/** A CUDA graph capture is starting on rt's device (calls nest).  Until the
 * matching gmr_capture_end, gmr makes no device call that would invalidate
 * a capture, as PyTorch's allocator does: events are neither queried nor
 * waited for (frees pending on streams complete after the capture), events
 * that a free would record are recorded at the end, memory given back to
 * the device is given back at the end, and device memory is reserved in
 * relaxed capture mode (cudaThreadExchangeStreamCaptureMode).  Allocations
 * are routed by gmr_pool_begin as usual.  @return 0, GMR_EINVAL */
GMR_EXTERN int gmr_capture_begin(gmr_runtime_t *rt);
/** End one gmr_capture_begin; the last end records the deferred events and
 * gives back the deferred memory.  @return 0, GMR_EINVAL (no capture
 * underway), GMR_EDEVICE (a deferred call failed; the rest were made) */
GMR_EXTERN int gmr_capture_end(gmr_runtime_t *rt);

/* ------------------------------------------------------------------------ */
/* Tags, sleep and wake (docs/sleep-wake.md)                                 */

/** Allocations made inside a tagged region go to the tag's own private pool
 * (created by its first region, kept until the runtime is freed), whose
 * device memory gmr_sleep gives back while every address stays reserved,
 * and gmr_wake maps again at the same addresses: pointers, tensors, CUDA
 * graphs and registrations stay valid.  Every policy can sleep: the tag's
 * pool reserves all its memory through the device's virtual memory calls
 * (so a backend without them refuses with GMR_ENOTSUP, and tagged memory
 * cannot be shared by cudaIpcGetMemHandle). */
#define GMR_TAG_MAX 63 /* bytes of a tag, without its NUL */

/** Open a region of `tag` (1 to GMR_TAG_MAX bytes) on the calling thread:
 * until the matching gmr_region_end, gmr_alloc on rt from this thread goes
 * to the tag's pool (after any gmr_pool_begin route, which a CUDA graph
 * capture uses).  Regions nest (the innermost wins), up to 32 per thread.
 * @return 0, GMR_EINVAL, GMR_ENOMEM, GMR_ENOTSUP (the backend has no
 * virtual memory calls) */
GMR_EXTERN int gmr_region_begin(gmr_runtime_t *rt, const char *tag);
/** Close the calling thread's innermost region on rt.
 * @return 0, GMR_EINVAL (none is open) */
GMR_EXTERN int gmr_region_end(gmr_runtime_t *rt);
/** The tag of the calling thread's innermost region on rt, or NULL. */
GMR_EXTERN const char *gmr_region_current(gmr_runtime_t *rt);

#define GMR_SLEEP_OFFLOAD 1 /* copy the contents to pinned host memory first */
#define GMR_SLEEP_DISCARD 2 /* give the memory back without copying */
/* With GMR_SLEEP_OFFLOAD: keep the pinned host buffer after the wake, for
 * the tag's next sleep to copy into without pinning memory again (pinning
 * costs about ten times the copy: docs/sleep-wake.md).  The buffer is host
 * memory held while the tag is awake (gmr_tag_info's host_kept_bytes); a
 * sleep without the flag uses it once and its wake gives it back. */
#define GMR_SLEEP_KEEP_HOST 4

/** Put `tag` to sleep: wait for the device, release the tag's cached blocks,
 * copy its mapped memory to pinned host memory (GMR_SLEEP_OFFLOAD), then
 * unmap it and give it back, keeping its addresses.  Its bytes leave the
 * runtime's caps and the shared cap at once.  While it sleeps an
 * allocation in the tag fails with GMR_EBUSY and a free of one of its
 * blocks is made at the wake.  A tag asleep already is left alone (0).
 * `mode` is GMR_SLEEP_OFFLOAD, GMR_SLEEP_OFFLOAD | GMR_SLEEP_KEEP_HOST or
 * GMR_SLEEP_DISCARD (which gives a kept buffer back).
 * @return 0, GMR_EINVAL (no such tag, bad mode), GMR_EBUSY (a CUDA graph
 * is being captured), GMR_ENOTSUP (offload without device copies),
 * GMR_ENOMEM (no host memory; nothing changed), GMR_EDEVICE */
GMR_EXTERN int gmr_sleep(gmr_runtime_t *rt, const char *tag, int mode);
/** Wake `tag`: empty the other caches, check that the device has the
 * memory, charge the caps, map new memory at the same addresses and copy
 * the offloaded contents back (stream-ordered, complete at the return).
 * All or nothing: on failure the tag sleeps on with its contents kept.  An
 * awake tag is left alone (0).  @return 0, GMR_EINVAL (no such tag),
 * GMR_EBUSY (capture), GMR_ENOMEM (the memory is not there, or a cap
 * refuses it: gmr_last_error says how much was needed and free),
 * GMR_EDEVICE */
GMR_EXTERN int gmr_wake(gmr_runtime_t *rt, const char *tag);

/** One tag, as gmr_tag_info reports it. */
typedef struct gmr_tag_info_s {
  char tag[GMR_TAG_MAX + 1];
  uint64_t pool_id;         /* its pool's gmr_pool_id */
  int asleep;               /* 1 after gmr_sleep, 0 after gmr_wake */
  int mode;                 /* asleep: GMR_SLEEP_*; else 0 */
  uint64_t mapped_bytes;    /* device memory behind its ranges now */
  uint64_t sleeping_bytes;  /* device memory given back, mapped again at wake */
  uint64_t offloaded_bytes; /* pinned host memory holding its contents */
  uint64_t sleeps, wakes;   /* accumulated */
  uint64_t host_kept_bytes; /* pinned host memory kept by GMR_SLEEP_KEEP_HOST */
} gmr_tag_info_t;
/** @return 0, GMR_EINVAL (NULL argument, or no such tag) */
GMR_EXTERN int gmr_tag_info(gmr_runtime_t *rt, const char *tag, gmr_tag_info_t *out);
/** The private pool of `tag` (created as by gmr_region_begin), for
 * gmr_pool_begin (a CUDA graph captured into the tag) and gmr_alloc_in.  It
 * lives as long as rt whatever its use count.  @return as gmr_region_begin */
GMR_EXTERN int gmr_tag_pool(gmr_runtime_t *rt, const char *tag, gmr_pool_t **out);

/* ------------------------------------------------------------------------ */
/* Segments and the memory fraction                                          */

#define GMR_SEGMENT_EXPANDABLE 1 /* grows by mapping pages into a reserved range */

/** The segment (device reservation, or mapped range) that holds `ptr`. */
typedef struct gmr_segment_info_s {
  uintptr_t base;   /* its first byte */
  uint64_t size;    /* bytes */
  uint64_t pool_id; /* 0: the default pool; else gmr_pool_id of its pool */
  int flags;        /* GMR_SEGMENT_* */
  gmr_stream_t stream;
} gmr_segment_info_t;

/** Find the segment that holds `ptr` (any address inside it), as PyTorch's
 * getBaseAllocation and IPC sharing need.  Walks the segments: for tools and
 * adapters, not the hot path.  @return 0, GMR_EBADPTR (in no segment),
 * GMR_ENOTSUP (the policy keeps no segments) */
GMR_EXTERN int gmr_segment_of(gmr_runtime_t *rt, const void *ptr, gmr_segment_info_t *out);

/** Cap what rt holds from the device (every pool together) at `fraction` of
 * the device's total memory, as torch.cuda.set_per_process_memory_fraction
 * does: a reservation that would pass it fails as out of memory, after the
 * policy freed its cache, with a message that names the fraction.  1.0 lifts
 * it.  It stacks on every `limit` of the configuration.
 * @return 0, GMR_EINVAL (fraction not in (0, 1]) */
GMR_EXTERN int gmr_set_memory_fraction(gmr_runtime_t *rt, double fraction);
/** The fraction in force (1.0 when none was set). */
GMR_EXTERN double gmr_memory_fraction(gmr_runtime_t *rt);

/* ------------------------------------------------------------------------ */
/* Simulated device controls (tests and tools).  GMR_ENOTSUP on CUDA.        */

typedef struct gmr_sim_counters_s {
  uint64_t reserve_calls, reserve_failures, release_calls;
  uint64_t map_calls, unmap_calls, va_reserve_calls, va_release_calls;
  uint64_t event_records, event_queries, syncs;
  uint64_t bytes_in_use; /* physical bytes currently reserved or mapped */
  uint64_t peak_bytes_in_use;
  /* Physical pages (handles) and their mappings, for policies that alias. */
  uint64_t page_create_calls, page_release_calls, page_map_calls, page_unmap_calls;
  uint64_t set_access_calls, capture_queries;
  uint64_t pages_live;     /* handles created and not released */
  uint64_t page_maps_live; /* handle mappings not unmapped */
  /* Unmaps, page unmaps and virtual releases of addresses that work queued
   * with gmr_sim_stream_use still used (a policy must keep this 0). */
  uint64_t unsafe_unmaps;
} gmr_sim_counters_t;

/** Fail the k-th device call from now on (1: the next one); 0 disarms.  The
 * calls counted are those that can fail for lack of memory or address space:
 * reserve, map, virtual reserve, page create, page map and set access, and
 * those of sleep and wake: pinned host allocations and copies. */
GMR_EXTERN int gmr_sim_fail_nth(gmr_runtime_t *rt, uint64_t k);
/** Like gmr_sim_fail_nth, then fail every such call after it too, until
 * gmr_sim_fail_all(rt, 0): a retry after the failure fails as well. */
GMR_EXTERN int gmr_sim_fail_from(gmr_runtime_t *rt, uint64_t k);
/** Fail every reserve or map whose size is above `bytes`; 0 disarms. */
GMR_EXTERN int gmr_sim_fail_above(gmr_runtime_t *rt, uint64_t bytes);
/** Fail every reserve or map from now on (1) or stop doing so (0). */
GMR_EXTERN int gmr_sim_fail_all(gmr_runtime_t *rt, int on);
/** Queue one unit of work on stream `s`; events recorded after it complete
 * only when gmr_sim_stream_complete is called. */
GMR_EXTERN int gmr_sim_stream_enqueue(gmr_runtime_t *rt, gmr_stream_t s);
/** Queue one unit of work on stream `s` that reads and writes
 * [ptr, ptr + size) until the stream completes it (gmr_sim_stream_complete,
 * or a wait on an event or the stream); unmapping any of those addresses
 * meanwhile counts in gmr_sim_counters_t.unsafe_unmaps. */
GMR_EXTERN int gmr_sim_stream_use(gmr_runtime_t *rt, gmr_stream_t s, const void *ptr, size_t size);
/** Complete all the work queued on stream `s`. */
GMR_EXTERN int gmr_sim_stream_complete(gmr_runtime_t *rt, gmr_stream_t s);
/** Set the simulated clock in nanoseconds (it then stands still). */
GMR_EXTERN int gmr_sim_set_clock(gmr_runtime_t *rt, uint64_t ns);
/** Address-only mode: the next reserve returns `addr` when that range is free
 * (replays that reproduce a recorded device's placement); 0 clears it. */
GMR_EXTERN int gmr_sim_place_next(gmr_runtime_t *rt, uintptr_t addr);
GMR_EXTERN int gmr_sim_counters(gmr_runtime_t *rt, gmr_sim_counters_t *out);
/** Bytes asked of the simulated device by each kind of call since the
 * runtime was created, failed calls included (the sizes passed; a call's
 * count is in gmr_sim_counters_t): what a per-page cost model of the device
 * calls needs (gmr-compare's device time). */
typedef struct gmr_sim_call_bytes_s {
  uint64_t reserve, release, va_reserve, va_release, map, unmap;
  uint64_t page_create, page_release, page_map, page_unmap, set_access;
} gmr_sim_call_bytes_t;
GMR_EXTERN int gmr_sim_call_bytes(gmr_runtime_t *rt, gmr_sim_call_bytes_t *out);
/** Mark stream `s` as being captured into a CUDA graph (1) or not (0). */
GMR_EXTERN int gmr_sim_stream_capture(gmr_runtime_t *rt, gmr_stream_t s, int on);
/** A simulated stream handle for id `n` (0 is the default stream). */
#define GMR_SIM_STREAM(n) ((gmr_stream_t)(uintptr_t)(n))

/* ------------------------------------------------------------------------ */
/* Shared caps: one cap on a device across processes (docs/shared-cap.md)    */

/** One process attached to a shared-cap file. */
typedef struct gmr_shared_cap_slot_s {
  int index;           /* the slot's index in the file */
  unsigned generation; /* + 1 at every claim of the slot */
  int pid;             /* the owner's pid in its own PID namespace (display only) */
  int alive;           /* 1: the owner holds its liveness lock; 0: it died and its
                          share is given back at the next reservation */
  uint64_t quota;      /* the owner's quota in bytes (0: none) */
  uint64_t guaranteed; /* bytes no other process can take from it */
  uint64_t held;       /* bytes it has reserved on the device */
  uint64_t operations; /* reservations and releases it made through the cap */
  uint64_t since;      /* when it attached, seconds since the epoch */
  char label[64];      /* `limit.shared.label` */
} gmr_shared_cap_slot_t;

/** The header of a shared-cap file. */
typedef struct gmr_shared_cap_info_s {
  char device_id[96];  /* GPU UUID ("GPU-...") or the simulator's id */
  unsigned version;    /* layout version */
  uint64_t cap;        /* bytes all processes may commit together */
  uint64_t committed;  /* Σ max(held, guaranteed) over the attached processes */
  uint64_t held;       /* Σ held */
  uint64_t guaranteed; /* Σ guaranteed */
  unsigned slots;      /* slots in the file */
  unsigned live;       /* slots in use (alive or not yet swept) */
  uint64_t sweeps;     /* recomputations of the totals from the slots */
  uint64_t repairs;    /* recoveries from a process that died holding the lock */
  uint64_t timeouts;   /* waits for the lock that gave up */
} gmr_shared_cap_info_t;

/** Read a shared-cap file without changing it or taking its lock: the header
 * into *info, and up to `max_slots` attached processes into `slots` (their
 * count in *out_n; info->live counts them all).  A snapshot: figures may be
 * mid-update.  The file is read into memory, never mapped, and never waited
 * for: a FIFO, a device or a file that shrinks is an error, not a hang or a
 * crash.  Errors are in gmr_last_error(NULL).
 * @return 0, GMR_EIO (cannot open or read it), GMR_EINVAL (not a regular
 * file, or not a shared-cap file of this version), GMR_ENOMEM */
GMR_EXTERN int gmr_shared_cap_read(const char *path, gmr_shared_cap_info_t *info,
                                   gmr_shared_cap_slot_t *slots, size_t max_slots, size_t *out_n);
/** The default file of a device, "/dev/shm/gmr-cap-<uid>-<device_id>" (with
 * device_id "": the prefix of every such file of this user).
 * @return 0, GMR_EINVAL (buffer too small) */
GMR_EXTERN int gmr_shared_cap_default_path(const char *device_id, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */

typedef enum { GMR_LOG_ERROR = 0, GMR_LOG_WARN = 1, GMR_LOG_INFO = 2 } gmr_log_level_t;
typedef void (*gmr_log_fn)(gmr_log_level_t level, const char *msg, void *ud);
/** Route the library's messages to `fn` (NULL: silence, the default unless
 * GMR_LOG=1 is set, which prints warnings to stderr). */
GMR_EXTERN void gmr_set_log(gmr_log_fn fn, void *ud);

#ifdef __cplusplus
}
#endif
#endif /* GMR_H */
