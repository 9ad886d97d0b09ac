/* Values of every op in kiln.h against references computed here, from plain C
 * arrays with libm in double precision, on contiguous, transposed, sliced and
 * broadcast operands of every dtype each op accepts. */
#include "opcheck.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
#define MAX_ELEMS 1024 /* the most elements any operand or result here has */

/* -- Tolerances ------------------------------------------------------------- */
/* A float result passes when |got - ref| <= rel * |ref| + abs (+ a per-element
 * slack where a sum's rounding depends on its order); NaN must meet NaN and an
 * infinity the same infinity. Integer and bool results are compared exactly. */

typedef struct {
    double rel, abs;
} tolerance;

static const tolerance EXACT = {0, 0};
/* f32 + - * / are correctly rounded, so computing in f32 or rounding an f64
 * result both land within half an ulp (6e-8); 1e-6 (~8 ulp) leaves room for
 * e.g. a scalar rounded to f32 before use. */
static const tolerance F32_ARITH = {1e-6, 1e-6};
static const tolerance F64_ARITH = {1e-12, 1e-14};
/* kiln.h promises 2 ulp for f32 transcendentals; 2e-6 relative is 8 to 16 ulp,
 * and 1e-7 absolute covers results that round or flush to zero. */
static const tolerance F32_TRANS = {2e-6, 1e-7};
static const tolerance F64_TRANS = {1e-14, 1e-15};
/* The final rounding of a sum; the order-dependent part is the slack. */
static const tolerance F32_SUM = {1e-6, 0};
static const tolerance F64_SUM = {1e-15, 0};
/* Composites chain several rounded ops (mean, variance, exp, divide). */
static const tolerance F32_COMPOSITE = {1e-5, 1e-5};
static const tolerance F64_COMPOSITE = {1e-12, 1e-12};

/* -- Dtypes ------------------------------------------------------------------ */

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};

/* Our own names, so that failure messages do not depend on the library. */
static const char *dt_name(kiln_dtype dt)
{
    static const char *const names[] = {"f32", "f64", "i32", "i64", "bool"};
    return (unsigned)dt < 5 ? names[dt] : "?";
}

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64;
}

/* Position in the promotion order bool < i32 < i64 < f32 < f64. */
static int promotion_rank(kiln_dtype dt)
{
    switch (dt) {
    case KILN_BOOL: return 0;
    case KILN_I32: return 1;
    case KILN_I64: return 2;
    case KILN_F32: return 3;
    case KILN_F64: return 4;
    }
    return -1;
}

static kiln_dtype promote(kiln_dtype a, kiln_dtype b)
{
    return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

/* x as dt stores it: f32 rounds, bool is x != 0; integer x are already whole. */
static double round_to(kiln_dtype dt, double x)
{
    if (dt == KILN_F32)
        return (double)(float)x;
    if (dt == KILN_BOOL)
        return x != 0;
    return x;
}

/* An exact integer result wrapped to dt's width, as kiln's integer overflow wraps. */
static double wrap_to(kiln_dtype dt, int64_t x)
{
    if (dt == KILN_BOOL)
        return x != 0;
    if (dt == KILN_I32)
        return (int32_t)(uint32_t)(uint64_t)x;
    return (double)x;
}

static tolerance float_tol(kiln_dtype dt, bool transcendental)
{
    if (dt == KILN_F32)
        return transcendental ? F32_TRANS : F32_ARITH;
    return transcendental ? F64_TRANS : F64_ARITH;
}

/* Element i of a host array of dtype dt. memcpy keeps clear of aliasing rules. */
static double raw_double(kiln_dtype dt, const void *p, int64_t i)
{
    const unsigned char *bytes = p;
    if (dt == KILN_F32) {
        float f;
        memcpy(&f, bytes + 4 * i, 4);
        return f;
    }
    double d;
    memcpy(&d, bytes + 8 * i, 8);
    return d;
}

static int64_t raw_int(kiln_dtype dt, const void *p, int64_t i)
{
    const unsigned char *bytes = p;
    if (dt == KILN_I32) {
        int32_t v;
        memcpy(&v, bytes + 4 * i, 4);
        return v;
    }
    if (dt == KILN_BOOL)
        return bytes[i];
    int64_t v;
    memcpy(&v, bytes + 8 * i, 8);
    return v;
}


/* -- Shapes and indices ------------------------------------------------------ */

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

static void unravel(int64_t i, int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t ravel(int ndim, const int64_t *shape, const int64_t *idx)
{
    int64_t i = 0;
    for (int d = 0; d < ndim; d++)
        i = i * shape[d] + idx[d];
    return i;
}

/* The flat index numpy broadcasting reads from an operand of shape (ndim, shape)
 * for index idx of an out_ndim-dimensional result. */
static int64_t broadcast_ravel(int out_ndim, const int64_t *idx, int ndim, const int64_t *shape)
{
    int64_t i = 0;
    for (int d = 0; d < ndim; d++)
        i = i * shape[d] + (shape[d] == 1 ? 0 : idx[out_ndim - ndim + d]);
    return i;
}

/* numpy's broadcast of two compatible shapes; returns the result's ndim. */
static int broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int64_t *out)
{
    int n = na > nb ? na : nb;
    for (int d = 0; d < n; d++) {
        int64_t x = d >= n - na ? a[d - (n - na)] : 1;
        int64_t y = d >= n - nb ? b[d - (n - nb)] : 1;
        out[d] = x == 1 ? y : x;
    }
    return n;
}

static const char *fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ",%lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

/* -- Expectations ------------------------------------------------------------ */

static bool close_enough(double got, double ref, tolerance tl, double slack)
{
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return got == ref;
    return fabs(got - ref) <= tl.rel * fabs(ref) + tl.abs + slack;
}

static void expect_shape(const kiln_tensor *t, int ndim, const int64_t *shape, const char *what)
{
    bool same = kiln_ndim(t) == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = kiln_shape(t)[d] == shape[d];
    char got[128], want[128];
    ck_assert_msg(same, "%s: shape %s, want %s", what,
                  fmt_shape(got, sizeof got, kiln_ndim(t), kiln_shape(t)),
                  fmt_shape(want, sizeof want, ndim, shape));
}

static void expect_strides(const kiln_tensor *t, const int64_t *strides, const char *what)
{
    char got[128], want[128];
    int ndim = kiln_ndim(t);
    ck_assert_msg(memcmp(kiln_strides(t), strides, sizeof *strides * (size_t)ndim) == 0,
                  "%s: strides %s, want %s", what,
                  fmt_shape(got, sizeof got, ndim, kiln_strides(t)),
                  fmt_shape(want, sizeof want, ndim, strides));
}

/* Asserts that t is a tensor of dtype dt and shape (ndim, shape) whose values are
 * within tl (plus slack[i] where slack is given) of ref. what names the case. */
static void expect_values(kiln_tensor *t, kiln_dtype dt, int ndim, const int64_t *shape,
                          const double *ref, tolerance tl, const double *slack, const char *what)
{
    ck_assert_msg(t != NULL, "%s failed: %s", what, kiln_last_error());
    ck_assert_msg(kiln_dtype_of(t) == dt, "%s: dtype %s, want %s", what,
                  dt_name(kiln_dtype_of(t)), dt_name(dt));
    expect_shape(t, ndim, shape, what);
    int64_t n = numel_of(ndim, shape), bad = -1;
    double *got = test_values(t);
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (!close_enough(got[i], ref[i], tl, slack ? slack[i] : 0))
            bad = i;
    double g = bad >= 0 ? got[bad] : 0, r = bad >= 0 ? ref[bad] : 0;
    free(got);
    ck_assert_msg(bad < 0, "%s: element %lld is %.17g, want %.17g", what, (long long)bad, g, r);
}

static void expect_exact(kiln_tensor *t, kiln_dtype dt, int ndim, const int64_t *shape,
                         const double *ref, const char *what)
{
    expect_values(t, dt, ndim, shape, ref, EXACT, NULL, what);
}

/* expect_exact, and each zero with ref's sign. */
static void expect_signed(kiln_tensor *t, kiln_dtype dt, int ndim, const int64_t *shape, const double *ref,
                          const char *what)
{
    expect_exact(t, dt, ndim, shape, ref, what);
    double *got = test_values(t);
    int64_t bad = -1;
    for (int64_t i = 0; i < numel_of(ndim, shape) && bad < 0; i++)
        if (ref[i] == 0 && !signbit(got[i]) != !signbit(ref[i]))
            bad = i;
    free(got);
    ck_assert_msg(bad < 0, "%s: element %lld has the wrong sign of zero", what, (long long)bad);
}

/* For i64 values beyond 2^53, which test_values' doubles cannot hold. */
static void expect_i64(kiln_tensor *t, int ndim, const int64_t *shape, const int64_t *ref,
                       const char *what)
{
    ck_assert_msg(t != NULL, "%s failed: %s", what, kiln_last_error());
    ck_assert_msg(kiln_dtype_of(t) == KILN_I64, "%s: dtype %s, want i64", what,
                  dt_name(kiln_dtype_of(t)));
    expect_shape(t, ndim, shape, what);
    int64_t n = numel_of(ndim, shape), got[MAX_ELEMS];
    ck_assert_int_eq(kiln_copy_to_host(t, got, sizeof *got * (size_t)n), 0);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == ref[i], "%s: element %lld is %lld, want %lld", what, (long long)i,
                      (long long)got[i], (long long)ref[i]);
}

/* -- Operands ---------------------------------------------------------------- */

/* splitmix64: a tiny deterministic source of test inputs. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double next_unit(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) * 0x1p-53;
}

/* Where inputs are drawn from: [lo, hi]; whole numbers for integer dtypes;
 * multiples of quantum for floats when quantum > 0 (so that ties happen); and
 * with nonzero, |x| >= 0.5 for floats, x != 0 for integers, true for bool. */
typedef struct {
    double lo, hi, quantum;
    bool nonzero;
} domain;

#define SPAN(lo, hi) {(lo), (hi), 0, false}
#define NONZERO(lo, hi) {(lo), (hi), 0, true}

/* SPAN where an expression is wanted. */
static domain span(double lo, double hi)
{
    return (domain)SPAN(lo, hi);
}

static double draw(kiln_dtype dt, domain dom, uint64_t *s)
{
    for (;;) {
        double x;
        if (dt == KILN_BOOL) {
            x = next_unit(s) < 0.5;
        } else if (!is_float(dt)) {
            double lo = ceil(dom.lo), hi = floor(dom.hi);
            x = lo + floor(next_unit(s) * (hi - lo + 1));
        } else {
            x = dom.lo + (dom.hi - dom.lo) * next_unit(s);
            if (dom.quantum > 0)
                x = round(x / dom.quantum) * dom.quantum;
            x = round_to(dt, x);
        }
        if (!dom.nonzero || fabs(x) >= (is_float(dt) ? 0.5 : 1))
            return x;
    }
}

/* How an operand sits in memory (opcheck.h's layouts). Every layout shows
 * the same logical values; BROADCAST needs v constant along axis 0. */
typedef oc_layout layout;
#define CONTIG OC_CONTIG
#define BROADCAST OC_BROADCAST
#define N_LAYOUTS OC_LAYOUTS
#define LAYOUT_NAMES oc_layout_names

static kiln_tensor *make_view(kiln_dtype dt, layout lay, int ndim, const int64_t *shape, const double *v)
{
    return oc_tensor(dt, lay, ndim, shape, v);
}

/* A contiguous tensor of dtype dt holding v. */
static kiln_tensor *tensor_of(kiln_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    return make_view(dt, CONTIG, ndim, shape, v);
}

/* A contiguous tensor holding 0, 1, 2, ... */
static kiln_tensor *iota(kiln_dtype dt, int ndim, const int64_t *shape)
{
    double v[MAX_ELEMS];
    for (int64_t i = 0; i < numel_of(ndim, shape); i++)
        v[i] = (double)i;
    return tensor_of(dt, ndim, shape, v);
}

/* An op input: the tensor in some layout, and its logical values for the reference. */
typedef oc_operand operand;

/* Fills op with values drawn from dom (the same for the same seed) and builds its
 * tensor in layout lay. The tensor belongs to the current scope. */
static void operand_init(operand *op, kiln_dtype dt, layout lay, int ndim, const int64_t *shape,
                         domain dom, uint64_t seed)
{
    if (ndim == 0)
        lay = CONTIG;
    op->dt = dt;
    op->ndim = ndim;
    if (ndim > 0)
        memcpy(op->shape, shape, sizeof *shape * (size_t)ndim);
    op->numel = numel_of(ndim, shape);
    ck_assert(op->numel <= MAX_ELEMS);
    /* A broadcast operand repeats along axis 0, so only its first slice is drawn. */
    int64_t period = lay == BROADCAST ? op->numel / shape[0] : op->numel;
    uint64_t state = seed * 7919 + 17;
    for (int64_t i = 0; i < op->numel; i++)
        op->v[i] = i < period ? draw(dt, dom, &state) : op->v[i % period];
    char sh[96];
    snprintf(op->desc, sizeof op->desc, "%s %s %s", dt_name(dt), LAYOUT_NAMES[lay],
             fmt_shape(sh, sizeof sh, ndim, shape));
    op->t = make_view(dt, lay, ndim, shape, op->v);
    ck_assert_msg(op->t != NULL, "building %s: %s", op->desc, kiln_last_error());
}

/* The value of op that broadcasting puts at index idx of an out_ndim-d result. */
static double at(const operand *op, int out_ndim, const int64_t *idx)
{
    return op->v[broadcast_ravel(out_ndim, idx, op->ndim, op->shape)];
}

/* -- Fixture ----------------------------------------------------------------- */
/* Each test runs in a scope, so it frees what it makes; the live-tensor count
 * must come back to where it started. */

static int64_t live_at_start;

static void scope_setup(void)
{
    live_at_start = kiln_live_tensors();
    kiln_scope_begin();
}

