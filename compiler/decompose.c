/*
 * decompose.c — composite ATen ops as primitives (pointwise, reductions,
 * views). The scheduler fuses the pieces back: softmax and layer_norm end
 * up as one kernel each (a row loop with two or three passes over the row).
 *
 *   _softmax            m = amax(x); e = exp(x - m); out = e / sum(e)
 *   _safe_softmax       the same, 0 in rows of only -inf (SDPA's math path)
 *   _log_softmax        out = x - m - log(sum(exp(x - m)))
 *   native_layer_norm   mean = sum(x)/N; var = sum((x-mean)^2)/N;
 *                       rstd = rsqrt(var + eps); out = (x-mean)*rstd*w + b
 *   batch_norm (eval)   out = (x - rm) * rsqrt(rv + eps) * w + b
 *   and the backward ops of these and of the activations.
 */
#include "compiler/ops.h"
#include "compiler/rng.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static kiln_dtype_t decl_dt(lnode_t *n, uint32_t k, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, k);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

/* t in dtype dt (a lazy cast when it differs). */
static lt_t *as_dt(cctx_t *c, const lt_t *t, kiln_dtype_t dt)
{
	if (compute_dtype(t->dtype) == compute_dtype(dt)) {
		lt_t *u = cir_alloc(c, sizeof(*u));
		if (u != NULL)
			*u = *t;
		return u;
	}
	return lt_fn(c, dt, t->rank, t->sizes, sx_cast(c, lt_body(c, t), dt));
}

int low_softmax(cctx_t *c, lnode_t *n)
{
	lt_t *x0;
	int64_t d;
	int rc = ltensor(n, 0, "self", &x0);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x0->rank, &ud);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x0->dtype);
	if (!kiln_dtype_is_float(odt))
		return lerr(n, KILN_EINVGRAPH, "softmax needs a float dtype");
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *x = as_dt(c, x0, acc);
	if (x == NULL)
		return -ENOMEM;
	if (x->rank == 0) {
		const sx_t *v = n->param == 1 ? sxf(c, 0, acc) : sxf(c, 1, acc);
		if (n->param == 2) /* _safe_softmax(-inf) = 0 */
			v = sx_where(c,
				     sx_bin(c, OP_EQ, lt_body(c, x),
					    sxf(c, -INFINITY, acc)),
				     sxf(c, 0, acc), v);
		return lset(n, 0, lt_fn(c, odt, 0, NULL, v));
	}
	uint32_t mask = 1u << ud;
	lt_t *m;
	rc = lred(n, x, mask, true, RED_MAXNP, acc, &m);
	if (rc != 0)
		return rc;
	/* an all -inf row: shift by 0 (gives nan like torch) */
	const sx_t *xb = lt_body(c, x);
	const sx_t *mb = lt_bcast_body(c, m, x->rank, x->sizes);
	const sx_t *sh = sx_bin(c, OP_SUB, xb, mb);
	/* exp(x - max), x - max <= 0 (or NaN): OP_EXPSUB (mathfn.c), in
	 * base 2 on AVX-512 where max is one value along the row */
	const sx_t *ex = sx_bin(c, OP_EXPSUB, xb, mb);
	lt_t *e = lt_fn(c, acc, x->rank, x->sizes, ex);
	lt_t *s;
	if (e == NULL)
		return -ENOMEM;
	if (n->param != 1) {
		/* exp(x - max) is needed twice: computed once, kept in a
		 * per-row scratch by the scheduler (or memory) */
		rc = lt_realize(c, e, (int32_t)n->index, &e);
		if (rc != 0)
			return rc;
	}
	rc = lred(n, e, mask, true, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	const sx_t *sb = lt_bcast_body(c, s, x->rank, x->sizes);
	const sx_t *out =
	    n->param != 1
		? sx_bin(c, OP_MUL, lt_body(c, e), sx_un(c, OP_RECIP, sb))
		: sx_bin(c, OP_SUB, sh, sx_un(c, OP_LOG, sb));
	if (n->param == 2) {
		/* _safe_softmax: a row of only -inf is 0 (torch: all(x ==
		 * -inf) along dim) */
		lt_t *ninf =
		    lt_fn(c, KILN_DT_BOOL, x->rank, x->sizes,
			  sx_bin(c, OP_EQ, xb, sxf(c, -INFINITY, acc)));
		lt_t *all;
		if (ninf == NULL)
			return -ENOMEM;
		rc = lred(n, ninf, mask, true, RED_ALL, KILN_DT_BOOL, &all);
		if (rc != 0)
			return rc;
		out = sx_where(c, lt_bcast_body(c, all, x->rank, x->sizes),
			       sxf(c, 0, acc), out);
	}
	return lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, out));
}

