/*
 * interp_ops.c — the reference interpreter's reductions (sum, mean, amax,
 * max.dim, argmax, prod, var/std, any/all, logsumexp, cumsum) and
 * normalisations (softmax, layer/batch/group norm and their backwards).
 * Conventions and representation: interp_internal.h.
 *
 * Reductions gather each output's elements through a strided plan and
 * accumulate in f64 (int64 for integer results); normalisations copy their
 * inputs into contiguous f64 arrays. Either way results are rounded once,
 * at the output.
 *
 * Threads: any; no global state.
 */
#include "compiler/interp_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------ */

/* Parses a dim list (or single dim) into mask[0..rank); None / [] mean all
 * dims when none_all. Duplicates are an error. */
int kiln__i_parse_dims(ictx_t *c, const it_t *x, int pos, const char *name,
		       bool none_all, bool *mask, int *count)
{
	int64_t d[KI_MAXR * 2];
	int n;
	memset(mask, 0, KI_MAXR * sizeof(bool));
	KI_TRY(kiln__i_ints(c, pos, name, d, KI_MAXR * 2, &n));
	if (n < 0 && !none_all)
		return kiln__i_bad(c, "missing dim");
	if (n <= 0) {
		/* None or [] reduce over every dim; for flip/squeeze.dims an
		 * empty list names no dim */
		for (uint32_t k = 0; k < x->rank; k++)
			mask[k] = none_all;
		*count = none_all ? (int)x->rank : 0;
		return 0;
	}
	for (int k = 0; k < n; k++) {
		uint32_t w;
		KI_TRY(kiln__i_dim(c, d[k], x->rank, &w));
		if (x->rank == 0)
			continue;
		if (mask[w])
			return kiln__i_bad(c, "dim %u appears more than once",
					   w);
		mask[w] = true;
	}
	*count = n;
	return 0;
}

/* The shape after reducing the masked dims (kept as 1 with keepdim). */
static uint32_t reduced_shape(const it_t *x, const bool *mask, bool keepdim,
			      int64_t *size)
{
	uint32_t r = 0;
	for (uint32_t d = 0; d < x->rank; d++) {
		if (!mask[d])
			size[r++] = x->size[d];
		else if (keepdim)
			size[r++] = 1;
	}
	return r;
}

/* Iteration plan: kept dims outer (output order), reduced dims inner. */
typedef struct red {
	uint32_t nk, nr;
	int64_t ks[KI_MAXR], kst[KI_MAXR], rs[KI_MAXR], rst[KI_MAXR];
	int64_t kn, rn;
} red_t;

static void red_plan(const it_t *x, const bool *mask, red_t *p)
{
	memset(p, 0, sizeof(*p));
	p->kn = p->rn = 1;
	for (uint32_t d = 0; d < x->rank; d++) {
		if (mask[d]) {
			p->rs[p->nr] = x->size[d];
			p->rst[p->nr++] = x->stride[d];
			p->rn *= x->size[d];
		} else {
			p->ks[p->nk] = x->size[d];
			p->kst[p->nk++] = x->stride[d];
			p->kn *= x->size[d];
		}
	}
}

/* Gathers group k's reduced elements (as doubles, or int64 when vi). */
static void red_gather(const it_t *x, const red_t *p, int64_t k, double *vf,
		       int64_t *vi)
{
	int64_t base = x->off, idx[KI_MAXR] = {0};
	for (uint32_t d = p->nk; d-- > 0;) {
		base += (k % p->ks[d]) * p->kst[d];
		k /= p->ks[d];
	}
	if (p->rn == 0)
		return;
	int64_t j = 0;
	do {
		int64_t o = base;
		for (uint32_t d = 0; d < p->nr; d++)
			o += idx[d] * p->rst[d];
		if (vi)
			vi[j++] = ki_geti(x, o);
		else
			vf[j++] = ki_getf(x, o);
	} while (ki_next(idx, p->rs, p->nr));
}

/* Outer / length / inner decomposition around one dim of a contiguous
 * array of shape x. */
static void around(const it_t *x, uint32_t dim, int64_t *outer, int64_t *len,
		   int64_t *inner)
{
	*outer = *inner = 1;
	*len = x->rank ? x->size[dim] : 1;
	for (uint32_t d = 0; d < x->rank; d++) {
		if (d < dim)
			*outer *= x->size[d];
		else if (d > dim)
			*inner *= x->size[d];
	}
}

int kiln__i_need_shape(ictx_t *c, const it_t *t, const char *what,
		       uint32_t rank, const int64_t *size)
{
	if (t->rank == rank &&
	    memcmp(t->size, size, rank * sizeof(int64_t)) == 0)
		return 0;
	char a[160], b[160];
	kiln__i_fmt_shape(a, sizeof(a), t->rank, t->size);
	kiln__i_fmt_shape(b, sizeof(b), rank, size);
	return kiln__i_bad(c, "%s has shape %s, expected %s", what, a, b);
}

static int need_float(ictx_t *c, const it_t *t, const char *what)
{
	if (ki_isf(t->dt))
		return 0;
	return kiln__i_bad(c, "%s must be floating, not %s", what,
			   kiln_dtype_name(t->dt));
}

/* ------------------------------------------------------------------------ */
/* Reductions                                                                 */
/* ------------------------------------------------------------------------ */

