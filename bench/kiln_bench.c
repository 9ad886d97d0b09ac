/* kiln-bench: the standard workloads, eager and traced, against this
 * machine's limits (a copy-bandwidth probe and an OpenBLAS sgemm measured in
 * the same run) and, with --compare, against peers (bench/peers.py).
 *
 * A workload's limit is the larger of its memory floor (the bytes it must move
 * over the copy bandwidth) and its compute floor (its matrix products timed
 * alone with cblas_sgemm in the same run).
 *
 * Timing: a monotonic clock around the call only, 2 warm-ups, medians of
 * --reps runs. Each timed run includes releasing what it made, eager and
 * traced alike. The JSON schema is docs/bench-json.md. */
#include <kiln/kiln.h>

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "workloads.h"

enum { WARMUPS = 2, MAX_REPS = 1000, TINY_BATCH = 1000 };

static const char usage[] =
    "usage: kiln-bench [--workload NAME] [--device cpu|cuda] [--threads N] [--quick]\n"
    "                  [--reps N] [--json FILE] [--svg FILE] [--compare PEERS.json]\n"
    "  --workload NAME  one of gelu softmax layernorm mlp attention tiny (default: all)\n"
    "  --device D       cpu (cuda needs the CUDA backend, not in this build)\n"
    "  --threads N      kiln's and OpenBLAS's threads (default: the number of cores)\n"
    "  --quick          small sizes, for CI: finishes in seconds\n"
    "  --reps N         timed runs per measurement after 2 warm-ups (default 10, quick 3)\n"
    "  --json FILE      the results in the schema of docs/bench-json.md\n"
    "  --svg FILE       a bar chart: eager, traced and the machine's limit per workload\n"
    "  --compare FILE   adds the runs of FILE (bench/peers.py --json) as columns\n";

typedef struct {
    const char *workload, *json, *svg, *compare;
    const char *probe, *probe_workload; /* internal: a disk-hit probe's fresh process */
    int threads, reps;
    bool quick;
} options;

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

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One run of a workload: eagerly (f NULL) or through f, outputs released. */
static void run_once(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state)
{
    kiln_scope_begin();
    kiln_tensor *out = NULL;
    int status = f ? kiln_call(f, in, &out) : w->body(in, &out, state);
    kiln_scope_end();
    if (status != 0)
        die(w->name);
}

/* Median milliseconds of one run; tiny runs in batches, reported per run. */
static double time_runs(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *state, int reps)
{
    int batch = strcmp(w->name, "tiny") ? 1 : TINY_BATCH;
    double samples[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double start = now_ms();
        for (int i = 0; i < batch; i++)
            run_once(w, f, in, state);
        if (r >= 0)
            samples[r] = (now_ms() - start) / batch;
    }
    return median(samples, reps);
}

/* -- This machine's limits ------------------------------------------------- */

typedef struct {
    float *src, *dst;
    size_t n;
} copy_part;

static void *copy_part_run(void *p)
{
    copy_part *c = p;
    memcpy(c->dst, c->src, c->n * sizeof *c->src);
    return NULL;
}

/* A STREAM-like copy on every thread: bytes read plus written per second. */
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
    double samples[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        pthread_t ids[64];
        copy_part parts[64];
        int t_count = threads < 64 ? threads : 64;
        double start = now_ms();
        for (int t = 0; t < t_count; t++) {
            size_t lo = n * (size_t)t / (size_t)t_count, hi = n * (size_t)(t + 1) / (size_t)t_count;
            parts[t] = (copy_part){src + lo, dst + lo, hi - lo};
            pthread_create(&ids[t], NULL, copy_part_run, &parts[t]);
        }
        for (int t = 0; t < t_count; t++)
            pthread_join(ids[t], NULL);
        if (r >= 0)
            samples[r] = now_ms() - start;
    }
    free(src);
    free(dst);
    return 2.0 * (double)(n * sizeof(float)) / (median(samples, reps) * 1e6);
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

/* The median time of a workload's matrix products done by cblas_sgemm alone
 * on buffers made once: what its compute needs on this machine. */
