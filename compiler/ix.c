/*
 * ix.c — index expressions: hash-consed kiln_expr_t with a polynomial normal
 * form.
 *
 * Every expression built here is interned: structurally equal expressions
 * are the same pointer, so equality is pointer comparison. Sums and products
 * are kept as a canonical polynomial: a sum of monomials (an int64
 * coefficient times a product of atoms sorted by creation id), constant last.
 * Atoms are VARs, SYMs and the non-polynomial nodes FLOORDIV, MOD, MIN, MAX.
 * Floor division and modulo by constants are simplified with the ranges of
 * the variables (cctx.var_size), which is what turns the div/mod of reshapes
 * back into plain strides: (x//c)*c + x%c == x, (8*i + j)//8 == i when
 * 0 <= j < 8.
 *
 * When a polynomial would overflow the small fixed-size representation, the
 * plain (unsimplified) node is returned: correct, only slower.
 */
#include "compiler/cir.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct ixn {
	kiln_expr_t e; /* first: (kiln_expr_t *) <-> (ixn_t *) */
	uint32_t hash;
	uint32_t id;
} ixn_t;

static uint32_t idof(const kiln_expr_t *e)
{
	return ((const ixn_t *)e)->id;
}

uint32_t ix_hash(const kiln_expr_t *e)
{
	return ((const ixn_t *)e)->hash;
}

static uint32_t mix(uint32_t h, uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdULL;
	v ^= v >> 33;
	return (h ^ (uint32_t)v ^ (uint32_t)(v >> 32)) * 0x01000193u;
}

static uint32_t node_hash(kiln_expr_kind_t k, int64_t cst, uint32_t sym,
			  const kiln_expr_t *a, const kiln_expr_t *b)
{
	uint32_t h = 0x811c9dc5u;
	h = mix(h, (uint64_t)k);
	h = mix(h, (uint64_t)cst);
	h = mix(h, sym);
	h = mix(h, a ? ((const ixn_t *)a)->hash : 0);
	h = mix(h, b ? ((const ixn_t *)b)->hash : 0);
	return h;
}

static const kiln_expr_t *mk(cctx_t *c, kiln_expr_kind_t k, int64_t cst,
			     uint32_t sym, const kiln_expr_t *a,
			     const kiln_expr_t *b)
{
	uint32_t h = node_hash(k, cst, sym, a, b);
	if (c->ex_n * 2 >= c->ex_cap) {
		uint32_t ncap = c->ex_cap ? c->ex_cap * 2 : 1024;
		kiln_expr_t **nt = calloc(ncap, sizeof(*nt));
		if (nt == NULL)
			return NULL;
		for (uint32_t i = 0; i < c->ex_cap; i++) {
			kiln_expr_t *e = c->ex_tab[i];
			if (e == NULL)
				continue;
			uint32_t j = ((ixn_t *)e)->hash & (ncap - 1);
			while (nt[j] != NULL)
				j = (j + 1) & (ncap - 1);
			nt[j] = e;
		}
		free(c->ex_tab);
		c->ex_tab = nt;
		c->ex_cap = ncap;
	}
	uint32_t j = h & (c->ex_cap - 1);
	for (kiln_expr_t *e; (e = c->ex_tab[j]) != NULL;
	     j = (j + 1) & (c->ex_cap - 1)) {
		if (((ixn_t *)e)->hash == h && e->kind == k && e->c == cst &&
		    e->sym == sym && e->a == a && e->b == b)
			return e;
	}
	ixn_t *n = kiln_arena_alloc(c->arena, sizeof(*n));
	if (n == NULL)
		return NULL;
	n->e.kind = k;
	n->e.c = cst;
	n->e.sym = sym;
	n->e.a = a;
	n->e.b = b;
	n->hash = h;
	n->id = c->ex_n;
	c->ex_tab[j] = &n->e;
	c->ex_n++;
	return &n->e;
}

const kiln_expr_t *ix_const(cctx_t *c, int64_t v)
{
	return mk(c, KILN_EX_CONST, v, 0, NULL, NULL);
}

const kiln_expr_t *ix_var(cctx_t *c, uint32_t k)
{
	return mk(c, KILN_EX_VAR, 0, k, NULL, NULL);
}

const kiln_expr_t *ix_sym(cctx_t *c, uint32_t s)
{
	return mk(c, KILN_EX_SYM, 0, s, NULL, NULL);
}

/* ---- polynomials ------------------------------------------------------- */

#define PMAXA 4
#define PMAXT 24

typedef struct term {
	int64_t coef;
	uint8_t n;
	const kiln_expr_t *at[PMAXA]; /* sorted by id */
} term_t;

typedef struct poly {
	uint32_t n;
	bool bad; /* overflowed the representation */
	term_t t[PMAXT];
} poly_t;

static int mono_cmp(const term_t *x, const term_t *y)
{
	if (x->n != y->n)
		return x->n < y->n ? -1 : 1;
	for (uint8_t i = 0; i < x->n; i++)
		if (x->at[i] != y->at[i])
			return idof(x->at[i]) < idof(y->at[i]) ? -1 : 1;
	return 0;
}

