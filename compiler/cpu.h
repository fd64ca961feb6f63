/*
 * cpu.h — the CPU target (target_cpu.c), for compile.c.
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include "compiler/cir.h"

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

/* The most threads one compile optimizes and emits its kernels on. */
#define CPU_PAR_MAX 8

typedef struct cpu_target {
	LLVMTargetMachineRef tm;
	kiln_target_t target; /* resolved: arch and features filled */
	char triple[64];
	char cpu[64];
	char linker[256];
	bool linker_is_lld;
	/* KILN_MATH, read once: "" = kiln's polynomials (default), else the
	 * path of glibc's libmvec that kernels call and the link adds */
	char libmvec[128];
	int vec_width; /* f32 lanes */
	/* TargetMachines of the compile's helper threads (cpu_tm), made on
	 * first use; [0] is unused (tm) */
	LLVMTargetMachineRef par_tm[CPU_PAR_MAX];
} cpu_target_t;

void kiln__llvm_init(void);
double kiln__now_ms(void);

int cpu_target_init(cpu_target_t *t, const kiln_target_t *want, char *err,
		    size_t errlen);
void cpu_target_free(cpu_target_t *t);
void cpu_prepare_module(cpu_target_t *t, LLVMModuleRef m);
/* The TargetMachine of compile thread i (0: tm; others made on first use,
 * on the compiling thread, before helpers start), or NULL. */
LLVMTargetMachineRef cpu_tm(cpu_target_t *t, int i);
/* Verifies (a failure is KILN_ECOMPILE, never an abort), then O3, with tm
 * (one module per thread, each in its own LLVMContext). */
int cpu_optimize(cpu_target_t *t, LLVMTargetMachineRef tm, LLVMModuleRef m,
		 char *err, size_t errlen);
int cpu_emit(LLVMTargetMachineRef tm, LLVMModuleRef m, bool assembly,
	     uint8_t **out, size_t *len, char *err, size_t errlen);
/* Links n objects into one shared object; libm and libmvec only where
 * cpu_object_imports says an object calls them. */
enum { CPU_IMPORTS_LIBM = 1, CPU_IMPORTS_LIBMVEC = 2 };
int cpu_object_imports(const uint8_t *obj, size_t len);
int cpu_link(cpu_target_t *t, int n, uint8_t *const *objs, const size_t *lens,
	     uint8_t **so, size_t *solen, char *err, size_t errlen);

/* codegen.c: the kernels into n modules (each in its own context), each
 * kernel into the module with the fewest IR instructions so far, so that
 * the modules take about the same time to optimize and emit. */
int codegen_modules(cctx_t *c, int n, void **llvm_ctx, void **llvm_mod,
		    bool share, uint32_t *n_shared);

#endif
