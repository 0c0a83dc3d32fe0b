/* policy-limit.c: the limit decorator: a hard cap in bytes or as a fraction,
 * counting allocated or reserved bytes, with the refusal message, no device
 * call on refusal, and stacking over another policy. */
#include <string.h>

#include "gmr.h"
#include "sim-runtime.h"
#include "tap.h"

#define MiB (1ull << 20)

static gmr_runtime_t *make(const char *yaml, uint64_t capacity) {
  return sim_runtime(yaml, capacity, 0);
}

int main(void) {
  gmr_runtime_t *rt = make("policy: direct\nlimit: {bytes: 10MiB}\n", 1024 * MiB);
  ok(rt != NULL, "limit(direct) of 10 MiB");
  is_str(gmr_runtime_policy(rt), "limit(direct)", "the stack is named");
  void *a, *b, *c;
  is_int(gmr_alloc(rt, 6 * MiB, NULL, &a), 0, "6 MiB fits");
  is_int(gmr_alloc(rt, 4 * MiB, NULL, &b), 0, "4 MiB more reaches the cap exactly");
  gmr_sim_counters_t k0, k1;
  gmr_sim_counters(rt, &k0);
  is_int(gmr_alloc(rt, 1, NULL, &c), GMR_ENOMEM, "one byte more is refused");
  gmr_sim_counters(rt, &k1);
  is_u64(k1.reserve_calls, k0.reserve_calls, "  without touching the device");
  like(gmr_last_error(rt), "limit of 10.00 MiB (10485760 bytes) reached", "  naming the cap");
  like(gmr_last_error(rt), "Tried to allocate 1 bytes", "  the request");
  like(gmr_last_error(rt), "10.00 MiB (10485760 bytes) already allocated",
       "  and the bytes in use");
  gmr_stats_t st;
  gmr_stats(rt, &st);
  is_u64(st.limit_bytes, 10 * MiB, "stats report the limit");
  is_u64(st.ooms, 1, "and the refusal as an OOM");
  int64_t v;
  gmr_stat_get(rt, "limit_in_use_bytes", &v);
  is_int(v, 10 * MiB, "limit_in_use_bytes = 10 MiB");
  gmr_free(rt, b);
  is_int(gmr_alloc(rt, 4 * MiB, NULL, &b), 0, "after a free, 4 MiB fits again");
  is_int(gmr_check(rt), 0, "invariants hold");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  rt = make("policy: direct\nlimit: {fraction: 0.25}\n", 64 * MiB);
  gmr_stats(rt, &st);
  is_u64(st.limit_bytes, 16 * MiB, "a fraction of 0.25 of 64 MiB is 16 MiB");
  is_int(gmr_alloc(rt, 17 * MiB, NULL, &a), GMR_ENOMEM, "17 MiB is refused");
  gmr_runtime_free(rt);

  /* counts: reserved caps the device memory the upstream holds. */
  rt = make("policy:\n  name: limit\n  bytes: 8MiB\n  counts: reserved\n"
            "  upstream: {name: direct}\n",
            1024 * MiB);
  ok(rt != NULL, "a reserved-bytes limit");
  is_int(gmr_alloc(rt, 5 * MiB, NULL, &a), 0, "5 MiB");
  is_int(gmr_alloc(rt, 4 * MiB, NULL, &b), GMR_ENOMEM, "4 MiB more would hold 9 MiB: refused");
  like(gmr_last_error(rt), "total capacity of 8.00 MiB of which 3.00 MiB is free",
       "  the policy sees a device of 8 MiB");
  size_t f, t;
  gmr_mem_info(rt, &f, &t);
  is_u64(t, 1024 * MiB, "the runtime still reports the real device");
  is_int(gmr_alloc(rt, 3 * MiB, NULL, &b), 0, "3 MiB fits");
  gmr_free(rt, a);
  gmr_free(rt, b);
  gmr_runtime_free(rt);

  /* Memory from outside gmr counts against the cap (gmr_charge). */
  const char *modes[] = {"allocated", "reserved"};
  for (int m = 0; m < 2; ++m) {
    char yaml[128];
    snprintf(yaml, sizeof yaml, "policy: direct\nlimit: {bytes: 10MiB, counts: %s}\n", modes[m]);
    rt = make(yaml, 1024 * MiB);
    gmr_sim_counters(rt, &k0);
    is_int(gmr_charge(rt, 6 * MiB), 0, "%s: charge 6 MiB obtained outside gmr", modes[m]);
    gmr_sim_counters(rt, &k1);
    is_u64(k1.reserve_calls, k0.reserve_calls, "  the device is not asked");
    gmr_stat_get(rt, "limit_external_bytes", &v);
    is_int(v, 6 * MiB, "  limit_external_bytes = 6 MiB");
    gmr_stat_get(rt, "limit_in_use_bytes", &v);
    is_int(v, 6 * MiB, "  and it is in use");
    is_int(gmr_alloc(rt, 5 * MiB, NULL, &a), GMR_ENOMEM, "%s: 5 MiB more is refused", modes[m]);
    is_int(gmr_charge(rt, 5 * MiB), GMR_ENOMEM, "%s: so is a 5 MiB charge", modes[m]);
    like(gmr_last_error(rt), "limit of 10.00 MiB", "  naming the limit");
    is_int(gmr_alloc(rt, 4 * MiB, NULL, &a), 0, "%s: 4 MiB fits", modes[m]);
    is_int(gmr_charge(rt, -6 * (int64_t)MiB), 0, "%s: give the 6 MiB back", modes[m]);
    is_int(gmr_alloc(rt, 5 * MiB, NULL, &b), 0, "  then 5 MiB fits");
    gmr_stat_get(rt, "limit_external_bytes", &v);
    is_int(v, 0, "  nothing external is left");
    is_int(gmr_check(rt), 0, "  invariants hold");
    gmr_free(rt, a);
    gmr_free(rt, b);
    gmr_runtime_free(rt);
  }
  rt = make("policy: direct\n", 1024 * MiB);
  is_int(gmr_charge(rt, 1ll << 40), 0, "a stack without a limit accepts any charge");
  gmr_runtime_free(rt);
  is_int(gmr_charge(NULL, 1), GMR_EINVAL, "gmr_charge(NULL) is GMR_EINVAL");

  /* Limits stack. */
  rt = make("policy:\n  name: limit\n  bytes: 8MiB\n  upstream:\n    name: limit\n"
            "    bytes: 4MiB\n    upstream: direct\n",
            1024 * MiB);
  is_str(gmr_runtime_policy(rt), "limit(limit(direct))", "two limits stack");
  is_int(gmr_alloc(rt, 5 * MiB, NULL, &a), GMR_ENOMEM, "the inner 4 MiB cap holds");
  gmr_runtime_free(rt);
  return done_testing();
}
