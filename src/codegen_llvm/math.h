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

/* The largest error in ulps of each f32 approximation over a dense sweep of
 * the float range, as measured by tests/test_llvm_math.c; the test asserts it. */
#define MATH_F32_MAX_ULP_EXP 2
#define MATH_F32_MAX_ULP_LOG 2
#define MATH_F32_MAX_ULP_TANH 4
#define MATH_F32_MAX_ULP_SIGMOID 4
#define MATH_F32_MAX_ULP_ERF 8

#endif
