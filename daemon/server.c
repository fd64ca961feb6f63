/*
 * server.c — kilnd's loop thread: listeners (own socket, TCP, socket
 * activation), connections (frames in, replies out, backpressure, idle
 * timeout), the in-flight table (single flight), the hand-off to the store
 * and the compile pool, signals, the 1-second tick (timeouts, idle,
 * watchdog, STATUS=, drain) and start-up/shut-down.
 *
 * Invariants:
 *   - every decoded request is answered exactly once, unless its connection
 *     closed first (then the answer is dropped);
 *   - a connection's memory lives while its handle is open or anything
 *     (waiter, work item, write) still refers to it (conn->refs);
 *   - a job is in the in-flight table from kilnd_job_start until the loop
 *     takes it off the done queue (or its store lookup hits / its submit
 *     fails); requests for its signature join it meanwhile.
 *
 * Threads: the loop thread, except job_done_cb's caller (a worker) and
 * store_lookup_work (libuv's pool), which touch only the job and the done
 * queue.
 */
#include "daemon/server.h"
#include "daemon/sd.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define READ_BUF (64 * 1024)

uint64_t kilnd_now_ms(kilnd_server_t *s)
{
	return uv_now(s->loop);
}

#define MEM_HITS_MAX 65536

void kilnd_memory_hit(kilnd_server_t *s, const uint8_t sig[32])
{
	KILND_COUNT(&s->ctr, hit_memory);
	if (s->mem_hits == NULL || s->n_mem_hits >= MEM_HITS_MAX)
		return; /* the store's LRU is approximate; memory is bounded */
	memcpy(s->mem_hits[s->n_mem_hits++], sig, KILN_SIG_BYTES);
}

typedef struct touch_work {
	uv_work_t work;
	kilnd_server_t *srv;
	uint8_t (*sigs)[KILN_SIG_BYTES];
	size_t n;
} touch_work_t;

static int sig_cmp(const void *a, const void *b)
{
	return memcmp(a, b, KILN_SIG_BYTES);
}

static void touch_work(uv_work_t *w)
{
	touch_work_t *t = w->data;
	/* One touch per signature, with its count: a hot kernel served a
	 * thousand times a second is one store update. */
	qsort(t->sigs, t->n, KILN_SIG_BYTES, sig_cmp);
	for (size_t i = 0; i < t->n;) {
		size_t j = i + 1;
		while (j < t->n &&
		       memcmp(t->sigs[i], t->sigs[j], KILN_SIG_BYTES) == 0)
			j++;
		kiln_cache_touch_n(t->srv->store, t->sigs[i], (uint32_t)(j - i),
				   NULL, 0);
		i = j;
	}
}

static void touch_after(uv_work_t *w, int status)
{
	(void)status;
	touch_work_t *t = w->data;
	t->srv->pending_work--;
	t->srv->mem_hits_busy = false;
	free(t->sigs);
	free(t);
}

/* Hands the hot-map hits of the last second to the store. */
static void flush_memory_hits(kilnd_server_t *s)
{
	if (s->n_mem_hits == 0 || s->mem_hits_busy)
		return;
	touch_work_t *t = calloc(1, sizeof(*t));
	uint8_t(*fresh)[KILN_SIG_BYTES] = malloc(MEM_HITS_MAX * sizeof(*fresh));
	if (t == NULL || fresh == NULL) {
		free(t);
		free(fresh);
		return;
	}
	t->srv = s;
	t->sigs = s->mem_hits;
	t->n = s->n_mem_hits;
	s->mem_hits = fresh;
	s->n_mem_hits = 0;
	t->work.data = t;
	s->pending_work++;
	s->mem_hits_busy = true;
	if (uv_queue_work(s->loop, &t->work, touch_work, touch_after) < 0) {
		s->pending_work--;
		s->mem_hits_busy = false;
		free(t->sigs);
		free(t);
	}
}

/* ---- connections -------------------------------------------------------- */

void kilnd_conn_ref(kilnd_conn_t *c)
{
	c->refs++;
}

void kilnd_conn_unref(kilnd_conn_t *c)
{
	if (--c->refs > 0)
		return;
	kiln_frame_decoder_free(&c->dec);
	free(c);
}

static void conn_closed_cb(uv_handle_t *h)
{
	kilnd_conn_t *c = h->data;
	kilnd_conn_unref(c);
}

static void conn_close(kilnd_conn_t *c, const char *why)
{
	if (c->closing)
		return;
	c->closing = true;
	kilnd_server_t *s = c->srv;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->nconns--;
	KILN_LOG(KILN_LOG_DEBUG,
		 "msg=\"connection closed\" conn=%llu pid=%ld "
		 "why=\"%s\"",
		 (unsigned long long)c->num, (long)c->pid, why);
	uv_close((uv_handle_t *)&c->h.stream, conn_closed_cb);
}

bool kilnd_conn_is_admin(kilnd_conn_t *c)
{
	if (!c->creds)
		return false; /* TCP peers are never admin */
	if (c->uid == 0 || c->uid == geteuid())
		return true;
	const char *g = c->srv->cfg.admin_group;
	return g != NULL && g[0] != '\0' &&
	       kilnd_uid_in_group(c->uid, c->gid, g);
}

/* ---- writing replies ---------------------------------------------------- */

typedef struct wreq {
	uv_write_t req;
	kilnd_conn_t *conn;
	char *head;
	size_t bytes;
	kilnd_blob_t *blob;
} wreq_t;

static void write_cb(uv_write_t *req, int status)
{
	wreq_t *w = (wreq_t *)req;
	kilnd_conn_t *c = w->conn;
	c->pending_write -= w->bytes;
	if (status < 0 && status != UV_ECANCELED)
		conn_close(c, uv_strerror(status));
	else if (c->close_when_written && c->pending_write == 0)
		conn_close(c, "shutdown: replies written");
	else if (c->paused && !c->closing && !c->close_when_written &&
		 c->pending_write <= c->srv->cfg.max_pending_write_bytes / 2) {
		c->paused = false;
		extern void kilnd__read_start(kilnd_conn_t * c);
		kilnd__read_start(c);
	}
	free(w->head);
	kilnd_blob_unref(w->blob);
	free(w);
	kilnd_conn_unref(c);
}

/* Queues head (malloc'd, taken) and the blob's bytes (a reference taken)
 * as one frame already framed by the caller. */
static void conn_write(kilnd_conn_t *c, char *head, size_t head_len,
		       kilnd_blob_t *blob)
{
	if (c->inflight > 0)
		c->inflight--;
	if (c->closing) {
		free(head);
		return;
	}
	wreq_t *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		free(head);
		conn_close(c, "out of memory");
		return;
	}
	uv_buf_t bufs[2];
	unsigned nb = 0;
	bufs[nb++] = uv_buf_init(head, (unsigned)head_len);
	if (blob != NULL && blob->len > 0)
		bufs[nb++] =
		    uv_buf_init((char *)blob->data, (unsigned)blob->len);
	w->conn = c;
	w->head = head;
	w->blob = blob != NULL ? kilnd_blob_ref(blob) : NULL;
	w->bytes = head_len + (blob != NULL ? blob->len : 0);
	kilnd_conn_ref(c);
	c->pending_write += w->bytes;
	c->last_active_ms = kilnd_now_ms(c->srv);
	int rc = uv_write(&w->req, &c->h.stream, bufs, nb, write_cb);
	if (rc < 0) {
		c->pending_write -= w->bytes;
		free(w->head);
		kilnd_blob_unref(w->blob);
		free(w);
		kilnd_conn_unref(c);
		conn_close(c, uv_strerror(rc));
		return;
	}
	/* Backpressure: a client that does not read its replies stops being
	 * read from. */
	if (!c->paused &&
	    c->pending_write > c->srv->cfg.max_pending_write_bytes) {
		c->paused = true;
		uv_read_stop(&c->h.stream);
		KILND_COUNT(&c->srv->ctr, read_paused);
	}
}

