/* outfile.h: how a tool writes an output file (gmr-compare --html, gmr-bench
 * --json-file): never over one of its inputs, and never half-written.
 *
 * An output that is one of the inputs (the same file, st_dev and st_ino,
 * whatever the path: another name, a symbolic or hard link) is refused
 * before anything is written.  The output is written to a temporary file in
 * the same folder (so rename is atomic) and renamed into place once it is
 * complete; a failed or interrupted run leaves the old file as it was and
 * removes the temporary one.  A symbolic link at the output's path is
 * replaced by the file, never followed.
 */
#ifndef GMR_TOOLS_OUTFILE_H
#define GMR_TOOLS_OUTFILE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct tool_out_s {
  FILE *f; /* write here */
  char path[4096];
  char tmp[4096];
} tool_out_t;

/* Is `path` one of inputs[0..n) (NULL entries, and inputs or an output that
 * do not exist, are skipped)?  The index, or -1. */
static inline long tool_out_input(const char *path, const char *const *inputs, size_t n) {
  struct stat out, in;
  if (stat(path, &out) != 0) return -1;
  for (size_t i = 0; i < n; ++i)
    if (inputs[i] != NULL && stat(inputs[i], &in) == 0 && in.st_dev == out.st_dev &&
        in.st_ino == out.st_ino)
      return (long)i;
  return -1;
}

/* Open a temporary file beside `path`; 0, or -1 with the reason in why. */
static inline int tool_out_open(tool_out_t *o, const char *path, char *why, size_t len) {
  memset(o, 0, sizeof *o);
  const char *slash = strrchr(path, '/');
  int dir_len = slash ? (int)(slash - path) + 1 : 0;
  if (strlen(path) >= sizeof o->path || snprintf(o->tmp, sizeof o->tmp, "%.*s.%s.XXXXXX", dir_len,
                                                 path, path + dir_len) >= (int)sizeof o->tmp) {
    snprintf(why, len, "the path is too long");
    return -1;
  }
  snprintf(o->path, sizeof o->path, "%s", path);
  int fd = mkstemp(o->tmp);
  if (fd < 0) {
    snprintf(why, len, "cannot make a temporary file beside it: %s", strerror(errno));
    return -1;
  }
  mode_t mask = umask(0);
  umask(mask);
  if (fchmod(fd, 0666 & ~mask) != 0 || (o->f = fdopen(fd, "w")) == NULL) {
    snprintf(why, len, "%s", strerror(errno));
    close(fd);
    unlink(o->tmp);
    return -1;
  }
  return 0;
}

/* Drop the temporary file (nothing is renamed). */
static inline void tool_out_abort(tool_out_t *o) {
  if (o->f != NULL) fclose(o->f);
  o->f = NULL;
  if (o->tmp[0]) unlink(o->tmp);
  o->tmp[0] = '\0';
}

/* Close the temporary file and rename it into place; 0, or -1 with the
 * reason in why (and the old file, if any, left as it was). */
static inline int tool_out_commit(tool_out_t *o, char *why, size_t len) {
  int bad = ferror(o->f);
  int e = 0;
  if (fclose(o->f) != 0) bad = 1, e = errno;
  o->f = NULL;
  if (bad) {
    snprintf(why, len, "cannot write it: %s", e ? strerror(e) : "write error");
  } else if (rename(o->tmp, o->path) != 0) {
    snprintf(why, len, "cannot rename %s to it: %s", o->tmp, strerror(errno));
    bad = 1;
  }
  if (bad) unlink(o->tmp);
  o->tmp[0] = '\0';
  return bad ? -1 : 0;
}

#endif /* GMR_TOOLS_OUTFILE_H */
