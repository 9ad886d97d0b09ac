/* The executor: a graph planned (src/ir/plan.c), its kernels made ready by
 * the compile-or-load service, and run step by step: fused kernels launched
 * through their backend, the nodes they leave to eager run by the
 * interpreter, a CPU product in blocks with its epilogue on each block.
 *
 * A graph with symbolic sizes runs for the values of its symbols the caller
 * passes (read off the inputs' sizes by its guards): kernels get them at
 * launch, and eager steps and new buffers see shapes evaluated for them.
 *
 * Each value is released after its last use, so memory follows the plan's
 * liveness. Outputs that share storage with an input, a capture or a
 * constant are copied before writebacks run, so outputs are fresh and hold
 * the values of this call whatever happens to the caller's tensors
 * afterwards. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "trace/trace.h"

/* A step's constant operand (kx_constant): the backend's slot, and a
 * digest of the operand's key at the step's last call (seen_before). */
typedef struct {
    _Atomic(void *) slot;
    _Atomic uint64_t seen;
} kept_operand;

struct executable {
    ir_graph *graph;
    kiln_tensor **captures;
    int n_captures;
    kiln_tensor **consts;          /* per node: the 0-d tensor of a const node */
    ir_plan plan;
    const kx_backend *backend;     /* NULL: interpreted */
    kernels_entry **loaded;        /* per step: its kernel, NULL for eager steps */
    kept_operand *kept;            /* per step: what its launch keeps of a constant operand */
    exec_counts counts;
    kiln_device device;            /* where values live and kernels run */
    bool draws;                    /* whether it has random nodes, which draw afresh each call */
    _Atomic uint64_t calls;        /* so far: random nodes draw a new stream each call */
};

enum { STACK_VALUES = 128 };

/* -- Making it ------------------------------------------------------------------ */

/* A block of a CPU product computed with its epilogue: the backend's choice,
 * or KILN_PRODUCT_BLOCK_BYTES (0: never). */
static int64_t product_block_bytes(const kx_backend *backend)
{
    return backend ? core_env_int("KILN_PRODUCT_BLOCK_BYTES", backend->product_block_bytes) : 0;
}

static void dump_kernel(const exec_options *o, int index, const plan_step *s)
{
    char *text = kx_to_text(s->kernel);
    strbuf t = {0};
    strbuf_put(&t, "%s", text ? text : "");
    if (s->reuses != IR_NONE)
        strbuf_put(&t, "# plan: in_place over node %u\n", s->reuses);
    if (s->product != IR_NONE)
        strbuf_put(&t, "# plan: product of node %u inside the kernel\n", s->product);
    if (s->blocked_with >= 0)
        strbuf_put(&t, "# plan: on blocks of a product\n");
    if (s->options.stream_stores)
        strbuf_put(&t, "# plan: stream_stores\n");
    char *dump = strbuf_finish(&t);
    o->dump(o->dump_ctx, index, "kernel", dump);
    free(dump);
    free(text);
}

/* The plan's kernels through the service for target: loaded into x->loaded
 * when load. A kernels_get status, with why. */
