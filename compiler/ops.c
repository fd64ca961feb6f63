/*
 * ops.c — the operator table built from ops.def.
 */
#include "compiler/ops.h"

const op_entry_t kiln__ops[] = {
#define X(name, fn, param) {name, fn, (int)(param)},
#include "compiler/ops.def"
#undef X
};

const size_t kiln__n_ops = sizeof(kiln__ops) / sizeof(kiln__ops[0]);
