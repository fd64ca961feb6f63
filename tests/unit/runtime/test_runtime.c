/*
 * test_runtime.c — libkiln's runtime (clients/libkiln): the thread pool,
 * loading code objects from memory, and running artifacts: static and
 * dynamic shapes, the parallel split, arena reuse, concurrent runs, outputs
 * that view inputs, fallback steps, input checks, corrupt code, and the
 * dispatch-overhead benchmark.
 *
 * Every artifact is built in C (helpers.h), packed, decoded and loaded, so
 * each test also exercises the codec. The kernels are testkernels.c.
 */
#include "helpers.h"

#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SO    KILN_TESTKERNELS_SO
#define SO_V2 KILN_TESTKERNELS_V2_SO

static kiln_pool_t *pool_n(unsigned n)
{
	kiln_pool_t *p = NULL;
	cr_assert_eq(kiln_pool_new(n, &p), 0);
	cr_assert_eq(kiln_pool_threads(p), n);
	return p;
}

/* Runs m; asserts success. */
static void run_ok(kiln_module_t *m, const kiln_io_t *in, uint32_t n_in,
		   void **out_bufs, kiln_io_t *outs, const kiln_run_opts_t *o)
{
	char err[512] = "";
	int rc =
	    kiln_module_run(m, in, n_in, out_bufs, outs, o, err, sizeof(err));
	cr_assert_eq(rc, 0, "run failed: %d (%s): %s", rc, kiln_strerror(rc),
		     err);
}

/* Runs m; asserts it fails with code and a message containing needle. */
static void run_err(kiln_module_t *m, const kiln_io_t *in, uint32_t n_in,
		    void **out_bufs, const kiln_run_opts_t *o, int code,
		    const char *needle)
{
	char err[512] = "";
	kiln_io_t outs[8];
	int rc =
	    kiln_module_run(m, in, n_in, out_bufs, outs, o, err, sizeof(err));
	cr_assert_eq(rc, code, "rc %d (%s), expected %d (%s): \"%s\"", rc,
		     kiln_strerror(rc), code, kiln_strerror(code), err);
	ASSERT_MSG_HAS(err, needle);
}

/* out = a + b over [n] f32, n static; the output buffer is output 0. */
static ab_t add_artifact(int64_t n, int64_t grain)
{
	ab_t b = ab_new(SO);
	char shape[32], bytes[32];
	snprintf(shape, sizeof(shape), "%lld", (long long)n);
	snprintf(bytes, sizeof(bytes), "%lld", (long long)n * 4);
	uint32_t x = ab_input(&b, KILN_DT_F32, shape, NULL);
	uint32_t y = ab_input(&b, KILN_DT_F32, shape, NULL);
	uint32_t k = ab_kernel(&b, "k_add_f32", shape, grain, 3);
	uint32_t bx = ab_buf_input(&b, x), by = ab_buf_input(&b, y);
	uint32_t bo = ab_buf_output(&b, bytes);
	ab_kstep(&b, k, 3, bx, by, bo);
	ab_out_ref(&b, ab_view(&b, bo, KILN_DT_F32, shape, "1", "0"));
	ab_arena(&b, "0");
	return b;
}

/* ---- the pool ----------------------------------------------------------- */

typedef struct cover {
	_Atomic int32_t *hits;
	_Atomic int n_calls;
	int64_t grain;
	_Atomic int too_small;
} cover_t;

static void cover_fn(void *ctx, int64_t b, int64_t e)
{
	cover_t *c = ctx;
	if (e - b < c->grain)
		atomic_fetch_add(&c->too_small, 1);
	for (int64_t i = b; i < e; i++)
		atomic_fetch_add(&c->hits[i], 1);
	atomic_fetch_add(&c->n_calls, 1);
}

Test(pool, parallel_for_covers_every_unit_once)
{
	static const int64_t extents[] = {0, 1, 2, 3, 7, 64, 1000, 4097};
	static const int64_t grains[] = {0, 1, 3, 64, 5000};
	static const unsigned threads[] = {1, 2, 3, 8};
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		kiln_pool_t *p = pool_n(threads[t]);
		for (size_t e = 0; e < sizeof(extents) / sizeof(extents[0]);
		     e++) {
			for (size_t g = 0;
			     g < sizeof(grains) / sizeof(grains[0]); g++) {
				int64_t n = extents[e];
				cover_t c = {0};
				c.hits = calloc((size_t)n + 1, sizeof(int32_t));
				c.grain = grains[g] < 1 ? 1 : grains[g];
				kiln_pool_parallel_for(p, n, grains[g],
						       cover_fn, &c);
				for (int64_t i = 0; i < n; i++)
					cr_assert_eq(c.hits[i], 1,
						     "unit %lld of %lld "
						     "(grain %lld, %u threads)",
						     (long long)i, (long long)n,
						     (long long)grains[g],
						     threads[t]);
				int64_t max_pieces = n / c.grain;
				if (max_pieces > threads[t])
					max_pieces = threads[t];
				if (max_pieces < 1)
					max_pieces = 1;
				cr_assert_leq(c.n_calls,
					      n > 0 ? max_pieces : 0);
				if (n >= c.grain)
					cr_assert_eq(c.too_small, 0);
				free(c.hits);
			}
		}
		kiln_pool_free(p);
	}
	kiln_pool_free(NULL);
}

Test(pool, default_pool_is_shared_and_sized)
{
	kiln_pool_t *p = kiln_pool_default();
	cr_assert_not_null(p);
	cr_assert_eq(kiln_pool_default(), p);
	cr_assert_geq(kiln_pool_threads(p), 1);
	cr_assert_eq(kiln_pool_threads(NULL), 1);
	kiln_pool_t *q = NULL;
	cr_assert_eq(kiln_pool_new(KILN_POOL_MAX_THREADS + 1, &q), -EINVAL);
	cr_assert_null(q);
}

