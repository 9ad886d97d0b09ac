/* Running a graph: node by node with the eager kernels (the INTERP backend,
 * the reference every compiled backend is checked against), or step by step
 * through the fused kernels the LLVM backend compiled, with the ops it leaves
 * to eager (matmul through OpenBLAS, concat, ...) in between.
 *
 * On the CPU, a matmul's product that only an in-place elementwise kernel
 * reads (bias, activation), and that outgrows the caches, is computed a block
 * of rows at a time, the kernel running on each block while it is still in
 * cache.
 *
 * Each value is released after its last use, so memory follows the graph's
 * liveness. Outputs that share storage with an input, a capture or a constant
 * are copied before writebacks run, so outputs are fresh and hold the values
 * of this call whatever happens to the caller's tensors afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/kernel.h"
#include "trace/trace.h"
#ifdef KILN_HAVE_LLVM
#include "cache/cache.h"
#include "codegen_nvrtc/nvrtc.h"
#endif

struct interp_plan {
    ir_graph *graph;
    kiln_tensor **captures;
    int n_captures;
    kiln_tensor **consts;  /* per node: the 0-d tensor of a const node */
    uint32_t *last_use;    /* per node: the last node reading it; count for kept ones */
    ir_ref *visit;         /* the nodes a run computes or takes, in order (all but those fused away) */
    uint32_t n_visit;
    int kernels;
    int64_t peak_bytes;
    /* Native plans only: */
    lowered low;           /* steps, and which nodes have buffers */
    int *step_of;          /* per node: its step, or -1 */
    void **fns;            /* per step: the compiled kernel, NULL for eager steps */
    int *in_place;         /* per step: the input buffer its output may overwrite, or -1 */
    int *fused_matmul;     /* per step (CUDA): the matmul node it computes as its matmul_product, or -1 */
    /* Per step (CPU): the step it runs with block by block (a product's
     * epilogue kernel, or that kernel's product), or -1; and for a product,
     * the rows of a block. */
    int *blocked_with;
    int64_t *block_rows;
    struct cache_kernel **loaded; /* the kernels, shared through the cache */
    int n_loaded;
    plan_counts counts;
    kiln_device device;    /* where values live and kernels run */
};

static bool native(const interp_plan *p)
{
    return p->step_of != NULL;
}

/* The nodes whose values node r reads when it runs. */
static const ir_ref *uses(const interp_plan *p, ir_ref r, uint32_t *n)
{
    const ir_node *node = &p->graph->nodes[r];
    if (native(p) && p->step_of[r] >= 0 && p->low.steps[p->step_of[r]].kernel) {
        const lower_step *s = &p->low.steps[p->step_of[r]];
        *n = (uint32_t)s->n_inputs;
        return s->buffers;
    }
    if (native(p) && p->step_of[r] < 0) {
        *n = 0;
        return NULL;
    }
    *n = node->n_operands;
    return ir_operands(p->graph, node);
}

/* -- Planning -------------------------------------------------------------- */

static void plan_liveness(interp_plan *p)
{
    const ir_graph *g = p->graph;
    for (ir_ref r = 0; r < g->count; r++) {
        p->last_use[r] = r;
        uint32_t n;
        const ir_ref *used = uses(p, r, &n);
        for (uint32_t i = 0; i < n; i++)
            p->last_use[used[i]] = r;
    }
    for (int i = 0; i < g->n_outputs; i++)
        p->last_use[g->outputs[i]] = g->count;
    for (int i = 0; i < g->n_writebacks; i++)
        p->last_use[g->writebacks[i].value] = g->count;
}

/* Whether node r makes a new buffer when it runs (views and sources do not). */
static bool computes(const interp_plan *p, ir_ref r)
{
    if (native(p) && p->step_of[r] < 0)
        return false;
    bool kernel = native(p) && p->low.steps[p->step_of[r]].kernel;
    return kernel || ir_node_computes(&p->graph->nodes[r]);
}

#ifdef KILN_HAVE_LLVM
/* Whether view v addresses its buffer exactly as view w does. */
static bool same_view(const kx_kernel *k, const kx_view *v, const kx_view *w)
{
    return v->offset == w->offset && v->inner_stride == w->inner_stride && v->dtype == w->dtype &&
           !memcmp(v->outer_strides, w->outer_strides, (size_t)k->n_outer * sizeof *v->outer_strides);
}

/* The input buffer step s may write its output into, or -1. Only an
 * elementwise kernel qualifies, whose every read of that buffer is at the
 * element it stores (so each element is read before it is overwritten, in
 * whatever order the loop runs), and only when the input is a value of the
 * plan whose last use this is, of the output's dtype and size. */
static int in_place_input(const interp_plan *p, const lower_step *s)
{
    const kx_kernel *k = s->kernel;
    if (!k || k->n_reductions || k->n_row_stores || k->n_stores != 1 || s->n_outputs != 1)
        return -1;
    const kx_view *out = &k->views[k->stores[0].view];
    const ir_node *node = &p->graph->nodes[s->node];
    for (int b = 0; b < s->n_inputs; b++) {
        ir_ref input = s->buffers[b];
        const ir_node *in = &p->graph->nodes[input];
        bool fits = p->last_use[input] == s->node && computes(p, input) && in->dtype == node->dtype &&
                    ir_node_numel(in) == ir_node_numel(node);
        for (int v = 0; fits && v < k->n_views; v++)
            if (k->views[v].buffer == b)
                fits = same_view(k, &k->views[v], out);
        for (int other = 0; fits && other < s->n_inputs; other++)
            fits = other == b || s->buffers[other] != input;
        if (fits)
            return b;
    }
    return -1;
}

