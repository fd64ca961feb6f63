/*
 * expr.c — symbolic integer expressions: parse (GRAPH.md grammar), format,
 * evaluate.
 *
 * Invariants: a parsed tree has at most ctx->max_nodes nodes and depth at
 * most max_nodes, so recursion here is bounded by the limits. Constant
 * subtrees are folded at parse time (with overflow checks), so a dimension
 * given as "8" or 8 is the same KILN_EX_CONST. Pure functions; any thread.
 */
#include "protocol/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kiln_expr_t *kiln__expr_new(kiln_arena_t *a, kiln_expr_kind_t k,
				  int64_t c, uint32_t sym, const kiln_expr_t *x,
				  const kiln_expr_t *y)
{
	kiln_expr_t *e = kiln_arena_alloc(a, sizeof(*e));
	if (e == NULL)
		return NULL;
	e->kind = k;
	e->c = c;
	e->sym = sym;
	e->a = x;
	e->b = y;
	return e;
}

int kiln__sym_find(const kiln_symbol_t *syms, uint32_t n, const char *s,
		   size_t len)
{
	for (uint32_t i = 0; i < n; i++)
		if (strlen(syms[i].name) == len &&
		    memcmp(syms[i].name, s, len) == 0)
			return (int)i;
	return -1;
}

static int64_t floordiv(int64_t a, int64_t b)
{
	int64_t q = a / b;
	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

static int64_t pymod(int64_t a, int64_t b)
{
	int64_t r = a % b;
	if (r != 0 && ((r < 0) != (b < 0)))
		r += b;
	return r;
}

/* Applies a binary op to constants; 0 or KILN_EINVGRAPH. */
static int fold(kiln_expr_kind_t k, int64_t x, int64_t y, int64_t *out)
{
	switch (k) {
	case KILN_EX_ADD:
		return __builtin_add_overflow(x, y, out) ? KILN_EINVGRAPH : 0;
	case KILN_EX_SUB:
		return __builtin_sub_overflow(x, y, out) ? KILN_EINVGRAPH : 0;
	case KILN_EX_MUL:
		return __builtin_mul_overflow(x, y, out) ? KILN_EINVGRAPH : 0;
	case KILN_EX_FLOORDIV:
		if (y == 0 || (x == INT64_MIN && y == -1))
			return KILN_EINVGRAPH;
		*out = floordiv(x, y);
		return 0;
	case KILN_EX_MOD:
		if (y == 0 || (x == INT64_MIN && y == -1))
			return KILN_EINVGRAPH;
		*out = pymod(x, y);
		return 0;
	case KILN_EX_MIN: *out = x < y ? x : y; return 0;
	case KILN_EX_MAX: *out = x > y ? x : y; return 0;
	default: return KILN_EINVGRAPH;
	}
}

typedef struct parser {
	const kiln__expr_ctx_t *ctx;
	const char *s, *end, *start;
	uint32_t nodes;
	uint32_t depth;
	char *err;
	size_t errlen;
} parser_t;

static void skip_ws(parser_t *p)
{
	while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' ||
				 *p->s == '\n' || *p->s == '\r'))
		p->s++;
}

static int perr(parser_t *p, const char *what)
{
	return kiln__errf(
	    p->err, p->errlen, KILN_EINVGRAPH,
	    "expression \"%.*s\": %s at offset %d",
	    (int)(p->end - p->start > 80 ? 80 : p->end - p->start), p->start,
	    what, (int)(p->s - p->start));
}

