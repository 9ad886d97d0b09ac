/* kiln-bench's serve: a transformer block called with batch sizes drawn from
 * 1..64, eagerly, with fixed shapes and with dynamic shapes (serve.c). */
#ifndef KILN_BENCH_SERVE_H
#define KILN_BENCH_SERVE_H

#include <kiln/kiln.h>
#include <stdio.h>

enum { SERVE_CALLS = 200, SERVE_CALLS_QUICK = 40, SERVE_MAX_BATCH = 64, SERVE_STEADY_SIZES = 4 };

/* The batch sizes warm calls are compared at. */
extern const int64_t SERVE_STEADY[SERVE_STEADY_SIZES];

/* One mode's run; NAN or -1 where it failed. */
typedef struct {
    double total_ms, p50_ms, p99_ms; /* over the calls, compiles included */
    int64_t traces, kernels_compiled, eager_fallbacks;
    double max_abs_diff;             /* against eager, every tenth call */
} serve_mode;

typedef struct {
    char block[64];                  /* its sizes, for people */
    int calls;
    serve_mode eager, fixed, fixed_limited, dynamic; /* fixed: every size compiled; limited: the default limit */
    double steady_fixed_ms[SERVE_STEADY_SIZES], steady_dynamic_ms[SERVE_STEADY_SIZES];
} bench_serve;

/* Runs the modes in fresh processes of this program (through --probe
 * serve-<mode>): 0, or -1 when one failed. */
int serve_measure(int threads, bool quick, bench_serve *s);
/* What a --probe serve-<mode> process runs: its figures on one line. */
int serve_child(const char *mode, bool quick);
void serve_print(const bench_serve *s, FILE *out);

#endif
