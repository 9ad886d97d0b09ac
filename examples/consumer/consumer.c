/* A program outside kiln that uses it as an installed library: .ci/consumers
 * builds it through pkg-config, as a meson subproject and statically linked.
 *
 *   consumer FILE.npy   (a scratch file it writes and reads back) */
#include <kiln/kiln.h>

#include <stdio.h>
#include <string.h>

/* A name kiln also uses inside itself: a static libkiln.a keeps its own
 * local, so this one does not clash with it. */
const char *describe(void);
const char *describe(void)
{
    return "consumer";
}

static kiln_tensor *axpy(kiln_tensor *a, kiln_tensor *x, kiln_tensor *y)
{
    return kiln_add(kiln_mul(a, x), y);
}
KILN_COMPILE(axpy_compiled, axpy, 3)

/* The largest |a - b|, or -1 when either is missing. */
static double max_difference(kiln_tensor *a, kiln_tensor *b)
{
    kiln_tensor *d = kiln_max(kiln_abs(kiln_sub(a, b)), KILN_ALL, false);
    return d ? kiln_item(d) : -1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer FILE.npy\n");
        return 2;
    }
    if (strcmp(kiln_version(), KILN_VERSION_STRING)) {
        fprintf(stderr, "consumer: compiled against kiln %s, running %s\n", KILN_VERSION_STRING, kiln_version());
        return 1;
    }
    kiln_scope_begin();
    int64_t shape[2] = {2, 3};
    kiln_tensor *x = kiln_reshape(kiln_arange(0, 6, 1, KILN_F32), 2, shape);
    kiln_tensor *y = kiln_ones(KILN_F32, 2, shape), *a = kiln_full(KILN_F32, 0, NULL, 0.5);
    kiln_tensor *compiled = axpy_compiled(a, x, y);
    double traced_error = max_difference(compiled, axpy(a, x, y));
    int saved = kiln_save_npy(argv[1], compiled);
    double file_error = saved == 0 ? max_difference(kiln_load_npy(argv[1]), compiled) : -1;
    int printed = kiln_fprint(stdout, compiled);
    kiln_scope_end();
    if (traced_error != 0 || file_error != 0 || printed < 0) {
        fprintf(stderr, "consumer: traced %g, file %g: %s\n", traced_error, file_error, kiln_last_error());
        return 1;
    }
    printf("%s: kiln %s, eager kernels %s, ok\n", describe(), kiln_version(), kiln_eager_isa());
    return 0;
}
