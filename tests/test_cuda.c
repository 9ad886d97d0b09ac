/* CUDA tensors without a GPU. Run three times by meson:
 *  - KILN_TEST_CUDA=fake, against tests/fakecuda's libcuda.so.1, whose
 *    device memory is host memory and which loads no kernel: moving tensors
 *    both ways, reading them back, the caching allocator's reuse, bound and
 *    out-of-memory recovery, and clean errors where a kernel would run;
 *  - KILN_TEST_CUDA=launch, against the same with FAKE_CUDA_KERNELS=check,
 *    which loads kernels and checks each launch's grid and pointers without
 *    running it: random programs, eager and traced (fused matmuls
 *    included), launch only kernels over device memory, with results of the
 *    dtypes and shapes the CPU's have (their values are not computed);
 *  - KILN_TEST_CUDA=none, with no driver: the clear "no CUDA driver" error.
 * Running kernels is tests/test_cuda_gpu.c's, where a GPU is. */
#include <stdint.h>
#include <unistd.h>

#include "progen.h"
#include "test_common.h"

static bool mode_is(const char *name)
{
    const char *mode = getenv("KILN_TEST_CUDA");
    return mode && !strcmp(mode, name);
}

static kiln_tensor *ramp(kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    kiln_tensor *t = kiln_cast(kiln_reshape(kiln_arange(0, (double)n, 1, KILN_F64), ndim, shape), dt);
    ck_assert_ptr_nonnull(t);
    return t;
}

/* -- With no driver ------------------------------------------------------------ */

START_TEST(test_no_driver_is_a_clear_error)
{
    ck_assert_int_eq(kiln_cuda_available(), 0);
    ck_assert_kiln_error("kiln_cuda_available", "no CUDA driver:", "libcuda.so.1");
    kiln_clear_error();
    kiln_tensor *t = ramp(KILN_F32, 1, (int64_t[]){4});
    ck_assert_ptr_null(kiln_to_device(t, KILN_CUDA));
    ck_assert_kiln_error("kiln_to_device", "cannot allocate [4] f32 on CUDA", "no CUDA driver:");
    kiln_clear_error();
    kiln_cuda_memory stats;
    ck_assert_int_lt(kiln_cuda_memory_stats(&stats), 0);
    ck_assert_kiln_error("no CUDA driver:");
}
END_TEST

/* -- Against the fake driver ---------------------------------------------------- */

START_TEST(test_round_trip_every_dtype)
{
    ck_assert_int_eq(kiln_cuda_available(), 1);
    kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        kiln_tensor *host = ramp(dts[i], 2, (int64_t[]){3, 5});
        kiln_tensor *dev = kiln_to_device(host, KILN_CUDA);
        ck_assert_ptr_nonnull(dev);
        ck_assert_int_eq(kiln_device_of(dev), KILN_CUDA);
        ck_assert_int_eq(kiln_dtype_of(dev), dts[i]);
        ck_assert_int_eq(kiln_ndim(dev), 2);
        kiln_tensor *back = kiln_to_device(dev, KILN_CPU);
        ck_assert_int_eq(kiln_device_of(back), KILN_CPU);
        double *want = test_values(host), *got = test_values(back), *direct = test_values(dev);
        for (int j = 0; j < 15; j++) {
            ck_assert_double_eq(got[j], want[j]);
            ck_assert_double_eq(direct[j], want[j]);
        }
        free(want);
        free(got);
        free(direct);
        /* Already there: the same tensor, a new reference. */
        ck_assert_ptr_eq(kiln_to_device(dev, KILN_CUDA), dev);
    }
}
END_TEST

START_TEST(test_views_move_by_their_own_elements)
{
    kiln_tensor *host = ramp(KILN_F32, 2, (int64_t[]){4, 6});
    /* A CPU view goes over as its own contiguous elements. */
    kiln_tensor *column = kiln_slice(host, 1, 2, 3, 1);
    kiln_tensor *dev = kiln_to_device(column, KILN_CUDA);
    ck_assert_ptr_nonnull(dev);
    double *got = test_values(dev);
    for (int r = 0; r < 4; r++)
        ck_assert_double_eq(got[r], r * 6 + 2);
    free(got);
    /* A contiguous view of a CUDA tensor (a row) reads back without a kernel. */
    kiln_tensor *all = kiln_to_device(host, KILN_CUDA);
    kiln_tensor *row = kiln_slice(all, 0, 2, 3, 1);
    ck_assert_int_eq(kiln_device_of(row), KILN_CUDA);
    ck_assert_double_eq(kiln_item(kiln_slice(row, 1, 4, 5, 1)), 16);
    float values[6];
    ck_assert_int_eq(kiln_copy_to_host(row, values, sizeof values), 0);
    for (int c = 0; c < 6; c++)
        ck_assert_float_eq(values[c], 12 + c);
}
END_TEST

