/* policy.c: building policy stacks, and the wrappers of policy.h that are
 * off the hot path.
 *
 * The one place that knows what an empty slot means (the default written at
 * each wrapper in policy.h), which lock a call needs (the instance's own,
 * when the policy is not `concurrent`; a concurrent one's quiesce and
 * resume around the whole-state ops: rule 5) and whom a failure belongs to (the
 * runtime in `owner`, set for the whole stack), and where the environment
 * variables of an option table (`env`) reach a policy's options: on a copy,
 * when the policy is created (gmr__config_apply_env reads them).  The runtime and every
 * decorator call policies through these, never through the table.
 * Map: Note [Stack invariant].
 */
#include <string.h>

#include "core/config-env.h"
#include "policy.h"

/* Note [Stack invariant]
 * Invariant: for every instance p of a built stack,
 *     p->serialize == !p->ops->concurrent,  p->lock initialized,
 *     p->owner == the owner of the stack's top (NULL until it is set).
 */

static bool has_env(const gmr_opt_desc_t *desc) {
  for (const gmr_opt_desc_t *d = desc; d != NULL && d->key != NULL; ++d)
    if (d->env != NULL) return true;
  return false;
}

/* create, with the options the environment overrides (their `env`) applied
 * to a copy: the configuration stays as loaded, and each runtime sees the
 * environment of its creation. */
static int create_with_env(const gmr_policy_cfg_t *cfg, gmr_backend_t *be, gmr_policy_t **out) {
  const gmr_policy_ops_t *ops = cfg->ops;
  if (!has_env(ops->opts_desc)) return ops->create(cfg->opts, be, cfg->upstream, out);
  void *opts = gmr__malloc(ops->opts_size);
  if (opts == NULL) return gmr__error_set(GMR_ENOMEM, "%s: out of host memory", ops->name);
  memcpy(opts, cfg->opts, ops->opts_size); /* shallow: env_apply sets plain fields only */
  char why[512] = "";
  int err = gmr__config_apply_env(ops->opts_desc, opts, be->device, why, sizeof why);
  if (err != 0)
    err = gmr__error_set(err, "%s", why);
  else
    err = ops->create(opts, be, cfg->upstream, out);
  gmr__free(opts);
  return err;
}

int gmr__policy_create(const gmr_policy_cfg_t *cfg, gmr_backend_t *be, gmr_policy_t **out) {
  gmr_policy_t *p = NULL;
  int err = create_with_env(cfg, be, &p);
  if (err != 0) return err;
  if (gmr__lock_init(&p->lock) != 0) {
    cfg->ops->destroy(p);
    return gmr__error_set(GMR_ENOMEM, "%s: cannot create the policy's lock", cfg->ops->name);
  }
  p->serialize = !p->ops->concurrent;
  p->owner = NULL;
  *out = p;
  return 0;
}

void gmr__policy_destroy(gmr_policy_t *p) {
  if (p == NULL) return;
  gmr__lock_destroy(&p->lock);
  p->ops->destroy(p);
}

void gmr__policy_set_owner(gmr_policy_t *p, const void *owner) {
  for (; p != NULL; p = p->upstream)
    p->owner = owner;
}

int gmr__policy_failed(const gmr_policy_t *p, int err) {
  gmr__error_tag(p->owner);
  return err;
}

int gmr__policy_charge(gmr_policy_t *p, int64_t bytes) {
  if (p->ops->charge == NULL) return 0;
  gmr__policy_lock(p);
  int err = p->ops->charge(p, bytes);
  gmr__policy_unlock(p);
  return gmr__policy_tag(p, err);
}

int gmr__policy_sleep_charge(gmr_policy_t *p, int64_t bytes, bool force) {
  for (gmr_policy_t *q = p; q != NULL; q = q->upstream) {
    if (q->ops->sleep_charge == NULL) continue;
    int err = q->ops->sleep_charge(q, bytes, force);
    if (err == 0) continue;
    for (gmr_policy_t *u = p; u != q; u = u->upstream)
      if (u->ops->sleep_charge != NULL) (void)u->ops->sleep_charge(u, -bytes, true);
    return gmr__policy_tag(p, err);
  }
  return 0;
}

void gmr__policy_set_exclusive(gmr_policy_t *p, int exclusive) {
  if (p->ops->set_exclusive == NULL) return;
  gmr__policy_lock(p);
  p->ops->set_exclusive(p, exclusive);
  gmr__policy_unlock(p);
}

