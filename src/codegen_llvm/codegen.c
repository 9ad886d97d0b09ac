/* Kernel IR to LLVM IR: a loop over rows around one loop over the row's
 * elements per reduction and one for the stores, written so that LLVM's loop
 * vectorizer widens the inner loops.
 *
 * Each kernel becomes two functions: its body, whose buffer pointers are
 * separate noalias parameters (outputs are fresh, so they never alias an
 * input, and the vectorizer needs to know it), and an entry with the common
 * signature void(ptr buffers, i64 begin, i64 end, ptr symbols) that loads
 * the pointers and calls the body. A symbolic size (rows, cols, strides) is
 * its polynomial evaluated once, in the body's entry, from the symbols'
 * values (i64 each). Sums may be reassociated (as eager's vectorized sums
 * are), and in the store pass a division by a value of the row (softmax's
 * by its sum) is a product with its reciprocal, taken once a row, in rows
 * where every such reciprocal is a normal number (a division a vector costs
 * as much as the rest of softmax's store pass; at most an ulp more); nothing
 * else is.
 *
 * A kernel compiled to stream its stores (kx_kernel_options.stream_stores)
 * has a second body, for when its outputs are 64-byte aligned (as kiln
 * allocates them; the first body, left unoptimised then, is the fallback):
 * not inlined, so that its pointer parameters keep their alignment and LLVM
 * gives the widened stores that alignment too.
 * The loop vectorizer will not widen a store marked non-temporal whose scalar
 * alignment is less than a vector's, so the output stores carry a TBAA tag
 * instead, which the vectorizer copies to its wide stores and no other access
 * shares; after optimisation, codegen_stream_stores makes the aligned wide
 * stores with that tag non-temporal.
 *
 * A row a kernel keeps between passes (softmax's exponentials, stored in
 * its sum's pass) stays in the output, which the store pass rewrites while
 * it is in cache, unless the kernel streams its stores: then its streaming
 * body keeps the row in a scratch row on its stack (kx_kept_view, rows of
 * up to 64 KiB), and the store pass streams the output from it once, never
 * reading the output's lines from memory. With the next row prefetched
 * (below) that measured faster than the row kept in the output (softmax
 * 4096x4096, 2 threads); without, slower, as the next row's loads then
 * wait on memory while the exponentials' arithmetic could have hidden
 * reading the output's lines.
 *
 * Where a row's first reduction reads only inputs and stores nothing
 * (softmax's max, layer norm's mean), the loop of its second prefetches the
 * lines of the next row that the first will read (prefetches_next): the
 * next row's misses then overlap that loop's arithmetic (softmax's
 * exponentials), where a pass of their own left the core idle while it
 * waited on memory and the memory idle while it computed; the first pass
 * then reads from cache. The loop runs in blocks, each led by its
 * prefetches, since the vectorizer widens no loop with a prefetch in it.
 * Folding the next row's reduction into that loop instead (its loads, not
 * prefetches) measured slower: a load holds the core's window until its
 * line arrives, a prefetch does not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>

#include "codegen_llvm/gemm.h"
#include "codegen_llvm/internal.h"
#include "codegen_llvm/math.h"
#include "core/core.h"

typedef struct {
    LLVMContextRef ctx;
    LLVMModuleRef module;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    const kx_kernel *k;
    LLVMValueRef *buffers;   /* the body's pointer parameters */
    LLVMValueRef *view_base; /* per view: the row's first element index */
    LLVMValueRef *row_within; /* per bounded view: whether the row is within its outer bounds (i1) */
    signed char *column_within; /* per view: within its column bounds in the current loop (1, 0), or -1: test each */
    LLVMValueRef *next_base; /* per view: the next row's, where it is prefetched (prefetches_next) */
    LLVMValueRef *rows;      /* per reduction: its value for this row */
    LLVMValueRef *memo;      /* per expression, in the current loop */
    LLVMValueRef *sizes;     /* per symbolic size of the kernel's table: its value, in the entry */
    LLVMValueRef symbols;    /* the body's pointer to the symbols' values */
    LLVMValueRef i;          /* the current loop's element index */
    LLVMTypeRef i64;
    LLVMValueRef stream_tag; /* the output stores' TBAA tag, or NULL */
    int kept;                /* the view whose row is kept in scratch (kx_kept_view), or -1 */
    LLVMValueRef scratch;    /* that row, on the body's stack */
    bool reciprocal;         /* divisions by a row's value multiply by its reciprocal */
    bool max_ignores_nan;    /* reduction 0 may drop NaN and the sign of zero (max_ignores_nan) */
    char missing[128];       /* an op this backend lacks, met while building */
    const kx_view *product;  /* an epilogue's view of its product, read from tile[tile_index] */
    LLVMValueRef tile, tile_index;
} gen;

/* -- Types and constants --------------------------------------------------- */

/* The TBAA access tag marking the stores codegen_stream_stores may make
 * non-temporal. Only they carry a TBAA tag, so alias analysis learns nothing
 * from it. */
static LLVMValueRef stream_tag(LLVMContextRef ctx)
{
    LLVMMetadataRef root_name = LLVMMDStringInContext2(ctx, "kiln", 4);
    LLVMMetadataRef root = LLVMMDNodeInContext2(ctx, &root_name, 1);
    LLVMMetadataRef zero = LLVMValueAsMetadata(LLVMConstInt(LLVMInt64TypeInContext(ctx), 0, 0));
    LLVMMetadataRef type_ops[3] = {LLVMMDStringInContext2(ctx, "kiln stream", 11), root, zero};
    LLVMMetadataRef type = LLVMMDNodeInContext2(ctx, type_ops, 3);
    LLVMMetadataRef tag_ops[3] = {type, type, zero};
    return LLVMMetadataAsValue(ctx, LLVMMDNodeInContext2(ctx, tag_ops, 3));
}

static LLVMTypeRef type_of(LLVMContextRef ctx, kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return LLVMFloatTypeInContext(ctx);
    case KILN_F64: return LLVMDoubleTypeInContext(ctx);
    case KILN_I32: return LLVMInt32TypeInContext(ctx);
    case KILN_I64: return LLVMInt64TypeInContext(ctx);
    default: return LLVMInt8TypeInContext(ctx); /* bool: 0 or 1 in a byte */
    }
}

static LLVMValueRef constant(gen *g, kiln_dtype dt, double v)
{
    if (ir_dtype_is_float(dt))
        return LLVMConstReal(type_of(g->ctx, dt), v);
    return LLVMConstInt(type_of(g->ctx, dt), (unsigned long long)(long long)v, 1);
}

static LLVMValueRef i64c(gen *g, int64_t v)
{
    return LLVMConstInt(g->i64, (unsigned long long)v, 1);
}

/* Calls an overloaded intrinsic such as llvm.maximum on values of type t. */
static LLVMValueRef intrinsic(gen *g, const char *name, LLVMTypeRef t, LLVMValueRef *args, unsigned n)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(g->module, id, &t, 1);
    LLVMTypeRef ft = LLVMIntrinsicGetType(g->ctx, id, &t, 1);
    return LLVMBuildCall2(g->b, ft, f, args, n, "");
}

static LLVMValueRef bool_of(gen *g, LLVMValueRef bit)
{
    return LLVMBuildZExt(g->b, bit, type_of(g->ctx, KILN_BOOL), "");
}

/* -- Conversions, as kiln_cast converts ------------------------------------ */

static LLVMValueRef convert(gen *g, LLVMValueRef v, kiln_dtype from, kiln_dtype to)
{
    if (from == to)
        return v;
    LLVMTypeRef t = type_of(g->ctx, to);
    bool f_from = ir_dtype_is_float(from), f_to = ir_dtype_is_float(to);
    if (to == KILN_BOOL) {
        LLVMValueRef nonzero = f_from ? LLVMBuildFCmp(g->b, LLVMRealUNE, v, constant(g, from, 0), "")
                                      : LLVMBuildICmp(g->b, LLVMIntNE, v, constant(g, from, 0), "");
        return bool_of(g, nonzero);
    }
    if (f_from && f_to)
        return to == KILN_F64 ? LLVMBuildFPExt(g->b, v, t, "") : LLVMBuildFPTrunc(g->b, v, t, "");
    if (f_from) { /* saturating, NaN to 0: what eager does */
        LLVMTypeRef types[2] = {t, type_of(g->ctx, from)};
        unsigned id = LLVMLookupIntrinsicID("llvm.fptosi.sat", 15);
        LLVMValueRef f = LLVMGetIntrinsicDeclaration(g->module, id, types, 2);
        return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, types, 2), f, &v, 1, "");
    }
    if (f_to)
        return from == KILN_BOOL ? LLVMBuildUIToFP(g->b, v, t, "") : LLVMBuildSIToFP(g->b, v, t, "");
    if (from == KILN_BOOL)
        return LLVMBuildZExt(g->b, v, t, "");
    return to == KILN_I64 ? LLVMBuildSExt(g->b, v, t, "") : LLVMBuildTrunc(g->b, v, t, "");
}

/* -- Elementwise ops ------------------------------------------------------- */

