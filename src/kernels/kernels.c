/* The compile-or-load service: kernels by key, shared by every plan of the
 * process that needs them, read from the disk cache when a sound entry is
 * there, compiled and stored when not.
 *
 * The table of loaded kernels has one lock, held only to look up, insert or
 * drop an entry: never across the disk or a compile. A kernel being made is
 * an in-flight entry that other threads asking for the same key wait on;
 * threads asking for anything else go on. Loaded kernels are counted
 * references: the last plan to let go unloads its code, so the table never
 * outgrows the live plans. Generic kernels of eager ops stay loaded: there is
 * one per op and dtypes.
 *
 * Eviction runs on a budget: the bytes this process knows the cache holds,
 * counted from one listing of the directory and the entries it stored since;
 * the directory is listed again only when that passes the cap (and then
 * trimmed to 7/8 of it) or after many stores (others write there too).
 *
 * The kernels of one request are made on the thread pool's threads, each
 * taking the next kernel not yet taken, so that compiles (and disk reads)
 * of a graph run side by side; the hits and misses of a request are counted
 * in the directory's stats once. */
#include <stdatomic.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "core/core.h"
#include "kernels/backends.h"
#include "kernels/kernels.h"

/* The backends of this build, as the build lists them. */
#define DECLARE_BACKEND(name) extern const kx_backend name##_backend;
KILN_BACKENDS(DECLARE_BACKEND)
#define LIST_BACKEND(name) &name##_backend,
static const kx_backend *const backends[] = {KILN_BACKENDS(LIST_BACKEND)};
enum { N_BACKENDS = sizeof backends / sizeof *backends };

enum { COMPONENTS = 7, REPORTED_MAX = 64, BUCKETS = 256, RESCAN_STORES = 1024 };

struct kernels_entry {
    cache_key key;
    const kx_backend *backend;
    kx_code *code;
    int refs;
    bool in_flight;       /* being loaded or compiled by one thread; others wait */
    kernels_entry *next;
};

typedef struct generic_entry {
    cache_key key;
    kg_code code;
    bool in_flight;
    struct generic_entry *next;
} generic_entry;

static struct {
    pthread_mutex_t lock; /* the tables and the warnings; never held across I/O or a compile */
    pthread_cond_t ready; /* an in-flight entry is done (made or dropped) */
    kernels_entry *loaded[BUCKETS];
    generic_entry *generic[BUCKETS];
    cache_key reported[REPORTED_MAX]; /* damaged entries already reported */
    int n_reported;
    bool warned_write, warned_config;
} table = {.lock = PTHREAD_MUTEX_INITIALIZER, .ready = PTHREAD_COND_INITIALIZER};

/* What this process knows of the disk cache's size (see the top). */
static struct {
    pthread_mutex_t lock; /* never held across the listing */
    char dir[CACHE_PATH_MAX];
    int64_t bytes;        /* -1: not listed yet */
    int64_t stored;       /* bytes stored while a listing runs */
    int stores;           /* since the last listing */
    bool listing;         /* one thread lists and trims; the others go on */
    int64_t scans;
} budget = {.lock = PTHREAD_MUTEX_INITIALIZER, .bytes = -1};

static const char *const component_names[COMPONENTS] = {"kernel", "backend", "target", "format",
                                                        "codegen", "toolchain", "options"};

/* -- Backends ---------------------------------------------------------------- */

const kx_backend *kernels_backend_for(kiln_device device)
{
    for (int i = 0; i < N_BACKENDS; i++)
        if (backends[i]->device == device)
            return backends[i];
    return NULL;
}

bool kernels_have_backend(kiln_device device, char *err, size_t err_size)
{
    if (kernels_backend_for(device))
        return true;
    snprintf(err, err_size, "this build of kiln has no code generator for %s (it was built without %s)",
             device == KILN_CUDA ? "CUDA" : "the CPU", device == KILN_CUDA ? "NVRTC" : "LLVM");
    return false;
}

const kx_target *kernels_target(const char *name, char *err, size_t err_size)
{
    for (int i = 0; i < N_BACKENDS; i++)
        if (backends[i]->accepts(name))
            return backends[i]->target(name, err, err_size);
    bool cpu = !strcmp(name, "host") || !strncmp(name, "cpu:", 4);
    if (cpu || !strncmp(name, "cuda:", 5))
        kernels_have_backend(cpu ? KILN_CPU : KILN_CUDA, err, err_size);
    else
        snprintf(err, err_size, "target \"%.200s\" is not \"host\", \"cpu:<LLVM CPU name>\", "
                 "\"cpu:<name>:<features>\" or \"cuda:sm_XX\"", name);
    return NULL;
}

