/*
 * lower.c — ATen graph → lazy tensors and compute nodes.
 *
 * Each graph value becomes a lazy tensor (lt_t): either a strided view of a
 * buffer (inputs, realized results) or a function of its index (a scalar
 * expression over VAR 0..rank-1). Pointwise ops compose functions; views
 * re-index them (buffer views just get new strides: never a copy);
 * reductions create compute nodes. A value is realized (written to a buffer
 * by a compute node) only when it must be: a reduction, a graph output, a
 * heavy value used more than once, or a body grown too large. The scheduler
 * (sched.c) then decides which compute nodes share a kernel.
 *
 * This file has the infrastructure, pointwise, view and reduction ops;
 * decompose.c has the composite ops (softmax, layer_norm, backward ops, ...).
 * Every op checks its inputs and its declared outputs and rejects a
 * mismatch as invalid_graph naming the node.
 */
#include "compiler/lower.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- context helpers ----------------------------------------------------- */

int cir_err(cctx_t *c, int code, const char *fmt, ...)
{
	if (c->err != NULL && c->errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err, c->errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

void *cir_alloc(cctx_t *c, size_t n)
{
	return kiln_arena_calloc(c->arena, 1, n);
}

int lerr(lnode_t *n, int code, const char *fmt, ...)
{
	cctx_t *c = n->c;
	if (c->err != NULL && c->errlen > 0) {
		int w = snprintf(c->err, c->errlen, "node %u (%s): ", n->index,
				 n->n->op);
		size_t off = w < 0 ? 0 : (size_t)w;
		if (off >= c->errlen)
			off = c->errlen - 1;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err + off, c->errlen - off, fmt, ap);
		va_end(ap);
	}
	return code;
}

#define GROW(c, arr, n, cap)                                                   \
	do {                                                                   \
		if ((n) == (cap)) {                                            \
			uint32_t nc = (cap) ? (cap)*2 : 64;                    \
			void *na =                                             \
			    kiln_arena_calloc((c)->arena, nc, sizeof(*(arr))); \
			if (na == NULL)                                        \
				return -ENOMEM;                                \
			if ((n) > 0)                                           \
				memcpy(na, (arr), (n) * sizeof(*(arr)));       \
			(arr) = na;                                            \
			(cap) = nc;                                            \
		}                                                              \
	} while (0)

static void contig_strides(cctx_t *c, uint32_t rank, const kiln_dim_t *sizes,
			   kiln_dim_t *strides);

static int grow_bufs(cctx_t *c)
{
	GROW(c, c->bufs, c->n_bufs, c->cap_bufs);
	return 0;
}

uint32_t new_buf(cctx_t *c, cbuf_kind_t kind, kiln_dtype_t dt, uint32_t rank,
		 const kiln_dim_t *sizes)
{
	if (grow_bufs(c) != 0)
		return UINT32_MAX;
	cbuf_t *b = &c->bufs[c->n_bufs];
	memset(b, 0, sizeof(*b));
	b->kind = kind;
	b->dtype = dt;
	b->rank = rank;
	for (uint32_t i = 0; i < rank; i++)
		b->sizes[i] = sizes[i];
	contig_strides(c, rank, sizes, b->strides);
	b->input = -1;
	b->producer = -1;
	b->kernel = -1;
	b->last_use = -1;
	b->out_index = -1;
	b->art_buf = -1;
	return c->n_bufs++;
}

static int grow_nodes(cctx_t *c)
{
	GROW(c, c->nodes, c->n_nodes, c->cap_nodes);
	return 0;
}

int32_t new_cnode(cctx_t *c)
{
	if (grow_nodes(c) != 0)
		return -1;
	cnode_t *n = &c->nodes[c->n_nodes];
	memset(n, 0, sizeof(*n));
	n->kernel = -1;
	n->node = -1;
	return (int32_t)c->n_nodes++;
}

/* ---- lazy tensors -------------------------------------------------------- */

lt_t *lt_new(cctx_t *c, kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sizes)
{
	lt_t *t = cir_alloc(c, sizeof(*t));
	if (t == NULL)
		return NULL;
	t->dtype = dt;
	t->rank = rank;
	for (uint32_t i = 0; i < rank; i++)
		t->sizes[i] = sizes[i];
	t->offset = dim_const(0);
	return t;
}

lt_t *lt_fn(cctx_t *c, kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sizes,
	    const sx_t *body)
{
	if (body == NULL)
		return NULL;
	lt_t *t = lt_new(c, dt, rank, sizes);
	if (t != NULL)
		t->body = body;
	return t;
}

static void contig_strides(cctx_t *c, uint32_t rank, const kiln_dim_t *sizes,
			   kiln_dim_t *strides)
{
	kiln_dim_t s = dim_const(1);
	for (uint32_t i = rank; i-- > 0;) {
		strides[i] = s;
		kiln_dim_t sz = sizes[i];
		if (dim_is(sz, 0))
			sz = dim_const(1);
		s = dim_mul(c, s, sz);
	}
}

lt_t *lt_buf(cctx_t *c, uint32_t buf)
{
	const cbuf_t *b = &c->bufs[buf];
	lt_t *t = lt_new(c, b->dtype, b->rank, b->sizes);
	if (t == NULL)
		return NULL;
	t->is_buf = true;
	t->buf = buf;
	for (uint32_t k = 0; k < b->rank; k++)
		t->strides[k] = b->strides[k];
	return t;
}

const sx_t *lt_at(cctx_t *c, const lt_t *t, const kiln_expr_t *const *idx)
{
	if (t->is_buf) {
		const kiln_expr_t *off = ix_dim(c, t->offset);
		for (uint32_t k = 0; k < t->rank && off; k++) {
			if (dim_is(t->sizes[k], 1) || dim_is(t->strides[k], 0))
				continue;
			off =
			    ix_add(c, off,
				   ix_mul(c, idx[k], ix_dim(c, t->strides[k])));
		}
		return sx_load(c, t->buf, off, NULL, NULL);
	}
	return sx_subst(c, t->body, idx, t->rank);
}

const sx_t *lt_body(cctx_t *c, const lt_t *t)
{
	if (!t->is_buf)
		return t->body;
	const kiln_expr_t *idx[CIR_MAX_RANK];
	for (uint32_t k = 0; k < t->rank; k++)
		idx[k] = ix_var(c, k);
	return lt_at(c, t, idx);
}

const sx_t *lt_bcast_body(cctx_t *c, const lt_t *t, uint32_t rank,
			  const kiln_dim_t *sizes)
{
	const kiln_expr_t *idx[CIR_MAX_RANK];
	uint32_t lead = rank - t->rank;
	for (uint32_t k = 0; k < t->rank; k++) {
		bool b1 = dim_is(t->sizes[k], 1) && !dim_is(sizes[lead + k], 1);
		idx[k] = b1 ? ix_const(c, 0) : ix_var(c, lead + k);
	}
	if (!t->is_buf && t->rank == rank) {
		bool ident = true;
		for (uint32_t k = 0; k < rank; k++)
			ident = ident && idx[k]->kind == KILN_EX_VAR;
		if (ident)
			return t->body;
	}
	return lt_at(c, t, idx);
}

/* Sets the simplifier's variable ranges to a shape. */
void set_var_ranges(cctx_t *c, uint32_t rank, const kiln_dim_t *sizes)
{
	for (uint32_t k = 0; k < CIR_MAX_VARS; k++)
		c->var_known[k] = false;
	for (uint32_t k = 0; k < rank && k < CIR_MAX_VARS; k++) {
		c->var_size[k] = sizes[k];
		c->var_known[k] = true;
	}
}

/* t written by a new pointwise cnode into a new buffer, laid out with
 * strides where they are given (NULL: contiguous). */
static int realize_new(cctx_t *c, lt_t *t, int32_t node,
		       const kiln_dim_t *strides, lt_t **out)
{
	const sx_t *body = lt_body(c, t);
	if (body == NULL)
		return -ENOMEM;
	uint32_t b = new_buf(c, CB_TEMP, t->dtype, t->rank, t->sizes);
	int32_t n = new_cnode(c);
	if (b == UINT32_MAX || n < 0)
		return -ENOMEM;
	cnode_t *cn = &c->nodes[n];
	cn->buf = b;
	cn->red = RED_NONE;
	cn->frank = t->rank;
	for (uint32_t k = 0; k < t->rank; k++)
		cn->fsizes[k] = t->sizes[k];
	cn->body = body;
	cn->node = node;
	c->bufs[b].producer = n;
	if (strides != NULL) {
		for (uint32_t k = 0; k < t->rank; k++)
			c->bufs[b].strides[k] = strides[k];
		c->bufs[b].custom_strides = true;
	}
	*out = lt_buf(c, b);
	return *out ? 0 : -ENOMEM;
}

int lt_realize(cctx_t *c, lt_t *t, int32_t node, lt_t **out)
{
	if (t->is_buf && c->bufs[t->buf].kind == CB_TEMP) {
		/* already a contiguous buffer? */
		kiln_dim_t st[CIR_MAX_RANK];
		contig_strides(c, t->rank, t->sizes, st);
		bool contig =
		    dim_is(t->offset, 0) && c->bufs[t->buf].rank == t->rank;
		for (uint32_t k = 0; k < t->rank && contig; k++)
			contig = dim_eq(st[k], t->strides[k]) &&
				 dim_eq(t->sizes[k], c->bufs[t->buf].sizes[k]);
		if (contig) {
			*out = t;
			return 0;
		}
	}
	return realize_new(c, t, node, NULL, out);
}

int lt_reduce(cctx_t *c, const lt_t *t, uint32_t rmask, bool keepdim,
	      red_op_t op, kiln_dtype_t out_dt, const sx_t *body, int32_t node,
	      lt_t **out)
{
	kiln_dim_t osz[CIR_MAX_RANK];
	uint32_t orank = 0;
	for (uint32_t k = 0; k < t->rank; k++) {
		if (rmask >> k & 1) {
			if (keepdim)
				osz[orank++] = dim_const(1);
		} else {
			osz[orank++] = t->sizes[k];
		}
	}
	if (body == NULL)
		body = lt_body(c, t);
	if (body == NULL)
		return -ENOMEM;
	uint32_t b = new_buf(c, CB_TEMP, out_dt, orank, osz);
	int32_t n = new_cnode(c);
	if (b == UINT32_MAX || n < 0)
		return -ENOMEM;
	cnode_t *cn = &c->nodes[n];
	cn->buf = b;
	cn->red = op;
	cn->frank = t->rank;
	for (uint32_t k = 0; k < t->rank; k++)
		cn->fsizes[k] = t->sizes[k];
	cn->rmask = rmask;
	cn->keepdim = keepdim;
	cn->body = body;
	cn->node = node;
	c->bufs[b].producer = n;
	*out = lt_buf(c, b);
	return *out ? 0 : -ENOMEM;
}

/* ---- argument access ---------------------------------------------------- */

const kiln_arg_t *larg(lnode_t *n, uint32_t pos, const char *name)
{
	const kiln_node_t *nd = n->n;
	if (pos < nd->n_args)
		return &nd->args[pos];
	if (name != NULL)
		for (uint32_t i = 0; i < nd->n_kwargs; i++)
			if (strcmp(nd->kwargs[i].key, name) == 0)
				return &nd->kwargs[i].val;
	return NULL;
}

int ltensor(lnode_t *n, uint32_t pos, const char *name, lt_t **out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind != KILN_ARG_REF)
		return lerr(n, KILN_EINVGRAPH,
			    "argument %u (%s) must be a "
			    "tensor",
			    pos, name ? name : "?");
	lt_t *t = n->c->vals[a->u.ref];
	if (t == NULL)
		return lerr(n, KILN_EINVGRAPH,
			    "argument %u refers to value %u, which is not a "
			    "tensor",
			    pos, a->u.ref);
	*out = t;
	return 0;
}

