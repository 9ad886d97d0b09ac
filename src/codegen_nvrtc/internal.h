/* What the files of src/codegen_nvrtc share. */
#ifndef KILN_CODEGEN_NVRTC_INTERNAL_H
#define KILN_CODEGEN_NVRTC_INTERNAL_H

#include "codegen_nvrtc/nvrtc.h"
#include "core/core.h"

/* k as a CUDA C translation unit whose kernel is the extern "C" name,
 * malloc'd; NULL with the reason in err. */
char *nvrtc_source(const kx_kernel *k, const char *name, char *err, size_t err_size);

/* How nvrtc_source lays k over its grid: a block per row when it reduces
 * rows, else a thread per element, or per 4 (float4 quads, never for
 * symbolic sizes). Its loops stride, so any grid computes it all. */
typedef struct {
    bool per_row, quads;
} nvrtc_layout;
nvrtc_layout nvrtc_layout_of(const kx_kernel *k);
/* How many rows or threads' items a kernel of rows x cols laid out as l has. */
int64_t nvrtc_items(const nvrtc_layout *l, int64_t rows, int64_t cols);

/* -- cuda.c: a kernel's rows in CUDA C, also for matmul.c's epilogues -------- */

/* Writing one kernel's CUDA C. */
typedef struct {
    const kx_kernel *k;
    strbuf *s;
    bool quads;    /* each thread does 4 consecutive elements, through float4 */
    /* When replacement is not NULL, loads of view replaced are that C
     * expression instead: a value the kernel already holds. */
    int replaced;
    const char *replacement;
    char err[256];
} nvrtc_gen;

/* Which expressions a new loop has declared: none yet (calloc'd, the caller
 * frees it). NULL, with g->err set, when out of memory. */
bool *nvrtc_new_loop(nvrtc_gen *g);
/* Declares "e<n>" for expression n, and first those it needs not yet
 * declared in this loop (done[]). */
void nvrtc_emit_expr(nvrtc_gen *g, int n, bool *done);
/* Declares v<n>, each view's first element of the row in C variable "row". */
void nvrtc_view_bases(nvrtc_gen *g);
/* Stores st's value at element "i" of the row, converted to its view's dtype. */
void nvrtc_store_value(nvrtc_gen *g, const kx_store *st, bool *done);

/* -- expr.c: kiln's values in CUDA C ----------------------------------------- */

/* Device functions every kernel may call (kiln_f2i, kiln_max, kiln_fold_max,
 * kiln_sigmoid, kiln_shfl, ...): put it first in each translation unit. */
extern const char NVRTC_PRELUDE[];
/* The C type holding dt ("unsigned char" for bool). */
const char *nvrtc_ctype(kiln_dtype dt);
/* Writes v as a constant of dt. */
void nvrtc_constant(strbuf *s, kiln_dtype dt, double v);
/* Writes expression text of dtype from converted to to, as kiln_cast does. */
void nvrtc_convert(strbuf *s, const char *text, kiln_dtype from, kiln_dtype to);
/* Writes elementwise op applied to expressions a, b, c (unused ones may be
 * NULL), all of dtype operand (for OP_WHERE: a is the bool condition and
 * operand the dtype of b and c); the result has the op's result dtype.
 * false when the op has no CUDA form for that dtype. */
bool nvrtc_op(strbuf *s, ir_op op, kiln_dtype operand, const char *a, const char *b, const char *c);
/* Writes v as a constant of dt. */
void nvrtc_value(strbuf *s, kiln_dtype dt, kx_value v);
/* Writes the identity of reduction op (OP_SUM, OP_MEAN, OP_MAX, OP_MIN) in dt. */
void nvrtc_reduction_init(strbuf *s, ir_op op, kiln_dtype dt);
/* Writes the statement "acc = fold(acc, value);" of reduction op in dt. */
void nvrtc_fold(strbuf *s, ir_op op, kiln_dtype dt, const char *acc, const char *value);

/* -- lines.c: cumsum, top-k, gather and scatter_add -------------------------- */

/* The CUDA C of generic kernel k of kind KG_SCAN, KG_TOPK or KG_INDEX
 * (checked already), extern "C" name, malloc'd; NULL with why in err. */
char *nvrtc_lines_source(const kg_kernel *k, const char *name, char *err, size_t err_size);

/* -- matmul.c: tiled matrix products ---------------------------------------- */

/* The CUDA C of matmul kernel k, extern "C" name, malloc'd; NULL with the
 * reason in err. */
char *nvrtc_matmul_source(const kg_kernel *k, const char *name, char *err, size_t err_size);
/* An f32 matmul whose product goes, tile by tile from registers, through
 * elementwise kernel epilogue instead of to memory: epilogue's buffer
 * epilogue->product is the product [batch * m, n], read through one
 * contiguous view. Kernel name(kg_matmul_args, const float *A, const float
 * *B, then epilogue's buffers in order, the product's never read), launched
 * as the eager f32 matmul. malloc'd; NULL with why the epilogue does not fit
 * in err. */
char *nvrtc_matmul_epilogue_source(const kx_kernel *epilogue, const char *name, char *err, size_t err_size);

#endif
