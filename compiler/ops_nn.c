/*
 * ops_nn.c — pooling, resizing and normalization ops, with their backward
 * ops, built from lazy tensors, guarded loads and reductions (no loops of
 * their own):
 *
 *   max_pool2d      a lazy [.., OH, OW, KH, KW] window tensor (-inf outside
 *                   the input) reduced by max and argmax over (KH, KW); the
 *                   argmax (row-major in the window) becomes h*W + w
 *   avg_pool2d      the same window, summed, divided by the window's count
 *   adaptive avg    windows [floor(o*I/O), ceil((o+1)*I/O)): a reduction over
 *                   the largest window, guarded past each window's end
 *   pool backward   grad_input[h, w] = a reduction over the outputs whose
 *                   windows can hold (h, w): oh = (h + pad)//stride - j,
 *                   guarded loads of grad_output where the offset
 *                   h + pad - oh*stride is a kernel tap (kh*dil)
 *   upsample        nearest / bilinear source indices as index expressions
 *                   when an integer formula reproduces torch's float
 *                   arithmetic at every output position, else computed per
 *                   element in float (data-dependent loads)
 *   batch_norm      per-channel sums over a lazy [C, N, HW] view (mean, then
 *                   squared deviations); group_norm over [N, G, C/G, HW]
 *
 * Windows of up to UNROLL_MAX positions are reduced by unrolled pointwise
 * code (one kernel over the output, vectorized along its last dim) rather
 * than by tiny reductions; larger ones by reductions.
 *
 * Every lowering checks its arguments (shapes, kernel geometry) and rejects
 * bad ones with KILN_EINVGRAPH; KILN_EUNSUPOP makes a variant a fallback
 * step (ceil_mode with a symbolic input size, symbolic sizes not provably
 * equal to the declared ones). Two edge cases differ from torch: a max-pool
 * window with several NaNs reports the first NaN's index (torch: the last),
 * and max_pool2d_with_indices_backward assumes each index lies in its
 * output position's window (as max_pool2d_with_indices produces them).
 */
#include "compiler/ops.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

/* Declared dtype of output k, else fallback. */
static kiln_dtype_t decl_dt(lnode_t *n, uint32_t k, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, k);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

/* VAR k, the constant v, and v as an i64 scalar. */
static const kiln_expr_t *V(cctx_t *c, uint32_t k)
{
	return ix_var(c, k);
}

static const kiln_expr_t *K(cctx_t *c, int64_t v)
{
	return ix_const(c, v);
}

static const sx_t *I64(cctx_t *c, int64_t v)
{
	return sx_consti(c, v, KILN_DT_I64);
}

#define TRY(e)                                                                 \
	do {                                                                   \
		int rc_ = (e);                                                 \
		if (rc_ != 0)                                                  \
			return rc_;                                            \
	} while (0)

/* Shorthands (c is the compile context in scope): SB(ADD, a, b) is
 * sx_bin(c, OP_ADD, a, b); IX(add, a, b) is ix_add(c, a, b). */
#define SB(op, a, b) sx_bin(c, OP_##op, a, b)
#define IX(f, a, b)  ix_##f(c, a, b)

/* a && b, either may be NULL (true). */
static const sx_t *band(cctx_t *c, const sx_t *a, const sx_t *b)
{
	return a == NULL ? b : b == NULL ? a : SB(AND, a, b);
}

/* 0 <= e < size */
static const sx_t *in_range(cctx_t *c, const kiln_expr_t *e, kiln_dim_t size)
{
	const sx_t *v = sx_index(c, e);
	return SB(AND, SB(GE, v, sx_consti(c, 0, KILN_DT_I64)),
		  SB(LT, v, sx_index(c, ix_dim(c, size))));
}

/* ok ? v (its loads guarded by ok) : other; v when ok is NULL. */
static const sx_t *guarded(cctx_t *c, const sx_t *ok, const sx_t *v,
			   const sx_t *other)
{
	if (ok == NULL)
		return v;
	return sx_where(c, ok, sx_guard(c, v, ok), other);
}

/* t cast to dtype dt, as a lazy tensor. */
static lt_t *as_dt(cctx_t *c, const lt_t *t, kiln_dtype_t dt)
{
	return lt_fn(c, dt, t->rank, t->sizes, sx_cast(c, lt_body(c, t), dt));
}

/* Whether a dim is symbolic. */
static bool dim_sym(kiln_dim_t d)
{
	return d.e != NULL;
}

/* Compares computed dims with declared output k: a mismatch involving a
 * symbol is KILN_EUNSUPOP (the normal forms may differ), a static one is
 * left to lset, which reports it. */
static int check_decl(lnode_t *n, uint32_t k, uint32_t rank,
		      const kiln_dim_t *sizes)
{
	uint32_t r;
	kiln_dim_t d[CIR_MAX_RANK];
	int rc = lout_sizes(n, k, &r, d, NULL);
	if (rc != 0 || r != rank)
		return rc;
	for (uint32_t i = 0; i < r; i++)
		if (!dim_eq(d[i], sizes[i]) &&
		    (dim_sym(d[i]) || dim_sym(sizes[i])))
			return lerr(n, KILN_EUNSUPOP,
				    "out %u: symbolic size at dim %u not "
				    "provably the computed one",
				    k, i);
	return 0;
}

/* Checks that t has shape (rank, sizes); what names it. */
static int need_shape(lnode_t *n, const lt_t *t, uint32_t rank,
		      const kiln_dim_t *sizes, const char *what)
{
	if (t->rank != rank)
		return lerr(n, KILN_EINVGRAPH, "%s must have rank %u, not %u",
			    what, rank, t->rank);
	for (uint32_t k = 0; k < rank; k++)
		if (!dim_eq(t->sizes[k], sizes[k]))
			return lerr(n,
				    dim_sym(t->sizes[k]) || dim_sym(sizes[k])
					? KILN_EUNSUPOP
					: KILN_EINVGRAPH,
				    "%s has the wrong size at dim %u", what, k);
	return 0;
}

/* An optional per-channel vector must be [C]. */
static int need_vec(lnode_t *n, const lt_t *t, kiln_dim_t C, const char *what)
{
	return t == NULL ? 0 : need_shape(n, t, 1, &C, what);
}

/* Element ch of an optional per-channel vector in dtype acc (dflt if
 * absent). */
static const sx_t *chv(cctx_t *c, const lt_t *t, const kiln_expr_t *ch,
		       double dflt, kiln_dtype_t acc)
{
	if (t == NULL)
		return sxf(c, dflt, acc);
	const kiln_expr_t *idx[1] = {ch};
	return sx_cast(c, lt_at(c, t, idx), acc);
}

/* output_mask (a bool[3]) at pos; all true when absent. */
static int lmask3(lnode_t *n, uint32_t pos, bool m[3])
{
	const kiln_arg_t *a = larg(n, pos, "output_mask");
	m[0] = m[1] = m[2] = true;
	if (a == NULL || a->kind == KILN_ARG_NIL)
		return 0;
	if (a->kind != KILN_ARG_LIST || a->n != 3)
		return lerr(n, KILN_EINVGRAPH,
			    "output_mask must be a list of 3 bools");
	for (uint32_t i = 0; i < 3; i++) {
		if (a->u.list[i].kind != KILN_ARG_BOOL)
			return lerr(n, KILN_EINVGRAPH,
				    "output_mask[%u] must be a bool", i);
		m[i] = a->u.list[i].u.b;
	}
	return 0;
}

/* ---- pooling geometry ---------------------------------------------------- */

typedef struct pool {
	uint32_t lead;		  /* dims before H, W: 1 (C) or 2 (N, C) */
	kiln_dim_t in[2], out[2]; /* H, W and the pooled OH, OW */
	int64_t k[2], s[2], p[2], d[2];
	bool ceil;
} pool_t;

/* An int[2] argument (one entry stands for both); dflt when absent or
 * empty (NULL: required). */
static int int2(lnode_t *n, uint32_t pos, const char *name, const int64_t *dflt,
		int64_t v[2])
{
	int64_t t[2];
	uint32_t cnt;
	TRY(lintlist(n, pos, name, t, &cnt, 2));
	if (cnt == 0) {
		if (dflt == NULL)
			return lerr(n, KILN_EINVGRAPH, "%s must not be empty",
				    name);
		v[0] = dflt[0];
		v[1] = dflt[1];
		return 0;
	}
	v[0] = t[0];
	v[1] = t[cnt - 1];
	return 0;
}

/* torch's pooling_output_shape: o = (in + 2p - d(k-1) - 1 [+ s-1 when
 * ceil]) // s + 1, minus one when ceil mode would start the last window in
 * the right padding. */
static int pool_out(lnode_t *n, kiln_dim_t in, int64_t k, int64_t s, int64_t p,
		    int64_t d, bool ceil, kiln_dim_t *out)
{
	cctx_t *c = n->c;
	int64_t off = 2 * p - d * (k - 1) - 1;
	if (!dim_sym(in)) {
		int64_t num = in.c + off + (ceil ? s - 1 : 0);
		int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
		if (ceil && (o - 1) * s >= in.c + p)
			o--;
		if (o <= 0)
			return lerr(n, KILN_EINVGRAPH,
				    "pooled size %lld is too small",
				    (long long)o);
		*out = dim_const(o);
		return 0;
	}
	if (ceil)
		return lerr(n, KILN_EUNSUPOP,
			    "ceil_mode with a symbolic input size");
	const kiln_expr_t *e =
	    IX(add, IX(floordiv, IX(add, ix_dim(c, in), K(c, off)), K(c, s)),
	       K(c, 1));
	if (e == NULL)
		return -ENOMEM;
	*out = dim_of(e);
	return 0;
}

