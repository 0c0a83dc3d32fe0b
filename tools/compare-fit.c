/* compare-fit.c: gmr-compare --fit, the smallest device on which a
 * configuration replays the trace without an OOM.
 *
 * The same measure for every policy (greedy BFC, caching with its retry,
 * direct...): replay on a fresh simulated device of capacity c, stopping at
 * the first OOM, and search c by bisection in steps of the device's 2 MiB
 * granularity:
 *   lo = a capacity known to OOM (or 0), hi = one known to fit;
 *   invariant: fits(hi) and (lo = 0 or !fits(lo));  stop when hi - lo <= 2 MiB.
 * hi starts at --capacity and doubles while it OOMs, up to 64 times the
 * trace's peak requested bytes (then there is no fit: fit_capacity = 0);
 * then the fitting run's own peak reserved and the trace's peak requested
 * are tried first, which leaves a few replays of bisection.
 * The need is not always monotonic in the capacity: TensorFlow's BFC derives
 * its limit from the device (free memory less its reserve) and its growing
 * regions double up to that limit, so gpt2_train under tf-growth fits on
 * 16332-16402 MiB, OOMs on 16404-16426 MiB and fits again from 16428 MiB.
 * The search then reports the lower edge of a fitting range it meets: a
 * capacity that fits, 2 MiB above one that does not.
 */
#include <stdlib.h>
#include <string.h>

#include "compare.h"

#define FIT_STEP ((uint64_t)2 << 20)

/* 1: fits, 0: OOMs, -1: the replay failed (run->error set).  *reserved: the
 * replay's peak reserved bytes. */
static int fit_try(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                   uint64_t capacity, uint64_t *reserved) {
  gmr_sim_options_t sim = {.capacity = capacity};
  gmr_runtime_t *rt = NULL;
  ++run->fit_replays;
  int err = gmr_runtime_new_sim(cfg, &sim, &rt);
  *reserved = 0;
  if (err == GMR_ENOMEM) return 0; /* a policy that reserves up front may not fit at all */
  if (err != 0) {
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "--fit: cannot create the runtime: %s",
             gmr_strerror(err));
    return -1;
  }
  gmr_replay_options_t ro = {.stop_at_oom = 1};
  gmr_replay_result_t *res = calloc(1, sizeof *res);
  if (res == NULL) {
    gmr_runtime_free(rt);
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "--fit: out of host memory");
    return -1;
  }
  err = gmr_replay(rt, t, &ro, res);
  gmr_stats_t st;
  *reserved = gmr_stats(rt, &st) == 0 ? st.peak_reserved_bytes : 0;
  gmr_runtime_free(rt);
  int fits = err == 0 && !res->check_failed && res->ooms == 0;
  if (err != 0 || res->check_failed) {
    run->status = COMPARE_ERUNTIME;
    snprintf(run->error, sizeof run->error, "--fit: the replay failed: %s",
             err ? gmr_strerror(err) : res->check_message);
    fits = -1;
  }
  free(res);
  return fits;
}

int compare_fit(compare_run_t *run, const gmr_config_t *cfg, const gmr_trace_data_t *t,
                const compare_opts_t *o) {
  uint64_t limit = t->peak_requested * 64 + 64 * FIT_STEP;
  uint64_t hi = (o->capacity + FIT_STEP - 1) / FIT_STEP * FIT_STEP, lo = 0, reserved = 0;
  run->fit_capacity = 0;
  for (;;) {
    int r = fit_try(run, cfg, t, hi, &reserved);
    if (r < 0) return -1;
    if (r == 1) break;
    lo = hi;
    if (hi >= limit) {
      run->fit_max = hi;
      return 0;
    }
    hi *= 2;
  }
  run->fit_max = hi > o->capacity ? hi : o->capacity;
  /* Two guesses narrow the search: the peak the fitting run reserved (a
   * policy that does not size itself by the device fits there), and the
   * trace's peak of requested bytes (nothing fits below it), both rounded
   * to a step. */
  uint64_t guess[2] = {(reserved + FIT_STEP - 1) / FIT_STEP * FIT_STEP,
                       t->peak_requested / FIT_STEP * FIT_STEP};
  for (int g = 0; g < 2; ++g) {
    if (guess[g] <= lo || guess[g] >= hi || guess[g] < FIT_STEP) continue;
    int r = fit_try(run, cfg, t, guess[g], &reserved);
    if (r < 0) return -1;
    if (r == 1)
      hi = guess[g];
    else
      lo = guess[g];
  }
  while (hi - lo > FIT_STEP) {
    uint64_t mid = lo + (hi - lo) / 2 / FIT_STEP * FIT_STEP;
    if (mid <= lo) mid = lo + FIT_STEP;
    int r = fit_try(run, cfg, t, mid, &reserved);
    if (r < 0) return -1;
    if (r == 1)
      hi = mid;
    else
      lo = mid;
  }
  run->fit_capacity = hi;
  return 0;
}
