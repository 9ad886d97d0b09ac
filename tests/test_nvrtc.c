/* The CUDA backend's code generator on a machine without a GPU: kernels of
 * the standard workloads and of random programs rendered as CUDA C and
 * compiled by NVRTC for sm_90 and sm_80 into CUBIN and PTX, stored in the
 * cache under NVRTC's own keys and listed by kiln-cache; the errors for a missing driver, an unknown architecture
 * and NVRTC's own failures. Running the kernels needs a GPU: not here.
 * Exits 77 (skipped) where NVRTC is missing. */
#include <sys/stat.h>
#include <unistd.h>

#include "../bench/workloads.h"
#include "cache/cache.h"
#include "codegen_nvrtc/nvrtc.h"
#include "device/device.h"
#include "progen.h"
#include "test_common.h"

static char cache_root[] = "/tmp/kiln-nvrtc-XXXXXX";

static void use_fresh_cache(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s/*", cache_root);
    ck_assert_int_eq(system(cmd), 0);
    setenv("KILN_CACHE_DIR", cache_root, 1);
    setenv("KILN_CACHE", "on", 1);
}

static int count_entries(void)
{
    char dir[128];
    cache_dir_of_root(cache_root, dir, sizeof dir);
    cache_file *files;
    int n;
    ck_assert_int_eq(cache_list(dir, &files, &n), 0);
    free(files);
    return n;
}

/* Every entry of the cache for arch: NVRTC's, a CUBIN (ELF) then PTX that
 * defines the entry's symbol. Their number. */
static int check_entries(const char *arch)
{
    char dir[128];
    cache_dir_of_root(cache_root, dir, sizeof dir);
    cache_file *files;
    int n, found = 0;
    ck_assert_int_eq(cache_list(dir, &files, &n), 0);
    for (int i = 0; i < n; i++) {
        cache_entry e;
        char why[256];
        ck_assert_int_eq(cache_read(dir, &files[i].key, NULL, false, &e, why, sizeof why), CACHE_FOUND);
        ck_assert_str_eq(e.meta.backend, "nvrtc");
        if (strcmp(e.meta.target, arch)) {
            cache_entry_free(&e);
            continue;
        }
        found++;
        const unsigned char *p = e.payload;
        ck_assert_uint_gt(e.payload_bytes, 8);
        uint64_t cubin = 0;
        for (int b = 0; b < 8; b++)
            cubin |= (uint64_t)p[b] << (8 * b);
        ck_assert_uint_lt(8 + cubin, e.payload_bytes);
        ck_assert(!memcmp(p + 8, "\x7f" "ELF", 4));
        const char *ptx = (const char *)p + 8 + cubin;
        ck_assert_int_eq(ptx[e.payload_bytes - 8 - cubin - 1], '\0');
        char entry[128];
        snprintf(entry, sizeof entry, ".entry %s(", e.meta.symbol);
        char target[32];
        snprintf(target, sizeof target, ".target %s", arch);
        ck_assert_msg(strstr(ptx, entry) && strstr(ptx, target), "%s: the PTX lacks %s", files[i].name, entry);
        /* a*b+c rounds twice, as on the CPU: tiny's x*1.0001+0.5 steps are not
         * contracted into FMAs (CUDA's own tanhf and expf use them on purpose). */
        if (!strcmp(e.meta.function, "tiny"))
            ck_assert_msg(!strstr(ptx, "fma.rn") && strstr(ptx, "mul.rn.f32"), "tiny's PTX fuses multiply-adds");
        /* The mlp's products are computed inside their epilogues' kernels. */
        if (!strcmp(e.meta.function, "mlp"))
            ck_assert_msg(strstr(ptx, ".shared") && strstr(ptx, "fma.rn.f32"), "%s: an mlp kernel without its matmul",
                          files[i].name);
        /* Contiguous f32 rows go through 16-byte loads and stores. */
        if (!strcmp(e.meta.function, "gelu") || !strcmp(e.meta.function, "tiny"))
            ck_assert_msg(strstr(ptx, ".v4.f32") && strstr(ptx, "st.global.v4.f32"), "%s: no vector loads",
                          e.meta.function);
        cache_entry_free(&e);
    }
    free(files);
    return found;
}

/* kiln-cache ls's lines for NVRTC entries of arch. */
static int listed(const char *arch)
{
    const char *tool = getenv("KILN_TEST_CACHE_TOOL");
    ck_assert_msg(tool != NULL, "KILN_TEST_CACHE_TOOL is not set");
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "'%s' --dir '%s' ls", tool, cache_root);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    while (fgets(line, sizeof line, p))
        n += strstr(line, " nvrtc ") && strstr(line, arch);
    ck_assert_int_eq(pclose(p), 0);
    return n;
}

