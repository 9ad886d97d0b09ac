/* Kernel IR to CUDA C.
 *
 * An elementwise kernel (no reductions) is one grid-stride loop over its
 * rows x cols elements, a thread per element. A kernel with reductions runs a
 * block per row: its threads stride over the row for each reduction, fold
 * their partial values with warp shuffles and then across warps through
 * shared memory, and the block then stores the row. The semantics are the
 * LLVM backend's (src/codegen_llvm/codegen.c): conversions as kiln_cast,
 * NaN-propagating max and min, sums in the reduction's own dtype, a staged
 * store that keeps e in the output and divides it in place. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_nvrtc/internal.h"
#include "ir/strbuf.h"

static const char *ctype(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return "float";
    case KILN_F64: return "double";
    case KILN_I32: return "int";
    case KILN_I64: return "long long";
    default: return "unsigned char"; /* bool: 0 or 1 */
    }
}

/* Functions every kernel may call: conversions as kiln_cast converts, and
 * the reductions' folds. */
static const char PRELUDE[] =
    "template <typename I, typename F> __device__ I kiln_f2i(F v, I lo, I hi) {\n"
    "    if (v != v) return 0;\n"
    "    if (v <= (F)lo) return lo;\n"
    "    if (v >= (F)hi) return hi;\n"
    "    return (I)v;\n"
    "}\n"
    "template <typename T> __device__ T kiln_max(T a, T b) { return (a > b || a != a) ? a : b; }\n"
    "template <typename T> __device__ T kiln_min(T a, T b) { return (a < b || a != a) ? a : b; }\n"
    /* As llvm.maximum and llvm.minimum: NaN wins, and -0 < +0. */
    "template <typename T> __device__ T kiln_fold_max(T acc, T v) {\n"
    "    return (v > acc || v != v || (v == acc && signbit(acc) && !signbit(v))) ? v : acc;\n"
    "}\n"
    "template <typename T> __device__ T kiln_fold_min(T acc, T v) {\n"
    "    return (v < acc || v != v || (v == acc && signbit(v) && !signbit(acc))) ? v : acc;\n"
    "}\n"
    /* sigmoid from t = exp(-|x|), which stays accurate where it is tiny. */
    "template <typename T> __device__ T kiln_sigmoid(T x, T t) { return x < 0 ? t / (1 + t) : 1 / (1 + t); }\n"
    "template <typename T> __device__ T kiln_shfl(T v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }\n"
    "__device__ unsigned char kiln_shfl(unsigned char v, int d) {\n"
    "    return (unsigned char)__shfl_down_sync(0xffffffffu, (int)v, d);\n"
    "}\n";

typedef struct {
    const kx_kernel *k;
    strbuf *s;
    bool quads;    /* each thread does 4 consecutive elements, through float4 */
    char err[256];
} gen;

/* -- Constants and conversions --------------------------------------------- */

static void constant(gen *g, kiln_dtype dt, double v)
{
    if (dt == KILN_F32 || dt == KILN_F64) {
        bool f32 = dt == KILN_F32;
        if (isnan(v))
            strbuf_put(g->s, f32 ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)");
        else if (isinf(v))
            strbuf_put(g->s, "%s%s", v < 0 ? "-" : "",
                       f32 ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)");
        else
            strbuf_put(g->s, "(%s)%a", ctype(dt), v);
        return;
    }
    if (dt == KILN_I64 && v <= -0x1p63)
        strbuf_put(g->s, "(-9223372036854775807LL - 1)");
    else
        strbuf_put(g->s, "(%s)%lldLL", ctype(dt), (long long)v);
}

/* Writes the conversion of C expression text from dtype from to dtype to. */
static void convert(gen *g, const char *text, kiln_dtype from, kiln_dtype to)
{
    bool f_from = ir_dtype_is_float(from);
    if (from == to)
        strbuf_put(g->s, "%s", text);
    else if (to == KILN_BOOL)
        strbuf_put(g->s, "(unsigned char)(%s != 0)", text);
    else if (f_from && !ir_dtype_is_float(to))
        strbuf_put(g->s, "kiln_f2i<%s, %s>(%s, %s, %s)", ctype(to), ctype(from), text,
                   to == KILN_I32 ? "(int)-2147483647 - 1" : "(-9223372036854775807LL - 1)",
                   to == KILN_I32 ? "2147483647" : "9223372036854775807LL");
    else
        strbuf_put(g->s, "(%s)(%s)", ctype(to), text);
}

