/* The LLVM backend: kernels of the kernel IR compiled to object code for a
 * CPU, and object code loaded into ORC LLJIT. What other modules may use of
 * it. */
#ifndef KILN_CODEGEN_LLVM_H
#define KILN_CODEGEN_LLVM_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/kernel.h"

typedef kx_kernel_fn llvm_kernel_fn;

typedef struct llvm_code llvm_code;
typedef struct llvm_target llvm_target;

typedef struct {
    int opt_level;     /* 0..3 */
    char **ir_before;  /* if not NULL: the module's IR before optimisation, malloc'd */
    char **ir_after;   /* and after */
} llvm_options;

/* The target named "host", "cpu:<LLVM CPU name>" (its own features) or
 * "cpu:<name>:<LLVM feature list>", or NULL with the reason in err. Targets
 * live as long as the process. */
const llvm_target *llvm_target_get(const char *name, char *err, size_t err_size);
/* The host as a "cpu:<name>:<features>" target: code compiled for it
 * anywhere has the host's keys. NULL when LLVM cannot start. */
const char *llvm_host_target_name(void);
/* What identifies the code made for t: its triple, CPU and enabled features. */
const char *llvm_target_id(const llvm_target *t);
/* Whether code for t runs here (only the host's is loaded). */
bool llvm_target_is_host(const llvm_target *t);
/* A hash of the code generator's sources: changes when its code may. */
const char *llvm_codegen_version(void);
/* "LLVM <major>.<minor>.<patch>". */
const char *llvm_toolchain(void);

/* Compiles k into object code for t whose entry point is named symbol:
 * *object is malloc'd, *size its bytes. 0, or -1 with the reason in err.
 * Safe from several threads at once. */
int llvm_compile_object(const kx_kernel *k, const char *symbol, const llvm_target *t, const llvm_options *opt,
                        void **object, size_t *size, char *err, size_t err_size);
/* Loads host object code (borrowed: copied) and finds symbol in it: *fn runs
 * the kernel until the code is freed. NULL with the reason in err. */
llvm_code *llvm_load(const void *object, size_t size, const char *symbol, llvm_kernel_fn *fn, char *err,
                     size_t err_size);
/* Unloads the code; its functions must not run any more. */
void llvm_code_free(llvm_code *code);

#endif
