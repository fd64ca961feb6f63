/*
 * test_expr.c — symbolic integer expressions (protocol/expr.c): parsing
 * (through the graph decoder, as a {"sym": expr} input), constant folding,
 * formatting and evaluation with Python's floor division and modulo.
 */
#include "helpers.h"

#include <errno.h>

/* A graph whose only input is {"sym": expr}; symbols s0 and s1. */
static int expr_decode(const char *expr, const kiln_limits_t *lim,
		       kiln_graph_t **g, char *err, size_t errlen)
{
	char text[4096];
	int n = snprintf(text, sizeof(text),
			 "{'format': 'kiln.graph/1', 'symbols': {'s0': {}, "
			 "'s1': {}}, 'inputs': [{'sym': '%s'}], 'nodes': [], "
			 "'outputs': []}",
			 expr);
	cr_assert_lt((size_t)n, sizeof(text));
	return graph_from_text(text, lim, g, err, errlen);
}

static kiln_graph_t *expr_ok(const char *expr)
{
	kiln_graph_t *g = NULL;
	char err[512] = "";
	int rc = expr_decode(expr, NULL, &g, err, sizeof(err));
	cr_assert_eq(rc, 0, "\"%s\" rejected: %s", expr, err);
	cr_assert_eq(g->values[0].kind, KILN_VAL_SYMINT);
	return g;
}

static const kiln_expr_t *E(const kiln_graph_t *g)
{
	return g->values[0].sym;
}

static void expr_err(const char *expr, const kiln_limits_t *lim,
		     const char *needle)
{
	kiln_graph_t *g = NULL;
	char err[512] = "";
	int rc = expr_decode(expr, lim, &g, err, sizeof(err));
	bool out_null = g == NULL;
	if (rc == 0)
		kiln_graph_free(g); /* before a failing assert: no leak */
	cr_assert_eq(rc, KILN_EINVGRAPH, "\"%s\": rc %d (%s), message \"%s\"",
		     expr, rc, kiln_strerror(rc), err);
	cr_assert(out_null);
	ASSERT_MSG_HAS(err, "input 0: sym: expression");
	ASSERT_MSG_HAS(err, needle);
}

static void fmt(const kiln_graph_t *g, char *buf, size_t n)
{
	int len = kiln_expr_format(g, E(g), buf, n);
	cr_assert_lt((size_t)len, n);
	cr_assert_eq((size_t)len, strlen(buf));
}

/* ------------------------------------------------------------------------ */
/* Parse, format, evaluate                                                    */
/* ------------------------------------------------------------------------ */

static const int64_t xs[8] = {-7, -1, 0, 1, 2, 5, 16, 4096};

/* Expected values from CPython for s0 = xs[i]. */
static const struct {
	const char *expr;
	const char *formatted;
	int64_t want[8];
} cases[] = {
    {"s0", "s0", {-7, -1, 0, 1, 2, 5, 16, 4096}},
    {"64*s0", "64*s0", {-448, -64, 0, 64, 128, 320, 1024, 262144}},
    {"s0*64", "64*s0", {-448, -64, 0, 64, 128, 320, 1024, 262144}},
    {"s0 + 1", "1 + s0", {-6, 0, 1, 2, 3, 6, 17, 4097}},
    {"(s0 - 1)//2 + 1", "1 + (s0 - 1)//2", {-3, 0, 0, 1, 1, 3, 8, 2048}},
    {"max(1, s0)", "max(1, s0)", {1, 1, 1, 1, 2, 5, 16, 4096}},
    {"-s0 % 3", "-s0%3", {1, 1, 0, 2, 1, 1, 2, 2}},
    {"min(s0, 8) - s0 // 3",
     "min(s0, 8) - s0//3",
     {-4, 0, 0, 1, 2, 4, 3, -1357}},
    {"s0 % -3", "s0%(-3)", {-1, -1, 0, -2, -1, -1, -2, -2}},
    {"(s0 * 5 - 3) // -4",
     "(5*s0 - 3)//(-4)",
     {9, 2, 0, -1, -2, -6, -20, -5120}},
    {"--s0", "--s0", {-7, -1, 0, 1, 2, 5, 16, 4096}},
    {"-(s0 + 1)", "-(1 + s0)", {6, 0, -1, -2, -3, -6, -17, -4097}},
    {"s0 + -3", "(-3) + s0", {-10, -4, -3, -2, -1, 2, 13, 4093}},
    {"\t s0\t+ 1 ", "1 + s0", {-6, 0, 1, 2, 3, 6, 17, 4097}},
    {"s0 - (s0 - 1)", "s0 - (s0 - 1)", {1, 1, 1, 1, 1, 1, 1, 1}},
    {"s0 + 2*3", "6 + s0", {-1, 5, 6, 7, 8, 11, 22, 4102}},
    {"(1 + 2) * s0", "3*s0", {-21, -3, 0, 3, 6, 15, 48, 12288}},
};

