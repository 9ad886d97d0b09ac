/* Matrix products in CUDA C: the eager matmul kernels, and the f32 product
 * with a traced graph's elementwise epilogue applied to its tiles.
 *
 * f32 is a register-blocked SGEMM without tensor cores. A block of 256
 * threads computes a 128 x 128 tile of C, each thread 8 x 8 of it in
 * registers, stepping along k 8 at a time through shared memory, where A is
 * stored transposed so that a thread reads its 8 rows of A, like its 8
 * columns of B, as two float4. Shared memory is double-buffered: a step's
 * global loads are in flight while the block multiplies the previous one.
 * Products are accumulated with fmaf (rounded once, as OpenBLAS's sgemm
 * kernels do), in f32. Operands are moved as float4 where their layout allows
 * it (contiguous along k or along the tile's other axis, from 16-byte
 * boundaries, sizes multiples of 4), else as coalesced scalars; each kernel
 * decides from its arguments. The common layouts are compiled with their
 * modes fixed, because a mode held in registers would exceed the 128 a
 * thread may use to keep two blocks on each multiprocessor.
 *
 * f64 and the integers use a plainer kernel: 64 x 64 tiles, 4 x 4 a thread,
 * single-buffered. Integer products and sums are done unsigned, so they wrap
 * as the CPU's do (signed overflow is undefined in CUDA C++).
 *
 * Every kernel loops grid-stride over the batch, the rows of tiles and the
 * columns of tiles, so any grid computes the whole product. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen_nvrtc/internal.h"

enum { SGEMM_TILE = 128, GEMM_TILE = 64, MATMUL_THREADS = 256 };

void nvrtc_matmul_tile(kiln_dtype dt, int *tile_m, int *tile_n, int *threads)
{
    *tile_m = *tile_n = dt == KILN_F32 ? SGEMM_TILE : GEMM_TILE;
    *threads = MATMUL_THREADS;
}

/* -- Device code ------------------------------------------------------------ */

/* What every matmul kernel uses: the batch's offsets and the staging of an
 * operand's tile into shared memory. */
