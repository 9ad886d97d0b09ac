/* Compiling kernels to object code and loading object code with ORC LLJIT.
 *
 * One LLJIT serves the process. Each kernel is built as a module in its own
 * context, optimised with LLVMRunPasses for its target and emitted as an
 * object file into memory: the form the cache stores. Host objects are added
 * to the JIT under their own resource tracker, so that freeing the code
 * unloads it. A target machine is not safe to share between threads, so a
 * compile borrows one of its target's for its duration, and compiles of
 * different kernels run at once (each in its own context). One lock covers
 * the rest of LLVM: the JIT, the targets' lists, the register probe. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen_llvm/codegen_version.h"
#include "codegen_llvm/gemm_codegen.h"
#include "codegen_llvm/internal.h"
#include "codegen_llvm/math.h"

/* Target machines a target keeps for compiles to borrow: more compiles at
 * once make their own and dispose of them after. */
enum { MAX_MACHINES = 4 };

struct llvm_code {
    LLVMOrcResourceTrackerRef tracker;
};

/* A CPU that code is generated for: the host, or one named for
 * cross-compiling. */
struct llvm_target {
    kx_target base;          /* base.name: "cpu:<name>[:<features>]" as asked for, the host's in full */
    char *name;
    char cpu[64];
    LLVMTargetRef target;
    char triple[128];
    char *features;          /* sorted; "" for the CPU's own */
    LLVMTargetMachineRef idle[MAX_MACHINES]; /* made by compiles, lent to one at a time: a disk hit needs none */
    int n_idle;
    gemm_registers registers; /* probed by the first product compiled for it; bits 0 before */
    char *id;                /* triple, CPU and the features that change code */
    struct llvm_target *next;
};

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    pthread_cond_t idle;     /* compiling dropped to 0 */
    int compiling;           /* compiles running outside the lock */
    LLVMOrcLLJITRef jit;
    llvm_target host;
    llvm_target *named;      /* named for cross-compiling, most recent first */
    char failure[512];       /* why the JIT could not start, or "" */
    char toolchain[32];
} state = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

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

/* Reads what a child wrote into fd until it closes it; said holds the first
 * line. */
static void read_line(int fd, char *said, size_t size)
{
    size_t used = 0;
    char chunk[256];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = (size_t)n < size - 1 - used ? (size_t)n : size - 1 - used;
        memcpy(said + used, chunk, take);
        used += take;
    }
    said[used] = '\0';
    said[strcspn(said, "\n")] = '\0';
}

/* Whether LLVM knows cpu and features for triple. Its C API has no way to
 * ask but making a target machine, which only warns about an unknown CPU or
 * feature, on stderr: a child process makes it with its stderr going to a
 * pipe, so that this process's descriptors stay as they are. The child
 * touches only LLVM, whose lock the caller holds, and no compile is running
 * (the caller waits for them), so no other thread of this process is inside
 * LLVM when it forks. said: LLVM's warning. */
static bool llvm_accepts(LLVMTargetRef target, const char *triple, const char *cpu, const char *features,
                         char *said, size_t size)
{
    int fds[2];
    said[0] = '\0';
    while (state.compiling > 0)
        pthread_cond_wait(&state.idle, &state.lock);
    if (pipe(fds) < 0) {
        snprintf(said, size, "cannot check it: pipe: %s", strerror(errno));
        return false;
    }
    pid_t child = fork();
    if (child == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelNone,
                                                          LLVMRelocPIC, LLVMCodeModelDefault);
        if (tm) /* under valgrind the child's exit reports what it leaked, and fails */
            LLVMDisposeTargetMachine(tm);
        _exit(tm ? 0 : 1);
    }
    close(fds[1]);
    if (child < 0) {
        close(fds[0]);
        snprintf(said, size, "cannot check it: fork: %s", strerror(errno));
        return false;
    }
    read_line(fds[0], said, size);
    close(fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    bool made = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!made && !said[0])
        snprintf(said, size, "LLVM made no target machine");
    return made && !strstr(said, "not a recognized");
}