/* Optional tensor: NULL when nil or absent. */
int ltensor_opt(lnode_t *n, uint32_t pos, const char *name, lt_t **out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	*out = NULL;
	if (a == NULL || a->kind == KILN_ARG_NIL)
		return 0;
	return ltensor(n, pos, name, out);
}

int lint(lnode_t *n, uint32_t pos, const char *name, int64_t def, int64_t *out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind == KILN_ARG_NIL) {
		*out = def;
		return 0;
	}
	if (a->kind == KILN_ARG_INT) {
		*out = a->u.i;
		return 0;
	}
	if (a->kind == KILN_ARG_BOOL) {
		*out = a->u.b;
		return 0;
	}
	return lerr(n, KILN_EINVGRAPH, "argument %u (%s) must be an int", pos,
		    name ? name : "?");
}

/* An int that may be symbolic: as an index expression. */
int lsymint(lnode_t *n, const kiln_arg_t *a, const kiln_expr_t **out)
{
	if (a != NULL && a->kind == KILN_ARG_INT) {
		*out = ix_const(n->c, a->u.i);
		return 0;
	}
	if (a != NULL && a->kind == KILN_ARG_SYM) {
		*out = ix_intern(n->c, a->u.sym);
		return *out ? 0 : -ENOMEM;
	}
	return lerr(n, KILN_EINVGRAPH, "expected an int or a symbolic int");
}

