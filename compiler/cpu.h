/*
 * cpu.h — the CPU target (target_cpu.c), for compile.c.
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include "compiler/cir.h"

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

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
} cpu_target_t;

void kiln__llvm_init(void);
double kiln__now_ms(void);

int cpu_target_init(cpu_target_t *t, const kiln_target_t *want, char *err,
		    size_t errlen);
void cpu_target_free(cpu_target_t *t);
void cpu_prepare_module(cpu_target_t *t, LLVMModuleRef m);
/* Verifies (a failure is KILN_ECOMPILE, never an abort), then O3. */
int cpu_optimize(cpu_target_t *t, LLVMModuleRef m, char *err, size_t errlen);
int cpu_emit(cpu_target_t *t, LLVMModuleRef m, bool assembly, uint8_t **out,
	     size_t *len, char *err, size_t errlen);
int cpu_link(cpu_target_t *t, const uint8_t *obj, size_t objlen, uint8_t **so,
	     size_t *solen, char *err, size_t errlen);

/* codegen.c */
int codegen_module(cctx_t *c, void *llvm_ctx, void *llvm_mod);

#endif
