/*
 * graph.c — Graph v1: decode a msgpack map into kiln_graph_t with full
 * structural validation (GRAPH.md § Validation), and pack it back.
 *
 * Invariants of a decoded graph: every ref names a value defined before its
 * use; every expression names declared symbols only; every tensor value has
 * rank <= lim->max_rank, a known dtype, sizes and strides filled; kwargs are
 * sorted by key and unique. The graph does not point into the msgpack
 * object it came from: everything lives in g->arena.
 *
 * Recursion (args, expressions) is bounded by the msgpack depth limit and
 * max_expr_nodes. Pure functions; any thread.
 */
#include "protocol/internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef kiln__dctx_t dctx_t; /* internal.h; shared with artifact.c */

#define FAIL(c, code, ...) fail_at((c), (code), __VA_ARGS__)

static size_t loc_prefix(const dctx_t *c, char *buf, size_t n)
{
	int w = 0;
	switch (c->loc) {
	case 1: w = snprintf(buf, n, "input %u: ", c->loc_i); break;
	case 2:
		w = c->loc_op ? snprintf(buf, n, "node %u (%.60s): ", c->loc_i,
					 c->loc_op)
			      : snprintf(buf, n, "node %u: ", c->loc_i);
		break;
	case 3:
		w = snprintf(buf, n, "node %u (%.60s): out %u: ", c->loc_i,
			     c->loc_op ? c->loc_op : "?", c->loc_k);
		break;
	case 4: w = snprintf(buf, n, "output %u: ", c->loc_i); break;
	default:
		if (c->where[0] != '\0')
			w = snprintf(buf, n, "%s: ", c->where);
		break;
	}
	if (w < 0)
		return 0;
	return (size_t)w >= n ? n - 1 : (size_t)w;
}

__attribute__((format(printf, 3, 4))) static int fail_at(dctx_t *c, int code,
							 const char *fmt, ...)
{
	if (c->err != NULL && c->errlen > 0) {
		size_t n = loc_prefix(c, c->err, c->errlen);
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - n, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* What is being decoded ("size 2", "arg 1[3]", "kwarg \"dim\""), as a
 * chain formatted only on failure. */
typedef struct wpath {
	const struct wpath *up;
	const char *s;
	int32_t i;
	uint8_t kind; /* 0: s; 1: "s i"; 2: up "[i]"; 3: kwarg "s" */
} wpath_t;

static size_t wp_fmt(const wpath_t *w, char *buf, size_t n)
{
	size_t k = 0;
	if (w->up != NULL)
		k = wp_fmt(w->up, buf, n);
	int r = 0;
	switch (w->kind) {
	case 0: r = snprintf(buf + k, n - k, "%s", w->s); break;
	case 1: r = snprintf(buf + k, n - k, "%s %d", w->s, w->i); break;
	case 2: r = snprintf(buf + k, n - k, "[%d]", w->i); break;
	default: r = snprintf(buf + k, n - k, "kwarg \"%.64s\"", w->s); break;
	}
	if (r < 0)
		return k;
	k += (size_t)r;
	return k >= n ? n - 1 : k;
}

/* fail_at with the path's text first: "<what><msg>". */
__attribute__((format(printf, 4, 5))) static int
wfail(dctx_t *c, int code, const wpath_t *wp, const char *fmt, ...)
{
	char what[192], msg[320];
	wp_fmt(wp, what, sizeof(what));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return fail_at(c, code, "%s%s", what, msg);
}

static const char *type_name(const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "int";
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: return "float";
	case MSGPACK_OBJECT_STR: return "str";
	case MSGPACK_OBJECT_ARRAY: return "array";
	case MSGPACK_OBJECT_MAP: return "map";
	case MSGPACK_OBJECT_BIN: return "bin";
	case MSGPACK_OBJECT_EXT: return "ext";
	}
	return "?";
}

/* Reads an int64 from an int object; 0, or 1 when it is not an int64. */
static int get_i64(const msgpack_object *o, int64_t *v)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (o->via.u64 > (uint64_t)INT64_MAX)
			return 1;
		*v = (int64_t)o->via.u64;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*v = o->via.i64;
		return 0;
	}
	return 1;
}

static bool valid_ident(const char *s, size_t n)
{
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		bool ok = (ch >= 'a' && ch <= 'z') ||
			  (ch >= 'A' && ch <= 'Z') || ch == '_' ||
			  (i > 0 && ch >= '0' && ch <= '9');
		if (!ok)
			return false;
	}
	return true;
}

