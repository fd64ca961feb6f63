/*
 * interp.c — the reference interpreter: evaluates a Graph v1 op by op,
 * naively, in f64 for floating dtypes and int64 for integers and bool. It is
 * the oracle of the compiler's tests (compiler.h has the contract).
 *
 * This file holds the value machinery (interp_internal.h says how values are
 * represented), argument decoding, PyTorch's type promotion, symbol binding
 * and input checking, the run loop with its per-node output check, and the
 * op table. The ops live in interp_pw.c (pointwise, creation), interp_ops.c
 * (reductions, softmax, norms), interp_view.c (views and layout),
 * interp_nn.c (matmul, indexing, losses) and interp_conv.c (convolution,
 * pooling, upsampling, attention).
 *
 * Semantics follow PyTorch: result dtypes by torch's promotion rules, and a
 * node whose computed dtype or shape differs from its declared out spec is
 * an invalid graph. Floating results are rounded to their dtype at every
 * node output (so an f16 graph sees f16 values, as torch's does); scalars
 * combined with f16/bf16 tensors are kept in f32 (torch's opmath) for
 * arithmetic and rounded to the common dtype for comparisons.
 *
 * Threads: any thread; a run shares nothing with another run.
 */
#include "compiler/cir.h"
#include "compiler/interp_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors                                                                     */
/* ------------------------------------------------------------------------ */

static int vfail(ictx_t *c, int code, const char *fmt, va_list ap)
{
	if (c->err != NULL && c->errlen > 0) {
		int k = snprintf(c->err, c->errlen, "node %u (%s): ", c->ni,
				 c->nd->op);
		if (k >= 0 && (size_t)k < c->errlen)
			vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
	}
	return code;
}

int kiln__i_bad(ictx_t *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(c, KILN_EINVGRAPH, fmt, ap);
	va_end(ap);
	return rc;
}

int kiln__i_unsup(ictx_t *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(c, KILN_EUNSUPOP, fmt, ap);
	va_end(ap);
	return rc;
}

int kiln__i_oom(ictx_t *c)
{
	kiln__errf(c->err, c->errlen, -ENOMEM, "node %u (%s): out of memory",
		   c->ni, c->nd->op);
	return -ENOMEM;
}

