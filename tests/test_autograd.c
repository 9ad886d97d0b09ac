/* Gradients: every differentiable op against central finite differences in
 * f64, traced gradients against eager ones, accumulation, no_grad, detach,
 * in-place refusals, and optimizers' traced steps against eager ones. */
#include <pthread.h>
#include <stdint.h>

#include "progen.h"
#include "test_common.h"

/* -- Inputs ------------------------------------------------------------------ */

/* values in [-2, 2], [0.5, 2], +-[0.3, 2]; ZEROS: ANY's but exact zeros at
 * every sixth element and the 14th (rows of 5 with one zero and with two) */
enum { ANY, POSITIVE, AWAY, ZEROS };

static double draw(uint64_t *state, int kind)
{
    *state = *state * 6364136223846793005u + 1442695040888963407u;
    double u = (double)(*state >> 11) / 9007199254740992.0;
    if (kind == POSITIVE)
        return 0.5 + 1.5 * u;
    if (kind == AWAY)
        return (u < 0.5 ? -1 : 1) * (0.3 + 1.7 * fabs(2 * u - 1));
    return 4 * u - 2;
}

typedef kiln_tensor *(*grad_expr)(kiln_tensor *const *x);

typedef struct {
    const char *name;
    grad_expr fn;
    int n_in;
    int ndim[3];
    int64_t shape[3][4];
    int kind;
} grad_case;

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* -- The cases ------------------------------------------------------------------ */

#define G(name, expr) \
    static kiln_tensor *name(kiln_tensor *const *x) { return expr; }
G(g_add, kiln_add(x[0], x[1]))
G(g_sub, kiln_sub(x[0], x[1]))
G(g_mul, kiln_mul(x[0], x[1]))
G(g_div, kiln_div(x[0], x[1]))
G(g_pow, kiln_pow(x[0], x[1]))
G(g_maximum, kiln_maximum(x[0], x[1]))
G(g_minimum, kiln_minimum(x[0], x[1]))
G(g_where, kiln_where(kiln_gt(x[0], x[1]), kiln_mul(x[0], x[1]), x[1]))
G(g_neg, kiln_neg(x[0]))
G(g_abs, kiln_abs(x[0]))
G(g_exp, kiln_exp(x[0]))
G(g_log, kiln_log(x[0]))
G(g_sqrt, kiln_sqrt(x[0]))
G(g_rsqrt, kiln_rsqrt(x[0]))
G(g_tanh, kiln_tanh(x[0]))
G(g_sigmoid, kiln_sigmoid(x[0]))
G(g_relu, kiln_relu(x[0]))
G(g_sin, kiln_sin(x[0]))
G(g_cos, kiln_cos(x[0]))
G(g_erf, kiln_erf(x[0]))
G(g_add_s, kiln_add_scalar(x[0], 2.5))
G(g_sub_s, kiln_sub_scalar(x[0], 3))
G(g_mul_s, kiln_mul_scalar(x[0], -1.5))
G(g_div_s, kiln_div_scalar(x[0], 0.7))
G(g_pow_s, kiln_pow_scalar(x[0], 3))
G(g_max_s, kiln_maximum_scalar(x[0], 0.1))
G(g_min_s, kiln_minimum_scalar(x[0], 0.1))
G(g_sum0, kiln_sum(x[0], 0, false))
G(g_sum1k, kiln_sum(x[0], -1, true))
G(g_sum_all, kiln_sum(x[0], KILN_ALL, false))
G(g_mean1, kiln_mean(x[0], 1, false))
G(g_mean_all, kiln_mean(x[0], KILN_ALL, true))
G(g_max1, kiln_max(x[0], 1, false))
G(g_min0k, kiln_min(x[0], 0, true))
G(g_max_all, kiln_max(x[0], KILN_ALL, false))
G(g_prod1, kiln_prod(x[0], 1, false))
G(g_prod0k, kiln_prod(x[0], 0, true))
G(g_prod_all, kiln_prod(x[0], KILN_ALL, false))
G(g_reshape, kiln_mul(kiln_reshape(x[0], 2, (int64_t[]){4, -1}), kiln_reshape(x[0], 2, (int64_t[]){4, -1})))
G(g_permute, kiln_mul(kiln_permute(x[0], (int[]){2, 0, 1}), x[1]))
G(g_transpose, kiln_matmul(kiln_transpose(x[0], 0, 1), x[0]))
G(g_expand, kiln_expand(x[0], 3, (int64_t[]){2, 3, 4}))
G(g_slice, kiln_slice(x[0], 1, 1, 5, 1))
G(g_slice_step, kiln_slice(x[0], 1, 0, 7, 3))
G(g_slice_back, kiln_slice(x[0], 1, 6, 0, -2))
G(g_slice_empty, kiln_add(kiln_sum(kiln_slice(x[0], 0, 2, 2, 1), KILN_ALL, false), kiln_sum(x[0], KILN_ALL, false)))
G(g_concat, kiln_concat((kiln_tensor *[]){x[0], x[1], x[0]}, 3, 1))
G(g_squeeze, kiln_unsqueeze(kiln_squeeze(x[0], 1), 0))
G(g_contiguous, kiln_contiguous(kiln_transpose(x[0], 0, 1)))
G(g_cast, kiln_cast(kiln_mul(x[0], x[0]), KILN_F64))
G(g_matmul, kiln_matmul(x[0], x[1]))
G(g_matmul_batch, kiln_matmul(x[0], x[1]))
G(g_matmul_row, kiln_matmul(x[0], x[1]))
G(g_matmul_col, kiln_matmul(x[0], x[1]))
G(g_matmul_dot, kiln_matmul(x[0], x[1]))
G(g_matmul_weight_view, kiln_matmul(kiln_transpose(x[0], 1, 2), x[1]))
G(g_softmax, kiln_softmax(x[0], -1))
G(g_log_softmax, kiln_log_softmax(x[0], 0))
G(g_layer_norm, kiln_layer_norm(x[0], x[1], x[2], 1e-5))
G(g_gelu, kiln_gelu(x[0]))
G(g_silu, kiln_silu(x[0]))
/* Index tensors of the indexing cases (repeats included: their gradients add). */
static kiln_tensor *index_2d(void)
{
    return kiln_from_data(KILN_I64, 2, (int64_t[]){3, 2}, (int64_t[]){0, 2, 1, 1, 3, 0});
}

static kiln_tensor *index_1d(void)
{
    return kiln_from_data(KILN_I64, 1, (int64_t[]){3}, (int64_t[]){2, 0, 2});
}

G(g_floor, kiln_add(x[0], kiln_floor(kiln_mul_scalar(x[0], 3))))
G(g_log1p, kiln_log1p(x[0]))
G(g_expm1, kiln_expm1(x[0]))
G(g_log2, kiln_log2(x[0]))
G(g_tan, kiln_tan(kiln_mul_scalar(x[0], 0.5)))
G(g_atan, kiln_atan(x[0]))
G(g_remainder, kiln_remainder(x[0], x[1]))
G(g_atan2, kiln_atan2(x[0], x[1]))
G(g_cumsum, kiln_cumsum(x[0], -1))
G(g_gather, kiln_gather(x[0], 1, index_2d()))
G(g_index_select, kiln_index_select(x[0], 0, index_1d()))
G(g_scatter_add, kiln_scatter_add(x[0], 1, index_2d(), x[1]))
G(g_twice, kiln_mul(kiln_sin(x[0]), kiln_mul(x[0], x[0])))
G(g_chain, kiln_sum(kiln_tanh(kiln_add(kiln_matmul(x[0], x[1]), x[2])), 0, false))

