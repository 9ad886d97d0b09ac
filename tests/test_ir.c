/* The graph IR on its own: hash-consing, the canonical text and its parser,
 * the verifier, and every rewrite of the passes, each shown firing and shown
 * not firing where it would change a value. */
#include "test_common.h"

#include <stdint.h>

#include "ir/ir.h"
#include "eager/eager.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
/* Arguments for a shape: SHAPE(4, 8) is "2, (int64_t[]){4, 8}"; SCALAR is 0-d. */
#define SHAPE(...) COUNT(((int64_t[]){__VA_ARGS__})), (int64_t[]){__VA_ARGS__}
#define SCALAR 0, NULL
/* Arguments for an operand list, likewise. */
#define OPS(...) COUNT(((ir_ref[]){__VA_ARGS__})), (ir_ref[]){__VA_ARGS__}
/* Every canonical text starts with this line. */
#define G "kiln-graph 1\n"

enum { ERR = 256 };

/* -- Building graphs ------------------------------------------------------- */

static ir_graph *new_graph(void)
{
    ir_graph *g = ir_graph_new();
    ck_assert_ptr_nonnull(g);
    return g;
}

/* ir_emit, which only fails when out of memory. */
static ir_ref emit(ir_graph *g, ir_op op, kiln_dtype dt, int ndim, const int64_t *shape, int n,
                   const ir_ref *operands, const ir_params *params)
{
    ir_ref r = ir_emit(g, op, dt, ndim, shape, n, operands, params);
    ck_assert_uint_ne(r, IR_NONE);
    return r;
}

static ir_ref source(ir_graph *g, ir_op op, int64_t index, kiln_dtype dt, int ndim,
                     const int64_t *shape)
{
    ir_params p = {.index = index};
    return emit(g, op, dt, ndim, shape, 0, NULL, &p);
}

static ir_ref input(ir_graph *g, int64_t index, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return source(g, OP_INPUT, index, dt, ndim, shape);
}

static ir_ref capture(ir_graph *g, int64_t index, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return source(g, OP_CAPTURE, index, dt, ndim, shape);
}

static ir_ref constant(ir_graph *g, kiln_dtype dt, double value)
{
    ir_params p = {.value = value};
    return emit(g, OP_CONST, dt, SCALAR, 0, NULL, &p);
}

/* How n counts in promotion: a scalar literal, a 0-d tensor or a tensor. */
static ir_rank_class rank_class(const ir_node *n)
{
    return n->op == OP_CONST && n->params.scalar ? IR_SCALAR : n->ndim == 0 ? IR_ZERO_DIM : IR_DIMS;
}

/* The dtype the op table gives op on these operands (the verifier's rule). */
static kiln_dtype rule_dtype(const ir_graph *g, ir_op op, ir_ref a, ir_ref b)
{
    const ir_node *x = &g->nodes[a], *y = &g->nodes[b];
    kiln_dtype promoted = ir_promote(x->dtype, rank_class(x), y->dtype, rank_class(y));
    int dt = ir_result_dtype(ir_ops[op].rule, promoted);
    ck_assert_int_ge(dt, 0);
    return (kiln_dtype)dt;
}

static ir_ref unary(ir_graph *g, ir_op op, ir_ref a)
{
    ir_node x = g->nodes[a]; /* a copy: emitting may move the node array */
    return emit(g, op, rule_dtype(g, op, a, a), x.ndim, x.shape, OPS(a), NULL);
}

/* a op b with numpy broadcasting and the op's dtype rule. */
static ir_ref binary(ir_graph *g, ir_op op, ir_ref a, ir_ref b)
{
    ir_node x = g->nodes[a], y = g->nodes[b];
    int ndim = x.ndim > y.ndim ? x.ndim : y.ndim;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        int i = d - (ndim - x.ndim), j = d - (ndim - y.ndim);
        int64_t sx = i < 0 ? 1 : x.shape[i], sy = j < 0 ? 1 : y.shape[j];
        shape[d] = sx == 1 ? sy : sx;
    }
    return emit(g, op, rule_dtype(g, op, a, b), ndim, shape, OPS(a, b), NULL);
}

/* A reduction over axis (or KILN_ALL) with the shape the verifier expects. */
static ir_ref reduce(ir_graph *g, ir_op op, ir_ref a, int axis, bool keepdim)
{
    ir_node x = g->nodes[a];
    ir_params p = {.axis = axis, .keepdim = keepdim};
    int ndim = 0;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < x.ndim; d++) {
        bool reduced = axis == KILN_ALL || d == axis;
        if (!reduced || keepdim)
            shape[ndim++] = reduced ? 1 : x.shape[d];
    }
    return emit(g, op, rule_dtype(g, op, a, a), ndim, shape, OPS(a), &p);
}

/* A movement op of a to shape, keeping a's dtype. */
static ir_ref move(ir_graph *g, ir_op op, ir_ref a, int ndim, const int64_t *shape,
                   const ir_params *p)
{
    return emit(g, op, g->nodes[a].dtype, ndim, shape, OPS(a), p);
}

static void add_output(ir_graph *g, ir_ref r)
{
    ck_assert_int_eq(ir_add_output(g, r), 0);
}

/* -- Text and checks ------------------------------------------------------- */

static char *text_of(const ir_graph *g)
{
    char *t = ir_to_text(g);
    ck_assert_ptr_nonnull(t);
    return t;
}

static void assert_text(const ir_graph *g, const char *want)
{
    char *got = text_of(g);
    ck_assert_msg(!strcmp(got, want), "got\n%s\nexpected\n%s", got, want);
    free(got);
}

static void assert_verifies(const ir_graph *g, const char *what)
{
    char err[ERR] = "";
    ck_assert_msg(ir_verify(g, err, sizeof err) == 0, "%s: %s", what, err);
}

static ir_graph *parse_ok(const char *text)
{
    char err[ERR];
    ir_graph *g = ir_parse(text, err, sizeof err);
    ck_assert_msg(g != NULL, "%s\nin\n%s", err, text);
    return g;
}

/* Asserts that text prints back to itself through a parse. */
static void assert_round_trip(const char *text)
{
    ir_graph *g = parse_ok(text);
    assert_text(g, text);
    ir_graph_free(g);
}

static int count_substr(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* -- A graph with every op ------------------------------------------------- */

/* Every op kind but assign (writebacks stand for it), constants that are hard
 * to print, two outputs and two writebacks. */
static ir_graph *every_op_graph(void)
{
    ir_graph *g = new_graph();
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    ir_ref y = input(g, 1, KILN_F32, SHAPE(2, 3));
    ir_ref idx = input(g, 2, KILN_I64, SHAPE(3));
    ir_ref w = capture(g, 0, KILN_F32, SHAPE(3, 2));
    ir_ref acc = capture(g, 1, KILN_F32, SHAPE(2, 3));

    const double awkward[] = {-0.0, NAN, INFINITY, -INFINITY, 0.1, 1e300, 5e-324,
                              9007199254740992.0, 123456789012345678.0};
    for (int i = 0; i < COUNT(awkward); i++)
        constant(g, KILN_F64, awkward[i]);
    constant(g, KILN_I64, -5);
    constant(g, KILN_BOOL, 1);
    emit(g, OP_CONST, KILN_F64, SCALAR, 0, NULL, &(ir_params){.value = 2.5, .scalar = 1});
    emit(g, OP_RAND, KILN_F32, SHAPE(2, 3), 0, NULL, &(ir_params){.index = INT64_MIN}); /* a seed: any bits */
    emit(g, OP_RANDN, KILN_F32, SHAPE(4), 0, NULL, &(ir_params){.index = 7});
    emit(g, OP_UNIFORM, KILN_F32, SHAPE(3), 0, NULL, &(ir_params){.index = 8}); /* words into the call's draw */
    /* 0-d arithmetic on constants, for the folding pass to find */
    ir_ref two = constant(g, KILN_F64, 2);
    binary(g, OP_MUL, two, constant(g, KILN_F64, 3));

    for (int op = 0; op < OP__COUNT; op++) {
        if (ir_ops[op].kind != KIND_ELEMENTWISE || op == OP_WHERE || op == OP_CAST)
            continue;
        if (ir_ops[op].arity == 2)
            binary(g, (ir_op)op, x, y);
        else
            unary(g, (ir_op)op, x);
    }
    ir_ref cond = binary(g, OP_LT, x, y);
    emit(g, OP_WHERE, KILN_F32, SHAPE(2, 3), OPS(cond, x, y), NULL);
    emit(g, OP_CAST, KILN_I32, SHAPE(2, 3), OPS(x), NULL);

    for (int op = 0; op < OP__COUNT; op++) {
        if (ir_ops[op].kind != KIND_REDUCTION)
            continue;
        reduce(g, (ir_op)op, x, KILN_ALL, false);
        reduce(g, (ir_op)op, x, 1, true);
    }

    move(g, OP_RESHAPE, x, SHAPE(3, 2), NULL);
    ir_ref xt = move(g, OP_PERMUTE, x, SHAPE(3, 2), &(ir_params){.perm = {1, 0}});
    move(g, OP_CONTIGUOUS, xt, SHAPE(3, 2), NULL);
    move(g, OP_EXPAND, idx, SHAPE(2, 3), NULL);
    move(g, OP_SLICE, x, SHAPE(2, 3), &(ir_params){.axis = 1, .start = 2, .step = -1});
    ir_ref joined = emit(g, OP_CONCAT, KILN_F32, SHAPE(6, 3), OPS(x, y, x), &(ir_params){.axis = 0});
    ir_ref product = emit(g, OP_MATMUL, KILN_F32, SHAPE(2, 2), OPS(x, w), NULL);
    emit(g, OP_CUMSUM, KILN_F32, SHAPE(2, 3), OPS(x), &(ir_params){.axis = 1});
    emit(g, OP_TOPK, KILN_I64, SHAPE(2, 2), OPS(x), &(ir_params){.axis = 1, .index = 2, .keepdim = 1});
    ir_ref where_idx = move(g, OP_EXPAND, idx, SHAPE(2, 3), NULL);
    emit(g, OP_GATHER, KILN_F32, SHAPE(2, 3), OPS(x, where_idx), &(ir_params){.axis = 0});
    emit(g, OP_INDEX_SELECT, KILN_F32, SHAPE(2, 3), OPS(x, idx), &(ir_params){.axis = 1});
    emit(g, OP_SCATTER_ADD, KILN_F32, SHAPE(2, 3), OPS(x, where_idx, y), &(ir_params){.axis = 0});
    ir_ref image = move(g, OP_RESHAPE, x, SHAPE(1, 2, 3, 1), NULL), filters = move(g, OP_RESHAPE, w, SHAPE(3, 2, 1, 1), NULL);
    emit(g, OP_CONV2D, KILN_F32, SHAPE(1, 3, 5, 1), OPS(image, filters), &(ir_params){.perm = {1, 1, 1, 0, 1, 1, 1}});

    add_output(g, product);
    add_output(g, joined);
    ck_assert_int_eq(ir_add_writeback(g, 0, unary(g, OP_NEG, w)), 0);
    ck_assert_int_eq(ir_add_writeback(g, 1, binary(g, OP_ADD, acc, x)), 0);
    assert_verifies(g, "every-op graph");
    return g;
}

static char *every_op_text(void)
{
    ir_graph *g = every_op_graph();
    char *t = text_of(g);
    ir_graph_free(g);
    return t;
}

/* -- Building: hash-consing ------------------------------------------------ */

START_TEST(test_equal_nodes_are_one_node)
{
    ir_graph *g = new_graph();
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    ir_ref a = binary(g, OP_ADD, x, x);
    ck_assert_uint_eq(binary(g, OP_ADD, x, x), a);
    ck_assert_uint_eq(input(g, 0, KILN_F32, SHAPE(4)), x);
    /* params NULL means all zero, so it meets an explicitly zeroed block */
    ck_assert_uint_eq(emit(g, OP_ADD, KILN_F32, SHAPE(4), OPS(x, x), &(ir_params){0}), a);
    ck_assert_uint_eq(g->count, 2);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_nodes_differing_in_anything_are_distinct)
{
    ir_graph *g = new_graph();
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    ir_ref y = input(g, 1, KILN_F32, SHAPE(4));
    ir_ref base = emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(x), NULL);
    ir_ref variants[] = {
        emit(g, OP_ABS, KILN_F32, SHAPE(4), OPS(x), NULL),         /* op */
        emit(g, OP_NEG, KILN_F64, SHAPE(4), OPS(x), NULL),         /* dtype */
        emit(g, OP_NEG, KILN_F32, SHAPE(1, 4), OPS(x), NULL),      /* rank */
        emit(g, OP_NEG, KILN_F32, SHAPE(5), OPS(x), NULL),         /* size */
        emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(y), NULL),         /* operand */
        emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(x, y), NULL),      /* operand count */
        emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(x), &(ir_params){.axis = 1}), /* params */
    };
    for (int i = 0; i < COUNT(variants); i++)
        ck_assert_msg(variants[i] != base, "variant %d met the base node", i);
    ck_assert_uint_eq(g->count, 3 + COUNT(variants));
    /* +0 and -0 differ: the simplifier relies on telling them apart */
    ck_assert_uint_ne(constant(g, KILN_F32, 0.0), constant(g, KILN_F32, -0.0));
    ck_assert_uint_ne(constant(g, KILN_F32, 1), constant(g, KILN_F64, 1));
    /* a scalar literal promotes unlike a 0-d tensor of the same value */
    ck_assert_uint_ne(constant(g, KILN_F64, 1),
                      emit(g, OP_CONST, KILN_F64, SCALAR, 0, NULL, &(ir_params){.value = 1, .scalar = 1}));
    ir_graph_free(g);
}
END_TEST

