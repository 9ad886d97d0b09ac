/* The elementwise set of issue 19 (rounding, floor division and remainder,
 * log1p, expm1, log2, tan, atan, atan2, sign, reciprocal, isnan, isinf, the
 * logical ops, clamp, softplus, exact GELU) against naive f64 references,
 * in every dtype and layout, with empty and 0-d shapes, eagerly,
 * interpreted and compiled (see opcheck.h). */
#include "opcheck.h"

/* -- References --------------------------------------------------------------- */

typedef enum {
    KEEPS,    /* the dtype stays; bool refused */
    FLOATS,   /* floats stay, integers and bools give f32 */
    ANY,      /* the dtype stays, bool too */
    PREDICATE /* bool */
} result_rule;

static kiln_dtype result_of(result_rule rule, kiln_dtype dt)
{
    switch (rule) {
    case FLOATS: return oc_is_float(dt) ? dt : KILN_F32;
    case PREDICATE: return KILN_BOOL;
    default: return dt;
    }
}

static double ref_sign(double x)
{
    return x > 0 ? 1 : x < 0 ? -1 : 0;
}

static double ref_reciprocal(double x)
{
    return 1 / x;
}

static double ref_isnan(double x)
{
    return isnan(x);
}

static double ref_isinf(double x)
{
    return isinf(x);
}

static double ref_not(double x)
{
    return x == 0;
}

static double ref_round(double x)
{
    return nearbyint(x); /* halves to even in the default rounding mode */
}

static double ref_gelu_erf(double x)
{
    return 0.5 * x * (1 + erf(x / sqrt(2)));
}

static double ref_softplus(double x)
{
    return 2 * x > 3 ? x : log1p(exp(2 * x)) / 2; /* beta 2, threshold 3 */
}

static kiln_tensor *softplus_2_3(kiln_tensor *a)
{
    return kiln_softplus(a, 2, 3);
}

typedef struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *);
    double (*ref)(double);
    result_rule rule;
    double lo, hi;     /* where inputs are drawn from */
    bool transcendental;
} unary_case;

static const unary_case UNARY[] = {
    {"floor", kiln_floor, floor, KEEPS, -4, 4, false},
    {"ceil", kiln_ceil, ceil, KEEPS, -4, 4, false},
    {"round", kiln_round, ref_round, KEEPS, -4, 4, false},
    {"trunc", kiln_trunc, trunc, KEEPS, -4, 4, false},
    {"log1p", kiln_log1p, log1p, FLOATS, -0.9, 5, true},
    {"expm1", kiln_expm1, expm1, FLOATS, -5, 5, true},
    {"log2", kiln_log2, log2, FLOATS, 0.01, 9, true},
    {"tan", kiln_tan, tan, FLOATS, -1.4, 1.4, true},
    {"atan", kiln_atan, atan, FLOATS, -9, 9, true},
    {"sign", kiln_sign, ref_sign, ANY, -3, 3, false},
    {"reciprocal", kiln_reciprocal, ref_reciprocal, FLOATS, -3, 3, false},
    {"isnan", kiln_isnan, ref_isnan, PREDICATE, -3, 3, false},
    {"isinf", kiln_isinf, ref_isinf, PREDICATE, -3, 3, false},
    {"logical_not", kiln_logical_not, ref_not, PREDICATE, -2, 2, false},
    {"gelu_erf", kiln_gelu_erf, ref_gelu_erf, FLOATS, -4, 4, true},
    {"softplus", softplus_2_3, ref_softplus, FLOATS, -4, 4, true},
};

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};

/* Shapes every op meets: 0-d, empty, size-1 axes, and plain ones. */
static const struct {
    int ndim;
    int64_t shape[3];
} SHAPES[] = {{0, {0}}, {2, {0, 3}}, {1, {1}}, {2, {3, 4}}, {3, {2, 1, 5}}, {2, {4, 1}}};

static oc_tol tol_for(kiln_dtype dt, bool transcendental)
{
    if (dt == KILN_F32)
        return (oc_tol){transcendental ? 4e-6 : 2e-7, transcendental ? 1e-6 : 0, !transcendental};
    return (oc_tol){transcendental ? 1e-13 : 1e-15, transcendental ? 1e-15 : 0, !transcendental};
}

