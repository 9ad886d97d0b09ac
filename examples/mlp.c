/* mlp: the forward pass of a two-layer perceptron, x @ W1 + b1 -> gelu -> @ W2 + b2,
 * written with eager kiln ops and marked for compilation in one line. */
#include <kiln/kiln.h>

#include <math.h>
#include <stdio.h>

enum { BATCH = 256, D_MODEL = 1024, D_HIDDEN = 4096 };

/* Standard normal values times scale; the tensor belongs to the current scope. */
static kiln_tensor *random_normal(int ndim, const int64_t *shape, double scale, uint64_t seed)
{
    return kiln_mul_scalar(kiln_randn(ndim, shape, seed), scale);
}

/* Returns a new reference, owned by the current scope. */
static kiln_tensor *mlp_forward(kiln_tensor *x, kiln_tensor *w1, kiln_tensor *b1, kiln_tensor *w2,
                                kiln_tensor *b2)
{
    kiln_tensor *hidden = kiln_gelu(kiln_add(kiln_matmul(x, w1), b1));
    return kiln_add(kiln_matmul(hidden, w2), b2);
}

/* mlp(x, ...) runs mlp_forward traced: once per input signature, then the
 * compiled graph. */
KILN_COMPILE(mlp, mlp_forward, 5)

int main(void)
{
    kiln_scope_begin();
    kiln_tensor *x = random_normal(2, (int64_t[]){BATCH, D_MODEL}, 1.0, 1);
    /* Weights scaled by 1/sqrt(fan-in) keep the activations near unit size. */
    kiln_tensor *w1 = random_normal(2, (int64_t[]){D_MODEL, D_HIDDEN}, 1.0 / sqrt(D_MODEL), 2);
    kiln_tensor *b1 = random_normal(1, (int64_t[]){D_HIDDEN}, 0.1, 3);
    kiln_tensor *w2 = random_normal(2, (int64_t[]){D_HIDDEN, D_MODEL}, 1.0 / sqrt(D_HIDDEN), 4);
    kiln_tensor *b2 = random_normal(1, (int64_t[]){D_MODEL}, 0.1, 5);

    kiln_tensor *y = mlp(x, w1, b1, w2, b2);
    kiln_tensor *mean = kiln_mean(y, KILN_ALL, false);
    kiln_tensor *first_row = kiln_slice(kiln_slice(y, 0, 0, 1, 1), 1, 0, 4, 1); /* y[0:1, 0:4] */
    float head[4];

    /* A failed call returns NULL and every later op passes the NULL on, keeping
     * the first error, so checking the last results is enough. */
    if (!mean || !first_row || kiln_copy_to_host(first_row, head, sizeof head) < 0) {
        fprintf(stderr, "mlp: %s\n", kiln_last_error());
        kiln_scope_end();
        return 1;
    }
    printf("output shape [%lld, %lld], mean %.6f\n", (long long)kiln_shape(y)[0], (long long)kiln_shape(y)[1],
           kiln_item(mean));
    printf("y[0, :4] = %.6f %.6f %.6f %.6f\n", head[0], head[1], head[2], head[3]);
    kiln_scope_end();
    return 0;
}
