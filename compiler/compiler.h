/*
 * compiler.h — the public header of compiler/: graph → artifact, and the
 * reference interpreter.
 *
 * Threads: every function here may run on any thread; distinct calls share
 * no mutable state (one LLVMContext per compile).
 */
#ifndef KILN_COMPILER_H
#define KILN_COMPILER_H

#include "protocol/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Reference interpreter (interp.c)                                           */
/* ------------------------------------------------------------------------ */

/*
 * Evaluates a validated graph naively, op by op, in f64 for floating dtypes
 * and exactly (int64) for integer and bool dtypes. It is the oracle of the
 * compiler's tests and of `kilnc --interp`.
 *
 * inputs[0 .. g->n_inputs): one tensor per graph input, any strides, in the
 * input's declared dtype (f16/bf16/f32/f64/ints/bool as stored). A symint
 * input is passed as a rank-0 KILN_DT_I64 tensor holding its value. Symbol
 * values are taken from the inputs and checked against every input's
 * declared sizes and the symbols' min/max.
 *
 * outputs[0 .. g->n_outputs) are filled with new contiguous tensors whose
 * data the caller frees with free(): dtype KILN_DT_F64 for floating
 * outputs, KILN_DT_I64 for integer outputs, KILN_DT_BOOL (one byte, 0/1)
 * for bool outputs; a {"sym"} output is a rank-0 KILN_DT_I64 tensor.
 *
 * Errors: KILN_EUNSUPOP (an op the interpreter does not know; the message
 * names the node and op), KILN_EINVGRAPH (shapes that do not agree with the
 * op, a violated symbol constraint, an input that does not match its spec;
 * the message names the node or input), -ENOMEM. On error no output is
 * left allocated.
 */
int kiln_interp_run(const kiln_graph_t *g, const kiln_tensor_t *inputs,
		    kiln_tensor_t *outputs, char *err, size_t errlen);

/*
 * A fallback callback (clients/libkiln kiln_fallback_fn) that runs an
 * artifact's fallback step with the interpreter: for kilnc and the tests.
 * Steps with symbolic arguments are refused (KILN_EUNSUPOP).
 */
int kiln_interp_fallback(void *user, const kiln_artifact_t *a,
			 uint32_t step_index, const kiln_tensor_t *views,
			 char *err, size_t errlen);

/* Whether the interpreter implements an op (by its full overload name). */
bool kiln_interp_supports(const char *op);

/* ------------------------------------------------------------------------ */
/* Compiling (compile.c)                                                      */
/* ------------------------------------------------------------------------ */

/*
 * A compiler for one target: an LLVM TargetMachine (and, per compile, a
 * fresh LLVMContext). Use it from one thread at a time; give each worker
 * thread its own. Creating the first one initialises LLVM once per process.
 */
typedef struct kiln_compiler kiln_compiler_t;

/* target NULL or {"cpu"}: the host CPU (arch x86-64, the host's features).
 * The resolved target (kiln_compiler_target) is what signatures must use.
 * Errors: KILN_EUNSUPOP (backend not built), KILN_EBADREQ, KILN_EINTERNAL. */
int kiln_compiler_new(const kiln_target_t *target, kiln_compiler_t **out,
		      char *err, size_t errlen);
void kiln_compiler_free(kiln_compiler_t *c);
/* "kiln/0.1.0 llvm/16.0.6 build/<id>": enters every signature. */
const char *kiln_compiler_fingerprint(const kiln_compiler_t *c);
const kiln_target_t *kiln_compiler_target(const kiln_compiler_t *c);
/* The linker it runs (ld.lld or ld). */
const char *kiln_compiler_linker(const kiln_compiler_t *c);
/* Whether an op is lowered to kernels (others become fallback steps). */
bool kiln_compiler_supports(const char *op);

typedef struct kiln_compile_stats {
	double lower_ms, sched_ms, codegen_ms, opt_ms, emit_ms, link_ms,
	    total_ms;
	uint32_t n_kernels, n_fallbacks;
	/* of the fallbacks, ops kiln lowers that declined at a node with a
	 * symbolic size (every convolution does): the graph at static sizes
	 * may compile them (kilnd refuses such a generalization) */
	uint32_t n_sym_fallbacks;
	uint32_t n_epilogues; /* kernels run by a product kernel (not steps) */
	uint32_t n_shared;    /* bodies not emitted: an earlier one's IR was
				 the same (repeated layers; codegen.c) */
} kiln_compile_stats_t;

/*
 * Compiles a validated graph into a new artifact (*out, owned by the
 * caller: kiln_artifact_free). Ops kiln does not lower become fallback
 * steps; they never fail the compile. Errors: KILN_EINVGRAPH (a semantic
 * error; the message names the node), KILN_ECOMPILE (LLVM or the linker
 * failed: a kiln bug, the message says what), -ENOMEM.
 */
int kiln_compile(kiln_compiler_t *c, const kiln_graph_t *g,
		 const kiln_compile_opts_t *opts, kiln_artifact_t **out,
		 kiln_compile_stats_t *stats, char *err, size_t errlen);

enum {
	KILN_EMIT_ARTIFACT = 0,
	KILN_EMIT_KERNELS,  /* the fusion report */
	KILN_EMIT_LLVM_RAW, /* LLVM IR before optimization */
	KILN_EMIT_LLVM,	    /* LLVM IR after O3 */
	KILN_EMIT_ASM,	    /* assembly */
	KILN_EMIT_IR	    /* the lowered compute nodes */
};

/* The pipeline up to `emit`; text outputs go to *text (malloc'd). */
int kiln_compile_ex(kiln_compiler_t *c, const kiln_graph_t *g,
		    const kiln_compile_opts_t *opts, kiln_artifact_t **out,
		    char **text, int emit, kiln_compile_stats_t *stats,
		    char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_H */
