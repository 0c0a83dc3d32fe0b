/* sim.c: tests of the simulated device: address-only and host-backed
 * reservations (with page reuse and gmr__sim_covers too),
 * capacity, the fault schedule, virtual ranges with page map/unmap, streams
 * and events whose completion the test controls, the clock and the spy
 * counters, and the wrappers' device-level counters. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "tap.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* Can the process read the byte at p?  (write(2) from it says EFAULT when
 * not, where a load would fault.) */
static int readable(const void *p) {
  static int fd[2] = {-1, -1};
  if (fd[0] < 0 && pipe(fd) != 0) return -1;
  char c;
  if (write(fd[1], p, 1) != 1) return errno == EFAULT ? 0 : -1;
  return read(fd[0], &c, 1) == 1;
}

int main(void) {
  gmr_backend_t *be;
  gmr_sim_options_t o = {.capacity = 1 * GiB};
  is_int(gmr__sim_backend_new(&o, &be), 0, "an address-only simulator of 1 GiB");
  gmr_sim_t *sim = gmr__sim_of(be);
  ok(sim != NULL && gmr__backend_is_sim(be), "it is a simulator");
  is_u64(be->granularity, 2 * MiB, "default granularity 2 MiB");

  void *a, *b, *c;
  is_int(gmr__backend_reserve(be, 20 * MiB, NULL, &a), 0, "reserve 20 MiB");
  is_int(gmr__backend_reserve(be, 2 * MiB, NULL, &b), 0, "reserve 2 MiB");
  ok(a != b && (uintptr_t)a % (2 * MiB) == 0, "distinct, 2 MiB-aligned addresses");
  size_t f, t;
  gmr__backend_mem_info(be, &f, &t);
  is_u64(t, 1 * GiB, "total = capacity");
  is_u64(f, 1 * GiB - 22 * MiB, "free = capacity - reserved");
  is_u64(atomic_load(&be->counters.reserved_bytes), 22 * MiB, "wrapper counts reserved bytes");
  is_u64(atomic_load(&be->counters.segments), 2, "and segments");

  is_int(gmr__backend_reserve(be, 1 * GiB, NULL, &c), GMR_ENOMEM,
         "a reservation past capacity fails");
  like(gmr__error_last(), "out of memory", "  with a message");
  is_int(gmr__backend_release(be, b, 4 * MiB, NULL), GMR_EINVAL,
         "release with the wrong size is refused");
  is_int(gmr__backend_release(be, (char *)a + 512, 20 * MiB, NULL), GMR_EINVAL,
         "release of an interior address is refused");
  is_int(gmr__backend_release(be, b, 2 * MiB, NULL), 0, "release 2 MiB");
  is_int(gmr__backend_release(be, b, 2 * MiB, NULL), GMR_EINVAL, "a second release is refused");
  is_int(gmr__backend_reserve(be, 2 * MiB, NULL, &c), 0, "reserve again");
  is_ptr(c, b, "  first fit reuses the freed range");
  gmr__backend_release(be, c, 2 * MiB, NULL);

  /* Fault schedule. */
  gmr__sim_fail_nth(sim, 2);
  ok(gmr__backend_reserve(be, 2 * MiB, NULL, &b) == 0, "fail_nth(2): the first succeeds");
  is_int(gmr__backend_reserve(be, 2 * MiB, NULL, &c), GMR_ENOMEM, "  the second fails");
  ok(gmr__backend_reserve(be, 2 * MiB, NULL, &c) == 0, "  the third succeeds");
  gmr__backend_release(be, b, 2 * MiB, NULL);
  gmr__backend_release(be, c, 2 * MiB, NULL);
  gmr__sim_fail_above(sim, 4 * MiB);
  is_int(gmr__backend_reserve(be, 6 * MiB, NULL, &b), GMR_ENOMEM,
         "fail_above(4 MiB) refuses 6 MiB");
  ok(gmr__backend_reserve(be, 4 * MiB, NULL, &b) == 0, "  and grants 4 MiB");
  gmr__backend_release(be, b, 4 * MiB, NULL);
  gmr__sim_fail_above(sim, 0);
  gmr__sim_fail_all(sim, 1);
  is_int(gmr__backend_reserve(be, 2 * MiB, NULL, &b), GMR_ENOMEM, "fail_all refuses everything");
  gmr__sim_fail_all(sim, 0);

  /* Virtual ranges and pages. */
  void *va;
  is_int(gmr__backend_va_reserve(be, 64 * GiB, &va), 0, "reserve 64 GiB of addresses");
  is_u64(atomic_load(&be->counters.reserved_bytes), 20 * MiB, "  which hold no memory");
  is_int(gmr__backend_map(be, va, 20 * MiB, NULL), 0, "map a 20 MiB page");
  is_int(gmr__backend_map(be, (char *)va + 20 * MiB, 20 * MiB, NULL), 0, "map the next page");
  is_int(gmr__backend_map(be, (char *)va + 10 * MiB, 20 * MiB, NULL), GMR_EINVAL,
         "mapping over a mapped page is refused");
  is_u64(atomic_load(&be->counters.reserved_bytes), 60 * MiB, "mapped bytes count as reserved");
  is_int(gmr__backend_va_release(be, va, 64 * GiB), GMR_EINVAL,
         "a virtual range with mapped pages cannot be released");
  is_int(gmr__backend_unmap(be, va, 40 * MiB, NULL), GMR_EINVAL, "unmap must match one map call");
  is_int(gmr__backend_unmap(be, va, 20 * MiB, NULL), 0, "unmap the first page");
  is_int(gmr__backend_unmap(be, (char *)va + 20 * MiB, 20 * MiB, NULL), 0, "unmap the second");
  is_int(gmr__backend_va_release(be, va, 64 * GiB), 0, "release the virtual range");

  /* Streams and events. */
  gmr_stream_t s1 = GMR_SIM_STREAM(1);
  gmr_event_t ev;
  is_int(gmr__backend_event_record(be, s1, &ev), 0, "an event on an idle stream");
  is_int(gmr__backend_event_query(be, ev), 0, "  is complete");
  gmr__backend_event_destroy(be, ev);
  gmr__sim_stream_enqueue(sim, s1);
  gmr__backend_event_record(be, s1, &ev);
  is_int(gmr__backend_event_query(be, ev), 1, "an event behind queued work is not ready");
  gmr__sim_stream_enqueue(sim, s1);
  is_int(gmr__backend_event_query(be, ev), 1, "  still not ready");
  gmr__sim_stream_complete(sim, s1);
  is_int(gmr__backend_event_query(be, ev), 0, "  ready once the stream completes");
  gmr__backend_event_destroy(be, ev);
  gmr__sim_stream_enqueue(sim, s1);
  gmr__backend_event_record(be, s1, &ev);
  is_int(gmr__backend_event_sync(be, ev), 0, "synchronizing on an event");
  is_int(gmr__backend_event_query(be, ev), 0, "  completes it");
  gmr__backend_event_destroy(be, ev);

  /* Clock and counters. */
  gmr__sim_set_clock(sim, 12345);
  is_u64(gmr__backend_now_ns(be), 12345, "the injected clock");
  gmr_sim_counters_t k;
  gmr__sim_counters(sim, &k);
  is_u64(k.map_calls, 3, "spy: three map calls");
  is_u64(k.unmap_calls, 3, "spy: three unmap calls");
  is_u64(k.bytes_in_use, 20 * MiB, "spy: 20 MiB in use");
  gmr__backend_release(be, a, 20 * MiB, NULL);
  gmr__backend_free(be);

  /* Host-backed: real memory behind ranges and pages. */
  gmr_sim_options_t h = {.capacity = 256 * MiB, .host_backed = 1};
  is_int(gmr__sim_backend_new(&h, &be), 0, "a host-backed simulator");
  is_int(gmr__backend_reserve(be, 2 * MiB, NULL, &a), 0, "reserve 2 MiB of host memory");
  memset(a, 0xab, 2 * MiB);
  ok(((unsigned char *)a)[2 * MiB - 1] == 0xab, "it can be written and read");
  gmr__backend_release(be, a, 2 * MiB, NULL);
  is_int(gmr__backend_va_reserve(be, 64 * MiB, &va), 0, "a host-backed virtual range");
  is_int(gmr__backend_map(be, (char *)va + 2 * MiB, 2 * MiB, NULL), 0, "map one page");
  memset((char *)va + 2 * MiB, 0x5a, 2 * MiB);
  ok(((unsigned char *)va)[4 * MiB - 1] == 0x5a, "the mapped page holds data");
  gmr__backend_unmap(be, (char *)va + 2 * MiB, 2 * MiB, NULL);
  gmr__backend_map(be, (char *)va + 2 * MiB, 2 * MiB, NULL);
  ok(((unsigned char *)va)[2 * MiB] == 0, "a page mapped again is fresh memory");
  gmr__backend_unmap(be, (char *)va + 2 * MiB, 2 * MiB, NULL);
  gmr__backend_va_release(be, va, 64 * MiB);
  gmr__backend_free(be);

  unsigned char *r1, *r2;
  /* Page reuse: reservations and virtual ranges come from a readable arena
   * whose pages stay; gmr__sim_covers says what is device memory now. */
  gmr_backend_t *ao;
  gmr__sim_backend_new(&o, &ao);
  is_int(gmr__sim_host_reuse(gmr__sim_of(ao)), GMR_EINVAL, "no page reuse without host memory");
  gmr__backend_free(ao);
  is_int(gmr__sim_backend_new(&h, &be), 0, "a host-backed simulator with page reuse");
  sim = gmr__sim_of(be);
  is_int(gmr__sim_host_reuse(sim), 0, "  turned on");
  uint64_t t1, t2, t0;
  is_int(gmr__backend_reserve(be, 4 * MiB, NULL, (void **)&r1), 0, "reserve 4 MiB");
  ok(gmr__sim_covers(sim, r1, 4 * MiB, &t1) && t1 != 0, "covered, by a reservation");
  ok(!gmr__sim_covers(sim, r1, 4 * MiB + 1, &t0), "  not a byte past it");
  r1[3 * MiB] = 0x5a;
  gmr__backend_release(be, r1, 4 * MiB, NULL);
  ok(!gmr__sim_covers(sim, r1, 1, &t0), "released: not covered");
  ok(readable(r1) == 1, "  though still readable (the caller checks with covers)");
  is_int(gmr__backend_reserve(be, 4 * MiB, NULL, (void **)&r2), 0, "reserve 4 MiB again");
  ok(r2 == r1 && r2[3 * MiB] == 0x5a, "  first fit: the same range, its pages kept");
  ok(gmr__sim_covers(sim, r2, 4 * MiB, &t2) && t2 != t1, "  another reservation's token");
  gmr__sim_host_trim(sim); /* free pages only: r2's stay */
  ok(r2[3 * MiB] == 0x5a, "trim keeps the pages of live ranges");
  gmr__backend_release(be, r2, 4 * MiB, NULL);
  gmr__sim_host_trim(sim);
  is_int(gmr__backend_reserve(be, 4 * MiB, NULL, (void **)&r1), 0, "reserve after a trim");
  ok(r1[3 * MiB] == 0, "  a trimmed page comes back zeroed");
  gmr__backend_release(be, r1, 4 * MiB, NULL);
  /* Virtual ranges and mappings in the arena. */
  is_int(gmr__backend_va_reserve(be, 64 * MiB, &va), 0, "a virtual range");
  ok(!gmr__sim_covers(sim, va, 1, &t0), "  not device memory until mapped");
  is_int(gmr__backend_map(be, va, 4 * MiB, NULL), 0, "map 4 MiB of it");
  ok(gmr__sim_covers(sim, va, 4 * MiB, &t0) && t0 == 0, "  covered, by mappings (token 0)");
  ok(!gmr__sim_covers(sim, va, 4 * MiB + 1, &t0), "  up to their end");
  ((unsigned char *)va)[MiB] = 0x33;
  gmr__backend_unmap(be, va, 4 * MiB, NULL);
  ok(!gmr__sim_covers(sim, va, 1, &t0), "unmapped: not covered");
  is_int(gmr__backend_map(be, (char *)va + 8 * MiB, 2 * MiB, NULL), 0, "map 2 MiB further on");
  ((unsigned char *)va)[9 * MiB] = 0x44;
  gmr__sim_host_trim(sim);
  ok(((unsigned char *)va)[MiB] == 0 && ((unsigned char *)va)[9 * MiB] == 0x44,
     "trim drops the unmapped pages of a virtual range, not the mapped ones");
  gmr__backend_unmap(be, (char *)va + 8 * MiB, 2 * MiB, NULL);
  /* Pages: covered once access is set; one released while mapped keeps its
   * memory behind the mapping, and no new page shares it. */
  gmr_phys_t p1, p2;
  is_int(gmr__backend_phys_create(be, 2 * MiB, &p1), 0, "a page");
  is_int(gmr__backend_phys_map(be, va, 2 * MiB, p1, 0), 0, "  mapped");
  ok(!gmr__sim_covers(sim, va, 2 * MiB, &t0), "  not covered before set_access");
  is_int(gmr__backend_set_access(be, va, 2 * MiB), 0, "  set access");
  ok(gmr__sim_covers(sim, va, 2 * MiB, &t0), "  covered");
  memset(va, 0x11, 2 * MiB);
  is_int(gmr__backend_phys_release(be, p1, 2 * MiB), 0, "released while mapped");
  is_int(gmr__backend_phys_create(be, 2 * MiB, &p2), 0, "another page");
  ok(p2 != p1, "  a new handle: the released one is still mapped");
  char *va2 = (char *)va + 4 * MiB;
  is_int(gmr__backend_phys_map(be, va2, 2 * MiB, p2, 0), 0, "  mapped elsewhere");
  is_int(gmr__backend_set_access(be, va2, 2 * MiB), 0, "  with access");
  memset(va2, 0x22, 2 * MiB);
  ok(((unsigned char *)va)[MiB] == 0x11, "the released page's memory is its own still");
  gmr__backend_phys_unmap(be, va, 2 * MiB);
  gmr__backend_phys_unmap(be, va2, 2 * MiB);
  is_int(gmr__backend_phys_release(be, p2, 2 * MiB), 0, "release the other, unmapped");
  is_int(gmr__backend_phys_create(be, 2 * MiB, &p1), 0, "a page again (pooled memory)");
  is_int(gmr__backend_phys_map(be, va, 2 * MiB, p1, 0), 0, "  mapped");
  is_int(gmr__backend_set_access(be, va, 2 * MiB), 0, "  with access");
  ok(((unsigned char *)va)[MiB] == 0x22,
     "  the pooled page's bytes (like cuMemCreate's, whatever was there)");
  gmr__backend_phys_unmap(be, va, 2 * MiB);
  gmr__backend_phys_release(be, p1, 2 * MiB);
  gmr__backend_va_release(be, va, 64 * MiB);
  gmr_sim_counters_t kk;
  gmr__sim_counters(sim, &kk);
  is_u64(kk.bytes_in_use, 0, "everything given back");
  gmr__backend_free(be);

  gmr_sim_options_t g = {.granularity = 3000};
  is_int(gmr__sim_backend_new(&g, &be), GMR_EINVAL, "a bad granularity is refused");
  return done_testing();
}
