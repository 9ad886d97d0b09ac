/* The CUDA driver, opened with dlopen: device 0, its primary context, one
 * stream, modules and launches, copies.
 *
 * Everything kiln does on the GPU goes into one stream in call order, so a
 * kernel sees the copies and kernels issued before it, and a block freed to
 * the allocator (allocator.c) may be handed to a later kernel without waiting.
 * Copies to the host wait for the stream. The context is made current on each
 * thread that calls in, since the driver keeps it per thread. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/internal.h"

typedef int cu_result;
typedef int cu_device;
typedef void *cu_context;
typedef void *cu_stream;
typedef void *cu_module;
typedef void *cu_function;
typedef unsigned long long cu_ptr;

enum {
    CU_SUCCESS = 0,
    CU_ERROR_OUT_OF_MEMORY = 2,
    CU_ERROR_INVALID_IMAGE = 200,
    CU_ERROR_NO_BINARY_FOR_GPU = 209,
    CU_ATTR_MULTIPROCESSORS = 16,
    CU_ATTR_MAJOR = 75,
    CU_ATTR_MINOR = 76,
    CU_STREAM_NON_BLOCKING = 1,
};

static struct {
    pthread_once_t once;
    char failure[512];
    void *lib;
    cu_device device;
    cu_context context;
    cu_stream stream;
    char arch[16], name[128];
    int multiprocessors;
    cu_result (*init)(unsigned);
    cu_result (*error_string)(cu_result, const char **);
    cu_result (*device_count)(int *);
    cu_result (*device_get)(cu_device *, int);
    cu_result (*device_name)(char *, int, cu_device);
    cu_result (*device_attribute)(int *, int, cu_device);
    cu_result (*primary_ctx_retain)(cu_context *, cu_device);
    cu_result (*ctx_set_current)(cu_context);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_synchronize)(cu_stream);
    cu_result (*mem_alloc)(cu_ptr *, size_t);
    cu_result (*mem_free)(cu_ptr);
    cu_result (*memcpy_htod)(cu_ptr, const void *, size_t, cu_stream);
    cu_result (*memcpy_dtoh)(void *, cu_ptr, size_t, cu_stream);
    cu_result (*memcpy_dtod)(cu_ptr, cu_ptr, size_t, cu_stream);
    cu_result (*memset_d8)(cu_ptr, unsigned char, size_t, cu_stream);
    cu_result (*module_load_data)(cu_module *, const void *);
    cu_result (*module_unload)(cu_module);
    cu_result (*module_get_function)(cu_function *, cu_module, const char *);
    cu_result (*launch)(cu_function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        cu_stream, void **, void **);
} cu = {.once = PTHREAD_ONCE_INIT};

static _Thread_local bool context_current;

enum { BLOCKS_PER_MULTIPROCESSOR = 32 };

static bool bind(char *why, size_t size)
{
    struct {
        void **slot;
        const char *name;
    } symbols[] = {
        {(void **)&cu.init, "cuInit"},
        {(void **)&cu.error_string, "cuGetErrorString"},
        {(void **)&cu.device_count, "cuDeviceGetCount"},
        {(void **)&cu.device_get, "cuDeviceGet"},
        {(void **)&cu.device_name, "cuDeviceGetName"},
        {(void **)&cu.device_attribute, "cuDeviceGetAttribute"},
        {(void **)&cu.primary_ctx_retain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu.ctx_set_current, "cuCtxSetCurrent"},
        {(void **)&cu.stream_create, "cuStreamCreate"},
        {(void **)&cu.stream_synchronize, "cuStreamSynchronize"},
        {(void **)&cu.mem_alloc, "cuMemAlloc_v2"},
        {(void **)&cu.mem_free, "cuMemFree_v2"},
        {(void **)&cu.memcpy_htod, "cuMemcpyHtoDAsync_v2"},
        {(void **)&cu.memcpy_dtoh, "cuMemcpyDtoHAsync_v2"},
        {(void **)&cu.memcpy_dtod, "cuMemcpyDtoDAsync_v2"},
        {(void **)&cu.memset_d8, "cuMemsetD8Async"},
        {(void **)&cu.module_load_data, "cuModuleLoadData"},
        {(void **)&cu.module_unload, "cuModuleUnload"},
        {(void **)&cu.module_get_function, "cuModuleGetFunction"},
        {(void **)&cu.launch, "cuLaunchKernel"},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++) {
        if (!(*symbols[i].slot = dlsym(cu.lib, symbols[i].name))) {
            snprintf(why, size, "libcuda.so.1 lacks %s", symbols[i].name);
            return false;
        }
    }
    return true;
}

static const char *describe(cu_result r)
{
    const char *text = NULL;
    if (cu.error_string && cu.error_string(r, &text) == CU_SUCCESS && text)
        return text;
    return "unknown CUDA error";
}

/* Writes "call: the driver's reason" into err; returns -1, or 0 for success. */
static int check(cu_result r, const char *call, char *err, size_t err_size)
{
    if (r == CU_SUCCESS)
        return 0;
    snprintf(err, err_size, "%s: %s (CUDA error %d)", call, describe(r), r);
    return -1;
}

