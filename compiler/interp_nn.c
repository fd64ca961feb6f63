/*
 * interp_nn.c — the reference interpreter's matrix products, embedding and
 * indexing (index_select, gather, scatter, index, index_put) and losses
 * (nll, mse, with their backwards).
 * Conventions and representation: interp_internal.h.
 *
 * Every op copies its inputs into contiguous f64 (or int64 index) arrays,
 * computes naively in f64 and rounds once at the output. Index values are
 * checked against their dimension (an out-of-range index is an invalid
 * graph for these inputs).
 *
 * Threads: any; no global state.
 */
#include "compiler/interp_internal.h"

#include <stdlib.h>
#include <string.h>

static int need_rank(ictx_t *c, const it_t *t, const char *what, uint32_t lo,
		     uint32_t hi)
{
	if (t->rank >= lo && t->rank <= hi)
		return 0;
	return kiln__i_bad(c, "%s must have rank %u..%u, not %u", what, lo, hi,
			   t->rank);
}

static int need_index(ictx_t *c, const it_t *t, const char *what)
{
	if (ki_isint(t->dt))
		return 0;
	return kiln__i_bad(c, "%s must be an integer tensor, not %s", what,
			   kiln_dtype_name(t->dt));
}

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
/* Matrix products                                                            */
/* ------------------------------------------------------------------------ */

/* mm(self, mat2), bmm(self, mat2), addmm(self, mat1, mat2, *, beta, alpha),
 * baddbmm(self, batch1, batch2, *, beta, alpha) */
int kiln__op_mm(ictx_t *c, int code)
{
	it_t *a, *b, *bias = NULL;
	bool add = code == MM_ADDMM || code == MM_BADDBMM;
	bool batched = code == MM_BMM || code == MM_BADDBMM;
	double beta = 1, alpha = 1;
	uint32_t r = batched ? 3 : 2;
	if (add) {
		KI_TRY(kiln__i_tensor(c, 0, "self", &bias));
		KI_TRY(kiln__i_tensor(c, 1, batched ? "batch1" : "mat1", &a));
		KI_TRY(kiln__i_tensor(c, 2, batched ? "batch2" : "mat2", &b));
		KI_TRY(kiln__i_num(c, -1, "beta", false, 1, &beta));
		KI_TRY(kiln__i_num(c, -1, "alpha", false, 1, &alpha));
	} else {
		KI_TRY(kiln__i_tensor(c, 0, "self", &a));
		KI_TRY(kiln__i_tensor(c, 1, "mat2", &b));
	}
	if (a->rank != r || b->rank != r)
		return kiln__i_bad(c, "operands must be %uD, got %uD and %uD",
				   r, a->rank, b->rank);
	if (a->dt != b->dt || (bias && bias->dt != a->dt))
		return kiln__i_bad(
		    c, "operands must have one dtype, got %s and %s",
		    kiln_dtype_name(a->dt), kiln_dtype_name(b->dt));
	if (a->dt == KILN_DT_BOOL)
		return kiln__i_bad(c, "does not take bool operands");
	int64_t B = batched ? a->size[0] : 1;
	int64_t n = a->size[r - 2], k = a->size[r - 1], m = b->size[r - 1];
	if (b->size[r - 2] != k || (batched && b->size[0] != B)) {
		char x[160], y[160];
		kiln__i_fmt_shape(x, sizeof(x), a->rank, a->size);
		kiln__i_fmt_shape(y, sizeof(y), b->rank, b->size);
		return kiln__i_bad(c, "shapes %s and %s cannot be multiplied",
				   x, y);
	}
	int64_t size[3] = {B, n, m};
	int64_t *osz = batched ? size : size + 1;
	it_t bb = {0};
	if (bias) {
		it_t *ops[1] = {bias};
		uint32_t br;
		int64_t bs[KI_MAXR];
		KI_TRY(kiln__i_bshape(c, ops, 1, &br, bs));
		it_t probe = {.rank = r};
		memcpy(probe.size, osz, r * sizeof(int64_t));
		it_t *two[2] = {bias, &probe};
		KI_TRY(kiln__i_bshape(c, two, 2, &br, bs));
		if (br != r || memcmp(bs, osz, r * sizeof(int64_t)) != 0)
			return kiln__i_bad(
			    c, "self does not broadcast to the product's "
			       "shape");
		kiln__i_bview(bias, r, osz, &bb);
	}
	double *av, *bv, *ov = ki_dcalloc(B * n * m);
	if (ov == NULL)
		return kiln__i_oom(c);
	int rc = kiln__i_to_f(c, a, &av);
	if (rc < 0) {
		free(ov);
		return rc;
	}
	rc = kiln__i_to_f(c, b, &bv);
	if (rc < 0) {
		free6(ov, av, NULL, NULL, NULL, NULL);
		return rc;
	}
	for (int64_t p = 0; p < B; p++)
		for (int64_t i = 0; i < n; i++) {
			double *orow = ov + (p * n + i) * m;
			for (int64_t q = 0; q < k; q++) {
				double x = av[(p * n + i) * k + q];
				const double *brow = bv + (p * k + q) * m;
				for (int64_t j = 0; j < m; j++)
					orow[j] += x * brow[j];
			}
		}
	if (bias) {
		int64_t idx[KI_MAXR] = {0}, e = 0;
		if (B * n * m > 0)
			do {
				double s = alpha * ov[e];
				if (beta != 0)
					s += beta *
					     ki_getf(&bb, ki_off(&bb, idx));
				ov[e++] = s;
			} while (ki_next(idx, osz, r));
	}
	rc = kiln__i_from_f(c, &c->out[0], a->dt, r, osz, ov);
	free6(av, bv, ov, NULL, NULL, NULL);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Embedding, gather, scatter                                                 */
/* ------------------------------------------------------------------------ */

/* Checks and wraps index v into [0, n); 0 or an error naming what. */
static int wrap_index(ictx_t *c, int64_t *v, int64_t n, const char *what)
{
	if (*v < -n || *v >= n)
		return kiln__i_bad(c, "%s %lld out of range for size %lld",
				   what, (long long)*v, (long long)n);
	if (*v < 0)
		*v += n;
	return 0;
}

/* embedding(weight, indices, padding_idx=-1, scale_grad_by_freq, sparse) */
int kiln__op_embedding(ictx_t *c, int code)
{
	(void)code;
	it_t *w, *ix;
	KI_TRY(kiln__i_tensor(c, 0, "weight", &w));
	KI_TRY(kiln__i_tensor(c, 1, "indices", &ix));
	KI_TRY(need_rank(c, w, "weight", 2, 2));
	KI_TRY(need_index(c, ix, "indices"));
	if (ix->rank + 1 > KI_MAXR)
		return kiln__i_bad(c, "rank too large");
	int64_t size[KI_MAXR], V = w->size[0], D = w->size[1];
	memcpy(size, ix->size, ix->rank * sizeof(int64_t));
	size[ix->rank] = D;
	int64_t *iv, n = kiln__i_numel(ix);
	KI_TRY(kiln__i_to_i(c, ix, &iv));
	it_t *o = &c->out[0];
	int rc = kiln__i_alloc(c, o, w->dt, ix->rank + 1, size);
	for (int64_t e = 0; rc == 0 && e < n; e++) {
		int64_t row = iv[e];
		if (row < 0 || row >= V) {
			rc = kiln__i_bad(
			    c, "index %lld out of range for %lld rows",
			    (long long)row, (long long)V);
			break;
		}
		for (int64_t d = 0; d < D; d++)
			ki_setf(o, e * D + d,
				ki_getf(w, w->off + row * w->stride[0] +
					       d * w->stride[1]));
	}
	free(iv);
	return rc;
}

/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
 * scale_grad_by_freq) */
