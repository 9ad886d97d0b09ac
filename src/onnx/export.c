/* kiln_onnx_export: the optimised graph of a specialization written as an
 * ONNX model (opset 17). Each graph node becomes one ONNX node or a few,
 * with Casts where kiln promotes operands that ONNX wants of one type. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "onnx/onnx.h"

static const char *const export_fn = "kiln_onnx_export";
enum { OPSET = 17, IR_VERSION = 8 };

/* Everything the model's messages point to, freed together. */
typedef struct {
    void **blocks;
    int n, cap;
    bool failed;
} arena;

static void *arena_alloc(arena *a, size_t size)
{
    if (a->failed)
        return NULL;
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 256;
        void **blocks = realloc(a->blocks, (size_t)cap * sizeof *blocks);
        if (!blocks) {
            a->failed = true;
            return NULL;
        }
        a->blocks = blocks;
        a->cap = cap;
    }
    void *p = calloc(1, size ? size : 1);
    if (!p) {
        a->failed = true;
        return NULL;
    }
    a->blocks[a->n++] = p;
    return p;
}

static char *arena_printf(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *arena_printf(arena *a, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = arena_alloc(a, strlen(buf) + 1);
    if (s)
        strcpy(s, buf);
    return s;
}

static void arena_free(arena *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->blocks[i]);
    free(a->blocks);
}

/* A growing array of pointers in the arena. */
typedef struct {
    void **items;
    size_t n, cap;
} list;

