/*
 * artifact.c — kiln.artifact/1: pack a kiln_artifact_t as one msgpack map,
 * and decode untrusted bytes back into one with full structural validation
 * (ARTIFACT.md § Validation).
 *
 * Invariants of a decoded artifact: every table index (kernel, buffer, view,
 * input, output buffer, binding target, fallback ref) is in range; a kernel
 * step passes exactly its kernel's n_bufs buffers; every output buffer index
 * is described by exactly one buffer; every expression names declared
 * symbols only; every symbol is bound to an input size or int input whose
 * spec is exactly that symbol; outputs never view the scratch arena. What
 * only the symbol values can decide (arena offsets and sizes that are
 * expressions, view bounds) is checked by the runtime at run time.
 *
 * The artifact does not point into the bytes it came from: everything,
 * the code included, lives in a->arena. Specs, symbols, expressions and
 * fallback args use Graph v1's encoding and graph.c's decoders
 * (internal.h). Pure functions; any thread.
 */
#include "protocol/internal.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef kiln__dctx_t dctx_t;

#define KILN__KERNEL_NAME_MAX 255

__attribute__((format(printf, 3, 4))) static int fail(dctx_t *c, int code,
						      const char *fmt, ...)
{
	if (c->err != NULL && c->errlen > 0) {
		size_t n = 0;
		if (c->where[0] != '\0') {
			int w = snprintf(c->err, c->errlen, "%s: ", c->where);
			n = w < 0 ? 0 : (size_t)w;
			if (n >= c->errlen)
				n = c->errlen - 1;
		}
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - n, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* A non-negative integer below `bound` (an index or count). 0, or 1. */
static int get_index(const msgpack_object *o, uint64_t bound, uint32_t *out)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    o->via.u64 >= bound || o->via.u64 > UINT32_MAX)
		return 1;
	*out = (uint32_t)o->via.u64;
	return 0;
}

static bool is_nil(const msgpack_object *o)
{
	return o == NULL || o->type == MSGPACK_OBJECT_NIL;
}

/* An array field; its count checked against max. */
static int get_array(dctx_t *c, const msgpack_object *m, const char *key,
		     uint32_t max, const msgpack_object **out)
{
	const msgpack_object *o = kiln_map_get(m, key);
	if (o == NULL || o->type != MSGPACK_OBJECT_ARRAY)
		return fail(c, KILN_EINVGRAPH, "missing \"%s\" array", key);
	if (o->via.array.size > max)
		return fail(c, KILN_ETOOLARGE, "%u %s exceed the limit %u",
			    o->via.array.size, key, max);
	*out = o;
	return 0;
}

static void *table(kiln_arena_t *ar, uint32_t n, size_t sz)
{
	return kiln_arena_calloc(ar, n ? n : 1, sz);
}

/* ---- decoding ----------------------------------------------------------- */

static int decode_head(dctx_t *c, const msgpack_object *m, kiln_artifact_t *a)
{
	kiln_arena_t *ar = a->arena;
	const msgpack_object *fmt = kiln_map_get(m, "format");
	if (fmt == NULL)
		return fail(c, KILN_EINVGRAPH, "missing \"format\"");
	if (!kiln_obj_streq(fmt, KILN_ARTIFACT_FORMAT))
		return fail(c, KILN_EINVGRAPH,
			    "\"format\" must be \"" KILN_ARTIFACT_FORMAT "\"");

	char sub[256];
	int rc = kiln_target_from_object(kiln_map_get(m, "target"), &a->target,
					 sub, sizeof(sub));
	if (rc != 0)
		return fail(c, KILN_EINVGRAPH, "target: %s", sub);

	const msgpack_object *sig = kiln_map_get(m, "signature");
	if (!is_nil(sig)) {
		uint8_t raw[KILN_SIG_BYTES];
		if (sig->type != MSGPACK_OBJECT_STR ||
		    (sig->via.str.size != 0 &&
		     kiln_sig_from_hex(sig->via.str.ptr, sig->via.str.size,
				       raw) != 0))
			return fail(c, KILN_EINVGRAPH,
				    "\"signature\" must be 64 hex digits, "
				    "\"\" or nil");
		if (sig->via.str.size != 0)
			kiln_sig_to_hex(raw, a->signature);
	}

	const msgpack_object *code = kiln_map_get(m, "code");
	if (code == NULL || code->type != MSGPACK_OBJECT_BIN)
		return fail(c, KILN_EINVGRAPH, "missing \"code\" bin");
	const msgpack_object *cubin = kiln_map_get(m, "cubin");
	if (!is_nil(cubin) && cubin->type != MSGPACK_OBJECT_BIN)
		return fail(c, KILN_EINVGRAPH, "\"cubin\" must be bin or nil");
	uint8_t *p = kiln_arena_alloc(ar, code->via.bin.size);
	if (p == NULL)
		return -ENOMEM;
	if (code->via.bin.size > 0)
		memcpy(p, code->via.bin.ptr, code->via.bin.size);
	a->code = p;
	a->code_len = code->via.bin.size;
	if (!is_nil(cubin) && cubin->via.bin.size > 0) {
		p = kiln_arena_alloc(ar, cubin->via.bin.size);
		if (p == NULL)
			return -ENOMEM;
		memcpy(p, cubin->via.bin.ptr, cubin->via.bin.size);
		a->cubin = p;
		a->cubin_len = cubin->via.bin.size;
	}

	const msgpack_object *text = kiln_map_get(m, "kernels_text");
	if (!is_nil(text)) {
		if (text->type != MSGPACK_OBJECT_STR)
			return fail(c, KILN_EINVGRAPH,
				    "\"kernels_text\" must be str or nil");
		a->kernels_text = kiln_arena_strndup(ar, text->via.str.ptr,
						     text->via.str.size);
		if (a->kernels_text == NULL)
			return -ENOMEM;
	}

	rc = kiln__graph_parse_symbols(c, kiln_map_get(m, "symbols"));
	if (rc != 0)
		return rc;
	a->n_symbols = c->g->n_symbols;
	a->symbols = c->g->symbols;

	const msgpack_object *nob = kiln_map_get(m, "n_out_buffers");
	if (nob == NULL || nob->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return fail(c, KILN_EINVGRAPH,
			    "missing \"n_out_buffers\" (an int >= 0)");
	if (nob->via.u64 > c->lim->max_values)
		return fail(c, KILN_ETOOLARGE,
			    "%llu output buffers exceed the limit %u",
			    (unsigned long long)nob->via.u64,
			    c->lim->max_values);
	a->n_out_buffers = (uint32_t)nob->via.u64;

	const msgpack_object *ab = kiln_map_get(m, "arena_bytes");
	if (ab == NULL)
		return fail(c, KILN_EINVGRAPH, "missing \"arena_bytes\"");
	return kiln__graph_parse_dim(c, ab, "arena_bytes", &a->arena_bytes,
				     true);
}

static int decode_inputs(dctx_t *c, const msgpack_object *m, kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "inputs", c->lim->max_values, &arr);
	if (rc != 0)
		return rc;
	a->n_inputs = arr->via.array.size;
	a->inputs = table(a->arena, a->n_inputs, sizeof(kiln_value_t));
	if (a->inputs == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_inputs; i++) {
		const msgpack_object *in = &arr->via.array.ptr[i];
		kiln_value_t *v = &a->inputs[i];
		snprintf(c->where, sizeof(c->where), "input %u", i);
		v->producer = -1;
		const msgpack_object *sym = kiln_map_get(in, "sym");
		if (sym != NULL) {
			v->kind = KILN_VAL_SYMINT;
			rc = kiln__graph_parse_expr(c, sym, "sym", &v->sym);
		} else {
			rc = kiln__graph_parse_spec(c, in, v);
		}
		if (rc != 0)
			return rc;
	}
	c->where[0] = '\0';
	return 0;
}