/* -- Expressions ----------------------------------------------------------- */

/* C's comparisons are IEEE's: != is true for NaN, the others false. */
static void comparison(gen *g, ir_op op, const char *a, const char *b)
{
    const char *c = op == OP_EQ ? "==" : op == OP_NE ? "!=" : op == OP_LT ? "<"
                  : op == OP_LE ? "<=" : op == OP_GT ? ">" : ">=";
    strbuf_put(g->s, "(unsigned char)(%s %s %s)", a, c, b);
}

static bool float_op(gen *g, ir_op op, kiln_dtype dt, const char *a, const char *b)
{
    bool f32 = dt == KILN_F32;
    const char *suffix = f32 ? "f" : "";
    switch (op) {
    case OP_ADD: strbuf_put(g->s, "%s + %s", a, b); break;
    case OP_SUB: strbuf_put(g->s, "%s - %s", a, b); break;
    case OP_MUL: strbuf_put(g->s, "%s * %s", a, b); break;
    case OP_DIV: strbuf_put(g->s, "%s / %s", a, b); break;
    case OP_POW: strbuf_put(g->s, "pow%s(%s, %s)", suffix, a, b); break;
    case OP_MAXIMUM: strbuf_put(g->s, "kiln_max(%s, %s)", a, b); break;
    case OP_MINIMUM: strbuf_put(g->s, "kiln_min(%s, %s)", a, b); break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: comparison(g, op, a, b); break;
    case OP_NEG: strbuf_put(g->s, "-%s", a); break;
    case OP_ABS: strbuf_put(g->s, "fabs%s(%s)", suffix, a); break;
    case OP_SQRT: strbuf_put(g->s, "sqrt%s(%s)", suffix, a); break;
    case OP_RSQRT: strbuf_put(g->s, "(%s)1 / sqrt%s(%s)", ctype(dt), suffix, a); break;
    case OP_RELU: strbuf_put(g->s, "((%s > 0 || %s != %s) ? %s : (%s)0)", a, a, a, a, ctype(dt)); break;
    case OP_EXP: strbuf_put(g->s, "exp%s(%s)", suffix, a); break;
    case OP_LOG: strbuf_put(g->s, "log%s(%s)", suffix, a); break;
    case OP_TANH: strbuf_put(g->s, "tanh%s(%s)", suffix, a); break;
    case OP_SIGMOID: strbuf_put(g->s, "kiln_sigmoid(%s, exp%s(-fabs%s(%s)))", a, suffix, suffix, a); break;
    case OP_SIN: strbuf_put(g->s, "sin%s(%s)", suffix, a); break;
    case OP_COS: strbuf_put(g->s, "cos%s(%s)", suffix, a); break;
    case OP_ERF: strbuf_put(g->s, "erf%s(%s)", suffix, a); break;
    default: return false;
    }
    return true;
}

/* Integer arithmetic wraps, as LLVM's does: it is done unsigned, since
 * signed overflow is undefined in C++ and NVVM takes advantage of it. */
static bool int_op(gen *g, ir_op op, kiln_dtype dt, const char *a, const char *b)
{
    bool is_bool = dt == KILN_BOOL;
    const char *t = ctype(dt), *u = dt == KILN_I64 ? "unsigned long long" : "unsigned";
    switch (op) {
    case OP_ADD:
        if (is_bool)
            strbuf_put(g->s, "(%s)(%s | %s)", t, a, b);
        else
            strbuf_put(g->s, "(%s)((%s)%s + (%s)%s)", t, u, a, u, b);
        break;
    case OP_SUB: strbuf_put(g->s, "(%s)((%s)%s - (%s)%s)", t, u, a, u, b); break;
    case OP_MUL:
        if (is_bool)
            strbuf_put(g->s, "(%s)(%s & %s)", t, a, b);
        else
            strbuf_put(g->s, "(%s)((%s)%s * (%s)%s)", t, u, a, u, b);
        break;
    case OP_MAXIMUM: strbuf_put(g->s, "(%s)(%s > %s ? %s : %s)", t, a, b, a, b); break;
    case OP_MINIMUM: strbuf_put(g->s, "(%s)(%s < %s ? %s : %s)", t, a, b, a, b); break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: comparison(g, op, a, b); break;
    case OP_NEG: strbuf_put(g->s, "(%s)(0 - (%s)%s)", t, u, a); break;
    case OP_ABS: strbuf_put(g->s, "(%s)(%s < 0 ? 0 - (%s)%s : (%s)%s)", t, a, u, a, u, a); break;
    case OP_RELU: strbuf_put(g->s, "(%s)(%s > 0 ? %s : 0)", t, a, a); break;
    default: return false;
    }
    return true;
}