/* -- Keys and lookups ----------------------------------------------------------- */

/* One kernel being made ready. */
typedef struct {
    const kx_kernel *kernel;
    const kg_kernel *generic;     /* instead of kernel */
    kx_kernel_options options;
    int index;
    const kernels_request *r;
    const cache_config *config;
    const kx_target *target;
    cache_key key, hashes[COMPONENTS];
    char hex[CACHE_HEX_CHARS + 1];
    char symbol[96];              /* as cache_meta keeps it */
    kx_code *code;                /* loaded for this process */
    kg_code generic_code;
    bool load;                    /* load code that runs here (else only check or store it) */
    int hits, misses;             /* for the directory's stats */
} lookup;

static unsigned bucket_of(const cache_key *key)
{
    return key->bytes[0] | (unsigned)key->bytes[1] << 8;
}

static kernels_entry **find_loaded(const cache_key *key)
{
    kernels_entry **at = &table.loaded[bucket_of(key) % BUCKETS];
    while (*at && memcmp((*at)->key.bytes, key->bytes, CACHE_KEY_BYTES))
        at = &(*at)->next;
    return at;
}

static generic_entry **find_generic(const cache_key *key)
{
    generic_entry **at = &table.generic[bucket_of(key) % BUCKETS];
    while (*at && memcmp((*at)->key.bytes, key->bytes, CACHE_KEY_BYTES))
        at = &(*at)->next;
    return at;
}

/* l's key, from the kernel's text and everything else that shapes its code:
 * 0, or -1 with why (no toolchain). */
