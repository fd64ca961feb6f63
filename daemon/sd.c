/*
 * sd.c — systemd's notify and socket-activation protocols without
 * libsystemd, and the peer-credential helpers (see sd.h for the contract and
 * why kilnd does not link libsystemd).
 *
 * Invariants: nothing here keeps state between calls; the only shared state
 * touched is the environment (read everywhere, written only by
 * kilnd_sd_listen_fds on the main thread at start-up). No stdio: notify may
 * run on any thread and in paths where stderr is unwanted.
 */
#include "daemon/sd.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* Parses a whole decimal string with no sign, spaces or trailing bytes.
 * Returns 0 or -EINVAL / -ERANGE. */
static int parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return -EINVAL;
	for (; *s; s++) {
		unsigned d;

		if (*s < '0' || *s > '9')
			return -EINVAL;
		d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* Parses a pid (> 0). Returns 0 or -EINVAL / -ERANGE. */
static int parse_pid(const char *s, pid_t *out)
{
	uint64_t v;
	int rc = parse_u64(s, &v);

	if (rc < 0)
		return rc;
	if (v == 0 || v > (uint64_t)INT_MAX)
		return -ERANGE;
	*out = (pid_t)v;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Notify                                                                    */
/* ------------------------------------------------------------------------ */

int kilnd_sd_notify(const char *state)
{
	struct sockaddr_un sa;
	socklen_t salen;
	const char *path;
	size_t plen, slen;
	ssize_t sent;
	int fd, rc = 0;

	if (!state)
		return -EINVAL;
	path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return 0;
	if (path[0] != '/' && path[0] != '@')
		return -EAFNOSUPPORT;
	plen = strlen(path);
	if (plen > sizeof(sa.sun_path) ||
	    (path[0] == '/' && plen == sizeof(sa.sun_path)))
		return -ENAMETOOLONG;

	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, plen);
	if (path[0] == '@') {
		/* Abstract: a leading NUL, and the length says where the name
		 * ends (no trailing NUL). */
		sa.sun_path[0] = '\0';
		salen =
		    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);
	} else {
		salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
				    plen + 1);
	}

	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	slen = strlen(state);
	do {
		sent = sendto(fd, state, slen, MSG_NOSIGNAL,
			      (const struct sockaddr *)&sa, salen);
	} while (sent < 0 && errno == EINTR);
	if (sent < 0)
		rc = -errno;
	else if ((size_t)sent != slen)
		rc = -EMSGSIZE; /* datagrams go whole; never expected */
	close(fd);
	return rc;
}

int kilnd_sd_notifyf(const char *fmt, ...)
{
	char buf[1024];
	char *p = buf;
	va_list ap;
	int len, rc;

	va_start(ap, fmt);
	len = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (len < 0)
		return -EINVAL;
	if ((size_t)len >= sizeof(buf)) {
		p = malloc((size_t)len + 1);
		if (!p)
			return -ENOMEM;
		va_start(ap, fmt);
		vsnprintf(p, (size_t)len + 1, fmt, ap);
		va_end(ap);
	}
	rc = kilnd_sd_notify(p);
	if (p != buf)
		free(p);
	return rc;
}

uint64_t kilnd_sd_watchdog_usec(void)
{
	const char *e;
	uint64_t usec;
	pid_t pid;

	if (parse_u64(getenv("WATCHDOG_USEC"), &usec) < 0)
		return 0;
	e = getenv("WATCHDOG_PID");
	if (e && *e) {
		if (parse_pid(e, &pid) < 0 || pid != getpid())
			return 0;
	}
	return usec;
}

/* ------------------------------------------------------------------------ */
/* Socket activation                                                         */
/* ------------------------------------------------------------------------ */

static void unset_listen_env(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}

