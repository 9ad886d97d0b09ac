/* Reverse mode: the tape that ops on tensors needing gradients leave, and the
 * walk back over it from a loss to the leaves.
 *
 * Each op whose result needs gradients gives the result a record (a
 * grad_node): the op, its parameters, for each operand where its gradient
 * goes (the operand's own record, or the operand itself when it is a leaf)
 * and the values the op's rule reads. kiln_backward sorts the records the
 * loss depends on so that each comes before those of its operands, then runs
 * each rule once on the sum of the gradients that reached its result. The
 * rules are kiln ops, so a backward pass inside a marked body is traced like
 * the forward pass; its leaves' gradients then live in a table of that trace
 * instead of on the leaves. */
#include <stdlib.h>
#include <string.h>

#include "eager/grad.h"

static _Thread_local int no_grad_depth;

void kiln_no_grad_begin(void)
{
    no_grad_depth++;
}

void kiln_no_grad_end(void)
{
    if (no_grad_depth == 0) {
        core_fail(CORE_STATE, "kiln_no_grad_end", "no kiln_no_grad_begin is open");
        return;
    }
    no_grad_depth--;
}

static bool needs_grad(const kiln_tensor *t)
{
    return t->requires_grad || t->grad_fn;
}

bool kiln_needs_grad(const kiln_tensor *t)
{
    return t && eager_alive(t) && needs_grad(t);
}

/* -- Constants for the rules ---------------------------------------------- */

kiln_tensor *grad_scalar(double value)
{
    return tensor_own(eager_scalar_literal(KILN_F64, value));
}

kiln_tensor *grad_full(const kiln_tensor *like, int ndim, const int64_t *shape, double value)
{
    if (like->device == KILN_CUDA && !like->trace) /* eager CUDA ops take CPU values only 0-d */
        return kiln_to_device(kiln_full(like->dtype, ndim, shape, value), KILN_CUDA);
    kiln_tensor *one = tensor_own(eager_scalar_literal(like->dtype, value));
    return one ? kiln_expand(one, ndim, shape) : NULL;
}

/* -- Records --------------------------------------------------------------- */

static size_t node_size(int n_in)
{
    return sizeof(grad_node) + (size_t)n_in * sizeof(grad_input);
}

/* Records whose last reference went while another was being freed: freed
 * by the outermost release in a loop, not by recursion (a record's saved
 * operands hold the records before it, and a chain may be 100,000 long). */
static _Thread_local struct {
    grad_node **items;
    int count, cap;
    bool draining;
} dying;

static void node_release(grad_node *n);

static void node_free(grad_node *n)
{
    for (int i = 0; i < n->n_in; i++) {
        node_release(n->in[i].fn);
        eager_unhold(n->in[i].leaf);
        eager_unhold(n->in[i].saved);
    }
    kiln_release(n->out);
    core_free(n, node_size(n->n_in));
}

