/* fuzz-config.c: libFuzzer harness for the configuration loader, then a few
 * operations on the runtime it builds.
 *
 * Input: YAML text (any bytes).  Promise checked: the loader returns 0 or
 * GMR_ECONFIG / GMR_ENOMEM with a message, never crashes or hangs (the
 * fuzzer's -timeout turns a hang into a finding); a configuration it accepts
 * builds a runtime on a small simulated device or fails with an error, and
 * that runtime allocates, frees, empties its cache, walks, summarizes and
 * passes gmr_check.  A configuration that names a trace file is parsed but
 * not run (the fuzzer must not write files). */
#include "fuzz.h"
#include "runtime/config.h"

static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (devnull == NULL) devnull = fopen("/dev/null", "w");
  char *text = malloc(size + 1);
  if (text == NULL) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  gmr_config_t *cfg = NULL;
  gmr_error_t err;
  memset(&err, 0, sizeof err);
  int rc = gmr_config_load_string(text, &cfg, &err);
  free(text);
  if (rc != 0) {
    fuzz_assert(rc == GMR_ECONFIG || rc == GMR_ENOMEM || rc == GMR_EINVAL, "rc %d", rc);
    fuzz_assert(err.message[0] != '\0', "a refusal without a message");
    fuzz_assert(cfg == NULL, "a refusal with a configuration");
    return 0;
  }
  fuzz_assert(cfg != NULL && gmr_config_policy_name(cfg) != NULL, "no policy");
  if (cfg->trace_path != NULL) {
    gmr_config_free(cfg);
    return 0;
  }
  gmr_sim_options_t o = {.capacity = 1ull << 30};
  gmr_runtime_t *rt = NULL;
  cfg->device.host_backed = false; /* the ranges stay address-only */
  rc = gmr_runtime_new_sim(cfg, &o, &rt);
  gmr_config_free(cfg);
  if (rc != 0) {
    fuzz_assert(rc == GMR_EINVAL || rc == GMR_ECONFIG || rc == GMR_ENOMEM || rc == GMR_EDEVICE,
                "runtime creation: %s", gmr_err_name(rc));
    return 0;
  }
  static const size_t sizes[] = {1, 512, 1000, 1 << 20, 3 << 20, 25 << 20, 300 << 20};
  void *p[7] = {0};
  for (int i = 0; i < 7; ++i) {
    rc = gmr_alloc(rt, sizes[i], GMR_SIM_STREAM(i % 2), &p[i]);
    fuzz_assert(rc == 0 || rc == GMR_ENOMEM, "alloc %zu: %s: %s", sizes[i], gmr_err_name(rc),
                gmr_last_error(rt));
    if (rc != 0) p[i] = NULL;
    fuzz_assert(gmr_check(rt) == 0, "%s", gmr_last_error(rt));
  }
  for (int i = 0; i < 7; i += 2)
    fuzz_assert(gmr_free(rt, p[i]) == 0, "free: %s", gmr_last_error(rt));
  if (p[1] != NULL) gmr_record_stream(rt, p[1], GMR_SIM_STREAM(2));
  fuzz_assert(gmr_empty_cache(rt) == 0, "empty_cache: %s", gmr_last_error(rt));
  gmr_stats_t st;
  fuzz_assert(gmr_stats(rt, &st) == 0, "stats");
  gmr_summary(rt, devnull);
  fuzz_assert(gmr_check(rt) == 0, "%s", gmr_last_error(rt));
  for (int i = 1; i < 7; i += 2)
    fuzz_assert(gmr_free(rt, p[i]) == 0, "free: %s", gmr_last_error(rt));
  fuzz_assert(gmr_check(rt) == 0, "%s", gmr_last_error(rt));
  gmr_stats(rt, &st);
  fuzz_assert(st.allocations == 0, "%llu allocations left", (unsigned long long)st.allocations);
  gmr_runtime_free(rt);
  return 0;
}
