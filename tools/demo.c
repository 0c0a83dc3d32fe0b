/* demo.c: gmr-demo, a short tour of the C interface.
 *
 *   gmr-demo [CONFIG]       allocate a few tensors on the simulated device
 *                           under CONFIG and print the summary
 *   gmr-demo --reference    print the configuration reference (docs/config.md)
 *
 * Exit status: 0, or 1 when the configuration, the runtime or a file the
 * runtime writes on its own (GMR_TRACE, GMR_SNAPSHOT) fails.
 */
#include <stdio.h>
#include <string.h>

#include "gmr.h"

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--reference") == 0) return gmr_config_write_reference(stdout);
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: gmr-demo [CONFIG.yaml] | --reference\n");
    return 0;
  }
  gmr_config_t *cfg;
  gmr_error_t err;
  int rc = argc > 1 ? gmr_config_load_file(argv[1], &cfg, &err)
                    : gmr_config_load_string("policy: direct\n", &cfg, &err);
  if (rc != 0) {
    fprintf(stderr, "gmr-demo: %s\n", err.message);
    return 1;
  }
  gmr_runtime_t *rt;
  gmr_sim_options_t sim = {.capacity = 16ull << 30};
  rc = gmr_runtime_new_sim(cfg, &sim, &rt);
  gmr_config_free(cfg);
  if (rc != 0) {
    fprintf(stderr, "gmr-demo: cannot create the runtime: %s: %s\n", gmr_strerror(rc),
            gmr_last_error(NULL));
    return 1;
  }
  /* A small training-like pattern: weights stay, activations come and go. */
  static const size_t weights[] = {154389504, 3145728, 3072, 2359296, 9437184};
  void *w[5], *act[8];
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
