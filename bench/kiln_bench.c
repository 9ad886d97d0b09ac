/* kiln-bench: the standard workloads, eager and traced, against this
 * machine's limits (a copy-bandwidth probe and an OpenBLAS sgemm measured in
 * the same run) and, with --compare, against peers (bench/peers.py).
 *
 * A workload's limit is the larger of its memory floor (the bytes it must move
 * over the copy bandwidth) and its compute floor (its matrix products timed
 * alone with cblas_sgemm). Eager runs, traced runs and the products alone
 * are timed in turn, rep by rep, so that their ratios hold on a noisy machine.
 *
 * --device cuda: the workloads' inputs and weights move to the GPU after
 * setup, at GPU sizes, and matmul 8192^3 joins them. The copy probe is a
 * device-to-device kiln_assign, the compute floor the products alone as
 * kiln_matmul on CUDA; products are also read as TFLOP/s against the H200's
 * FP32 peak. Peak memory comes from kiln's CUDA allocator, whose high-water
 * mark has no reset: it is read in a fresh process (a traced call, then an
 * eager run, above the inputs). Freed device blocks are all kept for reuse
 * (KILN_CUDA_CACHE_MAX_BYTES, unless set, 64 GiB), as PyTorch's allocator
 * keeps them, so eager runs do not time cuMemAlloc and cuMemFree.
 *
 * Timing: a monotonic clock around the call only, 2 warm-ups, medians of
 * --reps runs of each. Each timed run includes releasing what it made, eager
 * and traced alike, and on CUDA waiting for the device
 * (kiln_cuda_synchronize).
 * The JSON schema is docs/bench-json.md. */
#include <kiln/kiln.h>

#include <cblas.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "matmul.h"
#include "report.h"
#include "timing.h"
#include "workloads.h"

enum { WARMUPS = 2, MAX_REPS = 1000, TINY_BATCH = 1000 };

/* What CUDA TFLOP/s are read against: the NVIDIA H200's FP32 peak without
 * tensor cores (the H100 SXM's is the same). */
#define H200_FP32_TFLOPS 67.0
#define CUDA_CACHE_BYTES "68719476736" /* 64 GiB */

static const char usage[] =
    "usage: kiln-bench [--workload NAME] [--device cpu|cuda] [--threads N] [--quick]\n"
    "                  [--reps N] [--compiles N] [--json FILE] [--svg FILE] [--compare PEERS.json]\n"
    "  --workload NAME  one of gelu softmax layernorm mlp attention tiny mish rmsnorm silu\n"
    "                   softmax_row resnet50 resnet50_b16 gpt train_mlp train_gpt train_cnn matmul\n"
    "                   serve (default: all but matmul, and serve; on cuda matmul too, not\n"
    "                   serve); on the CPU matmul is its own family: kiln's GEMM\n"
    "                   (KILN_MATMUL=kiln) against OpenBLAS as found and with its best core\n"
    "                   type forced (--json: its \"matmul\" section, no workloads, no probes)\n"
    "  --device D       cpu (default), or cuda: inputs on the GPU, GPU sizes (exits 2 without one)\n"
    "  --threads N      kiln's and OpenBLAS's threads (default: the number of cores)\n"
    "  --quick          small sizes, for CI: finishes in seconds\n"
    "  --reps N         timed runs per measurement after 2 warm-ups (default 10, quick 3)\n"
    "  --compiles N     times each compile figure is measured: first calls, and fresh processes\n"
    "                   for compile and the disk cache (default: reps, at most 3); 0 skips\n"
    "                   the fresh processes and times one first call\n"
    "  --json FILE      the results in the schema of docs/bench-json.md\n"
    "  --svg FILE       a bar chart: eager, traced and the machine's limit per workload\n"
    "  --compare FILE   adds the runs of FILE (bench/peers.py --json) as columns\n";

typedef struct {
    const char *workload, *json, *svg, *compare;
    const char *probe, *probe_workload; /* internal: a disk-hit probe's fresh process */
    int threads, reps, compiles;
    bool quick;
    workload_size size;
} options;

