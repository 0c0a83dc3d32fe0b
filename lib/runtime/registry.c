/* registry.c: the table of policies.
 *
 * The registry is data: the config loader and the tools enumerate it without
 * knowing any policy by name.  Adding a policy adds one line here.  Stacks
 * are built by gmr__policy_create (policies/policy.c).
 */
#include <string.h>

#include "policy.h"

const gmr_policy_ops_t *const gmr__policies[] = {
    &gmr__direct_policy, &gmr__limit_policy,  &gmr__caching_policy,
    &gmr__bfc_policy,    &gmr__stitch_policy, NULL,
};

const gmr_policy_ops_t *gmr__policy_lookup(const char *name) {
  for (int i = 0; gmr__policies[i]; ++i)
    if (strcmp(gmr__policies[i]->name, name) == 0) return gmr__policies[i];
  return NULL;
}
