/*
 * interp_conv.c — the reference interpreter's convolution (1-3 spatial
 * dims, stride, padding, dilation, groups, transposed) and its backward,
 * 2d pooling (max with indices, avg, adaptive avg) with backwards,
 * upsampling (nearest, bilinear) and CPU flash attention with its backward.
 * Conventions and representation: interp_internal.h.
 *
 * Every op copies its inputs into contiguous f64 arrays, computes naively
 * in f64 and rounds once at the output.
 *
 * Threads: any; no global state.
 */
#include "compiler/interp_internal.h"

#include <stdlib.h>
#include <string.h>

/* Frees up to 6 malloc'd arrays (NULL-safe). */
static void free6(void *a, void *b, void *d, void *e, void *f, void *g)
{
	free(a);
	free(b);
	free(d);
	free(e);
	free(f);
	free(g);
}

/* ------------------------------------------------------------------------ */
/* Convolution                                                                */
/* ------------------------------------------------------------------------ */

/* Geometry of one convolution, spatial dims padded to 3 with 1s. */
typedef struct cgeo {
	int nsp;
	int64_t N, G;
	int64_t s[3], p[3], d[3],
	    op[3];	    /* stride, padding, dilation, out pad */
	int64_t K[3];	    /* kernel */
	int64_t I[3], O[3]; /* input / output spatial (of the conv) */
} cgeo_t;

static int spatial_list(ictx_t *c, int pos, const char *name, int nsp,
			int64_t def, int64_t *v)
{
	int64_t t[8];
	int n;
	KI_TRY(kiln__i_ints(c, pos, name, t, 8, &n));
	for (int k = 0; k < 3; k++)
		v[k] = k < nsp ? def : (def == 0 ? 0 : 1);
	if (n < 0 || n == 0)
		return 0;
	if (n != 1 && n != nsp)
		return kiln__i_bad(c, "%s must have 1 or %d entries, not %d",
				   name, nsp, n);
	for (int k = 0; k < nsp; k++) {
		v[k] = t[n == 1 ? 0 : k];
		if (v[k] < -KI_MAX_ELEMS || v[k] > KI_MAX_ELEMS)
			return kiln__i_bad(c, "%s %lld is too large", name,
					   (long long)v[k]);
	}
	return 0;
}

/* Reads stride/padding/dilation/transposed/output_padding/groups at
 * positions base.. ; checks weight and input; fills the geometry. */
static int conv_geo(ictx_t *c, const it_t *x, const it_t *w, int base,
		    bool *transposed, cgeo_t *g)
{
	memset(g, 0, sizeof(*g));
	if (w->rank < 3 || w->rank > 5)
		return kiln__i_bad(c, "weight must be 3D, 4D or 5D, not %uD",
				   w->rank);
	g->nsp = (int)w->rank - 2;
	if (x->rank != w->rank)
		return kiln__i_bad(
		    c,
		    "input must be %uD (batched) for a %uD weight, "
		    "not %uD",
		    w->rank, w->rank, x->rank);
	KI_TRY(spatial_list(c, base, "stride", g->nsp, 1, g->s));
	KI_TRY(spatial_list(c, base + 1, "padding", g->nsp, 0, g->p));
	KI_TRY(spatial_list(c, base + 2, "dilation", g->nsp, 1, g->d));
	KI_TRY(kiln__i_bool(c, base + 3, "transposed", false, transposed));
	KI_TRY(spatial_list(c, base + 4, "output_padding", g->nsp, 0, g->op));
	KI_TRY(kiln__i_int(c, base + 5, "groups", 1, &g->G));
	for (int k = 0; k < 3; k++) {
		if (g->s[k] <= 0 || g->d[k] <= 0 || g->p[k] < 0 || g->op[k] < 0)
			return kiln__i_bad(
			    c, "stride and dilation must be positive, "
			       "padding non-negative");
		g->K[k] = k < g->nsp ? w->size[2 + k] : 1;
	}
	if (g->G <= 0)
		return kiln__i_bad(c, "groups must be positive");
	g->N = x->size[0];
	int64_t ci = x->size[1];
	if (!*transposed) {
		if (w->size[0] % g->G != 0 || w->size[1] * g->G != ci) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), x->rank, x->size);
			kiln__i_fmt_shape(b, sizeof(b), w->rank, w->size);
			return kiln__i_bad(
			    c, "input %s and weight %s do not fit groups=%lld",
			    a, b, (long long)g->G);
		}
	} else if (w->size[0] != ci || ci % g->G != 0) {
		return kiln__i_bad(c,
				   "transposed: weight's dim 0 must equal the "
				   "input channels");
	}
	for (int k = 0; k < 3; k++) {
		int64_t in = k < g->nsp ? x->size[2 + k] : 1;
		int64_t ek = g->d[k] * (g->K[k] - 1) + 1;
		if (*transposed) {
			if (k < g->nsp && g->op[k] >= g->s[k] &&
			    g->op[k] >= g->d[k])
				return kiln__i_bad(
				    c,
				    "output_padding %lld must be smaller than "
				    "the stride %lld or the dilation %lld",
				    (long long)g->op[k], (long long)g->s[k],
				    (long long)g->d[k]);
			g->I[k] = in;
			g->O[k] =
			    (in - 1) * g->s[k] - 2 * g->p[k] + ek + g->op[k];
		} else {
			g->I[k] = in;
			g->O[k] = (in + 2 * g->p[k] - ek) / g->s[k] + 1;
			if (in + 2 * g->p[k] < ek)
				g->O[k] = 0;
		}
		if (g->O[k] <= 0 && k < g->nsp)
			return kiln__i_bad(
			    c,
			    "input size %lld is too small for kernel "
			    "%lld (dim %d)",
			    (long long)in, (long long)g->K[k], k);
	}
	return 0;
}

