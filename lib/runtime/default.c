/* default.c: gmr_default_runtime, the one runtime per device that the
 * framework hooks, the interposer and CuPy share, made on first use from
 * GMR_CONFIG (else the caching policy) and never freed: its GMR_SNAPSHOT and
 * GMR_TRACE outputs are written at exit. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/config-env.h"
#include "core/internal.h"
#include "policy.h"
#include "runtime/runtime.h"

#define DEFAULT_MAX_DEVICES 64
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static gmr_runtime_t *default_runtimes[DEFAULT_MAX_DEVICES];

/* The default runtimes are never freed: GMR_SNAPSHOT's files are written,
 * and GMR_TRACE's buffered lines flushed, at exit (failures are logged). */
static void default_outputs_at_exit(void) {
  pthread_mutex_lock(&default_lock);
  for (int d = 0; d < DEFAULT_MAX_DEVICES; ++d) {
    gmr_runtime_t *rt = default_runtimes[d];
    if (rt != NULL) gmr__runtime_write_outputs(rt);
  }
  pthread_mutex_unlock(&default_lock);
}

int gmr_default_runtime(int device, gmr_runtime_t **out) {
  if (out == NULL || device < 0 || device >= DEFAULT_MAX_DEVICES)
    return gmr__error_set(GMR_EINVAL, "gmr_default_runtime: device %d is out of range", device);
  pthread_mutex_lock(&default_lock);
  int err = 0;
  if (default_runtimes[device] == NULL) {
    gmr_config_t *cfg = NULL;
    gmr_error_t cerr;
    memset(&cerr, 0, sizeof cerr);
    const char *path = gmr__env(GMR_ENV_CONFIG);
    if (path != NULL)
      err = gmr_config_load_file(path, &cfg, &cerr);
    else
      err = gmr_config_load_string(
          gmr__policy_lookup("caching") ? "policy: caching\n" : "policy: direct\n", &cfg, &cerr);
    if (err != 0) {
      gmr__error_set(err, "GMR_CONFIG: %s", cerr.message);
      gmr__log(GMR_LOG_ERROR, "%s", cerr.message);
    } else {
      err = gmr_runtime_new(cfg, device, &default_runtimes[device]);
      gmr_config_free(cfg);
      static bool at_exit_registered; /* under default_lock */
      if (err == 0 && !at_exit_registered && gmr__runtime_has_outputs(default_runtimes[device]))
        at_exit_registered = atexit(default_outputs_at_exit) == 0;
    }
  }
  if (err == 0) *out = default_runtimes[device];
  pthread_mutex_unlock(&default_lock);
  return err;
}