int lbool(lnode_t *n, uint32_t pos, const char *name, bool def, bool *out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind == KILN_ARG_NIL) {
		*out = def;
		return 0;
	}
	if (a->kind == KILN_ARG_BOOL) {
		*out = a->u.b;
		return 0;
	}
	if (a->kind == KILN_ARG_INT) {
		*out = a->u.i != 0;
		return 0;
	}
	return lerr(n, KILN_EINVGRAPH, "argument %u (%s) must be a bool", pos,
		    name ? name : "?");
}

int lfloat(lnode_t *n, uint32_t pos, const char *name, double def, double *out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind == KILN_ARG_NIL) {
		*out = def;
		return 0;
	}
	if (a->kind == KILN_ARG_FLOAT) {
		*out = a->u.f;
		return 0;
	}
	if (a->kind == KILN_ARG_INT) {
		*out = (double)a->u.i;
		return 0;
	}
	if (a->kind == KILN_ARG_BOOL) {
		*out = a->u.b;
		return 0;
	}
	return lerr(n, KILN_EINVGRAPH, "argument %u (%s) must be a number", pos,
		    name ? name : "?");
}

int lstr(lnode_t *n, uint32_t pos, const char *name, const char *def,
	 const char **out)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind == KILN_ARG_NIL) {
		*out = def;
		return 0;
	}
	if (a->kind == KILN_ARG_STR) {
		*out = a->u.s;
		return 0;
	}
	return lerr(n, KILN_EINVGRAPH, "argument %u (%s) must be a string", pos,
		    name ? name : "?");
}

int lintlist(lnode_t *n, uint32_t pos, const char *name, int64_t *vals,
	     uint32_t *count, uint32_t max)
{
	const kiln_arg_t *a = larg(n, pos, name);
	*count = 0;
	if (a == NULL || a->kind == KILN_ARG_NIL)
		return 0;
	if (a->kind == KILN_ARG_INT) {
		vals[0] = a->u.i;
		*count = 1;
		return 0;
	}
	if (a->kind != KILN_ARG_LIST || a->n > max)
		return lerr(n, KILN_EINVGRAPH,
			    "argument %u (%s) must be a list of at most %u "
			    "ints",
			    pos, name ? name : "?", max);
	for (uint32_t i = 0; i < a->n; i++) {
		if (a->u.list[i].kind != KILN_ARG_INT)
			return lerr(n, KILN_EINVGRAPH,
				    "argument %u (%s)[%u] must be an int", pos,
				    name ? name : "?", i);
		vals[i] = a->u.list[i].u.i;
	}
	*count = a->n;
	return 0;
}

/* A list of symbolic ints (sizes). */
int lsizelist(lnode_t *n, uint32_t pos, const char *name,
	      const kiln_expr_t **vals, uint32_t *count)
{
	const kiln_arg_t *a = larg(n, pos, name);
	if (a == NULL || a->kind != KILN_ARG_LIST || a->n > CIR_MAX_RANK)
		return lerr(n, KILN_EINVGRAPH,
			    "argument %u (%s) must be a list of sizes", pos,
			    name ? name : "?");
	for (uint32_t i = 0; i < a->n; i++) {
		int rc = lsymint(n, &a->u.list[i], &vals[i]);
		if (rc != 0)
			return rc;
	}
	*count = a->n;
	return 0;
}

int ldim(lnode_t *n, int64_t d, uint32_t rank, uint32_t *out)
{
	int64_t r = rank == 0 ? 1 : rank;
	if (d < -r || d >= r)
		return lerr(n, KILN_EINVGRAPH,
			    "dim %lld out of range for a rank-%u tensor",
			    (long long)d, rank);
	*out = (uint32_t)(d < 0 ? d + r : d);
	return 0;
}

/* ---- declared outputs ---------------------------------------------------- */

const kiln_value_t *lout(lnode_t *n, uint32_t k)
{
	if (k >= n->n->n_out)
		return NULL;
	return &n->c->g->values[n->n->out_first + k];
}

/* Checks a computed lazy tensor against declared output k and stores it. */
int lset(lnode_t *n, uint32_t k, lt_t *t)
{
	cctx_t *c = n->c;
	if (t == NULL)
		return -ENOMEM;
	if (n->capture != NULL) {
		n->capture[k] = t;
		return 0;
	}
	const kiln_value_t *v = lout(n, k);
	if (v == NULL)
		return lerr(n, KILN_EINVGRAPH,
			    "the op has more outputs than \"out\" lists");
	if (v->kind != KILN_VAL_TENSOR)
		return lerr(n, KILN_EINVGRAPH, "out %u must be a tensor", k);
	if (v->rank != t->rank)
		return lerr(n, KILN_EINVGRAPH,
			    "out %u: declared rank %u but the op gives rank %u",
			    k, v->rank, t->rank);
	for (uint32_t i = 0; i < t->rank; i++) {
		kiln_dim_t d = dim_of(ix_dim(c, v->sizes[i]));
		if (!dim_eq(d, t->sizes[i])) {
			char a[64], b[64];
			kiln_expr_format(c->g, ix_dim(c, d), a, sizeof(a));
			kiln_expr_format(c->g, ix_dim(c, t->sizes[i]), b,
					 sizeof(b));
			return lerr(n, KILN_EINVGRAPH,
				    "out %u: declared size %s at dim %u but "
				    "the op gives %s",
				    k, a, i, b);
		}
	}
	if (v->dtype != t->dtype) {
		/* the declared dtype rules (it is what torch computed) */
		if (!t->is_buf) {
			const sx_t *b = sx_cast(c, t->body, v->dtype);
			t = lt_fn(c, v->dtype, t->rank, t->sizes, b);
			if (t == NULL)
				return -ENOMEM;
		} else {
			lt_t *u = lt_fn(c, v->dtype, t->rank, t->sizes,
					sx_cast(c, lt_body(c, t), v->dtype));
			if (u == NULL)
				return -ENOMEM;
			t = u;
		}
	}
	c->vals[n->n->out_first + k] = t;
	return 0;
}