/*
 * The three loops every convolution is. "A" is the strided side (positions
 * a), "B" the positioned side (positions b = a*s - p + k*d):
 *   gather:  B2 is unused; dst[n, Ca, a] += Σ src[n, g*Cbg+cb, b] * w[ca, cb,
 * k] scatter: dst[n, g*Cbg+cb, b] += src[n, Ca, a] * w[ca, cb, k] wgrad: dw[ca,
 * cb, k] += A[n, ca, a] * B[n, g*Cbg+cb, b] with w of shape [Ca, Cb/G, K...],
 * Ca = A channels, Cb = B channels.
 */
enum { CV_GATHER, CV_SCATTER, CV_WGRAD };
static void conv_loops(int mode, const cgeo_t *g, int64_t Ca, int64_t Cb,
		       const int64_t *SA, const int64_t *SB, double *A,
		       double *B, double *W)
{
	int64_t Cag = Ca / g->G, Cbg = Cb / g->G;
	int64_t na = SA[0] * SA[1] * SA[2], nb = SB[0] * SB[1] * SB[2];
	int64_t nk = g->K[0] * g->K[1] * g->K[2];
	for (int64_t n = 0; n < g->N; n++)
		for (int64_t ca = 0; ca < Ca; ca++) {
			int64_t grp = ca / Cag;
			double *ap = A + (n * Ca + ca) * na;
			for (int64_t cb = 0; cb < Cbg; cb++) {
				double *bp = B + (n * Cb + grp * Cbg + cb) * nb;
				double *wp = W + (ca * Cbg + cb) * nk;
				for (int64_t a0 = 0; a0 < SA[0]; a0++)
					for (int64_t a1 = 0; a1 < SA[1]; a1++)
						for (int64_t a2 = 0; a2 < SA[2];
						     a2++) {
							double *av =
							    ap +
							    (a0 * SA[1] + a1) *
								SA[2] +
							    a2;
							for (int64_t k0 = 0;
							     k0 < g->K[0];
							     k0++) {
								int64_t b0 =
								    a0 *
									g->s[0] -
								    g->p[0] +
								    k0 *
									g->d[0];
								if (b0 < 0 ||
								    b0 >= SB[0])
									continue;
								for (int64_t
									 k1 = 0;
								     k1 <
								     g->K[1];
								     k1++) {
									int64_t b1 =
									    a1 *
										g->s[1] -
									    g->p[1] +
									    k1 *
										g->d[1];
									if (b1 <
										0 ||
									    b1 >=
										SB[1])
										continue;
									for (
									    int64_t k2 =
										0;
									    k2 <
									    g->K[2];
									    k2++) {
										int64_t b2 =
										    a2 *
											g->s[2] -
										    g->p[2] +
										    k2 *
											g->d[2];
										if (b2 <
											0 ||
										    b2 >=
											SB[2])
											continue;
										double *bv =
										    bp +
										    (b0 *
											 SB[1] +
										     b1) *
											SB[2] +
										    b2;
										double *wv =
										    wp +
										    (k0 *
											 g->K[1] +
										     k1) *
											g->K[2] +
										    k2;
										if (mode ==
										    CV_GATHER)
											*av +=
											    *bv *
											    *wv;
										else if (
										    mode ==
										    CV_SCATTER)
											*bv +=
											    *av *
											    *wv;
										else
											*wv +=
											    *av *
											    *bv;
									}
								}
							}
						}
			}
		}
}

static void sp_shape(const cgeo_t *g, const int64_t *sp, int64_t N, int64_t C,
		     int64_t *size)
{
	size[0] = N;
	size[1] = C;
	for (int k = 0; k < g->nsp; k++)
		size[2 + k] = sp[k];
}

/* convolution(input, weight, bias?, stride, padding, dilation, transposed,
 * output_padding, groups) */
int kiln__op_conv(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *w, *bt;
	cgeo_t g;
	bool tr;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(kiln__i_tensor(c, 1, "weight", &w));
	KI_TRY(kiln__i_tensor_opt(c, 2, "bias", &bt));
	if (!ki_isf(x->dt) || w->dt != x->dt || (bt && bt->dt != x->dt))
		return kiln__i_bad(
		    c, "input, weight and bias must be floating, one dtype");
	KI_TRY(conv_geo(c, x, w, 3, &tr, &g));
	int64_t Ci = x->size[1], Co = tr ? w->size[1] * g.G : w->size[0];
	if (bt && kiln__i_numel(bt) != Co)
		return kiln__i_bad(c, "bias must have %lld elements",
				   (long long)Co);
	int64_t osz[5];
	sp_shape(&g, g.O, g.N, Co, osz);
	KI_TRY(kiln__i_check_numel(c, w->rank, osz));
	int64_t on = kiln__i_numel_of(w->rank, osz);
	double *xv = NULL, *wv = NULL, *bv = NULL, *ov = ki_dcalloc(on);
	int rc = ov ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	if (rc == 0)
		rc = kiln__i_to_f(c, w, &wv);
	if (rc == 0 && bt)
		rc = kiln__i_to_f(c, bt, &bv);
	if (rc == 0) {
		if (!tr)
			conv_loops(CV_GATHER, &g, Co, Ci, g.O, g.I, ov, xv, wv);
		else
			conv_loops(CV_SCATTER, &g, Ci, Co, g.I, g.O, xv, ov,
				   wv);
		int64_t per = g.O[0] * g.O[1] * g.O[2];
		for (int64_t e = 0; bv && e < on; e++)
			ov[e] += bv[(e / per) % Co];
		rc = kiln__i_from_f(c, &c->out[0], x->dt, w->rank, osz, ov);
	}
	free6(xv, wv, bv, ov, NULL, NULL);
	return rc;
}

