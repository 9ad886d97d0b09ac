/* CUDA C for kiln's values: types, constants, conversions, the ops of the
 * op table and the reductions' folds, shared by the fused kernels (cuda.c)
 * and the eager ones. */
#include <math.h>
#include <stdio.h>

#include "codegen_nvrtc/internal.h"

const char *nvrtc_ctype(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return "float";
    case KILN_F64: return "double";
    case KILN_I32: return "int";
    case KILN_I64: return "long long";
    default: return "unsigned char"; /* bool: 0 or 1 */
    }
}

/* Functions every kernel may call: conversions as kiln_cast converts, and
 * the reductions' folds. */
const char NVRTC_PRELUDE[] =
    "struct kiln_symbols { long long s[8]; };\n"
    "template <typename I, typename F> __device__ I kiln_f2i(F v, I lo, I hi) {\n"
    "    if (v != v) return 0;\n"
    "    if (v <= (F)lo) return lo;\n"
    "    if (v >= (F)hi) return hi;\n"
    "    return (I)v;\n"
    "}\n"
    /* As eager: NaN wins, else the first of two equal operands (-0 and +0). */
    "template <typename T> __device__ T kiln_max(T a, T b) { return (a < b || b != b) ? b : a; }\n"
    "template <typename T> __device__ T kiln_min(T a, T b) { return (b < a || b != b) ? b : a; }\n"
    /* As llvm.maximum and llvm.minimum: NaN wins, and -0 < +0. */
    "template <typename T> __device__ T kiln_fold_max(T acc, T v) {\n"
    "    return (v > acc || v != v || (v == acc && signbit(acc) && !signbit(v))) ? v : acc;\n"
    "}\n"
    "template <typename T> __device__ T kiln_fold_min(T acc, T v) {\n"
    "    return (v < acc || v != v || (v == acc && signbit(v) && !signbit(acc))) ? v : acc;\n"
    "}\n"
    /* sigmoid from t = exp(-|x|), which stays accurate where it is tiny. */
    "template <typename T> __device__ T kiln_sigmoid(T x, T t) { return x < 0 ? t / (1 + t) : 1 / (1 + t); }\n"
    /* Integer powers as eager's: wrapping; a negative exponent truncates toward 0. */
    "template <typename T, typename U> __device__ T kiln_ipow(T base, T e) {\n"
    "    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;\n"
    "    U r = 1, b = (U)base;\n"
    "    for (; e; e >>= 1, b *= b)\n"
    "        if (e & 1) r *= b;\n"
    "    return (T)r;\n"
    "}\n"
    /* Floor division and remainder as eager's (src/eager/kernels.c). */
    "template <typename T> __device__ T kiln_remainder(T a, T b) {\n"
    "    T m = fmod(a, b);\n"
    "    return m != 0 && (b < 0) != (m < 0) ? m + b : m;\n"
    "}\n"
    "template <typename T> __device__ T kiln_floor_divide(T a, T b) {\n"
    "    if (b == 0) return a / b;\n"
    "    T m = fmod(a, b), q = (a - m) / b;\n"
    "    if (m != 0 && (b < 0) != (m < 0)) q -= 1;\n"
    "    if (q == 0) return copysign((T)0, a / b);\n"
    "    T f = floor(q);\n"
    "    return q - f > (T)0.5 ? f + 1 : f;\n"
    "}\n"
    "template <typename T, typename U> __device__ T kiln_ifloor_divide(T a, T b) {\n"
    "    if (b == 0) return 0;\n"
    "    if (b == -1) return (T)(0 - (U)a);\n"
    "    T q = a / b, r = a % b;\n"
    "    return r != 0 && (r < 0) != (b < 0) ? q - 1 : q;\n"
    "}\n"
    "template <typename T> __device__ T kiln_iremainder(T a, T b) {\n"
    "    if (b == 0 || b == -1) return 0;\n"
    "    T r = a % b;\n"
    "    return r != 0 && (r < 0) != (b < 0) ? r + b : r;\n"
    "}\n"
    "template <typename T> __device__ T kiln_shfl(T v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }\n"
    "__device__ unsigned char kiln_shfl(unsigned char v, int d) {\n"
    "    return (unsigned char)__shfl_down_sync(0xffffffffu, (int)v, d);\n"
    "}\n";


/* -- Constants and conversions --------------------------------------------- */

void nvrtc_constant(strbuf *s, kiln_dtype dt, double v)
{
    if (dt == KILN_F32 || dt == KILN_F64) {
        bool f32 = dt == KILN_F32;
        if (isnan(v))
            strbuf_put(s, f32 ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)");
        else if (isinf(v))
            strbuf_put(s, "%s%s", v < 0 ? "-" : "",
                       f32 ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)");
        else
            strbuf_put(s, "(%s)%a", nvrtc_ctype(dt), v);
        return;
    }
    if (dt == KILN_I64 && v <= -0x1p63)
        strbuf_put(s, "(-9223372036854775807LL - 1)");
    else
        strbuf_put(s, "(%s)%lldLL", nvrtc_ctype(dt), (long long)v);
}