static const char OPERANDS[] =
    "/* Matrix z's first elements in A and B: z decomposed row-major over the\n"
    " * batch shape, a broadcast axis having stride 0. */\n"
    "__device__ __forceinline__ void kiln_batch_offsets(const kg_matmul_args &a, long long z, long long *ao,\n"
    "                                                   long long *bo)\n"
    "{\n"
    "    long long oa = 0, ob = 0;\n"
    "    for (int d = a.batch_ndim - 1; d >= 0; d--) {\n"
    "        long long i = z % a.batch_shape[d];\n"
    "        z /= a.batch_shape[d];\n"
    "        oa += i * a.a_batch_strides[d];\n"
    "        ob += i * a.b_batch_strides[d];\n"
    "    }\n"
    "    *ao = oa;\n"
    "    *bo = ob;\n"
    "}\n"
    "\n"
    "/* How a thread moves its elements of an operand: one float4 along k, one\n"
    " * float4 along mn, or 4 scalars. */\n"
    "enum { KILN_VEC_K, KILN_VEC_MN, KILN_SCALAR };\n"
    "\n"
    "/* An operand's share of a block's tile. Element (mn, kk) of the tile, mn\n"
    " * its row of A (column of B) and kk its place along k, is staged in shared\n"
    " * memory at s[kk * (MN + 4) + mn]: A transposed, so that a thread reads its\n"
    " * rows of A, like its columns of B, as consecutive values; the 4 of padding\n"
    " * keep the transposing stores free of bank conflicts and rows 16-byte\n"
    " * aligned. Each thread moves 4 elements a step, scalars taken along the\n"
    " * operand's contiguous side so that a warp's loads coalesce. Past the\n"
    " * operand's edges it stages zeros. */\n"
    "template <typename T, int MN, int BK, int MODE> struct kiln_operand {\n"
    "    static_assert(MN * BK == 4 * KILN_THREADS, \"four elements a thread\");\n"
    "    const T *p;\n"
    "    long long step, kstep;\n"
    "    int mn, kk, dmn, dkk, mn_left;\n"
    "    T v[4];\n"
    "\n"
    "    /* The tile from mn0 of an operand of mn_size rows (of A; columns of\n"
    "     * B), element (mn, kk) at base[mn * s_mn + kk * s_k]. */\n"
    "    __device__ __forceinline__ void start(const T *base, long long mn0, long long mn_size, long long s_mn,\n"
    "                                          long long s_k)\n"
    "    {\n"
    "        int t = threadIdx.x;\n"
    "        if (MODE == KILN_VEC_K)\n"
    "            mn = t / (BK / 4), kk = t % (BK / 4) * 4, dmn = 0, dkk = 1;\n"
    "        else if (MODE == KILN_VEC_MN)\n"
    "            mn = t % (MN / 4) * 4, kk = t / (MN / 4), dmn = 1, dkk = 0;\n"
    "        else if (s_k == 1)\n"
    "            mn = t / BK, kk = t % BK, dmn = KILN_THREADS / BK, dkk = 0;\n"
    "        else\n"
    "            mn = t % MN, kk = t / MN, dmn = 0, dkk = KILN_THREADS / MN;\n"
    "        p = base + (mn0 + mn) * s_mn + kk * s_k;\n"
    "        step = dmn * s_mn + dkk * s_k;\n"
    "        kstep = MODE == KILN_VEC_K ? BK : BK * s_k;\n"
    "        mn_left = (int)min(mn_size - mn0, (long long)MN);\n"
    "    }\n"
    "\n"
    "    /* Loads the next step into v: k_left of its BK are inside the operand. */\n"
    "    __device__ __forceinline__ void fetch(int k_left)\n"
    "    {\n"
    "        if constexpr (MODE != KILN_SCALAR) {\n"
    "            float4 q = make_float4(0.f, 0.f, 0.f, 0.f);\n"
    "            if (mn < mn_left && kk < k_left)\n"
    "                q = __ldg((const float4 *)p);\n"
    "            v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;\n"
    "        } else {\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++)\n"
    "                v[j] = mn + j * dmn < mn_left && kk + j * dkk < k_left ? __ldg(p + j * step) : (T)0;\n"
    "        }\n"
    "        p += kstep;\n"
    "    }\n"
    "\n"
    "    /* Writes v into the staged tile s. */\n"
    "    __device__ __forceinline__ void stash(T *s) const\n"
    "    {\n"
    "        int at = kk * (MN + 4) + mn;\n"
    "        if constexpr (MODE == KILN_VEC_MN) {\n"
    "            *(float4 *)&s[at] = make_float4(v[0], v[1], v[2], v[3]);\n"
    "        } else {\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++)\n"
    "                s[at + j * (dkk * (MN + 4) + dmn)] = v[j];\n"
    "        }\n"
    "    }\n"
    "};\n";

