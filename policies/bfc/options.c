/* options.c: the bfc policy's options: YAML keys and the frameworks'
 * environment variables.
 *
 * The option table (keys, types, limits, help for docs/config.md), the
 * defaults (TensorFlow's: greedy, garbage collection on, retry for 10 s),
 * the environment each option honours when `environment` names a framework
 * (TF_FORCE_GPU_ALLOW_GROWTH, TF_ENABLE_GPU_GARBAGE_COLLECTION,
 * XLA_PYTHON_CLIENT_PREALLOCATE, XLA_CLIENT_MEM_FRACTION; the config layer
 * reads them and calls env_apply), and the check that one limit rule is
 * chosen:
 *   (memory_limit != 0) + (per_process_fraction != 0) + (memory_fraction != 0) <= 1
 */
#include <stdlib.h>
#include <string.h>

#include "bfc/internal.h"

static const char *const bfc_env_names[] = {"none", "tensorflow", "jax", NULL};

/* ---- the environment (applied by the config layer: `env` in the table) ------------ */

/* The allocator's name in messages: allocator_name, else GPU_<device>_bfc. */
void gmr__bfc_name(const bfc_opts_t *o, int device, char *buf, size_t len) {
  if (o->name != NULL && o->name[0] != '\0')
    snprintf(buf, len, "%s", o->name);
  else
    snprintf(buf, len, "GPU_%d_bfc", device);
}

/* TF's "true"/"false" environment booleans (case-sensitive); -1 unset, -2 bad. */
static int bfc_env_bool(const char *v) {
  if (v == NULL) return -1;
  if (strcmp(v, "true") == 0) return 1;
  if (strcmp(v, "false") == 0) return 0;
  return -2;
}

/* allow_growth: TF_FORCE_GPU_ALLOW_GROWTH (environment: tensorflow), or
 * XLA_PYTHON_CLIENT_PREALLOCATE (environment: jax; false or 0: grow). */
static int bfc_env_growth(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  (void)device, (void)err, (void)len;
  if (o->environment == BFC_ENV_TENSORFLOW) {
    int g = bfc_env_bool(v[0]);
    if (g == -2)
      gmr__log(GMR_LOG_ERROR,
               "The TF_FORCE_GPU_ALLOW_GROWTH environment variable is set but could not be "
               "parsed: \"%s\". Valid values are \"true\" or \"false\". Using original config "
               "value of %s.",
               v[0], o->allow_growth ? "true" : "false");
    if (g >= 0 && (g == 1) != o->allow_growth)
      gmr__log(GMR_LOG_WARN,
               "Overriding orig_value setting because the TF_FORCE_GPU_ALLOW_GROWTH environment "
               "variable is set. Original config value was %s.",
               o->allow_growth ? "true" : "false");
    if (g >= 0) o->allow_growth = g == 1;
  } else if (o->environment == BFC_ENV_JAX && v[1] != NULL) {
    char low[16] = "";
    size_t i = 0;
    for (; v[1][i] && i < sizeof low - 1; ++i)
      low[i] = (char)(v[1][i] >= 'A' && v[1][i] <= 'Z' ? v[1][i] + 32 : v[1][i]);
    low[i] = '\0';
    o->allow_growth = strcmp(low, "false") == 0 || strcmp(low, "0") == 0;
  }
  return 0;
}

/* garbage_collection: TF_ENABLE_GPU_GARBAGE_COLLECTION (environment: tensorflow). */
static int bfc_env_gc(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  (void)device, (void)err, (void)len;
  if (o->environment != BFC_ENV_TENSORFLOW) return 0;
  int gc = bfc_env_bool(v[0]);
  if (gc == -2)
    gmr__log(GMR_LOG_ERROR,
             "The TF_ENABLE_GPU_GARBAGE_COLLECTION environment variable is set but could not "
             "be parsed: \"%s\". Valid values are \"true\" or \"false\". Using true.",
             v[0]);
  if (gc != -1) o->garbage_collection = gc != 0;
  return 0;
}

/* memory_fraction: XLA_CLIENT_MEM_FRACTION, or its old name
 * XLA_PYTHON_CLIENT_MEM_FRACTION (environment: jax); it replaces the other
 * limit options. */
static int bfc_env_fraction(const char *const *v, void *opts, int device, char *err, size_t len) {
  bfc_opts_t *o = opts;
  if (o->environment != BFC_ENV_JAX) return 0;
  char name[128];
  gmr__bfc_name(o, device, name, sizeof name);
  if (v[0] && v[1]) {
    snprintf(err, len,
             "%s: both XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are set; set "
             "only XLA_CLIENT_MEM_FRACTION",
             name);
    return GMR_ECONFIG;
  }
  const char *f = v[0] ? v[0] : v[1];
  double x = 0;
  if (gmr__parse_double(f, &x) != 0 || !(x > 0) || x > 1) {
    snprintf(err, len, "%s: %s=\"%s\" is not a fraction in (0, 1]", name,
             v[0] ? "XLA_CLIENT_MEM_FRACTION" : "XLA_PYTHON_CLIENT_MEM_FRACTION", f);
    return GMR_ECONFIG;
  }
  o->memory_fraction = x;
  o->memory_limit = 0;
  o->per_process_fraction = 0;
  return 0;
}

int gmr__bfc_validate(void *opts, char *err, size_t len) {
  bfc_opts_t *o = opts;
  int n = (o->memory_limit != 0) + (o->per_process_fraction != 0) + (o->memory_fraction != 0);
  if (n > 1) {
    snprintf(err, len,
             "give at most one of 'memory_limit', 'per_process_gpu_memory_fraction' "
             "and 'memory_fraction'");
    return GMR_ECONFIG;
  }
  return 0;
}