static int mk(parser_t *p, kiln_expr_kind_t k, const kiln_expr_t *a,
	      const kiln_expr_t *b, const kiln_expr_t **out)
{
	if (a->kind == KILN_EX_CONST &&
	    (b == NULL || b->kind == KILN_EX_CONST)) {
		int64_t v;
		if (k == KILN_EX_NEG) {
			if (a->c == INT64_MIN)
				return perr(p, "integer overflow");
			v = -a->c;
		} else if (fold(k, a->c, b->c, &v) != 0) {
			return perr(p, "overflow or division by zero");
		}
		*out = kiln__expr_new(p->ctx->arena, KILN_EX_CONST, v, 0, NULL,
				      NULL);
		return *out ? 0 : -ENOMEM;
	}
	if ((k == KILN_EX_FLOORDIV || k == KILN_EX_MOD) &&
	    b->kind == KILN_EX_CONST && b->c == 0)
		return perr(p, "division by zero");
	if (++p->nodes > p->ctx->max_nodes)
		return perr(p, "expression too large");
	/* Canonical operand order for commutative ops: a constant first. */
	if ((k == KILN_EX_ADD || k == KILN_EX_MUL) && b != NULL &&
	    b->kind == KILN_EX_CONST && a->kind != KILN_EX_CONST) {
		const kiln_expr_t *t = a;
		a = b;
		b = t;
	}
	*out = kiln__expr_new(p->ctx->arena, k, 0, 0, a, b);
	return *out ? 0 : -ENOMEM;
}

static int parse_expr(parser_t *p, const kiln_expr_t **out);

static int parse_atom(parser_t *p, const kiln_expr_t **out)
{
	skip_ws(p);
	if (p->s >= p->end)
		return perr(p, "unexpected end");
	char c = *p->s;
	if (c >= '0' && c <= '9') {
		int64_t v = 0;
		while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
			if (__builtin_mul_overflow(v, 10, &v) ||
			    __builtin_add_overflow(v, *p->s - '0', &v))
				return perr(p, "integer overflow");
			p->s++;
		}
		if (++p->nodes > p->ctx->max_nodes)
			return perr(p, "expression too large");
		*out = kiln__expr_new(p->ctx->arena, KILN_EX_CONST, v, 0, NULL,
				      NULL);
		return *out ? 0 : -ENOMEM;
	}
	if (c == '(') {
		p->s++;
		int rc = parse_expr(p, out);
		if (rc != 0)
			return rc;
		skip_ws(p);
		if (p->s >= p->end || *p->s != ')')
			return perr(p, "expected ')'");
		p->s++;
		return 0;
	}
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
		const char *b = p->s;
		while (p->s < p->end &&
		       ((*p->s >= 'a' && *p->s <= 'z') ||
			(*p->s >= 'A' && *p->s <= 'Z') ||
			(*p->s >= '0' && *p->s <= '9') || *p->s == '_'))
			p->s++;
		size_t n = (size_t)(p->s - b);
		bool is_min = n == 3 && memcmp(b, "min", 3) == 0;
		bool is_max = n == 3 && memcmp(b, "max", 3) == 0;
		if (is_min || is_max) {
			const kiln_expr_t *x, *y;
			skip_ws(p);
			if (p->s >= p->end || *p->s != '(')
				return perr(p, "expected '(' after min/max");
			p->s++;
			int rc = parse_expr(p, &x);
			if (rc != 0)
				return rc;
			skip_ws(p);
			if (p->s >= p->end || *p->s != ',')
				return perr(p, "expected ','");
			p->s++;
			rc = parse_expr(p, &y);
			if (rc != 0)
				return rc;
			skip_ws(p);
			if (p->s >= p->end || *p->s != ')')
				return perr(p, "expected ')'");
			p->s++;
			return mk(p, is_min ? KILN_EX_MIN : KILN_EX_MAX, x, y,
				  out);
		}
		int i = kiln__sym_find(p->ctx->syms, p->ctx->n_syms, b, n);
		if (i < 0) {
			p->s = b;
			return kiln__errf(p->err, p->errlen, KILN_EINVGRAPH,
					  "expression \"%.*s\": undeclared "
					  "symbol \"%.*s\"",
					  (int)(p->end - p->start > 80
						    ? 80
						    : p->end - p->start),
					  p->start, (int)(n > 64 ? 64 : n), b);
		}
		if (++p->nodes > p->ctx->max_nodes)
			return perr(p, "expression too large");
		*out = kiln__expr_new(p->ctx->arena, KILN_EX_SYM, 0,
				      (uint32_t)i, NULL, NULL);
		return *out ? 0 : -ENOMEM;
	}
	return perr(p, "unexpected character");
}

