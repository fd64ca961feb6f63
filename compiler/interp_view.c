/*
 * interp_view.c — the reference interpreter's view and layout ops: view,
 * reshape, permute, transpose, expand, squeeze, unsqueeze, slice, select,
 * split, unbind, alias, as_strided (views: they share their input's buffer,
 * graphs being functional), and cat, stack, constant_pad_nd, flip, repeat,
 * select_backward, slice_backward (which write new contiguous tensors).
 * Conventions and representation: interp_internal.h.
 *
 * Threads: any; no global state.
 */
#include "compiler/interp_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Views                                                                      */
/* ------------------------------------------------------------------------ */

/* torch's computeStride: strides for viewing (os, ost) as ns, if possible. */
static bool view_strides(uint32_t orank, const int64_t *os, const int64_t *ost,
			 uint32_t nrank, const int64_t *ns, int64_t *nst)
{
	if (kiln__i_numel_of(orank, os) == 0 || orank == 0) {
		kiln__i_contig_strides(nrank, ns, nst);
		return true;
	}
	int64_t view_d = (int64_t)nrank - 1;
	int64_t chunk = ost[orank - 1], tn = 1, vn = 1;
	for (int64_t td = (int64_t)orank - 1; td >= 0; td--) {
		tn *= os[td];
		if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tn * chunk)) {
			while (view_d >= 0 && (vn < tn || ns[view_d] == 1)) {
				nst[view_d] = vn * chunk;
				vn *= ns[view_d];
				view_d--;
			}
			if (vn != tn)
				return false;
			if (td > 0) {
				chunk = ost[td - 1];
				tn = vn = 1;
			}
		}
	}
	return view_d == -1;
}

int kiln__i_reshape(ictx_t *c, const it_t *x, uint32_t rank,
		    const int64_t *size, it_t *out)
{
	int64_t st[KI_MAXR];
	if (view_strides(x->rank, x->size, x->stride, rank, size, st)) {
		kiln__i_ref(out, x);
		out->rank = rank;
		memcpy(out->size, size, rank * sizeof(int64_t));
		memcpy(out->stride, st, rank * sizeof(int64_t));
		return 0;
	}
	it_t tmp;
	KI_TRY(kiln__i_convert(c, x, x->dt, &tmp));
	tmp.rank = rank;
	memcpy(tmp.size, size, rank * sizeof(int64_t));
	kiln__i_contig_strides(rank, size, tmp.stride);
	*out = tmp;
	return 0;
}

/* view / _unsafe_view / reshape(self, size) ; _reshape_alias(self, size,
 * stride) */
int kiln__op_view(ictx_t *c, int code)
{
	it_t *x;
	int64_t size[KI_MAXR], st[KI_MAXR];
	int n, ns;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, NULL, size, KI_MAXR, &n));
	if (n < 0)
		return kiln__i_bad(c, "missing size");
	int infer = -1;
	int64_t known = 1;
	for (int d = 0; d < n; d++) {
		if (size[d] == -1 && code == VW_VIEW) {
			if (infer >= 0)
				return kiln__i_bad(
				    c, "only one dimension can be inferred");
			infer = d;
		} else if (size[d] < 0) {
			return kiln__i_bad(c, "invalid size %lld",
					   (long long)size[d]);
		} else {
			if (__builtin_mul_overflow(known, size[d], &known))
				return kiln__i_bad(c, "size overflows");
		}
	}
	int64_t numel = kiln__i_numel(x);
	if (infer >= 0) {
		if (known == 0 || numel % known != 0) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), (uint32_t)n, size);
			kiln__i_fmt_shape(b, sizeof(b), x->rank, x->size);
			return kiln__i_bad(
			    c, "shape %s is invalid for input of shape %s", a,
			    b);
		}
		size[infer] = numel / known;
		known *= size[infer];
	}
	if (code == VW_RESHAPE_ALIAS) {
		KI_TRY(kiln__i_ints(c, 2, "stride", st, KI_MAXR, &ns));
		if (ns != n)
			return kiln__i_bad(c, "size and stride lengths differ");
		for (int d = 0; d < n; d++)
			if (st[d] < 0)
				return kiln__i_bad(c, "negative stride");
		/* a view of x's own elements: needs x's storage to cover it */
		KI_TRY(kiln__i_check_numel(c, (uint32_t)n, size));
		for (int d = 0; d < n; d++)
			if (st[d] > KI_MAX_ELEMS)
				return kiln__i_bad(c, "stride too large");
		it_t *o = &c->out[0];
		kiln__i_ref(o, x);
		o->rank = (uint32_t)n;
		memcpy(o->size, size, (size_t)n * sizeof(int64_t));
		memcpy(o->stride, st, (size_t)n * sizeof(int64_t));
		int64_t hi = o->off;
		for (int d = 0; d < n; d++)
			if (size[d] > 0)
				hi += (size[d] - 1) * st[d];
		if (known > 0 && hi >= o->buf->n) {
			kiln__i_release(o);
			return kiln__i_bad(
			    c, "size and stride reach outside the input");
		}
		return 0;
	}
	if (known != numel) {
		char a[160], b[160];
		kiln__i_fmt_shape(a, sizeof(a), (uint32_t)n, size);
		kiln__i_fmt_shape(b, sizeof(b), x->rank, x->size);
		return kiln__i_bad(
		    c, "shape %s is invalid for input of shape %s", a, b);
	}
	return kiln__i_reshape(c, x, (uint32_t)n, size, &c->out[0]);
}

