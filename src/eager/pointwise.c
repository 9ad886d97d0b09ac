/* Pointwise composites of the op table's rows: clamp, sign, reciprocal, the
 * logical ops, isnan and isinf, softplus and exact GELU. Each is a few
 * elementwise ops, so a traced call fuses them with their neighbours. */
#include <math.h>

#include "eager/internal.h"

static kiln_tensor *with_scalar(ir_op op, kiln_tensor *a, double value)
{
    return eager_scalar_op(op, ir_ops[op].name, a, value, false);
}

/* Whether bound can clamp a: a whole bound keeps an i32 a's dtype, so one
 * outside its range would wrap (3e9 to -1294967296); refused, as PyTorch
 * refuses it. (Every whole bound the *_scalar forms keep whole fits i64.) */
static bool bound_fits(const kiln_tensor *a, double bound)
{
    bool whole = isfinite(bound) && bound == trunc(bound);
    if (a->dtype != KILN_I32 || !whole || (bound >= INT32_MIN && bound <= INT32_MAX))
        return true;
    char d[DESCRIBE_MAX];
    core_fail(CORE_VALUE, "kiln_clamp", "bound %.17g is outside the range of a %s", bound, describe(d, a));
    return false;
}

kiln_tensor *kiln_clamp(kiln_tensor *a, double lo, double hi)
{
    if (!composite_check("kiln_clamp", a, 0, false) || !bound_fits(a, lo) || !bound_fits(a, hi))
        return NULL;
    composite_begin();
    return composite_end("kiln_clamp", kiln_minimum_scalar(kiln_maximum_scalar(a, lo), hi));
}

kiln_tensor *kiln_sign(kiln_tensor *a)
{
    if (!composite_check("kiln_sign", a, 0, false))
        return NULL;
    if (a->dtype == KILN_BOOL)
        return kiln_cast(a, KILN_BOOL);
    composite_begin();
    kiln_tensor *above = kiln_cast(with_scalar(OP_GT, a, 0), a->dtype);
    kiln_tensor *below = kiln_cast(with_scalar(OP_LT, a, 0), a->dtype);
    return composite_end("kiln_sign", kiln_sub(above, below));
}

kiln_tensor *kiln_reciprocal(kiln_tensor *a)
{
    return eager_scalar_op(OP_DIV, "kiln_reciprocal", a, 1, true);
}

/* a != 0 as bool: NaN is true, as in PyTorch. */
static kiln_tensor *truth(kiln_tensor *a)
{
    return with_scalar(OP_NE, a, 0);
}

kiln_tensor *kiln_logical_not(kiln_tensor *a)
{
    return eager_scalar_op(OP_EQ, "kiln_logical_not", a, 0, false);
}

static kiln_tensor *logical(const char *fn, ir_op op, kiln_tensor *a, kiln_tensor *b)
{
    if (!composite_check_pair(fn, a, b))
        return NULL;
    composite_begin();
    kiln_tensor *x = truth(a), *y = truth(b);
    kiln_tensor *r = op == OP_MUL ? kiln_mul(x, y) : op == OP_ADD ? kiln_add(x, y) : kiln_ne(x, y);
    return composite_end(fn, r);
}

kiln_tensor *kiln_logical_and(kiln_tensor *a, kiln_tensor *b)
{
    return logical("kiln_logical_and", OP_MUL, a, b); /* bool mul is and */
}

kiln_tensor *kiln_logical_or(kiln_tensor *a, kiln_tensor *b)
{
    return logical("kiln_logical_or", OP_ADD, a, b); /* bool add is or */
}

kiln_tensor *kiln_logical_xor(kiln_tensor *a, kiln_tensor *b)
{
    return logical("kiln_logical_xor", OP_NE, a, b);
}

kiln_tensor *kiln_isnan(kiln_tensor *a)
{
    if (!composite_check("kiln_isnan", a, 0, false))
        return NULL;
    return kiln_ne(a, a);
}

kiln_tensor *kiln_isinf(kiln_tensor *a)
{
    if (!composite_check("kiln_isinf", a, 0, false))
        return NULL;
    if (!ir_dtype_is_float(a->dtype)) /* integers are never infinite */
        return kiln_ne(a, a);
    composite_begin();
    return composite_end("kiln_isinf", with_scalar(OP_EQ, kiln_abs(a), INFINITY));
}

kiln_tensor *kiln_softplus(kiln_tensor *a, double beta, double threshold)
{
    if (!composite_check("kiln_softplus", a, 0, false))
        return NULL;
    composite_begin();
    kiln_tensor *x = composite_float(a);
    kiln_tensor *scaled = kiln_mul_scalar(x, beta);
    kiln_tensor *soft = kiln_div_scalar(kiln_log1p(kiln_exp(scaled)), beta);
    return composite_end("kiln_softplus", kiln_where(with_scalar(OP_GT, scaled, threshold), x, soft));
}

kiln_tensor *kiln_gelu_erf(kiln_tensor *a)
{
    if (!composite_check("kiln_gelu_erf", a, 0, false))
        return NULL;
    composite_begin();
    kiln_tensor *x = composite_float(a);
    kiln_tensor *gate = kiln_add_scalar(kiln_erf(kiln_mul_scalar(x, M_SQRT1_2)), 1);
    return composite_end("kiln_gelu_erf", kiln_mul(kiln_mul_scalar(x, 0.5), gate));
}