static int parse_unary(parser_t *p, const kiln_expr_t **out)
{
	skip_ws(p);
	if (p->s < p->end && *p->s == '-') {
		p->s++;
		if (++p->depth > p->ctx->max_nodes)
			return perr(p, "expression too deep");
		const kiln_expr_t *x;
		int rc = parse_unary(p, &x);
		p->depth--;
		if (rc != 0)
			return rc;
		return mk(p, KILN_EX_NEG, x, NULL, out);
	}
	return parse_atom(p, out);
}

static int parse_term(parser_t *p, const kiln_expr_t **out)
{
	const kiln_expr_t *x;
	int rc = parse_unary(p, &x);
	while (rc == 0) {
		skip_ws(p);
		kiln_expr_kind_t k;
		if (p->s < p->end && *p->s == '*') {
			k = KILN_EX_MUL;
			p->s++;
		} else if (p->end - p->s >= 2 && p->s[0] == '/' &&
			   p->s[1] == '/') {
			k = KILN_EX_FLOORDIV;
			p->s += 2;
		} else if (p->s < p->end && *p->s == '%') {
			k = KILN_EX_MOD;
			p->s++;
		} else {
			break;
		}
		const kiln_expr_t *y;
		rc = parse_unary(p, &y);
		if (rc == 0)
			rc = mk(p, k, x, y, &x);
	}
	if (rc == 0)
		*out = x;
	return rc;
}

static int parse_expr(parser_t *p, const kiln_expr_t **out)
{
	if (++p->depth > p->ctx->max_nodes)
		return perr(p, "expression too deep");
	const kiln_expr_t *x;
	int rc = parse_term(p, &x);
	while (rc == 0) {
		skip_ws(p);
		kiln_expr_kind_t k;
		if (p->s < p->end && *p->s == '+')
			k = KILN_EX_ADD;
		else if (p->s < p->end && *p->s == '-')
			k = KILN_EX_SUB;
		else
			break;
		p->s++;
		const kiln_expr_t *y;
		rc = parse_term(p, &y);
		if (rc == 0)
			rc = mk(p, k, x, y, &x);
	}
	p->depth--;
	if (rc == 0)
		*out = x;
	return rc;
}

int kiln__expr_parse(const kiln__expr_ctx_t *ctx, const char *s, size_t len,
		     const kiln_expr_t **out, char *err, size_t errlen)
{
	parser_t p = {ctx, s, s + len, s, 0, 0, err, errlen};
	if (len > 16 * (size_t)ctx->max_nodes + 64)
		return perr(&p, "expression too long");
	int rc = parse_expr(&p, out);
	if (rc != 0)
		return rc;
	skip_ws(&p);
	if (p.s != p.end)
		return perr(&p, "trailing characters");
	return 0;
}

