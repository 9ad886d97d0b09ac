/* A matrix product's code as LLVM IR: the packing of A and B into panels and
 * the register-blocked micro-kernel of BLIS, sized for the target's vector
 * registers (gemm.h says what each function does; gemm.c runs them).
 *
 * The micro-kernel keeps an mr x nr tile of C in mr * nv vector registers:
 * each step along k loads nv vectors of a B panel, broadcasts mr values of
 * an A panel, and issues mr * nv fused multiply-adds (llvm.fmuladd: one FMA
 * where the target has them, a multiply and an add where not). The k loop
 * is unrolled four times. The tile starts from zero, adds partial sums of
 * earlier blocks of k when there are some, and ends in partial sums, in the
 * product (masked at its edges), or in a fused kernel's epilogue: the tile
 * goes to the stack and the epilogue, generated from the kernel IR by
 * codegen.c, runs over its elements in cache. The kernel prefetches the
 * tile it will read or write before its k loop; before a k loop that ends
 * in the epilogue, it calls the epilogue's prefetch (codegen_epilogue). A
 * product's last tiles, of few rows or few columns, run k loops over their
 * part alone (k_spans).
 *
 * Packing copies vectors where the panel's lines lie across memory (a
 * row-major B), and transposes blocks of lanes x lanes in registers where
 * a row-major A's rows lie along k.
 *
 * Every function is marked to keep vectors of the registers' width: LLVM
 * splits 512-bit vectors on CPUs that prefer 256 unless a function says
 * otherwise. */
#include <stdio.h>
#include <string.h>

#include <llvm-c/Target.h>

#include "codegen_llvm/gemm_codegen.h"
#include "codegen_llvm/internal.h"
#include "core/core.h"

enum { UNROLL = 4 };

typedef struct {
    LLVMContextRef ctx;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMTypeRef t, vt, i64, i32, ptr;
    gemm_shape s;
    int size;
    int vector_bits;
} gg;

/* -- Registers ----------------------------------------------------------------- */

static void add_vector_width(LLVMContextRef ctx, LLVMValueRef fn, int bits)
{
    char width[16];
    snprintf(width, sizeof width, "%d", bits);
    const char *names[2] = {"min-legal-vector-width", "prefer-vector-width"};
    for (int i = 0; i < 2; i++)
        LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                                LLVMCreateStringAttribute(ctx, names[i], (unsigned)strlen(names[i]), width,
                                                          (unsigned)strlen(width)));
}

/* The assembly tm makes of a 512-bit vector add, allowed the whole width. */
static char *probe_assembly(LLVMTargetMachineRef tm)
{
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = llvm_module_for(ctx, tm);
    LLVMTypeRef ptr = LLVMPointerTypeInContext(ctx, 0), vt = LLVMVectorType(LLVMFloatTypeInContext(ctx), 16);
    LLVMValueRef fn = LLVMAddFunction(m, "probe", LLVMFunctionType(LLVMVoidTypeInContext(ctx), &ptr, 1, 0));
    add_vector_width(ctx, fn, 512);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(ctx, fn, "entry"));
    LLVMValueRef v = LLVMBuildLoad2(b, vt, LLVMGetParam(fn, 0), "");
    LLVMBuildStore(b, LLVMBuildFAdd(b, v, v, ""), LLVMGetParam(fn, 0));
    LLVMBuildRetVoid(b);
    LLVMDisposeBuilder(b);
    LLVMMemoryBufferRef buffer = NULL;
    char *message = NULL, *text = NULL;
    if (!LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMAssemblyFile, &message, &buffer)) {
        size_t n = LLVMGetBufferSize(buffer);
        if ((text = malloc(n + 1))) {
            memcpy(text, LLVMGetBufferStart(buffer), n);
            text[n] = '\0';
        }
        LLVMDisposeMemoryBuffer(buffer);
    }
    LLVMDisposeMessage(message);
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    return text;
}

gemm_registers gemm_probe_registers(LLVMTargetMachineRef tm)
{
    char *triple = LLVMGetTargetMachineTriple(tm);
    bool arm = !strncmp(triple, "aarch64", 7) || !strncmp(triple, "arm64", 5);
    LLVMDisposeMessage(triple);
    char *text = probe_assembly(tm);
    gemm_registers r = {128, arm ? 32 : 16};
    if (text && strstr(text, "zmm"))
        r = (gemm_registers){512, 32};
    else if (text && strstr(text, "ymm"))
        r = (gemm_registers){256, 16};
    free(text);
    return r;
}

gemm_shape gemm_shape_for(kiln_dtype dt, gemm_registers r)
{
    int size = dt == KILN_F64 ? 8 : 4;
    gemm_shape s = {.lanes = r.bits / (8 * size)};
    if (s.lanes < 1)
        s.lanes = 1;
    /* Accumulators, the B vectors of a step and a broadcast A value fill
     * the registers, no more (a spill in the loop costs more than the tile
     * saves). */
    if (r.count >= 32) {
        s.mr = 14;
        s.nv = 2;
    } else {
        s.mr = 6;
        s.nv = 2;
    }
    s.nr = s.nv * s.lanes;
    return s;
}