int kiln__op_reduce(ictx_t *c, int code)
{
	it_t *x;
	bool mask[KI_MAXR], keepdim = false, given = false;
	int cnt;
	double ord = 2; /* linalg_vector_norm(self, ord, dim, keepdim) */
	int dpos = code == R_NORM ? 2 : 1;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (code == R_NORM) {
		KI_TRY(kiln__i_num(c, 1, "ord", false, 2, &ord));
		if (!ki_isf(x->dt))
			return kiln__i_bad(c,
					   "linalg_vector_norm takes floating "
					   "tensors, not %s",
					   kiln_dtype_name(x->dt));
	}
	if (code == R_MAXALL || code == R_MINALL) {
		for (uint32_t d = 0; d < x->rank; d++)
			mask[d] = true;
	} else {
		KI_TRY(kiln__i_parse_dims(c, x, dpos, "dim", true, mask, &cnt));
		KI_TRY(kiln__i_bool(c, dpos + 1, "keepdim", false, &keepdim));
	}
	kiln_dtype_t odt = x->dt;
	if (code == R_SUM || code == R_PROD || code == R_MEAN || code == R_NORM)
		KI_TRY(kiln__i_dtype(c, -1, "dtype", &odt, &given));
	switch (code) {
	case R_SUM:
	case R_PROD:
		if (!given && !ki_isf(odt))
			odt = KILN_DT_I64;
		break;
	case R_MEAN:
		if (!ki_isf(odt))
			return kiln__i_bad(
			    c, "mean needs a floating dtype, not %s",
			    kiln_dtype_name(odt));
		break;
	case R_ANY:
	case R_ALL:
		odt = x->dt == KILN_DT_U8 ? KILN_DT_U8 : KILN_DT_BOOL;
		break;
	case R_LSE: odt = ki_isf(odt) ? odt : KILN_DT_F32; break;
	default: break;
	}
	red_t p;
	red_plan(x, mask, &p);
	if ((code == R_AMAX || code == R_AMIN || code == R_MAXALL ||
	     code == R_MINALL || (code == R_NORM && isinf(ord))) &&
	    p.rn == 0)
		return kiln__i_bad(c, "cannot reduce over an empty dimension "
				      "(no identity)");
	int64_t size[KI_MAXR];
	uint32_t r = reduced_shape(x, mask, keepdim, size);
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, odt, r, size));
	bool useint = !ki_isf(odt) && !ki_isf(x->dt);
	double *vf = NULL;
	int64_t *vi = NULL;
	if (useint)
		vi = malloc((size_t)(p.rn ? p.rn : 1) * sizeof(int64_t));
	else
		vf = ki_dcalloc(p.rn);
	if (vf == NULL && vi == NULL)
		return kiln__i_oom(c);
	for (int64_t k = 0; k < p.kn; k++) {
		red_gather(x, &p, k, vf, vi);
		int64_t n = p.rn;
		if (useint) {
			int64_t a = code == R_PROD || code == R_ALL ? 1 : 0;
			for (int64_t j = 0; j < n; j++) {
				int64_t v = vi[j];
				switch (code) {
				case R_SUM:
					a = (int64_t)((uint64_t)a +
						      (uint64_t)v);
					break;
				case R_PROD:
					a = (int64_t)((uint64_t)a *
						      (uint64_t)v);
					break;
				case R_ANY: a = a || v; break;
				case R_ALL: a = a && v; break;
				case R_AMAX:
				case R_MAXALL:
					a = j == 0 || v > a ? v : a;
					break;
				case R_AMIN:
				case R_MINALL:
					a = j == 0 || v < a ? v : a;
					break;
				default: break;
				}
			}
			ki_seti(o, k, a);
			continue;
		}
		double a = code == R_PROD || code == R_ALL ? 1 : 0;
		double m = -INFINITY;
		if (code == R_NORM) {
			/* |x|: the sum of |x|^ord, or the max (ord inf) or the
			 * min (-inf) of |x|, or the count of non-zeros (0) */
			a = isinf(ord) && ord < 0 ? INFINITY : 0;
			for (int64_t j = 0; j < n; j++) {
				double v = fabs(vf[j]);
				if (isinf(ord))
					a = isnan(a) || isnan(v) ? NAN
					    : ord > 0		 ? fmax(a, v)
								 : fmin(a, v);
				else if (ord == 0)
					a += v != 0;
				else if (ord == 1)
					a += v;
				else if (ord == 2)
					a += v * v;
				else
					a += pow(v, ord);
			}
			if (ord == 2)
				a = sqrt(a);
			else if (!isinf(ord) && ord != 0 && ord != 1)
				a = pow(a, 1 / ord);
			ki_setf(o, k, a);
			continue;
		}
		if (code == R_LSE)
			for (int64_t j = 0; j < n; j++)
				m = vf[j] > m || isnan(vf[j]) ? vf[j] : m;
		for (int64_t j = 0; j < n; j++) {
			double v = vf[j];
			switch (code) {
			case R_SUM:
			case R_MEAN: a += v; break;
			case R_PROD: a *= v; break;
			case R_ANY: a = a != 0 || v != 0; break;
			case R_ALL: a = a != 0 && v != 0; break;
			case R_AMAX:
			case R_MAXALL:
				a = j == 0 || isnan(v) || v > a
					? (isnan(a) && j ? a : v)
					: a;
				break;
			case R_AMIN:
			case R_MINALL:
				a = j == 0 || isnan(v) || v < a
					? (isnan(a) && j ? a : v)
					: a;
				break;
			case R_LSE: a += exp(v - m); break;
			default: break;
			}
		}
		if (code == R_MEAN)
			a /= (double)n;
		if (code == R_LSE)
			a = isinf(m) ? m : m + log(a);
		ki_setf(o, k, a);
	}
	free(vf);
	free(vi);
	return 0;
}

/* max.dim / min.dim: values and int64 indices (first occurrence, NaN wins) */
int kiln__op_minmax_dim(ictx_t *c, int ismax)
{
	it_t *x;
	int64_t dim;
	bool keepdim, mask[KI_MAXR] = {0};
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_bool(c, 2, "keepdim", false, &keepdim));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (x->rank > 0)
		mask[d] = true;
	red_t p;
	red_plan(x, mask, &p);
	if (p.rn == 0)
		return kiln__i_bad(c, "cannot reduce over an empty dimension");
	int64_t size[KI_MAXR];
	uint32_t r = reduced_shape(x, mask, keepdim, size);
	KI_TRY(kiln__i_alloc(c, &c->out[0], x->dt, r, size));
	KI_TRY(kiln__i_alloc(c, &c->out[1], KILN_DT_I64, r, size));
	double *v = malloc((size_t)p.rn * sizeof(double));
	if (v == NULL)
		return kiln__i_oom(c);
	for (int64_t k = 0; k < p.kn; k++) {
		red_gather(x, &p, k, v, NULL);
		int64_t bi = 0;
		for (int64_t j = 1; j < p.rn && !isnan(v[bi]); j++)
			if (isnan(v[j]) ||
			    (ismax ? v[j] > v[bi] : v[j] < v[bi]))
				bi = j;
		ki_setf(&c->out[0], k, v[bi]);
		ki_seti(&c->out[1], k, bi);
	}
	free(v);
	return 0;
}

