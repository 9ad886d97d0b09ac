/* The ONNX operators kiln runs, each a handler made of kiln ops, in one table
 * (onnx_ops below): adding an operator is a handler and a row. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "onnx/onnx.h"

enum { MAX_INTS = 64 };

/* -- Attributes and constant operands -------------------------------------- */

const Onnx__AttributeProto *onnx_attr(const onnx_call *c, const char *name)
{
    const Onnx__NodeProto *p = c->node->proto;
    for (size_t i = 0; i < p->n_attribute; i++)
        if (p->attribute[i]->name && !strcmp(p->attribute[i]->name, name))
            return p->attribute[i];
    return NULL;
}

/* Whether the attribute has type want; fails c's node if present and not. */
static int attr_typed(const onnx_call *c, const Onnx__AttributeProto *a, Onnx__AttributeProto__AttributeType want)
{
    if (a->type == want || (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED && want != 0))
        return 0;
    return onnx_fail(c, CORE_FORMAT, "attribute '%s' has type %d, not %d", a->name, (int)a->type, (int)want);
}

/* Attribute name of type want, or NULL: absent, or of another type (then
 * c's node failed and *status says so). */
static const Onnx__AttributeProto *attr_of(const onnx_call *c, const char *name,
                                           Onnx__AttributeProto__AttributeType want, int *status)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    *status = 0;
    if (a && attr_typed(c, a, want) < 0) {
        *status = -CORE_FORMAT;
        return NULL;
    }
    return a;
}

static int attr_int(const onnx_call *c, const char *name, int64_t fallback, int64_t *v)
{
    int status;
    const Onnx__AttributeProto *a = attr_of(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, &status);
    *v = a ? a->i : fallback;
    return status;
}

static int attr_float(const onnx_call *c, const char *name, double fallback, double *v)
{
    int status;
    const Onnx__AttributeProto *a = attr_of(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, &status);
    *v = a ? a->f : fallback;
    return status;
}

/* The ints of attribute name into v (at most MAX_INTS): how many, or -1 when
 * absent, or a status below -1. */
static int attr_ints(const onnx_call *c, const char *name, int64_t *v)
{
    int status;
    const Onnx__AttributeProto *a = attr_of(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS, &status);
    if (!a)
        return -1 + status;
    if (a->n_ints > MAX_INTS)
        return -1 + onnx_fail(c, CORE_UNSUPPORTED, "attribute '%s' has %zu values (kiln takes %d)", name, a->n_ints,
                              MAX_INTS);
    memcpy(v, a->ints, a->n_ints * sizeof *v);
    return (int)a->n_ints;
}

/* The string attribute name (bytes, not terminated) into buf, or fallback. */
static const char *attr_string(const onnx_call *c, const char *name, const char *fallback, char *buf, size_t size)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a || !a->has_s)
        return fallback;
    snprintf(buf, size, "%.*s", (int)(a->s.len < size ? a->s.len : size - 1), (const char *)a->s.data);
    return buf;
}

static const char *operand_name(const onnx_call *c, int i)
{
    return c->node->in[i] >= 0 ? c->m->value_names[c->node->in[i]] : "";
}

/* The values of operand i, at most MAX_INTS integers, into v: how many, or
 * a negative status. A known operand is read as it is; one computed from
 * the model's inputs is read from the trace, which breaks it there (the
 * graph so far runs, and later calls follow the values it gave). */
static int const_ints(const onnx_call *c, int i, int64_t *v)
{
    kiln_tensor *t = c->in[i];
    int64_t n = kiln_numel(t);
    kiln_dtype dt = kiln_dtype_of(t);
    if (n > MAX_INTS || (dt != KILN_I64 && dt != KILN_I32))
        return onnx_fail(c, CORE_UNSUPPORTED, "operand %d ('%s') has %lld %s values; kiln takes at most %d integers",
                         i, operand_name(c, i), (long long)n, kiln_dtype_name(dt), MAX_INTS);
    int32_t narrow[MAX_INTS];
    if (kiln_copy_to_host(t, dt == KILN_I64 ? (void *)v : narrow, (size_t)n * kiln_dtype_size(dt)) < 0)
        return core_error_status();
    for (int64_t k = 0; dt == KILN_I32 && k < n; k++)
        v[k] = narrow[k];
    return (int)n;
}

/* Operand i, of one element, as a double (read as const_ints reads). */
static int const_scalar(const onnx_call *c, int i, double *v)
{
    *v = 0;
    if (kiln_numel(c->in[i]) != 1)
        return onnx_fail(c, CORE_VALUE, "operand %d ('%s') must have one element, not %lld", i, operand_name(c, i),
                         (long long)kiln_numel(c->in[i]));
    *v = kiln_item(c->in[i]);
    return isnan(*v) && core_error_pending() ? core_error_status() : 0;
}

/* The axis (negative counts from the end) checked against ndim. */
static int norm_axis(const onnx_call *c, int64_t axis, int ndim, int *out)
{
    *out = 0;
    if (axis < -ndim || axis >= (ndim ? ndim : 1))
        return onnx_fail(c, CORE_AXIS, "axis %lld is out of range for %d dimensions", (long long)axis, ndim);
    *out = (int)(axis < 0 ? axis + ndim : axis);
    return 0;
}

/* A new reference to t owned by the current scope, as an op's result. */
static kiln_tensor *same(kiln_tensor *t)
{
    return eager_own(kiln_retain(t));
}

static int done(onnx_call *c, kiln_tensor *t)
{
    c->out[0] = t;
    return t ? 0 : core_error_status();
}

/* A 0-d constant of dt. */
static kiln_tensor *scalar_of(kiln_dtype dt, double v)
{
    return kiln_full(dt, 0, NULL, v);
}

/* t converted to dt, or t itself. */
static kiln_tensor *as_dtype(kiln_tensor *t, kiln_dtype dt)
{
    return t && kiln_dtype_of(t) != dt ? kiln_cast(t, dt) : t;
}

/* A per-channel parameter ([C]) shaped to broadcast over axis 1 of ndim. */
static kiln_tensor *channel(kiln_tensor *p, int ndim)
{
    int64_t shape[KILN_MAX_DIMS] = {-1};
    for (int d = 1; d < ndim - 1; d++)
        shape[d] = 1;
    return kiln_reshape(p, ndim - 1 > 0 ? ndim - 1 : 1, shape);
}

/* -- Elementwise ------------------------------------------------------------ */

#define UNARY(Name, expr)                                                                                         \
    static int run_##Name(onnx_call *c)                                                                         \
    {                                                                                                           \
        kiln_tensor *x = c->in[0];                                                                              \
        return done(c, (expr));                                                                                 \
    }
UNARY(neg, kiln_neg(x))
UNARY(abs, kiln_abs(x))
UNARY(exp, kiln_exp(x))
UNARY(log, kiln_log(x))
UNARY(sqrt, kiln_sqrt(x))
UNARY(tanh, kiln_tanh(x))
UNARY(sigmoid, kiln_sigmoid(x))
UNARY(relu, kiln_relu(x))
UNARY(sin, kiln_sin(x))
UNARY(cos, kiln_cos(x))
UNARY(tan, kiln_tan(x))
UNARY(erf, kiln_erf(x))
UNARY(identity, same(x))
UNARY(reciprocal, kiln_div(scalar_of(kiln_dtype_of(x), 1), x))
UNARY(softsign, kiln_div(x, kiln_add_scalar(kiln_abs(x), 1)))
UNARY(isnan, kiln_ne(x, x))
UNARY(not, kiln_eq(x, scalar_of(KILN_BOOL, 0)))
UNARY(sign, as_dtype(kiln_sub(kiln_cast(kiln_gt(x, scalar_of(kiln_dtype_of(x), 0)), KILN_I32),
                              kiln_cast(kiln_lt(x, scalar_of(kiln_dtype_of(x), 0)), KILN_I32)),
                     kiln_dtype_of(x)))

/* log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|). */
static kiln_tensor *softplus(kiln_tensor *x)
{
    return kiln_add(kiln_relu(x), kiln_log(kiln_add_scalar(kiln_exp(kiln_neg(kiln_abs(x))), 1)));
}
UNARY(softplus, softplus(x))
UNARY(mish, kiln_mul(x, kiln_tanh(softplus(x))))
UNARY(floor, kiln_floor(x))
UNARY(ceil, kiln_ceil(x))
UNARY(round, kiln_round(x))
UNARY(atan, kiln_atan(x))
UNARY(asin, kiln_atan2(x, kiln_sqrt(kiln_sub(scalar_of(kiln_dtype_of(x), 1), kiln_mul(x, x)))))
UNARY(acos, kiln_atan2(kiln_sqrt(kiln_sub(scalar_of(kiln_dtype_of(x), 1), kiln_mul(x, x))), x))
UNARY(sinh, kiln_mul_scalar(kiln_sub(kiln_exp(x), kiln_exp(kiln_neg(x))), 0.5))
UNARY(cosh, kiln_mul_scalar(kiln_add(kiln_exp(x), kiln_exp(kiln_neg(x))), 0.5))
UNARY(asinh, kiln_log(kiln_add(x, kiln_sqrt(kiln_add_scalar(kiln_mul(x, x), 1)))))
UNARY(acosh, kiln_log(kiln_add(x, kiln_sqrt(kiln_sub_scalar(kiln_mul(x, x), 1)))))
UNARY(atanh, kiln_mul_scalar(kiln_log(kiln_div(kiln_add_scalar(x, 1), kiln_sub(scalar_of(kiln_dtype_of(x), 1), x))), 0.5))

/* Before opset 7, broadcast=1 aligned b with a from axis (default: the end). */
static kiln_tensor *legacy_broadcast(onnx_call *c, kiln_tensor *a, kiln_tensor *b)
{
    int64_t on, axis;
    int nd = kiln_ndim(a), bd = kiln_ndim(b);
    if (attr_int(c, "broadcast", 0, &on) < 0 || attr_int(c, "axis", nd - bd, &axis) < 0 || !on)
        return b;
    if (axis < 0)
        axis += nd;
    if (axis < 0 || axis + bd > nd) {
        onnx_fail(c, CORE_SHAPE, "b of %d dimensions does not fit a of %d from axis %lld", bd, nd, (long long)axis);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < nd - (int)axis; d++)
        shape[d] = d < bd ? kiln_shape(b)[d] : 1;
    return kiln_reshape(b, nd - (int)axis, shape);
}

#define BINARY(Name, expr)                                                                                        \
    static int run_##Name(onnx_call *c)                                                                         \
    {                                                                                                           \
        kiln_tensor *a = c->in[0], *b = legacy_broadcast(c, a, c->in[1]);                                       \
        return b ? done(c, (expr)) : core_error_status();                                                       \
    }
BINARY(add, kiln_add(a, b))
BINARY(sub, kiln_sub(a, b))
BINARY(mul, kiln_mul(a, b))
BINARY(equal, kiln_eq(a, b))
BINARY(less, kiln_lt(a, b))
BINARY(less_equal, kiln_le(a, b))
BINARY(greater, kiln_gt(a, b))
BINARY(greater_equal, kiln_ge(a, b))
BINARY(and, kiln_mul(a, b))
BINARY(or, kiln_add(a, b))
BINARY(xor, kiln_ne(a, b))
BINARY(pow, as_dtype(kiln_pow(a, b), kiln_dtype_of(a)))

/* Before opset 7 a slope of C values applies along axis 1. */
static int run_prelu(onnx_call *c)
{
    kiln_tensor *x = c->in[0], *slope = c->in[1];
    if (c->m->opset < 7 && kiln_ndim(slope) == 1 && kiln_ndim(x) >= 2)
        slope = channel(slope, kiln_ndim(x));
    return done(c, kiln_where(kiln_lt(x, scalar_of(kiln_dtype_of(x), 0)), kiln_mul(x, slope), x));
}

/* ONNX divides integers truncating toward zero. */
static int run_div(onnx_call *c)
{
    kiln_tensor *a = c->in[0], *b = legacy_broadcast(c, a, c->in[1]);
    if (!b)
        return core_error_status();
    kiln_dtype dt = kiln_dtype_of(a);
    if (dt == KILN_F32 || dt == KILN_F64)
        return done(c, kiln_div(a, b));
    return done(c, kiln_cast(kiln_div(kiln_cast(a, KILN_F64), kiln_cast(b, KILN_F64)), dt));
}

static int run_where(onnx_call *c)
{
    return done(c, kiln_where(c->in[0], c->in[1], c->in[2]));
}

/* Max, Min, Sum, Mean: their operands folded left to right. */
static int fold_operands(onnx_call *c, kiln_tensor *(*op)(kiln_tensor *, kiln_tensor *), bool mean)
{
    int n = c->node->n_in;
    kiln_tensor *acc = n == 1 ? same(c->in[0]) : c->in[0];
    for (int i = 1; i < n && acc; i++)
        acc = op(acc, c->in[i]);
    return done(c, mean && n > 1 ? kiln_div_scalar(acc, n) : acc);
}
static int run_max(onnx_call *c) { return fold_operands(c, kiln_maximum, false); }
static int run_min(onnx_call *c) { return fold_operands(c, kiln_minimum, false); }
static int run_sum(onnx_call *c) { return fold_operands(c, kiln_add, false); }
static int run_mean(onnx_call *c) { return fold_operands(c, kiln_add, true); }