/* -- IR helpers ----------------------------------------------------------------- */

static LLVMValueRef i64c(const gg *g, int64_t v)
{
    return LLVMConstInt(g->i64, (unsigned long long)v, 1);
}

/* Element index of p[at] for a pointer to the product's dtype. */
static LLVMValueRef element(const gg *g, LLVMValueRef p, LLVMValueRef at)
{
    return LLVMBuildGEP2(g->b, g->t, p, &at, 1, "");
}

static LLVMBasicBlockRef block(const gg *g, const char *name)
{
    return LLVMAppendBasicBlockInContext(g->ctx, g->fn, name);
}

static LLVMValueRef intrinsic(const gg *g, const char *name, LLVMTypeRef *types, unsigned n_types,
                              LLVMValueRef *args, unsigned n_args)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(g->m, id, types, n_types);
    return LLVMBuildCall2(g->b, LLVMIntrinsicGetType(g->ctx, id, types, n_types), f, args, n_args, "");
}

static LLVMValueRef min64(const gg *g, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, a, b, ""), a, b, "");
}

static LLVMValueRef splat(const gg *g, LLVMValueRef x)
{
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), (unsigned)g->s.lanes);
    LLVMValueRef one = LLVMBuildInsertElement(g->b, LLVMGetUndef(vt), x, LLVMConstInt(g->i32, 0, 0), "");
    LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(g->i32, (unsigned)g->s.lanes));
    return LLVMBuildShuffleVector(g->b, one, LLVMGetUndef(vt), zeros, "");
}

/* Lanes of vector v of a tile row inside its first n columns. */
static LLVMValueRef lanes_below(const gg *g, int v, LLVMValueRef n)
{
    LLVMValueRef iota[64];
    for (int l = 0; l < g->s.lanes; l++)
        iota[l] = LLVMConstInt(g->i64, (unsigned long long)(v * g->s.lanes + l), 0);
    LLVMValueRef lane = LLVMConstVector(iota, (unsigned)g->s.lanes);
    return LLVMBuildICmp(g->b, LLVMIntSLT, lane, splat(g, n), "");
}

static void masked_store(const gg *g, LLVMValueRef value, LLVMValueRef at, LLVMValueRef mask)
{
    LLVMTypeRef types[2] = {g->vt, g->ptr};
    LLVMValueRef args[4] = {value, at, LLVMConstInt(g->i32, (unsigned)g->size, 0), mask};
    intrinsic(g, "llvm.masked.store", types, 2, args, 4);
}

static LLVMValueRef load_vector(const gg *g, LLVMValueRef at)
{
    LLVMValueRef v = LLVMBuildLoad2(g->b, g->vt, at, "");
    LLVMSetAlignment(v, (unsigned)g->size);
    return v;
}

static void store_vector(const gg *g, LLVMValueRef v, LLVMValueRef at)
{
    LLVMSetAlignment(LLVMBuildStore(g->b, v, at), (unsigned)g->size);
}

/* -- Loops ---------------------------------------------------------------------- */

/* for (index = start; index < end; index += step): the body follows at the
 * builder; nothing runs when start >= end. */
typedef struct {
    LLVMBasicBlockRef body, exit;
    LLVMValueRef index;
} gloop;

static gloop loop_open(gg *g, LLVMValueRef start, LLVMValueRef end, const char *name)
{
    gloop l = {block(g, name), block(g, "after"), NULL};
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, start, end, ""), l.body, l.exit);
    LLVMPositionBuilderAtEnd(g->b, l.body);
    l.index = LLVMBuildPhi(g->b, g->i64, "");
    LLVMAddIncoming(l.index, &start, &pre, 1);
    return l;
}

