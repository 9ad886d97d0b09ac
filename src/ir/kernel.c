/* Kernels of the kernel IR: building them, their canonical text, and the
 * descriptions of the shape-generic kernels of eager ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/internal.h"

/* -- Building ---------------------------------------------------------------- */

kx_kernel *kx_kernel_new(const ir_sizes *sizes, int ndim, const int64_t *shape)
{
    kx_kernel *k = calloc(1, sizeof *k);
    if (!k || ir_sizes_copy(&k->sizes, sizes) < 0) {
        free(k);
        return NULL;
    }
    k->n_outer = ndim > 0 ? ndim - 1 : 0;
    memcpy(k->outer, shape, (size_t)k->n_outer * sizeof *shape);
    k->rows = ir_shape_product(&k->sizes, k->n_outer, shape);
    k->cols = ndim > 0 ? shape[ndim - 1] : 1;
    k->product = -1;
    if (k->rows == IR_SIZE_NONE) {
        kx_kernel_free(k);
        return NULL;
    }
    return k;
}

bool kx_symbolic(const kx_kernel *k)
{
    bool symbolic = k->rows < 0 || k->cols < 0 || ir_shape_symbolic(k->n_outer, k->outer);
    for (int v = 0; v < k->n_views && !symbolic; v++) {
        const kx_view *w = &k->views[v];
        symbolic = ir_size_symbols(&k->sizes, w->offset) || ir_size_symbols(&k->sizes, w->inner_stride);
        for (int d = 0; d < k->n_outer && !symbolic; d++)
            symbolic = ir_size_symbols(&k->sizes, w->outer_strides[d]) != 0;
    }
    return symbolic;
}

int64_t kx_size(const kx_kernel *k, int64_t v, const int64_t *symbols)
{
    ir_poly p;
    return v >= 0 || !ir_size_poly(&k->sizes, v, &p) ? v : ir_poly_eval(&p, symbols);
}

void kx_kernel_free(kx_kernel *k)
{
    if (!k)
        return;
    ir_sizes_free(&k->sizes);
    free(k->exprs);
    free(k->views);
    free(k->reductions);
    free(k->stores);
    free(k->row_stores);
    kx_kernel_free(k->prologue);
    free(k);
}

bool ir_grow(void **items, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return true;
    int n = *cap ? *cap * 2 : 8;
    while (n < need)
        n *= 2;
    void *p = realloc(*items, (size_t)n * size);
    if (!p)
        return false;
    *items = p;
    *cap = n;
    return true;
}

int64_t ir_row_piece(int64_t cols, int64_t most, int64_t least)
{
    for (int64_t piece = most - most % 16; piece >= least; piece -= 16)
        if (cols % piece == 0)
            return piece;
    for (int64_t piece = most; piece >= least; piece--)
        if (cols % piece == 0)
            return piece;
    return 0;
}

int kx_add_expr(kx_kernel *k, kx_expr e)
{
    if (!ir_grow((void **)&k->exprs, &k->exprs_cap, k->n_exprs + 1, sizeof e))
        return -1;
    k->exprs[k->n_exprs] = e;
    return k->n_exprs++;
}

int kx_add_view(kx_kernel *k, kx_view v)
{
    if (!ir_grow((void **)&k->views, &k->views_cap, k->n_views + 1, sizeof v))
        return -1;
    k->views[k->n_views] = v;
    return k->n_views++;
}

int kx_add_store(kx_kernel *k, kx_store s)
{
    if (!ir_grow((void **)&k->stores, &k->stores_cap, k->n_stores + 1, sizeof s))
        return -1;
    k->stores[k->n_stores] = s;
    return k->n_stores++;
}

kx_value kx_reduction_identity(ir_op op, kiln_dtype dtype)
{
    if (op == OP_SUM || op == OP_MEAN)
        return (kx_value){0, 0};
    if (op == OP_PROD)
        return (kx_value){1, 1};
    bool max = op == OP_MAX;
    if (ir_dtype_is_float(dtype))
        return (kx_value){.f = max ? -INFINITY : INFINITY};
    switch (dtype) {
    case KILN_I32: return (kx_value){.i = max ? INT32_MIN : INT32_MAX};
    case KILN_BOOL: return (kx_value){.i = max ? 0 : 1};
    default: return (kx_value){.i = max ? INT64_MIN : INT64_MAX};
    }
}