int kiln__op_embedding_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *ix;
	int64_t V, pad;
	bool freq;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, 1, "indices", &ix));
	KI_TRY(kiln__i_int(c, 2, "num_weights", KI_REQ, &V));
	KI_TRY(kiln__i_int(c, 3, "padding_idx", KI_REQ, &pad));
	KI_TRY(kiln__i_bool(c, 4, "scale_grad_by_freq", false, &freq));
	KI_TRY(need_index(c, ix, "indices"));
	int64_t n = kiln__i_numel(ix);
	if (g->rank != ix->rank + 1 ||
	    memcmp(g->size, ix->size, ix->rank * sizeof(int64_t)) != 0)
		return kiln__i_bad(
		    c, "grad_output must have shape indices.shape + [D]");
	int64_t D = g->size[g->rank - 1], size[2] = {V, D};
	KI_TRY(kiln__i_check_numel(c, 2, size));
	double *gv = NULL, *ov = ki_dcalloc(V * D);
	int64_t *iv = NULL, *cnt = ki_icalloc(V);
	int rc = ov && cnt ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_i(c, ix, &iv);
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	for (int64_t e = 0; rc == 0 && e < n; e++) {
		if (iv[e] < 0 || iv[e] >= V)
			rc = kiln__i_bad(
			    c, "index %lld out of range for %lld rows",
			    (long long)iv[e], (long long)V);
		else
			cnt[iv[e]]++;
	}
	for (int64_t e = 0; rc == 0 && e < n; e++) {
		int64_t row = iv[e];
		if (row == pad)
			continue;
		double s = freq ? 1.0 / (double)cnt[row] : 1.0;
		for (int64_t d = 0; d < D; d++)
			ov[row * D + d] += gv[e * D + d] * s;
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], g->dt, 2, size, ov);
	free6(gv, ov, iv, cnt, NULL, NULL);
	return rc;
}

