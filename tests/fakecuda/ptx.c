/* A PTX interpreter, so that the stand-in driver can run the kernels kiln
 * loads and the CUDA tests can check their values without a GPU.
 *
 * Parsing, once per module, turns every function into fixed-size
 * instructions in one array: an opcode specialised by type where that pays,
 * operands as indices of 64-bit slots in a thread's slot file, branch
 * targets as instruction indices. The first slots are presets: the
 * constants of the text, the addresses of symbols, the special registers
 * (%tid, %ctaid, ...), set once per launch or per thread. The registers the
 * functions declare follow, each function its own (calls may not recurse).
 * A value narrower than 64 bits lives in a slot's low bits and every
 * instruction reads only the bits of its type, so additions, logic and
 * truncations need no width.
 *
 * Addresses are host addresses for global and parameter memory (the stand-in
 * driver's device memory is host memory). Shared and local memory are
 * windows starting at 0, as on a GPU, which cvta converts to host addresses
 * and back. Every access is checked: a global one against the live device
 * blocks and the module's globals (with a range cached per instruction, as
 * an instruction mostly touches one buffer), a shared or local one against
 * its window, and each against its natural alignment.
 *
 * Execution: blocks one after another; in a block, threads one at a time,
 * each running until it reaches a barrier, a warp-synchronous instruction
 * (shfl.sync, vote.sync, activemask) or its end. A warp's instruction is
 * resolved once every live thread of the warp waits at it; a barrier is
 * released once every live thread of the block waits at one. That is a
 * legal schedule, so a race-free kernel computes what it does on a GPU.
 * IEEE instructions round as PTX says (.ftz flushes subnormals, .rz/.rm/.rp
 * go through the host's rounding modes); approximate ones (ex2.approx,
 * rcp.approx, tanh.approx, ...) are computed with libm, more exactly than a
 * GPU does. Anything the parser does not know fails the load, naming it. */
#include "ptx.h"

#include <fenv.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 s128;

/* -- Types, opcodes, instructions ------------------------------------------ */

enum type { T_NONE, T_B8, T_B16, T_B32, T_B64, T_U8, T_U16, T_U32, T_U64, T_S8, T_S16, T_S32, T_S64, T_F32,
            T_F64, T_PRED };
static const char *const type_names[] = {"",    "b8",  "b16", "b32", "b64", "u8",  "u16", "u32",
                                         "u64", "s8",  "s16", "s32", "s64", "f32", "f64", "pred"};

static int type_bits(int t)
{
    static const int bits[] = {0, 8, 16, 32, 64, 8, 16, 32, 64, 8, 16, 32, 64, 32, 64, 1};
    return bits[t];
}

static bool type_signed(int t) { return t >= T_S8 && t <= T_S64; }
static bool type_float(int t) { return t == T_F32 || t == T_F64; }
static bool type_integer(int t) { return t >= T_B8 && t <= T_S64; }

/* Each opcode's handler is a case of execute()'s switch. */
#define OPCODES(_)                                                                                                 \
    _(MOV) _(PACK) _(UNPACK) _(SEXT) _(ZEXT) _(LD_GLOBAL) _(LD_SHARED) _(LD_LOCAL) _(LD_PARAM) _(LD_GENERIC)        \
    _(ST_GLOBAL) _(ST_SHARED) _(ST_LOCAL) _(ST_PARAM) _(ST_GENERIC) _(TO_WINDOW) _(FROM_WINDOW) _(ADD) _(SUB)       \
    _(MUL_LO) _(MAD_LO) _(NEG) _(AND) _(OR) _(XOR) _(NOT) _(CNOT) _(SHL) _(SHR_S) _(SHR_U) _(MUL_HI_S) _(MUL_HI_U) \
    _(MUL_WIDE_S) _(MUL_WIDE_U) _(MAD_HI_S) _(MAD_HI_U) _(MAD_WIDE_S) _(MAD_WIDE_U) _(MUL24_S) _(MUL24_U)          \
    _(DIV_S) _(DIV_U) _(REM_S) _(REM_U) _(MIN_S) _(MIN_U) _(MAX_S) _(MAX_U) _(ABS) _(CARRY) _(POPC) _(CLZ) _(BREV)  \
    _(BFE_S) _(BFE_U) _(BFI) _(PRMT) _(SHF) _(LOP3) _(DP2A) _(DP4A) _(SETP_S) _(SETP_U) _(SETP_F32) _(SETP_F64)    \
    _(SELP) _(SLCT_S32) _(SLCT_F32) _(TESTP) _(FADD32) _(FSUB32) _(FMUL32) _(FFMA32) _(FMATH32) _(FADD64)          \
    _(FSUB64) _(FMUL64) _(FFMA64) _(FMATH64) _(CVT) _(BRA) _(CALL) _(RET) _(EXIT) _(BAR) _(SHFL) _(VOTE) _(ACTIVEMASK) _(NOP)          \
    _(ATOM)

enum opcode {
#define OPCODE_ENUM(name) OP_##name,
    OPCODES(OPCODE_ENUM)
#undef OPCODE_ENUM
};

/* A float instruction's operation, for the paths that are not inlined. */
enum float_op { F_ADD, F_SUB, F_MUL, F_FMA, F_MIN, F_MAX, F_ABS, F_NEG, F_DIV, F_SQRT, F_RCP, F_RSQRT, F_EX2,
                F_LG2, F_SIN, F_COS, F_TANH, F_COPYSIGN };

/* Rounding modifiers; the float paths take the plain (nearest) one inline. */
enum rounding { RND_NONE, RND_RN, RND_RZ, RND_RM, RND_RP, RND_RNI, RND_RZI, RND_RMI, RND_RPI };

/* An instruction's mode byte for floats: rounding in the low bits. */
enum { MODE_ROUNDING = 15, MODE_FTZ = 16, MODE_SAT = 32, MODE_APPROX = 64 };

/* Flags: the guard's negation is bit 0, so that the test is one xor. */
enum { FLAG_GUARD_NEGATED = 1, FLAG_C_NEGATED = 2 };

enum compare { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_LO, CMP_LS, CMP_HI, CMP_HS, CMP_EQU,
               CMP_NEU, CMP_LTU, CMP_LEU, CMP_GTU, CMP_GEU, CMP_NUM, CMP_NAN, CMP_NONE };