/* Rows and columns of matmul node n's matrices, and how many there are;
 * false unless both operands are f32 matrices (or batches of them). */
static bool matmul_dims(const ir_graph *g, const ir_node *n, int64_t *m, int64_t *cols, int64_t *batch)
{
    const ir_ref *ops = ir_operands(g, n);
    const ir_node *a = &g->nodes[ops[0]], *b = &g->nodes[ops[1]];
    if (n->dtype != KILN_F32 || a->dtype != KILN_F32 || b->dtype != KILN_F32 || a->ndim < 2 || b->ndim < 2)
        return false;
    *m = n->shape[n->ndim - 2];
    *cols = n->shape[n->ndim - 1];
    *batch = *m * *cols != 0 ? ir_node_numel(n) / (*m * *cols) : 0;
    return *batch > 0;
}

/* The inner dimension of matmul node n: its left operand's columns. */
static int64_t inner_dim(const ir_graph *g, const ir_node *n)
{
    const ir_node *a = &g->nodes[ir_operands(g, n)[0]];
    return a->shape[a->ndim - 1];
}

/* How many nodes read value r when the plan runs. */
static int readers(const interp_plan *p, ir_ref r)
{
    int count = 0;
    for (ir_ref at = r + 1; at < p->graph->count; at++) {
        uint32_t n;
        const ir_ref *used = uses(p, at, &n);
        for (uint32_t i = 0; i < n; i++)
            count += used[i] == r;
    }
    return count;
}

/* A later use of value r at node at: r lives until then. */
static void live_until(interp_plan *p, ir_ref r, ir_ref at)
{
    if (p->last_use[r] < at)
        p->last_use[r] = at;
}

/* CUDA: an f32 matmul (run eagerly otherwise) whose product only the next
 * kernel reads is computed inside that kernel, tile by tile in registers,
 * and never stored. Its operands then live until that kernel runs. */
static void plan_matmul_epilogues(interp_plan *p)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < p->low.n_steps; i++) {
        lower_step *s = &p->low.steps[i];
        p->fused_matmul[i] = -1;
        for (int b = 0; s->kernel && b < s->n_inputs && p->fused_matmul[i] < 0; b++) {
            ir_ref r = s->buffers[b];
            const ir_node *n = &g->nodes[r];
            int64_t m, cols, batch;
            if (n->op != OP_MATMUL || p->last_use[r] != s->node || readers(p, r) != 1 || p->step_of[r] < 0 ||
                p->low.steps[p->step_of[r]].kernel || !matmul_dims(g, n, &m, &cols, &batch) ||
                !nvrtc_matmul_epilogue_fits(s->kernel, b, m, cols, batch))
                continue;
            s->kernel->matmul_product = b;
            p->fused_matmul[i] = (int)r;
            p->low.materialized[r] = false;
            live_until(p, ir_operands(g, n)[0], s->node);
            live_until(p, ir_operands(g, n)[1], s->node);
        }
    }
}

/* A block of a product in blocks: about this many bytes (what stays in
 * cache), and the product at least four blocks. */
static int64_t product_block_bytes(void)
{
    return core_env_int("KILN_PRODUCT_BLOCK_BYTES", KX_STREAM_BYTES / 4);
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
static int64_t rows_per_block(const kx_kernel *k, int64_t m, int64_t n, int64_t inner, int64_t batch)
{
    int64_t block_bytes = product_block_bytes(), step = k->cols / gcd(n, k->cols);
    if (block_bytes <= 0 || batch * m * n * (int64_t)sizeof(float) < 4 * block_bytes ||
        (batch > 1 && m * n % k->cols != 0))
        return 0;
    int64_t rows = block_bytes / (n * (int64_t)sizeof(float)) / step * step;
    return rows >= 4 * inner && rows > 0 ? rows : 0;
}

/* Whether kernel step s's inputs other than buffer b are there before node
 * r runs: computed earlier, or the function's inputs, captures, constants. */
static bool inputs_ready_before(const interp_plan *p, const lower_step *s, int b, ir_ref r)
{
    for (int i = 0; i < s->n_inputs; i++) {
        ir_op op = p->graph->nodes[s->buffers[i]].op;
        if (i != b && s->buffers[i] > r && op != OP_INPUT && op != OP_CAPTURE && op != OP_CONST)
            return false;
    }
    return true;
}

/* CPU: pairs each large f32 product with the elementwise kernel that alone
 * reads it and writes over it (see the top of this file). */
static void plan_product_blocks(interp_plan *p)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < p->low.n_steps; i++) {
        const lower_step *s = &p->low.steps[i];
        int b = p->in_place[i];
        ir_ref r = b >= 0 ? s->buffers[b] : IR_NONE;
        const ir_node *n = r != IR_NONE ? &g->nodes[r] : NULL;
        int64_t m, cols, batch, rows;
        if (!n || n->op != OP_MATMUL || p->step_of[r] < 0 || p->low.steps[p->step_of[r]].kernel ||
            readers(p, r) != 1 || !matmul_dims(g, n, &m, &cols, &batch) || !inputs_ready_before(p, s, b, r) ||
            (rows = rows_per_block(s->kernel, m, cols, inner_dim(g, n), batch)) == 0)
            continue;
        s->kernel->streams = false; /* its block is in cache: see kx_kernel.streams */
        p->blocked_with[i] = p->step_of[r];
        p->blocked_with[p->step_of[r]] = i;
        p->block_rows[p->step_of[r]] = rows;
    }
}

