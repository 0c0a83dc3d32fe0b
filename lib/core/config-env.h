/* config-env.h: the environment, read in one place (config-env.c).
 *
 * Every environment variable gmr's library reads is named here or in an
 * option table entry's `env` (gmr_opt_desc_t), and read by config-env.c
 * only; the interposer's constructor (lib/adapters/interpose.c) keeps its
 * own two switches, since it runs before the library may be used.
 * config-env.c calls nothing of gmr but util.c's parsers, so any file may
 * call it. */
#ifndef GMR_CONFIG_ENV_H
#define GMR_CONFIG_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/internal.h"

/* gmr's own variables. */
typedef enum gmr_env_var_e {
  GMR_ENV_CONFIG,   /* GMR_CONFIG: the default runtimes' configuration file */
  GMR_ENV_TRACE,    /* GMR_TRACE: record a trace when the configuration names none */
  GMR_ENV_HISTORY,  /* GMR_HISTORY: entries of memory history new runtimes keep */
  GMR_ENV_SNAPSHOT, /* GMR_SNAPSHOT: write a memory snapshot when a runtime is freed */
  GMR_ENV_LOG,      /* GMR_LOG: log warnings and errors to stderr */
  GMR_ENV_COUNT
} gmr_env_var_t;

/* The variable's value; NULL when unset or empty. */
const char *gmr__env(gmr_env_var_t var);
/* GMR_HISTORY as a count: 0 when unset or empty; GMR_EINVAL when it is not a
 * number (*out_text: the value, for the message).  @return 0, GMR_EINVAL */
int gmr__env_history(size_t *out, const char **out_text);
/* GMR_LOG: set, non-empty and not "0". */
bool gmr__env_log(void);

/* Apply the variables of an option table to `opts` (a policy's options, at
 * runtime creation): for each entry with `env`, when one of its variables is
 * set, call its env_apply.  @return 0, or GMR_ECONFIG with a sentence in err */
int gmr__config_apply_env(const gmr_opt_desc_t *desc, void *opts, int device, char *err,
                          size_t errlen);

/* The reference's section on gmr's own variables (docs/config.md). */
void gmr__env_write_reference(FILE *out);

#endif /* GMR_CONFIG_ENV_H */