void kilnd_reply_packed(kilnd_conn_t *c, msgpack_sbuffer *sb)
{
	if (kiln_frame_end(sb, SIZE_MAX) < 0) {
		msgpack_sbuffer_destroy(sb);
		return;
	}
	conn_write(c, sb->data, sb->size, NULL);
	sb->data = NULL;
}

void kilnd_reply_error(kilnd_conn_t *c, uint64_t id, int code, const char *msg,
		       int64_t node)
{
	/* A lookup miss is the protocol working (the client then sends
	 * the graph), not an error. */
	if (code == KILN_ENOTFOUND)
		KILND_COUNT(&c->srv->ctr, lookup_misses);
	else
		kilnd_count_error(&c->srv->ctr, code);
	KILN_LOG(code == KILN_ENOTFOUND ? KILN_LOG_DEBUG : KILN_LOG_INFO,
		 "msg=\"request failed\" conn=%llu pid=%ld id=%llu code=%s "
		 "err=\"%s\"",
		 (unsigned long long)c->num, (long)c->pid,
		 (unsigned long long)id, kiln_err_wire_name(code),
		 msg != NULL ? msg : "");
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	kiln_pack_error(&pk, id, code, msg != NULL ? msg : kiln_strerror(code),
			node);
	kilnd_reply_packed(c, &sb);
}

void kilnd_reply_artifact(kilnd_conn_t *c, uint64_t id, kilnd_blob_t *b,
			  const char *source, double compile_ms)
{
	char hex[KILN_SIG_HEX];
	kiln_sig_to_hex(b->sig, hex);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	kiln_pack_ok_head(&pk, id, 4);
	kiln_pack_cstr(&pk, "signature");
	kiln_pack_cstr(&pk, hex);
	kiln_pack_cstr(&pk, "source");
	kiln_pack_cstr(&pk, source);
	kiln_pack_cstr(&pk, "compile_ms");
	msgpack_pack_double(&pk, compile_ms);
	kiln_pack_cstr(&pk, "artifact"); /* last: its bytes follow */
	msgpack_pack_bin(&pk, b->len);
	/* The frame length covers the blob written after the head. */
	uint64_t n = sb.size - 4 + b->len;
	if (n > UINT32_MAX) {
		msgpack_sbuffer_destroy(&sb);
		kilnd_reply_error(c, id, KILN_ETOOLARGE,
				  "artifact exceeds the frame limit", -1);
		return;
	}
	uint8_t *p = (uint8_t *)sb.data;
	p[0] = (uint8_t)(n >> 24);
	p[1] = (uint8_t)(n >> 16);
	p[2] = (uint8_t)(n >> 8);
	p[3] = (uint8_t)n;
	conn_write(c, sb.data, sb.size, b);
}

/* ---- reading requests --------------------------------------------------- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	(void)h;
	(void)suggested;
	static char slab[READ_BUF]; /* loop thread only; consumed at once */
	*buf = uv_buf_init(slab, sizeof(slab));
}

/* A repeated compile whose artifact is in the hot map, recognized by its
 * bytes (memo.c): answered without decoding. True when answered. */
static bool fast_compile(kilnd_conn_t *c, const kilnd_memo_key_t *mk)
{
	kilnd_server_t *s = c->srv;
	uint8_t sig[KILN_SIG_BYTES];
	if (s->draining || !kilnd_memo_get(s, mk, sig))
		return false;
	kilnd_blob_t *b = kilnd_hot_get(s->hot, sig);
	if (b == NULL)
		return false;
	c->inflight++;
	atomic_fetch_add_explicit(&s->ctr.v[KILND_C_req_compile], 1,
				  memory_order_relaxed);
	if (c->inflight > s->cfg.max_inflight) {
		char m[128];
		snprintf(m, sizeof(m),
			 "more than %u requests in flight on this connection",
			 s->cfg.max_inflight);
		KILND_COUNT(&s->ctr, busy);
		kilnd_reply_error(c, mk->id, KILN_EBUSY, m, -1);
	} else {
		kilnd_memory_hit(s, sig);
		kilnd_reply_artifact(c, mk->id, b, "memory", b->compile_ms);
	}
	kilnd_blob_unref(b);
	return true;
}

static void handle_body(kilnd_conn_t *c, const uint8_t *body, size_t len)
{
	kilnd_server_t *s = c->srv;
	kilnd_memo_key_t mk;
	bool memo = kilnd_memo_key(body, len, &mk);
	if (memo && fast_compile(c, &mk))
		return;
	msgpack_zone zone;
	msgpack_zone_init(&zone, 4096);
	kiln_request_t req;
	char err[512] = "";
	int rc = kiln_request_decode(body, len, &s->lim, &zone, &req, err,
				     sizeof(err));
	c->inflight++;
	if (rc < 0) {
		kilnd_reply_error(c, req.has_id ? req.id : 0, rc, err, -1);
		if (rc == KILN_EBADFRAME) {
			KILND_COUNT(&s->ctr, bad_frames);
			conn_close(c, "bad frame");
		}
	} else if (c->inflight > s->cfg.max_inflight) {
		char m[128];
		snprintf(m, sizeof(m),
			 "more than %u requests in flight on this connection",
			 s->cfg.max_inflight);
		KILND_COUNT(&s->ctr, busy);
		kilnd_reply_error(c, req.id, KILN_EBUSY, m, -1);
	} else {
		KILN_LOG(KILN_LOG_DEBUG,
			 "msg=request conn=%llu pid=%ld id=%llu op=%s",
			 (unsigned long long)c->num, (long)c->pid,
			 (unsigned long long)req.id, kiln_op_name(req.op));
		s->cur_memo = memo && req.op == KILN_OP_COMPILE ? &mk : NULL;
		kilnd_dispatch(c, &req);
		s->cur_memo = NULL;
	}
	msgpack_zone_destroy(&zone);
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	kilnd_conn_t *c = stream->data;
	if (nread < 0) {
		conn_close(c,
			   nread == UV_EOF ? "eof" : uv_strerror((int)nread));
		return;
	}
	c->last_active_ms = kilnd_now_ms(c->srv);
	const uint8_t *p = (const uint8_t *)buf->base;
	size_t n = (size_t)nread;
	kilnd_conn_ref(c); /* a reply may close it mid-loop */
	while (n > 0 && !c->closing) {
		uint8_t *body = NULL;
		size_t blen = 0;
		char err[256];
		int rc = kiln_frame_feed(&c->dec, &p, &n, &body, &blen, err,
					 sizeof(err));
		if (rc == 1) {
			handle_body(c, body, blen);
			free(body);
			continue;
		}
		if (rc < 0) {
			c->inflight++;
			kilnd_reply_error(c, 0, rc, err, -1);
			KILND_COUNT(&c->srv->ctr, bad_frames);
			conn_close(c, "bad frame");
		}
		break;
	}
	kilnd_conn_unref(c);
}

void kilnd__read_start(kilnd_conn_t *c);
void kilnd__read_start(kilnd_conn_t *c)
{
	if (!c->closing)
		uv_read_start(&c->h.stream, alloc_cb, read_cb);
}

