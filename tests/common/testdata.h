/*
 * testdata.h — loading kiln's test data files from C: the `.io.msgpack`
 * files of the graph corpus (tests/data/graphs/) and the `.cases.msgpack`
 * files of the per-op cases (tests/data/ops/), both described in
 * tests/data/README.md; plus the pieces every numeric test needs: the test
 * PRNG (bit-exact with clients/python/kiln/testrng.py), f16/bf16
 * conversions, laying inputs out with a graph's strides, and a tolerance
 * comparison that reports the worst element.
 *
 * Tensors here are kiln_tensor_t (protocol.h). A tensor this file hands out
 * is contiguous unless stated, holds its elements in its own dtype exactly
 * as stored (f16/bf16 as their 16-bit patterns, bool as one byte 0/1), and
 * its `data` is malloc'd: free it with kiln_td_tensor_free() or free().
 * `data` is never NULL, even for zero elements.
 *
 * Tolerances (kiln_td_tolerance; a test may loosen them with the "rtol" /
 * "atol" an io map carries, never tighten them). An element passes when
 * |got - want| <= atol + rtol * |want| (torch.allclose); NaN matches NaN and
 * an infinity matches the same infinity:
 *
 *   dtype      rtol     atol    why
 *   f64        1e-7     1e-9    f64 against f64: rounding noise only
 *   f32        1e-5     1e-6    a few ulps of f32 (2^-23 ~ 1.2e-7)
 *   f16        2e-3     1e-3    about 2 ulps of f16 (2^-10 ~ 9.8e-4)
 *   bf16       1.6e-2   1e-2    about 2 ulps of bf16 (2^-7 ~ 7.8e-3)
 *   ints/bool  0        0       exact
 *
 * Threads: no global state; distinct objects may be used from distinct
 * threads.
 */
#ifndef KILN_TESTS_TESTDATA_H
#define KILN_TESTS_TESTDATA_H

#include "protocol/protocol.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- files --------------------------------------------------------------- */

/* Reads a whole file into a malloc'd buffer (*buf, free() it). 0 or -errno. */
int kiln_td_read_file(const char *path, uint8_t **buf, size_t *len);

/* Reads and decodes a Graph v1 file with the default limits. On success *g
 * is owned by the caller (kiln_graph_free). Errors as kiln_graph_decode, or
 * -errno. */
int kiln_td_graph_load(const char *path, kiln_graph_t **g, char *err,
		       size_t errlen);

/* ---- io maps (kiln.io/1) ------------------------------------------------- */

/* One input or output of an io map: a tensor, or an int ({"int": n}). */
typedef struct kiln_td_value {
	bool is_int; /* true: ival holds the int and t is unused */
	int64_t ival;
	kiln_tensor_t t; /* contiguous, data malloc'd (gen inputs generated) */
} kiln_td_value_t;

typedef struct kiln_td_io {
	uint32_t n_inputs, n_outputs;
	kiln_td_value_t *inputs, *outputs;
	uint32_t n_symbols;
	char **sym_names;    /* n_symbols NUL-terminated names */
	int64_t *sym_values; /* n_symbols values */
	double rtol, atol;   /* from the map; -1 when absent */
	bool *nocheck;	     /* n_outputs flags from "nocheck": outputs whose
				values are undefined (empty, new_empty), so
				only dtype and shape count; NULL when none */
} kiln_td_io_t;

/*
 * Decodes an io map ({"format": "kiln.io/1", ...}) into *io, which owns
 * everything it points at (kiln_td_io_free) and does not point into `map`.
 * "gen" tensors are regenerated bit-exactly. Errors: KILN_EBADREQ (the map
 * is malformed; the message says where), -ENOMEM. On error *io is left
 * empty (freeing it is still allowed).
 */
int kiln_td_io_from_object(const msgpack_object *map, kiln_td_io_t *io,
			   char *err, size_t errlen);

/* Reads, unpacks and decodes an .io.msgpack file. Errors as above, or
 * -errno / KILN_EBADFRAME. */
int kiln_td_io_load(const char *path, kiln_td_io_t *io, char *err,
		    size_t errlen);

/* Frees what *io owns and zeroes it. Safe on a zeroed or failed io. */
void kiln_td_io_free(kiln_td_io_t *io);

/*
 * The graph's symbol values taken from io's "symbols" (by name):
 * syms[0 .. g->n_symbols). A graph symbol that the io map does not name is
 * an error (KILN_EBADREQ).
 */
int kiln_td_io_symbols(const kiln_graph_t *g, const kiln_td_io_t *io,
		       int64_t *syms, char *err, size_t errlen);

