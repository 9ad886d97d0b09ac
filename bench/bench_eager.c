/* kiln-bench-eager: eager-mode speed check (dispatch, GELU, matmul vs. sgemm, transcendentals), as medians. */
#include <kiln/kiln.h>

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define WARMUPS 2
#define MAX_REPS 100
/* Dispatch is timed in short batches of kiln_add calls, many of them, so that
 * the median steps over the batches a busy machine preempts. */
#define DISPATCH_CALLS 1000
#define DISPATCH_BATCHES_PER_REP 10
#define MAX_ROWS 32

static const char usage[] =
    "usage: kiln-bench-eager [--threads N] [--reps N] [--quick] [--json FILE]\n"
    "  --threads N  sets KILN_THREADS=N before the first kiln call. OpenBLAS\n"
    "               (kiln_matmul and the cblas_sgemm reference) reads its own\n"
    "               thread count from OPENBLAS_NUM_THREADS when it loads, so set\n"
    "               that in the environment to match.\n"
    "  --reps N     timed repetitions per measurement, after 2 warm-ups (default 10);\n"
    "               dispatch is timed in 10*N batches of 1000 calls\n"
    "  --quick      small sizes, for a smoke test that finishes in seconds\n"
    "  --json FILE  also write the medians to FILE as a JSON object\n";

typedef struct {
    int threads; /* 0 leaves KILN_THREADS as the environment has it */
    int reps;
    bool quick;
    const char *json_path;
} options;

typedef struct {
    int64_t elementwise_n;  /* elements for GELU and the transcendentals */
    int64_t matmul_n;       /* m = n = k */
} sizes;

typedef struct {
    char key[40];   /* JSON key */
    char label[48]; /* table row */
    double value;
    const char *unit;
    char note[72];
} row;

typedef struct {
    row rows[MAX_ROWS];
    int count;
} report;