static void open_device(void)
{
    char why[400];
    int count = 0, major = 0, minor = 0;
    cu_result r;
    if ((r = cu.init(0)) != CU_SUCCESS) {
        snprintf(cu.failure, sizeof cu.failure, "no CUDA device: cuInit: %s", describe(r));
    } else if ((r = cu.device_count(&count)) != CU_SUCCESS) {
        snprintf(cu.failure, sizeof cu.failure, "no CUDA device: cuDeviceGetCount: %s", describe(r));
    } else if (count == 0) {
        snprintf(cu.failure, sizeof cu.failure, "no CUDA device: the driver sees none");
    } else if (check(cu.device_get(&cu.device, 0), "cuDeviceGet", why, sizeof why) < 0 ||
               check(cu.device_attribute(&major, CU_ATTR_MAJOR, cu.device), "cuDeviceGetAttribute", why,
                     sizeof why) < 0 ||
               check(cu.device_attribute(&minor, CU_ATTR_MINOR, cu.device), "cuDeviceGetAttribute", why,
                     sizeof why) < 0 ||
               check(cu.device_attribute(&cu.multiprocessors, CU_ATTR_MULTIPROCESSORS, cu.device),
                     "cuDeviceGetAttribute", why, sizeof why) < 0 ||
               check(cu.device_name(cu.name, sizeof cu.name, cu.device), "cuDeviceGetName", why, sizeof why) < 0 ||
               check(cu.primary_ctx_retain(&cu.context, cu.device), "cuDevicePrimaryCtxRetain", why,
                     sizeof why) < 0 ||
               check(cu.ctx_set_current(cu.context), "cuCtxSetCurrent", why, sizeof why) < 0 ||
               check(cu.stream_create(&cu.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", why, sizeof why) < 0) {
        snprintf(cu.failure, sizeof cu.failure, "CUDA device 0 does not start: %s", why);
    } else {
        snprintf(cu.arch, sizeof cu.arch, "sm_%d%d", major, minor);
    }
}

static void start(void)
{
    if (!(cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) {
        snprintf(cu.failure, sizeof cu.failure, "no CUDA driver: %s", dlerror());
        return;
    }
    char why[256];
    if (!bind(why, sizeof why)) {
        snprintf(cu.failure, sizeof cu.failure, "no CUDA driver: %s", why);
        return;
    }
    open_device();
}

int device_start(char *err, size_t err_size)
{
    pthread_once(&cu.once, start);
    if (cu.failure[0]) {
        snprintf(err, err_size, "%s", cu.failure);
        return -1;
    }
    if (!context_current) {
        if (check(cu.ctx_set_current(cu.context), "cuCtxSetCurrent", err, err_size) < 0)
            return -1;
        context_current = true;
    }
    return 0;
}

const char *device_arch(void)
{
    return cu.arch;
}

const char *device_name(void)
{
    return cu.name;
}

int device_multiprocessors(void)
{
    return cu.multiprocessors;
}

unsigned device_grid(int64_t n)
{
    int64_t cap = (int64_t)cu.multiprocessors * BLOCKS_PER_MULTIPROCESSOR;
    if (n > cap)
        n = cap;
    return n < 1 ? 1 : (unsigned)n;
}

int driver_alloc(void **p, size_t bytes, bool *out_of_memory, char *err, size_t err_size)
{
    cu_ptr at = 0;
    cu_result r = cu.mem_alloc(&at, bytes);
    *out_of_memory = r == CU_ERROR_OUT_OF_MEMORY;
    *p = (void *)(uintptr_t)at;
    return check(r, "cuMemAlloc", err, err_size);
}

void driver_free(void *p)
{
    char ignored[512];
    if (device_start(ignored, sizeof ignored) == 0) /* the context current on this thread too */
        cu.mem_free((cu_ptr)(uintptr_t)p);
}

int device_upload(void *dst, const void *src, size_t bytes, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return -1;
    /* From pageable memory the copy is staged before the call returns, so the
     * caller may reuse src at once. */
    return check(cu.memcpy_htod((cu_ptr)(uintptr_t)dst, src, bytes, cu.stream), "cuMemcpyHtoDAsync", err, err_size);
}

int device_download(void *dst, const void *src, size_t bytes, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0 ||
        check(cu.memcpy_dtoh(dst, (cu_ptr)(uintptr_t)src, bytes, cu.stream), "cuMemcpyDtoHAsync", err, err_size) < 0)
        return -1;
    return check(cu.stream_synchronize(cu.stream), "cuStreamSynchronize", err, err_size);
}

int device_copy(void *dst, const void *src, size_t bytes, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return -1;
    return check(cu.memcpy_dtod((cu_ptr)(uintptr_t)dst, (cu_ptr)(uintptr_t)src, bytes, cu.stream),
                 "cuMemcpyDtoDAsync", err, err_size);
}

int device_memset(void *dst, int byte, size_t bytes, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return -1;
    return check(cu.memset_d8((cu_ptr)(uintptr_t)dst, (unsigned char)byte, bytes, cu.stream), "cuMemsetD8Async", err,
                 err_size);
}

int device_synchronize(char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return -1;
    return check(cu.stream_synchronize(cu.stream), "cuStreamSynchronize", err, err_size);
}

struct device_module {
    cu_module module;
    cu_function function;
};

device_module *device_load(const void *const *images, int n, const char *symbol, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return NULL;
    device_module *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    cu_result r = CU_ERROR_NO_BINARY_FOR_GPU;
    for (int i = 0; i < n && (r == CU_ERROR_NO_BINARY_FOR_GPU || r == CU_ERROR_INVALID_IMAGE); i++)
        r = cu.module_load_data(&m->module, images[i]);
    if (check(r, "cuModuleLoadData", err, err_size) < 0) {
        free(m);
        return NULL;
    }
    if (check(cu.module_get_function(&m->function, m->module, symbol), "cuModuleGetFunction", err, err_size) < 0) {
        cu.module_unload(m->module);
        free(m);
        return NULL;
    }
    return m;
}

void device_unload(device_module *m)
{
    if (!m)
        return;
    char ignored[512];
    if (device_start(ignored, sizeof ignored) == 0)
        cu.module_unload(m->module);
    free(m);
}

int device_launch(const device_module *m, const unsigned grid[3], unsigned block, void **params, char *err,
                size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return -1;
    return check(cu.launch(m->function, grid[0], grid[1], grid[2], block, 1, 1, 0, cu.stream, params, NULL),
                 "cuLaunchKernel", err, err_size);
}

int device_launch_flagged(const device_module *m, const unsigned grid[3], unsigned block, void **params, int slot,
                          int64_t *words, int n_words, char *err, size_t err_size)
{
    size_t bytes = sizeof *words * (size_t)n_words, granted;
    void *at = device_alloc(bytes, &granted, err, err_size);
    if (!at)
        return -1;
    params[slot] = &at;
    int status = device_memset(at, 0, bytes, err, err_size);
    if (status == 0)
        status = device_launch(m, grid, block, params, err, err_size);
    if (status == 0)
        status = device_download(words, at, bytes, err, err_size);
    device_free(at, granted);
    params[slot] = NULL;
    return status;
}