int low_softmax_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g0, *y0;
	int64_t d;
	int rc = ltensor(n, 0, "grad_output", &g0);
	if (rc == 0)
		rc = ltensor(n, 1, "output", &y0);
	if (rc == 0)
		rc = lint(n, 2, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, y0->rank, &ud);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, g0->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *g = as_dt(c, g0, acc), *y = as_dt(c, y0, acc);
	if (g == NULL || y == NULL)
		return -ENOMEM;
	if (g->rank != y->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "grad_output and output ranks differ");
	for (uint32_t k = 0; k < g->rank; k++)
		if (!dim_eq(g->sizes[k], y->sizes[k]))
			return lerr(n, KILN_EINVGRAPH,
				    "grad_output and output shapes differ at "
				    "dim %u",
				    k);
	const sx_t *gb = lt_body(c, g), *yb = lt_body(c, y);
	uint32_t mask = g->rank ? 1u << ud : 0;
	const sx_t *out;
	if (n->param == 0) {
		/* y * (g - sum(g*y)) */
		lt_t *gy =
		    lt_fn(c, acc, g->rank, g->sizes, sx_bin(c, OP_MUL, gb, yb));
		lt_t *s;
		if (gy == NULL)
			return -ENOMEM;
		rc = lred(n, gy, mask, true, RED_SUM, acc, &s);
		if (rc != 0)
			return rc;
		out = sx_bin(c, OP_MUL, yb,
			     sx_bin(c, OP_SUB, gb,
				    lt_bcast_body(c, s, g->rank, g->sizes)));
	} else {
		/* g - exp(y) * sum(g) */
		lt_t *s;
		rc = lred(n, g, mask, true, RED_SUM, acc, &s);
		if (rc != 0)
			return rc;
		out = sx_bin(c, OP_SUB, gb,
			     sx_bin(c, OP_MUL, sx_un(c, OP_EXP, yb),
				    lt_bcast_body(c, s, g->rank, g->sizes)));
	}
	return lset(n, 0, lt_fn(c, odt, g->rank, g->sizes, out));
}

/* The mask of the last `nn` dims of a rank-r tensor. */
static uint32_t last_dims(uint32_t r, uint32_t nn)
{
	uint32_t m = 0;
	for (uint32_t k = r - nn; k < r; k++)
		m |= 1u << k;
	return m;
}

/* Layer norm of x0 over its last nn dims (w, b: optional, of those dims'
 * shape): y in odt; mean and rstd (keepdim) in odt's compute dtype. */
