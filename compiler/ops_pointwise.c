/*
 * ops_pointwise.c — lowering of pointwise ATen ops, conversions and tensor
 * creation: each becomes a lazy tensor whose body is a scalar expression of
 * its operands' bodies. dtypes follow PyTorch: the declared output dtype is
 * the result dtype (checked against result_type where it matters), and
 * f16/bf16 are computed in f32.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <math.h>
#include <string.h>

const sx_t *sxf(cctx_t *c, double v, kiln_dtype_t dt)
{
	return kiln_dtype_is_float(compute_dtype(dt))
		   ? sx_constf(c, v, dt)
		   : sx_consti(c, (int64_t)v, dt);
}

lt_t *lt_map1(cctx_t *c, sx_op_t op, const lt_t *a)
{
	return lt_fn(c, a->dtype, a->rank, a->sizes,
		     sx_un(c, op, lt_body(c, a)));
}

/* Declared dtype of output 0, or fallback. */
static kiln_dtype_t out_dt(lnode_t *n, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, 0);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

int low_unary(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	sx_op_t op = (sx_op_t)n->param;
	kiln_dtype_t odt = out_dt(n, x->dtype);
	const sx_t *v = lt_body(c, x);
	const sx_t *r;
	if (op == OP_NOT) {
		r = sx_un(c, OP_NOT, sx_cast(c, v, KILN_DT_BOOL));
	} else if (op == OP_ISNAN) {
		r = kiln_dtype_is_float(x->dtype)
			? sx_un(c, OP_ISNAN, v)
			: sx_consti(c, 0, KILN_DT_BOOL);
	} else if ((op == OP_FLOOR || op == OP_CEIL || op == OP_ROUND ||
		    op == OP_TRUNC) &&
		   !kiln_dtype_is_float(x->dtype)) {
		r = v;
	} else if (op == OP_BITNOT && x->dtype == KILN_DT_BOOL) {
		r = sx_un(c, OP_NOT, v);
	} else if (op == OP_ABS && x->dtype == KILN_DT_BOOL) {
		r = v;
	} else {
		r = sx_un(c, op, sx_cast(c, v, odt));
	}
	return lset(n, 0, lt_fn(c, odt, x->rank, x->sizes, r));
}

int low_round_decimals(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t d;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "decimals", 0, &d);
	if (rc != 0)
		return rc;
	const sx_t *v = lt_body(c, x);
	if (kiln_dtype_is_float(x->dtype) && d != 0) {
		double s = pow(10.0, (double)d);
		v = sx_bin(c, OP_DIV,
			   sx_un(c, OP_ROUND,
				 sx_bin(c, OP_MUL, v, sxf(c, s, x->dtype))),
			   sxf(c, s, x->dtype));
	} else if (kiln_dtype_is_float(x->dtype)) {
		v = sx_un(c, OP_ROUND, v);
	}
	return lset(n, 0, lt_fn(c, x->dtype, x->rank, x->sizes, v));
}

int low_relu(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	const sx_t *v = lt_body(c, x);
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, x->sizes,
			  sx_bin(c, OP_MAX, v, sxf(c, 0, x->dtype))));
}

int low_silu(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	const sx_t *v = lt_body(c, x);
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, x->sizes,
			  sx_bin(c, OP_MUL, v, sx_un(c, OP_SIGMOID, v))));
}

/* gelu(x): none: x/2 (1 + erf(x/√2)); tanh: x/2 (1 + tanh(√(2/π)(x +
 * 0.044715 x³))). */
const sx_t *sx_gelu(cctx_t *c, const sx_t *x, bool tanh_approx)
{
	kiln_dtype_t dt = x->dt;
	const sx_t *inner;
	if (tanh_approx) {
		const sx_t *x3 = sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, x, x), x);
		inner = sx_un(c, OP_TANH,
			      sx_bin(c, OP_MUL, sxf(c, 0.7978845608028654, dt),
				     sx_bin(c, OP_ADD, x,
					    sx_bin(c, OP_MUL,
						   sxf(c, 0.044715, dt), x3))));
	} else {
		/* x·Φ(x): Φ = (1 + erf(x/√2))/2 in one function (mathfn.c) */
		return sx_bin(c, OP_MUL, x, sx_un(c, OP_PHI, x));
	}
	return sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, x, sxf(c, 0.5, dt)),
		      sx_bin(c, OP_ADD, sxf(c, 1.0, dt), inner));
}

