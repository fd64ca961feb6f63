/*
 * test_autostart.c — libkiln's auto-start of a per-user kilnd: 16
 * processes connecting at once to a socket nobody serves start exactly one
 * kilnd, which all of them get a hello from and which exits by itself
 * (--exit-idle-s) once they are gone; the failure modes (no executable, a
 * kilnd that never answers).
 *
 * The started kilnd inherits the test's environment: KILN_CONFIG (an empty
 * file) and KILN_STORE_DIR (in the test's directory) keep it off the
 * system's settings and the user's store.
 */
#include "helpers.h"

TestSuite(autostart, .init = tk_setup, .fini = tk_teardown, .timeout = 300);

#define N_PROCS 16
#define IDLE_S	2

static void autostart_env(void)
{
	char p[256];
	tk_path(p, "%s/empty.conf", tk_dir);
	setenv("KILN_CONFIG", p, 1);
	tk_path(p, "%s/store", tk_dir);
	setenv("KILN_STORE_DIR", p, 1);
	unsetenv("KILN_SOCKET");
	unsetenv("KILN_AUTOSTART");
}

static kiln_client_opts_t auto_opts(const char *sock)
{
	kiln_client_opts_t o;
	kiln_client_opts_init(&o);
	o.socket = sock;
	o.autostart = 1;
	o.kilnd_path = KILND_PATH;
	o.autostart_idle_s = IDLE_S;
	o.connect_timeout_ms = 60000;
	o.timeout_ms = 60000;
	return o;
}

/* Waits until no kilnd serves sock; returns how long it took (ms). */
static int64_t wait_gone(const char *sock, int64_t limit_ms)
{
	int64_t t0 = tk_now_ms();
	pid_t pids[4];
	while (tk_count_kilnd(sock, pids, 4) > 0) {
		cr_assert(tk_now_ms() - t0 < limit_ms,
			  "the auto-started kilnd (pid %d) did not exit within "
			  "%lld ms",
			  (int)pids[0], (long long)limit_ms);
		tk_sleep_ms(50);
	}
	return tk_now_ms() - t0;
}

/* A kilnd_path that notes each start in <dir>/starts, then execs kilnd. */
static void counting_wrapper(char *wrapper, char *starts)
{
	tk_path(wrapper, "%s/kilnd-counting", tk_dir);
	tk_path(starts, "%s/starts", tk_dir);
	FILE *f = fopen(wrapper, "w");
	cr_assert_not_null(f);
	fprintf(f, "#!/bin/sh\necho $$ >>'%s'\nexec '%s' \"$@\"\n", starts,
		KILND_PATH);
	fclose(f);
	cr_assert_eq(chmod(wrapper, 0755), 0);
}

/* Asserts the started kilnd has /dev/null on stdin and stdout, the log on
 * stderr, and none of its starter's other files (the lock, sockets). */
