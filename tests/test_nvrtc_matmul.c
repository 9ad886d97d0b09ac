/* The tiled matmul kernels (src/codegen_nvrtc/matmul.c) on a machine without
 * a GPU: every dtype's kernel and hand-built fused epilogues compiled by
 * NVRTC for sm_90 and sm_80 (entry point, shared memory, vector loads,
 * registers), and the errors for epilogues that do not fit. Where a C++
 * compiler is found, the generated CUDA C also runs on the CPU through a
 * small CUDA shim, a block at a time with its threads taking turns between
 * barriers in several orders (a missing barrier then gives a wrong answer),
 * against a plain C reference of kg_matmul_args' layout. Exits 77
 * (skipped) where NVRTC is missing. */
#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "codegen_nvrtc/internal.h"
#include "ir/ir.h"
#include "test_common.h"

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
enum { N_DTYPES = sizeof DTYPES / sizeof *DTYPES };

static kg_kernel matmul_kernel(kiln_dtype dt)
{
    return (kg_kernel){KG_MATMUL, OP_MATMUL, 2, {dt, dt, KILN_F32}, dt, dt, dt};
}

/* -- What NVRTC made ---------------------------------------------------------- */

/* An object of nvrtc_compile_source: the CUBIN's length, the CUBIN, the PTX. */
static const unsigned char *object_cubin(const void *object, size_t *size)
{
    const unsigned char *p = object;
    uint64_t n = 0;
    for (int b = 0; b < 8; b++)
        n |= (uint64_t)p[b] << (8 * b);
    *size = (size_t)n;
    return p + 8;
}

static const char *object_ptx(const void *object)
{
    size_t cubin;
    return (const char *)object_cubin(object, &cubin) + cubin;
}

static uint64_t le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int b = 0; b < bytes; b++)
        v |= (uint64_t)p[b] << (8 * b);
    return v;
}

/* The registers and the largest stack frame (spills show there) ptxas gave
 * the CUBIN's code, from its .nv.info section: attributes of 4 bytes (format,
 * kind, a value or a payload size) where EIATTR_REGCOUNT (0x2f) and
 * EIATTR_FRAME_SIZE (0x11) carry {symbol, value}. */
static void cubin_resources(const unsigned char *elf, size_t size, int *regs, int *frame)
{
    *regs = *frame = -1;
    ck_assert_int_gt(size, 64);
    ck_assert(!memcmp(elf, "\x7f" "ELF", 4));
    uint64_t shoff = le(elf + 0x28, 8), entsize = le(elf + 0x3a, 2), n = le(elf + 0x3c, 2);
    const unsigned char *names = elf + le(elf + shoff + le(elf + 0x3e, 2) * entsize + 0x18, 8);
    for (uint64_t s = 0; s < n; s++) {
        const unsigned char *sh = elf + shoff + s * entsize;
        if (strcmp((const char *)names + le(sh, 4), ".nv.info"))
            continue;
        const unsigned char *at = elf + le(sh + 0x18, 8), *end = at + le(sh + 0x20, 8);
        while (at + 4 <= end) {
            int format = at[0], kind = at[1], value = (int)le(at + 2, 2);
            if (format == 4 && value == 8 && kind == 0x2f)
                *regs = (int)le(at + 8, 4);
            if (format == 4 && value == 8 && kind == 0x11 && (int)le(at + 8, 4) > *frame)
                *frame = (int)le(at + 8, 4);
            at += 4 + (format == 4 ? value : 0);
        }
    }
    ck_assert_msg(*regs > 0, "no register count in the CUBIN");
}

/* Compiles source for arch and checks its entry point; the object. */
static void *compile(const char *source, const char *name, const char *arch)
{
    void *object;
    size_t size;
    char err[8192];
    ck_assert_msg(nvrtc_compile_source(source, name, arch, &object, &size, err, sizeof err) == 0, "%s: %s", name, err);
    char entry[128];
    snprintf(entry, sizeof entry, ".entry %s(", name);
    ck_assert_msg(strstr(object_ptx(object), entry), "%s: no %s in the PTX", arch, entry);
    return object;
}

/* An f32 product kernel: staged through shared memory, read as float4, its
 * 8 x 8 accumulators in registers (no local arrays in the PTX) within the
 * 128 that keep two blocks of 256 threads on a multiprocessor. */
static void check_sgemm_object(const void *object, const char *arch)
{
    const char *ptx = object_ptx(object);
    ck_assert_msg(strstr(ptx, ".shared"), "%s: no shared memory", arch);
    ck_assert_msg(strstr(ptx, "ld.global.nc.v4.f32") || strstr(ptx, "ld.global.v4.f32"), "%s: no float4 loads", arch);
    ck_assert_msg(strstr(ptx, "ld.shared.v4.f32"), "%s: no float4 reads of the staged tiles", arch);
    ck_assert_msg(strstr(ptx, "fma.rn.f32"), "%s: no fused multiply-adds", arch);
    ck_assert_msg(!strstr(ptx, ".local"), "%s: the PTX keeps arrays in local memory", arch);
    size_t size;
    const unsigned char *cubin = object_cubin(object, &size);
    int regs, frame;
    cubin_resources(cubin, size, &regs, &frame);
    ck_assert_msg(regs <= 128, "%s: %d registers a thread", arch, regs);
    ck_assert_msg(frame <= 256, "%s: a stack frame of %d bytes (spills)", arch, frame);
}

