/*
 * ops_view.c — views and layout ops. A view of a buffer is a new strided
 * view of the same buffer (no copy, no kernel); a view of a lazy tensor
 * re-indexes its body. Padding, cat and the backward of slicing build
 * guarded loads: a load outside its source is never executed.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <string.h>

static lt_t *lt_copy(cctx_t *c, const lt_t *t)
{
	lt_t *u = cir_alloc(c, sizeof(*u));
	if (u != NULL)
		*u = *t;
	return u;
}

/* Re-indexes a lazy tensor: new tensor of (rank, sizes) whose element at
 * VAR 0.. is t's element at map[0 .. t->rank). */
static lt_t *reindex(cctx_t *c, const lt_t *t, uint32_t rank,
		     const kiln_dim_t *sizes, const kiln_expr_t *const *map)
{
	const sx_t *b = lt_at(c, t, map);
	return lt_fn(c, t->dtype, rank, sizes, b);
}

lt_t *lt_permute(cctx_t *c, const lt_t *t, const uint32_t *perm)
{
	kiln_dim_t sizes[CIR_MAX_RANK];
	for (uint32_t j = 0; j < t->rank; j++)
		sizes[j] = t->sizes[perm[j]];
	if (t->is_buf) {
		lt_t *u = lt_copy(c, t);
		if (u == NULL)
			return NULL;
		for (uint32_t j = 0; j < t->rank; j++) {
			u->sizes[j] = t->sizes[perm[j]];
			u->strides[j] = t->strides[perm[j]];
		}
		return u;
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t j = 0; j < t->rank; j++)
		map[perm[j]] = ix_var(c, j);
	return reindex(c, t, t->rank, sizes, map);
}

lt_t *lt_unsqueeze(cctx_t *c, const lt_t *t, uint32_t d)
{
	kiln_dim_t sizes[CIR_MAX_RANK];
	uint32_t r = t->rank + 1;
	for (uint32_t j = 0, k = 0; j < r; j++)
		sizes[j] = j == d ? dim_const(1) : t->sizes[k++];
	if (t->is_buf) {
		lt_t *u = lt_copy(c, t);
		if (u == NULL)
			return NULL;
		u->rank = r;
		for (uint32_t j = 0, k = 0; j < r; j++) {
			u->sizes[j] = sizes[j];
			u->strides[j] = j == d ? dim_const(0) : t->strides[k++];
		}
		return u;
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++)
		map[k] = ix_var(c, k < d ? k : k + 1);
	return reindex(c, t, r, sizes, map);
}

lt_t *lt_squeeze_dim(cctx_t *c, const lt_t *t, uint32_t d)
{
	kiln_dim_t sizes[CIR_MAX_RANK];
	uint32_t r = t->rank - 1;
	for (uint32_t j = 0, k = 0; k < t->rank; k++)
		if (k != d)
			sizes[j++] = t->sizes[k];
	if (t->is_buf) {
		lt_t *u = lt_copy(c, t);
		if (u == NULL)
			return NULL;
		u->rank = r;
		for (uint32_t j = 0, k = 0; k < t->rank; k++)
			if (k != d) {
				u->sizes[j] = t->sizes[k];
				u->strides[j] = t->strides[k];
				j++;
			}
		return u;
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++)
		map[k] = k == d ? ix_const(c, 0) : ix_var(c, k < d ? k : k - 1);
	return reindex(c, t, r, sizes, map);
}

lt_t *lt_expand(cctx_t *c, const lt_t *t, uint32_t rank,
		const kiln_dim_t *sizes)
{
	uint32_t lead = rank - t->rank;
	if (t->is_buf) {
		lt_t *u = lt_copy(c, t);
		if (u == NULL)
			return NULL;
		u->rank = rank;
		for (uint32_t j = 0; j < rank; j++) {
			u->sizes[j] = sizes[j];
			if (j < lead) {
				u->strides[j] = dim_const(0);
			} else {
				uint32_t k = j - lead;
				bool b = dim_is(t->sizes[k], 1) &&
					 !dim_is(sizes[j], 1);
				u->strides[j] =
				    b ? dim_const(0) : t->strides[k];
			}
		}
		return u;
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++) {
		bool b = dim_is(t->sizes[k], 1) && !dim_is(sizes[lead + k], 1);
		map[k] = b ? ix_const(c, 0) : ix_var(c, lead + k);
	}
	return reindex(c, t, rank, sizes, map);
}

lt_t *lt_slice(cctx_t *c, const lt_t *t, uint32_t d, const kiln_expr_t *start,
	       const kiln_expr_t *len, int64_t step)
{
	kiln_dim_t sizes[CIR_MAX_RANK];
	memcpy(sizes, t->sizes, sizeof(kiln_dim_t) * t->rank);
	sizes[d] = dim_of(len);
	if (t->is_buf) {
		lt_t *u = lt_copy(c, t);
		if (u == NULL)
			return NULL;
		u->sizes[d] = sizes[d];
		u->offset =
		    dim_of(ix_add(c, ix_dim(c, t->offset),
				  ix_mul(c, start, ix_dim(c, t->strides[d]))));
		u->strides[d] = dim_mul(c, t->strides[d], dim_const(step));
		return u;
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++)
		map[k] = ix_var(c, k);
	map[d] = ix_add(c, start, ix_mul(c, ix_const(c, step), ix_var(c, d)));
	return reindex(c, t, t->rank, sizes, map);
}

/* Whether e < v for every size the graph's symbols allow (from a lower
 * bound of v - 1 - e: ranges bound symbols from below). */
static bool ix_below(cctx_t *c, const kiln_expr_t *e, int64_t v)
{
	int64_t lo;
	return ix_lower_bound(c, ix_sub(c, ix_const(c, v - 1), e), &lo) &&
	       lo >= 0;
}

/* Whether a < b for every size the graph's symbols allow: 1 yes, 0 no,
 * -1 not known. */
static int dim_lt(cctx_t *c, kiln_dim_t a, kiln_dim_t b)
{
	if (dim_eq(a, b))
		return 0;
	int64_t lo;
	if (ix_lower_bound(c, ix_sub(c, ix_dim(c, b), ix_dim(c, a)), &lo) &&
	    lo >= 1)
		return 1;
	if (ix_lower_bound(c, ix_sub(c, ix_dim(c, a), ix_dim(c, b)), &lo) &&
	    lo >= 0)
		return 0;
	return -1;
}

/* torch's computeStride: strides of a view of (sizes, strides) as
 * newshape, where one exists. Static or symbolic dims (a dynamic sequence
 * length): element counts compare as expressions, so the strides hold for
 * every size; false where a comparison is not known (a symbol that may be
 * 1) or the view needs a copy. */