/* index_select(self, dim, index) */
int kiln__op_index_select(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *ix;
	int64_t dim;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_tensor(c, 2, "index", &ix));
	KI_TRY(need_index(c, ix, "index"));
	KI_TRY(need_rank(c, ix, "index", 0, 1));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	int64_t n = kiln__i_numel(ix), size[KI_MAXR], *iv;
	memcpy(size, x->size, sizeof(size));
	int64_t len = x->rank ? x->size[d] : 1;
	if (x->rank)
		size[d] = n;
	else if (n != 1)
		return kiln__i_bad(
		    c, "index of a 0-dim tensor must have one element");
	KI_TRY(kiln__i_to_i(c, ix, &iv));
	int rc = 0;
	for (int64_t e = 0; e < n && rc == 0; e++)
		rc = wrap_index(c, &iv[e], len, "index");
	it_t *o = &c->out[0];
	if (rc == 0)
		rc = kiln__i_alloc(c, o, x->dt, x->rank, size);
	int64_t idx[KI_MAXR] = {0}, k = 0;
	if (rc == 0 && kiln__i_numel(o) > 0)
		do {
			int64_t so = x->off;
			for (uint32_t j = 0; j < x->rank; j++)
				so += (j == d ? iv[idx[j]] : idx[j]) *
				      x->stride[j];
			ki_setf(o, k++, ki_getf(x, so));
		} while (ki_next(idx, size, x->rank));
	free(iv);
	return rc;
}

/* gather(self, dim, index, *, sparse_grad=False) */
int kiln__op_gather(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *ix;
	int64_t dim;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_tensor(c, 2, "index", &ix));
	KI_TRY(need_index(c, ix, "index"));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	uint32_t xr = x->rank ? x->rank : 1, ir = ix->rank ? ix->rank : 1;
	if (xr != ir)
		return kiln__i_bad(
		    c, "index must have the input's rank %u, not %u", x->rank,
		    ix->rank);
	for (uint32_t j = 0; j < ix->rank && j < x->rank; j++)
		if (j != d && ix->size[j] > x->size[j])
			return kiln__i_bad(
			    c,
			    "index size %lld exceeds the input's %lld "
			    "in dim %u",
			    (long long)ix->size[j], (long long)x->size[j], j);
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, ix->rank, ix->size));
	int64_t idx[KI_MAXR] = {0}, k = 0, len = x->rank ? x->size[d] : 1;
	if (kiln__i_numel(o) == 0)
		return 0;
	do {
		int64_t v = ki_geti(ix, ki_off(ix, idx));
		int rc = wrap_index(c, &v, len, "index");
		if (rc < 0) {
			kiln__i_release(o);
			return rc;
		}
		int64_t so = x->off;
		for (uint32_t j = 0; j < x->rank; j++)
			so += (j == d ? v : idx[j]) * x->stride[j];
		ki_setf(o, k++, ki_getf(x, so));
	} while (ki_next(idx, ix->size, ix->rank));
	return 0;
}

/* scatter.src(self, dim, index, src) / scatter.value(self, dim, index,
 * value) / scatter_add(self, dim, index, src) */
int kiln__op_scatter(ictx_t *c, int code)
{
	it_t *x, *ix, *src = NULL;
	int64_t dim;
	uint32_t d;
	double val = 0;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_tensor(c, 2, "index", &ix));
	KI_TRY(need_index(c, ix, "index"));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (code == SC_VALUE)
		KI_TRY(kiln__i_num(c, 3, "value", true, 0, &val));
	else
		KI_TRY(kiln__i_tensor(c, 3, "src", &src));
	if (src && src->dt != x->dt)
		return kiln__i_bad(c, "src must have self's dtype");
	if ((ix->rank ? ix->rank : 1) != (x->rank ? x->rank : 1))
		return kiln__i_bad(c, "index must have the input's rank");
	for (uint32_t j = 0; j < ix->rank && j < x->rank; j++)
		if ((j != d && ix->size[j] > x->size[j]) ||
		    (src && src->rank == ix->rank &&
		     ix->size[j] > src->size[j]))
			return kiln__i_bad(
			    c, "index is larger than self or src in dim %u", j);
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_convert(c, x, x->dt, o));
	int64_t idx[KI_MAXR] = {0}, len = x->rank ? x->size[d] : 1;
	if (kiln__i_numel(ix) == 0)
		return 0;
	do {
		int64_t v = ki_geti(ix, ki_off(ix, idx));
		int rc = wrap_index(c, &v, len, "index");
		if (rc < 0) {
			kiln__i_release(o);
			return rc;
		}
		int64_t to = 0;
		for (uint32_t j = 0; j < o->rank; j++)
			to += (j == d ? v : idx[j]) * o->stride[j];
		double s = src ? ki_getf(src, ki_off(src, idx)) : val;
		ki_setf(o, to, code == SC_ADD ? ki_getf(o, to) + s : s);
	} while (ki_next(idx, ix->size, ix->rank));
	return 0;
}