/* Writes the conversion of C expression text from dtype from to dtype to. */
void nvrtc_convert(strbuf *s, const char *text, kiln_dtype from, kiln_dtype to)
{
    bool f_from = ir_dtype_is_float(from);
    if (from == to)
        strbuf_put(s, "%s", text);
    else if (to == KILN_BOOL)
        strbuf_put(s, "(unsigned char)(%s != 0)", text);
    else if (f_from && !ir_dtype_is_float(to))
        strbuf_put(s, "kiln_f2i<%s, %s>(%s, %s, %s)", nvrtc_ctype(to), nvrtc_ctype(from), text,
                   to == KILN_I32 ? "(int)-2147483647 - 1" : "(-9223372036854775807LL - 1)",
                   to == KILN_I32 ? "2147483647" : "9223372036854775807LL");
    else
        strbuf_put(s, "(%s)(%s)", nvrtc_ctype(to), text);
}

/* -- Expressions ----------------------------------------------------------- */

/* C's comparisons are IEEE's: != is true for NaN, the others false. */
static void comparison(strbuf *s, ir_op op, const char *a, const char *b)
{
    const char *c = op == OP_EQ ? "==" : op == OP_NE ? "!=" : op == OP_LT ? "<"
                  : op == OP_LE ? "<=" : op == OP_GT ? ">" : ">=";
    strbuf_put(s, "(unsigned char)(%s %s %s)", a, c, b);
}

static bool float_op(strbuf *s, ir_op op, kiln_dtype dt, const char *a, const char *b)
{
    bool f32 = dt == KILN_F32;
    const char *suffix = f32 ? "f" : "";
    switch (op) {
    case OP_ADD: strbuf_put(s, "%s + %s", a, b); break;
    case OP_SUB: strbuf_put(s, "%s - %s", a, b); break;
    case OP_MUL: strbuf_put(s, "%s * %s", a, b); break;
    case OP_DIV: strbuf_put(s, "%s / %s", a, b); break;
    case OP_POW: strbuf_put(s, "pow%s(%s, %s)", suffix, a, b); break;
    case OP_MAXIMUM: strbuf_put(s, "kiln_max(%s, %s)", a, b); break;
    case OP_MINIMUM: strbuf_put(s, "kiln_min(%s, %s)", a, b); break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: comparison(s, op, a, b); break;
    case OP_NEG: strbuf_put(s, "-%s", a); break;
    case OP_ABS: strbuf_put(s, "fabs%s(%s)", suffix, a); break;
    case OP_SQRT: strbuf_put(s, "sqrt%s(%s)", suffix, a); break;
    case OP_RSQRT: strbuf_put(s, "(%s)1 / sqrt%s(%s)", nvrtc_ctype(dt), suffix, a); break;
    case OP_RELU: strbuf_put(s, "(%s < 0 ? (%s)0 : %s)", a, nvrtc_ctype(dt), a); break; /* -0, NaN stay */
    case OP_EXP: strbuf_put(s, "exp%s(%s)", suffix, a); break;
    case OP_LOG: strbuf_put(s, "log%s(%s)", suffix, a); break;
    case OP_TANH: strbuf_put(s, "tanh%s(%s)", suffix, a); break;
    case OP_SIGMOID: strbuf_put(s, "kiln_sigmoid(%s, exp%s(-fabs%s(%s)))", a, suffix, suffix, a); break;
    case OP_SIN: strbuf_put(s, "sin%s(%s)", suffix, a); break;
    case OP_COS: strbuf_put(s, "cos%s(%s)", suffix, a); break;
    case OP_ERF: strbuf_put(s, "erf%s(%s)", suffix, a); break;
    case OP_FLOOR: strbuf_put(s, "floor%s(%s)", suffix, a); break;
    case OP_CEIL: strbuf_put(s, "ceil%s(%s)", suffix, a); break;
    case OP_ROUND: strbuf_put(s, "rint%s(%s)", suffix, a); break;
    case OP_TRUNC: strbuf_put(s, "trunc%s(%s)", suffix, a); break;
    case OP_LOG1P: strbuf_put(s, "log1p%s(%s)", suffix, a); break;
    case OP_EXPM1: strbuf_put(s, "expm1%s(%s)", suffix, a); break;
    case OP_LOG2: strbuf_put(s, "log2%s(%s)", suffix, a); break;
    case OP_TAN: strbuf_put(s, "tan%s(%s)", suffix, a); break;
    case OP_ATAN: strbuf_put(s, "atan%s(%s)", suffix, a); break;
    case OP_ATAN2: strbuf_put(s, "atan2%s(%s, %s)", suffix, a, b); break;
    case OP_REMAINDER: strbuf_put(s, "kiln_remainder(%s, %s)", a, b); break;
    case OP_FLOOR_DIVIDE: strbuf_put(s, "kiln_floor_divide(%s, %s)", a, b); break;
    default: return false;
    }
    return true;
}

