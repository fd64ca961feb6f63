/*
 * ops_index.c — data-dependent indexing, scatters, cumsum and losses.
 *
 * Gathers (embedding, index_select, gather, index.Tensor, nll_loss's pick)
 * read a buffer at a data-dependent position: sx_load's `dyn` operand adds
 * an i64 offset (the loaded index times the stride) to the static part of
 * the index. The source must therefore be a buffer (a lazy source is
 * realized first). Every such load is guarded by 0 <= index < size: an
 * out-of-range index reads nothing and gives 0, where torch would raise.
 * Negative indices wrap (index + size) as the interpreter does, except for
 * embedding and nll_loss, whose negative indices torch always rejects.
 *
 * Small scatters (scatter, scatter_add, index_put, embedding_dense_backward)
 * are reductions over the source positions: the output element at p
 * reduces, over every source position q, a guarded where(index[q] == p,
 * src[q], 0) — a virtual lazy tensor of rank out_rank + (source dims),
 * reduced over the source dims. That is O(outputs × sources) work, fine for
 * small graphs (a 512-row embedding gradient of 32 tokens is 1M
 * multiply-adds), and it fuses with what surrounds it. Past
 * VREDUCE_MAX_WORK a scatter of whole rows of a matrix (an embedding
 * gradient, index_put, index_add and scatter_add of rows; along dim 1, p
 * by p over dim 0) is a scatter-add node (lscatter: its own kernel,
 * O(outputs + sources)), and the other scatters a fallback step (torch's
 * scatter). A plain scatter
 * (not accumulating) keeps torch's sequential "last write wins" exactly: a
 * max reduction finds the last matching source position, then a dyn load
 * reads that one source element.
 *
 * cumsum is a reduction over a guarded extra dim (out[i] = Σ_{j<=i} x[j]),
 * O(n²) per row, so only static scanned sizes up to 1024 are lowered.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define MAX_SCAN 1024 /* cumsum / mask indexing: largest O(n²) size */

/* ---- helpers ------------------------------------------------------------- */

static kiln_dtype_t decl_dt(lnode_t *n, uint32_t k, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, k);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

static bool is_int_dt(kiln_dtype_t dt)
{
	return dt == KILN_DT_I8 || dt == KILN_DT_I16 || dt == KILN_DT_I32 ||
	       dt == KILN_DT_I64 || dt == KILN_DT_U8;
}

/* Index tensors must hold integers. */
static int need_index(lnode_t *n, const lt_t *t, const char *what)
{
	if (!is_int_dt(t->dtype))
		return lerr(n, KILN_EINVGRAPH,
			    "%s must be an integer tensor, not %s", what,
			    kiln_dtype_name(t->dtype));
	return 0;
}

static const sx_t *i64c(cctx_t *c, int64_t v)
{
	return sx_consti(c, v, KILN_DT_I64);
}

/* A dim as an i64 scalar expression. */
static const sx_t *dimv(cctx_t *c, kiln_dim_t d)
{
	return sx_index(c, ix_dim(c, d));
}

static const sx_t *zero(cctx_t *c, kiln_dtype_t dt)
{
	return sx_consti(c, 0, compute_dtype(dt));
}

static const sx_t *and2(cctx_t *c, const sx_t *a, const sx_t *b)
{
	if (a == NULL)
		return b;
	if (b == NULL)
		return a;
	return sx_bin(c, OP_AND, a, b);
}

/* An index value v (any int dtype) as i64: w = v < 0 ? v + size : v when
 * `wrap`, else v; *ok = 0 <= w < size. */
static const sx_t *wrap_idx(cctx_t *c, const sx_t *v, kiln_dim_t size,
			    bool wrap, const sx_t **ok)
{
	const sx_t *s = dimv(c, size);
	v = sx_cast(c, v, KILN_DT_I64);
	if (wrap)
		v = sx_where(c, sx_bin(c, OP_LT, v, i64c(c, 0)),
			     sx_bin(c, OP_ADD, v, s), v);
	*ok = sx_bin(c, OP_AND, sx_bin(c, OP_GE, v, i64c(c, 0)),
		     sx_bin(c, OP_LT, v, s));
	return v;
}

/* t as a buffer view (a lazy t is realized: dyn loads need memory). */
static int as_buf(lnode_t *n, lt_t *t, lt_t **out)
{
	if (t->is_buf) {
		*out = t;
		return 0;
	}
	return lt_realize(n->c, t, (int32_t)n->index, out);
}

/* Buffer view t at static idx[k], or at the data-dependent i64 dyn[k] where
 * dyn[k] != NULL:
 *   buf[offset + Σ_static idx[k]·stride[k] + Σ_dyn dyn[k]·stride[k]],
 * guarded by `guard` (a false guard reads nothing and gives 0). */
static const sx_t *dyn_at(cctx_t *c, const lt_t *t,
			  const kiln_expr_t *const *idx, const sx_t *const *dyn,
			  const sx_t *guard)
{
	const kiln_expr_t *off = ix_dim(c, t->offset);
	const sx_t *d = NULL;
	for (uint32_t k = 0; k < t->rank && off != NULL; k++) {
		if (dim_is(t->strides[k], 0))
			continue;
		if (dyn != NULL && dyn[k] != NULL) {
			const sx_t *term =
			    sx_bin(c, OP_MUL, dyn[k], dimv(c, t->strides[k]));
			d = d ? sx_bin(c, OP_ADD, d, term) : term;
		} else if (!dim_is(t->sizes[k], 1)) {
			off =
			    ix_add(c, off,
				   ix_mul(c, idx[k], ix_dim(c, t->strides[k])));
		}
	}
	return sx_load(c, t->buf, off, guard, d);
}

/* t broadcast (right-aligned) to (rank, sizes), at positions pos[0..rank):
 * t[pos[lead + k] or 0 where t's dim k is broadcast]. */
static const sx_t *bc_at(cctx_t *c, const lt_t *t, uint32_t rank,
			 const kiln_dim_t *sizes, const kiln_expr_t *const *pos)
{
	const kiln_expr_t *idx[CIR_MAX_RANK];
	uint32_t lead = rank - t->rank;
	for (uint32_t k = 0; k < t->rank; k++)
		idx[k] = dim_is(t->sizes[k], 1) && !dim_is(sizes[lead + k], 1)
			     ? ix_const(c, 0)
			     : pos[lead + k];
	return lt_at(c, t, idx);
}

/* The single element of t (every dim of size 1). */
static int scalar_of(lnode_t *n, const lt_t *t, const char *what,
		     const sx_t **out)
{
	const kiln_expr_t *idx[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++) {
		if (!dim_is(t->sizes[k], 1))
			return lerr(n, KILN_EINVGRAPH,
				    "%s must have one element", what);
		idx[k] = ix_const(n->c, 0);
	}
	*out = lt_at(n->c, t, idx);
	return *out ? 0 : -ENOMEM;
}

/* The most elements a virtual reduction may visit (sizes by their hints
 * where they are symbols): past it the op is a fallback step, which the
 * Python runtime runs through torch's own scatter, O(sources). The dense
 * form of a language model's embedding gradient is O(vocabulary × tokens ×
 * width): a LLaMA-style [8192, 512] embedding over 512 tokens took 160 ms
 * a training step here (2^31 elements), torch's index_add a fraction of a
 * millisecond; at 2^22 the dense reduction is about 0.3 ms. */
#define VREDUCE_MAX_WORK (1LL << 22)

/* Whether a dense reduction over the virtual tensor (rank, sizes) would
 * visit more than VREDUCE_MAX_WORK elements (symbols by their hints). */
static bool vwork_over(cctx_t *c, uint32_t rank, const kiln_dim_t *sizes)
{
	int64_t work = 1;
	for (uint32_t k = 0; k < rank && work <= VREDUCE_MAX_WORK; k++) {
		int64_t d = sizes[k].e != NULL ? ix_estimate(c, sizes[k].e)
					       : sizes[k].c;
		work *= d > 0 ? d : 0;
	}
	return work > VREDUCE_MAX_WORK;
}

/* op-reduction over rmask of the virtual tensor (rank, sizes) whose element
 * is body (in acc); rmask == 0: the tensor itself. */
static int vreduce(lnode_t *n, uint32_t rank, const kiln_dim_t *sizes,
		   const sx_t *body, uint32_t rmask, red_op_t op,
		   kiln_dtype_t acc, lt_t **out)
{
	if (rmask != 0) {
		if (vwork_over(n->c, rank, sizes))
			return lerr(n, KILN_EUNSUPOP,
				    "as a dense reduction it would visit more "
				    "than %lld elements (kiln's scatter "
				    "kernels take f32 and f64, with an index "
				    "that spans self in every other dim)",
				    (long long)VREDUCE_MAX_WORK);
	}
	lt_t *t = lt_fn(n->c, acc, rank, sizes, body);
	if (t == NULL)
		return -ENOMEM;
	if (rmask == 0) {
		*out = t;
		return 0;
	}
	return lred(n, t, rmask, false, op, acc, out);
}

/* Whether static sizes show a > b. */
static bool dim_gt(kiln_dim_t a, kiln_dim_t b)
{
	return a.e == NULL && b.e == NULL && a.c > b.c;
}

/* ---- gathers ------------------------------------------------------------- */

/* embedding(weight [V, D], indices [I...]) -> [I..., D]:
 *   out[i..., d] = weight[idx[i...], d]
 * (0 where idx is outside [0, V): torch raises there; negatives included). */
int low_embedding(cctx_t *c, lnode_t *n)
{
	lt_t *w, *ix;
	int rc = ltensor(n, 0, "weight", &w);
	if (rc == 0)
		rc = ltensor(n, 1, "indices", &ix);
	if (rc == 0)
		rc = need_index(n, ix, "indices");
	if (rc != 0)
		return rc;
	if (w->rank != 2)
		return lerr(n, KILN_EINVGRAPH, "weight must be 2-D, not %u-D",
			    w->rank);
	if (ix->rank + 1 > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH, "indices rank too large");
	uint32_t r = ix->rank + 1;
	kiln_dim_t sizes[CIR_MAX_RANK];
	const kiln_expr_t *pos[CIR_MAX_RANK];
	for (uint32_t k = 0; k < ix->rank; k++) {
		sizes[k] = ix->sizes[k];
		pos[k] = ix_var(c, k);
	}
	sizes[ix->rank] = w->sizes[1];
	const sx_t *ok;
	const sx_t *row =
	    wrap_idx(c, lt_at(c, ix, pos), w->sizes[0], false, &ok);
	rc = as_buf(n, w, &w);
	if (rc != 0)
		return rc;
	const kiln_expr_t *widx[2] = {NULL, ix_var(c, ix->rank)};
	const sx_t *dyn[2] = {row, NULL};
	const sx_t *v = dyn_at(c, w, widx, dyn, ok);
	return lset(n, 0,
		    lt_fn(c, w->dtype, r, sizes,
			  sx_where(c, ok, v, zero(c, w->dtype))));
}