/* scatter_reduce.two(self, dim, index, src, reduce, include_self=True):
 * every target's sources (and self's value, with include_self) reduced
 * by sum, prod, mean, amax or amin (NaN wins); a target no source names
 * keeps self's value. An integer mean rounds down, as torch's. */
int kiln__op_scatter_reduce(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *ix, *src;
	int64_t dim;
	uint32_t d;
	const char *how;
	bool with_self;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_tensor(c, 2, "index", &ix));
	KI_TRY(kiln__i_tensor(c, 3, "src", &src));
	KI_TRY(kiln__i_str(c, 4, "reduce", &how));
	KI_TRY(kiln__i_bool(c, 5, "include_self", true, &with_self));
	KI_TRY(need_index(c, ix, "index"));
	static const char *const names[] = {"sum", "prod", "mean", "amax",
					    "amin"};
	int k = -1;
	for (int i = 0; i < 5; i++)
		if (how != NULL && strcmp(how, names[i]) == 0)
			k = i;
	if (k < 0)
		return kiln__i_bad(c,
				   "reduce must be sum, prod, mean, amax or "
				   "amin, not %s",
				   how ? how : "missing");
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (src->dt != x->dt)
		return kiln__i_bad(c, "src must have self's dtype");
	if ((ix->rank ? ix->rank : 1) != (x->rank ? x->rank : 1) ||
	    (src->rank ? src->rank : 1) != (x->rank ? x->rank : 1))
		return kiln__i_bad(c, "index (and src) must have the input's "
				      "rank");
	for (uint32_t j = 0; j < ix->rank && j < x->rank; j++)
		if ((j != d && ix->size[j] > x->size[j]) ||
		    ix->size[j] > src->size[j])
			return kiln__i_bad(
			    c, "index is larger than self or src in dim %u", j);
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_convert(c, x, x->dt, o));
	int64_t n = kiln__i_numel(o);
	int64_t *cnt = ki_icalloc(n);
	if (cnt == NULL) {
		kiln__i_release(o);
		return kiln__i_oom(c);
	}
	bool fl = ki_isf(x->dt);
	int64_t idx[KI_MAXR] = {0}, len = x->rank ? x->size[d] : 1;
	int rc = 0;
	if (kiln__i_numel(ix) > 0)
		do {
			int64_t v = ki_geti(ix, ki_off(ix, idx));
			rc = wrap_index(c, &v, len, "index");
			if (rc < 0)
				break;
			int64_t to = 0;
			for (uint32_t j = 0; j < o->rank; j++)
				to += (j == d ? v : idx[j]) * o->stride[j];
			double sv = ki_getf(src, ki_off(src, idx));
			double cur = ki_getf(o, to);
			if (cnt[to]++ == 0 && !with_self)
				cur = k == 1   ? 1
				      : k == 3 ? -INFINITY
				      : k == 4 ? INFINITY
					       : 0;
			double r;
			if (k == 1)
				r = cur * sv;
			else if (k == 3 || k == 4)
				r = isnan(cur) || isnan(sv) ? NAN
				    : k == 3		    ? fmax(cur, sv)
							    : fmin(cur, sv);
			else
				r = cur + sv;
			/* in f64 for floats; integers exactly */
			if (fl)
				o->buf->f[to] = r;
			else
				ki_setf(o, to, r);
		} while (ki_next(idx, ix->size, ix->rank));
	if (rc == 0 && k == 2)
		for (int64_t i = 0; i < n; i++) {
			int64_t m = cnt[i] + (with_self ? 1 : 0);
			if (cnt[i] == 0)
				continue;
			double v = ki_getf(o, i) / (double)m;
			ki_setf(o, i, fl ? v : floor(v));
		}
	if (rc == 0 && fl)
		for (int64_t i = 0; i < n; i++)
			ki_setf(o, i, ki_getf(o, i));
	free(cnt);
	if (rc < 0)
		kiln__i_release(o);
	return rc;
}

/* index_add(self, dim, index [K] or [], source, alpha=1):
 *   out = self; out[.., index[k], ..] += alpha · source[.., k, ..] at dim
 * (an index outside [0, size) is rejected, as torch rejects it) */
