/*
 * ops.c — what each op of PROTOCOL.md does in kilnd: hello, compile,
 * lookup, status, list, evict, gc, shutdown.
 *
 * The loop thread decodes and answers; anything that touches the store
 * (lookup misses of the hot map, status's store counters, list, evict, gc)
 * runs on libuv's thread pool as an `opwork` and is answered in its
 * after-work callback, back on the loop.
 *
 * Threads: the loop thread, except the *_work functions (libuv's pool),
 * which read their opwork's inputs and write its outputs only.
 */
#include "daemon/dynamic.h"
#include "daemon/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define pk_str kiln_pack_cstr

typedef struct opwork {
	uv_work_t work;
	kilnd_server_t *srv;
	kilnd_conn_t *conn;
	uint64_t id;
	kiln_op_t op;
	/* inputs */
	uint8_t sig[KILN_SIG_BYTES];
	bool has_sig, all, settings;
	uint64_t older_than_s, max_bytes;
	kiln_cache_order_t order;
	uint32_t limit;
	char target[KILN_CACHE_TARGET_MAX];
	/* outputs */
	int rc;
	char err[512];
	kilnd_blob_t *blob;
	kiln_cache_stats_t st;
	kiln_cache_entry_t *entries;
	size_t n;
	uint64_t evicted, freed;
	uint8_t (*keys)[KILN_CACHE_KEY_BYTES]; /* evicted keys */
	size_t nkeys;
} opwork_t;

static void work_after(uv_work_t *w, int status);

static void queue_op(opwork_t *o, uv_work_cb fn)
{
	kilnd_conn_ref(o->conn);
	o->srv->pending_work++;
	o->work.data = o;
	int rc = uv_queue_work(o->srv->loop, &o->work, fn, work_after);
	if (rc < 0) {
		o->srv->pending_work--;
		kilnd_reply_error(o->conn, o->id, KILN_EINTERNAL,
				  uv_strerror(rc), -1);
		kilnd_conn_unref(o->conn);
		free(o);
	}
}

static opwork_t *opwork_new(kilnd_conn_t *c, const kiln_request_t *req)
{
	opwork_t *o = calloc(1, sizeof(*o));
	if (o == NULL) {
		kilnd_reply_error(c, req->id, -ENOMEM, "out of memory", -1);
		return NULL;
	}
	o->srv = c->srv;
	o->conn = c;
	o->id = req->id;
	o->op = req->op;
	return o;
}

static void bad_request(kilnd_conn_t *c, uint64_t id, const char *fmt,
			const char *what)
{
	char m[256];
	snprintf(m, sizeof(m), fmt, what);
	kilnd_reply_error(c, id, KILN_EBADREQ, m, -1);
}

/* Packing helpers for replies. */
typedef struct reply {
	msgpack_sbuffer sb;
	msgpack_packer pk;
} reply_t;

static void reply_begin(reply_t *r, uint64_t id, uint32_t n_fields)
{
	msgpack_sbuffer_init(&r->sb);
	msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
	kiln_frame_begin(&r->sb);
	kiln_pack_ok_head(&r->pk, id, n_fields);
}

static void kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
	pk_str(pk, k);
	msgpack_pack_uint64(pk, v);
}

static void kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	pk_str(pk, k);
	pk_str(pk, v != NULL ? v : "");
}

static void kv_f64(msgpack_packer *pk, const char *k, double v)
{
	pk_str(pk, k);
	msgpack_pack_double(pk, v);
}

/* ---- hello ------------------------------------------------------------- */

static void op_hello(kilnd_conn_t *c, const kiln_request_t *req)
{
	kilnd_server_t *s = c->srv;
	const msgpack_object *cl = kiln_map_get(&req->body, "client");
	if (cl != NULL && cl->type == MSGPACK_OBJECT_STR)
		KILN_LOG(KILN_LOG_DEBUG,
			 "msg=hello conn=%llu pid=%ld client=\"%.*s\"",
			 (unsigned long long)c->num, (long)c->pid,
			 (int)(cl->via.str.size > 200 ? 200 : cl->via.str.size),
			 cl->via.str.ptr);
	reply_t r;
	reply_begin(&r, req->id, 6);
	kv_str(&r.pk, "server", "kilnd");
	kv_str(&r.pk, "version", KILN_VERSION_STRING);
	kv_u64(&r.pk, "protocol", KILN_PROTOCOL_VERSION);
	kv_str(&r.pk, "fingerprint", s->fingerprint);
	pk_str(&r.pk, "targets");
	msgpack_pack_array(&r.pk, 1);
	msgpack_pack_map(&r.pk, 3);
	kv_str(&r.pk, "backend", s->target.backend);
	kv_str(&r.pk, "arch", s->target.arch);
	kv_str(&r.pk, "features", s->target.features);
	pk_str(&r.pk, "limits");
	msgpack_pack_map(&r.pk, 3);
	kv_u64(&r.pk, "max_frame_bytes", s->cfg.max_frame_bytes);
	kv_u64(&r.pk, "max_nodes", s->cfg.max_nodes);
	kv_u64(&r.pk, "max_inflight", s->cfg.max_inflight);
	kilnd_reply_packed(c, &r.sb);
}