bool kx_indexed(const kx_kernel *k)
{
    for (int e = 0; e < k->n_exprs; e++)
        if (k->exprs[e].kind == KX_GATHER)
            return true;
    return false;
}

bool kx_bounded(const kx_kernel *k)
{
    for (int v = 0; v < k->n_views; v++)
        if (k->views[v].n_bounds)
            return true;
    return false;
}

bool kx_rows_fixed(const kx_kernel *k)
{
    return kx_indexed(k) || kx_bounded(k);
}

void kx_bad_index_text(const int64_t *bad, char *err, size_t err_size)
{
    snprintf(err, err_size, "kiln_gather: index %lld is out of range for axis %lld of size %lld",
             (long long)bad[KX_BAD_INDEX], (long long)bad[KX_BAD_AXIS], (long long)bad[KX_BAD_SIZE]);
}

bool kx_writes(const kx_kernel *k, int b)
{
    for (int s = 0; s < k->n_stores; s++)
        if (k->views[k->stores[s].view].buffer == b)
            return true;
    for (int s = 0; s < k->n_row_stores; s++)
        if (k->row_stores[s].buffer == b)
            return true;
    return false;
}

bool kx_loads_view(const kx_kernel *k, int e, int v)
{
    const kx_expr *x = &k->exprs[e];
    if (x->kind == KX_LOAD || x->kind == KX_GATHER)
        return x->view == v;
    if (x->kind != KX_OP && x->kind != KX_CAST)
        return false;
    for (int i = 0; i < 3 && x->args[i] >= 0; i++)
        if (kx_loads_view(k, x->args[i], v))
            return true;
    return false;
}

/* Whether view v of k is loaded by the passes up to pass, or by what is
 * stored in a reduction's pass: then it holds an input that k writes over
 * (in place), not only a row k keeps. */
static bool loaded_before(const kx_kernel *k, int v, int pass)
{
    for (int r = 0; r < k->n_reductions && kx_reduction_pass(r) <= pass; r++)
        if (kx_loads_view(k, k->reductions[r].expr, v))
            return true;
    for (int s = 0; s < k->n_stores; s++)
        if (k->stores[s].pass != KX_STORE_PASS && kx_loads_view(k, k->stores[s].expr, v))
            return true;
    return false;
}

int kx_kept_view(const kx_kernel *k)
{
    if (k->product >= 0 || k->cols <= 0 || kx_rows_fixed(k))
        return -1;
    int kept = -1, pass = KX_STORE_PASS;
    for (int s = 0; s < k->n_stores; s++) {
        const kx_store *st = &k->stores[s];
        if (st->pass == KX_STORE_PASS)
            continue;
        if (kept >= 0 && (kept != st->view || pass != st->pass))
            return -1;
        kept = st->view;
        pass = st->pass;
    }
    if (kept < 0 || k->views[kept].inner_stride != 1 ||
        k->cols > KX_KEPT_ROW_BYTES / (int64_t)ir_dtype_size(k->views[kept].dtype) || loaded_before(k, kept, pass))
        return -1;
    bool stored_over = false;
    for (int s = 0; s < k->n_stores; s++)
        stored_over |= k->stores[s].pass == KX_STORE_PASS && k->stores[s].view == kept;
    for (int v = 0; v < k->n_views; v++)
        if (v != kept && k->views[v].buffer == k->views[kept].buffer)
            return -1;
    for (int s = 0; s < k->n_row_stores; s++) {
        const kx_row_store *rs = &k->row_stores[s];
        if (rs->buffer == k->views[kept].buffer || (rs->expr >= 0 && kx_loads_view(k, rs->expr, kept)))
            return -1;
    }
    return stored_over ? kept : -1;
}

int kx_product_view(const kx_kernel *k)
{
    int found = -1, n = 0;
    for (int v = 0; v < k->n_views; v++)
        if (k->views[v].buffer == k->product)
            found = v, n++;
    return n == 1 ? found : -1;
}

/* Whether view v reads a contiguous row-major [rows, cols] from its start. */
static bool row_major(const kx_kernel *k, const kx_view *v)
{
    if (v->offset != 0 || v->inner_stride != 1)
        return false;
    int64_t stride = k->cols;
    for (int d = k->n_outer - 1; d >= 0; d--) {
        if (k->outer[d] != 1 && v->outer_strides[d] != stride)
            return false;
        stride *= k->outer[d];
    }
    return true;
}

