/* Contiguous loops, one per op and compute dtype, written for the vectorizer.
 *
 * exp, log, erf, sin and cos call SLEEF's 1.0-ulp vector functions and tanh
 * its 3.5-ulp one: measured on f32 with AVX2, SLEEF's tanh takes 1.06 ns per
 * element (2.69 at 1.0 ulp), exp 0.69, erf 4.3, against glibc's scalar
 * tanhf 19.9, erff 19.6, expf 4.1 (kiln-bench-eager prints kiln's rates). Integer arithmetic goes
 * through unsigned types so that overflow wraps instead of being undefined. */
#include <math.h>
#include <string.h>

#include <sleef.h>

#include "eager/isa.h"

#define kernel_for ISA_NAME(kernel_for) /* compiled once per level (isa.h) */

typedef float f32;
typedef double f64;

/* -- SLEEF vectors --------------------------------------------------------- */

#if defined(__AVX512F__)
#define F32_LANES 16
#define F64_LANES 8
typedef __m512 vf32;
typedef __m512d vf64;
#define LOAD_F32 _mm512_loadu_ps
#define STORE_F32 _mm512_storeu_ps
#define LOAD_F64 _mm512_loadu_pd
#define STORE_F64 _mm512_storeu_pd
#define SLEEF_F32(fn, ulp) Sleef_##fn##f16_##ulp
#define SLEEF_F64(fn, ulp) Sleef_##fn##d8_##ulp
#elif defined(__AVX2__)
#define F32_LANES 8
#define F64_LANES 4
typedef __m256 vf32;
typedef __m256d vf64;
#define LOAD_F32 _mm256_loadu_ps
#define STORE_F32 _mm256_storeu_ps
#define LOAD_F64 _mm256_loadu_pd
#define STORE_F64 _mm256_storeu_pd
#define SLEEF_F32(fn, ulp) Sleef_##fn##f8_##ulp
#define SLEEF_F64(fn, ulp) Sleef_##fn##d4_##ulp
#elif defined(__SSE2__)
#define F32_LANES 4
#define F64_LANES 2
typedef __m128 vf32;
typedef __m128d vf64;
#define LOAD_F32 _mm_loadu_ps
#define STORE_F32 _mm_storeu_ps
#define LOAD_F64 _mm_loadu_pd
#define STORE_F64 _mm_storeu_pd
#define SLEEF_F32(fn, ulp) Sleef_##fn##f4_##ulp
#define SLEEF_F64(fn, ulp) Sleef_##fn##d2_##ulp
#else
#define F32_LANES 1
#define F64_LANES 1
typedef float vf32;
typedef double vf64;
#define LOAD_F32(p) (*(p))
#define STORE_F32(p, v) (*(p) = (v))
#define LOAD_F64(p) (*(p))
#define STORE_F64(p, v) (*(p) = (v))
#define SLEEF_F32(fn, ulp) Sleef_##fn##f_##ulp
#define SLEEF_F64(fn, ulp) Sleef_##fn##_##ulp
#endif

typedef vf32 (*vfn32)(vf32);
typedef vf64 (*vfn64)(vf64);

/* o[i] = fn(a[i]); the tail goes through a padded vector so that every element
 * gets the same rounding wherever it sits. o may equal a. */
#define DEFINE_MAP(T, LANES, V, LOAD, STORE)                             \
    static void map_##T(int64_t n, T *o, const T *a, V (*fn)(V))         \
    {                                                                    \
        int64_t i = 0;                                                   \
        for (; i + LANES <= n; i += LANES) {                             \
            V v = LOAD(a + i);                                           \
            STORE(o + i, fn(v));                                         \
        }                                                                \
        if (i == n)                                                      \
            return;                                                      \
        T pad[LANES] = {0};                                              \
        memcpy(pad, a + i, (size_t)(n - i) * sizeof(T));                 \
        V v = LOAD(pad);                                                 \
        STORE(pad, fn(v));                                               \
        memcpy(o + i, pad, (size_t)(n - i) * sizeof(T));                 \
    }
