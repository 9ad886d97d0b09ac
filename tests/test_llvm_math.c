/* The transcendental functions of src/codegen_llvm/math.c, JIT-compiled in a
 * loop: each f32 approximation measured in ulps against libm over a dense
 * sweep of the float range and its thresholds, the f64 and sin/cos/tan libm
 * calls checked, and the f32 loops shown to vectorize. */
#include "test_common.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen_llvm/math.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* The sweep takes every SWEEP_STRIDE-th float bit pattern (an odd stride, so
 * every low mantissa bit varies): 2^32 / 251, about 17 million inputs, or
 * 65 thousand under valgrind (and a quarter of the 17 million under
 * AddressSanitizer). -DSWEEP_STRIDE=1u makes it exhaustive (about
 * 80 s a function: run with CK_TIMEOUT_MULTIPLIER=10). Around each
 * threshold it also takes the WINDOW patterns either side. */
#ifndef SWEEP_STRIDE
#define SWEEP_STRIDE 251u
#endif
#define SWEEP_STRIDE_VALGRIND 65521u
#define WINDOW 4096
#define WINDOW_VALGRIND 256
#define BLOCK (1 << 20)

/* -- Building and running a loop ---------------------------------------- */

/* The ops' names, without linking the IR module for its table. */
static const char *op_name(ir_op op)
{
    switch (op) {
    case OP_EXP: return "exp";
    case OP_LOG: return "log";
    case OP_TANH: return "tanh";
    case OP_SIGMOID: return "sigmoid";
    case OP_ERF: return "erf";
    case OP_SIN: return "sin";
    case OP_COS: return "cos";
    case OP_LOG1P: return "log1p";
    case OP_EXPM1: return "expm1";
    case OP_LOG2: return "log2";
    case OP_ATAN: return "atan";
    case OP_TAN: return "tan";
    case OP_FLOOR: return "floor";
    case OP_ROUND: return "round";
    default: return "?";
    }
}

/* f(in, out, n): out[i] = op(in[i]) for i < n, in the type t. */
typedef void (*loop_fn)(const void *in, void *out, int64_t n);

/* Aborts the test with LLVM's message if err is set; takes ownership of err. */
static void check_llvm(LLVMErrorRef err, const char *what)
{
    if (!err)
        return;
    char buf[512];
    char *msg = LLVMGetErrorMessage(err);
    snprintf(buf, sizeof buf, "%s", msg);
    LLVMDisposeErrorMessage(msg);
    ck_abort_msg("%s: %s", what, buf);
}

/* Adds to m the function f applying op to each element; false if math_emit
 * refuses op. */
static bool build_loop(LLVMModuleRef m, ir_op op, LLVMTypeRef t)
{
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    LLVMTypeRef ptr = LLVMPointerTypeInContext(ctx, 0);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
    LLVMTypeRef params[] = {ptr, ptr, i64};
    LLVMValueRef fn = LLVMAddFunction(m, "f", LLVMFunctionType(LLVMVoidTypeInContext(ctx), params, 3, 0));
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    LLVMAddAttributeAtIndex(fn, 1, LLVMCreateEnumAttribute(ctx, noalias, 0));
    LLVMAddAttributeAtIndex(fn, 2, LLVMCreateEnumAttribute(ctx, noalias, 0));
    LLVMValueRef in = LLVMGetParam(fn, 0), out = LLVMGetParam(fn, 1), n = LLVMGetParam(fn, 2);

    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(ctx, fn, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(ctx, fn, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(ctx, fn, "done");
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMValueRef zero = LLVMConstInt(i64, 0, 0);

    LLVMPositionBuilderAtEnd(b, entry);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGT, n, zero, ""), loop, done);

    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef i = LLVMBuildPhi(b, i64, "i");
    LLVMValueRef x = LLVMBuildLoad2(b, t, LLVMBuildGEP2(b, t, in, &i, 1, ""), "x");
    LLVMValueRef y = math_emit(m, b, op, x);
    if (y) {
        LLVMBuildStore(b, y, LLVMBuildGEP2(b, t, out, &i, 1, ""));
        LLVMValueRef next = LLVMBuildNSWAdd(b, i, LLVMConstInt(i64, 1, 0), "");
        LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, next, n, ""), loop, done);
        LLVMAddIncoming(i, (LLVMValueRef[]){zero, next}, (LLVMBasicBlockRef[]){entry, loop}, 2);
        LLVMPositionBuilderAtEnd(b, done);
        LLVMBuildRetVoid(b);
    }
    LLVMDisposeBuilder(b);
    if (!y)
        return false;

    char *msg = NULL;
    bool broken = LLVMVerifyModule(m, LLVMReturnStatusAction, &msg);
    ck_assert_msg(!broken, "invalid module: %s", msg);
    LLVMDisposeMessage(msg);
    return true;
}