static int run_leaky_relu(onnx_call *c)
{
    double alpha;
    kiln_tensor *x = c->in[0];
    if (attr_float(c, "alpha", 0.01, &alpha) < 0)
        return -CORE_FORMAT;
    return done(c, kiln_where(kiln_lt(x, scalar_of(kiln_dtype_of(x), 0)), kiln_mul_scalar(x, alpha), x));
}

/* alpha (e^x - 1) below 0, x above; Selu scales both by gamma. */
static kiln_tensor *elu(kiln_tensor *x, double alpha)
{
    return kiln_where(kiln_lt(x, scalar_of(kiln_dtype_of(x), 0)), kiln_mul_scalar(kiln_sub_scalar(kiln_exp(x), 1), alpha),
                      x);
}

static int run_elu(onnx_call *c)
{
    double alpha;
    if (attr_float(c, "alpha", 1.0, &alpha) < 0)
        return -CORE_FORMAT;
    return done(c, elu(c->in[0], alpha));
}

static int run_selu(onnx_call *c)
{
    double alpha, gamma;
    if (attr_float(c, "alpha", 1.67326319217681884765625, &alpha) < 0 ||
        attr_float(c, "gamma", 1.05070102214813232421875, &gamma) < 0)
        return -CORE_FORMAT;
    return done(c, kiln_mul_scalar(elu(c->in[0], alpha), gamma));
}

static int run_celu(onnx_call *c)
{
    double alpha;
    kiln_tensor *x = c->in[0];
    if (attr_float(c, "alpha", 1.0, &alpha) < 0)
        return -CORE_FORMAT;
    kiln_tensor *neg = kiln_mul_scalar(kiln_sub_scalar(kiln_exp(kiln_div_scalar(x, alpha)), 1), alpha);
    return done(c, kiln_add(kiln_relu(x), kiln_minimum_scalar(neg, 0)));
}

static kiln_tensor *hard_sigmoid(kiln_tensor *x, double alpha, double beta)
{
    return kiln_minimum_scalar(kiln_maximum_scalar(kiln_add_scalar(kiln_mul_scalar(x, alpha), beta), 0), 1);
}

static int run_hard_sigmoid(onnx_call *c)
{
    double alpha, beta;
    if (attr_float(c, "alpha", 0.2, &alpha) < 0 || attr_float(c, "beta", 0.5, &beta) < 0)
        return -CORE_FORMAT;
    return done(c, hard_sigmoid(c->in[0], alpha, beta));
}

UNARY(hard_swish, kiln_mul(x, hard_sigmoid(x, 1.0 / 6, 0.5)))

static int run_thresholded_relu(onnx_call *c)
{
    double alpha;
    kiln_tensor *x = c->in[0];
    if (attr_float(c, "alpha", 1.0, &alpha) < 0)
        return -CORE_FORMAT;
    return done(c, kiln_where(kiln_gt(x, scalar_of(kiln_dtype_of(x), alpha)), x, scalar_of(kiln_dtype_of(x), 0)));
}

static int run_shrink(onnx_call *c)
{
    double bias, lambd;
    kiln_tensor *x = c->in[0];
    kiln_dtype dt = kiln_dtype_of(x);
    if (attr_float(c, "bias", 0, &bias) < 0 || attr_float(c, "lambd", 0.5, &lambd) < 0)
        return -CORE_FORMAT;
    kiln_tensor *high = kiln_where(kiln_gt(x, scalar_of(dt, lambd)), kiln_sub_scalar(x, bias), scalar_of(dt, 0));
    return done(c, as_dtype(kiln_where(kiln_lt(x, scalar_of(dt, -lambd)), kiln_add_scalar(x, bias), high), dt));
}

static int run_is_inf(onnx_call *c)
{
    int64_t neg, pos;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "detect_negative", 1, &neg) < 0 || attr_int(c, "detect_positive", 1, &pos) < 0)
        return -CORE_FORMAT;
    kiln_dtype dt = kiln_dtype_of(x);
    if (pos && neg)
        return done(c, kiln_eq(kiln_abs(x), scalar_of(dt, INFINITY)));
    if (pos || neg)
        return done(c, kiln_eq(x, scalar_of(dt, pos ? INFINITY : -INFINITY)));
    return done(c, kiln_mul(kiln_ne(x, x), kiln_eq(x, x))); /* false everywhere, NaN too */
}

static int run_cast(onnx_call *c)
{
    int64_t to;
    kiln_dtype dt;
    if (attr_int(c, "to", -1, &to) < 0)
        return -CORE_FORMAT;
    if (!onnx_kiln_dtype((int32_t)to, &dt))
        return onnx_fail(c, CORE_UNSUPPORTED, "cast to %s is not supported (kiln has FLOAT, DOUBLE, INT32, INT64, "
                         "BOOL)", onnx_type_name((int32_t)to));
    return done(c, kiln_cast(c->in[0], dt));
}

static int run_cast_like(onnx_call *c)
{
    return done(c, kiln_cast(c->in[0], kiln_dtype_of(c->in[1])));
}

/* Clip: its bounds are operands from opset 11, attributes before. */
static int run_clip(onnx_call *c)
{
    double lo, hi;
    kiln_tensor *x = c->in[0];
    if (c->m->opset >= 11) {
        kiln_tensor *y = c->node->n_in > 1 && c->in[1] ? kiln_maximum(x, c->in[1]) : same(x);
        return done(c, c->node->n_in > 2 && c->in[2] ? kiln_minimum(y, c->in[2]) : y);
    }
    if (attr_float(c, "min", -INFINITY, &lo) < 0 || attr_float(c, "max", INFINITY, &hi) < 0)
        return -CORE_FORMAT;
    kiln_tensor *y = isfinite(lo) ? kiln_maximum_scalar(x, lo) : same(x);
    return done(c, isfinite(hi) ? kiln_minimum_scalar(y, hi) : y);
}

/* -- Linear algebra and normalization ---------------------------------------- */

static int run_matmul(onnx_call *c)
{
    return done(c, kiln_matmul(c->in[0], c->in[1]));
}

static int run_gemm(onnx_call *c)
{
    double alpha, beta;
    int64_t ta, tb;
    if (attr_float(c, "alpha", 1, &alpha) < 0 || attr_float(c, "beta", 1, &beta) < 0 ||
        attr_int(c, "transA", 0, &ta) < 0 || attr_int(c, "transB", 0, &tb) < 0)
        return -CORE_FORMAT;
    if (kiln_ndim(c->in[0]) != 2 || kiln_ndim(c->in[1]) != 2)
        return onnx_fail(c, CORE_SHAPE, "A and B must be matrices (they have %d and %d dimensions)",
                         kiln_ndim(c->in[0]), kiln_ndim(c->in[1]));
    kiln_tensor *a = ta ? kiln_transpose(c->in[0], 0, 1) : c->in[0];
    kiln_tensor *b = tb ? kiln_transpose(c->in[1], 0, 1) : c->in[1];
    kiln_tensor *y = kiln_matmul(a, b);
    if (alpha != 1)
        y = kiln_mul_scalar(y, alpha);
    if (c->in[2] && beta != 0)
        y = kiln_add(y, beta == 1 ? c->in[2] : kiln_mul_scalar(c->in[2], beta));
    return done(c, y);
}

static int run_batch_norm(onnx_call *c)
{
    double eps;
    int64_t training;
    if (attr_float(c, "epsilon", 1e-5, &eps) < 0 || attr_int(c, "training_mode", 0, &training) < 0)
        return -CORE_FORMAT;
    if (training || c->node->n_out > 1)
        return onnx_fail(c, CORE_UNSUPPORTED, "training mode (running statistics as outputs) is not supported");
    kiln_tensor *x = c->in[0];
    int nd = kiln_ndim(x);
    if (nd < 2)
        return onnx_fail(c, CORE_SHAPE, "X has %d dimensions; BatchNormalization needs at least 2", nd);
    /* y = x * k + (b - mean * k), k = scale / sqrt(var + eps): folded to two constants when the
     * parameters are initializers. */
    kiln_tensor *k = kiln_mul(c->in[1], kiln_rsqrt(kiln_add_scalar(c->in[4], eps)));
    kiln_tensor *shift = kiln_sub(c->in[2], kiln_mul(c->in[3], k));
    return done(c, kiln_add(kiln_mul(x, channel(k, nd)), channel(shift, nd)));
}

/* The mean and variance of x over its axes from first on, kept. */
/* x normalized over its axes from first on; their mean and 1 / sqrt(var +
 * eps), kept, into *mean and *inv_std when not NULL. */
static kiln_tensor *normalize_from(kiln_tensor *x, int first, double eps, kiln_tensor **mean, kiln_tensor **inv_std)
{
    kiln_tensor *m = x;
    for (int d = kiln_ndim(x) - 1; d >= first; d--)
        m = kiln_mean(m, d, true);
    kiln_tensor *centered = kiln_sub(x, m), *var = kiln_mul(centered, centered);
    for (int d = kiln_ndim(x) - 1; d >= first; d--)
        var = kiln_mean(var, d, true);
    kiln_tensor *inv = kiln_rsqrt(kiln_add_scalar(var, eps));
    if (mean)
        *mean = m;
    if (inv_std)
        *inv_std = inv;
    return kiln_mul(centered, inv);
}

static int run_instance_norm(onnx_call *c)
{
    double eps;
    if (attr_float(c, "epsilon", 1e-5, &eps) < 0)
        return -CORE_FORMAT;
    int nd = kiln_ndim(c->in[0]);
    if (nd < 3)
        return onnx_fail(c, CORE_SHAPE, "input has %d dimensions; InstanceNormalization needs at least 3", nd);
    kiln_tensor *y = normalize_from(c->in[0], 2, eps, NULL, NULL);
    return done(c, kiln_add(kiln_mul(y, channel(c->in[1], nd)), channel(c->in[2], nd)));
}

static int run_layer_norm(onnx_call *c)
{
    double eps;
    int64_t axis;
    int a;
    kiln_tensor *x = c->in[0];
    if (attr_float(c, "epsilon", 1e-5, &eps) < 0 || attr_int(c, "axis", -1, &axis) < 0)
        return -CORE_FORMAT;
    int nd = kiln_ndim(x);
    if (norm_axis(c, axis, nd, &a) < 0)
        return -CORE_AXIS;
    if (a == nd - 1 && c->node->n_out == 1)
        return done(c, kiln_layer_norm(x, c->in[1], c->in[2], eps));
    /* over several axes, or with the statistics as results (Mean, InvStdDev) */
    kiln_tensor *y = kiln_mul(normalize_from(x, a, eps, &c->out[1], &c->out[2]), c->in[1]);
    return done(c, c->in[2] ? kiln_add(y, c->in[2]) : y);
}

static int run_lp_norm(onnx_call *c)
{
    int64_t axis, p;
    int a;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "axis", -1, &axis) < 0 || attr_int(c, "p", 2, &p) < 0)
        return -CORE_FORMAT;
    if (norm_axis(c, axis, kiln_ndim(x), &a) < 0)
        return -CORE_AXIS;
    if (p != 1 && p != 2)
        return onnx_fail(c, CORE_VALUE, "p is %lld; LpNormalization takes 1 or 2", (long long)p);
    kiln_tensor *norm = p == 1 ? kiln_sum(kiln_abs(x), a, true) : kiln_sqrt(kiln_sum(kiln_mul(x, x), a, true));
    return done(c, kiln_div(x, norm));
}

/* -- Softmax and its kin ------------------------------------------------------- */

/* f over axis; before opset 13 over x flattened to 2-d at axis (axis default 1). */
static int softmax_like(onnx_call *c, kiln_tensor *(*f)(kiln_tensor *, int))
{
    int64_t axis;
    int a;
    kiln_tensor *x = c->in[0];
    bool coerced = c->m->opset < 13;
    if (attr_int(c, "axis", coerced ? 1 : -1, &axis) < 0)
        return -CORE_FORMAT;
    int nd = kiln_ndim(x);
    if (norm_axis(c, axis, nd, &a) < 0)
        return -CORE_AXIS;
    if (!coerced || a == nd - 1)
        return done(c, f(x, coerced ? nd - 1 : a));
    int64_t flat[2] = {1, -1};
    const int64_t *shape = kiln_shape(x);
    for (int d = 0; d < a; d++)
        flat[0] *= shape[d];
    return done(c, kiln_reshape(f(kiln_reshape(x, 2, flat), 1), nd, shape));
}