/* namespace.name(.overload)+ : lower-case namespace, identifiers after. */
static bool valid_op_name(const char *s, size_t n)
{
	size_t i = 0, parts = 0;
	while (i < n) {
		size_t b = i;
		while (i < n && s[i] != '.')
			i++;
		if (i == b)
			return false;
		if (parts == 0) {
			for (size_t k = b; k < i; k++) {
				char ch = s[k];
				if (!((ch >= 'a' && ch <= 'z') || ch == '_' ||
				      (k > b && ch >= '0' && ch <= '9')))
					return false;
			}
		} else if (!valid_ident(s + b, i - b)) {
			return false;
		}
		parts++;
		if (i < n) {
			i++; /* the dot */
			if (i == n)
				return false;
		}
	}
	return parts >= 2;
}

/* Parses an expression from a str or int object. */
static int parse_dimlike(dctx_t *c, const msgpack_object *o, const wpath_t *wp,
			 kiln_dim_t *out, bool nonneg)
{
	int64_t v;
	if (get_i64(o, &v) == 0) {
		if (nonneg && v < 0)
			return wfail(c, KILN_EINVGRAPH, wp,
				     " is negative (%lld)", (long long)v);
		out->c = v;
		out->e = NULL;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_STR) {
		const kiln_expr_t *e;
		char sub[256];
		int rc =
		    kiln__expr_parse(&c->ex, o->via.str.ptr, o->via.str.size,
				     &e, sub, sizeof(sub));
		if (rc != 0)
			return rc == -ENOMEM ? rc
					     : wfail(c, rc, wp, ": %s", sub);
		if (e->kind == KILN_EX_CONST) {
			if (nonneg && e->c < 0)
				return wfail(c, KILN_EINVGRAPH, wp,
					     " is negative (%lld)",
					     (long long)e->c);
			out->c = e->c;
			out->e = NULL;
		} else {
			out->c = 0;
			out->e = e;
		}
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		return wfail(c, KILN_EINVGRAPH, wp, " out of range");
	return wfail(c, KILN_EINVGRAPH, wp,
		     " must be an int or an expression string, not %s",
		     type_name(o));
}

static int parse_expr_obj(dctx_t *c, const msgpack_object *o, const wpath_t *wp,
			  const kiln_expr_t **out)
{
	kiln_dim_t d;
	int rc = parse_dimlike(c, o, wp, &d, false);
	if (rc != 0)
		return rc;
	if (d.e == NULL) {
		d.e = kiln__expr_new(c->g->arena, KILN_EX_CONST, d.c, 0, NULL,
				     NULL);
		if (d.e == NULL)
			return -ENOMEM;
	}
	*out = d.e;
	return 0;
}

static int mul_dim(dctx_t *c, kiln_dim_t a, kiln_dim_t b, kiln_dim_t *out)
{
	if (a.e == NULL && b.e == NULL) {
		if (__builtin_mul_overflow(a.c, b.c, &out->c))
			return FAIL(c, KILN_EINVGRAPH,
				    "contiguous stride overflows int64");
		out->e = NULL;
		return 0;
	}
	kiln_arena_t *ar = c->g->arena;
	const kiln_expr_t *x = a.e, *y = b.e;
	if (x == NULL && a.c == 1) {
		*out = b;
		return 0;
	}
	if (y == NULL && b.c == 1) {
		*out = a;
		return 0;
	}
	if (x == NULL)
		x = kiln__expr_new(ar, KILN_EX_CONST, a.c, 0, NULL, NULL);
	if (y == NULL)
		y = kiln__expr_new(ar, KILN_EX_CONST, b.c, 0, NULL, NULL);
	if (x == NULL || y == NULL)
		return -ENOMEM;
	if (y->kind == KILN_EX_CONST && x->kind != KILN_EX_CONST) {
		const kiln_expr_t *t = x;
		x = y;
		y = t;
	}
	out->c = 0;
	out->e = kiln__expr_new(ar, KILN_EX_MUL, 0, 0, x, y);
	return out->e ? 0 : -ENOMEM;
}

static int parse_spec(dctx_t *c, const msgpack_object *o, kiln_value_t *v)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return FAIL(c, KILN_EINVGRAPH, "spec must be a map, not %s",
			    type_name(o));
	const msgpack_object *dt = kiln_map_get(o, "dtype");
	const msgpack_object *shape = kiln_map_get(o, "shape");
	const msgpack_object *strides = kiln_map_get(o, "strides");
	if (dt == NULL || dt->type != MSGPACK_OBJECT_STR)
		return FAIL(c, KILN_EINVGRAPH, "spec needs a string \"dtype\"");
	int d = kiln_dtype_from_name(dt->via.str.ptr, dt->via.str.size);
	if (d < 0)
		return FAIL(
		    c, KILN_EINVGRAPH, "unknown dtype \"%.*s\"",
		    (int)(dt->via.str.size > 32 ? 32 : dt->via.str.size),
		    dt->via.str.ptr);
	if (shape == NULL || shape->type != MSGPACK_OBJECT_ARRAY)
		return FAIL(c, KILN_EINVGRAPH, "spec needs a \"shape\" array");
	uint32_t rank = shape->via.array.size;
	uint32_t max_rank = c->lim->max_rank > KILN_MAX_RANK_HARD
				? KILN_MAX_RANK_HARD
				: c->lim->max_rank;
	if (rank > max_rank)
		return FAIL(c, KILN_EINVGRAPH, "rank %u exceeds the limit %u",
			    rank, max_rank);
	if (strides != NULL && strides->type != MSGPACK_OBJECT_NIL &&
	    (strides->type != MSGPACK_OBJECT_ARRAY ||
	     strides->via.array.size != rank))
		return FAIL(c, KILN_EINVGRAPH,
			    "\"strides\" must be an array of %u entries", rank);
	v->kind = KILN_VAL_TENSOR;
	v->dtype = (kiln_dtype_t)d;
	v->rank = rank;
	v->sizes =
	    kiln_arena_calloc(c->g->arena, rank ? rank : 1, sizeof(kiln_dim_t));
	v->strides =
	    kiln_arena_calloc(c->g->arena, rank ? rank : 1, sizeof(kiln_dim_t));
	if (v->sizes == NULL || v->strides == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < rank; i++) {
		wpath_t wp = {NULL, "size", (int32_t)i, 1};
		int rc = parse_dimlike(c, &shape->via.array.ptr[i], &wp,
				       &v->sizes[i], true);
		if (rc != 0)
			return rc;
	}
	v->strides_given =
	    strides != NULL && strides->type != MSGPACK_OBJECT_NIL;
	if (v->strides_given) {
		for (uint32_t i = 0; i < rank; i++) {
			wpath_t wp = {NULL, "stride", (int32_t)i, 1};
			int rc = parse_dimlike(c, &strides->via.array.ptr[i],
					       &wp, &v->strides[i], true);
			if (rc != 0)
				return rc;
		}
	} else if (rank > 0) {
		kiln_dim_t s = {1, NULL};
		for (uint32_t i = rank; i-- > 0;) {
			v->strides[i] = s;
			if (i == 0)
				break; /* the element count is not a stride */
			kiln_dim_t sz = v->sizes[i];
			if (sz.e == NULL && sz.c == 0)
				sz.c = 1; /* torch: max(size, 1) */
			int rc = mul_dim(c, s, sz, &s);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

static int parse_arg(dctx_t *c, const msgpack_object *o, uint32_t n_defined,
		     kiln_arg_t *a, const wpath_t *wp)
{
	int64_t v;
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: a->kind = KILN_ARG_NIL; return 0;
	case MSGPACK_OBJECT_BOOLEAN:
		a->kind = KILN_ARG_BOOL;
		a->u.b = o->via.boolean;
		return 0;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		if (get_i64(o, &v) != 0)
			return wfail(c, KILN_EINVGRAPH, wp,
				     ": integer out of int64 range");
		a->kind = KILN_ARG_INT;
		a->u.i = v;
		return 0;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		if (isnan(o->via.f64))
			return wfail(c, KILN_EINVGRAPH, wp,
				     ": NaN is not allowed as an argument");
		a->kind = KILN_ARG_FLOAT;
		a->u.f = o->via.f64;
		return 0;
	case MSGPACK_OBJECT_STR:
		if (o->via.str.size > c->lim->max_str_bytes)
			return wfail(c, KILN_EINVGRAPH, wp,
				     ": string longer than %u bytes",
				     c->lim->max_str_bytes);
		a->kind = KILN_ARG_STR;
		a->n = o->via.str.size;
		a->u.s = kiln_arena_strndup(c->g->arena, o->via.str.ptr,
					    o->via.str.size);
		return a->u.s ? 0 : -ENOMEM;
	case MSGPACK_OBJECT_ARRAY: {
		a->kind = KILN_ARG_LIST;
		a->n = o->via.array.size;
		a->u.list = kiln_arena_calloc(c->g->arena, a->n ? a->n : 1,
					      sizeof(kiln_arg_t));
		if (a->u.list == NULL)
			return -ENOMEM;
		for (uint32_t i = 0; i < a->n; i++) {
			wpath_t sub = {wp, NULL, (int32_t)i, 2};
			int rc = parse_arg(c, &o->via.array.ptr[i], n_defined,
					   &a->u.list[i], &sub);
			if (rc != 0)
				return rc;
		}
		return 0;
	}
	case MSGPACK_OBJECT_MAP: {
		const msgpack_object *ref = kiln_map_get(o, "ref");
		const msgpack_object *sym = kiln_map_get(o, "sym");
		if (o->via.map.size == 1 && ref != NULL) {
			if (get_i64(ref, &v) != 0 || v < 0)
				return wfail(c, KILN_EINVGRAPH, wp,
					     ": ref must be a non-negative "
					     "int");
			if ((uint64_t)v >= n_defined)
				return wfail(c, KILN_EINVGRAPH, wp,
					     ": ref %lld is not defined "
					     "before this node",
					     (long long)v);
			a->kind = KILN_ARG_REF;
			a->u.ref = (uint32_t)v;
			return 0;
		}
		if (o->via.map.size == 1 && sym != NULL) {
			a->kind = KILN_ARG_SYM;
			return parse_expr_obj(c, sym, wp, &a->u.sym);
		}
		return wfail(c, KILN_EINVGRAPH, wp,
			     ": a map argument must be {\"ref\": v} or "
			     "{\"sym\": expr}");
	}
	default:
		return wfail(c, KILN_EINVGRAPH, wp,
			     ": %s is not a valid argument", type_name(o));
	}
}

static int kwarg_cmp(const void *x, const void *y)
{
	const kiln_kwarg_t *a = x, *b = y;
	return strcmp(a->key, b->key);
}

static int parse_symbols(dctx_t *c, const msgpack_object *syms)
{
	kiln_graph_t *g = c->g;
	if (syms == NULL || syms->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (syms->type != MSGPACK_OBJECT_MAP)
		return FAIL(c, KILN_EINVGRAPH, "\"symbols\" must be a map");
	uint32_t n = syms->via.map.size;
	if (n > c->lim->max_symbols)
		return FAIL(c, KILN_ETOOLARGE, "%u symbols exceed the limit %u",
			    n, c->lim->max_symbols);
	g->symbols =
	    kiln_arena_calloc(g->arena, n ? n : 1, sizeof(kiln_symbol_t));
	if (g->symbols == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *k = &syms->via.map.ptr[i].key;
		const msgpack_object *v = &syms->via.map.ptr[i].val;
		if (k->type != MSGPACK_OBJECT_STR ||
		    !valid_ident(k->via.str.ptr, k->via.str.size) ||
		    k->via.str.size > 64 ||
		    (k->via.str.size == 3 &&
		     (memcmp(k->via.str.ptr, "min", 3) == 0 ||
		      memcmp(k->via.str.ptr, "max", 3) == 0)))
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol %u: invalid symbol name", i);
		if (kiln__sym_find(g->symbols, g->n_symbols, k->via.str.ptr,
				   k->via.str.size) >= 0)
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol \"%.*s\" declared twice",
				    (int)k->via.str.size, k->via.str.ptr);
		kiln_symbol_t *s = &g->symbols[i];
		s->name = kiln_arena_strndup(g->arena, k->via.str.ptr,
					     k->via.str.size);
		if (s->name == NULL)
			return -ENOMEM;
		s->min = 0;
		s->max = -1;
		s->hint = -1;
		if (v->type != MSGPACK_OBJECT_MAP)
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol \"%s\": constraints must be a map",
				    s->name);
		const msgpack_object *mn = kiln_map_get(v, "min");
		const msgpack_object *mx = kiln_map_get(v, "max");
		const msgpack_object *hint = kiln_map_get(v, "hint");
		if (mn != NULL && mn->type != MSGPACK_OBJECT_NIL &&
		    (get_i64(mn, &s->min) != 0 || s->min < 0))
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol \"%s\": \"min\" must be an "
				    "integer >= 0",
				    s->name);
		if (mx != NULL && mx->type != MSGPACK_OBJECT_NIL &&
		    (get_i64(mx, &s->max) != 0 || s->max < s->min))
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol \"%s\": \"max\" must be nil or an "
				    "integer >= min",
				    s->name);
		if (hint != NULL && hint->type != MSGPACK_OBJECT_NIL &&
		    (get_i64(hint, &s->hint) != 0 || s->hint < s->min ||
		     (s->max >= 0 && s->hint > s->max)))
			return FAIL(c, KILN_EINVGRAPH,
				    "symbol \"%s\": \"hint\" must be an "
				    "integer within [min, max]",
				    s->name);
		g->n_symbols++;
	}
	c->ex.syms = g->symbols;
	c->ex.n_syms = g->n_symbols;
	return 0;
}