static void list_add(arena *a, list *l, void *item)
{
    if (!item) {
        a->failed = true;
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void **items = arena_alloc(a, cap * sizeof *items);
        if (!items)
            return;
        if (l->n)
            memcpy(items, l->items, l->n * sizeof *items);
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = item;
}

typedef struct {
    arena a;
    const ir_graph *g;
    kiln_tensor *const *captures;
    const kiln_fn *f;
    char **names;   /* per graph node: its value's name */
    list nodes, initializers;
    int fresh;      /* numbers the values the export adds */
    list owned;     /* tensors made for initializers */
} exporter;

/* -- Building nodes -------------------------------------------------------------- */

static char *fresh_name(exporter *e)
{
    return arena_printf(&e->a, "t%d", e->fresh++);
}

static Onnx__NodeProto *add_node(exporter *e, const char *op, int n_in, const char *const *in, const char *out)
{
    Onnx__NodeProto *node = arena_alloc(&e->a, sizeof *node);
    char **ins = arena_alloc(&e->a, (size_t)(n_in ? n_in : 1) * sizeof *ins);
    char **outs = arena_alloc(&e->a, sizeof *outs);
    if (!node || !ins || !outs || !out) {
        e->a.failed = true;
        return NULL;
    }
    onnx__node_proto__init(node);
    node->op_type = (char *)op;
    node->name = arena_printf(&e->a, "%s_%zu", op, e->nodes.n);
    for (int i = 0; i < n_in; i++)
        ins[i] = (char *)in[i];
    node->input = ins;
    node->n_input = (size_t)n_in;
    outs[0] = (char *)out;
    node->output = outs;
    node->n_output = 1;
    list_add(&e->a, &e->nodes, node);
    return node;
}

static Onnx__AttributeProto *add_attr(exporter *e, Onnx__NodeProto *node, const char *name)
{
    Onnx__AttributeProto *a = node ? arena_alloc(&e->a, sizeof *a) : NULL;
    Onnx__AttributeProto **all = node ? arena_alloc(&e->a, (node->n_attribute + 1) * sizeof *all) : NULL;
    if (!a || !all) {
        e->a.failed = true;
        return NULL;
    }
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    if (node->n_attribute)
        memcpy(all, node->attribute, node->n_attribute * sizeof *all);
    all[node->n_attribute++] = a;
    node->attribute = all;
    return a;
}

static void attr_int(exporter *e, Onnx__NodeProto *node, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = add_attr(e, node, name);
    if (!a)
        return;
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = true;
    a->i = v;
}

static void attr_ints(exporter *e, Onnx__NodeProto *node, const char *name, const int64_t *v, int n)
{
    Onnx__AttributeProto *a = add_attr(e, node, name);
    int64_t *ints = a ? arena_alloc(&e->a, (size_t)(n ? n : 1) * sizeof *ints) : NULL;
    if (!ints)
        return;
    memcpy(ints, v, (size_t)n * sizeof *ints);
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->ints = ints;
    a->n_ints = (size_t)n;
}

/* An initializer holding t (which the exporter then owns), named name. */
static const char *add_initializer(exporter *e, kiln_tensor *t, const char *name)
{
    Onnx__TensorProto *tp = arena_alloc(&e->a, sizeof *tp);
    if (!t || !tp || !name) {
        kiln_release(t);
        e->a.failed = true;
        return NULL;
    }
    list_add(&e->a, &e->owned, t);
    if (e->a.failed) {
        kiln_release(t);
        return NULL;
    }
    if (onnx_tensor_from_kiln(export_fn, tp, t, (char *)name) < 0) {
        e->a.failed = true;
        return NULL;
    }
    /* the arena frees what onnx_tensor_from_kiln allocated */
    void *dims = tp->dims, *raw = tp->raw_data.data;
    tp->dims = arena_alloc(&e->a, (tp->n_dims ? tp->n_dims : 1) * sizeof *tp->dims);
    tp->raw_data.data = arena_alloc(&e->a, tp->raw_data.len);
    if (tp->dims)
        memcpy(tp->dims, dims, tp->n_dims * sizeof *tp->dims);
    if (tp->raw_data.data)
        memcpy(tp->raw_data.data, raw, tp->raw_data.len);
    free(dims);
    free(raw);
    list_add(&e->a, &e->initializers, tp);
    return name;
}

static const char *ints_initializer(exporter *e, const int64_t *v, int n)
{
    int64_t len = n;
    return add_initializer(e, kiln_from_data(KILN_I64, 1, &len, v), fresh_name(e));
}

/* Graph node r's value as dtype dt: its name, or a Cast of it. */
static const char *value_as(exporter *e, ir_ref r, kiln_dtype dt)
{
    if (e->g->nodes[r].dtype == dt)
        return e->names[r];
    const char *out = fresh_name(e);
    attr_int(e, add_node(e, "Cast", 1, (const char *[]){e->names[r]}, out), "to", onnx_type_of(dt));
    return out;
}

/* -- One graph node --------------------------------------------------------------- */

static const struct {
    ir_op op;
    const char *onnx;
} direct_ops[] = {
    {OP_ADD, "Add"}, {OP_SUB, "Sub"}, {OP_MUL, "Mul"}, {OP_DIV, "Div"}, {OP_POW, "Pow"},
    {OP_MAXIMUM, "Max"}, {OP_MINIMUM, "Min"}, {OP_EQ, "Equal"}, {OP_NE, "Equal"}, {OP_LT, "Less"}, {OP_LE, "LessOrEqual"},
    {OP_GT, "Greater"}, {OP_GE, "GreaterOrEqual"}, {OP_WHERE, "Where"}, {OP_NEG, "Neg"}, {OP_ABS, "Abs"},
    {OP_EXP, "Exp"}, {OP_LOG, "Log"}, {OP_SQRT, "Sqrt"}, {OP_TANH, "Tanh"}, {OP_SIGMOID, "Sigmoid"},
    {OP_RELU, "Relu"}, {OP_SIN, "Sin"}, {OP_COS, "Cos"}, {OP_ERF, "Erf"}, {OP_CONTIGUOUS, "Identity"},
    {OP_MATMUL, "MatMul"}, {OP_CONCAT, "Concat"}, {OP_SUM, "ReduceSum"}, {OP_MEAN, "ReduceMean"},
    {OP_MAX, "ReduceMax"}, {OP_MIN, "ReduceMin"}, {OP_ARGMAX, "ArgMax"}, {OP_FLOOR, "Floor"}, {OP_CEIL, "Ceil"},
    {OP_ROUND, "Round"}, {OP_TAN, "Tan"}, {OP_ATAN, "Atan"}, {OP_PROD, "ReduceProd"}, {OP_ARGMIN, "ArgMin"},
};

static const char *direct_name(ir_op op)
{
    for (size_t i = 0; i < sizeof direct_ops / sizeof *direct_ops; i++)
        if (direct_ops[i].op == op)
            return direct_ops[i].onnx;
    return NULL;
}

static ir_rank_class rank_class(const ir_node *n)
{
    return n->op == OP_CONST && n->params.scalar ? IR_SCALAR : n->ndim == 0 ? IR_ZERO_DIM : IR_DIMS;
}

/* The dtype an elementwise or matmul node computes in (its operands are
 * converted to it): the promoted one for comparisons, else its result's. */
static kiln_dtype compute_dtype(const ir_graph *g, const ir_node *n)
{
    const ir_ref *ops = ir_operands(g, n);
    /* max, min, argmax and argmin reduce in their operand's dtype */
    bool keeps = ir_ops[n->op].kind == KIND_REDUCTION && ir_ops[n->op].rule != RULE_SUM &&
                 ir_ops[n->op].rule != RULE_MEAN;
    if (ir_ops[n->op].rule != RULE_COMPARE)
        return keeps ? g->nodes[ops[0]].dtype : n->dtype;
    const ir_node *a = &g->nodes[ops[0]], *b = &g->nodes[ops[1]];
    return ir_promote(a->dtype, rank_class(a), b->dtype, rank_class(b));
}

static int fail_node(const exporter *e, ir_ref r, const char *why)
{
    return core_fail(CORE_UNSUPPORTED, export_fn, "node %u (%s) of the optimised graph: %s", r,
                     ir_ops[e->g->nodes[r].op].name, why);
}

static const char *reduction(exporter *e, ir_ref r, const char *x, const char *op)
{
    const ir_node *n = &e->g->nodes[r];
    const char *out = e->names[r];
    int64_t axis = n->params.axis;
    if (n->op == OP_ARGMAX || n->op == OP_ARGMIN) {
        if (axis != KILN_ALL) {
            Onnx__NodeProto *node = add_node(e, op, 1, &x, out);
            attr_int(e, node, "axis", axis);
            attr_int(e, node, "keepdims", n->params.keepdim);
            return out;
        }
        int64_t flat = -1, shape[KILN_MAX_DIMS];
        const char *flat_x = fresh_name(e), *index = fresh_name(e);
        add_node(e, "Reshape", 2, (const char *[]){x, ints_initializer(e, &flat, 1)}, flat_x);
        attr_int(e, add_node(e, op, 1, &flat_x, index), "keepdims", 0);
        for (int d = 0; d < n->ndim; d++)
            shape[d] = n->shape[d];
        add_node(e, "Reshape", 2, (const char *[]){index, ints_initializer(e, shape, n->ndim)}, out);
        return out;
    }
    Onnx__NodeProto *node;
    if (axis == KILN_ALL)
        node = add_node(e, op, 1, &x, out);
    else if (n->op == OP_SUM)
        node = add_node(e, op, 2, (const char *[]){x, ints_initializer(e, &axis, 1)}, out);
    else {
        node = add_node(e, op, 1, &x, out);
        attr_ints(e, node, "axes", &axis, 1);
    }
    attr_int(e, node, "keepdims", n->params.keepdim);
    return out;
}

/* ONNX reduces numbers only: a bool operand goes through int32 (max and
 * min come back to bool; argmax and argmin give indices). */
static int bool_reduction(exporter *e, ir_ref r, const char *op)
{
    const ir_node *n = &e->g->nodes[r];
    const char *x = value_as(e, ir_operands(e->g, n)[0], KILN_I32);
    if (n->op == OP_ARGMAX || n->op == OP_ARGMIN)
        return reduction(e, r, x, op) ? 0 : -CORE_NOMEM;
    char *bool_name = e->names[r];
    e->names[r] = fresh_name(e);
    const char *reduced = reduction(e, r, x, op);
    attr_int(e, add_node(e, "Cast", 1, &reduced, bool_name), "to", onnx_type_of(KILN_BOOL));
    e->names[r] = bool_name;
    return 0;
}

static int movement(exporter *e, ir_ref r)
{
    const ir_node *n = &e->g->nodes[r];
    const char *x = e->names[ir_operands(e->g, n)[0]], *out = e->names[r];
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < n->ndim; d++)
        shape[d] = n->shape[d];
    switch (n->op) {
    case OP_RESHAPE: {
        /* without allowzero a 0 in the shape means "the input's size" */
        Onnx__NodeProto *node = add_node(e, "Reshape", 2, (const char *[]){x, ints_initializer(e, shape, n->ndim)}, out);
        for (int d = 0; d < n->ndim; d++)
            if (shape[d] == 0) {
                attr_int(e, node, "allowzero", 1);
                break;
            }
        return 0;
    }
    case OP_EXPAND:
        add_node(e, "Expand", 2, (const char *[]){x, ints_initializer(e, shape, n->ndim)}, out);
        return 0;
    case OP_PERMUTE: {
        int64_t perm[KILN_MAX_DIMS];
        for (int d = 0; d < n->ndim; d++)
            perm[d] = n->params.perm[d];
        attr_ints(e, add_node(e, "Transpose", 1, &x, out), "perm", perm, n->ndim);
        return 0;
    }
    case OP_SLICE: {
        int64_t axis = n->params.axis, start = n->params.start, step = n->params.step;
        /* one past the last element taken: start + step * size overflows for
         * huge steps (a slice of one element may have any) */
        int64_t end = n->shape[axis] ? start + step * (n->shape[axis] - 1) + (step > 0 ? 1 : -1) : start;
        /* ONNX reads a negative end as counting from the back: past the front is INT64_MIN */
        if (end < 0)
            end = INT64_MIN;
        add_node(e, "Slice", 5, (const char *[]){x, ints_initializer(e, &start, 1), ints_initializer(e, &end, 1),
                                                 ints_initializer(e, &axis, 1), ints_initializer(e, &step, 1)},
                 out);
        return 0;
    }
    default:
        return fail_node(e, r, "has no ONNX form yet");
    }
}