/* Reads kernel_size, stride, padding[, dilation], ceil_mode from `base` on
 * and checks them as torch does. */
static int pool_args(lnode_t *n, const lt_t *x, uint32_t base, bool has_dil,
		     pool_t *g)
{
	memset(g, 0, sizeof(*g));
	if (x->rank != 3 && x->rank != 4)
		return lerr(n, KILN_EINVGRAPH,
			    "input must be 3-D or 4-D, not %u-D", x->rank);
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH, "input must be floating, not %s",
			    kiln_dtype_name(x->dtype));
	const int64_t zero[2] = {0, 0}, one[2] = {1, 1};
	TRY(int2(n, base, "kernel_size", NULL, g->k));
	TRY(int2(n, base + 1, "stride", g->k, g->s));
	TRY(int2(n, base + 2, "padding", zero, g->p));
	g->d[0] = g->d[1] = 1;
	if (has_dil)
		TRY(int2(n, base + 3, "dilation", one, g->d));
	TRY(lbool(n, base + (has_dil ? 4 : 3), "ceil_mode", false, &g->ceil));
	const int64_t lim = 1 << 20;
	for (int a = 0; a < 2; a++) {
		if (g->k[a] <= 0 || g->s[a] <= 0 || g->d[a] <= 0 || g->p[a] < 0)
			return lerr(n, KILN_EINVGRAPH,
				    "kernel, stride and dilation must be "
				    "positive, padding non-negative");
		if (g->k[a] > lim || g->s[a] > lim || g->d[a] > lim ||
		    g->p[a] > lim)
			return lerr(n, KILN_EINVGRAPH,
				    "pooling parameters too large");
		if (g->p[a] > (g->d[a] * (g->k[a] - 1) + 1) / 2)
			return lerr(n, KILN_EINVGRAPH,
				    "pad %lld should be at most half of the "
				    "effective kernel size",
				    (long long)g->p[a]);
	}
	g->lead = x->rank - 2;
	for (int a = 0; a < 2; a++) {
		g->in[a] = x->sizes[g->lead + a];
		TRY(pool_out(n, g->in[a], g->k[a], g->s[a], g->p[a], g->d[a],
			     g->ceil, &g->out[a]));
	}
	return 0;
}

/* Shape of x with its last two dims replaced by (a, b). */
static void shape2(const lt_t *x, kiln_dim_t a, kiln_dim_t b, kiln_dim_t *sz)
{
	for (uint32_t k = 0; k < x->rank; k++)
		sz[k] = x->sizes[k];
	sz[x->rank - 2] = a;
	sz[x->rank - 1] = b;
}

/* Index list: the lead vars, then h, w. */
static void idx2(cctx_t *c, uint32_t lead, const kiln_expr_t *h,
		 const kiln_expr_t *w, const kiln_expr_t **idx)
{
	for (uint32_t k = 0; k < lead; k++)
		idx[k] = V(c, k);
	idx[lead] = h;
	idx[lead + 1] = w;
}

/* The forward window, shape sz = [.., OH, OW, KH, KW]:
 *   win[.., oh, ow, kh, kw] = x[.., oh*s - p + kh*d, ow*s - p + kw*d],
 *   `fill` outside the input; dtype dt (computed in its compute dtype). */
static lt_t *pool_window(cctx_t *c, const pool_t *g, const lt_t *x,
			 kiln_dtype_t dt, double fill, kiln_dim_t *sz)
{
	uint32_t L = g->lead;
	shape2(x, g->out[0], g->out[1], sz);
	sz[L + 2] = dim_const(g->k[0]);
	sz[L + 3] = dim_const(g->k[1]);
	set_var_ranges(c, L + 4, sz);
	const kiln_expr_t *pos[2], *idx[CIR_MAX_RANK];
	const sx_t *ok = NULL;
	for (int a = 0; a < 2; a++) {
		pos[a] = IX(
		    add,
		    IX(sub, IX(mul, V(c, L + a), K(c, g->s[a])), K(c, g->p[a])),
		    IX(mul, V(c, L + 2 + a), K(c, g->d[a])));
		if (g->p[a] > 0 || g->ceil)
			ok = band(c, ok, in_range(c, pos[a], g->in[a]));
	}
	idx2(c, L, pos[0], pos[1], idx);
	kiln_dtype_t cdt = compute_dtype(dt);
	const sx_t *v = sx_cast(c, lt_at(c, x, idx), cdt);
	return lt_fn(c, dt, L + 4, sz, guarded(c, ok, v, sxf(c, fill, cdt)));
}

/* The backward window, shape sz = [.., H, W, J0, J1]: the outputs whose
 * windows can hold input i (per axis, span e = (k-1)*d + 1) are
 * o = (i + p) // s - j for j < J = ceil(e / s); o counts when 0 <= o < O and
 * t = i + p - o*s (the offset in its window, k*d) is < e and a multiple of
 * d (*ok); idx = [.., o0, o1]. Checks that go has the pooled shape. */
static int pool_back(lnode_t *n, const pool_t *g, const lt_t *x, const lt_t *go,
		     kiln_dim_t *sz, const kiln_expr_t **idx, const sx_t **ok)
{
	cctx_t *c = n->c;
	uint32_t L = g->lead;
	shape2(x, g->out[0], g->out[1], sz);
	TRY(need_shape(n, go, x->rank, sz, "grad_output"));
	shape2(x, g->in[0], g->in[1], sz);
	int64_t e[2];
	for (int a = 0; a < 2; a++) {
		e[a] = (g->k[a] - 1) * g->d[a] + 1;
		sz[L + 2 + a] = dim_const((e[a] + g->s[a] - 1) / g->s[a]);
	}
	set_var_ranges(c, L + 4, sz);
	const kiln_expr_t *o[2];
	const sx_t *z = I64(c, 0);
	*ok = NULL;
	for (int a = 0; a < 2; a++) {
		const kiln_expr_t *ip = IX(add, V(c, L + a), K(c, g->p[a]));
		o[a] =
		    IX(sub, IX(floordiv, ip, K(c, g->s[a])), V(c, L + 2 + a));
		const kiln_expr_t *t =
		    IX(sub, ip, IX(mul, o[a], K(c, g->s[a])));
		const sx_t *ov = sx_index(c, o[a]);
		*ok = band(c, *ok,
			   band(c, SB(GE, ov, z),
				SB(LT, ov, sx_index(c, ix_dim(c, g->out[a])))));
		if (e[a] % g->s[a] != 0)
			*ok =
			    band(c, *ok, SB(LT, sx_index(c, t), I64(c, e[a])));
		if (g->d[a] > 1)
			*ok = band(
			    c, *ok,
			    SB(EQ, sx_index(c, IX(mod, t, K(c, g->d[a]))), z));
	}
	idx2(c, L, o[0], o[1], idx);
	return 0;
}

/* The window tensor t ([.., A, B, KH, KW]) with VAR := i, j. */
static const sx_t *win_at(cctx_t *c, const lt_t *t, int64_t i, int64_t j)
{
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank - 2; k++)
		map[k] = V(c, k);
	map[t->rank - 2] = K(c, i);
	map[t->rank - 1] = K(c, j);
	return sx_subst(c, t->body, map, t->rank);
}

/* Windows of at most this many positions are unrolled into pointwise code
 * (vectorized along the output's last dim) instead of tiny reductions. */
#define UNROLL_MAX 16

/* Sums t ([.., A, B, KH, KW], dtype acc) over its last two dims, as dtype
 * odt: unrolled into one pointwise sum (vectorized along B) for small
 * windows, else a reduction. */
static int pool_sum(lnode_t *n, const lt_t *t, kiln_dtype_t odt, lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t R = t->rank;
	int64_t kh = t->sizes[R - 2].c, kw = t->sizes[R - 1].c;
	if (dim_sym(t->sizes[R - 2]) || dim_sym(t->sizes[R - 1]) ||
	    kh * kw > UNROLL_MAX)
		return lred(n, t, 3u << (R - 2), false, RED_SUM, odt, out);
	set_var_ranges(c, R - 2, t->sizes);
	const sx_t *sum = NULL;
	for (int64_t k = 0; k < kh * kw; k++) {
		const sx_t *e = win_at(c, t, k / kw, k % kw);
		sum = sum ? SB(ADD, sum, e) : e;
	}
	*out = lt_fn(c, odt, R - 2, t->sizes, sum);
	return *out ? 0 : -ENOMEM;
}

/* Max and argmax (row-major in the window, first occurrence, NaN counting
 * as the maximum) of t over its last two dims: for small windows unrolled
 * into pointwise compares (best = v_k when v_k > best, or v_k is the first
 * NaN), else reductions. */
static int pool_max(lnode_t *n, const lt_t *t, lt_t **mx, lt_t **am)
{
	cctx_t *c = n->c;
	uint32_t R = t->rank;
	int64_t kh = t->sizes[R - 2].c, kw = t->sizes[R - 1].c;
	if (dim_sym(t->sizes[R - 2]) || dim_sym(t->sizes[R - 1]) ||
	    kh * kw > UNROLL_MAX) {
		TRY(lred(n, t, 3u << (R - 2), false, RED_MAX, t->dtype, mx));
		return lred(n, t, 3u << (R - 2), false, RED_ARGMAX, KILN_DT_I64,
			    am);
	}
	set_var_ranges(c, R - 2, t->sizes);
	const sx_t *best = win_at(c, t, 0, 0), *idx = I64(c, 0);
	for (int64_t k = 1; k < kh * kw; k++) {
		const sx_t *v = win_at(c, t, k / kw, k % kw);
		const sx_t *take =
		    SB(OR, SB(GT, v, best),
		       SB(AND, sx_un(c, OP_ISNAN, v),
			  sx_un(c, OP_NOT, sx_un(c, OP_ISNAN, best))));
		best = sx_where(c, take, v, best);
		idx = sx_where(c, take, I64(c, k), idx);
	}
	*mx = lt_fn(c, t->dtype, R - 2, t->sizes, best);
	*am = lt_fn(c, KILN_DT_I64, R - 2, t->sizes, idx);
	return *mx && *am ? 0 : -ENOMEM;
}