/* The element index of view v at loop index "i" of the current row. */
static void element(gen *g, int v)
{
    if (g->k->views[v].inner_stride)
        strbuf_put(g->s, "v%d + i * %lldLL", v, (long long)g->k->views[v].inner_stride);
    else
        strbuf_put(g->s, "v%d", v);
}

/* The buffer a load of view v reads: an input written over in place is read
 * through the output, which holds its values. */
static int buffer_read(const kx_kernel *k, int v)
{
    int b = k->views[v].buffer;
    return b == k->in_place ? k->views[k->stores[0].view].buffer : b;
}

/* Declares "e<n>" for expression n, and first those it needs not yet
 * declared in this loop (done[]). */
static void emit_expr(gen *g, int n, bool *done)
{
    if (!done || done[n] || g->err[0])
        return;
    const kx_expr *e = &g->k->exprs[n];
    for (int a = 0; a < 3 && (e->kind == KX_OP || e->kind == KX_CAST) && e->args[a] >= 0; a++)
        emit_expr(g, e->args[a], done);
    done[n] = true;
    strbuf_put(g->s, "        %s e%d = ", ctype(e->dtype), n);
    char a[3][16] = {"", "", ""};
    for (int i = 0; i < 3 && (e->kind == KX_OP || e->kind == KX_CAST) && e->args[i] >= 0; i++)
        snprintf(a[i], sizeof a[i], "e%d", e->args[i]);
    switch (e->kind) {
    case KX_LOAD:
        if (g->quads && g->k->views[e->view].inner_stride == 1) {
            strbuf_put(g->s, "((const float *)&q%d)[lane]", e->view);
            break;
        }
        strbuf_put(g->s, "b%d[", buffer_read(g->k, e->view));
        element(g, e->view);
        strbuf_put(g->s, "]");
        break;
    case KX_CONST: constant(g, e->dtype, e->value); break;
    case KX_ROW: strbuf_put(g->s, "r%d", e->row); break;
    case KX_CAST: convert(g, a[0], g->k->exprs[e->args[0]].dtype, e->dtype); break;
    case KX_OP: {
        if (e->op == OP_WHERE) {
            strbuf_put(g->s, "%s != 0 ? %s : %s", a[0], a[1], a[2]);
            break;
        }
        kiln_dtype operand = g->k->exprs[e->args[0]].dtype;
        bool ok = ir_dtype_is_float(operand) ? float_op(g, e->op, operand, a[0], a[1])
                                              : int_op(g, e->op, operand, a[0], a[1]);
        if (!ok)
            snprintf(g->err, sizeof g->err, "%s on %s is not in the CUDA backend", ir_ops[e->op].name,
                     kiln_dtype_name(operand));
        break;
    }
    }
    strbuf_put(g->s, ";\n");
}

/* -- Kernels --------------------------------------------------------------- */

/* Which expressions a new loop has declared: none yet. NULL (err set) when
 * out of memory. */
static bool *new_loop(gen *g)
{
    bool *done = calloc((size_t)g->k->n_exprs + 1, sizeof *done);
    if (!done)
        snprintf(g->err, sizeof g->err, "out of memory");
    return done;
}

static void signature(gen *g, const char *name)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", NVRTC_BLOCK, name);
    for (int b = 0; b < k->n_buffers; b++) {
        kiln_dtype dt = KILN_F32;
        for (int v = 0; v < k->n_views; v++)
            if (k->views[v].buffer == b)
                dt = k->views[v].dtype;
        for (int r = 0; r < k->n_row_stores; r++)
            if (k->row_stores[r].buffer == b)
                dt = k->row_stores[r].dtype;
        strbuf_put(g->s, "%s%s *__restrict__ b%d", b ? ", " : "", ctype(dt), b);
    }
    strbuf_put(g->s, ")\n{\n");
}