static double time_gemms(const workload_state *state, int reps)
{
    if (state->n_gemms == 0)
        return 0;
    float *buf[WORKLOAD_MAX_GEMMS][3];
    for (int g = 0; g < state->n_gemms; g++) {
        const workload_gemm *p = &state->gemms[g];
        size_t sizes[3] = {(size_t)(p->m * p->k), (size_t)(p->k * p->n), (size_t)(p->m * p->n)};
        for (int i = 0; i < 3; i++) {
            buf[g][i] = calloc(sizes[i], sizeof(float));
            if (!buf[g][i]) {
                fprintf(stderr, "kiln-bench: out of memory for the sgemm reference\n");
                exit(1);
            }
        }
    }
    double samples[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double start = now_ms();
        for (int g = 0; g < state->n_gemms; g++) {
            const workload_gemm *p = &state->gemms[g];
            for (int64_t c = 0; c < p->count; c++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)p->m, (int)p->n, (int)p->k, 1,
                            buf[g][0], (int)p->k, buf[g][1], (int)p->n, 0, buf[g][2], (int)p->n);
        }
        if (r >= 0)
            samples[r] = now_ms() - start;
    }
    for (int g = 0; g < state->n_gemms; g++)
        for (int i = 0; i < 3; i++)
            free(buf[g][i]);
    return median(samples, reps);
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
static double time_first_call(const workload *w, kiln_tensor **in, workload_state *state, int reps)
{
    double samples[MAX_REPS];
    int n = reps < 3 ? reps : 3;
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

/* kiln-bench --probe first-call|prepare NAME, run as a fresh process: the
 * milliseconds of w's first call (or of preparing it) with the disk cache on,
 * and the kernels that compiled, which must be none for a disk hit. */
static int probe(const char *what, const workload *w, bool quick)
{
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    if (w->setup(quick, in, &state) < 0)
        die(w->name);
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, NULL);
    if (!f)
        die(w->name);
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
    kiln_fn_free(f);
    workload_free(w, in, &state);
    return 0;
}

/* This program run as a fresh process probing w over cache_root with
 * KILN_CACHE=mode; NAN when it failed. */
static double spawn_probe(const char *what, const char *mode, const workload *w, const options *opt,
                          const char *cache_root, long long *compiled)
{
    char self[1024], cmd[2400];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return NAN;
    self[len] = '\0';
    snprintf(cmd, sizeof cmd, "KILN_CACHE=%s KILN_CACHE_DIR='%s' '%s' --threads %d --probe %s %s%s", mode,
             cache_root, self, opt->threads, what, w->name, opt->quick ? " --quick" : "");
    FILE *p = popen(cmd, "r");
    double ms = NAN;
    if (!p || fscanf(p, "%lf %lld", &ms, compiled) != 2)
        ms = NAN;
    if (p && pclose(p) != 0)
        ms = NAN;
    return ms;
}

/* Medians over fresh processes, so that each pays for starting LLVM: of
 * preparing w with the disk cache off (the cold compile), and, in processes
 * that find every kernel on disk (a first one fills a cache of their own),
 * of the first call and of preparing. NAN where a process failed, or
 * compiled when it should have loaded. */
