/* What the files of src/eager share among themselves. */
#ifndef KILN_EAGER_INTERNAL_H
#define KILN_EAGER_INTERNAL_H

#include "device/device.h"
#include "eager/eager.h"
#include "ir/kernel.h"

/* -- tensor.c: lifetime, scopes, checks ------------------------------------ */

/* A new contiguous tensor with fresh storage, not yet owned by a scope;
 * NULL with fn's error when the shape is bad or memory runs out. */
kiln_tensor *tensor_new(const char *fn, kiln_dtype dt, int ndim, const int64_t *shape);
/* The same on device (CUDA: from the caching allocator). */
kiln_tensor *tensor_new_on(const char *fn, kiln_device device, kiln_dtype dt, int ndim, const int64_t *shape);
/* A new tensor with no storage (for tracers): shape already checked (an
 * unchecked one is an internal error). */
kiln_tensor *tensor_new_meta(kiln_dtype dt, int ndim, const int64_t *shape);
/* A new view of base's storage (which gains a reference). */
kiln_tensor *tensor_view(const char *fn, const kiln_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset);
/* Hands the new reference t to the innermost scope, if any; returns t. */
kiln_tensor *tensor_own(kiln_tensor *t);
/* Releases the reference (NULL-safe) and returns NULL, for error paths. */
kiln_tensor *tensor_drop(kiln_tensor *t);

/* Checks that none of the n operands is NULL or a tracer of another or a
 * finished trace; names[i] names operand i in the message. */
int check_operands(const char *fn, int n, kiln_tensor *const *in, const char *const *names);
/* True while a trace records this thread's ops. */
bool recording(void);
/* Records op through the active trace; the result is owned like any op's.
 * NULL with fn's error when the result's shape is too large. */
kiln_tensor *record_op(const char *fn, ir_op op, int n_in, kiln_tensor *const *in, const ir_params *params,
                       kiln_dtype dt, int ndim, const int64_t *shape);
/* The error for reading a tracer's values in fn (reported to its trace). */
int fail_read_tracer(const char *fn, const kiln_tensor *t);
/* Tracer t's value on real data for fn, which reads it: a new unowned
 * tensor where its trace breaks there, else NULL with fn's error. */
kiln_tensor *read_tracer(const char *fn, const kiln_tensor *t);

/* Checks ndim, shape entries and the element count; stores the count. */
int check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel);
int check_dtype(const char *fn, kiln_dtype dt);
/* Resolves a possibly negative axis among t's ndim + extra positions. */
int check_axis(const char *fn, int axis, const kiln_tensor *t, int extra, int *resolved);
/* "[3,4] f32" for error messages. */
#define DESCRIBE_MAX (CORE_SHAPE_STR_MAX + 8)
char *describe(char buf[DESCRIBE_MAX], const kiln_tensor *t);

/* How t's dtype counts in promotion. */
static inline ir_rank_class rank_class(const kiln_tensor *t)
{
    return t->literal ? IR_SCALAR : t->ndim == 0 ? IR_ZERO_DIM : IR_DIMS;
}

/* -- conv.c ------------------------------------------------------------------ */

/* Conv2d node n (no bias) of x and w, run by the eager ops. */
kiln_tensor *eager_conv2d_node(const ir_node *n, kiln_tensor *x, kiln_tensor *w);

/* -- autograd.c: the tape -------------------------------------------------- */

/* Gives out, the result of op on the n operands (params as the graph's node
 * would hold them), its gradient record when gradients are recorded and an
 * operand needs them. Returns out, or NULL (out released) with an error. */
kiln_tensor *grad_track(ir_op op, int n, kiln_tensor *const *in, const ir_params *params, kiln_tensor *out);
/* Whether an op on the n operands would record a gradient (grad_track's
 * test, before the op runs). */
bool grad_wanted(int n, kiln_tensor *const *in);
/* Drops t's record and gradient (t is being freed). */
void grad_forget(kiln_tensor *t);
/* Leaf t's gradient where kiln_grad would find it (borrowed), or NULL. */
kiln_tensor *grad_peek(kiln_tensor *t);
/* Makes g leaf t's gradient (which takes a reference of its own); 0 or -1. */
int grad_replace(kiln_tensor *t, kiln_tensor *g);
/* kiln_assign's check: fn's error when writing src into dst would lose or
 * corrupt gradients; 0 else. */
