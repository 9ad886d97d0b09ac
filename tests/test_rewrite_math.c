/* The rewrites of compositions of transcendentals (src/ir/rewrite.c),
 * compiled by LLVM: each measured in ulps against long double over a dense
 * sweep of the floats, as llvm_math measures the functions themselves, beside
 * the composition compiled as written (opt_level 0 runs no graph passes). */
#include "test_common.h"

#include <float.h>
#include <stdint.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* Every SWEEP_STRIDE-th float bit pattern (odd, so every low mantissa bit
 * varies): about a million inputs, or four thousand under valgrind; and
 * WINDOW patterns either side of each function's delicate points. */
#define SWEEP_STRIDE 4099u
#define SWEEP_STRIDE_VALGRIND 1048573u
#define WINDOW 2048
#define WINDOW_VALGRIND 16
#define BLOCK (1 << 16)

typedef struct {
    const char *name;
    kiln_tensor *(*build)(kiln_tensor *x);
    long double (*ref)(long double x);
    /* The bound asserted for x in [core_lo, inf] and NaN, and below: there
     * an exponential inside is subnormal, and its error, 0.5 ulp of the
     * least subnormal, grows by what the composition multiplies it by. */
    double max_ulp, max_ulp_tail;
    float core_lo;
    float centres[6];
} composite;

/* -- The compositions and their values ----------------------------------- */

static kiln_tensor *softplus_of(kiln_tensor *x)
{
    return kiln_log(kiln_add_scalar(kiln_exp(x), 1));
}

static long double softplus_ref(long double x)
{
    return x > 0 ? x + log1pl(expl(-x)) : log1pl(expl(x));
}

static kiln_tensor *mish_gate(kiln_tensor *x) { return kiln_tanh(softplus_of(x)); }
static long double mish_gate_ref(long double x) { return tanhl(softplus_ref(x)); }
static kiln_tensor *mish(kiln_tensor *x) { return kiln_mul(x, mish_gate(x)); }
static long double mish_ref(long double x) { return x * mish_gate_ref(x); }

static kiln_tensor *log_sigmoid(kiln_tensor *x) { return kiln_log(kiln_sigmoid(x)); }
static long double log_sigmoid_ref(long double x) { return -softplus_ref(-x); }
static kiln_tensor *exp_of_log(kiln_tensor *x) { return kiln_exp(kiln_log(x)); }
static long double exp_of_log_ref(long double x) { return x < 0 ? NAN : x + 0; }
static kiln_tensor *log_of_exp(kiln_tensor *x) { return kiln_log(kiln_exp(x)); }
static long double log_of_exp_ref(long double x) { return x + 0; }
/* As users write 1 - sigmoid(x). 1 / (1 + exp(x)), the rule's other form,
 * needs a constant divided by a tensor, which the public ops do not trace
 * to; its result is sigmoid(-x), which llvm_math measures. */
static kiln_tensor *one_minus_sigmoid(kiln_tensor *x)
{
    return kiln_add_scalar(kiln_neg(kiln_sigmoid(x)), 1);
}
static long double sigmoid_neg_ref(long double x) { return 1 / (1 + expl(x)); }

#define ALL -INFINITY
static const composite composites[] = {
    {"tanh(softplus)", mish_gate, mish_gate_ref, 4, 4, ALL, {-17.0f, 0.0f, 20.0f, -87.0f, 1.0f, -1.0f}},
    {"mish", mish, mish_ref, 4, 56, -87.3f, {-17.0f, 0.0f, 20.0f, -87.0f, 1.0f, -1.0f}},
    {"softplus", softplus_of, softplus_ref, 4, 4, ALL, {-17.0f, 0.0f, 17.0f, 88.7f, -88.0f, -103.0f}},
    {"log(sigmoid)", log_sigmoid, log_sigmoid_ref, 4, 4, ALL, {17.0f, 0.0f, -17.0f, -88.7f, 88.0f, 103.0f}},
    {"exp(log)", exp_of_log, exp_of_log_ref, 0, 0, ALL, {1.0f, 0.0f, 0x1p-126f, 80.0f, -1.0f, 1e30f}},
    {"log(exp)", log_of_exp, log_of_exp_ref, 0, 0, ALL, {1.0f, 0.0f, 88.7f, -87.0f, -104.0f, 1e-7f}},
    {"1-sigmoid", one_minus_sigmoid, sigmoid_neg_ref, 2, 2, ALL, {0.0f, 17.0f, -17.0f, 88.0f, 104.0f, 1.0f}},
};

/* -- Measuring ------------------------------------------------------------ */

static int body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = ((const composite *)user)->build(in[0]);
    return out[0] ? 0 : -1;
}

/* The largest errors of one compiled form. */
typedef struct {
    double core, tail; /* ulps, for x from core_lo up and below it */
    float core_at, tail_at;
    long wrong_specials;      /* NaN for a number or the reverse, a wrong infinity */
    float wrong_at;
} tally;

