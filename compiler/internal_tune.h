/*
 * internal_tune.h — max-autotune (autotune.c) and the compile entry it
 * drives (compile.c). Not installed.
 */
#ifndef KILN_INTERNAL_TUNE_H
#define KILN_INTERNAL_TUNE_H

#include "compiler/compiler.h"

#include <stdbool.h>
#include <stdint.h>

#define KILN_TUNE_WHY 256 /* a decision's text, as --emit=kernels shows it */

typedef struct kiln_tune_cache kiln_tune_cache_t;

kiln_tune_cache_t *kiln__tune_cache_new(void);
void kiln__tune_cache_free(kiln_tune_cache_t *t);

/* Chooses, per node of g, a template variant by measurement: tune[i] is -1
 * (no choice: the heuristic) or the variant, why[i] the text. */
int kiln__autotune(kiln_compiler_t *kc, kiln_tune_cache_t *cache,
		   const kiln_graph_t *g, int8_t *tune,
		   char (*why)[KILN_TUNE_WHY]);

/* kiln_compile_ex with each node's variant forced (tune[i] >= 0) and its
 * reason shown in the kernel report (why, may be NULL). */
int kiln__compile_tuned(kiln_compiler_t *kc, const kiln_graph_t *g,
			const int8_t *tune, char (*why)[KILN_TUNE_WHY],
			kiln_artifact_t **out, char **text, int emit,
			kiln_compile_stats_t *st, char *err, size_t errlen);

/* Sets whether the compiler takes its BLAS to run AVX-512 kernels (what
 * probe_blas found, from the OpenBLAS core), and its fingerprint with it:
 * the GEMM template's heuristic (codegen.c tmpl_form) leaves products to
 * BLAS only where it does. For tests, which check both; nothing where
 * there is no BLAS. */
void kiln__compiler_set_blas_avx512(kiln_compiler_t *c, bool avx512);

/* Sets whether the heuristic may take the direct forward convolution
 * (ops_conv.c conv_fdirect_ok; max-autotune still times it), and the
 * fingerprint with it. For tests of the other forms on convolutions of
 * few output channels. */
void kiln__compiler_set_conv_direct(kiln_compiler_t *c, bool on);

/* Sets the bytes of A (per batch) past which the GEMM template blocks a
 * packed product rather than packing B a panel at a time (codegen.c
 * TG_BLOCK_A; 0 restores it), and the fingerprint with it. For tests, which
 * run the blocked form on products small enough for the interpreter. */
void kiln__compiler_set_tmpl_block_a(kiln_compiler_t *c, int64_t bytes);

#endif