START_TEST(test_kernels_that_cannot_load_fail_cleanly)
{
    kiln_tensor *a = kiln_to_device(ramp(KILN_F32, 1, (int64_t[]){8}), KILN_CUDA);
    ck_assert_ptr_null(kiln_add(a, a));
    ck_assert_kiln_error("kiln_add", "no CUDA kernel for add on f32", "cuModuleLoadData");
    kiln_clear_error();
    /* A strided CUDA view needs a copy kernel to come back. */
    kiln_tensor *m = kiln_to_device(ramp(KILN_F32, 2, (int64_t[]){4, 4}), KILN_CUDA);
    ck_assert_ptr_null(kiln_to_device(kiln_transpose(m, 0, 1), KILN_CPU));
    ck_assert_kiln_error("kiln_to_device", "cuModuleLoadData");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_sum(m, 0, false));
    ck_assert_kiln_error("kiln_sum", "no CUDA kernel for sum");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_matmul(m, m));
    ck_assert_kiln_error("kiln_matmul", "no CUDA kernel for matmul");
}
END_TEST

static int scale_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_tanh(kiln_mul_scalar(in[0], 2));
    return out[0] ? 0 : -1;
}

static int add_captured_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_add(in[0], user);
    return out[0] ? 0 : -1;
}

/* A CPU tensor captured by a function called on CUDA inputs is the same
 * error as eagerly. */
START_TEST(test_captured_cpu_tensor_is_an_error)
{
    kiln_tensor *bias = kiln_keep(ramp(KILN_F32, 1, (int64_t[]){8}));
    kiln_tensor *a = kiln_to_device(ramp(KILN_F32, 1, (int64_t[]){8}), KILN_CUDA);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("add_captured", add_captured_body, 1, 1, bias, &o);
    kiln_tensor *out[1] = {NULL};
    ck_assert_int_lt(kiln_call(f, &a, out), 0);
    ck_assert_kiln_error("different devices", "[8] f32 on the CPU");
    kiln_fn_free(f);
    kiln_release(bias);
}
END_TEST

/* A CUDA signature compiles for the device, and a kernel that does not load
 * leaves an error, not a crash or a half-made result. */
START_TEST(test_traced_call_that_cannot_run_fails_cleanly)
{
    kiln_tensor *a = kiln_to_device(ramp(KILN_F32, 1, (int64_t[]){8}), KILN_CUDA);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("scale", scale_body, 1, 1, NULL, &o);
    kiln_tensor *out[1] = {NULL};
    ck_assert_int_lt(kiln_call(f, &a, out), 0);
    ck_assert_ptr_null(out[0]);
    ck_assert_kiln_error("cuModuleLoadData");
    kiln_clear_error();
    kiln_spec spec = kiln_spec_of(a);
    ck_assert_int_eq(spec.device, KILN_CUDA);
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_mixed_devices_are_an_error)
{
    kiln_tensor *cpu = ramp(KILN_F32, 1, (int64_t[]){4});
    kiln_tensor *dev = kiln_to_device(cpu, KILN_CUDA);
    ck_assert_ptr_null(kiln_add(cpu, dev));
    ck_assert_kiln_error("kiln_add", "different devices", "[4] f32 on the CPU", "on CUDA", "kiln_to_device");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_matmul(kiln_reshape(cpu, 2, (int64_t[]){2, 2}), kiln_reshape(dev, 2, (int64_t[]){2, 2})));
    ck_assert_kiln_error("kiln_matmul", "different devices");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_concat((kiln_tensor *[]){dev, cpu}, 2, 0));
    ck_assert_kiln_error("kiln_concat", "different devices");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_where(kiln_gt(cpu, cpu), dev, dev));
    ck_assert_kiln_error("kiln_where", "different devices", "[4] bool on the CPU");
}
END_TEST

