/* Kernels of the kernel IR built by hand and compiled by src/codegen_llvm:
 * a streaming kernel's non-temporal stores, and its fallback when the
 * outputs are not aligned for them; and the GEMM compiled for named CPUs of
 * other vector widths than the host's, run here. */
#include "test_common.h"

#include <float.h>
#include <stdint.h>

#include "codegen_llvm/gemm.h"
#include "codegen_llvm/llvm.h"

/* out = in * 3 over rows x cols f32, both contiguous. */
static kx_kernel *triple_kernel(int64_t rows, int64_t cols)
{
    kx_kernel *k = kx_kernel_new(&(ir_sizes){0}, 2, (int64_t[]){rows, cols});
    k->n_buffers = 2;
    k->buffer_dtypes[0] = k->buffer_dtypes[1] = KILN_F32;
    k->exprs = calloc(3, sizeof *k->exprs);
    k->exprs[0] = (kx_expr){.kind = KX_LOAD, .dtype = KILN_F32, .view = 0};
    k->exprs[1] = (kx_expr){.kind = KX_CONST, .dtype = KILN_F32, .value = 3};
    k->exprs[2] = (kx_expr){.kind = KX_OP, .dtype = KILN_F32, .op = OP_MUL, .args = {0, 1}};
    k->n_exprs = k->exprs_cap = 3;
    k->views = calloc(2, sizeof *k->views);
    for (int v = 0; v < 2; v++)
        k->views[v] = (kx_view){.buffer = v, .dtype = KILN_F32, .outer_strides = {cols}, .inner_stride = 1};
    k->n_views = k->views_cap = 2;
    k->stores = calloc(1, sizeof *k->stores);
    k->stores[0] = (kx_store){.view = 1, .expr = 2};
    k->n_stores = k->stores_cap = 1;
    return k;
}

typedef struct {
    llvm_code *code;
    llvm_kernel_fn fn;
    char *ir_after;
} compiled;

static compiled compile(const kx_kernel *k, bool stream_stores)
{
    char err[512] = "";
    const llvm_target *host = llvm_target_get("host", err, sizeof err);
    ck_assert_msg(host != NULL, "%s", err);
    compiled c = {0};
    llvm_options opt = {.opt_level = 3, .stream_stores = stream_stores, .ir_after = &c.ir_after};
    void *object = NULL;
    size_t size = 0;
    ck_assert_msg(llvm_compile_object(k, "triple", host, &opt, &object, &size, err, sizeof err) == 0, "%s", err);
    c.code = llvm_load(object, size, "triple", &c.fn, err, sizeof err);
    ck_assert_msg(c.code != NULL, "%s", err);
    free(object);
    return c;
}

static void compiled_free(compiled *c)
{
    llvm_code_free(c->code);
    free(c->ir_after);
}

/* Runs c over rows x cols with the output shifted by shift floats from a
 * 64-byte boundary, in two calls as two threads would split the rows, and
 * checks every element. */
static void check_run(const compiled *c, int64_t rows, int64_t cols, int shift)
{
    size_t n = (size_t)(rows * cols);
    float *in = aligned_alloc(64, (n * sizeof(float) + 127) / 64 * 64);
    float *space = aligned_alloc(64, (n * sizeof(float) + 127) / 64 * 64), *out = space + shift;
    for (size_t i = 0; i < n; i++)
        in[i] = (float)i * 0.25f - 100.0f;
    void *buffers[2] = {in, out};
    c->fn(buffers, 0, rows / 2, NULL);
    c->fn(buffers, rows / 2, rows, NULL);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(out[i] == in[i] * 3.0f, "shift %d: element %zu is %g, not %g", shift, i, out[i], in[i] * 3.0f);
    free(in);
    free(space);
}

START_TEST(test_streaming_kernel_stores_non_temporal)
{
    kx_kernel *k = triple_kernel(6, 1024);
    compiled c = compile(k, true);
    ck_assert_msg(strstr(c.ir_after, "!nontemporal"), "no non-temporal store:\n%s", c.ir_after);
    ck_assert_ptr_nonnull(strstr(c.ir_after, "fence seq_cst"));
    check_run(&c, 6, 1024, 0);
    compiled_free(&c);
    kx_kernel_free(k);
}
END_TEST