int grad_check_assign(const kiln_tensor *dst, const kiln_tensor *src);

/* -- convert.c: dtype conversion and strided walks --------------------------- */

/* Converts n elements of src_dt read every src_stride elements into dst (contiguous). */
void convert(void *dst, kiln_dtype dst_dt, const void *src, kiln_dtype src_dt, int64_t n,
             int64_t src_stride);

/* A strided N-d view of memory: shape and strides (elements) over base. */
typedef struct {
    char *base;
    kiln_dtype dtype;
    int ndim;
    const int64_t *shape;
    const int64_t *strides;
} strided;

/* Reads the row-major elements [begin, begin+count) of src into dst, converted. */
void strided_gather(void *dst, kiln_dtype dst_dt, const strided *src, int64_t begin, int64_t count);
/* Writes count contiguous elements of src's dtype into dst's elements [begin, begin+count). */
void strided_scatter(const strided *dst, const void *src, int64_t begin, int64_t count);

/* -- broadcast.c ----------------------------------------------------------- */

/* The broadcast shape of n tensors, or an error naming fn and every shape. */
int broadcast_shapes(const char *fn, int n, const kiln_tensor *const *ts, int *ndim, int64_t *shape);
/* t's strides seen as a tensor of shape (ndim, shape): 0 along broadcast axes. */
void broadcast_strides(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* -- kernels.c: contiguous loops per op and dtype -------------------------- */

/* out[i] = op(in[0][i], in[1][i], ...) for i < n; all of the compute dtype
 * except comparisons, which write bool. */
typedef void (*ew_kernel)(int64_t n, void *out, const void *const *in);
ew_kernel kernel_for(ir_op op, kiln_dtype compute);

/* -- elementwise.c --------------------------------------------------------- */

/* 0 when src broadcasts to exactly dst's shape, else fn's error. */
int check_broadcasts_to(const char *fn, const kiln_tensor *src, const kiln_tensor *dst);
/* Writes src, broadcast to dst's shape and converted to its dtype, into dst. */
int copy_into(const char *fn, kiln_tensor *dst, const kiln_tensor *src);
/* A new contiguous tensor holding src converted to dt (unowned). */
kiln_tensor *copy_as(const char *fn, const kiln_tensor *src, kiln_dtype dt);
/* Sets every element of dst (any layout) to value converted to its dtype. */
int fill_value(kiln_tensor *dst, double value);
/* Copies src row-major and contiguous into plain memory of its dtype. */
void copy_to_memory(void *dst, const kiln_tensor *src);

/* -- gemm.c: kiln's own GEMM for CPU floats ----------------------------------- */

/* Whether eager's f32/f64 CPU products run on kiln's GEMM (the rule is in
 * gemm.c and kiln.h). */
bool eager_gemm_is_kiln(void);
/* Whether they do and its kernel for dt (f32, f64) is loaded (made now if
 * not yet). */
bool eager_gemm_ready(kiln_dtype dt);
/* out (contiguous) = a @ b as args lays them out, on kiln's GEMM: 1; 0 when
 * it is not there (run OpenBLAS); or fn's error (out of memory). */
int eager_gemm_run(const char *fn, kiln_dtype dt, const kg_matmul_args *args, void *out, const void *a,
                   const void *b);

/* A new tensor: binary op of a and the scalar value (the *_scalar forms'
 * operand, promoting as a Python number), the scalar first when
 * scalar_first. Owned as any op's result. */
kiln_tensor *eager_scalar_op(ir_op op, const char *fn, kiln_tensor *a, double value, bool scalar_first);

/* -- composite.c: ops written with the public ops, so that they trace ----- */

/* Opens a scope for a composite's temporaries; its ops are steps (see
 * core_steps_begin). */
void composite_begin(void);
/* Closes it, keeping result; a step's failure (always one of this call's:
 * the operands were checked, and an optional operand's NULL is none) is
 * reported under fn's name. */
kiln_tensor *composite_end(const char *fn, kiln_tensor *result);
/* Whether a is not NULL (fn's error) and, when need_axis, axis is one of its. */
bool composite_check(const char *fn, const kiln_tensor *a, int axis, bool need_axis);
/* Whether neither a nor b is NULL (fn's error naming the first that is). */
bool composite_check_pair(const char *fn, const kiln_tensor *a, const kiln_tensor *b);
/* The operand of a float composite: integers and bools become f32 first, as
 * PyTorch's x.float(), so that nothing is computed (and overflows) in an
 * integer dtype. */
kiln_tensor *composite_float(kiln_tensor *a);

/* -- statistics.c: several axes, and reductions composed of others ------------ */

/* Whether axis is a set of axes (KILN_AXES), not one axis or KILN_ALL. */
static inline bool eager_is_axes(int axis)
{
    return axis > 0 && (axis & KILN_AXES_FLAG);
}
/* The axes of a that a reduction's axis argument names (KILN_ALL, one
 * axis, or a KILN_AXES set) as a mask; 0, or fn's error. */
int eager_reduced_axes(const char *fn, const kiln_tensor *a, int axis, bool *reduced);
/* one (a reduction over one axis) over a set of axes of a: the axes moved
 * last and merged, so that the reduction is over rows. */
kiln_tensor *eager_reduce_axes(const char *fn, kiln_tensor *(*one)(kiln_tensor *, int, bool), kiln_tensor *a,
                               int axis, bool keepdim);
/* A tensor of dt and shape holding value, on device; owned as an op's
 * result. Traced, a constant broadcast to the shape. */
kiln_tensor *eager_filled(const char *fn, kiln_dtype dt, int ndim, const int64_t *shape, double value,
                          kiln_device device);

/* -- lines.c ------------------------------------------------------------------ */

/* Topk node n's indices of a; owned as an op's result. */
kiln_tensor *eager_topk_indices(const ir_node *n, kiln_tensor *a);

/* -- philox.c ------------------------------------------------------------------- */

/* Uniform node n's values, drawn at base plus its offset in the call. */
kiln_tensor *eager_uniform(const ir_node *n, uint64_t base, kiln_device device);

/* -- cuda.c: ops on CUDA tensors ---------------------------------------------- */

/* The device the n operands run on: CUDA when any is there, and then every
 * other must be a CPU 0-d value; else fn's error naming the two. */
int cuda_operands_device(const char *fn, int n, const kiln_tensor *const *in, kiln_device *device);
/* out (on CUDA, any layout) = op(in converted to in_dt), broadcast; OP_CAST
 * copies in[0] converted to out's dtype. 0 or fn's error. */
int cuda_elementwise(const char *fn, ir_op op, int n_in, const kiln_tensor *const *in, const kiln_dtype *in_dt,
                     kiln_tensor *out);
/* out = op over the middle axis of in seen as [outer, n, inner]. */
int cuda_reduce(const char *fn, ir_op op, const kiln_tensor *in, int64_t outer, int64_t n, int64_t inner,
                kiln_tensor *out);
/* out [batch, m, n] = a @ b as args lays them out, all of dtype dt. */
int cuda_matmul(const char *fn, const kg_matmul_args *args, kiln_dtype dt, const kiln_tensor *a,
                const kiln_tensor *b, kiln_tensor *out);
/* A request for a generic kernel, zeroed throughout (the struct is the key). */
kg_kernel cuda_request(kg_kind kind, ir_op op, int n_in);
/* Generic kernel k, made ready once in this process; 0 or fn's error. */
int cuda_kernel(const char *fn, const kg_kernel *k, kg_code *code);
/* Queues code on grid with params (as cuLaunchKernel's); 0 or fn's error. */
int cuda_launch(const char *fn, const kg_code *code, const unsigned grid[3], void **params);
/* A grid-stride grid over items, a thread each, into grid. */
const unsigned *cuda_grid_over(unsigned grid[3], const kg_code *code, int64_t items);
/* A new unowned contiguous CPU copy of the CUDA tensor t, and the reverse. */
kiln_tensor *cuda_to_host(const char *fn, const kiln_tensor *t);
kiln_tensor *cuda_from_host(const char *fn, const kiln_tensor *t);

#endif