static kiln_tensor *hardmax(kiln_tensor *x, int axis)
{
    int nd = kiln_ndim(x);
    int64_t n = kiln_shape(x)[axis], shape[KILN_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        shape[d] = d == axis ? n : 1;
    kiln_tensor *index = kiln_reshape(kiln_arange(0, (double)n, 1, KILN_I64), nd, shape);
    return kiln_cast(kiln_eq(index, kiln_argmax(x, axis, true)), kiln_dtype_of(x));
}

static int run_softmax(onnx_call *c) { return softmax_like(c, kiln_softmax); }
static int run_log_softmax(onnx_call *c) { return softmax_like(c, kiln_log_softmax); }
static int run_hardmax(onnx_call *c) { return softmax_like(c, hardmax); }

/* -- Losses --------------------------------------------------------------------- */

/* NegativeLogLikelihoodLoss of log-probabilities logp [N,C,d...] for target
 * [N,d...]: the target's entries picked with a one-hot mask (no gather),
 * weighted, ignore_index's weighed 0; reduced by none, sum or mean (over
 * the weights). */
static kiln_tensor *nll(onnx_call *c, kiln_tensor *logp, kiln_tensor *target, kiln_tensor *weight)
{
    char buf[16];
    const char *reduction = attr_string(c, "reduction", "mean", buf, sizeof buf);
    const Onnx__AttributeProto *ignore = onnx_attr(c, "ignore_index");
    int nd = kiln_ndim(logp);
    if (nd < 2 || kiln_ndim(target) != nd - 1) {
        onnx_fail(c, CORE_SHAPE, "input of %d dimensions and target of %d: want [N,C,...] and [N,...]", nd,
                  kiln_ndim(target));
        return NULL;
    }
    int64_t classes = kiln_shape(logp)[1], shape[KILN_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        shape[d] = d == 1 ? classes : 1;
    kiln_tensor *index = kiln_reshape(kiln_arange(0, (double)classes, 1, KILN_I64), nd, shape);
    kiln_tensor *hot = kiln_cast(kiln_eq(kiln_unsqueeze(target, 1), index), kiln_dtype_of(logp));
    kiln_tensor *w = kiln_sum(weight ? kiln_mul(hot, channel(weight, nd)) : hot, 1, false);
    if (ignore)
        w = kiln_where(kiln_eq(target, scalar_of(KILN_I64, (double)ignore->i)), scalar_of(kiln_dtype_of(logp), 0), w);
    kiln_tensor *loss = kiln_neg(kiln_mul(kiln_sum(kiln_mul(logp, hot), 1, false), w));
    if (!strcmp(reduction, "none"))
        return loss;
    kiln_tensor *total = kiln_sum(loss, KILN_ALL, false);
    if (!strcmp(reduction, "sum"))
        return total;
    if (strcmp(reduction, "mean")) {
        onnx_fail(c, CORE_UNSUPPORTED, "reduction '%s' is not supported", reduction);
        return NULL;
    }
    return kiln_div(total, kiln_sum(w, KILN_ALL, false));
}

static int run_nll_loss(onnx_call *c)
{
    return done(c, nll(c, c->in[0], c->in[1], c->node->n_in > 2 ? c->in[2] : NULL));
}

static int run_softmax_cross_entropy(onnx_call *c)
{
    kiln_tensor *logp = kiln_log_softmax(c->in[0], 1);
    c->out[1] = logp;
    return done(c, nll(c, logp, c->in[1], c->node->n_in > 2 ? c->in[2] : NULL));
}

/* -- Reductions --------------------------------------------------------------- */

typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, bool);

/* The axes a reduction takes: its attribute, or from opset 13 ReduceSum's
 * operand 1 (from_input); none means every axis unless noop_with_empty_axes.
 * *n is -1 for every axis. */
static int reduce_axes(onnx_call *c, bool from_input, int *axes, int *n, bool *noop)
{
    int64_t v[MAX_INTS], noop_empty;
    int count = -1;
    *n = -1;
    *noop = false;
    if (attr_int(c, "noop_with_empty_axes", 0, &noop_empty) < 0)
        return -CORE_FORMAT;
    if (from_input && c->node->n_in > 1 && c->in[1])
        count = const_ints(c, 1, v);
    else if (!from_input)
        count = attr_ints(c, "axes", v);
    if (count < -1)
        return core_error_status();
    *noop = count <= 0 && noop_empty;
    *n = count <= 0 ? -1 : count;
    int nd = kiln_ndim(c->in[0]);
    for (int i = 0; i < *n; i++) {
        if (norm_axis(c, v[i], nd, &axes[i]) < 0)
            return -CORE_AXIS;
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i])
                return onnx_fail(c, CORE_AXIS, "axis %d is given twice", axes[i]);
    }
    return 0;
}

/* f over axes (every one when n is -1) as one reduction: several axes go as
 * a KILN_AXES set, which a trace reduces in one kernel (a GlobalAveragePool
 * one kernel over H and W, as kiln_adaptive_avg_pool2d), where a reduction
 * an axis would be a kernel each and a product's epilogue left unfused. */
static kiln_tensor *reduce_over(kiln_tensor *x, reduce_fn f, const int *axes, int n, bool keep)
{
    if (n < 0)
        return f(x, KILN_ALL, keep);
    int set = KILN_AXES_FLAG;
    for (int i = 0; i < n; i++)
        set |= 1 << axes[i];
    return f(x, n == 1 ? axes[0] : set, keep);
}

/* What a reduction does before (to each element) and after (to the result). */
typedef enum { PLAIN, ABS, SQUARE, L2, LOG, LOG_SUM_EXP } reduce_extra;

static int reduce(onnx_call *c, reduce_fn f, bool axes_input, reduce_extra post)
{
    int64_t keep;
    int axes[MAX_INTS], n;
    bool noop;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "keepdims", 1, &keep) < 0 || reduce_axes(c, axes_input && c->m->opset >= 13, axes, &n, &noop) < 0)
        return core_error_status();
    if (noop)
        return done(c, same(x));
    if (n > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_AXIS, "%d axes for %d dimensions", n, kiln_ndim(x));
    kiln_dtype dt = kiln_dtype_of(x);
    if (post == LOG_SUM_EXP) {
        kiln_tensor *m = reduce_over(x, kiln_max, axes, n, true);
        kiln_tensor *s = kiln_log(reduce_over(kiln_exp(kiln_sub(x, m)), kiln_sum, axes, n, keep != 0));
        kiln_tensor *mk = keep ? m : reduce_over(m, kiln_max, axes, n, false);
        return done(c, kiln_add(s, mk));
    }
    if (post == ABS)
        x = kiln_abs(x);
    else if (post == SQUARE || post == L2)
        x = kiln_mul(x, x);
    kiln_tensor *y = reduce_over(x, f, axes, n, keep != 0);
    if (post == L2)
        y = kiln_sqrt(y);
    else if (post == LOG)
        y = kiln_log(y);
    return done(c, as_dtype(y, dt));
}

static int run_reduce_sum(onnx_call *c) { return reduce(c, kiln_sum, true, PLAIN); }
static int run_reduce_prod(onnx_call *c) { return reduce(c, kiln_prod, false, PLAIN); }
static int run_reduce_mean(onnx_call *c) { return reduce(c, kiln_mean, false, PLAIN); }
static int run_reduce_max(onnx_call *c) { return reduce(c, kiln_max, false, PLAIN); }
static int run_reduce_min(onnx_call *c) { return reduce(c, kiln_min, false, PLAIN); }
static int run_reduce_l1(onnx_call *c) { return reduce(c, kiln_sum, false, ABS); }
static int run_reduce_l2(onnx_call *c) { return reduce(c, kiln_sum, false, L2); }
static int run_reduce_sum_square(onnx_call *c) { return reduce(c, kiln_sum, false, SQUARE); }
static int run_reduce_log_sum(onnx_call *c) { return reduce(c, kiln_sum, false, LOG); }
static int run_reduce_log_sum_exp(onnx_call *c) { return reduce(c, NULL, false, LOG_SUM_EXP); }

/* kiln_argmax or kiln_argmin: min is not argmax of the negation, which
 * overflows at an integer type's minimum. */
static int arg_reduce(onnx_call *c, kiln_tensor *(*arg)(kiln_tensor *, int, bool))
{
    int64_t axis, keep, last;
    int a;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "axis", 0, &axis) < 0 || attr_int(c, "keepdims", 1, &keep) < 0 ||
        attr_int(c, "select_last_index", 0, &last) < 0)
        return -CORE_FORMAT;
    if (norm_axis(c, axis, kiln_ndim(x), &a) < 0)
        return -CORE_AXIS;
    if (!last)
        return done(c, arg(x, a, keep != 0));
    /* the last of equals: the first along the axis reversed, counted from the end */
    int64_t n = kiln_ndim(x) ? kiln_shape(x)[a] : 1;
    kiln_tensor *first = arg(kiln_ndim(x) ? kiln_slice(x, a, -1, INT64_MIN, -1) : x, a, keep != 0);
    return done(c, kiln_sub(scalar_of(KILN_I64, (double)(n - 1)), first));
}
static int run_argmax(onnx_call *c) { return arg_reduce(c, kiln_argmax); }
static int run_argmin(onnx_call *c) { return arg_reduce(c, kiln_argmin); }

static int global_pool(onnx_call *c, reduce_fn f)
{
    kiln_tensor *y = c->in[0];
    int nd = kiln_ndim(y);
    if (nd < 3)
        return onnx_fail(c, CORE_SHAPE, "input has %d dimensions; a global pool needs N, C and a spatial axis", nd);
    int spatial[KILN_MAX_DIMS];
    for (int d = 2; d < nd; d++)
        spatial[d - 2] = d;
    return done(c, reduce_over(y, f, spatial, nd - 2, true));
}
static int run_global_average_pool(onnx_call *c) { return global_pool(c, kiln_mean); }
static int run_global_max_pool(onnx_call *c) { return global_pool(c, kiln_max); }

/* -- Shapes and movement ------------------------------------------------------ */

static kiln_tensor *ints_tensor(const int64_t *v, int64_t n)
{
    return kiln_from_data(KILN_I64, 1, &n, v);
}

static int run_shape(onnx_call *c)
{
    int64_t start, end;
    int nd = kiln_ndim(c->in[0]);
    if (attr_int(c, "start", 0, &start) < 0 || attr_int(c, "end", nd, &end) < 0)
        return -CORE_FORMAT;
    start = start < 0 ? start + nd : start;
    end = end < 0 ? end + nd : end;
    start = start < 0 ? 0 : start > nd ? nd : start;
    end = end < start ? start : end > nd ? nd : end;
    return done(c, ints_tensor(kiln_shape(c->in[0]) + start, end - start));
}

static int run_size(onnx_call *c)
{
    return done(c, kiln_full(KILN_I64, 0, NULL, (double)kiln_numel(c->in[0])));
}

static int run_constant(onnx_call *c)
{
    const Onnx__NodeProto *p = c->node->proto;
    if (p->n_attribute != 1)
        return onnx_fail(c, CORE_FORMAT, "has %zu attributes; Constant takes one", p->n_attribute);
    const Onnx__AttributeProto *a = p->attribute[0];
    if (!strcmp(a->name, "value") && a->t)
        return done(c, eager_own(onnx_tensor_to_kiln("kiln_onnx", c->m->value_names[c->node->out[0]], a->t, NULL)));
    if (!strcmp(a->name, "value_float"))
        return done(c, scalar_of(KILN_F32, a->f));
    if (!strcmp(a->name, "value_int"))
        return done(c, scalar_of(KILN_I64, (double)a->i));
    if (!strcmp(a->name, "value_floats"))
        return done(c, kiln_from_data(KILN_F32, 1, &(int64_t){(int64_t)a->n_floats}, a->floats));
    if (!strcmp(a->name, "value_ints"))
        return done(c, ints_tensor(a->ints, (int64_t)a->n_ints));
    return onnx_fail(c, CORE_UNSUPPORTED, "a constant given as '%s' is not supported", a->name);
}

static int run_constant_of_shape(onnx_call *c)
{
    int64_t shape[MAX_INTS];
    int n = const_ints(c, 0, shape);
    if (n < 0)
        return n;
    const Onnx__AttributeProto *a = onnx_attr(c, "value");
    kiln_dtype dt = KILN_F32;
    double v = 0;
    if (a && a->t) {
        kiln_tensor *t = onnx_tensor_to_kiln("kiln_onnx", "value", a->t, NULL);
        if (!t)
            return core_error_status();
        dt = kiln_dtype_of(t);
        v = kiln_numel(t) == 1 ? kiln_item(t) : NAN;
        int64_t numel = kiln_numel(t);
        kiln_release(t);
        if (numel != 1)
            return onnx_fail(c, CORE_FORMAT, "value has %lld elements, not one", (long long)numel);
    }
    if (n > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_UNSUPPORTED, "a shape of %d dimensions (kiln has at most %d)", n, KILN_MAX_DIMS);
    return done(c, kiln_full(dt, n, shape, v));
}

/* -- Resize and Upsample -------------------------------------------------------- */

typedef enum { COORD_HALF_PIXEL, COORD_PYTORCH_HALF_PIXEL, COORD_ALIGN_CORNERS, COORD_ASYMMETRIC,
               COORD_TF_HALF_PIXEL_FOR_NN } coord_mode;
