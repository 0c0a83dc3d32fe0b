/* config.c: YAML configuration (the only file that includes yaml.h).
 *
 * A configuration picks the device, the policy stack and its options (see
 * Note [The document]).  Options are described by each policy's table
 * (gmr_opt_desc_t), so this loader never knows a policy by name.  Every
 * error names file:line:column and says what was expected.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/config-env.h"
#include "core/internal.h"
#include "policy.h"
#include "runtime/config.h"

/* ---- the device section's table ---------------------------------------- */

static const char *const device_backends[] = {"auto", "sim", "cuda", NULL};

static const gmr_opt_desc_t device_opts_desc[] = {
    {.key = "backend",
     .type = GMR_OPT_ENUM,
     .offset = offsetof(gmr_device_opts_t, backend),
     .choices = device_backends,
     .default_text = "auto",
     .help = "auto: the CUDA device when one is present, else the simulator."},
    {.key = "capacity",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(gmr_device_opts_t, capacity),
     .min = 1 << 20,
     .default_text = "143771MiB",
     .help = "Memory of the simulated device."},
    {.key = "granularity",
     .type = GMR_OPT_SIZE,
     .offset = offsetof(gmr_device_opts_t, granularity),
     .min = 4096,
     .max = 1ull << 30,
     .default_text = "2MiB",
     .help = "Page size of the simulated device (a power of two)."},
    {.key = "host_backed",
     .type = GMR_OPT_BOOL,
     .offset = offsetof(gmr_device_opts_t, host_backed),
     .default_text = "false",
     .help = "Put real host memory behind simulated ranges, so patterns can be checked."},
    {.key = NULL},
};

/* ---- parse state ---------------------------------------------------------- */

typedef struct parse_s {
  yaml_document_t doc;
  const char *file;
  gmr_error_t *err;
} parse_t;

static int fail_at(parse_t *ps, const yaml_node_t *node, const char *fmt, ...) GMR_PRINTF(3, 4);

static int fail_at(parse_t *ps, const yaml_node_t *node, const char *fmt, ...) {
  if (ps->err == NULL) return GMR_ECONFIG;
  char sentence[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sentence, sizeof sentence, fmt, ap);
  va_end(ap);
  gmr_error_t *e = ps->err;
  e->code = GMR_ECONFIG;
  e->line = node ? (int)node->start_mark.line + 1 : 0;
  e->column = node ? (int)node->start_mark.column + 1 : 0;
  snprintf(e->file, sizeof e->file, "%s", ps->file);
  if (node)
    snprintf(e->message, sizeof e->message, "%s:%d:%d: %s", ps->file, e->line, e->column, sentence);
  else
    snprintf(e->message, sizeof e->message, "%s: %s", ps->file, sentence);
  return GMR_ECONFIG;
}

static const char *scalar(const yaml_node_t *n) {
  return (const char *)n->data.scalar.value;
}

static const char *node_kind(const yaml_node_t *n) {
  switch (n->type) {
  case YAML_SCALAR_NODE:
    return "a scalar";
  case YAML_SEQUENCE_NODE:
    return "a list";
  case YAML_MAPPING_NODE:
    return "a mapping";
  default:
    return "nothing";
  }
}

static void keys_list(const gmr_opt_desc_t *desc, const char *extra, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  if (extra) off += (size_t)snprintf(buf + off, len - off, "%s", extra);
  for (const gmr_opt_desc_t *d = desc; d && d->key && off < len; ++d)
    off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? ", " : "", d->key);
}

/* ---- one option ------------------------------------------------------------- */

static void fmt_num(double v, bool is_size, char *buf, size_t len) {
  if (is_size)
    gmr__format_size((uint64_t)v, buf, len);
  else
    snprintf(buf, len, "%g", v);
}

static int check_range(parse_t *ps, const yaml_node_t *n, const gmr_opt_desc_t *d, double v,
                       bool is_size) {
  bool low = d->min_exclusive ? v <= d->min : v < d->min;
  bool high = d->max != 0 && v > d->max;
  if (!low && !high) return 0;
  char lo[48], hi[48];
  fmt_num(d->min, is_size, lo, sizeof lo);
  fmt_num(d->max, is_size, hi, sizeof hi);
  if (d->max != 0)
    return fail_at(ps, n, "'%s' is %s for '%s'; expected a value in %s%s, %s]", scalar(n),
                   low ? "too small" : "too large", d->key, d->min_exclusive ? "(" : "[", lo, hi);
  return fail_at(ps, n, "'%s' is too small for '%s'; expected %s %s", scalar(n), d->key,
                 d->min_exclusive ? ">" : ">=", lo);
}