const char *kx_product_misfit(const kx_kernel *k)
{
    if (k->product < 0 || k->product >= k->n_buffers)
        return "the product is not one of the epilogue's buffers";
    if (k->n_reductions > 0 || k->n_row_stores > 0)
        return "the epilogue reduces rows: only an elementwise epilogue is fused";
    if (k->n_stores == 0)
        return "the epilogue stores nothing";
    if (kx_indexed(k))
        return "the epilogue gathers: its launch checks indices";
    if (kx_bounded(k))
        return "the epilogue reads a padded tensor's border";
    if (kx_writes(k, k->product))
        return "the epilogue writes the product's buffer";
    int v = kx_product_view(k);
    if (v < 0)
        return "the epilogue reads the product through more than one view";
    if (!row_major(k, &k->views[v]))
        return "the epilogue reads the product other than as contiguous row-major [rows, cols] (transposed, "
               "strided or offset)";
    return NULL;
}

/* Whether every view of k steps along its innermost outer dimension as far
 * as a row's columns reach: the two are one axis of it. Rows of one column
 * join whatever their views' inner strides, which never step. */
static bool joinable(const kx_kernel *k)
{
    int d = k->n_outer - 1;
    /* rows would change meaning */
    if (d < 0 || k->cols < 0 || k->outer[d] < 0 || k->n_reductions || k->n_row_stores || kx_rows_fixed(k))
        return false;
    for (int v = 0; v < k->n_views; v++) {
        const kx_view *w = &k->views[v];
        if (w->inner_stride < 0 || (k->cols != 1 && w->outer_strides[d] != k->cols * w->inner_stride)) /* (< 0: a table's) */
            return false;
    }
    return true;
}

bool kx_join_cols(kx_kernel *k, int64_t cols)
{
    while (k->cols != cols && k->cols > 0 && cols % k->cols == 0 && joinable(k)) {
        /* one column: the views' inner strides never stepped, now they step along the joined dimension */
        for (int v = 0; k->cols == 1 && v < k->n_views; v++)
            k->views[v].inner_stride = k->views[v].outer_strides[k->n_outer - 1];
        k->n_outer--;
        k->cols *= k->outer[k->n_outer];
        k->rows = ir_shape_product(&k->sizes, k->n_outer, k->outer);
    }
    return k->cols == cols;
}

/* -- Text -------------------------------------------------------------------- */

static void put_value(strbuf *t, kx_value v, kiln_dtype dt)
{
    if (ir_dtype_is_float(dt))
        strbuf_put(t, "%.17g", v.f);
    else
        strbuf_put(t, "%lld", (long long)v.i);
}

static void put_header(strbuf *t, const kx_kernel *k)
{
    strbuf_put(t, "kernel rows=");
    ir_size_put(t, &k->sizes, k->rows);
    strbuf_put(t, " cols=");
    ir_size_put(t, &k->sizes, k->cols);
    strbuf_put(t, " outer=[");
    for (int d = 0; d < k->n_outer; d++) {
        strbuf_put(t, d ? "," : "");
        ir_size_put(t, &k->sizes, k->outer[d]);
    }
    strbuf_put(t, "] buffers=[");
    for (int b = 0; b < k->n_buffers; b++)
        strbuf_put(t, b ? ",%s" : "%s", ir_dtype_names[k->buffer_dtypes[b]]);
    strbuf_put(t, "]");
    if (k->product >= 0)
        strbuf_put(t, " product=b%d", k->product);
    const kx_conv *c = &k->conv;
    if (c->kh)
        strbuf_put(t, " conv=%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld", (long long)c->channels,
                   (long long)c->height, (long long)c->width, (long long)c->out_width, (long long)c->kh,
                   (long long)c->kw, (long long)c->stride[0], (long long)c->stride[1], (long long)c->padding[0],
                   (long long)c->padding[1], (long long)c->dilation[0], (long long)c->dilation[1]);
    if (k->attention)
        strbuf_put(t, " attention");
    strbuf_put(t, "\n");
}

