/*
 * ops_attn.c — scaled dot-product attention (the CPU flash-attention ops
 * AOTAutograd emits) as matrix products and a fused row softmax.
 *
 * Forward, per batch·head (q [L, E], k [S, E], v [S, Ev]):
 *   s   = q @ kᵀ · scale (+ mask: bool → -inf where false, float → added;
 *         causal: -inf where column > row)
 *   lse = log Σ_j exp(s - max) + max                (logsumexp, output 1)
 *   p   = exp(s - lse)                              (normalized weights)
 *   out = p @ v                                     (output 0)
 * A row whose every score is -inf gives out = 0 and lse = -inf... as torch's
 * CPU kernel: p = 0 there.
 *
 * Backward (dO, q, k, v, out, lse):
 *   p  = exp(q @ kᵀ · scale + mask - lse)            (recomputed)
 *   dV = pᵀ @ dO;  dP = dO @ vᵀ;  D = Σ_j dO·out (per row)
 *   dS = p · (dP - D);  dQ = dS @ k · scale;  dK = dSᵀ @ q · scale
 * Transposes are views; the products run through BLAS (ops_gemm.c).
 * Dropout and key/value with fewer heads than the query are not lowered
 * (fallback steps).
 */
#include "compiler/ops.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* [B, H, L, E] → [B·H, L, E] (a view of a buffer; a copy when not one). */
static int flat3(lnode_t *n, lt_t *t, lt_t **out)
{
	cctx_t *c = n->c;
	if (t->rank != 4)
		return lerr(n, KILN_EINVGRAPH,
			    "attention inputs must be 4-d [B, H, L, E]");
	kiln_dim_t sz[3] = {dim_mul(c, t->sizes[0], t->sizes[1]), t->sizes[2],
			    t->sizes[3]};
	*out = lt_reshape(c, t, 3, sz);
	return *out ? 0 : -ENOMEM;
}

static lt_t *transpose12(cctx_t *c, const lt_t *t)
{
	static const uint32_t perm[3] = {0, 2, 1};
	return lt_permute(c, t, perm);
}

/* Masked, scaled scores of s = q @ kᵀ as a lazy [BH, L, S] tensor. */
static int scores(lnode_t *n, lt_t *q3, lt_t *k3, const lt_t *q4, lt_t *mask,
		  bool causal, double scale, kiln_dtype_t acc, lt_t **out)
{
	cctx_t *c = n->c;
	lt_t *s;
	int rc = lgemm(n, q3, transpose12(c, k3), acc, &s);
	if (rc != 0)
		return rc;
	const sx_t *v = sx_bin(c, OP_MUL, lt_body(c, s), sxf(c, scale, acc));
	if (causal)
		v = sx_where(c,
			     sx_bin(c, OP_GT, sx_index(c, ix_var(c, 2)),
				    sx_index(c, ix_var(c, 1))),
			     sxf(c, -INFINITY, acc), v);
	if (mask != NULL) {
		/* broadcast the mask (up to 4-d, over [B, H, L, S]) */
		kiln_dim_t full[4] = {q4->sizes[0], q4->sizes[1], q4->sizes[2],
				      s->sizes[2]};
		if (mask->rank > 4)
			return lerr(n, KILN_EINVGRAPH,
				    "attn_mask has rank > 4");
		const sx_t *m4 = lt_bcast_body(c, mask, 4, full);
		/* re-index [BH, L, S] → [B, H, L, S] */
		const kiln_expr_t *h = ix_dim(c, q4->sizes[1]);
		const kiln_expr_t *map[4] = {ix_floordiv(c, ix_var(c, 0), h),
					     ix_mod(c, ix_var(c, 0), h),
					     ix_var(c, 1), ix_var(c, 2)};
		const sx_t *m = sx_subst(c, m4, map, 4);
		if (m == NULL)
			return -ENOMEM;
		if (mask->dtype == KILN_DT_BOOL)
			v = sx_where(c, m, v, sxf(c, -INFINITY, acc));
		else
			v = sx_bin(c, OP_ADD, v, sx_cast(c, m, acc));
	}
	*out = lt_fn(c, acc, 3, s->sizes, v);
	return *out ? 0 : -ENOMEM;
}