/* ---- max pooling -------------------------------------------------------- */

/* max_pool2d_with_indices(self, kernel_size, stride=[], padding=0,
 * dilation=1, ceil_mode=False) -> (values, indices): over the window
 * (-inf outside the input) values = max, a = argmax (first occurrence,
 * kh*KW + kw); indices = h*W + w of that position (an all -inf window
 * whose first position is padding: its first position inside, as torch). */
int low_max_pool2d(cctx_t *c, lnode_t *n)
{
	lt_t *x, *mx, *am;
	pool_t g;
	kiln_dim_t sz[CIR_MAX_RANK];
	TRY(ltensor(n, 0, "self", &x));
	TRY(pool_args(n, x, 1, true, &g));
	uint32_t L = g.lead;
	shape2(x, g.out[0], g.out[1], sz);
	TRY(check_decl(n, 0, L + 2, sz));
	TRY(check_decl(n, 1, L + 2, sz));
	lt_t *win = pool_window(c, &g, x, x->dtype, -INFINITY, sz);
	if (win == NULL)
		return -ENOMEM;
	TRY(pool_max(n, win, &mx, &am));
	/* window position -> flat input index */
	set_var_ranges(c, L + 2, sz);
	const sx_t *a = lt_body(c, am), *pp[2], *valid = NULL;
	const sx_t *kw = I64(c, g.k[1]);
	const sx_t *kk[2] = {SB(FLOORDIV, a, kw), SB(REM, a, kw)};
	const kiln_expr_t *first[2];
	for (int i = 0; i < 2; i++) {
		const kiln_expr_t *st =
		    IX(sub, IX(mul, V(c, L + i), K(c, g.s[i])), K(c, g.p[i]));
		pp[i] =
		    SB(ADD, sx_index(c, st), SB(MUL, kk[i], I64(c, g.d[i])));
		/* first in-range position: st - d*min(0, st // d) */
		first[i] =
		    IX(sub, st,
		       IX(mul, K(c, g.d[i]),
			  IX(min, K(c, 0), IX(floordiv, st, K(c, g.d[i])))));
		if (g.p[i] > 0)
			valid = band(c, valid,
				     band(c, SB(GE, pp[i], I64(c, 0)),
					  SB(LT, pp[i],
					     sx_index(c, ix_dim(c, g.in[i])))));
	}
	const sx_t *flat =
	    SB(ADD, SB(MUL, pp[0], sx_index(c, ix_dim(c, g.in[1]))), pp[1]);
	if (valid != NULL)
		flat = sx_where(
		    c, valid, flat,
		    sx_index(c, IX(add, IX(mul, first[0], ix_dim(c, g.in[1])),
				   first[1])));
	TRY(lset(n, 0, mx));
	return lset(n, 1, lt_fn(c, KILN_DT_I64, L + 2, sz, flat));
}

/* max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride,
 * padding, dilation, ceil_mode, indices):
 *   gi[.., h, w] = sum over (kh, kw) of go[.., oh, ow] where (oh, ow) is
 *   the output whose window holds (h, w) at (kh, kw) (pool_back) and
 *   indices[.., oh, ow] == h*W + w. */
int low_max_pool2d_backward(cctx_t *c, lnode_t *n)
{
	lt_t *go, *x, *ind, *r;
	pool_t g;
	kiln_dim_t sz[CIR_MAX_RANK];
	const kiln_expr_t *idx[CIR_MAX_RANK];
	const sx_t *ok;
	TRY(ltensor(n, 0, "grad_output", &go));
	TRY(ltensor(n, 1, "self", &x));
	TRY(ltensor(n, 7, "indices", &ind));
	TRY(pool_args(n, x, 2, true, &g));
	shape2(x, g.out[0], g.out[1], sz);
	TRY(need_shape(n, ind, x->rank, sz, "indices"));
	if (ind->dtype != KILN_DT_I64)
		return lerr(n, KILN_EINVGRAPH, "indices must be int64");
	TRY(pool_back(n, &g, x, go, sz, idx, &ok));
	uint32_t L = g.lead;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	const sx_t *hw = sx_index(
	    c, IX(add, IX(mul, V(c, L), ix_dim(c, g.in[1])), V(c, L + 1)));
	const sx_t *zero = sxf(c, 0, acc);
	const sx_t *term = sx_where(c, SB(EQ, lt_at(c, ind, idx), hw),
				    sx_cast(c, lt_at(c, go, idx), acc), zero);
	lt_t *t = lt_fn(c, acc, L + 4, sz, guarded(c, ok, term, zero));
	if (t == NULL)
		return -ENOMEM;
	TRY(pool_sum(n, t, odt, &r));
	return lset(n, 0, r);
}

/* ---- average pooling ----------------------------------------------------- */

typedef struct avgopt {
	bool incl;    /* count_include_pad */
	int64_t divo; /* divisor_override (0: none) */
} avgopt_t;

/* count_include_pad, divisor_override from base on. */
static int avg_args(lnode_t *n, uint32_t base, avgopt_t *o)
{
	TRY(lbool(n, base, "count_include_pad", true, &o->incl));
	TRY(lint(n, base + 1, "divisor_override", 0, &o->divo));
	if (o->divo < 0)
		return lerr(n, KILN_EINVGRAPH,
			    "divisor_override must be positive");
	return 0;
}

/* The divisor of output position (o0, o1) (index expressions), as torch:
 * hs = o*s - p; count_include_pad: min(hs + k, in + p) - hs per axis; else
 * min(hs + k, in) - max(hs, 0); or the override. As a float of dtype acc. */
static const sx_t *avg_div(cctx_t *c, const pool_t *g, const avgopt_t *o,
			   const kiln_expr_t *o0, const kiln_expr_t *o1,
			   kiln_dtype_t acc)
{
	if (o->divo > 0)
		return sxf(c, (double)o->divo, acc);
	const kiln_expr_t *os[2] = {o0, o1}, *r = K(c, 1);
	for (int a = 0; a < 2; a++) {
		const kiln_expr_t *in = ix_dim(c, g->in[a]);
		const kiln_expr_t *hs =
		    IX(sub, IX(mul, os[a], K(c, g->s[a])), K(c, g->p[a]));
		const kiln_expr_t *end = IX(add, hs, K(c, g->k[a]));
		r = IX(
		    mul, r,
		    o->incl
			? IX(sub, IX(min, end, IX(add, in, K(c, g->p[a]))), hs)
			: IX(sub, IX(min, end, in), IX(max, hs, K(c, 0))));
	}
	return sx_cast(c, sx_index(c, r), acc);
}

/* avg_pool2d(self, kernel_size, stride=[], padding=0, ceil_mode=False,
 * count_include_pad=True, divisor_override=None):
 *   out[.., oh, ow] = sum of the window (0 outside) / divisor(oh, ow). */
int low_avg_pool2d(cctx_t *c, lnode_t *n)
{
	lt_t *x, *s;
	pool_t g;
	avgopt_t o;
	kiln_dim_t sz[CIR_MAX_RANK];
	TRY(ltensor(n, 0, "self", &x));
	TRY(pool_args(n, x, 1, false, &g));
	TRY(avg_args(n, 5, &o));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	uint32_t L = g.lead;
	shape2(x, g.out[0], g.out[1], sz);
	TRY(check_decl(n, 0, L + 2, sz));
	lt_t *win = pool_window(c, &g, x, acc, 0, sz);
	if (win == NULL)
		return -ENOMEM;
	TRY(pool_sum(n, win, acc, &s));
	set_var_ranges(c, L + 2, sz);
	const sx_t *div = avg_div(c, &g, &o, V(c, L), V(c, L + 1), acc);
	return lset(n, 0,
		    lt_fn(c, odt, L + 2, sz, SB(DIV, lt_body(c, s), div)));
}

/* avg_pool2d_backward(grad_output, self, kernel_size, stride, padding,
 * ceil_mode, count_include_pad, divisor_override):
 *   gi[.., h, w] = sum over (kh, kw) of go[.., oh, ow] / divisor(oh, ow)
 *   with (oh, ow) the output whose window holds (h, w) at (kh, kw). */
int low_avg_pool2d_backward(cctx_t *c, lnode_t *n)
{
	lt_t *go, *x, *r;
	pool_t g;
	avgopt_t o;
	kiln_dim_t sz[CIR_MAX_RANK];
	const kiln_expr_t *idx[CIR_MAX_RANK];
	const sx_t *ok;
	TRY(ltensor(n, 0, "grad_output", &go));
	TRY(ltensor(n, 1, "self", &x));
	TRY(pool_args(n, x, 2, false, &g));
	TRY(avg_args(n, 6, &o));
	TRY(pool_back(n, &g, x, go, sz, idx, &ok));
	uint32_t L = g.lead;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	const sx_t *term = SB(DIV, sx_cast(c, lt_at(c, go, idx), acc),
			      avg_div(c, &g, &o, idx[L], idx[L + 1], acc));
	lt_t *t =
	    lt_fn(c, acc, L + 4, sz, guarded(c, ok, term, sxf(c, 0, acc)));
	if (t == NULL)
		return -ENOMEM;
	TRY(pool_sum(n, t, odt, &r));
	return lset(n, 0, r);
}

