/* A stand-in for libcuda.so.1 on machines without a GPU: device memory is
 * host memory and copies are memcpy. The cuda suite runs against it
 * (LD_LIBRARY_PATH) to check what kiln does around kernels: moving tensors,
 * the caching allocator, clean errors, and launches. By default no kernel
 * loads. With FAKE_CUDA_KERNELS=check a module is its PTX, parsed by the
 * interpreter in ptx.c (so an instruction it does not know fails the load),
 * and a launch checks its grid and that every pointer argument (read from
 * the entry's parameter list) is device memory from cuMemAlloc or NULL, then
 * runs nothing: kiln's plans launch their kernels, whose results are
 * garbage. With FAKE_CUDA_KERNELS=run a launch also interprets the kernel
 * over its whole grid before it returns (the stream is in order and copies
 * are synchronous), so kernels compute their values and an access outside
 * device memory fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS.
 * FAKE_CUDA_DUMP_PTX names a directory to write every module's PTX into.
 * FAKE_CUDA_MEMORY_LIMIT bounds the bytes held, to provoke out-of-memory.
 * Only the entry points kiln binds are here. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ptx.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_IMAGE = 200, NO_BINARY_FOR_GPU = 209,
       INVALID_PTX = 218, ILLEGAL_ADDRESS = 700, NOT_SUPPORTED = 801 };

/* Each block carries its size before the address handed out; the live
 * ones are listed, for launches to check their pointers against. */
static size_t held;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
enum { MAX_BLOCKS = 1 << 16 };
static uintptr_t blocks[MAX_BLOCKS];
static size_t sizes[MAX_BLOCKS];
static int n_blocks;

enum kernel_mode { NO_KERNELS, CHECK_KERNELS, RUN_KERNELS };

static enum kernel_mode kernel_mode(void)
{
    const char *v = getenv("FAKE_CUDA_KERNELS");
    return !v ? NO_KERNELS : !strcmp(v, "check") ? CHECK_KERNELS : !strcmp(v, "run") ? RUN_KERNELS : NO_KERNELS;
}

/* Whether [at, at + n) lies in one live block. */
static bool device_memory(uintptr_t at, size_t n)
{
    pthread_mutex_lock(&lock);
    bool inside = false;
    for (int i = 0; i < n_blocks && !inside; i++)
        inside = at >= blocks[i] && at + n <= blocks[i] + sizes[i];
    pthread_mutex_unlock(&lock);
    return inside;
}

static size_t limit(void)
{
    const char *v = getenv("FAKE_CUDA_MEMORY_LIMIT");
    return v ? (size_t)strtoull(v, NULL, 10) : SIZE_MAX;
}

CUresult cuInit(unsigned flags) { (void)flags; return SUCCESS; }

/* NVRTC opens the driver too and asks it for its private tables. */
CUresult cuGetExportTable(const void **table, const void *id)
{
    (void)id;
    *table = NULL;
    return NOT_SUPPORTED;
}

CUresult cuGetErrorString(CUresult r, const char **text)
{
    switch (r) {
    case OUT_OF_MEMORY: *text = "out of memory"; break;
    case INVALID_IMAGE: *text = "device kernel image is invalid (the fake driver runs no kernels)"; break;
    case INVALID_PTX: *text = "a PTX JIT compilation failed (the fake driver's interpreter said why on stderr)"; break;
    case ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
    case PTX_MISALIGNED_ADDRESS: *text = "misaligned address"; break;
    case PTX_LAUNCH_FAILED: *text = "unspecified launch failure"; break;
    default: *text = "invalid argument"; break;
    }
    return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) { *n = 1; return SUCCESS; }
CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return SUCCESS; }

CUresult cuDeviceGetName(char *name, int size, int device)
{
    (void)device;
    strncpy(name, "kiln fake CUDA device", (size_t)size - 1);
    name[size - 1] = '\0';
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device)
{
    (void)device;
    *value = attribute == 75 ? 9 : attribute == 76 ? 0 : attribute == 16 ? 4 : 0;
    return SUCCESS;
}

static int context;
CUresult cuDevicePrimaryCtxRetain(void **ctx, int device) { (void)device; *ctx = &context; return SUCCESS; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &context ? SUCCESS : INVALID_VALUE; }
static int stream;
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = &stream; return SUCCESS; }
CUresult cuStreamSynchronize(void *s) { return s == &stream ? SUCCESS : INVALID_VALUE; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
    if (bytes == 0)
        return INVALID_VALUE;
    if (held + bytes > limit())
        return OUT_OF_MEMORY;
    size_t *block = malloc(sizeof(size_t) * 2 + bytes);
    if (!block)
        return OUT_OF_MEMORY;
    block[0] = bytes;
    *p = (CUdeviceptr)(uintptr_t)(block + 2);
    pthread_mutex_lock(&lock);
    if (n_blocks == MAX_BLOCKS) {
        pthread_mutex_unlock(&lock);
        free(block);
        return OUT_OF_MEMORY;
    }
    held += bytes;
    blocks[n_blocks] = (uintptr_t)*p;
    sizes[n_blocks++] = bytes;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    size_t *block = (size_t *)(uintptr_t)p - 2;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < n_blocks && blocks[i] != (uintptr_t)p)
        i++;
    if (i == n_blocks) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    blocks[i] = blocks[--n_blocks];
    sizes[i] = sizes[n_blocks];
    held -= block[0];
    pthread_mutex_unlock(&lock);
    free(block);
    return SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s)
{
    (void)s;
    if (n && !device_memory((uintptr_t)dst, n))
        return INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    return SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s)
{
    (void)s;
    if (n && !device_memory((uintptr_t)src, n))
        return INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s)
{
    (void)s;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s)
{
    (void)s;
    memset((void *)(uintptr_t)dst, v, n);
    return SUCCESS;
}