typedef enum { NEAREST_ROUND_PREFER_FLOOR, NEAREST_ROUND_PREFER_CEIL, NEAREST_FLOOR, NEAREST_CEIL } nearest_mode;

typedef struct {
    bool linear;
    coord_mode coord;
    nearest_mode nearest;
} resize_mode;

/* Looks name up in names (n of them): its index, or -1. */
static int name_index(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -1;
}

static int resize_attributes(onnx_call *c, resize_mode *r)
{
    static const char *const modes[] = {"nearest", "linear"};
    static const char *const coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                         "tf_half_pixel_for_nn"};
    static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    char mode[32], coord[32], nearest[32];
    int m = name_index(attr_string(c, "mode", "nearest", mode, sizeof mode), modes, 2);
    int k = name_index(attr_string(c, "coordinate_transformation_mode", "half_pixel", coord, sizeof coord), coords, 5);
    int n = name_index(attr_string(c, "nearest_mode", "round_prefer_floor", nearest, sizeof nearest), nearests, 4);
    if (m < 0)
        return onnx_fail(c, CORE_UNSUPPORTED, "mode '%s' is not supported (kiln resizes nearest and linear)", mode);
    if (k < 0)
        return onnx_fail(c, CORE_UNSUPPORTED, "coordinate_transformation_mode '%s' is not supported", coord);
    if (n < 0)
        return onnx_fail(c, CORE_VALUE, "nearest_mode '%s' is none of ONNX's", nearest);
    *r = (resize_mode){m == 1, (coord_mode)k, (nearest_mode)n};
    return 0;
}

/* The values of operand i (floats, at most MAX_INTS) into v: how many, or a
 * negative status. */
static int const_floats(const onnx_call *c, int i, double *v)
{
    kiln_tensor *t = kiln_cast(c->in[i], KILN_F64);
    if (t && kiln_numel(t) > MAX_INTS)
        return onnx_fail(c, CORE_UNSUPPORTED, "operand %d ('%s') has %lld values; kiln takes at most %d", i,
                         operand_name(c, i), (long long)kiln_numel(t), MAX_INTS);
    if (!t || kiln_copy_to_host(t, v, (size_t)kiln_numel(t) * sizeof *v) < 0)
        return core_error_status();
    return (int)kiln_numel(t);
}

/* Where output position x of an axis resized from in by scale reads the
 * input, in input coordinates. The resized length is in * scale unrounded,
 * as ONNX's reference takes it. */
static double source_coordinate(coord_mode mode, int64_t x, double scale, int64_t in)
{
    double out = (double)in * scale;
    switch (mode) {
    case COORD_HALF_PIXEL:
        return (x + 0.5) / scale - 0.5;
    case COORD_PYTORCH_HALF_PIXEL:
        return out > 1 ? (x + 0.5) / scale - 0.5 : 0;
    case COORD_ALIGN_CORNERS:
        return out > 1 ? x * (double)(in - 1) / (out - 1) : 0;
    case COORD_TF_HALF_PIXEL_FOR_NN:
        return (x + 0.5) / scale;
    default:
        return x / scale;
    }
}

static int64_t nearest_index(nearest_mode mode, double x)
{
    switch (mode) {
    case NEAREST_FLOOR:
        return (int64_t)floor(x);
    case NEAREST_CEIL:
        return (int64_t)ceil(x);
    case NEAREST_ROUND_PREFER_CEIL:
        return x - floor(x) == 0.5 ? (int64_t)ceil(x) : (int64_t)llround(x);
    default:
        return x - floor(x) == 0.5 ? (int64_t)floor(x) : (int64_t)llround(x);
    }
}

static int64_t clamp_index(int64_t i, int64_t n)
{
    return i < 0 ? 0 : i >= n ? n - 1 : i;
}

/* A constant of n values, made with the trace paused and put on the device of
 * like (a tracer's: its trace's), owned by the current scope. */
static kiln_tensor *constant_like(const kiln_tensor *like, kiln_dtype dt, int ndim, const int64_t *shape,
                                  const void *data)
{
    eager_trace *trace = eager_active_trace();
    eager_trace_activate(NULL);
    kiln_tensor *t = kiln_to_device(kiln_from_data(dt, ndim, shape, data), onnx_device_of(like));
    eager_trace_activate(trace);
    return t;
}

/* floor(size scale) into *out; an error where that is no size (a NaN,
 * negative or huge scale), whose conversion to an integer is undefined. */
static int scaled_size(onnx_call *c, int64_t size, double scale, int axis, int64_t *out)
{
    double scaled = floor((double)size * scale);
    if (!(scaled >= 0 && scaled <= (double)IR_MAX_NUMEL))
        return onnx_fail(c, CORE_VALUE, "scale %g of axis %d of size %lld gives no size", scale, axis,
                         (long long)size);
    *out = (int64_t)scaled;
    return 0;
}

/* x resized along axis to out positions: nearest picks one input position
 * each, linear blends two. An axis the mapping leaves as it is is x. */
static kiln_tensor *resize_axis(kiln_tensor *x, int axis, int64_t out, double scale, const resize_mode *r)
{
    int64_t in = kiln_shape(x)[axis], *lo = malloc((size_t)out * sizeof *lo), *hi = malloc((size_t)out * sizeof *hi);
    double *w = malloc(2 * (size_t)out * sizeof *w); /* hi's weights, then lo's */
    bool same = out == in;
    for (int64_t i = 0; lo && hi && w && i < out; i++) {
        double at = source_coordinate(r->coord, i, scale, in);
        lo[i] = clamp_index(r->linear ? (int64_t)floor(at) : nearest_index(r->nearest, at), in);
        hi[i] = clamp_index((int64_t)floor(at) + 1, in);
        w[i] = r->linear && lo[i] != hi[i] ? at - floor(at) : 0;
        w[out + i] = 1 - w[i];
        same &= lo[i] == i && w[i] == 0;
    }
    kiln_tensor *y = NULL;
    if (!lo || !hi || !w)
        core_fail_status(CORE_NOMEM, "kiln_onnx");
    else if (same)
        y = x;
    else if (!r->linear)
        y = kiln_index_select(x, axis, constant_like(x, KILN_I64, 1, &out, lo));
    else {
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < kiln_ndim(x); d++)
            shape[d] = d == axis ? out : 1;
        kiln_dtype dt = kiln_dtype_of(x);
        kiln_tensor *w_hi = kiln_cast(constant_like(x, KILN_F64, kiln_ndim(x), shape, w), dt);
        kiln_tensor *w_lo = kiln_cast(constant_like(x, KILN_F64, kiln_ndim(x), shape, w + out), dt);
        kiln_tensor *a = kiln_index_select(x, axis, constant_like(x, KILN_I64, 1, &out, lo));
        kiln_tensor *b = kiln_index_select(x, axis, constant_like(x, KILN_I64, 1, &out, hi));
        y = kiln_add(kiln_mul(a, w_lo), kiln_mul(b, w_hi));
    }
    free(lo);
    free(hi);
    free(w);
    return y;
}

/* x resized to sizes (scales[d] the ratio each axis's coordinates use). */
static int resize(onnx_call *c, const resize_mode *r, const double *scales, const int64_t *sizes)
{
    kiln_tensor *y = c->in[0];
    if (r->linear && !ir_dtype_is_float(kiln_dtype_of(y)))
        return onnx_fail(c, CORE_UNSUPPORTED, "linear resizing of %s is not supported",
                         kiln_dtype_name(kiln_dtype_of(y)));
    for (int d = 0; y && d < kiln_ndim(c->in[0]); d++) {
        if (sizes[d] < 1 || !(scales[d] > 0))
            return onnx_fail(c, CORE_VALUE, "axis %d would be resized to %lld (scale %g)", d, (long long)sizes[d],
                             scales[d]);
        y = resize_axis(y, d, sizes[d], scales[d], r);
    }
    return done(c, y == c->in[0] ? same(y) : y);
}

static int run_resize(onnx_call *c)
{
    resize_mode r;
    if (resize_attributes(c, &r) < 0)
        return core_error_status();
    if (c->m->opset < 11)
        return onnx_fail(c, CORE_UNSUPPORTED, "Resize before opset 11 is not supported");
    int nd = kiln_ndim(c->in[0]);
    const int64_t *shape = kiln_shape(c->in[0]);
    double scales[MAX_INTS];
    int64_t sizes[MAX_INTS];
    bool by_sizes = c->node->n_in > 3 && c->in[3] && kiln_numel(c->in[3]) > 0;
    int n = by_sizes ? const_ints(c, 3, sizes) : c->node->n_in > 2 && c->in[2] ? const_floats(c, 2, scales) : -1;
    if (n == -1 || (n >= 0 && n != nd))
        return onnx_fail(c, CORE_VALUE, "%s %d %s for %d dimensions", n < 0 ? "neither scales nor sizes:" : "",
                         n < 0 ? 0 : n, by_sizes ? "sizes" : "scales", nd);
    if (n < 0)
        return n;
    for (int d = 0; d < nd; d++) {
        if (by_sizes && sizes[d] > IR_MAX_NUMEL) /* its positions' table would wrap */
            return onnx_fail(c, CORE_VALUE, "size %lld of axis %d is past 2^59 elements", (long long)sizes[d], d);
        if (by_sizes)
            scales[d] = (double)sizes[d] / (double)shape[d];
        else if (scaled_size(c, shape[d], scales[d], d, &sizes[d]) < 0)
            return core_error_status();
    }
    return resize(c, &r, scales, sizes);
}

/* Upsample (opsets 7 to 9, Resize's predecessor): scales as an attribute or
 * operand, the output position x reading x / scale. */
static int run_upsample(onnx_call *c)
{
    char mode[32];
    const char *name = attr_string(c, "mode", "nearest", mode, sizeof mode);
    resize_mode r = {!strcmp(name, "linear"), COORD_ASYMMETRIC, NEAREST_FLOOR};
    if (!r.linear && strcmp(name, "nearest"))
        return onnx_fail(c, CORE_UNSUPPORTED, "mode '%s' is not supported (nearest and linear are)", name);
    const Onnx__AttributeProto *a = onnx_attr(c, "scales");
    int nd = kiln_ndim(c->in[0]), n = -1;
    double scales[MAX_INTS];
    int64_t sizes[MAX_INTS];
    if (c->node->n_in > 1)
        n = const_floats(c, 1, scales);
    else if (a && a->n_floats <= MAX_INTS)
        for (n = 0; n < (int)a->n_floats; n++)
            scales[n] = a->floats[n];
    if (n < -1)
        return n;
    if (n != nd)
        return onnx_fail(c, CORE_VALUE, "%d scales for %d dimensions", n < 0 ? 0 : n, nd);
    for (int d = 0; d < nd; d++)
        if (scaled_size(c, kiln_shape(c->in[0])[d], scales[d], d, &sizes[d]) < 0)
            return core_error_status();
    return resize(c, &r, scales, sizes);
}

static int run_reshape(onnx_call *c)
{
    int64_t shape[MAX_INTS], allowzero;
    int n = c->m->opset < 5 ? attr_ints(c, "shape", shape) : const_ints(c, 1, shape);
    if (n < 0)
        return n < -1 ? core_error_status() : onnx_fail(c, CORE_FORMAT, "has no shape");
    if (attr_int(c, "allowzero", 0, &allowzero) < 0)
        return -CORE_FORMAT;
    if (n > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_UNSUPPORTED, "a shape of %d dimensions (kiln has at most %d)", n, KILN_MAX_DIMS);
    kiln_tensor *x = c->in[0];
    for (int d = 0; d < n && !allowzero; d++)
        if (shape[d] == 0) {
            if (d >= kiln_ndim(x))
                return onnx_fail(c, CORE_SHAPE, "shape[%d] is 0 (copy the input's size) past its %d dimensions", d,
                                 kiln_ndim(x));
            shape[d] = kiln_shape(x)[d];
        }
    return done(c, kiln_reshape(x, n, shape));
}

static int run_flatten(onnx_call *c)
{
    int64_t axis;
    int a;
    kiln_tensor *x = c->in[0];
    int nd = kiln_ndim(x);
    if (attr_int(c, "axis", 1, &axis) < 0)
        return -CORE_FORMAT;
    if (axis == nd)
        a = nd;
    else if (norm_axis(c, axis, nd, &a) < 0)
        return -CORE_AXIS;
    int64_t flat[2] = {1, 1};
    for (int d = 0; d < nd; d++)
        flat[d >= a] *= kiln_shape(x)[d];
    return done(c, kiln_reshape(x, 2, flat));
}

static int run_transpose(onnx_call *c)
{
    int64_t v[MAX_INTS];
    int perm[KILN_MAX_DIMS];
    kiln_tensor *x = c->in[0];
    int nd = kiln_ndim(x), n = attr_ints(c, "perm", v);
    if (n < -1)
        return core_error_status();
    if (n >= 0 && n != nd)
        return onnx_fail(c, CORE_AXIS, "perm has %d entries for %d dimensions", n, nd);
    for (int d = 0; d < nd; d++) {
        if (n < 0)
            perm[d] = nd - 1 - d;
        else if (norm_axis(c, v[d], nd, &perm[d]) < 0)
            return -CORE_AXIS;
    }
    return done(c, kiln_permute(x, perm));
}

