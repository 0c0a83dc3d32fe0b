/* compare-deploy.c: a configuration gmr-compare --suggest found, in the
 * framework's own syntax, so that it can be deployed as it is.
 *
 * The winner's YAML holds "  key: value" lines under its policy; each key
 * the frameworks know becomes their setting:
 *   caching -> PYTORCH_CUDA_ALLOC_CONF=key:value,... (sizes in MiB, as
 *              PyTorch's *_mb keys take them), and a memory fraction becomes
 *              torch.cuda.set_per_process_memory_fraction of an absolute
 *              number of bytes over the device's total;
 *   bfc     -> TensorFlow's environment variables and tf.config calls, and
 *              JAX's XLA_PYTHON_CLIENT_* variables.
 * Sizes are absolute bytes: a share of the device is printed as bytes over
 * the total memory of the device it runs on, with its value on the
 * --capacity device the search used.  A key with no framework switch is
 * named as gmr's alone.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"

/* The value of `key` in the YAML (a line "  key: value"), or NULL. */
static const char *deploy_value(const char *yaml, const char *key, char *buf, size_t len) {
  size_t klen = strlen(key);
  for (const char *p = yaml; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    while (*p == ' ')
      ++p;
    if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
      const char *v = p + klen + 1;
      while (*v == ' ')
        ++v;
      size_t n = strcspn(v, "\n");
      if (n >= len) n = len - 1;
      memcpy(buf, v, n);
      buf[n] = '\0';
      return buf;
    }
  }
  return NULL;
}

static uint64_t deploy_bytes(const char *v) {
  uint64_t b = 0;
  return gmr_parse_size(v, &b) == 0 ? b : 0;
}

static void deploy_caching(FILE *out, const char *yaml, uint64_t capacity) {
  char v[64], conf[512] = "";
  size_t off = 0;
  const char *x;
  if ((x = deploy_value(yaml, "max_split_size", v, sizeof v)))
    off += (size_t)snprintf(conf + off, sizeof conf - off, "%smax_split_size_mb:%" PRIu64,
                            off ? "," : "", deploy_bytes(x) >> 20);
  if ((x = deploy_value(yaml, "roundup_power2_divisions", v, sizeof v)))
    off += (size_t)snprintf(conf + off, sizeof conf - off, "%sroundup_power2_divisions:%s",
                            off ? "," : "", x);
  if ((x = deploy_value(yaml, "garbage_collection_threshold", v, sizeof v)))
    off += (size_t)snprintf(conf + off, sizeof conf - off, "%sgarbage_collection_threshold:%s",
                            off ? "," : "", x);
  if ((x = deploy_value(yaml, "expandable_segments", v, sizeof v)) && strcmp(x, "true") == 0)
    off += (size_t)snprintf(conf + off, sizeof conf - off, "%sexpandable_segments:True",
                            off ? "," : "");
  fputs("# PyTorch:\n", out);
  if (off)
    fprintf(out, "#   export PYTORCH_CUDA_ALLOC_CONF=%s\n", conf);
  else
    fputs("#   (PyTorch's defaults: leave PYTORCH_CUDA_ALLOC_CONF unset)\n", out);
  if ((x = deploy_value(yaml, "per_process_memory_fraction", v, sizeof v))) {
    uint64_t cap = (uint64_t)(strtod(x, NULL) * (double)capacity);
    char h[48];
    compare_format_bytes(cap, h, sizeof h);
    fprintf(out,
            "#   torch.cuda.set_per_process_memory_fraction(%" PRIu64
            " / torch.cuda.get_device_properties(0).total_memory)  # a cap of %s\n",
            cap, h);
  }
}

static void deploy_bfc(FILE *out, const char *yaml, uint64_t capacity) {
  char v[64];
  const char *growth = deploy_value(yaml, "allow_growth", v, sizeof v);
  int grow = growth && strcmp(growth, "true") == 0;
  char lim[64];
  const char *limit = deploy_value(yaml, "memory_limit", lim, sizeof lim);
  uint64_t bytes = limit ? deploy_bytes(limit) : 0;
  char gcv[16];
  const char *gc = deploy_value(yaml, "garbage_collection", gcv, sizeof gcv);
  int no_gc = gc && strcmp(gc, "false") == 0;
  fputs("# TensorFlow:\n", out);
  if (grow) fputs("#   export TF_FORCE_GPU_ALLOW_GROWTH=true\n", out);
  if (no_gc) fputs("#   export TF_ENABLE_GPU_GARBAGE_COLLECTION=false\n", out);
  if (bytes)
    fprintf(out,
            "#   tf.config.set_logical_device_configuration(tf.config.list_physical_devices("
            "'GPU')[0], [tf.config.LogicalDeviceConfiguration(memory_limit=%" PRIu64 ")])  # MiB\n",
            (bytes + (1 << 20) - 1) >> 20);
  if (!grow && !no_gc && !bytes) fputs("#   (TensorFlow's defaults)\n", out);
  fputs("# JAX:\n", out);
  if (grow) fputs("#   export XLA_PYTHON_CLIENT_PREALLOCATE=false\n", out);
  if (bytes) {
    char h[48], c[48];
    compare_format_bytes(bytes, h, sizeof h);
    compare_format_bytes(capacity, c, sizeof c);
    double f = (double)bytes / (double)capacity;
    f = (double)(long long)(f * 1000.0 + 0.999) / 1000.0;
    fprintf(out,
            "#   export XLA_PYTHON_CLIENT_MEM_FRACTION=%.3f  # %s of the %s device; elsewhere "
            "%" PRIu64 " / its total\n",
            f > 1.0 ? 1.0 : f, h, c, bytes);
  }
  if (!grow && !bytes)
    fputs("#   export XLA_PYTHON_CLIENT_MEM_FRACTION=1.0  # the whole device, as TensorFlow's "
          "default takes it\n",
          out);
  if (no_gc) fputs("#   (JAX has no switch for garbage_collection: gmr's bfc only)\n", out);
  if (deploy_value(yaml, "fragmentation_fraction", v, sizeof v))
    fprintf(out,
            "#   (fragmentation_fraction: %s has no TensorFlow or JAX switch: gmr's bfc "
            "only)\n",
            v);
  if (deploy_value(yaml, "front_cache_bytes", v, sizeof v))
    fprintf(out, "#   (front_cache_bytes: %s has no TensorFlow or JAX switch: gmr's bfc only)\n",
            v);
  if ((growth = deploy_value(yaml, "vmm", v, sizeof v)) && strcmp(growth, "true") == 0)
    fputs("#   (vmm: TensorFlow's GpuVirtualMemAllocator has no user switch: gmr's bfc "
          "only)\n",
          out);
}

void compare_print_deploy(FILE *out, const char *policy, const char *yaml, uint64_t capacity) {
  fputs("#\n# In the framework's own terms:\n", out);
  if (strcmp(policy, "caching") == 0)
    deploy_caching(out, yaml, capacity);
  else if (strcmp(policy, "bfc") == 0)
    deploy_bfc(out, yaml, capacity);
  else
    fprintf(out, "#   (policy %s is gmr's own: use the YAML below with gmr)\n", policy);
  fputs("# With gmr: the YAML below (gmr_config_load_file, GMR_CONFIG=file).\n", out);
}