/* convolution_backward(grad_output, input, weight, bias_sizes?, stride,
 * padding, dilation, transposed, output_padding, groups, output_mask) */
int kiln__op_conv_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *gy, *x, *w;
	cgeo_t g;
	bool tr, mask[3];
	int nm;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &gy));
	KI_TRY(kiln__i_tensor(c, 1, "input", &x));
	KI_TRY(kiln__i_tensor(c, 2, "weight", &w));
	if (!ki_isf(x->dt) || w->dt != x->dt || gy->dt != x->dt)
		return kiln__i_bad(c, "tensors must be floating, one dtype");
	KI_TRY(conv_geo(c, x, w, 4, &tr, &g));
	KI_TRY(kiln__i_bools(c, 10, "output_mask", mask, 3, &nm));
	if (nm != 3)
		return kiln__i_bad(c, "output_mask must have 3 entries");
	int64_t Ci = x->size[1], Co = tr ? w->size[1] * g.G : w->size[0];
	int64_t osz[5];
	sp_shape(&g, g.O, g.N, Co, osz);
	if (gy->rank != w->rank ||
	    memcmp(gy->size, osz, w->rank * sizeof(int64_t)))
		return kiln__i_bad(
		    c, "grad_output does not have the convolution's "
		       "output shape");
	int64_t xn = kiln__i_numel(x), wn = kiln__i_numel(w);
	double *gv = NULL, *xv = NULL, *wv = NULL;
	double *gx = ki_dcalloc(xn);
	double *gw = ki_dcalloc(wn);
	double *gb = ki_dcalloc(Co);
	int rc = gx && gw && gb ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, gy, &gv);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	if (rc == 0)
		rc = kiln__i_to_f(c, w, &wv);
	if (rc == 0) {
		if (!tr) {
			if (mask[0])
				conv_loops(CV_SCATTER, &g, Co, Ci, g.O, g.I, gv,
					   gx, wv);
			if (mask[1])
				conv_loops(CV_WGRAD, &g, Co, Ci, g.O, g.I, gv,
					   xv, gw);
		} else {
			if (mask[0])
				conv_loops(CV_GATHER, &g, Ci, Co, g.I, g.O, gx,
					   gv, wv);
			if (mask[1])
				conv_loops(CV_WGRAD, &g, Ci, Co, g.I, g.O, xv,
					   gv, gw);
		}
		int64_t per = g.O[0] * g.O[1] * g.O[2], on = kiln__i_numel(gy);
		for (int64_t e = 0; e < on; e++)
			gb[(e / per) % Co] += gv[e];
	}
	for (int k = 0; rc == 0 && k < 3; k++) {
		if (!mask[k])
			rc = kiln__i_none_out(c, (uint32_t)k);
		else if (k == 0)
			rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank,
					    x->size, gx);
		else if (k == 1)
			rc = kiln__i_from_f(c, &c->out[1], x->dt, w->rank,
					    w->size, gw);
		else
			rc = kiln__i_from_f(c, &c->out[2], x->dt, 1, &Co, gb);
	}
	free6(gv, xv, wv, gx, gw, gb);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Pooling and upsampling (2d, input [N, C, H, W] or [C, H, W]) */
/* ------------------------------------------------------------------------ */

typedef struct pgeo {
	int64_t P; /* planes: N*C */
	int64_t H, W, OH, OW;
	int64_t k[2], s[2], p[2], d[2];
	bool ceil;
	int64_t osize[4];
	uint32_t rank;
} pgeo_t;

static int pool_out(ictx_t *c, int64_t in, int64_t k, int64_t s, int64_t p,
		    int64_t d, bool ceil_mode, int64_t *out)
{
	if (k <= 0 || s <= 0 || d <= 0 || p < 0)
		return kiln__i_bad(
		    c, "kernel, stride and dilation must be positive");
	if (k > KI_MAX_ELEMS || s > KI_MAX_ELEMS || d > KI_MAX_ELEMS ||
	    p > KI_MAX_ELEMS)
		return kiln__i_bad(c, "pooling parameters too large");
	if (p > ((k - 1) * d + 1) / 2)
		return kiln__i_bad(c,
				   "pad %lld should be at most half of the "
				   "effective kernel size",
				   (long long)p);
	int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
	int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
	if (ceil_mode && (o - 1) * s >= in + p)
		o--;
	if (o <= 0)
		return kiln__i_bad(c, "output size %lld is too small",
				   (long long)o);
	*out = o;
	return 0;
}