/* -- Unary --------------------------------------------------------------------- */

static kiln_tensor *apply_unary(kiln_tensor *const *in, const void *ctx)
{
    return ((const unary_case *)ctx)->fn(in[0]);
}

/* Special values each float op meets: signed zeros, halves, infinities, NaN. */
static const double SPECIALS[] = {0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, INFINITY, -INFINITY, NAN, 1e-30, -1e-30};

static void check_unary_values(const unary_case *c, kiln_tensor *x, const double *v, kiln_dtype dt, int ndim,
                               const int64_t *shape, const char *desc)
{
    kiln_dtype out = result_of(c->rule, dt);
    int64_t n = oc_numel(ndim, shape);
    double *want = malloc((size_t)(n ? n : 1) * sizeof *want);
    for (int64_t i = 0; i < n; i++)
        want[i] = oc_round(out, c->ref(v[i]));
    char what[160];
    snprintf(what, sizeof what, "%s(%s)", c->name, desc);
    oc_check(what, apply_unary, c, 1, &x, out, ndim, shape, want, tol_for(out, c->transcendental));
    free(want);
}

START_TEST(test_unary)
{
    const unary_case *c = &UNARY[_i];
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        kiln_dtype dt = DTYPES[d];
        if (c->rule == KEEPS && dt == KILN_BOOL)
            continue;
        for (int s = 0; s < OC_COUNT(SHAPES); s++) {
            if ((s + d) % 2 && s > 1) /* every dtype meets the edge shapes, half the others */
                continue;
            oc_operand x;
            oc_operand_init(&x, dt, (oc_layout)((s + d) % OC_LAYOUTS), SHAPES[s].ndim, SHAPES[s].shape, c->lo,
                            c->hi, (uint64_t)(s * 11 + d));
            check_unary_values(c, x.t, x.v, dt, x.ndim, x.shape, x.desc);
        }
    }
    for (int d = 0; d < 2; d++) {
        int64_t n = OC_COUNT(SPECIALS);
        kiln_tensor *x = oc_tensor(DTYPES[d], OC_CONTIG, 1, &n, SPECIALS);
        double v[OC_COUNT(SPECIALS)];
        for (int i = 0; i < n; i++)
            v[i] = oc_round(DTYPES[d], SPECIALS[i]);
        check_unary_values(c, x, v, DTYPES[d], 1, &n, "specials");
    }
}
END_TEST

START_TEST(test_unary_refusals)
{
    const unary_case *c = &UNARY[_i];
    kiln_clear_error();
    ck_assert_ptr_null(c->fn(NULL));
    ck_assert_kiln_error("operand a");
    if (c->rule != KEEPS)
        return;
    kiln_tensor *b = kiln_ones(KILN_BOOL, 1, (int64_t[]){2});
    ck_assert_ptr_null(c->fn(b));
    ck_assert_kiln_error(c->name, "bool");
}
END_TEST

/* -- Binary --------------------------------------------------------------------- */

/* x // y and x % y as Python (and PyTorch 1.13) compute them in dtype dt;
 * integers by zero give 0, INT_MIN // -1 wraps. */
static double py_floor_divide(kiln_dtype dt, double x, double y)
{
    if (!oc_is_float(dt)) {
        if (y == 0)
            return 0;
        if (y == -1)
            return oc_round(dt, -x);
        double q = trunc(x / y), r = x - q * y;
        return r != 0 && (r < 0) != (y < 0) ? q - 1 : q;
    }
    if (dt == KILN_F32) {
        float a = (float)x, b = (float)y;
        if (b == 0)
            return a / b;
        float m = fmodf(a, b), q = (a - m) / b;
        if (m != 0 && (b < 0) != (m < 0))
            q -= 1;
        if (q == 0)
            return copysignf(0, a / b);
        float f = floorf(q);
        return q - f > 0.5f ? f + 1 : f;
    }
    if (y == 0)
        return x / y;
    double m = fmod(x, y), q = (x - m) / y;
    if (m != 0 && (y < 0) != (m < 0))
        q -= 1;
    if (q == 0)
        return copysign(0, x / y);
    double f = floor(q);
    return q - f > 0.5 ? f + 1 : f;
}