static void loop_close(gg *g, gloop *l, LLVMValueRef step, LLVMValueRef end)
{
    LLVMValueRef next = LLVMBuildAdd(g->b, l->index, step, "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(l->index, &next, &latch, 1);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, next, end, ""), l->body, l->exit);
    LLVMPositionBuilderAtEnd(g->b, l->exit);
}

static LLVMValueRef add_function(gg *g, const char *symbol, const char *suffix, LLVMTypeRef *params, unsigned n,
                                 bool exported)
{
    char name[192];
    snprintf(name, sizeof name, "%s%s", symbol, suffix);
    LLVMTypeRef type = LLVMFunctionType(LLVMVoidTypeInContext(g->ctx), params, n, 0);
    g->fn = LLVMAddFunction(g->m, name, type);
    if (!exported)
        LLVMSetLinkage(g->fn, LLVMInternalLinkage);
    add_vector_width(g->ctx, g->fn, g->vector_bits);
    unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
    LLVMAddAttributeAtIndex(g->fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(g->ctx, nounwind, 0));
    LLVMPositionBuilderAtEnd(g->b, block(g, "entry"));
    return g->fn;
}

/* -- Packing -------------------------------------------------------------------- */

/* Panel p of `width` lines (rows of A, columns of B) of src: lines
 * [first, first + count) of the operand, each `steps` long along k, line j
 * element k at src[(first + j) * line + k * step]; written as steps of width
 * values, lines past count zero. Walks each line along k, where operands
 * are contiguous when they are transposed for the panel. */
static void pack_lines(gg *g, LLVMValueRef src, LLVMValueRef line, LLVMValueRef step, LLVMValueRef first,
                       LLVMValueRef count, LLVMValueRef steps, LLVMValueRef dst, int width)
{
    LLVMValueRef w = i64c(g, width), zero = i64c(g, 0), one = i64c(g, 1);
    gloop pad = loop_open(g, count, w, "pad"); /* lines past count: zeros */
    gloop pk = loop_open(g, zero, steps, "pad_k");
    LLVMValueRef at = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, pk.index, w, ""), pad.index, "");
    LLVMBuildStore(g->b, LLVMConstNull(g->t), element(g, dst, at));
    loop_close(g, &pk, one, steps);
    loop_close(g, &pad, one, w);
    gloop j = loop_open(g, zero, count, "line");
    LLVMValueRef base = LLVMBuildMul(g->b, LLVMBuildAdd(g->b, first, j.index, ""), line, "");
    gloop k = loop_open(g, zero, steps, "along_k");
    LLVMValueRef from = LLVMBuildAdd(g->b, base, LLVMBuildMul(g->b, k.index, step, ""), "");
    LLVMValueRef to = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k.index, w, ""), j.index, "");
    LLVMBuildStore(g->b, LLVMBuildLoad2(g->b, g->t, element(g, src, from), ""), element(g, dst, to));
    loop_close(g, &k, one, steps);
    loop_close(g, &j, one, count);
}

/* A full panel whose lines are contiguous across it (B row-major, A
 * transposed): each step copies width consecutive values, as vectors where
 * width is a multiple of the lanes. */
static void pack_across(gg *g, LLVMValueRef src, LLVMValueRef step, LLVMValueRef first, LLVMValueRef steps,
                        LLVMValueRef dst, int width)
{
    LLVMValueRef zero = i64c(g, 0), one = i64c(g, 1);
    gloop k = loop_open(g, zero, steps, "across");
    LLVMValueRef from = LLVMBuildAdd(g->b, first, LLVMBuildMul(g->b, k.index, step, ""), "");
    LLVMValueRef to = LLVMBuildMul(g->b, k.index, i64c(g, width), "");
    int v = 0;
    for (; (v + 1) * g->s.lanes <= width; v++) {
        LLVMValueRef off = i64c(g, v * g->s.lanes);
        store_vector(g, load_vector(g, element(g, src, LLVMBuildAdd(g->b, from, off, ""))),
                     element(g, dst, LLVMBuildAdd(g->b, to, off, "")));
    }
    for (int e = v * g->s.lanes; e < width; e++) {
        LLVMValueRef value = LLVMBuildLoad2(g->b, g->t, element(g, src, LLVMBuildAdd(g->b, from, i64c(g, e), "")), "");
        LLVMBuildStore(g->b, value, element(g, dst, LLVMBuildAdd(g->b, to, i64c(g, e), "")));
    }
    loop_close(g, &k, one, steps);
}

/* Lanes [0, half) (or [half, 2 half) when high) of a and b interleaved. */
static LLVMValueRef interleave(const gg *g, LLVMValueRef a, LLVMValueRef b, bool high)
{
    int lanes = g->s.lanes, half = lanes / 2;
    LLVMValueRef mask[64];
    for (int l = 0; l < lanes; l++)
        mask[l] = LLVMConstInt(g->i32, (unsigned)(l / 2 + (high ? half : 0) + (l % 2 ? lanes : 0)), 0);
    return LLVMBuildShuffleVector(g->b, a, b, LLVMConstVector(mask, (unsigned)lanes), "");
}

/* v[r] = lanes r of v transposed: log2(lanes) rounds of interleaving the
 * first half of the vectors with the second. */
static void transpose(const gg *g, LLVMValueRef *v)
{
    int lanes = g->s.lanes;
    for (int round = 1; round < lanes; round *= 2) {
        LLVMValueRef out[64];
        for (int i = 0; i < lanes / 2; i++) {
            out[2 * i] = interleave(g, v[i], v[i + lanes / 2], false);
            out[2 * i + 1] = interleave(g, v[i], v[i + lanes / 2], true);
        }
        memcpy(v, out, sizeof(LLVMValueRef) * (size_t)lanes);
    }
}

/* src[(first + j + r) * line + k]'s index, and dst[(k + kk) * width + j]'s. */
static LLVMValueRef line_at(const gg *g, LLVMValueRef first, LLVMValueRef j, int r, LLVMValueRef line, LLVMValueRef k)
{
    LLVMValueRef at = LLVMBuildAdd(g->b, LLVMBuildAdd(g->b, first, j, ""), i64c(g, r), "");
    return LLVMBuildAdd(g->b, LLVMBuildMul(g->b, at, line, ""), k, "");
}

static LLVMValueRef step_at(const gg *g, LLVMValueRef k, int kk, int width, LLVMValueRef j)
{
    LLVMValueRef step = LLVMBuildAdd(g->b, k, i64c(g, kk), "");
    return LLVMBuildAdd(g->b, LLVMBuildMul(g->b, step, i64c(g, width), ""), j, "");
}

