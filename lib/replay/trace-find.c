/* trace-find.c: traces named by file or by name (gmr_trace_find), as
 * configurations are (lib/runtime/config-find.c).
 *
 * For a name N without '/' that is not an existing file (nor "-"):
 *   ./traces/N, ./traces/N.csv, DIR/N, DIR/N.csv
 * where DIR = gmr_trace_dir() = the package data directory's traces/
 * (GMR_PKGDATADIR "/traces", e.g. /usr/share/gmr/traces), where `make
 * install` and the gmr-traces package put the shipped traces.  The first
 * regular file wins; nothing is read here.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "gmr_replay.h"

#ifndef GMR_PKGDATADIR
#define GMR_PKGDATADIR "/usr/local/share/gmr"
#endif

const char *gmr_trace_dir(void) {
  return GMR_PKGDATADIR "/traces";
}

static bool trace_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Copy `path` into out[len]; 0, or GMR_EINVAL when it does not fit. */
static int trace_copy(char *out, size_t len, const char *path) {
  size_t n = strlen(path);
  if (n + 1 > len) return GMR_EINVAL;
  memcpy(out, path, n + 1);
  return 0;
}

int gmr_trace_find(const char *name, char *out, size_t len) {
  if (name == NULL || name[0] == '\0' || out == NULL || len == 0) return GMR_EINVAL;
  if (strcmp(name, "-") == 0 || strchr(name, '/') != NULL || trace_is_file(name))
    return trace_copy(out, len, name);
  static const char *const suffixes[] = {"", ".csv"};
  const char *dirs[] = {"traces", gmr_trace_dir()};
  char path[4096];
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; ++d)
    for (size_t s = 0; s < sizeof suffixes / sizeof suffixes[0]; ++s) {
      int w = snprintf(path, sizeof path, "%s/%s%s", dirs[d], name, suffixes[s]);
      if (w < 0 || (size_t)w >= sizeof path) return GMR_EINVAL;
      if (trace_is_file(path)) return trace_copy(out, len, path);
    }
  return GMR_EIO;
}
