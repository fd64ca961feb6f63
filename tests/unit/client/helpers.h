/*
 * helpers.h — shared helpers for the libkiln client tests (suite 'client'):
 * a temporary directory per test, real kilnd processes on sockets in it
 * (each with its own store and an empty config, so /etc/kiln is never
 * read), counting the kilnd processes that serve a socket, and loading the
 * corpus graphs.
 *
 * kilnd is KILND_PATH (the build's daemon/kilnd, passed with -D). Each
 * daemon started here gets PR_SET_PDEATHSIG(SIGKILL), so a test that
 * crashes leaves no daemon behind; tk_teardown() (the .fini of every test)
 * stops the ones still running and removes the directory.
 *
 * The cr_assert wrappers may only be used on the test's main thread and
 * never in a forked child (children report through their exit status).
 */
#ifndef KILN_TEST_CLIENT_HELPERS_H
#define KILN_TEST_CLIENT_HELPERS_H

#include "clients/libkiln/kiln.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HELPER __attribute__((unused)) static

#define TK_MAX_DAEMONS 4
#define MLP_FWD	       KILN_TEST_DATA_DIR "/graphs/mlp_fwd.graph.msgpack"
#define MLP_BWD	       KILN_TEST_DATA_DIR "/graphs/mlp_bwd.graph.msgpack"
#define MLP_FWD_IO     KILN_TEST_DATA_DIR "/graphs/mlp_fwd.io.msgpack"
/* A compile far slower than 300 ms. */
#define SLOW_GRAPH KILN_TEST_DATA_DIR "/graphs/efficientnet_fwd.graph.msgpack"

/* The test's directory (mkdtemp) and the daemons it started. */
static char tk_dir[128];
static pid_t tk_pids[TK_MAX_DAEMONS];

__attribute__((format(printf, 2, 3))) HELPER void tk_path(char *out,
							  const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(out, 256, fmt, ap);
	va_end(ap);
	cr_assert(n > 0 && n < 256, "path too long");
}

HELPER int64_t tk_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

HELPER void tk_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

HELPER void tk_setup(void)
{
	snprintf(tk_dir, sizeof(tk_dir), "/tmp/kiln-client-XXXXXX");
	cr_assert_not_null(mkdtemp(tk_dir), "mkdtemp: %s", strerror(errno));
	char p[256];
	tk_path(p, "%s/empty.conf", tk_dir);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("[kilnd]\n", f);
	fclose(f);
	memset(tk_pids, 0, sizeof(tk_pids));
}

static int tk_rm_one(const char *p, const struct stat *st, int flag,
		     struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(p);
	return 0;
}

/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the wait status,
 * or -1 when it had to be killed. */
HELPER int tk_stop_pid(pid_t pid, int timeout_ms)
{
	kill(pid, SIGTERM);
	int64_t end = tk_now_ms() + timeout_ms;
	int st = 0;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		if (r < 0)
			return -1;
		if (tk_now_ms() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		tk_sleep_ms(20);
	}
}

