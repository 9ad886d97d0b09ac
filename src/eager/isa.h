/* The eager kernels compiled once per x86-64 level, and the level a process runs.
 *
 * kernels.c, convert.c and the loops of reduce.c are where eager time goes.
 * A default build compiles them once for the compiler's own target (every
 * x86-64: "base") and again with -march=x86-64-v2, -v3 and -v4 (v3 and v4
 * twice: tuned for any CPU, and as v3z and v4z for AMD's Zen), each copy
 * with its own names: meson passes EAGER_ISA (v2, v3, v3z, v4 or v4z) and
 * EAGER_ISA_VARIANT, and ISA_NAME(f) appends the level to f. isa.c picks the
 * best level the CPU runs once, at start-up, and the names the other files
 * call (kernel_for, convert, strided_gather, strided_scatter) go through it.
 * A -Dnative=true build compiles them once, for the build machine. */
#ifndef KILN_EAGER_ISA_H
#define KILN_EAGER_ISA_H

#ifndef EAGER_ISA
#define EAGER_ISA base
#endif
#define ISA_JOIN_(f, level) f##_##level
#define ISA_JOIN(f, level) ISA_JOIN_(f, level)
#define ISA_NAME(f) ISA_JOIN(f, EAGER_ISA)

#include "eager/internal.h"

/* One level's entry points. */
typedef struct {
    const char *name; /* "x86-64-v3", ... */
    ew_kernel (*kernel_for)(ir_op op, kiln_dtype compute);
    void (*convert)(void *dst, kiln_dtype dst_dt, const void *src, kiln_dtype src_dt, int64_t n,
                    int64_t src_stride);
    void (*strided_gather)(void *dst, kiln_dtype dst_dt, const strided *src, int64_t begin, int64_t count);
    void (*strided_scatter)(const strided *dst, const void *src, int64_t begin, int64_t count);
    core_range_fn reduce_rows, reduce_tiles; /* reduce.c's loops, over a reduce plan */
} eager_isa;

/* One level's definitions: the names of internal.h with the level appended,
 * and reduce.c's loops over a reduce plan's rows and tiles of columns. */
#define ISA_DECLARE(level) ISA_DECLARE_(level)
#define ISA_DECLARE_(level)                                            \
    __typeof__(kernel_for) kernel_for_##level;                         \
    __typeof__(convert) convert_##level;                               \
    __typeof__(strided_gather) strided_gather_##level;                 \
    __typeof__(strided_scatter) strided_scatter_##level;               \
    void reduce_rows_##level(void *plan, int64_t begin, int64_t end);  \
    void reduce_tiles_##level(void *plan, int64_t begin, int64_t end);
ISA_DECLARE(EAGER_ISA)

/* The level this process runs, chosen once. */
const eager_isa *eager_isa_current(void);

#endif
