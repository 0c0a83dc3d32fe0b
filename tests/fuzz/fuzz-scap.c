/* fuzz-scap.c: libFuzzer harness for the shared-cap file as hostile input
 * (lib/core/shared-cap.c, Note [Validating the file]).
 *
 * Input: a flags byte, a 16-bit offset (in units of 8 bytes, into the 36 KiB
 * file), then bytes.  Each execution makes a fresh file with member A
 * (attached, holding 100 MiB), writes the bytes into the file at the offset
 * (flag 1: then cuts the file there; flag 2: grows it by a page), lets member
 * B attach to the mutated file (refused with GMR_ECONFIG, or attached), reads
 * it with the public reader, and has both members reserve and release.
 * Promises checked: no crash or hang (the fuzzer's -timeout); reservations
 * give 0, GMR_ENOMEM or GMR_EBUSY; a member never holds past its quota; and
 * once each member has locked the file again, the totals are rebuilt from
 * the live members exactly: committed = Σ max(used, guaranteed) over A and B,
 * whatever was written. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "core/shared-cap.h"
#include "fuzz.h"

#define MiB       ((uint64_t)1 << 20)
#define SCAP_FILE (4096 + 256 * 128)

static char path[256];

static gmr_scap_t *member(const char *label, uint64_t quota, uint64_t g, int *rc) {
  gmr_scap_opts_t o = {.path = path,
                       .device_id = "fuzz",
                       .cap = 1024 * MiB,
                       .quota = quota,
                       .guaranteed = g,
                       .label = label,
                       .timeout_s = 0.05};
  gmr_scap_t *h = NULL;
  *rc = gmr__scap_attach(&o, &h);
  return h;
}

static void ops(gmr_scap_t *h, uint64_t quota, uint64_t *held) {
  static const uint64_t sizes[] = {1 * MiB, 64 * MiB, 300 * MiB, 900 * MiB};
  for (int i = 0; i < 4; ++i) {
    int rc = gmr__scap_reserve(h, sizes[i]);
    fuzz_assert(rc == 0 || rc == GMR_ENOMEM || rc == GMR_EBUSY, "reserve: %s: %s", gmr_err_name(rc),
                gmr__error_last());
    if (rc == 0) *held += sizes[i];
    fuzz_assert(*held <= quota, "past the quota: %llu", (unsigned long long)*held);
  }
  gmr__scap_release(h, 64 * MiB <= *held ? 64 * MiB : 0);
  if (64 * MiB <= *held) *held -= 64 * MiB;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (path[0] == '\0') {
    char dir[] = "/tmp/gmr-fuzz-scap-XXXXXX";
    if (mkdtemp(dir) == NULL) abort();
    snprintf(path, sizeof path, "%s/cap", dir);
    gmr_set_log(NULL, NULL);
  }
  if (size < 3) return 0;
  unsigned flags = data[0];
  size_t off = ((size_t)data[1] | (size_t)data[2] << 8) * 8 % SCAP_FILE;
  data += 3, size -= 3;
  unlink(path);
  int rc;
  gmr_scap_t *a = member("a", 600 * MiB, 50 * MiB, &rc);
  fuzz_assert(a != NULL, "the first member: %s", gmr__error_last());
  uint64_t held_a = 0, held_b = 0;
  fuzz_assert(gmr__scap_reserve(a, 100 * MiB) == 0, "A's first 100 MiB");
  held_a = 100 * MiB;

  /* The hostile write, while A is attached. */
  int fd = open(path, O_WRONLY);
  fuzz_assert(fd >= 0, "open");
  if (size > 0 && pwrite(fd, data, size, (off_t)off) < 0) abort();
  if (flags & 1) {
    if (ftruncate(fd, (off_t)off) != 0) abort();
  } else if (flags & 2) {
    if (ftruncate(fd, SCAP_FILE + 4096) != 0) abort();
  }
  close(fd);

  gmr_shared_cap_info_t info;
  gmr_shared_cap_slot_t slots[8];
  size_t n = 0;
  rc = gmr_shared_cap_read(path, &info, slots, 8, &n);
  fuzz_assert(rc == 0 || rc == GMR_EINVAL, "read: %s", gmr_err_name(rc));

  ops(a, 600 * MiB, &held_a); /* A finds the damage, rebuilds */
  gmr_scap_t *b = member("b", 400 * MiB, 0, &rc);
  fuzz_assert(b != NULL || rc == GMR_ECONFIG || rc == GMR_ENOMEM || rc == GMR_EBUSY,
              "attach: %s: %s", gmr_err_name(rc), gmr__error_last());
  if (b != NULL) ops(b, 400 * MiB, &held_b);
  ops(a, 600 * MiB, &held_a);
  if (b != NULL) ops(b, 400 * MiB, &held_b);

  gmr_scap_view_t v;
  gmr__scap_view(a, &v); /* a sweep under the lock */
  fuzz_assert(v.used == held_a, "A's used %llu, held %llu", (unsigned long long)v.used,
              (unsigned long long)held_a);
  uint64_t want = (held_a > 50 * MiB ? held_a : 50 * MiB) + held_b;
  fuzz_assert(v.committed == want, "committed %llu, the live members %llu",
              (unsigned long long)v.committed, (unsigned long long)want);
  rc = gmr_shared_cap_read(path, &info, slots, 8, &n);
  fuzz_assert(rc == 0 && info.live == (b != NULL ? 2u : 1u) && info.cap == 1024 * MiB,
              "after the rebuild: rc %d, %u live, cap %llu", rc, info.live,
              (unsigned long long)info.cap);
  gmr__scap_release(a, held_a);
  if (b != NULL) gmr__scap_release(b, held_b);
  gmr__scap_detach(b);
  gmr__scap_detach(a);
  return 0;
}
