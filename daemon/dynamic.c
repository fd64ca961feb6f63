/*
 * dynamic.c — automatic dynamic shapes: from two static graphs of the same
 * structure (equal structure hash: the same ops, arguments and dtypes, sizes
 * erased), make one graph whose varying sizes are symbols; and decide
 * whether a later static graph is an instance of it.
 *
 * Generalizing. Every position that holds an integer — each value's sizes
 * and strides, and every int argument (view shapes, slice bounds...) — is a
 * pair (a, b) from the two graphs. Equal pairs stay constants. The pairs of
 * the graph inputs' sizes that differ become symbols s0, s1, ... (one per
 * distinct pair, so two dims that moved together — batch in x and in the
 * labels — share a symbol, as PyTorch's duck sizing does). Every other
 * differing pair must be explained by an expression over those symbols that
 * gives a in the first graph and b in the second: s, k*s, s*t, k*s*t, s+c,
 * s//k (the shapes views, flattening and strides produce). A pair nothing
 * explains, or a size of 0 or 1 that varies (broadcasting depends on it),
 * means the graph is not generalized.
 *
 * Serving. A static graph is an instance of a generalized one when binding
 * each symbol from the input sizes it names gives, for every position, the
 * graph's own integer. Then both compute the same thing on these inputs, so
 * the generalized artifact serves it. The check is exact, so a wrong guess
 * above can only cost a compile, never a wrong answer.
 *
 * Threads: pure functions; any thread.
 */
#include "daemon/dynamic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SYMS 16

typedef struct gen {
	kiln_graph_t *g; /* the copy being generalized (its arena) */
	int64_t sa[MAX_SYMS], sb[MAX_SYMS];
	uint32_t n;
	bool all; /* one sample: every input size >= 2 becomes a symbol */
	char *err;
	size_t errlen;
} gen_t;

static kiln_expr_t *ex(gen_t *G, kiln_expr_kind_t k, int64_t c, uint32_t sym,
		       const kiln_expr_t *a, const kiln_expr_t *b)
{
	kiln_expr_t *e = kiln_arena_calloc(G->g->arena, 1, sizeof(*e));
	if (e != NULL) {
		e->kind = k;
		e->c = c;
		e->sym = sym;
		e->a = a;
		e->b = b;
	}
	return e;
}

static const kiln_expr_t *sym(gen_t *G, uint32_t i)
{
	return ex(G, KILN_EX_SYM, 0, i, NULL, NULL);
}

static const kiln_expr_t *mulc(gen_t *G, int64_t k, const kiln_expr_t *e)
{
	if (e == NULL || k == 1)
		return e;
	return ex(G, KILN_EX_MUL, 0, 0, ex(G, KILN_EX_CONST, k, 0, NULL, NULL),
		  e);
}

/* An expression over the symbols that is a in graph A and b in graph B;
 * NULL when none of the forms fits (or out of memory). */
static const kiln_expr_t *explain(gen_t *G, int64_t a, int64_t b)
{
	for (uint32_t i = 0; i < G->n; i++)
		if (G->sa[i] == a && G->sb[i] == b)
			return sym(G, i);
	if (a <= 0 || b <= 0)
		return NULL;
	for (uint32_t i = 0; i < G->n; i++) { /* k*s */
		if (a % G->sa[i] == 0 && b % G->sb[i] == 0 &&
		    a / G->sa[i] == b / G->sb[i] && !G->all)
			return mulc(G, a / G->sa[i], sym(G, i));
	}
	for (uint32_t i = 0; i < G->n; i++) { /* (k*)s*t */
		for (uint32_t j = i; j < G->n; j++) {
			int64_t pa = G->sa[i] * G->sa[j],
				pb = G->sb[i] * G->sb[j];
			if (a % pa == 0 && b % pb == 0 && a / pa == b / pb &&
			    (!G->all || a == pa))
				return mulc(G, a / pa,
					    ex(G, KILN_EX_MUL, 0, 0, sym(G, i),
					       sym(G, j)));
		}
	}
	if (G->all)
		return NULL;		      /* one sample: only exact forms */
	for (uint32_t i = 0; i < G->n; i++) { /* s + c */
		int64_t c = a - G->sa[i];
		if (b - G->sb[i] == c && c > -65 && c < 65)
			return ex(G, KILN_EX_ADD, 0, 0, sym(G, i),
				  ex(G, KILN_EX_CONST, c, 0, NULL, NULL));
	}
	for (uint32_t i = 0; i < G->n; i++) { /* s // k */
		if (G->sa[i] % a == 0 && G->sb[i] % b == 0 &&
		    G->sa[i] / a == G->sb[i] / b)
			return ex(
			    G, KILN_EX_FLOORDIV, 0, 0, sym(G, i),
			    ex(G, KILN_EX_CONST, G->sa[i] / a, 0, NULL, NULL));
	}
	return NULL;
}