static LLVMValueRef float_op(gen *g, ir_op op, kiln_dtype dt, LLVMValueRef *a)
{
    LLVMBuilderRef b = g->b;
    LLVMTypeRef t = type_of(g->ctx, dt);
    switch (op) {
    case OP_ADD: return LLVMBuildFAdd(b, a[0], a[1], "");
    case OP_SUB: return LLVMBuildFSub(b, a[0], a[1], "");
    case OP_MUL: return LLVMBuildFMul(b, a[0], a[1], "");
    case OP_DIV: return LLVMBuildFDiv(b, a[0], a[1], "");
    case OP_POW: return intrinsic(g, "llvm.pow", t, a, 2);
    case OP_MAXIMUM:
    case OP_MINIMUM: { /* the second operand when greater (smaller) or NaN, else the first, as eager */
        LLVMValueRef better = op == OP_MAXIMUM ? LLVMBuildFCmp(b, LLVMRealOLT, a[0], a[1], "")
                                               : LLVMBuildFCmp(b, LLVMRealOLT, a[1], a[0], "");
        LLVMValueRef nan = LLVMBuildFCmp(b, LLVMRealUNO, a[1], a[1], "");
        return LLVMBuildSelect(b, LLVMBuildOr(b, better, nan, ""), a[1], a[0], "");
    }
    case OP_EQ: return bool_of(g, LLVMBuildFCmp(b, LLVMRealOEQ, a[0], a[1], ""));
    case OP_NE: return bool_of(g, LLVMBuildFCmp(b, LLVMRealUNE, a[0], a[1], ""));
    case OP_LT: return bool_of(g, LLVMBuildFCmp(b, LLVMRealOLT, a[0], a[1], ""));
    case OP_LE: return bool_of(g, LLVMBuildFCmp(b, LLVMRealOLE, a[0], a[1], ""));
    case OP_GT: return bool_of(g, LLVMBuildFCmp(b, LLVMRealOGT, a[0], a[1], ""));
    case OP_GE: return bool_of(g, LLVMBuildFCmp(b, LLVMRealOGE, a[0], a[1], ""));
    case OP_NEG: return LLVMBuildFNeg(b, a[0], "");
    case OP_ABS: return intrinsic(g, "llvm.fabs", t, a, 1);
    case OP_SQRT: return intrinsic(g, "llvm.sqrt", t, a, 1);
    case OP_RSQRT: return LLVMBuildFDiv(b, constant(g, dt, 1), intrinsic(g, "llvm.sqrt", t, a, 1), "");
    case OP_RELU: { /* x < 0 ? 0 : x: -0 and NaN stay, as eager */
        LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, a[0], constant(g, dt, 0), "");
        return LLVMBuildSelect(b, neg, constant(g, dt, 0), a[0], "");
    }
    default: return a[1] ? math_emit_binary(g->module, b, op, a[0], a[1]) : math_emit(g->module, b, op, a[0]);
    }
}

/* The module's kiln.ipow.<type>(base, e): base ** e by squaring, wrapping as
 * eager's integers do; a negative e gives 1 / base ** -e truncated (0 unless
 * base is 1 or -1). */
static LLVMValueRef ipow_function(gen *g, LLVMTypeRef t)
{
    char name[32];
    snprintf(name, sizeof name, "kiln.ipow.i%u", LLVMGetIntTypeWidth(t));
    LLVMValueRef f = LLVMGetNamedFunction(g->module, name);
    if (f)
        return f;
    LLVMTypeRef params[2] = {t, t};
    f = LLVMAddFunction(g->module, name, LLVMFunctionType(t, params, 2, 0));
    LLVMSetLinkage(f, LLVMInternalLinkage);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(g->ctx);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(g->ctx, f, "entry");
    LLVMBasicBlockRef negative = LLVMAppendBasicBlockInContext(g->ctx, f, "negative");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(g->ctx, f, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, f, "done");
    LLVMValueRef base = LLVMGetParam(f, 0), e = LLVMGetParam(f, 1);
    LLVMValueRef zero = LLVMConstInt(t, 0, 0), one = LLVMConstInt(t, 1, 0), minus_one = LLVMConstInt(t, -1ULL, 1);
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, e, zero, ""), negative, loop);
    LLVMPositionBuilderAtEnd(b, negative);
    LLVMValueRef odd = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, e, one, ""), zero, "");
    LLVMValueRef of_minus_one = LLVMBuildSelect(b, odd, minus_one, one, "");
    LLVMValueRef result = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, base, minus_one, ""), of_minus_one, zero, "");
    LLVMBuildRet(b, LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, base, one, ""), one, result, ""));
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef r = LLVMBuildPhi(b, t, "r"), x = LLVMBuildPhi(b, t, "x"), k = LLVMBuildPhi(b, t, "k");
    LLVMValueRef taken = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, k, one, ""), zero, ""),
                                         LLVMBuildMul(b, r, x, ""), r, "");
    LLVMValueRef squared = LLVMBuildMul(b, x, x, ""), halved = LLVMBuildLShr(b, k, one, "");
    LLVMValueRef r_in[2] = {one, taken}, x_in[2] = {base, squared}, k_in[2] = {e, halved};
    LLVMBasicBlockRef from[2] = {entry, loop};
    LLVMAddIncoming(r, r_in, from, 2);
    LLVMAddIncoming(x, x_in, from, 2);
    LLVMAddIncoming(k, k_in, from, 2);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntEQ, halved, zero, ""), done, loop);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRet(b, taken);
    LLVMDisposeBuilder(b);
    return f;
}

static LLVMValueRef int_op(gen *g, ir_op op, kiln_dtype dt, LLVMValueRef *a)
{
    LLVMBuilderRef b = g->b;
    bool is_bool = dt == KILN_BOOL;
    switch (op) {
    case OP_POW: {
        if (is_bool)
            return NULL;
        LLVMValueRef f = ipow_function(g, type_of(g->ctx, dt));
        return LLVMBuildCall2(b, LLVMGlobalGetValueType(f), f, a, 2, "");
    }
    case OP_ADD: return is_bool ? LLVMBuildOr(b, a[0], a[1], "") : LLVMBuildAdd(b, a[0], a[1], "");
    case OP_SUB: return LLVMBuildSub(b, a[0], a[1], "");
    case OP_MUL: return is_bool ? LLVMBuildAnd(b, a[0], a[1], "") : LLVMBuildMul(b, a[0], a[1], "");
    case OP_MAXIMUM:
        return is_bool ? LLVMBuildOr(b, a[0], a[1], "") : intrinsic(g, "llvm.smax", type_of(g->ctx, dt), a, 2);
    case OP_MINIMUM:
        return is_bool ? LLVMBuildAnd(b, a[0], a[1], "") : intrinsic(g, "llvm.smin", type_of(g->ctx, dt), a, 2);
    case OP_EQ: return bool_of(g, LLVMBuildICmp(b, LLVMIntEQ, a[0], a[1], ""));
    case OP_NE: return bool_of(g, LLVMBuildICmp(b, LLVMIntNE, a[0], a[1], ""));
    case OP_LT: return bool_of(g, LLVMBuildICmp(b, is_bool ? LLVMIntULT : LLVMIntSLT, a[0], a[1], ""));
    case OP_LE: return bool_of(g, LLVMBuildICmp(b, is_bool ? LLVMIntULE : LLVMIntSLE, a[0], a[1], ""));
    case OP_GT: return bool_of(g, LLVMBuildICmp(b, is_bool ? LLVMIntUGT : LLVMIntSGT, a[0], a[1], ""));
    case OP_GE: return bool_of(g, LLVMBuildICmp(b, is_bool ? LLVMIntUGE : LLVMIntSGE, a[0], a[1], ""));
    case OP_NEG: return LLVMBuildNeg(b, a[0], "");
    case OP_ABS: {
        LLVMValueRef neg = LLVMBuildICmp(b, LLVMIntSLT, a[0], constant(g, dt, 0), "");
        return LLVMBuildSelect(b, neg, LLVMBuildNeg(b, a[0], ""), a[0], "");
    }
    case OP_RELU: {
        LLVMValueRef pos = LLVMBuildICmp(b, LLVMIntSGT, a[0], constant(g, dt, 0), "");
        return LLVMBuildSelect(b, pos, a[0], constant(g, dt, 0), "");
    }
    default: return math_emit_int(g->module, b, op, a);
    }
}

/* -- Sizes ----------------------------------------------------------------- */

/* Size v of the kernel: a constant, or its value computed in the entry. */
static LLVMValueRef size_value(gen *g, int64_t v)
{
    return v >= 0 ? i64c(g, v) : g->sizes[-1 - v];
}

static LLVMValueRef poly_value(gen *g, const ir_poly *p)
{
    LLVMValueRef sum = i64c(g, 0);
    for (int t = 0; t < p->n; t++) {
        LLVMValueRef term = i64c(g, p->terms[t].coef);
        for (int s = 0; s < IR_MAX_SYMBOLS; s++) {
            if (!p->terms[t].exp[s])
                continue;
            LLVMValueRef index = i64c(g, s);
            LLVMValueRef at = LLVMBuildGEP2(g->b, g->i64, g->symbols, &index, 1, "");
            LLVMValueRef symbol = LLVMBuildLoad2(g->b, g->i64, at, "");
            for (int e = 0; e < p->terms[t].exp[s]; e++)
                term = LLVMBuildMul(g->b, term, symbol, "");
        }
        sum = LLVMBuildAdd(g->b, sum, term, "");
    }
    return sum;
}

/* Every size of the kernel's table, at the builder (the body's entry). */
static void compute_sizes(gen *g)
{
    for (int i = 0; i < g->k->sizes.n; i++)
        g->sizes[i] = poly_value(g, &g->k->sizes.polys[i]);
}

/* -- Expressions ----------------------------------------------------------- */

static LLVMValueRef expr(gen *g, int e);
static bool reads_inputs_only(const kx_kernel *k, int e);

/* Whether the kernel's index is within v's bounds (an i1): the row within
 * its outer ones (row_within), the column within its column ones. */
static LLVMValueRef within(gen *g, const kx_view *v)
{
    LLVMValueRef in = g->row_within[v - g->k->views];
    for (int b = 0; b < v->n_bounds; b++) {
        const kx_bound *d = &v->bounds[b];
        if (d->dim != g->k->n_outer)
            continue;
        LLVMValueRef from = LLVMBuildICmp(g->b, LLVMIntSGE, g->i, i64c(g, d->lo), "");
        LLVMValueRef to = LLVMBuildICmp(g->b, LLVMIntSLT, g->i, i64c(g, d->hi), "");
        in = LLVMBuildAnd(g->b, in, LLVMBuildAnd(g->b, from, to, ""), "");
    }
    return in;
}

/* Bounded view v's element, or its fill outside its bounds: the load runs
 * only inside (the vectorizer makes it a masked one). */
static LLVMValueRef load_within(gen *g, const kx_view *v, LLVMValueRef at)
{
    LLVMTypeRef t = type_of(g->ctx, v->dtype);
    LLVMValueRef in = within(g, v);
    LLVMBasicBlockRef from = LLVMGetInsertBlock(g->b);
    LLVMBasicBlockRef read = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "within");
    LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "bounded");
    LLVMBuildCondBr(g->b, in, read, join);
    LLVMPositionBuilderAtEnd(g->b, read);
    LLVMValueRef value = LLVMBuildLoad2(g->b, t, at, "");
    LLVMBuildBr(g->b, join);
    LLVMPositionBuilderAtEnd(g->b, join);
    LLVMValueRef phi = LLVMBuildPhi(g->b, t, "");
    LLVMValueRef values[2] = {value, constant(g, v->dtype, v->fill)};
    LLVMBasicBlockRef blocks[2] = {read, from};
    LLVMAddIncoming(phi, values, blocks, 2);
    return phi;
}