/* Adds coef * monomial into p, keeping terms sorted and merged. */
static void padd_term(poly_t *p, const term_t *t)
{
	if (p->bad || t->coef == 0)
		return;
	uint32_t i = 0;
	while (i < p->n && mono_cmp(&p->t[i], t) < 0)
		i++;
	if (i < p->n && mono_cmp(&p->t[i], t) == 0) {
		if (__builtin_add_overflow(p->t[i].coef, t->coef,
					   &p->t[i].coef))
			p->bad = true;
		if (p->t[i].coef == 0) {
			memmove(&p->t[i], &p->t[i + 1],
				(p->n - i - 1) * sizeof(term_t));
			p->n--;
		}
		return;
	}
	if (p->n == PMAXT) {
		p->bad = true;
		return;
	}
	memmove(&p->t[i + 1], &p->t[i], (p->n - i) * sizeof(term_t));
	p->t[i] = *t;
	p->n++;
}

static void pmul(const poly_t *x, const poly_t *y, poly_t *out)
{
	out->n = 0;
	out->bad = x->bad || y->bad;
	for (uint32_t i = 0; i < x->n && !out->bad; i++)
		for (uint32_t j = 0; j < y->n && !out->bad; j++) {
			const term_t *a = &x->t[i], *b = &y->t[j];
			term_t t;
			if (a->n + b->n > PMAXA ||
			    __builtin_mul_overflow(a->coef, b->coef, &t.coef)) {
				out->bad = true;
				break;
			}
			/* merge sorted atom lists */
			uint8_t ia = 0, ib = 0;
			t.n = 0;
			while (ia < a->n || ib < b->n) {
				if (ib == b->n ||
				    (ia < a->n &&
				     idof(a->at[ia]) <= idof(b->at[ib])))
					t.at[t.n++] = a->at[ia++];
				else
					t.at[t.n++] = b->at[ib++];
			}
			padd_term(out, &t);
		}
}

static void pscale(poly_t *p, int64_t k)
{
	for (uint32_t i = 0; i < p->n; i++)
		if (__builtin_mul_overflow(p->t[i].coef, k, &p->t[i].coef))
			p->bad = true;
	if (k == 0)
		p->n = 0;
}

static void pfrom(const kiln_expr_t *e, poly_t *p);

static void pfrom(const kiln_expr_t *e, poly_t *p)
{
	p->n = 0;
	p->bad = false;
	term_t t = {1, 0, {0}};
	switch (e->kind) {
	case KILN_EX_CONST:
		t.coef = e->c;
		padd_term(p, &t);
		return;
	case KILN_EX_ADD:
	case KILN_EX_SUB: {
		poly_t q;
		pfrom(e->a, p);
		pfrom(e->b, &q);
		if (e->kind == KILN_EX_SUB)
			pscale(&q, -1);
		p->bad |= q.bad;
		for (uint32_t i = 0; i < q.n; i++)
			padd_term(p, &q.t[i]);
		return;
	}
	case KILN_EX_NEG:
		pfrom(e->a, p);
		pscale(p, -1);
		return;
	case KILN_EX_MUL: {
		poly_t x, y;
		pfrom(e->a, &x);
		pfrom(e->b, &y);
		pmul(&x, &y, p);
		return;
	}
	default: /* an atom */
		t.n = 1;
		t.at[0] = e;
		padd_term(p, &t);
		return;
	}
}

/* Builds the canonical expression of a polynomial. */
static const kiln_expr_t *pto(cctx_t *c, const poly_t *p)
{
	const kiln_expr_t *sum = NULL;
	int64_t k = 0;
	for (uint32_t i = 0; i < p->n; i++) {
		const term_t *t = &p->t[i];
		if (t->n == 0) {
			k = t->coef;
			continue;
		}
		const kiln_expr_t *m = t->at[0];
		for (uint8_t j = 1; j < t->n && m; j++)
			m = mk(c, KILN_EX_MUL, 0, 0, m, t->at[j]);
		if (m && t->coef != 1)
			m = mk(c, KILN_EX_MUL, 0, 0, ix_const(c, t->coef), m);
		if (m == NULL)
			return NULL;
		sum = sum ? mk(c, KILN_EX_ADD, 0, 0, sum, m) : m;
		if (sum == NULL)
			return NULL;
	}
	if (sum == NULL)
		return ix_const(c, k);
	if (k != 0)
		sum = mk(c, KILN_EX_ADD, 0, 0, sum, ix_const(c, k));
	return sum;
}

/* ---- ranges -------------------------------------------------------------- */

typedef struct range {
	int64_t lo, hi;
	bool lo_ok, hi_ok;
} range_t;

static range_t rng_of(cctx_t *c, const kiln_expr_t *e);

