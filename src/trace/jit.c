/* Marked functions: signatures, specializations, tracing, eager fallback and
 * the counters of kiln_fn_stats.
 *
 * A specialization serves the calls that pass its guards (kiln.h's
 * kiln_dynamic): per input a dtype, rank and device, and per axis a fixed
 * size or a symbol, whose values the call's sizes give. Guards are checked
 * in order of last use, the most recent first.
 *
 * A function's lock guards its specializations and counters and is held
 * only to look them up or change them: never while a body runs, a graph is
 * planned or a kernel compiles. A specialization being built is in flight:
 * a thread calling with the same signature waits for it, threads with other
 * signatures (and bodies asking for their own function's stats) go on. */
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/kernels.h"
#include "trace/internal.h"

typedef struct {
    kiln_spec *inputs;   /* the signature it was traced for */
    uint32_t *asked;     /* per input: the axes it was asked to keep symbolic */
    segment *root;       /* its first segment, whose guards are its own; NULL while in flight */
    int n_symbols;
    int serial;          /* names its dumps */
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
    pthread_mutex_t lock;          /* guards everything below (see the top) */
    pthread_cond_t built;          /* a specialization in flight was built, or dropped */
    specialization **specs;        /* each made once and never moved; retrace_limit of them at most */
    int n_specs, specs_cap, last, serials;
    uint32_t *dynamic_dims;        /* per input: the options' marks, then AUTO's (NULL: none) */
    kiln_fn_stats_t stats;
    int trace_failures;
    bool eager_only, warned, warned_untraceable, warned_alias;
    void (*free_user)(void *);     /* jit_adopt: frees user with f */
    char **io_names;               /* n_in then n_out names, made on first ask unless adopted */
};

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
    s.dtype = t->dtype;
    s.ndim = t->ndim;
    s.device = t->device;
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

/* Whether a call of signature sig passes s's guards, which it then gives
 * its symbols' values (IR_MAX_SYMBOLS of them). */
static bool passes(const kiln_fn *f, const specialization *s, const kiln_spec *sig, int64_t *symbols)
{
    return guards_pass(s->root->guards, f->n_in, sig, symbols);
}

/* Whether s was asked to keep symbolic every axis sig marks. */
static bool covers(const kiln_fn *f, const specialization *s, const kiln_spec *sig)
{
    for (int i = 0; i < f->n_in; i++)
        if (sig[i].dynamic & ~s->asked[i])
            return false;
    return true;
}

/* The built specialization whose guards sig passes, the last one used
 * first, with its symbols' values; or -1. */
static int find_spec(const kiln_fn *f, const kiln_spec *sig, int64_t *symbols)
{
    for (int k = 0; k < f->n_specs; k++) {
        int i = f->last + k < f->n_specs ? f->last + k : f->last + k - f->n_specs; /* no division per call */
        const specialization *s = f->specs[i];
        if (s->root && passes(f, s, sig, symbols) && covers(f, s, sig))
            return i;
    }
    return -1;
}

/* A specialization being built for exactly sig, or -1. */
static int find_in_flight(const kiln_fn *f, const kiln_spec *sig)
{
    for (int i = 0; i < f->n_specs; i++) {
        bool same = !f->specs[i]->root;
        for (int j = 0; j < f->n_in && same; j++)
            same = spec_equal(&f->specs[i]->inputs[j], &sig[j]) && f->specs[i]->inputs[j].dynamic == sig[j].dynamic;
        if (same)
            return i;
    }
    return -1;
}

/* Whether sig has the dtypes, ranks and devices of built specialization s. */
static bool same_structure(const kiln_fn *f, const specialization *s, const kiln_spec *sig)
{
    const guard *g = s->root->guards;
    for (int i = 0; i < f->n_in; i++)
        if (g[i].dtype != sig[i].dtype || g[i].ndim != sig[i].ndim || g[i].device != sig[i].device)
            return false;
    return true;
}

/* Under the lock: sig passed no specialization's guards. When one had its
 * dtypes, ranks and devices, that is a guard failure, and under AUTO the
 * axes whose fixed sizes differ become symbolic for the traces to come. */
static void note_miss(kiln_fn *f, const kiln_spec *sig)
{
    for (int k = 0; k < f->n_specs; k++) {
        const specialization *s = f->specs[(f->last + k) % f->n_specs];
        if (!s->root || !same_structure(f, s, sig))
            continue;
        f->stats.guard_failures++;
        for (int i = 0; i < f->n_in && f->opts.dynamic == KILN_DYNAMIC_AUTO; i++) {
            for (int d = 0; d < sig[i].ndim; d++) {
                int64_t was = s->root->guards[i].dims[d], now = sig[i].shape[d];
                if (was < 0 || was == now || (f->dynamic_dims[i] & (1u << d)))
                    continue;
                f->dynamic_dims[i] |= 1u << d;
                jit_log(f, "input %d axis %d changed size %lld -> %lld: traced as symbolic from now on", i, d,
                        (long long)was, (long long)now);
            }
        }
        return;
    }
}

/* The axes a trace for sig is asked to keep symbolic, into asked (n_in). */
static void asked_axes(const kiln_fn *f, const kiln_spec *sig, uint32_t *asked)
{
    for (int i = 0; i < f->n_in; i++)
        asked[i] = f->opts.dynamic == KILN_DYNAMIC_NEVER ? 0 : f->dynamic_dims[i] | sig[i].dynamic;
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
    const kiln_spec *old = f->specs[f->last]->inputs;
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
    if (!text || core_write_file(path, text, strlen(text), 0666) < 0)
        fprintf(stderr, "kiln: '%s': cannot write the dump %s: %s\n", f->name, path,
                text ? strerror(errno) : "out of memory");
}

