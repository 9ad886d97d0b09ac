/* kiln-bench's serve: a transformer block (pre-norm attention over heads with
 * a causal mask, then a gelu MLP, both residual) called as a server calls it,
 * with batch sizes drawn from 1..64 in a fixed random order: eagerly; marked
 * with fixed shapes, every new batch size traced and compiled (static); the
 * same with the default retrace limit of 8, past which new sizes run eagerly
 * (static, limit 8: kiln before dynamic shapes, by default); and marked with
 * dynamic shapes (AUTO). Each mode runs in a fresh process with the disk
 * cache off, so that every compile is cold and none is shared with another
 * mode. Another process times warm calls of a fixed and a dynamic
 * specialization at the same batch sizes, in turn. */
#include "serve.h"
#include "timing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { HEADS = 4, STEADY_REPS = 15 };

typedef struct {
    int64_t T, C, D;
    kiln_tensor *ln1_g, *ln1_b, *wq, *wk, *wv, *wo, *ln2_g, *ln2_b, *w1, *b1, *w2, *b2, *mask;
} block;

static kiln_tensor *weight(int64_t rows, int64_t cols, uint64_t seed)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_keep(kiln_mul_scalar(kiln_randn(2, (int64_t[]){rows, cols}, seed), 1.0 / sqrt((double)rows)));
    kiln_scope_end();
    return w;
}

static void block_make(block *b, bool quick)
{
    b->T = quick ? 8 : 16;
    b->C = quick ? 64 : 128;
    b->D = b->C / HEADS;
    int64_t c = b->C, h = 4 * b->C;
    b->ln1_g = kiln_ones(KILN_F32, 1, &c);
    b->ln1_b = kiln_zeros(KILN_F32, 1, &c);
    b->ln2_g = kiln_ones(KILN_F32, 1, &c);
    b->ln2_b = kiln_zeros(KILN_F32, 1, &c);
    b->wq = weight(c, c, 11);
    b->wk = weight(c, c, 12);
    b->wv = weight(c, c, 13);
    b->wo = weight(c, c, 14);
    b->w1 = weight(c, h, 15);
    b->b1 = kiln_zeros(KILN_F32, 1, &h);
    b->w2 = weight(h, c, 16);
    b->b2 = kiln_zeros(KILN_F32, 1, &c);
    /* Causal: -inf above the diagonal. */
    kiln_scope_begin();
    kiln_tensor *row = kiln_reshape(kiln_arange(0, (double)b->T, 1, KILN_F32), 2, (int64_t[]){b->T, 1});
    kiln_tensor *col = kiln_reshape(kiln_arange(0, (double)b->T, 1, KILN_F32), 2, (int64_t[]){1, b->T});
    b->mask = kiln_keep(kiln_where(kiln_gt(col, row), kiln_scalar(-INFINITY), kiln_scalar(0)));
    kiln_scope_end();
}

static void block_free(block *b)
{
    kiln_tensor *all[] = {b->ln1_g, b->ln1_b, b->wq, b->wk, b->wv, b->wo, b->ln2_g,
                          b->ln2_b, b->w1, b->b1, b->w2, b->b2, b->mask};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        kiln_release(all[i]);
}

/* [B, T, C] -> [B, heads, T, D]; -1 keeps the batch size free to vary. */
static kiln_tensor *heads(const block *b, kiln_tensor *x)
{
    return kiln_permute(kiln_reshape(x, 4, (int64_t[]){-1, b->T, HEADS, b->D}), (int[]){0, 2, 1, 3});
}

static int block_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const block *b = user;
    kiln_tensor *x = in[0];
    kiln_tensor *h = kiln_layer_norm(x, b->ln1_g, b->ln1_b, 1e-5);
    kiln_tensor *q = heads(b, kiln_matmul(h, b->wq)), *k = heads(b, kiln_matmul(h, b->wk));
    kiln_tensor *v = heads(b, kiln_matmul(h, b->wv));
    kiln_tensor *scores = kiln_add(kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, 2, 3)), 1.0 / sqrt((double)b->D)),
                                   b->mask);
    kiln_tensor *att = kiln_permute(kiln_matmul(kiln_softmax(scores, -1), v), (int[]){0, 2, 1, 3});
    x = kiln_add(x, kiln_matmul(kiln_reshape(att, 3, (int64_t[]){-1, b->T, b->C}), b->wo));
    h = kiln_layer_norm(x, b->ln2_g, b->ln2_b, 1e-5);
    h = kiln_add(kiln_matmul(kiln_gelu(kiln_add(kiln_matmul(h, b->w1), b->b1)), b->w2), b->b2);
    out[0] = kiln_add(x, h);
    return out[0] ? 0 : -1;
}