static int get_kernels(executable *x, const exec_options *o, const kx_target *target, bool load, char *why,
                       size_t size)
{
    const ir_plan *p = &x->plan;
    int n = p->n_steps, n_kernels = 0;
    kx_kernel **kernels = malloc(((size_t)n + 1) * sizeof *kernels);
    kx_kernel_options *options = malloc(((size_t)n + 1) * sizeof *options);
    kernels_entry **loaded = load ? calloc((size_t)n + 1, sizeof *loaded) : NULL;
    int status = kernels && options && (loaded || !load) ? 0 : KERNELS_FAILED;
    if (status < 0)
        snprintf(why, size, "out of memory compiling the graph");
    for (int i = 0; status == 0 && i < n; i++) {
        if (!p->steps[i].kernel)
            continue;
        if (o->dump)
            dump_kernel(o, n_kernels, &p->steps[i]);
        options[n_kernels] = p->steps[i].options;
        kernels[n_kernels++] = p->steps[i].kernel;
    }
    kernels_request r = {.target = target, .opt_level = o->opt_level, .fast_math = o->fast_math,
                         .no_disk = o->no_disk, .function = o->function, .signature = o->signature, .log = o->log,
                         .dump = o->dump, .dump_ctx = o->dump_ctx};
    kernels_counts counts = {0};
    if (status == 0 && n_kernels > 0)
        status = kernels_get(kernels, options, n_kernels, &r, loaded, &counts, why, size);
    x->counts = (exec_counts){counts.compiled, counts.from_disk, counts.shared};
    if (status == 0 && load) { /* spread over the steps */
        x->loaded = calloc((size_t)n + 1, sizeof *x->loaded);
        x->kept = calloc((size_t)n + 1, sizeof *x->kept);
        for (int i = 0, k = 0; x->loaded && i < n; i++)
            x->loaded[i] = p->steps[i].kernel ? loaded[k++] : NULL;
        if (!x->loaded || !x->kept) {
            free(x->loaded);
            free(x->kept);
            x->loaded = NULL;
            x->kept = NULL;
            for (int k = 0; k < n_kernels; k++)
                kernels_release(loaded[k]);
            snprintf(why, size, "out of memory compiling the graph");
            status = KERNELS_FAILED;
        }
    }
    free(kernels);
    free(options);
    free(loaded);
    return status;
}

static int plan(executable *x, const kx_backend *backend, int opt_level, char *why, size_t size)
{
    plan_options po = {.backend = backend, .opt_level = opt_level, .product_block_bytes = product_block_bytes(backend)};
    return ir_plan_make(x->graph, &po, &x->plan, why, size);
}

/* Plans x for its device's backend and makes its kernels ready. A failure
 * leaves x unplanned with why; a kernel KILN_CACHE=require finds missing is
 * an error (-CORE_STATE, set). */
static int compile(executable *x, const exec_options *o, char *why, size_t size)
{
    const kx_backend *be = kernels_backend_for(x->device);
    if (!be) {
        kernels_have_backend(x->device, why, size);
        return 0;
    }
    const kx_target *target = be->target(NULL, why, size);
    if (!target)
        return 0;
    int status = plan(x, be, o->opt_level, why, size);
    if (status == -CORE_NOMEM)
        return status;
    if (status < 0) { /* an internal error, said in why: interpreting still gives the right answer */
        kiln_clear_error();
        return 0;
    }
    if ((status = get_kernels(x, o, target, true, why, size)) == 0) {
        x->backend = be;
        return 0;
    }
    ir_plan_free(&x->plan);
    return status == KERNELS_REQUIRED_MISSING ? core_fail(CORE_STATE, "kiln_call", "%s", why) : 0;
}

static void release_all(ir_graph *g, kiln_tensor **captures, int n_captures)
{
    ir_graph_free(g);
    for (int i = 0; i < n_captures; i++)
        eager_unhold(captures[i]);
    free(captures);
}

executable *exec_new(ir_graph *g, kiln_tensor **captures, int n_captures, const exec_options *o, char *why,
                     size_t why_size, int *status)
{
    why[0] = '\0';
    executable *x = calloc(1, sizeof *x);
    if (!x) {
        release_all(g, captures, n_captures);
        *status = core_fail(CORE_NOMEM, "kiln_call", "out of memory planning a graph");
        return NULL;
    }
    *x = (executable){.graph = g, .captures = captures, .n_captures = n_captures, .device = o->device};
    for (ir_ref r = 0; r < g->count && !x->draws; r++)
        x->draws = ir_ops[g->nodes[r].op].flags & FLAG_RANDOM;
    *status = (x->consts = interp_consts(g, o->device)) ? 0 : core_error_status();
    if (*status == 0 && o->compiled)
        *status = compile(x, o, why, why_size);
    if (*status == 0 && !x->backend)
        *status = plan(x, NULL, o->opt_level, why, why_size) == 0 ? 0 : -CORE_NOMEM;
    if (*status == -CORE_NOMEM)
        core_fail(CORE_NOMEM, "kiln_call", "out of memory planning a graph");
    if (*status < 0) {
        exec_free(x);
        return NULL;
    }
    return x;
}