/* Sets t up for cpu with features (NULL: the CPU's own) under name; host
 * marks the machine kiln runs on. */
static int make_target(llvm_target *t, const char *name, const char *cpu, const char *features, bool host,
                       char *err, size_t size)
{
    char *triple = LLVMGetDefaultTargetTriple(), *message = NULL, said[256];
    char sorted[4096] = "";
    LLVMTargetRef target;
    int status = -1;
    if (LLVMGetTargetFromTriple(triple, &target, &message)) {
        snprintf(err, size, "no LLVM target for %s: %s", triple, message);
        LLVMDisposeMessage(message);
    } else if (strlen(cpu) >= sizeof t->cpu || strlen(triple) >= sizeof t->triple) {
        snprintf(err, size, "the CPU name is too long");
    } else if (features && sort_features(features, sorted, sizeof sorted, err, size) < 0) {
        status = -1; /* err says why */
    } else if (!host && !llvm_accepts(target, triple, cpu, sorted, said, sizeof said)) {
        snprintf(err, size, "%s does not accept this target for %s: %s", state.toolchain, triple, said);
    } else {
        t->target = target;
        snprintf(t->cpu, sizeof t->cpu, "%s", cpu);
        snprintf(t->triple, sizeof t->triple, "%s", triple);
        t->features = strdup(sorted);
        size_t id_size = strlen(triple) + strlen(cpu) + strlen(sorted) + 64;
        t->id = malloc(id_size);
        size_t name_size = strlen(cpu) + strlen(sorted) + 8;
        t->name = malloc(name_size > strlen(name) + 1 ? name_size : strlen(name) + 1);
        if (t->features && t->id && t->name) {
            snprintf(t->id, id_size, "%s cpu=%s features=%s", triple, t->cpu, features ? sorted : "(the CPU's own)");
            if (host)
                snprintf(t->name, name_size, "cpu:%s:%s", t->cpu, sorted);
            else
                strcpy(t->name, name);
            t->base = (kx_target){&llvm_backend, t->name, t->id, host};
            status = 0;
        } else {
            snprintf(err, size, "out of memory");
        }
    }
    LLVMDisposeMessage(triple);
    return status;
}

bool llvm_feature_listed(const char *list, const char *entry)
{
    size_t len = strlen(entry);
    for (const char *at = list; *at; at += strcspn(at, ","), at += *at == ',')
        if (!strncmp(at, entry, len) && (at[len] == ',' || !at[len]))
            return true;
    return false;
}

/* The features of KILN_CPU_TARGET ("cpu:<name>:<features>") into out, when
 * the host can run its code: the host's CPU, and no feature on that the host
 * lacks (a target that only turns features off, as a narrower vector unit);
 * else -1, why in err. */
static int host_runs(const char *asked, const char *cpu, const char *host_features, char *out, size_t size,
                     char *err, size_t err_size)
{
    size_t cpu_len = strlen(cpu);
    if (strncmp(asked, "cpu:", 4) || strncmp(asked + 4, cpu, cpu_len) || asked[4 + cpu_len] != ':') {
        snprintf(err, err_size, "KILN_CPU_TARGET=%.200s: not \"cpu:%s:<features>\" (this host's CPU, with features "
                 "turned off)", asked, cpu);
        return -1;
    }
    snprintf(out, size, "%s", asked + 5 + cpu_len);
    char *copy = strdup(out), *save = NULL;
    err[0] = '\0';
    for (char *f = copy ? strtok_r(copy, ",", &save) : NULL; f && !err[0]; f = strtok_r(NULL, ",", &save)) {
        if (f[0] == '+' && !llvm_feature_listed(host_features, f))
            snprintf(err, err_size, "KILN_CPU_TARGET: this host's CPU lacks %s", f + 1);
    }
    if (!copy)
        snprintf(err, err_size, "out of memory");
    free(copy);
    return err[0] ? -1 : 0;
}

