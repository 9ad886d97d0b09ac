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

_Static_assert(PROGEN_OP_COUNT <= 64, "progen_options.ops is a 64-bit mask");

enum {
    MAX_RANK = 6,       /* values stay well inside KILN_MAX_DIMS */
    MAX_CONCAT = 3,
    ATTEMPTS = 2000,    /* tries to find one more instruction before giving up */
    LINE_MAX_CHARS = 512,
};

typedef struct {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    bool nonneg; /* an integer value known to be >= 0 (bools always are) */
} vtype;

typedef struct {
    progen_op op;
    int a, b, c;                 /* operand values; -1 when unused (layer_norm: NULL) */
    int n_list, list[MAX_CONCAT];/* concat's operands */
    int axis, axis2;             /* reductions, softmax, slice, concat, (un)squeeze, transpose */
    bool keepdim;
    int64_t start, stop, step;   /* slice */
    double x, y, z;              /* scalar operand, fill value, arange start/stop/step, eps */
    kiln_dtype dtype;            /* cast and creation */
    int ndim;                    /* reshape and expand requests, creation shapes */
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

static bool whole(double v)
{
    return v == floor(v) && fabs(v) < 0x1p62;
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
