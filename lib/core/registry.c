/* registry.c: the table of policies, and building a policy stack.
 *
 * The registry is data: the config loader and the tools enumerate it without
 * knowing any policy by name.  Adding a policy adds one line here.
 */
#include <string.h>

#include "policy.h"

const gmr_policy_ops_t *const gmr__policies[] = {
    &gmr_direct_policy_ops, &gmr_limit_policy_ops,  &gmr_caching_policy_ops,
    &gmr_bfc_policy_ops,    &gmr_stitch_policy_ops, NULL,
};

const gmr_policy_ops_t *gmr__policy_lookup(const char *name) {
  for (int i = 0; gmr__policies[i]; ++i)
    if (strcmp(gmr__policies[i]->name, name) == 0) return gmr__policies[i];
  return NULL;
}

int gmr__policy_create(const gmr_policy_cfg_t *cfg, gmr_backend_t *be, gmr_policy_t **out) {
  gmr_policy_t *p = NULL;
  int err = cfg->ops->create(cfg->opts, be, cfg->upstream, &p);
  if (err != 0) return err;
  *out = p;
  return 0;
}

void gmr__policy_destroy(gmr_policy_t *p) {
  if (p != NULL) p->ops->destroy(p);
}