int kiln_expr_eval_str(const char *s, const char *const *names,
		       const int64_t *vals, uint32_t n, int64_t *out, char *err,
		       size_t errlen)
{
	kiln_arena_t *a = kiln_arena_new(1024);
	kiln_symbol_t *syms =
	    a ? kiln_arena_calloc(a, n + 1, sizeof(*syms)) : NULL;
	if (syms == NULL) {
		kiln_arena_free(a);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		syms[i] = (kiln_symbol_t){names[i], 0, -1, -1};
	kiln__expr_ctx_t ctx = {a, syms, n, 4096};
	const kiln_expr_t *e = NULL;
	int rc = kiln__expr_parse(&ctx, s, strlen(s), &e, err, errlen);
	if (rc == 0) {
		rc = kiln_expr_eval(e, vals, out);
		if (rc != 0)
			snprintf(err, errlen,
				 "expression \"%.80s\": division by zero or "
				 "overflow",
				 s);
	}
	kiln_arena_free(a);
	return rc;
}

int kiln_expr_eval(const kiln_expr_t *e, const int64_t *syms, int64_t *out)
{
	int64_t x, y;
	int rc;
	switch (e->kind) {
	case KILN_EX_CONST: *out = e->c; return 0;
	case KILN_EX_SYM: *out = syms[e->sym]; return 0;
	case KILN_EX_NEG:
		rc = kiln_expr_eval(e->a, syms, &x);
		if (rc != 0)
			return rc;
		if (x == INT64_MIN)
			return KILN_EINVGRAPH;
		*out = -x;
		return 0;
	default:
		rc = kiln_expr_eval(e->a, syms, &x);
		if (rc == 0)
			rc = kiln_expr_eval(e->b, syms, &y);
		if (rc == 0)
			rc = fold(e->kind, x, y, out);
		return rc;
	}
}

/* Precedence for printing: 1 additive, 2 multiplicative, 3 unary, 4 atom. */
static int prec(const kiln_expr_t *e)
{
	switch (e->kind) {
	case KILN_EX_ADD:
	case KILN_EX_SUB: return 1;
	case KILN_EX_MUL:
	case KILN_EX_FLOORDIV:
	case KILN_EX_MOD: return 2;
	case KILN_EX_NEG: return 3;
	default: return 4;
	}
}

typedef struct outbuf {
	char *buf;
	size_t n, len;
} outbuf_t;

static void put(outbuf_t *o, const char *s)
{
	size_t l = strlen(s);
	if (o->len < o->n) {
		size_t room = o->n - o->len - 1;
		memcpy(o->buf + o->len, s, l < room ? l : room);
		o->buf[o->len + (l < room ? l : room)] = '\0';
	}
	o->len += l;
}

static void fmt(const kiln_graph_t *g, const kiln_expr_t *e, outbuf_t *o,
		int min_prec, bool right)
{
	char tmp[32];
	int pe = prec(e);
	bool paren = pe < min_prec || (right && pe == min_prec && pe < 3);
	if (paren)
		put(o, "(");
	switch (e->kind) {
	case KILN_EX_CONST:
		if (e->c == INT64_MIN) { /* not writable as one literal */
			put(o, "(-9223372036854775807 - 1)");
			break;
		}
		snprintf(tmp, sizeof(tmp), "%lld", (long long)e->c);
		if (e->c < 0 && !paren)
			put(o, "("), put(o, tmp), put(o, ")");
		else
			put(o, tmp);
		break;
	case KILN_EX_SYM:
		if (g != NULL && e->sym < g->n_symbols)
			put(o, g->symbols[e->sym].name);
		else
			snprintf(tmp, sizeof(tmp), "$%u", e->sym), put(o, tmp);
		break;
	case KILN_EX_NEG:
		put(o, "-");
		fmt(g, e->a, o, 3, false);
		break;
	case KILN_EX_VAR:
		snprintf(tmp, sizeof(tmp), "i%u", e->sym), put(o, tmp);
		break;
	case KILN_EX_MIN:
	case KILN_EX_MAX:
		put(o, e->kind == KILN_EX_MIN ? "min(" : "max(");
		fmt(g, e->a, o, 0, false);
		put(o, ", ");
		fmt(g, e->b, o, 0, false);
		put(o, ")");
		break;
	default: {
		const char *op = e->kind == KILN_EX_ADD	  ? " + "
				 : e->kind == KILN_EX_SUB ? " - "
				 : e->kind == KILN_EX_MUL ? "*"
				 : e->kind == KILN_EX_MOD ? "%"
							  : "//";
		fmt(g, e->a, o, pe, false);
		put(o, op);
		fmt(g, e->b, o, pe, true);
		break;
	}
	}
	if (paren)
		put(o, ")");
}

int kiln_expr_format(const kiln_graph_t *g, const kiln_expr_t *e, char *buf,
		     size_t n)
{
	outbuf_t o = {buf, n, 0};
	if (n > 0)
		buf[0] = '\0';
	fmt(g, e, &o, 0, false);
	return (int)o.len;
}