static void on_connection(uv_stream_t *server, int status)
{
	kilnd_server_t *s = server->data;
	if (status < 0) {
		KILN_LOG(KILN_LOG_WARN, "msg=\"accept failed\" err=\"%s\"",
			 uv_strerror(status));
		return;
	}
	bool is_unix = server->type == UV_NAMED_PIPE;
	kilnd_conn_t *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return;
	c->srv = s;
	c->refs = 1;
	c->is_unix = is_unix;
	int rc = is_unix ? uv_pipe_init(s->loop, &c->h.pipe, 0)
			 : uv_tcp_init(s->loop, &c->h.tcp);
	if (rc < 0) {
		free(c);
		return;
	}
	c->h.stream.data = c;
	if (uv_accept(server, &c->h.stream) < 0) {
		uv_close((uv_handle_t *)&c->h.stream, conn_closed_cb);
		return;
	}
	kiln_frame_decoder_init(&c->dec, s->cfg.max_frame_bytes);
	c->num = ++s->conn_seq;
	c->last_active_ms = kilnd_now_ms(s);
	uv_os_fd_t fd;
	if (is_unix && uv_fileno((uv_handle_t *)&c->h.stream, &fd) == 0)
		c->creds = kilnd_peer_cred(fd, &c->pid, &c->uid, &c->gid) == 0;
	if (!is_unix)
		uv_tcp_nodelay(&c->h.tcp, 1);
	/* Link it first so that conn_close can unlink it. */
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->nconns++;
	KILND_COUNT(&s->ctr, conn_total);
	if (s->nconns > s->cfg.max_connections || s->draining) {
		char m[128];
		snprintf(m, sizeof(m),
			 s->draining ? "kilnd is shutting down"
				     : "too many connections (max_connections "
				       "%u)",
			 s->cfg.max_connections);
		if (!s->draining)
			KILND_COUNT(&s->ctr, conn_rejected);
		c->inflight++;
		kilnd_reply_error(
		    c, 0, s->draining ? KILN_ESHUTDOWN : KILN_EBUSY, m, -1);
		conn_close(c, "over max_connections");
		return;
	}
	KILN_LOG(KILN_LOG_DEBUG, "msg=\"connection\" conn=%llu pid=%ld uid=%ld",
		 (unsigned long long)c->num, (long)c->pid, (long)c->uid);
	kilnd__read_start(c);
}

/* ---- jobs: single flight ----------------------------------------------- */

static size_t job_slot(kilnd_server_t *s, const uint8_t sig[32])
{
	uint64_t x;
	memcpy(&x, sig, 8);
	return (size_t)(x % s->jobs_cap);
}

kilnd_job_t *kilnd_job_find(kilnd_server_t *s, const uint8_t sig[32])
{
	for (kilnd_job_t *j = s->jobs[job_slot(s, sig)]; j; j = j->hnext)
		if (memcmp(j->sig, sig, 32) == 0)
			return j;
	return NULL;
}

static void job_table_remove(kilnd_server_t *s, kilnd_job_t *job)
{
	kilnd_job_t **pp = &s->jobs[job_slot(s, job->sig)];
	while (*pp != NULL && *pp != job)
		pp = &(*pp)->hnext;
	if (*pp == job) {
		*pp = job->hnext;
		s->njobs--;
	}
}

static void job_free(kilnd_job_t *job)
{
	kiln_graph_free(job->graph);
	kiln_graph_free(job->fallback);
	kilnd_blob_unref(job->result);
	free(job);
}

static void add_waiter(kilnd_server_t *s, kilnd_job_t *j, kilnd_conn_t *c,
		       uint64_t id)
{
	kilnd_waiter_t *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		kilnd_reply_error(c, id, -ENOMEM, "out of memory", -1);
		return;
	}
	w->conn = c;
	w->id = id;
	w->t0_ms = kilnd_now_ms(s);
	w->deadline_ms = w->t0_ms + (uint64_t)s->cfg.compile_timeout_s * 1000;
	kilnd_conn_ref(c);
	/* Append: the first waiter is the one that started the job. */
	kilnd_waiter_t **pp = &j->waiters;
	while (*pp)
		pp = &(*pp)->next;
	*pp = w;
}

void kilnd_job_join(kilnd_server_t *s, kilnd_job_t *j, kilnd_conn_t *c,
		    uint64_t id)
{
	KILND_COUNT(&s->ctr, joined);
	add_waiter(s, j, c, id);
}

/* Answers every waiter: with the blob (source per waiter), or the error. */
static void job_answer(kilnd_server_t *s, kilnd_job_t *j, kilnd_blob_t *b,
		       const char *first_source, const char *others_source,
		       int err, const char *msg, int64_t node)
{
	bool first = true;
	while (j->waiters != NULL) {
		kilnd_waiter_t *w = j->waiters;
		j->waiters = w->next;
		if (b != NULL)
			kilnd_reply_artifact(w->conn, w->id, b,
					     first ? first_source
						   : others_source,
					     b->compile_ms);
		else
			kilnd_reply_error(w->conn, w->id, err, msg, node);
		first = false;
		kilnd_conn_unref(w->conn);
		free(w);
	}
	(void)s;
}

static void job_done_cb(kilnd_job_t *job, void *arg)
{
	kilnd_server_t *s = arg;
	pthread_mutex_lock(&s->done_mu);
	job->dnext = NULL;
	if (s->done_tail)
		s->done_tail->dnext = job;
	else
		s->done_head = job;
	s->done_tail = job;
	pthread_mutex_unlock(&s->done_mu);
	uv_async_send(&s->done_async);
}

/* A generalized compile failed: its waiters get the static graph that
 * started it (joining a job for it, or a new one). */
static kilnd_job_t *job_new(kilnd_server_t *s, kiln_graph_t *g,
			    const kiln_target_t *t,
			    const kiln_compile_opts_t *o, kilnd_prio_t prio,
			    const uint8_t sig[32], uint64_t id, int64_t pid);

static void job_fall_back(kilnd_server_t *s, kilnd_job_t *old)
{
	kilnd_job_t *j = kilnd_job_find(s, old->fallback_sig);
	if (j == NULL) {
		j = job_new(s, old->fallback, &old->target, &old->opts,
			    old->prio, old->fallback_sig, old->req_id,
			    old->peer_pid);
		old->fallback = NULL;
	}
	if (j == NULL) {
		job_answer(s, old, NULL, NULL, NULL, -ENOMEM, "out of memory",
			   -1);
		return;
	}
	kilnd_waiter_t **pp = &j->waiters;
	while (*pp)
		pp = &(*pp)->next;
	*pp = old->waiters;
	old->waiters = NULL;
}

static void dyn_settle(kilnd_server_t *s, kilnd_job_t *j, bool ok)
{
	kilnd_dyn_t *e = j->dyn;
	/* The entry may have been reused for another structure since. */
	if (e == NULL || e->state == KILND_DYN_FREE ||
	    memcmp(e->h, j->dyn_h, KILN_SIG_BYTES) != 0 || e->gg == NULL)
		return;
	if (ok) {
		if (e->state == KILND_DYN_GENERALIZING)
			KILND_COUNT(&s->ctr, dynamic_compiles);
		e->state = KILND_DYN_GENERAL;
		return;
	}
	KILN_LOG(KILN_LOG_INFO,
		 "msg=\"generalized graph failed; static from now on\" "
		 "sig=%s err=\"%s\"",
		 j->sig_hex, j->err);
	KILND_COUNT(&s->ctr, dynamic_refused);
	e->state = KILND_DYN_STATIC;
	kiln_graph_free(e->gg);
	e->gg = NULL;
}