static int make_key(lookup *l, const char *kernel_text, char *err, size_t err_size)
{
    const kx_backend *be = l->target->backend;
    const char *toolchain = be->toolchain(err, err_size);
    if (!toolchain)
        return -1;
    char options[128], format[16];
    snprintf(options, sizeof options, "opt_level=%d fast_math=%d %s", l->r->opt_level, (int)l->r->fast_math,
             kx_options_text(&l->options));
    snprintf(format, sizeof format, "%d", CACHE_FORMAT_VERSION);
    cache_component c[COMPONENTS] = {
        {component_names[0], kernel_text}, {component_names[1], be->name}, {component_names[2], l->target->id},
        {component_names[3], format},      {component_names[4], be->codegen_version()},
        {component_names[5], toolchain},   {component_names[6], options},
    };
    cache_key_of(c, COMPONENTS, &l->key, l->hashes);
    cache_key_hex(&l->key, l->hex);
    if (!l->generic)
        snprintf(l->symbol, sizeof l->symbol, "kiln_%s", l->hex);
    return 0;
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

/* -- Warnings, once each -------------------------------------------------------- */

/* A bad entry is worth one warning per process, not one per lookup. */
static void report_problem(const cache_key *key, const char *what, const char *why, const char *then)
{
    pthread_mutex_lock(&table.lock);
    bool seen = false;
    for (int i = 0; i < table.n_reported && !seen; i++)
        seen = !memcmp(table.reported[i].bytes, key->bytes, CACHE_KEY_BYTES);
    if (!seen && table.n_reported < REPORTED_MAX)
        table.reported[table.n_reported++] = *key;
    pthread_mutex_unlock(&table.lock);
    if (!seen)
        fprintf(stderr, "kiln: warning: %s %s%s\n", what, why, then);
}

/* Sets *flag; true when it was not set yet (the caller warns). */
static bool first_time(bool *flag)
{
    pthread_mutex_lock(&table.lock);
    bool first = !*flag;
    *flag = true;
    pthread_mutex_unlock(&table.lock);
    return first;
}

static void report_write_failure(const char *why, int error)
{
    if (!first_time(&table.warned_write))
        return;
    const char *what = error == EACCES || error == EROFS || error == EPERM ? "the cache directory is read-only"
                       : error == ENOSPC || error == EDQUOT || error == EFBIG ? "the disk is full"
                                                                               : "the cache cannot be written";
    fprintf(stderr, "kiln: warning: %s (%s); compiled kernels are not stored this run\n", what, why);
}

/* -- The disk --------------------------------------------------------------------- */

static bool uses_disk(const lookup *l)
{
    return l->config->mode != CACHE_OFF && !l->r->no_disk;
}

/* The metadata l's entry has on disk. */
static cache_meta meta_of(const lookup *l)
{
    cache_meta m = {.created = (int64_t)time(NULL)};
    snprintf(m.backend, sizeof m.backend, "%s", l->target->backend->name);
    snprintf(m.target, sizeof m.target, "%s", l->target->id);
    snprintf(m.symbol, sizeof m.symbol, "%s", l->symbol);
    snprintf(m.function, sizeof m.function, "%s", l->r->function);
    snprintf(m.signature, sizeof m.signature, "%s", l->r->signature);
    return m;
}

/* Loads object for this process when l asks: false with the reason in err
 * when it does not load. */
static bool load(lookup *l, const void *object, size_t size, char *err, size_t err_size)
{
    const kx_backend *be = l->target->backend;
    if (!l->load)
        return true;
    if (l->generic)
        return be->load_generic(l->generic, object, size, l->symbol, &l->generic_code, err, err_size) == 0;
    return (l->code = be->load(l->kernel, object, size, l->symbol, err, err_size)) != NULL;
}

/* The entry's code loaded (here) or known sound (other targets): 1, or 0
 * when there is none to use. */
static int from_disk(lookup *l)
{
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
    l->hits += writable;
    if (l->r->log)
        fprintf(stderr, "kiln: '%s': kernel %d loaded from the disk cache (key %.16s)\n", l->r->function,
                l->index, l->hex);
    return 1;
}

/* After storing bytes in dir: evicts when the budget says the cache may be
 * over its cap (see the top). */
static void spend_budget(const char *dir, int64_t max_bytes, int64_t bytes)
{
    pthread_mutex_lock(&budget.lock);
    if (strcmp(budget.dir, dir) && !budget.listing) {
        snprintf(budget.dir, sizeof budget.dir, "%s", dir);
        budget.bytes = -1;
    }
    budget.stored += budget.listing ? bytes : 0;
    if (budget.bytes >= 0)
        budget.bytes += bytes;
    bool list = !budget.listing &&
                (budget.bytes < 0 || budget.bytes > max_bytes || ++budget.stores >= RESCAN_STORES);
    int64_t target = budget.bytes > max_bytes ? max_bytes / 8 * 7 : max_bytes;
    if (list) {
        budget.listing = true;
        budget.stored = 0;
        budget.scans++;
    }
    pthread_mutex_unlock(&budget.lock);
    if (!list)
        return;
    int64_t kept = -1;
    cache_evict(dir, target, &kept);
    pthread_mutex_lock(&budget.lock);
    budget.bytes = kept < 0 ? -1 : kept + budget.stored;
    budget.stores = 0;
    budget.listing = false;
    pthread_mutex_unlock(&budget.lock);
}

int64_t kernels_eviction_scans(void)
{
    pthread_mutex_lock(&budget.lock);
    int64_t scans = budget.scans;
    pthread_mutex_unlock(&budget.lock);
    return scans;
}

/* Whether l's code runs in this process (else it is only compiled into the
 * disk cache). */
static bool runs_here(const lookup *l)
{
    return l->target->runs_here && l->load;
}

/* Stores l's object code: 0, or -1 with err when it could not be stored
 * (only a warning for code that runs here anyway). */
static int store(lookup *l, void *object, size_t size, char *err, size_t err_size)
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
    l->misses++;
    cache_entry_path(l->config->dir, &l->key, path, sizeof path);
    struct stat st;
    spend_budget(l->config->dir, l->config->max_bytes, stat(path, &st) == 0 ? (int64_t)st.st_size : (int64_t)size);
    if (!runs_here(l) && access(path, F_OK) < 0) {
        snprintf(err, err_size, "KILN_CACHE_MAX_BYTES=%lld leaves no room for it", (long long)l->config->max_bytes);
        return -1;
    }
    return 0;
}

/* -- Compiling -------------------------------------------------------------------- */

static void dump_stage(void *ctx, const char *stage, const char *text)
{
    const lookup *l = ctx;
    l->r->dump(l->r->dump_ctx, l->index, stage, text);
}

