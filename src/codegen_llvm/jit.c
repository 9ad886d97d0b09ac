/* Compiling kernels to object code and loading object code with ORC LLJIT.
 *
 * One LLJIT serves the process. Each kernel is built as a module in its own
 * context, optimised with LLVMRunPasses for its target and emitted as an
 * object file into memory: the form the cache stores. Host objects are added
 * to the JIT under their own resource tracker, so that freeing the code
 * unloads it. One lock covers LLVM: its target machines are not safe to
 * share between threads. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen_llvm/internal.h"
#include "codegen_llvm/codegen_version.h"

struct llvm_code {
    LLVMOrcResourceTrackerRef tracker;
};

/* A CPU that code is generated for: the host, or one named for
 * cross-compiling. */
struct llvm_target {
    char cpu[64];
    bool host;
    LLVMTargetRef target;
    char triple[128];
    char features[4096];
    LLVMTargetMachineRef tm; /* made by the first compile: a disk hit needs none */
    char id[2048];           /* triple, CPU and the features that change code */
};

enum { MAX_TARGETS = 8 };

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    LLVMOrcLLJITRef jit;
    llvm_target targets[MAX_TARGETS]; /* [0] is the host */
    int n_targets;
    char failure[512]; /* why the JIT could not start, or "" */
    char toolchain[32];
} state = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes an LLVMErrorRef, writes its message after what into buf. */
static void take_error(LLVMErrorRef e, const char *what, char *buf, size_t size)
{
    char *message = LLVMGetErrorMessage(e);
    snprintf(buf, size, "%s: %s", what, message);
    LLVMDisposeErrorMessage(message);
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The enabled features of an LLVM feature list ("+avx2,-avx512f,..."),
 * sorted so that the same CPU always gives the same text. */
static void enabled_features(const char *list, char *out, size_t size)
{
    char *copy = strdup(list ? list : ""), *names[512], *save = NULL;
    int n = 0;
    for (char *f = copy ? strtok_r(copy, ",", &save) : NULL; f && n < 512; f = strtok_r(NULL, ",", &save))
        if (f[0] == '+')
            names[n++] = f;
    qsort(names, (size_t)n, sizeof *names, compare_strings);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? "," : "", names[i]);
    free(copy);
}

/* Whether LLVM knows cpu. LLVM's C API has no such query: creating a target
 * machine for an unknown CPU only prints a warning to stderr, so the warning
 * is caught in a temporary file. Called under the lock, once per name. */
static bool known_cpu(LLVMTargetRef target, const char *triple, const char *cpu)
{
    FILE *caught = tmpfile();
    int saved = caught ? dup(STDERR_FILENO) : -1;
    if (saved < 0) {
        if (caught)
            fclose(caught);
        return true;
    }
    fflush(stderr);
    dup2(fileno(caught), STDERR_FILENO);
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, "", LLVMCodeGenLevelNone,
                                                      LLVMRelocPIC, LLVMCodeModelDefault);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char said[256] = "";
    rewind(caught);
    size_t n = fread(said, 1, sizeof said - 1, caught);
    said[n] = '\0';
    fclose(caught);
    if (tm)
        LLVMDisposeTargetMachine(tm);
    return tm && !strstr(said, "not a recognized processor");
}

