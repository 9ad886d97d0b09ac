/* Transcendental functions as LLVM IR: inline f32 polynomial approximations
 * that the loop vectorizer widens, and libm calls for f64, sin and cos.
 *
 * An f32 approximation is built only from arithmetic, compares, selects,
 * bitcasts, integer ops and intrinsics with vector forms (llvm.fabs,
 * llvm.rint, llvm.copysign, llvm.minnum), never a call, so a loop applying
 * it vectorizes. Every branch of an approximation is computed and the answer
 * picked by select, as a vector lane would. Special values follow libm: NaN
 * passes through, infinities and signed zeros come out as libm gives them.
 * The errors measured by tests/test_llvm_math.c are in math.h.
 *
 * The polynomials marked "fitted" were fitted for kiln with mpmath (50
 * digits): a weighted Remez exchange minimising the largest relative error
 * (absolute in the ulps of the result for erf's tail) on the interval named,
 * each leading coefficient rounded to float and the rest refitted. */
#include "codegen_llvm/math.h"
#include "codegen_llvm/internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
/* Not INFINITY and NAN: meson puts this folder on the include path, so
 * <math.h> here finds codegen_llvm/math.h. */
#define INF __builtin_inf()
#define QNAN __builtin_nan("")

/* -- IR helpers --------------------------------------------------------- */

/* Where the code goes: the builder, the floating type (float, or double for
 * sigmoid's libm form) and i32 for the float bit tricks. */
typedef struct {
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMTypeRef t;
    LLVMTypeRef i32;
} emitter;

static LLVMValueRef e_const(const emitter *e, double v)
{
    return LLVMConstReal(e->t, v);
}

static LLVMValueRef e_int(const emitter *e, int32_t v)
{
    return LLVMConstInt(e->i32, (unsigned long long)(int64_t)v, 1);
}

static LLVMValueRef e_add(const emitter *e, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildFAdd(e->b, x, y, "");
}

static LLVMValueRef e_sub(const emitter *e, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildFSub(e->b, x, y, "");
}

static LLVMValueRef e_mul(const emitter *e, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildFMul(e->b, x, y, "");
}

static LLVMValueRef e_div(const emitter *e, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildFDiv(e->b, x, y, "");
}

static LLVMValueRef e_select(const emitter *e, LLVMValueRef c, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildSelect(e->b, c, x, y, "");
}

static LLVMValueRef e_fcmp(const emitter *e, LLVMRealPredicate p, LLVMValueRef x, LLVMValueRef y)
{
    return LLVMBuildFCmp(e->b, p, x, y, "");
}

static LLVMValueRef e_to_bits(const emitter *e, LLVMValueRef x)
{
    return LLVMBuildBitCast(e->b, x, e->i32, "");
}

static LLVMValueRef e_from_bits(const emitter *e, LLVMValueRef i)
{
    return LLVMBuildBitCast(e->b, i, e->t, "");
}

/* A call of the overloaded intrinsic name (llvm.fabs, ...) on operands of type e->t. */
static LLVMValueRef e_intrinsic(const emitter *e, const char *name, LLVMValueRef *args, unsigned n)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMTypeRef t = e->t;
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(e->m, id, &t, 1);
    LLVMTypeRef fty = LLVMIntrinsicGetType(LLVMGetModuleContext(e->m), id, &t, 1);
    return LLVMBuildCall2(e->b, fty, fn, args, n, "");
}

static LLVMValueRef e_fabs(const emitter *e, LLVMValueRef x)
{
    return e_intrinsic(e, "llvm.fabs", &x, 1);
}

/* min(x, c) for a constant c; min(NaN, c) is c. */
static LLVMValueRef e_min(const emitter *e, LLVMValueRef x, double c)
{
    LLVMValueRef args[] = {x, e_const(e, c)};
    return e_intrinsic(e, "llvm.minnum", args, 2);
}

/* min(x, c) for a constant c, NaN kept (its compare is false): one vminps
 * on x86, as llvm.minnum with a constant is. */
static LLVMValueRef e_below(const emitter *e, LLVMValueRef x, double c)
{
    LLVMValueRef k = e_const(e, c);
    return e_select(e, e_fcmp(e, LLVMRealOGT, x, k), k, x);
}

/* max(x, c) likewise: one vmaxps. */
static LLVMValueRef e_above(const emitter *e, LLVMValueRef x, double c)
{
    LLVMValueRef k = e_const(e, c);
    return e_select(e, e_fcmp(e, LLVMRealOLT, x, k), k, x);
}

/* x clamped to [lo, hi], NaN kept. */
static LLVMValueRef e_clamp(const emitter *e, LLVMValueRef x, double lo, double hi)
{
    return e_above(e, e_below(e, x, hi), lo);
}

/* |mag| with the sign of sign. */
static LLVMValueRef e_copysign(const emitter *e, LLVMValueRef mag, LLVMValueRef sign)
{
    LLVMValueRef args[] = {mag, sign};
    return e_intrinsic(e, "llvm.copysign", args, 2);
}

/* x y + z, fused where the target has FMA. */
static LLVMValueRef e_muladd(const emitter *e, LLVMValueRef x, LLVMValueRef y, LLVMValueRef z)
{
    LLVMValueRef args[] = {x, y, z};
    return e_intrinsic(e, "llvm.fmuladd", args, 3);
}

/* c[0] + x (c[1] + x (c[2] + ...)), by Horner's rule. */
static LLVMValueRef e_horner(const emitter *e, LLVMValueRef x, const double *c, int n)
{
    LLVMValueRef acc = e_const(e, c[n - 1]);
    for (int i = n - 2; i >= 0; i--)
        acc = e_muladd(e, acc, x, e_const(e, c[i]));
    return acc;
}

/* x where x is NaN, else r: the approximations below clamp their inputs,
 * which turns NaN into a number, so each ends by passing NaN through. */
static LLVMValueRef nan_passthrough(const emitter *e, LLVMValueRef x, LLVMValueRef r)
{
    return e_select(e, e_fcmp(e, LLVMRealUNO, x, x), x, r);
}