/* ---- adaptive average pooling ------------------------------------------- */

/* The window of output o when an axis of size in is pooled to out:
 * [start(o), end(o)) = [floor(o*in/out), ceil((o+1)*in/out)). */
static const kiln_expr_t *ada_start(cctx_t *c, const kiln_expr_t *o,
				    kiln_dim_t in, kiln_dim_t out)
{
	return IX(floordiv, IX(mul, o, ix_dim(c, in)), ix_dim(c, out));
}

/* end(o) = ceil((o+1)*in/out) = ((o+1)*in + out - 1) // out */
static const kiln_expr_t *ada_end(cctx_t *c, const kiln_expr_t *o,
				  kiln_dim_t in, kiln_dim_t out)
{
	const kiln_expr_t *od = ix_dim(c, out);
	return IX(floordiv,
		  IX(sub,
		     IX(add, IX(mul, IX(add, o, K(c, 1)), ix_dim(c, in)), od),
		     K(c, 1)),
		  od);
}

/* len(o) = end - start, as a float of dtype acc. */
static const sx_t *ada_len(cctx_t *c, const kiln_expr_t *o, kiln_dim_t in,
			   kiln_dim_t out, kiln_dtype_t acc)
{
	return sx_cast(c,
		       sx_index(c, IX(sub, ada_end(c, o, in, out),
				      ada_start(c, o, in, out))),
		       acc);
}

/* The largest window: exact when static (*uniform: all windows have that
 * size), else the bound ceil(in/out) + 1. */
static kiln_dim_t ada_max(cctx_t *c, kiln_dim_t in, kiln_dim_t out,
			  bool *uniform)
{
	*uniform = false;
	if (!dim_sym(in) && !dim_sym(out)) {
		int64_t I = in.c, O = out.c, mx = 0, mn = INT64_MAX;
		for (int64_t o = 0; o < O; o++) {
			int64_t w = ((o + 1) * I + O - 1) / O - o * I / O;
			mx = w > mx ? w : mx;
			mn = w < mn ? w : mn;
		}
		*uniform = mx == mn;
		return dim_const(mx > 0 ? mx : 1);
	}
	const kiln_expr_t *od = ix_dim(c, out);
	return dim_of(IX(
	    add, IX(floordiv, IX(sub, IX(add, ix_dim(c, in), od), K(c, 1)), od),
	    K(c, 1)));
}

/* _adaptive_avg_pool2d(self, output_size) (bw false) and
 * _adaptive_avg_pool2d_backward(grad_output, self) (bw true); per axis
 * (in -> out) output o averages [start(o), end(o)), len(o) = end - start:
 *   forward:  out[.., oh, ow] = sum over kh < len(oh), kw < len(ow) of
 *             x[.., start(oh) + kh, start(ow) + kw] / len(oh) / len(ow)
 *   backward: gi[.., h, w] = sum of go[.., oh, ow] / len(oh) / len(ow) over
 *             the outputs holding (h, w): oh in [floor(h*out/in),
 *             ceil((h+1)*out/in)) (the window formula, in and out swapped)
 * Both reduce over the largest range, guarded past each range's end. */
static int adaptive(cctx_t *c, lnode_t *n, bool bw)
{
	lt_t *x, *go = NULL, *s;
	if (bw)
		TRY(ltensor(n, 0, "grad_output", &go));
	TRY(ltensor(n, bw ? 1 : 0, "self", &x));
	if (x->rank != 3 && x->rank != 4)
		return lerr(n, KILN_EINVGRAPH,
			    "input must be 3-D or 4-D, not %u-D", x->rank);
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH, "input must be floating");
	uint32_t L = x->rank - 2;
	kiln_dim_t in[2] = {x->sizes[L], x->sizes[L + 1]}, out[2];
	kiln_dim_t sz[CIR_MAX_RANK];
	if (bw) {
		if (go->rank != x->rank)
			return lerr(n, KILN_EINVGRAPH,
				    "grad_output and self ranks differ");
		out[0] = go->sizes[L];
		out[1] = go->sizes[L + 1];
	} else {
		const kiln_expr_t *os[CIR_MAX_RANK];
		uint32_t nos;
		TRY(lsizelist(n, 1, "output_size", os, &nos));
		if (nos != 2 && nos != 1)
			return lerr(n, KILN_EINVGRAPH,
				    "output_size must have 2 entries");
		out[0] = dim_of(os[0]);
		out[1] = dim_of(os[nos - 1]);
	}
	for (int a = 0; a < 2; a++)
		if ((!dim_sym(out[a]) && out[a].c <= 0) ||
		    (!dim_sym(in[a]) && in[a].c <= 0))
			return lerr(n, KILN_EINVGRAPH,
				    "input and output sizes must be positive");
	shape2(x, out[0], out[1], sz);
	TRY(bw ? need_shape(n, go, x->rank, sz, "grad_output")
	       : check_decl(n, 0, L + 2, sz));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	/* [.., A0, A1, J0, J1]: position a over ranges of b */
	const kiln_dim_t *A = bw ? in : out, *B = bw ? out : in;
	shape2(x, A[0], A[1], sz);
	bool uni[2];
	const kiln_expr_t *pos[2], *idx[CIR_MAX_RANK];
	const sx_t *ok = NULL;
	for (int a = 0; a < 2; a++)
		sz[L + 2 + a] = ada_max(c, B[a], A[a], &uni[a]);
	set_var_ranges(c, L + 4, sz);
	for (int a = 0; a < 2; a++) {
		pos[a] = IX(add, ada_start(c, V(c, L + a), B[a], A[a]),
			    V(c, L + 2 + a));
		if (!uni[a])
			ok = band(c, ok,
				  SB(LT, sx_index(c, pos[a]),
				     sx_index(c, ada_end(c, V(c, L + a), B[a],
							 A[a]))));
	}
	idx2(c, L, pos[0], pos[1], idx);
	const sx_t *t = sx_cast(c, lt_at(c, bw ? go : x, idx), acc);
	for (int a = 0; bw && a < 2; a++)
		t = SB(DIV, t, ada_len(c, pos[a], in[a], out[a], acc));
	lt_t *win = lt_fn(c, acc, L + 4, sz, guarded(c, ok, t, sxf(c, 0, acc)));
	if (win == NULL)
		return -ENOMEM;
	TRY(pool_sum(n, win, bw ? odt : acc, &s));
	if (bw)
		return lset(n, 0, s);
	set_var_ranges(c, L + 2, sz);
	const sx_t *r = lt_body(c, s);
	for (int a = 0; a < 2; a++)
		r = SB(DIV, r, ada_len(c, V(c, L + a), in[a], out[a], acc));
	return lset(n, 0, lt_fn(c, odt, L + 2, sz, r));
}

/* _adaptive_avg_pool2d and its backward: see adaptive(). */
int low_adaptive_avg_pool2d(cctx_t *c, lnode_t *n)
{
	return adaptive(c, n, false);
}

int low_adaptive_avg_pool2d_backward(cctx_t *c, lnode_t *n)
{
	return adaptive(c, n, true);
}

/* ---- upsampling ---------------------------------------------------------- */

/* One axis of an upsampling at output position VAR var: the source indices
 * i0, i1 = min(i0 + 1, in - 1) as index expressions when exact (else NULL,
 * and s0, s1 are i64 scalar expressions), and l1, the weight of i1
 * (bilinear). */
typedef struct uaxis {
	const kiln_expr_t *i0, *i1;
	const sx_t *s0, *s1, *l1;
} uaxis_t;

typedef struct uparams {
	bool bil, ac;
	bool has[2]; /* a scale was given */
	double sc[2];
} uparams_t;

/* torch's i0 for output o, computed as torch does: nearest in float
 * (floor(o * s), with the out == in and out == 2*in shortcuts), bilinear in
 * opmath (f32, or f64 for double) from area_pixel_compute_source_index. */
static int64_t up_src(const uparams_t *p, bool f32, double s, int64_t o,
		      int64_t in)
{
	int64_t v;
	if (!p->bil) {
		v = (int64_t)floorf((float)o * (float)s);
	} else if (f32) {
		float fs = (float)s;
		float r = p->ac ? fs * (float)o : fs * ((float)o + 0.5f) - 0.5f;
		v = (int64_t)floorf(r < 0 ? 0 : r);
	} else {
		double r = p->ac ? s * (double)o : s * ((double)o + 0.5) - 0.5;
		v = (int64_t)floor(r < 0 ? 0 : r);
	}
	return v < in - 1 ? v : in - 1;
}