/* A module is its parsed PTX and the functions taken from it. */
typedef struct function {
    const ptx_kernel *kernel;
    struct module *module;
    struct function *next;
} function;

typedef struct module {
    ptx_module *ptx;
    function *functions;
} module;

static void dump_ptx(const char *text)
{
    static int seq;
    const char *dir = getenv("FAKE_CUDA_DUMP_PTX");
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.%d.ptx", dir, (int)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

CUresult cuModuleLoadData(void **out, const void *image)
{
    const unsigned char *bytes = image;
    if (kernel_mode() == NO_KERNELS)
        return INVALID_IMAGE;
    if (bytes[0] == 0x7f && bytes[1] == 'E') /* a CUBIN: ask for the PTX */
        return NO_BINARY_FOR_GPU;
    if (getenv("FAKE_CUDA_DUMP_PTX"))
        dump_ptx(image);
    char why[1024];
    module *m = calloc(1, sizeof *m);
    if (!m)
        return OUT_OF_MEMORY;
    if (!(m->ptx = ptx_parse(image, why, sizeof why))) {
        fprintf(stderr, "fake CUDA: cuModuleLoadData: %s\n", why);
        free(m);
        return INVALID_PTX;
    }
    *out = m;
    return SUCCESS;
}

CUresult cuModuleUnload(void *handle)
{
    module *m = handle;
    if (!m)
        return SUCCESS;
    while (m->functions) {
        function *next = m->functions->next;
        free(m->functions);
        m->functions = next;
    }
    ptx_free(m->ptx);
    free(m);
    return SUCCESS;
}

CUresult cuModuleGetFunction(void **f, void *handle, const char *name)
{
    module *m = handle;
    const ptx_kernel *kernel = m ? ptx_kernel_find(m->ptx, name) : NULL;
    function *fn = kernel ? calloc(1, sizeof *fn) : NULL;
    if (!fn)
        return INVALID_VALUE;
    fn->kernel = kernel;
    fn->module = m;
    fn->next = m->functions;
    m->functions = fn;
    *f = fn;
    return SUCCESS;
}

/* The live blocks, for a launch to check its accesses against; NULL when out of memory. */
static ptx_range *device_ranges(int *n)
{
    pthread_mutex_lock(&lock);
    ptx_range *ranges = malloc(sizeof(ptx_range) * (size_t)(n_blocks + 1));
    for (int i = 0; ranges && i < n_blocks; i++)
        ranges[i] = (ptx_range){blocks[i], blocks[i] + sizes[i]};
    *n = n_blocks;
    pthread_mutex_unlock(&lock);
    return ranges;
}

static CUresult run(const function *fn, const unsigned grid[3], const unsigned block[3], unsigned shared,
                    void **params)
{
    static pthread_mutex_t running = PTHREAD_MUTEX_INITIALIZER;
    ptx_launch launch = {.grid = {grid[0], grid[1], grid[2]}, .block = {block[0], block[1], block[2]},
                         .dynamic_shared_bytes = shared, .params = params};
    launch.device_memory = device_ranges(&launch.n_device_memory);
    if (!launch.device_memory)
        return OUT_OF_MEMORY;
    char why[1024];
    pthread_mutex_lock(&running);
    int r = ptx_run(fn->module->ptx, fn->kernel, &launch, why, sizeof why);
    pthread_mutex_unlock(&running);
    free((void *)launch.device_memory);
    if (r)
        fprintf(stderr, "fake CUDA: %s\n", why);
    return r;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra)
{
    (void)s; (void)extra;
    const function *fn = f;
    const char *name = ptx_kernel_name(fn->kernel);
    if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || gy > 65535 || gz > 65535) {
        fprintf(stderr, "fake CUDA: %s: grid (%u, %u, %u) of blocks of %u x %u x %u\n", name, gx, gy, gz, bx, by,
                bz);
        return INVALID_VALUE;
    }
    /* Pointers are the .u64 parameters: kiln passes no other 64-bit scalars. */
    for (int i = 0; i < ptx_kernel_n_params(fn->kernel); i++) {
        uintptr_t at = ptx_kernel_param_is_u64(fn->kernel, i) ? *(const uintptr_t *)params[i] : 0;
        if (at && !device_memory(at, 1)) {
            fprintf(stderr, "fake CUDA: %s: argument %d (%#lx) is not device memory\n", name, i, (unsigned long)at);
            return ILLEGAL_ADDRESS;
        }
    }
    if (kernel_mode() != RUN_KERNELS)
        return SUCCESS;
    return run(fn, (unsigned[]){gx, gy, gz}, (unsigned[]){bx, by, bz}, shared, params);
}
