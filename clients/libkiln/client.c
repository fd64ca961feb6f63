/*
 * client.c — libkiln's kilnd client (kiln.h § 4): connect (with socket
 * discovery and the optional auto-start of a per-user kilnd), synchronous
 * requests with poll()-based timeouts, reconnect-and-retry, hello, compile,
 * lookup, any op, and a small in-process artifact cache.
 *
 * Wire: one request at a time per handle (PROTOCOL.md frames). A request is
 * packed into one buffer (frame length, envelope, the op's fields) and
 * written with send(MSG_NOSIGNAL) on a non-blocking socket; the reply is
 * read through a kiln_frame_decoder_t until one whole frame is in. Every
 * API call has one deadline (timeout_ms from its start) that covers all of
 * its round trips.
 *
 * Broken connections: before a request is sent, the socket is polled; a
 * readable or hung-up socket with no request outstanding means kilnd closed
 * it (restart, idle close), so the handle reconnects first, which is safe
 * for every op since nothing was sent. A request that then fails with
 * EPIPE, ECONNRESET or end of stream is sent once more on a new connection
 * when its op is idempotent (hello, compile, lookup, status, list); evict,
 * gc and shutdown are not retried. A timeout drops the connection (a late
 * reply can never be read as the next request's) and is not retried.
 *
 * Auto-start (kiln_client_opts_t.autostart): connect; on ENOENT or
 * ECONNREFUSED take an exclusive flock on <socket dir>/autostart.lock,
 * connect again (another process may have started kilnd meanwhile), else
 * spawn kilnd detached (double fork, setsid; stdin/stdout /dev/null, stderr
 * appended to <socket dir>/kilnd.log), poll-connect until the connect
 * deadline, unlock. The lock makes 16 processes starting at once start one
 * kilnd. A pipe with O_CLOEXEC reports an exec failure back.
 *
 * Cache: artifacts by signature, least recently used out first, bounded by
 * cache_bytes. A blob is shared (reference counted) by the keys it is
 * stored under: the signature computed here and the one kilnd replied with,
 * which differ when kilnd served a generalized (dynamic-shape) artifact.
 * Each blob's bytes count once. Lookup is a linear scan of the LRU list:
 * the cache holds at most a few thousand entries.
 *
 * Invariants: everything in a kiln_client_t after construction is guarded
 * by its mutex; fd < 0 means "not connected" and then the decoder holds no
 * partial frame and have_hello is false.
 */
#include "clients/libkiln/kiln.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS	   600000
#define DEFAULT_CONNECT_TIMEOUT_MS 5000
#define DEFAULT_IDLE_S		   600
#define DEFAULT_CACHE_BYTES	   ((size_t)64 << 20)
#define SYSTEM_SOCKET_DIR	   "/run/kiln/"
#define READ_CHUNK		   65536
#define SUN_PATH_MAX		   sizeof(((struct sockaddr_un *)0)->sun_path)

typedef struct cblob {
	uint8_t *data;
	size_t len;
	char sig[KILN_SIG_HEX]; /* the artifact's signature, as kilnd said */
	double compile_ms;
	unsigned refs; /* entries that point at it */
} cblob_t;

typedef struct centry {
	struct centry *prev, *next; /* LRU list: head most recent */
	uint8_t key[KILN_SIG_BYTES];
	cblob_t *blob;
} centry_t;

struct kiln_client {
	pthread_mutex_t mu;
	char path[SUN_PATH_MAX];
	int timeout_ms, connect_timeout_ms;
	bool autostart;
	char *kilnd_path; /* NULL: $KILND, else "kilnd" in $PATH */
	uint32_t idle_s;
	size_t cache_cap;
	bool cache_on;

	int fd;	    /* -1: not connected */
	bool stray; /* bytes after the last reply: drop the connection */
	kiln_frame_decoder_t dec;
	uint64_t next_id;
	size_t max_frame; /* the server's limit once known (at least 64 MiB) */
	uint8_t *rbuf;	  /* READ_CHUNK bytes */

	bool have_hello; /* info and fingerprint are this connection's */
	kiln_server_info_t info;
	char *fingerprint; /* the whole string (info's copy may be cut) */

	centry_t *head, *tail;
	size_t cache_used; /* bytes of the blobs */
};

/* ---- small helpers ------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline)
{
	int64_t l = deadline - now_ms();
	if (l < 0)
		return 0;
	return l > INT_MAX ? INT_MAX : (int)l;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Copies the msgpack str o into out[n] (cut to fit); "" when not a str. */
static void copy_str(const msgpack_object *o, char *out, size_t n)
{
	out[0] = '\0';
	if (o == NULL || o->type != MSGPACK_OBJECT_STR || n == 0)
		return;
	size_t k = o->via.str.size < n - 1 ? o->via.str.size : n - 1;
	memcpy(out, o->via.str.ptr, k);
	out[k] = '\0';
}

static bool obj_u64(const msgpack_object *o, uint64_t *v)
{
	if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return false;
	*v = o->via.u64;
	return true;
}

static bool obj_f64(const msgpack_object *o, double *v)
{
	if (o == NULL)
		return false;
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: *v = o->via.f64; return true;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		*v = (double)o->via.u64;
		return true;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		*v = (double)o->via.i64;
		return true;
	default: return false;
	}
}

static bool is_idempotent(kiln_op_t op)
{
	return op == KILN_OP_HELLO || op == KILN_OP_COMPILE ||
	       op == KILN_OP_LOOKUP || op == KILN_OP_STATUS ||
	       op == KILN_OP_LIST;
}

static void result_init(kiln_result_t *r)
{
	memset(r, 0, sizeof(*r));
	r->err_node = -1;
}

void kiln_result_free(kiln_result_t *r)
{
	if (r == NULL)
		return;
	free(r->artifact);
	result_init(r);
}

/* ---- options and discovery ----------------------------------------------- */

void kiln_client_opts_init(kiln_client_opts_t *o)
{
	memset(o, 0, sizeof(*o));
	o->autostart = -1;
}

static bool is_system_socket(const char *path)
{
	return strncmp(path, SYSTEM_SOCKET_DIR, strlen(SYSTEM_SOCKET_DIR)) == 0;
}