/* Bounded view v's element at: the fill where the row or (in a loop split
 * at its column bounds) the loop's columns are outside its bounds. Its
 * base is then within them, so the load is safe, and along the row it is
 * an ordinary one, which the vectorizer widens. */
static LLVMValueRef load_bounded(gen *g, const kx_view *v, LLVMValueRef at)
{
    int view = (int)(v - g->k->views);
    if (g->column_within[view] < 0)
        return load_within(g, v, at);
    if (!g->column_within[view])
        return constant(g, v->dtype, v->fill);
    LLVMValueRef value = LLVMBuildLoad2(g->b, type_of(g->ctx, v->dtype), at, "");
    return LLVMBuildSelect(g->b, g->row_within[view], value, constant(g, v->dtype, v->fill), "");
}

/* Element i of the row kept in scratch (kx_kept_view). */
static LLVMValueRef kept_at(gen *g)
{
    return LLVMBuildGEP2(g->b, type_of(g->ctx, g->k->views[g->kept].dtype), g->scratch, &g->i, 1, "");
}

static LLVMValueRef load(gen *g, const kx_view *v)
{
    if (v == g->product)
        return LLVMBuildLoad2(g->b, type_of(g->ctx, v->dtype), LLVMBuildGEP2(g->b, type_of(g->ctx, v->dtype), g->tile,
                                                                            &g->tile_index, 1, ""), "");
    if (v - g->k->views == g->kept)
        return LLVMBuildLoad2(g->b, type_of(g->ctx, v->dtype), kept_at(g), "");
    LLVMValueRef index = g->view_base[v - g->k->views];
    if (v->inner_stride)
        index = LLVMBuildAdd(g->b, index, LLVMBuildMul(g->b, g->i, size_value(g, v->inner_stride), ""), "");
    LLVMTypeRef t = type_of(g->ctx, v->dtype);
    LLVMValueRef at = LLVMBuildGEP2(g->b, t, g->buffers[v->buffer], &index, 1, "");
    return v->n_bounds ? load_bounded(g, v, at) : LLVMBuildLoad2(g->b, t, at, "");
}

/* Flags the bad words after the symbols' values with gather e's index
 * given (out of range of size), unless an index was flagged first. */
static void flag_bad(gen *g, const kx_expr *e, LLVMValueRef given, LLVMValueRef size)
{
    LLVMValueRef at[KX_BAD_WORDS];
    for (int w = 0; w < KX_BAD_WORDS; w++) {
        LLVMValueRef index = i64c(g, IR_MAX_SYMBOLS + w);
        at[w] = LLVMBuildGEP2(g->b, g->i64, g->symbols, &index, 1, "");
    }
    LLVMValueRef swap = LLVMBuildAtomicCmpXchg(g->b, at[KX_BAD_FLAG], i64c(g, 0), i64c(g, 1),
                                               LLVMAtomicOrderingMonotonic, LLVMAtomicOrderingMonotonic, 0);
    LLVMBasicBlockRef first = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "first_bad");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "flagged");
    LLVMBuildCondBr(g->b, LLVMBuildExtractValue(g->b, swap, 1, ""), first, done);
    LLVMPositionBuilderAtEnd(g->b, first);
    LLVMBuildStore(g->b, given, at[KX_BAD_INDEX]);
    LLVMBuildStore(g->b, i64c(g, e->axis), at[KX_BAD_AXIS]);
    LLVMBuildStore(g->b, size, at[KX_BAD_SIZE]);
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
}

/* Gather e: the element of its view's row at its column when that is in
 * range; else nothing is read, the value is 0 and the launch is flagged. */
static LLVMValueRef gather(gen *g, const kx_expr *e)
{
    const kx_view *v = &g->k->views[e->view];
    LLVMTypeRef t = type_of(g->ctx, v->dtype);
    LLVMValueRef given = expr(g, e->args[0]), size = size_value(g, e->size);
    LLVMValueRef negative = LLVMBuildICmp(g->b, LLVMIntSLT, given, i64c(g, 0), "");
    LLVMValueRef column = LLVMBuildSelect(g->b, negative, LLVMBuildAdd(g->b, given, size, ""), given, "");
    LLVMBasicBlockRef read = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "gather");
    LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "bad_index");
    LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "gathered");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntULT, column, size, ""), read, bad);
    LLVMPositionBuilderAtEnd(g->b, bad);
    flag_bad(g, e, given, size);
    LLVMBasicBlockRef bad_end = LLVMGetInsertBlock(g->b);
    LLVMBuildBr(g->b, join);
    LLVMPositionBuilderAtEnd(g->b, read);
    LLVMValueRef index = LLVMBuildAdd(g->b, g->view_base[e->view],
                                      LLVMBuildMul(g->b, column, size_value(g, v->inner_stride), ""), "");
    LLVMValueRef value = LLVMBuildLoad2(g->b, t, LLVMBuildGEP2(g->b, t, g->buffers[v->buffer], &index, 1, ""), "");
    LLVMBuildBr(g->b, join);
    LLVMPositionBuilderAtEnd(g->b, join);
    LLVMValueRef phi = LLVMBuildPhi(g->b, t, "");
    LLVMValueRef values[2] = {value, LLVMConstNull(t)};
    LLVMBasicBlockRef from[2] = {read, bad_end};
    LLVMAddIncoming(phi, values, from, 2);
    return phi;
}

/* Operand i of x (an op's or a cast's), or -1 past its last. */
static int operand(const kx_expr *x, int i)
{
    return i < 3 && (x->kind == KX_OP || x->kind == KX_CAST) ? x->args[i] : -1;
}

/* Whether expression e is the same along a row and made from a row's value
 * (constants alone fold at compile time, where LLVM divides exactly). */
static bool of_row(const kx_kernel *k, int e, bool *row)
{
    const kx_expr *x = &k->exprs[e];
    if (x->kind == KX_LOAD || x->kind == KX_GATHER)
        return false;
    *row |= x->kind == KX_ROW;
    for (int i = 0; operand(x, i) >= 0; i++)
        if (!of_row(k, x->args[i], row))
            return false;
    return true;
}

/* Whether e is a float division by a row's value. */
static bool row_division(const kx_kernel *k, const kx_expr *e)
{
    bool row = false;
    return e->kind == KX_OP && e->op == OP_DIV && ir_dtype_is_float(e->dtype) && of_row(k, e->args[1], &row) && row;
}

/* Whether e is x - max(x) over the row, at most 0 or NaN (softmax's
 * exponent): x reads only inputs, so the max's pass and e's read the same
 * x. */
static bool minus_row_max(const kx_kernel *k, int e)
{
    const kx_expr *d = &k->exprs[e];
    if (d->kind != KX_OP || d->op != OP_SUB || !ir_dtype_is_float(d->dtype))
        return false;
    const kx_expr *m = &k->exprs[d->args[1]];
    return m->kind == KX_ROW && k->reductions[m->row].op == OP_MAX && k->reductions[m->row].expr == d->args[0] &&
           reads_inputs_only(k, d->args[0]);
}

static LLVMValueRef compute(gen *g, const kx_expr *e)
{
    switch (e->kind) {
    case KX_LOAD: return load(g, &g->k->views[e->view]);
    case KX_CONST: return constant(g, e->dtype, e->value);
    case KX_ROW: return g->rows[e->row];
    case KX_CAST: return convert(g, expr(g, e->args[0]), g->k->exprs[e->args[0]].dtype, e->dtype);
    case KX_GATHER: return gather(g, e);
    case KX_OP: break;
    }
    LLVMValueRef a[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3 && e->args[i] >= 0; i++)
        a[i] = expr(g, e->args[i]);
    if (e->op == OP_WHERE) {
        LLVMValueRef cond = LLVMBuildICmp(g->b, LLVMIntNE, a[0], constant(g, KILN_BOOL, 0), "");
        return LLVMBuildSelect(g->b, cond, a[1], a[2], "");
    }
    kiln_dtype operand = g->k->exprs[e->args[0]].dtype;
    if (e->op == OP_EXP && minus_row_max(g->k, e->args[0]))
        return math_emit_exp_nonpositive(g->module, g->b, a[0]);
    if (g->reciprocal && row_division(g->k, e)) /* LLVM hoists 1 / b out of the loop */
        return LLVMBuildFMul(g->b, a[0], LLVMBuildFDiv(g->b, constant(g, operand, 1), a[1], ""), "");
    LLVMValueRef v = ir_dtype_is_float(operand) ? float_op(g, e->op, operand, a) : int_op(g, e->op, operand, a);
    if (v)
        return v;
    if (!g->missing[0])
        snprintf(g->missing, sizeof g->missing, "%s on %s is not in the LLVM backend", ir_ops[e->op].name,
                 ir_dtype_names[operand]);
    return LLVMGetUndef(type_of(g->ctx, e->dtype));
}

static LLVMValueRef expr(gen *g, int e)
{
    if (!g->memo[e])
        g->memo[e] = compute(g, &g->k->exprs[e]);
    return g->memo[e];
}

/* -- Loops ----------------------------------------------------------------- */

typedef struct {
    LLVMBasicBlockRef header;
    LLVMValueRef index;
} loop;

/* Starts a loop of count > 0 iterations at the builder; the body follows. */
static loop loop_begin(gen *g, const char *name)
{
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    loop l = {LLVMAppendBasicBlockInContext(g->ctx, g->fn, name), NULL};
    LLVMBuildBr(g->b, l.header);
    LLVMPositionBuilderAtEnd(g->b, l.header);
    l.index = LLVMBuildPhi(g->b, g->i64, "i");
    LLVMValueRef zero = i64c(g, 0);
    LLVMAddIncoming(l.index, &zero, &pre, 1);
    return l;
}

/* Closes the loop after count iterations; the builder continues after it. */
static void loop_end(gen *g, loop *l, LLVMValueRef count)
{
    LLVMValueRef next = LLVMBuildAdd(g->b, l->index, i64c(g, 1), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(l->index, &next, &latch, 1);
    LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "after");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, next, count, ""), l->header, after);
    LLVMPositionBuilderAtEnd(g->b, after);
}