static void drain_soon(kilnd_server_t *s);

static void done_async_cb(uv_async_t *a)
{
	kilnd_server_t *s = a->data;
	pthread_mutex_lock(&s->done_mu);
	kilnd_job_t *list = s->done_head;
	s->done_head = s->done_tail = NULL;
	pthread_mutex_unlock(&s->done_mu);
	/* While draining, a finished compile may be the last one: let the
	 * drain step look now, not at the next one-second tick. */
	if (list != NULL && s->draining)
		drain_soon(s);
	while (list != NULL) {
		kilnd_job_t *j = list;
		list = j->dnext;
		job_table_remove(s, j);
		dyn_settle(s, j, j->rc == 0 && j->result != NULL);
		if (j->rc != 0 && j->fallback != NULL && j->waiters != NULL &&
		    j->rc != KILN_ESHUTDOWN) {
			job_fall_back(s, j);
			job_free(j);
			continue;
		}
		if (j->rc == 0 && j->result != NULL) {
			kilnd_latency_add(&s->lat, j->compile_ms);
			kilnd_hot_put(s->hot, j->result);
			KILN_LOG(KILN_LOG_INFO,
				 "msg=compiled sig=%s id=%llu pid=%lld ms=%.1f "
				 "bytes=%zu waiters=%s",
				 j->sig_hex, (unsigned long long)j->req_id,
				 (long long)j->peer_pid, j->compile_ms,
				 j->result->len, j->waiters ? "yes" : "none");
			job_answer(s, j, j->result, "compiled", "joined", 0,
				   NULL, -1);
		} else {
			KILN_LOG(
			    KILN_LOG_INFO,
			    "msg=\"compile failed\" sig=%s id=%llu code=%s "
			    "err=\"%s\"",
			    j->sig_hex, (unsigned long long)j->req_id,
			    kiln_err_wire_name(j->rc), j->err);
			job_answer(s, j, NULL, NULL, NULL, j->rc, j->err,
				   j->err_node);
		}
		job_free(j);
	}
}

void kilnd_job_run(kilnd_child_t *ch, kilnd_counters_t *ctr, kilnd_job_t *job)
{
	kilnd_server_t *s = job->srv;
	job->err_node = -1;
	uint8_t *bytes = NULL;
	size_t len = 0;
	double ms = 0;
	uint32_t symfb = 0;
	int rc = kilnd_child_compile(ch, job->graph, &job->opts, job->sig_hex,
				     &bytes, &len, &ms, &symfb, job->err,
				     sizeof(job->err));
	if (rc < 0) {
		job->rc = rc;
		KILND_COUNT(ctr, failed);
		return;
	}
	if (job->dyn_strict && symfb > 0) {
		/* a generalization that costs kernels: not stored, and its
		 * waiters get the static graph (done_async_cb) */
		free(bytes);
		KILND_COUNT(ctr, compiled);
		job->rc = KILN_EUNSUPOP;
		snprintf(job->err, sizeof(job->err),
			 "the generalized graph leaves %u ops to torch that "
			 "kiln compiles at static sizes",
			 symfb);
		return;
	}
	job->compile_ms = ms;
	job->result = kilnd_blob_new(job->sig, bytes, len, ms);
	if (job->result == NULL) {
		free(bytes);
		job->rc = -ENOMEM;
		snprintf(job->err, sizeof(job->err), "out of memory");
		return;
	}
	/* Store it (on this thread: the loop never touches disk). A store
	 * that cannot keep it (disk full) still lets us answer. */
	kiln_cache_meta_t meta = {job->target.backend, s->fingerprint,
				  (uint32_t)(ms + 0.5),
				  KILN_CACHE_SOURCE_COMPILED};
	char err[512];
	if (kiln_cache_put(s->store, job->sig, bytes, len, &meta, err,
			   sizeof(err)) < 0) {
		KILND_COUNT(ctr, store_put_errors);
		KILN_LOG(KILN_LOG_WARN,
			 "msg=\"artifact not stored\" sig=%s err=\"%s\"",
			 job->sig_hex, err);
	}
	free(bytes);
	KILND_COUNT(ctr, compiled);
	job->rc = 0;
}

static void store_lookup_work(uv_work_t *w)
{
	kilnd_job_t *j = w->data;
	kiln_cache_blob_t hit;
	char err[256];
	if (kiln_cache_get(j->srv->store, j->sig, &hit, err, sizeof(err)) ==
	    0) {
		j->result = kilnd_blob_new(j->sig, hit.data, hit.size,
					   hit.entry.compile_ms);
		kiln_cache_blob_release(&hit);
	}
}

static void store_lookup_after(uv_work_t *w, int status)
{
	kilnd_job_t *j = w->data;
	kilnd_server_t *s = j->srv;
	s->pending_work--;
	(void)status;
	if (j->result != NULL) {
		KILND_COUNT(&s->ctr, hit_disk);
		kilnd_hot_put(s->hot, j->result);
		job_table_remove(s, j);
		dyn_settle(s, j, true);
		job_answer(s, j, j->result, "disk", "disk", 0, NULL, -1);
		job_free(j);
		return;
	}
	if (j->waiters == NULL && s->draining) {
		job_table_remove(s, j);
		job_free(j);
		return;
	}
	int rc = kilnd_pool_submit(s->pool, j, j->prio);
	if (rc < 0) {
		job_table_remove(s, j);
		if (rc == KILN_EBUSY) {
			for (kilnd_waiter_t *w2 = j->waiters; w2; w2 = w2->next)
				KILND_COUNT(&s->ctr, busy);
		}
		job_answer(s, j, NULL, NULL, NULL, rc,
			   rc == KILN_EBUSY ? "the compile queue is full; "
					      "retry later"
					    : "kilnd is shutting down",
			   -1);
		job_free(j);
	}
}

/* A new job in the table, its store lookup queued; no waiters yet. Takes
 * g. NULL (g freed) when out of memory. */
static kilnd_job_t *job_new(kilnd_server_t *s, kiln_graph_t *g,
			    const kiln_target_t *t,
			    const kiln_compile_opts_t *o, kilnd_prio_t prio,
			    const uint8_t sig[32], uint64_t id, int64_t pid)
{
	kilnd_job_t *j = calloc(1, sizeof(*j));
	if (j == NULL) {
		kiln_graph_free(g);
		return NULL;
	}
	memcpy(j->sig, sig, 32);
	kiln_sig_to_hex(sig, j->sig_hex);
	j->graph = g;
	j->target = *t;
	j->opts = *o;
	j->prio = prio;
	j->srv = s;
	j->req_id = id;
	j->peer_pid = pid;
	j->err_node = -1;
	size_t slot = job_slot(s, sig);
	j->hnext = s->jobs[slot];
	s->jobs[slot] = j;
	s->njobs++;
	j->work.data = j;
	s->pending_work++;
	uv_queue_work(s->loop, &j->work, store_lookup_work, store_lookup_after);
	return j;
}

void kilnd_job_start(kilnd_server_t *s, kilnd_conn_t *c, uint64_t id,
		     kiln_graph_t *g, const kiln_target_t *t,
		     const kiln_compile_opts_t *o, kilnd_prio_t prio,
		     const uint8_t sig[32])
{
	kilnd_job_t *j = job_new(s, g, t, o, prio, sig, id, c->pid);
	if (j == NULL) {
		kilnd_reply_error(c, id, -ENOMEM, "out of memory", -1);
		return;
	}
	add_waiter(s, j, c, id);
}