/* LeakSanitizer's hook: GNU OpenMP keeps 8 bytes per process it never
 * frees (its team's bookkeeping, malloc'ed at the first parallel region),
 * which the OpenMP-mode tests load. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return "leak:libgomp.so\n";
}

/* Records, from each piece, whether a thread of kiln's own pool ran it
 * (named kiln-pool-N), on top of cover_fn. */
typedef struct whorun {
	cover_t c;
	_Atomic int own, others;
} whorun_t;

static void whorun_fn(void *ctx, int64_t b, int64_t e)
{
	whorun_t *w = ctx;
	char name[16] = "";
	pthread_getname_np(pthread_self(), name, sizeof(name));
	if (strncmp(name, "kiln-pool", 9) == 0)
		atomic_fetch_add(&w->own, 1);
	else
		atomic_fetch_add(&w->others, 1);
	struct timespec ts = {0, 200000}; /* 0.2 ms: every thread gets one */
	nanosleep(&ts, NULL);
	cover_fn(&w->c, b, e);
}

/* Runs a range of n units in pieces of grain 1 on the default pool; every
 * unit once; *own and *others: the pieces run by kiln's threads and by
 * any other thread (the caller's, an OpenMP team's). */
static void run_default(int64_t n, int *own, int *others)
{
	whorun_t w;
	memset(&w, 0, sizeof(w));
	w.c.hits = calloc((size_t)n, sizeof(int32_t));
	w.c.grain = 1;
	kiln_pool_parallel_for(kiln_pool_default(), n, 1, whorun_fn, &w);
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(w.c.hits[i], 1, "unit %lld ran %d times",
			     (long long)i, (int)w.c.hits[i]);
	free(w.c.hits);
	*own = w.own;
	*others = w.others;
}

/* Whether libgomp.so.1 can be loaded here (the Debian package libgomp1);
 * it stays loaded (unloaded, its leak would lose its name). */
static bool have_libgomp(void)
{
	return dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL) != NULL;
}

/* KILN_POOL=openmp: the default pool runs its ranges as parallel regions
 * of GNU OpenMP (torch's threads, in a torch process), on that runtime's
 * team, not on threads of its own; KILN_THREADS sizes the team. */
Test(pool, openmp_mode_runs_ranges_on_the_openmp_team)
{
	if (!have_libgomp()) {
		cr_skip_test("libgomp.so.1 is not installed: no OpenMP mode "
			     "to test");
	}
	setenv("KILN_POOL", "openmp", 1);
	setenv("KILN_THREADS", "3", 1);
	kiln_pool_t *p = kiln_pool_default();
	cr_assert_str_eq(kiln_pool_kind(p), "openmp");
	cr_assert_eq(kiln_pool_threads(p), 3);
	int own, others;
	run_default(12, &own, &others);
	cr_expect_eq(own, 0);
	cr_expect_eq(others, 3, "3 pieces of 12 units on a team of 3");
	run_default(1, &own, &others); /* under a grain: inline */
	cr_expect_eq(others, 1);
	cr_assert_str_eq(kiln_pool_kind(NULL), "none");
}

/* KILN_POOL=own, or auto in a process without GNU OpenMP loaded, or an
 * OpenMP team whose threads have stacks under 4 MiB (kernels keep
 * scratches of up to 1.2 MiB there), or a value KILN_POOL does not take:
 * kiln's own pool. */
Test(pool, own_pool_where_openmp_is_not_asked_for_or_unfit)
{
	static const struct {
		const char *pool, *stack;
	} cs[] = {
	    {"own", NULL}, {"auto", NULL}, {"openmp", "1M"}, {"omp", NULL}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		if (i == 1 && dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD))
			continue; /* loaded already: auto would take it */
		/* each case in a child of its own, libgomp not loaded yet
		 * (it reads OMP_STACKSIZE when it loads); without libgomp
		 * installed, "openmp" is kiln's own pool as well */
		pid_t pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0) {
			setenv("KILN_POOL", cs[i].pool, 1);
			setenv("KILN_THREADS", "2", 1);
			if (cs[i].stack != NULL)
				setenv("OMP_STACKSIZE", cs[i].stack, 1);
			kiln_pool_t *p = kiln_pool_default();
			int own = 0, others = 0;
			run_default(8, &own, &others);
			_exit(strcmp(kiln_pool_kind(p), "kiln") == 0 &&
				      kiln_pool_threads(p) == 2 &&
				      own + others == 2
				  ? 0
				  : 1);
		}
		int st = 0;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			  "KILN_POOL=%s%s%s: not kiln's own pool of 2",
			  cs[i].pool, cs[i].stack ? ", OMP_STACKSIZE=" : "",
			  cs[i].stack ? cs[i].stack : "");
	}
}

/* Several threads submitting to one pool at once. */
typedef struct submitter {
	kiln_pool_t *pool;
	int ok;
} submitter_t;

static void *submit_main(void *arg)
{
	submitter_t *s = arg;
	s->ok = 1;
	for (int r = 0; r < 200; r++) {
		cover_t c = {0};
		int64_t n = 1000 + r;
		c.hits = calloc((size_t)n, sizeof(int32_t));
		c.grain = 10;
		kiln_pool_parallel_for(s->pool, n, 10, cover_fn, &c);
		for (int64_t i = 0; i < n; i++)
			if (c.hits[i] != 1)
				s->ok = 0;
		free(c.hits);
	}
	return NULL;
}

