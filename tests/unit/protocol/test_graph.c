/*
 * test_graph.c — Graph v1 decoding and validation (protocol/graph.c), one
 * test per bullet of GRAPH.md § Validation plus the accepted edge cases,
 * and kiln_graph_pack round trips.
 */
#include "helpers.h"

#include <errno.h>

/* Symbols s0 (min 0) and s1 (1..100); input v0 is f32 [2, 3]. */
#define PRE                                                                    \
	"{'format': 'kiln.graph/1',"                                           \
	" 'symbols': {'s0': {'min': 0}, 's1': {'min': 1, 'max': 100}},"
#define G(nodes, outputs)                                                      \
	PRE " 'inputs': [{'dtype': 'f32', 'shape': [2, 3]}],"                  \
	    " 'nodes': [" nodes "], 'outputs': [" outputs "]}"
#define GI(inputs) PRE " 'inputs': [" inputs "], 'nodes': [], 'outputs': []}"
#define OUT23	   "'out': [{'dtype': 'f32', 'shape': [2, 3]}]"
#define NODE(args) "{'op': 'aten.foo.default', 'args': [" args "], " OUT23 "}"
#define NODE_KW(kw)                                                            \
	"{'op': 'aten.foo.default', 'args': [{'ref': 0}], 'kwargs': {" kw      \
	"}, " OUT23 "}"
#define RELU(ref)                                                              \
	"{'op': 'aten.relu.default', 'args': [{'ref': " ref "}], " OUT23 "}"

#define INV KILN_EINVGRAPH

static kiln_limits_t deflim(void)
{
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	return lim;
}

static void expect_dim(kiln_dim_t d, int64_t c)
{
	cr_assert_null(d.e, "expected the constant %lld", (long long)c);
	cr_assert_eq(d.c, c, "got %lld, expected %lld", (long long)d.c,
		     (long long)c);
}

static void expect_dim_str(const kiln_graph_t *g, kiln_dim_t d,
			   const char *want)
{
	cr_assert_not_null(d.e, "expected the expression %s", want);
	char buf[256];
	kiln_expr_format(g, d.e, buf, sizeof(buf));
	cr_assert_str_eq(buf, want);
}

/* ------------------------------------------------------------------------ */
/* The examples                                                               */
/* ------------------------------------------------------------------------ */

Test(graph, example_gelu_decodes)
{
	kiln_graph_t *g = graph_ok(GRAPH_EX1, NULL);
	cr_assert_eq(g->n_inputs, 3);
	cr_assert_eq(g->n_nodes, 2);
	cr_assert_eq(g->n_values, 5);
	cr_assert_eq(g->n_outputs, 1);
	cr_assert_eq(g->n_symbols, 0);
	for (uint32_t i = 0; i < 3; i++) {
		cr_assert_eq(g->values[i].kind, KILN_VAL_TENSOR);
		cr_assert_eq(g->values[i].producer, -1);
		cr_assert_eq(g->values[i].dtype, KILN_DT_F32);
		cr_assert_not(g->values[i].strides_given);
	}
	cr_assert_eq(g->values[0].rank, 2);
	expect_dim(g->values[0].sizes[0], 8);
	expect_dim(g->values[0].sizes[1], 64);
	expect_dim(g->values[0].strides[0], 64);
	expect_dim(g->values[0].strides[1], 1);
	expect_dim(g->values[2].sizes[0], 32);

	const kiln_node_t *n0 = &g->nodes[0], *n1 = &g->nodes[1];
	cr_assert_str_eq(n0->op, "aten.addmm.default");
	cr_assert_eq(n0->n_args, 3);
	cr_assert_eq(n0->args[0].kind, KILN_ARG_REF);
	cr_assert_eq(n0->args[0].u.ref, 2);
	cr_assert_eq(n0->args[1].u.ref, 0);
	cr_assert_eq(n0->args[2].u.ref, 1);
	cr_assert_eq(n0->n_kwargs, 0);
	cr_assert_eq(n0->n_out, 1);
	cr_assert_eq(n0->out_first, 3);
	cr_assert_eq(g->values[3].producer, 0);
	expect_dim(g->values[3].strides[0], 32);

	cr_assert_str_eq(n1->op, "aten.gelu.default");
	cr_assert_eq(n1->n_kwargs, 1);
	cr_assert_str_eq(n1->kwargs[0].key, "approximate");
	cr_assert_eq(n1->kwargs[0].val.kind, KILN_ARG_STR);
	cr_assert_str_eq(n1->kwargs[0].val.u.s, "tanh");
	cr_assert_eq(n1->kwargs[0].val.n, 4);
	cr_assert_eq(n1->out_first, 4);
	cr_assert_eq(g->values[4].producer, 1);

	cr_assert_eq(g->outputs[0].kind, KILN_ARG_REF);
	cr_assert_eq(g->outputs[0].u.ref, 4);
	kiln_graph_free(g);
}

Test(graph, example_dynamic_decodes)
{
	kiln_graph_t *g = graph_ok(GRAPH_EX2, NULL);
	cr_assert_eq(g->n_inputs, 4);
	cr_assert_eq(g->n_nodes, 2);
	cr_assert_eq(g->n_values, 8);
	cr_assert_eq(g->n_outputs, 4);
	cr_assert_eq(g->n_symbols, 1);
	cr_assert_str_eq(g->symbols[0].name, "s0");
	cr_assert_eq(g->symbols[0].min, 2);
	cr_assert_eq(g->symbols[0].max, 4096);
	cr_assert_eq(g->symbols[0].hint, 16);

	cr_assert_eq(g->values[0].kind, KILN_VAL_SYMINT);
	cr_assert_eq(g->values[0].sym->kind, KILN_EX_SYM);
	cr_assert_eq(g->values[0].sym->sym, 0);

	const kiln_value_t *x = &g->values[1];
	cr_assert_eq(x->rank, 3);
	expect_dim(x->sizes[0], 4);
	expect_dim_str(g, x->sizes[1], "s0");
	expect_dim(x->sizes[2], 64);
	expect_dim_str(g, x->strides[0], "64*s0");
	expect_dim(x->strides[1], 64);
	expect_dim(x->strides[2], 1);

	const kiln_node_t *ln = &g->nodes[0];
	cr_assert_eq(ln->n_out, 3);
	cr_assert_eq(ln->out_first, 4);
	cr_assert_eq(ln->n_args, 5);
	cr_assert_eq(ln->args[1].kind, KILN_ARG_LIST);
	cr_assert_eq(ln->args[1].n, 1);
	cr_assert_eq(ln->args[1].u.list[0].kind, KILN_ARG_INT);
	cr_assert_eq(ln->args[1].u.list[0].u.i, 64);
	cr_assert_eq(ln->args[4].kind, KILN_ARG_FLOAT);
	cr_assert_float_eq(ln->args[4].u.f, 1e-05, 1e-20);
	for (uint32_t v = 4; v < 7; v++)
		cr_assert_eq(g->values[v].producer, 0);
	expect_dim(g->values[5].sizes[2], 1);

	const kiln_node_t *view = &g->nodes[1];
	cr_assert_eq(view->out_first, 7);
	const kiln_arg_t *shape = &view->args[1];
	cr_assert_eq(shape->kind, KILN_ARG_LIST);
	cr_assert_eq(shape->n, 2);
	cr_assert_eq(shape->u.list[0].kind, KILN_ARG_SYM);
	char buf[64];
	kiln_expr_format(g, shape->u.list[0].u.sym, buf, sizeof(buf));
	cr_assert_str_eq(buf, "4*s0");
	cr_assert_eq(shape->u.list[1].kind, KILN_ARG_INT);
	expect_dim_str(g, g->values[7].sizes[0], "4*s0");

	cr_assert_eq(g->outputs[0].u.ref, 7);
	cr_assert_eq(g->outputs[1].u.ref, 5);
	cr_assert_eq(g->outputs[2].u.ref, 6);
	cr_assert_eq(g->outputs[3].kind, KILN_ARG_SYM);
	cr_assert_eq(g->outputs[3].u.sym->kind, KILN_EX_SYM);
	kiln_graph_free(g);
}