/* f32: the 128 x 128 tiles, and their store to a contiguous product. */
static const char SGEMM[] =
    "enum { KILN_SBK = 8, KILN_SLD = KILN_SGEMM_TILE + 4 };\n"
    "\n"
    "/* Whether every matrix of an operand starts on a 16-byte boundary. */\n"
    "__device__ bool kiln_aligned(const kg_matmul_args &a, const float *base, const long long *batch_strides)\n"
    "{\n"
    "    bool aligned = ((unsigned long long)base & 15) == 0;\n"
    "    for (int d = 0; d < a.batch_ndim; d++)\n"
    "        aligned = aligned && (a.batch_shape[d] == 1 || batch_strides[d] % 4 == 0);\n"
    "    return aligned;\n"
    "}\n"
    "\n"
    "/* How an operand of mn_size x k, element (mn, kk) at mn * s_mn + kk * s_k,\n"
    " * is moved: float4 where a float4 never straddles its edges. */\n"
    "__device__ int kiln_mode(bool aligned, long long mn_size, long long k, long long s_mn, long long s_k)\n"
    "{\n"
    "    if (aligned && s_k == 1 && s_mn % 4 == 0 && k % 4 == 0)\n"
    "        return KILN_VEC_K;\n"
    "    if (aligned && s_mn == 1 && s_k % 4 == 0 && mn_size % 4 == 0)\n"
    "        return KILN_VEC_MN;\n"
    "    return KILN_SCALAR;\n"
    "}\n"
    "\n"
    "/* A warp computes 32 x 64 of the tile, a thread 8 x 8 of that: its i-th row\n"
    " * and j-th column are these. Spread so, a warp's reads of a staged k-row\n"
    " * are one run of 64 or 128 bytes (no bank conflicts), and its stores write\n"
    " * 128-byte runs of a row of C. */\n"
    "__device__ __forceinline__ int kiln_sgemm_row(int i)\n"
    "{\n"
    "    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;\n"
    "    return warp / 2 * 32 + lane / 8 * 4 + i / 4 * 16 + i % 4;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ int kiln_sgemm_col(int j)\n"
    "{\n"
    "    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;\n"
    "    return warp % 2 * 64 + lane % 8 * 4 + j / 4 * 32 + j % 4;\n"
    "}\n"
    "\n"
    "/* Declared once for all the kernel's modes: each template's own would add up. */\n"
    "__shared__ __align__(16) float kiln_as[2][KILN_SBK * KILN_SLD], kiln_bs[2][KILN_SBK * KILN_SLD];\n"
    "\n"
    "/* The product's tile from (m0, n0) of one matrix, each thread's 8 x 8 in acc.\n"
    " * Step s is staged in buffer s % 2. While the block multiplies it, each\n"
    " * thread holds step s + 1's loads in registers, then stages them into the\n"
    " * other buffer, which every thread finished reading before the barrier\n"
    " * that ended step s - 1. The barrier ending step s then makes them visible,\n"
    " * and keeps anyone from staging step s + 2 over buffer s % 2 while others\n"
    " * still read it. */\n"
    "template <int MA, int MB>\n"
    "__device__ __forceinline__ void kiln_sgemm_tile(const kg_matmul_args &a, const float *A, const float *B,\n"
    "                                                long long m0, long long n0, float (&acc)[8][8])\n"
    "{\n"
    "    kiln_operand<float, KILN_SGEMM_TILE, KILN_SBK, MA> ta;\n"
    "    kiln_operand<float, KILN_SGEMM_TILE, KILN_SBK, MB> tb;\n"
    "    ta.start(A, m0, a.m, a.a_row, a.a_col);\n"
    "    tb.start(B, n0, a.n, a.b_col, a.b_row);\n"
    "    int r0 = kiln_sgemm_row(0), c0 = kiln_sgemm_col(0);\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 8; i++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 8; j++)\n"
    "            acc[i][j] = 0.f;\n"
    "    long long steps = (a.k + KILN_SBK - 1) / KILN_SBK;\n"
    "    if (steps == 0)\n"
    "        return;\n"
    "    int k_left = (int)min(a.k, (long long)KILN_SBK);\n"
    "    ta.fetch(k_left);\n"
    "    tb.fetch(k_left);\n"
    "    ta.stash(kiln_as[0]);\n"
    "    tb.stash(kiln_bs[0]);\n"
    "    __syncthreads();\n"
    "    for (long long s = 0; s < steps; s++) {\n"
    "        const float *sa = kiln_as[s & 1], *sb = kiln_bs[s & 1];\n"
    "        bool more = s + 1 < steps;\n"
    "        if (more) {\n"
    "            k_left = (int)min(a.k - (s + 1) * KILN_SBK, (long long)KILN_SBK);\n"
    "            ta.fetch(k_left);\n"
    "            tb.fetch(k_left);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int kk = 0; kk < KILN_SBK; kk++) {\n"
    "            float4 a0 = *(const float4 *)&sa[kk * KILN_SLD + r0], a1 = *(const float4 *)&sa[kk * KILN_SLD + r0 + 16];\n"
    "            float4 b0 = *(const float4 *)&sb[kk * KILN_SLD + c0], b1 = *(const float4 *)&sb[kk * KILN_SLD + c0 + 32];\n"
    "            float x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};\n"
    "            float y[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 8; i++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 8; j++)\n"
    "                    acc[i][j] = fmaf(x[i], y[j], acc[i][j]);\n"
    "        }\n"
    "        if (more) {\n"
    "            ta.stash(kiln_as[(s + 1) & 1]);\n"
    "            tb.stash(kiln_bs[(s + 1) & 1]);\n"
    "        }\n"
    "        __syncthreads();\n"
    "    }\n"
    "}\n"
    "\n"
    "/* Every tile of every matrix, each handed to store(a, z, m0, n0, acc). */\n"
    "template <int MA, int MB, typename S>\n"
    "__device__ __forceinline__ void kiln_sgemm_tiles(const kg_matmul_args &a, const float *A, const float *B,\n"
    "                                                 const S &store)\n"
    "{\n"
    "    long long tiles_m = (a.m + KILN_SGEMM_TILE - 1) / KILN_SGEMM_TILE;\n"
    "    long long tiles_n = (a.n + KILN_SGEMM_TILE - 1) / KILN_SGEMM_TILE;\n"
    "    for (long long z = blockIdx.z; z < a.batch; z += gridDim.z)\n"
    "        for (long long tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)\n"
    "            for (long long tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {\n"
    "                long long ao, bo;\n"
    "                kiln_batch_offsets(a, z, &ao, &bo);\n"
    "                float acc[8][8];\n"
    "                kiln_sgemm_tile<MA, MB>(a, A + ao, B + bo, tm * KILN_SGEMM_TILE, tn * KILN_SGEMM_TILE, acc);\n"
    "                store(a, z, tm * KILN_SGEMM_TILE, tn * KILN_SGEMM_TILE, acc);\n"
    "            }\n"
    "}\n"
    "\n"
    "/* The whole product. A row-major with B row-major or transposed get float4\n"
    " * loads; other layouts scalars (each instance costs a second of NVRTC). */\n"
    "template <typename S>\n"
    "__device__ __forceinline__ void kiln_sgemm(const kg_matmul_args &a, const float *A, const float *B, const S &store)\n"
    "{\n"
    "    int ma = kiln_mode(kiln_aligned(a, A, a.a_batch_strides), a.m, a.k, a.a_row, a.a_col);\n"
    "    int mb = kiln_mode(kiln_aligned(a, B, a.b_batch_strides), a.n, a.k, a.b_col, a.b_row);\n"
    "    if (ma == KILN_VEC_K && mb == KILN_VEC_MN)\n"
    "        kiln_sgemm_tiles<KILN_VEC_K, KILN_VEC_MN>(a, A, B, store);\n"
    "    else if (ma == KILN_VEC_K && mb == KILN_VEC_K)\n"
    "        kiln_sgemm_tiles<KILN_VEC_K, KILN_VEC_K>(a, A, B, store);\n"
    "    else\n"
    "        kiln_sgemm_tiles<KILN_SCALAR, KILN_SCALAR>(a, A, B, store);\n"
    "}\n"
    "\n"
    "/* Stores a tile into the contiguous product out, float4 where rows allow. */\n"
    "struct kiln_sgemm_out {\n"
    "    float *out;\n"
    "    __device__ __forceinline__ void operator()(const kg_matmul_args &a, long long z, long long m0, long long n0,\n"
    "                                               const float (&acc)[8][8]) const\n"
    "    {\n"
    "        float *c = out + z * a.m * a.n;\n"
    "        bool vec = a.n % 4 == 0 && ((unsigned long long)c & 15) == 0;\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 8; i++) {\n"
    "            long long r = m0 + kiln_sgemm_row(i);\n"
    "            if (r >= a.m)\n"
    "                continue;\n"
    "#pragma unroll\n"
    "            for (int h = 0; h < 8; h += 4) {\n"
    "                long long col = n0 + kiln_sgemm_col(h);\n"
    "                if (vec && col < a.n) {\n"
    "                    *(float4 *)&c[r * a.n + col] = make_float4(acc[i][h], acc[i][h + 1], acc[i][h + 2], acc[i][h + 3]);\n"
    "                    continue;\n"
    "                }\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 4; j++)\n"
    "                    if (col + j < a.n)\n"
    "                        c[r * a.n + col + j] = acc[i][h + j];\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "};\n";

