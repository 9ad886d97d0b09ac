/* Compiled kernels by key: shared by every plan of the process that needs
 * them, read from the disk cache when a sound entry is there, compiled and
 * stored when not.
 *
 * One lock covers the whole lookup, so a key is loaded once per process
 * however many threads ask for it; compiles are serialised by LLVM's lock in
 * any case. Loaded kernels are counted references: the last plan to let go
 * unloads its code, so the table never outgrows the live plans. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "codegen_llvm/llvm.h"
#include "codegen_nvrtc/nvrtc.h"
#include "core/core.h"
#include "device/device.h"
#include "ir/kernel.h"

struct cache_kernel {
    cache_key key;
    llvm_code *code;
    llvm_kernel_fn fn;
    device_module *module;  /* a GPU kernel instead */
    int refs;
    cache_kernel *next;
};

enum { COMPONENTS = 7, REPORTED_MAX = 64 };

/* An eager CUDA kernel, loaded for good: there is one per op and dtypes. */
typedef struct cuda_source {
    cache_key key;
    device_module *module;
    struct cuda_source *next;
} cuda_source;

static struct {
    pthread_mutex_t lock;
    cache_kernel *loaded;
    cuda_source *sources;
    cache_key reported[REPORTED_MAX]; /* damaged entries already reported */
    int n_reported;
    bool warned_write, warned_config, checked_dir;
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const component_names[COMPONENTS] = {"kernel", "backend", "target", "format",
                                                        "codegen", "toolchain", "options"};

static cache_kernel *find_loaded(const cache_key *key)
{
    for (cache_kernel *k = table.loaded; k; k = k->next)
        if (!memcmp(k->key.bytes, key->bytes, CACHE_KEY_BYTES))
            return k;
    return NULL;
}

/* A bad entry is worth one warning per process, not one per lookup. */
static void report_problem(const cache_key *key, const char *what, const char *why, const char *then)
{
    for (int i = 0; i < table.n_reported; i++)
        if (!memcmp(table.reported[i].bytes, key->bytes, CACHE_KEY_BYTES))
            return;
    if (table.n_reported < REPORTED_MAX)
        table.reported[table.n_reported++] = *key;
    fprintf(stderr, "kiln: warning: %s %s%s\n", what, why, then);
}

static void report_write_failure(const char *why, int error)
{
    if (table.warned_write)
        return;
    table.warned_write = true;
    const char *what = error == EACCES || error == EROFS || error == EPERM ? "the cache directory is read-only"
                       : error == ENOSPC || error == EDQUOT || error == EFBIG ? "the disk is full"
                                                                               : "the cache cannot be written";
    fprintf(stderr, "kiln: warning: %s (%s); compiled kernels are not stored this run\n", what, why);
}

/* Where code is made for: a CPU through LLVM, or a GPU architecture through
 * NVRTC (compiled here, run where there is one). */
typedef struct {
    const char *backend;      /* "llvm" or "nvrtc" */
    const llvm_target *llvm;  /* LLVM's targets */
    char arch[16];            /* NVRTC's: "sm_90" */
    const char *id, *codegen, *toolchain;
    bool host;                /* code for it is loaded and run in this process's CPU */
    bool device;              /* ... or on its GPU */
} target;

static int resolve_target(const char *name, target *t, char *err, size_t err_size)
{
    *t = (target){0};
    if (!strncmp(name, "cuda:", 5)) {
        t->backend = "nvrtc";
        if (nvrtc_target(name, t->arch, sizeof t->arch, err, err_size) < 0)
            return -1;
        t->id = t->arch;
        t->codegen = nvrtc_codegen_version();
        t->toolchain = nvrtc_toolchain(err, err_size);
        char ignored[256];
        t->device = device_start(ignored, sizeof ignored) == 0 && !strcmp(device_arch(), t->arch);
        return 0;
    }
    t->backend = "llvm";
    if (!(t->llvm = llvm_target_get(name, err, err_size)))
        return -1;
    t->id = llvm_target_id(t->llvm);
    t->codegen = llvm_codegen_version();
    t->toolchain = llvm_toolchain();
    t->host = llvm_target_is_host(t->llvm);
    return 0;
}

typedef struct {
    const kx_kernel *kernel;
    const char *source;   /* instead of kernel: CUDA C whose entry point is symbol */
    int index;
    const cache_request *r;
    const cache_config *config;
    const target *target;
    cache_key key, hashes[COMPONENTS];
    char hex[CACHE_HEX_CHARS + 1];
    char symbol[96];
    llvm_code *code;
    llvm_kernel_fn fn;
    device_module *module;  /* loaded for this process's GPU */
    bool load;            /* load code that runs here (else only check or store it) */
} lookup;

static void make_key(lookup *l, const char *kernel_text)
{
    char options[64];
    snprintf(options, sizeof options, "opt_level=%d fast_math=%d", l->r->opt_level, (int)l->r->fast_math);
    char format[16];
    snprintf(format, sizeof format, "%d", CACHE_FORMAT_VERSION);
    cache_component c[COMPONENTS] = {
        {component_names[0], kernel_text},
        {component_names[1], l->target->backend},
        {component_names[2], l->target->id},
        {component_names[3], format},
        {component_names[4], l->target->codegen},
        {component_names[5], l->target->toolchain},
        {component_names[6], options},
    };
    cache_key_of(c, COMPONENTS, &l->key, l->hashes);
    cache_key_hex(&l->key, l->hex);
    if (!l->source)
        snprintf(l->symbol, sizeof l->symbol, "kiln_%s", l->hex);
}

static void log_miss(const lookup *l)
{
    if (!l->r->log)
        return;
    fprintf(stderr, "kiln: '%s': kernel %d misses the cache (key %.16s):", l->r->function, l->index, l->hex);
    for (int i = 0; i < COMPONENTS; i++) {
        char hex[CACHE_HEX_CHARS + 1];
        cache_key_hex(&l->hashes[i], hex);
        fprintf(stderr, " %s=%.12s", component_names[i], hex);
    }
    fputc('\n', stderr);
}

/* Code in the cache runs as the user: say so once if others can write it. */
static void check_private(const char *dir)
{
    struct stat st;
    if (table.checked_dir || stat(dir, &st) < 0)
        return;
    table.checked_dir = true;
    if ((st.st_mode & 022) || st.st_uid != geteuid())
        fprintf(stderr,
                "kiln: warning: the cache directory %s is %s (mode %03o): whoever can write there can run "
                "code as you\n", dir, st.st_uid != geteuid() ? "owned by another user" : "writable by others",
                (unsigned)(st.st_mode & 0777));
}

static bool uses_disk(const lookup *l)
{
    return l->config->mode != CACHE_OFF && !l->r->no_disk;
}

/* The metadata l's entry has on disk. */
static cache_meta meta_of(const lookup *l)
{
    cache_meta m = {.created = (int64_t)time(NULL)};
    snprintf(m.backend, sizeof m.backend, "%s", l->target->backend);
    snprintf(m.target, sizeof m.target, "%s", l->target->id);
    snprintf(m.symbol, sizeof m.symbol, "%s", l->symbol);
    snprintf(m.function, sizeof m.function, "%s", l->r->function);
    snprintf(m.signature, sizeof m.signature, "%s", l->r->signature);
    return m;
}

/* Loads object for this process, when its target is this process's CPU or
 * GPU: false with the reason in err when it does not load. */
static bool load(lookup *l, const void *object, size_t size, char *err, size_t err_size)
{
    if (!l->load)
        return true;
    if (l->target->device)
        return (l->module = nvrtc_load(object, size, l->symbol, err, err_size)) != NULL;
    if (l->target->host)
        return (l->code = llvm_load(object, size, l->symbol, &l->fn, err, err_size)) != NULL;
    return true;
}

/* The entry's object code loaded (host) or known sound (other targets):
 * 1, or 0 when there is none to use. */
static int from_disk(lookup *l)
{
    check_private(l->config->dir);
    bool writable = l->config->mode != CACHE_READONLY;
    cache_meta expect = meta_of(l);
    cache_entry e;
    char why[CACHE_PATH_MAX + 512];
    int found = cache_read(l->config->dir, &l->key, &expect, writable, &e, why, sizeof why);
    if (found == CACHE_DAMAGED)
        report_problem(&l->key, "damaged cache entry", why, writable ? "; removed, compiling again" : "; compiling");
    else if (found == CACHE_UNREADABLE)
        report_problem(&l->key, "unreadable cache entry", why, "; compiling");
    if (found != CACHE_FOUND)
        return 0;
    bool loaded = load(l, e.payload, e.payload_bytes, why, sizeof why);
    cache_entry_free(&e);
    if (!loaded) {
        report_problem(&l->key, "cache entry that does not load", why, "; compiling");
        return 0;
    }
    if (writable)
        cache_count(l->config->dir, 1, 0);
    if (l->r->log)
        fprintf(stderr, "kiln: '%s': kernel %d loaded from the disk cache (key %.16s)\n", l->r->function,
                l->index, l->hex);
    return 1;
}

/* Whether l's code is loaded to run in this process, on its CPU or its GPU
 * (else it is only compiled into the disk cache). */
static bool runs_here(const lookup *l)
{
    return (l->target->host || l->target->device) && l->load;
}

/* Stores l's object code: 0, or -1 with err when it could not be stored
 * (only a warning for code that runs here anyway). */
static int store(const lookup *l, void *object, size_t size, char *err, size_t err_size)
{
    if (!runs_here(l) && l->config->mode == CACHE_READONLY) {
        snprintf(err, err_size, "code for another target is only stored in the disk cache, and "
                 "KILN_CACHE=readonly does not write it");
        return -1;
    }
    if (!uses_disk(l) || l->config->mode == CACHE_READONLY)
        return 0;
    cache_entry e = {.key = l->key, .meta = meta_of(l), .payload = object, .payload_bytes = size};
    char why[CACHE_PATH_MAX + 256], path[CACHE_PATH_MAX + 80];
    if (cache_write(l->config->dir, &e, why, sizeof why) < 0) {
        if (!runs_here(l)) {
            snprintf(err, err_size, "%s", why);
            return -1;
        }
        report_write_failure(why, errno);
        return 0;
    }
    cache_count(l->config->dir, 0, 1);
    cache_evict(l->config->dir, l->config->max_bytes);
    cache_entry_path(l->config->dir, &l->key, path, sizeof path);
    if (!runs_here(l) && access(path, F_OK) < 0) {
        snprintf(err, err_size, "KILN_CACHE_MAX_BYTES=%lld leaves no room for it", (long long)l->config->max_bytes);
        return -1;
    }
    return 0;
}

/* Compiles l's kernel into *object, dumping its IR when asked. */
static int generate(const lookup *l, void **object, size_t *size, char *err, size_t err_size)
{
    char *before = NULL, *after = NULL;
    int status;
    if (l->source) {
        status = nvrtc_compile_source(l->source, l->symbol, l->target->arch, object, size, err, err_size);
    } else if (l->target->llvm) {
        llvm_options o = {l->r->opt_level, l->r->dump ? &before : NULL, l->r->dump ? &after : NULL};
        status = llvm_compile_object(l->kernel, l->symbol, l->target->llvm, &o, object, size, err, err_size);
    } else {
        status = nvrtc_compile_object(l->kernel, l->symbol, l->target->arch, l->r->dump ? &after : NULL, object,
                                      size, err, err_size);
    }
    if (before)
        l->r->dump(l->r->dump_ctx, l->index, "llvm-before", before);
    if (after)
        l->r->dump(l->r->dump_ctx, l->index, l->target->llvm ? "llvm-after" : "cuda", after);
    free(before);
    free(after);
    return status;
}

/* KILN_DUMP=llvm shows the IR of kernels found ready too: it is made again
 * for the dump alone. */
static void dump_found(const lookup *l)
{
    if (!l->r->dump)
        return;
    void *object = NULL;
    size_t size;
    char ignored[256];
    generate(l, &object, &size, ignored, sizeof ignored);
    free(object);
}

static int compile(lookup *l, char *err, size_t err_size)
{
    log_miss(l);
    if (l->config->mode == CACHE_REQUIRE) {
        snprintf(err, err_size,
                 "KILN_CACHE=require and kernel %d of '%s' for (%s) is not in the cache %s (key %s)", l->index,
                 l->r->function, l->r->signature, l->config->dir, l->hex);
        return CACHE_REQUIRED_MISSING;
    }
    double start = core_now_ms();
    void *object = NULL;
    size_t size = 0;
    int status = generate(l, &object, &size, err, err_size);
    if (status == 0 && !load(l, object, size, err, err_size))
        status = -1;
    if (status == 0)
        status = store(l, object, size, err, err_size);
    free(object);
    if (status == 0 && l->r->log)
        fprintf(stderr, "kiln: '%s': kernel %d compiled in %.3f ms\n", l->r->function, l->index,
                core_now_ms() - start);
    return status < 0 ? CACHE_COMPILE_FAILED : 0;
}

/* Under the lock: kernel i made ready, counted in counts. */
static int one_kernel(lookup *l, cache_kernel **handle, cache_counts *counts, char *err, size_t err_size)
{
    char *text = kx_to_text(l->kernel);
    if (!text) {
        snprintf(err, err_size, "out of memory");
        return CACHE_COMPILE_FAILED;
    }
    make_key(l, text);
    free(text);
    bool host = runs_here(l);
    cache_kernel *k = host ? find_loaded(&l->key) : NULL;
    if (k) {
        k->refs++;
        counts->shared++;
        *handle = k;
        dump_found(l);
        return 0;
    }
    if (uses_disk(l) && from_disk(l)) {
        counts->from_disk++;
        dump_found(l);
    } else {
        int status = compile(l, err, err_size);
        if (status < 0)
            return status;
        counts->compiled++;
    }
    if (!host)
        return 0;
    if (!(k = calloc(1, sizeof *k))) {
        llvm_code_free(l->code);
        device_unload(l->module);
        snprintf(err, err_size, "out of memory");
        return CACHE_COMPILE_FAILED;
    }
    *k = (cache_kernel){.key = l->key, .code = l->code, .fn = l->fn, .module = l->module, .refs = 1,
                        .next = table.loaded};
    table.loaded = k;
    *handle = k;
    return 0;
}

int cache_kernels(kx_kernel *const *kernels, int n, const cache_request *r, cache_kernel **handles, void **fns,
                  cache_counts *counts, char *err, size_t err_size)
{
    *counts = (cache_counts){0};
    target t;
    if (resolve_target(r->target, &t, err, err_size) < 0)
        return CACHE_COMPILE_FAILED;
    cache_config config;
    cache_config_from_env(&config);
    if (!((t.host || t.device) && handles) && (config.mode == CACHE_OFF || r->no_disk)) {
        snprintf(err, err_size, "code for %s is only stored in the disk cache, and %s", r->target,
                 r->no_disk ? "this function skips it (no_cache)" : "KILN_CACHE=off turns it off");
        return CACHE_COMPILE_FAILED;
    }
    pthread_mutex_lock(&table.lock);
    if (config.problem[0] && !table.warned_config)
        fprintf(stderr, "kiln: warning: %s\n", config.problem);
    table.warned_config = table.warned_config || config.problem[0];
    int status = 0, i = 0;
    for (; i < n && status == 0; i++) {
        lookup l = {.kernel = kernels[i], .index = i, .r = r, .config = &config, .target = &t, .load = handles != NULL};
        cache_kernel *handle = NULL;
        status = one_kernel(&l, &handle, counts, err, err_size);
        if (handles)
            handles[i] = handle;
        if (fns && handle)
            fns[i] = handle->module ? (void *)handle->module : (void *)(uintptr_t)handle->fn;
    }
    pthread_mutex_unlock(&table.lock);
    if (status < 0)
        for (int j = 0; handles && j < i - 1; j++)
            cache_kernel_release(handles[j]);
    return status;
}

const char *cache_host_target(void)
{
    return llvm_host_target_name();
}

void cache_kernel_release(cache_kernel *k)
{
    if (!k)
        return;
    /* The code is unloaded under the lock: a thread loading the same key
     * meanwhile would find its symbol still defined. */
    pthread_mutex_lock(&table.lock);
    if (--k->refs == 0) {
        for (cache_kernel **at = &table.loaded; *at; at = &(*at)->next)
            if (*at == k) {
                *at = k->next;
                break;
            }
        llvm_code_free(k->code);
        device_unload(k->module);
        free(k);
    }
    pthread_mutex_unlock(&table.lock);
}

/* This process's GPU as a target, or -1 with the reason. */
static int device_target(target *t, char *err, size_t err_size)
{
    *t = (target){.backend = "nvrtc", .device = true};
    char name[32];
    if (device_start(err, err_size) < 0)
        return -1;
    snprintf(name, sizeof name, "cuda:%s", device_arch());
    if (nvrtc_target(name, t->arch, sizeof t->arch, err, err_size) < 0)
        return -1;
    t->id = t->arch;
    t->codegen = nvrtc_codegen_version();
    t->toolchain = nvrtc_toolchain(err, err_size);
    return t->toolchain ? 0 : -1;
}

int cache_cuda_source(const char *source, const char *symbol, device_module **module, char *err, size_t err_size)
{
    *module = NULL;
    target t;
    if (device_target(&t, err, err_size) < 0)
        return CACHE_COMPILE_FAILED;
    cache_config config;
    cache_config_from_env(&config);
    cache_request r = {.target = t.arch, .function = "eager", .signature = symbol,
                       .log = core_env_int("KILN_LOG", 0) > 0};
    lookup l = {.source = source, .r = &r, .config = &config, .target = &t, .load = true};
    snprintf(l.symbol, sizeof l.symbol, "%s", symbol);
    make_key(&l, source);
    pthread_mutex_lock(&table.lock);
    int status = 0;
    cuda_source *found = table.sources;
    while (found && memcmp(found->key.bytes, l.key.bytes, CACHE_KEY_BYTES))
        found = found->next;
    if (!found && !(uses_disk(&l) && from_disk(&l)))
        status = compile(&l, err, err_size);
    if (!found && status == 0) {
        if ((found = calloc(1, sizeof *found))) {
            *found = (cuda_source){l.key, l.module, table.sources};
            table.sources = found;
        } else {
            device_unload(l.module);
            snprintf(err, err_size, "out of memory");
            status = CACHE_COMPILE_FAILED;
        }
    }
    pthread_mutex_unlock(&table.lock);
    if (found && status == 0)
        *module = found->module;
    return status;
}