int exec_compile_for(const ir_graph *g, const exec_options *o, const kx_target *target, exec_counts *counts,
                     char *why, size_t why_size)
{
    /* The kernels are the ones a plan for g would run on target: a plan
     * never run. */
    executable x = {.graph = (ir_graph *)g, .device = target->backend->device};
    int status = plan(&x, target->backend, o->opt_level, why, why_size);
    if (status == 0 && get_kernels(&x, o, target, false, why, why_size) < 0)
        status = -CORE_DEVICE;
    *counts = x.counts;
    ir_plan_free(&x.plan);
    return status;
}

void exec_free(executable *x)
{
    if (!x)
        return;
    for (int i = 0; x->loaded && i < x->plan.n_steps; i++)
        kernels_release(x->loaded[i]);
    for (int i = 0; x->kept && x->backend->forget && i < x->plan.n_steps; i++)
        x->backend->forget(atomic_load(&x->kept[i].slot));
    free(x->loaded);
    free(x->kept);
    ir_plan_free(&x->plan);
    interp_consts_free(x->graph, x->consts);
    release_all(x->graph, x->captures, x->n_captures);
    free(x);
}

/* -- What it is -------------------------------------------------------------------- */

bool exec_writes_back_into(const executable *x, const kiln_tensor *t)
{
    for (int w = 0; w < x->graph->n_writebacks; w++)
        if (kiln_shares_storage(t, x->captures[x->graph->writebacks[w].capture]))
            return true;
    return false;
}

const char *exec_backend_name(const executable *x)
{
    return x->backend ? x->backend->name : "interp";
}

exec_counts exec_kernel_counts(const executable *x)
{
    return x->counts;
}

const ir_graph *exec_graph(const executable *x)
{
    return x->graph;
}

int exec_steps(const executable *x)
{
    return x->plan.kernels;
}

int exec_fused_kernels(const executable *x)
{
    int n = 0;
    for (int i = 0; i < x->plan.n_steps; i++)
        n += x->plan.steps[i].kernel != NULL;
    return n;
}

int64_t exec_peak_bytes(const executable *x)
{
    return x->plan.peak_bytes;
}

int exec_products_in_blocks(const executable *x)
{
    return x->plan.products_in_blocks;
}

/* -- Kernel steps ---------------------------------------------------------------- */

static int launch_failed(int status, const char *why)
{
    return core_fail(status == KX_LAUNCH_BAD_INDEX ? CORE_VALUE : CORE_DEVICE, "kiln_call", "%s", why);
}

/* Node n's shape in this call. */
static const int64_t *shape_now(const executable *x, const ir_node *n, const int64_t *symbols,
                                int64_t shape[KILN_MAX_DIMS])
{
    if (!ir_shape_symbolic(n->ndim, n->shape))
        return n->shape;
    ir_shape_eval(&x->graph->sizes, n->ndim, n->shape, symbols, shape); /* the guards held: it fits */
    return shape;
}

/* Inputs, captures and constants: their values are the caller's and the
 * executable's own tensors, borrowed for the call rather than retained (two
 * atomic operations a source a call saved), and never written over. */
static bool borrowed(const ir_graph *g, ir_ref r)
{
    ir_op op = g->nodes[r].op;
    return op == OP_INPUT || op == OP_CAPTURE || op == OP_CONST;
}

/* The output of node n for a kernel that writes over value reuses (IR_NONE:
 * one that does not). The kernel reads that value from its output, so that
 * is the value itself when it alone holds its whole contiguous storage, or
 * is a capture the output is written back to (plan.c; no other source
 * shares its storage: a call with an input that does runs eagerly, and the
 * tracer refuses another capture that does), else a copy. */
