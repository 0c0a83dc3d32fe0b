/* demo.c: gmr-demo, a short tour of the C interface.
 *
 *   gmr-demo [CONFIG]       allocate a few tensors on a simulated device
 *                           under CONFIG (a file, or a name gmr_config_find
 *                           resolves) and print the policy's summary
 *   gmr-demo --reference    print the configuration reference (docs/config.md)
 *
 * The simulated device is the library's default one (GMR_SIM_DEFAULT_CAPACITY
 * bytes).  Options are parsed with getopt_long before anything else runs;
 * usage errors exit 2.
 * Exit status 1 also when a file the runtime writes on its own (GMR_TRACE,
 * GMR_SNAPSHOT) could not be written.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gmr.h"

static const char demo_usage[] =
    "usage: gmr-demo [CONFIG]\n"
    "       gmr-demo --reference\n"
    "\n"
    "Allocate a few tensors, as training steps would, on a fresh simulated\n"
    "device under CONFIG (a YAML file, or the name of a configuration in\n"
    "./config or the installed ones, e.g. pytorch; default: policy direct),\n"
    "then print the policy's summary.\n"
    "\n"
    "  --reference     print the configuration reference (every policy, every\n"
    "                  option) as Markdown, as docs/config.md holds it\n"
    "  -h, --help      print this help and exit\n"
    "  -V, --version   print the version and exit\n"
    "\n"
    "Exit status: 0 on success, 1 when the configuration does not load or the\n"
    "runtime cannot be made, 2 for usage errors.\n";

int main(int argc, char **argv) {
  static const struct option longopts[] = {{"reference", no_argument, NULL, 'r'},
                                           {"help", no_argument, NULL, 'h'},
                                           {"version", no_argument, NULL, 'V'},
                                           {NULL, 0, NULL, 0}};
  int reference = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hV", longopts, NULL)) != -1) {
    switch (c) {
    case 'r':
      reference = 1;
      break;
    case 'h':
      fputs(demo_usage, stdout);
      return 0;
    case 'V':
      return cli_version("gmr-demo");
    default:
      return cli_bad_option("gmr-demo", argv, c, longopts);
    }
  }
  if (argc - optind > 1)
    return cli_usage_error("gmr-demo", "one CONFIG at most, not '%s' too", argv[optind + 1]);
  if (reference) {
    if (optind < argc)
      return cli_usage_error("gmr-demo", "--reference takes no CONFIG ('%s')", argv[optind]);
    return gmr_config_write_reference(stdout) == 0 ? 0 : 1;
  }

  gmr_config_t *cfg;
  gmr_error_t err;
  int rc;
  if (optind < argc) {
    char path[4096];
    if (gmr_config_find(argv[optind], path, sizeof path) != 0) {
      fprintf(stderr,
              "gmr-demo: no configuration '%s' (not a file, nor a name in ./config or %s)\n",
              argv[optind], gmr_config_dir());
      return 1;
    }
    rc = gmr_config_load_file(path, &cfg, &err);
  } else {
    rc = gmr_config_load_string("policy: direct\n", &cfg, &err);
  }
  if (rc != 0) {
    fprintf(stderr, "gmr-demo: %s\n", err.message);
    return 1;
  }
  gmr_runtime_t *rt;
  rc = gmr_runtime_new_sim(cfg, NULL, &rt);
  gmr_config_free(cfg);
  if (rc != 0) {
    fprintf(stderr, "gmr-demo: cannot create the runtime: %s: %s\n", gmr_strerror(rc),
            gmr_last_error(NULL));
    return 1;
  }
  /* A small training-like pattern: weights stay, activations come and go. */
  static const size_t weights[] = {154389504, 3145728, 3072, 2359296, 9437184};
  void *w[5] = {NULL}, *act[8] = {NULL};
  for (int i = 0; i < 5; ++i)
    gmr_alloc(rt, weights[i], GMR_SIM_STREAM(0), &w[i]);
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 8; ++i)
      gmr_alloc(rt, (size_t)(i + 1) * 6 << 20, GMR_SIM_STREAM(0), &act[i]);
    for (int i = 7; i >= 0; --i)
      gmr_free(rt, act[i]);
  }
  printf("policy %s on the %s device\n\n", gmr_runtime_policy(rt), gmr_runtime_backend(rt));
  gmr_summary(rt, stdout);
  for (int i = 0; i < 5; ++i)
    gmr_free(rt, w[i]);
  /* GMR_TRACE / GMR_SNAPSHOT files that could not be written fail the tool. */
  rc = gmr_runtime_close(rt);
  if (rc != 0) {
    fprintf(stderr, "gmr-demo: %s\n", gmr_last_error(NULL));
    return 1;
  }
  return 0;
}
