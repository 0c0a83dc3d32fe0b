/* compare-snapshot.c: gmr-compare --snapshot, a configuration's replay as
 * PyTorch's memory snapshot (the pickle torch.cuda.memory._dump_snapshot
 * writes), for memory_viz.
 *
 * The replay itself is compare-replay.c's (compare_replay_snapshot: the
 * history recorded, the state at the end of the replay); this file names the
 * files (one per configuration: Note [Snapshot file names]), refuses the bad
 * ones before any replay, and writes through tools/outfile.h, so a snapshot
 * never lands on an input and is never half-written.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "compare.h"
#include "outfile.h"

/* Note [Snapshot file names]
 * With one CONFIG the snapshot is FILE itself.  With several, each gets its
 * own file, the configuration's name (its file's base name without .yaml)
 * put before FILE's ".pickle" (or after FILE when it has none):
 *   --snapshot run.pickle pytorch tf-growth  ->  run.pytorch.pickle, run.tf-growth.pickle
 * Two CONFIGs of one name would write one file: that is refused (usage).
 */
void compare_snapshot_path(const char *file, const char *name, int several, char *out, size_t len) {
  if (!several) {
    snprintf(out, len, "%s", file);
    return;
  }
  size_t n = strlen(file), k = strlen(".pickle");
  const char *slash = strrchr(file, '/');
  size_t base = slash ? (size_t)(slash - file) + 1 : 0;
  if (n > base + k && strcmp(file + n - k, ".pickle") == 0)
    snprintf(out, len, "%.*s.%s.pickle", (int)(n - k), file, name);
  else
    snprintf(out, len, "%s.%s", file, name);
}

/* What kind of file is at `path` when it is not one to write over, else NULL. */
static const char *cmp_snap_odd_kind(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return NULL;
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "a device";
}

int compare_snapshot_check(const char *path, const char *const *inputs, size_t n_inputs,
                           const char *html) {
  long same = tool_out_input(path, inputs, n_inputs);
  if (same >= 0) {
    fprintf(stderr, "gmr-compare: --snapshot %s: refusing to write over an input (%s)\n", path,
            same == 0 ? "the trace" : "a configuration");
    return 2;
  }
  const char *kind = cmp_snap_odd_kind(path);
  if (kind != NULL) {
    fprintf(stderr,
            "gmr-compare: --snapshot %s: it is %s, not a regular file (the snapshot is written "
            "beside it and renamed into place); give a file's path\n",
            path, kind);
    return 2;
  }
  if (html != NULL) {
    struct stat a, b;
    if (strcmp(path, html) == 0 || (stat(path, &a) == 0 && stat(html, &b) == 0 &&
                                    a.st_dev == b.st_dev && a.st_ino == b.st_ino)) {
      fprintf(stderr, "gmr-compare: --snapshot %s: the --html page is written there too\n", path);
      return 2;
    }
  }
  /* Writable: a temporary file beside it can be made (removed at once). */
  tool_out_t to;
  char why[4200];
  if (tool_out_open(&to, path, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-compare: --snapshot: cannot write %s: %s\n", path, why);
    return 1;
  }
  tool_out_abort(&to);
  return 0;
}

int compare_snapshot_write(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                           const compare_opts_t *o, const char *path) {
  tool_out_t to;
  char why[4200];
  if (tool_out_open(&to, path, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-compare: --snapshot: cannot write %s: %s\n", path, why);
    return -1;
  }
  if (compare_replay_snapshot(cfg, t, o, to.f, why, sizeof why) != 0) {
    tool_out_abort(&to);
    fprintf(stderr, "gmr-compare: --snapshot %s: %s: %s\n", path, run->name, why);
    return -1;
  }
  if (tool_out_commit(&to, why, sizeof why) != 0) {
    fprintf(stderr, "gmr-compare: --snapshot: %s: %s\n", path, why);
    return -1;
  }
  fprintf(stderr,
          "gmr-compare: wrote %s: the memory snapshot of %s at the end of the replay (%" PRIu64
          " bytes reserved, %" PRIu64 " bytes allocated)\n",
          path, run->name, run->final.reserved_bytes, run->final.allocated_bytes);
  return 0;
}