Test(pool, concurrent_submitters)
{
	kiln_pool_t *p = pool_n(3);
	pthread_t th[4];
	submitter_t s[4];
	for (int i = 0; i < 4; i++) {
		s[i].pool = p;
		cr_assert_eq(pthread_create(&th[i], NULL, submit_main, &s[i]),
			     0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert(s[i].ok, "submitter %d saw a unit not run once", i);
	}
	kiln_pool_free(p);
}

/* ---- static shapes ------------------------------------------------------ */

Test(run, static_add_runtime_allocates_outputs)
{
	ab_t b = add_artifact(1000, 256);
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	cr_assert_eq(kiln_module_n_inputs(m), 2);
	cr_assert_eq(kiln_module_n_outputs(m), 1);
	cr_assert_eq(kiln_module_n_out_buffers(m), 1);
	cr_assert_not_null(kiln_module_kernel(m, 0));
	cr_assert_null(kiln_module_kernel(m, 1));
	float x[1000], y[1000];
	for (int i = 0; i < 1000; i++)
		x[i] = (float)i, y[i] = 0.5f * (float)i;
	kiln_io_t in[2] = {IOT(x, KILN_DT_F32, 1000),
			   IOT(y, KILN_DT_F32, 1000)};
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	run_ok(m, in, 2, ob, out, NULL);
	cr_assert_not_null(ob[0]);
	cr_assert_eq((uintptr_t)ob[0] % 64, 0);
	cr_assert_eq(out[0].kind, KILN_IO_TENSOR);
	cr_assert_eq(out[0].t.data, ob[0]);
	cr_assert_eq(out[0].t.dtype, KILN_DT_F32);
	cr_assert_eq(out[0].t.rank, 1);
	cr_assert_eq(out[0].t.sizes[0], 1000);
	cr_assert_eq(out[0].t.strides[0], 1);
	const float *o = ob[0];
	for (int i = 0; i < 1000; i++)
		cr_assert_float_eq(o[i], 1.5f * (float)i, 0);
	free(ob[0]);
	kiln_module_stats_t st;
	kiln_module_stats(m, &st);
	cr_assert_eq(st.runs, 1);
	cr_assert_eq(st.failed_runs, 0);
	kiln_module_free(m);
	kiln_module_free(NULL);
	kiln_artifact_free(NULL);
}

Test(run, caller_provided_output_buffers)
{
	ab_t b = add_artifact(100, 1);
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float x[100], y[100], o[100];
	for (int i = 0; i < 100; i++)
		x[i] = 1, y[i] = (float)i, o[i] = -7;
	kiln_io_t in[2] = {IOT(x, KILN_DT_F32, 100), IOT(y, KILN_DT_F32, 100)};
	size_t sizes[1] = {0};
	char err[256];
	cr_assert_eq(kiln_module_out_sizes(m, in, 2, sizes, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(sizes[0], 400);
	void *ob[1] = {o};
	kiln_io_t out[1];
	kiln_pool_t *p = pool_n(2);
	kiln_run_opts_t opts = {.pool = p};
	run_ok(m, in, 2, ob, out, &opts);
	cr_assert_eq(ob[0], (void *)o, "a caller buffer is kept");
	cr_assert_eq(out[0].t.data, (void *)o);
	for (int i = 0; i < 100; i++)
		cr_assert_float_eq(o[i], 1.0f + (float)i, 0);
	kiln_module_free(m);
	kiln_pool_free(p);
}

/* ---- dynamic shapes ----------------------------------------------------- */

Test(run, dynamic_size_bound_from_an_input_dim)
{
	ab_t b = ab_new(SO);
	ab_sym(&b, "s0", 2, 1 << 20, 0, 0);
	uint32_t x = ab_input(&b, KILN_DT_F32, "s0", NULL);
	uint32_t k = ab_kernel(&b, "k_scale2_f32", "s0", 64, 2);
	uint32_t bx = ab_buf_input(&b, x);
	uint32_t bo = ab_buf_output(&b, "4*s0");
	ab_kstep(&b, k, 2, bx, bo);
	ab_out_ref(&b, ab_view(&b, bo, KILN_DT_F32, "s0", "1", "0"));
	ab_out_sym(&b, "s0*3 + 1");
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	kiln_pool_t *p = pool_n(2);
	kiln_run_opts_t opts = {.pool = p};
	static const int64_t ns[] = {2, 10, 1000, 65537};
	for (size_t t = 0; t < sizeof(ns) / sizeof(ns[0]); t++) {
		int64_t n = ns[t];
		float *xs = malloc(sizeof(float) * (size_t)n);
		for (int64_t i = 0; i < n; i++)
			xs[i] = (float)i;
		kiln_io_t in[1] = {IOT(xs, KILN_DT_F32, n)};
		size_t sz[1];
		char err[256];
		cr_assert_eq(
		    kiln_module_out_sizes(m, in, 1, sz, err, sizeof(err)), 0);
		cr_assert_eq(sz[0], (size_t)n * 4);
		void *ob[1] = {NULL};
		kiln_io_t out[2];
		run_ok(m, in, 1, ob, out, &opts);
		cr_assert_eq(out[0].t.sizes[0], n);
		cr_assert_eq(out[1].kind, KILN_IO_INT);
		cr_assert_eq(out[1].i, n * 3 + 1);
		const float *o = ob[0];
		for (int64_t i = 0; i < n; i++)
			cr_assert_float_eq(o[i], 2.0f * (float)i, 0,
					   "n=%lld i=%lld", (long long)n,
					   (long long)i);
		free(ob[0]);
		free(xs);
	}
	kiln_module_free(m);
	kiln_pool_free(p);
}

Test(run, dynamic_size_bound_from_symint_inputs)
{
	ab_t b = ab_new(SO);
	/* s0 from int input 0, s1 from int input 1; a tensor input of
	 * [s0, 2] rides along and must agree */
	ab_sym(&b, "s0", 1, 4096, 0, -1);
	ab_sym(&b, "s1", 0, -1, 1, -1);
	ab_input_int(&b, "s0");
	ab_input_int(&b, "s1");
	ab_input(&b, KILN_DT_F32, "s0, 2", NULL);
	ab_input_int(&b, "s0 + s1"); /* an int input that is an expression */
	uint32_t k = ab_kernel(&b, "k_fill_sym", "1", 1, 1);
	uint32_t bo = ab_buf_output(&b, "8*s0");
	ab_kstep(&b, k, 1, bo);
	ab_out_ref(&b, ab_view(&b, bo, KILN_DT_I64, "s0", "1", "0"));
	ab_out_ref(&b, ab_view(&b, ab_buf_input(&b, 2), KILN_DT_F32, "2, s0",
			       "1, 2", "0"));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float t[2 * 37];
	kiln_io_t in[4] = {io_int(37), io_int(100), IOT(t, KILN_DT_F32, 37, 2),
			   io_int(137)};
	void *ob[1] = {NULL};
	kiln_io_t out[2];
	run_ok(m, in, 4, ob, out, NULL);
	const int64_t *o = ob[0];
	for (int i = 0; i < 37; i++)
		cr_assert_eq(o[i], 100 + i);
	cr_assert_eq(out[0].t.sizes[0], 37);
	/* the second output is a transposed view of input 2 */
	cr_assert_eq(out[1].t.data, (void *)t);
	cr_assert_eq(out[1].t.sizes[0], 2);
	cr_assert_eq(out[1].t.sizes[1], 37);
	cr_assert_eq(out[1].t.strides[0], 1);
	cr_assert_eq(out[1].t.strides[1], 2);
	free(ob[0]);

	in[3] = io_int(136);
	void *ob2[1] = {NULL};
	run_err(m, in, 4, ob2, NULL, KILN_EINVGRAPH,
		"input 3: int 136 but the artifact expects 137");
	cr_assert_null(ob2[0]);
	in[3] = io_int(137);
	in[2] = IOT(t, KILN_DT_F32, 36, 2);
	run_err(m, in, 4, ob2, NULL, KILN_EINVGRAPH,
		"input 2: sizes [36, 2] but the artifact was compiled for "
		"[37, 2]");
	kiln_module_free(m);
}

/* ---- the parallel split -------------------------------------------------- */

/* One k_record step over `extent` with `grain`; returns the log. */
static void record_split(kiln_pool_t *p, int64_t extent, int64_t grain,
			 int64_t *log, int32_t *hits)
{
	ab_t b = ab_new(SO);
	char ext[32];
	snprintf(ext, sizeof(ext), "%lld", (long long)extent);
	uint32_t k = ab_kernel(&b, "k_record", ext, grain, 2);
	uint32_t bh = ab_buf_input(&b, ab_input(&b, KILN_DT_I32, ext, NULL));
	uint32_t bl = ab_buf_input(&b, ab_input(&b, KILN_DT_I64, "129", NULL));
	ab_kstep(&b, k, 2, bh, bl);
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	kiln_io_t in[2] = {IOT(hits, KILN_DT_I32, extent),
			   IOT(log, KILN_DT_I64, 129)};
	kiln_run_opts_t opts = {.pool = p};
	run_ok(m, in, 2, NULL, NULL, &opts);
	kiln_module_free(m);
}

static int cmp_range(const void *x, const void *y)
{
	const int64_t *a = x, *b = y;
	return a[0] < b[0] ? -1 : a[0] > b[0];
}

Test(run, parallel_split_covers_the_extent_exactly_once)
{
	static const struct {
		int64_t extent, grain;
		unsigned threads, pieces;
	} cases[] = {
	    {(1 << 20) + 3, 1000, 2, 2},
	    {(1 << 20) + 3, 1000, 4, 4},
	    {(1 << 20) + 3, 1000, 7, 7},
	    {5000, 2000, 4, 2},
	    {100, 100, 4, 1},
	    {101, 100, 4, 1},
	    {3, 1, 8, 3},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int64_t n = cases[c].extent;
		kiln_pool_t *p = pool_n(cases[c].threads);
		int64_t log[129] = {0};
		int32_t *hits = calloc((size_t)n, sizeof(int32_t));
		record_split(p, n, cases[c].grain, log, hits);
		for (int64_t i = 0; i < n; i++)
			cr_assert_eq(hits[i], 1,
				     "case %zu: unit %lld ran %d times", c,
				     (long long)i, hits[i]);
		cr_assert_eq(log[0], cases[c].pieces, "case %zu: %lld pieces",
			     c, (long long)log[0]);
		/* contiguous pieces, each >= grain, tiling [0, n) */
		qsort(&log[1], (size_t)log[0], 2 * sizeof(int64_t), cmp_range);
		int64_t at = 0;
		for (int64_t k = 0; k < log[0]; k++) {
			cr_assert_eq(log[1 + 2 * k], at);
			cr_assert_geq(log[2 + 2 * k] - log[1 + 2 * k],
				      n < cases[c].grain ? n : cases[c].grain);
			at = log[2 + 2 * k];
		}
		cr_assert_eq(at, n);
		free(hits);
		kiln_pool_free(p);
	}
}

Test(run, parallel_add_over_2m_elements_default_pool)
{
	int64_t n = (1 << 21) + 17;
	ab_t b = add_artifact(n, 4096);
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float *x = malloc(sizeof(float) * (size_t)n);
	float *y = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(i % 1000), y[i] = (float)(i % 7);
	kiln_io_t in[2] = {IOT(x, KILN_DT_F32, n), IOT(y, KILN_DT_F32, n)};
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	run_ok(m, in, 2, ob, out, NULL);
	const float *o = ob[0];
	for (int64_t i = 0; i < n; i++)
		if (o[i] != (float)(i % 1000) + (float)(i % 7))
			cr_assert_fail("element %lld", (long long)i);
	free(ob[0]);
	free(x);
	free(y);
	kiln_module_free(m);
}

/* ---- the scratch arena -------------------------------------------------- */

/* tmp(arena) = a + b; out = 2 * tmp; a check of the arena's alignment. */
static kiln_module_t *arena_module(void)
{
	ab_t b = ab_new(SO);
	ab_sym(&b, "s0", 1, -1, 0, 0);
	uint32_t x = ab_input(&b, KILN_DT_F32, "s0", NULL);
	uint32_t y = ab_input(&b, KILN_DT_F32, "s0", NULL);
	uint32_t kadd = ab_kernel(&b, "k_add_f32", "s0", 1024, 3);
	uint32_t ksc = ab_kernel(&b, "k_scale2_f32", "s0", 1024, 2);
	uint32_t kal = ab_kernel(&b, "k_check_align", "1", 1, 2);
	uint32_t bx = ab_buf_input(&b, x), by = ab_buf_input(&b, y);
	uint32_t bt = ab_buf_arena(&b, "64", "4*s0");
	uint32_t bo = ab_buf_output(&b, "4*s0");
	uint32_t bf = ab_buf_output(&b, "4");
	ab_kstep(&b, kadd, 3, bx, by, bt);
	ab_kstep(&b, ksc, 2, bt, bo);
	ab_kstep(&b, kal, 2, bt, bf);
	ab_out_ref(&b, ab_view(&b, bo, KILN_DT_F32, "s0", "1", "0"));
	ab_out_ref(&b, ab_view(&b, bf, KILN_DT_I32, "", "", "0"));
	ab_arena(&b, "64 + 4*s0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	return m;
}

static void arena_run(kiln_module_t *m, int64_t n, const kiln_run_opts_t *o)
{
	float *x = malloc(sizeof(float) * (size_t)n);
	float *y = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)i, y[i] = 1;
	kiln_io_t in[2] = {IOT(x, KILN_DT_F32, n), IOT(y, KILN_DT_F32, n)};
	void *ob[2] = {NULL, NULL};
	kiln_io_t out[2];
	run_ok(m, in, 2, ob, out, o);
	const float *r = out[0].t.data;
	for (int64_t i = 0; i < n; i++)
		if (r[i] != 2.0f * ((float)i + 1))
			cr_assert_fail("n=%lld: element %lld is %f",
				       (long long)n, (long long)i, r[i]);
	cr_assert_eq(out[1].t.rank, 0);
	cr_assert_eq(*(const int32_t *)out[1].t.data, 0,
		     "arena buffer not 64-byte aligned");
	free(ob[0]);
	free(ob[1]);
	free(x);
	free(y);
}

Test(run, arena_is_reused_across_runs)
{
	kiln_module_t *m = arena_module();
	kiln_module_stats_t st;
	for (int r = 0; r < 5; r++)
		arena_run(m, 1000, NULL);
	kiln_module_stats(m, &st);
	cr_assert_eq(st.runs, 5);
	cr_assert_eq(st.contexts, 1, "one context for sequential runs");
	cr_assert_eq(st.arena_allocs, 1, "the arena is allocated once");
	arena_run(m, 100000, NULL); /* grows */
	arena_run(m, 10, NULL);	    /* fits */
	arena_run(m, 100000, NULL);
	kiln_module_stats(m, &st);
	cr_assert_eq(st.arena_allocs, 2);
	cr_assert_eq(st.contexts, 1);
	kiln_module_free(m);
}

typedef struct runner {
	kiln_module_t *m;
	kiln_pool_t *pool;
	int id;
} runner_t;

static void *runner_main(void *arg)
{
	runner_t *r = arg;
	kiln_run_opts_t o = {.pool = r->pool};
	for (int i = 0; i < 60; i++)
		arena_run(r->m, 1000 + 997 * ((i + r->id) % 7), &o);
	return NULL;
}

Test(run, two_threads_run_one_module_at_once)
{
	kiln_module_t *m = arena_module();
	kiln_pool_t *p = pool_n(2);
	pthread_t th[2];
	runner_t r[2] = {{m, p, 0}, {m, p, 3}};
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, runner_main, &r[i]),
			     0);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	kiln_module_stats_t st;
	kiln_module_stats(m, &st);
	cr_assert_eq(st.runs, 120);
	cr_assert_eq(st.failed_runs, 0);
	cr_assert_geq(st.contexts, 1);
	cr_assert_leq(st.contexts, 2, "at most one context per runner");
	kiln_module_free(m);
	kiln_pool_free(p);
}

/* ---- outputs that view inputs; no code at all --------------------------- */

Test(run, output_views_of_an_input_without_code)
{
	ab_t b = ab_new(NULL); /* no kernels: nothing to dlopen */
	uint32_t x = ab_input(&b, KILN_DT_F64, "4, 6", NULL);
	uint32_t bx = ab_buf_input(&b, x);
	ab_out_ref(&b, ab_view(&b, bx, KILN_DT_F64, "6, 4", "1, 6", "0"));
	ab_out_ref(&b, ab_view(&b, bx, KILN_DT_F64, "2, 3", "6, 2", "7"));
	ab_out_ref(&b, ab_view(&b, bx, KILN_DT_F64, "0, 6", "6, 1", "24"));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	double d[24];
	kiln_io_t in[1] = {IOT(d, KILN_DT_F64, 4, 6)};
	kiln_io_t out[3];
	run_ok(m, in, 1, NULL, out, NULL);
	cr_assert_eq(out[0].t.data, (void *)d);
	cr_assert_eq(out[0].t.sizes[0], 6);
	cr_assert_eq(out[0].t.strides[1], 6);
	cr_assert_eq(out[1].t.data, (void *)&d[7]);
	cr_assert_eq(out[2].t.data, (void *)&d[24], "empty view at the end");
	kiln_module_free(m);
}

Test(run, a_view_outside_its_buffer_is_refused)
{
	ab_t b = ab_new(NULL);
	uint32_t x = ab_input(&b, KILN_DT_F32, "4, 6", NULL);
	uint32_t bx = ab_buf_input(&b, x);
	ab_out_ref(&b, ab_view(&b, bx, KILN_DT_F32, "4, 6", "6, 1", "1"));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float d[24];
	kiln_io_t in[1] = {IOT(d, KILN_DT_F32, 4, 6)};
	run_err(m, in, 1, NULL, NULL, KILN_EINVGRAPH,
		"view 0: needs 100 bytes of buffer 0, which has 96");
	kiln_module_free(m);
}

/* ---- fallback steps ----------------------------------------------------- */

typedef struct fb_log {
	int calls;
	uint32_t step;
	int fail;
} fb_log_t;

/* A test double for torch: "aten.mul.Scalar"-like, views[out] =
 * views[args[0]] * args[1]; checks what the step carries. */
static int fb_double(void *user, const kiln_artifact_t *a, uint32_t s,
		     const kiln_tensor_t *views, char *err, size_t errlen)
{
	fb_log_t *log = user;
	log->calls++;
	log->step = s;
	if (log->fail)
		return kiln__errf(err, errlen, KILN_EINVGRAPH, "torch said no");
	const kiln_art_step_t *st = &a->steps[s];
	cr_assert_eq(st->kind, KILN_STEP_FALLBACK);
	cr_assert_str_eq(st->op, "aten.mul.Scalar");
	cr_assert_eq(st->n_args, 3);
	cr_assert_eq(st->args[2].u.list[1].kind, KILN_ARG_REF);
	cr_assert_eq(st->n_kwargs, 2);
	cr_assert_str_eq(st->kwargs[0].key, "alpha");
	cr_assert_str_eq(st->kwargs[1].key, "mode");
	const kiln_tensor_t *in = &views[st->args[0].u.ref];
	const kiln_tensor_t *out = &views[st->out[0]];
	cr_assert_eq(in->dtype, KILN_DT_F32);
	cr_assert_eq(in->sizes[0], out->sizes[0]);
	for (int64_t i = 0; i < in->sizes[0]; i++)
		((float *)out->data)[i] =
		    ((const float *)in->data)[i] * (float)st->args[1].u.f;
	return 0;
}

/* x -> k_add(x, x) -> arena t -> fallback t * 2.5 -> arena u ->
 * k_scale2(u) -> out : out = 2 * 2.5 * 2x = 10x */
static kiln_module_t *fallback_module(void)
{
	ab_t b = ab_new(SO);
	ab_sym(&b, "s0", 1, -1, 0, 0);
	uint32_t x = ab_input(&b, KILN_DT_F32, "s0", NULL);
	uint32_t kadd = ab_kernel(&b, "k_add_f32", "s0", 64, 3);
	uint32_t ksc = ab_kernel(&b, "k_scale2_f32", "s0", 64, 2);
	uint32_t bx = ab_buf_input(&b, x);
	uint32_t bt = ab_buf_arena(&b, "0", "4*s0");
	uint32_t bu = ab_buf_arena(&b, "(4*s0 + 63)//64*64", "4*s0");
	uint32_t bo = ab_buf_output(&b, "4*s0");
	uint32_t vt = ab_view(&b, bt, KILN_DT_F32, "s0", "1", "0");
	uint32_t vu = ab_view(&b, bu, KILN_DT_F32, "s0", "1", "0");
	uint32_t vo = ab_view(&b, bo, KILN_DT_F32, "s0", "1", "0");
	ab_kstep(&b, kadd, 3, bx, bx, bt);
	ab_fstep(&b, 7, "aten.mul.Scalar", vt, vu);
	ab_kstep(&b, ksc, 2, bu, bo);
	ab_out_ref(&b, vo);
	ab_arena(&b, "(4*s0 + 63)//64*64 + 4*s0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	return m;
}

Test(run, fallback_step_runs_the_callback)
{
	kiln_module_t *m = fallback_module();
	float x[300];
	for (int i = 0; i < 300; i++)
		x[i] = (float)i;
	kiln_io_t in[1] = {IOT(x, KILN_DT_F32, 300)};
	fb_log_t log = {0};
	kiln_run_opts_t o = {.fallback = fb_double, .fallback_user = &log};
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	run_ok(m, in, 1, ob, out, &o);
	cr_assert_eq(log.calls, 1);
	cr_assert_eq(log.step, 1);
	for (int i = 0; i < 300; i++)
		cr_assert_float_eq(((float *)ob[0])[i], 10.0f * (float)i, 1e-4);
	free(ob[0]);
	kiln_module_stats_t st;
	kiln_module_stats(m, &st);
	cr_assert_eq(st.fallbacks, 1);
	kiln_module_free(m);
}

/* Records the symbols kiln_fallback_syms shows the callback, then runs
 * fb_double. */
static int64_t seen_syms[4];
static uint32_t seen_n;
static int fb_syms(void *user, const kiln_artifact_t *a, uint32_t s,
		   const kiln_tensor_t *views, char *err, size_t errlen)
{
	const int64_t *sy = kiln_fallback_syms(&seen_n);
	cr_assert_not_null(sy);
	cr_assert_eq(seen_n, a->n_symbols);
	for (uint32_t i = 0; i < seen_n && i < 4; i++)
		seen_syms[i] = sy[i];
	return fb_double(user, a, s, views, err, errlen);
}

Test(run, fallback_sees_the_runs_symbols)
{
	kiln_module_t *m = fallback_module();
	uint32_t n = 7;
	cr_assert_null(kiln_fallback_syms(&n), "outside a callback");
	cr_assert_eq(n, 0);
	for (int64_t len = 5; len <= 300; len += 295) {
		float x[300];
		for (int i = 0; i < len; i++)
			x[i] = (float)i;
		kiln_io_t in[1] = {IOT(x, KILN_DT_F32, len)};
		fb_log_t log = {0};
		kiln_run_opts_t o = {.fallback = fb_syms,
				     .fallback_user = &log};
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		run_ok(m, in, 1, ob, out, &o);
		cr_assert_eq(seen_n, 1);
		cr_assert_eq(seen_syms[0], len, "s0 bound to %lld, saw %lld",
			     (long long)len, (long long)seen_syms[0]);
		free(ob[0]);
	}
	cr_assert_null(kiln_fallback_syms(NULL), "cleared after the call");
	kiln_module_free(m);
}

Test(run, fallback_step_without_callback_or_failing)
{
	kiln_module_t *m = fallback_module();
	float x[10] = {0};
	kiln_io_t in[1] = {IOT(x, KILN_DT_F32, 10)};
	void *ob[1] = {NULL};
	run_err(m, in, 1, ob, NULL, KILN_EUNSUPOP,
		"step 1: fallback op aten.mul.Scalar (node 7) needs a "
		"fallback callback");
	cr_assert_null(ob[0], "runtime-allocated buffers are freed on error");
	fb_log_t log = {.fail = 1};
	kiln_run_opts_t o = {.fallback = fb_double, .fallback_user = &log};
	run_err(m, in, 1, ob, &o, KILN_EINVGRAPH,
		"step 1 (node 7, aten.mul.Scalar): torch said no");
	cr_assert_null(ob[0]);
	kiln_module_stats_t st;
	kiln_module_stats(m, &st);
	cr_assert_eq(st.failed_runs, 2);
	kiln_module_free(m);
}

/* ---- input checks ------------------------------------------------------- */

Test(run, input_mismatches_are_reported)
{
	ab_t b = ab_new(SO);
	ab_sym(&b, "s0", 2, 8, 1, 1);
	uint32_t x = ab_input(&b, KILN_DT_F32, "2, 4", "1, 2");
	uint32_t y = ab_input(&b, KILN_DT_F32, "3, s0", NULL);
	uint32_t k = ab_kernel(&b, "k_empty", "1", 1, 2);
	ab_kstep(&b, k, 2, ab_buf_input(&b, x), ab_buf_input(&b, y));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float d[64];
	kiln_io_t in[2] = {IOT(d, KILN_DT_F32, 2, 4),
			   IOT(d, KILN_DT_F32, 3, 5)};
	in[0].t.strides[0] = 1;
	in[0].t.strides[1] = 2;
	run_ok(m, in, 2, NULL, NULL, NULL);

	run_err(m, in, 1, NULL, NULL, KILN_EINVGRAPH,
		"1 inputs given, the artifact takes 2");
	kiln_io_t bad[2] = {in[0], in[1]};
	bad[0].t.dtype = KILN_DT_F16;
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 0: dtype f16 but the artifact was compiled for f32");
	bad[0] = IOT(d, KILN_DT_F32, 8);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 0: rank 1 but the artifact was compiled for rank 2");
	bad[0] = io_int(3);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 0: an int but the artifact takes a tensor");
	bad[0] = IOT(d, KILN_DT_F32, 2, 3);
	bad[0].t.strides[0] = 1;
	bad[0].t.strides[1] = 2;
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 0: sizes [2, 3] but the artifact was compiled for "
		"[2, 4]");
	bad[0] = IOT(d, KILN_DT_F32, 2, 4);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 0: strides [4, 1] but the artifact was compiled for "
		"[1, 2]");
	bad[0] = in[0];
	bad[0].t.data = NULL;
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH, "input 0: data is NULL");
	bad[0] = in[0];
	bad[1] = IOT(d, KILN_DT_F32, 3, 1);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"symbol s0 = 1 (input 1 size 1) is below its minimum 2");
	bad[1] = IOT(d, KILN_DT_F32, 3, 9);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"symbol s0 = 9 (input 1 size 1) is above its maximum 8");
	bad[1] = IOT(d, KILN_DT_F32, 4, 5);
	run_err(m, bad, 2, NULL, NULL, KILN_EINVGRAPH,
		"input 1: sizes [4, 5] but the artifact was compiled for "
		"[3, 5]");
	bad[1] = IOT(d, KILN_DT_F32, 3, 2); /* s0 at its minimum */
	run_ok(m, bad, 2, NULL, NULL, NULL);
	kiln_module_stats_t st;
	kiln_module_stats(m, &st);
	cr_assert_eq(st.failed_runs, 10);
	cr_assert_eq(st.runs, 2);
	kiln_module_free(m);
}

