/* ONNX's backend test suite (Debian's libonnx-testdata) run through
 * kiln_onnx_load, eagerly (KILN_JIT=0) and compiled: per directory, how many
 * cases passed, failed, and were unsupported (with the reason). Exits 1 when
 * any case kiln supports fails, 77 (skipped) when the data is absent.
 *
 *   onnx_conformance [DATA_DIR] [-v] [-k SUBSTRING]
 *
 * KILN_ONNX_CASES=N runs every Nth case of each directory (1: all). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "onnx/onnx.h"

enum { MAX_IO = 64 };
static const char *const default_dir = "/usr/share/libonnx-testdata/data";
static const char *const categories[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

typedef enum { PASSED, FAILED, UNSUPPORTED } verdict;

typedef struct {
    bool verbose;
    int fell_back, graph_breaks; /* compiled runs that ran eagerly, or broke their trace at a read */
    const char *filter;
    int stride;
    char reason[1024];
} runner;

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of dir whose name starts with prefix, sorted (malloc'd). */
static char **list_dir(const char *dir, const char *prefix, int *n)
{
    DIR *d = opendir(dir);
    char **names = NULL;
    int cap = 0;
    *n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) || e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, (size_t)cap * sizeof *names);
        }
        names[(*n)++] = strdup(e->d_name);
    }
    if (d)
        closedir(d);
    if (*n)
        qsort(names, (size_t)*n, sizeof *names, compare_names);
    return names;
}

static void free_list(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Files name_0.pb, name_1.pb, ... of a data set as tensors. */
static int load_set(runner *r, const char *set, const char *name, kiln_tensor **ts, verdict *v)
{
    int n = 0;
    for (; n < MAX_IO; n++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s_%d.pb", set, name, n);
        struct stat st;
        if (stat(path, &st) != 0)
            break;
        if (!(ts[n] = onnx_load_tensor_file(path))) {
            *v = core_error_status() == -CORE_UNSUPPORTED ? UNSUPPORTED : FAILED;
            snprintf(r->reason, sizeof r->reason, "%s", kiln_last_error());
            for (int i = 0; i < n; i++)
                kiln_release(ts[i]);
            return -1;
        }
    }
    return n;
}

static bool close_enough(double got, double want, bool exact)
{
    if (isnan(want))
        return isnan(got);
    if (exact || isinf(want))
        return got == want;
    return fabs(got - want) <= 1e-7 + 1e-3 * fabs(want);
}

/* Whether got equals want: dtype, shape, and values (floats within ONNX's
 * backend-test tolerance, rtol 1e-3 and atol 1e-7). */
static bool same_tensor(runner *r, int i, const kiln_tensor *got, const kiln_tensor *want)
{
    if (kiln_dtype_of(got) != kiln_dtype_of(want) || kiln_ndim(got) != kiln_ndim(want) ||
        memcmp(kiln_shape(got), kiln_shape(want), (size_t)kiln_ndim(got) * sizeof(int64_t))) {
        snprintf(r->reason, sizeof r->reason, "output %d: %s of %d dimensions, expected %s of %d", i,
                 kiln_dtype_name(kiln_dtype_of(got)), kiln_ndim(got), kiln_dtype_name(kiln_dtype_of(want)),
                 kiln_ndim(want));
        return false;
    }
    int64_t n = kiln_numel(want);
    kiln_tensor *g64 = kiln_cast((kiln_tensor *)got, KILN_F64), *w64 = kiln_cast((kiln_tensor *)want, KILN_F64);
    double *g = malloc((size_t)(n ? n : 1) * sizeof *g), *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    bool ok = g && w && kiln_copy_to_host(g64, g, (size_t)n * sizeof *g) == 0 &&
              kiln_copy_to_host(w64, w, (size_t)n * sizeof *w) == 0;
    bool exact = kiln_dtype_of(want) != KILN_F32 && kiln_dtype_of(want) != KILN_F64;
    for (int64_t k = 0; ok && k < n; k++)
        if (!close_enough(g[k], w[k], exact)) {
            snprintf(r->reason, sizeof r->reason, "output %d, element %lld: %.9g, expected %.9g", i, (long long)k,
                     g[k], w[k]);
            ok = false;
        }
    free(g);
    free(w);
    kiln_release(g64);
    kiln_release(w64);
    return ok;
}

/* Input j of f: the test's tensor of that name, else the one in that place. */
static kiln_tensor *input_for(const kiln_fn *f, int j, kiln_tensor *const *ins, char **names, int n)
{
    const char *name = kiln_fn_io_name(f, false, j);
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(names[i], name))
            return ins[i];
    return j < n ? ins[j] : NULL;
}

