/*
 * test_client.c — libkiln's kilnd client (kiln.h § 4) against a real kilnd:
 * every call and its errors, the in-process cache, timeouts, reconnecting
 * after a restart, one handle shared by 8 threads, compile-and-load-and-run
 * on the corpus's inputs. Auto-start is in test_autostart.c.
 *
 * Each test starts its own kilnd (helpers.h) on a socket in a fresh
 * temporary directory, with its own store.
 */
#include "helpers.h"
#include "tests/common/testdata.h"

#include <poll.h>
#include <pthread.h>

TestSuite(client, .init = tk_setup, .fini = tk_teardown, .timeout = 300);

static void sock_store(char *sock, char *store)
{
	tk_path(sock, "%s/run/kilnd.sock", tk_dir);
	tk_path(store, "%s/store", tk_dir);
}

static bool is_hex64(const char *s)
{
	if (strlen(s) != 64)
		return false;
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') ||
		      (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* Unpacks a reply from kiln_client_call; the caller destroys the zone. */
static msgpack_object unpack_reply(const uint8_t *p, size_t n,
				   msgpack_zone *zone)
{
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	msgpack_object o;
	char err[256] = "";
	int rc =
	    kiln_msgpack_unpack_map(p, n, &lim, zone, &o, err, sizeof(err));
	cr_assert_eq(rc, 0, "reply: %s", err);
	const msgpack_object *ok = kiln_map_get(&o, "ok");
	cr_assert(ok != NULL && ok->type == MSGPACK_OBJECT_BOOLEAN &&
		  ok->via.boolean);
	return o;
}

/* ---- no daemon ------------------------------------------------------------
 */

Test(client, no_daemon)
{
	char sock[256], err[512] = "";
	kiln_client_t *c = (kiln_client_t *)1;
	kiln_client_opts_t o;

	/* Nothing at the path: -ENOENT, and err names the path. */
	tk_path(sock, "%s/none/kilnd.sock", tk_dir);
	o = tk_opts(sock, true);
	int rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	cr_assert_null(c);
	cr_assert_not_null(strstr(err, sock), "err: %s", err);

	/* A socket file nobody listens on (a dead kilnd's): -ECONNREFUSED. */
	tk_path(sock, "%s/dead.sock", tk_dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	cr_assert_lt(strlen(sock), sizeof(sa.sun_path));
	memcpy(sa.sun_path, sock, strlen(sock));
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd);
	o = tk_opts(sock, true);
	err[0] = '\0';
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ECONNREFUSED, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, sock), "err: %s", err);

	/* Auto-start is never tried for the system socket. */
	o = tk_opts("/run/kiln/kiln-test-none/kilnd.sock", true);
	o.autostart = 1;
	err[0] = '\0';
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert(rc == -ENOENT || rc == -ECONNREFUSED, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "system socket"), "err: %s", err);

	/* $KILN_AUTOSTART=0 turns the default (-1) off. */
	tk_path(sock, "%s/none2/kilnd.sock", tk_dir);
	o = tk_opts(sock, true);
	o.autostart = -1;
	setenv("KILN_AUTOSTART", "0", 1);
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	unsetenv("KILN_AUTOSTART");

	/* Discovery: $KILN_SOCKET first, then (not root) $XDG_RUNTIME_DIR. */
	tk_path(sock, "%s/env/kilnd.sock", tk_dir);
	setenv("KILN_SOCKET", sock, 1);
	o = tk_opts(NULL, true);
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, sock), "err: %s", err);
	unsetenv("KILN_SOCKET");
	char xdg[256], want[300];
	tk_path(xdg, "%s/xdg", tk_dir);
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	if (geteuid() == 0)
		snprintf(want, sizeof(want), "/run/kiln/kilnd.sock");
	else
		snprintf(want, sizeof(want), "%s/kiln/kilnd.sock", xdg);
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	if (rc == 0) { /* a system kilnd runs on this machine */
		cr_assert_str_eq(kiln_client_socket(c), want);
		kiln_client_free(c);
	} else {
		cr_assert_not_null(strstr(err, want), "err: %s", err);
	}

	/* Arguments. */
	cr_assert_eq(kiln_client_connect(&o, NULL, err, sizeof(err)), -EINVAL);
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	o = tk_opts(longp, true);
	cr_assert_eq(kiln_client_connect(&o, &c, err, sizeof(err)),
		     -ENAMETOOLONG);
	kiln_client_free(NULL);
	kiln_result_free(NULL);
}

/* ---- hello ----------------------------------------------------------------
 */

Test(client, hello)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	cr_assert_str_eq(kiln_client_socket(c), sock);
	kiln_server_info_t in, in2;
	int rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(in.server, "kilnd");
	cr_assert_str_eq(in.version, KILN_VERSION_STRING);
	cr_assert_eq(in.protocol, KILN_PROTOCOL_VERSION);
	cr_assert(strlen(in.fingerprint) > 0);
	cr_assert_str_eq(in.target.backend, "cpu");
	cr_assert(strlen(in.target.arch) > 0);
	cr_assert_eq(in.max_frame_bytes, (uint64_t)64 << 20);
	cr_assert_eq(in.max_nodes, 100000u);
	cr_assert_eq(in.max_inflight, 64u);
	/* Cached: the same answer again. */
	rc = kiln_client_hello(c, &in2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(memcmp(&in, &in2, sizeof(in)), 0);
	cr_assert_eq(kiln_client_hello(c, NULL, err, sizeof(err)), -EINVAL);
	kiln_client_free(c);
}

/* ---- compile, the cache, lookup --------------------------------------------
 */