static const grad_case cases[] = {
    {"add", g_add, 2, {2, 1}, {{3, 4}, {4}}, ANY},
    {"sub", g_sub, 2, {2, 2}, {{2, 3}, {2, 1}}, ANY},
    {"mul", g_mul, 2, {2, 2}, {{3, 4}, {3, 1}}, ANY},
    {"div", g_div, 2, {2, 1}, {{3, 4}, {4}}, AWAY},
    {"pow", g_pow, 2, {2, 1}, {{3, 4}, {4}}, POSITIVE},
    {"maximum", g_maximum, 2, {2, 1}, {{3, 4}, {4}}, ANY},
    {"minimum", g_minimum, 2, {2, 2}, {{3, 4}, {3, 4}}, ANY},
    {"where", g_where, 2, {2, 1}, {{3, 4}, {4}}, ANY},
    {"neg", g_neg, 1, {2}, {{3, 4}}, ANY},
    {"abs", g_abs, 1, {2}, {{3, 4}}, AWAY},
    {"exp", g_exp, 1, {2}, {{3, 4}}, ANY},
    {"log", g_log, 1, {2}, {{3, 4}}, POSITIVE},
    {"sqrt", g_sqrt, 1, {2}, {{3, 4}}, POSITIVE},
    {"rsqrt", g_rsqrt, 1, {2}, {{3, 4}}, POSITIVE},
    {"tanh", g_tanh, 1, {2}, {{3, 4}}, ANY},
    {"sigmoid", g_sigmoid, 1, {2}, {{3, 4}}, ANY},
    {"relu", g_relu, 1, {2}, {{3, 4}}, AWAY},
    {"sin", g_sin, 1, {2}, {{3, 4}}, ANY},
    {"cos", g_cos, 1, {2}, {{3, 4}}, ANY},
    {"erf", g_erf, 1, {2}, {{3, 4}}, ANY},
    {"add_scalar", g_add_s, 1, {1}, {{5}}, ANY},
    {"sub_scalar", g_sub_s, 1, {0}, {{0}}, ANY},
    {"mul_scalar", g_mul_s, 1, {2}, {{2, 3}}, ANY},
    {"div_scalar", g_div_s, 1, {2}, {{2, 3}}, ANY},
    {"pow_scalar", g_pow_s, 1, {2}, {{2, 3}}, ANY},
    {"maximum_scalar", g_max_s, 1, {2}, {{2, 3}}, AWAY},
    {"minimum_scalar", g_min_s, 1, {2}, {{2, 3}}, AWAY},
    {"sum axis 0", g_sum0, 1, {3}, {{2, 3, 4}}, ANY},
    {"sum keepdim", g_sum1k, 1, {3}, {{2, 3, 4}}, ANY},
    {"sum all", g_sum_all, 1, {2}, {{3, 4}}, ANY},
    {"mean axis", g_mean1, 1, {3}, {{2, 3, 4}}, ANY},
    {"mean all keepdim", g_mean_all, 1, {2}, {{3, 4}}, ANY},
    {"max axis", g_max1, 1, {2}, {{3, 5}}, ANY},
    {"min keepdim", g_min0k, 1, {2}, {{3, 5}}, ANY},
    {"max all", g_max_all, 1, {2}, {{3, 5}}, ANY},
    {"prod axis", g_prod1, 1, {3}, {{2, 4, 3}}, ANY},
    {"prod keepdim", g_prod0k, 1, {2}, {{3, 4}}, ANY},
    {"prod all", g_prod_all, 1, {2}, {{2, 3}}, ANY},
    {"prod rows with zeros", g_prod1, 1, {2}, {{4, 5}}, ZEROS},
    {"prod all, one zero", g_prod_all, 1, {2}, {{2, 3}}, ZEROS},
    {"prod all, zeros", g_prod_all, 1, {2}, {{4, 5}}, ZEROS},
    {"reshape twice", g_reshape, 1, {3}, {{2, 2, 3}}, ANY},
    {"permute", g_permute, 2, {3, 2}, {{3, 4, 2}, {3, 1}}, ANY},
    {"transpose", g_transpose, 1, {2}, {{3, 4}}, ANY},
    {"expand", g_expand, 1, {2}, {{3, 1}}, ANY},
    {"slice", g_slice, 1, {2}, {{2, 7}}, ANY},
    {"slice step 3", g_slice_step, 1, {2}, {{2, 8}}, ANY},
    {"slice step -2", g_slice_back, 1, {2}, {{2, 8}}, ANY},
    {"slice empty", g_slice_empty, 1, {2}, {{3, 2}}, ANY},
    {"concat", g_concat, 2, {2, 2}, {{2, 3}, {2, 2}}, ANY},
    {"squeeze unsqueeze", g_squeeze, 1, {3}, {{3, 1, 2}}, ANY},
    {"contiguous", g_contiguous, 1, {2}, {{3, 4}}, ANY},
    {"cast", g_cast, 1, {2}, {{3, 4}}, ANY},
    {"matmul", g_matmul, 2, {2, 2}, {{3, 4}, {4, 5}}, ANY},
    {"matmul batched", g_matmul_batch, 2, {4, 3}, {{2, 1, 3, 4}, {3, 4, 2}}, ANY},
    {"matmul row", g_matmul_row, 2, {1, 3}, {{4}, {2, 4, 3}}, ANY},
    {"matmul column", g_matmul_col, 2, {3, 1}, {{2, 3, 4}, {4}}, ANY},
    {"matmul dot", g_matmul_dot, 2, {1, 1}, {{4}, {4}}, ANY},
    /* a matrix broadcast over a batch: its gradient one product over the batch's rows */
    {"matmul weight", g_matmul, 2, {4, 2}, {{2, 2, 3, 4}, {4, 5}}, ANY},
    {"matmul weight, a view", g_matmul_weight_view, 2, {3, 2}, {{2, 4, 3}, {4, 5}}, ANY},
    {"softmax", g_softmax, 1, {2}, {{3, 5}}, ANY},
    {"log_softmax", g_log_softmax, 1, {2}, {{3, 5}}, ANY},
    {"layer_norm", g_layer_norm, 3, {2, 1, 1}, {{3, 6}, {6}, {6}}, ANY},
    {"gelu", g_gelu, 1, {2}, {{3, 4}}, ANY},
    {"silu", g_silu, 1, {2}, {{3, 4}}, ANY},
    {"floor", g_floor, 1, {2}, {{3, 4}}, ANY},
    {"log1p", g_log1p, 1, {2}, {{3, 4}}, POSITIVE},
    {"expm1", g_expm1, 1, {2}, {{3, 4}}, ANY},
    {"log2", g_log2, 1, {2}, {{3, 4}}, POSITIVE},
    {"tan", g_tan, 1, {2}, {{3, 4}}, ANY},
    {"atan", g_atan, 1, {2}, {{3, 4}}, ANY},
    {"remainder", g_remainder, 2, {2, 1}, {{3, 4}, {4}}, POSITIVE},
    {"atan2", g_atan2, 2, {2, 2}, {{3, 4}, {3, 1}}, AWAY},
    {"cumsum", g_cumsum, 1, {2}, {{3, 5}}, ANY},
    {"gather", g_gather, 1, {2}, {{3, 4}}, ANY},
    {"index_select", g_index_select, 1, {2}, {{3, 4}}, ANY},
    {"scatter_add", g_scatter_add, 2, {2, 2}, {{3, 4}, {3, 3}}, ANY},
    {"same tensor twice", g_twice, 1, {2}, {{3, 4}}, ANY},
    {"chain", g_chain, 3, {2, 2, 1}, {{3, 4}, {4, 5}, {5}}, ANY},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* -- Harness ----------------------------------------------------------------- */

typedef struct {
    double *data[3];
    double *weights;
    int64_t out_ndim, out_shape[KILN_MAX_DIMS];
} case_data;

static void case_init(const grad_case *c, case_data *d, uint64_t seed)
{
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = numel_of(c->ndim[i], c->shape[i]);
        d->data[i] = malloc((size_t)(n ? n : 1) * sizeof(double));
        for (int64_t j = 0; j < n; j++)
            d->data[i][j] = c->kind == ZEROS && (j % 6 == 0 || j == 13) ? 0 : draw(&seed, c->kind);
    }
    kiln_scope_begin();
    kiln_tensor *x[3];
    for (int i = 0; i < c->n_in; i++)
        x[i] = kiln_from_data(KILN_F64, c->ndim[i], c->shape[i], d->data[i]);
    kiln_tensor *y = c->fn(x);
    ck_assert_msg(y, "%s: %s", c->name, kiln_last_error());
    d->out_ndim = kiln_ndim(y);
    memcpy(d->out_shape, kiln_shape(y), (size_t)d->out_ndim * sizeof(int64_t));
    kiln_scope_end();
    int64_t n = numel_of((int)d->out_ndim, d->out_shape);
    d->weights = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t j = 0; j < n; j++)
        d->weights[j] = draw(&seed, ANY);
}