static int parse_options(parse_t *ps, const yaml_node_t *map, const gmr_opt_desc_t *desc,
                         void *opts, const char *what, const char *const *skip);

static int parse_option(parse_t *ps, const gmr_opt_desc_t *d, const yaml_node_t *n, void *opts) {
  char *field = (char *)opts + d->offset;
  if (d->type == GMR_OPT_TABLE) {
    if (n->type != YAML_MAPPING_NODE)
      return fail_at(ps, n, "'%s' is a mapping of options, not %s", d->key, node_kind(n));
    char what[64];
    snprintf(what, sizeof what, "'%s'", d->key);
    return parse_options(ps, n, d->sub, field, what, NULL);
  }
  if (n->type != YAML_SCALAR_NODE)
    return fail_at(ps, n, "'%s' takes a single value, not %s", d->key, node_kind(n));
  const char *t = scalar(n);
  switch (d->type) {
  case GMR_OPT_BOOL:
    if (gmr__parse_bool(t, 0, (bool *)field) != 0)
      return fail_at(ps, n, "'%s' is not a boolean for '%s'; expected true or false", t, d->key);
    return 0;
  case GMR_OPT_SIZE: {
    uint64_t v;
    bool too_large = false;
    if (gmr__parse_size_why(t, &v, &too_large) != 0 && too_large)
      return fail_at(ps, n, "'%s' is too large for '%s'; a size is at most 1 EiB", t, d->key);
    if (too_large || gmr__parse_size(t, &v) != 0)
      return fail_at(ps, n,
                     "'%s' is not a size for '%s'; expected bytes with an optional unit, "
                     "e.g. 4096, 512MiB, 8GiB",
                     t, d->key);
    if (check_range(ps, n, d, (double)v, true) != 0) return GMR_ECONFIG;
    /* Every size option, whatever its table says: address computations on
     * sizes up to 2^60 cannot overflow 64 bits. */
    if (v > GMR_MAX_SIZE_OPTION)
      return fail_at(ps, n, "'%s' is too large for '%s'; a size is at most 1 EiB", t, d->key);
    *(uint64_t *)field = v;
    return 0;
  }
  case GMR_OPT_INT: {
    int64_t v;
    if (gmr__parse_int(t, &v) != 0)
      return fail_at(ps, n, "'%s' is not an integer for '%s'", t, d->key);
    if (check_range(ps, n, d, (double)v, false) != 0) return GMR_ECONFIG;
    *(int64_t *)field = v;
    return 0;
  }
  case GMR_OPT_DOUBLE: {
    double v;
    if (gmr__parse_double(t, &v) != 0)
      return fail_at(ps, n, "'%s' is not a number for '%s'", t, d->key);
    if (check_range(ps, n, d, v, false) != 0) return GMR_ECONFIG;
    *(double *)field = v;
    return 0;
  }
  case GMR_OPT_STRING: {
    char *copy = gmr__strdup(t);
    if (copy == NULL) return fail_at(ps, n, "out of host memory");
    gmr__free(*(char **)field);
    *(char **)field = copy;
    return 0;
  }
  case GMR_OPT_ENUM:
    for (int i = 0; d->choices[i]; ++i)
      if (strcmp(t, d->choices[i]) == 0) return (*(int *)field = i), 0;
    {
      char list[256] = "";
      size_t off = 0;
      for (int i = 0; d->choices[i] && off < sizeof list; ++i)
        off +=
            (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", d->choices[i]);
      return fail_at(ps, n, "'%s' is not a choice for '%s'; expected one of: %s", t, d->key, list);
    }
  case GMR_OPT_TABLE:
    break; /* handled above */
  case GMR_OPT_CUSTOM: {
    char why[512] = "";
    if (d->parse(t, field, why, sizeof why) != 0)
      return fail_at(ps, n, "invalid value '%s' for '%s': %s", t, d->key, why);
    return 0;
  }
  }
  return fail_at(ps, n, "internal error: option '%s' has no type", d->key);
}

/* Apply a mapping's pairs to an options struct.  `skip` lists keys handled by
 * the caller (name, upstream). */
static int parse_options(parse_t *ps, const yaml_node_t *map, const gmr_opt_desc_t *desc,
                         void *opts, const char *what, const char *const *skip) {
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; ++p) {
    yaml_node_t *k = yaml_document_get_node(&ps->doc, p->key);
    yaml_node_t *v = yaml_document_get_node(&ps->doc, p->value);
    if (k->type != YAML_SCALAR_NODE) return fail_at(ps, k, "keys in %s must be plain words", what);
    for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; ++q) {
      yaml_node_t *k2 = yaml_document_get_node(&ps->doc, q->key);
      if (k2->type == YAML_SCALAR_NODE && strcmp(scalar(k2), scalar(k)) == 0)
        return fail_at(ps, k, "'%s' appears twice in %s", scalar(k), what);
    }
    bool skipped = false;
    for (int i = 0; skip && skip[i]; ++i)
      skipped |= strcmp(scalar(k), skip[i]) == 0;
    if (skipped) continue;
    const gmr_opt_desc_t *d = desc;
    while (d && d->key && strcmp(d->key, scalar(k)) != 0)
      ++d;
    if (d == NULL || d->key == NULL) {
      char keys[768];
      keys_list(desc, skip && skip[0] ? (skip[1] ? "name, upstream" : "name") : NULL, keys,
                sizeof keys);
      return fail_at(ps, k, "unknown key '%s' in %s; expected one of: %s", scalar(k), what, keys);
    }
    if (parse_option(ps, d, v, opts) != 0) return GMR_ECONFIG;
  }
  return 0;
}

