/* kiln's own GEMM (the LLVM backend's generated products) against a naive
 * f64 loop and OpenBLAS: eager products of f32 and f64 over shapes of 0, 1,
 * primes and non-multiples of every block size, large K, transposed, strided
 * and reversed operands, broadcast batches; and traced products with every
 * kind of epilogue fused into them, and left operands computed while they
 * are packed (prologues), against eager. meson runs the suite with
 * KILN_MATMUL=kiln at 1, 2 and 3 threads.
 *
 * Tolerances: a product of inner dimension K summed in any order, with or
 * without fused multiply-adds, is within K u sum_k |a_ik b_kj| of the exact
 * value (u = 2^-24 for f32, 2^-53 for f64); kiln's GEMM is held to that
 * bound, and for random data of mean 0 to a sixteenth of it past K = 1024
 * (its error grows like sqrt(K) u there: the large-K test prints it). */
#include <cblas.h>
#include <float.h>

#include "test_common.h"

/* -- References -------------------------------------------------------------- */

/* t as doubles in row-major order of its shape, any layout. Tensors made
 * here and below belong to the test's scope. */
static double *values_of(kiln_tensor *t)
{
    return test_values(kiln_contiguous(t));
}

/* Matrix i of a batch of n_batch (row-major over batch_shape) of t's values,
 * broadcasting t's batch axes: the index of element (r, c) of that matrix. */
static int64_t at(const kiln_tensor *t, int batch_ndim, const int64_t *batch_shape, int64_t i, int64_t r, int64_t c)
{
    int nd = kiln_ndim(t), own = nd > 2 ? nd - 2 : 0;
    const int64_t *shape = kiln_shape(t);
    int64_t index = 0, stride = 1;
    if (nd == 1)
        return r + c; /* one of them is 0 */
    index = r * shape[nd - 1] + c;
    stride = shape[nd - 1] * shape[nd - 2];
    for (int d = batch_ndim - 1; d >= 0; d--) {
        int k = d - (batch_ndim - own);
        int64_t coord = i % batch_shape[d];
        i /= batch_shape[d];
        if (k < 0)
            continue;
        if (shape[k] != 1)
            index += coord * stride;
        stride *= shape[k];
    }
    return index;
}

typedef struct {
    double *exact, *bound; /* per element of the product: the value, and K u sum |a b| */
    int64_t n;
} reference;

/* The product of a and b in f64, and each element's error bound for a
 * product in dtype dt; want's shape gives the layout. */
static reference naive(kiln_tensor *a, kiln_tensor *b, kiln_tensor *want, kiln_dtype dt)
{
    double *av = values_of(a), *bv = values_of(b);
    int na = kiln_ndim(a), nb = kiln_ndim(b), nw = kiln_ndim(want);
    int64_t m = na == 1 ? 1 : kiln_shape(a)[na - 2], k = kiln_shape(a)[na - 1];
    int64_t n = nb == 1 ? 1 : kiln_shape(b)[nb - 1];
    int batch_ndim = nw - (na > 1) - (nb > 1);
    int64_t batches = 1;
    for (int d = 0; d < batch_ndim; d++)
        batches *= kiln_shape(want)[d];
    double u = dt == KILN_F32 ? 0x1p-24 : 0x1p-53;
    reference r = {malloc((size_t)(batches * m * n + 1) * sizeof(double)),
                   malloc((size_t)(batches * m * n + 1) * sizeof(double)), batches * m * n};
    for (int64_t i = 0; i < batches; i++)
        for (int64_t row = 0; row < m; row++)
            for (int64_t col = 0; col < n; col++) {
                double sum = 0, magnitude = 0;
                for (int64_t q = 0; q < k; q++) {
                    double x = av[at(a, batch_ndim, kiln_shape(want), i, na == 1 ? 0 : row, q)];
                    double y = bv[at(b, batch_ndim, kiln_shape(want), i, q, nb == 1 ? 0 : col)];
                    sum += x * y;
                    magnitude += fabs(x * y);
                }
                r.exact[(i * m + row) * n + col] = sum;
                r.bound[(i * m + row) * n + col] = (double)k * u * magnitude + DBL_MIN;
            }
    free(av);
    free(bv);
    return r;
}