static kiln_tensor *output_for(const executable *x, const ir_node *n, ir_ref reuses, kiln_tensor *const *values,
                               const int64_t *symbols)
{
    int64_t buf[KILN_MAX_DIMS];
    const int64_t *shape = shape_now(x, n, symbols, buf);
    kiln_tensor *out;
    if (reuses == IR_NONE)
        return eager_empty("kiln_call", x->device, n->dtype, n->ndim, shape); /* owned by no scope */
    kiln_tensor *t = values[reuses];
    bool alone = borrowed(x->graph, reuses) ? x->graph->nodes[reuses].op == OP_CAPTURE
                                            : atomic_load(&t->refs) == 1 && atomic_load(&t->storage->refs) == 1;
    if (alone && t->offset == 0 && eager_is_contiguous(t) && t->device == x->device) {
        out = kiln_reshape(t, n->ndim, shape);
    } else {
        kiln_tensor *copy = t->device == x->device ? eager_copy("kiln_call", t) : kiln_to_device(t, x->device);
        eager_disown(copy);
        out = copy ? kiln_reshape(copy, n->ndim, shape) : NULL;
        kiln_release(copy);
    }
    eager_disown(out);
    return out;
}

static const char *where(kiln_device d)
{
    return d == KILN_CUDA ? "CUDA" : "the CPU";
}

/* A kernel's operand on another device than the executable's (a capture):
 * a 0-d value is copied over, as eager ops take one; anything else is the
 * eager ops' error. NULL with the error set, or a new unowned tensor. */
static kiln_tensor *operand_moved(const executable *x, const kiln_tensor *t)
{
    char d[CORE_SHAPE_STR_MAX];
    if (t->ndim == 0) {
        kiln_tensor *moved = kiln_to_device((kiln_tensor *)t, x->device);
        eager_disown(moved); /* released with the other staged operands */
        return moved;
    }
    core_shape_str(d, t->ndim, t->shape);
    core_fail(CORE_DEVICE, "kiln_call", "operands are on different devices: a captured %s %s is on %s, the "
              "inputs on %s (move it with kiln_to_device)", d, kiln_dtype_name(t->dtype), where(t->device),
              where(x->device));
    return NULL;
}

/* Node r's value before its turn in the run: computed already, or a source. */
static kiln_tensor *value_of(const executable *x, ir_ref r, const interp_sources *s, kiln_tensor *const *values)
{
    kiln_tensor *t = interp_source(x->graph, r, s);
    return t ? t : values[r];
}

/* buffers[i] for step s's inputs (but its product's slot), copied into
 * staged[i] where the kernel cannot read them as they are. false with the
 * error set. */
static bool stage_inputs(const executable *x, const plan_step *s, const interp_sources *src,
                         kiln_tensor *const *values, void **buffers, kiln_tensor **staged)
{
    for (int i = 0; i < s->n_inputs; i++) {
        buffers[i] = NULL;
        if (i == s->kernel->product)
            continue;
        kiln_tensor *t = value_of(x, s->buffers[i], src, values);
        /* Kernels address buffers as row-major; CUDA's read 16 bytes at a
         * time, and a CPU 0-d value goes along as eager ops take it. */
        if (t->device != x->device)
            t = staged[i] = operand_moved(x, t);
        else if (!eager_is_contiguous(t) || (x->device == KILN_CUDA && (uintptr_t)eager_data(t) % 16))
            t = staged[i] = eager_copy("kiln_call", t);
        if (!t)
            return false;
        buffers[i] = eager_data(t);
    }
    return true;
}

/* A product's left operand computed while it is packed (a prologue) is no
 * tensor: a header of its node's shape, row-major and with no data, stands
 * in for its layout. */
static kiln_tensor stand_in(const executable *x, const ir_node *n, const int64_t *symbols)
{
    kiln_tensor t = {.dtype = n->dtype, .device = x->device, .ndim = n->ndim};
    const int64_t *shape = shape_now(x, n, symbols, t.shape);
    for (int64_t d = n->ndim - 1, step = 1; d >= 0; step *= shape[d--]) {
        t.shape[d] = shape[d];
        t.strides[d] = step;
    }
    return t;
}

/* Attention's v, after its product's operands, and the layout of the
 * weights' product (the weights, never stored, row-major). */
