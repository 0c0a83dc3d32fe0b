/* policy-direct.c: the direct policy: one device reservation per
 * allocation, released at free, with exact statistics and an OOM message. */
#include <string.h>

#include "gmr.h"
#include "tap.h"

#define MiB (1ull << 20)

int main(void) {
  gmr_config_t *cfg;
  gmr_error_t err;
  gmr_config_load_string("policy: direct\n", &cfg, &err);
  gmr_runtime_t *rt;
  gmr_sim_options_t o = {.capacity = 64 * MiB};
  is_int(gmr_runtime_new_sim(cfg, &o, &rt), 0, "direct on a 64 MiB simulator");
  gmr_config_free(cfg);

  void *p[8];
  for (int i = 0; i < 8; ++i)
    gmr_alloc(rt, (size_t)(i + 1) * MiB, NULL, &p[i]);
  gmr_sim_counters_t k;
  gmr_sim_counters(rt, &k);
  is_u64(k.reserve_calls, 8, "eight allocations, eight device reservations");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.reserved_bytes, 36 * MiB, "reserved = requested = 36 MiB");
  is_u64(st.allocated_bytes, 36 * MiB, "allocated = 36 MiB");
  is_u64(st.segments, 8, "eight segments");
  void *big;
  is_int(gmr_alloc(rt, 30 * MiB, NULL, &big), GMR_ENOMEM, "30 MiB more does not fit in 64");
  like(gmr_last_error(rt), "Tried to allocate 30.00 MiB", "the message names the request");
  like(gmr_last_error(rt), "28.00 MiB is free", "  and what is free");
  for (int i = 0; i < 8; ++i)
    gmr_free(rt, p[i]);
  gmr_sim_counters(rt, &k);
  is_u64(k.release_calls, 8, "every free releases its reservation");
  gmr_stats(rt, &st);
  ok(st.reserved_bytes == 0 && st.segments == 0, "nothing is held after the frees");
  is_u64(st.peak_reserved_bytes, 36 * MiB, "peak reserved = 36 MiB");
  is_u64(st.peak_segments, 8, "peak segments = 8");
  is_int(gmr_empty_cache(rt), 0, "empty_cache has nothing to do");
  is_int(gmr_alloc(rt, 30 * MiB, NULL, &big), 0, "now 30 MiB fits");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, big);

  /* Device failures surface as OOM and leave state intact. */
  gmr_sim_fail_nth(rt, 1);
  is_int(gmr_alloc(rt, MiB, NULL, &big), GMR_ENOMEM, "a refused reservation is GMR_ENOMEM");
  is_int(gmr_alloc(rt, MiB, NULL, &big), 0, "the next one succeeds");
  gmr_free(rt, big);
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_runtime_free(rt);
  return done_testing();
}