static void scope_teardown(void)
{
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live_at_start);
}

/* -- Binary ops -------------------------------------------------------------- */

static double ref_add(double x, double y) { return x + y; }
static double ref_sub(double x, double y) { return x - y; }
static double ref_mul(double x, double y) { return x * y; }
static double ref_div(double x, double y) { return x / y; }
static double ref_maximum(double x, double y) { return isnan(x) || isnan(y) ? NAN : x > y ? x : y; }
static double ref_minimum(double x, double y) { return isnan(x) || isnan(y) ? NAN : x < y ? x : y; }

/* Integer references wrap like two's complement without signed overflow. */
static int64_t iref_add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
static int64_t iref_sub(int64_t x, int64_t y) { return (int64_t)((uint64_t)x - (uint64_t)y); }
static int64_t iref_mul(int64_t x, int64_t y) { return (int64_t)((uint64_t)x * (uint64_t)y); }
static int64_t iref_max(int64_t x, int64_t y) { return x > y ? x : y; }
static int64_t iref_min(int64_t x, int64_t y) { return x < y ? x : y; }

static int64_t iref_pow(int64_t x, int64_t y)
{
    uint64_t r = 1;
    for (int64_t k = 0; k < y; k++)
        r *= (uint64_t)x;
    return (int64_t)r;
}

typedef struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
    kiln_tensor *(*fn_scalar)(kiln_tensor *, double);
    double (*fref)(double, double);    /* in f64, rounded to the result dtype after */
    int64_t (*iref)(int64_t, int64_t); /* exact, wrapped to the result dtype after */
    bool true_division;                /* div: integer operands give f32 */
    bool bool_ok;                      /* sub and pow refuse bool */
    bool transcendental;               /* pow's float results get F*_TRANS */
    domain a, b;                       /* inputs when the result is a float */
    domain ai, bi;                     /* inputs when the result is an integer */
} binary_op;

static const binary_op BINARY_OPS[] = {
    {"add", kiln_add, kiln_add_scalar, ref_add, iref_add, false, true, false,
     SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10)},
    {"sub", kiln_sub, kiln_sub_scalar, ref_sub, iref_sub, false, false, false,
     SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10)},
    {"mul", kiln_mul, kiln_mul_scalar, ref_mul, iref_mul, false, true, false,
     SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10)},
    {"div", kiln_div, kiln_div_scalar, ref_div, NULL, true, true, false,
     SPAN(-10, 10), NONZERO(-10, 10), SPAN(-10, 10), NONZERO(-10, 10)},
    /* Float powers of positive bases stay real; integer powers need y >= 0. */
    {"pow", kiln_pow, kiln_pow_scalar, pow, iref_pow, false, false, true,
     SPAN(0.25, 4), SPAN(-2, 3), SPAN(-3, 4), SPAN(0, 4)},
    {"maximum", kiln_maximum, kiln_maximum_scalar, ref_maximum, iref_max, false, true, false,
     SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10)},
    {"minimum", kiln_minimum, kiln_minimum_scalar, ref_minimum, iref_min, false, true, false,
     SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10), SPAN(-10, 10)},
};

static kiln_dtype binary_result(const binary_op *op, kiln_dtype a, kiln_dtype b)
{
    kiln_dtype r = promote(a, b);
    return op->true_division && !is_float(r) ? KILN_F32 : r;
}

/* Integer results are computed exactly; on bools add, mul, maximum and minimum
 * act as or, and, or, and, which is iref's result != 0. */
static double binary_ref(const binary_op *op, kiln_dtype res, double x, double y)
{
    if (is_float(res))
        return round_to(res, op->fref(x, y));
    return wrap_to(res, op->iref((int64_t)x, (int64_t)y));
}

static tolerance result_tol(kiln_dtype res, bool transcendental)
{
    return is_float(res) ? float_tol(res, transcendental) : EXACT;
}

/* Shapes of binary operands: equal, broadcast both ways, lower rank. */
static const struct {
    int na;
    int64_t a[3];
    int nb;
    int64_t b[3];
} BINARY_SHAPES[] = {
    {2, {2, 3}, 2, {2, 3}},
    {3, {4, 1, 3}, 2, {5, 1}},
    {2, {3, 4}, 1, {4}},
    {2, {2, 1}, 2, {2, 4}},
};

/* Each dtype pair is tried with every shape pair in every pair of layouts. */
#define N_BINARY_CASES (COUNT(BINARY_SHAPES) * N_LAYOUTS * N_LAYOUTS)

/* Builds case k of N_BINARY_CASES: operands a and b of dtypes da and db. */
static void binary_case(int k, operand *a, kiln_dtype da, domain doma, operand *b, kiln_dtype db,
                        domain domb, uint64_t seed)
{
    int s = k / (N_LAYOUTS * N_LAYOUTS);
    layout la = (layout)(k / N_LAYOUTS % N_LAYOUTS), lb = (layout)(k % N_LAYOUTS);
    operand_init(a, da, la, BINARY_SHAPES[s].na, BINARY_SHAPES[s].a, doma, seed);
    operand_init(b, db, lb, BINARY_SHAPES[s].nb, BINARY_SHAPES[s].b, domb, seed + 1);
}

static void check_binary(const binary_op *op, const operand *a, const operand *b)
{
    kiln_dtype res = binary_result(op, a->dt, b->dt);
    int64_t shape[KILN_MAX_DIMS], idx[KILN_MAX_DIMS];
    int ndim = broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, shape);
    double ref[MAX_ELEMS];
    for (int64_t i = 0; i < numel_of(ndim, shape); i++) {
        unravel(i, ndim, shape, idx);
        ref[i] = binary_ref(op, res, at(a, ndim, idx), at(b, ndim, idx));
    }
    char what[320];
    snprintf(what, sizeof what, "%s(%s, %s)", op->name, a->desc, b->desc);
    expect_values(op->fn(a->t, b->t), res, ndim, shape, ref, result_tol(res, op->transcendental),
                  NULL, what);
}