static int decode(dctx_t *c, const msgpack_object *m)
{
	kiln_graph_t *g = c->g;
	const kiln_limits_t *lim = c->lim;
	if (m->type != MSGPACK_OBJECT_MAP)
		return FAIL(c, KILN_EINVGRAPH, "graph must be a map, not %s",
			    type_name(m));
	const msgpack_object *fmt = kiln_map_get(m, "format");
	if (fmt == NULL)
		return FAIL(c, KILN_EINVGRAPH, "missing \"format\"");
	if (!kiln_obj_streq(fmt, "kiln.graph/1"))
		return FAIL(c, KILN_EINVGRAPH,
			    "\"format\" must be \"kiln.graph/1\"");
	const msgpack_object *inputs = kiln_map_get(m, "inputs");
	const msgpack_object *nodes = kiln_map_get(m, "nodes");
	const msgpack_object *outputs = kiln_map_get(m, "outputs");
	if (inputs == NULL || inputs->type != MSGPACK_OBJECT_ARRAY)
		return FAIL(c, KILN_EINVGRAPH, "missing \"inputs\" array");
	if (nodes == NULL || nodes->type != MSGPACK_OBJECT_ARRAY)
		return FAIL(c, KILN_EINVGRAPH, "missing \"nodes\" array");
	if (outputs == NULL || outputs->type != MSGPACK_OBJECT_ARRAY)
		return FAIL(c, KILN_EINVGRAPH, "missing \"outputs\" array");
	int rc = parse_symbols(c, kiln_map_get(m, "symbols"));
	if (rc != 0)
		return rc;

	uint32_t n_nodes = nodes->via.array.size;
	if (n_nodes > lim->max_nodes)
		return FAIL(c, KILN_ETOOLARGE, "%u nodes exceed the limit %u",
			    n_nodes, lim->max_nodes);
	uint64_t n_values = inputs->via.array.size;
	for (uint32_t i = 0; i < n_nodes; i++) {
		const msgpack_object *out =
		    kiln_map_get(&nodes->via.array.ptr[i], "out");
		if (out != NULL && out->type == MSGPACK_OBJECT_ARRAY)
			n_values += out->via.array.size;
	}
	if (n_values > lim->max_values)
		return FAIL(c, KILN_ETOOLARGE,
			    "%llu values exceed the limit %u",
			    (unsigned long long)n_values, lim->max_values);
	g->n_inputs = inputs->via.array.size;
	g->n_nodes = n_nodes;
	g->values = kiln_arena_calloc(g->arena, n_values ? n_values : 1,
				      sizeof(kiln_value_t));
	g->nodes = kiln_arena_calloc(g->arena, n_nodes ? n_nodes : 1,
				     sizeof(kiln_node_t));
	if (g->values == NULL || g->nodes == NULL)
		return -ENOMEM;

	for (uint32_t i = 0; i < g->n_inputs; i++) {
		const msgpack_object *in = &inputs->via.array.ptr[i];
		kiln_value_t *v = &g->values[i];
		c->loc = 1;
		c->loc_i = i;
		v->producer = -1;
		const msgpack_object *sym = kiln_map_get(in, "sym");
		if (sym != NULL) {
			v->kind = KILN_VAL_SYMINT;
			wpath_t wp = {NULL, "sym", 0, 0};
			rc = parse_expr_obj(c, sym, &wp, &v->sym);
		} else {
			rc = parse_spec(c, in, v);
		}
		if (rc != 0)
			return rc;
	}
	uint32_t next = g->n_inputs;
	for (uint32_t i = 0; i < n_nodes; i++) {
		const msgpack_object *no = &nodes->via.array.ptr[i];
		kiln_node_t *nd = &g->nodes[i];
		c->loc = 2;
		c->loc_i = i;
		c->loc_op = NULL;
		if (no->type != MSGPACK_OBJECT_MAP)
			return FAIL(c, KILN_EINVGRAPH, "node must be a map");
		const msgpack_object *op = kiln_map_get(no, "op");
		if (op == NULL || op->type != MSGPACK_OBJECT_STR)
			return FAIL(c, KILN_EINVGRAPH, "missing string \"op\"");
		if (op->via.str.size > lim->max_str_bytes ||
		    !valid_op_name(op->via.str.ptr, op->via.str.size))
			return FAIL(
			    c, KILN_EINVGRAPH, "malformed op name \"%.*s\"",
			    (int)(op->via.str.size > 64 ? 64
							: op->via.str.size),
			    op->via.str.ptr);
		nd->op = kiln_arena_strndup(g->arena, op->via.str.ptr,
					    op->via.str.size);
		if (nd->op == NULL)
			return -ENOMEM;
		c->loc_op = nd->op;
		const msgpack_object *args = kiln_map_get(no, "args");
		const msgpack_object *kwargs = kiln_map_get(no, "kwargs");
		const msgpack_object *out = kiln_map_get(no, "out");
		if (args != NULL && args->type != MSGPACK_OBJECT_NIL &&
		    args->type != MSGPACK_OBJECT_ARRAY)
			return FAIL(c, KILN_EINVGRAPH,
				    "\"args\" must be an array");
		if (kwargs != NULL && kwargs->type != MSGPACK_OBJECT_NIL &&
		    kwargs->type != MSGPACK_OBJECT_MAP)
			return FAIL(c, KILN_EINVGRAPH,
				    "\"kwargs\" must be a map");
		if (out == NULL || out->type != MSGPACK_OBJECT_ARRAY)
			return FAIL(c, KILN_EINVGRAPH, "missing \"out\" array");
		if (args != NULL && args->type == MSGPACK_OBJECT_ARRAY) {
			nd->n_args = args->via.array.size;
			nd->args = kiln_arena_calloc(
			    g->arena, nd->n_args ? nd->n_args : 1,
			    sizeof(kiln_arg_t));
			if (nd->args == NULL)
				return -ENOMEM;
			for (uint32_t k = 0; k < nd->n_args; k++) {
				wpath_t wp = {NULL, "arg", (int32_t)k, 1};
				rc = parse_arg(c, &args->via.array.ptr[k], next,
					       &nd->args[k], &wp);
				if (rc != 0)
					return rc;
			}
		}
		if (kwargs != NULL && kwargs->type == MSGPACK_OBJECT_MAP) {
			nd->n_kwargs = kwargs->via.map.size;
			nd->kwargs = kiln_arena_calloc(
			    g->arena, nd->n_kwargs ? nd->n_kwargs : 1,
			    sizeof(kiln_kwarg_t));
			if (nd->kwargs == NULL)
				return -ENOMEM;
			for (uint32_t k = 0; k < nd->n_kwargs; k++) {
				const msgpack_object *key =
				    &kwargs->via.map.ptr[k].key;
				if (key->type != MSGPACK_OBJECT_STR ||
				    !valid_ident(key->via.str.ptr,
						 key->via.str.size) ||
				    key->via.str.size > 128)
					return FAIL(c, KILN_EINVGRAPH,
						    "kwarg %u: key must be an "
						    "identifier string",
						    k);
				nd->kwargs[k].key = kiln_arena_strndup(
				    g->arena, key->via.str.ptr,
				    key->via.str.size);
				if (nd->kwargs[k].key == NULL)
					return -ENOMEM;
				wpath_t wp = {NULL, nd->kwargs[k].key, 0, 3};
				rc = parse_arg(c, &kwargs->via.map.ptr[k].val,
					       next, &nd->kwargs[k].val, &wp);
				if (rc != 0)
					return rc;
			}
			qsort(nd->kwargs, nd->n_kwargs, sizeof(kiln_kwarg_t),
			      kwarg_cmp);
			for (uint32_t k = 1; k < nd->n_kwargs; k++)
				if (strcmp(nd->kwargs[k - 1].key,
					   nd->kwargs[k].key) == 0)
					return FAIL(c, KILN_EINVGRAPH,
						    "kwarg \"%s\" given twice",
						    nd->kwargs[k].key);
		}
		nd->n_out = out->via.array.size;
		nd->out_first = next;
		for (uint32_t k = 0; k < nd->n_out; k++) {
			kiln_value_t *v = &g->values[next + k];
			v->producer = (int32_t)i;
			c->loc = 3;
			c->loc_k = k;
			rc = parse_spec(c, &out->via.array.ptr[k], v);
			c->loc = 2;
			if (rc != 0)
				return rc;
		}
		next += nd->n_out;
	}
	g->n_values = next;

	g->n_outputs = outputs->via.array.size;
	g->outputs = kiln_arena_calloc(
	    g->arena, g->n_outputs ? g->n_outputs : 1, sizeof(kiln_arg_t));
	if (g->outputs == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->n_outputs; i++) {
		const msgpack_object *o = &outputs->via.array.ptr[i];
		c->loc = 4;
		c->loc_i = i;
		if (o->type != MSGPACK_OBJECT_MAP)
			return FAIL(c, KILN_EINVGRAPH,
				    "must be {\"ref\": v} or {\"sym\": expr}");
		wpath_t wp = {NULL, "output", 0, 0};
		rc = parse_arg(c, o, g->n_values, &g->outputs[i], &wp);
		if (rc != 0)
			return rc;
	}
	c->where[0] = '\0';
	c->loc = 0;
	return 0;
}