int low_gelu(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	const char *approx;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lstr(n, 1, "approximate", "none", &approx);
	if (rc != 0)
		return rc;
	if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "approximate must be \"none\" or \"tanh\"");
	const sx_t *v = sx_cast(c, lt_body(c, x), x->dtype);
	return lset(n, 0,
		    lt_fn(c, x->dtype, x->rank, x->sizes,
			  sx_gelu(c, v, approx[0] == 't')));
}

static const sx_t *clamp_sx(cctx_t *c, const sx_t *v, const sx_t *lo,
			    const sx_t *hi)
{
	if (lo != NULL)
		v = sx_bin(c, OP_MAX, v, lo);
	if (hi != NULL)
		v = sx_bin(c, OP_MIN, v, hi);
	return v;
}

int low_hardswish(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = x->dtype;
	const sx_t *v = lt_body(c, x);
	const sx_t *r6 = clamp_sx(c, sx_bin(c, OP_ADD, v, sxf(c, 3, dt)),
				  sxf(c, 0, dt), sxf(c, 6, dt));
	return lset(
	    n, 0,
	    lt_fn(c, dt, x->rank, x->sizes,
		  sx_bin(c, OP_DIV, sx_bin(c, OP_MUL, v, r6), sxf(c, 6, dt))));
}

int low_hardsigmoid(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = x->dtype;
	const sx_t *v = lt_body(c, x);
	const sx_t *r6 = clamp_sx(c, sx_bin(c, OP_ADD, v, sxf(c, 3, dt)),
				  sxf(c, 0, dt), sxf(c, 6, dt));
	return lset(n, 0,
		    lt_fn(c, dt, x->rank, x->sizes,
			  sx_bin(c, OP_DIV, r6, sxf(c, 6, dt))));
}

int low_leaky_relu(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	double slope;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lfloat(n, 1, "negative_slope", 0.01, &slope);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = x->dtype;
	const sx_t *v = lt_body(c, x);
	const sx_t *r = sx_where(c, sx_bin(c, OP_GT, v, sxf(c, 0, dt)), v,
				 sx_bin(c, OP_MUL, v, sxf(c, slope, dt)));
	return lset(n, 0, lt_fn(c, dt, x->rank, x->sizes, r));
}

const sx_t *sx_elu(cctx_t *c, const sx_t *v, double alpha, double scale,
		   double iscale, kiln_dtype_t dt)
{
	const sx_t *neg = sx_bin(
	    c, OP_MUL, sxf(c, alpha * scale, dt),
	    sx_un(c, OP_EXPM1, sx_bin(c, OP_MUL, v, sxf(c, iscale, dt))));
	return sx_where(c, sx_bin(c, OP_GT, v, sxf(c, 0, dt)),
			sx_bin(c, OP_MUL, v, sxf(c, scale, dt)), neg);
}

int low_elu(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	double alpha, scale, iscale;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lfloat(n, 1, "alpha", 1.0, &alpha);
	if (rc == 0)
		rc = lfloat(n, 2, "scale", 1.0, &scale);
	if (rc == 0)
		rc = lfloat(n, 3, "input_scale", 1.0, &iscale);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = x->dtype;
	return lset(n, 0,
		    lt_fn(c, dt, x->rank, x->sizes,
			  sx_elu(c, lt_body(c, x), alpha, scale, iscale, dt)));
}

int low_hardtanh(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	double lo, hi;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lfloat(n, 1, "min_val", -1.0, &lo);
	if (rc == 0)
		rc = lfloat(n, 2, "max_val", 1.0, &hi);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = x->dtype;
	return lset(
	    n, 0,
	    lt_fn(c, dt, x->rank, x->sizes,
		  clamp_sx(c, lt_body(c, x), sxf(c, lo, dt), sxf(c, hi, dt))));
}

