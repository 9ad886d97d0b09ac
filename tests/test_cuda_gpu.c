/* CUDA on a GPU: every op eagerly on CUDA against the CPU, random programs
 * traced on CUDA against CPU eager, the allocator's reuse in steady state,
 * and a second process that loads every kernel from the disk cache without
 * calling NVRTC (KILN_CACHE=require). Exits 77 where there is no GPU.
 *
 * Tolerances: integers and bools exact; floats within 1e-4 relative plus
 * 1e-4 absolute, as the LLVM backend's random programs: CUDA's expf, tanhf,
 * erff and powf are within 2 ulp of the correctly rounded result, as SLEEF's
 * are, and the differences grow through a program's chain of ops. */
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dynprog.h"
#include "progen.h"
#include "test_common.h"

extern char **environ;

static char cache_root[] = "/tmp/kiln-cuda-gpu-XXXXXX";

/* Programs whose values all come from their inputs: progen's creation ops,
 * kiln_scalar among them, make CPU tensors, which do not mix with CUDA ones. */
static progen_options device_programs(void)
{
    return (progen_options){.ops = PROGEN_ALL_OPS & ~PROGEN_MAKING_OPS};
}

/* got, on CUDA, against want from the CPU. */
static void assert_close_to_cpu(kiln_tensor *got, kiln_tensor *want, const char *what)
{
    ck_assert_msg(got && kiln_device_of(got) == KILN_CUDA, "%s: no CUDA result (%s)", what, kiln_last_error());
    assert_close(got, want, 1e-4, 1e-4, what);
}

/* Runs program seed eagerly on the CPU and, eagerly or traced with backend,
 * on CUDA. */
static void check_program(uint64_t seed, bool traced, kiln_backend backend)
{
    kiln_scope_begin();
    progen_options opt = device_programs();
    progen_program *p = progen_new(seed, &opt);
    int n_in = progen_n_inputs(p), n_out = progen_n_outputs(p);
    kiln_tensor *in[PROGEN_MAX_INPUTS], *dev[PROGEN_MAX_INPUTS], *want[PROGEN_MAX_OUTPUTS] = {NULL},
                *got[PROGEN_MAX_OUTPUTS] = {NULL};
    for (int i = 0; i < n_in; i++) {
        in[i] = progen_make_input(p, i, seed * 31 + (uint64_t)i);
        dev[i] = kiln_to_device(in[i], KILN_CUDA);
        ck_assert_msg(dev[i] != NULL, "%s", kiln_last_error());
    }
    ck_assert_int_eq(progen_run(p, in, want), 0);
    kiln_fn *f = NULL;
    int status;
    if (traced) {
        kiln_jit_options o = kiln_jit_defaults();
        o.backend = backend;
        f = kiln_jit("random", progen_body, n_in, n_out, p, &o);
        status = kiln_call(f, dev, got);
    } else {
        status = progen_run(p, dev, got);
    }
    char *listing = status == 0 ? NULL : progen_describe(p);
    ck_assert_msg(status == 0, "seed %llu: %s %s\n%s", (unsigned long long)seed, kiln_last_error(),
                  progen_last_error(), listing ? listing : "");
    if (traced)
        ck_assert_str_eq(kiln_fn_backend(f), "nvrtc");
    for (int i = 0; i < n_out; i++) {
        char what[64];
        snprintf(what, sizeof what, "seed %llu out[%d]%s", (unsigned long long)seed, i, traced ? " traced" : "");
        assert_close_to_cpu(got[i], want[i], what);
    }
    kiln_fn_free(f);
    progen_free(p);
    kiln_scope_end();
}

START_TEST(test_every_op_eagerly)
{
    /* 200 programs use every op progen knows at least once. */
    for (uint64_t s = 1; s <= 200; s++)
        check_program(s, false, KILN_BACKEND_AUTO);
}
END_TEST

START_TEST(test_random_programs_traced)
{
    for (uint64_t s = 1; s <= 150; s++)
        check_program(s, true, KILN_BACKEND_AUTO);
}
END_TEST