int kiln__op_index_add(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *ix, *src;
	int64_t dim;
	uint32_t d;
	double alpha;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_tensor(c, 2, "index", &ix));
	KI_TRY(kiln__i_tensor(c, 3, "source", &src));
	KI_TRY(kiln__i_num(c, 4, "alpha", false, 1, &alpha));
	KI_TRY(need_index(c, ix, "index"));
	if (!ki_isf(x->dt) && alpha != (double)(int64_t)alpha)
		return kiln__i_bad(c,
				   "alpha must be an integer for an integer "
				   "self, not %g",
				   alpha);
	if (x->rank == 0)
		return kiln__i_unsup(c, "index_add of a 0-d self");
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (ix->rank > 1)
		return kiln__i_bad(c, "index must be 0-D or 1-D");
	if (src->dt != x->dt)
		return kiln__i_bad(c, "source must have self's dtype");
	int64_t K = kiln__i_numel(ix);
	if (src->rank != x->rank)
		return kiln__i_bad(c, "source must have self's rank %u",
				   x->rank);
	for (uint32_t j = 0; j < x->rank; j++)
		if (src->size[j] != (j == d ? K : x->size[j]))
			return kiln__i_bad(c,
					   "source must have self's shape with "
					   "index's length at dim %u (dim %u "
					   "differs)",
					   d, j);
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_convert(c, x, x->dt, o));
	int64_t idx[KI_MAXR] = {0};
	if (kiln__i_numel(src) == 0)
		return 0;
	do {
		int64_t v = ki_geti(
		    ix, ix->off + (ix->rank ? idx[d] * ix->stride[0] : 0));
		if (v < 0 || v >= x->size[d]) {
			kiln__i_release(o);
			return kiln__i_bad(c,
					   "index %lld out of range for size "
					   "%lld",
					   (long long)v, (long long)x->size[d]);
		}
		int64_t to = 0;
		for (uint32_t j = 0; j < o->rank; j++)
			to += (j == d ? v : idx[j]) * o->stride[j];
		if (ki_isf(o->dt))
			ki_setf(o, to,
				ki_getf(o, to) +
				    alpha * ki_getf(src, ki_off(src, idx)));
		else /* exact past 2^53 */
			ki_seti(o, to,
				ki_geti(o, to) +
				    (int64_t)alpha *
					ki_geti(src, ki_off(src, idx)));
	} while (ki_next(idx, src->size, src->rank));
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Advanced indexing                                                          */
/* ------------------------------------------------------------------------ */

/* The plan of x[indices]: which dims are indexed, by what (broadcast). */
typedef struct aidx {
	uint32_t n;	      /* index tensors after bool expansion */
	int64_t *iv[KI_MAXR]; /* per x dim: broadcast index values or NULL */
	uint32_t br;	      /* broadcast index shape */
	int64_t bs[KI_MAXR];
	uint32_t rank; /* result rank */
	int64_t size[KI_MAXR];
	int32_t first;	       /* result dim where the index dims go */
	uint32_t map[KI_MAXR]; /* result dim -> x dim for plain dims */
} aidx_t;

static void aidx_free(aidx_t *p)
{
	for (uint32_t d = 0; d < KI_MAXR; d++)
		free(p->iv[d]);
}

/* Expands a bool mask over dims [d, d + mask.rank) into int tensors. */
static int bool_to_long(ictx_t *c, const it_t *m, it_t *out)
{
	int64_t n = kiln__i_numel(m), nnz = 0, idx[KI_MAXR] = {0};
	if (n > 0)
		do
			nnz += ki_geti(m, ki_off(m, idx)) != 0;
		while (ki_next(idx, m->size, m->rank));
	for (uint32_t k = 0; k < m->rank; k++) {
		KI_TRY(kiln__i_alloc(c, &out[k], KILN_DT_I64, 1, &nnz));
	}
	int64_t j = 0;
	memset(idx, 0, sizeof(idx));
	if (n > 0)
		do
			if (ki_geti(m, ki_off(m, idx)) != 0) {
				for (uint32_t k = 0; k < m->rank; k++)
					out[k].buf->i[j] = idx[k];
				j++;
			}
		while (ki_next(idx, m->size, m->rank));
	return 0;
}