static bool attention_operand(const executable *x, const plan_step *s, kiln_tensor *const *values,
                              const int64_t *symbols, void **buffers, kg_matmul_args *layout)
{
    const ir_ref *ops = ir_operands(x->graph, &x->graph->nodes[s->node]);
    kiln_tensor weights = stand_in(x, &x->graph->nodes[ops[0]], symbols), *v = values[ops[1]];
    if (v->device != x->device) {
        kiln_release(operand_moved(x, v));
        return false;
    }
    buffers[s->n_inputs + s->n_outputs + 2] = eager_data(v);
    return eager_matmul_args("kiln_call", &weights, v, layout) == 0;
}

/* A product's left operand a as a kx_constant's key: a captured tensor, or
 * a view of one (a 1x1 convolution's filters reshaped), read where it lies
 * is the same values until its storage's version moves (the executable
 * holds the capture, so its storage stays the same one; no step writes it
 * before a read, plan.c's capture_input); {0, 0} for any other. */
static void constant_key(const executable *x, const kiln_tensor *a, uint64_t key[2])
{
    key[0] = key[1] = 0;
    for (int c = 0; a->storage && c < x->n_captures; c++)
        if (x->captures[c]->storage == a->storage) {
            key[0] = (uint64_t)(uintptr_t)a->storage;
            key[1] = atomic_load(&a->storage->version);
            return;
        }
}

/* The operands of step s's product, after its buffers, their layout, and
 * the key of its left operand (constant_key). They are matrices: one on
 * another device is an error (operand_moved's). */
static bool product_operands(const executable *x, const plan_step *s, kiln_tensor *const *values,
                             const int64_t *symbols, void **buffers, kg_matmul_args *layout, kiln_tensor **staged,
                             uint64_t key[2])
{
    const ir_node *product = &x->graph->nodes[s->product];
    const ir_ref *ops = ir_operands(x->graph, product);
    key[0] = key[1] = 0;
    if (product->op == OP_CONV2D) {
        if (eager_conv_args("kiln_call", product, values[ops[0]], values[ops[1]], layout,
                            &buffers[s->n_inputs + s->n_outputs], staged) < 0)
            return false;
        if (!*staged) /* the filters, the convolution's A */
            constant_key(x, values[ops[1]], key);
        return true;
    }
    kiln_tensor header, *a = values[ops[0]], *b = values[ops[1]];
    if (!s->kernel->prologue && !s->kernel->attention)
        constant_key(x, a, key);
    if (s->kernel->prologue) {
        header = stand_in(x, &x->graph->nodes[ops[0]], symbols);
        a = &header;
    }
    if (a->device != x->device || b->device != x->device) {
        kiln_release(operand_moved(x, a->device != x->device ? a : b));
        return false;
    }
    if (eager_matmul_args("kiln_call", a, b, layout) < 0)
        return false;
    buffers[s->n_inputs + s->n_outputs] = s->kernel->prologue ? NULL : eager_data(a);
    buffers[s->n_inputs + s->n_outputs + 1] = eager_data(b);
    return !s->kernel->attention || attention_operand(x, s, values, symbols, buffers, layout + 1);
}

/* Whether step i's constant operand had this key at the step's last call
 * too: a product keeps an operand packed only once it has seen it
 * unchanged, so that a function called once, or one whose operand changes
 * every call (a training step's weights), holds no packed copy of it. The
 * digest may collide; the backend's slot checks the whole key. */
static bool seen_before(const executable *x, int i, const uint64_t key[2])
{
    uint64_t digest = key[0] ^ key[1] * UINT64_C(0x9E3779B97F4A7C15);
    return atomic_exchange(&x->kept[i].seen, digest) == digest;
}

