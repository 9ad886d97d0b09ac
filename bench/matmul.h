/* kiln-bench's CPU matmul family: kiln's GEMM against OpenBLAS as found and
 * with its best core type forced, over the shapes real workloads use. */
#ifndef KILN_BENCH_MATMUL_H
#define KILN_BENCH_MATMUL_H

#include <stdbool.h>
#include <stdio.h>

#include "report.h"

/* Times every shape of the family on threads threads (reps runs each after
 * warm-ups; quick: small shapes), prints the table to out and keeps the
 * figures in results. self is this program's path, run again as a fresh
 * process for the forced core. -1 when a product failed. */
int matmul_family_run(const char *self, int threads, int reps, bool quick, FILE *out, bench_matmul *results);
/* kiln-bench --probe matmul-openblas INDEX: the fresh process timing shape
 * INDEX of the family with OpenBLAS alone; prints its GFLOP/s and the core
 * OpenBLAS chose. */
int matmul_family_child(int index, int reps, bool quick);

#endif