/* --device: where the inputs live; on CUDA every timed run waits for the GPU. */
static kiln_device device = KILN_CPU;

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln-bench: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static _Noreturn void die(const char *what)
{
    fprintf(stderr, "kiln-bench: %s: %s\n", what, kiln_last_error());
    exit(1);
}

/* -- Timing ---------------------------------------------------------------- */

/* Waits for the GPU's queued work, on CUDA; a kernel's failure ends the run. */
static void wait_for_device(const char *what)
{
    if (device == KILN_CUDA && kiln_cuda_synchronize() < 0)
        die(what);
}

/* One run of a workload: eagerly (f NULL) or through f, outputs released, its
 * GPU work done. */
static void run_once(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state)
{
    kiln_scope_begin();
    kiln_tensor *out = NULL;
    int status = f ? kiln_call(f, in, &out) : w->body(in, &out, state);
    kiln_scope_end();
    if (status != 0)
        die(w->name);
    wait_for_device(w->name);
}

/* w's inputs and state at the size opt asks for, on its device. */
static void set_up(const workload *w, workload_size size, kiln_tensor **in, workload_state *state)
{
    if (w->setup(size, in, state) < 0 || workload_to_device(w, in, state, device) < 0)
        die(w->name);
}

/* Milliseconds of one run; tiny runs in a batch, the time per run. */
static double time_run(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state)
{
    int batch = strcmp(w->name, "tiny") ? 1 : TINY_BATCH;
    double start = now_ms();
    for (int i = 0; i < batch; i++)
        run_once(w, f, in, state);
    return (now_ms() - start) / batch;
}

/* -- This machine's limits ------------------------------------------------- */

typedef struct {
    float *src, *dst;
    size_t n;
    bool streaming;
} copy_part;

/* Non-temporal stores skip reading the destination into the cache first,
 * as compiled kernels that stream do: without them the probe would be a
 * floor those kernels can beat. */
static void stream_copy(float *dst, const float *src, size_t n)
{
#if defined(__SSE__)
    size_t i = 0;
    for (; i < n && (uintptr_t)(dst + i) % 16; i++)
        dst[i] = src[i];
    for (; i + 4 <= n; i += 4)
        _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    _mm_sfence();
    for (; i < n; i++)
        dst[i] = src[i];
#else
    memcpy(dst, src, n * sizeof *src);
#endif
}

static void *copy_part_run(void *p)
{
    copy_part *c = p;
    if (c->streaming)
        stream_copy(c->dst, c->src, c->n);
    else
        memcpy(c->dst, c->src, c->n * sizeof *c->src);
    return NULL;
}

/* Milliseconds of one copy of n floats from src to dst, split over threads. */
static double time_copy(float *dst, float *src, size_t n, int threads, bool streaming)
{
    pthread_t ids[64];
    copy_part parts[64];
    int t_count = threads < 64 ? threads : 64;
    double start = now_ms();
    for (int t = 0; t < t_count; t++) {
        size_t lo = n * (size_t)t / (size_t)t_count, hi = n * (size_t)(t + 1) / (size_t)t_count;
        parts[t] = (copy_part){src + lo, dst + lo, hi - lo, streaming};
        pthread_create(&ids[t], NULL, copy_part_run, &parts[t]);
    }
    for (int t = 0; t < t_count; t++)
        pthread_join(ids[t], NULL);
    return now_ms() - start;
}

/* A STREAM-like copy on every thread, with memcpy and with non-temporal
 * stores: the faster's bytes read plus written per second. */
static double probe_copy_gbps(bool quick, int threads, int reps)
{
    size_t n = quick ? (size_t)1 << 22 : (size_t)1 << 25;
    float *src = aligned_alloc(64, n * sizeof *src), *dst = aligned_alloc(64, n * sizeof *dst);
    if (!src || !dst) {
        fprintf(stderr, "kiln-bench: out of memory for the copy probe\n");
        exit(1);
    }
    memset(src, 1, n * sizeof *src);
    memset(dst, 0, n * sizeof *dst);
    double samples[2][MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++)
        for (int streaming = 0; streaming < 2; streaming++) {
            double ms = time_copy(dst, src, n, threads, streaming);
            if (r >= 0)
                samples[streaming][r] = ms;
        }
    free(src);
    free(dst);
    double fastest = fmin(median(samples[0], reps), median(samples[1], reps));
    return 2.0 * (double)(n * sizeof(float)) / (fastest * 1e6);
}