/* Sizes of declared output k (interned). */
int lout_sizes(lnode_t *n, uint32_t k, uint32_t *rank, kiln_dim_t *sizes,
	       kiln_dtype_t *dt)
{
	const kiln_value_t *v = lout(n, k);
	if (v == NULL || v->kind != KILN_VAL_TENSOR)
		return lerr(n, KILN_EINVGRAPH, "missing tensor out %u", k);
	*rank = v->rank;
	for (uint32_t i = 0; i < v->rank; i++)
		sizes[i] = dim_of(ix_dim(n->c, v->sizes[i]));
	if (dt)
		*dt = v->dtype;
	return 0;
}

/* ---- type promotion (c10's result_type) --------------------------------- */

static int dt_cat(kiln_dtype_t d)
{
	if (d == KILN_DT_BOOL)
		return 0;
	if (kiln_dtype_is_float(d))
		return 2;
	return 1;
}

kiln_dtype_t promote2(kiln_dtype_t a, kiln_dtype_t b)
{
	if (a == b)
		return a;
	if (a == KILN_DT__COUNT)
		return b;
	if (b == KILN_DT__COUNT)
		return a;
	int ca = dt_cat(a), cb = dt_cat(b);
	if (ca != cb)
		return ca > cb ? a : b;
	if (ca == 2) {
		if ((a == KILN_DT_F16 && b == KILN_DT_BF16) ||
		    (a == KILN_DT_BF16 && b == KILN_DT_F16))
			return KILN_DT_F32;
		return kiln_dtype_size(a) >= kiln_dtype_size(b) ? a : b;
	}
	/* ints: u8 with a signed type */
	if (a == KILN_DT_U8 || b == KILN_DT_U8) {
		kiln_dtype_t o = a == KILN_DT_U8 ? b : a;
		return o == KILN_DT_I8 ? KILN_DT_I16 : o;
	}
	return kiln_dtype_size(a) >= kiln_dtype_size(b) ? a : b;
}

static kiln_dtype_t combine(kiln_dtype_t higher, kiln_dtype_t lower)
{
	if (higher != KILN_DT__COUNT && kiln_dtype_is_float(higher))
		return higher;
	if (higher == KILN_DT_BOOL ||
	    (lower != KILN_DT__COUNT && kiln_dtype_is_float(lower)))
		return promote2(higher, lower);
	if (higher != KILN_DT__COUNT)
		return higher;
	return lower;
}

void rt_init(rtype_t *r)
{
	r->dim = r->zero = r->wrapped = KILN_DT__COUNT;
}

void rt_tensor(rtype_t *r, const lt_t *t)
{
	if (t->rank > 0)
		r->dim = promote2(r->dim, t->dtype);
	else
		r->zero = promote2(r->zero, t->dtype);
}

void rt_scalar(rtype_t *r, const kiln_arg_t *a)
{
	kiln_dtype_t d = a->kind == KILN_ARG_FLOAT  ? KILN_DT_F32
			 : a->kind == KILN_ARG_BOOL ? KILN_DT_BOOL
						    : KILN_DT_I64;
	r->wrapped = promote2(r->wrapped, d);
}

kiln_dtype_t rt_result(const rtype_t *r)
{
	kiln_dtype_t d = combine(r->dim, combine(r->zero, r->wrapped));
	return d == KILN_DT__COUNT ? KILN_DT_F32 : d;
}

/* ---- operands: a tensor or a scalar -------------------------------------- */

int loperand(lnode_t *n, uint32_t pos, const char *name, operand_t *o)
{
	const kiln_arg_t *a = larg(n, pos, name);
	memset(o, 0, sizeof(*o));
	if (a == NULL)
		return lerr(n, KILN_EINVGRAPH, "missing argument %u (%s)", pos,
			    name ? name : "?");
	o->arg = a;
	if (a->kind == KILN_ARG_REF)
		return ltensor(n, pos, name, &o->t);
	if (a->kind == KILN_ARG_INT || a->kind == KILN_ARG_FLOAT ||
	    a->kind == KILN_ARG_BOOL || a->kind == KILN_ARG_SYM)
		return 0;
	return lerr(n, KILN_EINVGRAPH,
		    "argument %u (%s) must be a tensor or "
		    "a number",
		    pos, name ? name : "?");
}

void rt_operand(rtype_t *r, const operand_t *o)
{
	if (o->t != NULL)
		rt_tensor(r, o->t);
	else if (o->arg->kind == KILN_ARG_SYM)
		r->wrapped = promote2(r->wrapped, KILN_DT_I64);
	else
		rt_scalar(r, o->arg);
}

/* The operand's value at VAR 0.. of the output shape, in dtype cdt. */
const sx_t *lop_value(lnode_t *n, const operand_t *o, uint32_t rank,
		      const kiln_dim_t *sizes, kiln_dtype_t cdt)
{
	cctx_t *c = n->c;
	if (o->t != NULL)
		return sx_cast(c, lt_bcast_body(c, o->t, rank, sizes), cdt);
	switch (o->arg->kind) {
	case KILN_ARG_INT: return sx_consti(c, o->arg->u.i, cdt);
	case KILN_ARG_BOOL: return sx_consti(c, o->arg->u.b, cdt);
	case KILN_ARG_FLOAT:
		if (!kiln_dtype_is_float(compute_dtype(cdt)))
			return sx_consti(c, (int64_t)o->arg->u.f, cdt);
		return sx_constf(c, o->arg->u.f, cdt);
	case KILN_ARG_SYM:
		return sx_cast(c, sx_index(c, ix_intern(c, o->arg->u.sym)),
			       cdt);
	default: return NULL;
	}
}