/* Squeeze's and Unsqueeze's axes: an attribute before opset 13, operand 1 from. */
static int node_axes(onnx_call *c, int64_t *v)
{
    if (c->m->opset < 13)
        return attr_ints(c, "axes", v);
    return c->node->n_in > 1 && c->in[1] ? const_ints(c, 1, v) : -1;
}

static int run_squeeze(onnx_call *c)
{
    int64_t v[MAX_INTS];
    int axes[MAX_INTS];
    kiln_tensor *x = c->in[0];
    int nd = kiln_ndim(x), n = node_axes(c, v);
    if (n < -1)
        return core_error_status();
    if (n < 0)
        return done(c, kiln_squeeze(x, KILN_ALL));
    for (int i = 0; i < n; i++)
        if (norm_axis(c, v[i], nd, &axes[i]) < 0)
            return -CORE_AXIS;
    kiln_tensor *y = same(x);
    for (int d = nd - 1; d >= 0 && y; d--)
        for (int i = 0; i < n; i++)
            if (axes[i] == d) {
                y = kiln_squeeze(y, d);
                break;
            }
    return done(c, y);
}

static int run_unsqueeze(onnx_call *c)
{
    int64_t v[MAX_INTS];
    kiln_tensor *x = c->in[0];
    int n = node_axes(c, v);
    if (n < -1)
        return core_error_status();
    if (n < 0)
        return onnx_fail(c, CORE_FORMAT, "has no axes");
    int out_nd = kiln_ndim(x) + n;
    if (out_nd > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_UNSUPPORTED, "the result would have %d dimensions (kiln has at most %d)", out_nd,
                         KILN_MAX_DIMS);
    bool inserted[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < n; i++) {
        int a;
        if (norm_axis(c, v[i], out_nd, &a) < 0)
            return -CORE_AXIS;
        if (inserted[a])
            return onnx_fail(c, CORE_AXIS, "axis %d is given twice", a);
        inserted[a] = true;
    }
    kiln_tensor *y = x;
    for (int d = 0; d < out_nd && y; d++)
        if (inserted[d])
            y = kiln_unsqueeze(y, d);
    return done(c, y == x ? same(x) : y);
}

static int run_concat(onnx_call *c)
{
    int64_t axis;
    int a;
    if (attr_int(c, "axis", 0, &axis) < 0)
        return -CORE_FORMAT;
    if (norm_axis(c, axis, kiln_ndim(c->in[0]), &a) < 0)
        return -CORE_AXIS;
    return done(c, kiln_concat(c->in, c->node->n_in, a));
}

static int run_split(onnx_call *c)
{
    int64_t axis, split[MAX_INTS];
    int a;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "axis", 0, &axis) < 0)
        return -CORE_FORMAT;
    if (norm_axis(c, axis, kiln_ndim(x), &a) < 0)
        return -CORE_AXIS;
    int k = c->node->n_out;
    int n = c->m->opset < 13 ? attr_ints(c, "split", split) : c->node->n_in > 1 && c->in[1] ? const_ints(c, 1, split) : -1;
    if (n < -1)
        return core_error_status();
    int64_t size = kiln_shape(x)[a];
    if (n < 0) {
        if (k > MAX_INTS)
            return onnx_fail(c, CORE_UNSUPPORTED, "%d outputs (kiln takes at most %d)", k, MAX_INTS);
        for (int i = 0; i < k; i++)
            split[i] = (size + k - 1) / k;
        split[k - 1] = size - (size + k - 1) / k * (k - 1);
        n = k;
    }
    if (n != k)
        return onnx_fail(c, CORE_VALUE, "split has %d sizes for %d outputs", n, k);
    int64_t at = 0;
    for (int i = 0; i < k; i++) {
        if (split[i] < 0 || at + split[i] > size)
            return onnx_fail(c, CORE_VALUE, "the split sizes do not fit axis %d of size %lld", a, (long long)size);
        if (!(c->out[i] = kiln_slice(x, a, at, at + split[i], 1)))
            return core_error_status();
        at += split[i];
    }
    if (at != size)
        return onnx_fail(c, CORE_VALUE, "the split sizes add up to %lld, not %lld", (long long)at, (long long)size);
    return 0;
}

static int run_slice(onnx_call *c)
{
    int64_t starts[MAX_INTS], ends[MAX_INTS], axes[MAX_INTS], steps[MAX_INTS];
    kiln_tensor *x = c->in[0];
    bool attrs = c->m->opset < 10;
    int n = attrs ? attr_ints(c, "starts", starts) : const_ints(c, 1, starts);
    int ne = attrs ? attr_ints(c, "ends", ends) : const_ints(c, 2, ends);
    int na = attrs ? attr_ints(c, "axes", axes) : c->node->n_in > 3 && c->in[3] ? const_ints(c, 3, axes) : -1;
    int ns = !attrs && c->node->n_in > 4 && c->in[4] ? const_ints(c, 4, steps) : -1;
    if (n < 0 || ne < 0 || na < -1 || ns < -1)
        return core_error_status() ? core_error_status() : onnx_fail(c, CORE_FORMAT, "has no starts or ends");
    if (ne != n || (na >= 0 && na != n) || (ns >= 0 && ns != n))
        return onnx_fail(c, CORE_VALUE, "starts, ends, axes and steps differ in length");
    kiln_tensor *y = same(x);
    for (int i = 0; i < n && y; i++) {
        int a;
        if (norm_axis(c, na >= 0 ? axes[i] : i, kiln_ndim(x), &a) < 0)
            return -CORE_AXIS;
        int64_t step = ns >= 0 ? steps[i] : 1;
        if (step == 0)
            return onnx_fail(c, CORE_VALUE, "step %d is 0", i);
        y = kiln_slice(y, a, starts[i], ends[i], step);
    }
    return done(c, y);
}

static int run_expand(onnx_call *c)
{
    int64_t shape[MAX_INTS];
    kiln_tensor *x = c->in[0];
    int n = const_ints(c, 1, shape);
    if (n < 0)
        return n;
    int nd = kiln_ndim(x), out_nd = n > nd ? n : nd;
    if (out_nd > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_UNSUPPORTED, "a shape of %d dimensions (kiln has at most %d)", n, KILN_MAX_DIMS);
    int64_t out[KILN_MAX_DIMS];
    /* ONNX broadcasts both ways: a size 1 of the shape keeps x's size. */
    for (int d = 0; d < out_nd; d++) {
        int dx = d - (out_nd - nd), ds = d - (out_nd - n);
        int64_t sx = dx >= 0 ? kiln_shape(x)[dx] : 1, ss = ds >= 0 ? shape[ds] : 1;
        if (sx != ss && sx != 1 && ss != 1)
            return onnx_fail(c, CORE_SHAPE, "size %lld of the input does not broadcast to %lld", (long long)sx,
                             (long long)ss);
        out[d] = sx == 1 ? ss : sx;
    }
    return done(c, kiln_expand(x, out_nd, out));
}

static int run_tile(onnx_call *c)
{
    int64_t repeats[MAX_INTS];
    kiln_tensor *x = c->in[0];
    int n = const_ints(c, 1, repeats);
    if (n < 0)
        return n;
    if (n != kiln_ndim(x))
        return onnx_fail(c, CORE_VALUE, "repeats has %d entries for %d dimensions", n, kiln_ndim(x));
    kiln_tensor *y = same(x);
    for (int d = 0; d < n && y; d++) {
        if (repeats[d] < 0 || repeats[d] > 4096)
            return onnx_fail(c, CORE_UNSUPPORTED, "repeats %lld (kiln takes 0 to 4096)", (long long)repeats[d]);
        if (repeats[d] == 1)
            continue;
        kiln_tensor *copies[4096];
        for (int64_t r = 0; r < repeats[d]; r++)
            copies[r] = y;
        y = repeats[d] ? kiln_concat(copies, (int)repeats[d], d) : kiln_slice(y, d, 0, 0, 1);
    }
    return done(c, y);
}

static int run_range(onnx_call *c)
{
    double start, limit, delta;
    if (const_scalar(c, 0, &start) < 0 || const_scalar(c, 1, &limit) < 0 || const_scalar(c, 2, &delta) < 0)
        return core_error_status();
    return done(c, kiln_arange(start, limit, delta, kiln_dtype_of(c->in[0])));
}

/* Gather: kiln_index_select of the indices flattened, shaped back. */
static int run_gather(onnx_call *c)
{
    int64_t axis;
    int a;
    kiln_tensor *x = c->in[0], *idx = c->in[1];
    if (attr_int(c, "axis", 0, &axis) < 0)
        return -CORE_FORMAT;
    int nd = kiln_ndim(x), ind_nd = kiln_ndim(idx);
    if (norm_axis(c, axis, nd, &a) < 0)
        return -CORE_AXIS;
    if (nd - 1 + ind_nd > KILN_MAX_DIMS)
        return onnx_fail(c, CORE_UNSUPPORTED, "the result would have %d dimensions", nd - 1 + ind_nd);
    int64_t shape[KILN_MAX_DIMS], flat = -1;
    int out_nd = 0;
    for (int d = 0; d < a; d++)
        shape[out_nd++] = kiln_shape(x)[d];
    for (int d = 0; d < ind_nd; d++)
        shape[out_nd++] = kiln_shape(idx)[d];
    for (int d = a + 1; d < nd; d++)
        shape[out_nd++] = kiln_shape(x)[d];
    kiln_tensor *picked = kiln_index_select(x, a, ind_nd == 1 ? idx : kiln_reshape(idx, 1, &flat));
    return done(c, kiln_reshape(picked, out_nd, shape));
}

static int run_gather_elements(onnx_call *c)
{
    int64_t axis;
    int a;
    if (attr_int(c, "axis", 0, &axis) < 0)
        return -CORE_FORMAT;
    if (norm_axis(c, axis, kiln_ndim(c->in[0]), &a) < 0)
        return -CORE_AXIS;
    return done(c, kiln_gather(c->in[0], a, c->in[1]));
}

/* ScatterElements with reduction add: kiln_scatter_add. */
static int run_scatter_elements(onnx_call *c)
{
    int64_t axis;
    int a;
    char buf[16];
    if (attr_int(c, "axis", 0, &axis) < 0)
        return -CORE_FORMAT;
    const char *reduction = attr_string(c, "reduction", "none", buf, sizeof buf);
    if (strcmp(reduction, "add"))
        return onnx_fail(c, CORE_UNSUPPORTED, "reduction '%s' is not supported (kiln scatters by adding)", reduction);
    if (norm_axis(c, axis, kiln_ndim(c->in[0]), &a) < 0)
        return -CORE_AXIS;
    return done(c, kiln_scatter_add(c->in[0], a, c->in[1], c->in[2]));
}

static int run_cumsum(onnx_call *c)
{
    int64_t exclusive, reverse, axis[MAX_INTS];
    int a;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "exclusive", 0, &exclusive) < 0 || attr_int(c, "reverse", 0, &reverse) < 0)
        return -CORE_FORMAT;
    int n = const_ints(c, 1, axis);
    if (n < 0)
        return n;
    if (n != 1 || norm_axis(c, axis[0], kiln_ndim(x), &a) < 0)
        return onnx_fail(c, CORE_AXIS, "needs one axis in range");
    kiln_tensor *y = reverse ? kiln_flip(x, a) : x;
    kiln_tensor *sums = kiln_cumsum(y, a);
    if (exclusive)
        sums = kiln_sub(sums, y);
    return done(c, as_dtype(reverse ? kiln_flip(sums, a) : sums, kiln_dtype_of(x)));
}

static int run_topk(onnx_call *c)
{
    int64_t axis, largest, sorted, k[MAX_INTS];
    int a;
    if (attr_int(c, "axis", -1, &axis) < 0 || attr_int(c, "largest", 1, &largest) < 0 ||
        attr_int(c, "sorted", 1, &sorted) < 0)
        return -CORE_FORMAT;
    int n = const_ints(c, 1, k);
    if (n < 0)
        return n;
    if (n != 1 || norm_axis(c, axis, kiln_ndim(c->in[0]), &a) < 0)
        return onnx_fail(c, CORE_VALUE, "needs one K and an axis in range");
    return kiln_topk(c->in[0], k[0], a, largest != 0, &c->out[0], &c->out[1]) < 0 ? core_error_status() : 0;
}

/* Mod: Python's % (fmod 0) is kiln_remainder; C's fmod takes the dividend's
 * sign, so a remainder of the other sign moves back by the divisor. */
static int run_mod(onnx_call *c)
{
    int64_t fmod;
    kiln_tensor *a = c->in[0], *b = c->in[1];
    if (attr_int(c, "fmod", 0, &fmod) < 0)
        return -CORE_FORMAT;
    kiln_tensor *r = kiln_remainder(a, b);
    if (!fmod)
        return done(c, r);
    kiln_tensor *zero = scalar_of(kiln_dtype_of(a), 0);
    kiln_tensor *moved = kiln_logical_and(kiln_ne(r, zero), kiln_ne(kiln_lt(r, zero), kiln_lt(a, zero)));
    return done(c, kiln_where(moved, kiln_sub(r, b), r));
}