Test(graph, from_object_and_free)
{
	mp_obj_t o;
	const msgpack_object *m = mp_obj(&o, GRAPH_EX1);
	kiln_graph_t *g = NULL;
	char err[256] = "";
	cr_assert_eq(kiln_graph_from_object(m, NULL, &g, err, sizeof(err)), 0,
		     "%s", err);
	mp_obj_free(&o); /* the graph does not point into the object */
	cr_assert_str_eq(g->nodes[1].kwargs[0].key, "approximate");
	cr_assert_str_eq(g->nodes[1].kwargs[0].val.u.s, "tanh");
	cr_assert_str_eq(g->nodes[0].op, "aten.addmm.default");
	kiln_graph_free(g);
	kiln_graph_free(NULL);

	/* Not a map. */
	m = mp_obj(&o, "[1, 2]");
	g = (kiln_graph_t *)(uintptr_t)1;
	cr_assert_eq(kiln_graph_from_object(m, NULL, &g, err, sizeof(err)),
		     INV);
	cr_assert_null(g);
	ASSERT_MSG_HAS(err, "graph must be a map, not array");
	mp_obj_free(&o);
}

Test(graph, decode_applies_the_msgpack_guard)
{
	char err[256] = "";
	kiln_graph_t *g;
	msgpack_sbuffer sb;
	mp_pack(&sb, GRAPH_EX1);
	mp_append(&sb, "nil");
	cr_assert_eq(kiln_graph_decode((const uint8_t *)sb.data, sb.size, NULL,
				       &g, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "trailing");
	cr_assert_eq(kiln_graph_decode((const uint8_t *)sb.data, sb.size - 3,
				       NULL, &g, err, sizeof(err)),
		     KILN_EBADFRAME);
	msgpack_sbuffer_destroy(&sb);
	graph_err("[1]", NULL, KILN_EBADFRAME, "not a msgpack map", NULL);
}

/* ------------------------------------------------------------------------ */
/* Validation: top level                                                      */
/* ------------------------------------------------------------------------ */

Test(validate, format)
{
	graph_err("{'inputs': [], 'nodes': [], 'outputs': []}", NULL, INV,
		  "missing \"format\"", NULL);
	graph_err("{'format': 'kiln.graph/2', 'inputs': [], 'nodes': [], "
		  "'outputs': []}",
		  NULL, INV, "\"format\" must be \"kiln.graph/1\"", NULL);
	graph_err("{'format': 'kiln.graph/1 ', 'inputs': [], 'nodes': [], "
		  "'outputs': []}",
		  NULL, INV, "\"format\" must be", NULL);
	graph_err("{'format': 1, 'inputs': [], 'nodes': [], 'outputs': []}",
		  NULL, INV, "\"format\" must be", NULL);
	graph_err("{'format': bin('kiln.graph/1'), 'inputs': [], 'nodes': [], "
		  "'outputs': []}",
		  NULL, INV, "\"format\" must be", NULL);
}

Test(validate, inputs_nodes_outputs_required)
{
	graph_err("{'format': 'kiln.graph/1', 'nodes': [], 'outputs': []}",
		  NULL, INV, "missing \"inputs\" array", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': {}, 'nodes': [], "
		  "'outputs': []}",
		  NULL, INV, "\"inputs\"", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': [], 'outputs': []}",
		  NULL, INV, "missing \"nodes\" array", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': nil, "
		  "'outputs': []}",
		  NULL, INV, "\"nodes\"", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': []}", NULL,
		  INV, "missing \"outputs\" array", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': [], "
		  "'outputs': 'x'}",
		  NULL, INV, "\"outputs\"", NULL);
	graph_err("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': [], "
		  "'outputs': [], 'symbols': [1]}",
		  NULL, INV, "\"symbols\" must be a map", NULL);
}

/* ------------------------------------------------------------------------ */
/* Validation: specs                                                          */
/* ------------------------------------------------------------------------ */

Test(validate, spec_shape)
{
	graph_err(GI("{'dtype': 'f32', 'shape': [1]}, 5"), NULL, INV,
		  "input 1: spec must be a map, not int", NULL);
	graph_err(GI("{'shape': [1]}"), NULL, INV, "input 0",
		  "spec needs a string \"dtype\"");
	graph_err(GI("{'dtype': 3, 'shape': [1]}"), NULL, INV, "input 0",
		  "\"dtype\"");
	graph_err(GI("{'dtype': 'f32'}"), NULL, INV, "input 0",
		  "spec needs a \"shape\" array");
	graph_err(GI("{'dtype': 'f32', 'shape': 4}"), NULL, INV, "input 0",
		  "\"shape\" array");
}

Test(validate, unknown_dtype)
{
	graph_err(GI("{'dtype': 'f32', 'shape': []}, "
		     "{'dtype': 'f128', 'shape': [1]}"),
		  NULL, INV, "input 1", "unknown dtype \"f128\"");
	graph_err(GI("{'dtype': 'F32', 'shape': [1]}"), NULL, INV, "input 0",
		  "unknown dtype \"F32\"");
	graph_err(GI("{'dtype': 'float32', 'shape': [1]}"), NULL, INV,
		  "unknown dtype", NULL);
	graph_err(GI("{'dtype': '', 'shape': [1]}"), NULL, INV,
		  "unknown dtype \"\"", NULL);
	/* In a node's out list the message names node and output. */
	graph_err(G("{'op': 'aten.foo.default', 'args': [], 'out': "
		    "[{'dtype': 'f32', 'shape': []}, "
		    "{'dtype': 'i4', 'shape': []}]}",
		    ""),
		  NULL, INV, "node 0 (aten.foo.default): out 1",
		  "unknown dtype \"i4\"");
}

Test(validate, every_dtype_name)
{
	static const struct {
		const char *name;
		kiln_dtype_t dt;
		size_t size;
		bool is_float;
	} dts[] = {
	    {"f32", KILN_DT_F32, 4, true},  {"f64", KILN_DT_F64, 8, true},
	    {"f16", KILN_DT_F16, 2, true},  {"bf16", KILN_DT_BF16, 2, true},
	    {"i8", KILN_DT_I8, 1, false},   {"i16", KILN_DT_I16, 2, false},
	    {"i32", KILN_DT_I32, 4, false}, {"i64", KILN_DT_I64, 8, false},
	    {"u8", KILN_DT_U8, 1, false},   {"bool", KILN_DT_BOOL, 1, false}};
	cr_assert_eq(sizeof(dts) / sizeof(dts[0]), KILN_DT__COUNT);
	for (size_t i = 0; i < KILN_DT__COUNT; i++) {
		cr_assert_str_eq(kiln_dtype_name(dts[i].dt), dts[i].name);
		cr_assert_eq(
		    kiln_dtype_from_name(dts[i].name, strlen(dts[i].name)),
		    (int)dts[i].dt);
		cr_assert_eq(kiln_dtype_size(dts[i].dt), dts[i].size);
		cr_assert_eq(kiln_dtype_is_float(dts[i].dt), dts[i].is_float);
		char text[256];
		snprintf(text, sizeof(text),
			 GI("{'dtype': '%s', 'shape': [2]}"), dts[i].name);
		kiln_graph_t *g = graph_ok(text, NULL);
		cr_assert_eq(g->values[0].dtype, dts[i].dt);
		kiln_graph_free(g);
	}
	cr_assert_null(kiln_dtype_name(KILN_DT__COUNT));
	cr_assert_eq(kiln_dtype_size(KILN_DT__COUNT), 0);
	cr_assert_eq(kiln_dtype_from_name("f3", 2), -1);
}

Test(validate, rank_limit)
{
	kiln_graph_t *g = graph_ok(GI("{'dtype': 'f32', 'shape': "
				      "[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]}"),
				   NULL);
	cr_assert_eq(g->values[0].rank, 12);
	expect_dim(g->values[0].strides[11], 1);
	expect_dim(g->values[0].strides[0], 2);
	kiln_graph_free(g);
	graph_err(GI("{'dtype': 'f32', 'shape': "
		     "[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}"),
		  NULL, INV, "input 0", "rank 13 exceeds the limit 12");
	/* A configured limit above the hard maximum is clamped to 16. */
	kiln_limits_t lim = deflim();
	lim.max_rank = 40;
	g = graph_ok(GI("{'dtype': 'f32', 'shape': [1, 1, 1, 1, 1, 1, 1, 1, "
			"1, 1, 1, 1, 1, 1, 1, 1]}"),
		     &lim);
	kiln_graph_free(g);
	graph_err(GI("{'dtype': 'f32', 'shape': [1, 1, 1, 1, 1, 1, 1, 1, 1, "
		     "1, 1, 1, 1, 1, 1, 1, 1]}"),
		  &lim, INV, "rank 17 exceeds the limit 16", NULL);
	lim.max_rank = 2;
	graph_err(GI("{'dtype': 'f32', 'shape': [1, 1, 1]}"), &lim, INV,
		  "rank 3 exceeds the limit 2", NULL);
}

Test(validate, negative_size)
{
	graph_err(GI("{'dtype': 'f32', 'shape': [2, -3]}"), NULL, INV,
		  "input 0", "size 1 is negative (-3)");
	graph_err(GI("{'dtype': 'f32', 'shape': [i64(-1)]}"), NULL, INV,
		  "size 0 is negative (-1)", NULL);
	/* An expression that folds to a negative constant. */
	graph_err(GI("{'dtype': 'f32', 'shape': ['2 - 5']}"), NULL, INV,
		  "size 0 is negative (-3)", NULL);
}

Test(validate, negative_stride)
{
	graph_err(GI("{'dtype': 'f32', 'shape': [2, 3], 'strides': [-3, 1]}"),
		  NULL, INV, "input 0", "stride 0 is negative (-3)");
	graph_err(GI("{'dtype': 'f32', 'shape': [2, 3], 'strides': [3, '-1']}"),
		  NULL, INV, "stride 1 is negative (-1)", NULL);
}

Test(validate, size_or_stride_of_the_wrong_type)
{
	graph_err(GI("{'dtype': 'f32', 'shape': [2.0]}"), NULL, INV, "input 0",
		  "size 0 must be an int or an expression string, not float");
	graph_err(GI("{'dtype': 'f32', 'shape': [f32(2)]}"), NULL, INV,
		  "not float", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [nil]}"), NULL, INV,
		  "size 0 must be an int or an expression string, not nil",
		  NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [[2]]}"), NULL, INV,
		  "not array", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [true]}"), NULL, INV,
		  "not bool", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [2], 'strides': [1.5]}"), NULL,
		  INV, "stride 0 must be an int or an expression string", NULL);
	/* A uint64 above INT64_MAX. */
	graph_err(GI("{'dtype': 'f32', 'shape': [9223372036854775808]}"), NULL,
		  INV, "size 0 out of range", NULL);
}