static bool view_strides(cctx_t *c, uint32_t orank, const kiln_dim_t *osz,
			 const kiln_dim_t *ost, uint32_t nrank,
			 const kiln_dim_t *nsz, kiln_dim_t *nst)
{
	bool zero = false;
	for (uint32_t i = 0; i < orank; i++)
		zero = zero || dim_is(osz[i], 0);
	if (orank == 0 || zero) {
		kiln_dim_t s = dim_const(1);
		for (uint32_t i = nrank; i-- > 0;) {
			nst[i] = s;
			if (orank > 0 && !dim_is(nsz[i], 0))
				s = dim_mul(c, s, nsz[i]);
		}
		return true;
	}
	int64_t view_d = (int64_t)nrank - 1;
	kiln_dim_t chunk = ost[orank - 1], tnumel = dim_const(1),
		   vnumel = dim_const(1);
	for (int64_t td = (int64_t)orank - 1; td >= 0; td--) {
		tnumel = dim_mul(c, tnumel, osz[td]);
		if (td == 0 ||
		    (!dim_is(osz[td - 1], 1) &&
		     !dim_eq(ost[td - 1], dim_mul(c, tnumel, chunk)))) {
			while (view_d >= 0) {
				int less = dim_lt(c, vnumel, tnumel);
				if (less < 0)
					return false;
				if (!less && !dim_is(nsz[view_d], 1))
					break;
				nst[view_d] = dim_mul(c, vnumel, chunk);
				vnumel = dim_mul(c, vnumel, nsz[view_d]);
				view_d--;
			}
			if (!dim_eq(vnumel, tnumel))
				return false;
			if (td > 0) {
				chunk = ost[td - 1];
				tnumel = dim_const(1);
				vnumel = dim_const(1);
			}
		}
	}
	return view_d == -1;
}

static bool is_contig(cctx_t *c, const lt_t *t)
{
	kiln_dim_t s = dim_const(1);
	for (uint32_t i = t->rank; i-- > 0;) {
		if (!dim_is(t->sizes[i], 1) && !dim_eq(t->strides[i], s))
			return false;
		kiln_dim_t sz =
		    dim_is(t->sizes[i], 0) ? dim_const(1) : t->sizes[i];
		s = dim_mul(c, s, sz);
	}
	return true;
}