static bool defer(grad_node *n)
{
    if (dying.count == dying.cap) {
        int cap = dying.cap ? 2 * dying.cap : 64;
        grad_node **grown = realloc(dying.items, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        dying.items = grown;
        dying.cap = cap;
    }
    dying.items[dying.count++] = n;
    return true;
}

static void node_release(grad_node *n)
{
    if (!n || atomic_fetch_sub_explicit(&n->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (dying.draining && defer(n))
        return;
    if (dying.draining) { /* out of memory to defer: recursion it is */
        node_free(n);
        return;
    }
    dying.draining = true;
    node_free(n);
    while (dying.count > 0)
        node_free(dying.items[--dying.count]);
    dying.draining = false;
    free(dying.items);
    dying.items = NULL;
    dying.cap = 0;
}

void grad_forget(kiln_tensor *t)
{
    node_release(t->grad_fn);
    t->grad_fn = NULL;
    eager_unhold(t->grad);
    t->grad = NULL;
}

/* A new unowned tensor with t's values and no record: a view of its data,
 * or for a tracer a tracer of its own (traces know their live tracers). */
static kiln_tensor *detached(kiln_tensor *t)
{
    if (!t->trace)
        return tensor_view("kiln_detach", t, t->ndim, t->shape, t->strides, t->offset);
    ir_params params = {0};
    for (int d = 0; d < t->ndim; d++)
        params.perm[d] = IR_SIZE_FROM + d;
    eager_trace *trace = eager_active_trace();
    return trace->record(trace, OP_RESHAPE, 1, &t, &params, t->dtype, t->ndim, t->shape);
}

/* What a rule keeps of operand t: the tensor, or a heap copy of a scalar
 * operand (those live on their op's stack). */
static kiln_tensor *saved(kiln_tensor *t)
{
    if (!t->literal)
        return eager_hold(t);
    const void *v = t->storage->data;
    double value = t->dtype == KILN_I64 ? (double)*(const int64_t *)v
                 : t->dtype == KILN_F32 ? *(const float *)v : *(const double *)v;
    kiln_tensor *copy = eager_scalar_literal(t->dtype, value), *held = eager_hold(copy);
    kiln_release(copy);
    return held;
}

static void input_init(grad_input *gi, kiln_tensor *t, bool save)
{
    gi->dtype = t->dtype;
    gi->ndim = t->ndim;
    memcpy(gi->shape, t->shape, sizeof gi->shape);
    if (ir_dtype_is_float(t->dtype) && t->grad_fn) {
        gi->fn = t->grad_fn;
        atomic_fetch_add_explicit(&gi->fn->refs, 1, memory_order_relaxed);
    } else if (ir_dtype_is_float(t->dtype) && t->requires_grad) {
        gi->leaf = eager_hold(t);
    }
    if (save) {
        gi->saved = saved(t);
        gi->version = gi->saved && gi->saved->storage ? atomic_load(&gi->saved->storage->version) : 0;
    }
}

static grad_node *node_new(ir_op op, const ir_params *params, int n, kiln_tensor *const *in, kiln_tensor *out)
{
    grad_node *node = core_alloc(node_size(n)); /* through kiln's allocator: the faults suite fails it */
    if (!node)
        return NULL;
    memset(node, 0, node_size(n));
    atomic_init(&node->refs, 1);
    node->op = op;
    if (params)
        node->params = *params;
    node->n_in = n;
    unsigned saves = grad_rules[op].saves;
    bool complete = true;
    for (int i = 0; i < n; i++) {
        input_init(&node->in[i], in[i], i < 31 && (saves & GRAD_SAVE_IN(i)));
        complete &= !(i < 31 && (saves & GRAD_SAVE_IN(i))) || node->in[i].saved;
    }
    if (saves & GRAD_SAVE_OUT)
        complete &= (node->out = detached(out)) != NULL;
    if (!complete) {
        node_release(node);
        return NULL;
    }
    return node;
}

bool grad_wanted(int n, kiln_tensor *const *in)
{
    for (int i = 0; i < n && no_grad_depth == 0; i++)
        if (ir_dtype_is_float(in[i]->dtype) && needs_grad(in[i]))
            return true;
    return false;
}

kiln_tensor *grad_track(ir_op op, int n, kiln_tensor *const *in, const ir_params *params, kiln_tensor *out)
{
    if (!out || no_grad_depth > 0 || !ir_dtype_is_float(out->dtype) || out->grad_fn)
        return out; /* a composite's result has its own ops' records */
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (in[i] == out) /* the op handed back its operand: it keeps its record */
            return out;
        any |= ir_dtype_is_float(in[i]->dtype) && needs_grad(in[i]);
    }
    if (!any)
        return out;
    grad_node *node = node_new(op, params, n, in, out);
    if (!node) {
        kiln_release(out);
        char fn[64];
        snprintf(fn, sizeof fn, "kiln_%s", ir_ops[op].name);
        core_fail(CORE_NOMEM, fn, "out of memory recording the gradient");
        return NULL;
    }
    out->grad_fn = node;
    return out;
}

/* -- Gradients of leaves ---------------------------------------------------- *
 * Eagerly a leaf holds its gradient. A trace keeps its own, so that the
 * traced code computes the gradient afresh each call and nothing of the
 * trace outlives it. */

typedef struct {
    eager_trace *trace;
    kiln_tensor *leaf; /* retained */
    kiln_tensor *grad; /* retained */
} trace_grad;

static _Thread_local struct {
    trace_grad *items;
    int count, cap;
} traced;

static trace_grad *traced_find(const kiln_tensor *leaf)
{
    eager_trace *trace = eager_active_trace();
    for (int i = 0; i < traced.count; i++)
        if (traced.items[i].trace == trace && traced.items[i].leaf == leaf)
            return &traced.items[i];
    return NULL;
}

static void traced_remove(trace_grad *e)
{
    eager_unhold(e->grad);
    eager_unhold(e->leaf);
    *e = traced.items[--traced.count];
    if (traced.count == 0) {
        free(traced.items);
        traced.items = NULL;
        traced.cap = 0;
    }
}

static int traced_add(kiln_tensor *leaf, kiln_tensor *grad)
{
    if (traced.count == traced.cap) {
        int cap = traced.cap ? 2 * traced.cap : 16;
        trace_grad *grown = realloc(traced.items, (size_t)cap * sizeof *grown);
        if (!grown)
            return core_fail(CORE_NOMEM, "kiln_backward", "out of memory keeping a traced gradient");
        traced.items = grown;
        traced.cap = cap;
    }
    traced.items[traced.count++] = (trace_grad){eager_active_trace(), eager_hold(leaf), eager_hold(grad)};
    return 0;
}

void eager_trace_finish(eager_trace *trace)
{
    trace->finished = true;
    for (int i = traced.count - 1; i >= 0; i--)
        if (traced.items[i].trace == trace)
            traced_remove(&traced.items[i]);
}

/* The gradient slot of leaf: where *slot is the current one (NULL: none). */
static kiln_tensor **grad_slot(kiln_tensor *leaf)
{
    if (!recording())
        return &leaf->grad;
    trace_grad *e = traced_find(leaf);
    return e ? &e->grad : NULL;
}

kiln_tensor *grad_peek(kiln_tensor *t)
{
    kiln_tensor **slot = grad_slot(t);
    return slot ? *slot : NULL;
}

int grad_replace(kiln_tensor *t, kiln_tensor *g)
{
    kiln_tensor **slot = grad_slot(t);
    if (!slot)
        return traced_add(t, g);
    eager_hold(g);
    eager_unhold(*slot);
    *slot = g;
    return 0;
}

/* Adds g (owned by the scope) to leaf's gradient. */
static int leaf_accumulate(kiln_tensor *leaf, kiln_tensor *g)
{
    kiln_tensor **slot = grad_slot(leaf);
    if (!slot)
        return traced_add(leaf, g);
    /* Eagerly a gradient is contiguous, as PyTorch's, whatever view the rules made. */
    kiln_tensor *sum = *slot ? kiln_add(*slot, g) : kiln_contiguous(g);
    if (!sum)
        return -1;
    eager_unhold(*slot);
    *slot = eager_hold(sum);
    return 0;
}

/* -- The walk -------------------------------------------------------------- */

typedef struct {
    grad_node **items;
    int count, cap;
} node_list;

static bool list_push(node_list *l, grad_node *n)
{
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        grad_node **grown = realloc(l->items, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->count++] = n;
    return true;
}

static _Atomic unsigned walks;

/* A record being visited and the next of its operands to look at. */
typedef struct {
    grad_node *node;
    int next;
} frame;

static bool frame_push(frame **stack, int *depth, int *cap, grad_node *n)
{
    if (*depth == *cap) {
        int grown_cap = *cap ? 2 * *cap : 64;
        frame *grown = realloc(*stack, (size_t)grown_cap * sizeof *grown);
        if (!grown)
            return false;
        *stack = grown;
        *cap = grown_cap;
    }
    (*stack)[(*depth)++] = (frame){n, 0};
    return true;
}

/* Appends the records root depends on to order, each after those of its
 * operands (a depth-first post-order, its stack on the heap: graphs are deep). */
static int collect(grad_node *root, unsigned visit, node_list *order)
{
    if (!root || root->visit == visit)
        return 0;
    frame *stack = NULL;
    int depth = 0, cap = 0;
    root->visit = visit;
    bool ok = frame_push(&stack, &depth, &cap, root);
    while (ok && depth > 0) {
        frame *top = &stack[depth - 1];
        if (top->next < top->node->n_in) {
            grad_node *c = top->node->in[top->next++].fn;
            if (c && c->visit != visit) {
                c->visit = visit;
                ok = frame_push(&stack, &depth, &cap, c);
            }
            continue;
        }
        depth--;
        ok = list_push(order, top->node);
    }
    free(stack);
    return ok ? 0 : core_fail(CORE_NOMEM, "kiln_backward", "out of memory sorting the gradient record");
}

/* g summed over the axes it was broadcast along and converted, to fit in. */
static kiln_tensor *conform(kiln_tensor *g, const grad_input *in)
{
    while (g && g->ndim > in->ndim)
        g = kiln_sum(g, 0, false);
    for (int d = 0; g && d < in->ndim; d++)
        if (in->shape[d] == 1 && g->shape[d] != 1)
            g = kiln_sum(g, d, true);
    if (g && g->dtype != in->dtype)
        g = kiln_cast(g, in->dtype);
    return g;
}

/* Adds g (owned by the scope) to the gradient of record n's result. */
static int node_accumulate(grad_node *n, kiln_tensor *g)
{
    kiln_tensor *sum = n->acc ? kiln_add(n->acc, g) : g;
    if (!sum)
        return -1;
    eager_unhold(n->acc);
    n->acc = eager_hold(sum);
    return 0;
}

static int deliver(const grad_input *in, kiln_tensor *g)
{
    if (!(g = conform(g, in)))
        return -1;
    return in->fn ? node_accumulate(in->fn, g) : leaf_accumulate(in->leaf, g);
}

/* PyTorch's check: a value a rule reads was assigned after the op used it. */
static int check_saved(const grad_node *n)
{
    for (int i = 0; i < n->n_in; i++) {
        const kiln_tensor *s = n->in[i].saved;
        if (s && s->storage && atomic_load(&s->storage->version) != n->in[i].version) {
            char d[DESCRIBE_MAX];
            return core_fail(CORE_STATE, "kiln_backward",
                             "operand %d (%s) of kiln_%s, which its gradient needs, was changed by "
                             "kiln_assign after the op used it: compute a new tensor instead",
                             i, describe(d, s), ir_ops[n->op].name);
        }
    }
    return 0;
}

/* Runs n's rule on g (a reference the walk holds) and passes the operands'
 * gradients on. */
static int node_backward(grad_node *n, kiln_tensor *g)
{
    grad_rule_fn rule = grad_rules[n->op].fn;
    if (!rule)
        return core_fail(CORE_VALUE, "kiln_backward", "kiln_%s is not differentiable: a gradient "
                         "reached it from the loss; compute its operands without kiln_requires_grad "
                         "or kiln_detach them", ir_ops[n->op].name);
    if (check_saved(n) < 0)
        return -1;
    kiln_tensor *stack_gin[8] = {NULL};
    kiln_tensor **gin = n->n_in <= 8 ? stack_gin : calloc((size_t)n->n_in, sizeof *gin);
    if (!gin)
        return core_fail(CORE_NOMEM, "kiln_backward", "out of memory");
    kiln_scope_begin();
    int status = rule(n, g, gin);
    for (int i = 0; status == 0 && i < n->n_in; i++)
        if (gin[i] && grad_needed(n, i))
            status = deliver(&n->in[i], gin[i]);
    kiln_scope_end();
    if (gin != stack_gin)
        free(gin);
    return status;
}

static int walk(node_list *order)
{
    int status = 0;
    for (int k = order->count - 1; k >= 0; k--) {
        grad_node *n = order->items[k];
        kiln_tensor *g = n->acc;
        n->acc = NULL;
        if (g && status == 0)
            status = node_backward(n, g);
        eager_unhold(g);
    }
    return status;
}

/* -- Public ---------------------------------------------------------------- */

static int check_output(const char *fn, const kiln_tensor *t, const char *what)
{
    char d[DESCRIBE_MAX];
    if (!ir_dtype_is_float(t->dtype))
        return core_fail(CORE_DTYPE, fn, "%s %s is not float: integer and bool values have no gradient",
                         what, describe(d, t));
    if (!needs_grad(t))
        return core_fail(CORE_STATE, fn, "%s %s does not need gradients: nothing it was computed from "
                         "has kiln_requires_grad (while gradients were recorded), or only ops without "
                         "gradients (comparisons, argmax, casts to integers) lead to it",
                         what, describe(d, t));
    return 0;
}

static int check_seed(const char *fn, int i, const kiln_tensor *out, const kiln_tensor *g)
{
    char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
    if (!g && out->ndim > 0)
        return core_fail(CORE_SHAPE, fn, "outputs[%d] %s is not 0-d: give its gradient in grads[%d]",
                         i, describe(a, out), i);
    if (!g)
        return 0;
    if (check_operands(fn, 1, (kiln_tensor *const *)&g, (const char *const[]){"a gradient in grads"}) < 0)
        return -1;
    if (!ir_dtype_is_float(g->dtype) || g->ndim != out->ndim ||
        memcmp(g->shape, out->shape, (size_t)out->ndim * sizeof *out->shape))
        return core_fail(CORE_SHAPE, fn, "grads[%d] %s does not fit outputs[%d] %s (same shape, float)",
                         i, describe(a, g), i, describe(b, out));
    return 0;
}

static int check_outputs(const char *fn, kiln_tensor *const *outputs, kiln_tensor *const *grads, int n)
{
    if (!outputs)
        return core_fail_null_arg(fn, "outputs");
    if (n < 1)
        return core_fail(CORE_VALUE, fn, "needs at least one output, got %d", n);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "outputs[%d]", i);
        if (check_operands(fn, 1, &outputs[i], (const char *const[]){what}) < 0 ||
            check_output(fn, outputs[i], what) < 0 || check_seed(fn, i, outputs[i], grads ? grads[i] : NULL) < 0)
            return -1;
    }
    return 0;
}

