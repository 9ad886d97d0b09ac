/* Marked functions: signatures, specializations, tracing, eager fallback and
 * the counters of kiln_fn_stats. */
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#include "trace/trace.h"
#ifdef KILN_HAVE_LLVM
#include "cache/cache.h"
#endif

typedef struct {
    kiln_spec *inputs; /* the signature */
    interp_plan *plan;
} specialization;

struct kiln_fn {
    char name[64];
    kiln_body body;
    int n_in, n_out;
    void *user;
    kiln_jit_options opts;
    bool jit_off, log;             /* KILN_JIT=0, KILN_LOG=1 */
    bool dump_graph, dump_kernels, dump_llvm, dump_cuda; /* KILN_DUMP=graph,kernels,llvm,cuda */
    char dump_dir[512];            /* KILN_DUMP_DIR, default "." */
    pthread_mutex_t lock;          /* guards everything below */
    specialization *specs;         /* retrace_limit of them at most */
    int n_specs, last;
    kiln_fn_stats_t stats;
    int trace_failures;
    bool eager_only, warned;
};

#ifdef KILN_HAVE_LLVM
enum { HAVE_LLVM = 1 };
#else
enum { HAVE_LLVM = 0 };
#endif

enum {
    FAILED_TRACES_BEFORE_EAGER = 3,
    SPEC_STR_MAX = CORE_SHAPE_STR_MAX + 8,
    STACK_INPUTS = 16,
};