/* Runs default<O2> on m for the host CPU and its features (AVX2 or
 * AVX-512 here), then math_lower_target, as kiln's code generator does. */
static void optimize(LLVMModuleRef m)
{
    char *triple = LLVMGetDefaultTargetTriple();
    char *cpu = LLVMGetHostCPUName();
    char *features = LLVMGetHostCPUFeatures();
    LLVMTargetRef target;
    char *msg = NULL;
    ck_assert_msg(!LLVMGetTargetFromTriple(triple, &target, &msg), "no target: %s", msg);
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features,
                                                      LLVMCodeGenLevelDefault, LLVMRelocDefault,
                                                      LLVMCodeModelJITDefault);
    LLVMSetTarget(m, triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(tm);
    LLVMSetModuleDataLayout(m, layout);
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    LLVMErrorRef err = LLVMRunPasses(m, "default<O2>", tm, options);
    math_lower_target(m, tm);
    LLVMDisposePassBuilderOptions(options);
    LLVMDisposeTargetData(layout);
    LLVMDisposeTargetMachine(tm);
    LLVMDisposeMessage(features);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(triple);
    check_llvm(err, "running default<O2>");
}

/* A JIT holding one optimized loop. */
typedef struct {
    LLVMOrcLLJITRef jit;
    loop_fn fn;
} kernel;

static kernel kernel_new(ir_op op, bool f64)
{
    static bool initialized;
    if (!initialized) {
        LLVMInitializeNativeTarget();
        LLVMInitializeNativeAsmPrinter();
        initialized = true;
    }
    kernel k = {0};
    check_llvm(LLVMOrcCreateLLJIT(&k.jit, NULL), "creating the JIT");
    /* libm's expf, sin, ... are found in this process. */
    LLVMOrcDefinitionGeneratorRef gen;
    check_llvm(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                   &gen, LLVMOrcLLJITGetGlobalPrefix(k.jit), NULL, NULL),
               "searching the process");
    LLVMOrcJITDylibRef dylib = LLVMOrcLLJITGetMainJITDylib(k.jit);
    LLVMOrcJITDylibAddGenerator(dylib, gen);

    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMContextRef ctx = LLVMOrcThreadSafeContextGetContext(tsc);
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("math", ctx);
    ck_assert(build_loop(m, op, f64 ? LLVMDoubleTypeInContext(ctx) : LLVMFloatTypeInContext(ctx)));
    optimize(m);
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, tsc);
    LLVMOrcDisposeThreadSafeContext(tsc);
    check_llvm(LLVMOrcLLJITAddLLVMIRModule(k.jit, dylib, tsm), "adding the module");

    LLVMOrcExecutorAddress addr = 0;
    check_llvm(LLVMOrcLLJITLookup(k.jit, &addr, "f"), "looking up f");
    k.fn = (loop_fn)(uintptr_t)addr;
    return k;
}

static void kernel_free(kernel *k)
{
    check_llvm(LLVMOrcDisposeLLJIT(k->jit), "disposing the JIT");
}

