/*
 * sx.c — scalar expressions: the element-wise computation of a lazy tensor
 * or a kernel member, as a hash-consed DAG.
 *
 * Invariants: operands of arithmetic ops have the node's compute dtype
 * (lower.c inserts casts per PyTorch's promotion); comparisons and logical
 * ops produce KILN_DT_BOOL; f16/bf16 never appear as compute dtypes (they are
 * computed in f32). Structurally equal nodes are one pointer, so common
 * subexpressions are shared for free and codegen emits each once.
 */
#include "compiler/cir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = {
#define SX_OP_NAME(n) #n,
    SX_OPS(SX_OP_NAME)
#undef SX_OP_NAME
};

const char *sx_op_name(sx_op_t op)
{
	return op < OP__COUNT ? op_names[op] : "?";
}

bool sx_op_is_unary(sx_op_t op)
{
	return op <= OP_PHI;
}

bool sx_op_is_cmp(sx_op_t op)
{
	return op >= OP_EQ && op <= OP_GE;
}

kiln_dtype_t compute_dtype(kiln_dtype_t storage)
{
	return storage == KILN_DT_F16 || storage == KILN_DT_BF16 ? KILN_DT_F32
								 : storage;
}

static uint32_t hmix(uint32_t h, uint64_t v)
{
	v ^= v >> 31;
	v *= 0x9e3779b97f4a7c15ULL;
	v ^= v >> 29;
	return (h ^ (uint32_t)v ^ (uint32_t)(v >> 32)) * 0x01000193u;
}

/* A node's hash by content, not address, so compiles are deterministic:
 * with its buffer id (full: sx_t.hash, over the operands' hash) or without
 * (sx_t.shash, over the operands' shash). */
static uint32_t content_hash(const sx_t *p, bool full)
{
	uint32_t h = 0x811c9dc5u;
	h = hmix(h, p->kind);
	h = hmix(h, p->op);
	h = hmix(h, p->dt);
	if (full)
		h = hmix(h, p->buf);
	h = hmix(h, p->a ? (full ? p->a->hash : p->a->shash) : 0);
	h = hmix(h, p->b ? (full ? p->b->hash : p->b->shash) : 1);
	h = hmix(h, p->c ? (full ? p->c->hash : p->c->shash) : 2);
	h = hmix(h, p->idx ? ix_hash(p->idx) : 3);
	uint64_t kb;
	memcpy(&kb, &p->k, sizeof(kb));
	return hmix(h, kb);
}

static const sx_t *intern(cctx_t *c, sx_t *proto)
{
	uint32_t h = content_hash(proto, true);
	proto->hash = h;
	proto->shash = content_hash(proto, false);
	if (c->sx_n * 2 >= c->sx_cap) {
		uint32_t ncap = c->sx_cap ? c->sx_cap * 2 : 1024;
		sx_t **nt = calloc(ncap, sizeof(*nt));
		if (nt == NULL)
			return NULL;
		for (uint32_t i = 0; i < c->sx_cap; i++) {
			sx_t *e = c->sx_tab[i];
			while (e != NULL) {
				sx_t *next = e->next;
				uint32_t j = e->hash & (ncap - 1);
				e->next = nt[j];
				nt[j] = e;
				e = next;
			}
		}
		free(c->sx_tab);
		c->sx_tab = nt;
		c->sx_cap = ncap;
	}
	uint32_t j = h & (c->sx_cap - 1);
	for (sx_t *e = c->sx_tab[j]; e != NULL; e = e->next)
		if (e->hash == h && e->kind == proto->kind &&
		    e->op == proto->op && e->dt == proto->dt &&
		    e->buf == proto->buf && e->a == proto->a &&
		    e->b == proto->b && e->c == proto->c &&
		    e->idx == proto->idx && memcmp(&e->k, &proto->k, 8) == 0)
			return e;
	sx_t *n = kiln_arena_alloc(c->arena, sizeof(*n));
	if (n == NULL)
		return NULL;
	*n = *proto;
	n->next = c->sx_tab[j];
	c->sx_tab[j] = n;
	c->sx_n++;
	return n;
}

static sx_t proto0(sx_kind_t k, kiln_dtype_t dt)
{
	sx_t p;
	memset(&p, 0, sizeof(p));
	p.kind = (uint8_t)k;
	p.dt = (uint8_t)dt;
	return p;
}

const sx_t *sx_constf(cctx_t *c, double v, kiln_dtype_t dt)
{
	dt = compute_dtype(dt);
	if (!kiln_dtype_is_float(dt))
		return sx_consti(c, (int64_t)v, dt);
	sx_t p = proto0(SX_CONST, dt);
	if (dt == KILN_DT_F32)
		v = (double)(float)v;
	if (v == 0.0 && !signbit(v))
		v = 0.0;
	p.k.f = v;
	return intern(c, &p);
}