static void dump_graph(const kiln_fn *f, int spec, const char *stage, const ir_graph *g)
{
    if (!f->dump_graph)
        return;
    char *text = ir_to_text(g), *dot = ir_to_dot(g, f->name);
    char name[48];
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

/* exec_options.dump: each kernel's text, and its backend's stages. */
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
static exec_options exec_options_of(const kiln_fn *f, const char *sig_text, dump_target *target)
{
    bool dumps = f->dump_kernels || f->dump_llvm || f->dump_cuda;
    return (exec_options){.compiled = true, .opt_level = f->opts.opt_level, .fast_math = f->opts.fast_math,
                          .no_disk = f->opts.no_cache, .function = f->name, .signature = sig_text, .log = f->log,
                          .dump = dumps ? dump_stage : NULL, .dump_ctx = target};
}

/* The backend option's device, or -1 for AUTO and INTERP. */
static int backend_device(const kiln_fn *f)
{
    switch (f->opts.backend) {
    case KILN_BACKEND_LLVM: return KILN_CPU;
    case KILN_BACKEND_NVRTC: return KILN_CUDA;
    default: return -1;
    }
}

/* Whether f's graphs on device are compiled into fused kernels (by the
 * backend of that device); 0 when interpreted, or an error when f asks for
 * a backend of another device. */
static int compiled_on(const kiln_fn *f, kiln_device device, bool *compiled)
{
    int wanted = backend_device(f);
    /* AUTO without LLVM interprets CPU inputs, as the first kiln_jit said. */
    *compiled = (f->opts.backend == KILN_BACKEND_AUTO && (device == KILN_CUDA || kernels_backend_for(KILN_CPU))) || wanted == (int)device;
    if (wanted < 0 || wanted == (int)device)
        return 0;
    return core_fail(CORE_DEVICE, "kiln_call", "'%s' uses the %s backend, which runs on %s, and its inputs are on %s "
                     "(move them with kiln_to_device)", f->name, wanted == KILN_CUDA ? "NVRTC" : "LLVM",
                     wanted == KILN_CUDA ? "CUDA" : "the CPU", device == KILN_CUDA ? "CUDA" : "the CPU");
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

/* Bytes of the values g's body made when traced: eager holds them all until
 * the body returns, so this is eager's peak for it. */
static int64_t eager_bytes(const ir_graph *g)
{
    int64_t bytes = 0;
    for (ir_ref r = 0; r < g->count; r++)
        if (ir_node_computes(&g->nodes[r]))
            bytes = core_bytes_add(bytes, ir_node_numel(&g->nodes[r]) * (int64_t)kiln_dtype_size(g->nodes[r].dtype));
    return bytes;
}

static void release_captures(kiln_tensor **captures, int n_captures)
{
    for (int i = 0; i < n_captures; i++)
        eager_unhold(captures[i]);
    free(captures);
}

/* Simplifies g for f's signature, compiled or interpreted. */
static int optimise(const kiln_fn *f, ir_graph **g, bool compiled)
{
    if (f->opts.opt_level == 0)
        return 0;
    char err[512] = "";
    /* The interpreter stays bit for bit eager's: it is what tests compare against. */
    ir_pass_options opt = {.eval = eager_eval_const, .fast_math = f->opts.fast_math, .transcendental = compiled,
                           .transpose_products = compiled, .long_rows = compiled};
#ifndef NDEBUG
    opt.verify = true;
#endif
    if (ir_optimize(g, &opt, err, sizeof err) < 0)
        return core_fail(CORE_STATE, "kiln_call", "optimising '%s' failed: %s", f->name, err);
    return 0;
}

/* g traced with the axes asked (per input) kept symbolic where they can be;
 * NULL with the error set. */
static ir_graph *symbolize(const kiln_fn *f, const ir_graph *g, const uint32_t *asked, const bool *shape_read)
{
    char *log = NULL;
    ir_graph *symbolic = ir_symbolize(g, asked, shape_read, &log);
    for (char *line = log, *end; line && *line; line = end + 1) {
        end = strchr(line, '\n');
        *end = '\0';
        jit_log(f, "%s", line);
    }
    free(log);
    if (!symbolic)
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name);
    return symbolic;
}

/* A specialization counts as a compile when code was generated for it (or it
 * is interpreted), as a disk hit when its kernels came from the disk cache
 * (and from memory) without compiling. Under the lock. */
static void count_exec(kiln_fn *f, const executable *x)
{
    exec_counts c = exec_kernel_counts(x);
    f->stats.kernels_compiled += c.compiled;
    f->stats.kernels_from_disk += c.from_disk;
    f->stats.kernels_shared += c.shared;
    if (c.compiled > 0 || !strcmp(exec_backend_name(x), "interp"))
        f->stats.compiles++;
    else if (c.from_disk > 0)
        f->stats.disk_hits++;
    f->stats.kernels = exec_steps(x);
    f->stats.peak_bytes = exec_peak_bytes(x);
    f->stats.products_in_blocks = exec_products_in_blocks(x);
}

/* A trace in progress, and the segments its breaks made (path.c). */
typedef struct {
    kiln_fn *f;
    int serial;                 /* the specialization's: names its dumps */
    const kiln_spec *sig;       /* the call's signature */
    kiln_tensor *const *in;     /* the call's inputs; NULL: the trace cannot break */
    uint32_t *asked;            /* per input of the next segment: the axes to keep symbolic */
    kiln_tensor **carried;      /* the real values the last segment carried on */
    int n_carried;
    segment *first, *last;      /* the path so far */
    void *key;                  /* what the last read gave: the branch to the next segment */
    size_t key_size;
    int n_symbols;              /* the first segment's */
    uint32_t nodes;             /* traced so far, over the segments */
    int breaks;
    double start;
} tracing;

static void tracing_free(tracing *t)
{
    for (int i = 0; i < t->n_carried; i++)
        kiln_release(t->carried[i]);
    free(t->carried);
    free(t->asked);
    free(t->key);
    segment_free_tree(t->first);
}

static kiln_spec *specs_of(kiln_tensor *const *in, int n)
{
    kiln_spec *sig = malloc((size_t)(n ? n : 1) * sizeof *sig);
    for (int i = 0; sig && i < n; i++)
        sig[i] = kiln_spec_of(in[i]);
    if (!sig)
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing");
    return sig;
}

/* The axes the next segment keeps symbolic: those of the values symbolic g
 * carries on (its outputs after the first). -1 when out of memory. */
static int ask_carried(tracing *t, const ir_graph *g)
{
    uint32_t *asked = calloc((size_t)g->n_outputs + 1, sizeof *asked);
    if (!asked)
        return -1;
    for (int i = 1; i < g->n_outputs; i++)
        for (int d = 0; d < g->nodes[g->outputs[i]].ndim; d++)
            if (g->nodes[g->outputs[i]].shape[d] < 0)
                asked[i - 1] |= 1u << d;
    free(t->asked);
    t->asked = asked;
    return 0;
}

/* Optimises symbolic graph sym (taken) and makes it an executable with
 * captures (borrowed): NULL with the error set. */
static executable *make_exec(tracing *t, ir_graph *sym, kiln_tensor *const *captures, int n_captures)
{
    kiln_fn *f = t->f;
    char sig_text[512], why[512], stage[32];
    signature_text(f, t->sig, sig_text, sizeof sig_text);
    snprintf(stage, sizeof stage, t->breaks ? "segment%d-before" : "before", t->breaks);
    dump_graph(f, t->serial, stage, sym);
    kiln_tensor **own = malloc((size_t)(n_captures ? n_captures : 1) * sizeof *own);
    dump_target target = {f, t->serial};
    exec_options o = exec_options_of(f, sig_text, &target);
    o.device = device_of_signature(f, t->sig);
    int status = own ? compiled_on(f, o.device, &o.compiled)
                     : core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name);
    if (status == 0)
        status = optimise(f, &sym, o.compiled);
    if (status < 0) {
        ir_graph_free(sym);
        free(own);
        return NULL;
    }
    snprintf(stage, sizeof stage, t->breaks ? "segment%d-after" : "after", t->breaks);
    dump_graph(f, t->serial, stage, sym);
    for (int i = 0; i < n_captures; i++)
        own[i] = eager_hold(captures[i]);
    executable *x = exec_new(sym, own, n_captures, &o, why, sizeof why, &status);
    if (x && why[0])
        fprintf(stderr, "kiln: warning: '%s': compiling failed (%s); interpreting this signature\n", f->name, why);
    return x;
}

