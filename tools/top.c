/* top.c: gmr-top, who shares a device's memory under a shared cap.
 *
 *   gmr-top [--json] [--once] [--interval SEC] [--count N] [FILE...]
 *
 * Reads shared-cap files (docs/shared-cap.md) with gmr_shared_cap_read, the
 * public reader, which neither takes their lock nor changes them, and shows
 * per file the device, the cap, what all processes have committed and hold,
 * and per attached process its label, pid, quota, guaranteed bytes, bytes
 * held and whether it is alive (a dead process's share goes back at the next
 * reservation of another).  Without FILE it reads every file of this user in
 * the default place (/dev/shm/gmr-cap-<uid>-*).
 *
 * Labels, device ids and names come from files, so they are escaped: in
 * the table every byte but printable ASCII is \xHH (no escape sequence
 * reaches the terminal), and the JSON document stays valid UTF-8.
 *
 * Live by default: the screen is redrawn every --interval seconds (1) until
 * interrupted or --count redraws; --once prints the table once, --json prints
 * one JSON document once.  Exit status: 0, 1 when a file cannot be read (the
 * others are still shown), 2 on a usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gmr.h"

#define TOP_MAX_FILES 64
#define TOP_MAX_SLOTS 1024

typedef struct top_opts_s {
  int json, once;
  double interval;
  long count; /* 0: until interrupted */
  const char *files[TOP_MAX_FILES];
  int n_files;
  int from_dir; /* the files were found in the default place */
} top_opts_t;

static volatile sig_atomic_t top_stop;
static void on_signal(int sig) {
  (void)sig;
  top_stop = 1;
}

static const char top_usage[] =
    "usage: gmr-top [--json] [--once] [--interval SEC] [--count N] [FILE...]\n"
    "\n"
    "Show the processes that share a GPU's memory under gmr's shared cap\n"
    "(limit.shared in the configuration): per shared-cap FILE the device, the\n"
    "cap, what all processes have committed and hold, and per process its label,\n"
    "pid, quota, guaranteed bytes, bytes held and whether it is alive (a dead\n"
    "process's share returns at the next reservation of another).  Without FILE,\n"
    "every file of this user in /dev/shm (gmr-cap-UID-*).  The files are read\n"
    "without taking their lock and are never changed.  The screen is redrawn\n"
    "every SEC seconds until interrupted.\n"
    "\n"
    "  -j, --json           print one JSON document and exit\n"
    "  -1, --once           print the table once and exit\n"
    "  -n, --interval SEC   seconds between redraws, 0.05 to 3600 (default 1)\n"
    "  -c, --count N        stop after N redraws\n"
    "  -h, --help           print this help and exit\n"
    "  -V, --version        print the version and exit\n"
    "\n"
    "Exit status: 0, 1 when a file cannot be read (the others are still\n"
    "shown), 2 for usage errors.\n";

static void usage(FILE *f) {
  fputs(top_usage, f);
}

static void fmt(uint64_t b, char *buf, size_t len) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 5)
    v /= 1024.0, ++u;
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)b);
  else
    snprintf(buf, len, "%.2f %s", v, unit[u]);
}

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0 if it is not
 * one (overlong forms, surrogates and code points past U+10FFFF are not). */
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  int n = c < 0x80                 ? 1
          : c >= 0xc2 && c <= 0xdf ? 2
          : c >= 0xe0 && c <= 0xef ? 3
          : c >= 0xf0 && c <= 0xf4 ? 4
                                   : 0;
  for (int i = 1; i < n; ++i)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
  if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
  return n;
}

/* A JSON string that stays valid UTF-8 whatever the bytes (labels, device
 * ids and names come from files anyone of the domain can write): controls
 * and DEL as \u00XX, and a byte that starts no valid UTF-8 sequence as
 * \u00XX too (its Latin-1 reading), so the document always parses. */
static void json_str(FILE *f, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  fputc('"', f);
  while (*s) {
    unsigned char c = *s;
    int n = utf8_len(s);
    if (c == '"' || c == '\\') {
      fprintf(f, "\\%c", c);
    } else if (c < 0x20 || c == 0x7f || n == 0) {
      fprintf(f, "\\u%04x", c);
      n = 1;
    } else {
      fwrite(s, 1, (size_t)n, f);
    }
    s += n;
  }
  fputc('"', f);
}

/* For the table: printable ASCII as it is, every other byte as \xHH, so a
 * label cannot send escape sequences (or C1 controls) to the terminal. */
