/* The reductions of issue 19 (prod, argmin, any, all, var, std, var_mean,
 * logsumexp) and every reduction over several axes (KILN_AXES), against
 * naive f64 references: one axis, several, all; keepdim; empty and size-1
 * axes, 0-d inputs, every dtype each accepts and every layout; eagerly,
 * interpreted and compiled (opcheck.h). */
#include "opcheck.h"

/* -- The reference: a fold over the reduced elements of each result ---------- */

typedef double (*fold_fn)(const double *xs, int64_t n, int64_t param);

/* The axis sets the tests use, as arguments and as masks of a 3-d input. */
typedef struct {
    int axis;
    bool mask[3];
    const char *name;
} axes_case;

static const axes_case AXES[] = {
    {1, {false, true, false}, "1"},
    {-1, {false, false, true}, "-1"},
    {KILN_AXES(0, 2), {true, false, true}, "(0, 2)"},
    {KILN_AXES(-1, 1), {false, true, true}, "(-1, 1)"},
    {KILN_AXES(2, 0, 1), {true, true, true}, "(2, 0, 1)"},
    {KILN_ALL, {true, true, true}, "all"},
};

/* fold over the elements of a (ndim, shape, v) that each result gathers
 * (mask: the reduced axes; ndim 0 reduces its one element), into want; the
 * result's shape in *out_ndim, out_shape. */
static int64_t reduce_ref(int ndim, const int64_t *shape, const double *v, const bool *mask, bool keepdim,
                          fold_fn fold, int64_t param, double *want, int *out_ndim, int64_t *out_shape)
{
    int n_out = 0;
    int64_t kept[KILN_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        kept[d] = mask[d] ? 1 : shape[d];
        if (!mask[d] || keepdim)
            out_shape[n_out++] = kept[d];
    }
    *out_ndim = n_out;
    int64_t outs = oc_numel(ndim, kept), total = oc_numel(ndim, shape);
    double *xs = malloc((size_t)(total ? total : 1) * sizeof *xs);
    for (int64_t o = 0; o < outs; o++) {
        int64_t oi[KILN_MAX_DIMS], n = 0;
        oc_unravel(o, ndim, kept, oi);
        for (int64_t i = 0; i < total; i++) {
            int64_t idx[KILN_MAX_DIMS];
            oc_unravel(i, ndim, shape, idx);
            bool mine = true;
            for (int d = 0; d < ndim && mine; d++)
                mine = mask[d] || idx[d] == oi[d];
            if (mine)
                xs[n++] = v[i];
        }
        want[o] = fold(xs, n, param);
    }
    free(xs);
    return outs;
}

static double fold_sum(const double *x, int64_t n, int64_t p)
{
    (void)p;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

static double fold_mean(const double *x, int64_t n, int64_t p)
{
    return fold_sum(x, n, p) / (double)n;
}

static double fold_prod(const double *x, int64_t n, int64_t p)
{
    (void)p;
    double s = 1;
    for (int64_t i = 0; i < n; i++)
        s *= x[i];
    return s;
}

/* The index of the first maximum (p = 1) or minimum (p = 0); the first NaN wins. */
static double fold_arg(const double *x, int64_t n, int64_t want_max)
{
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            return (double)i;
        if (want_max ? x[i] > x[best] : x[i] < x[best])
            best = i;
    }
    return (double)best;
}

static double fold_extreme(const double *x, int64_t n, int64_t want_max)
{
    return x[(int64_t)fold_arg(x, n, want_max)];
}

static double fold_any(const double *x, int64_t n, int64_t p)
{
    (void)p;
    for (int64_t i = 0; i < n; i++)
        if (x[i] != 0)
            return 1;
    return 0;
}

static double fold_all(const double *x, int64_t n, int64_t p)
{
    (void)p;
    for (int64_t i = 0; i < n; i++)
        if (x[i] == 0)
            return 0;
    return 1;
}

static double fold_var(const double *x, int64_t n, int64_t correction)
{
    double mean = fold_mean(x, n, 0), ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (x[i] - mean) * (x[i] - mean);
    double d = (double)n - (double)correction;
    return ss / (d > 0 ? d : 0);
}

static double fold_std(const double *x, int64_t n, int64_t correction)
{
    return sqrt(fold_var(x, n, correction));
}

static double fold_logsumexp(const double *x, int64_t n, int64_t p)
{
    (void)p;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    if (isinf(m))
        m = 0;
    for (int64_t i = 0; i < n; i++)
        s += exp(x[i] - m);
    return log(s) + m;
}

/* -- The cases ------------------------------------------------------------------ */

typedef enum { KEEP, SUMLIKE, FLOATY, INDEX, BOOLEAN, FLOAT_ONLY } rule;