/* floor(a / b), b > 0 */
static int64_t fdiv64(int64_t a, int64_t b)
{
	return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* The integer formula for i0 with ratio a/d: nearest and aligned bilinear
 * min(o*a // d, in-1); half-pixel bilinear
 * clamp(((2o+1)*a - d) // 2d, 0, in-1). */
static int64_t form_eval(const uparams_t *p, int64_t a, int64_t d, int64_t o,
			 int64_t in)
{
	int64_t v = p->bil && !p->ac ? fdiv64((2 * o + 1) * a - d, 2 * d)
				     : fdiv64(o * a, d);
	v = v < 0 ? 0 : v;
	return v < in - 1 ? v : in - 1;
}

/* form_eval as an index expression of o. */
static const kiln_expr_t *form_ix(cctx_t *c, const uparams_t *p, int64_t a,
				  int64_t d, const kiln_expr_t *o, int64_t in)
{
	const kiln_expr_t *v;
	if (p->bil && !p->ac)
		v = IX(max,
		       IX(floordiv,
			  IX(add, IX(mul, o, K(c, 2 * a)), K(c, a - d)),
			  K(c, 2 * d)),
		       K(c, 0));
	else
		v = IX(floordiv, IX(mul, o, K(c, a)), K(c, d));
	return IX(min, v, K(c, in - 1));
}

/* Finds a ratio a/d whose integer formula gives torch's i0 at every output
 * position (static sizes): first in/out (aligned: (in-1)/(out-1)), then
 * small denominators near the scale. */
static bool find_form(const uparams_t *p, bool f32, double s, int64_t in,
		      int64_t out, int64_t *pa, int64_t *pd)
{
	if (out > (1 << 16) || in > (1 << 24))
		return false;
	for (int64_t d = 0; d <= 256; d++) {
		bool al = p->bil && p->ac;
		int64_t a = d ? llround(s * (double)d) : al ? in - 1 : in;
		int64_t dd = d ? d : al ? out - 1 : out;
		bool found = dd > 0 && a >= 0;
		for (int64_t o = 0; o < out && found; o++)
			found = form_eval(p, a, dd, o, in) ==
				up_src(p, f32, s, o, in);
		if (found) {
			*pa = a;
			*pd = dd;
			return true;
		}
	}
	return false;
}

/* num / den in float type ft (a constant when both are). */
static const sx_t *ratio(cctx_t *c, const kiln_expr_t *num,
			 const kiln_expr_t *den, kiln_dtype_t ft, double *sv)
{
	if (num->kind == KILN_EX_CONST && den->kind == KILN_EX_CONST) {
		*sv = ft == KILN_DT_F32
			  ? (double)((float)num->c / (float)den->c)
			  : (double)num->c / (double)den->c;
		return sxf(c, *sv, ft);
	}
	return SB(DIV, sx_cast(c, sx_index(c, num), ft),
		  sx_cast(c, sx_index(c, den), ft));
}

/* Builds axis a (input size in, output size out, output position VAR var),
 * computing in dtype acc (bilinear weights). */
static int up_axis(lnode_t *n, const uparams_t *p, int a, kiln_dim_t in,
		   kiln_dim_t out, uint32_t var, kiln_dtype_t acc, uaxis_t *u)
{
	cctx_t *c = n->c;
	memset(u, 0, sizeof(*u));
	const kiln_expr_t *o = V(c, var);
	bool stat = !dim_sym(in) && !dim_sym(out);
	if (stat && in.c == out.c) {
		/* torch copies (whatever the scale) */
		u->i0 = u->i1 = o;
		u->l1 = sxf(c, 0, acc);
		return 0;
	}
	if (stat && !p->bil && out.c == 2 * in.c) {
		/* torch halves (whatever the scale) */
		u->i0 = IX(floordiv, o, K(c, 2));
		return 0;
	}
	bool f32 = !p->bil || acc != KILN_DT_F64;
	kiln_dtype_t ft = f32 ? KILN_DT_F32 : KILN_DT_F64;
	const sx_t *s, *inx = sx_index(c, ix_dim(c, in));
	const sx_t *outx = sx_index(c, ix_dim(c, out)), *one = I64(c, 1);
	double sv = 0;
	if (p->bil && p->ac) {
		/* (in-1)/(out-1), 0 for a single output */
		s = ratio(c, IX(sub, ix_dim(c, in), K(c, 1)),
			  IX(sub, ix_dim(c, out), K(c, 1)), ft, &sv);
		if (stat && out.c <= 1)
			s = sxf(c, sv = 0, ft);
		else if (!stat)
			s = sx_where(c, SB(GT, outx, one), s, sxf(c, 0, ft));
	} else if (p->has[a] && p->sc[a] > 0) {
		sv = f32 ? (double)(float)(1.0 / p->sc[a]) : 1.0 / p->sc[a];
		s = sxf(c, sv, ft);
	} else {
		s = ratio(c, ix_dim(c, in), ix_dim(c, out), ft, &sv);
	}
	/* the source position in float */
	const sx_t *of = sx_cast(c, sx_index(c, o), ft), *src;
	if (!p->bil || p->ac) {
		src = SB(MUL, s, of);
	} else {
		src = SB(SUB, SB(MUL, s, SB(ADD, of, sxf(c, 0.5, ft))),
			 sxf(c, 0.5, ft));
		src = SB(MAX, src, sxf(c, 0, ft));
	}
	int64_t fa, fd;
	const sx_t *i0s, *inm1 = SB(SUB, inx, one);
	if (stat && find_form(p, f32, sv, in.c, out.c, &fa, &fd)) {
		u->i0 = form_ix(c, p, fa, fd, o, in.c);
		u->i1 = IX(min, IX(add, u->i0, K(c, 1)), K(c, in.c - 1));
		i0s = sx_index(c, u->i0);
	} else {
		/* per element, as torch: min((int64)src, in - 1) */
		i0s = SB(MIN, sx_cast(c, src, KILN_DT_I64), inm1);
		u->s0 = i0s;
		u->s1 = SB(MIN, SB(ADD, i0s, one), inm1);
		if (!stat) {
			/* torch's shortcuts: out == in copies; nearest
			 * out == 2*in halves */
			const sx_t *oi = sx_index(c, o);
			const sx_t *two = I64(c, 2);
			if (!p->bil)
				u->s0 =
				    sx_where(c, SB(EQ, outx, SB(MUL, inx, two)),
					     SB(FLOORDIV, oi, two), u->s0);
			const sx_t *same = SB(EQ, outx, inx);
			u->s0 = sx_where(c, same, oi, u->s0);
			u->s1 = sx_where(c, same, oi, u->s1);
		}
	}
	if (p->bil) {
		/* l1 = clamp(src - i0, 0, 1) */
		const sx_t *l1 = SB(SUB, src, sx_cast(c, i0s, ft));
		l1 = sx_cast(
		    c, SB(MIN, SB(MAX, l1, sxf(c, 0, ft)), sxf(c, 1, ft)), acc);
		u->l1 =
		    stat ? l1
			 : sx_where(c, SB(EQ, outx, inx), sxf(c, 0, acc), l1);
	}
	return u->l1 != NULL || !p->bil ? 0 : -ENOMEM;
}

/* x[lead vars, h, w] (x 4-D); h and w are index expressions, or NULL with
 * i64 scalars sh / sw: then x must be a buffer, read at a data-dependent
 * offset. */
static const sx_t *load_hw(cctx_t *c, const lt_t *x, const kiln_expr_t *h,
			   const sx_t *sh, const kiln_expr_t *w, const sx_t *sw)
{
	const kiln_expr_t *idx[CIR_MAX_RANK];
	idx2(c, 2, h ? h : K(c, 0), w ? w : K(c, 0), idx);
	const sx_t *v = lt_at(c, x, idx);
	if ((h != NULL && w != NULL) || v == NULL || v->kind != SX_LOAD)
		return v;
	const sx_t *dyn = NULL;
	if (h == NULL)
		dyn = SB(MUL, sh, sx_index(c, ix_dim(c, x->strides[2])));
	if (w == NULL) {
		const sx_t *t =
		    SB(MUL, sw, sx_index(c, ix_dim(c, x->strides[3])));
		dyn = dyn ? SB(ADD, dyn, t) : t;
	}
	return sx_load(c, v->buf, v->idx, NULL, dyn);
}

/* A scale factor list (.vec) or a scale (float?) argument. */
static int up_scale(lnode_t *n, uint32_t pos, const char *name, bool *has,
		    double *sc)
{
	const kiln_arg_t *a = larg(n, pos, name);
	*has = a != NULL && a->kind != KILN_ARG_NIL;
	*sc = 0;
	return *has ? lfloat(n, pos, name, 0, sc) : 0;
}

/* upsample_nearest2d(self, output_size, scales_h?, scales_w?) (0) / .vec
 * (input, output_size?, scale_factors?) (1); upsample_bilinear2d(self,
 * output_size, align_corners, scales_h?, scales_w?) (2) / .vec(input,
 * output_size?, align_corners, scale_factors?) (3):
 *   nearest   out[n, c, oh, ow] = x[n, c, i0(oh), i0(ow)]
 *   bilinear  row(h) = x[h, i0w]*(1 - l1w) + x[h, i1w]*l1w;
 *             out = row(i0h)*(1 - l1h) + row(i1h)*l1h
 * with torch's source indices and weights (up_axis). */
int low_upsample(cctx_t *c, lnode_t *n)
{
	uparams_t p;
	memset(&p, 0, sizeof(p));
	p.bil = n->param >= 2;
	bool vec = n->param & 1;
	lt_t *x;
	TRY(ltensor(n, 0, vec ? "input" : "self", &x));
	if (p.bil)
		TRY(lbool(n, 2, "align_corners", false, &p.ac));
	if (x->rank != 4)
		return lerr(n, KILN_EINVGRAPH, "input must be 4-D, not %u-D",
			    x->rank);
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH, "input must be floating");
	/* the output size: output_size, or floor(in * scale_factor) (the
	 * declared size when in is symbolic) */
	kiln_dim_t out[2], sz[CIR_MAX_RANK];
	uint32_t r;
	TRY(lout_sizes(n, 0, &r, sz, NULL));
	if (r != 4)
		return lerr(n, KILN_EINVGRAPH, "out 0 must be 4-D");
	const kiln_arg_t *os = larg(n, 1, "output_size");
	const kiln_arg_t *sf =
	    vec ? larg(n, p.bil ? 3 : 2, "scale_factors") : NULL;
	bool has_os = os != NULL && os->kind != KILN_ARG_NIL;
	bool has_sf = sf != NULL && sf->kind != KILN_ARG_NIL;
	if (has_os == has_sf && (vec || !has_os))
		return lerr(n, KILN_EINVGRAPH,
			    "give exactly one of output_size and "
			    "scale_factors");
	if (has_os) {
		const kiln_expr_t *e[CIR_MAX_RANK];
		uint32_t ne;
		TRY(lsizelist(n, 1, "output_size", e, &ne));
		if (ne != 2)
			return lerr(n, KILN_EINVGRAPH,
				    "output_size must have 2 entries");
		out[0] = dim_of(e[0]);
		out[1] = dim_of(e[1]);
	}
	if (has_sf && (sf->kind != KILN_ARG_LIST || sf->n != 2))
		return lerr(n, KILN_EINVGRAPH,
			    "scale_factors must have 2 entries");
	for (int a = 0; has_sf && a < 2; a++) {
		const kiln_arg_t *e = &sf->u.list[a];
		p.sc[a] = e->kind == KILN_ARG_FLOAT ? e->u.f
			  : e->kind == KILN_ARG_INT ? (double)e->u.i
						    : 0;
		if (!(p.sc[a] > 0))
			return lerr(n, KILN_EINVGRAPH,
				    "scale_factors must be positive numbers");
		p.has[a] = true;
		kiln_dim_t in = x->sizes[2 + a];
		out[a] = dim_sym(in)
			     ? sz[2 + a]
			     : dim_const((int64_t)((double)in.c * p.sc[a]));
	}
	if (!vec) {
		uint32_t base = p.bil ? 3 : 2;
		TRY(up_scale(n, base, "scales_h", &p.has[0], &p.sc[0]));
		TRY(up_scale(n, base + 1, "scales_w", &p.has[1], &p.sc[1]));
	}
	for (int a = 0; a < 2; a++)
		if ((!dim_sym(out[a]) && out[a].c <= 0) ||
		    (!dim_sym(x->sizes[2 + a]) && x->sizes[2 + a].c <= 0))
			return lerr(n, KILN_EINVGRAPH,
				    "input and output sizes must be positive");
	shape2(x, out[0], out[1], sz);
	TRY(check_decl(n, 0, 4, sz));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	set_var_ranges(c, 4, sz);
	uaxis_t u[2];
	for (int a = 0; a < 2; a++) {
		TRY(up_axis(n, &p, a, x->sizes[2 + a], out[a], 2 + (uint32_t)a,
			    acc, &u[a]));
	}
	if ((u[0].i0 == NULL || u[1].i0 == NULL) && !x->is_buf) {
		TRY(lt_realize(c, x, (int32_t)n->index, &x));
	}
	const sx_t *v;
	if (!p.bil) {
		v = sx_cast(
		    c, load_hw(c, x, u[0].i0, u[0].s0, u[1].i0, u[1].s0), acc);
	} else {
		const sx_t *one = sxf(c, 1, acc);
		const sx_t *l1h = u[0].l1, *l1w = u[1].l1;
		const sx_t *l0h = SB(SUB, one, l1h);
		const sx_t *l0w = SB(SUB, one, l1w);
		const sx_t *row[2];
		for (int j = 0; j < 2; j++) {
			const kiln_expr_t *h = j ? u[0].i1 : u[0].i0;
			const sx_t *hs = j ? u[0].s1 : u[0].s0;
			const sx_t *a = sx_cast(
			    c, load_hw(c, x, h, hs, u[1].i0, u[1].s0), acc);
			const sx_t *b = sx_cast(
			    c, load_hw(c, x, h, hs, u[1].i1, u[1].s1), acc);
			row[j] = SB(ADD, SB(MUL, a, l0w), SB(MUL, b, l1w));
		}
		v = SB(ADD, SB(MUL, row[0], l0h), SB(MUL, row[1], l1h));
	}
	return lset(n, 0, lt_fn(c, odt, 4, sz, v));
}

/* ---- normalization ------------------------------------------------------- */

/* x as [N, C, HW], HW the product of the dims after C (1 for 2-D). */
static lt_t *as_nc3(cctx_t *c, const lt_t *x)
{
	kiln_dim_t sz[3] = {x->sizes[0], x->sizes[1], dim_const(1)};
	for (uint32_t k = 2; k < x->rank; k++)
		sz[2] = dim_mul(c, sz[2], x->sizes[k]);
	return lt_reshape(c, x, 3, sz);
}

/* [C] = sum over (n, hw) of f[n, c, hw] (f lazy [N, C, HW] in dtype acc):
 * a reduction over the trailing dims of the [C, N, HW] view. */
static int chan_sum(lnode_t *n, const lt_t *f, kiln_dtype_t acc, lt_t **out)
{
	cctx_t *c = n->c;
	kiln_dim_t sz[3] = {f->sizes[1], f->sizes[0], f->sizes[2]};
	set_var_ranges(c, 3, sz);
	const kiln_expr_t *idx[3] = {V(c, 1), V(c, 0), V(c, 2)};
	lt_t *t = lt_fn(c, acc, 3, sz, lt_at(c, f, idx));
	if (t == NULL)
		return -ENOMEM;
	return lred(n, t, 6u, false, RED_SUM, acc, out);
}

/* 1 / sqrt(v + eps) */
static const sx_t *inv_std(cctx_t *c, const sx_t *v, double eps,
			   kiln_dtype_t acc)
{
	return SB(DIV, sxf(c, 1, acc),
		  sx_un(c, OP_SQRT, SB(ADD, v, sxf(c, eps, acc))));
}

/* Zeros in the declared shape of output k (eval-mode save_mean/invstd). */
static int set_zeros(lnode_t *n, uint32_t k)
{
	uint32_t r;
	kiln_dim_t sz[CIR_MAX_RANK];
	kiln_dtype_t dt;
	int rc = lout_sizes(n, k, &r, sz, &dt);
	return rc != 0 ? rc
		       : lset(n, k, lt_fn(n->c, dt, r, sz, sxf(n->c, 0, dt)));
}

/* A normalization input: floating, [N, C, ...]. */
static int bn_input(lnode_t *n, const lt_t *x)
{
	if (x->rank < 2)
		return lerr(n, KILN_EINVGRAPH,
			    "input must have at least 2 dims (N, C, ...)");
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH, "input must be floating");
	return 0;
}

/* native_batch_norm(input, weight?, bias?, running_mean?, running_var?,
 * training, momentum, eps) (0) and _native_batch_norm_legit (same args)
 * (2) -> (out, save_mean, save_invstd); _native_batch_norm_legit_functional
 * (same args) (1) adds (running_mean', running_var');
 * _native_batch_norm_legit.no_stats(input, weight?, bias?, training,
 * momentum, eps) (3).
 *   training: mean[c] = sum(x)/n and var[c] = sum((x - mean)^2)/n over
 *     (N, HW), n = N*HW; invstd = 1/sqrt(var + eps);
 *     running' = momentum*stat + (1 - momentum)*running, with the unbiased
 *     var sum((x - mean)^2)/(n - 1);
 *   eval: mean = running_mean, invstd = 1/sqrt(running_var + eps); save_*
 *     as declared (empty), running' = running;
 *   out = (x - mean[c]) * invstd[c] * weight[c] + bias[c]. */
int low_batch_norm(cctx_t *c, lnode_t *n)
{
	lt_t *x, *w, *b, *rm = NULL, *rv = NULL;
	bool training = false;
	double mom, eps;
	bool stats = n->param != 3;
	uint32_t p = stats ? 5 : 3;
	TRY(ltensor(n, 0, "input", &x));
	TRY(ltensor_opt(n, 1, "weight", &w));
	TRY(ltensor_opt(n, 2, "bias", &b));
	if (stats)
		TRY(ltensor_opt(n, 3, "running_mean", &rm));
	if (stats)
		TRY(ltensor_opt(n, 4, "running_var", &rv));
	TRY(lbool(n, p, "training", false, &training));
	TRY(lfloat(n, p + 1, "momentum", 0.1, &mom));
	TRY(lfloat(n, p + 2, "eps", 1e-5, &eps));
	TRY(bn_input(n, x));
	if ((rm == NULL) != (rv == NULL))
		return lerr(n, KILN_EINVGRAPH,
			    "give both running_mean and running_var, or "
			    "neither");
	if (rm == NULL && (!training || n->param == 1 || n->param == 2))
		return lerr(n, KILN_EINVGRAPH,
			    "running_mean and running_var are required");
	kiln_dim_t C = x->sizes[1];
	TRY(need_vec(n, w, C, "weight"));
	TRY(need_vec(n, b, C, "bias"));
	TRY(need_vec(n, rm, C, "running_mean"));
	TRY(need_vec(n, rv, C, "running_var"));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *mean, *invstd, *vsum = NULL;
	const sx_t *cnt = NULL;
	if (training) {
		lt_t *x3 = as_nc3(c, x), *xf, *s1;
		if (x3 == NULL || (xf = as_dt(c, x3, acc)) == NULL)
			return -ENOMEM;
		TRY(chan_sum(n, xf, acc, &s1));
		cnt = sx_cast(c,
			      sx_index(c, IX(mul, ix_dim(c, xf->sizes[0]),
					     ix_dim(c, xf->sizes[2]))),
			      acc);
		set_var_ranges(c, 1, &C);
		mean = lt_fn(c, acc, 1, &C, SB(DIV, lt_body(c, s1), cnt));
		if (mean == NULL)
			return -ENOMEM;
		set_var_ranges(c, 3, xf->sizes);
		const kiln_expr_t *ch[1] = {V(c, 1)};
		const sx_t *d = SB(SUB, lt_body(c, xf), lt_at(c, mean, ch));
		lt_t *sq = lt_fn(c, acc, 3, xf->sizes, SB(MUL, d, d));
		if (sq == NULL)
			return -ENOMEM;
		TRY(chan_sum(n, sq, acc, &vsum));
		set_var_ranges(c, 1, &C);
		invstd =
		    lt_fn(c, acc, 1, &C,
			  inv_std(c, SB(DIV, lt_body(c, vsum), cnt), eps, acc));
	} else {
		mean = as_dt(c, rm, acc);
		invstd = lt_fn(
		    c, acc, 1, &C,
		    inv_std(c, sx_cast(c, lt_body(c, rv), acc), eps, acc));
	}
	if (mean == NULL || invstd == NULL)
		return -ENOMEM;
	set_var_ranges(c, x->rank, x->sizes);
	const kiln_expr_t *ch = V(c, 1);
	const sx_t *y = SB(
	    MUL,
	    SB(SUB, sx_cast(c, lt_body(c, x), acc), chv(c, mean, ch, 0, acc)),
	    chv(c, invstd, ch, 1, acc));
	if (w != NULL)
		y = SB(MUL, y, chv(c, w, ch, 1, acc));
	if (b != NULL)
		y = SB(ADD, y, chv(c, b, ch, 0, acc));
	TRY(lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, y)));
	for (uint32_t k = 1; k < 3 && k < n->n->n_out; k++)
		TRY(training ? lset(n, k, k == 1 ? mean : invstd)
			     : set_zeros(n, k));
	if (n->param != 1 || n->n->n_out < 5)
		return 0;
	/* the updated running statistics (momentum in the stats' dtype) */
	set_var_ranges(c, 1, &C);
	const sx_t *rmb = sx_cast(c, lt_body(c, rm), acc);
	const sx_t *rvb = sx_cast(c, lt_body(c, rv), acc);
	if (training) {
		double m = acc == KILN_DT_F64 ? mom : (double)(float)mom;
		double m1 =
		    acc == KILN_DT_F64 ? 1 - mom : (double)(1.0f - (float)mom);
		const sx_t *uv =
		    SB(DIV, lt_body(c, vsum), SB(SUB, cnt, sxf(c, 1, acc)));
		rmb = SB(ADD, SB(MUL, sxf(c, m, acc), lt_body(c, mean)),
			 SB(MUL, sxf(c, m1, acc), rmb));
		rvb = SB(ADD, SB(MUL, sxf(c, m, acc), uv),
			 SB(MUL, sxf(c, m1, acc), rvb));
	}
	TRY(lset(n, 3, lt_fn(c, acc, 1, &C, rmb)));
	return lset(n, 4, lt_fn(c, acc, 1, &C, rvb));
}