/* -- exp ---------------------------------------------------------------- */

/* exp(x) = 2^k exp(r), k = rint(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2].
 * k comes from adding EXP_SHIFTER (1.5 2^23) to x / ln 2, which rounds it to
 * an integer in the low bits of the sum: kf as a float and k as an integer
 * without a rint or a conversion. ln 2 is split Cody-Waite style (Cephes
 * expf.c): EXP_LN2_HI has 9 significant bits, so k * EXP_LN2_HI is exact
 * for |k| <= 2^15 with or without FMA. */
#define EXP_LOG2E 1.44269504088896341
#define EXP_SHIFTER 12582912.0
#define EXP_SHIFTER_BITS 0x4b400000
#define EXP_LN2_HI 0.693359375
#define EXP_LN2_LO -2.12194440e-4
/* exp(r) = 1 + r + r^2 P(r), P from Cephes expf.c (S. L. Moshier), lowest
 * degree first. */
static const double exp_p[] = {
    5.0000001201E-1, 1.6666665459E-1, 4.1665795894E-2,
    8.3334519073E-3, 1.3981999507E-3, 1.9875691500E-4,
};
/* Past these exp(x) is inf, or below half the least subnormal so 0:
 * log(FLT_MAX) = 88.72, log(2^-150) = -103.97. Clamping here keeps k in
 * [-150, 128] and lets the scaling below produce the inf and the 0. */
#define EXP_CLAMP_HI 89.0
#define EXP_CLAMP_LO -104.0

/* 2^k for integer k in [-126, 127], from the exponent bits. exp_core's
 * scaling below is matched by math_lower_target: keep the two in step. */
static LLVMValueRef pow2i(const emitter *e, LLVMValueRef k)
{
    LLVMValueRef biased = LLVMBuildAdd(e->b, k, e_int(e, 127), "");
    return e_from_bits(e, LLVMBuildShl(e->b, biased, e_int(e, 23), ""));
}

/* exp(x + lo) for x in [EXP_CLAMP_LO, EXP_CLAMP_HI] or NaN and a correction
 * |lo| << ulp(x)'s worth of x (lo may be NULL); no NaN handling. */
static LLVMValueRef exp_clamped(const emitter *e, LLVMValueRef x, LLVMValueRef lo)
{
    LLVMValueRef shifted = e_muladd(e, x, e_const(e, EXP_LOG2E), e_const(e, EXP_SHIFTER));
    LLVMValueRef kf = e_sub(e, shifted, e_const(e, EXP_SHIFTER));
    LLVMValueRef r = e_muladd(e, kf, e_const(e, -EXP_LN2_HI), x);
    r = e_muladd(e, kf, e_const(e, -EXP_LN2_LO), r);
    if (lo)
        r = e_add(e, r, lo);
    LLVMValueRef r2 = e_mul(e, r, r);
    /* Not r2 P + r in one FMA: that measured 1.010 ulp (at -5.878), over the bound */
    LLVMValueRef p = e_add(e, e_add(e, e_mul(e, r2, e_horner(e, r, exp_p, COUNT(exp_p))), r), e_const(e, 1.0));
    /* 2^k in two factors so that a result in the subnormal range is rounded
     * once, by the last multiply, and one past FLT_MAX becomes inf: p in
     * [0.7, 1.42] times 2^k1, |k1| <= 75, is a normal float, made exactly
     * by adding k1 to p's exponent bits. */
    LLVMValueRef k = LLVMBuildSub(e->b, e_to_bits(e, shifted), e_int(e, EXP_SHIFTER_BITS), "");
    LLVMValueRef k1 = LLVMBuildAShr(e->b, k, e_int(e, 1), "");
    LLVMValueRef k2 = LLVMBuildSub(e->b, k, k1, "");
    LLVMValueRef pk1 = LLVMBuildAdd(e->b, e_to_bits(e, p), LLVMBuildShl(e->b, k1, e_int(e, 23), ""), "");
    return e_mul(e, e_from_bits(e, pk1), pow2i(e, k2));
}

/* exp(x + lo) as exp_clamped, for any x. */
static LLVMValueRef exp_core(const emitter *e, LLVMValueRef x, LLVMValueRef lo)
{
    /* NaN stays NaN through the clamp and what follows but the integer
     * scaling; where math_lower_target makes that a vscalefps, exp's NaN
     * then needs no select of its own. */
    return exp_clamped(e, e_clamp(e, x, EXP_CLAMP_LO, EXP_CLAMP_HI), lo);
}

static LLVMValueRef exp_f32(const emitter *e, LLVMValueRef x)
{
    return nan_passthrough(e, x, exp_core(e, x, NULL));
}

/* -- log ---------------------------------------------------------------- */

/* log(x) = k ln 2 + log(m), m in [sqrt(1/2), sqrt(2)); with f = m - 1 and
 * s = f / (2 + f), log(m) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R(s^2)).
 * Method and constants from FreeBSD's e_logf.c (as in musl's logf). */
#define LOG_LN2_HI 6.9313812256e-01 /* 0x3f317180: k * LOG_LN2_HI exact */
#define LOG_LN2_LO 9.0580006145e-06 /* 0x3717f7d1 */
/* R(z) = z (Lg1 + z (Lg2 + ...)): a fit to (log(m) - 2s)/s - s^2/3 ... in
 * FreeBSD's terms; Lg1..Lg4 = 0xaaaaaa.0p-24, 0xccce13.0p-25, 0x91e9ee.0p-25,
 * 0xf89e26.0p-26. */
static const double log_lg[] = {
    0.66666662693, 0.40000972152, 0.28498786688, 0.24279078841,
};
#define LOG_SQRT_HALF_BITS 0x3f3504f3 /* sqrt(1/2) as float bits */
#define FLT_MIN_ 0x1p-126
#define SUBNORMAL_SCALE 0x1p23