static void clear_memo(gen *g)
{
    memset(g->memo, 0, (size_t)g->k->n_exprs * sizeof *g->memo);
}

/* Whether expression e is NaN wherever reduction row's value is: it is
 * that value, or arithmetic on it that keeps NaN. */
static bool keeps_nan_of_row(const kx_kernel *k, int e, int row)
{
    const kx_expr *x = &k->exprs[e];
    if (x->kind == KX_ROW)
        return x->row == row;
    if (x->kind == KX_CAST)
        return ir_dtype_is_float(x->dtype) && keeps_nan_of_row(k, x->args[0], row);
    if (x->kind != KX_OP)
        return false;
    if (x->op != OP_ADD && x->op != OP_SUB && x->op != OP_MUL && x->op != OP_DIV && x->op != OP_NEG &&
        x->op != OP_EXP && x->op != OP_LOG)
        return false;
    for (int i = 0; operand(x, i) >= 0; i++)
        if (keeps_nan_of_row(k, x->args[i], row))
            return true;
    return false;
}

/* Whether expression e is used only as an argument of exp. */
static bool only_exponent(const kx_kernel *k, int e)
{
    for (int u = 0; u < k->n_exprs; u++) {
        const kx_expr *x = &k->exprs[u];
        for (int i = 0; operand(x, i) >= 0; i++)
            if (x->args[i] == e && !(x->kind == KX_OP && x->op == OP_EXP))
                return false;
    }
    for (int s = 0; s < k->n_stores; s++)
        if (k->stores[s].expr == e)
            return false;
    for (int s = 0; s < k->n_row_stores; s++)
        if (k->row_stores[s].expr == e)
            return false;
    return true;
}

/* Whether each store of reduction 1's pass is rewritten by a store of the
 * store pass to the same view, and every value the kernel leaves is NaN
 * where reduction 1's is. */
static bool outputs_keep_nan_of_sum(const kx_kernel *k)
{
    for (int s = 0; s < k->n_stores; s++) {
        const kx_store *st = &k->stores[s];
        if (st->pass == KX_STORE_PASS) {
            if (!keeps_nan_of_row(k, st->expr, 1))
                return false;
            continue;
        }
        bool rewritten = false;
        for (int t = 0; t < k->n_stores; t++)
            rewritten |= k->stores[t].pass == KX_STORE_PASS && k->stores[t].view == st->view;
        if (st->pass != kx_reduction_pass(1) || !rewritten)
            return false;
    }
    for (int s = 0; s < k->n_row_stores; s++) {
        const kx_row_store *rs = &k->row_stores[s];
        bool keeps = rs->expr >= 0 ? keeps_nan_of_row(k, rs->expr, 1) : rs->row == 1;
        if (!keeps)
            return false;
    }
    return true;
}

/* Whether reduction 0, a float max, may ignore NaN and the sign of zero,
 * one max instruction a vector where the max that keeps NaN takes three (a
 * tenth of softmax's loop): its only use is softmax's exponent, summed by
 * reduction 1 as exp(x - max(x)), on which everything the kernel leaves
 * depends through arithmetic that keeps NaN. A NaN in x makes that sum NaN
 * whatever the max, and with it every output of the row, as a NaN max
 * would; exp(x - max(x)) is the same for either zero; and the other rows
 * do not see the difference. */
static bool max_ignores_nan(const kx_kernel *k)
{
    if (k->n_reductions != 2 || k->reductions[0].op != OP_MAX || !ir_dtype_is_float(k->reductions[0].dtype) ||
        k->reductions[1].op != OP_SUM)
        return false;
    const kx_expr *summed = &k->exprs[k->reductions[1].expr];
    if (summed->kind == KX_CAST) /* summed in f64 */
        summed = &k->exprs[summed->args[0]];
    if (summed->kind != KX_OP || summed->op != OP_EXP || !minus_row_max(k, summed->args[0]))
        return false;
    for (int e = 0; e < k->n_exprs; e++) {
        const kx_expr *x = &k->exprs[e];
        if (minus_row_max(k, e) && !only_exponent(k, e))
            return false;
        for (int i = 0; operand(x, i) >= 0; i++) {
            const kx_expr *a = &k->exprs[x->args[i]];
            if (a->kind == KX_ROW && a->row == 0 && !(minus_row_max(k, e) && i == 1))
                return false;
        }
    }
    return outputs_keep_nan_of_sum(k); /* which also refuses the max stored as a row's value */
}

static LLVMValueRef combine(gen *g, const kx_reduction *r, LLVMValueRef acc, LLVMValueRef v)
{
    bool is_float = ir_dtype_is_float(r->dtype);
    LLVMTypeRef t = type_of(g->ctx, r->dtype);
    LLVMValueRef args[2] = {acc, v};
    if (g->max_ignores_nan && r == &g->k->reductions[0]) {
        /* LLVM widens the fold of maxnum only with these flags. Where x
         * has a NaN they make the max poison, and all the row computes from
         * it; only store_row branches on it, on a frozen test. */
        LLVMValueRef max = intrinsic(g, "llvm.maxnum", t, args, 2);
        LLVMSetFastMathFlags(max, LLVMFastMathNoNaNs | LLVMFastMathNoSignedZeros);
        return max;
    }
    if (r->op == OP_SUM || r->op == OP_MEAN) {
        if (!is_float)
            return LLVMBuildAdd(g->b, acc, v, "");
        LLVMValueRef sum = LLVMBuildFAdd(g->b, acc, v, "");
        LLVMSetFastMathFlags(sum, LLVMFastMathAllowReassoc); /* lets the sum vectorize */
        return sum;
    }
    if (is_float) /* llvm.maximum propagates NaN, as eager's max does */
        return intrinsic(g, r->op == OP_MAX ? "llvm.maximum" : "llvm.minimum", t, args, 2);
    return intrinsic(g, r->op == OP_MAX ? "llvm.smax" : "llvm.smin", t, args, 2);
}

static LLVMValueRef identity(gen *g, const kx_reduction *r)
{
    if (ir_dtype_is_float(r->dtype))
        return LLVMConstReal(type_of(g->ctx, r->dtype), r->identity.f);
    return LLVMConstInt(type_of(g->ctx, r->dtype), (unsigned long long)r->identity.i, 1);
}

/* The address of element i of view v in the current row. */
static LLVMValueRef address(gen *g, const kx_view *v)
{
    LLVMValueRef index = LLVMBuildAdd(g->b, g->view_base[v - g->k->views],
                                      LLVMBuildMul(g->b, g->i, size_value(g, v->inner_stride), ""), "");
    return LLVMBuildGEP2(g->b, type_of(g->ctx, v->dtype), g->buffers[v->buffer], &index, 1, "");
}

/* The stores of pass (a reduction's, or KX_STORE_PASS) at element i. */
static void emit_stores(gen *g, int pass)
{
    const kx_kernel *k = g->k;
    for (int s = 0; s < k->n_stores; s++) {
        const kx_store *st = &k->stores[s];
        if (st->pass != pass)
            continue;
        const kx_view *v = &k->views[st->view];
        LLVMValueRef value = convert(g, expr(g, st->expr), k->exprs[st->expr].dtype, v->dtype);
        bool kept = pass != KX_STORE_PASS && st->view == g->kept;
        LLVMValueRef store = LLVMBuildStore(g->b, value, kept ? kept_at(g) : address(g, v));
        if (g->stream_tag && pass == KX_STORE_PASS)
            LLVMSetMetadata(store, LLVMGetMDKindIDInContext(g->ctx, "tbaa", 4), g->stream_tag);
    }
}

/* A reduction's value from its fold: a mean's sum divided in f64. */
static LLVMValueRef finish(gen *g, const kx_reduction *r, LLVMValueRef acc)
{
    if (r->op != OP_MEAN)
        return acc;
    LLVMValueRef sum = convert(g, acc, r->dtype, r->result);
    LLVMValueRef count = LLVMBuildSIToFP(g->b, size_value(g, g->k->cols), type_of(g->ctx, r->result), "");
    return LLVMBuildFDiv(g->b, sum, count, "");
}

/* A block of the prefetching loop: PREFETCH_BLOCK elements, whose lines
 * of the next row it prefetches at its start (16 of f32: a burst the
 * core's miss buffers take in; 64 measured no gain). Only rows of at most
 * PREFETCH_ROW_BYTES of each view are prefetched: the next row's lines,
 * with this row's input and output, then stay in a core's L2 until the
 * next row's first pass reads them; a longer row's would be evicted first
 * and read from memory twice. */
enum { PREFETCH_BLOCK = 256, PREFETCH_ROW_BYTES = 64 << 10 };

/* Whether view v of k runs contiguous along each row and differs from row
 * to row, so that its rows move through memory (a bias that every row
 * shares stays in cache). */
static bool rows_move(const kx_kernel *k, const kx_view *v)
{
    if (v->inner_stride != 1)
        return false;
    for (int d = 0; d < k->n_outer; d++)
        if (v->outer_strides[d] != 0)
            return true;
    return false;
}

/* Prefetches the line of view v's element g->i, for writing where write. */
static void prefetch_line(gen *g, const kx_view *v, bool write)
{
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0), i32 = LLVMInt32TypeInContext(g->ctx);
    LLVMValueRef args[4] = {address(g, v), LLVMConstInt(i32, write, 0), LLVMConstInt(i32, 3, 0),
                            LLVMConstInt(i32, 1, 0)};
    intrinsic(g, "llvm.prefetch", ptr, args, 4);
}

/* Whether the next row's lines of view v are prefetched: its rows move
 * through memory and reduction 0 loads it (never a gather:
 * prefetches_next refuses those). */
static bool prefetched(const kx_kernel *k, int v)
{
    return rows_move(k, &k->views[v]) && kx_loads_view(k, k->reductions[0].expr, v);
}

/* The widest dtype of the views prefetched, in bytes; 0 for none. */
static int widest_prefetched(const kx_kernel *k)
{
    int widest = 0;
    for (int v = 0; v < k->n_views; v++)
        if (prefetched(k, v) && (int)ir_dtype_size(k->views[v].dtype) > widest)
            widest = (int)ir_dtype_size(k->views[v].dtype);
    return widest;
}