static void jit_log(const kiln_fn *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jit_log(const kiln_fn *f, const char *fmt, ...)
{
    if (!f->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln: '%s': ", f->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* -- Signatures ------------------------------------------------------------ */

kiln_spec kiln_spec_of(const kiln_tensor *t)
{
    kiln_spec s = {0};
    if (!t)
        return s;
    s = (kiln_spec){.dtype = t->dtype, .ndim = t->ndim, .device = t->device};
    memcpy(s.shape, t->shape, (size_t)t->ndim * sizeof *s.shape);
    return s;
}

static bool spec_equal(const kiln_spec *a, const kiln_spec *b)
{
    return a->dtype == b->dtype && a->ndim == b->ndim && a->device == b->device &&
           !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

static char *spec_str(char buf[SPEC_STR_MAX], const kiln_spec *s)
{
    char shape[CORE_SHAPE_STR_MAX];
    snprintf(buf, SPEC_STR_MAX, "%s%s", kiln_dtype_name(s->dtype), core_shape_str(shape, s->ndim, s->shape));
    return buf;
}

static int find_spec(const kiln_fn *f, const kiln_spec *sig)
{
    for (int k = 0; k < f->n_specs; k++) {
        int i = (f->last + k) % f->n_specs; /* the last one used first */
        bool same = true;
        for (int j = 0; j < f->n_in && same; j++)
            same = spec_equal(&f->specs[i].inputs[j], &sig[j]);
        if (same)
            return i;
    }
    return -1;
}

/* "f32[4,8], i64[]" */
static void signature_text(const kiln_fn *f, const kiln_spec *sig, char *out, size_t size)
{
    out[0] = '\0';
    for (int i = 0; i < f->n_in; i++) {
        char buf[SPEC_STR_MAX];
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%s%s", i ? ", " : "", spec_str(buf, &sig[i]));
    }
}

/* "input 1 changed shape f32[4,8] -> f32[5,8]" against the last signature. */
static void describe_change(const kiln_fn *f, const kiln_spec *sig, char *buf, size_t size)
{
    snprintf(buf, size, "a new signature");
    if (f->n_specs == 0)
        return;
    const kiln_spec *old = f->specs[f->last].inputs;
    for (int i = 0; i < f->n_in; i++) {
        if (spec_equal(&old[i], &sig[i]))
            continue;
        char a[SPEC_STR_MAX], b[SPEC_STR_MAX];
        snprintf(buf, size, "input %d changed %s %s -> %s", i,
                 old[i].dtype != sig[i].dtype ? "dtype" : old[i].device != sig[i].device ? "device" : "shape",
                 spec_str(a, &old[i]), spec_str(b, &sig[i]));
        return;
    }
}

/* -- Dumps ----------------------------------------------------------------- */

static void dump_file(const kiln_fn *f, int spec, const char *stage, const char *ext, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%d.%s.%s", f->dump_dir, f->name, spec, stage, ext);
    for (char *p = path + strlen(f->dump_dir) + 1; *p; p++)
        if (*p == '/' || *p == ' ')
            *p = '_';
    FILE *out = text ? fopen(path, "w") : NULL;
    if (out) {
        fputs(text, out);
        fclose(out);
    }
    if (!out)
        fprintf(stderr, "kiln: '%s': cannot write the dump %s\n", f->name, path);
}

static void dump_graph(const kiln_fn *f, int spec, const char *stage, const ir_graph *g)
{
    if (!f->dump_graph)
        return;
    char *text = ir_to_text(g), *dot = ir_to_dot(g, f->name);
    char name[32];
    snprintf(name, sizeof name, "graph-%s", stage);
    dump_file(f, spec, name, "txt", text);
    dump_file(f, spec, name, "dot", dot);
    free(text);
    free(dot);
}

typedef struct {
    const kiln_fn *f;
    int spec;
} dump_target;

/* plan_options.dump: each kernel's text, and its LLVM IR before and after. */
static void dump_stage(void *ctx, int kernel, const char *stage, const char *text)
{
    dump_target *t = ctx;
    bool kernel_text = !strcmp(stage, "kernel"), cuda = !strcmp(stage, "cuda");
    bool wanted = kernel_text ? t->f->dump_kernels : cuda ? t->f->dump_cuda : t->f->dump_llvm;
    if (!wanted)
        return;
    char name[64];
    if (kernel_text)
        snprintf(name, sizeof name, "kernel-%d", kernel);
    else
        snprintf(name, sizeof name, "kernel-%d.%s", kernel, stage);
    dump_file(t->f, t->spec, name, kernel_text ? "txt" : cuda ? "cu" : "ll", text);
}

/* How f's graphs are planned and compiled; dumps go to target. */
static plan_options plan_options_of(const kiln_fn *f, const char *sig_text, dump_target *target)
{
    bool dumps = f->dump_kernels || f->dump_llvm || f->dump_cuda;
    return (plan_options){.native = true, .opt_level = f->opts.opt_level, .fast_math = f->opts.fast_math,
                          .no_disk = f->opts.no_cache, .function = f->name, .signature = sig_text, .log = f->log,
                          .dump = dumps ? dump_stage : NULL, .dump_ctx = target};
}

/* Whether f's graphs are compiled into fused kernels: by LLVM for CPU
 * inputs, by NVRTC for CUDA ones. */
static bool compiles_natively(const kiln_fn *f, kiln_device device)
{
    if (f->opts.backend == KILN_BACKEND_AUTO)
        return HAVE_LLVM; /* without it, interpreted, as the first kiln_jit said */
    return device == KILN_CUDA ? f->opts.backend == KILN_BACKEND_NVRTC : f->opts.backend == KILN_BACKEND_LLVM;
}

/* Where a signature's values live: on CUDA when any input is. */
static kiln_device device_of_signature(const kiln_fn *f, const kiln_spec *sig)
{
    for (int i = 0; i < f->n_in; i++)
        if (sig[i].device == KILN_CUDA)
            return KILN_CUDA;
    return KILN_CPU;
}

/* -- Tracing --------------------------------------------------------------- */

/* Checks what the body left in out (n_out slots and a guard slot after). */
static int check_body(const kiln_fn *f, const recorder *rec, int rc, kiln_tensor *const *out,
                      char *why, size_t size)
{
    const char *failure = recorder_failure(rec);
    if (failure) {
        snprintf(why, size, "%s", failure);
        return -1;
    }
    if (rc != 0) {
        snprintf(why, size, "the body returned %d: %s", rc,
                 kiln_last_error()[0] ? kiln_last_error() : "it set no error");
        return -1;
    }
    if (out[f->n_out]) {
        snprintf(why, size, "the body wrote out[%d], past its %d outputs", f->n_out, f->n_out);
        return -1;
    }
    for (int i = 0; i < f->n_out; i++) {
        if (!out[i]) {
            snprintf(why, size, "the body left out[%d] NULL%s%s", i, kiln_last_error()[0] ? ": " : "",
                     kiln_last_error());
            return -1;
        }
        if (out[i]->trace && out[i]->trace != eager_active_trace()) {
            snprintf(why, size, "out[%d] is a tracer of another trace ('%s')", i, out[i]->trace->name);
            return -1;
        }
    }
    return 0;
}

/* Runs the body on tracers of sig; the graph and its captures on success. */
static ir_graph *trace_body(kiln_fn *f, const kiln_spec *sig, kiln_tensor ***captures, int *n_captures)
{
    recorder *rec = recorder_new(f->name);
    kiln_tensor **tracers = calloc((size_t)f->n_in + 1, sizeof *tracers);
    kiln_tensor **out = calloc((size_t)f->n_out + 1, sizeof *out);
    int made = 0;
    for (; rec && tracers && made < f->n_in; made++)
        if (!(tracers[made] = recorder_input(rec, made, &sig[made])))
            break;
    if (!rec || !tracers || !out || made < f->n_in) {
        for (int i = 0; tracers && i < made; i++)
            kiln_release(tracers[i]);
        if (rec)
            recorder_release(rec);
        free(tracers);
        free(out);
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name);
        return NULL;
    }
    kiln_clear_error();
    recorder_activate(rec);
    kiln_scope_begin();
    int rc = f->body(tracers, out, f->user);
    char why[1024];
    int status = check_body(f, rec, rc, out, why, sizeof why);
    for (int i = 0; i < f->n_out && status == 0; i++)
        status = recorder_output(rec, out[i]);
    kiln_scope_end();
    recorder_finish(rec);
    for (int i = 0; i < f->n_in; i++)
        kiln_release(tracers[i]);
    free(tracers);
    free(out);
    ir_graph *g = status == 0 ? recorder_take_graph(rec, captures, n_captures) : NULL;
    recorder_release(rec);
    if (status < 0 && why[0])
        core_fail(CORE_STATE, "kiln_call", "tracing '%s' failed: %s", f->name, why);
    else if (!g && status == 0)
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name);
    return g;
}

static int optimise(const kiln_fn *f, ir_graph **g)
{
    if (f->opts.opt_level == 0)
        return 0;
    char err[512] = "";
    ir_pass_options opt = {.eval = interp_eval_const, .fast_math = f->opts.fast_math};
#ifndef NDEBUG
    opt.verify = true;
#endif
    if (ir_optimize(g, &opt, err, sizeof err) < 0)
        return core_fail(CORE_STATE, "kiln_call", "optimising '%s' failed: %s", f->name, err);
    return 0;
}

/* Bytes of the values g's body made when traced: eager holds them all until
 * the body returns, so this is eager's peak for it. */
static int64_t eager_bytes(const ir_graph *g)
{
    int64_t bytes = 0;
    for (ir_ref r = 0; r < g->count; r++)
        if (ir_node_computes(&g->nodes[r]))
            bytes += ir_node_numel(&g->nodes[r]) * (int64_t)kiln_dtype_size(g->nodes[r].dtype);
    return bytes;
}

/* A specialization counts as a compile when code was generated for it (or it
 * is interpreted), as a disk hit when its kernels came from the disk cache
 * (and from memory) without compiling. */
static void count_plan(kiln_fn *f, const interp_plan *plan)
{
    plan_counts c = interp_counts(plan);
    f->stats.kernels_compiled += c.compiled;
    f->stats.kernels_from_disk += c.from_disk;
    f->stats.kernels_shared += c.shared;
    if (c.compiled > 0 || !interp_is_native(plan))
        f->stats.compiles++;
    else if (c.from_disk > 0)
        f->stats.disk_hits++;
}

/* Traces and plans a new specialization for sig; its index, or a negative error. */
static int specialize(kiln_fn *f, const kiln_spec *sig)
{
    double start = core_now_ms();
    char change[512], sig_text[512];
    describe_change(f, sig, change, sizeof change);
    signature_text(f, sig, sig_text, sizeof sig_text);
    jit_log(f, "tracing for (%s): %s", sig_text, f->n_specs ? change : "first call");
    f->stats.traces++;
    kiln_tensor **captures = NULL;
    int n_captures = 0;
    ir_graph *g = trace_body(f, sig, &captures, &n_captures);
    if (!g) {
        if (++f->trace_failures >= FAILED_TRACES_BEFORE_EAGER && !f->opts.strict) {
            f->eager_only = true;
            fprintf(stderr, "kiln: '%s' failed to trace %d times; running it eagerly from now on\n",
                    f->name, f->trace_failures);
        }
        return -CORE_STATE;
    }
    uint32_t traced_nodes = g->count;
    int64_t eager_peak = eager_bytes(g);
    dump_graph(f, f->n_specs, "before", g);
    int status = optimise(f, &g);
    if (status < 0) {
        ir_graph_free(g);
        for (int i = 0; i < n_captures; i++)
            kiln_release(captures[i]);
        free(captures);
        return status;
    }
    dump_graph(f, f->n_specs, "after", g);
    kiln_spec *inputs = malloc((size_t)(f->n_in ? f->n_in : 1) * sizeof *inputs);
    dump_target target = {f, f->n_specs};
    plan_options po = plan_options_of(f, sig_text, &target);
    po.device = device_of_signature(f, sig);
    po.native = compiles_natively(f, po.device);
    char why[512];
    if (!inputs) {
        ir_graph_free(g);
        for (int i = 0; i < n_captures; i++)
            kiln_release(captures[i]);
        free(captures);
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory preparing '%s'", f->name);
    }
    interp_plan *plan = interp_plan_new(g, captures, n_captures, &po, why, sizeof why, &status);
    if (!plan) {
        free(inputs);
        return status;
    }
    if (why[0])
        fprintf(stderr, "kiln: warning: '%s': compiling failed (%s); interpreting this signature\n",
                f->name, why);
    memcpy(inputs, sig, (size_t)f->n_in * sizeof *inputs);
    int k = f->n_specs++;
    f->specs[k] = (specialization){inputs, plan};
    count_plan(f, plan);
    f->stats.kernels = interp_kernels(plan);
    f->stats.peak_bytes = interp_peak_bytes(plan);
    f->stats.products_in_blocks = interp_products_in_blocks(plan);
    f->stats.eager_peak_bytes = eager_peak;
    double ms = core_now_ms() - start;
    f->stats.compile_ms += ms;
    plan_counts c = interp_counts(plan);
    jit_log(f, "traced %u nodes, %u after passes, %d steps (%s: %d kernels compiled, %d from disk, %d shared), "
            "in %.3f ms", traced_nodes, interp_graph(plan)->count, interp_kernels(plan),
            interp_is_native(plan) ? "LLVM" : "interpreted", c.compiled, c.from_disk, c.shared, ms);
    return k;
}

/* -- Running --------------------------------------------------------------- */

static bool shares_input(const kiln_fn *f, kiln_tensor *const *in, const kiln_tensor *t)
{
    for (int i = 0; i < f->n_in; i++)
        if (kiln_shares_storage(in[i], t))
            return true;
    return false;
}

/* The body run eagerly on in; outputs fresh and owned as any op's result. */
static int run_eagerly(const kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    kiln_tensor **body_out = calloc((size_t)f->n_out + 1, sizeof *body_out);
    if (!body_out)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory");
    kiln_scope_begin();
    int rc = f->body(in, body_out, f->user);
    int status = rc == 0 ? 0 : core_fail(CORE_STATE, "kiln_call", "'%s' returned %d: %s", f->name, rc,
                                         kiln_last_error());
    for (int i = 0; i < f->n_out && status == 0; i++) {
        if (!body_out[i])
            status = core_fail(CORE_STATE, "kiln_call", "'%s' left out[%d] NULL", f->name, i);
        else if (!(out[i] = shares_input(f, in, body_out[i]) && !eager_active_trace()
                                ? eager_copy("kiln_call", body_out[i])
                                : kiln_retain(body_out[i])))
            status = -CORE_NOMEM;
    }
    kiln_scope_end();
    for (int i = 0; i < f->n_out; i++) {
        if (status < 0)
            out[i] = (kiln_release(out[i]), NULL);
        else
            eager_own(out[i]);
    }
    free(body_out);
    return status;
}

static int run_spec(kiln_fn *f, const specialization *s, kiln_tensor *const *in, kiln_tensor **out)
{
    int status = interp_run(s->plan, in, out);
    for (int i = 0; i < f->n_out && status == 0; i++)
        eager_own(out[i]);
    return status;
}

static int check_call(const kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    if (!f)
        return core_fail_null("kiln_call", "f");
    if (!in && f->n_in > 0)
        return core_fail_null("kiln_call", "in");
    if (!out && f->n_out > 0)
        return core_fail_null("kiln_call", "out");
    for (int i = 0; i < f->n_out; i++)
        out[i] = NULL;
    for (int i = 0; i < f->n_in; i++) {
        if (in[i] && !in[i]->trace)
            continue; /* a plain eager tensor: nothing to name */
        char what[32];
        snprintf(what, sizeof what, "in[%d]", i);
        if (eager_check_operands("kiln_call", 1, &in[i], (const char *const[]){what}) < 0)
            return -CORE_NULL_ARG;
    }
    return 0;
}

/* The specialization for sig, traced if new; -1 when the call must run eagerly. */
static int lookup(kiln_fn *f, const kiln_spec *sig, int *status)
{
    *status = 0;
    int k = find_spec(f, sig);
    if (k >= 0) {
        f->stats.memory_hits++;
        return k;
    }
    int limit = f->opts.retrace_limit;
    if (f->n_specs < limit)
        return (*status = specialize(f, sig)) < 0 ? -1 : *status;
    char change[512];
    describe_change(f, sig, change, sizeof change);
    if (f->opts.strict) {
        *status = core_fail(CORE_STATE, "kiln_call",
                            "'%s' reached its retrace limit of %d signatures (%s); strict mode "
                            "does not run it eagerly",
                            f->name, limit, change);
        return -1;
    }
    if (!f->warned)
        fprintf(stderr, "kiln: warning: '%s' reached its retrace limit of %d signatures (%s); new "
                        "signatures run eagerly\n", f->name, limit, change);
    f->warned = true;
    f->stats.eager_fallbacks++;
    return -1;
}

int kiln_call(kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    int status = check_call(f, in, out);
    if (status < 0)
        return status;
    if (eager_active_trace()) /* called from a body being traced: inline it */
        return run_eagerly(f, in, out);
    if (f->jit_off)
        return run_eagerly(f, in, out);
    kiln_spec stack_sig[STACK_INPUTS];
    kiln_spec *sig = f->n_in <= STACK_INPUTS ? stack_sig : malloc((size_t)f->n_in * sizeof *sig);
    if (!sig)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory");
    for (int i = 0; i < f->n_in; i++)
        sig[i] = kiln_spec_of(in[i]);
    pthread_mutex_lock(&f->lock);
    int k = -1;
    if (f->eager_only)
        f->stats.eager_fallbacks++;
    else if ((k = lookup(f, sig, &status)) >= 0)
        f->last = k;
    specialization spec = k >= 0 ? f->specs[k] : (specialization){0};
    pthread_mutex_unlock(&f->lock);
    if (sig != stack_sig)
        free(sig);
    if (k >= 0)
        return run_spec(f, &spec, in, out);
    return status < 0 ? status : run_eagerly(f, in, out);
}

/* -- Life of a marked function --------------------------------------------- */

kiln_jit_options kiln_jit_defaults(void)
{
    return (kiln_jit_options){.backend = KILN_BACKEND_AUTO, .opt_level = 2, .retrace_limit = 8};
}

static int check_options(const kiln_jit_options *o)
{
#ifndef KILN_HAVE_LLVM
    if (o->backend == KILN_BACKEND_LLVM)
        return core_fail(CORE_DEVICE, "kiln_jit", "the LLVM backend is not in this build of kiln");
#endif
    if (o->backend == KILN_BACKEND_NVRTC)
        return core_fail(CORE_DEVICE, "kiln_jit", "the NVRTC backend is not in this build of kiln");
    if ((unsigned)o->backend > KILN_BACKEND_INTERP || o->opt_level < 0 || o->opt_level > 3 ||
        o->retrace_limit < 0)
        return core_fail(CORE_VALUE, "kiln_jit", "bad options: backend %d, opt_level %d, retrace_limit %d",
                         (int)o->backend, o->opt_level, o->retrace_limit);
    return 0;
}

/* Said once, at the first kiln_jit of a build without LLVM, so that nobody
 * learns it from the times. */
static void say_interpreted(void)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        fprintf(stderr, "kiln: this build has no LLVM backend (configured without LLVM >= 15): "
                        "marked functions will be interpreted\n");
}

kiln_fn *kiln_jit(const char *name, kiln_body body, int n_in, int n_out, void *user,
                  const kiln_jit_options *opts)
{
    kiln_jit_options o = opts ? *opts : kiln_jit_defaults();
    if (!body) {
        core_fail_null("kiln_jit", "body");
        return NULL;
    }
    if (n_in < 0 || n_out < 0 || n_in > 1024 || n_out > 1024) {
        core_fail(CORE_VALUE, "kiln_jit", "'%s': %d inputs and %d outputs (0..1024 each)",
                  name ? name : "?", n_in, n_out);
        return NULL;
    }
    if (check_options(&o) < 0)
        return NULL;
    if (o.retrace_limit == 0)
        o.retrace_limit = 8;
    kiln_fn *f = calloc(1, sizeof *f);
    if (f)
        f->specs = calloc((size_t)o.retrace_limit, sizeof *f->specs);
    if (!f || !f->specs) {
        free(f);
        core_fail(CORE_NOMEM, "kiln_jit", "out of memory");
        return NULL;
    }
    snprintf(f->name, sizeof f->name, "%s", name && *name ? name : "anonymous");
    f->body = body;
    f->n_in = n_in;
    f->n_out = n_out;
    f->user = user;
    f->opts = o;
    f->jit_off = core_env_int("KILN_JIT", 1) == 0;
    f->log = core_env_int("KILN_LOG", 0) != 0;
    const char *dump = getenv("KILN_DUMP");
    f->dump_graph = dump && strstr(dump, "graph");
    f->dump_kernels = dump && strstr(dump, "kernels");
    f->dump_llvm = dump && strstr(dump, "llvm");
    f->dump_cuda = dump && strstr(dump, "cuda");
    const char *dir = getenv("KILN_DUMP_DIR");
    snprintf(f->dump_dir, sizeof f->dump_dir, "%s", dir && *dir ? dir : ".");
    pthread_mutex_init(&f->lock, NULL);
    if (!HAVE_LLVM && o.backend == KILN_BACKEND_AUTO && !f->jit_off)
        say_interpreted();
    return f;
}

void kiln_fn_free(kiln_fn *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_specs; i++) {
        interp_plan_free(f->specs[i].plan);
        free(f->specs[i].inputs);
    }
    free(f->specs);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

int kiln_fn_stats(const kiln_fn *f, kiln_fn_stats_t *s)
{
    if (!f || !s)
        return core_fail_null("kiln_fn_stats", !f ? "f" : "s");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    *s = f->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return 0;
}

const char *kiln_fn_backend(const kiln_fn *f)
{
    if (!f) {
        core_fail_null("kiln_fn_backend", "f");
        return NULL;
    }
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    const interp_plan *plan = f->n_specs ? f->specs[f->last].plan : NULL;
    const char *name = !plan                      ? NULL
                       : !interp_is_native(plan) ? "interp"
                       : interp_device(plan) == KILN_CUDA ? "nvrtc"
                                                          : "llvm";
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return name;
}

char *kiln_fn_graph_text(const kiln_fn *f)
{
    if (!f) {
        core_fail_null("kiln_fn_graph_text", "f");
        return NULL;
    }
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    char *text = f->n_specs ? ir_to_text(interp_graph(f->specs[f->last].plan)) : NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return text;
}

static int check_spec(const kiln_spec *s, int i)
{
    if ((unsigned)s->dtype > KILN_BOOL || s->ndim < 0 || s->ndim > KILN_MAX_DIMS ||
        (s->device != KILN_CPU && s->device != KILN_CUDA))
        return core_fail(CORE_VALUE, "kiln_fn_precompile", "spec %d: dtype %d, ndim %d, device %d",
                         i, (int)s->dtype, s->ndim, (int)s->device);
    int64_t nonzero = 1;
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] < 0)
            return core_fail(CORE_VALUE, "kiln_fn_precompile", "spec %d has a negative size", i);
        if (s->shape[d] > 0 && nonzero > (INT64_C(1) << 59) / s->shape[d])
            return core_fail(CORE_VALUE, "kiln_fn_precompile", "spec %d has too many elements", i);
        nonzero *= s->shape[d] > 0 ? s->shape[d] : 1;
    }
    return 0;
}