static void start(void)
{
    unsigned major, minor, patch;
    LLVMGetVersion(&major, &minor, &patch);
    snprintf(state.toolchain, sizeof state.toolchain, "LLVM %u.%u.%u", major, minor, patch);
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures(), asked[4096];
    const char *target = getenv("KILN_CPU_TARGET");
    int made = target && *target ? host_runs(target, cpu, features, asked, sizeof asked, state.failure,
                                             sizeof state.failure)
                                 : 0;
    if (made == 0)
        made = make_target(&state.host, "host", cpu, target && *target ? asked : features, true, state.failure,
                           sizeof state.failure);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(features);
    if (made < 0)
        return;
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
        return &state.host;
    const char *cpu = name + 4, *colon = strchr(cpu, ':');
    size_t cpu_len = colon ? (size_t)(colon - cpu) : strlen(cpu);
    if (strncmp(name, "cpu:", 4) != 0 || cpu_len == 0 || cpu_len >= sizeof state.host.cpu) {
        snprintf(err, size, "\"%.200s\" is not a CPU target (\"host\", \"cpu:<LLVM CPU name>\" or "
                 "\"cpu:<name>:<LLVM feature list>\")", name);
        return NULL;
    }
    char cpu_name[sizeof state.host.cpu];
    snprintf(cpu_name, sizeof cpu_name, "%.*s", (int)cpu_len, cpu);
    pthread_mutex_lock(&state.lock);
    llvm_target *found = state.named;
    while (found && strcmp(found->name, name))
        found = found->next;
    llvm_target *made = found ? NULL : calloc(1, sizeof *made);
    if (!found && !made) {
        snprintf(err, size, "out of memory");
    } else if (!found && make_target(made, name, cpu_name, colon ? colon + 1 : NULL, false, err, size) == 0) {
        made->next = state.named;
        state.named = found = made;
    } else if (!found) {
        free(made->features);
        free(made->id);
        free(made->name);
        free(made);
    }
    pthread_mutex_unlock(&state.lock);
    return found;
}

const kx_target *llvm_target_of(const llvm_target *t)
{
    return &t->base;
}

const llvm_target *llvm_target_from(const kx_target *t)
{
    return (const llvm_target *)((const char *)t - offsetof(llvm_target, base));
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

/* What a module holds: a fused kernel, or the plain product of dtype. */
typedef struct {
    const kx_kernel *kernel;
    kiln_dtype product;
} contents;

/* The register tile of products of dt for t. */
static gemm_shape product_shape(llvm_target *t, LLVMTargetMachineRef tm, kiln_dtype dt)
{
    pthread_mutex_lock(&state.lock);
    if (!t->registers.bits)
        t->registers = gemm_probe_registers(tm);
    gemm_registers registers = t->registers;
    pthread_mutex_unlock(&state.lock);
    return gemm_shape_for(dt, registers);
}

LLVMModuleRef llvm_module_for(LLVMContextRef ctx, LLVMTargetMachineRef tm)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("kiln", ctx);
    char *triple = LLVMGetTargetMachineTriple(tm);
    LLVMSetTarget(m, triple);
    LLVMDisposeMessage(triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(tm);
    LLVMSetModuleDataLayout(m, layout);
    LLVMDisposeTargetData(layout);
    return m;
}

static int verify(LLVMModuleRef m, char *err, size_t size)
{
    char *message = NULL;
    int status = 0;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &message)) {
        snprintf(err, size, "generated LLVM IR does not verify: %.400s", message);
        status = -1;
    }
    LLVMDisposeMessage(message);
    return status;
}

/* What an elementwise loop needs from O2, at a third of its time: its
 * body's memory in registers, the loop in the form the vectorizer takes, the
 * row's invariants (0-d values, a broadcast row's loads: the body's
 * pointers are noalias) hoisted, then widened and tidied. Without inlining,
 * the entry keeps its call of the body. */
static const char LIGHT_PIPELINE[] =
    "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,loop-simplify,lcssa,loop-rotate,"
    "loop-mssa(licm),loop-vectorize,instcombine<no-verify-fixpoint>,simplifycfg)";