/* Reads kernel_size/stride/padding[/dilation]/ceil_mode from `base`. */
static int pool_geo(ictx_t *c, const it_t *x, int base, bool has_dil, pgeo_t *g)
{
	memset(g, 0, sizeof(*g));
	if (x->rank != 3 && x->rank != 4)
		return kiln__i_bad(c, "input must be 3D or 4D, not %uD",
				   x->rank);
	int64_t v[4];
	int n;
	KI_TRY(kiln__i_ints(c, base, "kernel_size", v, 2, &n));
	if (n < 1)
		return kiln__i_bad(c, "missing kernel_size");
	g->k[0] = v[0], g->k[1] = v[n == 1 ? 0 : 1];
	KI_TRY(kiln__i_ints(c, base + 1, "stride", v, 2, &n));
	g->s[0] = n <= 0 ? g->k[0] : v[0];
	g->s[1] = n <= 0 ? g->k[1] : v[n == 1 ? 0 : 1];
	KI_TRY(kiln__i_ints(c, base + 2, "padding", v, 2, &n));
	g->p[0] = n <= 0 ? 0 : v[0];
	g->p[1] = n <= 0 ? 0 : v[n == 1 ? 0 : 1];
	g->d[0] = g->d[1] = 1;
	if (has_dil) {
		KI_TRY(kiln__i_ints(c, base + 3, "dilation", v, 2, &n));
		if (n > 0)
			g->d[0] = v[0], g->d[1] = v[n == 1 ? 0 : 1];
	}
	KI_TRY(kiln__i_bool(c, base + (has_dil ? 4 : 3), "ceil_mode", false,
			    &g->ceil));
	g->rank = x->rank;
	g->H = x->size[x->rank - 2];
	g->W = x->size[x->rank - 1];
	g->P = kiln__i_numel_of(x->rank - 2, x->size);
	KI_TRY(pool_out(c, g->H, g->k[0], g->s[0], g->p[0], g->d[0], g->ceil,
			&g->OH));
	KI_TRY(pool_out(c, g->W, g->k[1], g->s[1], g->p[1], g->d[1], g->ceil,
			&g->OW));
	memcpy(g->osize, x->size, x->rank * sizeof(int64_t));
	g->osize[x->rank - 2] = g->OH;
	g->osize[x->rank - 1] = g->OW;
	return 0;
}

/* max_pool2d_with_indices(self, kernel_size, stride=[], padding=0,
 * dilation=1, ceil_mode=False) */
int kiln__op_maxpool(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	pgeo_t g;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	KI_TRY(pool_geo(c, x, 1, true, &g));
	double *xv;
	KI_TRY(kiln__i_to_f(c, x, &xv));
	int rc = kiln__i_alloc(c, &c->out[0], x->dt, g.rank, g.osize);
	if (rc == 0)
		rc = kiln__i_alloc(c, &c->out[1], KILN_DT_I64, g.rank, g.osize);
	for (int64_t pl = 0; rc == 0 && pl < g.P; pl++)
		for (int64_t oh = 0; oh < g.OH; oh++)
			for (int64_t ow = 0; ow < g.OW; ow++) {
				int64_t hs = oh * g.s[0] - g.p[0],
					ws = ow * g.s[1] - g.p[1];
				int64_t he = hs + (g.k[0] - 1) * g.d[0] + 1;
				int64_t we = ws + (g.k[1] - 1) * g.d[1] + 1;
				if (he > g.H)
					he = g.H;
				if (we > g.W)
					we = g.W;
				while (hs < 0)
					hs += g.d[0];
				while (ws < 0)
					ws += g.d[1];
				int64_t mi = hs * g.W + ws;
				double mv = -INFINITY;
				for (int64_t h = hs; h < he; h += g.d[0])
					for (int64_t w = ws; w < we;
					     w += g.d[1]) {
						double v = xv[pl * g.H * g.W +
							      h * g.W + w];
						if (v > mv || isnan(v)) {
							mv = v;
							mi = h * g.W + w;
						}
					}
				int64_t e = (pl * g.OH + oh) * g.OW + ow;
				ki_setf(&c->out[0], e, mv);
				ki_seti(&c->out[1], e, mi);
			}
	free(xv);
	return rc;
}

/* max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride,
 * padding, dilation, ceil_mode, indices) */
int kiln__op_maxpool_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *gy, *x, *ix;
	pgeo_t g;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &gy));
	KI_TRY(kiln__i_tensor(c, 1, "self", &x));
	KI_TRY(kiln__i_tensor(c, 7, "indices", &ix));
	KI_TRY(pool_geo(c, x, 2, true, &g));
	if (gy->rank != g.rank ||
	    memcmp(gy->size, g.osize, g.rank * sizeof(int64_t)) ||
	    ix->rank != g.rank ||
	    memcmp(ix->size, g.osize, g.rank * sizeof(int64_t)))
		return kiln__i_bad(
		    c, "grad_output and indices must have the pooled "
		       "shape");
	double *gv,
	    *ov = calloc((size_t)(kiln__i_numel(x) ? kiln__i_numel(x) : 1),
			 sizeof(double));
	int64_t *iv;
	if (ov == NULL)
		return kiln__i_oom(c);
	int rc = kiln__i_to_f(c, gy, &gv);
	if (rc < 0) {
		free(ov);
		return rc;
	}
	rc = kiln__i_to_i(c, ix, &iv);
	if (rc < 0) {
		free6(ov, gv, NULL, NULL, NULL, NULL);
		return rc;
	}
	int64_t per = g.OH * g.OW;
	for (int64_t e = 0; e < g.P * per && rc == 0; e++) {
		if (iv[e] < 0 || iv[e] >= g.H * g.W)
			rc = kiln__i_bad(c, "index %lld out of range",
					 (long long)iv[e]);
		else
			ov[(e / per) * g.H * g.W + iv[e]] += gv[e];
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, ov);
	free6(ov, gv, iv, NULL, NULL, NULL);
	return rc;
}

