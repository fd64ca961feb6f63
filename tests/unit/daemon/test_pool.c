/*
 * test_pool.c — kilnd's compile pool (daemon/pool.c) on its own: jobs run
 * on the workers and come back through done; interactive jobs go before
 * batch ones queued earlier; FIFO within a priority; the queue's bound
 * (KILN_EBUSY) and set_depth; load() and oldest_running_s(); stop() handing
 * every queued job to done exactly once with KILN_ESHUTDOWN and refusing
 * later submits; free joining the workers.
 *
 * Built from pool.c itself (tests/unit/daemon/meson.build), not kilnd_core:
 * kilnd_job_run below stands in for server.c's, recording the order jobs
 * start in and doing what each job's peer_pid asks (sleep, or block until
 * the test opens the gate); it never talks to the thread's worker process.
 * kilnd_pool_new still starts the first thread's real kiln-compile-worker
 * (KILN_COMPILE_WORKER, from the build tree) and reads its hello; the
 * tests also check start-up failures, idle workers being stopped, and that
 * nothing is left unreaped.
 */
#include "daemon/kilnd.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

/* peer_pid of a job: > 0 sleeps that many milliseconds, BLOCK waits for the
 * gate, 0 returns at once. req_id is the job's number (< MAXJOBS). */
#define BLOCK	 (-1)
#define MAXJOBS	 64
#define RC_UNSET 12345
#define WAIT_S	 10

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static int started[MAXJOBS], order[MAXJOBS], norder;
static int finished[MAXJOBS];
static int done_calls[MAXJOBS], done_order[MAXJOBS], ndone;
static int done_rc[MAXJOBS];
static kilnd_child_t *run_ch[MAXJOBS];
static kilnd_counters_t *run_ctr[MAXJOBS];
static kilnd_counters_t ctrs[4];
static void *done_arg_seen;

