/* The op table expanded into data, and the dtype rules. */
#include "ir/ir.h"

const ir_op_info ir_ops[OP__COUNT] = {
#define OP(N, n, arity, kind, flags, rule) \
    [OP_##N] = {#n, arity, KIND_##kind, FLAG_##flags, RULE_##rule},
#include "ir/ops.def"
};

const char *const ir_dtype_names[KILN_BOOL + 1] = {"f32", "f64", "i32", "i64", "bool"};

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

static kiln_dtype category_default(int cat)
{
    return cat == 2 ? KILN_F32 : cat == 1 ? KILN_I64 : KILN_BOOL;
}

kiln_dtype ir_promote(kiln_dtype a, ir_rank_class a_class, kiln_dtype b, ir_rank_class b_class)
{
    if (a_class == b_class)
        return rank(a) >= rank(b) ? a : b;
    kiln_dtype high = a_class > b_class ? a : b, low = a_class > b_class ? b : a;
    ir_rank_class low_class = a_class > b_class ? b_class : a_class;
    if (category(low) <= category(high))
        return high;
    return low_class == IR_SCALAR ? category_default(category(low)) : low;
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