START_TEST(test_tile_sizes)
{
    int m, n, threads;
    nvrtc_matmul_tile(KILN_F32, &m, &n, &threads);
    ck_assert_int_eq(m, 128);
    ck_assert_int_eq(n, 128);
    ck_assert_int_eq(threads, 256);
    for (int d = 1; d < N_DTYPES; d++) {
        nvrtc_matmul_tile(DTYPES[d], &m, &n, &threads);
        ck_assert_int_eq(m, 64);
        ck_assert_int_eq(n, 64);
        ck_assert_int_eq(threads, 256);
    }
}
END_TEST

START_TEST(test_every_dtype_compiles)
{
    const char *archs[] = {"sm_90", "sm_80"};
    for (int d = 0; d < N_DTYPES; d++) {
        kg_kernel k = matmul_kernel(DTYPES[d]);
        char err[512], name[64];
        snprintf(name, sizeof name, "kiln_matmul_%s", kiln_dtype_name(DTYPES[d]));
        char *source = nvrtc_matmul_source(&k, name, err, sizeof err);
        ck_assert_msg(source, "%s", err);
        ck_assert_ptr_nonnull(strstr(source, "} kg_matmul_args;"));
        for (int a = 0; a < 2; a++) {
            void *object = compile(source, name, archs[a]);
            const char *ptx = object_ptx(object);
            ck_assert_msg(strstr(ptx, ".shared"), "%s %s: no shared memory", name, archs[a]);
            if (DTYPES[d] == KILN_F32)
                check_sgemm_object(object, archs[a]);
            if (DTYPES[d] == KILN_F64)
                ck_assert_msg(strstr(ptx, "fma.rn.f64"), "%s: no fused multiply-adds", archs[a]);
            free(object);
        }
        free(source);
    }
}
END_TEST

START_TEST(test_dtypes_refused)
{
    char err[512];
    kg_kernel k = matmul_kernel(KILN_BOOL);
    ck_assert_ptr_null(nvrtc_matmul_source(&k, "m", err, sizeof err));
    ck_assert_msg(strstr(err, "bool") && strstr(err, "matmul"), "%s", err);
    k = matmul_kernel(KILN_F32);
    k.in[1] = KILN_F64;
    ck_assert_ptr_null(nvrtc_matmul_source(&k, "m", err, sizeof err));
    ck_assert_msg(strstr(err, "compute dtype f32"), "%s", err);
}
END_TEST

/* -- Epilogues by hand ------------------------------------------------------- */

/* A kernel of the kernel IR with room for a small epilogue. */
typedef struct {
    kx_kernel k;
    kx_expr exprs[48];
    kx_view views[8];
    kx_store stores[4];
    kx_reduction reductions[1];
} epilogue;

/* rows = the product of outer[0..n_outer), cols, and n_buffers buffers. */
static void epilogue_init(epilogue *e, int n_outer, const int64_t *outer, int64_t cols, int n_buffers)
{
    memset(e, 0, sizeof *e);
    e->k.n_outer = n_outer;
    e->k.rows = 1;
    for (int d = 0; d < n_outer; d++)
        e->k.rows *= e->k.outer[d] = outer[d];
    e->k.cols = cols;
    e->k.n_buffers = n_buffers;
    e->k.exprs = e->exprs;
    e->k.views = e->views;
    e->k.stores = e->stores;
    e->k.reductions = e->reductions;
    e->k.product = 0;
    for (int b = 0; b < n_buffers; b++)
        e->k.buffer_dtypes[b] = KILN_F32;
}

static int add_view(epilogue *e, int buffer, kiln_dtype dt, const int64_t *outer_strides, int64_t inner)
{
    kx_view *v = &e->views[e->k.n_views];
    v->buffer = buffer;
    v->dtype = dt;
    e->k.buffer_dtypes[buffer] = dt;
    memcpy(v->outer_strides, outer_strides, (size_t)e->k.n_outer * sizeof *outer_strides);
    v->inner_stride = inner;
    return e->k.n_views++;
}

static int add_expr(epilogue *e, kx_expr x)
{
    e->exprs[e->k.n_exprs] = x;
    return e->k.n_exprs++;
}

static int load(epilogue *e, int view)
{
    return add_expr(e, (kx_expr){.kind = KX_LOAD, .dtype = e->views[view].dtype, .view = view, .args = {-1, -1, -1}});
}