/* Which kernels write over an input (before they are compiled: the code
 * differs). Needs the lowered steps and their liveness; a kernel computing a
 * matmul's product writes over nothing. */
static void plan_in_place(interp_plan *p)
{
    for (int i = 0; i < p->low.n_steps; i++) {
        p->in_place[i] = p->fused_matmul[i] < 0 ? in_place_input(p, &p->low.steps[i]) : -1;
        if (p->low.steps[i].kernel)
            p->low.steps[i].kernel->in_place = p->in_place[i];
    }
}
#endif

static int64_t bytes_of(const ir_node *n)
{
    return ir_node_numel(n) * (int64_t)kiln_dtype_size(n->dtype);
}

/* The matmul node that step r's kernel computes inside itself, or -1. */
static int fused_product_of(const interp_plan *p, ir_ref r)
{
    int step = native(p) ? p->step_of[r] : -1;
    return step >= 0 && p->fused_matmul ? p->fused_matmul[step] : -1;
}

/* Whether value r has a buffer of its own: a fused product has none. */
static bool stored(const interp_plan *p, ir_ref r)
{
    return computes(p, r) && (!native(p) || p->low.materialized[r]);
}

static bool among(ir_ref v, const ir_ref *refs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (refs[i] == v)
            return true;
    return false;
}

/* Bytes of stored values other than kept that node r reads last (each once,
 * a fused product's operands included). */
static int64_t bytes_dying_at(const interp_plan *p, ir_ref r, ir_ref kept)
{
    uint32_t n;
    const ir_ref *used = uses(p, r, &n);
    int product = fused_product_of(p, r);
    const ir_ref *ops = product >= 0 ? ir_operands(p->graph, &p->graph->nodes[product]) : NULL;
    int64_t bytes = 0;
    for (uint32_t i = 0; i < n + (ops ? 2 : 0); i++) {
        ir_ref v = i < n ? used[i] : ops[i - n];
        bool repeated = among(v, used, i < n ? i : n) || (i == n + 1 && v == ops[0]);
        if (!repeated && v != kept && p->last_use[v] == r && stored(p, v))
            bytes += bytes_of(&p->graph->nodes[v]);
    }
    return bytes;
}

/* Peak bytes of computed values alive at once; an output written in place
 * takes its input's bytes over, and a product computed inside its reader's
 * kernel takes none. */
static void plan_memory(interp_plan *p)
{
    const ir_graph *g = p->graph;
    int64_t live = 0, total = 0;
    for (ir_ref r = 0; r < g->count; r++) {
        if (stored(p, r)) {
            p->kernels++;
            total = core_bytes_add(total, bytes_of(&g->nodes[r]));
        }
    }
    if (total == INT64_MAX) { /* values too large to allocate together: live counts would overflow */
        p->peak_bytes = INT64_MAX;
        return;
    }
    for (ir_ref r = 0; r < g->count; r++) {
        if (!stored(p, r))
            continue;
        int step = native(p) ? p->step_of[r] : -1;
        ir_ref reused = step >= 0 && p->in_place[step] >= 0 ? p->low.steps[step].buffers[p->in_place[step]] : IR_NONE;
        if (reused == IR_NONE)
            live += bytes_of(&g->nodes[r]);
        p->peak_bytes = live > p->peak_bytes ? live : p->peak_bytes;
        live -= bytes_dying_at(p, r, reused);
    }
}

static bool plan_consts(interp_plan *p)
{
    for (ir_ref r = 0; r < p->graph->count; r++) {
        const ir_node *n = &p->graph->nodes[r];
        if (n->op != OP_CONST)
            continue;
        kiln_tensor *t = n->params.scalar ? eager_scalar_literal(n->dtype, n->params.value)
                                          : kiln_full(n->dtype, 0, NULL, n->params.value);
        eager_disown(t);
        if (t && p->device == KILN_CUDA) { /* folded constants are expanded and fed to ops like any value */
            kiln_tensor *moved = kiln_to_device(t, KILN_CUDA);
            eager_disown(moved);
            if (moved)
                moved->literal = t->literal;
            kiln_release(t);
            t = moved;
        }
        if (!t)
            return false;
        p->consts[r] = t;
    }
    return true;
}

#ifdef KILN_HAVE_LLVM
static void dump_llvm(void *ctx, int kernel, const char *stage, const char *text)
{
    const plan_options *o = ctx;
    o->dump(o->dump_ctx, kernel, stage, text);
}

/* Lowers p's graph for target into steps, and decides which kernels write in
 * place (the code differs, so before they are compiled). p->last_use must be
 * allocated. 0, or -1 with why. */