void kilnd_serve(kilnd_server_t *s, kilnd_conn_t *c, uint64_t id,
		 kiln_graph_t *g, const kiln_target_t *t,
		 const kiln_compile_opts_t *o, kilnd_prio_t prio,
		 const uint8_t sig[32], kilnd_dyn_t *dyn,
		 kiln_graph_t *fallback, const uint8_t *fallback_sig)
{
	kilnd_blob_t *b = kilnd_hot_get(s->hot, sig);
	if (b != NULL) {
		kiln_graph_free(g);
		kiln_graph_free(fallback);
		kilnd_memory_hit(s, b->sig);
		kilnd_reply_artifact(c, id, b, "memory", b->compile_ms);
		kilnd_blob_unref(b);
		return;
	}
	kilnd_job_t *j = kilnd_job_find(s, sig);
	if (j != NULL) {
		kiln_graph_free(g);
		kiln_graph_free(fallback);
		kilnd_job_join(s, j, c, id);
		return;
	}
	j = job_new(s, g, t, o, prio, sig, id, c->pid);
	if (j == NULL) {
		kiln_graph_free(fallback);
		kilnd_reply_error(c, id, -ENOMEM, "out of memory", -1);
		return;
	}
	j->dyn = dyn;
	if (dyn != NULL)
		memcpy(j->dyn_h, dyn->h, KILN_SIG_BYTES);
	j->dyn_strict = dyn != NULL && fallback != NULL && !dyn->eager;
	j->fallback = fallback;
	if (fallback_sig != NULL)
		memcpy(j->fallback_sig, fallback_sig, KILN_SIG_BYTES);
	add_waiter(s, j, c, id);
}

/* Waiters past their deadline get timeout; the job runs on and its result
 * is still stored (and put in the hot map). */
static void expire_waiters(kilnd_server_t *s, uint64_t now)
{
	for (size_t i = 0; i < s->jobs_cap; i++) {
		for (kilnd_job_t *j = s->jobs[i]; j; j = j->hnext) {
			kilnd_waiter_t **pp = &j->waiters;
			while (*pp) {
				kilnd_waiter_t *w = *pp;
				if (w->deadline_ms > now) {
					pp = &w->next;
					continue;
				}
				*pp = w->next;
				char m[160];
				snprintf(m, sizeof(m),
					 "compile %s still running after %u s "
					 "(compile_timeout_s); the result will "
					 "be stored",
					 j->sig_hex, s->cfg.compile_timeout_s);
				KILND_COUNT(&s->ctr, timeouts);
				kilnd_reply_error(w->conn, w->id, KILN_ETIMEOUT,
						  m, -1);
				kilnd_conn_unref(w->conn);
				free(w);
			}
		}
	}
}

/* ---- listeners ---------------------------------------------------------- */

static int mkdir_p(const char *path, mode_t mode)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, mode) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* The socket path: setting (or $KILN_SOCKET through it), else the system
 * service's /run/kiln/kilnd.sock, else $XDG_RUNTIME_DIR/kiln/kilnd.sock,
 * else /tmp/kiln-<uid>/kilnd.sock. */
static void socket_path(kilnd_server_t *s, char *out, size_t n)
{
	const char *rt = getenv("RUNTIME_DIRECTORY"); /* systemd */
	if (s->cfg.socket != NULL && s->cfg.socket[0] != '\0')
		snprintf(out, n, "%s", s->cfg.socket);
	else if (rt != NULL && rt[0] != '\0')
		snprintf(out, n, "%.*s/kilnd.sock", (int)strcspn(rt, ":"), rt);
	else
		kiln_default_socket(out, n); /* what the clients look for */
}

static int listen_unix(kilnd_server_t *s, char *err, size_t errlen)
{
	char path[4096];
	socket_path(s, path, sizeof(path));
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash != NULL && slash != dir) {
		*slash = '\0';
		int rc = mkdir_p(dir, 0750);
		if (rc < 0)
			return kiln__errf(err, errlen, rc, "mkdir %s: %s", dir,
					  kiln_strerror(rc));
	}
	/* A socket file left by a dead kilnd is replaced; a live one is
	 * not (connect succeeds: another kilnd serves it). */
	struct stat st;
	struct sockaddr_un sa;
	if (strlen(path) >= sizeof(sa.sun_path))
		return kiln__errf(err, errlen, -ENAMETOOLONG,
				  "socket path %s is longer than %zu bytes",
				  path, sizeof(sa.sun_path) - 1);
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		memcpy(sa.sun_path, path, strlen(path));
		int live = fd >= 0 &&
			   connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (fd >= 0)
			close(fd);
		if (live)
			return kiln__errf(err, errlen, -EADDRINUSE,
					  "%s: another kilnd is listening "
					  "there",
					  path);
		unlink(path);
	}
	int i = s->nlisteners;
	uv_pipe_init(s->loop, &s->listeners[i].pipe, 0);
	s->listeners[i].handle.data = s;
	mode_t old = umask(0117); /* the socket is created 0660 */
	int rc = uv_pipe_bind(&s->listeners[i].pipe, path);
	umask(old);
	if (rc == 0)
		rc = uv_listen(&s->listeners[i].stream, 511, on_connection);
	if (rc < 0) {
		uv_close(&s->listeners[i].handle, NULL);
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "listen on %s: %s", path, uv_strerror(rc));
	}
	chmod(path, 0660);
	s->listener_unix[i] = true;
	s->nlisteners++;
	snprintf(s->socket_path, sizeof(s->socket_path), "%s", path);
	s->socket_created = true;
	KILN_LOG(KILN_LOG_INFO, "msg=listening socket=%s", path);
	return 0;
}

int kilnd_parse_hostport(const char *setting, const char *hostport,
			 struct sockaddr_storage *sa, char *err, size_t errlen)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	if (colon == NULL || colon == hostport)
		return kiln__errf(err, errlen, -EINVAL, "%s %s: want host:port",
				  setting, hostport);
	snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
	int port = atoi(colon + 1);
	int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)sa);
	if (rc < 0) {
		/* [::1]:port or ::1 */
		char h6[256];
		snprintf(h6, sizeof(h6), "%s", host);
		if (h6[0] == '[') {
			memmove(h6, h6 + 1, strlen(h6));
			h6[strcspn(h6, "]")] = '\0';
		}
		rc = uv_ip6_addr(h6, port, (struct sockaddr_in6 *)sa);
	}
	if (rc < 0 || port <= 0 || port > 65535)
		return kiln__errf(err, errlen, -EINVAL, "%s %s: bad address",
				  setting, hostport);
	return 0;
}

static int listen_tcp(kilnd_server_t *s, const char *hostport, char *err,
		      size_t errlen)
{
	struct sockaddr_storage sa;
	int rc = kilnd_parse_hostport("tcp_listen", hostport, &sa, err, errlen);
	if (rc < 0)
		return rc;
	int i = s->nlisteners;
	uv_tcp_init(s->loop, &s->listeners[i].tcp);
	s->listeners[i].handle.data = s;
	rc = uv_tcp_bind(&s->listeners[i].tcp, (struct sockaddr *)&sa, 0);
	if (rc == 0)
		rc = uv_listen(&s->listeners[i].stream, 511, on_connection);
	if (rc < 0) {
		uv_close(&s->listeners[i].handle, NULL);
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "listen on %s: %s", hostport,
				  uv_strerror(rc));
	}
	s->listener_unix[i] = false;
	s->nlisteners++;
	KILN_LOG(KILN_LOG_INFO, "msg=listening tcp=%s", hostport);
	return 0;
}

