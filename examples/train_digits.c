/* Trains a small CNN on the 8x8 handwritten digits Debian's python3-sklearn
 * ships (1,797 images, 10 classes), eagerly and then as one marked training
 * step, with a held-out fifth: loss and accuracy per epoch, and a progress
 * bar. Exits 77 (skipped) where the file is absent, 1 if either run stays
 * under 97% held-out accuracy.
 *
 * The convolutions are written with kiln's ops (an image's 3x3 patches are
 * nine slices of it, padded, joined along channels, and multiplied by the
 * filters), so the network traces, and its gradient flows through views.
 *
 *   train_digits [path/to/digits.csv.gz]   (default: sklearn's, or $KILN_DIGITS) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <kiln/kiln.h>

#define DIGITS_PATH "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

enum { SIDE = 8, PIXELS = 64, CLASSES = 10, BATCH = 64, EPOCHS = 15, MAX_IMAGES = 2000 };

typedef struct {
    float pixels[MAX_IMAGES][PIXELS]; /* scaled to [0, 1] */
    int64_t labels[MAX_IMAGES];
    int count;
} digits;

/* -- The data -------------------------------------------------------------- */

/* Reads sklearn's CSV (64 pixel values 0..16, then the label, per line). */
static int digits_load(const char *path, digits *d)
{
    gzFile f = gzopen(path, "rb");
    if (!f)
        return -1;
    char line[1024];
    d->count = 0;
    while (d->count < MAX_IMAGES && gzgets(f, line, sizeof line)) {
        char *p = line, *end;
        int i = 0;
        for (; i <= PIXELS; i++, p = end + (*end == ',')) {
            double v = strtod(p, &end);
            if (end == p)
                break;
            if (i < PIXELS)
                d->pixels[d->count][i] = (float)(v / 16);
            else
                d->labels[d->count] = (int64_t)v;
        }
        if (i == PIXELS + 1)
            d->count++;
    }
    gzclose(f);
    return d->count > 0 ? 0 : -1;
}

