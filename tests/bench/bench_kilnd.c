/*
 * bench_kilnd.c — kilnd's hit round trip, against a bare echo of the same
 * bytes over the same kind of socket, in the same run.
 *
 *   bench_kilnd [--quick] [--kilnd PATH] [--graphs DIR] [--graph NAME]
 *               [--seconds S] [--op lookup|compile] [--clients 1|8|64]
 *
 * --seconds: per point and server (default 2; --quick: 0.3, one round);
 * --op, --clients: run only those points (for profiling the daemon).
 *
 * The benchmark starts its own kilnd (PATH, default the kilnd of this build
 * directory) on a Unix socket in a fresh temporary directory, with the store
 * there too and --log-level warn. It compiles the small corpus graphs
 * (GRAPHS_DIR/ *.graph.msgpack, at most MAX_GRAPH_BYTES each, or just NAME)
 * once each and picks the one whose artifact is nearest 50 KB (10^3 bytes),
 * then measures, with 1, 8 and 64 clients (threads, one connection each,
 * closed loop: one request outstanding per client):
 *   lookup   {"op": "lookup", "signature": ...}: a hit in the hot map;
 *   compile  {"op": "compile", "graph": <the whole graph>, "target": cpu}:
 *            the daemon decodes and signs the graph, then hits the hot map;
 *   echo     the peer: a thread of this process with an epoll loop on a Unix
 *            socket of its own, which reads one frame (of the size of the
 *            lookup or compile request) and writes back one frame of the size
 *            of kilnd's hit reply (a copy of its bytes).
 * Every reply, kilnd's or the echo's, is read whole and decoded with
 * kiln_response_decode and checked (ok, id, source "memory", artifact
 * length), so the clients do the same work against both servers.
 *
 * Per point: round-trip p50 and p99 (CLOCK_MONOTONIC around write + read of
 * each request), requests per second over the point's wall time, and CPU per
 * request of the server (kilnd's process CPU clock, or the echo thread's)
 * and of the clients. kiln and echo rounds alternate (ROUNDS of each per
 * point, SECONDS in all per point and server) so that a change in machine
 * load affects both alike. Then kilnd's RSS: VmRSS of /proc/PID/status
 * after start, after the warm-up compiles and after the benchmark, and the
 * rss_bytes of `status`.
 *
 * Targets (issue 6): lookup hit p50 <= 100 us (1 client); >= 20k hits/s on
 * 2 cores (the best lookup point; clients and daemon share the machine);
 * kiln within 2x of the echo (p50 and requests/s); idle RSS <= 30 MB.
 *
 * At the end the daemon gets `shutdown` (SIGTERM, then SIGKILL, if it does
 * not exit) and the temporary directory is removed.
 */
#include "protocol/protocol.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KILN_BENCH_GRAPHS_DIR
#define KILN_BENCH_GRAPHS_DIR "tests/data/graphs"
#endif
#ifndef KILN_BENCH_KILND
#define KILN_BENCH_KILND "build-rel/daemon/kilnd"
#endif

#define SUFFIX		".graph.msgpack"
#define TARGET_ART	50000	    /* bytes: "a 50 KB artifact" */
#define MAX_GRAPH_BYTES 16384	    /* candidates for the 50 KB artifact */
#define REQ_ID		7	    /* every request's id (a client's choice) */
#define MAX_FRAME	(64u << 20) /* the protocol's default limit */
#define ROUNDS		2	    /* kiln/echo alternations per point */
#define WARM_REQS	20	    /* per client, before the clock starts */

static const int client_counts[] = {1, 8, 64};
#define N_COUNTS (sizeof(client_counts) / sizeof(client_counts[0]))

