/* What the files of src/ir share among themselves. */
#ifndef KILN_IR_INTERNAL_H
#define KILN_IR_INTERNAL_H

#include "core/core.h"
#include "ir/kernel.h"

/* size.c: writes size into out: "64", or "s0", "2*s0*s1+3". */
void ir_size_put(strbuf *out, const ir_sizes *t, int64_t size);

/* kernel.c: makes room for need items of size bytes in *items, doubling
 * *cap; false when out of memory (the items stay as they were). */
bool ir_grow(void **items, int *cap, int need, size_t size);
/* kernel.c: the length of the pieces that rows of cols elements split into
 * so that threads share them: the longest in [least, most] dividing cols,
 * a multiple of 16 where one is (pieces of f32 then start on cache lines);
 * 0 for none. */
int64_t ir_row_piece(int64_t cols, int64_t most, int64_t least);

/* lower.c: splits g into fusion groups, a step each (plan->steps), and the
 * nodes run eagerly (matmul, reductions over other axes, concat, ...);
 * plan->materialized marks the nodes whose values exist when it runs
 * (sources, views and buffers). When
 * split_sums, a sum of f32 exponentials over a short row may stay in f32.
 * 0; -CORE_NOMEM; or -CORE_INTERNAL with why in err. */
int ir_lower(const ir_graph *g, bool split_sums, ir_plan *plan, char *err, size_t err_size);
/* lower.c: a kernel copying node r's value from buffer 0 into buffer 1
 * (a product's kernel of its own, once the planner makes buffer 0 the
 * product); NULL, *nomem set when out of memory, else when a size of it
 * does not fit the kernel's table. */
kx_kernel *ir_lower_copy(const ir_graph *g, ir_ref r, bool *nomem);

/* passes.c: every pass rebuilds the graph. A rewrite answers node n of the
 * old graph, its operands renamed into out, with a node of out, or IR_NONE
 * to have n copied. */
typedef ir_ref (*ir_rewrite_fn)(ir_graph *out, const ir_node *n, const ir_ref *operands, void *ctx);

/* A copy of in keeping the nodes marked live (all if live is NULL), each
 * offered to rewrite first; counts rewrites in *changes. NULL when out of
 * memory. */
ir_graph *ir_rebuild(const ir_graph *in, const bool *live, ir_rewrite_fn rewrite, void *ctx,
                     int *changes);

/* Frees *g and puts next in its place; changes, or -1 when next is NULL. */
int ir_replace(ir_graph **g, ir_graph *next, int changes);

/* passes.c: per node of g, the nodes, outputs and writebacks reading it
 * (malloc'd); NULL when out of memory. */
uint32_t *ir_count_uses(const ir_graph *g);

#endif