/* Output i's starting gradient, owned by the scope: a private copy of the
 * caller's (so no gradient kept aliases it), or ones. */
static kiln_tensor *seed(kiln_tensor *out, kiln_tensor *g)
{
    if (!g)
        return grad_full(out, out->ndim, out->shape, 1);
    if (out->dtype != g->dtype)
        return kiln_cast(g, out->dtype);
    return g->trace ? g : tensor_own(eager_copy("kiln_backward", g));
}

static int seed_all(kiln_tensor *const *outputs, kiln_tensor *const *grads, int n)
{
    int status = 0;
    kiln_scope_begin();
    for (int i = 0; status == 0 && i < n; i++) {
        kiln_tensor *g = seed(outputs[i], grads ? grads[i] : NULL);
        if (!g)
            status = -1;
        else if (outputs[i]->grad_fn)
            status = node_accumulate(outputs[i]->grad_fn, g);
        else
            status = leaf_accumulate(outputs[i], g);
    }
    kiln_scope_end();
    return status;
}

static int backward(const char *fn, kiln_tensor *const *outputs, kiln_tensor *const *grads, int n)
{
    if (check_outputs(fn, outputs, grads, n) < 0)
        return -1;
    node_list order = {0};
    unsigned visit = atomic_fetch_add(&walks, 1) + 1;
    int status = 0;
    for (int i = 0; status == 0 && i < n; i++)
        status = collect(outputs[i]->grad_fn, visit, &order);
    no_grad_depth++; /* the backward pass itself is not differentiated */
    if (status == 0)
        status = seed_all(outputs, grads, n);
    for (int k = 0; status < 0 && k < order.count; k++) { /* a failed seed leaves sums behind */
        eager_unhold(order.items[k]->acc);
        order.items[k]->acc = NULL;
    }
    if (status == 0)
        status = walk(&order);
    no_grad_depth--;
    free(order.items);
    if (status == 0)
        core_succeeded();
    return status < 0 ? status : 0;
}