/* argmax / argmin (dim=None: over the flattened tensor) */
int kiln__op_argred(ictx_t *c, int ismax)
{
	it_t *x;
	bool keepdim, mask[KI_MAXR] = {0};
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (x->dt == KILN_DT_BOOL)
		return kiln__i_bad(c, "does not take bool input");
	const kiln_arg_t *da = kiln__i_arg(c, 1, "dim");
	KI_TRY(kiln__i_bool(c, 2, "keepdim", false, &keepdim));
	int64_t size[KI_MAXR];
	uint32_t r;
	if (da == NULL) {
		for (uint32_t d = 0; d < x->rank; d++)
			mask[d] = true;
		r = keepdim ? x->rank : 0;
		for (uint32_t d = 0; d < r; d++)
			size[d] = 1;
	} else {
		int64_t dim;
		uint32_t d;
		KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
		KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
		if (x->rank > 0)
			mask[d] = true;
		r = reduced_shape(x, mask, keepdim, size);
	}
	red_t p;
	red_plan(x, mask, &p);
	if (p.rn == 0)
		return kiln__i_bad(c, "cannot reduce over an empty dimension");
	KI_TRY(kiln__i_alloc(c, &c->out[0], KILN_DT_I64, r, size));
	double *v = malloc((size_t)p.rn * sizeof(double));
	if (v == NULL)
		return kiln__i_oom(c);
	for (int64_t k = 0; k < p.kn; k++) {
		red_gather(x, &p, k, v, NULL);
		int64_t bi = 0;
		for (int64_t j = 1; j < p.rn && !isnan(v[bi]); j++)
			if (isnan(v[j]) ||
			    (ismax ? v[j] > v[bi] : v[j] < v[bi]))
				bi = j;
		ki_seti(&c->out[0], k, bi);
	}
	free(v);
	return 0;
}

/* var / std: .correction(self, dim=None, *, correction=None, keepdim=False),
 * .dim(self, dim, unbiased=True, keepdim=False), .default(self, unbiased) */
int kiln__op_varstd(ictx_t *c, int code)
{
	it_t *x;
	bool mask[KI_MAXR], keepdim = false, unbiased = true;
	int cnt;
	double corr = 1;
	const char *ov = strrchr(c->nd->op, '.');
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(need_float(c, x, "input"));
	if (strcmp(ov, ".default") == 0) {
		KI_TRY(kiln__i_bool(c, 1, "unbiased", true, &unbiased));
		KI_TRY(kiln__i_parse_dims(c, x, -1, "no_such_arg", true, mask,
					  &cnt));
		corr = unbiased;
	} else if (strcmp(ov, ".dim") == 0) {
		KI_TRY(kiln__i_parse_dims(c, x, 1, "dim", true, mask, &cnt));
		KI_TRY(kiln__i_bool(c, 2, "unbiased", true, &unbiased));
		KI_TRY(kiln__i_bool(c, 3, "keepdim", false, &keepdim));
		corr = unbiased;
	} else {
		KI_TRY(kiln__i_parse_dims(c, x, 1, "dim", true, mask, &cnt));
		KI_TRY(kiln__i_num(c, -1, "correction", false, 1, &corr));
		KI_TRY(kiln__i_bool(c, -1, "keepdim", false, &keepdim));
	}
	red_t p;
	red_plan(x, mask, &p);
	int64_t size[KI_MAXR];
	uint32_t r = reduced_shape(x, mask, keepdim, size);
	KI_TRY(kiln__i_alloc(c, &c->out[0], x->dt, r, size));
	double *v = ki_dcalloc(p.rn);
	if (v == NULL)
		return kiln__i_oom(c);
	for (int64_t k = 0; k < p.kn; k++) {
		red_gather(x, &p, k, v, NULL);
		double m = 0, s = 0;
		for (int64_t j = 0; j < p.rn; j++)
			m += v[j];
		m /= (double)p.rn;
		for (int64_t j = 0; j < p.rn; j++)
			s += (v[j] - m) * (v[j] - m);
		double div = (double)p.rn - corr;
		double var = s / (div > 0 ? div : 0);
		ki_setf(&c->out[0], k, code == V_STD ? sqrt(var) : var);
	}
	free(v);
	return 0;
}

int kiln__op_cumsum(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t dim;
	uint32_t d;
	bool given;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	kiln_dtype_t odt = x->dt;
	KI_TRY(kiln__i_dtype(c, -1, "dtype", &odt, &given));
	if (!given && !ki_isf(odt))
		odt = KILN_DT_I64;
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, odt, x->rank, x->size));
	int64_t outer, len, inner;
	around(x, d, &outer, &len, &inner);
	bool useint = !ki_isf(odt);
	int64_t *vi = NULL;
	double *vf = NULL;
	int rc = useint ? kiln__i_to_i(c, x, &vi) : kiln__i_to_f(c, x, &vf);
	if (rc < 0)
		return rc;
	for (int64_t a = 0; a < outer; a++)
		for (int64_t i = 0; i < inner; i++) {
			int64_t si = 0;
			double sf = 0;
			for (int64_t k = 0; k < len; k++) {
				int64_t e = (a * len + k) * inner + i;
				if (useint) {
					si = (int64_t)((uint64_t)si +
						       (uint64_t)vi[e]);
					ki_seti(o, e, si);
				} else {
					sf += vf[e];
					ki_setf(o, e, sf);
				}
			}
		}
	free(vi);
	free(vf);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Softmax                                                                    */
/* ------------------------------------------------------------------------ */