static double probe_sgemm_gflops(bool quick, int reps)
{
    int n = quick ? 256 : 2048;
    float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
          *c = malloc((size_t)n * n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "kiln-bench: out of memory for the sgemm probe\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)n * n; i++)
        a[i] = b[i] = (float)(i % 7) * 0.25f;
    double samples[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double start = now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        if (r >= 0)
            samples[r] = now_ms() - start;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * (double)n * n / (median(samples, reps) * 1e6);
}

/* -- The GPU's limits ------------------------------------------------------- */

/* host on CUDA, host released: a new reference. */
static kiln_tensor *to_cuda(kiln_tensor *host)
{
    kiln_tensor *t = kiln_to_device(host, KILN_CUDA);
    kiln_release(host);
    if (!t)
        die("CUDA probe");
    return t;
}

/* A new f32 CUDA tensor of normal values: the products' operands, so that the
 * device does the same work as on the workloads' data. */
static kiln_tensor *cuda_normal(int ndim, const int64_t *shape)
{
    return to_cuda(kiln_randn(ndim, shape, 99));
}

/* A device-to-device copy, kiln_assign of one f32 CUDA tensor into another:
 * bytes read plus written per second, in GB. */
static double probe_cuda_copy_gbps(bool quick, int reps)
{
    int64_t n = quick ? INT64_C(1) << 22 : INT64_C(1) << 28;
    kiln_tensor *src = to_cuda(kiln_ones(KILN_F32, 1, &n)), *dst = to_cuda(kiln_zeros(KILN_F32, 1, &n));
    double samples[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double start = now_ms();
        if (kiln_assign(dst, src) < 0)
            die("copy probe");
        wait_for_device("copy probe");
        if (r >= 0)
            samples[r] = now_ms() - start;
    }
    kiln_release(src);
    kiln_release(dst);
    return 2.0 * 4.0 * (double)n / (median(samples, reps) * 1e6);
}

/* -- Products alone -------------------------------------------------------- */

/* A workload's matrix products alone, on operands made once: its compute
 * floor. On the CPU cblas_sgemm; on CUDA kiln_matmul (a product of count > 1
 * as one batched product, as the workloads do). */
typedef struct {
    const workload_gemm *gemms;
    int n;
    float *host[WORKLOAD_MAX_GEMMS][3];
    kiln_tensor *a[WORKLOAD_MAX_GEMMS], *b[WORKLOAD_MAX_GEMMS];
} gemm_reference;

static void reference_make(gemm_reference *r, const workload_gemm *gemms, int n)
{
    *r = (gemm_reference){.gemms = gemms, .n = n};
    for (int g = 0; g < n; g++) {
        const workload_gemm *p = &gemms[g];
        if (device == KILN_CUDA) {
            int64_t a_shape[3] = {p->count, p->m, p->k}, b_shape[3] = {p->count, p->k, p->n};
            int single = p->count == 1; /* then [m,k] @ [k,n], without the batch axis */
            r->a[g] = cuda_normal(3 - single, a_shape + single);
            r->b[g] = cuda_normal(3 - single, b_shape + single);
            continue;
        }
        size_t sizes[3] = {(size_t)(p->m * p->k), (size_t)(p->k * p->n), (size_t)(p->m * p->n)};
        for (int i = 0; i < 3; i++) {
            r->host[g][i] = malloc(sizes[i] * sizeof(float));
            if (!r->host[g][i]) {
                fprintf(stderr, "kiln-bench: out of memory for the sgemm reference\n");
                exit(1);
            }
            /* Values in every page: untouched pages all map the one zero
             * page, which would read from cache. */
            for (size_t e = 0; e < sizes[i]; e++)
                r->host[g][i][e] = (float)(e % 17) * 0.125f - 1.0f;
        }
    }
}

static void reference_run(const gemm_reference *r)
{
    if (device == KILN_CUDA) {
        kiln_scope_begin();
        for (int g = 0; g < r->n; g++)
            if (!kiln_matmul(r->a[g], r->b[g]))
                die("kiln_matmul reference");
        kiln_scope_end();
        wait_for_device("kiln_matmul reference");
        return;
    }
    for (int g = 0; g < r->n; g++) {
        const workload_gemm *p = &r->gemms[g];
        float *const *buf = r->host[g];
        for (int64_t c = 0; c < p->count; c++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)p->m, (int)p->n, (int)p->k, 1, buf[0],
                        (int)p->k, buf[1], (int)p->n, 0, buf[2], (int)p->n);
    }
}

static void reference_free(gemm_reference *r)
{
    for (int g = 0; g < r->n; g++) {
        kiln_release(r->a[g]);
        kiln_release(r->b[g]);
        for (int i = 0; i < 3; i++)
            free(r->host[g][i]);
    }
}

/* Median milliseconds of the products alone. */
static double time_reference(const gemm_reference *r, int reps)
{
    double samples[MAX_REPS];
    for (int i = -WARMUPS; i < reps; i++) {
        double start = now_ms();
        reference_run(r);
        if (i >= 0)
            samples[i] = now_ms() - start;
    }
    return median(samples, reps);
}

/* Median milliseconds of an eager run, a run through f and the products
 * alone (when r has any), timed in turn: their ratios are then not the drift
 * of this shared machine's load between separate measurements. */
static void time_in_turn(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state,
                         const gemm_reference *r, int reps, bench_result *res, double *reference_ms)
{
    double eager[MAX_REPS], traced[MAX_REPS], alone[MAX_REPS];
    for (int i = -WARMUPS; i < reps; i++) {
        double e = time_run(w, NULL, in, state), t = time_run(w, f, in, state), start = now_ms();
        if (r->n)
            reference_run(r);
        if (i >= 0) {
            eager[i] = e;
            traced[i] = t;
            alone[i] = now_ms() - start;
        }
    }
    res->eager_ms = median(eager, reps);
    res->traced_ms = median(traced, reps);
    *reference_ms = r->n ? median(alone, reps) : 0;
}

/* kiln_matmul of two f32 CUDA matrices, 4096^3 (quick 256^3), in GFLOP/s. */
static double probe_cuda_matmul_gflops(bool quick, int reps)
{
    int64_t n = quick ? 256 : 4096;
    workload_gemm square = {1, n, n, n};
    gemm_reference r;
    reference_make(&r, &square, 1);
    double ms = time_reference(&r, reps);
    reference_free(&r);
    return 2.0 * (double)(n * n * n) / (ms * 1e6);
}

/* -- One workload ---------------------------------------------------------- */

/* The largest |a - b| over two tensors of one shape. */
static double max_abs_diff(kiln_tensor *a, kiln_tensor *b)
{
    kiln_scope_begin();
    double d = kiln_item(kiln_max(kiln_abs(kiln_sub(kiln_cast(a, KILN_F64), kiln_cast(b, KILN_F64))),
                                  KILN_ALL, false));
    kiln_scope_end();
    return d;
}

/* Bytes above what was live, at the high-water mark of one run. */
static int64_t peak_of_run(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state)
{
    int64_t base = kiln_live_bytes();
    kiln_reset_peak_live_bytes();
    run_once(w, f, in, state);
    return kiln_peak_live_bytes() - base;
}

/* Marks w's body. The timed functions leave the disk cache alone: the
 * disk-hit column has a cache of its own. */
static kiln_fn *mark(const workload *w, workload_state *state)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.no_cache = true;
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, state, &o);
    if (!f)
        die(w->name);
    return f;
}