/* The parts of log(x) for a positive finite x: its binary exponent k (as a
 * float) and log(m) = tail - hfsq + f, left apart so that log and log2 each
 * sum them in the order that rounds least. */
typedef struct {
    LLVMValueRef dk, f, hfsq, tail;
} log_parts;

static log_parts log_reduce(const emitter *e, LLVMValueRef x)
{
    /* A subnormal scaled by 2^23 is normal; its exponent is 23 too large. */
    LLVMValueRef sub_ = e_fcmp(e, LLVMRealOLT, x, e_const(e, FLT_MIN_));
    LLVMValueRef xs = e_select(e, sub_, e_mul(e, x, e_const(e, SUBNORMAL_SCALE)), x);
    LLVMValueRef kadj = e_select(e, sub_, e_int(e, -23), e_int(e, 0));

    /* Offsetting the bits by 1 - sqrt(1/2) moves the exponent step from
     * m = 2 to m = sqrt(2), so the mantissa comes out in [sqrt(1/2), sqrt(2)). */
    LLVMValueRef ix = LLVMBuildAdd(e->b, e_to_bits(e, xs), e_int(e, 0x3f800000 - LOG_SQRT_HALF_BITS), "");
    LLVMValueRef k = LLVMBuildSub(e->b, LLVMBuildLShr(e->b, ix, e_int(e, 23), ""), e_int(e, 127), "");
    k = LLVMBuildAdd(e->b, k, kadj, "");
    LLVMValueRef mbits = LLVMBuildAdd(e->b, LLVMBuildAnd(e->b, ix, e_int(e, 0x007fffff), ""),
                                      e_int(e, LOG_SQRT_HALF_BITS), "");
    log_parts p;
    p.f = e_sub(e, e_from_bits(e, mbits), e_const(e, 1.0));
    LLVMValueRef s = e_div(e, p.f, e_add(e, e_const(e, 2.0), p.f));
    LLVMValueRef z = e_mul(e, s, s);
    LLVMValueRef R = e_mul(e, z, e_horner(e, z, log_lg, COUNT(log_lg)));
    p.hfsq = e_mul(e, e_mul(e, e_const(e, 0.5), p.f), p.f);
    p.tail = e_mul(e, s, e_add(e, p.hfsq, R));
    p.dk = LLVMBuildSIToFP(e->b, k, e->t, "");
    return p;
}

/* r where x is a positive number; log's values at +inf, 0, below 0 and NaN. */
static LLVMValueRef log_specials(const emitter *e, LLVMValueRef x, LLVMValueRef r)
{
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, x, e_const(e, INF)), x, r);
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, x, e_const(e, 0.0)), e_const(e, -INF), r);
    r = e_select(e, e_fcmp(e, LLVMRealOLT, x, e_const(e, 0.0)), e_const(e, QNAN), r);
    return nan_passthrough(e, x, r);
}

static LLVMValueRef log_f32(const emitter *e, LLVMValueRef x)
{
    log_parts p = log_reduce(e, x);
    /* Summed smallest first, the exact k ln2_hi last. */
    LLVMValueRef r = e_add(e, p.tail, e_mul(e, p.dk, e_const(e, LOG_LN2_LO)));
    r = e_add(e, e_sub(e, r, p.hfsq), p.f);
    r = e_add(e, r, e_mul(e, p.dk, e_const(e, LOG_LN2_HI)));
    return log_specials(e, x, r);
}

/* log2(x) = k + log(m) / ln 2: k is exact, so powers of two come out exact. */
static LLVMValueRef log2_f32(const emitter *e, LLVMValueRef x)
{
    log_parts p = log_reduce(e, x);
    LLVMValueRef logm = e_add(e, e_sub(e, p.tail, p.hfsq), p.f);
    return log_specials(e, x, e_add(e, e_mul(e, logm, e_const(e, EXP_LOG2E)), p.dk));
}

/* log1p(x) = log(u) x / (u - 1) for u = 1 + x rounded (Goldberg's "What
 * every computer scientist should know", theorem 4): the quotient makes up
 * for the rounding of u, so the result keeps log's accuracy where x is
 * tiny. u = 1 means x is below half an ulp of 1, where log1p(x) is x. */
static LLVMValueRef log1p_f32(const emitter *e, LLVMValueRef x)
{
    LLVMValueRef one = e_const(e, 1.0), u = e_add(e, one, x);
    LLVMValueRef r = e_mul(e, log_f32(e, u), e_div(e, x, e_sub(e, u, one)));
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, u, one), x, r);
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, x, e_const(e, INF)), x, r);
    return e_select(e, e_fcmp(e, LLVMRealOEQ, x, e_const(e, -1.0)), e_const(e, -INF), r);
}

/* -- expm1 and atan ---------------------------------------------------- */

/* expm1(x) = (u - 1) x / log(u) for u = exp(x) rounded (Kahan's method):
 * the quotient corrects u's rounding as log1p's does; u = 1 means x is
 * tiny (expm1 is x), u - 1 = -1 that expm1 rounds to -1, u = inf that it
 * overflows. */
static LLVMValueRef expm1_f32(const emitter *e, LLVMValueRef x)
{
    LLVMValueRef one = e_const(e, 1.0), u = exp_f32(e, x), um1 = e_sub(e, u, one);
    LLVMValueRef r = e_mul(e, e_div(e, um1, log_f32(e, u)), x); /* um1 x may overflow where the result does not */
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, um1, e_const(e, -1.0)), um1, r);
    r = e_select(e, e_fcmp(e, LLVMRealOEQ, u, e_const(e, INF)), u, r);
    return nan_passthrough(e, x, e_select(e, e_fcmp(e, LLVMRealOEQ, u, one), x, r));
}

/* atan(|x|) reduced to |t| <= tan(pi/8) by atan(a) = pi/2 - atan(1/a) above
 * tan(3pi/8) and pi/4 + atan((a-1)/(a+1)) above tan(pi/8), then t + t z P(z)
 * for z = t^2: Cephes' atanf.c (S. L. Moshier), lowest degree first. */