static int aidx_plan(ictx_t *c, const it_t *x, int pos, aidx_t *p)
{
	it_t **ts, tmp[KI_MAXR] = {{0}}, *per[KI_MAXR] = {0};
	uint32_t n, nt = 0, d = 0;
	memset(p, 0, sizeof(*p));
	KI_TRY(kiln__i_tensor_list(c, pos, "indices", &ts, &n, true));
	int rc = 0;
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		it_t *t = ts[k];
		if (t == NULL) {
			d++;
			continue;
		}
		if (t->dt == KILN_DT_BOOL || t->dt == KILN_DT_U8) {
			if (d + t->rank > x->rank) {
				rc = kiln__i_bad(
				    c, "too many indices for a rank-%u tensor",
				    x->rank);
				break;
			}
			for (uint32_t j = 0; j < t->rank; j++)
				if (t->size[j] != x->size[d + j])
					rc = kiln__i_bad(
					    c, "mask shape does not match the "
					       "indexed dims");
			if (rc == 0)
				rc = bool_to_long(c, t, &tmp[nt]);
			for (uint32_t j = 0; rc == 0 && j < t->rank; j++)
				per[d++] = &tmp[nt++];
			continue;
		}
		if (!ki_isint(t->dt)) {
			rc = kiln__i_bad(
			    c, "indices must be integer or bool tensors");
			break;
		}
		if (d >= x->rank) {
			rc = kiln__i_bad(
			    c, "too many indices for a rank-%u tensor",
			    x->rank);
			break;
		}
		per[d++] = t;
	}
	free(ts);
	it_t *list[KI_MAXR];
	uint32_t nl = 0, firstd = KI_MAXR, lastd = 0;
	for (uint32_t j = 0; j < x->rank; j++)
		if (per[j]) {
			list[nl++] = per[j];
			if (firstd == KI_MAXR)
				firstd = j;
			lastd = j;
		}
	if (rc == 0 && nl == 0)
		rc = kiln__i_bad(c, "at least one index must be a tensor");
	if (rc == 0)
		rc = kiln__i_bshape(c, list, (int)nl, &p->br, p->bs);
	bool adjacent = true;
	for (uint32_t j = firstd; rc == 0 && j <= lastd; j++)
		adjacent &= per[j] != NULL;
	if (rc == 0 && x->rank - nl + p->br > KI_MAXR)
		rc = kiln__i_bad(c, "result rank too large");
	int64_t bn = kiln__i_numel_of(p->br, p->bs);
	for (uint32_t j = 0; rc == 0 && j < x->rank; j++) {
		if (!per[j])
			continue;
		p->iv[j] = malloc((size_t)(bn ? bn : 1) * sizeof(int64_t));
		if (p->iv[j] == NULL) {
			rc = kiln__i_oom(c);
			break;
		}
		it_t v;
		kiln__i_bview(per[j], p->br, p->bs, &v);
		int64_t idx[KI_MAXR] = {0}, e = 0;
		if (bn > 0)
			do {
				int64_t iv = ki_geti(&v, ki_off(&v, idx));
				rc = wrap_index(c, &iv, x->size[j], "index");
				p->iv[j][e++] = iv;
			} while (rc == 0 && ki_next(idx, p->bs, p->br));
	}
	for (uint32_t k = 0; k < nt; k++)
		kiln__i_release(&tmp[k]);
	if (rc < 0) {
		aidx_free(p);
		return rc;
	}
	/* result shape */
	uint32_t r = 0;
	p->first = adjacent ? -1 : 0;
	if (!adjacent) {
		for (uint32_t j = 0; j < p->br; j++)
			p->size[r++] = p->bs[j];
	}
	for (uint32_t j = 0; j < x->rank; j++) {
		if (per[j]) {
			if (adjacent && p->first < 0) {
				p->first = (int32_t)r;
				for (uint32_t q = 0; q < p->br; q++)
					p->size[r++] = p->bs[q];
			}
			continue;
		}
		p->map[r] = j;
		p->size[r++] = x->size[j];
	}
	p->rank = r;
	p->n = nl;
	return 0;
}

/* The x offset of result index idx. */
static int64_t aidx_off(const aidx_t *p, const it_t *x, const int64_t *idx)
{
	int64_t e = 0, o = x->off;
	for (uint32_t q = 0; q < p->br; q++)
		e = e * p->bs[q] + idx[(uint32_t)p->first + q];
	for (uint32_t r = 0; r < p->rank; r++) {
		if (r >= (uint32_t)p->first && r < (uint32_t)p->first + p->br)
			continue;
		o += idx[r] * x->stride[p->map[r]];
	}
	for (uint32_t j = 0; j < x->rank; j++)
		if (p->iv[j])
			o += p->iv[j][e] * x->stride[j];
	return o;
}

/* index.Tensor(self, indices) (None entries allowed) */
int kiln__op_index(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	aidx_t p;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(aidx_plan(c, x, 1, &p));
	it_t *o = &c->out[0];
	int rc = kiln__i_alloc(c, o, x->dt, p.rank, p.size);
	int64_t idx[KI_MAXR] = {0}, k = 0;
	if (rc == 0 && kiln__i_numel(o) > 0)
		do
			ki_setf(o, k++, ki_getf(x, aidx_off(&p, x, idx)));
		while (ki_next(idx, p.size, p.rank));
	aidx_free(&p);
	return rc;
}