const sx_t *sx_consti(cctx_t *c, int64_t v, kiln_dtype_t dt)
{
	dt = compute_dtype(dt);
	if (kiln_dtype_is_float(dt))
		return sx_constf(c, (double)v, dt);
	sx_t p = proto0(SX_CONST, dt);
	switch (dt) {
	case KILN_DT_BOOL: v = v != 0; break;
	case KILN_DT_I8: v = (int8_t)v; break;
	case KILN_DT_U8: v = (uint8_t)v; break;
	case KILN_DT_I16: v = (int16_t)v; break;
	case KILN_DT_I32: v = (int32_t)v; break;
	default: break;
	}
	p.k.i = v;
	return intern(c, &p);
}

const sx_t *sx_load(cctx_t *c, uint32_t buf, const kiln_expr_t *idx,
		    const sx_t *guard, const sx_t *dyn)
{
	if (idx == NULL)
		return NULL;
	sx_t p = proto0(SX_LOAD, compute_dtype(c->bufs[buf].dtype));
	p.buf = buf;
	p.idx = idx;
	p.a = guard;
	p.b = dyn;
	return intern(c, &p);
}

const sx_t *sx_index(cctx_t *c, const kiln_expr_t *idx)
{
	if (idx == NULL)
		return NULL;
	if (idx->kind == KILN_EX_CONST)
		return sx_consti(c, idx->c, KILN_DT_I64);
	sx_t p = proto0(SX_INDEX, KILN_DT_I64);
	p.idx = idx;
	return intern(c, &p);
}

static bool is_const(const sx_t *e)
{
	return e->kind == SX_CONST;
}

static double cf(const sx_t *e)
{
	return kiln_dtype_is_float(e->dt) ? e->k.f : (double)e->k.i;
}

const sx_t *sx_un(cctx_t *c, sx_op_t op, const sx_t *a)
{
	if (a == NULL)
		return NULL;
	kiln_dtype_t dt = a->dt;
	if (op == OP_NOT || op == OP_ISNAN)
		dt = KILN_DT_BOOL;
	if (is_const(a) && kiln_dtype_is_float(a->dt)) {
		double x = a->k.f;
		switch (op) {
		case OP_NEG: return sx_constf(c, -x, dt);
		case OP_ABS: return sx_constf(c, fabs(x), dt);
		case OP_SQRT: return sx_constf(c, sqrt(x), dt);
		case OP_RECIP: return sx_constf(c, 1.0 / x, dt);
		default: break;
		}
	} else if (is_const(a)) {
		switch (op) {
		case OP_NEG: return sx_consti(c, -a->k.i, dt);
		case OP_NOT: return sx_consti(c, !a->k.i, dt);
		default: break;
		}
	}
	if (op == OP_NEG && a->kind == SX_UN && a->op == OP_NEG)
		return a->a;
	sx_t p = proto0(SX_UN, dt);
	p.op = (uint8_t)op;
	p.a = a;
	return intern(c, &p);
}

const sx_t *sx_bin(cctx_t *c, sx_op_t op, const sx_t *a, const sx_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	kiln_dtype_t dt = a->dt;
	if (sx_op_is_cmp(op) || op == OP_AND || op == OP_OR || op == OP_XOR)
		dt = KILN_DT_BOOL;
	bool fl = kiln_dtype_is_float(a->dt);
	if (is_const(a) && is_const(b)) {
		double x = cf(a), y = cf(b);
		if (fl) {
			switch (op) {
			case OP_ADD: return sx_constf(c, x + y, dt);
			case OP_SUB: return sx_constf(c, x - y, dt);
			case OP_MUL: return sx_constf(c, x * y, dt);
			case OP_DIV: return sx_constf(c, x / y, dt);
			default: break;
			}
		} else if (!sx_op_is_cmp(op)) {
			int64_t u = a->k.i, v = b->k.i, r;
			switch (op) {
			case OP_ADD:
				if (!__builtin_add_overflow(u, v, &r))
					return sx_consti(c, r, dt);
				break;
			case OP_SUB:
				if (!__builtin_sub_overflow(u, v, &r))
					return sx_consti(c, r, dt);
				break;
			case OP_MUL:
				if (!__builtin_mul_overflow(u, v, &r))
					return sx_consti(c, r, dt);
				break;
			default: break;
			}
		}
	}
	/* exact identities only (no x+0: it changes -0.0) */
	if (op == OP_MUL && is_const(b) && cf(b) == 1.0)
		return a;
	if (op == OP_MUL && is_const(a) && cf(a) == 1.0)
		return b;
	if (op == OP_DIV && is_const(b) && cf(b) == 1.0)
		return a;
	if (!fl && (op == OP_ADD || op == OP_SUB) && is_const(b) && b->k.i == 0)
		return a;
	if ((op == OP_ADD || op == OP_MUL || op == OP_MAX || op == OP_MIN ||
	     op == OP_EQ || op == OP_NE || op == OP_AND || op == OP_OR) &&
	    (a->shash > b->shash ||
	     (a->shash == b->shash && a->hash > b->hash)) &&
	    !is_const(b)) {
		/* canonical operand order for commutative ops, so a*b and
		 * b*a share one node (float + and * are commutative); by
		 * the hash without buffer ids first, so that every layer
		 * of a model orders them alike and its kernels' bodies
		 * come out identical (codegen.c share_body) */
		const sx_t *t = a;
		a = b;
		b = t;
	}
	sx_t p = proto0(SX_BIN, dt);
	p.op = (uint8_t)op;
	p.a = a;
	p.b = b;
	return intern(c, &p);
}

