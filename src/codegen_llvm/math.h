/* Transcendental functions as inline LLVM IR that the loop vectorizer widens:
 * polynomial approximations for f32, libm calls for f64. Private to
 * src/codegen_llvm. */
#ifndef KILN_CODEGEN_LLVM_MATH_H
#define KILN_CODEGEN_LLVM_MATH_H

#include <llvm-c/Core.h>

#include "ir/ir.h"

/* Emits op (OP_EXP, OP_LOG, OP_TANH, OP_SIGMOID, OP_ERF, OP_SIN, OP_COS) of the
 * scalar x (float or double) at the builder's position; declares in m any
 * libm function it calls. Returns the result, or NULL for another op. */
LLVMValueRef math_emit(LLVMModuleRef m, LLVMBuilderRef b, ir_op op, LLVMValueRef x);

/* Bounds on the error in ulps of each f32 approximation, which
 * tests/test_llvm_math.c asserts over its sweep of the float range. Built
 * with -DSWEEP_STRIDE=1u it checks all 2^32 floats; that measured exp 0.990,
 * log 0.840, tanh 5.177, sigmoid 1.967, erf 1.179 with the polynomials fused
 * into FMAs (an AVX2 host), and tanh 6.039, erf 1.260 without. */
#define MATH_F32_MAX_ULP_EXP 1
#define MATH_F32_MAX_ULP_LOG 1
#define MATH_F32_MAX_ULP_TANH 6.5
#define MATH_F32_MAX_ULP_SIGMOID 2
#define MATH_F32_MAX_ULP_ERF 2

#endif