/* Makes a symbol for the input-size pair (a, b) (or finds it). */
static int add_symbol(gen_t *G, int64_t a, int64_t b)
{
	for (uint32_t i = 0; i < G->n; i++)
		if (G->sa[i] == a && G->sb[i] == b)
			return 0;
	if (a < 2 || b < 2)
		return kiln__errf(G->err, G->errlen, KILN_EINVGRAPH,
				  "a size of 0 or 1 varies (%lld vs %lld)",
				  (long long)a, (long long)b);
	if (G->n == MAX_SYMS)
		return kiln__errf(G->err, G->errlen, KILN_ETOOLARGE,
				  "more than %d varying sizes", MAX_SYMS);
	G->sa[G->n] = a;
	G->sb[G->n] = b;
	G->n++;
	return 0;
}

static int gen_dim(gen_t *G, kiln_dim_t *d, kiln_dim_t other, bool input)
{
	(void)input;
	if (d->e != NULL || other.e != NULL)
		return kiln__errf(G->err, G->errlen, KILN_EINVGRAPH,
				  "the graph is already symbolic");
	if (d->c == other.c && !G->all)
		return 0;
	const kiln_expr_t *e = explain(G, d->c, other.c);
	if (e == NULL) {
		if (G->all && d->c == other.c)
			return 0; /* a constant nothing explains */
		return kiln__errf(G->err, G->errlen, KILN_EINVGRAPH,
				  "no expression gives %lld and %lld",
				  (long long)d->c, (long long)other.c);
	}
	d->e = e;
	return 0;
}

