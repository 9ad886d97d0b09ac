/* Batched matrix products: floats on kiln's generated GEMM or OpenBLAS (the
 * rule is in gemm.c), exact loops for integers.
 *
 * kiln's GEMM reads any strides and runs a whole batch at once. For
 * OpenBLAS, operands keep their layout when BLAS can read it (row-major or
 * transposed, any leading dimension); anything else is copied once. When b
 * has no batch axes and a's batch is contiguous, the whole batch is one GEMM
 * with M multiplied by the batch size. A traced epilogue may ask for the
 * product in blocks of rows, each GEMM followed by the epilogue on its
 * block. */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "eager/internal.h"

typedef struct {
    const kiln_tensor *t;
    int batch_ndim;
    int64_t batch_strides[KILN_MAX_DIMS]; /* over the output's batch shape */
    int64_t rows, cols, row_stride, col_stride;
} matrix_operand;

typedef struct {
    int batch_ndim;
    int64_t batch_shape[KILN_MAX_DIMS];
    int64_t batches, m, n, k;
} matmul_shape;

static kiln_tensor *fail_shapes(const char *fn, const kiln_tensor *a, const kiln_tensor *b,
                                const char *why)
{
    char da[DESCRIBE_MAX], db[DESCRIBE_MAX];
    core_fail(CORE_SHAPE, fn, "shapes %s and %s: %s", describe(da, a), describe(db, b), why);
    return NULL;
}

/* Matrix dims of t, seeing a 1-d a as [1,k] and a 1-d b as [k,1]. */
static void matrix_dims(const kiln_tensor *t, bool is_left, matrix_operand *op)
{
    op->t = t;
    if (t->ndim == 1) {
        op->rows = is_left ? 1 : t->shape[0];
        op->cols = is_left ? t->shape[0] : 1;
        op->row_stride = is_left ? t->shape[0] * t->strides[0] : t->strides[0];
        op->col_stride = is_left ? t->strides[0] : 1;
        return;
    }
    op->rows = t->shape[t->ndim - 2];
    op->cols = t->shape[t->ndim - 1];
    op->row_stride = t->strides[t->ndim - 2];
    op->col_stride = t->strides[t->ndim - 1];
}

/* The product's shape: the batch shape, then m and n unless a 1-d operand drops them. */
static int out_shape(const kiln_tensor *a, const kiln_tensor *b, const matmul_shape *s, int64_t *shape)
{
    int n = s->batch_ndim;
    memcpy(shape, s->batch_shape, (size_t)n * sizeof *shape);
    if (a->ndim > 1)
        shape[n++] = s->m;
    if (b->ndim > 1)
        shape[n++] = s->n;
    return n;
}

/* The broadcast batch shape and the batch count, m, n and k already set;
 * fn's error when the batch axes do not broadcast or the product is too large. */
static int batch_shape(const char *fn, const kiln_tensor *a, const kiln_tensor *b, matmul_shape *s)
{
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
    s->batch_ndim = na > nb ? na : nb;
    for (int d = 0; d < s->batch_ndim; d++) {
        int ka = d - (s->batch_ndim - na), kb = d - (s->batch_ndim - nb);
        int64_t sa = ka < 0 ? 1 : a->shape[ka], sb = kb < 0 ? 1 : b->shape[kb];
        if (sa != sb && sa != 1 && sb != 1) {
            fail_shapes(fn, a, b, "batch dimensions do not broadcast");
            return -CORE_SHAPE;
        }
        s->batch_shape[d] = sa == 1 ? sb : sa;
    }
    int64_t shape[KILN_MAX_DIMS], numel;
    int ndim = out_shape(a, b, s, shape);
    if (!ir_shape_numel(ndim, shape, &numel)) {
        char buf[CORE_SHAPE_STR_MAX], why[CORE_SHAPE_STR_MAX + 48];
        snprintf(why, sizeof why, "the product %s has more than 2^59 elements", core_shape_str(buf, ndim, shape));
        fail_shapes(fn, a, b, why);
        return -CORE_SHAPE;
    }
    s->batches = 1; /* bounded: the batch sizes are among the product's */
    for (int d = 0; d < s->batch_ndim; d++)
        s->batches *= s->batch_shape[d];
    return 0;
}

