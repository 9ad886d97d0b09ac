/* Dtype conversion and walks over strided N-d views. */
#include <string.h>

#include "eager/isa.h"

/* Compiled once per level (isa.h). */
#define convert ISA_NAME(convert)
#define strided_gather ISA_NAME(strided_gather)
#define strided_scatter ISA_NAME(strided_scatter)

/* Float to integer: truncate toward zero, saturate, NaN gives 0 (C leaves
 * out-of-range conversions undefined; kiln must not). */
static inline int32_t to_i32(double x)
{
    return x != x ? 0 : x <= INT32_MIN ? INT32_MIN : x >= INT32_MAX ? INT32_MAX : (int32_t)x;
}

static inline int64_t to_i64(double x)
{
    return x != x ? 0 : x <= -0x1p63 ? INT64_MIN : x >= 0x1p63 ? INT64_MAX : (int64_t)x;
}

#define AS_F32(x) ((float)(x))
#define AS_F64(x) ((double)(x))
#define AS_I64(x) ((int64_t)(x))
#define AS_I32(x) ((int32_t)(uint32_t)(int64_t)(x)) /* from integers: wraps */
#define AS_BOOL(x) ((uint8_t)((x) != 0))
#define FLOAT_AS_I32(x) to_i32(x)
#define FLOAT_AS_I64(x) to_i64(x)

/* A stride of 0 (a broadcast operand) converts one value and fills: the
 * strided loop would read it n times, one element at a time. */
#define CONVERT(D, S, EXPR)                                               \
    do {                                                                  \
        D *restrict d_ = dst;                                             \
        const S *restrict s_ = src;                                       \
        if (stride == 1) {                                                \
            for (int64_t i = 0; i < n; i++) d_[i] = EXPR(s_[i]);          \
        } else if (stride == 0) {                                         \
            D v_ = EXPR(s_[0]);                                           \
            for (int64_t i = 0; i < n; i++) d_[i] = v_;                   \
        } else {                                                          \
            for (int64_t i = 0; i < n; i++) d_[i] = EXPR(s_[i * stride]); \
        }                                                                 \
    } while (0)

#define PAIR(d, s) ((d) * 5 + (s))

void convert(void *dst, kiln_dtype dst_dt, const void *src, kiln_dtype src_dt, int64_t n,
             int64_t stride)
{
    if (dst_dt == src_dt && stride == 1 && dst_dt != KILN_BOOL) {
        memcpy(dst, src, (size_t)n * eager_dtype_size(dst_dt));
        return;
    }
    switch (PAIR(dst_dt, src_dt)) {
    case PAIR(KILN_F32, KILN_F32): CONVERT(float, float, AS_F32); break;
    case PAIR(KILN_F32, KILN_F64): CONVERT(float, double, AS_F32); break;
    case PAIR(KILN_F32, KILN_I32): CONVERT(float, int32_t, AS_F32); break;
    case PAIR(KILN_F32, KILN_I64): CONVERT(float, int64_t, AS_F32); break;
    case PAIR(KILN_F32, KILN_BOOL): CONVERT(float, uint8_t, AS_F32); break;
    case PAIR(KILN_F64, KILN_F32): CONVERT(double, float, AS_F64); break;
    case PAIR(KILN_F64, KILN_F64): CONVERT(double, double, AS_F64); break;
    case PAIR(KILN_F64, KILN_I32): CONVERT(double, int32_t, AS_F64); break;
    case PAIR(KILN_F64, KILN_I64): CONVERT(double, int64_t, AS_F64); break;
    case PAIR(KILN_F64, KILN_BOOL): CONVERT(double, uint8_t, AS_F64); break;
    case PAIR(KILN_I32, KILN_F32): CONVERT(int32_t, float, FLOAT_AS_I32); break;
    case PAIR(KILN_I32, KILN_F64): CONVERT(int32_t, double, FLOAT_AS_I32); break;
    case PAIR(KILN_I32, KILN_I32): CONVERT(int32_t, int32_t, AS_I32); break;
    case PAIR(KILN_I32, KILN_I64): CONVERT(int32_t, int64_t, AS_I32); break;
    case PAIR(KILN_I32, KILN_BOOL): CONVERT(int32_t, uint8_t, AS_I32); break;
    case PAIR(KILN_I64, KILN_F32): CONVERT(int64_t, float, FLOAT_AS_I64); break;
    case PAIR(KILN_I64, KILN_F64): CONVERT(int64_t, double, FLOAT_AS_I64); break;
    case PAIR(KILN_I64, KILN_I32): CONVERT(int64_t, int32_t, AS_I64); break;
    case PAIR(KILN_I64, KILN_I64): CONVERT(int64_t, int64_t, AS_I64); break;
    case PAIR(KILN_I64, KILN_BOOL): CONVERT(int64_t, uint8_t, AS_I64); break;
    case PAIR(KILN_BOOL, KILN_F32): CONVERT(uint8_t, float, AS_BOOL); break;
    case PAIR(KILN_BOOL, KILN_F64): CONVERT(uint8_t, double, AS_BOOL); break;
    case PAIR(KILN_BOOL, KILN_I32): CONVERT(uint8_t, int32_t, AS_BOOL); break;
    case PAIR(KILN_BOOL, KILN_I64): CONVERT(uint8_t, int64_t, AS_BOOL); break;
    case PAIR(KILN_BOOL, KILN_BOOL): CONVERT(uint8_t, uint8_t, AS_BOOL); break;
    default: KILN_ASSERT(!"dtype pair");
    }
}