/* ---- connecting ------------------------------------------------------------
 */

/* One connect() on a non-blocking socket; a full backlog (EAGAIN) is
 * retried until the deadline. 0 with *fdp set, or -errno. */
static int connect_once(const char *path, int64_t deadline, int *fdp)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	for (;;) {
		int fd = socket(AF_UNIX,
				SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			*fdp = fd;
			return 0;
		}
		int e = errno;
		if (e == EINPROGRESS) {
			struct pollfd p = {fd, POLLOUT, 0};
			int so = 0;
			socklen_t sl = sizeof(so);
			if (poll(&p, 1, left_ms(deadline)) == 1 &&
			    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) ==
				0 &&
			    so == 0) {
				*fdp = fd;
				return 0;
			}
			e = so != 0 ? so : ETIMEDOUT;
		}
		close(fd);
		if ((e != EAGAIN && e != EINTR) || now_ms() >= deadline)
			return -e;
		sleep_ms(5);
	}
}

static int mkdir_p(const char *dir, mode_t mode)
{
	char tmp[SUN_PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (char *p = tmp + 1; *p != '\0'; p++) {
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

/* The kilnd executable: the option, $KILND, else "kilnd" searched in
 * $PATH (done here, before fork, so the child only calls execv). */
static int find_kilnd(const kiln_client_t *c, char *out, size_t n, char *err,
		      size_t errlen)
{
	const char *name = c->kilnd_path;
	if (name == NULL || name[0] == '\0')
		name = getenv("KILND");
	if (name == NULL || name[0] == '\0')
		name = "kilnd";
	if (strchr(name, '/') != NULL) {
		if ((size_t)snprintf(out, n, "%s", name) >= n)
			return kiln__errf(err, errlen, -ENAMETOOLONG,
					  "kilnd path too long");
		return 0;
	}
	const char *path = getenv("PATH");
	if (path == NULL || path[0] == '\0')
		path = "/usr/local/bin:/usr/bin:/bin";
	while (*path != '\0') {
		const char *end = strchr(path, ':');
		size_t len = end != NULL ? (size_t)(end - path) : strlen(path);
		int k = snprintf(out, n, "%.*s%s%s", (int)len, path,
				 len > 0 ? "/" : "", name);
		if (k > 0 && (size_t)k < n && access(out, X_OK) == 0)
			return 0;
		path += len;
		if (*path == ':')
			path++;
	}
	return kiln__errf(err, errlen, -ENOENT,
			  "cannot auto-start kilnd: \"%s\" not found in $PATH "
			  "(set $KILND or kilnd_path)",
			  name);
}

/*
 * Starts kilnd detached from this process (double fork, setsid), with
 * stdin/stdout on /dev/null and stderr appended to logpath. Only
 * async-signal-safe calls between fork and exec (this process may have
 * threads). Returns once kilnd was exec'ed (or failed to be).
 */
static int spawn_kilnd(const char *exe, char *const argv[], const char *logpath,
		       char *err, size_t errlen)
{
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return kiln__errf(err, errlen, -errno, "pipe: %s",
				  strerror(errno));
	int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	int logfd =
	    open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (logfd < 0)
		logfd = nullfd;
	long maxfd = sysconf(_SC_OPEN_MAX);
	if (maxfd < 0 || maxfd > 65536)
		maxfd = 65536;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(pfd[0]);
		close(pfd[1]);
		if (logfd != nullfd)
			close(logfd);
		if (nullfd >= 0)
			close(nullfd);
		return kiln__errf(err, errlen, -e, "fork: %s", strerror(e));
	}
	if (pid == 0) {
		sigset_t none;
		sigemptyset(&none);
		pthread_sigmask(SIG_SETMASK, &none, NULL);
		if (setsid() < 0 || (pid = fork()) < 0) {
			int e = errno;
			ssize_t w = write(pfd[1], &e, sizeof(e));
			(void)w;
			_exit(127);
		}
		if (pid > 0)
			_exit(0);
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		for (int s = 1; s < NSIG; s++)
			if (s != SIGKILL && s != SIGSTOP)
				sigaction(s, &sa, NULL);
		if (nullfd >= 0) {
			dup2(nullfd, 0);
			dup2(nullfd, 1);
		}
		if (logfd >= 0)
			dup2(logfd, 2);
		for (int fd = 0; fd < 3; fd++)
			fcntl(fd, F_SETFD, 0);
		/* Every other fd closes at exec (pfd[1] included: EOF
		 * tells the parent exec worked). */
		if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
			for (long fd = 3; fd < maxfd; fd++)
				fcntl((int)fd, F_SETFD, FD_CLOEXEC);
		execv(exe, argv);
		int e = errno;
		ssize_t w = write(pfd[1], &e, sizeof(e));
		(void)w;
		_exit(127);
	}
	close(pfd[1]);
	if (logfd != nullfd)
		close(logfd);
	if (nullfd >= 0)
		close(nullfd);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	int e = 0;
	ssize_t r;
	while ((r = read(pfd[0], &e, sizeof(e))) < 0 && errno == EINTR)
		;
	close(pfd[0]);
	if (r == (ssize_t)sizeof(e) && e != 0)
		return kiln__errf(err, errlen, -e, "cannot start %s: %s", exe,
				  strerror(e));
	return 0;
}

/*
 * The auto-start protocol (see the top of the file). Called after a
 * connect failed with ENOENT or ECONNREFUSED.
 */
static int autostart(kiln_client_t *c, int64_t deadline, int *fdp, char *err,
		     size_t errlen)
{
	char dir[SUN_PATH_MAX], lockpath[SUN_PATH_MAX + 32],
	    logpath[SUN_PATH_MAX + 32];
	snprintf(dir, sizeof(dir), "%s", c->path);
	char *slash = strrchr(dir, '/');
	if (slash == NULL)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		slash[1] = '\0';
	else
		*slash = '\0';
	int rc = mkdir_p(dir, 0700);
	if (rc < 0)
		return kiln__errf(err, errlen, rc,
				  "cannot auto-start kilnd: mkdir %s: %s", dir,
				  strerror(-rc));
	snprintf(lockpath, sizeof(lockpath), "%s/autostart.lock", dir);
	snprintf(logpath, sizeof(logpath), "%s/kilnd.log", dir);
	int lfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lfd < 0)
		return kiln__errf(err, errlen, -errno,
				  "cannot auto-start kilnd: %s: %s", lockpath,
				  strerror(errno));
	while (flock(lfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			rc = kiln__errf(err, errlen, -errno, "flock %s: %s",
					lockpath, strerror(errno));
			close(lfd);
			return rc;
		}
		if (now_ms() >= deadline) {
			close(lfd);
			return kiln__errf(err, errlen, KILN_ETIMEOUT,
					  "no kilnd on %s, and another process "
					  "held %s for %d ms",
					  c->path, lockpath,
					  c->connect_timeout_ms);
		}
		sleep_ms(10);
	}
	/* Under the lock: someone may have started it meanwhile. */
	rc = connect_once(c->path, deadline, fdp);
	if (rc == 0 || (rc != -ENOENT && rc != -ECONNREFUSED)) {
		if (rc < 0)
			kiln__errf(err, errlen, rc, "connect %s: %s", c->path,
				   strerror(-rc));
		goto out;
	}
	char exe[4096], idle[16];
	rc = find_kilnd(c, exe, sizeof(exe), err, errlen);
	if (rc < 0)
		goto out;
	snprintf(idle, sizeof(idle), "%u", c->idle_s);
	char *argv[] = {exe,  "--socket",    c->path, "--exit-idle-s",
			idle, "--log-level", "warn",  NULL};
	rc = spawn_kilnd(exe, argv, logpath, err, errlen);
	if (rc < 0)
		goto out;
	for (;;) {
		rc = connect_once(c->path, deadline, fdp);
		if (rc == 0)
			break;
		if (now_ms() >= deadline) {
			rc = kiln__errf(err, errlen, KILN_ETIMEOUT,
					"started %s, but it did not answer on "
					"%s within %d ms (see %s)",
					exe, c->path, c->connect_timeout_ms,
					logpath);
			break;
		}
		sleep_ms(10);
	}
out:
	flock(lfd, LOCK_UN);
	close(lfd);
	return rc;
}

/* Connects c->fd (auto-starting kilnd as the options say). */
static int connect_to(kiln_client_t *c, int64_t deadline, char *err,
		      size_t errlen)
{
	int fd = -1;
	int rc = connect_once(c->path, deadline, &fd);
	if (rc < 0 && (rc == -ENOENT || rc == -ECONNREFUSED)) {
		if (c->autostart)
			rc = autostart(c, deadline, &fd, err, errlen);
		else
			return kiln__errf(
			    err, errlen, rc, "no kilnd at %s: %s%s", c->path,
			    strerror(-rc),
			    is_system_socket(c->path)
				? " (auto-start is off for the system socket)"
				: " (auto-start is off)");
		if (rc < 0)
			return rc;
	} else if (rc == -EAGAIN || rc == -ETIMEDOUT) {
		return kiln__errf(err, errlen, KILN_ETIMEOUT,
				  "kilnd on %s did not accept the connection "
				  "within %d ms",
				  c->path, c->connect_timeout_ms);
	} else if (rc < 0) {
		return kiln__errf(err, errlen, rc, "connect %s: %s", c->path,
				  strerror(-rc));
	}
	c->fd = fd;
	c->stray = false;
	kiln_frame_decoder_init(&c->dec, c->max_frame);
	return 0;
}

/* Drops the connection; the next request connects again. */
static void drop(kiln_client_t *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		kiln_frame_decoder_free(&c->dec);
	}
	c->fd = -1;
	c->stray = false;
	c->have_hello = false;
}