/* Unaligned outputs take the plain body: the same values, no fault. */
START_TEST(test_streaming_kernel_runs_on_unaligned_outputs)
{
    static const int64_t cols[] = {1024, 1000, 17, 1};
    for (int i = 0; i < (int)(sizeof cols / sizeof *cols); i++) {
        kx_kernel *k = triple_kernel(5, cols[i]);
        compiled c = compile(k, true);
        for (int shift = 0; shift < 16; shift += 5)
            check_run(&c, 5, cols[i], shift);
        compiled_free(&c);
        kx_kernel_free(k);
    }
}
END_TEST

START_TEST(test_other_kernels_store_normally)
{
    kx_kernel *k = triple_kernel(6, 1024);
    compiled c = compile(k, false);
    ck_assert_msg(!strstr(c.ir_after, "!nontemporal"), "a non-temporal store:\n%s", c.ir_after);
    ck_assert_msg(!strstr(c.ir_after, "streaming"), "a streaming body:\n%s", c.ir_after);
    check_run(&c, 6, 1024, 0);
    compiled_free(&c);
    kx_kernel_free(k);
}
END_TEST

/* -- A row max that may drop NaN ------------------------------------------- */

/* What softmax-shaped kernels leave of each row, over rows x cols f32 (x in
 * buffer 0, rows in buffer 1, a value per row in buffer 2): */
typedef enum {
    SOFTMAX,          /* exp(x - max) in the sums' pass, rewritten divided by the sum */
    SOFTMAX_F64_SUM,  /* the same, summed in f64 */
    EXPONENTIALS,     /* exp(x - max) only: max's NaN needed */
    SHIFTED,          /* x - max in the store pass: max's NaN needed */
    MAX_STORED,       /* softmax, with the max stored as the row's value: max's NaN needed */
    MAX_USES,
} max_use;

static int add_expr(kx_kernel *k, kx_expr e)
{
    int i = kx_add_expr(k, e);
    ck_assert_int_ge(i, 0);
    return i;
}

static int op_of(kx_kernel *k, ir_op op, kiln_dtype dt, int a, int b)
{
    return add_expr(k, (kx_expr){.kind = KX_OP, .dtype = dt, .op = op, .args = {a, b, -1}});
}

static int cast_of(kx_kernel *k, kiln_dtype dt, int a)
{
    return add_expr(k, (kx_expr){.kind = KX_CAST, .dtype = dt, .args = {a, -1, -1}});
}

/* r0 = max x, r1 = sum exp(x - r0), and the stores of use. */
static kx_kernel *max_kernel(max_use use, int64_t rows, int64_t cols)
{
    kx_kernel *k = kx_kernel_new(&(ir_sizes){0}, 2, (int64_t[]){rows, cols});
    k->n_buffers = 3;
    k->buffer_dtypes[0] = k->buffer_dtypes[1] = k->buffer_dtypes[2] = KILN_F32;
    kiln_dtype sum_dt = use == SOFTMAX_F64_SUM ? KILN_F64 : KILN_F32;
    int x = add_expr(k, (kx_expr){.kind = KX_LOAD, .dtype = KILN_F32, .view = 0});
    int max = add_expr(k, (kx_expr){.kind = KX_ROW, .dtype = KILN_F32, .row = 0});
    int shifted = op_of(k, OP_SUB, KILN_F32, x, max), e = op_of(k, OP_EXP, KILN_F32, shifted, -1);
    int summed = sum_dt == KILN_F32 ? e : cast_of(k, sum_dt, e);
    int sum = add_expr(k, (kx_expr){.kind = KX_ROW, .dtype = sum_dt, .row = 1});
    int kept = add_expr(k, (kx_expr){.kind = KX_LOAD, .dtype = KILN_F32, .view = 1});
    int scaled = op_of(k, OP_DIV, KILN_F32, kept, sum_dt == KILN_F32 ? sum : cast_of(k, KILN_F32, sum));
    for (int v = 0; v < 2; v++)
        ck_assert_int_ge(kx_add_view(k, (kx_view){.buffer = v, .dtype = KILN_F32, .outer_strides = {cols},
                                                  .inner_stride = 1}), 0);
    k->reductions = calloc(2, sizeof *k->reductions);
    k->reductions[0] = (kx_reduction){.op = OP_MAX, .expr = x, .dtype = KILN_F32, .result = KILN_F32,
                                      .identity = kx_reduction_identity(OP_MAX, KILN_F32)};
    k->reductions[1] = (kx_reduction){.op = OP_SUM, .expr = summed, .dtype = sum_dt, .result = sum_dt,
                                      .identity = kx_reduction_identity(OP_SUM, sum_dt)};
    k->n_reductions = k->reductions_cap = 2;
    if (use != SHIFTED)
        ck_assert_int_ge(kx_add_store(k, (kx_store){.view = 1, .expr = e, .pass = kx_reduction_pass(1)}), 0);
    if (use != EXPONENTIALS)
        ck_assert_int_ge(kx_add_store(k, (kx_store){.view = 1, .expr = use == SHIFTED ? shifted : scaled}), 0);
    k->row_stores = calloc(1, sizeof *k->row_stores);
    int row = use == MAX_STORED ? 0 : 1;
    k->row_stores[0] = (kx_row_store){.buffer = 2, .row = row, .from = row ? sum_dt : KILN_F32, .dtype = KILN_F32,
                                      .expr = -1};
    k->n_row_stores = k->row_stores_cap = 1;
    return k;
}