void kiln__i_fmt_shape(char *buf, size_t n, uint32_t rank, const int64_t *size)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (uint32_t d = 0; d < rank && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "",
				      (long long)size[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* ------------------------------------------------------------------------ */
/* Values                                                                     */
/* ------------------------------------------------------------------------ */

double kiln__i_round(kiln_dtype_t dt, double v)
{
	switch (dt) {
	case KILN_DT_F32: return (double)(float)v;
	case KILN_DT_F16:
	case KILN_DT_BF16: {
		/* round to nearest even with 10 (f16) or 7 (bf16) mantissa bits
		 * and the format's exponent range */
		int mbits = dt == KILN_DT_F16 ? 10 : 7;
		int emin = dt == KILN_DT_F16 ? -14 : -126;
		double maxv =
		    dt == KILN_DT_F16 ? 65504.0 : 3.3895313892515355e38;
		if (isnan(v) || isinf(v) || v == 0)
			return v;
		int e;
		frexp(v, &e); /* v = m * 2^e, 0.5 <= |m| < 1 */
		e -= 1;	      /* v = m' * 2^e, 1 <= |m'| < 2 */
		if (e < emin)
			e = emin;
		double q = ldexp(nearbyint(ldexp(v, mbits - e)), e - mbits);
		if (fabs(q) > maxv) {
			/* beyond the largest finite: rounds to inf unless it is
			 * below max + half an ulp */
			double ulp =
			    ldexp(1.0, (dt == KILN_DT_F16 ? 15 : 127) - mbits);
			if (fabs(v) >= maxv + ulp / 2)
				return copysign(INFINITY, v);
			return copysign(maxv, v);
		}
		return q;
	}
	default: return v;
	}
}

int64_t kiln__i_wrap(kiln_dtype_t dt, int64_t v)
{
	switch (dt) {
	case KILN_DT_I8: return (int8_t)(uint8_t)v;
	case KILN_DT_U8: return (uint8_t)v;
	case KILN_DT_I16: return (int16_t)(uint16_t)v;
	case KILN_DT_I32: return (int32_t)(uint32_t)v;
	case KILN_DT_BOOL: return v != 0;
	default: return v;
	}
}

int64_t kiln__i_f2i(double v)
{
	if (isnan(v))
		return 0;
	if (v >= 9.2233720368547758e18)
		return INT64_MAX;
	if (v <= -9.2233720368547758e18)
		return INT64_MIN;
	return (int64_t)v;
}

int64_t kiln__i_numel_of(uint32_t rank, const int64_t *size)
{
	int64_t n = 1;
	for (uint32_t d = 0; d < rank; d++)
		if (__builtin_mul_overflow(n, size[d], &n))
			return INT64_MAX; /* saturates: every limit check fails
					   */
	return n;
}

int kiln__i_check_numel(ictx_t *c, uint32_t rank, const int64_t *size)
{
	for (uint32_t d = 0; d < rank; d++)
		if (size[d] < 0)
			return kiln__i_bad(c, "negative size %lld",
					   (long long)size[d]);
	if (kiln__i_numel_of(rank, size) > KI_MAX_ELEMS)
		return kiln__i_bad(c, "tensor too large for the interpreter");
	return 0;
}

int64_t kiln__i_numel(const it_t *t)
{
	return kiln__i_numel_of(t->rank, t->size);
}

void kiln__i_contig_strides(uint32_t rank, const int64_t *size, int64_t *st)
{
	int64_t s = 1;
	for (uint32_t d = rank; d-- > 0;) {
		st[d] = s;
		if (size[d] > 1 && __builtin_mul_overflow(s, size[d], &s))
			s = INT64_MAX; /* only for zero-size shapes: never read
					*/
	}
}

/* A buffer of n elements (zeroed) of the storage kind dt needs. */
static kiln__ibuf_t *buf_new(kiln_dtype_t dt, int64_t n)
{
	kiln__ibuf_t *b = calloc(1, sizeof(*b));
	if (b == NULL)
		return NULL;
	size_t cnt = n > 0 ? (size_t)n : 1;
	if (ki_isf(dt))
		b->f = calloc(cnt, sizeof(double));
	else
		b->i = calloc(cnt, sizeof(int64_t));
	if (b->f == NULL && b->i == NULL) {
		free(b);
		return NULL;
	}
	b->refs = 1;
	b->n = n;
	return b;
}

int kiln__i_alloc(ictx_t *c, it_t *t, kiln_dtype_t dt, uint32_t rank,
		  const int64_t *size)
{
	memset(t, 0, sizeof(*t));
	int64_t n = 1;
	for (uint32_t d = 0; d < rank; d++) {
		if (size[d] < 0)
			return kiln__i_bad(c, "negative size %lld",
					   (long long)size[d]);
		if (size[d] > 0 && n > KI_MAX_ELEMS / size[d])
			return kiln__i_bad(
			    c, "tensor too large for the interpreter");
		n *= size[d];
	}
	t->dt = dt;
	t->rank = rank;
	if (rank > 0)
		memcpy(t->size, size, rank * sizeof(int64_t));
	kiln__i_contig_strides(rank, size, t->stride);
	t->buf = buf_new(dt, n);
	return t->buf ? 0 : kiln__i_oom(c);
}

void kiln__i_ref(it_t *dst, const it_t *src)
{
	*dst = *src;
	dst->buf->refs++;
}

void kiln__i_release(it_t *t)
{
	if (t == NULL || t->buf == NULL)
		return;
	if (--t->buf->refs == 0) {
		free(t->buf->f);
		free(t->buf->i);
		free(t->buf);
	}
	t->buf = NULL;
}

int kiln__i_to_f(ictx_t *c, const it_t *t, double **out)
{
	int64_t n = kiln__i_numel(t), idx[KI_MAXR] = {0};
	double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
	if (v == NULL)
		return kiln__i_oom(c);
	if (n > 0) {
		int64_t k = 0;
		do
			v[k++] = ki_getf(t, ki_off(t, idx));
		while (ki_next(idx, t->size, t->rank));
	}
	*out = v;
	return 0;
}

int kiln__i_to_i(ictx_t *c, const it_t *t, int64_t **out)
{
	int64_t n = kiln__i_numel(t), idx[KI_MAXR] = {0};
	int64_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
	if (v == NULL)
		return kiln__i_oom(c);
	if (n > 0) {
		int64_t k = 0;
		do
			v[k++] = ki_geti(t, ki_off(t, idx));
		while (ki_next(idx, t->size, t->rank));
	}
	*out = v;
	return 0;
}

int kiln__i_from_f(ictx_t *c, it_t *t, kiln_dtype_t dt, uint32_t rank,
		   const int64_t *size, const double *v)
{
	KI_TRY(kiln__i_alloc(c, t, dt, rank, size));
	int64_t n = kiln__i_numel(t);
	for (int64_t k = 0; k < n; k++)
		ki_setf(t, k, v[k]);
	return 0;
}

int kiln__i_convert(ictx_t *c, const it_t *src, kiln_dtype_t dt, it_t *out)
{
	KI_TRY(kiln__i_alloc(c, out, dt, src->rank, src->size));
	int64_t idx[KI_MAXR] = {0}, k = 0;
	if (kiln__i_numel(src) == 0)
		return 0;
	do {
		int64_t o = ki_off(src, idx);
		if (src->buf->f)
			ki_setf(out, k++, src->buf->f[o]);
		else
			ki_seti(out, k++, src->buf->i[o]);
	} while (ki_next(idx, src->size, src->rank));
	return 0;
}

int kiln__i_none_out(ictx_t *c, uint32_t k)
{
	int64_t z = 0;
	kiln_dtype_t dt = c->g->values[c->nd->out_first + k].dtype;
	return kiln__i_alloc(c, &c->out[k], dt, 1, &z);
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                  */
/* ------------------------------------------------------------------------ */

const kiln_arg_t *kiln__i_arg(ictx_t *c, int pos, const char *name)
{
	const kiln_arg_t *a = NULL;
	if (pos >= 0 && (uint32_t)pos < c->nd->n_args)
		a = &c->nd->args[pos];
	else if (name != NULL)
		for (uint32_t k = 0; k < c->nd->n_kwargs; k++)
			if (strcmp(c->nd->kwargs[k].key, name) == 0)
				a = &c->nd->kwargs[k].val;
	if (a != NULL && a->kind == KILN_ARG_NIL)
		a = NULL;
	return a;
}

static const char *argname(int pos, const char *name, char *buf, size_t n)
{
	if (name != NULL)
		return name;
	snprintf(buf, n, "arg %d", pos);
	return buf;
}

static int ref_tensor(ictx_t *c, const kiln_arg_t *a, int pos, const char *name,
		      it_t **t)
{
	char nb[16];
	if (a->kind != KILN_ARG_REF)
		return kiln__i_bad(c, "%s: expected a tensor",
				   argname(pos, name, nb, sizeof(nb)));
	if (a->u.ref >= c->g->n_values || c->vals[a->u.ref].buf == NULL)
		return kiln__i_bad(c, "%s: value %u is not a tensor",
				   argname(pos, name, nb, sizeof(nb)),
				   a->u.ref);
	*t = &c->vals[a->u.ref];
	return 0;
}

int kiln__i_tensor_opt(ictx_t *c, int pos, const char *name, it_t **t)
{
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	*t = NULL;
	return a == NULL ? 0 : ref_tensor(c, a, pos, name, t);
}

int kiln__i_tensor(ictx_t *c, int pos, const char *name, it_t **t)
{
	char nb[16];
	KI_TRY(kiln__i_tensor_opt(c, pos, name, t));
	if (*t == NULL)
		return kiln__i_bad(c, "%s: missing tensor argument",
				   argname(pos, name, nb, sizeof(nb)));
	return 0;
}

/* An int from an arg (int, sym expression, or a ref to a symint input). */
static int arg_int(ictx_t *c, const kiln_arg_t *a, int64_t *v)
{
	switch (a->kind) {
	case KILN_ARG_INT: *v = a->u.i; return 0;
	case KILN_ARG_BOOL: *v = a->u.b; return 0;
	case KILN_ARG_SYM:
		if (kiln_expr_eval(a->u.sym, c->syms, v) < 0)
			return kiln__i_bad(
			    c, "symbolic argument does not evaluate");
		return 0;
	case KILN_ARG_REF:
		if (a->u.ref < c->g->n_values &&
		    c->g->values[a->u.ref].kind == KILN_VAL_SYMINT) {
			if (kiln_expr_eval(c->g->values[a->u.ref].sym, c->syms,
					   v) < 0)
				return kiln__i_bad(c,
						   "symint does not evaluate");
			return 0;
		}
		return 1;
	default: return 1;
	}
}

int kiln__i_int(ictx_t *c, int pos, const char *name, int64_t def, int64_t *v)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	if (a == NULL) {
		if (def == KI_REQ)
			return kiln__i_bad(c, "%s: missing int argument",
					   argname(pos, name, nb, sizeof(nb)));
		*v = def;
		return 0;
	}
	int rc = arg_int(c, a, v);
	if (rc > 0)
		return kiln__i_bad(c, "%s: expected an int",
				   argname(pos, name, nb, sizeof(nb)));
	return rc;
}

int kiln__i_num(ictx_t *c, int pos, const char *name, bool required, double def,
		double *v)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	int64_t i;
	if (a == NULL) {
		if (required)
			return kiln__i_bad(c, "%s: missing number",
					   argname(pos, name, nb, sizeof(nb)));
		*v = def;
		return 0;
	}
	if (a->kind == KILN_ARG_FLOAT) {
		*v = a->u.f;
		return 0;
	}
	int rc = arg_int(c, a, &i);
	if (rc > 0)
		return kiln__i_bad(c, "%s: expected a number",
				   argname(pos, name, nb, sizeof(nb)));
	*v = (double)i;
	return rc;
}

int kiln__i_bool(ictx_t *c, int pos, const char *name, bool def, bool *v)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	if (a == NULL) {
		*v = def;
		return 0;
	}
	if (a->kind == KILN_ARG_BOOL)
		*v = a->u.b;
	else if (a->kind == KILN_ARG_INT)
		*v = a->u.i != 0;
	else
		return kiln__i_bad(c, "%s: expected a bool",
				   argname(pos, name, nb, sizeof(nb)));
	return 0;
}

int kiln__i_ints(ictx_t *c, int pos, const char *name, int64_t *v, int cap,
		 int *n)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	*n = -1;
	if (a == NULL)
		return 0;
	if (a->kind != KILN_ARG_LIST) {
		int rc = arg_int(c, a, &v[0]);
		if (rc > 0)
			return kiln__i_bad(c, "%s: expected an int list",
					   argname(pos, name, nb, sizeof(nb)));
		*n = 1;
		return rc;
	}
	if (a->n > (uint32_t)cap)
		return kiln__i_bad(c, "%s: list of %u ints is too long",
				   argname(pos, name, nb, sizeof(nb)), a->n);
	for (uint32_t k = 0; k < a->n; k++) {
		int rc = arg_int(c, &a->u.list[k], &v[k]);
		if (rc > 0)
			return kiln__i_bad(c, "%s: element %u is not an int",
					   argname(pos, name, nb, sizeof(nb)),
					   k);
		if (rc < 0)
			return rc;
	}
	*n = (int)a->n;
	return 0;
}