/* Every dtype pair, shape pair and pair of layouts. */
START_TEST(test_binary)
{
    const binary_op *op = &BINARY_OPS[_i];
    uint64_t seed = 1000 * (uint64_t)_i;
    for (int i = 0; i < COUNT(DTYPES); i++) {
        for (int j = 0; j < COUNT(DTYPES); j++) {
            kiln_dtype da = DTYPES[i], db = DTYPES[j];
            if (!op->bool_ok && (da == KILN_BOOL || db == KILN_BOOL))
                continue;
            bool float_res = is_float(binary_result(op, da, db));
            for (int k = 0; k < N_BINARY_CASES; k++) {
                kiln_scope_begin();
                operand a, b;
                binary_case(k, &a, da, float_res ? op->a : op->ai, &b, db,
                            float_res ? op->b : op->bi, seed += 2);
                check_binary(op, &a, &b);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* Floats keep their dtype; integers keep theirs for a whole b, else become f32;
 * div is true division, so integers always give f32. */
static kiln_dtype scalar_result(const binary_op *op, kiln_dtype dt, double b)
{
    if (is_float(dt))
        return dt;
    return op->true_division || b != floor(b) ? KILN_F32 : dt;
}

START_TEST(test_binary_scalar)
{
    const binary_op *op = &BINARY_OPS[_i];
    static const double SCALARS[] = {2.0, -3.0, 2.5, 0.1};
    /* pow: no negative whole exponents, which integers cannot take. */
    static const double POW_SCALARS[] = {2.0, 3.0, 0.5, -1.5};
    const double *scalars = op->fn_scalar == kiln_pow_scalar ? POW_SCALARS : SCALARS;
    static const int64_t SHAPE[] = {3, 4};
    static const kiln_dtype NUMERIC[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
    uint64_t seed = 5000 + 100 * (uint64_t)_i;
    for (int i = 0; i < COUNT(NUMERIC); i++) {
        for (int lay = 0; lay < N_LAYOUTS; lay++) {
            for (int k = 0; k < 4; k++) {
                kiln_scope_begin();
                double s = scalars[k];
                kiln_dtype res = scalar_result(op, NUMERIC[i], s);
                operand a;
                operand_init(&a, NUMERIC[i], (layout)lay, 2, SHAPE, is_float(res) ? op->a : op->ai,
                             seed++);
                double ref[MAX_ELEMS];
                for (int64_t e = 0; e < a.numel; e++)
                    ref[e] = binary_ref(op, res, a.v[e], s);
                char what[256];
                snprintf(what, sizeof what, "%s_scalar(%s, %g)", op->name, a.desc, s);
                expect_values(op->fn_scalar(a.t, s), res, 2, SHAPE, ref,
                              result_tol(res, op->transcendental), NULL, what);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* A 0-d operand only raises the category (PyTorch): the dims tensor's dtype wins
 * within a category, and an integer tensor meeting a 0-d float takes its dtype. */
START_TEST(test_zero_dim_promotion)
{
    static const struct {
        kiln_dtype a;
        int a_ndim;
        kiln_dtype b;
        int b_ndim;
        kiln_dtype want;
    } CASES[] = {
        {KILN_I32, 2, KILN_F64, 0, KILN_F64},
        {KILN_F64, 2, KILN_F32, 0, KILN_F64},
        {KILN_I32, 2, KILN_F32, 0, KILN_F32},
        {KILN_F32, 2, KILN_F64, 0, KILN_F32},
        {KILN_I32, 2, KILN_I64, 0, KILN_I32},
        {KILN_I64, 2, KILN_I32, 0, KILN_I64},
        {KILN_F32, 2, KILN_I64, 0, KILN_F32},
        {KILN_I32, 0, KILN_F64, 2, KILN_F64}, /* the 0-d operand may come first */
        {KILN_F32, 0, KILN_F64, 0, KILN_F64}, /* two 0-d operands promote as usual */
        {KILN_I32, 0, KILN_I64, 0, KILN_I64},
    };
    static const int64_t SHAPE[] = {2, 3};
    const binary_op *add = &BINARY_OPS[0], *mul = &BINARY_OPS[2];
    for (int c = 0; c < COUNT(CASES); c++) {
        operand a, b;
        uint64_t seed = 7 * (uint64_t)c;
        operand_init(&a, CASES[c].a, CONTIG, CASES[c].a_ndim, SHAPE, span(-10, 10), seed);
        operand_init(&b, CASES[c].b, CONTIG, CASES[c].b_ndim, SHAPE, span(-10, 10), seed + 1);
        const binary_op *ops[] = {add, mul};
        for (int k = 0; k < 2; k++) {
            int64_t shape[KILN_MAX_DIMS], idx[KILN_MAX_DIMS];
            int ndim = broadcast_shapes(a.ndim, a.shape, b.ndim, b.shape, shape);
            double ref[MAX_ELEMS];
            for (int64_t i = 0; i < numel_of(ndim, shape); i++) {
                unravel(i, ndim, shape, idx);
                ref[i] = binary_ref(ops[k], CASES[c].want, at(&a, ndim, idx), at(&b, ndim, idx));
            }
            char what[320];
            snprintf(what, sizeof what, "%s(%s %dd, %s %dd)", ops[k]->name, dt_name(CASES[c].a),
                     CASES[c].a_ndim, dt_name(CASES[c].b), CASES[c].b_ndim);
            expect_values(ops[k]->fn(a.t, b.t), CASES[c].want, ndim, shape, ref,
                          result_tol(CASES[c].want, false), NULL, what);
        }
    }

    /* kiln_scalar is a 0-d f32: an f64 tensor stays f64 and sees (float)0.1. */
    static const double X[] = {1.0, -2.5, 1e10};
    kiln_tensor *x = tensor_of(KILN_F64, 1, (int64_t[]){3}, X);
    double ref[3];
    for (int i = 0; i < 3; i++)
        ref[i] = X[i] + (double)(float)0.1;
    expect_values(kiln_add(x, kiln_scalar(0.1)), KILN_F64, 1, (int64_t[]){3}, ref, F64_ARITH, NULL,
                  "add(f64 [3], kiln_scalar(0.1))");

    /* Comparing i32 with a 0-d 2.5 compares in f32, not with 2.5 cut to 2. */
    kiln_tensor *n = tensor_of(KILN_I32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    expect_exact(kiln_lt(n, kiln_scalar(2.5)), KILN_BOOL, 1, (int64_t[]){3}, (double[]){1, 1, 0},
                 "lt(i32 [1,2,3], kiln_scalar(2.5))");
    kiln_tensor *cond = tensor_of(KILN_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1});
    expect_exact(kiln_where(cond, n, kiln_scalar(0.5)), KILN_F32, 1, (int64_t[]){3},
                 (double[]){1, 0.5, 3}, "where(bool, i32, kiln_scalar(0.5))");
}
END_TEST

/* Integer overflow wraps. */
START_TEST(test_add_i32_wraps)
{
    static const int64_t SHAPE[] = {3};
    kiln_tensor *a = tensor_of(KILN_I32, 1, SHAPE, (double[]){INT32_MAX, INT32_MIN, 5});
    kiln_tensor *b = tensor_of(KILN_I32, 1, SHAPE, (double[]){1, -1, 0});
    expect_exact(kiln_add(a, b), KILN_I32, 1, SHAPE, (double[]){INT32_MIN, INT32_MAX, 5},
                 "add(i32 [INT32_MAX, INT32_MIN, 5], [1, -1, 0])");
}
END_TEST

/* On two bools add is or and mul is and (covered by test_binary); sub and pow refuse. */
START_TEST(test_bool_arithmetic_refusals)
{
    static const int64_t SHAPE[] = {2};
    kiln_tensor *a = tensor_of(KILN_BOOL, 1, SHAPE, (double[]){1, 0});
    ck_assert_ptr_null(kiln_sub(a, a));
    ck_assert_kiln_error("kiln_sub");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_pow(a, a));
    ck_assert_kiln_error("kiln_pow");
    kiln_clear_error();
}
END_TEST

/* True division by zero gives IEEE infinities and NaN, also for integers. */
START_TEST(test_div_by_zero)
{
    static const int64_t SHAPE[] = {3};
    static const double NUM[] = {1, -1, 0}, WANT[] = {INFINITY, -INFINITY, NAN};
    static const kiln_dtype DTS[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
    for (int i = 0; i < COUNT(DTS); i++) {
        kiln_tensor *a = tensor_of(DTS[i], 1, SHAPE, NUM);
        kiln_tensor *z = kiln_zeros(DTS[i], 1, SHAPE);
        char what[64];
        snprintf(what, sizeof what, "div(%s [1,-1,0], 0)", dt_name(DTS[i]));
        kiln_dtype res = is_float(DTS[i]) ? DTS[i] : KILN_F32;
        expect_exact(kiln_div(a, z), res, 1, SHAPE, WANT, what);
        expect_exact(kiln_div_scalar(a, 0.0), res, 1, SHAPE, WANT, what);
    }
}
END_TEST

/* maximum and minimum propagate NaN from either side, and from a NaN scalar. */
START_TEST(test_maximum_minimum_nan)
{
    static const int64_t SHAPE[] = {4};
    static const double A[] = {NAN, 1, NAN, 2}, B[] = {1, NAN, NAN, 3};
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *a = tensor_of(dt, 1, SHAPE, A), *b = tensor_of(dt, 1, SHAPE, B);
        expect_exact(kiln_maximum(a, b), dt, 1, SHAPE, (double[]){NAN, NAN, NAN, 3}, "maximum NaN");
        expect_exact(kiln_minimum(a, b), dt, 1, SHAPE, (double[]){NAN, NAN, NAN, 2}, "minimum NaN");
        expect_exact(kiln_maximum_scalar(a, 1.5), dt, 1, SHAPE, (double[]){NAN, 1.5, NAN, 2},
                     "maximum_scalar NaN tensor");
        expect_exact(kiln_minimum_scalar(a, 1.5), dt, 1, SHAPE, (double[]){NAN, 1, NAN, 1.5},
                     "minimum_scalar NaN tensor");
        expect_exact(kiln_maximum_scalar(b, NAN), dt, 1, SHAPE, (double[]){NAN, NAN, NAN, NAN},
                     "maximum_scalar(x, NaN)");
        expect_exact(kiln_minimum_scalar(b, NAN), dt, 1, SHAPE, (double[]){NAN, NAN, NAN, NAN},
                     "minimum_scalar(x, NaN)");
    }
}
END_TEST

/* PyTorch's signs of zero (its scalar loop's: std::max and std::min, and
 * clamp_min for relu): of two equal operands maximum and minimum give the
 * first, at every position of a long tensor; relu keeps -0. -0.0 as a scalar
 * is a float, as only a Python float can be: i32 / -0.0 is -inf for 3. */
START_TEST(test_signed_zeros)
{
    enum { N = 100 };
    const int64_t n = N, three = 3;
    double neg[N], pos[N];
    for (int i = 0; i < N; i++) {
        neg[i] = -0.0;
        pos[i] = 0.0;
    }
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *a = tensor_of(dt, 1, &n, neg), *b = tensor_of(dt, 1, &n, pos);
        expect_signed(kiln_maximum(a, b), dt, 1, &n, neg, "maximum(-0, +0)");
        expect_signed(kiln_maximum(b, a), dt, 1, &n, pos, "maximum(+0, -0)");
        expect_signed(kiln_minimum(a, b), dt, 1, &n, neg, "minimum(-0, +0)");
        expect_signed(kiln_minimum(b, a), dt, 1, &n, pos, "minimum(+0, -0)");
        expect_signed(kiln_maximum_scalar(a, 0.0), dt, 1, &n, neg, "maximum_scalar(-0, 0.0)");
        expect_signed(kiln_minimum_scalar(b, -0.0), dt, 1, &n, pos, "minimum_scalar(+0, -0.0)");
        expect_signed(kiln_relu(a), dt, 1, &n, neg, "relu(-0)");
        expect_signed(kiln_relu(tensor_of(dt, 1, &three, (const double[]){-2, NAN, 3})), dt, 1, &three,
                      (const double[]){0, NAN, 3}, "relu(-2, NaN, 3)");
    }
    kiln_tensor *ints = tensor_of(KILN_I32, 1, &three, (const double[]){3, -3, 0});
    expect_signed(kiln_div_scalar(ints, -0.0), KILN_F32, 1, &three, (const double[]){-INFINITY, INFINITY, NAN},
                  "i32 / -0.0");
    expect_signed(kiln_add_scalar(ints, -0.0), KILN_F32, 1, &three, (const double[]){3, -3, 0}, "i32 + -0.0");
}
END_TEST

/* -- Comparisons and where ---------------------------------------------------- */

static bool ref_eq(double x, double y) { return x == y; }
static bool ref_ne(double x, double y) { return x != y; }
static bool ref_lt(double x, double y) { return x < y; }
static bool ref_le(double x, double y) { return x <= y; }
static bool ref_gt(double x, double y) { return x > y; }
static bool ref_ge(double x, double y) { return x >= y; }

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
    bool (*ref)(double, double);
} COMPARE_OPS[] = {
    {"eq", kiln_eq, ref_eq}, {"ne", kiln_ne, ref_ne}, {"lt", kiln_lt, ref_lt},
    {"le", kiln_le, ref_le}, {"gt", kiln_gt, ref_gt}, {"ge", kiln_ge, ref_ge},
};

/* Few distinct values, so that equal pairs are common. The values are exact in
 * every dtype, so comparing the promoted values is comparing these doubles. */
static const domain COMPARE_DOMAIN = {-2, 2, 0.5, false};

static void check_compare(int which, const operand *a, const operand *b)
{
    int64_t shape[KILN_MAX_DIMS], idx[KILN_MAX_DIMS];
    int ndim = broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, shape);
    double ref[MAX_ELEMS];
    for (int64_t e = 0; e < numel_of(ndim, shape); e++) {
        unravel(e, ndim, shape, idx);
        ref[e] = COMPARE_OPS[which].ref(at(a, ndim, idx), at(b, ndim, idx));
    }
    char what[320];
    snprintf(what, sizeof what, "%s(%s, %s)", COMPARE_OPS[which].name, a->desc, b->desc);
    expect_exact(COMPARE_OPS[which].fn(a->t, b->t), KILN_BOOL, ndim, shape, ref, what);
}

START_TEST(test_compare)
{
    uint64_t seed = 20000 + 1000 * (uint64_t)_i;
    for (int i = 0; i < COUNT(DTYPES); i++) {
        for (int j = 0; j < COUNT(DTYPES); j++) {
            for (int k = 0; k < N_BINARY_CASES; k++) {
                kiln_scope_begin();
                operand a, b;
                binary_case(k, &a, DTYPES[i], COMPARE_DOMAIN, &b, DTYPES[j], COMPARE_DOMAIN,
                            seed += 2);
                check_compare(_i, &a, &b);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* NaN is unordered: only ne holds. */
START_TEST(test_compare_nan)
{
    static const int64_t SHAPE[] = {3};
    static const double X[] = {NAN, NAN, 1}, Y[] = {NAN, 1, NAN};
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *x = tensor_of(dt, 1, SHAPE, X), *y = tensor_of(dt, 1, SHAPE, Y);
        for (int c = 0; c < COUNT(COMPARE_OPS); c++) {
            bool ne = COMPARE_OPS[c].fn == kiln_ne;
            double want[3] = {ne, ne, ne};
            char what[64];
            snprintf(what, sizeof what, "%s with NaN (%s)", COMPARE_OPS[c].name, dt_name(dt));
            expect_exact(COMPARE_OPS[c].fn(x, y), KILN_BOOL, 1, SHAPE, want, what);
        }
    }
}
END_TEST

static void check_where(const operand *c, const operand *a, const operand *b)
{
    kiln_dtype res = promote(a->dt, b->dt);
    int64_t ab[KILN_MAX_DIMS], shape[KILN_MAX_DIMS], idx[KILN_MAX_DIMS];
    int nab = broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, ab);
    int ndim = broadcast_shapes(c->ndim, c->shape, nab, ab, shape);
    double ref[MAX_ELEMS];
    for (int64_t e = 0; e < numel_of(ndim, shape); e++) {
        unravel(e, ndim, shape, idx);
        ref[e] = round_to(res, at(c, ndim, idx) != 0 ? at(a, ndim, idx) : at(b, ndim, idx));
    }
    char what[400];
    snprintf(what, sizeof what, "where(%s, %s, %s)", c->desc, a->desc, b->desc);
    expect_exact(kiln_where(c->t, a->t, b->t), res, ndim, shape, ref, what);
}

/* Every dtype pair for a and b, with the layouts of cond, a and b varied together. */
START_TEST(test_where)
{
    static const struct {
        int nc, na, nb;
        int64_t c[3], a[3], b[3];
    } SHAPES[] = {
        {3, 2, 1, {4, 1, 3}, {5, 1}, {3}}, /* all three broadcast to [4,5,3] */
        {2, 2, 2, {2, 3}, {2, 3}, {2, 3}},
    };
    uint64_t seed = 40000;
    for (int i = 0; i < COUNT(DTYPES); i++) {
        for (int j = 0; j < COUNT(DTYPES); j++) {
            for (int s = 0; s < COUNT(SHAPES); s++) {
                for (int k = 0; k < N_LAYOUTS * N_LAYOUTS; k++) {
                    kiln_scope_begin();
                    layout lc = (layout)(k / N_LAYOUTS), la = (layout)(k % N_LAYOUTS);
                    layout lb = (layout)((lc + la) % N_LAYOUTS);
                    operand c, a, b;
                    domain values = span(-10, 10);
                    operand_init(&c, KILN_BOOL, lc, SHAPES[s].nc, SHAPES[s].c, values, seed++);
                    operand_init(&a, DTYPES[i], la, SHAPES[s].na, SHAPES[s].a, values, seed++);
                    operand_init(&b, DTYPES[j], lb, SHAPES[s].nb, SHAPES[s].b, values, seed++);
                    check_where(&c, &a, &b);
                    kiln_scope_end();
                }
            }
        }
    }
}
END_TEST

/* -- Unary ops --------------------------------------------------------------- */

static double ref_neg(double x) { return -x; }
static double ref_rsqrt(double x) { return 1 / sqrt(x); }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_relu(double x) { return isnan(x) ? x : x > 0 ? x : 0; }

typedef struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *);
    double (*ref)(double);
    domain dom;       /* where the op is defined and well conditioned */
    bool keeps_dtype; /* neg, abs, relu: exact, same dtype, refuse bool */
} unary_op;

static const unary_op UNARY_OPS[] = {
    {"neg", kiln_neg, ref_neg, SPAN(-10, 10), true},
    {"abs", kiln_abs, fabs, SPAN(-10, 10), true},
    {"exp", kiln_exp, exp, SPAN(-5, 5), false},
    {"log", kiln_log, log, SPAN(0.05, 10), false},
    {"sqrt", kiln_sqrt, sqrt, SPAN(0, 10), false},
    {"rsqrt", kiln_rsqrt, ref_rsqrt, SPAN(0.05, 10), false},
    {"tanh", kiln_tanh, tanh, SPAN(-4, 4), false},
    {"sigmoid", kiln_sigmoid, ref_sigmoid, SPAN(-8, 8), false},
    {"relu", kiln_relu, ref_relu, SPAN(-5, 5), true},
    {"sin", kiln_sin, sin, SPAN(-6, 6), false},
    {"cos", kiln_cos, cos, SPAN(-6, 6), false},
    {"erf", kiln_erf, erf, SPAN(-3, 3), false},
};

static kiln_dtype unary_result(const unary_op *op, kiln_dtype dt)
{
    return op->keeps_dtype || is_float(dt) ? dt : KILN_F32;
}

static tolerance unary_tol(const unary_op *op, kiln_dtype res)
{
    return op->keeps_dtype ? EXACT : float_tol(res, true);
}

START_TEST(test_unary)
{
    const unary_op *op = &UNARY_OPS[_i];
    static const struct {
        int ndim;
        int64_t shape[3];
    } SHAPES[] = {{2, {3, 5}}, {3, {2, 2, 3}}, {0, {0}}};
    uint64_t seed = 60000 + 1000 * (uint64_t)_i;
    for (int i = 0; i < COUNT(DTYPES); i++) {
        kiln_dtype dt = DTYPES[i], res = unary_result(op, dt);
        if (op->keeps_dtype && dt == KILN_BOOL) {
            kiln_tensor *b = kiln_ones(KILN_BOOL, 1, (int64_t[]){2});
            ck_assert_msg(op->fn(b) == NULL, "%s accepted bool", op->name);
            kiln_clear_error();
            continue;
        }
        for (int s = 0; s < COUNT(SHAPES); s++) {
            for (int lay = 0; lay < N_LAYOUTS; lay++) {
                kiln_scope_begin();
                operand a;
                operand_init(&a, dt, (layout)lay, SHAPES[s].ndim, SHAPES[s].shape, op->dom, seed++);
                double ref[MAX_ELEMS];
                for (int64_t e = 0; e < a.numel; e++)
                    ref[e] = round_to(res, op->ref(a.v[e]));
                char what[256];
                snprintf(what, sizeof what, "%s(%s)", op->name, a.desc);
                expect_values(op->fn(a.t), res, a.ndim, a.shape, ref, unary_tol(op, res), NULL,
                              what);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* Zeros, infinities, NaN and extremes follow libm (rsqrt(-0) = 1/-0 = -inf). */
START_TEST(test_unary_special_values)
{
    static const double SPECIAL[] = {0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 100.0, -100.0,
                                     INFINITY, -INFINITY, NAN};
    int64_t n = COUNT(SPECIAL);
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *x = tensor_of(dt, 1, &n, SPECIAL);
        for (int o = 0; o < COUNT(UNARY_OPS); o++) {
            const unary_op *op = &UNARY_OPS[o];
            double ref[COUNT(SPECIAL)];
            for (int64_t e = 0; e < n; e++)
                ref[e] = round_to(dt, op->ref(round_to(dt, SPECIAL[e])));
            char what[64];
            snprintf(what, sizeof what, "%s(%s special values)", op->name, dt_name(dt));
            expect_values(op->fn(x), dt, 1, &n, ref, unary_tol(op, dt), NULL, what);
        }
    }
}
END_TEST

/* -- Cast -------------------------------------------------------------------- */
/* Inputs per source dtype chosen for rounding, truncation toward zero,
 * saturation, NaN, infinities, -0 and values that do not fit the target. */

static const float CAST_F32[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.7f, -1.7f, 2.5f, -123.9f,
                                 16777216.0f, 3e9f, -3e9f, 1e20f, -1e20f,
                                 INFINITY, -INFINITY, NAN};
static const double CAST_F64[] = {0.0, -0.0, 0.1, -0.5, 1.7, -1.7, 2147483647.9, -2147483648.9,
                                  2147483648.0, -2147483649.0, 1e-50, 1e300, -1e300, 9.3e18,
                                  -9.3e18, INFINITY, -INFINITY, NAN};
static const int32_t CAST_I32[] = {0, 1, -1, 7, -123, 16777217, INT32_MAX, INT32_MIN};
static const int64_t CAST_I64[] = {0, 1, -1, 7, -123, INT32_MAX, INT32_MIN,
                                   (int64_t)INT32_MAX + 1, (INT64_C(1) << 40) + 1,
                                   (INT64_C(1) << 53) + 1, INT64_MAX, INT64_MIN};
static const uint8_t CAST_BOOL[] = {0, 1, 1, 0};

static const struct {
    kiln_dtype dt;
    int64_t n;
    const void *data;
} CAST_INPUTS[] = {
    {KILN_F32, COUNT(CAST_F32), CAST_F32}, {KILN_F64, COUNT(CAST_F64), CAST_F64},
    {KILN_I32, COUNT(CAST_I32), CAST_I32}, {KILN_I64, COUNT(CAST_I64), CAST_I64},
    {KILN_BOOL, COUNT(CAST_BOOL), CAST_BOOL},
};

/* x truncated toward zero into [lo, hi]; NaN gives 0. */
static int64_t saturate(double x, int64_t lo, int64_t hi)
{
    if (isnan(x))
        return 0;
    double t = trunc(x);
    if (t >= -(double)lo) /* -lo is hi + 1, exact as a double for both widths */
        return hi;
    if (t < (double)lo)
        return lo;
    return (int64_t)t;
}

/* What kiln_cast gives for element i of src data p, per kiln.h and C's own
 * conversions: *iv for integer and bool targets, *fv for floats. False where
 * kiln.h leaves the result open: integers narrowed to i32 out of its range. */
static bool cast_ref(kiln_dtype src, const void *p, int64_t i, kiln_dtype dst, int64_t *iv,
                     double *fv)
{
    bool from_float = is_float(src);
    double x = from_float ? raw_double(src, p, i) : 0;
    int64_t k = from_float ? 0 : raw_int(src, p, i);
    switch (dst) {
    case KILN_F32: *fv = from_float ? (double)(float)x : (double)(float)k; return true;
    case KILN_F64: *fv = from_float ? x : (double)k; return true;
    case KILN_I32:
        *iv = from_float ? saturate(x, INT32_MIN, INT32_MAX) : k;
        return from_float || (k >= INT32_MIN && k <= INT32_MAX);
    case KILN_I64: *iv = from_float ? saturate(x, INT64_MIN, INT64_MAX) : k; return true;
    case KILN_BOOL: *iv = from_float ? x != 0 : k != 0; return true; /* NaN != 0 holds */
    }
    return false;
}

/* Casts source dtype _i to every dtype, from a contiguous and a reversed view. */
START_TEST(test_cast)
{
    const void *data = CAST_INPUTS[_i].data;
    kiln_dtype src = CAST_INPUTS[_i].dt;
    int64_t n = CAST_INPUTS[_i].n;
    for (int d = 0; d < COUNT(DTYPES); d++) {
        kiln_dtype dst = DTYPES[d];
        for (int reversed = 0; reversed < 2; reversed++) {
            kiln_tensor *t = kiln_from_data(src, 1, &n, data);
            if (reversed)
                t = kiln_slice(t, 0, -1, -n - 1, -1);
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s%s", dt_name(src), dt_name(dst),
                     reversed ? " (reversed view)" : "");
            kiln_tensor *c = kiln_cast(t, dst);
            ck_assert_msg(c != NULL, "%s failed: %s", what, kiln_last_error());
            ck_assert_msg(kiln_dtype_of(c) == dst, "%s: dtype %s", what, dt_name(kiln_dtype_of(c)));
            expect_shape(c, 1, &n, what);
            int64_t out[32];
            ck_assert_int_eq(kiln_copy_to_host(c, out, (size_t)n * kiln_dtype_size(dst)), 0);
            for (int64_t i = 0; i < n; i++) {
                int64_t j = reversed ? n - 1 - i : i, iv = 0;
                double fv = 0;
                if (!cast_ref(src, data, j, dst, &iv, &fv))
                    continue;
                if (is_float(dst)) {
                    double g = raw_double(dst, out, i);
                    ck_assert_msg((isnan(g) && isnan(fv)) || g == fv,
                                  "%s: input %lld gives %.17g, want %.17g", what, (long long)j,
                                  g, fv);
                } else {
                    int64_t g = raw_int(dst, out, i);
                    ck_assert_msg(g == iv, "%s: input %lld gives %lld, want %lld", what,
                                  (long long)j, (long long)g, (long long)iv);
                }
            }
        }
    }
}
END_TEST

/* -- Reductions -------------------------------------------------------------- */

typedef enum { SUM, MEAN, MAX, MIN, ARGMAX } reduce_kind;

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, int, bool);
    reduce_kind kind;
} REDUCTIONS[] = {
    {"sum", kiln_sum, SUM}, {"mean", kiln_mean, MEAN}, {"max", kiln_max, MAX},
    {"min", kiln_min, MIN}, {"argmax", kiln_argmax, ARGMAX},
};

static kiln_dtype reduce_result(reduce_kind k, kiln_dtype dt)
{
    switch (k) {
    case SUM: return is_float(dt) ? dt : KILN_I64;
    case MEAN: return is_float(dt) ? dt : KILN_F32;
    case ARGMAX: return KILN_I64;
    default: return dt;
    }
}

/* Whether x replaces best as a running max (or min): NaN wins and then stays;
 * ties keep the first. */
static bool beats(double x, double best, bool want_max)
{
    if (isnan(best))
        return false;
    return isnan(x) || (want_max ? x > best : x < best);
}

/* Reduction k of a over axis (0..ndim-1, or KILN_ALL), row-major over the
 * keepdim shape kept. slack[o] is the order-dependent rounding of a float sum:
 * 1e-13 of the sum of magnitudes, ample for f64 accumulation of a few hundred. */
static void reduce_ref(reduce_kind k, const operand *a, int axis, const int64_t *kept,
                       double *ref, double *slack)
{
    int64_t n_out = numel_of(a->ndim, kept), count[MAX_ELEMS], arg[MAX_ELEMS];
    double mag[MAX_ELEMS];
    for (int64_t o = 0; o < n_out; o++)
        ref[o] = mag[o] = 0, count[o] = arg[o] = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        int64_t idx[KILN_MAX_DIMS] = {0};
        unravel(i, a->ndim, a->shape, idx);
        int64_t pos = axis == KILN_ALL ? i : idx[axis];
        for (int d = 0; d < a->ndim; d++)
            if (axis == KILN_ALL || d == axis)
                idx[d] = 0;
        int64_t o = ravel(a->ndim, kept, idx);
        double x = a->v[i];
        bool first = count[o]++ == 0;
        if (k == SUM || k == MEAN) {
            ref[o] += x;
            mag[o] += fabs(x);
        } else if (first || beats(x, ref[o], k != MIN)) {
            ref[o] = x;
            arg[o] = pos;
        }
    }
    kiln_dtype res = reduce_result(k, a->dt);
    for (int64_t o = 0; o < n_out; o++) {
        if (k == MEAN) {
            ref[o] /= (double)count[o];
            mag[o] /= (double)count[o];
        }
        if (k == ARGMAX)
            ref[o] = (double)arg[o];
        slack[o] = (k == SUM || k == MEAN) && is_float(res) ? 1e-13 * mag[o] : 0;
        ref[o] = round_to(res, ref[o]);
    }
}

/* Reduction _i over every axis (positive and negative), all axes, keepdim or not,
 * for every dtype and layout. Inputs are multiples of 0.25 so ties occur. */
START_TEST(test_reduce)
{
    static const int64_t SHAPE[] = {3, 4, 5};
    static const int AXES[] = {0, 1, 2, -1, -2, -3, KILN_ALL};
    const domain dom = {-4, 4, 0.25, false};
    reduce_kind k = REDUCTIONS[_i].kind;
    uint64_t seed = 80000 + 1000 * (uint64_t)_i;
    for (int i = 0; i < COUNT(DTYPES); i++) {
        kiln_dtype res = reduce_result(k, DTYPES[i]);
        tolerance tl = !is_float(res) || k == MAX || k == MIN ? EXACT
                       : res == KILN_F32                      ? F32_SUM
                                                              : F64_SUM;
        for (int lay = 0; lay < N_LAYOUTS; lay++) {
            kiln_scope_begin();
            operand a;
            operand_init(&a, DTYPES[i], (layout)lay, 3, SHAPE, dom, seed++);
            for (int ax = 0; ax < COUNT(AXES); ax++) {
                int axis = AXES[ax] == KILN_ALL ? KILN_ALL : (AXES[ax] + 3) % 3;
                int64_t kept[3], out[3];
                int out_ndim = 0;
                for (int d = 0; d < 3; d++)
                    kept[d] = axis == KILN_ALL || d == axis ? 1 : SHAPE[d];
                double ref[MAX_ELEMS], slack[MAX_ELEMS];
                reduce_ref(k, &a, axis, kept, ref, slack);
                for (int keepdim = 0; keepdim < 2; keepdim++) {
                    out_ndim = 0;
                    for (int d = 0; d < 3; d++)
                        if (keepdim || kept[d] == SHAPE[d])
                            out[out_ndim++] = kept[d];
                    char what[256];
                    snprintf(what, sizeof what, "%s(%s, axis %d%s, keepdim %d)",
                             REDUCTIONS[_i].name, a.desc, AXES[ax],
                             AXES[ax] == KILN_ALL ? " (KILN_ALL)" : "", keepdim);
                    kiln_tensor *got = REDUCTIONS[_i].fn(a.t, AXES[ax], keepdim);
                    expect_values(got, res, out_ndim, out, ref, tl, slack, what);
                }
            }
            kiln_scope_end();
        }
    }
}
END_TEST

/* max and min propagate NaN; argmax takes the first NaN as the maximum. */
START_TEST(test_reduce_nan)
{
    static const int64_t SHAPE[] = {2, 4};
    static const double V[] = {1, NAN, 3, NAN, 4, 5, 6, -INFINITY};
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *t = tensor_of(dt, 2, SHAPE, V);
        const int64_t rows[] = {2}, cols[] = {4};
        const double nan[] = {NAN};
        expect_exact(kiln_max(t, 1, false), dt, 1, rows, (double[]){NAN, 6}, "max axis 1");
        expect_exact(kiln_max(t, 0, false), dt, 1, cols, (double[]){4, NAN, 6, NAN}, "max axis 0");
        expect_exact(kiln_min(t, -1, false), dt, 1, rows, (double[]){NAN, -INFINITY},
                     "min axis -1");
        expect_exact(kiln_min(t, 0, false), dt, 1, cols, (double[]){1, NAN, 3, NAN}, "min axis 0");
        expect_exact(kiln_max(t, KILN_ALL, false), dt, 0, NULL, nan, "max ALL");
        expect_exact(kiln_min(t, KILN_ALL, false), dt, 0, NULL, nan, "min ALL");
        expect_exact(kiln_argmax(t, 1, false), KILN_I64, 1, rows, (double[]){1, 2},
                     "argmax axis 1");
        expect_exact(kiln_argmax(t, 0, false), KILN_I64, 1, cols, (double[]){1, 0, 1, 0},
                     "argmax axis 0");
        expect_exact(kiln_argmax(t, KILN_ALL, false), KILN_I64, 0, NULL, (double[]){1},
                     "argmax ALL");
    }
}
END_TEST

/* argmax returns the first of equal maxima, for every dtype. */
START_TEST(test_argmax_first_occurrence)
{
    static const int64_t SHAPE[] = {2, 3};
    static const double V[] = {1, 5, 5, 7, 7, 2};
    for (int i = 0; i < COUNT(DTYPES) - 1; i++) {
        kiln_tensor *t = tensor_of(DTYPES[i], 2, SHAPE, V);
        expect_exact(kiln_argmax(t, 1, false), KILN_I64, 1, (int64_t[]){2}, (double[]){1, 0},
                     "argmax ties axis 1");
        expect_exact(kiln_argmax(t, 0, true), KILN_I64, 2, (int64_t[]){1, 3}, (double[]){1, 1, 0},
                     "argmax ties axis 0 keepdim");
        expect_exact(kiln_argmax(t, KILN_ALL, false), KILN_I64, 0, NULL, (double[]){3},
                     "argmax ties ALL");
    }
    kiln_tensor *b = tensor_of(KILN_BOOL, 2, SHAPE, (double[]){0, 1, 1, 0, 0, 0});
    expect_exact(kiln_argmax(b, 1, false), KILN_I64, 1, (int64_t[]){2}, (double[]){1, 0},
                 "argmax bool (all false gives 0)");
}
END_TEST

/* f32 sums accumulate in f64: 1e8 + 1000 ones - 1e8 is 1000 exactly, where an
 * f32 accumulator loses every one (the ulp of 1e8 in f32 is 8). */
START_TEST(test_sum_f32_accumulates_in_f64)
{
    double v[1002];
    v[0] = 1e8;
    for (int i = 1; i <= 1000; i++)
        v[i] = 1;
    v[1001] = -1e8;
    int64_t n = 1002;
    kiln_tensor *t = tensor_of(KILN_F32, 1, &n, v);
    expect_exact(kiln_sum(t, 0, false), KILN_F32, 0, NULL, (double[]){1000}, "sum f32 in f64");
    expect_values(kiln_mean(t, KILN_ALL, false), KILN_F32, 0, NULL,
                  (double[]){round_to(KILN_F32, 1000.0 / 1002)}, F32_SUM, NULL, "mean f32 in f64");
}
END_TEST

/* Means of integers sum in f64, where nothing wraps: i64 [2^62, 2^62] gave
 * -4.6e18. Rows, columns, and a row long enough to be split across threads. */
START_TEST(test_mean_of_integers_does_not_wrap)
{
    const double p62 = 0x1p62, p50 = 0x1p50;
    const int64_t two = 2, rows[2] = {2, 3}, long_row = 1 << 18;
    kiln_tensor *pair = kiln_full(KILN_I64, 1, &two, p62);
    expect_exact(kiln_mean(pair, KILN_ALL, false), KILN_F32, 0, NULL, (double[]){p62}, "mean i64 [2^62,2^62]");
    kiln_tensor *grid = kiln_full(KILN_I64, 2, rows, p62);
    expect_exact(kiln_mean(grid, 1, false), KILN_F32, 1, &two, (double[]){p62, p62}, "row means of 2^62");
    expect_exact(kiln_mean(grid, 0, true), KILN_F32, 2, (int64_t[]){1, 3}, (double[]){p62, p62, p62},
                 "column means of 2^62");
    kiln_tensor *ints = kiln_full(KILN_I32, 2, rows, INT32_MAX);
    expect_exact(kiln_mean(ints, -1, false), KILN_F32, 1, &two, (double[]){0x1p31, 0x1p31}, "mean i32 max");
    expect_exact(kiln_mean(kiln_full(KILN_I64, 1, &long_row, p50), 0, false), KILN_F32, 0, NULL, (double[]){p50},
                 "mean of 2^18 values 2^50");
}
END_TEST

/* A sum over an empty axis is 0. */
START_TEST(test_sum_empty)
{
    kiln_tensor *f = kiln_zeros(KILN_F32, 2, (int64_t[]){0, 3});
    expect_exact(kiln_sum(f, 0, false), KILN_F32, 1, (int64_t[]){3}, (double[]){0, 0, 0},
                 "sum f32 [0,3] axis 0");
    kiln_tensor *i = kiln_zeros(KILN_I32, 2, (int64_t[]){0, 3});
    expect_exact(kiln_sum(i, KILN_ALL, false), KILN_I64, 0, NULL, (double[]){0},
                 "sum i32 [0,3] ALL");
}
END_TEST

/* -- Movement ---------------------------------------------------------------- */

START_TEST(test_reshape)
{
    kiln_tensor *a = iota(KILN_F32, 2, (int64_t[]){2, 6});
    double seq[24];
    for (int i = 0; i < 24; i++)
        seq[i] = i;
    /* A contiguous tensor reshapes as a view; -1 takes what is left. */
    static const struct {
        int ndim;
        int64_t shape[4], want[4];
    } VIEWS[] = {
        {2, {3, 4}, {3, 4}},       {2, {-1, 3}, {4, 3}}, {3, {2, -1, 2}, {2, 3, 2}},
        {1, {-1}, {12}},           {4, {1, 12, 1, 1}, {1, 12, 1, 1}},
    };
    for (int v = 0; v < COUNT(VIEWS); v++) {
        kiln_tensor *r = kiln_reshape(a, VIEWS[v].ndim, VIEWS[v].shape);
        expect_exact(r, KILN_F32, VIEWS[v].ndim, VIEWS[v].want, seq, "reshape contiguous");
        ck_assert_msg(kiln_shares_storage(r, a), "reshape of a contiguous tensor copied");
    }

    /* A transpose cannot be flattened by strides: a copy in logical order. */
    kiln_tensor *t = kiln_transpose(a, 0, 1); /* [6,2]: t[i][j] = a[j][i] = 6j + i */
    double tv[12];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 2; j++)
            tv[2 * i + j] = 6 * j + i;
    kiln_tensor *flat = kiln_reshape(t, 1, (int64_t[]){12});
    expect_exact(flat, KILN_F32, 1, (int64_t[]){12}, tv, "reshape transposed");
    ck_assert_msg(!kiln_shares_storage(flat, a), "reshape of a transpose must copy");

    /* Every other row (strides 12, 1): splitting the last axis is a view, merging
     * the rows is not. */
    kiln_tensor *b = iota(KILN_I32, 2, (int64_t[]){4, 6});
    kiln_tensor *s = kiln_slice(b, 0, 0, 4, 2);
    double sv[12];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 6; c++)
            sv[6 * r + c] = 12 * r + c;
    kiln_tensor *split = kiln_reshape(s, 3, (int64_t[]){2, 2, 3});
    expect_exact(split, KILN_I32, 3, (int64_t[]){2, 2, 3}, sv, "reshape sliced, split");
    ck_assert_msg(kiln_shares_storage(split, b), "splitting an axis of a slice copied");
    kiln_tensor *merged = kiln_reshape(s, 2, (int64_t[]){3, -1});
    expect_exact(merged, KILN_I32, 2, (int64_t[]){3, 4}, sv, "reshape sliced, merged");
    ck_assert_msg(!kiln_shares_storage(merged, b), "merging strided rows must copy");

    /* One element: [1] to 0-d and back. */
    kiln_tensor *one = iota(KILN_F64, 1, (int64_t[]){1});
    int64_t unused = 0;
    kiln_tensor *zero_d = kiln_reshape(one, 0, &unused);
    expect_exact(zero_d, KILN_F64, 0, NULL, (double[]){0}, "reshape [1] to 0-d");
    expect_exact(kiln_reshape(zero_d, 2, (int64_t[]){1, -1}), KILN_F64, 2, (int64_t[]){1, 1},
                 (double[]){0}, "reshape 0-d to [1,1]");
}
END_TEST

START_TEST(test_permute_transpose)
{
    kiln_tensor *a = iota(KILN_I64, 3, (int64_t[]){2, 3, 4}); /* a[i][j][k] = 12i + 4j + k */
    double want[24];

    /* Output axis i is input axis perm[i]: p[i][j][k] = a[j][k][i]. */
    kiln_tensor *p = kiln_permute(a, (int[]){2, 0, 1});
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 2 + j) * 3 + k] = 12 * j + 4 * k + i;
    expect_exact(p, KILN_I64, 3, (int64_t[]){4, 2, 3}, want, "permute {2,0,1}");
    expect_strides(p, (int64_t[]){1, 12, 4}, "permute {2,0,1}");
    ck_assert(kiln_shares_storage(p, a));

    /* The inverse permutation restores the original order. */
    double seq[24];
    for (int i = 0; i < 24; i++)
        seq[i] = i;
    expect_exact(kiln_permute(p, (int[]){1, 2, 0}), KILN_I64, 3, (int64_t[]){2, 3, 4}, seq,
                 "permute back");
    expect_exact(kiln_permute(a, (int[]){0, 1, 2}), KILN_I64, 3, (int64_t[]){2, 3, 4}, seq,
                 "permute identity");

    /* transpose(0, -1): t[i][j][k] = a[k][j][i]. */
    kiln_tensor *t = kiln_transpose(a, 0, -1);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++)
                want[(i * 3 + j) * 2 + k] = 12 * k + 4 * j + i;
    expect_exact(t, KILN_I64, 3, (int64_t[]){4, 3, 2}, want, "transpose(0, -1)");
    expect_strides(t, (int64_t[]){1, 4, 12}, "transpose(0, -1)");
    ck_assert(kiln_shares_storage(t, a));
    expect_exact(kiln_transpose(a, -2, 1), KILN_I64, 3, (int64_t[]){2, 3, 4}, seq,
                 "transpose of an axis with itself");
}
END_TEST