/* Compiles l's kernel into *object, dumping its stages when asked. */
static int generate(const lookup *l, void **object, size_t *size, char *err, size_t err_size)
{
    const kx_backend *be = l->target->backend;
    kx_dump_fn dump = l->r->dump ? dump_stage : NULL;
    void *ctx = (void *)l;
    if (l->generic)
        return be->compile_generic(l->generic, l->symbol, l->target, dump, ctx, object, size, err, err_size);
    kx_compile_options o = {l->r->opt_level, l->options, dump, ctx};
    return be->compile(l->kernel, l->symbol, l->target, &o, object, size, err, err_size);
}

/* KILN_DUMP shows the stages of kernels found ready too: they are made again
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
        return KERNELS_REQUIRED_MISSING;
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
    return status < 0 ? KERNELS_FAILED : 0;
}

/* l made ready from the disk or by compiling; counted in counts. */
static int make(lookup *l, kernels_counts *counts, char *err, size_t err_size)
{
    if (uses_disk(l) && from_disk(l)) {
        counts->from_disk++;
        dump_found(l);
        return 0;
    }
    int status = compile(l, err, err_size);
    counts->compiled += status == 0;
    return status;
}

/* -- Fused kernels ------------------------------------------------------------------ */

/* The entry of l's key, waiting while another thread makes it; NULL (and an
 * in-flight entry of this thread's in *mine) when it must be made here. */
static kernels_entry *take_entry(const lookup *l, kernels_entry **mine)
{
    *mine = NULL;
    pthread_mutex_lock(&table.lock);
    kernels_entry *e;
    while ((e = *find_loaded(&l->key)) && e->in_flight)
        pthread_cond_wait(&table.ready, &table.lock);
    if (e) {
        e->refs++;
    } else if ((*mine = calloc(1, sizeof **mine))) {
        kernels_entry **at = find_loaded(&l->key);
        **mine = (kernels_entry){.key = l->key, .backend = l->target->backend, .in_flight = true};
        *at = *mine;
    }
    pthread_mutex_unlock(&table.lock);
    return e;
}

/* Ends the in-flight entry e: loaded with code, or dropped (code NULL). */
static void settle(kernels_entry *e, kx_code *code)
{
    pthread_mutex_lock(&table.lock);
    if (code) {
        e->code = code;
        e->refs = 1;
        e->in_flight = false;
    } else {
        kernels_entry **at = find_loaded(&e->key);
        *at = e->next;
        free(e);
    }
    pthread_cond_broadcast(&table.ready);
    pthread_mutex_unlock(&table.lock);
}

/* l's cache key, from its kernel's text: 0, or KERNELS_FAILED with err. */
static int key_kernel(lookup *l, char *err, size_t err_size)
{
    char *text = kx_to_text(l->kernel);
    if (!text) {
        snprintf(err, err_size, "out of memory");
        return KERNELS_FAILED;
    }
    int status = make_key(l, text, err, err_size);
    free(text);
    return status < 0 ? KERNELS_FAILED : 0;
}

/* Makes keyed lookup l's kernel: from memory, disk or a compile. */
static int one_kernel(lookup *l, kernels_entry **handle, kernels_counts *counts, char *err, size_t err_size)
{
    if (!runs_here(l))
        return make(l, counts, err, err_size);
    kernels_entry *mine;
    if ((*handle = take_entry(l, &mine))) {
        counts->shared++;
        dump_found(l);
        return 0;
    }
    if (!mine) {
        snprintf(err, err_size, "out of memory");
        return KERNELS_FAILED;
    }
    int status = make(l, counts, err, err_size);
    settle(mine, status == 0 ? l->code : NULL);
    *handle = status == 0 ? mine : NULL;
    return status;
}

/* The cache as the environment sets it (off where the directory is not
 * trusted: src/cache checks it); warns once about what is wrong. 0, or
 * KERNELS_FAILED with why when KILN_CACHE=require asked for a cache it
 * cannot use: a deployment proving its bundle complete must not compile. */
static int read_config(cache_config *config, char *err, size_t err_size)
{
    cache_config asked;
    cache_settings_from_env(&asked);
    cache_config_from_env(config);
    if (asked.mode == CACHE_REQUIRE && config->mode != CACHE_REQUIRE) {
        snprintf(err, err_size, "KILN_CACHE=require, and the cache cannot be used: %s", config->problem);
        return KERNELS_FAILED;
    }
    if (config->problem[0] && first_time(&table.warned_config))
        fprintf(stderr, "kiln: warning: %s\n", config->problem);
    return 0;
}