lt_t *lt_reshape(cctx_t *c, const lt_t *t, uint32_t rank,
		 const kiln_dim_t *sizes)
{
	if (t->is_buf) {
		if (is_contig(c, t)) {
			lt_t *u = lt_copy(c, t);
			if (u == NULL)
				return NULL;
			u->rank = rank;
			kiln_dim_t s = dim_const(1);
			for (uint32_t i = rank; i-- > 0;) {
				u->sizes[i] = sizes[i];
				u->strides[i] = s;
				s = dim_mul(c, s,
					    dim_is(sizes[i], 0) ? dim_const(1)
								: sizes[i]);
			}
			return u;
		}
		kiln_dim_t nst[CIR_MAX_RANK];
		if (view_strides(c, t->rank, t->sizes, t->strides, rank, sizes,
				 nst)) {
			lt_t *u = lt_copy(c, t);
			if (u == NULL)
				return NULL;
			u->rank = rank;
			for (uint32_t i = 0; i < rank; i++) {
				u->sizes[i] = sizes[i];
				u->strides[i] = nst[i];
			}
			return u;
		}
	}
	/* general: through the row-major linear index */
	set_var_ranges(c, rank, sizes);
	const kiln_expr_t *lin = ix_const(c, 0);
	kiln_dim_t s = dim_const(1);
	for (uint32_t i = rank; i-- > 0;) {
		lin = ix_add(c, lin, ix_mul(c, ix_var(c, i), ix_dim(c, s)));
		s = dim_mul(c, s, sizes[i]);
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	s = dim_const(1);
	for (uint32_t k = t->rank; k-- > 0;) {
		const kiln_expr_t *q = ix_floordiv(c, lin, ix_dim(c, s));
		map[k] = k == 0 ? q : ix_mod(c, q, ix_dim(c, t->sizes[k]));
		s = dim_mul(c, s, t->sizes[k]);
	}
	set_var_ranges(c, 0, NULL);
	for (uint32_t k = 0; k < t->rank; k++)
		if (map[k] == NULL)
			return NULL;
	return reindex(c, t, rank, sizes, map);
}

/* Rebuilds every load in e with guard `g` (and-ed with its own). */
typedef struct gmemo {
	const sx_t **k, **v;
	uint32_t cap;
} gmemo_t;

static const sx_t *guard_rec(cctx_t *c, const sx_t *e, const sx_t *g,
			     gmemo_t *m)
{
	if (e == NULL)
		return NULL;
	uint32_t j = (e->hash * 0x9e3779b1u) & (m->cap - 1);
	while (m->k[j] != NULL) {
		if (m->k[j] == e)
			return m->v[j];
		j = (j + 1) & (m->cap - 1);
	}
	const sx_t *r = e;
	switch ((sx_kind_t)e->kind) {
	case SX_LOAD: {
		const sx_t *ng = e->a ? sx_bin(c, OP_AND, e->a, g) : g;
		r = sx_load(c, e->buf, e->idx, ng, e->b);
		break;
	}
	case SX_UN:
		r = sx_un(c, (sx_op_t)e->op, guard_rec(c, e->a, g, m));
		break;
	case SX_BIN:
		r = sx_bin(c, (sx_op_t)e->op, guard_rec(c, e->a, g, m),
			   guard_rec(c, e->b, g, m));
		break;
	case SX_WHERE:
		r = sx_where(c, guard_rec(c, e->a, g, m),
			     guard_rec(c, e->b, g, m),
			     guard_rec(c, e->c, g, m));
		break;
	case SX_CAST: {
		const sx_t *a = guard_rec(c, e->a, g, m);
		r = a == e->a ? e
		    : e->op   ? sx_cast(c, a, (kiln_dtype_t)e->op)
			      : sx_cast(c, a, (kiln_dtype_t)e->dt);
		break;
	}
	default: break;
	}
	j = (e->hash * 0x9e3779b1u) & (m->cap - 1);
	while (m->k[j] != NULL)
		j = (j + 1) & (m->cap - 1);
	m->k[j] = e;
	m->v[j] = r;
	return r;
}

const sx_t *sx_guard(cctx_t *c, const sx_t *e, const sx_t *guard)
{
	if (e == NULL || guard == NULL)
		return NULL;
	if (guard->kind == SX_CONST && guard->k.i != 0)
		return e; /* always in range (in_image) */
	gmemo_t m;
	uint32_t n = sx_size(e, 1u << 20);
	m.cap = 64;
	while (m.cap < 2 * n + 2)
		m.cap *= 2;
	m.k = calloc(m.cap, sizeof(*m.k));
	m.v = calloc(m.cap, sizeof(*m.v));
	const sx_t *r = NULL;
	if (m.k != NULL && m.v != NULL)
		r = guard_rec(c, e, guard, &m);
	free(m.k);
	free(m.v);
	return r;
}

/* 0 <= x < size, as a bool expression. */
static const sx_t *in_range(cctx_t *c, const kiln_expr_t *x, kiln_dim_t size)
{
	const sx_t *v = sx_index(c, x);
	return sx_bin(c, OP_AND,
		      sx_bin(c, OP_GE, v, sx_consti(c, 0, KILN_DT_I64)),
		      sx_bin(c, OP_LT, v, sx_index(c, ix_dim(c, size))));
}

/* The elements of a dim of `size` left after the last of len elements
 * from start, step apart: at least 1 where they lie within it. */
static const kiln_expr_t *slice_room(cctx_t *c, kiln_dim_t size,
				     const kiln_expr_t *start,
				     const kiln_expr_t *len, int64_t step)
{
	return ix_sub(c, ix_dim(c, size),
		      ix_add(c, start,
			     ix_mul(c, ix_sub(c, len, ix_const(c, 1)),
				    ix_const(c, step))));
}

/* t with the elements of dim d at index start + step * i (i its index
 * there) read only where that lies within size, 0 elsewhere: a slice or
 * select whose symbolic start is known only when the graph runs and not
 * provably in range for every size (torch raises there; kiln reads
 * nothing outside the buffer). t itself where it is provably in range
 * (or NULL). */
static lt_t *lt_in_range(cctx_t *c, lt_t *t, uint32_t d, kiln_dim_t size,
			 const kiln_expr_t *start, const kiln_expr_t *len,
			 int64_t step)
{
	int64_t v;
	const kiln_expr_t *room = slice_room(c, size, start, len, step);
	if (t == NULL || (ix_lower_bound(c, start, &v) && v >= 0 &&
			  ix_lower_bound(c, room, &v) && v >= 1))
		return t;
	const kiln_expr_t *at =
	    d < t->rank
		? ix_add(c, start, ix_mul(c, ix_const(c, step), ix_var(c, d)))
		: start;
	const sx_t *g = in_range(c, at, size);
	return lt_fn(
	    c, t->dtype, t->rank, t->sizes,
	    sx_where(c, g, sx_guard(c, lt_body(c, t), g), sxf(c, 0, t->dtype)));
}

/* ---- op lowerings -------------------------------------------------------- */

int low_view(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lout_sizes(n, 0, &rank, sizes, NULL);
	if (rc != 0)
		return rc;
	/* check the element count when it is static */
	int64_t a = 1, b = 1;
	bool stat = true;
	for (uint32_t i = 0; i < x->rank; i++) {
		stat = stat && x->sizes[i].e == NULL;
		a *= x->sizes[i].c;
	}
	for (uint32_t i = 0; i < rank; i++) {
		stat = stat && sizes[i].e == NULL;
		b *= sizes[i].c;
	}
	if (stat && a != b)
		return lerr(n, KILN_EINVGRAPH,
			    "cannot view %lld elements as %lld", (long long)a,
			    (long long)b);
	if (!stat) {
		/* symbolic: an invalid graph where the counts differ for
		 * every size the symbols allow */
		const kiln_expr_t *pa = ix_const(c, 1), *pb = ix_const(c, 1);
		for (uint32_t i = 0; i < x->rank; i++)
			pa = ix_mul(c, pa, ix_dim(c, x->sizes[i]));
		for (uint32_t i = 0; i < rank; i++)
			pb = ix_mul(c, pb, ix_dim(c, sizes[i]));
		const kiln_expr_t *d = ix_sub(c, pa, pb);
		int64_t v;
		if ((ix_lower_bound(c, d, &v) && v >= 1) || ix_below(c, d, 0))
			return lerr(n, KILN_EINVGRAPH,
				    "cannot view the elements as the declared "
				    "shape: the counts differ for every size "
				    "the symbols allow");
	}
	return lset(n, 0, lt_reshape(c, x, rank, sizes));
}

int low_permute(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t dims[CIR_MAX_RANK];
	uint32_t nd;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lintlist(n, 1, "dims", dims, &nd, CIR_MAX_RANK);
	if (rc != 0)
		return rc;
	if (nd != x->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "permute of a rank-%u tensor "
			    "needs %u dims, got %u",
			    x->rank, x->rank, nd);
	uint32_t perm[CIR_MAX_RANK], seen = 0;
	for (uint32_t i = 0; i < nd; i++) {
		rc = ldim(n, dims[i], x->rank, &perm[i]);
		if (rc != 0)
			return rc;
		if (seen >> perm[i] & 1)
			return lerr(n, KILN_EINVGRAPH, "dim %u repeated",
				    perm[i]);
		seen |= 1u << perm[i];
	}
	return lset(n, 0, lt_permute(c, x, perm));
}

int low_transpose(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t d0 = 0, d1 = 0;
	if (n->param == 1) { /* t */
		if (x->rank > 2)
			return lerr(n, KILN_EINVGRAPH,
				    "t() needs a tensor of rank <= 2");
		if (x->rank < 2)
			return lset(n, 0, x);
		d1 = 1;
	} else {
		int64_t a, b;
		rc = lint(n, 1, "dim0", 0, &a);
		if (rc == 0)
			rc = lint(n, 2, "dim1", 0, &b);
		if (rc == 0)
			rc = ldim(n, a, x->rank, &d0);
		if (rc == 0)
			rc = ldim(n, b, x->rank, &d1);
		if (rc != 0)
			return rc;
		if (x->rank == 0)
			return lset(n, 0, x);
	}
	uint32_t perm[CIR_MAX_RANK];
	for (uint32_t i = 0; i < x->rank; i++)
		perm[i] = i;
	perm[d0] = d1;
	perm[d1] = d0;
	return lset(n, 0, lt_permute(c, x, perm));
}

int low_expand(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lout_sizes(n, 0, &rank, sizes, NULL);
	if (rc != 0)
		return rc;
	if (rank < x->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "expand to fewer dims than the input has");
	uint32_t lead = rank - x->rank;
	for (uint32_t k = 0; k < x->rank; k++)
		if (!dim_is(x->sizes[k], 1) &&
		    !dim_eq(x->sizes[k], sizes[lead + k]))
			return lerr(n, KILN_EINVGRAPH,
				    "cannot expand dim %u (size is not 1)", k);
	return lset(n, 0, lt_expand(c, x, rank, sizes));
}

int low_squeeze(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t mask = 0;
	if (n->param == 2) {
		for (uint32_t k = 0; k < x->rank; k++)
			if (dim_is(x->sizes[k], 1))
				mask |= 1u << k;
	} else {
		int64_t dims[CIR_MAX_RANK];
		uint32_t nd;
		rc = lintlist(n, 1, "dim", dims, &nd, CIR_MAX_RANK);
		if (rc != 0)
			return rc;
		for (uint32_t i = 0; i < nd; i++) {
			uint32_t d;
			rc = ldim(n, dims[i], x->rank, &d);
			if (rc != 0)
				return rc;
			if (x->rank > 0 && dim_is(x->sizes[d], 1))
				mask |= 1u << d;
		}
	}
	lt_t *t = x;
	for (uint32_t k = x->rank; k-- > 0;)
		if (mask >> k & 1)
			t = t ? lt_squeeze_dim(c, t, k) : NULL;
	return lset(n, 0, t);
}

int low_unsqueeze(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t d;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank + 1, &ud);
	if (rc != 0)
		return rc;
	return lset(n, 0, lt_unsqueeze(c, x, ud));
}