/* -- Measuring ulps ----------------------------------------------------- */

typedef struct {
    double (*ref)(double);
    long count;
    double max_ulp;
    float max_at, max_got;
    double max_want;
    long failures;
    float fail_at, fail_got;
    double fail_want;
} tally;

static void measure(kernel *k, tally *t, const float *in, float *out, size_t n)
{
    k->fn(in, out, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        double want = t->ref(in[i]);
        double err = test_ulp_error(out[i], want);
        if (isinf(err)) {
            if (t->failures++ == 0) {
                t->fail_at = in[i];
                t->fail_got = out[i];
                t->fail_want = want;
            }
        } else if (err > t->max_ulp) {
            t->max_ulp = err;
            t->max_at = in[i];
            t->max_got = out[i];
            t->max_want = want;
        }
    }
    t->count += (long)n;
}

/* Values every function must get right. */
static const uint32_t special_bits[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* +-0, +-inf */
    0x7fc00000, 0xffc00000, 0x7f800001, 0x7fffffff, /* quiet, negative, signalling NaN */
    0x00000001, 0x80000001, 0x007fffff, 0x00800000, /* subnormals, FLT_MIN */
    0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000, /* +-FLT_MAX, +-1 */
};

/* Sweeps the float range, the specials, and WINDOW patterns either side of
 * each centre (2^4 WINDOW either side of the first, a function's most
 * delicate point); asserts no special value is wrong and the largest error
 * is at most max_ulp. */
static void sweep(ir_op op, double (*ref)(double), const char *name, double max_ulp,
                  const float *centres, int ncentres)
{
    bool valgrind = UNDER_VALGRIND();
    uint32_t stride = valgrind ? SWEEP_STRIDE_VALGRIND : SANITIZED ? 4 * SWEEP_STRIDE + 1 : SWEEP_STRIDE;
    int window = valgrind ? WINDOW_VALGRIND : WINDOW;
    kernel k = kernel_new(op, false);
    tally t = {.ref = ref};
    float *in = malloc(BLOCK * sizeof *in), *out = malloc(BLOCK * sizeof *out);
    ck_assert(in && out);

    size_t n = 0;
    for (uint64_t u = 0; u <= UINT32_MAX; u += stride) {
        in[n++] = test_f32_from_bits((uint32_t)u);
        if (n == BLOCK) {
            measure(&k, &t, in, out, n);
            n = 0;
        }
    }
    measure(&k, &t, in, out, n);

    n = 0;
    for (int i = 0; i < COUNT(special_bits); i++)
        in[n++] = test_f32_from_bits(special_bits[i]);
    measure(&k, &t, in, out, n);
    for (int c = 0; c < ncentres; c++) {
        int w = c == 0 ? window << 4 : window;
        n = 0;
        for (int d = -w; d <= w; d++)
            in[n++] = test_f32_from_bits(test_f32_bits(centres[c]) + (uint32_t)d);
        measure(&k, &t, in, out, n);
    }

    printf("%-8s max %.3f ulp at x = %.9g (%a): got %.9g, want %.9g; %ld inputs\n", name,
           t.max_ulp, t.max_at, t.max_at, t.max_got, t.max_want, t.count);
    free(in);
    free(out);
    kernel_free(&k);
    ck_assert_msg(t.failures == 0, "%s: %ld wrong special values, first %s(%a) = %a, want %a",
                  name, t.failures, name, t.fail_at, t.fail_got, t.fail_want);
    ck_assert_msg(t.max_ulp <= max_ulp, "%s: %.3f ulp at %a, over the %g of math.h", name,
                  t.max_ulp, t.max_at, max_ulp);
}

/* -- f32 approximations ------------------------------------------------- */

static double ref_sigmoid(double x)
{
    return 1 / (1 + exp(-x));
}