static yaml_node_t *map_get(parse_t *ps, const yaml_node_t *map, const char *key) {
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; ++p) {
    yaml_node_t *k = yaml_document_get_node(&ps->doc, p->key);
    if (k->type == YAML_SCALAR_NODE && strcmp(scalar(k), key) == 0)
      return yaml_document_get_node(&ps->doc, p->value);
  }
  return NULL;
}

/* ---- policy sections ---------------------------------------------------------- */

void gmr__policy_cfg_free(gmr_policy_cfg_t *pc) {
  while (pc != NULL) {
    gmr_policy_cfg_t *up = pc->upstream;
    if (pc->opts && pc->ops->opts_release) pc->ops->opts_release(pc->opts);
    gmr__free(pc->opts);
    gmr__free(pc);
    pc = up;
  }
}

static int policy_cfg_new(const gmr_policy_ops_t *ops, gmr_policy_cfg_t **out) {
  gmr_policy_cfg_t *pc = gmr__calloc(1, sizeof *pc);
  if (pc == NULL) return GMR_ENOMEM;
  pc->ops = ops;
  pc->opts = gmr__calloc(1, ops->opts_size ? ops->opts_size : 1);
  if (pc->opts == NULL) {
    gmr__free(pc);
    return GMR_ENOMEM;
  }
  if (ops->opts_default) memcpy(pc->opts, ops->opts_default, ops->opts_size);
  *out = pc;
  return 0;
}

static int run_validate(parse_t *ps, const yaml_node_t *n, gmr_policy_cfg_t *pc) {
  if (pc->ops->validate == NULL) return 0;
  char why[512] = "";
  if (pc->ops->validate(pc->opts, why, sizeof why) != 0)
    return fail_at(ps, n, "invalid options for policy '%s': %s", pc->ops->name, why);
  return 0;
}

