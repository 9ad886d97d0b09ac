/* Tracing marked functions into graphs, and running graphs: what other modules
 * may use of src/trace. */
#ifndef KILN_TRACE_H
#define KILN_TRACE_H

#include "eager/eager.h"
#include "ir/backend.h"

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

/* -- interp.c: graph nodes run with the eager ops ------------------------- */

/* Where a graph's sources come from when it runs. */
typedef struct {
    kiln_tensor *const *inputs;
    kiln_tensor *const *captures;
    kiln_tensor *const *consts;  /* per node: a constant node's 0-d tensor */
    uint64_t stream;             /* which call of the graph: random nodes draw from it */
    uint64_t rng_base;           /* where its uniform nodes draw the global generator's words */
    kiln_device device;          /* where values live */
} interp_sources;

/* The 0-d tensors of g's constant nodes on device, per node (NULL for the
 * others), unowned; NULL with the error set (no memory, no device). */
kiln_tensor **interp_consts(const ir_graph *g, kiln_device device);
void interp_consts_free(const ir_graph *g, kiln_tensor **consts);
/* Source node r's tensor (borrowed), or NULL for a node that is not one (or
 * a random one, whose values interp_node draws). */
kiln_tensor *interp_source(const ir_graph *g, ir_ref r, const interp_sources *s);
/* Node r run with the eager ops on its operands' values (indexed by node):
 * a new unowned tensor, or NULL with the op's error set. */
kiln_tensor *interp_node(const ir_graph *g, ir_ref r, const interp_sources *s, kiln_tensor *const *values);

/* -- exec.c: the executor ---------------------------------------------------- *
 * A graph planned (ir/kernel.h's ir_plan), its kernels made ready through the
 * compile-or-load service, and run step by step. */

typedef struct executable executable;

typedef struct {
    bool compiled;          /* fused kernels by the backend of device; else interpreted */
    kiln_device device;     /* where the inputs are, and so the values and kernels */
    int opt_level;
    bool fast_math;
    bool no_disk;           /* skip the disk cache */
    const char *function;   /* the marked function's name and signature, */
    const char *signature;  /* for logs, messages and cache entries */
    bool log;
    /* Called with each kernel's text at each stage ("kernel", and the
     * backend's: "llvm-before", "llvm-after", "cuda") when not NULL. */
    void (*dump)(void *ctx, int kernel, const char *stage, const char *text);
    void *dump_ctx;
} exec_options;

/* Where a compiled executable's kernels came from. */
typedef struct {
    int compiled, from_disk, shared;
} exec_counts;

/* An executable for g (taking ownership of it and of captures). NULL with
 * the error set and its status in *status when out of memory, or when
 * KILN_CACHE=require finds a kernel missing; captures are released then. A
 * graph that cannot be compiled is interpreted instead, and why says why
 * ("" when all went as asked). */
executable *exec_new(ir_graph *g, kiln_tensor **captures, int n_captures, const exec_options *o, char *why,
                     size_t why_size, int *status);
/* Compiles g's kernels for target into the disk cache without loading
 * them. 0, or a negative status with the reason in why. */
int exec_compile_for(const ir_graph *g, const exec_options *o, const kx_target *target, exec_counts *counts,
                     char *why, size_t why_size);
void exec_free(executable *x);
/* Runs x: n_out new unowned references in out; 0 or the failing op's status. */
int exec_run(const executable *x, kiln_tensor *const *in, kiln_tensor **out);
/* Whether an input shares storage with a capture x writes back: the body's
 * reads of that input would then depend on the order of its reads and
 * writes, which only running it eagerly keeps. */
bool exec_input_aliases_writeback(const executable *x, kiln_tensor *const *in);
/* The backend whose kernels x runs ("llvm", "nvrtc"), or "interp". */
const char *exec_backend_name(const executable *x);
exec_counts exec_kernel_counts(const executable *x);
const ir_graph *exec_graph(const executable *x);
/* Steps that launch a kernel (fused, or an eager op's), and of them the
 * fused kernels. */
int exec_steps(const executable *x);
int exec_fused_kernels(const executable *x);
int64_t exec_peak_bytes(const executable *x);
/* CPU matrix products computed block by block, each block's epilogue kernel
 * run on it while it is in cache. */
int exec_products_in_blocks(const executable *x);

#endif