/* A fresh marked function's first call: trace, compile and run. No other
 * function of w may be alive, or its kernels would be shared, not compiled. */
static double time_first_call(const workload *w, kiln_tensor **in, workload_state *state, int compiles)
{
    double samples[MAX_REPS];
    int n = compiles > 1 ? compiles : 1;
    for (int r = 0; r < n; r++) {
        kiln_fn *f = mark(w, state);
        double start = now_ms();
        run_once(w, f, in, state);
        samples[r] = now_ms() - start;
        kiln_fn_free(f);
    }
    return median(samples, n);
}

/* Milliseconds kiln_fn_precompile takes to make f ready for in's signature
 * on the host: trace, passes, and compile or load, without running. */
static double time_prepare(kiln_fn *f, const workload *w, kiln_tensor **in)
{
    kiln_spec specs[WORKLOAD_MAX_INPUTS];
    for (int i = 0; i < w->n_in; i++)
        specs[i] = kiln_spec_of(in[i]);
    double start = now_ms();
    if (kiln_fn_precompile(f, specs, "host") != 0)
        die(w->name);
    return now_ms() - start;
}

/* -- Fresh processes: cold compiles and disk hits ------------------------- */

/* The CUDA allocator's bytes in use and their high-water mark. */
static kiln_cuda_memory cuda_memory(void)
{
    kiln_cuda_memory m;
    if (kiln_cuda_memory_stats(&m) < 0)
        die("kiln_cuda_memory_stats");
    return m;
}

