/*
 * ops_reduce.c — reductions. Each becomes a compute node over the input's
 * full index space with the reduced dims marked; its prologue (the lazy
 * body of the input) is fused into it by construction, and its consumers are
 * fused as epilogues by the scheduler. Index reductions (argmax, max.dim)
 * index the reduced dims in row-major order, first occurrence on ties.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <math.h>
#include <string.h>

int ldims_mask(lnode_t *n, uint32_t pos, const char *name, uint32_t rank,
	       uint32_t *mask)
{
	int64_t dims[CIR_MAX_RANK];
	uint32_t nd = 0;
	const kiln_arg_t *a = larg(n, pos, name);
	if (a != NULL && a->kind != KILN_ARG_NIL) {
		int rc = lintlist(n, pos, name, dims, &nd, CIR_MAX_RANK);
		if (rc != 0)
			return rc;
	}
	*mask = 0;
	if (nd == 0) {
		*mask = rank == 0 ? 0 : (uint32_t)((1ull << rank) - 1);
		return 0;
	}
	for (uint32_t i = 0; i < nd; i++) {
		uint32_t d;
		int rc = ldim(n, dims[i], rank, &d);
		if (rc != 0)
			return rc;
		if (rank == 0)
			continue;
		if (*mask >> d & 1)
			return lerr(n, KILN_EINVGRAPH,
				    "dim %u appears twice in the dim list", d);
		*mask |= 1u << d;
	}
	return 0;
}

int lred(lnode_t *n, const lt_t *t, uint32_t rmask, bool keepdim, red_op_t op,
	 kiln_dtype_t out_dt, lt_t **out)
{
	cctx_t *c = n->c;
	if (t->rank == 0) {
		/* reducing a scalar: the value itself */
		const sx_t *b = lt_body(c, t);
		if (op == RED_ARGMAX || op == RED_ARGMIN)
			b = sx_consti(c, 0, KILN_DT_I64);
		*out = lt_fn(c, out_dt, 0, NULL, sx_cast(c, b, out_dt));
		return *out ? 0 : -ENOMEM;
	}
	return lt_reduce(c, t, rmask, keepdim, op, out_dt, NULL,
			 (int32_t)n->index, out);
}

const kiln_expr_t *lred_count(cctx_t *c, const lt_t *t, uint32_t rmask)
{
	const kiln_expr_t *e = ix_const(c, 1);
	for (uint32_t k = 0; k < t->rank; k++)
		if (rmask >> k & 1)
			e = ix_mul(c, e, ix_dim(c, t->sizes[k]));
	return e;
}

static kiln_dtype_t decl_dt(lnode_t *n, uint32_t k, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, k);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

/* Whether the overload takes (self, dim, keepdim, ...) or only (self, ...). */
static bool has_dims(lnode_t *n)
{
	return strstr(n->n->op, ".default") == NULL ||
	       strcmp(n->n->op, "aten.amax.default") == 0 ||
	       strcmp(n->n->op, "aten.amin.default") == 0 ||
	       strcmp(n->n->op, "aten.argmax.default") == 0 ||
	       strcmp(n->n->op, "aten.argmin.default") == 0 ||
	       strcmp(n->n->op, "aten.logsumexp.default") == 0;
}