/* KILN_BACKEND_NVRTC asks for what AUTO gives CUDA inputs: fused kernels. */
START_TEST(test_nvrtc_backend_runs_fused_kernels)
{
    for (uint64_t s = 1; s <= 20; s++)
        check_program(s, true, KILN_BACKEND_NVRTC);
}
END_TEST

/* A CPU 0-d i64 beyond 2^53 goes to the kernel as its bits: exactly. */
/* A program over a symbolic batch and sequence, traced once on CUDA (its
 * kernels taking the sizes as arguments), against the CPU at four sizes. */
START_TEST(test_symbolic_programs_traced)
{
    dynprog *cpu = dynprog_new((uint64_t)_i + 11, KILN_CPU), *gpu = dynprog_new((uint64_t)_i + 11, KILN_CUDA);
    ck_assert_msg(gpu != NULL, "%s", kiln_last_error());
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic_dims = DYNPROG_DIMS;
    kiln_fn *f = kiln_jit("symbolic", dynprog_body, DYNPROG_INPUTS, DYNPROG_OUTPUTS, gpu, &o);
    int64_t sizes[4][2] = {{2, 3}, {5, 17}, {3, 33}, {4, 8}};
    for (int s = 0; s < 4; s++) {
        kiln_scope_begin();
        kiln_tensor *in[DYNPROG_INPUTS], *dev[DYNPROG_INPUTS], *got[DYNPROG_OUTPUTS], *want[DYNPROG_OUTPUTS];
        dynprog_inputs(cpu, sizes[s][0], sizes[s][1], (uint64_t)s, in);
        for (int i = 0; i < DYNPROG_INPUTS; i++)
            dev[i] = kiln_to_device(in[i], KILN_CUDA);
        ck_assert_int_eq(dynprog_body(in, want, cpu), 0);
        ck_assert_msg(kiln_call(f, dev, got) == 0, "%s", kiln_last_error());
        for (int k = 0; k < DYNPROG_OUTPUTS; k++)
            assert_close_to_cpu(got[k], want[k], "a symbolic program on CUDA");
        kiln_scope_end();
    }
    kiln_fn_stats_t st;
    kiln_fn_stats(f, &st);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_str_eq(kiln_fn_backend(f), "nvrtc");
    kiln_fn_free(f);
    dynprog_free(cpu);
    dynprog_free(gpu);
}
END_TEST

START_TEST(test_i64_scalar_operand_exact)
{
    const int64_t big = ((int64_t)1 << 53) + 1, values[3] = {1, -2, (int64_t)1 << 60};
    kiln_scope_begin();
    kiln_tensor *x = kiln_to_device(kiln_from_data(KILN_I64, 1, (int64_t[]){3}, values), KILN_CUDA);
    kiln_tensor *sum = kiln_add(x, kiln_from_data(KILN_I64, 0, NULL, &big));
    int64_t got[3];
    ck_assert_msg(kiln_copy_to_host(sum, got, sizeof got) == 0, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(got[i], values[i] + big);
    kiln_scope_end();
}
END_TEST

/* progen's references (PyTorch's values for signed zeros, integer extremes,
 * empty axes and 0-d softmax), eagerly on CUDA and fused. */
START_TEST(test_references_match_pytorch)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.strict = true;
    for (int i = 0; i < progen_n_references(); i++) {
        ck_assert_msg(progen_check_reference(i, NULL, KILN_CUDA, 1e-6) == 0, "eager: %s", progen_last_error());
        ck_assert_msg(progen_check_reference(i, &o, KILN_CUDA, 1e-6) == 0, "traced: %s", progen_last_error());
    }
}
END_TEST

static int mean_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_mean(in[0], -1, false);
    return out[0] ? 0 : -1;
}