/* Lines [j0, j0 + rows) of a block of lanes steps from k on, rows at most
 * lanes: loaded as vectors, transposed in registers, stored as lanes steps
 * of the panel. */
static void transpose_lines(gg *g, LLVMValueRef src, LLVMValueRef line, LLVMValueRef first, LLVMValueRef j0,
                            int rows, LLVMValueRef k, LLVMValueRef dst, int width)
{
    int lanes = g->s.lanes;
    LLVMValueRef v[64];
    for (int r = 0; r < lanes; r++)
        v[r] = r < rows ? load_vector(g, element(g, src, line_at(g, first, j0, r, line, k))) : LLVMGetUndef(g->vt);
    transpose(g, v);
    LLVMValueRef mask = lanes_below(g, 0, i64c(g, rows));
    for (int kk = 0; kk < lanes; kk++) {
        LLVMValueRef to = element(g, dst, step_at(g, k, kk, width, j0));
        if (rows == lanes)
            store_vector(g, v[kk], to);
        else
            masked_store(g, v[kk], to, mask);
    }
}

/* A full panel whose lines are contiguous along k (A row-major, B
 * transposed: attention's kᵀ, a backward pass's Wᵀ), where copying a value
 * at a time cost 10% of sgemm 2048^3 (A) and made train_gpt's products with
 * a transposed B a fifth of its step: blocks of lanes lines by lanes steps
 * are transposed in registers, the whole blocks of lines in a loop and the
 * last lines (fewer than lanes) apart, so that each pack function holds at
 * most two transposes (each costs LLVM milliseconds to compile). The steps
 * past the last whole block go a value at a time. */
static void pack_transposed(gg *g, LLVMValueRef src, LLVMValueRef line, LLVMValueRef first, LLVMValueRef steps,
                            LLVMValueRef dst, int width)
{
    int lanes = g->s.lanes, whole_lines = width / lanes * lanes;
    LLVMValueRef l = i64c(g, lanes), zero = i64c(g, 0), one = i64c(g, 1), w = i64c(g, width);
    LLVMValueRef whole = LLVMBuildMul(g->b, LLVMBuildSDiv(g->b, steps, l, ""), l, "");
    gloop k = loop_open(g, zero, whole, "block");
    if (whole_lines) {
        gloop j = loop_open(g, zero, i64c(g, whole_lines), "lines");
        transpose_lines(g, src, line, first, j.index, lanes, k.index, dst, width);
        loop_close(g, &j, l, i64c(g, whole_lines));
    }
    if (whole_lines < width)
        transpose_lines(g, src, line, first, i64c(g, whole_lines), width - whole_lines, k.index, dst, width);
    loop_close(g, &k, l, whole);
    gloop j = loop_open(g, zero, w, "rest_line");
    gloop rest = loop_open(g, whole, steps, "rest");
    LLVMValueRef from = element(g, src, line_at(g, first, j.index, 0, line, rest.index));
    LLVMBuildStore(g->b, LLVMBuildLoad2(g->b, g->t, from, ""), element(g, dst, step_at(g, rest.index, 0, width, j.index)));
    loop_close(g, &rest, one, steps);
    loop_close(g, &j, one, w);
}

/* pack(src, rs, cs, rows, cols, dst): panels of width lines. For A the lines
 * are rows (line stride rs, step cs, steps cols); for B columns. */
static void emit_pack(gg *g, const char *symbol, const char *suffix, bool lines_are_rows, int width)
{
    LLVMTypeRef params[6] = {g->ptr, g->i64, g->i64, g->i64, g->i64, g->ptr};
    add_function(g, symbol, suffix, params, 6, true);
    LLVMValueRef src = LLVMGetParam(g->fn, 0), rs = LLVMGetParam(g->fn, 1), cs = LLVMGetParam(g->fn, 2);
    LLVMValueRef rows = LLVMGetParam(g->fn, 3), cols = LLVMGetParam(g->fn, 4), dst = LLVMGetParam(g->fn, 5);
    LLVMValueRef line = lines_are_rows ? rs : cs, step = lines_are_rows ? cs : rs;
    LLVMValueRef lines = lines_are_rows ? rows : cols, steps = lines_are_rows ? cols : rows;
    LLVMValueRef w = i64c(g, width);
    gloop p = loop_open(g, i64c(g, 0), lines, "panel");
    LLVMValueRef count = min64(g, w, LLVMBuildSub(g->b, lines, p.index, ""));
    LLVMValueRef panel = element(g, dst, LLVMBuildMul(g->b, p.index, steps, ""));
    LLVMValueRef across = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, line, i64c(g, 1), ""),
                                       LLVMBuildICmp(g->b, LLVMIntEQ, count, w, ""), "");
    LLVMValueRef along = LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, step, i64c(g, 1), ""),
                                      LLVMBuildICmp(g->b, LLVMIntEQ, count, w, ""), "");
    LLVMBasicBlockRef fast = block(g, "fast"), other = block(g, "other"), next = block(g, "next");
    LLVMBuildCondBr(g->b, across, fast, other);
    LLVMPositionBuilderAtEnd(g->b, fast);
    pack_across(g, src, step, p.index, steps, panel, width);
    LLVMBuildBr(g->b, next);
    LLVMPositionBuilderAtEnd(g->b, other);
    if (g->s.lanes > 1) {
        LLVMBasicBlockRef transposed = block(g, "transposed"), slow = block(g, "slow");
        LLVMBuildCondBr(g->b, along, transposed, slow);
        LLVMPositionBuilderAtEnd(g->b, transposed);
        pack_transposed(g, src, line, p.index, steps, panel, width);
        LLVMBuildBr(g->b, next);
        LLVMPositionBuilderAtEnd(g->b, slow);
    }
    pack_lines(g, src, line, step, p.index, count, steps, panel, width);
    LLVMBuildBr(g->b, next);
    LLVMPositionBuilderAtEnd(g->b, next);
    loop_close(g, &p, w, lines);
    LLVMBuildRetVoid(g->b);
}