/* native_batch_norm_backward(grad_out, input, weight?, running_mean?,
 * running_var?, save_mean?, save_invstd?, train, eps, output_mask):
 * mean, invstd = save_mean, save_invstd (train) or running_mean,
 * 1/sqrt(running_var + eps); per channel sum = Σ g, dot = Σ (x - mean) g
 * over (N, HW), n = N*HW;
 *   train: gi = (g - sum/n - (x - mean) * dot*invstd²/n) * invstd * w
 *   eval:  gi = g * invstd * w
 *   grad_weight = dot * invstd; grad_bias = sum. */
int low_batch_norm_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x, *w, *rm, *rv, *sm, *si;
	bool train, m[3];
	double eps;
	TRY(ltensor(n, 0, "grad_out", &g));
	TRY(ltensor(n, 1, "input", &x));
	TRY(ltensor_opt(n, 2, "weight", &w));
	TRY(ltensor_opt(n, 3, "running_mean", &rm));
	TRY(ltensor_opt(n, 4, "running_var", &rv));
	TRY(ltensor_opt(n, 5, "save_mean", &sm));
	TRY(ltensor_opt(n, 6, "save_invstd", &si));
	TRY(lbool(n, 7, "train", false, &train));
	TRY(lfloat(n, 8, "eps", 1e-5, &eps));
	TRY(lmask3(n, 9, m));
	TRY(bn_input(n, x));
	TRY(need_shape(n, g, x->rank, x->sizes, "grad_out"));
	/* training reads grad_out three times (its sum, its dot with x,
	 * grad_input): a costly one is written once and read back. ResNet's
	 * stem, where it is max_pool2d's backward (four windows' gathers of
	 * the indices and the gradient, per element): its batch_norm backward
	 * row kernel took 4.1 ms and the pointwise kernel after it 3.7 (batch
	 * 8, 128²), every element evaluating the gathers again */
	if (train && !g->is_buf && sx_is_heavy(lt_body(c, g)))
		TRY(lt_realize(c, g, (int32_t)n->index, &g));
	kiln_dim_t C = x->sizes[1];
	const lt_t *vecs[5] = {w, rm, rv, sm, si};
	const char *names[5] = {"weight", "running_mean", "running_var",
				"save_mean", "save_invstd"};
	for (int i = 0; i < 5; i++)
		TRY(need_vec(n, vecs[i], C, names[i]));
	lt_t *mt = train ? sm : rm, *st = train ? si : rv;
	if (mt == NULL || st == NULL)
		return lerr(n, KILN_EINVGRAPH, "missing %s statistics",
			    train ? "saved" : "running");
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	set_var_ranges(c, 1, &C);
	lt_t *mean = as_dt(c, mt, acc);
	const sx_t *sb = sx_cast(c, lt_body(c, st), acc);
	lt_t *inv = lt_fn(c, acc, 1, &C, train ? sb : inv_std(c, sb, eps, acc));
	if (mean == NULL || inv == NULL)
		return -ENOMEM;
	lt_t *sg = NULL, *dot = NULL;
	const sx_t *cnt = NULL;
	if ((train && m[0]) || m[1] || m[2]) {
		lt_t *g3 = as_nc3(c, g), *x3 = as_nc3(c, x), *gf;
		if (g3 == NULL || x3 == NULL ||
		    (gf = as_dt(c, g3, acc)) == NULL)
			return -ENOMEM;
		TRY(chan_sum(n, gf, acc, &sg));
		set_var_ranges(c, 3, x3->sizes);
		const kiln_expr_t *ch[1] = {V(c, 1)};
		const sx_t *d = SB(SUB, sx_cast(c, lt_body(c, x3), acc),
				   lt_at(c, mean, ch));
		lt_t *dg =
		    lt_fn(c, acc, 3, x3->sizes, SB(MUL, d, lt_body(c, gf)));
		if (dg == NULL)
			return -ENOMEM;
		TRY(chan_sum(n, dg, acc, &dot));
		cnt = sx_cast(c,
			      sx_index(c, IX(mul, ix_dim(c, x3->sizes[0]),
					     ix_dim(c, x3->sizes[2]))),
			      acc);
	}
	if (m[0]) {
		set_var_ranges(c, x->rank, x->sizes);
		const kiln_expr_t *ch = V(c, 1);
		const sx_t *gb = sx_cast(c, lt_body(c, g), acc);
		const sx_t *ic = chv(c, inv, ch, 1, acc);
		const sx_t *gi = gb;
		if (train) {
			const sx_t *k = SB(
			    DIV,
			    SB(MUL, SB(MUL, chv(c, dot, ch, 0, acc), ic), ic),
			    cnt);
			const sx_t *xm = SB(SUB, sx_cast(c, lt_body(c, x), acc),
					    chv(c, mean, ch, 0, acc));
			gi = SB(
			    SUB,
			    SB(SUB, gb, SB(DIV, chv(c, sg, ch, 0, acc), cnt)),
			    SB(MUL, xm, k));
		}
		gi = SB(MUL, gi, ic);
		if (w != NULL)
			gi = SB(MUL, gi, chv(c, w, ch, 1, acc));
		TRY(lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, gi)));
	}
	set_var_ranges(c, 1, &C);
	if (m[1] && n->n->n_out > 1) {
		TRY(lset(n, 1,
			 lt_fn(c, acc, 1, &C,
			       SB(MUL, lt_body(c, dot), lt_body(c, inv)))));
	}
	if (m[2] && n->n->n_out > 2)
		return lset(n, 2, sg);
	return 0;
}

