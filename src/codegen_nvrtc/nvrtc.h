/* The CUDA backend's code generator: kernels of the kernel IR as CUDA C,
 * compiled by NVRTC into CUBIN and PTX. NVRTC and the CUDA driver are opened
 * with dlopen, so one build of kiln runs with or without them. What other
 * modules may use of src/codegen_nvrtc. */
#ifndef KILN_CODEGEN_NVRTC_H
#define KILN_CODEGEN_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/kernel.h"

/* "sm_<major><minor>" of a "cuda:sm_XX" target name checked against what
 * NVRTC can compile for, into arch; -1 with the reason in err. */
int nvrtc_target(const char *name, char *arch, size_t arch_size, char *err, size_t err_size);
/* "NVRTC <major>.<minor>", or NULL with the reason in err (no NVRTC). */
const char *nvrtc_toolchain(char *err, size_t err_size);
/* A hash of the code generator's sources: changes when its code may. */
const char *nvrtc_codegen_version(void);

/* Compiles k for arch into an object whose entry point is symbol: CUBIN then
 * PTX (docs/cache-format.md), malloc'd into *object. Its parameters are the
 * kernel's buffers, each 16-byte aligned (contiguous f32 rows are read and
 * written as float4): a caller stages a buffer that is not. source, if not NULL,
 * receives the CUDA C (malloc'd). 0, or -1 with the reason (NVRTC's log
 * included) in err. Safe from several threads at once. */
int nvrtc_compile_object(const kx_kernel *k, const char *symbol, const char *arch, char **source, void **object,
                         size_t *size, char *err, size_t err_size);

/* Compiles CUDA C source whose kernel is symbol, as nvrtc_compile_object. */
int nvrtc_compile_source(const char *source, const char *symbol, const char *arch, void **object, size_t *size,
                         char *err, size_t err_size);

/* Whether the CUDA driver can be opened here; why not in err. */
bool nvrtc_driver_available(char *err, size_t err_size);

#endif