/* Python's %: ONNX's Mod of integers; floats take fmod (the dividend's
 * sign), moved by the divisor where the signs differ. */
static int python_remainder(exporter *e, ir_ref r)
{
    const ir_node *n = &e->g->nodes[r];
    const ir_ref *ops = ir_operands(e->g, n);
    const char *a = value_as(e, ops[0], n->dtype), *b = value_as(e, ops[1], n->dtype);
    bool is_float = ir_dtype_is_float(n->dtype);
    const char *mod = is_float ? fresh_name(e) : e->names[r];
    attr_int(e, add_node(e, "Mod", 2, (const char *[]){a, b}, mod), "fmod", is_float);
    if (!is_float)
        return 0;
    const char *zero = add_initializer(e, kiln_full(n->dtype, 0, NULL, 0), fresh_name(e));
    const char *r_neg = fresh_name(e), *b_neg = fresh_name(e), *differ = fresh_name(e), *nonzero = fresh_name(e);
    const char *r_zero = fresh_name(e), *move = fresh_name(e), *moved = fresh_name(e);
    add_node(e, "Less", 2, (const char *[]){mod, zero}, r_neg);
    add_node(e, "Less", 2, (const char *[]){b, zero}, b_neg);
    add_node(e, "Xor", 2, (const char *[]){r_neg, b_neg}, differ);
    add_node(e, "Equal", 2, (const char *[]){mod, zero}, r_zero);
    add_node(e, "Not", 1, &r_zero, nonzero);
    add_node(e, "And", 2, (const char *[]){differ, nonzero}, move);
    add_node(e, "Add", 2, (const char *[]){mod, b}, moved);
    add_node(e, "Where", 3, (const char *[]){move, moved, mod}, e->names[r]);
    return 0;
}