/* -- The micro-kernel ------------------------------------------------------------- */

enum { MAX_ACC = 64 };

/* The kernel's accumulators and the panels' positions, carried by phis. */
typedef struct {
    LLVMValueRef c[MAX_ACC];
    LLVMValueRef a, b;
} carried;

static int n_acc(const gg *g)
{
    return g->s.mr * g->s.nv;
}

static void phis(gg *g, carried *to, const carried *from, LLVMBasicBlockRef pred)
{
    for (int i = 0; i < n_acc(g); i++) {
        to->c[i] = LLVMBuildPhi(g->b, g->vt, "c");
        LLVMAddIncoming(to->c[i], (LLVMValueRef *)&from->c[i], &pred, 1);
    }
    to->a = LLVMBuildPhi(g->b, g->ptr, "ap");
    LLVMAddIncoming(to->a, (LLVMValueRef *)&from->a, &pred, 1);
    to->b = LLVMBuildPhi(g->b, g->ptr, "bp");
    LLVMAddIncoming(to->b, (LLVMValueRef *)&from->b, &pred, 1);
}

static void incoming(const gg *g, carried *phi, const carried *value, LLVMBasicBlockRef pred)
{
    for (int i = 0; i < n_acc(g); i++)
        LLVMAddIncoming(phi->c[i], (LLVMValueRef *)&value->c[i], &pred, 1);
    LLVMAddIncoming(phi->a, (LLVMValueRef *)&value->a, &pred, 1);
    LLVMAddIncoming(phi->b, (LLVMValueRef *)&value->b, &pred, 1);
}

/* The part of the tile a k loop multiplies: its first rows and vectors of
 * columns; the rest of the accumulators stay as they are. */
typedef struct {
    int rows, nv;
} span;

/* steps steps of the k loop on x over span used, the panels advancing
 * past them. */
static carried multiply(gg *g, carried x, int steps, span used)
{
    const gemm_shape *s = &g->s;
    for (int u = 0; u < steps; u++) {
        LLVMValueRef bv[16];
        for (int v = 0; v < used.nv; v++) {
            bv[v] = LLVMBuildLoad2(g->b, g->vt, element(g, x.b, i64c(g, u * s->nr + v * s->lanes)), "");
            LLVMSetAlignment(bv[v], (unsigned)(s->lanes * g->size)); /* panels are aligned */
        }
        for (int i = 0; i < used.rows; i++) {
            LLVMValueRef a = splat(g, LLVMBuildLoad2(g->b, g->t, element(g, x.a, i64c(g, u * s->mr + i)), ""));
            for (int v = 0; v < used.nv; v++) {
                LLVMValueRef args[3] = {a, bv[v], x.c[i * s->nv + v]};
                x.c[i * s->nv + v] = intrinsic(g, "llvm.fmuladd", &g->vt, 1, args, 3);
            }
        }
    }
    x.a = element(g, x.a, i64c(g, steps * s->mr));
    x.b = element(g, x.b, i64c(g, steps * s->nr));
    return x;
}

/* A loop of `trips` iterations of `steps` steps each on x over span used;
 * the values after. */
static carried k_loop(gg *g, carried x, LLVMValueRef trips, int steps, span used, const char *name)
{
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b), body = block(g, name), exit = block(g, "k_done");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, trips, i64c(g, 0), ""), body, exit);
    LLVMPositionBuilderAtEnd(g->b, body);
    LLVMValueRef it = LLVMBuildPhi(g->b, g->i64, "it"), zero = i64c(g, 0);
    LLVMAddIncoming(it, &zero, &pre, 1);
    carried in;
    phis(g, &in, &x, pre);
    carried out = multiply(g, in, steps, used);
    LLVMValueRef next = LLVMBuildAdd(g->b, it, i64c(g, 1), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMAddIncoming(it, &next, &latch, 1);
    incoming(g, &in, &out, latch);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, next, trips, ""), body, exit);
    LLVMPositionBuilderAtEnd(g->b, exit);
    carried after;
    phis(g, &after, &x, pre);
    incoming(g, &after, &out, latch);
    return after;
}