/* clamp (0: scalars, 1: tensors), clamp_min (2), clamp_max (3). */
int low_clamp(cctx_t *c, lnode_t *n)
{
	operand_t ops[3];
	uint32_t n_ops = 1;
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc != 0)
		return rc;
	const kiln_arg_t *lo = NULL, *hi = NULL;
	int ilo = -1, ihi = -1;
	if (n->param == 0 || n->param == 1) {
		lo = larg(n, 1, "min");
		hi = larg(n, 2, "max");
	} else if (n->param == 2) {
		lo = larg(n, 1, "min");
	} else {
		hi = larg(n, 1, "max");
	}
	if (lo != NULL && lo->kind != KILN_ARG_NIL) {
		ilo = (int)n_ops;
		rc = loperand(n, n->param == 3 ? 99 : 1, "min", &ops[n_ops++]);
		if (rc != 0)
			return rc;
	}
	if (hi != NULL && hi->kind != KILN_ARG_NIL) {
		ihi = (int)n_ops;
		rc = loperand(n, n->param == 3 ? 1 : 2, "max", &ops[n_ops++]);
		if (rc != 0)
			return rc;
	}
	if (ilo < 0 && ihi < 0 && n->param <= 1)
		return lerr(n, KILN_EINVGRAPH,
			    "clamp needs at least one of min and max");
	rtype_t rt;
	rt_init(&rt);
	for (uint32_t i = 0; i < n_ops; i++)
		rt_operand(&rt, &ops[i]);
	kiln_dtype_t dt = out_dt(n, rt_result(&rt));
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, n_ops, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *v = lop_value(n, &ops[0], rank, sizes, dt);
	const sx_t *l =
	    ilo >= 0 ? lop_value(n, &ops[ilo], rank, sizes, dt) : NULL;
	const sx_t *h =
	    ihi >= 0 ? lop_value(n, &ops[ihi], rank, sizes, dt) : NULL;
	return lset(n, 0, lt_fn(c, dt, rank, sizes, clamp_sx(c, v, l, h)));
}

/* x ** p for a constant exponent, with the cheap cases unrolled. */
static const sx_t *pow_const(cctx_t *c, const sx_t *x, double p)
{
	kiln_dtype_t dt = x->dt;
	if (p == 1.0)
		return x;
	if (p == 2.0)
		return sx_bin(c, OP_MUL, x, x);
	if (p == 3.0)
		return sx_bin(c, OP_MUL, sx_bin(c, OP_MUL, x, x), x);
	if (kiln_dtype_is_float(dt)) {
		if (p == 0.5)
			return sx_un(c, OP_SQRT, x);
		if (p == -0.5)
			return sx_un(c, OP_RSQRT, x);
		if (p == -1.0)
			return sx_un(c, OP_RECIP, x);
		if (p == -2.0)
			return sx_un(c, OP_RECIP, sx_bin(c, OP_MUL, x, x));
	}
	if (p == 0.0)
		return sxf(c, 1.0, dt);
	return sx_bin(c, OP_POW, x, sxf(c, p, dt));
}