START_TEST(test_expand)
{
    /* [3,1] to [2,3,4], -1 keeping the 3: e[i][j][k] = v[j], read through stride 0. */
    kiln_tensor *col = tensor_of(KILN_F32, 2, (int64_t[]){3, 1}, (double[]){1.5, -2, 3});
    kiln_tensor *e = kiln_expand(col, 3, (int64_t[]){2, -1, 4});
    double want[24];
    for (int i = 0; i < 24; i++)
        want[i] = (double[]){1.5, -2, 3}[(i / 4) % 3];
    expect_exact(e, KILN_F32, 3, (int64_t[]){2, 3, 4}, want, "expand [3,1] to [2,-1,4]");
    ck_assert(kiln_shares_storage(e, col));
    ck_assert_int_eq(kiln_strides(e)[0], 0);
    ck_assert_int_eq(kiln_strides(e)[2], 0);

    kiln_tensor *s = tensor_of(KILN_I32, 0, NULL, (double[]){7});
    expect_exact(kiln_expand(s, 2, (int64_t[]){2, 2}), KILN_I32, 2, (int64_t[]){2, 2},
                 (double[]){7, 7, 7, 7}, "expand 0-d to [2,2]");
}
END_TEST

/* Python's a[start:stop:step] on a = [0..6], expected lists written out by hand. */
START_TEST(test_slice)
{
    static const struct {
        int64_t start, stop, step;
        int64_t n;
        double want[7];
    } CASES[] = {
        {1, 5, 1, 4, {1, 2, 3, 4}},
        {-3, 7, 1, 3, {4, 5, 6}},           /* negative start counts from the end */
        {0, 100, 2, 4, {0, 2, 4, 6}},       /* stop past the end clamps */
        {-100, 3, 1, 3, {0, 1, 2}},         /* start before the front clamps */
        {5, 1, -1, 4, {5, 4, 3, 2}},
        {-1, -8, -1, 7, {6, 5, 4, 3, 2, 1, 0}}, /* stop before the front: run to it */
        {100, -100, -3, 3, {6, 3, 0}},      /* both clamp with a negative step */
        {6, 0, -2, 3, {6, 4, 2}},
        {-2, -5, -1, 3, {5, 4, 3}},
        {0, 7, 3, 3, {0, 3, 6}},
        {0, INT64_MAX, 1, 7, {0, 1, 2, 3, 4, 5, 6}},
        {-1, INT64_MIN, -1, 7, {6, 5, 4, 3, 2, 1, 0}},
        {INT64_MAX, INT64_MIN, -2, 4, {6, 4, 2, 0}},
        {4, 4, 1, 0, {0}},                  /* empty results */
        {5, 2, 1, 0, {0}},
        {2, 5, -1, 0, {0}},
        {7, 10, 1, 0, {0}},
    };
    kiln_tensor *a = iota(KILN_I64, 1, (int64_t[]){7});
    for (int c = 0; c < COUNT(CASES); c++) {
        char what[96];
        snprintf(what, sizeof what, "a[%lld:%lld:%lld]", (long long)CASES[c].start,
                 (long long)CASES[c].stop, (long long)CASES[c].step);
        kiln_tensor *s = kiln_slice(a, 0, CASES[c].start, CASES[c].stop, CASES[c].step);
        expect_exact(s, KILN_I64, 1, &CASES[c].n, CASES[c].want, what);
        if (CASES[c].n > 0)
            ck_assert_msg(kiln_shares_storage(s, a), "%s copied", what);
    }

    /* m[:, ::-2] of a [3,5] matrix, then rows [2:-4:-1] of that: a slice of a slice. */
    kiln_tensor *m = iota(KILN_I32, 2, (int64_t[]){3, 5});
    kiln_tensor *cols = kiln_slice(m, -1, -1, INT64_MIN, -2);
    double want[9];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            want[3 * r + c] = 5 * r + 4 - 2 * c;
    expect_exact(cols, KILN_I32, 2, (int64_t[]){3, 3}, want, "m[:, ::-2]");
    expect_strides(cols, (int64_t[]){5, -2}, "m[:, ::-2]");
    kiln_tensor *rows = kiln_slice(cols, 0, 2, -4, -1);
    double flipped[9];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            flipped[3 * r + c] = want[3 * (2 - r) + c];
    expect_exact(rows, KILN_I32, 2, (int64_t[]){3, 3}, flipped, "m[:, ::-2][2:-4:-1]");
    ck_assert(kiln_shares_storage(rows, m));
}
END_TEST

