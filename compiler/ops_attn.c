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

/* Attention over q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] (mask
 * and causal as scores() takes them): *o3 [B·H, L, Ev] and *lse [B·H, L,
 * 1] in q's compute dtype; *p (when not NULL) the weights [B·H, L, S], a
 * buffer. */
static int attn_fwd(lnode_t *n, const lt_t *q, const lt_t *k, const lt_t *v,
		    lt_t *mask, bool causal, double scale, bool nan_rows,
		    lt_t **o3, lt_t **lseo, lt_t **po)
{
	cctx_t *c = n->c;
	kiln_dtype_t acc = compute_dtype(q->dtype);
	lt_t *q3 = NULL, *k3 = NULL, *v3 = NULL, *s = NULL;
	int rc = flat3(n, (lt_t *)q, &q3);
	if (rc == 0)
		rc = flat3(n, (lt_t *)k, &k3);
	if (rc == 0)
		rc = flat3(n, (lt_t *)v, &v3);
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
	/* s - m <= 0 and s - lse <= 0 (up to rounding): OP_EXPSUB */
	lt_t *e =
	    lt_fn(c, acc, 3, s->sizes,
		  sx_bin(c, OP_EXPSUB, sb, lt_bcast_body(c, ms, 3, s->sizes)));
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
	/* p = exp(s - lse) (on an all -inf row 0, or NaN: nan_rows), then
	 * out = p @ v */
	const sx_t *lb = lt_bcast_body(c, lse, 3, s->sizes);
	const sx_t *pv = sx_bin(c, OP_EXPSUB, sb, lb);
	pv = sx_where(c, sx_bin(c, OP_EQ, lb, sxf(c, -INFINITY, acc)),
		      sxf(c, nan_rows ? NAN : 0, acc), pv);
	lt_t *p = lt_fn(c, acc, 3, s->sizes, pv);
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
		rc = lgemm(n, p, v3, acc, o3);
	if (rc != 0)
		return rc;
	if (lseo != NULL)
		*lseo = lse;
	if (po != NULL)
		*po = p;
	return 0;
}