static void batch_strides(matrix_operand *op, const matmul_shape *s)
{
    int own = op->t->ndim > 2 ? op->t->ndim - 2 : 0;
    for (int d = 0; d < s->batch_ndim; d++) {
        int k = d - (s->batch_ndim - own);
        op->batch_strides[d] = k < 0 || op->t->shape[k] == 1 ? 0 : op->t->strides[k];
    }
}

/* Offset in elements of batch number i of op. */
static int64_t batch_offset(const matrix_operand *op, const matmul_shape *s, int64_t i)
{
    int64_t offset = op->t->offset;
    for (int d = s->batch_ndim - 1; d >= 0; d--) {
        offset += i % s->batch_shape[d] * op->batch_strides[d];
        i /= s->batch_shape[d];
    }
    return offset;
}

/* -- Floats through BLAS --------------------------------------------------- */

/* The BLAS view of a matrix: transposed or not, and its leading dimension;
 * false when BLAS cannot read the layout. */
static bool blas_layout(const matrix_operand *op, bool *trans, int64_t *ld)
{
    int64_t rows = op->rows, cols = op->cols;
    if (op->col_stride == 1 || cols == 1) {
        *trans = false;
        *ld = rows == 1 ? (cols > 1 ? cols : 1) : op->row_stride;
        if (*ld >= (cols > 1 ? cols : 1))
            return true;
    }
    if (op->row_stride == 1 || rows == 1) {
        *trans = true;
        *ld = cols == 1 ? (rows > 1 ? rows : 1) : op->col_stride;
        return *ld >= (rows > 1 ? rows : 1);
    }
    return false;
}

/* Blocks of rows and what runs on each (after NULL: the whole product at once). */
typedef struct {
    int64_t rows;
    eager_rows_fn after;
    void *ctx;
} row_blocks;

typedef struct {
    matrix_operand a, b;
    matmul_shape s;
    bool ta, tb;
    int64_t lda, ldb;
    char *out;
    row_blocks blocks;
    bool own; /* on kiln's GEMM */
} gemm_job;

/* One GEMM of m rows on kiln's GEMM, which only fails out of memory: BLAS
 * computes it then. */
static bool own_gemm(const gemm_job *j, int64_t m, const char *a, const char *b, char *c)
{
    kg_matmul_args args = {.batch = 1, .m = m, .n = j->s.n, .k = j->s.k, .a_row = j->ta ? 1 : j->lda,
                           .a_col = j->ta ? j->lda : 1, .b_row = j->tb ? 1 : j->ldb, .b_col = j->tb ? j->ldb : 1};
    return j->own && eager_gemm_run("kiln_matmul", j->a.t->dtype, &args, c, a, b) > 0;
}

static void gemm_one(const gemm_job *j, int64_t m, const char *a, const char *b, char *c)
{
    if (own_gemm(j, m, a, b, c))
        return;
    enum CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = j->tb ? CblasTrans : CblasNoTrans;
    if (j->a.t->dtype == KILN_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)j->s.n, (int)j->s.k, 1.0f,
                    (const float *)a, (int)j->lda, (const float *)b, (int)j->ldb, 0.0f,
                    (float *)c, (int)j->s.n);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)j->s.n, (int)j->s.k, 1.0,
                    (const double *)a, (int)j->lda, (const double *)b, (int)j->ldb, 0.0,
                    (double *)c, (int)j->s.n);
}

/* a's batch and rows walk memory as one row-major [batches*m, k] matrix with
 * the leading dimension BLAS reads (lda), and b is the same for every batch. */