int kiln__op_permute(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t dims[KI_MAXR];
	int n;
	bool seen[KI_MAXR] = {0};
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "dims", dims, KI_MAXR, &n));
	if (n != (int)x->rank)
		return kiln__i_bad(c, "permute needs %u dims, got %d", x->rank,
				   n);
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	for (int k = 0; k < n; k++) {
		uint32_t d;
		int rc = kiln__i_dim(c, dims[k], x->rank, &d);
		if (rc == 0 && seen[d])
			rc = kiln__i_bad(
			    c, "dims is not a permutation (dim %u repeats)", d);
		if (rc < 0) {
			kiln__i_release(o);
			return rc;
		}
		seen[d] = true;
		o->size[k] = x->size[d];
		o->stride[k] = x->stride[d];
	}
	return 0;
}

/* transpose.int(self, dim0, dim1) ; t(self) */
int kiln__op_transpose(ictx_t *c, int is_t)
{
	it_t *x;
	int64_t a = 0, b = 1;
	uint32_t da, db;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (is_t) {
		if (x->rank > 2)
			return kiln__i_bad(
			    c, "t() takes a tensor of rank <= 2, not %u",
			    x->rank);
		if (x->rank < 2)
			b = 0;
	} else {
		KI_TRY(kiln__i_int(c, 1, "dim0", KI_REQ, &a));
		KI_TRY(kiln__i_int(c, 2, "dim1", KI_REQ, &b));
	}
	KI_TRY(kiln__i_dim(c, a, x->rank, &da));
	KI_TRY(kiln__i_dim(c, b, x->rank, &db));
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	if (x->rank == 0)
		return 0;
	o->size[da] = x->size[db];
	o->size[db] = x->size[da];
	o->stride[da] = x->stride[db];
	o->stride[db] = x->stride[da];
	return 0;
}

int kiln__op_expand(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t size[KI_MAXR];
	int n;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "size", size, KI_MAXR, &n));
	if (n < (int)x->rank) {
		return kiln__i_bad(c, "expand to %d dims from a rank-%u tensor",
				   n, x->rank);
	}
	it_t *o = &c->out[0];
	uint32_t lead = (uint32_t)n - x->rank;
	for (int d = 0; d < n; d++) {
		int64_t s = size[d];
		if ((uint32_t)d < lead) {
			if (s < 0)
				return kiln__i_bad(
				    c, "size -1 is not allowed in a new "
				       "leading dim");
			continue;
		}
		int64_t xs = x->size[(uint32_t)d - lead];
		if (s == -1)
			size[d] = xs;
		else if (s != xs && xs != 1) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), x->rank, x->size);
			kiln__i_fmt_shape(b, sizeof(b), (uint32_t)n, size);
			return kiln__i_bad(
			    c, "shape %s cannot be expanded to %s", a, b);
		}
		if (size[d] < 0)
			return kiln__i_bad(c, "invalid size %lld",
					   (long long)size[d]);
	}
	KI_TRY(kiln__i_check_numel(c, (uint32_t)n, size));
	kiln__i_ref(o, x);
	kiln__i_bview(x, (uint32_t)n, size, o);
	return 0;
}

/* squeeze.default / .dim / .dims */
int kiln__op_squeeze(ictx_t *c, int code)
{
	it_t *x;
	bool mask[KI_MAXR] = {0};
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (code == 0) {
		for (uint32_t d = 0; d < x->rank; d++)
			mask[d] = true;
	} else {
		int cnt;
		KI_TRY(kiln__i_parse_dims(c, x, 1, "dim", false, mask, &cnt));
	}
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	uint32_t r = 0;
	for (uint32_t d = 0; d < x->rank; d++) {
		if (mask[d] && x->size[d] == 1)
			continue;
		o->size[r] = x->size[d];
		o->stride[r++] = x->stride[d];
	}
	o->rank = r;
	return 0;
}

