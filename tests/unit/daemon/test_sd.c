/*
 * test_sd.c — kilnd's systemd integration (daemon/sd.c): notify datagrams
 * received exactly on a fake NOTIFY_SOCKET (a path and an abstract '@'
 * name), the no-op and error cases, the WATCHDOG_USEC/WATCHDOG_PID rules,
 * socket activation (fds moved to 3.. in a forked child so the runner's own
 * fds are never touched: names, kinds, close-on-exec, the variables unset
 * afterwards, another process's LISTEN_PID, malformed variables), peer
 * credentials over a socketpair, and group membership checks.
 */
#include "daemon/sd.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/kiln-test-sd-XXXXXX";
static char sockpath[PATH_MAX];

static void setup_tmp(void)
{
	cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown_tmp(void)
{
	if (sockpath[0])
		unlink(sockpath);
	rmdir(tmpdir);
}

/* Binds a SOCK_DGRAM Unix socket at path (abstract when it starts with '@')
 * and returns it, with a receive timeout so a missing datagram fails the
 * test instead of hanging it. */
static int dgram_listener(const char *path)
{
	struct sockaddr_un sa;
	struct timeval tv = {.tv_sec = 5};
	size_t len = strlen(path);
	socklen_t salen;
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	cr_assert_lt(len, sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, len);
	salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	else
		salen++;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, salen), 0, "bind %s: %s",
		     path, strerror(errno));
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)),
		     0);
	return fd;
}

/* Receives one datagram and checks it is exactly `want`. */
static void expect_dgram(int fd, const char *want)
{
	static char buf[8192];
	ssize_t n = recv(fd, buf, sizeof(buf), 0);

	cr_assert_geq(n, 0, "recv: %s", strerror(errno));
	cr_assert_eq((size_t)n, strlen(want), "got %zd bytes, want %zu", n,
		     strlen(want));
	cr_assert_eq(memcmp(buf, want, (size_t)n), 0, "got \"%.*s\"", (int)n,
		     buf);
}

/* Nothing further is waiting on fd. */
static void expect_no_dgram(int fd)
{
	char c;

	cr_assert_eq(recv(fd, &c, 1, MSG_DONTWAIT), -1);
	cr_assert(errno == EAGAIN || errno == EWOULDBLOCK);
}

/* ------------------------------------------------------------------------ */
/* Notify                                                                    */
/* ------------------------------------------------------------------------ */

TestSuite(notify, .init = setup_tmp, .fini = teardown_tmp);

Test(notify, path_socket_receives_states_exactly)
{
	char big[3000];
	int fd;

	snprintf(sockpath, sizeof(sockpath), "%s/notify", tmpdir);
	fd = dgram_listener(sockpath);
	cr_assert_eq(setenv("NOTIFY_SOCKET", sockpath, 1), 0);

	cr_assert_eq(kilnd_sd_notify("READY=1\nSTATUS=serving"), 0);
	expect_dgram(fd, "READY=1\nSTATUS=serving");
	cr_assert_eq(
	    kilnd_sd_notifyf("STATUS=%u connections, %s", 3u, "queue 0"), 0);
	expect_dgram(fd, "STATUS=3 connections, queue 0");
	cr_assert_eq(kilnd_sd_notify("WATCHDOG=1"), 0);
	expect_dgram(fd, "WATCHDOG=1");
	cr_assert_eq(kilnd_sd_notify("STOPPING=1"), 0);
	expect_dgram(fd, "STOPPING=1");

	/* Longer than notifyf's stack buffer: goes out whole, one datagram. */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	cr_assert_eq(kilnd_sd_notifyf("STATUS=%s", big), 0);
	{
		static char want[sizeof(big) + 8];

		snprintf(want, sizeof(want), "STATUS=%s", big);
		expect_dgram(fd, want);
	}
	expect_no_dgram(fd);
	/* The variable stays for later calls. */
	cr_assert_str_eq(getenv("NOTIFY_SOCKET"), sockpath);
	close(fd);
}

Test(notify, abstract_socket)
{
	char name[64];
	int fd;

	snprintf(name, sizeof(name), "@kiln-test-sd-%ld-%ld", (long)getpid(),
		 (long)random());
	fd = dgram_listener(name);
	cr_assert_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1\nSTATUS=serving"), 0);
	expect_dgram(fd, "READY=1\nSTATUS=serving");
	cr_assert_eq(kilnd_sd_notify("STOPPING=1"), 0);
	expect_dgram(fd, "STOPPING=1");
	expect_no_dgram(fd);
	close(fd);
}