static void time_fresh_processes(const workload *w, const options *opt, bench_result *res)
{
    res->compile_ms = res->disk_hit_ms = res->disk_load_ms = NAN;
    char root[] = "/tmp/kiln-bench-cache-XXXXXX", cmd[64];
    if (!mkdtemp(root))
        return;
    long long compiled = 0;
    double compiles[MAX_REPS], calls[MAX_REPS], prepares[MAX_REPS];
    int n = opt->reps < 3 ? opt->reps : 3;
    bool cold = true, hits = true;
    for (int r = 0; cold && r < n; r++) {
        compiles[r] = spawn_probe("prepare", "off", w, opt, root, &compiled);
        cold = !isnan(compiles[r]);
    }
    hits = !isnan(spawn_probe("prepare", "on", w, opt, root, &compiled));
    for (int r = 0; hits && r < n; r++) {
        calls[r] = spawn_probe("first-call", "on", w, opt, root, &compiled);
        hits = !isnan(calls[r]) && compiled == 0;
        prepares[r] = spawn_probe("prepare", "on", w, opt, root, &compiled);
        hits = hits && !isnan(prepares[r]) && compiled == 0;
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

static void measure(const workload *w, const options *opt, const bench_probes *probes, bench_result *res)
{
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    if (w->setup(opt->quick, in, &state) < 0)
        die(w->name);
    snprintf(res->name, sizeof res->name, "%s", w->name);
    snprintf(res->size, sizeof res->size, "%s", state.size);
    res->reps = opt->reps;

    progress("%s %s: eager", w->name, state.size);
    res->eager_ms = time_runs(w, NULL, in, &state, opt->reps);
    progress("%s %s: first calls", w->name, state.size);
    res->first_call_ms = time_first_call(w, in, &state, opt->reps);
    time_fresh_processes(w, opt, res);
    progress("%s %s: traced", w->name, state.size);
    kiln_fn *f = mark(w, &state);
    res->traced_ms = time_runs(w, f, in, &state, opt->reps);
    kiln_fn_stats_t stats;
    kiln_fn_stats(f, &stats);
    res->kernels = stats.kernels;
    res->backend = kiln_fn_backend(f);
    res->peak_eager_bytes = peak_of_run(w, NULL, in, &state);
    res->peak_traced_bytes = peak_of_run(w, f, in, &state);

    kiln_scope_begin();
    kiln_tensor *eager = NULL, *traced = NULL;
    if (w->body(in, &eager, &state) != 0 || kiln_call(f, in, &traced) != 0)
        die(w->name);
    res->max_abs_diff = max_abs_diff(traced, eager);
    kiln_scope_end();

    double memory_ms = state.bytes / (probes->copy_gbps * 1e6);
    double compute_ms = time_gemms(&state, opt->reps);
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
    *opt = (options){.threads = (int)sysconf(_SC_NPROCESSORS_ONLN)};
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
        else if (!strcmp(a, "--device") && strcmp(next, "cpu"))
            return fprintf(stderr, "kiln-bench: --device %s: only cpu in this build (the CUDA backend is "
                                   "not built)\n", next), -1;
        else if (!strcmp(a, "--threads"))
            opt->threads = atoi(next);
        else if (!strcmp(a, "--reps"))
            reps = atoi(next);
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
        else if (strcmp(a, "--device"))
            return fprintf(stderr, "kiln-bench: unknown option %s\n%s", a, usage), -1;
        i += takes;
    }
    opt->reps = reps > 0 ? reps : opt->quick ? 3 : 10;
    if (opt->threads < 1 || opt->reps > MAX_REPS)
        return fprintf(stderr, "kiln-bench: --threads must be at least 1, --reps at most %d\n", MAX_REPS), -1;
    const char *name = opt->probe ? opt->probe_workload : opt->workload;
    if (name && !workload_find(name))
        return fprintf(stderr, "kiln-bench: no workload %s\n%s", name, usage), -1;
    return 0;
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
    if (opt.probe)
        return probe(opt.probe, workload_find(opt.probe_workload), opt.quick);

    bench_run run = {.threads = opt.threads, .quick = opt.quick};
    bench_describe_machine(&run);
    progress("probing this machine: copy bandwidth and sgemm");
    run.probes.copy_gbps = probe_copy_gbps(opt.quick, opt.threads, opt.reps);
    run.probes.sgemm_gflops = probe_sgemm_gflops(opt.quick, opt.reps);
    for (int i = 0; i < workload_count; i++) {
        if (opt.workload && strcmp(opt.workload, workloads[i].name))
            continue;
        measure(&workloads[i], &opt, &run.probes, &run.results[run.count++]);
    }
    snprintf(run.backend, sizeof run.backend, "%s", run.count && run.results[0].backend ? run.results[0].backend : "?");
    bench_print_table(&run, stdout);
    if (opt.compare && bench_print_comparison(&run, opt.compare, stdout) < 0)
        return 1;
    if (opt.json && bench_write_json(&run, opt.json) < 0)
        return 1;
    if (opt.svg && bench_write_svg(&run, opt.svg) < 0)
        return 1;
    return 0;
}