static int lower_plan(interp_plan *p, const plan_options *o, const char *target, char *why, size_t size)
{
    /* CUDA splits rows across threads; LLVM vectorizes from O2. */
    lower_options lo = {.split_sums = !strncmp(target, "cuda:", 5) || o->opt_level >= 2};
    if (lower_graph(p->graph, &lo, &p->low) < 0) {
        snprintf(why, size, "out of memory lowering the graph");
        return -1;
    }
    int n = p->low.n_steps;
    p->step_of = malloc((p->graph->count ? p->graph->count : 1) * sizeof *p->step_of);
    p->fns = calloc((size_t)n + 1, sizeof *p->fns);
    p->in_place = malloc(((size_t)n + 1) * sizeof *p->in_place);
    p->fused_matmul = malloc(((size_t)n + 1) * sizeof *p->fused_matmul);
    p->blocked_with = malloc(((size_t)n + 1) * sizeof *p->blocked_with);
    p->block_rows = calloc((size_t)n + 1, sizeof *p->block_rows);
    if (!p->step_of || !p->fns || !p->in_place || !p->fused_matmul || !p->blocked_with || !p->block_rows) {
        snprintf(why, size, "out of memory lowering the graph");
        return -1;
    }
    for (ir_ref r = 0; r < p->graph->count; r++)
        p->step_of[r] = -1;
    for (int i = 0; i < n; i++)
        p->step_of[p->low.steps[i].node] = i;
    for (int i = 0; i < n; i++)
        p->fused_matmul[i] = p->blocked_with[i] = -1;
    /* Fusing a product keeps its operands alive longer, which in-place
     * writes must know. */
    plan_liveness(p);
    bool cuda = !strncmp(target, "cuda:", 5);
    if (cuda)
        plan_matmul_epilogues(p);
    plan_in_place(p);
    if (!cuda)
        plan_product_blocks(p);
    return 0;
}

/* Undoes lower_plan (and what compile_kernels loaded). */
static void unlower_plan(interp_plan *p)
{
    for (int i = 0; i < p->n_loaded; i++)
        cache_kernel_release(p->loaded[i]);
    free(p->step_of);
    free(p->fns);
    free(p->loaded);
    free(p->in_place);
    free(p->fused_matmul);
    free(p->blocked_with);
    free(p->block_rows);
    p->fused_matmul = p->blocked_with = NULL;
    p->block_rows = NULL;
    p->step_of = NULL;
    p->fns = NULL;
    p->loaded = NULL;
    p->in_place = NULL;
    p->n_loaded = 0;
    lowered_free(&p->low);
}

/* The kernels of p's steps through the cache for target: for the host,
 * loaded into p->loaded with p->fns set. A cache_kernels status. */
static int compile_kernels(interp_plan *p, const plan_options *o, const char *target, bool load, char *why,
                           size_t size)
{
    int n = p->low.n_steps, n_kernels = 0;
    bool host = load;
    kx_kernel **kernels = malloc(((size_t)n + 1) * sizeof *kernels);
    void **fns = calloc((size_t)n + 1, sizeof *fns);
    p->loaded = host ? calloc((size_t)n + 1, sizeof *p->loaded) : NULL;
    int status = kernels && fns && (p->loaded || !host) ? 0 : CACHE_COMPILE_FAILED;
    for (int i = 0; status == 0 && i < n; i++)
        if (p->low.steps[i].kernel)
            kernels[n_kernels++] = p->low.steps[i].kernel;
    for (int i = 0; status == 0 && o->dump && i < n_kernels; i++) {
        char *text = kx_to_text(kernels[i]);
        o->dump(o->dump_ctx, i, "kernel", text);
        free(text);
    }
    cache_request r = {.target = target, .opt_level = o->opt_level, .fast_math = o->fast_math,
                       .no_disk = o->no_disk, .function = o->function, .signature = o->signature, .log = o->log,
                       .dump = o->dump ? dump_llvm : NULL, .dump_ctx = (void *)o};
    cache_counts counts = {0};
    if (status == 0 && n_kernels > 0)
        status = cache_kernels(kernels, n_kernels, &r, p->loaded, host ? fns : NULL, &counts, why, size);
    if (status == 0 && host)
        p->n_loaded = n_kernels;
    p->counts = (plan_counts){counts.compiled, counts.from_disk, counts.shared};
    for (int i = 0, k = 0; status == 0 && host && i < n; i++)
        if (p->low.steps[i].kernel)
            p->fns[i] = fns[k++];
    if (!kernels || !fns || (host && !p->loaded))
        snprintf(why, size, "out of memory compiling the graph");
    free(kernels);
    free(fns);
    return status;
}
#endif

/* Lowers the graph and compiles its kernels. A failed compile leaves p
 * interpreted, with why saying why; a kernel that KILN_CACHE=require finds
 * missing is an error (-CORE_STATE, set). */
