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

/*
 * Graph v1 decoding pieces shared by graph.c and artifact.c (the artifact
 * carries specs, symbols, expressions and fallback args in Graph v1's
 * encoding). A decoding context: errors are written to err as
 * "<where>: <reason>". `g` supplies the arena the results are allocated in
 * and, once parsed, the symbol table (a stand-in kiln_graph_t is fine).
 */
typedef struct kiln__dctx {
	const kiln_limits_t *lim;
	kiln_graph_t *g;
	kiln__expr_ctx_t ex;
	char *err;
	size_t errlen;
	char where[96]; /* "node 12 (aten.add.Tensor)" etc. */
	/* graph.c's location, kept as numbers and formatted only when an
	 * error is reported (building strings on the success path cost 2/3
	 * of decoding): 0 none (use where[]), 1 input i, 2 node i (op),
	 * 3 node i (op): out k, 4 output i */
	int loc;
	uint32_t loc_i, loc_k;
	const char *loc_op;
} kiln__dctx_t;

/* [A-Za-z_][A-Za-z0-9_]* */
bool kiln__valid_ident(const char *s, size_t n);
/* namespace.name(.overload)+ as GRAPH.md § Nodes */
bool kiln__valid_op_name(const char *s, size_t n);
/* The "symbols" map into c->g->symbols / n_symbols; sets c->ex's table. */
int kiln__graph_parse_symbols(kiln__dctx_t *c, const msgpack_object *syms);
/* A tensor spec {"dtype", "shape", "strides"?} into v (kind TENSOR). */
int kiln__graph_parse_spec(kiln__dctx_t *c, const msgpack_object *o,
			   kiln_value_t *v);
/* An int or expression string; nonneg rejects negative constants. */
int kiln__graph_parse_dim(kiln__dctx_t *c, const msgpack_object *o,
			  const char *what, kiln_dim_t *out, bool nonneg);
/* Like kiln__graph_parse_dim but always a tree (constants as CONST). */
int kiln__graph_parse_expr(kiln__dctx_t *c, const msgpack_object *o,
			   const char *what, const kiln_expr_t **out);
/* An argument; refs must be < n_defined. */
int kiln__graph_parse_arg(kiln__dctx_t *c, const msgpack_object *o,
			  uint32_t n_defined, kiln_arg_t *a, const char *what);

/* Packing in Graph v1's encoding; g supplies the symbol names only. Each
 * returns 0 or non-zero when the packer failed. */
int kiln__pack_symbols(msgpack_packer *pk, const kiln_symbol_t *syms,
		       uint32_t n);
int kiln__graph_pack_dim(const kiln_graph_t *g, msgpack_packer *pk,
			 kiln_dim_t d);
int kiln__graph_pack_expr(const kiln_graph_t *g, msgpack_packer *pk,
			  const kiln_expr_t *e);
int kiln__graph_pack_spec(const kiln_graph_t *g, msgpack_packer *pk,
			  const kiln_value_t *v);
int kiln__graph_pack_arg(const kiln_graph_t *g, msgpack_packer *pk,
			 const kiln_arg_t *a);

#endif