/* _softmax / _log_softmax(self, dim, half_to_float); islog 2:
 * _safe_softmax(self, dim, dtype=None), whose rows of only -inf are 0 */
int kiln__op_softmax(ictx_t *c, int islog)
{
	it_t *x;
	int64_t dim;
	uint32_t d;
	bool h2f = false;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	kiln_dtype_t odt = x->dt;
	if (islog == 2) {
		bool given = false;
		KI_TRY(kiln__i_dtype(c, 2, "dtype", &odt, &given));
		if (!given)
			odt = x->dt;
		if (!kiln_dtype_is_float(odt))
			return kiln__i_bad(c, "dtype must be floating");
	} else {
		KI_TRY(kiln__i_bool(c, 2, "half_to_float", false, &h2f));
	}
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (h2f) {
		if (odt != KILN_DT_F16 && odt != KILN_DT_BF16)
			return kiln__i_bad(
			    c, "half_to_float needs an f16/bf16 input");
		odt = KILN_DT_F32;
	}
	double *v;
	KI_TRY(kiln__i_to_f(c, x, &v));
	int64_t outer, len, inner;
	around(x, d, &outer, &len, &inner);
	for (int64_t a = 0; a < outer; a++)
		for (int64_t i = 0; i < inner; i++) {
			double m = -INFINITY, s = 0;
			double *p = v + a * len * inner + i;
			bool masked = true;
			for (int64_t k = 0; k < len; k++) {
				m = p[k * inner] > m ? p[k * inner] : m;
				masked = masked && p[k * inner] == -INFINITY;
			}
			if (islog == 2 && masked) {
				for (int64_t k = 0; k < len; k++)
					p[k * inner] = 0;
				continue;
			}
			if (isinf(m))
				m = 0;
			for (int64_t k = 0; k < len; k++)
				s += exp(p[k * inner] - m);
			for (int64_t k = 0; k < len; k++)
				p[k * inner] = islog == 1
						   ? p[k * inner] - m - log(s)
						   : exp(p[k * inner] - m) / s;
		}
	int rc = kiln__i_from_f(c, &c->out[0], odt, x->rank, x->size, v);
	free(v);
	return rc;
}

/* _softmax_backward_data / _log_softmax_backward_data(grad_output, output,
 * dim, input_dtype) */
int kiln__op_softmax_bw(ictx_t *c, int islog)
{
	it_t *g, *y;
	int64_t dim;
	uint32_t d;
	kiln_dtype_t idt;
	bool given;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, 1, "output", &y));
	KI_TRY(kiln__i_int(c, 2, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_dtype(c, 3, "input_dtype", &idt, &given));
	if (!given)
		return kiln__i_bad(c, "missing input_dtype");
	KI_TRY(need_float(c, g, "grad_output"));
	if (!ki_same_shape(g, y))
		return kiln__i_need_shape(c, y, "output", g->rank, g->size);
	KI_TRY(kiln__i_dim(c, dim, g->rank, &d));
	double *gv, *yv;
	KI_TRY(kiln__i_to_f(c, g, &gv));
	int rc = kiln__i_to_f(c, y, &yv);
	if (rc < 0) {
		free(gv);
		return rc;
	}
	int64_t outer, len, inner;
	around(g, d, &outer, &len, &inner);
	for (int64_t a = 0; a < outer; a++)
		for (int64_t i = 0; i < inner; i++) {
			int64_t b = a * len * inner + i;
			double s = 0;
			for (int64_t k = 0; k < len; k++)
				s += islog ? gv[b + k * inner]
					   : gv[b + k * inner] *
						 yv[b + k * inner];
			for (int64_t k = 0; k < len; k++) {
				int64_t e = b + k * inner;
				gv[e] = islog ? gv[e] - exp(yv[e]) * s
					      : yv[e] * (gv[e] - s);
			}
		}
	rc = kiln__i_from_f(c, &c->out[0], idt, g->rank, g->size, gv);
	free(gv);
	free(yv);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Layer norm                                                                 */
/* ------------------------------------------------------------------------ */

/* Checks normalized_shape against x's trailing dims; M rows of N. */
static int norm_split(ictx_t *c, const it_t *x, int pos, int64_t *ns, int *nn,
		      int64_t *M, int64_t *N)
{
	KI_TRY(kiln__i_ints(c, pos, "normalized_shape", ns, KI_MAXR, nn));
	if (*nn < 0 || (uint32_t)*nn > x->rank)
		return kiln__i_bad(
		    c, "normalized_shape does not fit a rank-%u input",
		    x->rank);
	uint32_t axis = x->rank - (uint32_t)*nn;
	for (int k = 0; k < *nn; k++)
		if (ns[k] != x->size[axis + (uint32_t)k]) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), (uint32_t)*nn, ns);
			kiln__i_fmt_shape(b, sizeof(b), x->rank, x->size);
			return kiln__i_bad(
			    c,
			    "normalized_shape %s does not match the "
			    "trailing dims of input %s",
			    a, b);
		}
	*M = kiln__i_numel_of(axis, x->size);
	*N = kiln__i_numel_of((uint32_t)*nn, ns);
	return 0;
}

/* Optional per-feature vector (weight/bias) as doubles of length n, or NULL. */
static int opt_vec(ictx_t *c, int pos, const char *name, uint32_t rank,
		   const int64_t *shape, double **v)
{
	it_t *t;
	*v = NULL;
	KI_TRY(kiln__i_tensor_opt(c, pos, name, &t));
	if (t == NULL)
		return 0;
	KI_TRY(kiln__i_need_shape(c, t, name, rank, shape));
	return kiln__i_to_f(c, t, v);
}