/* Window and divisor of avg-pool output (oh, ow); false if empty. */
static bool avg_window(const pgeo_t *g, int64_t oh, int64_t ow, bool incl,
		       int64_t divo, int64_t *hs, int64_t *he, int64_t *ws,
		       int64_t *we, double *div)
{
	*hs = oh * g->s[0] - g->p[0];
	*ws = ow * g->s[1] - g->p[1];
	*he = *hs + g->k[0];
	*we = *ws + g->k[1];
	if (*he > g->H + g->p[0])
		*he = g->H + g->p[0];
	if (*we > g->W + g->p[1])
		*we = g->W + g->p[1];
	int64_t pool = (*he - *hs) * (*we - *ws);
	if (*hs < 0)
		*hs = 0;
	if (*ws < 0)
		*ws = 0;
	if (*he > g->H)
		*he = g->H;
	if (*we > g->W)
		*we = g->W;
	if (*hs >= *he || *ws >= *we)
		return false;
	*div = divo   ? (double)divo
	       : incl ? (double)pool
		      : (double)((*he - *hs) * (*we - *ws));
	return true;
}

/* avg_pool2d(self, kernel_size, stride=[], padding=0, ceil_mode=False,
 * count_include_pad=True, divisor_override=None) and its backward
 * (grad_output first, then the same args) */
static int avgpool(ictx_t *c, bool bw)
{
	it_t *x, *gy = NULL;
	pgeo_t g;
	bool incl;
	int64_t divo;
	int b = bw ? 1 : 0;
	if (bw)
		KI_TRY(kiln__i_tensor(c, 0, "grad_output", &gy));
	KI_TRY(kiln__i_tensor(c, b, "self", &x));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	KI_TRY(pool_geo(c, x, b + 1, false, &g));
	KI_TRY(kiln__i_bool(c, b + 5, "count_include_pad", true, &incl));
	KI_TRY(kiln__i_int(c, b + 6, "divisor_override", 0, &divo));
	if (divo < 0)
		return kiln__i_bad(c, "divisor_override must be positive");
	if (gy && (gy->rank != g.rank ||
		   memcmp(gy->size, g.osize, g.rank * sizeof(int64_t))))
		return kiln__i_bad(c, "grad_output must have the pooled shape");
	double *xv, *ov;
	KI_TRY(kiln__i_to_f(c, bw ? gy : x, &xv));
	int64_t on = bw ? kiln__i_numel(x) : g.P * g.OH * g.OW;
	ov = ki_dcalloc(on);
	if (ov == NULL) {
		free(xv);
		return kiln__i_oom(c);
	}
	for (int64_t pl = 0; pl < g.P; pl++)
		for (int64_t oh = 0; oh < g.OH; oh++)
			for (int64_t ow = 0; ow < g.OW; ow++) {
				int64_t hs, he, ws, we,
				    e = (pl * g.OH + oh) * g.OW + ow;
				double div, s = 0;
				if (!avg_window(&g, oh, ow, incl, divo, &hs,
						&he, &ws, &we, &div))
					continue;
				for (int64_t h = hs; h < he; h++)
					for (int64_t w = ws; w < we; w++) {
						int64_t xi = pl * g.H * g.W +
							     h * g.W + w;
						if (bw)
							ov[xi] += xv[e] / div;
						else
							s += xv[xi];
					}
				if (!bw)
					ov[e] = s / div;
			}
	int rc = bw ? kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, ov)
		    : kiln__i_from_f(c, &c->out[0], x->dt, g.rank, g.osize, ov);
	free6(xv, ov, NULL, NULL, NULL, NULL);
	return rc;
}

int kiln__op_avgpool(ictx_t *c, int code)
{
	(void)code;
	return avgpool(c, false);
}

int kiln__op_avgpool_bw(ictx_t *c, int code)
{
	(void)code;
	return avgpool(c, true);
}

/* _adaptive_avg_pool2d(self, output_size) and _backward(grad_output, self) */
static int adaptive(ictx_t *c, bool bw)
{
	it_t *x, *gy = NULL;
	int64_t os[2], size[4];
	int n;
	if (bw) {
		KI_TRY(kiln__i_tensor(c, 0, "grad_output", &gy));
		KI_TRY(kiln__i_tensor(c, 1, "self", &x));
	} else {
		KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	}
	if (x->rank != 3 && x->rank != 4)
		return kiln__i_bad(c, "input must be 3D or 4D, not %uD",
				   x->rank);
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	if (bw) {
		if (gy->rank != x->rank)
			return kiln__i_bad(
			    c, "grad_output rank differs from self");
		os[0] = gy->size[gy->rank - 2];
		os[1] = gy->size[gy->rank - 1];
	} else {
		KI_TRY(kiln__i_ints(c, 1, "output_size", os, 2, &n));
		if (n == 1)
			os[1] = os[0];
		else if (n != 2)
			return kiln__i_bad(c,
					   "output_size must have 2 entries");
	}
	if (os[0] <= 0 || os[1] <= 0 || os[0] > KI_MAX_ELEMS ||
	    os[1] > KI_MAX_ELEMS)
		return kiln__i_bad(c, "output_size must be positive");
	int64_t H = x->size[x->rank - 2], W = x->size[x->rank - 1];
	int64_t P = kiln__i_numel_of(x->rank - 2, x->size);
	memcpy(size, x->size, sizeof(size));
	size[x->rank - 2] = os[0];
	size[x->rank - 1] = os[1];
	if (bw && memcmp(gy->size, size, x->rank * sizeof(int64_t)))
		return kiln__i_bad(c, "grad_output does not fit self");
	double *xv, *ov;
	KI_TRY(kiln__i_to_f(c, bw ? gy : x, &xv));
	int64_t on = bw ? kiln__i_numel(x) : P * os[0] * os[1];
	ov = ki_dcalloc(on);
	if (ov == NULL) {
		free(xv);
		return kiln__i_oom(c);
	}
	for (int64_t pl = 0; pl < P; pl++)
		for (int64_t oh = 0; oh < os[0]; oh++) {
			int64_t hs = oh * H / os[0],
				he = ((oh + 1) * H + os[0] - 1) / os[0];
			for (int64_t ow = 0; ow < os[1]; ow++) {
				int64_t ws = ow * W / os[1];
				int64_t we = ((ow + 1) * W + os[1] - 1) / os[1];
				int64_t e = (pl * os[0] + oh) * os[1] + ow;
				double div = (double)((he - hs) * (we - ws)),
				       s = 0;
				for (int64_t h = hs; h < he; h++)
					for (int64_t w = ws; w < we; w++) {
						int64_t xi =
						    (pl * H + h) * W + w;
						if (bw)
							ov[xi] += xv[e] / div;
						else
							s += xv[xi];
					}
				if (!bw)
					ov[e] = div > 0 ? s / div : 0;
			}
		}
	int rc = bw ? kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, ov)
		    : kiln__i_from_f(c, &c->out[0], x->dt, x->rank, size, ov);
	free6(xv, ov, NULL, NULL, NULL, NULL);
	return rc;
}