/* t as a buffer view of dtype dt with unit stride along its last dim (a
 * copy where it is not one) */
static int unit_rows(lnode_t *n, lt_t *t, kiln_dtype_t dt, lt_t **out)
{
	uint32_t r = t->rank;
	if (t->is_buf && t->dtype == dt &&
	    (dim_is(t->strides[r - 1], 1) || dim_is(t->sizes[r - 1], 1))) {
		*out = t;
		return 0;
	}
	lt_t *u = lt_fn(n->c, dt, r, t->sizes,
			sx_cast(n->c, lt_body(n->c, t), compute_dtype(dt)));
	if (u == NULL)
		return -ENOMEM;
	return lt_realize(n->c, u, (int32_t)n->index, out);
}

/* A scatter-add's spec beyond its index and source (cnode_t.scatter). */
typedef struct scat {
	lt_t *base;		/* [V, D] added to, or NULL: zeros */
	const kiln_expr_t *pad; /* the row that takes nothing, or NULL */
	bool wrap;		/* a negative index counts from V */
	/* a leading dim P that every tensor has (src [P, ix.shape..., D],
	 * base and out [P, V, D]), each p scattered on its own */
	bool pre;
	/* an index per element: ix and src [P, K, D] (pre) */
	bool elem;
	/* with elem: how sources combine (scat_op_t; SCAT_ADD but for
	 * scatter and scatter_reduce) */
	uint8_t op;
} scat_t;

/* The scatter-add node of out [V, D] (dtype dt, f32 or f64) = base +
 * Σ over the positions q of ix of src[q, :] into row ix[q] (an index
 * outside [0, V) after wrapping, and the row pad, take nothing): src
 * [ix.shape..., D] and base become buffers of dtype dt with unit stride
 * along D, ix a buffer view. The kernel (codegen.c gen_scatter_body)
 * splits D among its units, each of which zeroes its columns (or copies
 * base's) and adds every source row's into them, so it is O(V·D + N·D)
 * where the dense reduction is O(V·N·D). */
static int lscatter(lnode_t *n, lt_t *ix, lt_t *src, kiln_dim_t V, scat_t sp,
		    kiln_dtype_t dt, lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t r = src->rank;
	/* a base of zeros (new_zeros before index_put: the gradient of
	 * weight[ids]) is the kernel's own zeroing */
	if (sp.base != NULL && !sp.base->is_buf &&
	    (sp.op == SCAT_ADD || sp.op == SCAT_STORE) &&
	    sp.base->body->kind == SX_CONST &&
	    (kiln_dtype_is_float(sp.base->dtype) ? sp.base->body->k.f == 0
						 : sp.base->body->k.i == 0))
		sp.base = NULL;
	int rc = as_buf(n, ix, &ix);
	if (rc == 0)
		rc = unit_rows(n, src, dt, &src);
	if (rc == 0 && sp.base != NULL)
		rc = unit_rows(n, sp.base, dt, &sp.base);
	if (rc != 0)
		return rc;
	uint32_t orank = sp.pre ? 3 : 2;
	kiln_dim_t sz[3] = {V, src->sizes[r - 1], dim_const(1)};
	if (sp.pre) {
		sz[0] = src->sizes[0];
		sz[1] = V;
		sz[2] = src->sizes[r - 1];
	}
	uint32_t buf = new_buf(c, CB_TEMP, dt, orank, sz);
	int32_t ni = new_cnode(c);
	if (buf == UINT32_MAX || ni < 0)
		return -ENOMEM;
	cnode_t *cn = &c->nodes[ni];
	cn->buf = buf;
	cn->scatter = true;
	cn->ga = ix;
	cn->gb = src;
	cn->scat_pad = sp.pad;
	cn->scat_wrap = sp.wrap;
	cn->scat_base = sp.base;
	cn->scat_elem = sp.elem;
	cn->scat_op = sp.op;
	cn->node = (int32_t)n->index;
	cn->frank = orank;
	for (uint32_t k = 0; k < orank; k++)
		cn->fsizes[k] = sz[k];
	cn->body = sx_consti(c, 0, KILN_DT_I64); /* no element body */
	if (cn->body == NULL)
		return -ENOMEM;
	c->bufs[buf].producer = ni;
	*out = lt_buf(c, buf);
	return *out ? 0 : -ENOMEM;
}

/* t's first d dims, at position 0 of the others, as a buffer view (a copy
 * of t's elements restricted to sizes sz where t is lazy). */
static lt_t *lead_view(cctx_t *c, const lt_t *t, uint32_t d,
		       const kiln_dim_t *sz)
{
	if (!t->is_buf) {
		const kiln_expr_t *idx[CIR_MAX_RANK];
		for (uint32_t k = 0; k < t->rank; k++)
			idx[k] = k < d ? ix_var(c, k) : ix_const(c, 0);
		return lt_fn(c, t->dtype, d, sz, lt_at(c, t, idx));
	}
	lt_t *u = lt_new(c, t->dtype, d, sz);
	if (u == NULL)
		return NULL;
	u->is_buf = true;
	u->buf = t->buf;
	u->offset = t->offset;
	for (uint32_t k = 0; k < d; k++)
		u->strides[k] = t->strides[k];
	return u;
}

/* self + the scatter-add along dim k of self (rank k + 1 or k + 2, k 0 or
 * 1: the dims before k are the kernel's P, the one after its D) of src
 * [self's dims before k, ix.shape..., self's dims after k] at the indices
 * ix: a kernel onto self (lscatter), with a unit dim D where self has no
 * dim after k. */
static int lscatter_dim(lnode_t *n, lt_t *x, uint32_t k, lt_t *ix, lt_t *src,
			bool wrap, lt_t **out)
{
	cctx_t *c = n->c;
	bool unit = x->rank == k + 1;
	lt_t *base = unit ? lt_unsqueeze(c, x, x->rank) : x;
	lt_t *s = unit ? lt_unsqueeze(c, src, src->rank) : src;
	if (base == NULL || s == NULL)
		return -ENOMEM;
	scat_t sp = {base, NULL, wrap, k == 1, false, SCAT_ADD};
	lt_t *o;
	int rc = lscatter(n, ix, s, x->sizes[k], sp, x->dtype, &o);
	if (rc != 0)
		return rc;
	*out = unit ? lt_squeeze_dim(c, o, o->rank - 1) : o;
	return *out ? 0 : -ENOMEM;
}

/* x with src's elements scattered along dim k at an index of its own
 * per element, combined by op (scatter_add; scatter: the last source
 * wins; scatter_reduce), a kernel onto x (scat_elem; !with_self: onto
 * op's identity, x only giving the shape): x as [P, V, D] (P: the dims before
 * k, D: those after), index and src (its elements within index's extent) as [P,
 * K, D]. index has x's sizes in every dim but k. */
static int lscatter_elem(lnode_t *n, lt_t *x, uint32_t k, lt_t *ix, lt_t *src,
			 uint8_t op, bool with_self, lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t r = x->rank;
	kiln_dim_t P = dim_const(1), D = dim_const(1);
	lt_t *s = src;
	for (uint32_t j = 0; j < r && s != NULL; j++) {
		if (j < k)
			P = dim_mul(c, P, x->sizes[j]);
		else if (j > k)
			D = dim_mul(c, D, x->sizes[j]);
		if (!dim_eq(s->sizes[j], ix->sizes[j]))
			s = lt_slice(c, s, j, ix_const(c, 0),
				     ix_dim(c, ix->sizes[j]), 1);
	}
	kiln_dim_t xs[3] = {P, x->sizes[k], D}, is[3] = {P, ix->sizes[k], D};
	lt_t *x3 = lt_reshape(c, x, 3, xs);
	lt_t *i3 = lt_reshape(c, ix, 3, is);
	lt_t *s3 = s ? lt_reshape(c, s, 3, is) : NULL;
	if (x3 == NULL || i3 == NULL || s3 == NULL)
		return -ENOMEM;
	/* without self: the kernel starts from op's identity */
	scat_t sp = {with_self ? x3 : NULL, NULL, true, true, true, op};
	lt_t *o;
	int rc = lscatter(n, i3, s3, x->sizes[k], sp, x->dtype, &o);
	if (rc != 0)
		return rc;
	*out = lt_reshape(c, o, r, x->sizes);
	return *out ? 0 : -ENOMEM;
}

/* Whether a scatter along dim k of x takes the kernel (lscatter_dim): f32
 * or f64, k 0 or 1, at most one dim after it. */
static bool scatter_dim_ok(const lt_t *x, uint32_t k)
{
	return (x->dtype == KILN_DT_F32 || x->dtype == KILN_DT_F64) && k <= 1 &&
	       x->rank >= k + 1 && x->rank <= k + 2;
}

/* embedding_dense_backward(grad [I..., D], indices [I...], V, padding_idx,
 * scale_grad_by_freq) -> [V, D]:
 *   out[v, d] = Σ_i (idx[i] == v && v != padding_idx ? grad[i, d] : 0)
 *   (÷ count[v] = Σ_i (idx[i] == v) with scale_grad_by_freq)
 * a sum over the virtual [V, I..., D], O(V·N·D). */
