/* sim-runtime.h: what most test programs need around the public API: a
 * runtime on a fresh simulated device from YAML text or from a file under
 * config/, and a policy's summary as a string.  Failures print a TAP
 * diagnostic and return NULL, so the calling check fails with a reason. */
#ifndef GMR_SIM_RUNTIME_H
#define GMR_SIM_RUNTIME_H

#include <stdio.h>
#include <stdlib.h>

#include "gmr.h"
#include "tap.h"

/* capacity 0: the configuration's or the simulator's default. */
static inline gmr_runtime_t *sim_runtime(const char *yaml, uint64_t capacity, int host_backed) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_string(yaml, &cfg, &err) != 0) {
    diag("config: %s", err.message);
    return NULL;
  }
  gmr_sim_options_t o = {.capacity = capacity, .host_backed = host_backed};
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  if (rc != 0) diag("runtime: %s: %s", gmr_strerror(rc), gmr_last_error(NULL));
  return rt;
}

/* A file under config/ in the source tree. */
static inline gmr_runtime_t *sim_runtime_file(const char *name, uint64_t capacity) {
  char path[1024];
  snprintf(path, sizeof path, "%s/config/%s", tap_srcdir(), name);
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  if (gmr_config_load_file(path, &cfg, &err) != 0) {
    diag("%s", err.message);
    return NULL;
  }
  gmr_sim_options_t o = {.capacity = capacity};
  gmr_runtime_t *rt = NULL;
  int rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  if (rc != 0) diag("runtime: %s: %s", gmr_strerror(rc), gmr_last_error(NULL));
  return rt;
}

/* gmr_summary's text; free() it. */
static inline char *summary_string(gmr_runtime_t *rt) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return NULL;
  gmr_summary(rt, f);
  fclose(f);
  return buf;
}

#endif /* GMR_SIM_RUNTIME_H */
