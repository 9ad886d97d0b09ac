/* The op table expanded into data, and the dtype rules. */
#include "ir/ir.h"

const ir_op_info ir_ops[OP__COUNT] = {
#define OP(N, n, arity, kind, flags, rule) \
    [OP_##N] = {#n, arity, KIND_##kind, FLAG_##flags, RULE_##rule},
#include "ir/ops.def"
};

static int category(kiln_dtype dt)
{
    return dt == KILN_BOOL ? 0 : ir_dtype_is_float(dt) ? 2 : 1;
}

static int rank(kiln_dtype dt)
{
    static const int ranks[] = {[KILN_BOOL] = 0, [KILN_I32] = 1, [KILN_I64] = 2,
                                [KILN_F32] = 3, [KILN_F64] = 4};
    return ranks[dt];
}

kiln_dtype ir_promote(kiln_dtype a, bool a_is_0d, kiln_dtype b, bool b_is_0d)
{
    if (a_is_0d != b_is_0d) {
        kiln_dtype dim = a_is_0d ? b : a, zero = a_is_0d ? a : b;
        return category(zero) > category(dim) ? zero : dim;
    }
    return rank(a) >= rank(b) ? a : b;
}

int ir_result_dtype(ir_dtype_rule rule, kiln_dtype promoted)
{
    bool is_float = ir_dtype_is_float(promoted);
    switch (rule) {
    case RULE_ARITH:
    case RULE_WHERE:
    case RULE_SAME:
    case RULE_PROMOTE:
        return promoted;
    case RULE_ARITH_NOBOOL:
    case RULE_SIGNED:
    case RULE_MATMUL:
        return promoted == KILN_BOOL ? -1 : (int)promoted;
    case RULE_TRUEDIV:
    case RULE_FLOAT:
    case RULE_MEAN:
        return is_float ? promoted : KILN_F32;
    case RULE_COMPARE:
        return KILN_BOOL;
    case RULE_SUM:
        return is_float ? promoted : KILN_I64;
    case RULE_INDEX:
        return KILN_I64;
    case RULE_PARAM:
        break;
    }
    return -1;
}