static range_t rng_term(cctx_t *c, const term_t *t)
{
	range_t r = {t->coef, t->coef, true, true};
	for (uint8_t i = 0; i < t->n; i++) {
		range_t a = rng_of(c, t->at[i]);
		/* only handle non-negative atoms */
		if (!a.lo_ok || a.lo < 0)
			return (range_t){0, 0, false, false};
		int64_t lo, hi;
		bool hok = a.hi_ok && r.hi_ok;
		if (r.lo >= 0) {
			if (__builtin_mul_overflow(r.lo, a.lo, &lo))
				return (range_t){0, 0, false, false};
			hi = 0;
			if (hok && __builtin_mul_overflow(r.hi, a.hi, &hi))
				hok = false;
			r = (range_t){lo, hi, true, hok};
		} else {
			/* negative coefficient: [coef*hi, coef*lo] */
			if (!a.hi_ok)
				return (range_t){0, 0, false, false};
			if (__builtin_mul_overflow(r.lo, a.hi, &lo) ||
			    __builtin_mul_overflow(r.hi, a.lo, &hi))
				return (range_t){0, 0, false, false};
			r = (range_t){lo, hi, true, true};
		}
	}
	return r;
}

static range_t rng_poly(cctx_t *c, const poly_t *p)
{
	range_t r = {0, 0, true, true};
	for (uint32_t i = 0; i < p->n; i++) {
		range_t t = rng_term(c, &p->t[i]);
		r.lo_ok = r.lo_ok && t.lo_ok &&
			  !__builtin_add_overflow(r.lo, t.lo, &r.lo);
		r.hi_ok = r.hi_ok && t.hi_ok &&
			  !__builtin_add_overflow(r.hi, t.hi, &r.hi);
	}
	return r;
}

static range_t rng_of(cctx_t *c, const kiln_expr_t *e)
{
	range_t none = {0, 0, false, false};
	switch (e->kind) {
	case KILN_EX_CONST: return (range_t){e->c, e->c, true, true};
	case KILN_EX_VAR:
		if (e->sym < CIR_MAX_VARS && c->var_known[e->sym]) {
			kiln_dim_t d = c->var_size[e->sym];
			if (d.e == NULL)
				return (range_t){0, d.c - 1, true, true};
		}
		return (range_t){0, 0, true, false};
	case KILN_EX_SYM: {
		const kiln_symbol_t *s = &c->g->symbols[e->sym];
		return (range_t){s->min, s->max, true, s->max >= 0};
	}
	case KILN_EX_MOD:
		if (e->b->kind == KILN_EX_CONST && e->b->c > 0)
			return (range_t){0, e->b->c - 1, true, true};
		return (range_t){0, 0, true, false}; /* divisor sign: sizes */
	case KILN_EX_FLOORDIV: {
		range_t a = rng_of(c, e->a);
		if (e->b->kind == KILN_EX_CONST && e->b->c > 0 && a.lo_ok &&
		    a.lo >= 0)
			return (range_t){a.lo / e->b->c, a.hi / e->b->c, true,
					 a.hi_ok};
		if (a.lo_ok && a.lo >= 0)
			return (range_t){0, a.hi, true, a.hi_ok};
		return none;
	}
	case KILN_EX_ADD:
	case KILN_EX_SUB:
	case KILN_EX_MUL:
	case KILN_EX_NEG: {
		poly_t p;
		pfrom(e, &p);
		return p.bad ? none : rng_poly(c, &p);
	}
	case KILN_EX_MIN:
	case KILN_EX_MAX: {
		/* a bound of min/max needs both sides' bound on one end and
		 * either side's on the other; an unknown side's placeholder
		 * value must never be used */
		range_t a = rng_of(c, e->a), b = rng_of(c, e->b), r;
		if (e->kind == KILN_EX_MIN) {
			r.lo_ok = a.lo_ok && b.lo_ok;
			r.lo = a.lo < b.lo ? a.lo : b.lo;
			r.hi_ok = a.hi_ok || b.hi_ok;
			r.hi = a.hi_ok && b.hi_ok ? (a.hi < b.hi ? a.hi : b.hi)
			       : a.hi_ok	  ? a.hi
						  : b.hi;
		} else {
			r.hi_ok = a.hi_ok && b.hi_ok;
			r.hi = a.hi > b.hi ? a.hi : b.hi;
			r.lo_ok = a.lo_ok || b.lo_ok;
			r.lo = a.lo_ok && b.lo_ok ? (a.lo > b.lo ? a.lo : b.lo)
			       : a.lo_ok	  ? a.lo
						  : b.lo;
		}
		return r;
	}
	}
	return none;
}

/* ---- smart constructors ------------------------------------------------- */

/* Rewrites k*c*(x//c) + k*(x%c) → k*x (c any atom or constant). Returns
 * true when it changed p. */
