/*
 * testkernels.c — a stand-in for a compiled code object: kernels with the
 * ARTIFACT.md ABI
 *
 *     void k(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
 *
 * built by meson as a plain C shared module (twice: the second build, with
 * -DKILN_TESTKERNELS_V2, differs only in k_version). The unit tests embed
 * its bytes in artifacts. Every kernel works on units [begin, end) only and
 * may run on several threads at once.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#ifdef KILN_TESTKERNELS_V2
#define TESTKERNELS_VERSION 2
#else
#define TESTKERNELS_VERSION 1
#endif

/* The exported kernels (declared for -Wmissing-prototypes). */
void k_add_f32(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_scale2_f32(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_fill_sym(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_record(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_empty(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_version(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
void k_check_align(void **bufs, const int64_t *syms, int64_t begin,
		   int64_t end);
void k_spin(void **bufs, const int64_t *syms, int64_t begin, int64_t end);

/* bufs = {a, b, out} (f32): out[i] = a[i] + b[i]. */
void k_add_f32(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)syms;
	const float *a = bufs[0], *b = bufs[1];
	float *out = bufs[2];
	for (int64_t i = begin; i < end; i++)
		out[i] = a[i] + b[i];
}

/* bufs = {x, out} (f32): out[i] = 2 * x[i] for i < syms[0]; units past
 * syms[0] (a wrong extent) are poisoned with -1. */
void k_scale2_f32(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	const float *x = bufs[0];
	float *out = bufs[1];
	for (int64_t i = begin; i < end; i++)
		out[i] = i < syms[0] ? 2.0f * x[i] : -1.0f;
}

/* bufs = {out} (i64), extent 1: out[i] = syms[1] + i for i < syms[0] — the
 * kernel's size comes from the symbols alone. */
void k_fill_sym(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	int64_t *out = bufs[0];
	if (begin != 0 || end != 1)
		return;
	for (int64_t i = 0; i < syms[0]; i++)
		out[i] = syms[1] + i;
}

/* bufs = {hits (i32 per unit), log (i64)}: counts every unit it is called
 * for, and appends (begin, end) to log[1 ..] with log[0] as the count. */
void k_record(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)syms;
	_Atomic int32_t *hits = bufs[0];
	_Atomic int64_t *log = bufs[1];
	for (int64_t i = begin; i < end; i++)
		atomic_fetch_add_explicit(&hits[i], 1, memory_order_relaxed);
	int64_t k = atomic_fetch_add(&log[0], 1);
	if (k < 64) {
		atomic_store(&log[1 + 2 * k], begin);
		atomic_store(&log[2 + 2 * k], end);
	}
}

/* Does nothing: the dispatch-overhead benchmark. */
void k_empty(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)bufs;
	(void)syms;
	(void)begin;
	(void)end;
}

/* bufs = {out} (i32): out[0] = which build this is. */
void k_version(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)syms;
	(void)begin;
	(void)end;
	*(int32_t *)bufs[0] = TESTKERNELS_VERSION;
}

/* bufs = {p, flags (i32)}: flags[0] = p % 64 (arena alignment check). */
void k_check_align(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)syms;
	(void)begin;
	(void)end;
	((int32_t *)bufs[1])[0] = (int32_t)((uintptr_t)bufs[0] % 64);
}

/* Busy for syms[0] nanoseconds per unit (the benchmark's stand-in for real
 * work, so that a split really runs on two threads). */
void k_spin(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
{
	(void)bufs;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int64_t want = syms[0] * (end - begin);
	do {
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000000000LL +
		     (t.tv_nsec - t0.tv_nsec) <
		 want);
}