int lnorm(lnode_t *n, const lt_t *x0, uint32_t nn, const lt_t *w, const lt_t *b,
	  double eps, kiln_dtype_t odt, lt_t **yo, lt_t **meano, lt_t **rstdo)
{
	cctx_t *c = n->c;
	uint32_t r = x0->rank;
	int rc;
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *x = as_dt(c, x0, acc);
	if (x == NULL)
		return -ENOMEM;
	uint32_t mask = last_dims(r, nn);
	lt_t *s;
	rc = lred(n, x, mask, true, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	const sx_t *cnt = sx_cast(c, sx_index(c, lred_count(c, x, mask)), acc);
	lt_t *mean = lt_fn(c, acc, s->rank, s->sizes,
			   sx_bin(c, OP_DIV, lt_body(c, s), cnt));
	if (mean == NULL)
		return -ENOMEM;
	const sx_t *xc = sx_bin(c, OP_SUB, lt_body(c, x),
				lt_bcast_body(c, mean, r, x->sizes));
	lt_t *sq = lt_fn(c, acc, r, x->sizes, sx_bin(c, OP_MUL, xc, xc));
	lt_t *ss;
	if (sq == NULL)
		return -ENOMEM;
	rc = lred(n, sq, mask, true, RED_SUM, acc, &ss);
	if (rc != 0)
		return rc;
	const sx_t *var = sx_bin(c, OP_DIV, lt_body(c, ss), cnt);
	lt_t *rstd =
	    lt_fn(c, acc, ss->rank, ss->sizes,
		  sx_un(c, OP_RSQRT, sx_bin(c, OP_ADD, var, sxf(c, eps, acc))));
	if (rstd == NULL)
		return -ENOMEM;
	const sx_t *y =
	    sx_bin(c, OP_MUL, xc, lt_bcast_body(c, rstd, r, x->sizes));
	if (w != NULL)
		y = sx_bin(c, OP_MUL, y,
			   sx_cast(c, lt_bcast_body(c, w, r, x->sizes), acc));
	if (b != NULL)
		y = sx_bin(c, OP_ADD, y,
			   sx_cast(c, lt_bcast_body(c, b, r, x->sizes), acc));
	*yo = lt_fn(c, odt, r, x->sizes, y);
	if (meano != NULL)
		*meano = mean;
	if (rstdo != NULL)
		*rstdo = rstd;
	return *yo ? 0 : -ENOMEM;
}

int low_layer_norm(cctx_t *c, lnode_t *n)
{
	lt_t *x0, *w, *b;
	double eps;
	const kiln_expr_t *ns[CIR_MAX_RANK];
	uint32_t nn;
	int rc = ltensor(n, 0, "input", &x0);
	if (rc == 0)
		rc = lsizelist(n, 1, "normalized_shape", ns, &nn);
	if (rc == 0)
		rc = ltensor_opt(n, 2, "weight", &w);
	if (rc == 0)
		rc = ltensor_opt(n, 3, "bias", &b);
	if (rc == 0)
		rc = lfloat(n, 4, "eps", 1e-5, &eps);
	if (rc != 0)
		return rc;
	if (nn == 0 || nn > x0->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "normalized_shape must have 1..rank dims");
	uint32_t r = x0->rank;
	for (uint32_t i = 0; i < nn; i++)
		if (!dim_eq(dim_of(ns[i]), x0->sizes[r - nn + i]))
			return lerr(n, KILN_EINVGRAPH,
				    "normalized_shape does not match the "
				    "input's last %u dims",
				    nn);
	lt_t *y, *mean, *rstd;
	rc = lnorm(n, x0, nn, w, b, eps, decl_dt(n, 0, x0->dtype), &y, &mean,
		   &rstd);
	if (rc == 0)
		rc = lset(n, 0, y);
	if (rc == 0 && n->n->n_out > 1)
		rc = lset(n, 1, as_dt(c, mean, decl_dt(n, 1, mean->dtype)));
	if (rc == 0 && n->n->n_out > 2)
		rc = lset(n, 2, as_dt(c, rstd, decl_dt(n, 2, rstd->dtype)));
	return rc;
}

int low_layer_norm_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g0, *x0, *mean, *rstd, *w, *b;
	const kiln_expr_t *ns[CIR_MAX_RANK];
	uint32_t nn;
	int rc = ltensor(n, 0, "grad_out", &g0);
	if (rc == 0)
		rc = ltensor(n, 1, "input", &x0);
	if (rc == 0)
		rc = lsizelist(n, 2, "normalized_shape", ns, &nn);
	if (rc == 0)
		rc = ltensor(n, 3, "mean", &mean);
	if (rc == 0)
		rc = ltensor(n, 4, "rstd", &rstd);
	if (rc == 0)
		rc = ltensor_opt(n, 5, "weight", &w);
	if (rc == 0)
		rc = ltensor_opt(n, 6, "bias", &b);
	if (rc != 0)
		return rc;
	const kiln_arg_t *om = larg(n, 7, "output_mask");
	bool mask3[3] = {true, true, true};
	if (om != NULL && om->kind == KILN_ARG_LIST && om->n == 3)
		for (uint32_t i = 0; i < 3; i++)
			mask3[i] = om->u.list[i].kind == KILN_ARG_BOOL &&
				   om->u.list[i].u.b;
	uint32_t r = x0->rank;
	if (nn == 0 || nn > r)
		return lerr(n, KILN_EINVGRAPH,
			    "normalized_shape must have 1..rank dims");
	kiln_dtype_t odt = decl_dt(n, 0, x0->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *g = as_dt(c, g0, acc), *x = as_dt(c, x0, acc);
	if (g == NULL || x == NULL)
		return -ENOMEM;
	uint32_t mask = last_dims(r, nn);
	const sx_t *mb = sx_cast(c, lt_bcast_body(c, mean, r, x->sizes), acc);
	const sx_t *rb = sx_cast(c, lt_bcast_body(c, rstd, r, x->sizes), acc);
	const sx_t *xhat =
	    sx_bin(c, OP_MUL, sx_bin(c, OP_SUB, lt_body(c, x), mb), rb);
	const sx_t *gb = lt_body(c, g);
	const sx_t *gw =
	    w ? sx_bin(c, OP_MUL, gb,
		       sx_cast(c, lt_bcast_body(c, w, r, x->sizes), acc))
	      : gb;
	if (mask3[0]) {
		/* dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) */
		lt_t *a = lt_fn(c, acc, r, x->sizes, gw);
		lt_t *bt =
		    lt_fn(c, acc, r, x->sizes, sx_bin(c, OP_MUL, gw, xhat));
		lt_t *sa, *sb;
		if (a == NULL || bt == NULL)
			return -ENOMEM;
		rc = lred(n, a, mask, true, RED_SUM, acc, &sa);
		if (rc == 0)
			rc = lred(n, bt, mask, true, RED_SUM, acc, &sb);
		if (rc != 0)
			return rc;
		const sx_t *cnt =
		    sx_cast(c, sx_index(c, lred_count(c, x, mask)), acc);
		const sx_t *ma =
		    sx_bin(c, OP_DIV, lt_bcast_body(c, sa, r, x->sizes), cnt);
		const sx_t *mbb =
		    sx_bin(c, OP_DIV, lt_bcast_body(c, sb, r, x->sizes), cnt);
		const sx_t *dx =
		    sx_bin(c, OP_MUL, rb,
			   sx_bin(c, OP_SUB, sx_bin(c, OP_SUB, gw, ma),
				  sx_bin(c, OP_MUL, xhat, mbb)));
		rc = lset(n, 0, lt_fn(c, odt, r, x->sizes, dx));
		if (rc != 0)
			return rc;
	}
	/* dw = sum over the batch dims of g * xhat; db = sum of g */
	uint32_t bmask = (uint32_t)((1ull << r) - 1) & ~mask;
	if (mask3[1] && w != NULL && n->n->n_out > 1) {
		lt_t *t =
		    lt_fn(c, acc, r, x->sizes, sx_bin(c, OP_MUL, gb, xhat));
		lt_t *s;
		if (t == NULL)
			return -ENOMEM;
		rc = lred(n, t, bmask, false, RED_SUM, acc, &s);
		if (rc == 0)
			rc = lset(n, 1, as_dt(c, s, decl_dt(n, 1, acc)));
		if (rc != 0)
			return rc;
	}
	if (mask3[2] && b != NULL && n->n->n_out > 2) {
		lt_t *s;
		rc = lred(n, g, bmask, false, RED_SUM, acc, &s);
		if (rc == 0)
			rc = lset(n, 2, as_dt(c, s, decl_dt(n, 2, acc)));
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* _native_batch_norm_legit_no_training (0): (input, weight, bias,
 * running_mean, running_var, momentum, eps); native_batch_norm (1):
 * (input, weight, bias, running_mean, running_var, training, momentum, eps)
 * with training false. */
int low_batch_norm_eval(cctx_t *c, lnode_t *n)
{
	lt_t *x0, *w, *b, *rm, *rv;
	double eps;
	bool training = false;
	int rc = ltensor(n, 0, "input", &x0);
	if (rc == 0)
		rc = ltensor_opt(n, 1, "weight", &w);
	if (rc == 0)
		rc = ltensor_opt(n, 2, "bias", &b);
	if (rc == 0)
		rc = ltensor_opt(n, 3, "running_mean", &rm);
	if (rc == 0)
		rc = ltensor_opt(n, 4, "running_var", &rv);
	if (rc == 0 && n->param == 1)
		rc = lbool(n, 5, "training", false, &training);
	if (rc == 0)
		rc = lfloat(n, n->param == 1 ? 7 : 6, "eps", 1e-5, &eps);
	if (rc != 0)
		return rc;
	if (training || rm == NULL || rv == NULL)
		return lerr(n, KILN_EUNSUPOP,
			    "batch_norm with batch statistics is not lowered "
			    "yet");
	if (x0->rank < 2)
		return lerr(n, KILN_EINVGRAPH,
			    "batch_norm needs an input of rank >= 2");
	kiln_dtype_t odt = decl_dt(n, 0, x0->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	uint32_t r = x0->rank;
	/* per-channel values broadcast along dim 1 */
	const kiln_expr_t *cidx[1] = {ix_var(c, 1)};
#define CH(t) sx_cast(c, lt_at(c, (t), cidx), acc)
	const sx_t *scale =
	    sx_un(c, OP_RSQRT, sx_bin(c, OP_ADD, CH(rv), sxf(c, eps, acc)));
	if (w != NULL)
		scale = sx_bin(c, OP_MUL, scale, CH(w));
	const sx_t *y = sx_bin(
	    c, OP_MUL,
	    sx_bin(c, OP_SUB, sx_cast(c, lt_body(c, x0), acc), CH(rm)), scale);
	if (b != NULL)
		y = sx_bin(c, OP_ADD, y, CH(b));
#undef CH
	rc = lset(n, 0, lt_fn(c, odt, r, x0->sizes, y));
	/* save_mean / save_rstd: empty in eval mode */
	for (uint32_t k = 1; rc == 0 && k < n->n->n_out && k < 3; k++) {
		uint32_t rk;
		kiln_dim_t sz[CIR_MAX_RANK];
		kiln_dtype_t dt;
		rc = lout_sizes(n, k, &rk, sz, &dt);
		if (rc == 0)
			rc = lset(n, k, lt_fn(c, dt, rk, sz, sxf(c, 0, dt)));
	}
	return rc;
}

int low_gelu_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x;
	const char *approx;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = ltensor(n, 1, "self", &x);
	if (rc == 0)
		rc = lstr(n, 2, "approximate", "none", &approx);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	operand_t ops[2] = {{NULL, g}, {NULL, x}};
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &r, sizes);
	if (rc != 0)
		return rc;
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g, r, sizes), acc);
	const sx_t *xb = sx_cast(c, lt_bcast_body(c, x, r, sizes), acc);
	const sx_t *d;
	if (strcmp(approx, "tanh") == 0) {
		/* torch: kBeta = √2·2/√π·0.5; inner = kBeta (x + kKappa x³);
		 * t = tanh(inner); left = x/2; right = 1 + t;
		 * left_d = right/2; right_d = (1 - t²)·kBeta·(1 + 3kKappa x²)
		 * d = left·right_d + left_d */
		const double kb = 0.7978845608028654, kk = 0.044715;
		const sx_t *x2 = sx_bin(c, OP_MUL, xb, xb);
		const sx_t *inner =
		    sx_bin(c, OP_MUL, sxf(c, kb, acc),
			   sx_bin(c, OP_ADD, xb,
				  sx_bin(c, OP_MUL, sxf(c, kk, acc),
					 sx_bin(c, OP_MUL, x2, xb))));
		const sx_t *t = sx_un(c, OP_TANH, inner);
		const sx_t *left = sx_bin(c, OP_MUL, sxf(c, 0.5, acc), xb);
		const sx_t *right = sx_bin(c, OP_ADD, sxf(c, 1, acc), t);
		const sx_t *ld = sx_bin(c, OP_MUL, sxf(c, 0.5, acc), right);
		const sx_t *rd =
		    sx_bin(c, OP_MUL,
			   sx_bin(c, OP_MUL,
				  sx_bin(c, OP_SUB, sxf(c, 1, acc),
					 sx_bin(c, OP_MUL, t, t)),
				  sxf(c, kb, acc)),
			   sx_bin(c, OP_ADD, sxf(c, 1, acc),
				  sx_bin(c, OP_MUL, sxf(c, 3 * kk, acc), x2)));
		d = sx_bin(c, OP_ADD, sx_bin(c, OP_MUL, left, rd), ld);
	} else {
		/* cdf + x·pdf; cdf = (1 + erf(x/√2))/2,
		 * pdf = exp(-x²/2)/√(2π) */
		const sx_t *cdf = sx_un(c, OP_PHI, xb);
		const sx_t *pdf =
		    sx_bin(c, OP_MUL, sxf(c, 0.3989422804014327, acc),
			   sx_un(c, OP_EXPNP,
				 sx_bin(c, OP_MUL, sxf(c, -0.5, acc),
					sx_bin(c, OP_MUL, xb, xb))));
		d = sx_bin(c, OP_ADD, cdf, sx_bin(c, OP_MUL, xb, pdf));
	}
	return lset(n, 0, lt_fn(c, odt, r, sizes, sx_bin(c, OP_MUL, gb, d)));
}

