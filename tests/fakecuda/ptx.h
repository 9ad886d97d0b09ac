/* The PTX interpreter behind the stand-in driver's FAKE_CUDA_KERNELS=run
 * (ptx.c says how it executes). */
#ifndef FAKE_CUDA_PTX_H
#define FAKE_CUDA_PTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CUDA driver's codes for what a kernel can do wrong. */
enum { PTX_ILLEGAL_ADDRESS = 700, PTX_MISALIGNED_ADDRESS = 716, PTX_LAUNCH_FAILED = 719 };

typedef struct ptx_module ptx_module;
typedef struct ptx_kernel ptx_kernel;

/* Parses a module's PTX text into instructions ready to run. Returns a new
 * module, or NULL with a message naming the line in err where the text holds
 * anything the interpreter does not know. */
ptx_module *ptx_parse(const char *text, char *err, size_t err_size);
void ptx_free(ptx_module *m);

/* The .entry called name, borrowed from m; NULL where there is none. */
const ptx_kernel *ptx_kernel_find(const ptx_module *m, const char *name);
const char *ptx_kernel_name(const ptx_kernel *k);
int ptx_kernel_n_params(const ptx_kernel *k);
/* Whether parameter i is declared .u64, which is how NVRTC declares pointers. */
bool ptx_kernel_param_is_u64(const ptx_kernel *k, int i);

/* Memory a kernel may address: disjoint [start, end) ranges, in any order. */
typedef struct {
    uintptr_t start, end;
} ptx_range;

typedef struct {
    unsigned grid[3], block[3];
    unsigned dynamic_shared_bytes;
    void **params; /* params[i] points at parameter i's value, as cuLaunchKernel takes them */
    const ptx_range *device_memory;
    int n_device_memory;
} ptx_launch;

/* Runs kernel k of module m over the whole grid before returning. Returns 0,
 * or one of the codes above with a message naming the kernel and the PTX line
 * in err. Launches of one module must not run concurrently. */
int ptx_run(ptx_module *m, const ptx_kernel *k, const ptx_launch *launch, char *err, size_t err_size);

#endif