/* f64, i32, i64: T the dtype, U its accumulator (unsigned for integers). */
static const char GEMM[] =
    "enum { KILN_BK = 16, KILN_LD = KILN_GEMM_TILE + 4 };\n"
    "\n"
    "__device__ __forceinline__ double kiln_mad(double acc, double x, double y) { return fma(x, y, acc); }\n"
    "__device__ __forceinline__ unsigned kiln_mad(unsigned acc, int x, int y) { return acc + (unsigned)x * (unsigned)y; }\n"
    "__device__ __forceinline__ unsigned long long kiln_mad(unsigned long long acc, long long x, long long y)\n"
    "{\n"
    "    return acc + (unsigned long long)x * (unsigned long long)y;\n"
    "}\n"
    "\n"
    "/* The product's tile from (m0, n0) of one matrix: thread (ty, tx) of 16 x 16\n"
    " * has rows m0 + ty + 16 i and columns n0 + tx + 16 j, so a warp's reads of\n"
    " * a staged row are consecutive and its stores coalesce. */\n"
    "template <typename T, typename U>\n"
    "__device__ __forceinline__ void kiln_gemm_tile(const kg_matmul_args &a, const T *A, const T *B, long long m0,\n"
    "                                               long long n0, U (&acc)[4][4])\n"
    "{\n"
    "    __shared__ T as[KILN_BK * KILN_LD], bs[KILN_BK * KILN_LD];\n"
    "    kiln_operand<T, KILN_GEMM_TILE, KILN_BK, KILN_SCALAR> ta, tb;\n"
    "    ta.start(A, m0, a.m, a.a_row, a.a_col);\n"
    "    tb.start(B, n0, a.n, a.b_col, a.b_row);\n"
    "    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 4; j++)\n"
    "            acc[i][j] = 0;\n"
    "    for (long long k0 = 0; k0 < a.k; k0 += KILN_BK) {\n"
    "        int k_left = (int)min(a.k - k0, (long long)KILN_BK);\n"
    "        ta.fetch(k_left);\n"
    "        tb.fetch(k_left);\n"
    "        __syncthreads(); /* everyone is done reading the last step (or tile) */\n"
    "        ta.stash(as);\n"
    "        tb.stash(bs);\n"
    "        __syncthreads();\n"
    "#pragma unroll\n"
    "        for (int kk = 0; kk < KILN_BK; kk++)\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 4; j++)\n"
    "                    acc[i][j] = kiln_mad(acc[i][j], as[kk * KILN_LD + ty + 16 * i], bs[kk * KILN_LD + tx + 16 * j]);\n"
    "    }\n"
    "}\n"
    "\n"
    "template <typename T, typename U>\n"
    "__device__ __forceinline__ void kiln_gemm(const kg_matmul_args &a, T *out, const T *A, const T *B)\n"
    "{\n"
    "    long long tiles_m = (a.m + KILN_GEMM_TILE - 1) / KILN_GEMM_TILE;\n"
    "    long long tiles_n = (a.n + KILN_GEMM_TILE - 1) / KILN_GEMM_TILE;\n"
    "    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;\n"
    "    for (long long z = blockIdx.z; z < a.batch; z += gridDim.z)\n"
    "        for (long long tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)\n"
    "            for (long long tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {\n"
    "                long long ao, bo, m0 = tm * KILN_GEMM_TILE, n0 = tn * KILN_GEMM_TILE;\n"
    "                kiln_batch_offsets(a, z, &ao, &bo);\n"
    "                U acc[4][4];\n"
    "                kiln_gemm_tile<T, U>(a, A + ao, B + bo, m0, n0, acc);\n"
    "                T *c = out + z * a.m * a.n;\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < 4; j++)\n"
    "                        if (m0 + ty + 16 * i < a.m && n0 + tx + 16 * j < a.n)\n"
    "                            c[(m0 + ty + 16 * i) * a.n + n0 + tx + 16 * j] = (T)acc[i][j];\n"
    "            }\n"
    "}\n";