/* kiln-bench --probe first-call|prepare|peak NAME, run as a fresh process,
 * prints two numbers: the milliseconds of w's first call (or of preparing it)
 * with the disk cache on, and the kernels that compiled, which must be none
 * for a disk hit; or, for peak (CUDA), the device bytes at the high-water
 * mark of a traced call above the inputs, then of an eager run above what
 * was live before it (-1 when it stays under the traced call's mark, which,
 * never reset, then hides it). */
static int probe(const char *what, const workload *w, workload_size size)
{
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    set_up(w, size, in, &state);
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, NULL);
    if (!f)
        die(w->name);
    if (!strcmp(what, "peak")) {
        kiln_cuda_memory before = cuda_memory();
        run_once(w, f, in, &state);
        kiln_cuda_memory traced = cuda_memory();
        run_once(w, NULL, in, &state);
        kiln_cuda_memory eager = cuda_memory();
        bool seen = traced.peak_in_use_bytes > before.peak_in_use_bytes;
        printf("%lld %lld\n", seen ? (long long)(traced.peak_in_use_bytes - before.in_use_bytes) : -1LL,
               eager.peak_in_use_bytes > traced.peak_in_use_bytes
                   ? (long long)(eager.peak_in_use_bytes - traced.in_use_bytes) : -1LL);
    } else {
        double ms;
        if (!strcmp(what, "prepare")) {
            ms = time_prepare(f, w, in);
        } else {
            double start = now_ms();
            run_once(w, f, in, &state);
            ms = now_ms() - start;
        }
        kiln_fn_stats_t s;
        kiln_fn_stats(f, &s);
        printf("%.6f %lld\n", ms, (long long)s.kernels_compiled);
    }
    kiln_fn_free(f);
    workload_free(w, in, &state);
    return 0;
}

/* This program run as a fresh process probing w over cache_root with
 * KILN_CACHE=mode, its two numbers in v; -1 when it failed. */
static int spawn_probe(const char *what, const char *mode, const workload *w, const options *opt,
                       const char *cache_root, double v[2])
{
    char self[1024], cmd[2400];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return -1;
    self[len] = '\0';
    snprintf(cmd, sizeof cmd, "KILN_CACHE=%s KILN_CACHE_DIR='%s' '%s' --threads %d --device %s --probe %s %s%s",
             mode, cache_root, self, opt->threads, device == KILN_CUDA ? "cuda" : "cpu", what, w->name,
             opt->quick ? " --quick" : "");
    FILE *p = popen(cmd, "r");
    int read = p ? fscanf(p, "%lf %lf", &v[0], &v[1]) : 0;
    int status = p ? pclose(p) : -1;
    return read == 2 && status == 0 ? 0 : -1;
}