static int plan_native(interp_plan *p, const plan_options *o, char *why, size_t size)
{
#ifndef KILN_HAVE_LLVM
    (void)p;
    (void)o;
    snprintf(why, size, "this build of kiln has no LLVM backend");
    return 0;
#else
    char target[32] = "host";
    if (o->device == KILN_CUDA && cuda_start(why, size) < 0)
        return 0;
    if (o->device == KILN_CUDA)
        snprintf(target, sizeof target, "cuda:%s", cuda_arch());
    int status = lower_plan(p, o, target, why, size) < 0 ? CACHE_COMPILE_FAILED
                                                         : compile_kernels(p, o, target, true, why, size);
    if (status == 0)
        return 0;
    unlower_plan(p);
    return status == CACHE_REQUIRED_MISSING ? core_fail(CORE_STATE, "kiln_call", "%s", why) : 0;
#endif
}

interp_plan *interp_plan_new(ir_graph *g, kiln_tensor **captures, int n_captures, const plan_options *o,
                             char *why, size_t why_size, int *status)
{
    *status = 0;
    interp_plan *p = calloc(1, sizeof *p);
    size_t count = g->count ? g->count : 1;
    why[0] = '\0';
    if (p) {
        p->graph = g;
        p->captures = captures;
        p->device = o->device;
        p->n_captures = n_captures;
        p->consts = calloc(count, sizeof *p->consts);
        p->last_use = malloc(count * sizeof *p->last_use);
        p->visit = malloc(count * sizeof *p->visit);
    }
    if (!p || !p->consts || !p->last_use || !p->visit || !plan_consts(p)) {
        if (p)
            interp_plan_free(p);
        else {
            ir_graph_free(g);
            for (int i = 0; i < n_captures; i++)
                kiln_release(captures[i]);
            free(captures);
        }
        *status = core_fail(CORE_NOMEM, "kiln_call", "out of memory planning a graph");
        return NULL;
    }
    if (o->native && (*status = plan_native(p, o, why, why_size)) < 0) {
        interp_plan_free(p);
        return NULL;
    }
    if (!native(p)) /* a native plan's was made before its kernels were compiled */
        plan_liveness(p);
    plan_memory(p);
    for (ir_ref r = 0; r < g->count; r++)
        if (!native(p) || p->low.materialized[r]) /* the rest is computed inside the kernels that use it */
            p->visit[p->n_visit++] = r;
    return p;
}

int interp_compile_for(const ir_graph *g, const plan_options *o, const char *target, plan_counts *counts,
                       char *why, size_t why_size)
{
#ifndef KILN_HAVE_LLVM
    (void)g, (void)o, (void)target, (void)counts;
    snprintf(why, why_size, "this build of kiln has no LLVM backend");
    return -1;
#else
    /* The kernels are the ones a plan for g would run here, in place where it
     * would write in place: a plan of g's steps, never run. */
    interp_plan plan = {.graph = (ir_graph *)g};
    plan.last_use = malloc((g->count ? g->count : 1) * sizeof *plan.last_use);
    int status = -1;
    if (!plan.last_use)
        snprintf(why, why_size, "out of memory");
    else if (lower_plan(&plan, o, target, why, why_size) == 0)
        status = compile_kernels(&plan, o, target, false, why, why_size) < 0 ? -1 : 0;
    *counts = plan.counts;
    unlower_plan(&plan);
    free(plan.last_use);
    return status;
#endif
}

bool interp_is_native(const interp_plan *p)
{
    return native(p);
}

kiln_device interp_device(const interp_plan *p)
{
    return p->device;
}

void interp_plan_free(interp_plan *p)
{
    if (!p)
        return;
#ifdef KILN_HAVE_LLVM
    unlower_plan(p); /* without LLVM there is nothing lowered */
#endif
    for (ir_ref r = 0; p->consts && r < p->graph->count; r++)
        kiln_release(p->consts[r]);
    for (int i = 0; i < p->n_captures; i++)
        kiln_release(p->captures[i]);
    free(p->captures);
    free(p->consts);
    free(p->last_use);
    free(p->visit);
    ir_graph_free(p->graph);
    free(p);
}

plan_counts interp_counts(const interp_plan *p)
{
    return p->counts;
}

const ir_graph *interp_graph(const interp_plan *p)
{
    return p->graph;
}

int interp_kernels(const interp_plan *p)
{
    return p->kernels;
}

int interp_products_in_blocks(const interp_plan *p)
{
    int count = 0;
    for (int i = 0; native(p) && i < p->low.n_steps; i++)
        count += p->blocked_with[i] >= 0 && !p->low.steps[i].kernel;
    return count;
}

int64_t interp_peak_bytes(const interp_plan *p)
{
    return p->peak_bytes;
}

/* -- Running --------------------------------------------------------------- */

enum { STACK_VALUES = 128, MAX_STACK_OPERANDS = 16 };

static kiln_tensor *run_node(const interp_plan *p, ir_ref r, kiln_tensor *const *in,
                             kiln_tensor **values)
{
    const ir_node *n = &p->graph->nodes[r];
    switch (n->op) {
    case OP_INPUT: return kiln_retain(in[n->params.index]);
    case OP_CAPTURE: return kiln_retain(p->captures[n->params.index]);
    case OP_CONST: return kiln_retain(p->consts[r]);
    default: break;
    }
    kiln_tensor *stack[MAX_STACK_OPERANDS];
    kiln_tensor **operands = n->n_operands <= MAX_STACK_OPERANDS ? stack
                                                                 : malloc(n->n_operands * sizeof *operands);
    if (!operands)
        return NULL;
    for (uint32_t i = 0; i < n->n_operands; i++)
        operands[i] = values[ir_operands(p->graph, n)[i]];
    kiln_tensor *t = eager_dispatch(n, operands);
    if (operands != stack)
        free(operands);
    return t;
}