/* Element (i, vector v) of a tile at p with leading dimension ld. */
static LLVMValueRef tile_at(const gg *g, LLVMValueRef p, LLVMValueRef ld, int i, int v)
{
    LLVMValueRef at = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, i64c(g, i), ld, ""), i64c(g, v * g->s.lanes), "");
    return element(g, p, at);
}

static carried zeros(const gg *g, LLVMValueRef ap, LLVMValueRef bp)
{
    carried x = {.a = ap, .b = bp};
    for (int i = 0; i < n_acc(g); i++)
        x.c[i] = LLVMConstNull(g->vt);
    return x;
}

/* Adds the partial sums in acc when mode asks: at the end, so that their
 * loads are off the path of the first multiply-adds. */
static carried add_partial(gg *g, carried x, LLVMValueRef acc, LLVMValueRef ld, LLVMValueRef mode)
{
    LLVMBasicBlockRef before = LLVMGetInsertBlock(g->b), load = block(g, "load"), go = block(g, "sums");
    LLVMValueRef loads = LLVMBuildAnd(g->b, mode, i64c(g, GEMM_LOAD), "");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntNE, loads, i64c(g, 0), ""), load, go);
    LLVMPositionBuilderAtEnd(g->b, load);
    carried added = x;
    for (int i = 0; i < g->s.mr; i++)
        for (int v = 0; v < g->s.nv; v++) {
            int c = i * g->s.nv + v;
            added.c[c] = LLVMBuildFAdd(g->b, x.c[c], load_vector(g, tile_at(g, acc, ld, i, v)), "");
        }
    LLVMBuildBr(g->b, go);
    LLVMPositionBuilderAtEnd(g->b, go);
    carried sums;
    phis(g, &sums, &x, before);
    incoming(g, &sums, &added, load);
    return sums;
}

static void store_tile(gg *g, const carried *x, LLVMValueRef p, LLVMValueRef ld)
{
    for (int i = 0; i < g->s.mr; i++)
        for (int v = 0; v < g->s.nv; v++)
            store_vector(g, x->c[i * g->s.nv + v], tile_at(g, p, ld, i, v));
}

/* A tile's field: gemm_tile's i64s and pointers in their order. */
static LLVMValueRef tile_field(gg *g, LLVMValueRef tile, int index, LLVMTypeRef type)
{
    LLVMValueRef at = LLVMBuildGEP2(g->b, LLVMInt8TypeInContext(g->ctx), tile, (LLVMValueRef[]){i64c(g, 8 * index)}, 1, "");
    return LLVMBuildLoad2(g->b, type, at, "");
}

/* Both k loops (unrolled, then the rest) on x over span used. */
static carried k_loops(gg *g, carried x, LLVMValueRef kc, span used)
{
    x = k_loop(g, x, LLVMBuildSDiv(g->b, kc, i64c(g, UNROLL), ""), UNROLL, used, "k_unrolled");
    return k_loop(g, x, LLVMBuildSRem(g->b, kc, i64c(g, UNROLL), ""), 1, used, "k_rest");
}

/* i64 1 where a <= b, else 0. */
static LLVMValueRef at_most(const gg *g, LLVMValueRef a, int64_t b)
{
    return LLVMBuildZExt(g->b, LLVMBuildICmp(g->b, LLVMIntSLE, a, i64c(g, b), ""), g->i64, "");
}

/* The k loops over as much of the tile as holds the product: a tile of at
 * most GEMM_SHORT_ROWS rows or of one vector of columns (the last of a 14x14
 * image's 196 pixels: 4) runs loops over that span alone, where the whole
 * tile's multiply-adds would be 9% of a 64-channel convolution's wasted,
 * 7% of one at 14x14. The accumulators outside the span stay zero: they lie
 * outside the product and are never stored into it. Span i is narrow
 * (one vector) when bit 0 is set, short when bit 1 is. */
static carried k_spans(gg *g, carried x, LLVMValueRef kc, LLVMValueRef tile)
{
    const gemm_shape *s = &g->s;
    bool narrows = s->nv > 1, shortens = s->mr > GEMM_SHORT_ROWS;
    LLVMValueRef which = i64c(g, 0);
    if (narrows)
        which = at_most(g, tile_field(g, tile, 1, g->i64), s->lanes);
    if (shortens) {
        LLVMValueRef rows = at_most(g, tile_field(g, tile, 0, g->i64), GEMM_SHORT_ROWS);
        which = LLVMBuildOr(g->b, which, LLVMBuildShl(g->b, rows, i64c(g, 1), ""), "");
    }
    LLVMBasicBlockRef whole = block(g, "whole"), done = block(g, "spans_done");
    LLVMValueRef choice = LLVMBuildSwitch(g->b, which, whole, 3);
    carried out[3];
    LLVMBasicBlockRef from[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if ((i & 1 && !narrows) || (i & 2 && !shortens))
            continue;
        LLVMBasicBlockRef body = i ? block(g, "span") : whole;
        if (i)
            LLVMAddCase(choice, i64c(g, i), body);
        if (i == 1 && shortens)
            LLVMAddCase(choice, i64c(g, 3), body);
        LLVMPositionBuilderAtEnd(g->b, body);
        out[n] = k_loops(g, x, kc, (span){i & 2 ? GEMM_SHORT_ROWS : s->mr, i & 1 ? 1 : s->nv});
        from[n++] = LLVMGetInsertBlock(g->b);
        LLVMBuildBr(g->b, done);
    }
    LLVMPositionBuilderAtEnd(g->b, done);
    carried after;
    phis(g, &after, &out[0], from[0]);
    for (int i = 1; i < n; i++)
        incoming(g, &after, &out[i], from[i]);
    return after;
}