/* Adds the hits and misses of lookups[0..n) to their directory's stats. */
static void count_disk(const lookup *lookups, int n)
{
    int hits = 0, misses = 0;
    for (int i = 0; i < n; i++) {
        hits += lookups[i].hits;
        misses += lookups[i].misses;
    }
    if (hits || misses)
        cache_count(lookups[0].config->dir, hits, misses);
}

/* A request's kernels being made by the pool's threads. */
typedef struct {
    lookup *lookups;
    kernels_entry **handles;
    kernels_counts *counts;   /* per kernel */
    int *status;
    char *errs;               /* err_size bytes per kernel */
    size_t err_size;
    int n;
    bool *repeat;             /* the key of an earlier kernel of the request */
    bool repeats;             /* made now: the first of each key is made */
    _Atomic int next;         /* the next kernel no thread has taken */
} batch;

static void make_some(void *ctx, int64_t begin, int64_t end)
{
    (void)begin, (void)end; /* kernels are taken one at a time: their compiles differ widely */
    batch *b = ctx;
    for (int i; (i = atomic_fetch_add(&b->next, 1)) < b->n;)
        if (b->status[i] == 0 && b->repeat[i] == b->repeats)
            b->status[i] = one_kernel(&b->lookups[i], &b->handles[i], &b->counts[i],
                                      b->errs + (size_t)i * b->err_size, b->err_size);
}

/* Keys b's kernels and marks those whose key an earlier one has: made side
 * by side with it, both would compile (code for another target is never in
 * memory), so they are made after it, from memory or disk. */
static void key_all(batch *b)
{
    for (int i = 0; i < b->n; i++)
        b->status[i] = key_kernel(&b->lookups[i], b->errs + (size_t)i * b->err_size, b->err_size);
    for (int i = 0; i < b->n; i++)
        for (int j = 0; j < i && !b->repeat[i]; j++)
            b->repeat[i] = b->status[i] == 0 && b->status[j] == 0 &&
                           !memcmp(&b->lookups[i].key, &b->lookups[j].key, sizeof b->lookups[i].key);
}

/* Makes b's kernels, on the pool where more than one may be made at once
 * (dumps are written one kernel at a time): the status of the first that
 * failed, its reason in err. */
static int make_all(batch *b, bool dump, char *err, size_t err_size)
{
    key_all(b);
    for (int pass = 0; pass < 2; pass++) {
        b->repeats = pass == 1;
        atomic_store(&b->next, 0);
        if (dump || b->n == 1 || b->repeats)
            make_some(b, 0, b->n);
        else
            core_parallel_for(b->n, 1, make_some, b);
    }
    for (int i = 0; i < b->n; i++) {
        if (b->status[i] < 0) {
            snprintf(err, err_size, "%s", b->errs + (size_t)i * b->err_size);
            return b->status[i];
        }
    }
    return 0;
}

int kernels_get(kx_kernel *const *kernels, const kx_kernel_options *options, int n, const kernels_request *r,
                kernels_entry **loaded, kernels_counts *counts, char *err, size_t err_size)
{
    *counts = (kernels_counts){0};
    cache_config config;
    if (read_config(&config, err, err_size) < 0)
        return KERNELS_REQUIRED_MISSING;
    if (!(r->target->runs_here && loaded) && (config.mode == CACHE_OFF || r->no_disk)) {
        snprintf(err, err_size, "code for %s is only stored in the disk cache, and %s", r->target->name,
                 r->no_disk           ? "this function skips it (no_cache)"
                 : config.problem[0] ? config.problem
                                     : "KILN_CACHE=off turns it off");
        return KERNELS_FAILED;
    }
    if (n <= 0)
        return 0;
    batch b = {.lookups = calloc((size_t)n, sizeof *b.lookups), .handles = calloc((size_t)n, sizeof *b.handles),
               .counts = calloc((size_t)n, sizeof *b.counts), .status = calloc((size_t)n, sizeof *b.status),
               .errs = calloc((size_t)n, err_size), .err_size = err_size, .n = n,
               .repeat = calloc((size_t)n, sizeof *b.repeat)};
    int status = KERNELS_FAILED;
    if (!b.lookups || !b.handles || !b.counts || !b.status || !b.errs || !b.repeat) {
        snprintf(err, err_size, "out of memory");
    } else {
        for (int i = 0; i < n; i++)
            b.lookups[i] = (lookup){.kernel = kernels[i], .options = options[i], .index = i, .r = r,
                                    .config = &config, .target = r->target, .load = loaded != NULL};
        status = make_all(&b, r->dump != NULL, err, err_size);
        count_disk(b.lookups, n);
        for (int i = 0; i < n; i++) {
            counts->compiled += b.counts[i].compiled;
            counts->from_disk += b.counts[i].from_disk;
            counts->shared += b.counts[i].shared;
            if (status < 0)
                kernels_release(b.handles[i]);
            else if (loaded)
                loaded[i] = b.handles[i];
        }
    }
    free(b.lookups);
    free(b.handles);
    free(b.counts);
    free(b.status);
    free(b.errs);
    free(b.repeat);
    return status;
}