static bool is_sym(const kiln_expr_t *e, uint32_t s)
{
	return e != NULL && e->kind == KILN_EX_SYM && e->sym == s;
}

static int decode_bindings(dctx_t *c, const msgpack_object *m,
			   kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "bindings", c->lim->max_symbols, &arr);
	if (rc != 0)
		return rc;
	if (arr->via.array.size != a->n_symbols)
		return fail(c, KILN_EINVGRAPH,
			    "\"bindings\" has %u entries for %u symbols",
			    arr->via.array.size, a->n_symbols);
	a->bindings = table(a->arena, a->n_symbols, sizeof(kiln_art_binding_t));
	if (a->bindings == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_symbols; i++) {
		const msgpack_object *b = &arr->via.array.ptr[i];
		kiln_art_binding_t *bd = &a->bindings[i];
		snprintf(c->where, sizeof(c->where), "binding %u (%.40s)", i,
			 a->symbols[i].name);
		if (b->type != MSGPACK_OBJECT_MAP)
			return fail(c, KILN_EINVGRAPH,
				    "must be a map {\"input\", \"dim\"}");
		if (get_index(kiln_map_get(b, "input"), a->n_inputs,
			      &bd->input) != 0)
			return fail(c, KILN_EINVGRAPH,
				    "\"input\" must be an input index "
				    "(%u inputs)",
				    a->n_inputs);
		const msgpack_object *dim = kiln_map_get(b, "dim");
		int64_t d = -1;
		if (!is_nil(dim)) {
			if (dim->type == MSGPACK_OBJECT_NEGATIVE_INTEGER &&
			    dim->via.i64 == -1)
				d = -1;
			else if (dim->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
				 dim->via.u64 < KILN_MAX_RANK_HARD)
				d = (int64_t)dim->via.u64;
			else
				return fail(c, KILN_EINVGRAPH,
					    "\"dim\" must be -1, nil or a "
					    "dimension index");
		}
		bd->dim = (int32_t)d;
		const kiln_value_t *in = &a->inputs[bd->input];
		if (d < 0) {
			if (in->kind != KILN_VAL_SYMINT)
				return fail(c, KILN_EINVGRAPH,
					    "input %u is a tensor: give "
					    "\"dim\"",
					    bd->input);
			if (!is_sym(in->sym, i))
				return fail(c, KILN_EINVGRAPH,
					    "int input %u is not exactly "
					    "this symbol",
					    bd->input);
		} else {
			if (in->kind != KILN_VAL_TENSOR)
				return fail(c, KILN_EINVGRAPH,
					    "input %u is an int: \"dim\" "
					    "must be -1",
					    bd->input);
			if ((uint32_t)d >= in->rank)
				return fail(c, KILN_EINVGRAPH,
					    "dim %lld out of range for input "
					    "%u of rank %u",
					    (long long)d, bd->input, in->rank);
			if (!is_sym(in->sizes[d].e, i))
				return fail(c, KILN_EINVGRAPH,
					    "size %lld of input %u is not "
					    "exactly this symbol",
					    (long long)d, bd->input);
		}
	}
	c->where[0] = '\0';
	return 0;
}