/* Integer arithmetic wraps, as LLVM's does: it is done unsigned, since
 * signed overflow is undefined in C++ and NVVM takes advantage of it. */
static bool int_op(strbuf *s, ir_op op, kiln_dtype dt, const char *a, const char *b)
{
    bool is_bool = dt == KILN_BOOL;
    const char *t = nvrtc_ctype(dt), *u = dt == KILN_I64 ? "unsigned long long" : "unsigned";
    switch (op) {
    case OP_ADD:
        if (is_bool)
            strbuf_put(s, "(%s)(%s | %s)", t, a, b);
        else
            strbuf_put(s, "(%s)((%s)%s + (%s)%s)", t, u, a, u, b);
        break;
    case OP_SUB: strbuf_put(s, "(%s)((%s)%s - (%s)%s)", t, u, a, u, b); break;
    case OP_POW:
        if (is_bool)
            return false;
        strbuf_put(s, "kiln_ipow<%s, %s>(%s, %s)", t, u, a, b);
        break;
    case OP_MUL:
        if (is_bool)
            strbuf_put(s, "(%s)(%s & %s)", t, a, b);
        else
            strbuf_put(s, "(%s)((%s)%s * (%s)%s)", t, u, a, u, b);
        break;
    case OP_MAXIMUM: strbuf_put(s, "(%s)(%s > %s ? %s : %s)", t, a, b, a, b); break;
    case OP_MINIMUM: strbuf_put(s, "(%s)(%s < %s ? %s : %s)", t, a, b, a, b); break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: comparison(s, op, a, b); break;
    case OP_NEG: strbuf_put(s, "(%s)(0 - (%s)%s)", t, u, a); break;
    case OP_ABS: strbuf_put(s, "(%s)(%s < 0 ? 0 - (%s)%s : (%s)%s)", t, a, u, a, u, a); break;
    case OP_RELU: strbuf_put(s, "(%s)(%s > 0 ? %s : 0)", t, a, a); break;
    case OP_FLOOR: case OP_CEIL: case OP_ROUND: case OP_TRUNC:
        if (is_bool)
            return false;
        strbuf_put(s, "%s", a);
        break;
    case OP_REMAINDER:
    case OP_FLOOR_DIVIDE:
        if (is_bool)
            return false;
        strbuf_put(s, "%s<%s%s%s>(%s, %s)", op == OP_REMAINDER ? "kiln_iremainder" : "kiln_ifloor_divide", t,
                   op == OP_REMAINDER ? "" : ", ", op == OP_REMAINDER ? "" : u, a, b);
        break;
    default: return false;
    }
    return true;
}

bool nvrtc_op(strbuf *s, ir_op op, kiln_dtype operand, const char *a, const char *b, const char *c)
{
    if (op == OP_WHERE) {
        strbuf_put(s, "%s != 0 ? %s : %s", a, b, c);
        return true;
    }
    return ir_dtype_is_float(operand) ? float_op(s, op, operand, a, b) : int_op(s, op, operand, a, b);
}

static const char *fold_of(ir_op op, bool is_float)
{
    if (op == OP_SUM || op == OP_MEAN || op == OP_PROD)
        return NULL;
    if (op == OP_MAX)
        return is_float ? "kiln_fold_max" : "kiln_max";
    return is_float ? "kiln_fold_min" : "kiln_min";
}

void nvrtc_value(strbuf *s, kiln_dtype dt, kx_value v)
{
    if (ir_dtype_is_float(dt))
        nvrtc_constant(s, dt, v.f);
    else if (v.i == INT64_MIN) /* no literal: 9223372036854775808 does not fit */
        strbuf_put(s, "(%s)(-9223372036854775807LL - 1)", nvrtc_ctype(dt));
    else
        strbuf_put(s, "(%s)%lldLL", nvrtc_ctype(dt), (long long)v.i);
}

void nvrtc_reduction_init(strbuf *s, ir_op op, kiln_dtype dt)
{
    nvrtc_value(s, dt, kx_reduction_identity(op, dt));
}

/* acc = fold(acc, value) in C, for reduction r. Integer sums wrap, as eager's do. */
void nvrtc_fold(strbuf *s, ir_op op, kiln_dtype dt, const char *acc, const char *value)
{
    const char *f = fold_of(op, ir_dtype_is_float(dt));
    ir_op arith = op == OP_PROD ? OP_MUL : OP_ADD;
    if (f) {
        strbuf_put(s, "%s = %s(%s, %s);\n", acc, f, acc, value);
    } else if (ir_dtype_is_float(dt)) {
        strbuf_put(s, "%s = %s %s %s;\n", acc, acc, arith == OP_MUL ? "*" : "+", value);
    } else {
        strbuf_put(s, "%s = ", acc);
        int_op(s, arith, dt, acc, value);
        strbuf_put(s, ";\n");
    }
}

