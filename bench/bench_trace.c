/* kiln-bench-trace: what marking a function costs on the INTERP backend:
 * kiln_call's overhead on a cached specialization, and tracing plus
 * optimising a 50-op body. Medians; the machine is noisy. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Median microseconds per call of body, eagerly or through f. */
static double time_calls(kiln_fn *f, kiln_body body, kiln_tensor *x)
{
    double samples[REPS];
    for (int r = -2; r < REPS; r++) {
        double start = now_us();
        for (int i = 0; i < CALLS; i++) {
            kiln_scope_begin();
            kiln_tensor *out;
            int status = f ? kiln_call(f, &x, &out) : body(&x, &out, NULL);
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

int main(void)
{
    int64_t n = 64, shape[2] = {8, 64};
    kiln_tensor *x = kiln_randn(1, &n, 1);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("tiny", tiny, 1, 1, NULL, &o);
    double eager = time_calls(NULL, tiny, x), traced = time_calls(f, tiny, x);
    kiln_fn_stats_t s;
    kiln_fn_stats(f, &s);
    printf("%-52s %8.3f us\n", "tiny (20 ops on f32[64]), eager", eager);
    printf("%-52s %8.3f us\n", "tiny, kiln_call on a cached specialization", traced);
    printf("%-52s %8.3f us  (target < 2 us)\n", "kiln_call overhead over the eager kernels", traced - eager);
    printf("%-52s %8d\n", "kernels run per call", s.kernels);
    kiln_fn_free(f);

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