Test(run, size_one_and_empty_dims_ignore_strides)
{
	ab_t b = ab_new(NULL);
	ab_sym(&b, "s0", 0, -1, 0, 0);
	uint32_t x = ab_input(&b, KILN_DT_F32, "s0, 1, 3", NULL);
	ab_out_ref(&b, ab_view(&b, ab_buf_input(&b, x), KILN_DT_F32, "s0, 1, 3",
			       "3, 3, 1", "0"));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	float d[12];
	kiln_io_t in[1] = {IOT(d, KILN_DT_F32, 4, 1, 3)};
	in[0].t.strides[1] = 999; /* size-1 dim: any stride */
	kiln_io_t out[1];
	run_ok(m, in, 1, NULL, out, NULL);
	in[0] = IOT(NULL, KILN_DT_F32, 0, 1, 3); /* empty: NULL data is fine */
	in[0].t.strides[2] = 5;
	run_ok(m, in, 1, NULL, out, NULL);
	cr_assert_eq(out[0].t.sizes[0], 0);
	kiln_module_free(m);
}

/* ---- loading ------------------------------------------------------------ */

static int load_code(const uint8_t *code, size_t n, const char *kernel,
		     char *err, size_t errlen)
{
	ab_t b = ab_new(NULL);
	b.a->code = code;
	b.a->code_len = n;
	uint32_t k = ab_kernel(&b, kernel, "1", 1, 0);
	ab_kstep(&b, k, 0);
	ab_arena(&b, "0");
	kiln_artifact_t *a = NULL;
	int rc = ab_decode(&b, &a, err, errlen);
	ab_free(&b);
	cr_assert_eq(rc, 0, "%s", err);
	kiln_module_t *m = (kiln_module_t *)(uintptr_t)1;
	rc = kiln_module_from_artifact(a, &m, err, errlen);
	if (rc == 0)
		kiln_module_free(m);
	else
		cr_assert_null(m);
	return rc;
}