/* The prelude, kg_matmul_args as ir/kernel.h has it (NVRTC checks its size
 * against this C compiler's; NVRTC has no offsetof), the tile sizes and the
 * operands. */
static void preamble(strbuf *s)
{
    strbuf_put(s, "%s\n", NVRTC_PRELUDE);
    strbuf_put(s,
               "typedef struct {\n"
               "    long long batch, m, n, k;\n"
               "    long long batch_shape[%d];\n"
               "    long long a_batch_strides[%d], b_batch_strides[%d];\n"
               "    long long a_row, a_col, b_row, b_col;\n"
               "    int batch_ndim;\n"
               "    int unused;\n"
               "} kg_matmul_args;\n"
               "static_assert(sizeof(kg_matmul_args) == %zu, \"kg_matmul_args as in ir/kernel.h\");\n"
               "\n"
               "enum { KILN_SGEMM_TILE = %d, KILN_GEMM_TILE = %d, KILN_THREADS = %d };\n"
               "\n",
               KILN_MAX_DIMS, KILN_MAX_DIMS, KILN_MAX_DIMS, sizeof(kg_matmul_args), SGEMM_TILE, GEMM_TILE,
               MATMUL_THREADS);
    strbuf_put(s, "%s\n", OPERANDS);
}

/* The text of s, or NULL with err set when memory ran out. */
static char *finish(strbuf *s, char *err, size_t err_size)
{
    char *text = strbuf_finish(s);
    if (!text)
        snprintf(err, err_size, "out of memory");
    return text;
}