/* got within each element's bound (scaled) of the reference. */
static void assert_within(kiln_tensor *got, const reference *r, double scale, const char *what)
{
    ck_assert_msg(got != NULL, "%s: %s", what, kiln_last_error());
    ck_assert_int_eq(kiln_numel(got), r->n);
    double *g = test_values(got);
    for (int64_t i = 0; i < r->n; i++)
        ck_assert_msg(fabs(g[i] - r->exact[i]) <= scale * r->bound[i], "%s: element %lld is %.17g, exact %.17g, bound %g",
                      what, (long long)i, g[i], r->exact[i], scale * r->bound[i]);
    free(g);
}

static void reference_free(reference *r)
{
    free(r->exact);
    free(r->bound);
}

/* OpenBLAS's product of the 2-d a and b (any strides), as a new tensor. */
static kiln_tensor *openblas(kiln_tensor *a, kiln_tensor *b)
{
    kiln_tensor *ca = kiln_contiguous(a), *cb = kiln_contiguous(b);
    int64_t m = kiln_shape(a)[0], k = kiln_shape(a)[1], n = kiln_shape(b)[1];
    size_t size = kiln_dtype_size(kiln_dtype_of(a));
    void *x = malloc((size_t)(m * k + 1) * size), *y = malloc((size_t)(k * n + 1) * size);
    void *z = calloc((size_t)(m * n + 1), size);
    kiln_copy_to_host(ca, x, (size_t)(m * k) * size);
    kiln_copy_to_host(cb, y, (size_t)(k * n) * size);
    if (m && n && k && kiln_dtype_of(a) == KILN_F32)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1, x, (int)k, y, (int)n, 0, z,
                    (int)n);
    else if (m && n && k)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1, x, (int)k, y, (int)n, 0, z,
                    (int)n);
    kiln_tensor *c = kiln_from_data(kiln_dtype_of(a), 2, (int64_t[]){m, n}, z);
    free(x);
    free(y);
    free(z);
    return c;
}

static kiln_tensor *random_of(kiln_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    kiln_tensor *r = kiln_randn(ndim, shape, seed);
    return dt == KILN_F32 ? r : kiln_cast(r, dt);
}

/* -- Shapes ------------------------------------------------------------------- */

/* 1, primes, and one past and one short of multiples of the host's tiles
 * (14 or 6 rows by 32, 16 or 8 columns) and k blocks (a multiple of 8);
 * last tiles at the bounds of the micro-kernel's shorter loops (at most 8
 * rows, one vector of columns: 16 or 8) and one past them, with k in one
 * block and in two; last a classifier's row, few multiply-adds over a large
 * B, which the threads split by columns. */
static const int64_t SIZES[][3] = {
    {1, 1, 1},   {1, 7, 1},    {7, 1, 13},    {2, 3, 5},    {13, 31, 17},  {14, 32, 8},   {15, 33, 9},
    {29, 65, 97}, {97, 61, 193}, {127, 1, 385}, {1, 251, 61}, {673, 47, 3}, {45, 129, 200}, {100, 100, 1025},
    {22, 48, 33}, {23, 49, 33}, {36, 24, 700}, {37, 25, 700}, {1, 1000, 2048},
};