Test(load, corrupt_code_objects_are_refused_cleanly)
{
	size_t n;
	uint8_t *so = read_file(SO, &n);
	char err[512];
	cr_assert_eq(load_code(so, n, "k_empty", err, sizeof(err)), 0, "%s",
		     err);

	uint8_t junk[256];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	cr_assert_eq(load_code(junk, sizeof(junk), "k_empty", err, sizeof(err)),
		     KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "not an ELF file");
	cr_assert_eq(load_code(so, 20, "k_empty", err, sizeof(err)),
		     KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "too short for an ELF header");
	/* truncated inside the loaded segments: refused before dlopen, which
	 * would otherwise fault on pages past the end of the file */
	Elf64_Ehdr eh;
	memcpy(&eh, so, sizeof(eh));
	size_t seg_end = 0;
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;
		memcpy(&ph, so + eh.e_phoff + i * sizeof(ph), sizeof(ph));
		if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > seg_end)
			seg_end = ph.p_offset + ph.p_filesz;
	}
	cr_assert_gt(seg_end, 64);
	for (size_t cut = 64; cut < seg_end; cut += seg_end / 7 + 1) {
		int rc = load_code(so, cut, "k_empty", err, sizeof(err));
		cr_assert_eq(rc, KILN_EINVGRAPH, "cut at %zu: %s", cut, err);
		ASSERT_MSG_HAS(err, "outside");
	}
	/* a header dlopen itself refuses: the loader's message is quoted */
	uint8_t *bad = malloc(n);
	memcpy(bad, so, n);
	bad[EI_VERSION] = 0;
	cr_assert_eq(load_code(bad, n, "k_empty", err, sizeof(err)),
		     KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "code object: dlopen failed: ");
	memcpy(bad, so, n);
	bad[18] = (uint8_t)(EM_AARCH64 == bad[18] ? EM_X86_64 : EM_AARCH64);
	cr_assert_eq(load_code(bad, n, "k_empty", err, sizeof(err)),
		     KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "ELF machine");
	free(bad);

	cr_assert_eq(load_code(so, n, "k_not_there", err, sizeof(err)),
		     KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "kernel 0: symbol \"k_not_there\" not found in the "
			    "code object");
	free(so);
}

