/* Attention's online softmax step (gemm.h's attention_online_fn) as LLVM IR:
 * scalar loops over a block's rows, which the loop vectorizer widens. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen_llvm/gemm_codegen.h"
#include "codegen_llvm/internal.h"
#include "codegen_llvm/math.h"

typedef struct {
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMTypeRef t, i64, ptr;
    LLVMValueRef acc;  /* a stack slot of dtype t the loops fold into */
    LLVMValueRef vacc; /* and one of a vector of LANES of them */
} ag;

typedef llvm_loop aloop;

static LLVMValueRef c64(const ag *g, int64_t v)
{
    return LLVMConstInt(g->i64, (unsigned long long)v, 1);
}

static LLVMValueRef at(const ag *g, LLVMValueRef p, LLVMValueRef i)
{
    return LLVMBuildGEP2(g->b, g->t, p, &i, 1, "");
}

static LLVMValueRef get(const ag *g, LLVMValueRef p, LLVMValueRef i)
{
    return LLVMBuildLoad2(g->b, g->t, at(g, p, i), "");
}

/* for (index = 0; index < n; index++): the body follows at the builder. */
static aloop loop_begin(const ag *g, LLVMValueRef n, const char *name)
{
    return llvm_loop_begin(g->b, c64(g, 0), n, name);
}

static void loop_end(const ag *g, aloop *l, LLVMValueRef n)
{
    llvm_loop_end(g->b, l, n);
}

enum { LANES = 16 };

static LLVMValueRef call(const ag *g, const char *name, LLVMTypeRef type, LLVMValueRef *args, unsigned n)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, &type, 1), LLVMGetIntrinsicDeclaration(g->m, id, &type, 1),
                          args, n, "");
}

/* The largest of start and the row's cols values: whole vectors of LANES
 * (llvm.maxnum, which the loop vectorizer does not fold across lanes), then
 * the rest one by one. */
static LLVMValueRef row_max(const ag *g, LLVMValueRef row, LLVMValueRef cols, LLVMValueRef start)
{
    LLVMTypeRef vt = LLVMVectorType(g->t, LANES);
    LLVMValueRef vacc = g->vacc, splat[LANES];
    for (int l = 0; l < LANES; l++)
        splat[l] = LLVMConstReal(g->t, -INFINITY);
    LLVMBuildStore(g->b, LLVMConstVector(splat, LANES), vacc);
    LLVMValueRef vectors = LLVMBuildSDiv(g->b, cols, c64(g, LANES), "");
    aloop v = loop_begin(g, vectors, "max");
    LLVMValueRef x = LLVMBuildLoad2(g->b, vt, at(g, row, LLVMBuildMul(g->b, v.index, c64(g, LANES), "")), "");
    LLVMSetAlignment(x, (unsigned)LLVMABISizeOfType(LLVMGetModuleDataLayout(g->m), g->t));
    LLVMValueRef args[2] = {LLVMBuildLoad2(g->b, vt, vacc, ""), x};
    LLVMBuildStore(g->b, call(g, "llvm.maxnum", vt, args, 2), vacc);
    loop_end(g, &v, vectors);
    LLVMValueRef reduced = LLVMBuildLoad2(g->b, vt, vacc, "");
    LLVMValueRef folded[2] = {start, call(g, "llvm.vector.reduce.fmax", vt, &reduced, 1)};
    LLVMBuildStore(g->b, call(g, "llvm.maxnum", g->t, folded, 2), g->acc);
    LLVMValueRef done = LLVMBuildMul(g->b, vectors, c64(g, LANES), ""), rest = LLVMBuildSub(g->b, cols, done, "");
    aloop j = loop_begin(g, rest, "max_rest");
    LLVMValueRef one[2] = {LLVMBuildLoad2(g->b, g->t, g->acc, ""), get(g, row, LLVMBuildAdd(g->b, done, j.index, ""))};
    LLVMBuildStore(g->b, call(g, "llvm.maxnum", g->t, one, 2), g->acc);
    loop_end(g, &j, rest);
    return LLVMBuildLoad2(g->b, g->t, g->acc, "");
}

/* exp(x - shift) of each of the row's cols values into p (each mr apart):
 * their sum, added in any order. */
static LLVMValueRef exps(const ag *g, LLVMValueRef row, LLVMValueRef cols, LLVMValueRef shift, LLVMValueRef p, int mr)
{
    LLVMBuildStore(g->b, LLVMConstReal(g->t, 0), g->acc);
    aloop j = loop_begin(g, cols, "exp");
    LLVMValueRef e = math_emit(g->m, g->b, OP_EXP, LLVMBuildFSub(g->b, get(g, row, j.index), shift, ""));
    LLVMBuildStore(g->b, e, at(g, p, LLVMBuildMul(g->b, j.index, c64(g, mr), "")));
    LLVMValueRef sum = LLVMBuildFAdd(g->b, LLVMBuildLoad2(g->b, g->t, g->acc, ""), e, "");
    LLVMSetFastMathFlags(sum, LLVMFastMathAllowReassoc);
    LLVMBuildStore(g->b, sum, g->acc);
    loop_end(g, &j, cols);
    return LLVMBuildLoad2(g->b, g->t, g->acc, "");
}