/* Traced graph g (borrowed), whose n_inputs inputs have signature sig, as the
 * next segment of t, linked after the last: NULL with the error set. */
static segment *add_segment(tracing *t, const ir_graph *g, kiln_tensor *const *captures, int n_captures,
                            const bool *shape_read, const kiln_spec *sig, int n_inputs, bool last)
{
    kiln_fn *f = t->f;
    ir_graph *sym = symbolize(f, g, t->asked, shape_read);
    guard *guards = malloc((size_t)(n_inputs ? n_inputs : 1) * sizeof *guards);
    if (!sym || !guards || (!last && ask_carried(t, sym) < 0)) {
        ir_graph_free(sym);
        free(guards);
        return NULL;
    }
    guards_of(sym, n_inputs, sig, guards);
    if (!t->first)
        t->n_symbols = sym->n_symbols;
    executable *x = make_exec(t, sym, captures, n_captures);
    if (!x) {
        free(guards);
        return NULL;
    }
    segment *seg = segment_new(x, guards, n_inputs, last);
    if (seg && t->last && segment_branch(t->last, t->key, t->key_size, seg) < 0) {
        segment_free_tree(seg);
        seg = NULL;
    }
    if (!seg)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name), NULL;
    if (t->last)
        t->key = NULL;
    else
        t->first = seg;
    t->last = seg;
    t->nodes += g->count;
    exec_counts c = exec_kernel_counts(x);
    jit_log(f, "traced %u nodes%s, %u after passes: %d kernels a call, %d of them fused (%s: %d compiled, %d from "
            "disk, %d shared), in %.3f ms", g->count, t->breaks ? " in this segment" : "", exec_graph(x)->count,
            exec_steps(x), exec_fused_kernels(x), exec_backend_name(x), c.compiled, c.from_disk, c.shared,
            core_now_ms() - t->start);
    pthread_mutex_lock(&f->lock);
    count_exec(f, x);
    f->stats.segments++;
    pthread_mutex_unlock(&f->lock);
    return seg;
}

/* Runs segment seg on inputs (n of them) into outs; 0 or an error. */
static int run_segment(const segment *seg, kiln_tensor *const *inputs, int n, kiln_tensor **outs)
{
    int64_t symbols[IR_MAX_SYMBOLS];
    kiln_spec *sig = specs_of(inputs, n);
    int status = !sig ? -CORE_NOMEM
                 : guards_pass(seg->guards, n, sig, symbols)
                     ? exec_run(seg->exec, inputs, symbols, outs)
                     : core_internal("kiln_call", "a segment's guards fail on the values it was traced for");
    free(sig);
    return status;
}

/* recorder_break_fn: the graph up to the read becomes a segment, run on real
 * data; the value read is its first output, and the others go on to the
 * next segment. */
static kiln_tensor *on_break(void *ctx, const ir_graph *g, kiln_tensor *const *captures, int n_captures,
                             const bool *shape_read, const char *fn)
{
    tracing *t = ctx;
    kiln_fn *f = t->f;
    kiln_tensor *const *inputs = t->first ? t->carried : t->in;
    int n_inputs = t->first ? t->n_carried : f->n_in;
    kiln_spec *sig = specs_of(inputs, n_inputs);
    segment *seg = sig ? add_segment(t, g, captures, n_captures, shape_read, sig, n_inputs, false) : NULL;
    free(sig);
    kiln_tensor **outs = seg ? calloc((size_t)g->n_outputs, sizeof *outs) : NULL;
    if (seg && !outs)
        core_fail(CORE_NOMEM, fn, "out of memory tracing '%s'", f->name);
    eager_trace *trace = eager_active_trace(); /* the segment runs on real data, not traced */
    eager_trace_activate(NULL);
    bool ran = outs && run_segment(seg, inputs, n_inputs, outs) == 0 && (t->key = segment_key(outs[0], &t->key_size));
    eager_trace_activate(trace);
    if (!ran) {
        for (int i = 0; outs && i < g->n_outputs; i++)
            kiln_release(outs[i]);
        free(outs);
        return NULL;
    }
    for (int i = 0; i < t->n_carried; i++)
        kiln_release(t->carried[i]);
    free(t->carried);
    t->carried = outs;
    kiln_tensor *value = outs[0];
    memmove(outs, outs + 1, (size_t)(g->n_outputs - 1) * sizeof *outs);
    t->n_carried = g->n_outputs - 1;
    t->breaks++;
    jit_log(f, "graph break after %u traced ops: %s read a traced value; the trace goes on as segment %d, "
            "carrying %d values", t->nodes, fn, t->breaks, t->n_carried);
    pthread_mutex_lock(&f->lock);
    f->stats.graph_breaks++;
    pthread_mutex_unlock(&f->lock);
    return value;
}