/* Ops along an axis: Gather (index_select), GatherElements (gather), CumSum. */
static int along_axis(exporter *e, ir_ref r)
{
    const ir_node *n = &e->g->nodes[r];
    const ir_ref *ops = ir_operands(e->g, n);
    int64_t axis = n->params.axis;
    Onnx__NodeProto *node;
    if (n->op == OP_CUMSUM) {
        const char *in[2] = {value_as(e, ops[0], n->dtype), ints_initializer(e, &axis, 1)};
        add_node(e, "CumSum", 2, in, e->names[r]);
        return 0;
    }
    const char *in[2] = {e->names[ops[0]], e->names[ops[1]]};
    node = add_node(e, n->op == OP_GATHER ? "GatherElements" : "Gather", 2, in, e->names[r]);
    attr_int(e, node, "axis", axis);
    return 0;
}

/* A convolution: ONNX's Conv with the node's window (pads begin, then end). */
static int conv(exporter *e, ir_ref r)
{
    const ir_node *n = &e->g->nodes[r];
    const ir_ref *ops = ir_operands(e->g, n);
    const int32_t *p = n->params.perm;
    Onnx__NodeProto *node = add_node(e, "Conv", 2, (const char *[]){e->names[ops[0]], e->names[ops[1]]}, e->names[r]);
    int64_t strides[2] = {p[IR_CONV_STRIDE], p[IR_CONV_STRIDE + 1]};
    int64_t dilations[2] = {p[IR_CONV_DILATION], p[IR_CONV_DILATION + 1]};
    int64_t pads[4] = {p[IR_CONV_PADDING], p[IR_CONV_PADDING + 1], p[IR_CONV_PADDING], p[IR_CONV_PADDING + 1]};
    attr_ints(e, node, "strides", strides, 2);
    attr_ints(e, node, "dilations", dilations, 2);
    attr_ints(e, node, "pads", pads, 4);
    attr_int(e, node, "group", p[IR_CONV_GROUPS]);
    return 0;
}

