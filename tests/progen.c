/* progen: seeded random kiln programs (see progen.h).
 *
 * Generation keeps a model of every value (dtype, shape, and for integers
 * whether it is known not to be negative) and asks, op by op, which operands
 * fit: the rules below restate kiln.h's (promotion, dtype refusals, broadcast,
 * slice clamping, matmul shapes) independently of kiln's own code, so that a
 * disagreement shows up when progen_run compares what it predicted with what
 * it got. */
#include "progen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(PROGEN_OP_COUNT < 128, "progen_options.ops is a 128-bit mask");

enum {
    MAX_RANK = 6,       /* values stay well inside KILN_MAX_DIMS */
    MAX_CONCAT = 3,
    ATTEMPTS = 2000,    /* tries to find one more instruction before giving up */
};

typedef struct {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    bool nonneg; /* an integer value known to be >= 0 (bools always are) */
    int base;    /* the created value this tensor is (same object), or -1 */
} vtype;

typedef struct {
    progen_op op;
    int a, b, c;                 /* operand values; -1 when unused (layer_norm: NULL) */
    int n_list, list[MAX_CONCAT];/* concat's operands */
    int axis, axis2;             /* reductions, softmax, slice, concat, (un)squeeze, transpose;
                                    axis2: tril or triu's diagonal */
    int which;                   /* topk, sort: values (0) or indices (1); split: the piece */
    int64_t k;                   /* topk's k, var's and std's correction, split's size, pad's mode */
    bool keepdim;
    int64_t start, stop, step;   /* slice */
    double x, y, z;              /* scalar operand, fill value, arange start/stop/step, eps */
    kiln_dtype dtype;            /* cast and creation */
    int ndim;                    /* reshape and expand requests, creation shapes, repeat and pad counts */
    int64_t shape[KILN_MAX_DIMS];
    int perm[KILN_MAX_DIMS];
    uint64_t seed;               /* rand, randn, from_data */
    bool nonneg;                 /* from_data: integers drawn >= 0 */
} instr;

struct progen_program {
    uint64_t seed;
    int n_inputs, n_instrs, n_outputs;
    vtype *types; /* n_inputs + n_instrs values */
    instr *instrs;
    int outputs[PROGEN_MAX_OUTPUTS];
};

static const char *const op_names[PROGEN_OP_COUNT] = {
#define PROGEN_NAME(N, n) [PROGEN_##N] = "kiln_" #n,
    PROGEN_OPS(PROGEN_NAME)
#undef PROGEN_NAME
};

/* -- Random numbers -------------------------------------------------------- */

typedef struct {
    uint64_t state;
} rng;

/* splitmix64: tiny, and the same sequence everywhere. */
static uint64_t next_u64(rng *r)
{
    uint64_t z = (r->state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0. */
static int64_t below(rng *r, int64_t n)
{
    return (int64_t)(next_u64(r) % (uint64_t)n);
}

/* Uniform in [lo, hi]. */
static int64_t between(rng *r, int64_t lo, int64_t hi)
{
    return lo + below(r, hi - lo + 1);
}

static bool chance(rng *r, int num, int den)
{
    return below(r, den) < num;
}

#define PICK(r, array) ((array)[below((r), (int64_t)(sizeof(array) / sizeof *(array)))])

/* -- The model: kiln.h's rules restated ------------------------------------ */

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64;
}

static bool is_int(kiln_dtype dt)
{
    return dt == KILN_I32 || dt == KILN_I64;
}

static int category(kiln_dtype dt)
{
    return dt == KILN_BOOL ? 0 : is_float(dt) ? 2 : 1;
}

/* bool < i32 < i64 < f32 < f64 */
static int rank_of(kiln_dtype dt)
{
    static const int ranks[] = {[KILN_BOOL] = 0, [KILN_I32] = 1, [KILN_I64] = 2, [KILN_F32] = 3,
                                [KILN_F64] = 4};
    return ranks[dt];
}

static kiln_dtype higher(kiln_dtype a, kiln_dtype b)
{
    return rank_of(a) >= rank_of(b) ? a : b;
}

/* PyTorch's promotion: a 0-d operand beside a dimensioned one counts only
 * when it raises the category. */
static kiln_dtype promote(kiln_dtype a, bool a_0d, kiln_dtype b, bool b_0d)
{
    if (a_0d != b_0d) {
        kiln_dtype dim = a_0d ? b : a, zero = a_0d ? a : b;
        return category(zero) > category(dim) ? zero : dim;
    }
    return higher(a, b);
}

static kiln_dtype float_of(kiln_dtype dt)
{
    return is_float(dt) ? dt : KILN_F32;
}

/* A whole number acts as a Python int; -0.0 is only ever a Python float. */
static bool whole(double v)
{
    return v == floor(v) && fabs(v) < 0x1p62 && !(v == 0 && signbit(v));
}

/* The dtype a *_scalar op gives: floats keep theirs; integers keep theirs
 * with a whole number and become f32 otherwise; bools become i64 with a whole
 * number (and f32 otherwise). Whatever a's rank, as Python numbers do. */
static kiln_dtype scalar_result(kiln_dtype a, double s)
{
    if (is_float(a))
        return a;
    if (!whole(s))
        return KILN_F32;
    return a == KILN_BOOL ? KILN_I64 : a;
}

static bool nonneg(const vtype *t)
{
    return t->dtype == KILN_BOOL || (is_int(t->dtype) && t->nonneg);
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* numpy broadcasting of a and b into out's shape. */
static bool broadcast(const vtype *a, const vtype *b, vtype *out)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return false;
        out->shape[d] = sa == 1 ? sb : sa;
    }
    out->ndim = nd;
    return true;
}

/* Python's slice clamping; the length of a[start:stop:step] on an axis of n. */
static int64_t slice_length(int64_t n, int64_t start, int64_t stop, int64_t step)
{
    int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? n - 1 : n;
    if (start < 0)
        start = start < -n ? lower : start + n;
    else if (start > upper)
        start = upper;
    if (stop < 0)
        stop = stop < -n ? lower : stop + n;
    else if (stop > upper)
        stop = upper;
    if (step > 0)
        return start < stop ? (stop - start - 1) / step + 1 : 0;
    return stop < start ? (start - stop - 1) / -step + 1 : 0;
}

/* numpy.matmul's shapes; false when they do not fit. */
static bool matmul_shape(const vtype *a, const vtype *b, vtype *out)
{
    if (a->ndim == 0 || b->ndim == 0)
        return false;
    int64_t m = a->ndim > 1 ? a->shape[a->ndim - 2] : 1, k = a->shape[a->ndim - 1];
    int64_t kb = b->ndim > 1 ? b->shape[b->ndim - 2] : b->shape[0];
    int64_t n = b->ndim > 1 ? b->shape[b->ndim - 1] : 1;
    if (k != kb)
        return false;
    vtype ba = {.ndim = a->ndim > 2 ? a->ndim - 2 : 0}, bb = {.ndim = b->ndim > 2 ? b->ndim - 2 : 0};
    memcpy(ba.shape, a->shape, (size_t)ba.ndim * sizeof *ba.shape);
    memcpy(bb.shape, b->shape, (size_t)bb.ndim * sizeof *bb.shape);
    if (!broadcast(&ba, &bb, out))
        return false;
    if (a->ndim > 1)
        out->shape[out->ndim++] = m;
    if (b->ndim > 1)
        out->shape[out->ndim++] = n;
    return out->ndim <= KILN_MAX_DIMS;
}

/* -- Generation ------------------------------------------------------------ */

typedef struct {
    rng r;
    progen_program *p;
    progen_options o;
    int target; /* instructions this program gets */
    int *cand;  /* scratch: candidate values */
    /* Per created value: what kiln_assign must know (see progen.h). */
    bool *read, *viewed, *assigned;
} gen;

/* How often each op is tried, relative to the others. */
static const unsigned char weights[PROGEN_OP_COUNT] = {
    [PROGEN_ADD] = 3, [PROGEN_SUB] = 3, [PROGEN_MUL] = 3, [PROGEN_DIV] = 3, [PROGEN_POW] = 2,
    [PROGEN_MAXIMUM] = 2, [PROGEN_MINIMUM] = 2,
    [PROGEN_ADD_SCALAR] = 2, [PROGEN_SUB_SCALAR] = 2, [PROGEN_MUL_SCALAR] = 2,
    [PROGEN_DIV_SCALAR] = 2, [PROGEN_POW_SCALAR] = 2, [PROGEN_MAXIMUM_SCALAR] = 1,
    [PROGEN_MINIMUM_SCALAR] = 1,
    [PROGEN_EQ] = 1, [PROGEN_NE] = 1, [PROGEN_LT] = 2, [PROGEN_LE] = 1, [PROGEN_GT] = 2,
    [PROGEN_GE] = 1, [PROGEN_WHERE] = 3,
    [PROGEN_NEG] = 1, [PROGEN_ABS] = 1, [PROGEN_EXP] = 1, [PROGEN_LOG] = 1, [PROGEN_SQRT] = 1,
    [PROGEN_RSQRT] = 1, [PROGEN_TANH] = 1, [PROGEN_SIGMOID] = 1, [PROGEN_RELU] = 1,
    [PROGEN_SIN] = 1, [PROGEN_COS] = 1, [PROGEN_ERF] = 1, [PROGEN_CAST] = 3,
    [PROGEN_SUM] = 2, [PROGEN_MEAN] = 2, [PROGEN_MAX] = 2, [PROGEN_MIN] = 2, [PROGEN_ARGMAX] = 2,
    [PROGEN_RESHAPE] = 3, [PROGEN_PERMUTE] = 2, [PROGEN_TRANSPOSE] = 2, [PROGEN_EXPAND] = 3,
    [PROGEN_SLICE] = 3, [PROGEN_CONCAT] = 3, [PROGEN_SQUEEZE] = 2, [PROGEN_UNSQUEEZE] = 2,
    [PROGEN_CONTIGUOUS] = 1,
    [PROGEN_MATMUL] = 4,
    [PROGEN_SOFTMAX] = 2, [PROGEN_LOG_SOFTMAX] = 2, [PROGEN_LAYER_NORM] = 2, [PROGEN_GELU] = 2,
    [PROGEN_SILU] = 2,
    [PROGEN_FULL] = 1, [PROGEN_ZEROS] = 1, [PROGEN_ONES] = 1, [PROGEN_ARANGE] = 1,
    [PROGEN_RAND] = 1, [PROGEN_RANDN] = 1, [PROGEN_SCALAR] = 1, [PROGEN_FROM_DATA] = 1,
    [PROGEN_ASSIGN] = 3,
    [PROGEN_FLOOR] = 1, [PROGEN_CEIL] = 1, [PROGEN_ROUND] = 1, [PROGEN_TRUNC] = 1, [PROGEN_LOG1P] = 1,
    [PROGEN_EXPM1] = 1, [PROGEN_LOG2] = 1, [PROGEN_TAN] = 1, [PROGEN_ATAN] = 1, [PROGEN_SIGN] = 1,
    [PROGEN_RECIPROCAL] = 1, [PROGEN_ISNAN] = 1, [PROGEN_ISINF] = 1, [PROGEN_LOGICAL_NOT] = 1,
    [PROGEN_GELU_ERF] = 1, [PROGEN_SOFTPLUS] = 1, [PROGEN_REMAINDER] = 2, [PROGEN_FLOOR_DIVIDE] = 2,
    [PROGEN_ATAN2] = 1, [PROGEN_LOGICAL_AND] = 1, [PROGEN_LOGICAL_OR] = 1, [PROGEN_LOGICAL_XOR] = 1,
    [PROGEN_CLAMP] = 2, [PROGEN_PROD] = 1, [PROGEN_ARGMIN] = 1, [PROGEN_ANY] = 1, [PROGEN_ALL] = 1,
    [PROGEN_VAR] = 1, [PROGEN_STD] = 1, [PROGEN_LOGSUMEXP] = 2, [PROGEN_CUMSUM] = 1, [PROGEN_TOPK] = 1,
    [PROGEN_SORT] = 1, [PROGEN_GATHER] = 1, [PROGEN_INDEX_SELECT] = 1, [PROGEN_EMBEDDING] = 1,
    [PROGEN_SCATTER_ADD] = 1, [PROGEN_MASKED_FILL] = 2, [PROGEN_STACK] = 1, [PROGEN_SPLIT] = 1,
    [PROGEN_FLIP] = 1, [PROGEN_PAD] = 1, [PROGEN_TRIL] = 1, [PROGEN_TRIU] = 1, [PROGEN_REPEAT] = 1,
    [PROGEN_EYE] = 1, [PROGEN_LINSPACE] = 1, [PROGEN_ZEROS_LIKE] = 1, [PROGEN_ONES_LIKE] = 1,
    [PROGEN_FULL_LIKE] = 1, [PROGEN_BATCH_NORM] = 1, [PROGEN_GROUP_NORM] = 1, [PROGEN_RMS_NORM] = 1,
    [PROGEN_LAYER_NORM_AXES] = 1, [PROGEN_CROSS_ENTROPY] = 1, [PROGEN_NLL_LOSS] = 1, [PROGEN_MSE_LOSS] = 1,
    [PROGEN_DROPOUT] = 1, [PROGEN_CONV2D] = 1, [PROGEN_MAX_POOL2D] = 1, [PROGEN_AVG_POOL2D] = 1,
    [PROGEN_ADAPTIVE_AVG_POOL2D] = 1,
};

static const double scalars[] = {0, 1, -1, 2, -2, 3, 0.5, -0.5, 1.5, 0.1, -0.0, 1e-3, 100, 7, -2.25};
static const double exponents[] = {2, 0.5, -1, 3, 1, 0, -0.5, 1.5, -2, 0.25, 0, 1, 2, 3};
static const double fills[] = {0, 1, -1, 2.5, -0.0, 3, -7, 0.25, INFINITY, NAN, 1e10};
static const double eps_values[] = {1e-5, 1e-3, 0.1, 0};

static const vtype *type_of(const gen *g, int v)
{
    return &g->p->types[v];
}

static int n_values(const gen *g)
{
    return g->p->n_inputs + g->p->n_instrs;
}

/* Whether a value may join the program: an allowed dtype and a modest size. */
static bool fits(const gen *g, const vtype *t)
{
    return (g->o.dtypes & PROGEN_DTYPE_BIT(t->dtype)) && t->ndim <= MAX_RANK &&
           numel(t->ndim, t->shape) <= g->o.max_numel;
}

/* One of the first n candidates, favouring the latest so that values chain. */
static int choose(gen *g, int n)
{
    if (chance(&g->r, 1, 2))
        return g->cand[n - 1 - below(&g->r, n < 3 ? n : 3)];
    return g->cand[below(&g->r, n)];
}

/* A value of a dtype in mask (0: any) with at least min_ndim dimensions, or -1. */
static int pick(gen *g, unsigned mask, int min_ndim)
{
    int n = 0;
    for (int v = 0; v < n_values(g); v++) {
        const vtype *t = type_of(g, v);
        if ((!mask || (mask & PROGEN_DTYPE_BIT(t->dtype))) && t->ndim >= min_ndim)
            g->cand[n++] = v;
    }
    return n ? choose(g, n) : -1;
}

static const unsigned NUMBERS = PROGEN_DTYPE_BIT(KILN_F32) | PROGEN_DTYPE_BIT(KILN_F64) |
                                PROGEN_DTYPE_BIT(KILN_I32) | PROGEN_DTYPE_BIT(KILN_I64);

static kiln_dtype random_dtype(gen *g)
{
    kiln_dtype allowed[5];
    int n = 0;
    for (int dt = KILN_F32; dt <= KILN_BOOL; dt++)
        if (g->o.dtypes & PROGEN_DTYPE_BIT(dt))
            allowed[n++] = (kiln_dtype)dt;
    return allowed[below(&g->r, n)];
}

/* An axis of an n-d value, written negative now and then. */
static int random_axis(gen *g, int ndim, int resolved)
{
    return chance(&g->r, 1, 3) ? resolved - ndim : resolved;
}

static bool is_creation(progen_op op)
{
    return op >= PROGEN_FULL && op <= PROGEN_FROM_DATA;
}

/* Ops whose result may be a view of their operand (or the operand itself):
 * a created tensor they read must not be assigned afterwards. */
static bool is_view(progen_op op)
{
    switch (op) {
    case PROGEN_FLIP: case PROGEN_SPLIT: case PROGEN_REPEAT: case PROGEN_PAD: case PROGEN_SIGN:
    case PROGEN_CUMSUM: case PROGEN_DROPOUT:
        return true;
    default:
        return op >= PROGEN_RESHAPE && op <= PROGEN_UNSQUEEZE && op != PROGEN_CONCAT;
    }
}

