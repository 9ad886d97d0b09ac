/* The LLVM backend: kernels of the kernel IR compiled to native code for the
 * host and loaded with ORC LLJIT. What other modules may use of it. */
#ifndef KILN_CODEGEN_LLVM_H
#define KILN_CODEGEN_LLVM_H

#include <stddef.h>

#include "ir/kernel.h"

/* Runs rows [begin, end) of a kernel over its buffers (inputs then outputs). */
typedef void (*llvm_kernel_fn)(void *const *buffers, int64_t begin, int64_t end);

typedef struct llvm_code llvm_code;

typedef struct {
    int opt_level;     /* 0..3 */
    char **ir_before;  /* if not NULL: the module's IR before optimisation, malloc'd */
    char **ir_after;   /* and after */
} llvm_options;

/* Compiles the n kernels into one object for the host and loads it; fns[i]
 * then runs kernels[i]. NULL with the reason in err on failure. Safe from
 * several threads at once. */
llvm_code *llvm_compile(kx_kernel *const *kernels, int n, const llvm_options *opt, llvm_kernel_fn *fns,
                        char *err, size_t err_size);
/* Unloads the code; its functions must not run any more. */
void llvm_code_free(llvm_code *code);

#endif