static int attn_args(lnode_t *n, uint32_t first, lt_t **q, lt_t **k, lt_t **v,
		     lt_t **mask, bool *causal, double *scale, uint32_t dpos)
{
	int rc = ltensor(n, first, "query", q);
	if (rc == 0)
		rc = ltensor(n, first + 1, "key", k);
	if (rc == 0)
		rc = ltensor(n, first + 2, "value", v);
	double dropout = 0;
	if (rc == 0)
		rc = lfloat(n, dpos, "dropout_p", 0.0, &dropout);
	if (rc == 0)
		rc = lbool(n, dpos + 1, "is_causal", false, causal);
	if (rc == 0)
		rc = ltensor_opt(n, 99, "attn_mask", mask);
	if (rc != 0)
		return rc;
	if (dropout != 0.0)
		return lerr(n, KILN_EUNSUPOP,
			    "attention dropout is not lowered");
	if ((*q)->rank != 4 || (*k)->rank != 4 || (*v)->rank != 4)
		return lerr(n, KILN_EINVGRAPH,
			    "query, key and value must be 4-d");
	if (!dim_eq((*q)->sizes[1], (*k)->sizes[1]) ||
	    !dim_eq((*k)->sizes[1], (*v)->sizes[1]))
		return lerr(n, KILN_EUNSUPOP,
			    "grouped-query attention is not lowered");
	const kiln_arg_t *sa = larg(n, 99, "scale");
	if (sa != NULL && sa->kind != KILN_ARG_NIL) {
		rc = lfloat(n, 99, "scale", 1.0, scale);
		if (rc != 0)
			return rc;
	} else {
		kiln_dim_t e = (*q)->sizes[3];
		if (e.e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "a symbolic head size needs an explicit "
				    "scale");
		*scale = 1.0 / sqrt((double)e.c);
	}
	return 0;
}

int low_sdpa(cctx_t *c, lnode_t *n)
{
	lt_t *q, *k, *v, *mask;
	bool causal;
	double scale;
	int rc = attn_args(n, 0, &q, &k, &v, &mask, &causal, &scale, 3);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = q->dtype;
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *q3 = NULL, *k3 = NULL, *v3 = NULL, *s = NULL;
	rc = flat3(n, q, &q3);
	if (rc == 0)
		rc = flat3(n, k, &k3);
	if (rc == 0)
		rc = flat3(n, v, &v3);
	if (rc == 0)
		rc = scores(n, q3, k3, q, mask, causal, scale, acc, &s);
	if (rc != 0)
		return rc;
	/* lse = log Σ exp(s - m) + m, with m = 0 for an all -inf row */
	lt_t *m;
	rc = lred(n, s, 1u << 2, true, RED_MAXNP, acc, &m);
	if (rc != 0)
		return rc;
	const sx_t *mb = lt_body(c, m);
	lt_t *ms =
	    lt_fn(c, acc, 3, m->sizes,
		  sx_where(c, sx_bin(c, OP_EQ, mb, sxf(c, -INFINITY, acc)),
			   sxf(c, 0, acc), mb));
	if (ms == NULL)
		return -ENOMEM;
	const sx_t *sb = lt_body(c, s);
	/* s - m <= 0 and s - lse <= 0 (up to rounding): OP_EXPNP */
	lt_t *e = lt_fn(
	    c, acc, 3, s->sizes,
	    sx_un(c, OP_EXPNP,
		  sx_bin(c, OP_SUB, sb, lt_bcast_body(c, ms, 3, s->sizes))));
	lt_t *sum;
	if (e == NULL)
		return -ENOMEM;
	rc = lred(n, e, 1u << 2, true, RED_SUM, acc, &sum);
	if (rc != 0)
		return rc;
	lt_t *lse = lt_fn(c, acc, 3, sum->sizes,
			  sx_bin(c, OP_ADD, sx_un(c, OP_LOG, lt_body(c, sum)),
				 lt_body(c, ms)));
	if (lse == NULL)
		return -ENOMEM;
	/* p = exp(s - lse) (0 on an all -inf row), then out = p @ v */
	const sx_t *lb = lt_bcast_body(c, lse, 3, s->sizes);
	const sx_t *pv = sx_un(c, OP_EXPNP, sx_bin(c, OP_SUB, sb, lb));
	pv = sx_where(c, sx_bin(c, OP_EQ, lb, sxf(c, -INFINITY, acc)),
		      sxf(c, 0, acc), pv);
	lt_t *p = lt_fn(c, acc, 3, s->sizes, pv);
	lt_t *o3;
	if (p == NULL)
		return -ENOMEM;
	if (compute_dtype(v3->dtype) != acc || v3->dtype != acc) {
		lt_t *vv = lt_fn(c, acc, 3, v3->sizes,
				 sx_cast(c, lt_body(c, v3), acc));
		if (vv == NULL)
			return -ENOMEM;
		v3 = vv;
	}
	rc = lt_realize(c, p, (int32_t)n->index, &p);
	if (rc == 0)
		rc = lgemm(n, p, v3, acc, &o3);
	if (rc != 0)
		return rc;
	kiln_dim_t o4[4] = {q->sizes[0], q->sizes[1], q->sizes[2], v->sizes[3]};
	rc = lset(n, 0, lt_reshape(c, o3, 4, o4));
	if (rc != 0 || n->n->n_out < 2)
		return rc;
	kiln_dim_t l3[3] = {q->sizes[0], q->sizes[1], q->sizes[2]};
	lt_t *lse2 = lt_reshape(c, lse, 3, l3);
	return lset(n, 1, lse2);
}