START_TEST(test_products_match_references)
{
    kiln_dtype dt = _i % 2 ? KILN_F64 : KILN_F32;
    const int64_t *s = SIZES[_i / 2];
    int64_t m = s[0], n = s[1], k = s[2];
    kiln_tensor *a = random_of(dt, 2, (int64_t[]){m, k}, 1 + (uint64_t)_i);
    kiln_tensor *b = random_of(dt, 2, (int64_t[]){k, n}, 100 + (uint64_t)_i);
    kiln_tensor *got = kiln_matmul(a, b);
    char what[96];
    snprintf(what, sizeof what, "%s [%lld,%lld] @ [%lld,%lld]", kiln_dtype_name(dt), (long long)m, (long long)k,
             (long long)k, (long long)n);
    reference r = naive(a, b, got, dt);
    assert_within(got, &r, 1, what);
    assert_within(openblas(a, b), &r, 1, "OpenBLAS, the same bound");
    reference_free(&r);
}
END_TEST

/* K of 20000: the worst-case bound holds with room, and random data's
 * error stays near sqrt(K) u. */
START_TEST(test_large_k_error_is_stated)
{
    kiln_dtype dt = _i ? KILN_F64 : KILN_F32;
    int64_t m = 9, n = 37, k = UNDER_VALGRIND() ? 3000 : 20000;
    kiln_tensor *a = random_of(dt, 2, (int64_t[]){m, k}, 5), *b = random_of(dt, 2, (int64_t[]){k, n}, 6);
    kiln_tensor *got = kiln_matmul(a, b);
    reference r = naive(a, b, got, dt);
    assert_within(got, &r, 1.0 / 16, "large K within K u sum |a b| / 16");
    double *g = test_values(got), worst = 0;
    for (int64_t i = 0; i < r.n; i++)
        worst = fmax(worst, fabs(g[i] - r.exact[i]) / r.bound[i]);
    printf("gemm: K = %lld %s: largest error %.3g of K u sum|ab| (sqrt(K) u would be %.3g of it)\n", (long long)k,
           kiln_dtype_name(dt), worst, 1 / sqrt((double)k));
    free(g);
    reference_free(&r);
}
END_TEST

/* -- Layouts ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    kiln_tensor *(*a)(kiln_dtype dt);
    kiln_tensor *(*b)(kiln_dtype dt);
} layout_case;

static kiln_tensor *rows_17x40(kiln_dtype dt)
{
    return random_of(dt, 2, (int64_t[]){17, 40}, 11);
}

static kiln_tensor *cols_40x35(kiln_dtype dt)
{
    return random_of(dt, 2, (int64_t[]){40, 35}, 12);
}

static kiln_tensor *transposed_17x40(kiln_dtype dt)
{
    return kiln_transpose(random_of(dt, 2, (int64_t[]){40, 17}, 13), 0, 1);
}

static kiln_tensor *transposed_40x35(kiln_dtype dt)
{
    return kiln_transpose(random_of(dt, 2, (int64_t[]){35, 40}, 14), 0, 1);
}

/* Every other row and column of a larger matrix. */
static kiln_tensor *strided_17x40(kiln_dtype dt)
{
    kiln_tensor *big = random_of(dt, 2, (int64_t[]){34, 80}, 15);
    return kiln_slice(kiln_slice(big, 0, 0, 34, 2), 1, 1, 80, 2);
}

/* Rows and columns in reverse: negative strides. */
static kiln_tensor *reversed_40x35(kiln_dtype dt)
{
    kiln_tensor *x = random_of(dt, 2, (int64_t[]){40, 35}, 16);
    return kiln_slice(kiln_slice(x, 0, 39, -41, -1), 1, 34, -36, -1);
}

/* One row broadcast down: a row stride of 0. */
static kiln_tensor *expanded_17x40(kiln_dtype dt)
{
    return kiln_expand(random_of(dt, 2, (int64_t[]){1, 40}, 17), 2, (int64_t[]){17, 40});
}

static kiln_tensor *vector_40(kiln_dtype dt)
{
    return random_of(dt, 1, (int64_t[]){40}, 18);
}

/* A batch of one-row matrices. */
static kiln_tensor *batch_3x1x40(kiln_dtype dt)
{
    return random_of(dt, 3, (int64_t[]){3, 1, 40}, 26);
}