/* Connected, and not closed by kilnd while no request was outstanding (a
 * readable or hung-up idle socket: kilnd restarted or closed it). */
static int ensure_connected(kiln_client_t *c, char *err, size_t errlen)
{
	if (c->fd >= 0) {
		struct pollfd p = {c->fd, POLLIN, 0};
		if (c->stray || poll(&p, 1, 0) != 0)
			drop(c);
	}
	if (c->fd >= 0)
		return 0;
	return connect_to(c, now_ms() + c->connect_timeout_ms, err, errlen);
}

/* ---- one round trip --------------------------------------------------------
 */

/* Writes all of p[0..n). *broken: the peer is gone (EPIPE and kin). */
static int send_all(kiln_client_t *c, const char *p, size_t n, int64_t deadline,
		    bool *broken, char *err, size_t errlen)
{
	while (n > 0) {
		ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd pf = {c->fd, POLLOUT, 0};
			int ms = left_ms(deadline);
			if (ms == 0 || poll(&pf, 1, ms) == 0)
				return KILN_ETIMEOUT;
			continue;
		}
		int e = k < 0 ? errno : EPIPE;
		*broken = e == EPIPE || e == ECONNRESET || e == ENOTCONN;
		return kiln__errf(err, errlen, -e, "send to kilnd on %s: %s",
				  c->path, strerror(e));
	}
	return 0;
}

/* Reads until one whole frame is in: *body (malloc'd) and *len. */
static int recv_frame(kiln_client_t *c, int64_t deadline, uint8_t **body,
		      size_t *len, bool *broken, char *err, size_t errlen)
{
	for (;;) {
		struct pollfd pf = {c->fd, POLLIN, 0};
		int ms = left_ms(deadline);
		int n = ms == 0 ? 0 : poll(&pf, 1, ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			return KILN_ETIMEOUT;
		ssize_t k = read(c->fd, c->rbuf, READ_CHUNK);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0) {
			int e = k == 0 ? ECONNRESET : errno;
			*broken = e == ECONNRESET || e == EPIPE;
			if (k == 0)
				return kiln__errf(err, errlen, -ECONNRESET,
						  "kilnd on %s closed the "
						  "connection",
						  c->path);
			return kiln__errf(err, errlen, -e,
					  "read from kilnd on %s: %s", c->path,
					  strerror(e));
		}
		const uint8_t *p = c->rbuf;
		size_t left = (size_t)k;
		int rc =
		    kiln_frame_feed(&c->dec, &p, &left, body, len, err, errlen);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			/* One request at a time: anything after its reply
			 * is not ours. */
			if (left > 0)
				c->stray = true;
			return 0;
		}
	}
}