/* grad_output where x (broadcast with it) is inside the op's open range,
 * else 0: threshold_backward zeroes x <= threshold; hardtanh_backward
 * (hardtanh = true) zeroes x <= min_val or x >= max_val. A NaN x keeps the
 * gradient, as in torch. */
static int masked_grad(cctx_t *c, lnode_t *n, bool hardtanh)
{
	lt_t *g, *x;
	double lo, hi = 0;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = ltensor(n, 1, "self", &x);
	if (rc == 0)
		rc = hardtanh ? lfloat(n, 2, "min_val", -1.0, &lo)
			      : lfloat(n, 2, "threshold", 0, &lo);
	if (rc == 0 && hardtanh)
		rc = lfloat(n, 3, "max_val", 1.0, &hi);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, g->dtype);
	operand_t ops[2] = {{NULL, g}, {NULL, x}};
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &r, sizes);
	if (rc != 0)
		return rc;
	const sx_t *xb = lt_bcast_body(c, x, r, sizes);
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g, r, sizes), odt);
	const sx_t *out = sx_bin(c, OP_LE, xb, sxf(c, lo, x->dtype));
	if (hardtanh)
		out = sx_bin(c, OP_OR, out,
			     sx_bin(c, OP_GE, xb, sxf(c, hi, x->dtype)));
	return lset(
	    n, 0,
	    lt_fn(c, odt, r, sizes, sx_where(c, out, sxf(c, 0, odt), gb)));
}