/* -- Timing ----------------------------------------------------------------- */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts samples in place. */
static double median(double *samples, int n)
{
    qsort(samples, (size_t)n, sizeof *samples, compare_doubles);
    return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

/* One repetition; returns the seconds spent in the measured calls only. */
typedef double (*timed_run)(void *ctx);

static double median_of_runs(timed_run run, void *ctx, int reps)
{
    double samples[MAX_REPS * DISPATCH_BATCHES_PER_REP];
    for (int i = 0; i < WARMUPS; i++)
        run(ctx);
    for (int i = 0; i < reps; i++)
        samples[i] = run(ctx);
    return median(samples, reps);
}

/* -- Reporting -------------------------------------------------------------- */

static void die(const char *what)
{
    fprintf(stderr, "kiln-bench-eager: %s failed: %s\n", what, kiln_last_error());
    exit(1);
}

static kiln_tensor *must(kiln_tensor *t, const char *what)
{
    if (!t)
        die(what);
    return t;
}

/* Appends a result whose table label is printf(label_format, ...). */
static row *add_row(report *r, const char *key, double value, const char *unit, const char *label_format, ...)
{
    if (r->count == MAX_ROWS) {
        fprintf(stderr, "kiln-bench-eager: more than %d results\n", MAX_ROWS);
        exit(1);
    }
    row *out = &r->rows[r->count++];
    snprintf(out->key, sizeof out->key, "%s", key);
    out->value = value;
    out->unit = unit;
    out->note[0] = '\0';
    va_list args;
    va_start(args, label_format);
    vsnprintf(out->label, sizeof out->label, label_format, args);
    va_end(args);
    return out;
}

static void set_note(row *x, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(x->note, sizeof x->note, format, args);
    va_end(args);
}

static void progress(const char *what)
{
    fprintf(stderr, "timing %s ...\n", what);
}

static void print_table(const report *r, const options *opt)
{
    const char *kiln_threads = getenv("KILN_THREADS");
    printf("kiln-bench-eager: KILN_THREADS=%s, OpenBLAS threads=%d (OPENBLAS_NUM_THREADS), "
           "medians of %d reps after %d warm-ups\n",
           kiln_threads ? kiln_threads : "(unset)", openblas_get_num_threads(), opt->reps, WARMUPS);
    printf("%-40s %12s  %-8s  %s\n", "benchmark", "median", "unit", "note");
    for (int i = 0; i < r->count; i++) {
        const row *x = &r->rows[i];
        printf("%-40s %12.3f  %-8s  %s\n", x->label, x->value, x->unit, x->note);
    }
}

static int write_json(const report *r, const options *opt)
{
    FILE *f = fopen(opt->json_path, "w");
    if (!f) {
        perror(opt->json_path);
        return -1;
    }
    char threads[16] = "null"; /* KILN_THREADS left to the environment */
    if (opt->threads)
        snprintf(threads, sizeof threads, "%d", opt->threads);
    fprintf(f, "{\n  \"threads\": %s,\n  \"reps\": %d,\n  \"quick\": %s", threads, opt->reps,
            opt->quick ? "true" : "false");
    for (int i = 0; i < r->count; i++)
        fprintf(f, ",\n  \"%s\": %.6g", r->rows[i].key, r->rows[i].value);
    fprintf(f, "\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* -- a. Dispatch overhead --------------------------------------------------- */

typedef struct {
    kiln_tensor *a, *b;
} dispatch_ctx;

/* Seconds per kiln_add whose result is released at once. */
static double run_add_release_each(void *p)
{
    const dispatch_ctx *c = p;
    double start = now_seconds();
    for (int i = 0; i < DISPATCH_CALLS; i++) {
        kiln_tensor *sum = kiln_add(c->a, c->b);
        if (!sum)
            die("kiln_add");
        kiln_release(sum);
    }
    return (now_seconds() - start) / DISPATCH_CALLS;
}

/* Seconds per kiln_add when a scope releases the whole batch, as user code would. */
static double run_add_scoped(void *p)
{
    const dispatch_ctx *c = p;
    double start = now_seconds();
    kiln_scope_begin();
    for (int i = 0; i < DISPATCH_CALLS; i++)
        if (!kiln_add(c->a, c->b))
            die("kiln_add");
    kiln_scope_end();
    return (now_seconds() - start) / DISPATCH_CALLS;
}

static void bench_dispatch(report *r, int reps)
{
    const int64_t shape[1] = {64};
    dispatch_ctx c = {must(kiln_randn(1, shape, 1), "kiln_randn"), must(kiln_randn(1, shape, 2), "kiln_randn")};
    int batches = reps * DISPATCH_BATCHES_PER_REP;

    progress("kiln_add on f32[64]");
    double each_us = 1e6 * median_of_runs(run_add_release_each, &c, batches);
    set_note(add_row(r, "add64_release_each_us", each_us, "us/call", "add f32[64], release each call"),
             "dispatch+alloc+kernel+release; target < 0.25");
    double scoped_us = 1e6 * median_of_runs(run_add_scoped, &c, batches);
    set_note(add_row(r, "add64_scoped_us", scoped_us, "us/call", "add f32[64], %d per scope", DISPATCH_CALLS),
             "the same, released by kiln_scope_end");

    kiln_release(c.a);
    kiln_release(c.b);
}

/* -- b, d. Large unary workloads -------------------------------------------- */

typedef kiln_tensor *(*unary_op)(kiln_tensor *);

typedef struct {
    unary_op op;
    kiln_tensor *x;
    const char *name;
} unary_ctx;

/* One eager op(x): its temporaries are freed inside the timing (as numpy frees
 * its own), the result after it. */
static double run_unary(void *p)
{
    const unary_ctx *c = p;
    double start = now_seconds();
    kiln_scope_begin();
    kiln_tensor *y = kiln_keep(c->op(c->x));
    kiln_scope_end();
    double elapsed = now_seconds() - start;
    if (!y)
        die(c->name);
    kiln_release(y);
    return elapsed;
}

/* The tanh-form GELU from nine individual ops, as written without kiln_gelu. */
static kiln_tensor *gelu_from_ops(kiln_tensor *x)
{
    const double sqrt_2_over_pi = 0.7978845608028654;
    kiln_tensor *cube = kiln_mul(kiln_mul(x, x), x);
    kiln_tensor *inner = kiln_mul_scalar(kiln_add(x, kiln_mul_scalar(cube, 0.044715)), sqrt_2_over_pi);
    return kiln_mul(kiln_mul_scalar(x, 0.5), kiln_add_scalar(kiln_tanh(inner), 1.0));
}

static void bench_gelu(report *r, const sizes *sz, int reps)
{
    const int64_t shape[1] = {sz->elementwise_n};
    kiln_tensor *x = must(kiln_randn(1, shape, 3), "kiln_randn");
    unary_ctx from_ops = {gelu_from_ops, x, "gelu from ops"};
    unary_ctx composite = {kiln_gelu, x, "kiln_gelu"};
    long long n = (long long)sz->elementwise_n;

    progress("GELU from individual ops");
    double ops_ms = 1e3 * median_of_runs(run_unary, &from_ops, reps);
    set_note(add_row(r, "gelu_ops_ms", ops_ms, "ms", "gelu from 9 ops, f32[%lld]", n),
             "0.5*x*(1+tanh(c*(x+0.044715*x*x*x)))");
    progress("kiln_gelu");
    double composite_ms = 1e3 * median_of_runs(run_unary, &composite, reps);
    set_note(add_row(r, "gelu_ms", composite_ms, "ms", "kiln_gelu, f32[%lld]", n), "the composite");

    kiln_release(x);
}

static double ns_per_element(const unary_ctx *c, int64_t n, int reps)
{
    return 1e9 * median_of_runs(run_unary, (void *)c, reps) / (double)n;
}

static void bench_transcendentals(report *r, const sizes *sz, int reps)
{
    const int64_t n = sz->elementwise_n, shape[1] = {n};
    kiln_tensor *normal = must(kiln_randn(1, shape, 4), "kiln_randn");
    /* log gets [0.5, 1.5) so that no lane takes a NaN or -inf path. */
    kiln_scope_begin();
    kiln_tensor *positive = kiln_keep(kiln_add_scalar(kiln_rand(1, shape, 5), 0.5));
    kiln_scope_end();
    must(positive, "kiln_rand + 0.5");
    const unary_ctx baseline = {kiln_neg, normal, "neg"};
    const unary_ctx ops[] = {
        {kiln_exp, normal, "exp"},   {kiln_log, positive, "log"},         {kiln_tanh, normal, "tanh"},
        {kiln_erf, normal, "erf"},   {kiln_sigmoid, normal, "sigmoid"},
    };

    progress("transcendentals");
    set_note(add_row(r, "neg_ns_per_element", ns_per_element(&baseline, n, reps), "ns/elem", "neg, f32[%lld]",
                     (long long)n),
             "baseline: the same memory traffic and allocation");
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        char key[40];
        snprintf(key, sizeof key, "%s_ns_per_element", ops[i].name);
        add_row(r, key, ns_per_element(&ops[i], n, reps), "ns/elem", "%s, f32[%lld]", ops[i].name, (long long)n);
    }

    kiln_release(normal);
    kiln_release(positive);
}

/* -- c. Matmul against OpenBLAS --------------------------------------------- */

typedef struct {
    int n;
    kiln_tensor *a, *b;
    float *host_a, *host_b, *host_c; /* the same values, for cblas_sgemm */
} matmul_ctx;

/* Includes allocating kiln's result, which sgemm's caller does beforehand. */
static double run_kiln_matmul(const matmul_ctx *m)
{
    double start = now_seconds();
    kiln_tensor *c = kiln_matmul(m->a, m->b);
    double elapsed = now_seconds() - start;
    if (!c)
        die("kiln_matmul");
    kiln_release(c);
    return elapsed;
}

static double run_sgemm(const matmul_ctx *m)
{
    int n = m->n;
    double start = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, m->host_a, n, m->host_b, n, 0.0f,
                m->host_c, n);
    return now_seconds() - start;
}

/* Largest |kiln - sgemm| relative to the largest |sgemm|: proves both did the same product. */
static double matmul_disagreement(const matmul_ctx *m)
{
    size_t count = (size_t)m->n * (size_t)m->n;
    float *from_kiln = malloc(count * sizeof *from_kiln);
    kiln_tensor *c = must(kiln_matmul(m->a, m->b), "kiln_matmul");
    if (!from_kiln || kiln_copy_to_host(c, from_kiln, count * sizeof *from_kiln) < 0)
        die("kiln_copy_to_host");
    kiln_release(c);
    run_sgemm(m);
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < count; i++) {
        max_diff = fmax(max_diff, fabs((double)from_kiln[i] - m->host_c[i]));
        max_ref = fmax(max_ref, fabs(m->host_c[i]));
    }
    free(from_kiln);
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

/* Laid out as kiln lays out large storage (2 MiB aligned, huge pages advised)
 * so that TLB misses do not tip the comparison either way. */
static float *host_matrix(int64_t n)
{
    const size_t huge_page = 2u << 20;
    size_t bytes = ((size_t)(n * n) * sizeof(float) + huge_page - 1) / huge_page * huge_page;
    float *data = aligned_alloc(huge_page, bytes);
    if (!data)
        die("aligned_alloc");
    madvise(data, bytes, MADV_HUGEPAGE);
    return data;
}

static float *host_copy(const kiln_tensor *t, int64_t n)
{
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *data = host_matrix(n);
    if (kiln_copy_to_host(t, data, bytes) < 0)
        die("kiln_copy_to_host");
    return data;
}

/* Two random n x n matrices, in kiln and as host copies for sgemm. */
static matmul_ctx matmul_setup(int64_t n)
{
    const int64_t shape[2] = {n, n};
    matmul_ctx m = {(int)n, must(kiln_randn(2, shape, 6), "kiln_randn"), must(kiln_randn(2, shape, 7), "kiln_randn"),
                    NULL, NULL, host_matrix(n)};
    m.host_a = host_copy(m.a, n);
    m.host_b = host_copy(m.b, n);
    return m;
}

static void matmul_teardown(matmul_ctx *m)
{
    free(m->host_a);
    free(m->host_b);
    free(m->host_c);
    kiln_release(m->a);
    kiln_release(m->b);
}

/* Alternates the two so that this machine's noise falls on both alike. */
static void time_matmuls(const matmul_ctx *m, int reps, double *kiln_ms, double *sgemm_ms)
{
    double kiln_samples[MAX_REPS], sgemm_samples[MAX_REPS];
    for (int i = -WARMUPS; i < reps; i++) {
        double kiln_s = run_kiln_matmul(m), sgemm_s = run_sgemm(m);
        if (i >= 0) {
            kiln_samples[i] = kiln_s;
            sgemm_samples[i] = sgemm_s;
        }
    }
    *kiln_ms = 1e3 * median(kiln_samples, reps);
    *sgemm_ms = 1e3 * median(sgemm_samples, reps);
}

static void bench_matmul(report *r, const sizes *sz, int reps)
{
    matmul_ctx m = matmul_setup(sz->matmul_n);
    double kiln_ms, sgemm_ms, gflop = 2e-9 * (double)m.n * m.n * m.n;

    progress("matmul: kiln_matmul and cblas_sgemm, interleaved");
    time_matmuls(&m, reps, &kiln_ms, &sgemm_ms);

    set_note(add_row(r, "matmul_kiln_ms", kiln_ms, "ms", "matmul %d^3, kiln_matmul", m.n),
             "%.1f GFLOP/s, includes allocating the result", gflop / (kiln_ms * 1e-3));
    set_note(add_row(r, "matmul_sgemm_ms", sgemm_ms, "ms", "matmul %d^3, cblas_sgemm", m.n),
             "%.1f GFLOP/s, OpenBLAS on the same data", gflop / (sgemm_ms * 1e-3));
    set_note(add_row(r, "matmul_ratio", kiln_ms / sgemm_ms, "ratio", "matmul kiln / sgemm"),
             "target <= 1.05; max rel diff %.1e", matmul_disagreement(&m));

    matmul_teardown(&m);
}

/* -- Options and main ------------------------------------------------------- */

static int parse_count(const char *flag, const char *text, int max)
{
    char *end;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || *end != '\0' || v < 1 || v > max) {
        fprintf(stderr, "kiln-bench-eager: %s needs a whole number from 1 to %d\n%s", flag, max, usage);
        exit(2);
    }
    return (int)v;
}