/* Medians over --compiles fresh processes each, so that each pays for
 * starting LLVM (or NVRTC): of preparing w with the disk cache off (the cold
 * compile), and, in processes that find every kernel on disk, of the first
 * call and of preparing. A first call fills their cache, so that it holds
 * what running needs besides the plan's kernels (CUDA's eager kernels). NAN
 * where a process failed, or compiled when it should have loaded. On CUDA,
 * one more process reads the peak device memory of a traced call and an
 * eager run. */
static void time_fresh_processes(const workload *w, const options *opt, bench_result *res)
{
    res->compile_ms = res->disk_hit_ms = res->disk_load_ms = NAN;
    char root[] = "/tmp/kiln-bench-cache-XXXXXX", cmd[64];
    int n = opt->compiles;
    if (n == 0 || !mkdtemp(root))
        return;
    double v[2], compiles[MAX_REPS], calls[MAX_REPS], prepares[MAX_REPS];
    bool cold = true, hits = true;
    for (int r = 0; cold && r < n; r++) {
        cold = spawn_probe("prepare", "off", w, opt, root, v) == 0;
        compiles[r] = v[0];
    }
    hits = spawn_probe("first-call", "on", w, opt, root, v) == 0;
    for (int r = 0; hits && r < n; r++) {
        hits = spawn_probe("first-call", "on", w, opt, root, v) == 0 && v[1] == 0;
        calls[r] = v[0];
        hits = hits && spawn_probe("prepare", "on", w, opt, root, v) == 0 && v[1] == 0;
        prepares[r] = v[0];
    }
    if (device == KILN_CUDA && spawn_probe("peak", "on", w, opt, root, v) == 0) {
        res->peak_traced_bytes = (int64_t)v[0];
        res->peak_eager_bytes = (int64_t)v[1];
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        progress("could not remove %s", root);
    if (cold)
        res->compile_ms = median(compiles, n);
    if (hits) {
        res->disk_hit_ms = median(calls, n);
        res->disk_load_ms = median(prepares, n);
    }
}

/* The FLOPs of state's matrix products, in billions. */
static double gemm_gflop(const workload_state *state)
{
    double flop = 0;
    for (int g = 0; g < state->n_gemms; g++) {
        const workload_gemm *p = &state->gemms[g];
        flop += 2.0 * (double)p->count * (double)p->m * (double)p->k * (double)p->n;
    }
    return flop / 1e9;
}

static void measure(const workload *w, const options *opt, const bench_probes *probes, bench_result *res)
{
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    progress("%s: setting up", w->name);
    set_up(w, opt->size, in, &state);
    snprintf(res->name, sizeof res->name, "%s", w->name);
    snprintf(res->size, sizeof res->size, "%s", state.size);
    res->reps = opt->reps;
    res->gemm_gflop = state.n_gemms ? gemm_gflop(&state) : NAN;
    res->peak_eager_bytes = res->peak_traced_bytes = -1;

    progress("%s %s: first calls", w->name, state.size);
    res->first_call_ms = time_first_call(w, in, &state, opt->compiles);
    time_fresh_processes(w, opt, res);
    progress("%s %s: eager, traced and the products alone, in turn", w->name, state.size);
    kiln_fn *f = mark(w, &state);
    gemm_reference reference;
    reference_make(&reference, state.gemms, state.n_gemms);
    double compute_ms;
    time_in_turn(w, f, in, &state, &reference, opt->reps, res, &compute_ms);
    reference_free(&reference);
    kiln_fn_stats_t stats;
    kiln_fn_stats(f, &stats);
    res->kernels = stats.kernels;
    res->backend = kiln_fn_backend(f);
    if (device == KILN_CPU) {
        res->peak_eager_bytes = peak_of_run(w, NULL, in, &state);
        res->peak_traced_bytes = peak_of_run(w, f, in, &state);
    }

    kiln_scope_begin();
    kiln_tensor *eager = NULL, *traced = NULL, *saved[WORKLOAD_MAX_SAVED];
    int n_saved = workload_save(&state, saved); /* a training step: both from the same weights */
    if (n_saved < 0 || w->body(in, &eager, &state) != 0 || workload_restore(&state, saved, n_saved) < 0 ||
        kiln_call(f, in, &traced) != 0)
        die(w->name);
    res->max_abs_diff = max_abs_diff(traced, eager);
    kiln_scope_end();

    double memory_ms = state.bytes / (probes->copy_gbps * 1e6);
    res->gemms_ms = state.n_gemms ? compute_ms : NAN;
    res->limit_ms = memory_ms > compute_ms ? memory_ms : compute_ms;
    res->limit_kind = state.bytes == 0 && state.n_gemms == 0 ? NULL
                    : memory_ms > compute_ms ? "memory" : "compute";
    if (!res->limit_kind)
        res->limit_ms = NAN;
    kiln_fn_free(f);
    workload_free(w, in, &state);
}

/* -- Command line ---------------------------------------------------------- */

static int parse_args(int argc, char **argv, options *opt)
{
    *opt = (options){.threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .compiles = -1};
    int reps = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = strcmp(a, "--quick") && strcmp(a, "--help");
        if (takes && !next) {
            fprintf(stderr, "kiln-bench: %s needs a value\n%s", a, usage);
            return -1;
        }
        if (!strcmp(a, "--quick"))
            opt->quick = true;
        else if (!strcmp(a, "--help"))
            return fputs(usage, stdout), 1;
        else if (!strcmp(a, "--workload"))
            opt->workload = next;
        else if (!strcmp(a, "--device") && !strcmp(next, "cpu"))
            device = KILN_CPU;
        else if (!strcmp(a, "--device") && !strcmp(next, "cuda"))
            device = KILN_CUDA;
        else if (!strcmp(a, "--device"))
            return fprintf(stderr, "kiln-bench: --device %s: cpu or cuda\n%s", next, usage), -1;
        else if (!strcmp(a, "--threads"))
            opt->threads = atoi(next);
        else if (!strcmp(a, "--reps"))
            reps = atoi(next);
        else if (!strcmp(a, "--compiles"))
            opt->compiles = atoi(next);
        else if (!strcmp(a, "--json"))
            opt->json = next;
        else if (!strcmp(a, "--svg"))
            opt->svg = next;
        else if (!strcmp(a, "--compare"))
            opt->compare = next;
        else if (!strcmp(a, "--probe") && i + 2 < argc) {
            opt->probe = next;
            opt->probe_workload = argv[++i + 1];
        }
        else
            return fprintf(stderr, "kiln-bench: unknown option %s\n%s", a, usage), -1;
        i += takes;
    }
    opt->reps = reps > 0 ? reps : opt->quick ? 3 : 10;
    opt->compiles = opt->compiles >= 0 ? opt->compiles : opt->reps < 3 ? opt->reps : 3;
    opt->size = opt->quick ? WORKLOAD_QUICK : device == KILN_CUDA ? WORKLOAD_GPU : WORKLOAD_FULL;
    if (opt->threads < 1 || opt->reps > MAX_REPS || opt->compiles > MAX_REPS)
        return fprintf(stderr, "kiln-bench: --threads must be at least 1, --reps and --compiles at most %d\n",
                       MAX_REPS), -1;
    const char *name = opt->probe ? opt->probe_workload : opt->workload;
    if (name && strcmp(name, "serve") && !workload_find(name))
        return fprintf(stderr, "kiln-bench: no workload %s\n%s", name, usage), -1;
    return 0;
}

