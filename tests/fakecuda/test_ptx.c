/* The stand-in driver's PTX interpreter on hand-written kernels: the
 * instructions kiln's kernels use rarely or not yet (carry chains, bit
 * fields, directed rounding, saturating conversions, every shuffle mode,
 * votes, atomics, calls, local and dynamic shared memory), and the errors it
 * must report: accesses outside memory, misaligned ones, shuffles with lanes
 * missing, and instructions it does not know. */
#include "../test_common.h"
#include "ptx.h"

#define HEADER ".version 8.0\n.target sm_90\n.address_size 64\n"

/* Runs entry k of ptx over grid x block threads with out (n_out bytes) as
 * its one parameter; the driver's status, with its message in err. */
static int run_kernel(const char *ptx, unsigned grid, unsigned block, unsigned dynamic_shared, void *out,
                      size_t n_out, char *err, size_t err_size)
{
    char parse_err[512];
    ptx_module *m = ptx_parse(ptx, parse_err, sizeof parse_err);
    ck_assert_msg(m != NULL, "%s", parse_err);
    const ptx_kernel *k = ptx_kernel_find(m, "k");
    ck_assert_ptr_nonnull(k);
    void *params[] = {&out};
    ptx_range memory = {(uintptr_t)out, (uintptr_t)out + n_out};
    ptx_launch launch = {.grid = {grid, 1, 1}, .block = {block, 1, 1}, .dynamic_shared_bytes = dynamic_shared,
                         .params = params, .device_memory = &memory, .n_device_memory = 1};
    int status = ptx_run(m, k, &launch, err, err_size);
    ptx_free(m);
    return status;
}

static void run_ok(const char *ptx, unsigned grid, unsigned block, unsigned dynamic_shared, void *out, size_t n_out)
{
    char err[512] = "";
    ck_assert_msg(run_kernel(ptx, grid, block, dynamic_shared, out, n_out, err, sizeof err) == 0, "%s", err);
}

static uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

START_TEST(test_integer_instructions)
{
    static const char ptx[] = HEADER
        ".visible .entry k(.param .u64 out)\n"
        "{\n"
        "  .reg .b32 %r<32>;\n"
        "  .reg .b64 %rd<4>;\n"
        "  ld.param.u64 %rd1, [out];\n"
        "  cvta.to.global.u64 %rd1, %rd1;\n"
        "  mov.b32 %r1, 0xF0F01234;\n"
        "  bfe.u32 %r2, %r1, 4, 8;\n"
        "  bfe.s32 %r3, %r1, 24, 8;\n"
        "  bfi.b32 %r4, 0xAB, %r1, 8, 8;\n"
        "  prmt.b32 %r5, %r1, 0x55667788, 0x7210;\n"
        "  shf.l.wrap.b32 %r6, %r1, 0x80000001, 4;\n"
        "  shf.r.clamp.b32 %r7, %r1, 0x80000001, 40;\n"
        "  lop3.b32 %r8, %r1, 0xFF00FF00, 0x0F0F0F0F, 0xE8;\n"
        "  popc.b32 %r9, %r1;\n"
        "  clz.b32 %r10, 0x00010000;\n"
        "  brev.b32 %r11, 1;\n"
        "  dp4a.u32.u32 %r12, 0x01020304, 0x01010101, 10;\n"
        "  mul.hi.s32 %r13, -2, 0x40000000;\n"
        "  shr.s32 %r14, %r1, 40;\n"
        "  cnot.b32 %r15, 0;\n"
        "  min.u32 %r16, -1, 5;\n"
        "  max.s32 %r17, -1, 5;\n"
        "  rem.s32 %r18, -7, 2;\n"
        "  add.cc.u32 %r19, -1, 1;\n"
        "  addc.u32 %r20, 0, 0;\n"
        "  sub.cc.u32 %r21, 0, 1;\n"
        "  subc.u32 %r22, 5, 0;\n"
        "  mad.lo.cc.u32 %r23, 0x10000, 0x10000, 7;\n"
        "  madc.hi.u32 %r24, 0x10000, 0x10000, 0;\n"
        "  slct.b32.s32 %r25, 1, 2, -3;\n"
        "  div.u32 %r26, 7, 0;\n"
        "  st.global.v4.u32 [%rd1], {%r2, %r3, %r4, %r5};\n"
        "  st.global.v4.u32 [%rd1+16], {%r6, %r7, %r8, %r9};\n"
        "  st.global.v4.u32 [%rd1+32], {%r10, %r11, %r12, %r13};\n"
        "  st.global.v4.u32 [%rd1+48], {%r14, %r15, %r16, %r17};\n"
        "  st.global.v4.u32 [%rd1+64], {%r18, %r19, %r20, %r21};\n"
        "  st.global.v4.u32 [%rd1+80], {%r22, %r23, %r24, %r25};\n"
        "  st.global.u32 [%rd1+96], %r26;\n"
        "  ret;\n"
        "}\n";
    uint32_t out[25] = {0};
    run_ok(ptx, 1, 1, 0, out, sizeof out);
    uint32_t a = 0xF0F01234, b = 0xFF00FF00, c = 0x0F0F0F0F;
    uint32_t want[] = {0x23, 0xFFFFFFF0, 0xF0F0AB34, 0x55F01234, 0x1F, 0x80000001, (a & b) | (a & c) | (b & c), 13,
                       15, 0x80000000, 20, 0xFFFFFFFF, 0xFFFFFFFF, 1, 5, 5, 0xFFFFFFFF, 0, 1, 0xFFFFFFFF, 4, 7, 1,
                       2, 0xFFFFFFFF};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ck_assert_msg(out[i] == want[i], "result %zu: %#x, not %#x", i, out[i], want[i]);
}
END_TEST