int low_binary(cctx_t *c, lnode_t *n)
{
	bool rev = n->param >= 1000;
	sx_op_t op = (sx_op_t)(rev ? n->param - 1000 : n->param);
	operand_t ops[2];
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "other", &ops[1]);
	if (rc != 0)
		return rc;
	if (strcmp(n->n->op, "aten.pow.Tensor_Scalar") == 0 ||
	    strcmp(n->n->op, "aten.pow.Scalar") == 0) {
		/* pow.Tensor_Scalar(self, exponent), pow.Scalar(self, exponent)
		 */
		rc = loperand(n, 1, "exponent", &ops[1]);
		if (rc != 0)
			return rc;
	}
	rtype_t rt;
	rt_init(&rt);
	rt_operand(&rt, &ops[0]);
	rt_operand(&rt, &ops[1]);
	kiln_dtype_t common = rt_result(&rt);
	bool is_cmp = sx_op_is_cmp(op);
	bool is_logic = op == OP_AND || op == OP_OR || op == OP_XOR;
	kiln_dtype_t odt =
	    out_dt(n, is_cmp || is_logic ? KILN_DT_BOOL : common);
	kiln_dtype_t cdt = is_cmp ? common : is_logic ? KILN_DT_BOOL : odt;
	if (op == OP_DIV && !kiln_dtype_is_float(compute_dtype(cdt)))
		cdt = KILN_DT_F32; /* true division of ints */
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *a = lop_value(n, &ops[0], rank, sizes, cdt);
	const sx_t *b = lop_value(n, &ops[1], rank, sizes, cdt);
	if (a == NULL || b == NULL)
		return -ENOMEM;
	/* a comparison happens in the common dtype: a scalar compared with
	 * an f16/bf16 tensor is rounded to it first (as torch does) */
	if (is_cmp && (cdt == KILN_DT_F16 || cdt == KILN_DT_BF16)) {
		if (ops[0].t == NULL)
			a = sx_cast(c, a, cdt);
		if (ops[1].t == NULL)
			b = sx_cast(c, b, cdt);
	}
	if (rev) {
		const sx_t *t = a;
		a = b;
		b = t;
	}
	const kiln_arg_t *alpha = larg(n, 2, "alpha");
	if ((op == OP_ADD || op == OP_SUB) && alpha != NULL &&
	    alpha->kind != KILN_ARG_NIL) {
		double av = alpha->kind == KILN_ARG_FLOAT ? alpha->u.f
			    : alpha->kind == KILN_ARG_INT ? (double)alpha->u.i
							  : 1.0;
		if (av != 1.0)
			b = sx_bin(c, OP_MUL, b, sxf(c, av, cdt));
	}
	const sx_t *r;
	if (op == OP_POW && ops[1].t == NULL && ops[0].t != NULL &&
	    (ops[1].arg->kind == KILN_ARG_FLOAT ||
	     ops[1].arg->kind == KILN_ARG_INT)) {
		double p = ops[1].arg->kind == KILN_ARG_FLOAT
			       ? ops[1].arg->u.f
			       : (double)ops[1].arg->u.i;
		r = pow_const(c, a, p);
	} else {
		r = sx_bin(c, op, a, b);
	}
	return lset(n, 0, lt_fn(c, odt, rank, sizes, r));
}

int low_div_mode(cctx_t *c, lnode_t *n)
{
	operand_t ops[2];
	const char *mode;
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "other", &ops[1]);
	if (rc == 0 && n->param == 1) /* floor_divide */
		mode = "floor";
	else if (rc == 0)
		rc = lstr(n, 2, "rounding_mode", NULL, &mode);
	if (rc != 0)
		return rc;
	rtype_t rt;
	rt_init(&rt);
	rt_operand(&rt, &ops[0]);
	rt_operand(&rt, &ops[1]);
	kiln_dtype_t odt = out_dt(n, rt_result(&rt));
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &rank, sizes);
	if (rc != 0)
		return rc;
	bool fl = kiln_dtype_is_float(odt);
	kiln_dtype_t cdt = mode == NULL && !fl ? KILN_DT_F32 : odt;
	const sx_t *a = lop_value(n, &ops[0], rank, sizes, cdt);
	const sx_t *b = lop_value(n, &ops[1], rank, sizes, cdt);
	const sx_t *r;
	if (mode == NULL)
		r = sx_bin(c, OP_DIV, a, b);
	else if (strcmp(mode, "trunc") == 0)
		r = fl ? sx_un(c, OP_TRUNC, sx_bin(c, OP_DIV, a, b))
		       : sx_bin(c, OP_TRUNCDIV, a, b);
	else if (strcmp(mode, "floor") == 0)
		r = fl ? sx_bin(c, OP_FLOORDIV, a, b)
		       : sx_bin(c, OP_FLOORDIV, a, b);
	else
		return lerr(n, KILN_EINVGRAPH,
			    "rounding_mode must be None, \"trunc\" or "
			    "\"floor\"");
	return lset(n, 0, lt_fn(c, odt, rank, sizes, r));
}

