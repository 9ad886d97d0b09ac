/* Kernel IR to CUDA C.
 *
 * An elementwise kernel (no reductions) is one grid-stride loop over its
 * rows x cols elements, a thread per element. A kernel with reductions runs a
 * block per row: its threads stride over the row for each reduction, fold
 * their partial values with warp shuffles and then across warps through
 * shared memory, and the block then stores the row. The semantics are the
 * LLVM backend's (src/codegen_llvm/codegen.c): conversions as kiln_cast,
 * NaN-propagating max and min, sums in the reduction's own dtype. A store of
 * a reduction's pass is made by the thread that later reads it back in the
 * store pass: every loop over a row strides it alike. Its writers of
 * expressions, views and stores also write the epilogues matmul.c fuses.
 * A symbolic size is its polynomial in the symbols' values, which the
 * kernel's parameter kiln_symbols sz brings; a kernel that gathers
 * (kx_indexed) takes the gather's bad words after it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_nvrtc/internal.h"
#include "core/core.h"

/* -- Sizes, views and expressions ------------------------------------------ */

/* Writes size v of kernel k: a constant, or its polynomial over sz.s[]. */
static void put_size(strbuf *s, const kx_kernel *k, int64_t v)
{
    ir_poly p;
    if (v >= 0 || !ir_size_poly(&k->sizes, v, &p)) {
        strbuf_put(s, "%lldLL", (long long)v);
        return;
    }
    strbuf_put(s, "(");
    for (int t = 0; t < p.n; t++) {
        strbuf_put(s, "%s%lldLL", t ? " + " : "", (long long)p.terms[t].coef);
        for (int sym = 0; sym < IR_MAX_SYMBOLS; sym++)
            for (int e = 0; e < p.terms[t].exp[sym]; e++)
                strbuf_put(s, " * sz.s[%d]", sym);
    }
    strbuf_put(s, ")");
}

/* The element index of view v at loop index "i" of the current row. */
static void element(nvrtc_gen *g, int v)
{
    if (g->k->views[v].inner_stride) {
        strbuf_put(g->s, "v%d + i * ", v);
        put_size(g->s, g->k, g->k->views[v].inner_stride);
    } else {
        strbuf_put(g->s, "v%d", v);
    }
}

/* View v's element; for a bounded view, its fill outside its bounds (the
 * load then not evaluated). */
static void bounded_load(nvrtc_gen *g, int v)
{
    const kx_view *w = &g->k->views[v];
    if (w->n_bounds)
        strbuf_put(g->s, "(");
    for (int b = 0; b < w->n_bounds; b++) {
        char at[16];
        const kx_bound *d = &w->bounds[b];
        snprintf(at, sizeof at, d->dim == g->k->n_outer ? "i" : "o%d", d->dim);
        strbuf_put(g->s, "%s%s >= %lldLL && %s < %lldLL", b ? " && " : "", at, (long long)d->lo, at, (long long)d->hi);
    }
    strbuf_put(g->s, "%sb%d[", w->n_bounds ? " ? " : "", w->buffer);
    element(g, v);
    strbuf_put(g->s, "]");
    if (w->n_bounds) {
        strbuf_put(g->s, " : ");
        nvrtc_constant(g->s, w->dtype, w->fill);
        strbuf_put(g->s, ")");
    }
}

/* Gather n's column c<n> (its index, negative from the end) and whether it
 * is in range, ok<n>; the first index out of range goes to the bad words. */
static void gather_column(nvrtc_gen *g, int n)
{
    const kx_expr *e = &g->k->exprs[n];
    strbuf_put(g->s, "        const long long size%d = ", n);
    put_size(g->s, g->k, e->size);
    strbuf_put(g->s,
               ";\n"
               "        const long long c%d = e%d < 0 ? e%d + size%d : e%d;\n"
               "        const bool ok%d = (unsigned long long)c%d < (unsigned long long)size%d;\n"
               "        if (!ok%d && atomicCAS((unsigned long long *)bad, 0ull, 1ull) == 0ull) {\n"
               "            bad[%d] = e%d; bad[%d] = %d; bad[%d] = size%d;\n"
               "        }\n",
               n, e->args[0], e->args[0], n, e->args[0], n, n, n, n, KX_BAD_INDEX, e->args[0], KX_BAD_AXIS, e->axis,
               KX_BAD_SIZE, n);
}