/* ---- compile ----------------------------------------------------------- */

/* The structure table entry for h, or a slot for it (the least recently
 * used entry that no compile refers to), or NULL. */
static kilnd_dyn_t *dyn_entry(kilnd_server_t *s, const uint8_t h[32],
			      bool create)
{
	kilnd_dyn_t *victim = NULL;
	for (int i = 0; i < KILND_DYN_MAX; i++) {
		kilnd_dyn_t *e = &s->dyn[i];
		if (e->state != KILND_DYN_FREE &&
		    memcmp(e->h, h, KILN_SIG_BYTES) == 0) {
			e->used = ++s->dyn_clock;
			return e;
		}
		if (e->state != KILND_DYN_GENERALIZING &&
		    (victim == NULL || e->used < victim->used))
			victim = e;
	}
	if (!create || victim == NULL)
		return NULL;
	kiln_graph_free(victim->seen);
	kiln_graph_free(victim->gg);
	memset(victim, 0, sizeof(*victim));
	memcpy(victim->h, h, KILN_SIG_BYTES);
	victim->used = ++s->dyn_clock;
	return victim;
}

/*
 * Automatic dynamic shapes (dynamic.c). Returns true when the request was
 * routed (g taken): to the generalized artifact this graph is an instance
 * of, or to a new generalized compile (on the second distinct size set of
 * a structure, or at once with dynamic: true), with g as the fallback
 * should the symbolic graph fail to compile. Otherwise records g and
 * returns false: the caller compiles it as it is.
 */
static bool route_dynamic(kilnd_conn_t *c, uint64_t id, kiln_graph_t *g,
			  const kiln_target_t *t, const kiln_compile_opts_t *o,
			  kilnd_prio_t prio, const uint8_t sig[32], bool eager)
{
	kilnd_server_t *s = c->srv;
	uint8_t h[KILN_SIG_BYTES];
	if (kiln_signature(g, t, o, s->fingerprint, true, h) < 0)
		return false;
	kilnd_dyn_t *e = dyn_entry(s, h, true);
	if (e == NULL)
		return false;
	char err[256] = "";
	kiln_graph_t *gg = NULL, *copy = NULL;
	switch (e->state) {
	case KILND_DYN_GENERAL:
		if (!kilnd_instance_of(e->gg, g) ||
		    kilnd_graph_clone(e->gg, &s->lim, &copy, err, sizeof(err)) <
			0)
			return false;
		KILND_COUNT(&s->ctr, dynamic_hits);
		kilnd_memo_put(s, s->cur_memo, e->gsig);
		kiln_graph_free(g);
		kilnd_serve(s, c, id, copy, t, o, prio, e->gsig, e, NULL, NULL);
		return true;
	case KILND_DYN_FREE:
		if (!eager) {
			if (kilnd_graph_clone(g, &s->lim, &e->seen, err,
					      sizeof(err)) == 0) {
				memcpy(e->seen_sig, sig, KILN_SIG_BYTES);
				e->state = KILND_DYN_SEEN;
			}
			return false;
		}
		if (kilnd_generalize(g, g, &s->lim, &gg, err, sizeof(err)) < 0)
			break;
		goto compile;
	case KILND_DYN_SEEN:
		if (memcmp(e->seen_sig, sig, KILN_SIG_BYTES) == 0)
			return false;
		if (kilnd_generalize(e->seen, g, &s->lim, &gg, err,
				     sizeof(err)) < 0)
			break;
		goto compile;
	default: return false; /* generalizing now, or static only */
	}
	KILN_LOG(KILN_LOG_INFO, "msg=\"not generalized\" reason=\"%s\"", err);
	KILND_COUNT(&s->ctr, dynamic_refused);
	kiln_graph_free(e->seen);
	e->seen = NULL;
	e->state = KILND_DYN_STATIC;
	return false;
compile:
	if (kiln_signature(gg, t, o, s->fingerprint, false, e->gsig) < 0 ||
	    kilnd_graph_clone(gg, &s->lim, &e->gg, err, sizeof(err)) < 0) {
		kiln_graph_free(gg);
		return false;
	}
	kiln_graph_free(e->seen);
	e->seen = NULL;
	e->state = KILND_DYN_GENERALIZING;
	e->eager = eager;
	char hex[KILN_SIG_HEX];
	kiln_sig_to_hex(e->gsig, hex);
	KILN_LOG(KILN_LOG_INFO,
		 "msg=\"compiling a generalized graph\" sig=%s symbols=%u", hex,
		 gg->n_symbols);
	kilnd_memo_put(s, s->cur_memo, e->gsig);
	kilnd_serve(s, c, id, gg, t, o, prio, e->gsig, e, g, sig);
	return true;
}

