/* kiln-bench-trace: what marking a function costs on the INTERP backend:
 * kiln_call's overhead on a cached specialization, the guard check that
 * picks it (4 inputs, fixed and symbolic sizes), and tracing plus optimising
 * a 50-op body. Medians; the machine is noisy. It links kiln's modules, to
 * time the guard check alone. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace/internal.h"

enum { CALLS = 2000, REPS = 15, TRACE_REPS = 50, CHAIN = 50 };

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return v[n / 2];
}

/* The "tiny" workload: ten x*1.0001+0.5 steps. */
static int tiny(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = in[0];
    for (int i = 0; i < 10; i++)
        x = kiln_add_scalar(kiln_mul_scalar(x, 1.0001), 0.5);
    out[0] = x;
    return x ? 0 : -1;
}

/* 50 ops mixing elementwise, broadcasting and a reduction. */
static int chain(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = in[0], *b = in[1];
    for (int i = 0; i < CHAIN / 5; i++)
        x = kiln_tanh(kiln_sub(kiln_mul_scalar(kiln_add(x, b), 0.5), kiln_mean(x, -1, true)));
    out[0] = x;
    return x ? 0 : -1;
}

/* Median microseconds per call of body on in, eagerly or through f. */
static double time_calls(kiln_fn *f, kiln_body body, kiln_tensor *const *in)
{
    double samples[REPS];
    for (int r = -2; r < REPS; r++) {
        double start = now_us();
        for (int i = 0; i < CALLS; i++) {
            kiln_scope_begin();
            kiln_tensor *out;
            int status = f ? kiln_call(f, in, &out) : body(in, &out, NULL);
            kiln_scope_end();
            if (status < 0) {
                fprintf(stderr, "kiln-bench-trace: %s\n", kiln_last_error());
                exit(1);
            }
        }
        if (r >= 0)
            samples[r] = (now_us() - start) / CALLS;
    }
    return median(samples, REPS);
}

/* Four 0-d-ish inputs through one add each: little work beside the call. */
static int four(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_add(kiln_add(in[0], in[1]), kiln_add(in[2], in[3]));
    return out[0] ? 0 : -1;
}

/* Median nanoseconds of one guard check of 4 inputs of rank 2. */
static double time_guard_check(bool symbolic)
{
    guard guards[4];
    kiln_spec sig[4];
    for (int i = 0; i < 4; i++) {
        guards[i] = (guard){KILN_F32, KILN_CPU, 2, {symbolic ? -1 : 8, 16}};
        sig[i] = (kiln_spec){.dtype = KILN_F32, .ndim = 2, .shape = {8, 16}, .device = KILN_CPU};
    }
    enum { CHECKS = 1000000 };
    double samples[REPS];
    int64_t symbols[IR_MAX_SYMBOLS];
    volatile int passed = 0;
    for (int r = -2; r < REPS; r++) {
        double start = now_us();
        for (int i = 0; i < CHECKS; i++) {
            sig[i & 3].shape[1] = 16; /* keeps the compiler from hoisting the check */
            passed += guards_pass(guards, 4, sig, symbols);
        }
        if (r >= 0)
            samples[r] = (now_us() - start) * 1e3 / CHECKS;
    }
    return median(samples, REPS);
}

static void guard_figures(void)
{
    printf("%-52s %8.1f ns  (target < 100 ns)\n", "guard check, 4 inputs, fixed sizes", time_guard_check(false));
    printf("%-52s %8.1f ns  (target < 100 ns)\n", "guard check, 4 inputs, a symbolic batch", time_guard_check(true));
    int64_t shape[2] = {8, 16};
    kiln_tensor *in[4];
    for (int i = 0; i < 4; i++)
        in[i] = kiln_randn(2, shape, (uint64_t)i);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    o.dynamic = KILN_DYNAMIC_NEVER;
    kiln_fn *fixed = kiln_jit("four", four, 4, 1, NULL, &o);
    uint32_t batch[4] = {1, 1, 1, 1};
    o.dynamic = KILN_DYNAMIC_AUTO;
    o.dynamic_dims = batch;
    kiln_fn *dynamic = kiln_jit("four", four, 4, 1, NULL, &o);
    double a = time_calls(fixed, four, in), b = time_calls(dynamic, four, in);
    printf("%-52s %8.3f us\n", "kiln_call of 4 inputs, fixed sizes", a);
    printf("%-52s %8.3f us\n", "kiln_call of 4 inputs, a symbolic batch", b);
    kiln_fn_free(fixed);
    kiln_fn_free(dynamic);
    for (int i = 0; i < 4; i++)
        kiln_release(in[i]);
}

int main(void)
{
    int64_t n = 64, shape[2] = {8, 64};
    kiln_tensor *x = kiln_randn(1, &n, 1);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("tiny", tiny, 1, 1, NULL, &o);
    double eager = time_calls(NULL, tiny, &x), traced = time_calls(f, tiny, &x);
    kiln_fn_stats_t s;
    kiln_fn_stats(f, &s);
    printf("%-52s %8.3f us\n", "tiny (20 ops on f32[64]), eager", eager);
    printf("%-52s %8.3f us\n", "tiny, kiln_call on a cached specialization", traced);
    printf("%-52s %8.3f us  (target < 2 us)\n", "kiln_call overhead over the eager kernels", traced - eager);
    printf("%-52s %8d\n", "kernels run per call", s.kernels);
    kiln_fn_free(f);
    guard_figures();

    kiln_tensor *in[2] = {kiln_randn(2, shape, 2), kiln_randn(1, shape + 1, 3)};
    kiln_spec specs[2] = {{.dtype = KILN_F32, .ndim = 2, .shape = {8, 64}, .device = KILN_CPU}, {.dtype = KILN_F32, .ndim = 1, .shape = {64}, .device = KILN_CPU}};
    double samples[TRACE_REPS];
    for (int r = -2; r < TRACE_REPS; r++) {
        kiln_fn *g = kiln_jit("chain", chain, 2, 1, NULL, &o);
        double start = now_us();
        if (kiln_fn_precompile(g, specs, "host") < 0) {
            fprintf(stderr, "kiln-bench-trace: %s\n", kiln_last_error());
            return 1;
        }
        if (r >= 0)
            samples[r] = now_us() - start;
        kiln_fn_free(g);
    }
    printf("%-52s %8.1f us  (target < 100 us)\n", "trace and optimise a 50-op body", median(samples, TRACE_REPS));
    kiln_release(in[0]);
    kiln_release(in[1]);
    kiln_release(x);
    return 0;
}