/* An invalid graph where elements start, start + step, ... (len of them)
 * provably leave dim ud of size `size` (for every size the graph's
 * symbols allow): the lengths come from the declared outputs, and a graph
 * that declares more than the dim holds would have a kernel read past the
 * buffer. Symbolic starts known only when it runs stay unchecked. */
static int lwithin(lnode_t *n, kiln_dim_t size, const kiln_expr_t *start,
		   const kiln_expr_t *len, int64_t step, uint32_t ud)
{
	cctx_t *c = n->c;
	int64_t v;
	const kiln_expr_t *room = slice_room(c, size, start, len, step);
	bool before = ix_below(c, start, 0);
	bool some = ix_lower_bound(c, len, &v) && v >= 1;
	bool past = some && ix_below(c, room, 1);
	if (!before && !past)
		return 0;
	kiln_dim_t st = dim_of(start), ln = dim_of(len);
	if (st.e == NULL && ln.e == NULL && size.e == NULL)
		return lerr(n, KILN_EINVGRAPH,
			    "the declared %lld elements from %lld (step "
			    "%lld) reach past dim %u's end (%lld)",
			    (long long)ln.c, (long long)st.c, (long long)step,
			    ud, (long long)size.c);
	return lerr(n, KILN_EINVGRAPH,
		    "the declared elements reach past dim %u's end for every "
		    "size the symbols allow",
		    ud);
}

int low_slice(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t d, step;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc == 0)
		rc = lint(n, 4, "step", 1, &step);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	if (step <= 0)
		return lerr(n, KILN_EINVGRAPH, "slice step must be positive");
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lout_sizes(n, 0, &rank, sizes, NULL);
	if (rc != 0)
		return rc;
	const kiln_arg_t *sa = larg(n, 2, "start");
	const kiln_expr_t *start = ix_const(c, 0);
	kiln_dim_t size = x->sizes[ud];
	if (sa != NULL && sa->kind == KILN_ARG_INT) {
		int64_t s = sa->u.i;
		if (n->param == 1 && size.e == NULL &&
		    (s < -size.c || s > size.c))
			return lerr(n, KILN_EINVGRAPH,
				    "narrow's start %lld is outside dim %u of "
				    "size %lld",
				    (long long)s, ud, (long long)size.c);
		if (size.e == NULL) {
			if (s < 0)
				s += size.c;
			if (s < 0)
				s = 0;
			if (s > size.c)
				s = size.c;
		}
		start = ix_const(c, s);
	} else if (sa != NULL && sa->kind == KILN_ARG_SYM) {
		start = ix_intern(c, sa->u.sym);
	}
	/* the declared output gives the length (torch clamped the end) */
	if (rank != x->rank)
		return lerr(n, KILN_EINVGRAPH, "slice changes the rank");
	const kiln_expr_t *len = ix_dim(c, sizes[ud]);
	rc = lwithin(n, size, start, len, step, ud);
	if (rc != 0)
		return rc;
	return lset(n, 0,
		    lt_in_range(c, lt_slice(c, x, ud, start, len, step), ud,
				size, start, len, step));
}

int low_select(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t d;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	const kiln_expr_t *idx;
	const kiln_arg_t *ia = larg(n, 2, "index");
	if (ia != NULL && ia->kind == KILN_ARG_INT) {
		int64_t i = ia->u.i;
		if (x->sizes[ud].e == NULL) {
			if (i < -x->sizes[ud].c || i >= x->sizes[ud].c)
				return lerr(n, KILN_EINVGRAPH,
					    "index %lld out of range for size "
					    "%lld",
					    (long long)i,
					    (long long)x->sizes[ud].c);
			if (i < 0)
				i += x->sizes[ud].c;
		} else if (i < 0) {
			idx =
			    ix_add(c, ix_dim(c, x->sizes[ud]), ix_const(c, i));
			goto have;
		}
		idx = ix_const(c, i);
	} else {
		rc = lsymint(n, ia, &idx);
		if (rc != 0)
			return rc;
	}
have:;
	lt_t *s = lt_slice(c, x, ud, idx, ix_const(c, 1), 1);
	s = s ? lt_squeeze_dim(c, s, ud) : NULL;
	/* a symbolic index: read only where it is in range (no dim of the
	 * result is ud's) */
	return lset(n, 0,
		    lt_in_range(c, s, CIR_MAX_RANK, x->sizes[ud], idx,
				ix_const(c, 1), 1));
}

/* split (0), split_with_sizes (1), unbind (2): outputs are slices. */
int low_split(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t d;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, n->param == 2 ? 1 : 2, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	/* split_with_sizes: each part's declared length is its split size */
	const kiln_arg_t *ss = n->param == 1 ? larg(n, 1, "split_sizes") : NULL;
	if (n->param == 1 && (ss == NULL || ss->kind != KILN_ARG_LIST))
		return lerr(n, KILN_EINVGRAPH,
			    "split_sizes must be a list of sizes");
	if (ss != NULL && ss->n != n->n->n_out)
		return lerr(n, KILN_EINVGRAPH,
			    "%u split sizes but %u declared outputs", ss->n,
			    n->n->n_out);
	const kiln_expr_t *off = ix_const(c, 0);
	for (uint32_t k = 0; k < n->n->n_out; k++) {
		uint32_t rank;
		kiln_dim_t sizes[CIR_MAX_RANK];
		rc = lout_sizes(n, k, &rank, sizes, NULL);
		if (rc != 0)
			return rc;
		if (ss != NULL && rank == x->rank) {
			const kiln_expr_t *want;
			rc = lsymint(n, &ss->u.list[k], &want);
			if (rc != 0)
				return rc;
			if (!dim_eq(dim_of(want), sizes[ud]))
				return lerr(n, KILN_EINVGRAPH,
					    "out %u is not of its split size",
					    k);
		}
		if (n->param == 2) {
			rc = lwithin(n, x->sizes[ud], off, ix_const(c, 1), 1,
				     ud);
			if (rc != 0)
				return rc;
			lt_t *s = lt_slice(c, x, ud, off, ix_const(c, 1), 1);
			rc = lset(n, k, s ? lt_squeeze_dim(c, s, ud) : NULL);
			off = ix_add(c, off, ix_const(c, 1));
		} else {
			if (rank != x->rank)
				return lerr(n, KILN_EINVGRAPH,
					    "out %u: split keeps the rank", k);
			const kiln_expr_t *len = ix_dim(c, sizes[ud]);
			rc = lwithin(n, x->sizes[ud], off, len, 1, ud);
			if (rc != 0)
				return rc;
			rc = lset(n, k, lt_slice(c, x, ud, off, len, 1));
			off = ix_add(c, off, len);
		}
		if (rc != 0)
			return rc;
	}
	/* torch makes every part: together they hold all of the dim */
	const kiln_expr_t *gap = ix_sub(c, ix_dim(c, x->sizes[ud]), off);
	if (ix_below(c, ix_sub(c, ix_const(c, 0), gap), 0))
		return lerr(n, KILN_EINVGRAPH,
			    "the declared outputs leave part of dim %u out",
			    ud);
	return 0;
}