/* One data set through f. */
static verdict run_set(runner *r, kiln_fn *f, const char *set)
{
    kiln_tensor *ins[MAX_IO] = {NULL}, *wants[MAX_IO] = {NULL}, *outs[MAX_IO] = {NULL}, *args[MAX_IO];
    char *names[MAX_IO] = {NULL};
    verdict v = FAILED;
    int n_in = load_set(r, set, "input", ins, &v);
    int n_want = n_in < 0 ? -1 : load_set(r, set, "output", wants, &v);
    if (n_in < 0 || n_want < 0) {
        for (int i = 0; i < n_in; i++)
            kiln_release(ins[i]);
        return v;
    }
    int fn_in, fn_out;
    kiln_fn_arity(f, &fn_in, &fn_out);
    for (int i = 0; i < n_in; i++) {
        /* the .pb files name their tensors; onnx_load_tensor_file does not keep it */
        char path[4096];
        snprintf(path, sizeof path, "%.3900s/input_%d.pb", set, i);
        size_t size;
        uint8_t *bytes = onnx_read_file("onnx_conformance", path, &size);
        Onnx__TensorProto *tp = bytes ? onnx__tensor_proto__unpack(NULL, size, bytes) : NULL;
        names[i] = tp && tp->name ? strdup(tp->name) : NULL;
        if (tp)
            onnx__tensor_proto__free_unpacked(tp, NULL);
        free(bytes);
    }
    v = PASSED;
    if (fn_in > n_in || fn_out != n_want) {
        snprintf(r->reason, sizeof r->reason, "the model has %d inputs and %d outputs, the data %d and %d", fn_in,
                 fn_out, n_in, n_want);
        v = FAILED;
    }
    for (int j = 0; v == PASSED && j < fn_in; j++)
        args[j] = input_for(f, j, ins, names, n_in);
    if (v == PASSED && kiln_call(f, args, outs) < 0) {
        snprintf(r->reason, sizeof r->reason, "%s", kiln_last_error());
        v = strstr(r->reason, "not supported") ? UNSUPPORTED : FAILED;
    }
    for (int i = 0; v == PASSED && i < n_want; i++)
        if (!same_tensor(r, i, outs[i], wants[i]))
            v = FAILED;
    for (int i = 0; i < MAX_IO; i++) {
        kiln_release(ins[i]);
        kiln_release(wants[i]);
        kiln_release(outs[i]);
        free(names[i]);
    }
    return v;
}

/* A case: its model loaded eagerly and compiled, each run on every data set. */
static verdict run_case(runner *r, const char *dir)
{
    char model[4096], path[4096 + 64];
    snprintf(model, sizeof model, "%.4000s/model.onnx", dir);
    int n_sets;
    char **sets = list_dir(dir, "test_data_set_", &n_sets);
    verdict v = PASSED;
    for (int mode = 0; mode < 2 && v == PASSED; mode++) {
        if (mode == 0)
            setenv("KILN_JIT", "0", 1);
        kiln_fn *f = kiln_onnx_load(model, NULL);
        unsetenv("KILN_JIT");
        if (!f) {
            snprintf(r->reason, sizeof r->reason, "%s", kiln_last_error());
            v = core_error_status() == -CORE_UNSUPPORTED ? UNSUPPORTED : FAILED;
            break;
        }
        for (int s = 0; s < n_sets && v == PASSED; s++) {
            snprintf(path, sizeof path, "%s/%s", dir, sets[s]);
            v = run_set(r, f, path);
            if (v == FAILED) {
                char mode_reason[sizeof r->reason];
                snprintf(mode_reason, sizeof mode_reason, "%s: %.1000s", mode ? "compiled" : "eager", r->reason);
                snprintf(r->reason, sizeof r->reason, "%s", mode_reason);
            }
        }
        kiln_fn_stats_t st;
        kiln_fn_stats(f, &st);
        r->fell_back += mode == 1 && v == PASSED && st.eager_fallbacks > 0;
        r->graph_breaks += mode == 1 && v == PASSED && st.graph_breaks > 0;
        if (r->verbose && mode == 1 && v == PASSED && st.eager_fallbacks > 0)
            printf("ran eagerly when compiled: %s\n", dir);
        kiln_fn_free(f);
    }
    free_list(sets, n_sets);
    return v;
}