static int decode_kernels(dctx_t *c, const msgpack_object *m,
			  kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "kernels", c->lim->max_nodes, &arr);
	if (rc != 0)
		return rc;
	a->n_kernels = arr->via.array.size;
	a->kernels = table(a->arena, a->n_kernels, sizeof(kiln_art_kernel_t));
	if (a->kernels == NULL)
		return -ENOMEM;
	if (a->n_kernels > 0 && a->code_len == 0 &&
	    strcmp(a->target.backend, "cpu") == 0)
		return fail(c, KILN_EINVGRAPH,
			    "%u kernels but the \"code\" is empty",
			    a->n_kernels);
	for (uint32_t i = 0; i < a->n_kernels; i++) {
		const msgpack_object *k = &arr->via.array.ptr[i];
		kiln_art_kernel_t *kn = &a->kernels[i];
		snprintf(c->where, sizeof(c->where), "kernel %u", i);
		if (k->type != MSGPACK_OBJECT_MAP)
			return fail(c, KILN_EINVGRAPH, "must be a map");
		const msgpack_object *name = kiln_map_get(k, "name");
		if (name == NULL || name->type != MSGPACK_OBJECT_STR ||
		    name->via.str.size > KILN__KERNEL_NAME_MAX ||
		    !kiln__valid_ident(name->via.str.ptr, name->via.str.size))
			return fail(c, KILN_EINVGRAPH,
				    "\"name\" must be a C identifier of at "
				    "most %d bytes",
				    KILN__KERNEL_NAME_MAX);
		kn->name = kiln_arena_strndup(a->arena, name->via.str.ptr,
					      name->via.str.size);
		if (kn->name == NULL)
			return -ENOMEM;
		snprintf(c->where, sizeof(c->where), "kernel %u (%.64s)", i,
			 kn->name);
		const msgpack_object *ext = kiln_map_get(k, "extent");
		if (ext == NULL)
			return fail(c, KILN_EINVGRAPH, "missing \"extent\"");
		rc = kiln__graph_parse_dim(c, ext, "extent", &kn->extent, true);
		if (rc != 0)
			return rc;
		const msgpack_object *grain = kiln_map_get(k, "grain");
		if (grain == NULL ||
		    grain->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    grain->via.u64 < 1 || grain->via.u64 > (uint64_t)INT64_MAX)
			return fail(c, KILN_EINVGRAPH,
				    "\"grain\" must be an int >= 1");
		kn->grain = (int64_t)grain->via.u64;
		const msgpack_object *nb = kiln_map_get(k, "n_bufs");
		if (nb == NULL || nb->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			return fail(c, KILN_EINVGRAPH,
				    "\"n_bufs\" must be an int >= 0");
		if (nb->via.u64 > c->lim->max_values)
			return fail(c, KILN_ETOOLARGE,
				    "n_bufs %llu exceeds the limit %u",
				    (unsigned long long)nb->via.u64,
				    c->lim->max_values);
		kn->n_bufs = (uint32_t)nb->via.u64;
	}
	c->where[0] = '\0';
	return 0;
}