void kilnd_job_run(kilnd_child_t *ch, kilnd_counters_t *ctr, kilnd_job_t *job)
{
	int id = (int)job->req_id;
	pthread_mutex_lock(&mu);
	started[id]++;
	order[norder++] = id;
	run_ch[id] = ch;
	run_ctr[id] = ctr;
	pthread_cond_broadcast(&cv);
	if (job->peer_pid == BLOCK) {
		while (!gate_open)
			pthread_cond_wait(&cv, &mu);
	}
	pthread_mutex_unlock(&mu);
	if (job->peer_pid > 0) {
		struct timespec ts = {.tv_sec = job->peer_pid / 1000,
				      .tv_nsec =
					  (job->peer_pid % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	KILND_COUNT(ctr, compiled);
	job->rc = 0;
	job->compile_ms = 1.0;
	pthread_mutex_lock(&mu);
	finished[id]++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void on_done(kilnd_job_t *job, void *arg)
{
	int id = (int)job->req_id;
	pthread_mutex_lock(&mu);
	done_calls[id]++;
	done_order[ndone++] = id;
	done_rc[id] = job->rc;
	done_arg_seen = arg;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* ---- helpers ------------------------------------------------------------- */

static void reset(void)
{
	pthread_mutex_lock(&mu);
	gate_open = false;
	memset(started, 0, sizeof(started));
	memset(order, 0, sizeof(order));
	memset(finished, 0, sizeof(finished));
	memset(done_calls, 0, sizeof(done_calls));
	memset(done_order, 0, sizeof(done_order));
	memset(done_rc, 0, sizeof(done_rc));
	memset(run_ch, 0, sizeof(run_ch));
	memset(run_ctr, 0, sizeof(run_ctr));
	memset(ctrs, 0, sizeof(ctrs));
	norder = ndone = 0;
	done_arg_seen = NULL;
	pthread_mutex_unlock(&mu);
}

TestSuite(pool, .init = reset);

static kilnd_pool_t *new_pool_idle(unsigned n, uint32_t depth, uint32_t idle_s)
{
	char err[256] = "";
	kilnd_pool_t *p = NULL;
	cr_assert_leq(n, 4);
	kilnd_pool_opts_t o = {.threads = n,
			       .worker_path = KILN_COMPILE_WORKER,
			       .worker_idle_s = idle_s,
			       .queue_depth = depth};
	int rc = kilnd_pool_new(&o, ctrs, on_done, &mu, &p, err, sizeof(err));
	cr_assert_eq(rc, 0, "kilnd_pool_new: %d %s", rc, err);
	cr_assert_not_null(p);
	return p;
}

static kilnd_pool_t *new_pool(unsigned n, uint32_t depth)
{
	return new_pool_idle(n, depth, 0);
}

static kilnd_job_t *new_job(int id, int64_t behaviour)
{
	cr_assert_lt(id, MAXJOBS);
	kilnd_job_t *j = calloc(1, sizeof(*j));
	cr_assert_not_null(j);
	j->req_id = (uint64_t)id;
	j->peer_pid = behaviour;
	j->rc = RC_UNSET;
	return j;
}

static void deadline(struct timespec *ts)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += WAIT_S;
}

/* Waits (under mu) until *counter >= want; fails after WAIT_S. */
static void wait_for(int *counter, int want, const char *what)
{
	struct timespec ts;
	deadline(&ts);
	pthread_mutex_lock(&mu);
	int rc = 0;
	while (*counter < want && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&cv, &mu, &ts);
	int got = *counter;
	pthread_mutex_unlock(&mu);
	cr_assert_geq(got, want, "timed out waiting for %s (%d of %d)", what,
		      got, want);
}

static void wait_started(int id)
{
	wait_for(&started[id], 1, "a job to start");
}

static void wait_done(int n)
{
	wait_for(&ndone, n, "done calls");
}

static void open_gate(void)
{
	pthread_mutex_lock(&mu);
	gate_open = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static int order_at(int i)
{
	pthread_mutex_lock(&mu);
	int id = order[i];
	pthread_mutex_unlock(&mu);
	return id;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000,
			      .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Waits until load() reports busy == want (busy drops just before done is
 * called, so this settles quickly). */
static void wait_busy(kilnd_pool_t *p, uint32_t want)
{
	uint32_t q, b, t;
	for (int i = 0; i < WAIT_S * 1000; i++) {
		kilnd_pool_load(p, &q, &b, &t);
		if (b == want)
			return;
		sleep_ms(1);
	}
	cr_assert_fail("busy stayed %u, want %u", b, want);
}

static void stop_and_free(kilnd_pool_t *p, kilnd_job_t **jobs, int n)
{
	kilnd_pool_stop(p);
	kilnd_pool_free(p);
	for (int i = 0; i < n; i++)
		free(jobs[i]);
}

/* ---- tests --------------------------------------------------------------- */

Test(pool, runs_jobs_and_calls_done)
{
	kilnd_pool_t *p = new_pool(2, 32);
	kilnd_job_t *j[16];
	for (int i = 0; i < 16; i++) {
		j[i] = new_job(i, i % 3 == 0 ? 5 : 0);
		cr_assert_eq(kilnd_pool_submit(p, j[i],
					       i % 2 ? KILND_PRIO_BATCH
						     : KILND_PRIO_INTERACTIVE),
			     0);
	}
	wait_done(16);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < 16; i++) {
		cr_assert_eq(started[i], 1, "job %d ran %d times", i,
			     started[i]);
		cr_assert_eq(finished[i], 1);
		cr_assert_eq(done_calls[i], 1, "job %d done %d times", i,
			     done_calls[i]);
		cr_assert_eq(done_rc[i], 0);
		cr_assert_eq(j[i]->rc, 0);
		cr_assert_null(j[i]->qnext);
		cr_assert_not_null(run_ch[i], "the thread's worker");
		cr_assert(run_ctr[i] == &ctrs[0] || run_ctr[i] == &ctrs[1],
			  "the worker's own counter block");
	}
	cr_assert_eq(done_arg_seen, &mu, "done gets the pool's arg");
	pthread_mutex_unlock(&mu);
	cr_assert_eq(atomic_load(&ctrs[0].v[KILND_C_compiled]) +
			 atomic_load(&ctrs[1].v[KILND_C_compiled]),
		     16);
	cr_assert_str_not_empty(kilnd_pool_fingerprint(p));
	cr_assert_not_null(kilnd_pool_target(p));
	stop_and_free(p, j, 16);
	cr_assert_eq(ndone, 16, "stop after the queue drained: no done calls");
}

Test(pool, interactive_before_earlier_batch)
{
	kilnd_pool_t *p = new_pool(1, 16);
	kilnd_job_t *x = new_job(0, BLOCK);
	kilnd_job_t *b1 = new_job(1, 0), *b2 = new_job(2, 0);
	kilnd_job_t *i1 = new_job(3, 0);
	cr_assert_eq(kilnd_pool_submit(p, x, KILND_PRIO_BATCH), 0);
	wait_started(0);
	cr_assert_eq(kilnd_pool_submit(p, b1, KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, b2, KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, i1, KILND_PRIO_INTERACTIVE), 0);
	open_gate();
	wait_done(4);
	cr_assert_eq(order_at(0), 0);
	cr_assert_eq(order_at(1), 3, "I1 first, not %d", order_at(1));
	cr_assert_eq(order_at(2), 1);
	cr_assert_eq(order_at(3), 2);
	kilnd_job_t *all[] = {x, b1, b2, i1};
	stop_and_free(p, all, 4);
}

Test(pool, fifo_within_a_priority)
{
	kilnd_pool_t *p = new_pool(1, 32);
	kilnd_job_t *j[21];
	j[0] = new_job(0, BLOCK);
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_INTERACTIVE), 0);
	wait_started(0);
	/* Interleaved: odd ids batch (1, 3, ..., 19), even interactive. */
	for (int i = 1; i <= 20; i++) {
		j[i] = new_job(i, 0);
		cr_assert_eq(kilnd_pool_submit(p, j[i],
					       i % 2 ? KILND_PRIO_BATCH
						     : KILND_PRIO_INTERACTIVE),
			     0);
	}
	open_gate();
	wait_done(21);
	int k = 1;
	for (int i = 2; i <= 20; i += 2, k++)
		cr_assert_eq(order_at(k), i, "position %d: %d, want %d", k,
			     order_at(k), i);
	for (int i = 1; i <= 19; i += 2, k++)
		cr_assert_eq(order_at(k), i, "position %d: %d, want %d", k,
			     order_at(k), i);
	stop_and_free(p, j, 21);
}

Test(pool, depth_bounds_the_queue_and_set_depth)
{
	kilnd_pool_t *p = new_pool(1, 2);
	kilnd_job_t *j[8];
	for (int i = 0; i < 8; i++)
		j[i] = new_job(i, i == 0 ? BLOCK : 0);
	uint32_t q, b, t;
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 0);
	cr_assert_eq(b, 0);
	cr_assert_eq(t, 1);

	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_BATCH), 0);
	wait_started(0);
	wait_busy(p, 1);
	/* The running job does not count against the depth. */
	cr_assert_eq(kilnd_pool_submit(p, j[1], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[2], KILND_PRIO_INTERACTIVE), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[3], KILND_PRIO_INTERACTIVE),
		     KILN_EBUSY);
	cr_assert_eq(kilnd_pool_submit(p, j[3], KILND_PRIO_BATCH), KILN_EBUSY);
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 2);
	cr_assert_eq(b, 1);
	cr_assert_eq(t, 1);

	kilnd_pool_set_depth(p, 4);
	cr_assert_eq(kilnd_pool_submit(p, j[3], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[4], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[5], KILND_PRIO_BATCH), KILN_EBUSY);
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 4);

	/* Lowered below what is queued: nothing dropped, nothing taken. */
	kilnd_pool_set_depth(p, 1);
	cr_assert_eq(kilnd_pool_submit(p, j[5], KILND_PRIO_INTERACTIVE),
		     KILN_EBUSY);
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 4);

	open_gate();
	wait_done(5);
	wait_busy(p, 0);
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 0);
	cr_assert_eq(b, 0);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(done_calls[i], 1);
	for (int i = 5; i < 8; i++)
		cr_assert_eq(started[i] + done_calls[i], 0, "refused job %d",
			     i);
	pthread_mutex_unlock(&mu);

	/* Depth 1 again accepts one. */
	cr_assert_eq(kilnd_pool_submit(p, j[5], KILND_PRIO_BATCH), 0);
	wait_done(6);

	/* Depth 0: every submit refused. */
	kilnd_pool_set_depth(p, 0);
	cr_assert_eq(kilnd_pool_submit(p, j[6], KILND_PRIO_BATCH), KILN_EBUSY);
	stop_and_free(p, j, 8);
	cr_assert_eq(ndone, 6);
}