/* The final sums into the product, the rows and columns inside it only. */
static void store_final(gg *g, const carried *x, LLVMValueRef tile)
{
    LLVMValueRef m_rem = tile_field(g, tile, 0, g->i64), n_rem = tile_field(g, tile, 1, g->i64);
    LLVMValueRef out = tile_field(g, tile, 4, g->ptr), ld = tile_field(g, tile, 5, g->i64);
    LLVMBasicBlockRef done = block(g, "stored");
    LLVMValueRef masks[16];
    for (int v = 0; v < g->s.nv; v++)
        masks[v] = lanes_below(g, v, n_rem);
    for (int i = 0; i < g->s.mr; i++) {
        LLVMBasicBlockRef row = block(g, "row");
        if (i > 0)
            LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, m_rem, i64c(g, i), ""), row, done);
        else
            LLVMBuildBr(g->b, row);
        LLVMPositionBuilderAtEnd(g->b, row);
        for (int v = 0; v < g->s.nv; v++)
            masked_store(g, x->c[i * g->s.nv + v], tile_at(g, out, ld, i, v), masks[v]);
    }
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
}

/* The final sums through the epilogue: the tile goes to the stack, where the
 * epilogue function reads it. */
static void run_epilogue(gg *g, const carried *x, LLVMValueRef tile, LLVMValueRef epilogue, LLVMValueRef slot)
{
    store_tile(g, x, slot, i64c(g, g->s.nr));
    LLVMValueRef args[2] = {slot, tile};
    LLVMBuildCall2(g->b, LLVMGlobalGetValueType(epilogue), epilogue, args, 2, "");
}

/* Prefetches a tile at p (leading dimension ld) for writing, a vector at a
 * time: the k loop hides the misses its loads and stores would wait for. */
static void prefetch_tile(gg *g, LLVMValueRef p, LLVMValueRef ld)
{
    for (int i = 0; i < g->s.mr; i++)
        for (int v = 0; v < g->s.nv; v++) {
            LLVMValueRef args[4] = {tile_at(g, p, ld, i, v), LLVMConstInt(g->i32, 1, 0), LLVMConstInt(g->i32, 3, 0),
                                    LLVMConstInt(g->i32, 1, 0)};
            intrinsic(g, "llvm.prefetch", &g->ptr, 1, args, 4);
        }
}

/* The tile's partial sums when mode reads or writes them, else the
 * product's tile when the kernel stores it; and, where k steps run before
 * the final sums go to a fused kernel's epilogue, what the epilogue will
 * read and write (epilogue_prefetch, NULL for a plain product: with no
 * steps, as when gemm_finish_tiles calls, nothing would hide the misses). */
static void prefetch(gg *g, LLVMValueRef kc, LLVMValueRef acc, LLVMValueRef ld, LLVMValueRef mode, LLVMValueRef tile,
                     LLVMValueRef epilogue_prefetch, LLVMValueRef slot)
{
    LLVMBasicBlockRef sums = block(g, "prefetch_sums"), other = block(g, "prefetch_out"), go = block(g, "go");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntNE, mode, i64c(g, GEMM_FINAL), ""), sums, other);
    LLVMPositionBuilderAtEnd(g->b, sums);
    prefetch_tile(g, acc, ld);
    LLVMBuildBr(g->b, go);
    LLVMPositionBuilderAtEnd(g->b, other);
    if (!epilogue_prefetch)
        prefetch_tile(g, tile_field(g, tile, 4, g->ptr), tile_field(g, tile, 5, g->i64));
    LLVMBuildBr(g->b, go);
    LLVMPositionBuilderAtEnd(g->b, go);
    if (!epilogue_prefetch)
        return;
    LLVMBasicBlockRef final = block(g, "prefetch_epilogue"), on = block(g, "k_loop");
    LLVMValueRef finals = LLVMBuildAnd(g->b, mode, i64c(g, GEMM_FINAL), "");
    LLVMValueRef steps = LLVMBuildICmp(g->b, LLVMIntSGT, kc, i64c(g, 0), "");
    LLVMBuildCondBr(g->b, LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntNE, finals, i64c(g, 0), ""), steps, ""), final,
                    on);
    LLVMPositionBuilderAtEnd(g->b, final);
    LLVMValueRef args[2] = {slot, tile};
    LLVMBuildCall2(g->b, LLVMGlobalGetValueType(epilogue_prefetch), epilogue_prefetch, args, 2, "");
    LLVMBuildBr(g->b, on);
    LLVMPositionBuilderAtEnd(g->b, on);
}