int low_threshold_backward(cctx_t *c, lnode_t *n)
{
	return masked_grad(c, n, false);
}

int low_hardtanh_backward(cctx_t *c, lnode_t *n)
{
	return masked_grad(c, n, true);
}

/* native_dropout_backward(grad_output, mask, scale) = grad · mask · scale,
 * in that order, as torch computes it (a NaN gradient under a dropped
 * element stays NaN). The mask comes from kiln.dropout (below) when the
 * torch backend rewrote the forward, else from torch's native_dropout (a
 * fallback step). */
int low_dropout_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *m;
	double scale;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = ltensor(n, 1, "mask", &m);
	if (rc == 0)
		rc = lfloat(n, 2, "scale", 1.0, &scale);
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float(g->dtype))
		return lerr(n, KILN_EINVGRAPH, "grad_output must be floating");
	if (m->dtype != KILN_DT_BOOL && m->dtype != KILN_DT_U8)
		return lerr(n, KILN_EINVGRAPH, "mask must be bool, not %s",
			    kiln_dtype_name(m->dtype));
	kiln_dtype_t odt = decl_dt(n, 0, g->dtype);
	operand_t ops[2] = {{NULL, g}, {NULL, m}};
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &r, sizes);
	if (rc != 0)
		return rc;
	kiln_dtype_t cdt = compute_dtype(odt);
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g, r, sizes), cdt);
	const sx_t *mb = sx_cast(c, lt_bcast_body(c, m, r, sizes), cdt);
	const sx_t *v =
	    sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, gb, mb), sxf(c, scale, cdt));
	return lset(n, 0, lt_fn(c, odt, r, sizes, sx_cast(c, v, odt)));
}

