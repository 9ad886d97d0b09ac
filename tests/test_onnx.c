/* ONNX in and out: models built here with protobuf-c run eagerly and
 * compiled; malformed ones (truncated, mutated, wrong types, cycles,
 * undefined values, huge dims, unsupported ops, attributes and dtypes) give
 * errors naming the node and op; random programs exported and loaded back
 * give what they gave (and, where python3-onnx is, pass onnx.checker). */
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/onnx.h"
#include "progen.h"
#include "test_common.h"

#define tmp_dir test_tmp_dir
#define tmp_path test_tmp_path
#define write_all test_write_file

/* -- Building models ------------------------------------------------------------ */

enum { MAX_PARTS = 16 };

/* A graph under construction; everything lives in it. */
typedef struct {
    Onnx__NodeProto nodes[MAX_PARTS], *node_ptrs[MAX_PARTS];
    Onnx__AttributeProto attrs[MAX_PARTS], *attr_ptrs[MAX_PARTS];
    Onnx__ValueInfoProto values[MAX_PARTS], *in_ptrs[MAX_PARTS], *out_ptrs[MAX_PARTS];
    Onnx__TypeProto types[MAX_PARTS];
    Onnx__TypeProto__Tensor tensor_types[MAX_PARTS];
    Onnx__TensorShapeProto shapes[MAX_PARTS];
    Onnx__TensorShapeProto__Dimension dims[MAX_PARTS][4], *dim_ptrs[MAX_PARTS][4];
    Onnx__TensorProto inits[MAX_PARTS], *init_ptrs[MAX_PARTS];
    char *names[MAX_PARTS][2 * MAX_PARTS];
    int n_nodes, n_attrs, n_values, n_in, n_out, n_inits;
    int opset;
} model;

static void model_init(model *m)
{
    memset(m, 0, sizeof *m);
    m->opset = 13;
}

/* A node "op" named name: ins and outs are space-separated value names ("-" for one left out). */
static Onnx__NodeProto *add_node(model *m, const char *op, const char *name, const char *ins, const char *outs)
{
    Onnx__NodeProto *n = &m->nodes[m->n_nodes];
    onnx__node_proto__init(n);
    n->op_type = (char *)op;
    n->name = (char *)name;
    char **slots = m->names[m->n_nodes];
    int k = 0;
    for (int side = 0; side < 2; side++) {
        char *list = strdup(side ? outs : ins), *save = NULL;
        char **start = slots + k;
        size_t count = 0;
        for (char *tok = strtok_r(list, " ", &save); tok; tok = strtok_r(NULL, " ", &save), count++)
            slots[k++] = strcmp(tok, "-") ? strdup(tok) : strdup("");
        free(list);
        if (side) {
            n->output = start;
            n->n_output = count;
        } else {
            n->input = start;
            n->n_input = count;
        }
    }
    m->node_ptrs[m->n_nodes++] = n;
    return n;
}

/* A new attribute of type appended to n's: each node's attributes are added
 * one after another. */
static Onnx__AttributeProto *add_attr(model *m, Onnx__NodeProto *n, const char *name,
                                      Onnx__AttributeProto__AttributeType type)
{
    Onnx__AttributeProto *a = &m->attrs[m->n_attrs];
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    a->has_type = true;
    a->type = type;
    m->attr_ptrs[m->n_attrs] = a;
    if (!n->n_attribute)
        n->attribute = &m->attr_ptrs[m->n_attrs];
    n->n_attribute++;
    m->n_attrs++;
    return a;
}

