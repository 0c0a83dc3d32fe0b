/* config.c: tests of the YAML configuration loader: good files, the ready
 * files in config/, and every kind of bad input with file:line:column. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gmr.h"
#include "tap.h"

static int load(const char *yaml, gmr_error_t *err) {
  gmr_config_t *cfg = NULL;
  memset(err, 0, sizeof *err);
  int rc = gmr_config_load_string(yaml, &cfg, err);
  gmr_config_free(cfg);
  return rc;
}

static void rejects(const char *yaml, int line, int col, const char *needle, const char *what) {
  gmr_error_t err;
  int rc = load(yaml, &err);
  is_int(rc, GMR_ECONFIG, "rejects %s", what);
  ok(err.line == line && err.column == col, "  at %d:%d (got %d:%d)", line, col, err.line,
     err.column);
  like(err.message, needle, "  says what was expected");
}

int main(void) {
  gmr_error_t err;
  gmr_config_t *cfg = NULL;

  is_int(load("policy: direct\n", &err), 0, "a one-line configuration loads");
  is_int(load("policy: {name: direct}\n", &err), 0, "the mapping form loads");
  is_int(load("device: {backend: sim, capacity: 8GiB, granularity: 2MiB, host_backed: true}\n"
              "policy: {name: direct}\n",
              &err),
         0, "a device section loads");
  is_int(load("policy: {name: limit, bytes: 8GiB, upstream: {name: direct}}\n", &err), 0,
         "a limit over direct loads");
  is_int(load("policy: direct\nlimit: {fraction: 0.5, counts: reserved}\n", &err), 0,
         "a top-level limit loads");

  ok(gmr_config_load_string("policy: direct\nlimit: {bytes: 1GiB}\n", &cfg, &err) == 0 &&
         strcmp(gmr_config_policy_name(cfg), "limit") == 0,
     "the top-level limit wraps the policy");
  gmr_config_free(cfg);
  gmr_config_free(NULL);
  ok(1, "gmr_config_free(NULL) is a no-op");

  /* Malformed and invalid input. */
  rejects("policy: {name: direct\n", 2, 1, "malformed YAML", "unclosed flow mapping");
  rejects("policy:\n  name: direct\n   bad: 1\n", 3, 7, "malformed YAML", "bad indentation");
  rejects("policy: direct\nfoo: 1\n", 2, 1, "unknown key 'foo'", "an unknown top-level key");
  rejects("policy: {name: nosuch}\n", 1, 16, "unknown policy 'nosuch'", "an unknown policy");
  rejects("policy:\n  name: limit\n  bytes: 8GiB\n  colour: red\n  upstream: direct\n", 4, 3,
          "unknown key 'colour' in policy 'limit'", "an unknown option");
  rejects("policy:\n  name: limit\n  bytes: lots\n  upstream: direct\n", 3, 10,
          "'lots' is not a size for 'bytes'", "a size that is not a size");
  rejects("policy:\n  name: limit\n  fraction: 1.5\n  upstream: direct\n", 3, 13,
          "too large for 'fraction'", "an out-of-range fraction");
  rejects("policy:\n  name: limit\n  fraction: 0\n  upstream: direct\n", 3, 13,
          "too small for 'fraction'", "a zero fraction");
  rejects("policy:\n  name: limit\n  counts: [a, b]\n  upstream: direct\n", 3, 11,
          "takes a single value, not a list", "a list where a scalar is expected");
  rejects("policy:\n  name: limit\n  counts: everything\n  upstream: direct\n", 3, 11,
          "expected one of: allocated, reserved", "a bad choice");
  rejects("policy:\n  name: limit\n  bytes: 1GiB\n", 2, 3,
          "add 'upstream:", "a limit without upstream");
  rejects("policy:\n  name: limit\n  bytes: 1GiB\n  fraction: 0.5\n  upstream: direct\n", 2, 3,
          "exactly one of 'bytes'", "both bytes and fraction");
  rejects("device: {host_backed: maybe}\npolicy: direct\n", 1, 23,
          "not a boolean for 'host_backed'", "a bad boolean");
  rejects("device: {granularity: 3MiB}\npolicy: direct\n", 1, 9, "power of two",
          "a granularity that is not a power of two");
  rejects("policy: direct\npolicy: direct\n", 2, 1, "appears twice", "a duplicate key");
  rejects("device: {backend: tpu}\npolicy: direct\n", 1, 19, "expected one of: auto, sim, cuda",
          "an unknown backend");
  rejects("- policy\n", 1, 1, "expected a mapping", "a list at the top");
  rejects("device: {backend: sim}\n", 1, 1, "no 'policy:' section", "a missing policy");
  rejects("policy: direct\n---\npolicy: direct\n", 3, 1, "second one", "two documents");

  memset(&err, 0, sizeof err);
  is_int(gmr_config_load_string("", &cfg, &err), GMR_ECONFIG, "an empty string is rejected");
  like(err.message, "empty", "  as empty");

  /* Files. */
  memset(&err, 0, sizeof err);
  is_int(gmr_config_load_file("/nonexistent/gmr.yaml", &cfg, &err), GMR_EIO,
         "a missing file is GMR_EIO");
  like(err.message, "/nonexistent/gmr.yaml: cannot open the configuration", "  naming the file");
  char path[4096];
  snprintf(path, sizeof path, "%s/config/direct.yaml", tap_srcdir());
  is_int(gmr_config_load_file(path, &cfg, &err), 0, "config/direct.yaml loads");
  gmr_config_free(cfg);
  FILE *f = tmpfile();
  ok(f != NULL, "a temporary file");
  snprintf(path, sizeof path, "/tmp/gmr-config-test-%d.yaml", (int)getpid());
  FILE *w = fopen(path, "w");
  fputs("# a comment\npolicy:\n  name: direct\n  extra: 1\n", w);
  fclose(w);
  memset(&err, 0, sizeof err);
  is_int(gmr_config_load_file(path, &cfg, &err), GMR_ECONFIG, "a bad file is GMR_ECONFIG");
  char want[4200];
  snprintf(want, sizeof want, "%s:4:3: unknown key 'extra' in policy 'direct'", path);
  like(err.message, want, "  with file:line:column");
  remove(path);
  if (f) fclose(f);

  /* NULL arguments. */
  is_int(gmr_config_load_string(NULL, &cfg, &err), GMR_EINVAL, "NULL text is GMR_EINVAL");
  is_int(gmr_config_load_file(NULL, &cfg, &err), GMR_EINVAL, "NULL path is GMR_EINVAL");
  is_int(gmr_config_load_string("policy: direct\n", NULL, &err), GMR_EINVAL,
         "NULL out is GMR_EINVAL");

  /* The reference is generated from the tables. */
  FILE *ref = tmpfile();
  is_int(gmr_config_write_reference(ref), 0, "the reference is written");
  rewind(ref);
  char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, ref);
  text[n] = '\0';
  fclose(ref);
  like(text, "## policy `limit`", "  it documents the limit policy");
  like(text, "| `host_backed` | boolean | false |", "  and the device options");
  return done_testing();
}