START_TEST(test_allocator_reuses_freed_blocks)
{
    kiln_cuda_empty_cache();
    kiln_cuda_memory before, during, after;
    ck_assert_int_eq(kiln_cuda_memory_stats(&before), 0);
    kiln_tensor *host = ramp(KILN_F32, 1, (int64_t[]){1000});
    kiln_scope_begin();
    kiln_to_device(host, KILN_CUDA);
    kiln_scope_end();
    ck_assert_int_eq(kiln_cuda_memory_stats(&during), 0);
    ck_assert_int_eq(during.device_allocs, before.device_allocs + 1);
    ck_assert_int_eq(during.in_use_bytes, before.in_use_bytes);
    ck_assert_int_eq(during.cached_bytes, 4096); /* 4000 bytes rounded to 512 */
    /* Nearly the same size takes the cached block; the driver is not asked. */
    for (int i = 0; i < 10; i++) {
        kiln_scope_begin();
        kiln_tensor *t = kiln_to_device(ramp(KILN_F32, 1, (int64_t[]){900 + i}), KILN_CUDA);
        ck_assert_ptr_nonnull(t);
        kiln_cuda_memory now;
        kiln_cuda_memory_stats(&now);
        ck_assert_int_eq(now.in_use_bytes, before.in_use_bytes + 4096);
        ck_assert_int_eq(now.cached_bytes, 0);
        kiln_scope_end();
    }
    ck_assert_int_eq(kiln_cuda_memory_stats(&after), 0);
    ck_assert_int_eq(after.device_allocs, during.device_allocs);
    ck_assert_int_eq(after.reuses, during.reuses + 10);
    ck_assert_int_ge(after.peak_in_use_bytes, 4096);
    /* A block more than twice the request is not handed out for it. */
    kiln_scope_begin();
    kiln_to_device(ramp(KILN_F32, 1, (int64_t[]){10}), KILN_CUDA);
    kiln_scope_end();
    kiln_cuda_memory small;
    kiln_cuda_memory_stats(&small);
    ck_assert_int_eq(small.device_allocs, after.device_allocs + 1);
    kiln_cuda_empty_cache();
    kiln_cuda_memory emptied;
    kiln_cuda_memory_stats(&emptied);
    ck_assert_int_eq(emptied.cached_bytes, 0);
    ck_assert_int_eq(emptied.device_frees, small.device_frees + 2);
}
END_TEST

/* Out of device memory with blocks cached: they go back and the request is
 * tried again. The fake driver holds at most 3 MiB (FAKE_CUDA_MEMORY_LIMIT). */
START_TEST(test_out_of_memory_returns_the_cache_first)
{
    kiln_cuda_empty_cache();
    kiln_scope_begin();
    kiln_to_device(kiln_zeros(KILN_F32, 1, (int64_t[]){512 * 1024}), KILN_CUDA); /* 2 MiB */
    kiln_scope_end();
    kiln_cuda_memory cached;
    kiln_cuda_memory_stats(&cached);
    ck_assert_int_eq(cached.cached_bytes, 2 << 20);
    /* 2.5 MiB rounds to 3 MiB: more than the cached 2 MiB block, and not
     * room for both. */
    kiln_tensor *big = kiln_to_device(kiln_zeros(KILN_F32, 1, (int64_t[]){640 * 1024 + 1}), KILN_CUDA);
    ck_assert_ptr_nonnull(big);
    kiln_cuda_memory now;
    kiln_cuda_memory_stats(&now);
    ck_assert_int_eq(now.cached_bytes, 0);
    ck_assert_int_eq(now.device_frees, cached.device_frees + 1);
    /* Past the device: a clear error, nothing lost. */
    ck_assert_ptr_null(kiln_to_device(kiln_zeros(KILN_F32, 1, (int64_t[]){1 << 20}), KILN_CUDA));
    ck_assert_kiln_error("kiln_to_device", "cannot allocate [1048576] f32 on CUDA", "out of memory");
    kiln_clear_error();
    ck_assert_double_eq(kiln_item(kiln_sum(kiln_to_device(big, KILN_CPU), KILN_ALL, false)), 0);
}
END_TEST

START_TEST(test_bad_arguments)
{
    ck_assert_int_lt(kiln_cuda_memory_stats(NULL), 0);
    ck_assert_kiln_error("kiln_cuda_memory_stats", "out");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_to_device(NULL, KILN_CUDA));
    ck_assert_kiln_error("kiln_to_device");
    kiln_clear_error();
    kiln_tensor *t = ramp(KILN_F32, 1, (int64_t[]){2});
    ck_assert_ptr_null(kiln_to_device(t, (kiln_device)7));
    ck_assert_kiln_error("kiln_to_device", "device 7");
    kiln_clear_error();
    kiln_tensor *dev = kiln_to_device(t, KILN_CUDA);
    float small[1];
    ck_assert_int_lt(kiln_copy_to_host(dev, small, sizeof small), 0);
    ck_assert_kiln_error("kiln_copy_to_host", "needs 8 bytes");
    kiln_clear_error();
    ck_assert_int_eq(kiln_cuda_synchronize(), 0);
}
END_TEST

/* -- Launches checked by the stand-in driver ---------------------------------- */