static void op_compile(kilnd_conn_t *c, const kiln_request_t *req)
{
	kilnd_server_t *s = c->srv;
	char err[512] = "";
	if (s->draining) {
		kilnd_reply_error(c, req->id, KILN_ESHUTDOWN,
				  "kilnd is shutting down", -1);
		return;
	}
	const msgpack_object *go = kiln_map_get(&req->body, "graph");
	if (go == NULL || go->type != MSGPACK_OBJECT_MAP) {
		bad_request(c, req->id, "%s: missing or not a map", "graph");
		return;
	}
	const msgpack_object *to = kiln_map_get(&req->body, "target");
	if (to == NULL) {
		bad_request(c, req->id, "%s: missing", "target");
		return;
	}
	kiln_target_t t;
	int rc = kiln_target_from_object(to, &t, err, sizeof(err));
	if (rc < 0) {
		kilnd_reply_error(c, req->id, rc, err, -1);
		return;
	}
	if (strcmp(t.backend, s->target.backend) != 0) {
		snprintf(err, sizeof(err),
			 "this kilnd compiles for backend \"%s\" only, not "
			 "\"%s\"",
			 s->target.backend, t.backend);
		kilnd_reply_error(c, req->id, KILN_EUNSUPOP, err, -1);
		return;
	}
	/* A CPU target's arch and features default to the daemon's own;
	 * other values name another machine, which this daemon cannot
	 * compile for. */
	if (t.arch[0] == '\0')
		memcpy(t.arch, s->target.arch, sizeof(t.arch));
	if (t.features[0] == '\0')
		memcpy(t.features, s->target.features, sizeof(t.features));
	if (strcmp(t.arch, s->target.arch) != 0 ||
	    strcmp(t.features, s->target.features) != 0) {
		snprintf(err, sizeof(err),
			 "target %s/%.40s is not this kilnd's (%s); ask hello "
			 "for the targets it compiles for",
			 t.arch, t.features, s->target.arch);
		kilnd_reply_error(c, req->id, KILN_EUNSUPOP, err, -1);
		return;
	}
	kiln_compile_opts_t o;
	int dynamic = -1;
	rc = kiln_opts_from_object(kiln_map_get(&req->body, "options"), &o,
				   &dynamic, err, sizeof(err));
	if (rc < 0) {
		kilnd_reply_error(c, req->id, rc, err, -1);
		return;
	}
	kilnd_prio_t prio = KILND_PRIO_INTERACTIVE;
	const msgpack_object *po = kiln_map_get(&req->body, "priority");
	if (po != NULL && po->type != MSGPACK_OBJECT_NIL) {
		if (kiln_obj_streq(po, "batch"))
			prio = KILND_PRIO_BATCH;
		else if (!kiln_obj_streq(po, "interactive")) {
			bad_request(c, req->id,
				    "priority: want \"interactive\" or "
				    "\"batch\"%s",
				    "");
			return;
		}
	}
	kiln_graph_t *g = NULL;
	rc = kiln_graph_from_object(go, &s->lim, &g, err, sizeof(err));
	if (rc < 0) {
		kilnd_reply_error(c, req->id, rc, err, -1);
		return;
	}
	uint8_t sig[KILN_SIG_BYTES];
	rc = kiln_signature(g, &t, &o, s->fingerprint, false, sig);
	if (rc < 0) {
		kiln_graph_free(g);
		kilnd_reply_error(c, req->id, rc, "cannot sign the graph", -1);
		return;
	}
	/* Repeats of these exact bytes skip all of the above (memo.c). */
	kilnd_memo_put(s, s->cur_memo, sig);
	/* The exact graph first: in memory, or being compiled. */
	kilnd_blob_t *b = kilnd_hot_get(s->hot, sig);
	if (b != NULL) {
		kiln_graph_free(g);
		kilnd_memory_hit(s, b->sig);
		kilnd_reply_artifact(c, req->id, b, "memory", b->compile_ms);
		kilnd_blob_unref(b);
		return;
	}
	kilnd_job_t *j = kilnd_job_find(s, sig);
	if (j != NULL) {
		kiln_graph_free(g);
		kilnd_job_join(s, j, c, req->id);
		return;
	}
	if (dynamic != 0 && g->n_symbols == 0 &&
	    route_dynamic(c, req->id, g, &t, &o, prio, sig, dynamic == 1))
		return;
	kilnd_job_start(s, c, req->id, g, &t, &o, prio, sig);
}