/*
 * Sends one request (the envelope for op, then nf key/value pairs already
 * packed in fields[0..flen)) and reads its reply frame, reconnecting and
 * sending it once more when the connection turns out broken and the op is
 * idempotent. *id is the request's id.
 */
static int roundtrip(kiln_client_t *c, kiln_op_t op, const void *fields,
		     size_t flen, uint32_t nf, int64_t deadline, uint64_t *id,
		     uint8_t **body, size_t *blen, char *err, size_t errlen)
{
	for (int attempt = 0;; attempt++) {
		int rc = ensure_connected(c, err, errlen);
		if (rc < 0)
			return rc;
		*id = c->next_id++;
		msgpack_sbuffer sb;
		msgpack_packer pk;
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		rc = kiln_frame_begin(&sb);
		if (rc == 0)
			rc = kiln_pack_request_head(&pk, *id, op, nf);
		if (rc == 0 && flen > 0 &&
		    msgpack_sbuffer_write(&sb, (const char *)fields, flen) != 0)
			rc = -ENOMEM;
		if (rc == 0 && sb.data == NULL)
			rc = -ENOMEM;
		/* Requests within kilnd's own limit once hello said it. */
		size_t lim = c->have_hello && c->info.max_frame_bytes > 0 &&
				     c->info.max_frame_bytes < SIZE_MAX
				 ? (size_t)c->info.max_frame_bytes
				 : c->max_frame;
		if (rc == 0) {
			rc = kiln_frame_end(&sb, lim);
			if (rc < 0)
				kiln__errf(err, errlen, rc,
					   "%s request of %zu bytes exceeds "
					   "kilnd's frame limit (%zu)",
					   kiln_op_name(op), sb.size - 4, lim);
		} else {
			kiln__errf(err, errlen, rc, "out of memory");
		}
		if (rc < 0) {
			msgpack_sbuffer_destroy(&sb);
			return rc;
		}
		bool broken = false;
		rc = send_all(c, sb.data, sb.size, deadline, &broken, err,
			      errlen);
		msgpack_sbuffer_destroy(&sb);
		if (rc == 0)
			rc = recv_frame(c, deadline, body, blen, &broken, err,
					errlen);
		if (rc == 0)
			return 0;
		drop(c);
		if (broken && attempt == 0 && is_idempotent(op) &&
		    now_ms() < deadline)
			continue;
		if (rc == KILN_ETIMEOUT)
			return kiln__errf(err, errlen, rc,
					  "%s: no reply from kilnd on %s "
					  "within %d ms",
					  kiln_op_name(op), c->path,
					  c->timeout_ms);
		return rc;
	}
}

/*
 * A request and its decoded reply. On success (the reply is ok) res points
 * into *body (free() it) and zone. An error reply returns its code with the
 * message in err (and res->err_node); *body is then freed already.
 */
static int request(kiln_client_t *c, kiln_op_t op, const void *fields,
		   size_t flen, uint32_t nf, int64_t deadline,
		   msgpack_zone *zone, kiln_response_t *res, uint8_t **body,
		   size_t *blen, char *err, size_t errlen)
{
	uint64_t id;
	*body = NULL;
	memset(res, 0, sizeof(*res));
	res->err_node = -1;
	int rc = roundtrip(c, op, fields, flen, nf, deadline, &id, body, blen,
			   err, errlen);
	if (rc < 0)
		return rc;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	lim.max_frame_bytes = c->max_frame;
	char e2[256] = "";
	rc =
	    kiln_response_decode(*body, *blen, &lim, zone, res, e2, sizeof(e2));
	if (rc < 0) {
		drop(c);
		rc =
		    kiln__errf(err, errlen, rc, "bad reply from kilnd: %s", e2);
		goto fail;
	}
	if (res->id != id && (res->ok || res->id != 0)) {
		drop(c);
		rc = kiln__errf(err, errlen, KILN_EINTERNAL,
				"kilnd answered request %llu, expected %llu",
				(unsigned long long)res->id,
				(unsigned long long)id);
		goto fail;
	}
	if (!res->ok) {
		if (res->id != id) /* id 0: about the stream, which may close */
			drop(c);
		rc = kiln__errf(
		    err, errlen, res->err_code, "%.*s",
		    (int)(res->message_len > 4000 ? 4000 : res->message_len),
		    res->message);
		goto fail;
	}
	return 0;
fail:
	free(*body);
	*body = NULL;
	return rc;
}

/* ---- hello -----------------------------------------------------------------
 */

static int parse_hello(kiln_client_t *c, const msgpack_object *b, char *err,
		       size_t errlen)
{
	kiln_server_info_t in;
	memset(&in, 0, sizeof(in));
	copy_str(kiln_map_get(b, "server"), in.server, sizeof(in.server));
	copy_str(kiln_map_get(b, "version"), in.version, sizeof(in.version));
	uint64_t v = 0;
	if (obj_u64(kiln_map_get(b, "protocol"), &v))
		in.protocol = (uint32_t)v;
	const msgpack_object *fp = kiln_map_get(b, "fingerprint");
	const msgpack_object *ts = kiln_map_get(b, "targets");
	if (fp == NULL || fp->type != MSGPACK_OBJECT_STR || ts == NULL ||
	    ts->type != MSGPACK_OBJECT_ARRAY || ts->via.array.size == 0)
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "hello reply without a fingerprint or "
				  "targets");
	char e2[256] = "";
	int rc = kiln_target_from_object(&ts->via.array.ptr[0], &in.target, e2,
					 sizeof(e2));
	if (rc < 0)
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "hello reply: targets[0]: %s", e2);
	copy_str(fp, in.fingerprint, sizeof(in.fingerprint));
	const msgpack_object *lim = kiln_map_get(b, "limits");
	if (lim != NULL && lim->type == MSGPACK_OBJECT_MAP) {
		if (obj_u64(kiln_map_get(lim, "max_frame_bytes"), &v))
			in.max_frame_bytes = v;
		if (obj_u64(kiln_map_get(lim, "max_nodes"), &v))
			in.max_nodes =
			    v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
		if (obj_u64(kiln_map_get(lim, "max_inflight"), &v))
			in.max_inflight =
			    v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
	}
	char *f = strndup(fp->via.str.ptr, fp->via.str.size);
	if (f == NULL)
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	free(c->fingerprint);
	c->fingerprint = f;
	c->info = in;
	kiln_limits_t dl;
	kiln_limits_default(&dl);
	c->max_frame = in.max_frame_bytes > dl.max_frame_bytes
			   ? (size_t)in.max_frame_bytes
			   : dl.max_frame_bytes;
	if (c->fd >= 0)
		c->dec.max_frame_bytes = c->max_frame;
	c->have_hello = true;
	return 0;
}