/* Socket activation: adopt the fds systemd passed. */
static int adopt_fds(kilnd_server_t *s, char *err, size_t errlen)
{
	kilnd_sd_fd_t *fds = NULL;
	size_t n = 0;
	int rc = kilnd_sd_listen_fds(&fds, &n);
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "LISTEN_FDS: %s",
				  kiln_strerror(rc));
	for (size_t i = 0; i < n && s->nlisteners < KILND_MAX_LISTENERS; i++) {
		int k = s->nlisteners;
		bool is_unix = fds[i].kind == KILND_SD_FD_UNIX_STREAM;
		if (fds[i].kind == KILND_SD_FD_OTHER || !fds[i].listening) {
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"ignoring a passed fd\" fd=%d",
				 fds[i].fd);
			continue;
		}
		if (is_unix) {
			uv_pipe_init(s->loop, &s->listeners[k].pipe, 0);
			rc = uv_pipe_open(&s->listeners[k].pipe, fds[i].fd);
		} else {
			uv_tcp_init(s->loop, &s->listeners[k].tcp);
			rc = uv_tcp_open(&s->listeners[k].tcp, fds[i].fd);
		}
		s->listeners[k].handle.data = s;
		if (rc == 0)
			rc = uv_listen(&s->listeners[k].stream, 511,
				       on_connection);
		if (rc < 0) {
			uv_close(&s->listeners[k].handle, NULL);
			free(fds);
			return kiln__errf(err, errlen, KILN_EINTERNAL,
					  "adopt fd %d: %s", fds[i].fd,
					  uv_strerror(rc));
		}
		s->listener_unix[k] = is_unix;
		s->nlisteners++;
		KILN_LOG(KILN_LOG_INFO,
			 "msg=\"listening (socket activation)\" fd=%d name=%s",
			 fds[i].fd, fds[i].name);
	}
	free(fds);
	return 0;
}

/* ---- signals, tick, drain ------------------------------------------------ */

static void close_listeners(kilnd_server_t *s)
{
	for (int i = 0; i < s->nlisteners; i++)
		if (!uv_is_closing(&s->listeners[i].handle))
			uv_close(&s->listeners[i].handle, NULL);
	if (s->socket_created) {
		unlink(s->socket_path);
		s->socket_created = false;
	}
}

