/* kiln-onnx: run, time and precompile ONNX models with kiln.
 *
 *   kiln-onnx run MODEL [--input NAME=FILE.npy]... [--batch N] [--output DIR]
 *   kiln-onnx bench MODEL [--batch N] [--threads N] [--runs N] [--torch SCRIPT]
 *   kiln-onnx precompile MODEL --target T... --bundle FILE [--batch N]
 *
 * Inputs not given as .npy files are drawn (standard normal floats, zero
 * integers, false bools) in the shapes the model declares, a symbolic first
 * size being --batch (default 1). run prints each output, or writes
 * DIR/<name>.npy, and says on stderr how many kernels were compiled and
 * loaded from the disk cache. bench times loading, a first call, eager and
 * compiled calls (medians), and a first call in a fresh process that finds
 * the kernels on disk, each with where its time went. With --torch, the
 * model's companion script (the one that exported it) times PyTorch eager and
 * TorchScript on the same model and batch: it is run as
 * `$KILN_PYTHON SCRIPT --bench-torch MODEL --batch N --runs N --threads N`
 * (KILN_PYTHON: python3 by default) and prints "torch_eager_ms X" and
 * "torchscript_ms Y", which bench prints beside kiln's medians. precompile compiles the model's kernels for each
 * target ("host", "cpu:<name>", "cuda:sm_XX") into a fresh cache and packs
 * it into a bundle: `kiln-cache import FILE` installs it, and
 * KILN_CACHE=require then proves a deployment compiles nothing. Exit 0, 1
 * on failure, 2 on bad usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "onnx/onnx.h"

enum { MAX_IO = 64, MAX_TARGETS = 16 };

typedef struct {
    const char *model, *output, *bundle, *torch_script;
    const char *input_names[MAX_IO], *input_files[MAX_IO];
    int n_inputs;
    const char *targets[MAX_TARGETS];
    int n_targets;
    int64_t batch;
    int runs;
    bool first_call_only; /* bench's child: time one call in a fresh process */
} options;

static int usage(const char *why)
{
    fprintf(stderr, "kiln-onnx: %s\n"
                    "usage: kiln-onnx run MODEL [--input NAME=FILE.npy]... [--batch N] [--output DIR]\n"
                    "       kiln-onnx bench MODEL [--batch N] [--threads N] [--runs N] [--torch SCRIPT]\n"
                    "       kiln-onnx precompile MODEL --target T... --bundle FILE [--batch N]\n",
            why);
    return 2;
}

static int fail(const char *what)
{
    fprintf(stderr, "kiln-onnx: %s: %s\n", what, kiln_last_error());
    return 1;
}

static int parse(int argc, char **argv, options *o)
{
    o->model = argv[0];
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(arg, "--first-call")) {
            o->first_call_only = true;
            continue;
        }
        if (!val)
            return usage("an option lacks its value");
        a++;
        if (!strcmp(arg, "--input") && strchr(val, '=') && o->n_inputs < MAX_IO) {
            o->input_names[o->n_inputs] = val;
            o->input_files[o->n_inputs++] = strchr(val, '=') + 1;
        } else if (!strcmp(arg, "--output"))
            o->output = val;
        else if (!strcmp(arg, "--torch"))
            o->torch_script = val;
        else if (!strcmp(arg, "--bundle"))
            o->bundle = val;
        else if (!strcmp(arg, "--target") && o->n_targets < MAX_TARGETS)
            o->targets[o->n_targets++] = val;
        else if (!strcmp(arg, "--batch") && atoll(val) > 0)
            o->batch = atoll(val);
        else if (!strcmp(arg, "--runs") && atoi(val) > 0)
            o->runs = atoi(val);
        else if (!strcmp(arg, "--threads") && atoi(val) > 0)
            setenv("KILN_THREADS", val, 1);
        else
            return usage("unknown option or bad value");
    }
    return 0;
}

/* -- Inputs ------------------------------------------------------------------------ */

