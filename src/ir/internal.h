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

/* lower.c: splits g into fusion groups, a step each (plan->steps), and the
 * nodes run eagerly (matmul, reductions over other axes, concat, ...);
 * plan->materialized marks the nodes whose values exist when it runs
 * (sources, views and buffers). When
 * split_sums, a sum of f32 exponentials over a short row may stay in f32.
 * 0; -CORE_NOMEM; or -CORE_INTERNAL with why in err. */
int ir_lower(const ir_graph *g, bool split_sums, ir_plan *plan, char *err, size_t err_size);

#endif