int kiln_graph_from_object(const msgpack_object *map, const kiln_limits_t *lim,
			   kiln_graph_t **out, char *err, size_t errlen)
{
	kiln_limits_t deflim;
	if (lim == NULL) {
		kiln_limits_default(&deflim);
		lim = &deflim;
	}
	*out = NULL;
	kiln_arena_t *arena = kiln_arena_new(16384);
	if (arena == NULL)
		return -ENOMEM;
	kiln_graph_t *g = kiln_arena_calloc(arena, 1, sizeof(*g));
	if (g == NULL) {
		kiln_arena_free(arena);
		return -ENOMEM;
	}
	g->arena = arena;
	dctx_t c = {.lim = lim, .g = g, .err = err, .errlen = errlen};
	c.ex.arena = arena;
	c.ex.max_nodes = lim->max_expr_nodes;
	int rc = decode(&c, map);
	if (rc != 0) {
		if (rc == -ENOMEM)
			kiln__errf(err, errlen, rc,
				   "out of memory decoding "
				   "the graph");
		kiln_arena_free(arena);
		return rc;
	}
	*out = g;
	return 0;
}

int kiln_graph_decode(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		      kiln_graph_t **out, char *err, size_t errlen)
{
	kiln_limits_t deflim;
	if (lim == NULL) {
		kiln_limits_default(&deflim);
		lim = &deflim;
	}
	*out = NULL;
	msgpack_zone zone;
	if (!msgpack_zone_init(&zone, 65536))
		return -ENOMEM;
	msgpack_object obj;
	int rc = kiln_msgpack_unpack_map(p, n, lim, &zone, &obj, err, errlen);
	if (rc == 0)
		rc = kiln_graph_from_object(&obj, lim, out, err, errlen);
	msgpack_zone_destroy(&zone);
	return rc;
}