static void case_free(const grad_case *c, case_data *d)
{
    for (int i = 0; i < c->n_in; i++)
        free(d->data[i]);
    free(d->weights);
}

/* sum(f(x) * w): a loss whose gradient at f's output is w. */
static kiln_tensor *weighted_loss(const grad_case *c, kiln_tensor *const *x, kiln_tensor *w)
{
    return kiln_sum(kiln_mul(c->fn(x), w), KILN_ALL, false);
}

static double loss_at(const grad_case *c, const case_data *d)
{
    kiln_scope_begin();
    kiln_tensor *x[3];
    for (int i = 0; i < c->n_in; i++)
        x[i] = kiln_from_data(KILN_F64, c->ndim[i], c->shape[i], d->data[i]);
    kiln_tensor *w = kiln_from_data(KILN_F64, (int)d->out_ndim, d->out_shape, d->weights);
    double loss = kiln_item(weighted_loss(c, x, w));
    kiln_scope_end();
    return loss;
}

/* The analytic gradients of every input, eagerly (new references). */
static void eager_grads(const grad_case *c, const case_data *d, kiln_tensor **grads)
{
    kiln_scope_begin();
    kiln_tensor *x[3];
    for (int i = 0; i < c->n_in; i++) {
        x[i] = kiln_from_data(KILN_F64, c->ndim[i], c->shape[i], d->data[i]);
        ck_assert_int_eq(kiln_requires_grad(x[i], true), 0);
    }
    kiln_tensor *w = kiln_from_data(KILN_F64, (int)d->out_ndim, d->out_shape, d->weights);
    kiln_tensor *loss = weighted_loss(c, x, w);
    ck_assert_msg(kiln_backward(loss) == 0, "%s: %s", c->name, kiln_last_error());
    for (int i = 0; i < c->n_in; i++) {
        grads[i] = kiln_keep(kiln_grad(x[i]));
        ck_assert_msg(grads[i], "%s: input %d has no gradient: %s", c->name, i, kiln_last_error());
    }
    kiln_scope_end();
}

static void check_finite_differences(const grad_case *c)
{
    case_data d;
    case_init(c, &d, 0x5eed + (uint64_t)(c - cases));
    kiln_tensor *grads[3];
    eager_grads(c, &d, grads);
    const double h = 1e-6;
    for (int i = 0; i < c->n_in; i++) {
        double *analytic = test_values(grads[i]);
        for (int64_t j = 0; j < numel_of(c->ndim[i], c->shape[i]); j++) {
            double keep = d.data[i][j];
            d.data[i][j] = keep + h;
            double up = loss_at(c, &d);
            d.data[i][j] = keep - h;
            double down = loss_at(c, &d);
            d.data[i][j] = keep;
            double numeric = (up - down) / (2 * h);
            ck_assert_msg(fabs(analytic[j] - numeric) <= 1e-6 + 1e-5 * fabs(numeric),
                          "%s: d/dx%d[%lld] is %.12g, finite differences %.12g", c->name, i, (long long)j,
                          analytic[j], numeric);
        }
        free(analytic);
        kiln_release(grads[i]);
    }
    case_free(c, &d);
}

START_TEST(finite_differences)
{
    check_finite_differences(&cases[_i]);
}
END_TEST

/* -- Traced against eager -------------------------------------------------------- */

/* in: the case's inputs then the weights; out: the inputs' gradients. */
static int traced_grads_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const grad_case *c = user;
    for (int i = 0; i < c->n_in; i++)
        if (kiln_requires_grad(in[i], true) < 0)
            return -1;
    if (kiln_backward(weighted_loss(c, in, in[c->n_in])) < 0)
        return -1;
    for (int i = 0; i < c->n_in; i++)
        if (!(out[i] = kiln_grad(in[i])))
            return -1;
    return 0;
}

static void check_traced(const grad_case *c, kiln_backend backend, double tol)
{
    case_data d;
    case_init(c, &d, 0xace + (uint64_t)(c - cases));
    kiln_tensor *want[3], *got[3] = {NULL, NULL, NULL}, *in[4];
    eager_grads(c, &d, want);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = backend;
    o.strict = true;
    kiln_fn *f = kiln_jit(c->name, traced_grads_body, c->n_in + 1, c->n_in, (void *)c, &o);
    for (int i = 0; i < c->n_in; i++)
        in[i] = kiln_from_data(KILN_F64, c->ndim[i], c->shape[i], d.data[i]);
    in[c->n_in] = kiln_from_data(KILN_F64, (int)d.out_ndim, d.out_shape, d.weights);
    for (int call = 0; call < 2; call++) { /* the trace, then the compiled graph alone */
        ck_assert_msg(kiln_call(f, in, got) == 0, "%s: %s", c->name, kiln_last_error());
        for (int i = 0; i < c->n_in; i++) {
            assert_close(got[i], want[i], tol, tol, c->name);
            kiln_release(got[i]);
        }
    }
    for (int i = 0; i < c->n_in; i++) {
        kiln_release(want[i]);
        kiln_release(in[i]);
    }
    kiln_release(in[c->n_in]);
    kiln_fn_free(f);
    case_free(c, &d);
}

