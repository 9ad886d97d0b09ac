/* What the autograd engine (autograd.c) and its rules (grad_rules.c) share. */
#ifndef KILN_EAGER_GRAD_H
#define KILN_EAGER_GRAD_H

#include "eager/internal.h"

/* One operand of a recorded op. Gradients flow to it when fn or leaf is set. */
typedef struct {
    struct grad_node *fn; /* retained: the record of the op that computed it */
    kiln_tensor *leaf;    /* retained: the operand itself, a leaf that needs gradients */
    kiln_tensor *saved;   /* retained: its value, where the rule reads it */
    unsigned version;     /* of saved's storage when saved */
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
} grad_input;

/* The record of one op whose result needs gradients. */
typedef struct grad_node {
    _Atomic int refs;      /* the result and the records of ops that used it */
    ir_op op;
    ir_params params;
    kiln_tensor *out;      /* the result, detached, where the rule reads it */
    unsigned visit;        /* the backward walk that saw it last */
    kiln_tensor *acc;      /* during a walk: the result's gradient so far */
    int n_in;
    grad_input in[];
} grad_node;

/* Writes d loss / d operand i into gin[i] for each operand that needs it,
 * given g = d loss / d result; a gradient may have the result's broadcast
 * shape (the engine sums it to the operand's) and any float dtype. gin[i]
 * NULL where none flows. Results are owned by the caller's scope; 0, or -1
 * with an error set. */
typedef int (*grad_rule_fn)(const grad_node *n, kiln_tensor *g, kiln_tensor **gin);

enum { GRAD_SAVE_OUT = 1u << 31, GRAD_SAVE_INPUTS = 0x7fffffffu };
#define GRAD_SAVE_IN(i) (1u << (i))

typedef struct {
    grad_rule_fn fn; /* NULL: the op has no gradient */
    unsigned saves;  /* GRAD_SAVE_IN(i) for the operands the rule reads, GRAD_SAVE_OUT */
} grad_rule;

/* Indexed by op: an op whose row is empty is not differentiable. */
extern const grad_rule grad_rules[OP__COUNT];

static inline bool grad_needed(const grad_node *n, int i)
{
    return n->in[i].fn || n->in[i].leaf;
}

/* A tensor of like's dtype and device (a constant that traces) of value,
 * broadcast to shape; owned by the scope. */
kiln_tensor *grad_full(const kiln_tensor *like, int ndim, const int64_t *shape, double value);
/* A 0-d constant value that promotes as a scalar (keeps the other operand's
 * dtype); owned by the scope. */
kiln_tensor *grad_scalar(double value);

#endif
