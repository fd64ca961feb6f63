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
	unsigned char buf[4096];
	/* symbol renumbering */
	int32_t *canon; /* graph symbol index -> canonical index or -1 */
	uint32_t next_canon;
	bool structure;
} sigw_t;

static int sig_write(void *data, const char *p, size_t n)
{
	sigw_t *w = data;
	if (n >= sizeof(w->buf)) {
		if (w->len > 0 && !EVP_DigestUpdate(w->md, w->buf, w->len))
			w->failed = 1;
		w->len = 0;
		if (!EVP_DigestUpdate(w->md, p, n))
			w->failed = 1;
		return 0;
	}
	if (w->len + n > sizeof(w->buf)) {
		if (!EVP_DigestUpdate(w->md, w->buf, w->len))
			w->failed = 1;
		w->len = 0;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void canon_expr(sigw_t *w, msgpack_packer *pk, const kiln_expr_t *e)
{
	switch (e->kind) {
	case KILN_EX_CONST: msgpack_pack_int64(pk, e->c); return;
	case KILN_EX_SYM:
		if (w->canon[e->sym] < 0)
			w->canon[e->sym] = (int32_t)w->next_canon++;
		msgpack_pack_map(pk, 1);
		pack_str(pk, "y");
		msgpack_pack_int32(pk, w->canon[e->sym]);
		return;
	case KILN_EX_NEG:
		msgpack_pack_array(pk, 2);
		msgpack_pack_int32(pk, (int32_t)e->kind);
		canon_expr(w, pk, e->a);
		return;
	default:
		msgpack_pack_array(pk, 3);
		msgpack_pack_int32(pk, (int32_t)e->kind);
		canon_expr(w, pk, e->a);
		canon_expr(w, pk, e->b);
		return;
	}
}

static void canon_dim(sigw_t *w, msgpack_packer *pk, kiln_dim_t d)
{
	if (w->structure)
		msgpack_pack_nil(pk);
	else if (d.e == NULL)
		msgpack_pack_int64(pk, d.c);
	else
		canon_expr(w, pk, d.e);
}

static void canon_value(sigw_t *w, msgpack_packer *pk, const kiln_value_t *v)
{
	if (v->kind == KILN_VAL_SYMINT) {
		msgpack_pack_array(pk, 2);
		pack_str(pk, "symint");
		if (w->structure)
			msgpack_pack_nil(pk);
		else
			canon_expr(w, pk, v->sym);
		return;
	}
	msgpack_pack_array(pk, 3);
	pack_str(pk, kiln_dtype_name(v->dtype));
	msgpack_pack_array(pk, v->rank);
	for (uint32_t i = 0; i < v->rank; i++)
		canon_dim(w, pk, v->sizes[i]);
	msgpack_pack_array(pk, v->rank);
	for (uint32_t i = 0; i < v->rank; i++)
		canon_dim(w, pk, v->strides[i]);
}

static void canon_arg(sigw_t *w, msgpack_packer *pk, const kiln_arg_t *a)
{
	switch (a->kind) {
	case KILN_ARG_NIL: msgpack_pack_nil(pk); return;
	case KILN_ARG_BOOL:
		if (a->u.b)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		return;
	case KILN_ARG_INT:
		if (w->structure) {
			msgpack_pack_map(pk, 1);
			pack_str(pk, "i");
			msgpack_pack_nil(pk);
		} else {
			msgpack_pack_int64(pk, a->u.i);
		}
		return;
	case KILN_ARG_FLOAT: {
		/* One encoding per value: -0.0 and 0.0 differ (torch keeps
		 * the sign), f32 on the wire was widened exactly. */
		msgpack_pack_double(pk, a->u.f);
		return;
	}
	case KILN_ARG_STR: msgpack_pack_str_with_body(pk, a->u.s, a->n); return;
	case KILN_ARG_LIST:
		msgpack_pack_array(pk, a->n);
		for (uint32_t i = 0; i < a->n; i++)
			canon_arg(w, pk, &a->u.list[i]);
		return;
	case KILN_ARG_REF:
		msgpack_pack_map(pk, 1);
		pack_str(pk, "r");
		msgpack_pack_uint32(pk, a->u.ref);
		return;
	case KILN_ARG_SYM:
		msgpack_pack_map(pk, 1);
		pack_str(pk, "s");
		if (w->structure)
			msgpack_pack_nil(pk);
		else
			canon_expr(w, pk, a->u.sym);
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

	msgpack_packer pk;
	msgpack_packer_init(&pk, w, sig_write);
	msgpack_pack_array(&pk, 6);
	pack_str(&pk, structure ? "kiln.struct/1" : "kiln.sig/1");

	/* graph: [inputs, nodes, outputs, symbols] */
	msgpack_pack_array(&pk, 4);
	msgpack_pack_array(&pk, g->n_inputs);
	for (uint32_t i = 0; i < g->n_inputs; i++)
		canon_value(w, &pk, &g->values[i]);
	msgpack_pack_array(&pk, g->n_nodes);
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const kiln_node_t *n = &g->nodes[i];
		msgpack_pack_array(&pk, 4);
		pack_str(&pk, n->op);
		msgpack_pack_array(&pk, n->n_args);
		for (uint32_t k = 0; k < n->n_args; k++)
			canon_arg(w, &pk, &n->args[k]);
		msgpack_pack_array(&pk, n->n_kwargs);
		for (uint32_t k = 0; k < n->n_kwargs; k++) {
			msgpack_pack_array(&pk, 2);
			pack_str(&pk, n->kwargs[k].key);
			canon_arg(w, &pk, &n->kwargs[k].val);
		}
		msgpack_pack_array(&pk, n->n_out);
		for (uint32_t k = 0; k < n->n_out; k++)
			canon_value(w, &pk, &g->values[n->out_first + k]);
	}
	msgpack_pack_array(&pk, g->n_outputs);
	for (uint32_t i = 0; i < g->n_outputs; i++)
		canon_arg(w, &pk, &g->outputs[i]);

	/* symbols: used ones in order of first use, then unused ones sorted
	 * by their bounds (names never enter). Erased in the structure hash. */
	if (structure) {
		msgpack_pack_array(&pk, 0);
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
		msgpack_pack_array(&pk, g->n_symbols);
		for (uint32_t i = 0; i < g->n_symbols; i++) {
			msgpack_pack_array(&pk, 2);
			msgpack_pack_int64(&pk, order[i]->min);
			if (order[i]->max >= 0)
				msgpack_pack_int64(&pk, order[i]->max);
			else
				msgpack_pack_nil(&pk);
		}
		free(order);
	}

	/* target, options, fingerprint */
	msgpack_pack_array(&pk, 3);
	pack_str(&pk, target != NULL ? target->backend : "");
	pack_str(&pk, target != NULL ? target->arch : "");
	pack_str(&pk, target != NULL ? target->features : "");
	msgpack_pack_array(&pk, 1);
	pack_str(&pk, opts != NULL && opts->mode[0] ? opts->mode : "default");
	pack_str(&pk, fingerprint != NULL ? fingerprint : "");
	msgpack_pack_uint32(&pk, KILN_PROTOCOL_VERSION);

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