/* The instruction's result is its operand itself: kiln_contiguous of a
 * created (contiguous) tensor, kiln_cast to the dtype it has, kiln_assign. */
static bool is_identity(const progen_program *p, const instr *ins)
{
    return ins->op == PROGEN_CONTIGUOUS || ins->op == PROGEN_ASSIGN ||
           (ins->op == PROGEN_CAST && p->types[ins->a].dtype == ins->dtype);
}

/* Records how ins uses created values, and what an assignment changes. */
static void note_uses(gen *g, const instr *ins, vtype *t)
{
    progen_program *p = g->p;
    int self = p->n_inputs + p->n_instrs;
    /* Traced random values are values of the trace, not storage to assign. */
    bool owns_storage = is_creation(ins->op) && ins->op != PROGEN_RAND && ins->op != PROGEN_RANDN;
    t->base = owns_storage ? self : is_identity(p, ins) ? p->types[ins->a].base : -1;
    if (ins->op == PROGEN_ASSIGN) {
        int b = t->base;
        g->assigned[b] = true;
        for (int v = 0; v < self; v++) /* every name of the tensor sees the new values */
            if (p->types[v].base == b)
                p->types[v].nonneg = t->nonneg;
    }
    int ops[MAX_CONCAT + 3], n = 0;
    if (ins->op == PROGEN_CONCAT || ins->op == PROGEN_STACK)
        for (int i = 0; i < ins->n_list; i++)
            ops[n++] = ins->list[i];
    else
        for (int i = 0, abc[3] = {ins->a, ins->b, ins->c}; i < 3; i++)
            if (abc[i] >= 0)
                ops[n++] = abc[i];
    for (int i = 0; i < n; i++) {
        int b = p->types[ops[i]].base;
        if (b < 0 || (i == 0 && is_identity(p, ins)))
            continue;
        g->read[b] |= !g->assigned[b];
        g->viewed[b] |= is_view(ins->op);
    }
}

static void append(gen *g, const instr *ins, const vtype *t)
{
    progen_program *p = g->p;
    vtype typed = *t;
    note_uses(g, ins, &typed);
    p->instrs[p->n_instrs] = *ins;
    p->types[p->n_inputs + p->n_instrs] = typed;
    p->n_instrs++;
}

static instr blank(progen_op op)
{
    return (instr){.op = op, .a = -1, .b = -1, .c = -1};
}

/* -- Elementwise ----------------------------------------------------------- */

static bool binary_result(progen_op op, const vtype *a, const vtype *b, vtype *out)
{
    if (!broadcast(a, b, out))
        return false;
    kiln_dtype p = promote(a->dtype, a->ndim == 0, b->dtype, b->ndim == 0);
    out->dtype = p;
    out->nonneg = false;
    switch (op) {
    case PROGEN_ADD:
    case PROGEN_MUL:
        return true;
    case PROGEN_SUB:
        return p != KILN_BOOL;
    case PROGEN_POW: /* integer powers only with exponents known not to be negative */
        return p != KILN_BOOL && (is_float(p) || nonneg(b));
    case PROGEN_DIV:
    case PROGEN_ATAN2:
        out->dtype = float_of(p);
        return true;
    case PROGEN_REMAINDER: /* the divisor's sign (0 for a divisor of 0) */
        out->nonneg = nonneg(b);
        return p != KILN_BOOL;
    case PROGEN_FLOOR_DIVIDE:
        return p != KILN_BOOL;
    case PROGEN_MAXIMUM:
        out->nonneg = nonneg(a) || nonneg(b);
        return true;
    case PROGEN_MINIMUM:
        out->nonneg = nonneg(a) && nonneg(b);
        return true;
    default: /* comparisons */
        out->dtype = KILN_BOOL;
        return true;
    }
}

static bool gen_binary(gen *g, instr *ins, vtype *out)
{
    int a = pick(g, 0, 0);
    if (chance(&g->r, 1, 6) && binary_result(ins->op, type_of(g, a), type_of(g, a), out) &&
        fits(g, out)) {
        ins->a = ins->b = a; /* x op x: what simplification rewrites */
        return true;
    }
    int n = 0;
    vtype t;
    for (int v = 0; v < n_values(g); v++)
        if (binary_result(ins->op, type_of(g, a), type_of(g, v), &t) && fits(g, &t))
            g->cand[n++] = v;
    if (n == 0)
        return false;
    int b = choose(g, n);
    if (chance(&g->r, 1, 2) && binary_result(ins->op, type_of(g, b), type_of(g, a), &t) &&
        fits(g, &t)) {
        int swap = a;
        a = b;
        b = swap;
    }
    ins->a = a;
    ins->b = b;
    return binary_result(ins->op, type_of(g, a), type_of(g, b), out);
}

/* -- Compositions that src/ir/rewrite.c rewrites ------------------------- */

/* The instruction that made value v, or NULL for an input. */
static const instr *made_by(const gen *g, int v)
{
    return v < g->p->n_inputs ? NULL : &g->p->instrs[v - g->p->n_inputs];
}

static bool made_by_op(const gen *g, int v, progen_op op)
{
    return made_by(g, v) && made_by(g, v)->op == op;
}

/* Whether op of v is a composition the rewrites know: exp(x) + 1, log of
 * exp, sigmoid or exp(x) + 1, tanh and exp of log. */
static bool composes(const gen *g, progen_op op, int v)
{
    switch (op) {
    case PROGEN_ADD_SCALAR: return made_by_op(g, v, PROGEN_EXP);
    case PROGEN_LOG:
        return made_by_op(g, v, PROGEN_EXP) || made_by_op(g, v, PROGEN_SIGMOID) ||
               (made_by_op(g, v, PROGEN_ADD_SCALAR) && made_by(g, v)->x == 1 &&
                made_by_op(g, made_by(g, v)->a, PROGEN_EXP));
    case PROGEN_TANH: case PROGEN_EXP: return made_by_op(g, v, PROGEN_LOG);
    default: return false;
    }
}

/* Now and then, for an op that ends such a composition, a value that makes
 * one with it (mish and softplus come a step at a time); else -1. */
static int pick_composing(gen *g, progen_op op)
{
    bool ends = op == PROGEN_ADD_SCALAR || op == PROGEN_LOG || op == PROGEN_TANH || op == PROGEN_EXP;
    if (!ends || !chance(&g->r, 2, 3))
        return -1;
    int n = 0;
    for (int v = 0; v < n_values(g); v++)
        if (composes(g, op, v))
            g->cand[n++] = v;
    return n ? choose(g, n) : -1;
}

static bool gen_scalar(gen *g, instr *ins, vtype *out)
{
    int composing = ins->op == PROGEN_ADD_SCALAR ? pick_composing(g, ins->op) : -1;
    ins->a = composing >= 0 ? composing : pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    double s = ins->op == PROGEN_POW_SCALAR ? PICK(&g->r, exponents) : PICK(&g->r, scalars);
    if (composing >= 0)
        s = 1;
    kiln_dtype dt = scalar_result(a->dtype, s);
    if (ins->op == PROGEN_POW_SCALAR && !is_float(dt) && s < 0)
        s = -s;
    ins->x = s;
    *out = *a;
    out->dtype = ins->op == PROGEN_DIV_SCALAR ? float_of(dt) : dt;
    out->nonneg = (ins->op == PROGEN_MAXIMUM_SCALAR && s >= 0) ||
                  (ins->op == PROGEN_MINIMUM_SCALAR && s >= 0 && nonneg(a));
    return true;
}

static bool gen_where(gen *g, instr *ins, vtype *out)
{
    int cond = pick(g, PROGEN_DTYPE_BIT(KILN_BOOL), 0);
    if (cond < 0)
        return false;
    vtype t, u;
    int n = 0;
    for (int v = 0; v < n_values(g); v++)
        if (broadcast(type_of(g, cond), type_of(g, v), &t) && numel(t.ndim, t.shape) <= g->o.max_numel)
            g->cand[n++] = v;
    if (n == 0) /* even cond alone can exceed max_numel when options shrink it */
        return false;
    int a = choose(g, n);
    broadcast(type_of(g, cond), type_of(g, a), &t);
    int b = a;
    if (!chance(&g->r, 1, 6)) {
        n = 0;
        for (int v = 0; v < n_values(g); v++)
            if (broadcast(&t, type_of(g, v), &u) && numel(u.ndim, u.shape) <= g->o.max_numel)
                g->cand[n++] = v;
        b = n ? choose(g, n) : a;
    }
    broadcast(&t, type_of(g, b), out);
    const vtype *ta = type_of(g, a), *tb = type_of(g, b);
    out->dtype = promote(ta->dtype, ta->ndim == 0, tb->dtype, tb->ndim == 0);
    out->nonneg = nonneg(ta) && nonneg(tb);
    ins->a = cond;
    ins->b = a;
    ins->c = b;
    return true;
}

static bool gen_unary(gen *g, instr *ins, vtype *out)
{
    progen_op op = ins->op;
    bool rounds = op == PROGEN_FLOOR || op == PROGEN_CEIL || op == PROGEN_ROUND || op == PROGEN_TRUNC;
    bool keeps = op == PROGEN_NEG || op == PROGEN_ABS || op == PROGEN_RELU || rounds;
    bool predicate = op == PROGEN_ISNAN || op == PROGEN_ISINF || op == PROGEN_LOGICAL_NOT;
    int composing = pick_composing(g, op);
    ins->a = composing >= 0 ? composing : pick(g, keeps ? NUMBERS : 0, 0); /* these refuse bool */
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    *out = *a;
    out->dtype = keeps || op == PROGEN_SIGN ? a->dtype : predicate ? KILN_BOOL : float_of(a->dtype);
    out->nonneg = op == PROGEN_RELU || ((rounds || op == PROGEN_SIGN) && nonneg(a));
    return true;
}

/* clamp(a, lo, hi) is maximum_scalar then minimum_scalar: their promotion. */
static bool gen_clamp(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    ins->x = PICK(&g->r, scalars);
    ins->y = PICK(&g->r, scalars);
    *out = *a;
    out->dtype = scalar_result(scalar_result(a->dtype, ins->x), ins->y);
    out->nonneg = ins->x >= 0 && ins->y >= 0;
    return true;
}

static bool gen_cast(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    ins->dtype = random_dtype(g);
    const vtype *a = type_of(g, ins->a);
    *out = *a;
    out->dtype = ins->dtype;
    out->nonneg = !is_float(a->dtype) && nonneg(a);
    return true;
}

/* -- Reductions ------------------------------------------------------------ */

/* A reduction's axis argument for an nd-d value: KILN_ALL, one axis, or
 * (when sets) now and then KILN_AXES of two or more; the reduced axes in
 * reduced. */
static int random_axes(gen *g, int nd, bool sets, bool *reduced)
{
    for (int d = 0; d < nd; d++)
        reduced[d] = false;
    if (nd == 0) {
        static const int zero_d_axes[] = {KILN_ALL, 0, -1}; /* 0 and -1 mean the only "axis" */
        return PICK(&g->r, zero_d_axes);
    }
    if (chance(&g->r, 1, 4)) {
        for (int d = 0; d < nd; d++)
            reduced[d] = true;
        return KILN_ALL;
    }
    if (!sets || nd < 2 || chance(&g->r, 2, 3)) {
        int d = (int)below(&g->r, nd);
        reduced[d] = true;
        return random_axis(g, nd, d);
    }
    int bits = 0;
    for (int d = 0; d < nd; d++)
        if (chance(&g->r, 1, 2) || (d == nd - 1 && bits == 0)) {
            reduced[d] = true;
            bits |= 1 << (random_axis(g, nd, d) & 15);
        }
    return KILN_AXES_FLAG | bits;
}

static bool gen_reduce(gen *g, instr *ins, vtype *out)
{
    progen_op op = ins->op;
    bool arg = op == PROGEN_ARGMAX || op == PROGEN_ARGMIN, statistic = op == PROGEN_VAR || op == PROGEN_STD;
    ins->a = pick(g, statistic ? PROGEN_DTYPE_BIT(KILN_F32) | PROGEN_DTYPE_BIT(KILN_F64) : 0, 0);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    int nd = a->ndim;
    bool reduced[KILN_MAX_DIMS];
    ins->axis = random_axes(g, nd, !arg, reduced);
    ins->keepdim = chance(&g->r, 1, 2);
    ins->k = between(&g->r, 0, 2); /* var's and std's correction */
    int64_t rows = 1;
    for (int d = 0; d < nd; d++)
        rows *= reduced[d] ? a->shape[d] : 1;
    if ((arg || op == PROGEN_MAX || op == PROGEN_MIN) && rows == 0)
        return false; /* the extremes refuse empty axes */
    out->ndim = 0;
    for (int d = 0; d < nd; d++) {
        if (!reduced[d])
            out->shape[out->ndim++] = a->shape[d];
        else if (ins->keepdim)
            out->shape[out->ndim++] = 1;
    }
    out->nonneg = false;
    switch (op) {
    case PROGEN_SUM:
    case PROGEN_PROD:
        out->dtype = is_float(a->dtype) ? a->dtype : KILN_I64;
        out->nonneg = a->dtype == KILN_BOOL;
        break;
    case PROGEN_MEAN:
    case PROGEN_LOGSUMEXP:
    case PROGEN_VAR:
    case PROGEN_STD:
        out->dtype = float_of(a->dtype);
        break;
    case PROGEN_ARGMAX:
    case PROGEN_ARGMIN:
        out->dtype = KILN_I64;
        out->nonneg = true;
        break;
    case PROGEN_ANY:
    case PROGEN_ALL:
        out->dtype = KILN_BOOL;
        break;
    default:
        out->dtype = a->dtype;
        out->nonneg = nonneg(a);
        break;
    }
    return true;
}

/* -- Along an axis, by indices ---------------------------------------------- */

/* An axis of a (an nd-d value), or 0 or -1 for a 0-d one; its extent. */
static int64_t line_axis(gen *g, const vtype *a, int *axis)
{
    if (a->ndim == 0) {
        *axis = chance(&g->r, 1, 2) ? 0 : -1;
        return 1;
    }
    int d = (int)below(&g->r, a->ndim);
    *axis = random_axis(g, a->ndim, d);
    return a->shape[d];
}

static bool gen_cumsum(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    *out = *type_of(g, ins->a);
    line_axis(g, out, &ins->axis);
    out->nonneg = out->dtype == KILN_BOOL; /* integer sums may wrap */
    out->dtype = is_float(out->dtype) ? out->dtype : KILN_I64;
    return true;
}

/* topk or sort: its values (a's dtype) or its indices (i64). */
static bool gen_ordered(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int64_t n = line_axis(g, a, &ins->axis);
    ins->k = ins->op == PROGEN_SORT ? n : a->ndim == 0 ? 1 : between(&g->r, 0, n);
    ins->keepdim = chance(&g->r, 1, 2); /* largest, descending */
    ins->which = (int)below(&g->r, 2);
    *out = *a;
    if (a->ndim)
        out->shape[ins->axis < 0 ? ins->axis + a->ndim : ins->axis] = ins->k;
    out->dtype = ins->which ? KILN_I64 : a->dtype;
    out->nonneg = ins->which || nonneg(a);
    return true;
}

/* A value with exactly t's shape (t's own value v always is one). */
static int same_shape_value(gen *g, const vtype *t, int v, unsigned dtypes)
{
    int n = 0;
    for (int w = 0; w < n_values(g); w++) {
        const vtype *u = type_of(g, w);
        if ((!dtypes || (dtypes & PROGEN_DTYPE_BIT(u->dtype))) && u->ndim == t->ndim &&
            !memcmp(u->shape, t->shape, (size_t)t->ndim * sizeof *t->shape))
            g->cand[n++] = w;
    }
    return n ? choose(g, n) : v;
}

/* gather and scatter_add: indices from a value of a's shape; scatter_add's
 * src one of a's shape and dtype. */
static bool gen_gather_scatter(gen *g, instr *ins, vtype *out)
{
    bool scatter = ins->op == PROGEN_SCATTER_ADD;
    ins->a = pick(g, scatter ? NUMBERS : 0, 0);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    ins->k = line_axis(g, a, &ins->axis);
    ins->b = same_shape_value(g, a, ins->a, 0);
    ins->c = scatter ? same_shape_value(g, a, ins->a, PROGEN_DTYPE_BIT(a->dtype)) : -1;
    *out = *a;
    out->nonneg = nonneg(a) && (!scatter || nonneg(type_of(g, ins->c)));
    return true;
}

