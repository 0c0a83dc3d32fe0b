/* options.c: tests of gmr_policy_options and gmr_policy_name, the public view
 * of the policies' option tables (lib/runtime/options.c).
 *
 * Every policy of the registry is listed; its options come in table order
 * with their types and ranges; the values to tune that gmr-compare --suggest
 * searches are the tables' own, and each of them loads as YAML (a "Kx peak"
 * value stands for a size or a share, and loads once written as one).
 */
#include <string.h>

#include "gmr.h"
#include "tap.h"

static const gmr_option_info_t *find(const gmr_option_info_t *o, size_t n, const char *key) {
  for (size_t i = 0; i < n; ++i)
    if (strcmp(o[i].key, key) == 0) return &o[i];
  return NULL;
}

/* Each tuned value of each option loads in a configuration of the policy. */
static void tuned_values_load(const char *policy, const gmr_option_info_t *o, size_t n) {
  size_t tried = 0, loaded = 0;
  for (size_t i = 0; i < n; ++i) {
    for (const char *const *v = o[i].tune; v && *v; ++v) {
      char yaml[256], value[64];
      if (strstr(*v, "x peak") != NULL)
        snprintf(value, sizeof value, "%s", o[i].type == GMR_OPTION_SIZE ? "1GiB" : "0.5");
      else
        snprintf(value, sizeof value, "%s", *v);
      snprintf(yaml, sizeof yaml, "policy:\n  name: %s\n  %s: %s\n", policy, o[i].key, value);
      gmr_config_t *cfg = NULL;
      ++tried;
      if (gmr_config_load_string(yaml, &cfg, NULL) == 0)
        ++loaded;
      else
        diag("%s: %s: %s does not load", policy, o[i].key, *v);
      gmr_config_free(cfg);
    }
  }
  ok(tried > 0 && loaded == tried, "%s: every tuned value loads (%zu of %zu)", policy, loaded,
     tried);
}

int main(void) {
  size_t n = 0;
  int names = 0;
  for (size_t i = 0; gmr_policy_name(i); ++i)
    names += gmr_policy_options(gmr_policy_name(i), NULL, 0, &n) == 0;
  ok(names >= 5, "every registered policy has a table (%d)", names);
  is_ptr(gmr_policy_name(1000), NULL, "gmr_policy_name past the last is NULL");
  is_int(gmr_policy_options("nosuch", NULL, 0, &n), GMR_EINVAL, "an unknown policy: GMR_EINVAL");
  is_int(gmr_policy_options("caching", NULL, 3, &n), GMR_EINVAL, "out NULL with cap > 0");
  is_int(gmr_policy_options(NULL, NULL, 0, &n), GMR_EINVAL, "policy NULL");

  gmr_option_info_t o[64];
  is_int(gmr_policy_options("caching", o, 64, &n), 0, "caching: listed");
  ok(n >= 9 && n <= 64, "caching: %zu options", n);
  is_str(o[0].key, "max_split_size", "caching: in table order");
  const gmr_option_info_t *ms = find(o, n, "max_split_size");
  ok(ms && ms->type == GMR_OPTION_SIZE && ms->min == 20.0 * 1048576.0 && ms->min_exclusive,
     "caching: max_split_size is a size > 20MiB");
  ok(ms && ms->tune && strcmp(ms->tune[0], "64MiB") == 0,
     "caching: max_split_size is tuned from 64MiB");
  const gmr_option_info_t *fr = find(o, n, "per_process_memory_fraction");
  ok(fr && fr->type == GMR_OPTION_NUMBER && fr->max == 1.0 && fr->tune &&
         strcmp(fr->tune[0], "1.1x peak") == 0,
     "caching: the fraction is tuned in multiples of the peak");
  const gmr_option_info_t *pc = find(o, n, "pytorch_alloc_conf");
  ok(pc && pc->type == GMR_OPTION_STRING && pc->tune == NULL, "caching: a string is not tuned");
  tuned_values_load("caching", o, n);

  size_t few = 0;
  gmr_option_info_t two[2];
  memset(two, 0, sizeof two);
  is_int(gmr_policy_options("caching", two, 2, &few), 0, "a short buffer: 0");
  ok(few == n && two[1].key != NULL, "a short buffer: the count is the whole table's");

  is_int(gmr_policy_options("bfc", o, 64, &n), 0, "bfc: listed");
  const gmr_option_info_t *env = find(o, n, "environment");
  ok(env && env->type == GMR_OPTION_CHOICE && env->choices && strcmp(env->choices[0], "none") == 0,
     "bfc: environment is a choice");
  const gmr_option_info_t *ag = find(o, n, "allow_growth");
  ok(ag && ag->type == GMR_OPTION_BOOL && strcmp(ag->default_text, "false") == 0 && ag->tune,
     "bfc: allow_growth is a tuned boolean, false by default");
  tuned_values_load("bfc", o, n);

  is_int(gmr_policy_options("stitch", o, 64, &n), 0, "stitch: listed");
  tuned_values_load("stitch", o, n);

  is_int(gmr_policy_options("direct", o, 64, &n), 0, "direct: listed");
  is_int((int)n, 0, "direct: no options");
  return done_testing();
}