/* Integer and bool results (comparisons included) are exact in either
 * order; float results are not bit for bit (the first operand's NaN wins,
 * max(+0, -0) keeps its first), so their order stays. */
START_TEST(test_commutative_operands_meet_in_either_order)
{
    ir_graph *g = new_graph();
    ir_ref x = input(g, 0, KILN_I32, SHAPE(4));
    ir_ref y = input(g, 1, KILN_I32, SHAPE(4));
    ir_ref fx = input(g, 2, KILN_F32, SHAPE(4));
    ir_ref fy = input(g, 3, KILN_F32, SHAPE(4));
    for (int op = 0; op < OP__COUNT; op++) {
        if (ir_ops[op].kind != KIND_ELEMENTWISE || ir_ops[op].arity != 2)
            continue;
        bool same = binary(g, (ir_op)op, x, y) == binary(g, (ir_op)op, y, x);
        bool commutative = ir_ops[op].flags & FLAG_COMMUTATIVE;
        ck_assert_msg(same == commutative, "%s: x op y %s y op x", ir_ops[op].name,
                      same ? "meets" : "differs from");
        bool float_same = binary(g, (ir_op)op, fx, fy) == binary(g, (ir_op)op, fy, fx);
        bool bool_result = ir_result_dtype(ir_ops[op].rule, KILN_F32) == KILN_BOOL;
        ck_assert_msg(float_same == (commutative && bool_result), "%s on f32: order %s",
                      ir_ops[op].name, float_same ? "ignored" : "kept");
    }
    /* and the stored order is the canonical one, whichever came first */
    ir_ref s = binary(g, OP_MUL, y, x);
    ck_assert_uint_eq(ir_operands(g, &g->nodes[s])[0], x);
    ck_assert_uint_ne(binary(g, OP_SUB, x, y), binary(g, OP_SUB, y, x));
    ir_graph_free(g);
}
END_TEST

/* 10000 nodes grow the table well past its first size; every one must still
 * be found again, and none found by mistake. */
START_TEST(test_lookups_stay_right_as_the_table_grows)
{
    enum { N = 10000 };
    ir_graph *g = new_graph();
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(constant(g, KILN_F64, i), (ir_ref)i);
    ck_assert_uint_eq(g->count, N);
    for (int i = N; i-- > 0;)
        ck_assert_uint_eq(constant(g, KILN_F64, i), (ir_ref)i);
    /* nodes with operands too, each distinct through its operand */
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(unary(g, OP_EXP, (ir_ref)i), (ir_ref)(N + i));
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(unary(g, OP_EXP, (ir_ref)i), (ir_ref)(N + i));
    ck_assert_uint_eq(g->count, 2 * N);
    for (int i = 0; i < N; i++)
        ck_assert(g->nodes[i].params.value == i);
    ir_graph_free(g);
}
END_TEST

/* -- Text ------------------------------------------------------------------ */

START_TEST(test_every_op_round_trips_through_text)
{
    ir_graph *g = every_op_graph();
    bool seen[OP__COUNT] = {false};
    for (ir_ref r = 0; r < g->count; r++)
        seen[g->nodes[r].op] = true;
    for (int op = 0; op < OP__COUNT; op++) /* so that a new op joins this test */
        ck_assert_msg(seen[op] || op == OP_ASSIGN, "the graph lacks %s", ir_ops[op].name);
    char *text = text_of(g);
    ir_graph_free(g);
    assert_round_trip(text);
    /* the awkward constants print as strtod reads them back */
    ck_assert_ptr_nonnull(strstr(text, "= const -0 : f64[]"));
    ck_assert_ptr_nonnull(strstr(text, "= const nan : f64[]"));
    ck_assert_ptr_nonnull(strstr(text, "= const -inf : f64[]"));
    ck_assert_ptr_nonnull(strstr(text, "= const 2.5 scalar : f64[]"));
    ck_assert_ptr_nonnull(strstr(text, " axis=all keepdim=0 "));
    ck_assert_ptr_nonnull(strstr(text, " start=2 step=-1 "));
    ck_assert_ptr_nonnull(strstr(text, " axis=1 k=2 largest=1 "));
    ck_assert_ptr_nonnull(strstr(text, "output %"));
    ck_assert_int_eq(count_substr(text, "writeback "), 2);
    free(text);
}
END_TEST

START_TEST(test_constants_parse_to_the_same_double)
{
    const double values[] = {-0.0, 0.1, 1e300, -1e-300, 5e-324, 9007199254740992.0,
                             123456789012345678.0, 1.0 / 3.0, INFINITY};
    for (int i = 0; i < COUNT(values); i++) {
        ir_graph *g = new_graph();
        add_output(g, constant(g, KILN_F64, values[i]));
        char *text = text_of(g);
        ir_graph *back = parse_ok(text);
        double got = back->nodes[0].params.value;
        ck_assert_msg(!memcmp(&got, &values[i], sizeof got), "%.17g came back as %.17g", values[i], got);
        ir_graph_free(back);
        ir_graph_free(g);
        free(text);
    }
}
END_TEST

START_TEST(test_the_documented_example_round_trips)
{
    assert_round_trip(G "%0 = input 0 : f32[4,8]\n"
                        "%1 = const 0.5 : f64[]\n"
                        "%2 = mul %0 %1 : f32[4,8]\n"
                        "%3 = sum %2 axis=1 keepdim=0 : f32[4]\n"
                        "output %3\n"
                        "writeback 0 %2\n");
    assert_round_trip(G "output\n"); /* the empty graph */
}
END_TEST

START_TEST(test_symbolic_shapes_round_trip_and_verify)
{
    const char *text = G "%0 = input 0 : f32[s0,8]\n"
                         "%1 = input 1 : f32[s1,s0,8]\n"
                         "%2 = add %1 %0 : f32[s1,s0,8]\n"
                         "%3 = reshape %2 : f32[8*s0*s1]\n"
                         "%4 = input 2 : f32[3]\n"
                         "%5 = concat %3 %4 axis=0 : f32[8*s0*s1+3]\n"
                         "%6 = sum %2 axis=1 keepdim=0 : f32[s1,8]\n"
                         "%7 = slice %0 axis=0 start=0 step=1 : f32[s0,8]\n"
                         "output %5 %6 %7\n";
    ir_graph *g = parse_ok(text);
    assert_text(g, text);
    ck_assert_int_eq(g->n_symbols, 2);
    ck_assert(g->nodes[0].shape[0] < 0 && g->nodes[1].shape[1] == g->nodes[0].shape[0]);
    int64_t at[IR_MAX_SYMBOLS] = {5, 3}, shape[KILN_MAX_DIMS];
    ck_assert(ir_shape_eval(&g->sizes, 1, g->nodes[5].shape, at, shape));
    ck_assert_int_eq(shape[0], 8 * 5 * 3 + 3);
    ir_graph_free(g);
    /* The same polynomial written otherwise is the same size. */
    g = parse_ok(G "%0 = input 0 : f32[s0,s1]\n%1 = reshape %0 : f32[s1*s0]\noutput %1\n");
    ck_assert_int_eq(g->sizes.n, 3);
    ir_graph_free(g);
}
END_TEST

START_TEST(test_dot_has_one_edge_per_operand)
{
    ir_graph *g = every_op_graph();
    char *dot = ir_to_dot(g, "every_op");
    ck_assert_ptr_nonnull(dot);
    ck_assert_ptr_nonnull(strstr(dot, "digraph"));
    /* operand edges end in a node "nN"; outputs and writebacks in "outN", "wbN" */
    ck_assert_int_eq(count_substr(dot, "-> n"), (int)g->n_operands);
    ck_assert_int_eq(count_substr(dot, "-> out"), g->n_outputs);
    ck_assert_int_eq(count_substr(dot, "-> wb"), g->n_writebacks);
    free(dot);
    ir_graph_free(g);
}
END_TEST

/* -- Parser robustness ----------------------------------------------------- */

typedef struct {
    const char *why, *text;
    int at; /* the line the parser names, or the node the verifier names */
} malformed_case;

