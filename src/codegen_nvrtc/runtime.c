/* NVRTC and the CUDA driver, opened with dlopen.
 *
 * NVRTC is looked for under $CUDA_HOME, then as the system has it
 * (libnvrtc.so.13, .12, ...), then under /usr/local/cuda; the driver is
 * libcuda.so.1. Neither
 * is linked, so a machine without them gets an error that says so, not a
 * failure to start. Compiling takes no GPU: CUBIN for any architecture NVRTC
 * supports is made here, and the driver is needed only to run it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_nvrtc/internal.h"
#include "device/device.h"
#include "codegen_nvrtc/codegen_version.h"

typedef int nvrtc_result;
typedef struct nvrtc_program *nvrtc_program;

static struct {
    pthread_once_t once;
    void *lib;
    char failure[512];
    char version[32];
    int archs[64], n_archs;
    const char *(*error_string)(nvrtc_result);
    nvrtc_result (*version_of)(int *, int *);
    nvrtc_result (*num_archs)(int *);
    nvrtc_result (*supported_archs)(int *);
    nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *,
                           const char *const *);
    nvrtc_result (*destroy)(nvrtc_program *);
    nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
    nvrtc_result (*log_size)(nvrtc_program, size_t *);
    nvrtc_result (*log)(nvrtc_program, char *);
    nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
    nvrtc_result (*cubin)(nvrtc_program, char *);
    nvrtc_result (*ptx_size)(nvrtc_program, size_t *);
    nvrtc_result (*ptx)(nvrtc_program, char *);
} nv = {.once = PTHREAD_ONCE_INIT};

static const char *const NAMES[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
enum { N_NAMES = sizeof NAMES / sizeof *NAMES };

/* NVRTC opens its builtins library by bare name: when NVRTC itself came
 * from a directory the loader does not search, open them from there first. */
static void open_builtins(const char *dir)
{
    int major = 0, minor = 0;
    if (!dir[0] || nv.version_of(&major, &minor) != 0)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/libnvrtc-builtins.so.%d.%d", dir, major, minor);
    dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

/* Binds NVRTC's functions from lib; false when one is missing. */
static bool bind(void *lib, char *why, size_t size)
{
    struct {
        void **slot;
        const char *name;
    } symbols[] = {
        {(void **)&nv.error_string, "nvrtcGetErrorString"}, {(void **)&nv.version_of, "nvrtcVersion"},
        {(void **)&nv.num_archs, "nvrtcGetNumSupportedArchs"}, {(void **)&nv.supported_archs, "nvrtcGetSupportedArchs"},
        {(void **)&nv.create, "nvrtcCreateProgram"}, {(void **)&nv.destroy, "nvrtcDestroyProgram"},
        {(void **)&nv.compile, "nvrtcCompileProgram"}, {(void **)&nv.log_size, "nvrtcGetProgramLogSize"},
        {(void **)&nv.log, "nvrtcGetProgramLog"}, {(void **)&nv.cubin_size, "nvrtcGetCUBINSize"},
        {(void **)&nv.cubin, "nvrtcGetCUBIN"}, {(void **)&nv.ptx_size, "nvrtcGetPTXSize"},
        {(void **)&nv.ptx, "nvrtcGetPTX"},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++) {
        if (!(*symbols[i].slot = dlsym(lib, symbols[i].name))) {
            snprintf(why, size, "it lacks %s", symbols[i].name);
            return false;
        }
    }
    return true;
}

/* The first NVRTC that loads with every function kiln calls: in
 * $CUDA_HOME/lib64, then where the loader looks, then /usr/local/cuda/lib64.
 * What went wrong with each is appended to tried. */
static void *open_nvrtc(char *tried, size_t size)
{
    const char *home = getenv("CUDA_HOME");
    char home_lib[900] = "";
    if (home && *home)
        snprintf(home_lib, sizeof home_lib, "%s/lib64", home);
    const char *dirs[] = {home_lib, "", "/usr/local/cuda/lib64"};
    for (int d = 0; d < 3; d++) {
        if (d == 0 && !home_lib[0])
            continue;
        for (int n = 0; n < N_NAMES; n++) {
            char path[1024], why[256];
            snprintf(path, sizeof path, "%s%s%s", dirs[d], dirs[d][0] ? "/" : "", NAMES[n]);
            void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!lib)
                continue;
            if (bind(lib, why, sizeof why)) {
                open_builtins(dirs[d]);
                return lib;
            }
            size_t used = strlen(tried);
            snprintf(tried + used, size - used, "%s%.300s: %s", used ? "; " : "", path, why);
            dlclose(lib);
        }
    }
    if (!tried[0])
        snprintf(tried, size, "no libnvrtc.so.13, .12 or .11.2 in $CUDA_HOME/lib64, the loader's paths or "
                 "/usr/local/cuda/lib64");
    return NULL;
}

static void start(void)
{
    char tried[600] = "";
    if (!(nv.lib = open_nvrtc(tried, sizeof tried))) {
        snprintf(nv.failure, sizeof nv.failure, "no NVRTC: %s", tried);
        return;
    }
    int major = 0, minor = 0;
    nv.version_of(&major, &minor);
    snprintf(nv.version, sizeof nv.version, "NVRTC %d.%d", major, minor);
    if (nv.num_archs(&nv.n_archs) != 0 || nv.n_archs > 64 || nv.supported_archs(nv.archs) != 0)
        snprintf(nv.failure, sizeof nv.failure, "NVRTC does not list the architectures it supports");
}

