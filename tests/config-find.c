/* config-find.c: tests of gmr_config_find (configurations by file or by
 * name) and gmr_version.
 *
 * Runs in a fresh temporary directory holding config/mine.yaml and a file
 * named plain.yaml: a path is itself, an existing file is itself, a name is
 * found in ./config with or without .yaml, an unknown name is GMR_EIO, a
 * buffer too small is GMR_EINVAL with the buffer untouched.  The installed
 * directory (GMR_PKGDATADIR) is checked by CI on the installed package. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build-config.h"
#include "gmr.h"
#include "tap.h"

static void touch(const char *path) {
  FILE *f = fopen(path, "w");
  if (f != NULL) {
    fputs("policy: direct\n", f);
    fclose(f);
  }
}

int main(void) {
  char version[32];
  snprintf(version, sizeof version, "%d.%d.%d", GMR_VERSION_MAJOR, GMR_VERSION_MINOR,
           GMR_VERSION_PATCH);
  is_str(gmr_version(), version, "gmr_version() is the header's version");
  is_str(gmr_version(), PACKAGE_VERSION, "and configure's (PACKAGE_VERSION)");

  const char *tmp = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/gmr-config-find.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(tmpl) == NULL || chdir(tmpl) != 0) {
    skip_all("cannot make a temporary directory");
    return 0;
  }
  mkdir("config", 0700);
  touch("config/mine.yaml");
  touch("config/bare");
  touch("plain.yaml");

  char out[256];
  is_int(gmr_config_find("mine", out, sizeof out), 0, "a name is found in ./config");
  is_str(out, "config/mine.yaml", "as NAME.yaml");
  is_int(gmr_config_find("mine.yaml", out, sizeof out), 0, "NAME.yaml is found too");
  is_str(out, "config/mine.yaml", "as itself in ./config");
  is_int(gmr_config_find("bare", out, sizeof out), 0, "a file without .yaml in ./config");
  is_str(out, "config/bare", "found under its own name first");
  is_int(gmr_config_find("plain.yaml", out, sizeof out), 0, "an existing file");
  is_str(out, "plain.yaml", "is itself");
  is_int(gmr_config_find("/no/such/dir/x.yaml", out, sizeof out), 0,
         "a path (with '/') is itself, found or not");
  is_str(out, "/no/such/dir/x.yaml", "unchanged");
  strcpy(out, "untouched");
  is_int(gmr_config_find("nosuchname", out, sizeof out), GMR_EIO, "an unknown name: GMR_EIO");
  is_str(out, "untouched", "out is untouched on failure");
  char small[8] = "keep";
  is_int(gmr_config_find("mine", small, sizeof small), GMR_EINVAL,
         "a path longer than the buffer: GMR_EINVAL");
  is_str(small, "keep", "the short buffer is untouched");
  is_int(gmr_config_find("", out, sizeof out), GMR_EINVAL, "an empty name: GMR_EINVAL");
  is_int(gmr_config_find(NULL, out, sizeof out), GMR_EINVAL, "NULL: GMR_EINVAL");
  is_int(gmr_config_find("mine", NULL, 10), GMR_EINVAL, "a NULL buffer: GMR_EINVAL");
  is_str(gmr_config_dir(), GMR_PKGDATADIR, "gmr_config_dir() is the package data directory");

  /* A name found by gmr_config_find loads. */
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  gmr_config_find("mine", out, sizeof out);
  is_int(gmr_config_load_file(out, &cfg, &err), 0, "the file found loads");
  gmr_config_free(cfg);

  unlink("config/mine.yaml");
  unlink("config/bare");
  rmdir("config");
  unlink("plain.yaml");
  if (chdir("/") == 0) rmdir(tmpl);
  return done_testing();
}
