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
    char name[4200];         /* as asked for: "cpu:<name>[:<features>]" */
    char cpu[64];
    bool host;
    LLVMTargetRef target;
    char triple[128];
    char features[4096];
    LLVMTargetMachineRef tm; /* made by the first compile: a disk hit needs none */
    char id[4400];           /* triple, CPU and the features that change code */
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
    char host_name[4200]; /* "cpu:<name>:<features>": the host, named */
} state = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes an LLVMErrorRef, writes its message after what into buf. */
static void take_error(LLVMErrorRef e, const char *what, char *buf, size_t size)
{
    char *message = LLVMGetErrorMessage(e);
    snprintf(buf, size, "%s: %s", what, message);
    LLVMDisposeErrorMessage(message);
}

/* By feature name, whatever the sign. */
static int compare_features(const void *a, const void *b)
{
    return strcmp(*(char *const *)a + 1, *(char *const *)b + 1);
}

/* An LLVM feature list ("+avx2,-avx512f,...") sorted by name, so that one CPU
 * always gives one text; -1 (why in err) when an entry is not +name or -name,
 * or a name comes twice (LLVM would take the last, which sorting changes).
 * Disabled features stay: a named CPU would otherwise turn them back on from
 * its defaults. */
static int sort_features(const char *list, char *out, size_t size, char *err, size_t err_size)
{
    char *copy = strdup(list), *names[1024], *save = NULL;
    if (!copy) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    int n = 0;
    for (char *f = strtok_r(copy, ",", &save); f && n < 1024; f = strtok_r(NULL, ",", &save))
        names[n++] = f;
    qsort(names, (size_t)n, sizeof *names, compare_features);
    size_t used = 0;
    out[0] = '\0';
    err[0] = '\0';
    for (int i = 0; i < n && !err[0]; i++) {
        if ((names[i][0] != '+' && names[i][0] != '-') || !names[i][1])
            snprintf(err, err_size, "\"%s\" is not +feature or -feature", names[i]);
        else if (i && !compare_features(&names[i - 1], &names[i]))
            snprintf(err, err_size, "the feature list names %s twice", names[i] + 1);
        else if ((used += (size_t)snprintf(out + used, size - used, "%s%s", i ? "," : "", names[i])) >= size)
            snprintf(err, err_size, "the feature list is too long");
    }
    free(copy);
    return err[0] ? -1 : 0;
}

/* What LLVM says (to stderr) when it makes a target machine for cpu and
 * features: its C API has no other way to tell an unknown CPU or feature,
 * which it only warns about. The warning is caught in a temporary file.
 * Called under the lock, once per target. */
static bool llvm_accepts(LLVMTargetRef target, const char *triple, const char *cpu, const char *features,
                         char *said, size_t size)
{
    said[0] = '\0';
    FILE *caught = tmpfile();
    int saved = caught ? dup(STDERR_FILENO) : -1;
    if (saved < 0) {
        if (caught)
            fclose(caught);
        return true;
    }
    fflush(stderr);
    dup2(fileno(caught), STDERR_FILENO);
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelNone,
                                                      LLVMRelocPIC, LLVMCodeModelDefault);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(caught);
    size_t n = fread(said, 1, size - 1, caught);
    said[n] = '\0';
    said[strcspn(said, "\n")] = '\0';
    fclose(caught);
    if (tm)
        LLVMDisposeTargetMachine(tm);
    return tm && !strstr(said, "not a recognized");
}

/* Sets t up for cpu with features (NULL: the CPU's own); host marks the
 * machine kiln runs on. */
static int make_target(llvm_target *t, const char *cpu, const char *features, bool host, char *err, size_t size)
{
    char *triple = LLVMGetDefaultTargetTriple(), *message = NULL, said[256];
    LLVMTargetRef target;
    int status = -1;
    if (LLVMGetTargetFromTriple(triple, &target, &message)) {
        snprintf(err, size, "no LLVM target for %s: %s", triple, message);
        LLVMDisposeMessage(message);
    } else if (strlen(cpu) >= sizeof t->cpu || strlen(triple) >= sizeof t->triple) {
        snprintf(err, size, "the CPU name is too long");
    } else if (features && sort_features(features, t->features, sizeof t->features, err, size) < 0) {
        status = -1; /* err says why */
    } else if (!host && !llvm_accepts(target, triple, cpu, features ? t->features : "", said, sizeof said)) {
        snprintf(err, size, "%s does not accept this target for %s: %s", state.toolchain, triple, said);
    } else {
        t->host = host;
        t->target = target;
        snprintf(t->cpu, sizeof t->cpu, "%s", cpu);
        snprintf(t->triple, sizeof t->triple, "%s", triple);
        if (!features)
            t->features[0] = '\0';
        snprintf(t->id, sizeof t->id, "%s cpu=%s features=%s", triple, t->cpu,
                 features ? t->features : "(the CPU's own)");
        status = 0;
    }
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
    char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
    int made = make_target(&state.targets[0], cpu, features, true, state.failure, sizeof state.failure);
    snprintf(state.host_name, sizeof state.host_name, "cpu:%s:%s", state.targets[0].cpu,
             state.targets[0].features);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(features);
    if (made < 0)
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
    const char *cpu = name + 4, *colon = strchr(cpu, ':');
    size_t cpu_len = colon ? (size_t)(colon - cpu) : strlen(cpu);
    if (strncmp(name, "cpu:", 4) != 0 || cpu_len == 0 || cpu_len >= sizeof state.targets[0].cpu) {
        snprintf(err, size, "\"%.200s\" is not a CPU target (\"host\", \"cpu:<LLVM CPU name>\" or "
                 "\"cpu:<name>:<LLVM feature list>\")", name);
        return NULL;
    }
    char cpu_name[sizeof state.targets[0].cpu];
    snprintf(cpu_name, sizeof cpu_name, "%.*s", (int)cpu_len, cpu);
    pthread_mutex_lock(&state.lock);
    llvm_target *found = NULL;
    for (int i = 1; i < state.n_targets && !found; i++)
        if (!strcmp(state.targets[i].name, name))
            found = &state.targets[i];
    llvm_target *next = &state.targets[state.n_targets];
    if (!found && state.n_targets == MAX_TARGETS)
        snprintf(err, size, "too many CPU targets in one process (%d)", MAX_TARGETS - 1);
    else if (!found && strlen(name) >= sizeof next->name)
        snprintf(err, size, "the target name is too long");
    else if (!found && make_target(next, cpu_name, colon ? colon + 1 : NULL, false, err, size) == 0)
        found = next;
    if (found == next) {
        snprintf(next->name, sizeof next->name, "%s", name);
        state.n_targets++;
    }
    pthread_mutex_unlock(&state.lock);
    return found;
}

const char *llvm_host_target_name(void)
{
    char ignored[sizeof state.failure];
    return started(ignored, sizeof ignored) ? state.host_name : NULL;
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
    if (k->matmul_product >= 0) {
        snprintf(err, err_size, "a matrix product fused with its epilogue is CUDA's alone");
        return -1;
    }
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
        if (k->streams)
            codegen_stream_stores(m);
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