void kiln_graph_free(kiln_graph_t *g)
{
	if (g != NULL)
		kiln_arena_free(g->arena);
}

/* ---- packing ------------------------------------------------------------ */

static int pack_dim(const kiln_graph_t *g, msgpack_packer *pk, kiln_dim_t d)
{
	if (d.e == NULL)
		return msgpack_pack_int64(pk, d.c);
	char small[256];
	int n = kiln_expr_format(g, d.e, small, sizeof(small));
	if (n < 0)
		return -1;
	if ((size_t)n < sizeof(small))
		return msgpack_pack_str_with_body(pk, small, (size_t)n);
	char *big = malloc((size_t)n + 1);
	if (big == NULL)
		return -1;
	kiln_expr_format(g, d.e, big, (size_t)n + 1);
	int rc = msgpack_pack_str_with_body(pk, big, (size_t)n);
	free(big);
	return rc;
}

static int pack_expr_str(const kiln_graph_t *g, msgpack_packer *pk,
			 const kiln_expr_t *e)
{
	kiln_dim_t d = {0, e};
	if (e->kind == KILN_EX_CONST)
		d.e = NULL, d.c = e->c;
	return pack_dim(g, pk, d);
}

static int pack_spec(const kiln_graph_t *g, msgpack_packer *pk,
		     const kiln_value_t *v)
{
	if (v->kind == KILN_VAL_SYMINT) {
		int rc = msgpack_pack_map(pk, 1);
		rc |= kiln_pack_cstr(pk, "sym");
		rc |= pack_expr_str(g, pk, v->sym);
		return rc;
	}
	int rc = msgpack_pack_map(pk, v->strides_given ? 3 : 2);
	rc |= kiln_pack_cstr(pk, "dtype");
	rc |= kiln_pack_cstr(pk, kiln_dtype_name(v->dtype));
	rc |= kiln_pack_cstr(pk, "shape");
	rc |= msgpack_pack_array(pk, v->rank);
	for (uint32_t i = 0; i < v->rank; i++)
		rc |= pack_dim(g, pk, v->sizes[i]);
	if (v->strides_given) {
		rc |= kiln_pack_cstr(pk, "strides");
		rc |= msgpack_pack_array(pk, v->rank);
		for (uint32_t i = 0; i < v->rank; i++)
			rc |= pack_dim(g, pk, v->strides[i]);
	}
	return rc;
}