int kiln__op_unsqueeze(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t dim;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	if (x->rank >= KI_MAXR)
		return kiln__i_bad(c, "rank too large");
	KI_TRY(kiln__i_dim(c, dim, x->rank + 1, &d));
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	o->rank = x->rank + 1;
	for (uint32_t k = o->rank; k-- > 0;) {
		if (k > d) {
			o->size[k] = x->size[k - 1];
			o->stride[k] = x->stride[k - 1];
		} else if (k == d) {
			o->size[k] = 1;
			o->stride[k] =
			    d < x->rank ? x->size[d] * x->stride[d] : 1;
		}
	}
	return 0;
}

/* Clamps [start, end) like torch's slice. */
static void clamp_range(int64_t size, int64_t *start, int64_t *end)
{
	if (*start < 0)
		*start += size;
	if (*end < 0)
		*end += size;
	if (*start < 0)
		*start = 0;
	if (*start > size)
		*start = size;
	if (*end < *start)
		*end = *start;
	if (*end > size)
		*end = size;
}

/* slice.Tensor(self, dim=0, start=None, end=None, step=1) */
/* slice(self, dim, start, end, step); code 1: narrow(self, dim, start,
 * length), the slice [start, start + length) that must lie within dim
 * (start may count from the end) */
int kiln__op_slice(ictx_t *c, int code)
{
	it_t *x;
	int64_t dim, start, end, step;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "dim", code ? KI_REQ : 0, &dim));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (x->rank == 0)
		return kiln__i_bad(c,
				   "%s() cannot be applied to a 0-dim tensor",
				   code ? "narrow" : "slice");
	if (code) {
		int64_t len, n = x->size[d];
		KI_TRY(kiln__i_int(c, 2, "start", KI_REQ, &start));
		KI_TRY(kiln__i_int(c, 3, "length", KI_REQ, &len));
		if (start < -n || start > n)
			return kiln__i_bad(c,
					   "start %lld out of range for dim %u "
					   "of size %lld",
					   (long long)start, d, (long long)n);
		if (start < 0)
			start += n;
		if (len < 0 || len > n - start)
			return kiln__i_bad(
			    c,
			    "start (%lld) + length (%lld) exceeds "
			    "dim %u of size %lld",
			    (long long)start, (long long)len, d, (long long)n);
		end = start + len;
		step = 1;
	} else {
		KI_TRY(kiln__i_int(c, 2, "start", 0, &start));
		KI_TRY(kiln__i_int(c, 3, "end", INT64_MAX, &end));
		KI_TRY(kiln__i_int(c, 4, "step", 1, &step));
	}
	if (step <= 0)
		return kiln__i_bad(c, "slice step must be positive, not %lld",
				   (long long)step);
	clamp_range(x->size[d], &start, &end);
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	o->off += start * x->stride[d];
	o->size[d] = (end - start) / step + ((end - start) % step != 0);
	if (step > x->size[d]) /* at most one element: any stride will do */
		step = 1;
	o->stride[d] = x->stride[d] * step;
	return 0;
}

int kiln__op_select(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t dim, index;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (x->rank == 0)
		return kiln__i_bad(
		    c, "select() cannot be applied to a 0-dim tensor");
	KI_TRY(kiln__i_int(c, 1, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_int(c, 2, "index", KI_REQ, &index));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	int64_t s = x->size[d];
	if (index < -s || index >= s)
		return kiln__i_bad(
		    c, "index %lld out of range for dim %u of size %lld",
		    (long long)index, d, (long long)s);
	if (index < 0)
		index += s;
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	o->off += index * x->stride[d];
	for (uint32_t k = d; k + 1 < x->rank; k++) {
		o->size[k] = x->size[k + 1];
		o->stride[k] = x->stride[k + 1];
	}
	o->rank = x->rank - 1;
	return 0;
}

/* split.Tensor(self, split_size, dim=0), split_with_sizes(self, sizes,
 * dim=0), unbind.int(self, dim=0) */
int kiln__op_split(ictx_t *c, int code)
{
	it_t *x;
	int64_t dim, ss = 0, sizes[64];
	int ns = 0;
	uint32_t d;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, code == SPLIT_UNBIND ? 1 : 2, "dim", 0, &dim));
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (x->rank == 0)
		return kiln__i_bad(c, "cannot split a 0-dim tensor");
	int64_t len = x->size[d];
	uint32_t n;
	if (code == SPLIT_SIZE) {
		KI_TRY(kiln__i_int(c, 1, "split_size", KI_REQ, &ss));
		if (ss < 0 || (ss == 0 && len != 0))
			return kiln__i_bad(
			    c, "split_size %lld is invalid for size %lld",
			    (long long)ss, (long long)len);
		n = ss == 0 ? 1 : (uint32_t)(len / ss + (len % ss != 0));
		if (n == 0)
			n = 1;
	} else if (code == SPLIT_SIZES) {
		const kiln_arg_t *a = kiln__i_arg(c, 1, "split_sizes");
		if (a == NULL || a->kind != KILN_ARG_LIST || a->n > 64)
			return kiln__i_bad(
			    c, "split_sizes must be a list of <= 64 ints");
		KI_TRY(kiln__i_ints(c, 1, "split_sizes", sizes, 64, &ns));
		int64_t tot = 0;
		for (int k = 0; k < ns; k++) {
			if (sizes[k] < 0)
				return kiln__i_bad(c, "negative split size");
			if (__builtin_add_overflow(tot, sizes[k], &tot))
				return kiln__i_bad(c, "split sizes overflow");
		}
		if (tot != len)
			return kiln__i_bad(
			    c,
			    "split sizes add up to %lld, not the dim's "
			    "size %lld",
			    (long long)tot, (long long)len);
		n = (uint32_t)ns;
	} else {
		n = (uint32_t)len;
	}
	if (n != c->nd->n_out)
		return kiln__i_bad(c,
				   "makes %u outputs but the node declares %u",
				   n, c->nd->n_out);
	int64_t start = 0;
	for (uint32_t k = 0; k < n; k++) {
		it_t *o = &c->out[k];
		kiln__i_ref(o, x);
		int64_t sz = code == SPLIT_SIZE
				 ? (len - start < ss ? len - start : ss)
			     : code == SPLIT_SIZES ? sizes[k]
						   : 1;
		o->off += start * x->stride[d];
		o->size[d] = sz;
		start += sz;
		if (code == SPLIT_UNBIND) {
			for (uint32_t j = d; j + 1 < x->rank; j++) {
				o->size[j] = x->size[j + 1];
				o->stride[j] = x->stride[j + 1];
			}
			o->rank = x->rank - 1;
		}
	}
	return 0;
}

