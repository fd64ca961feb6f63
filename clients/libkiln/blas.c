/*
 * blas.c — OpenBLAS's choice of kernels (kiln.h § 5).
 *
 * Kernels call BLAS (cblas_?gemm, OpenBLAS by default) for the matrix
 * products the GEMM template does not take. OpenBLAS built with
 * DYNAMIC_ARCH (Debian's) picks its kernels once, when it is loaded: from
 * $OPENBLAS_CORETYPE where that is set, else from the CPU's family and
 * model numbers. Version 0.3.21 (Debian 12) takes a model it does not know
 * for a Prescott and runs SSE3 kernels. It does so on this image's VMs
 * ("Intel(R) Xeon(R) Processor", AVX-512), where sgemm measured 2-5x slower
 * than with its SkylakeX kernels (clients/libkiln/README.md § BLAS).
 *
 * kiln_blas_prepare therefore sets OPENBLAS_CORETYPE, where nobody has,
 * before the first kernel of a process can load OpenBLAS: to SkylakeX or
 * Haswell, as the CPU's features (cpuid, and the OS's saved state, as
 * __builtin_cpu_supports reads them) allow. It is left set,
 * so the kernels' own dlopen (codegen.c blas_fn, at the first product) and
 * any child process see it.
 *
 * kiln_blas_preload loads the library on a thread of its own when a module
 * whose kernels call it is loaded, so the first product finds it loaded;
 * fork() waits for that thread (pre_fork_wait).
 */
#include "clients/libkiln/kiln.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_once_t prepare_once = PTHREAD_ONCE_INIT;
static const char *prepared; /* the value set, or NULL */

const char *kiln_blas_coretype(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	__builtin_cpu_init();
	/* OpenBLAS's SkylakeX kernels use AVX-512 F, CD, BW, DQ and VL;
	 * its Haswell ones AVX2 and FMA */
	if (__builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512cd") &&
	    __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx512vl"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
#endif
	return NULL;
}

static void prepare(void)
{
	if (getenv("OPENBLAS_CORETYPE") != NULL)
		return; /* the user's choice */
	/* loaded already: it has chosen, and setting it would only leak
	 * into child processes */
	const char *paths[2] = {"libopenblas.so.0", getenv("KILN_BLAS")};
	for (int i = 0; i < 2; i++) {
		void *h = paths[i] != NULL
			      ? dlopen(paths[i], RTLD_LAZY | RTLD_NOLOAD)
			      : NULL;
		if (h != NULL) {
			dlclose(h);
			return;
		}
	}
	const char *core = kiln_blas_coretype();
	if (core != NULL && setenv("OPENBLAS_CORETYPE", core, 0) == 0)
		prepared = core;
}

const char *kiln_blas_prepare(void)
{
	pthread_once(&prepare_once, prepare);
	return prepared;
}

const char *kiln_blas_corename(const char *path)
{
	void *h = dlopen(path != NULL ? path : "libopenblas.so.0",
			 RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		return NULL;
	char *(*fn)(void) = NULL;
	*(void **)&fn = dlsym(h, "openblas_get_corename");
	/* a static string of the library, which stays loaded (the caller's
	 * or a kernel's reference) */
	const char *name = fn != NULL ? fn() : NULL;
	dlclose(h);
	return name;
}

static pthread_mutex_t pre_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pre_cv = PTHREAD_COND_INITIALIZER;
static int pre_state; /* 0: not started, 1: loading, 2: done */
static bool pre_atfork;
static char pre_path[4096];

static void *pre_main(void *arg)
{
	(void)arg;
	/* the handle is kept: the kernels dlopen the same path and keep
	 * theirs, so the library stays loaded for the process anyway */
	(void)dlopen(pre_path, RTLD_NOW | RTLD_LOCAL);
	pthread_mutex_lock(&pre_mu);
	pre_state = 2;
	pthread_cond_broadcast(&pre_cv);
	pthread_mutex_unlock(&pre_mu);
	return NULL;
}

/* Before a fork: wait for the loading thread, which may hold the loader's
 * lock. Bounded (2 s), so that a fork from inside another dlopen (which
 * holds the lock the loading thread waits for) cannot hang: it proceeds as
 * it would have without kiln. glibc releases its own atfork lock while a
 * prepare handler runs, so OpenBLAS registering its handlers meanwhile is
 * fine. */
static void pre_fork_wait(void)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&pre_mu);
	while (pre_state == 1)
		if (pthread_cond_timedwait(&pre_cv, &pre_mu, &until) ==
		    ETIMEDOUT)
			break;
	pthread_mutex_unlock(&pre_mu);
}

/* In the child: no loading thread came along; a load the prepare handler
 * gave up waiting for is one a later call may start again. */
static void pre_fork_child(void)
{
	if (pre_state == 1)
		pre_state = 0;
}

int kiln_blas_preload(const char *path)
{
	if (path == NULL || strnlen(path, sizeof(pre_path)) >= sizeof(pre_path))
		return -EINVAL;
	const char *off = getenv("KILN_BLAS_PRELOAD");
	if (off != NULL && strcmp(off, "0") == 0)
		return 0;
	int rc = 0;
	pthread_mutex_lock(&pre_mu);
	if (pre_state != 0)
		goto out;
	void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h != NULL) { /* loaded already */
		dlclose(h);
		pre_state = 2;
		goto out;
	}
	if (!pre_atfork) {
		rc = -pthread_atfork(pre_fork_wait, NULL, pre_fork_child);
		if (rc != 0)
			goto out;
		pre_atfork = true;
	}
	memcpy(pre_path, path, strlen(path) + 1);
	pthread_attr_t at;
	pthread_t th;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&th, &at, pre_main, NULL);
	pthread_attr_destroy(&at);
	if (rc == 0)
		pre_state = 1;
out:
	pthread_mutex_unlock(&pre_mu);
	return rc;
}
