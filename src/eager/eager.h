/* Eager tensors: what the other modules may use of them. */
#ifndef KILN_EAGER_H
#define KILN_EAGER_H

#include <stdatomic.h>

#include "core/core.h"
#include "ir/ir.h"

/* Reference-counted memory that views share. */
typedef struct {
    _Atomic int refs;
    kiln_device device;
    size_t nbytes;
    void *data;
} eager_storage;

struct kiln_tensor {
    _Atomic int refs;
    kiln_dtype dtype;
    kiln_device device;
    int ndim;
    int64_t numel;
    int64_t offset; /* in elements, into storage */
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS]; /* in elements; 0 along broadcast axes */
    eager_storage *storage;
    int scope_depth; /* the scope owning this reference, 0 if none */
    int scope_slot;
};

/* Bytes per element. */
static inline size_t eager_dtype_size(kiln_dtype dt)
{
    return dt == KILN_F64 || dt == KILN_I64 ? 8 : dt == KILN_BOOL ? 1 : 4;
}

/* Address of element 0 of t. */
static inline char *eager_data(const kiln_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)eager_dtype_size(t->dtype);
}

bool eager_is_contiguous(const kiln_tensor *t);

#endif