Test(notify, unset_or_empty_is_a_noop)
{
	cr_assert_eq(unsetenv("NOTIFY_SOCKET"), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), 0);
	cr_assert_eq(kilnd_sd_notifyf("STATUS=%d", 1), 0);
	cr_assert_eq(setenv("NOTIFY_SOCKET", "", 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), 0);
}

Test(notify, errors)
{
	char longpath[200];

	cr_assert_eq(kilnd_sd_notify(NULL), -EINVAL);
	cr_assert_eq(setenv("NOTIFY_SOCKET", "relative/path", 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), -EAFNOSUPPORT);
	cr_assert_eq(setenv("NOTIFY_SOCKET", "vsock:2:1234", 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), -EAFNOSUPPORT);

	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	cr_assert_eq(setenv("NOTIFY_SOCKET", longpath, 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), -ENAMETOOLONG);
	longpath[0] = '@';
	cr_assert_eq(setenv("NOTIFY_SOCKET", longpath, 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), -ENAMETOOLONG);

	/* Nobody listening: the error comes back, nothing crashes. */
	snprintf(sockpath, sizeof(sockpath), "%s/absent", tmpdir);
	cr_assert_eq(setenv("NOTIFY_SOCKET", sockpath, 1), 0);
	cr_assert_eq(kilnd_sd_notify("READY=1"), -ENOENT);
	sockpath[0] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Watchdog                                                                  */
/* ------------------------------------------------------------------------ */

Test(watchdog, usec_and_pid_rules)
{
	char pid[32];

	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0);

	cr_assert_eq(setenv("WATCHDOG_USEC", "30000000", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 30000000u, "no WATCHDOG_PID");

	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	cr_assert_eq(setenv("WATCHDOG_PID", pid, 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 30000000u, "our pid");

	snprintf(pid, sizeof(pid), "%ld", (long)getpid() + 1);
	cr_assert_eq(setenv("WATCHDOG_PID", pid, 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0, "another pid");
	cr_assert_eq(setenv("WATCHDOG_PID", "garbage", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0, "malformed pid");

	unsetenv("WATCHDOG_PID");
	cr_assert_eq(setenv("WATCHDOG_USEC", "0", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0);
	cr_assert_eq(setenv("WATCHDOG_USEC", "12x", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0);
	cr_assert_eq(setenv("WATCHDOG_USEC", "-5", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0);
	cr_assert_eq(setenv("WATCHDOG_USEC", "", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0);
	cr_assert_eq(setenv("WATCHDOG_USEC", "99999999999999999999999", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 0, "overflow");

	/* Read-only: the variables are still there. */
	cr_assert_eq(setenv("WATCHDOG_USEC", "1000", 1), 0);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 1000u);
	cr_assert_eq(kilnd_sd_watchdog_usec(), 1000u);
	cr_assert_str_eq(getenv("WATCHDOG_USEC"), "1000");
}

/* ------------------------------------------------------------------------ */
/* Socket activation (in forked children)                                    */
/* ------------------------------------------------------------------------ */

/* Child-side check: Criterion's asserts belong to the test process, so a
 * child reports a failure on stderr and exits 1. */
#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "child: line %d: %s (errno %s)\n",     \
				__LINE__, #cond, strerror(errno));             \
			_exit(1);                                              \
		}                                                              \
	} while (0)

#define NACT 5 /* fds handed to the child: see activated_child() */

static void setenv_pid(pid_t pid)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%ld", (long)pid);
	CHECK(setenv("LISTEN_PID", buf, 1) == 0);
}

static bool env_clean(void)
{
	return !getenv("LISTEN_PID") && !getenv("LISTEN_FDS") &&
	       !getenv("LISTEN_FDNAMES");
}

/* Moves src[0..n) to fds 3..3+n, without close-on-exec, and closes every
 * other fd from 3 up to 3+n+16 (whatever the runner had there). */
static void place_fds(int *src, int n)
{
	int high[16];
	int i;

	CHECK(n <= 16);
	for (i = 0; i < n; i++) {
		high[i] = fcntl(src[i], F_DUPFD, 200);
		CHECK(high[i] >= 200);
		close(src[i]);
	}
	for (i = 3; i < 3 + n + 16; i++)
		close(i);
	for (i = 0; i < n; i++) {
		CHECK(dup2(high[i], 3 + i) == 3 + i);
		close(high[i]);
		CHECK((fcntl(3 + i, F_GETFD) & FD_CLOEXEC) == 0);
	}
}

/* The body of the activation test, in a child: a listening Unix socket, a
 * listening TCP socket, one end of a socketpair, a pipe and a UDP socket at
 * 3..7. Exits 0 when everything held. */
static void activated_child(const char *dir)
{
	struct sockaddr_un su = {.sun_family = AF_UNIX};
	struct sockaddr_in si = {.sin_family = AF_INET};
	kilnd_sd_fd_t *fds;
	int src[NACT], sp[2], pp[2];
	size_t n, i;

	src[0] = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(src[0] >= 0);
	snprintf(su.sun_path, sizeof(su.sun_path), "%s/listen.sock", dir);
	CHECK(bind(src[0], (struct sockaddr *)&su, sizeof(su)) == 0);
	CHECK(listen(src[0], 4) == 0);

	src[1] = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(src[1] >= 0);
	si.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECK(bind(src[1], (struct sockaddr *)&si, sizeof(si)) == 0);
	CHECK(listen(src[1], 4) == 0);

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
	src[2] = sp[0];
	close(sp[1]);
	CHECK(pipe(pp) == 0);
	src[3] = pp[0];
	close(pp[1]);
	src[4] = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(src[4] >= 0);
	place_fds(src, NACT);

	/* Malformed variables: an error, the fds untouched, env unset. */
	setenv_pid(getpid());
	CHECK(setenv("LISTEN_FDS", "5x", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == -EINVAL);
	CHECK(fds == NULL && n == 0 && env_clean());

	setenv_pid(getpid());
	CHECK(setenv("LISTEN_FDS", "5", 1) == 0);
	CHECK(setenv("LISTEN_FDNAMES", "a:b:c", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == -EINVAL);
	CHECK(fds == NULL && n == 0 && env_clean());

	/* One fd more than is open: -EBADF, and no fd was changed. */
	setenv_pid(getpid());
	CHECK(setenv("LISTEN_FDS", "6", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == -EBADF);
	CHECK(fds == NULL && n == 0 && env_clean());
	CHECK((fcntl(3, F_GETFD) & FD_CLOEXEC) == 0);

	/* Another process's LISTEN_PID: not for us, 0 fds, env unset. */
	setenv_pid(getppid());
	CHECK(setenv("LISTEN_FDS", "5", 1) == 0);
	CHECK(setenv("LISTEN_FDNAMES", "a:b:c:d:e", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == 0);
	CHECK(fds == NULL && n == 0 && env_clean());
	CHECK((fcntl(3, F_GETFD) & FD_CLOEXEC) == 0);

	/* The real thing. */
	setenv_pid(getpid());
	CHECK(setenv("LISTEN_FDS", "5", 1) == 0);
	CHECK(setenv("LISTEN_FDNAMES", "kilnd:tcp::pipe:udp", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == 0);
	CHECK(env_clean());
	CHECK(n == NACT && fds != NULL);
	for (i = 0; i < n; i++) {
		CHECK(fds[i].fd == 3 + (int)i);
		CHECK(fcntl(fds[i].fd, F_GETFD) & FD_CLOEXEC);
	}
	CHECK(strcmp(fds[0].name, "kilnd") == 0);
	CHECK(fds[0].kind == KILND_SD_FD_UNIX_STREAM && fds[0].listening);
	CHECK(fds[0].domain == AF_UNIX && fds[0].type == SOCK_STREAM);
	CHECK(strcmp(fds[1].name, "tcp") == 0);
	CHECK(fds[1].kind == KILND_SD_FD_TCP_STREAM && fds[1].listening);
	CHECK(fds[1].domain == AF_INET && fds[1].type == SOCK_STREAM);
	CHECK(strcmp(fds[2].name, "") == 0);
	CHECK(fds[2].kind == KILND_SD_FD_UNIX_STREAM && !fds[2].listening);
	CHECK(strcmp(fds[3].name, "pipe") == 0);
	CHECK(fds[3].kind == KILND_SD_FD_OTHER && !fds[3].listening);
	CHECK(fds[3].domain == -1 && fds[3].type == -1);
	CHECK(strcmp(fds[4].name, "udp") == 0);
	CHECK(fds[4].kind == KILND_SD_FD_OTHER);
	CHECK(fds[4].domain == AF_INET && fds[4].type == SOCK_DGRAM);
	free(fds);

	/* Without LISTEN_FDNAMES every name is "unknown". */
	setenv_pid(getpid());
	CHECK(setenv("LISTEN_FDS", "2", 1) == 0);
	CHECK(kilnd_sd_listen_fds(&fds, &n) == 0);
	CHECK(n == 2 && env_clean());
	CHECK(strcmp(fds[0].name, "unknown") == 0);
	CHECK(strcmp(fds[1].name, "unknown") == 0);
	free(fds);

	/* Not activated at all. */
	CHECK(kilnd_sd_listen_fds(&fds, &n) == 0);
	CHECK(fds == NULL && n == 0);
	_exit(0);
}

TestSuite(listen_fds, .init = setup_tmp, .fini = teardown_tmp);

Test(listen_fds, activation_in_a_child)
{
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		activated_child(tmpdir);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "child failed (status %d); see its stderr", status);
	snprintf(sockpath, sizeof(sockpath), "%s/listen.sock", tmpdir);
}

Test(listen_fds, not_activated_in_this_process)
{
	kilnd_sd_fd_t *fds = (kilnd_sd_fd_t *)1;
	size_t n = 42;

	/* No variables: nothing, and no fd is looked at. */
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	cr_assert_eq(kilnd_sd_listen_fds(&fds, &n), 0);
	cr_assert_null(fds);
	cr_assert_eq(n, 0);

	/* LISTEN_PID names pid 1: also nothing, and the variables go. */
	cr_assert_eq(setenv("LISTEN_PID", "1", 1), 0);
	cr_assert_eq(setenv("LISTEN_FDS", "3", 1), 0);
	cr_assert_eq(setenv("LISTEN_FDNAMES", "a:b:c", 1), 0);
	cr_assert_eq(kilnd_sd_listen_fds(&fds, &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_null(getenv("LISTEN_PID"));
	cr_assert_null(getenv("LISTEN_FDS"));
	cr_assert_null(getenv("LISTEN_FDNAMES"));

	/* A malformed LISTEN_PID is an error, and also unset. */
	cr_assert_eq(setenv("LISTEN_PID", "abc", 1), 0);
	cr_assert_eq(setenv("LISTEN_FDS", "1", 1), 0);
	cr_assert_eq(kilnd_sd_listen_fds(&fds, &n), -EINVAL);
	cr_assert_null(getenv("LISTEN_PID"));
	cr_assert_null(getenv("LISTEN_FDS"));
}

/* ------------------------------------------------------------------------ */
/* Credentials                                                               */
/* ------------------------------------------------------------------------ */

Test(cred, peer_cred_over_a_socketpair)
{
	pid_t pid = 0;
	uid_t uid = (uid_t)-1;
	gid_t gid = (gid_t)-1;
	int sp[2], pp[2];

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	cr_assert_eq(kilnd_peer_cred(sp[0], &pid, &uid, &gid), 0);
	cr_assert_eq(pid, getpid());
	cr_assert_eq(uid, getuid());
	cr_assert_eq(gid, getgid());
	cr_assert_eq(kilnd_peer_cred(sp[1], NULL, NULL, NULL), 0);
	close(sp[0]);
	close(sp[1]);

	cr_assert_eq(pipe(pp), 0);
	cr_assert_eq(kilnd_peer_cred(pp[0], &pid, &uid, &gid), -ENOTSOCK);
	close(pp[0]);
	close(pp[1]);
	cr_assert_eq(kilnd_peer_cred(-1, NULL, NULL, NULL), -EBADF);
}

Test(cred, uid_in_group)
{
	struct group *gr;

	cr_assert(kilnd_uid_in_group(0, 0, "root"));
	/* Through root's passwd entry, whatever the peer's gid. */
	cr_assert(kilnd_uid_in_group(0, 54321, "root"));
	/* Through the peer's gid alone, even for an unknown uid. */
	cr_assert(kilnd_uid_in_group(54321, 0, "root"));
	cr_assert_not(kilnd_uid_in_group(54321, 54321, "root"));
	cr_assert_not(kilnd_uid_in_group(0, 0, "kiln-no-such-group-x9"));
	cr_assert_not(kilnd_uid_in_group(0, 0, ""));
	cr_assert_not(kilnd_uid_in_group(0, 0, NULL));

	/* A supplementary member (a user listed in /etc/group), when this
	 * machine has one. */
	setgrent();
	while ((gr = getgrent())) {
		struct passwd *pw;

		if (!gr->gr_mem[0])
			continue;
		pw = getpwnam(gr->gr_mem[0]);
		if (!pw || pw->pw_gid == gr->gr_gid)
			continue;
		cr_assert(
		    kilnd_uid_in_group(pw->pw_uid, pw->pw_gid, gr->gr_name),
		    "%s in %s", pw->pw_name, gr->gr_name);
		cr_log_info("supplementary: %s in %s", pw->pw_name,
			    gr->gr_name);
		break;
	}
	endgrent();
}