/* Element begin's multi-index in v and its offset in elements. */
static int64_t locate(const strided *v, int64_t begin, int64_t *index)
{
    int64_t offset = 0;
    for (int i = v->ndim - 1; i >= 0; i--) {
        index[i] = begin % v->shape[i];
        begin /= v->shape[i];
        offset += index[i] * v->strides[i];
    }
    return offset;
}

/* Advances index by run elements along the last axis, carrying into the others;
 * returns the new offset. */
static int64_t advance(const strided *v, int64_t *index, int64_t offset, int64_t run)
{
    int last = v->ndim - 1;
    index[last] += run;
    offset += run * v->strides[last];
    for (int i = last; i > 0 && index[i] == v->shape[i]; i--) {
        offset -= index[i] * v->strides[i];
        index[i] = 0;
        index[i - 1]++;
        offset += v->strides[i - 1];
    }
    return offset;
}

void strided_gather(void *dst, kiln_dtype dst_dt, const strided *src, int64_t begin, int64_t count)
{
    size_t src_size = eager_dtype_size(src->dtype), dst_size = eager_dtype_size(dst_dt);
    if (src->ndim == 0) {
        convert(dst, dst_dt, src->base, src->dtype, count, 0);
        return;
    }
    int64_t index[KILN_MAX_DIMS];
    int64_t offset = locate(src, begin, index);
    int last = src->ndim - 1;
    char *out = dst;
    while (count > 0) {
        int64_t run = src->shape[last] - index[last];
        run = run < count ? run : count;
        convert(out, dst_dt, src->base + offset * (int64_t)src_size, src->dtype, run,
                src->strides[last]);
        out += run * (int64_t)dst_size;
        count -= run;
        if (count)
            offset = advance(src, index, offset, run);
    }
}

#define SCATTER(T)                                                              \
    do {                                                                        \
        T *restrict d_ = (T *)(dst->base + offset * (int64_t)sizeof(T));        \
        const T *restrict s_ = (const T *)in;                                   \
        for (int64_t i = 0; i < run; i++) d_[i * stride] = s_[i];               \
    } while (0)

void strided_scatter(const strided *dst, const void *src, int64_t begin, int64_t count)
{
    size_t size = eager_dtype_size(dst->dtype);
    if (dst->ndim == 0) {
        memcpy(dst->base, src, size);
        return;
    }
    int64_t index[KILN_MAX_DIMS];
    int64_t offset = locate(dst, begin, index);
    int last = dst->ndim - 1;
    int64_t stride = dst->strides[last];
    const char *in = src;
    while (count > 0) {
        int64_t run = dst->shape[last] - index[last];
        run = run < count ? run : count;
        switch (size) {
        case 1: SCATTER(uint8_t); break;
        case 4: SCATTER(uint32_t); break;
        default: SCATTER(uint64_t); break;
        }
        in += run * (int64_t)size;
        count -= run;
        if (count)
            offset = advance(dst, index, offset, run);
    }
}
