/* util.c: tests of the library's small helpers: error codes, size parsing
 * and formatting, growable strings, host-allocation fault injection. */
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "tap.h"

int main(void) {
  /* Error codes and their words. */
  is_str(gmr_strerror(GMR_ENOMEM), "out of memory", "strerror(ENOMEM)");
  is_str(gmr_strerror(GMR_EBADPTR), "pointer not owned by this runtime, or already freed",
         "strerror(EBADPTR)");
  is_str(gmr_err_name(GMR_ECONFIG), "GMR_ECONFIG", "err_name(ECONFIG)");
  is_str(gmr_strerror(12345), "unknown error", "strerror of an unknown code");
  is_int(GMR_ENOMEM, -1, "codes are negative");

  /* Sizes with units. */
  struct {
    const char *text;
    uint64_t want;
  } good[] = {{"4096", 4096},       {"512B", 512},
              {"1KiB", 1024},       {"512MiB", 512ull << 20},
              {"8GiB", 8ull << 30}, {"1.5GiB", 3ull << 29},
              {"2MB", 2000000},     {"143771MiB", 143771ull << 20},
              {"0x1000", 4096},     {" 4 GiB ", 4ull << 30},
              {"20M", 20ull << 20}, {"1EiB", 1ull << 60}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; ++i) {
    uint64_t v = 0;
    int rc = gmr__parse_size(good[i].text, &v);
    ok(rc == 0 && v == good[i].want, "parse_size(\"%s\") = %llu", good[i].text,
       (unsigned long long)good[i].want);
  }
  const char *bad[] = {"", "-1", "abc", "12 parsecs", "1.5B", "1e30GiB", "GiB", "0x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    uint64_t v = 77;
    is_int(gmr__parse_size(bad[i], &v), GMR_EINVAL, "parse_size(\"%s\") is rejected", bad[i]);
    is_u64(v, 77, "  and leaves the output untouched");
  }

  char buf[32];
  gmr__format_size(1000, buf, sizeof buf);
  is_str(buf, "1000 bytes", "format_size(1000)");
  gmr__format_size(20ull << 20, buf, sizeof buf);
  is_str(buf, "20.00 MiB", "format_size(20 MiB)");
  gmr__format_size(3ull << 29, buf, sizeof buf);
  is_str(buf, "1.50 GiB", "format_size(1.5 GiB)");
  gmr_format_size(UINT64_MAX, buf, sizeof buf);
  is_str(buf, "16.00 EiB", "gmr_format_size(2^64 - 1), the public form");
  gmr_format_size(4096, buf, 5);
  is_str(buf, "4.00", "  truncated to its buffer");
  gmr_format_size(4096, NULL, 0); /* nothing to write to: nothing written */
  ok(1, "  a NULL buffer of length 0 is accepted");

  /* Growable strings. */
  gmr_strbuf_t sb = {0};
  is_str(gmr__sb_str(&sb), "", "an empty builder reads as \"\"");
  for (int i = 0; i < 1000; ++i)
    gmr__sb_printf(&sb, "%d,", i);
  is_int(sb.len, 3890, "1000 numbers appended (%zu bytes)", sb.len);
  ok(strncmp(sb.data, "0,1,2,", 6) == 0 && strcmp(sb.data + sb.len - 4, "999,") == 0,
     "their text is intact");
  gmr__sb_free(&sb);

  /* Host allocation faults: the k-th call fails, the others succeed. */
  gmr__host_fail_nth(2);
  void *a = gmr__malloc(16), *b = gmr__malloc(16), *c = gmr__malloc(16);
  ok(a != NULL && b == NULL && c != NULL, "gmr__host_fail_nth(2) fails exactly the second call");
  gmr__free(a);
  gmr__free(c);
  return done_testing();
}