static const double atan_p[] = {
    -3.33329491539E-1, 1.99777106478E-1, -1.38776856032E-1, 8.05374449538E-2,
};
#define ATAN_TAN_3PI_8 2.414213562373095
#define ATAN_TAN_PI_8 0.4142135623730950

static LLVMValueRef atan_f32(const emitter *e, LLVMValueRef x)
{
    LLVMValueRef a = e_fabs(e, x), one = e_const(e, 1.0);
    LLVMValueRef big = e_fcmp(e, LLVMRealOGT, a, e_const(e, ATAN_TAN_3PI_8));
    LLVMValueRef mid = e_fcmp(e, LLVMRealOGT, a, e_const(e, ATAN_TAN_PI_8));
    LLVMValueRef t = e_select(e, mid, e_div(e, e_sub(e, a, one), e_add(e, a, one)), a);
    t = e_select(e, big, e_div(e, e_const(e, -1.0), a), t);
    LLVMValueRef base = e_select(e, big, e_const(e, 1.57079632679489662),
                                 e_select(e, mid, e_const(e, 0.785398163397448310), e_const(e, 0.0)));
    LLVMValueRef z = e_mul(e, t, t);
    LLVMValueRef r = e_add(e, base, e_muladd(e, e_mul(e, e_horner(e, z, atan_p, COUNT(atan_p)), z), t, t));
    return nan_passthrough(e, x, e_copysign(e, r, x));
}

/* -- tanh --------------------------------------------------------------- */

/* tanh(x) = x P(z) / Q(z), z = x^2, on [-TANH_CLAMP, TANH_CLAMP]: a rational
 * fitted for least relative error (2e-8 in exact arithmetic), its
 * coefficients rounded to float one at a time and the rest refitted. Eigen
 * and XLA compute f32 tanh the same way. It costs a third of 1 - 2 / (exp(2|x|) + 1)
 * beside a small-|x| polynomial (GELU's cost is its tanh) for about 4 ulp
 * more: the coefficients are all positive, so Horner's rule does not cancel,
 * but P, Q and the quotient each round, and that is what math.h's bound
 * measures. P and Q are even, so tanh is odd and tanh(-0) = -0. Past 9.02
 * tanh rounds to 1: x^2 is clamped there, the quotient (which may pass 1 by
 * an ulp or two) to 1, and a NaN passes both clamps' comparisons. */
#define TANH_CLAMP 9.02
static const double tanh_p[] = {
    1.0, 0.133826777, 0.00349744619, 2.06356272e-05, 1.33840112e-08,
};
static const double tanh_q[] = {
    1.0, 0.467159986, 0.0258843191, 0.000328849768, 7.79014158e-07,
};

/* Computed as |x| P(z) / Q(z) with z clamped, and the sign of x put back:
 * two clamps of one side each where clamping x and the quotient to both
 * sides takes four, and a clamp costs a product's time on a core whose
 * vminps shares the multipliers' ports (AVX-512 on Zen 4: GELU's time is
 * those ports'). Within the clamp it is the quotient above bit for bit;
 * past it, |x| P(z) / Q(z) grows from the quotient at the clamp, which
 * rounds to 1 or just below, so the clamp at 1 gives what clamping x gave
 * or 1. */
static LLVMValueRef tanh_f32(const emitter *e, LLVMValueRef x)
{
    LLVMValueRef a = e_fabs(e, x);
    /* the float square of the float clamp: x^2 at x = the clamp, so that
     * |x| below the clamp leaves z as it is */
    double clamp = (float)TANH_CLAMP;
    LLVMValueRef z = e_below(e, e_mul(e, a, a), clamp * clamp);
    LLVMValueRef num = e_mul(e, a, e_horner(e, z, tanh_p, COUNT(tanh_p)));
    return e_copysign(e, e_below(e, e_div(e, num, e_horner(e, z, tanh_q, COUNT(tanh_q))), 1.0), x);
}

/* -- sigmoid ------------------------------------------------------------ */

/* Given t = exp(-|x|) <= 1: sigmoid(x) = 1 / (1 + t) for x >= 0 and
 * t / (1 + t) for x < 0, which stays accurate where sigmoid(x) ~ exp(x) is
 * tiny or subnormal (1 / (1 + exp(-x)) would overflow to 0 below -88.7).
 * d = 1 + t loses the low bits of t; they are err = t - (d - 1) exactly,
 * and r0 = num / d is corrected to num / (d + err) ~ r0 - r0 err / d, where
 * 1 / d is r0 for x >= 0 and 1 - r0 for x < 0. */
static LLVMValueRef sigmoid_from_exp(const emitter *e, LLVMValueRef x, LLVMValueRef t)
{
    LLVMValueRef one = e_const(e, 1.0);
    LLVMValueRef d = e_add(e, one, t);
    LLVMValueRef err = e_sub(e, t, e_sub(e, d, one));
    LLVMValueRef neg = e_fcmp(e, LLVMRealOLT, x, e_const(e, 0.0));
    LLVMValueRef r0 = e_div(e, e_select(e, neg, t, one), d);
    LLVMValueRef inv_d = e_select(e, neg, e_sub(e, one, r0), r0);
    LLVMValueRef r = e_sub(e, r0, e_mul(e, e_mul(e, r0, err), inv_d));
    return nan_passthrough(e, x, r);
}

static LLVMValueRef sigmoid_f32(const emitter *e, LLVMValueRef x)
{
    return sigmoid_from_exp(e, x, exp_core(e, LLVMBuildFNeg(e->b, e_fabs(e, x), ""), NULL));
}

/* -- erf ---------------------------------------------------------------- */

/* Below ERF_SMALL, erf(x) = x + x P(x^2): P fitted on [0, 0.875] to
 * erf(x)/x - 1 (relative error of erf 1.4e-8). Adding x apart keeps the
 * rounding of the leading coefficient 2/sqrt(pi) - 1 small against erf. */