static void emit_kernel(gg *g, const char *symbol, LLVMValueRef epilogue, LLVMValueRef epilogue_prefetch)
{
    LLVMTypeRef params[7] = {g->i64, g->ptr, g->ptr, g->ptr, g->i64, g->i64, g->ptr};
    add_function(g, symbol, GEMM_KERNEL, params, 7, true);
    for (unsigned p = 1; p <= 3; p++) {
        unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
        LLVMAddAttributeAtIndex(g->fn, 1 + p, LLVMCreateEnumAttribute(g->ctx, noalias, 0));
    }
    LLVMValueRef kc = LLVMGetParam(g->fn, 0), ap = LLVMGetParam(g->fn, 1), bp = LLVMGetParam(g->fn, 2);
    LLVMValueRef acc = LLVMGetParam(g->fn, 3), ld = LLVMGetParam(g->fn, 4), mode = LLVMGetParam(g->fn, 5);
    LLVMValueRef tile = LLVMGetParam(g->fn, 6);
    LLVMValueRef slot = NULL;
    if (epilogue) {
        slot = LLVMBuildArrayAlloca(g->b, g->t, i64c(g, (int64_t)g->s.mr * g->s.nr), "tile");
        LLVMSetAlignment(slot, 64);
    }
    prefetch(g, kc, acc, ld, mode, tile, epilogue_prefetch, slot);
    carried x = k_spans(g, zeros(g, ap, bp), kc, tile);
    x = add_partial(g, x, acc, ld, mode);
    LLVMBasicBlockRef final = block(g, "final"), partial = block(g, "partial"), done = block(g, "done");
    LLVMValueRef finals = LLVMBuildAnd(g->b, mode, i64c(g, GEMM_FINAL), "");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntNE, finals, i64c(g, 0), ""), final, partial);
    LLVMPositionBuilderAtEnd(g->b, partial);
    store_tile(g, &x, acc, ld);
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, final);
    if (epilogue)
        run_epilogue(g, &x, tile, epilogue, slot);
    else
        store_final(g, &x, tile);
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
    LLVMBuildRetVoid(g->b);
}

static void emit_geometry(gg *g, const char *symbol)
{
    char name[192];
    snprintf(name, sizeof name, "%s%s", symbol, GEMM_GEOMETRY);
    LLVMTypeRef type = LLVMArrayType2(g->i32, 4);
    LLVMValueRef values[4] = {LLVMConstInt(g->i32, (unsigned)g->s.mr, 0), LLVMConstInt(g->i32, (unsigned)g->s.nr, 0),
                              LLVMConstInt(g->i32, (unsigned)g->s.lanes, 0), LLVMConstInt(g->i32, (unsigned)g->size, 0)};
    LLVMValueRef global = LLVMAddGlobal(g->m, type, name);
    LLVMSetInitializer(global, LLVMConstArray2(g->i32, values, 4));
    LLVMSetGlobalConstant(global, 1);
}

/* Function symbol suffix of module, codegen_epilogue's; NULL with why in err. */
static LLVMValueRef epilogue_part(LLVMModuleRef module, const char *symbol, const char *suffix, char *err,
                                  size_t err_size)
{
    char name[192];
    snprintf(name, sizeof name, "%s%s", symbol, suffix);
    LLVMValueRef fn = LLVMGetNamedFunction(module, name);
    if (!fn)
        snprintf(err, err_size, "the product's epilogue %s is missing", name);
    return fn;
}

int gemm_codegen(LLVMModuleRef module, const char *symbol, kiln_dtype dt, gemm_shape s, bool epilogue, char *err,
                 size_t err_size)
{
    if (s.mr * s.nv > MAX_ACC || s.nv > 16 || s.lanes > 64) {
        snprintf(err, err_size, "a %d x %d register tile is too large", s.mr, s.nr);
        return -1;
    }
    LLVMValueRef epi = NULL, epi_prefetch = NULL;
    if (epilogue && (!(epi = epilogue_part(module, symbol, ".epilogue", err, err_size)) ||
                     !(epi_prefetch = epilogue_part(module, symbol, GEMM_EPILOGUE_PREFETCH, err, err_size))))
        return -1;
    LLVMContextRef ctx = LLVMGetModuleContext(module);
    gg g = {.ctx = ctx, .m = module, .b = LLVMCreateBuilderInContext(ctx), .s = s,
            .t = dt == KILN_F64 ? LLVMDoubleTypeInContext(ctx) : LLVMFloatTypeInContext(ctx),
            .i64 = LLVMInt64TypeInContext(ctx), .i32 = LLVMInt32TypeInContext(ctx),
            .ptr = LLVMPointerTypeInContext(ctx, 0), .size = dt == KILN_F64 ? 8 : 4};
    g.vt = LLVMVectorType(g.t, (unsigned)s.lanes);
    g.vector_bits = s.lanes * g.size * 8;
    emit_pack(&g, symbol, GEMM_PACK_A, true, s.mr);
    emit_pack(&g, symbol, GEMM_PACK_B, false, s.nr);
    emit_kernel(&g, symbol, epi, epi_prefetch);
    emit_geometry(&g, symbol);
    LLVMDisposeBuilder(g.b);
    return 0;
}