/* Copies src into the region of dst starting at offset `at` along dim d. */
static void place(it_t *dst, const it_t *src, uint32_t d, int64_t at)
{
	int64_t idx[KI_MAXR] = {0};
	if (kiln__i_numel(src) == 0)
		return;
	do {
		int64_t o = dst->off;
		for (uint32_t k = 0; k < dst->rank; k++)
			o += (idx[k] + (k == d ? at : 0)) * dst->stride[k];
		int64_t so = ki_off(src, idx);
		if (src->buf->f)
			ki_setf(dst, o, src->buf->f[so]);
		else
			ki_seti(dst, o, src->buf->i[so]);
	} while (ki_next(idx, src->size, src->rank));
}

/* cat(tensors, dim=0): legacy 1-D empty tensors are skipped */
int kiln__op_cat(ictx_t *c, int code)
{
	(void)code;
	it_t **ts;
	uint32_t n;
	int64_t dim;
	KI_TRY(kiln__i_tensor_list(c, 0, "tensors", &ts, &n, false));
	int rc = kiln__i_int(c, 1, "dim", 0, &dim);
	const it_t *ref = NULL;
	for (uint32_t k = 0; k < n && rc == 0; k++)
		if (!(ts[k]->rank == 1 && ts[k]->size[0] == 0)) {
			ref = ts[k];
			break;
		}
	if (rc == 0 && n == 0)
		rc = kiln__i_bad(c, "cat needs at least one tensor");
	if (rc < 0) {
		free(ts);
		return rc;
	}
	if (ref == NULL)
		ref = ts[0];
	uint32_t d = 0;
	kiln_dtype_t dt = kiln__i_result_type(ts, (int)n);
	rc = ref->rank == 0
		 ? kiln__i_bad(c, "zero-dim tensors cannot be concatenated")
		 : kiln__i_dim(c, dim, ref->rank, &d);
	int64_t size[KI_MAXR], tot = 0;
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		const it_t *t = ts[k];
		if (t->rank == 1 && t->size[0] == 0 && t != ref)
			continue;
		bool ok = t->rank == ref->rank;
		for (uint32_t j = 0; ok && j < t->rank; j++)
			ok = j == d || t->size[j] == ref->size[j];
		if (!ok) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), ref->rank, ref->size);
			kiln__i_fmt_shape(b, sizeof(b), t->rank, t->size);
			rc = kiln__i_bad(
			    c,
			    "tensor %u has shape %s, which does not match "
			    "%s outside dim %u",
			    k, b, a, d);
		}
		tot += t->size[d];
	}
	if (rc == 0) {
		memcpy(size, ref->size, sizeof(size));
		size[d] = tot;
		rc = kiln__i_alloc(c, &c->out[0], dt, ref->rank, size);
	}
	int64_t at = 0;
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		if (ts[k]->rank == 1 && ts[k]->size[0] == 0 && ts[k] != ref)
			continue;
		place(&c->out[0], ts[k], d, at);
		at += ts[k]->size[d];
	}
	free(ts);
	return rc;
}