/* Prefetches the lines of the next row (g->next_base) in columns [from,
 * from + PREFETCH_BLOCK) of each view prefetched, in rows of at most
 * PREFETCH_ROW_BYTES (a symbolic count's test); lines past the row's end
 * are the row after's or past the buffer, a prefetch that never faults. */
static void prefetch_next_block(gen *g, LLVMValueRef from)
{
    const kx_kernel *k = g->k;
    LLVMValueRef bytes = LLVMBuildMul(g->b, size_value(g, k->cols), i64c(g, widest_prefetched(k)), "");
    LLVMBasicBlockRef burst = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "prefetch");
    LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "prefetched");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLE, bytes, i64c(g, PREFETCH_ROW_BYTES), ""), burst, after);
    LLVMPositionBuilderAtEnd(g->b, burst);
    LLVMValueRef *base = g->view_base, i = g->i;
    g->view_base = g->next_base;
    for (int v = 0; v < k->n_views; v++) {
        if (!prefetched(k, v))
            continue;
        int per_line = 64 / (int)ir_dtype_size(k->views[v].dtype);
        for (int c = 0; c < PREFETCH_BLOCK; c += per_line) {
            g->i = LLVMBuildAdd(g->b, from, i64c(g, c), "");
            prefetch_line(g, &k->views[v], false);
        }
    }
    g->view_base = base;
    g->i = i;
    LLVMBuildBr(g->b, after);
    LLVMPositionBuilderAtEnd(g->b, after);
}

/* Reduction n's fold over columns [from, from + count), from acc, with the
 * stores of its pass; the folded value. */
static LLVMValueRef fold_columns(gen *g, int n, LLVMValueRef acc_in, LLVMValueRef from, LLVMValueRef count)
{
    const kx_reduction *r = &g->k->reductions[n];
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    loop l = loop_begin(g, "reduce");
    LLVMValueRef acc = LLVMBuildPhi(g->b, type_of(g->ctx, r->dtype), "acc");
    LLVMAddIncoming(acc, &acc_in, &pre, 1);
    g->i = from ? LLVMBuildAdd(g->b, from, l.index, "") : l.index;
    clear_memo(g);
    LLVMValueRef acc_out = combine(g, r, acc, expr(g, r->expr));
    emit_stores(g, kx_reduction_pass(n));
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(acc, &acc_out, &latch, 1);
    loop_end(g, &l, count);
    return acc_out;
}

/* Reduction n's loop over the row, with the stores of its pass; its value.
 * With prefetch, in blocks, each prefetching its columns of the next row
 * (prefetch_next_block). */
static LLVMValueRef reduce_row(gen *g, int n, bool prefetch)
{
    const kx_reduction *r = &g->k->reductions[n];
    LLVMValueRef init = identity(g, r), cols = size_value(g, g->k->cols);
    if (g->k->cols == 0) /* a symbolic count is 2 or more */
        return finish(g, r, init);
    if (!prefetch)
        return finish(g, r, fold_columns(g, n, init, NULL, cols));
    LLVMValueRef block = i64c(g, PREFETCH_BLOCK);
    LLVMValueRef blocks = LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, cols, i64c(g, PREFETCH_BLOCK - 1), ""), block, "");
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    loop l = loop_begin(g, "blocks");
    LLVMValueRef acc = LLVMBuildPhi(g->b, type_of(g->ctx, r->dtype), "acc");
    LLVMAddIncoming(acc, &init, &pre, 1);
    LLVMValueRef from = LLVMBuildMul(g->b, l.index, block, ""), rest = LLVMBuildSub(g->b, cols, from, "");
    prefetch_next_block(g, from);
    LLVMValueRef count = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, rest, block, ""), rest, block, "");
    LLVMValueRef acc_out = fold_columns(g, n, acc, from, count);
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(acc, &acc_out, &latch, 1);
    loop_end(g, &l, blocks);
    return finish(g, r, acc_out);
}

static int compare_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The columns where a loop of the store pass starts: 0, and where a view's
 * column bound starts or ends inside the row, sorted; their count, or -1
 * for more than max. */
static int column_cuts(const kx_kernel *k, int64_t *cuts, int max)
{
    int n = 0;
    cuts[n++] = 0;
    for (int v = 0; v < k->n_views; v++)
        for (int b = 0; b < k->views[v].n_bounds; b++) {
            const kx_bound *d = &k->views[v].bounds[b];
            int64_t ends[2] = {d->lo, d->hi};
            for (int e = 0; e < 2 && d->dim == k->n_outer; e++) {
                if (ends[e] <= 0 || ends[e] >= k->cols)
                    continue;
                if (n == max)
                    return -1;
                cuts[n++] = ends[e];
            }
        }
    qsort(cuts, (size_t)n, sizeof *cuts, compare_i64);
    int unique = 1;
    for (int c = 1; c < n; c++)
        if (cuts[c] != cuts[unique - 1])
            cuts[unique++] = cuts[c];
    return unique;
}

/* Whether the columns from column from to the next cut are within each
 * view's column bounds (all or none are) into g->column_within. */
static void columns_within(gen *g, int64_t from)
{
    for (int v = 0; v < g->k->n_views; v++) {
        const kx_view *w = &g->k->views[v];
        g->column_within[v] = 1;
        for (int b = 0; b < w->n_bounds; b++)
            if (w->bounds[b].dim == g->k->n_outer && (from < w->bounds[b].lo || from >= w->bounds[b].hi))
                g->column_within[v] = 0;
    }
}

/* The store pass over columns [from, to). */
static void store_columns(gen *g, int64_t from, LLVMValueRef to)
{
    loop l = loop_begin(g, "store");
    g->i = from ? LLVMBuildAdd(g->b, l.index, i64c(g, from), "") : l.index;
    clear_memo(g);
    emit_stores(g, KX_STORE_PASS);
    loop_end(g, &l, from ? LLVMBuildSub(g->b, to, i64c(g, from), "") : to);
}

/* The store pass: one loop over the row, or for a bounded kernel one from
 * each cut at its views' column bounds to the next, where each view's loads
 * are either ordinary or its fill. */
static void store_loop(gen *g)
{
    enum { MAX_CUTS = 16 };
    int64_t cuts[MAX_CUTS];
    int n = kx_bounded(g->k) ? column_cuts(g->k, cuts, MAX_CUTS) : -1;
    if (n < 0) {
        store_columns(g, 0, size_value(g, g->k->cols));
        return;
    }
    for (int c = 0; c < n; c++) {
        columns_within(g, cuts[c]);
        store_columns(g, cuts[c], c + 1 < n ? i64c(g, cuts[c + 1]) : size_value(g, g->k->cols));
    }
    memset(g->column_within, -1, (size_t)g->k->n_views);
}

/* Whether the reciprocal of each divisor of a division by a row's value is
 * a normal number, so that a * (1 / b) is within an ulp of a / b: |b| in
 * [least normal, 1 / least normal]; NULL when there is no such division. */
static LLVMValueRef reciprocals_normal(gen *g)
{
    const kx_kernel *k = g->k;
    LLVMValueRef all = NULL;
    clear_memo(g);
    for (int e = 0; e < k->n_exprs; e++) {
        if (!row_division(k, &k->exprs[e]))
            continue;
        kiln_dtype dt = k->exprs[e].dtype;
        double least = dt == KILN_F32 ? 0x1p-126 : 0x1p-1022;
        LLVMValueRef b = expr(g, k->exprs[e].args[1]);
        LLVMValueRef mag = intrinsic(g, "llvm.fabs", type_of(g->ctx, dt), &b, 1);
        LLVMValueRef ok = LLVMBuildAnd(g->b, LLVMBuildFCmp(g->b, LLVMRealOGE, mag, constant(g, dt, least), ""),
                                       LLVMBuildFCmp(g->b, LLVMRealOLE, mag, constant(g, dt, 1 / least), ""), "");
        all = all ? LLVMBuildAnd(g->b, all, ok, "") : ok;
    }
    return all;
}

/* The store pass; with divisions by a row's value, a second loop taking
 * their reciprocals, for rows where that is exact enough. */
static void store_row(gen *g)
{
    const kx_kernel *k = g->k;
    bool any = false;
    for (int s = 0; s < k->n_stores; s++)
        any |= k->stores[s].pass == KX_STORE_PASS;
    if (!any || k->cols == 0)
        return;
    LLVMValueRef normal = reciprocals_normal(g);
    if (!normal) {
        store_loop(g);
        return;
    }
    LLVMBasicBlockRef fast = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "reciprocal");
    LLVMBasicBlockRef slow = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "divide");
    LLVMBasicBlockRef stored = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "stored");
    /* frozen: a row whose max dropped its NaN may test poison (combine) */
    LLVMBuildCondBr(g->b, LLVMBuildFreeze(g->b, normal, ""), fast, slow);
    LLVMPositionBuilderAtEnd(g->b, fast);
    g->reciprocal = true;
    store_loop(g);
    g->reciprocal = false;
    LLVMBuildBr(g->b, stored);
    LLVMPositionBuilderAtEnd(g->b, slow);
    store_loop(g);
    LLVMBuildBr(g->b, stored);
    LLVMPositionBuilderAtEnd(g->b, stored);
}

/* -- Rows ------------------------------------------------------------------ */

/* Whether the row's outer index is within v's outer bounds (an i1), each
 * index clamped into them in at, so that a bounded view's row base is one
 * inside its tensor. */
static LLVMValueRef row_within(gen *g, const kx_view *v, LLVMValueRef *at)
{
    LLVMValueRef in = LLVMConstInt(LLVMInt1TypeInContext(g->ctx), 1, 0);
    for (int b = 0; b < v->n_bounds; b++) {
        const kx_bound *d = &v->bounds[b];
        if (d->dim == g->k->n_outer)
            continue;
        LLVMValueRef lo = i64c(g, d->lo), last = i64c(g, d->hi - 1), i = at[d->dim];
        LLVMValueRef below = LLVMBuildICmp(g->b, LLVMIntSLT, i, lo, "");
        LLVMValueRef above = LLVMBuildICmp(g->b, LLVMIntSGT, i, last, "");
        in = LLVMBuildAnd(g->b, in, LLVMBuildNot(g->b, LLVMBuildOr(g->b, below, above, ""), ""), "");
        at[d->dim] = LLVMBuildSelect(g->b, below, lo, LLVMBuildSelect(g->b, above, last, i, ""), "");
    }
    return in;
}