Test(client, compile_and_cache)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_graph_t *g = tk_graph(MLP_FWD);
	kiln_result_t r, r2;

	/* A fresh store: compiled. */
	int rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r, err,
				     sizeof(err));
	cr_assert_eq(rc, 0, "compile: %s", err);
	cr_assert_str_eq(r.source, "compiled");
	cr_assert(is_hex64(r.signature), "%s", r.signature);
	cr_assert_gt(r.artifact_len, 0);
	cr_assert_not_null(r.artifact);
	cr_assert_gt(r.compile_ms, 0.0);
	cr_assert_eq(r.err_node, -1);

	/* The signature is the one computed locally (hello's fingerprint and
	 * the daemon's CPU target). */
	kiln_server_info_t in;
	cr_assert_eq(kiln_client_hello(c, &in, err, sizeof(err)), 0);
	kiln_compile_opts_t co;
	memset(&co, 0, sizeof(co));
	strcpy(co.mode, "default");
	uint8_t sig[KILN_SIG_BYTES];
	char hex[KILN_SIG_HEX];
	cr_assert_eq(
	    kiln_signature(g, &in.target, &co, in.fingerprint, false, sig), 0);
	kiln_sig_to_hex(sig, hex);
	cr_assert_str_eq(r.signature, hex);

	/* Again: the in-process cache, same bytes. */
	rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r2, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "local");
	cr_assert_str_eq(r2.signature, r.signature);
	cr_assert_eq(r2.artifact_len, r.artifact_len);
	cr_assert_eq(memcmp(r2.artifact, r.artifact, r.artifact_len), 0);
	kiln_result_free(&r2);
	cr_assert_null(r2.artifact);

	/* From the file, with an explicit target and mode: the same
	 * signature, still local. */
	kiln_target_t t;
	memset(&t, 0, sizeof(t));
	strcpy(t.backend, "cpu");
	rc = kiln_client_compile_file(c, MLP_FWD, &t, &co, 0, "batch", &r2, err,
				      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "local");
	cr_assert_str_eq(r2.signature, r.signature);
	kiln_result_free(&r2);

	/* Another handle without the cache: the daemon's hot map. */
	kiln_client_opts_t o2 = tk_opts(sock, false);
	kiln_client_t *c2 = tk_connect(&o2);
	rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r2,
				      err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "memory");
	cr_assert_str_eq(r2.signature, r.signature);
	cr_assert_eq(r2.artifact_len, r.artifact_len);
	cr_assert_eq(memcmp(r2.artifact, r.artifact, r.artifact_len), 0);
	kiln_result_free(&r2);
	rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r2,
				      err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "memory");
	kiln_result_free(&r2);

	/* lookup: a hit at the daemon, a hit in the cache, a miss, a bad
	 * signature. */
	rc = kiln_client_lookup(c2, r.signature, &r2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "memory");
	cr_assert_str_eq(r2.signature, r.signature);
	cr_assert_eq(r2.artifact_len, r.artifact_len);
	kiln_result_free(&r2);
	rc = kiln_client_lookup(c, r.signature, &r2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "local");
	kiln_result_free(&r2);
	char zeros[KILN_SIG_HEX];
	memset(zeros, '0', 64);
	zeros[64] = '\0';
	rc = kiln_client_lookup(c, zeros, &r2, err, sizeof(err));
	cr_assert_eq(rc, KILN_ENOTFOUND, "%d: %s", rc, err);
	cr_assert_null(r2.artifact);
	rc = kiln_client_lookup(c, "xyz", &r2, err, sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	/* Upper-case hex names the same signature. */
	char upper[KILN_SIG_HEX];
	for (int i = 0; i < KILN_SIG_HEX; i++)
		upper[i] = (r.signature[i] >= 'a' && r.signature[i] <= 'f')
			       ? (char)(r.signature[i] - 'a' + 'A')
			       : r.signature[i];
	rc = kiln_client_lookup(c2, upper, &r2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.signature, r.signature);
	kiln_result_free(&r2);

	kiln_result_free(&r);
	kiln_graph_free(g);
	kiln_client_free(c2);
	kiln_client_free(c);
}

/* A cache smaller than one artifact keeps nothing; a cache of two keeps
 * the most recent ones. */