/* group_norm's N, C, HxW, group arguments (from pos on), checked against
 * x; *cpg = C / group. */
static int gn_args(lnode_t *n, const lt_t *x, uint32_t pos, int64_t *G,
		   kiln_dim_t *cpg)
{
	cctx_t *c = n->c;
	const kiln_expr_t *e[3];
	const char *names[3] = {"N", "C", "HxW"};
	TRY(bn_input(n, x));
	for (uint32_t i = 0; i < 3; i++)
		TRY(lsymint(n, larg(n, pos + i, names[i]), &e[i]));
	TRY(lint(n, pos + 3, "group", 0, G));
	kiln_dim_t hw = dim_const(1);
	for (uint32_t k = 2; k < x->rank; k++)
		hw = dim_mul(c, hw, x->sizes[k]);
	kiln_dim_t want[3] = {x->sizes[0], x->sizes[1], hw};
	for (uint32_t i = 0; i < 3; i++) {
		kiln_dim_t d = dim_of(e[i]);
		if (!dim_eq(d, want[i]))
			return lerr(n,
				    dim_sym(d) || dim_sym(want[i])
					? KILN_EUNSUPOP
					: KILN_EINVGRAPH,
				    "%s does not match the input", names[i]);
	}
	kiln_dim_t C = x->sizes[1];
	if (*G <= 0 || (!dim_sym(C) && C.c % *G != 0))
		return lerr(n, KILN_EINVGRAPH,
			    "group %lld must be positive and divide C",
			    (long long)*G);
	*cpg = dim_of(IX(floordiv, ix_dim(c, C), K(c, *G)));
	return 0;
}

