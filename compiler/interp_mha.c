/*
 * interp_mha.c — the reference interpreter's fused inference ops of
 * nn.MultiheadAttention and nn.TransformerEncoderLayer (torch's fast path):
 *
 *   _native_multi_head_attention (code 0) and
 *   _transformer_encoder_layer_fwd (code 1),
 *
 * naively in f64: products, a softmax per row of scores, layer norms (the
 * formulas are in ops_attn.c). A mask element that is true or non-zero
 * masks its score out; a row with every score masked has NaN weights, as
 * torch's kernels give.
 */
#include "compiler/interp_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct imha {
	int64_t B, L, S, E, H, D, mt; /* mt: mask_type, -1 without a mask */
	double *qkvw, *qkvb, *pw, *pb, *mask;
} imha_t;

static void imha_free(imha_t *a)
{
	free(a->qkvw);
	free(a->qkvb);
	free(a->pw);
	free(a->pb);
	free(a->mask);
}

static int need_dt(ictx_t *c, const it_t *t, kiln_dtype_t dt)
{
	if (t->dt == dt)
		return 0;
	return kiln__i_bad(c,
			   "the weights must have the input's dtype %s, not %s",
			   kiln_dtype_name(dt), kiln_dtype_name(t->dt));
}

/* embed_dim (pos), num_heads and the four weights after them, checked
 * against E (the input's last dim) and the input's dtype dt. */
static int mha_args(ictx_t *c, int pos, int64_t E, kiln_dtype_t dt, imha_t *a)
{
	it_t *w[4];
	int64_t e, h;
	KI_TRY(kiln__i_int(c, pos, "embed_dim", KI_REQ, &e));
	KI_TRY(kiln__i_int(c, pos + 1, "num_heads", KI_REQ, &h));
	KI_TRY(kiln__i_tensor(c, pos + 2, "qkv_weight", &w[0]));
	KI_TRY(kiln__i_tensor(c, pos + 3, "qkv_bias", &w[1]));
	KI_TRY(kiln__i_tensor(c, pos + 4, "proj_weight", &w[2]));
	KI_TRY(kiln__i_tensor(c, pos + 5, "proj_bias", &w[3]));
	if (e != E)
		return kiln__i_bad(c,
				   "embed_dim %lld is not the input's last dim "
				   "%lld",
				   (long long)e, (long long)E);
	if (h <= 0 || e % h != 0)
		return kiln__i_bad(c,
				   "num_heads %lld does not divide embed_dim "
				   "%lld",
				   (long long)h, (long long)e);
	int64_t s3[2] = {3 * E, E}, s1[2] = {E, E};
	KI_TRY(kiln__i_need_shape(c, w[0], "qkv_weight", 2, s3));
	KI_TRY(kiln__i_need_shape(c, w[1], "qkv_bias", 1, s3));
	KI_TRY(kiln__i_need_shape(c, w[2], "proj_weight", 2, s1));
	KI_TRY(kiln__i_need_shape(c, w[3], "proj_bias", 1, s1));
	for (int i = 0; i < 4; i++)
		KI_TRY(need_dt(c, w[i], dt));
	a->E = E;
	a->H = h;
	a->D = E / h;
	int rc = kiln__i_to_f(c, w[0], &a->qkvw);
	if (rc == 0)
		rc = kiln__i_to_f(c, w[1], &a->qkvb);
	if (rc == 0)
		rc = kiln__i_to_f(c, w[2], &a->pw);
	if (rc == 0)
		rc = kiln__i_to_f(c, w[3], &a->pb);
	return rc;
}

/* mask (pos) and mask_type (pos + 1), their shapes checked. */
static int mha_mask(ictx_t *c, int pos, imha_t *a)
{
	it_t *m;
	a->mt = -1;
	KI_TRY(kiln__i_tensor_opt(c, pos, "mask", &m));
	if (m == NULL)
		return 0;
	KI_TRY(kiln__i_int(c, pos + 1, "mask_type", -1, &a->mt));
	if (a->mt < 0)
		return kiln__i_unsup(c, "a mask without its mask_type is not "
					"lowered");
	int64_t t0[2] = {a->L, a->S}, t1[2] = {a->B, a->S},
		t2[4] = {a->B, a->H, a->L, a->S};
	if (a->mt == 0)
		KI_TRY(
		    kiln__i_need_shape(c, m, "a mask of mask_type 0", 2, t0));
	else if (a->mt == 1)
		KI_TRY(
		    kiln__i_need_shape(c, m, "a mask of mask_type 1", 2, t1));
	else if (a->mt == 2)
		KI_TRY(
		    kiln__i_need_shape(c, m, "a mask of mask_type 2", 4, t2));
	else
		return kiln__i_bad(c, "mask_type must be 0, 1 or 2, not %lld",
				   (long long)a->mt);
	if (m->dt != KILN_DT_BOOL && !ki_isf(m->dt))
		return kiln__i_bad(c,
				   "the mask must be bool or floating, not %s",
				   kiln_dtype_name(m->dt));
	return kiln__i_to_f(c, m, &a->mask);
}