static bool fold_divmod(cctx_t *c, poly_t *p)
{
	for (uint32_t i = 0; i < p->n; i++) {
		term_t *ti = &p->t[i];
		for (uint8_t a = 0; a < ti->n; a++) {
			const kiln_expr_t *m = ti->at[a];
			if (m->kind != KILN_EX_MOD)
				continue;
			const kiln_expr_t *x = m->a, *d = m->b;
			const kiln_expr_t *q =
			    mk(c, KILN_EX_FLOORDIV, 0, 0, x, d);
			if (q == NULL)
				return false;
			/* the partner: same other atoms, * q (* d if d is an
			 * atom), coefficient ti->coef (* d if constant) */
			term_t want = *ti;
			want.n = 0;
			for (uint8_t b = 0; b < ti->n; b++)
				if (b != a)
					want.at[want.n++] = ti->at[b];
			int64_t wcoef = ti->coef;
			const kiln_expr_t *extra[2] = {q, NULL};
			if (d->kind == KILN_EX_CONST) {
				if (__builtin_mul_overflow(wcoef, d->c, &wcoef))
					continue;
			} else {
				extra[1] = d;
			}
			for (int e = 0; e < 2 && extra[e]; e++) {
				if (want.n == PMAXA)
					goto next;
				uint8_t pos = 0;
				while (pos < want.n &&
				       idof(want.at[pos]) < idof(extra[e]))
					pos++;
				memmove(&want.at[pos + 1], &want.at[pos],
					(want.n - pos) * sizeof(want.at[0]));
				want.at[pos] = extra[e];
				want.n++;
			}
			for (uint32_t j = 0; j < p->n; j++) {
				if (j == i || mono_cmp(&p->t[j], &want) != 0 ||
				    p->t[j].coef != wcoef)
					continue;
				/* replace both by coef * (others) * x */
				term_t rest = *ti;
				rest.n = 0;
				for (uint8_t b = 0; b < ti->n; b++)
					if (b != a)
						rest.at[rest.n++] = ti->at[b];
				poly_t px, pr, prod;
				pr.n = 0;
				pr.bad = false;
				padd_term(&pr, &rest);
				pfrom(x, &px);
				pmul(&pr, &px, &prod);
				if (prod.bad)
					goto next;
				term_t neg_i = *ti, neg_j = p->t[j];
				neg_i.coef = -neg_i.coef;
				neg_j.coef = -neg_j.coef;
				padd_term(p, &neg_i);
				padd_term(p, &neg_j);
				for (uint32_t k = 0; k < prod.n; k++)
					padd_term(p, &prod.t[k]);
				return !p->bad;
			}
		next:;
		}
	}
	return false;
}

static const kiln_expr_t *canon(cctx_t *c, poly_t *p, const kiln_expr_t *raw)
{
	for (int it = 0; it < 8 && !p->bad && fold_divmod(c, p); it++)
		;
	if (p->bad)
		return raw;
	return pto(c, p);
}

const kiln_expr_t *ix_add(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (a->kind == KILN_EX_CONST && a->c == 0)
		return b;
	if (b->kind == KILN_EX_CONST && b->c == 0)
		return a;
	const kiln_expr_t *raw = mk(c, KILN_EX_ADD, 0, 0, a, b);
	poly_t p;
	pfrom(raw, &p);
	return canon(c, &p, raw);
}

const kiln_expr_t *ix_sub(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (b->kind == KILN_EX_CONST && b->c == 0)
		return a;
	const kiln_expr_t *raw = mk(c, KILN_EX_SUB, 0, 0, a, b);
	poly_t p;
	pfrom(raw, &p);
	return canon(c, &p, raw);
}

const kiln_expr_t *ix_mul(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (a->kind == KILN_EX_CONST && a->c == 1)
		return b;
	if (b->kind == KILN_EX_CONST && b->c == 1)
		return a;
	if ((a->kind == KILN_EX_CONST && a->c == 0) ||
	    (b->kind == KILN_EX_CONST && b->c == 0))
		return ix_const(c, 0);
	const kiln_expr_t *raw = mk(c, KILN_EX_MUL, 0, 0, a, b);
	poly_t p;
	pfrom(raw, &p);
	return canon(c, &p, raw);
}