/* Logical z >> k of an i64 value (the IR's >> is arithmetic on i64). */
static const sx_t *lshr64(cctx_t *c, const sx_t *z, int k)
{
	const sx_t *sh = sx_bin(c, OP_SHR, z, sx_consti(c, k, KILN_DT_I64));
	return sx_bin(c, OP_BITAND, sh,
		      sx_consti(c, (int64_t)(UINT64_MAX >> k), KILN_DT_I64));
}

/* kiln.dropout(input, p, seed, stream) -> (output, mask): torch's
 * native_dropout in training, with kiln's counter-based bits (rng.h)
 * drawn from the i64 scalar tensor `seed` (a graph input the torch backend
 * refills on every call) and the op's `stream`. output = input · mask ·
 * 1/(1-p) in that order (0 for p = 1), mask = the kept elements. */
int low_kiln_dropout(cctx_t *c, lnode_t *n)
{
	lt_t *x, *s;
	double p;
	int64_t stream;
	int rc = ltensor(n, 0, "input", &x);
	if (rc == 0)
		rc = lfloat(n, 1, "p", NAN, &p);
	if (rc == 0)
		rc = ltensor(n, 2, "seed", &s);
	if (rc == 0)
		rc = lint(n, 3, "stream", 0, &stream);
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH, "input must be floating");
	if (!(p >= 0 && p <= 1))
		return lerr(n, KILN_EINVGRAPH, "p must be in [0, 1], not %g",
			    p);
	if (s->dtype != KILN_DT_I64 || s->rank != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "seed must be an i64 scalar tensor (shape [])");
	if (stream < 0)
		return lerr(n, KILN_EINVGRAPH, "stream must be >= 0");
	uint32_t r = x->rank;
	const kiln_expr_t *lin = ix_const(c, 0);
	for (uint32_t k = 0; k < r; k++)
		lin = ix_add(c, ix_mul(c, lin, ix_dim(c, x->sizes[k])),
			     ix_var(c, k));
	const kiln_dtype_t I = KILN_DT_I64;
	const sx_t *seed = lt_bcast_body(c, s, r, x->sizes);
	/* (i + 1) * golden + stream * K, the constant part folded here in
	 * unsigned arithmetic */
	uint64_t k0 = KILN_RNG_GOLDEN + (uint64_t)stream * KILN_RNG_STREAM;
	const sx_t *z =
	    sx_bin(c, OP_ADD, seed,
		   sx_bin(c, OP_ADD,
			  sx_bin(c, OP_MUL, sx_index(c, lin),
				 sx_consti(c, (int64_t)KILN_RNG_GOLDEN, I)),
			  sx_consti(c, (int64_t)k0, I)));
	z = sx_bin(c, OP_MUL, sx_bin(c, OP_BITXOR, z, lshr64(c, z, 30)),
		   sx_consti(c, (int64_t)KILN_RNG_C1, I));
	z = sx_bin(c, OP_MUL, sx_bin(c, OP_BITXOR, z, lshr64(c, z, 27)),
		   sx_consti(c, (int64_t)KILN_RNG_C2, I));
	z = sx_bin(c, OP_BITXOR, z, lshr64(c, z, 31));
	const sx_t *u = lshr64(c, z, 64 - KILN_RNG_BITS);
	const sx_t *keep =
	    sx_bin(c, OP_GE, u, sx_consti(c, kiln_rng_keep_from(p), I));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t cdt = compute_dtype(odt);
	double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
	const sx_t *xb = sx_cast(c, lt_body(c, x), cdt);
	const sx_t *v =
	    sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, xb, sx_cast(c, keep, cdt)),
		   sxf(c, scale, cdt));
	rc = lset(n, 0, lt_fn(c, odt, r, x->sizes, sx_cast(c, v, odt)));
	if (rc == 0)
		rc = lset(n, 1,
			  lt_fn(c, KILN_DT_BOOL, r, x->sizes,
				sx_cast(c, keep, KILN_DT_BOOL)));
	return rc;
}