/* Broadcasts operand shapes (right-aligned); checks they agree. */
int lbroadcast(lnode_t *n, const operand_t *ops, uint32_t n_ops, uint32_t *rank,
	       kiln_dim_t *sizes)
{
	uint32_t r = 0;
	for (uint32_t i = 0; i < n_ops; i++)
		if (ops[i].t != NULL && ops[i].t->rank > r)
			r = ops[i].t->rank;
	for (uint32_t k = 0; k < r; k++)
		sizes[k] = dim_const(1);
	for (uint32_t i = 0; i < n_ops; i++) {
		const lt_t *t = ops[i].t;
		if (t == NULL)
			continue;
		uint32_t lead = r - t->rank;
		for (uint32_t k = 0; k < t->rank; k++) {
			kiln_dim_t *s = &sizes[lead + k];
			kiln_dim_t d = t->sizes[k];
			if (dim_is(d, 1) || dim_eq(*s, d))
				continue;
			if (dim_is(*s, 1)) {
				*s = d;
				continue;
			}
			char a[64], b[64];
			kiln_expr_format(n->c->g, ix_dim(n->c, *s), a,
					 sizeof(a));
			kiln_expr_format(n->c->g, ix_dim(n->c, d), b,
					 sizeof(b));
			return lerr(n, KILN_EINVGRAPH,
				    "shapes do not broadcast: size %s against "
				    "%s at dim %u",
				    a, b, lead + k);
		}
	}
	*rank = r;
	return 0;
}

/* ---- the driver ---------------------------------------------------------- */

#include "compiler/ops.h"

static const op_entry_t *find_op(const char *name)
{
	for (size_t i = 0; i < kiln__n_ops; i++)
		if (strcmp(kiln__ops[i].name, name) == 0)
			return &kiln__ops[i];
	return NULL;
}

bool kiln__op_supported(const char *name)
{
	return find_op(name) != NULL;
}

static int bind_input(cctx_t *c, uint32_t i)
{
	const kiln_value_t *v = &c->g->values[i];
	if (v->kind != KILN_VAL_TENSOR)
		return 0;
	kiln_dim_t sizes[CIR_MAX_RANK];
	for (uint32_t k = 0; k < v->rank; k++)
		sizes[k] = dim_of(ix_dim(c, v->sizes[k]));
	uint32_t b = new_buf(c, CB_INPUT, v->dtype, v->rank, sizes);
	if (b == UINT32_MAX)
		return -ENOMEM;
	c->bufs[b].input = (int32_t)i;
	lt_t *t = lt_new(c, v->dtype, v->rank, sizes);
	if (t == NULL)
		return -ENOMEM;
	t->is_buf = true;
	t->buf = b;
	for (uint32_t k = 0; k < v->rank; k++)
		t->strides[k] = dim_of(ix_dim(c, v->strides[k]));
	c->vals[i] = t;
	return 0;
}

static void count_use(cctx_t *c, const kiln_arg_t *a)
{
	if (a->kind == KILN_ARG_REF)
		c->uses[a->u.ref]++;
	else if (a->kind == KILN_ARG_LIST)
		for (uint32_t i = 0; i < a->n; i++)
			count_use(c, &a->u.list[i]);
}

/* Whether a lazy value should be realized now (see the file comment). */
static bool must_realize(const lt_t *t, uint32_t uses)
{
	if (t->is_buf)
		return false;
	uint32_t size = sx_size(t->body, 400);
	if (size >= 400)
		return true;
	if (uses > 1 && sx_is_heavy(t->body))
		return true;
	if (uses > 6)
		return true;
	return false;
}

uint32_t cir_view_base(const kiln_graph_t *g, uint32_t v)
{
	for (;;) {
		int32_t p = g->values[v].producer;
		if (p < 0 || (uint32_t)p >= g->n_nodes ||
		    !cir_is_view_op(g->nodes[p].op) ||
		    g->nodes[p].n_args == 0 ||
		    g->nodes[p].args[0].kind != KILN_ARG_REF ||
		    g->nodes[p].args[0].u.ref >= v)
			return v;
		v = g->nodes[p].args[0].u.ref;
	}
}

/* Whether the graph declares value dv dense channels-last: rank 4 with
 * static strides [H·W·C, 1, W·C, C] (any stride on a dim of size 1),
 * more than one channel, more than one position: eager's layout for a
 * convolution network run channels-last (ConvNeXt's blocks, or
 * memory_format=torch.channels_last). */
bool decl_nhwc(const kiln_value_t *dv)
{
	if (dv->kind != KILN_VAL_TENSOR || !dv->strides_given || dv->rank != 4)
		return false;
	int64_t sz[4];
	for (int k = 0; k < 4; k++) {
		if (dv->sizes[k].e != NULL || dv->strides[k].e != NULL)
			return false;
		sz[k] = dv->sizes[k].c;
	}
	if (sz[1] <= 1 || sz[2] * sz[3] <= 1)
		return false;
	const int64_t want[4] = {sz[2] * sz[3] * sz[1], 1, sz[3] * sz[1],
				 sz[1]};
	for (int k = 0; k < 4; k++)
		if (sz[k] != 1 && dv->strides[k].c != want[k])
			return false;
	return true;
}

/* Whether graph g computes channels-last (cctx_t.nhwc): one of its
 * outputs is a computed value it declares dense channels-last, as a
 * training forward's activations saved for the backward are where the
 * model runs channels-last. */
static bool graph_nhwc(const kiln_graph_t *g)
{
	for (uint32_t i = 0; i < g->n_outputs; i++) {
		const kiln_arg_t *o = &g->outputs[i];
		if (o->kind == KILN_ARG_REF &&
		    g->values[o->u.ref].producer >= 0 &&
		    decl_nhwc(&g->values[o->u.ref]))
			return true;
	}
	return false;
}

/* Loads of an [N, C, H, W] body that are strided along the dim an
 * NHWC-order loop runs innermost (C) and along the one an NCHW-order loop
 * does (W); loads that do not move with a dim (a per-channel parameter,
 * per-position statistics) are read as broadcasts there and do not
 * count. */
struct layout_vote {
	int64_t bad_nhwc, bad_nchw;
};

static void layout_vote_load(void *arg, const sx_t *ld)
{
	struct layout_vote *v = arg;
	int64_t kc = 0, kw = 0;
	if (ld->b != NULL)
		return;
	if (ix_coef(ld->idx, 1, &kc) && kc != 0 && kc != 1)
		v->bad_nhwc++;
	if (ix_coef(ld->idx, 3, &kw) && kw != 0 && kw != 1)
		v->bad_nchw++;
}

/* Whether t, declared dense channels-last, is better computed in NHWC
 * order: more of its loads are strided along W than along C (its own
 * channels-last store aside, which an NCHW-order loop writes through
 * tiles): the output of a channels-last convolution, a LayerNorm2d over
 * one. A tie keeps the NCHW order (and its tiles). */