/* Sets t up for cpu (NULL: the host's CPU and features). */
static int make_target(llvm_target *t, const char *cpu, char *err, size_t size)
{
    char *triple = LLVMGetDefaultTargetTriple(), *message = NULL;
    char *host_cpu = LLVMGetHostCPUName(), *host_features = LLVMGetHostCPUFeatures();
    LLVMTargetRef target;
    int status = -1;
    if (LLVMGetTargetFromTriple(triple, &target, &message)) {
        snprintf(err, size, "no LLVM target for %s: %s", triple, message);
        LLVMDisposeMessage(message);
    } else if (cpu && !known_cpu(target, triple, cpu)) {
        snprintf(err, size, "%s does not know the CPU \"%s\" for %s", state.toolchain, cpu, triple);
    } else if (strlen(host_features) >= sizeof t->features || strlen(triple) >= sizeof t->triple) {
        snprintf(err, size, "the host's triple or CPU features are too long");
    } else {
        t->host = !cpu;
        t->target = target;
        snprintf(t->cpu, sizeof t->cpu, "%s", cpu ? cpu : host_cpu);
        snprintf(t->triple, sizeof t->triple, "%s", triple);
        snprintf(t->features, sizeof t->features, "%s", cpu ? "" : host_features);
        char enabled[1536];
        enabled_features(t->features, enabled, sizeof enabled);
        snprintf(t->id, sizeof t->id, "%s cpu=%s features=%s", triple, t->cpu, cpu ? "(the CPU's own)" : enabled);
        status = 0;
    }
    LLVMDisposeMessage(host_cpu);
    LLVMDisposeMessage(host_features);
    LLVMDisposeMessage(triple);
    return status;
}

static void start(void)
{
    unsigned major, minor, patch;
    LLVMGetVersion(&major, &minor, &patch);
    snprintf(state.toolchain, sizeof state.toolchain, "LLVM %u.%u.%u", major, minor, patch);
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    if (make_target(&state.targets[0], NULL, state.failure, sizeof state.failure) < 0)
        return;
    state.n_targets = 1;
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&state.jit, NULL);
    if (e) {
        take_error(e, "starting LLJIT", state.failure, sizeof state.failure);
        return;
    }
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

static bool started(char *err, size_t size)
{
    pthread_once(&state.once, start);
    if (state.failure[0])
        snprintf(err, size, "%s", state.failure);
    return !state.failure[0];
}

const llvm_target *llvm_target_get(const char *name, char *err, size_t size)
{
    if (!started(err, size))
        return NULL;
    if (!strcmp(name, "host"))
        return &state.targets[0];
    if (strncmp(name, "cpu:", 4) != 0 || !name[4] || strlen(name + 4) >= sizeof state.targets[0].cpu) {
        snprintf(err, size, "\"%s\" is not a CPU target (\"host\" or \"cpu:<LLVM CPU name>\")", name);
        return NULL;
    }
    const char *cpu = name + 4;
    pthread_mutex_lock(&state.lock);
    llvm_target *found = NULL;
    for (int i = 1; i < state.n_targets && !found; i++)
        if (!strcmp(state.targets[i].cpu, cpu))
            found = &state.targets[i];
    if (!found && state.n_targets == MAX_TARGETS)
        snprintf(err, size, "too many CPU targets in one process (%d)", MAX_TARGETS - 1);
    else if (!found && make_target(&state.targets[state.n_targets], cpu, err, size) == 0)
        found = &state.targets[state.n_targets++];
    pthread_mutex_unlock(&state.lock);
    return found;
}

const char *llvm_target_id(const llvm_target *t)
{
    return t->id;
}

bool llvm_target_is_host(const llvm_target *t)
{
    return t->host;
}

const char *llvm_codegen_version(void)
{
    return LLVM_CODEGEN_VERSION;
}

const char *llvm_toolchain(void)
{
    char ignored[sizeof state.failure];
    started(ignored, sizeof ignored);
    return state.toolchain;
}

/* -- Compiling ------------------------------------------------------------- */

