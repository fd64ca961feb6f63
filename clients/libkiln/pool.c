/*
 * pool.c — the persistent thread pool kernels run on (kiln.h § 1).
 *
 * A range submitted with kiln_pool_parallel_for becomes a job on the
 * submitter's stack: n pieces (n <= threads, each >= grain units), claimed
 * one at a time with an atomic counter. The job is linked into the pool's
 * queue (under `mu`) for as long as the submitter is claiming pieces;
 * workers that find a job with pieces left register in its `state` (under
 * `mu`, so never after it is unlinked) and claim pieces too. After its own
 * claims run dry the submitter unlinks the job and waits until `state`
 * shows no worker inside; only then may the job's stack frame go.
 *
 * Wake-ups: every submit bumps `epoch`. An idle worker spins on `epoch` for
 * about SPIN_NS and then sleeps in futex_wait(&epoch); a submitter wakes
 * sleepers only when `sleepers` says there are any, so back-to-back kernel
 * steps cost no system call. The submitter waits for stragglers the same
 * way on job.state (bit 31 says it is asleep; the last worker out wakes it).
 *
 * Invariants: a worker touches a job only between registering in its state
 * (while it is linked) and the decrement that unregisters it; after that
 * decrement it may still futex_wake the address, which is harmless. Any
 * thread may submit; kiln_pool_free only with no range running.
 *
 * OpenMP mode (the default pool only, KILN_POOL): in a process that has
 * loaded GNU OpenMP (libgomp.so.1: torch's intra-op threads), a range runs
 * as one parallel region of that runtime (GOMP_parallel, found with dlsym),
 * the team claiming the same pieces, and the pool starts no thread of its
 * own. Two pools of spinning threads on the same cores had cost kiln's
 * kernels their speed whenever they followed torch's ops (an idle OpenMP
 * thread spins for milliseconds): ConvNeXt-nano's training step, whose
 * kiln graphs alternate with autograd and the optimizer, 175 -> 159 ms
 * with OMP_WAIT_POLICY=PASSIVE before this mode. The team's threads must
 * have stacks of at least POOL_MIN_STACK (checked once), else the pool is
 * kiln's own.
 */
#include "clients/libkiln/kiln.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS	   50000 /* idle spin before sleeping: 50 us */
#define WAIT_BIT   0x80000000u
#define POOL_STACK (8u << 20) /* each worker's stack: 8 MiB */
/* the least stack an OpenMP team thread must have to run kernels */
#define POOL_MIN_STACK (4u << 20)

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);

typedef struct job {
	kiln_range_fn fn;
	void *ctx;
	int64_t q, r; /* piece i: [i*q + min(i, r), +q + (i < r)) */
	uint32_t n_pieces;
	_Atomic uint32_t next;	 /* next piece to claim */
	_Atomic uint32_t state;	 /* workers inside | WAIT_BIT */
	struct job *prev, *succ; /* queue links, under pool->mu */
} job_t;

struct kiln_pool {
	unsigned n_threads; /* participants, the submitter included */
	unsigned n_workers; /* started */
	pthread_t *threads;
	pthread_mutex_t mu; /* guards the queue */
	job_t *head, *tail;
	_Atomic uint32_t epoch;
	_Atomic uint32_t sleepers;
	_Atomic bool stop;
	/* OpenMP mode: ranges run as GOMP_parallel regions; n_threads 0
	 * follows omp_get_max_threads (torch.set_num_threads) */
	gomp_parallel_fn omp_parallel;
	omp_int_fn omp_max_threads;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL,
		NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL,
		0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Claims and runs pieces of j until none are left. */
static void run_pieces(job_t *j)
{
	for (;;) {
		uint32_t i = atomic_fetch_add_explicit(&j->next, 1,
						       memory_order_relaxed);
		if (i >= j->n_pieces)
			return;
		int64_t b = (int64_t)i * j->q + (i < j->r ? i : j->r);
		int64_t e = b + j->q + (i < j->r ? 1 : 0);
		j->fn(j->ctx, b, e);
	}
}

/* The first queued job with pieces left, registered in; or NULL. */
static job_t *take_job(kiln_pool_t *p)
{
	job_t *found = NULL;
	pthread_mutex_lock(&p->mu);
	for (job_t *j = p->head; j != NULL; j = j->succ) {
		if (atomic_load_explicit(&j->next, memory_order_relaxed) <
		    j->n_pieces) {
			atomic_fetch_add(&j->state, 1);
			found = j;
			break;
		}
	}
	pthread_mutex_unlock(&p->mu);
	return found;
}

static void *worker_main(void *arg)
{
	kiln_pool_t *p = arg;
	for (;;) {
		uint32_t e = atomic_load(&p->epoch);
		job_t *j = take_job(p);
		if (j != NULL) {
			run_pieces(j);
			/* unregister; j may be gone right after this */
			uint32_t old = atomic_fetch_sub(&j->state, 1);
			if (old == (WAIT_BIT | 1))
				futex_wake(&j->state, 1);
			continue;
		}
		if (atomic_load(&p->stop))
			return NULL;
		uint64_t t0 = now_ns();
		for (unsigned k = 1;; k++) {
			if (atomic_load_explicit(&p->epoch,
						 memory_order_relaxed) != e)
				break;
			cpu_relax();
			if ((k & 63) == 0 && now_ns() - t0 > SPIN_NS) {
				atomic_fetch_add(&p->sleepers, 1);
				futex_wait(&p->epoch, e);
				atomic_fetch_sub(&p->sleepers, 1);
				break;
			}
		}
	}
}

static unsigned cpu_count(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		int a = CPU_COUNT(&set);
		if (a > 0 && (n <= 0 || a < n))
			n = a;
	}
	if (n < 1)
		n = 1;
	return n > KILN_POOL_MAX_THREADS ? KILN_POOL_MAX_THREADS : (unsigned)n;
}