/* The batch sizes of the run, from a fixed seed. */
static void batch_sizes(int64_t *sizes, int n)
{
    uint64_t state = 0x5eed;
    for (int i = 0; i < n; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        sizes[i] = 1 + (int64_t)((state >> 33) % SERVE_MAX_BATCH);
    }
}

static kiln_fn *mark(block *b, kiln_dynamic mode, int retrace_limit)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic = mode;
    o.no_cache = true;
    o.retrace_limit = retrace_limit;
    return kiln_jit("serve_block", block_body, 1, 1, b, &o);
}

static double max_abs_diff(kiln_tensor *a, kiln_tensor *b)
{
    return kiln_item(kiln_max(kiln_abs(kiln_sub(a, b)), KILN_ALL, false));
}

/* One mode's run, printed as "total p50 p99 traces compiled fallbacks diff". */
static int run_mode(block *b, const char *mode, int calls)
{
    bool eager = !strcmp(mode, "eager"), dynamic = !strcmp(mode, "dynamic");
    int limit = !strcmp(mode, "static") ? SERVE_MAX_BATCH : 0; /* 0: the default, 8 */
    kiln_fn *f = eager ? NULL : mark(b, dynamic ? KILN_DYNAMIC_AUTO : KILN_DYNAMIC_NEVER, limit);
    int64_t *sizes = malloc((size_t)calls * sizeof *sizes);
    double *ms = malloc((size_t)calls * sizeof *ms), total = 0, diff = eager ? NAN : 0;
    batch_sizes(sizes, calls);
    for (int i = 0; i < calls; i++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_randn(3, (int64_t[]){sizes[i], b->T, b->C}, (uint64_t)i), *y = NULL;
        double start = now_ms();
        int status = f ? kiln_call(f, &x, &y) : block_body(&x, &y, b);
        ms[i] = now_ms() - start;
        if (status != 0)
            return fprintf(stderr, "kiln-bench serve %s: %s\n", mode, kiln_last_error()), 1;
        if (f && i % 10 == 0) { /* checked against eager now and then, outside the timing */
            kiln_tensor *want = NULL;
            block_body(&x, &want, b);
            double d = max_abs_diff(y, want);
            diff = d > diff ? d : diff;
        }
        total += ms[i];
        kiln_scope_end();
    }
    kiln_fn_stats_t s = {0};
    if (f)
        kiln_fn_stats(f, &s);
    double p50 = quantile(ms, calls, 0.5), p99 = quantile(ms, calls, 0.99);
    printf("%.6f %.6f %.6f %lld %lld %lld %.9g\n", total, p50, p99, (long long)s.traces,
           (long long)s.kernels_compiled, (long long)s.eager_fallbacks, diff);
    free(sizes);
    free(ms);
    kiln_fn_free(f);
    return 0;
}

/* Median ms of a call of f at batch n. */
static double warm_ms(kiln_fn *f, block *b, int64_t n)
{
    double v[STEADY_REPS];
    kiln_tensor *x = kiln_randn(3, (int64_t[]){n, b->T, b->C}, 7);
    for (int r = -2; r < STEADY_REPS; r++) {
        kiln_scope_begin();
        kiln_tensor *y;
        double start = now_ms();
        kiln_call(f, &x, &y);
        if (r >= 0)
            v[r] = now_ms() - start;
        kiln_scope_end();
    }
    kiln_release(x);
    return quantile(v, STEADY_REPS, 0.5);
}

/* Warm calls at each steady size, fixed and dynamic in turn: "fixed dynamic"
 * medians per size. */
static int run_steady(block *b)
{
    kiln_fn *fixed = mark(b, KILN_DYNAMIC_NEVER, 1000);
    kiln_jit_options o = kiln_jit_defaults();
    o.no_cache = true;
    uint32_t batch[1] = {0x1};
    o.dynamic_dims = batch;
    kiln_fn *dynamic = kiln_jit("serve_block", block_body, 1, 1, b, &o);
    for (int i = 0; i < SERVE_STEADY_SIZES; i++) {
        double a = warm_ms(fixed, b, SERVE_STEADY[i]), d = warm_ms(dynamic, b, SERVE_STEADY[i]);
        double a2 = warm_ms(fixed, b, SERVE_STEADY[i]), d2 = warm_ms(dynamic, b, SERVE_STEADY[i]);
        printf("%.6f %.6f ", (a + a2) / 2, (d + d2) / 2);
    }
    printf("\n");
    kiln_fn_free(fixed);
    kiln_fn_free(dynamic);
    return 0;
}

const int64_t SERVE_STEADY[SERVE_STEADY_SIZES] = {3, 16, 41, 64};

