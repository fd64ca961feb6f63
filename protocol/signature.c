/*
 * signature.c — the canonical encoding of (graph, target, options,
 * fingerprint) and its SHA-256; the structure hash; target/options codecs.
 *
 * The canonical encoding is specified in PROTOCOL.md § Signature. It is
 * streamed straight into the digest (no buffer of the whole encoding), so
 * its cost is one walk of the graph plus SHA-256 of a few bytes per value.
 *
 * What makes it canonical: it is produced from the decoded graph, never from
 * the wire bytes, so map key order, int widths (msgpack-c packs the
 * smallest form), float widths (always f64), input names and unknown keys
 * cannot change it; kwargs are sorted; symbols are renumbered in order of
 * first use. Pure functions; any thread.
 */
#include "protocol/internal.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

typedef struct sigw {
	EVP_MD_CTX *md;
	int failed;
	size_t len;
	unsigned char buf[8192];
	/* symbol renumbering */
	int32_t *canon; /* graph symbol index -> canonical index or -1 */
	uint32_t next_canon;
	bool structure;
} sigw_t;

/* The canonical bytes are msgpack in its shortest forms (exactly what
 * msgpack-c's packer writes), produced by these small writers straight into
 * a buffer that feeds the digest: one walk of the graph, no per-token
 * callback. */
static void cw_flush(sigw_t *w)
{
	if (w->len > 0 && !EVP_DigestUpdate(w->md, w->buf, w->len))
		w->failed = 1;
	w->len = 0;
}

static inline uint8_t *cw_room(sigw_t *w, size_t n)
{
	if (w->len + n > sizeof(w->buf))
		cw_flush(w);
	return w->buf + w->len;
}

static inline void cw_raw(sigw_t *w, const void *p, size_t n)
{
	if (n > sizeof(w->buf) / 2) {
		cw_flush(w);
		if (!EVP_DigestUpdate(w->md, p, n))
			w->failed = 1;
		return;
	}
	memcpy(cw_room(w, n), p, n);
	w->len += n;
}

static inline void cw_be(uint8_t *b, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		b[i] = (uint8_t)v;
}

static inline void cw_tag(sigw_t *w, uint8_t tag, uint64_t v, int n)
{
	uint8_t *b = cw_room(w, 9);
	b[0] = tag;
	cw_be(b + 1, v, n);
	w->len += 1 + (size_t)n;
}

static inline void cw_byte(sigw_t *w, uint8_t v)
{
	*cw_room(w, 1) = v;
	w->len++;
}

static void cw_int64(sigw_t *w, int64_t d)
{
	if (d < -(1 << 5)) {
		if (d < -(1 << 15)) {
			if (d < -(1LL << 31))
				cw_tag(w, 0xd3, (uint64_t)d, 8);
			else
				cw_tag(w, 0xd2, (uint64_t)(uint32_t)d, 4);
		} else if (d < -(1 << 7)) {
			cw_tag(w, 0xd1, (uint64_t)(uint16_t)d, 2);
		} else {
			cw_tag(w, 0xd0, (uint64_t)(uint8_t)d, 1);
		}
	} else if (d < (1 << 7)) {
		cw_byte(w, (uint8_t)d);
	} else if (d < (1 << 16)) {
		if (d < (1 << 8))
			cw_tag(w, 0xcc, (uint64_t)d, 1);
		else
			cw_tag(w, 0xcd, (uint64_t)d, 2);
	} else if (d < (1LL << 32)) {
		cw_tag(w, 0xce, (uint64_t)d, 4);
	} else {
		cw_tag(w, 0xcf, (uint64_t)d, 8);
	}
}

static void cw_double(sigw_t *w, double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	cw_tag(w, 0xcb, u, 8);
}

static void cw_array(sigw_t *w, uint32_t n)
{
	if (n < 16)
		cw_byte(w, (uint8_t)(0x90 | n));
	else if (n < 65536)
		cw_tag(w, 0xdc, n, 2);
	else
		cw_tag(w, 0xdd, n, 4);
}

static void cw_map(sigw_t *w, uint32_t n)
{
	if (n < 16)
		cw_byte(w, (uint8_t)(0x80 | n));
	else if (n < 65536)
		cw_tag(w, 0xde, n, 2);
	else
		cw_tag(w, 0xdf, n, 4);
}