Test(expr, parse_format_eval)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kiln_graph_t *g = expr_ok(cases[i].expr);
		char buf[256];
		fmt(g, buf, sizeof(buf));
		cr_assert_str_eq(buf, cases[i].formatted, "format of \"%s\"",
				 cases[i].expr);
		for (int k = 0; k < 8; k++) {
			int64_t syms[2] = {xs[k], 0}, out = 0;
			cr_assert_eq(kiln_expr_eval(E(g), syms, &out), 0);
			cr_assert_eq(out, cases[i].want[k],
				     "\"%s\" at s0=%lld: %lld, want %lld",
				     cases[i].expr, (long long)xs[k],
				     (long long)out,
				     (long long)cases[i].want[k]);
		}
		/* The formatted text parses to a tree that formats and
		 * evaluates the same. */
		kiln_graph_t *g2 = expr_ok(buf);
		char buf2[256];
		fmt(g2, buf2, sizeof(buf2));
		cr_assert_str_eq(buf2, buf);
		for (int k = 0; k < 8; k++) {
			int64_t syms[2] = {xs[k], 0}, a = 0, b = 0;
			cr_assert_eq(kiln_expr_eval(E(g), syms, &a), 0);
			cr_assert_eq(kiln_expr_eval(E(g2), syms, &b), 0);
			cr_assert_eq(a, b);
		}
		kiln_graph_free(g2);
		kiln_graph_free(g);
	}
}

Test(expr, floor_division_and_modulo_signs)
{
	/* CPython: a // b, a % b */
	static const int64_t t[][4] = {{7, 2, 3, 1},
				       {-7, 2, -4, 1},
				       {7, -2, -4, -1},
				       {-7, -2, 3, -1},
				       {0, 5, 0, 0},
				       {6, 3, 2, 0},
				       {-6, 3, -2, 0},
				       {1, -1, -1, 0},
				       {INT64_MIN, 2, INT64_MIN / 2, 0},
				       {INT64_MAX, -1, -INT64_MAX, 0}};
	kiln_graph_t *gd = expr_ok("s0 // s1");
	kiln_graph_t *gm = expr_ok("s0 % s1");
	char buf[64];
	fmt(gd, buf, sizeof(buf));
	cr_assert_str_eq(buf, "s0//s1");
	fmt(gm, buf, sizeof(buf));
	cr_assert_str_eq(buf, "s0%s1");
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int64_t syms[2] = {t[i][0], t[i][1]}, q = 0, r = 0;
		cr_assert_eq(kiln_expr_eval(E(gd), syms, &q), 0);
		cr_assert_eq(kiln_expr_eval(E(gm), syms, &r), 0);
		cr_assert_eq(q, t[i][2], "%lld // %lld = %lld",
			     (long long)t[i][0], (long long)t[i][1],
			     (long long)q);
		cr_assert_eq(r, t[i][3], "%lld %% %lld = %lld",
			     (long long)t[i][0], (long long)t[i][1],
			     (long long)r);
	}
	kiln_graph_free(gd);
	kiln_graph_free(gm);
}

Test(expr, two_symbols_and_eval_order)
{
	kiln_graph_t *g = expr_ok("max(s1, s0) * 2 - min(s0, s1 // 2)");
	int64_t syms[2] = {3, 10}, out = 0;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), 0);
	cr_assert_eq(out, 10 * 2 - 3);
	syms[0] = 30;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), 0);
	cr_assert_eq(out, 30 * 2 - 5);
	char buf[128];
	fmt(g, buf, sizeof(buf));
	cr_assert_str_eq(buf, "2*max(s1, s0) - min(s0, s1//2)");
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Constant folding                                                           */
/* ------------------------------------------------------------------------ */

static void expect_const(const char *expr, int64_t c)
{
	kiln_graph_t *g = expr_ok(expr);
	cr_assert_eq(E(g)->kind, KILN_EX_CONST, "\"%s\" is not a constant",
		     expr);
	cr_assert_eq(E(g)->c, c, "\"%s\" folded to %lld, want %lld", expr,
		     (long long)E(g)->c, (long long)c);
	kiln_graph_free(g);
}

