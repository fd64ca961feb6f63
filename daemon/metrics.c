/*
 * metrics.c — kilnd's optional HTTP listener for Prometheus: GET /metrics
 * answers the `status` counters in the text exposition format
 * (kiln_metrics_format, clients/libkiln/metrics.c — the same text
 * `kilnctl metrics` prints). Off unless metrics_listen = host:port.
 *
 * Deliberately small: one request per connection (Connection: close), the
 * request head at most 8 KiB, read within 10 s; anything but GET /metrics
 * is 404, a malformed head 400. The store's counters are read on libuv's
 * pool (the loop never touches disk), as `status` does.
 *
 * Threads: the loop thread; metrics_work on libuv's pool.
 */
#include "clients/libkiln/kiln.h"
#include "daemon/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_MAX 8192

typedef struct mconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	kilnd_server_t *srv;
	char head[HEAD_MAX];
	size_t have;
	bool answered;
	int closing; /* handles still to close */
	uv_work_t work;
	kiln_cache_stats_t st;
	uv_write_t wr;
	char *out;
} mconn_t;

static void mconn_closed(uv_handle_t *h)
{
	mconn_t *m = h->data;
	if (--m->closing == 0) {
		free(m->out);
		free(m);
	}
}

static void mconn_close(mconn_t *m)
{
	if (m->closing > 0)
		return;
	m->closing = 2;
	uv_close((uv_handle_t *)&m->tcp, mconn_closed);
	uv_close((uv_handle_t *)&m->timer, mconn_closed);
}

static void written(uv_write_t *w, int status)
{
	(void)status;
	mconn_close(w->data);
}

static void respond(mconn_t *m, const char *status, const char *type,
		    const char *body, size_t len)
{
	m->answered = true;
	uv_read_stop((uv_stream_t *)&m->tcp);
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %s\r\nContent-Type: %s\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
			 status, type, len);
	m->out = malloc((size_t)n + len);
	if (m->out == NULL) {
		mconn_close(m);
		return;
	}
	memcpy(m->out, head, (size_t)n);
	memcpy(m->out + n, body, len);
	uv_buf_t b = uv_buf_init(m->out, (unsigned)((size_t)n + len));
	m->wr.data = m;
	if (uv_write(&m->wr, (uv_stream_t *)&m->tcp, &b, 1, written) < 0)
		mconn_close(m);
}

static void metrics_work(uv_work_t *w)
{
	mconn_t *m = w->data;
	kiln_cache_stats(m->srv->store, &m->st, NULL, 0);
}

static void metrics_after(uv_work_t *w, int status)
{
	mconn_t *m = w->data;
	kilnd_server_t *s = m->srv;
	s->pending_work--;
	(void)status;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kilnd_pack_stats(s, &pk, &m->st);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	char *text = NULL;
	size_t len = 0;
	int rc = -1;
	if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) ==
	    MSGPACK_UNPACK_SUCCESS)
		rc = kiln_metrics_format(&up.data, &text, &len);
	msgpack_unpacked_destroy(&up);
	msgpack_sbuffer_destroy(&sb);
	if (rc == 0)
		respond(m, "200 OK", "text/plain; version=0.0.4; charset=utf-8",
			text, len);
	else
		respond(m, "500 Internal Server Error", "text/plain",
			"cannot format the metrics\n", 26);
	free(text);
}

static void handle_head(mconn_t *m)
{
	if (strncmp(m->head, "GET ", 4) != 0) {
		respond(m, "405 Method Not Allowed", "text/plain",
			"GET /metrics\n", 13);
		return;
	}
	const char *path = strchr(m->head, ' ') + 1;
	size_t plen = strcspn(path, " ?\r\n");
	if (plen != 8 || strncmp(path, "/metrics", 8) != 0) {
		respond(m, "404 Not Found", "text/plain", "try /metrics\n", 13);
		return;
	}
	m->work.data = m;
	m->srv->pending_work++;
	if (uv_queue_work(m->srv->loop, &m->work, metrics_work, metrics_after) <
	    0) {
		m->srv->pending_work--;
		respond(m, "500 Internal Server Error", "text/plain", "busy\n",
			5);
	} else {
		uv_read_stop((uv_stream_t *)&m->tcp);
		m->answered = true;
	}
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	(void)suggested;
	mconn_t *m = h->data;
	*buf =
	    uv_buf_init(m->head + m->have, (unsigned)(HEAD_MAX - 1 - m->have));
}

static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
	(void)buf;
	mconn_t *m = st->data;
	if (n < 0) {
		if (!m->answered)
			mconn_close(m);
		return;
	}
	m->have += (size_t)n;
	m->head[m->have] = '\0';
	if (strstr(m->head, "\r\n\r\n") != NULL ||
	    strstr(m->head, "\n\n") != NULL)
		handle_head(m);
	else if (m->have >= HEAD_MAX - 1)
		respond(m, "400 Bad Request", "text/plain", "head too long\n",
			14);
}

static void timeout_cb(uv_timer_t *t)
{
	mconn_t *m = t->data;
	if (!m->answered)
		mconn_close(m);
}

static void on_conn(uv_stream_t *server, int status)
{
	kilnd_server_t *s = server->data;
	if (status < 0)
		return;
	mconn_t *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return;
	m->srv = s;
	uv_tcp_init(s->loop, &m->tcp);
	uv_timer_init(s->loop, &m->timer);
	m->tcp.data = m->timer.data = m;
	if (uv_accept(server, (uv_stream_t *)&m->tcp) < 0) {
		mconn_close(m);
		return;
	}
	uv_timer_start(&m->timer, timeout_cb, 10000, 0);
	uv_read_start((uv_stream_t *)&m->tcp, alloc_cb, read_cb);
}

int kilnd_metrics_listen(kilnd_server_t *s, const char *hostport, char *err,
			 size_t errlen)
{
	struct sockaddr_storage sa;
	int rc =
	    kilnd_parse_hostport("metrics_listen", hostport, &sa, err, errlen);
	if (rc < 0)
		return rc;
	uv_tcp_init(s->loop, &s->metrics);
	s->metrics.data = s;
	rc = uv_tcp_bind(&s->metrics, (struct sockaddr *)&sa, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&s->metrics, 64, on_conn);
	if (rc < 0) {
		uv_close((uv_handle_t *)&s->metrics, NULL);
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "metrics_listen %s: %s", hostport,
				  uv_strerror(rc));
	}
	s->metrics_on = true;
	KILN_LOG(KILN_LOG_INFO, "msg=listening metrics=%s", hostport);
	return 0;
}

void kilnd_metrics_close(kilnd_server_t *s)
{
	if (s->metrics_on && !uv_is_closing((uv_handle_t *)&s->metrics))
		uv_close((uv_handle_t *)&s->metrics, NULL);
	s->metrics_on = false;
}
