/* Sizes: a dimension is a concrete size or a polynomial in the symbols (the
 * sizes of input dimensions that vary between calls), kept once per table
 * (a graph's, a kernel's) so that equal sizes are equal numbers.
 *
 * Polynomials have at most IR_POLY_TERMS terms with int64 coefficients;
 * anything that would not fit (more terms, an overflowing coefficient, a
 * division that is not exact) is IR_SIZE_NONE, and the caller gives up on
 * keeping that dimension symbolic. */
#include <stdlib.h>
#include <string.h>

#include "ir/internal.h"

/* -- Polynomials ---------------------------------------------------------- */

/* Terms in symbols of higher powers first: "8*s0*s1+3". */
static int compare_terms(const void *a, const void *b)
{
    return memcmp(((const ir_term *)b)->exp, ((const ir_term *)a)->exp, IR_MAX_SYMBOLS);
}

/* Sorts p's terms, merges equal monomials, drops zero ones. */
static bool normalize(ir_poly *p)
{
    qsort(p->terms, (size_t)p->n, sizeof *p->terms, compare_terms);
    int out = 0;
    for (int i = 0; i < p->n; i++) {
        if (out > 0 && !compare_terms(&p->terms[out - 1], &p->terms[i])) {
            if (__builtin_add_overflow(p->terms[out - 1].coef, p->terms[i].coef, &p->terms[out - 1].coef))
                return false;
        } else {
            p->terms[out++] = p->terms[i];
        }
        if (p->terms[out - 1].coef == 0)
            out--;
    }
    p->n = out;
    return true;
}

static bool poly_const(ir_poly *p, int64_t v)
{
    memset(p, 0, sizeof *p);
    if (v != 0)
        p->terms[p->n++].coef = v;
    return true;
}

static bool poly_add(const ir_poly *a, const ir_poly *b, ir_poly *out)
{
    ir_poly sum = *a;
    for (int i = 0; i < b->n; i++) {
        if (sum.n == IR_POLY_TERMS && !normalize(&sum))
            return false;
        if (sum.n == IR_POLY_TERMS)
            return false;
        sum.terms[sum.n++] = b->terms[i];
    }
    if (!normalize(&sum))
        return false;
    *out = sum;
    return true;
}

static bool poly_mul(const ir_poly *a, const ir_poly *b, ir_poly *out)
{
    ir_poly product = {0};
    for (int i = 0; i < a->n; i++) {
        for (int j = 0; j < b->n; j++) {
            ir_term t = {0};
            if (__builtin_mul_overflow(a->terms[i].coef, b->terms[j].coef, &t.coef))
                return false;
            for (int s = 0; s < IR_MAX_SYMBOLS; s++) {
                unsigned e = (unsigned)a->terms[i].exp[s] + b->terms[j].exp[s];
                if (e > 255)
                    return false;
                t.exp[s] = (uint8_t)e;
            }
            if (product.n == IR_POLY_TERMS && !normalize(&product))
                return false;
            if (product.n == IR_POLY_TERMS)
                return false;
            product.terms[product.n++] = t;
        }
    }
    if (!normalize(&product))
        return false;
    *out = product;
    return true;
}

/* a / d for a monomial d (coefficient and powers) dividing every term of a exactly. */
static bool poly_div(const ir_poly *a, const ir_poly *d, ir_poly *out)
{
    if (d->n != 1 || d->terms[0].coef <= 0)
        return false;
    const ir_term *by = &d->terms[0];
    ir_poly q = *a;
    for (int i = 0; i < q.n; i++) {
        if (q.terms[i].coef % by->coef)
            return false;
        q.terms[i].coef /= by->coef;
        for (int s = 0; s < IR_MAX_SYMBOLS; s++) {
            if (q.terms[i].exp[s] < by->exp[s])
                return false;
            q.terms[i].exp[s] -= by->exp[s];
        }
    }
    *out = q;
    return normalize(out);
}

/* -- Tables ---------------------------------------------------------------- */

static int64_t handle_of(int index)
{
    return -1 - (int64_t)index;
}

bool ir_size_poly(const ir_sizes *t, int64_t size, ir_poly *p)
{
    if (size >= 0)
        return poly_const(p, size);
    if (size == IR_SIZE_NONE || -1 - size >= t->n)
        return false;
    *p = t->polys[-1 - size];
    return true;
}

static bool term_constant(const ir_term *t)
{
    for (int s = 0; s < IR_MAX_SYMBOLS; s++)
        if (t->exp[s])
            return false;
    return true;
}

static bool is_constant(const ir_poly *p)
{
    return p->n == 0 || (p->n == 1 && term_constant(&p->terms[0]));
}

int64_t ir_size_of(ir_sizes *t, const ir_poly *p)
{
    if (is_constant(p) && (p->n == 0 || p->terms[0].coef >= 0))
        return p->n == 0 ? 0 : p->terms[0].coef;
    ir_poly canonical;
    memset(&canonical, 0, sizeof canonical); /* the unused terms too: polys compare with memcmp */
    canonical.n = p->n;
    memcpy(canonical.terms, p->terms, (size_t)p->n * sizeof *p->terms);
    for (int i = 0; i < t->n; i++)
        if (!memcmp(&t->polys[i], &canonical, sizeof canonical))
            return handle_of(i);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        ir_poly *grown = realloc(t->polys, (size_t)cap * sizeof *grown);
        if (!grown)
            return IR_SIZE_NONE;
        t->polys = grown;
        t->cap = cap;
    }
    t->polys[t->n] = canonical;
    return handle_of(t->n++);
}

int64_t ir_size_symbol(ir_sizes *t, int symbol)
{
    ir_poly p;
    memset(&p, 0, sizeof p);
    p.n = 1;
    p.terms[0].coef = 1;
    p.terms[0].exp[symbol] = 1;
    return ir_size_of(t, &p);
}

