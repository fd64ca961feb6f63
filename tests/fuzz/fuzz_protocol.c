/*
 * fuzz_protocol.c — libFuzzer target over everything protocol/ decodes from
 * untrusted bytes: frames, the request/response envelope, Graph v1,
 * artifacts, targets, options, signatures in hex.
 *
 * One input is treated four ways:
 *   1. as a byte stream of frames, fed to a kiln_frame_decoder_t in two
 *      pieces split at a position derived from the first byte (byte by byte
 *      for some small inputs), each complete frame decoded as a request and
 *      as a response; a compile request's "graph" is decoded, signed
 *      (structure false and true) and round-tripped through kiln_graph_pack;
 *   2. as a bare Graph v1 (kiln_graph_decode on the raw bytes), with the
 *      same checks when it is valid;
 *   3. as a bare kiln.artifact/1 (kiln_artifact_decode on the raw bytes;
 *      also the "artifact" bin of every response frame), and when valid,
 *      pack -> decode -> pack must give the same bytes;
 *   4. as a bare msgpack object for kiln_msgpack_prescan, checked against
 *      msgpack-c's own unpacker (the guard must never accept what msgpack-c
 *      then reads differently).
 *
 * Findings are whatever the sanitizers report (memory errors, UB, leaks)
 * plus abort() on a broken contract of protocol.h, announced on stderr with
 * "fuzz_protocol: FINDING:". The limits are small so that the fuzzer never
 * runs out of memory on a legitimately large input.
 *
 * Built as a libFuzzer binary (fuzz_protocol, -Dfuzz=enabled, clang) and,
 * with regress_main.c, as the corpus regression test of every build.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((format(printf, 1, 2), noreturn)) static void
finding(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("fuzz_protocol: FINDING: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

static void fuzz_limits(kiln_limits_t *lim)
{
	kiln_limits_default(lim);
	lim->max_frame_bytes = (size_t)1 << 20;
	lim->max_objects = 1u << 16;
	lim->max_nodes = 1u << 12;
	lim->max_values = 1u << 14;
	lim->max_symbols = 256;
}

/* An error detail must be a NUL-terminated string inside its buffer. */
static void check_err(const char *err, size_t errlen, int rc, const char *what)
{
	if (errlen > 0 && memchr(err, '\0', errlen) == NULL)
		finding("%s: error text not NUL-terminated (rc %d)", what, rc);
	if (rc != 0 && kiln_strerror(rc) == NULL)
		finding("%s: kiln_strerror(%d) is NULL", what, rc);
	if (kiln_err_wire_name(rc) == NULL)
		finding("%s: kiln_err_wire_name(%d) is NULL", what, rc);
}

static int sign(const kiln_graph_t *g, const kiln_target_t *t,
		const kiln_compile_opts_t *o, bool structure,
		uint8_t out[KILN_SIG_BYTES], const char *what)
{
	int rc = kiln_signature(g, t, o, "kiln/fuzz llvm/16", structure, out);
	if (rc != 0 && rc != -ENOMEM)
		finding("%s: kiln_signature(structure=%d) of a valid graph "
			"returned %d (%s)",
			what, (int)structure, rc, kiln_strerror(rc));
	return rc;
}

/* Evaluates every size and stride with each symbol at its hint or min.
 * Errors (division by zero, overflow) are allowed; crashes are not. */
static void eval_dims(const kiln_graph_t *g)
{
	int64_t syms[256];
	if (g->n_symbols > 256)
		return;
	for (uint32_t i = 0; i < g->n_symbols; i++)
		syms[i] = g->symbols[i].hint >= 0 ? g->symbols[i].hint
						  : g->symbols[i].min;
	char buf[64];
	for (uint32_t v = 0; v < g->n_values; v++) {
		const kiln_value_t *val = &g->values[v];
		int64_t x;
		if (val->kind == KILN_VAL_SYMINT) {
			(void)kiln_expr_eval(val->sym, syms, &x);
			(void)kiln_expr_format(g, val->sym, buf, sizeof(buf));
			continue;
		}
		if (val->dtype >= KILN_DT__COUNT ||
		    kiln_dtype_name(val->dtype) == NULL)
			finding("value %u: bad dtype %d", v, (int)val->dtype);
		for (uint32_t d = 0; d < val->rank; d++) {
			if (val->sizes[d].e != NULL)
				(void)kiln_expr_eval(val->sizes[d].e, syms, &x);
			if (val->strides[d].e != NULL) {
				(void)kiln_expr_eval(val->strides[d].e, syms,
						     &x);
				(void)kiln_expr_format(g, val->strides[d].e,
						       buf, sizeof(buf));
			}
		}
	}
}