static int pack_arg(const kiln_graph_t *g, msgpack_packer *pk,
		    const kiln_arg_t *a)
{
	int rc = 0;
	switch (a->kind) {
	case KILN_ARG_NIL: return msgpack_pack_nil(pk);
	case KILN_ARG_BOOL:
		return a->u.b ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
	case KILN_ARG_INT: return msgpack_pack_int64(pk, a->u.i);
	case KILN_ARG_FLOAT: return msgpack_pack_double(pk, a->u.f);
	case KILN_ARG_STR: return msgpack_pack_str_with_body(pk, a->u.s, a->n);
	case KILN_ARG_LIST:
		rc = msgpack_pack_array(pk, a->n);
		for (uint32_t i = 0; i < a->n; i++)
			rc |= pack_arg(g, pk, &a->u.list[i]);
		return rc;
	case KILN_ARG_REF:
		rc = msgpack_pack_map(pk, 1);
		rc |= kiln_pack_cstr(pk, "ref");
		rc |= msgpack_pack_uint32(pk, a->u.ref);
		return rc;
	case KILN_ARG_SYM:
		rc = msgpack_pack_map(pk, 1);
		rc |= kiln_pack_cstr(pk, "sym");
		rc |= pack_expr_str(g, pk, a->u.sym);
		return rc;
	}
	return -1;
}

