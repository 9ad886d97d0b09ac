/* The compile-or-load service: kernels made ready for a target, through the
 * backends of this build (ir/backend.h) and the cache (src/cache): shared
 * with every plan of the process that needs them, read from the disk cache
 * when a sound entry is there, compiled and stored when not. What the
 * executor and eager may use of src/kernels. */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/backend.h"

/* -- Backends ---------------------------------------------------------------- */

/* The backend of this build whose code runs on device, or NULL. */
const kx_backend *kernels_backend_for(kiln_device device);
/* The target called name ("host", "cpu:...", "cuda:sm_XX": the backend that
 * accepts it says), or NULL with why in err. */
const kx_target *kernels_target(const char *name, char *err, size_t err_size);
/* Whether this build has a backend for device; why not in err. */
bool kernels_have_backend(kiln_device device, char *err, size_t err_size);

/* -- Fused kernels ------------------------------------------------------------- */

/* A loaded kernel, shared by the plans that hold references to it. */
typedef struct kernels_entry kernels_entry;

typedef struct {
    const kx_target *target;
    int opt_level;
    bool fast_math;
    bool no_disk;           /* the function's no_cache option */
    const char *function;   /* for messages, logs and entries' metadata */
    const char *signature;
    bool log;               /* KILN_LOG=1 */
    /* Called, when not NULL, with each kernel's text at each stage its
     * backend has ("llvm-before", "llvm-after", "cuda"). */
    void (*dump)(void *ctx, int kernel, const char *stage, const char *text);
    void *dump_ctx;
} kernels_request;

typedef struct {
    int compiled;   /* by the code generator */
    int from_disk;  /* loaded from the disk cache */
    int shared;     /* already loaded in this process */
} kernels_counts;

enum { KERNELS_FAILED = -1, KERNELS_REQUIRED_MISSING = -2 };

/* Makes kernels[0..n) (compiled with options[i]) ready for r->target. When
 * loaded is not NULL (the target runs here), loaded[i] is a new reference to
 * kernel i loaded; else each is compiled and stored on disk only. 0, or
 * KERNELS_FAILED or KERNELS_REQUIRED_MISSING with the reason in err (the
 * first failing kernel's); nothing is held then. The kernels are made on the
 * thread pool's threads side by side. A kernel another thread is compiling
 * is waited for; nothing else waits on a compile. */
int kernels_get(kx_kernel *const *kernels, const kx_kernel_options *options, int n, const kernels_request *r,
                kernels_entry **loaded, kernels_counts *counts, char *err, size_t err_size);
const kx_code *kernels_code(const kernels_entry *e);
/* Drops a reference; the last one unloads the kernel. NULL is ignored. */
void kernels_release(kernels_entry *e);

/* -- Shape-generic kernels of eager ops ------------------------------------- */

/* The generic kernel k for device, loaded for the process (it stays: there
 * is one per op and dtypes): from this process's table, the disk cache, or
 * compiled and stored. 0, or KERNELS_FAILED or KERNELS_REQUIRED_MISSING with
 * the reason in err. */
int kernels_generic(kiln_device device, const kg_kernel *k, kg_code *code, char *err, size_t err_size);

/* -- For tests ------------------------------------------------------------------ */

/* Times a store's eviction listed the cache directory, in this process. */
int64_t kernels_eviction_scans(void);

#endif