/* grad · f(out) for sigmoid (out(1-out)) and tanh (1-out²); grad · f'(x)
 * for silu, and torch's hardswish (0 up to -3, x/3 + 1/2 below 3, 1 from
 * 3 on: torch's kernel at the breakpoints) and hardsigmoid (1/6 strictly
 * between -3 and 3, else 0), which MobileNetV3 and LeViT train through. */
static int act_backward(cctx_t *c, lnode_t *n, int which)
{
	lt_t *g, *y;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = ltensor(n, 1, which >= 2 ? "self" : "output", &y);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, g->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	operand_t ops[2] = {{NULL, g}, {NULL, y}};
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &r, sizes);
	if (rc != 0)
		return rc;
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g, r, sizes), acc);
	const sx_t *yb = sx_cast(c, lt_bcast_body(c, y, r, sizes), acc);
	const sx_t *one = sxf(c, 1, acc);
	const sx_t *d;
	if (which == 0) {
		d = sx_bin(c, OP_MUL, yb, sx_bin(c, OP_SUB, one, yb));
	} else if (which == 1) {
		d = sx_bin(c, OP_SUB, one, sx_bin(c, OP_MUL, yb, yb));
	} else if (which == 2) {
		/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) */
		const sx_t *s = sx_un(c, OP_SIGMOID, yb);
		d = sx_bin(
		    c, OP_MUL, s,
		    sx_bin(c, OP_ADD, one,
			   sx_bin(c, OP_MUL, yb, sx_bin(c, OP_SUB, one, s))));
	} else {
		/* as torch's CPU kernels: grad·(x/3 + 0.5), grad·(1/6) */
		const sx_t *three = sxf(c, 3, acc), *m3 = sxf(c, -3, acc);
		const sx_t *zero = sxf(c, 0, acc);
		const sx_t *v;
		if (which == 3)
			v = sx_where(
			    c, sx_bin(c, OP_LE, yb, m3), zero,
			    sx_where(c, sx_bin(c, OP_LT, yb, three),
				     sx_bin(c, OP_MUL, gb,
					    sx_bin(c, OP_ADD,
						   sx_bin(c, OP_DIV, yb, three),
						   sxf(c, 0.5, acc))),
				     gb));
		else
			v = sx_where(c,
				     sx_bin(c, OP_AND, sx_bin(c, OP_GT, yb, m3),
					    sx_bin(c, OP_LT, yb, three)),
				     sx_bin(c, OP_MUL, gb,
					    sxf(c, (double)(1.0f / 6.0f), acc)),
				     zero);
		return lset(n, 0, lt_fn(c, odt, r, sizes, sx_cast(c, v, odt)));
	}
	return lset(n, 0, lt_fn(c, odt, r, sizes, sx_bin(c, OP_MUL, gb, d)));
}

int low_sigmoid_backward(cctx_t *c, lnode_t *n)
{
	return act_backward(c, n, 0);
}

int low_tanh_backward(cctx_t *c, lnode_t *n)
{
	return act_backward(c, n, 1);
}

int low_silu_backward(cctx_t *c, lnode_t *n)
{
	return act_backward(c, n, 2);
}

int low_hardswish_backward(cctx_t *c, lnode_t *n)
{
	return act_backward(c, n, 3);
}

int low_hardsigmoid_backward(cctx_t *c, lnode_t *n)
{
	return act_backward(c, n, 4);
}

/* _weight_norm_interface(v, g, dim) -> (w, norms) (param 0) and
 * _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms,
 * dim) -> (grad_v, grad_g) (param 1), as torch's CPU kernels, over the
 * slices of v along dim (g and norms: v's shape with 1 elsewhere):
 *   norms  = sqrt(Σ v²) over every dim but dim
 *   w      = v · (g / norms)
 *   grad_g = Σ grad_w · v / norms
 *   grad_v = g / norms · (grad_w − v · (grad_g / norms)) */