static kiln_limits_t lim;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double clock_s(clockid_t id)
{
	struct timespec ts;
	if (clock_gettime(id, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the daemon and the temporary directory ----------------------------- */

/* sun_path holds 108 bytes: the directory is kept short (TMPDIR < 60). */
static char tmp_dir[96];
static char kilnd_sock[108], echo_sock[108];
static pid_t kilnd_pid = -1;

static int rm_cb(const char *path, const struct stat *st, int flag,
		 struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void stop_kilnd_hard(void)
{
	if (kilnd_pid <= 0)
		return;
	kill(kilnd_pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(kilnd_pid, NULL, WNOHANG) == kilnd_pid) {
			kilnd_pid = -1;
			return;
		}
		usleep(10000);
	}
	kill(kilnd_pid, SIGKILL);
	waitpid(kilnd_pid, NULL, 0);
	kilnd_pid = -1;
}

static void cleanup(void)
{
	stop_kilnd_hard();
	if (tmp_dir[0] != '\0') {
		nftw(tmp_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
		tmp_dir[0] = '\0';
	}
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt,
								...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("bench_kilnd: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1); /* cleanup() runs from atexit */
}

static pid_t start_kilnd(const char *exe)
{
	char store[300], conf[300];
	snprintf(store, sizeof(store), "%s/store", tmp_dir);
	snprintf(conf, sizeof(conf), "%s/kilnd.conf", tmp_dir);
	/* An empty config file: no /etc/kiln/kilnd.conf in the figures. */
	int cfd = open(conf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (cfd < 0)
		die("%s: %s", conf, strerror(errno));
	close(cfd);
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive us */
		execl(exe, "kilnd", "--config", conf, "--socket", kilnd_sock,
		      "--store-dir", store, "--log-level", "warn",
		      (char *)NULL);
		fprintf(stderr, "bench_kilnd: exec %s: %s\n", exe,
			strerror(errno));
		_exit(127);
	}
	return pid;
}

/* ---- socket I/O ---------------------------------------------------------- */

static int sock_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* A frame buffer: the 4 length bytes, then the body. */
typedef struct fbuf {
	uint8_t *p;
	size_t cap;
} fbuf_t;

static int fbuf_reserve(fbuf_t *b, size_t n)
{
	if (n <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 65536;
	while (cap < n)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (p == NULL)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

/* Reads one whole frame into b (header included); *body_len is N. The
 * peers here answer one request at a time, so no bytes follow the frame. */
static int read_frame(int fd, fbuf_t *b, size_t *body_len)
{
	size_t have = 0, want = 4;
	if (fbuf_reserve(b, 65536) < 0)
		return -ENOMEM;
	while (have < want) {
		ssize_t r = read(fd, b->p + have, b->cap - have);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -ECONNRESET;
		have += (size_t)r;
		if (want == 4 && have >= 4) {
			size_t n = (size_t)b->p[0] << 24 |
				   (size_t)b->p[1] << 16 |
				   (size_t)b->p[2] << 8 | b->p[3];
			if (n == 0 || n > MAX_FRAME)
				return KILN_EBADFRAME;
			want = 4 + n;
			if (fbuf_reserve(b, want) < 0)
				return -ENOMEM;
		}
	}
	if (have != want)
		return KILN_EBADFRAME;
	*body_len = want - 4;
	return 0;
}

/* ---- requests ------------------------------------------------------------ */

typedef struct frame {
	msgpack_sbuffer sb;
	msgpack_packer pk;
} frame_t;

static void frame_begin(frame_t *f, kiln_op_t op, uint32_t n_fields)
{
	msgpack_sbuffer_init(&f->sb);
	msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
	if (kiln_frame_begin(&f->sb) < 0 ||
	    kiln_pack_request_head(&f->pk, REQ_ID, op, n_fields) < 0)
		die("out of memory");
}

static void frame_end(frame_t *f)
{
	if (kiln_frame_end(&f->sb, MAX_FRAME) < 0)
		die("request frame over the limit");
}

static void req_lookup(frame_t *f, const char *hex)
{
	frame_begin(f, KILN_OP_LOOKUP, 1);
	kiln_pack_cstr(&f->pk, "signature");
	kiln_pack_cstr(&f->pk, hex);
	frame_end(f);
}

/* The graph file's bytes go in as they are: they are one Graph v1 map. */
static void req_compile(frame_t *f, const uint8_t *graph, size_t len)
{
	frame_begin(f, KILN_OP_COMPILE, 2);
	kiln_pack_cstr(&f->pk, "graph");
	if (msgpack_sbuffer_write(&f->sb, (const char *)graph, len) != 0)
		die("out of memory");
	kiln_pack_cstr(&f->pk, "target");
	msgpack_pack_map(&f->pk, 1);
	kiln_pack_cstr(&f->pk, "backend");
	kiln_pack_cstr(&f->pk, "cpu");
	frame_end(f);
}

/* A synchronous request on fd; the reply frame stays in b, decoded into
 * res (zone: the caller's, cleared first). Dies on an error reply. */
static void rpc(int fd, const frame_t *f, fbuf_t *b, msgpack_zone *zone,
		kiln_response_t *res, size_t *body_len, const char *what)
{
	char err[256];
	int rc = write_all(fd, (const uint8_t *)f->sb.data, f->sb.size);
	if (rc == 0)
		rc = read_frame(fd, b, body_len);
	if (rc < 0)
		die("%s: %s", what, kiln_strerror(rc));
	msgpack_zone_clear(zone);
	rc = kiln_response_decode(b->p + 4, *body_len, &lim, zone, res, err,
				  sizeof(err));
	if (rc < 0)
		die("%s: reply: %s", what, err);
	if (!res->ok)
		die("%s: %.*s: %.*s", what, (int)res->err_name_len,
		    res->err_name, (int)res->message_len, res->message);
}

static const msgpack_object *field(const kiln_response_t *res, const char *key,
				   msgpack_object_type type, const char *what)
{
	const msgpack_object *o = kiln_map_get(&res->body, key);
	if (o == NULL || o->type != type)
		die("%s: reply without a proper \"%s\"", what, key);
	return o;
}

/* ---- the echo peer --------------------------------------------------------
 */

typedef struct econn {
	int fd;
	uint8_t hdr[4];
	uint32_t hdr_have;
	size_t body_left;
	unsigned replies; /* owed */
	size_t out_off;	  /* of the reply being written */
} econn_t;

typedef struct echo {
	int lfd, epfd, stopfd;
	pthread_t th;
	const uint8_t *reply; /* a whole frame: kilnd's hit reply */
	size_t reply_len;
	uint8_t scratch[256 * 1024];
} echo_t;

static void echo_close(echo_t *e, econn_t *c)
{
	epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c);
}

/* Writes what it owes; 0, or -1 when the connection is gone. */
static int echo_flush(echo_t *e, econn_t *c)
{
	while (c->replies > 0) {
		ssize_t w = write(c->fd, e->reply + c->out_off,
				  e->reply_len - c->out_off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -1;
			struct epoll_event ev = {.events = EPOLLOUT,
						 .data.ptr = c};
			epoll_ctl(e->epfd, EPOLL_CTL_MOD, c->fd, &ev);
			return 0;
		}
		c->out_off += (size_t)w;
		if (c->out_off == e->reply_len) {
			c->out_off = 0;
			c->replies--;
		}
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
	epoll_ctl(e->epfd, EPOLL_CTL_MOD, c->fd, &ev);
	return 0;
}

/* Reads what is there and counts the frames it completes; 0, or -1 when the
 * connection is gone. */
static int echo_read(echo_t *e, econn_t *c)
{
	ssize_t r = read(c->fd, e->scratch, sizeof(e->scratch));
	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	if (r == 0)
		return -1;
	const uint8_t *p = e->scratch;
	size_t n = (size_t)r;
	while (n > 0) {
		if (c->hdr_have < 4) {
			c->hdr[c->hdr_have++] = *p++;
			n--;
			if (c->hdr_have == 4)
				c->body_left = (size_t)c->hdr[0] << 24 |
					       (size_t)c->hdr[1] << 16 |
					       (size_t)c->hdr[2] << 8 |
					       c->hdr[3];
			continue;
		}
		size_t k = n < c->body_left ? n : c->body_left;
		p += k;
		n -= k;
		c->body_left -= k;
		if (c->body_left == 0) {
			c->hdr_have = 0;
			c->replies++;
		}
	}
	return echo_flush(e, c);
}

static void *echo_main(void *arg)
{
	echo_t *e = arg;
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(e->epfd, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait: %s", strerror(errno));
		}
		for (int i = 0; i < n; i++) {
			void *ptr = evs[i].data.ptr;
			if (ptr == &e->stopfd)
				return NULL;
			if (ptr == &e->lfd) {
				int fd = accept4(e->lfd, NULL, NULL,
						 SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0)
					continue;
				econn_t *c = calloc(1, sizeof(*c));
				if (c == NULL)
					die("out of memory");
				c->fd = fd;
				struct epoll_event ev = {.events = EPOLLIN,
							 .data.ptr = c};
				epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev);
				continue;
			}
			econn_t *c = ptr;
			int rc = (evs[i].events & EPOLLOUT) ? echo_flush(e, c)
							    : echo_read(e, c);
			if (rc < 0 || (evs[i].events & (EPOLLERR | EPOLLHUP) &&
				       !(evs[i].events & EPOLLIN)))
				echo_close(e, c);
		}
	}
}

static echo_t *echo_start(const uint8_t *reply, size_t reply_len)
{
	echo_t *e = calloc(1, sizeof(*e));
	if (e == NULL)
		die("out of memory");
	e->reply = reply;
	e->reply_len = reply_len;
	e->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", echo_sock);
	if (e->lfd < 0 || bind(e->lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(e->lfd, 256) < 0)
		die("echo socket %s: %s", echo_sock, strerror(errno));
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	e->stopfd = eventfd(0, EFD_CLOEXEC);
	if (e->epfd < 0 || e->stopfd < 0)
		die("epoll: %s", strerror(errno));
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &e->lfd};
	epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->lfd, &ev);
	ev.data.ptr = &e->stopfd;
	epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->stopfd, &ev);
	if (pthread_create(&e->th, NULL, echo_main, e) != 0)
		die("pthread_create failed");
	return e;
}

static void echo_stop(echo_t *e)
{
	uint64_t one = 1;
	if (write(e->stopfd, &one, sizeof(one)) != sizeof(one))
		die("eventfd write: %s", strerror(errno));
	pthread_join(e->th, NULL);
	/* Connections were closed by their clients. */
	close(e->lfd);
	close(e->epfd);
	close(e->stopfd);
	free(e);
}

/* ---- clients ------------------------------------------------------------- */

typedef struct client {
	pthread_t th;
	const char *sock;
	const frame_t *req;
	size_t art_len; /* the artifact length every reply must carry */
	double seconds;
	pthread_barrier_t *start;
	/* results */
	uint64_t *lat; /* ns */
	size_t n, cap;
	double t0, t1;
	int fd;
	char err[256];
} client_t;

/* One request and its reply, checked; 0 or -1 with c->err set. */
static int client_call(client_t *c, fbuf_t *b, msgpack_zone *zone)
{
	size_t blen;
	kiln_response_t res;
	int rc =
	    write_all(c->fd, (const uint8_t *)c->req->sb.data, c->req->sb.size);
	if (rc == 0)
		rc = read_frame(c->fd, b, &blen);
	if (rc < 0) {
		snprintf(c->err, sizeof(c->err), "%s", kiln_strerror(rc));
		return -1;
	}
	msgpack_zone_clear(zone);
	rc = kiln_response_decode(b->p + 4, blen, &lim, zone, &res, c->err,
				  sizeof(c->err));
	if (rc < 0)
		return -1;
	if (!res.ok) {
		snprintf(c->err, sizeof(c->err), "%.*s: %.*s",
			 (int)res.err_name_len, res.err_name,
			 (int)res.message_len, res.message);
		return -1;
	}
	const msgpack_object *a = kiln_map_get(&res.body, "artifact");
	const msgpack_object *s = kiln_map_get(&res.body, "source");
	if (res.id != REQ_ID || a == NULL || a->type != MSGPACK_OBJECT_BIN ||
	    a->via.bin.size != c->art_len || !kiln_obj_streq(s, "memory")) {
		snprintf(c->err, sizeof(c->err),
			 "reply is not the expected memory hit");
		return -1;
	}
	return 0;
}

static void *client_main(void *arg)
{
	client_t *c = arg;
	fbuf_t b = {0};
	msgpack_zone zone;
	msgpack_zone_init(&zone, 4096);
	for (int i = 0; i < WARM_REQS && c->err[0] == '\0'; i++)
		client_call(c, &b, &zone);
	pthread_barrier_wait(c->start);
	c->t0 = now();
	double end = c->t0 + c->seconds;
	c->t1 = c->t0;
	while (c->err[0] == '\0') {
		uint64_t a = now_ns();
		if (client_call(c, &b, &zone) < 0)
			break;
		uint64_t z = now_ns();
		if (c->n == c->cap) {
			size_t cap = c->cap ? c->cap * 2 : 4096;
			uint64_t *p = realloc(c->lat, cap * sizeof(*p));
			if (p == NULL) {
				snprintf(c->err, sizeof(c->err),
					 "out of memory");
				break;
			}
			c->lat = p;
			c->cap = cap;
		}
		c->lat[c->n++] = z - a;
		c->t1 = (double)z * 1e-9;
		if (c->t1 >= end)
			break;
	}
	msgpack_zone_destroy(&zone);
	free(b.p);
	return NULL;
}

/* One point's accumulated figures for one server. */
typedef struct point {
	uint64_t *lat; /* ns, every request of every round */
	size_t n, cap;
	double wall;	 /* seconds, summed over rounds */
	double srv_cpu;	 /* seconds of the server's CPU */
	double cli_cpu;	 /* seconds of the clients' CPU */
	double p50, p99; /* us */
	double rps;	 /* requests per second */
	double srv_us;	 /* server CPU us per request */
	double cli_us;	 /* clients' CPU us per request */
} point_t;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/*
 * Runs nclients clients against sock for `seconds` and adds the figures to
 * p. srv_clock: the server's CPU clock (kilnd's process or the echo thread);
 * echo_clock: the echo thread's clock, taken out of this process's CPU time
 * to leave the clients'.
 */
static void run_round(point_t *p, const char *sock, const frame_t *req,
		      size_t art_len, int nclients, double seconds,
		      clockid_t srv_clock, clockid_t echo_clock)
{
	client_t *cl = calloc((size_t)nclients, sizeof(*cl));
	pthread_barrier_t start;
	if (cl == NULL)
		die("out of memory");
	pthread_barrier_init(&start, NULL, (unsigned)nclients + 1);
	for (int i = 0; i < nclients; i++) {
		client_t *c = &cl[i];
		c->sock = sock;
		c->req = req;
		c->art_len = art_len;
		c->seconds = seconds;
		c->start = &start;
		c->fd = sock_connect(sock);
		if (c->fd < 0)
			die("connect %s: %s", sock, strerror(-c->fd));
		if (pthread_create(&c->th, NULL, client_main, c) != 0)
			die("pthread_create failed");
	}
	pthread_barrier_wait(&start);
	double s0 = clock_s(srv_clock), e0 = clock_s(echo_clock);
	double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	double t0 = 1e300, t1 = 0;
	for (int i = 0; i < nclients; i++)
		pthread_join(cl[i].th, NULL);
	double s1 = clock_s(srv_clock), e1 = clock_s(echo_clock);
	double c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	for (int i = 0; i < nclients; i++) {
		client_t *c = &cl[i];
		close(c->fd);
		if (c->err[0] != '\0')
			die("client %d of %d on %s: %s", i, nclients, sock,
			    c->err);
		if (c->t0 < t0)
			t0 = c->t0;
		if (c->t1 > t1)
			t1 = c->t1;
		if (p->n + c->n > p->cap) {
			size_t cap = p->cap ? p->cap : 65536;
			while (cap < p->n + c->n)
				cap *= 2;
			uint64_t *q = realloc(p->lat, cap * sizeof(*q));
			if (q == NULL)
				die("out of memory");
			p->lat = q;
			p->cap = cap;
		}
		memcpy(p->lat + p->n, c->lat, c->n * sizeof(*c->lat));
		p->n += c->n;
		free(c->lat);
	}
	p->wall += t1 - t0;
	p->srv_cpu += s1 - s0;
	p->cli_cpu += (c1 - c0) - (e1 - e0);
	pthread_barrier_destroy(&start);
	free(cl);
}

static void point_finish(point_t *p)
{
	qsort(p->lat, p->n, sizeof(*p->lat), cmp_u64);
	p->p50 = p->n ? (double)p->lat[(p->n - 1) / 2] / 1e3 : 0;
	p->p99 = p->n
		     ? (double)p->lat[(size_t)((double)(p->n - 1) * 0.99)] / 1e3
		     : 0;
	p->rps = p->wall > 0 ? (double)p->n / p->wall : 0;
	p->srv_us = p->n ? p->srv_cpu / (double)p->n * 1e6 : 0;
	p->cli_us = p->n ? p->cli_cpu / (double)p->n * 1e6 : 0;
	free(p->lat);
	p->lat = NULL;
}

/* ---- kilnd's memory -------------------------------------------------------
 */

/* A "Name:  123 kB" line of /proc/PID/status, in bytes; 0 if absent. */
static uint64_t proc_status_kb(pid_t pid, const char *name)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	FILE *f = fopen(path, "r");
	uint64_t v = 0;
	size_t nl = strlen(name);
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, name, nl) == 0 && line[nl] == ':') {
			v = strtoull(line + nl + 1, NULL, 10) * 1024;
			break;
		}
	fclose(f);
	return v;
}