static void add_int_attr(model *m, Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = add_attr(m, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    a->has_i = true;
    a->i = v;
}

static void add_ints_attr(model *m, Onnx__NodeProto *n, const char *name, const int64_t *v, size_t count)
{
    Onnx__AttributeProto *a = add_attr(m, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    a->ints = (int64_t *)v;
    a->n_ints = count;
}

/* A graph input (output false) or output of elem type and shape. */
static void add_value(model *m, bool output, const char *name, int32_t elem, int ndim, const int64_t *shape)
{
    int i = m->n_values++;
    Onnx__ValueInfoProto *v = &m->values[i];
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(&m->types[i]);
    onnx__type_proto__tensor__init(&m->tensor_types[i]);
    onnx__tensor_shape_proto__init(&m->shapes[i]);
    for (int d = 0; d < ndim; d++) {
        onnx__tensor_shape_proto__dimension__init(&m->dims[i][d]);
        m->dims[i][d].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        m->dims[i][d].dim_value = shape[d];
        m->dim_ptrs[i][d] = &m->dims[i][d];
    }
    m->shapes[i].dim = m->dim_ptrs[i];
    m->shapes[i].n_dim = (size_t)ndim;
    m->tensor_types[i].has_elem_type = true;
    m->tensor_types[i].elem_type = elem;
    m->tensor_types[i].shape = &m->shapes[i];
    m->types[i].value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    m->types[i].tensor_type = &m->tensor_types[i];
    v->name = (char *)name;
    v->type = &m->types[i];
    if (output)
        m->out_ptrs[m->n_out++] = v;
    else
        m->in_ptrs[m->n_in++] = v;
}

static void add_floats(model *m, const char *name, int ndim, const int64_t *shape, const float *data, size_t n)
{
    Onnx__TensorProto *t = &m->inits[m->n_inits];
    onnx__tensor_proto__init(t);
    t->name = (char *)name;
    t->dims = (int64_t *)shape;
    t->n_dims = (size_t)ndim;
    t->has_data_type = true;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    t->float_data = (float *)data;
    t->n_float_data = n;
    m->init_ptrs[m->n_inits++] = t;
}

/* The last initializer's values as little-endian raw data, as PyTorch
 * writes its weights (borrowed). */
static void use_raw_data(model *m)
{
    Onnx__TensorProto *t = m->init_ptrs[m->n_inits - 1];
    t->has_raw_data = true;
    t->raw_data.data = (uint8_t *)t->float_data;
    t->raw_data.len = t->n_float_data * sizeof(float);
    t->float_data = NULL;
    t->n_float_data = 0;
}

/* The model serialized (malloc'd). */
static uint8_t *pack(model *m, size_t *size)
{
    Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
    Onnx__ModelProto p = ONNX__MODEL_PROTO__INIT;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsets[1] = {&opset};
    opset.has_version = true;
    opset.version = m->opset;
    p.has_ir_version = true;
    p.ir_version = 8;
    p.opset_import = opsets;
    p.n_opset_import = 1;
    p.graph = &g;
    g.name = "test";
    g.node = m->node_ptrs;
    g.n_node = (size_t)m->n_nodes;
    g.input = m->in_ptrs;
    g.n_input = (size_t)m->n_in;
    g.output = m->out_ptrs;
    g.n_output = (size_t)m->n_out;
    g.initializer = m->init_ptrs;
    g.n_initializer = (size_t)m->n_inits;
    *size = onnx__model_proto__get_packed_size(&p);
    uint8_t *bytes = malloc(*size + 1);
    onnx__model_proto__pack(&p, bytes);
    return bytes;
}

static void model_free(model *m)
{
    for (int k = 0; k < MAX_PARTS; k++)
        for (int i = 0; i < 2 * MAX_PARTS; i++)
            free(m->names[k][i]);
}

/* Writes m to name in the temporary directory: its path. */
static const char *save(model *m, const char *name)
{
    size_t size;
    uint8_t *bytes = pack(m, &size);
    write_all(tmp_path(name), bytes, size);
    free(bytes);
    model_free(m);
    return tmp_path(name);
}

static const int64_t x_shape[2] = {2, 3}, w_shape[2] = {3, 4}, b_shape[1] = {4}, y_shape[2] = {2, 4};
static const float w_data[12] = {0, .1f, .2f, .3f, .4f, .5f, .6f, .7f, .8f, .9f, 1, 1.1f}, b_data[4] = {1, -3, 1, -9};

/* y = relu(x @ w + b), x [2,3]; w as raw data, b as floats. */
static void dense_model(model *m)
{
    model_init(m);
    add_node(m, "MatMul", "mm", "x w", "h");
    add_node(m, "Add", "bias", "h b", "h2");
    add_node(m, "Relu", "act", "h2", "y");
    add_value(m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    add_value(m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, y_shape);
    add_floats(m, "w", 2, w_shape, w_data, 12);
    use_raw_data(m);
    add_floats(m, "b", 1, b_shape, b_data, 4);
}

static kiln_tensor *dense_input(void)
{
    return kiln_reshape(kiln_arange(0, 6, 1, KILN_F32), 2, x_shape);
}

/* -- Loading and running ------------------------------------------------------------ */

/* The model at path, to run eagerly (mode 0) or compiled (1). */
static kiln_fn *load_in_mode(const char *path, int mode)
{
    if (mode == 0)
        setenv("KILN_JIT", "0", 1);
    kiln_fn *f = kiln_onnx_load(path, NULL);
    unsetenv("KILN_JIT");
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    return f;
}

START_TEST(test_load_and_call)
{
    model m;
    dense_model(&m);
    const char *path = save(&m, "dense.onnx");
    float want[8] = {3.0f, 0, 3.6f, 0, 6.6f, 3.8f, 9.0f, 0.2f};
    for (int mode = 0; mode < 2; mode++) {
        kiln_fn *f = load_in_mode(path, mode);
        int n_in = -1, n_out = -1;
        ck_assert_int_eq(kiln_fn_arity(f, &n_in, &n_out), 0);
        ck_assert_int_eq(n_in, 1);
        ck_assert_int_eq(n_out, 1);
        ck_assert_str_eq(kiln_fn_io_name(f, false, 0), "x");
        ck_assert_str_eq(kiln_fn_io_name(f, true, 0), "y");
        ck_assert_ptr_null(kiln_fn_io_name(f, true, 1));
        ck_assert_kiln_error("kiln_fn_io_name", "1 outputs");
        kiln_tensor *x = dense_input(), *y = NULL;
        for (int call = 0; call < 2; call++) {
            ck_assert_msg(kiln_call(f, &x, &y) == 0, "%s", kiln_last_error());
            assert_close(y, kiln_from_data(KILN_F32, 2, y_shape, want), 1e-6, 1e-6, "dense");
        }
        kiln_fn_stats_t st;
        kiln_fn_stats(f, &st);
        ck_assert_int_eq(st.traces, mode);
        ck_assert_int_eq(st.eager_fallbacks, 0);
        kiln_fn_free(f);
    }
}
END_TEST

static const kiln_tensor *constant(const kiln_fn *f, const char *name)
{
    const onnx_model *m = jit_user(f);
    for (int i = 0; i < m->n_values; i++)
        if (!strcmp(m->value_names[i], name))
            return m->constants[i];
    return NULL;
}

/* Float weights held as raw data share one block, each 64-byte aligned;
 * typed values are made alone. */
START_TEST(test_weights_share_a_block)
{
    model m;
    dense_model(&m);
    add_floats(&m, "c", 1, b_shape, b_data, 4);
    use_raw_data(&m);
    add_node(&m, "Add", "c", "y c", "z");
    m.values[1].name = "z";
    kiln_fn *f = kiln_onnx_load(save(&m, "block.onnx"), NULL);
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    const kiln_tensor *w = constant(f, "w"), *b = constant(f, "b"), *c = constant(f, "c");
    ck_assert_ptr_nonnull(w);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_eq(w->storage, c->storage);
    ck_assert_ptr_ne(w->storage, b->storage);
    /* 64 bytes apart; where the block starts is the allocator's (16-byte
     * alignment without its cache: KILN_CPU_CACHE_BYTES=0, as under valgrind) */
    ck_assert_int_eq(((const char *)eager_data(c) - (const char *)eager_data(w)) % 64, 0);
    float want[8] = {4.0f, -3, 4.6f, -9, 7.6f, 0.8f, 10.0f, -8.8f};
    kiln_tensor *x = dense_input(), *z = NULL;
    ck_assert_msg(kiln_call(f, &x, &z) == 0, "%s", kiln_last_error());
    assert_close(z, kiln_from_data(KILN_F32, 2, y_shape, want), 1e-6, 1e-6, "dense + c");
    kiln_fn_free(f);
}
END_TEST

/* A graph given in two pieces (the second file's graph holding b) is one
 * graph, as protobuf merges them: the loader's skeleton, which reads the
 * initializers' raw data from the mapped file, leaves such files to
 * protobuf-c whole. */
START_TEST(test_graph_in_two_pieces)
{
    model m;
    dense_model(&m);
    m.n_inits = 1; /* w only */
    size_t size, more_size;
    uint8_t *bytes = pack(&m, &size);
    model_free(&m);
    model_init(&m);
    add_floats(&m, "b", 1, b_shape, b_data, 4);
    use_raw_data(&m);
    uint8_t *more = pack(&m, &more_size);
    bytes = realloc(bytes, size + more_size);
    memcpy(bytes + size, more, more_size);
    write_all(tmp_path("pieces.onnx"), bytes, size + more_size);
    free(bytes);
    free(more);
    kiln_fn *f = kiln_onnx_load(tmp_path("pieces.onnx"), NULL);
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    float want[8] = {3.0f, 0, 3.6f, 0, 6.6f, 3.8f, 9.0f, 0.2f};
    kiln_tensor *x = dense_input(), *y = NULL;
    ck_assert_msg(kiln_call(f, &x, &y) == 0, "%s", kiln_last_error());
    assert_close(y, kiln_from_data(KILN_F32, 2, y_shape, want), 1e-6, 1e-6, "pieces");
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_default_io_names)
{
    kiln_fn *f = kiln_jit("plain", progen_body, 2, 3, NULL, NULL);
    ck_assert_str_eq(kiln_fn_io_name(f, false, 1), "input_1");
    ck_assert_str_eq(kiln_fn_io_name(f, true, 2), "output_2");
    ck_assert_ptr_null(kiln_fn_io_name(f, false, -1));
    ck_assert_int_eq(kiln_fn_arity(NULL, NULL, NULL) < 0, 1);
    kiln_fn_free(f);
}
END_TEST

/* A PyTorch-style reshape: x.view(x.size(0), -1) as Shape, Gather, Unsqueeze,
 * Concat and Reshape, folded while traced: no graph break, one trace. */
START_TEST(test_shape_arithmetic_folds)
{
    model m;
    model_init(&m);
    static const int64_t in_shape[3] = {2, 3, 4}, out_shape[2] = {2, 12}, one = 1;
    static const float zero = 0;
    add_node(&m, "Shape", "shape", "x", "s");
    Onnx__NodeProto *gather = add_node(&m, "Gather", "batch", "s zero_i", "n");
    add_int_attr(&m, gather, "axis", 0);
    add_node(&m, "Unsqueeze", "unsq", "n axes", "n1");
    add_node(&m, "Concat", "cat", "n1 rest", "target");
    add_int_attr(&m, m.node_ptrs[3], "axis", 0);
    add_node(&m, "Reshape", "flat", "x target", "y");
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 3, in_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, out_shape);
    /* integer initializers: floats converted below would not do, so int64 data */
    static int64_t zero_i = 0, axes = 0, rest = -1;
    Onnx__TensorProto *t;
    for (int i = 0; i < 3; i++) {
        add_floats(&m, (const char *[]){"zero_i", "axes", "rest"}[i], i == 0 ? 0 : 1, &one, &zero, 1);
        t = m.init_ptrs[i];
        t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
        t->float_data = NULL;
        t->n_float_data = 0;
        t->int64_data = (int64_t *[]){&zero_i, &axes, &rest}[i];
        t->n_int64_data = 1;
    }
    kiln_fn *f = kiln_onnx_load(save(&m, "flatten.onnx"), NULL);
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    kiln_tensor *x = kiln_reshape(kiln_arange(0, 24, 1, KILN_F32), 3, in_shape), *y;
    ck_assert_msg(kiln_call(f, &x, &y) == 0, "%s", kiln_last_error());
    assert_close(y, kiln_reshape(x, 2, out_shape), 0, 0, "flatten");
    kiln_fn_stats_t st;
    kiln_fn_stats(f, &st);
    ck_assert_int_eq(st.graph_breaks, 0);
    ck_assert_int_eq(st.eager_fallbacks, 0);
    ck_assert_int_eq(st.traces, 1);
    kiln_fn_free(f);
}
END_TEST

/* A max pool with dilated windows, padding and ceil mode against a loop
 * over each window's elements within the input (PyTorch's sizes: a last
 * window starts within the input or its first pad). */
START_TEST(test_dilated_max_pool)
{
    enum { H = 7, W = 8, K = 3, S = 2, D = 2, P = 1 };
    static const int64_t in_shape[4] = {1, 1, H, W}, k[2] = {K, K}, st[2] = {S, S}, dil[2] = {D, D},
                         pads[4] = {P, P, P, P};
    int64_t oh = (H + 2 * P - D * (K - 1) - 1 + S - 1) / S + 1, ow = (W + 2 * P - D * (K - 1) - 1 + S - 1) / S + 1;
    oh -= (oh - 1) * S >= H + P;
    ow -= (ow - 1) * S >= W + P;
    int64_t out_shape[4] = {1, 1, oh, ow};
    model m;
    model_init(&m);
    Onnx__NodeProto *n = add_node(&m, "MaxPool", "pool", "x", "y");
    add_ints_attr(&m, n, "kernel_shape", k, 2);
    add_ints_attr(&m, n, "strides", st, 2);
    add_ints_attr(&m, n, "dilations", dil, 2);
    add_ints_attr(&m, n, "pads", pads, 4);
    add_int_attr(&m, n, "ceil_mode", 1);
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, in_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, out_shape);
    const char *path = save(&m, "dilated.onnx");
    float x[H * W], want[64];
    for (int i = 0; i < H * W; i++)
        x[i] = (float)((i * 37) % 23) - 11;
    for (int64_t r = 0; r < oh; r++)
        for (int64_t c = 0; c < ow; c++) {
            float best = -INFINITY;
            for (int i = 0; i < K; i++)
                for (int j = 0; j < K; j++) {
                    int64_t y = r * S - P + i * D, xx = c * S - P + j * D;
                    if (y >= 0 && y < H && xx >= 0 && xx < W && x[y * W + xx] > best)
                        best = x[y * W + xx];
                }
            want[r * ow + c] = best;
        }
    for (int mode = 0; mode < 2; mode++) {
        kiln_fn *f = load_in_mode(path, mode);
        kiln_tensor *in = kiln_from_data(KILN_F32, 4, in_shape, x), *y = NULL;
        ck_assert_msg(kiln_call(f, &in, &y) == 0, "%s", kiln_last_error());
        assert_close(y, kiln_from_data(KILN_F32, 4, out_shape, want), 0, 0, "dilated max pool");
        kiln_fn_free(f);
    }
}
END_TEST

/* ResNet's tail: a 1x1 Conv, Relu and GlobalAveragePool, and the same with
 * kiln ops (kiln_adaptive_avg_pool2d), traced with the weights captured. */
static const int64_t tail_x_shape[4] = {2, 8, 5, 5}, tail_w_shape[4] = {6, 8, 1, 1}, tail_y_shape[4] = {2, 6, 1, 1};

static int tail_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_adaptive_avg_pool2d(kiln_relu(kiln_conv2d(in[0], user, NULL, NULL)), 1, 1);
    return out[0] ? 0 : -1;
}