static int parse_policy(parse_t *ps, const yaml_node_t *n, int depth, gmr_policy_cfg_t **out) {
  if (depth > 8) return fail_at(ps, n, "policies are nested more than 8 deep");
  if (n->type == YAML_SCALAR_NODE) {
    /* `policy: caching` is short for `policy: {name: caching}`. */
    const gmr_policy_ops_t *ops = gmr__policy_lookup(scalar(n));
    if (ops == NULL) goto unknown_name;
    if (ops->is_decorator)
      return fail_at(ps, n,
                     "policy '%s' wraps another policy; write it as a mapping with "
                     "'upstream:'",
                     ops->name);
    if (policy_cfg_new(ops, out) != 0) return fail_at(ps, n, "out of host memory");
    if (run_validate(ps, n, *out) != 0) {
      gmr__policy_cfg_free(*out);
      return GMR_ECONFIG;
    }
    return 0;
  }
  if (n->type != YAML_MAPPING_NODE)
    return fail_at(ps, n, "a policy is a mapping with a 'name:' key, not %s", node_kind(n));
  yaml_node_t *name = map_get(ps, n, "name");
  if (name == NULL) return fail_at(ps, n, "this policy has no 'name:' key");
  if (name->type != YAML_SCALAR_NODE) return fail_at(ps, name, "'name' takes a policy name");
  const gmr_policy_ops_t *ops = gmr__policy_lookup(scalar(name));
  if (ops == NULL) {
    n = name;
    goto unknown_name;
  }
  gmr_policy_cfg_t *pc;
  if (policy_cfg_new(ops, &pc) != 0) return fail_at(ps, n, "out of host memory");
  char what[96];
  snprintf(what, sizeof what, "policy '%s'", ops->name);
  static const char *const skip_dec[] = {"name", "upstream", NULL};
  static const char *const skip_plain[] = {"name", NULL};
  int err = parse_options(ps, n, ops->opts_desc, pc->opts, what,
                          ops->is_decorator ? skip_dec : skip_plain);
  if (err == 0 && ops->is_decorator) {
    yaml_node_t *up = map_get(ps, n, "upstream");
    if (up == NULL)
      err = fail_at(ps, n, "policy '%s' wraps another policy: add 'upstream: {name: ...}'",
                    ops->name);
    else
      err = parse_policy(ps, up, depth + 1, &pc->upstream);
  }
  if (err == 0) err = run_validate(ps, n, pc);
  if (err != 0) {
    gmr__policy_cfg_free(pc);
    return err;
  }
  *out = pc;
  return 0;
unknown_name : {
  char names[512] = "";
  size_t off = 0;
  for (int i = 0; gmr__policies[i] && off < sizeof names; ++i)
    off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "",
                            gmr__policies[i]->name);
  return fail_at(ps, n, "unknown policy '%s'; expected one of: %s", scalar(n), names);
}
}

/* ---- the document ---------------------------------------------------------------- */

/* Note [The document]
 * A configuration picks the device, the policy stack and its options:
 *
 *   device:   {backend: auto|sim|cuda, capacity: 143771MiB, granularity: 2MiB,
 *              host_backed: false}                       (optional)
 *   policy:   {name: caching, <options of caching>}      (required)
 *   limit:    {bytes: 8GiB} or {fraction: 0.5}           (optional: wraps policy)
 *   trace:    path of a trace to record                  (optional)
 *
 * A decorator policy (limit) takes `upstream: {name: ..., ...}` (parse_policy).
 */

static int parse_document(parse_t *ps, gmr_config_t *cfg) {
  yaml_node_t *root = yaml_document_get_root_node(&ps->doc);
  if (root == NULL) return fail_at(ps, NULL, "the configuration is empty; expected a 'policy:'");
  if (root->type != YAML_MAPPING_NODE)
    return fail_at(ps, root, "the configuration is %s; expected a mapping with 'policy:'",
                   node_kind(root));
  yaml_node_t *policy = NULL, *limit = NULL;
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
       ++p) {
    yaml_node_t *k = yaml_document_get_node(&ps->doc, p->key);
    yaml_node_t *v = yaml_document_get_node(&ps->doc, p->value);
    if (k->type != YAML_SCALAR_NODE) return fail_at(ps, k, "top-level keys must be plain words");
    for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < p; ++q) {
      yaml_node_t *k2 = yaml_document_get_node(&ps->doc, q->key);
      if (k2->type == YAML_SCALAR_NODE && strcmp(scalar(k2), scalar(k)) == 0)
        return fail_at(ps, k, "'%s' appears twice", scalar(k));
    }
    const char *key = scalar(k);
    if (strcmp(key, "device") == 0) {
      if (v->type != YAML_MAPPING_NODE)
        return fail_at(ps, v,
                       "'device' is a mapping (backend, capacity, granularity, "
                       "host_backed), not %s",
                       node_kind(v));
      if (parse_options(ps, v, device_opts_desc, &cfg->device, "'device'", NULL) != 0)
        return GMR_ECONFIG;
      if (cfg->device.granularity && !gmr__is_pow2(cfg->device.granularity))
        return fail_at(ps, v, "'granularity' must be a power of two");
    } else if (strcmp(key, "policy") == 0) {
      policy = v;
    } else if (strcmp(key, "limit") == 0) {
      limit = v;
    } else if (strcmp(key, "trace") == 0) {
      if (v->type != YAML_SCALAR_NODE) return fail_at(ps, v, "'trace' takes a file path");
      cfg->trace_path = gmr__strdup(scalar(v));
      if (cfg->trace_path == NULL) return fail_at(ps, v, "out of host memory");
    } else {
      return fail_at(ps, k, "unknown key '%s'; expected one of: device, policy, limit, trace", key);
    }
  }
  if (policy == NULL) return fail_at(ps, root, "the configuration has no 'policy:' section");
  if (parse_policy(ps, policy, 0, &cfg->policy) != 0) return GMR_ECONFIG;
  if (limit != NULL) {
    if (limit->type != YAML_MAPPING_NODE)
      return fail_at(ps, limit, "'limit' is a mapping such as {bytes: 8GiB} or {fraction: 0.5}");
    gmr_policy_cfg_t *pc;
    if (policy_cfg_new(&gmr_limit_policy_ops, &pc) != 0) return fail_at(ps, limit, "out of memory");
    pc->upstream = cfg->policy;
    cfg->policy = pc;
    if (parse_options(ps, limit, gmr_limit_policy_ops.opts_desc, pc->opts, "'limit'", NULL) != 0)
      return GMR_ECONFIG;
    if (run_validate(ps, limit, pc) != 0) return GMR_ECONFIG;
  }
  return 0;
}