static kiln_tensor *batch_2x1x17x40(kiln_dtype dt)
{
    return random_of(dt, 4, (int64_t[]){2, 1, 17, 40}, 19);
}

static kiln_tensor *batch_3x40x35(kiln_dtype dt)
{
    return random_of(dt, 3, (int64_t[]){3, 40, 35}, 20);
}

/* A batch of 3 that is one matrix repeated: batch stride 0. */
static kiln_tensor *expanded_batch_3x40x35(kiln_dtype dt)
{
    return kiln_expand(random_of(dt, 3, (int64_t[]){1, 40, 35}, 21), 3, (int64_t[]){3, 40, 35});
}

static kiln_tensor *batch_3x17x40(kiln_dtype dt)
{
    return random_of(dt, 3, (int64_t[]){3, 17, 40}, 26);
}

/* The rows of each matrix 3 rows apart, interleaved with the other
 * matrices': a batch that is no block of rows. */
static kiln_tensor *interleaved_batch_3x17x40(kiln_dtype dt)
{
    return kiln_transpose(random_of(dt, 3, (int64_t[]){17, 3, 40}, 27), 0, 1);
}

static kiln_tensor *empty_0x40(kiln_dtype dt)
{
    return random_of(dt, 2, (int64_t[]){0, 40}, 22);
}

static kiln_tensor *empty_17x0(kiln_dtype dt)
{
    return random_of(dt, 2, (int64_t[]){17, 0}, 23);
}

static kiln_tensor *empty_0x35(kiln_dtype dt)
{
    return random_of(dt, 2, (int64_t[]){0, 35}, 24);
}

static kiln_tensor *empty_batch_0x17x40(kiln_dtype dt)
{
    return random_of(dt, 3, (int64_t[]){0, 17, 40}, 25);
}

static const layout_case LAYOUTS[] = {
    {"transposed a", transposed_17x40, cols_40x35},
    {"transposed b", rows_17x40, transposed_40x35},
    {"both transposed", transposed_17x40, transposed_40x35},
    {"strided a", strided_17x40, cols_40x35},
    {"reversed b", rows_17x40, reversed_40x35},
    {"expanded a", expanded_17x40, reversed_40x35},
    {"vector @ matrix", vector_40, cols_40x35},
    {"matrix @ vector", rows_17x40, vector_40},
    {"vector @ transposed b", vector_40, transposed_40x35},
    {"vector @ reversed b", vector_40, reversed_40x35},
    {"rows @ batch", batch_3x1x40, batch_3x40x35},
    {"batch broadcast", batch_2x1x17x40, batch_3x40x35},
    {"matrix @ batch", strided_17x40, batch_3x40x35},
    {"batch @ repeated matrix", batch_2x1x17x40, expanded_batch_3x40x35},
    {"batch @ matrix: one block of rows", batch_3x17x40, cols_40x35},
    {"batches @ matrix: one block of rows", batch_2x1x17x40, reversed_40x35},
    {"interleaved batch @ matrix", interleaved_batch_3x17x40, transposed_40x35},
    {"m = 0", empty_0x40, cols_40x35},
    {"k = 0: zeros", empty_17x0, empty_0x35},
    {"empty batch", empty_batch_0x17x40, cols_40x35},
};

START_TEST(test_layouts_match_references)
{
    const layout_case *c = &LAYOUTS[_i / 2];
    kiln_dtype dt = _i % 2 ? KILN_F64 : KILN_F32;
    kiln_tensor *a = c->a(dt), *b = c->b(dt);
    kiln_tensor *got = kiln_matmul(a, b);
    char what[96];
    snprintf(what, sizeof what, "%s (%s)", c->name, kiln_dtype_name(dt));
    ck_assert_msg(got != NULL, "%s: %s", what, kiln_last_error());
    reference r = naive(a, b, got, dt);
    assert_within(got, &r, 1, what);
    reference_free(&r);
}
END_TEST