Test(load, cuda_artifacts_are_unsupported_for_now)
{
	ab_t b = ab_new(NULL);
	snprintf(b.a->target.backend, sizeof(b.a->target.backend), "cuda");
	snprintf(b.a->target.arch, sizeof(b.a->target.arch), "sm_90");
	static const uint8_t ptx[] = ".version 7.8\n";
	b.a->code = ptx;
	b.a->code_len = sizeof(ptx) - 1;
	ab_arena(&b, "0");
	msgpack_sbuffer sb;
	ab_pack(&b, &sb);
	ab_free(&b);
	char err[256];
	kiln_module_t *m = NULL;
	cr_assert_eq(kiln_module_load((const uint8_t *)sb.data, sb.size, NULL,
				      &m, err, sizeof(err)),
		     KILN_EUNSUPOP);
	cr_assert_null(m);
	ASSERT_MSG_HAS(err, "cuda sm_90 artifact cannot be loaded");
	msgpack_sbuffer_destroy(&sb);
}

static kiln_module_t *version_module(const char *so)
{
	ab_t b = ab_new(so);
	uint32_t k = ab_kernel(&b, "k_version", "1", 1, 1);
	ab_kstep(&b, k, 1, ab_buf_output(&b, "4"));
	ab_out_ref(&b, ab_view(&b, 0, KILN_DT_I32, "", "", "0"));
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	return m;
}

