/* Shape-generic CUDA kernels for the eager ops along an axis and by
 * indices: cumsum (a block per line, warp-shuffle scans chunk by chunk),
 * top-k (a block per line, a bitonic sort of the line's indices in
 * scratch memory) and gather / scatter_add (a thread per index element,
 * out-of-range indices clamped and flagged). The ABI is in ir/kernel.h;
 * src/eager computes the same on the CPU. */
#include <stdio.h>
#include <stdlib.h>

#include "codegen_nvrtc/internal.h"

/* -- cumsum ------------------------------------------------------------------ */

/* Integer sums wrap: they run unsigned. */
static const char *scan_type(kiln_dtype acc)
{
    return acc == KILN_I64 ? "unsigned long long" : "double";
}

static void scan(strbuf *s, const kg_kernel *k, const char *name)
{
    const char *acc = scan_type(k->acc);
    strbuf_put(s,
               "struct kg_reduce_args { long long outer, n, inner; };\n"
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_reduce_args args, %s *__restrict__ out, "
               "const %s *__restrict__ in0)\n{\n"
               "    __shared__ %s warp_sums[%d];\n"
               "    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;\n"
               "    for (long long line = blockIdx.x; line < args.outer * args.inner; line += gridDim.x) {\n"
               "        long long base = line / args.inner * args.n * args.inner + line %% args.inner;\n"
               "        %s carry = 0;\n"
               "        for (long long start = 0; start < args.n; start += blockDim.x) {\n"
               "            long long r = start + threadIdx.x;\n"
               "            %s v = 0;\n"
               "            if (r < args.n) {\n"
               "                %s x = ",
               KG_BLOCK, name, nvrtc_ctype(k->out), nvrtc_ctype(k->in[0]), acc, KG_BLOCK / 32, acc, acc,
               nvrtc_ctype(k->compute));
    nvrtc_convert(s, "in0[base + r * args.inner]", k->in[0], k->compute);
    strbuf_put(s, ";\n                v = (%s)x;\n", acc);
    strbuf_put(s,
               "            }\n"
               "            for (int d = 1; d < 32; d *= 2) {\n"
               "                %s o = __shfl_up_sync(0xffffffffu, v, d);\n"
               "                if (lane >= d) v += o;\n"
               "            }\n"
               "            if (lane == 31) warp_sums[warp] = v;\n"
               "            __syncthreads();\n"
               "            %s before = carry, total = carry;\n"
               "            for (int w = 0; w < warps; w++) {\n"
               "                if (w < warp) before += warp_sums[w];\n"
               "                total += warp_sums[w];\n"
               "            }\n"
               "            if (r < args.n) out[base + r * args.inner] = ",
               acc, acc);
    char sum[64];
    snprintf(sum, sizeof sum, "(%s)(v + before)", nvrtc_ctype(k->acc));
    nvrtc_convert(s, sum, k->acc, k->out);
    strbuf_put(s, ";\n"
                  "            __syncthreads(); /* warp_sums is read before the next chunk writes it */\n"
                  "            carry = total;\n"
                  "        }\n"
                  "    }\n"
                  "}\n");
}

/* -- top-k ------------------------------------------------------------------- */

/* kiln_precedes(x, stride, i, j, largest): element i of the line comes
 * before element j in the result: by value with NaN above every number
 * (largest first, or smallest), ties to the lower index; the padding (-1)
 * after everything. */
static void precedes(strbuf *s, const kg_kernel *k)
{
    const char *t = nvrtc_ctype(k->compute);
    strbuf_put(s,
               "static __device__ bool kiln_precedes(const %s *x, long long stride, long long i, long long j, "
               "int largest)\n{\n"
               "    if (i < 0) return false;\n"
               "    if (j < 0) return true;\n"
               "    %s a = x[i * stride], b = x[j * stride];\n"
               "    int order = (a != a || b != b) ? (int)(a != a) - (int)(b != b) : (a > b) - (a < b);\n"
               "    if (order != 0) return largest ? order > 0 : order < 0;\n"
               "    return i < j;\n"
               "}\n\n",
               t, t);
}

