/* Planning a graph: lowering into steps, then every decision the code of the
 * kernels depends on, made before they are frozen, then liveness and memory.
 *
 * The decisions, in order, each asking the backend what it does:
 * - softmax(x) @ v, where x is computed elementwise from a product q @ kᵀ
 *   (scaled, masked) that only the softmax reads, is one attention kernel
 *   where the backend has one: neither x nor the weights are stored;
 * - a matmul's product that only one elementwise kernel reads is computed
 *   inside that kernel, tile by tile, and never stored, where the backend
 *   fuses such an epilogue; the product's operands then live until that
 *   kernel runs;
 * - a product that such a kernel reads beside the one it computes (a
 *   residual block's two convolutions added) is a kernel of its own, the
 *   product stored as it is, where the backend compiles one: not eager;
 * - and its left operand, when an elementwise kernel that only the product
 *   reads computes it, is computed while the product packs it, where the
 *   backend takes such a prologue (its inputs then live until the product);
 * - an elementwise kernel whose input dies with it, and which reads that
 *   input only at the element it stores, writes over it: the input stops
 *   being a buffer, and its loads read the output's buffer, which holds its
 *   values (a matmul's bias and activation epilogue, say);
 * - on a backend that runs any range of rows (the CPU), a large f32 product
 *   that only such an in-place kernel reads is computed a block of rows at a
 *   time, the kernel run on each block while it is in cache;
 * - a kernel storing at least the backend's stream_bytes along its rows, and
 *   not run on blocks still in cache, stores around the caches.
 * What it must preserve: every value is computed before its users and lives
 * until its last one; nothing is overwritten that is read later. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/backend.h"
#include "ir/internal.h"

/* -- Uses and liveness --------------------------------------------------------- */

const ir_ref *ir_plan_uses(const ir_plan *p, ir_ref r, uint32_t *n)
{
    int step = p->step_of ? p->step_of[r] : -1;
    if (step >= 0 && p->steps[step].kernel) {
        *n = (uint32_t)p->steps[step].n_uses;
        return p->steps[step].uses;
    }
    if (p->step_of && (step < 0 || !p->materialized[r])) { /* a source, or computed inside a kernel */
        *n = 0;
        return NULL;
    }
    const ir_node *node = &p->graph->nodes[r];
    *n = node->n_operands;
    return ir_operands(p->graph, node);
}

/* Step s's uses from its buffers, what it writes over and its product. */
static int set_uses(const ir_plan *p, plan_step *s)
{
    ir_ref *uses = realloc(s->uses, ((size_t)s->n_inputs + 4) * sizeof *uses);
    if (!uses)
        return -CORE_NOMEM;
    int n = 0;
    for (int b = 0; b < s->n_inputs; b++)
        if (b != s->kernel->product)
            uses[n++] = s->buffers[b];
    if (s->reuses != IR_NONE)
        uses[n++] = s->reuses;
    if (s->product != IR_NONE) {
        const ir_ref *ops = ir_operands(p->graph, &p->graph->nodes[s->product]);
        if (!s->kernel->prologue)
            uses[n++] = ops[0];
        uses[n++] = ops[1];
    }
    if (s->kernel->attention) /* v, the weights' right operand */
        uses[n++] = ir_operands(p->graph, &p->graph->nodes[s->node])[1];
    s->uses = uses;
    s->n_uses = n;
    return 0;
}

static void plan_liveness(ir_plan *p)
{
    const ir_graph *g = p->graph;
    for (ir_ref r = 0; r < g->count; r++) {
        p->last_use[r] = r;
        uint32_t n;
        const ir_ref *used = ir_plan_uses(p, r, &n);
        for (uint32_t i = 0; i < n; i++)
            p->last_use[used[i]] = r;
    }
    for (int i = 0; i < g->n_outputs; i++)
        p->last_use[g->outputs[i]] = g->count;
    for (int i = 0; i < g->n_writebacks; i++)
        p->last_use[g->writebacks[i].value] = g->count;
}

/* How many reads of value r the plan makes. */
static int readers(const ir_plan *p, ir_ref r)
{
    int count = 0;
    for (ir_ref at = r + 1; at < p->graph->count; at++) {
        uint32_t n;
        const ir_ref *used = ir_plan_uses(p, at, &n);
        for (uint32_t i = 0; i < n; i++)
            count += used[i] == r;
    }
    return count;
}

static bool computes(const ir_plan *p, ir_ref r)
{
    int step = p->step_of ? p->step_of[r] : -1;
    if (step >= 0 && p->steps[step].kernel)
        return true;
    return ir_node_computes(&p->graph->nodes[r]);
}