START_TEST(test_float_rounding_and_conversions)
{
    static const char ptx[] = HEADER
        ".visible .entry k(.param .u64 out)\n"
        "{\n"
        "  .reg .b32 %r<24>;\n"
        "  .reg .f32 %f<24>;\n"
        "  .reg .f64 %fd<4>;\n"
        "  .reg .b64 %rd<8>;\n"
        "  .reg .pred %p<4>;\n"
        "  ld.param.u64 %rd1, [out];\n"
        "  cvta.to.global.u64 %rd1, %rd1;\n"
        "  cvt.rzi.s32.f32 %r1, 0f501502F9;\n"
        "  cvt.rzi.s32.f32 %r2, 0f7FC00000;\n"
        "  cvt.rni.s32.f32 %r3, 0f40200000;\n"
        "  mov.f64 %fd1, 0d3FF0000000400000;\n"
        "  cvt.rn.f32.f64 %f4, %fd1;\n"
        "  cvt.rp.f32.f64 %f5, %fd1;\n"
        "  add.rm.f32 %f6, 0f3F800000, 0f30800000;\n"
        "  add.rp.f32 %f7, 0f3F800000, 0f30800000;\n"
        "  fma.rn.f32 %f8, 0f3F800400, 0f3F800400, 0fBF800000;\n"
        "  add.ftz.f32 %f9, 0f00000001, 0f00000000;\n"
        "  setp.ltu.f32 %p1, 0f7FC00000, 0f3F800000;\n"
        "  selp.u32 %r10, 1, 0, %p1;\n"
        "  setp.lt.or.f32 %p2|%p3, 0f7FC00000, 0f3F800000, %p1;\n"
        "  selp.u32 %r11, 1, 0, %p3;\n"
        "  testp.subnormal.f32 %p1, 0f00000001;\n"
        "  selp.u32 %r12, 1, 0, %p1;\n"
        "  copysign.f32 %f13, 0fBF800000, 0f40000000;\n"
        "  min.f32 %f14, 0f7FC00000, 0f40400000;\n"
        "  ex2.approx.ftz.f32 %f15, 0f40400000;\n"
        "  cvt.sat.f32.f32 %f16, 0f40000000;\n"
        "  cvt.rzi.u32.f32 %r17, 0fC0A00000;\n"
        "  cvt.rn.f32.u64 %f18, -1;\n"
        "  mov.b32 %r4, %f4;\n"
        "  mov.b32 %r5, %f5;\n"
        "  st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};\n"
        "  st.global.u32 [%rd1+16], %r5;\n"
        "  st.global.v4.f32 [%rd1+32], {%f6, %f7, %f8, %f9};\n"
        "  st.global.v4.u32 [%rd1+48], {%r10, %r11, %r12, %r17};\n"
        "  st.global.v4.f32 [%rd1+64], {%f13, %f14, %f15, %f16};\n"
        "  st.global.f32 [%rd1+80], %f18;\n"
        "  ret;\n"
        "}\n";
    uint32_t out[24] = {0};
    run_ok(ptx, 1, 1, 0, out, sizeof out);
    float f[24];
    memcpy(f, out, sizeof f);
    ck_assert_int_eq(out[0], INT32_MAX);
    ck_assert_int_eq(out[1], 0);
    ck_assert_int_eq(out[2], 2); /* ties to even */
    ck_assert_uint_eq(out[3], bits32(1.0f));
    ck_assert_uint_eq(out[4], bits32(nextafterf(1.0f, 2.0f)));
    ck_assert_uint_eq(bits32(f[8]), bits32(1.0f));
    ck_assert_uint_eq(bits32(f[9]), bits32(nextafterf(1.0f, 2.0f)));
    ck_assert_float_eq(f[10], ldexpf(1.0f, -12) + ldexpf(1.0f, -26)); /* one rounding, not two */
    ck_assert_uint_eq(out[11], 0);                                    /* flushed */
    ck_assert_uint_eq(out[12], 1);
    ck_assert_uint_eq(out[13], 1); /* q = !(NaN < 1) or %p1 */
    ck_assert_uint_eq(out[14], 1);
    ck_assert_uint_eq(out[15], 0); /* -5 saturates to 0 */
    ck_assert_float_eq(f[16], -2.0f);
    ck_assert_float_eq(f[17], 3.0f);
    ck_assert_float_eq(f[18], 8.0f);
    ck_assert_float_eq(f[19], 1.0f);
    ck_assert_float_eq(f[20], 18446744073709551616.0f);
}
END_TEST