/*
 * Builds the argument array of a graph run from io's inputs: inputs[i] for
 * every graph input, a tensor laid out with the graph's declared strides
 * (evaluated with io's symbol values; data points at element [0,...,0] of a
 * malloc'd block that holds the whole strided extent), or for a symint input
 * a rank-0 KILN_DT_I64 tensor holding the int. Checks that io has one entry
 * per graph input, of the matching kind, dtype and rank. Free with
 * kiln_td_inputs_free. Errors: KILN_EBADREQ, -ENOMEM; on error nothing is
 * left allocated.
 */
int kiln_td_make_inputs(const kiln_graph_t *g, const kiln_td_io_t *io,
			kiln_tensor_t *inputs, char *err, size_t errlen);
void kiln_td_inputs_free(kiln_tensor_t *inputs, uint32_t n);

/* ---- op case files (kiln.opcases/1) -------------------------------------- */

typedef struct kiln_td_case {
	char *name;
	kiln_graph_t *graph; /* decoded with the default limits */
	kiln_td_io_t io;
} kiln_td_case_t;

typedef struct kiln_td_cases {
	char *op; /* the file's "op" */
	uint32_t n;
	kiln_td_case_t *cases;
} kiln_td_cases_t;

/*
 * Reads a .cases.msgpack file: {"format": "kiln.opcases/1", "op": str,
 * "cases": [{"name": str, "graph": Graph v1 map, "io": io map}, ...]}.
 * On success *out owns everything (kiln_td_cases_free). Errors:
 * KILN_EBADREQ, KILN_EINVGRAPH (a case's graph does not decode; the message
 * names the case), -errno, -ENOMEM.
 */
int kiln_td_cases_load(const char *path, kiln_td_cases_t *out, char *err,
		       size_t errlen);
void kiln_td_cases_free(kiln_td_cases_t *c);

/* ---- the test PRNG (tests/data/README.md) -------------------------------- */

/* z_i for seed (splitmix64 of seed + (i + 1) * golden). */
uint64_t kiln_td_prng_raw(uint64_t seed, uint64_t i);
/* lo + (hi - lo) * u_i in f64, before rounding to a dtype. */
double kiln_td_prng_uniform(uint64_t seed, uint64_t i, double lo, double hi);
/* lo + z_i % (hi - lo); requires hi > lo. */
int64_t kiln_td_prng_randint(uint64_t seed, uint64_t i, int64_t lo, int64_t hi);

/* ---- scalar conversions -------------------------------------------------- */

/* Round to nearest, ties to even, directly from f64 (no double rounding
 * through f32); overflow gives infinity, NaN a quiet NaN. */
uint16_t kiln_td_f16_from_f64(double x);
uint16_t kiln_td_bf16_from_f64(double x);
/* Exact. */
double kiln_td_f16_to_f64(uint16_t h);
double kiln_td_bf16_to_f64(uint16_t h);

/* ---- tensors ------------------------------------------------------------- */

/* Product of the sizes (1 for rank 0). */
int64_t kiln_td_numel(const kiln_tensor_t *t);

/* A new zeroed contiguous tensor (data malloc'd). 0 or -ENOMEM / -EINVAL
 * (rank over 16, negative size). */
int kiln_td_tensor_alloc(kiln_tensor_t *t, kiln_dtype_t dt, uint32_t rank,
			 const int64_t *sizes);
/* free(t->data) and clear it. NULL-safe. */
void kiln_td_tensor_free(kiln_tensor_t *t);

/* Element at row-major logical index i (0 <= i < numel), following t's
 * strides, converted exactly to double (i64 beyond 2^53 rounds). */
double kiln_td_get(const kiln_tensor_t *t, int64_t i);
/* Element i as int64 (floats are truncated). */
int64_t kiln_td_get_i64(const kiln_tensor_t *t, int64_t i);

/* ---- comparison ---------------------------------------------------------- */

/* The default tolerance for a dtype (the table at the top). */
void kiln_td_tolerance(kiln_dtype_t dt, double *rtol, double *atol);

typedef struct kiln_td_cmp {
	bool ok;
	int64_t n_bad;	  /* elements outside the tolerance */
	int64_t worst;	  /* row-major index of the worst element; -1: none */
	double got, want; /* the worst element's values */
	double max_abs;	  /* max |got - want| over elements finite in both */
	double max_rel;	  /* max |got - want| / |want| over those, want != 0 */
	char msg[320];	  /* a one-line description (also when ok) */
} kiln_td_cmp_t;

/*
 * Compares got against want element by element (any dtypes and strides:
 * values are compared as doubles, so an interpreter's f64 output can be held
 * against torch's f32 one). Shapes must be equal (rank and sizes); a shape
 * mismatch fails with worst = -1. The worst element is the one with the
 * largest |got - want| / (atol + rtol * |want|) (a NaN or infinity mismatch
 * is worst of all). Returns r->ok.
 */
bool kiln_td_compare(const kiln_tensor_t *got, const kiln_tensor_t *want,
		     double rtol, double atol, kiln_td_cmp_t *r);

#ifdef __cplusplus
}
#endif
#endif /* KILN_TESTS_TESTDATA_H */
