/* attention: one scaled dot-product attention block, softmax(q @ kᵀ / √d) @ v,
 * marked for compilation and checked against the same ops run eagerly. */
#include <kiln/kiln.h>

#include <math.h>
#include <stdio.h>

enum { BATCH = 2, HEADS = 4, SEQ = 128, DIM = 32 };

static kiln_tensor *attention(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v)
{
    kiln_tensor *scores = kiln_matmul(q, kiln_transpose(k, -2, -1));
    kiln_tensor *weights = kiln_softmax(kiln_mul_scalar(scores, 1.0 / sqrt(DIM)), -1);
    return kiln_matmul(weights, v);
}

KILN_COMPILE(attention_compiled, attention, 3)

int main(void)
{
    const int64_t shape[4] = {BATCH, HEADS, SEQ, DIM};
    kiln_scope_begin();
    kiln_tensor *q = kiln_randn(4, shape, 1), *k = kiln_randn(4, shape, 2), *v = kiln_randn(4, shape, 3);
    kiln_tensor *traced = attention_compiled(q, k, v);
    kiln_tensor *eager = attention(q, k, v);
    kiln_tensor *diff = kiln_max(kiln_abs(kiln_sub(traced, eager)), KILN_ALL, false);
    if (!diff) {
        fprintf(stderr, "attention: %s\n", kiln_last_error());
        kiln_scope_end();
        return 1;
    }
    double d = kiln_item(diff);
    printf("attention %dx%dx%dx%d: output mean %.6f, traced vs eager max |diff| %g\n", BATCH, HEADS, SEQ,
           DIM, kiln_item(kiln_mean(traced, KILN_ALL, false)), d);
    kiln_scope_end();
    return d <= 1e-6 ? 0 : 1;
}