Test(validate, strides_length_mismatch)
{
	graph_err(GI("{'dtype': 'f32', 'shape': [2, 3], 'strides': [1]}"), NULL,
		  INV, "input 0", "\"strides\" must be an array of 2 entries");
	graph_err(GI("{'dtype': 'f32', 'shape': [2], 'strides': [1, 1]}"), NULL,
		  INV, "array of 1 entries", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [2], 'strides': 1}"), NULL, INV,
		  "\"strides\" must be an array", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': [], 'strides': [1]}"), NULL,
		  INV, "array of 0 entries", NULL);
}

/* ------------------------------------------------------------------------ */
/* Validation: expressions and symbols                                        */
/* ------------------------------------------------------------------------ */

Test(validate, bad_expression_syntax)
{
	static const char *const bad[] = {
	    "s0 +", "",	   "()",      "s0 s1",	  "s0 / 2",  "2 ** s0",
	    "(s0",  "s0)", "max(s0)", "min s0",	  "max(1,)", "s0 + +1",
	    "s0.5", "1e3", "s0 $ 1",  "max(1, 2", "#",	     "s0 + 1,"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text),
			 GI("{'dtype': 'f32', 'shape': [2, '%s']}"), bad[i]);
		graph_err(text, NULL, INV, "input 0: size 1: expression", NULL);
	}
	graph_err(GI("{'dtype': 'f32', 'shape': ['s0 +']}"), NULL, INV,
		  "unexpected end", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': ['s0 s1']}"), NULL, INV,
		  "trailing characters at offset 3", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': ['s0 # 1']}"), NULL, INV,
		  "trailing characters", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': ['(s0']}"), NULL, INV,
		  "expected ')'", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': ['#']}"), NULL, INV,
		  "unexpected character", NULL);
	/* In a stride, a sym input, a sym arg and a sym output. */
	graph_err(GI("{'dtype': 'f32', 'shape': [2], 'strides': ['s0 +']}"),
		  NULL, INV, "input 0: stride 0: expression", NULL);
	graph_err(GI("{'sym': 's0 +'}"), NULL, INV, "input 0: sym: expression",
		  NULL);
	graph_err(G(NODE("{'sym': '(s0'}"), ""), NULL, INV,
		  "node 0 (aten.foo.default): arg 0: expression", NULL);
	graph_err(G("", "{'sym': 's0 +'}"), NULL, INV, "output 0",
		  "expression");
}