/* v<n>: each view's first element of the row in "row". */
static void view_bases(gen *g)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "        long long rest = row;\n");
    for (int d = k->n_outer - 1; d >= 0; d--) {
        if (d)
            strbuf_put(g->s, "        long long o%d = rest %% %lldLL; rest /= %lldLL;\n", d, (long long)k->outer[d],
                       (long long)k->outer[d]);
        else
            strbuf_put(g->s, "        long long o0 = rest;\n");
    }
    for (int v = 0; v < k->n_views; v++) {
        strbuf_put(g->s, "        long long v%d = %lldLL", v, (long long)k->views[v].offset);
        for (int d = 0; d < k->n_outer; d++)
            if (k->views[v].outer_strides[d])
                strbuf_put(g->s, " + o%d * %lldLL", d, (long long)k->views[v].outer_strides[d]);
        strbuf_put(g->s, ";\n");
    }
    strbuf_put(g->s, "        (void)rest;\n");
}

static void store_value(gen *g, const kx_store *st, bool *done)
{
    const kx_view *v = &g->k->views[st->view];
    emit_expr(g, st->expr, done);
    char text[16];
    snprintf(text, sizeof text, "e%d", st->expr);
    if (g->quads) {
        strbuf_put(g->s, "        ((float *)&o%d)[lane] = ", st->view);
    } else {
        strbuf_put(g->s, "        b%d[", v->buffer);
        element(g, st->view);
        strbuf_put(g->s, "] = ");
    }
    convert(g, text, g->k->exprs[st->expr].dtype, v->dtype);
    strbuf_put(g->s, ";\n");
}

/* Whether every element of k's rows can go 4 at a time: f32 throughout,
 * rows a multiple of 4, and every view either contiguous along the row from
 * a 16-byte boundary or the same for the whole row. */
static bool quads_fit(const kx_kernel *k)
{
    if (k->cols % 4 || k->n_stores == 0)
        return false;
    for (int v = 0; v < k->n_views; v++) {
        const kx_view *w = &k->views[v];
        bool aligned = w->offset % 4 == 0;
        for (int d = 0; d < k->n_outer; d++)
            aligned = aligned && w->outer_strides[d] % 4 == 0;
        if (w->dtype != KILN_F32 || (w->inner_stride != 0 && (w->inner_stride != 1 || !aligned)))
            return false;
    }
    for (int s = 0; s < k->n_stores; s++)
        if (k->views[k->stores[s].view].inner_stride != 1)
            return false;
    return true;
}

/* Elementwise, 4 elements a thread: float4 loads and stores around a loop
 * over the 4 lanes, which the compiler unrolls into registers. */
static void elementwise_quads(gen *g)
{
    const kx_kernel *k = g->k;
    bool *done = new_loop(g);
    g->quads = true;
    strbuf_put(g->s,
               "    for (long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x; at < %lldLL;\n"
               "         at += (long long)gridDim.x * blockDim.x) {\n"
               "        long long row = at / %lldLL, i0 = at %% %lldLL * 4;\n",
               (long long)(k->rows * (k->cols / 4)), (long long)(k->cols / 4), (long long)(k->cols / 4));
    view_bases(g);
    for (int v = 0; v < k->n_views; v++) {
        bool loaded = false;
        for (int e = 0; e < k->n_exprs && !loaded; e++)
            loaded = k->exprs[e].kind == KX_LOAD && k->exprs[e].view == v;
        if (loaded && k->views[v].inner_stride == 1)
            strbuf_put(g->s, "        float4 q%d = *(const float4 *)&b%d[v%d + i0];\n", v, buffer_read(k, v), v);
    }
    for (int s = 0; s < k->n_stores; s++)
        strbuf_put(g->s, "        float4 o%d;\n", k->stores[s].view);
    strbuf_put(g->s, "        #pragma unroll\n"
                     "        for (int lane = 0; lane < 4; lane++) {\n"
                     "        long long i = i0 + lane;\n"
                     "        (void)i;\n");
    for (int s = 0; done && s < k->n_stores; s++)
        store_value(g, &k->stores[s], done);
    strbuf_put(g->s, "        }\n");
    for (int s = 0; s < k->n_stores; s++) {
        const kx_view *v = &k->views[k->stores[s].view];
        strbuf_put(g->s, "        *(float4 *)&b%d[v%d + i0] = o%d;\n", v->buffer, k->stores[s].view, k->stores[s].view);
    }
    strbuf_put(g->s, "    }\n");
    g->quads = false;
    free(done);
}