int low_where(cctx_t *c, lnode_t *n)
{
	operand_t ops[3];
	int rc = loperand(n, 0, "condition", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "self", &ops[1]);
	if (rc == 0)
		rc = loperand(n, 2, "other", &ops[2]);
	if (rc != 0)
		return rc;
	if (ops[0].t == NULL)
		return lerr(n, KILN_EINVGRAPH, "condition must be a tensor");
	rtype_t rt;
	rt_init(&rt);
	rt_operand(&rt, &ops[1]);
	rt_operand(&rt, &ops[2]);
	kiln_dtype_t odt = out_dt(n, rt_result(&rt));
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 3, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *cond = lop_value(n, &ops[0], rank, sizes, KILN_DT_BOOL);
	const sx_t *a = lop_value(n, &ops[1], rank, sizes, odt);
	const sx_t *b = lop_value(n, &ops[2], rank, sizes, odt);
	return lset(n, 0, lt_fn(c, odt, rank, sizes, sx_where(c, cond, a, b)));
}

int low_masked_fill(cctx_t *c, lnode_t *n)
{
	operand_t ops[3];
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "mask", &ops[1]);
	if (rc == 0)
		rc = loperand(n, 2, "value", &ops[2]);
	if (rc != 0)
		return rc;
	if (ops[0].t == NULL || ops[1].t == NULL)
		return lerr(n, KILN_EINVGRAPH, "self and mask must be tensors");
	kiln_dtype_t odt = ops[0].t->dtype;
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 3, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *x = lop_value(n, &ops[0], rank, sizes, odt);
	const sx_t *m = lop_value(n, &ops[1], rank, sizes, KILN_DT_BOOL);
	const sx_t *v = lop_value(n, &ops[2], rank, sizes, odt);
	return lset(n, 0, lt_fn(c, odt, rank, sizes, sx_where(c, m, v, x)));
}

/* e without additions of the float constant 0. x + 0 is x for every x but
 * -0: scaled_index strips them only around a converted non-negative
 * integer and its product by a positive constant, never -0. */
static const sx_t *strip_add0(const sx_t *e)
{
	while (e->kind == SX_BIN && e->op == OP_ADD) {
		const sx_t *k = e->a->kind == SX_CONST ? e->a : e->b;
		const sx_t *o = k == e->a ? e->b : e->a;
		if (k->kind != SX_CONST || k->k.f != 0.0)
			break;
		e = o;
	}
	return e;
}

/* An integer conversion of (f(v) + 0) · 2^-m, f(v) loop variable v of x
 * converted to a float (arange), v's extent static and at most 2^24 (so
 * f(v) is exact, and the product; truncating a value >= 0 is flooring):
 * the index v // 2^m, which codegen can follow. Nearest upsampling's
 * decomposition computes its source rows and columns so (by 2: (float(i)
 * + 0.0) * 0.5); as floats they were gathers' offsets, and the backward's
 * index_put could not see its windows. NULL where e is not that. */
static const sx_t *scaled_index(cctx_t *c, const lt_t *x, const sx_t *e)
{
	e = strip_add0(e);
	if (e->kind != SX_BIN || e->op != OP_MUL)
		return NULL;
	const sx_t *k = e->a->kind == SX_CONST ? e->a : e->b;
	const sx_t *y = k == e->a ? e->b : e->a;
	if (k->kind != SX_CONST || !kiln_dtype_is_float(k->dt))
		return NULL;
	int m = 0;
	while (m < 24 && ldexp(k->k.f, m) < 1.0)
		m++;
	if (ldexp(k->k.f, m) != 1.0)
		return NULL;
	y = strip_add0(y);
	if (y->kind != SX_CAST || y->a->kind != SX_INDEX ||
	    y->a->idx->kind != KILN_EX_VAR)
		return NULL;
	uint32_t v = y->a->idx->sym;
	if (v >= x->rank || x->sizes[v].e != NULL || x->sizes[v].c > (1 << 24))
		return NULL;
	return sx_index(c, ix_floordiv(c, y->a->idx, ix_const(c, 1 << m)));
}