/* The connection's hello, asked for when not known yet. */
static int ensure_hello(kiln_client_t *c, int64_t deadline, char *err,
			size_t errlen)
{
	int rc = ensure_connected(c, err, errlen);
	if (rc < 0 || c->have_hello)
		return rc;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_pack_cstr(&pk, "client");
	kiln_pack_cstr(&pk, "libkiln/" KILN_VERSION_STRING);
	kiln_pack_cstr(&pk, "pid");
	msgpack_pack_uint64(&pk, (uint64_t)getpid());
	if (sb.data == NULL) {
		msgpack_sbuffer_destroy(&sb);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	msgpack_zone zone;
	msgpack_zone_init(&zone, 2048);
	kiln_response_t res;
	uint8_t *body;
	size_t blen;
	rc = request(c, KILN_OP_HELLO, sb.data, sb.size, 2, deadline, &zone,
		     &res, &body, &blen, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	if (rc == 0) {
		rc = parse_hello(c, &res.body, err, errlen);
		free(body);
	}
	msgpack_zone_destroy(&zone);
	return rc;
}

int kiln_client_hello(kiln_client_t *c, kiln_server_info_t *out, char *err,
		      size_t errlen)
{
	if (c == NULL || out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	pthread_mutex_lock(&c->mu);
	int rc = ensure_hello(c, now_ms() + c->timeout_ms, err, errlen);
	if (rc == 0)
		*out = c->info;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* ---- the artifact cache ----------------------------------------------------
 */

static void lru_unlink(kiln_client_t *c, centry_t *e)
{
	if (e->prev != NULL)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next != NULL)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push_front(kiln_client_t *c, centry_t *e)
{
	e->prev = NULL;
	e->next = c->head;
	if (c->head != NULL)
		c->head->prev = e;
	c->head = e;
	if (c->tail == NULL)
		c->tail = e;
}

static void blob_unref(kiln_client_t *c, cblob_t *b)
{
	if (--b->refs > 0)
		return;
	c->cache_used -= b->len;
	free(b->data);
	free(b);
}

static void entry_free(kiln_client_t *c, centry_t *e)
{
	lru_unlink(c, e);
	blob_unref(c, e->blob);
	free(e);
}

/* The entry for key (made the most recent), or NULL. */
static centry_t *cache_find(kiln_client_t *c, const uint8_t key[KILN_SIG_BYTES])
{
	for (centry_t *e = c->head; e != NULL; e = e->next)
		if (memcmp(e->key, key, KILN_SIG_BYTES) == 0) {
			if (e != c->head) {
				lru_unlink(c, e);
				lru_push_front(c, e);
			}
			return e;
		}
	return NULL;
}

/* Points key at b (taking a reference); false when out of memory. */
static bool cache_put(kiln_client_t *c, const uint8_t key[KILN_SIG_BYTES],
		      cblob_t *b)
{
	centry_t *e = cache_find(c, key);
	if (e != NULL) {
		b->refs++;
		blob_unref(c, e->blob);
		e->blob = b;
		return true;
	}
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return false;
	memcpy(e->key, key, KILN_SIG_BYTES);
	e->blob = b;
	b->refs++;
	lru_push_front(c, e);
	return true;
}

/* Stores r's artifact under k1 and (when not NULL) k2. Best effort. */
static void cache_store(kiln_client_t *c, const uint8_t *k1, const uint8_t *k2,
			const kiln_result_t *r)
{
	if (!c->cache_on || r->artifact_len > c->cache_cap)
		return;
	cblob_t *b = calloc(1, sizeof(*b));
	if (b == NULL)
		return;
	b->data = malloc(r->artifact_len > 0 ? r->artifact_len : 1);
	if (b->data == NULL) {
		free(b);
		return;
	}
	memcpy(b->data, r->artifact, r->artifact_len);
	b->len = r->artifact_len;
	memcpy(b->sig, r->signature, sizeof(b->sig));
	b->compile_ms = r->compile_ms;
	c->cache_used += b->len;
	b->refs = 1; /* held while the keys are put */
	cache_put(c, k1, b);
	if (k2 != NULL && memcmp(k1, k2, KILN_SIG_BYTES) != 0)
		cache_put(c, k2, b);
	blob_unref(c, b);
	while (c->cache_used > c->cache_cap && c->tail != NULL)
		entry_free(c, c->tail);
}

/* A copy of the cached artifact for key into out ("local"); false when it
 * is not cached (or out of memory). exact: only one whose
 * own signature is key (not a generalized artifact kilnd served for the
 * static graph key signs: a compile with dynamic 0 asks for the static
 * graph's own artifact). */
static bool cache_get(kiln_client_t *c, const uint8_t key[KILN_SIG_BYTES],
		      bool exact, kiln_result_t *out)
{
	if (!c->cache_on)
		return false;
	centry_t *e = cache_find(c, key);
	if (e == NULL)
		return false;
	if (exact) {
		char hex[KILN_SIG_HEX];
		kiln_sig_to_hex(key, hex);
		if (strcmp(hex, e->blob->sig) != 0)
			return false;
	}
	uint8_t *p = malloc(e->blob->len > 0 ? e->blob->len : 1);
	if (p == NULL)
		return false;
	memcpy(p, e->blob->data, e->blob->len);
	out->artifact = p;
	out->artifact_len = e->blob->len;
	memcpy(out->signature, e->blob->sig, sizeof(out->signature));
	snprintf(out->source, sizeof(out->source), "local");
	out->compile_ms = e->blob->compile_ms;
	return true;
}

/* ---- compile and lookup ----------------------------------------------------
 */

/* The result fields of a compile or lookup reply. */
static int fill_result(const msgpack_object *b, kiln_result_t *out, char *err,
		       size_t errlen)
{
	const msgpack_object *sig = kiln_map_get(b, "signature");
	const msgpack_object *art = kiln_map_get(b, "artifact");
	if (sig == NULL || sig->type != MSGPACK_OBJECT_STR ||
	    sig->via.str.size != KILN_SIG_HEX - 1 || art == NULL ||
	    (art->type != MSGPACK_OBJECT_BIN &&
	     art->type != MSGPACK_OBJECT_STR))
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "kilnd's reply lacks a signature or an "
				  "artifact");
	size_t n = art->type == MSGPACK_OBJECT_BIN ? art->via.bin.size
						   : art->via.str.size;
	const void *p = art->type == MSGPACK_OBJECT_BIN
			    ? (const void *)art->via.bin.ptr
			    : (const void *)art->via.str.ptr;
	out->artifact = malloc(n > 0 ? n : 1);
	if (out->artifact == NULL)
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	memcpy(out->artifact, p, n);
	out->artifact_len = n;
	copy_str(sig, out->signature, sizeof(out->signature));
	copy_str(kiln_map_get(b, "source"), out->source, sizeof(out->source));
	double ms = 0;
	if (obj_f64(kiln_map_get(b, "compile_ms"), &ms))
		out->compile_ms = ms;
	return 0;
}

/* lookup of sig (hex) at kilnd: 0 with out filled, or its error. */
static int do_lookup(kiln_client_t *c, const char *hex, int64_t deadline,
		     kiln_result_t *out, char *err, size_t errlen)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_pack_cstr(&pk, "signature");
	kiln_pack_cstr(&pk, hex);
	if (sb.data == NULL) {
		msgpack_sbuffer_destroy(&sb);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	msgpack_zone zone;
	msgpack_zone_init(&zone, 1024);
	kiln_response_t res;
	uint8_t *body;
	size_t blen;
	int rc = request(c, KILN_OP_LOOKUP, sb.data, sb.size, 1, deadline,
			 &zone, &res, &body, &blen, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	if (rc == 0) {
		rc = fill_result(&res.body, out, err, errlen);
		free(body);
	}
	msgpack_zone_destroy(&zone);
	return rc;
}

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	kiln_pack_cstr(pk, k);
	kiln_pack_cstr(pk, v);
}

/* The compile request's fields: graph, target, options, priority. */
static int pack_compile(msgpack_packer *pk, const kiln_graph_t *g,
			const kiln_target_t *t, const kiln_compile_opts_t *o,
			int dynamic, const char *priority)
{
	kiln_pack_cstr(pk, "graph");
	int rc = kiln_graph_pack(g, pk);
	if (rc < 0)
		return rc;
	kiln_pack_cstr(pk, "target");
	uint32_t nt = 1 + (t->arch[0] != '\0') + (t->features[0] != '\0');
	msgpack_pack_map(pk, nt);
	pack_kv_str(pk, "backend", t->backend);
	if (t->arch[0] != '\0')
		pack_kv_str(pk, "arch", t->arch);
	if (t->features[0] != '\0')
		pack_kv_str(pk, "features", t->features);
	kiln_pack_cstr(pk, "options");
	msgpack_pack_map(pk, 2);
	pack_kv_str(pk, "mode", o->mode);
	kiln_pack_cstr(pk, "dynamic");
	if (dynamic < 0)
		msgpack_pack_nil(pk);
	else if (dynamic > 0)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
	pack_kv_str(pk, "priority", priority);
	return 0;
}

/* compile of g at kilnd. */
static int do_compile(kiln_client_t *c, const kiln_graph_t *g,
		      const kiln_target_t *t, const kiln_compile_opts_t *o,
		      int dynamic, const char *priority, int64_t deadline,
		      kiln_result_t *out, char *err, size_t errlen)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	int rc = pack_compile(&pk, g, t, o, dynamic, priority);
	if (rc < 0 || sb.data == NULL) {
		msgpack_sbuffer_destroy(&sb);
		return kiln__errf(err, errlen, rc < 0 ? rc : -ENOMEM,
				  "cannot pack the graph");
	}
	msgpack_zone zone;
	msgpack_zone_init(&zone, 1024);
	kiln_response_t res;
	uint8_t *body;
	size_t blen;
	rc = request(c, KILN_OP_COMPILE, sb.data, sb.size, 4, deadline, &zone,
		     &res, &body, &blen, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	if (rc == 0) {
		rc = fill_result(&res.body, out, err, errlen);
		free(body);
	} else {
		out->err_node = res.err_node;
	}
	msgpack_zone_destroy(&zone);
	return rc;
}

static bool valid_mode(const char *m)
{
	return strcmp(m, "default") == 0 || strcmp(m, "reduce-overhead") == 0 ||
	       strcmp(m, "max-autotune") == 0;
}

int kiln_client_compile(kiln_client_t *c, const kiln_graph_t *g,
			const kiln_target_t *t, const kiln_compile_opts_t *o,
			int dynamic, const char *priority, kiln_result_t *out,
			char *err, size_t errlen)
{
	if (out != NULL)
		result_init(out);
	if (c == NULL || g == NULL || out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	if (priority == NULL)
		priority = "interactive";
	if (strcmp(priority, "interactive") != 0 &&
	    strcmp(priority, "batch") != 0)
		return kiln__errf(
		    err, errlen, KILN_EBADREQ,
		    "priority: want \"interactive\" or \"batch\", "
		    "not \"%.40s\"",
		    priority);
	if (dynamic < -1 || dynamic > 1)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "dynamic: want -1, 0 or 1, not %d", dynamic);
	kiln_compile_opts_t ro;
	memset(&ro, 0, sizeof(ro));
	if (o != NULL)
		memcpy(ro.mode, o->mode, sizeof(ro.mode));
	ro.mode[sizeof(ro.mode) - 1] = '\0';
	if (ro.mode[0] == '\0')
		snprintf(ro.mode, sizeof(ro.mode), "default");
	if (!valid_mode(ro.mode))
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "mode: want \"default\", \"reduce-overhead\" "
				  "or \"max-autotune\", not \"%s\"",
				  ro.mode);

	pthread_mutex_lock(&c->mu);
	int64_t deadline = now_ms() + c->timeout_ms;
	int rc = ensure_hello(c, deadline, err, errlen);
	if (rc < 0)
		goto out;
	/* The resolved target, as kilnd will sign it: a CPU target's arch
	 * and features default to the daemon's own. */
	kiln_target_t rt;
	if (t == NULL) {
		rt = c->info.target;
	} else {
		rt = *t;
		rt.backend[sizeof(rt.backend) - 1] = '\0';
		rt.arch[sizeof(rt.arch) - 1] = '\0';
		rt.features[sizeof(rt.features) - 1] = '\0';
		if (strcmp(rt.backend, "cpu") == 0 &&
		    strcmp(c->info.target.backend, "cpu") == 0) {
			if (rt.arch[0] == '\0')
				memcpy(rt.arch, c->info.target.arch,
				       sizeof(rt.arch));
			if (rt.features[0] == '\0')
				memcpy(rt.features, c->info.target.features,
				       sizeof(rt.features));
		}
	}
	uint8_t sig[KILN_SIG_BYTES];
	rc = kiln_signature(g, &rt, &ro, c->fingerprint, false, sig);
	if (rc < 0) {
		kiln__errf(err, errlen, rc, "cannot sign the graph");
		goto out;
	}
	if (cache_get(c, sig, dynamic == 0, out))
		goto out;
	char hex[KILN_SIG_HEX];
	kiln_sig_to_hex(sig, hex);
	rc = do_lookup(c, hex, deadline, out, err, errlen);
	if (rc == 0) {
		cache_store(c, sig, NULL, out);
		goto out;
	}
	if (rc != KILN_ENOTFOUND)
		goto out;
	rc = do_compile(c, g, &rt, &ro, dynamic, priority, deadline, out, err,
			errlen);
	if (rc == 0) {
		/* A generalized artifact has the generalized graph's
		 * signature: keep it under both. */
		uint8_t rsig[KILN_SIG_BYTES];
		bool have_rsig =
		    kiln_sig_from_hex(out->signature, strlen(out->signature),
				      rsig) == 0;
		cache_store(c, sig, have_rsig ? rsig : NULL, out);
	}
out:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int kiln_client_compile_file(kiln_client_t *c, const char *path,
			     const kiln_target_t *t,
			     const kiln_compile_opts_t *o, int dynamic,
			     const char *priority, kiln_result_t *out,
			     char *err, size_t errlen)
{
	if (out != NULL)
		result_init(out);
	if (c == NULL || path == NULL || out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return kiln__errf(err, errlen, -errno, "%s: %s", path,
				  strerror(errno));
	size_t cap = 1 << 16, n = 0;
	uint8_t *buf = NULL;
	int rc = 0;
	for (;;) {
		uint8_t *nb = realloc(buf, cap);
		if (nb == NULL) {
			rc = -ENOMEM;
			break;
		}
		buf = nb;
		n += fread(buf + n, 1, cap - n, f);
		if (n < cap)
			break;
		cap *= 2;
	}
	if (rc == 0 && ferror(f))
		rc = -EIO;
	fclose(f);
	if (rc < 0) {
		free(buf);
		return kiln__errf(err, errlen, rc, "%s: %s", path,
				  kiln_strerror(rc));
	}
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	kiln_graph_t *g = NULL;
	char e2[512] = "";
	rc = kiln_graph_decode(buf, n, &lim, &g, e2, sizeof(e2));
	free(buf);
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "%s: %s", path, e2);
	rc = kiln_client_compile(c, g, t, o, dynamic, priority, out, err,
				 errlen);
	kiln_graph_free(g);
	return rc;
}

int kiln_client_compile_bytes(kiln_client_t *c, const uint8_t *p, size_t n,
			      const char *mode, int dynamic,
			      const char *priority, kiln_result_t *out,
			      char *err, size_t errlen)
{
	if (out != NULL)
		result_init(out);
	if (c == NULL || p == NULL || out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	kiln_compile_opts_t o;
	memset(&o, 0, sizeof(o));
	if (mode != NULL) {
		if (strlen(mode) >= sizeof(o.mode))
			return kiln__errf(err, errlen, KILN_EBADREQ,
					  "mode: \"%.40s\" is too long", mode);
		memcpy(o.mode, mode, strlen(mode) + 1);
	}
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	kiln_graph_t *g = NULL;
	char e2[512] = "";
	int rc = kiln_graph_decode(p, n, &lim, &g, e2, sizeof(e2));
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "graph: %s", e2);
	rc = kiln_client_compile(c, g, NULL, &o, dynamic, priority, out, err,
				 errlen);
	kiln_graph_free(g);
	return rc;
}

int kiln_client_lookup(kiln_client_t *c, const char *sig_hex,
		       kiln_result_t *out, char *err, size_t errlen)
{
	if (out != NULL)
		result_init(out);
	if (c == NULL || sig_hex == NULL || out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	uint8_t sig[KILN_SIG_BYTES];
	if (kiln_sig_from_hex(sig_hex, strlen(sig_hex), sig) < 0)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "signature: want 64 hex characters");
	char hex[KILN_SIG_HEX];
	kiln_sig_to_hex(sig, hex);
	pthread_mutex_lock(&c->mu);
	int rc = 0;
	if (!cache_get(c, sig, false, out)) {
		rc = do_lookup(c, hex, now_ms() + c->timeout_ms, out, err,
			       errlen);
		if (rc == 0)
			cache_store(c, sig, NULL, out);
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* ---- any op ----------------------------------------------------------------
 */

/* The entry count and header size of the map at p[0..n). */
static bool map_header(const uint8_t *p, size_t n, uint32_t *count, size_t *hdr)
{
	if (n >= 1 && (p[0] & 0xf0) == 0x80) {
		*count = p[0] & 0x0f;
		*hdr = 1;
	} else if (n >= 3 && p[0] == 0xde) {
		*count = (uint32_t)p[1] << 8 | p[2];
		*hdr = 3;
	} else if (n >= 5 && p[0] == 0xdf) {
		*count = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 8 | p[4];
		*hdr = 5;
	} else {
		return false;
	}
	return true;
}

int kiln_client_call(kiln_client_t *c, kiln_op_t op, const void *fields,
		     size_t fields_len, uint8_t **reply, size_t *reply_len,
		     char *err, size_t errlen)
{
	if (reply != NULL)
		*reply = NULL;
	if (reply_len != NULL)
		*reply_len = 0;
	if (c == NULL || reply == NULL || reply_len == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	if ((int)op < 0 || op >= KILN_OP__COUNT)
		return kiln__errf(err, errlen, -EINVAL, "unknown op %d",
				  (int)op);
	uint32_t nf = 0;
	size_t hdr = 0;
	const uint8_t *p = fields;
	if (fields == NULL)
		fields_len = 0;
	if (fields_len > 0) {
		kiln_limits_t lim;
		kiln_limits_default(&lim);
		size_t end = 0;
		uint32_t nobj = 0;
		char e2[256] = "";
		int rc = kiln_msgpack_prescan(p, fields_len, &lim, &end, &nobj,
					      e2, sizeof(e2));
		if (rc < 0)
			return kiln__errf(err, errlen, -EINVAL, "fields: %s",
					  e2);
		if (end != fields_len || !map_header(p, fields_len, &nf, &hdr))
			return kiln__errf(err, errlen, -EINVAL,
					  "fields: want exactly one msgpack "
					  "map");
	}
	pthread_mutex_lock(&c->mu);
	msgpack_zone zone;
	msgpack_zone_init(&zone, 2048);
	kiln_response_t res;
	uint8_t *body;
	size_t blen;
	int rc = request(c, op, fields_len > 0 ? p + hdr : NULL,
			 fields_len - hdr, nf, now_ms() + c->timeout_ms, &zone,
			 &res, &body, &blen, err, errlen);
	if (rc == 0) {
		*reply = body;
		*reply_len = blen;
	}
	msgpack_zone_destroy(&zone);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* ---- the handle ------------------------------------------------------------
 */

int kiln_client_connect(const kiln_client_opts_t *o, kiln_client_t **out,
			char *err, size_t errlen)
{
	if (out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	*out = NULL;
	kiln_client_opts_t def;
	if (o == NULL) {
		kiln_client_opts_init(&def);
		o = &def;
	}
	kiln_client_t *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	c->fd = -1;
	c->next_id = 1;
	int rc;
	if (o->socket != NULL && o->socket[0] != '\0')
		rc = (size_t)snprintf(c->path, sizeof(c->path), "%s",
				      o->socket) >= sizeof(c->path)
			 ? -ENAMETOOLONG
			 : 0;
	else
		rc = kiln_default_socket(c->path, sizeof(c->path));
	if (rc < 0) {
		free(c);
		return kiln__errf(err, errlen, rc,
				  "socket path longer than %zu bytes",
				  sizeof(c->path) - 1);
	}
	c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
	c->connect_timeout_ms = o->connect_timeout_ms > 0
				    ? o->connect_timeout_ms
				    : DEFAULT_CONNECT_TIMEOUT_MS;
	if (o->autostart < 0) {
		const char *e = getenv("KILN_AUTOSTART");
		c->autostart = e == NULL || strcmp(e, "0") != 0;
	} else {
		c->autostart = o->autostart != 0;
	}
	if (is_system_socket(c->path))
		c->autostart = false;
	c->idle_s =
	    o->autostart_idle_s > 0 ? o->autostart_idle_s : DEFAULT_IDLE_S;
	c->cache_cap =
	    o->cache_bytes > 0 ? o->cache_bytes : DEFAULT_CACHE_BYTES;
	c->cache_on = !o->cache_disable;
	kiln_limits_t dl;
	kiln_limits_default(&dl);
	c->max_frame = dl.max_frame_bytes;
	c->rbuf = malloc(READ_CHUNK);
	if (o->kilnd_path != NULL)
		c->kilnd_path = strdup(o->kilnd_path);
	if (c->rbuf == NULL ||
	    (o->kilnd_path != NULL && c->kilnd_path == NULL)) {
		free(c->rbuf);
		free(c->kilnd_path);
		free(c);
		return kiln__errf(err, errlen, -ENOMEM, "out of memory");
	}
	pthread_mutex_init(&c->mu, NULL);
	rc = connect_to(c, now_ms() + c->connect_timeout_ms, err, errlen);
	if (rc < 0) {
		kiln_client_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void kiln_client_free(kiln_client_t *c)
{
	if (c == NULL)
		return;
	drop(c);
	while (c->head != NULL)
		entry_free(c, c->head);
	free(c->fingerprint);
	free(c->kilnd_path);
	free(c->rbuf);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

const char *kiln_client_socket(const kiln_client_t *c)
{
	return c != NULL ? c->path : NULL;
}

/* ---- compile and load ------------------------------------------------------
 */

int kiln_compile_and_load(kiln_client_t *c, const kiln_graph_t *g,
			  const kiln_target_t *t, const kiln_compile_opts_t *o,
			  kiln_module_t **out, char *err, size_t errlen)
{
	if (out == NULL)
		return kiln__errf(err, errlen, -EINVAL, "NULL argument");
	*out = NULL;
	kiln_result_t r;
	int rc = kiln_client_compile(c, g, t, o, -1, NULL, &r, err, errlen);
	if (rc < 0)
		return rc;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	if (r.artifact_len > lim.max_frame_bytes)
		lim.max_frame_bytes = r.artifact_len;
	rc = kiln_module_load(r.artifact, r.artifact_len, &lim, out, err,
			      errlen);
	kiln_result_free(&r);
	return rc;
}