bool ir_plan_stores(const ir_plan *p, ir_ref r)
{
    return p->materialized[r] && computes(p, r);
}

/* Whether node r's value is made by an eager step (a matmul run by BLAS). */
static bool eager_step(const ir_plan *p, ir_ref r)
{
    return p->step_of[r] >= 0 && !p->steps[p->step_of[r]].kernel;
}

/* -- Products inside their epilogue ------------------------------------------ */

/* Whether matmul node n multiplies f32 (or f64) matrices (or batches of
 * them). */
static bool float_matrices(const ir_graph *g, const ir_node *n)
{
    const ir_ref *ops = ir_operands(g, n);
    const ir_node *a = &g->nodes[ops[0]], *b = &g->nodes[ops[1]];
    return (n->dtype == KILN_F32 || n->dtype == KILN_F64) && a->dtype == n->dtype && b->dtype == n->dtype &&
           a->ndim >= 2 && b->ndim >= 2;
}

/* Rows of matmul node n's matrices (symbolic, perhaps), their columns and
 * how many matrices there are (concrete); false unless float_matrices, with
 * a concrete batch and columns and no empty matrix. */
static bool matmul_dims(const ir_graph *g, const ir_node *n, int64_t *m, int64_t *cols, int64_t *batch)
{
    if (!float_matrices(g, n) || ir_shape_symbolic(n->ndim - 2, n->shape) || n->shape[n->ndim - 1] < 0)
        return false;
    *m = n->shape[n->ndim - 2];
    *cols = n->shape[n->ndim - 1];
    ir_shape_numel(n->ndim - 2, n->shape, batch);
    return *batch > 0 && *m != 0 && *cols > 0;
}

/* A conv2d node's window as a product's (kx_conv). */
static kx_conv conv_of(const ir_graph *g, const ir_node *n)
{
    const ir_ref *ops = ir_operands(g, n);
    const ir_node *x = &g->nodes[ops[0]], *w = &g->nodes[ops[1]];
    const int32_t *p = n->params.perm;
    kx_conv c = {.channels = w->shape[1], .height = x->shape[2], .width = x->shape[3], .out_width = n->shape[3],
                 .kh = w->shape[2], .kw = w->shape[3]};
    for (int d = 0; d < 2; d++) {
        c.stride[d] = p[IR_CONV_STRIDE + d];
        c.padding[d] = p[IR_CONV_PADDING + d];
        c.dilation[d] = p[IR_CONV_DILATION + d];
    }
    return c;
}

/* The rows and columns of the product that node n (a matmul, or a conv2d
 * the backend computes as one) is, as an epilogue sees it; false when n is
 * neither or not of float matrices. A convolution's rows are its images'
 * channels, its columns their pixels. */
static bool product_dims(const ir_plan *p, const kx_backend *be, const ir_node *n, kx_kernel *k,
                         int64_t *rows, int64_t *cols)
{
    if (n->op == OP_CONV2D && be->conv_products && n->shape[1] > 0 && n->shape[2] * n->shape[3] > 0) {
        *rows = ir_shape_product(&k->sizes, 2, n->shape);
        *cols = n->shape[2] * n->shape[3];
        return true;
    }
    if (n->op != OP_MATMUL || !float_matrices(p->graph, n))
        return false;
    *rows = ir_shape_product(&k->sizes, n->ndim - 1, n->shape);
    *cols = n->shape[n->ndim - 1];
    return true;
}

/* Whether kernel k may compute matmul (or conv2d) node n as its buffer b,
 * its rows and columns the product's: k as it was when not. */
static bool takes_product(const ir_plan *p, const kx_backend *be, kx_kernel *k, int b, const ir_node *n)
{
    kx_kernel before = *k;
    int64_t rows, cols;
    char why[256];
    if (!product_dims(p, be, n, k, &rows, &cols))
        return false;
    if (kx_join_cols(k, cols) && k->rows == rows) {
        k->product = b;
        if (n->op == OP_CONV2D)
            k->conv = conv_of(p->graph, n);
        if (be->supports(k, why, sizeof why))
            return true;
    }
    /* as it was (kx_join_cols) */
    k->n_outer = before.n_outer;
    memcpy(k->outer, before.outer, sizeof k->outer);
    k->rows = before.rows;
    k->cols = before.cols;
    k->product = -1;
    k->conv = (kx_conv){0};
    return false;
}

/* Whether kernel step s may compute matmul (or conv2d) node r, its input b,
 * itself. */