int kiln__op_layer_norm(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t ns[KI_MAXR], M, N;
	int nn;
	double eps, *w = NULL, *b = NULL, *xv = NULL;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(norm_split(c, x, 1, ns, &nn, &M, &N));
	KI_TRY(kiln__i_num(c, 4, "eps", true, 0, &eps));
	int rc = opt_vec(c, 2, "weight", (uint32_t)nn, ns, &w);
	if (rc == 0)
		rc = opt_vec(c, 3, "bias", (uint32_t)nn, ns, &b);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	int64_t ssize[KI_MAXR];
	uint32_t axis = x->rank - (uint32_t)nn;
	for (uint32_t d = 0; d < x->rank; d++)
		ssize[d] = d < axis ? x->size[d] : 1;
	if (rc == 0)
		rc = kiln__i_alloc(c, &c->out[1], x->dt, x->rank, ssize);
	if (rc == 0)
		rc = kiln__i_alloc(c, &c->out[2], x->dt, x->rank, ssize);
	for (int64_t m = 0; rc == 0 && m < M; m++) {
		double *p = xv + m * N, mean = 0, var = 0;
		for (int64_t k = 0; k < N; k++)
			mean += p[k];
		mean = N ? mean / (double)N : 0;
		for (int64_t k = 0; k < N; k++)
			var += (p[k] - mean) * (p[k] - mean);
		var = N ? var / (double)N : 0;
		double rstd = 1 / sqrt(var + eps);
		for (int64_t k = 0; k < N; k++)
			p[k] = (p[k] - mean) * rstd * (w ? w[k] : 1) +
			       (b ? b[k] : 0);
		ki_setf(&c->out[1], m, mean);
		ki_setf(&c->out[2], m, rstd);
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, xv);
	free(w);
	free(b);
	free(xv);
	return rc;
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
 * weight?, bias?, output_mask) */
int kiln__op_layer_norm_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *x, *mt, *rt, *wt, *bt;
	int64_t ns[KI_MAXR], M, N;
	int nn, nm;
	bool mask[3];
	KI_TRY(kiln__i_tensor(c, 0, "grad_out", &g));
	KI_TRY(kiln__i_tensor(c, 1, "input", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(norm_split(c, x, 2, ns, &nn, &M, &N));
	KI_TRY(kiln__i_need_shape(c, g, "grad_out", x->rank, x->size));
	KI_TRY(kiln__i_tensor(c, 3, "mean", &mt));
	KI_TRY(kiln__i_tensor(c, 4, "rstd", &rt));
	KI_TRY(kiln__i_tensor_opt(c, 5, "weight", &wt));
	KI_TRY(kiln__i_tensor_opt(c, 6, "bias", &bt));
	KI_TRY(kiln__i_bools(c, 7, "output_mask", mask, 3, &nm));
	if (nm != 3)
		return kiln__i_bad(c, "output_mask must have 3 entries");
	if (kiln__i_numel(mt) != M || kiln__i_numel(rt) != M)
		return kiln__i_bad(c, "mean/rstd must have %lld elements",
				   (long long)M);
	double *gv = NULL, *xv = NULL, *mv = NULL, *rv = NULL, *w = NULL;
	double *dw = ki_dcalloc(N);
	double *db = ki_dcalloc(N);
	int rc = dw && db ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	if (rc == 0)
		rc = kiln__i_to_f(c, mt, &mv);
	if (rc == 0)
		rc = kiln__i_to_f(c, rt, &rv);
	if (rc == 0)
		rc = opt_vec(c, 5, "weight", (uint32_t)nn, ns, &w);
	for (int64_t m = 0; rc == 0 && m < M; m++) {
		double *gp = gv + m * N, *xp = xv + m * N, s1 = 0, s2 = 0;
		for (int64_t k = 0; k < N; k++) {
			double xh = (xp[k] - mv[m]) * rv[m];
			double gw = gp[k] * (w ? w[k] : 1);
			s1 += gw;
			s2 += gw * xh;
			dw[k] += gp[k] * xh;
			db[k] += gp[k];
		}
		for (int64_t k = 0; k < N; k++) {
			double xh = (xp[k] - mv[m]) * rv[m];
			double gw = gp[k] * (w ? w[k] : 1);
			gp[k] =
			    rv[m] * (gw - s1 / (double)N - xh * s2 / (double)N);
		}
	}
	/* grad_weight / grad_bias have normalized_shape, in weight's (else
	 * bias's, else input's) dtype */
	const it_t *pt = wt ? wt : bt;
	kiln_dtype_t pdt = pt ? pt->dt : x->dt;
	if (rc == 0 && bt != NULL)
		rc = kiln__i_need_shape(c, bt, "bias", (uint32_t)nn, ns);
	for (int k = 0; rc == 0 && k < 3; k++) {
		if (!mask[k])
			rc = kiln__i_none_out(c, (uint32_t)k);
		else if (k == 0)
			rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank,
					    x->size, gv);
		else
			rc = kiln__i_from_f(c, &c->out[k], pdt, (uint32_t)nn,
					    ns, k == 1 ? dw : db);
	}
	free(gv);
	free(xv);
	free(mv);
	free(rv);
	free(w);
	free(dw);
	free(db);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Batch norm and group norm                                                  */
/* ------------------------------------------------------------------------ */

/* Channel layout of an [N, C, *] input: for element e of a contiguous copy,
 * channel = (e / inner) % C. */
typedef struct chl {
	int64_t N, C, inner, per; /* per = N * inner elements per channel */
} chl_t;

static int chan_layout(ictx_t *c, const it_t *x, chl_t *l)
{
	if (x->rank < 2)
		return kiln__i_bad(
		    c, "input must have at least 2 dims (N, C, ...)");
	l->N = x->size[0];
	l->C = x->size[1];
	l->inner = kiln__i_numel_of(x->rank - 2, x->size + 2);
	l->per = l->N * l->inner;
	return 0;
}

#define CH_FOR(l, ch, e)                                                       \
	for (int64_t n_ = 0; n_ < (l)->N; n_++)                                \
		for (int64_t i_ = 0; i_ < (l)->inner; i_++)                    \
			if (((e) = (n_ * (l)->C + (ch)) * (l)->inner + i_), 1)

/* native_batch_norm(input, w?, b?, rm?, rv?, training, momentum, eps)
 * _native_batch_norm_legit_no_training(input, w?, b?, rm, rv, momentum, eps)
 * _native_batch_norm_legit_functional(input, w?, b?, rm, rv, training,
 *     momentum, eps) -> + new running mean/var
 * _native_batch_norm_legit.no_stats(input, w?, b?, training, momentum, eps) */
int kiln__op_batch_norm(ictx_t *c, int code)
{
	it_t *x, *rmt = NULL, *rvt = NULL;
	chl_t l = {0};
	bool training = false;
	double mom, eps;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(chan_layout(c, x, &l));
	int p = 5;
	if (code != NORM_BN_NOSTATS) {
		KI_TRY(kiln__i_tensor_opt(c, 3, "running_mean", &rmt));
		KI_TRY(kiln__i_tensor_opt(c, 4, "running_var", &rvt));
	} else {
		p = 3;
	}
	if (code == NORM_BN_NOTRAIN) {
		training = false;
	} else {
		KI_TRY(kiln__i_bool(c, p, "training", false, &training));
		p++;
	}
	KI_TRY(kiln__i_num(c, p, "momentum", true, 0, &mom));
	KI_TRY(kiln__i_num(c, p + 1, "eps", true, 0, &eps));
	if ((rmt == NULL || rvt == NULL) &&
	    (!training || code == NORM_BN_FUNC || code == NORM_BN_NOTRAIN))
		return kiln__i_bad(c,
				   "running_mean and running_var are required");
	kiln_dtype_t sdt = rmt ? rmt->dt : x->dt;
	double *xv = NULL, *w = NULL, *b = NULL, *rm = NULL, *rv = NULL;
	double *mean = ki_dcalloc(l.C);
	double *istd = ki_dcalloc(l.C);
	double *nrm = ki_dcalloc(l.C);
	double *nrv = ki_dcalloc(l.C);
	int rc = mean && istd && nrm && nrv ? 0 : kiln__i_oom(c);
	int64_t cs[1] = {l.C};
	if (rc == 0)
		rc = opt_vec(c, 1, "weight", 1, cs, &w);
	if (rc == 0)
		rc = opt_vec(c, 2, "bias", 1, cs, &b);
	if (rc == 0 && rmt)
		rc = opt_vec(c, 3, "running_mean", 1, cs, &rm);
	if (rc == 0 && rvt)
		rc = opt_vec(c, 4, "running_var", 1, cs, &rv);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	for (int64_t ch = 0; rc == 0 && ch < l.C; ch++) {
		int64_t e;
		double m = 0, v = 0;
		if (training) {
			CH_FOR(&l, ch, e) m += xv[e];
			m = l.per ? m / (double)l.per : 0;
			CH_FOR(&l, ch, e) v += (xv[e] - m) * (xv[e] - m);
			double vb = l.per ? v / (double)l.per : 0;
			double vu =
			    l.per > 1 ? v / (double)(l.per - 1) : INFINITY;
			istd[ch] = 1 / sqrt(vb + eps);
			mean[ch] = m;
			if (rm) {
				nrm[ch] = (1 - mom) * rm[ch] + mom * m;
				nrv[ch] = (1 - mom) * rv[ch] + mom * vu;
			}
		} else {
			m = rm[ch];
			istd[ch] = 1 / sqrt(rv[ch] + eps);
			nrm[ch] = rm[ch];
			nrv[ch] = rv[ch];
		}
		double ww = w ? w[ch] : 1, bb = b ? b[ch] : 0;
		CH_FOR(&l, ch, e) xv[e] = (xv[e] - m) * istd[ch] * ww + bb;
	}
	int64_t z = 0;
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, xv);
	if (rc == 0 && training) {
		rc = kiln__i_from_f(c, &c->out[1], sdt, 1, cs, mean);
		if (rc == 0)
			rc = kiln__i_from_f(c, &c->out[2], sdt, 1, cs, istd);
	} else if (rc == 0) {
		rc = kiln__i_alloc(c, &c->out[1], sdt, 1, &z);
		if (rc == 0)
			rc = kiln__i_alloc(c, &c->out[2], sdt, 1, &z);
	}
	if (rc == 0 && code == NORM_BN_FUNC) {
		rc = kiln__i_from_f(c, &c->out[3], rmt->dt, 1, cs, nrm);
		if (rc == 0)
			rc = kiln__i_from_f(c, &c->out[4], rvt->dt, 1, cs, nrv);
	}
	free(xv);
	free(w);
	free(b);
	free(rm);
	free(rv);
	free(mean);
	free(istd);
	free(nrm);
	free(nrv);
	return rc;
}

