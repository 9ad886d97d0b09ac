/* kiln-bench --workload matmul on the CPU: f32 products of the shapes real
 * workloads run (square, the mlp's layers, attention's batched scores and
 * values, a tall-skinny and a batched case, a GPT layer's batch of
 * sequences times one weight), in GFLOP/s: kiln's GEMM
 * (kiln_matmul with KILN_MATMUL=kiln), OpenBLAS as found (cblas_sgemm, a
 * batch as a loop, one sharing its B as one product) timed in turn with it,
 * rep by rep, and OpenBLAS with the best core type for this CPU forced
 * (OPENBLAS_CORETYPE) in a fresh process per shape, since the core is
 * chosen once when OpenBLAS loads; "-" when that process fails (some
 * OpenBLAS builds crash on a core this CPU lacks) or the core found is
 * already the best. The table names the core OpenBLAS chose. */
#include "matmul.h"

#include <kiln/kiln.h>

#include <cblas.h>
#include <string.h>

#include "report.h"
#include "timing.h"

char *openblas_get_corename(void);

enum { WARMUPS = 2, MAX_REPS = 1000 };

typedef struct {
    const char *name;
    int64_t batch, m, k, n; /* full size */
    int64_t quick[4];       /* batch, m, k, n under --quick */
    bool shared_b;          /* one B [k, n] for the whole batch, as a linear layer's weight */
} shape;

static const shape SHAPES[] = {
    {"square", 1, 512, 512, 512, {1, 64, 64, 64}, false},
    {"square", 1, 2048, 2048, 2048, {1, 128, 128, 128}, false},
    {"mlp up", 1, 256, 1024, 4096, {1, 32, 64, 256}, false},
    {"mlp down", 1, 256, 4096, 1024, {1, 32, 256, 64}, false},
    {"attention q@k^T", 64, 256, 64, 256, {4, 32, 16, 32}, false},
    {"attention w@v", 64, 256, 256, 64, {4, 32, 32, 16}, false},
    {"tall-skinny", 1, 16384, 256, 64, {1, 1024, 32, 16}, false},
    {"batched", 32, 128, 128, 128, {4, 16, 16, 16}, false},
    {"gpt linear", 4, 128, 768, 2304, {2, 16, 32, 48}, true},
};
enum { N_SHAPES = sizeof SHAPES / sizeof *SHAPES };
_Static_assert((int)N_SHAPES <= (int)BENCH_MAX_MATMUL, "bench_matmul holds every shape");

/* The operands of one shape: kiln tensors and the same values in host
 * arrays for OpenBLAS. */
typedef struct {
    int64_t batch, m, k, n;
    bool shared_b;
    kiln_tensor *a, *b;
    float *ha, *hb, *hc;
} operands;

static int operands_make(const shape *s, bool quick, operands *o)
{
    const int64_t *q = quick ? s->quick : (const int64_t[]){s->batch, s->m, s->k, s->n};
    *o = (operands){.batch = q[0], .m = q[1], .k = q[2], .n = q[3], .shared_b = s->shared_b};
    int single = o->batch == 1, b_single = single || s->shared_b; /* then [m,k] or [k,n], without a batch axis */
    int64_t a_shape[3] = {o->batch, o->m, o->k}, b_shape[3] = {o->batch, o->k, o->n};
    o->a = kiln_randn(3 - single, a_shape + single, 1);
    kiln_tensor *b = kiln_randn(3 - b_single, b_shape + b_single, 2);
    o->b = kiln_mul_scalar(b, 1 / sqrt((double)o->k));
    kiln_release(b);
    size_t na = (size_t)(o->batch * o->m * o->k), nb = (size_t)((s->shared_b ? 1 : o->batch) * o->k * o->n);
    o->ha = malloc(na * sizeof(float));
    o->hb = malloc(nb * sizeof(float));
    o->hc = malloc((size_t)(o->batch * o->m * o->n) * sizeof(float));
    if (!o->a || !o->b || !o->ha || !o->hb || !o->hc)
        return -1;
    kiln_copy_to_host(o->a, o->ha, na * sizeof(float));
    kiln_copy_to_host(o->b, o->hb, nb * sizeof(float));
    return 0;
}

static void operands_free(operands *o)
{
    kiln_release(o->a);
    kiln_release(o->b);
    free(o->ha);
    free(o->hb);
    free(o->hc);
}

static double gflop(const operands *o)
{
    return 2.0 * (double)o->batch * (double)o->m * (double)o->k * (double)o->n / 1e9;
}

static double time_kiln(const operands *o)
{
    double start = now_ms();
    kiln_tensor *c = kiln_matmul(o->a, o->b);
    double ms = now_ms() - start;
    kiln_release(c);
    return c ? ms : NAN;
}

/* A batch sharing one B is one sgemm of batch x m rows, as eager's OpenBLAS
 * path runs it. */