static bool started(char *err, size_t size)
{
    pthread_once(&nv.once, start);
    if (nv.failure[0])
        snprintf(err, size, "%s", nv.failure);
    return !nv.failure[0];
}

const char *nvrtc_toolchain(char *err, size_t err_size)
{
    return started(err, err_size) ? nv.version : NULL;
}

const char *nvrtc_codegen_version(void)
{
    return NVRTC_CODEGEN_VERSION;
}

int nvrtc_target(const char *name, char *arch, size_t arch_size, char *err, size_t err_size)
{
    char *end = NULL;
    bool prefixed = strncmp(name, "cuda:sm_", 8) == 0;
    long number = prefixed && name[8] >= '0' && name[8] <= '9' ? strtol(name + 8, &end, 10) : 0;
    if (!prefixed || !end || *end || number <= 0 || number > 10000) { /* sm_4294967386 must not wrap to sm_90 */
        snprintf(err, err_size, "\"%.100s\" is not a CUDA target (\"cuda:sm_<major><minor>\", e.g. cuda:sm_90)", name);
        return -1;
    }
    if (!started(err, err_size))
        return -1;
    int sm = (int)number;
    for (int i = 0; i < nv.n_archs; i++)
        if (nv.archs[i] == sm) {
            snprintf(arch, arch_size, "sm_%d", sm);
            return 0;
        }
    snprintf(err, err_size, "%s cannot compile for sm_%d (it supports sm_%d to sm_%d)", nv.version, sm,
             nv.n_archs ? nv.archs[0] : 0, nv.n_archs ? nv.archs[nv.n_archs - 1] : 0);
    return -1;
}

/* Appends NVRTC's log of program p to err after what it says already. */
static void append_log(nvrtc_program p, char *err, size_t err_size)
{
    size_t size = 0, used = strlen(err);
    if (nv.log_size(p, &size) != 0 || size <= 1)
        return;
    char *log = malloc(size);
    if (log && nv.log(p, log) == 0)
        snprintf(err + used, err_size - used, "\n%s", log);
    free(log);
}

/* The CUBIN then the PTX of a compiled program as one object: the CUBIN's
 * length (8 bytes, little-endian), the CUBIN, the PTX with its NUL. */
static int take_object(nvrtc_program p, void **object, size_t *size, char *err, size_t err_size)
{
    size_t cubin = 0, ptx = 0;
    if (nv.cubin_size(p, &cubin) != 0 || nv.ptx_size(p, &ptx) != 0 || cubin == 0 || ptx == 0) {
        snprintf(err, err_size, "NVRTC made no CUBIN or no PTX");
        return -1;
    }
    uint8_t *out = malloc(8 + cubin + ptx);
    if (!out) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((uint64_t)cubin >> (8 * i));
    if (nv.cubin(p, (char *)out + 8) != 0 || nv.ptx(p, (char *)out + 8 + cubin) != 0) {
        free(out);
        snprintf(err, err_size, "NVRTC did not hand over its output");
        return -1;
    }
    *object = out;
    *size = 8 + cubin + ptx;
    return 0;
}

struct device_module *nvrtc_load(const void *object, size_t size, const char *symbol, char *err, size_t err_size)
{
    const unsigned char *bytes = object;
    uint64_t cubin = 0;
    for (int i = 0; i < 8 && size >= 8; i++)
        cubin |= (uint64_t)bytes[i] << (8 * i);
    if (size < 8 || cubin >= size - 8 || bytes[size - 1] != '\0') {
        snprintf(err, err_size, "kernel %s: the object is not a CUBIN and PTX pair", symbol);
        return NULL;
    }
    const void *images[2] = {bytes + 8, bytes + 8 + cubin};
    return device_load(images, 2, symbol, err, err_size);
}

int nvrtc_compile_source(const char *source, const char *symbol, const char *arch, void **object, size_t *size,
                         char *err, size_t err_size)
{
    *object = NULL;
    if (!started(err, err_size))
        return -1;
    nvrtc_program p = NULL;
    char arch_option[64];
    snprintf(arch_option, sizeof arch_option, "--gpu-architecture=%s", arch);
    /* No contraction into FMAs: the LLVM backend rounds a*b+c twice too. */
    const char *options[] = {arch_option, "--std=c++17", "--fmad=false"};
    nvrtc_result r = nv.create(&p, source, "kiln.cu", 0, NULL, NULL);
    int status = -1;
    if (r != 0) {
        snprintf(err, err_size, "nvrtcCreateProgram: %s", nv.error_string(r));
    } else if ((r = nv.compile(p, 3, options)) != 0) {
        snprintf(err, err_size, "NVRTC failed to compile kernel %s for %s (%s):", symbol, arch, nv.error_string(r));
        append_log(p, err, err_size);
    } else {
        status = take_object(p, object, size, err, err_size);
    }
    if (p)
        nv.destroy(&p);
    return status;
}

int nvrtc_compile_object(const kx_kernel *k, const char *symbol, const char *arch, char **source, void **object,
                         size_t *size, char *err, size_t err_size)
{
    *object = NULL;
    if (source)
        *source = NULL;
    if (!started(err, err_size))
        return -1;
    char *text = k->product >= 0 ? nvrtc_matmul_epilogue_source(k, symbol, err, err_size)
                                 : nvrtc_source(k, symbol, err, err_size);
    if (!text)
        return -1;
    int status = nvrtc_compile_source(text, symbol, arch, object, size, err, err_size);
    if (source)
        *source = text;
    else
        free(text);
    return status;
}