typedef struct {
    const char *name;
    int kind;          /* which call: see apply() */
    fold_fn fold;
    int64_t param;
    rule rule;
    bool empty_ok;     /* defined over an empty reduction */
    bool axes_ok;      /* takes KILN_AXES */
} reduction;

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_ARGMAX, R_ARGMIN, R_ANY, R_ALL, R_VAR, R_STD, R_LOGSUMEXP };

static const reduction REDUCTIONS[] = {
    {"sum", R_SUM, fold_sum, 0, SUMLIKE, true, true},
    {"mean", R_MEAN, fold_mean, 0, FLOATY, true, true},
    {"max", R_MAX, fold_extreme, 1, KEEP, false, true},
    {"min", R_MIN, fold_extreme, 0, KEEP, false, true},
    {"prod", R_PROD, fold_prod, 0, SUMLIKE, true, true},
    {"argmax", R_ARGMAX, fold_arg, 1, INDEX, false, false},
    {"argmin", R_ARGMIN, fold_arg, 0, INDEX, false, false},
    {"any", R_ANY, fold_any, 0, BOOLEAN, true, true},
    {"all", R_ALL, fold_all, 0, BOOLEAN, true, true},
    {"var", R_VAR, fold_var, 1, FLOAT_ONLY, true, true},
    {"std", R_STD, fold_std, 0, FLOAT_ONLY, true, true},
    {"logsumexp", R_LOGSUMEXP, fold_logsumexp, 0, FLOATY, true, true},
};

typedef struct {
    const reduction *r;
    int axis;
    bool keepdim;
} call;

static kiln_tensor *apply(kiln_tensor *const *in, const void *ctx)
{
    const call *c = ctx;
    kiln_tensor *a = in[0];
    switch (c->r->kind) {
    case R_SUM: return kiln_sum(a, c->axis, c->keepdim);
    case R_MEAN: return kiln_mean(a, c->axis, c->keepdim);
    case R_MAX: return kiln_max(a, c->axis, c->keepdim);
    case R_MIN: return kiln_min(a, c->axis, c->keepdim);
    case R_PROD: return kiln_prod(a, c->axis, c->keepdim);
    case R_ARGMAX: return kiln_argmax(a, c->axis, c->keepdim);
    case R_ARGMIN: return kiln_argmin(a, c->axis, c->keepdim);
    case R_ANY: return kiln_any(a, c->axis, c->keepdim);
    case R_ALL: return kiln_all(a, c->axis, c->keepdim);
    case R_VAR: return kiln_var(a, c->axis, c->r->param, c->keepdim);
    case R_STD: return kiln_std(a, c->axis, c->r->param, c->keepdim);
    default: return kiln_logsumexp(a, c->axis, c->keepdim);
    }
}

static kiln_dtype result_of(rule r, kiln_dtype dt)
{
    switch (r) {
    case SUMLIKE: return oc_is_float(dt) ? dt : KILN_I64;
    case FLOATY: return oc_is_float(dt) ? dt : KILN_F32;
    case INDEX: return KILN_I64;
    case BOOLEAN: return KILN_BOOL;
    default: return dt;
    }
}

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};

static oc_tol tolerance(kiln_dtype dt)
{
    return dt == KILN_F32 ? (oc_tol){2e-6, 1e-6, false} : (oc_tol){1e-12, 1e-13, false};
}

/* Checks reduction r of a over mask (passing axis) against the reference. */
static void check(const reduction *r, const oc_operand *a, int axis, const bool *mask, bool keepdim,
                  const char *axis_name)
{
    kiln_dtype out = result_of(r->rule, a->dt);
    double want[OC_MAX_ELEMS];
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    /* Bools and integers reduce as their values. */
    double v[OC_MAX_ELEMS];
    for (int64_t i = 0; i < a->numel; i++)
        v[i] = a->v[i];
    int64_t n = reduce_ref(a->ndim, a->shape, v, mask, keepdim, r->fold, r->param, want, &ndim, shape);
    for (int64_t i = 0; i < n; i++)
        want[i] = oc_round(out, want[i]);
    call c = {r, axis, keepdim};
    char what[200];
    snprintf(what, sizeof what, "%s(%s, axis %s%s)", r->name, a->desc, axis_name, keepdim ? ", keepdim" : "");
    oc_check(what, apply, &c, 1, &a->t, out, ndim, shape, want, tolerance(out));
}

static bool is_axes_set(int axis)
{
    return axis > 0 && (axis & KILN_AXES_FLAG);
}