int kiln_backward(kiln_tensor *loss)
{
    if (!loss)
        return core_fail_null("kiln_backward", "loss");
    if (eager_alive(loss) && loss->ndim != 0) {
        char d[DESCRIBE_MAX];
        return core_fail(CORE_SHAPE, "kiln_backward", "loss %s is not 0-d: reduce it (kiln_sum, kiln_mean) "
                         "or seed it with kiln_backward_with", describe(d, loss));
    }
    return backward("kiln_backward", &loss, NULL, 1);
}

int kiln_backward_with(kiln_tensor *const *outputs, kiln_tensor *const *grads, int n)
{
    return backward("kiln_backward_with", outputs, grads, n);
}

int kiln_requires_grad(kiln_tensor *t, bool on)
{
    const char *fn = "kiln_requires_grad";
    if (check_operands(fn, 1, &t, (const char *const[]){"t"}) < 0)
        return -1;
    char d[DESCRIBE_MAX];
    if (on && !ir_dtype_is_float(t->dtype))
        return core_fail(CORE_DTYPE, fn, "t %s is not float: only float tensors have gradients", describe(d, t));
    if (t->grad_fn)
        return core_fail(CORE_STATE, fn, "t %s was computed by kiln_%s from tensors that need gradients: "
                         "only leaves can be marked (kiln_detach makes a leaf of it)",
                         describe(d, t), ir_ops[t->grad_fn->op].name);
    if (t->literal)
        return core_fail(CORE_VALUE, fn, "t is a scalar constant");
    t->requires_grad = on;
    core_succeeded();
    return 0;
}