/* -- Epilogues, traced ---------------------------------------------------------- */

typedef struct {
    const char *name;
    kiln_tensor *(*apply)(kiln_tensor *product, kiln_tensor *const *in);
} epilogue_case;

static kiln_tensor *bias_relu(kiln_tensor *p, kiln_tensor *const *in)
{
    return kiln_relu(kiln_add(p, in[2]));
}

static kiln_tensor *bias_gelu(kiln_tensor *p, kiln_tensor *const *in)
{
    return kiln_gelu(kiln_add(p, in[2]));
}

static kiln_tensor *residual(kiln_tensor *p, kiln_tensor *const *in)
{
    return kiln_add(p, in[3]);
}

static kiln_tensor *scale(kiln_tensor *p, kiln_tensor *const *in)
{
    (void)in;
    return kiln_mul_scalar(p, 0.125);
}

static kiln_tensor *cast(kiln_tensor *p, kiln_tensor *const *in)
{
    (void)in;
    return kiln_cast(p, kiln_dtype_of(p) == KILN_F32 ? KILN_F64 : KILN_F32);
}

static kiln_tensor *sigmoid_of_tanh(kiln_tensor *p, kiln_tensor *const *in)
{
    (void)in;
    return kiln_sigmoid(kiln_tanh(p));
}

static kiln_tensor *select_positive(kiln_tensor *p, kiln_tensor *const *in)
{
    return kiln_where(kiln_gt(p, in[3]), p, kiln_mul(in[3], in[2]));
}

/* A value per row (the first column of another input), broadcast along it. */
static kiln_tensor *row_scale_silu(kiln_tensor *p, kiln_tensor *const *in)
{
    return kiln_silu(kiln_mul(p, kiln_slice(in[3], -1, 0, 1, 1)));
}

static const epilogue_case EPILOGUES[] = {
    {"bias and relu", bias_relu},   {"bias and gelu", bias_gelu}, {"residual add", residual},
    {"scale", scale},               {"cast", cast},               {"sigmoid of tanh", sigmoid_of_tanh},
    {"where", select_positive},     {"row scale and silu", row_scale_silu},
};

/* Product shapes {batch, m, n, k}: tiles at every edge (the first: the one
 * valgrind runs), k past a block, a batch folded into rows, and a batch
 * large enough to be split across threads (2^21 multiply-adds and more),
 * and one row per matrix, each with a B of its own (right_operand), so the
 * batch is not folded into rows and B is read as it lies, not packed.
 * A product of one column is read with an inner stride of 0 and not fused:
 * n >= 2. */
static const int64_t EPILOGUE_SHAPES[][4] = {
    {2, 37, 33, 7}, {1, 1, 2, 1}, {1, 129, 100, 300}, {6, 15, 65, 40}, {8, 41, 70, 130}, {3, 1, 300, 1000},
};

typedef struct {
    const epilogue_case *e;
    kiln_dtype dt;
} epilogue_run;

/* B for shape sh: [k, n], or [batch, k, n] for one row per matrix. */
static kiln_tensor *right_operand(kiln_dtype dt, const int64_t *sh, uint64_t seed)
{
    int64_t batch = sh[0], m = sh[1], n = sh[2], k = sh[3];
    if (m == 1 && batch > 1)
        return random_of(dt, 3, (int64_t[]){batch, k, n}, seed);
    return random_of(dt, 2, (int64_t[]){k, n}, seed);
}

/* in: a [batch, m, k], b (right_operand), bias [n], other [batch, m, n]. */
static int product_with_epilogue(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const epilogue_run *r = user;
    out[0] = r->e->apply(kiln_matmul(in[0], in[1]), in);
    return out[0] ? 0 : -1;
}

/* body traced by the LLVM backend and run on in gives what it gives eagerly,
 * as one kernel: the product with all that surrounds it. */