/* The error of got in ulps of the float nearest want, as llvm_math counts it. */
static void count(tally *t, const composite *c, float x, float got, long double want)
{
    double err = test_ulp_error(got, (double)want);
    if (isinf(err)) {
        if (t->wrong_specials++ == 0)
            t->wrong_at = x;
        return;
    }
    bool tail = x < c->core_lo;
    double *worst = tail ? &t->tail : &t->core;
    if (err > *worst) {
        *worst = err;
        *(tail ? &t->tail_at : &t->core_at) = x;
    }
}

/* Runs f over in[0..n) (n <= BLOCK; the block is padded with in[0] so that
 * one specialization serves every call) and counts each result's error. */
static void measure(kiln_fn *f, const composite *c, tally *t, float *in, int n)
{
    for (int i = n; i < BLOCK; i++)
        in[i] = in[0];
    int64_t shape = BLOCK;
    kiln_scope_begin();
    kiln_tensor *x = kiln_from_data(KILN_F32, 1, &shape, in), *y = NULL;
    ck_assert_msg(kiln_call(f, &x, &y) == 0, "%s: %s", c->name, kiln_last_error());
    static float out[BLOCK];
    ck_assert_int_eq(kiln_copy_to_host(y, out, sizeof out), 0);
    kiln_release(y);
    kiln_scope_end();
    for (int i = 0; i < n; i++)
        count(t, c, in[i], out[i], c->ref(in[i]));
}

/* Adds x to the block, measuring it when full. */
static void feed(kiln_fn *f, const composite *c, tally *t, float *in, int *n, float x)
{
    in[(*n)++] = x;
    if (*n == BLOCK) {
        measure(f, c, t, in, *n);
        *n = 0;
    }
}

static const uint32_t special_bits[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x00000001,
    0x80000001, 0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000,
};

static tally sweep(const composite *c, int opt_level)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_LLVM;
    o.opt_level = opt_level;
    o.no_cache = true;
    kiln_fn *f = kiln_jit(c->name, body, 1, 1, (void *)c, &o);
    ck_assert_ptr_nonnull(f);
    uint32_t stride = UNDER_VALGRIND() ? SWEEP_STRIDE_VALGRIND : SWEEP_STRIDE;
    int window = UNDER_VALGRIND() ? WINDOW_VALGRIND : WINDOW, n = 0;
    float *in = malloc(BLOCK * sizeof *in);
    ck_assert_ptr_nonnull(in);
    tally t = {0};
    for (uint64_t u = 0; u <= UINT32_MAX; u += stride)
        feed(f, c, &t, in, &n, test_f32_from_bits((uint32_t)u));
    for (int i = 0; i < COUNT(special_bits); i++)
        feed(f, c, &t, in, &n, test_f32_from_bits(special_bits[i]));
    for (int i = 0; i < COUNT(c->centres); i++)
        for (int d = -window; d <= window; d++)
            feed(f, c, &t, in, &n, test_f32_from_bits(test_f32_bits(c->centres[i]) + (uint32_t)d));
    if (n)
        measure(f, c, &t, in, n);
    free(in);
    kiln_fn_free(f);
    return t;
}

START_TEST(test_rewrite_within_bounds)
{
    const composite *c = &composites[_i];
    tally rewritten = sweep(c, 2);
    printf("%-15s rewritten: max %.3f ulp at %a (tail %.3f at %a)\n", c->name, rewritten.core,
           rewritten.core_at, rewritten.tail, rewritten.tail_at);
    ck_assert_msg(rewritten.wrong_specials == 0, "%s: %ld wrong special values, first at %a", c->name,
                  rewritten.wrong_specials, rewritten.wrong_at);
    ck_assert_msg(rewritten.core <= c->max_ulp, "%s: %.3f ulp at %a, over %g", c->name,
                  rewritten.core, rewritten.core_at, c->max_ulp);
    ck_assert_msg(rewritten.tail <= c->max_ulp_tail, "%s: %.3f ulp at %a, over %g", c->name,
                  rewritten.tail, rewritten.tail_at, c->max_ulp_tail);
    if (UNDER_VALGRIND()) /* a compile takes seconds there: the bounds alone */
        return;
    tally written = sweep(c, 0);
    printf("%-15s as written: max %.3g ulp at %a (tail %.3g at %a), %ld wrong specials\n", c->name,
           written.core, written.core_at, written.tail, written.tail_at, written.wrong_specials);
    ck_assert_msg(rewritten.core < written.core || written.wrong_specials > 0,
                  "%s: rewritten %.3f ulp, as written %.3f", c->name, rewritten.core, written.core);
}
END_TEST

static Suite *rewrite_math_suite(void)
{
    Suite *s = suite_create("rewrite_math");
    TCase *tc = tcase_create("compositions");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, kiln_clear_error, NULL);
    tcase_add_loop_test(tc, test_rewrite_within_bounds, 0, COUNT(composites));
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(rewrite_math_suite)