/* Means of integers sum in f64, eagerly and fused: 2^62 twice wrapped in i64. */
START_TEST(test_integer_mean_does_not_wrap)
{
    kiln_scope_begin();
    kiln_tensor *x = kiln_to_device(kiln_full(KILN_I64, 2, (int64_t[]){3, 2}, 0x1p62), KILN_CUDA), *traced;
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("mean", mean_body, 1, 1, NULL, &o);
    ck_assert_msg(kiln_call(f, &x, &traced) == 0, "%s", kiln_last_error());
    kiln_tensor *results[2] = {kiln_mean(x, -1, false), traced};
    for (int r = 0; r < 2; r++) {
        float got[3];
        ck_assert_msg(kiln_copy_to_host(results[r], got, sizeof got) == 0, "%s", kiln_last_error());
        for (int i = 0; i < 3; i++)
            ck_assert_msg(got[i] == 0x1p62f, "%s row %d: %g", r ? "traced" : "eager", i, got[i]);
    }
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

static int mlp_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    kiln_tensor *h = kiln_gelu(kiln_add(kiln_matmul(in[0], in[1]), in[2]));
    out[0] = kiln_softmax(kiln_matmul(h, kiln_transpose(in[1], 0, 1)), -1);
    return out[0] ? 0 : -1;
}

static void mlp_inputs(kiln_tensor **cpu, kiln_tensor **dev)
{
    cpu[0] = kiln_randn(2, (int64_t[]){67, 130}, 1);
    cpu[1] = kiln_mul_scalar(kiln_randn(2, (int64_t[]){130, 259}, 2), 0.1);
    cpu[2] = kiln_randn(1, (int64_t[]){259}, 3);
    for (int i = 0; i < 3; i++)
        dev[i] = kiln_to_device(cpu[i], KILN_CUDA);
}

START_TEST(test_workload_traced_and_allocator_steady)
{
    kiln_tensor *cpu[3], *dev[3], *want[1], *got[1];
    kiln_scope_begin();
    mlp_inputs(cpu, dev);
    mlp_body(cpu, want, NULL);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("mlp", mlp_body, 3, 1, NULL, &o);
    for (int i = 0; i < 3; i++) {
        kiln_scope_begin();
        ck_assert_int_eq(kiln_call(f, dev, got), 0);
        assert_close_to_cpu(got[0], want[0], "mlp on CUDA");
        kiln_scope_end();
    }
    kiln_cuda_memory before, after;
    kiln_cuda_memory_stats(&before);
    for (int i = 0; i < 20; i++) {
        kiln_scope_begin();
        ck_assert_int_eq(kiln_call(f, dev, got), 0);
        kiln_scope_end();
    }
    ck_assert_int_eq(kiln_cuda_synchronize(), 0);
    kiln_cuda_memory_stats(&after);
    ck_assert_msg(after.device_allocs == before.device_allocs, "20 calls asked the driver for %lld blocks",
                  (long long)(after.device_allocs - before.device_allocs));
    ck_assert_int_gt(after.reuses, before.reuses);
    ck_assert_int_eq(after.in_use_bytes, before.in_use_bytes);
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* A lone long row's softmax, log_softmax and cross entropy take the
 * online form in pieces (ir/long_rows.c): on CUDA as on the CPU, pieces of
 * 3277 (16385 elements), the first half of the row -inf (whole pieces
 * masked), the rest noise. */
static int lone_row_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_softmax(in[0], -1);
    out[1] = kiln_log_softmax(in[0], -1);
    out[2] = kiln_cross_entropy(in[0], in[1]);
    return out[0] && out[1] && out[2] ? 0 : -1;
}