START_TEST(f32_exp)
{
    /* Overflow, the least normal and subnormal results, rounding to 0, the
     * steps of the reduction at +-ln2/2, tiny |x|. */
    const float c[] = {88.7228394f, -87.3365479f, -103.278931f, -103.972076f, 0.346573591f,
                       -0.346573591f, 1e-7f, -1e-7f, 0x1p-149f, 20.0f};
    sweep(OP_EXP, exp, "exp", MATH_F32_MAX_ULP_EXP, c, COUNT(c));
}
END_TEST

START_TEST(f32_log)
{
    /* Near 1 where log is small, the mantissa split at sqrt(1/2) and
     * sqrt(2), the normal/subnormal boundary, the least subnormals, FLT_MAX. */
    const float c[] = {1.0f, 0.707106769f, 1.41421354f, 0x1p-126f, 0x1p-149f, FLT_MAX, 2.0f,
                       0.5f, 1e-30f, -1.0f};
    sweep(OP_LOG, log, "log", MATH_F32_MAX_ULP_LOG, c, COUNT(c));
}
END_TEST

START_TEST(f32_tanh)
{
    /* Where the rational's roundings add up most (4.1, 7.0), the clamp at
     * 9.02, saturation, tiny |x|. */
    const float c[] = {4.11470413f, -4.11470413f, 7.01644f, 9.02f, -9.02f, 0x1p-12f, -0x1p-12f,
                       0x1p-149f, -0x1p-149f, 0.3f, 1.0f};
    sweep(OP_TANH, tanh, "tanh", MATH_F32_MAX_ULP_TANH, c, COUNT(c));
}
END_TEST

/* The quotient may pass 1 by an ulp or two before its clamp: every float
 * from 4 to 16 (where tanh is within 2^-11 of 1; every 1023rd under
 * valgrind, every 7th under AddressSanitizer), either sign, gives a value in [-1, 1], and the two signs agree. */
START_TEST(f32_tanh_bounded_and_odd)
{
    kernel k = kernel_new(OP_TANH, false);
    float *in = malloc(BLOCK * sizeof *in), *out = malloc(BLOCK * sizeof *out);
    ck_assert(in && out);
    uint32_t step = UNDER_VALGRIND() ? SWEEP_STRIDE_VALGRIND / 64 : SANITIZED ? 7 : 1;
    for (uint32_t u = test_f32_bits(4.0f); u < test_f32_bits(16.0f); u += BLOCK / 2 * step) {
        int n = 0;
        for (uint32_t v = u; v < u + BLOCK / 2 * step && v < test_f32_bits(16.0f); v += step) {
            in[n++] = test_f32_from_bits(v);
            in[n++] = -test_f32_from_bits(v);
        }
        k.fn(in, out, n);
        int bad = 0; /* Check's assertions are a system call each: one a block */
        while (bad < n && out[bad] <= 1.0f && out[bad + 1] >= -1.0f && out[bad + 1] == -out[bad])
            bad += 2;
        if (bad < n)
            ck_abort_msg("tanh(+-%a) = %a, %a: out of [-1, 1] or not odd", in[bad], out[bad], out[bad + 1]);
    }
    free(in);
    free(out);
    kernel_free(&k);
}
END_TEST

START_TEST(f32_sigmoid)
{
    /* Around 0, where 1 + exp(-x) stops mattering, the tiny and subnormal
     * results near exp's thresholds, and saturation at 1. */
    const float c[] = {0x1p-149f, -0x1p-149f, -16.6355324f, 16.6355324f, -87.3365479f,
                       -88.7228394f, -103.278931f, -103.972076f, 0.5f, -0.5f};
    sweep(OP_SIGMOID, ref_sigmoid, "sigmoid", MATH_F32_MAX_ULP_SIGMOID, c, COUNT(c));
}
END_TEST

