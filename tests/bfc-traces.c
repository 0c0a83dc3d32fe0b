/* bfc-traces.c: the real PyTorch training traces (traces/ CSV files) replayed
 * under config/tf-greedy.yaml, config/tf-growth.yaml and config/jax.yaml on a
 * simulated 141 GiB device (143771 MiB, an H200).  None may run out of
 * memory; the invariants are walked every 500 events; the peak reserved
 * (pool) bytes are printed as diagnostics, to sit next to PyTorch's figures.
 *
 * The frameworks' environment variables are cleared first: the configs
 * honour them, and the figures must not depend on who runs the test. */
#include <stdlib.h>
#include <string.h>

#include "gmr.h"
#include "gmr_replay.h"
#include "tap.h"

#define MiB (1ull << 20)

static int check_cb(gmr_runtime_t *rt, const gmr_trace_data_t *t, size_t index, int status,
                    void *ud) {
  (void)t;
  (void)index;
  (void)status;
  if (gmr_check(rt) != 0) {
    snprintf(ud, 512, "%s", gmr_last_error(rt));
    return 1;
  }
  return 0;
}

int main(void) {
  static const char *const env_vars[] = {
      "TF_FORCE_GPU_ALLOW_GROWTH",     "TF_ENABLE_GPU_GARBAGE_COLLECTION",
      "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
      "XLA_CLIENT_MEM_FRACTION",       NULL};
  for (int i = 0; env_vars[i]; ++i)
    unsetenv(env_vars[i]);
  static const char *const traces[] = {"gpt2_train", "resnet50_train", "gpt2_varlen_train"};
  static const char *const configs[] = {"tf-greedy", "tf-growth", "jax"};
  for (int ti = 0; ti < 3; ++ti) {
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/traces/%s.csv", tap_srcdir(), traces[ti]);
    gmr_trace_data_t *t = NULL;
    if (!ok(gmr_trace_read(path, &t, err, sizeof err) == 0, "%s: trace read", traces[ti])) {
      diag("%s", err);
      continue;
    }
    for (int ci = 0; ci < 3; ++ci) {
      snprintf(path, sizeof path, "%s/config/%s.yaml", tap_srcdir(), configs[ci]);
      gmr_config_t *cfg = NULL;
      gmr_error_t cerr;
      if (!ok(gmr_config_load_file(path, &cfg, &cerr) == 0, "%s: config loads", configs[ci])) {
        diag("%s", cerr.message);
        continue;
      }
      gmr_sim_options_t o = {.capacity = 143771 * MiB};
      gmr_runtime_t *rt = NULL;
      gmr_runtime_new_sim(cfg, &o, &rt);
      gmr_config_free(cfg);
      char why[512] = "";
      gmr_replay_options_t ro = {
          .check = 0, .callback = check_cb, .ud = why, .callback_every = 500};
      gmr_replay_result_t res;
      int rc = gmr_replay(rt, t, &ro, &res);
      is_int(rc, 0, "%s under %s: replayed", traces[ti], configs[ci]);
      is_u64(res.ooms, 0, "%s under %s: no OOM", traces[ti], configs[ci]);
      if (res.ooms) diag("%.400s", res.first_oom_message);
      ok(why[0] == '\0' && !res.check_failed && res.events_done == t->n_events,
         "%s under %s: all %zu events, invariants hold", traces[ti], configs[ci], t->n_events);
      if (why[0]) diag("%s", why);
      gmr_stats_t st;
      gmr_stats(rt, &st);
      int64_t peak_pool = -1, limit = -1, peak_in_use = -1;
      gmr_stat_get(rt, "peak_pool_bytes", &peak_pool);
      gmr_stat_get(rt, "bytes_limit", &limit);
      gmr_stat_get(rt, "peak_bytes_in_use", &peak_in_use);
      is_u64(st.peak_reserved_bytes, (uint64_t)peak_pool,
             "%s under %s: the device's peak reserved is the peak pool", traces[ti], configs[ci]);
      if (ci != 1)
        ok(st.peak_reserved_bytes == (uint64_t)limit / 256 * 256 && st.peak_segments == 1,
           "%s under %s: greedy, one region of floor256(limit) = %lld bytes", traces[ti],
           configs[ci], (long long)limit / 256 * 256);
      else
        ok(st.peak_reserved_bytes < (uint64_t)limit && st.peak_segments > 1,
           "%s under %s: growth, %llu regions, below the limit", traces[ti], configs[ci],
           (unsigned long long)st.peak_segments);
      diag("%-18s %-10s peak reserved %13llu  peak in use %12lld  limit %13lld  regions(peak) "
           "%llu  %.2f s",
           traces[ti], configs[ci], (unsigned long long)st.peak_reserved_bytes,
           (long long)peak_in_use, (long long)limit, (unsigned long long)st.peak_segments,
           res.seconds);
      gmr_runtime_free(rt);
    }
    gmr_trace_data_free(t);
  }
  return done_testing();
}