START_TEST(traced_interp)
{
    check_traced(&cases[_i], KILN_BACKEND_INTERP, 1e-12);
}
END_TEST

START_TEST(traced_compiled)
{
    if (UNDER_VALGRIND())
        return;
    check_traced(&cases[_i], KILN_BACKEND_AUTO, 1e-9);
}
END_TEST

/* -- Random programs ------------------------------------------------------------- *
 * progen's programs over f64 inputs (every op differentiable), the gradient
 * of the sum of their outputs with respect to every input, traced against
 * eager. Inputs no output depends on get zeros. */

static int program_grads_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const progen_program *p = user;
    int n_in = progen_n_inputs(p);
    kiln_tensor *outs[PROGEN_MAX_OUTPUTS];
    for (int i = 0; i < n_in; i++)
        if (kiln_requires_grad(in[i], true) < 0)
            return -1;
    if (progen_run(p, in, outs) < 0)
        return -1;
    kiln_tensor *loss = kiln_sum(outs[0], KILN_ALL, false);
    for (int k = 1; k < progen_n_outputs(p); k++)
        loss = kiln_add(loss, kiln_sum(outs[k], KILN_ALL, false));
    if (kiln_needs_grad(loss) && kiln_backward(loss) < 0)
        return -1;
    for (int i = 0; i < n_in; i++) {
        out[i] = kiln_grad(in[i]);
        if (!out[i])
            out[i] = kiln_mul_scalar(kiln_detach(in[i]), 0); /* no path: zero (NaN stays NaN) */
        if (!out[i])
            return -1;
    }
    kiln_clear_error();
    return 0;
}

static void check_program(uint64_t seed, kiln_backend backend, double tol)
{
    progen_options opt = {.max_ops = 20, .dtypes = PROGEN_DTYPE_BIT(KILN_F64), .max_numel = 256,
                          .ops = PROGEN_ALL_OPS & ~PROGEN_MAKING_OPS};
    progen_program *p = progen_new(seed, &opt);
    ck_assert_ptr_nonnull(p);
    int n_in = progen_n_inputs(p);
    kiln_tensor *in[PROGEN_MAX_INPUTS], *plain[PROGEN_MAX_INPUTS], *want[PROGEN_MAX_INPUTS], *got[PROGEN_MAX_INPUTS];
    for (int i = 0; i < n_in; i++) {
        in[i] = progen_make_input(p, i, seed * 17 + (uint64_t)i);
        plain[i] = kiln_detach(in[i]);
    }
    char *listing = progen_describe(p);
    ck_assert_msg(program_grads_body(plain, want, p) == 0, "seed %llu eager: %s %s\n%s", (unsigned long long)seed,
                  kiln_last_error(), progen_last_error(), listing);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = backend;
    o.strict = true;
    kiln_fn *f = kiln_jit("grads", program_grads_body, n_in, n_in, p, &o);
    ck_assert_msg(kiln_call(f, in, got) == 0, "seed %llu traced: %s\n%s", (unsigned long long)seed,
                  kiln_last_error(), listing);
    for (int i = 0; i < n_in; i++) {
        char what[64];
        snprintf(what, sizeof what, "seed %llu, input %d", (unsigned long long)seed, i);
        assert_close(got[i], want[i], tol, tol, what);
        kiln_release(got[i]);
    }
    free(listing);
    kiln_fn_free(f);
    progen_free(p);
}

START_TEST(random_programs)
{
    int count = UNDER_VALGRIND() ? 10 : 60;
    for (int s = 1; s <= count; s++)
        check_program((uint64_t)s, KILN_BACKEND_INTERP, 1e-9);
}
END_TEST

START_TEST(random_programs_compiled)
{
    if (UNDER_VALGRIND())
        return;
    for (int s = 1; s <= 20; s++)
        check_program((uint64_t)s, KILN_BACKEND_AUTO, 1e-6);
}
END_TEST

/* -- Semantics ---------------------------------------------------------------- */

static kiln_tensor *leaf(int ndim, const int64_t *shape, uint64_t seed)
{
    kiln_tensor *t = kiln_cast(kiln_randn(ndim, shape, seed), KILN_F64);
    ck_assert_int_eq(kiln_requires_grad(t, true), 0);
    return t;
}

START_TEST(accumulates)
{
    kiln_tensor *x = leaf(1, (int64_t[]){5}, 1);
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(kiln_backward(kiln_sum(kiln_mul(x, x), KILN_ALL, false)), 0);
    assert_close(kiln_grad(x), kiln_mul_scalar(x, 4), 1e-15, 0, "two backward calls");
    ck_assert_int_eq(kiln_zero_grad(x), 0);
    ck_assert_ptr_null(kiln_grad(x));
    ck_assert_kiln_error("kiln_grad", "no gradient yet");
    ck_assert_int_eq(kiln_backward(kiln_sum(x, KILN_ALL, false)), 0);
    assert_close(kiln_grad(x), kiln_full(KILN_F64, 1, (int64_t[]){5}, 1), 0, 0, "after zero_grad");
}
END_TEST

/* A scope's tensor released early leaves its scope even while kiln holds it
 * (a gradient record's saved operand, a leaf's gradient, an optimizer's
 * parameter), so the scope's end never releases it a second time and what
 * kiln holds stays alive. */
START_TEST(early_release_of_tensors_kiln_holds)
{
    kiln_tensor *x = leaf(1, (int64_t[]){5}, 5);
    kiln_scope_begin();
    kiln_tensor *y = kiln_exp(x), *loss = kiln_sum(kiln_mul(y, y), KILN_ALL, false); /* mul saves y */
    kiln_release(y);
    ck_assert_int_eq(kiln_backward(loss), 0);
    kiln_tensor *g = kiln_grad(x);
    ck_assert_ptr_nonnull(g);
    kiln_release(g);
    kiln_scope_end();
    ck_assert_str_eq(kiln_last_error(), "");
    assert_close(kiln_grad(x), kiln_mul_scalar(kiln_exp(kiln_mul_scalar(x, 2)), 2), 1e-12, 0, "2 exp(2x)");

    kiln_scope_begin();
    kiln_tensor *p = kiln_randn(1, (int64_t[]){3}, 6);
    ck_assert_int_eq(kiln_requires_grad(p, true), 0);
    kiln_optimizer *o = kiln_sgd(&p, 1, 0.5, 0, 0, false);
    ck_assert_ptr_nonnull(o);
    kiln_release(p);
    kiln_scope_end();
    ck_assert_str_eq(kiln_last_error(), "");
    kiln_optimizer_free(o);
    ck_assert_str_eq(kiln_last_error(), "");
}
END_TEST