/* index_put(self, indices, values, accumulate=False) */
int kiln__op_index_put(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *vals;
	aidx_t p;
	bool acc;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 2, "values", &vals));
	KI_TRY(kiln__i_bool(c, 3, "accumulate", false, &acc));
	if (vals->dt != x->dt)
		return kiln__i_bad(c, "values must have self's dtype");
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_convert(c, x, x->dt, o));
	int rc = aidx_plan(c, o, 1, &p);
	if (rc < 0) {
		kiln__i_release(o);
		return rc;
	}
	it_t *two[2] = {vals, NULL};
	it_t probe = {.rank = p.rank};
	memcpy(probe.size, p.size, sizeof(probe.size));
	two[1] = &probe;
	uint32_t br;
	int64_t bs[KI_MAXR];
	rc = kiln__i_bshape(c, two, 2, &br, bs);
	if (rc == 0 &&
	    (br != p.rank || memcmp(bs, p.size, br * sizeof(int64_t))))
		rc = kiln__i_bad(
		    c, "values do not broadcast to the indexed shape");
	it_t v;
	int64_t idx[KI_MAXR] = {0};
	if (rc == 0 && kiln__i_numel_of(p.rank, p.size) > 0) {
		kiln__i_bview(vals, p.rank, p.size, &v);
		do {
			int64_t to = aidx_off(&p, o, idx);
			double s = ki_getf(&v, ki_off(&v, idx));
			ki_setf(o, to, acc ? ki_getf(o, to) + s : s);
		} while (ki_next(idx, p.size, p.rank));
	}
	aidx_free(&p);
	if (rc < 0)
		kiln__i_release(o);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Losses                                                                     */
/* ------------------------------------------------------------------------ */

/* Shared nll checks: self [N, C] or [C], target [N] or [] */
static int nll_shapes(ictx_t *c, const it_t *x, const it_t *t, int64_t *N,
		      int64_t *C)
{
	KI_TRY(need_rank(c, x, "self", 1, 2));
	KI_TRY(need_index(c, t, "target"));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "self must be floating");
	*N = x->rank == 2 ? x->size[0] : 1;
	*C = x->size[x->rank - 1];
	if ((x->rank == 2 && (t->rank != 1 || t->size[0] != *N)) ||
	    (x->rank == 1 && t->rank != 0))
		return kiln__i_bad(c, "target shape does not match self");
	return 0;
}

/* nll_loss_forward(self, target, weight?, reduction, ignore_index) */
int kiln__op_nll(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *t, *wt;
	int64_t red, ign, N, C;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 1, "target", &t));
	KI_TRY(kiln__i_tensor_opt(c, 2, "weight", &wt));
	KI_TRY(kiln__i_int(c, 3, "reduction", KI_REQ, &red));
	KI_TRY(kiln__i_int(c, 4, "ignore_index", KI_REQ, &ign));
	KI_TRY(nll_shapes(c, x, t, &N, &C));
	if (red < 0 || red > 2)
		return kiln__i_bad(c, "reduction must be 0, 1 or 2");
	if (wt && kiln__i_numel(wt) != C)
		return kiln__i_bad(c, "weight must have %lld elements",
				   (long long)C);
	double *xv = NULL, *w = NULL, *lv = ki_dcalloc(N);
	int64_t *tv = NULL;
	int rc = lv ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, x, &xv);
	if (rc == 0)
		rc = kiln__i_to_i(c, t, &tv);
	if (rc == 0 && wt)
		rc = kiln__i_to_f(c, wt, &w);
	double tot = 0, sum = 0;
	for (int64_t n = 0; rc == 0 && n < N; n++) {
		int64_t cl = tv[n];
		if (cl == ign)
			continue;
		if (cl < 0 || cl >= C) {
			rc = kiln__i_bad(
			    c, "target %lld out of bounds for %lld classes",
			    (long long)cl, (long long)C);
			break;
		}
		double ww = w ? w[cl] : 1;
		lv[n] = -ww * xv[n * C + cl];
		tot += ww;
		sum += lv[n];
	}
	if (rc == 0 && red == 0) {
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank == 2 ? 1 : 0,
				    &N, lv);
		tot = 0;
	} else if (rc == 0) {
		double v = red == 1 ? sum / tot : sum;
		rc = kiln__i_from_f(c, &c->out[0], x->dt, 0, NULL, &v);
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[1], x->dt, 0, NULL, &tot);
	free6(xv, w, lv, tv, NULL, NULL);
	return rc;
}

/* nll_loss_backward(grad_output, self, target, weight?, reduction,
 * ignore_index, total_weight) */