Test(client, cache_bound)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	o.cache_bytes = 1024;
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r;
	int rc = kiln_client_compile_file(c, MLP_FWD, NULL, NULL, -1, NULL, &r,
					  err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_gt(r.artifact_len, 1024, "the artifact is tiny");
	size_t fwd_len = r.artifact_len;
	kiln_result_free(&r);
	rc = kiln_client_compile_file(c, MLP_FWD, NULL, NULL, -1, NULL, &r, err,
				      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "memory");
	kiln_result_free(&r);
	kiln_client_free(c);

	/* Room for mlp_fwd only: compiling mlp_bwd pushes it out. */
	rc = kiln_client_compile_file(c = tk_connect(&o), MLP_BWD, NULL, NULL,
				      -1, NULL, &r, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	size_t bwd_len = r.artifact_len;
	kiln_result_free(&r);
	kiln_client_free(c);
	o.cache_bytes = (fwd_len > bwd_len ? fwd_len : bwd_len) + 16;
	c = tk_connect(&o);
	const char *seq[] = {MLP_FWD, MLP_FWD, MLP_BWD, MLP_BWD, MLP_FWD};
	const char *want[] = {"memory", "local", "memory", "local", "memory"};
	for (int i = 0; i < 5; i++) {
		rc = kiln_client_compile_file(c, seq[i], NULL, NULL, -1, NULL,
					      &r, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s", err);
		cr_assert_str_eq(r.source, want[i], "step %d", i);
		kiln_result_free(&r);
	}
	kiln_client_free(c);
}

/* dynamic: 1 makes the daemon answer with a generalized artifact, whose
 * signature is not the one computed here: the cache keeps it under
 * both. A later compile with dynamic: 0 gets the static graph's own. */
Test(client, dynamic_signature)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_graph_t *g = tk_graph(MLP_FWD);
	kiln_server_info_t in;
	cr_assert_eq(kiln_client_hello(c, &in, err, sizeof(err)), 0);
	kiln_compile_opts_t co;
	memset(&co, 0, sizeof(co));
	strcpy(co.mode, "default");
	uint8_t sig[KILN_SIG_BYTES];
	char local[KILN_SIG_HEX];
	cr_assert_eq(
	    kiln_signature(g, &in.target, &co, in.fingerprint, false, sig), 0);
	kiln_sig_to_hex(sig, local);

	kiln_result_t r, r2;
	int rc = kiln_client_compile(c, g, NULL, NULL, 1, NULL, &r, err,
				     sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "compiled");
	cr_assert_str_neq(r.signature, local);
	rc = kiln_client_compile(c, g, NULL, NULL, 1, NULL, &r2, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "local");
	cr_assert_str_eq(r2.signature, r.signature);
	kiln_result_free(&r2);
	rc = kiln_client_lookup(c, r.signature, &r2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "local");
	kiln_result_free(&r2);

	/* Without the cache: the local signature is not in the store, so
	 * the graph goes to compile, which the daemon serves from the
	 * generalized artifact. */
	kiln_client_opts_t o2 = tk_opts(sock, false);
	kiln_client_t *c2 = tk_connect(&o2);
	rc = kiln_client_compile(c2, g, NULL, NULL, -1, NULL, &r2, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r2.source, "memory");
	cr_assert_str_eq(r2.signature, r.signature);
	kiln_result_free(&r2);

	/* dynamic: 0 asks for the static graph's own artifact: the
	 * generalized one cached under its signature is not a hit, kilnd
	 * compiles the static graph, and the cache keeps that under it. */
	kiln_result_t r3;
	rc = kiln_client_compile(c, g, NULL, NULL, 0, NULL, &r3, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r3.source, "compiled");
	cr_assert_str_eq(r3.signature, local);
	kiln_result_free(&r3);
	rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r3, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r3.source, "local");
	cr_assert_str_eq(r3.signature, local);
	kiln_result_free(&r3);
	kiln_result_free(&r);
	kiln_graph_free(g);
	kiln_client_free(c2);
	kiln_client_free(c);
}

/* ---- errors -----------------------------------------------------------------
 */

/* The "graph" of a tests/data/bad case file. */
static kiln_graph_t *bad_case_graph(const char *name)
{
	char p[256];
	tk_path(p, "%s/bad/%s.msgpack", KILN_TEST_DATA_DIR, name);
	uint8_t *buf;
	size_t n;
	cr_assert_eq(kiln_td_read_file(p, &buf, &n), 0, "%s", p);
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	msgpack_zone zone;
	msgpack_zone_init(&zone, 4096);
	msgpack_object o;
	char err[512] = "";
	cr_assert_eq(
	    kiln_msgpack_unpack_map(buf, n, &lim, &zone, &o, err, sizeof(err)),
	    0, "%s", err);
	const msgpack_object *go = kiln_map_get(&o, "graph");
	cr_assert_not_null(go);
	kiln_graph_t *g = NULL;
	cr_assert_eq(kiln_graph_from_object(go, &lim, &g, err, sizeof(err)), 0,
		     "%s", err);
	msgpack_zone_destroy(&zone);
	free(buf);
	return g;
}