/* ---- lookup ------------------------------------------------------------ */

static void lookup_work(uv_work_t *w)
{
	opwork_t *o = w->data;
	kiln_cache_blob_t hit;
	o->rc =
	    kiln_cache_get(o->srv->store, o->sig, &hit, o->err, sizeof(o->err));
	if (o->rc == 0) {
		o->blob = kilnd_blob_new(o->sig, hit.data, hit.size,
					 hit.entry.compile_ms);
		if (o->blob == NULL)
			o->rc = -ENOMEM;
		kiln_cache_blob_release(&hit);
	}
}

static void op_lookup(kilnd_conn_t *c, const kiln_request_t *req)
{
	kilnd_server_t *s = c->srv;
	const msgpack_object *so = kiln_map_get(&req->body, "signature");
	uint8_t sig[KILN_SIG_BYTES];
	if (so == NULL || so->type != MSGPACK_OBJECT_STR ||
	    kiln_sig_from_hex(so->via.str.ptr, so->via.str.size, sig) < 0) {
		bad_request(c, req->id, "%s: want 64 hex characters",
			    "signature");
		return;
	}
	kilnd_blob_t *b = kilnd_hot_get(s->hot, sig);
	if (b != NULL) {
		kilnd_memory_hit(s, b->sig);
		kilnd_reply_artifact(c, req->id, b, "memory", b->compile_ms);
		kilnd_blob_unref(b);
		return;
	}
	opwork_t *o = opwork_new(c, req);
	if (o == NULL)
		return;
	memcpy(o->sig, sig, sizeof(sig));
	queue_op(o, lookup_work);
}

/* ---- status ------------------------------------------------------------ */

static void status_work(uv_work_t *w)
{
	opwork_t *o = w->data;
	o->rc = kiln_cache_stats(o->srv->store, &o->st, o->err, sizeof(o->err));
}

static uint64_t ctr_sum(kilnd_server_t *s, int i)
{
	uint64_t v = atomic_load(&s->ctr.v[i]);
	for (unsigned k = 0; k < s->nworkers; k++)
		v += atomic_load(&s->wctr[k].v[i]);
	return v;
}

static uint64_t ctr_sum_err(kilnd_server_t *s, int i)
{
	uint64_t v = atomic_load(&s->ctr.errors[i]);
	for (unsigned k = 0; k < s->nworkers; k++)
		v += atomic_load(&s->wctr[k].errors[i]);
	return v;
}

static void pack_store_stat(const char *name, const char *doc, uint64_t v,
			    void *arg)
{
	(void)doc;
	kv_u64(arg, name, v);
}

static void pack_setting(const char *name, const char *value,
			 const char *source, const char *doc, void *arg)
{
	(void)source;
	(void)doc;
	kv_str(arg, name, value);
}

static void count_setting(const char *name, const char *value,
			  const char *source, const char *doc, void *arg)
{
	(void)name;
	(void)value;
	(void)source;
	(void)doc;
	(*(uint32_t *)arg)++;
}