static void put_expr(strbuf *t, const ir_sizes *sizes, const kx_expr *e)
{
    switch (e->kind) {
    case KX_LOAD: strbuf_put(t, "load view%d", e->view); break;
    case KX_CONST: strbuf_put(t, "const %.17g", e->value); break;
    case KX_ROW: strbuf_put(t, "row r%d", e->row); break;
    case KX_CAST: strbuf_put(t, "cast e%d", e->args[0]); break;
    case KX_GATHER:
        strbuf_put(t, "gather view%d e%d axis=%d size=", e->view, e->args[0], e->axis);
        ir_size_put(t, sizes, e->size);
        break;
    case KX_OP:
        strbuf_put(t, "%s", ir_ops[e->op].name);
        for (int a = 0; a < 3 && e->args[a] >= 0; a++)
            strbuf_put(t, " e%d", e->args[a]);
        break;
    }
    strbuf_put(t, " : %s\n", ir_dtype_names[e->dtype]);
}

char *kx_to_text(const kx_kernel *k)
{
    strbuf t = {0};
    put_header(&t, k);
    for (int i = 0; i < k->n_views; i++) {
        const kx_view *v = &k->views[i];
        strbuf_put(&t, "view %d = b%d %s offset=", i, v->buffer, ir_dtype_names[v->dtype]);
        ir_size_put(&t, &k->sizes, v->offset);
        strbuf_put(&t, " strides=[");
        for (int d = 0; d < k->n_outer; d++) {
            ir_size_put(&t, &k->sizes, v->outer_strides[d]);
            strbuf_put(&t, ",");
        }
        ir_size_put(&t, &k->sizes, v->inner_stride);
        strbuf_put(&t, "]");
        for (int b = 0; b < v->n_bounds; b++)
            strbuf_put(&t, " d%d in [%lld,%lld)", v->bounds[b].dim, (long long)v->bounds[b].lo,
                       (long long)v->bounds[b].hi);
        if (v->n_bounds)
            strbuf_put(&t, " else %.17g", v->fill);
        strbuf_put(&t, "\n");
    }
    for (int i = 0; i < k->n_exprs; i++) {
        strbuf_put(&t, "e%d = ", i);
        put_expr(&t, &k->sizes, &k->exprs[i]);
    }
    for (int i = 0; i < k->n_reductions; i++) {
        const kx_reduction *r = &k->reductions[i];
        strbuf_put(&t, "r%d = %s e%d : %s -> %s from ", i, ir_ops[r->op].name, r->expr, ir_dtype_names[r->dtype],
                   ir_dtype_names[r->result]);
        put_value(&t, r->identity, r->dtype);
        strbuf_put(&t, "\n");
    }
    for (int i = 0; i < k->n_stores; i++) {
        const kx_store *s = &k->stores[i];
        strbuf_put(&t, "store view%d e%d", s->view, s->expr);
        if (s->pass != KX_STORE_PASS)
            strbuf_put(&t, " in r%d", s->pass - kx_reduction_pass(0));
        strbuf_put(&t, "\n");
    }
    for (int i = 0; i < k->n_row_stores; i++) {
        const kx_row_store *rs = &k->row_stores[i];
        if (rs->expr >= 0)
            strbuf_put(&t, "store_row b%d e%d : %s -> %s\n", rs->buffer, rs->expr, ir_dtype_names[rs->from],
                       ir_dtype_names[rs->dtype]);
        else
            strbuf_put(&t, "store_row b%d r%d : %s -> %s\n", rs->buffer, rs->row, ir_dtype_names[rs->from],
                       ir_dtype_names[rs->dtype]);
    }
    char *prologue = k->prologue ? kx_to_text(k->prologue) : NULL;
    if (prologue)
        strbuf_put(&t, "prologue of the product's left operand:\n%s", prologue);
    t.failed |= k->prologue && !prologue; /* a text without it would be another kernel's key */
    free(prologue);
    return strbuf_finish(&t);
}

const char *kx_options_text(const kx_kernel_options *o)
{
    return o->stream_stores ? "stream_stores" : "";
}

/* -- Shape-generic kernels --------------------------------------------------- */

static const char *const KIND_NAMES[] = {"ew", "reduce", "matmul", "scan", "topk", "index", "random"};

static bool dtype_valid(kiln_dtype dt)
{
    return (unsigned)dt <= KILN_BOOL;
}

