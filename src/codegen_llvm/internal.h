/* What the files of src/codegen_llvm share. */
#ifndef KILN_CODEGEN_LLVM_INTERNAL_H
#define KILN_CODEGEN_LLVM_INTERNAL_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "codegen_llvm/llvm.h"

/* Whether the comma-separated feature list ("+avx2,-avx512f,...") holds
 * entry ("+avx512f") whole. */
bool llvm_feature_listed(const char *list, const char *entry);
/* Adds the functions of kernel k to module: name(buffers, begin, end) and its
 * body (two when its stores stream). 0, or -1 with the reason in err (an op
 * this backend lacks). */
int codegen_kernel(LLVMModuleRef module, const kx_kernel *k, const char *name, bool stream_stores, char *err,
                   size_t err_size);
/* Adds to module the epilogue of product kernel k (elementwise: no
 * reductions), which gemm_codegen.c calls on each final register tile:
 * "<symbol>.epilogue"(ptr tile, ptr gemm_tile), the tile's product values at
 * tile[r * ld + j]; and "<symbol>" GEMM_EPILOGUE_PREFETCH with the same
 * parameters, which prefetches the lines that the epilogue will read from
 * memory or write in the rows of the tile and of the tile below it. The
 * epilogue, or NULL with the reason in err. */
LLVMValueRef codegen_epilogue(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int ld, char *err,
                              size_t err_size);
/* Adds to module the prologue of product kernel k (k->prologue), which
 * gemm.c runs in place of pack_a: "<symbol>" GEMM_PROLOGUE (ptr dst, i64
 * row0, i64 rows, i64 col0, i64 cols, ptr buffers, ptr symbols) packs that block of the
 * product's left operand as it computes it. 0, or -1 with the reason in err. */
int codegen_prologue(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int mr, char *err,
                     size_t err_size);
/* Adds to module attention kernel k's scores (its one store's expression):
 * "<symbol>" GEMM_SCORES, gemm.h's attention_scores_fn, over a block of the
 * product at s[r * ld + j]. 0, or -1 with the reason in err. */
int codegen_scores(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int ld, char *err, size_t err_size);
/* A counted loop of the generated code, for (index = from; index < to;
 * index++) over i64s: llvm_loop_begin leaves the builder in its body,
 * llvm_loop_end closes it and leaves the builder after it. */
typedef struct {
    LLVMBasicBlockRef body, exit;
    LLVMValueRef index;
} llvm_loop;
llvm_loop llvm_loop_begin(LLVMBuilderRef b, LLVMValueRef from, LLVMValueRef to, const char *name);
void llvm_loop_end(LLVMBuilderRef b, llvm_loop *l, LLVMValueRef to);
/* Adds to module the rows of depthwise convolution c of dt (f32, f64):
 * "<symbol>" GEMM_DEPTHWISE, gemm.h's depthwise step. */
void depthwise_codegen(LLVMModuleRef module, const char *symbol, kiln_dtype dt, const kx_conv *c);
/* A new empty module in ctx for the target machine tm (its triple and data
 * layout). */
LLVMModuleRef llvm_module_for(LLVMContextRef ctx, LLVMTargetMachineRef tm);
/* The LLVM target a kx_target of this backend belongs to. */
const llvm_target *llvm_target_from(const kx_target *t);
/* After optimisation: makes a streaming kernel's widened output stores that
 * LLVM knows to be aligned non-temporal (codegen.c says how it finds them). */
void codegen_stream_stores(LLVMModuleRef module);

#endif