static int constant(epilogue *e, double v)
{
    return add_expr(e, (kx_expr){.kind = KX_CONST, .dtype = KILN_F32, .value = v, .args = {-1, -1, -1}});
}

static int op(epilogue *e, ir_op o, int a, int b)
{
    return add_expr(e, (kx_expr){.kind = KX_OP, .dtype = KILN_F32, .op = o, .args = {a, b, -1}});
}

static void store(epilogue *e, int view, int expr)
{
    e->stores[e->k.n_stores++] = (kx_store){.view = view, .expr = expr};
}

/* The product's contiguous view and a bias of one value a column, both over
 * rows = batch * m (outer dims batch, m) and n columns. Buffers: 0 the
 * product, 1 the bias, then outputs from 2. x = product + bias. */
static int bias_add(epilogue *e, int64_t batch, int64_t m, int64_t n, int n_outputs)
{
    epilogue_init(e, 2, (int64_t[]){batch, m}, n, 2 + n_outputs);
    int p = add_view(e, 0, KILN_F32, (int64_t[]){m * n, n}, 1);
    int b = add_view(e, 1, KILN_F32, (int64_t[]){0, 0}, 1);
    return op(e, OP_ADD, load(e, p), load(e, b));
}

/* relu(product + bias) into buffer 2. */
static void bias_relu(epilogue *e, int64_t batch, int64_t m, int64_t n)
{
    int x = bias_add(e, batch, m, n, 1);
    store(e, add_view(e, 2, KILN_F32, (int64_t[]){m * n, n}, 1), op(e, OP_RELU, x, -1));
}

/* kiln_gelu's tanh form of product + bias into buffer 2:
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
static void bias_gelu(epilogue *e, int64_t batch, int64_t m, int64_t n)
{
    int x = bias_add(e, batch, m, n, 1);
    int cube = op(e, OP_MUL, op(e, OP_MUL, x, x), x);
    int inner = op(e, OP_ADD, x, op(e, OP_MUL, constant(e, 0.044715), cube));
    int t = op(e, OP_TANH, op(e, OP_MUL, constant(e, 0.7978845608028654), inner), -1);
    int y = op(e, OP_MUL, op(e, OP_MUL, constant(e, 0.5), x), op(e, OP_ADD, constant(e, 1), t));
    store(e, add_view(e, 2, KILN_F32, (int64_t[]){m * n, n}, 1), y);
}

/* Two outputs: product + bias into buffer 2, and (product + bias) * product
 * transposed within each matrix ([batch, n, m]) into buffer 3. */
static void two_outputs(epilogue *e, int64_t batch, int64_t m, int64_t n)
{
    int x = bias_add(e, batch, m, n, 2);
    store(e, add_view(e, 2, KILN_F32, (int64_t[]){m * n, n}, 1), x);
    int y = op(e, OP_MUL, x, load(e, 0));
    store(e, add_view(e, 3, KILN_F32, (int64_t[]){m * n, 1}, m), y);
}

static void (*const EPILOGUES[])(epilogue *, int64_t, int64_t, int64_t) = {bias_relu, bias_gelu, two_outputs};
enum { N_EPILOGUES = sizeof EPILOGUES / sizeof *EPILOGUES };

START_TEST(test_epilogues_compile)
{
    for (int i = 0; i < N_EPILOGUES; i++) {
        epilogue e;
        EPILOGUES[i](&e, 3, 100, 96);
        char err[512], name[32];
        ck_assert_msg(nvrtc_supports(&e.k, err, sizeof err), "%s", err);
        snprintf(name, sizeof name, "kiln_epilogue_%d", i);
        char *source = nvrtc_matmul_epilogue_source(&e.k, name, err, sizeof err);
        ck_assert_msg(source, "%s", err);
        ck_assert_msg(!strstr(source, "b0["), "the product is read from memory:\n%s", source);
        const char *archs[] = {"sm_90", "sm_80"};
        for (int a = 0; a < (EPILOGUES[i] == bias_gelu ? 2 : 1); a++) {
            void *object = compile(source, name, archs[a]);
            check_sgemm_object(object, archs[a]);
            if (EPILOGUES[i] == bias_gelu)
                ck_assert(strstr(object_ptx(object), "tanh") || strstr(object_ptx(object), "ex2"));
            free(object);
        }
        free(source);
    }
}
END_TEST

static void check_misfit(epilogue *e, int product, const char *why)
{
    char err[512];
    e->k.product = product;
    ck_assert(!nvrtc_supports(&e->k, err, sizeof err));
    ck_assert_ptr_null(nvrtc_matmul_epilogue_source(&e->k, "k", err, sizeof err));
    ck_assert_msg(strstr(err, "cannot fuse the epilogue") && strstr(err, why), "\"%s\" lacks \"%s\"", err, why);
}