/* The sum of the parts' sizes at dim ud. */
static const kiln_expr_t *lt_cat_len(cctx_t *c, lt_t *const *parts, uint32_t np,
				     uint32_t ud)
{
	const kiln_expr_t *len = ix_const(c, 0);
	for (uint32_t i = 0; i < np; i++)
		len = ix_add(c, len, ix_dim(c, parts[i]->sizes[ud]));
	return len;
}

lt_t *lt_cat(cctx_t *c, lt_t *const *parts, uint32_t np, uint32_t ud,
	     kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sizes)
{
	if (np == 0 || np > 64)
		return NULL;
	const kiln_expr_t *offs[65];
	offs[0] = ix_const(c, 0);
	for (uint32_t i = 0; i < np; i++)
		offs[i + 1] =
		    ix_add(c, offs[i], ix_dim(c, parts[i]->sizes[ud]));
	if (!dim_eq(dim_of(offs[np]), sizes[ud]))
		return NULL; /* low_cat has said why */
	const kiln_expr_t *v = ix_var(c, ud);
	const sx_t *body = NULL;
	for (uint32_t i = np; i-- > 0;) {
		const kiln_expr_t *map[CIR_MAX_RANK];
		for (uint32_t k = 0; k < rank; k++)
			map[k] = ix_var(c, k);
		map[ud] = ix_sub(c, v, offs[i]);
		const sx_t *pv =
		    sx_cast(c, lt_at(c, parts[i], map), compute_dtype(dt));
		if (body == NULL) {
			body = i == 0
				   ? pv
				   : sx_guard(c, pv,
					      sx_bin(c, OP_GE, sx_index(c, v),
						     sx_index(c, offs[i])));
			continue;
		}
		const sx_t *lt_end =
		    sx_bin(c, OP_LT, sx_index(c, v), sx_index(c, offs[i + 1]));
		const sx_t *g = i == 0 ? lt_end
				       : sx_bin(c, OP_AND, lt_end,
						sx_bin(c, OP_GE, sx_index(c, v),
						       sx_index(c, offs[i])));
		body = sx_where(c, lt_end, sx_guard(c, pv, g), body);
	}
	return lt_fn(c, dt, rank, sizes, body);
}

/* cat (0) and stack (1). */
int low_cat(cctx_t *c, lnode_t *n)
{
	const kiln_arg_t *ta = larg(n, 0, "tensors");
	int64_t d;
	int rc = lint(n, 1, "dim", 0, &d);
	if (rc != 0)
		return rc;
	if (ta == NULL || ta->kind != KILN_ARG_LIST || ta->n == 0)
		return lerr(n, KILN_EINVGRAPH,
			    "tensors must be a non-empty list");
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dtype_t dt;
	rc = lout_sizes(n, 0, &rank, sizes, &dt);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, rank, &ud);
	if (rc != 0)
		return rc;
	lt_t *parts[64];
	uint32_t np = 0;
	for (uint32_t i = 0; i < ta->n; i++) {
		const kiln_arg_t *a = &ta->u.list[i];
		if (a->kind != KILN_ARG_REF || c->vals[a->u.ref] == NULL)
			return lerr(n, KILN_EINVGRAPH,
				    "tensors[%u] is not a tensor", i);
		lt_t *t = c->vals[a->u.ref];
		if (n->param == 1)
			t = lt_unsqueeze(c, t, ud);
		else if (t->rank == 1 && dim_is(t->sizes[0], 0) && rank != 1)
			continue; /* legacy empty tensor */
		if (t == NULL)
			return -ENOMEM;
		if (t->rank != rank)
			return lerr(n, KILN_EINVGRAPH,
				    "tensors[%u] has rank %u, not %u", i,
				    t->rank, rank);
		for (uint32_t k = 0; k < rank; k++)
			if (k != ud && !dim_eq(t->sizes[k], sizes[k]))
				return lerr(n, KILN_EINVGRAPH,
					    "tensors[%u]: size mismatch at dim "
					    "%u",
					    i, k);
		if (np == 64)
			return lerr(n, KILN_EUNSUPOP,
				    "cat of more than 64 tensors");
		parts[np++] = t;
	}
	if (np == 1)
		return lset(n, 0, parts[0]);
	if (!dim_eq(dim_of(lt_cat_len(c, parts, np, ud)), sizes[ud]))
		return lerr(n, KILN_EINVGRAPH,
			    "the parts' sizes do not add up to out 0's size "
			    "at dim %u",
			    ud);
	return lset(n, 0, lt_cat(c, parts, np, ud, dt, rank, sizes));
}

int low_pad(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t pad[2 * CIR_MAX_RANK];
	uint32_t np;
	double value;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lintlist(n, 1, "pad", pad, &np, 2 * CIR_MAX_RANK);
	if (rc == 0)
		rc = lfloat(n, 2, "value", 0.0, &value);
	if (rc != 0)
		return rc;
	if (np % 2 != 0 || np / 2 > x->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "pad must have an even length of at most 2*rank");
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lout_sizes(n, 0, &rank, sizes, NULL);
	if (rc != 0)
		return rc;
	if (rank != x->rank)
		return lerr(n, KILN_EINVGRAPH, "pad changes the rank");
	const kiln_expr_t *map[CIR_MAX_RANK];
	const sx_t *guard = NULL;
	for (uint32_t k = 0; k < rank; k++) {
		map[k] = ix_var(c, k);
		if (k < rank - np / 2 && !dim_eq(x->sizes[k], sizes[k]))
			return lerr(n, KILN_EINVGRAPH,
				    "out 0: dim %u is not padded but its size "
				    "changes",
				    k);
	}
	for (uint32_t i = 0; i < np / 2; i++) {
		uint32_t d = rank - 1 - i;
		int64_t before = pad[2 * i], after = pad[2 * i + 1];
		kiln_dim_t want =
		    dim_add(c, x->sizes[d], dim_const(before + after));
		if (!dim_eq(want, sizes[d]))
			return lerr(n, KILN_EINVGRAPH,
				    "out 0: padded size mismatch at dim %u", d);
		map[d] = ix_sub(c, ix_var(c, d), ix_const(c, before));
		if (before > 0 || after > 0) {
			const sx_t *g = in_range(c, map[d], x->sizes[d]);
			guard = guard ? sx_bin(c, OP_AND, guard, g) : g;
		}
	}
	const sx_t *v = lt_at(c, x, map);
	if (guard != NULL)
		v = sx_where(c, guard, sx_guard(c, v, guard),
			     sxf(c, value, x->dtype));
	return lset(n, 0, lt_fn(c, x->dtype, rank, sizes, v));
}