static double time_openblas(const operands *o)
{
    double start = now_ms();
    if (o->shared_b) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(o->batch * o->m), (int)o->n, (int)o->k, 1, o->ha,
                    (int)o->k, o->hb, (int)o->n, 0, o->hc, (int)o->n);
        return now_ms() - start;
    }
    for (int64_t z = 0; z < o->batch; z++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)o->m, (int)o->n, (int)o->k, 1,
                    o->ha + z * o->m * o->k, (int)o->k, o->hb + z * o->k * o->n, (int)o->n, 0,
                    o->hc + z * o->m * o->n, (int)o->n);
    return now_ms() - start;
}

/* GFLOP/s of the two, timed in turn; NAN for kiln when a product failed. */
static void time_both(const operands *o, int reps, double *kiln, double *openblas)
{
    double k[MAX_REPS], b[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double tk = time_kiln(o), tb = time_openblas(o);
        if (r >= 0) {
            k[r] = tk;
            b[r] = tb;
        }
    }
    *kiln = gflop(o) / median(k, reps) * 1e3;
    *openblas = gflop(o) / median(b, reps) * 1e3;
}

int matmul_family_child(int index, int reps, bool quick)
{
    if (index < 0 || index >= N_SHAPES)
        return 2;
    operands o;
    if (operands_make(&SHAPES[index], quick, &o) < 0)
        return 1;
    double t[MAX_REPS];
    for (int r = -WARMUPS; r < reps; r++) {
        double ms = time_openblas(&o);
        if (r >= 0)
            t[r] = ms;
    }
    printf("%.6f %s\n", gflop(&o) / median(t, reps) * 1e3, openblas_get_corename());
    operands_free(&o);
    return 0;
}

/* OpenBLAS's core type with the widest vectors this CPU runs (x86), or
 * NULL. */
static const char *best_core(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2"))
        return "Haswell";
#endif
    return NULL;
}

/* Shape index's GFLOP/s with OpenBLAS forced to core, in a fresh process;
 * NAN when it failed or ran another core. */
static double forced_gflops(const char *self, const char *core, int index, int threads, int reps, bool quick)
{
    char cmd[1400], got[64] = "";
    snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s '%s' --threads %d --reps %d --probe matmul-openblas-%d matmul%s",
             core, self, threads, reps, index, quick ? " --quick" : "");
    FILE *p = popen(cmd, "r");
    double gflops = NAN;
    int read = p ? fscanf(p, "%lf %63s", &gflops, got) : 0;
    int status = p ? pclose(p) : -1;
    return read == 2 && status == 0 && !strcmp(got, core) ? gflops : NAN;
}

int matmul_family_run(const char *self, int threads, int reps, bool quick, FILE *out, bench_matmul *results)
{
    const char *found = openblas_get_corename(), *best = best_core();
    bool force = best && strcmp(found, best);
    *results = (bench_matmul){0};
    snprintf(results->openblas_core, sizeof results->openblas_core, "%s", found);
    snprintf(results->forced_core, sizeof results->forced_core, "%s", force ? best : "");
    fprintf(out, "f32 matrix products, GFLOP/s, %d threads, medians of %d runs; OpenBLAS chose core %s%s%s\n",
            threads, reps, found, force ? ", forced: " : "", force ? best : "");
    fprintf(out, "%-16s %-20s %10s %10s %10s %8s %8s\n", "shape", "batch x m x k x n", "kiln", "openblas",
            "forced", "vs found", "vs forced");
    for (int i = 0; i < N_SHAPES; i++) {
        operands o;
        if (operands_make(&SHAPES[i], quick, &o) < 0) {
            operands_free(&o);
            fprintf(stderr, "kiln-bench: matmul %s: %s\n", SHAPES[i].name, kiln_last_error());
            return -1;
        }
        double kiln, openblas, forced = NAN;
        time_both(&o, reps, &kiln, &openblas);
        if (force)
            forced = forced_gflops(self, best, i, threads, reps, quick);
        results->shapes[results->count++] = (bench_matmul_shape){
            .batch = o.batch, .m = o.m, .k = o.k, .n = o.n, .kiln_gflops = kiln, .openblas_gflops = openblas,
            .forced_gflops = forced};
        snprintf(results->shapes[i].name, sizeof results->shapes[i].name, "%s", SHAPES[i].name);
        char dims[64], b[5][32];
        snprintf(dims, sizeof dims, "%lldx%lldx%lldx%lld", (long long)o.batch, (long long)o.m, (long long)o.k,
                 (long long)o.n);
        fprintf(out, "%-16s %-20s %10s %10s %10s %8s %8s\n", SHAPES[i].name, dims, bench_number(b[0], 32, kiln, "%.1f"),
                bench_number(b[1], 32, openblas, "%.1f"), bench_number(b[2], 32, forced, "%.1f"), bench_number(b[3], 32, kiln / openblas, "%.2fx"),
                bench_number(b[4], 32, kiln / forced, "%.2fx"));
        operands_free(&o);
        if (isnan(kiln)) {
            fprintf(stderr, "kiln-bench: matmul %s: %s\n", SHAPES[i].name, kiln_last_error());
            return -1;
        }
    }
    return 0;
}