START_TEST(test_epilogue_misfits_named)
{
    epilogue e;
    bias_relu(&e, 3, 100, 96);
    e.reductions[0] = (kx_reduction){OP_SUM, 2, KILN_F32, KILN_F32, {0, 0}};
    e.k.n_reductions = 1;
    check_misfit(&e, 0, "reduces rows");

    bias_relu(&e, 3, 100, 96); /* the product read transposed: [batch, n, m] */
    e.views[0].outer_strides[1] = 1;
    e.views[0].inner_stride = 100;
    check_misfit(&e, 0, "transposed");

    bias_relu(&e, 3, 100, 96);
    e.views[0].offset = 4;
    check_misfit(&e, 0, "offset");

    bias_relu(&e, 3, 100, 96);
    e.views[0].dtype = e.exprs[0].dtype = KILN_F64;
    check_misfit(&e, 0, "not f32");

    bias_relu(&e, 3, 100, 96);
    add_view(&e, 0, KILN_F32, (int64_t[]){9600, 96}, 1);
    check_misfit(&e, 0, "more than one view");

    bias_relu(&e, 3, 100, 96);
    e.views[2].buffer = 0;
    check_misfit(&e, 0, "writes the product");

    bias_relu(&e, 3, 100, 96);
    e.k.n_stores = 0;
    check_misfit(&e, 0, "stores nothing");

    bias_relu(&e, 3, 100, 96);
    check_misfit(&e, 5, "not one of the epilogue's buffers");
}
END_TEST

/* -- A reference -------------------------------------------------------------- */

/* An element of the product: floats summed in double, with the sum of the
 * terms' magnitudes (for a tolerance); integers wrapped at their width. */
typedef struct {
    double value, size;
    int64_t exact;
} expected;

/* Element (r, c) of matrix z of the product as nvrtc.h defines it: z
 * decomposed row-major over batch_shape gives each operand's matrix through
 * its batch strides; within it, A(r, j) is at r * a_row + j * a_col and B(j, c)
 * at j * b_row + c * b_col. */
static expected reference(const kg_matmul_args *a, kiln_dtype dt, const void *A, const void *B, long long z,
                          long long r, long long c)
{
    long long ao = 0, bo = 0, rest = z;
    for (int d = a->batch_ndim - 1; d >= 0; d--) {
        ao += rest % a->batch_shape[d] * a->a_batch_strides[d];
        bo += rest % a->batch_shape[d] * a->b_batch_strides[d];
        rest /= a->batch_shape[d];
    }
    expected e = {0};
    uint64_t wrapped = 0;
    for (long long j = 0; j < a->k; j++) {
        long long ia = ao + r * a->a_row + j * a->a_col, ib = bo + j * a->b_row + c * a->b_col;
        switch (dt) {
        case KILN_F32: e.value += (double)((const float *)A)[ia] * ((const float *)B)[ib]; break;
        case KILN_F64: e.value += ((const double *)A)[ia] * ((const double *)B)[ib]; break;
        case KILN_I32: wrapped += (uint64_t)((const int32_t *)A)[ia] * (uint64_t)((const int32_t *)B)[ib]; break;
        default: wrapped += (uint64_t)((const int64_t *)A)[ia] * (uint64_t)((const int64_t *)B)[ib]; break;
        }
        e.size += fabs(dt == KILN_F32 ? (double)((const float *)A)[ia] * ((const float *)B)[ib]
                       : dt == KILN_F64 ? ((const double *)A)[ia] * ((const double *)B)[ib] : 0);
    }
    e.exact = dt == KILN_I32 ? (int32_t)(uint32_t)wrapped : (int64_t)wrapped;
    return e;
}

/* -- Running the CUDA C on the CPU -------------------------------------------- */

/* Enough of CUDA for the matmul kernels as C++: each CUDA thread a
 * coroutine (ucontext) with its own stack, __shared__ as static, and a block
 * run as phases from barrier to barrier, its threads taking turns in a
 * chosen order within each. */