/* y [M, N] = x [M, K] @ w [N, K]ᵀ + b [N] */
static void lin(const double *x, int64_t M, int64_t K, const double *w,
		const double *b, int64_t N, double *y)
{
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = b[j];
			for (int64_t k = 0; k < K; k++)
				s += x[i * K + k] * w[j * K + k];
			y[i * N + j] = s;
		}
}

/* rows of x [M, N] layer-normed in place */
static void lnorm(double *x, int64_t M, int64_t N, const double *w,
		  const double *b, double eps)
{
	for (int64_t i = 0; i < M; i++) {
		double *p = x + i * N, mean = 0, var = 0;
		for (int64_t k = 0; k < N; k++)
			mean += p[k];
		mean /= (double)N;
		for (int64_t k = 0; k < N; k++)
			var += (p[k] - mean) * (p[k] - mean);
		double rstd = 1 / sqrt(var / (double)N + eps);
		for (int64_t k = 0; k < N; k++)
			p[k] = (p[k] - mean) * rstd * w[k] + b[k];
	}
}

static bool masked(const imha_t *a, int64_t b, int64_t h, int64_t i, int64_t j)
{
	switch (a->mt) {
	case 0: return a->mask[i * a->S + j] != 0;
	case 1: return a->mask[b * a->S + j] != 0;
	case 2: return a->mask[((b * a->H + h) * a->L + i) * a->S + j] != 0;
	default: return false;
	}
}

/* out [B·L, E] = attention of xq [B·L, E] over xk, xv [B·S, E], projected;
 * wts [B, H, L, S] (when not NULL) the weights. */
static int attend(ictx_t *c, const imha_t *a, const double *xq,
		  const double *xk, const double *xv, double *out, double *wts)
{
	int64_t E = a->E, D = a->D, BL = a->B * a->L, BS = a->B * a->S;
	double *q = ki_dcalloc(BL * E), *k = ki_dcalloc(BS * E),
	       *v = ki_dcalloc(BS * E), *o = ki_dcalloc(BL * E),
	       *s = ki_dcalloc(a->S);
	int rc = q && k && v && o && s ? 0 : kiln__i_oom(c);
	if (rc == 0) {
		lin(xq, BL, E, a->qkvw, a->qkvb, E, q);
		lin(xk, BS, E, a->qkvw + E * E, a->qkvb + E, E, k);
		lin(xv, BS, E, a->qkvw + 2 * E * E, a->qkvb + 2 * E, E, v);
	}
	double scale = 1 / sqrt((double)D);
	for (int64_t b = 0; rc == 0 && b < a->B; b++)
		for (int64_t h = 0; h < a->H; h++)
			for (int64_t i = 0; i < a->L; i++) {
				const double *qr =
				    q + (b * a->L + i) * E + h * D;
				double m = -INFINITY, sum = 0;
				for (int64_t j = 0; j < a->S; j++) {
					const double *kr =
					    k + (b * a->S + j) * E + h * D;
					double d = 0;
					for (int64_t e = 0; e < D; e++)
						d += qr[e] * kr[e];
					s[j] = masked(a, b, h, i, j)
						   ? -INFINITY
						   : d * scale;
					m = s[j] > m ? s[j] : m;
				}
				/* every score masked: NaN, as torch */
				for (int64_t j = 0; j < a->S; j++) {
					s[j] = isinf(m) && m < 0
						   ? NAN
						   : exp(s[j] - m);
					sum += s[j];
				}
				double *orow = o + (b * a->L + i) * E + h * D;
				for (int64_t j = 0; j < a->S; j++) {
					double p = s[j] / sum;
					const double *vr =
					    v + (b * a->S + j) * E + h * D;
					for (int64_t e = 0; e < D; e++)
						orow[e] += p * vr[e];
					if (wts)
						wts[((b * a->H + h) * a->L +
						     i) *
							a->S +
						    j] = p;
				}
			}
	if (rc == 0)
		lin(o, BL, E, a->pw, a->pb, E, out);
	free(q);
	free(k);
	free(v);
	free(o);
	free(s);
	return rc;
}