static int export_node(exporter *e, ir_ref r)
{
    const ir_graph *g = e->g;
    const ir_node *n = &g->nodes[r];
    const ir_ref *ops = ir_operands(g, n);
    switch (n->op) {
    case OP_INPUT:
        e->names[r] = (char *)kiln_fn_io_name(e->f, false, (int)n->params.index);
        return e->names[r] ? 0 : core_error_status();
    case OP_CAPTURE:
        e->names[r] = arena_printf(&e->a, "capture_%lld", (long long)n->params.index);
        return add_initializer(e, kiln_contiguous(e->captures[n->params.index]), e->names[r]) ? 0 : -CORE_NOMEM;
    case OP_CONST:
        e->names[r] = fresh_name(e);
        return add_initializer(e, kiln_full(n->dtype, 0, NULL, n->params.value), e->names[r]) ? 0 : -CORE_NOMEM;
    case OP_RAND:
    case OP_RANDN:
        return fail_node(e, r, "random values have no ONNX form that draws kiln's");
    case OP_ASSIGN:
        return fail_node(e, r, "an ONNX model cannot write into its initializers");
    case OP_CAST:
        e->names[r] = fresh_name(e);
        attr_int(e, add_node(e, "Cast", 1, (const char *[]){e->names[ops[0]]}, e->names[r]), "to",
                 onnx_type_of(n->dtype));
        return 0;
    case OP_RSQRT: {
        e->names[r] = fresh_name(e);
        const char *root = fresh_name(e);
        add_node(e, "Sqrt", 1, (const char *[]){value_as(e, ops[0], n->dtype)}, root);
        add_node(e, "Reciprocal", 1, &root, e->names[r]);
        return 0;
    }
    case OP_RESHAPE:
    case OP_EXPAND:
    case OP_PERMUTE:
    case OP_SLICE:
        e->names[r] = fresh_name(e);
        return movement(e, r);
    case OP_REMAINDER:
        e->names[r] = fresh_name(e);
        return python_remainder(e, r);
    case OP_GATHER:
    case OP_INDEX_SELECT:
    case OP_CUMSUM:
        e->names[r] = fresh_name(e);
        return along_axis(e, r);
    case OP_CONV2D:
        e->names[r] = fresh_name(e);
        return conv(e, r);
    default:
        break;
    }
    const char *op = direct_name(n->op);
    if (!op)
        return fail_node(e, r, "has no ONNX form yet");
    e->names[r] = fresh_name(e);
    kiln_dtype dt = compute_dtype(g, n);
    bool boolean = dt == KILN_BOOL && (n->op == OP_ADD || n->op == OP_MUL);
    bool negate = n->op == OP_NE;
    if (boolean)
        op = n->op == OP_ADD ? "Or" : "And";
    /* rounding an integer keeps it: ONNX rounds floats only */
    if ((n->op == OP_FLOOR || n->op == OP_CEIL || n->op == OP_ROUND) && !ir_dtype_is_float(dt))
        op = "Identity";
    if (ir_ops[n->op].kind == KIND_REDUCTION && dt == KILN_BOOL)
        return bool_reduction(e, r, op);
    if (ir_ops[n->op].kind == KIND_REDUCTION)
        return reduction(e, r, value_as(e, ops[0], dt), op) ? 0 : -CORE_NOMEM;
    /* ONNX orders and takes the maximum of numbers only: bools go through int32 */
    if (dt == KILN_BOOL && (n->op == OP_MAXIMUM || n->op == OP_MINIMUM))
        op = n->op == OP_MAXIMUM ? "Or" : "And";
    if (dt == KILN_BOOL && ir_ops[n->op].rule == RULE_COMPARE && n->op != OP_EQ && n->op != OP_NE)
        dt = KILN_I32;
    const char *in[ONNX_MAX_OPERANDS];
    int n_in = (int)n->n_operands;
    if (n_in > ONNX_MAX_OPERANDS)
        return fail_node(e, r, "has more operands than the exporter takes");
    for (int i = 0; i < n_in; i++)
        in[i] = n->op == OP_WHERE && i == 0 ? e->names[ops[0]] : value_as(e, ops[i], dt);
    const char *out = negate ? fresh_name(e) : e->names[r];
    Onnx__NodeProto *node = add_node(e, negate ? "Equal" : op, n_in, in, out);
    if (n->op == OP_CONCAT)
        attr_int(e, node, "axis", n->params.axis);
    if (negate)
        add_node(e, "Not", 1, &out, e->names[r]);
    return 0;
}