static const char EMU_SHIM[] =
    "#include <algorithm>\n"
    "#include <cmath>\n"
    "#include <cstring>\n"
    "#include <math.h>\n"
    "#include <ucontext.h>\n"
    "#include <vector>\n"
    "#define __global__\n"
    "#define __device__\n"
    "#define __forceinline__ inline\n"
    "#define __shared__ static\n"
    "#define __align__(n) __attribute__((aligned(n)))\n"
    "#define __launch_bounds__(...)\n"
    "struct dim3 { unsigned x = 0, y = 0, z = 0; };\n"
    "struct alignas(16) float4 { float x, y, z, w; }; /* UBSan checks float4 accesses' alignment */\n"
    "static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }\n"
    "template <typename T> static inline T __ldg(const T *p) { return *p; }\n"
    "template <typename T> static inline T __shfl_down_sync(unsigned, T v, int) { return v; }\n"
    "static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }\n"
    "static inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }\n"
    "using std::max;\n"
    "using std::min;\n"
    "static dim3 threadIdx, blockIdx, blockDim, gridDim;\n"
    "static ucontext_t emu_block, *emu_threads;\n"
    "static int *emu_barriers;\n"
    "static char *emu_exited;\n"
    "static void (*emu_fn)(void *);\n"
    "static void *emu_arg;\n"
    "static void __syncthreads()\n"
    "{\n"
    "    emu_barriers[threadIdx.x]++;\n"
    "    swapcontext(&emu_threads[threadIdx.x], &emu_block);\n"
    "}\n"
    "static void emu_thread()\n"
    "{\n"
    "    emu_fn(emu_arg);\n"
    "    emu_exited[threadIdx.x] = 1;\n"
    "}\n"
    "/* Runs call on grid, a block at a time, its threads in order (0: forward,\n"
    " * 1: backward, else shuffled). false when its threads passed different\n"
    " * numbers of barriers. */\n"
    "template <typename F> static bool emu_launch(const unsigned *grid, int threads, int order, F call)\n"
    "{\n"
    "    enum { STACK = 1 << 17 };\n"
    "    std::vector<int> ord(threads), barriers(threads);\n"
    "    std::vector<char> exited(threads), stacks((size_t)threads * STACK);\n"
    "    std::vector<ucontext_t> contexts(threads);\n"
    "    for (int i = 0; i < threads; i++)\n"
    "        ord[i] = order == 1 ? threads - 1 - i : i;\n"
    "    unsigned long long r = (unsigned long long)order * 0x9E3779B97F4A7C15ull + 1;\n"
    "    for (int i = threads - 1; order > 1 && i > 0; i--) {\n"
    "        r = r * 6364136223846793005ull + 1442695040888963407ull;\n"
    "        std::swap(ord[i], ord[(int)((r >> 33) % (unsigned long long)(i + 1))]);\n"
    "    }\n"
    "    emu_threads = contexts.data(), emu_barriers = barriers.data(), emu_exited = exited.data();\n"
    "    emu_fn = [](void *f) { (*(F *)f)(); };\n"
    "    emu_arg = &call;\n"
    "    gridDim = {grid[0], grid[1], grid[2]};\n"
    "    blockDim = {(unsigned)threads, 1, 1};\n"
    "    bool same = true;\n"
    "    for (unsigned z = 0; z < grid[2]; z++)\n"
    "        for (unsigned y = 0; y < grid[1]; y++)\n"
    "            for (unsigned x = 0; x < grid[0]; x++) {\n"
    "                blockIdx = {x, y, z};\n"
    "                std::fill(barriers.begin(), barriers.end(), 0);\n"
    "                std::fill(exited.begin(), exited.end(), 0);\n"
    "                for (int t = 0; t < threads; t++) {\n"
    "                    getcontext(&contexts[t]);\n"
    "                    contexts[t].uc_stack.ss_sp = &stacks[(size_t)t * STACK];\n"
    "                    contexts[t].uc_stack.ss_size = STACK;\n"
    "                    contexts[t].uc_link = &emu_block;\n"
    "                    makecontext(&contexts[t], emu_thread, 0);\n"
    "                }\n"
    "                for (int running = threads; running > 0;) {\n"
    "                    running = 0;\n"
    "                    for (int i = 0; i < threads; i++) {\n"
    "                        int t = ord[i];\n"
    "                        if (exited[t])\n"
    "                            continue;\n"
    "                        threadIdx = {(unsigned)t, 0, 0};\n"
    "                        swapcontext(&emu_block, &contexts[t]);\n"
    "                        running += !exited[t];\n"
    "                    }\n"
    "                }\n"
    "                for (int t = 0; t < threads; t++)\n"
    "                    same = same && barriers[t] == barriers[0];\n"
    "            }\n"
    "    return same;\n"
    "}\n";

typedef int (*emu_run_fn)(const unsigned *grid, int order, const kg_matmul_args *a, void *const *p);

static char emu_dir[] = "/tmp/kiln-matmul-emu-XXXXXX";
static bool emu_usable;

/* Whether a C++17 compiler is here to build the emulations, in emu_dir. */
static bool emu_start(void)
{
    if (system("c++ -std=c++17 -x c++ -fsyntax-only /dev/null >/dev/null 2>&1") == 0 && mkdtemp(emu_dir))
        return true;
    printf("note: no C++17 compiler (c++): the kernels are compiled, not run\n");
    return false;
}

/* source (the kernel's CUDA C) built with the shim into a library whose
 * emu_run(grid, order, args, pointers) runs call, C++ in which p[i] are the
 * kernel's pointers. Its handle stays open until the test ends. */