START_TEST(f32_erf)
{
    /* The switch between the two formulas, saturation at 1, tiny |x|, the
     * centre of the tail's fit. */
    const float c[] = {0.875f, -0.875f, 3.9f, -3.9f, 4.0f, 0x1p-149f, -0x1p-149f, 1e-3f,
                       2.375f, 1.5f};
    sweep(OP_ERF, erf, "erf", MATH_F32_MAX_ULP_ERF, c, COUNT(c));
}
END_TEST

START_TEST(f32_log1p)
{
    /* Tiny |x| where 1 + x rounds to 1, the pole at -1, the reduction's
     * steps, large x where 1 + x is x. */
    const float c[] = {0x1p-24f, -0x1p-25f, -1.0f, -0.999f, 0.41421354f, -0.29289323f, 1e-3f, 0x1p24f, 1e30f,
                       -0.5f};
    sweep(OP_LOG1P, log1p, "log1p", MATH_F32_MAX_ULP_LOG1P, c, COUNT(c));
}
END_TEST

START_TEST(f32_expm1)
{
    /* Tiny |x|, where exp(x) - 1 cancels, overflow, and saturation at -1. */
    const float c[] = {0x1p-24f, -0x1p-24f, 1e-3f, -1e-3f, 0.35f, -0.35f, 88.7228394f, -17.32868f, -88.0f, 1.0f};
    sweep(OP_EXPM1, expm1, "expm1", MATH_F32_MAX_ULP_EXPM1, c, COUNT(c));
}
END_TEST

START_TEST(f32_log2)
{
    /* Near 1, powers of two (exact), the mantissa split, subnormals. */
    const float c[] = {1.0f, 2.0f, 0.5f, 0.707106769f, 1.41421354f, 0x1p-126f, 0x1p-149f, FLT_MAX, 8.0f, 3.0f};
    sweep(OP_LOG2, log2, "log2", MATH_F32_MAX_ULP_LOG2, c, COUNT(c));
}
END_TEST

START_TEST(f32_atan)
{
    /* The reduction's thresholds tan(pi/8) and tan(3pi/8), tiny and huge |x|. */
    const float c[] = {0.41421356f, -0.41421356f, 2.41421356f, -2.41421356f, 1.0f, 0x1p-20f, 1e10f, 0.1f, 5.0f,
                       -1.0f};
    sweep(OP_ATAN, atan, "atan", MATH_F32_MAX_ULP_ATAN, c, COUNT(c));
}
END_TEST

/* Powers of two have exact base-2 logs. */
START_TEST(f32_log2_exact_on_powers)
{
    kernel k = kernel_new(OP_LOG2, false);
    float in[277], out[277];
    for (int e = -149; e <= 127; e++)
        in[e + 149] = ldexpf(1.0f, e);
    k.fn(in, out, 277);
    kernel_free(&k);
    for (int e = -149; e <= 127; e++)
        ck_assert_msg(out[e + 149] == (float)e, "log2(2^%d) = %a", e, out[e + 149]);
}
END_TEST

/* -- libm calls --------------------------------------------------------- */

/* About four hundred values across [-20, 20], and the specials. */
static int libm_inputs(double *x)
{
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-300, -1e-300,
                                      4.9e-324, 1e300, -1e300, 709.0, 710.0, -745.0, -720.0};
    int n = 0;
    for (int i = -200; i <= 200; i++)
        x[n++] = i * 0.1 + 0.0123;
    for (int i = 0; i < COUNT(specials); i++)
        x[n++] = specials[i];
    return n;
}

static bool same(double got, double want)
{
    return (isnan(got) && isnan(want)) || memcmp(&got, &want, sizeof got) == 0;
}

