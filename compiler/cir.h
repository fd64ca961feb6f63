/*
 * cir.h — the compiler's internal IR, shared by compiler/'s .c files only.
 *
 * The pipeline (compile.c drives it):
 *
 *   kiln_graph_t ──lower/decompose──▶ lazy tensors (lt_t) whose elements are
 *   scalar expressions (sx_t) of index variables; reductions and values that
 *   must exist in memory become compute nodes (cnode_t) writing buffers
 *   (cbuf_t) ──sched──▶ kernels (kernel_t: an iteration space and the
 *   members computed in it) ──codegen──▶ one LLVM module ──target_cpu──▶
 *   .so ──memplan/compile──▶ kiln_artifact_t.
 *
 * Expressions: integer index math uses kiln_expr_t (protocol.h) with the
 * compiler-only KILN_EX_VAR; every kiln_expr_t and sx_t built here is
 * hash-consed in the compile context, so structurally equal expressions are
 * the same pointer. All memory comes from the context's arena, freed when the
 * compile ends.
 *
 * Threads: a cctx_t belongs to one compile on one thread.
 */
#ifndef KILN_CIR_H
#define KILN_CIR_H

#include "compiler/compiler.h"
#include "compiler/internal_tune.h"
#include "protocol/internal.h"

#include <stdarg.h>

#define CIR_MAX_RANK KILN_MAX_RANK_HARD
/* the block a transposing pointwise kernel splits a dim into (sched.c
 * block_transposes, codegen.c tiles) */
#define CIR_TBLK     16
#define CIR_MAX_VARS 40

/* ---- scalar expressions -------------------------------------------------- */

typedef enum {
	SX_CONST, /* f (float dtypes) or i (others) */
	SX_LOAD,  /* buffer `buf` at element `idx` (+ dyn), guarded by `a` */
	SX_INDEX, /* the i64 value of index expression `idx` */
	SX_UN,	  /* op(a) */
	SX_BIN,	  /* op(a, b) */
	SX_WHERE, /* a ? b : c */
	SX_CAST,  /* a converted to dt */
} sx_kind_t;

/* clang-format off */
#define SX_OPS(X)                                                              \
	/* unary */                                                            \
	X(NEG) X(ABS) X(EXP) X(EXP2) X(LOG) X(LOG1P) X(LOG2) X(EXPM1) X(SQRT)  \
	X(RSQRT) X(RECIP) X(SIN) X(COS) X(TAN) X(TANH) X(SIGMOID) X(ERF)       \
	X(SIGN) X(FLOOR) X(CEIL) X(ROUND) X(TRUNC) X(NOT) X(BITNOT) X(ISNAN)   \
	X(ATAN) X(EXPNP) X(PHI)                                                \
	/* binary */                                                           \
	X(ADD) X(SUB) X(MUL) X(DIV) X(FLOORDIV) X(TRUNCDIV) X(REM) X(FMOD)     \
	X(POW) X(MAX) X(MIN) X(ATAN2) X(EQ) X(NE) X(LT) X(LE) X(GT) X(GE)      \
	X(AND) X(OR) X(XOR) X(BITAND) X(BITOR) X(BITXOR) X(SHL) X(SHR)         \
	/* exp(a - b), b one value a row, >= a: softmax's, attention's */      \
	X(EXPSUB)
/* clang-format on */

typedef enum {
#define SX_OP_ENUM(n) OP_##n,
	SX_OPS(SX_OP_ENUM)
#undef SX_OP_ENUM
	    OP__COUNT
} sx_op_t;

typedef struct sx {
	uint8_t kind; /* sx_kind_t */
	uint8_t op;   /* sx_op_t for UN/BIN */
	uint8_t dt;   /* compute dtype (kiln_dtype_t; never F16/BF16) */
	uint32_t buf; /* LOAD */
	uint32_t hash;
	uint32_t shash; /* hash without buffer ids: the same in every layer
			   of a model, orders commutative operands */
	const struct sx *a, *b, *c; /* operands; LOAD: a = guard or NULL,
				       b = dyn (i64 extra offset) or NULL */
	const kiln_expr_t *idx;	    /* LOAD, INDEX */
	union {
		double f;
		int64_t i;
	} k;		 /* CONST */
	struct sx *next; /* hash chain */
} sx_t;