static void check_one_kernel(const char *name, kiln_body body, int n_in, kiln_tensor *const *in, void *user,
                             kiln_dtype dt, const int64_t *shape)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_LLVM;
    o.strict = true;
    kiln_fn *f = kiln_jit(name, body, n_in, 1, user, &o);
    kiln_tensor *got = NULL, *want = NULL;
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", name, kiln_last_error());
    ck_assert_int_eq(body(in, &want, user), 0);
    char what[128];
    snprintf(what, sizeof what, "%s, %s [%lld,%lld,%lld] @ [%lld,%lld]", name, kiln_dtype_name(dt),
             (long long)shape[0], (long long)shape[1], (long long)shape[3], (long long)shape[3], (long long)shape[2]);
    double tol = dt == KILN_F32 ? 3e-5 : 1e-12;
    assert_close(got, want, tol, tol * (double)shape[3], what);
    kiln_fn_stats_t stats;
    ck_assert_int_eq(kiln_fn_stats(f, &stats), 0);
    ck_assert_msg(stats.kernels == 1, "%s: %d kernels, not the product's alone", what, stats.kernels);
    kiln_fn_free(f);
}

/* How many of EPILOGUE_SHAPES to run: compiles are slow under valgrind. */
static size_t shapes_to_run(void)
{
    return UNDER_VALGRIND() ? 1 : sizeof EPILOGUE_SHAPES / sizeof *EPILOGUE_SHAPES;
}

/* Whether case i of a loop over kinds and dtypes is left out under
 * valgrind, which runs every nth (a compile takes about 8 s there). */
static bool left_out_under_valgrind(int i, int n)
{
    return UNDER_VALGRIND() && i % n;
}

START_TEST(test_epilogues_fused_match_eager)
{
    epilogue_run run = {&EPILOGUES[_i / 2], _i % 2 ? KILN_F64 : KILN_F32};
    if (left_out_under_valgrind(_i, 8))
        return;
    for (size_t s = 0; s < shapes_to_run(); s++) {
        const int64_t *sh = EPILOGUE_SHAPES[s];
        int64_t batch = sh[0], m = sh[1], n = sh[2], k = sh[3];
        kiln_tensor *in[4] = {random_of(run.dt, 3, (int64_t[]){batch, m, k}, 31), right_operand(run.dt, sh, 32),
                              random_of(run.dt, 1, &n, 33),
                              random_of(run.dt, 3, (int64_t[]){batch, m, n}, 34)};
        check_one_kernel(run.e->name, product_with_epilogue, 4, in, &run, run.dt, sh);
    }
}
END_TEST

/* -- Prologues, traced ------------------------------------------------------------ */

/* A = left(x): computed while the product packs it. x is [batch, m, k]
 * ([batch, k, m] for the transposed case), of the other float dtype for
 * the cast. */
typedef struct {
    const char *name;
    kiln_tensor *(*left)(kiln_tensor *x, kiln_dtype dt);
    bool transposed, other_dtype;
} prologue_case;

static kiln_tensor *scale_shift(kiln_tensor *x, kiln_dtype dt)
{
    (void)dt;
    return kiln_add_scalar(kiln_mul_scalar(x, 0.5), 1);
}

static kiln_tensor *cast_to(kiln_tensor *x, kiln_dtype dt)
{
    return kiln_cast(x, dt);
}

static kiln_tensor *transpose_scale(kiln_tensor *x, kiln_dtype dt)
{
    (void)dt;
    return kiln_mul_scalar(kiln_transpose(x, -1, -2), 2);
}

static kiln_tensor *exp_relu(kiln_tensor *x, kiln_dtype dt)
{
    (void)dt;
    return kiln_relu(kiln_exp(x));
}

static const prologue_case PROLOGUES[] = {
    {"scale and shift", scale_shift, false, false},
    {"cast", cast_to, false, true},
    {"transposed and scaled", transpose_scale, true, false},
    {"exp and relu", exp_relu, false, false},
};

typedef struct {
    const prologue_case *c;
    kiln_dtype dt;
} prologue_run;