Test(pool, load_counts_busy_workers)
{
	kilnd_pool_t *p = new_pool(2, 8);
	kilnd_job_t *j[5];
	for (int i = 0; i < 5; i++)
		j[i] = new_job(i, i < 2 ? BLOCK : 0);
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[1], KILND_PRIO_BATCH), 0);
	wait_started(0);
	wait_started(1);
	wait_busy(p, 2);
	for (int i = 2; i < 5; i++)
		cr_assert_eq(kilnd_pool_submit(p, j[i], KILND_PRIO_BATCH), 0);
	uint32_t q, b, t;
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 3);
	cr_assert_eq(b, 2);
	cr_assert_eq(t, 2);
	open_gate();
	wait_done(5);
	wait_busy(p, 0);
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 0);
	cr_assert_eq(t, 2);
	stop_and_free(p, j, 5);
}

Test(pool, zero_workers_means_one)
{
	kilnd_pool_t *p = new_pool(0, 4);
	uint32_t q, b, t;
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(t, 1);
	kilnd_job_t *j = new_job(0, 0);
	cr_assert_eq(kilnd_pool_submit(p, j, KILND_PRIO_INTERACTIVE), 0);
	wait_done(1);
	stop_and_free(p, &j, 1);
}

Test(pool, oldest_running_while_a_job_runs)
{
	kilnd_pool_t *p = new_pool(2, 4);
	cr_assert_eq(kilnd_pool_oldest_running_s(p), 0.0);
	kilnd_job_t *j[2] = {new_job(0, BLOCK), new_job(1, BLOCK)};
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_BATCH), 0);
	wait_started(0);
	sleep_ms(60);
	cr_assert_eq(kilnd_pool_submit(p, j[1], KILND_PRIO_BATCH), 0);
	wait_started(1);
	double s = kilnd_pool_oldest_running_s(p);
	cr_assert_gt(s, 0.0);
	cr_assert_geq(s, 0.05, "oldest %.3f s: the older job's age", s);
	cr_assert_lt(s, WAIT_S);
	sleep_ms(20);
	cr_assert_gt(kilnd_pool_oldest_running_s(p), s, "it grows");
	open_gate();
	wait_done(2);
	wait_busy(p, 0);
	cr_assert_eq(kilnd_pool_oldest_running_s(p), 0.0, "idle again");
	stop_and_free(p, j, 2);
}