static bool fuses_product(const ir_plan *p, const kx_backend *be, plan_step *s, int b, ir_ref r)
{
    return p->last_use[r] == s->node && eager_step(p, r) && readers(p, r) == 1 &&
           takes_product(p, be, s->kernel, b, &p->graph->nodes[r]);
}

static int plan_products(ir_plan *p, const kx_backend *be)
{
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        for (int b = 0; s->kernel && b < s->n_inputs && s->product == IR_NONE; b++) {
            ir_ref r = s->buffers[b];
            if (!fuses_product(p, be, s, b, r))
                continue;
            s->product = r;
            p->materialized[r] = false;
            int status = set_uses(p, s);
            if (status < 0)
                return status;
            plan_liveness(p); /* the operands now live until s */
        }
    }
    return 0;
}

/* -- A product beside another ------------------------------------------------ */

/* Whether eager step s is a product whose one reader is a kernel that
 * computes another product inside, so cannot compute this one. */
static bool beside_product(const ir_plan *p, const plan_step *s)
{
    ir_ref reader = p->last_use[s->node];
    ir_op op = p->graph->nodes[s->node].op;
    if (s->kernel || (op != OP_MATMUL && op != OP_CONV2D) || reader >= p->graph->count || readers(p, s->node) != 1)
        return false;
    int at = p->step_of[reader];
    return at >= 0 && p->steps[at].kernel && p->steps[at].product != IR_NONE;
}

/* Makes eager product step s a kernel of its own that computes the product
 * and stores it as it is, where the backend compiles that: compiled, its
 * left operand then kept packed (or computed by a prologue) as a fused
 * product's is, not run by the eager ops (a convolution's composite). */
static int own_product(ir_plan *p, const kx_backend *be, plan_step *s)
{
    bool nomem = false;
    kx_kernel *k = ir_lower_copy(p->graph, s->node, &nomem);
    if (!k || !takes_product(p, be, k, 0, &p->graph->nodes[s->node])) {
        kx_kernel_free(k);
        return nomem ? -CORE_NOMEM : 0;
    }
    if (!(s->buffers = malloc(2 * sizeof *s->buffers))) {
        kx_kernel_free(k);
        return -CORE_NOMEM;
    }
    s->buffers[0] = s->buffers[1] = s->node; /* the product's slot, and its output */
    s->kernel = k;
    s->n_inputs = s->n_outputs = 1;
    s->product = s->node;
    return set_uses(p, s);
}

static int plan_own_products(ir_plan *p, const kx_backend *be)
{
    int status = 0;
    for (int i = 0; i < p->n_steps && status == 0; i++)
        if (beside_product(p, &p->steps[i]))
            status = own_product(p, be, &p->steps[i]);
    return status;
}

/* -- A product's left operand computed while it is packed ----------------- */

/* The kernel step computing A, the left operand of step s's product, when
 * the product may compute A itself while packing it: an elementwise kernel
 * over A's own rows and columns, of the product's dtype and batch (not
 * broadcast), whose value only the product reads; else -1. */
static int prologue_step(const ir_plan *p, const plan_step *s)
{
    const ir_node *product = &p->graph->nodes[s->product];
    if (product->op != OP_MATMUL) /* a convolution's A is its filters, read as they are */
        return -1;
    ir_ref a = ir_operands(p->graph, product)[0];
    const ir_node *an = &p->graph->nodes[a];
    int sa = p->step_of[a];
    const kx_kernel *k = sa >= 0 ? p->steps[sa].kernel : NULL;
    if (!k || k->n_reductions || k->n_row_stores || k->n_stores != 1 || k->product >= 0 || kx_rows_fixed(k) ||
        an->ndim != product->ndim ||
        an->dtype != product->dtype || k->cols != an->shape[an->ndim - 1] || readers(p, a) != 1 ||
        p->last_use[a] != s->node)
        return -1;
    for (int d = 0; d + 2 < an->ndim; d++)
        if (an->shape[d] != product->shape[d])
            return -1;
    return sa;
}

/* Inserts value node, of dtype dt, among step s's inputs (before its
 * outputs) unless it is one: its buffer index, or -1 out of memory. */
