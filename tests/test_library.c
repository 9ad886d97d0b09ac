/* The library as a whole: its version and the level of its eager kernels. */
#include <stdio.h>
#include <sys/wait.h>

#include "test_common.h"

START_TEST(test_version_is_the_headers)
{
    char parts[32];
    snprintf(parts, sizeof parts, "%d.%d.%d", KILN_VERSION_MAJOR, KILN_VERSION_MINOR, KILN_VERSION_PATCH);
    ck_assert_str_eq(KILN_VERSION_STRING, parts);
    ck_assert_str_eq(kiln_version(), KILN_VERSION_STRING);
}
END_TEST

/* The best level this CPU runs, as CPUID reports it (under valgrind: what
 * valgrind emulates), tuned for AMD's Zen on AMD CPUs. */
static const char *best_level(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    bool zen = __builtin_cpu_is("amd");
    if (__builtin_cpu_supports("x86-64-v4"))
        return zen ? "x86-64-v4-zen" : "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3"))
        return zen ? "x86-64-v3-zen" : "x86-64-v3";
    if (__builtin_cpu_supports("x86-64-v2"))
        return "x86-64-v2";
    return "x86-64";
#else
    return NULL;
#endif
}

/* Whether this CPU runs a level named as kiln_eager_isa names them
 * ("x86-64-v3-zen" needs x86-64-v3). */
static bool cpu_runs(const char *name)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (!strncmp(name, "x86-64-v4", 9))
        return __builtin_cpu_supports("x86-64-v4");
    if (!strncmp(name, "x86-64-v3", 9))
        return __builtin_cpu_supports("x86-64-v3");
    if (!strncmp(name, "x86-64-v2", 9))
        return __builtin_cpu_supports("x86-64-v2");
#endif
    return true;
}

START_TEST(test_eager_kernels_run_the_best_level_or_kiln_isa)
{
    const char *isa = kiln_eager_isa(), *asked = getenv("KILN_ISA");
    ck_assert_ptr_nonnull(isa);
    if (!strcmp(isa, "native") || !best_level())
        return; /* -Dnative=true, or a compiler that cannot tell the levels */
    ck_assert_str_eq(isa, asked && *asked && cpu_runs(asked) ? asked : best_level());
}
END_TEST

/* The first line kiln-cache prints for args, from KILN_TEST_CACHE_TOOL. */
static void tool_line(const char *args, char *line, size_t size, int *status)
{
    const char *tool = getenv("KILN_TEST_CACHE_TOOL");
    ck_assert_msg(tool != NULL, "KILN_TEST_CACHE_TOOL is not set");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s", tool, args);
    FILE *out = popen(cmd, "r");
    ck_assert_ptr_nonnull(out);
    if (!fgets(line, (int)size, out))
        line[0] = '\0';
    while (fgetc(out) != EOF)
        continue;
    *status = pclose(out);
}

START_TEST(test_kiln_cache_version_and_help)
{
    char line[256], want[64];
    int status;
    tool_line("--version", line, sizeof line, &status);
    snprintf(want, sizeof want, "kiln-cache %s (libkiln %s", KILN_VERSION_STRING, KILN_VERSION_STRING);
    ck_assert_int_eq(status, 0);
    ck_assert_msg(!strncmp(line, want, strlen(want)), "kiln-cache --version printed \"%s\"", line);
    tool_line("--help", line, sizeof line, &status);
    ck_assert_int_eq(status, 0);
    ck_assert_msg(!strncmp(line, "usage: kiln-cache", 17), "kiln-cache --help printed \"%s\"", line);
    tool_line("--frobnicate 2>/dev/null", line, sizeof line, &status);
    ck_assert_int_eq(WEXITSTATUS(status), 2);
}
END_TEST

static Suite *library_suite(void)
{
    Suite *s = suite_create("library");
    TCase *tc = tcase_create("library");
    tcase_add_test(tc, test_version_is_the_headers);
    tcase_add_test(tc, test_eager_kernels_run_the_best_level_or_kiln_isa);
    tcase_add_test(tc, test_kiln_cache_version_and_help);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(library_suite)