/* in: x, b [k, n], bias [n]; the bias and relu epilogue too. */
static int product_with_prologue(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const prologue_run *r = user;
    out[0] = kiln_relu(kiln_add(kiln_matmul(r->c->left(in[0], r->dt), in[1]), in[2]));
    return out[0] ? 0 : -1;
}

START_TEST(test_prologues_fused_match_eager)
{
    prologue_run run = {&PROLOGUES[_i / 2], _i % 2 ? KILN_F64 : KILN_F32};
    if (left_out_under_valgrind(_i, 4))
        return;
    for (size_t s = 0; s < shapes_to_run(); s++) {
        const int64_t *sh = EPILOGUE_SHAPES[s];
        int64_t batch = sh[0], m = sh[1], n = sh[2], k = sh[3];
        kiln_dtype x_dt = run.c->other_dtype ? (run.dt == KILN_F32 ? KILN_F64 : KILN_F32) : run.dt;
        int64_t x_shape[3] = {batch, run.c->transposed ? k : m, run.c->transposed ? m : k};
        kiln_tensor *in[3] = {random_of(x_dt, 3, x_shape, 41), right_operand(run.dt, sh, 42),
                              random_of(run.dt, 1, &n, 43)};
        check_one_kernel(run.c->name, product_with_prologue, 3, in, &run, run.dt, sh);
    }
}
END_TEST

/* -- Convolutions split across threads --------------------------------------------- */

typedef struct {
    kiln_conv2d_params p;
    int64_t batch, channels, side, out_channels, window;
} conv_case;

/* Few pixels and many output channels: on 2 or 3 threads the product is
 * split over rows, whose parts share B packed once through the window
 * (partial panels, padding, a stride, the images of a batch); a stem's
 * 7x7/2, packed from copies of the images made over the threads. */
static const conv_case CONV_CASES[] = {
    {{{1, 1}, {1, 1}, {1, 1}, 1}, 3, 48, 7, 128, 3},
    {{{1, 1}, {1, 1}, {1, 1}, 1}, 1, 48, 7, 128, 3},
    {{{2, 2}, {1, 1}, {1, 1}, 1}, 1, 48, 13, 128, 3},
    {{{2, 2}, {3, 3}, {1, 1}, 1}, 3, 3, 29, 64, 7},
};

/* Case c's image (in[0]) and filters (in[1]), random from seed. */
static void conv_inputs(const conv_case *c, kiln_dtype dt, uint64_t seed, kiln_tensor **in)
{
    in[0] = random_of(dt, 4, (int64_t[]){c->batch, c->channels, c->side, c->side}, seed);
    in[1] = random_of(dt, 4, (int64_t[]){c->out_channels, c->channels, c->window, c->window}, seed + 1);
}

static int conv_relu(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const conv_case *c = user;
    out[0] = kiln_relu(kiln_conv2d(in[0], in[1], NULL, &c->p));
    return out[0] ? 0 : -1;
}

START_TEST(test_conv_split_over_rows_matches_eager)
{
    const conv_case *c = &CONV_CASES[_i / 2];
    kiln_dtype dt = _i % 2 ? KILN_F64 : KILN_F32;
    if (left_out_under_valgrind(_i, 6))
        return;
    int64_t out_side = (c->side + 2 * c->p.padding[0] - c->window) / c->p.stride[0] + 1, w = c->window;
    kiln_tensor *in[2];
    conv_inputs(c, dt, 51, in);
    check_one_kernel("conv and relu", conv_relu, 2, in, (void *)c, dt,
                     (int64_t[]){c->batch, c->out_channels, out_side * out_side, c->channels * w * w});
}
END_TEST