/* Element j of the row each use leaves, in double, and the row's value,
 * computed here with a max that keeps NaN. */
static double expected(max_use use, const float *x, int64_t cols, int64_t j, double *row_value)
{
    double max = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; c++)
        max = isnan(x[c]) || isnan(max) ? NAN : fmax(max, x[c]);
    for (int64_t c = 0; c < cols; c++)
        sum += exp(x[c] - max);
    *row_value = use == MAX_STORED ? max : sum;
    if (use == EXPONENTIALS)
        return exp(x[j] - max);
    return use == SHIFTED ? x[j] - max : exp(x[j] - max) / sum;
}

static bool near(double got, double want, double rel)
{
    return isnan(want) ? isnan(got) : got == want || fabs(got - want) <= rel * fabs(want) + 1e-7;
}

/* A NaN in a row makes all of it NaN, whether the max may drop NaN (softmax:
 * its sum is NaN) or must keep it (the exponentials alone, x - max, the max
 * stored); the other rows (+inf, all -inf, a max of -0 beside +0) are as
 * before. With the max that drops NaN where it must not, the NaN row's
 * other elements come out finite. Compiled plain and streaming (softmax's
 * row kept in scratch; under valgrind softmax alone), each run over
 * outputs filled with a value no run leaves. */
START_TEST(test_row_max_drops_nan_only_where_it_cannot_show)
{
    enum { ROWS = 6, COLS = 100 };
    max_use use = (max_use)_i;
    _Alignas(64) float x[ROWS * COLS], out[ROWS * COLS], row_values[ROWS];
    for (int i = 0; i < ROWS * COLS; i++)
        x[i] = (float)(i % 13) * 0.5f - 3;
    x[1 * COLS + 40] = NAN;
    x[2 * COLS + 99] = NAN;
    x[3 * COLS + 5] = INFINITY;
    for (int j = 0; j < COLS; j++) {
        x[4 * COLS + j] = -INFINITY;
        x[5 * COLS + j] = j % 2 ? -0.0f : -(float)j;
    }
    x[5 * COLS + 50] = 0.0f;
    kx_kernel *k = max_kernel(use, ROWS, COLS);
    for (int stream = 0; stream < 2; stream++) { /* streaming: softmax's row kept in scratch (kx_kept_view) */
        if (stream && UNDER_VALGRIND() && use != SOFTMAX) /* a compile takes seconds */
            continue;
        compiled c = compile(k, stream);
        bool drops = strstr(c.ir_after, "maxnum") != NULL;
        ck_assert_msg(drops == (use == SOFTMAX || use == SOFTMAX_F64_SUM), "use %d: the max %s NaN", use,
                      drops ? "drops" : "keeps");
        for (int i = 0; i < ROWS * COLS; i++) /* the streaming run must write every element itself */
            out[i] = -12345;
        for (int r = 0; r < ROWS; r++)
            row_values[r] = -12345;
        void *buffers[3] = {x, out, row_values};
        c.fn(buffers, 0, ROWS, NULL);
        for (int r = 0; r < ROWS; r++) {
            double row_value;
            for (int j = 0; j < COLS; j++) {
                double want = expected(use, x + r * COLS, COLS, j, &row_value), got = out[r * COLS + j];
                ck_assert_msg(near(got, want, 1e-5), "use %d, stream %d, row %d, element %d: %g, not %g", use,
                              stream, r, j, got, want);
            }
            ck_assert_msg(near(row_values[r], row_value, 1e-5), "use %d, row %d's value: %g, not %g", use, r,
                          row_values[r], row_value);
        }
        compiled_free(&c);
    }
    kx_kernel_free(k);
}
END_TEST