int low_to_copy(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = out_dt(n, x->dtype);
	if (dt == x->dtype)
		return lset(n, 0, x);
	const sx_t *body = lt_body(c, x);
	if (body != NULL && kiln_dtype_is_float(body->dt) &&
	    (dt == KILN_DT_I64 || dt == KILN_DT_I32)) {
		set_var_ranges(c, x->rank, x->sizes);
		const sx_t *ix = scaled_index(c, x, body);
		if (ix != NULL)
			body = ix;
	}
	return lset(n, 0,
		    lt_fn(c, dt, x->rank, x->sizes, sx_cast(c, body, dt)));
}

int low_identity(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *x;
	int rc = ltensor(n, 0, "self", &x);
	if (rc != 0)
		return rc;
	return lset(n, 0, x);
}

int low_fill(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	operand_t v;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = loperand(n, 1, "value", &v);
	if (rc != 0)
		return rc;
	if (v.t != NULL && v.t->rank != 0) /* fill.Tensor */
		return lerr(n, KILN_EINVGRAPH,
			    "the fill value must be a number or a 0-dim "
			    "tensor");
	const sx_t *b = lop_value(n, &v, x->rank, x->sizes, x->dtype);
	return lset(n, 0, lt_fn(c, x->dtype, x->rank, x->sizes, b));
}

/* triu (param 0) and tril (1) (self, diagonal=0) over the last two dims:
 * x where column - row >= diagonal (triu) or <= diagonal (tril), else 0 */
int low_tri(cctx_t *c, lnode_t *n)
{
	lt_t *x;
	int64_t dg;
	int rc = ltensor(n, 0, "self", &x);
	if (rc == 0)
		rc = lint(n, 1, "diagonal", 0, &dg);
	if (rc != 0)
		return rc;
	if (x->rank < 2)
		return lerr(n, KILN_EINVGRAPH,
			    "input must have at least 2 dims");
	uint32_t r = x->rank;
	const sx_t *off = sx_bin(c, OP_SUB, sx_index(c, ix_var(c, r - 1)),
				 sx_index(c, ix_var(c, r - 2)));
	const sx_t *keep = sx_bin(c, n->param ? OP_LE : OP_GE, off,
				  sx_consti(c, dg, KILN_DT_I64));
	const sx_t *zero = kiln_dtype_is_float(x->dtype)
			       ? sxf(c, 0, x->dtype)
			       : sx_consti(c, 0, x->dtype);
	return lset(n, 0,
		    lt_fn(c, x->dtype, r, x->sizes,
			  sx_where(c, keep, lt_body(c, x), zero)));
}

/* lerp.Scalar and lerp.Tensor (self, end, weight), floats of one dtype:
 * torch's two-sided form, self + w·(end - self) where |w| < 0.5, else
 * end - (end - self)·(1 - w) */
int low_lerp(cctx_t *c, lnode_t *n)
{
	operand_t ops[3];
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "end", &ops[1]);
	if (rc == 0)
		rc = loperand(n, 2, "weight", &ops[2]);
	if (rc != 0)
		return rc;
	if (ops[0].t == NULL || ops[1].t == NULL ||
	    !kiln_dtype_is_float(ops[0].t->dtype) ||
	    ops[1].t->dtype != ops[0].t->dtype)
		return lerr(n, KILN_EINVGRAPH,
			    "takes floating tensors of one dtype");
	kiln_dtype_t dt = ops[0].t->dtype, cdt = compute_dtype(dt);
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 3, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *a = lop_value(n, &ops[0], rank, sizes, cdt);
	const sx_t *b = lop_value(n, &ops[1], rank, sizes, cdt);
	const sx_t *w = lop_value(n, &ops[2], rank, sizes, cdt);
	const sx_t *d = sx_bin(c, OP_SUB, b, a);
	const sx_t *lo = sx_bin(c, OP_ADD, a, sx_bin(c, OP_MUL, w, d));
	const sx_t *hi =
	    sx_bin(c, OP_SUB, b,
		   sx_bin(c, OP_MUL, d, sx_bin(c, OP_SUB, sxf(c, 1, cdt), w)));
	const sx_t *small =
	    sx_bin(c, OP_LT, sx_un(c, OP_ABS, w), sxf(c, 0.5, cdt));
	return lset(n, 0,
		    lt_fn(c, dt, rank, sizes, sx_where(c, small, lo, hi)));
}