int kiln__op_adaptive(ictx_t *c, int code)
{
	(void)code;
	return adaptive(c, false);
}

int kiln__op_adaptive_bw(ictx_t *c, int code)
{
	(void)code;
	return adaptive(c, true);
}

/* torch's compute_scales_value (in float, as torch computes it) */
static float scale_value(double sc, bool has, int64_t in, int64_t out)
{
	return has && sc > 0 ? (float)(1.0 / sc) : (float)in / (float)out;
}

/* upsample_nearest2d(self, output_size, scales_h?, scales_w?) / .vec(input,
 * output_size?, scale_factors?) ; upsample_bilinear2d(self, output_size,
 * align_corners, scales_h?, scales_w?) / .vec(input, output_size?,
 * align_corners, scale_factors?) */
int kiln__op_upsample(ictx_t *c, int code)
{
	it_t *x;
	int64_t os[2];
	double sc[2] = {0, 0};
	bool has[2] = {false, false}, ac = false;
	bool bil = code == UP_BILINEAR || code == UP_BILINEAR_VEC;
	bool vec = code == UP_NEAREST_VEC || code == UP_BILINEAR_VEC;
	int n;
	KI_TRY(kiln__i_tensor(c, 0, vec ? "input" : "self", &x));
	if (x->rank != 4)
		return kiln__i_bad(c, "input must be 4D, not %uD", x->rank);
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	if (bil)
		KI_TRY(kiln__i_bool(c, 2, "align_corners", false, &ac));
	int64_t H = x->size[2], W = x->size[3];
	KI_TRY(kiln__i_ints(c, 1, "output_size", os, 2, &n));
	if (vec) {
		const kiln_arg_t *sf =
		    kiln__i_arg(c, bil ? 3 : 2, "scale_factors");
		if (sf != NULL) {
			if (sf->kind != KILN_ARG_LIST || sf->n != 2)
				return kiln__i_bad(
				    c, "scale_factors must have 2 entries");
			for (int k = 0; k < 2; k++) {
				const kiln_arg_t *e = &sf->u.list[k];
				sc[k] = e->kind == KILN_ARG_FLOAT
					    ? e->u.f
					    : (double)e->u.i;
				has[k] = true;
			}
			if (n < 0) {
				os[0] = (int64_t)floor((double)H * sc[0]);
				os[1] = (int64_t)floor((double)W * sc[1]);
				n = 2;
			}
		}
	} else {
		const char *nm[2] = {"scales_h", "scales_w"};
		int base = bil ? 3 : 2;
		for (int k = 0; k < 2; k++) {
			has[k] = kiln__i_arg(c, base + k, nm[k]) != NULL;
			KI_TRY(
			    kiln__i_num(c, base + k, nm[k], false, 0, &sc[k]));
		}
	}
	if (n != 2 || os[0] <= 0 || os[1] <= 0)
		return kiln__i_bad(c, "output size must be 2 positive ints");
	int64_t size[4] = {x->size[0], x->size[1], os[0], os[1]},
		P = size[0] * size[1];
	KI_TRY(kiln__i_check_numel(c, 4, size));
	double *xv, *ov = ki_dcalloc(P * os[0] * os[1]);
	if (ov == NULL)
		return kiln__i_oom(c);
	int rc = kiln__i_to_f(c, x, &xv);
	if (rc < 0) {
		free(ov);
		return rc;
	}
	int64_t in[2] = {H, W};
	for (int64_t pl = 0; pl < P; pl++)
		for (int64_t oh = 0; oh < os[0]; oh++)
			for (int64_t ow = 0; ow < os[1]; ow++) {
				int64_t o[2] = {oh, ow}, i0[2], i1[2];
				double l1[2];
				for (int k = 0; k < 2; k++) {
					if (!bil) {
						if (os[k] == in[k])
							i0[k] = o[k];
						else if (os[k] == 2 * in[k])
							i0[k] = o[k] >> 1;
						else {
							float s = scale_value(
							    sc[k], has[k],
							    in[k], os[k]);
							int64_t v =
							    (int64_t)floorf(
								(float)o[k] *
								s);
							i0[k] = v < in[k] - 1
								    ? v
								    : in[k] - 1;
						}
						continue;
					}
					double s =
					    ac ? (os[k] > 1
						      ? (double)(in[k] - 1) /
							    (double)(os[k] - 1)
						      : 0)
					       : (double)scale_value(
						     sc[k], has[k], in[k],
						     os[k]);
					double src =
					    ac ? s * (double)o[k]
					       : s * ((double)o[k] + 0.5) - 0.5;
					if (src < 0)
						src = 0;
					i0[k] = (int64_t)src;
					if (i0[k] > in[k] - 1)
						i0[k] = in[k] - 1;
					i1[k] =
					    i0[k] + (i0[k] < in[k] - 1 ? 1 : 0);
					l1[k] = src - (double)i0[k];
				}
				double *pp = xv + pl * H * W, v;
				if (!bil)
					v = pp[i0[0] * W + i0[1]];
				else
					v = (1 - l1[0]) *
						((1 - l1[1]) *
						     pp[i0[0] * W + i0[1]] +
						 l1[1] *
						     pp[i0[0] * W + i1[1]]) +
					    l1[0] *
						((1 - l1[1]) *
						     pp[i1[0] * W + i0[1]] +
						 l1[1] * pp[i1[0] * W + i1[1]]);
				ov[(pl * os[0] + oh) * os[1] + ow] = v;
			}
	rc = kiln__i_from_f(c, &c->out[0], x->dt, 4, size, ov);
	free6(xv, ov, NULL, NULL, NULL, NULL);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct att {
	int64_t B, H, L, S, E, Ev;
	double scale;
	bool causal;
	double *mask; /* [B*H*L*S] additive mask (0 / -inf / values), or NULL */
} att_t;

/* q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev]; dropout must be 0. */
static int att_setup(ictx_t *c, const it_t *q, const it_t *k, const it_t *v,
		     int pdrop, int pcausal, att_t *a)
{
	double drop;
	memset(a, 0, sizeof(*a));
	if (q->rank != 4 || k->rank != 4 || v->rank != 4)
		return kiln__i_bad(c, "query, key and value must be 4D");
	if (!ki_isf(q->dt) || k->dt != q->dt || v->dt != q->dt)
		return kiln__i_bad(
		    c, "query, key and value must be floating, one dtype");
	a->B = q->size[0], a->H = q->size[1], a->L = q->size[2],
	a->E = q->size[3];
	a->S = k->size[2], a->Ev = v->size[3];
	if (k->size[0] != a->B || v->size[0] != a->B || k->size[1] != a->H ||
	    v->size[1] != a->H || k->size[3] != a->E || v->size[2] != a->S)
		return kiln__i_bad(c,
				   "query, key and value shapes do not agree");
	KI_TRY(kiln__i_num(c, pdrop, "dropout_p", false, 0, &drop));
	if (drop != 0)
		return kiln__i_unsup(c, "dropout_p=%g is not reproducible",
				     drop);
	KI_TRY(kiln__i_bool(c, pcausal, "is_causal", false, &a->causal));
	KI_TRY(kiln__i_num(c, -1, "scale", false, 1 / sqrt((double)a->E),
			   &a->scale));
	it_t *m;
	KI_TRY(kiln__i_tensor_opt(c, -1, "attn_mask", &m));
	if (m == NULL)
		return 0;
	int64_t full[4] = {a->B, a->H, a->L, a->S}, bs[KI_MAXR];
	it_t probe = {.rank = 4}, mv;
	memcpy(probe.size, full, sizeof(full));
	it_t *two[2] = {m, &probe};
	uint32_t br;
	KI_TRY(kiln__i_bshape(c, two, 2, &br, bs));
	if (br != 4 || memcmp(bs, full, sizeof(full)))
		return kiln__i_bad(c,
				   "attn_mask does not broadcast to [B,H,L,S]");
	kiln__i_bview(m, 4, full, &mv);
	int64_t n = a->B * a->H * a->L * a->S, idx[KI_MAXR] = {0}, e = 0;
	a->mask = ki_dcalloc(n);
	if (a->mask == NULL)
		return kiln__i_oom(c);
	if (n > 0)
		do {
			double x = ki_getf(&mv, ki_off(&mv, idx));
			a->mask[e++] = m->dt == KILN_DT_BOOL
					   ? (x != 0 ? 0 : -INFINITY)
					   : x;
		} while (ki_next(idx, full, 4));
	return 0;
}

/* Row (b*H+h, i) of scores into s[0..S) (masked), returns the row max. */
static double att_scores(const att_t *a, const double *qv, const double *kv,
			 int64_t bh, int64_t i, double *s)
{
	double m = -INFINITY;
	const double *qr = qv + (bh * a->L + i) * a->E;
	for (int64_t j = 0; j < a->S; j++) {
		const double *kr = kv + (bh * a->S + j) * a->E;
		double d = 0;
		for (int64_t e = 0; e < a->E; e++)
			d += qr[e] * kr[e];
		d *= a->scale;
		if (a->mask)
			d += a->mask[(bh * a->L + i) * a->S + j];
		if (a->causal && j > i)
			d = -INFINITY;
		s[j] = d;
		m = d > m ? d : m;
	}
	return m;
}

static kiln_dtype_t lse_dtype(kiln_dtype_t dt)
{
	return dt == KILN_DT_F16 || dt == KILN_DT_BF16 ? KILN_DT_F32 : dt;
}

/* _scaled_dot_product_flash_attention_for_cpu(query, key, value,
 * dropout_p=0, is_causal=False, *, attn_mask=None, scale=None) */
int kiln__op_sdpa(ictx_t *c, int code)
{
	(void)code;
	it_t *q, *k, *v;
	att_t a;
	KI_TRY(kiln__i_tensor(c, 0, "query", &q));
	KI_TRY(kiln__i_tensor(c, 1, "key", &k));
	KI_TRY(kiln__i_tensor(c, 2, "value", &v));
	KI_TRY(att_setup(c, q, k, v, 3, 4, &a));
	int64_t BH = a.B * a.H;
	double *qv = NULL, *kv = NULL, *vv = NULL;
	double *ov = ki_dcalloc(BH * a.L * a.Ev);
	double *lv = ki_dcalloc(BH * a.L);
	double *s = ki_dcalloc(a.S);
	int rc = ov && lv && s ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, q, &qv);
	if (rc == 0)
		rc = kiln__i_to_f(c, k, &kv);
	if (rc == 0)
		rc = kiln__i_to_f(c, v, &vv);
	for (int64_t bh = 0; rc == 0 && bh < BH; bh++)
		for (int64_t i = 0; i < a.L; i++) {
			double m = att_scores(&a, qv, kv, bh, i, s), sum = 0;
			double *orow = ov + (bh * a.L + i) * a.Ev;
			if (isinf(m) && m < 0) {
				/* a fully masked row: torch's CPU kernel writes
				 * zeros and a logsumexp of 0 */
				lv[bh * a.L + i] = 0;
				continue;
			}
			for (int64_t j = 0; j < a.S; j++) {
				s[j] = exp(s[j] - m);
				sum += s[j];
			}
			for (int64_t j = 0; j < a.S; j++) {
				const double *vr = vv + (bh * a.S + j) * a.Ev;
				for (int64_t e = 0; e < a.Ev; e++)
					orow[e] += s[j] / sum * vr[e];
			}
			lv[bh * a.L + i] = m + log(sum);
		}
	int64_t osz[4] = {a.B, a.H, a.L, a.Ev};
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], q->dt, 4, osz, ov);
	if (rc == 0)
		rc =
		    kiln__i_from_f(c, &c->out[1], lse_dtype(q->dt), 3, osz, lv);
	free6(qv, kv, vv, ov, lv, s);
	free(a.mask);
	return rc;
}