void kilnd_pack_stats(kilnd_server_t *s, msgpack_packer *pk,
		      const kiln_cache_stats_t *st)
{
	uint32_t q, busy, total;
	kilnd_pool_load(s->pool, &q, &busy, &total);
	double p50, p90, p99;
	kilnd_latency_quantiles(&s->lat, &p50, &p90, &p99);
	msgpack_pack_map(pk, 21);
	kv_f64(pk, "uptime_s", (double)(kilnd_now_ms(s) - s->started_ms) / 1e3);
	kv_u64(pk, "rss_bytes", kilnd_rss_bytes());
	pk_str(pk, "connections");
	msgpack_pack_map(pk, 4);
	kv_u64(pk, "current", s->nconns);
	kv_u64(pk, "total", ctr_sum(s, KILND_C_conn_total));
	kv_u64(pk, "rejected", ctr_sum(s, KILND_C_conn_rejected));
	kv_u64(pk, "idle_closed", ctr_sum(s, KILND_C_conn_idle_closed));
	pk_str(pk, "requests");
	msgpack_pack_map(pk, KILN_OP__COUNT);
	for (int op = 0; op < KILN_OP__COUNT; op++)
		kv_u64(pk, kiln_op_name((kiln_op_t)op),
		       ctr_sum(s, KILND_C_req_hello + op));
	pk_str(pk, "hits");
	msgpack_pack_map(pk, 3);
	kv_u64(pk, "memory", ctr_sum(s, KILND_C_hit_memory));
	kv_u64(pk, "disk", ctr_sum(s, KILND_C_hit_disk));
	kv_u64(pk, "remote", ctr_sum(s, KILND_C_hit_remote));
	kv_u64(pk, "compiled", ctr_sum(s, KILND_C_compiled));
	kv_u64(pk, "joined", ctr_sum(s, KILND_C_joined));
	kv_u64(pk, "lookup_misses", ctr_sum(s, KILND_C_lookup_misses));
	kv_u64(pk, "failed", ctr_sum(s, KILND_C_failed));
	kv_u64(pk, "timeouts", ctr_sum(s, KILND_C_timeouts));
	kv_u64(pk, "busy", ctr_sum(s, KILND_C_busy));
	kv_u64(pk, "bad_frames", ctr_sum(s, KILND_C_bad_frames));
	kv_u64(pk, "read_paused", ctr_sum(s, KILND_C_read_paused));
	kv_u64(pk, "store_put_errors", ctr_sum(s, KILND_C_store_put_errors));
	pk_str(pk, "dynamic");
	msgpack_pack_map(pk, 3);
	kv_u64(pk, "compiles", ctr_sum(s, KILND_C_dynamic_compiles));
	kv_u64(pk, "hits", ctr_sum(s, KILND_C_dynamic_hits));
	kv_u64(pk, "refused", ctr_sum(s, KILND_C_dynamic_refused));
	pk_str(pk, "queue");
	msgpack_pack_map(pk, 3);
	kv_u64(pk, "depth", q);
	kv_u64(pk, "max", s->cfg.queue_depth);
	kv_u64(pk, "in_flight", s->njobs);
	pk_str(pk, "workers");
	msgpack_pack_map(pk, 5);
	kv_u64(pk, "busy", busy);
	kv_u64(pk, "total", total);
	kv_u64(pk, "processes", kilnd_pool_alive(s->pool));
	kv_u64(pk, "spawns", ctr_sum(s, KILND_C_worker_spawns));
	kv_u64(pk, "crashes", ctr_sum(s, KILND_C_worker_crashes));
	pk_str(pk, "compile_ms");
	msgpack_pack_map(pk, 3);
	kv_f64(pk, "p50", p50);
	kv_f64(pk, "p90", p90);
	kv_f64(pk, "p99", p99);
	pk_str(pk, "hot");
	msgpack_pack_map(pk, 3);
	kv_u64(pk, "entries", kilnd_hot_count(s->hot));
	kv_u64(pk, "bytes", kilnd_hot_bytes(s->hot));
	kv_u64(pk, "max_bytes", s->cfg.hot_bytes);
	pk_str(pk, "store");
	uint32_t nst = 0;
#define KILND__COUNT_STAT(name, doc) nst++;
	KILN_CACHE_STATS(KILND__COUNT_STAT)
#undef KILND__COUNT_STAT
	msgpack_pack_map(pk, nst);
	kiln_cache_stats_each(st, pack_store_stat, pk);
	pk_str(pk, "errors");
	uint32_t ne = 0;
	for (int i = 1; i < 32; i++)
		if (ctr_sum_err(s, i) > 0)
			ne++;
	msgpack_pack_map(pk, ne);
	for (int i = 1; i < 32; i++) {
		uint64_t v = ctr_sum_err(s, i);
		if (v > 0)
			kv_u64(pk, kiln_err_wire_name(-3000 - i), v);
	}
}

static void answer_status(opwork_t *o)
{
	kilnd_server_t *s = o->srv;
	reply_t r;
	reply_begin(&r, o->id, o->settings ? 2 : 1);
	pk_str(&r.pk, "stats");
	kilnd_pack_stats(s, &r.pk, &o->st);
	if (o->settings) {
		uint32_t n = 0;
		kilnd_config_each(&s->cfg, count_setting, &n);
		pk_str(&r.pk, "settings");
		msgpack_pack_map(&r.pk, n);
		kilnd_config_each(&s->cfg, pack_setting, &r.pk);
	}
	kilnd_reply_packed(o->conn, &r.sb);
}