START_TEST(test_concat)
{
    /* i32 [2,3], f32 [1,3], i64 [3,3] along axis 0 promote to f32. */
    kiln_tensor *a = tensor_of(KILN_I32, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6});
    kiln_tensor *b = tensor_of(KILN_F32, 2, (int64_t[]){1, 3}, (double[]){0.5, 1.5, 2.5});
    kiln_tensor *c = tensor_of(KILN_I64, 2, (int64_t[]){3, 3},
                               (double[]){-1, -2, -3, -4, -5, -6, -7, -8, -9});
    kiln_tensor *rows[] = {a, b, c};
    expect_exact(kiln_concat(rows, 3, 0), KILN_F32, 2, (int64_t[]){6, 3},
                 (double[]){1, 2, 3, 4, 5, 6, 0.5, 1.5, 2.5, -1, -2, -3, -4, -5, -6, -7, -8, -9},
                 "concat i32, f32, i64 axis 0");

    /* bool [2,1] beside a transposed i32 [2,3] along axis -1 gives i32. */
    kiln_tensor *d = tensor_of(KILN_BOOL, 2, (int64_t[]){2, 1}, (double[]){1, 0});
    kiln_tensor *e3x2 = tensor_of(KILN_I32, 2, (int64_t[]){3, 2}, (double[]){1, 2, 3, 4, 5, 6});
    kiln_tensor *e = kiln_transpose(e3x2, 0, 1); /* [[1,3,5],[2,4,6]] */
    kiln_tensor *cols[] = {d, e, d};
    expect_exact(kiln_concat(cols, 3, -1), KILN_I32, 2, (int64_t[]){2, 5},
                 (double[]){1, 1, 3, 5, 1, 0, 2, 4, 6, 0},
                 "concat bool, transposed i32, bool axis -1");

    /* f64 and a reversed f32 slice along axis 1 give f64. */
    kiln_tensor *f = tensor_of(KILN_F64, 2, (int64_t[]){2, 1}, (double[]){0.1, 0.2});
    kiln_tensor *g2 = tensor_of(KILN_F32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    kiln_tensor *g = kiln_slice(g2, 1, -1, -3, -1);
    kiln_tensor *fg[] = {f, g};
    expect_exact(kiln_concat(fg, 2, 1), KILN_F64, 2, (int64_t[]){2, 3},
                 (double[]){0.1, 2, 1, 0.2, 4, 3}, "concat f64, reversed f32 axis 1");

    /* One tensor is still a copy; an empty piece adds nothing. */
    kiln_tensor *single = kiln_concat(rows, 1, 0);
    expect_exact(single, KILN_I32, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6},
                 "concat of one");
    ck_assert_msg(!kiln_shares_storage(single, a), "concat of one did not copy");
    kiln_tensor *empty = kiln_zeros(KILN_I32, 2, (int64_t[]){0, 3});
    kiln_tensor *with_empty[] = {empty, a};
    expect_exact(kiln_concat(with_empty, 2, 0), KILN_I32, 2, (int64_t[]){2, 3},
                 (double[]){1, 2, 3, 4, 5, 6}, "concat with an empty piece");
}
END_TEST