Test(validate, undeclared_symbol)
{
	graph_err(GI("{'dtype': 'f32', 'shape': ['s2']}"), NULL, INV, "input 0",
		  "undeclared symbol \"s2\"");
	graph_err(GI("{'dtype': 'f32', 'shape': ['2*s00 + 1']}"), NULL, INV,
		  "undeclared symbol \"s00\"", NULL);
	graph_err(GI("{'dtype': 'f32', 'shape': ['s']}"), NULL, INV,
		  "undeclared symbol \"s\"", NULL);
	/* No symbols at all. */
	graph_err("{'format': 'kiln.graph/1', 'inputs': [{'sym': 's0'}], "
		  "'nodes': [], 'outputs': []}",
		  NULL, INV, "input 0", "undeclared symbol \"s0\"");
	graph_err(G(NODE("[1, {'sym': 'max(1, s9)'}]"), ""), NULL, INV,
		  "node 0 (aten.foo.default): arg 0[1]",
		  "undeclared symbol \"s9\"");
}

Test(validate, expression_too_large)
{
	char expr[1200] = "s0";
	for (int i = 0; i < 70; i++)
		strcat(expr, "+s0");
	char text[1400];
	snprintf(text, sizeof(text), GI("{'dtype': 'f32', 'shape': ['%s']}"),
		 expr);
	graph_err(text, NULL, INV, "input 0", "expression too large");

	kiln_limits_t lim = deflim();
	lim.max_expr_nodes = 4;
	graph_err(GI("{'dtype': 'f32', 'shape': ['s0 + s0 + s0']}"), &lim, INV,
		  "too large", NULL);
	kiln_graph_t *g =
	    graph_ok(GI("{'dtype': 'f32', 'shape': ['s0 + s1']}"), &lim);
	kiln_graph_free(g);
}

Test(validate, symbol_bounds)
{
#define SYM(decl)                                                              \
	"{'format': 'kiln.graph/1', 'symbols': {" decl "}, 'inputs': [], "     \
	"'nodes': [], 'outputs': []}"
	graph_err(SYM("'s0': {'min': -1}"), NULL, INV, "symbol \"s0\"",
		  "\"min\" must be an integer >= 0");
	graph_err(SYM("'s0': {'min': 5, 'max': 4}"), NULL, INV, "symbol \"s0\"",
		  "\"max\" must be nil or an integer >= min");
	graph_err(SYM("'s0': {'max': -1}"), NULL, INV, "\"max\" must be", NULL);
	graph_err(SYM("'s0': {'min': 1.0}"), NULL, INV, "\"min\" must be",
		  NULL);
	graph_err(SYM("'s0': {'min': 0, 'max': 4096.0}"), NULL, INV,
		  "\"max\" must be", NULL);
	graph_err(SYM("'s0': {'max': inf}"), NULL, INV, "\"max\" must be",
		  NULL);
	graph_err(SYM("'s0': {'min': '2'}"), NULL, INV, "\"min\" must be",
		  NULL);
	graph_err(SYM("'s0': {'max': 18446744073709551615}"), NULL, INV,
		  "\"max\" must be", NULL);
	graph_err(SYM("'s0': {'min': 2, 'hint': 1}"), NULL, INV,
		  "\"hint\" must be an integer within [min, max]", NULL);
	graph_err(SYM("'s0': {'min': 2, 'max': 8, 'hint': 9}"), NULL, INV,
		  "\"hint\"", NULL);
	graph_err(SYM("'s0': {'hint': 2.5}"), NULL, INV, "\"hint\"", NULL);
	graph_err(SYM("'s0': 3"), NULL, INV,
		  "symbol \"s0\": constraints must be a map", NULL);

	/* Accepted: min == max, nil max, absent keys, a hint at a bound. */
	kiln_graph_t *g = graph_ok(
	    SYM("'a': {'min': 3, 'max': 3, 'hint': 3}, 'b': {'max': nil}, "
		"'c': {}, 'd': {'min': nil, 'hint': nil}"),
	    NULL);
	cr_assert_eq(g->n_symbols, 4);
	cr_assert_eq(g->symbols[0].min, 3);
	cr_assert_eq(g->symbols[0].max, 3);
	cr_assert_eq(g->symbols[0].hint, 3);
	cr_assert_eq(g->symbols[1].min, 0);
	cr_assert_eq(g->symbols[1].max, -1);
	cr_assert_eq(g->symbols[1].hint, -1);
	cr_assert_eq(g->symbols[2].max, -1);
	kiln_graph_free(g);
}

Test(validate, symbol_names)
{
	static const char *const bad[] = {"0s", "min", "max", "a-b",
					  "",	"s 0", "s.0", "\\0"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text), SYM("'%s': {}"), bad[i]);
		graph_err(text, NULL, INV, "symbol 0: invalid symbol name",
			  NULL);
	}
	graph_err(SYM("'s0': {}, 5: {}"), NULL, INV,
		  "symbol 1: invalid symbol name", NULL);
	char longname[80];
	memset(longname, 'a', 65);
	longname[65] = '\0';
	char text[256];
	snprintf(text, sizeof(text), SYM("'%s': {}"), longname);
	graph_err(text, NULL, INV, "invalid symbol name", NULL);
	graph_err(SYM("'s0': {}, 's0': {'min': 1}"), NULL, INV,
		  "symbol \"s0\" declared twice", NULL);

	kiln_graph_t *g =
	    graph_ok(SYM("'_': {}, 'S_9': {}, 'minx': {}, 'Max': {}"), NULL);
	cr_assert_eq(g->n_symbols, 4);
	kiln_graph_free(g);
}