START_TEST(test_lone_long_row_in_pieces)
{
    enum { COLS = 16385 };
    kiln_scope_begin();
    kiln_tensor *noise = kiln_randn(2, (int64_t[]){1, COLS}, 5);
    kiln_tensor *masked = kiln_lt(kiln_arange(0, COLS, 1, KILN_F32), kiln_scalar(COLS / 2));
    int64_t label = COLS * 3 / 4;
    kiln_tensor *cpu[2] = {kiln_masked_fill(noise, masked, -INFINITY),
                           kiln_from_data(KILN_I64, 1, (int64_t[]){1}, &label)};
    kiln_tensor *dev[2] = {kiln_to_device(cpu[0], KILN_CUDA), kiln_to_device(cpu[1], KILN_CUDA)};
    kiln_tensor *want[3], *got[3];
    ck_assert_int_eq(lone_row_body(cpu, want, NULL), 0);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("lone_row", lone_row_body, 2, 3, NULL, &o);
    ck_assert_msg(kiln_call(f, dev, got) == 0, "%s", kiln_last_error());
    char *graph = kiln_fn_graph_text(f);
    ck_assert_msg(graph && strstr(graph, " = maximum "), "the row is not in pieces:\n%s", graph);
    free(graph);
    assert_close_to_cpu(got[0], want[0], "softmax of a lone row");
    assert_close_to_cpu(got[1], want[1], "log_softmax of a lone row");
    assert_close_to_cpu(got[2], want[2], "cross entropy of a lone row");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* The child process: the mlp from the disk cache alone. */
static int child(void)
{
    kiln_tensor *cpu[3], *dev[3], *want[1], *got[1];
    kiln_scope_begin();
    mlp_inputs(cpu, dev);
    mlp_body(cpu, want, NULL);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("mlp", mlp_body, 3, 1, NULL, &o);
    int64_t n = kiln_numel(want[0]);
    float *g = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
    /* Not test_values: Check's assertions exit outside a running test. */
    int status = 1;
    if (!g || !w || kiln_call(f, dev, got) != 0 || kiln_copy_to_host(got[0], g, sizeof(float) * (size_t)n) != 0 ||
        kiln_copy_to_host(want[0], w, sizeof(float) * (size_t)n) != 0) {
        fprintf(stderr, "child: %s\n", kiln_last_error());
    } else {
        kiln_fn_stats_t stats;
        kiln_fn_stats(f, &stats);
        status = stats.kernels_compiled == 0 && stats.kernels_from_disk > 0 ? 0 : 3;
        for (int64_t i = 0; i < n; i++)
            if (fabsf(g[i] - w[i]) > 1e-4f * fabsf(w[i]) + 1e-4f)
                status = 2;
    }
    free(g);
    free(w);
    kiln_fn_free(f);
    kiln_scope_end();
    return status;
}

static int run_child(const char *mode)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    setenv("KILN_CACHE", mode, 1);
    char *argv[] = {self, "--child", NULL};
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(test_second_process_loads_cubins_from_disk)
{
    setenv("KILN_CACHE_DIR", cache_root, 1);
    /* The first child fills the cache (it compiles, so it exits 3). */
    ck_assert_int_eq(run_child("on"), 3);
    ck_assert_int_eq(run_child("require"), 0);
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("cuda_gpu");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_random_programs_traced);
    tcase_add_test(tc, test_nvrtc_backend_runs_fused_kernels);
    tcase_add_loop_test(tc, test_symbolic_programs_traced, 0, 3);
    tcase_add_test(tc, test_i64_scalar_operand_exact);
    tcase_add_test(tc, test_integer_mean_does_not_wrap);
    tcase_add_test(tc, test_references_match_pytorch);
    tcase_add_test(tc, test_workload_traced_and_allocator_steady);
    tcase_add_test(tc, test_lone_long_row_in_pieces);
    tcase_add_test(tc, test_second_process_loads_cubins_from_disk);
    suite_add_tcase(s, tc);
    TCase *every_op = test_exhaustive_case("every op", 600);
    tcase_add_test(every_op, test_every_op_eagerly);
    suite_add_tcase(s, every_op);
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--child"))
        return child();
    if (!kiln_cuda_available()) {
        printf("skipped: %s\n", kiln_last_error());
        return 77;
    }
    if (!mkdtemp(cache_root))
        return 1;
    int failed = test_run_suite(gpu_suite());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache_root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", cache_root);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