/* Runs kernel step i over its inputs into its output tensor. */
static kiln_tensor *run_kernel(const executable *x, int i, const interp_sources *src, kiln_tensor **values)
{
    const plan_step *s = &x->plan.steps[i];
    const ir_node *n = &x->graph->nodes[s->node];
    void *buffers[KX_MAX_BUFFERS + 3];
    kiln_tensor *staged[KX_MAX_BUFFERS];
    for (int b = 0; b < s->n_inputs; b++)
        staged[b] = NULL;
    kiln_tensor *out = output_for(x, n, s->reuses, values, src->symbols);
    kg_matmul_args layout[2]; /* attention's two products */
    kx_constant constant = {.slot = &x->kept[i].slot};
    bool ok = out && stage_inputs(x, s, src, values, buffers, staged) &&
              (s->product == IR_NONE || product_operands(x, s, values, src->symbols, buffers, layout,
                                                         &staged[s->kernel->product], constant.key));
    if (ok) {
        char why[512];
        bool keyed = constant.key[0] != 0 && seen_before(x, i, constant.key);
        buffers[s->n_inputs] = eager_data(out);
        int status = x->backend->launch(kernels_code(x->loaded[i]), buffers, s->product != IR_NONE ? layout : NULL,
                                        src->symbols, keyed ? &constant : NULL, 0,
                                        kx_size(s->kernel, s->kernel->rows, src->symbols), why, sizeof why);
        if (status < 0)
            ok = launch_failed(status, why) == 0;
    }
    for (int b = 0; b < s->n_inputs; b++)
        kiln_release(staged[b]);
    if (!ok)
        out = (kiln_release(out), NULL);
    return out;
}

/* A product's epilogue kernel, run on each block of the product. */
typedef struct {
    const executable *x;
    int step;
    void **buffers;
    int64_t cols;    /* the product's */
    const int64_t *symbols;
    bool failed;
} block_epilogue;

static void epilogue_on_block(void *ctx, void *data, int64_t begin, int64_t end)
{
    block_epilogue *e = ctx;
    const plan_step *s = &e->x->plan.steps[e->step];
    int64_t k_cols = s->kernel->cols;
    char why[512];
    e->buffers[s->n_inputs] = data;
    if (!e->failed && e->x->backend->launch(kernels_code(e->x->loaded[e->step]), e->buffers, NULL, e->symbols, NULL,
                                            begin * e->cols / k_cols, end * e->cols / k_cols, why, sizeof why) < 0)
        e->failed = launch_failed(-1, why) < 0; /* an epilogue never gathers (kx_product_misfit) */
}

/* Matmul node r, a block of rows at a time, with its epilogue kernel run on
 * each block (its value is then the epilogue's, in place). */
static kiln_tensor *run_product_in_blocks(const executable *x, ir_ref r, const interp_sources *src,
                                          kiln_tensor **values)
{
    int step = x->plan.steps[x->plan.step_of[r]].blocked_with;
    const plan_step *s = &x->plan.steps[step];
    const ir_node *n = &x->graph->nodes[r];
    void *buffers[KX_MAX_BUFFERS];
    kiln_tensor *staged[KX_MAX_BUFFERS] = {NULL}, *out = NULL;
    if (stage_inputs(x, s, src, values, buffers, staged)) {
        block_epilogue e = {x, step, buffers, n->shape[n->ndim - 1], src->symbols, false};
        const ir_ref *ops = ir_operands(x->graph, n);
        out = eager_matmul_blocks("kiln_call", values[ops[0]], values[ops[1]],
                                  x->plan.steps[x->plan.step_of[r]].block_rows, epilogue_on_block, &e);
        if (e.failed)
            out = (kiln_release(out), NULL);
    }
    for (int i = 0; i < s->n_inputs; i++)
        kiln_release(staged[i]);
    return out;
}

/* Node r's value: run by the eager ops, by its compiled kernel, or, for a
 * product in blocks and its epilogue, as run_product_in_blocks leaves it. */
static kiln_tensor *run_step(const executable *x, ir_ref r, const interp_sources *src, kiln_tensor **values)
{
    int step = x->backend ? x->plan.step_of[r] : -1;
    const plan_step *s = step >= 0 ? &x->plan.steps[step] : NULL;
    if (!s || (!s->kernel && s->blocked_with < 0)) {
        kiln_tensor *source = interp_source(x->graph, r, src);
        return source ? source : interp_node(x->graph, r, src, values);
    }
    if (s->blocked_with < 0)
        return run_kernel(x, step, src, values);
    if (!s->kernel)
        return run_product_in_blocks(x, r, src, values);
    return output_for(x, &x->graph->nodes[r], s->reuses, values, src->symbols);
}