static uint64_t status_rss(int fd, fbuf_t *b, msgpack_zone *zone)
{
	frame_t f;
	kiln_response_t res;
	size_t blen;
	frame_begin(&f, KILN_OP_STATUS, 0);
	frame_end(&f);
	rpc(fd, &f, b, zone, &res, &blen, "status");
	msgpack_sbuffer_destroy(&f.sb);
	const msgpack_object *st =
	    field(&res, "stats", MSGPACK_OBJECT_MAP, "status");
	const msgpack_object *r = kiln_map_get(st, "rss_bytes");
	if (r == NULL || r->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		die("status: no stats.rss_bytes");
	return r->via.u64;
}

/* ---- the corpus ------------------------------------------------------------
 */

typedef struct graph {
	char name[128];
	uint8_t *bytes;
	size_t len;
	size_t art_len; /* 0: not compiled */
	double compile_ms;
	char sig[KILN_SIG_HEX];
} graph_t;

static int cmp_graph(const void *a, const void *b)
{
	const graph_t *x = a, *y = b;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return strcmp(x->name, y->name);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	uint8_t *p = NULL;
	if (fseek(f, 0, SEEK_END) == 0) {
		long n = ftell(f);
		if (n > 0 && fseek(f, 0, SEEK_SET) == 0 &&
		    (p = malloc((size_t)n)) != NULL &&
		    fread(p, 1, (size_t)n, f) != (size_t)n) {
			free(p);
			p = NULL;
		}
		*len = n > 0 ? (size_t)n : 0;
	}
	fclose(f);
	return p;
}

/* The candidate graphs of dir (only `only` when not NULL), smallest first. */
static graph_t *load_graphs(const char *dir, const char *only, size_t *count)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		die("%s: %s", dir, strerror(errno));
	graph_t *g = NULL;
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		size_t nl = strlen(de->d_name), sl = strlen(SUFFIX);
		if (nl <= sl || nl - sl >= sizeof(g->name) ||
		    strcmp(de->d_name + nl - sl, SUFFIX) != 0)
			continue;
		graph_t x = {0};
		memcpy(x.name, de->d_name, nl - sl);
		if (only != NULL && strcmp(x.name, only) != 0)
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		x.bytes = slurp(path, &x.len);
		if (x.bytes == NULL)
			die("%s: cannot read", path);
		if (only == NULL && x.len > MAX_GRAPH_BYTES) {
			free(x.bytes);
			continue;
		}
		graph_t *q = realloc(g, (n + 1) * sizeof(*g));
		if (q == NULL)
			die("out of memory");
		g = q;
		g[n++] = x;
	}
	closedir(d);
	if (n == 0)
		die("%s: no %s graph%s", dir, only ? only : "*",
		    only ? SUFFIX : " of at most 16 KiB");
	qsort(g, n, sizeof(*g), cmp_graph);
	*count = n;
	return g;
}