/* ---- lazy tensors -------------------------------------------------------- */

typedef struct lt {
	kiln_dtype_t dtype; /* torch's dtype of the value */
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	bool is_buf;
	/* is_buf: element [i...] = buf[offset + Σ i_k * strides[k]] */
	uint32_t buf;
	kiln_dim_t strides[CIR_MAX_RANK];
	kiln_dim_t offset;
	/* !is_buf: element [i...] = body with VAR k := i_k (compute dtype) */
	const sx_t *body;
} lt_t;

/* ---- buffers and compute nodes ------------------------------------------- */

typedef enum {
	CB_INPUT, /* graph input `input` */
	CB_TEMP,  /* produced by cnode `producer` */
} cbuf_kind_t;

typedef struct cbuf {
	cbuf_kind_t kind;
	kiln_dtype_t dtype;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dim_t strides[CIR_MAX_RANK]; /* TEMP: contiguous unless an
					     output copy with declared
					     strides */
	int32_t input;
	int32_t producer;
	/* filled by sched/memplan */
	int32_t kernel;	     /* kernel computing it (TEMP) */
	int32_t last_use;    /* last kernel that reads it from memory */
	bool in_memory;	     /* must be stored */
	bool ext_read;	     /* read outside its kernel (or by a fallback) */
	bool row_local;	     /* lives in a per-row scratch of its kernel */
	uint32_t row_out;    /* row_local: 1 + the output buffer whose row
				holds it (sched.c), 0: a stack scratch */
	bool custom_strides; /* an output laid out as declared, not row-major */
	bool is_output;	     /* backs a graph output: an OUTPUT buffer */
	int32_t out_index;   /* OUTPUT buffer number */
	int32_t art_buf;     /* artifact buffer id */
	uint32_t n_readers;  /* cnodes loading it */
} cbuf_t;

typedef enum {
	RED_NONE,
	RED_SUM,
	RED_PROD,
	RED_MAX,
	RED_MIN,
	RED_ARGMAX,
	RED_ARGMIN,
	RED_ANY,
	RED_ALL,
	/* max of floats that need not propagate NaN: for a max that only
	 * shifts an exp of the same values (softmax, logsumexp, attention),
	 * where a NaN element makes the sum NaN by itself; one vmaxps a
	 * vector instead of a compare, an unordered test, an or and a blend */
	RED_MAXNP
} red_op_t;

typedef struct cnode {
	uint32_t buf; /* the buffer it defines */
	red_op_t red; /* RED_NONE: pointwise */
	/* iteration space: pointwise: the buffer's sizes; reduction: the full
	 * (pre-reduction) sizes, with rmask bit k set for reduced dims */
	uint32_t frank;
	kiln_dim_t fsizes[CIR_MAX_RANK];
	uint32_t rmask;
	bool keepdim;	  /* reduction: buffer keeps reduced dims as 1 */
	const sx_t *body; /* VAR k = full dim k; compute dtype */
	int32_t node;	  /* graph node, for messages */
	int32_t kernel;
	/* a fallback step: graph node `node` run through torch; it writes
	 * the buffers fbout[0 .. n_fbout) (UINT32_MAX: an absent output) */
	bool fallback;
	uint32_t n_fbout;
	uint32_t *fbout;
	/* why an op kiln lowers fell back here (its lowering's message), or
	 * NULL: an op kiln does not lower at all */
	const char *fb_why;
	/* a matrix product: buf[b, m, n] = sum_k A[b, m, k] * B[b, k, n]
	 * (b: the batch dims, none for mm), A and B strided buffer views */
	bool gemm;
	const struct lt *ga, *gb;
	/* with gemm: a convolution, buf[n, o, oh, ow] = sum_ckk ga[o, ckk] *
	 * im2col(gb)[n, ckk, (oh, ow)], gb the 4-d input buffer view; the
	 * kernel builds each tile of columns in a scratch and multiplies it
	 * there (codegen.c), or with conv->implicit buf[o, (n, oh, ow)],
	 * B's blocks packed from gb */
	const struct convspec *conv;
	/* a scatter-add (ops_index.c lscatter, codegen.c gen_scatter_body):
	 * buf[v, d] = base[v, d] + the sum over the positions q of the
	 * index view ga (rank r) of gb[q, d] where ga[q] == v (ga[q] + V
	 * where negative and scat_wrap) and v != scat_pad (NULL: no
	 * padding row); gb a source buffer view of rank r + 1 and scat_base
	 * one of rank 2 (NULL: zeros), both with unit stride along their
	 * last dim and of buf's dtype (f32 or f64), buf [V, D]; with frank
	 * 3 every one has a leading dim P (gb [P, q..., D], buf and base [P,
	 * V, D]), each p scattered on its own. scat_elem: an index per
	 * element instead, ga [P, K, D] with gb [P, K, D] (frank 3):
	 * buf[p, v, d] gets gb[p, k, d] where ga[p, k, d] == v, combined
	 * by scat_op: the sum, the last one stored (scatter), the product,
	 * the max or the min (scatter_reduce; with no base, buf starts at
	 * that op's identity) */
	bool scatter;
	bool scat_wrap;
	bool scat_elem;
	uint8_t scat_op; /* scat_op_t */
	const kiln_expr_t *scat_pad;
	const struct lt *scat_base;
} cnode_t;