int low_embedding_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *ix;
	const kiln_expr_t *ve, *pad;
	bool freq;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = ltensor(n, 1, "indices", &ix);
	if (rc == 0)
		rc = lsymint(n, larg(n, 2, "num_weights"), &ve);
	if (rc == 0)
		rc = lsymint(n, larg(n, 3, "padding_idx"), &pad);
	if (rc == 0)
		rc = lbool(n, 4, "scale_grad_by_freq", false, &freq);
	if (rc == 0)
		rc = need_index(n, ix, "indices");
	if (rc != 0)
		return rc;
	uint32_t ir = ix->rank;
	if (g->rank != ir + 1 || ir + 2 > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH,
			    "grad_output must have shape indices.shape + [D]");
	for (uint32_t k = 0; k < ir; k++)
		if (!dim_eq(g->sizes[k], ix->sizes[k]))
			return lerr(n, KILN_EINVGRAPH,
				    "grad_output must have shape indices.shape "
				    "+ [D] (dim %u differs)",
				    k);
	kiln_dtype_t odt = decl_dt(n, 0, g->dtype);
	if (!kiln_dtype_is_float(odt))
		return lerr(n, KILN_EINVGRAPH, "the gradient must be floating");
	kiln_dtype_t acc = compute_dtype(odt);
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *ipos[CIR_MAX_RANK], *gpos[CIR_MAX_RANK];
	vsz[0] = dim_of(ve);
	uint32_t rmask = 0;
	for (uint32_t k = 0; k < ir; k++) {
		vsz[k + 1] = ix->sizes[k];
		ipos[k] = gpos[k] = ix_var(c, k + 1);
		rmask |= 1u << (k + 1);
	}
	vsz[ir + 1] = g->sizes[ir];
	gpos[ir] = ix_var(c, ir + 1);
	if ((odt == KILN_DT_F32 || odt == KILN_DT_F64) &&
	    vwork_over(c, ir + 2, vsz)) {
		/* a language model's: a scatter-add kernel, not the
		 * O(V·N·D) reduction; with scale_grad_by_freq divided by a
		 * second one's counts (a column of ones scattered) */
		lt_t *s, *cnt;
		scat_t sp = {NULL, pad, false, false, false, SCAT_ADD};
		rc = lscatter(n, ix, g, vsz[0], sp, odt, &s);
		if (rc != 0 || !freq)
			return rc != 0 ? rc : lset(n, 0, s);
		kiln_dim_t osz[CIR_MAX_RANK];
		memcpy(osz, ix->sizes, ir * sizeof(kiln_dim_t));
		osz[ir] = dim_const(1);
		lt_t *ones = lt_fn(c, odt, ir + 1, osz, sxf(c, 1, acc));
		if (ones == NULL)
			return -ENOMEM;
		scat_t cp = {NULL, NULL, false, false, false, SCAT_ADD};
		rc = lscatter(n, ix, ones, vsz[0], cp, odt, &cnt);
		if (rc != 0)
			return rc;
		const kiln_expr_t *v0[2] = {ix_var(c, 0), ix_const(c, 0)};
		const sx_t *cv = lt_at(c, cnt, v0);
		kiln_dim_t vd[2] = {vsz[0], vsz[ir + 1]};
		return lset(
		    n, 0,
		    lt_fn(c, odt, 2, vd,
			  sx_where(c, sx_bin(c, OP_GT, cv, zero(c, acc)),
				   sx_bin(c, OP_DIV, lt_body(c, s), cv),
				   zero(c, acc))));
	}
	const sx_t *row = sx_index(c, ix_var(c, 0));
	const sx_t *hit =
	    sx_bin(c, OP_EQ, sx_cast(c, lt_at(c, ix, ipos), KILN_DT_I64), row);
	const sx_t *keep = sx_bin(c, OP_NE, row, sx_index(c, pad));
	const sx_t *body =
	    sx_where(c, sx_bin(c, OP_AND, hit, keep),
		     sx_cast(c, lt_at(c, g, gpos), acc), zero(c, acc));
	lt_t *s;
	rc = vreduce(n, ir + 2, vsz, body, rmask, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	kiln_dim_t osz[2] = {vsz[0], vsz[ir + 1]};
	const sx_t *out = lt_body(c, s);
	if (freq) {
		/* count[v] over the virtual [V, I...] */
		lt_t *cnt;
		body = sx_where(c, hit, sxf(c, 1, acc), zero(c, acc));
		rc = vreduce(n, ir + 1, vsz, body, rmask, RED_SUM, acc, &cnt);
		if (rc != 0)
			return rc;
		const kiln_expr_t *v0[1] = {ix_var(c, 0)};
		const sx_t *cv = lt_at(c, cnt, v0);
		out = sx_where(c, sx_bin(c, OP_GT, cv, zero(c, acc)),
			       sx_bin(c, OP_DIV, out, cv), zero(c, acc));
	}
	return lset(n, 0, lt_fn(c, odt, 2, osz, out));
}

/* self (0), dim (1) and index (2) of an indexing op, the index checked */
static int self_dim_index(lnode_t *n, lt_t **x, int64_t *d, lt_t **ix)
{
	int rc = ltensor(n, 0, "self", x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, d);
	if (rc == 0)
		rc = ltensor(n, 2, "index", ix);
	if (rc == 0)
		rc = need_index(n, *ix, "index");
	return rc;
}

/* index_select(self, dim, index [K] or []):
 *   out[..., i, ...] = self[..., wrap(index[i]), ...] along dim. */
int low_index_select(cctx_t *c, lnode_t *n)
{
	lt_t *x, *ix;
	int64_t d;
	int rc = self_dim_index(n, &x, &d, &ix);
	if (rc != 0)
		return rc;
	if (ix->rank > 1)
		return lerr(n, KILN_EINVGRAPH, "index must be 0-D or 1-D");
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	const kiln_expr_t *ipos[1] = {ix_var(c, ud)};
	const sx_t *ok;
	if (x->rank == 0) {
		/* a 0-d self: index must be 0 (or -1) */
		if (ix->rank == 1 && !dim_is(ix->sizes[0], 1))
			return lerr(n, KILN_EINVGRAPH,
				    "index of a 0-d tensor must have one "
				    "element");
		ipos[0] = ix_const(c, 0);
		wrap_idx(c, lt_at(c, ix, ipos), dim_const(1), true, &ok);
		return lset(
		    n, 0,
		    lt_fn(c, x->dtype, 0, NULL,
			  sx_where(c, ok, lt_body(c, x), zero(c, x->dtype))));
	}
	kiln_dim_t sizes[CIR_MAX_RANK];
	const kiln_expr_t *idx[CIR_MAX_RANK];
	const sx_t *dyn[CIR_MAX_RANK] = {NULL};
	for (uint32_t k = 0; k < x->rank; k++) {
		sizes[k] = x->sizes[k];
		idx[k] = ix_var(c, k);
	}
	sizes[ud] = ix->rank ? ix->sizes[0] : dim_const(1);
	dyn[ud] = wrap_idx(c, lt_at(c, ix, ipos), x->sizes[ud], true, &ok);
	rc = as_buf(n, x, &x);
	if (rc != 0)
		return rc;
	const sx_t *v = dyn_at(c, x, idx, dyn, ok);
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, sizes,
			  sx_where(c, ok, v, zero(c, x->dtype))));
}

/* gather(self, dim, index) -> index's shape:
 *   out[p] = self[p_0, .., wrap(index[p]), .., p_r-1] (at dim). */
int low_gather(cctx_t *c, lnode_t *n)
{
	lt_t *x, *ix;
	int64_t d;
	int rc = self_dim_index(n, &x, &d, &ix);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	uint32_t xr = x->rank ? x->rank : 1, ir = ix->rank ? ix->rank : 1;
	if (xr != ir)
		return lerr(n, KILN_EINVGRAPH,
			    "index must have the input's rank %u, not %u",
			    x->rank, ix->rank);
	const kiln_expr_t *pos[CIR_MAX_RANK], *idx[CIR_MAX_RANK];
	const sx_t *dyn[CIR_MAX_RANK] = {NULL};
	for (uint32_t k = 0; k < ix->rank; k++)
		pos[k] = ix_var(c, k);
	const sx_t *ok, *guard = NULL;
	if (x->rank == 0) {
		wrap_idx(c, lt_at(c, ix, pos), dim_const(1), true, &ok);
		return lset(
		    n, 0,
		    lt_fn(c, x->dtype, ix->rank, ix->sizes,
			  sx_where(c, ok, lt_body(c, x), zero(c, x->dtype))));
	}
	for (uint32_t k = 0; k < x->rank; k++) {
		if (k == ud || ix->rank == 0)
			continue;
		if (dim_gt(ix->sizes[k], x->sizes[k]))
			return lerr(n, KILN_EINVGRAPH,
				    "index size %lld exceeds the input's %lld "
				    "in dim %u",
				    (long long)ix->sizes[k].c,
				    (long long)x->sizes[k].c, k);
		if (!dim_eq(ix->sizes[k], x->sizes[k]))
			guard = and2(c, guard,
				     sx_bin(c, OP_LT, sx_index(c, pos[k]),
					    dimv(c, x->sizes[k])));
	}
	for (uint32_t k = 0; k < x->rank; k++)
		idx[k] = ix->rank ? pos[k] : ix_const(c, 0);
	dyn[ud] = wrap_idx(c, lt_at(c, ix, pos), x->sizes[ud], true, &ok);
	ok = and2(c, guard, ok);
	rc = as_buf(n, x, &x);
	if (rc != 0)
		return rc;
	const sx_t *v = dyn_at(c, x, idx, dyn, ok);
	return lset(n, 0,
		    lt_fn(c, x->dtype, ix->rank, ix->sizes,
			  sx_where(c, ok, v, zero(c, x->dtype))));
}

/* ---- scatters ----------------------------------------------------------- */

/* scatter.src (0), scatter.value (1), scatter_add (2) (self, dim, index,
 * src | value), over the virtual [p..., q] (q: index's dim `dim`):
 *   match(p, q) = p_j < index.size[j] (j != dim) &&
 *                 wrap(index[p | dim := q]) == p_dim
 *   scatter_add: out[p] = self[p] + Σ_q (match ? src[p | dim := q] : 0)
 *   scatter:     last = max_q (match ? q : -1)
 *                out[p] = last >= 0 ? src[p | dim := last] (or value)
 *                                   : self[p]   (last write wins) */
/* A scatter's virtual [p..., q] (q: index's dim ud): its sizes, where
 * index and src are read (p clamped into index's extent, in bounds even
 * inside lazy bodies), inb (p within index's extent, NULL: always),
 * match(p, q), whether index spans self outside ud, whether it is empty;
 * the checks every scatter makes. */
typedef struct svirt {
	uint32_t r, ud;
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *qpos[CIR_MAX_RANK];
	const sx_t *inb, *match;
	bool spans, empty;
} svirt_t;