static bool batch_folds_into_rows(const gemm_job *j)
{
    if (j->ta || j->s.batch_ndim == 0 || j->s.batches * j->s.m > INT_MAX)
        return false;
    for (int d = 0; d < j->s.batch_ndim; d++)
        if (j->b.batch_strides[d] != 0)
            return false;
    int64_t step = j->lda * j->s.m;
    for (int d = j->s.batch_ndim - 1; d >= 0; d--) {
        if (j->s.batch_shape[d] != 1 && j->a.batch_strides[d] != step)
            return false;
        step *= j->s.batch_shape[d];
    }
    return true;
}

/* rows x n of the product from a's row first_row (of the output's rows
 * seen as [batches * m, n]), by block as j asks. */
static void gemm_rows(const gemm_job *j, int64_t rows, int64_t first_row, const char *a, const char *b)
{
    int64_t size = (int64_t)eager_dtype_size(j->a.t->dtype);
    int64_t block = j->blocks.after ? j->blocks.rows : rows, a_row = j->ta ? 1 : j->lda;
    for (int64_t r = 0; r < rows; r += block) {
        int64_t count = rows - r < block ? rows - r : block;
        gemm_one(j, count, a + r * a_row * size, b, j->out + (first_row + r) * j->s.n * size);
        if (j->blocks.after)
            j->blocks.after(j->blocks.ctx, j->out, first_row + r, first_row + r + count);
    }
}

static void gemm_batches(gemm_job *j)
{
    size_t size = eager_dtype_size(j->a.t->dtype);
    char *a_base = j->a.t->storage->data, *b_base = j->b.t->storage->data;
    if (batch_folds_into_rows(j)) {
        gemm_rows(j, j->s.batches * j->s.m, 0, a_base + j->a.t->offset * (int64_t)size,
                  b_base + j->b.t->offset * (int64_t)size);
        return;
    }
    for (int64_t i = 0; i < j->s.batches; i++)
        gemm_rows(j, j->s.m, i * j->s.m, a_base + batch_offset(&j->a, &j->s, i) * (int64_t)size,
                  b_base + batch_offset(&j->b, &j->s, i) * (int64_t)size);
}

/* -- Integers, exactly ----------------------------------------------------- */

#define INT_GEMM(T, U)                                                               \
    static void int_gemm_##T(const matrix_operand *a, const matrix_operand *b,       \
                             const matmul_shape *s, T *out)                          \
    {                                                                                \
        const T *ad = (const T *)a->t->storage->data, *bd = (const T *)b->t->storage->data; \
        for (int64_t i = 0; i < s->batches; i++) {                                   \
            const T *x = ad + batch_offset(a, s, i), *y = bd + batch_offset(b, s, i);   \
            T *c = out + i * s->m * s->n;                                            \
            for (int64_t r = 0; r < s->m; r++) {                                     \
                U *row = (U *)(c + r * s->n);                                        \
                memset(row, 0, (size_t)s->n * sizeof(T));                            \
                for (int64_t q = 0; q < s->k; q++) {                                 \
                    U v = (U)x[r * a->row_stride + q * a->col_stride];               \
                    const T *yrow = y + q * b->row_stride;                           \
                    for (int64_t col = 0; col < s->n; col++)                         \
                        row[col] += v * (U)yrow[col * b->col_stride];                \
                }                                                                    \
            }                                                                        \
        }                                                                            \
    }
typedef int32_t i32;
typedef int64_t i64;
INT_GEMM(i32, uint32_t)
INT_GEMM(i64, uint64_t)

/* -- Public ---------------------------------------------------------------- */

/* a converted to dt, and copied to a layout BLAS reads when it must (as is:
 * the layout kiln's GEMM reads, any). */
static kiln_tensor *prepared(const char *fn, kiln_tensor *t, kiln_dtype dt, bool is_left, bool as_is)
{
    if (t->dtype != dt)
        return copy_as(fn, t, dt);
    if (as_is)
        return kiln_retain(t);
    matrix_operand op;
    matrix_dims(t, is_left, &op);
    bool trans;
    int64_t ld;
    if (!ir_dtype_is_float(dt) || blas_layout(&op, &trans, &ld))
        return kiln_retain(t);
    return copy_as(fn, t, dt);
}

