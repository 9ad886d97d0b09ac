/* The two real models of issue 19 at a reduced size (bench/models.c): a
 * ResNet of bottlenecks and a GPT-2 block stack, traced against eager, and
 * against PyTorch on the same weights (bench/models.py; skipped with a
 * message where torch is absent); and kiln-bench's training steps
 * (bench/workloads.c) at their quick sizes, traced against eager. */
#include <sys/wait.h>
#include <unistd.h>

#include "../bench/models.h"
#include "../bench/workloads.h"
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
    for (int backend = 0; backend < (UNDER_VALGRIND() ? 1 : 2); backend++) { /* compiles are slow there */
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

enum { TRAINING_STEPS = 3 };

/* The training steps run as kiln-bench runs them, outside any scope: a
 * tensor a scope owns, released early while a gradient record still holds
 * it, stays listed in the scope (src/eager/tensor.c's kiln_release), which
 * the interpreted steps under valgrind show. Nothing may leak. */
static void training_setup(void)
{
    kiln_clear_error();
    test_live_at_start = kiln_live_tensors();
}

static void training_teardown(void)
{
    ck_assert_int_eq(kiln_live_tensors(), test_live_at_start);
}

/* Runs TRAINING_STEPS of w's step through f (eagerly when NULL); the
 * parameters and optimizer state it leaves, copied into saved. */
static int train(const workload *w, kiln_fn *f, kiln_tensor **in, workload_state *s, kiln_tensor **saved)
{
    for (int step = 0; step < TRAINING_STEPS; step++) { /* a scope per step, as kiln-bench's */
        kiln_scope_begin();
        kiln_tensor *loss = NULL;
        int status = f ? kiln_call(f, in, &loss) : w->body(in, &loss, s);
        kiln_scope_end();
        ck_assert_msg(status == 0, "%s step %d: %s", w->name, step, kiln_last_error());
    }
    return workload_save(s, saved);
}

/* Each training step traced (compiled; interpreted under valgrind, where
 * compiles take long) from the same start as eager ends its steps with the
 * same parameters and optimizer state: the GPT's AdamW, the CNN's batch
 * norm on the batch and SGD with momentum. The GPT's AdamW has eps 1e-3
 * here: the gradient of the keys' bias is rounding noise (softmax ignores
 * a row's shift), which eps 1e-8 turns into a step of +-lr by its sign. */
START_TEST(test_training_steps)
{
    const workload *w = &workload_trainings[_i];
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL}, *start[WORKLOAD_MAX_SAVED], *eager[WORKLOAD_MAX_SAVED],
                *traced[WORKLOAD_MAX_SAVED];
    workload_state s = {0};
    ck_assert_msg(w->setup(WORKLOAD_QUICK, in, &s) == 0, "%s: %s", w->name, kiln_last_error());
    if (!strcmp(w->name, "train_gpt")) {
        kiln_optimizer_free(s.optimizer);
        s.optimizer = kiln_adamw(s.model.p, s.model.n, 1e-3, 0.9, 0.999, 1e-3, 1e-2);
    }
    int n = workload_save(&s, start);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(train(w, NULL, in, &s, eager), n);
    ck_assert_int_eq(workload_restore(&s, start, n), 0);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = UNDER_VALGRIND() ? KILN_BACKEND_INTERP : KILN_BACKEND_AUTO;
    o.strict = true;
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &s, &o);
    ck_assert_int_eq(train(w, f, in, &s, traced), n);
    for (int i = 0; i < n; i++) {
        double diff = relative_diff(traced[i], eager[i]);
        ck_assert_msg(diff < 1e-4, "%s: tensor %d of %d after %d steps traced (%s) differs from eager by %g",
                      w->name, i, n, TRAINING_STEPS, kiln_fn_backend(f), diff);
        kiln_release(traced[i]);
        kiln_release(eager[i]);
    }
    kiln_fn_free(f);
    workload_free(w, in, &s);
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
    TCase *training = tcase_create("training");
    tcase_add_checked_fixture(training, training_setup, training_teardown);
    tcase_set_timeout(training, 300);
    tcase_add_loop_test(training, test_training_steps, 0, workload_training_count);
    suite_add_tcase(s, training);
    return s;
}

KILN_TEST_MAIN(models_suite)
