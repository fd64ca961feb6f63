/*
 * test_blas.c — libkiln's choice of OpenBLAS kernels (kiln.h § 5, blas.c):
 * OPENBLAS_CORETYPE set from the CPU's features where nobody has set it and
 * OpenBLAS is not loaded yet, left alone otherwise; the loaded OpenBLAS
 * then runs that core. Each test runs in a process of its own (criterion),
 * so each starts with OpenBLAS unloaded and kiln_blas_prepare not yet run.
 * The checks that load OpenBLAS skip, saying why, where libopenblas.so.0
 * is not installed.
 */
#include "clients/libkiln/kiln.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define OPENBLAS "libopenblas.so.0"

static bool openblas_installed(void)
{
	void *h = dlopen(OPENBLAS, RTLD_LAZY | RTLD_NOLOAD);
	if (h != NULL) {
		dlclose(h);
		return true;
	}
	/* probe in a way that does not load it into this process */
	static const char *dirs[] = {"/usr/lib/x86_64-linux-gnu/",
				     "/usr/lib64/", "/usr/lib/"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char p[256];
		snprintf(p, sizeof(p), "%s%s", dirs[i], OPENBLAS);
		if (access(p, R_OK) == 0)
			return true;
	}
	return false;
}

#if !defined(__x86_64__)
Test(blas, no_coretype_off_x86_64)
{
	cr_expect_null(kiln_blas_coretype());
	cr_expect_null(kiln_blas_prepare());
}
#else
Test(blas, coretype_follows_the_cpus_features)
{
	const char *c = kiln_blas_coretype();
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512cd"))
		cr_expect_str_eq(c, "SkylakeX");
	else if (__builtin_cpu_supports("avx2") &&
		 __builtin_cpu_supports("fma"))
		cr_expect_str_eq(c, "Haswell");
	else
		cr_expect_null(c);
}

Test(blas, prepare_sets_the_core_and_openblas_runs_it)
{
	unsetenv("OPENBLAS_CORETYPE");
	cr_expect_null(kiln_blas_corename(NULL), "OpenBLAS loaded too early");
	const char *want = kiln_blas_coretype();
	const char *got = kiln_blas_prepare();
	if (want == NULL) {
		cr_expect_null(got);
		cr_expect_null(getenv("OPENBLAS_CORETYPE"));
		return;
	}
	cr_assert_str_eq(got, want);
	cr_expect_str_eq(getenv("OPENBLAS_CORETYPE"), want);
	/* once per process: the same answer, nothing set again */
	cr_expect_eq(kiln_blas_prepare(), got);
	if (!openblas_installed())
		cr_skip_test("%s is not installed: its core is not checked",
			     OPENBLAS);
	void *h = dlopen(OPENBLAS, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s", dlerror());
	const char *core = kiln_blas_corename(NULL);
	cr_assert_not_null(core);
	cr_expect(strcasecmp(core, want) == 0, "OpenBLAS runs %s, not %s", core,
		  want);
	dlclose(h);
}

Test(blas, the_users_coretype_wins)
{
	setenv("OPENBLAS_CORETYPE", "Prescott", 1);
	cr_expect_null(kiln_blas_prepare());
	cr_expect_str_eq(getenv("OPENBLAS_CORETYPE"), "Prescott");
	if (!openblas_installed())
		cr_skip_test("%s is not installed", OPENBLAS);
	void *h = dlopen(OPENBLAS, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s", dlerror());
	const char *core = kiln_blas_corename(NULL);
	cr_expect(core != NULL && strcasecmp(core, "Prescott") == 0, "%s",
		  core ? core : "(null)");
	dlclose(h);
}

Test(blas, an_openblas_loaded_first_is_left_alone)
{
	unsetenv("OPENBLAS_CORETYPE");
	if (!openblas_installed())
		cr_skip_test("%s is not installed", OPENBLAS);
	void *h = dlopen(OPENBLAS, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s", dlerror());
	/* it has chosen: setting the variable now would only reach child
	 * processes */
	cr_expect_null(kiln_blas_prepare());
	cr_expect_null(getenv("OPENBLAS_CORETYPE"));
	cr_expect_not_null(kiln_blas_corename(NULL));
	dlclose(h);
}

Test(blas, corename_of_what_is_not_openblas_is_null)
{
	cr_expect_null(kiln_blas_corename("libkiln-no-such-blas.so"));
	/* loaded, but no openblas_get_corename */
	void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s", dlerror());
	cr_expect_null(kiln_blas_corename("libm.so.6"));
	dlclose(h);
}
#endif /* __x86_64__ */