/* auto_pad SAME_UPPER (upper) and SAME_LOWER: the pads that make each
 * spatial size of the result ceil(input / stride), the odd one at the end
 * (UPPER) or at the beginning. */
static void same_pads(const onnx_call *c, bool upper, int s, const int64_t *kernel, const int64_t *stride,
                      const int64_t *dilation, int64_t *pads)
{
    const int64_t *shape = kiln_shape(c->in[0]);
    for (int d = 0; d < s; d++) {
        int64_t in = shape[2 + d], out = (in + stride[d] - 1) / stride[d];
        int64_t total = (out - 1) * stride[d] + (kernel[d] - 1) * dilation[d] + 1 - in;
        total = total > 0 ? total : 0;
        pads[d] = upper ? total / 2 : total - total / 2;
        pads[s + d] = total - pads[d];
    }
}

/* Conv and the pools take 1-d or 2-d windows (N, C, then the spatial
 * axes); a 1-d one runs as 2-d of height 1. ONNX's pads are [begins...,
 * ends...]: as 2-d, [top, left, bottom, right]. *spatial: 1 or 2. A Conv's
 * window is its weight's (weight; NULL for the pools) where kernel_shape is
 * not given. */
static int window_params(onnx_call *c, const kiln_tensor *weight, int64_t *kernel, int64_t *stride, int64_t *pads,
                         int64_t *dilation, int *spatial)
{
    int64_t v[MAX_INTS];
    char buf[16];
    const char *auto_pad = attr_string(c, "auto_pad", "NOTSET", buf, sizeof buf);
    bool same = !strcmp(auto_pad, "SAME_UPPER") || !strcmp(auto_pad, "SAME_LOWER");
    if (strcmp(auto_pad, "NOTSET") && strcmp(auto_pad, "VALID") && !same)
        return onnx_fail(c, CORE_VALUE, "auto_pad '%s' is none of NOTSET, VALID, SAME_UPPER and SAME_LOWER",
                         auto_pad);
    int s = *spatial = kiln_ndim(c->in[0]) - 2;
    if (s != 1 && s != 2)
        return onnx_fail(c, CORE_UNSUPPORTED, "%d-d windows are not supported (kiln convolves and pools 1-d and 2-d)",
                         s);
    struct {
        const char *name;
        int64_t *out, fallback;
        int count;
    } lists[] = {{"kernel_shape", kernel, 0, s}, {"strides", stride, 1, s}, {"pads", pads, 0, 2 * s},
                 {"dilations", dilation, 1, s}};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        int n = attr_ints(c, lists[i].name, v);
        if (n < -1)
            return core_error_status();
        if (n >= 0 && n != lists[i].count)
            return onnx_fail(c, CORE_VALUE, "%s has %d values, not %d", lists[i].name, n, lists[i].count);
        for (int k = 0; k < lists[i].count; k++)
            lists[i].out[k] = n < 0 ? lists[i].fallback : v[k];
    }
    for (int d = 0; weight && !onnx_attr(c, "kernel_shape") && d < s && kiln_ndim(weight) == s + 2; d++)
        kernel[d] = kiln_shape(weight)[2 + d];
    if (same)
        same_pads(c, !strcmp(auto_pad, "SAME_UPPER"), s, kernel, stride, dilation, pads);
    if (s == 1) {
        int64_t p0 = pads[0], p1 = pads[1];
        kernel[1] = kernel[0], stride[1] = stride[0], dilation[1] = dilation[0];
        kernel[0] = stride[0] = dilation[0] = 1;
        pads[0] = pads[2] = 0, pads[1] = p0, pads[3] = p1;
    }
    return 0;
}

/* x padded with value by pads [top, left, bottom, right], all of them when
 * all is set, else the parts beyond the symmetric ones left in pads[0..1]. */
static kiln_tensor *pad_explicitly(kiln_tensor *x, int64_t *pads, double value, bool all)
{
    if (!all && pads[0] == pads[2] && pads[1] == pads[3])
        return x;
    int64_t extra[4] = {pads[1], pads[3], pads[0], pads[2]}; /* kiln_pad: last axis first */
    pads[0] = pads[1] = 0;
    return kiln_pad(x, 4, extra, KILN_PAD_CONSTANT, value);
}

/* A 1-d operand as 2-d of height 1, and a 2-d result back. */
static kiln_tensor *lift(kiln_tensor *t, int spatial)
{
    return spatial == 1 && t ? kiln_unsqueeze(t, 2) : t;
}

static kiln_tensor *lower(kiln_tensor *t, int spatial)
{
    return spatial == 1 && t ? kiln_squeeze(t, 2) : t;
}

static int run_conv(onnx_call *c)
{
    int64_t kernel[2], stride[2], pads[4], dilation[2], group;
    int spatial;
    if (attr_int(c, "group", 1, &group) < 0 || window_params(c, c->in[1], kernel, stride, pads, dilation, &spatial) < 0)
        return core_error_status();
    kiln_tensor *x = pad_explicitly(lift(c->in[0], spatial), pads, 0, false);
    kiln_conv2d_params p = {{stride[0], stride[1]}, {pads[0], pads[1]}, {dilation[0], dilation[1]}, group};
    kiln_tensor *y = kiln_conv2d(x, lift(c->in[1], spatial), c->node->n_in > 2 ? c->in[2] : NULL, &p);
    return done(c, lower(y, spatial));
}

/* An average over the window's elements within x, x padded by pads that
 * kiln's pools cannot take (unequal, or wider than half the window): the
 * padded sums over the padded counts, both as averages over whole windows. */
static kiln_tensor *average_of_padded(kiln_tensor *x, const int64_t *kernel, const int64_t *stride,
                                      const int64_t *pads, int64_t ceil_mode)
{
    int64_t p[4] = {pads[0], pads[1], pads[2], pads[3]}, q[4] = {pads[0], pads[1], pads[2], pads[3]};
    kiln_pool2d_params whole = {{kernel[0], kernel[1]}, {stride[0], stride[1]}, {0, 0}, ceil_mode != 0, true};
    kiln_tensor *sums = kiln_avg_pool2d(pad_explicitly(x, p, 0, true), &whole);
    kiln_tensor *counts = kiln_avg_pool2d(pad_explicitly(kiln_ones_like(x), q, 0, true), &whole);
    return kiln_div(sums, counts);
}

/* x [N, C, H, W] with stride - 1 zeros between neighbours along H and W:
 * [N, C, (H - 1) sh + 1, (W - 1) sw + 1]. */
static kiln_tensor *spread(kiln_tensor *x, const int64_t *stride)
{
    if (stride[0] == 1 && stride[1] == 1)
        return x;
    const int64_t *s = kiln_shape(x);
    int64_t n = s[0], ch = s[1], h = s[2], w = s[3];
    int64_t apart[6] = {n, ch, h, 1, w, 1}, after[6] = {0, stride[1] - 1, 0, 0, 0, stride[0] - 1};
    int64_t joined[4] = {n, ch, h * stride[0], w * stride[1]};
    kiln_tensor *y = kiln_pad(kiln_reshape(x, 6, apart), 6, after, KILN_PAD_CONSTANT, 0);
    y = kiln_reshape(y, 4, joined);
    return kiln_slice(kiln_slice(y, 2, 0, (h - 1) * stride[0] + 1, 1), 3, 0, (w - 1) * stride[1] + 1, 1);
}

/* ConvTranspose's weight [C_in, C_out / g, kh, kw] as the convolution's that
 * computes it: [C_out, C_in / g, kh, kw], each group's transposed, the window
 * flipped. */
static kiln_tensor *transposed_weight(kiln_tensor *w, int64_t groups)
{
    const int64_t *s = kiln_shape(w);
    int64_t split[5] = {groups, s[0] / groups, s[1], s[2], s[3]};
    int64_t joined[4] = {groups * s[1], s[0] / groups, s[2], s[3]};
    kiln_tensor *t = kiln_transpose(kiln_reshape(w, 5, split), 1, 2);
    return kiln_flip(kiln_flip(kiln_reshape(kiln_contiguous(t), 4, joined), 2), 3);
}

/* ConvTranspose's pads where output_shape or auto_pad SAME_* gives them:
 * the total split, its odd one at the end for SAME_UPPER, else at the start. */
static int transpose_pads(onnx_call *c, const int64_t *kernel, const int64_t *stride, const int64_t *dilation,
                          const int64_t *out_pad, int spatial, int64_t *pads)
{
    int64_t shape[MAX_INTS];
    char buf[16];
    const char *auto_pad = attr_string(c, "auto_pad", "NOTSET", buf, sizeof buf);
    int n = attr_ints(c, "output_shape", shape);
    bool same = !strncmp(auto_pad, "SAME_", 5);
    if (n < -1)
        return n;
    if (n < 0 && !same)
        return 0;
    if (n >= 0 && n != spatial)
        return onnx_fail(c, CORE_VALUE, "output_shape has %d values, not %d", n, spatial);
    const int64_t *in = kiln_shape(c->in[0]);
    for (int d = 0; d < spatial; d++) {
        int64_t want = n >= 0 ? shape[d] : in[2 + d] * stride[d];
        int64_t total = stride[d] * (in[2 + d] - 1) + out_pad[d] + (kernel[d] - 1) * dilation[d] + 1 - want;
        /* halves rounded down, as ONNX's reference does (a negative total
         * widens the output at its end) */
        int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);
        pads[d] = !strcmp(auto_pad, "SAME_UPPER") ? half : total - half;
        pads[spatial + d] = total - pads[d];
    }
    return 0;
}

static int run_conv_transpose(onnx_call *c)
{
    int64_t kernel[2], stride[2], pads[4], dilation[2], group, out_pad[2] = {0, 0}, v[MAX_INTS];
    int spatial;
    if (attr_int(c, "group", 1, &group) < 0 || window_params(c, c->in[1], kernel, stride, pads, dilation, &spatial) < 0)
        return core_error_status();
    int n = attr_ints(c, "output_padding", v);
    if (n < -1)
        return n;
    if (n >= 0 && n != spatial)
        return onnx_fail(c, CORE_VALUE, "output_padding has %d values, not %d", n, spatial);
    for (int d = 0; d < n; d++)
        out_pad[spatial == 1 ? 1 : d] = v[d];
    if (spatial == 1) { /* window_params made them 2-d; output_shape and SAME pads are found in 1-d */
        int64_t k1[1] = {kernel[1]}, s1[1] = {stride[1]}, d1[1] = {dilation[1]}, o1[1] = {out_pad[1]},
                p1[2] = {pads[1], pads[3]};
        if (transpose_pads(c, k1, s1, d1, o1, 1, p1) < 0)
            return core_error_status();
        pads[1] = p1[0], pads[3] = p1[1];
    } else if (transpose_pads(c, kernel, stride, dilation, out_pad, 2, pads) < 0)
        return core_error_status();
    kiln_tensor *x = spread(lift(c->in[0], spatial), stride), *w = lift(c->in[1], spatial);
    if (kiln_ndim(w) != 4 || kiln_shape(w)[0] % group)
        return onnx_fail(c, CORE_VALUE, "the weight's first size is not a multiple of group %lld", (long long)group);
    /* the convolution's input: the spread one padded so that every tap that
     * reaches an output is there, less ONNX's pads, plus output_padding */
    int64_t reach[2] = {(kernel[0] - 1) * dilation[0], (kernel[1] - 1) * dilation[1]};
    int64_t around[4] = {reach[1] - pads[1], reach[1] - pads[3] + out_pad[1], reach[0] - pads[0],
                         reach[0] - pads[2] + out_pad[0]};
    x = kiln_pad(x, 4, around, KILN_PAD_CONSTANT, 0);
    kiln_conv2d_params p = {{1, 1}, {0, 0}, {dilation[0], dilation[1]}, group};
    kiln_tensor *y = kiln_conv2d(x, transposed_weight(w, group), c->node->n_in > 2 ? c->in[2] : NULL, &p);
    return done(c, lower(y, spatial));
}

/* The spatial size of a pool's result along an axis of padded size n, the
 * window spanning span; in ceil mode a last window must start within the
 * input or its first pad (begin). */