static void walk_close(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void finish(kilnd_server_t *s)
{
	if (s->stopped)
		return;
	s->stopped = true;
	kilnd_sd_notify("STOPPING=1\nSTATUS=stopping");
	close_listeners(s);
	kilnd_metrics_close(s);
	while (s->conns != NULL)
		conn_close(s->conns, "shutdown");
	uv_close((uv_handle_t *)&s->tick, NULL);
	uv_close((uv_handle_t *)&s->sig_term, NULL);
	uv_close((uv_handle_t *)&s->sig_int, NULL);
	uv_close((uv_handle_t *)&s->sig_hup, NULL);
	/* done_async stays open (unreferenced) until the workers are joined:
	 * a worker may still send on it. */
	uv_unref((uv_handle_t *)&s->done_async);
}

static void tick_cb(uv_timer_t *t);

/* Run the drain step (tick_cb) on the loop's next turn rather than at the
 * next one-second tick. Not inline: the caller may be inside a read
 * callback of a connection the step closes. */
static void drain_soon(kilnd_server_t *s)
{
	if (!s->stopped && !s->flushing)
		uv_timer_start(&s->tick, tick_cb, 0, 1000);
}

void kilnd_drain(kilnd_server_t *s, bool wait_for_compiles)
{
	if (s->draining) {
		if (!wait_for_compiles) {
			s->drain_deadline_ms = kilnd_now_ms(s);
			drain_soon(s);
		}
		return;
	}
	s->draining = true;
	s->drain_deadline_ms =
	    kilnd_now_ms(s) +
	    (wait_for_compiles ? (uint64_t)s->cfg.drain_timeout_s * 1000 : 0);
	KILN_LOG(KILN_LOG_INFO,
		 "msg=draining jobs=%zu conns=%u drain_timeout_s=%u", s->njobs,
		 s->nconns, wait_for_compiles ? s->cfg.drain_timeout_s : 0);
	kilnd_sd_notify("STOPPING=1\nSTATUS=draining");
	close_listeners(s);
	/* Queued (not yet running) compiles will not start. */
	kilnd_pool_stop(s->pool);
	/* drain: false abandons running compiles now: a compile that ends
	 * before the next one-second tick is not answered with its
	 * artifact. An idle kilnd exits at once either way. */
	drain_soon(s);
}

static void status_line(kilnd_server_t *s)
{
	uint32_t q, busy, total;
	kilnd_pool_load(s->pool, &q, &busy, &total);
	uint64_t hits = atomic_load(&s->ctr.v[KILND_C_hit_memory]) +
			atomic_load(&s->ctr.v[KILND_C_hit_disk]);
	uint64_t compiled = 0;
	for (unsigned i = 0; i < s->nworkers; i++)
		compiled += atomic_load(&s->wctr[i].v[KILND_C_compiled]);
	kilnd_sd_notifyf("STATUS=%u connections, %u/%u workers busy, %u "
			 "queued, %llu hits, %llu compiled",
			 s->nconns, busy, total, q, (unsigned long long)hits,
			 (unsigned long long)compiled);
}

static void tick_cb(uv_timer_t *t)
{
	kilnd_server_t *s = t->data;
	uint64_t now = kilnd_now_ms(s);
	expire_waiters(s, now);
	if (!s->draining)
		flush_memory_hits(s);
	if (s->cfg.idle_timeout_s > 0) {
		uint64_t idle = (uint64_t)s->cfg.idle_timeout_s * 1000;
		kilnd_conn_t *c = s->conns;
		while (c != NULL) {
			kilnd_conn_t *next = c->next;
			if (c->inflight == 0 && c->pending_write == 0 &&
			    now - c->last_active_ms >= idle) {
				KILND_COUNT(&s->ctr, conn_idle_closed);
				conn_close(c, "idle");
			}
			c = next;
		}
	}
	if (s->watchdog_usec > 0 &&
	    now - s->last_watchdog_ms >= s->watchdog_usec / 2000) {
		/* Alive means: the loop turns (we are here) and no compile
		 * has run for more than twice its timeout. */
		double oldest = kilnd_pool_oldest_running_s(s->pool);
		if (oldest < 2.0 * s->cfg.compile_timeout_s + 60) {
			kilnd_sd_notify("WATCHDOG=1");
			s->last_watchdog_ms = now;
		} else {
			KILN_LOG(KILN_LOG_ERROR,
				 "msg=\"a compile is stuck; withholding the "
				 "watchdog\" running_s=%.0f",
				 oldest);
		}
	}
	if (now / 1000 % 10 == 0)
		status_line(s);
	/* exit_idle_s: a per-user kilnd started by libkiln goes away when
	 * nobody has used it for a while. */
	if (s->nconns > 0 || s->njobs > 0 || s->pending_work > 0)
		s->last_busy_ms = now;
	else if (s->cfg.exit_idle_s > 0 && !s->draining &&
		 now - s->last_busy_ms >= (uint64_t)s->cfg.exit_idle_s * 1000) {
		KILN_LOG(KILN_LOG_INFO, "msg=\"idle: exiting\" exit_idle_s=%u",
			 s->cfg.exit_idle_s);
		kilnd_drain(s, false);
	}
	if (s->draining && !s->flushing) {
		/* Load first, then take the finished jobs: a thread counts
		 * itself idle only after its job is on the done queue, so
		 * every result counted here is answered with its artifact. */
		uint32_t q, busy, total;
		kilnd_pool_load(s->pool, &q, &busy, &total);
		done_async_cb(&s->done_async);
		bool idle = busy == 0 && s->pending_work == 0;
		if (idle || now >= s->drain_deadline_ms) {
			if (!idle)
				KILN_LOG(KILN_LOG_WARN,
					 "msg=\"drain timeout: exiting with "
					 "compiles running\" busy=%u",
					 busy);
			/* Whoever still waits gets shutting_down. */
			for (size_t i = 0; i < s->jobs_cap; i++)
				for (kilnd_job_t *j = s->jobs[i]; j;
				     j = j->hnext)
					job_answer(s, j, NULL, NULL, NULL,
						   KILN_ESHUTDOWN,
						   "kilnd is shutting down",
						   -1);
			s->exit_code = 0;
			/* Replies already queued still go out: close what
			 * has nothing left to write now, the rest when its
			 * writes are done (or after 5 s). */
			s->flushing = true;
			s->flush_deadline_ms = now + 5000;
			kilnd_conn_t *c = s->conns;
			while (c != NULL) {
				kilnd_conn_t *next = c->next;
				if (c->pending_write == 0) {
					conn_close(c, "shutdown");
				} else {
					c->close_when_written = true;
					if (!c->paused)
						uv_read_stop(&c->h.stream);
					c->paused = true;
				}
				c = next;
			}
		}
	}
	if (s->flushing && (s->nconns == 0 || now >= s->flush_deadline_ms))
		finish(s);
}

static void kilnd__cfg_swap_STR(char **a, char **b)
{
	char *t = *a;
	*a = *b;
	*b = t;
}

static void kilnd__cfg_swap_U64(uint64_t *a, uint64_t *b)
{
	*a = *b;
}

static void kilnd__cfg_swap_U32(uint32_t *a, uint32_t *b)
{
	*a = *b;
}

static inline void kilnd__cfg_swap_BOOL(bool *a, bool *b)
{
	*a = *b;
}

static void on_signal(uv_signal_t *h, int signum)
{
	kilnd_server_t *s = h->data;
	if (signum == SIGHUP) {
		kilnd_sd_notify("RELOADING=1");
		kilnd_config_t fresh;
		kilnd_config_defaults(&fresh);
		char err[512];
		int rc = kilnd_config_load(&fresh, &s->cli, s->argc, s->argv,
					   err, sizeof(err));
		if (rc < 0) {
			KILN_LOG(KILN_LOG_ERROR,
				 "msg=\"reload failed; keeping the old "
				 "settings\" err=\"%s\"",
				 err);
			kilnd_config_free(&fresh);
			kilnd_sd_notify("READY=1\nSTATUS=reload failed");
			return;
		}
		/* Apply what may change at run time; the rest (sockets,
		 * store_dir, workers) needs a restart. */
#define KILND__RELOAD(name, type, def, reload, doc)                            \
	if (reload)                                                            \
		kilnd__cfg_swap_##type(&s->cfg.name, &fresh.name);
		KILND_SETTINGS(KILND__RELOAD)
#undef KILND__RELOAD
		kilnd_config_free(&fresh);
		int lvl = kilnd_config_log_level(s->cfg.log_level);
		if (lvl >= 0)
			kiln_log_level = lvl;
		s->lim.max_frame_bytes = s->cfg.max_frame_bytes;
		s->lim.max_nodes = s->cfg.max_nodes;
		/* Open connections take the new frame limit for their next
		 * frame (a frame being read keeps the length it was
		 * accepted with). */
		for (kilnd_conn_t *c = s->conns; c != NULL; c = c->next)
			c->dec.max_frame_bytes = s->cfg.max_frame_bytes;
		kilnd_hot_set_max(s->hot, s->cfg.hot_bytes);
		kilnd_pool_set_depth(s->pool, s->cfg.queue_depth);
		kiln_cache_set_limits(s->store, s->cfg.store_max_bytes,
				      s->cfg.store_min_free_bytes);
		KILN_LOG(KILN_LOG_INFO, "msg=\"settings reloaded\"");
		kilnd_sd_notify("READY=1\nSTATUS=settings reloaded");
		return;
	}
	KILN_LOG(KILN_LOG_INFO, "msg=\"signal\" sig=%d", signum);
	kilnd_drain(s, true);
}

/* ---- start-up ------------------------------------------------------------ */

static void store_dir(kilnd_server_t *s, char *out, size_t n)
{
	const char *cd = getenv("CACHE_DIRECTORY"); /* systemd */
	const char *xdg = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");
	if (s->cfg.store_dir != NULL && s->cfg.store_dir[0] != '\0')
		snprintf(out, n, "%s", s->cfg.store_dir);
	else if (cd != NULL && cd[0] != '\0')
		snprintf(out, n, "%.*s", (int)strcspn(cd, ":"), cd);
	else if (xdg != NULL && xdg[0] != '\0')
		snprintf(out, n, "%s/kiln", xdg);
	else if (home != NULL && home[0] != '\0')
		snprintf(out, n, "%s/.cache/kiln", home);
	else
		snprintf(out, n, "/var/cache/kiln");
}

/* The compile worker: the setting, else next to this executable (a build
 * tree), else the installed one. */
static void worker_path(kilnd_server_t *s, char *out, size_t n)
{
	if (s->cfg.compile_worker != NULL && s->cfg.compile_worker[0]) {
		snprintf(out, n, "%s", s->cfg.compile_worker);
		return;
	}
	char self[2048];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (len > 0) {
		self[len] = '\0';
		char *slash = strrchr(self, '/');
		if (slash != NULL) {
			*slash = '\0';
			snprintf(out, n, "%s/kiln-compile-worker", self);
			if (access(out, X_OK) == 0)
				return;
		}
	}
	snprintf(out, n, "%s/kiln/kiln-compile-worker", KILN_LIBEXECDIR);
}

static void print_setting(const char *name, const char *value,
			  const char *source, const char *doc, void *arg)
{
	(void)doc;
	fprintf(arg, "%-24s = %-24s # %s\n", name, value, source);
}

static int start(kilnd_server_t *s, char *err, size_t errlen)
{
	int rc;
	kiln_limits_default(&s->lim);
	s->lim.max_frame_bytes = s->cfg.max_frame_bytes;
	s->lim.max_nodes = s->cfg.max_nodes;
	int lvl = kilnd_config_log_level(s->cfg.log_level);
	if (lvl >= 0)
		kiln_log_level = lvl;

	store_dir(s, s->store_dir, sizeof(s->store_dir));
	rc = mkdir_p(s->store_dir, 0750);
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "mkdir %s: %s", s->store_dir,
				  kiln_strerror(rc));
	kiln_cache_options_t co;
	kiln_cache_options_init(&co);
	co.max_bytes = s->cfg.store_max_bytes;
	co.min_free_bytes = s->cfg.store_min_free_bytes;
	if ((rc = kiln_cache_open(s->store_dir, &co, &s->store, err, errlen)) <
	    0)
		return rc;

	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	s->nworkers = s->cfg.workers > 0 ? s->cfg.workers
					 : (unsigned)(ncpu > 0 ? ncpu : 1);
	s->wctr = calloc(s->nworkers, sizeof(*s->wctr));
	if (s->wctr == NULL)
		return -ENOMEM;
	kilnd_latency_init(&s->lat);
	char worker[4096];
	worker_path(s, worker, sizeof(worker));
	kilnd_pool_opts_t po = {
	    .threads = s->nworkers,
	    .worker_path = worker,
	    .worker_idle_s = s->cfg.worker_idle_s,
	    .kill_after_s = 2 * s->cfg.compile_timeout_s + 60,
	    .queue_depth = s->cfg.queue_depth,
	};
	if ((rc = kilnd_pool_new(&po, s->wctr, job_done_cb, s, &s->pool, err,
				 errlen)) < 0)
		return rc;
	snprintf(s->fingerprint, sizeof(s->fingerprint), "%s",
		 kilnd_pool_fingerprint(s->pool));
	s->target = *kilnd_pool_target(s->pool);
	s->hot = kilnd_hot_new(s->cfg.hot_bytes);
	s->dyn = calloc(KILND_DYN_MAX, sizeof(*s->dyn));
	s->mem_hits = malloc(MEM_HITS_MAX * sizeof(*s->mem_hits));
	if (kilnd_memo_init(s) < 0)
		return -ENOMEM;
	if (s->dyn == NULL)
		return -ENOMEM;
	s->jobs_cap = 1024;
	s->jobs = calloc(s->jobs_cap, sizeof(*s->jobs));
	if (s->hot == NULL || s->jobs == NULL)
		return -ENOMEM;

	pthread_mutex_init(&s->done_mu, NULL);
	uv_async_init(s->loop, &s->done_async, done_async_cb);
	s->async_init = true;
	s->done_async.data = s;

	if ((rc = adopt_fds(s, err, errlen)) < 0)
		return rc;
	if (s->nlisteners == 0 && (rc = listen_unix(s, err, errlen)) < 0)
		return rc;
	if (s->cfg.tcp_listen != NULL && s->cfg.tcp_listen[0] != '\0' &&
	    (rc = listen_tcp(s, s->cfg.tcp_listen, err, errlen)) < 0)
		return rc;
	if (s->cfg.metrics_listen != NULL && s->cfg.metrics_listen[0] != '\0' &&
	    (rc = kilnd_metrics_listen(s, s->cfg.metrics_listen, err, errlen)) <
		0)
		return rc;

	uv_signal_init(s->loop, &s->sig_term);
	uv_signal_init(s->loop, &s->sig_int);
	uv_signal_init(s->loop, &s->sig_hup);
	s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
	uv_signal_start(&s->sig_term, on_signal, SIGTERM);
	uv_signal_start(&s->sig_int, on_signal, SIGINT);
	uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
	signal(SIGPIPE, SIG_IGN);

	uv_timer_init(s->loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, tick_cb, 1000, 1000);
	s->watchdog_usec = kilnd_sd_watchdog_usec();
	s->started_ms = kilnd_now_ms(s);
	s->last_busy_ms = s->started_ms;

	kiln_cache_stats_t cs;
	kiln_cache_stats(s->store, &cs, NULL, 0);
	KILN_LOG(KILN_LOG_INFO,
		 "msg=ready version=%s store=%s entries=%llu bytes=%llu "
		 "workers=%u fingerprint=\"%s\"",
		 KILN_VERSION_STRING, s->store_dir,
		 (unsigned long long)cs.entries, (unsigned long long)cs.bytes,
		 s->nworkers, s->fingerprint);
	kilnd_sd_notifyf("READY=1\nSTATUS=serving %s (%llu entries)",
			 s->socket_path[0] ? s->socket_path : "activated fds",
			 (unsigned long long)cs.entries);
	return 0;
}