static int gen_arg(gen_t *G, kiln_arg_t *x, const kiln_arg_t *y)
{
	if (x->kind != y->kind || (x->kind == KILN_ARG_LIST && x->n != y->n))
		return kiln__errf(G->err, G->errlen, KILN_EINVGRAPH,
				  "argument shapes differ");
	if (x->kind == KILN_ARG_LIST) {
		for (uint32_t i = 0; i < x->n; i++) {
			int rc = gen_arg(G, &x->u.list[i], &y->u.list[i]);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (x->kind != KILN_ARG_INT)
		return 0;
	if (x->u.i == y->u.i && !G->all)
		return 0;
	/* In one-sample mode, only ints that are exactly a symbol's value
	 * (or a product of two) become symbolic: dims, not indices. */
	const kiln_expr_t *e = explain(G, x->u.i, y->u.i);
	if (e == NULL) {
		if (G->all)
			return 0;
		return kiln__errf(G->err, G->errlen, KILN_EINVGRAPH,
				  "no expression gives the argument %lld and "
				  "%lld",
				  (long long)x->u.i, (long long)y->u.i);
	}
	x->kind = KILN_ARG_SYM;
	x->u.sym = e;
	return 0;
}

static int copy_graph(const kiln_graph_t *g, const kiln_limits_t *lim,
		      kiln_graph_t **out, msgpack_sbuffer *sb, char *err,
		      size_t errlen)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	int rc = kiln_graph_pack(g, &pk);
	if (rc == 0)
		rc = kiln_graph_decode((const uint8_t *)sb->data, sb->size, lim,
				       out, err, errlen);
	return rc;
}

int kilnd_graph_clone(const kiln_graph_t *g, const kiln_limits_t *lim,
		      kiln_graph_t **out, char *err, size_t errlen)
{
	msgpack_sbuffer sb;
	int rc = copy_graph(g, lim, out, &sb, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

int kilnd_generalize(const kiln_graph_t *a, const kiln_graph_t *b,
		     const kiln_limits_t *lim, kiln_graph_t **out, char *err,
		     size_t errlen)
{
	*out = NULL;
	if (a->n_symbols > 0 || b->n_symbols > 0)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "the graph is already symbolic");
	if (a->n_values != b->n_values || a->n_nodes != b->n_nodes ||
	    a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
		return kiln__errf(err, errlen, KILN_EINVGRAPH,
				  "the graphs differ in structure");
	msgpack_sbuffer sb;
	kiln_graph_t *c = NULL;
	int rc = copy_graph(a, lim, &c, &sb, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	if (rc < 0)
		return rc;
	gen_t G = {.g = c, .all = a == b, .err = err, .errlen = errlen};
	/* 1. symbols from the inputs' sizes */
	for (uint32_t v = 0; v < c->n_inputs && rc == 0; v++) {
		const kiln_value_t *x = &c->values[v], *y = &b->values[v];
		if (x->kind != KILN_VAL_TENSOR)
			continue;
		if (y->kind != x->kind || y->rank != x->rank) {
			rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
					"input %u differs in rank", v);
			break;
		}
		for (uint32_t d = 0; d < x->rank && rc == 0; d++) {
			int64_t p = x->sizes[d].c, q = y->sizes[d].c;
			if (p != q || (G.all && p >= 2))
				rc = add_symbol(&G, p, q);
		}
	}
	if (rc == 0 && G.n == 0)
		rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
				"no input size varies");
	/* 2. every integer position */
	for (uint32_t v = 0; v < c->n_values && rc == 0; v++) {
		kiln_value_t *x = &c->values[v];
		const kiln_value_t *y = &b->values[v];
		if (x->kind != KILN_VAL_TENSOR)
			continue;
		if (y->kind != x->kind || y->rank != x->rank) {
			rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
					"value %u differs in rank", v);
			break;
		}
		for (uint32_t d = 0; d < x->rank && rc == 0; d++) {
			rc = gen_dim(&G, &x->sizes[d], y->sizes[d],
				     v < c->n_inputs);
			if (rc == 0)
				rc = gen_dim(&G, &x->strides[d], y->strides[d],
					     v < c->n_inputs);
		}
		if (rc == 0 && x->rank > 0)
			x->strides_given = true;
	}
	for (uint32_t i = 0; i < c->n_nodes && rc == 0; i++) {
		kiln_node_t *x = &c->nodes[i];
		const kiln_node_t *y = &b->nodes[i];
		if (x->n_args != y->n_args || x->n_kwargs != y->n_kwargs) {
			rc = kiln__errf(err, errlen, KILN_EINVGRAPH,
					"node %u differs", i);
			break;
		}
		for (uint32_t k = 0; k < x->n_args && rc == 0; k++)
			rc = gen_arg(&G, &x->args[k], &y->args[k]);
		for (uint32_t k = 0; k < x->n_kwargs && rc == 0; k++)
			rc = gen_arg(&G, &x->kwargs[k].val, &y->kwargs[k].val);
	}
	if (rc == 0) {
		kiln_symbol_t *syms =
		    kiln_arena_calloc(c->arena, G.n, sizeof(*syms));
		if (syms == NULL)
			rc = -ENOMEM;
		for (uint32_t i = 0; rc == 0 && i < G.n; i++) {
			char name[16];
			snprintf(name, sizeof(name), "s%u", i);
			syms[i].name =
			    kiln_arena_strndup(c->arena, name, strlen(name));
			syms[i].min = 2;
			syms[i].max = -1;
			syms[i].hint = G.sa[i];
		}
		c->symbols = syms;
		c->n_symbols = G.n;
	}
	if (rc < 0) {
		kiln_graph_free(c);
		return rc;
	}
	/* Round trip through the wire form: validates the result and gives
	 * a graph whose arena holds nothing stale. */
	kiln_graph_t *d = NULL;
	rc = copy_graph(c, lim, &d, &sb, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	kiln_graph_free(c);
	if (rc < 0)
		return rc;
	*out = d;
	return 0;
}

/* Compares one integer position of g with gg's expression. */
static bool same_dim(kiln_dim_t gen, kiln_dim_t d, const int64_t *syms)
{
	int64_t v = gen.c;
	if (gen.e != NULL && kiln_expr_eval(gen.e, syms, &v) < 0)
		return false;
	return d.e == NULL && v == d.c;
}

static bool same_arg(const kiln_arg_t *gen, const kiln_arg_t *x,
		     const int64_t *syms)
{
	if (gen->kind == KILN_ARG_SYM) {
		int64_t v;
		return x->kind == KILN_ARG_INT &&
		       kiln_expr_eval(gen->u.sym, syms, &v) == 0 && v == x->u.i;
	}
	if (gen->kind != x->kind)
		return false;
	switch (gen->kind) {
	case KILN_ARG_INT: return gen->u.i == x->u.i;
	case KILN_ARG_LIST:
		if (gen->n != x->n)
			return false;
		for (uint32_t i = 0; i < gen->n; i++)
			if (!same_arg(&gen->u.list[i], &x->u.list[i], syms))
				return false;
		return true;
	default: return true; /* equal structure hashes: equal otherwise */
	}
}

bool kilnd_instance_of(const kiln_graph_t *gg, const kiln_graph_t *g)
{
	if (g->n_symbols > 0 || gg->n_values != g->n_values ||
	    gg->n_nodes != g->n_nodes || gg->n_inputs != g->n_inputs ||
	    gg->n_symbols > MAX_SYMS)
		return false;
	int64_t syms[MAX_SYMS];
	bool bound[MAX_SYMS] = {false};
	/* Bind each symbol from an input size that is exactly it. */
	for (uint32_t v = 0; v < gg->n_inputs; v++) {
		const kiln_value_t *x = &gg->values[v], *y = &g->values[v];
		if (x->kind != KILN_VAL_TENSOR)
			continue;
		if (y->kind != x->kind || y->rank != x->rank)
			return false;
		for (uint32_t d = 0; d < x->rank; d++) {
			const kiln_expr_t *e = x->sizes[d].e;
			if (e == NULL || e->kind != KILN_EX_SYM)
				continue;
			int64_t val = y->sizes[d].c;
			if (bound[e->sym] && syms[e->sym] != val)
				return false;
			syms[e->sym] = val;
			bound[e->sym] = true;
		}
	}
	for (uint32_t i = 0; i < gg->n_symbols; i++)
		if (!bound[i] || syms[i] < gg->symbols[i].min)
			return false;
	for (uint32_t v = 0; v < gg->n_values; v++) {
		const kiln_value_t *x = &gg->values[v], *y = &g->values[v];
		if (x->kind != KILN_VAL_TENSOR)
			continue;
		if (y->kind != x->kind || y->rank != x->rank ||
		    y->dtype != x->dtype)
			return false;
		for (uint32_t d = 0; d < x->rank; d++)
			if (!same_dim(x->sizes[d], y->sizes[d], syms) ||
			    !same_dim(x->strides[d], y->strides[d], syms))
				return false;
	}
	for (uint32_t i = 0; i < gg->n_nodes; i++) {
		const kiln_node_t *x = &gg->nodes[i], *y = &g->nodes[i];
		if (x->n_args != y->n_args || x->n_kwargs != y->n_kwargs)
			return false;
		for (uint32_t k = 0; k < x->n_args; k++)
			if (!same_arg(&x->args[k], &y->args[k], syms))
				return false;
		for (uint32_t k = 0; k < x->n_kwargs; k++)
			if (!same_arg(&x->kwargs[k].val, &y->kwargs[k].val,
				      syms))
				return false;
	}
	return true;
}