static int add_input(plan_step *s, ir_ref node, kiln_dtype dt)
{
    for (int b = 0; b < s->n_inputs; b++)
        if (s->buffers[b] == node && b != s->kernel->product)
            return b;
    kx_kernel *k = s->kernel;
    ir_ref *buffers = realloc(s->buffers, ((size_t)k->n_buffers + 1) * sizeof *buffers);
    if (!buffers)
        return -1;
    s->buffers = buffers;
    int at = s->n_inputs;
    for (int b = k->n_buffers; b > at; b--) {
        buffers[b] = buffers[b - 1];
        k->buffer_dtypes[b] = k->buffer_dtypes[b - 1];
    }
    for (int v = 0; v < k->n_views; v++)
        k->views[v].buffer += k->views[v].buffer >= at;
    for (int r = 0; r < k->n_row_stores; r++)
        k->row_stores[r].buffer += k->row_stores[r].buffer >= at;
    buffers[at] = node;
    k->buffer_dtypes[at] = dt;
    k->n_buffers++;
    s->n_inputs++;
    return at;
}

/* Moves step sa's kernel into step s's as its prologue: sa's inputs become
 * s's (its loads renumbered), its store's view points at the product's
 * slot, and sa runs no more. */
static int take_prologue(ir_plan *p, plan_step *s, plan_step *sa)
{
    kx_kernel *pro = sa->kernel;
    int map[KX_MAX_BUFFERS];
    for (int b = 0; b < sa->n_inputs; b++)
        if ((map[b] = add_input(s, sa->buffers[b], pro->buffer_dtypes[b])) < 0)
            return -CORE_NOMEM;
    map[sa->n_inputs] = s->kernel->product;
    for (int v = 0; v < pro->n_views; v++)
        pro->views[v].buffer = map[pro->views[v].buffer];
    pro->n_buffers = s->kernel->n_buffers;
    memcpy(pro->buffer_dtypes, s->kernel->buffer_dtypes, sizeof pro->buffer_dtypes);
    s->kernel->prologue = pro;
    sa->kernel = NULL;
    p->materialized[sa->node] = false;
    return set_uses(p, s);
}

static int plan_prologues(ir_plan *p, const kx_backend *be)
{
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        int sa = s->product != IR_NONE && !s->kernel->attention ? prologue_step(p, s) : -1;
        if (sa < 0 || s->kernel->n_buffers + p->steps[sa].n_inputs > KX_MAX_BUFFERS)
            continue;
        char why[256];
        s->kernel->prologue = p->steps[sa].kernel; /* asked as it would be */
        bool supported = be->supports(s->kernel, why, sizeof why);
        s->kernel->prologue = NULL;
        int status = supported ? take_prologue(p, s, &p->steps[sa]) : 0;
        if (status < 0)
            return status;
        if (supported)
            plan_liveness(p);
    }
    return 0;
}

/* -- Attention in one kernel ---------------------------------------------------- */

static ir_ref operand(const ir_graph *g, ir_ref r, int i)
{
    return ir_operands(g, &g->nodes[r])[i];
}

/* Whether node r is op of x along its last axis, kept. */
static bool row_reduction(const ir_graph *g, ir_ref r, ir_op op, ir_ref x)
{
    const ir_node *n = &g->nodes[r];
    return n->op == op && operand(g, r, 0) == x && n->params.keepdim &&
           (n->params.axis == n->ndim - 1 || n->params.axis == -1);
}

/* The x of w = softmax(x) along rows as kiln_softmax writes it, exp(x -
 * max(x)) / sum(exp(x - max(x))), or IR_NONE. */
static ir_ref softmax_of(const ir_graph *g, ir_ref w)
{
    if (g->nodes[w].op != OP_DIV)
        return IR_NONE;
    ir_ref e = operand(g, w, 0), d = operand(g, e, 0);
    if (g->nodes[e].op != OP_EXP || !row_reduction(g, operand(g, w, 1), OP_SUM, e) || g->nodes[d].op != OP_SUB)
        return IR_NONE;
    ir_ref x = operand(g, d, 0);
    return row_reduction(g, operand(g, d, 1), OP_MAX, x) ? x : IR_NONE;
}

static bool same_shape(const ir_node *a, const ir_node *b, int dims)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)dims * sizeof *a->shape);
}

/* The input of softmax step sk that is the scores' product q @ kᵀ, to be
 * computed inside the attention kernel of weights @ v (node r2): a float
 * product of x's shape, which only sk reads; -1 if none. */
static int scores_input(const ir_plan *p, const plan_step *sk, ir_ref x, ir_ref r2)
{
    const ir_graph *g = p->graph;
    const ir_node *xn = &g->nodes[x], *out = &g->nodes[r2];
    for (int b = 0; b < sk->n_inputs; b++) {
        ir_ref r1 = sk->buffers[b];
        const ir_node *n = &g->nodes[r1];
        if (n->op == OP_MATMUL && eager_step(p, r1) && float_matrices(g, n) && n->dtype == out->dtype &&
            readers(p, r1) == 1 && p->last_use[r1] == sk->node && same_shape(n, xn, n->ndim) &&
            same_shape(n, out, n->ndim - 2) && sk->kernel->rows == ir_shape_product(&sk->kernel->sizes, n->ndim - 1, n->shape) &&
            sk->kernel->cols == n->shape[n->ndim - 1])
            return b;
    }
    return -1;
}