/* native_batch_norm_backward(grad_out, input, weight?, running_mean?,
 * running_var?, save_mean?, save_invstd?, train, eps, output_mask) */
int kiln__op_batch_norm_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *x, *wt;
	chl_t l = {0};
	bool train, mask[3];
	int nm;
	double eps;
	KI_TRY(kiln__i_tensor(c, 0, "grad_out", &g));
	KI_TRY(kiln__i_tensor(c, 1, "input", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(chan_layout(c, x, &l));
	KI_TRY(kiln__i_need_shape(c, g, "grad_out", x->rank, x->size));
	KI_TRY(kiln__i_tensor_opt(c, 2, "weight", &wt));
	KI_TRY(kiln__i_bool(c, 7, "train", false, &train));
	KI_TRY(kiln__i_num(c, 8, "eps", true, 0, &eps));
	KI_TRY(kiln__i_bools(c, 9, "output_mask", mask, 3, &nm));
	if (nm != 3)
		return kiln__i_bad(c, "output_mask must have 3 entries");
	int64_t cs[1] = {l.C};
	double *gv = NULL, *xv = NULL, *w = NULL, *mv = NULL, *sv = NULL;
	double *dw = ki_dcalloc(l.C);
	double *db = ki_dcalloc(l.C);
	int rc = dw && db ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = opt_vec(c, 2, "weight", 1, cs, &w);
	if (rc == 0)
		rc = opt_vec(c, train ? 5 : 3,
			     train ? "save_mean" : "running_mean", 1, cs, &mv);
	if (rc == 0)
		rc = opt_vec(c, train ? 6 : 4,
			     train ? "save_invstd" : "running_var", 1, cs, &sv);
	if (rc == 0 && (mv == NULL || sv == NULL))
		rc = kiln__i_bad(c, "missing %s statistics",
				 train ? "saved" : "running");
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	for (int64_t ch = 0; rc == 0 && ch < l.C; ch++) {
		int64_t e;
		double m = mv[ch], is = train ? sv[ch] : 1 / sqrt(sv[ch] + eps);
		double sg = 0, sgx = 0, ww = w ? w[ch] : 1;
		CH_FOR(&l, ch, e)
		{
			sg += gv[e];
			sgx += gv[e] * (xv[e] - m) * is;
		}
		dw[ch] = sgx;
		db[ch] = sg;
		double n = (double)l.per;
		CH_FOR(&l, ch, e)
		{
			double xh = (xv[e] - m) * is;
			gv[e] = train
				    ? (gv[e] - sg / n - xh * sgx / n) * is * ww
				    : gv[e] * is * ww;
		}
	}
	kiln_dtype_t pdt = wt ? wt->dt : x->dt;
	for (int k = 0; rc == 0 && k < 3; k++) {
		if (!mask[k])
			rc = kiln__i_none_out(c, (uint32_t)k);
		else if (k == 0)
			rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank,
					    x->size, gv);
		else
			rc = kiln__i_from_f(c, &c->out[k], pdt, 1, cs,
					    k == 1 ? dw : db);
	}
	free(gv);
	free(xv);
	free(w);
	free(mv);
	free(sv);
	free(dw);
	free(db);
	return rc;
}