START_TEST(f64_libm)
{
    static const struct {
        ir_op op;
        double (*fn)(double);
    } cases[] = {
        {OP_EXP, exp}, {OP_LOG, log}, {OP_TANH, tanh}, {OP_ERF, erf}, {OP_SIN, sin}, {OP_COS, cos},
        {OP_LOG1P, log1p}, {OP_EXPM1, expm1}, {OP_LOG2, log2}, {OP_TAN, tan}, {OP_ATAN, atan},
    };
    double x[512], y[512];
    int n = libm_inputs(x);
    for (int c = 0; c < COUNT(cases); c++) {
        kernel k = kernel_new(cases[c].op, true);
        k.fn(x, y, n);
        kernel_free(&k);
        for (int i = 0; i < n; i++)
            ck_assert_msg(same(y[i], cases[c].fn(x[i])), "%s(%a) = %a, libm says %a",
                          op_name(cases[c].op), x[i], y[i], cases[c].fn(x[i]));
    }
}
END_TEST

/* The error of got in ulps of the double nearest want. */
static double ulp_error_f64(double got, long double want)
{
    double wantd = (double)want;
    if (isnan(got) || isnan(wantd))
        return isnan(got) && isnan(wantd) ? 0 : INFINITY;
    if (got == wantd)
        return 0;
    int e;
    frexp(wantd, &e);
    return (double)(fabsl((long double)got - want) / ldexpl(1.0L, (e < -1021 ? -1021 : e) - 53));
}

START_TEST(f64_sigmoid)
{
    double x[512], y[512];
    int n = libm_inputs(x);
    kernel k = kernel_new(OP_SIGMOID, true);
    k.fn(x, y, n);
    kernel_free(&k);
    /* Valgrind computes long double in double precision: the reference
     * itself is then off by an ulp or so. */
    double tolerance = UNDER_VALGRIND() ? 3 : 2, worst = 0;
    for (int i = 0; i < n; i++) {
        long double want = 1.0L / (1.0L + expl(-(long double)x[i]));
        double err = ulp_error_f64(y[i], want);
        ck_assert_msg(err <= tolerance, "sigmoid(%a) = %a, want %La (%g ulp)", x[i], y[i], want,
                      err);
        worst = err > worst ? err : worst;
    }
    printf("sigmoid f64: max %.3f ulp\n", worst);
}
END_TEST

START_TEST(f32_sin_cos)
{
    float x[512], y[512];
    int n = 0;
    for (int i = -200; i <= 200; i++)
        x[n++] = (float)i * 0.1f + 0.0123f;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, 0x1p-149f};
    for (int i = 0; i < COUNT(specials); i++)
        x[n++] = specials[i];
    static const ir_op ops[] = {OP_SIN, OP_COS, OP_TAN};
    float (*const fns[])(float) = {sinf, cosf, tanf};
    for (int c = 0; c < COUNT(ops); c++) {
        kernel k = kernel_new(ops[c], false);
        k.fn(x, y, n);
        kernel_free(&k);
        for (int i = 0; i < n; i++) {
            float want = fns[c](x[i]);
            ck_assert_msg((isnan(y[i]) && isnan(want)) || test_f32_bits(y[i]) == test_f32_bits(want),
                          "%s(%a) = %a, libm says %a", op_name(ops[c]), x[i], y[i], want);
        }
    }
}
END_TEST

START_TEST(other_ops_refused)
{
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("math", ctx);
    ck_assert(!build_loop(m, OP_ADD, LLVMFloatTypeInContext(ctx)));
    LLVMDisposeModule(m);
    m = LLVMModuleCreateWithNameInContext("math", ctx);
    ck_assert(!build_loop(m, OP_EXP, LLVMHalfTypeInContext(ctx)));
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
}
END_TEST

/* -- Vectorization ------------------------------------------------------ */

/* The widest <N x float> in ir, or 0. */
static int widest_float_vector(const char *ir)
{
    int widest = 0;
    for (const char *p = strstr(ir, " x float>"); p; p = strstr(p + 1, " x float>")) {
        const char *q = p;
        while (q > ir && q[-1] >= '0' && q[-1] <= '9')
            q--;
        if (q > ir && q[-1] == '<' && atoi(q) > widest)
            widest = atoi(q);
    }
    return widest;
}