/* The file given for input name, or NULL. */
static const char *file_for(const options *o, const char *name)
{
    for (int i = 0; i < o->n_inputs; i++)
        if (!strncmp(o->input_names[i], name, strlen(name)) && o->input_names[i][strlen(name)] == '=')
            return o->input_files[i];
    return NULL;
}

/* f's inputs: from files, else drawn in the declared shapes. 0 or -1. */
static int make_inputs(const options *o, const kiln_fn *f, kiln_tensor **in, kiln_spec *specs)
{
    int n_in;
    kiln_fn_arity(f, &n_in, NULL);
    if (n_in > MAX_IO)
        return fprintf(stderr, "kiln-onnx: %d inputs (at most %d)\n", n_in, MAX_IO), -1;
    kiln_spec declared[MAX_IO];
    int n_declared = -1;
    for (int i = 0; i < n_in; i++) {
        const char *name = kiln_fn_io_name(f, false, i), *file = file_for(o, name);
        if (!file && n_declared < 0 && (n_declared = onnx_declared_inputs(f, declared, MAX_IO, o->batch)) < 0)
            return fail("input shapes"), -1;
        if (file)
            in[i] = kiln_load_npy(file);
        else if (declared[i].dtype == KILN_F32 || declared[i].dtype == KILN_F64)
            in[i] = kiln_cast(kiln_randn(declared[i].ndim, declared[i].shape, (uint64_t)i + 1), declared[i].dtype);
        else
            in[i] = kiln_zeros(declared[i].dtype, declared[i].ndim, declared[i].shape);
        if (!in[i])
            return fprintf(stderr, "kiln-onnx: input '%s': %s\n", name, kiln_last_error()), -1;
        specs[i] = kiln_spec_of(in[i]);
    }
    return 0;
}

/* -- run ------------------------------------------------------------------------------ */

