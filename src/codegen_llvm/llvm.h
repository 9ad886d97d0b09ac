/* The LLVM backend: kernels of the kernel IR compiled to object code for a
 * CPU, and object code loaded into ORC LLJIT. The rest of kiln reaches it
 * through llvm_backend; the functions below are for its tests. */
#ifndef KILN_CODEGEN_LLVM_H
#define KILN_CODEGEN_LLVM_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/backend.h"

/* The backend table (ir/backend.h). */
extern const kx_backend llvm_backend;

/* A kernel's code: runs rows [begin, end) over its buffers (inputs then
 * outputs). */
typedef void (*llvm_kernel_fn)(void *const *buffers, int64_t begin, int64_t end, const int64_t *symbols);

typedef struct llvm_code llvm_code;
typedef struct llvm_target llvm_target;

typedef struct {
    int opt_level;      /* 0..3 */
    bool stream_stores; /* kx_kernel_options.stream_stores */
    char **ir_before;   /* if not NULL: the module's IR before optimisation, malloc'd */
    char **ir_after;    /* and after */
} llvm_options;

/* The target named "host", "cpu:<LLVM CPU name>" (its own features) or
 * "cpu:<name>:<LLVM feature list>", or NULL with the reason in err. Targets
 * live as long as the process. */
const llvm_target *llvm_target_get(const char *name, char *err, size_t err_size);
/* The generic view of t: its canonical name ("cpu:<name>:<features>" for
 * the host: code compiled for it anywhere has the host's keys), its id
 * (triple, CPU and enabled features) and whether it is the host. */
const kx_target *llvm_target_of(const llvm_target *t);
/* A hash of the code generator's sources: changes when its code may. */
const char *llvm_codegen_version(void);
/* "LLVM <major>.<minor>.<patch>". */
const char *llvm_toolchain(void);

/* Compiles k into object code for t whose entry point is named symbol:
 * *object is malloc'd, *size its bytes. 0, or -1 with the reason in err.
 * Safe from several threads at once. */
int llvm_compile_object(const kx_kernel *k, const char *symbol, const llvm_target *t, const llvm_options *opt,
                        void **object, size_t *size, char *err, size_t err_size);
/* Compiles the plain product of dt (f32, f64) into object code for t: the
 * functions codegen_llvm/gemm.h names under symbol. As llvm_compile_object. */
int llvm_compile_gemm(kiln_dtype dt, const char *symbol, const llvm_target *t, const llvm_options *opt,
                      void **object, size_t *size, char *err, size_t err_size);
/* Loads host object code (borrowed: copied) and finds names[0..n) in it,
 * into addresses. NULL with the reason in err. */
llvm_code *llvm_load_symbols(const void *object, size_t size, const char *const *names, int n, void **addresses,
                             char *err, size_t err_size);
/* Loads host object code (borrowed: copied) and finds symbol in it: *fn runs
 * the kernel until the code is freed. NULL with the reason in err. */
llvm_code *llvm_load(const void *object, size_t size, const char *symbol, llvm_kernel_fn *fn, char *err,
                     size_t err_size);
/* Unloads the code; its functions must not run any more. */
void llvm_code_free(llvm_code *code);

#endif