int low_flip(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t dims[CIR_MAX_RANK];
	uint32_t nd;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lintlist(n, 1, "dims", dims, &nd, CIR_MAX_RANK);
	if (rc != 0)
		return rc;
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < x->rank; k++)
		map[k] = ix_var(c, k);
	for (uint32_t i = 0; i < nd; i++) {
		uint32_t d;
		rc = ldim(n, dims[i], x->rank, &d);
		if (rc != 0)
			return rc;
		map[d] =
		    ix_sub(c, ix_sub(c, ix_dim(c, x->sizes[d]), ix_const(c, 1)),
			   ix_var(c, d));
	}
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, x->sizes, lt_at(c, x, map)));
}

/* roll(self, shifts, dims=[]): out[i] = self[i_d + size_d - s_d mod size_d
 * (mod size_d)] per rolled dim d, s_d the sum of its shifts brought into
 * [0, size_d) (static sizes); without dims the row-major order rolls: self
 * viewed as one dim, rolled, viewed back. Index arithmetic, no copy
 * (Swin's shifted windows roll H and W). */
int low_roll(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t sh[CIR_MAX_RANK], dm[CIR_MAX_RANK], by[CIR_MAX_RANK] = {0};
	uint32_t ns, nd = 0;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lintlist(n, 1, "shifts", sh, &ns, CIR_MAX_RANK);
	if (rc == 0 && larg(n, 2, "dims") != NULL)
		rc = lintlist(n, 2, "dims", dm, &nd, CIR_MAX_RANK);
	if (rc != 0)
		return rc;
	if (ns < 1)
		return lerr(n, KILN_EINVGRAPH,
			    "shifts must name at least one shift");
	if (nd == 0 && ns != 1)
		return lerr(n, KILN_EINVGRAPH,
			    "without dims, shifts must be one shift");
	if (nd > 0 && nd != ns)
		return lerr(n, KILN_EINVGRAPH,
			    "shifts and dims must have the same length (%u "
			    "and %u)",
			    ns, nd);
	if (nd == 0) {
		kiln_dim_t all = dim_const(1);
		for (uint32_t k = 0; k < x->rank; k++)
			all = dim_mul(c, all, x->sizes[k]);
		if (all.e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "roll of a symbolic size");
		lt_t *flat = lt_reshape(c, x, 1, &all);
		if (flat == NULL)
			return -ENOMEM;
		int64_t m = all.c, s = m > 0 ? ((sh[0] % m) + m) % m : 0;
		const kiln_expr_t *at[1] = {
		    m > 0
			? ix_mod(c, ix_add(c, ix_var(c, 0), ix_const(c, m - s)),
				 ix_const(c, m))
			: ix_var(c, 0)};
		lt_t *r = lt_fn(c, x->dtype, 1, &all, lt_at(c, flat, at));
		lt_t *back = r ? lt_reshape(c, r, x->rank, x->sizes) : NULL;
		return back ? lset(n, 0, back) : -ENOMEM;
	}
	for (uint32_t i = 0; i < nd; i++) {
		uint32_t d;
		rc = ldim(n, dm[i], x->rank, &d);
		if (rc != 0)
			return rc;
		if (x->sizes[d].e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "roll along a symbolic size");
		by[d] += sh[i];
	}
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < x->rank; k++) {
		map[k] = ix_var(c, k);
		int64_t m = x->sizes[k].e == NULL ? x->sizes[k].c : 0;
		if (m <= 0)
			continue;
		int64_t s = ((by[k] % m) + m) % m;
		if (s != 0)
			map[k] =
			    ix_mod(c, ix_add(c, map[k], ix_const(c, m - s)),
				   ix_const(c, m));
	}
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, x->sizes, lt_at(c, x, map)));
}

int low_repeat(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lout_sizes(n, 0, &rank, sizes, NULL);
	if (rc != 0)
		return rc;
	if (rank < x->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "repeat needs at least as many repeats as dims");
	uint32_t lead = rank - x->rank;
	const kiln_expr_t *rep[CIR_MAX_RANK];
	uint32_t nr;
	rc = lsizelist(n, 1, "repeats", rep, &nr);
	if (rc != 0)
		return rc;
	bool same = nr == rank;
	for (uint32_t k = 0; same && k < rank; k++)
		same = dim_eq(
		    sizes[k],
		    k < lead ? dim_of(rep[k])
			     : dim_of(ix_mul(c, rep[k],
					     ix_dim(c, x->sizes[k - lead]))));
	if (!same)
		return lerr(n, KILN_EINVGRAPH,
			    "the declared output is not self's sizes times "
			    "repeats");
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < x->rank; k++)
		map[k] = ix_mod(c, ix_var(c, lead + k), ix_dim(c, x->sizes[k]));
	return lset(n, 0, lt_fn(c, x->dtype, rank, sizes, lt_at(c, x, map)));
}

/* select_backward / slice_backward (param 0: grad_output into zeros of
 * input_sizes) and select_scatter / slice_scatter (1: src into self):
 * g (the placed tensor), the result's rank, sizes and dtype, the base's
 * body (zeros, or self's). dim and what follows are at 2.. in both. */
static int placed(lnode_t *n, lt_t **g, uint32_t *rank, kiln_dim_t *sizes,
		  kiln_dtype_t *dt, const sx_t **base)
{
	cctx_t *c = n->c;
	if (n->param == 0) {
		const kiln_expr_t *in[CIR_MAX_RANK];
		uint32_t nin;
		int rc = ltensor(n, 0, "grad_output", g);
		if (rc == 0)
			rc = lout_sizes(n, 0, rank, sizes, dt);
		if (rc == 0)
			rc = lsizelist(n, 1, "input_sizes", in, &nin);
		if (rc != 0)
			return rc;
		bool same = nin == *rank;
		for (uint32_t k = 0; same && k < nin; k++)
			same = dim_eq(dim_of(in[k]), sizes[k]);
		if (!same)
			return lerr(
			    n, KILN_EINVGRAPH,
			    "the declared output is not of input_sizes");
		*base = sxf(c, 0, *dt);
		return 0;
	}
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = ltensor(n, 1, "src", g);
	if (rc != 0)
		return rc;
	*rank = x->rank;
	memcpy(sizes, x->sizes, x->rank * sizeof(*sizes));
	*dt = x->dtype;
	*base = lt_body(c, x);
	return 0;
}

/* src or grad_output (the placed tensor g) must have the result's sizes
 * but at dim ud (where a select has no dim) */