/* -- Native steps ---------------------------------------------------------- */

typedef struct {
    void *fn;
    void **buffers;
    int64_t first_row;
} kernel_call;

static void run_rows(void *ctx, int64_t begin, int64_t end)
{
    const kernel_call *c = ctx;
#ifdef KILN_HAVE_LLVM
    ((kx_kernel_fn)c->fn)(c->buffers, c->first_row + begin, c->first_row + end);
#else
    (void)c, (void)begin, (void)end;
#endif
}

/* Rows [begin, end) of a CPU kernel across the pool. */
static void run_rows_parallel(const kx_kernel *k, void *fn, void **buffers, int64_t begin, int64_t end)
{
    kernel_call call = {fn, buffers, begin};
    int64_t work = k->transcendental ? 4096 : 32768;
    int64_t grain = k->cols > 0 ? work / k->cols : work;
    core_parallel_for(end - begin, grain, run_rows, &call);
}

/* The output of node n for a kernel that writes over value t (NULL: one
 * that does not). The kernel reads t's values from its output, so that is t
 * itself when t alone holds its whole contiguous storage, else a copy. */
static kiln_tensor *output_for(const interp_plan *p, const ir_node *n, kiln_tensor *t)
{
    kiln_tensor *out;
    if (!t) {
        out = eager_empty("kiln_call", p->device, n->dtype, n->ndim, n->shape);
    } else if (atomic_load(&t->refs) == 1 && atomic_load(&t->storage->refs) == 1 && t->offset == 0 &&
               eager_is_contiguous(t) && t->device == p->device) {
        out = kiln_reshape(t, n->ndim, n->shape);
    } else {
        kiln_tensor *copy = t->device == p->device ? eager_copy("kiln_call", t) : kiln_to_device(t, p->device);
        eager_disown(copy);
        out = copy ? kiln_reshape(copy, n->ndim, n->shape) : NULL;
        kiln_release(copy);
    }
    eager_disown(out);
    return out;
}

static const char *device_name(kiln_device d)
{
    return d == KILN_CUDA ? "CUDA" : "the CPU";
}

/* A kernel's operand on another device than the plan's (a capture): a 0-d
 * value is copied over, as eager ops take one; anything else is the eager
 * ops' error. NULL with the error set, or a new unowned tensor. */
static kiln_tensor *operand_moved(const interp_plan *p, const kiln_tensor *t)
{
    char d[CORE_SHAPE_STR_MAX];
    if (t->ndim == 0) {
        kiln_tensor *moved = kiln_to_device((kiln_tensor *)t, p->device);
        eager_disown(moved); /* released with the other staged operands */
        return moved;
    }
    core_shape_str(d, t->ndim, t->shape);
    core_fail(CORE_DEVICE, "kiln_call", "operands are on different devices: a captured %s %s is on %s, the "
              "inputs on %s (move it with kiln_to_device)", d, kiln_dtype_name(t->dtype), device_name(t->device),
              device_name(p->device));
    return NULL;
}

/* buffers[i] for kernel step s's inputs but skip, whose values are operands
 * (indexed by buffer), copied into staged[i] where the kernel cannot read
 * them as they are. false with the error set. */
static bool stage_inputs(const interp_plan *p, const lower_step *s, int skip, kiln_tensor *const *operands,
                         void **buffers, kiln_tensor **staged)
{
    for (int i = 0; i < s->n_inputs; i++) {
        if (i == skip) {
            buffers[i] = NULL;
            continue;
        }
        kiln_tensor *t = operands[i];
        /* Kernels address buffers as row-major; CUDA's read 16 bytes at a
         * time, and a CPU 0-d value goes along as eager ops take it. */
        if (t->device != p->device)
            t = staged[i] = operand_moved(p, t);
        else if (!eager_is_contiguous(t) || (p->device == KILN_CUDA && (uintptr_t)eager_data(t) % 16))
            t = staged[i] = eager_copy("kiln_call", t);
        if (!t)
            return false;
        buffers[i] = eager_data(t);
    }
    return true;
}