START_TEST(test_warp_instructions)
{
    static const char ptx[] = HEADER
        ".visible .entry k(.param .u64 out)\n"
        "{\n"
        "  .reg .b32 %r<16>;\n"
        "  .reg .b64 %rd<4>;\n"
        "  .reg .pred %p<4>;\n"
        "  ld.param.u64 %rd1, [out];\n"
        "  mov.u32 %r1, %tid.x;\n"
        "  mul.wide.u32 %rd2, %r1, 32;\n"
        "  add.s64 %rd1, %rd1, %rd2;\n"
        "  mul.lo.s32 %r2, %r1, 10;\n"
        "  shfl.sync.down.b32 %r3|%p1, %r2, 1, 31, -1;\n"
        "  shfl.sync.up.b32 %r4, %r2, 1, 0, -1;\n"
        "  shfl.sync.bfly.b32 %r5, %r2, 3, 31, -1;\n"
        "  shfl.sync.idx.b32 %r6, %r2, 5, 31, -1;\n"
        "  and.b32 %r7, %r1, 1;\n"
        "  setp.eq.s32 %p2, %r7, 1;\n"
        "  vote.sync.ballot.b32 %r8, %p2, -1;\n"
        "  vote.sync.any.pred %p3, %p2, -1;\n"
        "  selp.u32 %r9, 1, 0, %p1;\n"
        "  selp.u32 %r10, 1, 0, %p3;\n"
        "  activemask.b32 %r11;\n"
        "  st.v4.u32 [%rd1], {%r3, %r4, %r5, %r6};\n"
        "  st.v4.u32 [%rd1+16], {%r8, %r9, %r10, %r11};\n"
        "  ret;\n"
        "}\n";
    uint32_t out[64 * 8] = {0};
    run_ok(ptx, 1, 64, 0, out, sizeof out);
    for (unsigned t = 0; t < 64; t++) {
        unsigned lane = t % 32, base = t - lane;
        const uint32_t *o = out + t * 8;
        ck_assert_uint_eq(o[0], (lane == 31 ? t : t + 1) * 10);
        ck_assert_uint_eq(o[1], (lane == 0 ? t : t - 1) * 10);
        ck_assert_uint_eq(o[2], (base + (lane ^ 3)) * 10);
        ck_assert_uint_eq(o[3], (base + 5) * 10);
        ck_assert_uint_eq(o[4], 0xAAAAAAAA);
        ck_assert_uint_eq(o[5], lane != 31);
        ck_assert_uint_eq(o[6], 1);
        ck_assert_uint_eq(o[7], 0xFFFFFFFF);
    }
}
END_TEST