typedef bool (*poly_op)(const ir_poly *a, const ir_poly *b, ir_poly *out);

static int64_t combine(ir_sizes *t, int64_t a, int64_t b, poly_op op)
{
    ir_poly pa, pb, out;
    if (!ir_size_poly(t, a, &pa) || !ir_size_poly(t, b, &pb) || !op(&pa, &pb, &out))
        return IR_SIZE_NONE;
    return ir_size_of(t, &out);
}

int64_t ir_size_add(ir_sizes *t, int64_t a, int64_t b)
{
    if (a >= 0 && b >= 0)
        return __builtin_add_overflow(a, b, &a) ? IR_SIZE_NONE : a;
    return combine(t, a, b, poly_add);
}

int64_t ir_size_mul(ir_sizes *t, int64_t a, int64_t b)
{
    if (a >= 0 && b >= 0)
        return __builtin_mul_overflow(a, b, &a) ? IR_SIZE_NONE : a;
    return combine(t, a, b, poly_mul);
}

int64_t ir_size_div(ir_sizes *t, int64_t a, int64_t b)
{
    if (a >= 0 && b > 0)
        return a % b ? IR_SIZE_NONE : a / b;
    return combine(t, a, b, poly_div);
}

int64_t ir_size_moved(ir_sizes *to, const ir_sizes *from, int64_t size)
{
    ir_poly p;
    if (size >= 0)
        return size;
    return ir_size_poly(from, size, &p) ? ir_size_of(to, &p) : IR_SIZE_NONE;
}

int64_t ir_poly_eval(const ir_poly *p, const int64_t *symbols)
{
    int64_t sum = 0;
    for (int i = 0; i < p->n; i++) {
        int64_t term = p->terms[i].coef;
        uint64_t powers; /* all zero for the constant term: kernels evaluate their sizes every launch */
        memcpy(&powers, p->terms[i].exp, sizeof powers);
        for (int s = 0; powers && s < IR_MAX_SYMBOLS; s++)
            for (int e = 0; e < p->terms[i].exp[s]; e++)
                if (__builtin_mul_overflow(term, symbols[s], &term))
                    return IR_SIZE_NONE;
        if (__builtin_add_overflow(sum, term, &sum))
            return IR_SIZE_NONE;
    }
    return sum;
}

int64_t ir_size_eval(const ir_sizes *t, int64_t size, const int64_t *symbols)
{
    ir_poly p;
    if (size >= 0)
        return size;
    if (!ir_size_poly(t, size, &p))
        return IR_SIZE_NONE;
    int64_t value = ir_poly_eval(&p, symbols);
    return value >= 0 ? value : IR_SIZE_NONE;
}

int ir_size_as_symbol(const ir_sizes *t, int64_t size)
{
    ir_poly p;
    if (size >= 0 || !ir_size_poly(t, size, &p) || p.n != 1 || p.terms[0].coef != 1)
        return -1;
    int symbol = -1;
    for (int s = 0; s < IR_MAX_SYMBOLS; s++) {
        if (p.terms[0].exp[s] > 1 || (p.terms[0].exp[s] && symbol >= 0))
            return -1;
        if (p.terms[0].exp[s])
            symbol = s;
    }
    return symbol;
}

unsigned ir_size_symbols(const ir_sizes *t, int64_t size)
{
    ir_poly p;
    unsigned mask = 0;
    if (size >= 0 || !ir_size_poly(t, size, &p))
        return 0;
    for (int i = 0; i < p.n; i++)
        for (int s = 0; s < IR_MAX_SYMBOLS; s++)
            if (p.terms[i].exp[s])
                mask |= 1u << s;
    return mask;
}

bool ir_shape_eval(const ir_sizes *t, int ndim, const int64_t *shape, const int64_t *symbols, int64_t *out)
{
    for (int d = 0; d < ndim; d++)
        if ((out[d] = ir_size_eval(t, shape[d], symbols)) == IR_SIZE_NONE)
            return false;
    return true;
}

bool ir_shape_symbolic(int ndim, const int64_t *shape)
{
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return true;
    return false;
}

int64_t ir_shape_product(ir_sizes *t, int ndim, const int64_t *shape)
{
    int64_t product = 1;
    for (int d = 0; d < ndim && product != IR_SIZE_NONE; d++)
        product = ir_size_mul(t, product, shape[d]);
    return product;
}

int ir_sizes_copy(ir_sizes *to, const ir_sizes *from)
{
    ir_poly *polys = from->n ? malloc((size_t)from->n * sizeof *polys) : NULL;
    if (from->n && !polys)
        return -1;
    if (from->n)
        memcpy(polys, from->polys, (size_t)from->n * sizeof *polys);
    free(to->polys);
    *to = (ir_sizes){polys, from->n, from->n};
    return 0;
}

void ir_sizes_free(ir_sizes *t)
{
    free(t->polys);
    *t = (ir_sizes){0};
}

void ir_size_put(strbuf *out, const ir_sizes *t, int64_t size)
{
    ir_poly p;
    if (size >= 0 || !ir_size_poly(t, size, &p)) {
        strbuf_put(out, "%lld", (long long)size);
        return;
    }
    for (int i = 0; i < p.n; i++) {
        const ir_term *term = &p.terms[i];
        bool first = true;
        strbuf_put(out, i ? "+" : "");
        if (term->coef != 1 || term_constant(term)) {
            strbuf_put(out, "%lld", (long long)term->coef);
            first = false;
        }
        for (int s = 0; s < IR_MAX_SYMBOLS; s++)
            for (int e = 0; e < term->exp[s]; e++, first = false)
                strbuf_put(out, "%ss%d", first ? "" : "*", s);
    }
}
