/* Transcendental functions as inline LLVM IR that the loop vectorizer widens:
 * polynomial approximations for f32, libm calls for f64. Private to
 * src/codegen_llvm. */
#ifndef KILN_CODEGEN_LLVM_MATH_H
#define KILN_CODEGEN_LLVM_MATH_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "ir/ir.h"

/* Emits op (OP_EXP, OP_LOG, OP_TANH, OP_SIGMOID, OP_ERF, OP_SIN, OP_COS,
 * OP_LOG1P, OP_EXPM1, OP_LOG2, OP_TAN, OP_ATAN, and the rounding ops OP_FLOOR,
 * OP_CEIL, OP_ROUND, OP_TRUNC) of the scalar x (float or double) at the
 * builder's position; declares in m any libm function it calls. Returns the
 * result, or NULL for another op. */
LLVMValueRef math_emit(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef x);
/* exp(x) as math_emit gives it, for an x known to be at most 0 or NaN
 * (softmax's x - max x): an f32 exp without its clamp above. */
LLVMValueRef math_emit_exp_nonpositive(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x);
/* The same for binary op (OP_ATAN2, OP_REMAINDER, OP_FLOOR_DIVIDE) of floats
 * or doubles x and y. */
LLVMValueRef math_emit_binary(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef x, LLVMValueRef y);
/* op of integers a[0] (and a[1]) of kiln's eager semantics: the rounding
 * ops (which keep integers), OP_REMAINDER and OP_FLOOR_DIVIDE; NULL for
 * another op or for bools. */
LLVMValueRef math_emit_int(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef *a);

/* After optimisation, for a target with AVX-512 (named in its feature list):
 * the widened scaling of exp_core (p 2^k from the exponent bits, eight
 * operations) becomes vscalefps, with the same results. The scaling stays
 * integer arithmetic until then because LLVM 19 neither widens llvm.ldexp
 * cheaply (its cost model keeps such a loop scalar) nor has a vector form
 * of an x86 intrinsic. */
void math_lower_target(LLVMModuleRef m, LLVMTargetMachineRef tm);

/* Bounds on the error in ulps of each f32 approximation, which
 * tests/test_llvm_math.c asserts over its sweep of the float range. Built
 * with -DSWEEP_STRIDE=1u it checks all 2^32 floats; that measured exp 0.977,
 * log 0.840, tanh 5.177, sigmoid 1.967, erf 1.179 with the polynomials fused
 * into FMAs (an AVX2 host), and tanh 6.039, erf 1.260 without. */
#define MATH_F32_MAX_ULP_EXP 1
#define MATH_F32_MAX_ULP_LOG 1
#define MATH_F32_MAX_ULP_TANH 6.5
#define MATH_F32_MAX_ULP_SIGMOID 2
#define MATH_F32_MAX_ULP_ERF 2
#define MATH_F32_MAX_ULP_LOG1P 3
#define MATH_F32_MAX_ULP_EXPM1 3
#define MATH_F32_MAX_ULP_LOG2 3
#define MATH_F32_MAX_ULP_ATAN 3

#endif