static options parse_options(int argc, char **argv)
{
    options opt = {0, 10, false, NULL};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--quick")) {
            opt.quick = true;
        } else if (!strcmp(flag, "--help")) {
            fputs(usage, stdout);
            exit(0);
        } else if (!strcmp(flag, "--threads")) {
            opt.threads = parse_count(flag, value, 1024);
            i++;
        } else if (!strcmp(flag, "--reps")) {
            opt.reps = parse_count(flag, value, MAX_REPS);
            i++;
        } else if (!strcmp(flag, "--json") && value) {
            opt.json_path = value;
            i++;
        } else {
            fprintf(stderr, "kiln-bench-eager: unknown option or missing value: %s\n%s", flag, usage);
            exit(2);
        }
    }
    return opt;
}

int main(int argc, char **argv)
{
    options opt = parse_options(argc, argv);
    if (opt.threads) {
        char value[16];
        snprintf(value, sizeof value, "%d", opt.threads);
        setenv("KILN_THREADS", value, 1); /* before any kiln call reads it */
    }
    const sizes sz = opt.quick ? (sizes){1 << 16, 256} : (sizes){1 << 24, 2048};

    report r = {.count = 0};
    bench_dispatch(&r, opt.reps);
    bench_gelu(&r, &sz, opt.reps);
    bench_matmul(&r, &sz, opt.reps);
    bench_transcendentals(&r, &sz, opt.reps);

    print_table(&r, &opt);
    if (opt.json_path && write_json(&r, &opt) < 0)
        return 1;
    if (kiln_live_tensors() != 0) {
        fprintf(stderr, "kiln-bench-eager: %lld tensors leaked\n", (long long)kiln_live_tensors());
        return 1;
    }
    return 0;
}