/* Each view's first element of row into base: its offset plus the row's
 * outer index times the outer strides (for a bounded view, the index
 * clamped into its bounds: row_within). */
static void view_bases_of(gen *g, LLVMValueRef row, LLVMValueRef *base_of)
{
    const kx_kernel *k = g->k;
    LLVMValueRef index[KX_MAX_DIMS];
    LLVMValueRef rest = row;
    for (int d = k->n_outer - 1; d >= 0; d--) {
        index[d] = d ? LLVMBuildSRem(g->b, rest, size_value(g, k->outer[d]), "") : rest;
        if (d)
            rest = LLVMBuildSDiv(g->b, rest, size_value(g, k->outer[d]), "");
    }
    for (int v = 0; v < k->n_views; v++) {
        LLVMValueRef at[KX_MAX_DIMS];
        memcpy(at, index, (size_t)k->n_outer * sizeof *index);
        if (base_of == g->view_base)
            g->row_within[v] = row_within(g, &k->views[v], at);
        LLVMValueRef base = size_value(g, k->views[v].offset);
        for (int d = 0; d < k->n_outer; d++)
            if (k->views[v].outer_strides[d])
                base = LLVMBuildAdd(g->b, base,
                                    LLVMBuildMul(g->b, at[d], size_value(g, k->views[v].outer_strides[d]), ""), "");
        base_of[v] = base;
    }
}

static void view_bases(gen *g, LLVMValueRef row)
{
    view_bases_of(g, row, g->view_base);
}

/* Whether expression e reads no row's value and only buffers k does not
 * write. */
static bool reads_inputs_only(const kx_kernel *k, int e)
{
    const kx_expr *x = &k->exprs[e];
    if (x->kind == KX_ROW || x->kind == KX_GATHER) /* a gather's view bases are this row's */
        return false;
    if (x->kind == KX_LOAD)
        return !kx_writes(k, k->views[x->view].buffer);
    for (int i = 0; operand(x, i) >= 0; i++)
        if (!reads_inputs_only(k, x->args[i]))
            return false;
    return true;
}

/* Whether reduction 1's loop prefetches the next row's lines that
 * reduction 0 (softmax's max, layer norm's mean) reads: it stores nothing
 * and reads only the kernel's inputs, so that its lines are the next row's
 * input, unchanged by this row's stores; rows known to be longer than
 * PREFETCH_ROW_BYTES run their loop whole. */
static bool prefetches_next(const kx_kernel *k)
{
    if (k->n_reductions < 2 || k->cols == 0 || kx_bounded(k)) /* bounds are this row's */
        return false;
    int widest = widest_prefetched(k);
    if (!widest || (k->cols > 0 && k->cols * widest > PREFETCH_ROW_BYTES))
        return false;
    for (int s = 0; s < k->n_stores; s++)
        if (k->stores[s].pass == kx_reduction_pass(0))
            return false;
    return reads_inputs_only(k, k->reductions[0].expr);
}

/* Row's passes; where reduction 1 prefetches the next row's lines
 * (prefetches_next), that row is row + 1, or row again where it is the
 * last (end: past the last). */
static void emit_row(gen *g, LLVMValueRef row, LLVMValueRef end)
{
    const kx_kernel *k = g->k;
    bool prefetch = prefetches_next(k);
    view_bases(g, row);
    if (prefetch) {
        LLVMValueRef after = LLVMBuildAdd(g->b, row, i64c(g, 1), "");
        view_bases_of(g, LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, after, end, ""), after, row, ""),
                      g->next_base);
    }
    for (int r = 0; r < k->n_reductions; r++)
        g->rows[r] = reduce_row(g, r, prefetch && r == 1);
    store_row(g);
    for (int s = 0; s < k->n_row_stores; s++) {
        const kx_row_store *rs = &k->row_stores[s];
        LLVMValueRef at = LLVMBuildGEP2(g->b, type_of(g->ctx, rs->dtype), g->buffers[rs->buffer], &row, 1, "");
        if (rs->expr >= 0) /* its loads are constant along the row: they ignore g->i */
            clear_memo(g);
        LLVMValueRef value = rs->expr >= 0 ? expr(g, rs->expr) : g->rows[rs->row];
        LLVMBuildStore(g->b, convert(g, value, rs->from, rs->dtype), at);
    }
}

static void add_attribute(gen *g, LLVMValueRef fn, unsigned index, const char *name, uint64_t value)
{
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    LLVMAddAttributeAtIndex(fn, index, LLVMCreateEnumAttribute(g->ctx, kind, value));
}

/* body(begin, end, buffers..., symbols): the rows [begin, end). The
 * streaming body may assume its outputs 64-byte aligned, and fences its
 * non-temporal stores before it returns. */
static LLVMValueRef emit_body(gen *g, const char *name, bool streaming)
{
    const kx_kernel *k = g->k;
    LLVMTypeRef params[3 + KX_MAX_BUFFERS];
    params[0] = params[1] = g->i64;
    for (int i = 0; i <= k->n_buffers; i++)
        params[2 + i] = LLVMPointerTypeInContext(g->ctx, 0);
    LLVMTypeRef type = LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 3 + (unsigned)k->n_buffers, 0);
    g->fn = LLVMAddFunction(g->module, name, type);
    LLVMSetLinkage(g->fn, LLVMInternalLinkage);
    g->stream_tag = streaming ? stream_tag(g->ctx) : NULL;
    if (streaming)
        add_attribute(g, g->fn, LLVMAttributeFunctionIndex, "noinline", 0);
    for (int i = 0; i < k->n_buffers; i++) {
        add_attribute(g, g->fn, 3 + (unsigned)i, "noalias", 0);
        if (streaming && kx_writes(k, i))
            add_attribute(g, g->fn, 3 + (unsigned)i, "align", 64);
        g->buffers[i] = LLVMGetParam(g->fn, 2 + (unsigned)i);
    }
    g->symbols = LLVMGetParam(g->fn, 2 + (unsigned)k->n_buffers);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry");
    LLVMBasicBlockRef rows = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "rows");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "done");
    LLVMPositionBuilderAtEnd(g->b, entry);
    g->kept = streaming ? kx_kept_view(k) : -1;
    if (g->kept >= 0) { /* up to 64 KiB of stack: probed, past a small stack's guard page it would not fault */
        LLVMTypeRef row = LLVMArrayType2(type_of(g->ctx, k->views[g->kept].dtype), (uint64_t)k->cols);
        g->scratch = LLVMBuildAlloca(g->b, row, "kept");
        LLVMSetAlignment(g->scratch, 64);
        LLVMAddAttributeAtIndex(g->fn, LLVMAttributeFunctionIndex,
                                LLVMCreateStringAttribute(g->ctx, "probe-stack", 11, "inline-asm", 10));
    }
    compute_sizes(g);
    LLVMValueRef begin = LLVMGetParam(g->fn, 0), end = LLVMGetParam(g->fn, 1);
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, begin, end, ""), rows, done);
    LLVMPositionBuilderAtEnd(g->b, rows);
    LLVMValueRef row = LLVMBuildPhi(g->b, g->i64, "row");
    LLVMAddIncoming(row, &begin, &pre, 1);
    emit_row(g, row, end);
    LLVMValueRef next = LLVMBuildAdd(g->b, row, i64c(g, 1), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(row, &next, &latch, 1);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, next, end, ""), rows, done);
    LLVMPositionBuilderAtEnd(g->b, done);
    if (streaming) /* non-temporal stores are weakly ordered: publish them */
        LLVMBuildFence(g->b, LLVMAtomicOrderingSequentiallyConsistent, 0, "");
    LLVMBuildRetVoid(g->b);
    return g->fn;
}

/* Whether every stored buffer of a streaming kernel is 64-byte aligned. */
static LLVMValueRef outputs_aligned(gen *g, LLVMValueRef *pointers)
{
    LLVMValueRef low_bits = i64c(g, 0);
    for (int i = 0; i < g->k->n_buffers; i++)
        if (kx_writes(g->k, i))
            low_bits = LLVMBuildOr(g->b, low_bits, LLVMBuildPtrToInt(g->b, pointers[i], g->i64, ""), "");
    low_bits = LLVMBuildAnd(g->b, low_bits, i64c(g, 63), "");
    return LLVMBuildICmp(g->b, LLVMIntEQ, low_bits, i64c(g, 0), "");
}

static void call_body(gen *g, LLVMValueRef body, LLVMValueRef *args)
{
    LLVMBuildCall2(g->b, LLVMGlobalGetValueType(body), body, args, 3 + (unsigned)g->k->n_buffers, "");
    LLVMBuildRetVoid(g->b);
}

/* entry(buffers, begin, end, symbols): loads the pointers and calls the
 * body, the streaming one if there is one and the outputs are aligned for it. */
static void emit_entry(gen *g, LLVMValueRef body, LLVMValueRef streaming_body, const char *name)
{
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0);
    LLVMTypeRef params[4] = {ptr, g->i64, g->i64, ptr};
    LLVMValueRef fn = LLVMAddFunction(g->module, name, LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 4, 0));
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, fn, "entry"));
    LLVMValueRef args[3 + KX_MAX_BUFFERS];
    args[0] = LLVMGetParam(fn, 1);
    args[1] = LLVMGetParam(fn, 2);
    for (int i = 0; i < g->k->n_buffers; i++) {
        LLVMValueRef index = i64c(g, i);
        LLVMValueRef at = LLVMBuildGEP2(g->b, ptr, LLVMGetParam(fn, 0), &index, 1, "");
        args[2 + i] = LLVMBuildLoad2(g->b, ptr, at, "");
    }
    args[2 + g->k->n_buffers] = LLVMGetParam(fn, 3);
    if (!streaming_body) {
        call_body(g, body, args);
        return;
    }
    LLVMBasicBlockRef aligned = LLVMAppendBasicBlockInContext(g->ctx, fn, "aligned");
    LLVMBasicBlockRef unaligned = LLVMAppendBasicBlockInContext(g->ctx, fn, "unaligned");
    LLVMBuildCondBr(g->b, outputs_aligned(g, args + 2), aligned, unaligned);
    LLVMPositionBuilderAtEnd(g->b, aligned);
    call_body(g, streaming_body, args);
    LLVMPositionBuilderAtEnd(g->b, unaligned);
    call_body(g, body, args);
}

/* Sets g up to build functions of k into module; false (why in err) when
 * out of memory. */
