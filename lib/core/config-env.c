/* config-env.c: the one place the library reads the environment.
 *
 * Two kinds of variables: gmr's own (GMR_*, the table below: what the
 * runtime and the logger consult), and a framework's, named by the option
 * table entry they override (`env` in gmr_opt_desc_t: TensorFlow's
 * TF_FORCE_GPU_ALLOW_GROWTH, JAX's XLA_PYTHON_CLIENT_*), applied to a copy
 * of a policy's options when a runtime is created (policies/policy.c).
 * docs/config.md lists both, generated from the same tables.
 *
 * Calls nothing of gmr but the parsers of util.c and the env_apply hooks it
 * is handed, so the logger (error.c) may use it without a cycle.
 */
#include <stdlib.h>
#include <string.h>

#include "core/config-env.h"

typedef struct env_desc_s {
  const char *name;
  const char *help;
} env_desc_t;

static const env_desc_t env_vars[GMR_ENV_COUNT] = {
    [GMR_ENV_CONFIG] = {"GMR_CONFIG", "The configuration file of the default runtimes "
                                      "(gmr_default_runtime, the framework adapters); unset: "
                                      "`policy: caching`."},
    [GMR_ENV_TRACE] = {"GMR_TRACE", "Record every allocation and free into this file (CSV) "
                                    "when the configuration has no `trace:`."},
    [GMR_ENV_HISTORY] = {"GMR_HISTORY", "Keep this many entries of memory history in every new "
                                        "runtime (gmr_history_enable); 0: off."},
    [GMR_ENV_SNAPSHOT] = {"GMR_SNAPSHOT",
                          "Write the memory snapshot when a runtime is freed (the default "
                          "runtimes: at exit) to this path, then path.1, path.2..."},
    [GMR_ENV_LOG] = {"GMR_LOG", "Log warnings and errors to stderr (unless a callback is set "
                                "with gmr_set_log); 0 or empty: silent."},
};

const char *gmr__env(gmr_env_var_t var) {
  if ((unsigned)var >= GMR_ENV_COUNT) return NULL;
  const char *v = getenv(env_vars[var].name);
  return v != NULL && *v != '\0' ? v : NULL;
}

int gmr__env_history(size_t *out, const char **out_text) {
  const char *v = gmr__env(GMR_ENV_HISTORY);
  *out = 0;
  *out_text = v;
  if (v == NULL) return 0;
  uint64_t n;
  if (gmr__parse_u64(v, &n) != 0) return GMR_EINVAL;
  *out = n > SIZE_MAX ? SIZE_MAX : (size_t)n;
  return 0;
}

bool gmr__env_log(void) {
  const char *v = gmr__env(GMR_ENV_LOG);
  return v != NULL && strcmp(v, "0") != 0;
}

#define ENV_MAX_NAMES 4 /* variables one option entry may name */

int gmr__config_apply_env(const gmr_opt_desc_t *desc, void *opts, int device, char *err,
                          size_t errlen) {
  for (const gmr_opt_desc_t *d = desc; d != NULL && d->key != NULL; ++d) {
    if (d->env == NULL || d->env_apply == NULL) continue;
    const char *values[ENV_MAX_NAMES] = {NULL};
    bool any = false;
    size_t n = 0;
    for (const char *p = d->env; *p != '\0' && n < ENV_MAX_NAMES;) {
      size_t len = strcspn(p, " ");
      char name[64];
      if (len > 0 && len < sizeof name) {
        memcpy(name, p, len);
        name[len] = '\0';
        values[n] = getenv(name);
        any |= values[n] != NULL;
        ++n;
      }
      p += len;
      p += strspn(p, " ");
    }
    if (!any) continue;
    int rc = d->env_apply(values, opts, device, err, errlen);
    if (rc != 0) return rc;
  }
  return 0;
}

void gmr__env_write_reference(FILE *out) {
  fprintf(out, "\n## environment\n\n"
               "gmr's own variables (a framework's variables are listed with the option they "
               "override, above):\n\n"
               "| variable | meaning |\n|---|---|\n");
  for (int i = 0; i < GMR_ENV_COUNT; ++i)
    fprintf(out, "| `%s` | %s |\n", env_vars[i].name, env_vars[i].help);
}