static kg_matmul_args layout_args(const kiln_tensor *a, const kiln_tensor *b, const matmul_shape *shape);

/* The whole product on kiln's GEMM: 1, 0 when it is not there, or fn's error. */
static int own_matmul(const char *fn, const kiln_tensor *a, const kiln_tensor *b, const matmul_shape *shape,
                      kiln_tensor *out)
{
    kg_matmul_args args = layout_args(a, b, shape);
    return eager_gemm_run(fn, out->dtype, &args, eager_data(out), eager_data(a), eager_data(b));
}

static int run_matmul(const char *fn, kiln_tensor *a, kiln_tensor *b, const matmul_shape *shape,
                      const row_blocks *blocks, bool own, kiln_tensor *out)
{
    gemm_job j = {.s = *shape, .out = out->storage->data, .blocks = *blocks, .own = own};
    matrix_dims(a, true, &j.a);
    matrix_dims(b, false, &j.b);
    batch_strides(&j.a, &j.s);
    batch_strides(&j.b, &j.s);
    if (j.s.m * j.s.n == 0)
        return 0;
    if (j.s.k == 0) {
        memset(j.out, 0, (size_t)out->numel * eager_dtype_size(out->dtype));
        if (blocks->after)
            blocks->after(blocks->ctx, j.out, 0, j.s.batches * j.s.m);
        return 0;
    }
    switch (out->dtype) {
    case KILN_I32: int_gemm_i32(&j.a, &j.b, &j.s, (int32_t *)j.out); return 0;
    case KILN_I64: int_gemm_i64(&j.a, &j.b, &j.s, (int64_t *)j.out); return 0;
    default: break;
    }
    if (own && !blocks->after)
        return own_matmul(fn, a, b, shape, out) < 0 ? -CORE_NOMEM : 0;
    blas_layout(&j.a, &j.ta, &j.lda);
    blas_layout(&j.b, &j.tb, &j.ldb);
    if (j.lda > INT_MAX || j.ldb > INT_MAX)
        return core_fail(CORE_SHAPE, fn, "leading dimensions %lld and %lld exceed BLAS's int",
                         (long long)j.lda, (long long)j.ldb);
    gemm_batches(&j);
    return 0;
}

/* The generated kernels' view of a @ b (CUDA's, kiln's GEMM): any layout
 * goes, read through the strides. */
static kg_matmul_args layout_args(const kiln_tensor *a, const kiln_tensor *b, const matmul_shape *shape)
{
    matrix_operand ma, mb;
    matrix_dims(a, true, &ma);
    matrix_dims(b, false, &mb);
    batch_strides(&ma, shape);
    batch_strides(&mb, shape);
    kg_matmul_args args = {.batch = shape->batches, .m = shape->m, .n = shape->n, .k = shape->k,
                              .a_row = ma.row_stride, .a_col = ma.col_stride,
                              .b_row = mb.row_stride, .b_col = mb.col_stride, .batch_ndim = shape->batch_ndim};
    for (int d = 0; d < shape->batch_ndim; d++) {
        args.batch_shape[d] = shape->batch_shape[d];
        args.a_batch_strides[d] = ma.batch_strides[d];
        args.b_batch_strides[d] = mb.batch_strides[d];
    }
    return args;
}

int eager_matmul_args(const char *fn, const kiln_tensor *a, const kiln_tensor *b, kg_matmul_args *args)
{
    if (a->ndim == 0 || b->ndim == 0)
        return fail_shapes(fn, a, b, "operands need at least one dimension"), -CORE_SHAPE;
    matrix_operand ma, mb;
    matrix_dims(a, true, &ma);
    matrix_dims(b, false, &mb);
    if (ma.cols != mb.rows)
        return fail_shapes(fn, a, b, "inner dimensions differ"), -CORE_SHAPE;
    matmul_shape s = {.m = ma.rows, .n = mb.cols, .k = ma.cols};
    if (batch_shape(fn, a, b, &s) < 0)
        return -CORE_SHAPE;
    *args = layout_args(a, b, &s);
    return 0;
}