void gmr__policy_set_fraction(gmr_policy_t *p, double fraction) {
  if (p->ops->set_fraction == NULL) return;
  gmr__policy_quiesce(p);
  p->ops->set_fraction(p, fraction);
  gmr__policy_resume(p);
}

/* ---- the whole-state ops, quiesced (policy.h, rule 5) ---------------------- */

void gmr__policy_quiesce(gmr_policy_t *p) {
  if (p->serialize)
    gmr__lock(&p->lock);
  else if (p->ops->quiesce != NULL)
    p->ops->quiesce(p);
}

void gmr__policy_resume(gmr_policy_t *p) {
  if (p->serialize)
    gmr__unlock(&p->lock);
  else if (p->ops->resume != NULL)
    p->ops->resume(p);
}

int gmr__policy_trim_locked(gmr_policy_t *p) {
  if (p->ops->trim == NULL) return 0;
  return gmr__policy_tag(p, p->ops->trim(p));
}

int gmr__policy_trim(gmr_policy_t *p) {
  if (p->ops->trim == NULL) return 0;
  gmr__policy_quiesce(p);
  int err = p->ops->trim(p);
  gmr__policy_resume(p);
  return gmr__policy_tag(p, err);
}

void gmr__policy_stats_locked(gmr_policy_t *p, gmr_stats_t *st) {
  if (p->ops->stats != NULL) p->ops->stats(p, st);
}

void gmr__policy_stats(gmr_policy_t *p, gmr_stats_t *st) {
  if (p->ops->stats == NULL) return;
  gmr__policy_quiesce(p);
  p->ops->stats(p, st);
  gmr__policy_resume(p);
}

void gmr__policy_reset_peak_locked(gmr_policy_t *p) {
  if (p->ops->reset_peak != NULL) p->ops->reset_peak(p);
}

void gmr__policy_reset_peak(gmr_policy_t *p) {
  if (p->ops->reset_peak == NULL) return;
  gmr__policy_quiesce(p);
  p->ops->reset_peak(p);
  gmr__policy_resume(p);
}

void gmr__policy_reset_accumulated_locked(gmr_policy_t *p) {
  if (p->ops->reset_accumulated != NULL) p->ops->reset_accumulated(p);
}

void gmr__policy_reset_accumulated(gmr_policy_t *p) {
  if (p->ops->reset_accumulated == NULL) return;
  gmr__policy_quiesce(p);
  p->ops->reset_accumulated(p);
  gmr__policy_resume(p);
}

int gmr__policy_stats_foreach_locked(gmr_policy_t *p, gmr_stat_cb cb, void *ud) {
  if (p->ops->stats_foreach == NULL) return GMR_POLICY_NONE;
  return p->ops->stats_foreach(p, cb, ud);
}

int gmr__policy_stats_foreach(gmr_policy_t *p, gmr_stat_cb cb, void *ud) {
  if (p->ops->stats_foreach == NULL) return GMR_POLICY_NONE;
  gmr__policy_quiesce(p);
  int err = p->ops->stats_foreach(p, cb, ud);
  gmr__policy_resume(p);
  return err;
}

int gmr__policy_summary_locked(gmr_policy_t *p, FILE *out) {
  if (p->ops->summary == NULL) return GMR_POLICY_NONE;
  return p->ops->summary(p, out);
}

int gmr__policy_summary(gmr_policy_t *p, FILE *out) {
  if (p->ops->summary == NULL) return GMR_POLICY_NONE;
  gmr__policy_quiesce(p);
  int err = p->ops->summary(p, out);
  gmr__policy_resume(p);
  return err;
}

int gmr__policy_walk_locked(gmr_policy_t *p, gmr_walk_cb cb, void *ud) {
  if (p->ops->walk == NULL)
    return gmr__policy_failed(
        p, gmr__error_set(GMR_ENOTSUP, "policy %s keeps no segments to walk", p->ops->name));
  return gmr__policy_tag(p, p->ops->walk(p, cb, ud));
}

int gmr__policy_walk(gmr_policy_t *p, gmr_walk_cb cb, void *ud) {
  gmr__policy_quiesce(p);
  int err = gmr__policy_walk_locked(p, cb, ud);
  gmr__policy_resume(p);
  return err;
}

int gmr__policy_check_locked(gmr_policy_t *p) {
  if (p->ops->check == NULL) return 0;
  return gmr__policy_tag(p, p->ops->check(p));
}

int gmr__policy_check(gmr_policy_t *p) {
  if (p->ops->check == NULL) return 0;
  gmr__policy_quiesce(p);
  int err = p->ops->check(p);
  gmr__policy_resume(p);
  return gmr__policy_tag(p, err);
}