DEFINE_MAP(float, F32_LANES, vf32, LOAD_F32, STORE_F32)
DEFINE_MAP(double, F64_LANES, vf64, LOAD_F64, STORE_F64)

#define SLEEF_KERNELS(fn, ulp)                                              \
    static void fn##_f32(int64_t n, void *o, const void *const *in)         \
    {                                                                       \
        map_float(n, o, in[0], SLEEF_F32(fn, ulp));                         \
    }                                                                       \
    static void fn##_f64(int64_t n, void *o, const void *const *in)         \
    {                                                                       \
        map_double(n, o, in[0], SLEEF_F64(fn, ulp));                        \
    }
SLEEF_KERNELS(exp, u10)
SLEEF_KERNELS(log, u10)
SLEEF_KERNELS(tanh, u35) /* 2.5x the speed of u10 here; GELU's cost is its tanh */
SLEEF_KERNELS(erf, u10)
SLEEF_KERNELS(sin, u10)
SLEEF_KERNELS(cos, u10)
SLEEF_KERNELS(log1p, u10)
SLEEF_KERNELS(expm1, u10)
SLEEF_KERNELS(log2, u10)
SLEEF_KERNELS(tan, u10)
SLEEF_KERNELS(atan, u10)

/* o[i] = fn(a[i], b[i]), the tail padded as DEFINE_MAP's. */
#define DEFINE_MAP2(T, LANES, V, LOAD, STORE)                                    \
    static void map2_##T(int64_t n, T *o, const T *a, const T *b, V (*fn)(V, V)) \
    {                                                                            \
        int64_t i = 0;                                                           \
        for (; i + LANES <= n; i += LANES)                                       \
            STORE(o + i, fn(LOAD(a + i), LOAD(b + i)));                          \
        if (i == n)                                                              \
            return;                                                              \
        T pa[LANES] = {0}, pb[LANES] = {0};                                      \
        memcpy(pa, a + i, (size_t)(n - i) * sizeof(T));                          \
        memcpy(pb, b + i, (size_t)(n - i) * sizeof(T));                          \
        STORE(pa, fn(LOAD(pa), LOAD(pb)));                                       \
        memcpy(o + i, pa, (size_t)(n - i) * sizeof(T));                          \
    }
DEFINE_MAP2(float, F32_LANES, vf32, LOAD_F32, STORE_F32)
DEFINE_MAP2(double, F64_LANES, vf64, LOAD_F64, STORE_F64)

static void atan2_f32(int64_t n, void *o, const void *const *in)
{
    map2_float(n, o, in[0], in[1], SLEEF_F32(atan2, u10));
}

static void atan2_f64(int64_t n, void *o, const void *const *in)
{
    map2_double(n, o, in[0], in[1], SLEEF_F64(atan2, u10));
}

/* 1 / (1 + e^-x): e^-x overflows to inf for very negative x, giving 0. */
#define SIGMOID_KERNEL(T, map, V)                                           \
    static void sigmoid_##T(int64_t n, void *out, const void *const *in)    \
    {                                                                       \
        T *restrict o = out;                                                \
        const T *restrict a = in[0];                                        \
        for (int64_t i = 0; i < n; i++) o[i] = -a[i];                       \
        map(n, o, o, V);                                                    \
        for (int64_t i = 0; i < n; i++) o[i] = 1 / (1 + o[i]);              \
    }
SIGMOID_KERNEL(f32, map_float, SLEEF_F32(exp, u10))
SIGMOID_KERNEL(f64, map_double, SLEEF_F64(exp, u10))

/* -- Loops from expressions ------------------------------------------------ */

#define UNARY_LOOP(name, T, EXPR)                                           \
    static void name(int64_t n, void *out, const void *const *in)           \
    {                                                                       \
        T *restrict o = out;                                                \
        const T *restrict a = in[0];                                        \
        for (int64_t i = 0; i < n; i++) {                                   \
            T x = a[i];                                                     \
            o[i] = EXPR;                                                    \
        }                                                                   \
    }

