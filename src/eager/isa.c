/* Chooses the eager kernels' level once, at start-up: the best the CPU runs. */
#include <string.h>

#include "eager/isa.h"

#ifdef EAGER_ISA_X86_LEVELS
ISA_DECLARE(v2)
ISA_DECLARE(v3)
ISA_DECLARE(v4)
#endif

#if defined(EAGER_ISA_NATIVE)
#define BASE_NAME "native"
#elif defined(__x86_64__)
#define BASE_NAME "x86-64"
#else
#define BASE_NAME "generic"
#endif

#define LEVEL(name, level) \
    {name, kernel_for_##level, convert_##level, strided_gather_##level, strided_scatter_##level, \
     reduce_rows_##level, reduce_tiles_##level}

static const eager_isa levels[] = {
    LEVEL(BASE_NAME, base),
#ifdef EAGER_ISA_X86_LEVELS
    LEVEL("x86-64-v2", v2),
    LEVEL("x86-64-v3", v3),
    LEVEL("x86-64-v4", v4),
#endif
};
enum { N_LEVELS = sizeof levels / sizeof *levels };

/* Set before main by choose(); the base level until then. */
static const eager_isa *current = &levels[0];
/* current's kernels, looked up once: kernel_for runs on every eager op. */
static ew_kernel kernels[OP__COUNT][KILN_BOOL + 1];

/* Whether this CPU (and its OS, for the AVX registers) runs levels[i]. As
 * CPUID reports it: under valgrind, the level valgrind emulates. */
static bool cpu_runs(int i)
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
    const bool runs[] = {true, v2, v3, v4};
    return runs[i];
#else
    return i == 0;
#endif
}

static int level_named(const char *name)
{
    for (int i = 0; i < N_LEVELS; i++)
        if (!strcmp(levels[i].name, name))
            return i;
    return -1;
}

/* KILN_ISA names a lower level to run (tests compare the levels). */
__attribute__((constructor)) static void choose(void)
{
    int best = 0;
    while (best + 1 < N_LEVELS && cpu_runs(best + 1))
        best++;
    const char *want = getenv("KILN_ISA");
    if (want && *want) {
        int i = level_named(want);
        if (i < 0)
            fprintf(stderr, "kiln: warning: KILN_ISA=%s is not a level of this build; running %s\n", want,
                    levels[best].name);
        else if (i > best)
            fprintf(stderr, "kiln: warning: KILN_ISA=%s: this CPU runs %s at most\n", want, levels[best].name);
        else
            best = i;
    }
    current = &levels[best];
    for (int op = 0; op < OP__COUNT; op++)
        for (int dt = 0; dt <= KILN_BOOL; dt++)
            kernels[op][dt] = current->kernel_for((ir_op)op, (kiln_dtype)dt);
}

const eager_isa *eager_isa_current(void)
{
    return current;
}

const char *kiln_eager_isa(void)
{
    return current->name;
}

/* -- The names the other files call ---------------------------------------- */

ew_kernel kernel_for(ir_op op, kiln_dtype compute)
{
    ew_kernel k = kernels[op][compute]; /* NULL before choose() runs, or for no kernel */
    return k ? k : current->kernel_for(op, compute);
}

void convert(void *dst, kiln_dtype dst_dt, const void *src, kiln_dtype src_dt, int64_t n, int64_t stride)
{
    current->convert(dst, dst_dt, src, src_dt, n, stride);
}

void strided_gather(void *dst, kiln_dtype dst_dt, const strided *src, int64_t begin, int64_t count)
{
    current->strided_gather(dst, dst_dt, src, begin, count);
}

void strided_scatter(const strided *dst, const void *src, int64_t begin, int64_t count)
{
    current->strided_scatter(dst, src, begin, count);
}
