/* Chooses the eager kernels' level once, at start-up: the best the CPU runs. */
#include <string.h>

#include "eager/isa.h"

#ifdef EAGER_ISA_X86_LEVELS
ISA_DECLARE(v2)
ISA_DECLARE(v3)
ISA_DECLARE(v3z)
ISA_DECLARE(v4)
ISA_DECLARE(v4z)
#endif

#if defined(EAGER_ISA_NATIVE)
#define BASE_NAME "native"
#elif defined(__x86_64__)
#define BASE_NAME "x86-64"
#else
#define BASE_NAME "generic"
#endif

/* A level: the x86-64 level its code needs (0 for the base) and whether it
 * is tuned for AMD's Zen rather than for any CPU. */
typedef struct {
    eager_isa isa;
    int rank;
    bool zen;
} level;

#define ISA(name, symbol) \
    {name, kernel_for_##symbol, convert_##symbol, strided_gather_##symbol, strided_scatter_##symbol, \
     reduce_rows_##symbol, reduce_tiles_##symbol}
#define LEVEL(name, symbol, rank, zen) {ISA(name, symbol), rank, zen}

static const level levels[] = {
    LEVEL(BASE_NAME, base, 0, false),
#ifdef EAGER_ISA_X86_LEVELS
    LEVEL("x86-64-v2", v2, 1, false),
    LEVEL("x86-64-v3", v3, 2, false),
    LEVEL("x86-64-v3-zen", v3z, 2, true),
    LEVEL("x86-64-v4", v4, 3, false),
    LEVEL("x86-64-v4-zen", v4z, 3, true),
#endif
};
enum { N_LEVELS = sizeof levels / sizeof *levels };

/* A copy of the level chosen before main by choose() (the base level until
 * then): one cache line to read on the way to a kernel, not two. */
static _Alignas(64) eager_isa current = ISA(BASE_NAME, base);
/* Its kernels, looked up once: kernel_for runs on every eager op. */
static ew_kernel kernels[OP__COUNT][KILN_BOOL + 1];

/* The highest x86-64 level this CPU (and its OS, for the AVX registers)
 * runs, as CPUID reports it: under valgrind, the level valgrind emulates. */
static int cpu_rank(void)
{
#ifdef EAGER_ISA_X86_LEVELS
    __builtin_cpu_init();
#if defined(__clang__) /* knows features, not levels */
    bool v2 = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt");
    bool v3 = v2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("bmi2");
    bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    bool v2 = __builtin_cpu_supports("x86-64-v2"), v3 = __builtin_cpu_supports("x86-64-v3"),
         v4 = __builtin_cpu_supports("x86-64-v4");
#endif
    return v4 ? 3 : v3 ? 2 : v2 ? 1 : 0;
#else
    return 0;
#endif
}

static bool cpu_is_amd(void)
{
#ifdef EAGER_ISA_X86_LEVELS
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
#else
    return false;
#endif
}

static int level_named(const char *name)
{
    for (int i = 0; i < N_LEVELS; i++)
        if (!strcmp(levels[i].isa.name, name))
            return i;
    return -1;
}

/* The level of that rank tuned for this CPU's maker where there is one. */
static int best_level(int rank)
{
    int best = 0;
    for (int i = 0; i < N_LEVELS; i++)
        if (levels[i].rank == rank && (levels[best].rank < rank || levels[i].zen == cpu_is_amd()))
            best = i;
    return best;
}

/* KILN_ISA names another level the CPU runs (tests compare the levels). */
__attribute__((constructor)) static void choose(void)
{
    int rank = cpu_rank(), best = best_level(rank);
    const char *want = getenv("KILN_ISA");
    if (want && *want) {
        int i = level_named(want);
        if (i < 0)
            fprintf(stderr, "kiln: warning: KILN_ISA=%s is not a level of this build; running %s\n", want,
                    levels[best].isa.name);
        else if (levels[i].rank > rank)
            fprintf(stderr, "kiln: warning: KILN_ISA=%s: this CPU runs %s at most\n", want, levels[best].isa.name);
        else
            best = i;
    }
    current = levels[best].isa;
    for (int op = 0; op < OP__COUNT; op++)
        for (int dt = 0; dt <= KILN_BOOL; dt++)
            kernels[op][dt] = current.kernel_for((ir_op)op, (kiln_dtype)dt);
}

const eager_isa *eager_isa_current(void)
{
    return &current;
}

const char *kiln_eager_isa(void)
{
    return current.name;
}

/* -- The names the other files call ---------------------------------------- */

ew_kernel kernel_for(ir_op op, kiln_dtype compute)
{
    ew_kernel k = kernels[op][compute]; /* NULL before choose() runs, or for no kernel */
    return k ? k : current.kernel_for(op, compute);
}

void convert(void *dst, kiln_dtype dst_dt, const void *src, kiln_dtype src_dt, int64_t n, int64_t stride)
{
    current.convert(dst, dst_dt, src, src_dt, n, stride);
}

void strided_gather(void *dst, kiln_dtype dst_dt, const strided *src, int64_t begin, int64_t count)
{
    current.strided_gather(dst, dst_dt, src, begin, count);
}

void strided_scatter(const strided *dst, const void *src, int64_t begin, int64_t count)
{
    current.strided_scatter(dst, src, begin, count);
}