static int decode_buffers(dctx_t *c, const msgpack_object *m,
			  kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "buffers", c->lim->max_values, &arr);
	if (rc != 0)
		return rc;
	a->n_buffers = arr->via.array.size;
	a->buffers = table(a->arena, a->n_buffers, sizeof(kiln_art_buffer_t));
	/* which buffer describes output buffer k (+1; 0: none yet) */
	uint32_t *out_of = table(a->arena, a->n_out_buffers, sizeof(uint32_t));
	if (a->buffers == NULL || out_of == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_buffers; i++) {
		const msgpack_object *b = &arr->via.array.ptr[i];
		kiln_art_buffer_t *bf = &a->buffers[i];
		snprintf(c->where, sizeof(c->where), "buffer %u", i);
		if (b->type != MSGPACK_OBJECT_MAP)
			return fail(c, KILN_EINVGRAPH, "must be a map");
		const msgpack_object *kind = kiln_map_get(b, "kind");
		const msgpack_object *idx = kiln_map_get(b, "index");
		const msgpack_object *off = kiln_map_get(b, "offset");
		const msgpack_object *bytes = kiln_map_get(b, "bytes");
		if (kiln_obj_streq(kind, "input")) {
			bf->kind = KILN_BUF_INPUT;
			if (get_index(idx, a->n_inputs, &bf->index) != 0)
				return fail(c, KILN_EINVGRAPH,
					    "\"index\" must be an input index "
					    "(%u inputs)",
					    a->n_inputs);
			if (a->inputs[bf->index].kind != KILN_VAL_TENSOR)
				return fail(c, KILN_EINVGRAPH,
					    "input %u is an int, not a tensor",
					    bf->index);
		} else if (kiln_obj_streq(kind, "output")) {
			bf->kind = KILN_BUF_OUTPUT;
			if (get_index(idx, a->n_out_buffers, &bf->index) != 0)
				return fail(c, KILN_EINVGRAPH,
					    "\"index\" must be an output "
					    "buffer index (%u output buffers)",
					    a->n_out_buffers);
			if (out_of[bf->index] != 0)
				return fail(c, KILN_EINVGRAPH,
					    "output buffer %u is also "
					    "buffer %u",
					    bf->index, out_of[bf->index] - 1);
			out_of[bf->index] = i + 1;
		} else if (kiln_obj_streq(kind, "arena")) {
			bf->kind = KILN_BUF_ARENA;
			if (off == NULL)
				return fail(c, KILN_EINVGRAPH,
					    "missing \"offset\"");
			rc = kiln__graph_parse_dim(c, off, "offset",
						   &bf->offset, true);
			if (rc != 0)
				return rc;
			if (bf->offset.e == NULL && bf->offset.c % 64 != 0)
				return fail(c, KILN_EINVGRAPH,
					    "offset %lld is not a multiple "
					    "of 64",
					    (long long)bf->offset.c);
		} else {
			return fail(c, KILN_EINVGRAPH,
				    "\"kind\" must be \"input\", \"output\" "
				    "or \"arena\"");
		}
		if (bf->kind != KILN_BUF_INPUT) {
			if (bytes == NULL)
				return fail(c, KILN_EINVGRAPH,
					    "missing \"bytes\"");
			rc = kiln__graph_parse_dim(c, bytes, "bytes",
						   &bf->bytes, true);
			if (rc != 0)
				return rc;
		}
		if (bf->kind == KILN_BUF_ARENA && bf->offset.e == NULL &&
		    bf->bytes.e == NULL && a->arena_bytes.e == NULL &&
		    (bf->offset.c > a->arena_bytes.c ||
		     bf->bytes.c > a->arena_bytes.c - bf->offset.c))
			return fail(c, KILN_EINVGRAPH,
				    "bytes [%lld, +%lld) exceed arena_bytes "
				    "%lld",
				    (long long)bf->offset.c,
				    (long long)bf->bytes.c,
				    (long long)a->arena_bytes.c);
	}
	c->where[0] = '\0';
	for (uint32_t k = 0; k < a->n_out_buffers; k++)
		if (out_of[k] == 0)
			return fail(c, KILN_EINVGRAPH,
				    "output buffer %u is not described by any "
				    "buffer",
				    k);
	return 0;
}

static int decode_views(dctx_t *c, const msgpack_object *m, kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "views", c->lim->max_values, &arr);
	if (rc != 0)
		return rc;
	a->n_views = arr->via.array.size;
	a->views = table(a->arena, a->n_views, sizeof(kiln_art_view_t));
	if (a->views == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_views; i++) {
		const msgpack_object *v = &arr->via.array.ptr[i];
		kiln_art_view_t *vw = &a->views[i];
		snprintf(c->where, sizeof(c->where), "view %u", i);
		if (v->type != MSGPACK_OBJECT_MAP)
			return fail(c, KILN_EINVGRAPH, "must be a map");
		if (get_index(kiln_map_get(v, "buffer"), a->n_buffers,
			      &vw->buffer) != 0)
			return fail(c, KILN_EINVGRAPH,
				    "\"buffer\" must be a buffer index (%u "
				    "buffers)",
				    a->n_buffers);
		kiln_value_t spec;
		memset(&spec, 0, sizeof(spec));
		rc = kiln__graph_parse_spec(c, v, &spec);
		if (rc != 0)
			return rc;
		vw->dtype = spec.dtype;
		vw->rank = spec.rank;
		vw->sizes = spec.sizes;
		vw->strides = spec.strides;
		const msgpack_object *off = kiln_map_get(v, "offset");
		vw->offset.c = 0;
		vw->offset.e = NULL;
		if (!is_nil(off)) {
			rc = kiln__graph_parse_dim(c, off, "offset",
						   &vw->offset, true);
			if (rc != 0)
				return rc;
		}
	}
	c->where[0] = '\0';
	return 0;
}

