/* A depthwise convolution's rows as LLVM IR (gemm.h's depthwise step): the
 * window's taps unrolled with the kernel's sizes as constants, the output
 * columns whose taps all fall inside the input in one loop the loop
 * vectorizer widens, the few at the borders in loops that read a clamped
 * column and weigh it 0. */
#include <stdio.h>
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "codegen_llvm/internal.h"

enum { MAX_TAPS = DEPTHWISE_MAX_TAPS };

typedef struct {
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMTypeRef t, i64;
    const kx_conv *c;
    LLVMValueRef row[MAX_TAPS]; /* each window row's input row (a valid one) */
    LLVMValueRef w[MAX_TAPS];   /* each tap's weight, 0 where its row is outside */
} dg;

static LLVMValueRef c64(const dg *g, int64_t v)
{
    return LLVMConstInt(g->i64, (unsigned long long)v, 1);
}

static LLVMValueRef param(const dg *g, unsigned i)
{
    return LLVMGetParam(g->fn, i);
}

static LLVMValueRef load(const dg *g, LLVMValueRef p, LLVMValueRef i)
{
    return LLVMBuildLoad2(g->b, g->t, LLVMBuildGEP2(g->b, g->t, p, &i, 1, ""), "");
}

static LLVMValueRef fmuladd(const dg *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c)
{
    unsigned id = LLVMLookupIntrinsicID("llvm.fmuladd", 12);
    LLVMTypeRef t = g->t;
    LLVMValueRef args[3] = {a, b, c};
    return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, &t, 1), LLVMGetIntrinsicDeclaration(g->m, id, &t, 1),
                          args, 3, "");
}

llvm_loop llvm_loop_begin(LLVMBuilderRef b, LLVMValueRef from, LLVMValueRef to, const char *name)
{
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
    LLVMValueRef fn = LLVMGetBasicBlockParent(pre);
    LLVMContextRef ctx = LLVMGetTypeContext(LLVMTypeOf(from));
    llvm_loop l = {LLVMAppendBasicBlockInContext(ctx, fn, name), LLVMAppendBasicBlockInContext(ctx, fn, "done"), NULL};
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, from, to, ""), l.body, l.exit);
    LLVMPositionBuilderAtEnd(b, l.body);
    l.index = LLVMBuildPhi(b, LLVMTypeOf(from), "");
    LLVMAddIncoming(l.index, &from, &pre, 1);
    return l;
}

void llvm_loop_end(LLVMBuilderRef b, llvm_loop *l, LLVMValueRef to)
{
    LLVMValueRef next = LLVMBuildAdd(b, l->index, LLVMConstInt(LLVMTypeOf(to), 1, 0), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(b);
    LLVMAddIncoming(l->index, &next, &latch, 1);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, next, to, ""), l->body, l->exit);
    LLVMPositionBuilderAtEnd(b, l->exit);
}

/* The input column of output column ow's tap j. */
static LLVMValueRef column(const dg *g, LLVMValueRef ow, int64_t j)
{
    int64_t off = j * g->c->dilation[1] - g->c->padding[1];
    return LLVMBuildAdd(g->b, LLVMBuildMul(g->b, ow, c64(g, g->c->stride[1]), ""), c64(g, off), "");
}

/* Output column ow of the row: its taps' sum into out; border: columns
 * outside the input read column 0 and weigh 0. */
static void emit_column(const dg *g, LLVMValueRef out, LLVMValueRef ow, bool border)
{
    const kx_conv *c = g->c;
    LLVMValueRef sum = LLVMConstReal(g->t, 0), zero = LLVMConstReal(g->t, 0), s_w = param(g, 3);
    for (int64_t j = 0; j < c->kw; j++) {
        LLVMValueRef col = column(g, ow, j), inside = NULL;
        if (border) {
            inside = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntSGE, col, c64(g, 0), ""),
                                  LLVMBuildICmp(g->b, LLVMIntSLT, col, c64(g, c->width), ""), "");
            col = LLVMBuildSelect(g->b, inside, col, c64(g, 0), "");
        }
        LLVMValueRef at = LLVMBuildMul(g->b, col, s_w, "");
        for (int64_t i = 0; i < c->kh; i++) {
            LLVMValueRef w = g->w[i * c->kw + j];
            if (border)
                w = LLVMBuildSelect(g->b, inside, w, zero, "");
            sum = fmuladd(g, w, load(g, g->row[i], at), sum);
        }
    }
    LLVMBuildStore(g->b, sum, LLVMBuildGEP2(g->b, g->t, out, &ow, 1, ""));
}