static int32_t version_of(kiln_module_t *m)
{
	int32_t v = 0;
	void *ob[1] = {&v};
	kiln_io_t out[1];
	run_ok(m, NULL, 0, ob, out, NULL);
	return v;
}

/* fd numbers are reused and glibc matches loaded libraries by path: two
 * live modules must still get their own code. */
Test(load, distinct_code_objects_stay_distinct)
{
	kiln_module_t *m1 = version_module(SO);
	kiln_module_t *m2 = version_module(SO_V2);
	cr_assert_eq(version_of(m1), 1);
	cr_assert_eq(version_of(m2), 2);
	kiln_module_free(m1);
	kiln_module_t *m3 = version_module(SO);
	kiln_module_t *m4 = version_module(SO_V2);
	cr_assert_eq(version_of(m3), 1);
	cr_assert_eq(version_of(m2), 2);
	cr_assert_eq(version_of(m4), 2);
	kiln_module_free(m2);
	kiln_module_free(m3);
	kiln_module_free(m4);
}

/* ---- dispatch overhead -------------------------------------------------- */

/* 1000 steps of `kernel` over `extent` (grain 1; syms[0] = ns, bound from
 * int input 0); the best of 20 runs, in µs per step. */
static double per_step_us(kiln_pool_t *p, const char *kernel,
			  const char *extent, int64_t ns)
{
	ab_t b = ab_new(SO);
	ab_sym(&b, "ns", 0, -1, 0, -1);
	ab_input_int(&b, "ns");
	uint32_t k = ab_kernel(&b, kernel, extent, 1, 0);
	for (int s = 0; s < 1000; s++)
		ab_kstep(&b, k, 0);
	ab_arena(&b, "0");
	kiln_module_t *m = ab_load(&b);
	ab_free(&b);
	kiln_run_opts_t o = {.pool = p};
	kiln_io_t in[1] = {io_int(ns)};
	run_ok(m, in, 1, NULL, NULL, &o); /* warm up */
	double best = 1e9;
	for (int rep = 0; rep < 20; rep++) {
		double t0 = now_s();
		run_ok(m, in, 1, NULL, NULL, &o);
		double dt = (now_s() - t0) * 1e6 / 1000;
		if (dt < best)
			best = dt;
	}
	kiln_module_free(m);
	return best;
}

Test(bench, dispatch_overhead_per_kernel_step)
{
	kiln_pool_t *p = pool_n(2);
	double inl = per_step_us(p, "k_empty", "1", 0);
	double split = per_step_us(p, "k_empty", "2", 0);
	/* 5 us of work per unit: one unit inline vs two units over two
	 * threads; the difference is what the split costs */
	double spin1 = per_step_us(p, "k_spin", "1", 5000);
	double spin2 = per_step_us(p, "k_spin", "2", 5000);
	fprintf(stderr,
		"bench: dispatch per kernel step: empty kernel, extent 1 "
		"(inline) %.3f us; extent 2 over 2 threads %.3f us; 5 us of "
		"work per unit: 1 unit inline %.2f us, 2 units over 2 threads "
		"%.2f us (split overhead %.2f us)\n",
		inl, split, spin1, spin2, spin2 - spin1);
	cr_log_info("dispatch per step: inline %.3f us, 2-thread split "
		    "%.3f us, 2x5us work on 2 threads %.2f us",
		    inl, split, spin2);
	/* loose bounds: these catch a pool that sleeps on every step */
	cr_assert_lt(inl, 5.0);
	cr_assert_lt(split, 200.0);
	kiln_pool_free(p);
}