Test(client, compile_errors)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r;

	/* The daemon finds the graph invalid and names the node. */
	kiln_graph_t *g = bad_case_graph("later_node");
	int rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r, err,
				     sizeof(err));
	cr_assert_eq(rc, KILN_EINVGRAPH, "%d: %s", rc, err);
	/* kilnd names the node in the message only for now (its compile
	 * worker passes no node index on); err_node is checked against
	 * fake_server below. */
	cr_assert(r.err_node == 1 || r.err_node == -1, "err_node %lld: %s",
		  (long long)r.err_node, err);
	cr_assert_not_null(strstr(err, "out of range"), "err: %s", err);
	cr_assert_null(r.artifact);
	kiln_graph_free(g);
	/* Another one; a message that starts with the node. */
	g = bad_case_graph("out_shape");
	rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r, err,
				 sizeof(err));
	cr_assert_eq(rc, KILN_EINVGRAPH, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "node 0"), "err: %s", err);
	kiln_graph_free(g);

	/* Not a graph at all: refused here, before any request. */
	rc = kiln_client_compile_file(c, MLP_FWD_IO, NULL, NULL, -1, NULL, &r,
				      err, sizeof(err));
	cr_assert_eq(rc, KILN_EINVGRAPH, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "mlp_fwd.io.msgpack"), "err: %s", err);
	rc = kiln_client_compile_file(c, "/nonexistent/x.msgpack", NULL, NULL,
				      -1, NULL, &r, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);

	/* Bad options. */
	g = tk_graph(MLP_FWD);
	rc = kiln_client_compile(c, g, NULL, NULL, -1, "urgent", &r, err,
				 sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	rc = kiln_client_compile(c, g, NULL, NULL, 2, NULL, &r, err,
				 sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	kiln_compile_opts_t co;
	memset(&co, 0, sizeof(co));
	strcpy(co.mode, "fastest");
	rc = kiln_client_compile(c, g, NULL, &co, -1, NULL, &r, err,
				 sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	cr_assert_eq(kiln_client_compile(c, NULL, NULL, NULL, -1, NULL, &r, err,
					 sizeof(err)),
		     -EINVAL);

	/* Targets this daemon does not compile for. */
	kiln_target_t t;
	memset(&t, 0, sizeof(t));
	strcpy(t.backend, "cuda");
	strcpy(t.arch, "sm_90");
	rc =
	    kiln_client_compile(c, g, &t, NULL, -1, NULL, &r, err, sizeof(err));
	cr_assert_eq(rc, KILN_EUNSUPOP, "%d: %s", rc, err);
	memset(&t, 0, sizeof(t));
	strcpy(t.backend, "cpu");
	strcpy(t.arch, "not-this-cpu");
	rc =
	    kiln_client_compile(c, g, &t, NULL, -1, NULL, &r, err, sizeof(err));
	cr_assert_eq(rc, KILN_EUNSUPOP, "%d: %s", rc, err);

	/* Every error left the connection usable. */
	rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	kiln_result_free(&r);
	kiln_graph_free(g);
	kiln_client_free(c);
}

/* The Python package's entry: Graph v1 bytes. Good bytes compile (and hit
 * the in-process cache the second time), bad ones are refused here with the
 * decoder's message, a bad mode with KILN_EBADREQ; the handle works on. */
static uint8_t *read_all(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	long len = ftell(f);
	cr_assert_geq(len, 0);
	rewind(f);
	uint8_t *p = malloc((size_t)len + 1);
	cr_assert_not_null(p);
	cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len;
	return p;
}

Test(client, compile_bytes)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r;
	size_t n = 0;
	uint8_t *g = read_all(MLP_FWD, &n);

	int rc = kiln_client_compile_bytes(c, g, n, NULL, -1, NULL, &r, err,
					   sizeof(err));
	cr_assert_eq(rc, 0, "%d: %s", rc, err);
	cr_assert_str_eq(r.source, "compiled");
	cr_assert_gt(r.artifact_len, 0);
	char sig[KILN_SIG_HEX];
	memcpy(sig, r.signature, sizeof(sig));
	kiln_result_free(&r);
	rc = kiln_client_compile_bytes(c, g, n, "default", -1, NULL, &r, err,
				       sizeof(err));
	cr_assert_eq(rc, 0, "%d: %s", rc, err);
	cr_assert_str_eq(r.source, "local");
	cr_assert_str_eq(r.signature, sig);
	kiln_result_free(&r);
	/* another mode is another signature */
	rc = kiln_client_compile_bytes(c, g, n, "max-autotune", 0, "batch", &r,
				       err, sizeof(err));
	cr_assert_eq(rc, 0, "%d: %s", rc, err);
	cr_assert_str_neq(r.signature, sig);
	kiln_result_free(&r);

	/* truncated bytes: the decoder's error, no request sent */
	rc = kiln_client_compile_bytes(c, g, n / 2, NULL, -1, NULL, &r, err,
				       sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert_not_null(strstr(err, "graph:"), "err: %s", err);
	cr_assert_null(r.artifact);
	rc = kiln_client_compile_bytes(c, g, n, "fastest", -1, NULL, &r, err,
				       sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	rc = kiln_client_compile_bytes(
	    c, g, n, "a-mode-name-longer-than-the-field-holds", -1, NULL, &r,
	    err, sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	cr_assert_eq(kiln_client_compile_bytes(c, NULL, 0, NULL, -1, NULL, &r,
					       err, sizeof(err)),
		     -EINVAL);
	free(g);
	kiln_client_free(c);
}

/* A compile slower than timeout_ms: KILN_ETIMEOUT, and the handle works
 * on (it reconnects; the late reply is never read as another's). */
Test(client, timeout)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	o.timeout_ms = 300;
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r;
	int64_t t0 = tk_now_ms();
	int rc = kiln_client_compile_file(c, SLOW_GRAPH, NULL, NULL, -1, NULL,
					  &r, err, sizeof(err));
	int64_t took = tk_now_ms() - t0;
	cr_assert_eq(rc, KILN_ETIMEOUT, "%d: %s", rc, err);
	cr_assert_lt(took, 5000, "took %lld ms", (long long)took);
	cr_assert_null(r.artifact);
	kiln_server_info_t in;
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	uint8_t *rep;
	size_t n;
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	free(rep);
	rc = kiln_client_compile_file(c, MLP_FWD, NULL, NULL, -1, NULL, &r, err,
				      sizeof(err));
	cr_assert(rc == 0 || rc == KILN_ETIMEOUT, "%d: %s", rc, err);
	kiln_result_free(&r);
	kiln_client_free(c);
}

/* ---- kiln_client_call -----------------------------------------------------
 */

static void pack_fields(msgpack_sbuffer *sb, const char *k, int kind, ...)
{
	msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	kiln_pack_cstr(&pk, k);
	va_list ap;
	va_start(ap, kind);
	switch (kind) {
	case 'b':
		if (va_arg(ap, int))
			msgpack_pack_true(&pk);
		else
			msgpack_pack_false(&pk);
		break;
	case 'u': msgpack_pack_uint64(&pk, va_arg(ap, uint64_t)); break;
	case 's': kiln_pack_cstr(&pk, va_arg(ap, const char *)); break;
	}
	va_end(ap);
}

Test(client, call)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	int slot = tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r;
	int rc = kiln_client_compile_file(c, MLP_FWD, NULL, NULL, -1, NULL, &r,
					  err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);

	uint8_t *rep;
	size_t n;
	msgpack_zone zone;
	msgpack_object m;
	msgpack_sbuffer sb;

	/* status, with and without the settings (root is admin). */
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	const msgpack_object *stats = kiln_map_get(&m, "stats");
	cr_assert(stats != NULL && stats->type == MSGPACK_OBJECT_MAP);
	cr_assert_null(kiln_map_get(&m, "settings"));
	msgpack_zone_destroy(&zone);
	free(rep);
	pack_fields(&sb, "settings", 'b', 1);
	rc = kiln_client_call(c, KILN_OP_STATUS, sb.data, sb.size, &rep, &n,
			      err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	const msgpack_object *set = kiln_map_get(&m, "settings");
	cr_assert(set != NULL && set->type == MSGPACK_OBJECT_MAP);
	msgpack_zone_destroy(&zone);
	free(rep);

	/* An error reply: its code, the message in err, no reply. */
	pack_fields(&sb, "settings", 'u', (uint64_t)1);
	rc = kiln_client_call(c, KILN_OP_STATUS, sb.data, sb.size, &rep, &n,
			      err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, KILN_EBADREQ, "%d: %s", rc, err);
	cr_assert(strlen(err) > 0);
	cr_assert_null(rep);

	/* list: the one entry. */
	pack_fields(&sb, "limit", 'u', (uint64_t)10);
	rc = kiln_client_call(c, KILN_OP_LIST, sb.data, sb.size, &rep, &n, err,
			      sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	const msgpack_object *ents = kiln_map_get(&m, "entries");
	cr_assert(ents != NULL && ents->type == MSGPACK_OBJECT_ARRAY);
	cr_assert_eq(ents->via.array.size, 1);
	cr_assert(kiln_obj_streq(
	    kiln_map_get(&ents->via.array.ptr[0], "signature"), r.signature));
	msgpack_zone_destroy(&zone);
	free(rep);

	/* hello and lookup through call. */
	rc = kiln_client_call(c, KILN_OP_HELLO, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	cr_assert(kiln_obj_streq(kiln_map_get(&m, "server"), "kilnd"));
	msgpack_zone_destroy(&zone);
	free(rep);
	pack_fields(&sb, "signature", 's', r.signature);
	rc = kiln_client_call(c, KILN_OP_LOOKUP, sb.data, sb.size, &rep, &n,
			      err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "%s", err);
	free(rep);

	/* evict: a miss, then the entry; gc. */
	char zeros[KILN_SIG_HEX];
	memset(zeros, '0', 64);
	zeros[64] = '\0';
	pack_fields(&sb, "signature", 's', zeros);
	rc = kiln_client_call(c, KILN_OP_EVICT, sb.data, sb.size, &rep, &n, err,
			      sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, KILN_ENOTFOUND, "%d: %s", rc, err);
	pack_fields(&sb, "all", 'b', 1);
	rc = kiln_client_call(c, KILN_OP_EVICT, sb.data, sb.size, &rep, &n, err,
			      sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	const msgpack_object *ev = kiln_map_get(&m, "evicted");
	cr_assert(ev != NULL && ev->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
		  ev->via.u64 == 1);
	msgpack_zone_destroy(&zone);
	free(rep);
	rc = kiln_client_call(c, KILN_OP_GC, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	msgpack_zone_init(&zone, 4096);
	m = unpack_reply(rep, n, &zone);
	cr_assert_not_null(kiln_map_get(&m, "store_bytes"));
	msgpack_zone_destroy(&zone);
	free(rep);

	/* Bad arguments: fields that are not one map, an unknown op. */
	const uint8_t not_map[] = {0x92, 0x01, 0x02};
	rc = kiln_client_call(c, KILN_OP_STATUS, not_map, sizeof(not_map), &rep,
			      &n, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "%d: %s", rc, err);
	const uint8_t two_maps[] = {0x80, 0x80};
	rc = kiln_client_call(c, KILN_OP_STATUS, two_maps, sizeof(two_maps),
			      &rep, &n, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "%d: %s", rc, err);
	const uint8_t truncated[] = {0x81, 0xa1};
	rc = kiln_client_call(c, KILN_OP_STATUS, truncated, sizeof(truncated),
			      &rep, &n, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "%d: %s", rc, err);
	rc = kiln_client_call(c, KILN_OP__COUNT, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, -EINVAL, "%d: %s", rc, err);
	cr_assert_eq(kiln_client_call(c, KILN_OP_STATUS, NULL, 0, NULL, &n, err,
				      sizeof(err)),
		     -EINVAL);

	/* shutdown: answered, then kilnd exits 0. */
	pack_fields(&sb, "drain", 'b', 0);
	rc = kiln_client_call(c, KILN_OP_SHUTDOWN, sb.data, sb.size, &rep, &n,
			      err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "%s", err);
	free(rep);
	int st = 0;
	int64_t end = tk_now_ms() + 30000;
	while (waitpid(tk_pids[slot], &st, WNOHANG) == 0) {
		cr_assert(tk_now_ms() < end, "kilnd did not exit on shutdown");
		tk_sleep_ms(20);
	}
	tk_pids[slot] = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);

	/* Nobody there now: the idempotent status reconnects, fails. */
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert(rc == -ENOENT || rc == -ECONNREFUSED, "%d: %s", rc, err);
	kiln_result_free(&r);
	kiln_client_free(c);
}

/* ---- reconnect --------------------------------------------------------------
 */

Test(client, reconnect_after_restart)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	int slot = tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_client_opts_t o2 = tk_opts(sock, false);
	kiln_client_t *c2 = tk_connect(&o2);
	kiln_result_t r;
	kiln_server_info_t in;
	int rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r,
					  err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "compiled");
	kiln_result_free(&r);
	cr_assert_eq(kiln_client_hello(c, &in, err, sizeof(err)), 0, "%s", err);

	/* Restart on the same socket and store. */
	tk_stop_kilnd(slot);
	slot = tk_start_kilnd(sock, store, NULL);

	/* The same handles work: hello, an admin op that is never retried
	 * (the dead connection is noticed before sending), a compile that
	 * now comes from the store. */
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	uint8_t *rep;
	size_t n;
	rc = kiln_client_call(c, KILN_OP_GC, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	free(rep);
	rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r,
				      err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "disk");
	kiln_result_free(&r);

	/* Again, with kill -9 this time, while idle. */
	kill(tk_pids[slot], SIGKILL);
	waitpid(tk_pids[slot], NULL, 0);
	tk_pids[slot] = 0;
	slot = tk_start_kilnd(sock, store, NULL);
	rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r,
				      err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "disk");
	kiln_result_free(&r);
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	free(rep);

	/* No daemon: the call fails plainly, and works once one is back. */
	tk_stop_kilnd(slot);
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert(rc == -ENOENT || rc == -ECONNREFUSED, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, sock), "err: %s", err);
	tk_start_kilnd(sock, store, NULL);
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	kiln_client_free(c2);
	kiln_client_free(c);
}

/* ---- threads
 * ------------------------------------------------------------------ */

typedef struct {
	kiln_client_t *c;
	const kiln_graph_t *g[2];
	int id;
	int failures;
	char sig[2][KILN_SIG_HEX];
	char msg[1024];
} worker_t;

static void *worker(void *arg)
{
	worker_t *w = arg;
	char err[512];
	for (int i = 0; i < 12; i++) {
		int k = (w->id + i) % 2;
		kiln_result_t r;
		kiln_server_info_t in;
		int rc;
		memset(&r, 0, sizeof(r));
		switch ((w->id + i) % 4) {
		case 0:
		case 1:
			rc = kiln_client_compile(w->c, w->g[k], NULL, NULL, -1,
						 NULL, &r, err, sizeof(err));
			break;
		case 2:
			rc = kiln_client_lookup(w->c, w->sig[k], &r, err,
						sizeof(err));
			break;
		default:
			rc = kiln_client_hello(w->c, &in, err, sizeof(err));
			if (rc == 0 && strcmp(in.server, "kilnd") != 0) {
				snprintf(err, sizeof(err), "server \"%s\"",
					 in.server);
				rc = -EPROTO;
			}
			/* a hello has no artifact to check */
			snprintf(r.signature, sizeof(r.signature), "%s",
				 w->sig[k]);
			r.artifact_len = 1;
			break;
		}
		if (rc != 0) {
			snprintf(w->msg, sizeof(w->msg),
				 "thread %d step %d: %s: %s", w->id, i,
				 kiln_strerror(rc), err);
			w->failures++;
		} else if (strcmp(r.signature, w->sig[k]) != 0 ||
			   r.artifact_len == 0) {
			snprintf(w->msg, sizeof(w->msg),
				 "thread %d step %d: signature %s, want %s",
				 w->id, i, r.signature, w->sig[k]);
			w->failures++;
		}
		if (r.artifact != NULL)
			kiln_result_free(&r);
	}
	return NULL;
}

static void run_threads(kiln_client_t *c, const kiln_graph_t *g0,
			const kiln_graph_t *g1, const char *s0, const char *s1)
{
	worker_t w[8];
	pthread_t th[8];
	for (int i = 0; i < 8; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].c = c;
		w[i].g[0] = g0;
		w[i].g[1] = g1;
		w[i].id = i;
		snprintf(w[i].sig[0], KILN_SIG_HEX, "%s", s0);
		snprintf(w[i].sig[1], KILN_SIG_HEX, "%s", s1);
		cr_assert_eq(pthread_create(&th[i], NULL, worker, &w[i]), 0);
	}
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 8; i++)
		cr_expect_eq(w[i].failures, 0, "%s", w[i].msg);
}