static int yaml_failure(parse_t *ps, yaml_parser_t *parser) {
  if (ps->err == NULL) return GMR_ECONFIG;
  gmr_error_t *e = ps->err;
  yaml_mark_t m = parser->problem_mark;
  if (parser->error == YAML_READER_ERROR) m.line = 0, m.column = parser->problem_offset;
  e->code = GMR_ECONFIG;
  e->line = (int)m.line + 1;
  e->column = (int)m.column + 1;
  snprintf(e->file, sizeof e->file, "%s", ps->file);
  snprintf(e->message, sizeof e->message, "%s:%d:%d: malformed YAML: %s%s%s", ps->file, e->line,
           e->column, parser->problem ? parser->problem : "syntax error",
           parser->context ? " " : "", parser->context ? parser->context : "");
  return GMR_ECONFIG;
}

/* ---- limits, checked as the events arrive -------------------------------------
 * A configuration is a few lines; before any document is built, one pass over
 * the parser's events bounds what the loader will ever hold, and stops at the
 * first event past a bound (so its cost is linear in the bytes read, whatever
 * the input):
 *   bytes <= CONFIG_MAX_BYTES,  nesting depth <= CONFIG_MAX_DEPTH,
 *   nodes <= CONFIG_MAX_NODES,  entries of one collection <= CONFIG_MAX_ENTRIES. */
#define CONFIG_MAX_BYTES   ((size_t)1 << 20) /* 1 MiB */
#define CONFIG_MAX_DEPTH   32
#define CONFIG_MAX_NODES   10000
#define CONFIG_MAX_ENTRIES 1000

static int fail_mark(parse_t *ps, yaml_mark_t m, const char *fmt, ...) GMR_PRINTF(3, 4);

static int fail_mark(parse_t *ps, yaml_mark_t m, const char *fmt, ...) {
  if (ps->err == NULL) return GMR_ECONFIG;
  char sentence[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sentence, sizeof sentence, fmt, ap);
  va_end(ap);
  gmr_error_t *e = ps->err;
  e->code = GMR_ECONFIG;
  e->line = (int)m.line + 1;
  e->column = (int)m.column + 1;
  snprintf(e->file, sizeof e->file, "%s", ps->file);
  snprintf(e->message, sizeof e->message, "%s:%d:%d: %s", ps->file, e->line, e->column, sentence);
  return GMR_ECONFIG;
}