/* The model launches as many kernels as the kiln-ops form: the pool is one
 * mean over H and W (a mean an axis left the product's ReLU unfused, the
 * product run alone and two reductions after it), and gives its values. */
START_TEST(test_global_pool_kernels)
{
    float w[48];
    for (int i = 0; i < 48; i++)
        w[i] = (float)((i * 7) % 11) / 11 - 0.4f;
    model m;
    model_init(&m);
    add_node(&m, "Conv", "conv", "x w", "h");
    add_node(&m, "Relu", "act", "h", "r");
    add_node(&m, "GlobalAveragePool", "pool", "r", "y");
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, tail_x_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, tail_y_shape);
    add_floats(&m, "w", 4, tail_w_shape, w, 48);
    use_raw_data(&m);
    kiln_fn *f = kiln_onnx_load(save(&m, "tail.onnx"), NULL);
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    kiln_tensor *weights = kiln_from_data(KILN_F32, 4, tail_w_shape, w);
    kiln_fn *g = kiln_jit("tail", tail_body, 1, 1, weights, NULL);
    kiln_tensor *x = kiln_randn(4, tail_x_shape, 5), *got = NULL, *want = NULL;
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    ck_assert_msg(kiln_call(g, &x, &want) == 0, "%s", kiln_last_error());
    assert_close(got, want, 1e-6, 1e-6, "pooled");
    kiln_fn_stats_t onnx_st, kiln_st;
    kiln_fn_stats(f, &onnx_st);
    kiln_fn_stats(g, &kiln_st);
    ck_assert_int_eq(onnx_st.kernels, kiln_st.kernels);
    kiln_fn_free(g);
    kiln_fn_free(f);
}
END_TEST