static const malformed_case malformed[] = {
    {"missing header", "%0 = input 0 : f32[4]\noutput %0\n", 1},
    {"wrong header version", "kiln-graph 2\n%0 = input 0 : f32[4]\noutput %0\n", 1},
    {"unknown op", G "%0 = input 0 : f32[4]\n%1 = frob %0 : f32[4]\noutput %1\n", 3},
    {"assign is not a node", G "%0 = input 0 : f32[4]\n%1 = assign %0 %0 : f32[4]\noutput %1\n", 3},
    {"operand names a later node",
     G "%0 = input 0 : f32[4]\n%1 = neg %2 : f32[4]\n%2 = neg %0 : f32[4]\noutput %1\n", 3},
    {"operand names itself", G "%0 = input 0 : f32[4]\n%1 = neg %1 : f32[4]\noutput %1\n", 3},
    {"node numbers out of order", G "%1 = input 0 : f32[4]\noutput %1\n", 2},
    {"bad dtype", G "%0 = input 0 : f16[4]\noutput %0\n", 2},
    {"type without brackets", G "%0 = input 0 : f32\noutput %0\n", 2},
    {"bad shape", G "%0 = input 0 : f32[4,x]\noutput %0\n", 2},
    {"negative size", G "%0 = input 0 : f32[-4]\noutput %0\n", 2},
    {"too many dimensions", G "%0 = input 0 : f32[1,1,1,1,1,1,1,1,1]\noutput %0\n", 2},
    {"missing ':' on a source", G "%0 = input 0 f32[4]\noutput %0\n", 2},
    {"missing ':'", G "%0 = input 0 : f32[4]\n%1 = neg %0 f32[4]\noutput %1\n", 3},
    {"missing type after ':'", G "%0 = input 0 :\noutput %0\n", 2},
    {"unknown parameter", G "%0 = input 0 : f32[4]\n%1 = sum %0 foo=1 : f32[]\noutput %1\n", 3},
    {"bad axis", G "%0 = input 0 : f32[4]\n%1 = sum %0 axis=x keepdim=0 : f32[]\noutput %1\n", 3},
    {"bad perm", G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,x : f32[3,2]\noutput %1\n", 3},
    {"bad constant", G "%0 = const 1.5x : f64[]\noutput %0\n", 2},
    {"text after the type", G "%0 = input 0 : f32[4] extra\noutput %0\n", 2},
    {"text after the shape", G "%0 = input 0 : f32[4]x\noutput %0\n", 2},
    {"duplicate node",
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\n%2 = neg %0 : f32[4]\noutput %2\n", 4},
    {"node after the output line", G "%0 = input 0 : f32[4]\noutput %0\n%1 = neg %0 : f32[4]\n", 4},
    {"second output line", G "%0 = input 0 : f32[4]\noutput %0\noutput %0\n", 4},
    {"output names no node", G "%0 = input 0 : f32[4]\noutput %1\n", 3},
    {"writeback before the output line", G "%0 = input 0 : f32[4]\nwriteback 0 %0\noutput %0\n", 3},
    {"writeback names no node", G "%0 = input 0 : f32[4]\noutput %0\nwriteback 0 %1\n", 4},
    {"negative writeback capture", G "%0 = input 0 : f32[4]\noutput %0\nwriteback -1 %0\n", 4},
    {"empty line", G "%0 = input 0 : f32[4]\n\noutput %0\n", 3},
    {"missing output line", G "%0 = input 0 : f32[4]\n", 2},
    {"no trailing newline", G "%0 = input 0 : f32[4]\noutput %0", 3},
};

START_TEST(test_malformed_text_is_rejected_with_its_line)
{
    const malformed_case *c = &malformed[_i];
    char err[ERR] = "";
    ir_graph *g = ir_parse(c->text, err, sizeof err);
    ck_assert_msg(g == NULL, "%s: accepted", c->why);
    char want[32];
    snprintf(want, sizeof want, "line %d:", c->at);
    ck_assert_msg(strstr(err, want) != NULL, "%s: error \"%s\" lacks \"%s\"", c->why, err, want);
}
END_TEST

/* Valid syntax, wrong meaning: the parser hands the graph to ir_verify. */
static const malformed_case unsound[] = {
    {"add with a dtype the rule does not give",
     G "%0 = input 0 : f32[4]\n%1 = add %0 %0 : i32[4]\noutput %1\n", 1},
    {"add of shapes that do not broadcast",
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[3]\n%2 = add %0 %1 : f32[4]\noutput %2\n", 2},
    {"reshape changing the element count",
     G "%0 = input 0 : f32[4]\n%1 = reshape %0 : f32[5]\noutput %1\n", 1},
    {"slice past the end",
     G "%0 = input 0 : f32[4]\n%1 = slice %0 axis=0 start=2 step=1 : f32[3]\noutput %1\n", 1},
    {"slice before the start",
     G "%0 = input 0 : f32[4]\n%1 = slice %0 axis=0 start=1 step=-1 : f32[3]\noutput %1\n", 1},
    {"slice with step 0", G "%0 = input 0 : f32[4]\n%1 = slice %0 axis=0 start=0 step=0 : f32[2]\noutput %1\n", 1},
    {"symbolic sizes that do not broadcast",
     G "%0 = input 0 : f32[s0,4]\n%1 = input 1 : f32[s1,4]\n%2 = add %0 %1 : f32[s0,4]\noutput %2\n", 2},
    {"a symbolic size broadcast against a concrete one",
     G "%0 = input 0 : f32[s0]\n%1 = input 1 : f32[4]\n%2 = add %0 %1 : f32[4]\noutput %2\n", 2},
    {"reshape changing a symbolic element count",
     G "%0 = input 0 : f32[s0,4]\n%1 = reshape %0 : f32[s0,2]\noutput %1\n", 1},
    {"part of a symbolic axis sliced",
     G "%0 = input 0 : f32[s0]\n%1 = slice %0 axis=0 start=1 step=1 : f32[s0]\noutput %1\n", 1},
    {"concat whose size is not the sum",
     G "%0 = input 0 : f32[s0]\n%1 = input 1 : f32[3]\n%2 = concat %0 %1 axis=0 : f32[s0+2]\noutput %2\n", 2},
    {"matmul with differing inner sizes",
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[4,2]\n%2 = matmul %0 %1 : f32[2,2]\noutput %2\n", 2},
    {"const that is not 0-d", G "%0 = const 1 : f32[4]\noutput %0\n", 0},
    {"input with an operand", G "%0 = input 0 : f32[4]\n%1 = input 1 %0 : f32[4]\noutput %1\n", 1},
};

START_TEST(test_unsound_text_is_rejected_by_the_verifier)
{
    const malformed_case *c = &unsound[_i];
    char err[ERR] = "";
    ck_assert_msg(ir_parse(c->text, err, sizeof err) == NULL, "%s: accepted", c->why);
    char want[16];
    snprintf(want, sizeof want, "node %%%d ", c->at);
    ck_assert_msg(strstr(err, want) != NULL, "%s: error \"%s\" lacks \"%s\"", c->why, err, want);
}
END_TEST

/* A copy of the first n bytes of s, so that ASan sees reads past them. */
static char *prefix(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    ck_assert_ptr_nonnull(p);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* A cache file cut short anywhere: only a cut at the end of a line after the
 * output line (dropping whole writeback lines) leaves a graph to accept. */
START_TEST(test_every_truncation_fails_or_ends_after_the_output_line)
{
    char *text = every_op_text();
    size_t len = strlen(text);
    const char *output_line = strstr(text, "\noutput") + 1;
    size_t outputs_end = (size_t)(strchr(output_line, '\n') + 1 - text);
    int accepted = 0;
    for (size_t n = 0; n < len; n++) {
        char *cut = prefix(text, n), err[ERR];
        ir_graph *g = ir_parse(cut, err, sizeof err);
        bool may_succeed = n >= outputs_end && text[n - 1] == '\n';
        ck_assert_msg((g != NULL) == may_succeed, "prefix of %zu bytes %s (%s)", n,
                      g ? "accepted" : "rejected", err);
        if (!g)
            ck_assert_ptr_nonnull(strstr(err, "line "));
        accepted += g != NULL;
        ir_graph_free(g);
        free(cut);
    }
    ck_assert_int_eq(accepted, 2); /* the cuts before each writeback line */
    free(text);
}
END_TEST

static uint32_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005u + 1442695040888963407u;
    return (uint32_t)(*state >> 33);
}

/* A byte for a mutation: any byte, or (every other trial) a digit, which
 * more often leaves text that parses and so tests what the parser accepts. */
static char random_byte(uint64_t *state, int trial)
{
    uint32_t r = next_random(state);
    return (char)(trial % 2 ? '0' + r % 10 : r % 256);
}

/* Corrupted text must never crash the parser, and what it accepts must be a
 * graph whose own text parses back to the same text. */
START_TEST(test_random_byte_flips_never_crash)
{
    char *text = every_op_text();
    size_t len = strlen(text);
    uint64_t state = 20240601;
    int accepted = 0;
    for (int trial = 0; trial < 4000; trial++) {
        char *bad = prefix(text, len), err[ERR];
        for (uint32_t k = 1 + next_random(&state) % 3; k > 0; k--)
            bad[next_random(&state) % len] = random_byte(&state, trial);
        ir_graph *g = ir_parse(bad, err, sizeof err);
        if (g) {
            accepted++;
            assert_verifies(g, "accepted mutant");
            char *again = text_of(g);
            assert_round_trip(again);
            free(again);
        }
        ir_graph_free(g);
        free(bad);
    }
    /* both branches ran: mutants were refused, and some accepted and reprinted */
    ck_assert_int_lt(accepted, 4000);
    ck_assert_int_gt(accepted, 0);
    free(text);
}
END_TEST

/* A parameter the op does not take is not printed, so two such nodes can
 * print as one line: the text of the accepted graph would not parse again. */
START_TEST(test_a_parameter_the_op_does_not_take_is_rejected)
{
    const char *texts[] = {
        G "%0 = input 0 : f32[4]\n%1 = add %0 %0 : f32[4]\n%2 = add %0 %0 start=1 : f32[4]\noutput %1 %2\n",
        G "%0 = input 0 : f32[4]\n%1 = neg %0 axis=1 : f32[4]\noutput %1\n",
        G "%0 = input 0 : f32[4]\n%1 = sum %0 axis=0 keepdim=0 step=2 : f32[]\noutput %1\n",
        G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,0,2 : f32[3,2]\noutput %1\n",
    };
    for (int i = 0; i < COUNT(texts); i++) {
        char err[ERR];
        ir_graph *g = ir_parse(texts[i], err, sizeof err);
        ck_assert_msg(g == NULL, "accepted a parameter that does not print:\n%s", texts[i]);
    }
}
END_TEST

/* The graph counts its inputs and captures in ints: input #2^31-1 needs a
 * count of 2^31, and capture #2^32 truncates to a count of 1, after which a
 * runner indexing its captures by the number reads past them. */
START_TEST(test_numbers_too_large_for_the_counts_are_rejected)
{
    const malformed_case cases[] = {
        {"input number", G "%0 = input 2147483647 : f32[]\noutput %0\n", 2},
        {"capture number", G "%0 = capture 2147483647 : f32[]\noutput %0\n", 2},
        {"writeback capture", G "%0 = input 0 : f32[]\noutput %0\nwriteback 4294967296 %0\n", 4},
    };
    for (int i = 0; i < COUNT(cases); i++) {
        char err[ERR] = "", want[32];
        ir_graph *g = ir_parse(cases[i].text, err, sizeof err);
        ck_assert_msg(g == NULL, "accepted a %s that does not fit", cases[i].why);
        snprintf(want, sizeof want, "line %d:", cases[i].at);
        ck_assert_msg(strstr(err, want) != NULL, "error \"%s\" lacks \"%s\"", err, want);
    }
    /* and the largest that fits is fine */
    ir_graph *g = parse_ok(G "%0 = input 2147483646 : f32[]\noutput %0\n");
    ck_assert_int_eq(g->n_inputs, 2147483647);
    ir_graph_free(g);
}
END_TEST

/* -- Verifier -------------------------------------------------------------- */

/* Each builder makes a small graph that is sound, or, with defect set, the
 * same graph with one thing wrong: so each case shows what the verifier
 * rejects, and that it is that thing alone. */
typedef void (*build_fn)(ir_graph *g, bool defect);

static void build_order(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(defect ? x + 1 : x), NULL); /* itself */
}

static void build_later_operand(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    ir_ref n = emit(g, OP_NEG, KILN_F32, SHAPE(4), OPS(defect ? x + 2 : x), NULL);
    unary(g, OP_ABS, n);
}

static void build_arity(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    if (defect)
        emit(g, OP_ADD, KILN_F32, SHAPE(4), OPS(x), NULL);
    else
        emit(g, OP_ADD, KILN_F32, SHAPE(4), OPS(x, x), NULL);
}

static void build_dtype(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    emit(g, OP_ADD, defect ? KILN_I32 : KILN_F32, SHAPE(4), OPS(x, x), NULL);
}

static void build_compare_dtype(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    emit(g, OP_LT, defect ? KILN_F32 : KILN_BOOL, SHAPE(4), OPS(x, x), NULL);
}

static void build_where_cond(ir_graph *g, bool defect)
{
    ir_ref c = input(g, 0, defect ? KILN_I32 : KILN_BOOL, SHAPE(4));
    ir_ref x = input(g, 1, KILN_F32, SHAPE(4));
    emit(g, OP_WHERE, KILN_F32, SHAPE(4), OPS(c, x, x), NULL);
}

static void build_broadcast(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(3, 4));
    ir_ref y = defect ? input(g, 1, KILN_F32, SHAPE(3)) : input(g, 1, KILN_F32, SHAPE(4));
    emit(g, OP_ADD, KILN_F32, SHAPE(3, 4), OPS(x, y), NULL);
}

static void build_broadcast_result(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(3, 1));
    ir_ref y = input(g, 1, KILN_F32, SHAPE(4));
    if (defect)
        emit(g, OP_ADD, KILN_F32, SHAPE(3, 1), OPS(x, y), NULL);
    else
        emit(g, OP_ADD, KILN_F32, SHAPE(3, 4), OPS(x, y), NULL);
}

static void build_reduction_axis(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    emit(g, OP_SUM, KILN_F32, SHAPE(2), OPS(x), &(ir_params){.axis = defect ? 2 : 1});
}

static void build_reduction_shape(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    emit(g, OP_SUM, KILN_F32, SHAPE(2, 1), OPS(x), &(ir_params){.axis = 1, .keepdim = !defect});
}

static void build_permutation(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 2));
    move(g, OP_PERMUTE, x, SHAPE(2, 2), &(ir_params){.perm = {defect ? 0 : 1, 0}});
}

