/* top.c: TAP test of gmr-top (tools/top.c) on a shared-cap file that two
 * runtimes of this process hold slots in: --json and --once show the cap, the
 * committed total and each process's label, pid, quota, guarantee and bytes
 * held; --count redraws; --help, --version, a bad option and a missing file
 * give their exit statuses; a FIFO named like a cap file never hangs it; hostile
 * label bytes are escaped in the table and the JSON stays valid UTF-8. */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sim-runtime.h"

#define MiB ((uint64_t)1 << 20)

static char out[65536];

/* Run gmr-top with `args`; its stdout in out[], its exit status returned. */
static int top(const char *args) {
  const char *b = getenv("GMR_BUILDDIR");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "timeout 10 %s/tools/gmr-top %s 2>&1", b && *b ? b : ".", args);
  FILE *p = popen(cmd, "r");
  if (p == NULL) return -1;
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every byte sequence of s is valid UTF-8 (no overlong forms or surrogates). */
static int utf8_valid(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  while (*s) {
    unsigned c = *s;
    int n = c < 0x80                 ? 1
            : c >= 0xc2 && c <= 0xdf ? 2
            : c >= 0xe0 && c <= 0xef ? 3
            : c >= 0xf0 && c <= 0xf4 ? 4
                                     : 0;
    if (n == 0) return 0;
    for (int i = 1; i < n; ++i)
      if ((s[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
    if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
    s += n;
  }
  return 1;
}

int main(void) {
  char dir[256] = "/tmp/gmr-top-XXXXXX", file[300], yaml[1024], args[1024];
  if (mkdtemp(dir) == NULL) skip_all("cannot make a temporary folder");
  snprintf(file, sizeof file, "%s/cap", dir);
  snprintf(yaml, sizeof yaml,
           "policy: direct\nlimit: {bytes: 600MiB, counts: reserved, shared: {cap: 1000MiB, "
           "guaranteed: 100MiB, label: llama-serve, path: '%s'}}\n",
           file);
  gmr_runtime_t *a = sim_runtime(yaml, 2048 * MiB, 0);
  snprintf(yaml, sizeof yaml,
           "policy: direct\nlimit: {bytes: 300MiB, counts: reserved, shared: {cap: 1000MiB, "
           "label: batch, path: '%s'}}\n",
           file);
  gmr_runtime_t *b = sim_runtime(yaml, 2048 * MiB, 0);
  void *pa, *pb;
  ok(a && b && gmr_alloc(a, 250 * MiB, NULL, &pa) == 0 && gmr_alloc(b, 40 * MiB, NULL, &pb) == 0,
     "two runtimes share a 1000 MiB cap and hold 250 and 40 MiB");

  snprintf(args, sizeof args, "--json '%s'", file);
  is_int(top(args), 0, "gmr-top --json FILE");
  like(out, "\"cap\": 1048576000", "the cap");
  like(out, "\"committed\": 304087040", "committed: 250 + 40 MiB");
  like(out, "\"held\": 304087040", "held");
  like(out, "\"guaranteed\": 104857600", "the guarantees");
  like(out, "\"live\": 2", "two processes");
  char want[256];
  snprintf(want, sizeof want,
           "\"label\": \"llama-serve\", \"pid\": %d, \"alive\": true, \"quota\": 629145600, "
           "\"guaranteed\": 104857600, \"held\": 262144000",
           (int)getpid());
  like(out, want, "llama-serve: pid, alive, quota, guarantee, held");
  like(out, "\"label\": \"batch\"", "batch too");
  like(out, "\"device\": \"sim0-2147483648\"", "the device id");

  snprintf(args, sizeof args, "--once '%s'", file);
  is_int(top(args), 0, "gmr-top --once FILE");
  like(out, "cap 1000.00 MiB  committed 290.00 MiB (29.0%)", "the table's header");
  like(out, "llama-serve", "a row per process");
  like(out, "250.00 MiB", "with its bytes held");
  snprintf(args, sizeof args, "--count 2 --interval 0.05 '%s'", file);
  is_int(top(args), 0, "gmr-top --count 2 --interval 0.05");
  const char *second = strstr(out, "gmr-top ");
  ok(second && strstr(second + 1, "gmr-top ") != NULL, "redraws twice");

  is_int(top("--help"), 0, "--help");
  like(out, "usage: gmr-top", "prints the usage");
  is_int(top("--version"), 0, "--version");
  like(out, "gmr-top (gmr) ", "prints the version");
  is_int(top("--bogus"), 2, "an unknown option: exit 2");
  is_int(top("--interval 0"), 2, "a bad interval: exit 2");
  snprintf(args, sizeof args, "--json '%s/none'", dir);
  is_int(top(args), 1, "a missing file: exit 1");
  like(out, "cannot open", "with the reason");

  /* A label rewritten with terminal escapes and bytes that are not UTF-8. */
  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t sl[4];
  size_t n = 0;
  int idx = -1;
  if (gmr_shared_cap_read(file, &info, sl, 4, &n) == 0)
    for (size_t i = 0; i < n; ++i)
      if (strcmp(sl[i].label, "batch") == 0) idx = sl[i].index;
  static const char evil[] = "\x1b[2J\xff\xc0"
                             "evil\xc2\x9b\xe2\x82";
  int fd = open(file, O_WRONLY);
  ok(idx >= 0 && fd >= 0 && pwrite(fd, evil, sizeof evil, 4096 + 128 * idx + 64) == sizeof evil,
     "a writer puts escapes and invalid UTF-8 into a label");
  close(fd);
  snprintf(args, sizeof args, "--once '%s'", file);
  is_int(top(args), 0, "gmr-top --once");
  ok(strchr(out, 0x1b) == NULL && strchr(out, (char)0x9b) == NULL,
     "  no escape byte reaches the terminal");
  like(out, "\\x1b[2J\\xff\\xc0evil", "  the label is shown escaped (to 24 columns)");
  snprintf(args, sizeof args, "--json '%s'", file);
  is_int(top(args), 0, "gmr-top --json");
  ok(utf8_valid(out), "  the document is valid UTF-8");
  like(out, "\"label\": \"\\u001b[2J\\u00ff\\u00c0evil\xc2\x9b\\u00e2\\u0082\"",
       "  with the bytes escaped (a valid sequence kept)");

  /* A FIFO named like a cap file (anyone can make one in /dev/shm). */
  char fifo[320];
  snprintf(fifo, sizeof fifo, "%s/gmr-cap-fifo", dir);
  ok(mkfifo(fifo, 0666) == 0, "a FIFO named like a cap file");
  snprintf(args, sizeof args, "--json '%s' '%s'", fifo, file);
  is_int(top(args), 1, "gmr-top on it and a real file: exit 1 at once (124: it hung)");
  like(out, "it is a FIFO", "  naming the FIFO");
  like(out, "\"cap\": 1048576000", "  and the real file is still shown");
  unlink(fifo);

  gmr_free(a, pa);
  gmr_free(b, pb);
  gmr_runtime_free(a);
  gmr_runtime_free(b);
  snprintf(args, sizeof args, "--json '%s'", file);
  is_int(top(args), 0, "after the runtimes are gone");
  like(out, "\"live\": 0", "no process is left");
  unlink(file);
  rmdir(dir);
  return done_testing();
}