int kiln_pool_new(unsigned n_threads, kiln_pool_t **out)
{
	*out = NULL;
	if (n_threads == 0)
		n_threads = cpu_count();
	if (n_threads > KILN_POOL_MAX_THREADS)
		return -EINVAL;
	kiln_pool_t *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->n_threads = n_threads;
	if (pthread_mutex_init(&p->mu, NULL) != 0) {
		free(p);
		return -ENOMEM;
	}
	if (n_threads > 1) {
		p->threads = calloc(n_threads - 1, sizeof(pthread_t));
		if (p->threads == NULL) {
			kiln_pool_free(p);
			return -ENOMEM;
		}
	}
	/* Workers start with every signal blocked: handlers run on the
	 * application's own threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* kernels keep scratches of up to 1.2 MiB on the stack of the thread
	 * that runs them: workers get POOL_STACK whatever RLIMIT_STACK says */
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, POOL_STACK);
	int rc = 0;
	for (unsigned i = 0; i + 1 < n_threads; i++) {
		if (pthread_create(&p->threads[i], &attr, worker_main, p) !=
		    0) {
			rc = -EAGAIN;
			break;
		}
		char name[16];
		snprintf(name, sizeof(name), "kiln-pool-%u", i + 1);
		pthread_setname_np(p->threads[i], name);
		p->n_workers++;
	}
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		kiln_pool_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