/* The max reduction of softmax kernel k (its expression is the scores x),
 * or -1: k folds a max and a sum and stores the weights, nothing else. */
static int softmax_max(const kx_kernel *k)
{
    if (k->n_reductions != 2 || k->n_row_stores || k->product >= 0 || k->prologue || kx_rows_fixed(k))
        return -1;
    for (int r = 0; r < 2; r++)
        if (k->reductions[r].op == OP_MAX)
            return r;
    return -1;
}

/* Turns softmax kernel k into attention's: its one store x, its product
 * the scores at buffer b, where the backend takes it; false (k as it was)
 * where not. */
static bool to_attention(const kx_backend *be, kx_kernel *k, int b)
{
    int max = softmax_max(k);
    if (max < 0)
        return false;
    int n_stores = k->n_stores;
    kx_store x = {.view = k->stores[k->n_stores - 1].view, .expr = k->reductions[max].expr, .pass = KX_STORE_PASS};
    kx_store first = k->stores[0];
    k->stores[0] = x;
    k->n_stores = 1;
    k->n_reductions = 0;
    k->product = b;
    k->attention = true;
    char why[256];
    if (be->supports(k, why, sizeof why))
        return true;
    k->stores[0] = first;
    k->n_stores = n_stores;
    k->n_reductions = 2;
    k->product = -1;
    k->attention = false;
    return false;
}

/* Eager step s2, weights @ v, takes over the kernel of softmax step sk, which
 * becomes attention's over product r1. */
static int take_attention(ir_plan *p, plan_step *s2, plan_step *sk, ir_ref r1)
{
    s2->kernel = sk->kernel;
    s2->buffers = sk->buffers;
    s2->buffers[sk->n_inputs] = s2->node;
    s2->n_inputs = sk->n_inputs;
    s2->n_outputs = 1;
    s2->product = r1;
    s2->options = sk->options;
    sk->kernel = NULL;
    sk->buffers = NULL;
    p->materialized[sk->node] = false;
    p->materialized[r1] = false;
    return set_uses(p, s2);
}

/* softmax(x) @ v, x computed from a product q @ kᵀ (scaled and masked as
 * the softmax kernel does it), runs as one kernel where the backend takes
 * it, so the scores and weights are never stored. */
static int plan_attention(ir_plan *p, const kx_backend *be)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s2 = &p->steps[i];
        ir_ref r2 = s2->node, w, x;
        if (s2->kernel || g->nodes[r2].op != OP_MATMUL || !float_matrices(g, &g->nodes[r2]) ||
            (x = softmax_of(g, w = operand(g, r2, 0))) == IR_NONE || p->step_of[w] < 0 || readers(p, w) != 1 ||
            g->nodes[operand(g, r2, 1)].dtype != g->nodes[r2].dtype)
            continue;
        plan_step *sk = &p->steps[p->step_of[w]];
        int b = sk->kernel && sk->n_outputs == 1 ? scores_input(p, sk, x, r2) : -1;
        if (b < 0 || !to_attention(be, sk->kernel, b))
            continue;
        int status = take_attention(p, s2, sk, sk->buffers[b]);
        if (status < 0)
            return status;
        plan_liveness(p);
    }
    return 0;
}

/* -- Writing over an input ---------------------------------------------------- */

static bool same_view(const kx_kernel *k, const kx_view *v, const kx_view *w)
{
    return v->offset == w->offset && v->inner_stride == w->inner_stride && v->dtype == w->dtype &&
           !memcmp(v->outer_strides, w->outer_strides, (size_t)k->n_outer * sizeof *v->outer_strides);
}

/* An elementwise kernel storing one value: one that reads an input only
 * at the element it stores may write over that input (each element is read
 * before it is overwritten, in whatever order the loop runs); a gather
 * reads other elements. */
static bool in_place_kernel(const plan_step *s)
{
    const kx_kernel *k = s->kernel;
    return k && k->product < 0 && !k->n_reductions && !k->n_row_stores && k->n_stores == 1 && s->n_outputs == 1 &&
           !kx_indexed(k);
}

/* Whether input b of step s, its last reader, may hold the output: the
 * output's dtype and size, every read of it at the element stored, and no
 * other slot of the step the same value. */