/* addcmul (param 0) and addcdiv (1) (self, tensor1, tensor2, value=1):
 * self + value · (tensor1 ∘ tensor2), broadcast, in the operands' result
 * type (value joins it as a number); addcdiv of integers is refused, as
 * torch refuses it. */
int low_addcmul(cctx_t *c, lnode_t *n)
{
	operand_t ops[3];
	int rc = loperand(n, 0, "self", &ops[0]);
	if (rc == 0)
		rc = loperand(n, 1, "tensor1", &ops[1]);
	if (rc == 0)
		rc = loperand(n, 2, "tensor2", &ops[2]);
	if (rc != 0)
		return rc;
	const kiln_arg_t *va = larg(n, 3, "value");
	double value = 1;
	rc = lfloat(n, 3, "value", 1, &value);
	if (rc != 0)
		return rc;
	rtype_t rt;
	rt_init(&rt);
	for (int i = 0; i < 3; i++)
		rt_operand(&rt, &ops[i]);
	if (va != NULL && va->kind != KILN_ARG_NIL)
		rt_scalar(&rt, va);
	kiln_dtype_t odt = out_dt(n, rt_result(&rt));
	if (n->param == 1 && !kiln_dtype_is_float(odt))
		return lerr(n, KILN_EINVGRAPH,
			    "addcdiv of integer tensors is not supported "
			    "(torch refuses it too)");
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 3, &rank, sizes);
	if (rc != 0)
		return rc;
	kiln_dtype_t cdt = compute_dtype(odt);
	const sx_t *a = lop_value(n, &ops[0], rank, sizes, cdt);
	const sx_t *t1 = lop_value(n, &ops[1], rank, sizes, cdt);
	const sx_t *t2 = lop_value(n, &ops[2], rank, sizes, cdt);
	const sx_t *p = sx_bin(c, n->param ? OP_DIV : OP_MUL, t1, t2);
	if (value != 1)
		p = sx_bin(c, OP_MUL,
			   kiln_dtype_is_float(cdt)
			       ? sxf(c, value, cdt)
			       : sx_consti(c, (int64_t)value, cdt),
			   p);
	return lset(n, 0, lt_fn(c, odt, rank, sizes, sx_bin(c, OP_ADD, a, p)));
}

/* Whether the stride list at argument pos is row-major for sizes (a dim
 * of size 1 takes any stride). empty_strided and new_empty_strided are
 * taken only so: their values are undefined, but a later as_strided view
 * reads the storage, which kiln lays out row-major. AOTAutograd writes
 * new_empty_strided + copy for a clone (GhostNet's backward: 16 fallback
 * steps). */
static int row_major_strides(lnode_t *n, uint32_t pos, uint32_t rank,
			     const kiln_dim_t *sizes)
{
	const kiln_expr_t *st[CIR_MAX_RANK];
	uint32_t ns;
	int rc = lsizelist(n, pos, "stride", st, &ns);
	if (rc != 0)
		return rc;
	if (ns != rank)
		return lerr(n, KILN_EINVGRAPH,
			    "stride has %u entries for %u dims", ns, rank);
	kiln_dim_t want = dim_const(1);
	for (uint32_t k = rank; k-- > 0;) {
		if (!dim_is(sizes[k], 1) && !dim_eq(dim_of(st[k]), want))
			return lerr(n, KILN_EUNSUPOP,
				    "strides that are not row-major (dim %u)",
				    k);
		want = dim_mul(n->c, want, sizes[k]);
	}
	return 0;
}

