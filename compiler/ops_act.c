/*
 * ops_act.c — the activations that the other files do not take, and their
 * backward ops, each computed as torch's CPU kernel computes it:
 *   softplus(x, beta, threshold) = x where x·beta > threshold, else
 *     log1p(exp(x·beta)) / beta; its backward grad · z / (z + 1), z =
 *     exp(x·beta) (grad where x·beta > threshold)
 *   mish(x) = x · tanh(log1p(exp(x))); its backward grad · (t + x · σ(x) ·
 *     (1 - t²)), t = tanh(log1p(exp(x)))
 *   celu(x, alpha) = elu(x, alpha, 1, 1/alpha), as torch calls it
 *   threshold(x, threshold, value) = value where x <= threshold, else x
 *   log_sigmoid_forward(x) = (min(x, 0) - log1p(z), z), z = exp(-|x|); its
 *     backward grad · (1 - z/(1 + z)) where x < 0, else grad · z/(1 + z)
 *   _prelu_kernel(x, w) = x where x > 0, else w · x (broadcast); its
 *     backward (grad where x > 0 else w · grad, 0 where x > 0 else x · grad),
 *     both of the broadcast shape (the graph sums the second to w's)
 *   glu(x, dim) = a · σ(b), a and b x's halves along dim; its backward the
 *     halves' gradients side by side, grad · σ(b) and grad · a · σ(b) ·
 *     (1 - σ(b))
 *   elu_backward(grad, alpha, scale, input_scale, is_result, x or y)
 *   leaky_relu_backward(grad, x, slope) = grad where x > 0, else grad·slope
 * In f16 and bf16 they compute in f32. Each had been a fallback step (the
 * backward ops of ELU, SELU, CELU and LeakyReLU too: their forwards were
 * lowered): Mamba's softplus, YOLO's mish, GANs' leaky_relu in training,
 * gated convolutions' and Conformers' glu, PReLU.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <string.h>

/* The declared dtype of output k, else fallback. */
static kiln_dtype_t out_dtype(lnode_t *n, uint32_t k, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, k);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

/* The floating tensor argument pos, its body in its compute dtype acc. */
static int act_in(lnode_t *n, uint32_t pos, const char *name, lt_t **x,
		  kiln_dtype_t *acc)
{
	int rc = ltensor(n, pos, name, x);
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float((*x)->dtype))
		return lerr(n, KILN_EINVGRAPH,
			    "takes a floating tensor, not %s (%s)",
			    kiln_dtype_name((*x)->dtype), name);
	*acc = compute_dtype((*x)->dtype);
	return 0;
}

/* Output k: r over sizes, in the declared dtype (else dt). */
static int act_out(lnode_t *n, uint32_t k, uint32_t rank,
		   const kiln_dim_t *sizes, const sx_t *r, kiln_dtype_t dt)
{
	kiln_dtype_t odt = out_dtype(n, k, dt);
	return lset(n, k, lt_fn(n->c, odt, rank, sizes, sx_cast(n->c, r, odt)));
}

/* grad_output g and a tensor x broadcast together: their bodies in the
 * compute dtype *acc of their promoted dtype. */
static int bcast_gx(lnode_t *n, lt_t *g, lt_t *x, uint32_t *r,
		    kiln_dim_t *sizes, kiln_dtype_t *acc, const sx_t **gb,
		    const sx_t **xb)
{
	cctx_t *c = n->c;
	operand_t ops[2] = {{NULL, g}, {NULL, x}};
	int rc = lbroadcast(n, ops, 2, r, sizes);
	if (rc != 0)
		return rc;
	*acc = compute_dtype(promote2(g->dtype, x->dtype));
	*gb = sx_cast(c, lt_bcast_body(c, g, *r, sizes), *acc);
	*xb = sx_cast(c, lt_bcast_body(c, x, *r, sizes), *acc);
	return 0;
}

static const sx_t *sigmoid(cctx_t *c, const sx_t *v)
{
	return sx_un(c, OP_SIGMOID, v);
}

/* log1p(exp(v)) */
static const sx_t *log1p_exp(cctx_t *c, const sx_t *v)
{
	return sx_un(c, OP_LOG1P, sx_un(c, OP_EXP, v));
}

/* softplus (0), mish (1), celu (2), threshold (3), log_sigmoid_forward
 * (4): one tensor x. */