static void build_permuted_shape(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    if (defect)
        move(g, OP_PERMUTE, x, SHAPE(2, 3), &(ir_params){.perm = {1, 0}});
    else
        move(g, OP_PERMUTE, x, SHAPE(3, 2), &(ir_params){.perm = {1, 0}});
}

static void build_concat_sizes(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    ir_ref y = defect ? input(g, 1, KILN_F32, SHAPE(2, 4)) : input(g, 1, KILN_F32, SHAPE(2, 3));
    emit(g, OP_CONCAT, KILN_F32, SHAPE(4, 3), OPS(x, y), &(ir_params){.axis = 0});
}

static void build_concat_total(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    if (defect)
        emit(g, OP_CONCAT, KILN_F32, SHAPE(5, 3), OPS(x, x), &(ir_params){.axis = 0});
    else
        emit(g, OP_CONCAT, KILN_F32, SHAPE(4, 3), OPS(x, x), &(ir_params){.axis = 0});
}

/* 32 parts of 2^59 elements sum to 2^64, which wraps to 0 in int64. */
static void build_concat_total_overflow(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(INT64_C(1) << 59)), parts[32];
    for (int i = 0; i < COUNT(parts); i++)
        parts[i] = x;
    if (defect)
        emit(g, OP_CONCAT, KILN_F32, SHAPE(0), COUNT(parts), parts, &(ir_params){.axis = 0});
    else
        emit(g, OP_CONCAT, KILN_F32, SHAPE(INT64_C(1) << 59), 1, parts, &(ir_params){.axis = 0});
}

/* The result of joining two [2,3] along axis 0 is [4,3], not [4,3,7]. */
static void build_concat_rank(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    if (defect)
        emit(g, OP_CONCAT, KILN_F32, SHAPE(4, 3, 7), OPS(x, x), &(ir_params){.axis = 0});
    else
        emit(g, OP_CONCAT, KILN_F32, SHAPE(4, 3), OPS(x, x), &(ir_params){.axis = 0});
}

static void build_matmul_inner(ir_graph *g, bool defect)
{
    ir_ref a = input(g, 0, KILN_F32, SHAPE(2, 3));
    ir_ref b = defect ? input(g, 1, KILN_F32, SHAPE(4, 5)) : input(g, 1, KILN_F32, SHAPE(3, 5));
    emit(g, OP_MATMUL, KILN_F32, SHAPE(2, 5), OPS(a, b), NULL);
}

static void build_matmul_shape(ir_graph *g, bool defect)
{
    ir_ref a = input(g, 0, KILN_F32, SHAPE(7, 2, 3));
    ir_ref b = input(g, 1, KILN_F32, SHAPE(3, 5));
    if (defect)
        emit(g, OP_MATMUL, KILN_F32, SHAPE(2, 5), OPS(a, b), NULL);
    else
        emit(g, OP_MATMUL, KILN_F32, SHAPE(7, 2, 5), OPS(a, b), NULL);
}

static void build_const_rank(ir_graph *g, bool defect)
{
    ir_params p = {.value = 1};
    if (defect)
        emit(g, OP_CONST, KILN_F32, SHAPE(4), 0, NULL, &p);
    else
        emit(g, OP_CONST, KILN_F32, SCALAR, 0, NULL, &p);
}

static void build_reshape_count(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    if (defect)
        move(g, OP_RESHAPE, x, SHAPE(7), NULL);
    else
        move(g, OP_RESHAPE, x, SHAPE(6), NULL);
}

/* [0] has no elements and [2^62, 4] has 2^64: in int64 that count wraps to 0. */
static void build_reshape_count_overflow(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(0));
    if (defect)
        move(g, OP_RESHAPE, x, SHAPE(INT64_C(1) << 62, 4), NULL);
    else
        move(g, OP_RESHAPE, x, SHAPE(0, 4), NULL);
}

static void build_expand(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(defect ? 2 : 1, 4));
    move(g, OP_EXPAND, x, SHAPE(3, 4), NULL);
}

static void build_slice_bounds(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    move(g, OP_SLICE, x, SHAPE(2), &(ir_params){.axis = 0, .start = defect ? 3 : 2, .step = 1});
}

/* Elements 2, 2 + 2^63 - 1, ...: far outside [0, 4), though start + 2 * step
 * wraps around to 0 in int64 arithmetic. */
static void build_slice_stride_overflow(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    ir_params p = {.axis = 0, .start = 2, .step = defect ? INT64_MAX : -1};
    move(g, OP_SLICE, x, SHAPE(3), &p);
}

static void build_movement_dtype(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 3));
    emit(g, OP_RESHAPE, defect ? KILN_F64 : KILN_F32, SHAPE(6), OPS(x), NULL);
}

static void build_topk_k(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 5));
    emit(g, OP_TOPK, KILN_I64, SHAPE(2, 3), OPS(x), &(ir_params){.axis = 1, .index = defect ? 2 : 3});
}

static void build_cumsum_axis(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_I32, SHAPE(2, 5));
    emit(g, OP_CUMSUM, KILN_I64, SHAPE(2, 5), OPS(x), &(ir_params){.axis = defect ? 2 : 1});
}

static void build_gather_index_dtype(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 5));
    ir_ref i = input(g, 1, defect ? KILN_F32 : KILN_I32, SHAPE(2, 3));
    emit(g, OP_GATHER, KILN_F32, SHAPE(2, 3), OPS(x, i), &(ir_params){.axis = 1});
}

static void build_index_select_shape(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 5));
    ir_ref i = input(g, 1, KILN_I64, SHAPE(4));
    emit(g, OP_INDEX_SELECT, KILN_F32, SHAPE(2, defect ? 5 : 4), OPS(x, i), &(ir_params){.axis = 1});
}

static void build_scatter_src_dtype(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(2, 5));
    ir_ref i = input(g, 1, KILN_I64, SHAPE(2, 5));
    ir_ref s = input(g, 2, defect ? KILN_F64 : KILN_F32, SHAPE(2, 5));
    emit(g, OP_SCATTER_ADD, KILN_F32, SHAPE(2, 5), OPS(x, i, s), &(ir_params){.axis = 0});
}

static void build_output(ir_graph *g, bool defect)
{
    ir_ref x = input(g, 0, KILN_F32, SHAPE(4));
    add_output(g, defect ? x + 1 : x);
}

static const struct {
    const char *defect;
    build_fn build;
} verifier_cases[] = {
    {"an operand that is the node itself", build_order},
    {"an operand after its user", build_later_operand},
    {"the wrong operand count", build_arity},
    {"a dtype the rule does not give", build_dtype},
    {"a comparison that is not bool", build_compare_dtype},
    {"a where whose cond is not bool", build_where_cond},
    {"operands that do not broadcast", build_broadcast},
    {"a shape that is not the broadcast", build_broadcast_result},
    {"a reduction axis out of range", build_reduction_axis},
    {"a reduction shape without keepdim's 1", build_reduction_shape},
    {"a permutation repeating an axis", build_permutation},
    {"a permute whose shape is not permuted", build_permuted_shape},
    {"concat of operands differing off the axis", build_concat_sizes},
    {"concat whose size is not the operands' total", build_concat_total},
    {"concat whose rank is not the operands'", build_concat_rank},
    {"concat whose total wraps past int64", build_concat_total_overflow},
    {"matmul of differing inner sizes", build_matmul_inner},
    {"matmul dropping the batch dimension", build_matmul_shape},
    {"a constant that is not 0-d", build_const_rank},
    {"reshape changing the element count", build_reshape_count},
    {"reshape whose element count overflows", build_reshape_count_overflow},
    {"expand of a size that is not 1", build_expand},
    {"slice past the end", build_slice_bounds},
    {"slice whose stride overflows", build_slice_stride_overflow},
    {"movement changing the dtype", build_movement_dtype},
    {"an output naming no node", build_output},
    {"topk whose k is not its axis's size", build_topk_k},
    {"cumsum along an axis out of range", build_cumsum_axis},
    {"gather by float indices", build_gather_index_dtype},
    {"index_select of the wrong length", build_index_select_shape},
    {"scatter_add of another dtype", build_scatter_src_dtype},
};

START_TEST(test_verifier_rejects_each_defect_alone)
{
    char err[ERR] = "";
    for (int defect = 0; defect <= 1; defect++) {
        ir_graph *g = new_graph();
        verifier_cases[_i].build(g, defect);
        int status = ir_verify(g, err, sizeof err);
        ir_graph_free(g);
        if (defect)
            ck_assert_msg(status < 0, "accepted %s", verifier_cases[_i].defect);
        else
            ck_assert_msg(status == 0, "rejected the sound graph for \"%s\": %s",
                          verifier_cases[_i].defect, err);
    }
    ck_assert(err[0] != '\0'); /* and said why */
}
END_TEST

/* -- Passes ---------------------------------------------------------------- */

typedef enum { SIMPLIFY, SIMPLIFY_FAST, FOLD, DCE, TRANSCENDENTAL, TRANSPOSE_PRODUCTS, LONG_ROWS } pass;

static int run_pass(pass p, ir_graph **g)
{
    switch (p) {
    case SIMPLIFY: return ir_pass_simplify(g, false);
    case SIMPLIFY_FAST: return ir_pass_simplify(g, true);
    case FOLD: return ir_pass_fold(g, eager_eval_const);
    case DCE: return ir_pass_dce(g);
    case TRANSCENDENTAL: return ir_pass_transcendental(g);
    case TRANSPOSE_PRODUCTS: return ir_pass_transpose_products(g);
    case LONG_ROWS: return ir_pass_long_rows(g);
    }
    return -1;
}

/* A graph before a pass, the rewrites the pass must count, and the graph after
 * it; after NULL means the pass must leave the graph as it was. */
typedef struct {
    const char *name;
    pass pass;
    const char *before;
    int rewrites;
    const char *after;
} pass_case;

#define UNCHANGED 0, NULL
/* log(sum(exp(x - max(x)))) over a row of 16384 as %5, and the online form
 * long_rows.c adds for it (pieces of 4096) up to its max over the pieces'
 * log-sum-exps %18, its shift %19 and the pieces' exp(l - c) %22. */
#define LOG_SUM_EXP_16384                                                                                   \
    G "%0 = input 0 : f32[1,16384]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = sub %0 %1 : f32[1,16384]\n" \
      "%3 = exp %2 : f32[1,16384]\n%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n%5 = log %4 : f32[1,1]\n"
#define ONLINE_16384                                                                                           \
    "%6 = reshape %0 : f32[1,4,4096]\n%7 = max %6 axis=2 keepdim=1 : f32[1,4,1]\n"                          \
    "%8 = const -3.4028234663852886e+38 : f32[]\n%9 = maximum %7 %8 : f32[1,4,1]\n"                         \
    "%10 = sub %6 %9 : f32[1,4,4096]\n%11 = exp %10 : f32[1,4,4096]\n%12 = sum %11 axis=2 keepdim=1 : f32[1,4,1]\n" \
    "%13 = cast %12 : f64[1,4,1]\n%14 = log %13 : f64[1,4,1]\n%15 = cast %9 : f64[1,4,1]\n"                \
    "%16 = add %15 %14 : f64[1,4,1]\n%17 = reshape %16 : f64[1,4]\n%18 = max %17 axis=1 keepdim=1 : f64[1,1]\n" \
    "%19 = cast %18 : f32[1,1]\n%20 = cast %19 : f64[1,1]\n%21 = sub %17 %20 : f64[1,4]\n%22 = exp %21 : f64[1,4]\n"
/* softmax(x) over x's last axis as kiln_softmax traces it: x of type, its max and sum of type row. */
#define SOFTMAX(type, row)                                                                            \
    G "%0 = input 0 : " type "\n%1 = max %0 axis=1 keepdim=1 : " row "\n%2 = sub %0 %1 : " type "\n" \
      "%3 = exp %2 : " type "\n%4 = sum %3 axis=1 keepdim=1 : " row "\n%5 = div %3 %4 : " type "\noutput %5\n"

