/* dynprog: seeded random kiln programs whose values are [B, T, C]-shaped
 * (and what ops make of them), written so that B and T can stay symbolic:
 * the dynamic-shape tests trace them once and run them at many (B, T).
 *
 *   dynprog *p = dynprog_new(seed, KILN_CPU);
 *   kiln_jit_options o = kiln_jit_defaults();
 *   o.dynamic_dims = DYNPROG_DIMS;
 *   kiln_fn *f = kiln_jit("p", dynprog_body, DYNPROG_INPUTS, DYNPROG_OUTPUTS, p, &o);
 *   dynprog_inputs(p, b, t, seed, in);   // CPU tensors [b,t,C], [b,t,C], [t,C]
 *
 * Its parameters (a gain, two weights, a bias) live on the device given, as
 * captured tensors. */
#ifndef KILN_TESTS_DYNPROG_H
#define KILN_TESTS_DYNPROG_H

#include <stdint.h>

#include <kiln/kiln.h>

enum { DYNPROG_INPUTS = 3, DYNPROG_OUTPUTS = 2 };

typedef struct dynprog dynprog;

/* A new program for seed, its parameters on device; NULL when out of memory. */
dynprog *dynprog_new(uint64_t seed, kiln_device device);
void dynprog_free(dynprog *p);
/* Runs the program (user): eagerly, or inside a marked body. */
int dynprog_body(kiln_tensor *const *in, kiln_tensor **out, void *user);
/* New CPU inputs for batch b and sequence t, values from seed. */
void dynprog_inputs(const dynprog *p, int64_t b, int64_t t, uint64_t seed, kiln_tensor **in);
/* The dynamic_dims marking B and T of every input. */
extern const uint32_t DYNPROG_DIMS[DYNPROG_INPUTS];

#endif
