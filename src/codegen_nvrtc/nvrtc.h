/* The CUDA backend's code generator: kernels of the kernel IR, and the
 * shape-generic kernels of eager ops, as CUDA C compiled by NVRTC into CUBIN
 * and PTX. NVRTC is opened with dlopen, so one build of kiln runs with or
 * without it; its code runs through the device runtime (src/device). The
 * rest of kiln reaches it through nvrtc_backend; the functions below are for
 * its tests. */
#ifndef KILN_CODEGEN_NVRTC_H
#define KILN_CODEGEN_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/backend.h"
#include "kiln/kiln.h"

/* The backend table (ir/backend.h). */
extern const kx_backend nvrtc_backend;

/* Threads per block of a fused kernel, a multiple of the warp. An
 * elementwise kernel loops grid-stride over its elements, a kernel with
 * reductions over its rows, a block per row: any grid works. */
enum { NVRTC_BLOCK = 256 };

/* "sm_<major><minor>" of a "cuda:sm_XX" target name checked against what
 * NVRTC can compile for, into arch; -1 with the reason in err. */
int nvrtc_target(const char *name, char *arch, size_t arch_size, char *err, size_t err_size);
/* "NVRTC <major>.<minor>", or NULL with the reason in err (no NVRTC). */
const char *nvrtc_toolchain(char *err, size_t err_size);
/* A hash of the code generator's sources: changes when its code may. */
const char *nvrtc_codegen_version(void);

/* Whether k compiles here; with a product (kx_kernel.product), whether that
 * epilogue fuses into the tiled f32 matmul: an elementwise kernel reading
 * the product through one contiguous row-major view. Why not in why. */
bool nvrtc_supports(const kx_kernel *k, char *why, size_t why_size);

/* Compiles k for arch into an object whose entry point is symbol: CUBIN then
 * PTX (docs/cache-format.md), malloc'd into *object. Its parameters are the
 * kernel's buffers, each 16-byte aligned (contiguous f32 rows are read and
 * written as float4): a caller stages a buffer that is not; a kernel with a
 * product takes (kg_matmul_args, A, B) first. source, if not NULL, receives
 * the CUDA C (malloc'd). 0, or -1 with the reason (NVRTC's log included) in
 * err. Safe from several threads at once. */
int nvrtc_compile_object(const kx_kernel *k, const char *symbol, const char *arch, char **source, void **object,
                         size_t *size, char *err, size_t err_size);

/* Compiles CUDA C source whose kernel is symbol, as nvrtc_compile_object. */
int nvrtc_compile_source(const char *source, const char *symbol, const char *arch, void **object, size_t *size,
                         char *err, size_t err_size);

/* The CUDA C of a shape-generic kernel (ir/kernel.h), malloc'd, and its
 * extern "C" name (kg_name) in name; NULL with the reason in err. */
char *nvrtc_eager_source(const kg_kernel *k, char *name, size_t name_size, char *err, size_t err_size);

/* The output tile a matmul kernel's block computes (rows and columns) and its
 * threads a block, for the launch. */
void nvrtc_matmul_tile(kiln_dtype dt, int *tile_m, int *tile_n, int *threads);

/* Loads an object of nvrtc_compile_object or _source for the device: its
 * CUBIN when the device runs it, else its PTX, which the driver compiles.
 * NULL with the reason in err. */
struct device_module;
struct device_module *nvrtc_load(const void *object, size_t size, const char *symbol, char *err,
                                 size_t err_size);

#endif