/* Every workload's kernels precompiled for target fill the cache, and
 * kiln-cache lists them. */
static void workloads_compile_for(const char *target)
{
    use_fresh_cache();
    int kernels = 0;
    for (int w = 0; w < workload_count; w++) {
        const workload *wl = &workloads[w];
        kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
        workload_state state = {0};
        ck_assert_int_eq(wl->setup(WORKLOAD_QUICK, in, &state), 0);
        kiln_fn *f = kiln_jit(wl->name, wl->body, wl->n_in, 1, &state, NULL);
        kiln_spec specs[WORKLOAD_MAX_INPUTS];
        for (int i = 0; i < wl->n_in; i++)
            specs[i] = kiln_spec_of(in[i]);
        ck_assert_msg(kiln_fn_precompile(f, specs, target) == 0, "%s: %s", wl->name, kiln_last_error());
        kiln_fn_stats_t s;
        ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
        ck_assert_int_gt(s.kernels_compiled, 0);
        ck_assert_int_eq(s.compiles, 0); /* nothing is ready to run here */
        kernels += (int)s.kernels_compiled;
        kiln_fn_free(f);
        workload_free(wl, in, &state);
    }
    const char *arch = target + strlen("cuda:");
    ck_assert_int_eq(check_entries(arch), kernels);
    ck_assert_int_eq(count_entries(), kernels);
    ck_assert_int_eq(listed(arch), kernels);
}

START_TEST(test_workloads_compile_for_sm_90)
{
    workloads_compile_for("cuda:sm_90");
}
END_TEST

START_TEST(test_workloads_compile_for_sm_80)
{
    workloads_compile_for("cuda:sm_80");
}
END_TEST

/* Random programs: every kernel compiles for sm_90 and sm_80, or the op it
 * lacks is named. */
START_TEST(test_random_programs_compile_for_sm_90_and_sm_80)
{
    use_fresh_cache();
    int compiled = 0;
    /* Seeds 1 to 40, and 116, whose float4 stores once took the names of
     * outer indices. */
    for (int at = 1; at <= 41; at++) {
        int seed = at <= 40 ? at : 116;
        progen_program *p = progen_new((uint64_t)seed, NULL);
        int n_in = progen_n_inputs(p);
        kiln_spec specs[16];
        ck_assert_int_le(n_in, 16);
        for (int i = 0; i < n_in; i++)
            specs[i] = progen_input_spec(p, i);
        kiln_fn *f = kiln_jit("random", progen_body, n_in, progen_n_outputs(p), p, NULL);
        kiln_clear_error();
        if (kiln_fn_precompile(f, specs, "cuda:sm_90") == 0 && kiln_fn_precompile(f, specs, "cuda:sm_80") == 0)
            compiled++;
        else
            ck_assert_msg(strstr(kiln_last_error(), "is not in the CUDA backend") ||
                              strstr(kiln_last_error(), "tracing"),
                          "seed %d: %s\n%s", seed, kiln_last_error(), progen_describe(p));
        kiln_fn_free(f);
        progen_free(p);
    }
    ck_assert_int_ge(compiled, 30);
    ck_assert_int_eq(check_entries("sm_90") + check_entries("sm_80"), count_entries());
}
END_TEST