void nvrtc_emit_expr(nvrtc_gen *g, int n, bool *done)
{
    if (!done || done[n] || g->err[0])
        return;
    const kx_expr *e = &g->k->exprs[n];
    for (int a = 0; a < 3 && (e->kind == KX_OP || e->kind == KX_CAST || e->kind == KX_GATHER) && e->args[a] >= 0; a++)
        nvrtc_emit_expr(g, e->args[a], done);
    done[n] = true;
    if (e->kind == KX_GATHER)
        gather_column(g, n);
    strbuf_put(g->s, "        %s e%d = ", nvrtc_ctype(e->dtype), n);
    char a[3][16] = {"", "", ""};
    for (int i = 0; i < 3 && (e->kind == KX_OP || e->kind == KX_CAST) && e->args[i] >= 0; i++)
        snprintf(a[i], sizeof a[i], "e%d", e->args[i]);
    switch (e->kind) {
    case KX_LOAD:
        if (g->replacement && e->view == g->replaced) {
            strbuf_put(g->s, "%s", g->replacement);
            break;
        }
        if (g->quads && g->k->views[e->view].inner_stride == 1) {
            strbuf_put(g->s, "((const float *)&q%d)[lane]", e->view);
            break;
        }
        bounded_load(g, e->view);
        break;
    case KX_GATHER:
        strbuf_put(g->s, "ok%d ? b%d[v%d + c%d * ", n, g->k->views[e->view].buffer, e->view, n);
        put_size(g->s, g->k, g->k->views[e->view].inner_stride);
        strbuf_put(g->s, "] : (%s)0", nvrtc_ctype(e->dtype));
        break;
    case KX_CONST: nvrtc_constant(g->s, e->dtype, e->value); break;
    case KX_ROW: strbuf_put(g->s, "r%d", e->row); break;
    case KX_CAST: nvrtc_convert(g->s, a[0], g->k->exprs[e->args[0]].dtype, e->dtype); break;
    case KX_OP: {
        kiln_dtype operand = g->k->exprs[e->args[e->op == OP_WHERE ? 1 : 0]].dtype;
        if (!nvrtc_op(g->s, e->op, operand, a[0], a[1], a[2]))
            snprintf(g->err, sizeof g->err, "%s on %s is not in the CUDA backend", ir_ops[e->op].name,
                     ir_dtype_names[operand]);
        break;
    }
    }
    strbuf_put(g->s, ";\n");
}

/* -- Kernels --------------------------------------------------------------- */

bool *nvrtc_new_loop(nvrtc_gen *g)
{
    bool *done = calloc((size_t)g->k->n_exprs + 1, sizeof *done);
    if (!done)
        snprintf(g->err, sizeof g->err, "out of memory");
    return done;
}

static void signature(nvrtc_gen *g, const char *name)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", NVRTC_BLOCK, name);
    for (int b = 0; b < k->n_buffers; b++)
        strbuf_put(g->s, "%s%s *__restrict__ b%d", b ? ", " : "", nvrtc_ctype(k->buffer_dtypes[b]), b);
    strbuf_put(g->s, "%skiln_symbols sz%s)\n{\n    (void)sz;\n", k->n_buffers ? ", " : "",
               kx_indexed(k) ? ", long long *__restrict__ bad" : "");
}

void nvrtc_view_bases(nvrtc_gen *g)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "        long long rest = row;\n");
    for (int d = k->n_outer - 1; d >= 0; d--) {
        if (d) {
            strbuf_put(g->s, "        long long o%d = rest %% ", d);
            put_size(g->s, k, k->outer[d]);
            strbuf_put(g->s, "; rest /= ");
            put_size(g->s, k, k->outer[d]);
            strbuf_put(g->s, ";\n");
        } else {
            strbuf_put(g->s, "        long long o0 = rest;\n");
        }
    }
    for (int v = 0; v < k->n_views; v++) {
        strbuf_put(g->s, "        long long v%d = ", v);
        put_size(g->s, k, k->views[v].offset);
        for (int d = 0; d < k->n_outer; d++) {
            if (k->views[v].outer_strides[d]) {
                strbuf_put(g->s, " + o%d * ", d);
                put_size(g->s, k, k->views[v].outer_strides[d]);
            }
        }
        strbuf_put(g->s, ";\n");
    }
    strbuf_put(g->s, "        (void)rest;\n");
}

void nvrtc_store_value(nvrtc_gen *g, const kx_store *st, bool *done)
{
    const kx_view *v = &g->k->views[st->view];
    nvrtc_emit_expr(g, st->expr, done);
    char text[16];
    snprintf(text, sizeof text, "e%d", st->expr);
    if (g->quads) {
        strbuf_put(g->s, "        ((float *)&w%d)[lane] = ", st->view);
    } else {
        strbuf_put(g->s, "        b%d[", v->buffer);
        element(g, st->view);
        strbuf_put(g->s, "] = ");
    }
    nvrtc_convert(g->s, text, g->k->exprs[st->expr].dtype, v->dtype);
    strbuf_put(g->s, ";\n");
}