START_TEST(test_reduction)
{
    const reduction *r = &REDUCTIONS[_i];
    int k = 0;
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        kiln_dtype dt = DTYPES[d];
        if (r->rule == FLOAT_ONLY && !oc_is_float(dt))
            continue;
        for (int x = 0; x < OC_COUNT(AXES); x++, k++) {
            if (!r->axes_ok && is_axes_set(AXES[x].axis))
                continue;
            if ((d + x) % 2 && x > 1) /* every dtype meets one axis, half meet each set */
                continue;
            oc_operand a;
            oc_operand_init(&a, dt, (oc_layout)(k % OC_LAYOUTS), 3, (int64_t[]){3, 4, 5}, -3, 3, (uint64_t)k);
            check(r, &a, AXES[x].axis, AXES[x].mask, k % 3 == 0, AXES[x].name);
        }
    }
}
END_TEST

/* Empty reductions, size-1 axes, 0-d inputs, NaN. */
START_TEST(test_reduction_edges)
{
    const reduction *r = &REDUCTIONS[_i];
    kiln_dtype dt = r->rule == FLOAT_ONLY || r->kind == R_LOGSUMEXP ? KILN_F32 : KILN_I32;
    oc_operand a;
    /* axis 0 of [0, 3] is empty; its result has 3 elements (or none keepdim'd away) */
    oc_operand_init(&a, dt, OC_CONTIG, 2, (int64_t[]){0, 3}, -3, 3, 1);
    bool axis0[3] = {true, false, false}, axis1[3] = {false, true, false};
    if (r->empty_ok) {
        check(r, &a, 0, axis0, false, "0 (empty)");
        if (r->axes_ok)
            check(r, &a, KILN_AXES(0, 1), (bool[]){true, true}, true, "(0, 1) (empty)");
    } else {
        call c = {r, 0, false};
        oc_check_error("empty", apply, &c, 1, &a.t, "empty");
    }
    check(r, &a, 1, axis1, true, "1 of [0, 3]");
    oc_operand_init(&a, dt, OC_TRANSPOSED, 3, (int64_t[]){2, 1, 3}, -3, 3, 2);
    check(r, &a, 1, axis1, false, "1 (size 1)");
    oc_operand_init(&a, dt, OC_CONTIG, 0, NULL, -3, 3, 3);
    check(r, &a, -1, axis0, false, "-1 of 0-d");
    check(r, &a, KILN_ALL, axis0, true, "all of 0-d");
    if (r->rule == INDEX || r->rule == BOOLEAN || r->rule == SUMLIKE || r->kind == R_MAX || r->kind == R_MIN)
        return;
    int64_t n = 6;
    const double v[] = {1, NAN, 2, -INFINITY, INFINITY, 0.5};
    oc_operand_init(&a, KILN_F64, OC_CONTIG, 1, &n, 0, 1, 4);
    memcpy(a.v, v, sizeof v);
    a.t = oc_tensor(KILN_F64, OC_CONTIG, 1, &n, v);
    check(r, &a, 0, axis0, false, "0 with NaN");
}
END_TEST

/* PyTorch's values, written out: logsumexp's infinite rows, var of one
 * element, argmin's NaN, prod of nothing. */
START_TEST(test_pytorch_values)
{
    const double rows[] = {-INFINITY, -INFINITY, INFINITY, 1, 1, 2};
    kiln_tensor *x = oc_tensor(KILN_F32, OC_CONTIG, 2, (int64_t[]){3, 2}, rows);
    double *lse = test_values(kiln_logsumexp(x, -1, false));
    ck_assert(isinf(lse[0]) && lse[0] < 0);
    ck_assert(isinf(lse[1]) && lse[1] > 0);
    ck_assert(fabs(lse[2] - 2.3132616875182228) < 1e-6);
    free(lse);
    kiln_tensor *one = kiln_ones(KILN_F32, 1, (int64_t[]){1});
    ck_assert(isnan(kiln_item(kiln_var(one, 0, 1, false))));
    ck_assert(kiln_item(kiln_var(one, 0, 0, false)) == 0);
    const double nan_row[] = {1, NAN, 0};
    kiln_tensor *y = oc_tensor(KILN_F64, OC_CONTIG, 1, (int64_t[]){3}, nan_row);
    ck_assert(kiln_item(kiln_argmin(y, 0, false)) == 1);
    ck_assert(kiln_item(kiln_prod(kiln_zeros(KILN_I32, 1, (int64_t[]){0}), KILN_ALL, false)) == 1);
    ck_assert(kiln_dtype_of(kiln_prod(kiln_ones(KILN_BOOL, 1, (int64_t[]){2}), 0, false)) == KILN_I64);
}
END_TEST

/* var_mean gives var's and mean's values, keepdim or not. */
typedef struct {
    int axis;
    bool keepdim, want_mean;
} var_mean_call;

