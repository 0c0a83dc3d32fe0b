/* options.c: the policies' option tables, as the public API shows them.
 *
 * gmr_policy_options copies a policy's gmr_opt_desc_t table (the one config.c
 * parses YAML with and docs/config.md is written from) into the public
 * gmr_option_info_t, so tools learn what a policy accepts, and what is worth
 * trying when tuning it, without a copy of their own.  Nothing here allocates:
 * the strings are the tables' own, static.
 *
 *   *out_count = number of entries of the table before its {.key = NULL}
 *   out[i] describes table entry i, for i < min(cap, *out_count)
 */
#include <string.h>

#include "core/internal.h"
#include "policy.h"

static gmr_option_type_t options_type(gmr_opt_type_t t) {
  switch (t) {
  case GMR_OPT_BOOL:
    return GMR_OPTION_BOOL;
  case GMR_OPT_SIZE:
    return GMR_OPTION_SIZE;
  case GMR_OPT_INT:
    return GMR_OPTION_INT;
  case GMR_OPT_DOUBLE:
    return GMR_OPTION_NUMBER;
  case GMR_OPT_STRING:
    return GMR_OPTION_STRING;
  case GMR_OPT_ENUM:
    return GMR_OPTION_CHOICE;
  case GMR_OPT_CUSTOM:
    return GMR_OPTION_TEXT;
  case GMR_OPT_TABLE:
    return GMR_OPTION_MAPPING;
  }
  return GMR_OPTION_TEXT;
}

const char *gmr_policy_name(size_t index) {
  for (size_t i = 0; gmr__policies[i]; ++i)
    if (i == index) return gmr__policies[i]->name;
  return NULL;
}

int gmr_policy_options(const char *policy, gmr_option_info_t *out, size_t cap, size_t *out_count) {
  if (policy == NULL || out_count == NULL || (out == NULL && cap > 0)) return GMR_EINVAL;
  const gmr_policy_ops_t *ops = gmr__policy_lookup(policy);
  if (ops == NULL) return GMR_EINVAL;
  size_t n = 0;
  for (const gmr_opt_desc_t *d = ops->opts_desc; d && d->key; ++d, ++n) {
    if (n >= cap) continue;
    out[n] = (gmr_option_info_t){.key = d->key,
                                 .type = options_type(d->type),
                                 .min = d->min,
                                 .max = d->max,
                                 .min_exclusive = d->min_exclusive,
                                 .choices = d->type == GMR_OPT_ENUM ? d->choices : NULL,
                                 .default_text = d->default_text ? d->default_text : "",
                                 .help = d->help ? d->help : "",
                                 .tune = d->tune};
  }
  *out_count = n;
  return 0;
}