/* how a scatter kernel combines a source element with its target */
typedef enum scat_op {
	SCAT_ADD,
	SCAT_STORE,
	SCAT_MUL,
	SCAT_MAX,
	SCAT_MIN
} scat_op_t;

typedef struct convspec {
	int64_t N, C, H, W, O, KH, KW, OH, OW;
	int64_t s[2], p[2], d[2];
	int64_t rows; /* output rows per tile of columns */
	bool tmpl;    /* the product by codegen's GEMM template, not BLAS */
	/* implicit GEMM (ops_conv.c conv_implicit): buf[o, (n, oh, ow)] =
	 * sum_ckk ga[o, ckk] * im2col(gb)[ckk, (n, oh, ow)], the blocked
	 * GEMM template packing B's blocks straight from the input (no
	 * im2col buffer); rows unused */
	bool implicit;
	/* groups (implicit GEMM: a product per group, units over the groups
	 * then the columns; the other forms take groups == 1): 1 or more */
	int64_t G;
	/* a stride-1 convolution's weight gradient, direct (ops_conv.c
	 * bw_weight_direct, codegen.c gen_conv_wgrad_body): buf[o, c, kh,
	 * kw] = sum over (n, oh, ow) of ga[n, o, oh, ow] · gb[n, g·Cg + c,
	 * oh + kh·dh - ph, ow + kw·dw - pw] (0 outside; g the group of o),
	 * ga grad_output and gb the input, both unit-stride along W; a unit
	 * sums wg_mo output channels' taps (kh fixed, every kw) of one input
	 * channel in registers; rows, tmpl and implicit unused */
	bool wgrad;
	int64_t wg_mo;
	/* a stride-1 convolution of few output channels, direct (ops_conv.c
	 * conv_fdirect, codegen.c gen_conv_fdirect_body): buf[n, o, oh, ow]
	 * = sum over (c, kh, kw) of ga[o, c, kh, kw] · gb[n, c, oh + kh·dh
	 * - ph, ow + kw·dw - pw] (0 outside), ga the weight and gb the input
	 * (unit-stride along W); a unit computes fd_mo output channels'
	 * fd_r output rows in registers */
	bool fdirect;
	int64_t fd_mo, fd_r;
} convspec_t;

/* ---- kernels ------------------------------------------------------------- */

typedef enum {
	ROLE_FULL, /* pointwise over the full space */
	ROLE_RED,  /* a reduction */
	ROLE_ROW   /* pointwise over the outer (row) space */
} role_t;