static kiln_tensor *apply_var_mean(kiln_tensor *const *in, const void *ctx)
{
    const var_mean_call *c = ctx;
    kiln_tensor *var, *mean;
    if (kiln_var_mean(in[0], c->axis, 1, c->keepdim, &var, &mean) < 0)
        return NULL;
    return c->want_mean ? mean : var;
}

START_TEST(test_var_mean)
{
    oc_operand a;
    oc_operand_init(&a, KILN_F32, OC_STEP2, 3, (int64_t[]){2, 3, 4}, -2, 2, 9);
    for (int k = 0; k < 2; k++) {
        for (int m = 0; m < 2; m++) {
            var_mean_call c = {KILN_AXES(0, 2), k, m};
            double want[OC_MAX_ELEMS];
            int ndim;
            int64_t shape[KILN_MAX_DIMS];
            int64_t n = reduce_ref(3, a.shape, a.v, (bool[]){true, false, true}, k, m ? fold_mean : fold_var, 1,
                                   want, &ndim, shape);
            for (int64_t i = 0; i < n; i++)
                want[i] = (float)want[i];
            oc_check(m ? "var_mean's mean" : "var_mean's var", apply_var_mean, &c, 1, &a.t, KILN_F32, ndim, shape,
                     want, tolerance(KILN_F32));
        }
    }
    kiln_tensor *var = NULL, *mean = NULL;
    ck_assert_int_lt(kiln_var_mean(kiln_ones(KILN_I32, 1, (int64_t[]){2}), 0, 1, false, &var, &mean), 0);
    ck_assert_kiln_error("kiln_var_mean", "floating point");
    ck_assert_ptr_null(var);
    ck_assert_ptr_null(mean);
    ck_assert_int_lt(kiln_var_mean(a.t, 0, 1, false, NULL, &mean), 0);
    ck_assert_kiln_error("kiln_var_mean", "var");
}
END_TEST

START_TEST(test_errors)
{
    kiln_tensor *x = kiln_ones(KILN_F32, 3, (int64_t[]){2, 3, 4});
    kiln_clear_error();
    ck_assert_ptr_null(kiln_prod(NULL, 0, false));
    ck_assert_kiln_error("kiln_prod", "operand a");
    ck_assert_ptr_null(kiln_sum(x, KILN_AXES(1, -2), false));
    ck_assert_kiln_error("kiln_sum", "axis 1 appears twice");
    ck_assert_ptr_null(kiln_mean(x, KILN_AXES(0, 5), false));
    ck_assert_kiln_error("kiln_mean", "axis 5 is out of range", "[2,3,4] f32");
    ck_assert_ptr_null(kiln_max(x, KILN_AXES(0, 9), false));
    ck_assert_kiln_error("kiln_max", "KILN_AXES takes");
    ck_assert_ptr_null(kiln_argmin(x, KILN_AXES(0, 1), false));
    ck_assert_kiln_error("kiln_argmin", "one axis");
    ck_assert_ptr_null(kiln_var(kiln_ones(KILN_I64, 1, (int64_t[]){2}), 0, 1, false));
    ck_assert_kiln_error("kiln_var", "floating point");
    ck_assert_ptr_null(kiln_any(x, 3, false));
    ck_assert_kiln_error("kiln_any", "axis");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_logsumexp(NULL, 0, false));
    ck_assert_kiln_error("kiln_logsumexp", "operand a");
}
END_TEST

/* Reductions over the last axis fuse with what feeds and follows them: var
 * is one kernel, logsumexp one, a sum over two trailing axes one. */
static kiln_tensor *fused_var(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_var(kiln_mul_scalar(in[0], 2), -1, 1, false);
}

static kiln_tensor *fused_lse(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_logsumexp(in[0], -1, true);
}

static kiln_tensor *fused_trailing(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_sum(in[0], KILN_AXES(-1, -2), false);
}

START_TEST(test_fusion)
{
    static const oc_fn fns[] = {fused_var, fused_lse, fused_trailing};
    kiln_tensor *x = kiln_randn(3, (int64_t[]){8, 16, 32}, 3);
    for (int i = 0; i < OC_COUNT(fns); i++) {
        int kernels = oc_kernels(fns[i], NULL, 1, &x);
        ck_assert_msg(kernels == 1 || kernels == -1, "case %d: %d kernels", i, kernels);
    }
}
END_TEST

static Suite *reductions_suite(void)
{
    Suite *s = suite_create("reductions");
    TCase *tc = tcase_create("reductions");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_reduction, 0, OC_COUNT(REDUCTIONS));
    tcase_add_loop_test(tc, test_reduction_edges, 0, OC_COUNT(REDUCTIONS));
    tcase_add_test(tc, test_pytorch_values);
    tcase_add_test(tc, test_var_mean);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_fusion);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(reductions_suite)