const sx_t *sx_where(cctx_t *c, const sx_t *cond, const sx_t *a, const sx_t *b)
{
	if (cond == NULL || a == NULL || b == NULL)
		return NULL;
	if (a == b)
		return a;
	if (is_const(cond))
		return cond->k.i ? a : b;
	sx_t p = proto0(SX_WHERE, a->dt);
	p.a = cond;
	p.b = a;
	p.c = b;
	return intern(c, &p);
}

const sx_t *sx_cast(cctx_t *c, const sx_t *a, kiln_dtype_t dt)
{
	if (a == NULL)
		return NULL;
	kiln_dtype_t cdt = compute_dtype(dt);
	if (dt == KILN_DT_F16 || dt == KILN_DT_BF16) {
		/* rounding to a narrow float is part of the value: keep it */
		sx_t p = proto0(SX_CAST, KILN_DT_F32);
		p.op = (uint8_t)dt; /* the narrow type rounded through */
		p.a = a;
		return intern(c, &p);
	}
	if (a->dt == cdt)
		return a;
	if (is_const(a)) {
		if (kiln_dtype_is_float(cdt))
			return sx_constf(c, cf(a), cdt);
		if (cdt == KILN_DT_BOOL)
			return sx_consti(c, cf(a) != 0.0, cdt);
		if (kiln_dtype_is_float(a->dt)) {
			double x = a->k.f;
			if (isfinite(x) && fabs(x) < 9.2e18)
				return sx_consti(c, (int64_t)x, cdt);
		} else {
			return sx_consti(c, a->k.i, cdt);
		}
	}
	sx_t p = proto0(SX_CAST, cdt);
	p.a = a;
	return intern(c, &p);
}

/* ---- substitution ------------------------------------------------------- */

typedef struct memo {
	const sx_t **key;
	const sx_t **val;
	uint32_t cap;
} memo_t;

static const sx_t *subst_rec(cctx_t *c, const sx_t *e, memo_t *m,
			     const kiln_expr_t *const *map, uint32_t n)
{
	if (e == NULL)
		return NULL;
	uint32_t j = (e->hash * 0x9e3779b1u) & (m->cap - 1);
	while (m->key[j] != NULL) {
		if (m->key[j] == e)
			return m->val[j];
		j = (j + 1) & (m->cap - 1);
	}
	const sx_t *r = NULL;
	switch ((sx_kind_t)e->kind) {
	case SX_CONST: r = e; break;
	case SX_LOAD:
		r = sx_load(c, e->buf, ix_subst(c, e->idx, map, n),
			    subst_rec(c, e->a, m, map, n),
			    subst_rec(c, e->b, m, map, n));
		break;
	case SX_INDEX: r = sx_index(c, ix_subst(c, e->idx, map, n)); break;
	case SX_UN:
		r = sx_un(c, (sx_op_t)e->op, subst_rec(c, e->a, m, map, n));
		break;
	case SX_BIN:
		r = sx_bin(c, (sx_op_t)e->op, subst_rec(c, e->a, m, map, n),
			   subst_rec(c, e->b, m, map, n));
		break;
	case SX_WHERE:
		r = sx_where(c, subst_rec(c, e->a, m, map, n),
			     subst_rec(c, e->b, m, map, n),
			     subst_rec(c, e->c, m, map, n));
		break;
	case SX_CAST: {
		const sx_t *a = subst_rec(c, e->a, m, map, n);
		if (a == NULL)
			break;
		sx_t p = *e;
		p.a = a;
		p.next = NULL;
		r = intern(c, &p);
		break;
	}
	}
	/* the table may have been filled by recursion: find a free slot */
	j = (e->hash * 0x9e3779b1u) & (m->cap - 1);
	while (m->key[j] != NULL)
		j = (j + 1) & (m->cap - 1);
	m->key[j] = e;
	m->val[j] = r;
	return r;
}