/* Whether t has exactly a * b * c elements (without overflowing). */
static bool fits3(const it_t *t, int64_t a, int64_t b, int64_t c)
{
	int64_t n;
	if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &n) ||
	    __builtin_mul_overflow(n, c, &n))
		return false;
	return kiln__i_numel(t) == n;
}

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) */
int kiln__op_group_norm(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t N, C, HW, G;
	double eps;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(need_float(c, x, "input"));
	KI_TRY(kiln__i_int(c, 3, "N", KI_REQ, &N));
	KI_TRY(kiln__i_int(c, 4, "C", KI_REQ, &C));
	KI_TRY(kiln__i_int(c, 5, "HxW", KI_REQ, &HW));
	KI_TRY(kiln__i_int(c, 6, "group", KI_REQ, &G));
	KI_TRY(kiln__i_num(c, 7, "eps", true, 0, &eps));
	if (G <= 0 || C % G != 0 || x->rank < 2 || x->size[0] != N ||
	    x->size[1] != C || !fits3(x, N, C, HW))
		return kiln__i_bad(
		    c,
		    "N=%lld C=%lld HxW=%lld group=%lld do not fit "
		    "the input",
		    (long long)N, (long long)C, (long long)HW, (long long)G);
	int64_t cs[1] = {C}, D = C / G * HW, ms[2] = {N, G};
	double *xv = NULL, *w = NULL, *b = NULL;
	double *mean = ki_dcalloc(N * G);
	double *rstd = ki_dcalloc(N * G);
	int rc = mean && rstd ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = opt_vec(c, 1, "weight", 1, cs, &w);
	if (rc == 0)
		rc = opt_vec(c, 2, "bias", 1, cs, &b);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	for (int64_t ng = 0; rc == 0 && ng < N * G; ng++) {
		double *p = xv + ng * D, m = 0, v = 0;
		for (int64_t k = 0; k < D; k++)
			m += p[k];
		m = D ? m / (double)D : 0;
		for (int64_t k = 0; k < D; k++)
			v += (p[k] - m) * (p[k] - m);
		v = D ? v / (double)D : 0;
		mean[ng] = m;
		rstd[ng] = 1 / sqrt(v + eps);
		for (int64_t k = 0; k < D; k++) {
			int64_t ch = (ng % G) * (C / G) + k / HW;
			p[k] = (p[k] - m) * rstd[ng] * (w ? w[ch] : 1) +
			       (b ? b[ch] : 0);
		}
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, xv);
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[1], x->dt, 2, ms, mean);
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[2], x->dt, 2, ms, rstd);
	free(xv);
	free(w);
	free(b);
	free(mean);
	free(rstd);
	return rc;
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
 * HxW, group, output_mask) */