Test(client, threads_share_a_handle)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_graph_t *g0 = tk_graph(MLP_FWD), *g1 = tk_graph(MLP_BWD);
	/* The signatures, from a first compile of each. */
	kiln_client_opts_t o = tk_opts(sock, false);
	kiln_client_t *c = tk_connect(&o);
	kiln_result_t r0, r1;
	cr_assert_eq(kiln_client_compile(c, g0, NULL, NULL, -1, NULL, &r0, err,
					 sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(kiln_client_compile(c, g1, NULL, NULL, -1, NULL, &r1, err,
					 sizeof(err)),
		     0, "%s", err);
	/* Every request on the wire (no cache), then with the cache. */
	run_threads(c, g0, g1, r0.signature, r1.signature);
	kiln_client_free(c);
	o = tk_opts(sock, true);
	c = tk_connect(&o);
	run_threads(c, g0, g1, r0.signature, r1.signature);
	kiln_client_free(c);
	kiln_result_free(&r0);
	kiln_result_free(&r1);
	kiln_graph_free(g0);
	kiln_graph_free(g1);
}

/* ---- compile, load, run
 * ------------------------------------------------------- */

Test(client, compile_and_load_and_run)
{
	char sock[256], store[256], err[512] = "";
	sock_store(sock, store);
	tk_start_kilnd(sock, store, NULL);
	kiln_client_opts_t o = tk_opts(sock, true);
	kiln_client_t *c = tk_connect(&o);
	kiln_graph_t *g = tk_graph(MLP_FWD);
	kiln_td_io_t io;
	memset(&io, 0, sizeof(io));
	int rc = kiln_td_io_load(MLP_FWD_IO, &io, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);

	kiln_module_t *m = NULL;
	rc = kiln_compile_and_load(c, g, NULL, NULL, &m, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_not_null(m);
	cr_assert_eq(kiln_module_n_inputs(m), g->n_inputs);
	cr_assert_eq(kiln_module_n_outputs(m), g->n_outputs);

	kiln_tensor_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	kiln_io_t *args = calloc(g->n_inputs + 1, sizeof(*args));
	rc = kiln_td_make_inputs(g, &io, in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	for (uint32_t i = 0; i < g->n_inputs; i++) {
		if (g->values[i].kind == KILN_VAL_SYMINT) {
			args[i].kind = KILN_IO_INT;
			args[i].i = *(const int64_t *)in[i].data;
		} else {
			args[i].kind = KILN_IO_TENSOR;
			args[i].t = in[i];
		}
	}
	/* Twice: the second run's module comes from the cache. */
	for (int pass = 0; pass < 2; pass++) {
		uint32_t nb = kiln_module_n_out_buffers(m);
		void **bufs = calloc(nb + 1, sizeof(void *));
		kiln_io_t *outs =
		    calloc(kiln_module_n_outputs(m) + 1, sizeof(*outs));
		rc = kiln_run(m, args, g->n_inputs, bufs, outs, NULL, err,
			      sizeof(err));
		cr_assert_eq(rc, 0, "run: %s", err);
		cr_assert_eq(io.n_outputs, g->n_outputs);
		for (uint32_t k = 0; k < io.n_outputs; k++) {
			kiln_td_value_t *want = &io.outputs[k];
			if (want->is_int) {
				cr_assert_eq(outs[k].kind, KILN_IO_INT);
				cr_assert_eq(outs[k].i, want->ival);
				continue;
			}
			double rtol, atol;
			kiln_td_tolerance(want->t.dtype, &rtol, &atol);
			if (io.rtol > rtol)
				rtol = io.rtol;
			if (io.atol > atol)
				atol = io.atol;
			kiln_td_cmp_t cr;
			cr_assert(kiln_td_compare(&outs[k].t, &want->t, rtol,
						  atol, &cr),
				  "output %u: %s", k, cr.msg);
		}
		for (uint32_t i = 0; i < nb; i++)
			free(bufs[i]);
		free(bufs);
		free(outs);
		kiln_module_free(m);
		m = NULL;
		if (pass == 0) {
			rc = kiln_compile_and_load(c, g, NULL, NULL, &m, err,
						   sizeof(err));
			cr_assert_eq(rc, 0, "%s", err);
		}
	}

	/* Errors come through: an invalid graph, and no module. */
	kiln_graph_t *bad = bad_case_graph("later_node");
	m = (kiln_module_t *)1;
	rc = kiln_compile_and_load(c, bad, NULL, NULL, &m, err, sizeof(err));
	cr_assert_eq(rc, KILN_EINVGRAPH, "%d: %s", rc, err);
	cr_assert_null(m);
	kiln_graph_free(bad);

	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
	free(args);
	kiln_td_io_free(&io);
	kiln_graph_free(g);
	kiln_client_free(c);
}

/* ---- a scripted fake kilnd
 * ---------------------------------------------------- */

/*
 * What kilnd cannot be made to do on cue: close the connection after
 * reading a request, answer with another id, stay silent, name a node in
 * an error. The fake serves one connection at a time and answers request
 * number k (over all connections) as script[k] says.
 */
typedef enum {
	ACT_OK,	     /* an empty success (hello: a real-looking one) */
	ACT_CLOSE,   /* close the connection without answering */
	ACT_SILENT,  /* never answer (the client times out) */
	ACT_WRONGID, /* a success with id + 1000 */
	ACT_NOTFOUND,
	ACT_ERRNODE /* invalid_graph naming node 7 */
} act_t;

typedef struct {
	char path[256];
	int lfd;
	const act_t *script;
	int n_script;
	int seen;		 /* requests read */
	int ops[KILN_OP__COUNT]; /* requests read per op */
	int conns;		 /* connections accepted */
	volatile int stop;
	pthread_t th;
} fake_t;

static void fake_reply(int fd, uint64_t id, kiln_op_t op, act_t a)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	if (a == ACT_NOTFOUND) {
		kiln_pack_error(&pk, id, KILN_ENOTFOUND, "no such artifact",
				-1);
	} else if (a == ACT_ERRNODE) {
		kiln_pack_error(&pk, id, KILN_EINVGRAPH, "node 7: bad shapes",
				7);
	} else if (op == KILN_OP_HELLO) {
		kiln_pack_ok_head(&pk, id, 6);
		kiln_pack_cstr(&pk, "server");
		kiln_pack_cstr(&pk, "kilnd");
		kiln_pack_cstr(&pk, "version");
		kiln_pack_cstr(&pk, "fake");
		kiln_pack_cstr(&pk, "protocol");
		msgpack_pack_uint32(&pk, 1);
		kiln_pack_cstr(&pk, "fingerprint");
		kiln_pack_cstr(&pk, "fake-fingerprint");
		kiln_pack_cstr(&pk, "targets");
		msgpack_pack_array(&pk, 1);
		msgpack_pack_map(&pk, 3);
		kiln_pack_cstr(&pk, "backend");
		kiln_pack_cstr(&pk, "cpu");
		kiln_pack_cstr(&pk, "arch");
		kiln_pack_cstr(&pk, "x86-64");
		kiln_pack_cstr(&pk, "features");
		kiln_pack_cstr(&pk, "+fake");
		kiln_pack_cstr(&pk, "limits");
		msgpack_pack_map(&pk, 1);
		kiln_pack_cstr(&pk, "max_frame_bytes");
		msgpack_pack_uint64(&pk, 1 << 20);
	} else {
		kiln_pack_ok_head(&pk, a == ACT_WRONGID ? id + 1000 : id, 0);
	}
	kiln_frame_end(&sb, SIZE_MAX);
	ssize_t w = write(fd, sb.data, sb.size);
	(void)w;
	msgpack_sbuffer_destroy(&sb);
}

/* Serves one connection until it closes (or the script says close). */
static void fake_conn(fake_t *f, int fd)
{
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1 << 24);
	uint8_t buf[4096];
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		if (f->stop)
			break;
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t k = read(fd, buf, sizeof(buf));
		if (k <= 0)
			break;
		const uint8_t *q = buf;
		size_t left = (size_t)k;
		uint8_t *body;
		size_t blen;
		bool closed = false;
		while (!closed && kiln_frame_feed(&d, &q, &left, &body, &blen,
						  NULL, 0) == 1) {
			kiln_limits_t lim;
			kiln_limits_default(&lim);
			msgpack_zone zone;
			msgpack_zone_init(&zone, 1024);
			kiln_request_t req;
			if (kiln_request_decode(body, blen, &lim, &zone, &req,
						NULL, 0) == 0) {
				act_t a = f->seen < f->n_script
					      ? f->script[f->seen]
					      : ACT_OK;
				f->seen++;
				f->ops[req.op]++;
				if (a == ACT_CLOSE)
					closed = true;
				else if (a != ACT_SILENT)
					fake_reply(fd, req.id, req.op, a);
			}
			msgpack_zone_destroy(&zone);
			free(body);
		}
		if (closed)
			break;
	}
	kiln_frame_decoder_free(&d);
	close(fd);
}