/* Compiles f's kernels for sig for another CPU or a GPU into the disk cache. */
static int precompile_elsewhere(kiln_fn *f, const kiln_spec *sig, const char *target)
{
    char sig_text[512], why[1024] = "";
    signature_text(f, sig, sig_text, sizeof sig_text);
    kiln_tensor **captures = NULL;
    int n_captures = 0;
    ir_graph *g = trace_body(f, sig, &captures, &n_captures);
    int status = g ? optimise(f, &g) : -CORE_STATE;
    dump_target dumps = {f, f->n_specs};
    plan_options po = plan_options_of(f, sig_text, &dumps);
    plan_counts counts = {0};
    if (status == 0 && interp_compile_for(g, &po, target, &counts, why, sizeof why) < 0)
        status = core_fail(CORE_DEVICE, "kiln_fn_precompile", "'%s' for %s: %s", f->name, target, why);
    if (status == 0) {
        f->stats.kernels_compiled += counts.compiled;
        f->stats.kernels_from_disk += counts.from_disk;
        jit_log(f, "precompiled (%s) for %s: %d kernels compiled, %d already in the disk cache", sig_text, target,
                counts.compiled, counts.from_disk);
    }
    ir_graph_free(g);
    for (int i = 0; i < n_captures; i++)
        kiln_release(captures[i]);
    free(captures);
    return status;
}