void kiln_pool_free(kiln_pool_t *p)
{
	if (p == NULL)
		return;
	atomic_store(&p->stop, true);
	atomic_fetch_add(&p->epoch, 1);
	futex_wake(&p->epoch, INT_MAX);
	for (unsigned i = 0; i < p->n_workers; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static kiln_pool_t *default_pool;

/* Run by every thread of the probe's team: the smallest stack among them
 * (pthread_getattr_np), kept with an atomic min. */
static void stack_probe(void *arg)
{
	_Atomic size_t *least = arg;
	pthread_attr_t attr;
	size_t size = 0;
	void *addr = NULL;
	if (pthread_getattr_np(pthread_self(), &attr) == 0) {
		if (pthread_attr_getstack(&attr, &addr, &size) != 0)
			size = 0;
		pthread_attr_destroy(&attr);
	}
	size_t cur = atomic_load(least);
	while (size < cur && !atomic_compare_exchange_weak(least, &cur, size))
		;
}

/* The OpenMP mode's entry points where KILN_POOL allows it ("auto", the
 * default: a libgomp.so.1 the process has loaded already; "openmp": loaded
 * here if need be; "own": never) and the runtime's team threads have
 * POOL_MIN_STACK; false otherwise. */
static bool find_openmp(unsigned n, gomp_parallel_fn *par, omp_int_fn *max)
{
	const char *mode = getenv("KILN_POOL");
	int flags = RTLD_NOW | RTLD_LOCAL;
	if (mode != NULL && strcmp(mode, "own") == 0)
		return false;
	if (mode == NULL || *mode == '\0' || strcmp(mode, "auto") == 0)
		flags |= RTLD_NOLOAD;
	else if (strcmp(mode, "openmp") != 0)
		return false;
	void *h = dlopen("libgomp.so.1", flags);
	if (h == NULL)
		return false;
	*par = (gomp_parallel_fn)(uintptr_t)dlsym(h, "GOMP_parallel");
	*max = (omp_int_fn)(uintptr_t)dlsym(h, "omp_get_max_threads");
	if (*par == NULL || *max == NULL) {
		dlclose(h);
		return false;
	}
	/* h stays open: the pool calls into it for the process's life */
	unsigned team = n > 0 ? n : (unsigned)(*max)();
	_Atomic size_t least = SIZE_MAX;
	(*par)(stack_probe, (void *)&least, team > 1 ? team : 2, 0);
	return atomic_load(&least) >= POOL_MIN_STACK;
}

static void default_init(void)
{
	unsigned n = 0;
	const char *env = getenv("KILN_THREADS");
	if (env != NULL && *env != '\0') {
		char *end;
		unsigned long v = strtoul(env, &end, 10);
		if (*end == '\0' && v >= 1 && v <= KILN_POOL_MAX_THREADS)
			n = (unsigned)v;
	}
	gomp_parallel_fn par;
	omp_int_fn max;
	if (find_openmp(n, &par, &max)) {
		kiln_pool_t *p = calloc(1, sizeof(*p));
		if (p != NULL && pthread_mutex_init(&p->mu, NULL) == 0) {
			p->n_threads = n;
			p->omp_parallel = par;
			p->omp_max_threads = max;
			default_pool = p;
			return;
		}
		free(p);
	}
	if (kiln_pool_new(n, &default_pool) != 0)
		(void)kiln_pool_new(1, &default_pool);
}

const char *kiln_pool_kind(const kiln_pool_t *p)
{
	if (p == NULL)
		return "none";
	return p->omp_parallel != NULL ? "openmp" : "kiln";
}

static void omp_body(void *arg)
{
	run_pieces(arg);
}

kiln_pool_t *kiln_pool_default(void)
{
	pthread_once(&default_once, default_init);
	return default_pool;
}

unsigned kiln_pool_threads(const kiln_pool_t *p)
{
	if (p == NULL)
		return 1;
	if (p->omp_parallel != NULL && p->n_threads == 0) {
		int n = p->omp_max_threads();
		return n < 1			   ? 1
		       : n > KILN_POOL_MAX_THREADS ? KILN_POOL_MAX_THREADS
						   : (unsigned)n;
	}
	return p->n_threads;
}

void kiln_pool_parallel_for(kiln_pool_t *p, int64_t extent, int64_t grain,
			    kiln_range_fn fn, void *ctx)
{
	if (extent <= 0)
		return;
	if (grain < 1)
		grain = 1;
	int64_t n = extent / grain; /* pieces: each >= grain units */
	int64_t threads = (int64_t)kiln_pool_threads(p);
	if (n > threads)
		n = threads;
	if (n <= 1) {
		fn(ctx, 0, extent);
		return;
	}
	job_t j;
	j.fn = fn;
	j.ctx = ctx;
	j.q = extent / n;
	j.r = extent % n;
	j.n_pieces = (uint32_t)n;
	atomic_init(&j.next, 0);
	atomic_init(&j.state, 0);
	j.succ = NULL;
	if (p->omp_parallel != NULL) {
		/* one region of the OpenMP team; it returns after the
		 * region's barrier, every piece done */
		p->omp_parallel(omp_body, &j, (unsigned)n, 0);
		return;
	}

	pthread_mutex_lock(&p->mu);
	j.prev = p->tail;
	if (p->tail != NULL)
		p->tail->succ = &j;
	else
		p->head = &j;
	p->tail = &j;
	pthread_mutex_unlock(&p->mu);
	atomic_fetch_add(&p->epoch, 1);
	if (atomic_load(&p->sleepers) > 0)
		futex_wake(&p->epoch, (int)n - 1);

	run_pieces(&j);

	pthread_mutex_lock(&p->mu);
	if (j.prev != NULL)
		j.prev->succ = j.succ;
	else
		p->head = j.succ;
	if (j.succ != NULL)
		j.succ->prev = j.prev;
	else
		p->tail = j.prev;
	pthread_mutex_unlock(&p->mu);

	/* Wait for the workers still inside (each finishing a piece). */
	uint64_t t0 = 0;
	for (unsigned k = 1;; k++) {
		if (atomic_load(&j.state) == 0)
			return;
		cpu_relax();
		if ((k & 63) == 0) {
			if (t0 == 0)
				t0 = now_ns();
			else if (now_ns() - t0 > SPIN_NS)
				break;
		}
	}
	atomic_fetch_or(&j.state, WAIT_BIT);
	for (;;) {
		uint32_t v = atomic_load(&j.state);
		if ((v & ~WAIT_BIT) == 0)
			return;
		futex_wait(&j.state, v);
	}
}