kiln_tensor *kiln_grad(kiln_tensor *t)
{
    const char *fn = "kiln_grad";
    if (check_operands(fn, 1, &t, (const char *const[]){"t"}) < 0)
        return NULL;
    kiln_tensor **slot = grad_slot(t);
    if (slot && *slot)
        return tensor_own(kiln_retain(*slot));
    char d[DESCRIBE_MAX];
    if (t->grad_fn)
        core_fail(CORE_STATE, fn, "t %s is not a leaf (kiln_%s computed it): only leaves keep gradients",
                  describe(d, t), ir_ops[t->grad_fn->op].name);
    else if (!t->requires_grad)
        core_fail(CORE_STATE, fn, "t %s does not need gradients: mark it with kiln_requires_grad", describe(d, t));
    else
        core_fail(CORE_STATE, fn, "t %s has no gradient yet%s: call kiln_backward first", describe(d, t),
                  recording() ? " in this trace" : "");
    return NULL;
}

int kiln_zero_grad(kiln_tensor *t)
{
    if (check_operands("kiln_zero_grad", 1, &t, (const char *const[]){"t"}) < 0)
        return -1;
    if (recording()) {
        trace_grad *e = traced_find(t);
        if (e)
            traced_remove(e);
    } else {
        eager_unhold(t->grad);
        t->grad = NULL;
    }
    core_succeeded();
    return 0;
}