static int scatter_virt(lnode_t *n, const lt_t *x, uint32_t ud, const lt_t *ix,
			const lt_t *src, svirt_t *v)
{
	cctx_t *c = n->c;
	memset(v, 0, sizeof(*v));
	if (src != NULL && src->dtype != x->dtype)
		return lerr(n, KILN_EINVGRAPH, "src must have self's dtype");
	if (x->rank == 0 || ix->rank == 0 || (src && src->rank == 0))
		return lerr(n, KILN_EUNSUPOP, "0-d scatter is not lowered");
	uint32_t r = x->rank;
	if (ix->rank != r || (src != NULL && src->rank != r) ||
	    r + 1 > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH,
			    "index (and src) must have the input's rank %u", r);
	v->r = r;
	v->ud = ud;
	v->spans = true;
	for (uint32_t j = 0; j < r; j++) {
		if ((j != ud && dim_gt(ix->sizes[j], x->sizes[j])) ||
		    (src != NULL && dim_gt(ix->sizes[j], src->sizes[j])))
			return lerr(n, KILN_EINVGRAPH,
				    "index is larger than self or src in dim "
				    "%u",
				    j);
		if (j != ud && !dim_eq(ix->sizes[j], x->sizes[j])) {
			v->spans = false;
			v->inb =
			    and2(c, v->inb,
				 sx_bin(c, OP_LT, sx_index(c, ix_var(c, j)),
					dimv(c, ix->sizes[j])));
		}
		v->empty = v->empty || dim_is(ix->sizes[j], 0);
	}
	for (uint32_t j = 0; j < r; j++) {
		v->vsz[j] = x->sizes[j];
		v->qpos[j] = ix_var(c, j);
		if (j != ud && !dim_eq(ix->sizes[j], x->sizes[j]))
			v->qpos[j] = ix_min(
			    c, v->qpos[j],
			    ix_sub(c, ix_dim(c, ix->sizes[j]), ix_const(c, 1)));
	}
	v->vsz[r] = ix->sizes[ud];
	v->qpos[ud] = ix_var(c, r);
	const sx_t *iv = lt_at(c, ix, v->qpos);
	if (v->inb != NULL)
		iv = sx_guard(c, iv, v->inb);
	const sx_t *ok;
	iv = wrap_idx(c, iv, x->sizes[ud], true, &ok);
	v->match =
	    and2(c, v->inb, sx_bin(c, OP_EQ, iv, sx_index(c, ix_var(c, ud))));
	return v->match ? 0 : -ENOMEM;
}

/* src at the virtual position (p, q), in acc (guarded by inb) */
static const sx_t *svirt_src(cctx_t *c, const svirt_t *v, const lt_t *src,
			     kiln_dtype_t acc)
{
	const sx_t *sv = sx_cast(c, lt_at(c, src, v->qpos), acc);
	return v->inb != NULL ? sx_guard(c, sv, v->inb) : sv;
}

int low_scatter(cctx_t *c, lnode_t *n)
{
	lt_t *x, *ix, *src = NULL;
	int64_t d;
	operand_t val;
	memset(&val, 0, sizeof(val));
	int rc = self_dim_index(n, &x, &d, &ix);
	if (rc == 0 && n->param == 1)
		rc = loperand(n, 3, "value", &val);
	else if (rc == 0)
		rc = ltensor(n, 3, "src", &src);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	if (n->param == 1 && val.t != NULL)
		return lerr(n, KILN_EINVGRAPH, "value must be a number");
	svirt_t sv;
	rc = scatter_virt(n, x, ud, ix, src, &sv);
	if (rc != 0)
		return rc;
	uint32_t r = sv.r;
	kiln_dtype_t dt = x->dtype, acc = compute_dtype(dt);
	const sx_t *self = lt_body(c, x);
	if (sv.empty)
		return lset(n, 0, lt_fn(c, dt, r, x->sizes, self));
	const kiln_dim_t *vsz = sv.vsz;
	const sx_t *match = sv.match;
	lt_t *red;
	if (n->param == 2 && r == 2 && ud == 0 &&
	    (dt == KILN_DT_F32 || dt == KILN_DT_F64) && ix->is_buf &&
	    dim_is(ix->strides[1], 0) && dim_eq(ix->sizes[1], x->sizes[1]) &&
	    vwork_over(c, r + 1, vsz)) {
		/* rows scattered whole (a graph network's messages summed
		 * per node: index.view(-1, 1).expand_as(src)): a
		 * scatter-add kernel onto self */
		kiln_dim_t esz[2] = {ix->sizes[0], x->sizes[1]};
		lt_t *i1 = lead_view(c, ix, 1, esz);
		lt_t *s2 = lead_view(c, src, 2, esz);
		if (i1 == NULL || s2 == NULL)
			return -ENOMEM;
		scat_t sp = {x, NULL, true, false, false, SCAT_ADD};
		rc = lscatter(n, i1, s2, x->sizes[0], sp, dt, &red);
		return rc != 0 ? rc : lset(n, 0, red);
	}
	if ((dt == KILN_DT_F32 || dt == KILN_DT_F64) && sv.spans &&
	    vwork_over(c, r + 1, vsz)) {
		/* an index per element (the gradient of a gather, a one-hot
		 * scatter of a value): a scatter kernel onto self whose units
		 * each own whole fibers along dim */
		if (n->param == 1) {
			src = lt_fn(
			    c, dt, r, ix->sizes,
			    sx_cast(c, lop_value(n, &val, r, ix->sizes, acc),
				    dt));
			if (src == NULL)
				return -ENOMEM;
		}
		rc = lscatter_elem(n, x, ud, ix, src,
				   n->param != 2 ? SCAT_STORE : SCAT_ADD, true,
				   &red);
		return rc != 0 ? rc : lset(n, 0, red);
	}
	if (n->param == 2) {
		const sx_t *body = sx_where(
		    c, match, svirt_src(c, &sv, src, acc), zero(c, acc));
		rc = vreduce(n, r + 1, vsz, body, 1u << r, RED_SUM, acc, &red);
		if (rc != 0)
			return rc;
		const sx_t *out =
		    sx_bin(c, OP_ADD, sx_cast(c, self, acc), lt_body(c, red));
		return lset(n, 0, lt_fn(c, dt, r, x->sizes, out));
	}
	const sx_t *body =
	    sx_where(c, match, sx_index(c, ix_var(c, r)), i64c(c, -1));
	rc = vreduce(n, r + 1, vsz, body, 1u << r, RED_MAX, KILN_DT_I64, &red);
	if (rc != 0)
		return rc;
	const sx_t *last = lt_body(c, red);
	const sx_t *hit = sx_bin(c, OP_GE, last, i64c(c, 0));
	const sx_t *nv;
	if (n->param == 1) {
		nv = lop_value(n, &val, r, x->sizes, acc);
	} else {
		rc = as_buf(n, src, &src);
		if (rc != 0)
			return rc;
		const kiln_expr_t *idx[CIR_MAX_RANK];
		const sx_t *dyn[CIR_MAX_RANK] = {NULL};
		for (uint32_t j = 0; j < r; j++)
			idx[j] = ix_var(c, j);
		dyn[ud] = last;
		nv = dyn_at(c, src, idx, dyn, hit);
	}
	return lset(n, 0,
		    lt_fn(c, dt, r, x->sizes,
			  sx_where(c, hit, sx_cast(c, nv, acc),
				   sx_cast(c, self, acc))));
}

/* scatter_reduce.two(self, dim, index, src, reduce, include_self=True),
 * floats: over the virtual [p..., q] of low_scatter, R = the reduction
 * (sum, prod, amax, amin; mean: the sum) of the matching sources and
 * C = their count:
 *   include_self:  self ∘ R   (mean: (self + R) / (C + 1))
 *   otherwise:     C > 0 ? R (mean: R / C) : self
 * amax and amin propagate NaN, as torch's. Past 2^22 pairs with an index
 * spanning self outside dim: scatter kernels (R, and C where needed: a
 * second one scattering ones), as scatter_add's. */
int low_scatter_reduce(cctx_t *c, lnode_t *n)
{
	lt_t *x, *ix, *src;
	int64_t d;
	const char *how;
	bool with_self;
	int rc = self_dim_index(n, &x, &d, &ix);
	if (rc == 0)
		rc = ltensor(n, 3, "src", &src);
	if (rc == 0)
		rc = lstr(n, 4, "reduce", NULL, &how);
	if (rc == 0)
		rc = lbool(n, 5, "include_self", true, &with_self);
	if (rc != 0)
		return rc;
	static const struct {
		const char *name;
		red_op_t red;
		uint8_t op;
		double id;
	} ops[] = {{"sum", RED_SUM, SCAT_ADD, 0},
		   {"mean", RED_SUM, SCAT_ADD, 0},
		   {"prod", RED_PROD, SCAT_MUL, 1},
		   {"amax", RED_MAX, SCAT_MAX, -INFINITY},
		   {"amin", RED_MIN, SCAT_MIN, INFINITY}};
	int k = -1;
	for (int i = 0; i < 5 && how != NULL; i++)
		if (strcmp(how, ops[i].name) == 0)
			k = i;
	if (k < 0)
		return lerr(n, KILN_EINVGRAPH,
			    "reduce must be sum, prod, mean, amax or amin, "
			    "not %s",
			    how ? how : "missing");
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	svirt_t sv;
	rc = scatter_virt(n, x, ud, ix, src, &sv);
	if (rc != 0)
		return rc;
	uint32_t r = sv.r;
	kiln_dtype_t dt = x->dtype, acc = compute_dtype(dt);
	if (!kiln_dtype_is_float(dt))
		return lerr(n, KILN_EUNSUPOP,
			    "scatter_reduce of %s is not lowered",
			    kiln_dtype_name(dt));
	const sx_t *self = sx_cast(c, lt_body(c, x), acc);
	if (sv.empty)
		return lset(n, 0, lt_fn(c, dt, r, x->sizes, self));
	bool mean = k == 1, need_count = mean || !with_self;
	const sx_t *R, *C = NULL;
	lt_t *red, *cnt = NULL;
	if ((dt == KILN_DT_F32 || dt == KILN_DT_F64) && sv.spans &&
	    vwork_over(c, r + 1, sv.vsz)) {
		rc = lscatter_elem(n, x, ud, ix, src, ops[k].op,
				   with_self && !mean, &red);
		if (rc == 0 && need_count) {
			lt_t *ones = lt_fn(c, dt, r, ix->sizes, sxf(c, 1, dt));
			rc = ones ? lscatter_elem(n, x, ud, ix, ones, SCAT_ADD,
						  false, &cnt)
				  : -ENOMEM;
		}
		if (rc != 0)
			return rc;
		R = sx_cast(c, lt_body(c, red), acc);
		if (cnt != NULL)
			C = sx_cast(c, lt_body(c, cnt), acc);
		if (with_self && !mean)
			return lset(n, 0, red); /* self ∘ R in the kernel */
	} else {
		const sx_t *body =
		    sx_where(c, sv.match, svirt_src(c, &sv, src, acc),
			     sxf(c, ops[k].id, acc));
		rc = vreduce(n, r + 1, sv.vsz, body, 1u << r, ops[k].red, acc,
			     &red);
		if (rc == 0 && need_count)
			rc = vreduce(n, r + 1, sv.vsz,
				     sx_where(c, sv.match, sxf(c, 1, acc),
					      sxf(c, 0, acc)),
				     1u << r, RED_SUM, acc, &cnt);
		if (rc != 0)
			return rc;
		R = lt_body(c, red);
		if (cnt != NULL)
			C = lt_body(c, cnt);
	}
	const sx_t *out;
	static const sx_op_t comb[5] = {OP_ADD, OP_ADD, OP_MUL, OP_MAX, OP_MIN};
	if (with_self) {
		out = sx_bin(c, comb[k], self, R);
		if (mean)
			out = sx_bin(c, OP_DIV, out,
				     sx_bin(c, OP_ADD, C, sxf(c, 1, acc)));
	} else {
		const sx_t *v = mean ? sx_bin(c, OP_DIV, R, C) : R;
		out = sx_where(c, sx_bin(c, OP_GT, C, sxf(c, 0, acc)), v, self);
	}
	return lset(n, 0, lt_fn(c, dt, r, x->sizes, out));
}