static const char *const compare_names[] = {"eq",  "ne",  "lt",  "le",  "gt",  "ge",  "lo",  "ls",  "hi",
                                            "hs",  "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};

enum bool_op { BOOL_NONE, BOOL_AND, BOOL_OR, BOOL_XOR };
enum shfl_mode { SHFL_UP, SHFL_DOWN, SHFL_BFLY, SHFL_IDX };
enum vote_mode { VOTE_ALL, VOTE_ANY, VOTE_UNI, VOTE_BALLOT };
enum atom_op { ATOM_NONE, ATOM_ADD, ATOM_MIN, ATOM_MAX, ATOM_EXCH, ATOM_CAS, ATOM_AND, ATOM_OR, ATOM_XOR, ATOM_INC,
               ATOM_DEC };
enum space { SPACE_GENERIC, SPACE_GLOBAL, SPACE_SHARED, SPACE_LOCAL, SPACE_PARAM, SPACE_CONST };
enum testp_class { TESTP_FINITE, TESTP_INFINITE, TESTP_NUMBER, TESTP_NOTANUMBER, TESTP_NORMAL, TESTP_SUBNORMAL };

/* Carry-chain instructions (add.cc, addc, madc.hi.cc, ...): what they do. */
enum { CARRY_IN = 1, CARRY_OUT = 2, CARRY_SUBTRACT = 4, CARRY_MUL_LO = 8, CARRY_MUL_HI = 16 };

/* Fixed preset slots; the text's constants and symbols follow. */
enum { SLOT_TRUE, SLOT_SINK, SLOT_CARRY, SLOT_TID, SLOT_NTID = SLOT_TID + 3, SLOT_CTAID = SLOT_NTID + 3,
       SLOT_NCTAID = SLOT_CTAID + 3, SLOT_LANEID = SLOT_NCTAID + 3, SLOT_WARPID, SLOT_NWARPID, FIRST_FREE_SLOT };

/* Register slots are numbered apart while parsing (this bit set), then moved
 * behind the presets. */
enum { REGISTER_BIT = 0x8000, MAX_SLOTS = 0xffff };

typedef struct {
    uint16_t op;
    uint8_t mode; /* rounding and float flags, a comparison, a shuffle's or vote's kind */
    uint8_t aux;  /* width in bits, a float_op, a memory access's bytes, ... */
    uint8_t aux2; /* a vector's length, a second type, a boolean combination */
    uint8_t flags;
    uint16_t guard; /* a predicate slot; SLOT_TRUE when unguarded */
    uint16_t o[6];  /* destinations first, then sources, as slots */
    int64_t imm;    /* an address offset, a branch target, a callee */
} insn;

typedef struct {
    size_t size, align, offset;
    uint16_t slot;
    bool u64;
} param;

/* What a preset slot holds at the start of a launch or a thread. */
enum preset_kind { PRESET_VALUE, PRESET_KERNEL_PARAM, PRESET_THREAD_PARAM, PRESET_BOUND };
typedef struct {
    uint8_t kind;
    uint64_t value; /* the value, or an offset into the parameter buffer or the thread's call parameters */
} preset;

struct ptx_kernel {
    char *name;
    bool entry, defined;
    int start; /* first instruction */
    int line;
    param *params;
    int n_params;
    size_t param_bytes;
    uint16_t retval_slot; /* holds the address of the caller's return value */
    bool has_retval;
};

typedef struct {
    uint8_t *data;
    size_t size;
} global_block;

/* Reused between launches (they are serialised per module). */
typedef struct {
    uint64_t *slots;
    size_t slots_cap;
    uint8_t *shared, *local, *params, *call_params;
    size_t shared_cap, local_cap, params_cap, call_params_cap;
    ptx_range *cache, *memory;
    size_t cache_cap, memory_cap;
    void *threads;
    size_t threads_cap;
} scratch;

struct ptx_module {
    char *text;
    insn *code;
    int *lines;
    int n_code, code_cap;
    preset *presets;
    int n_presets, presets_cap, n_registers;
    struct ptx_kernel *functions;
    int n_functions, functions_cap;
    uint16_t *call_args;
    int n_call_args, call_args_cap;
    global_block *globals;
    int n_globals, globals_cap;
    size_t shared_bytes, shared_align, local_bytes, call_param_bytes;
    scratch scratch;
};

/* -- Lexing ---------------------------------------------------------------- */

enum token_kind { TK_END, TK_NAME, TK_INT, TK_FLOAT, TK_STRING, TK_PUNCT };

typedef struct {
    uint8_t kind;
    uint8_t float_bits; /* 32 or 64 for TK_FLOAT */
    char punct;
    int line, len;
    const char *text;
    uint64_t value;
} token;

typedef struct {
    const char *text;
    token *tokens;
    int n_tokens, at;
    ptx_module *m;
    char *err;
    size_t err_size;
    bool failed;
    struct name *names;
    int n_names, names_cap;
    int scopes[64], depth;
    int function; /* index of the function being defined, -1 outside */
    struct label *labels;
    int n_labels, labels_cap;
    struct label *fixups;
    int n_fixups, fixups_cap;
    uint64_t *constant_values;
    uint16_t *constant_slots;
    int constants_cap, n_constants;
} parser;

static bool fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(parser *p, int line, const char *fmt, ...)
{
    if (p->failed)
        return false;
    p->failed = true;
    int n = snprintf(p->err, p->err_size, "PTX line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->err_size)
        vsnprintf(p->err + n, p->err_size - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

/* Grows *array (of *cap elements of size bytes) to hold n; false when out of memory. */
static bool grow(void *array, int *cap, int n, size_t size)
{
    if (n <= *cap)
        return true;
    int want = *cap ? *cap * 2 : 64;
    while (want < n)
        want *= 2;
    void *bigger = realloc(*(void **)array, (size_t)want * size);
    if (!bigger)
        return false;
    *(void **)array = bigger;
    *cap = want;
    return true;
}

static bool name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' || c == '%' || c == '.';
}

static bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }
static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* A number at s: decimal, 0x hex, or a float's bits as 0f (32) / 0d (64) hex. */
static const char *lex_number(const char *s, token *t)
{
    t->kind = TK_INT;
    t->value = 0;
    if (s[0] == '0' && (s[1] == 'f' || s[1] == 'F' || s[1] == 'd' || s[1] == 'D' || s[1] == 'x' || s[1] == 'X')) {
        char k = (char)(s[1] | 0x20);
        s += 2;
        for (int d; (d = hex_digit(*s)) >= 0; s++)
            t->value = t->value << 4 | (uint64_t)d;
        if (k != 'x') {
            t->kind = TK_FLOAT;
            t->float_bits = k == 'f' ? 32 : 64;
        }
    } else {
        for (; *s >= '0' && *s <= '9'; s++)
            t->value = t->value * 10 + (uint64_t)(*s - '0');
    }
    if (*s == 'U')
        s++;
    return s;
}

static bool lex(parser *p)
{
    int line = 1, cap = 0;
    const char *s = p->text;
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            line += *s++ == '\n';
        if (s[0] == '/' && s[1] == '/') {
            while (*s && *s != '\n')
                s++;
            continue;
        }
        if (s[0] == '/' && s[1] == '*') {
            for (s += 2; *s && !(s[0] == '*' && s[1] == '/'); s++)
                line += *s == '\n';
            s += *s ? 2 : 0;
            continue;
        }
        if (!grow(&p->tokens, &cap, p->n_tokens + 1, sizeof(token)))
            return fail(p, line, "out of memory");
        token *t = &p->tokens[p->n_tokens++];
        *t = (token){.kind = TK_END, .line = line, .text = s};
        if (!*s)
            return true;
        if (*s >= '0' && *s <= '9') {
            s = lex_number(s, t);
        } else if (name_start(*s)) {
            t->kind = TK_NAME;
            while (name_char(*s))
                s++;
        } else if (*s == '"') {
            t->kind = TK_STRING;
            for (s++; *s && *s != '"'; s++)
                ;
            s += *s ? 1 : 0;
        } else if (strchr(",;:[]{}()|+-!@<>=", *s)) {
            t->kind = TK_PUNCT;
            t->punct = *s++;
        } else {
            return fail(p, line, "unexpected character '%c'", *s);
        }
        t->len = (int)(s - t->text);
    }
}

/* -- Parsing: tokens and names ---------------------------------------------- */

static token *peek(parser *p) { return &p->tokens[p->at]; }
static token *next(parser *p) { return &p->tokens[p->at < p->n_tokens - 1 ? p->at++ : p->at]; }
static bool is_punct(const token *t, char c) { return t->kind == TK_PUNCT && t->punct == c; }
static bool is_word(const token *t, const char *w)
{
    return t->kind == TK_NAME && t->len == (int)strlen(w) && !memcmp(t->text, w, (size_t)t->len);
}

static bool expect(parser *p, char c)
{
    token *t = next(p);
    return is_punct(t, c) || fail(p, t->line, "expected '%c', found '%.*s'", c, t->len, t->text);
}

static bool expect_int(parser *p, uint64_t *v)
{
    token *t = next(p);
    *v = t->value;
    return t->kind == TK_INT || fail(p, t->line, "expected a number, found '%.*s'", t->len, t->text);
}

/* Names in scope: registers (one, or a %r<N> range), symbols (whose slot
 * holds their address) and functions. Scopes nest with braces. */
enum name_kind { NAME_REGISTER, NAME_REGISTER_RANGE, NAME_SYMBOL, NAME_FUNCTION };
struct name {
    const char *text;
    int len, kind, count, function;
    uint16_t slot;
};

struct label {
    const char *text;
    int len, at, line;
};

static bool add_name(parser *p, const token *t, int kind, uint16_t slot, int count)
{
    if (!grow(&p->names, &p->names_cap, p->n_names + 1, sizeof(struct name)))
        return fail(p, t->line, "out of memory");
    p->names[p->n_names++] = (struct name){.text = t->text, .len = t->len, .kind = kind, .slot = slot, .count = count};
    return true;
}

/* The innermost name spelled as t; NULL where none is. *index is a range's member. */
static const struct name *find_name(parser *p, const char *text, int len, int *index)
{
    int digits = 0;
    while (digits < len && text[len - 1 - digits] >= '0' && text[len - 1 - digits] <= '9')
        digits++;
    for (int i = p->n_names - 1; i >= 0; i--) {
        const struct name *n = &p->names[i];
        if (n->kind != NAME_REGISTER_RANGE) {
            if (n->len == len && !memcmp(n->text, text, (size_t)len))
                return n;
            continue;
        }
        if (digits == 0 || digits > 9 || n->len != len - digits || memcmp(n->text, text, (size_t)n->len))
            continue;
        int k = atoi(text + n->len);
        if (k < n->count && (digits == 1 || text[n->len] != '0')) {
            *index = k;
            return n;
        }
    }
    return NULL;
}

static uint16_t new_register(parser *p, int line, int count)
{
    if (p->m->n_registers + count >= REGISTER_BIT) {
        fail(p, line, "more than %d registers", REGISTER_BIT);
        return 0;
    }
    uint16_t slot = (uint16_t)(REGISTER_BIT | p->m->n_registers);
    p->m->n_registers += count;
    return slot;
}

static uint16_t new_preset(parser *p, int line, int kind, uint64_t value)
{
    ptx_module *m = p->m;
    if (m->n_presets >= REGISTER_BIT - 1 || !grow(&m->presets, &m->presets_cap, m->n_presets + 1, sizeof(preset))) {
        fail(p, line, "too many constants and symbols");
        return 0;
    }
    m->presets[m->n_presets] = (preset){.kind = (uint8_t)kind, .value = value};
    return (uint16_t)m->n_presets++;
}

/* The slot holding constant bits, shared by every use of them. */
static uint16_t constant_slot(parser *p, int line, uint64_t bits)
{
    if (p->n_constants * 2 >= p->constants_cap) {
        int old_cap = p->constants_cap;
        uint64_t *old_values = p->constant_values;
        uint16_t *old_slots = p->constant_slots;
        p->constants_cap = old_cap ? old_cap * 2 : 256;
        p->constant_values = malloc(sizeof(uint64_t) * (size_t)p->constants_cap);
        p->constant_slots = calloc((size_t)p->constants_cap, sizeof(uint16_t));
        if (!p->constant_values || !p->constant_slots) {
            free(old_values);
            free(old_slots);
            fail(p, line, "out of memory");
            return 0;
        }
        p->n_constants = 0;
        for (int i = 0; i < old_cap; i++) {
            if (!old_slots[i])
                continue;
            size_t h = (size_t)(old_values[i] * 0x9e3779b97f4a7c15ull) & (size_t)(p->constants_cap - 1);
            while (p->constant_slots[h])
                h = (h + 1) & (size_t)(p->constants_cap - 1);
            p->constant_values[h] = old_values[i];
            p->constant_slots[h] = old_slots[i];
            p->n_constants++;
        }
        free(old_values);
        free(old_slots);
    }
    size_t h = (size_t)(bits * 0x9e3779b97f4a7c15ull) & (size_t)(p->constants_cap - 1);
    while (p->constant_slots[h]) {
        if (p->constant_values[h] == bits)
            return p->constant_slots[h];
        h = (h + 1) & (size_t)(p->constants_cap - 1);
    }
    uint16_t slot = new_preset(p, line, PRESET_VALUE, bits);
    p->constant_values[h] = bits;
    p->constant_slots[h] = slot;
    p->n_constants++;
    return slot;
}

static uint64_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static float f32_of(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double f64_of(uint64_t v)
{
    double d;
    memcpy(&d, &v, 8);
    return d;
}

/* -- Parsing: operands ------------------------------------------------------ */

enum value_kind { V_REGISTER, V_IMMEDIATE, V_SINK };
typedef struct {
    uint8_t kind;
    uint8_t float_bits; /* an immediate written as a float's bits: 32 or 64; 0 for an integer */
    uint16_t slot;
    uint64_t bits;
} value;

enum operand_kind { O_VALUE, O_ADDRESS, O_VECTOR, O_PAIR, O_NAME };
typedef struct {
    uint8_t kind;
    bool negated;
    value v, second; /* a pair's two registers are v and second */
    value elems[4];
    int n_elems;
    uint16_t base; /* an address's base: a register or a symbol's slot; SLOT_SINK for an absolute one */
    int64_t offset;
    const char *name; /* a label or function */
    int len, line;
} operand;

static int special_slot(const char *text, int len)
{
    static const struct {
        const char *name;
        int slot;
    } specials[] = {{"%tid", SLOT_TID}, {"%ntid", SLOT_NTID}, {"%ctaid", SLOT_CTAID}, {"%nctaid", SLOT_NCTAID}};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        int n = (int)strlen(specials[i].name);
        if (len == n + 2 && !memcmp(text, specials[i].name, (size_t)n) && text[n] == '.' && text[n + 1] >= 'x' &&
            text[n + 1] <= 'z')
            return specials[i].slot + text[n + 1] - 'x';
    }
    if (len == 7 && !memcmp(text, "%laneid", 7))
        return SLOT_LANEID;
    if (len == 7 && !memcmp(text, "%warpid", 7))
        return SLOT_WARPID;
    if (len == 8 && !memcmp(text, "%nwarpid", 8))
        return SLOT_NWARPID;
    return -1;
}

/* A register or special register's slot; false (having failed) for anything else. */
static bool register_slot(parser *p, const token *t, uint16_t *slot)
{
    int special = special_slot(t->text, t->len);
    if (special >= 0) {
        *slot = (uint16_t)special;
        return true;
    }
    int index = 0;
    const struct name *n = find_name(p, t->text, t->len, &index);
    if (!n || (n->kind != NAME_REGISTER && n->kind != NAME_REGISTER_RANGE))
        return fail(p, t->line, "unknown register %.*s", t->len, t->text);
    *slot = (uint16_t)(n->slot + index);
    return true;
}

/* Whether t names a register (NVRTC's names mostly, not always, start with %). */
static bool is_register(parser *p, const token *t)
{
    int index = 0;
    const struct name *n = find_name(p, t->text, t->len, &index);
    return n && (n->kind == NAME_REGISTER || n->kind == NAME_REGISTER_RANGE);
}

/* An immediate: [-]number. */
static bool parse_immediate(parser *p, value *v)
{
    bool minus = is_punct(peek(p), '-');
    if (minus)
        next(p);
    token *t = next(p);
    if (t->kind != TK_INT && t->kind != TK_FLOAT)
        return fail(p, t->line, "expected an operand, found '%.*s'", t->len, t->text);
    *v = (value){.kind = V_IMMEDIATE, .float_bits = t->kind == TK_FLOAT ? t->float_bits : 0,
                 .bits = minus ? (t->kind == TK_FLOAT ? t->value ^ (1ull << (t->float_bits - 1)) : 0 - t->value)
                               : t->value};
    return true;
}

/* A register, an immediate or _. */
static bool parse_value(parser *p, value *v)
{
    token *t = peek(p);
    if (is_word(t, "_")) {
        next(p);
        *v = (value){.kind = V_SINK, .slot = SLOT_SINK};
        return true;
    }
    if (t->kind == TK_NAME && (t->text[0] == '%' || is_register(p, t))) {
        next(p);
        *v = (value){.kind = V_REGISTER};
        return register_slot(p, t, &v->slot);
    }
    return parse_immediate(p, v);
}

/* [base], [base+offset], [offset]: base a register or a symbol. */
static bool parse_address(parser *p, operand *o)
{
    o->kind = O_ADDRESS;
    o->base = SLOT_SINK;
    token *t = peek(p);
    if (t->kind == TK_NAME) {
        next(p);
        int index = 0;
        bool reg = t->text[0] == '%' || is_register(p, t);
        const struct name *n = reg ? NULL : find_name(p, t->text, t->len, &index);
        if (reg) {
            if (!register_slot(p, t, &o->base))
                return false;
        } else if (!n || n->kind != NAME_SYMBOL) {
            return fail(p, t->line, "unknown symbol %.*s", t->len, t->text);
        } else {
            o->base = n->slot;
        }
        if (is_punct(peek(p), '+'))
            next(p);
        else if (!is_punct(peek(p), '-'))
            return expect(p, ']');
    }
    value v;
    if (!parse_immediate(p, &v) || v.float_bits)
        return fail(p, t->line, "bad address offset");
    o->offset = (int64_t)v.bits;
    return expect(p, ']');
}

static bool parse_operand(parser *p, operand *o)
{
    token *t = peek(p);
    *o = (operand){.kind = O_VALUE, .line = t->line};
    if (is_punct(t, '[')) {
        next(p);
        return parse_address(p, o);
    }
    if (is_punct(t, '{')) {
        next(p);
        o->kind = O_VECTOR;
        do {
            if (o->n_elems == 4)
                return fail(p, t->line, "a vector of more than 4");
            if (!parse_value(p, &o->elems[o->n_elems++]))
                return false;
        } while (is_punct(peek(p), ',') && next(p));
        return expect(p, '}');
    }
    if (is_punct(t, '!')) {
        next(p);
        o->negated = true;
        t = peek(p);
    }
    if (t->kind == TK_NAME && t->text[0] != '%' && !is_word(t, "_") && !is_register(p, t)) {
        next(p);
        o->kind = O_NAME;
        o->name = t->text;
        o->len = t->len;
        return true;
    }
    if (!parse_value(p, &o->v))
        return false;
    if (is_punct(peek(p), '|')) {
        next(p);
        o->kind = O_PAIR;
        return parse_value(p, &o->second);
    }
    return true;
}

/* -- Parsing: opcodes ------------------------------------------------------- */

/* An opcode's name taken apart: ld.global.nc.v4.f32 is ld with a space, nc,
 * a vector length and a type. */
typedef struct {
    char base[16];
    int types[3], n_types;
    int rounding, compare, bool_op, space, vec, shfl_mode, vote_mode, atom_op, testp;
    bool ftz, sat, approx, full, cc, uni, nc, wide, hi, lo, to, sync, left, right, clamp, wrap;
    int line;
} mnemonic;

static int lookup(const char *part, int len, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if ((int)strlen(names[i]) == len && !memcmp(part, names[i], (size_t)len))
            return i;
    return -1;
}

#define LOOKUP(part, len, names) lookup(part, len, names, (int)(sizeof names / sizeof *names))

static bool is_base(const mnemonic *mn, const char *name) { return !strcmp(mn->base, name); }

/* Takes one modifier of mn; false for one it does not know. */
static bool modifier(mnemonic *mn, const char *part, int len)
{
    static const char *const roundings[] = {"", "rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"};
    static const char *const spaces[] = {"", "global", "shared", "local", "param", "const"};
    static const char *const bool_ops[] = {"", "and", "or", "xor"};
    static const char *const shfl_modes[] = {"up", "down", "bfly", "idx"};
    static const char *const vote_modes[] = {"all", "any", "uni", "ballot"};
    static const char *const atom_ops[] = {"", "add", "min", "max", "exch", "cas", "and", "or", "xor", "inc", "dec"};
    static const char *const testps[] = {"finite", "infinite", "number", "notanumber", "normal", "subnormal"};
    static const char *const ignored[] = {"volatile", "relaxed", "acquire", "release", "acq_rel", "weak", "cta",
                                          "gpu", "sys", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "aligned"};
    int i;
    bool comparing = is_base(mn, "setp"), atomic = is_base(mn, "atom") || is_base(mn, "red");
    bool memory = atomic || is_base(mn, "ld") || is_base(mn, "st") || is_base(mn, "ldu") || is_base(mn, "fence") ||
                  is_base(mn, "membar") || is_base(mn, "bar") || is_base(mn, "barrier");
    if ((i = LOOKUP(part, len, type_names)) > 0 && mn->n_types < 3)
        mn->types[mn->n_types++] = i;
    else if (comparing && (i = LOOKUP(part, len, compare_names)) >= 0 && mn->compare == CMP_NONE)
        mn->compare = i;
    else if (comparing && (i = LOOKUP(part, len, bool_ops)) > 0)
        mn->bool_op = i;
    else if (atomic && (i = LOOKUP(part, len, atom_ops)) > 0)
        mn->atom_op = i;
    else if (is_base(mn, "shfl") && (i = LOOKUP(part, len, shfl_modes)) >= 0)
        mn->shfl_mode = i;
    else if (is_base(mn, "vote") && (i = LOOKUP(part, len, vote_modes)) >= 0)
        mn->vote_mode = i;
    else if (is_base(mn, "testp") && (i = LOOKUP(part, len, testps)) >= 0)
        mn->testp = i;
    else if ((i = LOOKUP(part, len, roundings)) > 0)
        mn->rounding = i;
    else if ((i = LOOKUP(part, len, spaces)) > 0)
        mn->space = i;
    else if (len == 2 && part[0] == 'v' && (part[1] == '2' || part[1] == '4'))
        mn->vec = part[1] - '0';
    else if (memory && LOOKUP(part, len, ignored) >= 0)
        return true;
    else {
#define FLAG(name)                                                                                                 \
    if (len == (int)strlen(#name) && !memcmp(part, #name, (size_t)len)) {                                          \
        mn->name = true;                                                                                           \
        return true;                                                                                               \
    }
        FLAG(ftz) FLAG(sat) FLAG(approx) FLAG(full) FLAG(cc) FLAG(uni) FLAG(nc) FLAG(wide) FLAG(hi) FLAG(lo)
        FLAG(to) FLAG(sync) FLAG(clamp) FLAG(wrap)
#undef FLAG
        if (len == 1 && (part[0] == 'l' || part[0] == 'r') && is_base(mn, "shf")) {
            mn->left = part[0] == 'l';
            mn->right = part[0] == 'r';
            return true;
        }
        return false;
    }
    return true;
}

static bool parse_mnemonic(parser *p, const token *t, mnemonic *mn)
{
    *mn = (mnemonic){.compare = CMP_NONE, .vec = 1, .line = t->line};
    const char *s = t->text, *end = t->text + t->len;
    const char *dot = memchr(s, '.', (size_t)t->len);
    int base_len = (int)((dot ? dot : end) - s);
    if (base_len >= (int)sizeof mn->base)
        return fail(p, t->line, "unknown instruction %.*s", t->len, t->text);
    memcpy(mn->base, s, (size_t)base_len);
    for (const char *part = dot; part && part < end;) {
        part++;
        const char *stop = memchr(part, '.', (size_t)(end - part));
        int len = (int)((stop ? stop : end) - part);
        if (!modifier(mn, part, len))
            return fail(p, t->line, "unknown modifier .%.*s in %.*s", len, part, t->len, t->text);
        part = stop;
    }
    return true;
}

/* -- Parsing: instructions -------------------------------------------------- */

static bool emit(parser *p, const insn *in, int line)
{
    ptx_module *m = p->m;
    int cap = m->code_cap;
    if (!grow(&m->code, &m->code_cap, m->n_code + 1, sizeof(insn)) ||
        !grow(&m->lines, &cap, m->n_code + 1, sizeof(int)))
        return fail(p, line, "out of memory");
    m->code[m->n_code] = *in;
    m->lines[m->n_code++] = line;
    return true;
}

/* An immediate's bits as an operand of type t. */
static uint64_t immediate_bits(const value *v, int t)
{
    if (t == T_F32)
        return v->float_bits == 64 ? f32_bits((float)f64_of(v->bits))
             : v->float_bits == 32 ? v->bits
                                   : f32_bits((float)(int64_t)v->bits);
    if (t == T_F64)
        return v->float_bits == 32 ? f64_bits((double)f32_of(v->bits))
             : v->float_bits == 64 ? v->bits
                                   : f64_bits((double)(int64_t)v->bits);
    return v->bits;
}

static bool value_slot(parser *p, const value *v, int t, int line, uint16_t *slot)
{
    if (v->kind == V_SINK)
        return fail(p, line, "_ is no source");
    *slot = v->kind == V_REGISTER ? v->slot : constant_slot(p, line, immediate_bits(v, t));
    return !p->failed;
}

/* A source operand of type t: a register or an immediate. */
static bool source(parser *p, const operand *o, int t, uint16_t *slot)
{
    if (o->kind != O_VALUE || o->negated)
        return fail(p, o->line, "expected a register or an immediate");
    return value_slot(p, &o->v, t, o->line, slot);
}

/* A predicate source that may be negated: !%p. */
static bool predicate_source(parser *p, const operand *o, uint16_t *slot, bool *negated)
{
    if (o->kind != O_VALUE)
        return fail(p, o->line, "expected a predicate");
    *negated = o->negated;
    return value_slot(p, &o->v, T_PRED, o->line, slot);
}

static bool destination(parser *p, const operand *o, uint16_t *slot)
{
    if (o->kind != O_VALUE || o->negated || o->v.kind == V_IMMEDIATE)
        return fail(p, o->line, "expected a destination register");
    *slot = o->v.slot;
    return true;
}

/* Sources ops[from..from+n) into in->o[to..]. */
static bool sources(parser *p, const operand *ops, int from, int n, int t, insn *in, int to)
{
    for (int i = 0; i < n; i++)
        if (!source(p, &ops[from + i], t, &in->o[to + i]))
            return false;
    return true;
}

static bool count_is(parser *p, const mnemonic *mn, int n, int want)
{
    return n == want || fail(p, mn->line, "%s takes %d operands, not %d", mn->base, want, n);
}

static int the_type(const mnemonic *mn) { return mn->n_types ? mn->types[0] : T_NONE; }

/* d, a, b... with every source of the instruction's type. */
static bool simple(parser *p, const mnemonic *mn, const operand *ops, int n, int want, insn *in)
{
    return count_is(p, mn, n, want) && destination(p, &ops[0], &in->o[0]) &&
           sources(p, ops, 1, want - 1, the_type(mn), in, 1);
}

static bool known_type(parser *p, const mnemonic *mn, bool ok)
{
    return ok || fail(p, mn->line, "%s does not take .%s here", mn->base, type_names[the_type(mn)]);
}

static uint8_t float_mode(const mnemonic *mn)
{
    return (uint8_t)((mn->rounding == RND_RN ? RND_NONE : mn->rounding) | (mn->ftz ? MODE_FTZ : 0) |
                     (mn->sat ? MODE_SAT : 0) | (mn->approx || mn->full ? MODE_APPROX : 0));
}

/* A float instruction: add, sub, mul and fma rounding to nearest with
 * nothing else to apply have opcodes of their own, run inline (f32's, then
 * f64's); the rest is FMATH, which applies the modes. */
static bool float_insn(parser *p, const mnemonic *mn, const operand *ops, int n, int want, int fop, insn *in)
{
    int t = the_type(mn);
    if (!known_type(p, mn, type_float(t)) || !simple(p, mn, ops, n, want, in))
        return false;
    static const int inlined[] = {OP_FADD32, OP_FSUB32, OP_FMUL32, OP_FFMA32};
    bool f64 = t == T_F64;
    bool plain = fop <= F_FMA && float_mode(mn) == 0;
    in->op = (uint16_t)(plain ? inlined[fop] + (f64 ? OP_FADD64 - OP_FADD32 : 0) : f64 ? OP_FMATH64 : OP_FMATH32);
    in->aux = (uint8_t)fop;
    in->mode = float_mode(mn);
    return true;
}

/* Integer opcodes that come signed and unsigned, the signed one first. */
static bool int_insn(parser *p, const mnemonic *mn, const operand *ops, int n, int want, int signed_op, insn *in)
{
    int t = the_type(mn);
    if (!known_type(p, mn, type_integer(t) && type_bits(t) >= 16) || !simple(p, mn, ops, n, want, in))
        return false;
    in->op = (uint16_t)(signed_op + !type_signed(t));
    in->aux = (uint8_t)type_bits(t);
    return true;
}

static bool build_carry(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    bool mad = is_base(mn, "mad") || is_base(mn, "madc");
    if (!known_type(p, mn, type_integer(t) && type_bits(t) >= 32) || !simple(p, mn, ops, n, mad ? 4 : 3, in))
        return false;
    in->op = OP_CARRY;
    in->aux = (uint8_t)type_bits(t);
    in->mode = (uint8_t)((mn->cc ? CARRY_OUT : 0) | (mn->base[strlen(mn->base) - 1] == 'c' ? CARRY_IN : 0) |
                         (mn->base[0] == 's' ? CARRY_SUBTRACT : 0) |
                         (mad ? (mn->hi ? CARRY_MUL_HI : CARRY_MUL_LO) : 0));
    return true;
}

static bool build_arith(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    const char *b = mn->base;
    if (mn->cc || !strcmp(b, "addc") || !strcmp(b, "subc") || !strcmp(b, "madc"))
        return build_carry(p, mn, ops, n, in);
    static const struct {
        const char *name;
        int fop, arity;
    } floats[] = {{"add", F_ADD, 3}, {"sub", F_SUB, 3}, {"mul", F_MUL, 3}, {"fma", F_FMA, 4}, {"mad", F_FMA, 4},
                  {"min", F_MIN, 3}, {"max", F_MAX, 3}, {"abs", F_ABS, 2}, {"neg", F_NEG, 2}, {"div", F_DIV, 3},
                  {"sqrt", F_SQRT, 2}, {"rcp", F_RCP, 2}, {"rsqrt", F_RSQRT, 2}, {"ex2", F_EX2, 2},
                  {"lg2", F_LG2, 2}, {"sin", F_SIN, 2}, {"cos", F_COS, 2}, {"tanh", F_TANH, 2},
                  {"copysign", F_COPYSIGN, 3}};
    if (type_float(t) || !strcmp(b, "fma") || !strcmp(b, "sqrt") || !strcmp(b, "rcp") || !strcmp(b, "rsqrt") ||
        !strcmp(b, "ex2") || !strcmp(b, "lg2") || !strcmp(b, "sin") || !strcmp(b, "cos") || !strcmp(b, "tanh") ||
        !strcmp(b, "copysign")) {
        for (size_t i = 0; i < sizeof floats / sizeof *floats; i++)
            if (!strcmp(b, floats[i].name))
                return float_insn(p, mn, ops, n, floats[i].arity, floats[i].fop, in);
    }
    if (mn->sat || mn->rounding || mn->ftz)
        return fail(p, mn->line, "%s.%s takes no rounding or saturation", b, type_names[t]);
    bool wide = mn->wide, hi = mn->hi;
    if (!strcmp(b, "add") || !strcmp(b, "sub") || !strcmp(b, "neg") || (!strcmp(b, "mul") && mn->lo) ||
        (!strcmp(b, "mad") && mn->lo)) {
        if (!known_type(p, mn, type_integer(t) && type_bits(t) >= 16) ||
            !simple(p, mn, ops, n, b[0] == 'm' && b[1] == 'a' ? 4 : b[0] == 'n' ? 2 : 3, in))
            return false;
        in->op = b[0] == 'a'   ? OP_ADD
               : b[0] == 's' ? OP_SUB
               : b[0] == 'n' ? OP_NEG
               : b[1] == 'u' ? OP_MUL_LO
                             : OP_MAD_LO;
        return true;
    }
    if (!strcmp(b, "mul") && (hi || wide))
        return int_insn(p, mn, ops, n, 3, hi ? OP_MUL_HI_S : OP_MUL_WIDE_S, in);
    if (!strcmp(b, "mad") && (hi || wide))
        return int_insn(p, mn, ops, n, 4, hi ? OP_MAD_HI_S : OP_MAD_WIDE_S, in);
    if (!strcmp(b, "mul24") && !hi)
        return int_insn(p, mn, ops, n, 3, OP_MUL24_S, in);
    if (!strcmp(b, "abs")) /* signed only, so int_insn's opcode is OP_ABS */
        return known_type(p, mn, type_signed(t)) && int_insn(p, mn, ops, n, 2, OP_ABS, in);
    static const struct {
        const char *name;
        int op, arity;
    } ints[] = {{"div", OP_DIV_S, 3}, {"rem", OP_REM_S, 3}, {"min", OP_MIN_S, 3}, {"max", OP_MAX_S, 3},
                {"shr", OP_SHR_S, 3}, {"bfe", OP_BFE_S, 4}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!strcmp(b, ints[i].name))
            return int_insn(p, mn, ops, n, ints[i].arity, ints[i].op, in);
    return fail(p, mn->line, "unknown instruction %s", b);
}

static bool build_bits(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    const char *b = mn->base;
    static const struct {
        const char *name;
        int op, arity;
    } table[] = {{"and", OP_AND, 3}, {"or", OP_OR, 3},     {"xor", OP_XOR, 3},   {"not", OP_NOT, 2},
                 {"cnot", OP_CNOT, 2}, {"shl", OP_SHL, 3}, {"popc", OP_POPC, 2}, {"clz", OP_CLZ, 2},
                 {"brev", OP_BREV, 2}, {"bfi", OP_BFI, 5}, {"prmt", OP_PRMT, 4}, {"shf", OP_SHF, 4},
                 {"lop3", OP_LOP3, 5}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(b, table[i].name))
            continue;
        bool logic = table[i].op <= OP_NOT;
        if (!known_type(p, mn, (t == T_PRED && logic) || (type_integer(t) && type_bits(t) >= 16)))
            return false;
        int arity = table[i].arity;
        if (table[i].op == OP_LOP3) {
            /* The truth table is an immediate: lop3.b32 d, a, b, c, lut. */
            if (!count_is(p, mn, n, 5) || ops[4].kind != O_VALUE || ops[4].v.kind != V_IMMEDIATE)
                return fail(p, mn->line, "lop3 takes 4 operands and a truth table");
            in->imm = (int64_t)(ops[4].v.bits & 0xff);
            arity = 4;
            n = 4;
        }
        if (table[i].op == OP_SHF && mn->left == mn->right)
            return fail(p, mn->line, "shf needs .l or .r");
        if (!simple(p, mn, ops, n, arity, in))
            return false;
        in->op = (uint16_t)table[i].op;
        in->aux = (uint8_t)type_bits(t);
        in->mode = (uint8_t)(mn->left | (mn->clamp << 1));
        return true;
    }
    if (!strcmp(b, "dp2a") || !strcmp(b, "dp4a")) {
        if (mn->n_types != 2 || !type_integer(mn->types[0]) || !type_integer(mn->types[1]) ||
            !simple(p, mn, ops, n, 4, in))
            return fail(p, mn->line, "%s takes two 32-bit types and 4 operands", b);
        in->op = b[2] == '2' ? OP_DP2A : OP_DP4A;
        in->mode = (uint8_t)(type_signed(mn->types[0]) | type_signed(mn->types[1]) << 1 | mn->hi << 2);
        return true;
    }
    return fail(p, mn->line, "unknown instruction %s", b);
}

static bool build_compare(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    if (is_base(mn, "selp")) {
        bool negated = false;
        if (!count_is(p, mn, n, 4) || !destination(p, &ops[0], &in->o[0]) || !sources(p, ops, 1, 2, t, in, 1) ||
            !predicate_source(p, &ops[3], &in->o[3], &negated))
            return false;
        in->op = OP_SELP;
        in->flags |= negated ? FLAG_C_NEGATED : 0;
        return true;
    }
    if (is_base(mn, "slct")) {
        if (mn->n_types != 2 || (mn->types[1] != T_S32 && mn->types[1] != T_F32) || !count_is(p, mn, n, 4) ||
            !destination(p, &ops[0], &in->o[0]) || !sources(p, ops, 1, 2, t, in, 1) ||
            !source(p, &ops[3], mn->types[1], &in->o[3]))
            return fail(p, mn->line, "slct takes a type and .s32 or .f32, and 4 operands");
        in->op = mn->types[1] == T_S32 ? OP_SLCT_S32 : OP_SLCT_F32;
        in->mode = mn->ftz ? MODE_FTZ : 0;
        return true;
    }
    if (is_base(mn, "testp")) {
        if (!known_type(p, mn, type_float(t)) || !count_is(p, mn, n, 2) || !destination(p, &ops[0], &in->o[0]) ||
            !source(p, &ops[1], t, &in->o[1]))
            return false;
        in->op = OP_TESTP;
        in->mode = (uint8_t)mn->testp;
        in->aux = (uint8_t)type_bits(t);
        return true;
    }
    /* setp.cmp[.bool].type p[|q], a, b[, [!]c] */
    if (mn->compare == CMP_NONE || (n != 3 + (mn->bool_op != BOOL_NONE)))
        return fail(p, mn->line, "setp needs a comparison, and a predicate to combine exactly when combining");
    if (ops[0].kind == O_PAIR) {
        in->o[0] = ops[0].v.slot;
        in->o[1] = ops[0].second.slot;
    } else if (!destination(p, &ops[0], &in->o[0])) {
        return false;
    } else {
        in->o[1] = SLOT_SINK;
    }
    bool negated = false;
    in->o[4] = SLOT_TRUE;
    if (!sources(p, ops, 1, 2, t, in, 2) || (n == 4 && !predicate_source(p, &ops[3], &in->o[4], &negated)))
        return false;
    in->flags |= negated ? FLAG_C_NEGATED : 0;
    in->mode = (uint8_t)mn->compare;
    in->aux2 = (uint8_t)mn->bool_op;
    bool unsigned_compare = mn->compare >= CMP_LO && mn->compare <= CMP_HS;
    if (type_float(t)) {
        if (unsigned_compare)
            return fail(p, mn->line, "setp.%s on a float", compare_names[mn->compare]);
        in->op = t == T_F32 ? OP_SETP_F32 : OP_SETP_F64;
        in->aux = mn->ftz;
        return true;
    }
    if (!known_type(p, mn, type_integer(t) && type_bits(t) >= 16 && mn->compare < CMP_EQU &&
                               !(type_signed(t) && unsigned_compare)))
        return false;
    in->op = type_signed(t) ? OP_SETP_S : OP_SETP_U;
    in->aux = (uint8_t)type_bits(t);
    return true;
}

static bool build_cvt(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    if (mn->n_types != 2 || mn->types[0] == T_PRED || mn->types[1] == T_PRED)
        return fail(p, mn->line, "cvt takes two types");
    int to = mn->types[0], from = mn->types[1];
    if (!count_is(p, mn, n, 2) || !destination(p, &ops[0], &in->o[0]) || !source(p, &ops[1], from, &in->o[1]))
        return false;
    if (type_integer(to) && type_integer(from) && !mn->sat) {
        if (mn->rounding)
            return fail(p, mn->line, "cvt between integers takes no rounding");
        in->op = type_bits(to) <= type_bits(from) ? OP_MOV : type_signed(from) ? OP_SEXT : OP_ZEXT;
        in->aux = (uint8_t)type_bits(from);
        return true;
    }
    bool to_int = type_integer(to), from_int = type_integer(from);
    bool integral = mn->rounding >= RND_RNI;
    if ((to_int && !from_int && !integral) || (from_int && !to_int && integral) ||
        (!to_int && !from_int && to == T_F64 && from == T_F32 && mn->rounding && !integral))
        return fail(p, mn->line, "cvt.%s.%s does not take that rounding", type_names[to], type_names[from]);
    in->op = OP_CVT;
    in->aux = (uint8_t)to;
    in->aux2 = (uint8_t)from;
    in->mode = (uint8_t)(mn->rounding | (mn->ftz ? MODE_FTZ : 0) | (mn->sat ? MODE_SAT : 0));
    return true;
}

/* ld, ldu, st: [space][.nc][.vN].type, a register or vector and an address. */
static bool build_memory(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    bool store = is_base(mn, "st");
    if (!known_type(p, mn, t != T_PRED && t != T_NONE) || !count_is(p, mn, n, 2))
        return false;
    const operand *addr = &ops[store ? 0 : 1], *data = &ops[store ? 1 : 0];
    if (addr->kind != O_ADDRESS)
        return fail(p, mn->line, "%s needs an address", mn->base);
    int count = data->kind == O_VECTOR ? data->n_elems : 1;
    if (count != mn->vec)
        return fail(p, mn->line, "%s.v%d needs %d registers", mn->base, mn->vec, mn->vec);
    for (int i = 0; i < count; i++) {
        const value *v = data->kind == O_VECTOR ? &data->elems[i] : &data->v;
        if (data->kind != O_VECTOR && data->kind != O_VALUE)
            return fail(p, mn->line, "%s needs a register", mn->base);
        if (store && !value_slot(p, v, t, mn->line, &in->o[i]))
            return false;
        if (!store && v->kind == V_IMMEDIATE)
            return fail(p, mn->line, "ld into an immediate");
        if (!store)
            in->o[i] = v->slot;
    }
    static const int loads[] = {OP_LD_GENERIC, OP_LD_GLOBAL, OP_LD_SHARED, OP_LD_LOCAL, OP_LD_PARAM, OP_LD_GLOBAL};
    in->op = (uint16_t)(loads[mn->space] + (store ? OP_ST_GLOBAL - OP_LD_GLOBAL : 0));
    if (store && mn->space == SPACE_CONST)
        return fail(p, mn->line, "st.const");
    in->aux = (uint8_t)(type_bits(t) / 8);
    in->aux2 = (uint8_t)count;
    in->mode = type_signed(t);
    in->o[4] = addr->base;
    in->imm = addr->offset;
    return true;
}

static bool build_mov(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    if (!known_type(p, mn, t != T_NONE) || !count_is(p, mn, n, 2))
        return false;
    const operand *d = &ops[0], *a = &ops[1];
    if (d->kind == O_VECTOR || a->kind == O_VECTOR) {
        const operand *v = d->kind == O_VECTOR ? d : a;
        if (v->n_elems < 2 || type_bits(t) % v->n_elems)
            return fail(p, mn->line, "mov.%s of %d parts", type_names[t], v->n_elems);
        in->aux = (uint8_t)(type_bits(t) / v->n_elems);
        in->aux2 = (uint8_t)v->n_elems;
        in->op = d->kind == O_VECTOR ? OP_UNPACK : OP_PACK;
        if (d->kind == O_VECTOR) {
            for (int i = 0; i < v->n_elems; i++) {
                if (v->elems[i].kind == V_IMMEDIATE)
                    return fail(p, mn->line, "mov into an immediate");
                in->o[i] = v->elems[i].slot;
            }
            return source(p, a, t, &in->o[4]);
        }
        for (int i = 0; i < v->n_elems; i++)
            if (!value_slot(p, &v->elems[i], T_NONE, mn->line, &in->o[1 + i]))
                return false;
        return destination(p, d, &in->o[0]);
    }
    in->op = OP_MOV;
    if (a->kind == O_NAME) {
        int index = 0;
        const struct name *sym = find_name(p, a->name, a->len, &index);
        if (!sym || sym->kind != NAME_SYMBOL)
            return fail(p, mn->line, "mov of %.*s, which is no variable", a->len, a->name);
        in->o[1] = sym->slot;
        return destination(p, d, &in->o[0]);
    }
    return destination(p, d, &in->o[0]) && source(p, a, t, &in->o[1]);
}

static bool build_cvta(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    if (the_type(mn) != T_U64 || !count_is(p, mn, n, 2) || !destination(p, &ops[0], &in->o[0]))
        return fail(p, mn->line, "cvta takes .u64 and 2 operands");
    if (ops[1].kind == O_NAME) {
        int index = 0;
        const struct name *sym = find_name(p, ops[1].name, ops[1].len, &index);
        if (!sym || sym->kind != NAME_SYMBOL)
            return fail(p, mn->line, "cvta of %.*s, which is no variable", ops[1].len, ops[1].name);
        in->o[1] = sym->slot;
    } else if (!source(p, &ops[1], T_U64, &in->o[1])) {
        return false;
    }
    bool window = mn->space == SPACE_SHARED || mn->space == SPACE_LOCAL;
    in->op = !window ? OP_MOV : mn->to ? OP_TO_WINDOW : OP_FROM_WINDOW;
    in->aux = (uint8_t)mn->space;
    return true;
}

static bool build_warp(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    if (is_base(mn, "shfl")) {
        /* shfl.sync.mode.b32 d[|p], a, b, c, membermask */
        if (!mn->sync || the_type(mn) != T_B32 || !count_is(p, mn, n, 5))
            return fail(p, mn->line, "shfl takes .sync, .b32 and 5 operands");
        if (ops[0].kind == O_PAIR) {
            in->o[0] = ops[0].v.slot;
            in->o[1] = ops[0].second.slot;
        } else if (!destination(p, &ops[0], &in->o[0])) {
            return false;
        } else {
            in->o[1] = SLOT_SINK;
        }
        in->op = OP_SHFL;
        in->mode = (uint8_t)mn->shfl_mode;
        return sources(p, ops, 1, 4, T_B32, in, 2);
    }
    if (is_base(mn, "vote")) {
        bool negated = false;
        bool ballot = mn->vote_mode == VOTE_BALLOT;
        if (!mn->sync || the_type(mn) != (ballot ? T_B32 : T_PRED) || !count_is(p, mn, n, 3) ||
            !destination(p, &ops[0], &in->o[0]) || !predicate_source(p, &ops[1], &in->o[1], &negated) ||
            !source(p, &ops[2], T_B32, &in->o[2]))
            return fail(p, mn->line, "vote takes .sync, a mode, its type and 3 operands");
        in->op = OP_VOTE;
        in->mode = (uint8_t)mn->vote_mode;
        in->flags |= negated ? FLAG_C_NEGATED : 0;
        return true;
    }
    if (is_base(mn, "activemask")) {
        in->op = OP_ACTIVEMASK;
        return count_is(p, mn, n, 1) && destination(p, &ops[0], &in->o[0]);
    }
    /* bar.sync 0 / barrier.sync[.aligned] 0: the whole block, barrier 0 */
    if (!mn->sync || !count_is(p, mn, n, 1) || ops[0].kind != O_VALUE || ops[0].v.kind != V_IMMEDIATE ||
        ops[0].v.bits != 0)
        return fail(p, mn->line, "only bar.sync 0 is supported");
    in->op = OP_BAR;
    return true;
}

static bool build_atomic(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    int t = the_type(mn);
    bool red = is_base(mn, "red");
    int want = (red ? 2 : 3) + (mn->atom_op == ATOM_CAS);
    if (mn->atom_op == ATOM_NONE || !known_type(p, mn, t != T_PRED && type_bits(t) >= 32) ||
        !count_is(p, mn, n, want) || ops[red ? 0 : 1].kind != O_ADDRESS)
        return fail(p, mn->line, "%s needs an operation, a 32- or 64-bit type and an address", mn->base);
    if (mn->space != SPACE_GLOBAL && mn->space != SPACE_SHARED && mn->space != SPACE_GENERIC)
        return fail(p, mn->line, "%s in that state space", mn->base);
    in->op = OP_ATOM;
    in->mode = (uint8_t)mn->atom_op;
    in->aux = (uint8_t)t;
    in->aux2 = (uint8_t)mn->space;
    in->o[0] = SLOT_SINK;
    if (!red && !destination(p, &ops[0], &in->o[0]))
        return false;
    in->o[1] = ops[red ? 0 : 1].base;
    in->imm = ops[red ? 0 : 1].offset;
    return sources(p, ops, red ? 1 : 2, want - (red ? 1 : 2), t, in, 2);
}

static bool add_fixup(parser *p, const operand *o, int at)
{
    if (o->kind != O_NAME)
        return fail(p, o->line, "expected a label");
    if (!grow(&p->fixups, &p->fixups_cap, p->n_fixups + 1, sizeof(struct label)))
        return fail(p, o->line, "out of memory");
    p->fixups[p->n_fixups++] = (struct label){.text = o->name, .len = o->len, .at = at, .line = o->line};
    return true;
}

/* Builds one instruction from its opcode and operands, and emits it. */
static bool build(parser *p, const mnemonic *mn, const operand *ops, int n, insn *in)
{
    const char *b = mn->base;
    bool ok;
    if (!strcmp(b, "mov"))
        ok = build_mov(p, mn, ops, n, in);
    else if (!strcmp(b, "ld") || !strcmp(b, "ldu") || !strcmp(b, "st"))
        ok = build_memory(p, mn, ops, n, in);
    else if (!strcmp(b, "cvta"))
        ok = build_cvta(p, mn, ops, n, in);
    else if (!strcmp(b, "cvt"))
        ok = build_cvt(p, mn, ops, n, in);
    else if (!strcmp(b, "setp") || !strcmp(b, "selp") || !strcmp(b, "slct") || !strcmp(b, "testp"))
        ok = build_compare(p, mn, ops, n, in);
    else if (!strcmp(b, "and") || !strcmp(b, "or") || !strcmp(b, "xor") || !strcmp(b, "not") ||
             !strcmp(b, "cnot") || !strcmp(b, "shl") || !strcmp(b, "popc") || !strcmp(b, "clz") ||
             !strcmp(b, "brev") || !strcmp(b, "bfi") || !strcmp(b, "prmt") || !strcmp(b, "shf") ||
             !strcmp(b, "lop3") || !strcmp(b, "dp2a") || !strcmp(b, "dp4a"))
        ok = build_bits(p, mn, ops, n, in);
    else if (!strcmp(b, "shfl") || !strcmp(b, "vote") || !strcmp(b, "activemask") || !strcmp(b, "bar") ||
             !strcmp(b, "barrier"))
        ok = build_warp(p, mn, ops, n, in);
    else if (!strcmp(b, "atom") || !strcmp(b, "red"))
        ok = build_atomic(p, mn, ops, n, in);
    else if (!strcmp(b, "membar") || !strcmp(b, "fence")) {
        in->op = OP_NOP;
        ok = true;
    } else if (!strcmp(b, "bra")) {
        in->op = OP_BRA;
        ok = count_is(p, mn, n, 1) && add_fixup(p, &ops[0], p->m->n_code);
    } else if (!strcmp(b, "ret") || !strcmp(b, "exit")) {
        in->op = b[0] == 'r' ? OP_RET : OP_EXIT;
        ok = count_is(p, mn, n, 0);
    } else {
        ok = build_arith(p, mn, ops, n, in);
    }
    return ok && emit(p, in, mn->line);
}

/* -- Parsing: declarations and functions ------------------------------------ */

static size_t align_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

static void skip_line(parser *p)
{
    int line = peek(p)->line;
    while (peek(p)->kind != TK_END && peek(p)->line == line)
        next(p);
}

static void skip_statement(parser *p)
{
    while (peek(p)->kind != TK_END && !is_punct(next(p), ';'))
        ;
}

/* [.align N] .type — a declaration's alignment and element type. */
static bool parse_storage(parser *p, size_t *align, int *type)
{
    *align = 0;
    if (is_word(peek(p), ".align")) {
        next(p);
        uint64_t a;
        if (!expect_int(p, &a) || a == 0 || (a & (a - 1)))
            return fail(p, peek(p)->line, "bad .align");
        *align = (size_t)a;
    }
    token *t = next(p);
    *type = t->kind == TK_NAME && t->text[0] == '.' ? lookup(t->text + 1, t->len - 1, type_names, T_PRED + 1) : -1;
    if (*type <= 0)
        return fail(p, t->line, "expected a type, found '%.*s'", t->len, t->text);
    if (!*align)
        *align = *type == T_PRED ? 1 : (size_t)type_bits(*type) / 8;
    return true;
}

/* name[N]...; the number of elements (0 for name[]). */
static bool parse_declarator(parser *p, token **name, size_t *count, bool *unsized)
{
    *name = next(p);
    if ((*name)->kind != TK_NAME)
        return fail(p, (*name)->line, "expected a name, found '%.*s'", (*name)->len, (*name)->text);
    *count = 1;
    *unsized = false;
    while (is_punct(peek(p), '[')) {
        next(p);
        if (is_punct(peek(p), ']')) {
            *unsized = true;
        } else {
            uint64_t n;
            if (!expect_int(p, &n))
                return false;
            *count *= (size_t)n;
        }
        if (!expect(p, ']'))
            return false;
    }
    return true;
}

/* = {v, v, ...} or = v, into data of elements of type t. */
static bool parse_initializer(parser *p, uint8_t *data, size_t count, int t)
{
    bool braced = is_punct(peek(p), '{');
    if (braced)
        next(p);
    size_t bytes = (size_t)type_bits(t) / 8;
    for (size_t i = 0;; i++) {
        value v;
        if (!parse_immediate(p, &v))
            return false;
        if (i >= count)
            return fail(p, peek(p)->line, "initializer longer than its variable");
        uint64_t bits = immediate_bits(&v, t);
        memcpy(data + i * bytes, &bits, bytes); /* little-endian, as the GPU */
        if (!braced || !is_punct(peek(p), ','))
            break;
        next(p);
    }
    return !braced || expect(p, '}');
}

/* A .global, .const, .shared, .local or (call-site) .param variable. */
static bool parse_variable(parser *p, int space, bool is_extern, uint16_t **dynamic, int *n_dynamic)
{
    ptx_module *m = p->m;
    size_t align, count;
    int t;
    token *name;
    bool unsized;
    if (!parse_storage(p, &align, &t) || !parse_declarator(p, &name, &count, &unsized))
        return false;
    size_t size = count * (t == T_PRED ? 1 : (size_t)type_bits(t) / 8);
    uint16_t slot;
    if (space == SPACE_GLOBAL || space == SPACE_CONST) {
        if (!grow(&m->globals, &m->globals_cap, m->n_globals + 1, sizeof(global_block)))
            return fail(p, name->line, "out of memory");
        uint8_t *data = calloc(1, size ? size : 1);
        if (!data)
            return fail(p, name->line, "out of memory");
        m->globals[m->n_globals++] = (global_block){.data = data, .size = size};
        if (is_punct(peek(p), '=') && (next(p), !parse_initializer(p, data, count, t)))
            return false;
        slot = new_preset(p, name->line, PRESET_VALUE, (uint64_t)(uintptr_t)data);
    } else if (space == SPACE_SHARED && (is_extern || unsized)) {
        slot = new_preset(p, name->line, PRESET_VALUE, 0);
        uint16_t *more = realloc(*dynamic, sizeof(uint16_t) * (size_t)(*n_dynamic + 1));
        if (!more)
            return fail(p, name->line, "out of memory");
        *dynamic = more;
        more[(*n_dynamic)++] = slot;
    } else if (space == SPACE_SHARED) {
        size_t at = align_up(m->shared_bytes, align);
        m->shared_bytes = at + size;
        m->shared_align = align > m->shared_align ? align : m->shared_align;
        slot = new_preset(p, name->line, PRESET_VALUE, at);
    } else if (space == SPACE_LOCAL) {
        size_t at = align_up(m->local_bytes, align);
        m->local_bytes = at + size;
        slot = new_preset(p, name->line, PRESET_VALUE, at);
    } else {
        size_t at = align_up(m->call_param_bytes, align);
        m->call_param_bytes = at + size;
        slot = new_preset(p, name->line, PRESET_THREAD_PARAM, at);
    }
    return !p->failed && add_name(p, name, NAME_SYMBOL, slot, 0) && expect(p, ';');
}

/* .reg .type %a<N>; or .reg .type %a, %b; */
static bool parse_registers(parser *p)
{
    size_t align;
    int t;
    if (!parse_storage(p, &align, &t))
        return false;
    do {
        token *name = next(p);
        if (name->kind != TK_NAME)
            return fail(p, name->line, "expected a register name, found '%.*s'", name->len, name->text);
        uint64_t count = 1;
        bool range = is_punct(peek(p), '<');
        if (range && (next(p), !expect_int(p, &count) || !expect(p, '>')))
            return false;
        uint16_t slot = new_register(p, name->line, (int)count);
        if (p->failed || !add_name(p, name, range ? NAME_REGISTER_RANGE : NAME_REGISTER, slot, (int)count))
            return false;
    } while (is_punct(peek(p), ',') && next(p));
    return expect(p, ';');
}

static int find_function(parser *p, const char *name, int len)
{
    for (int i = 0; i < p->m->n_functions; i++)
        if ((int)strlen(p->m->functions[i].name) == len && !memcmp(p->m->functions[i].name, name, (size_t)len))
            return i;
    return -1;
}

/* call[.uni] [(ret),] name[, (args)]; */
static bool parse_call(parser *p, const mnemonic *mn, insn *in)
{
    ptx_module *m = p->m;
    in->op = OP_CALL;
    in->o[0] = SLOT_SINK;
    in->o[1] = (uint16_t)m->n_call_args;
    if (is_punct(peek(p), '(')) {
        next(p);
        token *ret = next(p);
        int index = 0;
        const struct name *n = find_name(p, ret->text, ret->len, &index);
        if (!n || n->kind != NAME_SYMBOL || !expect(p, ')') || !expect(p, ','))
            return fail(p, ret->line, "a call returns into a .param variable");
        in->o[0] = n->slot;
    }
    token *callee = next(p);
    int f = callee->kind == TK_NAME ? find_function(p, callee->text, callee->len) : -1;
    if (f < 0)
        return fail(p, callee->line, "call of %.*s, which is no function declared before", callee->len, callee->text);
    in->imm = f;
    if (is_punct(peek(p), ',')) {
        next(p);
        if (!expect(p, '('))
            return false;
        while (!is_punct(peek(p), ')')) {
            token *arg = next(p);
            int index = 0;
            const struct name *n = find_name(p, arg->text, arg->len, &index);
            if (!n || n->kind != NAME_SYMBOL)
                return fail(p, arg->line, "a call's argument %.*s is no .param variable", arg->len, arg->text);
            if (!grow(&m->call_args, &m->call_args_cap, m->n_call_args + 1, sizeof(uint16_t)))
                return fail(p, arg->line, "out of memory");
            m->call_args[m->n_call_args++] = n->slot;
            in->o[2]++;
            if (is_punct(peek(p), ','))
                next(p);
        }
        next(p);
    }
    return expect(p, ';') && emit(p, in, mn->line);
}

/* [@[!]%p] opcode operands; */
static bool parse_instruction(parser *p)
{
    insn in = {.guard = SLOT_TRUE};
    if (is_punct(peek(p), '@')) {
        next(p);
        if (is_punct(peek(p), '!')) {
            next(p);
            in.flags |= FLAG_GUARD_NEGATED;
        }
        if (!register_slot(p, next(p), &in.guard))
            return false;
    }
    token *op = next(p);
    mnemonic mn;
    if (op->kind != TK_NAME || !parse_mnemonic(p, op, &mn))
        return fail(p, op->line, "expected an instruction, found '%.*s'", op->len, op->text);
    if (is_base(&mn, "call"))
        return parse_call(p, &mn, &in);
    operand ops[6];
    int n = 0;
    while (!is_punct(peek(p), ';')) {
        if (n == 6)
            return fail(p, op->line, "too many operands");
        if (!parse_operand(p, &ops[n++]))
            return false;
        if (!is_punct(peek(p), ';') && !expect(p, ','))
            return false;
    }
    next(p);
    return build(p, &mn, ops, n, &in);
}

static bool push_scope(parser *p, int line)
{
    if (p->depth == (int)(sizeof p->scopes / sizeof *p->scopes))
        return fail(p, line, "blocks nested too deep");
    p->scopes[p->depth++] = p->n_names;
    return true;
}

static void pop_scope(parser *p) { p->n_names = p->scopes[--p->depth]; }

static bool add_label(parser *p, token *t)
{
    if (!grow(&p->labels, &p->labels_cap, p->n_labels + 1, sizeof(struct label)))
        return fail(p, t->line, "out of memory");
    p->labels[p->n_labels++] = (struct label){.text = t->text, .len = t->len, .at = p->m->n_code, .line = t->line};
    return true;
}

/* A function's body after its '{', up to the matching '}'. */
static bool parse_body(parser *p, uint16_t **dynamic, int *n_dynamic)
{
    int depth = p->depth;
    while (!p->failed) {
        token *t = peek(p);
        if (t->kind == TK_END)
            return fail(p, t->line, "a function's body does not end");
        if (is_punct(t, '{')) {
            next(p);
            push_scope(p, t->line);
        } else if (is_punct(t, '}')) {
            next(p);
            if (p->depth == depth)
                return true;
            pop_scope(p);
        } else if (is_word(t, ".reg")) {
            next(p);
            parse_registers(p);
        } else if (is_word(t, ".local") || is_word(t, ".shared") || is_word(t, ".param")) {
            next(p);
            parse_variable(p, t->text[1] == 'l' ? SPACE_LOCAL : t->text[1] == 's' ? SPACE_SHARED : SPACE_PARAM,
                           false, dynamic, n_dynamic);
        } else if (is_word(t, ".pragma")) {
            skip_statement(p);
        } else if (is_word(t, ".loc") || is_word(t, ".file")) {
            skip_line(p);
        } else if (t->kind == TK_NAME && is_punct(&p->tokens[p->at + 1], ':')) {
            next(p);
            next(p);
            add_label(p, t);
        } else {
            parse_instruction(p);
        }
    }
    return false;
}

/* ( .param [.align N] .type name[[N]], ... ) into f's parameters. */
static bool parse_params(parser *p, struct ptx_kernel *f)
{
    if (!expect(p, '('))
        return false;
    free(f->params);
    f->params = NULL;
    f->n_params = 0;
    f->param_bytes = 0;
    int cap = 0;
    while (!is_punct(peek(p), ')')) {
        token *t = next(p);
        size_t align, count;
        int type;
        token *name;
        bool unsized;
        if (!is_word(t, ".param"))
            return fail(p, t->line, "expected .param, found '%.*s'", t->len, t->text);
        if (!parse_storage(p, &align, &type) || !parse_declarator(p, &name, &count, &unsized))
            return false;
        if (!grow(&f->params, &cap, f->n_params + 1, sizeof(param)))
            return fail(p, t->line, "out of memory");
        param *pa = &f->params[f->n_params++];
        pa->size = count * (size_t)type_bits(type) / 8;
        pa->align = align;
        pa->offset = align_up(f->param_bytes, align);
        pa->u64 = type == T_U64;
        f->param_bytes = pa->offset + pa->size;
        pa->slot = new_preset(p, name->line, f->entry ? PRESET_KERNEL_PARAM : PRESET_BOUND, pa->offset);
        if (p->failed || !add_name(p, name, NAME_SYMBOL, pa->slot, 0))
            return false;
        if (is_punct(peek(p), ','))
            next(p);
    }
    next(p);
    return true;
}

static bool resolve_labels(parser *p)
{
    for (int i = 0; i < p->n_fixups; i++) {
        const struct label *f = &p->fixups[i];
        int j = 0;
        while (j < p->n_labels && (p->labels[j].len != f->len || memcmp(p->labels[j].text, f->text, (size_t)f->len)))
            j++;
        if (j == p->n_labels)
            return fail(p, f->line, "no label %.*s", f->len, f->text);
        p->m->code[f->at].imm = p->labels[j].at;
    }
    p->n_labels = p->n_fixups = 0;
    return true;
}

/* .entry name (params) [directives] { body }, or .func [(ret)] name [(params)] followed by ';' or a body. */
static bool parse_function(parser *p, bool entry, uint16_t **dynamic, int *n_dynamic)
{
    ptx_module *m = p->m;
    int names = p->n_names;
    token *ret_name = NULL;
    size_t ret_align = 0, ret_count = 0;
    int ret_type = 0;
    bool unsized;
    if (!entry && is_punct(peek(p), '(')) {
        next(p);
        if (!is_word(next(p), ".param") || !parse_storage(p, &ret_align, &ret_type) ||
            !parse_declarator(p, &ret_name, &ret_count, &unsized) || !expect(p, ')'))
            return fail(p, peek(p)->line, "a function returns into one .param");
    }
    token *name = next(p);
    if (name->kind != TK_NAME)
        return fail(p, name->line, "expected a function's name");
    int f = find_function(p, name->text, name->len);
    if (f < 0) {
        if (!grow(&m->functions, &m->functions_cap, m->n_functions + 1, sizeof(struct ptx_kernel)))
            return fail(p, name->line, "out of memory");
        f = m->n_functions++;
        m->functions[f] = (struct ptx_kernel){.name = strndup(name->text, (size_t)name->len), .entry = entry,
                                              .line = name->line};
        if (!m->functions[f].name)
            return fail(p, name->line, "out of memory");
    }
    struct ptx_kernel *fn = &m->functions[f];
    if (fn->defined)
        return fail(p, name->line, "%s defined twice", fn->name);
    if (!push_scope(p, name->line))
        return false;
    fn->has_retval = ret_name != NULL;
    if (ret_name) {
        fn->retval_slot = new_preset(p, ret_name->line, PRESET_BOUND, 0);
        if (p->failed || !add_name(p, ret_name, NAME_SYMBOL, fn->retval_slot, 0))
            return false;
    }
    if (is_punct(peek(p), '(') && !parse_params(p, &m->functions[f]))
        return false;
    fn = &m->functions[f];
    while (is_word(peek(p), ".maxntid") || is_word(peek(p), ".reqntid") || is_word(peek(p), ".minnctapersm") ||
           is_word(peek(p), ".maxnreg") || is_word(peek(p), ".noreturn")) {
        next(p); /* performance directives: their numbers do not matter here */
        while (peek(p)->kind == TK_INT || is_punct(peek(p), ','))
            next(p);
    }
    if (is_punct(peek(p), ';')) {
        next(p);
        pop_scope(p);
        p->n_names = names;
        return true;
    }
    if (!expect(p, '{'))
        return false;
    fn->defined = true;
    fn->start = m->n_code;
    p->function = f;
    if (!parse_body(p, dynamic, n_dynamic) || !emit(p, &(insn){.op = OP_RET}, peek(p)->line) || !resolve_labels(p))
        return false;
    p->depth--;
    p->n_names = names;
    p->function = -1;
    return true;
}

static bool parse_module(parser *p, uint16_t **dynamic, int *n_dynamic)
{
    while (!p->failed && peek(p)->kind != TK_END) {
        token *t = next(p);
        if (is_word(t, ".version") || is_word(t, ".target") || is_word(t, ".address_size") || is_word(t, ".file")) {
            p->at--;
            skip_line(p);
            continue;
        }
        bool is_extern = false;
        while (is_word(t, ".visible") || is_word(t, ".weak") || is_word(t, ".extern")) {
            is_extern |= is_word(t, ".extern");
            t = next(p);
        }
        if (is_word(t, ".entry") || is_word(t, ".func"))
            parse_function(p, t->text[1] == 'e', dynamic, n_dynamic);
        else if (is_word(t, ".global") || is_word(t, ".const") || is_word(t, ".shared"))
            parse_variable(p, t->text[1] == 'g' ? SPACE_GLOBAL : t->text[1] == 'c' ? SPACE_CONST : SPACE_SHARED,
                           is_extern, dynamic, n_dynamic);
        else
            fail(p, t->line, "unexpected '%.*s'", t->len, t->text);
    }
    return !p->failed;
}

/* Checks what only the whole module tells: every call's callee and
 * arguments; then moves the register slots behind the presets. */
static bool finish(parser *p, const uint16_t *dynamic, int n_dynamic)
{
    ptx_module *m = p->m;
    m->shared_bytes = align_up(m->shared_bytes, 16);
    for (int i = 0; i < n_dynamic; i++)
        m->presets[dynamic[i]].value = m->shared_bytes;
    if (m->n_presets + m->n_registers > MAX_SLOTS)
        return fail(p, 0, "more than %d registers and constants", MAX_SLOTS);
    for (int i = 0; i < m->n_code; i++) {
        insn *in = &m->code[i];
        if (in->op == OP_CALL) {
            const struct ptx_kernel *f = &m->functions[in->imm];
            if (!f->defined || f->entry || f->n_params != in->o[2] || f->has_retval != (in->o[0] != SLOT_SINK))
                return fail(p, m->lines[i], "call of %s does not match its definition", f->name);
        }
        if (in->guard & REGISTER_BIT)
            in->guard = (uint16_t)(m->n_presets + (in->guard & ~REGISTER_BIT));
        for (int k = 0; k < 6; k++)
            if (in->o[k] & REGISTER_BIT && !(in->op == OP_CALL && k > 0))
                in->o[k] = (uint16_t)(m->n_presets + (in->o[k] & ~REGISTER_BIT));
    }
    return true;
}

ptx_module *ptx_parse(const char *text, char *err, size_t err_size)
{
    ptx_module *m = calloc(1, sizeof *m);
    parser p = {.m = m, .err = err, .err_size = err_size, .function = -1};
    uint16_t *dynamic = NULL;
    int n_dynamic = 0;
    if (!m || !(m->text = strdup(text))) {
        free(m);
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    p.text = m->text;
    m->shared_align = 16;
    m->n_presets = FIRST_FREE_SLOT;
    if (!grow(&m->presets, &m->presets_cap, FIRST_FREE_SLOT, sizeof(preset)))
        fail(&p, 0, "out of memory");
    else
        memset(m->presets, 0, sizeof(preset) * FIRST_FREE_SLOT);
    bool ok = !p.failed && lex(&p) && parse_module(&p, &dynamic, &n_dynamic) && finish(&p, dynamic, n_dynamic);
    free(p.tokens);
    free(p.names);
    free(p.labels);
    free(p.fixups);
    free(p.constant_values);
    free(p.constant_slots);
    free(dynamic);
    if (!ok) {
        ptx_free(m);
        return NULL;
    }
    return m;
}

void ptx_free(ptx_module *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_functions; i++) {
        free(m->functions[i].name);
        free(m->functions[i].params);
    }
    for (int i = 0; i < m->n_globals; i++)
        free(m->globals[i].data);
    scratch *s = &m->scratch;
    free(s->slots);
    free(s->shared);
    free(s->local);
    free(s->params);
    free(s->call_params);
    free(s->cache);
    free(s->memory);
    free(s->threads);
    free(m->functions);
    free(m->globals);
    free(m->call_args);
    free(m->presets);
    free(m->code);
    free(m->lines);
    free(m->text);
    free(m);
}

const ptx_kernel *ptx_kernel_find(const ptx_module *m, const char *name)
{
    for (int i = 0; i < m->n_functions; i++)
        if (m->functions[i].entry && m->functions[i].defined && !strcmp(m->functions[i].name, name))
            return &m->functions[i];
    return NULL;
}

const char *ptx_kernel_name(const ptx_kernel *k) { return k->name; }
int ptx_kernel_n_params(const ptx_kernel *k) { return k->n_params; }
bool ptx_kernel_param_is_u64(const ptx_kernel *k, int i) { return k->params[i].u64; }

/* -- Arithmetic ------------------------------------------------------------- */

static int64_t sext(uint64_t v, int bits)
{
    return bits >= 64 ? (int64_t)v : (int64_t)(v << (64 - bits)) >> (64 - bits);
}

static uint64_t zext(uint64_t v, int bits) { return bits >= 64 ? v : v & ((1ull << bits) - 1); }

static float flush32(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
static double flush64(double x) { return fpclassify(x) == FP_SUBNORMAL ? copysign(0.0, x) : x; }

static const int host_rounding[] = {FE_TONEAREST, FE_TONEAREST, FE_TOWARDZERO, FE_DOWNWARD, FE_UPWARD,
                                    FE_TONEAREST, FE_TOWARDZERO, FE_DOWNWARD,  FE_UPWARD};

/* min and max as the PTX manual writes them: the number when one operand is
 * NaN, else (a < b) ? a : b, so that of two zeros the second is returned. */
static float compute32(int fop, float x, float y, float z)
{
    switch (fop) {
    case F_ADD: return x + y;
    case F_SUB: return x - y;
    case F_MUL: return x * y;
    case F_FMA: return fmaf(x, y, z);
    case F_MIN: return isnan(x) ? y : isnan(y) ? x : x < y ? x : y;
    case F_MAX: return isnan(x) ? y : isnan(y) ? x : x > y ? x : y;
    case F_ABS: return fabsf(x);
    case F_NEG: return -x;
    case F_DIV: return x / y;
    case F_SQRT: return sqrtf(x);
    case F_RCP: return 1.0f / x;
    case F_RSQRT: return (float)(1.0 / sqrt((double)x));
    case F_EX2: return exp2f(x);
    case F_LG2: return log2f(x);
    case F_SIN: return sinf(x);
    case F_COS: return cosf(x);
    case F_TANH: return tanhf(x);
    default: return copysignf(y, x);
    }
}

static double compute64(int fop, double x, double y, double z)
{
    switch (fop) {
    case F_ADD: return x + y;
    case F_SUB: return x - y;
    case F_MUL: return x * y;
    case F_FMA: return fma(x, y, z);
    case F_MIN: return isnan(x) ? y : isnan(y) ? x : x < y ? x : y;
    case F_MAX: return isnan(x) ? y : isnan(y) ? x : x > y ? x : y;
    case F_ABS: return fabs(x);
    case F_NEG: return -x;
    case F_DIV: return x / y;
    case F_SQRT: return sqrt(x);
    case F_RCP: return 1.0 / x;
    case F_RSQRT: return 1.0 / sqrt(x);
    case F_EX2: return exp2(x);
    case F_LG2: return log2(x);
    case F_SIN: return sin(x);
    case F_COS: return cos(x);
    case F_TANH: return tanh(x);
    default: return copysign(y, x);
    }
}

/* The host's rounding mode is set around the operation only; the volatile
 * operands keep the compiler from moving the arithmetic past fesetround. */
static float compute32_rounded(int fop, float x, float y, float z, int rounding)
{
    volatile float vx = x, vy = y, vz = z;
    fesetround(host_rounding[rounding]);
    volatile float d = compute32(fop, vx, vy, vz);
    fesetround(FE_TONEAREST);
    return d;
}

static double compute64_rounded(int fop, double x, double y, double z, int rounding)
{
    volatile double vx = x, vy = y, vz = z;
    fesetround(host_rounding[rounding]);
    volatile double d = compute64(fop, vx, vy, vz);
    fesetround(FE_TONEAREST);
    return d;
}

static float saturate32(float x) { return isnan(x) ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static double saturate64(double x) { return isnan(x) ? 0.0 : x < 0.0 ? 0.0 : x > 1.0 ? 1.0 : x; }

/* Float instructions with modifiers, and those not inlined. */
static uint64_t float32_op(const insn *in, uint64_t a, uint64_t b, uint64_t c)
{
    int rounding = in->mode & MODE_ROUNDING;
    bool ftz = in->mode & MODE_FTZ;
    float x = f32_of(a), y = f32_of(b), z = f32_of(c);
    if (ftz) {
        x = flush32(x);
        y = flush32(y);
        z = flush32(z);
    }
    float d = rounding > RND_RN ? compute32_rounded(in->aux, x, y, z, rounding) : compute32(in->aux, x, y, z);
    if (ftz)
        d = flush32(d);
    return f32_bits(in->mode & MODE_SAT ? saturate32(d) : d);
}

static uint64_t float64_op(const insn *in, uint64_t a, uint64_t b, uint64_t c)
{
    int rounding = in->mode & MODE_ROUNDING;
    bool ftz = in->mode & MODE_FTZ;
    double x = f64_of(a), y = f64_of(b), z = f64_of(c);
    if (ftz) {
        x = flush64(x);
        y = flush64(y);
    }
    double d = rounding > RND_RN ? compute64_rounded(in->aux, x, y, z, rounding) : compute64(in->aux, x, y, z);
    if (ftz)
        d = flush64(d);
    return f64_bits(in->mode & MODE_SAT ? saturate64(d) : d);
}

static bool compare_float(int cmp, double a, double b)
{
    bool unordered = isnan(a) || isnan(b);
    switch (cmp) {
    case CMP_EQ: return !unordered && a == b;
    case CMP_NE: return !unordered && a != b;
    case CMP_LT: return !unordered && a < b;
    case CMP_LE: return !unordered && a <= b;
    case CMP_GT: return !unordered && a > b;
    case CMP_GE: return !unordered && a >= b;
    case CMP_EQU: return unordered || a == b;
    case CMP_NEU: return unordered || a != b;
    case CMP_LTU: return unordered || a < b;
    case CMP_LEU: return unordered || a <= b;
    case CMP_GTU: return unordered || a > b;
    case CMP_GEU: return unordered || a >= b;
    case CMP_NUM: return !unordered;
    default: return unordered;
    }
}

static bool compare_signed(int cmp, int64_t a, int64_t b)
{
    switch (cmp) {
    case CMP_EQ: return a == b;
    case CMP_NE: return a != b;
    case CMP_LT: return a < b;
    case CMP_LE: return a <= b;
    case CMP_GT: return a > b;
    default: return a >= b;
    }
}

static bool compare_unsigned(int cmp, uint64_t a, uint64_t b)
{
    switch (cmp) {
    case CMP_EQ: return a == b;
    case CMP_NE: return a != b;
    case CMP_LT:
    case CMP_LO: return a < b;
    case CMP_LE:
    case CMP_LS: return a <= b;
    case CMP_GT:
    case CMP_HI: return a > b;
    default: return a >= b;
    }
}

static bool combine(int bool_op, bool t, bool c)
{
    return bool_op == BOOL_AND ? t && c : bool_op == BOOL_OR ? t || c : bool_op == BOOL_XOR ? t != c : t;
}

/* testp's class test of fpclassify's c (taken in the operand's own width: an
 * f32 subnormal is a normal double). */
static bool float_class(int testp, int c)
{
    switch (testp) {
    case TESTP_FINITE: return c != FP_INFINITE && c != FP_NAN;
    case TESTP_INFINITE: return c == FP_INFINITE;
    case TESTP_NUMBER: return c != FP_NAN;
    case TESTP_NOTANUMBER: return c == FP_NAN;
    case TESTP_NORMAL: return c == FP_NORMAL;
    default: return c == FP_SUBNORMAL;
    }
}

/* A float rounded to an integral value as cvt's .rni/.rzi/.rmi/.rpi say. */
static double integral(double x, int rounding)
{
    switch (rounding) {
    case RND_RNI: return nearbyint(x);
    case RND_RZI: return trunc(x);
    case RND_RMI: return floor(x);
    case RND_RPI: return ceil(x);
    default: return x;
    }
}

/* x, integral, saturated to integer type t (NaN to 0), as PTX's cvt does. */
static uint64_t float_to_int(double x, int t)
{
    int bits = type_bits(t);
    if (isnan(x))
        return 0;
    if (type_signed(t)) {
        double high = ldexp(1.0, bits - 1);
        if (x >= high)
            return (uint64_t)(bits == 64 ? INT64_MAX : (1ll << (bits - 1)) - 1);
        if (x <= -high)
            return (uint64_t)(bits == 64 ? INT64_MIN : -(1ll << (bits - 1)));
        return (uint64_t)(int64_t)x;
    }
    if (x >= ldexp(1.0, bits))
        return bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
    return x <= 0.0 ? 0 : (uint64_t)x;
}

static uint64_t int_to_float(const insn *in, uint64_t v, int to, int from)
{
    int rounding = in->mode & MODE_ROUNDING;
    bool is_signed = type_signed(from);
    int64_t s = sext(v, type_bits(from));
    uint64_t u = zext(v, type_bits(from));
    volatile int64_t vs = s;
    volatile uint64_t vu = u;
    if (rounding > RND_RN)
        fesetround(host_rounding[rounding]);
    uint64_t d;
    if (to == T_F32) {
        volatile float f = is_signed ? (float)vs : (float)vu;
        d = f32_bits(in->mode & MODE_SAT ? saturate32(f) : f);
    } else {
        volatile double f = is_signed ? (double)vs : (double)vu;
        d = f64_bits(in->mode & MODE_SAT ? saturate64(f) : f);
    }
    if (rounding > RND_RN)
        fesetround(FE_TONEAREST);
    return d;
}

static uint64_t float_to_float(const insn *in, uint64_t v, int to, int from)
{
    int rounding = in->mode & MODE_ROUNDING;
    bool ftz = in->mode & MODE_FTZ;
    double x = from == T_F32 ? (double)(ftz ? flush32(f32_of(v)) : f32_of(v)) : f64_of(v);
    x = integral(x, rounding);
    if (to == T_F64)
        return f64_bits(in->mode & MODE_SAT ? saturate64(x) : x);
    float f;
    if (rounding > RND_RN && rounding < RND_RNI) {
        volatile double vx = x;
        fesetround(host_rounding[rounding]);
        volatile float vf = (float)vx;
        fesetround(FE_TONEAREST);
        f = vf;
    } else {
        f = (float)x;
    }
    if (ftz)
        f = flush32(f);
    return f32_bits(in->mode & MODE_SAT ? saturate32(f) : f);
}

/* cvt, but for the integer-to-integer ones without .sat, which are MOV, SEXT or ZEXT. */
static uint64_t convert(const insn *in, uint64_t v)
{
    int to = in->aux, from = in->aux2;
    if (type_float(from) && type_float(to))
        return float_to_float(in, v, to, from);
    if (type_float(to))
        return int_to_float(in, v, to, from);
    if (type_float(from)) {
        double x = from == T_F32 ? (double)(in->mode & MODE_FTZ ? flush32(f32_of(v)) : f32_of(v)) : f64_of(v);
        return float_to_int(integral(x, in->mode & MODE_ROUNDING), to);
    }
    /* cvt.sat between integers: clamp to the destination's range */
    int bits = type_bits(to);
    if (type_signed(from)) {
        int64_t x = sext(v, type_bits(from));
        int64_t low = type_signed(to) ? (bits == 64 ? INT64_MIN : -(1ll << (bits - 1))) : 0;
        int64_t high = type_signed(to) ? (bits == 64 ? INT64_MAX : (1ll << (bits - 1)) - 1)
                                       : (bits >= 63 ? INT64_MAX : (1ll << bits) - 1);
        return (uint64_t)(x < low ? low : x > high ? high : x);
    }
    uint64_t x = zext(v, type_bits(from));
    uint64_t high = type_signed(to) ? (1ull << (bits - 1)) - 1 : bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
    return x > high ? high : x;
}

static uint64_t carry_op(const insn *in, uint64_t a, uint64_t b, uint64_t c, uint64_t *carry)
{
    int bits = in->aux;
    u128 x = zext(a, bits), y = zext(b, bits);
    if (in->mode & (CARRY_MUL_LO | CARRY_MUL_HI)) {
        u128 product = x * y;
        x = zext(in->mode & CARRY_MUL_HI ? (uint64_t)(product >> bits) : (uint64_t)product, bits);
        y = zext(c, bits);
    }
    u128 carry_in = in->mode & CARRY_IN ? *carry & 1 : 0;
    u128 d = in->mode & CARRY_SUBTRACT ? x - y - carry_in : x + y + carry_in;
    if (in->mode & CARRY_OUT)
        *carry = (uint64_t)(d >> bits) & 1; /* the carry, or for subtraction the borrow */
    return (uint64_t)d;
}

static uint64_t bit_field_extract(uint64_t a, uint64_t b, uint64_t c, int bits, bool is_signed)
{
    unsigned pos = (unsigned)(b & 0xff), len = (unsigned)(c & 0xff);
    if (len == 0)
        return 0;
    unsigned n = pos >= (unsigned)bits ? 0 : (unsigned)bits - pos < len ? (unsigned)bits - pos : len;
    uint64_t field = n == 0 ? 0 : zext(zext(a, bits) >> pos, (int)n);
    if (!is_signed)
        return field;
    unsigned top = pos + len - 1 < (unsigned)bits - 1 ? pos + len - 1 : (unsigned)bits - 1;
    bool sign = (a >> top) & 1;
    return sign ? field | ~zext(~0ull, (int)n) : field;
}

static uint64_t bit_field_insert(uint64_t f, uint64_t b, uint64_t c, uint64_t d, int bits)
{
    unsigned pos = (unsigned)(c & 0xff), len = (unsigned)(d & 0xff);
    if (len == 0 || pos >= (unsigned)bits)
        return b;
    unsigned n = (unsigned)bits - pos < len ? (unsigned)bits - pos : len;
    uint64_t mask = zext(~0ull, (int)n) << pos;
    return (b & ~mask) | ((f << pos) & mask);
}

static uint64_t permute(uint64_t a, uint64_t b, uint64_t selector)
{
    uint64_t bytes = zext(b, 32) << 32 | zext(a, 32), d = 0;
    for (int i = 0; i < 4; i++) {
        unsigned sel = (unsigned)(selector >> (4 * i)) & 0xf;
        uint64_t byte = (bytes >> (8 * (sel & 7))) & 0xff;
        if (sel & 8)
            byte = byte & 0x80 ? 0xff : 0;
        d |= byte << (8 * i);
    }
    return d;
}

static uint64_t funnel_shift(uint64_t a, uint64_t b, uint64_t c, bool left, bool clamp)
{
    uint64_t n = clamp ? (zext(c, 32) > 32 ? 32 : zext(c, 32)) : c & 31;
    uint64_t v = zext(b, 32) << 32 | zext(a, 32);
    return left ? (v << n) >> 32 : zext(v >> n, 32);
}

static uint64_t logic3(uint64_t a, uint64_t b, uint64_t c, unsigned lut)
{
    uint64_t d = 0;
    for (unsigned k = 0; k < 8; k++)
        if (lut >> k & 1)
            d |= (k & 4 ? a : ~a) & (k & 2 ? b : ~b) & (k & 1 ? c : ~c);
    return d;
}

static uint64_t bit_reverse(uint64_t v, int bits)
{
    uint64_t d = 0;
    for (int i = 0; i < bits; i++)
        d |= ((v >> i) & 1) << (bits - 1 - i);
    return d;
}

/* dp2a / dp4a: a dot product of 16- or 8-bit parts of a with bytes of b, plus c. */
static uint64_t dot_product(const insn *in, uint64_t a, uint64_t b, uint64_t c)
{
    bool a_signed = in->mode & 1, b_signed = in->mode & 2;
    bool four = in->op == OP_DP4A;
    int first_byte = !four && in->mode & 4 ? 2 : 0;
    uint64_t sum = c;
    for (int i = 0; i < (four ? 4 : 2); i++) {
        int a_bits = four ? 8 : 16;
        uint64_t ai = zext(a >> (i * a_bits), a_bits), bi = zext(b >> ((first_byte + i) * 8), 8);
        int64_t x = a_signed ? sext(ai, a_bits) : (int64_t)ai, y = b_signed ? sext(bi, 8) : (int64_t)bi;
        sum += (uint64_t)(x * y);
    }
    return sum;
}

static uint64_t divide(uint64_t a, uint64_t b, int bits, bool is_signed, bool remainder)
{
    if (!is_signed) {
        uint64_t x = zext(a, bits), y = zext(b, bits);
        return y == 0 ? (remainder ? x : ~0ull) : remainder ? x % y : x / y;
    }
    int64_t x = sext(a, bits), y = sext(b, bits);
    if (y == 0)
        return remainder ? (uint64_t)x : ~0ull;
    if (y == -1)
        return remainder ? 0 : 0 - (uint64_t)x;
    return (uint64_t)(remainder ? x % y : x / y);
}

static uint64_t multiply_high(uint64_t a, uint64_t b, int bits, bool is_signed)
{
    if (is_signed)
        return (uint64_t)(((s128)sext(a, bits) * sext(b, bits)) >> bits);
    return (uint64_t)(((u128)zext(a, bits) * zext(b, bits)) >> bits);
}

static uint64_t multiply_wide(uint64_t a, uint64_t b, int bits, bool is_signed)
{
    if (is_signed)
        return (uint64_t)((s128)sext(a, bits) * sext(b, bits));
    return (uint64_t)((u128)zext(a, bits) * zext(b, bits));
}

static uint64_t atomic_op(int op, int t, uint64_t old, uint64_t b, uint64_t c)
{
    int bits = type_bits(t);
    switch (op) {
    case ATOM_ADD:
        return t == T_F32   ? f32_bits(f32_of(old) + f32_of(b))
             : t == T_F64 ? f64_bits(f64_of(old) + f64_of(b))
                          : old + b;
    case ATOM_MIN:
    case ATOM_MAX: {
        bool less = t == T_F32   ? f32_of(old) < f32_of(b)
                  : t == T_F64   ? f64_of(old) < f64_of(b)
                  : type_signed(t) ? sext(old, bits) < sext(b, bits)
                                   : zext(old, bits) < zext(b, bits);
        return (op == ATOM_MIN) == less ? old : b;
    }
    case ATOM_EXCH: return b;
    case ATOM_CAS: return zext(old, bits) == zext(b, bits) ? c : old;
    case ATOM_AND: return old & b;
    case ATOM_OR: return old | b;
    case ATOM_XOR: return old ^ b;
    case ATOM_INC: return zext(old, bits) >= zext(b, bits) ? 0 : old + 1;
    default: return zext(old, bits) == 0 || zext(old, bits) > zext(b, bits) ? b : old - 1;
    }
}

/* -- Execution -------------------------------------------------------------- */

enum thread_state { RUNNING, AT_BARRIER, AT_WARP, DONE };
/* A launch taking more backward branches than this loops forever, most likely:
 * failing it beats hanging the test until its timeout. */
enum { MAX_CALL_DEPTH = 8, WARP = 32 };
static const uint64_t MAX_BACKWARD_BRANCHES = 1ull << 33;

typedef struct {
    uint32_t pc;
    uint8_t state, depth;
    uint32_t return_pc[MAX_CALL_DEPTH];
    int callee[MAX_CALL_DEPTH];
} thread;

typedef struct {
    ptx_module *m;
    const struct ptx_kernel *k;
    uint64_t *slots; /* the threads' slot files, n_slots each */
    int n_slots, n_threads;
    thread *threads;
    uint8_t *shared, *local, *call_params;
    size_t shared_bytes, local_bytes, call_param_bytes; /* shared: the block's; the others: a thread's */
    const ptx_range *memory;
    int n_memory;
    ptx_range *cache; /* per instruction: the range its last global access fell in */
    uint64_t backward_branches;
    unsigned block[3];
    char *err;
    size_t err_size;
} machine;

/* Fails the launch with a message naming the kernel, the line and its text. */
static int fault(machine *M, uint32_t pc, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fault(machine *M, uint32_t pc, int code, const char *fmt, ...)
{
    int line = M->m->lines[pc];
    const char *text = M->m->text;
    for (int l = 1; l < line && text; l++) {
        text = strchr(text, '\n');
        text = text ? text + 1 : NULL;
    }
    const char *end = text ? strchr(text, '\n') : NULL;
    while (text && (*text == ' ' || *text == '\t'))
        text++;
    int n = snprintf(M->err, M->err_size, "kernel %s, PTX line %d (%.*s): ", M->k->name, line,
                     text ? (int)((end ? end : text + strlen(text)) - text) : 0, text ? text : "");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < M->err_size)
        vsnprintf(M->err + n, M->err_size - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

/* Whether [at, at + n) lies in the kernel's global memory. */
static bool global_memory(machine *M, uint32_t pc, uint64_t at, uint64_t n)
{
    ptx_range *c = &M->cache[pc];
    if (at >= c->start && at + n <= c->end)
        return true;
    int low = 0, high = M->n_memory - 1;
    while (low <= high) {
        int mid = (low + high) / 2;
        if (M->memory[mid].start <= at)
            low = mid + 1;
        else
            high = mid - 1;
    }
    if (high < 0 || at + n > M->memory[high].end)
        return false;
    *c = M->memory[high];
    return true;
}

/* The host address of an access of n bytes at address at in a state space;
 * NULL (having failed the launch in *status) outside it or misaligned. */
static uint8_t *resolve(machine *M, int t, uint32_t pc, int space, uint64_t at, uint64_t n, int *status)
{
    static const char *const names[] = {"generic", "global", "shared", "local", "param", "const"};
    uint8_t *local = M->local + (size_t)t * M->local_bytes;
    if (at & (n - 1)) {
        *status = fault(M, pc, PTX_MISALIGNED_ADDRESS, "thread %d: %s address %#llx is not aligned to %llu bytes", t,
                        names[space], (unsigned long long)at, (unsigned long long)n);
        return NULL;
    }
    switch (space) {
    case SPACE_PARAM: return (uint8_t *)(uintptr_t)at;
    case SPACE_SHARED:
        if (at <= M->shared_bytes && n <= M->shared_bytes - at)
            return M->shared + at;
        break;
    case SPACE_LOCAL:
        if (at <= M->local_bytes && n <= M->local_bytes - at)
            return local + at;
        break;
    default: {
        bool in_window = space == SPACE_GENERIC &&
                         ((at >= (uintptr_t)M->shared && at + n <= (uintptr_t)M->shared + M->shared_bytes) ||
                          (at >= (uintptr_t)local && at + n <= (uintptr_t)local + M->local_bytes));
        if (in_window || global_memory(M, pc, at, n))
            return (uint8_t *)(uintptr_t)at;
    }
    }
    *status = fault(M, pc, PTX_ILLEGAL_ADDRESS, "thread %d: %llu bytes at %s address %#llx are outside %s memory", t,
                    (unsigned long long)n, names[space], (unsigned long long)at,
                    space == SPACE_GENERIC ? "any" : names[space]);
    return NULL;
}

static uint64_t load(const uint8_t *at, int bytes, bool is_signed)
{
    uint64_t v = 0;
    memcpy(&v, at, (size_t)bytes); /* little-endian, as the GPU */
    return is_signed ? (uint64_t)sext(v, bytes * 8) : v;
}

static int load_insn(machine *M, int t, uint32_t pc, const insn *in, uint64_t *r, int space)
{
    int status = 0;
    const uint8_t *at = resolve(M, t, pc, space, r[in->o[4]] + (uint64_t)in->imm, (uint64_t)in->aux * in->aux2,
                                &status);
    if (!at)
        return status;
    for (int i = 0; i < in->aux2; i++)
        r[in->o[i]] = load(at + i * in->aux, in->aux, in->mode);
    return 0;
}

static int store_insn(machine *M, int t, uint32_t pc, const insn *in, const uint64_t *r, int space)
{
    int status = 0;
    uint8_t *at = resolve(M, t, pc, space, r[in->o[4]] + (uint64_t)in->imm, (uint64_t)in->aux * in->aux2, &status);
    if (!at)
        return status;
    for (int i = 0; i < in->aux2; i++)
        memcpy(at + i * in->aux, &r[in->o[i]], in->aux);
    return 0;
}

static int atomic_insn(machine *M, int t, uint32_t pc, const insn *in, uint64_t *r)
{
    int status = 0, bytes = type_bits(in->aux) / 8;
    uint8_t *at = resolve(M, t, pc, in->aux2, r[in->o[1]] + (uint64_t)in->imm, (uint64_t)bytes, &status);
    if (!at)
        return status;
    uint64_t old = load(at, bytes, false);
    uint64_t v = atomic_op(in->mode, in->aux, old, r[in->o[2]], r[in->o[3]]);
    memcpy(at, &v, (size_t)bytes);
    r[in->o[0]] = old;
    return 0;
}

/* Converts between a shared or local window address and a host address. */
static uint64_t window(machine *M, int t, const insn *in, uint64_t a)
{
    uintptr_t base = in->aux == SPACE_SHARED ? (uintptr_t)M->shared
                                             : (uintptr_t)(M->local + (size_t)t * M->local_bytes);
    return in->op == OP_TO_WINDOW ? a - base : a + base;
}

static int call(machine *M, int t, uint32_t *pc, const insn *in, uint64_t *r)
{
    thread *th = &M->threads[t];
    const struct ptx_kernel *f = &M->m->functions[in->imm];
    for (int d = 0; d < th->depth; d++)
        if (th->callee[d] == in->imm)
            return fault(M, *pc - 1, PTX_LAUNCH_FAILED, "%s calls itself, which the interpreter does not support",
                         f->name);
    if (th->depth == MAX_CALL_DEPTH)
        return fault(M, *pc - 1, PTX_LAUNCH_FAILED, "calls nested deeper than %d", MAX_CALL_DEPTH);
    const uint16_t *args = M->m->call_args + in->o[1];
    for (int i = 0; i < f->n_params; i++)
        r[f->params[i].slot] = r[args[i]];
    if (f->has_retval)
        r[f->retval_slot] = r[in->o[0]];
    th->return_pc[th->depth] = *pc;
    th->callee[th->depth++] = (int)in->imm;
    *pc = (uint32_t)f->start;
    return 0;
}

#define D r[in->o[0]]
#define A r[in->o[1]]
#define B r[in->o[2]]
#define C r[in->o[3]]

/* Runs thread t until it waits at a barrier or a warp instruction, or ends.
 * Returns 0, or a CUDA error code having written the message. */
static int execute(machine *M, int t)
{
    thread *th = &M->threads[t];
    uint64_t *r = M->slots + (size_t)t * (size_t)M->n_slots;
    const insn *code = M->m->code;
    uint32_t pc = th->pc;
    int status = 0;
    for (;;) {
        const insn *in = &code[pc++];
        if (!((r[in->guard] ^ in->flags) & 1))
            continue;
        switch ((enum opcode)in->op) {
        case OP_MOV: D = A; break;
        case OP_SEXT: D = (uint64_t)sext(A, in->aux); break;
        case OP_ZEXT: D = zext(A, in->aux); break;
        case OP_PACK: {
            uint64_t v = 0;
            for (int i = 0; i < in->aux2; i++)
                v |= zext(r[in->o[1 + i]], in->aux) << (i * in->aux);
            D = v;
            break;
        }
        case OP_UNPACK: {
            uint64_t v = r[in->o[4]];
            for (int i = 0; i < in->aux2; i++)
                r[in->o[i]] = zext(v >> (i * in->aux), in->aux);
            break;
        }
        case OP_LD_GLOBAL: status = load_insn(M, t, pc - 1, in, r, SPACE_GLOBAL); break;
        case OP_LD_SHARED: status = load_insn(M, t, pc - 1, in, r, SPACE_SHARED); break;
        case OP_LD_LOCAL: status = load_insn(M, t, pc - 1, in, r, SPACE_LOCAL); break;
        case OP_LD_PARAM: status = load_insn(M, t, pc - 1, in, r, SPACE_PARAM); break;
        case OP_LD_GENERIC: status = load_insn(M, t, pc - 1, in, r, SPACE_GENERIC); break;
        case OP_ST_GLOBAL: status = store_insn(M, t, pc - 1, in, r, SPACE_GLOBAL); break;
        case OP_ST_SHARED: status = store_insn(M, t, pc - 1, in, r, SPACE_SHARED); break;
        case OP_ST_LOCAL: status = store_insn(M, t, pc - 1, in, r, SPACE_LOCAL); break;
        case OP_ST_PARAM: status = store_insn(M, t, pc - 1, in, r, SPACE_PARAM); break;
        case OP_ST_GENERIC: status = store_insn(M, t, pc - 1, in, r, SPACE_GENERIC); break;
        case OP_ATOM: status = atomic_insn(M, t, pc - 1, in, r); break;
        case OP_TO_WINDOW:
        case OP_FROM_WINDOW: D = window(M, t, in, A); break;
        case OP_ADD: D = A + B; break;
        case OP_SUB: D = A - B; break;
        case OP_MUL_LO: D = A * B; break;
        case OP_MAD_LO: D = A * B + C; break;
        case OP_NEG: D = 0 - A; break;
        case OP_AND: D = A & B; break;
        case OP_OR: D = A | B; break;
        case OP_XOR: D = A ^ B; break;
        case OP_NOT: D = ~A; break;
        case OP_CNOT: D = zext(A, in->aux) == 0; break;
        case OP_SHL: D = zext(B, 32) >= (uint64_t)in->aux ? 0 : A << zext(B, 32); break;
        case OP_SHR_S: D = (uint64_t)(sext(A, in->aux) >> (zext(B, 32) > 63 ? 63 : zext(B, 32))); break;
        case OP_SHR_U: D = zext(B, 32) > 63 ? 0 : zext(A, in->aux) >> zext(B, 32); break;
        case OP_MUL_HI_S:
        case OP_MUL_HI_U: D = multiply_high(A, B, in->aux, in->op == OP_MUL_HI_S); break;
        case OP_MUL_WIDE_S:
        case OP_MUL_WIDE_U: D = multiply_wide(A, B, in->aux, in->op == OP_MUL_WIDE_S); break;
        case OP_MAD_HI_S:
        case OP_MAD_HI_U: D = multiply_high(A, B, in->aux, in->op == OP_MAD_HI_S) + C; break;
        case OP_MAD_WIDE_S:
        case OP_MAD_WIDE_U: D = multiply_wide(A, B, in->aux, in->op == OP_MAD_WIDE_S) + C; break;
        case OP_MUL24_S: D = (uint64_t)(sext(A, 24) * sext(B, 24)); break;
        case OP_MUL24_U: D = zext(A, 24) * zext(B, 24); break;
        case OP_DIV_S:
        case OP_DIV_U: D = divide(A, B, in->aux, in->op == OP_DIV_S, false); break;
        case OP_REM_S:
        case OP_REM_U: D = divide(A, B, in->aux, in->op == OP_REM_S, true); break;
        case OP_MIN_S: D = sext(A, in->aux) < sext(B, in->aux) ? A : B; break;
        case OP_MAX_S: D = sext(A, in->aux) > sext(B, in->aux) ? A : B; break;
        case OP_MIN_U: D = zext(A, in->aux) < zext(B, in->aux) ? A : B; break;
        case OP_MAX_U: D = zext(A, in->aux) > zext(B, in->aux) ? A : B; break;
        case OP_ABS: D = sext(A, in->aux) < 0 ? 0 - A : A; break;
        case OP_CARRY: D = carry_op(in, A, B, C, &r[SLOT_CARRY]); break;
        case OP_POPC: D = (uint64_t)__builtin_popcountll(zext(A, in->aux)); break;
        case OP_CLZ: {
            uint64_t v = zext(A, in->aux);
            D = v ? (uint64_t)(__builtin_clzll(v) - (64 - in->aux)) : in->aux;
            break;
        }
        case OP_BREV: D = bit_reverse(A, in->aux); break;
        case OP_BFE_S:
        case OP_BFE_U: D = bit_field_extract(A, B, C, in->aux, in->op == OP_BFE_S); break;
        case OP_BFI: D = bit_field_insert(A, B, C, r[in->o[4]], in->aux); break;
        case OP_PRMT: D = permute(A, B, C); break;
        case OP_SHF: D = funnel_shift(A, B, C, in->mode & 1, in->mode & 2); break;
        case OP_LOP3: D = logic3(A, B, C, (unsigned)in->imm); break;
        case OP_DP2A:
        case OP_DP4A: D = dot_product(in, A, B, C); break;
        case OP_SETP_S:
        case OP_SETP_U:
        case OP_SETP_F32:
        case OP_SETP_F64: {
            uint64_t a = B, b = C; /* setp's operands: p, q, a, b, c */
            bool v = in->op == OP_SETP_S   ? compare_signed(in->mode, sext(a, in->aux), sext(b, in->aux))
                   : in->op == OP_SETP_U   ? compare_unsigned(in->mode, zext(a, in->aux), zext(b, in->aux))
                   : in->op == OP_SETP_F32 ? compare_float(in->mode, in->aux ? flush32(f32_of(a)) : f32_of(a),
                                                           in->aux ? flush32(f32_of(b)) : f32_of(b))
                                           : compare_float(in->mode, f64_of(a), f64_of(b));
            bool c = (r[in->o[4]] ^ (in->flags >> 1)) & 1;
            D = combine(in->aux2, v, c);
            A = combine(in->aux2, !v, c);
            break;
        }
        case OP_SELP: D = (C ^ (in->flags >> 1)) & 1 ? A : B; break;
        case OP_SLCT_S32: D = sext(C, 32) >= 0 ? A : B; break;
        case OP_SLCT_F32: D = (in->mode ? flush32(f32_of(C)) : f32_of(C)) >= 0.0f ? A : B; break;
        case OP_TESTP: D = float_class(in->mode, in->aux == 32 ? fpclassify(f32_of(A)) : fpclassify(f64_of(A))); break;
        case OP_FADD32: D = f32_bits(f32_of(A) + f32_of(B)); break;
        case OP_FSUB32: D = f32_bits(f32_of(A) - f32_of(B)); break;
        case OP_FMUL32: D = f32_bits(f32_of(A) * f32_of(B)); break;
        case OP_FFMA32: D = f32_bits(fmaf(f32_of(A), f32_of(B), f32_of(C))); break;
        case OP_FMATH32: D = float32_op(in, A, B, C); break;
        case OP_FADD64: D = f64_bits(f64_of(A) + f64_of(B)); break;
        case OP_FSUB64: D = f64_bits(f64_of(A) - f64_of(B)); break;
        case OP_FMUL64: D = f64_bits(f64_of(A) * f64_of(B)); break;
        case OP_FFMA64: D = f64_bits(fma(f64_of(A), f64_of(B), f64_of(C))); break;
        case OP_FMATH64: D = float64_op(in, A, B, C); break;
        case OP_CVT: D = convert(in, A); break;
        case OP_BRA:
            if ((uint32_t)in->imm < pc && ++M->backward_branches > MAX_BACKWARD_BRANCHES)
                return fault(M, pc - 1, PTX_LAUNCH_FAILED, "more than %llu backward branches: a loop that never ends?",
                             (unsigned long long)MAX_BACKWARD_BRANCHES);
            pc = (uint32_t)in->imm;
            break;
        case OP_CALL: status = call(M, t, &pc, in, r); break;
        case OP_RET:
            if (th->depth == 0) {
                th->state = DONE;
                return 0;
            }
            pc = th->return_pc[--th->depth];
            break;
        case OP_EXIT: th->state = DONE; return 0;
        case OP_BAR:
        case OP_SHFL:
        case OP_VOTE:
        case OP_ACTIVEMASK:
            th->pc = pc - 1;
            th->state = in->op == OP_BAR ? AT_BARRIER : AT_WARP;
            return 0;
        case OP_NOP: break;
        }
        if (status)
            return status;
    }
}

#undef D
#undef A
#undef B
#undef C

/* Lanes of warp w waiting at the warp instruction at pc, as a mask. */
static uint32_t waiting_lanes(const machine *M, int w, uint32_t pc)
{
    uint32_t lanes = 0;
    for (int l = 0; l < WARP && w * WARP + l < M->n_threads; l++) {
        const thread *th = &M->threads[w * WARP + l];
        if (th->state == AT_WARP && th->pc == pc)
            lanes |= 1u << l;
    }
    return lanes;
}

static int shuffle(machine *M, int w, uint32_t pc, const insn *in, uint32_t lanes)
{
    uint64_t values[WARP];
    bool in_range[WARP];
    for (int l = 0; l < WARP; l++) {
        if (!(lanes >> l & 1))
            continue;
        const uint64_t *r = M->slots + (size_t)(w * WARP + l) * (size_t)M->n_slots;
        int b = (int)(r[in->o[3]] & 31), c = (int)r[in->o[4]];
        int segment = (c >> 8) & 31, max_lane = (l & segment) | ((c & 31) & ~segment), min_lane = l & segment;
        int j = in->mode == SHFL_UP     ? l - b
              : in->mode == SHFL_DOWN ? l + b
              : in->mode == SHFL_BFLY ? l ^ b
                                      : min_lane | (b & ~segment);
        in_range[l] = in->mode == SHFL_UP ? j >= max_lane : j <= max_lane;
        if (!in_range[l])
            j = l;
        if (!(lanes >> j & 1))
            return fault(M, pc, PTX_LAUNCH_FAILED, "lane %d of warp %d reads lane %d, which does not take part", l, w,
                         j);
        values[l] = zext(M->slots[(size_t)(w * WARP + j) * (size_t)M->n_slots + in->o[2]], 32);
    }
    for (int l = 0; l < WARP; l++) {
        if (!(lanes >> l & 1))
            continue;
        uint64_t *r = M->slots + (size_t)(w * WARP + l) * (size_t)M->n_slots;
        r[in->o[0]] = values[l];
        r[in->o[1]] = in_range[l];
    }
    return 0;
}

static void vote(machine *M, int w, const insn *in, uint32_t lanes)
{
    uint32_t ballot = 0;
    for (int l = 0; l < WARP; l++) {
        const uint64_t *r = M->slots + (size_t)(w * WARP + l) * (size_t)M->n_slots;
        if (lanes >> l & 1 && (r[in->o[1]] ^ (in->flags >> 1)) & 1)
            ballot |= 1u << l;
    }
    for (int l = 0; l < WARP; l++) {
        if (!(lanes >> l & 1))
            continue;
        uint64_t *r = M->slots + (size_t)(w * WARP + l) * (size_t)M->n_slots;
        uint32_t mask = (uint32_t)r[in->o[2]] & lanes;
        uint32_t set = ballot & mask;
        r[in->o[0]] = in->mode == VOTE_BALLOT ? set
                    : in->mode == VOTE_ALL    ? set == mask
                    : in->mode == VOTE_ANY    ? set != 0
                                              : set == 0 || set == mask;
    }
}

/* Performs the warp instruction warp w's first waiting lane waits at, for
 * every lane waiting there, once its member mask's lanes all wait there. */
static int resolve_warp(machine *M, int w)
{
    int first = w * WARP;
    while (M->threads[first].state != AT_WARP)
        first++;
    uint32_t pc = M->threads[first].pc;
    const insn *in = &M->m->code[pc];
    uint32_t lanes = waiting_lanes(M, w, pc);
    for (int l = 0; l < WARP; l++) {
        if (!(lanes >> l & 1))
            continue;
        const uint64_t *r = M->slots + (size_t)(w * WARP + l) * (size_t)M->n_slots;
        uint32_t members = in->op == OP_SHFL   ? (uint32_t)r[in->o[5]]
                         : in->op == OP_VOTE ? (uint32_t)r[in->o[2]]
                                             : lanes;
        if ((members & lanes) != members)
            return fault(M, pc, PTX_LAUNCH_FAILED,
                         "warp %d: member mask %#x names lanes that do not reach this instruction (those at it: %#x)",
                         w, members, lanes);
    }
    int status = 0;
    if (in->op == OP_SHFL)
        status = shuffle(M, w, pc, in, lanes);
    else if (in->op == OP_VOTE)
        vote(M, w, in, lanes);
    for (int l = 0; l < WARP && !status; l++) {
        if (!(lanes >> l & 1))
            continue;
        thread *th = &M->threads[w * WARP + l];
        if (in->op == OP_ACTIVEMASK)
            M->slots[(size_t)(w * WARP + l) * (size_t)M->n_slots + in->o[0]] = lanes;
        th->pc++;
        th->state = RUNNING;
    }
    return status;
}

/* Runs warp w until none of its threads can go on without the others. */
static int run_warp(machine *M, int w)
{
    int end = (w + 1) * WARP < M->n_threads ? (w + 1) * WARP : M->n_threads;
    for (;;) {
        bool waiting = false;
        for (int t = w * WARP; t < end; t++) {
            int status = M->threads[t].state == RUNNING ? execute(M, t) : 0;
            if (status)
                return status;
            waiting |= M->threads[t].state == AT_WARP;
        }
        if (!waiting)
            return 0;
        int status = resolve_warp(M, w);
        if (status)
            return status;
    }
}

static int run_block(machine *M, const uint64_t *preset_values, const uint16_t *thread_params, int n_thread_params)
{
    const ptx_module *m = M->m;
    for (int t = 0; t < M->n_threads; t++) {
        uint64_t *r = M->slots + (size_t)t * (size_t)M->n_slots;
        memcpy(r, preset_values, sizeof(uint64_t) * (size_t)m->n_presets);
        r[SLOT_TID] = (unsigned)t % M->block[0];
        r[SLOT_TID + 1] = (unsigned)t / M->block[0] % M->block[1];
        r[SLOT_TID + 2] = (unsigned)t / (M->block[0] * M->block[1]);
        r[SLOT_LANEID] = (unsigned)t % WARP;
        r[SLOT_WARPID] = (unsigned)t / WARP;
        for (int i = 0; i < n_thread_params; i++)
            r[thread_params[i]] = (uintptr_t)(M->call_params + (size_t)t * m->call_param_bytes) +
                                  m->presets[thread_params[i]].value;
        M->threads[t] = (thread){.pc = (uint32_t)M->k->start, .state = RUNNING};
    }
    int n_warps = (M->n_threads + WARP - 1) / WARP;
    for (;;) {
        for (int w = 0; w < n_warps; w++) {
            int status = run_warp(M, w);
            if (status)
                return status;
        }
        bool live = false;
        for (int t = 0; t < M->n_threads; t++)
            live |= M->threads[t].state == AT_BARRIER;
        if (!live)
            return 0;
        for (int t = 0; t < M->n_threads; t++) {
            if (M->threads[t].state == AT_BARRIER) {
                M->threads[t].state = RUNNING;
                M->threads[t].pc++;
            }
        }
    }
}

/* *buffer grown to hold n bytes (its contents not kept); false when out of memory. */
static bool reserve(void *buffer, size_t *cap, size_t n)
{
    if (n <= *cap)
        return true;
    free(*(void **)buffer);
    *(void **)buffer = malloc(n);
    *cap = *(void **)buffer ? n : 0;
    return *(void **)buffer != NULL;
}

static int compare_ranges(const void *a, const void *b)
{
    const ptx_range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The launch's memory: the driver's device blocks and the module's globals, sorted. */
static bool memory_table(ptx_module *m, const ptx_launch *launch, machine *M)
{
    scratch *s = &m->scratch;
    size_t n = (size_t)launch->n_device_memory + (size_t)m->n_globals;
    if (!reserve(&s->memory, &s->memory_cap, sizeof(ptx_range) * (n ? n : 1)))
        return false;
    memcpy(s->memory, launch->device_memory, sizeof(ptx_range) * (size_t)launch->n_device_memory);
    for (int i = 0; i < m->n_globals; i++)
        s->memory[launch->n_device_memory + i] =
            (ptx_range){(uintptr_t)m->globals[i].data, (uintptr_t)m->globals[i].data + m->globals[i].size};
    qsort(s->memory, n, sizeof(ptx_range), compare_ranges);
    M->memory = s->memory;
    M->n_memory = (int)n;
    return true;
}

int ptx_run(ptx_module *m, const ptx_kernel *k, const ptx_launch *launch, char *err, size_t err_size)
{
    scratch *s = &m->scratch;
    machine M = {.m = m, .k = k, .n_slots = m->n_presets + m->n_registers, .err = err, .err_size = err_size,
                 .block = {launch->block[0], launch->block[1], launch->block[2]},
                 .n_threads = (int)(launch->block[0] * launch->block[1] * launch->block[2])};
    M.shared_bytes = m->shared_bytes + launch->dynamic_shared_bytes;
    M.local_bytes = align_up(m->local_bytes, 16);
    M.call_param_bytes = align_up(m->call_param_bytes, 16);
    size_t n_slots = (size_t)M.n_threads * (size_t)M.n_slots;
    uint64_t *preset_values = malloc(sizeof(uint64_t) * (size_t)m->n_presets);
    uint16_t *thread_params = malloc(sizeof(uint16_t) * (size_t)m->n_presets);
    if (!preset_values || !thread_params || !reserve(&s->slots, &s->slots_cap, sizeof(uint64_t) * n_slots) ||
        !reserve(&s->threads, &s->threads_cap, sizeof(thread) * (size_t)M.n_threads) ||
        !reserve(&s->shared, &s->shared_cap, M.shared_bytes + 1) ||
        !reserve(&s->local, &s->local_cap, M.local_bytes * (size_t)M.n_threads + 1) ||
        !reserve(&s->params, &s->params_cap, k->param_bytes + 1) ||
        !reserve(&s->call_params, &s->call_params_cap, M.call_param_bytes * (size_t)M.n_threads + 1) ||
        !reserve(&s->cache, &s->cache_cap, sizeof(ptx_range) * (size_t)m->n_code) || !memory_table(m, launch, &M)) {
        free(preset_values);
        free(thread_params);
        snprintf(err, err_size, "kernel %s: out of memory", k->name);
        return PTX_LAUNCH_FAILED;
    }
    M.slots = s->slots;
    M.threads = s->threads;
    M.shared = s->shared;
    M.local = s->local;
    M.call_params = s->call_params;
    M.cache = s->cache;
    memset(M.cache, 0, sizeof(ptx_range) * (size_t)m->n_code);
    memset(M.slots, 0, sizeof(uint64_t) * n_slots);
    /* Unwritten shared and local memory reads as NaN, as garbage would. */
    memset(M.shared, 0xff, M.shared_bytes);
    memset(M.local, 0xff, M.local_bytes * (size_t)M.n_threads);
    for (int i = 0; i < k->n_params; i++)
        memcpy(s->params + k->params[i].offset, launch->params[i], k->params[i].size);
    int n_thread_params = 0;
    for (int i = 0; i < m->n_presets; i++) {
        const preset *p = &m->presets[i];
        preset_values[i] = p->kind == PRESET_VALUE        ? p->value
                         : p->kind == PRESET_KERNEL_PARAM ? (uintptr_t)s->params + p->value
                                                          : 0;
        if (p->kind == PRESET_THREAD_PARAM)
            thread_params[n_thread_params++] = (uint16_t)i;
    }
    preset_values[SLOT_TRUE] = 1;
    for (int d = 0; d < 3; d++) {
        preset_values[SLOT_NTID + d] = launch->block[d];
        preset_values[SLOT_NCTAID + d] = launch->grid[d];
    }
    preset_values[SLOT_NWARPID] = (unsigned)(M.n_threads + WARP - 1) / WARP;
    int status = 0;
    for (unsigned z = 0; z < launch->grid[2] && !status; z++) {
        for (unsigned y = 0; y < launch->grid[1] && !status; y++) {
            for (unsigned x = 0; x < launch->grid[0] && !status; x++) {
                preset_values[SLOT_CTAID] = x;
                preset_values[SLOT_CTAID + 1] = y;
                preset_values[SLOT_CTAID + 2] = z;
                status = run_block(&M, preset_values, thread_params, n_thread_params);
            }
        }
    }
    free(preset_values);
    free(thread_params);
    return status;
}