static bool gen_index_select(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    ins->k = line_axis(g, a, &ins->axis);
    ins->b = pick(g, 0, 0);
    int64_t n = numel(type_of(g, ins->b)->ndim, type_of(g, ins->b)->shape);
    if (ins->k == 0 && n > 0)
        return false; /* no index is in range */
    *out = *a;
    out->shape[ins->axis < 0 ? ins->axis + a->ndim : ins->axis] = n;
    return true;
}

static bool gen_embedding(gen *g, instr *ins, vtype *out)
{
    int n = 0;
    for (int v = 0; v < n_values(g); v++)
        if (type_of(g, v)->ndim == 2)
            g->cand[n++] = v;
    if (n == 0)
        return false;
    ins->a = choose(g, n);
    ins->b = pick(g, 0, 0);
    const vtype *w = type_of(g, ins->a), *ids = type_of(g, ins->b);
    ins->k = w->shape[0];
    if ((ins->k == 0 && numel(ids->ndim, ids->shape) > 0) || ids->ndim >= MAX_RANK)
        return false;
    *out = *ids;
    out->shape[out->ndim++] = w->shape[1];
    out->dtype = w->dtype;
    out->nonneg = nonneg(w);
    return true;
}

static bool gen_masked_fill(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int n = 0;
    vtype t;
    for (int v = 0; v < n_values(g); v++) {
        const vtype *m = type_of(g, v);
        if (m->dtype == KILN_BOOL && broadcast(a, m, &t) && t.ndim == a->ndim &&
            !memcmp(t.shape, a->shape, (size_t)a->ndim * sizeof *a->shape))
            g->cand[n++] = v;
    }
    if (n == 0)
        return false;
    ins->b = choose(g, n);
    ins->x = PICK(&g->r, fills);
    *out = *a;
    out->nonneg = nonneg(a) && !(ins->x < 0);
    return true;
}

/* -- Norms and losses -------------------------------------------------------------- */

/* A 1-d value of size n, or -1. */
static int vector_of(gen *g, int64_t n)
{
    int count = 0;
    for (int v = 0; v < n_values(g); v++)
        if (type_of(g, v)->ndim == 1 && type_of(g, v)->shape[0] == n)
            g->cand[count++] = v;
    return count ? choose(g, count) : -1;
}

/* batch_norm and group_norm: x [N, C, ...]; b and c [C] values (mean and
 * var, gamma and beta), or -1. Dtypes promote through each step. */
static bool gen_channel_norm(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 2);
    if (ins->a < 0)
        return false;
    const vtype *x = type_of(g, ins->a);
    int64_t c = x->shape[1];
    ins->b = vector_of(g, c);
    ins->c = chance(&g->r, 1, 3) ? -1 : vector_of(g, c);
    ins->x = PICK(&g->r, eps_values);
    if (ins->op == PROGEN_BATCH_NORM && ins->b < 0)
        return false;
    if (ins->op == PROGEN_GROUP_NORM) {
        int64_t divisors[8], n = 0;
        for (int64_t k = 1; k <= c && n < 8; k++)
            if (c % k == 0)
                divisors[n++] = k;
        if (n == 0)
            return false; /* no channels: no groups */
        ins->k = divisors[below(&g->r, n)];
    }
    *out = *x;
    out->nonneg = false;
    out->dtype = float_of(x->dtype);
    if (ins->op == PROGEN_BATCH_NORM) /* (x - mean) * rsqrt(var + eps) [* gamma] [+ beta] */
        out->dtype = higher(higher(out->dtype, type_of(g, ins->b)->dtype), float_of(type_of(g, ins->b)->dtype));
    if (ins->c >= 0)
        out->dtype = higher(out->dtype, type_of(g, ins->c)->dtype);
    return true;
}

/* rms_norm (gamma broadcasting to x) and layer_norm over the last k axes
 * (gamma and beta broadcasting to those axes). */
static bool gen_row_norm(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *x = type_of(g, ins->a);
    ins->k = between(&g->r, 1, x->ndim);
    ins->x = PICK(&g->r, eps_values);
    vtype last = {.ndim = ins->op == PROGEN_RMS_NORM ? x->ndim : (int)ins->k};
    memcpy(last.shape, x->shape + x->ndim - last.ndim, (size_t)last.ndim * sizeof *last.shape);
    *out = *x;
    out->nonneg = false;
    out->dtype = float_of(x->dtype);
    int *affine[2] = {&ins->b, &ins->c};
    for (int i = 0; i < (ins->op == PROGEN_RMS_NORM ? 1 : 2); i++) {
        int n = 0;
        for (int v = 0; v < n_values(g); v++) {
            const vtype *u = type_of(g, v);
            vtype t;
            if (u->ndim <= last.ndim && broadcast(&last, u, &t) && t.ndim == last.ndim &&
                !memcmp(t.shape, last.shape, (size_t)last.ndim * sizeof *t.shape))
                g->cand[n++] = v;
        }
        if (n == 0 || chance(&g->r, 1, 3))
            continue; /* NULL */
        *affine[i] = choose(g, n);
        const vtype *u = type_of(g, *affine[i]);
        /* layer_norm_axes flattens its affine operands: never 0-d */
        out->dtype = promote(out->dtype, false, u->dtype, u->ndim == 0 && ins->op == PROGEN_RMS_NORM);
    }
    return true;
}

/* cross_entropy and nll_loss of a [N, C] value (C >= 1) whose labels are a
 * [N] value modulo C, or its own argmax; now and then class 0 is ignored. */
static bool gen_class_loss(gen *g, instr *ins, vtype *out)
{
    int n = 0;
    for (int v = 0; v < n_values(g); v++)
        if (type_of(g, v)->ndim == 2 && type_of(g, v)->shape[1] > 0)
            g->cand[n++] = v;
    if (n == 0)
        return false;
    ins->a = choose(g, n);
    const vtype *x = type_of(g, ins->a);
    ins->b = chance(&g->r, 1, 2) ? vector_of(g, x->shape[0]) : -1;
    ins->k = x->shape[1];
    ins->start = chance(&g->r, 1, 3) ? 0 : -100; /* ignore_index */
    static const double smoothing[] = {0, 0, 0.1, 0.5};
    ins->x = ins->op == PROGEN_CROSS_ENTROPY ? PICK(&g->r, smoothing) : 0;
    out->dtype = float_of(x->dtype);
    out->ndim = 0;
    out->nonneg = false;
    return true;
}

static bool gen_dropout(gen *g, instr *ins, vtype *out)
{
    static const double ps[] = {0.5, 0.1, 0.9, 0, 1};
    ins->a = pick(g, PROGEN_DTYPE_BIT(KILN_F32) | PROGEN_DTYPE_BIT(KILN_F64), 0);
    if (ins->a < 0)
        return false;
    ins->x = PICK(&g->r, ps);
    ins->keepdim = !chance(&g->r, 1, 4); /* training */
    *out = *type_of(g, ins->a);
    return true;
}

static bool gen_mse(gen *g, instr *ins, vtype *out)
{
    vtype t;
    if (!gen_binary(g, ins, &t)) /* any two that broadcast (gen_binary's add rule: any dtypes) */
        return false;
    const vtype *a = type_of(g, ins->a), *b = type_of(g, ins->b);
    out->dtype = float_of(promote(float_of(a->dtype), a->ndim == 0, b->dtype, b->ndim == 0));
    out->ndim = 0;
    out->nonneg = false;
    return true;
}

/* -- Convolution and pooling ------------------------------------------------------ */

/* An image value: [N, C, H, W] or [C, H, W] of a dtype in mask, H and W at
 * least 1 (and C, when channels). */
static int pick_image(gen *g, unsigned mask, bool channels)
{
    int n = 0;
    for (int v = 0; v < n_values(g); v++) {
        const vtype *t = type_of(g, v);
        bool image = (t->ndim == 3 || t->ndim == 4) && t->shape[t->ndim - 1] > 0 && t->shape[t->ndim - 2] > 0;
        if (image && (mask & PROGEN_DTYPE_BIT(t->dtype)) && (!channels || t->shape[t->ndim - 3] > 0))
            g->cand[n++] = v;
    }
    return n ? choose(g, n) : -1;
}

/* A from_data helper of dt and shape; its value. */
static int data_helper(gen *g, kiln_dtype dt, int ndim, const int64_t *shape)
{
    instr h = blank(PROGEN_FROM_DATA);
    h.dtype = dt;
    h.ndim = ndim;
    memcpy(h.shape, shape, (size_t)ndim * sizeof *shape);
    h.seed = next_u64(&g->r);
    vtype t = {.dtype = dt, .ndim = ndim, .base = -1};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    append(g, &h, &t);
    return n_values(g) - 1;
}

/* The output extent of k taps dilated by d, stepping s over n padded by p
 * (PyTorch's rounding with ceil_mode), or 0 when none fits. */
static int64_t window_count(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode)
{
    int64_t room = n + 2 * p - d * (k - 1) - 1;
    if (room < 0)
        return 0;
    int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
    return ceil_mode && (out - 1) * s >= n + p ? out - 1 : out;
}

/* x and a made weight [O, C / groups, KH, KW] (and bias [O], or none);
 * perm holds stride, padding, dilation (two each) and groups. Not where
 * programs make no tensors: a made weight lives on the CPU, and programs
 * without making ops are the ones run on CUDA. */
static bool gen_conv2d(gen *g, instr *ins, vtype *out)
{
    if (!(g->o.ops & PROGEN_OP_BIT(PROGEN_FROM_DATA)))
        return false;
    ins->a = pick_image(g, PROGEN_DTYPE_BIT(KILN_F32) | PROGEN_DTYPE_BIT(KILN_F64), true);
    if (ins->a < 0 || g->p->n_instrs + 3 > g->target)
        return false;
    vtype x = *type_of(g, ins->a);
    *out = x;
    int64_t c = x.shape[x.ndim - 3], groups = 1;
    for (int64_t k = c; k >= 1 && groups == 1; k--)
        groups = c % k == 0 && chance(&g->r, 1, 3) ? k : 1;
    int64_t w[4] = {groups * between(&g->r, 1, 3), c / groups, between(&g->r, 1, 3), between(&g->r, 1, 3)};
    for (int a = 0; a < 2; a++) {
        ins->perm[a] = (int)between(&g->r, 1, 2);
        ins->perm[2 + a] = (int)between(&g->r, 0, 1);
        ins->perm[4 + a] = (int)between(&g->r, 1, 2);
        out->shape[x.ndim - 2 + a] = window_count(x.shape[x.ndim - 2 + a], w[2 + a], ins->perm[a], ins->perm[2 + a],
                                                  ins->perm[4 + a], false);
        if (out->shape[x.ndim - 2 + a] == 0)
            return false;
    }
    ins->perm[6] = (int)groups;
    kiln_dtype wdt = chance(&g->r, 3, 4) ? x.dtype : KILN_F64;
    ins->b = data_helper(g, wdt, 4, w);
    ins->c = chance(&g->r, 1, 2) ? data_helper(g, x.dtype, 1, w) : -1;
    out->ndim = x.ndim;
    out->dtype = higher(x.dtype, wdt);
    out->nonneg = false;
    if (x.ndim == 4)
        out->shape[0] = x.shape[0];
    out->shape[x.ndim - 3] = w[0];
    return true;
}

/* perm: kernel, stride, padding (two each), ceil_mode, count_include_pad. */
static bool gen_pool2d(gen *g, instr *ins, vtype *out)
{
    ins->a = pick_image(g, NUMBERS, false);
    if (ins->a < 0)
        return false;
    const vtype *x = type_of(g, ins->a);
    *out = *x;
    ins->perm[6] = chance(&g->r, 1, 2);
    ins->perm[7] = chance(&g->r, 1, 2);
    for (int a = 0; a < 2; a++) {
        int k = (int)between(&g->r, 1, 3), s = (int)between(&g->r, 0, 2);
        ins->perm[a] = k, ins->perm[2 + a] = s, ins->perm[4 + a] = (int)between(&g->r, 0, k / 2);
        out->shape[x->ndim - 2 + a] = window_count(x->shape[x->ndim - 2 + a], k, s ? s : k, ins->perm[4 + a], 1,
                                                   ins->perm[6]);
        if (out->shape[x->ndim - 2 + a] == 0)
            return false;
    }
    if (ins->op == PROGEN_AVG_POOL2D)
        out->dtype = float_of(x->dtype), out->nonneg = false;
    return true;
}

static bool gen_adaptive_pool(gen *g, instr *ins, vtype *out)
{
    ins->a = pick_image(g, NUMBERS, false);
    if (ins->a < 0)
        return false;
    *out = *type_of(g, ins->a);
    ins->shape[0] = out->shape[out->ndim - 2] = between(&g->r, 1, 4);
    ins->shape[1] = out->shape[out->ndim - 1] = between(&g->r, 1, 4);
    out->dtype = float_of(out->dtype);
    out->nonneg = false;
    return true;
}

/* -- Movement and creation of issue 19 ----------------------------------------- */

static bool gen_stack(gen *g, instr *ins, vtype *out)
{
    int a = pick(g, 0, 0);
    const vtype *ta = type_of(g, a);
    if (ta->ndim >= MAX_RANK)
        return false;
    ins->n_list = (int)between(&g->r, 1, MAX_CONCAT);
    *out = *ta;
    for (int i = 0; i < ins->n_list; i++) {
        ins->list[i] = i == 0 ? a : same_shape_value(g, ta, a, 0);
        const vtype *t = type_of(g, ins->list[i]);
        out->dtype = i == 0 ? t->dtype : higher(out->dtype, t->dtype);
        out->nonneg = (i == 0 || out->nonneg) && nonneg(t);
    }
    int axis = (int)below(&g->r, ta->ndim + 1);
    ins->axis = random_axis(g, ta->ndim + 1, axis);
    out->ndim = ta->ndim + 1;
    for (int d = 0, k = 0; d < out->ndim; d++)
        out->shape[d] = d == axis ? ins->n_list : ta->shape[k++];
    return true;
}

static bool gen_split(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    int axis = (int)below(&g->r, a->ndim);
    int64_t n = a->shape[axis], least = (n + 7) / 8; /* at most 8 pieces */
    ins->k = between(&g->r, least > 1 ? least : 1, n > 1 ? n : 1);
    int64_t pieces = n ? (n + ins->k - 1) / ins->k : 1;
    ins->which = (int)below(&g->r, pieces);
    ins->axis = random_axis(g, a->ndim, axis);
    *out = *a;
    int64_t rest = n - ins->which * ins->k;
    out->shape[axis] = rest < ins->k ? rest : ins->k;
    return true;
}

static bool gen_flip(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    bool reduced[KILN_MAX_DIMS];
    *out = *type_of(g, ins->a);
    ins->axis = random_axes(g, out->ndim, true, reduced);
    return true;
}

/* Constant pads (some cropping) or reflections of up to three axes. */
static bool gen_pad(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    ins->k = chance(&g->r, 1, 3); /* KILN_PAD_REFLECT */
    int pairs = (int)between(&g->r, 1, a->ndim < 3 ? a->ndim : 3);
    ins->ndim = 2 * pairs;
    ins->x = PICK(&g->r, fills);
    *out = *a;
    for (int i = 0; i < pairs; i++) {
        int d = a->ndim - 1 - i;
        int64_t n = a->shape[d];
        for (int side = 0; side < 2; side++) {
            int64_t *pad = &ins->shape[2 * i + side];
            if (ins->k)
                *pad = n > 1 ? between(&g->r, 0, n - 1 < 3 ? n - 1 : 3) : 0;
            else
                *pad = between(&g->r, -n / 2, 3);
        }
        out->shape[d] = n + ins->shape[2 * i] + ins->shape[2 * i + 1];
    }
    out->nonneg = nonneg(a) && (ins->k || !(ins->x < 0));
    return true;
}

static bool gen_triangle(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 2);
    if (ins->a < 0)
        return false;
    ins->axis2 = (int)between(&g->r, -3, 3);
    *out = *type_of(g, ins->a);
    return true;
}