/* -- CUDA inputs -------------------------------------------------------------------- */

/* y = reshape(relu(x @ w + b) + c, [4, 2]), c a Constant node's 4 floats,
 * the shape an int64 initializer in raw data. */
static void device_model(model *m)
{
    static const float c[4] = {1, 2, 3, 4};
    static int64_t two = 2, target[2] = {4, 2};
    dense_model(m);
    free(m->node_ptrs[2]->output[0]); /* Relu's result, no longer y */
    m->node_ptrs[2]->output[0] = strdup("r");
    Onnx__NodeProto *constant = add_node(m, "Constant", "c", "", "c");
    Onnx__AttributeProto *a = add_attr(m, constant, "value_floats", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
    a->floats = (float *)c;
    a->n_floats = 4;
    add_node(m, "Add", "plus_c", "r c", "s");
    add_node(m, "Reshape", "fold", "s shape", "y");
    m->dims[1][0].dim_value = 4; /* y's declared shape */
    m->dims[1][1].dim_value = 2;
    add_floats(m, "shape", 1, &two, (const float *)target, 2);
    use_raw_data(m);
    Onnx__TensorProto *t = m->init_ptrs[m->n_inits - 1];
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    t->raw_data.len = sizeof target;
}

/* y = x [1, 1, 2, 3] resized linearly to [1, 1, 4, 6]: positions and weights
 * are constants the handler makes. */
static const char *resize_model(void)
{
    static const int64_t in_shape[4] = {1, 1, 2, 3}, out_shape[4] = {1, 1, 4, 6}, four = 4;
    static const float scales[4] = {1, 1, 2, 2};
    model m;
    model_init(&m);
    Onnx__NodeProto *n = add_node(&m, "Resize", "up", "x - scales", "y");
    Onnx__AttributeProto *a = add_attr(&m, n, "mode", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    a->has_s = true;
    a->s.data = (uint8_t *)"linear";
    a->s.len = 6;
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, in_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, out_shape);
    add_floats(&m, "scales", 1, &four, scales, 4);
    return save(&m, "resize.onnx");
}

/* y = x [1, 1, 2, 3] resized by scales: the model's file. */
static const char *resize_by(const float scales[4], const char *file)
{
    static const int64_t in_shape[4] = {1, 1, 2, 3}, four = 4;
    model m;
    model_init(&m);
    add_node(&m, "Resize", "up", "x - scales", "y");
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, in_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, NULL);
    add_floats(&m, "scales", 1, &four, scales, 4);
    return save(&m, file);
}

/* An i64 initializer of n values, shape [n] (the values borrowed). */
static void add_int64s(model *m, const char *name, const int64_t *n, const int64_t *values)
{
    add_floats(m, name, 1, n, (const float *)values, 2 * (size_t)*n);
    use_raw_data(m);
    m->init_ptrs[m->n_inits - 1]->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
}

/* One node of op on x of shape [4] (operands "x" and maybe "k", an i64
 * initializer; an int attribute name = v unless name is NULL) into y. */
static const char *one_node(const char *op, const char *ins, const int64_t shape[4], const int64_t *n_k,
                            const int64_t *k, const char *name, int64_t v, const char *file)
{
    model m;
    model_init(&m);
    Onnx__NodeProto *node = add_node(&m, op, "n", ins, "y");
    if (name)
        add_int_attr(&m, node, name, v);
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, NULL);
    if (k)
        add_int64s(&m, "k", n_k, k);
    return save(&m, file);
}

/* Sizes from a model that would wrap int64 or size a table past memory
 * (a pad of INT64_MIN, a blocksize of 2^40, or 2^29 on an empty image
 * whose channels it multiplies, a Resize to 2^61 positions) fail the call
 * naming the value, where they overflowed (undefined) or wrote past a
 * buffer. */
START_TEST(test_sizes_that_would_wrap)
{
    static const int64_t image[4] = {1, 4, 2, 2}, empty[4] = {1, 1024, 0, 0}, eight = 8, four = 4;
    static const int64_t pads[8] = {INT64_MIN, 0, 0, 0, 0, 0, 0, 0}, sizes[4] = {1, 4, (INT64_C(1) << 61) + 1, 2};
    const char *says[4] = {"past 2^59", "blocksize", "blocksize", "past 2^59"};
    for (int i = 0; i < 4; i++) {
        const char *file = i == 0   ? one_node("Pad", "x k", image, &eight, pads, NULL, 0, "pad.onnx")
                           : i == 1 ? one_node("DepthToSpace", "x", image, NULL, NULL, "blocksize", INT64_C(1) << 40,
                                               "d2s.onnx")
                           : i == 2 ? one_node("SpaceToDepth", "x", empty, NULL, NULL, "blocksize", INT64_C(1) << 29,
                                               "s2d.onnx")
                                    : one_node("Resize", "x - - k", image, &four, sizes, NULL, 0, "sizes.onnx");
        kiln_fn *f = kiln_onnx_load(file, NULL);
        ck_assert_msg(f != NULL, "%d: %s", i, kiln_last_error());
        kiln_tensor *x = kiln_zeros(KILN_F32, 4, i == 2 ? empty : image), *y = NULL;
        ck_assert_int_lt(kiln_call(f, &x, &y), 0);
        ck_assert_kiln_error(says[i]);
        kiln_fn_free(f);
    }
    kiln_fn *f = kiln_onnx_load(one_node("Relu", "x", image, NULL, NULL, NULL, 0, "relu.onnx"), NULL);
    ck_assert_ptr_null(kiln_fn_io_name(f, false, INT_MAX));
    ck_assert_kiln_error("kiln_fn_io_name", "no input 2147483647");
    kiln_fn_free(f);
}
END_TEST