const sx_t *sx_subst(cctx_t *c, const sx_t *e, const kiln_expr_t *const *map,
		     uint32_t n)
{
	uint32_t size = sx_size(e, 1u << 20);
	memo_t m;
	m.cap = 64;
	while (m.cap < size * 2 + 2)
		m.cap *= 2;
	m.key = calloc(m.cap, sizeof(*m.key));
	m.val = calloc(m.cap, sizeof(*m.val));
	const sx_t *r = NULL;
	if (m.key != NULL && m.val != NULL)
		r = subst_rec(c, e, &m, map, n);
	free(m.key);
	free(m.val);
	return r;
}

/* ---- inspection --------------------------------------------------------- */

typedef struct visit {
	const sx_t **seen;
	uint32_t cap, n;
	bool full;
} visit_t;

static bool visit_mark(visit_t *v, const sx_t *e)
{
	uint32_t j = (e->hash * 0x9e3779b1u) & (v->cap - 1);
	while (v->seen[j] != NULL) {
		if (v->seen[j] == e)
			return false;
		j = (j + 1) & (v->cap - 1);
	}
	if (v->n * 2 >= v->cap) {
		v->full = true;
		return false;
	}
	v->seen[j] = e;
	v->n++;
	return true;
}

static void walk(visit_t *v, const sx_t *e, uint32_t limit,
		 void (*fn)(void *, const sx_t *), void *arg)
{
	if (e == NULL || v->n >= limit || v->full || !visit_mark(v, e))
		return;
	if (e->kind == SX_LOAD && fn != NULL)
		fn(arg, e);
	walk(v, e->a, limit, fn, arg);
	walk(v, e->b, limit, fn, arg);
	walk(v, e->c, limit, fn, arg);
}

static uint32_t walk_count(const sx_t *e, uint32_t limit,
			   void (*fn)(void *, const sx_t *), void *arg)
{
	visit_t v;
	v.cap = 256;
	for (;;) {
		v.n = 0;
		v.full = false;
		v.seen = calloc(v.cap, sizeof(*v.seen));
		if (v.seen == NULL)
			return limit;
		walk(&v, e, limit, fn, arg);
		free(v.seen);
		if (!v.full)
			return v.n;
		if (fn != NULL) /* cannot restart a visitor with effects */
			return v.n;
		v.cap *= 4;
	}
}

uint32_t sx_size(const sx_t *e, uint32_t limit)
{
	return walk_count(e, limit, NULL, NULL);
}

void sx_each_load(const sx_t *e, void (*fn)(void *, const sx_t *), void *arg)
{
	/* size the table first so the visitor never restarts */
	uint32_t n = sx_size(e, 1u << 20);
	visit_t v;
	v.cap = 64;
	while (v.cap < n * 2 + 2)
		v.cap *= 2;
	v.cap *= 2;
	v.n = 0;
	v.full = false;
	v.seen = calloc(v.cap, sizeof(*v.seen));
	if (v.seen == NULL)
		return;
	walk(&v, e, 1u << 30, fn, arg);
	free(v.seen);
}

static bool heavy_rec(const sx_t *e, int depth, int *loads)
{
	if (e == NULL || depth > 64)
		return false;
	if (e->kind == SX_LOAD)
		(*loads)++;
	if (e->kind == SX_UN) {
		switch ((sx_op_t)e->op) {
		case OP_EXP:
		case OP_EXP2:
		case OP_LOG:
		case OP_LOG1P:
		case OP_LOG2:
		case OP_EXPM1:
		case OP_SIN:
		case OP_COS:
		case OP_TAN:
		case OP_TANH:
		case OP_SIGMOID:
		case OP_ERF:
		case OP_ATAN:
		case OP_EXPNP:
		case OP_PHI: return true;
		default: break;
		}
	}
	if (e->kind == SX_BIN &&
	    (e->op == OP_POW || e->op == OP_ATAN2 || e->op == OP_EXPSUB))
		return true;
	return heavy_rec(e->a, depth + 1, loads) ||
	       heavy_rec(e->b, depth + 1, loads) ||
	       heavy_rec(e->c, depth + 1, loads);
}

bool sx_has_transcendental(const sx_t *e)
{
	int loads = 0;
	return heavy_rec(e, 0, &loads);
}

bool sx_is_heavy(const sx_t *e)
{
	int loads = 0;
	if (heavy_rec(e, 0, &loads))
		return true;
	return loads > 3 || sx_size(e, 64) >= 48;
}

bool sx_is_float(const sx_t *e)
{
	return kiln_dtype_is_float(e->dt);
}