/* The same random order every run. */
static void shuffle(int *order, int n, uint64_t *state)
{
    for (int i = n - 1; i > 0; i--) {
        *state = *state * 6364136223846793005u + 1442695040888963407u;
        int j = (int)((*state >> 33) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* Images order[0..n) as [n,8,8,1] f32, and their labels one-hot [n,10] f32
 * and as indices [n] i64 (new references). */
static void batch_of(const digits *d, const int *order, int n, kiln_tensor **x, kiln_tensor **onehot,
                     kiln_tensor **labels)
{
    float *px = malloc((size_t)n * PIXELS * sizeof *px), *hot = calloc((size_t)n * CLASSES, sizeof *hot);
    int64_t *lab = malloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++) {
        memcpy(px + (size_t)i * PIXELS, d->pixels[order[i]], sizeof d->pixels[0]);
        lab[i] = d->labels[order[i]];
        hot[(size_t)i * CLASSES + lab[i]] = 1;
    }
    *x = kiln_from_data(KILN_F32, 4, (int64_t[]){n, SIDE, SIDE, 1}, px);
    *onehot = kiln_from_data(KILN_F32, 2, (int64_t[]){n, CLASSES}, hot);
    *labels = kiln_from_data(KILN_I64, 1, (int64_t[]){n}, lab);
    free(px);
    free(hot);
    free(lab);
}

/* -- The network ------------------------------------------------------------ */

typedef struct {
    kiln_tensor *w1, *b1, *w2, *b2, *w3, *b3; /* conv 1->16, conv 16->32, linear 128->10 */
    kiln_optimizer *opt;
} cnn;

static kiln_tensor *he_normal(int ndim, const int64_t *shape, int64_t fan_in, uint64_t seed)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_keep(kiln_mul_scalar(kiln_randn(ndim, shape, seed), sqrt(2.0 / (double)fan_in)));
    kiln_scope_end();
    kiln_requires_grad(w, true);
    return w;
}

static kiln_tensor *zeros(int64_t n)
{
    kiln_tensor *b = kiln_zeros(KILN_F32, 1, &n);
    kiln_requires_grad(b, true);
    return b;
}

static int cnn_init(cnn *m)
{
    m->w1 = he_normal(2, (int64_t[]){9, 16}, 9, 1);
    m->b1 = zeros(16);
    m->w2 = he_normal(2, (int64_t[]){9 * 16, 32}, 9 * 16, 2);
    m->b2 = zeros(32);
    m->w3 = he_normal(2, (int64_t[]){128, CLASSES}, 128, 3);
    m->b3 = zeros(CLASSES);
    kiln_tensor *params[] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
    m->opt = kiln_adamw(params, 6, 3e-3, 0.9, 0.999, 1e-8, 1e-4);
    return m->opt ? 0 : -1;
}

static void cnn_free(cnn *m)
{
    kiln_optimizer_free(m->opt);
    kiln_tensor *params[] = {m->w1, m->b1, m->w2, m->b2, m->w3, m->b3};
    for (int i = 0; i < 6; i++)
        kiln_release(params[i]);
}

/* x [n,h,w,c] with a border of one zero. */
static kiln_tensor *pad1(kiln_tensor *x)
{
    const int64_t *s = kiln_shape(x);
    int64_t n = s[0], h = s[1], w = s[2], c = s[3];
    kiln_tensor *row = kiln_zeros(KILN_F32, 4, (int64_t[]){n, 1, w, c});
    x = kiln_concat((kiln_tensor *[]){row, x, row}, 3, 1);
    kiln_tensor *column = kiln_zeros(KILN_F32, 4, (int64_t[]){n, h + 2, 1, c});
    return kiln_concat((kiln_tensor *[]){column, x, column}, 3, 2);
}

/* A 3x3 convolution with padding 1 of x [n,h,w,c] by w [9c, out], plus b, then relu. */
static kiln_tensor *conv3x3(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b)
{
    const int64_t *s = kiln_shape(x);
    int64_t n = s[0], h = s[1], wd = s[2], c = s[3];
    kiln_tensor *padded = pad1(x), *taps[9];
    for (int dy = 0; dy < 3; dy++)
        for (int dx = 0; dx < 3; dx++)
            taps[3 * dy + dx] = kiln_slice(kiln_slice(padded, 1, dy, dy + h, 1), 2, dx, dx + wd, 1);
    kiln_tensor *patches = kiln_reshape(kiln_concat(taps, 9, 3), 2, (int64_t[]){n * h * wd, 9 * c});
    kiln_tensor *y = kiln_relu(kiln_add(kiln_matmul(patches, w), b));
    return kiln_reshape(y, 4, (int64_t[]){n, h, wd, -1});
}

/* 2x2 max pooling of x [n,h,w,c]. */
static kiln_tensor *pool2(kiln_tensor *x)
{
    const int64_t *s = kiln_shape(x);
    kiln_tensor *blocks = kiln_reshape(x, 6, (int64_t[]){s[0], s[1] / 2, 2, s[2] / 2, 2, s[3]});
    return kiln_max(kiln_max(blocks, 4, false), 2, false);
}

static kiln_tensor *cnn_logits(const cnn *m, kiln_tensor *x)
{
    kiln_tensor *h = pool2(conv3x3(x, m->w1, m->b1));  /* [n,4,4,16] */
    h = pool2(conv3x3(h, m->w2, m->b2));               /* [n,2,2,32] */
    h = kiln_reshape(h, 2, (int64_t[]){kiln_shape(x)[0], 128});
    return kiln_add(kiln_matmul(h, m->w3), m->b3);
}

/* The mean cross-entropy of the logits against one-hot labels. */
static kiln_tensor *cross_entropy(kiln_tensor *logits, kiln_tensor *onehot)
{
    kiln_tensor *picked = kiln_sum(kiln_mul(kiln_log_softmax(logits, -1), onehot), -1, false);
    return kiln_neg(kiln_mean(picked, KILN_ALL, false));
}

/* One step: in x, one-hot labels; out the loss before the update. */
static int train_step(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    cnn *m = user;
    kiln_optimizer_zero_grad(m->opt);
    kiln_tensor *loss = cross_entropy(cnn_logits(m, in[0]), in[1]);
    if (kiln_backward(loss) < 0 || kiln_optimizer_step(m->opt) < 0)
        return -1;
    out[0] = kiln_detach(loss);
    return out[0] ? 0 : -1;
}

/* -- Training ------------------------------------------------------------------ */

static double accuracy(const cnn *m, kiln_tensor *x, kiln_tensor *labels)
{
    kiln_scope_begin();
    kiln_no_grad_begin();
    kiln_tensor *hits = kiln_eq(kiln_argmax(cnn_logits(m, x), -1, false), labels);
    double acc = kiln_item(kiln_mean(kiln_cast(hits, KILN_F32), KILN_ALL, false));
    kiln_no_grad_end();
    kiln_scope_end();
    return acc;
}

/* Drawn on a terminal only: a log would keep every frame. */
static void progress_bar(const char *mode, int epoch, int done, int total)
{
    if (!isatty(STDERR_FILENO))
        return;
    int width = 30, filled = done * width / total;
    fprintf(stderr, "\r%-6s epoch %2d [%.*s%*s] %3d/%d", mode, epoch, filled, "##############################",
            width - filled, "", done, total);
}

/* Trains a fresh network eagerly (step NULL) or through step; its final
 * held-out accuracy, or -1 on an error. */
static double train(const char *mode, const digits *d, const int *train_idx, int n_train, kiln_tensor *test_x,
                    kiln_tensor *test_labels, bool traced)
{
    cnn m;
    if (cnn_init(&m) < 0)
        return -1;
    kiln_jit_options opts = kiln_jit_defaults();
    opts.strict = true; /* a step that cannot be traced is an error, not an eager run */
    kiln_fn *step = traced ? kiln_jit("digits_step", train_step, 2, 1, &m, &opts) : NULL;
    int *order = malloc((size_t)n_train * sizeof *order);
    memcpy(order, train_idx, (size_t)n_train * sizeof *order);
    uint64_t rng = 7;
    double acc = -1;
    int batches = n_train / BATCH; /* the rest waits for the next epoch's order */
    for (int epoch = 1; epoch <= EPOCHS; epoch++) {
        shuffle(order, n_train, &rng);
        double total = 0;
        for (int b = 0; b < batches; b++) {
            kiln_scope_begin();
            kiln_tensor *in[2], *labels, *loss = NULL;
            batch_of(d, order + b * BATCH, BATCH, &in[0], &in[1], &labels);
            int status = traced ? kiln_call(step, in, &loss) : train_step(in, &loss, &m);
            total += status == 0 ? kiln_item(loss) : NAN;
            kiln_scope_end();
            if (status < 0) {
                fprintf(stderr, "\n%s: %s\n", mode, kiln_last_error());
                goto done;
            }
            progress_bar(mode, epoch, b + 1, batches);
        }
        acc = accuracy(&m, test_x, test_labels);
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\r%*s\r", 60, "");
        printf("%-6s epoch %2d  loss %.4f  held-out accuracy %.2f%%\n", mode, epoch, total / batches, 100 * acc);
        fflush(stdout);
    }
    kiln_fn_stats_t stats;
    if (step && kiln_fn_stats(step, &stats) == 0)
        printf("traced: %lld trace, %d kernels, %.0f ms tracing and compiling\n", (long long)stats.traces,
               stats.kernels, stats.compile_ms);
done:
    free(order);
    kiln_fn_free(step);
    cnn_free(&m);
    return acc;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : getenv("KILN_DIGITS") ? getenv("KILN_DIGITS") : DIGITS_PATH;
    digits *d = malloc(sizeof *d);
    if (!d || digits_load(path, d) < 0) {
        printf("skipped: cannot read the digits from %s (Debian's python3-sklearn ships them)\n", path);
        free(d);
        return 77;
    }
    int *order = malloc((size_t)d->count * sizeof *order);
    for (int i = 0; i < d->count; i++)
        order[i] = i;
    uint64_t rng = 1;
    shuffle(order, d->count, &rng);
    int n_test = d->count / 5, n_train = d->count - n_test;
    printf("%d digits: %d to train on, %d held out\n", d->count, n_train, n_test);
    kiln_tensor *test_x, *test_onehot, *test_labels;
    batch_of(d, order + n_train, n_test, &test_x, &test_onehot, &test_labels);
    double eager = train("eager", d, order, n_train, test_x, test_labels, false);
    double traced = train("traced", d, order, n_train, test_x, test_labels, true);
    kiln_release(test_x);
    kiln_release(test_onehot);
    kiln_release(test_labels);
    free(order);
    free(d);
    printf("held-out accuracy: eager %.2f%%, traced %.2f%%\n", 100 * eager, 100 * traced);
    return eager >= 0.97 && traced >= 0.97 ? 0 : 1;
}