static void elementwise(gen *g)
{
    const kx_kernel *k = g->k;
    if (quads_fit(k)) {
        elementwise_quads(g);
        return;
    }
    bool *done = new_loop(g);
    strbuf_put(g->s,
               "    for (long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x; at < %lldLL;\n"
               "         at += (long long)gridDim.x * blockDim.x) {\n"
               "        long long row = at / %lldLL, i = at %% %lldLL;\n",
               (long long)(k->rows * k->cols), (long long)(k->cols ? k->cols : 1),
               (long long)(k->cols ? k->cols : 1));
    view_bases(g);
    for (int s = 0; done && s < k->n_stores; s++)
        store_value(g, &k->stores[s], done);
    strbuf_put(g->s, "    }\n");
    free(done);
}

static const char *fold_of(ir_op op, bool is_float)
{
    if (op == OP_SUM || op == OP_MEAN)
        return NULL;
    if (op == OP_MAX)
        return is_float ? "kiln_fold_max" : "kiln_max";
    return is_float ? "kiln_fold_min" : "kiln_min";
}

static void reduction_init(gen *g, const kx_reduction *r)
{
    bool is_float = ir_dtype_is_float(r->dtype);
    if (r->op == OP_SUM || r->op == OP_MEAN)
        constant(g, r->dtype, 0);
    else if (is_float)
        constant(g, r->dtype, r->op == OP_MAX ? -INFINITY : INFINITY);
    else if (r->dtype == KILN_I64)
        strbuf_put(g->s, r->op == OP_MAX ? "(-9223372036854775807LL - 1)" : "9223372036854775807LL");
    else
        constant(g, r->dtype, r->op == OP_MAX ? -2147483648.0 : 2147483647.0);
}

/* acc = fold(acc, value) in C, for reduction r. */
static void fold(gen *g, const kx_reduction *r, const char *acc, const char *value)
{
    const char *f = fold_of(r->op, ir_dtype_is_float(r->dtype));
    if (f)
        strbuf_put(g->s, "%s = %s(%s, %s);\n", acc, f, acc, value);
    else
        strbuf_put(g->s, "%s = %s + %s;\n", acc, acc, value);
}

/* One reduction over the row: the threads' partial values, then the block's. */
static void reduce(gen *g, int n, bool staged_here)
{
    const kx_kernel *k = g->k;
    const kx_reduction *r = &k->reductions[n];
    const char *t = ctype(r->dtype);
    bool *done = new_loop(g);
    strbuf_put(g->s, "        %s acc%d = ", t, n);
    reduction_init(g, r);
    strbuf_put(g->s, ";\n        for (long long i = threadIdx.x; i < %lldLL; i += blockDim.x) {\n",
               (long long)k->cols);
    emit_expr(g, r->expr, done);
    char value[16], acc[16];
    snprintf(value, sizeof value, "e%d", r->expr);
    snprintf(acc, sizeof acc, "acc%d", n);
    strbuf_put(g->s, "        ");
    fold(g, r, acc, value);
    if (staged_here) {
        const kx_store *st = &k->stores[0];
        emit_expr(g, st->stage_value, done);
        strbuf_put(g->s, "        b%d[", k->views[st->view].buffer);
        element(g, st->view);
        strbuf_put(g->s, "] = e%d;\n", st->stage_value);
    }
    strbuf_put(g->s, "        }\n");
    /* Warps fold by shuffles, then warp 0 folds the warps' values. */
    strbuf_put(g->s, "        for (int d = 16; d > 0; d /= 2) { %s other = kiln_shfl(acc%d, d); ", t, n);
    fold(g, r, acc, "other");
    strbuf_put(g->s, "        }\n"
                     "        __shared__ %s part%d[%d];\n"
                     "        if ((threadIdx.x & 31) == 0) part%d[threadIdx.x / 32] = acc%d;\n"
                     "        __syncthreads();\n"
                     "        if (threadIdx.x < 32) {\n"
                     "            acc%d = threadIdx.x < blockDim.x / 32 ? part%d[threadIdx.x] : ",
               t, n, NVRTC_BLOCK / 32, n, n, n, n);
    reduction_init(g, r);
    strbuf_put(g->s, ";\n            for (int d = 16; d > 0; d /= 2) { %s other = kiln_shfl(acc%d, d); ", t, n);
    fold(g, r, acc, "other");
    strbuf_put(g->s, "            }\n"
                     "            if (threadIdx.x == 0) part%d[0] = acc%d;\n"
                     "        }\n"
                     "        __syncthreads();\n",
               n, n);
    if (r->op == OP_MEAN)
        strbuf_put(g->s, "        double r%d = (double)part%d[0] / %lldLL;\n", n, n, (long long)k->cols);
    else
        strbuf_put(g->s, "        %s r%d = part%d[0];\n", t, n, n);
    strbuf_put(g->s, "        __syncthreads();\n"); /* part%d is read by all before the next row reuses it */
    free(done);
}