static void *fake_main(void *arg)
{
	fake_t *f = arg;
	while (!f->stop) {
		struct pollfd p = {f->lfd, POLLIN, 0};
		if (poll(&p, 1, 50) <= 0)
			continue;
		int fd = accept(f->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		f->conns++;
		fake_conn(f, fd);
	}
	return NULL;
}

static void fake_start(fake_t *f, const act_t *script, int n)
{
	memset(f, 0, sizeof(*f));
	tk_path(f->path, "%s/fake.sock", tk_dir);
	f->script = script;
	f->n_script = n;
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, f->path, strlen(f->path));
	cr_assert_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(f->lfd, 16), 0);
	cr_assert_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake_t *f)
{
	f->stop = 1;
	pthread_join(f->th, NULL);
	close(f->lfd);
}

Test(client, fake_server)
{
	/* Request by request (the comments say which call sends it). */
	static const act_t script[] = {
	    ACT_CLOSE,	  /* 0 status: closed unanswered ... */
	    ACT_OK,	  /* 1 ... so it is sent again: ok */
	    ACT_CLOSE,	  /* 2 gc: closed unanswered, not resent */
	    ACT_CLOSE,	  /* 3 hello: closed ... */
	    ACT_CLOSE,	  /* 4 ... resent once, closed again: an error */
	    ACT_WRONGID,  /* 5 status: a reply for another request */
	    ACT_OK,	  /* 6 status: fine (on a new connection) */
	    ACT_SILENT,	  /* 7 status: no answer: timeout */
	    ACT_OK,	  /* 8 hello (a compile's first step) */
	    ACT_NOTFOUND, /* 9 lookup of the local signature */
	    ACT_ERRNODE,  /* 10 compile: invalid_graph, node 7 */
	};
	fake_t f;
	fake_start(&f, script, (int)(sizeof(script) / sizeof(script[0])));
	kiln_client_opts_t o = tk_opts(f.path, true);
	o.timeout_ms = 500;
	kiln_client_t *c = tk_connect(&o);
	char err[512] = "";
	uint8_t *rep;
	size_t n;

	int rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
				  sizeof(err));
	cr_assert_eq(rc, 0, "%d: %s", rc, err);
	free(rep);
	cr_assert_eq(f.ops[KILN_OP_STATUS], 2);

	rc = kiln_client_call(c, KILN_OP_GC, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, -ECONNRESET, "%d: %s", rc, err);
	cr_assert_eq(f.ops[KILN_OP_GC], 1, "gc was resent");

	kiln_server_info_t in;
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, -ECONNRESET, "%d: %s", rc, err);
	cr_assert_eq(f.ops[KILN_OP_HELLO], 2);

	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, KILN_EINTERNAL, "%d: %s", rc, err);
	cr_assert_null(rep);
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	cr_assert_eq(rc, 0, "%d: %s", rc, err);
	free(rep);

	int64_t t0 = tk_now_ms();
	rc = kiln_client_call(c, KILN_OP_STATUS, NULL, 0, &rep, &n, err,
			      sizeof(err));
	int64_t took = tk_now_ms() - t0;
	cr_assert_eq(rc, KILN_ETIMEOUT, "%d: %s", rc, err);
	cr_assert(took >= 450 && took < 3000, "took %lld ms", (long long)took);

	kiln_graph_t *g = tk_graph(MLP_FWD);
	kiln_result_t r;
	rc = kiln_client_compile(c, g, NULL, NULL, -1, NULL, &r, err,
				 sizeof(err));
	cr_assert_eq(rc, KILN_EINVGRAPH, "%d: %s", rc, err);
	cr_assert_eq(r.err_node, 7);
	cr_assert_str_eq(err, "node 7: bad shapes");
	cr_assert_eq(f.ops[KILN_OP_LOOKUP], 1);
	cr_assert_eq(f.ops[KILN_OP_COMPILE], 1);
	cr_assert_eq(f.seen, 11);

	/* Over the frame limit hello reported (1 MiB): refused unsent. */
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	kiln_pack_cstr(&pk, "pad");
	size_t big = (size_t)2 << 20;
	uint8_t *zeros = calloc(1, big);
	msgpack_pack_bin_with_body(&pk, zeros, big);
	free(zeros);
	rc = kiln_client_call(c, KILN_OP_STATUS, sb.data, sb.size, &rep, &n,
			      err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, KILN_ETOOLARGE, "%d: %s", rc, err);
	cr_assert_eq(f.seen, 11);
	kiln_graph_free(g);
	kiln_client_free(c);
	fake_stop(&f);
}
