/* cli.h: the command-line manners shared by gmr-demo, gmr-info and gmr-bench.
 *
 * Every tool parses its options with getopt_long (opterr = 0, so the
 * messages are these), before doing any work:
 *   --help      the usage text on stdout, exit 0;
 *   --version   "TOOL (gmr) VERSION" on stdout (gmr_version()), exit 0;
 *   an unknown option, a missing or bad value: "TOOL: unknown option '--x'"
 *   (or what is wrong) and a pointer to --help on stderr, exit 2.
 */
#ifndef GMR_TOOLS_CLI_H
#define GMR_TOOLS_CLI_H

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gmr.h"

#define CLI_USAGE_ERROR 2

/* Print "TOOL: message" and the --help pointer; returns CLI_USAGE_ERROR. */
static inline int cli_usage_error(const char *tool, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", tool);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry '%s --help' for more information.\n", tool);
  return CLI_USAGE_ERROR;
}

/* getopt_long returned '?' or ':' (with ":" leading the short options):
 * say which option and what is wrong with it. */
static inline int cli_bad_option(const char *tool, char **argv, int c,
                                 const struct option *longopts) {
  const char *arg = argv[optind - 1];
  if (c == ':') return cli_usage_error(tool, "option '%s' needs a value", arg);
  if (arg[0] == '-' && arg[1] == '-') {
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    for (const struct option *o = longopts; eq && o->name; ++o)
      if (strlen(o->name) == n && strncmp(o->name, arg + 2, n) == 0)
        return cli_usage_error(tool, "option '--%s' takes no value", o->name);
    return cli_usage_error(tool, "unknown option '%s'", arg);
  }
  if (optopt != 0) return cli_usage_error(tool, "unknown option '-%c'", optopt);
  return cli_usage_error(tool, "unknown option '%s'", arg);
}

static inline int cli_version(const char *tool) {
  printf("%s (gmr) %s\n", tool, gmr_version());
  return 0;
}

#endif /* GMR_TOOLS_CLI_H */