/* A scale that gives no size (NaN, negative, past 2^59 elements) fails the
 * call naming it, where it was converted to an integer (undefined). */
START_TEST(test_resize_scales_that_give_no_size)
{
    const float scales[3][4] = {{1, 1, 1e30f, 2}, {1, 1, NAN, 2}, {1, 1, -2, 2}};
    kiln_tensor *x = kiln_ones(KILN_F32, 4, (int64_t[]){1, 1, 2, 3}), *y = NULL;
    for (int i = 0; i < 3; i++) {
        kiln_fn *f = kiln_onnx_load(resize_by(scales[i], "scaled.onnx"), NULL);
        ck_assert_msg(f != NULL, "%s", kiln_last_error());
        ck_assert_int_lt(kiln_call(f, &x, &y), 0);
        ck_assert_kiln_error("Resize", "scale", "gives no size");
        kiln_fn_free(f);
    }
}
END_TEST

/* The CUDA copy of initializer name f's model keeps, or NULL. */
static const kiln_tensor *cuda_constant(const kiln_fn *f, const char *name)
{
    const onnx_model *m = jit_user(f);
    for (int i = 0; m->cuda_constants && i < m->n_values; i++)
        if (!strcmp(m->value_names[i], name))
            return m->cuda_constants[i];
    return NULL;
}

/* A model called with CUDA inputs runs on CUDA: its initializers are moved
 * there once, at the first such call, and kept; a Constant node's result
 * goes with them, and so do constants a handler makes (Resize's). */
START_TEST(test_cuda_inputs)
{
    ck_assert_msg(kiln_cuda_available() == 1, "%s", kiln_last_error());
    model m;
    device_model(&m);
    const char *path = save(&m, "device.onnx");
    for (int mode = 0; mode < 2; mode++) {
        kiln_fn *f = load_in_mode(path, mode);
        kiln_tensor *x = dense_input(), *on_cpu = NULL, *y = NULL;
        ck_assert_msg(kiln_call(f, &x, &on_cpu) == 0, "%s", kiln_last_error());
        ck_assert_ptr_null(cuda_constant(f, "w"));
        kiln_tensor *x_cuda = kiln_to_device(x, KILN_CUDA);
        const kiln_tensor *w_cuda = NULL;
        for (int call = 0; call < 2; call++) {
            ck_assert_msg(kiln_call(f, &x_cuda, &y) == 0, "mode %d call %d: %s", mode, call, kiln_last_error());
            ck_assert_int_eq(kiln_device_of(y), KILN_CUDA);
            assert_close(kiln_to_device(y, KILN_CPU), on_cpu, 1e-6, 1e-6, "on CUDA");
            if (call == 0)
                w_cuda = cuda_constant(f, "w");
            ck_assert_ptr_nonnull(w_cuda);
            ck_assert_ptr_eq(cuda_constant(f, "w"), w_cuda);
            ck_assert_int_eq(kiln_device_of(w_cuda), KILN_CUDA);
        }
        kiln_fn_free(f);
    }
    const char *resize = resize_model();
    static const int64_t in_shape[4] = {1, 1, 2, 3};
    for (int mode = 0; mode < 2; mode++) {
        kiln_fn *f = load_in_mode(resize, mode);
        kiln_tensor *x = kiln_reshape(kiln_arange(0, 6, 1, KILN_F32), 4, in_shape), *on_cpu = NULL, *y = NULL;
        kiln_tensor *x_cuda = kiln_to_device(x, KILN_CUDA);
        ck_assert_msg(kiln_call(f, &x, &on_cpu) == 0, "%s", kiln_last_error());
        ck_assert_msg(kiln_call(f, &x_cuda, &y) == 0, "resize, mode %d: %s", mode, kiln_last_error());
        ck_assert_int_eq(kiln_device_of(y), KILN_CUDA);
        assert_close(kiln_to_device(y, KILN_CPU), on_cpu, 1e-6, 1e-6, "resized on CUDA");
        kiln_fn_free(f);
    }
}
END_TEST

/* -- Malformed models ----------------------------------------------------------------- */

static void assert_load_fails(const char *path, const char *needle1, const char *needle2)
{
    kiln_clear_error();
    kiln_fn *f = kiln_onnx_load(path, NULL);
    ck_assert_msg(f == NULL, "loaded %s", path);
    ck_assert_kiln_error("kiln_onnx_load", needle1, needle2);
}

START_TEST(test_garbage_and_wrong_types)
{
    write_all(tmp_path("garbage.onnx"), "not a model at all", 18);
    assert_load_fails(tmp_path("garbage.onnx"), "not a serialized ONNX model", "garbage.onnx");
    /* field 7 (graph) sent as a varint: the wrong wire type */
    write_all(tmp_path("wire.onnx"), "\x08\x08\x38\x01", 4);
    assert_load_fails(tmp_path("wire.onnx"), "not a serialized ONNX model", "wrong type");
    write_all(tmp_path("empty.onnx"), "", 0);
    assert_load_fails(tmp_path("empty.onnx"), "has no graph", "empty.onnx");
    assert_load_fails(tmp_dir, "is a directory", tmp_dir);
    assert_load_fails(tmp_path("absent.onnx"), "cannot open", "absent.onnx");
    ck_assert_ptr_null(kiln_onnx_load(NULL, NULL));
    ck_assert_kiln_error("kiln_onnx_load", "path");
}
END_TEST

/* Every prefix of a model, and models with bytes changed, load or fail
 * with an error; what loads runs or fails with an error. Never a crash. */