static int write_outputs(const options *o, const kiln_fn *f, kiln_tensor *const *out, int n_out)
{
    for (int i = 0; i < n_out; i++) {
        const char *name = kiln_fn_io_name(f, true, i);
        if (!o->output) {
            printf("%s:\n", name);
            kiln_print(out[i]);
            continue;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.npy", o->output, name);
        for (char *c = path + strlen(o->output) + 1; *c; c++)
            *c = *c == '/' ? '_' : *c; /* a value's name is not a path */
        if (kiln_save_npy(path, out[i]) < 0)
            return fail(path);
    }
    return 0;
}

static int cmd_run(const options *o)
{
    kiln_fn *f = kiln_onnx_load(o->model, NULL);
    if (!f)
        return fail("load");
    kiln_tensor *in[MAX_IO] = {NULL}, *out[MAX_IO] = {NULL};
    kiln_spec specs[MAX_IO];
    int n_out, status = 1;
    kiln_fn_arity(f, NULL, &n_out);
    kiln_scope_begin();
    if (n_out > MAX_IO)
        fprintf(stderr, "kiln-onnx: %d outputs (at most %d)\n", n_out, MAX_IO);
    else if (make_inputs(o, f, in, specs) == 0 && kiln_call(f, in, out) < 0)
        fail("run");
    else if (out[0] || n_out == 0)
        status = write_outputs(o, f, out, n_out);
    kiln_scope_end();
    kiln_fn_stats_t st;
    kiln_fn_stats(f, &st);
    fprintf(stderr, "kiln-onnx: %s: kernels compiled %lld, from the disk cache %lld, eager fallbacks %lld\n",
            o->model, (long long)st.kernels_compiled, (long long)st.kernels_from_disk, (long long)st.eager_fallbacks);
    kiln_fn_free(f);
    return status;
}

/* -- bench ----------------------------------------------------------------------------- */

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median ms of runs calls of f (after one unmeasured call). */
static double median_ms(kiln_fn *f, kiln_tensor *const *in, int runs)
{
    double times[256];
    runs = runs > 256 ? 256 : runs;
    for (int r = -1; r < runs; r++) {
        kiln_tensor *out[MAX_IO] = {NULL};
        kiln_scope_begin();
        double start = core_now_ms();
        int rc = kiln_call(f, in, out);
        double ms = core_now_ms() - start;
        kiln_scope_end();
        if (rc < 0)
            return -1;
        if (r >= 0)
            times[r] = ms;
    }
    qsort(times, (size_t)runs, sizeof *times, compare_doubles);
    return times[runs / 2];
}

/* A load and a first call, and where their time went. */
typedef struct {
    double load_ms, call_ms;
    onnx_load_times load;
    double build_ms; /* of the call: tracing, optimising, compiling or loading kernels */
    double compiled, from_disk; /* kernels */
} first_times;

static const char first_format[] = "load_ms %lf first_call_ms %lf map_ms %lf unpack_ms %lf tensors_ms %lf "
                                   "graph_ms %lf build_ms %lf compiled %lf from_disk %lf";

/* Load and first call timed; f kept in *keep where given. */
static int first_call(const options *o, first_times *t, kiln_fn **keep)
{
    double start = core_now_ms();
    kiln_fn *f = kiln_onnx_load(o->model, NULL);
    t->load_ms = core_now_ms() - start;
    t->load = onnx_last_load_times();
    if (!f)
        return fail("load");
    kiln_tensor *in[MAX_IO] = {NULL}, *out[MAX_IO] = {NULL};
    kiln_spec specs[MAX_IO];
    kiln_scope_begin();
    int status = make_inputs(o, f, in, specs);
    start = core_now_ms();
    if (status == 0 && kiln_call(f, in, out) < 0)
        status = fail("first call");
    t->call_ms = core_now_ms() - start;
    kiln_scope_end();
    kiln_fn_stats_t st;
    kiln_fn_stats(f, &st);
    t->build_ms = st.compile_ms;
    t->compiled = (double)st.kernels_compiled;
    t->from_disk = (double)st.kernels_from_disk;
    if (keep && status == 0)
        *keep = f;
    else
        kiln_fn_free(f);
    return status;
}

static void print_first(const char *what, const first_times *t)
{
    printf("  %s: load %.3f ms + first call %.3f ms = %.3f ms\n", what, t->load_ms, t->call_ms,
           t->load_ms + t->call_ms);
    printf("    load: map the file %.3f, unpack %.3f, initializers to tensors %.3f, check and order the graph "
           "%.3f ms\n", t->load.map_ms, t->load.unpack_ms, t->load.tensors_ms, t->load.graph_ms);
    printf("    first call: trace, optimise, compile or load kernels %.3f (%.0f compiled, %.0f from the disk cache), "
           "run %.3f ms\n", t->build_ms, t->compiled, t->from_disk, t->call_ms - t->build_ms);
}

/* Runs program (a path, or a name looked up in PATH) with argv, its stdout
 * read into buf: 0 when it exits 0, else -1. */
static int run_child(const char *program, char *const *argv, char *buf, size_t size)
{
    int fds[2];
    if (pipe(fds) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        execvp(program, argv);
        fprintf(stderr, "kiln-onnx: cannot run %s: %s\n", program, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t got = 0;
    for (ssize_t n = 1; pid > 0 && n > 0 && got < size - 1; got += n > 0 ? (size_t)n : 0)
        n = read(fds[0], buf + got, size - 1 - got);
    close(fds[0]);
    buf[got] = 0;
    int wstatus = 0;
    if (pid > 0)
        waitpid(pid, &wstatus, 0);
    return pid > 0 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 ? 0 : -1;
}

/* A first call in a fresh process (this program again), whose kernels come
 * from the disk cache the calls before filled. */
static int fresh_process(const options *o, char *const *argv, first_times *t)
{
    char batch[32], buf[512];
    snprintf(batch, sizeof batch, "%lld", (long long)o->batch);
    char *child[] = {argv[0], "bench", (char *)o->model, "--first-call", "--batch", batch, NULL};
    if (o->batch <= 0)
        child[4] = NULL;
    return run_child("/proc/self/exe", child, buf, sizeof buf) == 0 &&
                   sscanf(buf, first_format, &t->load_ms, &t->call_ms, &t->load.map_ms, &t->load.unpack_ms,
                          &t->load.tensors_ms, &t->load.graph_ms, &t->build_ms, &t->compiled, &t->from_disk) == 9
               ? 0
               : -1;
}

/* PyTorch eager's and TorchScript's medians on the same model at batch, from
 * the companion script; 0 or -1 (said on stderr). */
static int torch_medians(const options *o, int64_t batch, int runs, double *eager_ms, double *script_ms)
{
    const char *python = getenv("KILN_PYTHON") ? getenv("KILN_PYTHON") : "python3";
    char batch_s[32], runs_s[32], threads_s[32], buf[4096];
    snprintf(batch_s, sizeof batch_s, "%lld", (long long)batch);
    snprintf(runs_s, sizeof runs_s, "%d", runs);
    snprintf(threads_s, sizeof threads_s, "%d", core_threads());
    char *child[] = {(char *)python, (char *)o->torch_script, "--bench-torch", (char *)o->model, "--batch", batch_s,
                     "--runs", runs_s, "--threads", threads_s, NULL};
    int status = run_child(python, child, buf, sizeof buf);
    const char *eager = strstr(buf, "torch_eager_ms "), *script = strstr(buf, "torchscript_ms ");
    if (status == 0 && eager && script && sscanf(eager, "torch_eager_ms %lf", eager_ms) == 1 &&
        sscanf(script, "torchscript_ms %lf", script_ms) == 1)
        return 0;
    fprintf(stderr, "kiln-onnx: %s %s gave no PyTorch times (it prints \"torch_eager_ms X\" and "
            "\"torchscript_ms Y\")%s%s\n", python, o->torch_script, *buf ? ": " : "", buf);
    return -1;
}

static int cmd_bench(const options *o, char *const *argv)
{
    first_times first = {0}, fresh = {0};
    if (o->first_call_only) {
        if (first_call(o, &first, NULL) != 0)
            return 1;
        printf(first_format, first.load_ms, first.call_ms, first.load.map_ms, first.load.unpack_ms,
               first.load.tensors_ms, first.load.graph_ms, first.build_ms, first.compiled, first.from_disk);
        printf("\n");
        return 0;
    }
    int runs = o->runs ? o->runs : 20;
    kiln_fn *f = NULL;
    if (first_call(o, &first, &f) != 0)
        return 1;
    setenv("KILN_JIT", "0", 1);
    kiln_fn *eager = kiln_onnx_load(o->model, NULL);
    unsetenv("KILN_JIT");
    kiln_tensor *in[MAX_IO] = {NULL};
    kiln_spec specs[MAX_IO];
    memset(specs, 0, sizeof specs);
    kiln_scope_begin();
    int status = eager && make_inputs(o, f, in, specs) == 0 ? 0 : 1;
    double eager_ms = status == 0 ? median_ms(eager, in, runs) : -1;
    double traced_ms = status == 0 ? median_ms(f, in, runs) : -1;
    kiln_scope_end();
    if (eager_ms < 0 || traced_ms < 0)
        status = fail("bench");
    double torch_ms = -1, torchscript_ms = -1;
    int64_t torch_batch = specs[0].ndim ? specs[0].shape[0] : 1;
    bool torch_ok = status == 0 && o->torch_script &&
                    torch_medians(o, torch_batch, runs, &torch_ms, &torchscript_ms) == 0;
    bool fresh_ok = status == 0 && fresh_process(o, argv, &fresh) == 0;
    if (status == 0) {
        char batch[32] = "the declared sizes";
        if (o->batch > 0)
            snprintf(batch, sizeof batch, "batch %lld", (long long)o->batch);
        printf("%s, %s, %d threads\n", o->model, batch, core_threads());
        print_first("this process", &first);
        printf("  eager call, median      %10.3f ms\n", eager_ms);
        printf("  compiled call, median   %10.3f ms   (%.2fx eager)\n", traced_ms, eager_ms / traced_ms);
        if (torch_ok) {
            printf("  PyTorch eager, median   %10.3f ms   (%.2fx the compiled call's time)\n", torch_ms,
                   torch_ms / traced_ms);
            printf("  TorchScript, median     %10.3f ms   (%.2fx the compiled call's time)\n", torchscript_ms,
                   torchscript_ms / traced_ms);
        }
        if (fresh_ok)
            print_first("fresh process", &fresh);
        else
            printf("  fresh process: not measured (the disk cache is off, or the child failed)\n");
        if (o->torch_script && !torch_ok)
            status = 1;
    }
    kiln_fn_free(eager);
    kiln_fn_free(f);
    return status;
}

/* -- precompile ------------------------------------------------------------------------- */

/* Packs every entry under root's cache directory into the bundle file. */
static int pack_bundle(const char *root, const char *bundle)
{
    char dir[CACHE_PATH_MAX], why[1024];
    cache_file *files = NULL;
    int n = 0, status = 1;
    if (cache_dir_of_root(root, dir, sizeof dir) < 0 || cache_list(dir, &files, &n) < 0) {
        fprintf(stderr, "kiln-onnx: cannot list the cache in %s\n", root);
        return 1;
    }
    cache_key *keys = calloc((size_t)n + 1, sizeof *keys);
    int k = 0;
    for (int i = 0; keys && i < n; i++)
        if (files[i].keyed && S_ISREG(files[i].mode))
            keys[k++] = files[i].key;
    size_t size;
    void *bytes = keys ? cache_bundle_pack(dir, keys, k, &size, why, sizeof why) : NULL;
    if (!bytes)
        fprintf(stderr, "kiln-onnx: packing the bundle: %s\n", keys ? why : "out of memory");
    else if (core_write_file(bundle, bytes, size, 0644) < 0)
        fprintf(stderr, "kiln-onnx: cannot write %s: %s\n", bundle, strerror(errno));
    else {
        printf("kiln-onnx: %d kernels (%zu bytes) in %s\n", k, size, bundle);
        status = 0;
    }
    free(bytes);
    free(keys);
    free(files);
    return status;
}

static int cmd_precompile(const options *o)
{
    if (!o->bundle || !o->n_targets)
        return usage("precompile takes --target T... and --bundle FILE");
    /* a fresh private cache beside the bundle holds just this model's kernels */
    char root[4096];
    snprintf(root, sizeof root, "%s.cache-XXXXXX", o->bundle);
    if (!mkdtemp(root))
        return fprintf(stderr, "kiln-onnx: cannot make %s: %s\n", root, strerror(errno)), 1;
    setenv("KILN_CACHE_DIR", root, 1);
    setenv("KILN_CACHE", "on", 1);
    kiln_fn *f = kiln_onnx_load(o->model, NULL);
    int status = f ? 0 : fail("load");
    kiln_tensor *in[MAX_IO] = {NULL};
    kiln_spec specs[MAX_IO];
    kiln_scope_begin();
    if (status == 0 && make_inputs(o, f, in, specs) < 0)
        status = 1;
    kiln_scope_end();
    for (int t = 0; status == 0 && t < o->n_targets; t++)
        if (kiln_fn_precompile(f, specs, o->targets[t]) < 0)
            status = fail(o->targets[t]);
    kiln_fn_free(f);
    if (status == 0)
        status = pack_bundle(root, o->bundle);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (!strchr(root, '\'') && system(cmd) != 0)
        fprintf(stderr, "kiln-onnx: could not remove %s\n", root);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return usage("a command and a model, please");
    options o = {0};
    if (parse(argc - 2, argv + 2, &o) != 0)
        return 2;
    if (!strcmp(argv[1], "run"))
        return cmd_run(&o);
    if (!strcmp(argv[1], "bench"))
        return cmd_bench(&o, argv);
    if (!strcmp(argv[1], "precompile"))
        return cmd_precompile(&o);
    return usage("unknown command");
}
