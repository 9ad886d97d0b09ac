/* What the files of src/codegen_nvrtc share. */
#ifndef KILN_CODEGEN_NVRTC_INTERNAL_H
#define KILN_CODEGEN_NVRTC_INTERNAL_H

#include "codegen_nvrtc/nvrtc.h"
#include "ir/strbuf.h"

enum { NVRTC_BLOCK = 256 }; /* threads per block, a multiple of the warp */

/* k as a CUDA C translation unit whose kernel is the extern "C" name,
 * malloc'd; NULL with the reason in err. */
char *nvrtc_source(const kx_kernel *k, const char *name, char *err, size_t err_size);

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
/* Writes the identity of reduction op (OP_SUM, OP_MEAN, OP_MAX, OP_MIN) in dt. */
void nvrtc_reduction_init(strbuf *s, ir_op op, kiln_dtype dt);
/* Writes the statement "acc = fold(acc, value);" of reduction op in dt. */
void nvrtc_fold(strbuf *s, ir_op op, kiln_dtype dt, const char *acc, const char *value);

#endif