kiln_tensor *kiln_detach(kiln_tensor *t)
{
    if (check_operands("kiln_detach", 1, &t, (const char *const[]){"t"}) < 0)
        return NULL;
    if (recording() && !t->trace) { /* a capture: traced code reads it through its capture */
        ir_params params = {0};
        for (int d = 0; d < t->ndim; d++)
            params.perm[d] = IR_SIZE_FROM + d;
        return record_op("kiln_detach", OP_RESHAPE, 1, &t, &params, t->dtype, t->ndim, t->shape);
    }
    kiln_tensor *out = detached(t);
    if (!out && !core_error_pending())
        core_fail(CORE_NOMEM, "kiln_detach", "out of memory");
    return tensor_own(out);
}

int grad_check_assign(const kiln_tensor *dst, const kiln_tensor *src)
{
    if (no_grad_depth > 0)
        return 0;
    char d[DESCRIBE_MAX];
    if (needs_grad(dst))
        return core_fail(CORE_STATE, "kiln_assign", "dst %s needs gradients: an in-place write would "
                         "change a value the gradient depends on; update parameters between "
                         "kiln_no_grad_begin and kiln_no_grad_end, or compute a new tensor", describe(d, dst));
    if (needs_grad(src))
        return core_fail(CORE_STATE, "kiln_assign", "src %s needs gradients, which kiln_assign does not "
                         "record: assign kiln_detach(src), or assign between kiln_no_grad_begin and "
                         "kiln_no_grad_end", describe(d, src));
    return 0;
}