/*
 * The checks on a graph that decoded: signatures, then pack -> decode must
 * give an equal graph (equal signatures, equal counts), and packing that
 * again must give the same bytes.
 */
static void check_graph(const kiln_graph_t *g, const kiln_target_t *t,
			const kiln_compile_opts_t *o, const char *what)
{
	uint8_t sig[KILN_SIG_BYTES], st[KILN_SIG_BYTES];
	uint8_t sig2[KILN_SIG_BYTES], st2[KILN_SIG_BYTES];
	if (sign(g, t, o, false, sig, what) != 0 ||
	    sign(g, t, o, true, st, what) != 0)
		return;
	char hex[KILN_SIG_HEX];
	uint8_t back[KILN_SIG_BYTES];
	kiln_sig_to_hex(sig, hex);
	if (kiln_sig_from_hex(hex, 64, back) != 0 ||
	    memcmp(back, sig, KILN_SIG_BYTES) != 0)
		finding("%s: kiln_sig_from_hex(kiln_sig_to_hex(s)) != s", what);
	eval_dims(g);

	msgpack_sbuffer sb, sb2;
	msgpack_sbuffer_init(&sb);
	msgpack_sbuffer_init(&sb2);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	int rc = kiln_graph_pack(g, &pk);
	if (rc != 0)
		finding("%s: kiln_graph_pack of a valid graph failed: %d (%s)",
			what, rc, kiln_strerror(rc));

	/* Re-decode with the default limits: packing spells out "args",
	 * "kwargs" and "symbols", so it may hold more msgpack objects. */
	kiln_limits_t deflim;
	kiln_limits_default(&deflim);
	kiln_graph_t *g2 = NULL;
	char err[256] = "";
	rc = kiln_graph_decode((const uint8_t *)sb.data, sb.size, &deflim, &g2,
			       err, sizeof(err));
	if (rc == -ENOMEM)
		goto out;
	if (rc != 0)
		finding("%s: kiln_graph_pack output does not decode: %d (%s): "
			"%s",
			what, rc, kiln_strerror(rc), err);
	if (g2->n_inputs != g->n_inputs || g2->n_nodes != g->n_nodes ||
	    g2->n_values != g->n_values || g2->n_outputs != g->n_outputs ||
	    g2->n_symbols != g->n_symbols)
		finding("%s: round trip changed the counts", what);
	if (sign(g2, t, o, false, sig2, what) != 0 ||
	    sign(g2, t, o, true, st2, what) != 0)
		goto out;
	if (memcmp(sig, sig2, KILN_SIG_BYTES) != 0)
		finding("%s: signature changed by pack -> decode", what);
	if (memcmp(st, st2, KILN_SIG_BYTES) != 0)
		finding("%s: structure hash changed by pack -> decode", what);
	msgpack_packer_init(&pk, &sb2, msgpack_sbuffer_write);
	rc = kiln_graph_pack(g2, &pk);
	if (rc != 0)
		finding("%s: kiln_graph_pack of the re-decoded graph failed",
			what);
	if (sb.size != sb2.size || memcmp(sb.data, sb2.data, sb.size) != 0)
		finding("%s: pack(decode(pack(g))) != pack(g)", what);
out:
	kiln_graph_free(g2);
	msgpack_sbuffer_destroy(&sb);
	msgpack_sbuffer_destroy(&sb2);
}

/* An artifact that decoded must survive pack -> decode -> pack unchanged
 * (ARTIFACT.md: the packer always writes every key, in one order). */
static void check_artifact(const uint8_t *p, size_t n, const kiln_limits_t *lim,
			   size_t errlen, const char *what)
{
	kiln_artifact_t *a = NULL, *a2 = NULL;
	char err[256] = "";
	int rc = kiln_artifact_decode(p, n, lim, &a, err, errlen);
	check_err(err, errlen, rc, "artifact_decode");
	if (rc != 0) {
		if (a != NULL)
			finding("%s: kiln_artifact_decode failed but set *out",
				what);
		return;
	}
	msgpack_sbuffer sb, sb2;
	msgpack_sbuffer_init(&sb);
	msgpack_sbuffer_init(&sb2);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	rc = kiln_artifact_pack(a, &pk);
	if (rc != 0)
		finding("%s: kiln_artifact_pack of a valid artifact failed: %d",
			what, rc);
	kiln_limits_t deflim;
	kiln_limits_default(&deflim);
	err[0] = '\0';
	rc = kiln_artifact_decode((const uint8_t *)sb.data, sb.size, &deflim,
				  &a2, err, sizeof(err));
	if (rc == -ENOMEM)
		goto out;
	if (rc != 0)
		finding("%s: kiln_artifact_pack output does not decode: %d "
			"(%s): %s",
			what, rc, kiln_strerror(rc), err);
	if (a2->n_symbols != a->n_symbols || a2->n_inputs != a->n_inputs ||
	    a2->n_kernels != a->n_kernels || a2->n_buffers != a->n_buffers ||
	    a2->n_views != a->n_views || a2->n_steps != a->n_steps ||
	    a2->n_outputs != a->n_outputs || a2->code_len != a->code_len ||
	    a2->cubin_len != a->cubin_len ||
	    a2->n_out_buffers != a->n_out_buffers)
		finding("%s: artifact round trip changed the counts", what);
	msgpack_packer_init(&pk, &sb2, msgpack_sbuffer_write);
	if (kiln_artifact_pack(a2, &pk) != 0)
		finding("%s: kiln_artifact_pack of the re-decoded artifact "
			"failed",
			what);
	if (sb.size != sb2.size || memcmp(sb.data, sb2.data, sb.size) != 0)
		finding("%s: pack(decode(pack(a))) != pack(a)", what);
out:
	kiln_artifact_free(a);
	kiln_artifact_free(a2);
	msgpack_sbuffer_destroy(&sb);
	msgpack_sbuffer_destroy(&sb2);
}