/* index_add(self, dim, index [K] or [], source, alpha=1), over the
 * virtual [p..., k] (k: index's positions):
 *   out[p] = self[p] + alpha · Σ_k (index[k] == p_dim ? source[p | dim := k]
 *                                                     : 0)
 * (an index outside [0, size) adds nothing: torch raises). Past 2^22
 * pairs, whole rows of a matrix (dim 0: a mixture of experts summing its
 * experts' outputs per token) are a scatter-add kernel onto self. */
int low_index_add(cctx_t *c, lnode_t *n)
{
	lt_t *x, *ix, *src;
	int64_t d;
	double alpha;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc == 0)
		rc = ltensor(n, 2, "index", &ix);
	if (rc == 0)
		rc = ltensor(n, 3, "source", &src);
	if (rc == 0)
		rc = lfloat(n, 4, "alpha", 1.0, &alpha);
	if (rc == 0)
		rc = need_index(n, ix, "index");
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float(x->dtype) && alpha != (double)(int64_t)alpha)
		return lerr(n, KILN_EINVGRAPH,
			    "alpha must be an integer for an integer self, "
			    "not %g",
			    alpha);
	if (x->rank == 0)
		return lerr(n, KILN_EUNSUPOP, "index_add of a 0-d self");
	uint32_t ud, r = x->rank;
	rc = ldim(n, d, r, &ud);
	if (rc != 0)
		return rc;
	if (ix->rank > 1)
		return lerr(n, KILN_EINVGRAPH, "index must be 0-D or 1-D");
	if (src->dtype != x->dtype)
		return lerr(n, KILN_EINVGRAPH, "source must have self's dtype");
	if (src->rank != r || r + 1 > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH,
			    "source must have self's rank %u", r);
	kiln_dim_t K = ix->rank ? ix->sizes[0] : dim_const(1);
	for (uint32_t j = 0; j < r; j++)
		if (!dim_eq(src->sizes[j], j == ud ? K : x->sizes[j]))
			return lerr(n, KILN_EINVGRAPH,
				    "source must have self's shape with "
				    "index's length at dim %u (dim %u differs)",
				    ud, j);
	kiln_dtype_t dt = x->dtype, acc = compute_dtype(dt);
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *spos[CIR_MAX_RANK];
	for (uint32_t j = 0; j < r; j++) {
		vsz[j] = x->sizes[j];
		spos[j] = j == ud ? ix_var(c, r) : ix_var(c, j);
	}
	vsz[r] = K;
	lt_t *red;
	if (ix->rank == 1 && scatter_dim_ok(x, ud) &&
	    vwork_over(c, r + 1, vsz)) {
		lt_t *s2 = src;
		if (alpha != 1.0)
			s2 = lt_fn(c, dt, r, src->sizes,
				   sx_bin(c, OP_MUL,
					  sx_cast(c, lt_body(c, src), acc),
					  sxf(c, alpha, acc)));
		if (s2 == NULL)
			return -ENOMEM;
		rc = lscatter_dim(n, x, ud, ix, s2, false, &red);
		return rc != 0 ? rc : lset(n, 0, red);
	}
	const kiln_expr_t *ipos[1] = {ix_var(c, r)};
	const sx_t *iv = sx_cast(c, lt_at(c, ix, ipos), KILN_DT_I64);
	const sx_t *match = sx_bin(c, OP_EQ, iv, sx_index(c, ix_var(c, ud)));
	const sx_t *body = sx_where(
	    c, match, sx_cast(c, lt_at(c, src, spos), acc), zero(c, acc));
	rc = vreduce(n, r + 1, vsz, body, 1u << r, RED_SUM, acc, &red);
	if (rc != 0)
		return rc;
	const sx_t *add = lt_body(c, red);
	if (alpha != 1.0)
		add = sx_bin(c, OP_MUL, add, sxf(c, alpha, acc));
	return lset(
	    n, 0,
	    lt_fn(c, dt, r, x->sizes,
		  sx_bin(c, OP_ADD, sx_cast(c, lt_body(c, x), acc), add)));
}

/* ---- advanced indexing --------------------------------------------------- */

/* The plan of self[indices] (torch's advanced indexing): the index tensors
 * broadcast to one shape B; the result is self's plain dims with B
 * inserted where the indexed dims were when they are adjacent, else in
 * front. */
typedef struct iplan {
	const lt_t *ix[CIR_MAX_RANK]; /* per self dim: index tensor or NULL */
	uint32_t br;		      /* the broadcast shape B */
	kiln_dim_t bs[CIR_MAX_RANK];
	uint32_t first; /* result dim of B's first dim */
	uint32_t rank;	/* result rank and shape */
	kiln_dim_t sizes[CIR_MAX_RANK];
	uint32_t map[CIR_MAX_RANK]; /* result dim -> self dim (plain dims) */
} iplan_t;

/* The list argument `pos`: per entry a tensor or NULL (None). */
static int index_list(lnode_t *n, uint32_t pos, lt_t **ts, uint32_t *count)
{
	const kiln_arg_t *a = larg(n, pos, "indices");
	if (a == NULL || a->kind != KILN_ARG_LIST || a->n > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH,
			    "indices must be a list of optional tensors");
	for (uint32_t i = 0; i < a->n; i++) {
		const kiln_arg_t *e = &a->u.list[i];
		ts[i] = NULL;
		if (e->kind == KILN_ARG_NIL)
			continue;
		if (e->kind != KILN_ARG_REF || n->c->vals[e->u.ref] == NULL)
			return lerr(n, KILN_EINVGRAPH,
				    "indices[%u] must be a tensor or None", i);
		ts[i] = n->c->vals[e->u.ref];
	}
	*count = a->n;
	return 0;
}

/* Builds the plan from per-dim index tensors ix[0 .. x->rank). */
static int iplan_make(lnode_t *n, const lt_t *x, lt_t *const *ix, iplan_t *p)
{
	memset(p, 0, sizeof(*p));
	operand_t ops[CIR_MAX_RANK];
	uint32_t no = 0, firstd = UINT32_MAX, lastd = 0;
	for (uint32_t j = 0; j < x->rank; j++) {
		p->ix[j] = ix[j];
		if (ix[j] == NULL)
			continue;
		int rc = need_index(n, ix[j], "indices");
		if (rc != 0)
			return rc;
		memset(&ops[no], 0, sizeof(ops[no]));
		ops[no++].t = ix[j];
		if (firstd == UINT32_MAX)
			firstd = j;
		lastd = j;
	}
	if (no == 0)
		return lerr(n, KILN_EUNSUPOP, "no index tensor");
	int rc = lbroadcast(n, ops, no, &p->br, p->bs);
	if (rc != 0)
		return rc;
	bool adjacent = true;
	for (uint32_t j = firstd; j <= lastd; j++)
		adjacent = adjacent && ix[j] != NULL;
	if (x->rank - no + p->br > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH, "result rank too large");
	uint32_t r = 0;
	bool placed = false;
	for (uint32_t j = 0; j <= x->rank; j++) {
		if (!placed && (!adjacent || j == firstd)) {
			p->first = r;
			for (uint32_t q = 0; q < p->br; q++) {
				p->map[r] = UINT32_MAX;
				p->sizes[r++] = p->bs[q];
			}
			placed = true;
		}
		if (j == x->rank || ix[j] != NULL)
			continue;
		p->map[r] = j;
		p->sizes[r++] = x->sizes[j];
	}
	p->rank = r;
	return 0;
}

/* Per self dim: the index tensors of the list at `pos` (None and missing
 * entries: NULL). Bool/uint8 masks are reported in *mask_at (else -1). */
static int index_dims(lnode_t *n, const lt_t *x, uint32_t pos, lt_t **per,
		      int32_t *mask_at)
{
	lt_t *ts[CIR_MAX_RANK];
	uint32_t cnt = 0;
	int rc = index_list(n, pos, ts, &cnt);
	if (rc != 0)
		return rc;
	*mask_at = -1;
	for (uint32_t j = 0; j < CIR_MAX_RANK; j++)
		per[j] = NULL;
	uint32_t d = 0;
	for (uint32_t i = 0; i < cnt; i++) {
		lt_t *t = ts[i];
		if (t != NULL &&
		    (t->dtype == KILN_DT_BOOL || t->dtype == KILN_DT_U8)) {
			if (*mask_at >= 0)
				return lerr(n, KILN_EUNSUPOP,
					    "several mask indices");
			*mask_at = (int32_t)d;
			if (d + t->rank > x->rank)
				return lerr(n, KILN_EINVGRAPH,
					    "too many indices for a rank-%u "
					    "tensor",
					    x->rank);
			per[d] = t;
			d += t->rank;
			continue;
		}
		if (d >= x->rank)
			return lerr(n, KILN_EINVGRAPH,
				    "too many indices for a rank-%u tensor",
				    x->rank);
		per[d++] = t;
	}
	return 0;
}