static void check_fds(pid_t pid, const char *log)
{
	char d[64], p[400], target[512];
	snprintf(d, sizeof(d), "/proc/%d/fd", (int)pid);
	DIR *dir = opendir(d);
	cr_assert_not_null(dir);
	struct dirent *de;
	while ((de = readdir(dir)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", d, de->d_name);
		ssize_t k = readlink(p, target, sizeof(target) - 1);
		if (k < 0)
			continue;
		target[k] = '\0';
		int fd = atoi(de->d_name);
		if (fd <= 1)
			cr_assert_str_eq(target, "/dev/null", "fd %d", fd);
		else if (fd == 2)
			cr_assert_str_eq(target, log);
		cr_assert_null(strstr(target, "autostart.lock"),
			       "kilnd inherited the lock as fd %d", fd);
	}
	closedir(dir);
}

static int count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	int n = 0, ch;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

Test(autostart, race_of_16_processes)
{
	autostart_env();
	char sock[256], wrapper[256], starts[256];
	tk_path(sock, "%s/user/run/kilnd.sock", tk_dir);
	counting_wrapper(wrapper, starts);
	int go[2], ready[2], release[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(release), 0);
	pid_t kids[N_PROCS];
	for (int i = 0; i < N_PROCS; i++) {
		kids[i] = fork();
		cr_assert(kids[i] >= 0);
		if (kids[i] > 0)
			continue;
		/* The child: wait for the start signal, connect, hello,
		 * report, stay connected until released. */
		close(go[1]);
		close(ready[0]);
		close(release[1]);
		char b;
		if (read(go[0], &b, 1) < 0)
			_exit(10);
		kiln_client_opts_t o = auto_opts(sock);
		o.kilnd_path = wrapper;
		kiln_client_t *c = NULL;
		char err[512] = "";
		int rc = kiln_client_connect(&o, &c, err, sizeof(err));
		if (rc != 0) {
			fprintf(stderr, "child %d: connect: %s\n", i, err);
			_exit(11);
		}
		kiln_server_info_t in;
		rc = kiln_client_hello(c, &in, err, sizeof(err));
		if (rc != 0 || strcmp(in.server, "kilnd") != 0) {
			fprintf(stderr, "child %d: hello: %s\n", i, err);
			_exit(12);
		}
		char ok = 'k';
		if (write(ready[1], &ok, 1) != 1)
			_exit(13);
		if (read(release[0], &b, 1) < 0)
			_exit(14);
		kiln_client_free(c);
		_exit(0);
	}
	close(go[0]);
	close(ready[1]);
	close(release[0]);
	/* All at once. */
	close(go[1]);
	int got = 0;
	char b;
	while (got < N_PROCS && read(ready[0], &b, 1) == 1)
		got++;
	close(ready[0]);

	/* Every child has its hello and is still connected: one kilnd. */
	pid_t pids[8];
	int n = tk_count_kilnd(sock, pids, 8);
	close(release[1]);
	int failed = 0;
	for (int i = 0; i < N_PROCS; i++) {
		int st;
		waitpid(kids[i], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed++;
	}
	cr_assert_eq(got, N_PROCS, "%d of %d children got a hello", got,
		     N_PROCS);
	cr_assert_eq(failed, 0);
	cr_assert_eq(n, 1, "%d kilnd processes serve %s", n, sock);
	int started = count_lines(starts);
	cr_assert_eq(started, 1, "kilnd was started %d times", started);
	char log[256];
	tk_path(log, "%s/user/run/kilnd.log", tk_dir);
	check_fds(pids[0], log);

	/* Nothing else was started (a second kilnd would have failed,
	 * saying another one listens there, in the shared log). */
	char text[4096];
	tk_log_tail(log, text, sizeof(text));
	cr_assert_null(strstr(text, "another kilnd"), "kilnd.log:\n%s", text);
	cr_assert_null(strstr(text, "level=error"), "kilnd.log:\n%s", text);
	struct stat st;
	char dir[256];
	tk_path(dir, "%s/user/run", tk_dir);
	cr_assert_eq(stat(dir, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0700, "mode %o", st.st_mode & 0777);

	/* All gone: it exits after IDLE_S seconds on its own. */
	int64_t took = wait_gone(sock, 30000);
	cr_assert_gt(took, 500,
		     "it exited after %lld ms, before the idle "
		     "time",
		     (long long)took);
	cr_assert(!tk_can_connect(sock));
}

/* One process, the basic path; then the same handle after the kilnd went
 * away on its own: a call starts another one. */
Test(autostart, restarts_after_idle_exit)
{
	autostart_env();
	char sock[256], err[512] = "";
	tk_path(sock, "%s/u/kilnd.sock", tk_dir);
	kiln_client_opts_t o = auto_opts(sock);
	kiln_client_t *c = NULL;
	int rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	kiln_result_t r;
	rc = kiln_client_compile_file(c, MLP_FWD, NULL, NULL, -1, NULL, &r, err,
				      sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "compiled");
	kiln_result_free(&r);
	pid_t pids[4];
	cr_assert_eq(tk_count_kilnd(sock, pids, 4), 1);
	pid_t first = pids[0];
	/* Idle while connected: it stays. */
	tk_sleep_ms((IDLE_S + 1) * 1000);
	cr_assert_eq(tk_count_kilnd(sock, pids, 4), 1);
	cr_assert_eq(pids[0], first);
	/* The handle's connection goes (the test closes it the way kilnd's
	 * idle timeout would: by stopping that kilnd). */
	kill(first, SIGTERM);
	wait_gone(sock, 30000);
	kiln_server_info_t in;
	rc = kiln_client_hello(c, &in, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(tk_count_kilnd(sock, pids, 4), 1);
	cr_assert_neq(pids[0], first);
	/* The store is the same: a disk hit. */
	kiln_client_opts_t o2 = o;
	o2.cache_disable = true;
	kiln_client_t *c2 = NULL;
	rc = kiln_client_connect(&o2, &c2, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	rc = kiln_client_compile_file(c2, MLP_FWD, NULL, NULL, -1, NULL, &r,
				      err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_str_eq(r.source, "disk");
	kiln_result_free(&r);
	kiln_client_free(c2);
	kiln_client_free(c);
	wait_gone(sock, 30000);
}

Test(autostart, failures)
{
	autostart_env();
	char sock[256], err[512] = "";
	kiln_client_t *c = NULL;

	/* No such executable: said at once. */
	tk_path(sock, "%s/a/kilnd.sock", tk_dir);
	kiln_client_opts_t o = auto_opts(sock);
	o.kilnd_path = "/nonexistent/kilnd";
	int rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "/nonexistent/kilnd"), "err: %s", err);
	cr_assert_null(c);

	/* Not in $PATH either. */
	o.kilnd_path = "kiln-no-such-daemon";
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "PATH"), "err: %s", err);

	/* $KILND names the executable when the option does not. */
	o.kilnd_path = NULL;
	setenv("KILND", "/nonexistent/kilnd-from-env", 1);
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT, "%d: %s", rc, err);
	cr_assert_not_null(strstr(err, "kilnd-from-env"), "err: %s", err);
	unsetenv("KILND");

	/* Something that starts but never serves: KILN_ETIMEOUT after
	 * connect_timeout_ms, pointing at the log. */
	o.kilnd_path = "/bin/true";
	o.connect_timeout_ms = 500;
	int64_t t0 = tk_now_ms();
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_eq(rc, KILN_ETIMEOUT, "%d: %s", rc, err);
	cr_assert_geq(tk_now_ms() - t0, 450);
	cr_assert_not_null(strstr(err, "kilnd.log"), "err: %s", err);

	/* A socket directory that cannot be created. */
	o = auto_opts("/proc/kiln-test/kilnd.sock");
	rc = kiln_client_connect(&o, &c, err, sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert_not_null(strstr(err, "mkdir"), "err: %s", err);
}