START_TEST(backward_with_seeds)
{
    kiln_tensor *x = leaf(2, (int64_t[]){2, 3}, 2);
    kiln_tensor *y = kiln_exp(x), *seed = kiln_cast(kiln_randn(2, (int64_t[]){2, 3}, 3), KILN_F64);
    ck_assert_int_eq(kiln_backward_with(&y, &seed, 1), 0);
    assert_close(kiln_grad(x), kiln_mul(kiln_exp(x), seed), 1e-7, 1e-7, "seeded");
    ck_assert_int_lt(kiln_backward_with(&y, NULL, 1), 0);
    ck_assert_kiln_error("kiln_backward", "outputs[0] [2,3] f64 is not 0-d");
    kiln_tensor *wrong = kiln_ones(KILN_F32, 1, (int64_t[]){3});
    ck_assert_int_lt(kiln_backward_with(&y, &wrong, 1), 0);
    ck_assert_kiln_error("kiln_backward", "grads[0] [3] f32 does not fit outputs[0] [2,3] f64");
}
END_TEST

START_TEST(no_grad_and_detach)
{
    kiln_tensor *x = leaf(1, (int64_t[]){4}, 4);
    kiln_no_grad_begin();
    kiln_tensor *quiet = kiln_mul(x, x);
    kiln_no_grad_end();
    ck_assert(!kiln_needs_grad(quiet));
    ck_assert_int_lt(kiln_backward(kiln_sum(quiet, KILN_ALL, false)), 0);
    ck_assert_kiln_error("kiln_backward", "does not need gradients");
    kiln_tensor *d = kiln_detach(kiln_mul(x, x));
    ck_assert(!kiln_needs_grad(d));
    ck_assert(kiln_shares_storage(d, d));
    ck_assert_int_eq(kiln_backward(kiln_sum(kiln_mul(d, x), KILN_ALL, false)), 0);
    assert_close(kiln_grad(x), kiln_mul(x, x), 1e-15, 0, "gradient stops at detach");
    kiln_no_grad_end();
    ck_assert_kiln_error("kiln_no_grad_end", "no kiln_no_grad_begin");
}
END_TEST

START_TEST(refusals)
{
    kiln_tensor *x = leaf(1, (int64_t[]){3}, 5);
    kiln_tensor *ints = kiln_arange(0, 3, 1, KILN_I64);
    ck_assert_int_lt(kiln_requires_grad(ints, true), 0);
    ck_assert_kiln_error("kiln_requires_grad", "not float");
    ck_assert_int_lt(kiln_backward(kiln_cast(kiln_argmax(x, 0, false), KILN_F64)), 0);
    ck_assert_kiln_error("kiln_backward", "does not need gradients");
    ck_assert_int_lt(kiln_backward(kiln_sum(kiln_argmax(x, KILN_ALL, false), KILN_ALL, false)), 0);
    ck_assert_kiln_error("kiln_backward", "not float", "integer");
    ck_assert_int_lt(kiln_backward(kiln_mul(x, x)), 0);
    ck_assert_kiln_error("kiln_backward", "not 0-d");
    ck_assert_int_lt(kiln_backward(NULL), 0);
    ck_assert_kiln_error("kiln_backward", "loss");
    kiln_tensor *y = kiln_mul(x, x);
    ck_assert_int_lt(kiln_requires_grad(y, false), 0);
    ck_assert_kiln_error("kiln_requires_grad", "only leaves", "kiln_mul");
    ck_assert_ptr_null(kiln_grad(y));
    ck_assert_kiln_error("kiln_grad", "not a leaf");
    /* in place: PyTorch refuses leaves that need gradients and values saved for them */
    ck_assert_int_lt(kiln_assign(x, kiln_zeros(KILN_F64, 1, (int64_t[]){3})), 0);
    ck_assert_kiln_error("kiln_assign", "dst [3] f64 needs gradients", "kiln_no_grad_begin");
    kiln_tensor *plain = kiln_ones(KILN_F64, 1, (int64_t[]){3});
    ck_assert_int_lt(kiln_assign(plain, y), 0);
    ck_assert_kiln_error("kiln_assign", "src [3] f64 needs gradients");
    kiln_tensor *z = kiln_sum(kiln_mul(x, plain), KILN_ALL, false);
    ck_assert_int_eq(kiln_assign(plain, kiln_zeros(KILN_F64, 1, (int64_t[]){3})), 0);
    ck_assert_int_lt(kiln_backward(z), 0);
    ck_assert_kiln_error("kiln_backward", "kiln_mul", "changed by kiln_assign");
    kiln_no_grad_begin();
    ck_assert_int_eq(kiln_assign(x, kiln_zeros(KILN_F64, 1, (int64_t[]){3})), 0);
    kiln_no_grad_end();
}
END_TEST

START_TEST(bad_arguments)
{
    kiln_tensor *x = leaf(1, (int64_t[]){3}, 9);
    kiln_clear_error();
    ck_assert_int_lt(kiln_requires_grad(NULL, true), 0);
    ck_assert_kiln_error("kiln_requires_grad", "t");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_grad(NULL));
    ck_assert_kiln_error("kiln_grad");
    kiln_clear_error();
    ck_assert_int_lt(kiln_zero_grad(NULL), 0);
    ck_assert_kiln_error("kiln_zero_grad");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_detach(NULL));
    ck_assert_kiln_error("kiln_detach");
    kiln_clear_error();
    ck_assert_int_lt(kiln_backward_with(NULL, NULL, 1), 0);
    ck_assert_kiln_error("kiln_backward", "outputs");
    kiln_clear_error();
    ck_assert_int_lt(kiln_backward_with(&x, NULL, 0), 0);
    ck_assert_kiln_error("kiln_backward_with", "at least one output");
    kiln_clear_error();
    ck_assert(!kiln_needs_grad(NULL));
    kiln_tensor *ints = kiln_arange(0, 3, 1, KILN_I32), *params[2] = {x, ints};
    kiln_clear_error();
    ck_assert_ptr_null(kiln_sgd(NULL, 1, 0.1, 0, 0, false));
    ck_assert_kiln_error("kiln_sgd", "params");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_sgd(params, 2, 0.1, 0, 0, false));
    ck_assert_kiln_error("kiln_sgd", "params[1] [3] i32 is not a float leaf");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_adamw((kiln_tensor *[]){x, x}, 2, 1e-3, 0.9, 0.999, 1e-8, 0));
    ck_assert_kiln_error("kiln_adamw", "params[0] and params[1] are the same tensor");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_sgd(params, 1, -0.1, 0, 0, false));
    ck_assert_kiln_error("kiln_sgd", "lr -0.1");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_sgd(params, 1, 0.1, 0, 0, true));
    ck_assert_kiln_error("kiln_sgd", "Nesterov");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_adamw(params, 1, 1e-3, 1, 0.999, 1e-8, 0));
    ck_assert_kiln_error("kiln_adamw", "beta1 1");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_adamw(params, 0, 1e-3, 0.9, 0.999, 1e-8, 0));
    ck_assert_kiln_error("kiln_adamw", "at least one parameter");
    kiln_clear_error();
    ck_assert_int_lt(kiln_optimizer_step(NULL), 0);
    ck_assert_kiln_error("kiln_optimizer_step", "o");
    kiln_clear_error();
    ck_assert_int_lt(kiln_optimizer_zero_grad(NULL), 0);
    kiln_clear_error();
    ck_assert_int_lt(kiln_optimizer_set_lr(NULL, 0.1), 0);
    kiln_clear_error();
    ck_assert_int_lt(kiln_optimizer_state_count(NULL), 0);
    kiln_clear_error();
    ck_assert_ptr_null(kiln_optimizer_state(NULL, 0));
    kiln_optimizer_free(NULL);
    kiln_optimizer *o = kiln_adamw(params, 1, 1e-3, 0.9, 0.999, 1e-8, 0);
    ck_assert_int_eq(kiln_optimizer_state_count(o), 6); /* exp_avg, exp_avg_sq, step, beta powers, lr */
    kiln_clear_error();
    ck_assert_ptr_null(kiln_optimizer_state(o, 6));
    ck_assert_kiln_error("kiln_optimizer_state", "state 6 is outside 0..5");
    kiln_clear_error();
    ck_assert_int_lt(kiln_optimizer_set_lr(o, NAN), 0);
    ck_assert_kiln_error("kiln_optimizer_set_lr", "lr nan");
    ck_assert_int_eq(kiln_optimizer_step(o), 0); /* no gradient yet: nothing moves */
    ck_assert_double_eq(kiln_item(kiln_optimizer_state(o, 2)), 0);
    ck_assert_int_eq(kiln_optimizer_set_lr(o, 0.5), 0);
    ck_assert_double_eq(kiln_item(kiln_optimizer_state(o, 5)), 0.5);
    kiln_optimizer_free(o);
    kiln_clear_error();
    ck_assert_ptr_null(kiln_clip_grad_norm(NULL, 1, 1));
    ck_assert_kiln_error("kiln_clip_grad_norm");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_clip_grad_norm(&x, 1, -1));
    ck_assert_kiln_error("kiln_clip_grad_norm", "max_norm");
}
END_TEST

