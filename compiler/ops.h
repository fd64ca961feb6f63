/*
 * ops.h — the operator table (ops.def) as C.
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "compiler/lower.h"

typedef struct op_entry {
	const char *name; /* "aten.add.Tensor" */
	lower_fn_t fn;
	int param;
} op_entry_t;

#define X(name, fn, param) int fn(cctx_t *c, lnode_t *n);
#include "compiler/ops.def"
#undef X

extern const op_entry_t kiln__ops[];
extern const size_t kiln__n_ops;

#endif