static void assert_same_type(kiln_tensor *got, kiln_tensor *want, const char *what)
{
    ck_assert_msg(got && kiln_device_of(got) == KILN_CUDA, "%s: no CUDA result", what);
    ck_assert_msg(kiln_dtype_of(got) == kiln_dtype_of(want), "%s: %s, the CPU's %s", what,
                  kiln_dtype_name(kiln_dtype_of(got)), kiln_dtype_name(kiln_dtype_of(want)));
    ck_assert_int_eq(kiln_ndim(got), kiln_ndim(want));
    for (int d = 0; d < kiln_ndim(got); d++)
        ck_assert_int_eq(kiln_shape(got)[d], kiln_shape(want)[d]);
}

static void launch_program(uint64_t seed, bool traced)
{
    kiln_scope_begin();
    progen_options opt = {.ops = PROGEN_ALL_OPS & ~PROGEN_MAKING_OPS};
    progen_program *p = progen_new(seed, &opt);
    int n_in = progen_n_inputs(p), n_out = progen_n_outputs(p);
    kiln_tensor *in[PROGEN_MAX_INPUTS], *dev[PROGEN_MAX_INPUTS], *want[PROGEN_MAX_OUTPUTS], *got[PROGEN_MAX_OUTPUTS];
    for (int i = 0; i < n_in; i++) {
        in[i] = progen_make_input(p, i, seed * 31 + (uint64_t)i);
        dev[i] = kiln_to_device(in[i], KILN_CUDA);
    }
    ck_assert_int_eq(progen_run(p, in, want), 0);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = traced ? kiln_jit("random", progen_body, n_in, n_out, p, &o) : NULL;
    int status = traced ? kiln_call(f, dev, got) : progen_run(p, dev, got);
    char *listing = status == 0 ? NULL : progen_describe(p);
    ck_assert_msg(status == 0, "seed %llu: %s\n%s", (unsigned long long)seed, kiln_last_error(),
                  listing ? listing : "");
    if (traced)
        ck_assert_str_eq(kiln_fn_backend(f), "nvrtc");
    for (int i = 0; i < n_out; i++)
        assert_same_type(got[i], want[i], traced ? "traced" : "eager");
    kiln_fn_free(f);
    progen_free(p);
    kiln_scope_end();
}

START_TEST(test_eager_programs_launch_on_device_memory)
{
    for (uint64_t s = 1; s <= 30; s++)
        launch_program(s, false);
}
END_TEST

START_TEST(test_traced_programs_launch_on_device_memory)
{
    for (uint64_t s = 1; s <= 30; s++)
        launch_program(s, true);
}
END_TEST

static int mlp_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *w = user;
    kiln_tensor *h = kiln_relu(kiln_add_scalar(kiln_matmul(in[0], w), 1));
    out[0] = kiln_add(h, kiln_mul_scalar(kiln_matmul(in[0], w), 2)); /* the product twice: not fused */
    out[1] = kiln_tanh(kiln_matmul(h, kiln_transpose(w, 0, 1)));
    return out[0] && out[1] ? 0 : -1;
}

/* Products fused into their epilogues, and one read twice that is not. */
START_TEST(test_fused_products_launch)
{
    kiln_tensor *w = kiln_keep(kiln_to_device(kiln_randn(2, (int64_t[]){40, 24}, 1), KILN_CUDA));
    kiln_tensor *x = kiln_to_device(kiln_randn(2, (int64_t[]){33, 40}, 2), KILN_CUDA);
    kiln_jit_options o = kiln_jit_defaults();
    kiln_fn *f = kiln_jit("mlp", mlp_body, 1, 2, w, &o);
    kiln_tensor *out[2];
    ck_assert_msg(kiln_call(f, &x, out) == 0, "%s", kiln_last_error());
    ck_assert_str_eq(kiln_fn_backend(f), "nvrtc");
    ck_assert_int_eq(kiln_shape(out[0])[1], 24);
    ck_assert_int_eq(kiln_shape(out[1])[1], 40);
    kiln_fn_stats_t stats;
    ck_assert_int_eq(kiln_fn_stats(f, &stats), 0);
    /* Stored: the product read twice p (33x24 f32), h, out[0] and out[1]
     * (33x40); h's product with w^T is computed inside out[1]'s kernel, so
     * it is no kernel and holds no bytes. Peak: p, h and out[0] (3 x 3168)
     * less p, which dies with out[0], plus out[1] (5280). */
    ck_assert_int_eq(stats.kernels, 4);
    ck_assert_int_eq(stats.peak_bytes, 3 * 3168 - 3168 + 5280);
    kiln_fn_free(f);
    kiln_release(w);
}
END_TEST