typedef struct kmember {
	uint32_t node; /* cnode id */
	role_t role;
	int32_t pass;		 /* loop pass (ROW: scalar stage after it;
				    -1: before the first loop) */
	const sx_t *body;	 /* in kernel vars */
	const kiln_expr_t *sidx; /* store index in kernel vars */
} kmember_t;

typedef struct kernel {
	bool is_fallback; /* a fallback step, not generated code */
	bool is_gemm;	  /* a matrix product through BLAS (codegen.c) */
	bool is_row; /* has reductions: outer (parallel) × reduced (inner) */
	/* a BLAS product's pointwise epilogue, run by that kernel (the one
	 * before) on each block of rows while they are in a scratch: no plan
	 * step of its own (sched.c fuse_epilogues) */
	bool is_epilogue;
	bool has_epilogue; /* is_gemm: runs the next kernel on its blocks */
	bool is_scatter;   /* a scatter-add node (cnode_t.scatter) alone */
	/* a pointwise kernel whose dim frank-2 is the inner part (CIR_TBLK)
	 * of a dim that some accesses are contiguous along while strided
	 * along the last (sched.c block_transposes): a unit runs all of it,
	 * and codegen moves those accesses through tiles transposed in
	 * registers */
	bool tiled;
	uint32_t frank;
	kiln_dim_t fsizes[CIR_MAX_RANK];
	uint32_t rmask;
	uint32_t n_members;
	kmember_t *members; /* in order */
	uint32_t cap;
	int32_t n_passes;
	char name[32];
	/* set by codegen */
	kiln_dim_t extent;
	int64_t grain;
	/* outer-vectorized row kernels: blocks of vec_width columns a unit
	 * reduces side by side (codegen.c kernel_extent) */
	int oblk;
	uint32_t n_args;
	uint32_t *args;	 /* cbuf ids in bufs[] order */
	const char *why; /* fusion decision text */
} kernel_t;

/* ---- the compile context ------------------------------------------------- */

typedef struct cctx {
	kiln_arena_t *arena;
	/* max-autotune: per graph node, the template variant (-1: the
	 * heuristic) and why (compiler/internal_tune.h), or NULL */
	const int8_t *tune;
	char (*tune_why)[KILN_TUNE_WHY];
	const kiln_graph_t *g;
	const kiln_target_t *target;
	char *err;
	size_t errlen;
	/* hash-consing */
	kiln_expr_t **ex_tab;
	uint32_t ex_cap, ex_n;
	sx_t **sx_tab;
	uint32_t sx_cap, sx_n;
	/* var ranges while simplifying: size of VAR k, or NULL (unknown) */
	kiln_dim_t var_size[CIR_MAX_VARS];
	bool var_known[CIR_MAX_VARS];
	/* program */
	cbuf_t *bufs;
	uint32_t n_bufs, cap_bufs;
	cnode_t *nodes;
	uint32_t n_nodes, cap_nodes;
	kernel_t *kernels;
	uint32_t n_kernels, cap_kernels;
	lt_t **vals;	/* graph value -> lazy tensor (NULL: symint) */
	uint32_t *uses; /* graph value -> number of uses */
	/* options */
	int vec_width; /* f32 lanes */
	bool use_libmvec;
	bool nofuse; /* KILN_NOFUSE=1: one kernel per compute node */
	/* tests (kiln__compiler_set_conv_direct): the direct forward
	 * convolution by max-autotune only */
	bool no_conv_direct;
	/* the graph computes channels-last where it declares so (lower.c
	 * graph_nhwc): 1x1 and depthwise convolutions, realized values */
	bool nhwc;
	const char *blas; /* path of the BLAS library kernels call, or NULL */
	bool blas_avx512; /* ... whose products run AVX-512 kernels */
	int64_t tmpl_block_a; /* tests: the template's blocked bound, or 0 */
	int64_t hint_default;
} cctx_t;