static bool gen_repeat(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    static const int64_t counts[] = {1, 1, 2, 2, 3, 0};
    int lead = a->ndim < MAX_RANK && chance(&g->r, 1, 3) ? 1 : 0, grown = 0;
    ins->ndim = a->ndim + lead;
    *out = *a;
    out->ndim = ins->ndim;
    for (int i = 0; i < ins->ndim; i++) {
        ins->shape[i] = PICK(&g->r, counts);
        grown += i >= lead && ins->shape[i] != 1;
        out->shape[i] = (i < lead ? 1 : a->shape[i - lead]) * ins->shape[i];
    }
    return ins->ndim + grown <= KILN_MAX_DIMS;
}

static bool gen_like(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    *out = *type_of(g, ins->a);
    ins->x = ins->op == PROGEN_ZEROS_LIKE ? 0 : ins->op == PROGEN_ONES_LIKE ? 1 : PICK(&g->r, fills);
    out->nonneg = !(ins->x < 0);
    return true;
}

static bool gen_eye_linspace(gen *g, instr *ins, vtype *out)
{
    ins->dtype = random_dtype(g);
    if (ins->op == PROGEN_EYE) {
        ins->ndim = 2;
        ins->shape[0] = between(&g->r, 0, 4);
        ins->shape[1] = between(&g->r, 0, 4);
    } else {
        static const double ends[] = {-2, 0, 1, 3.5, -0.25, 7};
        ins->x = PICK(&g->r, ends);
        ins->y = PICK(&g->r, ends);
        ins->ndim = 1;
        ins->shape[0] = between(&g->r, 0, 6);
    }
    out->dtype = ins->dtype;
    out->ndim = ins->ndim;
    memcpy(out->shape, ins->shape, sizeof out->shape);
    out->nonneg = ins->op == PROGEN_EYE || (ins->x >= 0 && ins->y >= 0);
    return true;
}

/* -- Movement -------------------------------------------------------------- */

static bool gen_reshape(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int64_t n = numel(a->ndim, a->shape);
    int nd = (int)between(&g->r, n == 1 ? 0 : 1, 4);
    for (int d = 0; d < nd; d++)
        out->shape[d] = 1;
    if (n == 0) {
        for (int d = 0; d < nd; d++)
            out->shape[d] = between(&g->r, 1, 3);
        out->shape[below(&g->r, nd)] = 0;
    } else { /* a random factorisation: each prime factor to a random axis */
        int64_t rest = n;
        for (int64_t f = 2; rest > 1; f++)
            for (; rest % f == 0; rest /= f)
                out->shape[below(&g->r, nd)] *= f;
    }
    out->ndim = nd;
    out->dtype = a->dtype;
    out->nonneg = a->nonneg;
    ins->ndim = nd;
    memcpy(ins->shape, out->shape, sizeof ins->shape);
    if (n > 0 && nd > 0 && chance(&g->r, 1, 3))
        ins->shape[below(&g->r, nd)] = -1;
    return true;
}

static bool gen_permute(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int perm[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++)
        perm[d] = d;
    for (int d = a->ndim - 1; d > 0; d--) {
        int j = (int)below(&g->r, d + 1), swap = perm[d];
        perm[d] = perm[j];
        perm[j] = swap;
    }
    *out = *a;
    for (int d = 0; d < a->ndim; d++) {
        out->shape[d] = a->shape[perm[d]];
        ins->perm[d] = random_axis(g, a->ndim, perm[d]);
    }
    return true;
}

static bool gen_transpose(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    int i = (int)below(&g->r, a->ndim), j = (int)below(&g->r, a->ndim);
    ins->axis = random_axis(g, a->ndim, i);
    ins->axis2 = random_axis(g, a->ndim, j);
    *out = *a;
    out->shape[i] = a->shape[j];
    out->shape[j] = a->shape[i];
    return true;
}

static bool gen_expand(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int room = MAX_RANK - a->ndim, lead = (int)between(&g->r, 0, room < 2 ? room : 2);
    static const int64_t grown[] = {1, 2, 2, 3, 4, 0};
    *out = *a;
    out->ndim = a->ndim + lead;
    ins->ndim = out->ndim;
    for (int d = 0; d < out->ndim; d++) {
        if (d < lead) {
            out->shape[d] = ins->shape[d] = between(&g->r, 1, 3);
            continue;
        }
        int64_t old = a->shape[d - lead];
        out->shape[d] = old == 1 ? PICK(&g->r, grown) : old;
        ins->shape[d] = out->shape[d] == old && chance(&g->r, 1, 4) ? -1 : out->shape[d];
    }
    return true;
}

static bool gen_slice(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    const vtype *a = type_of(g, ins->a);
    int axis = (int)below(&g->r, a->ndim);
    int64_t n = a->shape[axis];
    static const int64_t steps[] = {1, 1, 1, 2, 3, -1, -1, -2, -3};
    static const int64_t huge_steps[] = {INT64_MAX, -INT64_MAX, INT64_C(1) << 40, 100};
    int64_t step = chance(&g->r, 1, 16) ? PICK(&g->r, huge_steps) : PICK(&g->r, steps);
    int64_t start = between(&g->r, -n - 2, n + 2), stop = between(&g->r, -n - 2, n + 2);
    if (chance(&g->r, 1, 5)) /* an omitted start */
        start = step > 0 ? (chance(&g->r, 1, 2) ? 0 : INT64_MIN) : INT64_MAX;
    if (chance(&g->r, 1, 5)) /* an omitted stop */
        stop = step > 0 ? INT64_MAX : INT64_MIN;
    ins->axis = random_axis(g, a->ndim, axis);
    ins->start = start;
    ins->stop = stop;
    ins->step = step;
    *out = *a;
    out->shape[axis] = slice_length(n, start, stop, step);
    return true;
}

static bool gen_concat(gen *g, instr *ins, vtype *out)
{
    int a = pick(g, 0, 1);
    if (a < 0)
        return false;
    const vtype *ta = type_of(g, a);
    int axis = (int)below(&g->r, ta->ndim), n = 0;
    for (int v = 0; v < n_values(g); v++) {
        const vtype *t = type_of(g, v);
        bool same = t->ndim == ta->ndim;
        for (int d = 0; same && d < ta->ndim; d++)
            same = d == axis || t->shape[d] == ta->shape[d];
        if (same)
            g->cand[n++] = v;
    }
    ins->n_list = (int)between(&g->r, 1, MAX_CONCAT);
    int at = (int)below(&g->r, ins->n_list);
    *out = *ta;
    out->shape[axis] = 0;
    for (int i = 0; i < ins->n_list; i++) {
        int v = i == at ? a : choose(g, n);
        const vtype *t = type_of(g, v);
        ins->list[i] = v;
        out->shape[axis] += t->shape[axis];
        out->dtype = i == 0 ? t->dtype : higher(out->dtype, t->dtype);
        out->nonneg = (i == 0 || out->nonneg) && nonneg(t);
    }
    ins->axis = random_axis(g, ta->ndim, axis);
    return true;
}

static bool gen_squeeze(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int ones[KILN_MAX_DIMS], n = 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] == 1)
            ones[n++] = d;
    int axis = n == 0 || chance(&g->r, 1, 4) ? -1 : ones[below(&g->r, n)];
    ins->axis = axis < 0 ? KILN_ALL : random_axis(g, a->ndim, axis);
    *out = *a;
    out->ndim = 0;
    for (int d = 0; d < a->ndim; d++)
        if (!(a->shape[d] == 1 && (axis < 0 || d == axis)))
            out->shape[out->ndim++] = a->shape[d];
    return true;
}

static bool gen_unsqueeze(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    int axis = (int)below(&g->r, a->ndim + 1);
    ins->axis = random_axis(g, a->ndim + 1, axis);
    *out = *a;
    out->ndim = a->ndim + 1;
    for (int d = 0, k = 0; d < out->ndim; d++)
        out->shape[d] = d == axis ? 1 : a->shape[k++];
    return true;
}

static bool gen_contiguous(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    *out = *type_of(g, ins->a);
    return true;
}

/* -- Matmul and composites ------------------------------------------------- */

static bool matmul_result(const gen *g, const vtype *a, const vtype *b, vtype *out)
{
    if (higher(a->dtype, b->dtype) == KILN_BOOL || !matmul_shape(a, b, out))
        return false;
    out->dtype = higher(a->dtype, b->dtype); /* no 0-d operands: plain promotion */
    out->nonneg = false;
    return fits(g, out);
}

/* a * 0.5 as a new value, now and then when the program has room and a is
 * floating: a left operand that a product's plan scales while packing it
 * (a prologue), which chance alone rarely makes. */
static int scaled_operand(gen *g, int a)
{
    const vtype *t = type_of(g, a);
    bool floating = t->dtype == KILN_F32 || t->dtype == KILN_F64;
    if (!floating || !(g->o.ops & PROGEN_OP_BIT(PROGEN_MUL_SCALAR)) || g->p->n_instrs + 2 > g->target ||
        below(&g->r, 3) != 0)
        return a;
    instr s = blank(PROGEN_MUL_SCALAR);
    s.a = a;
    s.x = 0.5;
    append(g, &s, t);
    return n_values(g) - 1;
}

static bool gen_matmul(gen *g, instr *ins, vtype *out)
{
    int a = pick(g, 0, 1), n = 0;
    if (a < 0)
        return false;
    a = scaled_operand(g, a);
    const vtype *ta = type_of(g, a);
    for (int v = 0; v < n_values(g); v++)
        if (matmul_result(g, ta, type_of(g, v), out))
            g->cand[n++] = v;
    if (n > 0) {
        ins->a = a;
        ins->b = choose(g, n);
        return matmul_result(g, ta, type_of(g, ins->b), out);
    }
    /* Nothing fits a: a @ a^T does, given room for the transpose. */
    if (ta->ndim < 2 || g->p->n_instrs + 2 > g->target)
        return false;
    instr t = blank(PROGEN_TRANSPOSE);
    t.a = a;
    t.axis = -1;
    t.axis2 = -2;
    vtype tt = *ta;
    tt.shape[ta->ndim - 1] = ta->shape[ta->ndim - 2];
    tt.shape[ta->ndim - 2] = ta->shape[ta->ndim - 1];
    if (!matmul_result(g, ta, &tt, out))
        return false;
    append(g, &t, &tt);
    ins->a = a;
    ins->b = n_values(g) - 1;
    return true;
}

/* Any dtype (composites take x.float() of integers and bools), empty axes
 * (an empty result) and 0-d values (axis 0 or -1) included. */
static bool gen_softmax(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 0);
    const vtype *a = type_of(g, ins->a);
    static const int zero_d_axes[] = {0, -1};
    ins->axis = a->ndim == 0 ? PICK(&g->r, zero_d_axes) : random_axis(g, a->ndim, (int)below(&g->r, a->ndim));
    *out = *a;
    out->dtype = float_of(a->dtype);
    out->nonneg = false;
    return true;
}

/* y = normalized x, then y * gamma, then y + beta: each may broadcast and promote. */
static bool gen_layer_norm(gen *g, instr *ins, vtype *out)
{
    ins->a = pick(g, 0, 1);
    if (ins->a < 0)
        return false;
    *out = *type_of(g, ins->a);
    out->dtype = float_of(out->dtype);
    out->nonneg = false;
    ins->x = PICK(&g->r, eps_values);
    int *affine[2] = {&ins->b, &ins->c};
    for (int k = 0; k < 2; k++) {
        if (chance(&g->r, 1, 3))
            continue; /* NULL */
        int n = 0;
        vtype t;
        for (int v = 0; v < n_values(g); v++)
            if (broadcast(out, type_of(g, v), &t) && numel(t.ndim, t.shape) <= g->o.max_numel)
                g->cand[n++] = v;
        int v = choose(g, n); /* x itself always fits */
        const vtype *tv = type_of(g, v);
        vtype y = *out;
        broadcast(&y, tv, out);
        out->dtype = promote(y.dtype, false, tv->dtype, tv->ndim == 0);
        *affine[k] = v;
    }
    return true;
}

static bool gen_float_composite(gen *g, instr *ins, vtype *out)
{
    static const double betas[] = {1, 2, 0.5}, thresholds[] = {20, 1, 0};
    ins->a = pick(g, 0, 0);
    ins->x = PICK(&g->r, betas); /* softplus's */
    ins->y = PICK(&g->r, thresholds);
    *out = *type_of(g, ins->a);
    out->dtype = float_of(out->dtype);
    out->nonneg = false;
    return true;
}

/* -- Creation -------------------------------------------------------------- */

/* A shape for a new tensor: often one an existing value has, so they combine. */
static void creation_shape(gen *g, instr *ins)
{
    int v = (int)below(&g->r, n_values(g));
    const vtype *t = type_of(g, v);
    if (chance(&g->r, 1, 2) && numel(t->ndim, t->shape) <= 256) {
        ins->ndim = t->ndim;
        memcpy(ins->shape, t->shape, sizeof ins->shape);
        return;
    }
    ins->ndim = (int)between(&g->r, 0, 3);
    for (int d = 0; d < ins->ndim; d++)
        ins->shape[d] = between(&g->r, 1, 4);
}

static bool gen_create(gen *g, instr *ins, vtype *out)
{
    creation_shape(g, ins);
    ins->dtype = random_dtype(g);
    ins->seed = next_u64(&g->r);
    bool ints = ins->dtype != KILN_F32 && ins->dtype != KILN_F64;
    switch (ins->op) {
    case PROGEN_FULL:
        ins->x = PICK(&g->r, fills);
        out->nonneg = ints && ins->x >= 0;
        break;
    case PROGEN_ZEROS:
    case PROGEN_ONES:
        out->nonneg = true;
        break;
    case PROGEN_ARANGE: {
        static const double steps[] = {1, 2, 0.5, -1, -0.5, 3, -2};
        int64_t count = between(&g->r, 0, 6);
        ins->x = (double)between(&g->r, -6, 6) / 2;
        ins->z = PICK(&g->r, steps);
        ins->y = ins->x + (double)count * ins->z; /* halves: exact */
        ins->ndim = 1;
        ins->shape[0] = count;
        out->nonneg = ints && ins->x >= 0 && ins->y >= 0;
        break;
    }
    case PROGEN_RAND:
    case PROGEN_RANDN:
        ins->dtype = KILN_F32;
        break;
    case PROGEN_SCALAR:
        ins->dtype = KILN_F32;
        ins->ndim = 0;
        ins->x = PICK(&g->r, fills);
        break;
    default: /* from_data */
        ins->nonneg = chance(&g->r, 1, 2);
        out->nonneg = ins->nonneg;
        break;
    }
    out->dtype = ins->dtype;
    out->ndim = ins->ndim;
    memcpy(out->shape, ins->shape, sizeof out->shape);
    return true;
}

/* dst: a created tensor nothing has read or viewed; src: any value that
 * broadcasts to it (converted to its dtype). */
static bool gen_assign(gen *g, instr *ins, vtype *out)
{
    int n = 0;
    for (int v = 0; v < n_values(g); v++) {
        int b = type_of(g, v)->base;
        if (b >= 0 && !g->viewed[b] && (g->assigned[b] || !g->read[b]))
            g->cand[n++] = v;
    }
    if (n == 0)
        return false;
    int dst = choose(g, n);
    const vtype *d = type_of(g, dst);
    n = 0;
    for (int v = 0; v < n_values(g); v++) {
        const vtype *s = type_of(g, v);
        vtype t;
        if (s->base != d->base && broadcast(d, s, &t) && t.ndim == d->ndim &&
            !memcmp(t.shape, d->shape, (size_t)d->ndim * sizeof *d->shape))
            g->cand[n++] = v;
    }
    if (n == 0)
        return false;
    ins->a = dst;
    ins->b = choose(g, n);
    const vtype *s = type_of(g, ins->b);
    *out = *d;
    out->nonneg = !is_float(s->dtype) && nonneg(s);
    return true;
}