/* Clipping: the norm before, and every gradient scaled by max_norm over it. */
START_TEST(clip_grad_norm)
{
    kiln_tensor *a = leaf(1, (int64_t[]){3}, 10), *b = leaf(2, (int64_t[]){2, 2}, 11), *params[2] = {a, b};
    kiln_tensor *loss = kiln_add(kiln_sum(kiln_mul_scalar(a, 3), KILN_ALL, false),
                                 kiln_sum(kiln_mul(b, b), KILN_ALL, false));
    ck_assert_int_eq(kiln_backward(loss), 0);
    double want = sqrt(27 + 4 * kiln_item(kiln_sum(kiln_mul(b, b), KILN_ALL, false)));
    kiln_tensor *norm = kiln_clip_grad_norm(params, 2, 1.0);
    ck_assert_msg(norm, "%s", kiln_last_error());
    ck_assert_double_eq_tol(kiln_item(norm), want, 1e-9 * want);
    kiln_tensor *ga = kiln_grad(a), *gb = kiln_grad(b);
    double after = sqrt(kiln_item(kiln_add(kiln_sum(kiln_mul(ga, ga), KILN_ALL, false),
                                           kiln_sum(kiln_mul(gb, gb), KILN_ALL, false))));
    ck_assert_double_eq_tol(after, 1.0, 1e-5);
    assert_close(gb, kiln_mul_scalar(b, 2 / (want + 1e-6)), 1e-12, 0, "b's gradient scaled");
    ck_assert_double_eq_tol(kiln_item(kiln_clip_grad_norm(params, 2, 10.0)), 1.0, 1e-5); /* under: unchanged */
    assert_close(kiln_grad(b), gb, 1e-12, 0, "under the bound");
}
END_TEST

/* A chain of n ops differentiated and freed on a thread with a small stack:
 * neither the walk nor the release of the record recurses along the chain. */
static void *deep_chain(void *arg)
{
    int n = *(int *)arg;
    kiln_tensor *w = kiln_ones(KILN_F32, 1, (int64_t[]){4}), *x = w;
    kiln_requires_grad(w, true);
    for (int i = 0; i < n; i++) {
        kiln_tensor *y = kiln_mul_scalar(x, 1.0);
        if (x != w)
            kiln_release(x);
        x = y;
    }
    kiln_tensor *loss = kiln_sum(x, KILN_ALL, false);
    kiln_release(x);
    int status = kiln_backward(loss);
    kiln_release(loss);
    kiln_tensor *g = kiln_grad(w), *total = g ? kiln_sum(g, KILN_ALL, false) : NULL;
    bool ok = status == 0 && total && kiln_item(total) == 4;
    kiln_release(total);
    kiln_release(g);
    kiln_release(w);
    return ok ? arg : NULL;
}

START_TEST(deep_chain_small_stack)
{
    int n = UNDER_VALGRIND() ? 5000 : 100000;
    pthread_attr_t attr;
    pthread_t thread;
    void *result = NULL;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    ck_assert_int_eq(pthread_create(&thread, &attr, deep_chain, &n), 0);
    ck_assert_int_eq(pthread_join(thread, &result), 0);
    pthread_attr_destroy(&attr);
    ck_assert_msg(result == &n, "a chain of %d ops: %s", n, kiln_last_error());
}
END_TEST

/* A traced loss's gradient accumulates over two backward calls in one body,
 * and a body that uses the same leaf twice sums both paths. */
static int twice_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *w = user;
    kiln_tensor *loss = kiln_sum(kiln_mul(kiln_mul(w, w), in[0]), KILN_ALL, false);
    if (kiln_backward(loss) < 0 || kiln_backward(loss) < 0)
        return -1;
    out[0] = kiln_grad(w);
    return out[0] ? 0 : -1;
}

START_TEST(traced_accumulates)
{
    kiln_tensor *w = leaf(1, (int64_t[]){4}, 6), *x = kiln_randn(1, (int64_t[]){4}, 7), *g = NULL;
    kiln_jit_options o = kiln_jit_defaults();
    o.strict = true;
    kiln_fn *f = kiln_jit("twice", twice_body, 1, 1, w, &o);
    for (int call = 0; call < 3; call++) {
        ck_assert_msg(kiln_call(f, &x, &g) == 0, "%s", kiln_last_error());
        assert_close(g, kiln_mul_scalar(kiln_mul(w, x), 4), 1e-6, 1e-6, "traced twice");
        kiln_release(g);
    }
    ck_assert_ptr_null(kiln_grad(w)); /* a trace's gradients stay in it */
    kiln_clear_error();
    kiln_fn_free(f);
}
END_TEST

/* A body that reads a value between its backward pass and its use of the
 * gradients breaks the trace there: the gradients carry over. */
static int break_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *w = user;
    kiln_tensor *loss = kiln_sum(kiln_exp(kiln_mul(w, in[0])), KILN_ALL, false);
    if (kiln_backward(loss) < 0)
        return -1;
    double scale = kiln_item(loss) > 0 ? 2 : 3; /* a graph break */
    out[0] = kiln_mul_scalar(kiln_grad(w), scale);
    return out[0] ? 0 : -1;
}

START_TEST(traced_gradient_across_a_break)
{
    kiln_tensor *w = leaf(1, (int64_t[]){4}, 12), *x = kiln_randn(1, (int64_t[]){4}, 13), *got = NULL;
    kiln_fn *f = kiln_jit("break", break_body, 1, 1, w, NULL);
    kiln_tensor *want = kiln_mul_scalar(kiln_mul(x, kiln_exp(kiln_mul(w, x))), 2);
    for (int call = 0; call < 2; call++) {
        ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
        assert_close(got, want, 1e-6, 1e-6, "across a break");
        kiln_release(got);
    }
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_int_ge(s.graph_breaks, 1);
    kiln_fn_free(f);
}
END_TEST