#define ERF_SMALL 0.875
static const double erf_p[] = {
    0.128379151, -0.376125038, 0.112819217, -0.0267704688, 0.00499887997, -0.000602009532,
};
/* Above, erf(x) = 1 - exp(-x^2) G(x - ERF_MID), G fitted on [0.875, 4] to
 * erfcx(x) = exp(x^2) erfc(x) weighted by exp(-x^2), so that the absolute
 * error of erfc is at most 0.1 ulp of erf(x) ~ 1. erf(4) is 1 in float, so
 * |x| is clamped to ERF_CLAMP. */
#define ERF_MID 2.375
#define ERF_CLAMP 4.0
static const double erf_g[] = {
    0.220507324,   -0.0809664056, 0.0281722806,  -0.0095158089, 0.00271923165,
    -0.000914606382, 0.000636718527, 0.000279303116, 0.00014277939,
};

static LLVMValueRef erf_f32(const emitter *e, LLVMValueRef x)
{
    LLVMValueRef z = e_mul(e, x, x);
    LLVMValueRef small = e_add(e, x, e_mul(e, x, e_horner(e, z, erf_p, COUNT(erf_p))));

    /* exp(-a^2) with a^2 carried as hi + lo (FreeBSD's s_erff.c trick): a
     * with its low 12 mantissa bits cleared squares exactly, and
     * a^2 - ah^2 = (a - ah)(a + ah) is small. */
    LLVMValueRef a = e_min(e, e_fabs(e, x), ERF_CLAMP);
    LLVMValueRef ah = e_from_bits(e, LLVMBuildAnd(e->b, e_to_bits(e, a), e_int(e, (int32_t)0xfffff000), ""));
    LLVMValueRef lo = e_mul(e, e_sub(e, a, ah), e_add(e, a, ah));
    LLVMValueRef ex = exp_core(e, LLVMBuildFNeg(e->b, e_mul(e, ah, ah), ""), LLVMBuildFNeg(e->b, lo, ""));
    LLVMValueRef erfc = e_mul(e, ex, e_horner(e, e_sub(e, a, e_const(e, ERF_MID)), erf_g, COUNT(erf_g)));
    LLVMValueRef large = e_sub(e, e_const(e, 1.0), erfc);

    /* erf is odd: large is for |x|, and the sign keeps erf(-0) = -0. */
    LLVMValueRef r = e_select(e, e_fcmp(e, LLVMRealOLT, a, e_const(e, ERF_SMALL)), small, large);
    return nan_passthrough(e, x, e_copysign(e, r, x));
}

/* -- libm calls --------------------------------------------------------- */

/* A call of the libm function name, of type e->t(e->t), declared in the
 * module if it is not yet. */
static LLVMValueRef libm_call(const emitter *e, const char *name, LLVMValueRef x)
{
    LLVMTypeRef t = e->t;
    LLVMTypeRef fty = LLVMFunctionType(t, &t, 1, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(e->m, name);
    if (!fn)
        fn = LLVMAddFunction(e->m, name, fty);
    return LLVMBuildCall2(e->b, fty, fn, &x, 1, "");
}

static LLVMValueRef sigmoid_f64(const emitter *e, LLVMValueRef x)
{
    return sigmoid_from_exp(e, x, libm_call(e, "exp", LLVMBuildFNeg(e->b, e_fabs(e, x), "")));
}

/* -- Rounding, floor division and remainder ------------------------------- */

/* floor, ceil, round (halves to even, as eager's rint) and trunc: intrinsics
 * that vectorize; NULL for another op. */
static LLVMValueRef rounding(const emitter *e, ir_op op, LLVMValueRef x)
{
    switch (op) {
    case OP_FLOOR: return e_intrinsic(e, "llvm.floor", &x, 1);
    case OP_CEIL: return e_intrinsic(e, "llvm.ceil", &x, 1);
    case OP_ROUND: return e_intrinsic(e, "llvm.roundeven", &x, 1);
    case OP_TRUNC: return e_intrinsic(e, "llvm.trunc", &x, 1);
    default: return NULL;
    }
}

/* A call of the libm function name of type e->t(e->t, e->t). */
static LLVMValueRef libm_call2(const emitter *e, const char *name, LLVMValueRef x, LLVMValueRef y)
{
    LLVMTypeRef params[2] = {e->t, e->t};
    LLVMTypeRef fty = LLVMFunctionType(e->t, params, 2, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(e->m, name);
    if (!fn)
        fn = LLVMAddFunction(e->m, name, fty);
    LLVMValueRef args[2] = {x, y};
    return LLVMBuildCall2(e->b, fty, fn, args, 2, "");
}

/* fmod's remainder m, moved to the divisor's sign when it has the other
 * (eager's rule, src/eager/kernels.c); *adjusted says whether it was. */
static LLVMValueRef float_remainder(const emitter *e, LLVMValueRef a, LLVMValueRef b, LLVMValueRef *adjusted)
{
    LLVMValueRef zero = e_const(e, 0.0), m = LLVMBuildFRem(e->b, a, b, "");
    LLVMValueRef signs = LLVMBuildXor(e->b, e_fcmp(e, LLVMRealOLT, b, zero), e_fcmp(e, LLVMRealOLT, m, zero), "");
    *adjusted = LLVMBuildAnd(e->b, e_fcmp(e, LLVMRealUNE, m, zero), signs, "");
    return m;
}

/* PyTorch 1.13's floor division: the quotient of a - fmod(a, b), floored
 * and corrected by the remainder's sign; a / b for b = 0. */
static LLVMValueRef float_floor_divide(const emitter *e, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef adjusted, m = float_remainder(e, a, b, &adjusted), one = e_const(e, 1.0), zero = e_const(e, 0.0);
    LLVMValueRef q = e_div(e, e_sub(e, a, m), b), quotient = e_div(e, a, b);
    q = e_select(e, adjusted, e_sub(e, q, one), q);
    LLVMValueRef f = e_intrinsic(e, "llvm.floor", &q, 1);
    f = e_select(e, e_fcmp(e, LLVMRealOGT, e_sub(e, q, f), e_const(e, 0.5)), e_add(e, f, one), f);
    LLVMValueRef r = e_select(e, e_fcmp(e, LLVMRealOEQ, q, zero), e_copysign(e, zero, quotient), f);
    return e_select(e, e_fcmp(e, LLVMRealOEQ, b, zero), quotient, r);
}

LLVMValueRef math_emit_binary(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef x, LLVMValueRef y)
{
    emitter e = {m, b, LLVMTypeOf(x), LLVMInt32TypeInContext(LLVMGetModuleContext(m))};
    LLVMTypeKind kind = LLVMGetTypeKind(e.t);
    if (kind != LLVMFloatTypeKind && kind != LLVMDoubleTypeKind)
        return NULL;
    LLVMValueRef adjusted, r;
    switch (op) {
    case OP_ATAN2: return libm_call2(&e, kind == LLVMFloatTypeKind ? "atan2f" : "atan2", x, y);
    case OP_FLOOR_DIVIDE: return float_floor_divide(&e, x, y);
    case OP_REMAINDER:
        r = float_remainder(&e, x, y, &adjusted);
        return e_select(&e, adjusted, e_add(&e, r, y), r);
    default: return NULL;
    }
}

/* Integer floor division and remainder as eager's: a divisor of 0 gives 0,
 * of -1 a negation that wraps (and remainder 0). The division itself runs
 * with 1 in their place, never dividing by 0 or INT_MIN by -1. */
static LLVMValueRef int_division(LLVMBuilderRef b, ir_op op, LLVMValueRef x, LLVMValueRef y)
{
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef zero = LLVMConstInt(t, 0, 0), one = LLVMConstInt(t, 1, 0), minus_one = LLVMConstInt(t, -1ULL, 1);
    LLVMValueRef by_zero = LLVMBuildICmp(b, LLVMIntEQ, y, zero, "");
    LLVMValueRef by_minus_one = LLVMBuildICmp(b, LLVMIntEQ, y, minus_one, "");
    LLVMValueRef safe = LLVMBuildSelect(b, LLVMBuildOr(b, by_zero, by_minus_one, ""), one, y, "");
    LLVMValueRef q = LLVMBuildSDiv(b, x, safe, ""), r = LLVMBuildSRem(b, x, safe, "");
    LLVMValueRef signs = LLVMBuildICmp(b, LLVMIntSLT, LLVMBuildXor(b, r, y, ""), zero, "");
    LLVMValueRef adjusted = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntNE, r, zero, ""), signs, "");
    if (op == OP_REMAINDER) {
        r = LLVMBuildSelect(b, adjusted, LLVMBuildAdd(b, r, y, ""), r, "");
        return LLVMBuildSelect(b, LLVMBuildOr(b, by_zero, by_minus_one, ""), zero, r, "");
    }
    q = LLVMBuildSelect(b, adjusted, LLVMBuildSub(b, q, one, ""), q, "");
    q = LLVMBuildSelect(b, by_minus_one, LLVMBuildNeg(b, x, ""), q, "");
    return LLVMBuildSelect(b, by_zero, zero, q, "");
}