/* Whether every element of k's rows can go 4 at a time: f32 throughout,
 * rows a multiple of 4, and every view either contiguous along the row from
 * a 16-byte boundary or the same for the whole row. */
static bool quads_fit(const kx_kernel *k)
{
    if (kx_symbolic(k) || k->cols % 4 || k->n_stores == 0 || kx_bounded(k)) /* (bounded loads are not quads) */
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
static void elementwise_quads(nvrtc_gen *g)
{
    const kx_kernel *k = g->k;
    bool *done = nvrtc_new_loop(g);
    g->quads = true;
    strbuf_put(g->s,
               "    for (long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x; at < %lldLL;\n"
               "         at += (long long)gridDim.x * blockDim.x) {\n"
               "        long long row = at / %lldLL, i0 = at %% %lldLL * 4;\n",
               (long long)(k->rows * (k->cols / 4)), (long long)(k->cols / 4), (long long)(k->cols / 4));
    nvrtc_view_bases(g);
    for (int v = 0; v < k->n_views; v++) {
        bool loaded = false;
        for (int e = 0; e < k->n_exprs && !loaded; e++)
            loaded = k->exprs[e].kind == KX_LOAD && k->exprs[e].view == v;
        if (loaded && k->views[v].inner_stride == 1)
            strbuf_put(g->s, "        float4 q%d = *(const float4 *)&b%d[v%d + i0];\n", v, k->views[v].buffer, v);
    }
    for (int s = 0; s < k->n_stores; s++)
        strbuf_put(g->s, "        float4 w%d;\n", k->stores[s].view);
    strbuf_put(g->s, "        #pragma unroll\n"
                     "        for (int lane = 0; lane < 4; lane++) {\n"
                     "        long long i = i0 + lane;\n"
                     "        (void)i;\n");
    for (int s = 0; done && s < k->n_stores; s++)
        nvrtc_store_value(g, &k->stores[s], done);
    strbuf_put(g->s, "        }\n");
    for (int s = 0; s < k->n_stores; s++) {
        const kx_view *v = &k->views[k->stores[s].view];
        strbuf_put(g->s, "        *(float4 *)&b%d[v%d + i0] = w%d;\n", v->buffer, k->stores[s].view, k->stores[s].view);
    }
    strbuf_put(g->s, "    }\n");
    g->quads = false;
    free(done);
}

nvrtc_layout nvrtc_layout_of(const kx_kernel *k)
{
    nvrtc_layout l = {.per_row = k->n_reductions > 0 || k->n_row_stores > 0};
    l.quads = !l.per_row && quads_fit(k);
    return l;
}

int64_t nvrtc_items(const nvrtc_layout *l, int64_t rows, int64_t cols)
{
    return l->per_row ? rows : l->quads ? rows * (cols / 4) : rows * cols;
}

static void elementwise(nvrtc_gen *g)
{
    const kx_kernel *k = g->k;
    if (nvrtc_layout_of(k).quads) {
        elementwise_quads(g);
        return;
    }
    bool *done = nvrtc_new_loop(g);
    strbuf_put(g->s, "    const long long rows = ");
    put_size(g->s, k, k->rows);
    strbuf_put(g->s, ", cols = ");
    put_size(g->s, k, k->cols ? k->cols : 1);
    strbuf_put(g->s,
               ";\n"
               "    for (long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x; at < rows * cols;\n"
               "         at += (long long)gridDim.x * blockDim.x) {\n"
               "        long long row = at / cols, i = at %% cols;\n");
    nvrtc_view_bases(g);
    for (int s = 0; done && s < k->n_stores; s++)
        nvrtc_store_value(g, &k->stores[s], done);
    strbuf_put(g->s, "    }\n");
    free(done);
}

/* The stores of pass (a reduction's, or KX_STORE_PASS) at element "i". */
static void stores_of(nvrtc_gen *g, int pass, bool *done)
{
    for (int s = 0; done && s < g->k->n_stores; s++)
        if (g->k->stores[s].pass == pass)
            nvrtc_store_value(g, &g->k->stores[s], done);
}

/* One reduction over the row: the threads' partial values, then the block's. */
static void reduce(nvrtc_gen *g, int n)
{
    const kx_kernel *k = g->k;
    const kx_reduction *r = &k->reductions[n];
    const char *t = nvrtc_ctype(r->dtype);
    bool *done = nvrtc_new_loop(g);
    strbuf_put(g->s, "        %s acc%d = ", t, n);
    nvrtc_value(g->s, r->dtype, r->identity);
    strbuf_put(g->s, ";\n        for (long long i = threadIdx.x; i < cols; i += blockDim.x) {\n");
    nvrtc_emit_expr(g, r->expr, done);
    char value[16], acc[16];
    snprintf(value, sizeof value, "e%d", r->expr);
    snprintf(acc, sizeof acc, "acc%d", n);
    strbuf_put(g->s, "        ");
    nvrtc_fold(g->s, r->op, r->dtype, acc, value);
    stores_of(g, kx_reduction_pass(n), done);
    strbuf_put(g->s, "        }\n");
    /* Warps fold by shuffles, then warp 0 folds the warps' values. */
    strbuf_put(g->s, "        for (int d = 16; d > 0; d /= 2) { %s other = kiln_shfl(acc%d, d); ", t, n);
    nvrtc_fold(g->s, r->op, r->dtype, acc, "other");
    strbuf_put(g->s, "        }\n"
                     "        __shared__ %s part%d[%d];\n"
                     "        if ((threadIdx.x & 31) == 0) part%d[threadIdx.x / 32] = acc%d;\n"
                     "        __syncthreads();\n"
                     "        if (threadIdx.x < 32) {\n"
                     "            acc%d = threadIdx.x < blockDim.x / 32 ? part%d[threadIdx.x] : ",
               t, n, NVRTC_BLOCK / 32, n, n, n, n);
    nvrtc_value(g->s, r->dtype, r->identity);
    strbuf_put(g->s, ";\n            for (int d = 16; d > 0; d /= 2) { %s other = kiln_shfl(acc%d, d); ", t, n);
    nvrtc_fold(g->s, r->op, r->dtype, acc, "other");
    strbuf_put(g->s, "            }\n"
                     "            if (threadIdx.x == 0) part%d[0] = acc%d;\n"
                     "        }\n"
                     "        __syncthreads();\n",
               n, n);
    if (r->op == OP_MEAN)
        strbuf_put(g->s, "        %s r%d = (%s)part%d[0] / cols;\n", nvrtc_ctype(r->result), n,
                   nvrtc_ctype(r->result), n);
    else
        strbuf_put(g->s, "        %s r%d = part%d[0];\n", t, n, n);
    strbuf_put(g->s, "        __syncthreads();\n"); /* part%d is read by all before the next row reuses it */
    free(done);
}

static void row_kernel(nvrtc_gen *g)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "    const long long rows = ");
    put_size(g->s, k, k->rows);
    strbuf_put(g->s, ", cols = ");
    put_size(g->s, k, k->cols);
    strbuf_put(g->s, ";\n    (void)cols;\n"
                     "    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    nvrtc_view_bases(g);
    for (int r = 0; r < k->n_reductions; r++)
        reduce(g, r);
    bool *done = nvrtc_new_loop(g), stores = false;
    for (int s = 0; s < k->n_stores; s++)
        stores |= k->stores[s].pass == KX_STORE_PASS;
    if (stores) {
        strbuf_put(g->s, "        for (long long i = threadIdx.x; i < cols; i += blockDim.x) {\n");
        stores_of(g, KX_STORE_PASS, done);
        strbuf_put(g->s, "        }\n");
    }
    for (int s = 0; s < k->n_row_stores; s++) {
        const kx_row_store *rs = &k->row_stores[s];
        char text[16];
        snprintf(text, sizeof text, rs->expr >= 0 ? "e%d" : "r%d", rs->expr >= 0 ? rs->expr : rs->row);
        strbuf_put(g->s, "        if (threadIdx.x == 0) {\n");
        bool *epilogue = rs->expr >= 0 ? nvrtc_new_loop(g) : NULL; /* loads constant along the row */
        nvrtc_emit_expr(g, rs->expr, epilogue);
        free(epilogue);
        strbuf_put(g->s, "        b%d[row] = ", rs->buffer);
        nvrtc_convert(g->s, text, rs->from, rs->dtype);
        strbuf_put(g->s, ";\n        }\n");
    }
    strbuf_put(g->s, "    }\n");
    free(done);
}

char *nvrtc_source(const kx_kernel *k, const char *name, char *err, size_t err_size)
{
    KILN_ASSERT(k->n_buffers <= KX_MAX_BUFFERS);
    strbuf s = {0};
    nvrtc_gen g = {.k = k, .s = &s};
    strbuf_put(&s, "%s\n", NVRTC_PRELUDE);
    signature(&g, name);
    if (nvrtc_layout_of(k).per_row)
        row_kernel(&g);
    else
        elementwise(&g);
    strbuf_put(&s, "}\n");
    char *text = strbuf_finish(&s);
    if (g.err[0] || !text) {
        snprintf(err, err_size, "%s", g.err[0] ? g.err : "out of memory");
        free(text);
        return NULL;
    }
    return text;
}