int kiln__op_stack(ictx_t *c, int code)
{
	(void)code;
	it_t **ts;
	uint32_t n, d = 0;
	int64_t dim;
	KI_TRY(kiln__i_tensor_list(c, 0, "tensors", &ts, &n, false));
	int rc = kiln__i_int(c, 1, "dim", 0, &dim);
	if (rc == 0 && n == 0)
		rc = kiln__i_bad(c, "stack needs at least one tensor");
	if (rc == 0 && ts[0]->rank >= KI_MAXR)
		rc = kiln__i_bad(c, "rank too large");
	if (rc == 0)
		rc = kiln__i_dim(c, dim, ts[0]->rank + 1, &d);
	for (uint32_t k = 1; k < n && rc == 0; k++)
		if (!ki_same_shape(ts[k], ts[0]))
			rc = kiln__i_need_shape(c, ts[k], "every tensor",
						ts[0]->rank, ts[0]->size);
	int64_t size[KI_MAXR];
	uint32_t r = rc == 0 ? ts[0]->rank + 1 : 0;
	for (uint32_t j = 0, k = 0; rc == 0 && j < r; j++)
		size[j] = j == d ? (int64_t)n : ts[0]->size[k++];
	if (rc == 0)
		rc = kiln__i_alloc(c, &c->out[0],
				   kiln__i_result_type(ts, (int)n), r, size);
	for (uint32_t k = 0; k < n && rc == 0; k++) {
		it_t v = *ts[k];
		v.rank = r;
		for (uint32_t j = 0, i = 0; j < r; j++) {
			v.size[j] = j == d ? 1 : ts[k]->size[i];
			v.stride[j] = j == d ? 0 : ts[k]->stride[i];
			if (j != d)
				i++;
		}
		place(&c->out[0], &v, d, k);
	}
	free(ts);
	return rc;
}

int kiln__op_alias(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	kiln__i_ref(&c->out[0], x);
	return 0;
}

/* constant_pad_nd(self, pad, value=0): pairs from the last dim; negative
 * pads crop */
int kiln__op_pad(ictx_t *c, int code)
{
	(void)code;
	it_t *x, val;
	int64_t pad[KI_MAXR * 2], size[KI_MAXR];
	int n;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "pad", pad, KI_MAXR * 2, &n));
	if (n < 0 || n % 2 != 0 || n / 2 > (int)x->rank)
		return kiln__i_bad(
		    c, "pad length %d is invalid for a rank-%u input", n,
		    x->rank);
	memcpy(size, x->size, sizeof(size));
	int64_t lo[KI_MAXR] = {0};
	for (int k = 0; k < n / 2; k++) {
		uint32_t d = x->rank - 1 - (uint32_t)k;
		lo[d] = pad[2 * k];
		if (pad[2 * k] < -KI_MAX_ELEMS || pad[2 * k] > KI_MAX_ELEMS ||
		    pad[2 * k + 1] < -KI_MAX_ELEMS ||
		    pad[2 * k + 1] > KI_MAX_ELEMS)
			return kiln__i_bad(c, "pad too large");
		size[d] = x->size[d] + pad[2 * k] + pad[2 * k + 1];
		if (size[d] < 0)
			return kiln__i_bad(
			    c, "padding makes dim %u negative (%lld)", d,
			    (long long)size[d]);
	}
	const kiln_arg_t *va = kiln__i_arg(c, 2, "value");
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, x->rank, size));
	if (va != NULL) {
		int rc = kiln__i_operand(c, 2, "value", &val);
		if (rc < 0)
			return rc;
		for (int64_t k = 0, nn = kiln__i_numel(o); k < nn; k++)
			ki_setf(o, k, ki_getf(&val, val.off));
		kiln__i_release(&val);
	}
	/* copy the overlap: output index j maps to input j - lo */
	it_t src = *x, dst = *o;
	for (uint32_t d = 0; d < x->rank; d++) {
		int64_t a = lo[d] < 0 ? -lo[d] : 0; /* first input index kept */
		int64_t b = lo[d] > 0 ? lo[d] : 0;  /* where it lands */
		int64_t cnt = x->size[d] - a;
		if (cnt > size[d] - b)
			cnt = size[d] - b;
		if (cnt < 0)
			cnt = 0;
		src.off += a * x->stride[d];
		src.size[d] = cnt;
		dst.off += b * o->stride[d];
		dst.size[d] = cnt;
	}
	place(&dst, &src, 0, 0);
	return 0;
}

int kiln__op_flip(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	bool mask[KI_MAXR];
	int cnt;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_parse_dims(c, x, 1, "dims", false, mask, &cnt));
	it_t v = *x;
	for (uint32_t d = 0; d < x->rank; d++)
		if (mask[d] && x->size[d] > 0) {
			v.off += (x->size[d] - 1) * x->stride[d];
			v.stride[d] = -x->stride[d];
		}
	return kiln__i_convert(c, &v, x->dt, &c->out[0]);
}