static void release_dead_operands(const executable *x, ir_ref r, kiln_tensor **values)
{
    uint32_t n;
    const ir_ref *used = ir_plan_uses(&x->plan, r, &n);
    for (uint32_t i = 0; i < n; i++) {
        ir_ref o = used[i];
        if (x->plan.last_use[o] == r && values[o] && !borrowed(x->graph, o)) {
            kiln_release(values[o]);
            values[o] = NULL;
        }
    }
}

/* -- Outputs and writebacks ------------------------------------------------------- */

/* Whether node r's value is a new tensor a compiled kernel wrote. */
static bool made_by_kernel(const executable *x, ir_ref r)
{
    return x->backend && x->plan.step_of[r] >= 0 && x->plan.steps[x->plan.step_of[r]].kernel;
}

static bool shares_caller_storage(const executable *x, kiln_tensor *const *in, const kiln_tensor *t)
{
    for (int i = 0; i < x->graph->n_inputs; i++)
        if (kiln_shares_storage(in[i], t))
            return true;
    for (int i = 0; i < x->n_captures; i++)
        if (kiln_shares_storage(x->captures[i], t))
            return true;
    for (ir_ref r = 0; r < x->graph->count; r++)
        if (x->consts[r] && kiln_shares_storage(x->consts[r], t))
            return true;
    return false;
}

static int take_outputs(const executable *x, kiln_tensor *const *in, kiln_tensor **values, kiln_tensor **out)
{
    const ir_graph *g = x->graph;
    for (int i = 0; i < g->n_outputs; i++) {
        kiln_tensor *t = values[g->outputs[i]];
        bool shared = !made_by_kernel(x, g->outputs[i]) && shares_caller_storage(x, in, t);
        for (int j = 0; j < i && !shared; j++) /* one value returned twice: two tensors */
            shared = kiln_shares_storage(out[j], t);
        out[i] = shared ? eager_copy("kiln_call", t) : kiln_retain(t);
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                out[j] = (kiln_release(out[j]), NULL);
            return core_error_status();
        }
    }
    return 0;
}

static bool written_back(const executable *x, const kiln_tensor *t)
{
    for (int i = 0; i < x->graph->n_writebacks; i++)
        if (kiln_shares_storage(x->captures[x->graph->writebacks[i].capture], t))
            return true;
    return false;
}

/* Whether a kernel wrote v over capture c (output_for). */
static bool written_in_place(const kiln_tensor *c, const kiln_tensor *v)
{
    return v->storage == c->storage && v->offset == c->offset && v->numel == c->numel && eager_is_contiguous(v) &&
           eager_is_contiguous(c);
}

/* Every value is read before any capture is written: a value that shares
 * storage with a capture being written back is copied first (b = a; a = c
 * must give b the old a, as it does eagerly). */
static int write_back(const executable *x, kiln_tensor **values)
{
    int n = x->graph->n_writebacks, status = 0;
    if (n == 0)
        return 0;
    kiln_tensor **sources = calloc((size_t)n, sizeof *sources);
    if (!sources)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory writing back");
    for (int i = 0; i < n && status == 0; i++) {
        kiln_tensor *v = values[x->graph->writebacks[i].value];
        if (written_in_place(x->captures[x->graph->writebacks[i].capture], v))
            continue;
        sources[i] = written_back(x, v) ? eager_copy("kiln_call", v) : kiln_retain(v);
        if (!sources[i])
            status = core_error_status();
    }
    kiln_no_grad_begin(); /* as the body assigned: parameters that need gradients may be written */
    for (int i = 0; i < n && status == 0; i++) {
        kiln_tensor *c = x->captures[x->graph->writebacks[i].capture];
        if (sources[i])
            status = kiln_assign(c, sources[i]);
        else /* as kiln_assign would: values saved for gradients see the change */
            atomic_fetch_add_explicit(&c->storage->version, 1, memory_order_relaxed);
    }
    kiln_no_grad_end();
    for (int i = 0; i < n; i++)
        kiln_release(sources[i]);
    free(sources);
    return status < 0 ? status : 0;
}