int kiln_graph_pack(const kiln_graph_t *g, msgpack_packer *pk)
{
	int rc = msgpack_pack_map(pk, 5);
	rc |= kiln_pack_cstr(pk, "format");
	rc |= kiln_pack_cstr(pk, "kiln.graph/1");
	rc |= kiln_pack_cstr(pk, "symbols");
	rc |= kiln__pack_symbols(pk, g->symbols, g->n_symbols);
	rc |= kiln_pack_cstr(pk, "inputs");
	rc |= msgpack_pack_array(pk, g->n_inputs);
	for (uint32_t i = 0; i < g->n_inputs; i++)
		rc |= pack_spec(g, pk, &g->values[i]);
	rc |= kiln_pack_cstr(pk, "nodes");
	rc |= msgpack_pack_array(pk, g->n_nodes);
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const kiln_node_t *n = &g->nodes[i];
		rc |= msgpack_pack_map(pk, 4);
		rc |= kiln_pack_cstr(pk, "op");
		rc |= kiln_pack_cstr(pk, n->op);
		rc |= kiln_pack_cstr(pk, "args");
		rc |= msgpack_pack_array(pk, n->n_args);
		for (uint32_t k = 0; k < n->n_args; k++)
			rc |= pack_arg(g, pk, &n->args[k]);
		rc |= kiln_pack_cstr(pk, "kwargs");
		rc |= msgpack_pack_map(pk, n->n_kwargs);
		for (uint32_t k = 0; k < n->n_kwargs; k++) {
			rc |= kiln_pack_cstr(pk, n->kwargs[k].key);
			rc |= pack_arg(g, pk, &n->kwargs[k].val);
		}
		rc |= kiln_pack_cstr(pk, "out");
		rc |= msgpack_pack_array(pk, n->n_out);
		for (uint32_t k = 0; k < n->n_out; k++)
			rc |= pack_spec(g, pk, &g->values[n->out_first + k]);
	}
	rc |= kiln_pack_cstr(pk, "outputs");
	rc |= msgpack_pack_array(pk, g->n_outputs);
	for (uint32_t i = 0; i < g->n_outputs; i++)
		rc |= pack_arg(g, pk, &g->outputs[i]);
	return rc ? -ENOMEM : 0;
}

