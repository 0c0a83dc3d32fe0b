/* oom-sweep.c: fail the k-th host allocation of the library's own metadata,
 * for k = 1, 2, 3, ... until the operation succeeds, through configuration
 * loading, runtime creation, allocation and free, for every policy stack it
 * can load.  Each failure must be a clean error (no crash; no leak under
 * AddressSanitizer), and the runtime must stay usable. */
#include <string.h>

#include "core/internal.h"
#include "gmr.h"
#include "tap.h"

static const char *const stacks[] = {
    "policy: direct\n",
    "policy: direct\nlimit: {bytes: 1GiB}\n",
    "policy: direct\nlimit: {bytes: 1GiB, counts: reserved}\n",
    "policy: caching\n",
    "policy: {name: caching, expandable_segments: true}\n",
    "policy: {name: bfc, memory_limit: 1GiB}\n",
    "policy: stitch\n",
    NULL,
};

static int scenario(const char *yaml, int *stage) {
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  *stage = 0;
  int rc = gmr_config_load_string(yaml, &cfg, &err);
  if (rc != 0) return rc;
  *stage = 1;
  gmr_runtime_t *rt = NULL;
  gmr_sim_options_t o = {.capacity = 4ull << 30};
  rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  if (rc != 0) return rc;
  *stage = 2;
  void *p[40] = {0};
  for (int i = 0; i < 40 && rc == 0; ++i)
    rc = gmr_alloc(rt, (size_t)(i + 1) * 700000, NULL, &p[i]);
  for (int i = 0; i < 40; ++i)
    if (p[i] != NULL && gmr_free(rt, p[i]) != 0) rc = GMR_EINVAL; /* must never happen */
  if (rc == 0) rc = gmr_check(rt);
  gmr_runtime_free(rt);
  return rc;
}

int main(void) {
  for (int s = 0; stacks[s]; ++s) {
    gmr_config_t *probe;
    gmr_error_t err;
    if (gmr_config_load_string(stacks[s], &probe, &err) != 0) {
      skip("%s", err.message);
      continue;
    }
    gmr_config_free(probe);
    int bad = 0, stage = 0;
    uint64_t k = 1;
    for (;; ++k) {
      gmr__host_fail_nth(k);
      int rc = scenario(stacks[s], &stage);
      gmr__host_fail_nth(0);
      if (rc == 0) break;
      bool clean = stage == 0 ? (rc == GMR_ECONFIG || rc == GMR_ENOMEM) : rc == GMR_ENOMEM;
      if (!clean) {
        diag("k=%llu stage %d: %s: %s", (unsigned long long)k, stage, gmr_err_name(rc),
             gmr__error_last());
        ++bad;
      }
      if (k > 100000) break;
    }
    char name[64];
    snprintf(name, sizeof name, "%s", stacks[s]);
    for (char *c = name; *c; ++c)
      if (*c == '\n') *c = ' ';
    is_int(bad, 0, "%s: %llu host failures swept, each a clean GMR_ENOMEM", name,
           (unsigned long long)k - 1);
  }
  return done_testing();
}