static bool nhwc_order(const lt_t *t)
{
	if (t->is_buf)
		return dim_is(t->strides[1], 1) && !dim_is(t->strides[3], 1);
	struct layout_vote v = {0, 0};
	sx_each_load(t->body, layout_vote_load, &v);
	return v.bad_nchw > v.bad_nhwc;
}

/* Whether t is computed channels-last: the graph computes so (c->nhwc),
 * declares t's value dv dense channels-last (decl_nhwc), and t is computed
 * best in that order (nhwc_order). */
bool wants_nhwc(cctx_t *c, const kiln_value_t *dv, const lt_t *t)
{
	return c->nhwc && t->rank == 4 && decl_nhwc(dv) && nhwc_order(t);
}

int lt_realize_nhwc(cctx_t *c, lt_t *t, int32_t node, lt_t **out)
{
	static const uint32_t nhwc[4] = {0, 2, 3, 1};
	static const uint32_t nchw[4] = {0, 3, 1, 2};
	lt_t *p = lt_permute(c, t, nhwc);
	if (p == NULL)
		return -ENOMEM;
	int rc = lt_realize(c, p, node, &p);
	if (rc != 0)
		return rc;
	*out = lt_permute(c, p, nchw);
	return *out ? 0 : -ENOMEM;
}

/* Realizes t where wants_nhwc as a view of a buffer written in NHWC order,
 * which kiln's channels-last convolutions read as it lies; any other
 * value contiguous. */
int realize_as_declared(cctx_t *c, lt_t *t, const kiln_value_t *dv,
			int32_t node, lt_t **out)
{
	if (!wants_nhwc(c, dv, t))
		return lt_realize(c, t, node, out);
	return lt_realize_nhwc(c, t, node, out);
}

static int realize_refs(cctx_t *c, const kiln_arg_t *a, int32_t node)
{
	if (a->kind == KILN_ARG_LIST) {
		for (uint32_t i = 0; i < a->n; i++) {
			int rc = realize_refs(c, &a->u.list[i], node);
			if (rc != 0)
				return rc;
		}
		return 0;
	}
	if (a->kind != KILN_ARG_REF || c->vals[a->u.ref] == NULL)
		return 0;
	lt_t *t = c->vals[a->u.ref];
	if (t->is_buf)
		return 0;
	return lt_realize(c, t, node, &c->vals[a->u.ref]);
}

bool cir_is_view_op(const char *op)
{
	static const char *const views[] = {
	    "aten.view.default", "aten._unsafe_view.default",
	    "aten._reshape_alias.default", "aten.reshape.default",
	    "aten.permute.default", "aten.transpose.int", "aten.t.default",
	    "aten.expand.default", "aten.squeeze.dim", "aten.squeeze.dims",
	    "aten.squeeze.default", "aten.unsqueeze.default",
	    "aten.slice.Tensor", "aten.select.int", "aten.split.Tensor",
	    "aten.split_with_sizes.default", "aten.unbind.int",
	    "aten.alias.default", "aten.detach.default",
	    "aten.as_strided.default",
	    /* views kiln leaves to torch, or that AOTAutograd decomposes:
	     * views of their input's storage all the same */
	    "aten.narrow.default", "aten.diagonal.default",
	    "aten.unfold.default", "aten.unflatten.int", "aten.movedim.int",
	    "aten.swapaxes.default", "aten.chunk.default",
	    "aten.tensor_split.sections", "aten.tensor_split.indices",
	    "aten.view_as_real.default", "aten.view_as_complex.default"};
	for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
		if (strcmp(op, views[i]) == 0)
			return true;
	return false;
}

/* Whether the graph declares value dv dense: its dims of more than one
 * element, by stride, each as far apart as the ones inside it hold
 * (contiguous, or a permutation of it, as attention's output [B, H, N, D]
 * laid out [B, N, H, D]). Symbolic sizes and strides compare as
 * expressions: the dims are taken innermost first, each the one whose
 * stride is the element count of those taken (a symbolic size is more
 * than one element: torch specializes 0 and 1). */
static bool decl_dense(cctx_t *c, const kiln_value_t *dv)
{
	if (!dv->strides_given)
		return true;
	bool taken[CIR_MAX_RANK] = {false};
	uint32_t left = 0;
	for (uint32_t k = 0; k < dv->rank && k < CIR_MAX_RANK; k++) {
		taken[k] = dv->sizes[k].e == NULL && dv->sizes[k].c == 1;
		left += !taken[k];
	}
	if (dv->rank > CIR_MAX_RANK)
		return false;
	kiln_dim_t want = dim_const(1);
	while (left > 0) {
		uint32_t k = 0;
		while (k < dv->rank &&
		       (taken[k] ||
			!dim_eq(dim_of(ix_dim(c, dv->strides[k])), want)))
			k++;
		if (k == dv->rank)
			return false;
		taken[k] = true;
		left--;
		want = dim_mul(c, want, dim_of(ix_dim(c, dv->sizes[k])));
	}
	return true;
}

/* Whether t is all of a buffer, laid out as value dv is declared. */
static bool has_decl_layout(cctx_t *c, const lt_t *t, const kiln_value_t *dv)
{
	if (!t->is_buf)
		return false;
	const cbuf_t *b = &c->bufs[t->buf];
	if (b->kind != CB_TEMP || t->rank != dv->rank || b->rank != t->rank ||
	    !dim_is(t->offset, 0))
		return false;
	for (uint32_t k = 0; k < t->rank; k++)
		if (!dim_eq(t->sizes[k], b->sizes[k]) ||
		    (!dim_is(t->sizes[k], 1) &&
		     !dim_eq(t->strides[k], dim_of(ix_dim(c, dv->strides[k])))))
			return false;
	return true;
}

/* Materializes t into a new buffer laid out as value dv is declared:
 * custom strides where they are not the contiguous ones (the buffer spans
 * their extent; gaps stay unwritten). */
static int realize_decl_layout(cctx_t *c, lt_t *t, const kiln_value_t *dv,
			       int32_t node, lt_t **out)
{
	kiln_dim_t st[CIR_MAX_RANK], want[CIR_MAX_RANK];
	contig_strides(c, t->rank, t->sizes, st);
	bool custom = false;
	for (uint32_t k = 0; k < t->rank; k++) {
		want[k] = dim_of(ix_dim(c, dv->strides[k]));
		if (!dim_is(t->sizes[k], 1) && !dim_eq(want[k], st[k]))
			custom = true;
	}
	return realize_new(c, t, node, custom ? want : NULL, out);
}

