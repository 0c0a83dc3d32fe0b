/* bench-calls.h: gmr-bench's driver-call workload (bench-calls.c), which
 * times each call the CUDA backend makes, for gmr-compare's cost model. */
#ifndef GMR_BENCH_CALLS_H
#define GMR_BENCH_CALLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct bench_calls_args_s {
  bool cuda;           /* --device cuda; otherwise the workload is skipped */
  bool json;           /* JSON on stdout instead of the table */
  FILE *json_file;     /* --json-file, or NULL */
  int reps;            /* repetitions, the median reported */
  const size_t *pages; /* sizes, in pages (--call-pages) */
  int n_pages;
  bool *first; /* no JSON record printed yet (updated) */
} bench_calls_args_t;

/* 0 (measured, or skipped with the reason printed: no CUDA build, no
 * --device cuda, no device), or 1 when a call failed (said on stderr). */
int bench_calls(const bench_calls_args_t *a);

#endif /* GMR_BENCH_CALLS_H */