START_TEST(test_dump_writes_the_cuda_source)
{
    use_fresh_cache();
    char dir[] = "/tmp/kiln-nvrtc-dump-XXXXXX", path[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("KILN_DUMP", "cuda", 1);
    setenv("KILN_DUMP_DIR", dir, 1);
    const workload *w = workload_find("softmax");
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    ck_assert_int_eq(w->setup(WORKLOAD_QUICK, in, &state), 0);
    kiln_fn *f = kiln_jit("softmax", w->body, 1, 1, &state, NULL);
    unsetenv("KILN_DUMP");
    kiln_spec spec = kiln_spec_of(in[0]);
    ck_assert_int_eq(kiln_fn_precompile(f, &spec, "cuda:sm_90"), 0);
    snprintf(path, sizeof path, "%s/softmax.0.kernel-0.cuda.cu", dir);
    void *text;
    size_t size;
    ck_assert_int_eq(cache_read_file(path, &text, &size), 0);
    ck_assert_ptr_nonnull(memmem(text, size, "__shfl_down_sync", 16));
    ck_assert_ptr_nonnull(memmem(text, size, "expf(", 5));
    free(text);
    kiln_fn_free(f);
    workload_free(w, in, &state);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static int halve(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_mul_scalar(in[0], 0.5);
    return out[0] ? 0 : -1;
}

START_TEST(test_errors_name_the_problem)
{
    use_fresh_cache();
    char arch[16], err[2048];
    ck_assert_int_lt(nvrtc_target("cuda:sm_1", arch, sizeof arch, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "cannot compile for sm_1") && strstr(err, "supports sm_"), "%s", err);
    ck_assert_int_lt(nvrtc_target("cuda:90", arch, sizeof arch, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "is not a CUDA target"), "%s", err);
    ck_assert_int_lt(nvrtc_target("cuda:sm_4294967386", arch, sizeof arch, err, sizeof err), 0); /* not sm_90 */
    ck_assert_msg(strstr(err, "is not a CUDA target"), "%s", err);
    ck_assert_int_eq(nvrtc_target("cuda:sm_90", arch, sizeof arch, err, sizeof err), 0);
    ck_assert_str_eq(arch, "sm_90");
    /* NVRTC's own log reaches the message. */
    void *object;
    size_t size;
    ck_assert_int_lt(nvrtc_compile_source("extern \"C\" __global__ void broken() { undeclared(); }", "broken",
                                          "sm_90", &object, &size, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "NVRTC failed to compile") && strstr(err, "undeclared"), "%s", err);
    /* Without a driver, kiln says so; with one, nothing to check here. */
    if (device_start(err, sizeof err) < 0)
        ck_assert_msg(!strncmp(err, "no CUDA driver: ", 16), "%s", err);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){4});
    kiln_fn *f = kiln_jit("f", halve, 1, 1, NULL, NULL);
    kiln_spec spec = {.dtype = KILN_F32, .ndim = 1, .shape = {4}, .device = KILN_CPU};
    ck_assert_int_lt(kiln_fn_precompile(f, &spec, "cuda:sm_1"), 0);
    ck_assert_kiln_error("kiln_fn_precompile", "sm_1");
    setenv("KILN_CACHE", "off", 1);
    ck_assert_int_lt(kiln_fn_precompile(f, &spec, "cuda:sm_90"), 0);
    ck_assert_kiln_error("kiln_fn_precompile", "KILN_CACHE=off");
    kiln_fn_free(f);
    kiln_release(x);
}
END_TEST

static Suite *nvrtc_suite(void)
{
    Suite *s = suite_create("nvrtc");
    TCase *tc = tcase_create("nvrtc");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_workloads_compile_for_sm_90);
    tcase_add_test(tc, test_random_programs_compile_for_sm_90_and_sm_80);
    tcase_add_test(tc, test_dump_writes_the_cuda_source);
    tcase_add_test(tc, test_errors_name_the_problem);
    suite_add_tcase(s, tc);
    TCase *other_arch = test_exhaustive_case("sm_80", 600);
    tcase_add_test(other_arch, test_workloads_compile_for_sm_80);
    suite_add_tcase(s, other_arch);
    return s;
}

int main(void)
{
    char err[512];
    if (!nvrtc_toolchain(err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    if (!mkdtemp(cache_root))
        return 1;
    int failed = test_run_suite(nvrtc_suite());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache_root);
    if (system(cmd) != 0)
        failed++;
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