/* roll(self, shifts, dims=[]): out[i] = self[(i_d - shift_d) mod size_d]
 * per rolled dim d (a dim named twice rolls by the sum); without dims,
 * the elements in row-major order roll by the one shift. */
int kiln__op_roll(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t sh[KI_MAXR], dm[KI_MAXR], by[KI_MAXR] = {0};
	int ns, nd;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "shifts", sh, KI_MAXR, &ns));
	KI_TRY(kiln__i_ints(c, 2, "dims", dm, KI_MAXR, &nd));
	if (ns < 1)
		return kiln__i_bad(c, "shifts must name at least one shift");
	if (nd < 0)
		nd = 0;
	if (nd == 0 && ns != 1)
		return kiln__i_bad(c, "without dims, shifts must be one shift");
	if (nd > 0 && nd != ns)
		return kiln__i_bad(c,
				   "shifts and dims must have the same "
				   "length (%d and %d)",
				   ns, nd);
	for (int k = 0; k < nd; k++) {
		int64_t d = dm[k] < 0 ? dm[k] + (int64_t)x->rank : dm[k];
		if (d < 0 || d >= (int64_t)x->rank)
			return kiln__i_bad(
			    c, "dim %lld out of range for a rank-%u tensor",
			    (long long)dm[k], x->rank);
		by[d] += sh[k];
	}
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, x->rank, x->size));
	int64_t n = kiln__i_numel(o);
	if (n == 0)
		return 0;
	int64_t idx[KI_MAXR] = {0}, src[KI_MAXR], k = 0;
	do {
		if (nd == 0) {
			/* the source's row-major position, unraveled */
			int64_t lin = ((k - sh[0]) % n + n) % n;
			for (uint32_t d = x->rank; d-- > 0;) {
				src[d] = lin % x->size[d];
				lin /= x->size[d];
			}
		} else {
			for (uint32_t d = 0; d < x->rank; d++)
				src[d] = ((idx[d] - by[d]) % x->size[d] +
					  x->size[d]) %
					 x->size[d];
		}
		int64_t so = x->off;
		for (uint32_t d = 0; d < x->rank; d++)
			so += src[d] * x->stride[d];
		if (x->buf->f)
			ki_setf(o, k++, x->buf->f[so]);
		else
			ki_seti(o, k++, x->buf->i[so]);
	} while (ki_next(idx, x->size, x->rank));
	return 0;
}

int kiln__op_repeat(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t rep[KI_MAXR], size[KI_MAXR];
	int n;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "repeats", rep, KI_MAXR, &n));
	if (n < (int)x->rank)
		return kiln__i_bad(
		    c, "repeats has %d dims, fewer than the input's %u", n,
		    x->rank);
	uint32_t lead = (uint32_t)n - x->rank;
	for (int d = 0; d < n; d++) {
		if (rep[d] < 0)
			return kiln__i_bad(c, "negative repeat");
		if (__builtin_mul_overflow(
			rep[d],
			(uint32_t)d < lead ? 1 : x->size[(uint32_t)d - lead],
			&size[d]))
			return kiln__i_bad(c, "repeat overflows");
	}
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, (uint32_t)n, size));
	int64_t idx[KI_MAXR] = {0}, k = 0;
	if (kiln__i_numel(o) == 0)
		return 0;
	do {
		int64_t so = x->off;
		for (uint32_t d = lead; d < (uint32_t)n; d++)
			so +=
			    (idx[d] % x->size[d - lead]) * x->stride[d - lead];
		if (x->buf->f)
			ki_setf(o, k++, x->buf->f[so]);
		else
			ki_seti(o, k++, x->buf->i[so]);
	} while (ki_next(idx, size, (uint32_t)n));
	return 0;
}

/* select_backward(grad, input_sizes, dim, index) */
/* The placed tensor (grad_output, code 0; src, code 1: select_scatter /
 * slice_scatter) and the result's shape (input_sizes; self's). */
static int placed(ictx_t *c, int code, it_t **g, it_t **self, int64_t *size,
		  int *n)
{
	*self = NULL;
	if (code == 0) {
		KI_TRY(kiln__i_tensor(c, 0, "grad_output", g));
		return kiln__i_ints(c, 1, "input_sizes", size, KI_MAXR, n);
	}
	KI_TRY(kiln__i_tensor(c, 0, "self", self));
	KI_TRY(kiln__i_tensor(c, 1, "src", g));
	*n = (int)(*self)->rank;
	memcpy(size, (*self)->size, sizeof((*self)->size));
	return 0;
}