static void cw_str(sigw_t *w, const char *s, size_t n)
{
	if (n < 32)
		cw_byte(w, (uint8_t)(0xa0 | n));
	else if (n < 256)
		cw_tag(w, 0xd9, n, 1);
	else if (n < 65536)
		cw_tag(w, 0xda, n, 2);
	else
		cw_tag(w, 0xdb, n, 4);
	cw_raw(w, s, n);
}

static void cw_cstr(sigw_t *w, const char *s)
{
	cw_str(w, s, strlen(s));
}

static void canon_expr(sigw_t *w, const kiln_expr_t *e)
{
	switch (e->kind) {
	case KILN_EX_CONST: cw_int64(w, e->c); return;
	case KILN_EX_SYM:
		if (w->canon[e->sym] < 0)
			w->canon[e->sym] = (int32_t)w->next_canon++;
		cw_map(w, 1);
		cw_cstr(w, "y");
		cw_int64(w, w->canon[e->sym]);
		return;
	case KILN_EX_NEG:
		cw_array(w, 2);
		cw_int64(w, (int32_t)e->kind);
		canon_expr(w, e->a);
		return;
	default:
		cw_array(w, 3);
		cw_int64(w, (int32_t)e->kind);
		canon_expr(w, e->a);
		canon_expr(w, e->b);
		return;
	}
}

static void canon_dim(sigw_t *w, kiln_dim_t d)
{
	if (w->structure)
		cw_byte(w, 0xc0);
	else if (d.e == NULL)
		cw_int64(w, d.c);
	else
		canon_expr(w, d.e);
}

static void canon_value(sigw_t *w, const kiln_value_t *v)
{
	if (v->kind == KILN_VAL_SYMINT) {
		cw_array(w, 2);
		cw_cstr(w, "symint");
		if (w->structure)
			cw_byte(w, 0xc0);
		else
			canon_expr(w, v->sym);
		return;
	}
	cw_array(w, 3);
	cw_cstr(w, kiln_dtype_name(v->dtype));
	cw_array(w, v->rank);
	for (uint32_t i = 0; i < v->rank; i++)
		canon_dim(w, v->sizes[i]);
	cw_array(w, v->rank);
	for (uint32_t i = 0; i < v->rank; i++)
		canon_dim(w, v->strides[i]);
}

static void canon_arg(sigw_t *w, const kiln_arg_t *a)
{
	switch (a->kind) {
	case KILN_ARG_NIL: cw_byte(w, 0xc0); return;
	case KILN_ARG_BOOL:
		if (a->u.b)
			cw_byte(w, 0xc3);
		else
			cw_byte(w, 0xc2);
		return;
	case KILN_ARG_INT:
		if (w->structure) {
			cw_map(w, 1);
			cw_cstr(w, "i");
			cw_byte(w, 0xc0);
		} else {
			cw_int64(w, a->u.i);
		}
		return;
	case KILN_ARG_FLOAT: {
		/* One encoding per value: -0.0 and 0.0 differ (torch keeps
		 * the sign), f32 on the wire was widened exactly. */
		cw_double(w, a->u.f);
		return;
	}
	case KILN_ARG_STR: cw_str(w, a->u.s, a->n); return;
	case KILN_ARG_LIST:
		cw_array(w, a->n);
		for (uint32_t i = 0; i < a->n; i++)
			canon_arg(w, &a->u.list[i]);
		return;
	case KILN_ARG_REF:
		cw_map(w, 1);
		cw_cstr(w, "r");
		cw_int64(w, a->u.ref);
		return;
	case KILN_ARG_SYM:
		cw_map(w, 1);
		cw_cstr(w, "s");
		if (w->structure)
			cw_byte(w, 0xc0);
		else
			canon_expr(w, a->u.sym);
		return;
	}
}

static int sym_cmp(const void *x, const void *y)
{
	const kiln_symbol_t *a = *(const kiln_symbol_t *const *)x;
	const kiln_symbol_t *b = *(const kiln_symbol_t *const *)y;
	if (a->min != b->min)
		return a->min < b->min ? -1 : 1;
	if (a->max != b->max)
		return a->max < b->max ? -1 : 1;
	return 0;
}

