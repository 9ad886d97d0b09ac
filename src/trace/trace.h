/* Tracing marked functions into graphs, and running graphs: what other modules
 * may use of src/trace. */
#ifndef KILN_TRACE_H
#define KILN_TRACE_H

#include "eager/eager.h"

/* -- record.c: the recorder behind an active trace ------------------------- */

typedef struct recorder recorder;

/* A new recorder for the body of fn_name with n_in inputs; NULL when out of memory. */
recorder *recorder_new(const char *fn_name);
/* A new unowned tracer for input i of the given signature. */
kiln_tensor *recorder_input(recorder *rec, int i, const kiln_spec *spec);
/* Makes the recorder the active trace of this thread, or stops it. */
void recorder_activate(recorder *rec);
void recorder_finish(recorder *rec);
/* Records t (a tracer of this trace or any eager tensor) as output i. */
int recorder_output(recorder *rec, kiln_tensor *t);
/* Why the trace cannot be used (a tracer's values were read), or NULL. */
const char *recorder_failure(const recorder *rec);
/* Takes the graph and the captured tensors (new references) out of rec. */
ir_graph *recorder_take_graph(recorder *rec, kiln_tensor ***captures, int *n_captures);
/* Drops the owner's reference; tracers still alive keep the rest alive. */
void recorder_release(recorder *rec);

/* -- interp.c: graphs run node by node with the eager kernels --------------- */

typedef struct interp_plan interp_plan;

typedef struct {
    bool native;  /* lower into fused kernels, compiled by LLVM or for CUDA by NVRTC */
    kiln_device device; /* where the inputs are, and so the values and kernels */
    int opt_level;
    bool fast_math;
    bool no_disk;           /* skip the disk cache */
    const char *function;   /* the marked function's name and signature, */
    const char *signature;  /* for logs, messages and cache entries */
    bool log;
    /* Called with each kernel's text at each stage ("kernel", "llvm-before",
     * "llvm-after") when not NULL. */
    void (*dump)(void *ctx, int kernel, const char *stage, const char *text);
    void *dump_ctx;
} plan_options;

/* Where a native plan's kernels came from. */
typedef struct {
    int compiled, from_disk, shared;
} plan_counts;

/* A plan to run g (taking ownership of it and of captures). NULL with the
 * error set and its status in *status when out of memory, or when
 * KILN_CACHE=require finds a kernel missing; captures are released then. A
 * native plan that cannot be compiled is interpreted instead, and why says
 * why ("" when all went as asked). */
interp_plan *interp_plan_new(ir_graph *g, kiln_tensor **captures, int n_captures, const plan_options *o,
                             char *why, size_t why_size, int *status);
/* Compiles g's kernels for target ("cpu:<name>") into the disk cache
 * without loading them. 0, or -1 with the reason in why. */
int interp_compile_for(const ir_graph *g, const plan_options *o, const char *target, plan_counts *counts,
                       char *why, size_t why_size);
/* Whether the plan runs compiled kernels. */
bool interp_is_native(const interp_plan *p);
/* Where its values live and its kernels run. */
kiln_device interp_device(const interp_plan *p);
void interp_plan_free(interp_plan *p);
/* Runs the plan: n_out new unowned references in out; 0 or a negative error. */
int interp_run(const interp_plan *p, kiln_tensor *const *in, kiln_tensor **out);
plan_counts interp_counts(const interp_plan *p);
const ir_graph *interp_graph(const interp_plan *p);
int interp_kernels(const interp_plan *p);
int64_t interp_peak_bytes(const interp_plan *p);
/* CPU matrix products computed block by block, each block's epilogue kernel
 * run on it while it is in cache. */
int interp_products_in_blocks(const interp_plan *p);

#endif