START_TEST(test_truncated_and_mutated)
{
    model m;
    dense_model(&m);
    size_t size;
    uint8_t *bytes = pack(&m, &size);
    model_free(&m);
    kiln_tensor *x = dense_input();
    int mutations = UNDER_VALGRIND() ? 60 : 600;
    kiln_jit_options o = kiln_jit_defaults(); /* the loader is under test, not the code generator */
    o.backend = KILN_BACKEND_INTERP;
    for (size_t i = 0; i < size + (size_t)mutations; i++) {
        uint8_t *copy = malloc(size);
        memcpy(copy, bytes, size);
        size_t len = i < size ? i : size;
        if (i >= size) {
            uint64_t r = (i * 0x9e3779b97f4a7c15u) >> 17;
            copy[r % size] ^= (uint8_t)(1u << (r / size % 8));
        }
        write_all(tmp_path("cut.onnx"), copy, len);
        free(copy);
        kiln_clear_error();
        kiln_fn *f = kiln_onnx_load(tmp_path("cut.onnx"), &o);
        if (!f) {
            ck_assert_msg(strstr(kiln_last_error(), "kiln_onnx_load"), "at %zu: %s", i, kiln_last_error());
            continue;
        }
        int n_in, n_out;
        kiln_fn_arity(f, &n_in, &n_out);
        kiln_tensor *in[4] = {x, x, x, x}, *out[8] = {NULL};
        if (n_in <= 4 && n_out <= 8 && kiln_call(f, in, out) < 0)
            ck_assert_msg(kiln_last_error()[0], "call failed without an error at %zu", i);
        kiln_fn_free(f);
    }
    free(bytes);
}
END_TEST

START_TEST(test_cycle)
{
    model m;
    model_init(&m);
    add_node(&m, "Add", "first", "x b", "a");
    add_node(&m, "Relu", "second", "a", "b");
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    add_value(&m, true, "b", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    assert_load_fails(save(&m, "cycle.onnx"), "cycle", "(Add)");
}
END_TEST

START_TEST(test_undefined_values)
{
    model m;
    dense_model(&m);
    m.n_inits = 1; /* b, an initializer, left out */
    assert_load_fails(save(&m, "no_init.onnx"), "node 1 'bias' (Add)", "operand 1 'b' is not defined");
    dense_model(&m);
    m.out_ptrs[0]->name = "nowhere";
    assert_load_fails(save(&m, "no_output.onnx"), "output 'nowhere'", "not defined");
    dense_model(&m);
    add_node(&m, "Relu", "again", "h", "h2");
    assert_load_fails(save(&m, "twice.onnx"), "'again' (Relu)", "already defined");
}
END_TEST

START_TEST(test_huge_dims)
{
    model m;
    static const int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40}, big[1] = {INT64_C(1) << 62};
    dense_model(&m);
    m.init_ptrs[0]->dims = (int64_t *)huge;
    assert_load_fails(save(&m, "huge_init.onnx"), "'w'", "more than 2^59 elements");
    dense_model(&m);
    m.init_ptrs[1]->dims = (int64_t *)big;
    assert_load_fails(save(&m, "big_init.onnx"), "'b'", "more than 2^59 elements");
    dense_model(&m);
    m.shapes[0].dim[1]->dim_value = INT64_C(1) << 62;
    assert_load_fails(save(&m, "huge_input.onnx"), "input 'x'", "declares size");
    dense_model(&m);
    m.init_ptrs[0]->raw_data.len = 11 * sizeof(float);
    assert_load_fails(save(&m, "short_raw.onnx"), "'w' has 12 elements by its shape", "raw data of 44 bytes");
    dense_model(&m);
    m.init_ptrs[1]->n_float_data = 3;
    assert_load_fails(save(&m, "short_init.onnx"), "'b' has 4 elements by its shape", "typed values of 3");
}
END_TEST

START_TEST(test_unsupported)
{
    model m;
    dense_model(&m);
    m.nodes[0].op_type = "LSTM";
    assert_load_fails(save(&m, "lstm.onnx"), "node 0 'mm' (LSTM)", "operator LSTM is not supported");
    dense_model(&m);
    add_int_attr(&m, &m.nodes[2], "frobnicate", 1);
    assert_load_fails(save(&m, "attr.onnx"), "node 2 'act' (Relu)", "attribute 'frobnicate' is not supported");
    dense_model(&m);
    m.tensor_types[0].elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
    assert_load_fails(save(&m, "half.onnx"), "input 'x'", "FLOAT16");
    dense_model(&m);
    m.opset = 18;
    assert_load_fails(save(&m, "opset.onnx"), "opset 18", "not supported");
    dense_model(&m);
    m.nodes[1].domain = "com.microsoft";
    assert_load_fails(save(&m, "domain.onnx"), "(Add)", "domain 'com.microsoft'");
    model_init(&m);
    add_node(&m, "Add", "bias", "x x x", "y");
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    assert_load_fails(save(&m, "arity.onnx"), "'bias' (Add)", "3 operands");
}
END_TEST

/* A shape error while running names the node and the kiln op. */
START_TEST(test_runtime_error_names_node)
{
    model m;
    dense_model(&m);
    for (int mode = 0; mode < 2; mode++) {
        kiln_fn *f = kiln_onnx_load(save(&m, "dense2.onnx"), NULL);
        dense_model(&m);
        ck_assert_ptr_nonnull(f);
        int64_t wrong[2] = {2, 5};
        kiln_tensor *x = kiln_zeros(KILN_F32, 2, wrong), *y = NULL;
        ck_assert_int_lt(kiln_call(f, &x, &y), 0);
        ck_assert_kiln_error("node 0 'mm' (MatMul)", "kiln_matmul");
        kiln_fn_free(f);
    }
    model_free(&m);
}
END_TEST

/* An ints attribute longer than kiln reads is an error naming it (it was
 * read as a count of 63 values). */
START_TEST(test_too_many_ints)
{
    model m;
    model_init(&m);
    int64_t perm[65] = {1, 0};
    add_ints_attr(&m, add_node(&m, "Transpose", "t", "x", "y"), "perm", perm, 65);
    add_value(&m, false, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, x_shape);
    add_value(&m, true, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){3, 2});
    kiln_fn *f = kiln_onnx_load(save(&m, "perm.onnx"), NULL);
    ck_assert_msg(f != NULL, "%s", kiln_last_error());
    kiln_tensor *x = kiln_zeros(KILN_F32, 2, x_shape), *y = NULL;
    ck_assert_int_lt(kiln_call(f, &x, &y), 0);
    ck_assert_kiln_error("node 0 't' (Transpose)", "attribute 'perm' has 65 values");
    kiln_fn_free(f);
}
END_TEST

/* -- Export ------------------------------------------------------------------------- */

/* Random programs (no random values or writebacks: ONNX has neither)
 * exported, loaded back and run on the same inputs give the same values;
 * python3-onnx's checker, where it is, accepts every file. */
