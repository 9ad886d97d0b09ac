/* What the files of src/codegen_llvm share. */
#ifndef KILN_CODEGEN_LLVM_INTERNAL_H
#define KILN_CODEGEN_LLVM_INTERNAL_H

#include <llvm-c/Core.h>

#include "codegen_llvm/llvm.h"

/* Adds the functions of kernel k to module: name(buffers, begin, end) and its
 * body (two for a streaming kernel). 0, or -1 with the reason in err. */
int codegen_kernel(LLVMModuleRef module, const kx_kernel *k, const char *name, char *err, size_t err_size);
/* After optimisation: makes a streaming kernel's widened output stores that
 * LLVM knows to be aligned non-temporal (codegen.c says how it finds them). */
void codegen_stream_stores(LLVMModuleRef module);

#endif