/* Runs f's body on tracers of t->sig, breaking at reads where t allows: its
 * last graph (the whole trace when it never broke), with its captures and
 * shape reads; NULL with the error set. */
static ir_graph *record_body(tracing *t, kiln_tensor ***captures, int *n_captures, bool **shape_read)
{
    kiln_fn *f = t->f;
    recorder *rec = recorder_new(f->name);
    kiln_tensor **tracers = calloc((size_t)f->n_in + 1, sizeof *tracers);
    kiln_tensor **out = calloc((size_t)f->n_out + 1, sizeof *out);
    char why[1024] = "";
    int made = 0;
    for (; rec && tracers && made < f->n_in; made++)
        if (!(tracers[made] = recorder_input(rec, made, &t->sig[made])))
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
    if (t->in)
        recorder_set_break(rec, on_break, t);
    kiln_clear_error();
    recorder_activate(rec);
    kiln_scope_begin();
    int rc = f->body(tracers, out, f->user);
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
    *shape_read = g ? recorder_shape_reads(rec, g) : NULL;
    recorder_release(rec);
    if (status < 0 && why[0])
        core_fail(CORE_STATE, "kiln_call", "tracing '%s' failed: %s", f->name, why);
    else if ((!g || !*shape_read) && status == 0)
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name);
    if (g && !*shape_read) {
        ir_graph_free(g);
        release_captures(*captures, *n_captures);
        g = NULL;
    }
    return g;
}

/* What building a specialization (or a path of one) found beside its root. */
typedef struct {
    int n_symbols;
    int64_t eager_peak;  /* the body's values, as eager holds them */
    bool untraceable;    /* the body could not be traced */
    bool ran;            /* the trace broke and ran: out has the call's outputs */
} built;

/* Traces f's body for sig with the axes asked kept symbolic where they can
 * be, as specialization serial: outside the lock. When in (the call's inputs)
 * is given and f is not strict, a read of a traced value breaks the trace;
 * if one did, every segment has run on in, and out has the call's outputs
 * (b->ran). The root segment, or NULL with the error set. */