/* -- Training steps ---------------------------------------------------------- */

typedef struct {
    kiln_tensor *w1, *b1, *w2, *b2;
    kiln_optimizer *opt;
    bool clip;
} mlp;

static void mlp_init(mlp *m, int kind, kiln_device device)
{
    kiln_tensor *params[4];
    m->w1 = params[0] = kiln_keep(kiln_to_device(kiln_mul_scalar(kiln_randn(2, (int64_t[]){8, 16}, 11), 0.3), device));
    m->b1 = params[1] = kiln_keep(kiln_to_device(kiln_zeros(KILN_F32, 1, (int64_t[]){16}), device));
    m->w2 = params[2] = kiln_keep(kiln_to_device(kiln_mul_scalar(kiln_randn(2, (int64_t[]){16, 4}, 12), 0.3), device));
    m->b2 = params[3] = kiln_keep(kiln_to_device(kiln_zeros(KILN_F32, 1, (int64_t[]){4}), device));
    for (int i = 0; i < 4; i++)
        kiln_requires_grad(params[i], true);
    m->clip = kind == 2;
    if (kind == 0)
        m->opt = kiln_sgd(params, 4, 0.1, 0.9, 1e-3, false);
    else if (kind == 1)
        m->opt = kiln_sgd(params, 4, 0.05, 0.8, 0, true);
    else
        m->opt = kiln_adamw(params, 4, 1e-2, 0.9, 0.999, 1e-8, 1e-2);
    ck_assert_msg(m->opt, "%s", kiln_last_error());
}

static void mlp_free(mlp *m)
{
    kiln_optimizer_free(m->opt);
    kiln_release(m->w1);
    kiln_release(m->b1);
    kiln_release(m->w2);
    kiln_release(m->b2);
}

/* in: x [16,8] f32, one-hot labels [16,4] f32; out: the loss before the step. */
static int mlp_step(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    mlp *m = user;
    kiln_optimizer_zero_grad(m->opt);
    kiln_tensor *h = kiln_gelu(kiln_add(kiln_matmul(in[0], m->w1), m->b1));
    kiln_tensor *logp = kiln_log_softmax(kiln_add(kiln_matmul(h, m->w2), m->b2), -1);
    kiln_tensor *loss = kiln_neg(kiln_mean(kiln_sum(kiln_mul(logp, in[1]), -1, false), KILN_ALL, false));
    if (kiln_backward(loss) < 0)
        return -1;
    if (m->clip) {
        kiln_tensor *params[4] = {m->w1, m->b1, m->w2, m->b2};
        if (!kiln_clip_grad_norm(params, 4, 0.5))
            return -1;
    }
    if (kiln_optimizer_step(m->opt) < 0)
        return -1;
    out[0] = kiln_detach(loss);
    return out[0] ? 0 : -1;
}

static kiln_tensor *one_hot(int64_t n, int64_t classes, uint64_t seed)
{
    kiln_tensor *labels = kiln_cast(kiln_mul_scalar(kiln_rand(1, (int64_t[]){n}, seed), (double)classes), KILN_I64);
    kiln_tensor *range = kiln_arange(0, (double)classes, 1, KILN_I64);
    return kiln_cast(kiln_eq(kiln_unsqueeze(labels, 1), range), KILN_F32);
}

static void check_training(int kind, kiln_backend backend, kiln_device device)
{
    mlp eager, traced;
    mlp_init(&eager, kind, device);
    mlp_init(&traced, kind, device);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = backend;
    o.strict = true;
    kiln_fn *f = kiln_jit("mlp_step", mlp_step, 2, 1, &traced, &o);
    for (int step = 0; step < 20; step++) {
        kiln_scope_begin();
        kiln_tensor *in[2] = {kiln_to_device(kiln_randn(2, (int64_t[]){16, 8}, 100 + (uint64_t)step), device),
                              kiln_to_device(one_hot(16, 4, 200 + (uint64_t)step), device)};
        kiln_tensor *want = NULL, *got = NULL;
        if (step == 10) { /* a schedule: a new rate, not a new trace */
            ck_assert_int_eq(kiln_optimizer_set_lr(eager.opt, 0.02), 0);
            ck_assert_int_eq(kiln_optimizer_set_lr(traced.opt, 0.02), 0);
        }
        ck_assert_msg(mlp_step(in, &want, &eager) == 0, "eager: %s", kiln_last_error());
        ck_assert_msg(kiln_call(f, in, &got) == 0, "traced: %s", kiln_last_error());
        assert_close(got, want, 1e-4, 1e-5, "loss");
        kiln_release(got);
        kiln_release(want);
        kiln_scope_end();
    }
    assert_close(traced.w1, eager.w1, 1e-4, 1e-5, "w1 after 20 steps");
    assert_close(traced.b1, eager.b1, 1e-4, 1e-5, "b1 after 20 steps");
    assert_close(traced.w2, eager.w2, 1e-4, 1e-5, "w2 after 20 steps");
    assert_close(traced.b2, eager.b2, 1e-4, 1e-5, "b2 after 20 steps");
    for (int i = 0; i < kiln_optimizer_state_count(eager.opt); i++)
        assert_close(kiln_optimizer_state(traced.opt, i), kiln_optimizer_state(eager.opt, i), 1e-4, 1e-5, "state");
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_int_eq(s.traces, 1);
    ck_assert_int_eq(s.eager_fallbacks, 0);
    kiln_fn_free(f);
    mlp_free(&eager);
    mlp_free(&traced);
}

START_TEST(train_sgd_momentum)
{
    check_training(0, UNDER_VALGRIND() ? KILN_BACKEND_INTERP : KILN_BACKEND_AUTO, KILN_CPU);
}
END_TEST

START_TEST(train_sgd_nesterov)
{
    check_training(1, KILN_BACKEND_INTERP, KILN_CPU);
}
END_TEST

START_TEST(train_adamw_clipped)
{
    check_training(2, UNDER_VALGRIND() ? KILN_BACKEND_INTERP : KILN_BACKEND_AUTO, KILN_CPU);
}
END_TEST

/* The memory plan of a traced step holds no more than eager's peak of the
 * same step (its values and the gradients it keeps). */
START_TEST(traced_step_memory)
{
    mlp eager, traced;
    mlp_init(&eager, 2, KILN_CPU);
    mlp_init(&traced, 2, KILN_CPU);
    kiln_tensor *in[2] = {kiln_randn(2, (int64_t[]){16, 8}, 5), one_hot(16, 4, 6)}, *loss = NULL;
    int64_t base = kiln_live_bytes();
    kiln_reset_peak_live_bytes();
    kiln_scope_begin();
    ck_assert_int_eq(mlp_step(in, &loss, &eager), 0);
    kiln_scope_end();
    int64_t eager_peak = kiln_peak_live_bytes() - base; /* the scope released the loss */
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("mlp_step", mlp_step, 2, 1, &traced, &o);
    ck_assert_int_eq(kiln_call(f, in, &loss), 0);
    kiln_release(loss);
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_msg(s.peak_bytes > 0 && s.peak_bytes <= eager_peak, "traced step plans %lld bytes, eager's peak %lld",
                  (long long)s.peak_bytes, (long long)eager_peak);
    kiln_fn_free(f);
    mlp_free(&eager);
    mlp_free(&traced);
}
END_TEST