static void row_kernel(gen *g)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "    for (long long row = blockIdx.x; row < %lldLL; row += gridDim.x) {\n", (long long)k->rows);
    view_bases(g);
    bool staged = k->n_stores == 1 && k->stores[0].staged;
    for (int r = 0; r < k->n_reductions; r++)
        reduce(g, r, staged && r == k->n_reductions - 1);
    bool *done = new_loop(g);
    if (k->n_stores > 0)
        strbuf_put(g->s, "        for (long long i = threadIdx.x; i < %lldLL; i += blockDim.x) {\n",
                   (long long)k->cols);
    for (int s = 0; done && s < k->n_stores; s++) {
        const kx_store *st = &k->stores[s];
        if (!st->staged) {
            store_value(g, st, done);
            continue;
        }
        /* Each thread divides what it stored itself in the reduction's pass. */
        const kx_view *v = &k->views[st->view];
        emit_expr(g, st->stage_row, done);
        char stored[64], row_value[16];
        snprintf(stored, sizeof stored, "b%d[v%d + i * %lldLL]", v->buffer, st->view, (long long)v->inner_stride);
        snprintf(row_value, sizeof row_value, "e%d", st->stage_row);
        strbuf_put(g->s, "        %s = ", stored);
        float_op(g, st->stage_op, v->dtype, stored, row_value);
        strbuf_put(g->s, ";\n");
    }
    if (k->n_stores > 0)
        strbuf_put(g->s, "        }\n");
    for (int s = 0; s < k->n_row_stores; s++) {
        const kx_row_store *rs = &k->row_stores[s];
        kiln_dtype from = k->reductions[rs->row].op == OP_MEAN ? KILN_F64 : k->reductions[rs->row].dtype;
        char text[16];
        snprintf(text, sizeof text, "r%d", rs->row);
        strbuf_put(g->s, "        if (threadIdx.x == 0) b%d[row] = ", rs->buffer);
        convert(g, text, from, rs->dtype);
        strbuf_put(g->s, ";\n");
    }
    strbuf_put(g->s, "    }\n");
    free(done);
}

char *nvrtc_source(const kx_kernel *k, const char *name, char *err, size_t err_size)
{
    if (k->n_buffers > KX_MAX_BUFFERS) {
        snprintf(err, err_size, "a kernel with %d buffers (at most %d)", k->n_buffers, KX_MAX_BUFFERS);
        return NULL;
    }
    strbuf s = {0};
    gen g = {.k = k, .s = &s};
    strbuf_put(&s, "%s\n", PRELUDE);
    signature(&g, name);
    if (k->n_reductions == 0 && k->n_row_stores == 0)
        elementwise(&g);
    else
        row_kernel(&g);
    strbuf_put(&s, "}\n");
    char *text = strbuf_finish(&s);
    if (g.err[0] || !text) {
        snprintf(err, err_size, "%s", g.err[0] ? g.err : "out of memory");
        free(text);
        return NULL;
    }
    return text;
}
