/*
 * pool.c — kilnd's compile threads, their bounded priority queue, and the
 * worker processes the compiles run in.
 *
 * Two FIFO lists (interactive, batch) under one mutex; a thread takes the
 * head of the interactive list, else of the batch list. Each thread owns
 * one kiln-compile-worker process (worker.c), started on its first job and
 * stopped after worker_idle_s without one: LLVM's ~50 MB live only while
 * compiles happen, and a compile that crashes LLVM (or runs past
 * kill_after_s and is killed) fails that job alone; the next job starts a
 * fresh worker. After a job, the thread calls done(job) — server.c's
 * callback only pushes the job on the done queue and wakes the loop.
 *
 * Invariants: queued <= depth (submit refuses beyond it); a job is on at
 * most one list; after stop no job is taken and every queued job is handed
 * to done with rc = KILN_ESHUTDOWN exactly once. A worker process belongs
 * to one thread; only that thread reads, writes or reaps it.
 *
 * Threads: submit/set_depth/load/stop from the loop thread; the pool's own
 * threads otherwise.
 */
#include "daemon/kilnd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct kilnd_child {
	kilnd_pool_t *pool;
	kilnd_counters_t *ctr;
	pid_t pid; /* 0: not running */
	int to, from;
};

typedef struct worker {
	kilnd_pool_t *pool;
	pthread_t thread;
	kilnd_child_t child;
	double running_since; /* monotonic seconds; 0 when idle (under mu) */
	bool started;
} worker_t;

struct kilnd_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	kilnd_job_t *head[2], *tail[2];
	uint32_t queued, depth, busy, alive;
	bool stopping;
	unsigned n;
	worker_t *w;
	kilnd_pool_opts_t o;
	char *worker_path;
	char fingerprint[256];
	kiln_target_t target;
	void (*done)(kilnd_job_t *job, void *arg);
	void *arg;
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- worker processes ---------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Reads n bytes before the deadline (monotonic seconds; 0: none). 0, or
 * -EPIPE (EOF), -ETIMEDOUT, -errno. */