static int native_mha(ictx_t *c)
{
	it_t *x[3];
	imha_t a = {0};
	bool need_w, avg;
	KI_TRY(kiln__i_tensor(c, 0, "query", &x[0]));
	KI_TRY(kiln__i_tensor(c, 1, "key", &x[1]));
	KI_TRY(kiln__i_tensor(c, 2, "value", &x[2]));
	KI_TRY(kiln__i_bool(c, 10, "need_weights", true, &need_w));
	KI_TRY(kiln__i_bool(c, 11, "average_attn_weights", true, &avg));
	if (x[0]->rank != 3 || x[1]->rank != 3 || x[2]->rank != 3)
		return kiln__i_bad(
		    c, "query, key and value must be 3-d [B, L, E]");
	if (!ki_isf(x[0]->dt))
		return kiln__i_unsup(c,
				     "the fused attention ops are lowered in "
				     "f32 and f64, not %s",
				     kiln_dtype_name(x[0]->dt));
	a.B = x[0]->size[0];
	a.L = x[0]->size[1];
	a.S = x[1]->size[1];
	int64_t kv[3] = {a.B, a.S, x[0]->size[2]};
	int rc = mha_args(c, 3, x[0]->size[2], x[0]->dt, &a);
	if (rc == 0)
		rc = kiln__i_need_shape(c, x[1], "key", 3, kv);
	if (rc == 0)
		rc = kiln__i_need_shape(c, x[2], "value", 3, kv);
	for (int i = 1; rc == 0 && i < 3; i++)
		rc = need_dt(c, x[i], x[0]->dt);
	if (rc == 0)
		rc = mha_mask(c, 9, &a);
	double *xv[3] = {NULL, NULL, NULL}, *out = NULL, *w = NULL;
	for (int i = 0; rc == 0 && i < 3; i++)
		rc = kiln__i_to_f(c, x[i], &xv[i]);
	int64_t BL = a.B * a.L, nw = a.B * a.H * a.L * a.S;
	if (rc == 0) {
		out = ki_dcalloc(BL * a.E);
		w = need_w ? ki_dcalloc(nw) : NULL;
		if (out == NULL || (need_w && w == NULL))
			rc = kiln__i_oom(c);
	}
	if (rc == 0)
		rc = attend(c, &a, xv[0], xv[1], xv[2], out, w);
	int64_t osz[3] = {a.B, a.L, a.E};
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x[0]->dt, 3, osz, out);
	if (rc == 0 && c->nd->n_out > 1) {
		if (!need_w) {
			int64_t z[1] = {0};
			rc = kiln__i_alloc(c, &c->out[1], x[0]->dt, 1, z);
		} else if (avg) {
			/* mean over heads, in place into the first B·L·S */
			for (int64_t b = 0; b < a.B; b++)
				for (int64_t r = 0; r < a.L * a.S; r++) {
					double s = 0;
					for (int64_t h = 0; h < a.H; h++)
						s += w[(b * a.H + h) * a.L *
							   a.S +
						       r];
					w[b * a.L * a.S + r] = s / (double)a.H;
				}
			int64_t ws[3] = {a.B, a.L, a.S};
			rc = kiln__i_from_f(c, &c->out[1], x[0]->dt, 3, ws, w);
		} else {
			int64_t ws[4] = {a.B, a.H, a.L, a.S};
			rc = kiln__i_from_f(c, &c->out[1], x[0]->dt, 4, ws, w);
		}
	}
	for (int i = 0; i < 3; i++)
		free(xv[i]);
	free(out);
	free(w);
	imha_free(&a);
	return rc;
}