/* The reasons cases were unsupported, counted. */
typedef struct {
    char text[160];
    int count;
} reason_count;

static void count_reason(reason_count *rc, int *n, const char *reason)
{
    /* what kiln lacks, without the names of the model, node and values: "operator Conv is
     * not supported", "input '*' has element type INT8; ..." */
    const char *what = strstr(reason, "): ");
    what = what ? what + 3 : reason;
    char text[160];
    size_t len = 0;
    for (bool quoted = false; *what && len + 2 < sizeof text; what++) {
        if (*what == '\'' && (quoted = !quoted))
            text[len++] = '*';
        else if (!quoted && *what != '\'')
            text[len++] = *what;
    }
    text[len] = 0;
    for (int i = 0; i < *n; i++)
        if (!strcmp(rc[i].text, text)) {
            rc[i].count++;
            return;
        }
    if (*n < 512) {
        snprintf(rc[*n].text, sizeof rc[*n].text, "%s", text);
        rc[(*n)++].count = 1;
    }
}

static int compare_counts(const void *a, const void *b)
{
    return ((const reason_count *)b)->count - ((const reason_count *)a)->count;
}

int main(int argc, char **argv)
{
    runner r = {.stride = 1};
    const char *root = default_dir;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v"))
            r.verbose = true;
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            r.filter = argv[++i];
        else
            root = argv[i];
    }
    const char *stride = getenv("KILN_ONNX_CASES");
    r.stride = stride && atoi(stride) > 0 ? atoi(stride) : 1;
    if (!is_dir(root)) {
        printf("SKIP: %s is absent (Debian: apt-get install libonnx-testdata)\n", root);
        return 77;
    }
    static reason_count reasons[512];
    int n_reasons = 0, total[3] = {0};
    for (size_t c = 0; c < sizeof categories / sizeof *categories; c++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, categories[c]);
        int n_cases, counts[3] = {0};
        char **cases = list_dir(dir, "test_", &n_cases);
        for (int k = 0; k < n_cases; k++) {
            if ((r.filter && !strstr(cases[k], r.filter)) || k % r.stride)
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%.2000s/%.2000s", dir, cases[k]);
            kiln_scope_begin();
            verdict v = run_case(&r, path);
            kiln_scope_end();
            kiln_clear_error();
            counts[v]++;
            if (v == FAILED)
                printf("FAILED %s/%s: %s\n", categories[c], cases[k], r.reason);
            else if (v == UNSUPPORTED) {
                count_reason(reasons, &n_reasons, r.reason);
                if (r.verbose)
                    printf("unsupported %s/%s: %s\n", categories[c], cases[k], r.reason);
            } else if (r.verbose)
                printf("passed %s/%s\n", categories[c], cases[k]);
        }
        free_list(cases, n_cases);
        printf("%-18s passed %4d  failed %4d  unsupported %4d\n", categories[c], counts[PASSED], counts[FAILED],
               counts[UNSUPPORTED]);
        for (int i = 0; i < 3; i++)
            total[i] += counts[i];
    }
    printf("%-18s passed %4d  failed %4d  unsupported %4d\n", "total", total[PASSED], total[FAILED],
           total[UNSUPPORTED]);
    printf("of the cases passed, compiled: %d ran eagerly (their trace failed), %d broke their trace at a read of "
           "a value (a shape or bound given as an input)\n", r.fell_back, r.graph_breaks);
    qsort(reasons, (size_t)n_reasons, sizeof *reasons, compare_counts);
    printf("unsupported, by reason:\n");
    for (int i = 0; i < n_reasons; i++)
        printf("  %4d  %s\n", reasons[i].count, reasons[i].text);
    return total[FAILED] ? 1 : 0;
}