int low_act(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	kiln_dtype_t acc = KILN_DT_F32;
	/* threshold takes integer tensors too (torch's does): those stay a
	 * fallback step */
	int rc = n->param == 3 ? ltensor(n, 0, "self", &x) : 0;
	if (rc == 0 && n->param == 3 && !kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EUNSUPOP,
			    "threshold of a %s tensor is not lowered",
			    kiln_dtype_name(x->dtype));
	if (rc == 0)
		rc = act_in(n, 0, "self", &x, &acc);
	double p0 = 1, p1 = 20;
	if (rc == 0 && n->param == 0) {
		rc = lfloat(n, 1, "beta", 1.0, &p0);
		if (rc == 0)
			rc = lfloat(n, 2, "threshold", 20.0, &p1);
		if (rc == 0 && p0 == 0)
			rc = lerr(n, KILN_EINVGRAPH, "beta must not be 0");
	} else if (rc == 0 && n->param == 2) {
		rc = lfloat(n, 1, "alpha", 1.0, &p0);
		if (rc == 0 && p0 == 0)
			rc = lerr(n, KILN_EINVGRAPH, "alpha must not be 0");
	} else if (rc == 0 && n->param == 3) {
		const kiln_arg_t *t = larg(n, 1, "threshold"),
				 *v = larg(n, 2, "value");
		if (t == NULL || v == NULL)
			rc = lerr(n, KILN_EINVGRAPH, "%s: missing number",
				  t == NULL ? "threshold" : "value");
		if (rc == 0)
			rc = lfloat(n, 1, "threshold", 0, &p0);
		if (rc == 0)
			rc = lfloat(n, 2, "value", 0, &p1);
	}
	if (rc != 0)
		return rc;
	const sx_t *v = sx_cast(c, lt_body(c, x), acc), *r;
	const sx_t *zero = sxf(c, 0, acc);
	switch (n->param) {
	case 0: {
		const sx_t *xb = sx_bin(c, OP_MUL, v, sxf(c, p0, acc));
		r = sx_where(
		    c, sx_bin(c, OP_GT, xb, sxf(c, p1, acc)), v,
		    sx_bin(c, OP_DIV, log1p_exp(c, xb), sxf(c, p0, acc)));
		break;
	}
	case 1:
		r = sx_bin(c, OP_MUL, v, sx_un(c, OP_TANH, log1p_exp(c, v)));
		break;
	case 2: r = sx_elu(c, v, p0, 1.0, 1.0 / p0, acc); break;
	case 3:
		r = sx_where(c, sx_bin(c, OP_LE, v, sxf(c, p0, acc)),
			     sxf(c, p1, acc), v);
		break;
	default: {
		const sx_t *z =
		    sx_un(c, OP_EXP, sx_un(c, OP_NEG, sx_un(c, OP_ABS, v)));
		r = sx_bin(c, OP_SUB, sx_bin(c, OP_MIN, v, zero),
			   sx_un(c, OP_LOG1P, z));
		rc = act_out(n, 1, x->rank, x->sizes, z, x->dtype);
		if (rc != 0)
			return rc;
	}
	}
	return act_out(n, 0, x->rank, x->sizes, r, x->dtype);
}

/* softplus_backward (0), mish_backward (1), leaky_relu_backward (2),
 * log_sigmoid_backward (3): grad_output and self, broadcast. */
int low_act_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x;
	kiln_dtype_t acc = KILN_DT_F32, xacc = KILN_DT_F32;
	double p0 = 1, p1 = 20;
	int rc = act_in(n, 0, "grad_output", &g, &acc);
	if (rc == 0)
		rc = act_in(n, 1, "self", &x, &xacc);
	if (rc == 0 && n->param == 0) {
		rc = lfloat(n, 2, "beta", 1.0, &p0);
		if (rc == 0)
			rc = lfloat(n, 3, "threshold", 20.0, &p1);
	} else if (rc == 0 && n->param == 2) {
		rc = lfloat(n, 2, "negative_slope", 0.01, &p0);
	}
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	const sx_t *gb, *xb;
	if (rc == 0)
		rc = bcast_gx(n, g, x, &r, sizes, &acc, &gb, &xb);
	if (rc != 0)
		return rc;
	const sx_t *one = sxf(c, 1, acc), *zero = sxf(c, 0, acc), *v;
	switch (n->param) {
	case 0: {
		const sx_t *xs = sx_bin(c, OP_MUL, xb, sxf(c, p0, acc));
		const sx_t *z = sx_un(c, OP_EXP, xs);
		v = sx_where(c, sx_bin(c, OP_GT, xs, sxf(c, p1, acc)), gb,
			     sx_bin(c, OP_DIV, sx_bin(c, OP_MUL, gb, z),
				    sx_bin(c, OP_ADD, z, one)));
		break;
	}
	case 1: {
		const sx_t *s = sigmoid(c, xb);
		const sx_t *t = sx_un(c, OP_TANH, log1p_exp(c, xb));
		const sx_t *d = sx_bin(
		    c, OP_ADD, t,
		    sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, xb, s),
			   sx_bin(c, OP_SUB, one, sx_bin(c, OP_MUL, t, t))));
		v = sx_bin(c, OP_MUL, gb, d);
		break;
	}
	case 2:
		v = sx_where(c, sx_bin(c, OP_GT, xb, zero), gb,
			     sx_bin(c, OP_MUL, gb, sxf(c, p0, acc)));
		break;
	default: {
		const sx_t *z =
		    sx_un(c, OP_EXP, sx_un(c, OP_NEG, sx_un(c, OP_ABS, xb)));
		const sx_t *q = sx_bin(c, OP_DIV, z, sx_bin(c, OP_ADD, one, z));
		v = sx_where(c, sx_bin(c, OP_LT, xb, zero),
			     sx_bin(c, OP_MUL, gb, sx_bin(c, OP_SUB, one, q)),
			     sx_bin(c, OP_MUL, gb, q));
	}
	}
	return act_out(n, 0, r, sizes, v, g->dtype);
}