static double py_remainder(kiln_dtype dt, double x, double y)
{
    if (!oc_is_float(dt) && (y == 0 || y == -1))
        return 0;
    double m = dt == KILN_F32 ? fmodf((float)x, (float)y) : fmod(x, y);
    return m != 0 && (m < 0) != (y < 0) ? oc_round(dt, m + y) : m;
}

static double ref_atan2(kiln_dtype dt, double x, double y)
{
    (void)dt;
    return atan2(x, y);
}

static double ref_and(kiln_dtype dt, double x, double y)
{
    (void)dt;
    return x != 0 && y != 0;
}

static double ref_or(kiln_dtype dt, double x, double y)
{
    (void)dt;
    return x != 0 || y != 0;
}

static double ref_xor(kiln_dtype dt, double x, double y)
{
    (void)dt;
    return (x != 0) != (y != 0);
}

typedef struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
    double (*ref)(kiln_dtype compute, double, double);
    result_rule rule; /* KEEPS: the promoted dtype, bool refused */
    double lo, hi;
    bool transcendental;
} binary_case;

static const binary_case BINARY[] = {
    {"remainder", kiln_remainder, py_remainder, KEEPS, -7, 7, false},
    {"floor_divide", kiln_floor_divide, py_floor_divide, KEEPS, -7, 7, false},
    {"atan2", kiln_atan2, ref_atan2, FLOATS, -3, 3, true},
    {"logical_and", kiln_logical_and, ref_and, PREDICATE, -1, 1, false},
    {"logical_or", kiln_logical_or, ref_or, PREDICATE, -1, 1, false},
    {"logical_xor", kiln_logical_xor, ref_xor, PREDICATE, -1, 1, false},
};

static int dtype_rank(kiln_dtype dt)
{
    static const int ranks[] = {[KILN_BOOL] = 0, [KILN_I32] = 1, [KILN_I64] = 2, [KILN_F32] = 3, [KILN_F64] = 4};
    return ranks[dt];
}

/* Dimensioned operands promote to the wider dtype. */
static kiln_dtype promote(kiln_dtype a, kiln_dtype b)
{
    return dtype_rank(a) >= dtype_rank(b) ? a : b;
}

static kiln_tensor *apply_binary(kiln_tensor *const *in, const void *ctx)
{
    return ((const binary_case *)ctx)->fn(in[0], in[1]);
}

/* Operand shape pairs: equal, broadcast both ways, empty, a 0-d with a
 * dimensioned one (both dimensioned here: promotion by rank is test_ops'). */
static const struct {
    int na, nb;
    int64_t a[3], b[3];
} PAIRS[] = {{2, 2, {3, 4}, {3, 4}}, {2, 1, {3, 4}, {4}}, {2, 2, {3, 1}, {1, 5}}, {2, 1, {0, 2}, {2}},
             {3, 2, {2, 3, 2}, {3, 2}}, {1, 1, {1}, {6}}};

static void check_binary_case(const binary_case *c, kiln_dtype da, kiln_dtype db, int p, uint64_t seed)
{
    kiln_dtype promoted = promote(da, db), out = result_of(c->rule, promoted);
    oc_operand a, b;
    oc_operand_init(&a, da, (oc_layout)(seed % OC_LAYOUTS), PAIRS[p].na, PAIRS[p].a, c->lo, c->hi, seed);
    oc_operand_init(&b, db, (oc_layout)((seed + 1) % OC_LAYOUTS), PAIRS[p].nb, PAIRS[p].b, c->lo, c->hi, seed + 5);
    int ndim = PAIRS[p].na > PAIRS[p].nb ? PAIRS[p].na : PAIRS[p].nb;
    int64_t shape[3], idx[3];
    for (int d = 0; d < ndim; d++) {
        int ka = d - (ndim - a.ndim), kb = d - (ndim - b.ndim);
        int64_t sa = ka >= 0 ? a.shape[ka] : 1, sb = kb >= 0 ? b.shape[kb] : 1;
        shape[d] = sa == 1 ? sb : sa;
    }
    int64_t n = oc_numel(ndim, shape);
    double *want = malloc((size_t)(n ? n : 1) * sizeof *want);
    for (int64_t i = 0; i < n; i++) {
        oc_unravel(i, ndim, shape, idx);
        double x = a.v[oc_broadcast_index(ndim, idx, a.ndim, a.shape)];
        double y = b.v[oc_broadcast_index(ndim, idx, b.ndim, b.shape)];
        kiln_dtype compute = c->rule == FLOATS ? out : promoted;
        want[i] = oc_round(out, c->ref(compute, oc_round(compute, x), oc_round(compute, y)));
    }
    char what[300];
    snprintf(what, sizeof what, "%s(%s, %s)", c->name, a.desc, b.desc);
    kiln_tensor *in[2] = {a.t, b.t};
    oc_check(what, apply_binary, c, 2, in, out, ndim, shape, want, tol_for(out, c->transcendental));
    free(want);
}