/* Every ref inside a fallback arg must name a view. */
static int check_refs(dctx_t *c, const kiln_arg_t *x, uint32_t n_views,
		      const char *what)
{
	if (x->kind == KILN_ARG_REF && x->u.ref >= n_views)
		return fail(c, KILN_EINVGRAPH,
			    "%s: ref %u out of range (%u views)", what,
			    x->u.ref, n_views);
	if (x->kind == KILN_ARG_LIST) {
		for (uint32_t i = 0; i < x->n; i++) {
			char sub[64];
			snprintf(sub, sizeof(sub), "%.40s[%u]", what, i);
			int rc = check_refs(c, &x->u.list[i], n_views, sub);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

static int kwarg_cmp(const void *x, const void *y)
{
	const kiln_kwarg_t *p = x, *q = y;
	return strcmp(p->key, q->key);
}

/* A list of indices below bound into *out (allocated). */
static int index_list(dctx_t *c, const msgpack_object *o, const char *key,
		      uint32_t bound, const char *table_name, uint32_t *n,
		      uint32_t **out)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_ARRAY)
		return fail(c, KILN_EINVGRAPH, "missing \"%s\" array", key);
	*n = o->via.array.size;
	*out = table(c->g->arena, *n, sizeof(uint32_t));
	if (*out == NULL)
		return -ENOMEM;
	for (uint32_t j = 0; j < *n; j++) {
		const msgpack_object *e = &o->via.array.ptr[j];
		if (get_index(e, bound, &(*out)[j]) == 0)
			continue;
		if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			return fail(c, KILN_EINVGRAPH,
				    "%s[%u]: %s %llu out of range (%u %ss)",
				    key, j, table_name,
				    (unsigned long long)e->via.u64, bound,
				    table_name);
		return fail(c, KILN_EINVGRAPH, "%s[%u]: not a %s index", key, j,
			    table_name);
	}
	return 0;
}

static int decode_fallback(dctx_t *c, const msgpack_object *s,
			   kiln_artifact_t *a, kiln_art_step_t *st)
{
	const msgpack_object *op = kiln_map_get(s, "op");
	if (op == NULL || op->type != MSGPACK_OBJECT_STR)
		return fail(c, KILN_EINVGRAPH, "missing string \"op\"");
	if (op->via.str.size > c->lim->max_str_bytes ||
	    !kiln__valid_op_name(op->via.str.ptr, op->via.str.size))
		return fail(
		    c, KILN_EINVGRAPH, "malformed op name \"%.*s\"",
		    (int)(op->via.str.size > 64 ? 64 : op->via.str.size),
		    op->via.str.ptr);
	st->op =
	    kiln_arena_strndup(a->arena, op->via.str.ptr, op->via.str.size);
	if (st->op == NULL)
		return -ENOMEM;
	size_t wl = strlen(c->where);
	snprintf(c->where + wl, sizeof(c->where) - wl, " (%.60s)", st->op);

	const msgpack_object *args = kiln_map_get(s, "args");
	const msgpack_object *kwargs = kiln_map_get(s, "kwargs");
	if (!is_nil(args) && args->type != MSGPACK_OBJECT_ARRAY)
		return fail(c, KILN_EINVGRAPH, "\"args\" must be an array");
	if (!is_nil(kwargs) && kwargs->type != MSGPACK_OBJECT_MAP)
		return fail(c, KILN_EINVGRAPH, "\"kwargs\" must be a map");
	int rc;
	if (!is_nil(args)) {
		st->n_args = args->via.array.size;
		st->args = table(a->arena, st->n_args, sizeof(kiln_arg_t));
		if (st->args == NULL)
			return -ENOMEM;
		for (uint32_t k = 0; k < st->n_args; k++) {
			char what[32];
			snprintf(what, sizeof(what), "arg %u", k);
			rc = kiln__graph_parse_arg(c, &args->via.array.ptr[k],
						   UINT32_MAX, &st->args[k],
						   what);
			if (rc == 0)
				rc = check_refs(c, &st->args[k], a->n_views,
						what);
			if (rc != 0)
				return rc;
		}
	}
	if (!is_nil(kwargs)) {
		st->n_kwargs = kwargs->via.map.size;
		st->kwargs =
		    table(a->arena, st->n_kwargs, sizeof(kiln_kwarg_t));
		if (st->kwargs == NULL)
			return -ENOMEM;
		for (uint32_t k = 0; k < st->n_kwargs; k++) {
			const msgpack_object *key = &kwargs->via.map.ptr[k].key;
			if (key->type != MSGPACK_OBJECT_STR ||
			    key->via.str.size > 128 ||
			    !kiln__valid_ident(key->via.str.ptr,
					       key->via.str.size))
				return fail(c, KILN_EINVGRAPH,
					    "kwarg %u: key must be an "
					    "identifier string",
					    k);
			st->kwargs[k].key = kiln_arena_strndup(
			    a->arena, key->via.str.ptr, key->via.str.size);
			if (st->kwargs[k].key == NULL)
				return -ENOMEM;
			char what[160];
			snprintf(what, sizeof(what), "kwarg \"%s\"",
				 st->kwargs[k].key);
			rc = kiln__graph_parse_arg(
			    c, &kwargs->via.map.ptr[k].val, UINT32_MAX,
			    &st->kwargs[k].val, what);
			if (rc == 0)
				rc = check_refs(c, &st->kwargs[k].val,
						a->n_views, what);
			if (rc != 0)
				return rc;
		}
		qsort(st->kwargs, st->n_kwargs, sizeof(kiln_kwarg_t),
		      kwarg_cmp);
		for (uint32_t k = 1; k < st->n_kwargs; k++)
			if (strcmp(st->kwargs[k - 1].key, st->kwargs[k].key) ==
			    0)
				return fail(c, KILN_EINVGRAPH,
					    "kwarg \"%s\" given twice",
					    st->kwargs[k].key);
	}
	return index_list(c, kiln_map_get(s, "out"), "out", a->n_views, "view",
			  &st->n_out, &st->out);
}

static int decode_steps(dctx_t *c, const msgpack_object *m, kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "steps", c->lim->max_nodes, &arr);
	if (rc != 0)
		return rc;
	a->n_steps = arr->via.array.size;
	a->steps = table(a->arena, a->n_steps, sizeof(kiln_art_step_t));
	if (a->steps == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_steps; i++) {
		const msgpack_object *s = &arr->via.array.ptr[i];
		kiln_art_step_t *st = &a->steps[i];
		snprintf(c->where, sizeof(c->where), "step %u", i);
		if (s->type != MSGPACK_OBJECT_MAP)
			return fail(c, KILN_EINVGRAPH, "must be a map");
		const msgpack_object *node = kiln_map_get(s, "node");
		st->node = -1;
		if (!is_nil(node)) {
			if (node->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
			    node->via.u64 <= INT32_MAX)
				st->node = (int32_t)node->via.u64;
			else if (!(node->type ==
				       MSGPACK_OBJECT_NEGATIVE_INTEGER &&
				   node->via.i64 == -1))
				return fail(c, KILN_EINVGRAPH,
					    "\"node\" must be a node index, "
					    "-1 or nil");
		}
		const msgpack_object *kind = kiln_map_get(s, "kind");
		if (kiln_obj_streq(kind, "kernel")) {
			st->kind = KILN_STEP_KERNEL;
			const msgpack_object *k = kiln_map_get(s, "kernel");
			if (get_index(k, a->n_kernels, &st->kernel) != 0) {
				if (k != NULL &&
				    k->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
					return fail(
					    c, KILN_EINVGRAPH,
					    "kernel %llu out of range "
					    "(%u kernels)",
					    (unsigned long long)k->via.u64,
					    a->n_kernels);
				return fail(c, KILN_EINVGRAPH,
					    "\"kernel\" must be a kernel "
					    "index");
			}
			rc = index_list(c, kiln_map_get(s, "bufs"), "bufs",
					a->n_buffers, "buffer", &st->n_bufs,
					&st->bufs);
			if (rc != 0)
				return rc;
			const kiln_art_kernel_t *kn = &a->kernels[st->kernel];
			if (st->n_bufs != kn->n_bufs)
				return fail(c, KILN_EINVGRAPH,
					    "%u buffers but kernel %u (%s) "
					    "takes %u",
					    st->n_bufs, st->kernel, kn->name,
					    kn->n_bufs);
		} else if (kiln_obj_streq(kind, "fallback")) {
			st->kind = KILN_STEP_FALLBACK;
			rc = decode_fallback(c, s, a, st);
			if (rc != 0)
				return rc;
		} else {
			return fail(c, KILN_EINVGRAPH,
				    "\"kind\" must be \"kernel\" or "
				    "\"fallback\"");
		}
	}
	c->where[0] = '\0';
	return 0;
}

static int decode_outputs(dctx_t *c, const msgpack_object *m,
			  kiln_artifact_t *a)
{
	const msgpack_object *arr = NULL;
	int rc = get_array(c, m, "outputs", c->lim->max_values, &arr);
	if (rc != 0)
		return rc;
	a->n_outputs = arr->via.array.size;
	a->outputs = table(a->arena, a->n_outputs, sizeof(kiln_arg_t));
	if (a->outputs == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->n_outputs; i++) {
		const msgpack_object *o = &arr->via.array.ptr[i];
		kiln_arg_t *out = &a->outputs[i];
		snprintf(c->where, sizeof(c->where), "output %u", i);
		const msgpack_object *ref = o->type == MSGPACK_OBJECT_MAP
						? kiln_map_get(o, "ref")
						: NULL;
		const msgpack_object *sym = o->type == MSGPACK_OBJECT_MAP
						? kiln_map_get(o, "sym")
						: NULL;
		if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size != 1 ||
		    (ref == NULL && sym == NULL))
			return fail(c, KILN_EINVGRAPH,
				    "must be {\"ref\": view} or {\"sym\": "
				    "expr}");
		if (sym != NULL) {
			out->kind = KILN_ARG_SYM;
			rc = kiln__graph_parse_expr(c, sym, "sym", &out->u.sym);
			if (rc != 0)
				return rc;
			continue;
		}
		out->kind = KILN_ARG_REF;
		if (get_index(ref, a->n_views, &out->u.ref) != 0) {
			if (ref->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
				return fail(c, KILN_EINVGRAPH,
					    "view %llu out of range (%u views)",
					    (unsigned long long)ref->via.u64,
					    a->n_views);
			return fail(c, KILN_EINVGRAPH,
				    "\"ref\" must be a view index");
		}
		const kiln_art_view_t *vw = &a->views[out->u.ref];
		if (a->buffers[vw->buffer].kind == KILN_BUF_ARENA)
			return fail(c, KILN_EINVGRAPH,
				    "view %u lies in the scratch arena "
				    "(buffer %u), which the next run reuses",
				    out->u.ref, vw->buffer);
	}
	c->where[0] = '\0';
	return 0;
}

static int decode(dctx_t *c, const msgpack_object *m, kiln_artifact_t *a)
{
	int rc = decode_head(c, m, a);
	if (rc == 0)
		rc = decode_inputs(c, m, a);
	if (rc == 0)
		rc = decode_bindings(c, m, a);
	if (rc == 0)
		rc = decode_kernels(c, m, a);
	if (rc == 0)
		rc = decode_buffers(c, m, a);
	if (rc == 0)
		rc = decode_views(c, m, a);
	if (rc == 0)
		rc = decode_steps(c, m, a);
	if (rc == 0)
		rc = decode_outputs(c, m, a);
	return rc;
}

int kiln_artifact_decode(const uint8_t *p, size_t n, const kiln_limits_t *lim,
			 kiln_artifact_t **out, char *err, size_t errlen)
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
	if (rc != 0) {
		msgpack_zone_destroy(&zone);
		return rc;
	}
	kiln_arena_t *arena = kiln_arena_new(16384);
	kiln_artifact_t *a =
	    arena ? kiln_arena_calloc(arena, 1, sizeof(*a)) : NULL;
	if (a == NULL) {
		kiln_arena_free(arena);
		msgpack_zone_destroy(&zone);
		return kiln__errf(err, errlen, -ENOMEM,
				  "out of memory decoding the artifact");
	}
	a->arena = arena;
	/* A stand-in graph: graph.c's decoders allocate in g->arena and
	 * parse_symbols fills g->symbols. */
	kiln_graph_t shim;
	memset(&shim, 0, sizeof(shim));
	shim.arena = arena;
	dctx_t c = {.lim = lim, .g = &shim, .err = err, .errlen = errlen};
	c.ex.arena = arena;
	c.ex.max_nodes = lim->max_expr_nodes;
	rc = decode(&c, &obj, a);
	msgpack_zone_destroy(&zone);
	if (rc != 0) {
		if (rc == -ENOMEM)
			kiln__errf(err, errlen, rc,
				   "out of memory decoding the artifact");
		kiln_arena_free(arena);
		return rc;
	}
	*out = a;
	return 0;
}