static emu_run_fn emu_build(const char *source, const char *tag, const char *call)
{
    char cpp[256], so[256], cmd[1024];
    snprintf(cpp, sizeof cpp, "%s/%s.cpp", emu_dir, tag);
    snprintf(so, sizeof so, "%s/%s.so", emu_dir, tag);
    FILE *f = fopen(cpp, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n%s\nextern \"C\" int emu_run(const unsigned *grid, int order, const kg_matmul_args *a,\n"
               "                        void *const *p)\n{\n    return emu_launch(grid, KILN_THREADS, order, [&] { %s; });\n}\n",
            EMU_SHIM, source, call);
    fclose(f);
    /* Undefined behaviour (signed overflow above all) stops the run. */
    snprintf(cmd, sizeof cmd,
             "c++ -std=c++17 -O1 -w -shared -fPIC -fsanitize=undefined -fno-sanitize-recover=all -o %s %s",
             so, cpp);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib, "%s", dlerror());
    emu_run_fn run = (emu_run_fn)(uintptr_t)dlsym(lib, "emu_run");
    ck_assert_ptr_nonnull(run);
    return run;
}

/* Buffers ending where an unmapped page starts, so that reading past one
 * crashes the test. */
typedef struct {
    void *map, *data;
    size_t map_size;
} guarded;

static guarded guarded_new(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), used = (bytes + 15) / 16 * 16;
    size_t pages = (used + page - 1) / page;
    guarded g = {.map_size = (pages + 1) * page};
    g.map = mmap(NULL, g.map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(g.map != MAP_FAILED);
    ck_assert_int_eq(mprotect((char *)g.map + pages * page, page, PROT_NONE), 0);
    g.data = (char *)g.map + pages * page - used;
    return g;
}

static void guarded_free(guarded *g)
{
    munmap(g->map, g->map_size);
}

/* Floats of a few significant bits whose products are exact (sums round),
 * integers whose products and sums overflow. */
static void fill(void *p, kiln_dtype dt, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int64_t r = (int64_t)(seed >> 40) % 2001 - 1000;
        switch (dt) {
        case KILN_F32: ((float *)p)[i] = (float)r / 256.0f; break;
        case KILN_F64: ((double *)p)[i] = (double)r / 256.0; break;
        case KILN_I32: ((int32_t *)p)[i] = (int32_t)(r * 3000000); break;
        default: ((int64_t *)p)[i] = r * 4000000000000000LL; break;
        }
    }
}

static double value_at(const void *p, kiln_dtype dt, size_t i)
{
    switch (dt) {
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F64: return ((const double *)p)[i];
    case KILN_I32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
    }
}

/* One product to run: sizes, batch, layouts. */
typedef struct {
    const char *what;
    long long m, n, k;
    int batch_ndim;
    long long batch_shape[2];
    bool a_t, b_t;          /* operand stored transposed ([k, m] for A, [n, k] for B) */
    long long a_gap, b_gap; /* extra elements after each row as stored (a leading dimension > width) */
    bool a_broadcast;       /* A's first batch axis broadcast (stride 0) */
    int a_shift;            /* A starts this many elements into its buffer (misaligned) */
    unsigned grid_cap;      /* launch at most this many blocks along x and y (0: all) */
} product_case;

/* For f32, which of the kernel's paths each case takes is in brackets. */
static const product_case CASES[] = {
    {"row-major [float4 both]", 130, 136, 64, 0, {0}, false, false, 0, 0, false, 0, 0},
    {"row-major, k % 8 == 4 [float4 both]", 64, 68, 20, 0, {0}, false, false, 0, 0, false, 0, 0},
    {"k % 4 != 0 [scalar]", 77, 136, 37, 0, {0}, false, false, 0, 0, false, 0, 0},
    {"B transposed [float4 along k both]", 70, 260, 44, 0, {0}, false, true, 0, 0, false, 0, 0},
    {"A transposed [scalar]", 140, 30, 20, 0, {0}, true, false, 0, 0, false, 0, 0},
    {"both transposed, odd sizes [scalar]", 33, 65, 19, 0, {0}, true, true, 0, 0, false, 0, 0},
    {"padded rows [float4 both]", 40, 44, 24, 0, {0}, false, false, 4, 8, false, 0, 0},
    {"odd padding [scalar]", 40, 44, 24, 0, {0}, false, false, 3, 1, false, 0, 0},
    {"A misaligned [scalar]", 36, 40, 16, 0, {0}, false, false, 0, 0, false, 1, 0},
    {"batches broadcast [float4 both]", 20, 24, 12, 2, {2, 3}, false, false, 0, 0, true, 0, 0},
    {"transposed batches [scalar]", 9, 10, 11, 1, {3}, true, true, 0, 0, false, 0, 0},
    {"k = 0", 5, 6, 0, 0, {0}, false, false, 0, 0, false, 0, 0},
    {"1 x 1 x 1 [scalar]", 1, 1, 1, 0, {0}, false, false, 0, 0, false, 0, 0},
    {"tiles sharing a block [float4 both]", 200, 152, 40, 1, {2}, false, false, 0, 0, false, 0, 1},
    {"tiles sharing a block [scalar]", 150, 131, 9, 1, {2}, false, true, 0, 0, false, 0, 1},
};
enum { N_CASES = sizeof CASES / sizeof *CASES };