/* Value v's torch storage, as a buffer: *out is v's view base
 * (cir_view_base) laid out as the graph declares it, so that torch's
 * storage offset s is element out->offset + s of out->buf (an as_strided
 * view of clone(slice(x)), whose clone kiln lowers to the slice itself,
 * or of a lazy value, reads there). A base that is not so already is
 * realized in its declared layout where n is lowered (gaps there, as in
 * torch's storage, stay unwritten), and later readers take that buffer. */
int lstorage(lnode_t *n, uint32_t v, lt_t **out)
{
	cctx_t *c = n->c;
	const kiln_graph_t *g = c->g;
	uint32_t b = cir_view_base(g, v);
	const kiln_value_t *dv = &g->values[b];
	lt_t *t = c->vals[b];
	if (t == NULL || dv->kind != KILN_VAL_TENSOR)
		return lerr(n, KILN_EINVGRAPH, "value %u has no tensor", b);
	bool as_declared = t->is_buf && t->rank == dv->rank;
	for (uint32_t k = 0; as_declared && k < t->rank; k++)
		as_declared =
		    dim_eq(t->sizes[k], dim_of(ix_dim(c, dv->sizes[k]))) &&
		    (dim_is(t->sizes[k], 1) ||
		     dim_eq(t->strides[k], dim_of(ix_dim(c, dv->strides[k]))));
	if (as_declared) {
		*out = t;
		return 0;
	}
	int rc = realize_decl_layout(c, t, dv, (int32_t)n->index, &c->vals[b]);
	if (rc == 0)
		*out = c->vals[b];
	return rc;
}

/* Value v as a view of its torch storage's buffer (lstorage): the view ops
 * from its base to v lowered again, in order, on the base's buffer, so
 * that *out's offset and strides are torch's storage offset and strides
 * of v (an as_strided view without a storage offset takes v's, and
 * _reshape_alias). KILN_EUNSUPOP where a view op on the way is not
 * lowered or its result is not a view of that buffer. */
int lstorage_view(lnode_t *n, uint32_t v, lt_t **out)
{
	cctx_t *c = n->c;
	const kiln_graph_t *g = c->g;
	lt_t *base;
	int rc = lstorage(n, v, &base);
	if (rc != 0)
		return rc;
	uint32_t chain[64], nc = 0;
	for (uint32_t w = v; w != cir_view_base(g, w);) {
		if (nc == sizeof(chain) / sizeof(chain[0]))
			return lerr(n, KILN_EUNSUPOP,
				    "value %u is over 64 view ops from its "
				    "storage",
				    v);
		int32_t p = g->values[w].producer;
		chain[nc++] = (uint32_t)p;
		w = g->nodes[p].args[0].u.ref;
	}
	while (nc-- > 0) {
		lnode_t ln;
		memset(&ln, 0, sizeof(ln));
		ln.c = c;
		ln.n = &g->nodes[chain[nc]];
		ln.index = chain[nc];
		const op_entry_t *op = find_op(ln.n->op);
		if (op == NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "value %u views its storage through %s, "
				    "which runs in torch",
				    v, ln.n->op);
		ln.param = op->param;
		set_var_ranges(c, 0, NULL);
		rc = op->fn(c, &ln);
		set_var_ranges(c, 0, NULL);
		if (rc != 0)
			return rc;
	}
	lt_t *t = c->vals[v];
	if (t == NULL || !t->is_buf || t->buf != base->buf)
		return lerr(n, KILN_EUNSUPOP,
			    "value %u is not a strided view of its storage", v);
	*out = t;
	return 0;
}

/* Value dv's element count, an expression in the graph's symbols. */
static const kiln_expr_t *numel_ix(cctx_t *c, const kiln_value_t *dv)
{
	const kiln_expr_t *n = ix_const(c, 1);
	for (uint32_t k = 0; k < dv->rank; k++)
		n = ix_mul(c, n, ix_dim(c, dv->sizes[k]));
	return n;
}

/* The values the graph returns views of, all of each (a qkv projection
 * whose unbind gives the q, k and v saved for attention's backward, a
 * linear layer's output saved through a view for gelu's): marked so that
 * lower_graph realizes each into a buffer where it is made. The outputs are
 * then views of that buffer (lower_outputs finds their declared strides
 * there) instead of copies computed again from the lazy body at the end of
 * the graph, a buffer of their own each; and the value's other readers
 * take the buffer. Followed back through view ops from each output, by
 * their self argument, to a value an op makes (not a graph input); marked
 * where those outputs hold at least as many elements as it has (their
 * element counts less its own is at least 0 for every size the graph's
 * symbols allow) and it is declared dense (it is realized in its declared
 * layout). NULL when there is none, or on allocation failure. */
static bool *output_view_bases(cctx_t *c)
{
	const kiln_graph_t *g = c->g;
	const kiln_expr_t **cover = NULL;
	bool *seen = NULL, *mark = NULL;
	for (uint32_t i = 0; i < g->n_outputs; i++) {
		if (g->outputs[i].kind != KILN_ARG_REF)
			continue;
		uint32_t w = g->outputs[i].u.ref;
		if (w >= g->n_values || g->values[w].kind != KILN_VAL_TENSOR)
			continue;
		uint32_t u = cir_view_base(g, w);
		const kiln_value_t *bv = &g->values[u];
		if (u == w || bv->producer < 0 || bv->kind != KILN_VAL_TENSOR)
			continue;
		if (cover == NULL) {
			cover = cir_alloc(c, sizeof(*cover) * g->n_values);
			seen = cir_alloc(c, sizeof(bool) * g->n_values);
			if (cover == NULL || seen == NULL)
				return NULL;
		}
		if (seen[w])
			continue;
		seen[w] = true;
		const kiln_expr_t *n = numel_ix(c, &g->values[w]);
		cover[u] = cover[u] == NULL ? n : ix_add(c, cover[u], n);
		if (cover[u] == NULL)
			return NULL;
	}
	if (cover == NULL)
		return NULL;
	for (uint32_t v = 0; v < g->n_values; v++) {
		if (cover[v] == NULL)
			continue;
		const kiln_value_t *bv = &g->values[v];
		const kiln_expr_t *n = numel_ix(c, bv),
				  *d = n ? ix_sub(c, cover[v], n) : NULL;
		if (d == NULL)
			return NULL;
		int64_t more, all;
		if (!ix_lower_bound(c, n, &all) || all <= 0 ||
		    !ix_lower_bound(c, d, &more) || more < 0 ||
		    !decl_dense(c, bv))
			continue;
		if (mark == NULL) {
			mark = cir_alloc(c, sizeof(bool) * g->n_values);
			if (mark == NULL)
				return NULL;
		}
		mark[v] = true;
	}
	return mark;
}