int kiln__op_nll_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *x, *t, *wt, *tw;
	int64_t red, ign, N, C;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, 1, "self", &x));
	KI_TRY(kiln__i_tensor(c, 2, "target", &t));
	KI_TRY(kiln__i_tensor_opt(c, 3, "weight", &wt));
	KI_TRY(kiln__i_int(c, 4, "reduction", KI_REQ, &red));
	KI_TRY(kiln__i_int(c, 5, "ignore_index", KI_REQ, &ign));
	KI_TRY(kiln__i_tensor(c, 6, "total_weight", &tw));
	KI_TRY(nll_shapes(c, x, t, &N, &C));
	if (red < 0 || red > 2)
		return kiln__i_bad(c, "reduction must be 0, 1 or 2");
	if ((red == 0 && x->rank == 2 && kiln__i_numel(g) != N) ||
	    (red != 0 && kiln__i_numel(g) != 1))
		return kiln__i_bad(c, "grad_output has the wrong shape");
	if (wt && kiln__i_numel(wt) != C)
		return kiln__i_bad(c, "weight must have %lld elements",
				   (long long)C);
	double *gv = NULL, *w = NULL, *ov = ki_dcalloc(N * C);
	int64_t *tv = NULL;
	int rc = ov ? 0 : kiln__i_oom(c);
	if (rc == 0)
		rc = kiln__i_to_f(c, g, &gv);
	if (rc == 0)
		rc = kiln__i_to_i(c, t, &tv);
	if (rc == 0 && wt)
		rc = kiln__i_to_f(c, wt, &w);
	double twv = rc == 0 ? ki_getf(tw, tw->off) : 1;
	for (int64_t n = 0; rc == 0 && n < N; n++) {
		int64_t cl = tv[n];
		if (cl == ign)
			continue;
		if (cl < 0 || cl >= C) {
			rc = kiln__i_bad(
			    c, "target %lld out of bounds for %lld classes",
			    (long long)cl, (long long)C);
			break;
		}
		double gg = red == 0 ? gv[n] : gv[0];
		if (red == 1)
			gg /= twv;
		ov[n * C + cl] = -(w ? w[cl] : 1) * gg;
	}
	if (rc == 0)
		rc = kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, ov);
	free6(gv, w, ov, tv, NULL, NULL);
	return rc;
}

/* mse_loss(self, target, reduction=1) */
int kiln__op_mse(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *t, a, b;
	int64_t red, size[KI_MAXR];
	uint32_t r;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 1, "target", &t));
	KI_TRY(kiln__i_int(c, 2, "reduction", 1, &red));
	if (!ki_isf(x->dt) || t->dt != x->dt)
		return kiln__i_bad(
		    c, "self and target must be floating, one dtype");
	if (red < 0 || red > 2)
		return kiln__i_bad(c, "reduction must be 0, 1 or 2");
	it_t *ops[2] = {x, t};
	KI_TRY(kiln__i_bshape(c, ops, 2, &r, size));
	kiln__i_bview(x, r, size, &a);
	kiln__i_bview(t, r, size, &b);
	int64_t n = kiln__i_numel_of(r, size), idx[KI_MAXR] = {0}, k = 0;
	double *v = ki_dcalloc(n), s = 0;
	if (v == NULL)
		return kiln__i_oom(c);
	if (n > 0)
		do {
			double d = ki_getf(&a, ki_off(&a, idx)) -
				   ki_getf(&b, ki_off(&b, idx));
			v[k++] = d * d;
			s += d * d;
		} while (ki_next(idx, size, r));
	int rc;
	if (red == 0) {
		rc = kiln__i_from_f(c, &c->out[0], x->dt, r, size, v);
	} else {
		if (red == 1)
			s /= (double)n;
		rc = kiln__i_from_f(c, &c->out[0], x->dt, 0, NULL, &s);
	}
	free(v);
	return rc;
}

/* mse_loss_backward(grad_output, self, target, reduction) */
int kiln__op_mse_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *x, *t, a, b, gg;
	int64_t red, size[KI_MAXR];
	uint32_t r;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, 1, "self", &x));
	KI_TRY(kiln__i_tensor(c, 2, "target", &t));
	KI_TRY(kiln__i_int(c, 3, "reduction", KI_REQ, &red));
	if (!ki_isf(x->dt) || t->dt != x->dt)
		return kiln__i_bad(
		    c, "self and target must be floating, one dtype");
	if (red < 0 || red > 2)
		return kiln__i_bad(c, "reduction must be 0, 1 or 2");
	it_t *ops[3] = {g, x, t};
	KI_TRY(kiln__i_bshape(c, ops, 3, &r, size));
	kiln__i_bview(x, r, size, &a);
	kiln__i_bview(t, r, size, &b);
	kiln__i_bview(g, r, size, &gg);
	int64_t n = kiln__i_numel_of(r, size), idx[KI_MAXR] = {0}, k = 0;
	double norm = red == 1 ? 2.0 / (double)n : 2.0;
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, r, size));
	if (n > 0)
		do {
			double d = ki_getf(&a, ki_off(&a, idx)) -
				   ki_getf(&b, ki_off(&b, idx));
			ki_setf(o, k++,
				norm * d * ki_getf(&gg, ki_off(&gg, idx)));
		} while (ki_next(idx, size, r));
	return 0;
}