static void compile_request(const kiln_request_t *req, const kiln_limits_t *lim,
			    size_t errlen)
{
	const msgpack_object *graph = kiln_map_get(&req->body, "graph");
	const msgpack_object *tobj = kiln_map_get(&req->body, "target");
	const msgpack_object *oobj = kiln_map_get(&req->body, "options");
	char err[256] = "";
	kiln_target_t target;
	kiln_compile_opts_t opts;
	int dynamic = -2;
	int trc = kiln_target_from_object(tobj, &target, err, errlen);
	check_err(err, errlen, trc, "target");
	if (trc == 0 &&
	    (memchr(target.backend, 0, sizeof(target.backend)) == NULL ||
	     memchr(target.arch, 0, sizeof(target.arch)) == NULL ||
	     memchr(target.features, 0, sizeof(target.features)) == NULL))
		finding("target strings not NUL-terminated");
	int orc = kiln_opts_from_object(oobj, &opts, &dynamic, err, errlen);
	check_err(err, errlen, orc, "options");
	if (orc == 0 && (dynamic < -1 || dynamic > 1 ||
			 memchr(opts.mode, 0, sizeof(opts.mode)) == NULL))
		finding("options decoded out of range");
	if (graph == NULL)
		return;
	kiln_graph_t *g = NULL;
	err[0] = '\0';
	int rc = kiln_graph_from_object(graph, lim, &g, err, errlen);
	check_err(err, errlen, rc, "graph_from_object");
	if (rc != 0) {
		if (g != NULL)
			finding("kiln_graph_from_object failed but set *out");
		return;
	}
	check_graph(g, trc == 0 ? &target : NULL, orc == 0 ? &opts : NULL,
		    "compile request graph");
	kiln_graph_free(g);
}

static void other_fields(const kiln_request_t *req)
{
	const msgpack_object *s = kiln_map_get(&req->body, "signature");
	if (s == NULL || s->type != MSGPACK_OBJECT_STR)
		return;
	uint8_t sig[KILN_SIG_BYTES];
	if (kiln_sig_from_hex(s->via.str.ptr, s->via.str.size, sig) != 0)
		return;
	char hex[KILN_SIG_HEX];
	kiln_sig_to_hex(sig, hex);
	for (int i = 0; i < 64; i++) {
		char c = s->via.str.ptr[i];
		if (c >= 'A' && c <= 'F')
			c = (char)(c - 'A' + 'a');
		if (c != hex[i])
			finding("signature hex does not round-trip");
	}
}

static void one_frame(const uint8_t *body, size_t len, const kiln_limits_t *lim,
		      size_t errlen)
{
	char err[256] = "";
	msgpack_zone zone;
	if (!msgpack_zone_init(&zone, 4096))
		return;
	kiln_request_t req;
	int rc = kiln_request_decode(body, len, lim, &zone, &req, err, errlen);
	check_err(err, errlen, rc, "request_decode");
	if (rc == 0) {
		if (kiln_op_name(req.op) == NULL || !req.has_id)
			finding("decoded request with a bad op or no id");
		(void)kiln_op_is_admin(req.op);
		if (req.op == KILN_OP_COMPILE)
			compile_request(&req, lim, errlen);
		other_fields(&req);
	}
	msgpack_zone_destroy(&zone);

	if (!msgpack_zone_init(&zone, 4096))
		return;
	kiln_response_t res;
	err[0] = '\0';
	rc = kiln_response_decode(body, len, lim, &zone, &res, err, errlen);
	check_err(err, errlen, rc, "response_decode");
	if (rc == 0 && res.ok) {
		const msgpack_object *art = kiln_map_get(&res.body, "artifact");
		if (art != NULL && art->type == MSGPACK_OBJECT_BIN)
			check_artifact((const uint8_t *)art->via.bin.ptr,
				       art->via.bin.size, lim, errlen,
				       "response artifact");
	}
	if (rc == 0 && !res.ok) {
		if (res.err_code == 0 || res.message == NULL ||
		    res.err_name == NULL)
			finding("error response decoded without a code");
		(void)kiln_strerror(res.err_code);
		int back = kiln_err_from_wire_name(
		    kiln_err_wire_name(res.err_code),
		    strlen(kiln_err_wire_name(res.err_code)));
		if (back != res.err_code)
			finding("wire name of %d does not map back",
				res.err_code);
	}
	msgpack_zone_destroy(&zone);
}