/* The row a streaming kernel keeps in scratch (kx_kept_view): softmax's
 * exponentials, stored in its sum's pass and stored over after; not the
 * exponentials alone (never stored over: the output would never be
 * written), not x - max (stored in the store pass only), not rows past
 * 64 KiB, not where the output's buffer is also the input's (written in
 * place), whether read through another view or the same one, nor where a
 * row store writes its buffer or it is stored in two passes. */
START_TEST(test_kept_row_only_where_stored_over)
{
    static const struct {
        max_use use;
        int64_t cols;
        int kept;
    } cases[] = {{SOFTMAX, 100, 1}, {SOFTMAX_F64_SUM, 16384, 1}, {MAX_STORED, 100, 1},
                 {EXPONENTIALS, 100, -1}, {SHIFTED, 100, -1}, {SOFTMAX, 16385, -1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kx_kernel *k = max_kernel(cases[c].use, 4, cases[c].cols);
        ck_assert_msg(kx_kept_view(k) == cases[c].kept, "use %d, rows of %lld: kept %d", cases[c].use,
                      (long long)cases[c].cols, kx_kept_view(k));
        kx_kernel_free(k);
    }
    kx_kernel *k = max_kernel(SOFTMAX, 4, 100);
    k->views[1].buffer = 0; /* written over x, read through view 0 */
    ck_assert_int_eq(kx_kept_view(k), -1);
    for (int e = 0; e < k->n_exprs; e++) /* ... and through view 1, view 0 moved off it */
        if (k->exprs[e].kind == KX_LOAD)
            k->exprs[e].view = 1;
    k->views[0].buffer = 2;
    ck_assert_int_eq(kx_kept_view(k), -1);
    kx_kernel_free(k);
    k = max_kernel(SOFTMAX, 4, 100);
    k->row_stores[0].buffer = 1; /* a row value into the kept row's buffer */
    ck_assert_int_eq(kx_kept_view(k), -1);
    kx_kernel_free(k);
    k = max_kernel(SOFTMAX, 4, 100);
    int x = 0; /* the load of x, the first expression */
    ck_assert_int_ge(kx_add_store(k, (kx_store){.view = 1, .expr = x, .pass = kx_reduction_pass(0)}), 0);
    ck_assert_int_eq(kx_kept_view(k), -1);
    kx_kernel_free(k);
}
END_TEST

/* -- Products for named CPUs ------------------------------------------------ */

typedef struct {
    const char *target;
    int nr_f32;  /* the register tile's columns of f32 it must get: its vector width twice; 0: the host's */
    bool runs;   /* whether this CPU runs its code */
} gemm_target;

static gemm_target gemm_targets(int i)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    gemm_target t[3] = {{"host", 0, true},
                        {"cpu:x86-64", 8, true},
                        {"cpu:haswell", 16, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")}};
    return t[i];
#else
    gemm_target t[3] = {{"host", 0, true}, {"host", 0, true}, {"host", 0, true}};
    return t[i];
#endif
}

/* C = A @ B of m x k by k x n through g against a naive f64 loop, within
 * k u sum |a b| per element. */
static void check_gemm(const gemm_code *g, kiln_dtype dt, int64_t m, int64_t n, int64_t k, const char *what)
{
    size_t size = dt == KILN_F64 ? 8 : 4;
    double *x = malloc((size_t)(m * k) * sizeof(double)), *y = malloc((size_t)(k * n) * sizeof(double));
    char *a = malloc((size_t)(m * k) * size), *b = malloc((size_t)(k * n) * size), *c = malloc((size_t)(m * n) * size);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = dt == KILN_F64 ? sin((double)i) : (double)(float)sin((double)i);
    for (int64_t i = 0; i < k * n; i++)
        y[i] = dt == KILN_F64 ? cos((double)i * 0.7) : (double)(float)cos((double)i * 0.7);
    for (int64_t i = 0; i < m * k; i++)
        dt == KILN_F64 ? (void)(((double *)a)[i] = x[i]) : (void)(((float *)a)[i] = (float)x[i]);
    for (int64_t i = 0; i < k * n; i++)
        dt == KILN_F64 ? (void)(((double *)b)[i] = y[i]) : (void)(((float *)b)[i] = (float)y[i]);
    kg_matmul_args args = {.batch = 1, .m = m, .n = n, .k = k, .a_row = k, .a_col = 1, .b_row = n, .b_col = 1};
    char err[256] = "";
    ck_assert_msg(gemm_run(g, &args, a, b, c, NULL, NULL, err, sizeof err) == 0, "%s: %s", what, err);
    double u = dt == KILN_F64 ? 0x1p-53 : 0x1p-24;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0, magnitude = 0;
            for (int64_t q = 0; q < k; q++) {
                sum += x[i * k + q] * y[q * n + j];
                magnitude += fabs(x[i * k + q] * y[q * n + j]);
            }
            double got = dt == KILN_F64 ? ((double *)c)[i * n + j] : ((float *)c)[i * n + j];
            ck_assert_msg(fabs(got - sum) <= (double)k * u * magnitude + DBL_MIN, "%s: (%lld, %lld) is %.17g, not %.17g",
                          what, (long long)i, (long long)j, got, sum);
        }
    free(x);
    free(y);
    free(a);
    free(b);
    free(c);
}

/* The plain product compiled for a named CPU takes that CPU's vector width
 * (the x86-64 baseline's 128 bits, Haswell's 256, the host's own) and, where
 * this CPU runs it, multiplies as exactly as the bound says, across tile
 * edges and blocks of k. */
START_TEST(test_products_for_named_cpus_run_here)
{
    gemm_target t = gemm_targets(_i / 2);
    kiln_dtype dt = _i % 2 ? KILN_F64 : KILN_F32;
    char err[512] = "", what[96];
    const llvm_target *target = llvm_target_get(t.target, err, sizeof err);
    ck_assert_msg(target != NULL, "%s: %s", t.target, err);
    llvm_options opt = {.opt_level = 3};
    void *object = NULL;
    size_t size = 0;
    ck_assert_msg(llvm_compile_gemm(dt, "named", target, &opt, &object, &size, err, sizeof err) == 0, "%s: %s",
                  t.target, err);
    gemm_code g;
    llvm_code *code = t.runs ? gemm_load(object, size, "named", NULL, 0, NULL, &g, err, sizeof err) : NULL;
    ck_assert_msg(code || !t.runs, "%s: %s", t.target, err);
    free(object);
    if (!code)
        return;
    if (t.nr_f32)
        ck_assert_int_eq(g.nr, dt == KILN_F64 ? t.nr_f32 / 2 : t.nr_f32);
    snprintf(what, sizeof what, "%s %s (%d x %d tiles)", t.target, dt == KILN_F64 ? "f64" : "f32", g.mr, g.nr);
    check_gemm(&g, dt, 37, 45, 70, what);
    check_gemm(&g, dt, 1, 3, 1100, what);
    llvm_code_free(code);
}
END_TEST

static Suite *llvm_codegen_suite(void)
{
    Suite *s = suite_create("llvm_codegen");
    TCase *tc = tcase_create("streaming");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_streaming_kernel_stores_non_temporal);
    tcase_add_test(tc, test_streaming_kernel_runs_on_unaligned_outputs);
    tcase_add_test(tc, test_other_kernels_store_normally);
    tcase_add_loop_test(tc, test_row_max_drops_nan_only_where_it_cannot_show, 0, MAX_USES);
    tcase_add_test(tc, test_kept_row_only_where_stored_over);
    suite_add_tcase(s, tc);
    TCase *named = tcase_create("named");
    tcase_set_timeout(named, 120);
    tcase_add_loop_test(named, test_products_for_named_cpus_run_here, 0, 6);
    suite_add_tcase(s, named);
    return s;
}

KILN_TEST_MAIN(llvm_codegen_suite)