void kg_describe(const kg_kernel *k, char *buf, size_t size)
{
    int used = snprintf(buf, size, "%s(", ir_ops[k->op].name);
    for (int i = 0; i < k->n_in && used > 0 && (size_t)used < size; i++)
        used += snprintf(buf + used, size - (size_t)used, "%s%s", i ? ", " : "", ir_dtype_names[k->in[i]]);
    if (used > 0 && (size_t)used < size)
        snprintf(buf + used, size - (size_t)used, ") in %s to %s", ir_dtype_names[k->compute],
                 ir_dtype_names[k->out]);
}

/* The fields every kind needs in range, so that k can be named at all. */
static int check_fields(const kg_kernel *k, char *err, size_t err_size)
{
    if ((unsigned)k->kind > KG_RANDOM)
        snprintf(err, err_size, "eager kernel of unknown kind %d", (int)k->kind);
    else if ((unsigned)k->op >= OP__COUNT)
        snprintf(err, err_size, "eager kernel of unknown op %d", (int)k->op);
    else if (k->n_in < 1 || k->n_in > KG_EW_INPUTS)
        snprintf(err, err_size, "eager kernel for %s with %d inputs (1 to %d)", ir_ops[k->op].name, k->n_in,
                 KG_EW_INPUTS);
    else
        err[0] = '\0';
    if (err[0])
        return -1;
    bool valid = dtype_valid(k->compute) && dtype_valid(k->acc) && dtype_valid(k->out);
    for (int i = 0; i < k->n_in; i++)
        valid = valid && dtype_valid(k->in[i]);
    if (valid)
        return 0;
    snprintf(err, err_size, "eager kernel for %s with a dtype that is not one of kiln's", ir_ops[k->op].name);
    return -1;
}

static int check_elementwise(const kg_kernel *k, char *err, size_t err_size)
{
    const ir_op_info *info = &ir_ops[k->op];
    char what[128];
    kg_describe(k, what, sizeof what);
    if (info->kind != KIND_ELEMENTWISE)
        snprintf(err, err_size, "no elementwise eager kernel for %s: %s is not elementwise", what, info->name);
    else if (k->n_in != info->arity)
        snprintf(err, err_size, "no eager kernel for %s: %s takes %d inputs", what, info->name, info->arity);
    else if (k->op == OP_WHERE && k->in[0] != KILN_BOOL)
        snprintf(err, err_size, "no eager kernel for %s: the condition must be bool", what);
    else if (k->op != OP_WHERE && k->op != OP_CAST && ir_result_dtype(info->rule, k->compute) < 0)
        snprintf(err, err_size, "no eager kernel for %s: %s refuses %s", what, info->name,
                 ir_dtype_names[k->compute]);
    else
        return 0;
    return -1;
}

/* The accumulator of reduction op over compute, or -1 for none. */
static int reduce_acc(ir_op op, kiln_dtype compute)
{
    switch (op) {
    case OP_SUM:
    case OP_PROD: return compute == KILN_I64 ? KILN_I64 : KILN_F64;
    case OP_MEAN: return KILN_F64; /* an integer mean too: nothing wraps */
    case OP_MAX:
    case OP_MIN: return compute;
    case OP_ARGMAX:
    case OP_ARGMIN: return KILN_I64;
    default: return -1;
    }
}

static int check_reduce(const kg_kernel *k, char *err, size_t err_size)
{
    char what[128];
    kg_describe(k, what, sizeof what);
    int acc = reduce_acc(k->op, k->compute);
    if (acc < 0)
        snprintf(err, err_size, "no reduction eager kernel for %s: %s is not sum, mean, max, min, argmax, prod or argmin", what,
                 ir_ops[k->op].name);
    else if (k->n_in != 1)
        snprintf(err, err_size, "no eager kernel for %s: a reduction takes 1 input", what);
    else if (k->compute != KILN_F32 && k->compute != KILN_F64 && k->compute != KILN_I64)
        snprintf(err, err_size, "no eager kernel for %s: reductions compute in f32, f64 or i64", what);
    else if ((int)k->acc != acc)
        snprintf(err, err_size, "no eager kernel for %s: %s accumulates in %s, not %s", what, ir_ops[k->op].name,
                 ir_dtype_names[acc], ir_dtype_names[k->acc]);
    else
        return 0;
    return -1;
}