Test(pool, stop_hands_queued_jobs_to_done_once)
{
	kilnd_pool_t *p = new_pool(1, 16);
	kilnd_job_t *j[10];
	for (int i = 0; i < 10; i++)
		j[i] = new_job(i, i == 0 ? BLOCK : 0);
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_INTERACTIVE), 0);
	wait_started(0);
	for (int i = 1; i < 8; i++)
		cr_assert_eq(kilnd_pool_submit(p, j[i],
					       i % 2 ? KILND_PRIO_BATCH
						     : KILND_PRIO_INTERACTIVE),
			     0);

	kilnd_pool_stop(p); /* the worker is still in job 0 */
	pthread_mutex_lock(&mu);
	cr_assert_eq(ndone, 7, "done for each queued job, on stop");
	for (int i = 1; i < 8; i++) {
		cr_assert_eq(done_calls[i], 1, "job %d: %d done calls", i,
			     done_calls[i]);
		cr_assert_eq(done_rc[i], KILN_ESHUTDOWN);
		cr_assert_eq(j[i]->rc, KILN_ESHUTDOWN);
		cr_assert_neq(j[i]->err[0], '\0', "a message");
		cr_assert_eq(started[i], 0, "job %d ran", i);
	}
	cr_assert_eq(done_calls[0], 0, "the running job is not cut short");
	pthread_mutex_unlock(&mu);

	uint32_t q, b, t;
	kilnd_pool_load(p, &q, &b, &t);
	cr_assert_eq(q, 0);
	cr_assert_eq(b, 1);

	cr_assert_eq(kilnd_pool_submit(p, j[8], KILND_PRIO_INTERACTIVE),
		     KILN_ESHUTDOWN);
	cr_assert_eq(kilnd_pool_submit(p, j[9], KILND_PRIO_BATCH),
		     KILN_ESHUTDOWN);
	kilnd_pool_stop(p); /* again: nothing more */
	cr_assert_eq(ndone, 7);

	open_gate();
	wait_done(8);
	cr_assert_eq(done_rc[0], 0, "the running job finishes normally");
	kilnd_pool_free(p);
	pthread_mutex_lock(&mu);
	cr_assert_eq(ndone, 8);
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(done_calls[i], i < 8 ? 1 : 0, "job %d", i);
		cr_assert_eq(started[i], i == 0 ? 1 : 0, "job %d", i);
	}
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < 10; i++)
		free(j[i]);
}