/* The result: zeros of g's dtype, or a copy of self */
static int placed_out(ictx_t *c, const it_t *g, const it_t *self, int n,
		      const int64_t *size, it_t *o)
{
	if (self != NULL)
		return kiln__i_convert(c, self, self->dt, o);
	return kiln__i_alloc(c, o, g->dt, (uint32_t)n, size);
}

int kiln__op_select_bw(ictx_t *c, int code)
{
	it_t *g, *self;
	int64_t size[KI_MAXR], dim, index;
	int n;
	uint32_t d;
	KI_TRY(placed(c, code, &g, &self, size, &n));
	KI_TRY(kiln__i_int(c, 2, "dim", KI_REQ, &dim));
	KI_TRY(kiln__i_int(c, 3, "index", KI_REQ, &index));
	if (n < 1)
		return kiln__i_bad(c, "input_sizes must not be empty");
	KI_TRY(kiln__i_check_numel(c, (uint32_t)n, size));
	KI_TRY(kiln__i_dim(c, dim, (uint32_t)n, &d));
	if (index < -size[d] || index >= size[d])
		return kiln__i_bad(c, "index %lld out of range",
				   (long long)index);
	if (index < 0)
		index += size[d];
	int64_t gs[KI_MAXR];
	for (uint32_t k = 0, j = 0; k < (uint32_t)n; k++)
		if (k != d)
			gs[j++] = size[k];
	KI_TRY(kiln__i_need_shape(c, g, code ? "src" : "grad_output",
				  (uint32_t)n - 1, gs));
	it_t *o = &c->out[0];
	KI_TRY(placed_out(c, g, self, n, size, o));
	it_t v = *g;
	v.rank = (uint32_t)n;
	for (uint32_t k = 0, j = 0; k < (uint32_t)n; k++) {
		v.size[k] = k == d ? 1 : g->size[j];
		v.stride[k] = k == d ? 0 : g->stride[j];
		if (k != d)
			j++;
	}
	place(o, &v, d, index);
	return 0;
}

/* slice_backward(grad, input_sizes, dim, start, end, step) */
int kiln__op_slice_bw(ictx_t *c, int code)
{
	it_t *g, *self;
	int64_t size[KI_MAXR], dim, start, end, step;
	int n;
	uint32_t d;
	KI_TRY(placed(c, code, &g, &self, size, &n));
	/* slice_scatter's dim, start, end and step are optional */
	KI_TRY(kiln__i_int(c, 2, "dim", code ? 0 : KI_REQ, &dim));
	KI_TRY(kiln__i_int(c, 3, "start", code ? 0 : KI_REQ, &start));
	KI_TRY(kiln__i_int(c, 4, "end", code ? INT64_MAX : KI_REQ, &end));
	KI_TRY(kiln__i_int(c, 5, "step", code ? 1 : KI_REQ, &step));
	if (n < 1)
		return kiln__i_bad(c, "input_sizes must not be empty");
	KI_TRY(kiln__i_check_numel(c, (uint32_t)n, size));
	KI_TRY(kiln__i_dim(c, dim, (uint32_t)n, &d));
	if (step <= 0)
		return kiln__i_bad(c, "step must be positive");
	clamp_range(size[d], &start, &end);
	int64_t gs[KI_MAXR];
	memcpy(gs, size, sizeof(gs));
	gs[d] = (end - start) / step + ((end - start) % step != 0);
	KI_TRY(kiln__i_need_shape(c, g, code ? "src" : "grad_output",
				  (uint32_t)n, gs));
	it_t *o = &c->out[0];
	KI_TRY(placed_out(c, g, self, n, size, o));
	it_t dst = *o;
	dst.off += start * o->stride[d];
	dst.stride[d] *= step;
	dst.size[d] = gs[d];
	place(&dst, g, 0, 0);
	return 0;
}

/* The storage offset of the last element of the view (size, st, so) of
 * n dims (so where it has none), or an error for a negative stride or an
 * overflow. */
static int view_last(ictx_t *c, int n, const int64_t *size, const int64_t *st,
		     int64_t so, int64_t *hi)
{
	*hi = so;
	for (int d = 0; d < n; d++) {
		int64_t span;
		if (st[d] < 0)
			return kiln__i_bad(c, "negative stride");
		if (size[d] > 0 &&
		    (__builtin_mul_overflow(size[d] - 1, st[d], &span) ||
		     __builtin_add_overflow(*hi, span, hi)))
			return kiln__i_bad(c, "size and stride overflow");
	}
	return 0;
}

/* as_strided(self, size, stride, storage_offset=None): a view of self's
 * storage (offsets are absolute in it, as in torch) */
