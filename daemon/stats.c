/*
 * stats.c — counters, the compile-latency window, RSS.
 *
 * Counters are plain relaxed atomics in one block per thread (the loop has
 * one, each worker one): a thread only adds to its own block, `status` sums
 * the blocks. The latency window is shared and guarded by a mutex (one
 * lock per compile, not per request).
 *
 * Threads: any.
 */
#include "daemon/kilnd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kilnd_count_error(kilnd_counters_t *c, int code)
{
	int i = code <= -3000 && code > -3032 ? -code - 3000 : 0;
	atomic_fetch_add_explicit(&c->errors[i], 1, memory_order_relaxed);
}

void kilnd_latency_init(kilnd_latency_t *l)
{
	memset(l, 0, sizeof(*l));
	pthread_mutex_init(&l->mu, NULL);
}

void kilnd_latency_add(kilnd_latency_t *l, double ms)
{
	pthread_mutex_lock(&l->mu);
	l->ms[l->next] = ms;
	l->next = (l->next + 1) % 1024;
	if (l->n < 1024)
		l->n++;
	pthread_mutex_unlock(&l->mu);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void kilnd_latency_quantiles(kilnd_latency_t *l, double *p50, double *p90,
			     double *p99)
{
	double v[1024];
	pthread_mutex_lock(&l->mu);
	uint32_t n = l->n;
	memcpy(v, l->ms, n * sizeof(double));
	pthread_mutex_unlock(&l->mu);
	*p50 = *p90 = *p99 = 0;
	if (n == 0)
		return;
	qsort(v, n, sizeof(double), cmp_double);
	/* Nearest rank: the smallest sample with at least q of them at or
	 * below it (ceil(q*n) - 1). */
	*p50 = v[(n * 50 + 99) / 100 - 1];
	*p90 = v[(n * 90 + 99) / 100 - 1];
	*p99 = v[(n * 99 + 99) / 100 - 1];
}

uint64_t kilnd_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "re");
	if (f == NULL)
		return 0;
	unsigned long size = 0, rss = 0;
	int n = fscanf(f, "%lu %lu", &size, &rss);
	fclose(f);
	if (n != 2)
		return 0;
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}
