/* The standard workloads of DESIGN.md, written once with kiln ops: kiln-bench
 * times them, the examples and tests run them. */
#ifndef KILN_BENCH_WORKLOADS_H
#define KILN_BENCH_WORKLOADS_H

#include <stdbool.h>

#include <kiln/kiln.h>

enum { WORKLOAD_MAX_INPUTS = 3, WORKLOAD_MAX_WEIGHTS = 4 };

enum { WORKLOAD_MAX_GEMMS = 2 };

/* A matrix product a workload cannot do without: count times m x k by k x n. */
typedef struct {
    int64_t count, m, k, n;
} workload_gemm;

/* One workload's data at one size. */
typedef struct {
    kiln_tensor *weights[WORKLOAD_MAX_WEIGHTS]; /* captured by the body; NULL when unused */
    double bytes;  /* the least bytes a run must read and write, 0 if not memory-bound */
    workload_gemm gemms[WORKLOAD_MAX_GEMMS];    /* its products, timed alone as its compute limit */
    int n_gemms;
    char size[64]; /* the size, for people */
} workload_state;

typedef struct {
    const char *name;
    const char *what;
    int n_in;
    kiln_body body; /* user is the workload_state */
    /* Makes the inputs (new references) and the state, full or quick size;
     * 0 or -1 with kiln's error set. */
    int (*setup)(bool quick, kiln_tensor **in, workload_state *state);
} workload;

extern const workload workloads[];
extern const int workload_count;

/* The workload called name, or NULL. */
const workload *workload_find(const char *name);
/* Releases the inputs and the state's weights. */
void workload_free(const workload *w, kiln_tensor **in, workload_state *state);

#endif