int low_weight_norm(cctx_t *c, lnode_t *n)
{
	bool bw = n->param == 1;
	lt_t *gw0 = NULL, *v0, *g0, *nt0 = NULL;
	int64_t d;
	uint32_t p = bw ? 1 : 0, ud;
	int rc = bw ? ltensor(n, 0, "grad_w", &gw0) : 0;
	if (rc == 0)
		rc = ltensor(n, p, bw ? "saved_v" : "v", &v0);
	if (rc == 0)
		rc = ltensor(n, p + 1, bw ? "saved_g" : "g", &g0);
	if (rc == 0 && bw)
		rc = ltensor(n, 3, "saved_norms", &nt0);
	if (rc == 0)
		rc = lint(n, bw ? 4 : 2, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t r = v0->rank;
	if (r == 0)
		return lerr(n, KILN_EINVGRAPH, "v must have a dim");
	if (!kiln_dtype_is_float(v0->dtype))
		return lerr(n, KILN_EINVGRAPH, "v must be floating, not %s",
			    kiln_dtype_name(v0->dtype));
	rc = ldim(n, d, r, &ud);
	if (rc != 0)
		return rc;
	const lt_t *chk[3] = {g0, nt0, gw0};
	const char *names[3] = {"g", "norms", "grad_w"};
	for (uint32_t i = 0; i < 3; i++) {
		const lt_t *t = chk[i];
		if (t == NULL)
			continue;
		bool ok = t->rank == r;
		for (uint32_t k = 0; k < r && ok; k++)
			ok = i == 2 || k == ud
				 ? dim_eq(t->sizes[k], v0->sizes[k])
				 : dim_is(t->sizes[k], 1);
		if (!ok)
			return lerr(n, KILN_EINVGRAPH,
				    "%s must have v's shape%s", names[i],
				    i == 2 ? ""
					   : " with 1 in every dim but dim");
	}
	kiln_dtype_t acc = compute_dtype(v0->dtype);
	lt_t *v = as_dt(c, v0, acc);
	if (v == NULL)
		return -ENOMEM;
	uint32_t mask = (uint32_t)((1ull << r) - 1) & ~(1u << ud);
	const sx_t *vb = lt_body(c, v);
	const sx_t *gb = sx_cast(c, lt_bcast_body(c, g0, r, v->sizes), acc);
	if (!bw) {
		lt_t *sq =
		    lt_fn(c, acc, r, v->sizes, sx_bin(c, OP_MUL, vb, vb));
		lt_t *ss;
		if (sq == NULL)
			return -ENOMEM;
		rc = mask ? lred(n, sq, mask, true, RED_SUM, acc, &ss) : 0;
		if (rc != 0)
			return rc;
		if (mask == 0)
			ss = sq;
		lt_t *norms = lt_fn(c, acc, ss->rank, ss->sizes,
				    sx_un(c, OP_SQRT, lt_body(c, ss)));
		if (norms == NULL)
			return -ENOMEM;
		const sx_t *w =
		    sx_bin(c, OP_MUL, vb,
			   sx_bin(c, OP_DIV, gb,
				  lt_bcast_body(c, norms, r, v->sizes)));
		rc = lset(n, 0,
			  lt_fn(c, decl_dt(n, 0, v0->dtype), r, v->sizes, w));
		if (rc == 0 && n->n->n_out > 1)
			rc = lset(n, 1, as_dt(c, norms, decl_dt(n, 1, acc)));
		return rc;
	}
	const sx_t *gwb = sx_cast(c, lt_body(c, gw0), acc);
	const sx_t *nb = sx_cast(c, lt_bcast_body(c, nt0, r, v->sizes), acc);
	lt_t *prod = lt_fn(c, acc, r, v->sizes, sx_bin(c, OP_MUL, gwb, vb));
	lt_t *ps;
	if (prod == NULL)
		return -ENOMEM;
	rc = mask ? lred(n, prod, mask, true, RED_SUM, acc, &ps) : 0;
	if (rc != 0)
		return rc;
	if (mask == 0)
		ps = prod;
	lt_t *gg = lt_fn(c, acc, ps->rank, ps->sizes,
			 sx_bin(c, OP_DIV, lt_body(c, ps),
				sx_cast(c, lt_body(c, nt0), acc)));
	if (gg == NULL)
		return -ENOMEM;
	const sx_t *ggb = lt_bcast_body(c, gg, r, v->sizes);
	const sx_t *gv =
	    sx_bin(c, OP_MUL, sx_bin(c, OP_DIV, gb, nb),
		   sx_bin(c, OP_SUB, gwb,
			  sx_bin(c, OP_MUL, vb, sx_bin(c, OP_DIV, ggb, nb))));
	rc = lset(n, 0, lt_fn(c, decl_dt(n, 0, v0->dtype), r, v->sizes, gv));
	if (rc == 0 && n->n->n_out > 1)
		rc = lset(n, 1, as_dt(c, gg, decl_dt(n, 1, g0->dtype)));
	return rc;
}