void kiln_artifact_free(kiln_artifact_t *a)
{
	if (a != NULL)
		kiln_arena_free(a->arena);
}

/* ---- packing ------------------------------------------------------------ */

static int pack_bin(msgpack_packer *pk, const uint8_t *p, size_t n)
{
	int rc = msgpack_pack_bin(pk, n);
	if (n > 0)
		rc |= msgpack_pack_bin_body(pk, p, n);
	return rc;
}

static int pack_dims(const kiln_graph_t *g, msgpack_packer *pk,
		     const kiln_dim_t *d, uint32_t n)
{
	int rc = msgpack_pack_array(pk, n);
	for (uint32_t i = 0; i < n; i++)
		rc |= kiln__graph_pack_dim(g, pk, d[i]);
	return rc;
}

static int pack_u32s(msgpack_packer *pk, const uint32_t *v, uint32_t n)
{
	int rc = msgpack_pack_array(pk, n);
	for (uint32_t i = 0; i < n; i++)
		rc |= msgpack_pack_uint32(pk, v[i]);
	return rc;
}

static int pack_step(const kiln_graph_t *g, msgpack_packer *pk,
		     const kiln_art_step_t *s)
{
	int rc;
	if (s->kind == KILN_STEP_KERNEL) {
		rc = msgpack_pack_map(pk, 4);
		rc |= kiln_pack_cstr(pk, "kind");
		rc |= kiln_pack_cstr(pk, "kernel");
		rc |= kiln_pack_cstr(pk, "node");
		rc |= msgpack_pack_int32(pk, s->node);
		rc |= kiln_pack_cstr(pk, "kernel");
		rc |= msgpack_pack_uint32(pk, s->kernel);
		rc |= kiln_pack_cstr(pk, "bufs");
		rc |= pack_u32s(pk, s->bufs, s->n_bufs);
		return rc;
	}
	rc = msgpack_pack_map(pk, 6);
	rc |= kiln_pack_cstr(pk, "kind");
	rc |= kiln_pack_cstr(pk, "fallback");
	rc |= kiln_pack_cstr(pk, "node");
	rc |= msgpack_pack_int32(pk, s->node);
	rc |= kiln_pack_cstr(pk, "op");
	rc |= kiln_pack_cstr(pk, s->op);
	rc |= kiln_pack_cstr(pk, "args");
	rc |= msgpack_pack_array(pk, s->n_args);
	for (uint32_t k = 0; k < s->n_args; k++)
		rc |= kiln__graph_pack_arg(g, pk, &s->args[k]);
	rc |= kiln_pack_cstr(pk, "kwargs");
	rc |= msgpack_pack_map(pk, s->n_kwargs);
	for (uint32_t k = 0; k < s->n_kwargs; k++) {
		rc |= kiln_pack_cstr(pk, s->kwargs[k].key);
		rc |= kiln__graph_pack_arg(g, pk, &s->kwargs[k].val);
	}
	rc |= kiln_pack_cstr(pk, "out");
	rc |= pack_u32s(pk, s->out, s->n_out);
	return rc;
}