/* An op kiln does not lower: a fallback step that the Python runtime runs
 * through torch. Its tensor inputs are made buffers; its outputs are new
 * contiguous buffers with the declared shapes. */
static int lower_fallback(cctx_t *c, lnode_t *ln)
{
	const kiln_node_t *nd = ln->n;
	for (uint32_t k = 0; k < nd->n_args; k++) {
		int rc = realize_refs(c, &nd->args[k], (int32_t)ln->index);
		if (rc != 0)
			return rc;
	}
	for (uint32_t k = 0; k < nd->n_kwargs; k++) {
		int rc =
		    realize_refs(c, &nd->kwargs[k].val, (int32_t)ln->index);
		if (rc != 0)
			return rc;
	}
	int32_t ni = new_cnode(c);
	if (ni < 0)
		return -ENOMEM;
	uint32_t *outs =
	    kiln_arena_calloc(c->arena, nd->n_out + 1, sizeof(uint32_t));
	if (outs == NULL)
		return -ENOMEM;
	for (uint32_t k = 0; k < nd->n_out; k++) {
		const kiln_value_t *v = &c->g->values[nd->out_first + k];
		outs[k] = UINT32_MAX;
		if (v->kind != KILN_VAL_TENSOR)
			continue;
		kiln_dim_t sizes[CIR_MAX_RANK];
		for (uint32_t i = 0; i < v->rank; i++)
			sizes[i] = dim_of(ix_dim(c, v->sizes[i]));
		uint32_t b = new_buf(c, CB_TEMP, v->dtype, v->rank, sizes);
		if (b == UINT32_MAX)
			return -ENOMEM;
		c->bufs[b].producer = ni;
		c->bufs[b].in_memory = true;
		outs[k] = b;
		c->vals[nd->out_first + k] = lt_buf(c, b);
		if (c->vals[nd->out_first + k] == NULL)
			return -ENOMEM;
	}
	cnode_t *cn = &c->nodes[ni];
	cn->fallback = true;
	cn->node = (int32_t)ln->index;
	cn->n_fbout = nd->n_out;
	cn->fbout = outs;
	cn->buf = nd->n_out > 0 && outs[0] != UINT32_MAX ? outs[0] : 0;
	cn->body = sx_consti(c, 0, KILN_DT_I64);
	return cn->body ? 0 : -ENOMEM;
}

int lower_graph(cctx_t *c)
{
	const kiln_graph_t *g = c->g;
	c->vals = cir_alloc(c, sizeof(lt_t *) * (g->n_values + 1));
	c->uses = cir_alloc(c, sizeof(uint32_t) * (g->n_values + 1));
	if (c->vals == NULL || c->uses == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const kiln_node_t *nd = &g->nodes[i];
		for (uint32_t k = 0; k < nd->n_args; k++)
			count_use(c, &nd->args[k]);
		for (uint32_t k = 0; k < nd->n_kwargs; k++)
			count_use(c, &nd->kwargs[k].val);
	}
	for (uint32_t i = 0; i < g->n_outputs; i++)
		count_use(c, &g->outputs[i]);
	c->nhwc = graph_nhwc(g);
	const bool *base = output_view_bases(c);
	for (uint32_t i = 0; i < g->n_inputs; i++) {
		int rc = bind_input(c, i);
		if (rc != 0)
			return rc;
	}
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const kiln_node_t *nd = &g->nodes[i];
		lnode_t ln;
		memset(&ln, 0, sizeof(ln));
		ln.c = c;
		ln.n = nd;
		ln.index = i;
		const op_entry_t *op = find_op(nd->op);
		int rc;
		if (op == NULL) {
			rc = lower_fallback(c, &ln);
		} else {
			ln.param = op->param;
			set_var_ranges(c, 0, NULL);
			uint32_t nb = c->n_bufs, nn = c->n_nodes;
			rc = op->fn(c, &ln);
			set_var_ranges(c, 0, NULL);
			if (rc == KILN_EUNSUPOP) {
				/* a variant kiln does not lower (e.g. training
				 * batch_norm): undo, and fall back */
				c->n_bufs = nb;
				c->n_nodes = nn;
				for (uint32_t k = 0; k < nd->n_out; k++)
					c->vals[nd->out_first + k] = NULL;
				const char *why = NULL;
				if (c->err != NULL && c->err[0] != '\0') {
					/* past lerr's "node N (op): " */
					const char *p = strstr(c->err, "): ");
					const char *m =
					    p != NULL ? p + 3 : c->err;
					size_t len = strlen(m);
					char *w =
					    kiln_arena_alloc(c->arena, len + 1);
					if (w != NULL)
						memcpy(w, m, len + 1);
					why = w;
					c->err[0] = '\0';
				}
				rc = lower_fallback(c, &ln);
				if (rc == 0)
					c->nodes[c->n_nodes - 1].fb_why = why;
			}
		}
		if (rc != 0)
			return rc;
		for (uint32_t k = 0; k < nd->n_out; k++) {
			uint32_t v = nd->out_first + k;
			lt_t *t = c->vals[v];
			if (t == NULL) {
				const kiln_value_t *dv = &g->values[v];
				if (dv->kind == KILN_VAL_TENSOR &&
				    c->uses[v] > 0)
					return lerr(&ln, KILN_EINVGRAPH,
						    "out %u is used but the op "
						    "does not produce it",
						    k);
				continue;
			}
			if (base != NULL && base[v]) {
				const kiln_value_t *dv = &g->values[v];
				if (!has_decl_layout(c, t, dv)) {
					/* channels-last in NHWC order */
					rc = wants_nhwc(c, dv, t)
						 ? lt_realize_nhwc(c, t,
								   (int32_t)i,
								   &c->vals[v])
						 : realize_decl_layout(
						       c, t, dv, (int32_t)i,
						       &c->vals[v]);
					if (rc != 0)
						return rc;
				}
			} else if (must_realize(t, c->uses[v])) {
				rc = realize_as_declared(c, t, &g->values[v],
							 (int32_t)i,
							 &c->vals[v]);
				if (rc != 0)
					return rc;
			}
		}
	}
	return 0;
}