START_TEST(test_squeeze_unsqueeze)
{
    double seq[6] = {0, 1, 2, 3, 4, 5};
    kiln_tensor *a = iota(KILN_F32, 4, (int64_t[]){1, 3, 1, 2});
    static const struct {
        int axis, ndim;
        int64_t shape[4];
    } SQUEEZES[] = {
        {0, 3, {3, 1, 2}}, {2, 3, {1, 3, 2}}, {-2, 3, {1, 3, 2}}, {-4, 3, {3, 1, 2}},
        {KILN_ALL, 2, {3, 2}},
    };
    for (int s = 0; s < COUNT(SQUEEZES); s++) {
        kiln_tensor *q = kiln_squeeze(a, SQUEEZES[s].axis);
        expect_exact(q, KILN_F32, SQUEEZES[s].ndim, SQUEEZES[s].shape, seq, "squeeze");
        ck_assert(kiln_shares_storage(q, a));
    }
    kiln_tensor *ones = tensor_of(KILN_I64, 2, (int64_t[]){1, 1}, (double[]){42});
    expect_exact(kiln_squeeze(ones, KILN_ALL), KILN_I64, 0, NULL, (double[]){42},
                 "squeeze [1,1] ALL");

    /* -1 appends, so a negative axis counts in the result's ndim. */
    kiln_tensor *b = iota(KILN_I32, 2, (int64_t[]){3, 2});
    static const struct {
        int axis;
        int64_t shape[3];
    } UNSQUEEZES[] = {
        {0, {1, 3, 2}},  {1, {3, 1, 2}},  {2, {3, 2, 1}},
        {-1, {3, 2, 1}}, {-2, {3, 1, 2}}, {-3, {1, 3, 2}},
    };
    for (int u = 0; u < COUNT(UNSQUEEZES); u++) {
        kiln_tensor *q = kiln_unsqueeze(b, UNSQUEEZES[u].axis);
        char what[32];
        snprintf(what, sizeof what, "unsqueeze(%d)", UNSQUEEZES[u].axis);
        expect_exact(q, KILN_I32, 3, UNSQUEEZES[u].shape, seq, what);
        ck_assert(kiln_shares_storage(q, b));
    }
    /* Through a transposed view the values keep their logical order. */
    kiln_tensor *t = kiln_transpose(b, 0, 1);
    expect_exact(kiln_unsqueeze(t, 1), KILN_I32, 3, (int64_t[]){2, 1, 3},
                 (double[]){0, 2, 4, 1, 3, 5}, "unsqueeze of a transpose");
    expect_exact(kiln_unsqueeze(tensor_of(KILN_F64, 0, NULL, (double[]){2.5}), 0), KILN_F64, 1,
                 (int64_t[]){1}, (double[]){2.5}, "unsqueeze 0-d");
}
END_TEST

START_TEST(test_contiguous)
{
    kiln_tensor *a = iota(KILN_F64, 2, (int64_t[]){2, 3});
    kiln_tensor *same = kiln_contiguous(a);
    ck_assert_ptr_eq(same, a);

    kiln_tensor *t = kiln_transpose(a, 0, 1);
    kiln_tensor *c = kiln_contiguous(t);
    expect_exact(c, KILN_F64, 2, (int64_t[]){3, 2}, (double[]){0, 3, 1, 4, 2, 5},
                 "contiguous of a transpose");
    expect_strides(c, (int64_t[]){2, 1}, "contiguous of a transpose");
    ck_assert_msg(!kiln_shares_storage(c, a), "contiguous of a transpose did not copy");

    kiln_tensor *row = tensor_of(KILN_BOOL, 1, (int64_t[]){2}, (double[]){1, 0});
    kiln_tensor *e = kiln_contiguous(kiln_expand(row, 2, (int64_t[]){2, 2}));
    expect_exact(e, KILN_BOOL, 2, (int64_t[]){2, 2}, (double[]){1, 0, 1, 0},
                 "contiguous of an expand");
    expect_strides(e, (int64_t[]){2, 1}, "contiguous of an expand");
}
END_TEST

/* -- Matmul ------------------------------------------------------------------ */

static const struct matmul_case {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
} MATMUL_CASES[] = {
    {2, {3, 4}, 2, {4, 5}},          /* plain 2-d */
    {1, {4}, 2, {4, 5}},             /* 1-d @ 2-d: a row, its axis removed after */
    {2, {3, 4}, 1, {4}},             /* 2-d @ 1-d: a column, its axis removed after */
    {1, {4}, 1, {4}},                /* a dot product, 0-d */
    {4, {2, 1, 3, 4}, 3, {3, 4, 5}}, /* batch axes [2,1] and [3] broadcast to [2,3] */
    {1, {4}, 3, {2, 4, 5}},
    {3, {2, 3, 4}, 1, {4}},
    {2, {17, 33}, 2, {33, 9}}, /* large enough for blocked kernels */
};

/* numpy.matmul by a plain triple loop in f64 (exact for the small integers
 * used). slack is what accumulating in the result dtype may add:
 * (K + 2) eps sum_k |a_ik b_kj|. Returns the result's ndim. */
static int matmul_ref(const operand *a, const operand *b, kiln_dtype res, int64_t *shape,
                      double *ref, double *slack)
{
    int64_t as[KILN_MAX_DIMS], bs[KILN_MAX_DIMS], batch[KILN_MAX_DIMS], bidx[KILN_MAX_DIMS];
    int na = a->ndim, nb = b->ndim;
    memcpy(as, a->shape, sizeof *as * (size_t)na);
    memcpy(bs, b->shape, sizeof *bs * (size_t)nb);
    if (na == 1) { /* a row [1,K] */
        as[1] = as[0];
        as[0] = 1;
        na = 2;
    }
    if (nb == 1) { /* a column [K,1] */
        bs[1] = 1;
        nb = 2;
    }
    int64_t M = as[na - 2], K = as[na - 1], N = bs[nb - 1];
    int nbatch = broadcast_shapes(na - 2, as, nb - 2, bs, batch);
    double eps = res == KILN_F32 ? FLT_EPSILON : res == KILN_F64 ? DBL_EPSILON : 0;
    for (int64_t p = 0; p < numel_of(nbatch, batch); p++) {
        unravel(p, nbatch, batch, bidx);
        int64_t pa = broadcast_ravel(nbatch, bidx, na - 2, as);
        int64_t pb = broadcast_ravel(nbatch, bidx, nb - 2, bs);
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                double sum = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double term = a->v[(pa * M + i) * K + k] * b->v[(pb * K + k) * N + j];
                    sum += term;
                    mag += fabs(term);
                }
                int64_t o = (p * M + i) * N + j;
                ref[o] = round_to(res, sum);
                slack[o] = (double)(K + 2) * eps * mag;
            }
        }
    }
    int ndim = 0;
    for (int d = 0; d < nbatch; d++)
        shape[ndim++] = batch[d];
    if (a->ndim > 1)
        shape[ndim++] = M;
    if (b->ndim > 1)
        shape[ndim++] = N;
    return ndim;
}

/* Matmul case _i for each dtype pair and every pair of operand layouts. */
START_TEST(test_matmul)
{
    static const kiln_dtype PAIRS[][2] = {
        {KILN_F32, KILN_F32}, {KILN_F64, KILN_F64}, {KILN_I32, KILN_I32}, {KILN_I64, KILN_I64},
        {KILN_I32, KILN_F32}, {KILN_F32, KILN_F64}, {KILN_I64, KILN_I32},
    };
    uint64_t seed = 100000 + 10000 * (uint64_t)_i;
    const struct matmul_case *mc = &MATMUL_CASES[_i];
    for (int p = 0; p < COUNT(PAIRS); p++) {
        kiln_dtype res = promote(PAIRS[p][0], PAIRS[p][1]);
        for (int la = 0; la < N_LAYOUTS; la++) {
            for (int lb = 0; lb < N_LAYOUTS; lb++) {
                kiln_scope_begin();
                operand a, b;
                domain da = is_float(PAIRS[p][0]) ? span(-2, 2) : span(-5, 5);
                domain db = is_float(PAIRS[p][1]) ? span(-2, 2) : span(-5, 5);
                operand_init(&a, PAIRS[p][0], (layout)la, mc->na, mc->a, da, seed++);
                operand_init(&b, PAIRS[p][1], (layout)lb, mc->nb, mc->b, db, seed++);
                int64_t shape[KILN_MAX_DIMS];
                double ref[MAX_ELEMS], slack[MAX_ELEMS];
                int ndim = matmul_ref(&a, &b, res, shape, ref, slack);
                char what[320];
                snprintf(what, sizeof what, "matmul(%s, %s)", a.desc, b.desc);
                expect_values(kiln_matmul(a.t, b.t), res, ndim, shape, ref, EXACT, slack, what);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* i64 products near 1e16 are beyond a double's 2^53: only exact integer loops get
 * them right. */
START_TEST(test_matmul_i64_exact)
{
    static const int64_t A[] = {100000007, -99999989, 123456789, 98765431, 87654321, -76543211};
    static const int64_t B[] = {99999971, 3, -100000037, 7, 55555557, -11};
    int64_t want[4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            int64_t s = 0;
            for (int k = 0; k < 3; k++)
                s += A[3 * i + k] * B[2 * k + j];
            want[2 * i + j] = s;
        }
    kiln_tensor *a = kiln_from_data(KILN_I64, 2, (int64_t[]){2, 3}, A);
    kiln_tensor *b = kiln_from_data(KILN_I64, 2, (int64_t[]){3, 2}, B);
    expect_i64(kiln_matmul(a, b), 2, (int64_t[]){2, 2}, want, "matmul i64 beyond 2^53");
}
END_TEST

/* -- Composites -------------------------------------------------------------- */

/* softmax (or log_softmax) of row-major v along axis, stabilised by the max. */
static void softmax_ref(const double *v, int ndim, const int64_t *shape, int axis, bool log_form,
                        double *out)
{
    int64_t len = shape[axis], outer = 1, inner = 1;
    for (int d = 0; d < axis; d++)
        outer *= shape[d];
    for (int d = axis + 1; d < ndim; d++)
        inner *= shape[d];
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            const int64_t base = o * len * inner + in;
            double m = -INFINITY, sum = 0;
            for (int64_t l = 0; l < len; l++)
                m = fmax(m, v[base + l * inner]);
            for (int64_t l = 0; l < len; l++)
                sum += exp(v[base + l * inner] - m);
            for (int64_t l = 0; l < len; l++) {
                double x = v[base + l * inner] - m;
                out[base + l * inner] = log_form ? x - log(sum) : exp(x) / sum;
            }
        }
    }
}

static tolerance composite_tol(kiln_dtype dt)
{
    return dt == KILN_F32 ? F32_COMPOSITE : F64_COMPOSITE;
}

START_TEST(test_softmax)
{
    static const struct {
        int ndim;
        int64_t shape[3];
        int axis;
    } CASES[] = {
        {2, {3, 5}, 0}, {2, {3, 5}, 1}, {2, {3, 5}, -1}, {3, {2, 3, 4}, -2}, {3, {2, 3, 4}, 0},
    };
    uint64_t seed = 200000;
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        for (int c = 0; c < COUNT(CASES); c++) {
            for (int lay = 0; lay < N_LAYOUTS; lay++) {
                for (int log_form = 0; log_form < 2; log_form++) {
                    kiln_scope_begin();
                    operand a;
                    operand_init(&a, dt, (layout)lay, CASES[c].ndim, CASES[c].shape, span(-4, 4),
                                 seed++);
                    int axis = (CASES[c].axis + a.ndim) % a.ndim;
                    double ref[MAX_ELEMS];
                    softmax_ref(a.v, a.ndim, a.shape, axis, log_form, ref);
                    for (int64_t e = 0; e < a.numel; e++)
                        ref[e] = round_to(dt, ref[e]);
                    char what[256];
                    snprintf(what, sizeof what, "%s(%s, axis %d)",
                             log_form ? "log_softmax" : "softmax", a.desc, CASES[c].axis);
                    kiln_tensor *got = log_form ? kiln_log_softmax(a.t, CASES[c].axis)
                                                : kiln_softmax(a.t, CASES[c].axis);
                    expect_values(got, dt, a.ndim, a.shape, ref, composite_tol(dt), NULL, what);
                    kiln_scope_end();
                }
            }
        }
    }
}
END_TEST

/* Inputs near +-1000 overflow exp unless the max is subtracted first. */
START_TEST(test_softmax_large_inputs)
{
    static const double V[] = {1000, 1001, 1002, -1000, -1001, -1002};
    static const int64_t SHAPE[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        kiln_tensor *t = tensor_of(dt, 2, SHAPE, V);
        for (int log_form = 0; log_form < 2; log_form++) {
            double ref[6];
            softmax_ref(V, 2, SHAPE, 1, log_form, ref);
            for (int e = 0; e < 6; e++)
                ref[e] = round_to(dt, ref[e]);
            kiln_tensor *got = log_form ? kiln_log_softmax(t, -1) : kiln_softmax(t, -1);
            expect_values(got, dt, 2, SHAPE, ref, composite_tol(dt), NULL,
                          log_form ? "log_softmax of +-1000" : "softmax of +-1000");
        }
    }
}
END_TEST

/* Normalised over the last axis with the biased variance, as PyTorch does. */
static void layer_norm_ref(const operand *x, const double *gamma, const double *beta, double eps,
                           double *out)
{
    int64_t len = x->shape[x->ndim - 1];
    for (int64_t r = 0; r < x->numel / len; r++) {
        const double *row = x->v + r * len;
        double mean = 0, var = 0;
        for (int64_t l = 0; l < len; l++)
            mean += row[l];
        mean /= (double)len;
        for (int64_t l = 0; l < len; l++)
            var += (row[l] - mean) * (row[l] - mean);
        var /= (double)len;
        for (int64_t l = 0; l < len; l++)
            out[r * len + l] = (row[l] - mean) / sqrt(var + eps) * (gamma ? gamma[l] : 1) +
                               (beta ? beta[l] : 0);
    }
}

START_TEST(test_layer_norm)
{
    static const struct {
        int ndim;
        int64_t shape[3];
    } SHAPES[] = {{2, {4, 6}}, {3, {2, 3, 4}}};
    const double eps = 1e-5;
    uint64_t seed = 300000;
    for (int k = 0; k < 2; k++) {
        kiln_dtype dt = k ? KILN_F64 : KILN_F32;
        for (int s = 0; s < COUNT(SHAPES); s++) {
            for (int lay = 0; lay < N_LAYOUTS; lay++) {
                /* with: bit 0 gamma, bit 1 beta; the others are NULL. */
                for (int with = 0; with < 4; with++) {
                    kiln_scope_begin();
                    operand x, g, b;
                    int64_t len = SHAPES[s].shape[SHAPES[s].ndim - 1];
                    layout lg = (layout)((lay + 1) % N_LAYOUTS);
                    layout lb = (layout)((lay + 2) % N_LAYOUTS);
                    operand_init(&x, dt, (layout)lay, SHAPES[s].ndim, SHAPES[s].shape, span(-4, 4),
                                 seed++);
                    operand_init(&g, dt, lg, 1, &len, span(0.5, 2), seed++);
                    operand_init(&b, dt, lb, 1, &len, span(-1, 1), seed++);
                    bool use_g = with & 1, use_b = with & 2;
                    double ref[MAX_ELEMS];
                    layer_norm_ref(&x, use_g ? g.v : NULL, use_b ? b.v : NULL, eps, ref);
                    for (int64_t e = 0; e < x.numel; e++)
                        ref[e] = round_to(dt, ref[e]);
                    char what[512];
                    snprintf(what, sizeof what, "layer_norm(%s, gamma %s, beta %s)", x.desc,
                             use_g ? g.desc : "NULL", use_b ? b.desc : "NULL");
                    expect_values(kiln_layer_norm(x.t, use_g ? g.t : NULL, use_b ? b.t : NULL, eps),
                                  dt, x.ndim, x.shape, ref, composite_tol(dt), NULL, what);
                    kiln_scope_end();
                }
            }
        }
    }
}
END_TEST

static double ref_gelu(double x)
{
    const double sqrt_2_over_pi = 0.79788456080286535588;
    return 0.5 * x * (1 + tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x)));
}