static int64_t fdiv(int64_t a, int64_t b)
{
	int64_t q = a / b;
	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

static int64_t pmod(int64_t a, int64_t b)
{
	int64_t r = a % b;
	if (r != 0 && ((r < 0) != (b < 0)))
		r += b;
	return r;
}

/* Splits p into q*d + r where d is a positive constant: q gets the terms
 * whose coefficients d divides (and the multiple-of-d part of the
 * constant). */
static void psplit_const(const poly_t *p, int64_t d, poly_t *q, poly_t *r)
{
	q->n = r->n = 0;
	q->bad = r->bad = p->bad;
	for (uint32_t i = 0; i < p->n; i++) {
		term_t t = p->t[i];
		if (t.n == 0) {
			term_t tq = t, tr = t;
			tq.coef = fdiv(t.coef, d);
			tr.coef = pmod(t.coef, d);
			padd_term(q, &tq);
			padd_term(r, &tr);
		} else if (t.coef % d == 0) {
			t.coef /= d;
			padd_term(q, &t);
		} else {
			padd_term(r, &t);
		}
	}
}

/* Splits p by an atom d: q gets the terms that have d as a factor (with d
 * removed). */
static void psplit_atom(const poly_t *p, const kiln_expr_t *d, poly_t *q,
			poly_t *r)
{
	q->n = r->n = 0;
	q->bad = r->bad = p->bad;
	for (uint32_t i = 0; i < p->n; i++) {
		term_t t = p->t[i];
		uint8_t k = 0;
		while (k < t.n && t.at[k] != d)
			k++;
		if (k < t.n) {
			memmove(&t.at[k], &t.at[k + 1],
				(t.n - k - 1) * sizeof(t.at[0]));
			t.n--;
			padd_term(q, &t);
		} else {
			padd_term(r, &t);
		}
	}
}

/* (a*q + r) // (a*m) = q // m and (a*q + r) % (a*m) = a*(q % m) + r when
 * 0 <= r < a: finds such an a among p's coefficients (largest first). */
static bool split_by_factor(cctx_t *c, const poly_t *p, int64_t d, int64_t *a,
			    poly_t *q, poly_t *r)
{
	int64_t best = 0;
	for (uint32_t i = 0; i < p->n; i++) {
		int64_t k = p->t[i].coef < 0 ? -p->t[i].coef : p->t[i].coef;
		if (p->t[i].n == 0 || k <= 1 || k >= d || d % k != 0 ||
		    k <= best)
			continue;
		poly_t qq, rr;
		psplit_const(p, k, &qq, &rr);
		range_t rg = rng_poly(c, &rr);
		if (qq.bad || rr.bad || !rg.lo_ok || !rg.hi_ok || rg.lo < 0 ||
		    rg.hi >= k)
			continue;
		best = k;
		*q = qq;
		*r = rr;
	}
	*a = best;
	return best > 0;
}

/* ---- symbolic divisors ------------------------------------------------ */

/* Splits p by a divisor monomial d (coefficient dc, atoms da): q gets the
 * terms d divides (divided by d), r the rest. */
static void psplit_mono(const poly_t *p, const term_t *d, poly_t *q, poly_t *r)
{
	q->n = r->n = 0;
	q->bad = r->bad = p->bad;
	for (uint32_t i = 0; i < p->n; i++) {
		term_t t = p->t[i];
		bool div = t.coef % d->coef == 0;
		term_t rest = t;
		rest.n = 0;
		uint8_t j = 0;
		for (uint8_t k = 0; k < t.n && div; k++) {
			if (j < d->n && t.at[k] == d->at[j])
				j++;
			else
				rest.at[rest.n++] = t.at[k];
		}
		if (div && j == d->n) {
			rest.coef = t.coef / d->coef;
			padd_term(q, &rest);
		} else {
			padd_term(r, &t);
		}
	}
}

/* An upper bound of r as a polynomial, when r is a non-negative sum of
 * terms coef * var (vars bounded by their sizes - 1, possibly symbolic),
 * coef * (x % m) (bounded by m - 1) and coef * symbol-products (their own
 * bound). false when r may be negative or unbounded. */
static bool poly_upper(cctx_t *c, const poly_t *r, poly_t *out)
{
	out->n = 0;
	out->bad = false;
	for (uint32_t i = 0; i < r->n; i++) {
		const term_t *t = &r->t[i];
		if (t->coef < 0)
			return false;
		if (t->n == 0) {
			padd_term(out, t);
			continue;
		}
		bool all_sym = true;
		for (uint8_t k = 0; k < t->n; k++)
			all_sym = all_sym && t->at[k]->kind == KILN_EX_SYM;
		if (all_sym) {
			padd_term(out, t);
			continue;
		}
		if (t->n != 1)
			return false;
		const kiln_expr_t *a = t->at[0];
		const kiln_expr_t *bound = NULL;
		if (a->kind == KILN_EX_VAR && a->sym < CIR_MAX_VARS &&
		    c->var_known[a->sym])
			bound = ix_dim(c, c->var_size[a->sym]);
		else if (a->kind == KILN_EX_MOD)
			bound = a->b;
		if (bound == NULL)
			return false;
		poly_t bp;
		pfrom(bound, &bp);
		term_t m1 = {-1, 0, {0}};
		padd_term(&bp, &m1);
		pscale(&bp, t->coef);
		for (uint32_t k = 0; k < bp.n; k++)
			padd_term(out, &bp.t[k]);
	}
	return !out->bad;
}

/* Whether 0 <= r < d for every allowed value (symbols are >= 0). */
static bool below(cctx_t *c, const poly_t *r, const poly_t *d)
{
	poly_t up;
	if (!poly_upper(c, r, &up))
		return false;
	/* d - 1 - up must have no negative coefficient */
	poly_t diff = *d;
	term_t m1 = {-1, 0, {0}};
	padd_term(&diff, &m1);
	for (uint32_t i = 0; i < up.n; i++) {
		term_t t = up.t[i];
		t.coef = -t.coef;
		padd_term(&diff, &t);
	}
	if (diff.bad)
		return false;
	for (uint32_t i = 0; i < diff.n; i++)
		if (diff.t[i].coef < 0)
			return false;
	return true;
}

/* The symbolic form of split_by_factor: for a monomial divisor d, finds a
 * monomial a that divides d (m = d / a) with p = a*q + r and 0 <= r < a,
 * so p // d = q // m and p % d = a*(q % m) + r. The candidates come from
 * p's terms: a's coefficient is the gcd of the term's and d's, its atoms
 * the ones the term shares with d. Among those that hold, the one with the
 * most atoms, then the largest coefficient, wins. A reshape of a dynamic
 * [2*s, 192] into [s, 2, 3, 8, 16] reads ((16*i1 + i2 + 16*s*i0) //
 * (64*s)), which is i0 // 4 for i1 < s and i2 < 16. */
static bool symsplit_factor(cctx_t *c, const poly_t *p, const term_t *d,
			    term_t *a, term_t *m, poly_t *q, poly_t *r)
{
	bool found = false;
	for (uint32_t i = 0; i < p->n; i++) {
		const term_t *t = &p->t[i];
		if (t->n == 0)
			continue;
		int64_t x = t->coef < 0 ? -t->coef : t->coef, y = d->coef;
		while (y != 0) {
			int64_t z = x % y;
			x = y;
			y = z;
		}
		term_t ca = {x, 0, {0}}, cm = {d->coef / x, 0, {0}};
		uint8_t j = 0;
		for (uint8_t k = 0; k < d->n; k++) {
			while (j < t->n && idof(t->at[j]) < idof(d->at[k]))
				j++;
			if (j < t->n && t->at[j] == d->at[k]) {
				ca.at[ca.n++] = d->at[k];
				j++;
			} else {
				cm.at[cm.n++] = d->at[k];
			}
		}
		/* a == d is symdiv's case; a == 1 splits nothing */
		if ((cm.n == 0 && cm.coef == 1) || (ca.n == 0 && ca.coef == 1))
			continue;
		if (found &&
		    (ca.n < a->n || (ca.n == a->n && ca.coef <= a->coef)))
			continue;
		poly_t qq, rr, ap = {0, false, {{0}}};
		psplit_mono(p, &ca, &qq, &rr);
		padd_term(&ap, &ca);
		if (qq.bad || rr.bad || qq.n == 0 || !below(c, &rr, &ap))
			continue;
		*a = ca;
		*m = cm;
		*q = qq;
		*r = rr;
		found = true;
	}
	return found;
}

static const kiln_expr_t *pmono(cctx_t *c, const term_t *t)
{
	poly_t p = {0, false, {{0}}};
	padd_term(&p, t);
	return pto(c, &p);
}

/* p // d and p % d for a symbolic monomial divisor d: p = q*d + r with
 * 0 <= r < d gives q and r. */
static bool symdiv(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b,
		   poly_t *q, poly_t *r)
{
	poly_t p, d;
	pfrom(a, &p);
	pfrom(b, &d);
	if (p.bad || d.bad || d.n != 1 || d.t[0].coef <= 0 || d.t[0].n == 0)
		return false;
	psplit_mono(&p, &d.t[0], q, r);
	if (q->bad || r->bad)
		return false;
	return below(c, r, &d);
}

const kiln_expr_t *ix_floordiv(cctx_t *c, const kiln_expr_t *a,
			       const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (b->kind == KILN_EX_CONST) {
		if (b->c == 1)
			return a;
		if (b->c > 0) {
			if (a->kind == KILN_EX_CONST)
				return ix_const(c, fdiv(a->c, b->c));
			poly_t p, q, r;
			pfrom(a, &p);
			if (!p.bad) {
				psplit_const(&p, b->c, &q, &r);
				range_t rr = rng_poly(c, &r);
				if (!q.bad && !r.bad && rr.lo_ok && rr.hi_ok &&
				    rr.lo >= 0 && rr.hi < b->c)
					return pto(c, &q);
				int64_t f;
				if (split_by_factor(c, &p, b->c, &f, &q, &r))
					return ix_floordiv(
					    c, pto(c, &q),
					    ix_const(c, b->c / f));
				psplit_const(&p, b->c, &q, &r);
				/* (q*d + r)//d = q + r//d */
				if (!q.bad && !r.bad && q.n > 0) {
					const kiln_expr_t *re = pto(c, &r);
					const kiln_expr_t *rd = mk(
					    c, KILN_EX_FLOORDIV, 0, 0, re, b);
					return ix_add(c, pto(c, &q), rd);
				}
			}
			/* (x//m)//n = x//(m*n) */
			if (a->kind == KILN_EX_FLOORDIV &&
			    a->b->kind == KILN_EX_CONST && a->b->c > 0) {
				int64_t mn;
				if (!__builtin_mul_overflow(a->b->c, b->c, &mn))
					return ix_floordiv(c, a->a,
							   ix_const(c, mn));
			}
		}
	} else if (b->kind != KILN_EX_CONST) {
		poly_t p, q, r, d;
		if (symdiv(c, a, b, &q, &r))
			return pto(c, &q);
		pfrom(a, &p);
		pfrom(b, &d);
		term_t fa, fm;
		if (!p.bad && !d.bad && d.n == 1 && d.t[0].coef > 0 &&
		    symsplit_factor(c, &p, &d.t[0], &fa, &fm, &q, &r))
			return ix_floordiv(c, pto(c, &q), pmono(c, &fm));
		if (!p.bad) {
			psplit_atom(&p, b, &q, &r);
			if (!q.bad && r.n == 0)
				return pto(c, &q);
		}
	}
	return mk(c, KILN_EX_FLOORDIV, 0, 0, a, b);
}

const kiln_expr_t *ix_mod(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (b->kind == KILN_EX_CONST && b->c > 0) {
		if (b->c == 1)
			return ix_const(c, 0);
		if (a->kind == KILN_EX_CONST)
			return ix_const(c, pmod(a->c, b->c));
		poly_t p, q, r;
		pfrom(a, &p);
		if (!p.bad) {
			psplit_const(&p, b->c, &q, &r);
			range_t rr = rng_poly(c, &r);
			if (!r.bad && rr.lo_ok && rr.hi_ok && rr.lo >= 0 &&
			    rr.hi < b->c)
				return pto(c, &r);
			int64_t f;
			poly_t q2, r2;
			if (split_by_factor(c, &p, b->c, &f, &q2, &r2))
				return ix_add(
				    c,
				    ix_mul(c, ix_const(c, f),
					   ix_mod(c, pto(c, &q2),
						  ix_const(c, b->c / f))),
				    pto(c, &r2));
			if (!r.bad && q.n > 0)
				return mk(c, KILN_EX_MOD, 0, 0, pto(c, &r), b);
		}
	} else if (b->kind != KILN_EX_CONST) {
		poly_t p, q, r, d;
		if (symdiv(c, a, b, &q, &r))
			return pto(c, &r);
		pfrom(a, &p);
		pfrom(b, &d);
		term_t fa, fm;
		if (!p.bad && !d.bad && d.n == 1 && d.t[0].coef > 0 &&
		    symsplit_factor(c, &p, &d.t[0], &fa, &fm, &q, &r))
			return ix_add(
			    c,
			    ix_mul(c, pmono(c, &fa),
				   ix_mod(c, pto(c, &q), pmono(c, &fm))),
			    pto(c, &r));
		if (!p.bad) {
			psplit_atom(&p, b, &q, &r);
			if (!r.bad && q.n > 0) {
				if (r.n == 0)
					return ix_const(c, 0);
				return mk(c, KILN_EX_MOD, 0, 0, pto(c, &r), b);
			}
		}
	}
	return mk(c, KILN_EX_MOD, 0, 0, a, b);
}

const kiln_expr_t *ix_min(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (a == b)
		return a;
	if (a->kind == KILN_EX_CONST && b->kind == KILN_EX_CONST)
		return ix_const(c, a->c < b->c ? a->c : b->c);
	range_t ra = rng_of(c, a), rb = rng_of(c, b);
	if (ra.hi_ok && rb.lo_ok && ra.hi <= rb.lo)
		return a;
	if (rb.hi_ok && ra.lo_ok && rb.hi <= ra.lo)
		return b;
	if (idof(a) > idof(b)) {
		const kiln_expr_t *t = a;
		a = b;
		b = t;
	}
	return mk(c, KILN_EX_MIN, 0, 0, a, b);
}

const kiln_expr_t *ix_max(cctx_t *c, const kiln_expr_t *a, const kiln_expr_t *b)
{
	if (a == NULL || b == NULL)
		return NULL;
	if (a == b)
		return a;
	if (a->kind == KILN_EX_CONST && b->kind == KILN_EX_CONST)
		return ix_const(c, a->c > b->c ? a->c : b->c);
	range_t ra = rng_of(c, a), rb = rng_of(c, b);
	if (ra.lo_ok && rb.hi_ok && ra.lo >= rb.hi)
		return a;
	if (rb.lo_ok && ra.hi_ok && rb.lo >= ra.hi)
		return b;
	if (idof(a) > idof(b)) {
		const kiln_expr_t *t = a;
		a = b;
		b = t;
	}
	return mk(c, KILN_EX_MAX, 0, 0, a, b);
}

static const kiln_expr_t *rebuild(cctx_t *c, kiln_expr_kind_t k,
				  const kiln_expr_t *a, const kiln_expr_t *b)
{
	switch (k) {
	case KILN_EX_ADD: return ix_add(c, a, b);
	case KILN_EX_SUB: return ix_sub(c, a, b);
	case KILN_EX_MUL: return ix_mul(c, a, b);
	case KILN_EX_FLOORDIV: return ix_floordiv(c, a, b);
	case KILN_EX_MOD: return ix_mod(c, a, b);
	case KILN_EX_MIN: return ix_min(c, a, b);
	case KILN_EX_MAX: return ix_max(c, a, b);
	case KILN_EX_NEG: return ix_sub(c, ix_const(c, 0), a);
	default: return NULL;
	}
}

const kiln_expr_t *ix_intern(cctx_t *c, const kiln_expr_t *e)
{
	if (e == NULL)
		return NULL;
	switch (e->kind) {
	case KILN_EX_CONST: return ix_const(c, e->c);
	case KILN_EX_SYM: return ix_sym(c, e->sym);
	case KILN_EX_VAR: return ix_var(c, e->sym);
	case KILN_EX_NEG: return rebuild(c, e->kind, ix_intern(c, e->a), NULL);
	default:
		return rebuild(c, e->kind, ix_intern(c, e->a),
			       ix_intern(c, e->b));
	}
}

const kiln_expr_t *ix_dim(cctx_t *c, kiln_dim_t d)
{
	return d.e == NULL ? ix_const(c, d.c) : ix_intern(c, d.e);
}

kiln_dim_t dim_of(const kiln_expr_t *e)
{
	kiln_dim_t d = {0, NULL};
	if (e != NULL && e->kind == KILN_EX_CONST)
		d.c = e->c;
	else
		d.e = e;
	return d;
}

kiln_dim_t dim_const(int64_t v)
{
	kiln_dim_t d = {v, NULL};
	return d;
}

bool dim_eq(kiln_dim_t a, kiln_dim_t b)
{
	if (a.e == NULL && b.e == NULL)
		return a.c == b.c;
	return a.e == b.e;
}

bool dim_is(kiln_dim_t a, int64_t v)
{
	return a.e == NULL && a.c == v;
}

kiln_dim_t dim_mul(cctx_t *c, kiln_dim_t a, kiln_dim_t b)
{
	return dim_of(ix_mul(c, ix_dim(c, a), ix_dim(c, b)));
}

kiln_dim_t dim_add(cctx_t *c, kiln_dim_t a, kiln_dim_t b)
{
	return dim_of(ix_add(c, ix_dim(c, a), ix_dim(c, b)));
}

bool ix_bounds(cctx_t *c, const kiln_expr_t *e, int64_t *lo, int64_t *hi)
{
	range_t r = rng_of(c, e);
	*lo = r.lo;
	*hi = r.hi;
	return r.lo_ok && r.hi_ok;
}

bool ix_lower_bound(cctx_t *c, const kiln_expr_t *e, int64_t *lo)
{
	range_t r = rng_of(c, e);
	*lo = r.lo;
	return r.lo_ok;
}

const kiln_expr_t *ix_subst(cctx_t *c, const kiln_expr_t *e,
			    const kiln_expr_t *const *map, uint32_t n)
{
	switch (e->kind) {
	case KILN_EX_CONST:
	case KILN_EX_SYM: return e;
	case KILN_EX_VAR:
		return e->sym < n && map[e->sym] != NULL ? map[e->sym] : e;
	case KILN_EX_NEG:
		return rebuild(c, e->kind, ix_subst(c, e->a, map, n), NULL);
	default:
		return rebuild(c, e->kind, ix_subst(c, e->a, map, n),
			       ix_subst(c, e->b, map, n));
	}
}

bool ix_uses_var(const kiln_expr_t *e, uint32_t v)
{
	if (e == NULL)
		return false;
	if (e->kind == KILN_EX_VAR)
		return e->sym == v;
	return ix_uses_var(e->a, v) || ix_uses_var(e->b, v);
}

uint64_t ix_vars(const kiln_expr_t *e)
{
	if (e == NULL)
		return 0;
	if (e->kind == KILN_EX_VAR)
		return e->sym < 64 ? (uint64_t)1 << e->sym : 0;
	return ix_vars(e->a) | ix_vars(e->b);
}

bool ix_coef(const kiln_expr_t *e, uint32_t v, int64_t *coef)
{
	switch (e->kind) {
	case KILN_EX_CONST:
	case KILN_EX_SYM: *coef = 0; return true;
	case KILN_EX_VAR: *coef = e->sym == v; return true;
	case KILN_EX_ADD:
	case KILN_EX_SUB: {
		int64_t x, y;
		if (!ix_coef(e->a, v, &x) || !ix_coef(e->b, v, &y))
			return false;
		*coef = e->kind == KILN_EX_ADD ? x + y : x - y;
		return true;
	}
	case KILN_EX_NEG:
		if (!ix_coef(e->a, v, coef))
			return false;
		*coef = -*coef;
		return true;
	case KILN_EX_MUL: {
		bool ua = ix_uses_var(e->a, v), ub = ix_uses_var(e->b, v);
		if (!ua && !ub) {
			*coef = 0;
			return true;
		}
		if (ua && ub)
			return false;
		const kiln_expr_t *k = ua ? e->b : e->a;
		const kiln_expr_t *x = ua ? e->a : e->b;
		if (k->kind != KILN_EX_CONST)
			return false;
		int64_t cx;
		if (!ix_coef(x, v, &cx))
			return false;
		*coef = cx * k->c;
		return true;
	}
	default:
		if (!ix_uses_var(e, v)) {
			*coef = 0;
			return true;
		}
		return false;
	}
}

int ix_eval(const kiln_expr_t *e, const int64_t *syms, int64_t *out)
{
	return kiln_expr_eval(e, syms, out);
}

int64_t ix_estimate(cctx_t *c, const kiln_expr_t *e)
{
	int64_t syms[64];
	uint32_t n = c->g->n_symbols < 64 ? c->g->n_symbols : 64;
	for (uint32_t i = 0; i < n; i++) {
		const kiln_symbol_t *s = &c->g->symbols[i];
		syms[i] = s->hint >= 0		     ? s->hint
			  : s->min > c->hint_default ? s->min
						     : c->hint_default;
	}
	int64_t v = 0;
	if (kiln_expr_eval(e, syms, &v) != 0)
		return c->hint_default;
	return v;
}