int low_reduce(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	red_op_t op = (red_op_t)n->param;
	uint32_t mask;
	bool keepdim = false;
	if (has_dims(n)) {
		rc = ldims_mask(n, 1, "dim", x->rank, &mask);
		if (rc == 0)
			rc = lbool(n, 2, "keepdim", false, &keepdim);
		if (rc != 0)
			return rc;
	} else {
		mask = x->rank == 0 ? 0 : (uint32_t)((1ull << x->rank) - 1);
	}
	kiln_dtype_t odt;
	switch (op) {
	case RED_SUM:
	case RED_PROD:
		odt = decl_dt(n, 0,
			      kiln_dtype_is_float(x->dtype) ? x->dtype
							    : KILN_DT_I64);
		break;
	case RED_ANY:
	case RED_ALL: odt = decl_dt(n, 0, KILN_DT_BOOL); break;
	default:
		odt = x->dtype;
		if ((op == RED_MAX || op == RED_MIN) && x->rank > 0) {
			for (uint32_t k = 0; k < x->rank; k++)
				if ((mask >> k & 1) && dim_is(x->sizes[k], 0))
					return lerr(n, KILN_EINVGRAPH,
						    "max/min of an empty "
						    "dimension");
		}
		break;
	}
	lt_t *src = x;
	kiln_dtype_t acc = op == RED_ANY || op == RED_ALL   ? KILN_DT_BOOL
			   : op == RED_MAX || op == RED_MIN ? x->dtype
							    : odt;
	if (compute_dtype(acc) != compute_dtype(x->dtype)) {
		src = lt_fn(c, acc, x->rank, x->sizes,
			    sx_cast(c, lt_body(c, x), acc));
		if (src == NULL)
			return -ENOMEM;
	}
	lt_t *r;
	rc = lred(n, src, mask, keepdim, op, odt, &r);
	if (rc != 0)
		return rc;
	return lset(n, 0, r);
}

/* linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None),
 * floats: over |x| in the result's compute dtype, sqrt(Σ x²) (ord 2),
 * Σ |x| (1), max |x| (inf), min |x| (-inf), the count of non-zeros (0),
 * else (Σ |x|^ord)^(1/ord) */
int low_vector_norm(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	double ord;
	uint32_t mask;
	bool keepdim;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lfloat(n, 1, "ord", 2, &ord);
	if (rc == 0)
		rc = ldims_mask(n, 2, "dim", x->rank, &mask);
	if (rc == 0)
		rc = lbool(n, 3, "keepdim", false, &keepdim);
	if (rc != 0)
		return rc;
	if (!kiln_dtype_is_float(x->dtype))
		return lerr(n, KILN_EINVGRAPH,
			    "linalg_vector_norm takes floating tensors, not %s",
			    kiln_dtype_name(x->dtype));
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype), acc = compute_dtype(odt);
	if (isinf(ord))
		for (uint32_t k = 0; k < x->rank; k++)
			if ((mask >> k & 1) && dim_is(x->sizes[k], 0))
				return lerr(n, KILN_EINVGRAPH,
					    "max/min of an empty dimension");
	const sx_t *a = sx_un(c, OP_ABS, sx_cast(c, lt_body(c, x), acc));
	red_op_t op = RED_SUM;
	if (isinf(ord))
		op = ord > 0 ? RED_MAX : RED_MIN;
	else if (ord == 0)
		a = sx_cast(c, sx_bin(c, OP_NE, a, sxf(c, 0, acc)), acc);
	else if (ord == 2)
		a = sx_bin(c, OP_MUL, a, a);
	else if (ord != 1)
		a = sx_bin(c, OP_POW, a, sxf(c, ord, acc));
	lt_t *t = lt_fn(c, acc, x->rank, x->sizes, a), *r;
	if (t == NULL)
		return -ENOMEM;
	rc = lred(n, t, mask, keepdim, op, acc, &r);
	if (rc != 0)
		return rc;
	const sx_t *v = lt_body(c, r);
	if (ord == 2)
		v = sx_un(c, OP_SQRT, v);
	else if (!isinf(ord) && ord != 0 && ord != 1)
		v = sx_bin(c, OP_POW, v, sxf(c, 1 / ord, acc));
	return lset(n, 0, lt_fn(c, odt, r->rank, r->sizes, v));
}