/* _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query,
 * key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale) */
int kiln__op_sdpa_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *go, *q, *k, *v, *o, *l;
	att_t a;
	KI_TRY(kiln__i_tensor(c, 0, "grad_out", &go));
	KI_TRY(kiln__i_tensor(c, 1, "query", &q));
	KI_TRY(kiln__i_tensor(c, 2, "key", &k));
	KI_TRY(kiln__i_tensor(c, 3, "value", &v));
	KI_TRY(kiln__i_tensor(c, 4, "out", &o));
	KI_TRY(kiln__i_tensor(c, 5, "logsumexp", &l));
	int64_t BH;
	{
		int rc = att_setup(c, q, k, v, 6, 7, &a);
		if (rc < 0)
			return rc;
		BH = a.B * a.H;
		int64_t osz[4] = {a.B, a.H, a.L, a.Ev};
		if (go->rank != 4 || memcmp(go->size, osz, sizeof(osz)) ||
		    o->rank != 4 || memcmp(o->size, osz, sizeof(osz)) ||
		    kiln__i_numel(l) != BH * a.L) {
			free(a.mask);
			return kiln__i_bad(
			    c, "grad_out, out or logsumexp has the wrong "
			       "shape");
		}
	}
	double *gv = NULL, *qv = NULL, *kv = NULL, *vv = NULL, *ovv = NULL,
	       *lv = NULL;
	double *dq = ki_dcalloc(BH * a.L * a.E);
	double *dk = ki_dcalloc(BH * a.S * a.E);
	double *dv = ki_dcalloc(BH * a.S * a.Ev);
	double *s = ki_dcalloc(a.S);
	int rc = dq && dk && dv && s ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, go, &gv);
	if (rc == 0)
		rc = kiln__i_to_f(c, q, &qv);
	if (rc == 0)
		rc = kiln__i_to_f(c, k, &kv);
	if (rc == 0)
		rc = kiln__i_to_f(c, v, &vv);
	if (rc == 0)
		rc = kiln__i_to_f(c, o, &ovv);
	if (rc == 0)
		rc = kiln__i_to_f(c, l, &lv);
	for (int64_t bh = 0; rc == 0 && bh < BH; bh++)
		for (int64_t i = 0; i < a.L; i++) {
			int64_t row = bh * a.L + i;
			double lse = lv[row], D = 0;
			if (isinf(lse) && lse < 0)
				continue;
			att_scores(&a, qv, kv, bh, i, s);
			const double *gr = gv + row * a.Ev,
				     *orow = ovv + row * a.Ev;
			for (int64_t e = 0; e < a.Ev; e++)
				D += gr[e] * orow[e];
			for (int64_t j = 0; j < a.S; j++) {
				double p = exp(s[j] - lse);
				const double *vr = vv + (bh * a.S + j) * a.Ev;
				double *dvr = dv + (bh * a.S + j) * a.Ev,
				       dp = 0;
				for (int64_t e = 0; e < a.Ev; e++) {
					dvr[e] += p * gr[e];
					dp += gr[e] * vr[e];
				}
				double ds = p * (dp - D) * a.scale;
				const double *kr = kv + (bh * a.S + j) * a.E;
				const double *qr = qv + row * a.E;
				double *dkr = dk + (bh * a.S + j) * a.E,
				       *dqr = dq + row * a.E;
				for (int64_t e = 0; e < a.E; e++) {
					dqr[e] += ds * kr[e];
					dkr[e] += ds * qr[e];
				}
			}
		}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], q->dt, 4, q->size, dq);
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[1], q->dt, 4, k->size, dk);
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[2], q->dt, 4, v->size, dv);
	free6(gv, qv, kv, vv, ovv, lv);
	free6(dq, dk, dv, s, a.mask, NULL);
	return rc;
}