START_TEST(test_binary)
{
    const binary_case *c = &BINARY[_i];
    int k = 0;
    for (int i = 0; i < OC_COUNT(DTYPES); i++) {
        for (int j = 0; j < OC_COUNT(DTYPES); j++) {
            kiln_dtype da = DTYPES[i], db = DTYPES[j];
            if (c->rule == KEEPS && promote(da, db) == KILN_BOOL)
                continue;
            if (i != j && (i + j) % 3) /* every dtype with itself, a third of the mixed pairs */
                continue;
            check_binary_case(c, da, db, k % OC_COUNT(PAIRS), (uint64_t)k);
            k++;
        }
    }
}
END_TEST

/* Python's signs and PyTorch 1.13's float edge cases, written out. */
START_TEST(test_floor_divide_remainder_edges)
{
    const double a[] = {5.5, -5.5, 5.5, -0.0, 0.0, INFINITY, 3, -3, 1, 7, -7, 7, -7};
    const double b[] = {-2, 2, INFINITY, 2, -2, 2, -INFINITY, INFINITY, -0.0, 2, 2, -2, -2};
    const double quotient[] = {-3, -3, 0, -0.0, -0.0, NAN, -1, -1, -INFINITY, 3, -4, -4, 3};
    const double rest[] = {-0.5, 0.5, 5.5, 0, 0, NAN, -INFINITY, INFINITY, NAN, 1, 1, -1, -1};
    int64_t n = OC_COUNT(a);
    for (int d = 0; d < 2; d++) {
        kiln_tensor *in[2] = {oc_tensor(DTYPES[d], OC_CONTIG, 1, &n, a), oc_tensor(DTYPES[d], OC_CONTIG, 1, &n, b)};
        oc_check("floor_divide edges", apply_binary, &BINARY[1], 2, in, DTYPES[d], 1, &n, quotient,
                 (oc_tol){0, 0, true});
        oc_check("remainder edges", apply_binary, &BINARY[0], 2, in, DTYPES[d], 1, &n, rest, (oc_tol){1e-7, 0, false});
    }
    /* Integers: by zero 0, INT_MIN // -1 wraps, Python's signs. */
    const double ia[] = {7, -7, 7, -7, 5, INT32_MIN, INT32_MIN, 0};
    const double ib[] = {2, 2, -2, -2, 0, -1, 1, -3};
    const double iq[] = {3, -4, -4, 3, 0, INT32_MIN, INT32_MIN, 0};
    const double ir[] = {1, 1, -1, -1, 0, 0, 0, 0};
    int64_t m = OC_COUNT(ia);
    kiln_tensor *in[2] = {oc_tensor(KILN_I32, OC_CONTIG, 1, &m, ia), oc_tensor(KILN_I32, OC_CONTIG, 1, &m, ib)};
    oc_check("i32 floor_divide edges", apply_binary, &BINARY[1], 2, in, KILN_I32, 1, &m, iq, (oc_tol){0});
    oc_check("i32 remainder edges", apply_binary, &BINARY[0], 2, in, KILN_I32, 1, &m, ir, (oc_tol){0});
    const double la[] = {-0x1p63, -0x1p63, 9}, lb[] = {-1, 7, 0};
    const double lq[] = {-0x1p63, (double)(INT64_MIN / 7 - 1), 0};
    int64_t k = 3;
    kiln_tensor *lin[2] = {oc_tensor(KILN_I64, OC_CONTIG, 1, &k, la), oc_tensor(KILN_I64, OC_CONTIG, 1, &k, lb)};
    oc_check("i64 floor_divide edges", apply_binary, &BINARY[1], 2, lin, KILN_I64, 1, &k, lq, (oc_tol){0});
}
END_TEST

