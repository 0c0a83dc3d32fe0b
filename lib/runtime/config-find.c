/* config-find.c: configurations named by file or by name (gmr_config_find).
 *
 * The search, for a name N without '/' that is not an existing file:
 *   ./config/N, ./config/N.yaml, DIR/N, DIR/N.yaml
 * where DIR = gmr_config_dir() = the package data directory configure chose
 * (GMR_PKGDATADIR, e.g. /usr/share/gmr), where `make install` puts config/.
 * The first regular file wins.  Nothing is read here: gmr_config_load_file
 * reports what is wrong inside the file found.
 */
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"

#ifndef GMR_PKGDATADIR
#define GMR_PKGDATADIR "/usr/local/share/gmr"
#endif

const char *gmr_config_dir(void) {
  return GMR_PKGDATADIR;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* out = dir "/" name suffix when it fits; 0, or GMR_EINVAL. */
static int join(char *out, size_t len, const char *dir, const char *name, const char *suffix) {
  size_t d = strlen(dir), n = strlen(name), s = strlen(suffix);
  if (d + 1 + n + s + 1 > len) return GMR_EINVAL;
  memcpy(out, dir, d);
  out[d] = '/';
  memcpy(out + d + 1, name, n);
  memcpy(out + d + 1 + n, suffix, s + 1);
  return 0;
}

int gmr_config_find(const char *name, char *out, size_t len) {
  if (name == NULL || name[0] == '\0' || out == NULL || len == 0) return GMR_EINVAL;
  size_t n = strlen(name);
  if (strchr(name, '/') != NULL || is_file(name)) {
    if (n + 1 > len) return GMR_EINVAL;
    memcpy(out, name, n + 1);
    return 0;
  }
  static const char *const suffixes[] = {"", ".yaml"};
  const char *dirs[] = {"config", gmr_config_dir()};
  char path[4096];
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; ++d)
    for (size_t s = 0; s < sizeof suffixes / sizeof suffixes[0]; ++s) {
      if (join(path, sizeof path, dirs[d], name, suffixes[s]) != 0) return GMR_EINVAL;
      if (!is_file(path)) continue;
      size_t p = strlen(path);
      if (p + 1 > len) return GMR_EINVAL;
      memcpy(out, path, p + 1);
      return 0;
    }
  return GMR_EIO;
}