static int64_t pooled_size(int64_t n, int64_t span, int64_t stride, int64_t begin, int64_t ceil_mode)
{
    int64_t out = (n - span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
    if (ceil_mode && (out - 1) * stride >= n - begin)
        out--;
    return out;
}

/* A max pool whose window is dilated: the maximum, over the window's
 * offsets, of x (padded with -inf) read with the pool's strides from each. */
static kiln_tensor *dilated_max(const onnx_call *c, kiln_tensor *x, const int64_t *kernel, const int64_t *stride,
                                const int64_t *pads, const int64_t *dilation, int64_t ceil_mode)
{
    int64_t p[4] = {pads[0], pads[1], pads[2], pads[3]}, out[2], extra[4] = {0};
    x = pad_explicitly(x, p, -INFINITY, true);
    for (int d = 0; x && d < 2; d++) {
        int64_t n = kiln_shape(x)[2 + d], span = (kernel[d] - 1) * dilation[d] + 1;
        out[d] = pooled_size(n, span, stride[d], pads[d], ceil_mode);
        if (out[d] < 1) {
            onnx_fail(c, CORE_VALUE, "the window (%lld with dilation %lld) is wider than the padded input (%lld)",
                      (long long)kernel[d], (long long)dilation[d], (long long)n);
            return NULL;
        }
        int64_t need = (out[d] - 1) * stride[d] + span - n;
        extra[2 + d] = need > 0 ? need : 0; /* ceil mode: the last windows run past the end */
    }
    x = x ? pad_explicitly(x, extra, -INFINITY, true) : NULL;
    kiln_tensor *y = NULL;
    for (int64_t i = 0; x && i < kernel[0]; i++)
        for (int64_t j = 0; j < kernel[1]; j++) {
            int64_t top = i * dilation[0], left = j * dilation[1];
            kiln_tensor *rows = kiln_slice(x, 2, top, top + (out[0] - 1) * stride[0] + 1, stride[0]);
            kiln_tensor *window = kiln_slice(rows, 3, left, left + (out[1] - 1) * stride[1] + 1, stride[1]);
            y = y ? kiln_maximum(y, window) : window;
        }
    return y;
}

static int pool(onnx_call *c, bool max)
{
    int64_t kernel[2], stride[2], pads[4], dilation[2], ceil_mode, include_pad, storage;
    int spatial;
    if (window_params(c, NULL, kernel, stride, pads, dilation, &spatial) < 0 ||
        attr_int(c, "ceil_mode", 0, &ceil_mode) < 0 ||
        attr_int(c, "count_include_pad", 0, &include_pad) < 0 || attr_int(c, "storage_order", 0, &storage) < 0)
        return core_error_status();
    if (c->node->n_out > 1 || storage)
        return onnx_fail(c, CORE_UNSUPPORTED, "storage_order and the Indices result are not supported");
    if (dilation[0] != 1 || dilation[1] != 1) {
        if (!max)
            return onnx_fail(c, CORE_VALUE, "AveragePool takes no dilations");
        kiln_tensor *y = dilated_max(c, lift(c->in[0], spatial), kernel, stride, pads, dilation, ceil_mode);
        return done(c, lower(y, spatial));
    }
    /* kiln pads a window by at most half of it, and equally on both sides */
    bool wide = pads[0] > kernel[0] / 2 || pads[2] > kernel[0] / 2 || pads[1] > kernel[1] / 2 || pads[3] > kernel[1] / 2;
    bool unequal = pads[0] != pads[2] || pads[1] != pads[3];
    if (!max && !include_pad && (wide || unequal))
        return done(c, lower(average_of_padded(lift(c->in[0], spatial), kernel, stride, pads, ceil_mode), spatial));
    kiln_tensor *x = pad_explicitly(lift(c->in[0], spatial), pads, max ? -INFINITY : 0, wide);
    kiln_pool2d_params p = {{kernel[0], kernel[1]}, {stride[0], stride[1]}, {pads[0], pads[1]}, ceil_mode != 0,
                            include_pad != 0};
    return done(c, lower(max ? kiln_max_pool2d(x, &p) : kiln_avg_pool2d(x, &p), spatial));
}
static int run_max_pool(onnx_call *c) { return pool(c, true); }
static int run_average_pool(onnx_call *c) { return pool(c, false); }

typedef enum { PAD_CONSTANT, PAD_EDGE, PAD_REFLECT } pad_mode;

/* The block of n values Pad puts before (after false) or after y along d. */
static kiln_tensor *pad_block(kiln_tensor *y, int d, int64_t n, bool after, pad_mode mode, double value)
{
    int nd = kiln_ndim(y);
    int64_t size = kiln_shape(y)[d], shape[KILN_MAX_DIMS];
    memcpy(shape, kiln_shape(y), (size_t)nd * sizeof *shape);
    shape[d] = n;
    if (mode == PAD_CONSTANT)
        return kiln_full(kiln_dtype_of(y), nd, shape, value);
    if (mode == PAD_EDGE)
        return kiln_expand(kiln_slice(y, d, after ? size - 1 : 0, after ? size : 1, 1), nd, shape);
    /* reflect: the values next to the edge, mirrored, the edge left out */
    int64_t stop = after ? size - 2 - n : 0;
    return kiln_slice(y, d, after ? size - 2 : n, stop < 0 && after ? INT64_MIN : stop, -1);
}

/* Pad: blocks of a constant, of the edge values or of their mirror image
 * joined on each side; negative pads cut. */
static int run_pad(onnx_call *c)
{
    int64_t pads[MAX_INTS];
    double value = 0;
    kiln_tensor *x = c->in[0];
    char buf[32];
    const char *name = attr_string(c, "mode", "constant", buf, sizeof buf);
    pad_mode mode = !strcmp(name, "edge") ? PAD_EDGE : !strcmp(name, "reflect") ? PAD_REFLECT : PAD_CONSTANT;
    if (mode == PAD_CONSTANT && strcmp(name, "constant"))
        return onnx_fail(c, CORE_UNSUPPORTED, "mode '%s' is not supported", name);
    bool attrs = c->m->opset < 11;
    int n = attrs ? attr_ints(c, "pads", pads) : const_ints(c, 1, pads);
    if (n < 0)
        return n < -1 || !attrs ? core_error_status() : onnx_fail(c, CORE_FORMAT, "has no pads");
    if (attrs ? attr_float(c, "value", 0, &value) < 0 : c->node->n_in > 2 && c->in[2] && const_scalar(c, 2, &value) < 0)
        return core_error_status();
    if (!attrs && c->node->n_in > 3 && c->in[3])
        return onnx_fail(c, CORE_UNSUPPORTED, "padding only some axes (operand 'axes') is not supported");
    int nd = kiln_ndim(x);
    if (n != 2 * nd)
        return onnx_fail(c, CORE_VALUE, "pads has %d entries for %d dimensions", n, nd);
    for (int i = 0; i < n; i++)
        if (pads[i] < -IR_MAX_NUMEL || pads[i] > IR_MAX_NUMEL)
            return onnx_fail(c, CORE_VALUE, "pad %lld is past 2^59 elements", (long long)pads[i]);
    kiln_tensor *y = same(x);
    for (int d = 0; d < nd && y; d++) {
        int64_t before = pads[d], after = pads[d + nd], size = kiln_shape(y)[d];
        y = kiln_slice(y, d, before < 0 ? -before : 0, after < 0 ? size + after : size, 1);
        size = y ? kiln_shape(y)[d] : 0;
        if (y && mode != PAD_CONSTANT && (before > 0 || after > 0) &&
            (size == 0 || (mode == PAD_REFLECT && (before >= size || after >= size))))
            return onnx_fail(c, CORE_VALUE, "pads of %lld and %lld do not fit %s mode on a size of %lld",
                             (long long)before, (long long)after, name, (long long)size);
        kiln_tensor *parts[3];
        int k = 0;
        if (y && before > 0)
            parts[k++] = pad_block(y, d, before, false, mode, value);
        parts[k++] = y;
        if (y && after > 0)
            parts[k++] = pad_block(y, d, after, true, mode, value);
        if (k > 1)
            y = kiln_concat(parts, k, d);
    }
    return done(c, y);
}

/* DepthToSpace and SpaceToDepth: a reshape to 6 dimensions, a permutation
 * and a reshape back. */
static int block_move(onnx_call *c, bool to_space)
{
    int64_t b;
    char buf[8];
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "blocksize", 0, &b) < 0)
        return -CORE_FORMAT;
    if (kiln_ndim(x) != 4 || b < 1)
        return onnx_fail(c, CORE_SHAPE, "needs a 4-d input and a positive blocksize");
    const int64_t *s = kiln_shape(x);
    int64_t n = s[0], ch = s[1], h = s[2], w = s[3];
    /* b b, h b, w b and ch b b must not wrap (an empty image divides by any b) */
    if (b > (INT64_C(1) << 29) || h > IR_MAX_NUMEL / b || w > IR_MAX_NUMEL / b || ch > IR_MAX_NUMEL / (b * b))
        return onnx_fail(c, CORE_SHAPE, "blocksize %lld is too large for [%lld,%lld,%lld,%lld]", (long long)b,
                         (long long)n, (long long)ch, (long long)h, (long long)w);
    bool crd = to_space && !strcmp(attr_string(c, "mode", "DCR", buf, sizeof buf), "CRD");
    if ((to_space ? ch % (b * b) : h % b || w % b) != 0)
        return onnx_fail(c, CORE_SHAPE, "sizes [%lld,%lld,%lld,%lld] do not divide by blocksize %lld", (long long)n,
                         (long long)ch, (long long)h, (long long)w, (long long)b);
    int64_t split[6], out[4];
    int perm[6];
    if (to_space) {
        int64_t c2 = ch / (b * b);
        memcpy(split, crd ? (int64_t[]){n, c2, b, b, h, w} : (int64_t[]){n, b, b, c2, h, w}, sizeof split);
        memcpy(perm, crd ? (int[]){0, 1, 4, 2, 5, 3} : (int[]){0, 3, 4, 1, 5, 2}, sizeof perm);
        memcpy(out, (int64_t[]){n, c2, h * b, w * b}, sizeof out);
    } else {
        memcpy(split, (int64_t[]){n, ch, h / b, b, w / b, b}, sizeof split);
        memcpy(perm, (int[]){0, 3, 5, 1, 2, 4}, sizeof perm);
        memcpy(out, (int64_t[]){n, ch * b * b, h / b, w / b}, sizeof out);
    }
    return done(c, kiln_reshape(kiln_permute(kiln_reshape(x, 6, split), perm), 4, out));
}
static int run_depth_to_space(onnx_call *c) { return block_move(c, true); }
static int run_space_to_depth(onnx_call *c) { return block_move(c, false); }

static int run_dropout(onnx_call *c)
{
    double training = 0;
    if (c->node->n_in > 2 && c->in[2] && const_scalar(c, 2, &training) < 0)
        return core_error_status();
    if (training != 0)
        return onnx_fail(c, CORE_UNSUPPORTED, "training mode is not supported (inference only)");
    kiln_tensor *x = c->in[0];
    c->out[0] = same(x);
    if (c->node->n_out > 1 && c->node->out[1] >= 0)
        c->out[1] = kiln_full(KILN_BOOL, kiln_ndim(x), kiln_shape(x), 1);
    return 0;
}

/* OneHot: a comparison with the class numbers along the new axis. */
static int run_one_hot(onnx_call *c)
{
    int64_t axis;
    double depth;
    int a;
    kiln_tensor *idx = c->in[0], *values = c->in[2];
    if (attr_int(c, "axis", -1, &axis) < 0 || const_scalar(c, 1, &depth) < 0)
        return core_error_status();
    int nd = kiln_ndim(idx) + 1;
    if (norm_axis(c, axis, nd, &a) < 0)
        return -CORE_AXIS;
    if (nd > KILN_MAX_DIMS || kiln_numel(values) != 2 || !(depth >= 1 && depth <= (double)(INT64_C(1) << 40)))
        return onnx_fail(c, CORE_VALUE, "needs at most %d dimensions, values [off, on] and a positive depth",
                         KILN_MAX_DIMS - 1);
    int64_t shape[KILN_MAX_DIMS], n = (int64_t)depth;
    for (int d = 0; d < nd; d++)
        shape[d] = d == a ? n : 1;
    /* negative indices count from the end */
    idx = kiln_cast(idx, KILN_I64);
    idx = kiln_where(kiln_lt(idx, scalar_of(KILN_I64, 0)), kiln_add_scalar(idx, (double)n), idx);
    kiln_tensor *hot = kiln_eq(kiln_unsqueeze(idx, a), kiln_reshape(kiln_arange(0, (double)n, 1, KILN_I64), nd, shape));
    kiln_tensor *off = kiln_squeeze(kiln_slice(kiln_reshape(values, 1, (int64_t[]){2}), 0, 0, 1, 1), 0);
    kiln_tensor *on = kiln_squeeze(kiln_slice(kiln_reshape(values, 1, (int64_t[]){2}), 0, 1, 2, 1), 0);
    return done(c, kiln_where(hot, on, off));
}