START_TEST(test_export_round_trip)
{
    int count = (int)(getenv("KILN_PROGEN_COUNT") ? atoi(getenv("KILN_PROGEN_COUNT")) : 120);
    /* the ops whose graph nodes have an ONNX form that computes the same */
    static const progen_op exported[] = {
        PROGEN_ADD, PROGEN_SUB, PROGEN_MUL, PROGEN_DIV, PROGEN_POW, PROGEN_MAXIMUM, PROGEN_MINIMUM,
        PROGEN_ADD_SCALAR, PROGEN_SUB_SCALAR, PROGEN_MUL_SCALAR, PROGEN_DIV_SCALAR, PROGEN_POW_SCALAR,
        PROGEN_MAXIMUM_SCALAR, PROGEN_MINIMUM_SCALAR, PROGEN_EQ, PROGEN_NE, PROGEN_LT, PROGEN_LE, PROGEN_GT,
        PROGEN_GE, PROGEN_WHERE, PROGEN_NEG, PROGEN_ABS, PROGEN_EXP, PROGEN_LOG, PROGEN_SQRT, PROGEN_RSQRT,
        PROGEN_TANH, PROGEN_SIGMOID, PROGEN_RELU, PROGEN_SIN, PROGEN_COS, PROGEN_ERF, PROGEN_CAST, PROGEN_SUM,
        PROGEN_MEAN, PROGEN_MAX, PROGEN_MIN, PROGEN_ARGMAX, PROGEN_RESHAPE, PROGEN_PERMUTE, PROGEN_TRANSPOSE,
        PROGEN_EXPAND, PROGEN_SLICE, PROGEN_CONCAT, PROGEN_SQUEEZE, PROGEN_UNSQUEEZE, PROGEN_CONTIGUOUS,
        PROGEN_MATMUL, PROGEN_SOFTMAX, PROGEN_LOG_SOFTMAX, PROGEN_LAYER_NORM, PROGEN_GELU, PROGEN_SILU,
        PROGEN_FULL, PROGEN_ZEROS, PROGEN_ONES, PROGEN_ARANGE, PROGEN_SCALAR, PROGEN_FROM_DATA, PROGEN_FLOOR,
        PROGEN_CEIL, PROGEN_ROUND, PROGEN_TAN, PROGEN_ATAN, PROGEN_PROD, PROGEN_ARGMIN, PROGEN_GATHER,
        PROGEN_INDEX_SELECT, PROGEN_EMBEDDING, PROGEN_CUMSUM, PROGEN_CONV2D,
    };
    progen_options po = {0};
    for (size_t i = 0; i < sizeof exported / sizeof *exported; i++)
        po.ops |= PROGEN_OP_BIT(exported[i]);
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    char files[8192] = "";
    size_t used = 0;
    for (int s = 1; s <= count; s++) {
        kiln_scope_begin();
        progen_program *p = progen_new((uint64_t)s, &po);
        int n_in = progen_n_inputs(p), n_out = progen_n_outputs(p);
        kiln_tensor *in[PROGEN_MAX_INPUTS], *want[PROGEN_MAX_OUTPUTS] = {NULL}, *got[PROGEN_MAX_OUTPUTS] = {NULL};
        kiln_spec specs[PROGEN_MAX_INPUTS];
        for (int i = 0; i < n_in; i++) {
            in[i] = progen_make_input(p, i, (uint64_t)s * 31 + (uint64_t)i);
            specs[i] = kiln_spec_of(in[i]);
        }
        kiln_fn *f = kiln_jit("random", progen_body, n_in, n_out, p, &o);
        char name[32];
        snprintf(name, sizeof name, "random%d.onnx", s);
        char *listing = progen_describe(p);
        ck_assert_msg(kiln_onnx_export(f, specs, tmp_path(name)) == 0, "seed %d: %s\n%s", s, kiln_last_error(),
                      listing);
        ck_assert_int_eq(kiln_call(f, in, want), 0);
        kiln_fn *g = kiln_onnx_load(tmp_path(name), &o);
        ck_assert_msg(g != NULL, "seed %d: %s\n%s", s, kiln_last_error(), listing);
        ck_assert_msg(kiln_call(g, in, got) == 0, "seed %d: %s\n%s", s, kiln_last_error(), listing);
        for (int k = 0; k < n_out; k++) {
            char what[64];
            snprintf(what, sizeof what, "seed %d output %d", s, k);
            if (kiln_dtype_of(want[k]) != kiln_dtype_of(got[k]) || kiln_ndim(want[k]) != kiln_ndim(got[k]))
                ck_abort_msg("%s: %s\n%s", what, kiln_fn_graph_text(f), listing);
            assert_close(got[k], want[k], 1e-5, 1e-6, what);
        }
        if (used + strlen(name) + 2 + strlen(tmp_dir) < sizeof files)
            used += (size_t)snprintf(files + used, sizeof files - used, " %s", tmp_path(name));
        free(listing);
        kiln_fn_free(g);
        kiln_fn_free(f);
        progen_free(p);
        kiln_scope_end();
    }
    const char *python = getenv("KILN_TEST_ONNX_PYTHON");
    if (!python || !*python) {
        printf("onnx: export checked by loading back only (python3 with the onnx module is absent: "
               "Debian python3-onnx)\n");
        return;
    }
    char cmd[8192 + 512];
    snprintf(cmd, sizeof cmd, "%s -c 'import onnx, sys\nfor p in sys.argv[1:]: "
             "onnx.checker.check_model(onnx.load(p), full_check=True)'%s", python, files);
    ck_assert_msg(system(cmd) == 0, "onnx.checker refused an exported model: %s", cmd);
}
END_TEST

static int conv_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    const kiln_conv2d_params p = {{2, 1}, {1, 2}, {1, 2}, 2};
    out[0] = kiln_relu(kiln_conv2d(in[0], in[1], in[2], &p));
    return out[0] ? 0 : -1;
}

/* A convolution traced on the CPU is one conv2d node: exported as Conv
 * (strides, pads, dilations, group), loaded back, it computes the same. */
START_TEST(test_export_conv)
{
    kiln_tensor *in[3] = {kiln_randn(4, (int64_t[]){2, 4, 7, 9}, 1), kiln_randn(4, (int64_t[]){6, 2, 3, 3}, 2),
                          kiln_randn(1, (int64_t[]){6}, 3)};
    kiln_spec specs[3];
    for (int i = 0; i < 3; i++)
        specs[i] = kiln_spec_of(in[i]);
    kiln_fn *f = kiln_jit("conv", conv_body, 3, 1, NULL, NULL);
    ck_assert_msg(kiln_onnx_export(f, specs, tmp_path("conv.onnx")) == 0, "%s", kiln_last_error());
    kiln_fn *g = kiln_onnx_load(tmp_path("conv.onnx"), NULL);
    ck_assert_msg(g != NULL, "%s", kiln_last_error());
    kiln_tensor *want = NULL, *got = NULL;
    ck_assert_int_eq(kiln_call(f, in, &want), 0);
    char *text = kiln_fn_graph_text(f);
    ck_assert_msg(text && strstr(text, "conv2d"), "no conv2d node:\n%s", text ? text : kiln_last_error());
    free(text);
    ck_assert_msg(kiln_call(g, in, &got) == 0, "%s", kiln_last_error());
    assert_close(got, want, 1e-5, 1e-6, "conv");
    kiln_release(want);
    kiln_release(got);
    kiln_fn_free(g);
    kiln_fn_free(f);
    for (int i = 0; i < 3; i++)
        kiln_release(in[i]);
}
END_TEST

