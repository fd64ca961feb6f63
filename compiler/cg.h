/*
 * cg.h — shared by the LLVM code generator files (codegen.c, mathfn.c).
 */
#ifndef KILN_CG_H
#define KILN_CG_H

#include "compiler/cir.h"

#include <llvm-c/Core.h>

#define CG_MAX_ARGS 256

typedef struct cgmemo {
	const sx_t **key;
	LLVMValueRef *val;
	uint32_t cap, n;
} cgmemo_t;

#define CG_MAX_HOIST 16
/* transposed loads a tiled kernel reads through tiles; members it can
 * store through tiles (sched.c block_transposes takes kernels of up to 64) */
#define CG_MAX_TILES	    8
#define CG_MAX_TILE_MEMBERS 64

typedef struct gen {
	cctx_t *c;
	kernel_t *k;
	LLVMContextRef ctx;
	LLVMModuleRef mod;
	LLVMBuilderRef b;
	LLVMValueRef fn;
	/* types */
	LLVMTypeRef i1, i8, i16, i32, i64, f16, f32, f64, ptr, voidt;
	/* kernel arguments */
	uint32_t n_args;
	uint32_t args[CG_MAX_ARGS]; /* cbuf ids */
	LLVMValueRef argp[CG_MAX_ARGS];
	LLVMValueRef syms; /* ptr to int64 symbol values */
	LLVMValueRef sym_val[64];
	/* current loop state */
	LLVMValueRef var[CIR_MAX_VARS]; /* i64 values of the kernel vars */
	int vvar;			/* the vectorized var, or -1 */
	int W;				/* current width (1: scalar) */
	int slot;			/* reduction accumulator in use */
	int red_unroll; /* accumulators per reduction in this pass's loop */
	bool span_whole_vectors; /* the lo..hi of gen_loops is a multiple
				    of the vector width */
	cgmemo_t memo;
	/* per member: its value for the current point (full members in the
	 * current iteration; row/reduce members for the current unit) */
	LLVMValueRef *mval;
	int *mval_width;
	int32_t cur_pass;
	bool in_loop;
	/* inner-vectorized row kernels: the innermost outer var (-1: none),
	 * and whether the current pass prefetches the next row */
	int pf_var;
	bool pf_on;
	/* wavefront row kernels over one static reduced dim: pass p walks
	 * its row from column p·rot_step (mod rot_cols) of var rot_var (-1:
	 * no rotation; codegen.c gen_kernel_body) */
	int rot_var;
	int64_t rot_step, rot_cols;
	/* per-row scratch buffers (row-local members): cbuf → alloca */
	uint32_t n_scratch;
	uint32_t scratch_buf[16];
	LLVMValueRef scratch[16];
	/* row kernels: values of the current pass that do not change along
	 * the reduced dims, computed once per unit before its loops */
	uint32_t n_hoist;
	const struct sx *hoist_e[CG_MAX_HOIST];
	LLVMValueRef hoist_v[CG_MAX_HOIST];
	int hoist_w[CG_MAX_HOIST];
	/* per kernel argument: an i1 that is true where this call writes the
	 * buffer with streaming stores (codegen.c nt_setup), or NULL */
	LLVMValueRef nt_flag[CG_MAX_ARGS];
	bool any_nt; /* a streaming store was emitted: sfence at the end */
	/* tiled pointwise kernels (kernel_t.tiled, codegen.c tiles): the
	 * tile var (-1: none), the width of the tiles in use, the loads read
	 * from a transposed tile, and per member the tile its stores go to
	 * (NULL: stored directly) */
	int tile_var;
	int tile_w;
	uint32_t n_tld;
	const struct sx *tld_e[CG_MAX_TILES];
	LLVMValueRef tld_mem[CG_MAX_TILES];
	LLVMValueRef tst_mem[CG_MAX_TILE_MEMBERS];
	int64_t tst_cv[CG_MAX_TILE_MEMBERS];
	/* a row kernel's wavefront loop being built (codegen.c gen_row_wave)
	 * or NULL */
	struct cgwave *wave;
	/* zero page for masked scalar loads */
	LLVMValueRef zero_page;
	bool use_libmvec;
} gen_t;

/* the largest constant stride along the vector variable that a load
 * reads with vector loads and a shuffle instead of a gather (codegen.c
 * load_strided) */
#define CG_MAX_STRIDE 4

/* Bytes of the zeroed block guarded loads read where their guard is false
 * (codegen.c): the widest vector of a lane-uniform guarded row. */
#define CG_ZERO_BYTES 256

LLVMTypeRef cg_scalar_type(gen_t *g, kiln_dtype_t dt);
LLVMTypeRef cg_type(gen_t *g, kiln_dtype_t dt, int w);
LLVMValueRef cg_splat(gen_t *g, LLVMValueRef s, int w);
LLVMValueRef cg_const_f(gen_t *g, double v, kiln_dtype_t dt, int w);
LLVMValueRef cg_const_i(gen_t *g, int64_t v, kiln_dtype_t dt, int w);
LLVMValueRef cg_intr(gen_t *g, const char *name, LLVMTypeRef *over,
		     unsigned n_over, LLVMValueRef *args, unsigned n_args);

/* f32/f64 transcendental op on a scalar or vector value (mathfn.c). */
LLVMValueRef cg_math(gen_t *g, sx_op_t op, LLVMValueRef x, LLVMValueRef y,
		     kiln_dtype_t dt, int w);

#endif