int kiln_artifact_pack(const kiln_artifact_t *a, msgpack_packer *pk)
{
	static const char *const buf_kinds[] = {"input", "output", "arena"};
	/* expressions are formatted with the artifact's symbol names */
	kiln_graph_t shim;
	memset(&shim, 0, sizeof(shim));
	shim.n_symbols = a->n_symbols;
	shim.symbols = a->symbols;
	const kiln_graph_t *g = &shim;

	int rc = msgpack_pack_map(pk, 16);
	rc |= kiln_pack_cstr(pk, "format");
	rc |= kiln_pack_cstr(pk, KILN_ARTIFACT_FORMAT);

	rc |= kiln_pack_cstr(pk, "target");
	int nt =
	    1 + (a->target.arch[0] != '\0') + (a->target.features[0] != '\0');
	rc |= msgpack_pack_map(pk, (size_t)nt);
	rc |= kiln_pack_cstr(pk, "backend");
	rc |= kiln_pack_cstr(pk, a->target.backend);
	if (a->target.arch[0] != '\0') {
		rc |= kiln_pack_cstr(pk, "arch");
		rc |= kiln_pack_cstr(pk, a->target.arch);
	}
	if (a->target.features[0] != '\0') {
		rc |= kiln_pack_cstr(pk, "features");
		rc |= kiln_pack_cstr(pk, a->target.features);
	}

	rc |= kiln_pack_cstr(pk, "signature");
	rc |= kiln_pack_cstr(pk, a->signature);
	rc |= kiln_pack_cstr(pk, "code");
	rc |= pack_bin(pk, a->code, a->code_len);
	rc |= kiln_pack_cstr(pk, "cubin");
	rc |= a->cubin != NULL ? pack_bin(pk, a->cubin, a->cubin_len)
			       : msgpack_pack_nil(pk);

	rc |= kiln_pack_cstr(pk, "symbols");
	rc |= kiln__pack_symbols(pk, a->symbols, a->n_symbols);
	rc |= kiln_pack_cstr(pk, "bindings");
	rc |= msgpack_pack_array(pk, a->n_symbols);
	for (uint32_t i = 0; i < a->n_symbols; i++) {
		rc |= msgpack_pack_map(pk, 2);
		rc |= kiln_pack_cstr(pk, "input");
		rc |= msgpack_pack_uint32(pk, a->bindings[i].input);
		rc |= kiln_pack_cstr(pk, "dim");
		rc |= msgpack_pack_int32(pk, a->bindings[i].dim);
	}
	rc |= kiln_pack_cstr(pk, "inputs");
	rc |= msgpack_pack_array(pk, a->n_inputs);
	for (uint32_t i = 0; i < a->n_inputs; i++)
		rc |= kiln__graph_pack_spec(g, pk, &a->inputs[i]);

	rc |= kiln_pack_cstr(pk, "kernels");
	rc |= msgpack_pack_array(pk, a->n_kernels);
	for (uint32_t i = 0; i < a->n_kernels; i++) {
		const kiln_art_kernel_t *k = &a->kernels[i];
		rc |= msgpack_pack_map(pk, 4);
		rc |= kiln_pack_cstr(pk, "name");
		rc |= kiln_pack_cstr(pk, k->name);
		rc |= kiln_pack_cstr(pk, "extent");
		rc |= kiln__graph_pack_dim(g, pk, k->extent);
		rc |= kiln_pack_cstr(pk, "grain");
		rc |= msgpack_pack_int64(pk, k->grain);
		rc |= kiln_pack_cstr(pk, "n_bufs");
		rc |= msgpack_pack_uint32(pk, k->n_bufs);
	}

	rc |= kiln_pack_cstr(pk, "buffers");
	rc |= msgpack_pack_array(pk, a->n_buffers);
	for (uint32_t i = 0; i < a->n_buffers; i++) {
		const kiln_art_buffer_t *b = &a->buffers[i];
		assert((unsigned)b->kind <= KILN_BUF_ARENA);
		rc |= msgpack_pack_map(pk, b->kind == KILN_BUF_INPUT ? 2 : 3);
		rc |= kiln_pack_cstr(pk, "kind");
		rc |= kiln_pack_cstr(pk, buf_kinds[b->kind]);
		if (b->kind == KILN_BUF_ARENA) {
			rc |= kiln_pack_cstr(pk, "offset");
			rc |= kiln__graph_pack_dim(g, pk, b->offset);
		} else {
			rc |= kiln_pack_cstr(pk, "index");
			rc |= msgpack_pack_uint32(pk, b->index);
		}
		if (b->kind != KILN_BUF_INPUT) {
			rc |= kiln_pack_cstr(pk, "bytes");
			rc |= kiln__graph_pack_dim(g, pk, b->bytes);
		}
	}

	rc |= kiln_pack_cstr(pk, "views");
	rc |= msgpack_pack_array(pk, a->n_views);
	for (uint32_t i = 0; i < a->n_views; i++) {
		const kiln_art_view_t *v = &a->views[i];
		rc |= msgpack_pack_map(pk, 5);
		rc |= kiln_pack_cstr(pk, "buffer");
		rc |= msgpack_pack_uint32(pk, v->buffer);
		rc |= kiln_pack_cstr(pk, "dtype");
		rc |= kiln_pack_cstr(pk, kiln_dtype_name(v->dtype));
		rc |= kiln_pack_cstr(pk, "shape");
		rc |= pack_dims(g, pk, v->sizes, v->rank);
		rc |= kiln_pack_cstr(pk, "strides");
		rc |= pack_dims(g, pk, v->strides, v->rank);
		rc |= kiln_pack_cstr(pk, "offset");
		rc |= kiln__graph_pack_dim(g, pk, v->offset);
	}

	rc |= kiln_pack_cstr(pk, "steps");
	rc |= msgpack_pack_array(pk, a->n_steps);
	for (uint32_t i = 0; i < a->n_steps; i++)
		rc |= pack_step(g, pk, &a->steps[i]);

	rc |= kiln_pack_cstr(pk, "outputs");
	rc |= msgpack_pack_array(pk, a->n_outputs);
	for (uint32_t i = 0; i < a->n_outputs; i++)
		rc |= kiln__graph_pack_arg(g, pk, &a->outputs[i]);

	rc |= kiln_pack_cstr(pk, "n_out_buffers");
	rc |= msgpack_pack_uint32(pk, a->n_out_buffers);
	rc |= kiln_pack_cstr(pk, "arena_bytes");
	rc |= kiln__graph_pack_dim(g, pk, a->arena_bytes);
	rc |= kiln_pack_cstr(pk, "kernels_text");
	rc |= a->kernels_text != NULL ? kiln_pack_cstr(pk, a->kernels_text)
				      : msgpack_pack_nil(pk);
	return rc ? -ENOMEM : 0;
}
