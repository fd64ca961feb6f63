/*
 * lower.h — what the op lowering files (lower.c, ops_*.c, decompose.c)
 * share: the node being lowered, argument access, operands and promotion.
 */
#ifndef KILN_LOWER_H
#define KILN_LOWER_H

#include "compiler/cir.h"

struct lnode {
	cctx_t *c;
	const kiln_node_t *n;
	uint32_t index;
	int param; /* from the op table: which variant of a shared lowering */
	/* where set, lset puts output k in capture[k], unchecked, instead of
	 * the graph's value: a lowering that runs another one's forms on
	 * operands of its own (a transposed convolution is the input gradient
	 * of a convolution, its backward a convolution and a weight gradient:
	 * ops_conv.c) */
	lt_t **capture;
};

/* Formats "node N (op): ..." into the context's error buffer. */
int lerr(lnode_t *n, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Positional argument pos, else keyword `name`; NULL when absent. */
const kiln_arg_t *larg(lnode_t *n, uint32_t pos, const char *name);
int ltensor(lnode_t *n, uint32_t pos, const char *name, lt_t **out);
int ltensor_opt(lnode_t *n, uint32_t pos, const char *name, lt_t **out);
int lint(lnode_t *n, uint32_t pos, const char *name, int64_t def, int64_t *out);
int lbool(lnode_t *n, uint32_t pos, const char *name, bool def, bool *out);
int lfloat(lnode_t *n, uint32_t pos, const char *name, double def, double *out);
int lstr(lnode_t *n, uint32_t pos, const char *name, const char *def,
	 const char **out);
int lintlist(lnode_t *n, uint32_t pos, const char *name, int64_t *vals,
	     uint32_t *count, uint32_t max);
int lsizelist(lnode_t *n, uint32_t pos, const char *name,
	      const kiln_expr_t **vals, uint32_t *count);
int lsymint(lnode_t *n, const kiln_arg_t *a, const kiln_expr_t **out);
/* Normalizes a possibly negative dim. */
int ldim(lnode_t *n, int64_t d, uint32_t rank, uint32_t *out);

const kiln_value_t *lout(lnode_t *n, uint32_t k);
int lout_sizes(lnode_t *n, uint32_t k, uint32_t *rank, kiln_dim_t *sizes,
	       kiln_dtype_t *dt);
/* Checks t against declared output k (rank, sizes) and records it. */
int lset(lnode_t *n, uint32_t k, lt_t *t);

void set_var_ranges(cctx_t *c, uint32_t rank, const kiln_dim_t *sizes);

/* PyTorch's result_type: dim tensors, zero-dim tensors, wrapped scalars. */
typedef struct rtype {
	kiln_dtype_t dim, zero, wrapped; /* KILN_DT__COUNT: none */
} rtype_t;
void rt_init(rtype_t *r);
void rt_tensor(rtype_t *r, const lt_t *t);
void rt_scalar(rtype_t *r, const kiln_arg_t *a);
kiln_dtype_t rt_result(const rtype_t *r);
kiln_dtype_t promote2(kiln_dtype_t a, kiln_dtype_t b);

/* A tensor or a scalar argument. */
typedef struct operand {
	const kiln_arg_t *arg;
	lt_t *t; /* NULL for a scalar */
} operand_t;
int loperand(lnode_t *n, uint32_t pos, const char *name, operand_t *o);
void rt_operand(rtype_t *r, const operand_t *o);
const sx_t *lop_value(lnode_t *n, const operand_t *o, uint32_t rank,
		      const kiln_dim_t *sizes, kiln_dtype_t cdt);
int lbroadcast(lnode_t *n, const operand_t *ops, uint32_t n_ops, uint32_t *rank,
	       kiln_dim_t *sizes);

/* Views (ops_view.c), usable by decompositions. */
lt_t *lt_permute(cctx_t *c, const lt_t *t, const uint32_t *perm);
lt_t *lt_unsqueeze(cctx_t *c, const lt_t *t, uint32_t d);
lt_t *lt_squeeze_dim(cctx_t *c, const lt_t *t, uint32_t d);
lt_t *lt_expand(cctx_t *c, const lt_t *t, uint32_t rank,
		const kiln_dim_t *sizes);
lt_t *lt_reshape(cctx_t *c, const lt_t *t, uint32_t rank,
		 const kiln_dim_t *sizes);
lt_t *lt_slice(cctx_t *c, const lt_t *t, uint32_t d, const kiln_expr_t *start,
	       const kiln_expr_t *len, int64_t step);
/* The concatenation of parts along dim ud, as a function of rank and sizes
 * whose body picks the part (NULL where the parts' sizes at ud do not add
 * up to sizes[ud], or np is 0 or over 64). */
lt_t *lt_cat(cctx_t *c, lt_t *const *parts, uint32_t np, uint32_t ud,
	     kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sizes);
/* Applies a guard to every load in e (for pads, cats). */
const sx_t *sx_guard(cctx_t *c, const sx_t *e, const sx_t *guard);

/* Reductions (ops_reduce.c), usable by decompositions. Reduces t (already
 * in the accumulation dtype) over rmask. */
int lred(lnode_t *n, const lt_t *t, uint32_t rmask, bool keepdim, red_op_t op,
	 kiln_dtype_t out_dt, lt_t **out);
/* Product of the sizes in rmask, as an index expression. */
const kiln_expr_t *lred_count(cctx_t *c, const lt_t *t, uint32_t rmask);
/* Mask from a dim list (empty: all dims). */
int ldims_mask(lnode_t *n, uint32_t pos, const char *name, uint32_t rank,
	       uint32_t *mask);

/* Convenience constructors over lazy tensors of one shape. */
lt_t *lt_map1(cctx_t *c, sx_op_t op, const lt_t *a);
const sx_t *sxf(cctx_t *c, double v, kiln_dtype_t dt);

bool kiln__op_supported(const char *name);

/* P = A @ B (2-d, or 3-d batched) through a gemm compute node; half
 * types are computed in f32 and P is f32 then (ops_gemm.c). */
int lgemm(lnode_t *n, lt_t *a, lt_t *b, kiln_dtype_t dt, lt_t **out);
int lgemm_node(lnode_t *n, const lt_t *a, const lt_t *b, const convspec_t *conv,
	       kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sz,
	       lt_t **out);

/* Layer norm of x over its last nn dims, w and b optional (decompose.c):
 * y in odt, mean and rstd (keepdim, may be NULL) in its compute dtype. */
int lnorm(lnode_t *n, const lt_t *x, uint32_t nn, const lt_t *w, const lt_t *b,
	  double eps, kiln_dtype_t odt, lt_t **y, lt_t **mean, lt_t **rstd);

/* gelu of a float scalar expression (ops_pointwise.c). */
const sx_t *sx_gelu(cctx_t *c, const sx_t *x, bool tanh_approx);
/* elu(v): v·scale where v > 0, else alpha·scale·expm1(v·input_scale) */
const sx_t *sx_elu(cctx_t *c, const sx_t *v, double alpha, double scale,
		   double iscale, kiln_dtype_t dt);

/* Whether value dv is declared dense channels-last; whether t (of dv's
 * sizes) is computed channels-last: the graph computes so (cctx_t.nhwc),
 * dv is declared so and t reads more data that way; t realized so where
 * it is (a view of an NHWC buffer), else contiguous (lower.c). */
bool decl_nhwc(const kiln_value_t *dv);
bool wants_nhwc(cctx_t *c, const kiln_value_t *dv, const lt_t *t);
int realize_as_declared(cctx_t *c, lt_t *t, const kiln_value_t *dv,
			int32_t node, lt_t **out);
/* t [N, C, H, W] computed into a buffer in NHWC order, *out the [N, C, H,
 * W] view of it (channels-last strides). */
int lt_realize_nhwc(cctx_t *c, lt_t *t, int32_t node, lt_t **out);

/* Value v's torch storage: its view base, a buffer laid out as declared
 * (realized so where it is not), torch's storage offset s at element
 * out->offset + s (lower.c). */
int lstorage(lnode_t *n, uint32_t v, lt_t **out);
/* Value v as a strided view of lstorage's buffer: torch's storage offset
 * and strides of v (lower.c). */
int lstorage_view(lnode_t *n, uint32_t v, lt_t **out);

#endif
