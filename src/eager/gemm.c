/* Which engine eager's f32 and f64 CPU products run on, and running kiln's
 * own (the CPU backend's generated GEMM, through the compile-or-load
 * service's generic kernels).
 *
 * The rule, decided once per process (kiln.h states it): KILN_MATMUL=kiln
 * or =openblas names the engine; otherwise kiln's GEMM runs where this build
 * has a CPU code generator that makes one and OpenBLAS's kernels for the core
 * it picked are narrower than this CPU's vectors (it picks the SSE3 kernels
 * of "Prescott" or the AVX2 ones of "Haswell" on CPUs with AVX-512 it does
 * not know), and OpenBLAS everywhere else. Where kiln's GEMM cannot be made
 * (KILN_CACHE=require without it, say), that product runs on OpenBLAS. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "eager/internal.h"
#include "kernels/kernels.h"

char *openblas_get_corename(void);

static struct {
    pthread_once_t once;
    bool kiln;
    const kx_backend *backend;
} engine = {.once = PTHREAD_ONCE_INIT};

/* Bits of the widest vectors of OpenBLAS's kernels for core (0: unknown). */
static int core_bits(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "CooperLake", "SapphireRapids"};
    static const char *const avx[] = {"Haswell", "Zen", "Excavator", "Steamroller", "Piledriver", "Bulldozer",
                                      "Sandybridge"};
    static const char *const sse[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Opteron",
                                      "Opteron(SSE3)", "Barcelona", "Nano", "Bobcat", "Athlon", "Northwood",
                                      "Coppermine", "Katmai", "Banias"};
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcmp(core, avx512[i]))
            return 512;
    for (size_t i = 0; i < sizeof avx / sizeof *avx; i++)
        if (!strcmp(core, avx[i]))
            return 256;
    for (size_t i = 0; i < sizeof sse / sizeof *sse; i++)
        if (!strcmp(core, sse[i]))
            return 128;
    return 0;
}

/* Bits of this CPU's widest vectors; 0 where kiln does not ask (not x86). */
static int host_bits(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return 512;
    if (__builtin_cpu_supports("avx2"))
        return 256;
    return 128;
#else
    return 0;
#endif
}

static void decide(void)
{
    engine.backend = kernels_backend_for(KILN_CPU);
    if (engine.backend && !engine.backend->host_matmul)
        engine.backend = NULL;
    const char *asked = getenv("KILN_MATMUL");
    if (asked && (!strcmp(asked, "kiln") || !strcmp(asked, "openblas"))) {
        engine.kiln = engine.backend && !strcmp(asked, "kiln");
        return;
    }
    int host = host_bits();
    engine.kiln = engine.backend && host > 0 && core_bits(openblas_get_corename()) < host;
}

bool eager_gemm_is_kiln(void)
{
    pthread_once(&engine.once, decide);
    return engine.kiln;
}

KILN_API const char *kiln_matmul_engine(void)
{
    return eager_gemm_is_kiln() ? "kiln" : "openblas";
}

/* -- Running it ----------------------------------------------------------------- */

/* The loaded generic kernel per dtype (f32, f64), made by the first product. */
static struct {
    pthread_mutex_t lock;
    kg_code code[2];
    _Atomic bool ready[2];
    bool warned;
} loaded = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const kg_code *code_for(kiln_dtype dt)
{
    int i = dt == KILN_F64;
    if (atomic_load(&loaded.ready[i]))
        return &loaded.code[i];
    kg_kernel k = {.kind = KG_MATMUL, .op = OP_MATMUL, .n_in = 2, .in = {dt, dt}, .compute = dt, .acc = dt,
                   .out = dt};
    char err[512];
    pthread_mutex_lock(&loaded.lock);
    bool ready = atomic_load(&loaded.ready[i]);
    if (!ready && kernels_generic(KILN_CPU, &k, &loaded.code[i], err, sizeof err) == 0)
        atomic_store(&loaded.ready[i], ready = true);
    else if (!ready && !loaded.warned && core_env_int("KILN_LOG", 0) > 0) {
        loaded.warned = true;
        fprintf(stderr, "kiln: products run on OpenBLAS: kiln's GEMM is not there (%s)\n", err);
    }
    pthread_mutex_unlock(&loaded.lock);
    return ready ? &loaded.code[i] : NULL;
}

bool eager_gemm_ready(kiln_dtype dt)
{
    return eager_gemm_is_kiln() && code_for(dt);
}

int eager_gemm_run(const char *fn, kiln_dtype dt, const kg_matmul_args *args, void *out, const void *a,
                   const void *b)
{
    const kg_code *code = eager_gemm_is_kiln() ? code_for(dt) : NULL;
    if (!code)
        return 0;
    char err[256];
    if (engine.backend->host_matmul(code, args, out, a, b, err, sizeof err) < 0)
        return core_fail(CORE_NOMEM, fn, "%s", err);
    return 1;
}