int kiln__op_group_norm_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *x, *mt, *rt, *wt;
	int64_t N, C, HW, G;
	bool mask[3];
	int nm;
	KI_TRY(kiln__i_tensor(c, 0, "grad_out", &g));
	KI_TRY(kiln__i_tensor(c, 1, "input", &x));
	KI_TRY(kiln__i_tensor(c, 2, "mean", &mt));
	KI_TRY(kiln__i_tensor(c, 3, "rstd", &rt));
	KI_TRY(kiln__i_tensor_opt(c, 4, "weight", &wt));
	KI_TRY(kiln__i_int(c, 5, "N", KI_REQ, &N));
	KI_TRY(kiln__i_int(c, 6, "C", KI_REQ, &C));
	KI_TRY(kiln__i_int(c, 7, "HxW", KI_REQ, &HW));
	KI_TRY(kiln__i_int(c, 8, "group", KI_REQ, &G));
	KI_TRY(kiln__i_bools(c, 9, "output_mask", mask, 3, &nm));
	KI_TRY(need_float(c, x, "input"));
	if (nm != 3 || G <= 0 || C % G != 0 || x->rank < 2 ||
	    !fits3(x, N, C, HW) || !fits3(mt, N, G, 1) || !fits3(rt, N, G, 1))
		return kiln__i_bad(c, "arguments do not fit the input");
	KI_TRY(kiln__i_need_shape(c, g, "grad_out", x->rank, x->size));
	int64_t cs[1] = {C}, D = C / G * HW, cpg = C / G;
	double *gv = NULL, *xv = NULL, *mv = NULL, *rv = NULL, *w = NULL;
	double *dw = ki_dcalloc(C);
	double *db = ki_dcalloc(C);
	int rc = dw && db ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	if (rc == 0)
		rc = kiln__i_to_f(c, mt, &mv);
	if (rc == 0)
		rc = kiln__i_to_f(c, rt, &rv);
	if (rc == 0)
		rc = opt_vec(c, 4, "weight", 1, cs, &w);
	for (int64_t ng = 0; rc == 0 && ng < N * G; ng++) {
		double *gp = gv + ng * D, *xp = xv + ng * D, s1 = 0, s2 = 0;
		double m = mv[ng], r = rv[ng];
		for (int64_t k = 0; k < D; k++) {
			int64_t ch = (ng % G) * cpg + k / HW;
			double xh = (xp[k] - m) * r,
			       gw = gp[k] * (w ? w[ch] : 1);
			s1 += gw;
			s2 += gw * xh;
			dw[ch] += gp[k] * xh;
			db[ch] += gp[k];
		}
		for (int64_t k = 0; k < D; k++) {
			int64_t ch = (ng % G) * cpg + k / HW;
			double xh = (xp[k] - m) * r,
			       gw = gp[k] * (w ? w[ch] : 1);
			gp[k] = r * (gw - s1 / (double)D - xh * s2 / (double)D);
		}
	}
	kiln_dtype_t pdt = wt ? wt->dt : x->dt;
	for (int k = 0; rc == 0 && k < 3; k++) {
		if (!mask[k])
			rc = kiln__i_none_out(c, (uint32_t)k);
		else if (k == 0)
			rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank,
					    x->size, gv);
		else
			rc = kiln__i_from_f(c, &c->out[k], pdt, 1, cs,
					    k == 1 ? dw : db);
	}
	free(gv);
	free(xv);
	free(mv);
	free(rv);
	free(w);
	free(dw);
	free(db);
	return rc;
}

/* _weight_norm_interface(v, g, dim) -> (w, norms) (code 0) and
 * _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms,
 * dim) -> (grad_v, grad_g) (code 1), over the slices of v along dim (g and
 * norms: v's shape with 1 elsewhere):
 *   norms  = sqrt(Σ v²) over every dim but dim
 *   w      = v · (g / norms)
 *   grad_g = Σ grad_w · v / norms
 *   grad_v = g / norms · (grad_w − v · (grad_g / norms)) */
int kiln__op_weight_norm(ictx_t *c, int code)
{
	bool bw = code == 1;
	it_t *gw = NULL, *v, *g, *nt = NULL;
	int64_t d;
	int p = bw ? 1 : 0;
	if (bw)
		KI_TRY(kiln__i_tensor(c, 0, "grad_w", &gw));
	KI_TRY(kiln__i_tensor(c, p, bw ? "saved_v" : "v", &v));
	KI_TRY(kiln__i_tensor(c, p + 1, bw ? "saved_g" : "g", &g));
	if (bw)
		KI_TRY(kiln__i_tensor(c, 3, "saved_norms", &nt));
	KI_TRY(kiln__i_int(c, bw ? 4 : 2, "dim", 0, &d));
	KI_TRY(need_float(c, v, "v"));
	if (v->rank == 0)
		return kiln__i_bad(c, "v must have a dim");
	uint32_t ud;
	KI_TRY(kiln__i_dim(c, d, v->rank, &ud));
	int64_t gs[KI_MAXR], S = v->size[ud], inner = 1, outer = 1;
	for (uint32_t k = 0; k < v->rank; k++) {
		gs[k] = k == ud ? S : 1;
		if (k < ud)
			outer *= v->size[k];
		else if (k > ud)
			inner *= v->size[k];
	}
	KI_TRY(kiln__i_need_shape(c, g, "g", v->rank, gs));
	if (bw) {
		KI_TRY(kiln__i_need_shape(c, gw, "grad_w", v->rank, v->size));
		KI_TRY(kiln__i_need_shape(c, nt, "saved_norms", v->rank, gs));
	}
	double *vv = NULL, *gv = NULL, *wv = NULL, *nv = NULL;
	double *sum = ki_dcalloc(S);
	int rc = sum ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, v, &vv);
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	if (rc == 0 && bw)
		rc = kiln__i_to_f(c, gw, &wv);
	if (rc == 0 && bw)
		rc = kiln__i_to_f(c, nt, &nv);
	for (int64_t o = 0; rc == 0 && o < outer; o++)
		for (int64_t s = 0; s < S; s++)
			for (int64_t i = 0; i < inner; i++) {
				int64_t e = (o * S + s) * inner + i;
				sum[s] += bw ? wv[e] * vv[e] : vv[e] * vv[e];
			}
	for (int64_t s = 0; rc == 0 && s < S; s++)
		sum[s] = bw ? sum[s] / nv[s] : sqrt(sum[s]);
	for (int64_t o = 0; rc == 0 && o < outer; o++)
		for (int64_t s = 0; s < S; s++)
			for (int64_t i = 0; i < inner; i++) {
				int64_t e = (o * S + s) * inner + i;
				vv[e] =
				    bw ? gv[s] / nv[s] *
					     (wv[e] - vv[e] * (sum[s] / nv[s]))
				       : vv[e] * (gv[s] / sum[s]);
			}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], v->dt, v->rank, v->size, vv);
	/* norms in g's dtype (f32 for bf16), as torch's decomposition
	 * declares them, or as the node declares; grad_g in g's */
	kiln_dtype_t sdt = g->dt == KILN_DT_BF16 && !bw ? KILN_DT_F32 : g->dt;
	const kiln_value_t *o1 =
	    c->nd->n_out > 1 ? &c->g->values[c->nd->out_first + 1] : NULL;
	if (o1 != NULL && o1->kind == KILN_VAL_TENSOR)
		sdt = o1->dtype;
	if (rc == 0 && o1 != NULL)
		rc = kiln__i_from_f(c, &c->out[1], sdt, v->rank, gs, sum);
	free(vv);
	free(gv);
	free(wv);
	free(nv);
	free(sum);
	return rc;
}