LLVMValueRef math_emit_int(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef *a)
{
    (void)m;
    if (LLVMGetIntTypeWidth(LLVMTypeOf(a[0])) < 32) /* bool: none of these */
        return NULL;
    switch (op) {
    case OP_FLOOR:
    case OP_CEIL:
    case OP_ROUND:
    case OP_TRUNC: return a[0];
    case OP_REMAINDER:
    case OP_FLOOR_DIVIDE: return int_division(b, op, a[0], a[1]);
    default: return NULL;
    }
}

/* -- Dispatch ----------------------------------------------------------- */

LLVMValueRef math_emit_exp_nonpositive(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x)
{
    emitter e = {m, b, LLVMTypeOf(x), LLVMInt32TypeInContext(LLVMGetModuleContext(m))};
    if (LLVMGetTypeKind(e.t) != LLVMFloatTypeKind)
        return math_emit(m, b, OP_EXP, x);
    return nan_passthrough(&e, x, exp_clamped(&e, e_above(&e, x, EXP_CLAMP_LO), NULL));
}

LLVMValueRef math_emit(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef x)
{
    emitter e = {m, b, LLVMTypeOf(x), LLVMInt32TypeInContext(LLVMGetModuleContext(m))};
    switch (LLVMGetTypeKind(e.t)) {
    case LLVMFloatTypeKind:
        switch (op) {
        case OP_EXP: return exp_f32(&e, x);
        case OP_LOG: return log_f32(&e, x);
        case OP_TANH: return tanh_f32(&e, x);
        case OP_SIGMOID: return sigmoid_f32(&e, x);
        case OP_ERF: return erf_f32(&e, x);
        case OP_SIN: return libm_call(&e, "sinf", x);
        case OP_COS: return libm_call(&e, "cosf", x);
        case OP_LOG1P: return log1p_f32(&e, x);
        case OP_EXPM1: return expm1_f32(&e, x);
        case OP_LOG2: return log2_f32(&e, x);
        case OP_ATAN: return atan_f32(&e, x);
        case OP_TAN: return libm_call(&e, "tanf", x);
        default: return rounding(&e, op, x);
        }
    case LLVMDoubleTypeKind:
        switch (op) {
        case OP_EXP: return libm_call(&e, "exp", x);
        case OP_LOG: return libm_call(&e, "log", x);
        case OP_TANH: return libm_call(&e, "tanh", x);
        case OP_SIGMOID: return sigmoid_f64(&e, x);
        case OP_ERF: return libm_call(&e, "erf", x);
        case OP_SIN: return libm_call(&e, "sin", x);
        case OP_COS: return libm_call(&e, "cos", x);
        case OP_LOG1P: return libm_call(&e, "log1p", x);
        case OP_EXPM1: return libm_call(&e, "expm1", x);
        case OP_LOG2: return libm_call(&e, "log2", x);
        case OP_ATAN: return libm_call(&e, "atan", x);
        case OP_TAN: return libm_call(&e, "tan", x);
        default: return rounding(&e, op, x);
        }
    default:
        return NULL;
    }
}