/* -- The disk cache of CUDA kernels, in any build ------------------------------ */

/* A child process (this program run again): an eager op and a marked
 * function on CUDA tensors, with the disk cache in root; prints the marked
 * function's compiled kernels. */
static int cache_child(const char *root)
{
    setenv("KILN_CACHE", "on", 1);
    setenv("KILN_CACHE_DIR", root, 1);
    kiln_scope_begin();
    kiln_tensor *w = kiln_to_device(kiln_randn(2, (int64_t[]){40, 24}, 1), KILN_CUDA);
    kiln_tensor *x = kiln_to_device(kiln_randn(2, (int64_t[]){33, 40}, 2), KILN_CUDA);
    kiln_tensor *y = kiln_exp(x), *out[2] = {NULL, NULL};
    kiln_fn *f = kiln_jit("mlp", mlp_body, 1, 2, w, NULL);
    kiln_fn_stats_t stats;
    if (!y || kiln_call(f, &x, out) < 0 || kiln_fn_stats(f, &stats) < 0) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    printf("compiled %lld\n", (long long)stats.kernels_compiled);
    kiln_fn_free(f);
    kiln_scope_end();
    return 0;
}

/* The marked function's kernels a child compiled, and the cache's misses
 * (compiles of any kernel, eager ones included) after it ran. */
static void run_cache_child(const char *root, long long *compiled, long long *misses)
{
    char cmd[1200], line[128] = "", path[1100];
    snprintf(cmd, sizeof cmd, "/proc/%d/exe --cache-child %s", (int)getpid(), root);
    FILE *child = popen(cmd, "r");
    ck_assert_ptr_nonnull(child);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, child));
    ck_assert_int_eq(pclose(child), 0);
    ck_assert_int_eq(sscanf(line, "compiled %lld", compiled), 1);
    snprintf(path, sizeof path, "%s/1/stats", root);
    FILE *stats = fopen(path, "r");
    long long hits = 0;
    ck_assert_ptr_nonnull(stats);
    ck_assert_int_eq(fscanf(stats, "hits %lld\nmisses %lld", &hits, misses), 2);
    fclose(stats);
}

/* A second process finds every CUDA kernel, fused or eager, on disk: it
 * compiles none. So in a build without LLVM too. */
START_TEST(test_second_process_compiles_no_cuda_kernel)
{
    char root[] = "/tmp/kiln-cuda-cache-XXXXXX", cmd[64];
    ck_assert_ptr_nonnull(mkdtemp(root));
    long long compiled, misses, again, misses_again;
    run_cache_child(root, &compiled, &misses);
    ck_assert_int_gt(compiled, 0);
    ck_assert_int_gt(misses, compiled); /* the eager kernels too */
    run_cache_child(root, &again, &misses_again);
    ck_assert_int_eq(again, 0);
    ck_assert_int_eq(misses_again, misses);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *cuda_suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300); /* NVRTC compiles the kernels that then fail to load */
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    if (mode_is("launch")) {
        tcase_add_test(tc, test_eager_programs_launch_on_device_memory);
        tcase_add_test(tc, test_traced_programs_launch_on_device_memory);
        tcase_add_test(tc, test_fused_products_launch);
        tcase_add_test(tc, test_second_process_compiles_no_cuda_kernel);
    } else if (mode_is("fake")) {
        tcase_add_test(tc, test_round_trip_every_dtype);
        tcase_add_test(tc, test_views_move_by_their_own_elements);
        tcase_add_test(tc, test_kernels_that_cannot_load_fail_cleanly);
        tcase_add_test(tc, test_mixed_devices_are_an_error);
        tcase_add_test(tc, test_traced_call_that_cannot_run_fails_cleanly);
        tcase_add_test(tc, test_captured_cpu_tensor_is_an_error);
        tcase_add_test(tc, test_allocator_reuses_freed_blocks);
        tcase_add_test(tc, test_out_of_memory_returns_the_cache_first);
        tcase_add_test(tc, test_bad_arguments);
    } else {
        tcase_add_test(tc, test_no_driver_is_a_clear_error);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--cache-child"))
        return cache_child(argv[2]);
    const char *mode = getenv("KILN_TEST_CUDA");
    if (!mode) {
        fprintf(stderr, "set KILN_TEST_CUDA to fake or launch (with tests/fakecuda on LD_LIBRARY_PATH) or none\n");
        return 77;
    }
    if (mode_is("none") && kiln_cuda_available()) {
        fprintf(stderr, "skipped: this machine has a CUDA driver and device\n");
        return 77;
    }
    kiln_clear_error();
    int failed = test_run_suite(cuda_suite());
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