int kiln__i_bools(ictx_t *c, int pos, const char *name, bool *v, int cap,
		  int *n)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	*n = -1;
	if (a == NULL)
		return 0;
	if (a->kind != KILN_ARG_LIST || a->n > (uint32_t)cap)
		return kiln__i_bad(c, "%s: expected a bool list",
				   argname(pos, name, nb, sizeof(nb)));
	for (uint32_t k = 0; k < a->n; k++) {
		const kiln_arg_t *e = &a->u.list[k];
		if (e->kind != KILN_ARG_BOOL && e->kind != KILN_ARG_INT)
			return kiln__i_bad(c, "%s: element %u is not a bool",
					   argname(pos, name, nb, sizeof(nb)),
					   k);
		v[k] = e->kind == KILN_ARG_BOOL ? e->u.b : e->u.i != 0;
	}
	*n = (int)a->n;
	return 0;
}

int kiln__i_str(ictx_t *c, int pos, const char *name, const char **s)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	*s = NULL;
	if (a == NULL)
		return 0;
	if (a->kind != KILN_ARG_STR)
		return kiln__i_bad(c, "%s: expected a string",
				   argname(pos, name, nb, sizeof(nb)));
	*s = a->u.s;
	return 0;
}

int kiln__i_dtype(ictx_t *c, int pos, const char *name, kiln_dtype_t *dt,
		  bool *given)
{
	const char *s;
	KI_TRY(kiln__i_str(c, pos, name, &s));
	*given = s != NULL;
	if (s == NULL)
		return 0;
	int d = kiln_dtype_from_name(s, strlen(s));
	if (d < 0)
		return kiln__i_bad(c, "unknown dtype \"%s\"", s);
	*dt = (kiln_dtype_t)d;
	return 0;
}

/* A wrapped rank-0 tensor holding a number arg. */
static int wrap_number(ictx_t *c, const kiln_arg_t *a, it_t *t)
{
	kiln_dtype_t dt = a->kind == KILN_ARG_FLOAT  ? KILN_DT_F64
			  : a->kind == KILN_ARG_BOOL ? KILN_DT_BOOL
						     : KILN_DT_I64;
	int64_t iv = 0;
	if (a->kind != KILN_ARG_FLOAT && arg_int(c, a, &iv) != 0)
		return kiln__i_bad(c, "expected a number");
	KI_TRY(kiln__i_alloc(c, t, dt, 0, NULL));
	t->wrapped = true;
	if (dt == KILN_DT_F64)
		t->buf->f[0] = a->u.f;
	else
		t->buf->i[0] = iv;
	return 0;
}

int kiln__i_operand(ictx_t *c, int pos, const char *name, it_t *t)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	memset(t, 0, sizeof(*t));
	if (a == NULL)
		return kiln__i_bad(c, "%s: missing operand",
				   argname(pos, name, nb, sizeof(nb)));
	if (a->kind == KILN_ARG_REF && a->u.ref < c->g->n_values &&
	    c->g->values[a->u.ref].kind == KILN_VAL_TENSOR) {
		it_t *x = NULL;
		KI_TRY(ref_tensor(c, a, pos, name, &x));
		kiln__i_ref(t, x);
		return 0;
	}
	if (a->kind == KILN_ARG_INT || a->kind == KILN_ARG_FLOAT ||
	    a->kind == KILN_ARG_BOOL || a->kind == KILN_ARG_SYM ||
	    a->kind == KILN_ARG_REF)
		return wrap_number(c, a, t);
	return kiln__i_bad(c, "%s: expected a tensor or a number",
			   argname(pos, name, nb, sizeof(nb)));
}

int kiln__i_tensor_list(ictx_t *c, int pos, const char *name, it_t ***ts,
			uint32_t *n, bool allow_nil)
{
	char nb[16];
	const kiln_arg_t *a = kiln__i_arg(c, pos, name);
	if (a == NULL || a->kind != KILN_ARG_LIST)
		return kiln__i_bad(c, "%s: expected a list of tensors",
				   argname(pos, name, nb, sizeof(nb)));
	it_t **v = calloc(a->n ? a->n : 1, sizeof(*v));
	if (v == NULL)
		return kiln__i_oom(c);
	for (uint32_t k = 0; k < a->n; k++) {
		if (a->u.list[k].kind == KILN_ARG_NIL && allow_nil)
			continue;
		int rc = ref_tensor(c, &a->u.list[k], pos, name, &v[k]);
		if (rc < 0) {
			free(v);
			return rc;
		}
	}
	*ts = v;
	*n = a->n;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Shapes and type promotion                                                  */
/* ------------------------------------------------------------------------ */

int kiln__i_dim(ictx_t *c, int64_t d, uint32_t rank, uint32_t *out)
{
	int64_t r = rank > 0 ? rank : 1;
	if (d < -r || d >= r)
		return kiln__i_bad(c,
				   "dim %lld out of range for a rank-%u tensor",
				   (long long)d, rank);
	*out = (uint32_t)(d < 0 ? d + r : d);
	return 0;
}

int kiln__i_bshape(ictx_t *c, it_t *const *ts, int n, uint32_t *rank,
		   int64_t *size)
{
	uint32_t r = 0;
	for (int k = 0; k < n; k++)
		if (ts[k] != NULL && ts[k]->rank > r)
			r = ts[k]->rank;
	for (uint32_t d = 0; d < r; d++)
		size[d] = 1;
	for (int k = 0; k < n; k++) {
		const it_t *t = ts[k];
		if (t == NULL)
			continue;
		for (uint32_t d = 0; d < t->rank; d++) {
			int64_t *s = &size[r - t->rank + d];
			int64_t x = t->size[d];
			if (x == *s || x == 1)
				continue;
			if (*s == 1) {
				*s = x;
				continue;
			}
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), t->rank, t->size);
			const it_t *o = NULL;
			for (int j = 0; j < n && o == NULL; j++)
				if (ts[j] != NULL && j != k)
					o = ts[j];
			if (o != NULL)
				kiln__i_fmt_shape(b, sizeof(b), o->rank,
						  o->size);
			else
				kiln__i_fmt_shape(b, sizeof(b), r, size);
			return kiln__i_bad(
			    c, "shapes %s and %s do not broadcast", b, a);
		}
	}
	*rank = r;
	return 0;
}

void kiln__i_bview(const it_t *t, uint32_t rank, const int64_t *size, it_t *v)
{
	*v = *t;
	v->rank = rank;
	uint32_t lead = rank - t->rank;
	for (uint32_t d = 0; d < rank; d++) {
		v->size[d] = size[d];
		if (d < lead)
			v->stride[d] = 0;
		else {
			v->stride[d] = t->size[d - lead] == 1 && size[d] != 1
					   ? 0
					   : t->stride[d - lead];
		}
	}
}

static int dt_width(kiln_dtype_t dt)
{
	return (int)kiln_dtype_size(dt);
}

kiln_dtype_t kiln__i_promote(kiln_dtype_t a, kiln_dtype_t b)
{
	if (a == b)
		return a;
	if (a == KILN_DT_BOOL)
		return b;
	if (b == KILN_DT_BOOL)
		return a;
	if (ki_isf(a) && ki_isf(b)) {
		if (a == KILN_DT_F64 || b == KILN_DT_F64)
			return KILN_DT_F64;
		return KILN_DT_F32; /* f32 with anything, or f16 with bf16 */
	}
	if (ki_isf(a))
		return a;
	if (ki_isf(b))
		return b;
	if (a == KILN_DT_U8 || b == KILN_DT_U8) {
		kiln_dtype_t o = a == KILN_DT_U8 ? b : a;
		return o == KILN_DT_I8 ? KILN_DT_I16 : o;
	}
	return dt_width(a) >= dt_width(b) ? a : b;
}

#define DT_NONE KILN_DT__COUNT