static bool in_place_fits(const ir_plan *p, const plan_step *s, int b)
{
    kx_kernel *k = s->kernel;
    const kx_view *out = &k->views[k->stores[0].view];
    const ir_node *node = &p->graph->nodes[s->node];
    ir_ref input = s->buffers[b];
    const ir_node *in = &p->graph->nodes[input];
    bool fits = p->last_use[input] == s->node && in->dtype == node->dtype &&
                ir_shape_product(&k->sizes, in->ndim, in->shape) ==
                    ir_shape_product(&k->sizes, node->ndim, node->shape);
    for (int v = 0; fits && v < k->n_views; v++)
        if (k->views[v].buffer == b)
            fits = same_view(k, &k->views[v], out);
    for (int other = 0; fits && other < s->n_inputs; other++)
        fits = other == b || s->buffers[other] != input;
    return fits;
}

/* The input buffer an in_place_kernel step s may write its output into, a
 * value the plan computes, or -1. */
static int in_place_input(const ir_plan *p, const plan_step *s)
{
    for (int b = 0; b < s->n_inputs; b++)
        if (ir_plan_stores(p, s->buffers[b]) && in_place_fits(p, s, b))
            return b;
    return -1;
}

/* Drops buffer b of step s, its loads reading the output's buffer instead. */
static void read_through_output(plan_step *s, int b)
{
    kx_kernel *k = s->kernel;
    int out = k->views[k->stores[0].view].buffer;
    for (int v = 0; v < k->n_views; v++) {
        int at = k->views[v].buffer == b ? out : k->views[v].buffer;
        k->views[v].buffer = at > b ? at - 1 : at;
    }
    for (int r = 0; r < k->n_row_stores; r++)
        k->row_stores[r].buffer -= k->row_stores[r].buffer > b;
    for (int i = b; i + 1 < k->n_buffers; i++) {
        k->buffer_dtypes[i] = k->buffer_dtypes[i + 1];
        s->buffers[i] = s->buffers[i + 1];
    }
    k->n_buffers--;
    s->n_inputs--;
}

/* The input buffer of step s holding the capture that its output is
 * written back to, when the kernel may write the new value over the
 * capture itself (then the writeback has nothing to copy, and the new
 * value takes no memory): the step reads the capture last (the tracer
 * refuses views of it read after its assignment), and the output is no
 * result of the call. No other source shares the capture's storage: a call
 * with an input that does runs eagerly, and the tracer refuses a capture
 * that does. -1 otherwise. */
static int capture_input(const ir_plan *p, const plan_step *s)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == s->node)
            return -1;
    for (int w = 0; w < g->n_writebacks; w++) {
        if (g->writebacks[w].value != s->node)
            continue;
        for (int b = 0; b < s->n_inputs; b++) {
            ir_ref c = s->buffers[b];
            const ir_node *in = &g->nodes[c];
            if (in->op == OP_CAPTURE && in->params.index == g->writebacks[w].capture &&
                in_place_fits(p, s, b))
                return b;
        }
    }
    return -1;
}

static int plan_in_place(ir_plan *p)
{
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        int b = -1;
        if (in_place_kernel(s) && (b = capture_input(p, s)) < 0)
            b = in_place_input(p, s);
        if (b < 0)
            continue;
        s->reuses = s->buffers[b];
        read_through_output(s, b);
        int status = set_uses(p, s);
        if (status < 0)
            return status;
    }
    return 0;
}

/* -- Products in blocks ------------------------------------------------------- */

/* The inner dimension of matmul node n (negative: symbolic). */
static int64_t inner_dim(const ir_graph *g, const ir_node *n)
{
    const ir_node *a = &g->nodes[ir_operands(g, n)[0]];
    return a->shape[a->ndim - 1];
}

static int64_t gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Rows of an f32 product [batch, m, n] of inner dimension inner per block,
 * each block's end a row end of kernel k (which runs over the same elements
 * in place); 0 when blocks would not pay. Each block's GEMM packs b again,
 * inner x n, which costs about what keeping inner rows of the product in
 * cache saves: a block needs several times inner rows. */
static int64_t rows_per_block(const kx_kernel *k, int64_t block_bytes, int64_t m, int64_t n, int64_t inner,
                              int64_t batch)
{
    if (k->cols <= 0 || inner < 0 || (m < 0 && batch > 1))
        return 0;
    int64_t step = k->cols / gcd(n, k->cols);
    /* A symbolic product may be small at run time: one block then. */
    if (block_bytes <= 0 || (m >= 0 && batch * m * n * (int64_t)sizeof(float) < 4 * block_bytes) ||
        (batch > 1 && m * n % k->cols != 0))
        return 0;
    int64_t rows = block_bytes / (n * (int64_t)sizeof(float)) / step * step;
    return rows >= 4 * inner && rows > 0 ? rows : 0;
}