/* The CPU's matmul family (bench/matmul.c), kiln's column on kiln's GEMM. */
static int matmul_family(const options *opt)
{
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = '\0';
    setenv("KILN_MATMUL", "kiln", 1); /* before the first product decides the engine */
    bench_run run = {.threads = opt->threads, .quick = opt->quick, .peak_tflops = NAN,
                     .probes = {NAN, NAN}, .has_matmul = true};
    bench_describe_machine(&run);
    snprintf(run.device, sizeof run.device, "cpu");
    snprintf(run.backend, sizeof run.backend, "llvm");
    if (matmul_family_run(self, opt->threads, opt->reps, opt->quick, stdout, &run.matmul) < 0)
        return 1;
    return opt->json && bench_write_json(&run, opt->json) < 0;
}

int main(int argc, char **argv)
{
    options opt;
    int parsed = parse_args(argc, argv, &opt);
    if (parsed != 0)
        return parsed < 0 ? 2 : 0;
    char threads[16];
    snprintf(threads, sizeof threads, "%d", opt.threads);
    setenv("KILN_THREADS", threads, 1); /* before kiln's pool starts */
    openblas_set_num_threads(opt.threads);
    if (device == KILN_CUDA) {
        setenv("KILN_CUDA_CACHE_MAX_BYTES", CUDA_CACHE_BYTES, 0); /* before the allocator reads it */
        if (!kiln_cuda_available()) {
            fprintf(stderr, "kiln-bench: --device cuda: %s\n", kiln_last_error());
            return 2;
        }
    }
    if (opt.probe && !strncmp(opt.probe, "serve-", 6))
        return serve_child(opt.probe + 6, opt.quick);
    if (opt.probe && !strncmp(opt.probe, "matmul-openblas-", 16))
        return matmul_family_child(atoi(opt.probe + 16), opt.reps, opt.quick);
    if (opt.probe)
        return probe(opt.probe, workload_find(opt.probe_workload), opt.size);
    if (device == KILN_CPU && opt.workload && !strcmp(opt.workload, "matmul"))
        return matmul_family(&opt);

    bench_run run = {.threads = opt.threads, .quick = opt.quick, .peak_tflops = NAN};
    bench_describe_machine(&run);
    if (device == KILN_CUDA) {
        const char *name = kiln_cuda_device_name();
        snprintf(run.device, sizeof run.device, "cuda");
        snprintf(run.gpu, sizeof run.gpu, "%s", name ? name : "CUDA device 0");
        run.peak_tflops = H200_FP32_TFLOPS;
        progress("probing %s: device-to-device copy and kiln_matmul", run.gpu);
        run.probes.copy_gbps = probe_cuda_copy_gbps(opt.quick, opt.reps);
        run.probes.sgemm_gflops = probe_cuda_matmul_gflops(opt.quick, opt.reps);
    } else {
        snprintf(run.device, sizeof run.device, "cpu");
        progress("probing this machine: copy bandwidth and sgemm");
        run.probes.copy_gbps = probe_copy_gbps(opt.quick, opt.threads, opt.reps);
        run.probes.sgemm_gflops = probe_sgemm_gflops(opt.quick, opt.reps);
    }
    for (int i = 0; i < workload_count + workload_training_count + 1; i++) {
        const workload *w = i < workload_count                            ? &workloads[i]
                            : i < workload_count + workload_training_count ? &workload_trainings[i - workload_count]
                                                                          : &workload_matmul;
        bool wanted = opt.workload ? !strcmp(opt.workload, w->name) : w != &workload_matmul || device == KILN_CUDA;
        if (wanted)
            measure(w, &opt, &run.probes, &run.results[run.count++]);
    }
    bool serve = device == KILN_CPU && (!opt.workload || !strcmp(opt.workload, "serve"));
    if (serve && serve_measure(opt.threads, opt.quick, &run.serve) < 0)
        die("serve");
    run.has_serve = serve;
    snprintf(run.backend, sizeof run.backend, "%s", run.count && run.results[0].backend ? run.results[0].backend : "?");
    bench_print_table(&run, stdout);
    if (serve)
        serve_print(&run.serve, stdout);
    if (opt.compare && bench_print_comparison(&run, opt.compare, stdout) < 0)
        return 1;
    if (opt.json && bench_write_json(&run, opt.json) < 0)
        return 1;
    if (opt.svg && bench_write_svg(&run, opt.svg) < 0)
        return 1;
    return 0;
}