Test(validate, symbols_over_the_limit)
{
	kiln_limits_t lim = deflim();
	lim.max_symbols = 2;
	kiln_graph_t *g = graph_ok(SYM("'a': {}, 'b': {}"), &lim);
	kiln_graph_free(g);
	graph_err(SYM("'a': {}, 'b': {}, 'c': {}"), &lim, KILN_ETOOLARGE,
		  "3 symbols exceed the limit 2", NULL);
#undef SYM
}

/* ------------------------------------------------------------------------ */
/* Validation: refs                                                           */
/* ------------------------------------------------------------------------ */

Test(validate, forward_ref)
{
	graph_err(G(NODE("{'ref': 5}"), ""), NULL, INV,
		  "node 0 (aten.foo.default): arg 0",
		  "ref 5 is not defined before this node");
	graph_err(G(RELU("0") ", " NODE("{'ref': 0}, [1, {'ref': 9}]"), ""),
		  NULL, INV, "node 1 (aten.foo.default): arg 1[1]", "ref 9");
}

Test(validate, self_ref)
{
	/* Node 0's output is value 1. */
	graph_err(G(RELU("1"), ""), NULL, INV, "node 0 (aten.relu.default)",
		  "ref 1 is not defined before this node");
	graph_err(G(RELU("0") ", " RELU("2"), ""), NULL, INV,
		  "node 1 (aten.relu.default): arg 0", "ref 2");
}

Test(validate, ref_to_a_later_nodes_output)
{
	graph_err(G(RELU("2") ", " RELU("0"), ""), NULL, INV,
		  "node 0 (aten.relu.default): arg 0", "ref 2 is not defined");
	graph_err(G(NODE_KW("'other': {'ref': 2}") ", " RELU("0"), ""), NULL,
		  INV, "node 0 (aten.foo.default): kwarg \"other\"", "ref 2");
}

Test(validate, non_int_ref)
{
	static const char *const bad[] = {
	    "'0'", "0.0", "-1", "nil", "[0]", "18446744073709551615", "true"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[512];
		snprintf(text, sizeof(text), G(RELU("%s"), ""), bad[i]);
		graph_err(text, NULL, INV, "node 0 (aten.relu.default): arg 0",
			  "ref must be a non-negative int");
	}
}

/* ------------------------------------------------------------------------ */
/* Validation: nodes                                                          */
/* ------------------------------------------------------------------------ */

Test(validate, op_names)
{
	static const char *const bad[] = {
	    "add",	 "Aten.add",	       "aten..add",
	    "aten.add.", ".aten.add",	       "aten",
	    "",		 "aten.add-x.default", "1aten.add",
	    "aten.1add", "aten.add.Tensor.",   "aTen.add",
	    "aten. add", "aten.add\\0x"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[512];
		snprintf(text, sizeof(text),
			 G("{'op': '%s', 'args': [], " OUT23 "}", ""), bad[i]);
		graph_err(text, NULL, INV, "node 0: malformed op name \"",
			  NULL);
	}
	graph_err(G("{'op': 'Aten.add', " OUT23 "}", ""), NULL, INV,
		  "malformed op name \"Aten.add\"", NULL);
	static const char *const good[] = {"aten.add.Tensor",
					   "aten.native_layer_norm.default",
					   "prims.convert_element_type.default",
					   "aten._to_copy.default",
					   "aten.add",
					   "ns_2.op.A_1.b",
					   "_ns.x"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char text[512];
		snprintf(text, sizeof(text), G("{'op': '%s', " OUT23 "}", ""),
			 good[i]);
		kiln_graph_t *g = graph_ok(text, NULL);
		cr_assert_str_eq(g->nodes[0].op, good[i]);
		cr_assert_eq(g->nodes[0].n_args, 0);
		kiln_graph_free(g);
	}
}

Test(validate, node_shape)
{
	graph_err(G(RELU("0") ", 3", ""), NULL, INV, "node 1",
		  "node must be a map");
	graph_err(G("{'args': [], " OUT23 "}", ""), NULL, INV, "node 0",
		  "missing string \"op\"");
	graph_err(G("{'op': 5, " OUT23 "}", ""), NULL, INV, "node 0",
		  "missing string \"op\"");
	graph_err(G("{'op': 'aten.foo.default', 'args': {}, " OUT23 "}", ""),
		  NULL, INV, "node 0 (aten.foo.default)",
		  "\"args\" must be an array");
	graph_err(G("{'op': 'aten.foo.default', 'kwargs': [], " OUT23 "}", ""),
		  NULL, INV, "node 0 (aten.foo.default)",
		  "\"kwargs\" must be a map");
	graph_err(G("{'op': 'aten.foo.default', 'args': []}", ""), NULL, INV,
		  "node 0 (aten.foo.default)", "missing \"out\" array");
	graph_err(G("{'op': 'aten.foo.default', 'out': {}}", ""), NULL, INV,
		  "missing \"out\" array", NULL);
	/* args and kwargs may be nil or absent; out may be empty. */
	kiln_graph_t *g =
	    graph_ok(G("{'op': 'aten.foo.default', 'args': nil, 'kwargs': nil, "
		       "'out': []}, "
		       "{'op': 'aten.bar.default', 'out': []}",
		       ""),
		     NULL);
	cr_assert_eq(g->nodes[0].n_args, 0);
	cr_assert_eq(g->nodes[0].n_kwargs, 0);
	cr_assert_eq(g->nodes[0].n_out, 0);
	cr_assert_eq(g->nodes[1].out_first, 1);
	cr_assert_eq(g->n_values, 1);
	kiln_graph_free(g);
}

Test(validate, nan_rejected_inf_accepted)
{
	graph_err(G(NODE("{'ref': 0}, nan"), ""), NULL, INV,
		  "node 0 (aten.foo.default): arg 1",
		  "NaN is not allowed as an argument");
	graph_err(G(NODE("{'ref': 0}, f32(nan)"), ""), NULL, INV, "arg 1",
		  "NaN");
	graph_err(G(NODE("{'ref': 0}, [1.0, -nan]"), ""), NULL, INV, "arg 1[1]",
		  "NaN");
	graph_err(G(NODE_KW("'eps': nan"), ""), NULL, INV, "kwarg \"eps\"",
		  "NaN");

	kiln_graph_t *g = graph_ok(
	    G(NODE("{'ref': 0}, inf, -inf, f32(inf), f32(-inf), -0.0"), ""),
	    NULL);
	const kiln_arg_t *a = g->nodes[0].args;
	for (int i = 1; i <= 4; i++)
		cr_assert_eq(a[i].kind, KILN_ARG_FLOAT);
	cr_assert(isinf(a[1].u.f) && a[1].u.f > 0);
	cr_assert(isinf(a[2].u.f) && a[2].u.f < 0);
	cr_assert(isinf(a[3].u.f) && a[3].u.f > 0);
	cr_assert(isinf(a[4].u.f) && a[4].u.f < 0);
	cr_assert(a[5].u.f == 0.0 && signbit(a[5].u.f));
	kiln_graph_free(g);
}