/* A case's arguments and operands (filled from seed). */
typedef struct {
    kg_matmul_args a;
    guarded A, B;
    void *a_data, *b_data;
} product;

static product product_new(const product_case *c, kiln_dtype dt, uint64_t seed)
{
    product p = {.a = {.m = c->m, .n = c->n, .k = c->k, .batch = 1, .batch_ndim = c->batch_ndim}};
    kg_matmul_args *a = &p.a;
    long long a_ld = (c->a_t ? c->m : c->k) + c->a_gap, b_ld = (c->b_t ? c->k : c->n) + c->b_gap;
    long long a_matrix = (c->a_t ? c->k : c->m) * a_ld, b_matrix = (c->b_t ? c->n : c->k) * b_ld;
    a->a_row = c->a_t ? 1 : a_ld;
    a->a_col = c->a_t ? a_ld : 1;
    a->b_row = c->b_t ? 1 : b_ld;
    a->b_col = c->b_t ? b_ld : 1;
    long long a_count = 1, b_count = 1;
    for (int d = c->batch_ndim - 1; d >= 0; d--) {
        a->batch_shape[d] = c->batch_shape[d];
        a->batch *= c->batch_shape[d];
        bool broadcast = d == 0 && c->a_broadcast;
        a->a_batch_strides[d] = broadcast ? 0 : a_count * a_matrix;
        a->b_batch_strides[d] = b_count * b_matrix;
        a_count *= broadcast ? 1 : c->batch_shape[d];
        b_count *= c->batch_shape[d];
    }
    size_t size = kiln_dtype_size(dt), a_n = (size_t)(a_count * a_matrix) + (size_t)c->a_shift;
    size_t b_n = (size_t)(b_count * b_matrix);
    p.A = guarded_new((a_n ? a_n : 1) * size);
    p.B = guarded_new((b_n ? b_n : 1) * size);
    fill(p.A.data, dt, a_n, seed);
    fill(p.B.data, dt, b_n, seed + 1);
    p.a_data = (char *)p.A.data + (size_t)c->a_shift * size;
    p.b_data = p.B.data;
    return p;
}

static void product_free(product *p)
{
    guarded_free(&p->A);
    guarded_free(&p->B);
}

/* The launch of nvrtc.h, capped along x and y by cap when not 0. */
static void grid_of(const kg_matmul_args *a, kiln_dtype dt, unsigned cap, unsigned grid[3])
{
    int tm, tn, threads;
    nvrtc_matmul_tile(dt, &tm, &tn, &threads);
    grid[0] = (unsigned)((a->n + tn - 1) / tn);
    grid[1] = (unsigned)((a->m + tm - 1) / tm);
    grid[2] = (unsigned)(a->batch < 65535 ? a->batch : 65535);
    for (int d = 0; cap && d < 2; d++)
        grid[d] = grid[d] < cap ? grid[d] : cap;
}

/* Whether element i of out is the reference's: within f32's or f64's
 * rounding of sums of a few dozen terms, or exactly for integers. */
static bool matches(const void *out, kiln_dtype dt, size_t i, expected want)
{
    switch (dt) {
    case KILN_F32: return fabs(((const float *)out)[i] - want.value) <= 1e-5 * want.size;
    case KILN_F64: return fabs(((const double *)out)[i] - want.value) <= 1e-14 * want.size;
    case KILN_I32: return ((const int32_t *)out)[i] == want.exact;
    default: return ((const int64_t *)out)[i] == want.exact;
    }
}

static void run_case(emu_run_fn run, const product_case *c, kiln_dtype dt, int order)
{
    product p = product_new(c, dt, 17 + (uint64_t)order);
    size_t count = (size_t)(p.a.batch * p.a.m * p.a.n), size = kiln_dtype_size(dt);
    guarded out = guarded_new(count * size);
    memset(out.data, 0x7f, count * size); /* k = 0 must write zeros over this */
    unsigned grid[3];
    grid_of(&p.a, dt, c->grid_cap, grid);
    void *pointers[3] = {out.data, p.a_data, p.b_data};
    ck_assert_msg(run(grid, order, &p.a, pointers), "%s: threads passed different numbers of barriers", c->what);
    for (long long z = 0; z < p.a.batch; z++)
        for (long long r = 0; r < p.a.m; r++)
            for (long long col = 0; col < p.a.n; col++) {
                expected want = reference(&p.a, dt, p.a_data, p.b_data, z, r, col);
                size_t i = (size_t)((z * p.a.m + r) * p.a.n + col);
                ck_assert_msg(matches(out.data, dt, i, want), "%s, %s, order %d: [%lld, %lld, %lld] is %.17g, not %.17g",
                              c->what, kiln_dtype_name(dt), order, z, r, col, value_at(out.data, dt, i),
                              dt == KILN_F32 || dt == KILN_F64 ? want.value : (double)want.exact);
            }
    guarded_free(&out);
    product_free(&p);
}