static bool gen_open(gen *g, LLVMModuleRef module, const kx_kernel *k, LLVMValueRef *buffers, char *err,
                     size_t err_size)
{
    LLVMContextRef ctx = LLVMGetModuleContext(module);
    *g = (gen){.ctx = ctx, .module = module, .b = LLVMCreateBuilderInContext(ctx), .k = k,
               .i64 = LLVMInt64TypeInContext(ctx), .buffers = buffers, .max_ignores_nan = max_ignores_nan(k),
               .kept = -1};
    g->view_base = calloc((size_t)k->n_views + 1, sizeof *g->view_base);
    g->next_base = calloc((size_t)k->n_views + 1, sizeof *g->next_base);
    g->rows = calloc((size_t)k->n_reductions + 1, sizeof *g->rows);
    g->memo = calloc((size_t)k->n_exprs + 1, sizeof *g->memo);
    g->sizes = calloc((size_t)k->sizes.n + 1, sizeof *g->sizes);
    g->row_within = calloc((size_t)k->n_views + 1, sizeof *g->row_within);
    g->column_within = malloc((size_t)k->n_views + 1);
    bool ok = g->view_base && g->next_base && g->rows && g->memo && g->sizes && g->row_within && g->column_within;
    if (g->column_within)
        memset(g->column_within, -1, (size_t)k->n_views + 1);
    if (!ok)
        snprintf(err, err_size, "out of memory generating a kernel");
    return ok;
}

/* Ends g: 0, or -1 with the op the backend lacks in err. */
static int gen_close(gen *g, char *err, size_t err_size)
{
    if (g->missing[0])
        snprintf(err, err_size, "%s", g->missing);
    free(g->view_base);
    free(g->next_base);
    free(g->rows);
    free(g->memo);
    free(g->sizes);
    free(g->row_within);
    free(g->column_within);
    LLVMDisposeBuilder(g->b);
    return g->missing[0] ? -1 : 0;
}

int codegen_kernel(LLVMModuleRef module, const kx_kernel *k, const char *name, bool stream_stores, char *err,
                   size_t err_size)
{
    KILN_ASSERT(k->n_buffers <= KX_MAX_BUFFERS && k->product < 0);
    gen g;
    LLVMValueRef buffers[KX_MAX_BUFFERS];
    if (!gen_open(&g, module, k, buffers, err, err_size))
        return gen_close(&g, err, err_size), -1;
    char body_name[128], streaming_name[160];
    snprintf(body_name, sizeof body_name, "%s.body", name);
    snprintf(streaming_name, sizeof streaming_name, "%s.streaming", body_name);
    LLVMValueRef body = emit_body(&g, body_name, false);
    if (stream_stores) { /* only unaligned outputs take it, which kiln never allocates: not worth optimising */
        add_attribute(&g, body, LLVMAttributeFunctionIndex, "noinline", 0);
        add_attribute(&g, body, LLVMAttributeFunctionIndex, "optnone", 0);
    }
    emit_entry(&g, body, stream_stores ? emit_body(&g, streaming_name, true) : NULL, name);
    return gen_close(&g, err, err_size);
}

static bool is_stream_store(LLVMValueRef in, unsigned tbaa)
{
    return LLVMGetInstructionOpcode(in) == LLVMStore && LLVMGetMetadata(in, tbaa) &&
           LLVMGetTypeKind(LLVMTypeOf(LLVMGetOperand(in, 0))) == LLVMVectorTypeKind;
}

void codegen_stream_stores(LLVMModuleRef module)
{
    LLVMContextRef ctx = LLVMGetModuleContext(module);
    LLVMTargetDataRef layout = LLVMGetModuleDataLayout(module);
    unsigned tbaa = LLVMGetMDKindIDInContext(ctx, "tbaa", 4);
    unsigned nontemporal = LLVMGetMDKindIDInContext(ctx, "nontemporal", 11);
    LLVMMetadataRef one = LLVMValueAsMetadata(LLVMConstInt(LLVMInt32TypeInContext(ctx), 1, 0));
    LLVMValueRef mark = LLVMMetadataAsValue(ctx, LLVMMDNodeInContext2(ctx, &one, 1));
    for (LLVMValueRef f = LLVMGetFirstFunction(module); f; f = LLVMGetNextFunction(f))
        for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb; bb = LLVMGetNextBasicBlock(bb))
            for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in; in = LLVMGetNextInstruction(in))
                if (is_stream_store(in, tbaa) &&
                    LLVMGetAlignment(in) >= LLVMStoreSizeOfType(layout, LLVMTypeOf(LLVMGetOperand(in, 0))))
                    LLVMSetMetadata(in, nontemporal, mark);
}

/* -- A product's epilogue and prologue ----------------------------------------- */

/* Starts the internal function name(ptr, i64, i64, i64, i64, buffers...,
 * symbols) of the kernel's buffers (noalias): the builder in its entry,
 * after the kernel's sizes. */
static void tile_function(gen *g, const char *name)
{
    const kx_kernel *k = g->k;
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0), params[6 + KX_MAX_BUFFERS] = {ptr};
    for (int i = 1; i < 5; i++)
        params[i] = g->i64;
    for (int i = 0; i <= k->n_buffers; i++)
        params[5 + i] = ptr;
    LLVMTypeRef type = LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 6 + (unsigned)k->n_buffers, 0);
    g->fn = LLVMAddFunction(g->module, name, type);
    LLVMSetLinkage(g->fn, LLVMInternalLinkage);
    for (int i = 0; i < k->n_buffers; i++) {
        add_attribute(g, g->fn, 6 + (unsigned)i, "noalias", 0);
        g->buffers[i] = LLVMGetParam(g->fn, 5 + (unsigned)i);
    }
    g->symbols = LLVMGetParam(g->fn, 5 + (unsigned)k->n_buffers);
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, g->fn, "entry"));
    compute_sizes(g);
}

/* Calls body with args[0..5), the kernel's buffer pointers, loaded from the
 * array at buffers, and symbols; returns. */
static void call_with_buffers(gen *g, LLVMValueRef body, LLVMValueRef *args, LLVMValueRef buffers,
                              LLVMValueRef symbols)
{
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0);
    for (int i = 0; i < g->k->n_buffers; i++) {
        LLVMValueRef index = i64c(g, i);
        args[5 + i] = LLVMBuildLoad2(g->b, ptr, LLVMBuildGEP2(g->b, ptr, buffers, &index, 1, ""), "");
    }
    args[5 + g->k->n_buffers] = symbols;
    LLVMBuildCall2(g->b, LLVMGlobalGetValueType(body), body, args, 6 + (unsigned)g->k->n_buffers, "");
    LLVMBuildRetVoid(g->b);
}

/* The value of attention kernel k's one store (its scores) over the
 * product's element in the tile: written over it, in the product's dtype. */
static void emit_score(gen *g)
{
    const kx_kernel *k = g->k;
    kiln_dtype dt = k->buffer_dtypes[k->product];
    const kx_store *st = &k->stores[0];
    LLVMValueRef value = convert(g, expr(g, st->expr), k->exprs[st->expr].dtype, dt);
    LLVMBuildStore(g->b, value, LLVMBuildGEP2(g->b, type_of(g->ctx, dt), g->tile, &g->tile_index, 1, ""));
}

/* body(tile, m_rem, n_rem, row0, col0, buffers..., symbols): k's stores over rows
 * [row0, row0 + m_rem) and columns [col0, col0 + n_rem) (both at least 1),
 * the product's element (r, j) of them read from tile[r * ld + j]; an
 * attention kernel's scores written over the tile. */
static LLVMValueRef emit_epilogue_body(gen *g, const char *name, int ld)
{
    tile_function(g, name);
    g->tile = LLVMGetParam(g->fn, 0);
    LLVMValueRef m_rem = LLVMGetParam(g->fn, 1), n_rem = LLVMGetParam(g->fn, 2);
    LLVMValueRef row0 = LLVMGetParam(g->fn, 3), col0 = LLVMGetParam(g->fn, 4);
    loop rows = loop_begin(g, "rows");
    view_bases(g, LLVMBuildAdd(g->b, row0, rows.index, ""));
    LLVMValueRef tile_row = LLVMBuildMul(g->b, rows.index, i64c(g, ld), "");
    loop cols = loop_begin(g, "cols");
    g->i = LLVMBuildAdd(g->b, col0, cols.index, "");
    g->tile_index = LLVMBuildAdd(g->b, tile_row, cols.index, "");
    clear_memo(g);
    if (g->k->attention)
        emit_score(g);
    else
        emit_stores(g, KX_STORE_PASS);
    loop_end(g, &cols, n_rem);
    loop_end(g, &rows, m_rem);
    LLVMBuildRetVoid(g->b);
    return g->fn;
}

/* Whether the epilogue moves view v through memory along its rows: its
 * rows move (rows_move), it is not the product's tile, and it is stored or
 * loaded. */
static bool moves_through_memory(const gen *g, int v)
{
    const kx_kernel *k = g->k;
    const kx_view *view = &k->views[v];
    if (view == g->product || !rows_move(k, view))
        return false;
    for (int s = 0; s < k->n_stores; s++)
        if (k->stores[s].view == v)
            return true;
    for (int e = 0; e < k->n_exprs; e++)
        if (k->exprs[e].kind == KX_LOAD && k->exprs[e].view == v)
            return true;
    return false;
}

/* body(tile, m_rem, n_rem, row0, col0, buffers..., symbols), tile unused:
 * prefetches the lines that the epilogue will load or store in each row of
 * a tile of at most nr columns and of the tile below it (in a block of
 * rows, the micro-kernel's next, whose lines then have a whole tile's time
 * to arrive; this tile's own serve the first of each column of tiles), so
 * that the k loop hides their misses: a residual read from memory
 * otherwise stalls each tile. Below a block's last tile the rows are the
 * next block's or another thread's, below the product's last they are past
 * its buffers: a wasted prefetch, which never faults. Points at most a
 * line apart, and the last column, cover every line of a row. */