/* -- After vectorization: the target's own 2^k ---------------------------- */

/* Whether v is a constant whose every element is the integer want. */
static bool splat_is(LLVMValueRef v, long long want)
{
    if (!LLVMIsConstant(v) || LLVMGetTypeKind(LLVMTypeOf(v)) != LLVMVectorTypeKind)
        return false;
    for (unsigned i = 0; i < LLVMGetVectorSize(LLVMTypeOf(v)); i++) {
        LLVMValueRef c = LLVMGetAggregateElement(v, i);
        if (!c || !LLVMIsAConstantInt(c) || LLVMConstIntGetSExtValue(c) != want)
            return false;
    }
    return true;
}

/* v's operand i where v is an instruction of opcode op, else NULL. */
static LLVMValueRef operand_of(LLVMValueRef v, LLVMOpcode op, unsigned i)
{
    return v && LLVMIsAInstruction(v) && LLVMGetInstructionOpcode(v) == op ? LLVMGetOperand(v, i) : NULL;
}

/* Whether target is v or among its operands, depth levels down. */
static bool reaches(LLVMValueRef v, LLVMValueRef target, int depth)
{
    if (v == target)
        return true;
    if (depth == 0 || !LLVMIsAInstruction(v))
        return false;
    for (int i = 0; i < LLVMGetNumOperands(v); i++)
        if (reaches(LLVMGetOperand(v, (unsigned)i), target, depth - 1))
            return true;
    return false;
}

/* exp_core's product p 2^k1 2^(k - k1), k1 = k >> 1, widened: in is
 * bitcast(bitcast(p) + (k1 << 23)) times a factor made from k1 (LLVM
 * reshapes pow2i's sum, so only that is checked of it). Sets *p and *k. */
static bool is_exp_scaling(LLVMValueRef in, unsigned side, LLVMValueRef *p, LLVMValueRef *k)
{
    LLVMValueRef sum = operand_of(LLVMGetOperand(in, side), LLVMBitCast, 0);
    if (!operand_of(sum, LLVMAdd, 0))
        return false;
    for (unsigned i = 0; i < 2; i++) {
        LLVMValueRef bits = operand_of(LLVMGetOperand(sum, i), LLVMBitCast, 0);
        LLVMValueRef shl = LLVMGetOperand(sum, 1 - i);
        LLVMValueRef half = operand_of(shl, LLVMShl, 0), shift = operand_of(shl, LLVMShl, 1);
        LLVMValueRef whole = operand_of(half, LLVMAShr, 0), one = operand_of(half, LLVMAShr, 1);
        if (bits && LLVMTypeOf(bits) == LLVMTypeOf(in) && whole && splat_is(shift, 23) && splat_is(one, 1) &&
            reaches(LLVMGetOperand(in, 1 - side), half, 4)) {
            *p = bits;
            *k = whole;
            return true;
        }
    }
    return false;
}

/* What math_lower_target may use: AVX-512 (F), its DQ and VL extensions. */
typedef struct {
    bool f, dq, vl;
} avx512;

/* The float vector type of v with n lanes where AVX-512 has an
 * instruction of that width (16, or 8 and 4 with VL); else 0. */
static unsigned float_lanes(LLVMValueRef v, avx512 has)
{
    LLVMTypeRef t = LLVMTypeOf(v);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind || LLVMGetTypeKind(LLVMGetElementType(t)) != LLVMFloatTypeKind)
        return 0;
    unsigned n = LLVMGetVectorSize(t);
    return n == 16 || ((n == 8 || n == 4) && has.vl) ? n : 0;
}

/* A call of the x86 intrinsic "llvm.x86.avx512.mask.<what>.ps.<bits>" on
 * n-float vectors, masked by all ones: args the operands before the mask
 * (the pass-through among them); rounding (the current mode) after it at
 * 512 bits, whose forms take one. */