void gmr__bfc_opts_release(void *opts) {
  bfc_opts_t *o = opts;
  gmr__free(o->name);
  o->name = NULL;
}

/* retry_timeout: seconds, with an optional unit (s, ms, us). */
static int bfc_parse_seconds(const char *text, void *field, char *err, size_t len) {
  char *end;
  double v = strtod(text, &end);
  if (end == text || !(v >= 0) || v > 1e6) {
    snprintf(err, len, "expected a duration from 0 to 1e6 s, such as 10, 10s, 250ms or 0");
    return GMR_EINVAL;
  }
  if (strcmp(end, "ms") == 0)
    v /= 1e3;
  else if (strcmp(end, "us") == 0)
    v /= 1e6;
  else if (*end != '\0' && strcmp(end, "s") != 0) {
    snprintf(err, len, "unknown unit '%s'; expected s, ms or us", end);
    return GMR_EINVAL;
  }
  *(double *)field = v;
  return 0;
}

const bfc_opts_t gmr__bfc_opts_default = {
    .allow_growth = false,
    .garbage_collection = true,
    .allow_retry_on_failure = true,
    .retry_timeout = 10.0,
    .environment = BFC_ENV_NONE,
};

const gmr_opt_desc_t gmr__bfc_opts_desc[] = {
    {.key = "allow_growth",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, allow_growth),
     .default_text = "false",
     .help = "Start with a 2 MiB region and double (TF allow_growth); false takes the whole "
             "limit in one region at the first allocation.",
     .env = "TF_FORCE_GPU_ALLOW_GROWTH XLA_PYTHON_CLIENT_PREALLOCATE",
     .env_apply = bfc_env_growth,
     .tune = (const char *const[]){"true", NULL}},
    {.key = "memory_limit",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(bfc_opts_t, memory_limit),
     .min = 1,
     .default_text = "",
     .help = "The allocator's limit in bytes (a virtual device's memory_limit).",
     .tune = (const char *const[]){"1.1x peak", "1.25x peak", "1.5x peak", NULL}},
    {.key = "per_process_gpu_memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, per_process_fraction),
     .min = 0,
     .max = 1,
     .min_exclusive = true,
     .default_text = "",
     .help = "TensorFlow: the limit is this fraction of the device's total memory. With no "
             "limit option, the limit is free memory minus TF's MinSystemMemory."},
    {.key = "memory_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, memory_fraction),
     .min = 0,
     .max = 1,
     .min_exclusive = true,
     .default_text = "",
     .help = "XLA/JAX: the limit is this fraction of total memory (0.75).",
     .env = "XLA_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_MEM_FRACTION",
     .env_apply = bfc_env_fraction},
    {.key = "garbage_collection",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, garbage_collection),
     .default_text = "true",
     .help = "At OOM, give wholly free regions back to the device and extend again.",
     .env = "TF_ENABLE_GPU_GARBAGE_COLLECTION",
     .env_apply = bfc_env_gc,
     .tune = (const char *const[]){"false", NULL}},
    {.key = "allow_retry_on_failure",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, allow_retry_on_failure),
     .default_text = "true",
     .help = "Before failing, wait up to retry_timeout for other threads to free memory."},
    {.key = "retry_timeout",
     .type = GMR_OPT_CUSTOM,
     .offset = offsetof(bfc_opts_t, retry_timeout),
     .parse = bfc_parse_seconds,
     .default_text = "10s",
     .help = "How long a failing allocation waits for frees (10, 10s, 250ms)."},
    {.key = "fragmentation_fraction",
     .type = GMR_OPT_DOUBLE,
     .offset = offsetof(bfc_opts_t, fragmentation_fraction),
     .min = 0,
     .max = 1,
     .default_text = "0",
     .help = "When > 0, a chunk is split if the waste would reach this fraction of the limit "
             "(instead of 128 MiB).",
     .tune = (const char *const[]){"0.001", "0.01", "0.05", "0.1", NULL}},
    {.key = "front_cache_bytes",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(bfc_opts_t, front_cache_bytes),
     .min = 0,
     .default_text = "0",
     .help = "gmr only, several threads: the bytes each stream's front cache may keep (freed "
             "chunks it reuses without the allocator's lock, docs/bfc.md); 0 is max(limit / "
             "256, 1 MiB); 1 turns the caches off (TF's lock for every call). More buys "
             "speed under threads with memory other streams cannot use until a flush."},
    {.key = "vmm",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, vmm),
     .default_text = "false",
     .help = "Grow by mapping pages into one reserved virtual range, so regions coalesce into "
             "one (TF's GpuVirtualMemAllocator).",
     .tune = (const char *const[]){"true", NULL}},
    {.key = "coalesce_regions",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(bfc_opts_t, coalesce_regions),
     .default_text = "false",
     .help = "Merge a new region into the one just before it when the device returns "
             "contiguous addresses (SupportsCoalescing)."},
    {.key = "allocator_name",
     .type = GMR_OPT_STRING,
     .offset = offsetof(bfc_opts_t, name),
     .default_text = "GPU_<device>_bfc",
     .help = "The allocator's name in messages."},
    {.key = "environment",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(bfc_opts_t, environment),
     .choices = bfc_env_names,
     .default_text = "none",
     .help = "Honour a framework's environment variables at runtime creation: tensorflow "
             "(TF_FORCE_GPU_ALLOW_GROWTH, TF_ENABLE_GPU_GARBAGE_COLLECTION) or jax "
             "(XLA_PYTHON_CLIENT_PREALLOCATE, XLA_CLIENT_MEM_FRACTION or "
             "XLA_PYTHON_CLIENT_MEM_FRACTION); each is listed with the option it overrides."},
    {.key = NULL},
};