/* Runs a compiled kernel over its input buffers into its output tensor. */
static kiln_tensor *run_kernel(const interp_plan *p, int step, void *fn, kiln_tensor **values)
{
    const lower_step *s = &p->low.steps[step];
    const ir_node *n = &p->graph->nodes[s->node];
    void *buffers[KX_MAX_BUFFERS];
    kiln_tensor *staged[KX_MAX_BUFFERS] = {NULL}, *operands[KX_MAX_BUFFERS];
    kiln_tensor *out = output_for(p, n, p->in_place[step] >= 0 ? values[s->buffers[p->in_place[step]]] : NULL);
    for (int i = 0; i < s->n_inputs; i++)
        operands[i] = i == s->kernel->matmul_product ? NULL : values[s->buffers[i]];
    bool ok = out != NULL && stage_inputs(p, s, s->kernel->matmul_product, operands, buffers, staged);
    int product = p->device == KILN_CUDA ? p->fused_matmul[step] : -1;
    if (ok && product >= 0) {
        buffers[s->n_inputs] = eager_data(out);
        const ir_ref *ops = ir_operands(p->graph, &p->graph->nodes[(ir_ref)product]);
        kiln_tensor *a = values[ops[0]], *b = values[ops[1]];
        ok = (a->device == p->device || operand_moved(p, a)) && (b->device == p->device || operand_moved(p, b)) &&
             eager_cuda_matmul_kernel("kiln_call", fn, s->kernel, a, b, buffers) == 0;
    } else if (ok && p->device == KILN_CUDA) {
        buffers[s->n_inputs] = eager_data(out);
        ok = eager_cuda_kernel("kiln_call", fn, s->kernel, buffers) == 0;
    } else if (ok) {
        buffers[s->n_inputs] = eager_data(out);
        run_rows_parallel(s->kernel, fn, buffers, 0, s->kernel->rows);
    }
    for (int i = 0; i < s->n_inputs; i++)
        kiln_release(staged[i]);
    if (!ok)
        out = (kiln_release(out), NULL);
    return out;
}

/* A product's epilogue kernel, run on each block of the product. */
typedef struct {
    const lower_step *step;
    void *fn;
    void **buffers;
    int product;  /* the kernel's buffer the product is */
    int64_t cols; /* the product's */
} block_epilogue;

static void epilogue_on_block(void *ctx, void *data, int64_t begin, int64_t end)
{
    const block_epilogue *e = ctx;
    const kx_kernel *k = e->step->kernel;
    e->buffers[e->product] = e->buffers[e->step->n_inputs] = data;
    run_rows_parallel(k, e->fn, e->buffers, begin * e->cols / k->cols, end * e->cols / k->cols);
}

/* Node r's value before its turn in the run: computed already, or a source. */
static kiln_tensor *value_early(const interp_plan *p, ir_ref r, kiln_tensor *const *in, kiln_tensor **values)
{
    const ir_node *n = &p->graph->nodes[r];
    switch (n->op) {
    case OP_INPUT: return in[n->params.index];
    case OP_CAPTURE: return p->captures[n->params.index];
    case OP_CONST: return p->consts[r];
    default: return values[r];
    }
}

/* Matmul node r, a block of rows at a time, with its epilogue kernel run on
 * each block (its value is then the epilogue's, in place). */
static kiln_tensor *run_product_in_blocks(const interp_plan *p, ir_ref r, kiln_tensor *const *in,
                                          kiln_tensor **values)
{
    int product_step = p->step_of[r], step = p->blocked_with[product_step];
    const lower_step *s = &p->low.steps[step];
    const ir_node *n = &p->graph->nodes[r];
    void *buffers[KX_MAX_BUFFERS];
    kiln_tensor *staged[KX_MAX_BUFFERS] = {NULL}, *operands[KX_MAX_BUFFERS];
    for (int i = 0; i < s->n_inputs; i++)
        operands[i] = i == p->in_place[step] ? NULL : value_early(p, s->buffers[i], in, values);
    kiln_tensor *out = NULL;
    if (stage_inputs(p, s, p->in_place[step], operands, buffers, staged)) {
        block_epilogue e = {s, p->fns[step], buffers, p->in_place[step], n->shape[n->ndim - 1]};
        const ir_ref *ops = ir_operands(p->graph, n);
        out = eager_matmul_blocks("kiln_call", values[ops[0]], values[ops[1]], p->block_rows[product_step],
                                  epilogue_on_block, &e);
    }
    for (int i = 0; i < s->n_inputs; i++)
        kiln_release(staged[i]);
    return out;
}

/* Node r's value: run by the eager ops, by its compiled kernel, or, for a
 * product in blocks and its epilogue, as run_product_in_blocks leaves it. */
static kiln_tensor *run_step(const interp_plan *p, ir_ref r, kiln_tensor *const *in, kiln_tensor **values)
{
    int step = native(p) ? p->step_of[r] : -1;
    void *fn = step >= 0 ? p->fns[step] : NULL;
    if (step < 0 || (!fn && p->blocked_with[step] < 0))
        return run_node(p, r, in, values);
    if (p->blocked_with[step] < 0)
        return run_kernel(p, step, fn, values);
    if (!fn)
        return run_product_in_blocks(p, r, in, values);
    const lower_step *s = &p->low.steps[step];
    return output_for(p, &p->graph->nodes[r], values[s->buffers[p->in_place[step]]]);
}

static void release_if_dead(const interp_plan *p, ir_ref o, ir_ref r, kiln_tensor **values)
{
    if (p->last_use[o] == r && values[o]) {
        kiln_release(values[o]);
        values[o] = NULL;
    }
}

static void release_dead_operands(const interp_plan *p, ir_ref r, kiln_tensor **values)
{
    uint32_t n;
    const ir_ref *used = uses(p, r, &n);
    for (uint32_t i = 0; i < n; i++)
        if (!native(p) || p->low.materialized[used[i]]) /* a fused product has no value */
            release_if_dead(p, used[i], r, values);
    int product = fused_product_of(p, r);
    if (product < 0)
        return;
    const ir_ref *ops = ir_operands(p->graph, &p->graph->nodes[(ir_ref)product]);
    release_if_dead(p, ops[0], r, values);
    release_if_dead(p, ops[1], r, values);
}

