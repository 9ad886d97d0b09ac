/* The op table and the dtype rules every module shares. */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <kiln/kiln.h>

typedef enum {
#define OP(N, n, arity, kind, flags, rule) OP_##N,
#include "ir/ops.def"
    OP__COUNT
} ir_op;

typedef enum {
    KIND_ELEMENTWISE,
    KIND_REDUCTION,
    KIND_MOVEMENT,
    KIND_MATMUL,
    KIND_ASSIGN,
} ir_kind;

enum {
    FLAG_0 = 0,
    FLAG_COMMUTATIVE = 1,
    FLAG_SIDE_EFFECT = 2,
    FLAG_TRANSCENDENTAL = 4, /* costly per element: worth threads sooner */
};

/* How an op's result dtype follows from its operands' dtypes. */
typedef enum {
    RULE_ARITH,        /* the promoted dtype */
    RULE_ARITH_NOBOOL, /* the promoted dtype; bool refused */
    RULE_TRUEDIV,      /* the promoted dtype, integers and bool to f32 */
    RULE_COMPARE,      /* bool, computed in the promoted dtype */
    RULE_WHERE,        /* the promotion of the two values; cond must be bool */
    RULE_SIGNED,       /* the operand's dtype; bool refused */
    RULE_FLOAT,        /* the operand's dtype if floating, else f32 */
    RULE_PARAM,        /* the dtype the op is given */
    RULE_SUM,          /* floats keep theirs, integers and bool give i64 */
    RULE_MEAN,         /* floats keep theirs, integers and bool give f32 */
    RULE_SAME,         /* the operand's dtype */
    RULE_INDEX,        /* i64 */
    RULE_PROMOTE,      /* the promotion of every operand */
    RULE_MATMUL,       /* the promoted dtype; bool refused */
} ir_dtype_rule;

typedef struct {
    const char *name;
    int arity;
    ir_kind kind;
    int flags;
    ir_dtype_rule rule;
} ir_op_info;

extern const ir_op_info ir_ops[OP__COUNT];

static inline bool ir_dtype_is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64;
}

/* The dtype two operands compute in: the higher category (bool, integer,
 * float) wins, and a 0-d operand only matters when it raises the category, as
 * in PyTorch. */
kiln_dtype ir_promote(kiln_dtype a, bool a_is_0d, kiln_dtype b, bool b_is_0d);

/* The result dtype of rule applied to the promoted operand dtype, or -1 when
 * the rule refuses it. */
int ir_result_dtype(ir_dtype_rule rule, kiln_dtype promoted);

#endif
