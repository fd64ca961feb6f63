/*
 * pool.c — kiln's compile workers and their bounded priority queue.
 *
 * Two FIFO lists (interactive, batch) under one mutex; a worker takes the
 * head of the interactive list, else of the batch list. Each worker owns a
 * kiln_compiler_t (an LLVM TargetMachine; LLVMContexts are per compile) and
 * a counter block. After a job, the worker calls done(job) — server.c's
 * callback only pushes the job on the done queue and wakes the loop.
 *
 * Invariants: queued <= depth (submit refuses beyond it); a job is on at
 * most one list; after stop no job is taken and every queued job is handed
 * to done with rc = KILN_ESHUTDOWN exactly once.
 *
 * Threads: submit/set_depth/load/stop from the loop thread (any thread
 * would do); the workers are the pool's own.
 */
#include "daemon/kilnd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct worker {
	kilnd_pool_t *pool;
	pthread_t thread;
	kiln_compiler_t *cc;
	kilnd_counters_t *ctr;
	double running_since; /* monotonic seconds; 0 when idle (under mu) */
	bool started;
} worker_t;

struct kilnd_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	kilnd_job_t *head[2], *tail[2];
	uint32_t queued, depth, busy;
	bool stopping;
	unsigned n;
	worker_t *w;
	void (*done)(kilnd_job_t *job, void *arg);
	void *arg;
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
		while (p->queued == 0 && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		kilnd_job_t *j = p->stopping ? NULL : pop(p);
		if (j == NULL) {
			pthread_mutex_unlock(&p->mu);
			break;
		}
		p->busy++;
		w->running_since = mono_s();
		pthread_mutex_unlock(&p->mu);

		kilnd_job_run(w->cc, w->ctr, j);

		pthread_mutex_lock(&p->mu);
		p->busy--;
		w->running_since = 0;
		pthread_mutex_unlock(&p->mu);
		p->done(j, p->arg);
	}
	return NULL;
}

int kilnd_pool_new(unsigned n, const kiln_target_t *target,
		   uint32_t queue_depth, kilnd_counters_t *workers_ctr,
		   void (*done)(kilnd_job_t *job, void *arg), void *arg,
		   kilnd_pool_t **out, char *err, size_t errlen)
{
	*out = NULL;
	if (n == 0)
		n = 1;
	kilnd_pool_t *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->w = calloc(n, sizeof(*p->w));
	if (p->w == NULL) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->n = n;
	p->depth = queue_depth;
	p->done = done;
	p->arg = arg;
	int rc = 0;
	for (unsigned i = 0; i < n && rc == 0; i++) {
		p->w[i].pool = p;
		p->w[i].ctr = &workers_ctr[i];
		rc = kiln_compiler_new(target, &p->w[i].cc, err, errlen);
	}
	for (unsigned i = 0; i < n && rc == 0; i++) {
		if (pthread_create(&p->w[i].thread, NULL, worker_main,
				   &p->w[i]) != 0) {
			rc = kiln__errf(err, errlen, -EAGAIN,
					"cannot start compile worker %u", i);
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
		kiln_compiler_free(p->w[i].cc);
	}
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->w);
	free(p);
}

const char *kilnd_pool_fingerprint(kilnd_pool_t *p)
{
	return kiln_compiler_fingerprint(p->w[0].cc);
}

const kiln_target_t *kilnd_pool_target(kilnd_pool_t *p)
{
	return kiln_compiler_target(p->w[0].cc);
}