static void scale_row(const ag *g, LLVMValueRef row, LLVMValueRef n, LLVMValueRef by)
{
    aloop c = loop_begin(g, n, "rescale");
    LLVMBuildStore(g->b, LLVMBuildFMul(g->b, get(g, row, c.index), by, ""), at(g, row, c.index));
    loop_end(g, &c, n);
}

/* Row r of the block: gemm.h's attention_online_fn says what. Whether its
 * sum grew, as an i64. */
static LLVMValueRef online_row(const ag *g, LLVMValueRef r, gemm_shape s)
{
    LLVMValueRef s_block = LLVMGetParam(g->fn, 0), cols = LLVMGetParam(g->fn, 2), max = LLVMGetParam(g->fn, 3);
    LLVMValueRef sum = LLVMGetParam(g->fn, 4), o = LLVMGetParam(g->fn, 5), o_cols = LLVMGetParam(g->fn, 6);
    LLVMValueRef ld_o = LLVMGetParam(g->fn, 7), p = LLVMGetParam(g->fn, 8), mr = c64(g, s.mr);
    LLVMValueRef row = at(g, s_block, LLVMBuildMul(g->b, r, c64(g, (int64_t)ATTENTION_BLOCK_TILES * s.nr), ""));
    LLVMValueRef old = get(g, max, r), new = row_max(g, row, cols, old);
    /* Nothing but -inf so far: shift by 0, so every exp is 0, not NaN. */
    LLVMValueRef none = LLVMBuildFCmp(g->b, LLVMRealOEQ, new, LLVMConstReal(g->t, -INFINITY), "");
    LLVMValueRef shift = LLVMBuildSelect(g->b, none, LLVMConstReal(g->t, 0), new, "");
    LLVMValueRef scale = math_emit(g->m, g->b, OP_EXP, LLVMBuildFSub(g->b, old, shift, ""));
    LLVMValueRef panel = LLVMBuildMul(g->b, LLVMBuildSDiv(g->b, r, mr, ""), LLVMBuildMul(g->b, cols, mr, ""), "");
    LLVMValueRef p_row = at(g, p, LLVMBuildAdd(g->b, panel, LLVMBuildSRem(g->b, r, mr, ""), ""));
    LLVMValueRef added = exps(g, row, cols, shift, p_row, s.mr);
    LLVMValueRef total = LLVMBuildFAdd(g->b, LLVMBuildFMul(g->b, get(g, sum, r), scale, ""), added, "");
    LLVMBuildStore(g->b, total, at(g, sum, r));
    LLVMBuildStore(g->b, new, at(g, max, r));
    scale_row(g, at(g, o, LLVMBuildMul(g->b, r, ld_o, "")), o_cols, scale);
    LLVMValueRef grew = LLVMBuildFCmp(g->b, LLVMRealOGT, added, LLVMConstReal(g->t, 0), "");
    return LLVMBuildZExt(g->b, grew, g->i64, "");
}

int attention_codegen(LLVMModuleRef module, const char *symbol, kiln_dtype dt, gemm_shape s, char *err,
                      size_t err_size)
{
    LLVMContextRef ctx = LLVMGetModuleContext(module);
    ag g = {.ctx = ctx, .m = module, .b = LLVMCreateBuilderInContext(ctx), .i64 = LLVMInt64TypeInContext(ctx),
            .ptr = LLVMPointerTypeInContext(ctx, 0),
            .t = dt == KILN_F64 ? LLVMDoubleTypeInContext(ctx) : LLVMFloatTypeInContext(ctx)};
    char name[192];
    if (snprintf(name, sizeof name, "%s%s", symbol, GEMM_ONLINE) >= (int)sizeof name) {
        snprintf(err, err_size, "the symbol %s is too long", symbol);
        LLVMDisposeBuilder(g.b);
        return -1;
    }
    LLVMTypeRef params[9] = {g.ptr, g.i64, g.i64, g.ptr, g.ptr, g.ptr, g.i64, g.i64, g.ptr};
    g.fn = LLVMAddFunction(module, name, LLVMFunctionType(g.i64, params, 9, 0));
    LLVMPositionBuilderAtEnd(g.b, LLVMAppendBasicBlockInContext(ctx, g.fn, "entry"));
    g.acc = LLVMBuildAlloca(g.b, g.t, "acc");
    g.vacc = LLVMBuildAlloca(g.b, LLVMVectorType(g.t, LANES), "vacc");
    LLVMValueRef grew = LLVMBuildAlloca(g.b, g.i64, "grew"), rows = LLVMGetParam(g.fn, 1);
    LLVMBuildStore(g.b, c64(&g, 0), grew);
    aloop r = loop_begin(&g, rows, "row");
    LLVMValueRef any = LLVMBuildOr(g.b, LLVMBuildLoad2(g.b, g.i64, grew, ""), online_row(&g, r.index, s), "");
    LLVMBuildStore(g.b, any, grew);
    loop_end(&g, &r, rows);
    LLVMBuildRet(g.b, LLVMBuildLoad2(g.b, g.i64, grew, ""));
    LLVMDisposeBuilder(g.b);
    return 0;
}