/* A bool mask m over self dims [d, d + m.rank) as m.rank index tensors of
 * shape [K] (K = the declared count of true elements), torch's nonzero:
 *   before[p] = Σ_{p' < p} m[p']               (row-major; virtual [P, P])
 *   pos[e]    = max_p (m[p] && before[p] == e ? p : -1)   (virtual [K, P])
 *   coord_k[e] = (pos[e] / stride_k) % size_k
 * O(P²): the mask must be static with at most MAX_SCAN elements. An index
 * e past the true count (the mask has fewer true elements than declared)
 * gives the out-of-range coordinate size_k: the caller's guard reads
 * nothing there and the element is 0. */
static int mask_coords(lnode_t *n, const lt_t *m, kiln_dim_t K, lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t mr = m->rank;
	int64_t P = 1, st[CIR_MAX_RANK];
	for (uint32_t k = mr; k-- > 0;) {
		if (m->sizes[k].e != NULL)
			return lerr(n, KILN_EUNSUPOP, "symbolic mask shape");
		st[k] = P;
		P *= m->sizes[k].c;
	}
	if (P > MAX_SCAN || 2 * mr > CIR_MAX_RANK)
		return lerr(n, KILN_EUNSUPOP, "mask too large");
	/* virtual [p..., p'...]: p = VAR 0..mr-1, p' = VAR mr..2mr-1 */
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *pp[CIR_MAX_RANK], *pq[CIR_MAX_RANK];
	const kiln_expr_t *lp = ix_const(c, 0), *lq = ix_const(c, 0);
	uint32_t rmask = 0;
	for (uint32_t k = 0; k < mr; k++) {
		vsz[k] = vsz[mr + k] = m->sizes[k];
		pp[k] = ix_var(c, k);
		pq[k] = ix_var(c, mr + k);
		lp = ix_add(c, lp, ix_mul(c, pp[k], ix_const(c, st[k])));
		lq = ix_add(c, lq, ix_mul(c, pq[k], ix_const(c, st[k])));
		rmask |= 1u << (mr + k);
	}
	const sx_t *mq = sx_cast(c, lt_at(c, m, pq), KILN_DT_BOOL);
	const sx_t *body =
	    sx_where(c,
		     sx_bin(c, OP_AND, mq,
			    sx_bin(c, OP_LT, sx_index(c, lq), sx_index(c, lp))),
		     i64c(c, 1), i64c(c, 0));
	lt_t *before, *posr;
	int rc =
	    vreduce(n, 2 * mr, vsz, body, rmask, RED_SUM, KILN_DT_I64, &before);
	if (rc != 0)
		return rc;
	/* virtual [e, p...]: e = VAR 0, p = VAR 1..mr */
	kiln_dim_t esz[CIR_MAX_RANK];
	const kiln_expr_t *ep[CIR_MAX_RANK];
	const kiln_expr_t *le = ix_const(c, 0);
	esz[0] = K;
	rmask = 0;
	for (uint32_t k = 0; k < mr; k++) {
		esz[k + 1] = m->sizes[k];
		ep[k] = ix_var(c, k + 1);
		le = ix_add(c, le, ix_mul(c, ep[k], ix_const(c, st[k])));
		rmask |= 1u << (k + 1);
	}
	const sx_t *hit = sx_bin(
	    c, OP_AND, sx_cast(c, lt_at(c, m, ep), KILN_DT_BOOL),
	    sx_bin(c, OP_EQ, lt_at(c, before, ep), sx_index(c, ix_var(c, 0))));
	body = sx_where(c, hit, sx_index(c, le), i64c(c, -1));
	rc = vreduce(n, mr + 1, esz, body, rmask, RED_MAX, KILN_DT_I64, &posr);
	if (rc != 0)
		return rc;
	const sx_t *pv = lt_body(c, posr);
	const sx_t *found = sx_bin(c, OP_GE, pv, i64c(c, 0));
	for (uint32_t k = 0; k < mr; k++) {
		const sx_t *ck = sx_bin(
		    c, OP_REM, sx_bin(c, OP_FLOORDIV, pv, i64c(c, st[k])),
		    i64c(c, m->sizes[k].c));
		/* absent: an out-of-range coordinate (P), never wrapped */
		ck = sx_where(c, found, ck, i64c(c, m->sizes[k].c));
		out[k] = lt_fn(c, KILN_DT_I64, 1, &K, ck);
		if (out[k] == NULL)
			return -ENOMEM;
	}
	return 0;
}

/* Whether an index value is an index expression of the loop variables
 * (an index tensor computed from arange: nearest upsampling's rows and
 * columns, ops_pointwise.c scaled_index) within [0, size) for every
 * position: then *e is that expression, and the access is no gather of
 * data-dependent offsets but one codegen can follow (a vector load, or a
 * load and a permute). */
static bool static_index(cctx_t *c, const sx_t *v, kiln_dim_t size,
			 const kiln_expr_t **e)
{
	int64_t lo, hi;
	if (v == NULL || v->kind != SX_INDEX || size.e != NULL ||
	    !ix_bounds(c, v->idx, &lo, &hi) || lo < 0 || hi >= size.c)
		return false;
	*e = v->idx;
	return true;
}

/* index.Tensor(self, indices): with B-position b and plain dims p,
 *   out[.., b, ..] = self[p | indexed dim j := wrap(index_j[b])]
 * (0 where an index is out of range: torch raises). One bool mask (the
 * only index) is turned into coordinates first (mask_coords). */
int low_index(cctx_t *c, lnode_t *n)
{
	lt_t *x, *per[CIR_MAX_RANK];
	int32_t mask_at;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = index_dims(n, x, 1, per, &mask_at);
	if (rc != 0)
		return rc;
	if (mask_at >= 0) {
		lt_t *m = per[mask_at];
		uint32_t nt = 0;
		for (uint32_t j = 0; j < x->rank; j++)
			nt += per[j] != NULL;
		if (nt != 1)
			return lerr(n, KILN_EUNSUPOP,
				    "a mask with other index tensors");
		uint32_t orank;
		kiln_dim_t osz[CIR_MAX_RANK];
		rc = lout_sizes(n, 0, &orank, osz, NULL);
		if (rc != 0)
			return rc;
		if (orank != x->rank - m->rank + 1)
			return lerr(n, KILN_EINVGRAPH,
				    "out 0: declared rank %u but the mask "
				    "gives rank %u",
				    orank, x->rank - m->rank + 1);
		for (uint32_t k = 0; k < m->rank; k++)
			if (!dim_eq(m->sizes[k], x->sizes[mask_at + k]))
				return lerr(n, KILN_EINVGRAPH,
					    "mask shape does not match the "
					    "indexed dims");
		lt_t *co[CIR_MAX_RANK];
		rc = mask_coords(n, m, osz[mask_at], co);
		if (rc != 0)
			return rc;
		for (uint32_t k = 0; k < m->rank; k++)
			per[mask_at + k] = co[k];
	}
	iplan_t p;
	rc = iplan_make(n, x, per, &p);
	if (rc != 0)
		return rc;
	const kiln_expr_t *bpos[CIR_MAX_RANK], *idx[CIR_MAX_RANK];
	const sx_t *dyn[CIR_MAX_RANK] = {NULL};
	for (uint32_t q = 0; q < p.br; q++)
		bpos[q] = ix_var(c, p.first + q);
	for (uint32_t r = 0; r < p.rank; r++)
		if (p.map[r] != UINT32_MAX)
			idx[p.map[r]] = ix_var(c, r);
	const sx_t *ok = NULL;
	set_var_ranges(c, p.rank, p.sizes);
	for (uint32_t j = 0; j < x->rank; j++) {
		if (p.ix[j] == NULL)
			continue;
		const sx_t *okj, *raw = bc_at(c, p.ix[j], p.br, p.bs, bpos);
		if (static_index(c, raw, x->sizes[j], &idx[j]))
			continue;
		dyn[j] = wrap_idx(c, raw, x->sizes[j], true, &okj);
		ok = and2(c, ok, okj);
	}
	rc = as_buf(n, x, &x);
	if (rc != 0)
		return rc;
	const sx_t *v = dyn_at(c, x, idx, dyn, ok);
	if (ok != NULL)
		v = sx_where(c, ok, v, zero(c, x->dtype));
	return lset(n, 0, lt_fn(c, x->dtype, p.rank, p.sizes, v));
}

/* The dim index_put's plan p indexes where the scatter-add kernel takes
 * it (scatter_dim_ok: rows of a matrix, or a dim 1 with one dim before,
 * as LeViT's attention biases): one index tensor, of the broadcast shape,
 * and values of the indexed shape with nothing broadcast; -1 where not. */
static int put_dim(const lt_t *x, const iplan_t *p, const lt_t *vals)
{
	int k = -1;
	for (uint32_t j = 0; j < x->rank; j++)
		if (p->ix[j] != NULL) {
			if (k >= 0)
				return -1;
			k = (int)j;
		}
	if (k < 0 || !scatter_dim_ok(x, (uint32_t)k) || vals->rank != p->rank ||
	    p->first != (uint32_t)k || p->ix[k]->rank != p->br)
		return -1;
	for (uint32_t q = 0; q < p->br; q++)
		if (!dim_eq(p->ix[k]->sizes[q], p->bs[q]))
			return -1;
	for (uint32_t q = 0; q < vals->rank; q++)
		if (!dim_eq(vals->sizes[q], p->sizes[q]))
			return -1;
	return k;
}

/* index_put(self, indices, values, accumulate), with R = self[indices]'s
 * shape (B and the plain dims) and values broadcast to R, over the virtual
 * [p..., b...] (p: self's dims, b: B's):
 *   match(p, b)  = AND over indexed dims j of wrap(index_j[b]) == p_j
 *   accumulate:  out[p] = self[p] + Σ_b (match ? values[R(p, b)] : 0)
 *   otherwise:   last = max_b (match ? linear(b) : -1)
 *                out[p] = last >= 0 ? values[R(p, unlinear(last))] : self[p]
 *                (last write wins, as torch's sequential CPU kernel) */