static bool generate(gen *g, instr *ins, vtype *out)
{
    switch (ins->op) {
    case PROGEN_ADD: case PROGEN_SUB: case PROGEN_MUL: case PROGEN_DIV: case PROGEN_POW:
    case PROGEN_MAXIMUM: case PROGEN_MINIMUM:
    case PROGEN_EQ: case PROGEN_NE: case PROGEN_LT: case PROGEN_LE: case PROGEN_GT: case PROGEN_GE:
    case PROGEN_REMAINDER: case PROGEN_FLOOR_DIVIDE: case PROGEN_ATAN2: case PROGEN_LOGICAL_AND:
    case PROGEN_LOGICAL_OR: case PROGEN_LOGICAL_XOR:
        return gen_binary(g, ins, out);
    case PROGEN_FLOOR: case PROGEN_CEIL: case PROGEN_ROUND: case PROGEN_TRUNC: case PROGEN_LOG1P:
    case PROGEN_EXPM1: case PROGEN_LOG2: case PROGEN_TAN: case PROGEN_ATAN: case PROGEN_SIGN:
    case PROGEN_RECIPROCAL: case PROGEN_ISNAN: case PROGEN_ISINF: case PROGEN_LOGICAL_NOT:
        return gen_unary(g, ins, out);
    case PROGEN_GELU_ERF: case PROGEN_SOFTPLUS: return gen_float_composite(g, ins, out);
    case PROGEN_CLAMP: return gen_clamp(g, ins, out);
    case PROGEN_PROD: case PROGEN_ARGMIN: case PROGEN_ANY: case PROGEN_ALL: case PROGEN_VAR: case PROGEN_STD:
    case PROGEN_LOGSUMEXP:
        return gen_reduce(g, ins, out);
    case PROGEN_CUMSUM: return gen_cumsum(g, ins, out);
    case PROGEN_TOPK: case PROGEN_SORT: return gen_ordered(g, ins, out);
    case PROGEN_GATHER: case PROGEN_SCATTER_ADD: return gen_gather_scatter(g, ins, out);
    case PROGEN_INDEX_SELECT: return gen_index_select(g, ins, out);
    case PROGEN_EMBEDDING: return gen_embedding(g, ins, out);
    case PROGEN_MASKED_FILL: return gen_masked_fill(g, ins, out);
    case PROGEN_STACK: return gen_stack(g, ins, out);
    case PROGEN_SPLIT: return gen_split(g, ins, out);
    case PROGEN_FLIP: return gen_flip(g, ins, out);
    case PROGEN_PAD: return gen_pad(g, ins, out);
    case PROGEN_TRIL: case PROGEN_TRIU: return gen_triangle(g, ins, out);
    case PROGEN_REPEAT: return gen_repeat(g, ins, out);
    case PROGEN_ZEROS_LIKE: case PROGEN_ONES_LIKE: case PROGEN_FULL_LIKE: return gen_like(g, ins, out);
    case PROGEN_EYE: case PROGEN_LINSPACE: return gen_eye_linspace(g, ins, out);
    case PROGEN_BATCH_NORM: case PROGEN_GROUP_NORM: return gen_channel_norm(g, ins, out);
    case PROGEN_RMS_NORM: case PROGEN_LAYER_NORM_AXES: return gen_row_norm(g, ins, out);
    case PROGEN_CROSS_ENTROPY: case PROGEN_NLL_LOSS: return gen_class_loss(g, ins, out);
    case PROGEN_MSE_LOSS: return gen_mse(g, ins, out);
    case PROGEN_DROPOUT: return gen_dropout(g, ins, out);
    case PROGEN_CONV2D: return gen_conv2d(g, ins, out);
    case PROGEN_MAX_POOL2D: case PROGEN_AVG_POOL2D: return gen_pool2d(g, ins, out);
    case PROGEN_ADAPTIVE_AVG_POOL2D: return gen_adaptive_pool(g, ins, out);
    case PROGEN_ADD_SCALAR: case PROGEN_SUB_SCALAR: case PROGEN_MUL_SCALAR: case PROGEN_DIV_SCALAR:
    case PROGEN_POW_SCALAR: case PROGEN_MAXIMUM_SCALAR: case PROGEN_MINIMUM_SCALAR:
        return gen_scalar(g, ins, out);
    case PROGEN_WHERE: return gen_where(g, ins, out);
    case PROGEN_NEG: case PROGEN_ABS: case PROGEN_EXP: case PROGEN_LOG: case PROGEN_SQRT:
    case PROGEN_RSQRT: case PROGEN_TANH: case PROGEN_SIGMOID: case PROGEN_RELU: case PROGEN_SIN:
    case PROGEN_COS: case PROGEN_ERF:
        return gen_unary(g, ins, out);
    case PROGEN_CAST: return gen_cast(g, ins, out);
    case PROGEN_SUM: case PROGEN_MEAN: case PROGEN_MAX: case PROGEN_MIN: case PROGEN_ARGMAX:
        return gen_reduce(g, ins, out);
    case PROGEN_RESHAPE: return gen_reshape(g, ins, out);
    case PROGEN_PERMUTE: return gen_permute(g, ins, out);
    case PROGEN_TRANSPOSE: return gen_transpose(g, ins, out);
    case PROGEN_EXPAND: return gen_expand(g, ins, out);
    case PROGEN_SLICE: return gen_slice(g, ins, out);
    case PROGEN_CONCAT: return gen_concat(g, ins, out);
    case PROGEN_SQUEEZE: return gen_squeeze(g, ins, out);
    case PROGEN_UNSQUEEZE: return gen_unsqueeze(g, ins, out);
    case PROGEN_CONTIGUOUS: return gen_contiguous(g, ins, out);
    case PROGEN_MATMUL: return gen_matmul(g, ins, out);
    case PROGEN_SOFTMAX: case PROGEN_LOG_SOFTMAX: return gen_softmax(g, ins, out);
    case PROGEN_LAYER_NORM: return gen_layer_norm(g, ins, out);
    case PROGEN_GELU: case PROGEN_SILU: return gen_float_composite(g, ins, out);
    case PROGEN_ASSIGN: return gen_assign(g, ins, out);
    default: return gen_create(g, ins, out);
    }
}

static unsigned weight_of(const gen *g, int op)
{
    if (!(g->o.ops & PROGEN_OP_BIT(op)))
        return 0;
    return op == PROGEN_MATMUL ? g->o.matmul_weight : weights[op];
}

static progen_op random_op(gen *g)
{
    unsigned total = 0;
    for (int op = 0; op < PROGEN_OP_COUNT; op++)
        total += weight_of(g, op);
    int64_t x = below(&g->r, total);
    for (int op = 0; op < PROGEN_OP_COUNT; op++) {
        if (x < weight_of(g, op))
            return (progen_op)op;
        x -= weight_of(g, op);
    }
    return PROGEN_ADD; /* not reached */
}

/* Inputs take suffixes of one base shape with some sizes set to 1, so that
 * they broadcast together; now and then one has a shape of its own. */
static void gen_inputs(gen *g)
{
    progen_program *p = g->p;
    int64_t base[KILN_MAX_DIMS];
    int base_rank = (int)between(&g->r, 0, g->o.max_rank);
    for (int d = 0; d < base_rank; d++)
        base[d] = chance(&g->r, 1, 4) ? 1 : between(&g->r, 1, g->o.max_dim);
    for (int i = 0; i < p->n_inputs; i++) {
        vtype *t = &p->types[i];
        t->base = -1;
        t->dtype = random_dtype(g);
        t->nonneg = is_int(t->dtype) && chance(&g->r, 1, 2);
        t->ndim = (int)between(&g->r, 0, base_rank);
        bool own = chance(&g->r, 1, 8);
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = own ? between(&g->r, 1, g->o.max_dim) : base[base_rank - t->ndim + d];
            if (chance(&g->r, 1, 5))
                t->shape[d] = 1;
            else if (chance(&g->r, 1, 40)) /* an empty axis */
                t->shape[d] = 0;
        }
    }
}

static void gen_outputs(gen *g)
{
    progen_program *p = g->p;
    int most = p->n_instrs < PROGEN_MAX_OUTPUTS ? p->n_instrs : PROGEN_MAX_OUTPUTS;
    p->n_outputs = (int)between(&g->r, 1, most);
    p->outputs[0] = p->n_inputs + p->n_instrs - 1; /* the last value is always live */
    for (int k = 1; k < p->n_outputs; k++) {
        bool taken = true;
        while (taken) {
            p->outputs[k] = p->n_inputs + (int)below(&g->r, p->n_instrs);
            taken = false;
            for (int j = 0; j < k; j++)
                taken |= p->outputs[j] == p->outputs[k];
        }
    }
    for (int k = p->n_outputs - 1; k > 0; k--) {
        int j = (int)below(&g->r, k + 1), swap = p->outputs[k];
        p->outputs[k] = p->outputs[j];
        p->outputs[j] = swap;
    }
}

static progen_options with_defaults(const progen_options *opt)
{
    progen_options o = opt ? *opt : (progen_options){0};
    o.min_ops = o.min_ops ? o.min_ops : 5;
    o.max_ops = o.max_ops ? o.max_ops : 50;
    o.max_inputs = o.max_inputs ? o.max_inputs : 4;
    o.dtypes = o.dtypes ? o.dtypes : 0x1fu;
    o.max_rank = o.max_rank ? o.max_rank : 4;
    o.max_dim = o.max_dim ? o.max_dim : 7;
    o.max_numel = o.max_numel ? o.max_numel : 4096;
    o.ops = o.ops ? o.ops : ~(progen_mask)0;
    o.matmul_weight = o.matmul_weight ? o.matmul_weight : weights[PROGEN_MATMUL];
    return o;
}

static void free_gen(gen *g)
{
    free(g->cand);
    free(g->read);
    free(g->viewed);
    free(g->assigned);
}

progen_program *progen_new(uint64_t seed, const progen_options *opt)
{
    progen_options o = with_defaults(opt);
    o.ops &= PROGEN_OP_BIT(PROGEN_OP_COUNT) - 1;
    o.dtypes &= 0x1fu;
    if (o.min_ops < 1 || o.max_ops < o.min_ops || o.max_inputs < 1 ||
        o.max_inputs > PROGEN_MAX_INPUTS || !o.dtypes || !o.ops || o.max_rank < 0 ||
        o.max_rank > 4 || o.max_dim < 1 || o.max_numel < 1)
        return NULL;
    gen g = {.r = {seed ^ UINT64_C(0x6b696c6e70726f67)}, .o = o};
    progen_program *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    g.p = p;
    p->seed = seed;
    g.target = (int)between(&g.r, o.min_ops, o.max_ops);
    p->n_inputs = (int)between(&g.r, 1, o.max_inputs);
    p->types = calloc((size_t)(p->n_inputs + g.target), sizeof *p->types);
    p->instrs = calloc((size_t)g.target, sizeof *p->instrs);
    size_t values = (size_t)(p->n_inputs + g.target);
    g.cand = malloc(values * sizeof *g.cand);
    g.read = calloc(values, sizeof *g.read);
    g.viewed = calloc(values, sizeof *g.viewed);
    g.assigned = calloc(values, sizeof *g.assigned);
    if (!p->types || !p->instrs || !g.cand || !g.read || !g.viewed || !g.assigned)
        goto fail;
    gen_inputs(&g);
    while (p->n_instrs < g.target) {
        bool made = false;
        for (int attempt = 0; attempt < ATTEMPTS && !made; attempt++) {
            instr ins = blank(random_op(&g));
            vtype t = {0};
            if (generate(&g, &ins, &t) && fits(&g, &t) && p->n_instrs < g.target) {
                append(&g, &ins, &t);
                made = true;
            }
        }
        if (!made)
            goto fail; /* the options leave no op that fits */
    }
    gen_outputs(&g);
    free_gen(&g);
    return p;
fail:
    free_gen(&g);
    progen_free(p);
    return NULL;
}

void progen_free(progen_program *p)
{
    if (!p)
        return;
    free(p->types);
    free(p->instrs);
    free(p);
}

int progen_n_inputs(const progen_program *p)
{
    return p->n_inputs;
}

int progen_n_outputs(const progen_program *p)
{
    return p->n_outputs;
}

bool progen_draws_random(const progen_program *p)
{
    for (int i = 0; i < p->n_instrs; i++)
        if (p->instrs[i].op == PROGEN_RAND || p->instrs[i].op == PROGEN_RANDN || p->instrs[i].op == PROGEN_DROPOUT)
            return true;
    return false;
}

int progen_n_instrs(const progen_program *p)
{
    return p->n_instrs;
}

progen_op progen_instr_op(const progen_program *p, int i)
{
    return p->instrs[i].op;
}

const char *progen_op_name(progen_op op)
{
    return (unsigned)op < PROGEN_OP_COUNT ? op_names[op] : "?";
}

kiln_spec progen_input_spec(const progen_program *p, int i)
{
    const vtype *t = &p->types[i];
    kiln_spec s = {.dtype = t->dtype, .ndim = t->ndim, .device = KILN_CPU};
    memcpy(s.shape, t->shape, (size_t)t->ndim * sizeof *s.shape);
    return s;
}

/* Operand values of ins into ops; their count. */
static int operands_of(const instr *ins, int *ops)
{
    int n = 0;
    if (ins->op == PROGEN_CONCAT || ins->op == PROGEN_STACK) {
        for (int i = 0; i < ins->n_list; i++)
            ops[n++] = ins->list[i];
        return n;
    }
    const int abc[3] = {ins->a, ins->b, ins->c};
    for (int i = 0; i < 3; i++)
        if (abc[i] >= 0)
            ops[n++] = abc[i];
    return n;
}

static int *operand_slot(instr *ins, int k)
{
    if (ins->op == PROGEN_CONCAT || ins->op == PROGEN_STACK)
        return &ins->list[k];
    int *abc[3] = {&ins->a, &ins->b, &ins->c};
    for (int i = 0; i < 3; i++)
        if (*abc[i] >= 0 && k-- == 0)
            return abc[i];
    return NULL;
}

/* Marks the assignments before instruction `before` that give value v its values. */
static void need_assignments(const progen_program *p, int before, int v, bool *needed)
{
    int b = p->types[v].base;
    for (int j = 0; b >= 0 && j < before; j++)
        if (p->instrs[j].op == PROGEN_ASSIGN && p->types[p->instrs[j].a].base == b)
            needed[p->n_inputs + j] = true;
}

progen_program *progen_only_output(const progen_program *p, int k)
{
    int nv = p->n_inputs + p->n_instrs;
    bool *needed = calloc((size_t)nv, sizeof *needed);
    int *map = malloc((size_t)nv * sizeof *map);
    progen_program *q = calloc(1, sizeof *q);
    if (!needed || !map || !q || k < 0 || k >= p->n_outputs)
        goto fail;
    needed[p->outputs[k]] = true;
    need_assignments(p, p->n_instrs, p->outputs[k], needed);
    for (int i = p->n_instrs - 1; i >= 0; i--) {
        if (!needed[p->n_inputs + i])
            continue;
        int ops[MAX_CONCAT + 3], n = operands_of(&p->instrs[i], ops);
        for (int j = 0; j < n; j++) {
            needed[ops[j]] = true;
            need_assignments(p, i, ops[j], needed);
        }
    }
    q->seed = p->seed;
    q->n_inputs = p->n_inputs;
    q->types = calloc((size_t)nv, sizeof *q->types);
    q->instrs = calloc((size_t)(p->n_instrs ? p->n_instrs : 1), sizeof *q->instrs);
    if (!q->types || !q->instrs)
        goto fail;
    memcpy(q->types, p->types, (size_t)p->n_inputs * sizeof *q->types);
    for (int i = 0; i < p->n_inputs; i++)
        map[i] = i;
    for (int i = 0; i < p->n_instrs; i++) {
        if (!needed[p->n_inputs + i])
            continue;
        instr ins = p->instrs[i];
        int ops[MAX_CONCAT + 3], n = operands_of(&ins, ops);
        for (int j = 0; j < n; j++)
            *operand_slot(&ins, j) = map[ops[j]];
        map[p->n_inputs + i] = q->n_inputs + q->n_instrs;
        vtype t = p->types[p->n_inputs + i];
        t.base = t.base >= 0 ? map[t.base] : -1;
        q->types[q->n_inputs + q->n_instrs] = t;
        q->instrs[q->n_instrs++] = ins;
    }
    q->n_outputs = 1;
    q->outputs[0] = map[p->outputs[k]];
    free(needed);
    free(map);
    return q;
fail:
    free(needed);
    free(map);
    progen_free(q);
    return NULL;
}

/* -- Values ---------------------------------------------------------------- */

/* n values of dt drawn from seed: floats mostly in [-2, 2) with, in one
 * tensor in four, a rare zero, infinity, NaN or huge value, and in one in
 * eight mostly zeros of either sign (where maximum, minimum, relu and
 * division show their signs); integers in [-5, 5] ([0, 5] when nonneg) with a
 * rare extreme, and in one tensor in eight extremes half the time; bools at
 * random. */