/* Feeds p[0..n) to the decoder; returns < 0 once the stream failed. */
static int feed(kiln_frame_decoder_t *d, const uint8_t *p, size_t n,
		const kiln_limits_t *lim, size_t errlen)
{
	for (;;) {
		uint8_t *body = NULL;
		size_t body_len = 0;
		char err[256] = "";
		size_t before = n;
		int rc =
		    kiln_frame_feed(d, &p, &n, &body, &body_len, err, errlen);
		check_err(err, errlen, rc, "frame_feed");
		if (n > before)
			finding("kiln_frame_feed grew *len");
		if (rc == 1) {
			if (body == NULL || body_len == 0 ||
			    body_len > lim->max_frame_bytes)
				finding("frame of %zu bytes returned",
					body_len);
			one_frame(body, body_len, lim, errlen);
			free(body);
			continue;
		}
		if (rc == 0 && n != 0)
			finding("kiln_frame_feed returned 0 with %zu bytes "
				"left",
				n);
		if (rc < 0 && !d->failed && rc != -ENOMEM)
			finding("kiln_frame_feed failed but is not sticky");
		return rc;
	}
}

/* The prescan must agree with msgpack-c on the extent of what it accepts. */
static void prescan_vs_msgpack(const uint8_t *data, size_t size,
			       const kiln_limits_t *lim)
{
	size_t end = 0;
	uint32_t n_objects = 0;
	char err[128] = "";
	int rc = kiln_msgpack_prescan(data, size, lim, &end, &n_objects, err,
				      sizeof(err));
	check_err(err, sizeof(err), rc, "prescan");
	if (rc != 0)
		return;
	if (end == 0 || end > size || n_objects == 0 ||
	    n_objects > lim->max_objects)
		finding("prescan accepted with end %zu of %zu, %u objects", end,
			size, n_objects);
	msgpack_zone zone;
	if (!msgpack_zone_init(&zone, 4096))
		return;
	msgpack_object obj;
	size_t off = 0;
	msgpack_unpack_return r =
	    msgpack_unpack((const char *)data, end, &off, &zone, &obj);
	if (r != MSGPACK_UNPACK_NOMEM_ERROR &&
	    (r != MSGPACK_UNPACK_SUCCESS || off != end))
		finding("prescan accepted %zu bytes, msgpack_unpack returned "
			"%d at offset %zu",
			end, (int)r, off);
	msgpack_zone_destroy(&zone);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_limits_t lim;
	fuzz_limits(&lim);
	/* A short error buffer now and then exercises truncation. */
	size_t errlen = size % 5 == 0 ? 7 : 256;

	/* 1. frames */
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, lim.max_frame_bytes);
	if (size > 0 && size < 2048 && data[0] % 7 == 3) {
		for (size_t i = 0; i < size; i++)
			if (feed(&d, data + i, 1, &lim, errlen) < 0)
				break;
	} else {
		size_t split =
		    size == 0 ? 0 : ((size_t)data[0] * 131 + size) % (size + 1);
		if (feed(&d, data, split, &lim, errlen) >= 0)
			(void)feed(&d, data + split, size - split, &lim,
				   errlen);
	}
	kiln_frame_decoder_free(&d);

	/* 2. a bare Graph v1 */
	kiln_graph_t *g = NULL;
	char err[256] = "";
	int rc = kiln_graph_decode(data, size, &lim, &g, err, errlen);
	check_err(err, errlen, rc, "graph_decode");
	if (rc == 0) {
		check_graph(g, NULL, NULL, "raw graph");
		kiln_graph_free(g);
	} else if (g != NULL) {
		finding("kiln_graph_decode failed but set *out");
	}

	/* 3. a bare artifact */
	check_artifact(data, size, &lim, errlen, "raw artifact");

	/* 4. the msgpack guard */
	prescan_vs_msgpack(data, size, &lim);
	return 0;
}
