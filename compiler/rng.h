/*
 * rng.h — kiln's counter-based random numbers (kiln.dropout), shared by
 * the reference interpreter and the lowering so both draw the same bits.
 *
 * Element i (0-based, row-major over the input's shape) of a draw with a
 * 64-bit seed (a graph input, so one artifact draws anew on every call)
 * and a stream number (one per random op of the graph):
 *
 *   z = seed + stream * KILN_RNG_STREAM + (i + 1) * KILN_RNG_GOLDEN
 *   z = (z ^ (z >> 30)) * KILN_RNG_C1
 *   z = (z ^ (z >> 27)) * KILN_RNG_C2
 *   z =  z ^ (z >> 31)            (unsigned 64-bit, wrapping, logical >>)
 *   u = z >> 40                   (24 uniform bits)
 *
 * — SplitMix64's output function over a Weyl sequence: no state, so any
 * element can be drawn alone, in any order, on any thread (the kernels
 * split their extent freely). Dropout keeps element i when
 * u >= ceil(p * 2^24), which is u / 2^24 >= p: keep probability 1 - p to
 * 2^-24.
 */
#ifndef KILN_COMPILER_RNG_H
#define KILN_COMPILER_RNG_H

#include <math.h>
#include <stdint.h>

#define KILN_RNG_GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define KILN_RNG_C1	UINT64_C(0xBF58476D1CE4E5B9)
#define KILN_RNG_C2	UINT64_C(0x94D049BB133111EB)
#define KILN_RNG_STREAM UINT64_C(0xD1B54A32D192ED03)
#define KILN_RNG_BITS	24

static inline uint64_t kiln_rng_bits(uint64_t seed, uint64_t stream, uint64_t i)
{
	uint64_t z =
	    seed + stream * KILN_RNG_STREAM + (i + 1) * KILN_RNG_GOLDEN;
	z = (z ^ (z >> 30)) * KILN_RNG_C1;
	z = (z ^ (z >> 27)) * KILN_RNG_C2;
	z = z ^ (z >> 31);
	return z >> (64 - KILN_RNG_BITS);
}

/* The smallest u that keeps an element: ceil(p * 2^24), p in [0, 1]. */
static inline int64_t kiln_rng_keep_from(double p)
{
	return (int64_t)ceil(p * (double)(INT64_C(1) << KILN_RNG_BITS));
}

#endif /* KILN_COMPILER_RNG_H */