static double ref_silu(double x)
{
    return x / (1 + exp(-x));
}

START_TEST(test_gelu_silu)
{
    static const struct {
        const char *name;
        kiln_tensor *(*fn)(kiln_tensor *);
        double (*ref)(double);
    } OPS[] = {{"gelu", kiln_gelu, ref_gelu}, {"silu", kiln_silu, ref_silu}};
    static const int64_t SHAPE[] = {3, 5};
    uint64_t seed = 400000;
    for (int o = 0; o < COUNT(OPS); o++) {
        for (int k = 0; k < 2; k++) {
            kiln_dtype dt = k ? KILN_F64 : KILN_F32;
            for (int lay = 0; lay < N_LAYOUTS; lay++) {
                kiln_scope_begin();
                operand a;
                operand_init(&a, dt, (layout)lay, 2, SHAPE, span(-6, 6), seed++);
                double ref[MAX_ELEMS];
                for (int64_t e = 0; e < a.numel; e++)
                    ref[e] = round_to(dt, OPS[o].ref(a.v[e]));
                char what[256];
                snprintf(what, sizeof what, "%s(%s)", OPS[o].name, a.desc);
                expect_values(OPS[o].fn(a.t), dt, 2, SHAPE, ref, composite_tol(dt), NULL, what);
                kiln_scope_end();
            }
        }
    }
}
END_TEST

/* Integers and bools become f32 before a composite computes, as PyTorch's
 * x.float() (the references are PyTorch 1.13's): gelu's cube and softmax's
 * shift wrapped in i32. */
START_TEST(test_composites_on_integers)
{
    const int64_t n3 = 3, n2 = 2, row[2] = {1, 4};
    kiln_tensor *x = tensor_of(KILN_I32, 1, &n3, (const double[]){46341, 2000, -1291});
    expect_values(kiln_gelu(x), KILN_F32, 1, &n3, (const double[]){46341, 2000, -0.0}, F32_COMPOSITE, NULL,
                  "gelu of i32");
    kiln_tensor *ends = tensor_of(KILN_I32, 1, &n2, (const double[]){INT32_MIN, INT32_MAX});
    expect_values(kiln_softmax(ends, 0), KILN_F32, 1, &n2, (const double[]){0, 1}, F32_COMPOSITE, NULL,
                  "softmax of i32 extremes");
    expect_values(kiln_log_softmax(ends, 0), KILN_F32, 1, &n2, (const double[]){-4294967296.0, 0}, F32_COMPOSITE,
                  NULL, "log_softmax of i32 extremes");
    kiln_tensor *flags = tensor_of(KILN_BOOL, 1, &n2, (const double[]){1, 0});
    expect_values(kiln_gelu(flags), KILN_F32, 1, &n2, (const double[]){0.8411920070648193, 0}, F32_COMPOSITE,
                  NULL, "gelu of bool");
    kiln_tensor *big = tensor_of(KILN_I32, 1, &n3, (const double[]){-100000, 3, INT32_MAX});
    expect_values(kiln_silu(big), KILN_F32, 1, &n3, (const double[]){-0.0, 2.857722520828247, 2147483648.0},
                  F32_COMPOSITE, NULL, "silu of i32");
    kiln_tensor *spread = tensor_of(KILN_I64, 2, row, (const double[]){INT32_MAX, INT32_MIN, 0, 7});
    expect_values(kiln_layer_norm(spread, NULL, NULL, 1e-5), KILN_F32, 2, row,
                  (const double[]){1.4142135381698608, -1.4142135381698608, 0, 0}, F32_COMPOSITE, NULL,
                  "layer_norm of i64");
}
END_TEST

/* PyTorch gives an empty result over an empty axis, and softmax 1 (log 0)
 * of a 0-d tensor, whose axis is 0 or -1 as for kiln_sum. */
START_TEST(test_softmax_empty_axis_and_zero_dim)
{
    static const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I32};
    static const int64_t shapes[][3] = {{3, 0, 2}, {0, 4, 2}, {2, 3, 0}};
    for (int k = 0; k < COUNT(dts); k++) {
        kiln_dtype res = dts[k] == KILN_F64 ? KILN_F64 : KILN_F32;
        kiln_tensor *scalar = tensor_of(dts[k], 0, NULL, (const double[]){3});
        for (int axis = -1; axis <= 0; axis++) {
            expect_values(kiln_softmax(scalar, axis), res, 0, NULL, (const double[]){1}, EXACT, NULL, "0-d softmax");
            expect_values(kiln_log_softmax(scalar, axis), res, 0, NULL, (const double[]){0}, EXACT, NULL,
                          "0-d log_softmax");
        }
        for (int s = 0; s < COUNT(shapes); s++) {
            kiln_tensor *empty = kiln_zeros(dts[k], 3, shapes[s]);
            for (int axis = -3; axis < 3; axis++) {
                expect_values(kiln_softmax(empty, axis), res, 3, shapes[s], NULL, EXACT, NULL, "empty softmax");
                expect_values(kiln_log_softmax(empty, axis), res, 3, shapes[s], NULL, EXACT, NULL,
                              "empty log_softmax");
            }
        }
    }
    kiln_clear_error();
    ck_assert_ptr_null(kiln_softmax(kiln_scalar(1), 1));
    ck_assert_kiln_error("kiln_softmax", "axis 1", "[]");
}
END_TEST

/* -- Assign ------------------------------------------------------------------ */

START_TEST(test_assign_broadcast_and_convert)
{
    /* An i32 row broadcast into f32 [2,3]. */
    kiln_tensor *dst = kiln_zeros(KILN_F32, 2, (int64_t[]){2, 3});
    kiln_tensor *row = tensor_of(KILN_I32, 1, (int64_t[]){3}, (double[]){1, -2, 3});
    ck_assert_int_eq(kiln_assign(dst, row), 0);
    expect_exact(dst, KILN_F32, 2, (int64_t[]){2, 3}, (double[]){1, -2, 3, 1, -2, 3},
                 "assign i32 row into f32");

    /* A 0-d f32 into f64 [2,2]. */
    kiln_tensor *d64 = kiln_zeros(KILN_F64, 2, (int64_t[]){2, 2});
    ck_assert_int_eq(kiln_assign(d64, kiln_scalar(7.5)), 0);
    expect_exact(d64, KILN_F64, 2, (int64_t[]){2, 2}, (double[]){7.5, 7.5, 7.5, 7.5}, "assign 0-d");

    /* Conversions as kiln_cast does them: truncate, saturate, NaN to 0, nonzero to true. */
    kiln_tensor *di = kiln_zeros(KILN_I32, 1, (int64_t[]){6});
    ck_assert_int_eq(kiln_assign(di, tensor_of(KILN_F32, 1, (int64_t[]){6},
                                               (double[]){2.7, -2.7, 0.5, -0.5, 3e9, NAN})), 0);
    expect_exact(di, KILN_I32, 1, (int64_t[]){6}, (double[]){2, -2, 0, 0, INT32_MAX, 0},
                 "assign f32 into i32");
    kiln_tensor *db = kiln_zeros(KILN_BOOL, 1, (int64_t[]){4});
    kiln_tensor *zeroish = tensor_of(KILN_F64, 1, (int64_t[]){4}, (double[]){0, -0.0, 0.25, NAN});
    ck_assert_int_eq(kiln_assign(db, zeroish), 0);
    expect_exact(db, KILN_BOOL, 1, (int64_t[]){4}, (double[]){0, 0, 1, 1}, "assign f64 into bool");
    kiln_tensor *df = kiln_zeros(KILN_F32, 1, (int64_t[]){2});
    kiln_tensor *wide = tensor_of(KILN_F64, 1, (int64_t[]){2}, (double[]){0.1, 1e300});
    ck_assert_int_eq(kiln_assign(df, wide), 0);
    expect_exact(df, KILN_F32, 1, (int64_t[]){2}, (double[]){(float)0.1, INFINITY},
                 "assign f64 into f32");
}
END_TEST

START_TEST(test_assign_through_views)
{
    /* Into base[1::2, ::-2] of a [4,5] base: only those six elements change. */
    kiln_tensor *base = iota(KILN_F64, 2, (int64_t[]){4, 5});
    kiln_tensor *view = kiln_slice(kiln_slice(base, 0, 1, 4, 2), 1, -1, INT64_MIN, -2);
    kiln_tensor *src = tensor_of(KILN_F64, 2, (int64_t[]){2, 3},
                                 (double[]){100, 101, 102, 103, 104, 105});
    ck_assert_int_eq(kiln_assign(view, src), 0);
    double want[20];
    for (int i = 0; i < 20; i++)
        want[i] = i;
    want[9] = 100, want[7] = 101, want[5] = 102, want[19] = 103, want[17] = 104, want[15] = 105;
    expect_exact(base, KILN_F64, 2, (int64_t[]){4, 5}, want, "assign through a strided view");

    /* Into a transpose: base[j][i] = src[i][j]; a reshape view of base sees it too. */
    kiln_tensor *b2 = kiln_zeros(KILN_I64, 2, (int64_t[]){3, 2});
    kiln_tensor *flat = kiln_reshape(b2, 1, (int64_t[]){6});
    ck_assert(kiln_shares_storage(flat, b2));
    kiln_tensor *src2 = iota(KILN_I64, 2, (int64_t[]){2, 3});
    ck_assert_int_eq(kiln_assign(kiln_transpose(b2, 0, 1), src2), 0);
    expect_exact(flat, KILN_I64, 1, (int64_t[]){6}, (double[]){0, 3, 1, 4, 2, 5},
                 "assign through a transpose");

    /* A broadcast source row into a column slice. */
    kiln_tensor *m = kiln_zeros(KILN_I32, 2, (int64_t[]){2, 3});
    kiln_tensor *nine = kiln_full(KILN_I32, 1, (int64_t[]){1}, 9);
    ck_assert_int_eq(kiln_assign(kiln_slice(m, 1, 1, 2, 1), nine), 0);
    expect_exact(m, KILN_I32, 2, (int64_t[]){2, 3}, (double[]){0, 9, 0, 0, 9, 0},
                 "assign into a column");
}
END_TEST