static kiln_dtype_t promote_opt(kiln_dtype_t a, kiln_dtype_t b)
{
	if (a == DT_NONE)
		return b;
	if (b == DT_NONE)
		return a;
	return kiln__i_promote(a, b);
}

static kiln_dtype_t combine(kiln_dtype_t hi, kiln_dtype_t lo)
{
	if (hi == DT_NONE)
		return lo;
	if (lo == DT_NONE || ki_isf(hi))
		return hi;
	if (hi == KILN_DT_BOOL || ki_isf(lo))
		return kiln__i_promote(hi, lo);
	return hi;
}

kiln_dtype_t kiln__i_result_type(it_t *const *ts, int n)
{
	kiln_dtype_t dim = DT_NONE, zero = DT_NONE, wrap = DT_NONE;
	for (int k = 0; k < n; k++) {
		const it_t *t = ts[k];
		if (t == NULL)
			continue;
		if (t->wrapped)
			wrap = promote_opt(wrap,
					   ki_isf(t->dt) ? KILN_DT_F32 : t->dt);
		else if (t->rank == 0)
			zero = promote_opt(zero, t->dt);
		else
			dim = promote_opt(dim, t->dt);
	}
	kiln_dtype_t r = combine(dim, combine(zero, wrap));
	return r == DT_NONE ? KILN_DT_F32 : r;
}

/* ------------------------------------------------------------------------ */
/* The op table                                                               */
/* ------------------------------------------------------------------------ */

typedef struct opdef {
	const char *name;
	kiln__op_fn fn;
	int code;
} opdef_t;

#define UN(n, code)                                                            \
	{                                                                      \
		"aten." n ".default", kiln__op_unary, code                     \
	}
#define BIN(n, code)                                                           \
	{                                                                      \
		"aten." n, kiln__op_binary, code                               \
	}
#define OPS(n, f, code)                                                        \
	{                                                                      \
		"aten." n, kiln__op_##f, code                                  \
	}