static int run_eye_like(onnx_call *c)
{
    int64_t k, to;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "k", 0, &k) < 0 || attr_int(c, "dtype", onnx_type_of(kiln_dtype_of(x)), &to) < 0)
        return -CORE_FORMAT;
    kiln_dtype dt;
    if (!onnx_kiln_dtype((int32_t)to, &dt))
        return onnx_fail(c, CORE_UNSUPPORTED, "dtype %s is not supported", onnx_type_name((int32_t)to));
    if (kiln_ndim(x) != 2)
        return onnx_fail(c, CORE_SHAPE, "input has %d dimensions, not 2", kiln_ndim(x));
    const int64_t *s = kiln_shape(x);
    int64_t col_shape[2] = {1, s[1]}, row_shape[2] = {s[0], 1};
    kiln_tensor *rows = kiln_reshape(kiln_arange(0, (double)s[0], 1, KILN_I64), 2, row_shape);
    kiln_tensor *cols = kiln_reshape(kiln_arange(-(double)k, (double)(s[1] - k), 1, KILN_I64), 2, col_shape);
    return done(c, kiln_cast(kiln_eq(rows, cols), dt));
}

static int run_trilu(onnx_call *c)
{
    int64_t upper, k = 0;
    kiln_tensor *x = c->in[0];
    if (attr_int(c, "upper", 1, &upper) < 0)
        return -CORE_FORMAT;
    if (c->node->n_in > 1 && c->in[1]) {
        double kd;
        if (const_scalar(c, 1, &kd) < 0)
            return core_error_status();
        k = (int64_t)kd;
    }
    int nd = kiln_ndim(x);
    if (nd < 2)
        return onnx_fail(c, CORE_SHAPE, "input has %d dimensions; Trilu needs at least 2", nd);
    const int64_t *s = kiln_shape(x);
    int64_t col_shape[2] = {1, s[nd - 1]}, row_shape[2] = {s[nd - 2], 1};
    kiln_tensor *rows = kiln_reshape(kiln_arange(0, (double)s[nd - 2], 1, KILN_I64), 2, row_shape);
    kiln_tensor *cols = kiln_reshape(kiln_arange(0, (double)s[nd - 1], 1, KILN_I64), 2, col_shape);
    kiln_tensor *diff = kiln_sub(kiln_sub(cols, rows), scalar_of(KILN_I64, (double)k));
    kiln_tensor *keep = upper ? kiln_ge(diff, scalar_of(KILN_I64, 0)) : kiln_le(diff, scalar_of(KILN_I64, 0));
    return done(c, kiln_where(keep, x, scalar_of(kiln_dtype_of(x), 0)));
}

/* -- The table ----------------------------------------------------------------- */

#define VAR ONNX_MAX_OPERANDS /* variadic */

static const onnx_op onnx_ops[] = {
    {"Abs", run_abs, 1, 1, 1, 1, "", false},
    {"Acos", run_acos, 1, 1, 1, 1, "", false},
    {"Acosh", run_acosh, 1, 1, 1, 1, "", false},
    {"Add", run_add, 2, 2, 1, 1, "broadcast axis ", false},
    {"And", run_and, 2, 2, 1, 1, "broadcast axis ", false},
    {"ArgMax", run_argmax, 1, 1, 1, 1, "axis keepdims select_last_index ", false},
    {"ArgMin", run_argmin, 1, 1, 1, 1, "axis keepdims select_last_index ", false},
    {"Asin", run_asin, 1, 1, 1, 1, "", false},
    {"Asinh", run_asinh, 1, 1, 1, 1, "", false},
    {"Atan", run_atan, 1, 1, 1, 1, "", false},
    {"Atanh", run_atanh, 1, 1, 1, 1, "", false},
    {"AveragePool", run_average_pool, 1, 1, 1, 1, "auto_pad ceil_mode count_include_pad kernel_shape pads strides ", false},
    {"BatchNormalization", run_batch_norm, 5, 5, 1, 3, "epsilon momentum training_mode spatial is_test ", false},
    {"Cast", run_cast, 1, 1, 1, 1, "to saturate ", false},
    {"CastLike", run_cast_like, 2, 2, 1, 1, "", false},
    {"Ceil", run_ceil, 1, 1, 1, 1, "", false},
    {"Celu", run_celu, 1, 1, 1, 1, "alpha ", false},
    {"Clip", run_clip, 1, 3, 1, 1, "min max ", false},
    {"Concat", run_concat, 1, VAR, 1, 1, "axis ", false},
    {"Constant", run_constant, 0, 0, 1, 1, "value value_float value_floats value_int value_ints sparse_value "
                                          "value_string value_strings ", false},
    {"ConstantOfShape", run_constant_of_shape, 1, 1, 1, 1, "value ", false},
    {"Conv", run_conv, 2, 3, 1, 1, "auto_pad dilations group kernel_shape pads strides ", false},
    {"ConvTranspose", run_conv_transpose, 2, 3, 1, 1,
     "auto_pad dilations group kernel_shape output_padding output_shape pads strides ", false},
    {"Cos", run_cos, 1, 1, 1, 1, "", false},
    {"Cosh", run_cosh, 1, 1, 1, 1, "", false},
    {"CumSum", run_cumsum, 2, 2, 1, 1, "exclusive reverse ", false},
    {"DepthToSpace", run_depth_to_space, 1, 1, 1, 1, "blocksize mode ", false},
    {"Div", run_div, 2, 2, 1, 1, "broadcast axis ", false},
    {"Dropout", run_dropout, 1, 3, 1, 2, "ratio seed is_test ", false},
    {"Elu", run_elu, 1, 1, 1, 1, "alpha ", false},
    {"Equal", run_equal, 2, 2, 1, 1, "broadcast axis ", false},
    {"Erf", run_erf, 1, 1, 1, 1, "", false},
    {"Exp", run_exp, 1, 1, 1, 1, "", false},
    {"Expand", run_expand, 2, 2, 1, 1, "", false},
    {"EyeLike", run_eye_like, 1, 1, 1, 1, "dtype k ", true},
    {"Flatten", run_flatten, 1, 1, 1, 1, "axis ", false},
    {"Floor", run_floor, 1, 1, 1, 1, "", false},
    {"Gather", run_gather, 2, 2, 1, 1, "axis ", false},
    {"GatherElements", run_gather_elements, 2, 2, 1, 1, "axis ", false},
    {"Gemm", run_gemm, 2, 3, 1, 1, "alpha beta transA transB broadcast ", false},
    {"GlobalAveragePool", run_global_average_pool, 1, 1, 1, 1, "", false},
    {"GlobalMaxPool", run_global_max_pool, 1, 1, 1, 1, "", false},
    {"Greater", run_greater, 2, 2, 1, 1, "broadcast axis ", false},
    {"GreaterOrEqual", run_greater_equal, 2, 2, 1, 1, "", false},
    {"HardSigmoid", run_hard_sigmoid, 1, 1, 1, 1, "alpha beta ", false},
    {"HardSwish", run_hard_swish, 1, 1, 1, 1, "", false},
    {"Hardmax", run_hardmax, 1, 1, 1, 1, "axis ", false},
    {"Identity", run_identity, 1, 1, 1, 1, "", false},
    {"InstanceNormalization", run_instance_norm, 3, 3, 1, 1, "epsilon ", false},
    {"IsInf", run_is_inf, 1, 1, 1, 1, "detect_negative detect_positive ", false},
    {"IsNaN", run_isnan, 1, 1, 1, 1, "", false},
    {"LayerNormalization", run_layer_norm, 2, 3, 1, 3, "axis epsilon stash_type ", false},
    {"LeakyRelu", run_leaky_relu, 1, 1, 1, 1, "alpha ", false},
    {"Less", run_less, 2, 2, 1, 1, "broadcast axis ", false},
    {"LessOrEqual", run_less_equal, 2, 2, 1, 1, "", false},
    {"Log", run_log, 1, 1, 1, 1, "", false},
    {"LogSoftmax", run_log_softmax, 1, 1, 1, 1, "axis ", false},
    {"LpNormalization", run_lp_norm, 1, 1, 1, 1, "axis p ", false},
    {"MatMul", run_matmul, 2, 2, 1, 1, "", false},
    {"Max", run_max, 1, VAR, 1, 1, "", false},
    {"MaxPool", run_max_pool, 1, 1, 1, 2, "auto_pad ceil_mode dilations kernel_shape pads storage_order strides ", false},
    {"Mean", run_mean, 1, VAR, 1, 1, "", false},
    {"Min", run_min, 1, VAR, 1, 1, "", false},
    {"Mish", run_mish, 1, 1, 1, 1, "", false},
    {"Mod", run_mod, 2, 2, 1, 1, "fmod ", false},
    {"Mul", run_mul, 2, 2, 1, 1, "broadcast axis ", false},
    {"Neg", run_neg, 1, 1, 1, 1, "", false},
    {"NegativeLogLikelihoodLoss", run_nll_loss, 2, 3, 1, 1, "ignore_index reduction ", false},
    {"Not", run_not, 1, 1, 1, 1, "", false},
    {"OneHot", run_one_hot, 3, 3, 1, 1, "axis ", false},
    {"Or", run_or, 2, 2, 1, 1, "broadcast axis ", false},
    {"PRelu", run_prelu, 2, 2, 1, 1, "", false},
    {"Pad", run_pad, 1, 4, 1, 1, "mode pads value ", false},
    {"Pow", run_pow, 2, 2, 1, 1, "broadcast axis ", false},
    {"Range", run_range, 3, 3, 1, 1, "", false},
    {"Reciprocal", run_reciprocal, 1, 1, 1, 1, "", false},
    {"ReduceL1", run_reduce_l1, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceL2", run_reduce_l2, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceLogSum", run_reduce_log_sum, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceLogSumExp", run_reduce_log_sum_exp, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceMax", run_reduce_max, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceMean", run_reduce_mean, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceMin", run_reduce_min, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceProd", run_reduce_prod, 1, 1, 1, 1, "axes keepdims ", false},
    {"ReduceSum", run_reduce_sum, 1, 2, 1, 1, "axes keepdims noop_with_empty_axes ", false},
    {"ReduceSumSquare", run_reduce_sum_square, 1, 1, 1, 1, "axes keepdims ", false},
    {"Relu", run_relu, 1, 1, 1, 1, "", false},
    {"Reshape", run_reshape, 1, 2, 1, 1, "allowzero shape ", false},
    {"Resize", run_resize, 1, 4, 1, 1,
     "coordinate_transformation_mode cubic_coeff_a exclude_outside extrapolation_value mode nearest_mode ", false},
    {"Round", run_round, 1, 1, 1, 1, "", false},
    {"ScatterElements", run_scatter_elements, 3, 3, 1, 1, "axis reduction ", false},
    {"Selu", run_selu, 1, 1, 1, 1, "alpha gamma ", false},
    {"Shape", run_shape, 1, 1, 1, 1, "start end ", true},
    {"Shrink", run_shrink, 1, 1, 1, 1, "bias lambd ", false},
    {"Sigmoid", run_sigmoid, 1, 1, 1, 1, "", false},
    {"Sign", run_sign, 1, 1, 1, 1, "", false},
    {"Sin", run_sin, 1, 1, 1, 1, "", false},
    {"Sinh", run_sinh, 1, 1, 1, 1, "", false},
    {"Size", run_size, 1, 1, 1, 1, "", true},
    {"Slice", run_slice, 1, 5, 1, 1, "starts ends axes ", false},
    {"Softmax", run_softmax, 1, 1, 1, 1, "axis ", false},
    {"SoftmaxCrossEntropyLoss", run_softmax_cross_entropy, 2, 3, 1, 2, "ignore_index reduction ", false},
    {"Softplus", run_softplus, 1, 1, 1, 1, "", false},
    {"Softsign", run_softsign, 1, 1, 1, 1, "", false},
    {"SpaceToDepth", run_space_to_depth, 1, 1, 1, 1, "blocksize ", false},
    {"Split", run_split, 1, 2, 1, VAR, "axis split ", false},
    {"Sqrt", run_sqrt, 1, 1, 1, 1, "", false},
    {"Squeeze", run_squeeze, 1, 2, 1, 1, "axes ", false},
    {"Sub", run_sub, 2, 2, 1, 1, "broadcast axis ", false},
    {"Sum", run_sum, 1, VAR, 1, 1, "", false},
    {"Tan", run_tan, 1, 1, 1, 1, "", false},
    {"Tanh", run_tanh, 1, 1, 1, 1, "", false},
    {"ThresholdedRelu", run_thresholded_relu, 1, 1, 1, 1, "alpha ", false},
    {"Tile", run_tile, 2, 2, 1, 1, "", false},
    {"TopK", run_topk, 2, 2, 2, 2, "axis largest sorted ", false},
    {"Transpose", run_transpose, 1, 1, 1, 1, "perm ", false},
    {"Trilu", run_trilu, 1, 2, 1, 1, "upper ", false},
    {"Unsqueeze", run_unsqueeze, 1, 2, 1, 1, "axes ", false},
    {"Upsample", run_upsample, 1, 2, 1, 1, "mode scales ", false},
    {"Where", run_where, 3, 3, 1, 1, "", false},
    {"Xor", run_xor, 2, 2, 1, 1, "broadcast axis ", false},
};

const onnx_op *onnx_find_op(const char *op_type)
{
    for (size_t i = 0; i < sizeof onnx_ops / sizeof *onnx_ops; i++)
        if (!strcmp(onnx_ops[i].name, op_type))
            return &onnx_ops[i];
    return NULL;
}