static void classify(kilnd_sd_fd_t *f)
{
	int domain = 0, type = 0, proto = 0, acc = 0;
	socklen_t len;

	f->kind = KILND_SD_FD_OTHER;
	f->domain = -1;
	f->type = -1;
	f->listening = false;
	len = sizeof(type);
	if (getsockopt(f->fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
		return; /* ENOTSOCK: a FIFO, a file, ... */
	len = sizeof(domain);
	if (getsockopt(f->fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
		return;
	f->domain = domain;
	f->type = type;
	len = sizeof(acc);
	if (getsockopt(f->fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == 0)
		f->listening = acc != 0;
	if (type != SOCK_STREAM)
		return;
	if (domain == AF_UNIX) {
		f->kind = KILND_SD_FD_UNIX_STREAM;
	} else if (domain == AF_INET || domain == AF_INET6) {
		len = sizeof(proto);
		if (getsockopt(f->fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) ==
			0 &&
		    proto == IPPROTO_TCP)
			f->kind = KILND_SD_FD_TCP_STREAM;
	}
}

/* Fills f[0..n).name from LISTEN_FDNAMES (or "unknown"). Returns 0 or
 * -EINVAL when the count differs from n or a name is too long. */
static int read_names(kilnd_sd_fd_t *f, size_t n)
{
	const char *e = getenv("LISTEN_FDNAMES");
	size_t i = 0;

	if (!e) {
		for (i = 0; i < n; i++)
			memcpy(f[i].name, "unknown", sizeof("unknown"));
		return 0;
	}
	for (;;) {
		const char *end = strchr(e, ':');
		size_t len = end ? (size_t)(end - e) : strlen(e);

		if (i == n || len > KILND_SD_FDNAME_MAX)
			return -EINVAL;
		memcpy(f[i].name, e, len);
		f[i].name[len] = '\0';
		i++;
		if (!end)
			break;
		e = end + 1;
	}
	return i == n ? 0 : -EINVAL;
}

int kilnd_sd_listen_fds(kilnd_sd_fd_t **fds, size_t *n)
{
	kilnd_sd_fd_t *f = NULL;
	const char *e;
	uint64_t count;
	pid_t pid;
	size_t i;
	int rc;

	*fds = NULL;
	*n = 0;
	e = getenv("LISTEN_PID");
	if (!e) {
		rc = 0;
		goto out;
	}
	rc = parse_pid(e, &pid);
	if (rc < 0) {
		rc = -EINVAL;
		goto out;
	}
	if (pid != getpid()) {
		rc = 0; /* meant for another process */
		goto out;
	}
	e = getenv("LISTEN_FDS");
	if (!e) {
		rc = 0;
		goto out;
	}
	if (parse_u64(e, &count) < 0 ||
	    count > (uint64_t)(INT_MAX - KILND_SD_LISTEN_FDS_START)) {
		rc = -EINVAL;
		goto out;
	}
	if (count == 0) {
		rc = 0;
		goto out;
	}

	f = calloc((size_t)count, sizeof(*f));
	if (!f) {
		rc = -ENOMEM;
		goto out;
	}
	rc = read_names(f, (size_t)count);
	if (rc < 0)
		goto out;
	/* Check every fd before changing any. */
	for (i = 0; i < count; i++) {
		f[i].fd = KILND_SD_LISTEN_FDS_START + (int)i;
		if (fcntl(f[i].fd, F_GETFD) < 0) {
			rc = -errno;
			goto out;
		}
	}
	for (i = 0; i < count; i++) {
		int flags = fcntl(f[i].fd, F_GETFD);

		if (flags < 0 ||
		    fcntl(f[i].fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
			rc = -errno;
			goto out;
		}
		classify(&f[i]);
	}
	*fds = f;
	*n = (size_t)count;
	f = NULL;
	rc = 0;
out:
	free(f);
	unset_listen_env();
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Peer credentials                                                          */
/* ------------------------------------------------------------------------ */

int kilnd_peer_cred(int fd, pid_t *pid, uid_t *uid, gid_t *gid)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	if (len != sizeof(cred))
		return -EIO;
	if (pid)
		*pid = cred.pid;
	if (uid)
		*uid = cred.uid;
	if (gid)
		*gid = cred.gid;
	return 0;
}

/* Lookup buffers grow by doubling on ERANGE up to this. */
#define NSS_BUF_MAX (1u << 20)

static size_t nss_buf_start(int name)
{
	long v = sysconf(name);

	return v > 0 && v <= (long)NSS_BUF_MAX ? (size_t)v : 1024;
}

/* getgrnam_r with a growing buffer. Returns 0 (found), -ENOENT, or -errno. */
static int group_gid(const char *group, gid_t *gid)
{
	size_t cap = nss_buf_start(_SC_GETGR_R_SIZE_MAX);
	struct group gr, *res;
	char *buf;
	int rc;

	for (;;) {
		buf = malloc(cap);
		if (!buf)
			return -ENOMEM;
		res = NULL;
		rc = getgrnam_r(group, &gr, buf, cap, &res);
		if (rc != ERANGE || cap >= NSS_BUF_MAX)
			break;
		free(buf);
		cap *= 2;
	}
	if (rc == 0 && res)
		*gid = gr.gr_gid;
	free(buf);
	if (rc)
		return -rc;
	return res ? 0 : -ENOENT;
}

/* Whether the passwd user uid has gid as its primary or a supplementary
 * group. */
static bool user_has_gid(uid_t uid, gid_t gid)
{
	size_t cap = nss_buf_start(_SC_GETPW_R_SIZE_MAX);
	struct passwd pw, *res;
	gid_t *groups = NULL;
	bool found = false;
	char *buf;
	int rc, ng, i;

	for (;;) {
		buf = malloc(cap);
		if (!buf)
			return false;
		res = NULL;
		rc = getpwuid_r(uid, &pw, buf, cap, &res);
		if (rc != ERANGE || cap >= NSS_BUF_MAX)
			break;
		free(buf);
		cap *= 2;
	}
	if (rc || !res)
		goto out;
	if (pw.pw_gid == gid) {
		found = true;
		goto out;
	}
	ng = 32;
	for (;;) {
		gid_t *g = realloc(groups, (size_t)ng * sizeof(*g));
		int want = ng;

		if (!g)
			goto out;
		groups = g;
		if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &want) >= 0) {
			ng = want;
			break;
		}
		/* -1: too small; want is the size needed (glibc). */
		if (want <= ng || want > 65536)
			goto out;
		ng = want;
	}
	for (i = 0; i < ng; i++) {
		if (groups[i] == gid) {
			found = true;
			break;
		}
	}
out:
	free(groups);
	free(buf);
	return found;
}

bool kilnd_uid_in_group(uid_t uid, gid_t primary_gid, const char *group)
{
	gid_t gid = 0; /* set when group_gid() returns 0 */

	if (!group || !*group)
		return false;
	if (group_gid(group, &gid) < 0)
		return false;
	if (gid == primary_gid)
		return true;
	return user_has_gid(uid, gid);
}