/* elu_backward(grad_output, alpha, scale, input_scale, is_result,
 * self_or_result): grad · scale where x > 0 (or the result y > 0), else
 * grad · input_scale · alpha · scale · exp(x · input_scale), or from the
 * result grad · input_scale · (y + alpha · scale). */
int low_elu_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x;
	kiln_dtype_t acc = KILN_DT_F32, xacc = KILN_DT_F32;
	double alpha, scale, iscale;
	bool is_result;
	int rc = act_in(n, 0, "grad_output", &g, &acc);
	if (rc == 0)
		rc = lfloat(n, 1, "alpha", 1.0, &alpha);
	if (rc == 0)
		rc = lfloat(n, 2, "scale", 1.0, &scale);
	if (rc == 0)
		rc = lfloat(n, 3, "input_scale", 1.0, &iscale);
	if (rc == 0)
		rc = lbool(n, 4, "is_result", false, &is_result);
	if (rc == 0)
		rc = act_in(n, 5, "self_or_result", &x, &xacc);
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	const sx_t *gb, *xb;
	if (rc == 0)
		rc = bcast_gx(n, g, x, &r, sizes, &acc, &gb, &xb);
	if (rc != 0)
		return rc;
	const sx_t *neg =
	    is_result
		? sx_bin(c, OP_ADD, xb, sxf(c, alpha * scale, acc))
		: sx_bin(c, OP_MUL, sxf(c, alpha * scale, acc),
			 sx_un(c, OP_EXP,
			       sx_bin(c, OP_MUL, xb, sxf(c, iscale, acc))));
	const sx_t *v = sx_where(
	    c, sx_bin(c, OP_LE, xb, sxf(c, 0, acc)),
	    sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, gb, sxf(c, iscale, acc)), neg),
	    sx_bin(c, OP_MUL, gb, sxf(c, scale, acc)));
	return act_out(n, 0, r, sizes, v, g->dtype);
}

/* _prelu_kernel(self, weight) (param 0) and _prelu_kernel_backward(
 * grad_output, self, weight) (param 1). */
int low_prelu(cctx_t *c, lnode_t *n)
{
	bool bw = n->param == 1;
	lt_t *g = NULL, *x, *w;
	kiln_dtype_t acc = KILN_DT_F32;
	int rc = bw ? act_in(n, 0, "grad_output", &g, &acc) : 0;
	if (rc == 0)
		rc = act_in(n, bw ? 1 : 0, "self", &x, &acc);
	if (rc == 0)
		rc = act_in(n, bw ? 2 : 1, "weight", &w, &acc);
	if (rc != 0)
		return rc;
	operand_t ops[3] = {{NULL, x}, {NULL, w}, {NULL, g}};
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, bw ? 3 : 2, &r, sizes);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = promote2(x->dtype, w->dtype);
	if (bw)
		dt = promote2(dt, g->dtype);
	acc = compute_dtype(dt);
	const sx_t *xb = sx_cast(c, lt_bcast_body(c, x, r, sizes), acc);
	const sx_t *wb = sx_cast(c, lt_bcast_body(c, w, r, sizes), acc);
	const sx_t *pos = sx_bin(c, OP_GT, xb, sxf(c, 0, acc));
	if (!bw)
		return act_out(n, 0, r, sizes,
			       sx_where(c, pos, xb, sx_bin(c, OP_MUL, wb, xb)),
			       dt);
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g, r, sizes), acc);
	rc = act_out(n, 0, r, sizes,
		     sx_where(c, pos, gb, sx_bin(c, OP_MUL, wb, gb)), dt);
	if (rc == 0 && n->n->n_out > 1)
		rc = act_out(
		    n, 1, r, sizes,
		    sx_where(c, pos, sxf(c, 0, acc), sx_bin(c, OP_MUL, xb, gb)),
		    dt);
	return rc;
}