/* Output row oh: its window rows and weights, then its columns. */
static void emit_row(const dg *g_in, LLVMValueRef oh, int64_t lo, int64_t hi)
{
    dg g = *g_in;
    const kx_conv *c = g.c;
    LLVMValueRef plane = param(&g, 1), s_h = param(&g, 2), w = param(&g, 4);
    for (int64_t i = 0; i < c->kh; i++) {
        LLVMValueRef h = LLVMBuildAdd(g.b, LLVMBuildMul(g.b, oh, c64(&g, c->stride[0]), ""),
                                      c64(&g, i * c->dilation[0] - c->padding[0]), "");
        LLVMValueRef inside = LLVMBuildAnd(g.b, LLVMBuildICmp(g.b, LLVMIntSGE, h, c64(&g, 0), ""),
                                           LLVMBuildICmp(g.b, LLVMIntSLT, h, c64(&g, c->height), ""), "");
        LLVMValueRef at = LLVMBuildMul(g.b, LLVMBuildSelect(g.b, inside, h, c64(&g, 0), ""), s_h, "");
        g.row[i] = LLVMBuildGEP2(g.b, g.t, plane, &at, 1, "");
        for (int64_t j = 0; j < c->kw; j++)
            g.w[i * c->kw + j] = LLVMBuildSelect(g.b, inside, load(&g, w, c64(&g, i * c->kw + j)),
                                                 LLVMConstReal(g.t, 0), "");
    }
    LLVMValueRef first = LLVMBuildMul(g.b, LLVMBuildSub(g.b, oh, param(&g, 5), ""), c64(&g, c->out_width), "");
    LLVMValueRef out = LLVMBuildGEP2(g.b, g.t, param(&g, 0), &first, 1, "");
    const int64_t spans[3][2] = {{0, lo}, {lo, hi}, {hi, c->out_width}};
    for (int s = 0; s < 3; s++) {
        llvm_loop l = llvm_loop_begin(g.b, c64(&g, spans[s][0]), c64(&g, spans[s][1]), s == 1 ? "inside" : "border");
        emit_column(&g, out, l.index, s != 1);
        llvm_loop_end(g.b, &l, c64(&g, spans[s][1]));
    }
}

/* The output columns [*lo, *hi) whose taps all read inside the input. */
static void interior(const kx_conv *c, int64_t *lo, int64_t *hi)
{
    int64_t sw = c->stride[1];
    *lo = 0, *hi = c->out_width;
    for (int64_t j = 0; j < c->kw; j++) {
        int64_t off = j * c->dilation[1] - c->padding[1], last = c->width - 1 - off;
        int64_t first = off < 0 ? (-off + sw - 1) / sw : 0, end = last < 0 ? 0 : last / sw + 1;
        *lo = first > *lo ? first : *lo;
        *hi = end < *hi ? end : *hi;
    }
    *lo = *lo < c->out_width ? *lo : c->out_width;
    *hi = *hi > *lo ? *hi : *lo;
}

void depthwise_codegen(LLVMModuleRef m, const char *symbol, kiln_dtype dt, const kx_conv *c)
{
    LLVMContextRef ctx = LLVMGetModuleContext(m);
    dg g = {.ctx = ctx, .m = m, .b = LLVMCreateBuilderInContext(ctx), .i64 = LLVMInt64TypeInContext(ctx), .c = c,
            .t = dt == KILN_F64 ? LLVMDoubleTypeInContext(ctx) : LLVMFloatTypeInContext(ctx)};
    LLVMTypeRef ptr = LLVMPointerTypeInContext(ctx, 0);
    LLVMTypeRef params[7] = {ptr, ptr, g.i64, g.i64, ptr, g.i64, g.i64};
    char name[192];
    snprintf(name, sizeof name, "%s%s", symbol, GEMM_DEPTHWISE);
    g.fn = LLVMAddFunction(m, name, LLVMFunctionType(LLVMVoidTypeInContext(ctx), params, 7, 0));
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (unsigned p = 1; p <= 2; p++)
        LLVMAddAttributeAtIndex(g.fn, p, LLVMCreateEnumAttribute(ctx, noalias, 0));
    LLVMPositionBuilderAtEnd(g.b, LLVMAppendBasicBlockInContext(ctx, g.fn, "entry"));
    int64_t lo, hi;
    interior(c, &lo, &hi);
    llvm_loop rows = llvm_loop_begin(g.b, param(&g, 5), param(&g, 6), "row");
    emit_row(&g, rows.index, lo, hi);
    llvm_loop_end(g.b, &rows, param(&g, 6));
    LLVMBuildRetVoid(g.b);
    LLVMDisposeBuilder(g.b);
}