static void fill_values(void *buf, kiln_dtype dt, int64_t n, uint64_t seed, bool nonneg_ints)
{
    static const double special[] = {0, -0.0, 1, -1, INFINITY, -INFINITY, NAN, 1e30, -1e-30, 88, 1e300};
    static const double zeros[] = {0, -0.0, 0, -0.0, 0, -0.0, 1, -1, NAN};
    static const int64_t big32[] = {INT32_MAX, INT32_MIN, 65536, -65537, 46341};
    static const int64_t big32_nonneg[] = {INT32_MAX, 65536, 46341};
    static const int64_t big64[] = {INT64_MAX, INT64_MIN, INT64_C(1) << 40, -(INT64_C(1) << 33),
                                    INT64_C(3037000500)};
    static const int64_t big64_nonneg[] = {INT64_MAX, INT64_C(1) << 40, INT64_C(3037000500)};
    rng r = {seed * UINT64_C(0xD1342543DE82EF95) + 1};
    bool specials = chance(&r, 1, 4), signed_zeros = chance(&r, 1, 8), extremes = chance(&r, 1, 8);
    for (int64_t i = 0; i < n; i++) {
        double f = signed_zeros && chance(&r, 3, 4)   ? PICK(&r, zeros)
                   : specials && chance(&r, 1, 24) ? PICK(&r, special)
                                                   : (double)(next_u64(&r) >> 11) * 0x1p-53 * 4 - 2;
        int64_t k = nonneg_ints ? between(&r, 0, 5) : between(&r, -5, 5);
        bool extreme = extremes ? chance(&r, 1, 2) : chance(&r, 1, 64);
        switch (dt) {
        case KILN_F32: ((float *)buf)[i] = (float)f; break;
        case KILN_F64: ((double *)buf)[i] = f; break;
        case KILN_I32:
            ((int32_t *)buf)[i] = (int32_t)(!extreme ? k : nonneg_ints ? PICK(&r, big32_nonneg)
                                                                       : PICK(&r, big32));
            break;
        case KILN_I64:
            ((int64_t *)buf)[i] = !extreme ? k : nonneg_ints ? PICK(&r, big64_nonneg) : PICK(&r, big64);
            break;
        case KILN_BOOL: ((uint8_t *)buf)[i] = (uint8_t)below(&r, 2); break;
        }
    }
}

static kiln_tensor *random_tensor(kiln_dtype dt, int ndim, const int64_t *shape, uint64_t seed,
                                  bool nonneg_ints)
{
    int64_t n = numel(ndim, shape);
    void *buf = malloc((size_t)(n ? n : 1) * kiln_dtype_size(dt));
    if (!buf)
        return NULL;
    fill_values(buf, dt, n, seed, nonneg_ints);
    kiln_tensor *t = kiln_from_data(dt, ndim, shape, buf);
    free(buf);
    return t;
}

kiln_tensor *progen_make_input(const progen_program *p, int i, uint64_t seed)
{
    if (i < 0 || i >= p->n_inputs)
        return NULL;
    const vtype *t = &p->types[i];
    return random_tensor(t->dtype, t->ndim, t->shape, seed, t->nonneg);
}

/* -- Text ------------------------------------------------------------------ */

typedef struct {
    char *text;
    size_t len, cap;
    bool failed;
} strbuf;