static LLVMValueRef emit_prefetch_body(gen *g, const char *name, int nr)
{
    tile_function(g, name);
    LLVMValueRef m_rem = LLVMGetParam(g->fn, 1), n_rem = LLVMGetParam(g->fn, 2);
    LLVMValueRef row0 = LLVMGetParam(g->fn, 3), col0 = LLVMGetParam(g->fn, 4);
    LLVMValueRef last = LLVMBuildSub(g->b, n_rem, i64c(g, 1), "");
    LLVMValueRef rows_ahead = LLVMBuildAdd(g->b, m_rem, m_rem, "");
    loop rows = loop_begin(g, "rows");
    view_bases(g, LLVMBuildAdd(g->b, row0, rows.index, ""));
    for (int v = 0; v < g->k->n_views; v++) {
        if (!moves_through_memory(g, v))
            continue;
        bool stored = kx_writes(g->k, g->k->views[v].buffer);
        int per_line = 64 / (int)ir_dtype_size(g->k->views[v].dtype);
        for (int c = 0; c < nr + per_line; c += per_line) {
            LLVMValueRef inside = LLVMBuildICmp(g->b, LLVMIntSLT, i64c(g, c), n_rem, "");
            g->i = LLVMBuildAdd(g->b, col0, LLVMBuildSelect(g->b, inside, i64c(g, c), last, ""), "");
            prefetch_line(g, &g->k->views[v], stored);
        }
    }
    loop_end(g, &rows, rows_ahead);
    LLVMBuildRetVoid(g->b);
    return g->fn;
}

/* A field of the gemm_tile at tile (codegen_llvm/gemm.h): 8 bytes each. */
static LLVMValueRef tile_field(gen *g, LLVMValueRef tile, int field, LLVMTypeRef type)
{
    LLVMValueRef at = i64c(g, 8 * field);
    return LLVMBuildLoad2(g->b, type, LLVMBuildGEP2(g->b, LLVMInt8TypeInContext(g->ctx), tile, &at, 1, ""), "");
}

/* epilogue(tile, gemm_tile *): the fields of the gemm_tile and the buffer
 * pointers loaded, the body called. */
static LLVMValueRef emit_epilogue_entry(gen *g, LLVMValueRef body, const char *name)
{
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0), params[2] = {ptr, ptr};
    LLVMValueRef fn = LLVMAddFunction(g->module, name, LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 2, 0));
    LLVMSetVisibility(fn, LLVMHiddenVisibility); /* not internal: optimised before its caller exists */
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, fn, "entry"));
    LLVMValueRef args[6 + KX_MAX_BUFFERS] = {LLVMGetParam(fn, 0)}, tile = LLVMGetParam(fn, 1);
    for (int f = 0; f < 4; f++) /* m_rem, n_rem, row0, col0 */
        args[1 + f] = tile_field(g, tile, f, g->i64);
    call_with_buffers(g, body, args, tile_field(g, tile, 6, ptr), tile_field(g, tile, 7, ptr));
    return fn;
}

LLVMValueRef codegen_epilogue(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int ld, char *err,
                              size_t err_size)
{
    KILN_ASSERT(k->n_buffers <= KX_MAX_BUFFERS && !kx_product_misfit(k));
    gen g;
    LLVMValueRef buffers[KX_MAX_BUFFERS];
    if (!gen_open(&g, module, k, buffers, err, err_size))
        return gen_close(&g, err, err_size), NULL;
    g.product = &k->views[kx_product_view(k)];
    char body_name[192], name[192];
    snprintf(body_name, sizeof body_name, "%s.epilogue.body", symbol);
    snprintf(name, sizeof name, "%s.epilogue", symbol);
    LLVMValueRef fn = emit_epilogue_entry(&g, emit_epilogue_body(&g, body_name, ld), name);
    snprintf(body_name, sizeof body_name, "%s%s.body", symbol, GEMM_EPILOGUE_PREFETCH);
    snprintf(name, sizeof name, "%s%s", symbol, GEMM_EPILOGUE_PREFETCH);
    emit_epilogue_entry(&g, emit_prefetch_body(&g, body_name, ld), name);
    return gen_close(&g, err, err_size) == 0 ? fn : NULL;
}

/* The loop of count iterations starting at the builder, or nothing when
 * count is not positive: the body follows; close with loop_end then
 * skip_end. */
static loop loop_begin_if(gen *g, LLVMValueRef count, const char *name, LLVMBasicBlockRef *skip)
{
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "nonempty");
    *skip = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "skipped");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, count, i64c(g, 0), ""), body, *skip);
    LLVMPositionBuilderAtEnd(g->b, body);
    return loop_begin(g, name);
}

static void skip_end(gen *g, LLVMBasicBlockRef skip)
{
    LLVMBuildBr(g->b, skip);
    LLVMPositionBuilderAtEnd(g->b, skip);
}

/* Element (r, j) of a block of A packed as gemm.h's pack_a packs it: panels
 * of mr rows, each cols steps of mr values. */
static LLVMValueRef packed_at(gen *g, LLVMValueRef dst, LLVMValueRef r, LLVMValueRef j, LLVMValueRef cols, int mr,
                              kiln_dtype dt)
{
    LLVMValueRef m = i64c(g, mr);
    LLVMValueRef panel = LLVMBuildMul(g->b, LLVMBuildSDiv(g->b, r, m, ""), LLVMBuildMul(g->b, cols, m, ""), "");
    LLVMValueRef at = LLVMBuildAdd(g->b, panel, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, j, m, ""),
                                                             LLVMBuildSRem(g->b, r, m, ""), ""), "");
    return LLVMBuildGEP2(g->b, type_of(g->ctx, dt), dst, &at, 1, "");
}

/* body(dst, row0, rows, col0, cols, buffers..., symbols): rows [row0, row0 + rows)
 * (at least 1) and columns [col0, col0 + cols) of the product's left
 * operand as the prologue computes it, packed into dst of the product's
 * dtype dt, the rows up to a multiple of mr zero. */
static LLVMValueRef emit_prologue_body(gen *g, const char *name, int mr, kiln_dtype dt)
{
    tile_function(g, name);
    LLVMValueRef dst = LLVMGetParam(g->fn, 0), row0 = LLVMGetParam(g->fn, 1), rows = LLVMGetParam(g->fn, 2);
    LLVMValueRef col0 = LLVMGetParam(g->fn, 3), cols = LLVMGetParam(g->fn, 4);
    LLVMBasicBlockRef skip, pad_skip, cols_skip;
    const kx_store *st = &g->k->stores[0];
    loop r = loop_begin_if(g, cols, "rows", &skip);
    view_bases(g, LLVMBuildAdd(g->b, row0, r.index, ""));
    loop j = loop_begin(g, "cols");
    g->i = LLVMBuildAdd(g->b, col0, j.index, "");
    clear_memo(g);
    LLVMValueRef value = convert(g, expr(g, st->expr), g->k->exprs[st->expr].dtype, dt);
    LLVMBuildStore(g->b, value, packed_at(g, dst, r.index, j.index, cols, mr, dt));
    loop_end(g, &j, cols);
    loop_end(g, &r, rows);
    skip_end(g, skip);
    LLVMValueRef padded = LLVMBuildMul(g->b, LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, rows, i64c(g, mr - 1), ""),
                                                           i64c(g, mr), ""), i64c(g, mr), "");
    LLVMValueRef pad_rows = LLVMBuildSub(g->b, padded, rows, "");
    loop pad = loop_begin_if(g, pad_rows, "pad", &pad_skip);
    loop pc = loop_begin_if(g, cols, "pad_cols", &cols_skip);
    LLVMValueRef at = packed_at(g, dst, LLVMBuildAdd(g->b, rows, pad.index, ""), pc.index, cols, mr, dt);
    LLVMBuildStore(g->b, constant(g, dt, 0), at);
    loop_end(g, &pc, cols);
    skip_end(g, cols_skip);
    loop_end(g, &pad, pad_rows);
    skip_end(g, pad_skip);
    LLVMBuildRetVoid(g->b);
    return g->fn;
}

/* name(p, i, i, i, i, buffers, symbols), a prologue or attention's scores:
 * the buffer pointers loaded, body(p, i, i, i, i, buffers..., symbols)
 * called. */
static void emit_block_entry(gen *g, LLVMValueRef body, const char *name)
{
    LLVMTypeRef ptr = LLVMPointerTypeInContext(g->ctx, 0), params[7] = {ptr, g->i64, g->i64, g->i64, g->i64, ptr, ptr};
    LLVMValueRef fn = LLVMAddFunction(g->module, name, LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, 7, 0));
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->ctx, fn, "entry"));
    LLVMValueRef args[6 + KX_MAX_BUFFERS];
    for (int i = 0; i < 5; i++)
        args[i] = LLVMGetParam(fn, (unsigned)i);
    call_with_buffers(g, body, args, LLVMGetParam(fn, 5), LLVMGetParam(fn, 6));
}

int codegen_prologue(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int mr, char *err,
                     size_t err_size)
{
    const kx_kernel *pro = k->prologue;
    KILN_ASSERT(pro && pro->n_buffers == k->n_buffers && pro->n_stores == 1 && pro->n_reductions == 0);
    gen g;
    LLVMValueRef buffers[KX_MAX_BUFFERS];
    if (!gen_open(&g, module, pro, buffers, err, err_size))
        return gen_close(&g, err, err_size), -1;
    char body_name[192], name[192];
    snprintf(body_name, sizeof body_name, "%s%s.body", symbol, GEMM_PROLOGUE);
    snprintf(name, sizeof name, "%s%s", symbol, GEMM_PROLOGUE);
    emit_block_entry(&g, emit_prologue_body(&g, body_name, mr, k->buffer_dtypes[k->product]), name);
    return gen_close(&g, err, err_size);
}

int codegen_scores(LLVMModuleRef module, const kx_kernel *k, const char *symbol, int ld, char *err, size_t err_size)
{
    KILN_ASSERT(k->attention && k->n_buffers <= KX_MAX_BUFFERS && !kx_product_misfit(k) && k->n_stores == 1);
    gen g;
    LLVMValueRef buffers[KX_MAX_BUFFERS];
    if (!gen_open(&g, module, k, buffers, err, err_size))
        return gen_close(&g, err, err_size), -1;
    g.product = &k->views[kx_product_view(k)];
    char body_name[192], name[192];
    snprintf(body_name, sizeof body_name, "%s%s.body", symbol, GEMM_SCORES);
    snprintf(name, sizeof name, "%s%s", symbol, GEMM_SCORES);
    emit_block_entry(&g, emit_epilogue_body(&g, body_name, ld), name);
    return gen_close(&g, err, err_size);
}