int kiln__op_as_strided(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	int64_t size[KI_MAXR], st[KI_MAXR], so;
	int n, ns;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_ints(c, 1, "size", size, KI_MAXR, &n));
	KI_TRY(kiln__i_ints(c, 2, "stride", st, KI_MAXR, &ns));
	KI_TRY(kiln__i_int(c, 3, "storage_offset", x->off, &so));
	if (n < 0 || n != ns)
		return kiln__i_bad(c,
				   "size and stride must have the same length");
	int64_t hi, numel;
	KI_TRY(kiln__i_check_numel(c, (uint32_t)n, size));
	numel = kiln__i_numel_of((uint32_t)n, size);
	KI_TRY(view_last(c, n, size, st, so, &hi));
	if (so < 0 || (numel > 0 && hi >= x->buf->n))
		return kiln__i_bad(
		    c,
		    "as_strided reaches outside the storage (%lld "
		    "elements)",
		    (long long)x->buf->n);
	it_t *o = &c->out[0];
	kiln__i_ref(o, x);
	o->rank = (uint32_t)n;
	o->off = so;
	memcpy(o->size, size, (size_t)n * sizeof(int64_t));
	memcpy(o->stride, st, (size_t)n * sizeof(int64_t));
	return 0;
}

/* as_strided_scatter(self, src, size, stride, storage_offset=None): a
 * copy of self (torch's clone: self's strides where they are dense and
 * do not overlap, else contiguous) whose storage, viewed as (size,
 * stride, storage_offset), takes src (converted to self's dtype) */
int kiln__op_as_strided_scatter(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *src;
	int64_t size[KI_MAXR], st[KI_MAXR], so;
	int n, ns;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 1, "src", &src));
	KI_TRY(kiln__i_ints(c, 2, "size", size, KI_MAXR, &n));
	KI_TRY(kiln__i_ints(c, 3, "stride", st, KI_MAXR, &ns));
	KI_TRY(kiln__i_int(c, 4, "storage_offset", 0, &so));
	if (n < 0 || n != ns)
		return kiln__i_bad(c,
				   "size and stride must have the same length");
	if (src->rank != (uint32_t)n ||
	    memcmp(src->size, size, (size_t)n * sizeof(int64_t)) != 0)
		return kiln__i_bad(c, "src must have the view's size");
	int64_t total = kiln__i_numel(x), hi;
	KI_TRY(view_last(c, n, size, st, so, &hi));
	if (so < 0 || (kiln__i_numel(src) > 0 && hi >= total))
		return kiln__i_bad(c,
				   "the view reaches outside self's %lld "
				   "elements",
				   (long long)total);
	/* the copy's strides: self's where dense (dims of more than one
	 * element in decreasing stride, each the product of the sizes
	 * inside it), else contiguous */
	uint32_t r = x->rank, ord[KI_MAXR];
	for (uint32_t d = 0; d < r; d++)
		ord[d] = d;
	for (uint32_t a = 1; a < r; a++)
		for (uint32_t b = a;
		     b > 0 && x->stride[ord[b]] > x->stride[ord[b - 1]]; b--) {
			uint32_t t = ord[b];
			ord[b] = ord[b - 1];
			ord[b - 1] = t;
		}
	bool dense = true;
	int64_t want = 1;
	for (uint32_t k = r; k-- > 0;) {
		uint32_t d = ord[k];
		if (x->size[d] == 1)
			continue;
		dense = dense && x->stride[d] == want;
		want *= x->size[d];
	}
	int64_t ost[KI_MAXR];
	kiln__i_contig_strides(r, x->size, ost);
	if (dense)
		for (uint32_t d = 0; d < r; d++)
			if (x->size[d] != 1)
				ost[d] = x->stride[d];
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_alloc(c, o, x->dt, r, x->size));
	memcpy(o->stride, ost, r * sizeof(int64_t));
	place(o, x, r, 0);
	it_t v = *o;
	v.rank = (uint32_t)n;
	v.off = o->off + so;
	memcpy(v.size, size, (size_t)n * sizeof(int64_t));
	memcpy(v.stride, st, (size_t)n * sizeof(int64_t));
	place(&v, src, (uint32_t)n, 0);
	return 0;
}

/* tril / triu(self, diagonal=0) over the last two dims */
int kiln__op_tri(ictx_t *c, int upper)
{
	it_t *x;
	int64_t diag;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_int(c, 1, "diagonal", 0, &diag));
	if (x->rank < 2)
		return kiln__i_bad(c, "input must have at least 2 dims");
	it_t *o = &c->out[0];
	KI_TRY(kiln__i_convert(c, x, x->dt, o));
	int64_t R = x->size[x->rank - 2], C = x->size[x->rank - 1];
	int64_t n = kiln__i_numel(o);
	for (int64_t k = 0; k < n; k++) {
		int64_t i = (k / C) % (R ? R : 1), j = k % (C ? C : 1);
		bool keep = upper ? j - i >= diag : j - i <= diag;
		if (!keep)
			ki_seti(o, k, 0);
	}
	return 0;
}