static void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || sb->failed)
        return;
    if (sb->len + (size_t)n + 1 > sb->cap) {
        size_t cap = (sb->cap ? 2 * sb->cap : 256) + (size_t)n;
        char *grown = realloc(sb->text, cap);
        if (!grown) {
            sb->failed = true;
            return;
        }
        sb->text = grown;
        sb->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(sb->text + sb->len, sb->cap - sb->len, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

static const char *dtype_enum(kiln_dtype dt)
{
    static const char *const names[] = {"KILN_F32", "KILN_F64", "KILN_I32", "KILN_I64", "KILN_BOOL"};
    return names[dt];
}

/* The shortest text that reads back as v, in C. */
static void sb_double(strbuf *sb, double v)
{
    if (isnan(v)) {
        sb_printf(sb, "NAN");
    } else if (isinf(v)) {
        sb_printf(sb, v > 0 ? "INFINITY" : "-INFINITY");
    } else if (v == 0) {
        sb_printf(sb, signbit(v) ? "-0.0" : "0");
    } else {
        char buf[40];
        snprintf(buf, sizeof buf, "%g", v);
        for (int digits = 7; digits <= 17 && strtod(buf, NULL) != v; digits++)
            snprintf(buf, sizeof buf, "%.*g", digits, v);
        sb_printf(sb, "%s", buf);
    }
}

static void sb_int64(strbuf *sb, int64_t v)
{
    if (v == INT64_MAX)
        sb_printf(sb, "INT64_MAX");
    else if (v == INT64_MIN)
        sb_printf(sb, "INT64_MIN");
    else if (v == -INT64_MAX)
        sb_printf(sb, "-INT64_MAX");
    else
        sb_printf(sb, "%lld", (long long)v);
}

static void sb_axis(strbuf *sb, int axis)
{
    if (axis == KILN_ALL) {
        sb_printf(sb, "KILN_ALL");
    } else if (axis > 0 && (axis & KILN_AXES_FLAG)) {
        sb_printf(sb, "KILN_AXES(");
        for (int bit = 0, first = 1; bit < 16; bit++)
            if (axis >> bit & 1) {
                sb_printf(sb, "%s%d", first ? "" : ", ", bit < 8 ? bit : bit - 16);
                first = 0;
            }
        sb_printf(sb, ")");
    } else {
        sb_printf(sb, "%d", axis);
    }
}

/* The indices an indexing instruction reads: value v (flattened for
 * index_select) as i64, modulo the axis's extent. */
static void sb_indices(strbuf *sb, const instr *ins, int v)
{
    sb_printf(sb, "kiln_remainder(kiln_cast(");
    sb_printf(sb, ins->op == PROGEN_INDEX_SELECT ? "kiln_reshape(v%d, 1, (int64_t[]){-1})" : "v%d", v);
    sb_printf(sb, ", KILN_I64), kiln_full(KILN_I64, 0, NULL, %lld))", (long long)ins->k);
}

/* "2, (int64_t[]){2, 1}": count and values of ins->shape. */
static void sb_counts(strbuf *sb, const instr *ins)
{
    sb_printf(sb, "%d, (int64_t[]){", ins->ndim);
    for (int d = 0; d < ins->ndim; d++)
        sb_printf(sb, "%s%lld", d ? ", " : "", (long long)ins->shape[d]);
    sb_printf(sb, "}");
}

/* "2, (int64_t[]){2, -1}" or "0, NULL" */
static void sb_shape(strbuf *sb, int ndim, const int64_t *shape)
{
    if (ndim == 0) {
        sb_printf(sb, "0, NULL");
        return;
    }
    sb_printf(sb, "%d, (int64_t[]){", ndim);
    for (int d = 0; d < ndim; d++)
        sb_printf(sb, "%s%lld", d ? ", " : "", (long long)shape[d]);
    sb_printf(sb, "}");
}

/* "f32[2,3]", with ">= 0" for integers known not to be negative. */
static void sb_type(strbuf *sb, const vtype *t)
{
    sb_printf(sb, "%s[", kiln_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
        sb_printf(sb, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    sb_printf(sb, "]%s", is_int(t->dtype) && t->nonneg ? " >= 0" : "");
}

static void sb_call(strbuf *sb, const progen_program *p, const instr *ins)
{
    const char *name = op_names[ins->op];
    switch (ins->op) {
    case PROGEN_ADD: case PROGEN_SUB: case PROGEN_MUL: case PROGEN_DIV: case PROGEN_POW:
    case PROGEN_MAXIMUM: case PROGEN_MINIMUM: case PROGEN_EQ: case PROGEN_NE: case PROGEN_LT:
    case PROGEN_LE: case PROGEN_GT: case PROGEN_GE: case PROGEN_MATMUL:
        sb_printf(sb, "%s(v%d, v%d)", name, ins->a, ins->b);
        break;
    case PROGEN_ADD_SCALAR: case PROGEN_SUB_SCALAR: case PROGEN_MUL_SCALAR: case PROGEN_DIV_SCALAR:
    case PROGEN_POW_SCALAR: case PROGEN_MAXIMUM_SCALAR: case PROGEN_MINIMUM_SCALAR:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_WHERE:
        sb_printf(sb, "%s(v%d, v%d, v%d)", name, ins->a, ins->b, ins->c);
        break;
    case PROGEN_ASSIGN:
        sb_printf(sb, "(%s(v%d, v%d), kiln_contiguous(v%d))", name, ins->a, ins->b, ins->a);
        break;
    case PROGEN_CAST:
        sb_printf(sb, "%s(v%d, %s)", name, ins->a, dtype_enum(ins->dtype));
        break;
    case PROGEN_SUM: case PROGEN_MEAN: case PROGEN_MAX: case PROGEN_MIN: case PROGEN_ARGMAX:
    case PROGEN_PROD: case PROGEN_ARGMIN: case PROGEN_ANY: case PROGEN_ALL: case PROGEN_LOGSUMEXP:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_axis(sb, ins->axis);
        sb_printf(sb, ", %s)", ins->keepdim ? "true" : "false");
        break;
    case PROGEN_VAR: case PROGEN_STD:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_axis(sb, ins->axis);
        sb_printf(sb, ", %lld, %s)", (long long)ins->k, ins->keepdim ? "true" : "false");
        break;
    case PROGEN_REMAINDER: case PROGEN_FLOOR_DIVIDE: case PROGEN_ATAN2: case PROGEN_LOGICAL_AND:
    case PROGEN_LOGICAL_OR: case PROGEN_LOGICAL_XOR:
        sb_printf(sb, "%s(v%d, v%d)", name, ins->a, ins->b);
        break;
    case PROGEN_CLAMP: case PROGEN_SOFTPLUS:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_double(sb, ins->x);
        sb_printf(sb, ", ");
        sb_double(sb, ins->y);
        sb_printf(sb, ")");
        break;
    case PROGEN_CUMSUM: case PROGEN_FLIP:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_axis(sb, ins->axis);
        sb_printf(sb, ")");
        break;
    case PROGEN_TOPK: case PROGEN_SORT:
        if (ins->op == PROGEN_TOPK)
            sb_printf(sb, "(kiln_topk(v%d, %lld, %d, %s, &values, &indices), %s)", ins->a, (long long)ins->k,
                      ins->axis, ins->keepdim ? "true" : "false", ins->which ? "indices" : "values");
        else
            sb_printf(sb, "(kiln_sort(v%d, %d, %s, &values, &indices), %s)", ins->a, ins->axis,
                      ins->keepdim ? "true" : "false", ins->which ? "indices" : "values");
        break;
    case PROGEN_GATHER: case PROGEN_INDEX_SELECT:
        sb_printf(sb, "%s(v%d, %d, ", name, ins->a, ins->axis);
        sb_indices(sb, ins, ins->b);
        sb_printf(sb, ")");
        break;
    case PROGEN_SCATTER_ADD:
        sb_printf(sb, "%s(v%d, %d, ", name, ins->a, ins->axis);
        sb_indices(sb, ins, ins->b);
        sb_printf(sb, ", v%d)", ins->c);
        break;
    case PROGEN_EMBEDDING:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_indices(sb, ins, ins->b);
        sb_printf(sb, ")");
        break;
    case PROGEN_MASKED_FILL:
        sb_printf(sb, "%s(v%d, v%d, ", name, ins->a, ins->b);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_STACK:
        sb_printf(sb, "%s((kiln_tensor *[]){", name);
        for (int i = 0; i < ins->n_list; i++)
            sb_printf(sb, "%sv%d", i ? ", " : "", ins->list[i]);
        sb_printf(sb, "}, %d, %d)", ins->n_list, ins->axis);
        break;
    case PROGEN_SPLIT:
        sb_printf(sb, "(%s(v%d, %lld, %d, pieces, 8), pieces[%d])", name, ins->a, (long long)ins->k, ins->axis,
                  ins->which);
        break;
    case PROGEN_PAD:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_counts(sb, ins);
        sb_printf(sb, ", %s, ", ins->k ? "KILN_PAD_REFLECT" : "KILN_PAD_CONSTANT");
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_TRIL: case PROGEN_TRIU:
        sb_printf(sb, "%s(v%d, %d)", name, ins->a, ins->axis2);
        break;
    case PROGEN_REPEAT:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_counts(sb, ins);
        sb_printf(sb, ")");
        break;
    case PROGEN_EYE:
        sb_printf(sb, "%s(%s, %lld, %lld)", name, dtype_enum(ins->dtype), (long long)ins->shape[0],
                  (long long)ins->shape[1]);
        break;
    case PROGEN_LINSPACE:
        sb_printf(sb, "%s(", name);
        sb_double(sb, ins->x);
        sb_printf(sb, ", ");
        sb_double(sb, ins->y);
        sb_printf(sb, ", %lld, %s)", (long long)ins->shape[0], dtype_enum(ins->dtype));
        break;
    case PROGEN_FULL_LIKE:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_BATCH_NORM:
        sb_printf(sb, "%s(v%d, v%d, v%d, ", name, ins->a, ins->b, ins->b);
        sb_printf(sb, ins->c >= 0 ? "v%d, v%d, " : "NULL, NULL, ", ins->c, ins->c);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_GROUP_NORM:
        sb_printf(sb, "%s(v%d, %lld, ", name, ins->a, (long long)ins->k);
        sb_printf(sb, ins->c >= 0 ? "v%d, v%d, " : "NULL, NULL, ", ins->c, ins->c);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_RMS_NORM:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_printf(sb, ins->b >= 0 ? "v%d, " : "NULL, ", ins->b);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_LAYER_NORM_AXES:
        sb_printf(sb, "%s(v%d, %lld, ", name, ins->a, (long long)ins->k);
        sb_printf(sb, ins->b >= 0 ? "v%d, " : "NULL, ", ins->b);
        sb_printf(sb, ins->c >= 0 ? "v%d, " : "NULL, ", ins->c);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_CROSS_ENTROPY: case PROGEN_NLL_LOSS:
        sb_printf(sb, "%s(v%d, ", ins->op == PROGEN_NLL_LOSS ? name : "kiln_cross_entropy_ex", ins->a);
        if (ins->b >= 0)
            sb_indices(sb, ins, ins->b);
        else
            sb_printf(sb, "kiln_argmax(v%d, -1, false)", ins->a);
        sb_printf(sb, ", %lld", (long long)ins->start);
        if (ins->op == PROGEN_CROSS_ENTROPY) {
            sb_printf(sb, ", ");
            sb_double(sb, ins->x);
        }
        sb_printf(sb, ")");
        break;
    case PROGEN_MSE_LOSS:
        sb_printf(sb, "%s(v%d, v%d)", name, ins->a, ins->b);
        break;
    case PROGEN_DROPOUT:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_double(sb, ins->x);
        sb_printf(sb, ", %s)", ins->keepdim ? "true" : "false");
        break;
    case PROGEN_CONV2D:
        sb_printf(sb, "%s(v%d, v%d, ", name, ins->a, ins->b);
        sb_printf(sb, ins->c >= 0 ? "v%d" : "NULL", ins->c);
        sb_printf(sb, ", &(kiln_conv2d_params){{%d, %d}, {%d, %d}, {%d, %d}, %d})", ins->perm[0], ins->perm[1],
                  ins->perm[2], ins->perm[3], ins->perm[4], ins->perm[5], ins->perm[6]);
        break;
    case PROGEN_MAX_POOL2D: case PROGEN_AVG_POOL2D:
        sb_printf(sb, "%s(v%d, &(kiln_pool2d_params){{%d, %d}, {%d, %d}, {%d, %d}, %s, %s})", name, ins->a,
                  ins->perm[0], ins->perm[1], ins->perm[2], ins->perm[3], ins->perm[4], ins->perm[5],
                  ins->perm[6] ? "true" : "false", ins->perm[7] ? "true" : "false");
        break;
    case PROGEN_ADAPTIVE_AVG_POOL2D:
        sb_printf(sb, "%s(v%d, %lld, %lld)", name, ins->a, (long long)ins->shape[0], (long long)ins->shape[1]);
        break;
    case PROGEN_RESHAPE: case PROGEN_EXPAND:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_shape(sb, ins->ndim, ins->shape);
        sb_printf(sb, ")");
        break;
    case PROGEN_PERMUTE: {
        int nd = p->types[ins->a].ndim;
        sb_printf(sb, "%s(v%d, %s", name, ins->a, nd ? "(int[]){" : "NULL");
        for (int d = 0; d < nd; d++)
            sb_printf(sb, "%s%d", d ? ", " : "", ins->perm[d]);
        sb_printf(sb, "%s)", nd ? "}" : "");
        break;
    }
    case PROGEN_TRANSPOSE:
        sb_printf(sb, "%s(v%d, %d, %d)", name, ins->a, ins->axis, ins->axis2);
        break;
    case PROGEN_SLICE:
        sb_printf(sb, "%s(v%d, %d, ", name, ins->a, ins->axis);
        sb_int64(sb, ins->start);
        sb_printf(sb, ", ");
        sb_int64(sb, ins->stop);
        sb_printf(sb, ", ");
        sb_int64(sb, ins->step);
        sb_printf(sb, ")");
        break;
    case PROGEN_CONCAT:
        sb_printf(sb, "%s((kiln_tensor *[]){", name);
        for (int i = 0; i < ins->n_list; i++)
            sb_printf(sb, "%sv%d", i ? ", " : "", ins->list[i]);
        sb_printf(sb, "}, %d, %d)", ins->n_list, ins->axis);
        break;
    case PROGEN_SQUEEZE: case PROGEN_UNSQUEEZE: case PROGEN_SOFTMAX: case PROGEN_LOG_SOFTMAX:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_axis(sb, ins->axis);
        sb_printf(sb, ")");
        break;
    case PROGEN_LAYER_NORM:
        sb_printf(sb, "%s(v%d, ", name, ins->a);
        sb_printf(sb, ins->b >= 0 ? "v%d, " : "NULL, ", ins->b);
        sb_printf(sb, ins->c >= 0 ? "v%d, " : "NULL, ", ins->c);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_FULL:
        sb_printf(sb, "%s(%s, ", name, dtype_enum(ins->dtype));
        sb_shape(sb, ins->ndim, ins->shape);
        sb_printf(sb, ", ");
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_ZEROS: case PROGEN_ONES:
        sb_printf(sb, "%s(%s, ", name, dtype_enum(ins->dtype));
        sb_shape(sb, ins->ndim, ins->shape);
        sb_printf(sb, ")");
        break;
    case PROGEN_ARANGE:
        sb_printf(sb, "%s(", name);
        sb_double(sb, ins->x);
        sb_printf(sb, ", ");
        sb_double(sb, ins->y);
        sb_printf(sb, ", ");
        sb_double(sb, ins->z);
        sb_printf(sb, ", %s)", dtype_enum(ins->dtype));
        break;
    case PROGEN_RAND: case PROGEN_RANDN:
        sb_printf(sb, "%s(", name);
        sb_shape(sb, ins->ndim, ins->shape);
        sb_printf(sb, ", %lluu)", (unsigned long long)ins->seed);
        break;
    case PROGEN_SCALAR:
        sb_printf(sb, "%s(", name);
        sb_double(sb, ins->x);
        sb_printf(sb, ")");
        break;
    case PROGEN_FROM_DATA:
        sb_printf(sb, "%s(%s, ", name, dtype_enum(ins->dtype));
        sb_shape(sb, ins->ndim, ins->shape);
        sb_printf(sb, ", data) /* progen values, seed %llu%s */", (unsigned long long)ins->seed,
                  ins->nonneg ? ", >= 0" : "");
        break;
    default: /* unary ops, contiguous, gelu, silu */
        sb_printf(sb, "%s(v%d)", name, ins->a);
        break;
    }
}

char *progen_describe(const progen_program *p)
{
    strbuf sb = {0};
    sb_printf(&sb, "/* progen seed %llu: %d inputs, %d instructions, %d outputs */\n",
              (unsigned long long)p->seed, p->n_inputs, p->n_instrs, p->n_outputs);
    for (int i = 0; i < p->n_inputs; i++) {
        sb_printf(&sb, "kiln_tensor *v%d = in[%d]; /* ", i, i);
        sb_type(&sb, &p->types[i]);
        sb_printf(&sb, " */\n");
    }
    for (int i = 0; i < p->n_instrs; i++) {
        int v = p->n_inputs + i;
        sb_printf(&sb, "kiln_tensor *v%d = ", v);
        sb_call(&sb, p, &p->instrs[i]);
        sb_printf(&sb, "; /* ");
        sb_type(&sb, &p->types[v]);
        sb_printf(&sb, " */\n");
    }
    for (int k = 0; k < p->n_outputs; k++)
        sb_printf(&sb, "out[%d] = v%d;\n", k, p->outputs[k]);
    if (sb.failed) {
        free(sb.text);
        return NULL;
    }
    return sb.text;
}

/* -- Running --------------------------------------------------------------- */

static _Thread_local char last_error[2048];

const char *progen_last_error(void)
{
    return last_error;
}

static int fail_value(const progen_program *p, int v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_value(const progen_program *p, int v, const char *fmt, ...)
{
    strbuf sb = {0};
    if (v >= p->n_inputs) {
        sb_printf(&sb, "v%d = ", v);
        sb_call(&sb, p, &p->instrs[v - p->n_inputs]);
        sb_printf(&sb, ": ");
    } else {
        sb_printf(&sb, "input %d: ", v);
    }
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s%s", sb.text ? sb.text : "", detail);
    free(sb.text);
    return -1;
}

/* Checks that t is a tensor of the type the model predicts for value v. */
static int check_value(const progen_program *p, int v, const kiln_tensor *t)
{
    const vtype *want = &p->types[v];
    if (!t)
        return fail_value(p, v, "failed: %s", kiln_last_error()[0] ? kiln_last_error() : "no error set");
    bool same = kiln_dtype_of(t) == want->dtype && kiln_ndim(t) == want->ndim &&
                !memcmp(kiln_shape(t), want->shape, (size_t)want->ndim * sizeof *want->shape);
    if (same)
        return 0;
    strbuf got = {0}, expected = {0};
    vtype have = {.dtype = kiln_dtype_of(t), .ndim = kiln_ndim(t)};
    memcpy(have.shape, kiln_shape(t), (size_t)have.ndim * sizeof *have.shape);
    sb_type(&got, &have);
    vtype plain = *want;
    plain.nonneg = false;
    sb_type(&expected, &plain);
    fail_value(p, v, "gave %s where kiln.h promises %s", got.text ? got.text : "?",
               expected.text ? expected.text : "?");
    free(got.text);
    free(expected.text);
    return -1;
}

/* An indexing instruction's indices: value b (flattened for index_select)
 * as i64 modulo the axis's extent ins->k. */
static kiln_tensor *indices(const instr *ins, kiln_tensor *b)
{
    if (ins->op == PROGEN_INDEX_SELECT)
        b = kiln_reshape(b, 1, (int64_t[]){-1});
    return kiln_remainder(kiln_cast(b, KILN_I64), kiln_full(KILN_I64, 0, NULL, (double)ins->k));
}

/* The calls of issue 19's ops. */
static kiln_tensor *call_more(const instr *ins, kiln_tensor *const *v, kiln_tensor *a, kiln_tensor *b,
                              kiln_tensor *c)
{
    kiln_tensor *values, *idx, *list[MAX_CONCAT], *pieces[8];
    switch (ins->op) {
    case PROGEN_FLOOR: return kiln_floor(a);
    case PROGEN_CEIL: return kiln_ceil(a);
    case PROGEN_ROUND: return kiln_round(a);
    case PROGEN_TRUNC: return kiln_trunc(a);
    case PROGEN_LOG1P: return kiln_log1p(a);
    case PROGEN_EXPM1: return kiln_expm1(a);
    case PROGEN_LOG2: return kiln_log2(a);
    case PROGEN_TAN: return kiln_tan(a);
    case PROGEN_ATAN: return kiln_atan(a);
    case PROGEN_SIGN: return kiln_sign(a);
    case PROGEN_RECIPROCAL: return kiln_reciprocal(a);
    case PROGEN_ISNAN: return kiln_isnan(a);
    case PROGEN_ISINF: return kiln_isinf(a);
    case PROGEN_LOGICAL_NOT: return kiln_logical_not(a);
    case PROGEN_GELU_ERF: return kiln_gelu_erf(a);
    case PROGEN_SOFTPLUS: return kiln_softplus(a, ins->x, ins->y);
    case PROGEN_REMAINDER: return kiln_remainder(a, b);
    case PROGEN_FLOOR_DIVIDE: return kiln_floor_divide(a, b);
    case PROGEN_ATAN2: return kiln_atan2(a, b);
    case PROGEN_LOGICAL_AND: return kiln_logical_and(a, b);
    case PROGEN_LOGICAL_OR: return kiln_logical_or(a, b);
    case PROGEN_LOGICAL_XOR: return kiln_logical_xor(a, b);
    case PROGEN_CLAMP: return kiln_clamp(a, ins->x, ins->y);
    case PROGEN_PROD: return kiln_prod(a, ins->axis, ins->keepdim);
    case PROGEN_ARGMIN: return kiln_argmin(a, ins->axis, ins->keepdim);
    case PROGEN_ANY: return kiln_any(a, ins->axis, ins->keepdim);
    case PROGEN_ALL: return kiln_all(a, ins->axis, ins->keepdim);
    case PROGEN_VAR: return kiln_var(a, ins->axis, ins->k, ins->keepdim);
    case PROGEN_STD: return kiln_std(a, ins->axis, ins->k, ins->keepdim);
    case PROGEN_LOGSUMEXP: return kiln_logsumexp(a, ins->axis, ins->keepdim);
    case PROGEN_CUMSUM: return kiln_cumsum(a, ins->axis);
    case PROGEN_TOPK:
    case PROGEN_SORT: {
        int status = ins->op == PROGEN_TOPK ? kiln_topk(a, ins->k, ins->axis, ins->keepdim, &values, &idx)
                                            : kiln_sort(a, ins->axis, ins->keepdim, &values, &idx);
        return status < 0 ? NULL : ins->which ? idx : values;
    }
    case PROGEN_GATHER: return kiln_gather(a, ins->axis, indices(ins, b));
    case PROGEN_INDEX_SELECT: return kiln_index_select(a, ins->axis, indices(ins, b));
    case PROGEN_EMBEDDING: return kiln_embedding(a, indices(ins, b));
    case PROGEN_SCATTER_ADD: return kiln_scatter_add(a, ins->axis, indices(ins, b), c);
    case PROGEN_MASKED_FILL: return kiln_masked_fill(a, b, ins->x);
    case PROGEN_STACK:
        for (int i = 0; i < ins->n_list; i++)
            list[i] = v[ins->list[i]];
        return kiln_stack(list, ins->n_list, ins->axis);
    case PROGEN_SPLIT:
        return kiln_split(a, ins->k, ins->axis, pieces, 8) > ins->which ? pieces[ins->which] : NULL;
    case PROGEN_FLIP: return kiln_flip(a, ins->axis);
    case PROGEN_PAD: return kiln_pad(a, ins->ndim, ins->shape, (kiln_pad_mode)ins->k, ins->x);
    case PROGEN_TRIL: return kiln_tril(a, ins->axis2);
    case PROGEN_TRIU: return kiln_triu(a, ins->axis2);
    case PROGEN_REPEAT: return kiln_repeat(a, ins->ndim, ins->shape);
    case PROGEN_EYE: return kiln_eye(ins->dtype, ins->shape[0], ins->shape[1]);
    case PROGEN_LINSPACE: return kiln_linspace(ins->x, ins->y, ins->shape[0], ins->dtype);
    case PROGEN_ZEROS_LIKE: return kiln_zeros_like(a);
    case PROGEN_ONES_LIKE: return kiln_ones_like(a);
    case PROGEN_FULL_LIKE: return kiln_full_like(a, ins->x);
    case PROGEN_BATCH_NORM: return kiln_batch_norm(a, b, b, c, c, ins->x);
    case PROGEN_GROUP_NORM: return kiln_group_norm(a, ins->k, c, c, ins->x);
    case PROGEN_RMS_NORM: return kiln_rms_norm(a, b, ins->x);
    case PROGEN_LAYER_NORM_AXES: return kiln_layer_norm_axes(a, (int)ins->k, b, c, ins->x);
    case PROGEN_CROSS_ENTROPY:
    case PROGEN_NLL_LOSS: {
        kiln_tensor *labels = b ? indices(ins, b) : kiln_argmax(a, -1, false);
        return ins->op == PROGEN_NLL_LOSS ? kiln_nll_loss(a, labels, ins->start)
                                          : kiln_cross_entropy_ex(a, labels, ins->start, ins->x);
    }
    case PROGEN_MSE_LOSS: return kiln_mse_loss(a, b);
    case PROGEN_DROPOUT: return kiln_dropout(a, ins->x, ins->keepdim);
    case PROGEN_CONV2D: {
        const int *q = ins->perm;
        return kiln_conv2d(a, b, c, &(kiln_conv2d_params){{q[0], q[1]}, {q[2], q[3]}, {q[4], q[5]}, q[6]});
    }
    case PROGEN_MAX_POOL2D: case PROGEN_AVG_POOL2D: {
        const int *q = ins->perm;
        kiln_pool2d_params pp = {{q[0], q[1]}, {q[2], q[3]}, {q[4], q[5]}, q[6], q[7]};
        return ins->op == PROGEN_MAX_POOL2D ? kiln_max_pool2d(a, &pp) : kiln_avg_pool2d(a, &pp);
    }
    case PROGEN_ADAPTIVE_AVG_POOL2D: return kiln_adaptive_avg_pool2d(a, ins->shape[0], ins->shape[1]);
    default: return NULL;
    }
}

static kiln_tensor *call(const instr *ins, kiln_tensor *const *v)
{
    kiln_tensor *a = ins->a >= 0 ? v[ins->a] : NULL, *b = ins->b >= 0 ? v[ins->b] : NULL;
    kiln_tensor *c = ins->c >= 0 ? v[ins->c] : NULL;
    switch (ins->op) {
    case PROGEN_ADD: return kiln_add(a, b);
    case PROGEN_SUB: return kiln_sub(a, b);
    case PROGEN_MUL: return kiln_mul(a, b);
    case PROGEN_DIV: return kiln_div(a, b);
    case PROGEN_POW: return kiln_pow(a, b);
    case PROGEN_MAXIMUM: return kiln_maximum(a, b);
    case PROGEN_MINIMUM: return kiln_minimum(a, b);
    case PROGEN_ADD_SCALAR: return kiln_add_scalar(a, ins->x);
    case PROGEN_SUB_SCALAR: return kiln_sub_scalar(a, ins->x);
    case PROGEN_MUL_SCALAR: return kiln_mul_scalar(a, ins->x);
    case PROGEN_DIV_SCALAR: return kiln_div_scalar(a, ins->x);
    case PROGEN_POW_SCALAR: return kiln_pow_scalar(a, ins->x);
    case PROGEN_MAXIMUM_SCALAR: return kiln_maximum_scalar(a, ins->x);
    case PROGEN_MINIMUM_SCALAR: return kiln_minimum_scalar(a, ins->x);
    case PROGEN_EQ: return kiln_eq(a, b);
    case PROGEN_NE: return kiln_ne(a, b);
    case PROGEN_LT: return kiln_lt(a, b);
    case PROGEN_LE: return kiln_le(a, b);
    case PROGEN_GT: return kiln_gt(a, b);
    case PROGEN_GE: return kiln_ge(a, b);
    case PROGEN_WHERE: return kiln_where(a, b, c);
    case PROGEN_NEG: return kiln_neg(a);
    case PROGEN_ABS: return kiln_abs(a);
    case PROGEN_EXP: return kiln_exp(a);
    case PROGEN_LOG: return kiln_log(a);
    case PROGEN_SQRT: return kiln_sqrt(a);
    case PROGEN_RSQRT: return kiln_rsqrt(a);
    case PROGEN_TANH: return kiln_tanh(a);
    case PROGEN_SIGMOID: return kiln_sigmoid(a);
    case PROGEN_RELU: return kiln_relu(a);
    case PROGEN_SIN: return kiln_sin(a);
    case PROGEN_COS: return kiln_cos(a);
    case PROGEN_ERF: return kiln_erf(a);
    case PROGEN_CAST: return kiln_cast(a, ins->dtype);
    case PROGEN_SUM: return kiln_sum(a, ins->axis, ins->keepdim);
    case PROGEN_MEAN: return kiln_mean(a, ins->axis, ins->keepdim);
    case PROGEN_MAX: return kiln_max(a, ins->axis, ins->keepdim);
    case PROGEN_MIN: return kiln_min(a, ins->axis, ins->keepdim);
    case PROGEN_ARGMAX: return kiln_argmax(a, ins->axis, ins->keepdim);
    case PROGEN_RESHAPE: return kiln_reshape(a, ins->ndim, ins->ndim ? ins->shape : NULL);
    case PROGEN_PERMUTE: return kiln_permute(a, kiln_ndim(a) > 0 ? ins->perm : NULL);
    case PROGEN_TRANSPOSE: return kiln_transpose(a, ins->axis, ins->axis2);
    case PROGEN_EXPAND: return kiln_expand(a, ins->ndim, ins->ndim ? ins->shape : NULL);
    case PROGEN_SLICE: return kiln_slice(a, ins->axis, ins->start, ins->stop, ins->step);
    case PROGEN_CONCAT: {
        kiln_tensor *ts[MAX_CONCAT];
        for (int i = 0; i < ins->n_list; i++)
            ts[i] = v[ins->list[i]];
        return kiln_concat(ts, ins->n_list, ins->axis);
    }
    case PROGEN_SQUEEZE: return kiln_squeeze(a, ins->axis);
    case PROGEN_UNSQUEEZE: return kiln_unsqueeze(a, ins->axis);
    case PROGEN_CONTIGUOUS: return kiln_contiguous(a);
    case PROGEN_MATMUL: return kiln_matmul(a, b);
    case PROGEN_SOFTMAX: return kiln_softmax(a, ins->axis);
    case PROGEN_LOG_SOFTMAX: return kiln_log_softmax(a, ins->axis);
    case PROGEN_LAYER_NORM: return kiln_layer_norm(a, b, c, ins->x);
    case PROGEN_GELU: return kiln_gelu(a);
    case PROGEN_SILU: return kiln_silu(a);
    case PROGEN_FULL: return kiln_full(ins->dtype, ins->ndim, ins->shape, ins->x);
    case PROGEN_ZEROS: return kiln_zeros(ins->dtype, ins->ndim, ins->shape);
    case PROGEN_ONES: return kiln_ones(ins->dtype, ins->ndim, ins->shape);
    case PROGEN_ARANGE: return kiln_arange(ins->x, ins->y, ins->z, ins->dtype);
    case PROGEN_RAND: return kiln_rand(ins->ndim, ins->shape, ins->seed);
    case PROGEN_RANDN: return kiln_randn(ins->ndim, ins->shape, ins->seed);
    case PROGEN_SCALAR: return kiln_scalar(ins->x);
    case PROGEN_FROM_DATA: return random_tensor(ins->dtype, ins->ndim, ins->shape, ins->seed, ins->nonneg);
    case PROGEN_ASSIGN: return kiln_assign(a, b) == 0 ? kiln_contiguous(a) : NULL;
    default: return call_more(ins, v, a, b, c);
    }
}

int progen_run(const progen_program *p, kiln_tensor *const *in, kiln_tensor **out)
{
    last_error[0] = '\0';
    for (int k = 0; k < p->n_outputs; k++)
        out[k] = NULL;
    int nv = p->n_inputs + p->n_instrs;
    kiln_tensor **v = calloc((size_t)nv, sizeof *v);
    if (!v)
        return fail_value(p, 0, "out of memory");
    int status = 0;
    for (int i = 0; i < p->n_instrs; i++) /* eager and traced runs draw the same masks */
        if (p->instrs[i].op == PROGEN_DROPOUT) {
            kiln_manual_seed(p->seed);
            break;
        }
    for (int i = 0; i < p->n_inputs && status == 0; i++)
        status = check_value(p, i, v[i] = in[i]);
    kiln_scope_begin();
    for (int i = 0; i < p->n_instrs && status == 0; i++) {
        int k = p->n_inputs + i;
        status = check_value(p, k, v[k] = call(&p->instrs[i], v));
    }
    for (int k = 0; k < p->n_outputs && status == 0; k++)
        out[k] = kiln_keep(v[p->outputs[k]]);
    kiln_scope_end();
    free(v);
    return status;
}

int progen_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    return progen_run(user, in, out);
}

/* -- References ------------------------------------------------------------ */

typedef struct {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[2];
    double f[8];  /* values of floats */
    int64_t i[8]; /* values of integers and bools */
} ref_tensor;

typedef struct {
    const char *pytorch; /* the expression PyTorch evaluates */
    instr ins;           /* the call, on values 0 and 1 (the inputs) */
    int n_inputs;
    ref_tensor in[2], want;
} reference;

#define Z (-0.0)
#define UNARY(OP, ...) {.op = PROGEN_##OP, .a = 0, .b = -1, .c = -1, __VA_ARGS__}
#define BINARY(OP) {.op = PROGEN_##OP, .a = 0, .b = 1, .c = -1}
#define FLOATS(dt, n, ...) {dt, 1, {n}, {__VA_ARGS__}, {0}}
#define INTS(dt, n, ...) {dt, 1, {n}, {0}, {__VA_ARGS__}}
#define FLOAT_0D(dt, v) {dt, 0, {0}, {v}, {0}}
#define EMPTY(dt, rows, cols) {dt, 2, {rows, cols}, {0}, {0}}
/* Zeros of both signs, NaN and numbers around them; their results. */
#define ZEROS_A(dt) FLOATS(dt, 7, Z, 0, Z, 0, NAN, 1, -1)
#define ZEROS_B(dt) FLOATS(dt, 7, 0, Z, Z, 0, 0, NAN, 2)

/* Checked against PyTorch 1.13.1 (Debian's python3-torch) on the CPU. Of
 * two equal operands maximum and minimum give the first, as its scalar loop
 * and its 0-d and clamp forms do (its vectorized loop gives the second). */
static const reference references[] = {
    {"torch.maximum(a, b)", BINARY(MAXIMUM), 2, {ZEROS_A(KILN_F32), ZEROS_B(KILN_F32)},
     FLOATS(KILN_F32, 7, Z, 0, Z, 0, NAN, NAN, 2)},
    {"torch.minimum(a, b)", BINARY(MINIMUM), 2, {ZEROS_A(KILN_F64), ZEROS_B(KILN_F64)},
     FLOATS(KILN_F64, 7, Z, 0, Z, 0, NAN, NAN, -1)},
    {"torch.clamp_min(a, 0.0)", UNARY(MAXIMUM_SCALAR, .x = 0), 1, {ZEROS_A(KILN_F32)},
     FLOATS(KILN_F32, 7, Z, 0, Z, 0, NAN, 1, 0)},
    {"torch.clamp_max(a, -0.0)", UNARY(MINIMUM_SCALAR, .x = Z), 1, {ZEROS_A(KILN_F64)},
     FLOATS(KILN_F64, 7, Z, 0, Z, 0, NAN, Z, -1)},
    {"torch.relu(a)", UNARY(RELU), 1, {ZEROS_A(KILN_F32)}, FLOATS(KILN_F32, 7, Z, 0, Z, 0, NAN, 1, 0)},
    {"a / -0.0", UNARY(DIV_SCALAR, .x = Z), 1, {INTS(KILN_I32, 3, 3, -3, 0)},
     FLOATS(KILN_F32, 3, -INFINITY, INFINITY, NAN)},
    {"a + -0.0", UNARY(ADD_SCALAR, .x = Z), 1, {INTS(KILN_I64, 2, 5, -5)}, FLOATS(KILN_F32, 2, 5, -5)},
    {"a.sum()", UNARY(SUM, .axis = KILN_ALL), 1, {INTS(KILN_I64, 2, INT64_MAX, 1)},
     {KILN_I64, 0, {0}, {0}, {INT64_MIN}}},
    {"a * b", BINARY(MUL), 2, {INTS(KILN_I32, 2, 46341, -46341), INTS(KILN_I32, 2, 46341, 46341)},
     INTS(KILN_I32, 2, -2147479015, 2147479015)},
    {"torch.neg(a)", UNARY(NEG), 1, {INTS(KILN_I32, 2, INT32_MIN, INT32_MAX)},
     INTS(KILN_I32, 2, INT32_MIN, -INT32_MAX)},
    {"torch.abs(a)", UNARY(ABS), 1, {INTS(KILN_I64, 2, INT64_MIN, -7)}, INTS(KILN_I64, 2, INT64_MIN, 7)},
    {"torch.maximum(a, b)", BINARY(MAXIMUM), 2,
     {INTS(KILN_I32, 2, INT32_MIN, INT32_MAX), INTS(KILN_I32, 2, INT32_MAX, INT32_MIN)},
     INTS(KILN_I32, 2, INT32_MAX, INT32_MAX)},
    {"a.double().mean().float()", UNARY(MEAN, .axis = KILN_ALL), 1,
     {INTS(KILN_I64, 2, INT64_C(1) << 62, INT64_C(1) << 62)}, FLOAT_0D(KILN_F32, 0x1p62)},
    {"torch.nn.functional.gelu(a.float(), approximate='tanh')", UNARY(GELU), 1,
     {INTS(KILN_I32, 3, 46341, 2000, -1291)}, FLOATS(KILN_F32, 3, 46341, 2000, Z)},
    {"torch.nn.functional.gelu(a.float(), approximate='tanh')", UNARY(GELU), 1, {INTS(KILN_BOOL, 2, 1, 0)},
     FLOATS(KILN_F32, 2, 0.8411920070648193, 0)},
    {"torch.softmax(a.float(), 0)", UNARY(SOFTMAX, .axis = 0), 1, {INTS(KILN_I32, 2, INT32_MIN, INT32_MAX)},
     FLOATS(KILN_F32, 2, 0, 1)},
    {"torch.log_softmax(a.float(), 0)", UNARY(LOG_SOFTMAX, .axis = 0), 1,
     {INTS(KILN_I32, 2, INT32_MIN, INT32_MAX)}, FLOATS(KILN_F32, 2, -4294967296.0, 0)},
    {"torch.softmax(a, 0)", UNARY(SOFTMAX, .axis = 0), 1, {FLOAT_0D(KILN_F32, 3)}, FLOAT_0D(KILN_F32, 1)},
    {"torch.log_softmax(a, -1)", UNARY(LOG_SOFTMAX, .axis = -1), 1, {FLOAT_0D(KILN_F64, -2.5)},
     FLOAT_0D(KILN_F64, 0)},
    {"torch.softmax(a, 1)", UNARY(SOFTMAX, .axis = 1), 1, {EMPTY(KILN_F32, 2, 0)}, EMPTY(KILN_F32, 2, 0)},
    {"torch.log_softmax(a, 0)", UNARY(LOG_SOFTMAX, .axis = 0), 1, {EMPTY(KILN_F64, 0, 3)}, EMPTY(KILN_F64, 0, 3)},
    {"a[::-2**63] (a Python list)", UNARY(SLICE, .start = -1, .stop = INT64_MIN, .step = INT64_MIN), 1,
     {FLOATS(KILN_F32, 4, 1, 2, 3, 4)}, FLOATS(KILN_F32, 1, 4)},
};

int progen_n_references(void)
{
    return (int)(sizeof references / sizeof *references);
}

static vtype type_of_ref(const ref_tensor *t)
{
    vtype v = {.dtype = t->dtype, .ndim = t->ndim, .base = -1};
    memcpy(v.shape, t->shape, sizeof t->shape);
    return v;
}

/* A new tensor holding t's values, on device. */
static kiln_tensor *ref_tensor_new(const ref_tensor *t, kiln_device device)
{
    union { float f32[8]; double f64[8]; int32_t i32[8]; int64_t i64[8]; uint8_t b8[8]; } data;
    for (int k = 0; k < 8; k++) {
        switch (t->dtype) {
        case KILN_F32: data.f32[k] = (float)t->f[k]; break;
        case KILN_F64: data.f64[k] = t->f[k]; break;
        case KILN_I32: data.i32[k] = (int32_t)t->i[k]; break;
        case KILN_I64: data.i64[k] = t->i[k]; break;
        case KILN_BOOL: data.b8[k] = (uint8_t)t->i[k]; break;
        }
    }
    return kiln_to_device(kiln_from_data(t->dtype, t->ndim, t->shape, &data), device);
}

/* Element k of got (host bytes of want's dtype) against want's. */
static bool ref_element_matches(const ref_tensor *want, const void *got, int k, double rel, char *why, size_t size)
{
    if (!is_float(want->dtype)) {
        int64_t g = want->dtype == KILN_I64 ? ((const int64_t *)got)[k]
                    : want->dtype == KILN_I32 ? ((const int32_t *)got)[k] : ((const uint8_t *)got)[k];
        snprintf(why, size, "element %d is %lld, PyTorch's %lld", k, (long long)g, (long long)want->i[k]);
        return g == want->i[k];
    }
    double g = want->dtype == KILN_F32 ? ((const float *)got)[k] : ((const double *)got)[k], w = want->f[k];
    snprintf(why, size, "element %d is %.9g, PyTorch's %.9g", k, g, w); /* %g shows -0 */
    if (isnan(w) || isnan(g))
        return isnan(w) && isnan(g);
    if (w == 0 || isinf(w))
        return g == w && !signbit(g) == !signbit(w);
    return fabs(g - w) <= rel * fabs(w);
}

/* got (any device) against want; false with why set when they differ. */
static bool ref_matches(const kiln_tensor *got, const ref_tensor *want, double rel, char *why, size_t size)
{
    vtype have = {.dtype = kiln_dtype_of(got), .ndim = kiln_ndim(got)}, expected = type_of_ref(want);
    memcpy(have.shape, kiln_shape(got), (size_t)have.ndim * sizeof *have.shape);
    if (have.dtype != expected.dtype || have.ndim != expected.ndim ||
        memcmp(have.shape, expected.shape, (size_t)have.ndim * sizeof *have.shape)) {
        strbuf a = {0}, b = {0};
        sb_type(&a, &have);
        sb_type(&b, &expected);
        snprintf(why, size, "gave %s, PyTorch %s", a.text ? a.text : "?", b.text ? b.text : "?");
        free(a.text);
        free(b.text);
        return false;
    }
    int64_t n = numel(want->ndim, want->shape);
    double bytes[8];
    if (kiln_copy_to_host(got, bytes, sizeof bytes) < 0) {
        snprintf(why, size, "kiln_copy_to_host failed: %s", kiln_last_error());
        return false;
    }
    for (int k = 0; k < n; k++)
        if (!ref_element_matches(want, bytes, k, rel, why, size))
            return false;
    return true;
}

/* A program of reference r's one call. */
static progen_program *ref_program(const reference *r, uint64_t seed)
{
    progen_program *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->seed = seed;
    p->n_inputs = r->n_inputs;
    p->n_instrs = 1;
    p->n_outputs = 1;
    p->outputs[0] = r->n_inputs;
    p->types = calloc((size_t)r->n_inputs + 1, sizeof *p->types);
    p->instrs = calloc(1, sizeof *p->instrs);
    if (!p->types || !p->instrs) {
        progen_free(p);
        return NULL;
    }
    for (int i = 0; i < r->n_inputs; i++)
        p->types[i] = type_of_ref(&r->in[i]);
    p->types[r->n_inputs] = type_of_ref(&r->want);
    p->instrs[0] = r->ins;
    return p;
}

/* Runs p on in eagerly or marked with opts; its output, owned by the open scope. */
static kiln_tensor *ref_run(progen_program *p, kiln_tensor *const *in, const kiln_jit_options *opts)
{
    kiln_tensor *out = NULL;
    if (!opts)
        return progen_run(p, in, &out) == 0 ? out : NULL;
    kiln_fn *f = kiln_jit("reference", progen_body, p->n_inputs, 1, p, opts);
    if (f && kiln_call(f, in, &out) < 0)
        out = NULL;
    kiln_fn_free(f);
    return out;
}

int progen_check_reference(int i, const kiln_jit_options *opts, kiln_device device, double rel)
{
    if (i < 0 || i >= progen_n_references())
        return -1;
    const reference *r = &references[i];
    progen_program *p = ref_program(r, (uint64_t)i);
    if (!p) {
        snprintf(last_error, sizeof last_error, "reference %d: out of memory", i);
        return -1;
    }
    char why[1024] = "";
    kiln_scope_begin();
    kiln_tensor *in[2] = {NULL, NULL};
    for (int k = 0; k < r->n_inputs; k++)
        in[k] = ref_tensor_new(&r->in[k], device);
    kiln_tensor *out = in[0] && (r->n_inputs < 2 || in[1]) ? ref_run(p, in, opts) : NULL;
    bool ok = out && ref_matches(out, &r->want, rel, why, sizeof why);
    if (!out)
        snprintf(why, sizeof why, "failed: %.500s %.500s", kiln_last_error(), progen_last_error());
    kiln_scope_end();
    int status = ok ? 0 : fail_value(p, p->n_inputs, "%s (reference %d, PyTorch: %s)", why, i, r->pytorch);
    progen_free(p);
    return status;
}