/* -- Eager kernels ---------------------------------------------------------- */

char *nvrtc_matmul_source(const kg_kernel *k, const char *name, char *err, size_t err_size)
{
    kiln_dtype dt = k->compute;
    if (dt != KILN_F32 && dt != KILN_F64 && dt != KILN_I32 && dt != KILN_I64) {
        snprintf(err, err_size, "no CUDA matmul of %s (f32, f64, i32 and i64; bool is computed as another dtype)",
                 ir_dtype_names[dt]);
        return NULL;
    }
    if (k->in[0] != dt || k->in[1] != dt || k->out != dt) {
        snprintf(err, err_size, "a CUDA matmul reads and writes its compute dtype %s", ir_dtype_names[dt]);
        return NULL;
    }
    const char *t = nvrtc_ctype(dt);
    strbuf s = {0};
    preamble(&s);
    strbuf_put(&s, "%s\n", dt == KILN_F32 ? SGEMM : GEMM);
    strbuf_put(&s,
               "extern \"C\" __global__ void __launch_bounds__(KILN_THREADS%s) %s(kg_matmul_args a, %s *__restrict__ "
               "out, const %s *__restrict__ A, const %s *__restrict__ B)\n{\n",
               dt == KILN_F32 ? ", 2" : "", name, t, t, t);
    if (dt == KILN_F32)
        strbuf_put(&s, "    kiln_sgemm(a, A, B, kiln_sgemm_out{out});\n}\n");
    else
        strbuf_put(&s, "    kiln_gemm<%s, %s>(a, out, A, B);\n}\n", t,
                   dt == KILN_F64 ? "double" : dt == KILN_I32 ? "unsigned" : "unsigned long long");
    return finish(&s, err, err_size);
}

/* -- Fused epilogues -------------------------------------------------------- */

/* Why epilogue k cannot compute its product buffer itself, or NULL when it
 * can. */