Test(validate, map_args)
{
	graph_err(G(NODE("{'foo': 1}"), ""), NULL, INV,
		  "node 0 (aten.foo.default): arg 0",
		  "a map argument must be {\"ref\": v} or {\"sym\": expr}");
	graph_err(G(NODE("{'ref': 0, 'x': 1}"), ""), NULL, INV, "arg 0",
		  "a map argument must be");
	graph_err(G(NODE("{'ref': 0, 'sym': 's0'}"), ""), NULL, INV, "arg 0",
		  "a map argument must be");
	graph_err(G(NODE("{}"), ""), NULL, INV, "arg 0",
		  "a map argument must be");
	graph_err(G(NODE("[{'dtype': 'f32'}]"), ""), NULL, INV, "arg 0[0]",
		  "a map argument must be");
	/* bin and ext are not arguments either. */
	graph_err(G(NODE("bin('x')"), ""), NULL, INV, "arg 0",
		  "bin is not a valid argument");
	graph_err(G(NODE("ext(1, 'x')"), ""), NULL, INV, "arg 0",
		  "ext is not a valid argument");
}

Test(validate, other_args)
{
	graph_err(G(NODE("18446744073709551615"), ""), NULL, INV, "arg 0",
		  "integer out of int64 range");
	kiln_limits_t lim = deflim();
	lim.max_str_bytes = 16; /* "aten.foo.default" is 16 bytes */
	graph_err(G(NODE("'abcdefghijklmnopq'"), ""), &lim, INV, "arg 0",
		  "string longer than 16 bytes");
	kiln_graph_t *g = graph_ok(G(NODE("'abcdefghijklmnop'"), ""), &lim);
	kiln_graph_free(g);
	/* The limit applies to op names too. */
	lim.max_str_bytes = 15;
	graph_err(G(NODE("1"), ""), &lim, INV, "node 0",
		  "malformed op name \"aten.foo.default\"");

	g = graph_ok(G(NODE("nil, true, false, -9223372036854775808, "
			    "9223372036854775807, 'strided', [], [[1], 'a'], "
			    "{'sym': 's0 + 1'}, {'sym': 7}"),
		       ""),
		     NULL);
	const kiln_arg_t *a = g->nodes[0].args;
	cr_assert_eq(g->nodes[0].n_args, 10);
	cr_assert_eq(a[0].kind, KILN_ARG_NIL);
	cr_assert_eq(a[1].kind, KILN_ARG_BOOL);
	cr_assert(a[1].u.b);
	cr_assert_not(a[2].u.b);
	cr_assert_eq(a[3].kind, KILN_ARG_INT);
	cr_assert_eq(a[3].u.i, INT64_MIN);
	cr_assert_eq(a[4].u.i, INT64_MAX);
	cr_assert_eq(a[5].kind, KILN_ARG_STR);
	cr_assert_str_eq(a[5].u.s, "strided");
	cr_assert_eq(a[6].kind, KILN_ARG_LIST);
	cr_assert_eq(a[6].n, 0);
	cr_assert_eq(a[7].u.list[0].u.list[0].u.i, 1);
	cr_assert_str_eq(a[7].u.list[1].u.s, "a");
	cr_assert_eq(a[8].kind, KILN_ARG_SYM);
	cr_assert_eq(a[9].kind, KILN_ARG_SYM);
	cr_assert_eq(a[9].u.sym->kind, KILN_EX_CONST);
	cr_assert_eq(a[9].u.sym->c, 7);
	kiln_graph_free(g);
}