START_TEST(test_memory_atomics_and_calls)
{
    /* Every thread adds its id into dynamic shared memory and 1 into global
     * memory, round-trips a value through local memory, and calls a
     * function; thread 0 stores the shared sum after the barrier. */
    static const char ptx[] = HEADER
        ".func (.param .b32 ret) add3(.param .b32 a, .param .b32 b)\n"
        "{\n"
        "  .reg .b32 %r<4>;\n"
        "  ld.param.b32 %r1, [a];\n"
        "  ld.param.b32 %r2, [b];\n"
        "  add.s32 %r3, %r1, %r2;\n"
        "  add.s32 %r3, %r3, 3;\n"
        "  st.param.b32 [ret], %r3;\n"
        "  ret;\n"
        "}\n"
        ".extern .shared .align 16 .b8 dynamic[];\n"
        ".visible .entry k(.param .u64 out)\n"
        "{\n"
        "  .local .align 8 .b8 __local_depot0[16];\n"
        "  .reg .b64 %SPL;\n"
        "  .reg .b32 %r<12>;\n"
        "  .reg .f32 %f<2>;\n"
        "  .reg .b64 %rd<8>;\n"
        "  .reg .pred %p<2>;\n"
        "  mov.u64 %SPL, __local_depot0;\n"
        "  ld.param.u64 %rd1, [out];\n"
        "  cvta.to.global.u64 %rd1, %rd1;\n"
        "  mov.u32 %r1, %tid.x;\n"
        "  mov.u64 %rd2, dynamic;\n"
        "  setp.ne.s32 %p1, %r1, 0;\n"
        "  @%p1 bra $L_add;\n"
        "  st.shared.u32 [%rd2+4], 0;\n"
        "$L_add:\n"
        "  bar.sync 0;\n"
        "  atom.shared.add.u32 %r2, [%rd2+4], %r1;\n"
        "  red.global.add.f32 [%rd1+4], 0f3F800000;\n"
        "  st.local.u32 [%SPL+8], %r1;\n"
        "  ld.local.u32 %r3, [%SPL+8];\n"
        "  {\n"
        "  .param .b32 param0;\n"
        "  .param .b32 param1;\n"
        "  .param .b32 retval0;\n"
        "  st.param.b32 [param0], %r3;\n"
        "  st.param.b32 [param1], 100;\n"
        "  call.uni (retval0), add3, (param0, param1);\n"
        "  ld.param.b32 %r4, [retval0];\n"
        "  }\n"
        "  mul.wide.u32 %rd3, %r1, 4;\n"
        "  add.s64 %rd4, %rd1, %rd3;\n"
        "  st.global.u32 [%rd4+8], %r4;\n"
        "  bar.sync 0;\n"
        "  @%p1 bra $L_done;\n"
        "  ld.shared.u32 %r5, [%rd2+4];\n"
        "  st.global.u32 [%rd1], %r5;\n"
        "$L_done:\n"
        "  ret;\n"
        "}\n";
    uint32_t out[2 + 128] = {0};
    run_ok(ptx, 1, 128, 64, out, sizeof out);
    ck_assert_uint_eq(out[0], 127 * 128 / 2);
    float added;
    memcpy(&added, &out[1], 4);
    ck_assert_float_eq(added, 128.0f);
    for (unsigned t = 0; t < 128; t++)
        ck_assert_uint_eq(out[2 + t], t + 103);
}
END_TEST