static const opdef_t optab[] = {
    UN("abs", U_ABS),
    UN("neg", U_NEG),
    UN("exp", U_EXP),
    UN("exp2", U_EXP2),
    UN("log", U_LOG),
    UN("log1p", U_LOG1P),
    UN("log2", U_LOG2),
    UN("log10", U_LOG10),
    UN("expm1", U_EXPM1),
    UN("sqrt", U_SQRT),
    UN("rsqrt", U_RSQRT),
    UN("reciprocal", U_RECIP),
    UN("sin", U_SIN),
    UN("cos", U_COS),
    UN("tan", U_TAN),
    UN("asin", U_ASIN),
    UN("acos", U_ACOS),
    UN("atan", U_ATAN),
    UN("sinh", U_SINH),
    UN("cosh", U_COSH),
    UN("tanh", U_TANH),
    UN("sigmoid", U_SIGMOID),
    UN("relu", U_RELU),
    UN("gelu", U_GELU),
    UN("silu", U_SILU),
    UN("erf", U_ERF),
    UN("sign", U_SIGN),
    UN("floor", U_FLOOR),
    UN("ceil", U_CEIL),
    UN("round", U_ROUND),
    {"aten.round.decimals", kiln__op_unary, U_ROUND},
    UN("trunc", U_TRUNC),
    UN("hardswish", U_HARDSWISH),
    UN("hardsigmoid", U_HARDSIGMOID),
    UN("logical_not", U_LNOT),
    UN("bitwise_not", U_BNOT),
    UN("isnan", U_ISNAN),
    UN("isinf", U_ISINF),
    UN("hardtanh", U_HARDTANH),
    UN("leaky_relu", U_LEAKY),
    UN("elu", U_ELU),
    UN("softplus", U_SOFTPLUS),
    UN("mish", U_MISH),
    UN("celu", U_CELU),
    UN("threshold", U_THRESH),
    UN("sgn", U_SIGN),
    {"aten.log_sigmoid_forward.default", kiln__op_log_sigmoid, 0},
    {"aten._prelu_kernel.default", kiln__op_prelu, T_PRELU},
    {"aten._prelu_kernel_backward.default", kiln__op_prelu, T_PRELU_GI},
    {"aten.glu.default", kiln__op_glu, T_GLU},
    {"aten.glu_backward.default", kiln__op_glu, T_GLU_GA},
    {"aten.elu_backward.default", kiln__op_elu_backward, T_ELU_BW},
    {"aten.softplus_backward.default", kiln__op_pw_backward, T_SOFTPLUS_BW},
    {"aten.mish_backward.default", kiln__op_pw_backward, T_MISH_BW},
    {"aten.leaky_relu_backward.default", kiln__op_pw_backward, T_LEAKY_BW},
    {"aten.log_sigmoid_backward.default", kiln__op_pw_backward, T_LOGSIG_BW},
    BIN("add.Tensor", B_ADD),
    BIN("add.Scalar", B_ADD),
    BIN("sub.Tensor", B_SUB),
    BIN("sub.Scalar", B_SUB),
    BIN("rsub.Tensor", B_RSUB),
    BIN("rsub.Scalar", B_RSUB),
    BIN("mul.Tensor", B_MUL),
    BIN("mul.Scalar", B_MUL),
    BIN("div.Tensor", B_DIV),
    BIN("div.Scalar", B_DIV),
    BIN("div.Tensor_mode", B_DIV),
    BIN("div.Scalar_mode", B_DIV),
    BIN("floor_divide.default", B_DIVF),
    BIN("floor_divide.Scalar", B_DIVF),
    BIN("remainder.Tensor", B_REM),
    BIN("remainder.Scalar", B_REM),
    BIN("remainder.Scalar_Tensor", B_REM),
    BIN("fmod.Tensor", B_FMOD),
    BIN("fmod.Scalar", B_FMOD),
    BIN("pow.Tensor_Tensor", B_POW),
    BIN("pow.Tensor_Scalar", B_POW),
    BIN("pow.Scalar", B_POW),
    BIN("maximum.default", B_MAX),
    BIN("minimum.default", B_MIN),
    BIN("max.other", B_MAX),
    BIN("min.other", B_MIN),
    BIN("atan2.default", B_ATAN2),
    BIN("eq.Tensor", B_EQ),
    BIN("eq.Scalar", B_EQ),
    BIN("ne.Tensor", B_NE),
    BIN("ne.Scalar", B_NE),
    BIN("lt.Tensor", B_LT),
    BIN("lt.Scalar", B_LT),
    BIN("le.Tensor", B_LE),
    BIN("le.Scalar", B_LE),
    BIN("gt.Tensor", B_GT),
    BIN("gt.Scalar", B_GT),
    BIN("ge.Tensor", B_GE),
    BIN("ge.Scalar", B_GE),
    BIN("logical_and.default", B_LAND),
    BIN("logical_or.default", B_LOR),
    BIN("logical_xor.default", B_LXOR),
    BIN("bitwise_and.Tensor", B_BAND),
    BIN("bitwise_and.Scalar", B_BAND),
    BIN("bitwise_and.Scalar_Tensor", B_BAND),
    BIN("bitwise_or.Tensor", B_BOR),
    BIN("bitwise_or.Scalar", B_BOR),
    BIN("bitwise_or.Scalar_Tensor", B_BOR),
    BIN("bitwise_xor.Tensor", B_BXOR),
    BIN("bitwise_xor.Scalar", B_BXOR),
    BIN("bitwise_xor.Scalar_Tensor", B_BXOR),
    {"aten.where.self", kiln__op_where, 0},
    {"aten.where.ScalarOther", kiln__op_where, 0},
    {"aten.where.ScalarSelf", kiln__op_where, 0},
    {"aten.where.Scalar", kiln__op_where, 0},
    {"aten.masked_fill.Scalar", kiln__op_masked_fill, 0},
    {"aten.masked_fill.Tensor", kiln__op_masked_fill, 0},
    {"aten.clamp.default", kiln__op_clamp, CL_BOTH},
    {"aten.clamp.Tensor", kiln__op_clamp, CL_BOTH},
    {"aten.clamp_min.default", kiln__op_clamp, CL_MIN},
    {"aten.clamp_min.Tensor", kiln__op_clamp, CL_MIN},
    {"aten.clamp_max.default", kiln__op_clamp, CL_MAX},
    {"aten.clamp_max.Tensor", kiln__op_clamp, CL_MAX},
    {"aten.lerp.Scalar", kiln__op_lerp, 0},
    {"aten.lerp.Tensor", kiln__op_lerp, 0},
    {"aten.addcmul.default", kiln__op_addcmul, 0},
    {"aten.addcdiv.default", kiln__op_addcmul, 1},
    {"aten.threshold_backward.default", kiln__op_pw_backward, T_THRESH_BW},
    {"aten.hardtanh_backward.default", kiln__op_pw_backward, T_HARDTANH_BW},
    {"aten.gelu_backward.default", kiln__op_pw_backward, T_GELU_BW},
    {"aten.sigmoid_backward.default", kiln__op_pw_backward, T_SIGMOID_BW},
    {"aten.tanh_backward.default", kiln__op_pw_backward, T_TANH_BW},
    {"aten.silu_backward.default", kiln__op_pw_backward, T_SILU_BW},
    {"aten.hardswish_backward.default", kiln__op_pw_backward, T_HARDSWISH_BW},
    {"aten.hardsigmoid_backward.default", kiln__op_pw_backward,
     T_HARDSIGMOID_BW},
    {"aten._to_copy.default", kiln__op_convert, CV_TO_COPY},
    {"prims.convert_element_type.default", kiln__op_convert, CV_CONVERT},
    {"aten.clone.default", kiln__op_convert, CV_CLONE},
    {"aten.copy.default", kiln__op_convert, CV_COPY},
    {"aten.full.default", kiln__op_create, CR_FULL},
    {"aten.zeros.default", kiln__op_create, CR_ZEROS},
    {"aten.ones.default", kiln__op_create, CR_ONES},
    {"aten.empty.memory_format", kiln__op_create, CR_EMPTY},
    {"aten.empty_strided.default", kiln__op_create, CR_EMPTY_STRIDED},
    {"aten.new_full.default", kiln__op_create, CR_NEW_FULL},
    {"aten.new_zeros.default", kiln__op_create, CR_NEW_ZEROS},
    {"aten.new_ones.default", kiln__op_create, CR_NEW_ONES},
    {"aten.new_empty.default", kiln__op_create, CR_NEW_EMPTY},
    {"aten.new_empty_strided.default", kiln__op_create, CR_NEW_EMPTY_STRIDED},
    {"aten.full_like.default", kiln__op_create, CR_FULL_LIKE},
    {"aten.zeros_like.default", kiln__op_create, CR_ZEROS_LIKE},
    {"aten.ones_like.default", kiln__op_create, CR_ONES_LIKE},
    {"aten.empty_like.default", kiln__op_create, CR_EMPTY_LIKE},
    {"aten.fill.Scalar", kiln__op_create, CR_FILL},
    {"aten.fill.Tensor", kiln__op_create, CR_FILL},
    {"aten.scalar_tensor.default", kiln__op_create, CR_SCALAR_TENSOR},
    {"aten.arange.default", kiln__op_arange, 0},
    {"aten.arange.start", kiln__op_arange, 1},
    {"aten.arange.start_step", kiln__op_arange, 2},
    /* reductions (interp_ops.c) */
    OPS("sum.dim_IntList", reduce, R_SUM),
    OPS("sum.default", reduce, R_SUM),
    OPS("mean.dim", reduce, R_MEAN),
    OPS("mean.default", reduce, R_MEAN),
    OPS("amax.default", reduce, R_AMAX),
    OPS("amin.default", reduce, R_AMIN),
    OPS("max.default", reduce, R_MAXALL),
    OPS("min.default", reduce, R_MINALL),
    OPS("prod.default", reduce, R_PROD),
    OPS("prod.dim_int", reduce, R_PROD),
    OPS("any.default", reduce, R_ANY),
    OPS("any.dim", reduce, R_ANY),
    OPS("any.dims", reduce, R_ANY),
    OPS("all.default", reduce, R_ALL),
    OPS("all.dim", reduce, R_ALL),
    OPS("all.dims", reduce, R_ALL),
    OPS("logsumexp.default", reduce, R_LSE),
    OPS("linalg_vector_norm.default", reduce, R_NORM),
    OPS("max.dim", minmax_dim, 1),
    OPS("min.dim", minmax_dim, 0),
    OPS("argmax.default", argred, 1),
    OPS("argmin.default", argred, 0),
    OPS("var.correction", varstd, V_VAR),
    OPS("var.dim", varstd, V_VAR),
    OPS("var.default", varstd, V_VAR),
    OPS("std.correction", varstd, V_STD),
    OPS("std.dim", varstd, V_STD),
    OPS("std.default", varstd, V_STD),
    OPS("cumsum.default", cumsum, 0),
    OPS("_softmax.default", softmax, 0),
    OPS("_safe_softmax.default", softmax, 2),
    OPS("_log_softmax.default", softmax, 1),
    OPS("_softmax_backward_data.default", softmax_bw, 0),
    OPS("_log_softmax_backward_data.default", softmax_bw, 1),
    OPS("native_layer_norm.default", layer_norm, 0),
    OPS("native_layer_norm_backward.default", layer_norm_bw, 0),
    OPS("native_batch_norm.default", batch_norm, NORM_BN),
    OPS("_native_batch_norm_legit_no_training.default", batch_norm,
	NORM_BN_NOTRAIN),
    OPS("_native_batch_norm_legit_functional.default", batch_norm,
	NORM_BN_FUNC),
    OPS("_native_batch_norm_legit.no_stats", batch_norm, NORM_BN_NOSTATS),
    OPS("native_batch_norm_backward.default", batch_norm_bw, 0),
    OPS("native_group_norm.default", group_norm, 0),
    OPS("native_group_norm_backward.default", group_norm_bw, 0),
    OPS("_weight_norm_interface.default", weight_norm, 0),
    OPS("_weight_norm_interface_backward.default", weight_norm, 1),
    /* views (interp_ops.c) */
    OPS("view.default", view, VW_VIEW),
    OPS("_unsafe_view.default", view, VW_VIEW),
    OPS("reshape.default", view, VW_VIEW),
    OPS("_reshape_alias.default", view, VW_RESHAPE_ALIAS),
    OPS("permute.default", permute, 0),
    OPS("transpose.int", transpose, 0),
    OPS("t.default", transpose, 1),
    OPS("expand.default", expand, 0),
    OPS("squeeze.default", squeeze, 0),
    OPS("squeeze.dim", squeeze, 1),
    OPS("squeeze.dims", squeeze, 2),
    OPS("unsqueeze.default", unsqueeze, 0),
    OPS("slice.Tensor", slice, 0),
    OPS("narrow.default", slice, 1),
    OPS("select.int", select, 0),
    OPS("split.Tensor", split, SPLIT_SIZE),
    OPS("split_with_sizes.default", split, SPLIT_SIZES),
    OPS("unbind.int", split, SPLIT_UNBIND),
    OPS("cat.default", cat, 0),
    OPS("stack.default", stack, 0),
    OPS("alias.default", alias, 0),
    OPS("detach.default", alias, 0),
    OPS("lift_fresh_copy.default", alias, 0),
    OPS("constant_pad_nd.default", pad, 0),
    OPS("flip.default", flip, 0),
    OPS("roll.default", roll, 0),
    OPS("repeat.default", repeat, 0),
    OPS("select_backward.default", select_bw, 0),
    OPS("select_scatter.default", select_bw, 1),
    OPS("slice_backward.default", slice_bw, 0),
    OPS("slice_scatter.default", slice_bw, 1),
    OPS("as_strided.default", as_strided, 0),
    OPS("as_strided_scatter.default", as_strided_scatter, 0),
    OPS("tril.default", tri, 0),
    OPS("triu.default", tri, 1),
    OPS("native_dropout.default", dropout, 0),
    OPS("native_dropout_backward.default", dropout_bw, 0),
    {"kiln.dropout.default", kiln__op_kiln_dropout, 0},
    /* nn (interp_nn.c) */
    OPS("mm.default", mm, MM_MM),
    OPS("bmm.default", mm, MM_BMM),
    OPS("addmm.default", mm, MM_ADDMM),
    OPS("baddbmm.default", mm, MM_BADDBMM),
    OPS("embedding.default", embedding, 0),
    OPS("embedding_dense_backward.default", embedding_bw, 0),
    OPS("index_select.default", index_select, 0),
    OPS("gather.default", gather, 0),
    OPS("scatter.src", scatter, SC_SRC),
    OPS("scatter.value", scatter, SC_VALUE),
    OPS("scatter_add.default", scatter, SC_ADD),
    OPS("scatter_reduce.two", scatter_reduce, 0),
    OPS("index_add.default", index_add, 0),
    OPS("index.Tensor", index, 0),
    OPS("_unsafe_index.Tensor", index, 0),
    OPS("index_put.default", index_put, 0),
    OPS("_unsafe_index_put.default", index_put, 0),
    OPS("nll_loss_forward.default", nll, 0),
    OPS("nll_loss_backward.default", nll_bw, 0),
    OPS("mse_loss.default", mse, 0),
    OPS("mse_loss_backward.default", mse_bw, 0),
    OPS("convolution.default", conv, 0),
    OPS("convolution_backward.default", conv_bw, 0),
    OPS("max_pool2d_with_indices.default", maxpool, 0),
    OPS("max_pool2d_with_indices_backward.default", maxpool_bw, 0),
    OPS("avg_pool2d.default", avgpool, 0),
    OPS("avg_pool2d_backward.default", avgpool_bw, 0),
    OPS("_adaptive_avg_pool2d.default", adaptive, 0),
    OPS("_adaptive_avg_pool2d_backward.default", adaptive_bw, 0),
    OPS("upsample_nearest2d.default", upsample, UP_NEAREST),
    OPS("upsample_nearest2d.vec", upsample, UP_NEAREST_VEC),
    OPS("upsample_bilinear2d.default", upsample, UP_BILINEAR),
    OPS("upsample_bilinear2d.vec", upsample, UP_BILINEAR_VEC),
    OPS("_scaled_dot_product_flash_attention_for_cpu.default", sdpa, 0),
    OPS("_scaled_dot_product_flash_attention_for_cpu_backward.default", sdpa_bw,
	0),
    OPS("_native_multi_head_attention.default", mha, 0),
    OPS("_transformer_encoder_layer_fwd.default", mha, 1),
};