static const char *text_str(const char *str, char *buf, size_t len) {
  size_t o = 0;
  for (const unsigned char *s = (const unsigned char *)str; *s && o + 5 < len; ++s) {
    if (*s >= 0x20 && *s < 0x7f && *s != '\\')
      buf[o++] = (char)*s;
    else
      o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *s);
  }
  buf[o] = '\0';
  return buf;
}

/* The default files: <dir>/<prefix>* for this user, sorted by name. */
static char **list_default(int *n_out) {
  char prefix[512];
  *n_out = 0;
  if (gmr_shared_cap_default_path("", prefix, sizeof prefix) != 0) return NULL;
  char *slash = strrchr(prefix, '/');
  if (slash == NULL) return NULL;
  *slash = '\0';
  const char *dir = prefix, *base = slash + 1;
  DIR *d = opendir(dir);
  if (d == NULL) return NULL;
  char **names = NULL;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < TOP_MAX_FILES) {
    if (strncmp(e->d_name, base, strlen(base)) != 0) continue;
    char **grown = realloc(names, sizeof *names * (size_t)(n + 1));
    if (grown == NULL) break;
    names = grown;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (names[n] == NULL) break;
    snprintf(names[n], len, "%s/%s", dir, e->d_name);
    ++n;
  }
  closedir(d);
  for (int i = 1; i < n; ++i) /* insertion sort: a handful of names */
    for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; --j) {
      char *t = names[j];
      names[j] = names[j - 1];
      names[j - 1] = t;
    }
  *n_out = n;
  return names;
}

static gmr_shared_cap_slot_t slots[TOP_MAX_SLOTS];

static int show_file(FILE *out, const char *path, const top_opts_t *o, int first) {
  gmr_shared_cap_info_t info;
  size_t n = 0;
  int rc = gmr_shared_cap_read(path, &info, slots, TOP_MAX_SLOTS, &n);
  if (rc != 0) {
    char msg[4096];
    fprintf(stderr, "gmr-top: %s\n", text_str(gmr_last_error(NULL), msg, sizeof msg));
    return 1;
  }
  if (o->json) {
    fprintf(out, "%s\n    {\"path\": ", first ? "" : ",");
    json_str(out, path);
    fprintf(out, ", \"device\": ");
    json_str(out, info.device_id);
    fprintf(out,
            ", \"version\": %u, \"cap\": %llu, \"committed\": %llu, \"held\": %llu, "
            "\"guaranteed\": %llu, \"slots\": %u, \"live\": %u, \"sweeps\": %llu, \"repairs\": "
            "%llu, \"timeouts\": %llu,\n     \"processes\": [",
            info.version, (unsigned long long)info.cap, (unsigned long long)info.committed,
            (unsigned long long)info.held, (unsigned long long)info.guaranteed, info.slots,
            info.live, (unsigned long long)info.sweeps, (unsigned long long)info.repairs,
            (unsigned long long)info.timeouts);
    for (size_t i = 0; i < n; ++i) {
      const gmr_shared_cap_slot_t *s = &slots[i];
      fprintf(out, "%s\n      {\"slot\": %d, \"generation\": %u, \"label\": ", i ? "," : "",
              s->index, s->generation);
      json_str(out, s->label);
      fprintf(out,
              ", \"pid\": %d, \"alive\": %s, \"quota\": %llu, \"guaranteed\": %llu, \"held\": "
              "%llu, \"operations\": %llu, \"since\": %llu}",
              s->pid, s->alive ? "true" : "false", (unsigned long long)s->quota,
              (unsigned long long)s->guaranteed, (unsigned long long)s->held,
              (unsigned long long)s->operations, (unsigned long long)s->since);
    }
    fprintf(out, "%s]}", n ? "\n     " : "");
    return 0;
  }
  char cap[32], com[32], held[32], g[32];
  fmt(info.cap, cap, sizeof cap);
  fmt(info.committed, com, sizeof com);
  fmt(info.held, held, sizeof held);
  fmt(info.guaranteed, g, sizeof g);
  double pct = info.cap ? 100.0 * (double)info.committed / (double)info.cap : 0;
  char tpath[2048], tdev[512];
  fprintf(out, "%s\n  device %s  cap %s  committed %s (%.1f%%)  held %s  guaranteed %s\n",
          text_str(path, tpath, sizeof tpath), text_str(info.device_id, tdev, sizeof tdev), cap,
          com, pct, held, g);
  fprintf(out,
          "  %u of %u slots live; %llu sweeps, %llu repairs after a death in the lock, %llu "
          "lock timeouts\n",
          info.live, info.slots, (unsigned long long)info.sweeps, (unsigned long long)info.repairs,
          (unsigned long long)info.timeouts);
  fprintf(out, "  %-24s %8s %12s %12s %12s %6s %10s\n", "LABEL", "PID", "QUOTA", "GUARANTEED",
          "HELD", "STATE", "SINCE");
  for (size_t i = 0; i < n; ++i) {
    const gmr_shared_cap_slot_t *s = &slots[i];
    char q[32], gg[32], h[32], since[16] = "-";
    if (s->quota)
      fmt(s->quota, q, sizeof q);
    else
      snprintf(q, sizeof q, "-");
    fmt(s->guaranteed, gg, sizeof gg);
    fmt(s->held, h, sizeof h);
    time_t t = (time_t)s->since;
    struct tm tm;
    if (s->since && localtime_r(&t, &tm) != NULL) strftime(since, sizeof since, "%H:%M:%S", &tm);
    char tl[sizeof s->label * 4 + 1];
    fprintf(out, "  %-24.24s %8d %12s %12s %12s %6s %10s\n",
            s->label[0] ? text_str(s->label, tl, sizeof tl) : "-", s->pid, q, gg, h,
            s->alive ? "alive" : "dead", since);
  }
  return 0;
}