/* Whether node r's value is a new tensor a compiled kernel wrote. */
static bool made_by_kernel(const interp_plan *p, ir_ref r)
{
    return native(p) && p->step_of[r] >= 0 && p->low.steps[p->step_of[r]].kernel;
}

static bool shares_caller_storage(const interp_plan *p, kiln_tensor *const *in, const kiln_tensor *t)
{
    for (int i = 0; i < p->graph->n_inputs; i++)
        if (kiln_shares_storage(in[i], t))
            return true;
    for (int i = 0; i < p->n_captures; i++)
        if (kiln_shares_storage(p->captures[i], t))
            return true;
    for (ir_ref r = 0; r < p->graph->count; r++)
        if (p->consts[r] && kiln_shares_storage(p->consts[r], t))
            return true;
    return false;
}

static int take_outputs(const interp_plan *p, kiln_tensor *const *in, kiln_tensor **values,
                        kiln_tensor **out)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < g->n_outputs; i++) {
        kiln_tensor *t = values[g->outputs[i]];
        bool shared = !made_by_kernel(p, g->outputs[i]) && shares_caller_storage(p, in, t);
        for (int j = 0; j < i && !shared; j++) /* one value returned twice: two tensors */
            shared = kiln_shares_storage(out[j], t);
        out[i] = shared ? eager_copy("kiln_call", t) : kiln_retain(t);
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                out[j] = (kiln_release(out[j]), NULL);
            return -CORE_NOMEM;
        }
    }
    return 0;
}

static bool written_back(const interp_plan *p, const kiln_tensor *t)
{
    for (int i = 0; i < p->graph->n_writebacks; i++)
        if (kiln_shares_storage(p->captures[p->graph->writebacks[i].capture], t))
            return true;
    return false;
}

/* Every value is read before any capture is written: a value that shares
 * storage with a capture being written back is copied first (b = a; a = c
 * must give b the old a, as it does eagerly). */
static int write_back(const interp_plan *p, kiln_tensor **values)
{
    int n = p->graph->n_writebacks, status = 0;
    if (n == 0)
        return 0;
    kiln_tensor **sources = calloc((size_t)n, sizeof *sources);
    if (!sources)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory writing back");
    for (int i = 0; i < n && status == 0; i++) {
        kiln_tensor *v = values[p->graph->writebacks[i].value];
        sources[i] = written_back(p, v) ? eager_copy("kiln_call", v) : kiln_retain(v);
        if (!sources[i])
            status = -CORE_NOMEM;
    }
    for (int i = 0; i < n && status == 0; i++)
        status = kiln_assign(p->captures[p->graph->writebacks[i].capture], sources[i]);
    for (int i = 0; i < n; i++)
        kiln_release(sources[i]);
    free(sources);
    return status < 0 ? status : 0;
}

int interp_run(const interp_plan *p, kiln_tensor *const *in, kiln_tensor **out)
{
    const ir_graph *g = p->graph;
    kiln_tensor *stack[STACK_VALUES];
    kiln_tensor **values = g->count <= STACK_VALUES ? stack : malloc(g->count * sizeof *values);
    if (!values)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory");
    for (uint32_t i = 0; i < p->n_visit; i++)
        values[p->visit[i]] = NULL; /* only these are ever read */
    int status = 0;
    for (uint32_t i = 0; i < p->n_visit && status == 0; i++) {
        ir_ref r = p->visit[i];
        values[r] = run_step(p, r, in, values);
        if (!values[r])
            status = -CORE_NOMEM; /* the op has set the message */
        else
            release_dead_operands(p, r, values);
    }
    if (status == 0)
        status = take_outputs(p, in, values, out);
    if (status == 0 && (status = write_back(p, values)) < 0)
        for (int i = 0; i < g->n_outputs; i++)
            out[i] = (kiln_release(out[i]), NULL);
    for (uint32_t i = 0; i < p->n_visit; i++)
        kiln_release(values[p->visit[i]]);
    if (values != stack)
        free(values);
    return status;
}

/* -- Constant folding ------------------------------------------------------ */

int interp_eval_const(const ir_node *node, const double *values, const kiln_dtype *dtypes,
                      double *out)
{
    kiln_tensor *operands[3] = {NULL, NULL, NULL};
    int status = -1;
    kiln_scope_begin();
    for (uint32_t i = 0; i < node->n_operands; i++)
        if (!(operands[i] = kiln_full(dtypes[i], 0, NULL, values[i])))
            goto done;
    kiln_tensor *t = eager_dispatch(node, operands);
    if (!t)
        goto done;
    int64_t exact;
    *out = kiln_item(t);
    /* An i64 beyond 2^53 may have no exact double: leave such a node unfolded. */
    bool inexact = node->dtype == KILN_I64 && (kiln_copy_to_host(t, &exact, sizeof exact) < 0 ||
                                               exact > (INT64_C(1) << 53) || exact < -(INT64_C(1) << 53));
    status = inexact ? -1 : 0;
    kiln_release(t);
done:
    kiln_scope_end();
    kiln_clear_error();
    return status;
}