static const opdef_t *find_op(const char *name)
{
	for (size_t k = 0; k < sizeof(optab) / sizeof(optab[0]); k++)
		if (strcmp(optab[k].name, name) == 0)
			return &optab[k];
	return NULL;
}

bool kiln_interp_supports(const char *op)
{
	return op != NULL && find_op(op) != NULL;
}

/* ------------------------------------------------------------------------ */
/* Running a graph                                                            */
/* ------------------------------------------------------------------------ */

static double rd_f(const void *data, kiln_dtype_t dt, int64_t off)
{
	const uint8_t *p =
	    (const uint8_t *)data + off * (int64_t)kiln_dtype_size(dt);
	switch (dt) {
	case KILN_DT_F32: {
		float v;
		memcpy(&v, p, 4);
		return v;
	}
	case KILN_DT_F64: {
		double v;
		memcpy(&v, p, 8);
		return v;
	}
	case KILN_DT_F16:
	case KILN_DT_BF16: {
		uint16_t h;
		memcpy(&h, p, 2);
		if (dt == KILN_DT_BF16) {
			uint32_t u = (uint32_t)h << 16;
			float f;
			memcpy(&f, &u, 4);
			return f;
		}
		int e = (h >> 10) & 0x1f, m = h & 0x3ff;
		double v = e == 0    ? ldexp(m, -24)
			   : e == 31 ? (m ? NAN : INFINITY)
				     : ldexp(m | 0x400, e - 25);
		return (h & 0x8000) ? -v : v;
	}
	default: return 0;
	}
}

static int64_t rd_i(const void *data, kiln_dtype_t dt, int64_t off)
{
	const uint8_t *p =
	    (const uint8_t *)data + off * (int64_t)kiln_dtype_size(dt);
	switch (dt) {
	case KILN_DT_I8: return (int8_t)*p;
	case KILN_DT_U8: return *p;
	case KILN_DT_BOOL: return *p != 0;
	case KILN_DT_I16: {
		int16_t v;
		memcpy(&v, p, 2);
		return v;
	}
	case KILN_DT_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	case KILN_DT_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		return v;
	}
	default: return 0;
	}
}

typedef struct run {
	const kiln_graph_t *g;
	int64_t *syms;
	it_t *vals;
	char *err;
	size_t errlen;
} run_t;

static int dim_eval(run_t *r, const kiln_dim_t *d, int64_t *v)
{
	if (d->e == NULL) {
		*v = d->c;
		return 0;
	}
	return kiln_expr_eval(d->e, r->syms, v);
}