int kilnd_run(int argc, char **argv)
{
	/* 0, 1 and 2 must be open: the worker processes get their pipes
	 * through dup2 onto 0 and 1, and a pipe must never land there. */
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0)
			open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
	kilnd_server_t *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return 1;
	char err[1024] = "";
	int rc = kilnd_cli_parse(argc, argv, &s->cli, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "kilnd: %s\n(kilnd --help lists the options)\n",
			err);
		free(s);
		return 2;
	}
	if (s->cli.help) {
		kilnd_config_usage(stdout);
		free(s);
		return 0;
	}
	if (s->cli.version) {
		printf("kilnd %s (protocol %d)\n", KILN_VERSION_STRING,
		       KILN_PROTOCOL_VERSION);
		free(s);
		return 0;
	}
	s->argc = argc;
	s->argv = argv;
	kilnd_config_defaults(&s->cfg);
	rc = kilnd_config_load(&s->cfg, &s->cli, argc, argv, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "kilnd: %s\n", err);
		kilnd_config_free(&s->cfg);
		free(s);
		return 2;
	}
	if (s->cli.check_config) {
		printf("# kilnd %s: configuration OK\n", KILN_VERSION_STRING);
		kilnd_config_each(&s->cfg, print_setting, stdout);
		kilnd_config_free(&s->cfg);
		free(s);
		return 0;
	}
	s->loop = uv_default_loop();
	rc = start(s, err, sizeof(err));
	if (rc < 0) {
		KILN_LOG(KILN_LOG_ERROR, "msg=\"cannot start\" err=\"%s\"",
			 err);
		fprintf(stderr, "kilnd: %s\n", err);
		s->exit_code = 1;
		kilnd_sd_notifyf("STATUS=failed to start: %s", err);
		if (s->pool != NULL)
			kilnd_pool_stop(s->pool);
		close_listeners(s);
		uv_walk(s->loop, walk_close, NULL);
	}
	uv_run(s->loop, UV_RUN_DEFAULT);
	/* The loop ended: every handle is closed. Workers finish the job they
	 * run (a drain timeout may leave one running; we wait for it only if
	 * it finishes soon, since the store handles an unclean stop). */
	int code = s->exit_code;
	if (s->pool != NULL) {
		kilnd_pool_stop(s->pool);
		uint32_t q, busy, total;
		kilnd_pool_load(s->pool, &q, &busy, &total);
		if (busy > 0) {
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"exiting without waiting for running "
				 "compiles\" busy=%u",
				 busy);
			fflush(NULL);
			_exit(code);
		}
		kilnd_pool_free(s->pool);
		/* Jobs cancelled by stop landed on the done queue. */
		while (s->done_head != NULL) {
			kilnd_job_t *j = s->done_head;
			s->done_head = j->dnext;
			job_answer(s, j, NULL, NULL, NULL, KILN_ESHUTDOWN,
				   "kilnd is shutting down", -1);
			job_free(j);
		}
	}
	if (s->async_init && !uv_is_closing((uv_handle_t *)&s->done_async))
		uv_close((uv_handle_t *)&s->done_async, NULL);
	uv_run(s->loop, UV_RUN_DEFAULT); /* close callbacks */
	kiln_cache_close(s->store);
	kilnd_hot_free(s->hot);
	for (int i = 0; s->dyn != NULL && i < KILND_DYN_MAX; i++) {
		kiln_graph_free(s->dyn[i].seen);
		kiln_graph_free(s->dyn[i].gg);
	}
	free(s->dyn);
	free(s->mem_hits);
	kilnd_memo_free(s);
	free(s->jobs);
	free(s->wctr);
	uv_loop_close(s->loop);
	kilnd_config_free(&s->cfg);
	KILN_LOG(KILN_LOG_INFO, "msg=stopped code=%d", code);
	free(s);
	return code;
}