/* light: an elementwise loop, which LIGHT_PIPELINE serves from O2 up. */
static int optimise(LLVMModuleRef m, LLVMTargetMachineRef tm, int level, bool light, char *err, size_t size)
{
    static const char *const pipelines[] = {"default<O0>", "default<O1>", "default<O2>", "default<O3>"};
    level = level < 0 ? 0 : level > 3 ? 3 : level;
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(options, level >= 2);
    LLVMPassBuilderOptionsSetSLPVectorization(options, level >= 2);
    LLVMErrorRef e = LLVMRunPasses(m, light && level >= 2 ? LIGHT_PIPELINE : pipelines[level], tm, options);
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

/* A target machine of t for one compile to use alone, counted among the
 * compiles running (machine_return gives it back). */
static LLVMTargetMachineRef machine_borrow(llvm_target *t, char *err, size_t size)
{
    pthread_mutex_lock(&state.lock);
    LLVMTargetMachineRef tm = t->n_idle ? t->idle[--t->n_idle] : NULL;
    state.compiling++;
    pthread_mutex_unlock(&state.lock);
    if (!tm)
        tm = LLVMCreateTargetMachine(t->target, t->triple, t->cpu, t->features, LLVMCodeGenLevelAggressive,
                                     LLVMRelocPIC, LLVMCodeModelDefault);
    if (!tm)
        snprintf(err, size, "LLVM cannot target %s (%s)", t->triple, t->cpu);
    return tm;
}

static void machine_return(llvm_target *t, LLVMTargetMachineRef tm)
{
    pthread_mutex_lock(&state.lock);
    if (tm && t->n_idle < MAX_MACHINES)
        t->idle[t->n_idle++] = tm;
    else if (tm)
        LLVMDisposeTargetMachine(tm);
    if (--state.compiling == 0)
        pthread_cond_broadcast(&state.idle);
    pthread_mutex_unlock(&state.lock);
}

/* The IR before optimisation into opt->ir_before, when asked. */
static int verified(LLVMModuleRef m, const llvm_options *opt, char *err, size_t err_size)
{
    if (verify(m, err, err_size) < 0)
        return -1;
    if (opt->ir_before)
        *opt->ir_before = module_text(m);
    return 0;
}

/* A fused kernel's module: built, verified and optimised. */
static int kernel_module(LLVMModuleRef m, const kx_kernel *k, const char *symbol, const llvm_options *opt,
                         LLVMTargetMachineRef tm, char *err, size_t err_size)
{
    bool light = !k->n_reductions && !k->n_row_stores && !opt->stream_stores;
    if (codegen_kernel(m, k, symbol, opt->stream_stores, err, err_size) < 0 || verified(m, opt, err, err_size) < 0 ||
        optimise(m, tm, opt->opt_level, light, err, err_size) < 0)
        return -1;
    if (opt->stream_stores)
        codegen_stream_stores(m);
    return 0;
}

/* An attention kernel's module: its scores and online softmax optimised,
 * then the product's functions, as product_module makes them. */
static int attention_module(LLVMModuleRef m, const kx_kernel *k, const char *symbol, const llvm_options *opt,
                            gemm_shape shape, LLVMTargetMachineRef tm, char *err, size_t err_size)
{
    kiln_dtype dt = k->buffer_dtypes[k->product];
    if (codegen_scores(m, k, symbol, ATTENTION_BLOCK_TILES * shape.nr, err, err_size) < 0 ||
        attention_codegen(m, symbol, dt, shape, err, err_size) < 0 || verified(m, opt, err, err_size) < 0 ||
        optimise(m, tm, opt->opt_level, false, err, err_size) < 0 ||
        gemm_codegen(m, symbol, dt, shape, false, err, err_size) < 0)
        return -1;
    return verify(m, err, err_size);
}

/* A product's module: its epilogue and prologue (if any) optimised on
 * their own, then the packing and micro-kernel, whose IR is final as made (explicit vectors and
 * unrolled steps) and goes to code generation as it is: optimising it
 * would take most of a compile and change nothing of its code. */
static int product_module(LLVMModuleRef m, const contents *c, const char *symbol, const llvm_options *opt,
                          llvm_target *t, LLVMTargetMachineRef tm, char *err, size_t err_size)
{
    const kx_kernel *k = c->kernel;
    kiln_dtype dt = k ? k->buffer_dtypes[k->product] : c->product;
    gemm_shape shape = product_shape(t, tm, dt);
    if (k && k->attention)
        return attention_module(m, k, symbol, opt, shape, tm, err, err_size);
    if (k && conv_depthwise(&k->conv))
        depthwise_codegen(m, symbol, dt, &k->conv);
    if (k && (!codegen_epilogue(m, k, symbol, shape.nr, err, err_size) ||
              (k->prologue && codegen_prologue(m, k, symbol, shape.mr, err, err_size) < 0) ||
              verified(m, opt, err, err_size) < 0 || optimise(m, tm, opt->opt_level, false, err, err_size) < 0))
        return -1;
    if (gemm_codegen(m, symbol, dt, shape, k != NULL, err, err_size) < 0)
        return -1;
    return k ? verify(m, err, err_size) : verified(m, opt, err, err_size);
}

static int compile_module(const contents *c, const char *symbol, const llvm_target *target, const llvm_options *opt,
                          void **object, size_t *size, char *err, size_t err_size)
{
    llvm_target *t = (llvm_target *)target; /* targets live in state, which is not const */
    *object = NULL;
    LLVMTargetMachineRef tm = machine_borrow(t, err, err_size);
    if (!tm) {
        machine_return(t, tm);
        return -1;
    }
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = llvm_module_for(ctx, tm);
    int status = c->kernel && c->kernel->product < 0 ? kernel_module(m, c->kernel, symbol, opt, tm, err, err_size)
                                                      : product_module(m, c, symbol, opt, t, tm, err, err_size);
    if (status == 0)
        math_lower_target(m, tm);
    if (status == 0 && opt->ir_after)
        *opt->ir_after = module_text(m);
    if (status == 0)
        status = emit_object(m, tm, object, size, err, err_size);
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    machine_return(t, tm);
    return status;
}

int llvm_compile_object(const kx_kernel *k, const char *symbol, const llvm_target *t, const llvm_options *opt,
                        void **object, size_t *size, char *err, size_t err_size)
{
    contents c = {.kernel = k};
    return compile_module(&c, symbol, t, opt, object, size, err, err_size);
}

int llvm_compile_gemm(kiln_dtype dt, const char *symbol, const llvm_target *t, const llvm_options *opt,
                      void **object, size_t *size, char *err, size_t err_size)
{
    contents c = {.product = dt};
    return compile_module(&c, symbol, t, opt, object, size, err, err_size);
}

llvm_code *llvm_load_symbols(const void *object, size_t size, const char *const *names, int n, void **addresses,
                             char *err, size_t err_size)
{
    if (!started(err, err_size))
        return NULL;
    llvm_code *code = calloc(1, sizeof *code);
    if (!code) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&state.lock);
    LLVMMemoryBufferRef buffer = LLVMCreateMemoryBufferWithMemoryRangeCopy(object, size, names[0]);
    code->tracker = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(state.jit));
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(state.jit, code->tracker, buffer);
    if (e)
        take_error(e, "loading object code", err, err_size);
    for (int i = 0; i < n && !e; i++) {
        LLVMOrcExecutorAddress address = 0;
        if ((e = LLVMOrcLLJITLookup(state.jit, &address, names[i])))
            take_error(e, "finding the kernel in its object code", err, err_size);
        addresses[i] = (void *)(uintptr_t)address;
    }
    pthread_mutex_unlock(&state.lock);
    if (e) {
        llvm_code_free(code);
        return NULL;
    }
    return code;
}

llvm_code *llvm_load(const void *object, size_t size, const char *symbol, llvm_kernel_fn *fn, char *err,
                     size_t err_size)
{
    void *address = NULL;
    llvm_code *code = llvm_load_symbols(object, size, &symbol, 1, &address, err, err_size);
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
