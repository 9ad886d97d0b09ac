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
/* At a read of a traced value (fn: kiln_item, kiln_copy_to_host), the graph
 * so far, whose first output is the value read and the others every value
 * the rest of the body may use, with the captures it names (borrowed) and
 * which nodes' shapes the body read: the value read, on real data (a new
 * unowned tensor), or NULL with the error set (the trace then fails). */
typedef kiln_tensor *(*recorder_break_fn)(void *ctx, const ir_graph *g, kiln_tensor *const *captures,
                                          int n_captures, const bool *shape_read, const char *fn);
/* Lets the trace break at reads (see record.c); without it a read fails it. */
void recorder_set_break(recorder *rec, recorder_break_fn on_break, void *ctx);
/* Makes the recorder the active trace of this thread, or stops it. */
void recorder_activate(recorder *rec);
void recorder_finish(recorder *rec);
/* Records t (a tracer of this trace or any eager tensor) as output i. */
int recorder_output(recorder *rec, kiln_tensor *t);
/* Why the trace cannot be used (a tracer's values were read), or NULL. */
const char *recorder_failure(const recorder *rec);
/* Per node of g (the graph taken from rec), whether the body read its
 * shape; calloc'd, NULL when out of memory. */
bool *recorder_shape_reads(const recorder *rec, const ir_graph *g);
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
    const int64_t *symbols;      /* the values of the graph's symbols in this call */
} interp_sources;

/* The 0-d tensors of g's constant nodes on device, per node (NULL for the
 * others), unowned; NULL with the error set (no memory, no device). */
kiln_tensor **interp_consts(const ir_graph *g, kiln_device device);
void interp_consts_free(const ir_graph *g, kiln_tensor **consts);
/* Source node r's tensor (borrowed), or NULL for a node that is not one (or
 * a random one, whose values interp_node draws). */
kiln_tensor *interp_source(const ir_graph *g, ir_ref r, const interp_sources *s);
/* Node r (not a source interp_source gives) run with the eager ops on its
 * operands' values (indexed by node): a new unowned tensor, or NULL with the
 * op's error set. */
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
/* Runs x for the values of its graph's symbols (IR_MAX_SYMBOLS of them): n_out
 * new unowned references in out; 0 or the failing op's status. */
int exec_run(const executable *x, kiln_tensor *const *in, const int64_t *symbols, kiln_tensor **out);
/* Whether t shares storage with a capture x writes back: a body reading t
 * as an input would then depend on the order of its reads and writes, which
 * only running it eagerly keeps. */
bool exec_writes_back_into(const executable *x, const kiln_tensor *t);
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

/* -- jit.c: what other modules may ask of a marked function -------------- */

/* f frees user with free_user when freed, and owns io_names (malloc'd: n_in
 * then n_out malloc'd strings, kiln_fn_io_name's). */
void jit_adopt(kiln_fn *f, void (*free_user)(void *), char **io_names);
/* The user pointer f was made with. */
void *jit_user(const kiln_fn *f);
/* f's name, borrowed. */
const char *jit_name(const kiln_fn *f);
/* f traced for sig (its body run on tracers, no graph break allowed) and
 * optimised as a specialization would be: the graph and its captures
 * (references held, eager_hold's: drop them with eager_unhold) in *out. 0, or a negative status with the error set. */
int jit_trace_graph(kiln_fn *f, const kiln_spec *sig, ir_graph **out, kiln_tensor ***captures, int *n_captures);
/* fn's error, and a negative status, unless every one of f's input specs
 * in is sound: a dtype and a device kiln has, 0 to KILN_MAX_DIMS sizes, none
 * negative, at most 2^59 elements, dynamic axes among them. */
int jit_check_specs(const char *fn, const kiln_fn *f, const kiln_spec *in);

#endif