static segment *build(kiln_fn *f, int serial, const kiln_spec *sig, const uint32_t *asked, kiln_tensor *const *in,
                      kiln_tensor **out, built *b)
{
    tracing t = {.f = f, .serial = serial, .sig = sig, .in = f->opts.strict ? NULL : in, .start = core_now_ms()};
    t.asked = malloc((size_t)(f->n_in ? f->n_in : 1) * sizeof *t.asked);
    kiln_tensor **captures = NULL;
    int n_captures = 0;
    bool *shape_read = NULL;
    ir_graph *g = t.asked ? (memcpy(t.asked, asked, (size_t)f->n_in * sizeof *asked), record_body(&t, &captures, &n_captures, &shape_read))
                          : (core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", f->name), NULL);
    b->untraceable = !g;
    kiln_spec *last_sig = g && t.first ? specs_of(t.carried, t.n_carried) : NULL;
    segment *last = g && (!t.first || last_sig)
                        ? add_segment(&t, g, captures, n_captures, shape_read, t.first ? last_sig : sig,
                                      t.first ? t.n_carried : f->n_in, true)
                        : NULL;
    if (g)
        b->eager_peak = eager_bytes(g);
    ir_graph_free(g);
    free(shape_read);
    free(last_sig);
    if (g)
        release_captures(captures, n_captures);
    if (last && t.breaks) {
        b->ran = run_segment(last, t.carried, t.n_carried, out) == 0;
        for (int i = 0; b->ran && i < f->n_out; i++)
            eager_own(out[i]);
        if (!b->ran)
            last = NULL;
    }
    segment *root = last ? t.first : NULL;
    if (root)
        t.first = NULL;
    b->n_symbols = t.n_symbols;
    tracing_free(&t);
    return root;
}

static void spec_free(specialization *s)
{
    if (!s)
        return;
    segment_free_tree(s->root);
    free(s->inputs);
    free(s->asked);
    free(s);
}

/* Under the lock: a new specialization for sig, in flight, or NULL when out
 * of memory. Other threads' builds may drop specializations before it: it
 * is found by address, never by a position kept across the lock. */
static specialization *reserve(kiln_fn *f, const kiln_spec *sig)
{
    if (f->n_specs == f->specs_cap) {
        int cap = f->specs_cap ? 2 * f->specs_cap : 4;
        specialization **grown = realloc(f->specs, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        f->specs = grown;
        f->specs_cap = cap;
    }
    specialization *s = calloc(1, sizeof *s);
    size_t n = (size_t)(f->n_in ? f->n_in : 1);
    if (s) {
        s->inputs = malloc(n * sizeof *s->inputs);
        s->asked = malloc(n * sizeof *s->asked);
    }
    if (!s || !s->inputs || !s->asked) {
        spec_free(s);
        return NULL;
    }
    memcpy(s->inputs, sig, (size_t)f->n_in * sizeof *s->inputs);
    asked_axes(f, sig, s->asked);
    s->serial = f->serials++;
    f->specs[f->n_specs++] = s;
    return s;
}

static int index_of(const kiln_fn *f, const specialization *s)
{
    int k = 0;
    while (f->specs[k] != s)
        k++;
    return k;
}

/* Under the lock: a body that failed to trace counts towards running eagerly
 * for good. */
static void count_trace_failure(kiln_fn *f)
{
    if (++f->trace_failures >= FAILED_TRACES_BEFORE_EAGER && !f->opts.strict && !f->eager_only) {
        f->eager_only = true;
        fprintf(stderr, "kiln: '%s' failed to trace %d times; running it eagerly from now on\n", f->name,
                f->trace_failures);
    }
}

/* Under the lock: the in-flight specialization s built with root, or
 * dropped. */
static void settle(kiln_fn *f, specialization *s, segment *root, const built *b, double ms)
{
    int k = index_of(f, s);
    f->stats.compile_ms += ms;
    if (root) {
        s->root = root;
        s->n_symbols = b->n_symbols;
        f->last = k;
        f->stats.symbolic += b->n_symbols > 0;
        f->stats.eager_peak_bytes = b->eager_peak;
    } else {
        spec_free(s);
        memmove(&f->specs[k], &f->specs[k + 1], (size_t)(f->n_specs - k - 1) * sizeof *f->specs);
        f->n_specs--;
        if (f->last > k)
            f->last--;
        if (f->last >= f->n_specs)
            f->last = 0;
        if (b->untraceable)
            count_trace_failure(f);
    }
    pthread_cond_broadcast(&f->built);
}

/* Under the lock: a body that failed to trace runs eagerly at once, as it
 * did before it was marked (strict mode keeps the error). 0. */
static int run_this_call_eagerly(kiln_fn *f)
{
    f->stats.eager_fallbacks++;
    jit_log(f, "%s; this call runs eagerly", kiln_last_error());
    if (!f->warned_untraceable)
        fprintf(stderr, "kiln: warning: %s; the call runs eagerly\n", kiln_last_error());
    f->warned_untraceable = true;
    kiln_clear_error();
    return 0;
}

/* Under the lock: a new signature past the retrace limit. NULL, with *status
 * an error in strict mode (else the call runs eagerly). */
static specialization *past_the_limit(kiln_fn *f, const kiln_spec *sig, int *status)
{
    int limit = f->opts.retrace_limit;
    char change[512];
    describe_change(f, sig, change, sizeof change);
    if (f->opts.strict) {
        *status = core_fail(CORE_STATE, "kiln_call", "'%s' reached its retrace limit of %d signatures (%s); "
                            "strict mode does not run it eagerly", f->name, limit, change);
        return NULL;
    }
    if (!f->warned)
        fprintf(stderr, "kiln: warning: '%s' reached its retrace limit of %d signatures (%s); new "
                        "signatures run eagerly\n", f->name, limit, change);
    f->warned = true;
    f->stats.eager_fallbacks++;
    return NULL;
}

/* Under the lock, which it drops while building: the specialization for
 * sig, built if new (on in, when given: a trace that breaks runs, and leaves
 * the outputs in out with *ran set), and the values of its symbols; NULL
 * with *status 0 when the call must run eagerly, or a negative error. */
static specialization *prepare(kiln_fn *f, const kiln_spec *sig, kiln_tensor *const *in, int64_t *symbols,
                               kiln_tensor **out, bool *ran, int *status)
{
    *status = 0;
    *ran = false;
    if (f->eager_only) {
        f->stats.eager_fallbacks++;
        return NULL;
    }
    int k;
    while ((k = find_spec(f, sig, symbols)) < 0 && find_in_flight(f, sig) >= 0)
        pthread_cond_wait(&f->built, &f->lock); /* another thread builds it */
    if (k >= 0) {
        f->stats.memory_hits++;
        f->last = k;
        return f->specs[k];
    }
    note_miss(f, sig);
    if (f->n_specs >= f->opts.retrace_limit)
        return past_the_limit(f, sig, status);
    char change[512], sig_text[512];
    describe_change(f, sig, change, sizeof change);
    signature_text(f, sig, sig_text, sizeof sig_text);
    bool first = f->n_specs == 0;
    specialization *s = reserve(f, sig);
    if (!s) {
        *status = core_fail(CORE_NOMEM, "kiln_call", "out of memory preparing '%s'", f->name);
        return NULL;
    }
    jit_log(f, "tracing for (%s): %s", sig_text, first ? "first call" : change);
    f->stats.traces++;
    pthread_mutex_unlock(&f->lock);
    double start = core_now_ms();
    built b = {0};
    segment *root = build(f, s->serial, sig, s->asked, in, out, &b);
    int failed = root ? 0 : core_error_status();
    pthread_mutex_lock(&f->lock);
    settle(f, s, root, &b, core_now_ms() - start);
    *status = failed;
    if (b.untraceable && !f->opts.strict && in) /* precompiling keeps the error */
        *status = run_this_call_eagerly(f);
    if (!root)
        return NULL;
    *ran = b.ran;
    guards_pass(root->guards, f->n_in, sig, symbols); /* they pass: they are sig's */
    return s;
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
        return core_fail_status(CORE_NOMEM, "kiln_call");
    kiln_scope_begin();
    int rc = f->body(in, body_out, f->user);
    int status = rc == 0 ? 0 : core_fail(CORE_STATE, "kiln_call", "'%s' returned %d: %s", f->name, rc,
                                         kiln_last_error()[0] ? kiln_last_error() : "it set no error");
    for (int i = 0; i < f->n_out && status == 0; i++) {
        if (!body_out[i])
            status = core_fail(CORE_STATE, "kiln_call", "'%s' left out[%d] NULL", f->name, i);
        else if (!(out[i] = shares_input(f, in, body_out[i]) && !eager_active_trace()
                                ? eager_copy("kiln_call", body_out[i])
                                : kiln_retain(body_out[i])))
            status = core_error_status();
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

static void own_outputs(const kiln_fn *f, kiln_tensor **out)
{
    for (int i = 0; i < f->n_out; i++)
        eager_own(out[i]);
}

/* Whether a function input shares storage with a capture the segment writes
 * back: the call must then run eagerly, the only order of reads and writes
 * that gives eager's answer. */
static bool aliases_writeback(const kiln_fn *f, const segment *seg, kiln_tensor *const *in)
{
    for (int i = 0; i < f->n_in; i++)
        if (exec_writes_back_into(seg->exec, in[i]))
            return true;
    return false;
}

enum { PATH_DONE = 0, PATH_NEW = 1, PATH_ALIASED = 2 };

/* Runs specialization s on in: its first segment for symbols, each later one
 * where the value its read gave leads. PATH_DONE with the outputs in out, a
 * negative error, PATH_NEW when a read gave a value no trace has seen (or a
 * segment's guards failed), PATH_ALIASED when an input aliases what the last
 * segment writes back: nothing written then. */
static int run_path(kiln_fn *f, const specialization *s, kiln_tensor *const *in, const int64_t *symbols,
                    kiln_tensor **out)
{
    const segment *seg = s->root;
    kiln_tensor **carried = NULL;
    int n_carried = 0, status = 0;
    int64_t at[IR_MAX_SYMBOLS];
    memcpy(at, symbols, sizeof at);
    while (status == 0 && !seg->last) {
        int n = exec_graph(seg->exec)->n_outputs;
        kiln_tensor **outs = calloc((size_t)n, sizeof *outs);
        size_t size = 0;
        void *key = NULL;
        status = !outs ? core_fail_status(CORE_NOMEM, "kiln_call")
                 : exec_run(seg->exec, carried ? carried : in, at, outs);
        if (status == 0 && !(key = segment_key(outs[0], &size)))
            status = core_error_status();
        const segment *next = NULL;
        if (status == 0) {
            pthread_mutex_lock(&f->lock);
            next = segment_follow(seg, key, size);
            pthread_mutex_unlock(&f->lock);
        }
        free(key);
        for (int i = 0; i < n_carried; i++)
            kiln_release(carried[i]);
        free(carried);
        carried = outs, n_carried = outs ? n - 1 : 0;
        if (outs) {
            kiln_release(outs[0]);
            memmove(outs, outs + 1, (size_t)(n - 1) * sizeof *outs);
        }
        kiln_spec *sig = status == 0 && next ? specs_of(carried, n_carried) : NULL;
        if (status == 0 && (!sig || !guards_pass(next->guards, n_carried, sig, at)))
            status = sig ? PATH_NEW : next ? core_error_status() : PATH_NEW;
        free(sig);
        seg = next;
    }
    if (status == 0)
        status = aliases_writeback(f, seg, in) ? PATH_ALIASED : exec_run(seg->exec, carried ? carried : in, at, out);
    for (int i = 0; i < n_carried; i++)
        kiln_release(carried[i]);
    free(carried);
    if (status == PATH_DONE)
        own_outputs(f, out);
    return status;
}

/* Under the lock, which it drops while tracing: a new path of s for in,
 * traced and run, its segments joined to s's tree; PATH_DONE with the
 * outputs in out, a negative error, or 1 when the call must run eagerly. */
static int trace_path(kiln_fn *f, specialization *s, const kiln_spec *sig, kiln_tensor *const *in,
                      kiln_tensor **out)
{
    if (segment_paths(s->root) >= f->opts.retrace_limit) {
        int status = 0;
        past_the_limit(f, sig, &status);
        return status < 0 ? status : 1;
    }
    jit_log(f, "tracing a new path: a read gave a value no trace of this signature has seen");
    f->stats.traces++;
    pthread_mutex_unlock(&f->lock);
    double start = core_now_ms();
    built b = {0};
    segment *path = build(f, s->serial, sig, s->asked, in, out, &b);
    int status = path ? 0 : core_error_status();
    pthread_mutex_lock(&f->lock);
    f->stats.compile_ms += core_now_ms() - start;
    if (path && b.ran)
        f->stats.segments -= segment_merge(s->root, path);
    else
        segment_free_tree(path);
    if (b.untraceable)
        count_trace_failure(f);
    if (path && !b.ran) /* the body read nothing this time: eager decides */
        return 1;
    if (!path)
        return f->opts.strict ? status : (run_this_call_eagerly(f), 1);
    return PATH_DONE;
}

/* Whether the n_in inputs and n_out outputs arrays share a slot. */
static bool arrays_overlap(kiln_tensor *const *in, int n_in, kiln_tensor *const *out, int n_out)
{
    uintptr_t in_begin = (uintptr_t)in, in_end = (uintptr_t)(in + n_in);
    uintptr_t out_begin = (uintptr_t)out, out_end = (uintptr_t)(out + n_out);
    return n_in > 0 && n_out > 0 && in_begin < out_end && out_begin < in_end;
}

/* An input is a capture the body writes (or shares its storage), so the
 * call runs eagerly, the only order of reads and writes that gives eager's
 * answer. */
static int run_aliased_eagerly(kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    pthread_mutex_lock(&f->lock);
    f->stats.eager_fallbacks++;
    if (!f->warned_alias)
        jit_log(f, "an input shares storage with a tensor the body assigns to: such calls run eagerly");
    f->warned_alias = true;
    pthread_mutex_unlock(&f->lock);
    return run_eagerly(f, in, out);
}

static int check_call(const kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    if (!f)
        return core_fail_null("kiln_call", "f");
    if (!in && f->n_in > 0)
        return core_fail_null("kiln_call", "in");
    if (!out && f->n_out > 0)
        return core_fail_null("kiln_call", "out");
    if (arrays_overlap(in, f->n_in, out, f->n_out))
        return core_fail(CORE_VALUE, "kiln_call", "'%s': in and out are the same array, or overlap: out is "
                         "written while in is read (pass two arrays)", f->name);
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

int kiln_call(kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out)
{
    int status = check_call(f, in, out);
    if (status < 0)
        return status;
    kiln_clear_error(); /* the body's errors are its own: none from before may stand in (or nest) */
    if (eager_active_trace()) /* called from a body being traced: inline it */
        return run_eagerly(f, in, out);
    if (f->jit_off)
        return run_eagerly(f, in, out);
    kiln_spec stack_sig[STACK_INPUTS];
    kiln_spec *sig = f->n_in <= STACK_INPUTS ? stack_sig : malloc((size_t)f->n_in * sizeof *sig);
    if (!sig)
        return core_fail_status(CORE_NOMEM, "kiln_call");
    for (int i = 0; i < f->n_in; i++)
        sig[i] = kiln_spec_of(in[i]);
    int64_t symbols[IR_MAX_SYMBOLS];
    bool ran;
    pthread_mutex_lock(&f->lock);
    specialization *s = prepare(f, sig, in, symbols, out, &ran, &status);
    pthread_mutex_unlock(&f->lock);
    if (s && !ran && (status = run_path(f, s, in, symbols, out)) == PATH_NEW) {
        pthread_mutex_lock(&f->lock);
        status = trace_path(f, s, sig, in, out);
        pthread_mutex_unlock(&f->lock);
    }
    if (sig != stack_sig)
        free(sig);
    if (status == PATH_ALIASED)
        return run_aliased_eagerly(f, in, out);
    if (status < 0 || (s && status == PATH_DONE))
        return status;
    return run_eagerly(f, in, out);
}

/* -- Life of a marked function --------------------------------------------- */

int kiln_mark_dynamic(kiln_spec *spec, int axis)
{
    if (!spec)
        return core_fail_null("kiln_mark_dynamic", "spec");
    int resolved = axis < 0 ? axis + spec->ndim : axis;
    if (spec->ndim < 0 || spec->ndim > KILN_MAX_DIMS || resolved < 0 || resolved >= spec->ndim)
        return core_fail(CORE_VALUE, "kiln_mark_dynamic", "axis %d of a spec of %d dimensions", axis, spec->ndim);
    spec->dynamic |= 1u << resolved;
    core_succeeded();
    return 0;
}

kiln_jit_options kiln_jit_defaults(void)
{
    return (kiln_jit_options){.backend = KILN_BACKEND_AUTO, .opt_level = 2, .retrace_limit = 8};
}

static int check_options(const kiln_jit_options *o)
{
    char why[256];
    if ((unsigned)o->backend > KILN_BACKEND_INTERP || o->opt_level < 0 || o->opt_level > 3 ||
        o->retrace_limit < 0)
        return core_fail(CORE_VALUE, "kiln_jit", "bad options: backend %d, opt_level %d, retrace_limit %d",
                         (int)o->backend, o->opt_level, o->retrace_limit);
    if ((o->backend == KILN_BACKEND_LLVM || o->backend == KILN_BACKEND_NVRTC) &&
        !kernels_have_backend(o->backend == KILN_BACKEND_NVRTC ? KILN_CUDA : KILN_CPU, why, sizeof why))
        return core_fail(CORE_DEVICE, "kiln_jit", "the %s backend: %s",
                         o->backend == KILN_BACKEND_NVRTC ? "NVRTC" : "LLVM", why);
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
    if ((unsigned)o.dynamic > KILN_DYNAMIC_MARKED) {
        core_fail(CORE_VALUE, "kiln_jit", "'%s': dynamic %d is not a kiln_dynamic", name ? name : "?", (int)o.dynamic);
        return NULL;
    }
    kiln_fn *f = calloc(1, sizeof *f);
    uint32_t *dims = calloc((size_t)n_in + 1, sizeof *dims);
    if (!f || !dims) {
        free(f);
        free(dims);
        core_fail_status(CORE_NOMEM, "kiln_jit");
        return NULL;
    }
    for (int i = 0; o.dynamic_dims && i < n_in; i++)
        dims[i] = o.dynamic_dims[i];
    o.dynamic_dims = NULL; /* the copy is f's */
    f->dynamic_dims = dims;
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
    dir = dir && *dir ? dir : ".";
    if (strlen(dir) >= sizeof f->dump_dir && (f->dump_graph || f->dump_kernels || f->dump_llvm || f->dump_cuda)) {
        fprintf(stderr, "kiln: '%s': KILN_DUMP_DIR is %zu characters long, more than %zu: nothing is dumped\n",
                f->name, strlen(dir), sizeof f->dump_dir - 1);
        f->dump_graph = f->dump_kernels = f->dump_llvm = f->dump_cuda = false;
    }
    snprintf(f->dump_dir, sizeof f->dump_dir, "%s", dir);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->built, NULL);
    if (!kernels_backend_for(KILN_CPU) && o.backend == KILN_BACKEND_AUTO && !f->jit_off)
        say_interpreted();
    return f;
}

void kiln_fn_free(kiln_fn *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_specs; i++)
        spec_free(f->specs[i]);
    free(f->specs);
    free(f->dynamic_dims);
    if (f->free_user)
        f->free_user(f->user);
    for (int i = 0; f->io_names && i < f->n_in + f->n_out; i++)
        free(f->io_names[i]);
    free(f->io_names);
    pthread_cond_destroy(&f->built);
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

/* Under the lock: the last specialization used, when it is built. */
static const executable *last_exec(const kiln_fn *f)
{
    return f->n_specs && f->specs[f->last]->root ? f->specs[f->last]->root->exec : NULL;
}

const char *kiln_fn_backend(const kiln_fn *f)
{
    if (!f) {
        core_fail_null("kiln_fn_backend", "f");
        return NULL;
    }
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    const executable *x = last_exec(f);
    const char *name = x ? exec_backend_name(x) : NULL;
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
    const executable *x = last_exec(f);
    char *text = x ? ir_to_text(exec_graph(x)) : NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return text;
}

int kiln_fn_arity(const kiln_fn *f, int *n_in, int *n_out)
{
    if (!f)
        return core_fail_null("kiln_fn_arity", "f");
    if (n_in)
        *n_in = f->n_in;
    if (n_out)
        *n_out = f->n_out;
    return 0;
}

void *jit_user(const kiln_fn *f)
{
    return f->user;
}

const char *jit_name(const kiln_fn *f)
{
    return f->name;
}

void jit_adopt(kiln_fn *f, void (*free_user)(void *), char **io_names)
{
    f->free_user = free_user;
    f->io_names = io_names;
}

/* Under f's lock: "input_<i>" and "output_<i>" for a function no one named. */
static int default_io_names(kiln_fn *f)
{
    int n = f->n_in + f->n_out;
    char **names = calloc((size_t)n + 1, sizeof *names);
    for (int i = 0; names && i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, i < f->n_in ? "input_%d" : "output_%d", i < f->n_in ? i : i - f->n_in);
        if (!(names[i] = strdup(buf))) {
            for (int j = 0; j < i; j++)
                free(names[j]);
            free(names);
            names = NULL;
        }
    }
    if (!names)
        return core_fail_status(CORE_NOMEM, "kiln_fn_io_name");
    f->io_names = names;
    return 0;
}

const char *kiln_fn_io_name(const kiln_fn *f, bool output, int i)
{
    if (!f) {
        core_fail_null("kiln_fn_io_name", "f");
        return NULL;
    }
    if (i < 0 || i >= (output ? f->n_out : f->n_in)) {
        core_fail(CORE_VALUE, "kiln_fn_io_name", "'%s' has %d %s, no %s %d", f->name, output ? f->n_out : f->n_in,
                  output ? "outputs" : "inputs", output ? "output" : "input", i);
        return NULL;
    }
    kiln_fn *mut = (kiln_fn *)f; /* the default names are made once, on first ask */
    pthread_mutex_lock(&mut->lock);
    int status = mut->io_names ? 0 : default_io_names(mut);
    const char *name = status == 0 ? mut->io_names[output ? f->n_in + i : i] : NULL;
    pthread_mutex_unlock(&mut->lock);
    return name;
}

static int check_spec(const char *fn, const kiln_spec *s, int i)
{
    if ((unsigned)s->dtype > KILN_BOOL || s->ndim < 0 || s->ndim > KILN_MAX_DIMS ||
        (s->device != KILN_CPU && s->device != KILN_CUDA))
        return core_fail(CORE_VALUE, fn, "spec %d: dtype %d, ndim %d, device %d",
                         i, (int)s->dtype, s->ndim, (int)s->device);
    if (s->ndim < 32 && s->dynamic >> s->ndim)
        return core_fail(CORE_VALUE, fn, "spec %d marks axes past its %d dimensions dynamic "
                         "(mask 0x%x)", i, s->ndim, s->dynamic);
    for (int d = 0; d < s->ndim; d++)
        if (s->shape[d] < 0)
            return core_fail(CORE_VALUE, fn, "spec %d has a negative size", i);
    int64_t numel;
    if (!ir_shape_numel(s->ndim, s->shape, &numel))
        return core_fail(CORE_VALUE, fn, "spec %d has too many elements", i);
    return 0;
}

int jit_check_specs(const char *fn, const kiln_fn *f, const kiln_spec *in)
{
    for (int i = 0; i < f->n_in; i++)
        if (check_spec(fn, &in[i], i) < 0)
            return -CORE_VALUE;
    return 0;
}

int jit_trace_graph(kiln_fn *f, const kiln_spec *sig, ir_graph **out, kiln_tensor ***captures, int *n_captures)
{
    *out = NULL;
    *captures = NULL;
    *n_captures = 0;
    uint32_t stack_asked[STACK_INPUTS];
    uint32_t *asked = f->n_in <= STACK_INPUTS ? stack_asked : malloc((size_t)f->n_in * sizeof *asked);
    if (!asked)
        return core_fail_status(CORE_NOMEM, "kiln_fn_precompile");
    pthread_mutex_lock(&f->lock);
    asked_axes(f, sig, asked);
    pthread_mutex_unlock(&f->lock);
    tracing t = {.f = f, .sig = sig, .asked = asked};
    bool *shape_read = NULL;
    ir_graph *traced = record_body(&t, captures, n_captures, &shape_read);
    ir_graph *g = traced ? symbolize(f, traced, asked, shape_read) : NULL;
    ir_graph_free(traced);
    free(shape_read);
    if (asked != stack_asked)
        free(asked);
    int status = g ? optimise(f, &g, f->opts.backend != KILN_BACKEND_INTERP) : core_error_status();
    if (status < 0) {
        ir_graph_free(g);
        release_captures(*captures, *n_captures);
        *captures = NULL;
        *n_captures = 0;
        return status;
    }
    *out = g;
    return 0;
}

/* Compiles f's kernels for sig for target, another CPU or a GPU, into the
 * disk cache. Outside the lock. */
static int precompile_elsewhere(kiln_fn *f, const kiln_spec *sig, const kx_target *target)
{
    char sig_text[512], why[1024] = "";
    signature_text(f, sig, sig_text, sizeof sig_text);
    kiln_tensor **captures = NULL;
    int n_captures = 0;
    ir_graph *g = NULL;
    int status = jit_trace_graph(f, sig, &g, &captures, &n_captures);
    dump_target dumps = {f, 0};
    exec_options o = exec_options_of(f, sig_text, &dumps);
    exec_counts counts = {0};
    int compiled = status == 0 ? exec_compile_for(g, &o, target, &counts, why, sizeof why) : 0;
    if (compiled < 0)
        status = core_fail(-compiled, "kiln_fn_precompile", "'%s' for %s: %s", f->name, target->name, why);
    if (status == 0) {
        pthread_mutex_lock(&f->lock);
        f->stats.kernels_compiled += counts.compiled;
        f->stats.kernels_from_disk += counts.from_disk;
        pthread_mutex_unlock(&f->lock);
        jit_log(f, "precompiled (%s) for %s: %d kernels compiled, %d already in the disk cache", sig_text,
                target->name, counts.compiled, counts.from_disk);
    }
    ir_graph_free(g);
    release_captures(captures, n_captures);
    return status;
}

int kiln_fn_precompile(kiln_fn *f, const kiln_spec *in, const char *target)
{
    if (!f || (!in && f->n_in > 0) || !target)
        return core_fail_null("kiln_fn_precompile", !f ? "f" : !target ? "target" : "in");
    if (jit_check_specs("kiln_fn_precompile", f, in) < 0)
        return -CORE_VALUE;
    char why[512];
    if (!strcmp(target, "host")) {
        int status = 0;
        const kx_backend *cuda = kernels_backend_for(KILN_CUDA);
        if (device_of_signature(f, in) == KILN_CUDA && (!cuda || !cuda->target(NULL, why, sizeof why)))
            return core_fail(CORE_DEVICE, "kiln_fn_precompile", "'%s' for CUDA inputs here (\"host\"): %s; "
                             "\"cuda:sm_XX\" compiles for a GPU elsewhere", f->name, cuda ? why : "no CUDA backend");
        int64_t symbols[IR_MAX_SYMBOLS];
        pthread_mutex_lock(&f->lock);
        bool ran;
        if (find_spec(f, in, symbols) < 0)
            prepare(f, in, NULL, symbols, NULL, &ran, &status);
        pthread_mutex_unlock(&f->lock);
        return status < 0 ? status : 0;
    }
    const kx_target *t = kernels_target(target, why, sizeof why);
    if (!t)
        return core_fail(CORE_DEVICE, "kiln_fn_precompile", "%s", why);
    int wanted = backend_device(f);
    if (f->opts.backend == KILN_BACKEND_INTERP || (wanted >= 0 && wanted != (int)t->backend->device))
        return core_fail(CORE_DEVICE, "kiln_fn_precompile", "target \"%s\" is compiled by the %s backend, and '%s' "
                         "does not use it", target, t->backend->name, f->name);
    return precompile_elsewhere(f, in, t);
}

const char *kiln_host_target(void)
{
    char why[512];
    const kx_backend *be = kernels_backend_for(KILN_CPU);
    const kx_target *t = be ? be->target(NULL, why, sizeof why) : NULL;
    if (!be)
        kernels_have_backend(KILN_CPU, why, sizeof why);
    if (!t)
        core_fail(CORE_DEVICE, "kiln_host_target", "%s", why);
    return t ? t->name : NULL;
}