/* Ops whose ONNX forms once computed something else: argmin of the
 * int64 minimum (taken as argmax of the negation, which overflows) and of
 * bools (cast back to bool), a one-element slice with a huge step (its
 * end overflowed to nothing), tan (sin / cos, ulps off kiln_tan). */
static int edges_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_argmin(in[0], 0, true);
    out[1] = kiln_argmin(kiln_gt(in[1], kiln_scalar(0)), 1, false);
    out[2] = kiln_slice(in[1], 1, 2, 6, INT64_MAX);
    out[3] = kiln_tan(in[1]);
    return out[0] && out[1] && out[2] && out[3] ? 0 : -1;
}

START_TEST(test_export_edges)
{
    const int64_t ints[6] = {5, INT64_MIN, -3, INT64_MIN, 7, 0};
    kiln_tensor *in[2] = {kiln_from_data(KILN_I64, 2, (int64_t[]){3, 2}, ints),
                          kiln_randn(2, (int64_t[]){16, 8}, 5)};
    kiln_spec specs[2] = {kiln_spec_of(in[0]), kiln_spec_of(in[1])};
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("edges", edges_body, 2, 4, NULL, &o);
    ck_assert_msg(kiln_onnx_export(f, specs, tmp_path("edges.onnx")) == 0, "%s", kiln_last_error());
    kiln_fn *g = kiln_onnx_load(tmp_path("edges.onnx"), &o);
    ck_assert_msg(g != NULL, "%s", kiln_last_error());
    kiln_tensor *want[4] = {NULL}, *got[4] = {NULL};
    ck_assert_int_eq(kiln_call(f, in, want), 0);
    ck_assert_msg(kiln_call(g, in, got) == 0, "%s", kiln_last_error());
    static const char *what[4] = {"argmin of int64", "argmin of bool", "slice with a huge step", "tan"};
    for (int k = 0; k < 4; k++)
        assert_close(got[k], want[k], 0, 0, what[k]);
    kiln_fn_free(g);
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_export_refuses)
{
    kiln_fn *f = kiln_jit("plain", progen_body, 1, 1, NULL, NULL);
    kiln_spec spec = {KILN_F32, 1, {4}, KILN_CPU, 1};
    ck_assert_int_lt(kiln_onnx_export(f, &spec, tmp_path("dyn.onnx")), 0);
    ck_assert_kiln_error("kiln_onnx_export", "dynamic");
    ck_assert_int_lt(kiln_onnx_export(NULL, &spec, tmp_path("null.onnx")), 0);
    ck_assert_kiln_error("kiln_onnx_export", "f");
    /* specs kiln has no tensor for are refused before anything is traced */
    const kiln_spec bad[] = {{42, 1, {4}, KILN_CPU, 0},      {KILN_F32, 100, {4}, KILN_CPU, 0},
                             {KILN_F32, -3, {4}, KILN_CPU, 0}, {KILN_F32, 1, {-7}, KILN_CPU, 0},
                             {KILN_F32, 3, {INT64_C(1) << 40, INT64_C(1) << 40, INT64_C(1) << 40}, KILN_CPU, 0},
                             {KILN_F32, 1, {4}, 7, 0}};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        kiln_clear_error();
        ck_assert_int_lt(kiln_onnx_export(f, &bad[i], tmp_path("bad.onnx")), 0);
        ck_assert_kiln_error("kiln_onnx_export", "spec 0");
    }
    ck_assert_int_eq(mkfifo(tmp_path("fifo.onnx"), 0600), 0);
    spec.dynamic = 0;
    ck_assert_int_lt(kiln_onnx_export(f, &spec, tmp_path("fifo.onnx")), 0);
    ck_assert_kiln_error("kiln_onnx_export", "fifo.onnx", "a FIFO");
    kiln_fn_free(f);
}
END_TEST

static void setup(void)
{
    test_scoped_setup();
    test_tmp_setup("kiln-onnx");
}

static void teardown(void)
{
    test_tmp_teardown();
    test_scoped_teardown();
}

static Suite *onnx_suite(void)
{
    Suite *s = suite_create("onnx");
    TCase *load = tcase_create("load"), *export = tcase_create("export");
    for (TCase *tc = load; tc; tc = tc == load ? export : NULL) {
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 600);
    }
    tcase_add_test(load, test_load_and_call);
    tcase_add_test(load, test_weights_share_a_block);
    tcase_add_test(load, test_graph_in_two_pieces);
    tcase_add_test(load, test_dilated_max_pool);
    tcase_add_test(load, test_global_pool_kernels);
    tcase_add_test(load, test_default_io_names);
    tcase_add_test(load, test_shape_arithmetic_folds);
    tcase_add_test(load, test_garbage_and_wrong_types);
    tcase_add_test(load, test_resize_scales_that_give_no_size);
    tcase_add_test(load, test_sizes_that_would_wrap);
    tcase_add_test(load, test_truncated_and_mutated);
    tcase_add_test(load, test_cycle);
    tcase_add_test(load, test_undefined_values);
    tcase_add_test(load, test_huge_dims);
    tcase_add_test(load, test_unsupported);
    tcase_add_test(load, test_runtime_error_names_node);
    tcase_add_test(load, test_too_many_ints);
    suite_add_tcase(s, load);
    tcase_add_test(export, test_export_round_trip);
    tcase_add_test(export, test_export_conv);
    tcase_add_test(export, test_export_edges);
    tcase_add_test(export, test_export_refuses);
    suite_add_tcase(s, export);
    /* suite onnx-cuda-emulated: the stand-in driver runs the kernels */
    const char *device = getenv("KILN_TEST_DEVICE");
    if (device && !strcmp(device, "cuda")) {
        TCase *cuda = tcase_create("cuda");
        tcase_add_checked_fixture(cuda, setup, teardown);
        tcase_set_timeout(cuda, 600);
        tcase_add_test(cuda, test_cuda_inputs);
        suite_add_tcase(s, cuda);
    }
    return s;
}

KILN_TEST_MAIN(onnx_suite)