/* -- Writebacks written in place ------------------------------------------- *
 * A kernel whose value is written back to a capture writes it over the
 * capture (the update's new values take no memory, the writeback copies
 * nothing), unless a later kernel reads the capture. */

/* p = p - 0.5 * in[0]; the output p's sum before the update. */
static int update_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *p = user;
    out[0] = kiln_sum(p, KILN_ALL, false);
    return kiln_assign(p, kiln_sub(p, kiln_mul_scalar(in[0], 0.5)));
}

/* p = 2p, after taking p + 1, which a kernel after the update reads. */
static int read_after_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *p = user, *t = kiln_add_scalar(p, 1);
    if (kiln_assign(p, kiln_mul_scalar(p, 2)) < 0)
        return -1;
    out[0] = kiln_sum(kiln_mul(t, in[0]), -1, false);
    return out[0] ? 0 : -1;
}

/* Runs body twice traced and twice eagerly, on p and a copy of it,
 * comparing the outputs and p; returns the plan's peak, or -1 when the
 * kernels are not compiled. */
static int64_t check_writeback(kiln_body body, kiln_tensor *p)
{
    kiln_tensor *copy = kiln_contiguous(kiln_mul_scalar(p, 1)), *x = kiln_ones_like(p);
    kiln_jit_options o = kiln_jit_defaults();
    o.strict = true;
    kiln_fn *f = kiln_jit("writeback", body, 1, 1, p, &o);
    for (int call = 0; call < 2; call++) {
        kiln_tensor *got = NULL, *want = NULL;
        ck_assert_msg(kiln_call(f, &x, &got) == 0, "traced: %s", kiln_last_error());
        ck_assert_int_eq(body(&x, &want, copy), 0);
        assert_close(got, want, 1e-6, 1e-6, "output");
        assert_close(p, copy, 1e-6, 1e-6, "p written back");
        kiln_release(got);
        kiln_release(want);
    }
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    bool compiled = !strcmp(kiln_fn_backend(f), "llvm");
    kiln_fn_free(f);
    return compiled ? s.peak_bytes : -1;
}

START_TEST(writeback_in_place)
{
    enum { N = 64 };
    kiln_scope_begin();
    kiln_tensor *grid = kiln_mul_scalar(kiln_arange(0, N * N, 1, KILN_F32), 0.01);
    kiln_tensor *p = kiln_contiguous(kiln_reshape(grid, 2, (int64_t[]){N, N}));
    int64_t peak = check_writeback(update_body, p);
    ck_assert_msg(peak < N * N * 4, "the update planned %lld bytes: not written over p", (long long)peak);
    /* p + 1 is computed after the update, from the old p */
    check_writeback(read_after_body, p);
    kiln_scope_end();
}
END_TEST

/* -- On CUDA (a GPU, or the emulated driver: meson's autograd-emulated) -------- */

/* The case's gradients computed on CUDA, eagerly and traced, against the CPU's. */
/* The emulated driver: NVRTC compiles each new kernel, and the driver
 * interprets it, slowly; there every fourth case runs. */
static bool emulated_skips(int i)
{
    return getenv("FAKE_CUDA_KERNELS") && i % 4 != 0;
}

START_TEST(cuda_gradients)
{
    const grad_case *c = &cases[_i];
    bool host_index = c->fn == g_gather || c->fn == g_index_select || c->fn == g_scatter_add; /* CPU indices */
    if (!kiln_cuda_available() || emulated_skips(_i) || host_index)
        return;
    case_data d;
    case_init(c, &d, 0xc0da + (uint64_t)_i);
    kiln_tensor *want[3], *got[3] = {NULL, NULL, NULL}, *x[4];
    eager_grads(c, &d, want);
    for (int i = 0; i < c->n_in; i++) {
        x[i] = kiln_to_device(kiln_from_data(KILN_F64, c->ndim[i], c->shape[i], d.data[i]), KILN_CUDA);
        ck_assert_int_eq(kiln_requires_grad(x[i], true), 0);
    }
    x[c->n_in] = kiln_to_device(kiln_from_data(KILN_F64, (int)d.out_ndim, d.out_shape, d.weights), KILN_CUDA);
    ck_assert_msg(kiln_backward(weighted_loss(c, x, x[c->n_in])) == 0, "%s: %s", c->name, kiln_last_error());
    for (int i = 0; i < c->n_in; i++) {
        kiln_tensor *g = kiln_grad(x[i]);
        ck_assert_msg(g && kiln_device_of(g) == KILN_CUDA, "%s: %s", c->name, kiln_last_error());
        assert_close(g, want[i], 1e-9, 1e-9, c->name);
        kiln_zero_grad(x[i]);
        kiln_requires_grad(x[i], false);
    }
    kiln_jit_options o = kiln_jit_defaults();
    o.strict = true;
    kiln_fn *f = kiln_jit(c->name, traced_grads_body, c->n_in + 1, c->n_in, (void *)c, &o);
    ck_assert_msg(kiln_call(f, x, got) == 0, "%s: %s", c->name, kiln_last_error());
    for (int i = 0; i < c->n_in; i++) {
        assert_close(got[i], want[i], 1e-9, 1e-9, c->name);
        kiln_release(got[i]);
        kiln_release(want[i]);
    }
    kiln_fn_free(f);
    case_free(c, &d);
}
END_TEST

START_TEST(cuda_training)
{
    if (!kiln_cuda_available() || emulated_skips(2 * _i))
        return;
    check_training(_i, KILN_BACKEND_AUTO, KILN_CUDA);
}
END_TEST

/* -- Suite ------------------------------------------------------------------- */

static Suite *autograd_suite(void)
{
    Suite *s = suite_create("autograd");
    TCase *tc = tcase_create("gradients");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, finite_differences, 0, N_CASES);
    tcase_add_loop_test(tc, traced_interp, 0, N_CASES);
    tcase_add_loop_test(tc, traced_compiled, 0, N_CASES);
    tcase_add_test(tc, random_programs);
    tcase_add_test(tc, random_programs_compiled);
    tcase_add_test(tc, accumulates);
    tcase_add_test(tc, backward_with_seeds);
    tcase_add_test(tc, early_release_of_tensors_kiln_holds);
    tcase_add_test(tc, no_grad_and_detach);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, traced_accumulates);
    tcase_add_test(tc, traced_gradient_across_a_break);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, deep_chain_small_stack);
    tcase_add_test(tc, clip_grad_norm);
    tcase_add_test(tc, train_sgd_momentum);
    tcase_add_test(tc, train_sgd_nesterov);
    tcase_add_test(tc, train_adamw_clipped);
    tcase_add_test(tc, traced_step_memory);
    tcase_add_test(tc, writeback_in_place);
    tcase_add_loop_test(tc, cuda_gradients, 0, N_CASES);
    tcase_add_loop_test(tc, cuda_training, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(autograd_suite)