static int read_all(int fd, void *p, size_t n, double deadline)
{
	uint8_t *b = p;
	while (n > 0) {
		int ms = -1;
		if (deadline > 0) {
			double left = deadline - mono_s();
			if (left <= 0)
				return -ETIMEDOUT;
			ms = (int)(left * 1000) + 1;
		}
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int pr = poll(&pfd, 1, ms);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return -errno;
		if (pr == 0)
			return -ETIMEDOUT;
		ssize_t r = read(fd, b, n);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EPIPE;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* One frame (u32 length + body) into *body (malloc'd). */
static int read_frame(int fd, uint8_t **body, size_t *len, double deadline)
{
	uint8_t h[4];
	int rc = read_all(fd, h, 4, deadline);
	if (rc < 0)
		return rc;
	size_t n =
	    (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
	*body = malloc(n > 0 ? n : 1);
	if (*body == NULL)
		return -ENOMEM;
	rc = read_all(fd, *body, n, deadline);
	if (rc < 0) {
		free(*body);
		*body = NULL;
		return rc;
	}
	*len = n;
	return 0;
}

/* Ends the worker: close its stdin (it exits), reap it; SIGKILL when kill
 * is set or it does not go within 5 s. Returns the wait status. */
static int child_stop(kilnd_child_t *ch, bool kill_it)
{
	if (ch->pid <= 0)
		return 0;
	close(ch->to);
	close(ch->from);
	if (kill_it)
		kill(ch->pid, SIGKILL);
	int status = 0;
	for (int i = 0; i < 500; i++) {
		pid_t r = waitpid(ch->pid, &status, WNOHANG);
		if (r == ch->pid || (r < 0 && errno != EINTR))
			break;
		if (i == 499) {
			kill(ch->pid, SIGKILL);
			waitpid(ch->pid, &status, 0);
			break;
		}
		struct timespec ts = {0, 10 * 1000000L};
		nanosleep(&ts, NULL);
	}
	ch->pid = 0;
	pthread_mutex_lock(&ch->pool->mu);
	ch->pool->alive--;
	pthread_mutex_unlock(&ch->pool->mu);
	return status;
}

static void describe_status(int status, char *out, size_t n)
{
	if (WIFSIGNALED(status))
		snprintf(out, n, "killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else if (WIFEXITED(status))
		snprintf(out, n, "exited with status %d", WEXITSTATUS(status));
	else
		snprintf(out, n, "ended");
}

/* Starts the worker and reads its hello. */
static int child_start(kilnd_child_t *ch, char *err, size_t errlen)
{
	kilnd_pool_t *p = ch->pool;
	int in[2], out[2];
	if (pipe2(in, O_CLOEXEC) < 0)
		return kiln__errf(err, errlen, -errno, "pipe: %s",
				  strerror(errno));
	if (pipe2(out, O_CLOEXEC) < 0) {
		int e = errno;
		close(in[0]);
		close(in[1]);
		return kiln__errf(err, errlen, -e, "pipe: %s", strerror(e));
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	char *argv[] = {p->worker_path, NULL};
	pid_t pid;
	int rc = posix_spawn(&pid, p->worker_path, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(in[0]);
	close(out[1]);
	if (rc != 0) {
		close(in[1]);
		close(out[0]);
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "cannot start %s: %s", p->worker_path,
				  strerror(rc));
	}
	ch->pid = pid;
	ch->to = in[1];
	ch->from = out[0];
	pthread_mutex_lock(&p->mu);
	p->alive++;
	pthread_mutex_unlock(&p->mu);
	KILND_COUNT(ch->ctr, worker_spawns);
	uint8_t *body = NULL;
	size_t len = 0;
	rc = read_frame(ch->from, &body, &len, mono_s() + 60);
	msgpack_zone zone;
	msgpack_zone_init(&zone, 1024);
	msgpack_object m;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	char why[256] = "";
	if (rc == 0)
		rc = kiln_msgpack_unpack_map(body, len, &lim, &zone, &m, why,
					     sizeof(why));
	const msgpack_object *fp = NULL, *t = NULL, *e = NULL;
	if (rc == 0) {
		fp = kiln_map_get(&m, "fingerprint");
		t = kiln_map_get(&m, "target");
		e = kiln_map_get(&m, "error");
	}
	if (rc == 0 && e != NULL && e->type == MSGPACK_OBJECT_STR) {
		snprintf(why, sizeof(why), "%.*s", (int)e->via.str.size,
			 e->via.str.ptr);
		rc = KILN_EINTERNAL;
	} else if (rc == 0 && (fp == NULL || fp->type != MSGPACK_OBJECT_STR ||
			       t == NULL)) {
		snprintf(why, sizeof(why), "malformed hello");
		rc = KILN_EINTERNAL;
	}
	kiln_target_t tt;
	if (rc == 0)
		rc = kiln_target_from_object(t, &tt, why, sizeof(why));
	if (rc == 0) {
		char f[256];
		snprintf(f, sizeof(f), "%.*s", (int)fp->via.str.size,
			 fp->via.str.ptr);
		pthread_mutex_lock(&p->mu);
		if (p->fingerprint[0] == '\0') {
			snprintf(p->fingerprint, sizeof(p->fingerprint), "%s",
				 f);
			p->target = tt;
		} else if (strcmp(f, p->fingerprint) != 0) {
			/* The executable was replaced under us (an upgrade):
			 * its artifacts would not match our signatures. */
			snprintf(why, sizeof(why),
				 "fingerprint changed to \"%.180s\"; restart "
				 "kilnd",
				 f);
			rc = KILN_EINTERNAL;
		}
		pthread_mutex_unlock(&p->mu);
	}
	msgpack_zone_destroy(&zone);
	free(body);
	if (rc < 0) {
		int st = child_stop(ch, true);
		if (why[0] == '\0')
			describe_status(st, why, sizeof(why));
		return kiln__errf(err, errlen, KILN_EINTERNAL,
				  "compile worker %s: %s", p->worker_path, why);
	}
	return 0;
}

int kilnd_child_compile(kilnd_child_t *ch, const kiln_graph_t *g,
			const kiln_compile_opts_t *opts, const char *sig_hex,
			uint8_t **art, size_t *len, double *compile_ms,
			uint32_t *sym_fallbacks, char *err, size_t errlen)
{
	*art = NULL;
	*len = 0;
	*sym_fallbacks = 0;
	int rc;
	if (ch->pid <= 0 && (rc = child_start(ch, err, errlen)) < 0)
		return rc;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	kiln_frame_begin(&sb);
	msgpack_pack_map(&pk, 3);
	kiln_pack_cstr(&pk, "signature");
	kiln_pack_cstr(&pk, sig_hex != NULL ? sig_hex : "");
	kiln_pack_cstr(&pk, "mode");
	kiln_pack_cstr(&pk, opts->mode[0] ? opts->mode : "default");
	kiln_pack_cstr(&pk, "graph");
	rc = kiln_graph_pack(g, &pk);
	if (rc == 0)
		rc = kiln_frame_end(&sb, SIZE_MAX);
	if (rc < 0) {
		msgpack_sbuffer_destroy(&sb);
		return kiln__errf(err, errlen, rc, "cannot encode the graph");
	}
	rc = write_all(ch->to, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	uint8_t *body = NULL;
	size_t n = 0;
	double limit = ch->pool->o.kill_after_s;
	if (rc == 0)
		rc = read_frame(ch->from, &body, &n,
				limit > 0 ? mono_s() + limit : 0);
	if (rc < 0) {
		bool timed_out = rc == -ETIMEDOUT;
		int st = child_stop(ch, true);
		KILND_COUNT(ch->ctr, worker_crashes);
		char how[128];
		if (timed_out)
			snprintf(how, sizeof(how),
				 "still compiling after %.0f s: killed", limit);
		else
			describe_status(st, how, sizeof(how));
		KILN_LOG(KILN_LOG_ERROR,
			 "msg=\"compile worker lost\" how=\"%s\"", how);
		return kiln__errf(err, errlen, KILN_ECOMPILE,
				  "the compile worker %s (a kiln bug: "
				  "report the graph)",
				  how);
	}
	msgpack_zone zone;
	msgpack_zone_init(&zone, 1024);
	msgpack_object m;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	lim.max_frame_bytes = SIZE_MAX / 2;
	rc = kiln_msgpack_unpack_map(body, n, &lim, &zone, &m, err, errlen);
	if (rc == 0) {
		const msgpack_object *ok = kiln_map_get(&m, "ok");
		const msgpack_object *a = kiln_map_get(&m, "artifact");
		const msgpack_object *ms = kiln_map_get(&m, "compile_ms");
		const msgpack_object *sf = kiln_map_get(&m, "sym_fallbacks");
		if (sf != NULL && sf->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
		    sf->via.u64 <= UINT32_MAX)
			*sym_fallbacks = (uint32_t)sf->via.u64;
		if (ok != NULL && ok->type == MSGPACK_OBJECT_BOOLEAN &&
		    ok->via.boolean && a != NULL &&
		    a->type == MSGPACK_OBJECT_BIN) {
			*art =
			    malloc(a->via.bin.size > 0 ? a->via.bin.size : 1);
			if (*art == NULL) {
				rc = -ENOMEM;
			} else {
				memcpy(*art, a->via.bin.ptr, a->via.bin.size);
				*len = a->via.bin.size;
				*compile_ms =
				    ms != NULL &&
					    ms->type == MSGPACK_OBJECT_FLOAT64
					? ms->via.f64
					: 0;
			}
		} else {
			const msgpack_object *c = kiln_map_get(&m, "code");
			const msgpack_object *msg = kiln_map_get(&m, "message");
			/* A worker's code must be a negative int; anything
			 * else (a buggy worker) is a failed compile. */
			rc = KILN_ECOMPILE;
			if (c != NULL &&
			    c->type == MSGPACK_OBJECT_NEGATIVE_INTEGER &&
			    c->via.i64 >= INT_MIN)
				rc = (int)c->via.i64;
			if (msg != NULL && msg->type == MSGPACK_OBJECT_STR)
				kiln__errf(err, errlen, rc, "%.*s",
					   (int)msg->via.str.size,
					   msg->via.str.ptr);
		}
	}
	msgpack_zone_destroy(&zone);
	free(body);
	return rc;
}

/* ---- the queue and the threads ------------------------------------------ */

static kilnd_job_t *pop(kilnd_pool_t *p)
{
	for (int q = 0; q < 2; q++) {
		kilnd_job_t *j = p->head[q];
		if (j != NULL) {
			p->head[q] = j->qnext;
			if (p->head[q] == NULL)
				p->tail[q] = NULL;
			j->qnext = NULL;
			p->queued--;
			return j;
		}
	}
	return NULL;
}

static void *worker_main(void *arg)
{
	worker_t *w = arg;
	kilnd_pool_t *p = w->pool;
	for (;;) {
		pthread_mutex_lock(&p->mu);
		bool idle_out = false;
		while (p->queued == 0 && !p->stopping) {
			if (w->child.pid > 0 && p->o.worker_idle_s > 0) {
				struct timespec ts;
				clock_gettime(CLOCK_REALTIME, &ts);
				ts.tv_sec += p->o.worker_idle_s;
				if (pthread_cond_timedwait(&p->cv, &p->mu,
							   &ts) == ETIMEDOUT &&
				    p->queued == 0) {
					idle_out = true;
					break;
				}
			} else {
				pthread_cond_wait(&p->cv, &p->mu);
			}
		}
		if (idle_out) {
			pthread_mutex_unlock(&p->mu);
			child_stop(&w->child, false);
			continue;
		}
		kilnd_job_t *j = p->stopping ? NULL : pop(p);
		if (j == NULL) {
			pthread_mutex_unlock(&p->mu);
			break;
		}
		p->busy++;
		w->running_since = mono_s();
		pthread_mutex_unlock(&p->mu);

		kilnd_job_run(&w->child, w->child.ctr, j);
		/* Hand the job back before counting the thread idle, so that
		 * "no thread busy" means every result is on the done queue. */
		p->done(j, p->arg);
		pthread_mutex_lock(&p->mu);
		p->busy--;
		w->running_since = 0;
		pthread_mutex_unlock(&p->mu);
	}
	child_stop(&w->child, false);
	return NULL;
}

int kilnd_pool_new(const kilnd_pool_opts_t *o, kilnd_counters_t *workers_ctr,
		   void (*done)(kilnd_job_t *job, void *arg), void *arg,
		   kilnd_pool_t **out, char *err, size_t errlen)
{
	*out = NULL;
	unsigned n = o->threads > 0 ? o->threads : 1;
	kilnd_pool_t *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->w = calloc(n, sizeof(*p->w));
	p->worker_path = strdup(o->worker_path ? o->worker_path : "");
	if (p->w == NULL || p->worker_path == NULL) {
		free(p->w);
		free(p->worker_path);
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->n = n;
	p->o = *o;
	p->depth = o->queue_depth;
	p->done = done;
	p->arg = arg;
	for (unsigned i = 0; i < n; i++) {
		p->w[i].pool = p;
		p->w[i].child.pool = p;
		p->w[i].child.ctr = &workers_ctr[i];
	}
	/* The first worker now: its hello names the fingerprint and target,
	 * and a missing or broken worker should fail start-up. */
	int rc = child_start(&p->w[0].child, err, errlen);
	for (unsigned i = 0; i < n && rc == 0; i++) {
		if (pthread_create(&p->w[i].thread, NULL, worker_main,
				   &p->w[i]) != 0) {
			rc = kiln__errf(err, errlen, -EAGAIN,
					"cannot start compile thread %u", i);
			break;
		}
		p->w[i].started = true;
	}
	if (rc < 0) {
		kilnd_pool_stop(p);
		kilnd_pool_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

int kilnd_pool_submit(kilnd_pool_t *p, kilnd_job_t *job, kilnd_prio_t prio)
{
	int q = prio == KILND_PRIO_BATCH ? 1 : 0;
	pthread_mutex_lock(&p->mu);
	int rc = 0;
	if (p->stopping)
		rc = KILN_ESHUTDOWN;
	else if (p->queued >= p->depth)
		rc = KILN_EBUSY;
	if (rc == 0) {
		job->qnext = NULL;
		if (p->tail[q])
			p->tail[q]->qnext = job;
		else
			p->head[q] = job;
		p->tail[q] = job;
		p->queued++;
		pthread_cond_signal(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

void kilnd_pool_set_depth(kilnd_pool_t *p, uint32_t depth)
{
	pthread_mutex_lock(&p->mu);
	p->depth = depth;
	pthread_mutex_unlock(&p->mu);
}

void kilnd_pool_load(kilnd_pool_t *p, uint32_t *queued, uint32_t *busy,
		     uint32_t *total)
{
	pthread_mutex_lock(&p->mu);
	*queued = p->queued;
	*busy = p->busy;
	*total = p->n;
	pthread_mutex_unlock(&p->mu);
}

uint32_t kilnd_pool_alive(kilnd_pool_t *p)
{
	pthread_mutex_lock(&p->mu);
	uint32_t a = p->alive;
	pthread_mutex_unlock(&p->mu);
	return a;
}

double kilnd_pool_oldest_running_s(kilnd_pool_t *p)
{
	double now = mono_s(), oldest = 0;
	pthread_mutex_lock(&p->mu);
	for (unsigned i = 0; i < p->n; i++)
		if (p->w[i].running_since > 0 &&
		    now - p->w[i].running_since > oldest)
			oldest = now - p->w[i].running_since;
	pthread_mutex_unlock(&p->mu);
	return oldest;
}

void kilnd_pool_stop(kilnd_pool_t *p)
{
	pthread_mutex_lock(&p->mu);
	if (p->stopping) {
		pthread_mutex_unlock(&p->mu);
		return;
	}
	p->stopping = true;
	kilnd_job_t *list = NULL, *j;
	while ((j = pop(p)) != NULL) {
		j->qnext = list;
		list = j;
	}
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	while (list != NULL) {
		j = list;
		list = j->qnext;
		j->rc = KILN_ESHUTDOWN;
		snprintf(j->err, sizeof(j->err), "kilnd is shutting down");
		p->done(j, p->arg);
	}
}

void kilnd_pool_free(kilnd_pool_t *p)
{
	if (p == NULL)
		return;
	for (unsigned i = 0; i < p->n; i++) {
		if (p->w[i].started)
			pthread_join(p->w[i].thread, NULL);
		else
			child_stop(&p->w[i].child, false);
	}
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->worker_path);
	free(p->w);
	free(p);
}

const char *kilnd_pool_fingerprint(kilnd_pool_t *p)
{
	return p->fingerprint;
}

const kiln_target_t *kilnd_pool_target(kilnd_pool_t *p)
{
	return &p->target;
}
