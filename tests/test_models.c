/* The two real models of issue 19 at a reduced size (bench/models.c): a
 * ResNet of bottlenecks and a GPT-2 block stack, traced against eager, and
 * against PyTorch on the same weights (bench/models.py; skipped with a
 * message where torch is absent). */
#include <sys/wait.h>
#include <unistd.h>

#include "../bench/models.h"
#include "test_common.h"

static const resnet_config RESNET = {{1, 2, 1, 1}, 4, 10};
static const gpt_config GPT = {61, 16, 32, 4, 2};

typedef struct {
    bool resnet;
    const model_params *m;
} model_ctx;

static int model_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const model_ctx *c = user;
    out[0] = c->resnet ? resnet_forward(&RESNET, c->m, in[0]) : gpt_forward(&GPT, c->m, in[0]);
    return out[0] ? 0 : -1;
}

/* The largest |a - b| over the largest |b|. */
static double relative_diff(const kiln_tensor *a, const kiln_tensor *b)
{
    double *x = test_values(a), *y = test_values(b), diff = 0, scale = 1e-30;
    for (int64_t i = 0; i < kiln_numel(b); i++) {
        diff = fmax(diff, fabs(x[i] - y[i]));
        scale = fmax(scale, fabs(y[i]));
    }
    free(x);
    free(y);
    return diff / scale;
}

/* bench/models.py's verdict on kiln's output y of x under m's weights. */
static void check_against_pytorch(const char *model, const model_params *m, kiln_tensor *x, kiln_tensor *y,
                                  const char *options)
{
    const char *script = getenv("KILN_MODELS_PY");
    if (!script) {
        printf("models: KILN_MODELS_PY unset, no comparison with PyTorch\n");
        return;
    }
    char dir[] = "/tmp/kiln-models-XXXXXX", path[256], cmd[1024];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (int i = 0; i < m->n; i++) {
        snprintf(path, sizeof path, "%s/p%03d.npy", dir, i);
        ck_assert_int_eq(kiln_save_npy(path, m->p[i]), 0);
    }
    snprintf(path, sizeof path, "%s/input.npy", dir);
    ck_assert_int_eq(kiln_save_npy(path, x), 0);
    snprintf(path, sizeof path, "%s/output.npy", dir);
    ck_assert_int_eq(kiln_save_npy(path, y), 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s check %s %s %s", script, model, dir, options);
    int status = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(WIFEXITED(status), "%s: models.py did not exit", model);
    if (WEXITSTATUS(status) == 77) {
        printf("models: no PyTorch, %s not compared with it\n", model);
        return;
    }
    ck_assert_msg(WEXITSTATUS(status) == 0, "%s differs from PyTorch's (models.py said why)", model);
}

static void check_model(bool resnet, kiln_tensor *x, const char *options)
{
    model_params m;
    ck_assert_msg((resnet ? resnet_make(&RESNET, 5, &m) : gpt_make(&GPT, 6, &m)) == 0, "%s", kiln_last_error());
    model_ctx ctx = {resnet, &m};
    kiln_tensor *eager;
    ck_assert_msg(model_body(&x, &eager, &ctx) == 0, "%s", kiln_last_error());
    for (int backend = 0; backend < 2; backend++) {
        kiln_jit_options o = kiln_jit_defaults();
        o.backend = backend ? KILN_BACKEND_AUTO : KILN_BACKEND_INTERP;
        o.strict = true;
        kiln_fn *f = kiln_jit(resnet ? "resnet" : "gpt", model_body, 1, 1, &ctx, &o);
        kiln_tensor *traced = NULL;
        ck_assert_msg(kiln_call(f, &x, &traced) == 0, "%s", kiln_last_error());
        double diff = relative_diff(traced, eager);
        ck_assert_msg(diff < 1e-5, "%s traced (%s) differs from eager by %g", resnet ? "resnet" : "gpt",
                      kiln_fn_backend(f), diff);
        kiln_fn_free(f);
    }
    check_against_pytorch(resnet ? "resnet" : "gpt", &m, x, eager, options);
    model_free(&m);
}

START_TEST(test_resnet)
{
    kiln_tensor *x = kiln_randn(4, (int64_t[]){2, 3, 32, 32}, 7);
    check_model(true, x, "--blocks 1,2,1,1 --width 4");
}
END_TEST

START_TEST(test_gpt)
{
    kiln_tensor *ids = kiln_remainder(kiln_arange(0, 24 * 7, 7, KILN_I64), kiln_full(KILN_I64, 0, NULL, 61));
    ck_assert_ptr_nonnull(ids);
    check_model(false, kiln_reshape(ids, 2, (int64_t[]){2, 12}), "--heads 4");
}
END_TEST

static Suite *models_suite(void)
{
    Suite *s = suite_create("models");
    TCase *tc = tcase_create("models");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_resnet);
    tcase_add_test(tc, test_gpt);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(models_suite)