static void topk(strbuf *s, const kg_kernel *k, const char *name)
{
    strbuf_put(s,
               "struct kg_topk_args { long long outer, n, inner, k, padded; int largest; int unused; };\n"
               "static_assert(sizeof(kg_topk_args) == %zu, \"kg_topk_args as ir/kernel.h has it\");\n",
               sizeof(kg_topk_args));
    precedes(s, k);
    strbuf_put(s,
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_topk_args args, long long *__restrict__ "
               "out, const %s *__restrict__ in0, long long *__restrict__ scratch)\n{\n"
               "    for (long long line = blockIdx.x; line < args.outer * args.inner; line += gridDim.x) {\n"
               "        long long o = line / args.inner, j0 = line %% args.inner;\n"
               "        const %s *x = in0 + o * args.n * args.inner + j0;\n"
               "        long long *idx = scratch + line * args.padded;\n"
               "        for (long long p = threadIdx.x; p < args.padded; p += blockDim.x)\n"
               "            idx[p] = p < args.n ? p : -1;\n"
               "        __syncthreads();\n"
               "        for (long long size = 2; size <= args.padded; size *= 2) {\n"
               "            for (long long half = size / 2; half > 0; half /= 2) {\n"
               "                for (long long p = threadIdx.x; p < args.padded; p += blockDim.x) {\n"
               "                    long long q = p ^ half;\n"
               "                    if (q <= p) continue;\n"
               "                    long long a = idx[p], b = idx[q];\n"
               "                    bool swap = (p & size) == 0 ? kiln_precedes(x, args.inner, b, a, args.largest)\n"
               "                                                : kiln_precedes(x, args.inner, a, b, args.largest);\n"
               "                    if (swap) { idx[p] = b; idx[q] = a; }\n"
               "                }\n"
               "                __syncthreads();\n"
               "            }\n"
               "        }\n"
               "        for (long long p = threadIdx.x; p < args.k; p += blockDim.x)\n"
               "            out[(o * args.k + p) * args.inner + j0] = idx[p];\n"
               "        __syncthreads(); /* idx is read before the next line of this block writes it */\n"
               "    }\n"
               "}\n",
               KG_BLOCK, name, nvrtc_ctype(k->in[0]), nvrtc_ctype(k->in[0]));
}

/* -- gather, scatter_add --------------------------------------------------------- */

static void declare_index_args(strbuf *s)
{
    strbuf_put(s,
               "struct kg_index_args {\n"
               "    long long numel, axis_size;\n"
               "    long long shape[%d], data_strides[%d], index_strides[%d], src_strides[%d];\n"
               "    int ndim, axis;\n"
               "};\n"
               "static_assert(sizeof(kg_index_args) == %zu, \"kg_index_args as ir/kernel.h has it\");\n\n",
               KILN_MAX_DIMS, KILN_MAX_DIMS, KILN_MAX_DIMS, KILN_MAX_DIMS, sizeof(kg_index_args));
}

/* The body's start: element i's offsets into the data (off the axis), the
 * index and src, and the index value v, in range (else flagged: ok false). */
static void index_prologue(strbuf *s, kiln_dtype index_dt, const char *index_name)
{
    strbuf_put(s,
               "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < args.numel;\n"
               "         i += (long long)gridDim.x * blockDim.x) {\n"
               "        long long rest = i, data = 0, at = 0, from = 0;\n"
               "        for (int d = args.ndim - 1; d >= 0; d--) {\n"
               "            long long c = rest %% args.shape[d];\n"
               "            rest /= args.shape[d];\n"
               "            if (d != args.axis) data += c * args.data_strides[d];\n"
               "            at += c * args.index_strides[d];\n"
               "            from += c * args.src_strides[d];\n"
               "        }\n"
               "        (void)from;\n"
               "        long long given = (long long)%s[at], v = given < 0 ? given + args.axis_size : given;\n"
               "        bool ok = v >= 0 && v < args.axis_size;\n"
               "        if (!ok && atomicCAS((unsigned long long *)bad, 0ull, 1ull) == 0ull) bad[1] = given;\n",
               index_name);
    (void)index_dt;
}