int low_argred(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	const kiln_arg_t *da = larg(n, 1, "dim");
	bool keepdim;
	rc = lbool(n, 2, "keepdim", false, &keepdim);
	if (rc != 0)
		return rc;
	uint32_t mask;
	if (da == NULL || da->kind == KILN_ARG_NIL) {
		mask = x->rank == 0 ? 0 : (uint32_t)((1ull << x->rank) - 1);
	} else {
		int64_t d;
		uint32_t ud;
		rc = lint(n, 1, "dim", 0, &d);
		if (rc == 0)
			rc = ldim(n, d, x->rank, &ud);
		if (rc != 0)
			return rc;
		mask = x->rank == 0 ? 0 : 1u << ud;
	}
	lt_t *r;
	rc = lred(n, x, mask, keepdim, (red_op_t)n->param, KILN_DT_I64, &r);
	if (rc != 0)
		return rc;
	return lset(n, 0, r);
}

int low_maxmin_dim(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *x;
	int64_t d;
	bool keepdim;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "dim", 0, &d);
	if (rc == 0)
		rc = lbool(n, 2, "keepdim", false, &keepdim);
	if (rc != 0)
		return rc;
	uint32_t ud;
	rc = ldim(n, d, x->rank, &ud);
	if (rc != 0)
		return rc;
	uint32_t mask = x->rank == 0 ? 0 : 1u << ud;
	if (x->rank > 0 && dim_is(x->sizes[ud], 0))
		return lerr(n, KILN_EINVGRAPH, "max/min of an empty dimension");
	lt_t *v, *i;
	red_op_t vop = (red_op_t)n->param;
	red_op_t iop = vop == RED_MAX ? RED_ARGMAX : RED_ARGMIN;
	rc = lred(n, x, mask, keepdim, vop, x->dtype, &v);
	if (rc == 0)
		rc = lred(n, x, mask, keepdim, iop, KILN_DT_I64, &i);
	if (rc == 0)
		rc = lset(n, 0, v);
	if (rc == 0)
		rc = lset(n, 1, i);
	return rc;
}