int low_sdpa_backward(cctx_t *c, lnode_t *n)
{
	lt_t *go, *q, *k, *v, *o, *lse, *mask;
	bool causal;
	double scale;
	int rc = ltensor(n, 0, "grad_out", &go);
	if (rc == 0)
		rc = attn_args(n, 1, &q, &k, &v, &mask, &causal, &scale, 6);
	if (rc == 0)
		rc = ltensor(n, 4, "out", &o);
	if (rc == 0)
		rc = ltensor(n, 5, "logsumexp", &lse);
	if (rc != 0)
		return rc;
	kiln_dtype_t acc = compute_dtype(q->dtype);
	lt_t *q3 = NULL, *k3 = NULL, *v3 = NULL, *go3 = NULL, *o3 = NULL,
	     *s = NULL;
	rc = flat3(n, q, &q3);
	if (rc == 0)
		rc = flat3(n, k, &k3);
	if (rc == 0)
		rc = flat3(n, v, &v3);
	if (rc == 0)
		rc = flat3(n, go, &go3);
	if (rc == 0)
		rc = flat3(n, o, &o3);
	if (rc == 0)
		rc = scores(n, q3, k3, q, mask, causal, scale, acc, &s);
	if (rc != 0)
		return rc;
	if (lse->rank != 3)
		return lerr(n, KILN_EINVGRAPH,
			    "logsumexp must be 3-d [B, H, L]");
	kiln_dim_t l2[2] = {dim_mul(c, lse->sizes[0], lse->sizes[1]),
			    lse->sizes[2]};
	lt_t *lse2 = lt_reshape(c, lse, 2, l2);
	if (lse2 == NULL)
		return -ENOMEM;
	/* lse as [BH, L, 1] broadcast over S */
	const kiln_expr_t *li[2] = {ix_var(c, 0), ix_var(c, 1)};
	const sx_t *lb = sx_cast(c, lt_at(c, lse2, li), acc);
	const sx_t *pv = sx_un(c, OP_EXP, sx_bin(c, OP_SUB, lt_body(c, s), lb));
	pv = sx_where(c, sx_bin(c, OP_EQ, lb, sxf(c, -INFINITY, acc)),
		      sxf(c, 0, acc), pv);
	lt_t *p = lt_fn(c, acc, 3, s->sizes, pv);
	if (p == NULL)
		return -ENOMEM;
	rc = lt_realize(c, p, (int32_t)n->index, &p);
	if (rc != 0)
		return rc;
	/* widen half types once */
	lt_t **ops[4] = {&go3, &v3, &q3, &k3};
	for (int i = 0; i < 4; i++) {
		lt_t *t = *ops[i];
		if (t->dtype == acc)
			continue;
		lt_t *u =
		    lt_fn(c, acc, 3, t->sizes, sx_cast(c, lt_body(c, t), acc));
		if (u == NULL)
			return -ENOMEM;
		*ops[i] = u;
	}
	lt_t *dv, *dp;
	rc = lgemm(n, transpose12(c, p), go3, acc, &dv);
	if (rc == 0)
		rc = lgemm(n, go3, transpose12(c, v3), acc, &dp);
	if (rc != 0)
		return rc;
	/* D = Σ_j dO · out per row: [BH, L, 1] */
	lt_t *prod = lt_fn(c, acc, 3, go3->sizes,
			   sx_bin(c, OP_MUL, lt_body(c, go3),
				  sx_cast(c, lt_body(c, o3), acc)));
	lt_t *d;
	if (prod == NULL)
		return -ENOMEM;
	rc = lred(n, prod, 1u << 2, true, RED_SUM, acc, &d);
	if (rc != 0)
		return rc;
	const sx_t *ds = sx_bin(c, OP_MUL, lt_body(c, p),
				sx_bin(c, OP_SUB, lt_body(c, dp),
				       lt_bcast_body(c, d, 3, s->sizes)));
	ds = sx_bin(c, OP_MUL, ds, sxf(c, scale, acc));
	lt_t *dst = lt_fn(c, acc, 3, s->sizes, ds);
	if (dst == NULL)
		return -ENOMEM;
	rc = lt_realize(c, dst, (int32_t)n->index, &dst);
	lt_t *dq, *dk;
	if (rc == 0)
		rc = lgemm(n, dst, k3, acc, &dq);
	if (rc == 0)
		rc = lgemm(n, transpose12(c, dst), q3, acc, &dk);
	if (rc != 0)
		return rc;
	kiln_dim_t q4[4] = {q->sizes[0], q->sizes[1], q->sizes[2], q->sizes[3]};
	kiln_dim_t k4[4] = {k->sizes[0], k->sizes[1], k->sizes[2], k->sizes[3]};
	kiln_dim_t v4[4] = {v->sizes[0], v->sizes[1], v->sizes[2], v->sizes[3]};
	rc = lset(n, 0, lt_reshape(c, dq, 4, q4));
	if (rc == 0)
		rc = lset(n, 1, lt_reshape(c, dk, 4, k4));
	if (rc == 0)
		rc = lset(n, 2, lt_reshape(c, dv, 4, v4));
	return rc;
}