static LLVMValueRef x86_masked(LLVMModuleRef m, LLVMBuilderRef b, const char *what, unsigned n, LLVMValueRef *args,
                               unsigned nargs)
{
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    LLVMTypeRef mask = LLVMIntTypeInContext(ctx, n == 16 ? 16 : 8), i32 = LLVMInt32TypeInContext(ctx);
    LLVMTypeRef params[8];
    LLVMValueRef all[8];
    for (unsigned i = 0; i < nargs; i++) {
        params[i] = LLVMTypeOf(args[i]);
        all[i] = args[i];
    }
    params[nargs] = mask;
    all[nargs] = LLVMConstAllOnes(mask);
    params[nargs + 1] = i32;
    all[nargs + 1] = LLVMConstInt(i32, 4, 0); /* _MM_FROUND_CUR_DIRECTION */
    unsigned count = nargs + 1 + (n == 16);
    char name[64];
    snprintf(name, sizeof name, "llvm.x86.avx512.mask.%s.ps.%u", what, n * 32);
    LLVMTypeRef fty = LLVMFunctionType(LLVMTypeOf(args[0]), params, count, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(m, name);
    return LLVMBuildCall2(b, fty, fn ? fn : LLVMAddFunction(m, name, fty), all, count, "");
}

/* Uses of old become uses of new, and old goes. */
static void replace(LLVMValueRef old, LLVMValueRef new)
{
    LLVMReplaceAllUsesWith(old, new);
    LLVMInstructionEraseFromParent(old);
}

/* exp's NaN select, select(x unordered, x, scaled): redundant once scaled is
 * a vscalefps, which keeps the NaN exp_core carries from x. LLVM writes the
 * test x uno x as x uno 0. */
static void drop_nan_select(LLVMValueRef scaled)
{
    LLVMValueRef users[8];
    int n = 0;
    for (LLVMUseRef u = LLVMGetFirstUse(scaled); u && n < 8; u = LLVMGetNextUse(u))
        users[n++] = LLVMGetUser(u);
    for (int i = 0; i < n; i++) {
        LLVMValueRef sel = users[i], x = operand_of(sel, LLVMSelect, 1), cond = operand_of(sel, LLVMSelect, 0);
        if (x && LLVMGetOperand(sel, 2) == scaled && operand_of(cond, LLVMFCmp, 0) == x &&
            (LLVMGetOperand(cond, 1) == x || LLVMIsNull(LLVMGetOperand(cond, 1))) &&
            LLVMGetFCmpPredicate(cond) == LLVMRealUNO) {
            replace(sel, scaled);
            if (!LLVMGetFirstUse(cond))
                LLVMInstructionEraseFromParent(cond);
        }
    }
}

/* k as floats (t). Where k is exp_core's bits(shifted) - EXP_SHIFTER_BITS,
 * that is shifted - EXP_SHIFTER exactly (shifted is within 2^22 of
 * EXP_SHIFTER, where floats are integers a unit apart): exp_core's own kf,
 * which code generation merges with this, so that the integer subtraction
 * and the conversion of k go; else a conversion. */
static LLVMValueRef float_of_k(LLVMBuilderRef b, LLVMValueRef k, LLVMTypeRef t)
{
    LLVMValueRef shifted = operand_of(operand_of(k, LLVMAdd, 0), LLVMBitCast, 0);
    if (!shifted || LLVMTypeOf(shifted) != t || !splat_is(LLVMGetOperand(k, 1), -EXP_SHIFTER_BITS))
        return LLVMBuildSIToFP(b, k, t, "");
    LLVMValueRef c[16]; /* float_lanes: at most 16 */
    unsigned n = LLVMGetVectorSize(t);
    for (unsigned i = 0; i < n; i++)
        c[i] = LLVMConstReal(LLVMGetElementType(t), -EXP_SHIFTER);
    return LLVMBuildFAdd(b, shifted, LLVMConstVector(c, n), "");
}

/* The vector product in of exp_core's scaling, p 2^k, as one vscalefps,
 * which rounds once as the product did and gives inf and 0 past the range
 * as it did: eight integer and multiply operations become one scaling by
 * float_of_k's k. */
static void scale_by_scalef(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef in, avx512 has)
{
    unsigned n = float_lanes(in, has);
    LLVMValueRef p = NULL, k = NULL;
    bool found = false;
    for (unsigned side = 0; n && side < 2 && !found; side++)
        found = is_exp_scaling(in, side, &p, &k);
    if (!found)
        return;
    LLVMPositionBuilderBefore(b, in);
    LLVMValueRef args[] = {p, float_of_k(b, k, LLVMTypeOf(in)), p};
    LLVMValueRef scaled = x86_masked(m, b, "scalef", n, args, 3);
    replace(in, scaled);
    drop_nan_select(scaled);
}

/* llvm.maximum or llvm.minimum of n floats (1 and -1; else 0). */
static int minmax_of(LLVMValueRef in)
{
    LLVMValueRef callee = LLVMIsACallInst(in) ? LLVMGetCalledValue(in) : NULL;
    size_t len = 0;
    const char *name = callee ? LLVMGetValueName2(callee, &len) : "";
    return !strncmp(name, "llvm.maximum.v", 14) ? 1 : !strncmp(name, "llvm.minimum.v", 14) ? -1 : 0;
}

/* llvm.maximum (minimum) of float vectors as vrangeps, which orders -0
 * below +0 as they do but gives the other operand for a quiet NaN, and
 * where either operand is NaN their sum: three instructions for the six
 * LLVM 19 makes (softmax's row maximum). */
static void minmax_by_range(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef in, int which, avx512 has)
{
    unsigned n = has.dq ? float_lanes(in, has) : 0;
    if (!n)
        return;
    LLVMValueRef a = LLVMGetOperand(in, 0), c = LLVMGetOperand(in, 1);
    LLVMPositionBuilderBefore(b, in);
    /* imm 5: the maximum, 4: the minimum, each with its own sign. */
    LLVMValueRef imm = LLVMConstInt(LLVMInt32TypeInContext(LLVMGetModuleContext(m)), which > 0 ? 5 : 4, 0);
    LLVMValueRef args[] = {a, c, imm, LLVMGetUndef(LLVMTypeOf(in))};
    LLVMValueRef range = x86_masked(m, b, "range", n, args, 4);
    LLVMValueRef nan = LLVMBuildFCmp(b, LLVMRealUNO, a, c, "");
    replace(in, LLVMBuildSelect(b, nan, LLVMBuildFAdd(b, a, c, ""), range, ""));
}

void math_lower_target(LLVMModuleRef m, LLVMTargetMachineRef tm)
{
    char *features = LLVMGetTargetMachineFeatureString(tm);
    avx512 has = {llvm_feature_listed(features, "+avx512f"), llvm_feature_listed(features, "+avx512dq"),
                  llvm_feature_listed(features, "+avx512vl")};
    LLVMDisposeMessage(features);
    if (!has.f)
        return;
    /* Listed first: a rewrite erases instructions after the one it rewrites. */
    size_t n = 0, cap = 0;
    LLVMValueRef *found = NULL;
    for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f))
        for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb; bb = LLVMGetNextBasicBlock(bb))
            for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in; in = LLVMGetNextInstruction(in)) {
                if (LLVMGetInstructionOpcode(in) != LLVMFMul && !minmax_of(in))
                    continue;
                if (n == cap) {
                    LLVMValueRef *grown = realloc(found, (cap = cap ? 2 * cap : 64) * sizeof *found);
                    if (!grown) {
                        free(found);
                        return; /* the code as it is is right, only slower */
                    }
                    found = grown;
                }
                found[n++] = in;
            }
    LLVMBuilderRef b = LLVMCreateBuilderInContext(LLVMGetModuleContext(m));
    for (size_t i = 0; i < n; i++)
        if (minmax_of(found[i]))
            minmax_by_range(m, b, found[i], minmax_of(found[i]), has);
        else
            scale_by_scalef(m, b, found[i], has);
    free(found);
    LLVMDisposeBuilder(b);
}