START_TEST(test_binary_refusals)
{
    const binary_case *c = &BINARY[_i];
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2});
    kiln_clear_error();
    ck_assert_ptr_null(c->fn(NULL, x));
    ck_assert_kiln_error("operand a");
    kiln_clear_error();
    ck_assert_ptr_null(c->fn(x, NULL));
    ck_assert_kiln_error("operand b");
    ck_assert_ptr_null(c->fn(x, kiln_ones(KILN_F32, 1, (int64_t[]){3})));
    ck_assert_kiln_error("[2]", "[3]");
    if (c->rule != KEEPS)
        return;
    kiln_tensor *b = kiln_ones(KILN_BOOL, 1, (int64_t[]){2});
    ck_assert_ptr_null(c->fn(b, b));
    ck_assert_kiln_error(c->name, "bool");
}
END_TEST

/* -- clamp ----------------------------------------------------------------------- */

typedef struct {
    double lo, hi;
} bounds;

static kiln_tensor *apply_clamp(kiln_tensor *const *in, const void *ctx)
{
    const bounds *b = ctx;
    return kiln_clamp(in[0], b->lo, b->hi);
}

/* Bounds in order, reversed (hi wins), fractional (integers give f32),
 * infinite, and NaN (everything NaN). */
START_TEST(test_clamp)
{
    static const bounds cases[] = {{-1, 2}, {2, -1}, {-0.5, 1.5}, {-INFINITY, 0}, {NAN, 1}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < 4; d++) {
            kiln_dtype dt = DTYPES[d];
            oc_operand x;
            oc_operand_init(&x, dt, (oc_layout)((c + d) % OC_LAYOUTS), 2, (int64_t[]){3, 5}, -4, 4,
                            (uint64_t)(c * 5 + d));
            bool whole = isfinite(cases[c].lo) && cases[c].lo == floor(cases[c].lo) && cases[c].hi == floor(cases[c].hi);
            kiln_dtype out = oc_is_float(dt) || whole ? dt : KILN_F32;
            double want[15];
            for (int i = 0; i < 15; i++) {
                double v = x.v[i] < cases[c].lo || isnan(cases[c].lo) ? cases[c].lo : x.v[i];
                want[i] = oc_round(out, v > cases[c].hi || isnan(cases[c].hi) ? cases[c].hi : v);
            }
            char what[200];
            snprintf(what, sizeof what, "clamp(%s, %g, %g)", x.desc, cases[c].lo, cases[c].hi);
            oc_check(what, apply_clamp, &cases[c], 1, &x.t, out, 2, x.shape, want, (oc_tol){0, 0, true});
        }
    }
    kiln_clear_error();
    ck_assert_ptr_null(kiln_clamp(NULL, 0, 1));
    ck_assert_kiln_error("kiln_clamp", "operand a");
}
END_TEST

/* Composites fuse: a traced softplus is one kernel. */
static kiln_tensor *softplus_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_gelu_erf(kiln_softplus(kiln_clamp(in[0], -3, 3), 1, 20));
}

START_TEST(test_composites_fuse)
{
    kiln_tensor *x = kiln_randn(2, (int64_t[]){16, 32}, 7);
    int kernels = oc_kernels(softplus_body, NULL, 1, &x);
    ck_assert_msg(kernels == 1 || kernels == -1, "%d kernels", kernels);
}
END_TEST

static TCase *tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return tc;
}

static Suite *pointwise_suite(void)
{
    Suite *s = suite_create("pointwise");
    TCase *tc = tcase(s, "unary");
    tcase_add_loop_test(tc, test_unary, 0, OC_COUNT(UNARY));
    tcase_add_loop_test(tc, test_unary_refusals, 0, OC_COUNT(UNARY));
    tc = tcase(s, "binary");
    tcase_add_loop_test(tc, test_binary, 0, OC_COUNT(BINARY));
    tcase_add_loop_test(tc, test_binary_refusals, 0, OC_COUNT(BINARY));
    tcase_add_test(tc, test_floor_divide_remainder_edges);
    tc = tcase(s, "composites");
    tcase_add_test(tc, test_clamp);
    tcase_add_test(tc, test_composites_fuse);
    return s;
}

KILN_TEST_MAIN(pointwise_suite)
