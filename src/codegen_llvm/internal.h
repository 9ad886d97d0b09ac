/* What the files of src/codegen_llvm share. */
#ifndef KILN_CODEGEN_LLVM_INTERNAL_H
#define KILN_CODEGEN_LLVM_INTERNAL_H

#include <llvm-c/Core.h>

#include "codegen_llvm/llvm.h"

/* Adds the functions of kernel k to module: name(buffers, begin, end) and its
 * body (two when its stores stream). 0, or -1 with the reason in err (an op
 * this backend lacks). */
int codegen_kernel(LLVMModuleRef module, const kx_kernel *k, const char *name, bool stream_stores, char *err,
                   size_t err_size);
/* The LLVM target a kx_target of this backend belongs to. */
const llvm_target *llvm_target_from(const kx_target *t);
/* After optimisation: makes a streaming kernel's widened output stores that
 * LLVM knows to be aligned non-temporal (codegen.c says how it finds them). */
void codegen_stream_stores(LLVMModuleRef module);

#endif
