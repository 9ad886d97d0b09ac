/* A stand-in for libcuda.so.1 on machines without a GPU: device memory is
 * host memory, copies are memcpy, and no kernel loads. The cuda suite runs
 * against it (LD_LIBRARY_PATH) to check what kiln does around kernels:
 * moving tensors, the caching allocator, and clean errors where a kernel
 * would run. FAKE_CUDA_MEMORY_LIMIT bounds the bytes held, to provoke
 * out-of-memory. Only the entry points kiln binds are here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_IMAGE = 200, NOT_SUPPORTED = 801 };

/* Each block carries its size before the address handed out. */
static size_t held;

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
    *text = r == OUT_OF_MEMORY ? "out of memory"
          : r == INVALID_IMAGE ? "device kernel image is invalid (the fake driver runs no kernels)"
                               : "invalid argument";
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
    held += bytes;
    *p = (CUdeviceptr)(uintptr_t)(block + 2);
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    size_t *block = (size_t *)(uintptr_t)p - 2;
    held -= block[0];
    free(block);
    return SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s)
{
    (void)s;
    memcpy((void *)(uintptr_t)dst, src, n);
    return SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s)
{
    (void)s;
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

CUresult cuModuleLoadData(void **module, const void *image) { (void)module; (void)image; return INVALID_IMAGE; }
CUresult cuModuleUnload(void *module) { (void)module; return SUCCESS; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { (void)f; (void)m; (void)name; return INVALID_VALUE; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params;
    (void)extra;
    return INVALID_VALUE;
}