/* Captured filters (kept packed between calls) over few pixels, with work
 * enough for 2 or 3 threads to split: as the product chooses, transposed
 * (KILN_GEMM_TURN=1: pixels as rows, each thread turning back its blocks of
 * sums) and plain (KILN_GEMM_TURN=0), each called three times (the second
 * call packs the panels it keeps, the third reads them). k of 576, 96,
 * 1152 and 180; pixels 49, 196, 49 and 25; a batch of 3 and, plain, a last
 * row tile of 300 - 21 x 14 = 6. */
static const conv_case CAPTURED_CASES[] = {
    {{{1, 1}, {1, 1}, {1, 1}, 1}, 2, 64, 7, 256, 3},
    {{{1, 1}, {0, 0}, {1, 1}, 1}, 1, 96, 14, 160, 1},
    {{{1, 1}, {1, 1}, {1, 1}, 1}, 1, 128, 7, 64, 3},
    {{{1, 1}, {1, 1}, {1, 1}, 1}, 3, 20, 5, 300, 3},
};

typedef struct {
    const conv_case *c;
    kiln_tensor *filters;
} captured_conv;

static int captured_conv_relu(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const captured_conv *cc = user;
    out[0] = kiln_relu(kiln_conv2d(in[0], cc->filters, NULL, &cc->c->p));
    return out[0] ? 0 : -1;
}

START_TEST(test_captured_conv_turned_across_threads_matches_eager)
{
    const conv_case *c = &CAPTURED_CASES[_i / 2];
    kiln_dtype dt = _i % 2 ? KILN_F64 : KILN_F32;
    if (left_out_under_valgrind(_i, 8))
        return;
    kiln_tensor *in[2];
    conv_inputs(c, dt, 61, in);
    captured_conv cc = {c, in[1]};
    kiln_tensor *x = in[0], *want = NULL;
    ck_assert_int_eq(captured_conv_relu(&x, &want, &cc), 0);
    double tol = dt == KILN_F32 ? 3e-5 : 1e-12;
    const char *turn[3] = {NULL, "1", "0"};
    for (int mode = 0; mode < 3; mode++) {
        if (turn[mode])
            setenv("KILN_GEMM_TURN", turn[mode], 1);
        kiln_jit_options o = kiln_jit_defaults();
        o.backend = KILN_BACKEND_LLVM;
        o.strict = true;
        kiln_fn *f = kiln_jit("captured conv and relu", captured_conv_relu, 1, 1, &cc, &o);
        for (int call = 0; call < 3; call++) {
            kiln_tensor *got = NULL;
            ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
            char what[96];
            snprintf(what, sizeof what, "case %d, %s, turn %s, call %d", _i / 2, kiln_dtype_name(dt),
                     turn[mode] ? turn[mode] : "chosen", call);
            assert_close(got, want, tol, tol * (double)(c->channels * c->window * c->window), what);
        }
        kiln_fn_free(f);
    }
    unsetenv("KILN_GEMM_TURN");
}
END_TEST

static Suite *gemm_suite(void)
{
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("products");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_add_loop_test(tc, test_products_match_references, 0, 2 * (int)(sizeof SIZES / sizeof *SIZES));
    tcase_add_loop_test(tc, test_large_k_error_is_stated, 0, 2);
    tcase_add_loop_test(tc, test_layouts_match_references, 0, 2 * (int)(sizeof LAYOUTS / sizeof *LAYOUTS));
    tcase_add_loop_test(tc, test_epilogues_fused_match_eager, 0, 2 * (int)(sizeof EPILOGUES / sizeof *EPILOGUES));
    tcase_add_loop_test(tc, test_prologues_fused_match_eager, 0, 2 * (int)(sizeof PROLOGUES / sizeof *PROLOGUES));
    tcase_add_loop_test(tc, test_conv_split_over_rows_matches_eager, 0, 2 * (int)(sizeof CONV_CASES / sizeof *CONV_CASES));
    tcase_add_loop_test(tc, test_captured_conv_turned_across_threads_matches_eager, 0,
                        2 * (int)(sizeof CAPTURED_CASES / sizeof *CAPTURED_CASES));
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(gemm_suite)