Test(expr, constant_folding)
{
	expect_const("2*3+1", 7);
	expect_const("7", 7);
	expect_const("-7 // 2", -4);
	expect_const("-7 % 3", 2);
	expect_const("7 % -3", -2);
	expect_const("7 // -2", -4);
	expect_const("-7 // -2", 3);
	expect_const("-7 % -3", -1);
	expect_const("max(3, min(10, 4))", 4);
	expect_const("-(-5)", 5);
	expect_const("(((1)))", 1);
	expect_const("9223372036854775807", INT64_MAX);
	expect_const("-9223372036854775807 - 1", INT64_MIN);
	expect_const("0 * 5 - 0", 0);

	/* A folded size is the same constant dimension as a plain int. */
	kiln_graph_t *g =
	    graph_ok("{'format': 'kiln.graph/1', 'inputs': [{'dtype': 'f32', "
		     "'shape': ['2*3+1', 7]}], 'nodes': [], 'outputs': []}",
		     NULL);
	cr_assert_null(g->values[0].sizes[0].e);
	cr_assert_eq(g->values[0].sizes[0].c, 7);
	cr_assert_null(g->values[0].strides[0].e);
	cr_assert_eq(g->values[0].strides[0].c, 7);
	kiln_graph_free(g);

	/* Constants fold inside symbolic trees too. */
	g = expr_ok("s0 * (4 // 2)");
	cr_assert_eq(E(g)->kind, KILN_EX_MUL);
	cr_assert_eq(E(g)->a->kind, KILN_EX_CONST);
	cr_assert_eq(E(g)->a->c, 2);
	cr_assert_eq(E(g)->b->kind, KILN_EX_SYM);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Rejections                                                                 */
/* ------------------------------------------------------------------------ */

Test(expr, overflow_rejected)
{
	expr_err("9223372036854775807+1", NULL, "overflow");
	expr_err("9223372036854775808", NULL, "integer overflow");
	expr_err("99999999999999999999 - s0", NULL, "integer overflow");
	expr_err("-(-9223372036854775807 - 1)", NULL, "overflow");
	expr_err("4611686018427387904 * 2", NULL, "overflow");
	expr_err("(-9223372036854775807 - 1) - 1", NULL, "overflow");
	expr_err("(-9223372036854775807 - 1) // -1", NULL, "overflow");
	expr_err("s0 + (9223372036854775807 + 1)", NULL, "overflow");
}

Test(expr, division_by_zero_rejected)
{
	expr_err("1 // 0", NULL, "division by zero");
	expr_err("5 % 0", NULL, "division by zero");
	expr_err("s0 + 3 // (2 - 2)", NULL, "division by zero");
	/* A divisor that is the constant 0 makes the expression invalid
	 * for every value of the symbols (sympy raises ZeroDivisionError),
	 * so it is rejected even under a symbolic numerator. */
	expr_err("s0 // 0", NULL, "division by zero");
	expr_err("s0 % (1 - 1) + 1", NULL, "division by zero");
}

Test(expr, too_many_nodes_rejected)
{
	/* 65 symbols and 64 additions: over the default 64 nodes. */
	char e[1024] = "s0";
	for (int i = 0; i < 64; i++)
		strcat(e, "+s1");
	expr_err(e, NULL, "expression too large");
	/* Constants count before they are folded. */
	strcpy(e, "1");
	for (int i = 0; i < 64; i++)
		strcat(e, "+1");
	expr_err(e, NULL, "too large");
	/* Nesting. */
	char deep[512];
	memset(deep, '(', 100);
	strcpy(deep + 100, "s0");
	memset(deep + 102, ')', 100);
	deep[202] = '\0';
	expr_err(deep, NULL, "expression too deep");
	memset(deep, '-', 100);
	strcpy(deep + 100, "s0");
	expr_err(deep, NULL, "expression too deep");
	/* Length, before parsing. */
	char lng[1400];
	memset(lng, ' ', 1200);
	strcpy(lng + 1200, "s0");
	expr_err(lng, NULL, "expression too long");

	/* The limit is configurable. */
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	lim.max_expr_nodes = 3;
	expr_err("s0 + s1 + s0", &lim, "too large");
	kiln_graph_t *g = NULL;
	char err[256];
	cr_assert_eq(expr_decode("s0 + s1", &lim, &g, err, sizeof(err)), 0,
		     "%s", err);
	kiln_graph_free(g);
	/* 64 nodes exactly (32 symbols, a negation, 31 additions) is fine
	 * with the default; one more negation is not. */
	strcpy(e, "-s0");
	for (int i = 0; i < 31; i++)
		strcat(e, "+s1");
	g = expr_ok(e);
	kiln_graph_free(g);
	memmove(e + 1, e, strlen(e) + 1);
	e[0] = '-';
	expr_err(e, NULL, "too large");
}

Test(expr, eval_errors)
{
	kiln_graph_t *g = expr_ok("s0 // s1");
	int64_t syms[2] = {5, 0}, out = 0;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	syms[0] = INT64_MIN;
	syms[1] = -1;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	kiln_graph_free(g);

	g = expr_ok("s0 % s1");
	syms[0] = 5;
	syms[1] = 0;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	kiln_graph_free(g);

	g = expr_ok("s0 * s1");
	syms[0] = (int64_t)1 << 32;
	syms[1] = (int64_t)1 << 31;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	syms[1] = ((int64_t)1 << 30);
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), 0);
	cr_assert_eq(out, (int64_t)1 << 62);
	kiln_graph_free(g);

	g = expr_ok("s0 + 1");
	syms[0] = INT64_MAX;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	kiln_graph_free(g);

	g = expr_ok("s0 - s1");
	syms[0] = INT64_MIN;
	syms[1] = 1;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	kiln_graph_free(g);

	g = expr_ok("-s0");
	syms[0] = INT64_MIN;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), KILN_EINVGRAPH);
	syms[0] = INT64_MAX;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &out), 0);
	cr_assert_eq(out, -INT64_MAX);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* kiln_expr_format's snprintf contract                                      */