/* Errors: formats into the context's buffer and returns code. */
int cir_err(cctx_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *cir_alloc(cctx_t *c, size_t n); /* zeroed; NULL on OOM */

/* ---- index expressions (ix.c) ------------------------------------------- */

const kiln_expr_t *ix_const(cctx_t *c, int64_t v);
const kiln_expr_t *ix_var(cctx_t *c, uint32_t k);
const kiln_expr_t *ix_sym(cctx_t *c, uint32_t s);
const kiln_expr_t *ix_add(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
const kiln_expr_t *ix_sub(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
const kiln_expr_t *ix_mul(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
const kiln_expr_t *ix_floordiv(cctx_t *c, const kiln_expr_t *a,
			       const kiln_expr_t *b);
const kiln_expr_t *ix_mod(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
const kiln_expr_t *ix_min(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
const kiln_expr_t *ix_max(cctx_t *c, const kiln_expr_t *a,
			  const kiln_expr_t *b);
/* Content hash of an interned expression (deterministic across runs). */
uint32_t ix_hash(const kiln_expr_t *e);
/* Interns an expression from the graph (which is not hash-consed). */
const kiln_expr_t *ix_intern(cctx_t *c, const kiln_expr_t *e);
/* A dim as an interned expression. */
const kiln_expr_t *ix_dim(cctx_t *c, kiln_dim_t d);
/* An interned expression as a dim (constant when it is one). */
kiln_dim_t dim_of(const kiln_expr_t *e);
kiln_dim_t dim_const(int64_t v);
bool dim_eq(kiln_dim_t a, kiln_dim_t b); /* operands must be interned */
bool dim_is(kiln_dim_t a, int64_t v);
kiln_dim_t dim_mul(cctx_t *c, kiln_dim_t a, kiln_dim_t b);
kiln_dim_t dim_add(cctx_t *c, kiln_dim_t a, kiln_dim_t b);
/* Replaces VAR k with map[k] (NULL: keep). */
/* Whether e's value is known to lie in [*lo, *hi] under the known var
 * ranges (c->var_known, var_size) */
bool ix_bounds(cctx_t *c, const kiln_expr_t *e, int64_t *lo, int64_t *hi);
/* Whether e's value is known to be at least *lo (symbols from their min;
 * no upper bound needed). */
bool ix_lower_bound(cctx_t *c, const kiln_expr_t *e, int64_t *lo);
const kiln_expr_t *ix_subst(cctx_t *c, const kiln_expr_t *e,
			    const kiln_expr_t *const *map, uint32_t n);
/* Whether e is affine in VAR v with a constant coefficient (*coef). */
bool ix_coef(const kiln_expr_t *e, uint32_t v, int64_t *coef);
/* Whether e mentions VAR v. */
bool ix_uses_var(const kiln_expr_t *e, uint32_t v);
/* Bitmask of the VARs e mentions (vars < 64). */
uint64_t ix_vars(const kiln_expr_t *e);
/* Evaluates with symbol values (no VARs); 0 or KILN_EINVGRAPH. */
int ix_eval(const kiln_expr_t *e, const int64_t *syms, int64_t *out);
/* Best-effort static value: constants, or symbols replaced by hints. */
int64_t ix_estimate(cctx_t *c, const kiln_expr_t *e);

/* ---- scalar expressions (sx.c) ------------------------------------------ */

kiln_dtype_t compute_dtype(kiln_dtype_t storage);
const sx_t *sx_constf(cctx_t *c, double v, kiln_dtype_t dt);
const sx_t *sx_consti(cctx_t *c, int64_t v, kiln_dtype_t dt);
const sx_t *sx_load(cctx_t *c, uint32_t buf, const kiln_expr_t *idx,
		    const sx_t *guard, const sx_t *dyn);
const sx_t *sx_index(cctx_t *c, const kiln_expr_t *idx);
const sx_t *sx_un(cctx_t *c, sx_op_t op, const sx_t *a);
const sx_t *sx_bin(cctx_t *c, sx_op_t op, const sx_t *a, const sx_t *b);
const sx_t *sx_where(cctx_t *c, const sx_t *cond, const sx_t *a, const sx_t *b);
const sx_t *sx_cast(cctx_t *c, const sx_t *a, kiln_dtype_t dt);
/* Substitutes VAR k := map[k] in every index expression of the tree. */
const sx_t *sx_subst(cctx_t *c, const sx_t *e, const kiln_expr_t *const *map,
		     uint32_t n);
uint32_t sx_size(const sx_t *e, uint32_t limit); /* nodes, up to limit */
bool sx_is_heavy(const sx_t *e);	   /* transcendental or many loads */
bool sx_has_transcendental(const sx_t *e); /* exp, log, erf, pow, ... */
bool sx_is_float(const sx_t *e);
const char *sx_op_name(sx_op_t op);
bool sx_op_is_unary(sx_op_t op);
bool sx_op_is_cmp(sx_op_t op);
/* Calls fn for every LOAD in the tree (each distinct node once). */
void sx_each_load(const sx_t *e, void (*fn)(void *, const sx_t *), void *arg);

/* ---- lazy tensors (lower.c) ---------------------------------------------- */

lt_t *lt_new(cctx_t *c, kiln_dtype_t dt, uint32_t rank,
	     const kiln_dim_t *sizes);
lt_t *lt_fn(cctx_t *c, kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sizes,
	    const sx_t *body);
lt_t *lt_buf(cctx_t *c, uint32_t buf); /* contiguous view of a buffer */
/* Element at idx[0 .. rank) (interned index expressions). */
const sx_t *lt_at(cctx_t *c, const lt_t *t, const kiln_expr_t *const *idx);
/* Element at the identity index VAR 0 .. rank-1. */
const sx_t *lt_body(cctx_t *c, const lt_t *t);
/* Element at VAR 0.. of a broadcast to (rank, sizes) (right-aligned). */
const sx_t *lt_bcast_body(cctx_t *c, const lt_t *t, uint32_t rank,
			  const kiln_dim_t *sizes);
/* Materializes t: a pointwise cnode writing a new contiguous buffer. */
int lt_realize(cctx_t *c, lt_t *t, int32_t node, lt_t **out);
/* New reduction cnode over t's dims in rmask. */
int lt_reduce(cctx_t *c, const lt_t *t, uint32_t rmask, bool keepdim,
	      red_op_t op, kiln_dtype_t out_dt, const sx_t *body, int32_t node,
	      lt_t **out);
uint32_t new_buf(cctx_t *c, cbuf_kind_t kind, kiln_dtype_t dt, uint32_t rank,
		 const kiln_dim_t *sizes);
int32_t new_cnode(cctx_t *c);

/* Whether op only views its self argument (compile.c's outputs, lower.c). */
bool cir_is_view_op(const char *op);
/* The value v views: back from v through view ops, by their self
 * argument, to the first value no view op made (v itself if none did). */
uint32_t cir_view_base(const kiln_graph_t *g, uint32_t v);
/* Lowers every node of the graph; fills c->vals. */
int lower_graph(cctx_t *c);

/* ---- the op table ------------------------------------------------------- */

typedef struct lnode lnode_t; /* a node being lowered (lower.c) */
typedef int (*lower_fn_t)(cctx_t *c, lnode_t *n);

/* ---- scheduling (sched.c) ----------------------------------------------- */

int sched_graph(cctx_t *c);
/* codegen.c's units, which the scheduler's epilogue fusion relies on: a
 * BLAS product's rows per unit, and the longest static last dim a
 * pointwise kernel takes whole in one unit */
#define CG_GEMM_MB  64
#define CG_PW_CHUNK 8192
/* codegen.c's GEMM template: register tiles of CG_TG_MR rows by CG_TG_NR
 * columns (f32, 16-lane vectors) */
#define CG_TG_MR 8
#define CG_TG_NR 32
/* ... which takes products of at least this many multiply-adds (on a tiny
 * product it saves microseconds a call but costs the compile 4-18 ms more
 * than a BLAS call: mlp_bwd's three products of K = 8 and 16, 36 -> 90
 * ms; the smallest measured win was 128x64x256, 2^21) */
#define CG_TG_MIN_MACS (1 << 21)
/* codegen.c: implicit GEMM's units (convspec implicit) for a product of
 * `cols` columns (N·OH·OW): blocks of at most 256 columns */
int64_t cg_conv_implicit_units(int64_t cols);
/* codegen.c: the direct weight gradient's units (convspec wgrad) */
int64_t cg_wgrad_units(const convspec_t *cs);
/* ops_conv.c's heuristic for the direct forward (conv_fdirect_ok): at
 * most this many output channels, at least this many multiply-adds an
 * output */
#define CG_FDIRECT_MAX_O   16
#define CG_FDIRECT_MIN_CKK 64
/* codegen.c: the direct forward's units (convspec fdirect) */
int64_t cg_fdirect_units(const convspec_t *cs);
/* ops_conv.c takes implicit GEMM with at least this many units (769
 * columns and more). With fewer the units leave threads idle: ResNet-18's
 * deep layers at batch 1 (196 and 49 columns, one unit) measured
 * 0.43-0.63x eager against 0.74-1.32x with im2col + BLAS, while its
 * 784-column ones gained (batch 1: 128->128 at 28² 0.70 -> 0.80-0.86x
 * eager, 64->128 stride 2 at 56² 0.88 -> 1.04-1.16x; batch 16 at 7²:
 * 512->512 0.64-0.71 -> 0.74-0.79x). Measured on 2 threads: on many more
 * the 4 units of a 784-column product leave threads idle that im2col +
 * BLAS would use. */
#define CG_CONV_IMPLICIT_MIN_UNITS 4
/* codegen.c: the columns a unit of a scatter-add kernel owns (it runs
 * every source position for them, so no two units write one element) */
int64_t cg_scatter_cols(cctx_t *c, const cnode_t *n);
/* codegen.c: the column block of a product's units (0: all of N) */
int64_t cg_gemm_col_block(cctx_t *c, const cnode_t *n);
/* codegen.c: whether a product node is multiplied by the GEMM template
 * rather than BLAS: 0 BLAS, 1 the template on B as it is, 2 the template
 * packing B a panel at a time, 3 the template blocked with A and B packed */
int cg_gemm_tmpl(cctx_t *c, const cnode_t *n);
/* codegen.c: whether row kernel k is inner-vectorized (along its last
 * dim, which it reduces) rather than outer-vectorized (across its rows,
 * along its last outer dim): its last dim is reduced, but not where every
 * load reads the last outer dim contiguously or not at all, one does, none
 * of those reads the last dim contiguously too and every store is
 * contiguous along it (LayerNorm over the channels of an NCHW tensor) */
bool cg_inner_vec(cctx_t *c, const kernel_t *k);
/* codegen.c: blocks of vec_width columns a unit of a row kernel reduces
 * side by side (1 but where it is outer-vectorized) */
int cg_outer_blocks(cctx_t *c, const kernel_t *k);
/* Whether row kernel k runs its first pass one unit ahead (codegen.c
 * gen_row_unit_ahead); the report says so. */
bool cg_row_ahead(cctx_t *c, const kernel_t *k);
/* The wavefront's limit on a row kernel's iteration space (f32 bytes;
 * codegen.c cg_row_wave): past it the kernel is bound by memory, and three
 * rows' streams at once ran softmax at 16 MB 3-13% slower than the
 * passes one after another (bench_kernels --threads 2, alternated). */
#define CG_WAVE_MAX_BYTES (8.0 * 1024 * 1024)
int cg_row_wave(cctx_t *c, const kernel_t *k);
/* codegen.c: the column step between a wavefront's passes (0: none) */
int64_t cg_row_rotation(cctx_t *c, const kernel_t *k);
/* codegen.c: the heuristic's reason for that choice (kilnc --emit=kernels) */
const char *cg_gemm_why(cctx_t *c, const cnode_t *n);
void sched_mark_fallback_input(cctx_t *c, uint32_t buf, int32_t kernel);
/* The lowered program: compute nodes and their bodies (kilnc --emit=ir). */
char *sched_ir(cctx_t *c);
/* Human-readable fusion report (kilnc --emit=kernels). */
char *sched_report(cctx_t *c);

/* ---- memory plan (memplan.c) ------------------------------------------- */

int memplan(cctx_t *c, kiln_artifact_t *a);

#endif /* KILN_CIR_H */
