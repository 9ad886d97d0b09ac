/* kiln-bench's results and their forms: the table, JSON, the SVG chart, and
 * the comparison with peers' JSON. */
#ifndef KILN_BENCH_REPORT_H
#define KILN_BENCH_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "serve.h"

enum { BENCH_MAX_RESULTS = 24 };

typedef struct {
    double copy_gbps;    /* bytes read plus written per second, in GB (on CUDA device to device) */
    double sgemm_gflops; /* OpenBLAS sgemm; on CUDA kiln_matmul of f32 CUDA tensors */
} bench_probes;

/* One workload's figures; NAN (or -1 for counts) where not measured. */
typedef struct {
    char name[32], size[64];
    double eager_ms, traced_ms, first_call_ms, disk_hit_ms;
    double compile_ms, disk_load_ms; /* preparing without running, in fresh processes: cold, and from disk */
    int kernels;
    int64_t peak_eager_bytes, peak_traced_bytes; /* -1 where not measured */
    double max_abs_diff;
    double limit_ms;
    const char *limit_kind; /* "memory", "compute" or NULL */
    const char *backend;    /* kiln_fn_backend of the traced side */
    double gemm_gflop;      /* the FLOPs of its matrix products, in billions; NAN if none */
    double gemms_ms;        /* its matrix products done alone (the compute limit); NAN if none */
    int reps;
} bench_result;

enum { BENCH_MAX_MATMUL = 16 };

/* One shape of the CPU's matmul family (bench/matmul.c), in GFLOP/s; NAN
 * where not measured. */
typedef struct {
    char name[32];
    int64_t batch, m, k, n;
    double kiln_gflops, openblas_gflops, forced_gflops;
} bench_matmul_shape;

typedef struct {
    char openblas_core[32]; /* the core OpenBLAS chose */
    char forced_core[32];   /* the best core, forced in fresh processes; "" when not forced */
    bench_matmul_shape shapes[BENCH_MAX_MATMUL];
    int count;
} bench_matmul;

typedef struct {
    char cpu[128];
    char device[8];   /* where the workloads ran: "cpu" or "cuda" */
    char gpu[128];    /* the CUDA device's name, or "" */
    double peak_tflops; /* the FP32 peak CUDA figures are read against; NAN on the CPU */
    char backend[16]; /* what ran the traced side: "llvm", "nvrtc" or "interp" */
    int cores, threads;
    bool quick;
    bench_probes probes;
    bench_result results[BENCH_MAX_RESULTS];
    int count;
    bool has_serve;   /* serve ran: its figures are in serve */
    bench_serve serve;
    bool has_matmul;  /* the CPU's matmul family ran: its figures are in matmul */
    bench_matmul matmul;
} bench_run;

/* Fills in the CPU's name and core count; the device is the caller's. */
void bench_describe_machine(bench_run *run);
void bench_print_table(const bench_run *run, FILE *out);
/* v in fmt into buf, or "-" when not measured (NAN); buf. */
const char *bench_number(char *buf, size_t size, double v, const char *fmt);
/* Reads peers' JSON and prints their figures beside kiln's; -1 on a bad file. */
int bench_print_comparison(const bench_run *run, const char *path, FILE *out);
int bench_write_json(const bench_run *run, const char *path);
int bench_write_svg(const bench_run *run, const char *path);

#endif