int low_sdpa(cctx_t *c, lnode_t *n)
{
	lt_t *q, *k, *v, *mask, *o3, *lse;
	bool causal;
	double scale;
	int rc = attn_args(n, 0, &q, &k, &v, &mask, &causal, &scale, 3);
	if (rc == 0)
		rc = attn_fwd(n, q, k, v, mask, causal, scale, false, &o3, &lse,
			      NULL);
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

/*
 * The fused inference ops of nn.MultiheadAttention and
 * nn.TransformerEncoderLayer (torch's "fast path": eval(), batch_first,
 * no grad), as products, the attention above and layer norms:
 *
 *   _native_multi_head_attention(query [B, L, E], key, value [B, S, E],
 *       E, H, qkv_weight [3E, E], qkv_bias [3E], proj_weight [E, E],
 *       proj_bias [E], mask?, need_weights, average_attn_weights, mask_type)
 *     q, k, v = query @ Wqᵀ + bq, key @ Wkᵀ + bk, value @ Wvᵀ + bv (one
 *     product when query, key and value are one tensor); heads of E/H;
 *     out = attention(q, k, v, scale 1/√(E/H)) @ proj_weightᵀ + proj_bias;
 *     weights: the attention probabilities [B, H, L, S], averaged over
 *     heads ([B, L, S]) where asked, else an empty tensor.
 *   _transformer_encoder_layer_fwd(src [B, L, E], E, H, qkv_weight,
 *       qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
 *       norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
 *       ffn_weight_1 [F, E], ffn_bias_1, ffn_weight_2 [E, F], ffn_bias_2,
 *       mask?, mask_type?)
 *     x = src + mha(norm_first ? ln1(src) : src);  x = ln1(x) unless
 *     norm_first; y = x + ffn(norm_first ? ln2(x) : x), ffn = linear2 ∘
 *     (gelu | relu) ∘ linear1; y = ln2(y) unless norm_first.
 *
 * Masks, as torch's fused kernels take them: mask_type 0 is [L, S], 1 a
 * key padding [B, S], 2 [B, H, L, S]; an element that is true (bool) or
 * non-zero (float: it is not added) masks its score out. A row with every
 * score masked gives NaN weights and outputs, as torch's kernels do. f32
 * and f64 only; a symbolic embed_dim
 * and a mask without its type are fallback steps.
 */
static int need_dims(lnode_t *n, const lt_t *t, const char *name, uint32_t rank,
		     const kiln_dim_t *sz, const char *shape)
{
	bool ok = t->rank == rank;
	for (uint32_t i = 0; ok && i < rank; i++)
		ok = dim_eq(t->sizes[i], sz[i]);
	return ok ? 0 : lerr(n, KILN_EINVGRAPH, "%s must be [%s]", name, shape);
}

/* x2 [M, K] @ wᵀ + b, w [N, K] and b [N] (shapes checked by the caller):
 * a lazy [M, N]. */
static int linear(lnode_t *n, lt_t *x2, const lt_t *w, const lt_t *b,
		  lt_t **out)
{
	cctx_t *c = n->c;
	static const uint32_t tp[2] = {1, 0};
	lt_t *p, *wt = lt_permute(c, w, tp);
	if (wt == NULL)
		return -ENOMEM;
	int rc = lgemm(n, x2, wt, x2->dtype, &p);
	if (rc != 0)
		return rc;
	*out = lt_fn(
	    c, p->dtype, 2, p->sizes,
	    sx_bin(c, OP_ADD, lt_body(c, p), lt_bcast_body(c, b, 2, p->sizes)));
	return *out ? 0 : -ENOMEM;
}

/* rows [r0, r0 + len) of t along dim 0 */
static lt_t *rows(cctx_t *c, const lt_t *t, int64_t r0, kiln_dim_t len)
{
	return lt_slice(c, t, 0, ix_const(c, r0), ix_dim(c, len), 1);
}

typedef struct mha {
	lt_t *qkv_w, *qkv_b, *proj_w, *proj_b, *mask;
	int64_t heads, mask_type; /* -1: none given */
	kiln_dim_t B, L, S, E;
	int64_t e; /* E, static */
} mha_t;

/* Reads embed_dim (pos), num_heads, the four weights (pos + 2..) and
 * checks them against E (the input's last dim). */
static int mha_args(lnode_t *n, uint32_t pos, kiln_dim_t E, mha_t *m)
{
	const kiln_arg_t *ea = larg(n, pos, "embed_dim");
	if (ea != NULL && ea->kind == KILN_ARG_SYM)
		return lerr(n, KILN_EUNSUPOP,
			    "a symbolic embed_dim is not lowered");
	int64_t e, h;
	int rc = lint(n, pos, "embed_dim", 0, &e);
	if (rc == 0)
		rc = lint(n, pos + 1, "num_heads", 0, &h);
	if (rc == 0)
		rc = ltensor(n, pos + 2, "qkv_weight", &m->qkv_w);
	if (rc == 0)
		rc = ltensor(n, pos + 3, "qkv_bias", &m->qkv_b);
	if (rc == 0)
		rc = ltensor(n, pos + 4, "proj_weight", &m->proj_w);
	if (rc == 0)
		rc = ltensor(n, pos + 5, "proj_bias", &m->proj_b);
	if (rc != 0)
		return rc;
	if (E.e != NULL)
		return lerr(n, KILN_EUNSUPOP,
			    "a symbolic embed_dim is not lowered");
	if (e != E.c)
		return lerr(n, KILN_EINVGRAPH,
			    "embed_dim %lld is not the input's last dim %lld",
			    (long long)e, (long long)E.c);
	if (h <= 0 || e % h != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "num_heads %lld does not divide embed_dim %lld",
			    (long long)h, (long long)e);
	kiln_dim_t w3[2] = {dim_const(3 * e), E}, b3[1] = {dim_const(3 * e)};
	kiln_dim_t ww[2] = {E, E};
	rc = need_dims(n, m->qkv_w, "qkv_weight", 2, w3,
		       "3*embed_dim, embed_dim");
	if (rc == 0)
		rc = need_dims(n, m->qkv_b, "qkv_bias", 1, b3, "3*embed_dim");
	if (rc == 0)
		rc = need_dims(n, m->proj_w, "proj_weight", 2, ww,
			       "embed_dim, embed_dim");
	if (rc == 0)
		rc = need_dims(n, m->proj_b, "proj_bias", 1, ww, "embed_dim");
	m->heads = h;
	m->e = e;
	m->E = E;
	return rc;
}

static bool lfloat_dt(kiln_dtype_t dt)
{
	return dt == KILN_DT_F32 || dt == KILN_DT_F64;
}

/* Every tensor of the op in dtype dt (f32 or f64). */
static int same_dtypes(lnode_t *n, lt_t *const *ts, uint32_t nt,
		       kiln_dtype_t dt)
{
	if (!lfloat_dt(dt))
		return lerr(n, KILN_EUNSUPOP,
			    "the fused attention ops are lowered in f32 and "
			    "f64, not %s",
			    kiln_dtype_name(dt));
	for (uint32_t i = 0; i < nt; i++)
		if (ts[i] != NULL && ts[i]->dtype != dt)
			return lerr(n, KILN_EINVGRAPH,
				    "the weights must have the input's dtype "
				    "%s, not %s",
				    kiln_dtype_name(dt),
				    kiln_dtype_name(ts[i]->dtype));
	return 0;
}

/* The mask (pos, pos + 1: mask, mask_type) as a bool "keep" tensor that
 * broadcasts over [B, H, L, S], or NULL. */
static int mha_mask(lnode_t *n, uint32_t pos, mha_t *m, lt_t **keep)
{
	cctx_t *c = n->c;
	*keep = NULL;
	int rc = ltensor_opt(n, pos, "mask", &m->mask);
	if (rc == 0)
		rc = lint(n, pos + 1, "mask_type", -1, &m->mask_type);
	if (rc != 0 || m->mask == NULL)
		return rc;
	const lt_t *mk = m->mask;
	if (m->mask_type < 0)
		return lerr(n, KILN_EUNSUPOP,
			    "a mask without its mask_type is not lowered");
	kiln_dim_t h = dim_const(m->heads);
	kiln_dim_t t0[2] = {m->L, m->S}, t1[2] = {m->B, m->S},
		   t2[4] = {m->B, h, m->L, m->S};
	if (m->mask_type == 0)
		rc = need_dims(n, mk, "a mask of mask_type 0", 2, t0, "L, S");
	else if (m->mask_type == 1)
		rc = need_dims(n, mk, "a mask of mask_type 1", 2, t1, "B, S");
	else if (m->mask_type == 2)
		rc = need_dims(n, mk, "a mask of mask_type 2", 4, t2,
			       "B, num_heads, L, S");
	else
		rc = lerr(n, KILN_EINVGRAPH,
			  "mask_type must be 0, 1 or 2, not %lld",
			  (long long)m->mask_type);
	if (rc != 0)
		return rc;
	if (mk->dtype != KILN_DT_BOOL && !kiln_dtype_is_float(mk->dtype))
		return lerr(n, KILN_EINVGRAPH,
			    "the mask must be bool or floating, not %s",
			    kiln_dtype_name(mk->dtype));
	const sx_t *mb = lt_body(c, mk);
	const sx_t *kb = mk->dtype == KILN_DT_BOOL
			     ? sx_un(c, OP_NOT, mb)
			     : sx_bin(c, OP_EQ, mb, sxf(c, 0, mk->dtype));
	lt_t *k = lt_fn(c, KILN_DT_BOOL, mk->rank, mk->sizes, kb);
	if (k != NULL && m->mask_type == 1) {
		kiln_dim_t one = dim_const(1), k4[4] = {m->B, one, one, m->S};
		k = lt_reshape(c, k, 4, k4);
	}
	*keep = k;
	return k ? 0 : -ENOMEM;
}

/* [R, E] → [B, H, R/B, E/H] (rows of batch-major tokens) */
static lt_t *heads4(cctx_t *c, const lt_t *t, const mha_t *m, kiln_dim_t T)
{
	static const uint32_t perm[4] = {0, 2, 1, 3};
	kiln_dim_t sz[4] = {m->B, T, dim_const(m->heads),
			    dim_const(m->e / m->heads)};
	lt_t *r = lt_reshape(c, t, 4, sz);
	return r ? lt_permute(c, r, perm) : NULL;
}

/* Attention of q2 [B·L, E] over k2, v2 [B·S, E] (self: q2 is all three):
 * *out [B·L, E] (lazy), *p the weights [B·H, L, S] where p is not NULL. */
static int mha_fwd(lnode_t *n, const mha_t *m, lt_t *keep, lt_t *q2, lt_t *k2,
		   lt_t *v2, bool self, lt_t **out, lt_t **p)
{
	cctx_t *c = n->c;
	lt_t *q, *k, *v;
	int rc;
	if (self) {
		lt_t *qkv;
		rc = linear(n, q2, m->qkv_w, m->qkv_b, &qkv);
		if (rc != 0)
			return rc;
		q = lt_slice(c, qkv, 1, ix_const(c, 0), ix_const(c, m->e), 1);
		k = lt_slice(c, qkv, 1, ix_const(c, m->e), ix_const(c, m->e),
			     1);
		v = lt_slice(c, qkv, 1, ix_const(c, 2 * m->e),
			     ix_const(c, m->e), 1);
	} else {
		rc = linear(n, q2, rows(c, m->qkv_w, 0, m->E),
			    rows(c, m->qkv_b, 0, m->E), &q);
		if (rc == 0)
			rc = linear(n, k2, rows(c, m->qkv_w, m->e, m->E),
				    rows(c, m->qkv_b, m->e, m->E), &k);
		if (rc == 0)
			rc = linear(n, v2, rows(c, m->qkv_w, 2 * m->e, m->E),
				    rows(c, m->qkv_b, 2 * m->e, m->E), &v);
		if (rc != 0)
			return rc;
	}
	if (q == NULL || k == NULL || v == NULL)
		return -ENOMEM;
	lt_t *q4 = heads4(c, q, m, m->L), *k4 = heads4(c, k, m, m->S),
	     *v4 = heads4(c, v, m, m->S), *o3;
	if (q4 == NULL || k4 == NULL || v4 == NULL)
		return -ENOMEM;
	double scale = 1.0 / sqrt((double)(m->e / m->heads));
	rc = attn_fwd(n, q4, k4, v4, keep, false, scale, true, &o3, NULL, p);
	if (rc != 0)
		return rc;
	/* [B·H, L, D] → [B, H, L, D] → [B, L, H, D] → [B·L, E] */
	static const uint32_t perm[4] = {0, 2, 1, 3};
	kiln_dim_t o4[4] = {m->B, dim_const(m->heads), m->L,
			    dim_const(m->e / m->heads)};
	kiln_dim_t o2[2] = {dim_mul(c, m->B, m->L), m->E};
	lt_t *ob = lt_reshape(c, o3, 4, o4);
	lt_t *ol = ob ? lt_permute(c, ob, perm) : NULL;
	lt_t *of = ol ? lt_reshape(c, ol, 2, o2) : NULL;
	if (of == NULL)
		return -ENOMEM;
	return linear(n, of, m->proj_w, m->proj_b, out);
}

int low_native_mha(cctx_t *c, lnode_t *n)
{
	lt_t *query, *key, *value, *keep;
	mha_t m;
	bool need_w, avg;
	int rc = ltensor(n, 0, "query", &query);
	if (rc == 0)
		rc = ltensor(n, 1, "key", &key);
	if (rc == 0)
		rc = ltensor(n, 2, "value", &value);
	if (rc == 0)
		rc = lbool(n, 10, "need_weights", true, &need_w);
	if (rc == 0)
		rc = lbool(n, 11, "average_attn_weights", true, &avg);
	if (rc != 0)
		return rc;
	if (query->rank != 3 || key->rank != 3 || value->rank != 3)
		return lerr(n, KILN_EINVGRAPH,
			    "query, key and value must be 3-d [B, L, E]");
	rc = mha_args(n, 3, query->sizes[2], &m);
	if (rc != 0)
		return rc;
	m.B = query->sizes[0];
	m.L = query->sizes[1];
	m.S = key->sizes[1];
	kiln_dim_t kv[3] = {m.B, m.S, m.E};
	rc = need_dims(n, key, "key", 3, kv, "B, S, embed_dim");
	if (rc == 0)
		rc = need_dims(n, value, "value", 3, kv, "B, S, embed_dim");
	lt_t *all[6] = {key, value, m.qkv_w, m.qkv_b, m.proj_w, m.proj_b};
	if (rc == 0)
		rc = same_dtypes(n, all, 6, query->dtype);
	if (rc == 0)
		rc = mha_mask(n, 9, &m, &keep);
	if (rc != 0)
		return rc;
	const kiln_arg_t *a0 = larg(n, 0, "query"), *a1 = larg(n, 1, "key"),
			 *a2 = larg(n, 2, "value");
	bool self = a0 && a1 && a2 && a0->kind == KILN_ARG_REF &&
		    a1->kind == KILN_ARG_REF && a2->kind == KILN_ARG_REF &&
		    a0->u.ref == a1->u.ref && a1->u.ref == a2->u.ref;
	kiln_dim_t q2s[2] = {dim_mul(c, m.B, m.L), m.E},
		   k2s[2] = {dim_mul(c, m.B, m.S), m.E};
	lt_t *q2 = lt_reshape(c, query, 2, q2s),
	     *k2 = lt_reshape(c, key, 2, k2s),
	     *v2 = lt_reshape(c, value, 2, k2s), *o2, *p = NULL;
	if (q2 == NULL || k2 == NULL || v2 == NULL)
		return -ENOMEM;
	bool want_p = need_w && n->n->n_out > 1;
	rc = mha_fwd(n, &m, keep, q2, k2, v2, self, &o2, want_p ? &p : NULL);
	if (rc != 0)
		return rc;
	kiln_dim_t o3[3] = {m.B, m.L, m.E};
	rc = lset(n, 0, lt_reshape(c, o2, 3, o3));
	if (rc != 0 || n->n->n_out < 2)
		return rc;
	if (!want_p) {
		/* torch returns an empty tensor: zeros of the declared shape */
		uint32_t r;
		kiln_dim_t sz[CIR_MAX_RANK];
		rc = lout_sizes(n, 1, &r, sz, NULL);
		if (rc != 0)
			return rc;
		return lset(
		    n, 1,
		    lt_fn(c, query->dtype, r, sz, sxf(c, 0, query->dtype)));
	}
	kiln_dim_t h = dim_const(m.heads), w4[4] = {m.B, h, m.L, m.S};
	lt_t *p4 = lt_reshape(c, p, 4, w4);
	if (p4 == NULL)
		return -ENOMEM;
	if (!avg)
		return lset(n, 1, p4);
	lt_t *ps;
	rc = lred(n, p4, 1u << 1, false, RED_SUM, p4->dtype, &ps);
	if (rc != 0)
		return rc;
	return lset(n, 1,
		    lt_fn(c, ps->dtype, 3, ps->sizes,
			  sx_bin(c, OP_DIV, lt_body(c, ps),
				 sxf(c, (double)m.heads, ps->dtype))));
}

int low_encoder_layer(cctx_t *c, lnode_t *n)
{
	/* the layer norms' and the feed-forward's weights, at 10..17 */
	static const char *const names[8] = {
	    "norm_weight_1", "norm_bias_1", "norm_weight_2", "norm_bias_2",
	    "ffn_weight_1",  "ffn_bias_1",  "ffn_weight_2",  "ffn_bias_2"};
	lt_t *src, *w[8], *keep;
	bool gelu, norm_first;
	double eps;
	mha_t m;
	int rc = ltensor(n, 0, "src", &src);
	if (rc == 0 && src->rank != 3)
		rc = lerr(n, KILN_EINVGRAPH, "src must be 3-d [B, L, E]");
	if (rc == 0)
		rc = mha_args(n, 1, src->sizes[2], &m);
	if (rc == 0)
		rc = lbool(n, 7, "use_gelu", false, &gelu);
	if (rc == 0)
		rc = lbool(n, 8, "norm_first", false, &norm_first);
	if (rc == 0)
		rc = lfloat(n, 9, "eps", 1e-5, &eps);
	for (uint32_t i = 0; rc == 0 && i < 8; i++)
		rc = ltensor(n, 10 + i, names[i], &w[i]);
	if (rc != 0)
		return rc;
	lt_t *n1w = w[0], *n1b = w[1], *n2w = w[2], *n2b = w[3], *f1w = w[4],
	     *f1b = w[5], *f2w = w[6], *f2b = w[7];
	m.B = src->sizes[0];
	m.L = m.S = src->sizes[1];
	kiln_dim_t e1[1] = {m.E};
	for (uint32_t i = 0; rc == 0 && i < 4; i++)
		rc = need_dims(n, w[i], names[i], 1, e1, "embed_dim");
	if (rc != 0)
		return rc;
	if (f1w->rank != 2)
		return lerr(n, KILN_EINVGRAPH,
			    "ffn_weight_1 must be [F, embed_dim]");
	kiln_dim_t F = f1w->sizes[0];
	kiln_dim_t fw1[2] = {F, m.E}, fb1[1] = {F}, fw2[2] = {m.E, F};
	rc = need_dims(n, f1w, "ffn_weight_1", 2, fw1, "F, embed_dim");
	if (rc == 0)
		rc = need_dims(n, f1b, "ffn_bias_1", 1, fb1, "F");
	if (rc == 0)
		rc = need_dims(n, f2w, "ffn_weight_2", 2, fw2, "embed_dim, F");
	if (rc == 0)
		rc = need_dims(n, f2b, "ffn_bias_2", 1, e1, "embed_dim");
	lt_t *mw[4] = {m.qkv_w, m.qkv_b, m.proj_w, m.proj_b};
	if (rc == 0)
		rc = same_dtypes(n, mw, 4, src->dtype);
	if (rc == 0)
		rc = same_dtypes(n, w, 8, src->dtype);
	if (rc == 0)
		rc = mha_mask(n, 18, &m, &keep);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = src->dtype;
	kiln_dim_t x2s[2] = {dim_mul(c, m.B, m.L), m.E};
	lt_t *x = lt_reshape(c, src, 2, x2s), *h, *a;
	if (x == NULL)
		return -ENOMEM;
	/* x + attention */
	h = x;
	if (norm_first &&
	    (rc = lnorm(n, x, 1, n1w, n1b, eps, dt, &h, NULL, NULL)) != 0)
		return rc;
	rc = mha_fwd(n, &m, keep, h, h, h, true, &a, NULL);
	if (rc != 0)
		return rc;
	x = lt_fn(c, dt, 2, x2s,
		  sx_bin(c, OP_ADD, lt_body(c, a), lt_body(c, x)));
	if (x == NULL)
		return -ENOMEM;
	if (!norm_first &&
	    (rc = lnorm(n, x, 1, n1w, n1b, eps, dt, &x, NULL, NULL)) != 0)
		return rc;
	/* x + ffn */
	h = x;
	if (norm_first &&
	    (rc = lnorm(n, x, 1, n2w, n2b, eps, dt, &h, NULL, NULL)) != 0)
		return rc;
	lt_t *f;
	rc = linear(n, h, f1w, f1b, &f);
	if (rc != 0)
		return rc;
	const sx_t *fb = lt_body(c, f);
	f = lt_fn(c, dt, 2, f->sizes,
		  gelu ? sx_gelu(c, fb, false)
		       : sx_bin(c, OP_MAX, fb, sxf(c, 0, dt)));
	if (f == NULL)
		return -ENOMEM;
	rc = linear(n, f, f2w, f2b, &f);
	if (rc != 0)
		return rc;
	lt_t *y = lt_fn(c, dt, 2, x2s,
			sx_bin(c, OP_ADD, lt_body(c, f), lt_body(c, x)));
	if (y == NULL)
		return -ENOMEM;
	if (!norm_first &&
	    (rc = lnorm(n, y, 1, n2w, n2b, eps, dt, &y, NULL, NULL)) != 0)
		return rc;
	kiln_dim_t o3[3] = {m.B, m.L, m.E};
	return lset(n, 0, lt_reshape(c, y, 3, o3));
}