/* -- The model ----------------------------------------------------------------------- */

static Onnx__ValueInfoProto *value_info(exporter *e, const char *name, kiln_dtype dtype, int ndim, const int64_t *sizes)
{
    Onnx__ValueInfoProto *v = arena_alloc(&e->a, sizeof *v);
    Onnx__TypeProto *type = arena_alloc(&e->a, sizeof *type);
    Onnx__TypeProto__Tensor *tensor = arena_alloc(&e->a, sizeof *tensor);
    Onnx__TensorShapeProto *shape = arena_alloc(&e->a, sizeof *shape);
    Onnx__TensorShapeProto__Dimension **dims = arena_alloc(&e->a, (size_t)(ndim ? ndim : 1) * sizeof *dims);
    if (!v || !type || !tensor || !shape || !dims)
        return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(type);
    onnx__type_proto__tensor__init(tensor);
    onnx__tensor_shape_proto__init(shape);
    for (int d = 0; d < ndim; d++) {
        if (!(dims[d] = arena_alloc(&e->a, sizeof *dims[d])))
            return NULL;
        onnx__tensor_shape_proto__dimension__init(dims[d]);
        dims[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        dims[d]->dim_value = sizes[d];
    }
    shape->dim = dims;
    shape->n_dim = (size_t)ndim;
    tensor->has_elem_type = true;
    tensor->elem_type = onnx_type_of(dtype);
    tensor->shape = shape;
    type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    type->tensor_type = tensor;
    v->type = type;
    v->name = (char *)name;
    return v;
}

static int check_graph(const ir_graph *g, const char *fn_name)
{
    if (g->n_writebacks)
        return core_fail(CORE_UNSUPPORTED, export_fn, "'%s' writes back into captured tensors; an ONNX model cannot",
                         fn_name);
    for (ir_ref r = 0; r < g->count; r++)
        if (ir_shape_symbolic(g->nodes[r].ndim, g->nodes[r].shape))
            return core_fail(CORE_UNSUPPORTED, export_fn, "'%s' traced with symbolic sizes; export a spec of fixed "
                             "sizes", fn_name);
    return 0;
}

static int write_model(exporter *e, const kiln_spec *in, const char *path)
{
    const ir_graph *g = e->g;
    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};
    list inputs = {0}, outputs = {0};
    int n_in;
    kiln_fn_arity(e->f, &n_in, NULL);
    for (int i = 0; i < n_in; i++)
        list_add(&e->a, &inputs, value_info(e, kiln_fn_io_name(e->f, false, i), in[i].dtype, in[i].ndim, in[i].shape));
    for (int i = 0; i < g->n_outputs; i++) {
        /* an Identity per output: the names are the function's, even for an input or a capture */
        const char *out = kiln_fn_io_name(e->f, true, i);
        if (!out)
            return core_error_status();
        add_node(e, "Identity", 1, (const char *[]){e->names[g->outputs[i]]}, out);
        const ir_node *n = &g->nodes[g->outputs[i]];
        list_add(&e->a, &outputs, value_info(e, out, n->dtype, n->ndim, n->shape));
    }
    if (e->a.failed)
        return core_fail_status(CORE_NOMEM, export_fn);
    opset.has_version = true;
    opset.version = OPSET;
    opset.domain = "";
    model.has_ir_version = true;
    model.ir_version = IR_VERSION;
    model.producer_name = "kiln";
    model.producer_version = (char *)kiln_version();
    model.opset_import = opsets;
    model.n_opset_import = 1;
    model.graph = &graph;
    graph.name = (char *)jit_name(e->f);
    graph.node = (Onnx__NodeProto **)e->nodes.items;
    graph.n_node = e->nodes.n;
    graph.initializer = (Onnx__TensorProto **)e->initializers.items;
    graph.n_initializer = e->initializers.n;
    graph.input = (Onnx__ValueInfoProto **)inputs.items;
    graph.n_input = inputs.n;
    graph.output = (Onnx__ValueInfoProto **)outputs.items;
    graph.n_output = outputs.n;
    size_t size = onnx__model_proto__get_packed_size(&model);
    uint8_t *bytes = malloc(size ? size : 1);
    if (!bytes)
        return core_fail_status(CORE_NOMEM, export_fn);
    onnx__model_proto__pack(&model, bytes);
    int rc = core_write_file(path, bytes, size, 0644);
    free(bytes);
    if (rc < 0)
        return core_fail(CORE_IO, export_fn, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

int kiln_onnx_export(kiln_fn *f, const kiln_spec *in, const char *path)
{
    int n_in = 0;
    if (!f || !path)
        return core_fail_null(export_fn, !f ? "f" : "path");
    kiln_fn_arity(f, &n_in, NULL);
    if (!in && n_in)
        return core_fail_null(export_fn, "in");
    if (jit_check_specs(export_fn, f, in) < 0 || core_check_writable(export_fn, path) < 0)
        return core_error_status();
    for (int i = 0; i < n_in; i++)
        if (in[i].dynamic)
            return core_fail(CORE_UNSUPPORTED, export_fn, "spec %d marks axes dynamic; export a spec of fixed sizes",
                             i);
    ir_graph *g = NULL;
    kiln_tensor **captures = NULL;
    int n_captures = 0;
    int status = jit_trace_graph(f, in, &g, &captures, &n_captures);
    exporter e = {.g = g, .captures = captures, .f = f};
    if (status == 0)
        status = check_graph(g, jit_name(f));
    if (status == 0 && !(e.names = calloc(g->count + 1, sizeof *e.names)))
        status = core_fail_status(CORE_NOMEM, export_fn);
    for (ir_ref r = 0; status == 0 && g && r < g->count; r++)
        if ((status = export_node(&e, r)) == 0 && e.a.failed)
            status = core_fail_status(CORE_NOMEM, export_fn);
    if (status == 0)
        status = write_model(&e, in, path);
    for (size_t i = 0; i < e.owned.n; i++)
        kiln_release(e.owned.items[i]);
    free(e.names);
    arena_free(&e.a);
    ir_graph_free(g);
    for (int i = 0; i < n_captures; i++)
        eager_unhold(captures[i]);
    free(captures);
    return status < 0 ? status : 0;
}