Test(pool, stop_full_queue_at_depth)
{
	/* A full queue, two workers both blocked, mixed priorities. */
	kilnd_pool_t *p = new_pool(2, 5);
	kilnd_job_t *j[8];
	for (int i = 0; i < 8; i++)
		j[i] = new_job(i, i < 2 ? BLOCK : 0);
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[1], KILND_PRIO_BATCH), 0);
	wait_started(0);
	wait_started(1);
	for (int i = 2; i < 7; i++)
		cr_assert_eq(kilnd_pool_submit(p, j[i],
					       i % 2 ? KILND_PRIO_BATCH
						     : KILND_PRIO_INTERACTIVE),
			     0);
	cr_assert_eq(kilnd_pool_submit(p, j[7], KILND_PRIO_BATCH), KILN_EBUSY);
	kilnd_pool_stop(p);
	cr_assert_eq(ndone, 5);
	cr_assert_eq(kilnd_pool_submit(p, j[7], KILND_PRIO_BATCH),
		     KILN_ESHUTDOWN);
	open_gate();
	kilnd_pool_free(p); /* joins both */
	pthread_mutex_lock(&mu);
	cr_assert_eq(ndone, 7);
	for (int i = 0; i < 7; i++) {
		cr_assert_eq(done_calls[i], 1, "job %d", i);
		cr_assert_eq(done_rc[i], i < 2 ? 0 : KILN_ESHUTDOWN, "job %d",
			     i);
	}
	cr_assert_eq(done_calls[7], 0);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < 8; i++)
		free(j[i]);
}

Test(pool, free_joins_the_workers)
{
	kilnd_pool_t *p = new_pool(2, 4);
	kilnd_job_t *j[2] = {new_job(0, 300), new_job(1, 200)};
	cr_assert_eq(kilnd_pool_submit(p, j[0], KILND_PRIO_BATCH), 0);
	cr_assert_eq(kilnd_pool_submit(p, j[1], KILND_PRIO_INTERACTIVE), 0);
	wait_started(0);
	wait_started(1);
	kilnd_pool_stop(p);
	pthread_mutex_lock(&mu);
	int before = finished[0] + finished[1];
	pthread_mutex_unlock(&mu);
	cr_assert_eq(before, 0, "still sleeping when stop returns");
	kilnd_pool_free(p);
	/* Both workers have returned: their jobs are finished and done. */
	pthread_mutex_lock(&mu);
	cr_assert_eq(finished[0], 1);
	cr_assert_eq(finished[1], 1);
	cr_assert_eq(done_calls[0], 1);
	cr_assert_eq(done_calls[1], 1);
	cr_assert_eq(done_rc[0], 0);
	cr_assert_eq(done_rc[1], 0);
	pthread_mutex_unlock(&mu);
	free(j[0]);
	free(j[1]);
}