static void op_status(kilnd_conn_t *c, const kiln_request_t *req)
{
	const msgpack_object *so = kiln_map_get(&req->body, "settings");
	if (so != NULL && so->type != MSGPACK_OBJECT_NIL &&
	    so->type != MSGPACK_OBJECT_BOOLEAN) {
		bad_request(c, req->id, "%s: want a bool", "settings");
		return;
	}
	bool settings =
	    so != NULL && so->type == MSGPACK_OBJECT_BOOLEAN && so->via.boolean;
	if (settings && !kilnd_conn_is_admin(c)) {
		kilnd_reply_error(c, req->id, KILN_EPERM,
				  "settings are for admin peers (root, kilnd's "
				  "user or the admin group)",
				  -1);
		return;
	}
	opwork_t *o = opwork_new(c, req);
	if (o == NULL)
		return;
	o->settings = settings;
	queue_op(o, status_work);
}

/* ---- list -------------------------------------------------------------- */

static void list_work(uv_work_t *w)
{
	opwork_t *o = w->data;
	kiln_cache_filter_t f;
	kiln_cache_filter_init(&f);
	if (o->target[0] != '\0')
		f.target = o->target;
	o->rc = kiln_cache_list(o->srv->store, &f, o->order, o->limit,
				&o->entries, &o->n, o->err, sizeof(o->err));
}

static void answer_list(opwork_t *o)
{
	reply_t r;
	reply_begin(&r, o->id, 1);
	pk_str(&r.pk, "entries");
	msgpack_pack_array(&r.pk, (uint32_t)o->n);
	for (size_t i = 0; i < o->n; i++) {
		const kiln_cache_entry_t *e = &o->entries[i];
		char hex[KILN_SIG_HEX];
		kiln_sig_to_hex(e->key, hex);
		msgpack_pack_map(&r.pk, 8);
		kv_str(&r.pk, "signature", hex);
		kv_u64(&r.pk, "size", e->size);
		kv_str(&r.pk, "target", e->target);
		kv_u64(&r.pk, "created", (uint64_t)e->created);
		kv_u64(&r.pk, "last_used", (uint64_t)e->last_used);
		kv_u64(&r.pk, "hits", e->hits);
		kv_u64(&r.pk, "compile_ms", e->compile_ms);
		kv_str(&r.pk, "source",
		       e->source == KILN_CACHE_SOURCE_REMOTE ? "remote"
							     : "compiled");
	}
	kilnd_reply_packed(o->conn, &r.sb);
}

static void op_list(kilnd_conn_t *c, const kiln_request_t *req)
{
	opwork_t *o = opwork_new(c, req);
	if (o == NULL)
		return;
	o->order = KILN_CACHE_ORDER_LRU;
	o->limit = 100;
	const msgpack_object *v = kiln_map_get(&req->body, "order");
	if (v != NULL && v->type != MSGPACK_OBJECT_NIL) {
		if (kiln_obj_streq(v, "last_used"))
			o->order = KILN_CACHE_ORDER_LRU;
		else if (kiln_obj_streq(v, "size"))
			o->order = KILN_CACHE_ORDER_SIZE;
		else if (kiln_obj_streq(v, "hits"))
			o->order = KILN_CACHE_ORDER_HITS;
		else if (kiln_obj_streq(v, "created"))
			o->order = KILN_CACHE_ORDER_CREATED;
		else {
			free(o);
			bad_request(c, req->id,
				    "order: want last_used, size, hits or "
				    "created%s",
				    "");
			return;
		}
	}
	v = kiln_map_get(&req->body, "limit");
	if (v != NULL && v->type != MSGPACK_OBJECT_NIL) {
		if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    v->via.u64 > 1000000) {
			free(o);
			bad_request(c, req->id, "%s: want 0..1000000", "limit");
			return;
		}
		o->limit = (uint32_t)v->via.u64;
		if (o->limit == 0) { /* "at most 0 entries" */
			reply_t r;
			reply_begin(&r, req->id, 1);
			pk_str(&r.pk, "entries");
			msgpack_pack_array(&r.pk, 0);
			kilnd_reply_packed(c, &r.sb);
			free(o);
			return;
		}
	}
	v = kiln_map_get(&req->body, "target");
	if (v != NULL && v->type != MSGPACK_OBJECT_NIL) {
		if (v->type != MSGPACK_OBJECT_STR ||
		    v->via.str.size >= sizeof(o->target)) {
			free(o);
			bad_request(c, req->id, "%s: want a backend name",
				    "target");
			return;
		}
		memcpy(o->target, v->via.str.ptr, v->via.str.size);
	}
	queue_op(o, list_work);
}