int low_index_put(cctx_t *c, lnode_t *n)
{
	lt_t *x, *vals, *per[CIR_MAX_RANK];
	bool accum;
	int32_t mask_at;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = ltensor(n, 2, "values", &vals);
	if (rc == 0)
		rc = lbool(n, 3, "accumulate", false, &accum);
	if (rc == 0)
		rc = index_dims(n, x, 1, per, &mask_at);
	if (rc != 0)
		return rc;
	if (mask_at >= 0)
		return lerr(n, KILN_EUNSUPOP, "index_put with a mask");
	if (vals->dtype != x->dtype)
		return lerr(n, KILN_EINVGRAPH, "values must have self's dtype");
	iplan_t p;
	rc = iplan_make(n, x, per, &p);
	if (rc != 0)
		return rc;
	uint32_t xr = x->rank;
	if (xr + p.br > CIR_MAX_RANK)
		return lerr(n, KILN_EUNSUPOP, "index_put rank too large");
	if (vals->rank > p.rank)
		return lerr(n, KILN_EINVGRAPH,
			    "values do not broadcast to the indexed shape");
	for (uint32_t k = 0; k < vals->rank; k++) {
		kiln_dim_t a = vals->sizes[k];
		kiln_dim_t b = p.sizes[p.rank - vals->rank + k];
		if (!dim_is(a, 1) && !dim_eq(a, b))
			return lerr(n, KILN_EINVGRAPH,
				    "values do not broadcast to the indexed "
				    "shape (dim %u)",
				    k);
	}
	/* the virtual [p..., b...]; R's position in it */
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *bpos[CIR_MAX_RANK], *rpos[CIR_MAX_RANK];
	uint32_t rmask = 0;
	for (uint32_t j = 0; j < xr; j++)
		vsz[j] = x->sizes[j];
	for (uint32_t q = 0; q < p.br; q++) {
		vsz[xr + q] = p.bs[q];
		bpos[q] = ix_var(c, xr + q);
		rmask |= 1u << (xr + q);
	}
	for (uint32_t r = 0; r < p.rank; r++)
		rpos[r] = p.map[r] == UINT32_MAX ? bpos[r - p.first]
						 : ix_var(c, p.map[r]);
	const sx_t *match = NULL;
	for (uint32_t j = 0; j < xr; j++) {
		if (p.ix[j] == NULL)
			continue;
		const sx_t *okj;
		const sx_t *v = wrap_idx(c, bc_at(c, p.ix[j], p.br, p.bs, bpos),
					 x->sizes[j], true, &okj);
		match = and2(c, match,
			     sx_bin(c, OP_EQ, v, sx_index(c, ix_var(c, j))));
	}
	kiln_dtype_t dt = x->dtype, acc = compute_dtype(dt);
	const sx_t *self = sx_cast(c, lt_body(c, x), acc);
	lt_t *red;
	int pk = accum ? put_dim(x, &p, vals) : -1;
	if (pk >= 0 && vwork_over(c, xr + p.br, vsz)) {
		/* x[index] += values along one dim (the gradient of
		 * weight[ids], of LeViT's biases[:, idxs]): a scatter-add
		 * kernel onto self */
		rc = lscatter_dim(n, x, (uint32_t)pk, (lt_t *)p.ix[pk], vals,
				  true, &red);
		return rc != 0 ? rc : lset(n, 0, red);
	}
	if (accum) {
		const sx_t *vv =
		    sx_cast(c, bc_at(c, vals, p.rank, p.sizes, rpos), acc);
		rc = vreduce(n, xr + p.br, vsz,
			     sx_where(c, match, vv, zero(c, acc)), rmask,
			     RED_SUM, acc, &red);
		if (rc != 0)
			return rc;
		return lset(n, 0,
			    lt_fn(c, dt, xr, x->sizes,
				  sx_bin(c, OP_ADD, self, lt_body(c, red))));
	}
	/* linear(b), row-major over B */
	const kiln_expr_t *lin = ix_const(c, 0);
	kiln_dim_t bst[CIR_MAX_RANK], s = dim_const(1);
	for (uint32_t q = p.br; q-- > 0;) {
		bst[q] = s;
		lin = ix_add(c, lin, ix_mul(c, bpos[q], ix_dim(c, s)));
		s = dim_mul(c, s, p.bs[q]);
	}
	rc = vreduce(n, xr + p.br, vsz,
		     sx_where(c, match, sx_index(c, lin), i64c(c, -1)), rmask,
		     RED_MAX, KILN_DT_I64, &red);
	if (rc != 0)
		return rc;
	const sx_t *last = lt_body(c, red);
	const sx_t *hit = sx_bin(c, OP_GE, last, i64c(c, 0));
	rc = as_buf(n, vals, &vals);
	if (rc != 0)
		return rc;
	/* values[R(p, unlinear(last))]: B dims are data-dependent */
	const kiln_expr_t *idx[CIR_MAX_RANK];
	const sx_t *dyn[CIR_MAX_RANK] = {NULL};
	uint32_t lead = p.rank - vals->rank;
	for (uint32_t k = 0; k < vals->rank; k++) {
		uint32_t r = lead + k;
		idx[k] = ix_const(c, 0);
		if (dim_is(vals->sizes[k], 1))
			continue;
		if (p.map[r] != UINT32_MAX) {
			idx[k] = ix_var(c, p.map[r]);
			continue;
		}
		uint32_t q = r - p.first;
		const sx_t *bq =
		    p.br == 1 ? last
			      : sx_bin(c, OP_FLOORDIV, last, dimv(c, bst[q]));
		if (q > 0)
			bq = sx_bin(c, OP_REM, bq, dimv(c, p.bs[q]));
		dyn[k] = bq;
	}
	const sx_t *nv = sx_cast(c, dyn_at(c, vals, idx, dyn, hit), acc);
	return lset(n, 0,
		    lt_fn(c, dt, xr, x->sizes, sx_where(c, hit, nv, self)));
}

/* ---- cumsum -------------------------------------------------------------- */

/* cumsum(self, dim, dtype?): over the virtual [p..., j] (j: dim's extent S)
 *   out[p] = Σ_j (j <= p_dim ? x[p | dim := j] : 0)
 * O(S²) per row: only a static S <= MAX_SCAN is lowered. */
int low_cumsum(cctx_t *c, lnode_t *n)
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
	kiln_dtype_t odt = decl_dt(
	    n, 0, kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_DT_I64);
	kiln_dtype_t acc = compute_dtype(odt);
	if (x->rank == 0)
		return lset(
		    n, 0,
		    lt_fn(c, odt, 0, NULL, sx_cast(c, lt_body(c, x), acc)));
	kiln_dim_t S = x->sizes[ud];
	if (S.e != NULL || S.c > MAX_SCAN)
		return lerr(n, KILN_EUNSUPOP,
			    "cumsum over a symbolic or long (> %d) dim",
			    MAX_SCAN);
	uint32_t r = x->rank;
	if (r + 1 > CIR_MAX_RANK)
		return lerr(n, KILN_EUNSUPOP, "cumsum rank too large");
	kiln_dim_t vsz[CIR_MAX_RANK];
	const kiln_expr_t *pos[CIR_MAX_RANK];
	for (uint32_t k = 0; k < r; k++) {
		vsz[k] = x->sizes[k];
		pos[k] = ix_var(c, k);
	}
	vsz[r] = S;
	pos[ud] = ix_var(c, r);
	const sx_t *in = sx_bin(c, OP_LE, sx_index(c, ix_var(c, r)),
				sx_index(c, ix_var(c, ud)));
	const sx_t *body =
	    sx_where(c, in, sx_cast(c, lt_at(c, x, pos), acc), zero(c, acc));
	lt_t *s;
	rc = vreduce(n, r + 1, vsz, body, 1u << r, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	return lset(n, 0, lt_fn(c, odt, r, x->sizes, lt_body(c, s)));
}

/* ---- losses -------------------------------------------------------------- */

/* nll_loss's shared checks: self [N, C] or [C] floating, target [N] or []
 * integer, weight [C] or None, reduction 0..2. */
static int nll_args(lnode_t *n, uint32_t base, lt_t **x, lt_t **t, lt_t **w,
		    int64_t *red, const sx_t **ign)
{
	const kiln_expr_t *ie;
	int rc = ltensor(n, base, "self", x);
	if (rc == 0)
		rc = ltensor(n, base + 1, "target", t);
	if (rc == 0)
		rc = ltensor_opt(n, base + 2, "weight", w);
	if (rc == 0)
		rc = lint(n, base + 3, "reduction", 1, red);
	if (rc == 0) {
		const kiln_arg_t *a = larg(n, base + 4, "ignore_index");
		if (a == NULL || a->kind == KILN_ARG_NIL)
			ie = ix_const(n->c, -100);
		else
			rc = lsymint(n, a, &ie);
	}
	if (rc == 0)
		rc = need_index(n, *t, "target");
	if (rc != 0)
		return rc;
	*ign = sx_index(n->c, ie);
	const lt_t *s = *x;
	if (s->rank < 1 || s->rank > 2 || !kiln_dtype_is_float(s->dtype))
		return lerr(n, KILN_EINVGRAPH,
			    "self must be a floating [N, C] or [C] tensor");
	if ((*t)->rank != s->rank - 1 ||
	    (s->rank == 2 && !dim_eq((*t)->sizes[0], s->sizes[0])))
		return lerr(n, KILN_EINVGRAPH,
			    "target shape does not match self");
	if (*red < 0 || *red > 2)
		return lerr(n, KILN_EINVGRAPH, "reduction must be 0, 1 or 2");
	kiln_dim_t C = s->sizes[s->rank - 1];
	if (*w != NULL && ((*w)->rank != 1 || !dim_eq((*w)->sizes[0], C)))
		return lerr(n, KILN_EINVGRAPH, "weight must have C elements");
	return 0;
}