static const char *misfit(const kx_kernel *k)
{
    const char *misfits = kx_product_misfit(k);
    if (!misfits && k->views[kx_product_view(k)].dtype != KILN_F32)
        return "the product is not f32: only the f32 matmul takes an epilogue";
    if (!misfits && k->prologue)
        return "a prologue on the left operand is not in the CUDA backend";
    if (!misfits && k->attention)
        return "fused attention is not in the CUDA backend";
    return misfits;
}

bool nvrtc_supports(const kx_kernel *k, char *why, size_t why_size)
{
    const char *misfits = k->product < 0 ? NULL
                          : kx_symbolic(k) ? "its sizes are symbolic, and the product's kernel takes no symbols"
                                           : misfit(k);
    if (misfits)
        snprintf(why, why_size, "cannot fuse the epilogue into the matmul: %s", misfits);
    return !misfits;
}

/* The store functor kiln_sgemm hands each tile to: the epilogue at each
 * (row, col) of the thread's 8 x 8, loads of the product being acc's value. */
static void epilogue_functor(nvrtc_gen *g)
{
    const kx_kernel *k = g->k;
    strbuf_put(g->s, "struct kiln_epilogue {\n");
    for (int b = 0; b < k->n_buffers; b++)
        strbuf_put(g->s, "    %s *b%d;\n", nvrtc_ctype(k->buffer_dtypes[b]), b);
    strbuf_put(g->s,
               "    __device__ __forceinline__ void operator()(const kg_matmul_args &a, long long z, long long m0,\n"
               "                                               long long n0, const float (&acc)[8][8]) const\n"
               "    {\n"
               "#pragma unroll\n"
               "    for (int ii = 0; ii < 8; ii++) {\n"
               "        long long r = m0 + kiln_sgemm_row(ii);\n"
               "        if (r >= a.m)\n"
               "            continue;\n"
               "        long long row = z * a.m + r;\n");
    nvrtc_view_bases(g);
    strbuf_put(g->s, "#pragma unroll\n"
                     "        for (int jj = 0; jj < 8; jj++) {\n"
                     "        long long i = n0 + kiln_sgemm_col(jj);\n"
                     "        if (i >= a.n)\n"
                     "            continue;\n"
                     "        float product = acc[ii][jj];\n");
    bool *done = nvrtc_new_loop(g);
    for (int s = 0; done && s < k->n_stores; s++)
        nvrtc_store_value(g, &k->stores[s], done);
    free(done);
    strbuf_put(g->s, "        }\n"
                     "    }\n"
                     "    }\n"
                     "};\n\n");
}

char *nvrtc_matmul_epilogue_source(const kx_kernel *epilogue, const char *name, char *err, size_t err_size)
{
    if (!nvrtc_supports(epilogue, err, err_size))
        return NULL;
    strbuf s = {0};
    nvrtc_gen g = {.k = epilogue, .s = &s, .replaced = kx_product_view(epilogue),
                   .replacement = "product"};
    preamble(&s);
    strbuf_put(&s, "%s\n", SGEMM);
    epilogue_functor(&g);
    strbuf_put(&s,
               "extern \"C\" __global__ void __launch_bounds__(KILN_THREADS, 2) %s(kg_matmul_args a, const float "
               "*__restrict__ A, const float *__restrict__ B",
               name);
    for (int b = 0; b < epilogue->n_buffers; b++)
        strbuf_put(&s, ", %s *__restrict__ b%d", nvrtc_ctype(epilogue->buffer_dtypes[b]), b);
    strbuf_put(&s, ")\n{\n    kiln_sgemm(a, A, B, kiln_epilogue{");
    for (int b = 0; b < epilogue->n_buffers; b++)
        strbuf_put(&s, "%sb%d", b ? ", " : "", b);
    strbuf_put(&s, "});\n}\n");
    char *text = finish(&s, err, err_size);
    if (text && g.err[0]) {
        snprintf(err, err_size, "%s", g.err);
        free(text);
        return NULL;
    }
    return text;
}