/* ---- main ------------------------------------------------------------------
 */

static const char *verdict(bool ok)
{
	return ok ? "PASS" : "MISS";
}

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: bench_kilnd [--quick] [--kilnd PATH] [--graphs DIR] "
	    "[--graph NAME] [--seconds S]\n"
	    "                   [--op lookup|compile] [--clients 1|8|64]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *kilnd_exe = KILN_BENCH_KILND;
	const char *graphs_dir = KILN_BENCH_GRAPHS_DIR;
	const char *only = NULL, *only_op = NULL;
	int only_n = 0;
	double seconds = 2.0;
	int rounds = ROUNDS;
	bool quick = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--quick") == 0)
			quick = true;
		else if (i + 1 < argc && strcmp(a, "--kilnd") == 0)
			kilnd_exe = argv[++i];
		else if (i + 1 < argc && strcmp(a, "--graphs") == 0)
			graphs_dir = argv[++i];
		else if (i + 1 < argc && strcmp(a, "--graph") == 0)
			only = argv[++i];
		else if (i + 1 < argc && strcmp(a, "--seconds") == 0)
			seconds = atof(argv[++i]);
		else if (i + 1 < argc && strcmp(a, "--op") == 0)
			only_op = argv[++i];
		else if (i + 1 < argc && strcmp(a, "--clients") == 0)
			only_n = atoi(argv[++i]);
		else
			usage();
	}
	if (quick) {
		seconds = 0.3;
		rounds = 1;
	}
	if (!(seconds > 0) ||
	    (only_op != NULL && strcmp(only_op, "lookup") != 0 &&
	     strcmp(only_op, "compile") != 0) ||
	    (only_n != 0 && only_n != 1 && only_n != 8 && only_n != 64))
		usage();
	kiln_limits_default(&lim);
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0); /* progress, also into a pipe */

	const char *tmp = getenv("TMPDIR");
	snprintf(tmp_dir, sizeof(tmp_dir), "%s/bench_kilnd.XXXXXX",
		 tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 60 ? tmp
								   : "/tmp");
	if (mkdtemp(tmp_dir) == NULL) {
		tmp_dir[0] = '\0';
		die("mkdtemp: %s", strerror(errno));
	}
	atexit(cleanup);
	snprintf(kilnd_sock, sizeof(kilnd_sock), "%s/kilnd.sock", tmp_dir);
	snprintf(echo_sock, sizeof(echo_sock), "%s/echo.sock", tmp_dir);

	/* Start kilnd and wait for its socket. */
	kilnd_pid = start_kilnd(kilnd_exe);
	int fd = -1;
	double t_start = now();
	while (fd < 0) {
		int st;
		if (waitpid(kilnd_pid, &st, WNOHANG) == kilnd_pid) {
			kilnd_pid = -1;
			die("%s exited (status %d) before listening", kilnd_exe,
			    st);
		}
		fd = sock_connect(kilnd_sock);
		if (fd < 0) {
			if (now() - t_start > 15)
				die("%s: no socket after 15 s", kilnd_exe);
			usleep(5000);
		}
	}
	fbuf_t b = {0};
	msgpack_zone zone;
	msgpack_zone_init(&zone, 4096);
	kiln_response_t res;
	size_t blen;
	frame_t f;
	frame_begin(&f, KILN_OP_HELLO, 1);
	kiln_pack_cstr(&f.pk, "client");
	kiln_pack_cstr(&f.pk, "bench_kilnd");
	frame_end(&f);
	rpc(fd, &f, &b, &zone, &res, &blen, "hello");
	msgpack_sbuffer_destroy(&f.sb);
	usleep(200000); /* let start-up settle before the idle reading */
	uint64_t rss_start = proc_status_kb(kilnd_pid, "VmRSS");
	uint64_t anon0 = proc_status_kb(kilnd_pid, "RssAnon");
	uint64_t file0 = proc_status_kb(kilnd_pid, "RssFile");
	uint64_t st_rss_start = status_rss(fd, &b, &zone);

	/* Compile the candidates once each; pick the artifact nearest 50 KB. */
	size_t ng;
	graph_t *gs = load_graphs(graphs_dir, only, &ng);
	printf("bench_kilnd: kilnd %s (pid %ld), socket %s\n", kilnd_exe,
	       (long)kilnd_pid, kilnd_sock);
	printf("candidates (compiled once each; the artifact nearest %d "
	       "bytes is used):\n",
	       TARGET_ART);
	graph_t *best = NULL;
	for (size_t i = 0; i < ng; i++) {
		graph_t *g = &gs[i];
		req_compile(&f, g->bytes, g->len);
		double t0 = now();
		rpc(fd, &f, &b, &zone, &res, &blen, g->name);
		g->compile_ms = (now() - t0) * 1e3;
		msgpack_sbuffer_destroy(&f.sb);
		const msgpack_object *a =
		    field(&res, "artifact", MSGPACK_OBJECT_BIN, g->name);
		const msgpack_object *s =
		    field(&res, "signature", MSGPACK_OBJECT_STR, g->name);
		if (s->via.str.size != KILN_SIG_HEX - 1)
			die("%s: bad signature", g->name);
		memcpy(g->sig, s->via.str.ptr, KILN_SIG_HEX - 1);
		g->sig[KILN_SIG_HEX - 1] = '\0';
		g->art_len = a->via.bin.size;
		printf("  %-24s graph %6zu B  artifact %7zu B  compile "
		       "%8.1f ms\n",
		       g->name, g->len, g->art_len, g->compile_ms);
		if (best == NULL || labs((long)g->art_len - TARGET_ART) <
					labs((long)best->art_len - TARGET_ART))
			best = g;
	}
	/* Warm: the same compile again must be a memory hit. */
	frame_t creq, lreq;
	req_compile(&creq, best->bytes, best->len);
	req_lookup(&lreq, best->sig);
	rpc(fd, &creq, &b, &zone, &res, &blen, "warm compile");
	if (!kiln_obj_streq(kiln_map_get(&res.body, "source"), "memory"))
		die("warm compile of %s is not a memory hit", best->name);
	/* kilnd's hit reply, as the echo's reply. */
	rpc(fd, &lreq, &b, &zone, &res, &blen, "lookup");
	if (!kiln_obj_streq(kiln_map_get(&res.body, "source"), "memory"))
		die("lookup of %s is not a memory hit", best->name);
	size_t reply_len = 4 + blen;
	uint8_t *reply = malloc(reply_len);
	if (reply == NULL)
		die("out of memory");
	memcpy(reply, b.p, reply_len);
	uint64_t rss_warm = proc_status_kb(kilnd_pid, "VmRSS");

	echo_t *echo = echo_start(reply, reply_len);
	clockid_t kclk, eclk;
	if (clock_getcpuclockid(kilnd_pid, &kclk) != 0)
		die("clock_getcpuclockid(kilnd) failed");
	if (pthread_getcpuclockid(echo->th, &eclk) != 0)
		die("pthread_getcpuclockid(echo) failed");

	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	printf("\ngraph %s: artifact %zu B, signature %.16s...; lookup "
	       "request %zu B, compile request %zu B, hit reply %zu B "
	       "(frames, length included)\n",
	       best->name, best->art_len, best->sig, lreq.sb.size, creq.sb.size,
	       reply_len);
	printf("%d round%s of %.2f s per point and server, kiln and echo "
	       "alternating; %ld CPUs online, shared by the daemon, the echo "
	       "and the clients\n",
	       rounds, rounds > 1 ? "s" : "", seconds / rounds, ncpu);
	char load[128] = "?";
	FILE *lf = fopen("/proc/loadavg", "r");
	if (lf != NULL) {
		if (fgets(load, sizeof(load), lf) == NULL)
			strcpy(load, "?\n");
		fclose(lf);
	}
	printf("load average before: %s\n", load);

	struct {
		const char *name;
		const frame_t *req;
	} kinds[2] = {{"lookup", &lreq}, {"compile", &creq}};
	point_t pk[2][N_COUNTS], pe[2][N_COUNTS];
	bool ran[2][N_COUNTS];
	memset(pk, 0, sizeof(pk));
	memset(pe, 0, sizeof(pe));
	printf("op       clients |      kiln p50      p99     req/s |      "
	       "echo p50      p99     req/s |  p50 x  req/s x\n");
	for (int k = 0; k < 2; k++) {
		for (size_t ci = 0; ci < N_COUNTS; ci++) {
			int n = client_counts[ci];
			point_t *a = &pk[k][ci], *e = &pe[k][ci];
			ran[k][ci] = (only_op == NULL ||
				      strcmp(only_op, kinds[k].name) == 0) &&
				     (only_n == 0 || only_n == n);
			if (!ran[k][ci])
				continue;
			for (int r = 0; r < rounds; r++) {
				run_round(a, kilnd_sock, kinds[k].req,
					  best->art_len, n, seconds / rounds,
					  kclk, eclk);
				run_round(e, echo_sock, kinds[k].req,
					  best->art_len, n, seconds / rounds,
					  eclk, eclk);
			}
			point_finish(a);
			point_finish(e);
			printf("%-8s %7d | %13.1f %8.1f %9.0f | %13.1f %8.1f "
			       "%9.0f | %6.2f %8.2f\n",
			       kinds[k].name, n, a->p50, a->p99, a->rps, e->p50,
			       e->p99, e->rps, a->p50 / e->p50,
			       e->rps / a->rps);
			fflush(stdout);
		}
	}
	printf("(latencies in us; \"p50 x\" = kiln p50 / echo p50, "
	       "\"req/s x\" = echo req/s / kiln req/s)\n");

	printf("\nCPU per request, us (server: kilnd's process or the echo "
	       "thread; clients: this process less the echo thread)\n");
	printf("op       clients | kilnd  clients | echo  clients\n");
	for (int k = 0; k < 2; k++)
		for (size_t ci = 0; ci < N_COUNTS; ci++) {
			point_t *a = &pk[k][ci], *e = &pe[k][ci];
			if (ran[k][ci])
				printf("%-8s %7d | %5.1f %8.1f | %4.1f %8.1f\n",
				       kinds[k].name, client_counts[ci],
				       a->srv_us, a->cli_us, e->srv_us,
				       e->cli_us);
		}
	echo_stop(echo);

	sleep(1); /* idle again */
	uint64_t rss_end = proc_status_kb(kilnd_pid, "VmRSS");
	uint64_t hwm = proc_status_kb(kilnd_pid, "VmHWM");
	uint64_t anon = proc_status_kb(kilnd_pid, "RssAnon");
	uint64_t file = proc_status_kb(kilnd_pid, "RssFile");
	uint64_t st_rss_end = status_rss(fd, &b, &zone);
	printf("\nkilnd RSS, MB (10^6 B):\n"
	       "  VmRSS after start          %6.1f (status rss_bytes %.1f; "
	       "RssAnon %.1f, RssFile %.1f)\n"
	       "  after the warm-up compiles %6.1f\n"
	       "  idle after the benchmark   %6.1f (status rss_bytes %.1f; "
	       "RssAnon %.1f, RssFile %.1f); VmHWM %.1f\n",
	       (double)rss_start / 1e6, (double)st_rss_start / 1e6,
	       (double)anon0 / 1e6, (double)file0 / 1e6, (double)rss_warm / 1e6,
	       (double)rss_end / 1e6, (double)st_rss_end / 1e6,
	       (double)anon / 1e6, (double)file / 1e6, (double)hwm / 1e6);

	/* The targets, over the points that ran. */
	double best_rps = 0, worst_x[2] = {0, 0};
	for (int k = 0; k < 2; k++)
		for (size_t ci = 0; ci < N_COUNTS; ci++) {
			point_t *a = &pk[k][ci], *e = &pe[k][ci];
			if (!ran[k][ci])
				continue;
			if (k == 0 && a->rps > best_rps)
				best_rps = a->rps;
			double x = a->p50 / e->p50, y = e->rps / a->rps;
			if (x > worst_x[k])
				worst_x[k] = x;
			if (y > worst_x[k])
				worst_x[k] = y;
		}
	uint64_t idle_rss = rss_end > rss_start ? rss_end : rss_start;
	printf("\n");
	if (ran[0][0])
		printf("target \"lookup hit p50 <= 100 us\" (1 client): %s "
		       "(%.1f us)\n",
		       verdict(pk[0][0].p50 <= 100), pk[0][0].p50);
	if (best_rps > 0)
		printf("target \">= 20k hits/s\" (best lookup point, %ld "
		       "CPUs): %s (%.0f/s)\n",
		       ncpu, verdict(best_rps >= 20000), best_rps);
	for (int k = 0; k < 2; k++)
		if (worst_x[k] > 0)
			printf("target \"<= 2x the echo\", %s (worst p50 or "
			       "req/s ratio over the points): %s (%.2fx)\n",
			       k == 0 ? "lookup"
				      : "compile with the full graph",
			       verdict(worst_x[k] <= 2.0), worst_x[k]);
	printf("target \"idle RSS <= 30 MB\" (VmRSS, the larger of after "
	       "start and after the benchmark): %s (%.1f MB)\n",
	       verdict(idle_rss <= 30000000), (double)idle_rss / 1e6);

	/* Stop the daemon: `shutdown`, then wait for it to exit. */
	frame_begin(&f, KILN_OP_SHUTDOWN, 0);
	frame_end(&f);
	rpc(fd, &f, &b, &zone, &res, &blen, "shutdown");
	msgpack_sbuffer_destroy(&f.sb);
	close(fd);
	int st = 0;
	double t_stop = now();
	while (kilnd_pid > 0) {
		if (waitpid(kilnd_pid, &st, WNOHANG) == kilnd_pid) {
			kilnd_pid = -1;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				fprintf(stderr,
					"bench_kilnd: kilnd exited with "
					"status %d\n",
					st);
		} else if (now() - t_stop > 10) {
			fprintf(stderr, "bench_kilnd: kilnd still running 10 s "
					"after shutdown; SIGTERM\n");
			break;
		} else {
			usleep(10000);
		}
	}
	cleanup(); /* SIGTERM if it is still there; the temporary dir */

	msgpack_sbuffer_destroy(&creq.sb);
	msgpack_sbuffer_destroy(&lreq.sb);
	msgpack_zone_destroy(&zone);
	free(b.p);
	free(reply);
	for (size_t i = 0; i < ng; i++)
		free(gs[i].bytes);
	free(gs);
	return 0;
}