Test(pool, stop_idle_pool)
{
	kilnd_pool_t *p = new_pool(2, 4);
	kilnd_pool_stop(p);
	kilnd_job_t *j = new_job(0, 0);
	cr_assert_eq(kilnd_pool_submit(p, j, KILND_PRIO_BATCH), KILN_ESHUTDOWN);
	kilnd_pool_free(p);
	cr_assert_eq(ndone, 0);
	free(j);
}

/* ---- worker processes ---------------------------------------------------- */

/* No child process of this test is left (running or unreaped). */
static void assert_no_children(void)
{
	errno = 0;
	cr_assert_eq(waitpid(-1, NULL, WNOHANG), -1, "a child process is left");
	cr_assert_eq(errno, ECHILD);
}

Test(pool, first_worker_started_and_reaped)
{
	kilnd_pool_t *p = new_pool(2, 4);
	cr_assert_eq(kilnd_pool_alive(p), 1, "the first thread's worker");
	cr_assert_eq(atomic_load(&ctrs[0].v[KILND_C_worker_spawns]), 1);
	cr_assert_eq(atomic_load(&ctrs[1].v[KILND_C_worker_spawns]), 0);
	const char *fp = kilnd_pool_fingerprint(p);
	cr_assert(strncmp(fp, "kiln/", 5) == 0, "fingerprint \"%s\"", fp);
	cr_assert_str_not_empty(kilnd_pool_target(p)->backend);
	kilnd_pool_stop(p);
	kilnd_pool_free(p);
	assert_no_children();
}

Test(pool, idle_worker_is_stopped)
{
	kilnd_pool_t *p = new_pool_idle(1, 4, 1);
	cr_assert_eq(kilnd_pool_alive(p), 1);
	uint32_t alive = 1;
	for (int i = 0; i < WAIT_S * 100 && alive > 0; i++) {
		sleep_ms(10);
		alive = kilnd_pool_alive(p);
	}
	cr_assert_eq(alive, 0, "the worker outlived worker_idle_s");
	assert_no_children();
	/* The thread still takes jobs (this stub starts no worker). */
	kilnd_job_t *j = new_job(0, 0);
	cr_assert_eq(kilnd_pool_submit(p, j, KILND_PRIO_BATCH), 0);
	wait_done(1);
	cr_assert_eq(done_rc[0], 0);
	stop_and_free(p, &j, 1);
	assert_no_children();
}

Test(pool, missing_worker_fails_new)
{
	char err[256] = "";
	kilnd_pool_t *p = (kilnd_pool_t *)&mu; /* must be reset */
	kilnd_pool_opts_t o = {.threads = 2,
			       .worker_path =
				   "/nonexistent/kiln-compile-worker",
			       .queue_depth = 4};
	int rc = kilnd_pool_new(&o, ctrs, on_done, NULL, &p, err, sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert_null(p);
	cr_assert(strstr(err, "/nonexistent/kiln-compile-worker") != NULL,
		  "err: %s", err);
	assert_no_children();
	cr_assert_eq(ndone, 0);
}

Test(pool, worker_without_hello_fails_new)
{
	char err[256] = "";
	kilnd_pool_t *p = NULL;
	kilnd_pool_opts_t o = {
	    .threads = 1, .worker_path = "/bin/true", .queue_depth = 4};
	int rc = kilnd_pool_new(&o, ctrs, on_done, NULL, &p, err, sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert_null(p);
	cr_assert(strstr(err, "/bin/true") != NULL, "err: %s", err);
	assert_no_children();
}