static int check_matmul(const kg_kernel *k, char *err, size_t err_size)
{
    kiln_dtype dt = k->compute;
    if (k->op != OP_MATMUL || k->n_in != 2)
        snprintf(err, err_size, "a matmul eager kernel is OP_MATMUL of 2 inputs");
    else if (dt == KILN_BOOL)
        snprintf(err, err_size, "no matmul of %s", ir_dtype_names[dt]);
    else if (k->in[0] != dt || k->in[1] != dt || k->acc != dt || k->out != dt)
        snprintf(err, err_size, "a matmul eager kernel reads and writes its compute dtype %s", ir_dtype_names[dt]);
    else
        return 0;
    return -1;
}

void kg_matmul_grid(const kg_matmul_args *args, int tile_m, int tile_n, unsigned grid[3])
{
    enum { GRID_YZ_MAX = 65535 };
    int64_t tiles_m = (args->m + tile_m - 1) / tile_m;
    grid[0] = (unsigned)((args->n + tile_n - 1) / tile_n);
    grid[1] = (unsigned)(tiles_m < GRID_YZ_MAX ? tiles_m : GRID_YZ_MAX);
    grid[2] = (unsigned)(args->batch < GRID_YZ_MAX ? args->batch : GRID_YZ_MAX);
}

/* Scans, top-k and indexing: the op of the kind, and the dtypes its code
 * is written for. */
static int check_line_or_index(const kg_kernel *k, char *err, size_t err_size)
{
    char what[128];
    kg_describe(k, what, sizeof what);
    bool index_dtype = k->n_in == 2 && (k->in[k->op == OP_GATHER ? 1 : 0] == KILN_I32 ||
                                        k->in[k->op == OP_GATHER ? 1 : 0] == KILN_I64);
    if (k->kind == KG_SCAN && (k->op != OP_CUMSUM || k->n_in != 1 || k->acc != (k->compute == KILN_I64 ? KILN_I64 : KILN_F64) ||
                               (k->compute != KILN_F32 && k->compute != KILN_F64 && k->compute != KILN_I64)))
        snprintf(err, err_size, "no scan eager kernel for %s: cumsum of f32, f64 or i64, summed in f64 or i64", what);
    else if (k->kind == KG_TOPK && (k->op != OP_TOPK || k->n_in != 1 || k->out != KILN_I64 || k->compute != k->in[0]))
        snprintf(err, err_size, "no top-k eager kernel for %s: topk compares its input's dtype, gives i64", what);
    else if (k->kind == KG_RANDOM && (k->op != OP_UNIFORM || k->out != KILN_F32))
        snprintf(err, err_size, "no random eager kernel for %s: uniform f32 values", what);
    else if (k->kind == KG_INDEX && ((k->op != OP_GATHER && k->op != OP_SCATTER_ADD) || !index_dtype ||
                                     (k->op == OP_SCATTER_ADD && (k->out == KILN_BOOL || k->in[1] != k->out)) ||
                                     (k->op == OP_GATHER && k->in[0] != k->out)))
        snprintf(err, err_size, "no indexing eager kernel for %s: gather or scatter_add by i32 or i64 indices", what);
    else
        return 0;
    return -1;
}

int kg_check(const kg_kernel *k, char *err, size_t err_size)
{
    if (check_fields(k, err, err_size) < 0)
        return -1;
    switch (k->kind) {
    case KG_ELEMENTWISE: return check_elementwise(k, err, err_size);
    case KG_REDUCE: return check_reduce(k, err, err_size);
    case KG_MATMUL: return check_matmul(k, err, err_size);
    default: return check_line_or_index(k, err, err_size);
    }
}

int kg_name(const kg_kernel *k, char *name, size_t size, char *err, size_t err_size)
{
    if (check_fields(k, err, err_size) < 0)
        return -1;
    int used = snprintf(name, size, "kiln_eager_%s_%s_in", KIND_NAMES[k->kind], ir_ops[k->op].name);
    for (int i = 0; i < k->n_in && used > 0 && (size_t)used < size; i++)
        used += snprintf(name + used, size - (size_t)used, "_%s", ir_dtype_names[k->in[i]]);
    if (used > 0 && (size_t)used < size)
        used += snprintf(name + used, size - (size_t)used, "_compute_%s_acc_%s_out_%s",
                         ir_dtype_names[k->compute], ir_dtype_names[k->acc], ir_dtype_names[k->out]);
    if (used > 0 && (size_t)used < size)
        return 0;
    snprintf(err, err_size, "the name of eager kernel %s does not fit in %zu bytes", ir_ops[k->op].name, size);
    return -1;
}