/* -- Creation ---------------------------------------------------------------- */

START_TEST(test_from_data)
{
    static const int64_t SHAPE[] = {2, 3};
    static const float F32[] = {1.5f, -2, 0.1f, 1e30f, -0.0f, 3};
    static const double F64[] = {0.1, -2, 1e300, 5e-324, 7, -8};
    static const int32_t I32[] = {1, -2, INT32_MAX, INT32_MIN, 0, 6};
    static const int64_t I64[] = {1, -2, INT64_MAX, INT64_MIN, (INT64_C(1) << 53) + 1, 6};
    static const uint8_t BOOLS[] = {1, 0, 0, 1, 1, 0};
    const void *data[] = {F32, F64, I32, I64, BOOLS};
    for (int i = 0; i < COUNT(DTYPES); i++) {
        size_t bytes = 6 * kiln_dtype_size(DTYPES[i]);
        unsigned char copy[48], out[48];
        memcpy(copy, data[i], bytes);
        kiln_tensor *t = kiln_from_data(DTYPES[i], 2, SHAPE, copy);
        memset(copy, 0x5a, sizeof copy); /* from_data copied, so this must not show */
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(kiln_dtype_of(t), DTYPES[i]);
        ck_assert_int_eq(kiln_numel(t), 6);
        expect_shape(t, 2, SHAPE, dt_name(DTYPES[i]));
        expect_strides(t, (int64_t[]){3, 1}, dt_name(DTYPES[i]));
        ck_assert_int_eq(kiln_copy_to_host(t, out, bytes), 0);
        ck_assert_msg(memcmp(out, data[i], bytes) == 0, "from_data %s changed the bytes",
                      dt_name(DTYPES[i]));
    }
}
END_TEST

START_TEST(test_zeros_ones_full)
{
    static const int64_t SHAPE[] = {2, 2, 2};
    double zeros[8] = {0}, ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < COUNT(DTYPES); i++) {
        expect_exact(kiln_zeros(DTYPES[i], 3, SHAPE), DTYPES[i], 3, SHAPE, zeros, "zeros");
        expect_exact(kiln_ones(DTYPES[i], 3, SHAPE), DTYPES[i], 3, SHAPE, ones, "ones");
    }
    /* full converts as kiln_cast does. */
    static const struct {
        kiln_dtype dt;
        double value, want;
    } FULL[] = {
        {KILN_F32, 0.1, (float)0.1}, {KILN_F64, 0.1, 0.1},        {KILN_F32, 1e300, INFINITY},
        {KILN_F64, -INFINITY, -INFINITY}, {KILN_F64, NAN, NAN},  {KILN_I32, 2.7, 2},
        {KILN_I32, -2.7, -2},        {KILN_I32, 1e20, INT32_MAX}, {KILN_I32, -1e20, INT32_MIN},
        {KILN_I64, NAN, 0},          {KILN_I64, -3.9, -3},        {KILN_BOOL, 0.5, 1},
        {KILN_BOOL, 0.0, 0},         {KILN_BOOL, NAN, 1},
    };
    for (int f = 0; f < COUNT(FULL); f++) {
        double want[8];
        for (int e = 0; e < 8; e++)
            want[e] = FULL[f].want;
        char what[64];
        snprintf(what, sizeof what, "full(%s, %g)", dt_name(FULL[f].dt), FULL[f].value);
        kiln_tensor *t = kiln_full(FULL[f].dt, 3, SHAPE, FULL[f].value);
        expect_exact(t, FULL[f].dt, 3, SHAPE, want, what);
    }
    int64_t unused = 0;
    expect_exact(kiln_full(KILN_F64, 0, &unused, -1.25), KILN_F64, 0, NULL, (double[]){-1.25},
                 "full 0-d");
}
END_TEST

START_TEST(test_arange)
{
    static const struct {
        double start, stop, step;
        kiln_dtype dt;
    } CASES[] = {
        {0, 5, 1, KILN_I32},     {5, 0, -1, KILN_I64},     {0, 1, 0.25, KILN_F32},
        {2, -1, -0.5, KILN_F64}, {0, 1, 0.3, KILN_F64},    {-3, 3, 2, KILN_I32},
        {0.5, 3, 1, KILN_F64},   {1, 10, 3, KILN_F32},     {0, 0, 1, KILN_F32},
        {3, 0, 1, KILN_I32},     {0, 3, -1, KILN_I64},
    };
    for (int c = 0; c < COUNT(CASES); c++) {
        /* numpy: ceil((stop - start) / step) elements, start + i * step. */
        double span = ceil((CASES[c].stop - CASES[c].start) / CASES[c].step);
        int64_t n = span > 0 ? (int64_t)span : 0;
        double want[16];
        for (int64_t i = 0; i < n; i++)
            want[i] = round_to(CASES[c].dt, CASES[c].start + (double)i * CASES[c].step);
        char what[96];
        snprintf(what, sizeof what, "arange(%g, %g, %g, %s)", CASES[c].start, CASES[c].stop,
                 CASES[c].step, dt_name(CASES[c].dt));
        kiln_dtype dt = CASES[c].dt;
        expect_values(kiln_arange(CASES[c].start, CASES[c].stop, CASES[c].step, dt), dt, 1, &n,
                      want, result_tol(dt, false), NULL, what);
    }
}
END_TEST

/* 1e5 draws: the checks below sit 5 or more standard errors from the truth. */
#define N_RANDOM 100000

START_TEST(test_rand)
{
    int64_t n = N_RANDOM;
    kiln_tensor *r = kiln_rand(1, &n, 42);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(kiln_dtype_of(r), KILN_F32);
    expect_shape(r, 1, &n, "rand");
    double *v = test_values(r);
    double sum = 0, sq = 0;
    int64_t bins[10] = {0};
    bool in_range = true;
    for (int64_t i = 0; i < n; i++) {
        in_range = in_range && v[i] >= 0 && v[i] < 1;
        sum += v[i];
        sq += v[i] * v[i];
        if (v[i] >= 0 && v[i] < 1)
            bins[(int)(v[i] * 10)]++;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    double *same = test_values(kiln_rand(1, &n, 42)), *other = test_values(kiln_rand(1, &n, 43));
    bool identical = memcmp(v, same, sizeof *v * (size_t)n) == 0;
    int64_t equal = 0;
    for (int64_t i = 0; i < n; i++)
        equal += v[i] == other[i];
    free(v);
    free(same);
    free(other);
    ck_assert_msg(in_range, "rand left [0, 1)");
    ck_assert_msg(fabs(mean - 0.5) < 0.005, "rand mean %g", mean);
    ck_assert_msg(fabs(var - 1.0 / 12) < 0.003, "rand variance %g, want 1/12", var);
    for (int b = 0; b < 10; b++) /* each bin ~10000 +- 95 */
        ck_assert_msg(llabs(bins[b] - n / 10) < 500, "rand bin %d holds %lld", b,
                      (long long)bins[b]);
    ck_assert_msg(identical, "rand with the same seed differs");
    ck_assert_msg(equal < n / 100, "rand seeds 42 and 43 agree on %lld values", (long long)equal);
    /* Any shape: a [3,4] draw is f32 of that shape. */
    expect_shape(kiln_rand(2, (int64_t[]){3, 4}, 1), 2, (int64_t[]){3, 4}, "rand [3,4]");
}
END_TEST

START_TEST(test_randn)
{
    int64_t n = N_RANDOM;
    kiln_tensor *r = kiln_randn(1, &n, 7);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(kiln_dtype_of(r), KILN_F32);
    expect_shape(r, 1, &n, "randn");
    double *v = test_values(r);
    double sum = 0, sq = 0;
    int64_t within_one = 0;
    bool finite = true;
    for (int64_t i = 0; i < n; i++) {
        finite = finite && isfinite(v[i]);
        sum += v[i];
        sq += v[i] * v[i];
        within_one += fabs(v[i]) < 1;
    }
    double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    double *same = test_values(kiln_randn(1, &n, 7)), *other = test_values(kiln_randn(1, &n, 8));
    bool identical = memcmp(v, same, sizeof *v * (size_t)n) == 0;
    int64_t equal = 0;
    for (int64_t i = 0; i < n; i++)
        equal += v[i] == other[i];
    free(v);
    free(same);
    free(other);
    ck_assert_msg(finite, "randn gave a non-finite value");
    ck_assert_msg(fabs(mean) < 0.015, "randn mean %g", mean);   /* se 0.0032 */
    ck_assert_msg(fabs(sd - 1) < 0.015, "randn std %g", sd);    /* se 0.0022 */
    /* P(|x| < 1) = 0.6827 for a standard normal; se 0.0015. */
    ck_assert_msg(fabs((double)within_one / n - 0.6827) < 0.01, "randn P(|x|<1) = %g",
                  (double)within_one / n);
    ck_assert_msg(identical, "randn with the same seed differs");
    ck_assert_msg(equal < n / 100, "randn seeds 7 and 8 agree on %lld values", (long long)equal);
}
END_TEST

START_TEST(test_scalar_and_item)
{
    kiln_tensor *s = kiln_scalar(0.1);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(kiln_ndim(s), 0);
    ck_assert_int_eq(kiln_numel(s), 1);
    ck_assert_int_eq(kiln_dtype_of(s), KILN_F32);
    ck_assert(kiln_item(s) == (double)(float)0.1);
    ck_assert(kiln_item(kiln_scalar(-2.5)) == -2.5);

    /* item of any one-element tensor, exact for integers up to 2^53. */
    int64_t big = (INT64_C(1) << 40) + 3;
    ck_assert(kiln_item(kiln_from_data(KILN_I64, 2, (int64_t[]){1, 1}, &big)) == (double)big);
    ck_assert(kiln_item(kiln_full(KILN_BOOL, 1, (int64_t[]){1}, 1)) == 1.0);
    ck_assert(kiln_item(kiln_full(KILN_I32, 3, (int64_t[]){1, 1, 1}, -7)) == -7.0);
    kiln_tensor *a = iota(KILN_F64, 1, (int64_t[]){5});
    ck_assert(kiln_item(kiln_slice(a, 0, -2, -1, 1)) == 3.0);

    /* More than one element: NaN and an error. */
    ck_assert(isnan(kiln_item(a)));
    ck_assert_kiln_error("kiln_item");
    kiln_clear_error();
}
END_TEST

/* -- Suite ------------------------------------------------------------------- */

static TCase *make_tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, scope_setup, scope_teardown);
    tcase_set_timeout(tc, 240); /* the loops are long under valgrind */
    suite_add_tcase(s, tc);
    return tc;
}

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");

    TCase *tc = make_tcase(s, "binary");
    tcase_add_loop_test(tc, test_binary, 0, COUNT(BINARY_OPS));
    tcase_add_loop_test(tc, test_binary_scalar, 0, COUNT(BINARY_OPS));
    tcase_add_test(tc, test_zero_dim_promotion);
    tcase_add_test(tc, test_add_i32_wraps);
    tcase_add_test(tc, test_bool_arithmetic_refusals);
    tcase_add_test(tc, test_div_by_zero);
    tcase_add_test(tc, test_maximum_minimum_nan);
    tcase_add_test(tc, test_signed_zeros);

    tc = make_tcase(s, "compare");
    tcase_add_loop_test(tc, test_compare, 0, COUNT(COMPARE_OPS));
    tcase_add_test(tc, test_compare_nan);
    tcase_add_test(tc, test_where);

    tc = make_tcase(s, "unary");
    tcase_add_loop_test(tc, test_unary, 0, COUNT(UNARY_OPS));
    tcase_add_test(tc, test_unary_special_values);
    tcase_add_loop_test(tc, test_cast, 0, COUNT(CAST_INPUTS));

    tc = make_tcase(s, "reduce");
    tcase_add_loop_test(tc, test_reduce, 0, COUNT(REDUCTIONS));
    tcase_add_test(tc, test_reduce_nan);
    tcase_add_test(tc, test_argmax_first_occurrence);
    tcase_add_test(tc, test_sum_f32_accumulates_in_f64);
    tcase_add_test(tc, test_sum_empty);
    tcase_add_test(tc, test_mean_of_integers_does_not_wrap);

    tc = make_tcase(s, "movement");
    tcase_add_test(tc, test_reshape);
    tcase_add_test(tc, test_permute_transpose);
    tcase_add_test(tc, test_expand);
    tcase_add_test(tc, test_slice);
    tcase_add_test(tc, test_concat);
    tcase_add_test(tc, test_squeeze_unsqueeze);
    tcase_add_test(tc, test_contiguous);

    tc = make_tcase(s, "matmul");
    tcase_add_loop_test(tc, test_matmul, 0, COUNT(MATMUL_CASES));
    tcase_add_test(tc, test_matmul_i64_exact);

    tc = make_tcase(s, "composite");
    tcase_add_test(tc, test_softmax);
    tcase_add_test(tc, test_softmax_large_inputs);
    tcase_add_test(tc, test_layer_norm);
    tcase_add_test(tc, test_gelu_silu);
    tcase_add_test(tc, test_composites_on_integers);
    tcase_add_test(tc, test_softmax_empty_axis_and_zero_dim);

    tc = make_tcase(s, "assign");
    tcase_add_test(tc, test_assign_broadcast_and_convert);
    tcase_add_test(tc, test_assign_through_views);

    tc = make_tcase(s, "create");
    tcase_add_test(tc, test_from_data);
    tcase_add_test(tc, test_zeros_ones_full);
    tcase_add_test(tc, test_arange);
    tcase_add_test(tc, test_rand);
    tcase_add_test(tc, test_randn);
    tcase_add_test(tc, test_scalar_and_item);

    return s;
}

KILN_TEST_MAIN(ops_suite)