static int encoder_layer(ictx_t *c)
{
	it_t *src, *t[8];
	static const char *const names[8] = {
	    "norm_weight_1", "norm_bias_1", "norm_weight_2", "norm_bias_2",
	    "ffn_weight_1",  "ffn_bias_1",  "ffn_weight_2",  "ffn_bias_2"};
	imha_t a = {0};
	bool gelu, norm_first;
	double eps;
	KI_TRY(kiln__i_tensor(c, 0, "src", &src));
	if (src->rank != 3)
		return kiln__i_bad(c, "src must be 3-d [B, L, E]");
	if (!ki_isf(src->dt))
		return kiln__i_unsup(c,
				     "the fused attention ops are lowered in "
				     "f32 and f64, not %s",
				     kiln_dtype_name(src->dt));
	KI_TRY(kiln__i_bool(c, 7, "use_gelu", false, &gelu));
	KI_TRY(kiln__i_bool(c, 8, "norm_first", false, &norm_first));
	KI_TRY(kiln__i_num(c, 9, "eps", false, 1e-5, &eps));
	for (int i = 0; i < 8; i++)
		KI_TRY(kiln__i_tensor(c, 10 + i, names[i], &t[i]));
	int64_t E = src->size[2];
	a.B = src->size[0];
	a.L = a.S = src->size[1];
	int rc = mha_args(c, 1, E, src->dt, &a);
	int64_t e1[1] = {E};
	for (int i = 0; rc == 0 && i < 4; i++)
		rc = kiln__i_need_shape(c, t[i], names[i], 1, e1);
	if (rc == 0 && t[4]->rank != 2)
		rc = kiln__i_bad(c, "ffn_weight_1 must be [F, embed_dim]");
	int64_t F = rc == 0 ? t[4]->size[0] : 0;
	int64_t fw1[2] = {F, E}, fb1[1] = {F}, fw2[2] = {E, F};
	if (rc == 0)
		rc = kiln__i_need_shape(c, t[4], "ffn_weight_1", 2, fw1);
	if (rc == 0)
		rc = kiln__i_need_shape(c, t[5], "ffn_bias_1", 1, fb1);
	if (rc == 0)
		rc = kiln__i_need_shape(c, t[6], "ffn_weight_2", 2, fw2);
	if (rc == 0)
		rc = kiln__i_need_shape(c, t[7], "ffn_bias_2", 1, e1);
	for (int i = 0; rc == 0 && i < 8; i++)
		rc = need_dt(c, t[i], src->dt);
	if (rc == 0)
		rc = mha_mask(c, 18, &a);
	double *tv[8] = {0}, *x = NULL, *h = NULL, *o = NULL, *f = NULL;
	for (int i = 0; rc == 0 && i < 8; i++)
		rc = kiln__i_to_f(c, t[i], &tv[i]);
	if (rc == 0)
		rc = kiln__i_to_f(c, src, &x);
	int64_t M = a.B * a.L;
	if (rc == 0) {
		h = ki_dcalloc(M * E);
		o = ki_dcalloc(M * E);
		f = ki_dcalloc(M * (F > 0 ? F : 1));
		if (h == NULL || o == NULL || f == NULL)
			rc = kiln__i_oom(c);
	}
	if (rc == 0) {
		/* x += mha(norm_first ? ln1(x) : x) */
		memcpy(h, x, (size_t)(M * E) * sizeof(double));
		if (norm_first)
			lnorm(h, M, E, tv[0], tv[1], eps);
		rc = attend(c, &a, h, h, h, o, NULL);
	}
	if (rc == 0) {
		for (int64_t i = 0; i < M * E; i++)
			x[i] += o[i];
		if (!norm_first)
			lnorm(x, M, E, tv[0], tv[1], eps);
		/* x += ffn(norm_first ? ln2(x) : x) */
		memcpy(h, x, (size_t)(M * E) * sizeof(double));
		if (norm_first)
			lnorm(h, M, E, tv[2], tv[3], eps);
		lin(h, M, E, tv[4], tv[5], F, f);
		for (int64_t i = 0; i < M * F; i++)
			f[i] = gelu ? 0.5 * f[i] * (1 + erf(f[i] / sqrt(2.0)))
				    : (f[i] > 0 || isnan(f[i]) ? f[i] : 0);
		lin(f, M, F, tv[6], tv[7], E, o);
		for (int64_t i = 0; i < M * E; i++)
			x[i] += o[i];
		if (!norm_first)
			lnorm(x, M, E, tv[2], tv[3], eps);
		rc = kiln__i_from_f(c, &c->out[0], src->dt, 3, src->size, x);
	}
	for (int i = 0; i < 8; i++)
		free(tv[i]);
	free(x);
	free(h);
	free(o);
	free(f);
	imha_free(&a);
	return rc;
}

int kiln__op_mha(ictx_t *c, int code)
{
	return code == 0 ? native_mha(c) : encoder_layer(c);
}