/* ------------------------------------------------------------------------ */

Test(expr, format_truncates_like_snprintf)
{
	kiln_graph_t *g = expr_ok("64*s0");
	char buf[8];
	memset(buf, 'X', sizeof(buf));
	cr_assert_eq(kiln_expr_format(g, E(g), buf, 4), 5);
	cr_assert_str_eq(buf, "64*");
	cr_assert_eq(buf[4], 'X', "wrote past n");
	cr_assert_eq(kiln_expr_format(g, E(g), buf, 1), 5);
	cr_assert_str_eq(buf, "");
	cr_assert_eq(kiln_expr_format(g, E(g), NULL, 0), 5);
	cr_assert_eq(kiln_expr_format(g, E(g), buf, 6), 5);
	cr_assert_str_eq(buf, "64*s0");
	kiln_graph_free(g);

	g = expr_ok("max(1, s0) + 2");
	char small[6];
	cr_assert_eq(kiln_expr_format(g, E(g), small, sizeof(small)), 14);
	cr_assert_str_eq(small, "2 + m");
	kiln_graph_free(g);
}

Test(expr, format_of_int64_min_reparses)
{
	/* INT64_MIN is a valid constant ("-9223372036854775807 - 1" folds to
	 * it). Inside a symbolic tree it is formatted; the text must parse
	 * back (kiln_graph_pack relies on it). */
	kiln_graph_t *g = expr_ok("s0 + (-9223372036854775807 - 1)");
	cr_assert_eq(E(g)->kind, KILN_EX_ADD);
	cr_assert_eq(E(g)->a->kind, KILN_EX_CONST);
	cr_assert_eq(E(g)->a->c, INT64_MIN);
	char buf[128];
	fmt(g, buf, sizeof(buf));
	kiln_graph_t *g2 = NULL;
	char err[512] = "";
	int rc = expr_decode(buf, NULL, &g2, err, sizeof(err));
	if (rc != 0)
		kiln_graph_free(g); /* before the failing assert: no leak */
	cr_assert_eq(rc, 0, "formatted \"%s\" does not parse: %s", buf, err);
	int64_t syms[2] = {5, 0}, a = 0, b = 0;
	cr_assert_eq(kiln_expr_eval(E(g), syms, &a), 0);
	cr_assert_eq(kiln_expr_eval(E(g2), syms, &b), 0);
	cr_assert_eq(a, b);
	kiln_graph_free(g2);
	kiln_graph_free(g);
}

/* kiln_expr_eval_str: the parser and evaluator over named values, as the
 * Python runtime evaluates a fallback step's {"sym": expr} arguments. */
Test(expr, eval_str_with_named_values)
{
	const char *names[2] = {"s0", "s1"};
	const int64_t vals[2] = {7, 3};
	char err[256];
	int64_t v = 0;
	cr_assert_eq(kiln_expr_eval_str("(s0 - 1)//2 + 1", names, vals, 2, &v,
					err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(v, 4);
	cr_assert_eq(kiln_expr_eval_str("-s0 % 3 + max(1, s1*s0)", names, vals,
					2, &v, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(v, 2 + 21);
	cr_assert_eq(
	    kiln_expr_eval_str("s9", names, vals, 2, &v, err, sizeof(err)),
	    KILN_EINVGRAPH);
	cr_assert(strstr(err, "s9") != NULL, "%s", err);
	cr_assert_eq(kiln_expr_eval_str("s0 // (s1 - 3)", names, vals, 2, &v,
					err, sizeof(err)),
		     KILN_EINVGRAPH);
	cr_assert(strstr(err, "division by zero") != NULL, "%s", err);
	cr_assert_eq(
	    kiln_expr_eval_str("s0; 1", names, vals, 2, &v, err, sizeof(err)),
	    KILN_EINVGRAPH);
}
