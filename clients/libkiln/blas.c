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
 */
#include "clients/libkiln/kiln.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

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