START_TEST(test_products_run_on_the_cpu)
{
    if (!emu_usable)
        return;
    kiln_dtype dt = DTYPES[_i];
    kg_kernel k = matmul_kernel(dt);
    char err[512];
    char *source = nvrtc_matmul_source(&k, "kiln_mm", err, sizeof err);
    ck_assert_msg(source, "%s", err);
    const char *t = nvrtc_ctype(dt);
    char call[256];
    snprintf(call, sizeof call, "kiln_mm(*a, (%s *)p[0], (const %s *)p[1], (const %s *)p[2])", t, t, t);
    emu_run_fn run = emu_build(source, kiln_dtype_name(dt), call);
    free(source);
    for (int c = 0; c < N_CASES; c++)
        for (int order = 0; order < 3; order++)
            run_case(run, &CASES[c], dt, order == 2 ? 7 : order);
}
END_TEST

/* The epilogues of test_epilogues_compile on products of [3, 100, 96], B
 * row-major or transposed, against the reference and the same expressions in
 * double. */
START_TEST(test_epilogues_run_on_the_cpu)
{
    if (!emu_usable)
        return;
    long long batch = 3, m = 100, n = 96;
    for (int i = 0; i < N_EPILOGUES; i++) {
        product_case c = {"epilogue", m, n, 40, 1, {batch}, false, i % 2 == 1, 0, 0, false, 0, 0};
        epilogue e;
        EPILOGUES[i](&e, batch, m, n);
        char err[512], tag[32], call[512];
        char *source = nvrtc_matmul_epilogue_source(&e.k, "kiln_fused", err, sizeof err);
        ck_assert_msg(source, "%s", err);
        int used = snprintf(call, sizeof call, "kiln_fused(*a, (const float *)p[0], (const float *)p[1]");
        for (int b = 0; b < e.k.n_buffers; b++)
            used += snprintf(call + used, sizeof call - (size_t)used, ", (%s *)p[%d]",
                             nvrtc_ctype(e.k.buffer_dtypes[b]), b + 2);
        snprintf(call + used, sizeof call - (size_t)used, ")");
        snprintf(tag, sizeof tag, "epilogue%d", i);
        emu_run_fn run = emu_build(source, tag, call);
        free(source);

        product p = product_new(&c, KILN_F32, 5);
        float bias[96], *out = malloc(sizeof(float) * (size_t)(2 * batch * m * n));
        fill(bias, KILN_F32, (size_t)n, 99);
        void *pointers[6] = {p.a_data, p.b_data, NULL, bias, out, out + batch * m * n};
        unsigned grid[3];
        grid_of(&p.a, KILN_F32, 0, grid);
        ck_assert(run(grid, 0, &p.a, pointers));
        for (long long z = 0; z < batch; z++)
            for (long long r = 0; r < m; r++)
                for (long long col = 0; col < n; col++) {
                    expected prod = reference(&p.a, KILN_F32, p.a_data, p.b_data, z, r, col);
                    double x = prod.value + bias[col];
                    double gelu = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
                    double want[2] = {EPILOGUES[i] == bias_relu ? (x > 0 ? x : 0) : EPILOGUES[i] == bias_gelu ? gelu : x,
                                      x * prod.value};
                    double got[2] = {out[(z * m + r) * n + col], out[batch * m * n + (z * n + col) * m + r]};
                    double tolerance = 1e-5 * (1 + fabs(want[1]) + prod.size * (1 + fabs(x)));
                    for (int o = 0; o < (EPILOGUES[i] == two_outputs ? 2 : 1); o++)
                        ck_assert_msg(fabs(got[o] - want[o]) <= tolerance, "epilogue %d output %d [%lld, %lld, %lld]: "
                                      "%.9g, not %.9g", i, o, z, r, col, got[o], want[o]);
                }
        free(out);
        product_free(&p);
    }
}
END_TEST

static Suite *matmul_suite(void)
{
    Suite *s = suite_create("nvrtc_matmul");
    TCase *tc = tcase_create("nvrtc_matmul");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_tile_sizes);
    tcase_add_test(tc, test_every_dtype_compiles);
    tcase_add_test(tc, test_dtypes_refused);
    tcase_add_test(tc, test_epilogues_compile);
    tcase_add_test(tc, test_epilogue_misfits_named);
    tcase_add_loop_test(tc, test_products_run_on_the_cpu, 0, N_DTYPES);
    tcase_add_test(tc, test_epilogues_run_on_the_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    char err[512];
    if (!nvrtc_toolchain(err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    emu_usable = emu_start();
    int failed = test_run_suite(matmul_suite());
    if (emu_usable) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", emu_dir);
        if (system(cmd) != 0)
            failed++;
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