int kiln_signature(const kiln_graph_t *g, const kiln_target_t *target,
		   const kiln_compile_opts_t *opts, const char *fingerprint,
		   bool structure, uint8_t out[KILN_SIG_BYTES])
{
	sigw_t *w = malloc(sizeof(*w));
	if (w == NULL)
		return -ENOMEM;
	w->md = EVP_MD_CTX_new();
	w->canon = malloc(sizeof(int32_t) * (g->n_symbols ? g->n_symbols : 1));
	if (w->md == NULL || w->canon == NULL ||
	    !EVP_DigestInit_ex(w->md, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(w->md);
		free(w->canon);
		free(w);
		return -ENOMEM;
	}
	w->failed = 0;
	w->len = 0;
	w->next_canon = 0;
	w->structure = structure;
	for (uint32_t i = 0; i < g->n_symbols; i++)
		w->canon[i] = -1;

	cw_array(w, 6);
	cw_cstr(w, structure ? "kiln.struct/1" : "kiln.sig/1");

	/* graph: [inputs, nodes, outputs, symbols] */
	cw_array(w, 4);
	cw_array(w, g->n_inputs);
	for (uint32_t i = 0; i < g->n_inputs; i++)
		canon_value(w, &g->values[i]);
	cw_array(w, g->n_nodes);
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const kiln_node_t *n = &g->nodes[i];
		cw_array(w, 4);
		cw_cstr(w, n->op);
		cw_array(w, n->n_args);
		for (uint32_t k = 0; k < n->n_args; k++)
			canon_arg(w, &n->args[k]);
		cw_array(w, n->n_kwargs);
		for (uint32_t k = 0; k < n->n_kwargs; k++) {
			cw_array(w, 2);
			cw_cstr(w, n->kwargs[k].key);
			canon_arg(w, &n->kwargs[k].val);
		}
		cw_array(w, n->n_out);
		for (uint32_t k = 0; k < n->n_out; k++)
			canon_value(w, &g->values[n->out_first + k]);
	}
	cw_array(w, g->n_outputs);
	for (uint32_t i = 0; i < g->n_outputs; i++)
		canon_arg(w, &g->outputs[i]);

	/* symbols: used ones in order of first use, then unused ones sorted
	 * by their bounds (names never enter). Erased in the structure hash. */
	if (structure) {
		cw_array(w, 0);
	} else {
		const kiln_symbol_t **order =
		    calloc(g->n_symbols ? g->n_symbols : 1, sizeof(*order));
		if (order == NULL) {
			EVP_MD_CTX_free(w->md);
			free(w->canon);
			free(w);
			return -ENOMEM;
		}
		uint32_t n_used = w->next_canon, n_unused = 0;
		for (uint32_t i = 0; i < g->n_symbols; i++) {
			if (w->canon[i] >= 0)
				order[w->canon[i]] = &g->symbols[i];
			else
				order[n_used + n_unused++] = &g->symbols[i];
		}
		qsort(order + n_used, n_unused, sizeof(*order), sym_cmp);
		cw_array(w, g->n_symbols);
		for (uint32_t i = 0; i < g->n_symbols; i++) {
			cw_array(w, 2);
			cw_int64(w, order[i]->min);
			if (order[i]->max >= 0)
				cw_int64(w, order[i]->max);
			else
				cw_byte(w, 0xc0);
		}
		free(order);
	}

	/* target, options, fingerprint */
	cw_array(w, 3);
	cw_cstr(w, target != NULL ? target->backend : "");
	cw_cstr(w, target != NULL ? target->arch : "");
	cw_cstr(w, target != NULL ? target->features : "");
	cw_array(w, 1);
	cw_cstr(w, opts != NULL && opts->mode[0] ? opts->mode : "default");
	cw_cstr(w, fingerprint != NULL ? fingerprint : "");
	cw_int64(w, KILN_PROTOCOL_VERSION);

	unsigned int olen = 0;
	if (w->len > 0 && !EVP_DigestUpdate(w->md, w->buf, w->len))
		w->failed = 1;
	if (!EVP_DigestFinal_ex(w->md, out, &olen) || olen != KILN_SIG_BYTES)
		w->failed = 1;
	int rc = w->failed ? KILN_EINTERNAL : 0;
	EVP_MD_CTX_free(w->md);
	free(w->canon);
	free(w);
	return rc;
}