/* Whether step s's uses other than the product r exist before r runs:
 * computed earlier, or the function's inputs, captures, constants. */
static bool inputs_ready_before(const ir_plan *p, const plan_step *s, ir_ref r)
{
    for (int i = 0; i < s->n_uses; i++) {
        ir_op op = p->graph->nodes[s->uses[i]].op;
        if (s->uses[i] != r && s->uses[i] > r && op != OP_INPUT && op != OP_CAPTURE && op != OP_CONST)
            return false;
    }
    return true;
}

static void plan_blocks(ir_plan *p, int64_t block_bytes)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        ir_ref r = s->reuses;
        const ir_node *n = r != IR_NONE ? &g->nodes[r] : NULL;
        int64_t m, cols, batch, rows;
        if (!n || n->op != OP_MATMUL || !eager_step(p, r) || readers(p, r) != 1 ||
            !matmul_dims(g, n, &m, &cols, &batch) || !inputs_ready_before(p, s, r) ||
            (rows = rows_per_block(s->kernel, block_bytes, m, cols, inner_dim(g, n), batch)) == 0)
            continue;
        plan_step *product = &p->steps[p->step_of[r]];
        s->blocked_with = p->step_of[r];
        product->blocked_with = i;
        product->block_rows = rows;
        p->products_in_blocks++;
    }
}

/* -- Streaming stores --------------------------------------------------------- */

/* A store in a reduction's pass is read back from cache by the store pass,
 * and an epilogue in blocks rewrites lines still in cache: non-temporal
 * stores would evict them (softmax 4096x4096: 17 ms against 12), unless
 * the kernel keeps that row in a scratch row of its own (kx_kept_view:
 * softmax's exponentials in rows of up to 64 KiB), from which the store
 * pass streams the output once. A product's epilogue stores a tile at a
 * time, never whole lines. A kernel costly per element (gelu's, mish's
 * transcendentals) gains nothing from not reading its output, which its
 * arithmetic hides, and its non-temporal stores measured slower than plain
 * ones (gelu 2^24 on 2 threads: 0.75 to 0.92 of the streamed time); cheap
 * ones (layer and RMS norms) gain, and so does softmax from its scratch
 * row, whose store pass is cheap. */
static bool streams(const plan_step *s, int64_t stream_bytes)
{
    const kx_kernel *k = s->kernel;
    int kept = kx_kept_view(k); /* its store pass is lower.c's stage_store: a load and one op by a row value */
    if (s->blocked_with >= 0 || s->product != IR_NONE || (k->transcendental && kept < 0))
        return false;
    /* The fewest bytes: symbols are 2 or more. */
    const int64_t twos[IR_MAX_SYMBOLS] = {2, 2, 2, 2, 2, 2, 2, 2};
    int64_t bytes = 0, elements = kx_size(k, k->rows, twos) * kx_size(k, k->cols, twos);
    for (int i = 0; i < k->n_stores; i++) {
        const kx_view *v = &k->views[k->stores[i].view];
        if (k->stores[i].pass != KX_STORE_PASS && k->stores[i].view == kept)
            continue;
        if (v->inner_stride != 1 || k->stores[i].pass != KX_STORE_PASS)
            return false;
        bytes += elements * (int64_t)ir_dtype_size(v->dtype);
    }
    return bytes >= stream_bytes;
}

static void plan_streams(ir_plan *p, int64_t stream_bytes)
{
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].kernel)
            p->steps[i].options.stream_stores = streams(&p->steps[i], stream_bytes);
}

/* -- Memory ------------------------------------------------------------------ */

/* Bytes of node r's value; symbolic values as when the graph was traced. */
static int64_t bytes_of(const ir_graph *g, ir_ref r)
{
    const ir_node *n = &g->nodes[r];
    int64_t shape[KILN_MAX_DIMS], numel;
    if (!ir_shape_eval(&g->sizes, n->ndim, n->shape, g->traced_at, shape) || !ir_shape_numel(n->ndim, shape, &numel))
        return INT64_MAX;
    return numel * (int64_t)ir_dtype_size(n->dtype);
}