static void gather(strbuf *s, const kg_kernel *k, const char *name)
{
    const char *t = nvrtc_ctype(k->out);
    strbuf_put(s,
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_index_args args, %s *__restrict__ out, "
               "const %s *__restrict__ in0, const %s *__restrict__ in1, long long *__restrict__ bad)\n{\n",
               KG_BLOCK, name, t, t, nvrtc_ctype(k->in[1]));
    index_prologue(s, k->in[1], "in1");
    strbuf_put(s, "        out[i] = ok ? in0[data + v * args.data_strides[args.axis]] : (%s)0;\n"
                  "    }\n"
                  "}\n",
               t);
}

static void scatter_add(strbuf *s, const kg_kernel *k, const char *name)
{
    const char *t = nvrtc_ctype(k->out);
    strbuf_put(s,
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_index_args args, %s *__restrict__ out, "
               "const %s *__restrict__ in0, const %s *__restrict__ in1, long long *__restrict__ bad)\n{\n",
               KG_BLOCK, name, t, nvrtc_ctype(k->in[0]), t);
    index_prologue(s, k->in[0], "in0");
    strbuf_put(s, "        if (!ok) continue;\n"
                  "        %s *to = &out[data + v * args.data_strides[args.axis]];\n",
               t);
    if (k->out == KILN_I64) /* two's complement: the unsigned sum is the wrapping one */
        strbuf_put(s, "        atomicAdd((unsigned long long *)to, (unsigned long long)in1[from]);\n");
    else
        strbuf_put(s, "        atomicAdd(to, in1[from]);\n");
    strbuf_put(s, "    }\n"
                  "}\n");
}

/* -- uniform ------------------------------------------------------------------- */

/* src/eager/philox.c's generator, a thread per block of 4 words. */
static void uniform(strbuf *s, const char *name)
{
    strbuf_put(s,
               "struct kg_random_args { long long numel; unsigned long long seed, offset; };\n"
               "static_assert(sizeof(kg_random_args) == %zu, \"kg_random_args as ir/kernel.h has it\");\n"
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_random_args args, float *__restrict__ out)\n"
               "{\n"
               "    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; 4 * b < args.numel;\n"
               "         b += (long long)gridDim.x * blockDim.x) {\n"
               "        unsigned long long counter = args.offset / 4 + (unsigned long long)b;\n"
               "        unsigned c[4] = {(unsigned)counter, (unsigned)(counter >> 32), 0u, 0u};\n"
               "        unsigned k0 = (unsigned)args.seed, k1 = (unsigned)(args.seed >> 32);\n"
               "        for (int round = 0; round < 10; round++) {\n"
               "            unsigned hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];\n"
               "            unsigned hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];\n"
               "            unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;\n"
               "            c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;\n"
               "            k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;\n"
               "        }\n"
               "        for (int k = 0; k < 4 && 4 * b + k < args.numel; k++)\n"
               "            out[4 * b + k] = (float)(c[k] >> 8) * 5.9604644775390625e-8f;\n"
               "    }\n"
               "}\n",
               sizeof(kg_random_args), KG_BLOCK, name);
}

char *nvrtc_lines_source(const kg_kernel *k, const char *name, char *err, size_t err_size)
{
    strbuf s = {0};
    strbuf_put(&s, "%s\n", NVRTC_PRELUDE);
    if (k->kind == KG_RANDOM)
        uniform(&s, name);
    else if (k->kind == KG_SCAN)
        scan(&s, k, name);
    else if (k->kind == KG_TOPK)
        topk(&s, k, name);
    else if (k->op == OP_GATHER)
        declare_index_args(&s), gather(&s, k, name);
    else
        declare_index_args(&s), scatter_add(&s, k, name);
    char *text = strbuf_finish(&s);
    if (!text)
        snprintf(err, err_size, "out of memory");
    return text;
}