/* x op x for an i32 x compares equal to itself: a bool constant, broadcast. */
#define SELF_COMPARE(op, value)                                                        \
    {"x " op " x -> " #value " for ints", SIMPLIFY,                                    \
     G "%0 = input 0 : i32[4]\n%1 = " op " %0 %0 : bool[4]\noutput %1\n", 1,           \
     G "%0 = input 0 : i32[4]\n%1 = const " #value " : bool[]\n%2 = expand %1 : bool[4]\n" \
       "output %2\n"}
/* A float x may be NaN, which compares unequal to itself. */
#define SELF_COMPARE_FLOAT(op)                                                          \
    {"x " op " x stays for floats (NaN)", SIMPLIFY,                                    \
     G "%0 = input 0 : f32[4]\n%1 = " op " %0 %0 : bool[4]\noutput %1\n", UNCHANGED}

static const pass_case pass_cases[] = {
    /* x + 0: exact for floats only when the zero is -0, since -0 + +0 is +0 */
    {"x+(-0) -> x for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const -0 : f32[]\n%2 = add %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const -0 : f32[]\noutput %0\n"},
    {"(-0)+x -> x for floats", SIMPLIFY,
     G "%0 = const -0 : f32[]\n%1 = input 0 : f32[4]\n%2 = add %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = const -0 : f32[]\n%1 = input 0 : f32[4]\noutput %1\n"},
    {"x+0 -> x for ints", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 0 : i32[]\n%2 = add %0 %1 : i32[4]\noutput %2\n", 1,
     G "%0 = input 0 : i32[4]\n%1 = const 0 : i32[]\noutput %0\n"},
    {"x+(+0) stays for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = add %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"x+(+0) -> x for floats with fast_math", SIMPLIFY_FAST,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = add %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\noutput %0\n"},
    {"x+(-0) stays when the zero makes it f64", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const -0 : f64[]\n%2 = add %0 %1 : f64[4]\noutput %2\n", UNCHANGED},

    /* x - 0: exact for +0; x - (-0) is x + 0, which turns -0 into +0 */
    {"x-0 -> x for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = sub %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\noutput %0\n"},
    {"x-(-0) stays for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const -0 : f32[]\n%2 = sub %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"0-x stays (sub does not commute)", SIMPLIFY,
     G "%0 = const 0 : i32[]\n%1 = input 0 : i32[4]\n%2 = sub %0 %1 : i32[4]\noutput %2\n", UNCHANGED},

    /* x * 1 */
    {"x*1 -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\noutput %0\n"},
    {"1*x -> x", SIMPLIFY,
     G "%0 = const 1 : f32[]\n%1 = input 0 : f32[4]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = const 1 : f32[]\n%1 = input 0 : f32[4]\noutput %1\n"},
    {"x*2 stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 2 : f32[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    /* The dtype guard: a 0-d float raises an i32 tensor to its own dtype, so the
     * product is an f64 tensor and x (i32) cannot stand for it. */
    {"x*1 stays when the one makes it f64", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 1 : f64[]\n%2 = mul %0 %1 : f64[4]\noutput %2\n", UNCHANGED},
    {"x*1 stays when the one makes it f32", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 1 : f32[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    /* a scalar literal brings only its category: f32 for any float */
    {"x*1 stays when a scalar one makes it f32", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 1 scalar : f64[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n",
     UNCHANGED},
    {"x*1 -> x for a scalar one of the same category", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 1 scalar : f64[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 1 scalar : f64[]\noutput %0\n"},

    /* x * 0: ints only, since NaN * 0 and inf * 0 are NaN and -1 * 0 is -0 */
    {"x*0 -> zeros for ints", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 0 : i32[]\n%2 = mul %0 %1 : i32[4]\noutput %2\n", 1,
     G "%0 = input 0 : i32[4]\n%1 = const 0 : i32[]\n%2 = expand %1 : i32[4]\noutput %2\n"},
    {"x*0 stays for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"x*0 -> zeros for floats with fast_math", SIMPLIFY_FAST,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = mul %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = expand %1 : f32[4]\noutput %2\n"},

    /* x / 1 and x ** 1 */
    {"x/1 -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\n%2 = div %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\noutput %0\n"},
    {"x/2 stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 2 : f32[]\n%2 = div %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"x/1 stays for ints (the quotient is f32)", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = const 1 : i32[]\n%2 = div %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"1/x stays (div does not commute)", SIMPLIFY,
     G "%0 = const 1 : f32[]\n%1 = input 0 : f32[4]\n%2 = div %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"x**1 -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\n%2 = pow %0 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 1 : f32[]\noutput %0\n"},
    {"x**2 stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = const 2 : f32[]\n%2 = pow %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"1**x stays", SIMPLIFY,
     G "%0 = const 1 : f32[]\n%1 = input 0 : f32[4]\n%2 = pow %0 %1 : f32[4]\noutput %2\n", UNCHANGED},

    /* max(x, x), min(x, x) */
    {"max(x,x) -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = maximum %0 %0 : f32[4]\noutput %1\n", 1,
     G "%0 = input 0 : f32[4]\noutput %0\n"},
    {"min(x,x) -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = minimum %0 %0 : f32[4]\noutput %1\n", 1,
     G "%0 = input 0 : f32[4]\noutput %0\n"},
    {"max(x,y) stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = maximum %0 %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"min(x,y) stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = minimum %0 %1 : f32[4]\noutput %2\n", UNCHANGED},

    /* x - x: ints only, since inf - inf and NaN - NaN are NaN */
    {"x-x -> zeros for ints", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = sub %0 %0 : i32[4]\noutput %1\n", 1,
     G "%0 = input 0 : i32[4]\n%1 = const 0 : i32[]\n%2 = expand %1 : i32[4]\noutput %2\n"},
    {"x-x stays for floats", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = sub %0 %0 : f32[4]\noutput %1\n", UNCHANGED},
    {"x-y stays for ints", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = input 1 : i32[4]\n%2 = sub %0 %1 : i32[4]\noutput %2\n", UNCHANGED},

    /* x compared with itself */
    SELF_COMPARE("eq", 1), SELF_COMPARE("le", 1), SELF_COMPARE("ge", 1),
    SELF_COMPARE("ne", 0), SELF_COMPARE("lt", 0), SELF_COMPARE("gt", 0),
    SELF_COMPARE_FLOAT("eq"), SELF_COMPARE_FLOAT("le"), SELF_COMPARE_FLOAT("ge"),
    SELF_COMPARE_FLOAT("ne"), SELF_COMPARE_FLOAT("lt"), SELF_COMPARE_FLOAT("gt"),
    {"x<y stays for ints", SIMPLIFY,
     G "%0 = input 0 : i32[4]\n%1 = input 1 : i32[4]\n%2 = lt %0 %1 : bool[4]\noutput %2\n", UNCHANGED},

    /* where(c, x, x) */
    {"where(c,x,x) -> x", SIMPLIFY,
     G "%0 = input 0 : bool[4]\n%1 = input 1 : f32[4]\n%2 = where %0 %1 %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : bool[4]\n%1 = input 1 : f32[4]\noutput %1\n"},
    {"where(c,x,y) stays", SIMPLIFY,
     G "%0 = input 0 : bool[4]\n%1 = input 1 : f32[4]\n%2 = input 2 : f32[4]\n"
       "%3 = where %0 %1 %2 : f32[4]\noutput %3\n", UNCHANGED},
    {"where(c,x,x) stays when c broadcasts x", SIMPLIFY,
     G "%0 = input 0 : bool[3,4]\n%1 = input 1 : f32[4]\n%2 = where %0 %1 %1 : f32[3,4]\noutput %2\n",
     UNCHANGED},

    /* -(-x) */
    {"-(-x) -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\n%2 = neg %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\noutput %0\n"},
    {"-x stays", SIMPLIFY, G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\noutput %1\n", UNCHANGED},
    {"-|x| stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = abs %0 : f32[4]\n%2 = neg %1 : f32[4]\noutput %2\n", UNCHANGED},

    /* cast */
    {"cast to the same dtype -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = cast %0 : f32[4]\noutput %1\n", 1,
     G "%0 = input 0 : f32[4]\noutput %0\n"},
    {"cast to another dtype stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = cast %0 : i32[4]\noutput %1\n", UNCHANGED},

    /* contiguous: a copy has its operand's values, whatever the layout */
    {"contiguous(x) -> x", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = contiguous %0 : f32[2,3]\noutput %1\n", 1,
     G "%0 = input 0 : f32[2,3]\noutput %0\n"},
    {"contiguous(permute x) -> the permute, not x", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,0 : f32[3,2]\n"
       "%2 = contiguous %1 : f32[3,2]\noutput %2\n", 1,
     G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,0 : f32[3,2]\noutput %1\n"},

    /* reshape */
    {"reshape to the same shape -> x", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = reshape %0 : f32[2,3]\noutput %1\n", 1,
     G "%0 = input 0 : f32[2,3]\noutput %0\n"},
    {"reshape to another shape stays", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = reshape %0 : f32[3,2]\noutput %1\n", UNCHANGED},
    {"reshape of reshape -> one reshape", SIMPLIFY,
     G "%0 = input 0 : f32[4,6]\n%1 = reshape %0 : f32[24]\n%2 = reshape %1 : f32[6,4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4,6]\n%1 = reshape %0 : f32[24]\n%2 = reshape %0 : f32[6,4]\noutput %2\n"},
    {"reshape of permute stays (the permute reorders)", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,0 : f32[3,2]\n%2 = reshape %1 : f32[6]\n"
       "output %2\n", UNCHANGED},

    /* expand */
    {"expand to the same shape -> x", SIMPLIFY,
     G "%0 = input 0 : f32[1,4]\n%1 = expand %0 : f32[1,4]\noutput %1\n", 1,
     G "%0 = input 0 : f32[1,4]\noutput %0\n"},
    {"expand to a larger shape stays", SIMPLIFY,
     G "%0 = input 0 : f32[1,4]\n%1 = expand %0 : f32[3,4]\noutput %1\n", UNCHANGED},

    /* permute */
    {"identity permute -> x", SIMPLIFY,
     G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=0,1 : f32[2,3]\noutput %1\n", 1,
     G "%0 = input 0 : f32[2,3]\noutput %0\n"},
    {"transposing permute stays", SIMPLIFY,
     G "%0 = input 0 : f32[2,2]\n%1 = permute %0 perm=1,0 : f32[2,2]\noutput %1\n", UNCHANGED},
    /* out[d] = inner[outer[d]] = x[inner_perm[outer_perm[d]]]: 1,2,0 then 1,0,2
     * is 2,1,0 (the other order of composing would give 0,2,1) */
    {"permute of permute -> the composed permute", SIMPLIFY,
     G "%0 = input 0 : f32[2,3,4]\n%1 = permute %0 perm=1,2,0 : f32[3,4,2]\n"
       "%2 = permute %1 perm=1,0,2 : f32[4,3,2]\noutput %2\n", 1,
     G "%0 = input 0 : f32[2,3,4]\n%1 = permute %0 perm=1,2,0 : f32[3,4,2]\n"
       "%2 = permute %0 perm=2,1,0 : f32[4,3,2]\noutput %2\n"},
    {"permute of reshape stays", SIMPLIFY,
     G "%0 = input 0 : f32[6]\n%1 = reshape %0 : f32[2,3]\n%2 = permute %1 perm=1,0 : f32[3,2]\n"
       "output %2\n", UNCHANGED},

    /* slice */
    {"full slice -> x", SIMPLIFY,
     G "%0 = input 0 : f32[4,2]\n%1 = slice %0 axis=0 start=0 step=1 : f32[4,2]\noutput %1\n", 1,
     G "%0 = input 0 : f32[4,2]\noutput %0\n"},
    {"partial slice stays", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = slice %0 axis=0 start=1 step=1 : f32[3]\noutput %1\n", UNCHANGED},
    {"reversing slice stays (same shape, other order)", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = slice %0 axis=0 start=3 step=-1 : f32[4]\noutput %1\n", UNCHANGED},

    /* common subexpressions: rebuilding (x*1)+y meets the existing x+y */
    {"a rewrite exposing x+y twice leaves one node", SIMPLIFY,
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = const 1 : f32[]\n"
       "%3 = mul %0 %2 : f32[4]\n%4 = add %3 %1 : f32[4]\n%5 = add %0 %1 : f32[4]\noutput %4 %5\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = const 1 : f32[]\n"
       "%3 = add %0 %1 : f32[4]\noutput %3 %3\n"},

    /* constant folding, computed in the node's dtype */
    {"const + const folds (f32)", FOLD,
     G "%0 = const 1.5 : f32[]\n%1 = const 2.25 : f32[]\n%2 = add %0 %1 : f32[]\noutput %2\n", 1,
     G "%0 = const 1.5 : f32[]\n%1 = const 2.25 : f32[]\n%2 = const 3.75 : f32[]\noutput %2\n"},
    {"const + const folds (i32)", FOLD,
     G "%0 = const 7 : i32[]\n%1 = const -3 : i32[]\n%2 = add %0 %1 : i32[]\noutput %2\n", 1,
     G "%0 = const 7 : i32[]\n%1 = const -3 : i32[]\n%2 = const 4 : i32[]\noutput %2\n"},
    {"i32 + f64 consts fold to f64", FOLD,
     G "%0 = const 2 : i32[]\n%1 = const 0.5 : f64[]\n%2 = add %0 %1 : f64[]\noutput %2\n", 1,
     G "%0 = const 2 : i32[]\n%1 = const 0.5 : f64[]\n%2 = const 2.5 : f64[]\noutput %2\n"},
    {"0.1 + 0.2 folds rounded to f32", FOLD,
     G "%0 = const 0.10000000000000001 : f32[]\n%1 = const 0.20000000000000001 : f32[]\n"
       "%2 = add %0 %1 : f32[]\noutput %2\n", 1,
     G "%0 = const 0.10000000000000001 : f32[]\n%1 = const 0.20000000000000001 : f32[]\n"
       "%2 = const 0.30000001192092896 : f32[]\noutput %2\n"},
    {"a comparison of consts folds to bool", FOLD,
     G "%0 = const 1 : f32[]\n%1 = const 2 : f32[]\n%2 = lt %0 %1 : bool[]\noutput %2\n", 1,
     G "%0 = const 1 : f32[]\n%1 = const 2 : f32[]\n%2 = const 1 : bool[]\noutput %2\n"},
    {"a folded const feeds the next fold", FOLD,
     G "%0 = const 1 : f64[]\n%1 = const 2 : f64[]\n%2 = add %0 %1 : f64[]\n%3 = mul %2 %1 : f64[]\n"
       "output %3\n", 2,
     G "%0 = const 1 : f64[]\n%1 = const 2 : f64[]\n%2 = const 3 : f64[]\n%3 = const 6 : f64[]\n"
       "output %3\n"},
    /* the evaluator would promote a scalar as a 0-d tensor (i32 * 2.5 to f64, not f32) */
    {"an op on a scalar constant does not fold", FOLD,
     G "%0 = const 3 : i32[]\n%1 = const 2.5 scalar : f64[]\n%2 = mul %0 %1 : f32[]\noutput %2\n",
     UNCHANGED},
    {"an op on an input does not fold", FOLD,
     G "%0 = input 0 : f32[]\n%1 = const 2 : f32[]\n%2 = add %0 %1 : f32[]\noutput %2\n", UNCHANGED},
    {"i64 2^53 folds", FOLD,
     G "%0 = const 67108864 : i64[]\n%1 = const 134217728 : i64[]\n%2 = mul %0 %1 : i64[]\noutput %2\n", 1,
     G "%0 = const 67108864 : i64[]\n%1 = const 134217728 : i64[]\n%2 = const 9007199254740992 : i64[]\n"
       "output %2\n"},
    /* 2^60 has an exact double, but i64 results past 2^53 in general do not */
    {"i64 beyond 2^53 does not fold", FOLD,
     G "%0 = const 1073741824 : i64[]\n%1 = mul %0 %0 : i64[]\noutput %1\n", UNCHANGED},

    /* dead code */
    {"dce drops unreachable nodes and keeps writeback values", DCE,
     G "%0 = input 0 : f32[4]\n%1 = capture 0 : f32[4]\n%2 = exp %0 : f32[4]\n%3 = neg %0 : f32[4]\n"
       "%4 = add %0 %1 : f32[4]\noutput %3\nwriteback 0 %4\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = capture 0 : f32[4]\n%2 = neg %0 : f32[4]\n"
       "%3 = add %0 %1 : f32[4]\noutput %2\nwriteback 0 %3\n"},
    {"dce drops a dead chain", DCE,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = log %1 : f32[4]\n%3 = neg %0 : f32[4]\n"
       "output %3\n", 2,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\noutput %1\n"},
    {"dce keeps a graph without dead nodes", DCE,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = log %1 : f32[4]\noutput %2\n", UNCHANGED},

    /* a product read only transposed, computed transposed (the old one left to dce) */
    {"(a@b)ᵀ -> bᵀ@aᵀ", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[2,4]\n"
       "%3 = permute %2 perm=1,0 : f32[4,2]\noutput %3\n", 1,
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[2,4]\n"
       "%3 = permute %1 perm=1,0 : f32[4,3]\n%4 = permute %0 perm=1,0 : f32[3,2]\n"
       "%5 = matmul %3 %4 : f32[4,2]\noutput %5\n"},
    {"(a@b)ᵀ -> bᵀ@aᵀ over a batch of a, b broadcast", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[5,2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[5,2,4]\n"
       "%3 = permute %2 perm=0,2,1 : f32[5,4,2]\noutput %3\n", 1,
     G "%0 = input 0 : f32[5,2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[5,2,4]\n"
       "%3 = permute %1 perm=1,0 : f32[4,3]\n%4 = permute %0 perm=0,2,1 : f32[5,3,2]\n"
       "%5 = matmul %3 %4 : f32[5,4,2]\noutput %5\n"},
    {"(a@b)ᵀ stays when the product is read untransposed too", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[2,4]\n"
       "%3 = permute %2 perm=1,0 : f32[4,2]\noutput %3 %2\n", UNCHANGED},
    {"(a@b)ᵀ stays when another node reads the product", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[3,4]\n%2 = matmul %0 %1 : f32[2,4]\n"
       "%3 = permute %2 perm=1,0 : f32[4,2]\n%4 = neg %2 : f32[2,4]\noutput %3 %4\n", UNCHANGED},
    {"(a@b)ᵀ stays when the product is written back", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[2,3]\n%1 = input 1 : f32[3,4]\n%2 = capture 0 : f32[2,4]\n"
       "%3 = matmul %0 %1 : f32[2,4]\n%4 = permute %3 perm=1,0 : f32[4,2]\noutput %4\nwriteback 0 %3\n", UNCHANGED},
    {"a permute of a product moving its batch axis stays", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[5,2,3]\n%1 = input 1 : f32[5,3,4]\n%2 = matmul %0 %1 : f32[5,2,4]\n"
       "%3 = permute %2 perm=1,0,2 : f32[2,5,4]\noutput %3\n", UNCHANGED},
    {"(x@b)ᵀ stays for a vector x", TRANSPOSE_PRODUCTS,
     G "%0 = input 0 : f32[3]\n%1 = input 1 : f32[5,3,4]\n%2 = matmul %0 %1 : f32[5,4]\n"
       "%3 = permute %2 perm=1,0 : f32[4,5]\noutput %3\n", UNCHANGED},

    /* softmax of a lone long row in the online form (long_rows.c; the old nodes left to dce) */
    {"softmax of a lone row of 100000 in pieces of 4000", LONG_ROWS, SOFTMAX("f32[1,100000]", "f32[1,1]"), 1,
     G "%0 = input 0 : f32[1,100000]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n"
       "%2 = sub %0 %1 : f32[1,100000]\n%3 = exp %2 : f32[1,100000]\n"
       "%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n%5 = reshape %0 : f32[1,25,4000]\n"
       "%6 = max %5 axis=2 keepdim=1 : f32[1,25,1]\n%7 = const -3.4028234663852886e+38 : f32[]\n"
       "%8 = maximum %6 %7 : f32[1,25,1]\n%9 = sub %5 %8 : f32[1,25,4000]\n%10 = exp %9 : f32[1,25,4000]\n"
       "%11 = sum %10 axis=2 keepdim=1 : f32[1,25,1]\n%12 = cast %11 : f64[1,25,1]\n"
       "%13 = log %12 : f64[1,25,1]\n%14 = cast %8 : f64[1,25,1]\n%15 = add %14 %13 : f64[1,25,1]\n"
       "%16 = reshape %15 : f64[1,25]\n%17 = max %16 axis=1 keepdim=1 : f64[1,1]\n"
       "%18 = cast %17 : f32[1,1]\n%19 = cast %18 : f64[1,1]\n%20 = sub %16 %19 : f64[1,25]\n"
       "%21 = exp %20 : f64[1,25]\n%22 = sum %21 axis=1 keepdim=1 : f64[1,1]\n%23 = cast %22 : f32[1,1]\n"
       "%24 = sub %0 %18 : f32[1,100000]\n%25 = exp %24 : f32[1,100000]\n%26 = div %25 %23 : f32[1,100000]\n"
       "output %26\n"},
    {"log_softmax of a lone row in pieces", LONG_ROWS,
     LOG_SUM_EXP_16384 "%6 = sub %2 %5 : f32[1,16384]\noutput %6\n", 1,
     LOG_SUM_EXP_16384 ONLINE_16384
       "%23 = sum %22 axis=1 keepdim=1 : f64[1,1]\n%24 = cast %23 : f32[1,1]\n"
       "%25 = sub %0 %19 : f32[1,16384]\n%26 = log %24 : f32[1,1]\n%27 = sub %25 %26 : f32[1,16384]\n"
       "output %27\n"},
    {"log-sum-exp (m + log(sum), cross entropy's) of a lone f64 row in pieces", LONG_ROWS,
     G "%0 = input 0 : f64[1,1,20000]\n%1 = max %0 axis=2 keepdim=1 : f64[1,1,1]\n%2 = sub %0 %1 : f64[1,1,20000]\n"
       "%3 = exp %2 : f64[1,1,20000]\n%4 = sum %3 axis=2 keepdim=1 : f64[1,1,1]\n%5 = log %4 : f64[1,1,1]\n"
       "%6 = add %1 %5 : f64[1,1,1]\noutput %6\n", 1,
     G "%0 = input 0 : f64[1,1,20000]\n%1 = max %0 axis=2 keepdim=1 : f64[1,1,1]\n"
       "%2 = sub %0 %1 : f64[1,1,20000]\n%3 = exp %2 : f64[1,1,20000]\n"
       "%4 = sum %3 axis=2 keepdim=1 : f64[1,1,1]\n%5 = log %4 : f64[1,1,1]\n"
       "%6 = reshape %0 : f64[1,1,5,4000]\n%7 = max %6 axis=3 keepdim=1 : f64[1,1,5,1]\n"
       "%8 = const -1.7976931348623157e+308 : f64[]\n%9 = maximum %7 %8 : f64[1,1,5,1]\n"
       "%10 = sub %6 %9 : f64[1,1,5,4000]\n%11 = exp %10 : f64[1,1,5,4000]\n"
       "%12 = sum %11 axis=3 keepdim=1 : f64[1,1,5,1]\n%13 = log %12 : f64[1,1,5,1]\n"
       "%14 = add %9 %13 : f64[1,1,5,1]\n%15 = reshape %14 : f64[1,1,5]\n"
       "%16 = max %15 axis=2 keepdim=1 : f64[1,1,1]\n%17 = sub %15 %16 : f64[1,1,5]\n"
       "%18 = exp %17 : f64[1,1,5]\n%19 = sum %18 axis=2 keepdim=1 : f64[1,1,1]\n"
       "%20 = log %19 : f64[1,1,1]\n%21 = add %20 %16 : f64[1,1,1]\noutput %21\n"},
    {"log-sum-exp as cross entropy writes it (log(sum) + m) of a lone row in pieces", LONG_ROWS,
     LOG_SUM_EXP_16384 "%6 = add %5 %1 : f32[1,1]\noutput %6\n", 1,
     LOG_SUM_EXP_16384 ONLINE_16384
       "%23 = sum %22 axis=1 keepdim=1 : f64[1,1]\n%24 = cast %23 : f32[1,1]\n%25 = log %24 : f32[1,1]\n"
       "%26 = add %25 %19 : f32[1,1]\noutput %26\n"},
    {"softmax, log_softmax and log-sum-exp of one row: three roots over one online form", LONG_ROWS,
     G "%0 = input 0 : f32[1,16384]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = sub %0 %1 : f32[1,16384]\n"
       "%3 = exp %2 : f32[1,16384]\n%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n%5 = div %3 %4 : f32[1,16384]\n"
       "%6 = log %4 : f32[1,1]\n%7 = sub %2 %6 : f32[1,16384]\n%8 = add %6 %1 : f32[1,1]\noutput %5 %7 %8\n", 3,
     G "%0 = input 0 : f32[1,16384]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n"
       "%2 = sub %0 %1 : f32[1,16384]\n%3 = exp %2 : f32[1,16384]\n%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n"
       "%5 = reshape %0 : f32[1,4,4096]\n%6 = max %5 axis=2 keepdim=1 : f32[1,4,1]\n"
       "%7 = const -3.4028234663852886e+38 : f32[]\n%8 = maximum %6 %7 : f32[1,4,1]\n"
       "%9 = sub %5 %8 : f32[1,4,4096]\n%10 = exp %9 : f32[1,4,4096]\n"
       "%11 = sum %10 axis=2 keepdim=1 : f32[1,4,1]\n%12 = cast %11 : f64[1,4,1]\n"
       "%13 = log %12 : f64[1,4,1]\n%14 = cast %8 : f64[1,4,1]\n%15 = add %14 %13 : f64[1,4,1]\n"
       "%16 = reshape %15 : f64[1,4]\n%17 = max %16 axis=1 keepdim=1 : f64[1,1]\n%18 = cast %17 : f32[1,1]\n"
       "%19 = cast %18 : f64[1,1]\n%20 = sub %16 %19 : f64[1,4]\n%21 = exp %20 : f64[1,4]\n"
       "%22 = sum %21 axis=1 keepdim=1 : f64[1,1]\n%23 = cast %22 : f32[1,1]\n"
       "%24 = sub %0 %18 : f32[1,16384]\n%25 = exp %24 : f32[1,16384]\n%26 = div %25 %23 : f32[1,16384]\n"
       "%27 = log %4 : f32[1,1]\n%28 = log %23 : f32[1,1]\n%29 = sub %24 %28 : f32[1,16384]\n"
       "%30 = add %28 %18 : f32[1,1]\noutput %26 %29 %30\n"},
    {"softmax of a lone row stays where its max is read before the shift", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = const 2 : f32[]\n"
       "%3 = mul %1 %2 : f32[1,1]\n%4 = sub %0 %1 : f32[1,100000]\n%5 = exp %4 : f32[1,100000]\n"
       "%6 = sum %5 axis=1 keepdim=1 : f32[1,1]\n%7 = div %5 %6 : f32[1,100000]\noutput %7 %3\n", UNCHANGED},
    {"softmax of a lone row stays where its sum is written back", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = capture 0 : f32[1,1]\n%2 = max %0 axis=1 keepdim=1 : f32[1,1]\n"
       "%3 = sub %0 %2 : f32[1,100000]\n%4 = exp %3 : f32[1,100000]\n%5 = sum %4 axis=1 keepdim=1 : f32[1,1]\n"
       "%6 = div %4 %5 : f32[1,100000]\noutput %6\nwriteback 0 %5\n", UNCHANGED},
    {"softmax of a lone row stays where its sum is an output too", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = sub %0 %1 : f32[1,100000]\n"
       "%3 = exp %2 : f32[1,100000]\n%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n%5 = div %3 %4 : f32[1,100000]\n"
       "output %5 %4\n", UNCHANGED},
    {"softmax of a lone row stays where its exponentials are read elsewhere (a gradient)", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = sub %0 %1 : f32[1,100000]\n"
       "%3 = exp %2 : f32[1,100000]\n%4 = sum %3 axis=1 keepdim=1 : f32[1,1]\n%5 = div %3 %4 : f32[1,100000]\n"
       "%6 = mul %3 %0 : f32[1,100000]\noutput %5 %6\n", UNCHANGED},
    {"softmax of a lone row stays where a product reads it (attention's own kernel)", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = input 1 : f32[100000,8]\n%2 = max %0 axis=1 keepdim=1 : f32[1,1]\n"
       "%3 = sub %0 %2 : f32[1,100000]\n%4 = exp %3 : f32[1,100000]\n%5 = sum %4 axis=1 keepdim=1 : f32[1,1]\n"
       "%6 = div %4 %5 : f32[1,100000]\n%7 = matmul %6 %1 : f32[1,8]\noutput %7\n", UNCHANGED},
    {"softmax of two long rows stays (three passes a thread measured faster)", LONG_ROWS,
     SOFTMAX("f32[2,100000]", "f32[2,1]"), UNCHANGED},
    {"softmax of a lone row of 8192 stays (short)", LONG_ROWS, SOFTMAX("f32[1,8192]", "f32[1,1]"), UNCHANGED},
    {"softmax of a lone row of 1000003 stays (no piece divides it)", LONG_ROWS,
     SOFTMAX("f32[1,1000003]", "f32[1,1]"), UNCHANGED},
    {"softmax of a lone symbolic row stays", LONG_ROWS,
     SOFTMAX("f32[1,s0]", "f32[1,1]"), UNCHANGED},
    {"exp(x - max(y)) / sum stays (not x's own max)", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = input 1 : f32[1,100000]\n%2 = max %1 axis=1 keepdim=1 : f32[1,1]\n"
       "%3 = sub %0 %2 : f32[1,100000]\n%4 = exp %3 : f32[1,100000]\n%5 = sum %4 axis=1 keepdim=1 : f32[1,1]\n"
       "%6 = div %4 %5 : f32[1,100000]\noutput %6\n", UNCHANGED},
    {"exp(x - max(x)) / sum of another exp stays", LONG_ROWS,
     G "%0 = input 0 : f32[1,100000]\n%1 = max %0 axis=1 keepdim=1 : f32[1,1]\n%2 = sub %0 %1 : f32[1,100000]\n"
       "%3 = exp %2 : f32[1,100000]\n%4 = exp %0 : f32[1,100000]\n%5 = sum %4 axis=1 keepdim=1 : f32[1,1]\n"
       "%6 = div %3 %5 : f32[1,100000]\noutput %6\n", UNCHANGED},

    /* compositions of transcendentals (rewrite.c) */
    {"tanh(log(1+exp x)) -> one exp and a quotient (mish)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = const 1 scalar : f64[]\n"
       "%3 = add %1 %2 : f32[4]\n%4 = log %3 : f32[4]\n%5 = tanh %4 : f32[4]\n%6 = mul %0 %5 : f32[4]\n"
       "output %6\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = const 4294967296 : f32[]\n"
       "%3 = minimum %1 %2 : f32[4]\n%4 = const 2 : f32[]\n%5 = add %3 %4 : f32[4]\n"
       "%6 = mul %3 %5 : f32[4]\n%7 = add %6 %4 : f32[4]\n%8 = div %6 %7 : f32[4]\n"
       "%9 = mul %0 %8 : f32[4]\noutput %9\n"},
    {"tanh(log x) stays (x may be negative)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = log %0 : f32[4]\n%2 = tanh %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"tanh(log(2+exp x)) stays", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = const 2 : f32[]\n%3 = add %1 %2 : f32[4]\n"
       "%4 = log %3 : f32[4]\n%5 = tanh %4 : f32[4]\noutput %5\n", UNCHANGED},
    {"x*0.5*(1+tanh u) stays (gelu: kiln's tanh costs less than its exp)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = const 0.5 scalar : f64[]\n%3 = mul %0 %2 : f32[4]\n"
       "%4 = tanh %1 : f32[4]\n%5 = const 1 scalar : f64[]\n%6 = add %4 %5 : f32[4]\n%7 = mul %3 %6 : f32[4]\n"
       "output %7\n", UNCHANGED},
    {"log(1+exp x) -> max(x,0)+log1p(exp(-|x|)) (softplus)", TRANSCENDENTAL,
     G "%0 = input 0 : f64[4]\n%1 = exp %0 : f64[4]\n%2 = const 1 : f64[]\n%3 = add %2 %1 : f64[4]\n"
       "%4 = log %3 : f64[4]\noutput %4\n", 1,
     G "%0 = input 0 : f64[4]\n%1 = exp %0 : f64[4]\n%2 = const 1 : f64[]\n"
       "%3 = add %2 %1 : f64[4]\n%4 = abs %0 : f64[4]\n%5 = neg %4 : f64[4]\n"
       "%6 = exp %5 : f64[4]\n%7 = add %6 %2 : f64[4]\n%8 = sub %7 %2 : f64[4]\n"
       "%9 = div %6 %8 : f64[4]\n%10 = log %7 : f64[4]\n%11 = mul %10 %9 : f64[4]\n"
       "%12 = eq %2 %7 : bool[4]\n%13 = where %12 %6 %11 : f64[4]\n%14 = const 0 : f64[]\n"
       "%15 = maximum %0 %14 : f64[4]\n%16 = add %15 %13 : f64[4]\noutput %16\n"},
    {"log(1+exp(-|x|)) stays (the form softplus becomes)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = abs %0 : f32[4]\n%2 = neg %1 : f32[4]\n%3 = exp %2 : f32[4]\n"
       "%4 = const 1 : f32[]\n%5 = add %3 %4 : f32[4]\n%6 = log %5 : f32[4]\noutput %6\n", UNCHANGED},
    {"log(sigmoid x) -> -(max(-x,0)+log1p(exp(-|x|)))", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = sigmoid %0 : f32[4]\n%2 = log %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = abs %0 : f32[4]\n%2 = neg %1 : f32[4]\n%3 = exp %2 : f32[4]\n"
       "%4 = const 1 : f32[]\n%5 = add %3 %4 : f32[4]\n%6 = sub %5 %4 : f32[4]\n%7 = div %3 %6 : f32[4]\n"
       "%8 = log %5 : f32[4]\n%9 = mul %8 %7 : f32[4]\n%10 = eq %4 %5 : bool[4]\n"
       "%11 = where %10 %3 %9 : f32[4]\n%12 = neg %0 : f32[4]\n%13 = const 0 : f32[]\n"
       "%14 = maximum %12 %13 : f32[4]\n%15 = add %14 %11 : f32[4]\n%16 = neg %15 : f32[4]\noutput %16\n"},
    {"log(tanh x) stays", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = tanh %0 : f32[4]\n%2 = log %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"exp(log x) -> x >= 0 ? x+0 : NaN", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = log %0 : f32[4]\n%2 = exp %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = ge %0 %1 : bool[4]\n"
       "%3 = add %0 %1 : f32[4]\n%4 = const nan : f32[]\n%5 = where %2 %3 %4 : f32[4]\n"
       "output %5\n"},
    {"exp(log x) stays for an i32 x", TRANSCENDENTAL,
     G "%0 = input 0 : i32[4]\n%1 = log %0 : f32[4]\n%2 = exp %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"log(exp x) -> x+0", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = log %1 : f32[4]\noutput %2\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = const 0 : f32[]\n%2 = add %0 %1 : f32[4]\noutput %2\n"},
    {"log(exp x) stays for an i32 x", TRANSCENDENTAL,
     G "%0 = input 0 : i32[4]\n%1 = exp %0 : f32[4]\n%2 = log %1 : f32[4]\noutput %2\n", UNCHANGED},
    {"1-sigmoid x -> sigmoid(-x)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = sigmoid %0 : f32[4]\n%2 = const 1 : f32[]\n%3 = sub %2 %1 : f32[4]\n"
       "output %3\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\n%2 = sigmoid %1 : f32[4]\noutput %2\n"},
    {"-sigmoid x + 1 -> sigmoid(-x)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = sigmoid %0 : f32[4]\n%2 = neg %1 : f32[4]\n%3 = const 1 scalar : f64[]\n"
       "%4 = add %2 %3 : f32[4]\noutput %4\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\n%2 = sigmoid %1 : f32[4]\noutput %2\n"},
    {"-sigmoid x + 2 stays", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = sigmoid %0 : f32[4]\n%2 = neg %1 : f32[4]\n%3 = const 2 : f32[]\n"
       "%4 = add %2 %3 : f32[4]\noutput %4\n", UNCHANGED},
    {"sigmoid x - 1 stays", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = sigmoid %0 : f32[4]\n%2 = const 1 : f32[]\n%3 = sub %1 %2 : f32[4]\n"
       "output %3\n", UNCHANGED},
    {"1/(1+exp x) -> sigmoid(-x)", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = const 1 : f32[]\n%3 = add %1 %2 : f32[4]\n"
       "%4 = div %2 %3 : f32[4]\noutput %4\n", 1,
     G "%0 = input 0 : f32[4]\n%1 = neg %0 : f32[4]\n%2 = sigmoid %1 : f32[4]\noutput %2\n"},
    {"2/(1+exp x) stays", TRANSCENDENTAL,
     G "%0 = input 0 : f32[4]\n%1 = exp %0 : f32[4]\n%2 = const 1 : f32[]\n%3 = add %1 %2 : f32[4]\n"
       "%4 = const 2 : f32[]\n%5 = div %4 %3 : f32[4]\noutput %5\n", UNCHANGED},
};

START_TEST(test_pass_rewrites)
{
    const pass_case *c = &pass_cases[_i];
    ir_graph *g = parse_ok(c->before);
    int rewrites = run_pass(c->pass, &g);
    assert_verifies(g, c->name);
    const char *want = c->after ? c->after : c->before;
    char *got = text_of(g);
    ck_assert_msg(!strcmp(got, want), "%s: got\n%s\nexpected\n%s", c->name, got, want);
    free(got);
    ck_assert_msg(rewrites == c->rewrites, "%s: the pass reported %d rewrites, made %d", c->name,
                  rewrites, c->rewrites);
    ir_graph_free(g);
}
END_TEST

/* A rewrite that emits a node naming its operand's operand must not hand
 * ir_emit a pointer into the operand array that the emit itself may move.
 * Padding from 0 to 69 nodes puts that emit at each early growth of the array. */
static void check_rewrite_across_growth(ir_op op)
{
    const ir_params transpose = {.perm = {1, 0}};
    bool reshape = op == OP_RESHAPE;
    for (int pad = 0; pad < 70; pad++) {
        ir_graph *g = new_graph();
        ir_ref x = input(g, 0, KILN_F32, SHAPE(4, 6));
        ir_ref inner = reshape ? move(g, op, x, SHAPE(24), NULL) : move(g, op, x, SHAPE(6, 4), &transpose);
        ir_ref e = inner;
        for (int i = 0; i < pad; i++)
            e = unary(g, OP_EXP, e);
        /* reshape [24] -> [6,4], or transpose back (composing to perm 0,1) */
        ir_ref outer = reshape ? move(g, op, inner, SHAPE(6, 4), NULL)
                               : move(g, op, inner, SHAPE(4, 6), &transpose);
        add_output(g, outer);
        add_output(g, e);
        ck_assert_int_ge(ir_pass_simplify(&g, false), 0);
        assert_verifies(g, "rewritten chain");
        const ir_node *out = &g->nodes[g->outputs[0]];
        ck_assert_msg(out->op == op && ir_operands(g, out)[0] == x, "pad %d: output is %s of %%%u",
                      pad, ir_ops[out->op].name, ir_operands(g, out)[0]);
        ir_graph_free(g);
    }
}

START_TEST(test_reshape_of_reshape_survives_operand_growth)
{
    check_rewrite_across_growth(OP_RESHAPE);
}
END_TEST

START_TEST(test_permute_of_permute_survives_operand_growth)
{
    check_rewrite_across_growth(OP_PERMUTE);
}
END_TEST

/* A scalar literal promotes more weakly than the 0-d tensor computed from it:
 * i32[4] + (2.0 * 1.0) is f64 with the product a 0-d f64 tensor, but f32
 * with a scalar 2.0 in its place. A rewrite may not swap one for the other. */
START_TEST(test_rewrites_keep_a_zero_d_tensor_from_becoming_a_scalar)
{
    const char *texts[] = {
        G "%0 = input 0 : i32[4]\n%1 = const 2 scalar : f64[]\n%2 = const 1 : f64[]\n"
          "%3 = mul %1 %2 : f64[]\n%4 = add %0 %3 : f64[4]\noutput %4\n",
        G "%0 = input 0 : i32[4]\n%1 = const 2 scalar : f64[]\n%2 = maximum %1 %1 : f64[]\n"
          "%3 = add %0 %2 : f64[4]\noutput %3\n",
        G "%0 = input 0 : i32[4]\n%1 = const 2 scalar : f64[]\n%2 = cast %1 : f64[]\n"
          "%3 = add %0 %2 : f64[4]\noutput %3\n",
    };
    for (int i = 0; i < COUNT(texts); i++) {
        ir_graph *g = parse_ok(texts[i]);
        ck_assert_int_ge(ir_pass_simplify(&g, false), 0);
        assert_verifies(g, texts[i]);
        ir_graph_free(g);
    }
}
END_TEST

START_TEST(test_dce_keeps_the_input_count)
{
    /* the caller passes every input whether or not the graph still reads it */
    ir_graph *g = parse_ok(G "%0 = input 0 : f32[4]\n%1 = input 1 : f32[4]\n%2 = neg %1 : f32[4]\n"
                             "output %2\n");
    ck_assert_int_eq(ir_pass_dce(&g), 1);
    assert_verifies(g, "after dce");
    assert_text(g, G "%0 = input 1 : f32[4]\n%1 = neg %0 : f32[4]\noutput %1\n");
    ck_assert_int_eq(g->n_inputs, 2);
    ir_graph_free(g);
}
END_TEST

static ir_pass_options options(bool fast_math)
{
    return (ir_pass_options){.eval = eager_eval_const, .fast_math = fast_math, .verify = true,
                             .transcendental = true, .long_rows = true};
}

START_TEST(test_optimize_runs_every_pass_to_the_end)
{
    /* folding makes the 1 that simplification needs; permutes cancel; dce sweeps */
    ir_graph *g = parse_ok(G "%0 = input 0 : f32[2,3]\n"
                             "%1 = const 3 : f32[]\n"
                             "%2 = const 2 : f32[]\n"
                             "%3 = sub %1 %2 : f32[]\n"
                             "%4 = mul %0 %3 : f32[2,3]\n"
                             "%5 = permute %4 perm=1,0 : f32[3,2]\n"
                             "%6 = permute %5 perm=1,0 : f32[2,3]\n"
                             "%7 = contiguous %6 : f32[2,3]\n"
                             "%8 = neg %7 : f32[2,3]\n"
                             "%9 = neg %8 : f32[2,3]\n"
                             "output %9\n");
    char err[ERR] = "";
    ir_pass_options opt = options(false);
    ck_assert_msg(ir_optimize(&g, &opt, err, sizeof err) == 0, "%s", err);
    assert_verifies(g, "optimized");
    assert_text(g, G "%0 = input 0 : f32[2,3]\noutput %0\n");
    ir_graph_free(g);
}
END_TEST

/* The inner permute stays (it is an output), so no node dies in the first
 * round: only the rewrite count tells ir_optimize to run the round that
 * drops the identity permute the composition made. */
START_TEST(test_optimize_follows_a_rewrite_that_exposes_another)
{
    ir_graph *g = parse_ok(G "%0 = input 0 : f32[2,3]\n"
                             "%1 = permute %0 perm=1,0 : f32[3,2]\n"
                             "%2 = permute %1 perm=1,0 : f32[2,3]\n"
                             "output %1 %2\n");
    char err[ERR] = "";
    ir_pass_options opt = options(false);
    ck_assert_msg(ir_optimize(&g, &opt, err, sizeof err) == 0, "%s", err);
    assert_verifies(g, "optimized");
    assert_text(g, G "%0 = input 0 : f32[2,3]\n%1 = permute %0 perm=1,0 : f32[3,2]\noutput %1 %0\n");
    ir_graph_free(g);
}
END_TEST

/* ir_optimize on a graph: it succeeds, the result verifies, and it is a fixed
 * point (a second run changes nothing), so it stopped because it was done. */
static void check_optimize_settles(ir_graph *g, bool fast_math, const char *what)
{
    char err[ERR] = "";
    ir_pass_options opt = options(fast_math);
    ck_assert_msg(ir_optimize(&g, &opt, err, sizeof err) == 0, "%s: %s", what, err);
    assert_verifies(g, what);
    char *once = text_of(g);
    ck_assert_msg(ir_optimize(&g, &opt, err, sizeof err) == 0, "%s: %s", what, err);
    assert_text(g, once);
    free(once);
    ir_graph_free(g);
}

START_TEST(test_optimize_settles_on_every_pass_case)
{
    check_optimize_settles(parse_ok(pass_cases[_i].before), false, pass_cases[_i].name);
    check_optimize_settles(parse_ok(pass_cases[_i].before), true, pass_cases[_i].name);
}
END_TEST

START_TEST(test_optimize_settles_on_every_op)
{
    check_optimize_settles(every_op_graph(), false, "every op");
    check_optimize_settles(every_op_graph(), true, "every op, fast_math");
}
END_TEST

/* -- Suite ----------------------------------------------------------------- */

static Suite *ir_suite(void)
{
    Suite *s = suite_create("ir");
    TCase *build = tcase_create("building");
    tcase_add_test(build, test_equal_nodes_are_one_node);
    tcase_add_test(build, test_nodes_differing_in_anything_are_distinct);
    tcase_add_test(build, test_commutative_operands_meet_in_either_order);
    tcase_add_test(build, test_lookups_stay_right_as_the_table_grows);
    suite_add_tcase(s, build);

    TCase *text = tcase_create("text");
    tcase_add_test(text, test_every_op_round_trips_through_text);
    tcase_add_test(text, test_constants_parse_to_the_same_double);
    tcase_add_test(text, test_the_documented_example_round_trips);
    tcase_add_test(text, test_dot_has_one_edge_per_operand);
    tcase_add_test(text, test_symbolic_shapes_round_trip_and_verify);
    suite_add_tcase(s, text);

    TCase *parser = tcase_create("parser robustness");
    tcase_set_timeout(parser, 120);
    tcase_add_loop_test(parser, test_malformed_text_is_rejected_with_its_line, 0, COUNT(malformed));
    tcase_add_loop_test(parser, test_unsound_text_is_rejected_by_the_verifier, 0, COUNT(unsound));
    tcase_add_test(parser, test_every_truncation_fails_or_ends_after_the_output_line);
    tcase_add_test(parser, test_random_byte_flips_never_crash);
    tcase_add_test(parser, test_a_parameter_the_op_does_not_take_is_rejected);
    tcase_add_test(parser, test_numbers_too_large_for_the_counts_are_rejected);
    suite_add_tcase(s, parser);

    TCase *verifier = tcase_create("verifier");
    tcase_add_loop_test(verifier, test_verifier_rejects_each_defect_alone, 0, COUNT(verifier_cases));
    suite_add_tcase(s, verifier);

    TCase *passes = tcase_create("passes");
    tcase_set_timeout(passes, 60);
    tcase_add_loop_test(passes, test_pass_rewrites, 0, COUNT(pass_cases));
    tcase_add_test(passes, test_reshape_of_reshape_survives_operand_growth);
    tcase_add_test(passes, test_permute_of_permute_survives_operand_growth);
    tcase_add_test(passes, test_rewrites_keep_a_zero_d_tensor_from_becoming_a_scalar);
    tcase_add_test(passes, test_dce_keeps_the_input_count);
    tcase_add_test(passes, test_optimize_runs_every_pass_to_the_end);
    tcase_add_test(passes, test_optimize_follows_a_rewrite_that_exposes_another);
    tcase_add_loop_test(passes, test_optimize_settles_on_every_pass_case, 0, COUNT(pass_cases));
    tcase_add_test(passes, test_optimize_settles_on_every_op);
    suite_add_tcase(s, passes);
    return s;
}

KILN_TEST_MAIN(ir_suite)