/* Bytes of stored values other than kept that node r reads last (each once). */
static int64_t bytes_dying_at(const ir_plan *p, ir_ref r, ir_ref kept)
{
    uint32_t n;
    const ir_ref *used = ir_plan_uses(p, r, &n);
    int64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool repeated = false;
        for (uint32_t j = 0; j < i && !repeated; j++)
            repeated = used[j] == used[i];
        if (!repeated && used[i] != kept && p->last_use[used[i]] == r && ir_plan_stores(p, used[i]))
            bytes = core_bytes_add(bytes, bytes_of(p->graph, used[i]));
    }
    return bytes;
}

/* Peak bytes of computed values alive at once; an output written in place
 * takes its input's bytes over, and a product computed inside its reader's
 * kernel takes none. Values too large to allocate together saturate the
 * peak at INT64_MAX rather than overflow it. */
static void plan_memory(ir_plan *p)
{
    const ir_graph *g = p->graph;
    int64_t live = 0, total = 0;
    for (ir_ref r = 0; r < g->count; r++) {
        if (p->materialized[r])
            p->visit[p->n_visit++] = r;
        if (ir_plan_stores(p, r)) {
            p->kernels++;
            total = core_bytes_add(total, bytes_of(g, r));
        }
    }
    if (total == INT64_MAX) {
        p->peak_bytes = INT64_MAX;
        return;
    }
    for (ir_ref r = 0; r < g->count; r++) {
        if (!ir_plan_stores(p, r))
            continue;
        int step = p->step_of ? p->step_of[r] : -1;
        ir_ref reused = step >= 0 ? p->steps[step].reuses : IR_NONE;
        if (reused == IR_NONE)
            live += bytes_of(g, r);
        p->peak_bytes = live > p->peak_bytes ? live : p->peak_bytes;
        live -= bytes_dying_at(p, r, reused);
    }
}

/* -- The plan ---------------------------------------------------------------- */

void ir_plan_free(ir_plan *p)
{
    for (int i = 0; i < p->n_steps; i++) {
        kx_kernel_free(p->steps[i].kernel);
        free(p->steps[i].buffers);
        free(p->steps[i].uses);
    }
    free(p->steps);
    free(p->step_of);
    free(p->materialized);
    free(p->last_use);
    free(p->visit);
    memset(p, 0, sizeof *p);
}

/* The backend's decisions on the lowered steps. */
static int decide(ir_plan *p, const plan_options *o)
{
    const kx_backend *be = o->backend;
    for (ir_ref r = 0; r < p->graph->count; r++)
        p->step_of[r] = -1;
    for (int i = 0; i < p->n_steps; i++) {
        p->step_of[p->steps[i].node] = i;
        if (p->steps[i].kernel && set_uses(p, &p->steps[i]) < 0)
            return -CORE_NOMEM;
    }
    plan_liveness(p);
    int status = be->supports ? plan_attention(p, be) : 0;
    if (status == 0 && be->supports)
        status = plan_products(p, be);
    if (status == 0 && be->supports)
        status = plan_own_products(p, be);
    if (status == 0 && be->supports)
        status = plan_prologues(p, be);
    if (status == 0)
        status = plan_in_place(p);
    if (status == 0 && be->runs_row_ranges && o->product_block_bytes > 0)
        plan_blocks(p, o->product_block_bytes);
    if (status == 0 && be->stream_bytes > 0)
        plan_streams(p, be->stream_bytes);
    return status;
}

int ir_plan_make(const ir_graph *g, const plan_options *o, ir_plan *p, char *err, size_t err_size)
{
    memset(p, 0, sizeof *p);
    p->graph = g;
    size_t count = g->count ? g->count : 1;
    p->last_use = malloc(count * sizeof *p->last_use);
    p->visit = malloc(count * sizeof *p->visit);
    int status = p->last_use && p->visit ? 0 : -CORE_NOMEM;
    if (status == 0 && o->backend) {
        p->step_of = malloc(count * sizeof *p->step_of);
        status = p->step_of ? ir_lower(g, o->opt_level >= o->backend->split_sums_at, p, err, err_size)
                            : -CORE_NOMEM;
        if (status == 0)
            status = decide(p, o);
    } else if (status == 0 && (p->materialized = malloc(count * sizeof *p->materialized))) {
        for (ir_ref r = 0; r < g->count; r++)
            p->materialized[r] = true;
        plan_liveness(p);
    } else {
        status = -CORE_NOMEM;
    }
    if (status == 0)
        plan_memory(p);
    if (status == -CORE_NOMEM)
        snprintf(err, err_size, "out of memory planning the graph");
    if (status < 0)
        ir_plan_free(p);
    return status;
}