/* ---- shared with artifact.c (declared in internal.h) -------------------- */

bool kiln__valid_ident(const char *s, size_t n)
{
	return valid_ident(s, n);
}

bool kiln__valid_op_name(const char *s, size_t n)
{
	return valid_op_name(s, n);
}

/* The "symbols" map of a graph or an artifact: name -> {min, max, hint}. */
int kiln__pack_symbols(msgpack_packer *pk, const kiln_symbol_t *syms,
		       uint32_t n)
{
	int rc = msgpack_pack_map(pk, n);
	for (uint32_t i = 0; i < n; i++) {
		const kiln_symbol_t *s = &syms[i];
		rc |= kiln_pack_cstr(pk, s->name);
		rc |= msgpack_pack_map(pk, s->hint >= 0 ? 3 : 2);
		rc |= kiln_pack_cstr(pk, "min");
		rc |= msgpack_pack_int64(pk, s->min);
		rc |= kiln_pack_cstr(pk, "max");
		rc |= s->max >= 0 ? msgpack_pack_int64(pk, s->max)
				  : msgpack_pack_nil(pk);
		if (s->hint >= 0) {
			rc |= kiln_pack_cstr(pk, "hint");
			rc |= msgpack_pack_int64(pk, s->hint);
		}
	}
	return rc;
}

int kiln__graph_parse_symbols(kiln__dctx_t *c, const msgpack_object *syms)
{
	return parse_symbols(c, syms);
}

int kiln__graph_parse_spec(kiln__dctx_t *c, const msgpack_object *o,
			   kiln_value_t *v)
{
	return parse_spec(c, o, v);
}

int kiln__graph_parse_dim(kiln__dctx_t *c, const msgpack_object *o,
			  const char *what, kiln_dim_t *out, bool nonneg)
{
	wpath_t wp = {NULL, what, 0, 0};
	return parse_dimlike(c, o, &wp, out, nonneg);
}

int kiln__graph_parse_expr(kiln__dctx_t *c, const msgpack_object *o,
			   const char *what, const kiln_expr_t **out)
{
	wpath_t wp = {NULL, what, 0, 0};
	return parse_expr_obj(c, o, &wp, out);
}

int kiln__graph_parse_arg(kiln__dctx_t *c, const msgpack_object *o,
			  uint32_t n_defined, kiln_arg_t *a, const char *what)
{
	wpath_t wp = {NULL, what, 0, 0};
	return parse_arg(c, o, n_defined, a, &wp);
}

int kiln__graph_pack_dim(const kiln_graph_t *g, msgpack_packer *pk,
			 kiln_dim_t d)
{
	return pack_dim(g, pk, d);
}

int kiln__graph_pack_expr(const kiln_graph_t *g, msgpack_packer *pk,
			  const kiln_expr_t *e)
{
	return pack_expr_str(g, pk, e);
}

int kiln__graph_pack_spec(const kiln_graph_t *g, msgpack_packer *pk,
			  const kiln_value_t *v)
{
	return pack_spec(g, pk, v);
}

int kiln__graph_pack_arg(const kiln_graph_t *g, msgpack_packer *pk,
			 const kiln_arg_t *a)
{
	return pack_arg(g, pk, a);
}