Test(validate, kwargs)
{
	graph_err(G(NODE_KW("'alpha': 1, 'beta': 2, 'alpha': 3"), ""), NULL,
		  INV, "node 0 (aten.foo.default)",
		  "kwarg \"alpha\" given twice");
	graph_err(G(NODE_KW("'a': 1, 1: 2"), ""), NULL, INV,
		  "node 0 (aten.foo.default)",
		  "kwarg 1: key must be an identifier string");
	graph_err(G(NODE_KW("'a b': 1"), ""), NULL, INV, "kwarg 0: key must be",
		  NULL);
	graph_err(G(NODE_KW("'': 1"), ""), NULL, INV, "kwarg 0: key must be",
		  NULL);

	/* Sorted by key (bytewise) after decode. */
	kiln_graph_t *g = graph_ok(
	    G(NODE_KW("'zeta': 1, 'alpha': 'x', 'Beta': nil, 'alpha2': 2.5, "
		      "'_k': [1]"),
	      ""),
	    NULL);
	const kiln_node_t *n = &g->nodes[0];
	cr_assert_eq(n->n_kwargs, 5);
	static const char *const want[] = {"Beta", "_k", "alpha", "alpha2",
					   "zeta"};
	for (int i = 0; i < 5; i++)
		cr_assert_str_eq(n->kwargs[i].key, want[i]);
	cr_assert_eq(n->kwargs[0].val.kind, KILN_ARG_NIL);
	cr_assert_eq(n->kwargs[2].val.kind, KILN_ARG_STR);
	cr_assert_eq(n->kwargs[4].val.u.i, 1);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Validation: outputs and limits                                             */
/* ------------------------------------------------------------------------ */

Test(validate, outputs)
{
	graph_err(G("", "1"), NULL, INV, "output 0",
		  "must be {\"ref\": v} or {\"sym\": expr}");
	graph_err(G("", "{'ref': 0}, [0]"), NULL, INV, "output 1", "must be");
	graph_err(G("", "nil"), NULL, INV, "output 0", "must be");
	graph_err(G("", "{'x': 0}"), NULL, INV, "output 0",
		  "a map argument must be");
	graph_err(G("", "{'ref': 0, 'name': 'y'}"), NULL, INV, "output 0",
		  "a map argument must be");
	graph_err(G("", "{'ref': 1}"), NULL, INV, "output 0",
		  "ref 1 is not defined");
	graph_err(G(RELU("0"), "{'ref': 1}, {'ref': 99}"), NULL, INV,
		  "output 1", "ref 99 is not defined");
	graph_err(G("", "{'ref': -1}"), NULL, INV, "output 0",
		  "ref must be a non-negative int");
	graph_err(G("", "{'ref': '0'}"), NULL, INV, "output 0",
		  "ref must be a non-negative int");
}

Test(validate, nodes_over_the_limit)
{
	kiln_limits_t lim = deflim();
	lim.max_nodes = 2;
	kiln_graph_t *g = graph_ok(G(RELU("0") ", " RELU("1"), ""), &lim);
	kiln_graph_free(g);
	graph_err(G(RELU("0") ", " RELU("1") ", " RELU("2"), ""), &lim,
		  KILN_ETOOLARGE, "3 nodes exceed the limit 2", NULL);
}

Test(validate, values_over_the_limit)
{
	kiln_limits_t lim = deflim();
	lim.max_values = 3; /* 1 input + outputs */
	kiln_graph_t *g = graph_ok(G(RELU("0") ", " RELU("1"), ""), &lim);
	kiln_graph_free(g);
	graph_err(G(RELU("0") ", " RELU("1") ", " RELU("2"), ""), &lim,
		  KILN_ETOOLARGE, "4 values exceed the limit 3", NULL);
	/* Inputs count too, and so do multi-output nodes. */
	graph_err(GI("{'dtype': 'f32', 'shape': []}, "
		     "{'dtype': 'f32', 'shape': []}, "
		     "{'dtype': 'f32', 'shape': []}, {'sym': 1}"),
		  &lim, KILN_ETOOLARGE, "4 values exceed", NULL);
	graph_err(G("{'op': 'aten.foo.default', 'out': [{'dtype': 'f32', "
		    "'shape': []}, {'dtype': 'f32', 'shape': []}, "
		    "{'dtype': 'f32', 'shape': []}]}",
		    ""),
		  &lim, KILN_ETOOLARGE, "4 values exceed the limit 3", NULL);
}

/* ------------------------------------------------------------------------ */
/* Accepted edge cases                                                        */
/* ------------------------------------------------------------------------ */

Test(accept, rank_zero_tensor)
{
	kiln_graph_t *g = graph_ok(GI("{'dtype': 'f64', 'shape': []}, "
				      "{'dtype': 'i64', 'shape': [], "
				      "'strides': []}"),
				   NULL);
	cr_assert_eq(g->values[0].rank, 0);
	cr_assert_not_null(g->values[0].sizes);
	cr_assert_not_null(g->values[0].strides);
	cr_assert_not(g->values[0].strides_given);
	cr_assert(g->values[1].strides_given);
	kiln_graph_free(g);
}

Test(accept, size_zero_dims_use_torch_strides)
{
	/* torch: stride[i] = stride[i+1] * max(size[i+1], 1). */
	kiln_graph_t *g =
	    graph_ok(GI("{'dtype': 'f32', 'shape': [2, 0, 3]}, "
			"{'dtype': 'f32', 'shape': [0]}, "
			"{'dtype': 'f32', 'shape': [4, 0, 0, 5]}"),
		     NULL);
	const kiln_value_t *v = g->values;
	expect_dim(v[0].sizes[1], 0);
	expect_dim(v[0].strides[0], 3);
	expect_dim(v[0].strides[1], 3);
	expect_dim(v[0].strides[2], 1);
	expect_dim(v[1].strides[0], 1);
	expect_dim(v[2].strides[0], 5);
	expect_dim(v[2].strides[1], 5);
	expect_dim(v[2].strides[2], 5);
	expect_dim(v[2].strides[3], 1);
	kiln_graph_free(g);
}

Test(accept, int64_max_size)
{
	kiln_graph_t *g = graph_ok(
	    GI("{'dtype': 'u8', 'shape': [9223372036854775807]}, "
	       "{'dtype': 'u8', 'shape': [1, i64(9223372036854775807)]}, "
	       "{'dtype': 'u8', 'shape': ['9223372036854775807'], "
	       "'strides': [9223372036854775807]}"),
	    NULL);
	expect_dim(g->values[0].sizes[0], INT64_MAX);
	expect_dim(g->values[0].strides[0], 1);
	expect_dim(g->values[1].strides[0], INT64_MAX);
	expect_dim(g->values[2].sizes[0], INT64_MAX);
	expect_dim(g->values[2].strides[0], INT64_MAX);
	kiln_graph_free(g);
}

Test(validate, contiguous_stride_overflow)
{
	/* [2, 2^62, 4]: the contiguous stride of dim 0 would be 2^64; the
	 * same sizes with explicit strides are accepted. */
	kiln_graph_t *g =
	    graph_ok(GI("{'dtype': 'u8', 'shape': [4611686018427387904, 4], "
			"'strides': [4, 1]}"),
		     NULL);
	kiln_graph_free(g);
	graph_err(GI("{'dtype': 'u8', 'shape': [2, 4611686018427387904, 4]}"),
		  NULL, INV, "input 0", "contiguous stride overflows int64");
}

Test(accept, empty_graph)
{
	kiln_graph_t *g = graph_ok("{'format': 'kiln.graph/1', 'inputs': [], "
				   "'nodes': [], 'outputs': []}",
				   NULL);
	cr_assert_eq(g->n_inputs, 0);
	cr_assert_eq(g->n_nodes, 0);
	cr_assert_eq(g->n_values, 0);
	cr_assert_eq(g->n_outputs, 0);
	cr_assert_eq(g->n_symbols, 0);
	kiln_graph_free(g);
	/* symbols nil and unknown top-level keys are fine */
	g = graph_ok("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': [], "
		     "'outputs': [], 'symbols': nil, 'comment': 'x', 7: 8}",
		     NULL);
	kiln_graph_free(g);
}

Test(accept, outputs_naming_an_input_twice)
{
	kiln_graph_t *g =
	    graph_ok(G(RELU("0"), "{'ref': 0}, {'ref': 0}, {'ref': 1}, "
				  "{'sym': 's0'}, {'sym': '2*s1'}"),
		     NULL);
	cr_assert_eq(g->n_outputs, 5);
	cr_assert_eq(g->outputs[0].u.ref, 0);
	cr_assert_eq(g->outputs[1].u.ref, 0);
	cr_assert_eq(g->outputs[2].u.ref, 1);
	cr_assert_eq(g->outputs[3].kind, KILN_ARG_SYM);
	kiln_graph_free(g);
}

Test(accept, symbolic_contiguous_strides)
{
	kiln_graph_t *g =
	    graph_ok(GI("{'dtype': 'f32', 'shape': [4, 's0', 64]}, "
			"{'dtype': 'f32', 'shape': ['s1', 's0', 3]}, "
			"{'dtype': 'f32', 'shape': [2, 's0 + 1', 1]}, "
			"{'dtype': 'f32', 'shape': [5, 's0']}"),
		     NULL);
	const kiln_value_t *v = g->values;
	expect_dim_str(g, v[0].strides[0], "64*s0");
	expect_dim(v[0].strides[1], 64);
	expect_dim(v[0].strides[2], 1);
	expect_dim_str(g, v[1].strides[0], "3*s0");
	expect_dim(v[1].strides[1], 3);
	expect_dim_str(g, v[2].strides[0], "1 + s0");
	expect_dim(v[2].strides[1], 1);
	expect_dim_str(g, v[3].strides[0], "s0");
	expect_dim(v[3].strides[1], 1);
	/* The computed strides evaluate like torch's. */
	int64_t syms[2] = {7, 3}, out = 0;
	cr_assert_eq(kiln_expr_eval(v[0].strides[0].e, syms, &out), 0);
	cr_assert_eq(out, 448);
	cr_assert_eq(kiln_expr_eval(v[2].strides[0].e, syms, &out), 0);
	cr_assert_eq(out, 8);
	kiln_graph_free(g);
}

Test(accept, explicit_strides_kept)
{
	kiln_graph_t *g = graph_ok(
	    GI("{'dtype': 'f32', 'shape': [2, 's0'], 'strides': [1, 2]}, "
	       "{'dtype': 'f32', 'shape': [2, 3], 'strides': nil}, "
	       "{'dtype': 'f32', 'shape': [2, 's0'], 'strides': ['s0', 0]}"),
	    NULL);
	cr_assert(g->values[0].strides_given);
	expect_dim(g->values[0].strides[0], 1);
	expect_dim(g->values[0].strides[1], 2);
	cr_assert_not(g->values[1].strides_given); /* nil: contiguous */
	expect_dim(g->values[1].strides[0], 3);
	expect_dim_str(g, g->values[2].strides[0], "s0");
	expect_dim(g->values[2].strides[1], 0);
	kiln_graph_free(g);
}

Test(accept, extra_keys_ignored)
{
	kiln_graph_t *g = graph_ok(
	    PRE " 'inputs': [{'dtype': 'f32', 'shape': [2, 3], 'name': 'x', "
		"'requires_grad': true}],"
		" 'nodes': [{'op': 'aten.relu.default', 'name': 'relu_1', "
		"'args': [{'ref': 0}], 'meta': {'stack': 'a.py:1'}, " OUT23
		"}], 'outputs': [{'ref': 1}], 'version': 3}",
	    NULL);
	cr_assert_eq(g->n_nodes, 1);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Packing                                                                    */
/* ------------------------------------------------------------------------ */

static void pack_graph(const kiln_graph_t *g, msgpack_sbuffer *sb)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_graph_pack(g, &pk), 0);
}