START_TEST(f32_vectorizes)
{
    static const ir_op ops[] = {OP_EXP, OP_LOG, OP_TANH, OP_SIGMOID, OP_ERF, OP_LOG1P, OP_EXPM1, OP_LOG2, OP_ATAN,
                                OP_FLOOR, OP_ROUND};
    LLVMInitializeNativeTarget();
    for (int i = 0; i < COUNT(ops); i++) {
        LLVMContextRef ctx = LLVMContextCreate();
        LLVMModuleRef m = LLVMModuleCreateWithNameInContext("math", ctx);
        ck_assert(build_loop(m, ops[i], LLVMFloatTypeInContext(ctx)));
        optimize(m);
        /* Nothing but intrinsics is called: a call would stop the widening. */
        for (LLVMValueRef fn = LLVMGetFirstFunction(m); fn; fn = LLVMGetNextFunction(fn)) {
            size_t len;
            const char *name = LLVMGetValueName2(fn, &len);
            ck_assert_msg(!LLVMIsDeclaration(fn) || strncmp(name, "llvm.", 5) == 0,
                          "%s calls %s", op_name(ops[i]), name);
        }
        char *ir = LLVMPrintModuleToString(m);
        int width = widest_float_vector(ir);
        LLVMDisposeMessage(ir);
        LLVMDisposeModule(m);
        LLVMContextDispose(ctx);
        printf("%-8s vectorized as <%d x float>\n", op_name(ops[i]), width);
        ck_assert_msg(width >= 4, "the %s loop did not vectorize", op_name(ops[i]));
    }
}
END_TEST

/* On an AVX-512 host the widened exp scales by vscalefps and needs no NaN
 * select nor a conversion of k (math_lower_target); f32_exp measures what
 * it computes. */
START_TEST(f32_exp_scales_by_vscalefps)
{
    if (!__builtin_cpu_supports("avx512f")) {
        printf("skipped: this host has no AVX-512\n");
        return;
    }
    LLVMInitializeNativeTarget();
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("math", ctx);
    ck_assert(build_loop(m, OP_EXP, LLVMFloatTypeInContext(ctx)));
    optimize(m);
    char *ir = LLVMPrintModuleToString(m);
    bool scalef = strstr(ir, "@llvm.x86.avx512.mask.scalef.ps.512(") != NULL;
    bool nan_select = strstr(ir, "fcmp uno <16 x float>") != NULL;
    bool converts = strstr(ir, "sitofp <16 x i32>") != NULL;
    LLVMDisposeMessage(ir);
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    ck_assert_msg(scalef, "the widened exp does not scale by vscalefps");
    ck_assert_msg(!nan_select, "the widened exp still selects NaN");
    ck_assert_msg(!converts, "the widened exp converts k to float where it has it as a float");
}
END_TEST

static Suite *llvm_math_suite(void)
{
    Suite *s = suite_create("llvm_math");
    TCase *tc = tcase_create("f32");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, f32_exp);
    tcase_add_test(tc, f32_log);
    tcase_add_test(tc, f32_tanh);
    tcase_add_test(tc, f32_tanh_bounded_and_odd);
    tcase_add_test(tc, f32_sigmoid);
    tcase_add_test(tc, f32_erf);
    tcase_add_test(tc, f32_log1p);
    tcase_add_test(tc, f32_expm1);
    tcase_add_test(tc, f32_log2);
    tcase_add_test(tc, f32_log2_exact_on_powers);
    tcase_add_test(tc, f32_atan);
    tcase_add_test(tc, f32_vectorizes);
    tcase_add_test(tc, f32_exp_scales_by_vscalefps);
    tcase_add_test(tc, f32_sin_cos);
    suite_add_tcase(s, tc);
    tc = tcase_create("f64");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, f64_libm);
    tcase_add_test(tc, f64_sigmoid);
    tcase_add_test(tc, other_ops_refused);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(llvm_math_suite)