#define BINARY_LOOP(name, T, OUT, EXPR)                                     \
    static void name(int64_t n, void *out, const void *const *in)           \
    {                                                                       \
        OUT *restrict o = out;                                              \
        const T *restrict a = in[0], *restrict b = in[1];                   \
        for (int64_t i = 0; i < n; i++) {                                   \
            T x = a[i], y = b[i];                                           \
            o[i] = EXPR;                                                    \
        }                                                                   \
    }

#define WHERE_LOOP(T)                                                       \
    static void where_##T(int64_t n, void *out, const void *const *in)      \
    {                                                                       \
        T *restrict o = out;                                                \
        const uint8_t *restrict c = in[0];                                  \
        const T *restrict a = in[1], *restrict b = in[2];                   \
        for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];          \
    }

/* Comparisons, shared by every dtype. */
#define COMPARE_LOOPS(S, T)                               \
    BINARY_LOOP(eq_##S, T, uint8_t, x == y)               \
    BINARY_LOOP(ne_##S, T, uint8_t, x != y)               \
    BINARY_LOOP(lt_##S, T, uint8_t, x < y)                \
    BINARY_LOOP(le_##S, T, uint8_t, x <= y)               \
    BINARY_LOOP(gt_##S, T, uint8_t, x > y)                \
    BINARY_LOOP(ge_##S, T, uint8_t, x >= y)

/* -- Floor division and remainder ------------------------------------------ *
 * As PyTorch 1.13 (and Python): the remainder takes the divisor's sign, and
 * floor division is the float quotient corrected by the remainder, so that
 * a = b * floor_divide(a, b) + remainder(a, b) as nearly as rounding allows.
 * A float divisor of zero gives a / b. Integers: a divisor of zero gives 0
 * for both (numpy's answer; PyTorch raises), and INT_MIN // -1 wraps. */

#define FLOAT_DIVISION(S, T, FMOD, FLOOR)                                   \
    static inline T remainder_##S##_of(T a, T b)                            \
    {                                                                       \
        T m = FMOD(a, b);                                                   \
        return m != 0 && (b < 0) != (m < 0) ? m + b : m;                    \
    }                                                                       \
    static inline T floor_divide_##S##_of(T a, T b)                         \
    {                                                                       \
        if (b == 0)                                                         \
            return a / b;                                                   \
        T m = FMOD(a, b), q = (a - m) / b;                                  \
        if (m != 0 && (b < 0) != (m < 0))                                   \
            q -= 1;                                                         \
        if (q == 0)                                                         \
            return copysign(0, a / b);                                      \
        T f = FLOOR(q);                                                     \
        return q - f > (T)0.5 ? f + 1 : f;                                  \
    }

#define INT_DIVISION(S, T, U)                                               \
    static inline T floor_divide_##S##_of(T a, T b)                         \
    {                                                                       \
        if (b == 0)                                                         \
            return 0;                                                       \
        if (b == -1)                                                        \
            return (T)(0 - (U)a);                                           \
        T q = a / b, r = a % b;                                             \
        return r != 0 && (r < 0) != (b < 0) ? q - 1 : q;                    \
    }                                                                       \
    static inline T remainder_##S##_of(T a, T b)                            \
    {                                                                       \
        if (b == 0 || b == -1)                                              \
            return 0;                                                       \
        T r = a % b;                                                        \
        return r != 0 && (r < 0) != (b < 0) ? r + b : r;                    \
    }

FLOAT_DIVISION(f32, float, fmodf, floorf)
FLOAT_DIVISION(f64, double, fmod, floor)
INT_DIVISION(i32, int32_t, uint32_t)
INT_DIVISION(i64, int64_t, uint64_t)

/* -- Floating point -------------------------------------------------------- *
 * maximum and minimum are PyTorch's std::max and std::min with NaN winning:
 * of two equal operands (-0 and +0) the first. relu is PyTorch's
 * clamp_min(x, 0): -0 and NaN stay. */

#define FLOAT_LOOPS(S, T, POW, SQRT, FABS, FLOOR, CEIL, RINT, TRUNC)                                \
    BINARY_LOOP(add_##S, T, T, x + y)                                       \
    BINARY_LOOP(sub_##S, T, T, x - y)                                       \
    BINARY_LOOP(mul_##S, T, T, x * y)                                       \
    BINARY_LOOP(div_##S, T, T, x / y)                                       \
    BINARY_LOOP(pow_##S, T, T, POW(x, y))                                   \
    BINARY_LOOP(maximum_##S, T, T, (x < y || y != y) ? y : x)               \
    BINARY_LOOP(minimum_##S, T, T, (y < x || y != y) ? y : x)               \
    COMPARE_LOOPS(S, T)                                                     \
    UNARY_LOOP(neg_##S, T, -x)                                              \
    UNARY_LOOP(abs_##S, T, FABS(x))                                         \
    UNARY_LOOP(sqrt_##S, T, SQRT(x))                                        \
    UNARY_LOOP(rsqrt_##S, T, 1 / SQRT(x))                                   \
    UNARY_LOOP(relu_##S, T, x < 0 ? 0 : x)                                  \
    UNARY_LOOP(floor_##S, T, FLOOR(x))                                      \
    UNARY_LOOP(ceil_##S, T, CEIL(x))                                        \
    UNARY_LOOP(round_##S, T, RINT(x)) /* the default rounding: halves to even */ \
    UNARY_LOOP(trunc_##S, T, TRUNC(x))                                      \
    BINARY_LOOP(remainder_##S, T, T, remainder_##S##_of(x, y))              \
    BINARY_LOOP(floor_divide_##S, T, T, floor_divide_##S##_of(x, y))        \
    WHERE_LOOP(S)

FLOAT_LOOPS(f32, float, powf, sqrtf, fabsf, floorf, ceilf, rintf, truncf)
FLOAT_LOOPS(f64, double, pow, sqrt, fabs, floor, ceil, rint, trunc)

/* -- Integers -------------------------------------------------------------- */

/* base ** e in wrapping arithmetic; negative exponents truncate toward zero. */
#define INT_POW(S, T, U)                                                    \
    static inline T ipow_##S(T base, T e)                                   \
    {                                                                       \
        if (e < 0)                                                          \
            return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;     \
        U r = 1, b = (U)base;                                               \
        for (; e; e >>= 1, b *= b)                                          \
            if (e & 1)                                                      \
                r *= b;                                                     \
        return (T)r;                                                        \
    }

#define INT_LOOPS(S, T, U)                                                  \
    INT_POW(S, T, U)                                                        \
    BINARY_LOOP(add_##S, T, T, (T)((U)x + (U)y))                            \
    BINARY_LOOP(sub_##S, T, T, (T)((U)x - (U)y))                            \
    BINARY_LOOP(mul_##S, T, T, (T)((U)x * (U)y))                            \
    BINARY_LOOP(pow_##S, T, T, ipow_##S(x, y))                              \
    BINARY_LOOP(maximum_##S, T, T, x > y ? x : y)                           \
    BINARY_LOOP(minimum_##S, T, T, x < y ? x : y)                           \
    COMPARE_LOOPS(S, T)                                                     \
    UNARY_LOOP(neg_##S, T, (T)(0 - (U)x))                                   \
    UNARY_LOOP(abs_##S, T, x < 0 ? (T)(0 - (U)x) : x)                       \
    UNARY_LOOP(relu_##S, T, x > 0 ? x : 0)                                  \
    UNARY_LOOP(same_##S, T, x) /* floor, ceil, round and trunc of integers */ \
    BINARY_LOOP(remainder_##S, T, T, remainder_##S##_of(x, y))              \
    BINARY_LOOP(floor_divide_##S, T, T, floor_divide_##S##_of(x, y))        \
    WHERE_LOOP(S)

typedef int32_t i32;
typedef int64_t i64;
INT_LOOPS(i32, int32_t, uint32_t)
INT_LOOPS(i64, int64_t, uint64_t)

/* -- Bool: add is or, mul is and ------------------------------------------- */

BINARY_LOOP(or_b8, uint8_t, uint8_t, x | y)
BINARY_LOOP(and_b8, uint8_t, uint8_t, x & y)
COMPARE_LOOPS(b8, uint8_t)
typedef uint8_t b8;
WHERE_LOOP(b8)

/* -- The table ------------------------------------------------------------- */

#define ALL_DTYPES(op) {[KILN_F32] = op##_f32, [KILN_F64] = op##_f64, \
                        [KILN_I32] = op##_i32, [KILN_I64] = op##_i64, [KILN_BOOL] = op##_b8}
#define NUMBERS(op) {[KILN_F32] = op##_f32, [KILN_F64] = op##_f64, \
                     [KILN_I32] = op##_i32, [KILN_I64] = op##_i64}
#define FLOATS(op) {[KILN_F32] = op##_f32, [KILN_F64] = op##_f64}
#define ROUNDING(op) {[KILN_F32] = op##_f32, [KILN_F64] = op##_f64, [KILN_I32] = same_i32, [KILN_I64] = same_i64}

static const ew_kernel kernels[OP__COUNT][5] = {
    [OP_ADD] = {[KILN_F32] = add_f32, [KILN_F64] = add_f64, [KILN_I32] = add_i32,
                [KILN_I64] = add_i64, [KILN_BOOL] = or_b8},
    [OP_SUB] = NUMBERS(sub),
    [OP_MUL] = {[KILN_F32] = mul_f32, [KILN_F64] = mul_f64, [KILN_I32] = mul_i32,
                [KILN_I64] = mul_i64, [KILN_BOOL] = and_b8},
    [OP_DIV] = FLOATS(div),
    [OP_POW] = NUMBERS(pow),
    [OP_MAXIMUM] = {[KILN_F32] = maximum_f32, [KILN_F64] = maximum_f64, [KILN_I32] = maximum_i32,
                    [KILN_I64] = maximum_i64, [KILN_BOOL] = or_b8},
    [OP_MINIMUM] = {[KILN_F32] = minimum_f32, [KILN_F64] = minimum_f64, [KILN_I32] = minimum_i32,
                    [KILN_I64] = minimum_i64, [KILN_BOOL] = and_b8},
    [OP_EQ] = ALL_DTYPES(eq),
    [OP_NE] = ALL_DTYPES(ne),
    [OP_LT] = ALL_DTYPES(lt),
    [OP_LE] = ALL_DTYPES(le),
    [OP_GT] = ALL_DTYPES(gt),
    [OP_GE] = ALL_DTYPES(ge),
    [OP_WHERE] = ALL_DTYPES(where),
    [OP_NEG] = NUMBERS(neg),
    [OP_ABS] = NUMBERS(abs),
    [OP_EXP] = FLOATS(exp),
    [OP_LOG] = FLOATS(log),
    [OP_SQRT] = FLOATS(sqrt),
    [OP_RSQRT] = FLOATS(rsqrt),
    [OP_TANH] = FLOATS(tanh),
    [OP_SIGMOID] = FLOATS(sigmoid),
    [OP_RELU] = NUMBERS(relu),
    [OP_SIN] = FLOATS(sin),
    [OP_COS] = FLOATS(cos),
    [OP_ERF] = FLOATS(erf),
    [OP_REMAINDER] = NUMBERS(remainder),
    [OP_FLOOR_DIVIDE] = NUMBERS(floor_divide),
    [OP_ATAN2] = FLOATS(atan2),
    [OP_FLOOR] = ROUNDING(floor),
    [OP_CEIL] = ROUNDING(ceil),
    [OP_ROUND] = ROUNDING(round),
    [OP_TRUNC] = ROUNDING(trunc),
    [OP_LOG1P] = FLOATS(log1p),
    [OP_EXPM1] = FLOATS(expm1),
    [OP_LOG2] = FLOATS(log2),
    [OP_TAN] = FLOATS(tan),
    [OP_ATAN] = FLOATS(atan),
};

ew_kernel kernel_for(ir_op op, kiln_dtype compute)
{
    return kernels[op][compute];
}