/* nll_loss_forward(self, target, weight?, reduction, ignore_index): per
 * sample n with t = target[n] and valid = t != ignore_index && 0 <= t < C,
 *   w_n = valid ? weight[t] (1 without weight) : 0
 *   l_n = valid ? -w_n · self[n, t] : 0
 *   none: out = l, total_weight = 0;  sum: out = Σ l_n;
 *   mean: out = Σ l_n / Σ w_n;        total_weight = Σ w_n
 * (a target outside [0, C) counts 0: torch raises). self[n, t] is a dyn
 * load from a buffer, or Σ_c (c == t ? self[n, c] : 0) for a lazy self
 * (fused into the kernel that computes it, e.g. log_softmax). */
int low_nll_loss(cctx_t *c, lnode_t *n)
{
	lt_t *x, *t, *w;
	int64_t red;
	const sx_t *ign;
	int rc = nll_args(n, 0, &x, &t, &w, &red, &ign);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype), acc = compute_dtype(odt);
	uint32_t nr = x->rank - 1; /* per-sample rank */
	kiln_dim_t C = x->sizes[nr];
	const kiln_expr_t *tpos[1] = {ix_var(c, 0)};
	const sx_t *ok;
	const sx_t *tv = wrap_idx(c, lt_at(c, t, tpos), C, false, &ok);
	const sx_t *valid = sx_bin(c, OP_AND, ok, sx_bin(c, OP_NE, tv, ign));
	const sx_t *wt = sxf(c, 1, acc);
	if (w != NULL) {
		rc = as_buf(n, w, &w);
		if (rc != 0)
			return rc;
		const kiln_expr_t *i0[1] = {NULL};
		const sx_t *dy[1] = {tv};
		wt = sx_cast(c, dyn_at(c, w, i0, dy, valid), acc);
	}
	const sx_t *xv;
	if (x->is_buf) {
		const kiln_expr_t *xi[2] = {ix_var(c, 0), NULL};
		const sx_t *dy[2] = {NULL, NULL};
		dy[nr] = tv;
		xv = sx_cast(c, dyn_at(c, x, xi, dy, valid), acc);
	} else {
		/* Σ_c (c == t ? self[n, c] : 0) over the self's shape */
		const sx_t *hit =
		    sx_bin(c, OP_EQ, sx_index(c, ix_var(c, nr)), tv);
		const sx_t *body = sx_where(
		    c, hit, sx_cast(c, lt_body(c, x), acc), zero(c, acc));
		lt_t *pick;
		rc = vreduce(n, x->rank, x->sizes, body, 1u << nr, RED_SUM, acc,
			     &pick);
		if (rc != 0)
			return rc;
		xv = lt_body(c, pick);
	}
	const sx_t *wn = sx_where(c, valid, wt, zero(c, acc));
	const sx_t *ln =
	    sx_where(c, valid, sx_un(c, OP_NEG, sx_bin(c, OP_MUL, wt, xv)),
		     zero(c, acc));
	lt_t *l = lt_fn(c, acc, nr, x->sizes, ln);
	lt_t *wl = lt_fn(c, acc, nr, x->sizes, wn);
	if (l == NULL || wl == NULL)
		return -ENOMEM;
	if (red == 0) {
		rc = lset(n, 0, lt_fn(c, odt, nr, x->sizes, lt_body(c, l)));
		if (rc == 0 && n->n->n_out > 1)
			rc = lset(n, 1,
				  lt_fn(c, decl_dt(n, 1, odt), 0, NULL,
					zero(c, acc)));
		return rc;
	}
	lt_t *ls, *ws;
	rc = lred(n, l, nr ? 1u : 0u, false, RED_SUM, acc, &ls);
	if (rc == 0)
		rc = lred(n, wl, nr ? 1u : 0u, false, RED_SUM, acc, &ws);
	if (rc != 0)
		return rc;
	const sx_t *out = lt_body(c, ls);
	if (red == 1)
		out = sx_bin(c, OP_DIV, out, lt_body(c, ws));
	rc = lset(n, 0, lt_fn(c, odt, 0, NULL, out));
	if (rc == 0 && n->n->n_out > 1)
		rc =
		    lset(n, 1,
			 lt_fn(c, decl_dt(n, 1, odt), 0, NULL, lt_body(c, ws)));
	return rc;
}

/* nll_loss_backward(grad, self, target, weight?, reduction, ignore_index,
 * total_weight) -> self's shape:
 *   out[n, c] = (c == t_n && t_n != ignore_index) ? -(weight[c] · g_n) : 0
 *   g_n = grad[n] (none) or grad[] (sum), grad[] / total_weight (mean). */
int low_nll_loss_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x, *t, *w, *tw;
	int64_t red;
	const sx_t *ign;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = nll_args(n, 1, &x, &t, &w, &red, &ign);
	if (rc == 0)
		rc = ltensor(n, 6, "total_weight", &tw);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype), acc = compute_dtype(odt);
	uint32_t nr = x->rank - 1;
	const sx_t *gv = NULL;
	if (red == 0 && nr == 1) {
		if (g->rank != 1 || !dim_eq(g->sizes[0], x->sizes[0]))
			return lerr(n, KILN_EINVGRAPH,
				    "grad_output must have shape [N]");
		const kiln_expr_t *gp[1] = {ix_var(c, 0)};
		gv = lt_at(c, g, gp);
	} else {
		rc = scalar_of(n, g, "grad_output", &gv);
		if (rc != 0)
			return rc;
	}
	gv = sx_cast(c, gv, acc);
	if (red == 1) {
		const sx_t *twv = NULL;
		rc = scalar_of(n, tw, "total_weight", &twv);
		if (rc != 0)
			return rc;
		gv = sx_bin(c, OP_DIV, gv, sx_cast(c, twv, acc));
	}
	const kiln_expr_t *tpos[1] = {ix_var(c, 0)};
	const sx_t *tv = sx_cast(c, lt_at(c, t, tpos), KILN_DT_I64);
	const sx_t *cv = sx_index(c, ix_var(c, nr));
	const sx_t *hit = sx_bin(c, OP_AND, sx_bin(c, OP_EQ, cv, tv),
				 sx_bin(c, OP_NE, tv, ign));
	if (w != NULL) {
		const kiln_expr_t *wp[1] = {ix_var(c, nr)};
		gv = sx_bin(c, OP_MUL, sx_cast(c, lt_at(c, w, wp), acc), gv);
	}
	const sx_t *out = sx_where(c, hit, sx_un(c, OP_NEG, gv), zero(c, acc));
	return lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, out));
}

/* mse_loss's operands: self and target (floating, one dtype), broadcast. */
static int mse_args(lnode_t *n, uint32_t base, lt_t **x, lt_t **y,
		    uint32_t *rank, kiln_dim_t *sizes)
{
	int rc = ltensor(n, base, "self", x);
	if (rc == 0)
		rc = ltensor(n, base + 1, "target", y);
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float((*x)->dtype) || (*y)->dtype != (*x)->dtype)
		return lerr(n, KILN_EINVGRAPH,
			    "self and target must be floating, one dtype");
	operand_t ops[2];
	memset(ops, 0, sizeof(ops));
	ops[0].t = *x;
	ops[1].t = *y;
	return lbroadcast(n, ops, 2, rank, sizes);
}

/* mse_loss(self, target, reduction): d = self - target (broadcast),
 *   none: d²;  sum: Σ d²;  mean: Σ d² / numel */
int low_mse_loss(cctx_t *c, lnode_t *n)
{
	lt_t *x, *y;
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	int64_t red;
	int rc = mse_args(n, 0, &x, &y, &r, sizes);
	if (rc == 0)
		rc = lint(n, 2, "reduction", 1, &red);
	if (rc != 0)
		return rc;
	if (red < 0 || red > 2)
		return lerr(n, KILN_EINVGRAPH, "reduction must be 0, 1 or 2");
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype), acc = compute_dtype(odt);
	const sx_t *d =
	    sx_bin(c, OP_SUB, sx_cast(c, lt_bcast_body(c, x, r, sizes), acc),
		   sx_cast(c, lt_bcast_body(c, y, r, sizes), acc));
	lt_t *sq = lt_fn(c, acc, r, sizes, sx_bin(c, OP_MUL, d, d));
	if (sq == NULL)
		return -ENOMEM;
	if (red == 0)
		return lset(n, 0, lt_fn(c, odt, r, sizes, sq->body));
	uint32_t all = r ? (uint32_t)((1ull << r) - 1) : 0;
	lt_t *s;
	rc = lred(n, sq, all, false, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	const sx_t *out = lt_body(c, s);
	if (red == 1)
		out = sx_bin(
		    c, OP_DIV, out,
		    sx_cast(c, sx_index(c, lred_count(c, sq, all)), acc));
	return lset(n, 0, lt_fn(c, odt, 0, NULL, out));
}

/* mse_loss_backward(grad, self, target, reduction) over the broadcast of
 * all three: out = norm · (self - target) · grad, norm = 2 / numel(self)
 * (mean) or 2. */
int low_mse_loss_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x, *y;
	int64_t red;
	int rc = ltensor(n, 0, "grad_output", &g);
	if (rc == 0)
		rc = lint(n, 3, "reduction", 1, &red);
	uint32_t r;
	kiln_dim_t sizes[CIR_MAX_RANK];
	if (rc == 0)
		rc = mse_args(n, 1, &x, &y, &r, sizes);
	if (rc != 0)
		return rc;
	if (red < 0 || red > 2)
		return lerr(n, KILN_EINVGRAPH, "reduction must be 0, 1 or 2");
	operand_t ops[3];
	memset(ops, 0, sizeof(ops));
	ops[0].t = g;
	ops[1].t = x;
	ops[2].t = y;
	rc = lbroadcast(n, ops, 3, &r, sizes);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype), acc = compute_dtype(odt);
	const sx_t *norm = sxf(c, 2, acc);
	if (red == 1) {
		uint32_t all = x->rank ? (uint32_t)((1ull << x->rank) - 1) : 0;
		const sx_t *cnt =
		    sx_cast(c, sx_index(c, lred_count(c, x, all)), acc);
		norm = sx_bin(c, OP_DIV, norm, cnt);
	}
	const sx_t *d =
	    sx_bin(c, OP_SUB, sx_cast(c, lt_bcast_body(c, x, r, sizes), acc),
		   sx_cast(c, lt_bcast_body(c, y, r, sizes), acc));
	const sx_t *out =
	    sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, norm, d),
		   sx_cast(c, lt_bcast_body(c, g, r, sizes), acc));
	return lset(n, 0, lt_fn(c, odt, r, sizes, out));
}