void kiln_sig_to_hex(const uint8_t sig[KILN_SIG_BYTES], char out[KILN_SIG_HEX])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < KILN_SIG_BYTES; i++) {
		out[2 * i] = hex[sig[i] >> 4];
		out[2 * i + 1] = hex[sig[i] & 15];
	}
	out[2 * KILN_SIG_BYTES] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kiln_sig_from_hex(const char *hex, size_t len, uint8_t out[KILN_SIG_BYTES])
{
	if (len != 2 * KILN_SIG_BYTES)
		return KILN_EBADREQ;
	for (int i = 0; i < KILN_SIG_BYTES; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return KILN_EBADREQ;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

static int copy_str(const msgpack_object *o, char *dst, size_t cap,
		    const char *what, char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "target \"%s\" must be a string", what);
	if (o->via.str.size >= cap)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "target \"%s\" longer than %zu bytes", what,
				  cap - 1);
	memcpy(dst, o->via.str.ptr, o->via.str.size);
	dst[o->via.str.size] = '\0';
	if (memchr(dst, '\0', o->via.str.size) != NULL)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "target \"%s\" contains NUL", what);
	return 0;
}

int kiln_target_from_object(const msgpack_object *o, kiln_target_t *t,
			    char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	if (o == NULL || o->type != MSGPACK_OBJECT_MAP)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"target\" must be a map");
	const msgpack_object *b = kiln_map_get(o, "backend");
	const msgpack_object *a = kiln_map_get(o, "arch");
	const msgpack_object *f = kiln_map_get(o, "features");
	if (b == NULL)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "target needs \"backend\"");
	int rc =
	    copy_str(b, t->backend, sizeof(t->backend), "backend", err, errlen);
	if (rc == 0 && a != NULL && a->type != MSGPACK_OBJECT_NIL)
		rc = copy_str(a, t->arch, sizeof(t->arch), "arch", err, errlen);
	if (rc == 0 && f != NULL && f->type != MSGPACK_OBJECT_NIL)
		rc = copy_str(f, t->features, sizeof(t->features), "features",
			      err, errlen);
	if (rc != 0)
		return rc;
	if (strcmp(t->backend, "cpu") == 0)
		return 0;
	if (strcmp(t->backend, "cuda") == 0) {
		const char *s = t->arch;
		bool ok =
		    strncmp(s, "sm_", 3) == 0 && s[3] >= '1' && s[3] <= '9';
		for (size_t i = 4; ok && s[i] != '\0'; i++)
			ok = (s[i] >= '0' && s[i] <= '9') ||
			     (s[i + 1] == '\0' && s[i] == 'a');
		if (!ok)
			return kiln__errf(err, errlen, KILN_EBADREQ,
					  "cuda target needs \"arch\" like "
					  "\"sm_90\"");
		return 0;
	}
	return kiln__errf(err, errlen, KILN_EBADREQ,
			  "unknown backend \"%s\" (cpu or cuda)", t->backend);
}

int kiln_opts_from_object(const msgpack_object *o, kiln_compile_opts_t *opts,
			  int *dynamic, char *err, size_t errlen)
{
	memset(opts, 0, sizeof(*opts));
	strcpy(opts->mode, "default");
	*dynamic = -1;
	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type != MSGPACK_OBJECT_MAP)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"options\" must be a map");
	const msgpack_object *m = kiln_map_get(o, "mode");
	if (m != NULL && m->type != MSGPACK_OBJECT_NIL) {
		if (kiln_obj_streq(m, "default") ||
		    kiln_obj_streq(m, "reduce-overhead") ||
		    kiln_obj_streq(m, "max-autotune")) {
			memcpy(opts->mode, m->via.str.ptr, m->via.str.size);
			opts->mode[m->via.str.size] = '\0';
		} else {
			return kiln__errf(err, errlen, KILN_EBADREQ,
					  "\"mode\" must be \"default\", "
					  "\"reduce-overhead\" or "
					  "\"max-autotune\"");
		}
	}
	const msgpack_object *d = kiln_map_get(o, "dynamic");
	if (d != NULL && d->type != MSGPACK_OBJECT_NIL) {
		if (d->type != MSGPACK_OBJECT_BOOLEAN)
			return kiln__errf(err, errlen, KILN_EBADREQ,
					  "\"dynamic\" must be null, true or "
					  "false");
		*dynamic = d->via.boolean ? 1 : 0;
	}
	return 0;
}