static void round_trip(const char *text)
{
	kiln_graph_t *g1 = graph_ok(text, NULL);
	msgpack_sbuffer p1, p2;
	pack_graph(g1, &p1);
	kiln_graph_t *g2 = NULL;
	char err[256] = "";
	int rc = kiln_graph_decode((const uint8_t *)p1.data, p1.size, NULL, &g2,
				   err, sizeof(err));
	cr_assert_eq(rc, 0, "re-decode: %s\n  text: %s", err, text);
	pack_graph(g2, &p2);
	cr_assert_eq(p1.size, p2.size, "re-pack differs for %s", text);
	cr_assert_arr_eq(p1.data, p2.data, p1.size, "re-pack differs for %s",
			 text);

	kiln_target_t t = test_target("cpu", "x86-64", "+avx2");
	for (int structure = 0; structure < 2; structure++) {
		uint8_t s1[KILN_SIG_BYTES], s2[KILN_SIG_BYTES];
		cr_assert_eq(kiln_signature(g1, &t, NULL, "fp", structure, s1),
			     0);
		cr_assert_eq(kiln_signature(g2, &t, NULL, "fp", structure, s2),
			     0);
		cr_assert_arr_eq(s1, s2, KILN_SIG_BYTES,
				 "signature differs after a round trip: %s",
				 text);
	}
	cr_assert_eq(g1->n_values, g2->n_values);
	cr_assert_eq(g1->n_symbols, g2->n_symbols);
	for (uint32_t i = 0; i < g1->n_values; i++)
		cr_assert_eq(g1->values[i].strides_given,
			     g2->values[i].strides_given);
	msgpack_sbuffer_destroy(&p1);
	msgpack_sbuffer_destroy(&p2);
	kiln_graph_free(g1);
	kiln_graph_free(g2);
}

Test(pack, round_trips)
{
	round_trip(GRAPH_EX1);
	round_trip(GRAPH_EX2);
	round_trip("{'format': 'kiln.graph/1', 'inputs': [], 'nodes': [], "
		   "'outputs': []}");
	round_trip(
	    "{'format': 'kiln.graph/1',"
	    " 'symbols': {'n': {'min': 1, 'max': 64, 'hint': 8}, 'm': {},"
	    "   'unused': {'min': 3}},"
	    " 'inputs': [{'sym': 'n'}, {'sym': '(m - 1)//2 + 1'},"
	    "   {'dtype': 'bf16', 'shape': ['n', 'max(1, m)', 0],"
	    "    'strides': ['m % 3', '-n + 7*m', 1]},"
	    "   {'dtype': 'bool', 'shape': []}, {'sym': '-5'}],"
	    " 'nodes': [{'op': 'aten.foo.bar', 'args': [nil, true, false, "
	    "   -9223372036854775808, 18, 0.1, inf, -inf, -0.0, 'str', "
	    "   [[], [1, {'ref': 2}]], {'sym': 'n*m'}],"
	    "   'kwargs': {'z': 1, 'a': {'sym': 'min(n, m) - (n - m)'}},"
	    "   'out': [{'dtype': 'f16', 'shape': ['n', 2], 'strides': [1, "
	    "'n']}, {'dtype': 'i8', 'shape': [2, 'm', 'n']}]}],"
	    " 'outputs': [{'ref': 6}, {'ref': 5}, {'sym': 'n + m'}, "
	    "   {'ref': 0}]}");
}

Test(pack, round_trip_with_long_symbol_names)
{
	/* A valid graph: a 64-byte symbol name (the longest allowed) used 16
	 * times in one 1039-byte expression (the limit is 16 * 64 + 64
	 * bytes, 31 of 64 nodes). Formatted with spaces around '+', the
	 * expression is 1069 bytes long; kiln_graph_pack must still write
	 * it. */
	char name[65];
	memset(name, 'a', 64);
	name[64] = '\0';
	char expr[1100] = "";
	for (int i = 0; i < 16; i++) {
		if (i > 0)
			strcat(expr, "+");
		strcat(expr, name);
	}
	cr_assert_eq(strlen(expr), 1039);
	char text[2400];
	snprintf(text, sizeof(text),
		 "{'format': 'kiln.graph/1', 'symbols': {'%s': {}}, "
		 "'inputs': [{'dtype': 'f32', 'shape': ['%s']}], 'nodes': [], "
		 "'outputs': [{'ref': 0}]}",
		 name, expr);
	kiln_graph_t *g = graph_ok(text, NULL);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	int rc = kiln_graph_pack(g, &pk);
	msgpack_sbuffer_destroy(&sb);
	kiln_graph_free(g);
	cr_assert_eq(rc, 0, "kiln_graph_pack failed: %d (%s)", rc,
		     kiln_strerror(rc));
	round_trip(text);
}