HELPER void tk_teardown(void)
{
	for (int i = 0; i < TK_MAX_DAEMONS; i++)
		if (tk_pids[i] > 0)
			tk_stop_pid(tk_pids[i], 30000);
	if (tk_dir[0] != '\0')
		nftw(tk_dir, tk_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A plain connect() to a Unix socket: true when something accepts. */
HELPER bool tk_can_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	size_t n = strlen(path);
	if (n >= sizeof(sa.sun_path)) {
		close(fd);
		return false;
	}
	memcpy(sa.sun_path, path, n);
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* The daemon's log (for failure messages): its last 1500 bytes. */
HELPER void tk_log_tail(const char *log, char *out, size_t n)
{
	out[0] = '\0';
	FILE *f = fopen(log, "r");
	if (f == NULL)
		return;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	long from = sz > (long)n - 1 ? sz - (long)n + 1 : 0;
	fseek(f, from, SEEK_SET);
	size_t k = fread(out, 1, n - 1, f);
	out[k] = '\0';
	fclose(f);
}

/*
 * Starts kilnd on sock with its store at store (both in the test's
 * directory unless absolute), the empty config, --log-level info,
 * --workers 1, --drain-timeout-s 2 and extra settings (NULL-terminated
 * "--name=value" strings), and waits until it accepts connections. Returns
 * its slot in tk_pids.
 */
HELPER int tk_start_kilnd(const char *sock, const char *store, ...)
{
	int slot = 0;
	while (slot < TK_MAX_DAEMONS && tk_pids[slot] > 0)
		slot++;
	cr_assert(slot < TK_MAX_DAEMONS, "too many daemons");
	char conf[256], log[256], sockopt[300], storeopt[300];
	tk_path(conf, "%s/empty.conf", tk_dir);
	tk_path(log, "%s/kilnd.%d.log", tk_dir, slot);
	snprintf(sockopt, sizeof(sockopt), "--socket=%s", sock);
	snprintf(storeopt, sizeof(storeopt), "--store-dir=%s", store);
	const char *argv[32] = {KILND_PATH,    "--config",
				conf,	       sockopt,
				storeopt,      "--log-level=info",
				"--workers=1", "--drain-timeout-s=2"};
	int argc = 8;
	va_list ap;
	va_start(ap, store);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && argc < 31)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	/* The environment without KILN_* (settings) and systemd's. */
	extern char **environ;
	const char *envp[256];
	int ne = 0;
	for (char **e = environ; *e != NULL && ne < 255; e++)
		if (strncmp(*e, "KILN_", 5) != 0 &&
		    strncmp(*e, "LISTEN_", 7) != 0 &&
		    strncmp(*e, "NOTIFY_SOCKET=", 14) != 0)
			envp[ne++] = *e;
	envp[ne] = NULL;
	pid_t parent = getpid();
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		int nul = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (nul >= 0)
			dup2(nul, 0);
		execve(KILND_PATH, (char *const *)argv, (char *const *)envp);
		_exit(127);
	}
	tk_pids[slot] = pid;
	int64_t end = tk_now_ms() + 60000;
	for (;;) {
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			tk_pids[slot] = 0;
			char tail[1500];
			tk_log_tail(log, tail, sizeof(tail));
			cr_assert_fail("kilnd exited at start (status %d):\n%s",
				       st, tail);
		}
		if (tk_can_connect(sock))
			return slot;
		cr_assert(tk_now_ms() < end, "kilnd did not start on %s", sock);
		tk_sleep_ms(20);
	}
}

/* Stops daemon `slot` with SIGTERM; asserts it exits 0. */
HELPER void tk_stop_kilnd(int slot)
{
	cr_assert(tk_pids[slot] > 0);
	int st = tk_stop_pid(tk_pids[slot], 30000);
	tk_pids[slot] = 0;
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "kilnd did not exit 0 on SIGTERM (status %d)", st);
}

/* Options for a test handle: the socket, auto-start off, the cache as
 * asked. */
HELPER kiln_client_opts_t tk_opts(const char *sock, bool cache)
{
	kiln_client_opts_t o;
	kiln_client_opts_init(&o);
	o.socket = sock;
	o.autostart = 0;
	o.cache_disable = !cache;
	return o;
}

/* Connects; asserts success. */
HELPER kiln_client_t *tk_connect(const kiln_client_opts_t *o)
{
	kiln_client_t *c = NULL;
	char err[512] = "";
	int rc = kiln_client_connect(o, &c, err, sizeof(err));
	cr_assert_eq(rc, 0, "connect: %s (%s)", kiln_strerror(rc), err);
	cr_assert_not_null(c);
	return c;
}

/* Reads and decodes a corpus graph; asserts success. */
HELPER kiln_graph_t *tk_graph(const char *path)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc((size_t)n);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	kiln_graph_t *g = NULL;
	char err[512] = "";
	int rc = kiln_graph_decode(buf, (size_t)n, &lim, &g, err, sizeof(err));
	free(buf);
	cr_assert_eq(rc, 0, "%s: %s", path, err);
	return g;
}

/* The pids of the live kilnd processes whose command line names sock. */
HELPER int tk_count_kilnd(const char *sock, pid_t *pids, int max)
{
	DIR *d = opendir("/proc");
	cr_assert_not_null(d);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end != '\0' || pid <= 0)
			continue;
		char p[64], buf[4096];
		snprintf(p, sizeof(p), "/proc/%ld/cmdline", pid);
		int fd = open(p, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t k = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (k <= 0)
			continue; /* a zombie, or gone */
		buf[k] = '\0';
		/* argv[0] must be a kilnd; some argument the socket. */
		const char *base = strrchr(buf, '/');
		base = base != NULL ? base + 1 : buf;
		if (strcmp(base, "kilnd") != 0)
			continue;
		bool names = false;
		for (ssize_t i = 0; i < k; i += (ssize_t)strlen(buf + i) + 1)
			if (strcmp(buf + i, sock) == 0 ||
			    (strncmp(buf + i, "--socket=", 9) == 0 &&
			     strcmp(buf + i + 9, sock) == 0))
				names = true;
		if (!names)
			continue;
		if (n < max)
			pids[n] = (pid_t)pid;
		n++;
	}
	closedir(d);
	return n;
}

#endif /* KILN_TEST_CLIENT_HELPERS_H */