/* ---- evict, gc --------------------------------------------------------- */

static void evict_work(uv_work_t *w)
{
	opwork_t *o = w->data;
	kiln_cache_t *st = o->srv->store;
	kiln_cache_stats_t a, b;
	kiln_cache_stats(st, &a, NULL, 0);
	if (o->has_sig) {
		o->rc = kiln_cache_evict(st, o->sig, o->err, sizeof(o->err));
		o->evicted = o->rc == 0;
		if (o->rc == 0 && (o->keys = malloc(KILN_CACHE_KEY_BYTES))) {
			memcpy(o->keys[0], o->sig, KILN_CACHE_KEY_BYTES);
			o->nkeys = 1;
		}
	} else {
		kiln_cache_filter_t f;
		kiln_cache_filter_init(&f);
		if (!o->all)
			f.unused_since =
			    (int64_t)time(NULL) - (int64_t)o->older_than_s;
		kiln_cache_entry_t *e = NULL;
		size_t n = 0;
		o->rc = kiln_cache_list(st, &f, KILN_CACHE_ORDER_LRU, 0, &e, &n,
					o->err, sizeof(o->err));
		o->keys = n > 0 ? malloc(n * KILN_CACHE_KEY_BYTES) : NULL;
		for (size_t i = 0; o->rc == 0 && i < n; i++) {
			int rc = kiln_cache_evict(st, e[i].key, o->err,
						  sizeof(o->err));
			if (rc == 0) {
				o->evicted++;
				if (o->keys != NULL)
					memcpy(o->keys[o->nkeys++], e[i].key,
					       KILN_CACHE_KEY_BYTES);
			} else if (rc != KILN_ENOTFOUND) {
				o->rc = rc;
			}
		}
		free(e);
	}
	kiln_cache_stats(st, &b, NULL, 0);
	o->freed = a.bytes > b.bytes ? a.bytes - b.bytes : 0;
	o->st = b;
}

static void answer_evict(opwork_t *o)
{
	kilnd_server_t *s = o->srv;
	if (o->all)
		kilnd_hot_clear(s->hot);
	else
		for (size_t i = 0; i < o->nkeys; i++)
			kilnd_hot_remove(s->hot, o->keys[i]);
	reply_t r;
	reply_begin(&r, o->id, 2);
	kv_u64(&r.pk, "evicted", o->evicted);
	kv_u64(&r.pk, "bytes", o->freed);
	kilnd_reply_packed(o->conn, &r.sb);
}

static void op_evict(kilnd_conn_t *c, const kiln_request_t *req)
{
	opwork_t *o = opwork_new(c, req);
	if (o == NULL)
		return;
	const msgpack_object *so = kiln_map_get(&req->body, "signature");
	const msgpack_object *oo = kiln_map_get(&req->body, "older_than_s");
	const msgpack_object *ao = kiln_map_get(&req->body, "all");
	int given = (so != NULL) + (oo != NULL) + (ao != NULL);
	const char *bad = NULL;
	if (given != 1)
		bad = "evict: give exactly one of signature, older_than_s, all";
	else if (so != NULL &&
		 (so->type != MSGPACK_OBJECT_STR ||
		  kiln_sig_from_hex(so->via.str.ptr, so->via.str.size, o->sig) <
		      0))
		bad = "signature: want 64 hex characters";
	else if (oo != NULL && oo->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		bad = "older_than_s: want a non-negative integer";
	else if (ao != NULL &&
		 (ao->type != MSGPACK_OBJECT_BOOLEAN || !ao->via.boolean))
		bad = "all: want true";
	if (bad != NULL) {
		free(o);
		kilnd_reply_error(c, req->id, KILN_EBADREQ, bad, -1);
		return;
	}
	o->has_sig = so != NULL;
	o->older_than_s = oo != NULL ? oo->via.u64 : 0;
	o->all = ao != NULL;
	queue_op(o, evict_work);
}

static void gc_work(uv_work_t *w)
{
	opwork_t *o = w->data;
	kiln_cache_stats_t a;
	kiln_cache_stats(o->srv->store, &a, NULL, 0);
	o->rc = kiln_cache_gc(o->srv->store, o->max_bytes, &o->evicted, o->err,
			      sizeof(o->err));
	kiln_cache_stats(o->srv->store, &o->st, NULL, 0);
	o->freed = a.bytes > o->st.bytes ? a.bytes - o->st.bytes : 0;
}

static void answer_gc(opwork_t *o)
{
	reply_t r;
	reply_begin(&r, o->id, 4);
	kv_u64(&r.pk, "evicted", o->evicted);
	kv_u64(&r.pk, "bytes", o->freed);
	kv_u64(&r.pk, "entries", o->st.entries);
	kv_u64(&r.pk, "store_bytes", o->st.bytes);
	kilnd_reply_packed(o->conn, &r.sb);
}

static void op_gc(kilnd_conn_t *c, const kiln_request_t *req)
{
	opwork_t *o = opwork_new(c, req);
	if (o == NULL)
		return;
	o->max_bytes = UINT64_MAX;
	const msgpack_object *v = kiln_map_get(&req->body, "max_bytes");
	if (v != NULL && v->type != MSGPACK_OBJECT_NIL) {
		if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
			free(o);
			bad_request(c, req->id, "%s: want a byte count",
				    "max_bytes");
			return;
		}
		o->max_bytes = v->via.u64;
	}
	queue_op(o, gc_work);
}