/* full/zeros/ones/empty, new_*, *_like, scalar_tensor: the declared output
 * gives shape and dtype; the argument gives the value. */
int low_full(cctx_t *c, lnode_t *n)
{
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dtype_t dt;
	int rc = lout_sizes(n, 0, &rank, sizes, &dt);
	if (rc != 0)
		return rc;
	if (n->param == 13 || n->param == 14) {
		/* empty_strided(size, stride), new_empty_strided(self, size,
		 * stride): zeros */
		rc = row_major_strides(n, n->param == 13 ? 1 : 2, rank, sizes);
		if (rc != 0)
			return rc;
	}
	const sx_t *v = NULL;
	operand_t o;
	switch (n->param) {
	case 0: /* full(size, fill_value) */
	case 4: /* new_full(self, size, fill_value) */
	case 8: /* full_like(self, fill_value) */
		rc = loperand(n,
			      n->param == 0   ? 1
			      : n->param == 4 ? 2
					      : 1,
			      "fill_value", &o);
		if (rc != 0)
			return rc;
		if (o.t != NULL)
			return lerr(n, KILN_EINVGRAPH,
				    "fill_value must be a number");
		v = lop_value(n, &o, rank, sizes, dt);
		break;
	case 12: /* scalar_tensor(s) */
		rc = loperand(n, 0, "s", &o);
		if (rc != 0)
			return rc;
		v = lop_value(n, &o, rank, sizes, dt);
		break;
	case 2:
	case 6:
	case 10: v = sxf(c, 1.0, dt); break;
	default: /* zeros, empty: zeros */ v = sxf(c, 0.0, dt); break;
	}
	return lset(n, 0, lt_fn(c, dt, rank, sizes, v));
}

int low_arange(cctx_t *c, lnode_t *n)
{
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	kiln_dtype_t dt;
	int rc = lout_sizes(n, 0, &rank, sizes, &dt);
	if (rc != 0)
		return rc;
	if (rank != 1)
		return lerr(n, KILN_EINVGRAPH, "arange must give rank 1");
	double start = 0, step = 1;
	if (n->param >= 1)
		rc = lfloat(n, 0, "start", 0, &start);
	if (rc == 0 && n->param == 2)
		rc = lfloat(n, 2, "step", 1, &step);
	if (rc != 0)
		return rc;
	const kiln_arg_t *endarg = larg(n, n->param == 0 ? 0 : 1, "end");
	if (endarg != NULL && endarg->kind != KILN_ARG_SYM &&
	    endarg->kind != KILN_ARG_NIL) {
		double end;
		rc = lfloat(n, n->param == 0 ? 0 : 1, "end", 0, &end);
		if (rc != 0)
			return rc;
		if (step == 0)
			return lerr(n, KILN_EINVGRAPH, "arange step is 0");
		double len = ceil((end - start) / step);
		if (len < 0)
			len = 0;
		if (!dim_is(sizes[0], (int64_t)len))
			return lerr(n, KILN_EINVGRAPH,
				    "arange gives %lld elements but out 0 "
				    "declares another size",
				    (long long)len);
	}
	const sx_t *i = sx_index(c, ix_var(c, 0));
	const sx_t *v;
	if (kiln_dtype_is_float(dt)) {
		kiln_dtype_t cdt = compute_dtype(dt) == KILN_DT_F64
				       ? KILN_DT_F64
				       : KILN_DT_F32;
		v = sx_bin(
		    c, OP_ADD, sxf(c, start, cdt),
		    sx_bin(c, OP_MUL, sx_cast(c, i, cdt), sxf(c, step, cdt)));
	} else {
		v = sx_bin(c, OP_ADD, sx_consti(c, (int64_t)start, KILN_DT_I64),
			   sx_bin(c, OP_MUL, i,
				  sx_consti(c, (int64_t)step, KILN_DT_I64)));
	}
	return lset(n, 0, lt_fn(c, dt, 1, sizes, sx_cast(c, v, dt)));
}
