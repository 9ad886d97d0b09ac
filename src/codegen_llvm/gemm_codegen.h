/* Emitting a matrix product's functions (codegen_llvm/gemm.h names them)
 * as LLVM IR, sized for a target's vector registers. Private to
 * src/codegen_llvm. */
#ifndef KILN_CODEGEN_LLVM_GEMM_CODEGEN_H
#define KILN_CODEGEN_LLVM_GEMM_CODEGEN_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "codegen_llvm/gemm.h"

/* The register tile: mr rows of C by nr = nv vectors of lanes elements. */
typedef struct {
    int lanes;  /* elements of the product's dtype in a vector register */
    int mr, nv;
    int nr;     /* nv * lanes */
} gemm_shape;

/* The vector registers of a target, as LLVM compiles for it. */
typedef struct {
    int bits;   /* of the widest vector LLVM keeps in one register: 512, 256, 128 */
    int count;  /* how many there are */
} gemm_registers;

/* What the target machine tm gives vectors (found by compiling a probe). */
gemm_registers gemm_probe_registers(LLVMTargetMachineRef tm);
/* The register tile for products of dt (f32, f64) on registers r. */
gemm_shape gemm_shape_for(kiln_dtype dt, gemm_registers r);

/* Adds a product's functions of dtype dt for shape s to module under
 * symbol. With epilogue, the micro-kernel hands each final tile to the
 * function "<symbol>.epilogue" of module (codegen_epilogue's), else stores
 * it, and calls "<symbol>" GEMM_EPILOGUE_PREFETCH (codegen_epilogue's
 * too) before the k loop, of one step or more, of a final tile. 0, or -1
 * with why in err. */
int gemm_codegen(LLVMModuleRef module, const char *symbol, kiln_dtype dt, gemm_shape s, bool epilogue, char *err,
                 size_t err_size);

/* Adds attention's online softmax step of dtype dt for tile s to module:
 * "<symbol>" GEMM_ONLINE, gemm.h's attention_online_fn. 0, or -1 with why
 * in err. */
int attention_codegen(LLVMModuleRef module, const char *symbol, kiln_dtype dt, gemm_shape s, char *err,
                      size_t err_size);

#endif