static int check_limits(parse_t *ps, const char *text, size_t len) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return fail_at(ps, NULL, "out of host memory");
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  size_t entries[CONFIG_MAX_DEPTH + 1]; /* children of each open collection */
  int depth = 0, rc = 0;
  size_t nodes = 0;
  for (bool done = false; !done && rc == 0;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      rc = yaml_failure(ps, &parser);
      break;
    }
    bool opens = ev.type == YAML_MAPPING_START_EVENT || ev.type == YAML_SEQUENCE_START_EVENT;
    bool node = opens || ev.type == YAML_SCALAR_EVENT || ev.type == YAML_ALIAS_EVENT;
    if (node && ++nodes > CONFIG_MAX_NODES)
      rc = fail_mark(ps, ev.start_mark, "more than %d values: not a configuration",
                     CONFIG_MAX_NODES);
    else if (node && depth > 0 && ++entries[depth] > 2 * CONFIG_MAX_ENTRIES)
      rc = fail_mark(ps, ev.start_mark, "a collection of more than %d entries: not a configuration",
                     CONFIG_MAX_ENTRIES);
    else if (opens && depth == CONFIG_MAX_DEPTH)
      rc = fail_mark(ps, ev.start_mark, "nested more than %d deep: not a configuration",
                     CONFIG_MAX_DEPTH);
    else if (opens)
      entries[++depth] = 0;
    else if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT)
      --depth;
    done = ev.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  return rc;
}

/* text[0 .. len) is the whole input (NUL bytes included). */
static int load(const char *text, size_t len, const char *file, gmr_config_t **out,
                gmr_error_t *err) {
  parse_t ps = {.file = file, .err = err};
  if (len > CONFIG_MAX_BYTES) return fail_at(&ps, NULL, "larger than 1 MiB: not a configuration");
  if (memchr(text, '\0', len) != NULL)
    return fail_at(&ps, NULL, "holds a NUL byte: not a YAML text");
  int rc = check_limits(&ps, text, len);
  if (rc != 0) return rc;
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return GMR_ENOMEM;
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  if (!yaml_parser_load(&parser, &ps.doc)) {
    rc = yaml_failure(&ps, &parser);
    yaml_parser_delete(&parser);
    return rc;
  }
  gmr_config_t *cfg = gmr__calloc(1, sizeof *cfg);
  if (cfg == NULL) {
    rc = fail_at(&ps, NULL, "out of host memory");
  } else {
    atomic_init(&cfg->refs, 1);
    cfg->source = gmr__strdup(file);
    rc = cfg->source ? parse_document(&ps, cfg) : fail_at(&ps, NULL, "out of host memory");
  }
  /* A second document in the stream is an error too. */
  if (rc == 0) {
    yaml_document_t extra;
    if (!yaml_parser_load(&parser, &extra)) {
      rc = yaml_failure(&ps, &parser);
    } else {
      if (yaml_document_get_root_node(&extra) != NULL)
        rc = fail_at(&ps, yaml_document_get_root_node(&extra),
                     "a configuration holds one YAML document; this is a second one");
      yaml_document_delete(&extra);
    }
  }
  yaml_document_delete(&ps.doc);
  yaml_parser_delete(&parser);
  if (rc != 0) {
    gmr_config_free(cfg);
    return rc;
  }
  *out = cfg;
  return 0;
}

int gmr_config_load_string(const char *yaml, gmr_config_t **out, gmr_error_t *err) {
  if (yaml == NULL || out == NULL) return GMR_EINVAL;
  return load(yaml, strnlen(yaml, CONFIG_MAX_BYTES + 1), "<string>", out, err);
}

static int file_error(const char *path, const char *what, int e, gmr_error_t *err) {
  if (err) {
    err->code = GMR_EIO;
    err->line = err->column = 0;
    snprintf(err->file, sizeof err->file, "%s", path);
    snprintf(err->message, sizeof err->message, "%s: cannot %s the configuration: %s", path, what,
             strerror(e));
  }
  return GMR_EIO;
}

/* Reads at most CONFIG_MAX_BYTES + 1 bytes, so a huge file (or /dev/zero, as
 * GMR_CONFIG may name at process start) costs no more than a small one. */
int gmr_config_load_file(const char *path, gmr_config_t **out, gmr_error_t *err) {
  if (path == NULL || out == NULL) return GMR_EINVAL;
  FILE *f = fopen(path, "rb");
  if (f == NULL) return file_error(path, "open", errno, err);
  char *text = gmr__malloc(CONFIG_MAX_BYTES + 1);
  if (text == NULL) {
    fclose(f);
    return GMR_ENOMEM;
  }
  size_t len = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
  int rc = ferror(f) ? file_error(path, "read", errno, err) : load(text, len, path, out, err);
  gmr__free(text);
  fclose(f);
  return rc;
}