/* f (lazy [N, C, HW]) as [N, G, C/G, HW]. */
static lt_t *as_groups(cctx_t *c, const lt_t *f, int64_t G, kiln_dim_t cpg)
{
	kiln_dim_t sz[4] = {f->sizes[0], dim_const(G), cpg, f->sizes[2]};
	set_var_ranges(c, 4, sz);
	const kiln_expr_t *idx[3] = {
	    V(c, 0), IX(add, IX(mul, V(c, 1), ix_dim(c, cpg)), V(c, 2)),
	    V(c, 3)};
	return lt_fn(c, f->dtype, 4, sz, lt_at(c, f, idx));
}

/* Element [n, c / cpg] of a per-(N, G) tensor, in dtype acc. */
static const sx_t *ng_at(cctx_t *c, const lt_t *t, const kiln_expr_t *nn,
			 const kiln_expr_t *ch, kiln_dim_t cpg,
			 kiln_dtype_t acc)
{
	const kiln_expr_t *idx[2] = {nn, IX(floordiv, ch, ix_dim(c, cpg))};
	return sx_cast(c, lt_at(c, t, idx), acc);
}

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) ->
 * (out, mean [N, G], rstd [N, G]): over each (n, group), D = C/G * HxW
 * elements: mean = sum(x)/D, var = sum((x - mean)^2)/D,
 * rstd = 1/sqrt(var + eps); out = (x - mean) * rstd * w[c] + b[c]. */
int low_group_norm(cctx_t *c, lnode_t *n)
{
	lt_t *x, *w, *b;
	int64_t G;
	kiln_dim_t cpg;
	double eps;
	TRY(ltensor(n, 0, "input", &x));
	TRY(ltensor_opt(n, 1, "weight", &w));
	TRY(ltensor_opt(n, 2, "bias", &b));
	TRY(lfloat(n, 7, "eps", 1e-5, &eps));
	TRY(gn_args(n, x, 3, &G, &cpg));
	TRY(need_vec(n, w, x->sizes[1], "weight"));
	TRY(need_vec(n, b, x->sizes[1], "bias"));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *x3 = as_nc3(c, x), *xf, *x4, *s1, *s2;
	if (x3 == NULL || (xf = as_dt(c, x3, acc)) == NULL ||
	    (x4 = as_groups(c, xf, G, cpg)) == NULL)
		return -ENOMEM;
	TRY(lred(n, x4, 12u, false, RED_SUM, acc, &s1));
	const sx_t *cnt = sx_cast(
	    c, sx_index(c, IX(mul, ix_dim(c, cpg), ix_dim(c, x3->sizes[2]))),
	    acc);
	lt_t *mean = lt_fn(c, acc, 2, s1->sizes, SB(DIV, lt_body(c, s1), cnt));
	if (mean == NULL)
		return -ENOMEM;
	set_var_ranges(c, 4, x4->sizes);
	const kiln_expr_t *ng[2] = {V(c, 0), V(c, 1)};
	const sx_t *d = SB(SUB, lt_body(c, x4), lt_at(c, mean, ng));
	lt_t *sq = lt_fn(c, acc, 4, x4->sizes, SB(MUL, d, d));
	if (sq == NULL)
		return -ENOMEM;
	TRY(lred(n, sq, 12u, false, RED_SUM, acc, &s2));
	set_var_ranges(c, 2, s2->sizes);
	const sx_t *var = SB(MAX, SB(DIV, lt_body(c, s2), cnt), sxf(c, 0, acc));
	lt_t *rstd = lt_fn(c, acc, 2, s2->sizes, inv_std(c, var, eps, acc));
	if (rstd == NULL)
		return -ENOMEM;
	set_var_ranges(c, x->rank, x->sizes);
	const kiln_expr_t *ch = V(c, 1);
	const sx_t *y = SB(MUL,
			   SB(SUB, sx_cast(c, lt_body(c, x), acc),
			      ng_at(c, mean, V(c, 0), ch, cpg, acc)),
			   ng_at(c, rstd, V(c, 0), ch, cpg, acc));
	if (w != NULL)
		y = SB(MUL, y, chv(c, w, ch, 1, acc));
	if (b != NULL)
		y = SB(ADD, y, chv(c, b, ch, 0, acc));
	TRY(lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, y)));
	if (n->n->n_out > 1)
		TRY(lset(n, 1, mean));
	return n->n->n_out > 2 ? lset(n, 2, rstd) : 0;
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
 * HxW, group, output_mask): with xhat = (x - mean) * rstd and
 * gw = g * w[c], over each (n, group) of D elements:
 *   gi = rstd * (gw - sum(gw)/D - xhat * sum(gw * xhat)/D)
 *   grad_weight[c] = Σ_{n,hw} g * xhat; grad_bias[c] = Σ_{n,hw} g. */
int low_group_norm_backward(cctx_t *c, lnode_t *n)
{
	lt_t *g, *x, *mean, *rstd, *w;
	int64_t G;
	kiln_dim_t cpg;
	bool m[3];
	TRY(ltensor(n, 0, "grad_out", &g));
	TRY(ltensor(n, 1, "input", &x));
	TRY(ltensor(n, 2, "mean", &mean));
	TRY(ltensor(n, 3, "rstd", &rstd));
	TRY(ltensor_opt(n, 4, "weight", &w));
	TRY(gn_args(n, x, 5, &G, &cpg));
	TRY(lmask3(n, 9, m));
	TRY(need_shape(n, g, x->rank, x->sizes, "grad_out"));
	TRY(need_vec(n, w, x->sizes[1], "weight"));
	kiln_dim_t ngs[2] = {x->sizes[0], dim_const(G)};
	TRY(need_shape(n, mean, 2, ngs, "mean"));
	TRY(need_shape(n, rstd, 2, ngs, "rstd"));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *x3 = as_nc3(c, x), *g3 = as_nc3(c, g);
	if (x3 == NULL || g3 == NULL)
		return -ENOMEM;
	/* xhat and g (times w) over [N, C, HW] */
	set_var_ranges(c, 3, x3->sizes);
	const kiln_expr_t *ch = V(c, 1);
	const sx_t *gb = sx_cast(c, lt_body(c, g3), acc);
	const sx_t *xh = SB(MUL,
			    SB(SUB, sx_cast(c, lt_body(c, x3), acc),
			       ng_at(c, mean, V(c, 0), ch, cpg, acc)),
			    ng_at(c, rstd, V(c, 0), ch, cpg, acc));
	const sx_t *gw = w ? SB(MUL, gb, chv(c, w, ch, 1, acc)) : gb;
	lt_t *gwt = lt_fn(c, acc, 3, x3->sizes, gw);
	lt_t *gwx = lt_fn(c, acc, 3, x3->sizes, SB(MUL, gw, xh));
	lt_t *gx = lt_fn(c, acc, 3, x3->sizes, SB(MUL, gb, xh));
	lt_t *gt = lt_fn(c, acc, 3, x3->sizes, gb);
	if (gwt == NULL || gwx == NULL || gx == NULL || gt == NULL)
		return -ENOMEM;
	if (m[0]) {
		lt_t *a4 = as_groups(c, gwt, G, cpg), *b4, *sa, *sb;
		if (a4 == NULL || (b4 = as_groups(c, gwx, G, cpg)) == NULL)
			return -ENOMEM;
		TRY(lred(n, a4, 12u, false, RED_SUM, acc, &sa));
		TRY(lred(n, b4, 12u, false, RED_SUM, acc, &sb));
		const sx_t *cnt =
		    sx_cast(c,
			    sx_index(c, IX(mul, ix_dim(c, cpg),
					   ix_dim(c, x3->sizes[2]))),
			    acc);
		set_var_ranges(c, x->rank, x->sizes);
		const kiln_expr_t *nn = V(c, 0), *cc = V(c, 1);
		const sx_t *rs = ng_at(c, rstd, nn, cc, cpg, acc);
		const sx_t *xhx = SB(MUL,
				     SB(SUB, sx_cast(c, lt_body(c, x), acc),
					ng_at(c, mean, nn, cc, cpg, acc)),
				     rs);
		const sx_t *gbx = sx_cast(c, lt_body(c, g), acc);
		const sx_t *gwx2 =
		    w ? SB(MUL, gbx, chv(c, w, cc, 1, acc)) : gbx;
		const sx_t *gi =
		    SB(MUL, rs,
		       SB(SUB,
			  SB(SUB, gwx2,
			     SB(DIV, ng_at(c, sa, nn, cc, cpg, acc), cnt)),
			  SB(MUL, xhx,
			     SB(DIV, ng_at(c, sb, nn, cc, cpg, acc), cnt))));
		TRY(lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, gi)));
	}
	if (m[1] && n->n->n_out > 1) {
		lt_t *s;
		TRY(chan_sum(n, gx, acc, &s));
		TRY(lset(n, 1, s));
	}
	if (m[2] && n->n->n_out > 2) {
		lt_t *s;
		TRY(chan_sum(n, gt, acc, &s));
		TRY(lset(n, 2, s));
	}
	return 0;
}
