/* compare-config.c: configuration arguments checked before any work.
 *
 * A CONFIG that names no file (a typo: `pytorh`, `config/pytroch.yaml`) is a
 * usage error: one line on stderr, with the nearest shipped configuration's
 * name when one is close ("did you mean pytorch?"), and exit status 2 before
 * any trace is read or replayed.  The names are those of ./config/NAME.yaml and
 * of the installed directory, as compare.c's search finds them; nearness is
 * the optimal-string-alignment distance (an edit or a swap of two neighbours
 * costs 1), close when at most 2 and at most a third of the longer name.
 * With none close, the line lists the names, sorted.  A file that exists
 * but does not load is not checked here: that stays a configuration that
 * could not run, beside the others.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compare.h"

#ifndef GMR_PKGDATADIR
#define GMR_PKGDATADIR "/usr/local/share/gmr"
#endif

enum { CC_MAX_NAMES = 256, CC_NAME_LEN = 128 };

typedef struct cc_names_s {
  char name[CC_MAX_NAMES][CC_NAME_LEN];
  size_t n;
} cc_names_t;

static int cc_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && memcmp(s + (n - k), suffix, k) == 0;
}

static int cc_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

/* The NAME of every NAME.yaml in `dir`, once each. */
static void cc_collect(cc_names_t *names, const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && names->n < CC_MAX_NAMES) {
    size_t len = strlen(e->d_name);
    if (!cc_ends_with(e->d_name, ".yaml") || len - 5 >= CC_NAME_LEN) continue;
    char name[CC_NAME_LEN];
    memcpy(name, e->d_name, len - 5);
    name[len - 5] = '\0';
    size_t k = 0;
    while (k < names->n && strcmp(names->name[k], name) != 0)
      ++k;
    if (k == names->n) memcpy(names->name[names->n++], name, len - 4);
  }
  closedir(d);
}

static int cc_cmp(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

/* Optimal string alignment distance between a and b (both < CC_NAME_LEN). */
static size_t cc_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  static size_t d[CC_NAME_LEN + 1][CC_NAME_LEN + 1];
  for (size_t i = 0; i <= n; ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= m; ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

/* The shipped name nearest to `typed`, or NULL when none is close. */
static const char *cc_nearest(const cc_names_t *names, const char *typed) {
  if (strlen(typed) >= CC_NAME_LEN) return NULL;
  const char *best = NULL;
  size_t best_d = (size_t)-1;
  for (size_t k = 0; k < names->n; ++k) {
    size_t d = cc_distance(typed, names->name[k]);
    size_t longer = strlen(typed) > strlen(names->name[k]) ? strlen(typed) : strlen(names->name[k]);
    if (d > 2 || 3 * d > longer) continue;
    if (d < best_d || (d == best_d && strcmp(names->name[k], best) < 0)) {
      best = names->name[k];
      best_d = d;
    }
  }
  return best;
}

/* The name a CONFIG argument stands for: its base name without .yaml/.yml. */
static void cc_base(const char *arg, char *out, size_t len) {
  const char *b = strrchr(arg, '/');
  b = b ? b + 1 : arg;
  size_t n = strlen(b);
  if (cc_ends_with(b, ".yaml"))
    n -= 5;
  else if (cc_ends_with(b, ".yml"))
    n -= 4;
  if (n >= len) n = len - 1;
  memcpy(out, b, n);
  out[n] = '\0';
}

int compare_check_configs(char *const *args, int n) {
  static const char *const dirs[] = {"config", GMR_PKGDATADIR, GMR_PKGDATADIR "/config"};
  for (int i = 0; i < n; ++i) {
    const char *arg = args[i];
    int pathlike =
        strchr(arg, '/') != NULL || cc_ends_with(arg, ".yaml") || cc_ends_with(arg, ".yml");
    if (cc_exists(arg)) continue;
    int found = 0;
    char path[4096];
    for (size_t d = 0; !pathlike && !found && d < sizeof dirs / sizeof dirs[0]; ++d) {
      snprintf(path, sizeof path, "%s/%s.yaml", dirs[d], arg);
      found = cc_exists(path);
    }
    if (found) continue;
    cc_names_t *names = calloc(1, sizeof *names);
    if (names != NULL)
      for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; ++d)
        cc_collect(names, dirs[d]);
    if (names != NULL) qsort(names->name, names->n, sizeof names->name[0], cc_cmp);
    char base[CC_NAME_LEN];
    cc_base(arg, base, sizeof base);
    const char *near = names ? cc_nearest(names, base) : NULL;
    char hint[1024] = "";
    if (near != NULL) {
      snprintf(hint, sizeof hint, "; did you mean %s?", near);
    } else if (names != NULL && names->n > 0) {
      size_t off = (size_t)snprintf(hint, sizeof hint, "; the configurations are:");
      for (size_t k = 0; k < names->n && off < sizeof hint; ++k)
        off +=
            (size_t)snprintf(hint + off, sizeof hint - off, "%s %s", k ? "," : "", names->name[k]);
    }
    if (pathlike)
      fprintf(stderr, "gmr-compare: no configuration file '%s'%s\n", arg, hint);
    else
      fprintf(stderr,
              "gmr-compare: no configuration named '%s': not a file, and neither ./config/%s.yaml "
              "nor %s/%s.yaml exists%s\n",
              arg, arg, GMR_PKGDATADIR, arg, hint);
    free(names);
    return 2;
  }
  return 0;
}