gmr_config_t *gmr__config_retain(const gmr_config_t *cfg) {
  gmr_config_t *c = (gmr_config_t *)cfg; /* the count is the one mutable field */
  atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
  return c;
}

void gmr_config_free(gmr_config_t *cfg) {
  if (cfg == NULL) return;
  if (atomic_fetch_sub_explicit(&cfg->refs, 1, memory_order_acq_rel) > 1) return;
  gmr__policy_cfg_free(cfg->policy);
  gmr__free(cfg->source);
  gmr__free(cfg->trace_path);
  gmr__free(cfg);
}

const char *gmr_config_policy_name(const gmr_config_t *cfg) {
  return cfg && cfg->policy ? cfg->policy->ops->name : "";
}

/* ---- the reference (docs/config.md is generated from these tables) ---------- */

static const char *type_name(gmr_opt_type_t t) {
  switch (t) {
  case GMR_OPT_BOOL:
    return "boolean";
  case GMR_OPT_SIZE:
    return "size";
  case GMR_OPT_INT:
    return "integer";
  case GMR_OPT_DOUBLE:
    return "number";
  case GMR_OPT_STRING:
    return "string";
  case GMR_OPT_ENUM:
    return "choice";
  case GMR_OPT_CUSTOM:
    return "text";
  case GMR_OPT_TABLE:
    return "mapping";
  }
  return "?";
}

static void write_table(FILE *out, const gmr_opt_desc_t *desc, const char *prefix) {
  fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
  for (const gmr_opt_desc_t *d = desc; d && d->key; ++d) {
    fprintf(out, "| `%s` | %s", d->key, type_name(d->type));
    if (d->type == GMR_OPT_ENUM) {
      fprintf(out, ":");
      for (int i = 0; d->choices[i]; ++i)
        fprintf(out, " `%s`", d->choices[i]);
    }
    fprintf(out, " | %s | %s", d->default_text ? d->default_text : "", d->help ? d->help : "");
    if (d->env != NULL) {
      fprintf(out, " Environment:");
      for (const char *p = d->env; *p != '\0';) {
        size_t len = strcspn(p, " ");
        fprintf(out, "%s `%.*s`", p == d->env ? "" : ",", (int)len, p);
        p += len + strspn(p + len, " ");
      }
      fprintf(out, ".");
    }
    fprintf(out, " |\n");
  }
  for (const gmr_opt_desc_t *d = desc; d && d->key; ++d) {
    if (d->type != GMR_OPT_TABLE) continue;
    char name[128];
    snprintf(name, sizeof name, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", d->key);
    fprintf(out, "\nThe keys of `%s`:\n\n", name);
    write_table(out, d->sub, name);
  }
}

int gmr_config_write_reference(FILE *out) {
  if (out == NULL) return GMR_EINVAL;
  fprintf(out, "# gmr configuration reference\n\n"
               "Generated by `gmr-demo --reference` from the option tables in the source; "
               "do not edit by hand.\n\n"
               "A configuration is one YAML mapping with these top-level keys:\n\n"
               "| key | meaning |\n|---|---|\n"
               "| `device` | the device (optional; see below) |\n"
               "| `policy` | the allocation policy: `{name: NAME, options...}` (required) |\n"
               "| `limit` | a cap that wraps the policy: the options of the `limit` policy |\n"
               "| `trace` | a file to record every allocation and free into (CSV) |\n\n"
               "Sizes take units: `4096`, `512KiB`, `512MiB`, `8GiB` (binary), `1GB` (decimal).\n\n"
               "## device\n\n");
  write_table(out, device_opts_desc, "device");
  for (int i = 0; gmr__policies[i]; ++i) {
    const gmr_policy_ops_t *ops = gmr__policies[i];
    fprintf(out, "\n## policy `%s`\n\n%s\n\n", ops->name, ops->help ? ops->help : "");
    if (ops->is_decorator)
      fprintf(out, "Wraps another policy, given as `upstream: {name: ..., ...}`.\n\n");
    if (ops->opts_desc && ops->opts_desc[0].key)
      write_table(out, ops->opts_desc, ops->name);
    else
      fprintf(out, "No options.\n");
  }
  gmr__env_write_reference(out);
  return ferror(out) ? GMR_EIO : 0;
}