static int placed_shape(lnode_t *n, const lt_t *g, uint32_t rank,
			const kiln_dim_t *sizes, uint32_t ud, bool select)
{
	bool ok = g->rank == (select ? rank - 1 : rank);
	for (uint32_t k = 0, j = 0; ok && k < rank; k++) {
		if (k == ud && select)
			continue;
		ok = k == ud || dim_eq(g->sizes[j], sizes[k]);
		j++;
	}
	if (ok)
		return 0;
	return n->param == 0
		   ? lerr(n, KILN_EINVGRAPH,
			  "grad_output must have input_sizes but at dim %u", ud)
		   : lerr(n, KILN_EINVGRAPH,
			  "src must have self's shape but at dim %u", ud);
}

int low_select_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g;
	int64_t d;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dtype_t dt;
	const sx_t *base;
	int rc = placed(n, &g, &rank, sizes, &dt, &base);
	if (rc == 0)
		rc = lint(n, 2, "dim", 0, &d);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, rank, &ud);
	if (rc == 0)
		rc = placed_shape(n, g, rank, sizes, ud, true);
	if (rc != 0)
		return rc;
	const kiln_expr_t *idx;
	rc = lsymint(n, larg(n, 3, "index"), &idx);
	if (rc != 0)
		return rc;
	if (idx->kind == KILN_EX_CONST && idx->c < 0)
		idx = ix_add(c, ix_dim(c, sizes[ud]), idx);
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0, j = 0; k < rank; k++)
		if (k != ud)
			map[j++] = ix_var(c, k);
	const sx_t *hit =
	    sx_bin(c, OP_EQ, sx_index(c, ix_var(c, ud)), sx_index(c, idx));
	const sx_t *v = sx_guard(c, lt_at(c, g, map), hit);
	return lset(n, 0,
		    lt_fn(c, dt, rank, sizes,
			  sx_where(c, hit, sx_cast(c, v, dt), base)));
}

int low_slice_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g;
	int64_t d, step;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dtype_t dt;
	const sx_t *base;
	int rc = placed(n, &g, &rank, sizes, &dt, &base);
	if (rc == 0)
		rc = lint(n, 2, "dim", 0, &d);
	if (rc == 0)
		rc = lint(n, 5, "step", 1, &step);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, rank, &ud);
	if (rc == 0)
		rc = placed_shape(n, g, rank, sizes, ud, false);
	if (rc != 0)
		return rc;
	if (step <= 0)
		return lerr(n, KILN_EINVGRAPH, "step must be positive");
	const kiln_expr_t *start = ix_const(c, 0);
	const kiln_arg_t *sa = larg(n, 3, "start");
	if (sa != NULL && sa->kind != KILN_ARG_NIL) /* slice_scatter: None */
		rc = lsymint(n, sa, &start);
	if (rc != 0)
		return rc;
	if (start->kind == KILN_EX_CONST && start->c < 0)
		start = ix_add(c, ix_dim(c, sizes[ud]), start);
	if (start->kind == KILN_EX_CONST && start->c < 0)
		start = ix_const(c, 0);
	const kiln_expr_t *rel = ix_sub(c, ix_var(c, ud), start);
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < rank; k++)
		map[k] = ix_var(c, k);
	map[ud] = ix_floordiv(c, rel, ix_const(c, step));
	const sx_t *hit = in_range(c, map[ud], g->sizes[ud]);
	hit = sx_bin(
	    c, OP_AND, hit,
	    sx_bin(c, OP_GE, sx_index(c, rel), sx_consti(c, 0, KILN_DT_I64)));
	if (step > 1)
		hit = sx_bin(
		    c, OP_AND, hit,
		    sx_bin(c, OP_EQ,
			   sx_index(c, ix_mod(c, rel, ix_const(c, step))),
			   sx_consti(c, 0, KILN_DT_I64)));
	const sx_t *v = sx_guard(c, lt_at(c, g, map), hit);
	return lset(n, 0,
		    lt_fn(c, dt, rank, sizes,
			  sx_where(c, hit, sx_cast(c, v, dt), base)));
}

/* The (self, src) tensors of copy and as_strided_scatter. */
static int self_src(lnode_t *n, lt_t **x, lt_t **src)
{
	int rc = ltensor(n, 0, "self", x);
	return rc != 0 ? rc : ltensor(n, 1, "src", src);
}

/* copy(self, src): src broadcast to self's shape, in self's dtype (what
 * AOTAutograd's functionalization leaves of an in-place copy_) */
int low_copy(cctx_t *c, lnode_t *n)
{
	lt_t *x, *src;
	int rc = self_src(n, &x, &src);
	if (rc != 0)
		return rc;
	if (src->rank > x->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "src does not broadcast to self's shape");
	uint32_t lead = x->rank - src->rank;
	for (uint32_t k = 0; k < src->rank; k++)
		if (!dim_is(src->sizes[k], 1) &&
		    !dim_eq(src->sizes[k], x->sizes[lead + k]))
			return lerr(n, KILN_EINVGRAPH,
				    "src does not broadcast to self's shape");
	lt_t *e = lt_expand(c, src, x->rank, x->sizes);
	if (e == NULL)
		return -ENOMEM;
	if (e->dtype != x->dtype)
		e = lt_fn(c, x->dtype, x->rank, x->sizes,
			  sx_cast(c, lt_body(c, e), x->dtype));
	return e ? lset(n, 0, e) : -ENOMEM;
}

/* Whether value dv (rank r, static sizes sz) is declared with row-major
 * contiguous strides, or with none. */
static bool decl_contiguous(const kiln_value_t *dv, uint32_t r,
			    const int64_t *sz)
{
	if (dv == NULL || !dv->strides_given)
		return true;
	int64_t want = 1;
	for (uint32_t k = r; k-- > 0;) {
		if (dv->strides[k].e != NULL)
			return false;
		if (sz[k] != 1 && dv->strides[k].c != want)
			return false;
		want *= sz[k];
	}
	return true;
}

/* as_strided_scatter(self, src, size, stride, storage_offset=None): self
 * with the elements of a view of its storage replaced by src's. Lowered
 * where the result is contiguous and the view is a block of it
 * (AOTAutograd's backward of a view: new_zeros, as_strided, copy, then
 * this, in ConvNeXt's head): elements [off, off + numel(src)) of the
 * result in row-major order are src's, the rest self's; a view over the
 * whole result is src reshaped. Other views are a fallback step. */
