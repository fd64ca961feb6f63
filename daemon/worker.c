/*
 * worker.c — kiln-compile-worker: the process in which kilnd's compiles
 * run. kilnd starts one per compile thread when it first needs it, talks to
 * it over its stdin/stdout, and closes its stdin when it has been idle a
 * while (the process then exits and LLVM's memory goes with it).
 *
 * Why a process: LLVM is ~50 MB of resident code and static state that the
 * daemon's idle footprint should not carry, and an LLVM crash or assertion
 * in a compile must cost that compile, not the daemon and every client.
 *
 * Protocol (frames as in PROTOCOL.md: u32 big-endian length, one msgpack
 * map):
 *   worker → kilnd, once at start:
 *     {"fingerprint": str, "target": {"backend","arch","features"}}
 *     or {"error": str} (then exit 1)
 *   kilnd → worker: {"graph": Graph v1 map, "mode": str}
 *   worker → kilnd: {"ok": true, "artifact": bin, "compile_ms": float}
 *                 | {"ok": false, "code": int, "message": str}
 * EOF on stdin: exit 0.
 *
 * Threads: one; one compile at a time.
 */
#include "compiler/compiler.h"
#include "protocol/protocol.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int read_all(int fd, void *p, size_t n)
{
	uint8_t *b = p;
	while (n > 0) {
		ssize_t r = read(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int send_frame(msgpack_sbuffer *sb)
{
	if (kiln_frame_end(sb, SIZE_MAX) < 0)
		return -1;
	return write_all(1, sb->data, sb->size);
}

static void pack_str(msgpack_packer *pk, const char *k, const char *v)
{
	kiln_pack_cstr(pk, k);
	kiln_pack_cstr(pk, v);
}

static int reply_error(int code, const char *msg)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	msgpack_pack_map(&pk, 3);
	kiln_pack_cstr(&pk, "ok");
	msgpack_pack_false(&pk);
	kiln_pack_cstr(&pk, "code");
	msgpack_pack_int(&pk, code);
	pack_str(&pk, "message", msg);
	int rc = send_frame(&sb);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

static int compile_one(kiln_compiler_t *cc, const uint8_t *body, size_t len,
		       const kiln_limits_t *lim)
{
	char err[1024] = "";
	msgpack_zone zone;
	msgpack_zone_init(&zone, 4096);
	msgpack_object req;
	int rc = kiln_msgpack_unpack_map(body, len, lim, &zone, &req, err,
					 sizeof(err));
	kiln_graph_t *g = NULL;
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	snprintf(opts.mode, sizeof(opts.mode), "default");
	char sig[KILN_SIG_HEX] = "";
	if (rc == 0) {
		const msgpack_object *so = kiln_map_get(&req, "signature");
		if (so != NULL && so->type == MSGPACK_OBJECT_STR &&
		    so->via.str.size < sizeof(sig)) {
			memcpy(sig, so->via.str.ptr, so->via.str.size);
			sig[so->via.str.size] = '\0';
		}
		const msgpack_object *m = kiln_map_get(&req, "mode");
		if (m != NULL && m->type == MSGPACK_OBJECT_STR &&
		    m->via.str.size < sizeof(opts.mode)) {
			memcpy(opts.mode, m->via.str.ptr, m->via.str.size);
			opts.mode[m->via.str.size] = '\0';
		}
		const msgpack_object *go = kiln_map_get(&req, "graph");
		rc = go != NULL
			 ? kiln_graph_from_object(go, lim, &g, err, sizeof(err))
			 : kiln__errf(err, sizeof(err), KILN_EBADREQ,
				      "no graph");
	}
	msgpack_zone_destroy(&zone);
	if (rc < 0)
		return reply_error(rc, err);
	kiln_artifact_t *art = NULL;
	kiln_compile_stats_t st;
	memset(&st, 0, sizeof(st));
	rc = kiln_compile(cc, g, &opts, &art, &st, err, sizeof(err));
	kiln_graph_free(g);
	if (rc < 0)
		return reply_error(rc, err);
	if (sig[0] != '\0')
		snprintf(art->signature, sizeof(art->signature), "%s", sig);
	msgpack_sbuffer ab;
	msgpack_sbuffer_init(&ab);
	msgpack_packer apk;
	msgpack_packer_init(&apk, &ab, msgpack_sbuffer_write);
	rc = kiln_artifact_pack(art, &apk);
	kiln_artifact_free(art);
	if (rc < 0) {
		msgpack_sbuffer_destroy(&ab);
		return reply_error(KILN_EINTERNAL,
				   "cannot encode the artifact");
	}
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	msgpack_pack_map(&pk, 4);
	kiln_pack_cstr(&pk, "ok");
	msgpack_pack_true(&pk);
	kiln_pack_cstr(&pk, "compile_ms");
	msgpack_pack_double(&pk, st.total_ms);
	kiln_pack_cstr(&pk, "sym_fallbacks");
	msgpack_pack_uint32(&pk, st.n_sym_fallbacks);
	kiln_pack_cstr(&pk, "artifact");
	msgpack_pack_bin(&pk, ab.size);
	msgpack_pack_bin_body(&pk, ab.data, ab.size);
	msgpack_sbuffer_destroy(&ab);
	rc = send_frame(&sb);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	kiln_log_level = KILN_LOG_WARN;
	char err[1024] = "";
	kiln_compiler_t *cc = NULL;
	int rc = kiln_compiler_new(NULL, &cc, err, sizeof(err));
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	if (rc < 0) {
		msgpack_pack_map(&pk, 1);
		pack_str(&pk, "error", err);
		send_frame(&sb);
		return 1;
	}
	const kiln_target_t *t = kiln_compiler_target(cc);
	msgpack_pack_map(&pk, 2);
	pack_str(&pk, "fingerprint", kiln_compiler_fingerprint(cc));
	kiln_pack_cstr(&pk, "target");
	msgpack_pack_map(&pk, 3);
	pack_str(&pk, "backend", t->backend);
	pack_str(&pk, "arch", t->arch);
	pack_str(&pk, "features", t->features);
	if (send_frame(&sb) < 0)
		return 1;
	msgpack_sbuffer_destroy(&sb);

	kiln_limits_t lim;
	kiln_limits_default(&lim);
	/* kilnd checked the request against its own limits already. */
	lim.max_frame_bytes = SIZE_MAX / 2;
	lim.max_objects = UINT32_MAX / 2;
	lim.max_nodes = UINT32_MAX / 2;
	lim.max_values = UINT32_MAX / 2;
	for (;;) {
		uint8_t hdr[4];
		if (read_all(0, hdr, 4) < 0)
			break; /* kilnd closed our stdin: done */
		size_t n = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 |
			   (size_t)hdr[2] << 8 | hdr[3];
		uint8_t *body = malloc(n > 0 ? n : 1);
		if (body == NULL || read_all(0, body, n) < 0) {
			free(body);
			return 1;
		}
		rc = compile_one(cc, body, n, &lim);
		free(body);
		if (rc < 0)
			return 1;
	}
	kiln_compiler_free(cc);
	return 0;
}