static void fmt_dims(run_t *r, char *buf, size_t n, uint32_t rank,
		     const kiln_dim_t *dims)
{
	size_t k = (size_t)snprintf(buf, n, "[");
	for (uint32_t d = 0; d < rank && k < n; d++) {
		int64_t v;
		if (dim_eval(r, &dims[d], &v) < 0)
			v = -1;
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "",
				      (long long)v);
	}
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* Binds every symbol from the inputs, then checks constraints and specs. */
static int bind_inputs(run_t *r, const kiln_tensor_t *in)
{
	const kiln_graph_t *g = r->g;
	uint32_t *from =
	    calloc(g->n_symbols ? g->n_symbols : 1, sizeof(uint32_t));
	if (from == NULL)
		return -ENOMEM;
	int rc = 0;
	for (uint32_t s = 0; s < g->n_symbols; s++)
		r->syms[s] = -1;
	for (uint32_t i = 0; i < g->n_inputs && rc == 0; i++) {
		const kiln_value_t *v = &g->values[i];
		const kiln_tensor_t *t = &in[i];
		if (v->kind == KILN_VAL_SYMINT) {
			if (t->rank != 0 || t->data == NULL ||
			    ki_isf(t->dtype)) {
				rc = kiln__errf(
				    r->err, r->errlen, KILN_EINVGRAPH,
				    "input %u: a symint input must be a rank-0 "
				    "integer tensor",
				    i);
				break;
			}
			if (v->sym->kind == KILN_EX_SYM) {
				int64_t x = rd_i(t->data, t->dtype, 0);
				uint32_t s = v->sym->sym;
				if (r->syms[s] >= 0 && r->syms[s] != x)
					rc = kiln__errf(
					    r->err, r->errlen, KILN_EINVGRAPH,
					    "input %u: symbol %s is %lld but "
					    "input "
					    "%u says %lld",
					    i, g->symbols[s].name, (long long)x,
					    from[s], (long long)r->syms[s]);
				r->syms[s] = x;
				from[s] = i;
			}
			continue;
		}
		if (t->rank != v->rank || t->dtype != v->dtype ||
		    (t->data == NULL &&
		     kiln__i_numel_of(t->rank, t->sizes) > 0)) {
			rc = kiln__errf(
			    r->err, r->errlen, KILN_EINVGRAPH,
			    "input %u: got %s rank %u, the graph declares %s "
			    "rank %u",
			    i, kiln_dtype_name(t->dtype), t->rank,
			    kiln_dtype_name(v->dtype), v->rank);
			break;
		}
		for (uint32_t d = 0; d < v->rank && rc == 0; d++) {
			const kiln_expr_t *e = v->sizes[d].e;
			if (e == NULL || e->kind != KILN_EX_SYM)
				continue;
			uint32_t s = e->sym;
			if (r->syms[s] >= 0 && r->syms[s] != t->sizes[d])
				rc = kiln__errf(
				    r->err, r->errlen, KILN_EINVGRAPH,
				    "input %u: dim %u is %lld but symbol %s is "
				    "%lld (from input %u)",
				    i, d, (long long)t->sizes[d],
				    g->symbols[s].name, (long long)r->syms[s],
				    from[s]);
			r->syms[s] = t->sizes[d];
			from[s] = i;
		}
	}
	for (uint32_t s = 0; s < g->n_symbols && rc == 0; s++) {
		const kiln_symbol_t *y = &g->symbols[s];
		if (r->syms[s] < 0)
			rc = kiln__errf(
			    r->err, r->errlen, KILN_EINVGRAPH,
			    "symbol %s is not bound by any input size",
			    y->name);
		else if (r->syms[s] < y->min ||
			 (y->max >= 0 && r->syms[s] > y->max))
			rc = kiln__errf(
			    r->err, r->errlen, KILN_EINVGRAPH,
			    "input %u: symbol %s = %lld violates its "
			    "constraint [%lld, %s%lld]",
			    from[s], y->name, (long long)r->syms[s],
			    (long long)y->min, y->max < 0 ? "inf" : "",
			    y->max < 0 ? 0LL : (long long)y->max);
	}
	free(from);
	/* every input against its full spec */
	for (uint32_t i = 0; i < g->n_inputs && rc == 0; i++) {
		const kiln_value_t *v = &g->values[i];
		const kiln_tensor_t *t = &in[i];
		int64_t x;
		if (v->kind == KILN_VAL_SYMINT) {
			if (kiln_expr_eval(v->sym, r->syms, &x) < 0 ||
			    x != rd_i(t->data, t->dtype, 0))
				rc = kiln__errf(
				    r->err, r->errlen, KILN_EINVGRAPH,
				    "input %u: int %lld does not match its "
				    "declared expression",
				    i, (long long)rd_i(t->data, t->dtype, 0));
			continue;
		}
		for (uint32_t d = 0; d < v->rank && rc == 0; d++) {
			if (dim_eval(r, &v->sizes[d], &x) < 0 ||
			    x != t->sizes[d]) {
				char a[160], b[160];
				kiln__i_fmt_shape(a, sizeof(a), t->rank,
						  t->sizes);
				fmt_dims(r, b, sizeof(b), v->rank, v->sizes);
				rc = kiln__errf(
				    r->err, r->errlen, KILN_EINVGRAPH,
				    "input %u: shape %s does not match the "
				    "declared %s",
				    i, a, b);
			}
		}
	}
	return rc;
}

/* Copies input i into an internal value laid out with the declared strides. */
static int load_input(run_t *r, uint32_t i, const kiln_tensor_t *t)
{
	const kiln_value_t *v = &r->g->values[i];
	it_t *x = &r->vals[i];
	int64_t extent = 1, n = kiln__i_numel_of(t->rank, t->sizes);
	memset(x, 0, sizeof(*x));
	x->dt = v->dtype;
	x->rank = v->rank;
	for (uint32_t d = 0; d < v->rank; d++) {
		int64_t st;
		if (dim_eval(r, &v->strides[d], &st) < 0 || st < 0)
			return kiln__errf(r->err, r->errlen, KILN_EINVGRAPH,
					  "input %u: bad stride %u", i, d);
		x->size[d] = t->sizes[d];
		x->stride[d] = st;
		if (t->sizes[d] > 0) {
			if (st > 0 &&
			    t->sizes[d] - 1 > (KI_MAX_ELEMS - extent) / st)
				return kiln__errf(r->err, r->errlen,
						  KILN_EINVGRAPH,
						  "input %u: too large", i);
			extent += (t->sizes[d] - 1) * st;
		}
	}
	if (n == 0)
		extent = 0;
	x->buf = buf_new(v->dtype, extent);
	if (x->buf == NULL)
		return -ENOMEM;
	int64_t idx[KI_MAXR] = {0};
	if (n == 0)
		return 0;
	do {
		int64_t src = 0;
		for (uint32_t d = 0; d < t->rank; d++)
			src += idx[d] * t->strides[d];
		int64_t dst = ki_off(x, idx);
		if (x->buf->f)
			x->buf->f[dst] = rd_f(t->data, t->dtype, src);
		else
			x->buf->i[dst] = rd_i(t->data, t->dtype, src);
	} while (ki_next(idx, x->size, x->rank));
	return 0;
}

/* Checks the node's results against its declared out specs. */
static int check_outputs(run_t *r, ictx_t *c)
{
	for (uint32_t k = 0; k < c->nd->n_out; k++) {
		const kiln_value_t *v = &r->g->values[c->nd->out_first + k];
		const it_t *t = &c->out[k];
		if (t->buf == NULL)
			return kiln__errf(
			    r->err, r->errlen, KILN_EINTERNAL,
			    "node %u (%s): output %u was not computed", c->ni,
			    c->nd->op, k);
		bool same = t->dt == v->dtype && t->rank == v->rank;
		for (uint32_t d = 0; same && d < v->rank; d++) {
			int64_t x;
			same = dim_eval(r, &v->sizes[d], &x) == 0 &&
			       x == t->size[d];
		}
		if (!same) {
			char a[160], b[160];
			kiln__i_fmt_shape(a, sizeof(a), t->rank, t->size);
			fmt_dims(r, b, sizeof(b), v->rank, v->sizes);
			return kiln__i_bad(
			    c,
			    "output %u: computed %s%s but the node "
			    "declares %s%s",
			    k, kiln_dtype_name(t->dt), a,
			    kiln_dtype_name(v->dtype), b);
		}
	}
	return 0;
}

/* Lays out x, an op's new value, as value v is declared (torch's storage of
 * it: offset 0, the declared strides; a channels-last product), where its
 * layout differs and the declared one does not overlap: as_strided views
 * read the storage so. */
static int restride_as_declared(run_t *r, const kiln_value_t *v, it_t *x)
{
	if (x->buf == NULL || x->rank != v->rank || kiln__i_numel(x) == 0)
		return 0;
	int64_t st[KI_MAXR], extent = 1;
	bool same = x->off == 0;
	for (uint32_t d = 0; d < x->rank; d++) {
		if (dim_eval(r, &v->strides[d], &st[d]) < 0 || st[d] < 0 ||
		    (st[d] == 0 && x->size[d] > 1))
			return 0;
		same = same && (x->size[d] == 1 || st[d] == x->stride[d]);
		if (st[d] > 0 &&
		    x->size[d] - 1 > (KI_MAX_ELEMS - extent) / st[d])
			return 0;
		extent += (x->size[d] - 1) * st[d];
	}
	if (same)
		return 0;
	kiln__ibuf_t *b = buf_new(x->dt, extent);
	if (b == NULL)
		return -ENOMEM;
	int64_t idx[KI_MAXR] = {0};
	do {
		int64_t dst = 0;
		for (uint32_t d = 0; d < x->rank; d++)
			dst += idx[d] * st[d];
		int64_t src = ki_off(x, idx);
		if (b->f)
			b->f[dst] = x->buf->f[src];
		else
			b->i[dst] = x->buf->i[src];
	} while (ki_next(idx, x->size, x->rank));
	kiln__i_release(x);
	x->buf = b;
	x->off = 0;
	memcpy(x->stride, st, sizeof(int64_t) * x->rank);
	return 0;
}