/* mean: sum in a wide-enough dtype, then divide. */
int low_mean(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t mask;
	bool keepdim = false;
	if (strcmp(n->n->op, "aten.mean.dim") == 0) {
		rc = ldims_mask(n, 1, "dim", x->rank, &mask);
		if (rc == 0)
			rc = lbool(n, 2, "keepdim", false, &keepdim);
		if (rc != 0)
			return rc;
	} else {
		mask = x->rank == 0 ? 0 : (uint32_t)((1ull << x->rank) - 1);
	}
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	if (!kiln_dtype_is_float(odt))
		return lerr(n, KILN_EINVGRAPH,
			    "mean needs a floating dtype, not %s",
			    kiln_dtype_name(odt));
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *src =
	    lt_fn(c, acc, x->rank, x->sizes, sx_cast(c, lt_body(c, x), acc));
	lt_t *s;
	if (src == NULL)
		return -ENOMEM;
	rc = lred(n, src, mask, keepdim, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	const sx_t *cnt = sx_cast(c, sx_index(c, lred_count(c, x, mask)), acc);
	const sx_t *b = sx_bin(c, OP_DIV, lt_body(c, s), cnt);
	return lset(n, 0, lt_fn(c, odt, s->rank, s->sizes, b));
}

/* var (0) / std (1) with correction: two passes (mean, then squares). */
int lvar(lnode_t *n, const lt_t *x, uint32_t mask, bool keepdim,
	 double correction, bool take_sqrt, kiln_dtype_t odt, lt_t **out,
	 lt_t **mean_out)
{
	cctx_t *c = n->c;
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *src =
	    lt_fn(c, acc, x->rank, x->sizes, sx_cast(c, lt_body(c, x), acc));
	lt_t *s;
	if (src == NULL)
		return -ENOMEM;
	int rc = lred(n, src, mask, true, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	const kiln_expr_t *cnt = lred_count(c, x, mask);
	const sx_t *nf = sx_cast(c, sx_index(c, cnt), acc);
	lt_t *mean = lt_fn(c, acc, s->rank, s->sizes,
			   sx_bin(c, OP_DIV, lt_body(c, s), nf));
	if (mean == NULL)
		return -ENOMEM;
	const sx_t *d = sx_bin(c, OP_SUB, lt_body(c, src),
			       lt_bcast_body(c, mean, x->rank, x->sizes));
	lt_t *sq = lt_fn(c, acc, x->rank, x->sizes, sx_bin(c, OP_MUL, d, d));
	lt_t *ss;
	if (sq == NULL)
		return -ENOMEM;
	rc = lred(n, sq, mask, keepdim, RED_SUM, acc, &ss);
	if (rc != 0)
		return rc;
	const sx_t *den = sx_bin(c, OP_SUB, nf, sxf(c, correction, acc));
	den = sx_bin(c, OP_MAX, den, sxf(c, 0, acc));
	const sx_t *v = sx_bin(c, OP_DIV, lt_body(c, ss), den);
	if (take_sqrt)
		v = sx_un(c, OP_SQRT, v);
	*out = lt_fn(c, odt, ss->rank, ss->sizes, v);
	if (mean_out != NULL)
		*mean_out = mean;
	return *out ? 0 : -ENOMEM;
}

int low_var(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	uint32_t mask;
	bool keepdim;
	double corr;
	rc = ldims_mask(n, 1, "dim", x->rank, &mask);
	if (rc == 0)
		rc = lfloat(n, 99, "correction", 1.0, &corr);
	if (rc == 0)
		rc = lbool(n, 99, "keepdim", false, &keepdim);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	if (!kiln_dtype_is_float(odt))
		return lerr(n, KILN_EINVGRAPH, "var/std need a floating dtype");
	lt_t *r;
	rc = lvar(n, x, mask, keepdim, corr, n->param == 1, odt, &r, NULL);
	if (rc != 0)
		return rc;
	return lset(n, 0, r);
}

int low_logsumexp(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	bool keepdim;
	uint32_t mask;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = ldims_mask(n, 1, "dim", x->rank, &mask);
	if (rc == 0)
		rc = lbool(n, 2, "keepdim", false, &keepdim);
	if (rc != 0)
		return rc;
	kiln_dtype_t odt = decl_dt(n, 0, x->dtype);
	kiln_dtype_t acc = compute_dtype(odt);
	lt_t *src =
	    lt_fn(c, acc, x->rank, x->sizes, sx_cast(c, lt_body(c, x), acc));
	lt_t *m;
	if (src == NULL)
		return -ENOMEM;
	rc = lred(n, src, mask, true, RED_MAXNP, acc, &m);
	if (rc != 0)
		return rc;
	/* an infinite max (all -inf, or +inf present) shifts by 0 instead */
	const sx_t *mb = lt_body(c, m);
	const sx_t *inf = sx_bin(c, OP_EQ, sx_un(c, OP_ABS, mb),
				 sxf(c, __builtin_inf(), acc));
	lt_t *ms = lt_fn(c, acc, m->rank, m->sizes,
			 sx_where(c, inf, sxf(c, 0, acc), mb));
	if (ms == NULL)
		return -ENOMEM;
	const sx_t *e = sx_un(c, OP_EXP,
			      sx_bin(c, OP_SUB, lt_body(c, src),
				     lt_bcast_body(c, ms, x->rank, x->sizes)));
	lt_t *et = lt_fn(c, acc, x->rank, x->sizes, e);
	lt_t *s;
	if (et == NULL)
		return -ENOMEM;
	rc = lred(n, et, mask, true, RED_SUM, acc, &s);
	if (rc != 0)
		return rc;
	lt_t *r = lt_fn(
	    c, odt, s->rank, s->sizes,
	    sx_bin(c, OP_ADD, sx_un(c, OP_LOG, lt_body(c, s)), lt_body(c, ms)));
	if (r == NULL)
		return -ENOMEM;
	if (!keepdim)
		for (uint32_t k = x->rank; k-- > 0 && r;)
			if (mask >> k & 1)
				r = lt_squeeze_dim(c, r, k);
	return lset(n, 0, r);
}