const kx_code *kernels_code(const kernels_entry *e)
{
    return e->code;
}

void kernels_release(kernels_entry *e)
{
    if (!e)
        return;
    /* The last reference: the entry is in flight while its code unloads
     * (outside the lock: a backend may wait for a compile to unload), so
     * that a thread loading the same key meanwhile waits, and does not find
     * its symbol still defined. */
    pthread_mutex_lock(&table.lock);
    bool last = --e->refs == 0;
    e->in_flight = last;
    pthread_mutex_unlock(&table.lock);
    if (!last)
        return;
    e->backend->unload(e->code);
    pthread_mutex_lock(&table.lock);
    *find_loaded(&e->key) = e->next;
    free(e);
    pthread_cond_broadcast(&table.ready);
    pthread_mutex_unlock(&table.lock);
}

/* -- Generic kernels ------------------------------------------------------------------- */

/* The generic kernel of l's key: made by this thread when absent. */
static int one_generic(lookup *l, kg_code *code, char *err, size_t err_size)
{
    pthread_mutex_lock(&table.lock);
    generic_entry *e;
    while ((e = *find_generic(&l->key)) && e->in_flight)
        pthread_cond_wait(&table.ready, &table.lock);
    generic_entry *mine = e ? NULL : calloc(1, sizeof *mine);
    if (e) {
        *code = e->code;
    } else if (mine) {
        *mine = (generic_entry){.key = l->key, .in_flight = true};
        *find_generic(&l->key) = mine;
    }
    pthread_mutex_unlock(&table.lock);
    if (e)
        return 0;
    if (!mine) {
        snprintf(err, err_size, "out of memory");
        return KERNELS_FAILED;
    }
    kernels_counts counts = {0};
    int status = make(l, &counts, err, err_size);
    count_disk(l, 1);
    pthread_mutex_lock(&table.lock);
    if (status == 0) {
        mine->code = *code = l->generic_code;
        mine->in_flight = false;
    } else {
        *find_generic(&l->key) = mine->next;
        free(mine);
    }
    pthread_cond_broadcast(&table.ready);
    pthread_mutex_unlock(&table.lock);
    return status;
}

int kernels_generic(kiln_device device, const kg_kernel *k, kg_code *code, char *err, size_t err_size)
{
    const kx_backend *be = kernels_backend_for(device);
    if (!be || !be->compile_generic) {
        snprintf(err, err_size, "this build of kiln has no code generator for eager ops on %s",
                 device == KILN_CUDA ? "CUDA" : "the CPU");
        return KERNELS_FAILED;
    }
    const kx_target *target = be->target(NULL, err, err_size);
    char name[96];
    if (!target || kg_name(k, name, sizeof name, err, err_size) < 0)
        return KERNELS_FAILED;
    cache_config config;
    if (read_config(&config, err, err_size) < 0)
        return KERNELS_REQUIRED_MISSING;
    kernels_request r = {.target = target, .function = "eager", .signature = name,
                         .log = core_env_int("KILN_LOG", 0) > 0};
    lookup l = {.generic = k, .r = &r, .config = &config, .target = target, .load = true};
    snprintf(l.symbol, sizeof l.symbol, "%s", name);
    if (make_key(&l, name, err, err_size) < 0)
        return KERNELS_FAILED;
    return one_generic(&l, code, err, err_size);
}
