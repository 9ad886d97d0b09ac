/* Graph construction: one node array, hash-consed at emit time.
 *
 * ir_emit looks a node up before appending it, so equal nodes (same op,
 * dtype, shape, operands and parameters) are one node: common subexpression
 * elimination comes for free whenever a graph is built or rebuilt. Operands
 * of commutative ops on integers and bools are put in ascending order first,
 * so a+b and b+a meet; for floats the order shows (the first operand's NaN
 * wins, max(+0,-0) keeps its first), so it stays. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

ir_graph *ir_graph_new(void)
{
    ir_graph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->n_buckets = 64;
    g->buckets = malloc(g->n_buckets * sizeof *g->buckets);
    if (!g->buckets) {
        free(g);
        return NULL;
    }
    memset(g->buckets, 0xff, g->n_buckets * sizeof *g->buckets);
    return g;
}

void ir_graph_free(ir_graph *g)
{
    if (!g)
        return;
    free(g->nodes);
    free(g->operands);
    free(g->buckets);
    free(g->outputs);
    free(g->writebacks);
    ir_sizes_free(&g->sizes);
    free(g);
}

/* Grows *items (of size bytes each) to hold at least need; false when out of memory. */
static bool grow(void **items, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return true;
    uint32_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*items, n * size);
    if (!p)
        return false;
    *items = p;
    *cap = n;
    return true;
}

static uint64_t hash_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t node_hash(const ir_node *n, const ir_ref *operands)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_bytes(h, &n->op, sizeof n->op);
    h = hash_bytes(h, &n->dtype, sizeof n->dtype);
    h = hash_bytes(h, n->shape, (size_t)n->ndim * sizeof *n->shape);
    if (n->n_operands)
        h = hash_bytes(h, operands, n->n_operands * sizeof *operands);
    return hash_bytes(h, &n->params, sizeof n->params);
}

static bool node_equal(const ir_graph *g, const ir_node *a, const ir_node *b, const ir_ref *b_operands)
{
    return a->op == b->op && a->dtype == b->dtype && a->ndim == b->ndim &&
           a->n_operands == b->n_operands &&
           !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) &&
           (a->n_operands == 0 ||
            !memcmp(ir_operands(g, a), b_operands, a->n_operands * sizeof *b_operands)) &&
           !memcmp(&a->params, &b->params, sizeof a->params);
}

static bool rehash(ir_graph *g)
{
    uint32_t n = g->n_buckets * 2;
    uint32_t *buckets = malloc(n * sizeof *buckets);
    if (!buckets)
        return false;
    memset(buckets, 0xff, n * sizeof *buckets);
    for (uint32_t r = 0; r < g->count; r++) {
        ir_node *node = &g->nodes[r];
        uint32_t b = (uint32_t)node_hash(node, ir_operands(g, node)) & (n - 1);
        node->hash_next = buckets[b];
        buckets[b] = r;
    }
    free(g->buckets);
    g->buckets = buckets;
    g->n_buckets = n;
    return true;
}

ir_ref ir_emit(ir_graph *g, ir_op op, kiln_dtype dt, int ndim, const int64_t *shape,
               int n_operands, const ir_ref *operands, const ir_params *params)
{
    ir_node key = {.op = op, .dtype = dt, .ndim = ndim, .n_operands = (uint32_t)n_operands};
    if (ndim)
        memcpy(key.shape, shape, (size_t)ndim * sizeof *shape);
    if (params)
        key.params = *params;
    ir_ref ordered[2];
    bool exact = !ir_dtype_is_float(dt); /* comparisons give bool: swapping them is exact */
    if ((ir_ops[op].flags & FLAG_COMMUTATIVE) && exact && n_operands == 2 && operands[0] > operands[1]) {
        ordered[0] = operands[1];
        ordered[1] = operands[0];
        operands = ordered;
    }
    uint64_t h = node_hash(&key, operands);
    for (ir_ref r = g->buckets[h & (g->n_buckets - 1)]; r != IR_NONE; r = g->nodes[r].hash_next)
        if (node_equal(g, &g->nodes[r], &key, operands))
            return r;

    if (!grow((void **)&g->nodes, &g->cap, g->count + 1, sizeof *g->nodes) ||
        !grow((void **)&g->operands, &g->operands_cap, g->n_operands + (uint32_t)n_operands,
              sizeof *g->operands))
        return IR_NONE;
    key.first_operand = g->n_operands;
    if (n_operands)
        memcpy(g->operands + g->n_operands, operands, (size_t)n_operands * sizeof *operands);
    g->n_operands += (uint32_t)n_operands;
    ir_ref r = g->count++;
    uint32_t b = (uint32_t)h & (g->n_buckets - 1);
    key.hash_next = g->buckets[b];
    g->buckets[b] = r;
    g->nodes[r] = key;
    if (op == OP_INPUT && key.params.index >= g->n_inputs)
        g->n_inputs = (int)key.params.index + 1;
    if (op == OP_CAPTURE && key.params.index >= g->n_captures)
        g->n_captures = (int)key.params.index + 1;
    if (g->count > g->n_buckets && !rehash(g))
        return IR_NONE;
    return r;
}

int ir_add_output(ir_graph *g, ir_ref r)
{
    uint32_t cap = (uint32_t)g->outputs_cap;
    if (!grow((void **)&g->outputs, &cap, (uint32_t)g->n_outputs + 1, sizeof *g->outputs))
        return -1;
    g->outputs_cap = (int)cap;
    g->outputs[g->n_outputs++] = r;
    return 0;
}

int ir_add_writeback(ir_graph *g, int64_t capture, ir_ref value)
{
    uint32_t cap = (uint32_t)g->writebacks_cap;
    if (!grow((void **)&g->writebacks, &cap, (uint32_t)g->n_writebacks + 1, sizeof *g->writebacks))
        return -1;
    g->writebacks_cap = (int)cap;
    g->writebacks[g->n_writebacks++] = (ir_writeback){capture, value};
    if (capture >= g->n_captures)
        g->n_captures = (int)capture + 1;
    return 0;
}

bool ir_shape_numel(int ndim, const int64_t *shape, int64_t *numel)
{
    int64_t nonzero = 1;
    bool empty = false;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return false;
        if (shape[d] == 0) {
            empty = true;
            continue;
        }
        if (__builtin_mul_overflow(nonzero, shape[d], &nonzero) || nonzero > IR_MAX_NUMEL)
            return false;
    }
    *numel = empty ? 0 : nonzero;
    return true;
}

int64_t ir_node_numel(const ir_node *n)
{
    int64_t count = 1;
    for (int d = 0; d < n->ndim; d++)
        count *= n->shape[d];
    return count;
}

bool ir_node_computes(const ir_node *n)
{
    ir_kind kind = ir_ops[n->op].kind;
    if (kind == KIND_SOURCE)
        return ir_ops[n->op].flags & FLAG_RANDOM;
    return !(kind == KIND_MOVEMENT && n->op != OP_CONCAT && n->op != OP_CONTIGUOUS);
}