int serve_child(const char *mode, bool quick)
{
    block b;
    block_make(&b, quick);
    int calls = quick ? SERVE_CALLS_QUICK : SERVE_CALLS;
    int status = !strcmp(mode, "steady") ? run_steady(&b) : run_mode(&b, mode, calls);
    block_free(&b);
    return status;
}

/* This program run as a fresh process for mode; its output line in line. */
static int spawn(const char *self, const char *mode, int threads, bool quick, char *line, size_t size)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "KILN_CACHE=off '%s' --threads %d --probe serve-%s serve%s", self, threads, mode,
             quick ? " --quick" : "");
    FILE *p = popen(cmd, "r");
    bool got = p && fgets(line, (int)size, p);
    int status = p ? pclose(p) : -1;
    return got && status == 0 ? 0 : -1;
}

static void parse_mode(const char *line, serve_mode *m)
{
    long long traces, compiled, fallbacks;
    *m = (serve_mode){NAN, NAN, NAN, -1, -1, -1, NAN};
    if (sscanf(line, "%lf %lf %lf %lld %lld %lld %lf", &m->total_ms, &m->p50_ms, &m->p99_ms, &traces, &compiled,
               &fallbacks, &m->max_abs_diff) == 7) {
        m->traces = traces;
        m->kernels_compiled = compiled;
        m->eager_fallbacks = fallbacks;
    }
}

int serve_measure(int threads, bool quick, bench_serve *s)
{
    char self[1024], line[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return -1;
    self[len] = '\0';
    *s = (bench_serve){.calls = quick ? SERVE_CALLS_QUICK : SERVE_CALLS};
    block b;
    block_make(&b, quick);
    snprintf(s->block, sizeof s->block, "T=%lld C=%lld heads=%d, batch 1..%d", (long long)b.T, (long long)b.C,
             HEADS, SERVE_MAX_BATCH);
    block_free(&b);
    const char *modes[4] = {"eager", "static", "static-limited", "dynamic"};
    serve_mode *into[4] = {&s->eager, &s->fixed, &s->fixed_limited, &s->dynamic};
    for (int i = 0; i < 4; i++) {
        fprintf(stderr, "kiln-bench: serve: %s, %d calls in a fresh process\n", modes[i], s->calls);
        if (spawn(self, modes[i], threads, quick, line, sizeof line) < 0)
            return -1;
        parse_mode(line, into[i]);
    }
    fprintf(stderr, "kiln-bench: serve: warm fixed and dynamic specializations at the same sizes\n");
    if (spawn(self, "steady", threads, quick, line, sizeof line) < 0)
        return -1;
    const char *p = line;
    for (int i = 0; i < SERVE_STEADY_SIZES; i++) {
        int used = 0;
        if (sscanf(p, "%lf %lf %n", &s->steady_fixed_ms[i], &s->steady_dynamic_ms[i], &used) < 2)
            return -1;
        p += used;
    }
    return 0;
}

void serve_print(const bench_serve *s, FILE *out)
{
    fprintf(out, "\nserve: a transformer block (%s), %d calls with random batch sizes, cold cache\n", s->block,
            s->calls);
    fprintf(out, "  %-16s %10s %10s %10s %8s %9s %10s %10s\n", "mode", "total ms", "p50 ms", "p99 ms", "traces",
            "kernels", "eager", "max diff");
    const char *names[4] = {"eager", "static", "static, limit 8", "dynamic"};
    const serve_mode *modes[4] = {&s->eager, &s->fixed, &s->fixed_limited, &s->dynamic};
    for (int i = 0; i < 4; i++)
        fprintf(out, "  %-16s %10.1f %10.3f %10.3f %8lld %9lld %10lld %10.2g\n", names[i], modes[i]->total_ms,
                modes[i]->p50_ms, modes[i]->p99_ms, (long long)modes[i]->traces,
                (long long)modes[i]->kernels_compiled, (long long)modes[i]->eager_fallbacks, modes[i]->max_abs_diff);
    fprintf(out, "  static / dynamic total: %.2fx; static with limit 8 / dynamic: %.2fx\n",
            s->fixed.total_ms / s->dynamic.total_ms, s->fixed_limited.total_ms / s->dynamic.total_ms);
    fprintf(out, "  warm calls, fixed vs dynamic specialization:");
    for (int i = 0; i < SERVE_STEADY_SIZES; i++)
        fprintf(out, "  batch %lld %.3f/%.3f ms (%.2fx)", (long long)SERVE_STEADY[i], s->steady_fixed_ms[i],
                s->steady_dynamic_ms[i], s->steady_dynamic_ms[i] / s->steady_fixed_ms[i]);
    fprintf(out, "\n");
}
