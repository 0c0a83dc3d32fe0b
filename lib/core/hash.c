/* hash.c: a keyed hash for tables whose keys come from outside (call-site
 * texts of a trace, names in a hostile file).
 *
 * An unkeyed hash (FNV, or the Fibonacci multiply of internal.h) lets whoever
 * writes the input choose keys that all land in one slot, and a table of n of
 * them costs n^2.  SipHash-1-3 (Aumasson and Bernstein, the variant Python and
 * Rust use for their dictionaries) under a 128-bit key drawn at random for
 * each table makes the slots unpredictable: see Note [Keyed hashing].
 */
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

/* Note [Keyed hashing]
 * ~~~~~~~~~~~~~~~~~~~~
 * The key comes from getrandom(2) (without blocking); where that fails (an
 * old kernel, a seccomp filter) it is mixed from the clock, the process id,
 * an address and a counter through splitmix64: not secret, but not known
 * before the process runs, which is what a file written in advance needs.
 * The hash decides only where a key sits in a table, never an order anyone
 * sees, so a random key changes no output.
 */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void gmr__hash_key_new(gmr_hash_key_t *key) {
  if (getrandom(key->k, sizeof key->k, GRND_NONBLOCK) == (ssize_t)sizeof key->k) return;
  static _Atomic uint64_t calls;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16) ^
               (uint64_t)(uintptr_t)key ^ (++calls << 48);
  key->k[0] = splitmix64(&s);
  key->k[1] = splitmix64(&s);
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
  do {                                                                                             \
    v0 += v1, v1 = ROTL(v1, 13), v1 ^= v0, v0 = ROTL(v0, 32);                                      \
    v2 += v3, v3 = ROTL(v3, 16), v3 ^= v2;                                                         \
    v0 += v3, v3 = ROTL(v3, 21), v3 ^= v0;                                                         \
    v2 += v1, v1 = ROTL(v1, 17), v1 ^= v2, v2 = ROTL(v2, 32);                                      \
  } while (0)

/* SipHash-1-3: one round per 8-byte word, three at the end. */
uint64_t gmr__hash_keyed(const gmr_hash_key_t *key, const void *data, size_t len) {
  const unsigned char *p = data;
  uint64_t v0 = key->k[0] ^ 0x736f6d6570736575ull, v1 = key->k[1] ^ 0x646f72616e646f6dull;
  uint64_t v2 = key->k[0] ^ 0x6c7967656e657261ull, v3 = key->k[1] ^ 0x7465646279746573ull;
  size_t whole = len & ~(size_t)7;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m = 0;
    for (int b = 7; b >= 0; --b)
      m = (m << 8) | p[i + (size_t)b];
    v3 ^= m;
    SIPROUND;
    v0 ^= m;
  }
  uint64_t last = (uint64_t)len << 56;
  for (size_t i = whole; i < len; ++i)
    last |= (uint64_t)p[i] << (8 * (i - whole));
  v3 ^= last;
  SIPROUND;
  v0 ^= last;
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}