static LLVMModuleRef build_module(LLVMContextRef ctx, const kx_kernel *k, const char *symbol, LLVMTargetMachineRef tm,
                                  char *err, size_t size)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("kiln", ctx);
    char *triple = LLVMGetTargetMachineTriple(tm);
    LLVMSetTarget(m, triple);
    LLVMDisposeMessage(triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(tm);
    LLVMSetModuleDataLayout(m, layout);
    LLVMDisposeTargetData(layout);
    if (codegen_kernel(m, k, symbol, err, size) < 0) {
        LLVMDisposeModule(m);
        return NULL;
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

static int optimise(LLVMModuleRef m, LLVMTargetMachineRef tm, int level, char *err, size_t size)
{
    static const char *const pipelines[] = {"default<O0>", "default<O1>", "default<O2>", "default<O3>"};
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(options, level >= 2);
    LLVMPassBuilderOptionsSetSLPVectorization(options, level >= 2);
    LLVMErrorRef e = LLVMRunPasses(m, pipelines[level < 0 ? 0 : level > 3 ? 3 : level], tm, options);
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

/* Emits m as an object file into a malloc'd copy; -1 with err. */
static int emit_object(LLVMModuleRef m, LLVMTargetMachineRef tm, void **object, size_t *size, char *err,
                       size_t err_size)
{
    LLVMMemoryBufferRef buffer = NULL;
    char *message = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &message, &buffer)) {
        snprintf(err, err_size, "emitting object code: %s", message ? message : "?");
        LLVMDisposeMessage(message);
        return -1;
    }
    *size = LLVMGetBufferSize(buffer);
    *object = malloc(*size ? *size : 1);
    if (*object)
        memcpy(*object, LLVMGetBufferStart(buffer), *size);
    else
        snprintf(err, err_size, "out of memory emitting object code");
    LLVMDisposeMemoryBuffer(buffer);
    return *object ? 0 : -1;
}

/* t's target machine, made on first use; under the lock. */
static LLVMTargetMachineRef machine(const llvm_target *target, char *err, size_t size)
{
    llvm_target *t = (llvm_target *)target; /* targets live in state, which is not const */
    if (!t->tm)
        t->tm = LLVMCreateTargetMachine(t->target, t->triple, t->cpu, t->features, LLVMCodeGenLevelAggressive,
                                        LLVMRelocPIC, LLVMCodeModelDefault);
    if (!t->tm)
        snprintf(err, size, "LLVM cannot target %s (%s)", t->triple, t->cpu);
    return t->tm;
}

int llvm_compile_object(const kx_kernel *k, const char *symbol, const llvm_target *t, const llvm_options *opt,
                        void **object, size_t *size, char *err, size_t err_size)
{
    *object = NULL;
    pthread_mutex_lock(&state.lock);
    LLVMTargetMachineRef tm = machine(t, err, err_size);
    if (!tm) {
        pthread_mutex_unlock(&state.lock);
        return -1;
    }
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = build_module(ctx, k, symbol, tm, err, err_size);
    int status = -1;
    if (m && opt->ir_before)
        *opt->ir_before = module_text(m);
    if (m && optimise(m, tm, opt->opt_level, err, err_size) == 0) {
        if (opt->ir_after)
            *opt->ir_after = module_text(m);
        status = emit_object(m, tm, object, size, err, err_size);
    }
    if (m)
        LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    pthread_mutex_unlock(&state.lock);
    return status;
}

llvm_code *llvm_load(const void *object, size_t size, const char *symbol, llvm_kernel_fn *fn, char *err,
                     size_t err_size)
{
    if (!started(err, err_size))
        return NULL;
    llvm_code *code = calloc(1, sizeof *code);
    if (!code) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&state.lock);
    LLVMMemoryBufferRef buffer = LLVMCreateMemoryBufferWithMemoryRangeCopy(object, size, symbol);
    code->tracker = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(state.jit));
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(state.jit, code->tracker, buffer);
    LLVMOrcExecutorAddress address = 0;
    if (e)
        take_error(e, "loading object code", err, err_size);
    else if ((e = LLVMOrcLLJITLookup(state.jit, &address, symbol)))
        take_error(e, "finding the kernel in its object code", err, err_size);
    pthread_mutex_unlock(&state.lock);
    if (e) {
        llvm_code_free(code);
        return NULL;
    }
    *fn = (llvm_kernel_fn)(uintptr_t)address;
    return code;
}

void llvm_code_free(llvm_code *code)
{
    if (!code)
        return;
    if (code->tracker) {
        pthread_mutex_lock(&state.lock);
        LLVMErrorRef e = LLVMOrcResourceTrackerRemove(code->tracker);
        if (e)
            LLVMConsumeError(e);
        LLVMOrcReleaseResourceTracker(code->tracker);
        pthread_mutex_unlock(&state.lock);
    }
    free(code);
}
