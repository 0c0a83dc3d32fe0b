/* config.h: the parsed form of a configuration, shared by config.c and
 * runtime.c (yaml.h stays inside config.c). */
#ifndef GMR_CONFIG_H
#define GMR_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gmr.h"

typedef struct gmr_policy_cfg_s gmr_policy_cfg_t;

enum { GMR_DEVICE_AUTO = 0, GMR_DEVICE_SIM = 1, GMR_DEVICE_CUDA = 2 };

typedef struct gmr_device_opts_s {
  int backend;          /* GMR_DEVICE_* */
  uint64_t capacity;    /* simulator: bytes; 0 = default */
  uint64_t granularity; /* simulator: bytes; 0 = default */
  bool host_backed;     /* simulator */
} gmr_device_opts_t;

struct gmr_config_s {
  char *source; /* file name or "<string>" */
  gmr_device_opts_t device;
  gmr_policy_cfg_t *policy; /* the outermost policy */
  char *trace_path;         /* NULL: none (GMR_TRACE may still name one) */
  /* Uses: 1 for the caller of gmr_config_load_*, plus 1 per runtime built
   * from it (its private pools are built from the same configuration);
   * gmr_config_free drops one and frees at 0. */
  _Atomic int refs;
};

/* One more use of cfg (a runtime keeps its configuration); gmr_config_free
 * drops it. */
gmr_config_t *gmr__config_retain(const gmr_config_t *cfg);

void gmr__policy_cfg_free(gmr_policy_cfg_t *pc);

#endif /* GMR_CONFIG_H */
