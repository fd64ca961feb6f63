/*
 * internal.h — declarations shared by protocol/'s .c files only.
 */
#ifndef KILN_PROTOCOL_INTERNAL_H
#define KILN_PROTOCOL_INTERNAL_H

#include "protocol/protocol.h"

typedef struct kiln__expr_ctx {
	kiln_arena_t *arena;
	const kiln_symbol_t *syms;
	uint32_t n_syms;
	uint32_t max_nodes; /* per expression */
} kiln__expr_ctx_t;

/* Parses GRAPH.md's expression syntax from s[0..len). Constant
 * subexpressions are folded. 0, KILN_EINVGRAPH or -ENOMEM. */
int kiln__expr_parse(const kiln__expr_ctx_t *ctx, const char *s, size_t len,
		     const kiln_expr_t **out, char *err, size_t errlen);

/* A node in the arena; NULL on out-of-memory. */
const kiln_expr_t *kiln__expr_new(kiln_arena_t *a, kiln_expr_kind_t k,
				  int64_t c, uint32_t sym, const kiln_expr_t *x,
				  const kiln_expr_t *y);

/* Symbol index by name, or -1. */
int kiln__sym_find(const kiln_symbol_t *syms, uint32_t n, const char *s,
		   size_t len);

#endif