int low_as_strided_scatter(cctx_t *c, lnode_t *n)
{
	lt_t *x, *src;
	int rc = self_src(n, &x, &src);
	if (rc != 0)
		return rc;
	int64_t size[CIR_MAX_RANK], st[CIR_MAX_RANK], off;
	uint32_t ns, nt;
	rc = lintlist(n, 2, "size", size, &ns, CIR_MAX_RANK);
	if (rc == 0)
		rc = lintlist(n, 3, "stride", st, &nt, CIR_MAX_RANK);
	if (rc == 0)
		rc = lint(n, 4, "storage_offset", 0, &off);
	if (rc != 0)
		return rc;
	if (ns != nt)
		return lerr(n, KILN_EINVGRAPH,
			    "size and stride lengths differ");
	bool same = src->rank == ns;
	for (uint32_t k = 0; same && k < ns; k++)
		same = dim_is(src->sizes[k], size[k]);
	if (!same)
		return lerr(n, KILN_EINVGRAPH, "src must have the view's size");
	int64_t xs[CIR_MAX_RANK], total = 1, numel = 1, hi = off;
	for (uint32_t k = 0; k < x->rank; k++) {
		if (x->sizes[k].e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "as_strided_scatter of a symbolic shape "
				    "is not lowered");
		xs[k] = x->sizes[k].c;
		total *= xs[k];
	}
	for (uint32_t k = 0; k < ns; k++) {
		if (st[k] < 0 || size[k] < 0)
			return lerr(n, KILN_EINVGRAPH,
				    "negative size or stride");
		numel *= size[k];
		if (size[k] > 0)
			hi += (size[k] - 1) * st[k];
	}
	if (off < 0 || (numel > 0 && hi >= total))
		return lerr(n, KILN_EINVGRAPH,
			    "the view reaches outside self's %lld elements",
			    (long long)total);
	/* a block: each dim of more than one element strides over the
	 * elements of the dims inside it */
	bool block = true;
	int64_t want = 1;
	for (uint32_t k = ns; k-- > 0;) {
		if (size[k] == 1)
			continue;
		block = block && st[k] == want;
		want *= size[k];
	}
	if (!block || !decl_contiguous(lout(n, 0), x->rank, xs))
		return lerr(n, KILN_EUNSUPOP,
			    "as_strided_scatter is lowered for a view that is "
			    "a block of a contiguous result");
	lt_t *sv = src;
	if (sv->dtype != x->dtype)
		sv = lt_fn(c, x->dtype, src->rank, src->sizes,
			   sx_cast(c, lt_body(c, src), x->dtype));
	if (sv == NULL)
		return -ENOMEM;
	if (numel == total)
		return lset(n, 0, lt_reshape(c, sv, x->rank, x->sizes));
	/* p: the result's row-major position; src at the row-major position
	 * p - off of the view's size */
	const kiln_expr_t *p = ix_const(c, 0);
	int64_t cs = 1;
	for (uint32_t k = x->rank; k-- > 0;) {
		p = ix_add(c, p, ix_mul(c, ix_var(c, k), ix_const(c, cs)));
		cs *= xs[k];
	}
	const kiln_expr_t *q = ix_sub(c, p, ix_const(c, off));
	const kiln_expr_t *si[CIR_MAX_RANK];
	int64_t ss = 1;
	for (uint32_t k = ns; k-- > 0;) {
		si[k] = ix_mod(c, ix_floordiv(c, q, ix_const(c, ss)),
			       ix_const(c, size[k] > 0 ? size[k] : 1));
		ss *= size[k];
	}
	const sx_t *pi = sx_index(c, p);
	const sx_t *in = sx_bin(
	    c, OP_AND, sx_bin(c, OP_GE, pi, sx_consti(c, off, KILN_DT_I64)),
	    sx_bin(c, OP_LT, pi, sx_consti(c, off + numel, KILN_DT_I64)));
	const sx_t *body =
	    sx_where(c, in, sx_guard(c, lt_at(c, sv, si), in), lt_body(c, x));
	lt_t *y = lt_fn(c, x->dtype, x->rank, x->sizes, body);
	return y ? lset(n, 0, y) : -ENOMEM;
}

int low_as_strided(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	const kiln_expr_t *sz[CIR_MAX_RANK], *st[CIR_MAX_RANK];
	uint32_t ns, nt;
	rc = lsizelist(n, 1, "size", sz, &ns);
	if (rc == 0)
		rc = lsizelist(n, 2, "stride", st, &nt);
	if (rc != 0)
		return rc;
	if (ns != nt)
		return lerr(n, KILN_EINVGRAPH,
			    "size and stride lengths differ");
	/* _reshape_alias (param 1) keeps the input's offset */
	const kiln_arg_t *oa =
	    n->param == 1 ? NULL : larg(n, 3, "storage_offset");
	const kiln_expr_t *off;
	uint32_t self = larg(n, 0, "self")->u.ref;
	lt_t *base;
	rc = lstorage(n, self, &base);
	if (rc != 0)
		return rc;
	if (oa != NULL && oa->kind != KILN_ARG_NIL) {
		/* counted from self's storage: its view base's buffer */
		rc = lsymint(n, oa, &off);
		if (rc != 0)
			return rc;
		x = base;
	} else {
		/* self's own storage offset (_reshape_alias, or none given):
		 * self as a view of its storage's buffer */
		rc = lstorage_view(n, self, &x);
		if (rc != 0)
			return rc;
		off = ix_sub(c, ix_dim(c, x->offset), ix_dim(c, base->offset));
	}
	/* within the storage, as torch checks: offset + sum (size - 1) *
	 * stride below the base's extent, no negative size, stride or
	 * offset, where that is known for every size */
	const kiln_value_t *bv = &c->g->values[cir_view_base(c->g, self)];
	const kiln_expr_t *ext = ix_const(c, 1), *last = off;
	bool empty = false;
	int64_t v;
	for (uint32_t k = 0; k < bv->rank; k++) {
		const kiln_expr_t *bs = ix_dim(c, bv->sizes[k]);
		empty = empty || dim_is(bv->sizes[k], 0);
		ext = ix_add(c, ext,
			     ix_mul(c, ix_sub(c, bs, ix_const(c, 1)),
				    ix_dim(c, bv->strides[k])));
	}
	bool none = false, neg = ix_below(c, off, 0);
	for (uint32_t k = 0; k < ns; k++) {
		neg = neg || ix_below(c, sz[k], 0) || ix_below(c, st[k], 0);
		none = none || dim_is(dim_of(sz[k]), 0);
		last =
		    ix_add(c, last,
			   ix_mul(c, ix_sub(c, sz[k], ix_const(c, 1)), st[k]));
	}
	if (neg)
		return lerr(n, KILN_EINVGRAPH,
			    "a negative size, stride or storage offset");
	if (!none &&
	    (empty || (ix_lower_bound(c, ix_sub(c, last, ext), &v) && v >= 0)))
		return lerr(n, KILN_EINVGRAPH,
			    "the view reaches past the end of its storage (%s)",
			    empty ? "no elements" : "the base's extent");
	off = ix_add(c, ix_dim(c, base->offset), off);
	lt_t *u = lt_new(c, x->dtype, ns, x->sizes);
	if (u == NULL)
		return -ENOMEM;
	u->is_buf = true;
	u->buf = x->buf;
	u->offset = dim_of(off);
	for (uint32_t i = 0; i < ns; i++) {
		u->sizes[i] = dim_of(sz[i]);
		u->strides[i] = dim_of(st[i]);
	}
	return lset(n, 0, u);
}