static void mark_uses(const kiln_arg_t *a, uint32_t ni, uint32_t *last)
{
	if (a->kind == KILN_ARG_REF)
		last[a->u.ref] = ni + 1;
	else if (a->kind == KILN_ARG_LIST)
		for (uint32_t k = 0; k < a->n; k++)
			mark_uses(&a->u.list[k], ni, last);
}

static void release_dead(run_t *r, const kiln_arg_t *a, uint32_t ni,
			 const uint32_t *last)
{
	if (a->kind == KILN_ARG_REF) {
		if (last[a->u.ref] == ni + 1)
			kiln__i_release(&r->vals[a->u.ref]);
	} else if (a->kind == KILN_ARG_LIST) {
		for (uint32_t k = 0; k < a->n; k++)
			release_dead(r, &a->u.list[k], ni, last);
	}
}

static int run_node(run_t *r, uint32_t ni)
{
	const kiln_node_t *nd = &r->g->nodes[ni];
	ictx_t c = {.g = r->g,
		    .nd = nd,
		    .ni = ni,
		    .syms = r->syms,
		    .vals = r->vals,
		    .err = r->err,
		    .errlen = r->errlen};
	const opdef_t *op = find_op(nd->op);
	if (op == NULL)
		return kiln__errf(
		    r->err, r->errlen, KILN_EUNSUPOP,
		    "node %u (%s): the interpreter does not implement "
		    "this op",
		    ni, nd->op);
	c.out = calloc(nd->n_out ? nd->n_out : 1, sizeof(it_t));
	if (c.out == NULL)
		return -ENOMEM;
	int rc = op->fn(&c, op->code);
	if (rc == 0)
		rc = check_outputs(r, &c);
	for (uint32_t k = 0;
	     rc == 0 && !cir_is_view_op(nd->op) && k < nd->n_out; k++)
		rc = restride_as_declared(r, &r->g->values[nd->out_first + k],
					  &c.out[k]);
	for (uint32_t k = 0; k < nd->n_out; k++) {
		if (rc == 0) {
			r->vals[nd->out_first + k] = c.out[k];
			r->vals[nd->out_first + k].wrapped = false;
		} else {
			kiln__i_release(&c.out[k]);
		}
	}
	free(c.out);
	return rc;
}

/* Writes value v as a new contiguous output tensor (f64 / i64 / bool). */
static int emit_output(const it_t *x, kiln_tensor_t *o)
{
	kiln_dtype_t dt = ki_isf(x->dt)		  ? KILN_DT_F64
			  : x->dt == KILN_DT_BOOL ? KILN_DT_BOOL
						  : KILN_DT_I64;
	int64_t n = kiln__i_numel(x), idx[KI_MAXR] = {0}, k = 0;
	memset(o, 0, sizeof(*o));
	o->dtype = dt;
	o->rank = x->rank;
	memcpy(o->sizes, x->size, x->rank * sizeof(int64_t));
	kiln__i_contig_strides(x->rank, x->size, o->strides);
	o->data = malloc((size_t)(n > 0 ? n : 1) * kiln_dtype_size(dt));
	if (o->data == NULL)
		return -ENOMEM;
	if (n == 0)
		return 0;
	do {
		int64_t off = ki_off(x, idx);
		if (dt == KILN_DT_F64)
			((double *)o->data)[k++] = ki_getf(x, off);
		else if (dt == KILN_DT_I64)
			((int64_t *)o->data)[k++] = ki_geti(x, off);
		else
			((uint8_t *)o->data)[k++] = ki_geti(x, off) != 0;
	} while (ki_next(idx, x->size, x->rank));
	return 0;
}

int kiln_interp_run(const kiln_graph_t *g, const kiln_tensor_t *inputs,
		    kiln_tensor_t *outputs, char *err, size_t errlen)
{
	run_t r = {.g = g, .err = err, .errlen = errlen};
	uint32_t *last = NULL;
	int rc = 0;
	if (g->n_outputs > 0)
		memset(outputs, 0, g->n_outputs * sizeof(*outputs));
	r.syms = calloc(g->n_symbols ? g->n_symbols : 1, sizeof(int64_t));
	r.vals = calloc(g->n_values ? g->n_values : 1, sizeof(it_t));
	last = calloc(g->n_values ? g->n_values : 1, sizeof(uint32_t));
	if (r.syms == NULL || r.vals == NULL || last == NULL) {
		rc = -ENOMEM;
		goto done;
	}
	rc = bind_inputs(&r, inputs);
	for (uint32_t i = 0; i < g->n_inputs && rc == 0; i++)
		if (g->values[i].kind == KILN_VAL_TENSOR)
			rc = load_input(&r, i, &inputs[i]);
	if (rc < 0)
		goto done;
	/* last[v] = 1 + the last node that reads v; graph outputs live on */
	for (uint32_t ni = 0; ni < g->n_nodes; ni++) {
		const kiln_node_t *nd = &g->nodes[ni];
		for (uint32_t k = 0; k < nd->n_out; k++)
			last[nd->out_first + k] = ni + 1;
		for (uint32_t k = 0; k < nd->n_args; k++)
			mark_uses(&nd->args[k], ni, last);
		for (uint32_t k = 0; k < nd->n_kwargs; k++)
			mark_uses(&nd->kwargs[k].val, ni, last);
	}
	for (uint32_t k = 0; k < g->n_outputs; k++)
		if (g->outputs[k].kind == KILN_ARG_REF)
			last[g->outputs[k].u.ref] = UINT32_MAX;
	for (uint32_t ni = 0; ni < g->n_nodes && rc == 0; ni++) {
		const kiln_node_t *nd = &g->nodes[ni];
		rc = run_node(&r, ni);
		if (rc < 0)
			break;
		for (uint32_t k = 0; k < nd->n_args; k++)
			release_dead(&r, &nd->args[k], ni, last);
		for (uint32_t k = 0; k < nd->n_kwargs; k++)
			release_dead(&r, &nd->kwargs[k].val, ni, last);
		for (uint32_t k = 0; k < nd->n_out; k++)
			if (last[nd->out_first + k] == ni + 1)
				kiln__i_release(&r.vals[nd->out_first + k]);
	}
	for (uint32_t k = 0; k < g->n_outputs && rc == 0; k++) {
		const kiln_arg_t *o = &g->outputs[k];
		if (o->kind == KILN_ARG_SYM ||
		    (o->kind == KILN_ARG_REF &&
		     g->values[o->u.ref].kind == KILN_VAL_SYMINT)) {
			int64_t v;
			const kiln_expr_t *e = o->kind == KILN_ARG_SYM
						   ? o->u.sym
						   : g->values[o->u.ref].sym;
			if (kiln_expr_eval(e, r.syms, &v) < 0) {
				rc = kiln__errf(
				    err, errlen, KILN_EINVGRAPH,
				    "output %u: expression does not evaluate",
				    k);
				break;
			}
			outputs[k].dtype = KILN_DT_I64;
			outputs[k].rank = 0;
			outputs[k].data = malloc(sizeof(int64_t));
			if (outputs[k].data == NULL) {
				rc = -ENOMEM;
				break;
			}
			memcpy(outputs[k].data, &v, sizeof(v));
			continue;
		}
		if (o->kind != KILN_ARG_REF || r.vals[o->u.ref].buf == NULL) {
			rc = kiln__errf(err, errlen, KILN_EINTERNAL,
					"output %u: no value", k);
			break;
		}
		rc = emit_output(&r.vals[o->u.ref], &outputs[k]);
	}
	if (rc == -ENOMEM)
		kiln__errf(err, errlen, rc, "out of memory");
done:
	if (r.vals != NULL)
		for (uint32_t v = 0; v < g->n_values; v++)
			kiln__i_release(&r.vals[v]);
	if (rc < 0)
		for (uint32_t k = 0; k < g->n_outputs; k++) {
			free(outputs[k].data);
			outputs[k].data = NULL;
		}
	free(r.syms);
	free(r.vals);
	free(last);
	return rc;
}