/* ---- shutdown ---------------------------------------------------------- */

static void op_shutdown(kilnd_conn_t *c, const kiln_request_t *req)
{
	bool drain = true;
	const msgpack_object *v = kiln_map_get(&req->body, "drain");
	if (v != NULL && v->type != MSGPACK_OBJECT_NIL) {
		if (v->type != MSGPACK_OBJECT_BOOLEAN) {
			bad_request(c, req->id, "%s: want a bool", "drain");
			return;
		}
		drain = v->via.boolean;
	}
	KILN_LOG(KILN_LOG_INFO, "msg=\"shutdown requested\" pid=%ld drain=%d",
		 (long)c->pid, drain);
	reply_t r;
	reply_begin(&r, req->id, 0);
	kilnd_reply_packed(c, &r.sb);
	kilnd_drain(c->srv, drain);
}

/* ---- the after-work callback and dispatch ------------------------------ */

static void work_after(uv_work_t *w, int status)
{
	opwork_t *o = w->data;
	kilnd_server_t *s = o->srv;
	s->pending_work--;
	if (status < 0) {
		o->rc = KILN_EINTERNAL;
		snprintf(o->err, sizeof(o->err), "%s", uv_strerror(status));
	}
	if (o->rc < 0) {
		kilnd_reply_error(o->conn, o->id, o->rc, o->err, -1);
	} else {
		switch (o->op) {
		case KILN_OP_LOOKUP:
			KILND_COUNT(&s->ctr, hit_disk);
			kilnd_hot_put(s->hot, o->blob);
			kilnd_reply_artifact(o->conn, o->id, o->blob, "disk",
					     o->blob->compile_ms);
			break;
		case KILN_OP_STATUS: answer_status(o); break;
		case KILN_OP_LIST: answer_list(o); break;
		case KILN_OP_EVICT: answer_evict(o); break;
		case KILN_OP_GC: answer_gc(o); break;
		default:
			kilnd_reply_error(o->conn, o->id, KILN_EINTERNAL,
					  "unexpected op", -1);
		}
	}
	kilnd_blob_unref(o->blob);
	free(o->entries);
	free(o->keys);
	kilnd_conn_unref(o->conn);
	free(o);
}

void kilnd_dispatch(kilnd_conn_t *c, const kiln_request_t *req)
{
	kilnd_server_t *s = c->srv;
	atomic_fetch_add_explicit(&s->ctr.v[KILND_C_req_hello + req->op], 1,
				  memory_order_relaxed);
	if (kiln_op_is_admin(req->op) && !kilnd_conn_is_admin(c)) {
		char m[200];
		snprintf(m, sizeof(m),
			 "%s is an admin op: root, kilnd's user or the admin "
			 "group only",
			 kiln_op_name(req->op));
		kilnd_reply_error(c, req->id, KILN_EPERM, m, -1);
		return;
	}
	switch (req->op) {
	case KILN_OP_HELLO: op_hello(c, req); break;
	case KILN_OP_COMPILE: op_compile(c, req); break;
	case KILN_OP_LOOKUP: op_lookup(c, req); break;
	case KILN_OP_STATUS: op_status(c, req); break;
	case KILN_OP_LIST: op_list(c, req); break;
	case KILN_OP_EVICT: op_evict(c, req); break;
	case KILN_OP_GC: op_gc(c, req); break;
	case KILN_OP_SHUTDOWN: op_shutdown(c, req); break;
	default: kilnd_reply_error(c, req->id, KILN_EBADREQ, "unknown op", -1);
	}
}