/* a @ b, in blocks of rows if blocks->after (CPU floats only); fn names the
 * caller in errors. */
static kiln_tensor *matmul(const char *fn, kiln_tensor *a, kiln_tensor *b, const row_blocks *blocks)
{
    kiln_tensor *operands[2] = {a, b};
    if (check_operands(fn, 2, operands, (const char *const[]){"operand a", "operand b"}) < 0)
        return NULL;
    if (a->ndim == 0 || b->ndim == 0)
        return fail_shapes(fn, a, b, "operands need at least one dimension");
    kiln_dtype dt = ir_promote(a->dtype, IR_DIMS, b->dtype, IR_DIMS);
    if (ir_result_dtype(RULE_MATMUL, dt) < 0) {
        char da[DESCRIBE_MAX], db[DESCRIBE_MAX];
        core_fail(CORE_DTYPE, fn, "bool operands are not supported (%s and %s)", describe(da, a),
                  describe(db, b));
        return NULL;
    }
    matrix_operand ma, mb;
    matrix_dims(a, true, &ma);
    matrix_dims(b, false, &mb);
    if (ma.cols != mb.rows)
        return fail_shapes(fn, a, b, "inner dimensions differ");
    matmul_shape s = {.m = ma.rows, .n = mb.cols, .k = ma.cols};
    if (batch_shape(fn, a, b, &s) < 0)
        return NULL;
    if (ir_dtype_is_float(dt) && (s.m > INT_MAX || s.n > INT_MAX || s.k > INT_MAX))
        return fail_shapes(fn, a, b, "matrices exceed BLAS's int sizes");
    int64_t shape[KILN_MAX_DIMS];
    int ndim = out_shape(a, b, &s, shape);
    if (recording())
        return record_op(fn, OP_MATMUL, 2, operands, NULL, dt, ndim, shape);

    kiln_device device;
    if (cuda_operands_device(fn, 2, (const kiln_tensor *const *)operands, &device) < 0)
        return NULL;
    bool cuda = device == KILN_CUDA;
    if (blocks->after && (cuda || !ir_dtype_is_float(dt))) {
        core_fail(cuda ? CORE_DEVICE : CORE_DTYPE, fn, "products in blocks are for CPU floats, not %s %s",
                  cuda ? "CUDA" : "CPU", kiln_dtype_name(dt));
        return NULL;
    }
    bool own = !cuda && ir_dtype_is_float(dt) && eager_gemm_ready(dt);
    bool as_is = cuda || (own && !blocks->after);
    kiln_tensor *pa = prepared(fn, a, dt, true, as_is), *pb = pa ? prepared(fn, b, dt, false, as_is) : NULL;
    kiln_tensor *out = pa && pb ? tensor_new_on(fn, device, dt, ndim, shape) : NULL;
    kg_matmul_args args = cuda && out ? layout_args(pa, pb, &s) : (kg_matmul_args){0};
    if (out && (cuda ? cuda_matmul(fn, &args, dt, pa, pb, out) : run_matmul(fn, pa, pb, &s, blocks, own, out)) < 0)
        out = tensor_drop(out);
    kiln_release(pa);
    kiln_release(pb);
    return tensor_own(out);
}

kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b)
{
    return grad_track(OP_MATMUL, 2, (kiln_tensor *[]){a, b}, NULL, matmul("kiln_matmul", a, b, &(row_blocks){0}));
}

kiln_tensor *eager_matmul_blocks(const char *fn, kiln_tensor *a, kiln_tensor *b, int64_t block_rows,
                                 eager_rows_fn after, void *ctx)
{
    kiln_tensor *t = matmul(fn, a, b, &(row_blocks){block_rows > 0 ? block_rows : 1, after, ctx});
    eager_disown(t);
    return t;
}