static int show(const top_opts_t *o) {
  char **found = NULL;
  int n_found = 0, status = 0;
  const char *const *files = o->files;
  int n = o->n_files;
  if (n == 0) {
    found = list_default(&n_found);
    files = (const char *const *)found;
    n = n_found;
  }
  if (o->json) printf("{\"files\": [");
  if (n == 0 && !o->json) {
    char prefix[512] = "";
    gmr_shared_cap_default_path("", prefix, sizeof prefix);
    printf("no shared-cap files (%s*)\n", prefix);
  }
  for (int i = 0; i < n; ++i) {
    if (!o->json && i) printf("\n");
    status |= show_file(stdout, files[i], o, i == 0);
  }
  if (o->json) printf("%s]}\n", n ? "\n  " : "");
  for (int i = 0; i < n_found; ++i)
    free(found[i]);
  free(found);
  fflush(stdout);
  return status;
}

int main(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, NULL, 'j'},
                                        {"once", no_argument, NULL, '1'},
                                        {"interval", required_argument, NULL, 'n'},
                                        {"count", required_argument, NULL, 'c'},
                                        {"help", no_argument, NULL, 'h'},
                                        {"version", no_argument, NULL, 'V'},
                                        {NULL, 0, NULL, 0}};
  top_opts_t o = {.interval = 1.0};
  int c;
  opterr = 0; /* tools/cli.h says what is wrong */
  while ((c = getopt_long(argc, argv, ":j1n:c:hV", longs, NULL)) != -1) {
    char *end;
    switch (c) {
    case 'j':
      o.json = 1;
      break;
    case '1':
      o.once = 1;
      break;
    case 'n':
      errno = 0;
      o.interval = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(o.interval >= 0.05 && o.interval <= 3600)) {
        fprintf(stderr, "gmr-top: --interval takes seconds in [0.05, 3600], not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'c':
      errno = 0;
      o.count = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || o.count < 1) {
        fprintf(stderr, "gmr-top: --count takes a number >= 1, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("gmr-top (gmr) %d.%d.%d\n", GMR_VERSION_MAJOR, GMR_VERSION_MINOR, GMR_VERSION_PATCH);
      return 0;
    default:
      return cli_bad_option("gmr-top", argv, c, longs);
    }
  }
  for (int i = optind; i < argc; ++i) {
    if (o.n_files == TOP_MAX_FILES) {
      fprintf(stderr, "gmr-top: at most %d files\n", TOP_MAX_FILES);
      return 2;
    }
    o.files[o.n_files++] = argv[i];
  }
  if (o.json || o.once) return show(&o);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int live = isatty(STDOUT_FILENO), status = 0;
  for (long i = 0; !top_stop && (o.count == 0 || i < o.count); ++i) {
    if (i > 0) {
      struct timespec ts = {(time_t)o.interval,
                            (long)((o.interval - (double)(time_t)o.interval) * 1e9)};
      while (nanosleep(&ts, &ts) != 0 && !top_stop) {
      }
      if (top_stop) break;
    }
    if (live) printf("\033[H\033[2J");
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32] = "";
    if (localtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
    printf("gmr-top %s (every %.3g s; Ctrl-C to quit)\n\n", stamp, o.interval);
    status = show(&o);
  }
  return status;
}