/* A kernel loading 4 bytes at its parameter plus offset. */
static void load_at(char *ptx, size_t size, int offset)
{
    snprintf(ptx, size,
             "%s.visible .entry k(.param .u64 out)\n"
             "{\n"
             "  .reg .b32 %%r<2>;\n"
             "  .reg .b64 %%rd<2>;\n"
             "  ld.param.u64 %%rd1, [out];\n"
             "  ld.global.u32 %%r1, [%%rd1+%d];\n"
             "  ret;\n"
             "}\n",
             HEADER, offset);
}

START_TEST(test_bad_accesses_fail_the_launch)
{
    char ptx[1024], err[512];
    uint32_t out[4];
    load_at(ptx, sizeof ptx, 16);
    ck_assert_int_eq(run_kernel(ptx, 1, 1, 0, out, sizeof out, err, sizeof err), PTX_ILLEGAL_ADDRESS);
    ck_assert_msg(strstr(err, "kernel k, PTX line 9") && strstr(err, "outside global memory"), "%s", err);
    load_at(ptx, sizeof ptx, 2);
    ck_assert_int_eq(run_kernel(ptx, 1, 1, 0, out, sizeof out, err, sizeof err), PTX_MISALIGNED_ADDRESS);
    load_at(ptx, sizeof ptx, 12);
    ck_assert_int_eq(run_kernel(ptx, 1, 1, 0, out, sizeof out, err, sizeof err), 0);
}
END_TEST

START_TEST(test_shuffle_with_missing_lanes_fails)
{
    static const char ptx[] = HEADER
        ".visible .entry k(.param .u64 out)\n"
        "{\n"
        "  .reg .b32 %r<4>;\n"
        "  .reg .pred %p<2>;\n"
        "  mov.u32 %r1, %tid.x;\n"
        "  setp.lt.u32 %p1, %r1, 16;\n"
        "  @%p1 shfl.sync.down.b32 %r2, %r1, 1, 31, -1;\n"
        "  ret;\n"
        "}\n";
    char err[512];
    uint32_t out[1];
    ck_assert_int_eq(run_kernel(ptx, 1, 32, 0, out, sizeof out, err, sizeof err), PTX_LAUNCH_FAILED);
    ck_assert_msg(strstr(err, "member mask"), "%s", err);
}
END_TEST

START_TEST(test_unknown_instructions_fail_the_parse)
{
    static const char *const bad[] = {
        HEADER ".visible .entry k()\n{\n  .reg .b32 %r<2>;\n  frobnicate.b32 %r1, %r0;\n  ret;\n}\n",
        HEADER ".visible .entry k()\n{\n  .reg .b32 %r<2>;\n  add.xyz.s32 %r1, %r0, 1;\n  ret;\n}\n",
        HEADER ".visible .entry k()\n{\n  .reg .b32 %r<2>;\n  add.s32 %r1, %r9, 1;\n  ret;\n}\n",
        HEADER ".visible .entry k()\n{\n  .reg .b16 %h<2>;\n  cvt.f32.f16 %r1, %h0;\n  ret;\n}\n",
    };
    static const char *const needles[] = {"line 7: unknown instruction frobnicate", "line 7: unknown modifier .xyz",
                                          "line 7: unknown register %r9", "line 7: unknown modifier .f16"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[512] = "";
        ck_assert_ptr_null(ptx_parse(bad[i], err, sizeof err));
        ck_assert_msg(strstr(err, needles[i]), "\"%s\" lacks \"%s\"", err, needles[i]);
    }
}
END_TEST

static Suite *ptx_suite(void)
{
    Suite *s = suite_create("ptx");
    TCase *tc = tcase_create("interpreter");
    tcase_add_test(tc, test_integer_instructions);
    tcase_add_test(tc, test_float_rounding_and_conversions);
    tcase_add_test(tc, test_warp_instructions);
    tcase_add_test(tc, test_memory_atomics_and_calls);
    tcase_add_test(tc, test_bad_accesses_fail_the_launch);
    tcase_add_test(tc, test_shuffle_with_missing_lanes_fails);
    tcase_add_test(tc, test_unknown_instructions_fail_the_parse);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(ptx_suite)