/* KILN_PROFILE=1: each step's wall time on stderr, to see where a call's
 * time goes beside what its kernels take alone. */
static bool profiling(void)
{
    static _Atomic int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v < 0)
        atomic_store_explicit(&on, v = core_env_int("KILN_PROFILE", 0) != 0, memory_order_relaxed);
    return v;
}

static void profile_step(const executable *x, uint32_t i, ir_ref r, double start_ms)
{
    double us = (core_now_ms() - start_ms) * 1e3;
    const ir_node *n = &x->graph->nodes[r];
    int step = x->backend ? x->plan.step_of[r] : -1;
    const char *how = "eager";
    if (step >= 0 && x->plan.steps[step].kernel) /* a product inside is most of such a kernel's time */
        how = x->plan.steps[step].product != IR_NONE ? "kernel with its product" : "kernel";
    else if (step >= 0 && x->plan.steps[step].blocked_with >= 0)
        how = "product in blocks"; /* with its epilogue, whose own step then takes nothing */
    char shape[KILN_MAX_DIMS * 21 + 1] = "";
    for (int d = 0, at = 0; d < n->ndim; d++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, d ? "x%lld" : "%lld", (long long)n->shape[d]);
    fprintf(stderr, "kiln profile: step %u %s [%s] %s %.1f us\n", i, ir_ops[n->op].name, shape, how, us);
}

/* After a failed call: a kernel may have written a capture in place
 * (output_for) before a later step failed, so every capture the graph
 * writes back counts as changed, as kiln_assign would count it, and
 * nothing keeps what it held (kx_constant). */
static void writebacks_changed(const executable *x)
{
    for (int i = 0; i < x->graph->n_writebacks; i++) {
        kiln_tensor *c = x->captures[x->graph->writebacks[i].capture];
        if (c->storage)
            atomic_fetch_add_explicit(&c->storage->version, 1, memory_order_relaxed);
    }
}

int exec_run(const executable *x, kiln_tensor *const *in, const int64_t *symbols, kiln_tensor **out)
{
    const ir_graph *g = x->graph;
    const ir_plan *p = &x->plan;
    kiln_tensor *stack[STACK_VALUES];
    kiln_tensor **values = g->count <= STACK_VALUES ? stack : malloc(g->count * sizeof *values);
    if (!values)
        return core_fail_status(CORE_NOMEM, "kiln_call");
    /* Only a graph that draws counts its calls and reserves generator words:
     * the rest pay no atomic and no walk of the graph per call. */
    interp_sources src = {in, x->captures, x->consts,
                          x->draws ? atomic_fetch_add((_Atomic uint64_t *)&x->calls, 1) : 0,
                          x->draws ? eager_rng_reserve(g) : 0, x->device, symbols};
    for (uint32_t i = 0; i < p->n_visit; i++)
        values[p->visit[i]] = NULL; /* only these are ever read */
    int status = 0;
    bool profile = profiling();
    for (uint32_t i = 0; i < p->n_visit && status == 0; i++) {
        ir_ref r = p->visit[i];
        double start_ms = profile ? core_now_ms() : 0;
        if (!(values[r] = run_step(x, r, &src, values)))
            status = core_error_status();
        else
            release_dead_operands(x, r, values);
        if (profile)
            profile_step(x, i, r, start_ms);
    }
    if (status == 0)
        status = take_outputs(x, in, values, out);
    if (status == 0 && (status = write_back(x, values)) < 0)
        for (int i = 0; i < g->n_outputs; i++)
            out[i] = (kiln_release(out[i]), NULL);
    if (status != 0)
        writebacks_changed(x);
    for (uint32_t i = 0; i < p->n_visit; i++)
        if (!borrowed(g, p->visit[i]))
            kiln_release(values[p->visit[i]]);
    if (values != stack)
        free(values);
    return status;
}