/* glu(self, dim) (param 0) and glu_backward(grad_output, self, dim)
 * (param 1). */
int low_glu(cctx_t *c, lnode_t *n)
{
	bool bw = n->param == 1;
	lt_t *g = NULL, *x;
	kiln_dtype_t acc = KILN_DT_F32;
	int64_t dim;
	int rc = bw ? act_in(n, 0, "grad_output", &g, &acc) : 0;
	if (rc == 0)
		rc = act_in(n, bw ? 1 : 0, "self", &x, &acc);
	if (rc == 0)
		rc = lint(n, bw ? 2 : 1, "dim", -1, &dim);
	if (rc != 0)
		return rc;
	if (x->rank == 0)
		return lerr(n, KILN_EINVGRAPH,
			    "glu does not take a 0-dim tensor");
	if (dim < -(int64_t)x->rank || dim >= (int64_t)x->rank)
		return lerr(n, KILN_EINVGRAPH, "dim %lld out of range",
			    (long long)dim);
	uint32_t d = (uint32_t)(dim < 0 ? dim + x->rank : dim);
	if (x->sizes[d].e != NULL)
		return lerr(n, KILN_EUNSUPOP,
			    "glu along a symbolic size is not lowered");
	int64_t S = x->sizes[d].c, H = S / 2;
	if (S % 2 != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "halving dim %u must be even, not %lld", d,
			    (long long)S);
	kiln_dim_t hs[CIR_MAX_RANK];
	memcpy(hs, x->sizes, sizeof(kiln_dim_t) * x->rank);
	hs[d] = dim_const(H);
	if (bw)
		for (uint32_t k = 0; k < x->rank; k++)
			if (g->rank != x->rank || !dim_eq(g->sizes[k], hs[k]))
				return lerr(n, KILN_EINVGRAPH,
					    "grad_output must be self's shape "
					    "halved along dim");
	const kiln_expr_t *ia[CIR_MAX_RANK], *ib[CIR_MAX_RANK];
	for (uint32_t k = 0; k < x->rank; k++)
		ia[k] = ib[k] = ix_var(c, k);
	if (!bw) {
		ib[d] = ix_add(c, ix_var(c, d), ix_const(c, H));
		const sx_t *a = sx_cast(c, lt_at(c, x, ia), acc);
		const sx_t *b = sx_cast(c, lt_at(c, x, ib), acc);
		return act_out(n, 0, x->rank, hs,
			       sx_bin(c, OP_MUL, a, sigmoid(c, b)), x->dtype);
	}
	/* over self's shape: position s along dim is a's (s < H) or b's */
	set_var_ranges(c, x->rank, x->sizes);
	const sx_t *first = sx_bin(c, OP_LT, sx_index(c, ix_var(c, d)),
				   sx_consti(c, H, KILN_DT_I64));
	const sx_t *second = sx_un(c, OP_NOT, first);
	const kiln_expr_t *ig[CIR_MAX_RANK], *ih[CIR_MAX_RANK];
	for (uint32_t k = 0; k < x->rank; k++)
		ig[k] = ih[k] = ix_var(c, k);
	/* a's gradient at s: grad[s] · σ(x[s + H]) */
	ib[d] = ix_add(c, ix_var(c, d), ix_const(c, H));
	const sx_t *ga = sx_bin(
	    c, OP_MUL, sx_cast(c, sx_guard(c, lt_at(c, g, ig), first), acc),
	    sigmoid(c, sx_cast(c, sx_guard(c, lt_at(c, x, ib), first), acc)));
	/* b's at s: grad[s - H] · x[s - H] · σ(x[s]) · (1 - σ(x[s])) */
	ih[d] = ix_sub(c, ix_var(c, d), ix_const(c, H));
	const sx_t *sb = sigmoid(c, sx_cast(c, lt_at(c, x, ia), acc));
	const sx_t *gbv = sx_bin(
	    c, OP_MUL,
	    sx_bin(c, OP_MUL,
		   sx_cast(c, sx_guard(c, lt_at(c, g, ih), second), acc),
		   sx_cast(c, sx_guard(c, lt_at(c, x, ih), second), acc)),
	    sx_bin(c, OP_MUL, sb, sx_bin(c, OP_SUB, sxf(c, 1, acc), sb)));
	set_var_ranges(c, 0, NULL);
	return act_out(n, 0, x->rank, x->sizes, sx_where(c, first, ga, gbv),
		       g->dtype);
}
