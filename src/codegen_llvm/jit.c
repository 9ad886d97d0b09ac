/* Compiling modules for the host and loading them with ORC LLJIT.
 *
 * One LLJIT serves the process. Each compile builds a module in its own
 * context, optimises it with LLVMRunPasses, emits an object file into memory
 * (the form the cache will store) and adds it to the JIT under its own
 * resource tracker, so that freeing the code unloads it. Compiles take one
 * lock: LLVM's target machine is not safe to share between threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen_llvm/internal.h"

struct llvm_code {
    LLVMOrcResourceTrackerRef tracker;
};

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    LLVMOrcLLJITRef jit;
    LLVMTargetMachineRef tm;
    char failure[512]; /* why the JIT could not start, or "" */
    uint64_t modules;  /* numbers each module's symbols */
} state = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes an LLVMErrorRef, writes its message after what into buf. */
static void take_error(LLVMErrorRef e, const char *what, char *buf, size_t size)
{
    char *message = LLVMGetErrorMessage(e);
    snprintf(buf, size, "%s: %s", what, message);
    LLVMDisposeErrorMessage(message);
}

static LLVMTargetMachineRef host_machine(char *err, size_t size)
{
    char *triple = LLVMGetDefaultTargetTriple(), *message = NULL;
    LLVMTargetRef target;
    LLVMTargetMachineRef tm = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &message)) {
        snprintf(err, size, "no LLVM target for %s: %s", triple, message);
        LLVMDisposeMessage(message);
    } else {
        char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
        tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                     LLVMCodeModelDefault);
        if (!tm)
            snprintf(err, size, "LLVM cannot target %s (%s)", triple, cpu);
        LLVMDisposeMessage(cpu);
        LLVMDisposeMessage(features);
    }
    LLVMDisposeMessage(triple);
    return tm;
}

static void start(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    state.tm = host_machine(state.failure, sizeof state.failure);
    LLVMErrorRef e = state.tm ? LLVMOrcCreateLLJIT(&state.jit, NULL) : NULL;
    if (e) {
        take_error(e, "starting LLJIT", state.failure, sizeof state.failure);
        return;
    }
    if (!state.tm)
        return;
    /* Kernels call libm (powf, sin, ...): resolve against the process. */
    LLVMOrcDefinitionGeneratorRef process;
    e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&process, LLVMOrcLLJITGetGlobalPrefix(state.jit),
                                                             NULL, NULL);
    if (e) {
        take_error(e, "searching the process for symbols", state.failure, sizeof state.failure);
        return;
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(state.jit), process);
}

/* -- Compiling ------------------------------------------------------------- */

static LLVMModuleRef build_module(LLVMContextRef ctx, kx_kernel *const *kernels, int n, uint64_t id, char *err,
                                  size_t size)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("kiln", ctx);
    char *triple = LLVMGetTargetMachineTriple(state.tm);
    LLVMSetTarget(m, triple);
    LLVMDisposeMessage(triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(state.tm);
    LLVMSetModuleDataLayout(m, layout);
    LLVMDisposeTargetData(layout);
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "kiln_m%llu_k%d", (unsigned long long)id, i);
        if (codegen_kernel(m, kernels[i], name, err, size) < 0) {
            LLVMDisposeModule(m);
            return NULL;
        }
    }
    char *message = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &message)) {
        snprintf(err, size, "generated LLVM IR does not verify: %.400s", message);
        LLVMDisposeMessage(message);
        LLVMDisposeModule(m);
        return NULL;
    }
    LLVMDisposeMessage(message);
    return m;
}

static int optimise(LLVMModuleRef m, int level, char *err, size_t size)
{
    static const char *const pipelines[] = {"default<O0>", "default<O1>", "default<O2>", "default<O3>"};
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(options, level >= 2);
    LLVMPassBuilderOptionsSetSLPVectorization(options, level >= 2);
    LLVMErrorRef e = LLVMRunPasses(m, pipelines[level < 0 ? 0 : level > 3 ? 3 : level], state.tm, options);
    LLVMDisposePassBuilderOptions(options);
    if (e) {
        take_error(e, "optimising", err, size);
        return -1;
    }
    return 0;
}

static char *module_text(LLVMModuleRef m)
{
    char *text = LLVMPrintModuleToString(m), *copy = text ? strdup(text) : NULL;
    LLVMDisposeMessage(text);
    return copy;
}

/* Emits m as an object file into memory; NULL with err. */
static LLVMMemoryBufferRef emit_object(LLVMModuleRef m, char *err, size_t size)
{
    LLVMMemoryBufferRef object = NULL;
    char *message = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(state.tm, m, LLVMObjectFile, &message, &object)) {
        snprintf(err, size, "emitting object code: %s", message ? message : "?");
        LLVMDisposeMessage(message);
        return NULL;
    }
    return object;
}

/* Loads object (taking ownership) and finds the n kernels of module id. */
static llvm_code *load(LLVMMemoryBufferRef object, uint64_t id, int n, llvm_kernel_fn *fns, char *err,
                       size_t size)
{
    llvm_code *code = calloc(1, sizeof *code);
    if (!code) {
        LLVMDisposeMemoryBuffer(object);
        snprintf(err, size, "out of memory");
        return NULL;
    }
    code->tracker = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(state.jit));
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(state.jit, code->tracker, object);
    if (e) {
        take_error(e, "loading object code", err, size);
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "kiln_m%llu_k%d", (unsigned long long)id, i);
        LLVMOrcExecutorAddress address;
        if ((e = LLVMOrcLLJITLookup(state.jit, &address, name))) {
            take_error(e, "finding a kernel", err, size);
            goto fail;
        }
        fns[i] = (llvm_kernel_fn)(uintptr_t)address;
    }
    return code;
fail:
    llvm_code_free(code);
    return NULL;
}

llvm_code *llvm_compile(kx_kernel *const *kernels, int n, const llvm_options *opt, llvm_kernel_fn *fns,
                        char *err, size_t err_size)
{
    pthread_once(&state.once, start);
    if (state.failure[0]) {
        snprintf(err, err_size, "%s", state.failure);
        return NULL;
    }
    pthread_mutex_lock(&state.lock);
    uint64_t id = state.modules++;
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = build_module(ctx, kernels, n, id, err, err_size);
    LLVMMemoryBufferRef object = NULL;
    if (m && opt->ir_before)
        *opt->ir_before = module_text(m);
    if (m && optimise(m, opt->opt_level, err, err_size) == 0) {
        if (opt->ir_after)
            *opt->ir_after = module_text(m);
        object = emit_object(m, err, err_size);
    }
    if (m)
        LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    llvm_code *code = object ? load(object, id, n, fns, err, err_size) : NULL;
    pthread_mutex_unlock(&state.lock);
    return code;
}

void llvm_code_free(llvm_code *code)
{
    if (!code)
        return;
    if (code->tracker) {
        LLVMErrorRef e = LLVMOrcResourceTrackerRemove(code->tracker);
        if (e)
            LLVMConsumeError(e);
        LLVMOrcReleaseResourceTracker(code->tracker);
    }
    free(code);
}