int kiln_fn_precompile(kiln_fn *f, const kiln_spec *in, const char *target)
{
    if (!f || (!in && f->n_in > 0) || !target)
        return core_fail_null("kiln_fn_precompile", !f ? "f" : !target ? "target" : "in");
    bool cpu = !strncmp(target, "cpu:", 4), cuda = !strncmp(target, "cuda:", 5);
    if (strcmp(target, "host") != 0 && !cpu && !cuda)
        return core_fail(CORE_DEVICE, "kiln_fn_precompile",
                         "target \"%s\" is not \"host\", \"cpu:<LLVM CPU name>\", \"cpu:<name>:<features>\" "
                         "or \"cuda:sm_XX\"", target);
    if (cpu && !compiles_natively(f, KILN_CPU))
        return core_fail(CORE_DEVICE, "kiln_fn_precompile",
                         "target \"%s\" needs the LLVM backend, and '%s' does not use it", target, f->name);
#ifndef KILN_HAVE_LLVM
    if (cuda)
        return core_fail(CORE_DEVICE, "kiln_fn_precompile", "target \"%s\": this build of kiln has no kernel cache "
                         "(it comes with the LLVM backend)", target);
#endif
    for (int i = 0; i < f->n_in; i++)
        if (check_spec(&in[i], i) < 0)
            return -CORE_VALUE;
    pthread_mutex_lock(&f->lock);
    int status = 0;
    if (cpu || cuda)
        status = precompile_elsewhere(f, in, target);
    else if (find_spec(f, in) < 0)
        lookup(f, in, &status);
    pthread_mutex_unlock(&f->lock);
    return status < 0 ? status : 0;
}

const char *kiln_host_target(void)
{
#ifdef KILN_HAVE_LLVM
    const char *name = cache_host_target();
    if (name)
        return name;
    core_fail(CORE_DEVICE, "kiln_host_target", "the LLVM backend cannot start on this machine");
#else
    core_fail(CORE_DEVICE, "kiln_host_target", "this build of kiln has no LLVM backend");
#endif
    return NULL;
}
