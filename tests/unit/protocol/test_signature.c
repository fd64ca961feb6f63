/*
 * test_signature.c — signatures and structure hashes (protocol/signature.c):
 * golden values, an independent re-encoding of PROTOCOL.md § Signature,
 * invariance under wire-level differences, sensitivity to everything the
 * signature covers, hex codecs, and the target/options decoders.
 */
#include "helpers.h"

#include <openssl/evp.h>

#define FP "kiln/0.1.0 llvm/16.0.6 build/test"

/* Returns a malloc'd copy of text with `from` replaced by `to`; `from` must
 * occur exactly once (or, with all, at least once: every occurrence). */
static char *subst_n(const char *text, const char *from, const char *to,
		     bool all)
{
	size_t fl = strlen(from), tl = strlen(to);
	size_t count = 0;
	for (const char *p = strstr(text, from); p != NULL;
	     p = strstr(p + fl, from))
		count++;
	if (all)
		cr_assert_geq(count, 1, "\"%s\" not in the text", from);
	else
		cr_assert_eq(count, 1, "\"%s\" occurs %zu times", from, count);
	char *out = malloc(strlen(text) + count * (tl + 1) + 1);
	cr_assert_not_null(out);
	char *o = out;
	const char *p = text;
	for (const char *q = strstr(p, from); q != NULL; q = strstr(p, from)) {
		memcpy(o, p, (size_t)(q - p));
		o += q - p;
		memcpy(o, to, tl);
		o += tl;
		p = q + fl;
	}
	strcpy(o, p);
	return out;
}

static char *subst(const char *text, const char *from, const char *to)
{
	return subst_n(text, from, to, false);
}

static void sig_of(const char *text, const kiln_target_t *t,
		   const kiln_compile_opts_t *o, const char *fp, bool structure,
		   uint8_t out[KILN_SIG_BYTES])
{
	kiln_graph_t *g = graph_ok(text, NULL);
	cr_assert_eq(kiln_signature(g, t, o, fp, structure, out), 0);
	kiln_graph_free(g);
}

static kiln_compile_opts_t mode(const char *m)
{
	kiln_compile_opts_t o;
	memset(&o, 0, sizeof(o));
	snprintf(o.mode, sizeof(o.mode), "%s", m);
	return o;
}

static const char *hex(const uint8_t sig[KILN_SIG_BYTES],
		       char buf[KILN_SIG_HEX])
{
	kiln_sig_to_hex(sig, buf);
	return buf;
}

/* ------------------------------------------------------------------------ */
/* Golden values                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Golden signatures of fixed graphs. They pin the canonical encoding of
 * PROTOCOL.md § Signature: clients in other languages and artifacts already
 * stored depend on these exact bytes. A change of the canonical encoding
 * must bump the tag "kiln.sig/1" (and "kiln.struct/1") and then update these
 * values; a change here without a tag bump is a bug.
 */
#define GOLDEN_EX1_CPU                                                         \
	"783a8c09c9d36cc7b36d9ea6435eb3180916f6c163a7ebde1773c78ebb10fc47"
#define GOLDEN_EX2_CUDA                                                        \
	"5011627862351399559029892bfa720d98277866ee0f3f385d2a60eeb2d827b9"
#define GOLDEN_EX2_STRUCT                                                      \
	"58dd351f95029588c737d60ac23069a81a1d468bd75ae2235c1822402d669e8f"

Test(signature, golden_values)
{
	char h[KILN_SIG_HEX];
	uint8_t s[KILN_SIG_BYTES];

	kiln_target_t cpu = test_target("cpu", "x86-64", "+avx2,+fma");
	kiln_compile_opts_t def = mode("default");
	sig_of(GRAPH_EX1, &cpu, &def, FP, false, s);
	cr_assert_str_eq(hex(s, h), GOLDEN_EX1_CPU, "EX1/cpu is %s", h);

	kiln_target_t cuda = test_target("cuda", "sm_90", "");
	kiln_compile_opts_t mat = mode("max-autotune");
	sig_of(GRAPH_EX2, &cuda, &mat, FP, false, s);
	cr_assert_str_eq(hex(s, h), GOLDEN_EX2_CUDA, "EX2/cuda is %s", h);

	sig_of(GRAPH_EX2, &cpu, NULL, FP, true, s);
	cr_assert_str_eq(hex(s, h), GOLDEN_EX2_STRUCT, "EX2/struct is %s", h);
}

/* Independent re-encoding of PROTOCOL.md § Signature for one small graph,
 * hashed here with OpenSSL: the implementation must produce these bytes. */
#define SPEC_GRAPH                                                             \
	"{'format': 'kiln.graph/1',"                                           \
	" 'symbols': {'s0': {'min': 2, 'max': nil}, 'zz': {'min': 1, "         \
	"   'max': 9}, 'aa': {'min': 1, 'max': 3}},"                           \
	" 'inputs': [{'dtype': 'f32', 'shape': ['s0', 3]}],"                   \
	" 'nodes': [{'op': 'aten.relu.default', 'args': [{'ref': 0}, -2, "     \
	"   0.5, nil, true, 'a', [1]], 'kwargs': {'k': 1, 'b': 300},"          \
	"   'out': [{'dtype': 'f32', 'shape': ['s0', 3]}]}],"                  \
	" 'outputs': [{'ref': 1}, {'sym': 's0 + 1'}]}"

static void pk_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pk_y(msgpack_packer *pk, bool structure)
{
	if (structure) {
		msgpack_pack_nil(pk);
		return;
	}
	msgpack_pack_map(pk, 1);
	pk_str(pk, "y");
	msgpack_pack_int64(pk, 0);
}

static void pk_dim(msgpack_packer *pk, int64_t c, bool structure)
{
	if (structure)
		msgpack_pack_nil(pk);
	else
		msgpack_pack_int64(pk, c);
}

static void pk_int_arg(msgpack_packer *pk, int64_t v, bool structure)
{
	if (structure) {
		msgpack_pack_map(pk, 1);
		pk_str(pk, "i");
		msgpack_pack_nil(pk);
	} else {
		msgpack_pack_int64(pk, v);
	}
}

/* value = ["f32", [{"y":0}, 3], [3, 1]] */
static void pk_value(msgpack_packer *pk, bool structure)
{
	msgpack_pack_array(pk, 3);
	pk_str(pk, "f32");
	msgpack_pack_array(pk, 2);
	pk_y(pk, structure);
	pk_dim(pk, 3, structure);
	msgpack_pack_array(pk, 2);
	pk_dim(pk, 3, structure);
	pk_dim(pk, 1, structure);
}

static void spec_encoding(msgpack_sbuffer *sb, bool structure)
{
	msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 6);
	pk_str(&pk, structure ? "kiln.struct/1" : "kiln.sig/1");
	msgpack_pack_array(&pk, 4); /* graph */
	msgpack_pack_array(&pk, 1); /* inputs */
	pk_value(&pk, structure);
	msgpack_pack_array(&pk, 1); /* nodes */
	msgpack_pack_array(&pk, 4);
	pk_str(&pk, "aten.relu.default");
	msgpack_pack_array(&pk, 7);
	msgpack_pack_map(&pk, 1);
	pk_str(&pk, "r");
	msgpack_pack_int64(&pk, 0);
	pk_int_arg(&pk, -2, structure);
	msgpack_pack_double(&pk, 0.5);
	msgpack_pack_nil(&pk);
	msgpack_pack_true(&pk);
	pk_str(&pk, "a");
	msgpack_pack_array(&pk, 1);
	pk_int_arg(&pk, 1, structure);
	msgpack_pack_array(&pk, 2); /* kwargs, sorted */
	msgpack_pack_array(&pk, 2);
	pk_str(&pk, "b");
	pk_int_arg(&pk, 300, structure);
	msgpack_pack_array(&pk, 2);
	pk_str(&pk, "k");
	pk_int_arg(&pk, 1, structure);
	msgpack_pack_array(&pk, 1); /* out */
	pk_value(&pk, structure);
	msgpack_pack_array(&pk, 2); /* outputs */
	msgpack_pack_map(&pk, 1);
	pk_str(&pk, "r");
	msgpack_pack_int64(&pk, 1);
	msgpack_pack_map(&pk, 1);
	pk_str(&pk, "s");
	if (structure) {
		msgpack_pack_nil(&pk);
	} else {
		msgpack_pack_array(&pk, 3); /* [2 add, 1, {"y": 0}] */
		msgpack_pack_int64(&pk, 2);
		msgpack_pack_int64(&pk, 1);
		pk_y(&pk, false);
	}
	if (structure) {
		msgpack_pack_array(&pk, 0);
	} else {
		/* used s0 first, then unused ones sorted by (min, max) */
		msgpack_pack_array(&pk, 3);
		msgpack_pack_array(&pk, 2);
		msgpack_pack_int64(&pk, 2);
		msgpack_pack_nil(&pk);
		msgpack_pack_array(&pk, 2);
		msgpack_pack_int64(&pk, 1);
		msgpack_pack_int64(&pk, 3);
		msgpack_pack_array(&pk, 2);
		msgpack_pack_int64(&pk, 1);
		msgpack_pack_int64(&pk, 9);
	}
	msgpack_pack_array(&pk, 3); /* target */
	pk_str(&pk, "cpu");
	pk_str(&pk, "x86-64");
	pk_str(&pk, "");
	msgpack_pack_array(&pk, 1); /* options */
	pk_str(&pk, "default");
	pk_str(&pk, FP);
	msgpack_pack_int64(&pk, 1);
}

Test(signature, matches_the_specified_encoding)
{
	for (int structure = 0; structure < 2; structure++) {
		msgpack_sbuffer sb;
		spec_encoding(&sb, structure);
		uint8_t want[KILN_SIG_BYTES], got[KILN_SIG_BYTES];
		unsigned int n = 0;
		cr_assert(
		    EVP_Digest(sb.data, sb.size, want, &n, EVP_sha256(), NULL));
		cr_assert_eq(n, KILN_SIG_BYTES);
		kiln_target_t t = test_target("cpu", "x86-64", "");
		sig_of(SPEC_GRAPH, &t, NULL, FP, structure, got);
		char a[KILN_SIG_HEX], b[KILN_SIG_HEX];
		cr_assert_arr_eq(got, want, KILN_SIG_BYTES,
				 "structure=%d: %s, spec says %s", structure,
				 hex(got, a), hex(want, b));
		msgpack_sbuffer_destroy(&sb);
	}
}

/* ------------------------------------------------------------------------ */
/* Invariance                                                                 */
/* ------------------------------------------------------------------------ */

#define BASE                                                                   \
	"{'format': 'kiln.graph/1',"                                           \
	" 'symbols': {'s0': {'min': 2, 'max': 4096, 'hint': 16}, "             \
	"'u': {'min': 1}},"                                                    \
	" 'inputs': [{'dtype': 'f32', 'shape': [4, 's0', 64], 'name': 'x'},"   \
	"   {'dtype': 'f16', 'shape': [64], 'strides': [1]}, {'sym': 's0'}],"  \
	" 'nodes': ["                                                          \
	"   {'op': 'aten.add.Tensor', 'args': [{'ref': 0}, {'ref': 1}],"       \
	"    'kwargs': {'alpha': 5, 'beta': 'x'},"                             \
	"    'out': [{'dtype': 'f32', 'shape': [4, 's0', 64]}]},"              \
	"   {'op': 'aten.mul.Scalar', 'args': [{'ref': 3}, 0.5],"              \
	"    'out': [{'dtype': 'f32', 'shape': [4, 's0', 64]}]},"              \
	"   {'op': 'aten.view.default', 'args': [{'ref': 4}, "                 \
	"[{'sym': '4*s0'}, 64]],"                                              \
	"    'out': [{'dtype': 'f32', 'shape': ['4*s0', 64]}]}],"              \
	" 'outputs': [{'ref': 5}, {'sym': 's0'}]}"

/* BASE with every map's keys in another order. */
#define BASE_REORDERED                                                         \
	"{'outputs': [{'ref': 5}, {'sym': 's0'}],"                             \
	" 'nodes': ["                                                          \
	"   {'out': [{'shape': [4, 's0', 64], 'dtype': 'f32'}],"               \
	"    'kwargs': {'beta': 'x', 'alpha': 5},"                             \
	"    'args': [{'ref': 0}, {'ref': 1}], 'op': 'aten.add.Tensor'},"      \
	"   {'args': [{'ref': 3}, 0.5], 'op': 'aten.mul.Scalar',"              \
	"    'out': [{'shape': [4, 's0', 64], 'dtype': 'f32'}]},"              \
	"   {'out': [{'shape': ['4*s0', 64], 'dtype': 'f32'}],"                \
	"    'op': 'aten.view.default', 'args': [{'ref': 4}, "                 \
	"[{'sym': '4*s0'}, 64]]}],"                                            \
	" 'inputs': [{'name': 'x', 'shape': [4, 's0', 64], 'dtype': 'f32'},"   \
	"   {'strides': [1], 'shape': [64], 'dtype': 'f16'}, {'sym': 's0'}],"  \
	" 'symbols': {'u': {'min': 1}, "                                       \
	"'s0': {'hint': 16, 'max': 4096, 'min': 2}},"                          \
	" 'format': 'kiln.graph/1'}"

typedef struct ctx {
	kiln_target_t t;
	kiln_compile_opts_t o;
	uint8_t base[KILN_SIG_BYTES], base_struct[KILN_SIG_BYTES];
} ctx_t;

static void ctx_init(ctx_t *c)
{
	c->t = test_target("cpu", "x86-64", "+avx2");
	c->o = mode("default");
	sig_of(BASE, &c->t, &c->o, FP, false, c->base);
	sig_of(BASE, &c->t, &c->o, FP, true, c->base_struct);
}

static void expect_same(const ctx_t *c, const char *text, const char *what)
{
	uint8_t s[KILN_SIG_BYTES];
	sig_of(text, &c->t, &c->o, FP, false, s);
	cr_assert_arr_eq(s, c->base, KILN_SIG_BYTES, "%s changed the signature",
			 what);
	sig_of(text, &c->t, &c->o, FP, true, s);
	cr_assert_arr_eq(s, c->base_struct, KILN_SIG_BYTES,
			 "%s changed the structure hash", what);
}

/* expect_same on a substitution of BASE; frees it. */
static void same_subst(const ctx_t *c, const char *from, const char *to)
{
	char *text = subst(BASE, from, to);
	char what[256];
	snprintf(what, sizeof(what), "%s -> %s", from, to);
	expect_same(c, text, what);
	free(text);
}

Test(signature, deterministic)
{
	ctx_t c;
	ctx_init(&c);
	expect_same(&c, BASE, "nothing");
	cr_assert_arr_neq(c.base, c.base_struct, KILN_SIG_BYTES);
}

Test(signature, invariant_under_key_order)
{
	ctx_t c;
	ctx_init(&c);
	expect_same(&c, BASE_REORDERED, "map key order");
	/* Declaration order of the symbols alone. */
	same_subst(&c,
		   "{'s0': {'min': 2, 'max': 4096, 'hint': 16}, 'u': {'min': "
		   "1}}",
		   "{'u': {'min': 1}, 's0': {'min': 2, 'max': 4096, 'hint': "
		   "16}}");
}

Test(signature, invariant_under_int_width)
{
	ctx_t c;
	ctx_init(&c);
	/* 0xd3 + 8 bytes for int64 5, and other widths msgpack-c never
	 * writes for small values. */
	same_subst(&c, "'alpha': 5", "'alpha': i64(5)");
	same_subst(&c, "'alpha': 5", "'alpha': u64(5)");
	same_subst(&c, "'alpha': 5", "'alpha': i32(5)");
	same_subst(&c, "{'ref': 1}", "{'ref': u8(1)}");
	same_subst(&c, "[4, 's0', 64], 'name'",
		   "[i64(4), 's0', u64(64)], 'name'");
	same_subst(&c, "'min': 2", "'min': i64(2)");
	same_subst(&c, "'shape': [64], 'strides': [1]",
		   "'shape': [i32(64)], 'strides': [i64(1)]");
	char *text = subst_n(BASE, "[{'sym': '4*s0'}, 64]",
			     "[{'sym': '4*s0'}, u64(64)]", false);
	expect_same(&c, text, "a list int as uint64");
	free(text);
}

Test(signature, invariant_under_float_width)
{
	ctx_t c;
	ctx_init(&c);
	same_subst(&c, "0.5", "f32(0.5)");
	same_subst(&c, "0.5", "f64(0.5)");
}

Test(signature, invariant_under_extra_keys)
{
	ctx_t c;
	ctx_init(&c);
	same_subst(&c, ", 'name': 'x'", "");
	same_subst(&c, "'name': 'x'", "'name': 'renamed'");
	same_subst(&c, "'op': 'aten.mul.Scalar',",
		   "'op': 'aten.mul.Scalar', 'name': 'mul_1', 'meta': [1],");
	same_subst(&c, "'format': 'kiln.graph/1',",
		   "'format': 'kiln.graph/1', 'producer': 'test/1',");
	same_subst(&c, "{'dtype': 'f16',", "{'dtype': 'f16', 'name': 'w',");
	same_subst(&c, "'hint': 16", "'hint': 16, 'source': 'L[0]'");
}

Test(signature, invariant_under_explicit_contiguous_strides)
{
	ctx_t c;
	ctx_init(&c);
	same_subst(&c, "[4, 's0', 64], 'name'",
		   "[4, 's0', 64], 'strides': ['64*s0', 64, 1], 'name'");
	same_subst(&c, "[4, 's0', 64], 'name'",
		   "[4, 's0', 64], 'strides': ['s0*64', '64', 1], 'name'");
	same_subst(&c, ", 'strides': [1]", "");
	same_subst(&c, "'strides': [1]", "'strides': nil");
	same_subst(&c, "'shape': ['4*s0', 64]",
		   "'shape': ['4*s0', 64], 'strides': [64, 1]");
}

Test(signature, invariant_under_symbol_renaming)
{
	ctx_t c;
	ctx_init(&c);
	char *text = subst_n(BASE, "s0", "s7", true);
	expect_same(&c, text, "renaming s0 to s7");
	free(text);
	text = subst_n(BASE, "s0", "batch_size", true);
	expect_same(&c, text, "renaming s0 to batch_size");
	free(text);
	/* An unused symbol's name does not matter either. */
	same_subst(&c, "'u': {'min': 1}", "'zz': {'min': 1}");
}

Test(signature, invariant_under_equal_expressions)
{
	ctx_t c;
	ctx_init(&c);
	same_subst(&c, "[{'sym': '4*s0'}, 64]", "[{'sym': 's0*4'}, 64]");
	same_subst(&c, "[{'sym': '4*s0'}, 64]", "[{'sym': ' 4 * s0 '}, 64]");
	same_subst(&c, "[{'sym': '4*s0'}, 64]", "[{'sym': '(2+2)*s0'}, 64]");
	same_subst(&c, "[4, 's0', 64], 'name'", "['2*2', 's0', '64'], 'name'");
	same_subst(&c, "{'sym': 's0'}], 'nodes'", "{'sym': '(s0)'}], 'nodes'");
	/* The hint is not a bound: PROTOCOL.md lists [min, max] only. */
	same_subst(&c, "'hint': 16", "'hint': 17");
	same_subst(&c, ", 'hint': 16", "");
}

Test(signature, null_target_and_options_mean_unset)
{
	kiln_graph_t *g = graph_ok(GRAPH_EX1, NULL);
	uint8_t a[KILN_SIG_BYTES], b[KILN_SIG_BYTES];
	kiln_target_t empty = test_target("", "", "");
	cr_assert_eq(kiln_signature(g, NULL, NULL, NULL, false, a), 0);
	kiln_compile_opts_t def = mode("default");
	cr_assert_eq(kiln_signature(g, &empty, &def, "", false, b), 0);
	cr_assert_arr_eq(a, b, KILN_SIG_BYTES);
	kiln_compile_opts_t unset = mode("");
	cr_assert_eq(kiln_signature(g, &empty, &unset, "", false, b), 0);
	cr_assert_arr_eq(a, b, KILN_SIG_BYTES);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Sensitivity                                                                */
/* ------------------------------------------------------------------------ */

static void differ_subst(const ctx_t *c, const char *from, const char *to)
{
	char *text = subst(BASE, from, to);
	uint8_t s[KILN_SIG_BYTES];
	sig_of(text, &c->t, &c->o, FP, false, s);
	cr_assert_arr_neq(s, c->base, KILN_SIG_BYTES,
			  "%s -> %s did not change the signature", from, to);
	free(text);
}

Test(signature, sensitive_to_the_graph)
{
	ctx_t c;
	ctx_init(&c);
	differ_subst(&c, "'aten.mul.Scalar'", "'aten.div.Scalar'");
	differ_subst(&c, "0.5", "0.25");
	differ_subst(&c, "0.5", "0.5000000000000001");
	differ_subst(&c, "0.5", "'0.5'");
	differ_subst(&c, "'alpha': 5", "'alpha': 6");
	differ_subst(&c, "'alpha': 5", "'alpha': 5.0");
	differ_subst(&c, "'alpha': 5", "'alpha': true");
	differ_subst(&c, "'beta': 'x'", "'gamma': 'x'");
	differ_subst(&c, "'beta': 'x'", "'beta': 'y'");
	differ_subst(&c, "'dtype': 'f16'", "'dtype': 'bf16'");
	differ_subst(&c, "'shape': [64], 'strides': [1]",
		     "'shape': [32], 'strides': [1]");
	differ_subst(&c, "'strides': [1]", "'strides': [2]");
	differ_subst(&c, "[4, 's0', 64], 'name'",
		     "[4, 's0', 64], 'strides': [1, 4, '4*s0'], 'name'");
	differ_subst(&c, "'shape': ['4*s0', 64]", "'shape': ['4*s0', 's0']");
	differ_subst(&c, "[{'sym': '4*s0'}, 64]", "[{'sym': '2*s0'}, 64]");
	differ_subst(&c, "[{'sym': '4*s0'}, 64]", "[{'sym': 's0 + s0'}, 64]");
	differ_subst(&c, "[{'sym': '4*s0'}, 64]", "[256, 64]");
	differ_subst(&c, "{'ref': 4}", "{'ref': 3}");
	differ_subst(&c, "[{'ref': 0}, {'ref': 1}]",
		     "[{'ref': 1}, {'ref': 0}]");
	differ_subst(&c, "'outputs': [{'ref': 5}, {'sym': 's0'}]",
		     "'outputs': [{'sym': 's0'}, {'ref': 5}]");
	differ_subst(&c, "'outputs': [{'ref': 5}, {'sym': 's0'}]",
		     "'outputs': [{'ref': 5}]");
	differ_subst(&c, "'min': 2", "'min': 3");
	differ_subst(&c, "'max': 4096", "'max': nil");
	differ_subst(&c, "'u': {'min': 1}", "'u': {'min': 2}");
	differ_subst(&c, ", 'u': {'min': 1}", "");
	differ_subst(&c, "{'sym': 's0'}], 'nodes'",
		     "{'sym': 's0 + 1'}], 'nodes'");
}

Test(signature, sensitive_to_target_mode_fingerprint)
{
	kiln_graph_t *g = graph_ok(BASE, NULL);
	kiln_target_t t = test_target("cpu", "x86-64", "+avx2");
	kiln_compile_opts_t def = mode("default");
	uint8_t base[KILN_SIG_BYTES], s[KILN_SIG_BYTES];
	cr_assert_eq(kiln_signature(g, &t, &def, FP, false, base), 0);

	kiln_target_t v[] = {
	    test_target("cuda", "x86-64", "+avx2"),
	    test_target("cpu", "znver3", "+avx2"),
	    test_target("cpu", "x86-64", "+avx2,+fma"),
	    test_target("cpu", "x86-64", ""),
	    test_target("cpu", "", "+avx2"),
	    /* The fields are separate: moving text between them differs. */
	    test_target("cpux86-64", "", "+avx2"),
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		cr_assert_eq(kiln_signature(g, &v[i], &def, FP, false, s), 0);
		cr_assert_arr_neq(s, base, KILN_SIG_BYTES, "target %s/%s/%s",
				  v[i].backend, v[i].arch, v[i].features);
	}
	static const char *const modes[] = {"reduce-overhead", "max-autotune"};
	for (size_t i = 0; i < 2; i++) {
		kiln_compile_opts_t o = mode(modes[i]);
		cr_assert_eq(kiln_signature(g, &t, &o, FP, false, s), 0);
		cr_assert_arr_neq(s, base, KILN_SIG_BYTES, "mode %s", modes[i]);
	}
	cr_assert_eq(kiln_signature(g, &t, &def, FP "x", false, s), 0);
	cr_assert_arr_neq(s, base, KILN_SIG_BYTES);
	cr_assert_eq(kiln_signature(g, &t, &def, "", false, s), 0);
	cr_assert_arr_neq(s, base, KILN_SIG_BYTES);
	cr_assert_eq(kiln_signature(g, &t, &def, FP, true, s), 0);
	cr_assert_arr_neq(s, base, KILN_SIG_BYTES);
	kiln_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Structure hash                                                             */
/* ------------------------------------------------------------------------ */

#define STRUCT_G(in, view, out, op, dt, scale)                                 \
	"{'format': 'kiln.graph/1', 'symbols': {'s0': {'min': 2}},"            \
	" 'inputs': [{'dtype': '" dt "', 'shape': " in "}],"                   \
	" 'nodes': [{'op': 'aten.view.default', 'args': [{'ref': 0}, " view    \
	"], 'out': [{'dtype': '" dt "', 'shape': " out "}]},"                  \
	"  {'op': '" op "', 'args': [{'ref': 1}, " scale "], 'kwargs': "       \
	"{'dim': 1}, 'out': [{'dtype': '" dt "', 'shape': " out "}]}],"        \
	" 'outputs': [{'ref': 2}]}"

static void struct_sigs(const char *text, uint8_t sig[KILN_SIG_BYTES],
			uint8_t st[KILN_SIG_BYTES])
{
	kiln_target_t t = test_target("cpu", "x86-64", "");
	sig_of(text, &t, NULL, FP, false, sig);
	sig_of(text, &t, NULL, FP, true, st);
}

Test(signature, structure_hash_erases_sizes)
{
	uint8_t s1[KILN_SIG_BYTES], t1[KILN_SIG_BYTES];
	uint8_t s2[KILN_SIG_BYTES], t2[KILN_SIG_BYTES];
	struct_sigs(STRUCT_G("[8, 64]", "[16, 32]", "[16, 32]",
			     "aten.mul.Scalar", "f32", "0.5"),
		    s1, t1);

	/* Other sizes, other view sizes, other int kwarg: same structure. */
	struct_sigs(STRUCT_G("[4, 128]", "[2, 256]", "[2, 256]",
			     "aten.mul.Scalar", "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(s1, s2, KILN_SIG_BYTES);
	cr_assert_arr_eq(t1, t2, KILN_SIG_BYTES);
	char *text = subst(STRUCT_G("[8, 64]", "[16, 32]", "[16, 32]",
				    "aten.mul.Scalar", "f32", "0.5"),
			   "'dim': 1", "'dim': 0");
	struct_sigs(text, s2, t2);
	free(text);
	cr_assert_arr_neq(s1, s2, KILN_SIG_BYTES);
	cr_assert_arr_eq(t1, t2, KILN_SIG_BYTES);

	/* Symbolic sizes and a symbolic view size: same structure too. */
	struct_sigs(STRUCT_G("['s0', 64]", "[{'sym': '2*s0'}, 32]",
			     "['2*s0', 32]", "aten.mul.Scalar", "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(s1, s2, KILN_SIG_BYTES);
	struct_sigs(STRUCT_G("['s0', 64]", "[16, 32]", "[16, 32]",
			     "aten.mul.Scalar", "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_eq(t1, t2, KILN_SIG_BYTES);

	/* Explicit strides are erased as well. */
	struct_sigs(STRUCT_G("[8, 64], 'strides': [1, 8]", "[16, 32]",
			     "[16, 32]", "aten.mul.Scalar", "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(s1, s2, KILN_SIG_BYTES);
	cr_assert_arr_eq(t1, t2, KILN_SIG_BYTES);

	/* An op, a dtype, a float arg or the rank change the structure. */
	struct_sigs(STRUCT_G("[8, 64]", "[16, 32]", "[16, 32]",
			     "aten.div.Scalar", "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(t1, t2, KILN_SIG_BYTES);
	struct_sigs(STRUCT_G("[8, 64]", "[16, 32]", "[16, 32]",
			     "aten.mul.Scalar", "f16", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(t1, t2, KILN_SIG_BYTES);
	struct_sigs(STRUCT_G("[8, 64]", "[16, 32]", "[16, 32]",
			     "aten.mul.Scalar", "f32", "2.0"),
		    s2, t2);
	cr_assert_arr_neq(t1, t2, KILN_SIG_BYTES);
	struct_sigs(STRUCT_G("[8, 64]", "[512]", "[512]", "aten.mul.Scalar",
			     "f32", "0.5"),
		    s2, t2);
	cr_assert_arr_neq(t1, t2, KILN_SIG_BYTES);
}

/* ------------------------------------------------------------------------ */
/* Hex                                                                        */
/* ------------------------------------------------------------------------ */

Test(signature, hex_round_trip)
{
	uint8_t sig[KILN_SIG_BYTES], back[KILN_SIG_BYTES];
	for (int i = 0; i < KILN_SIG_BYTES; i++)
		sig[i] = (uint8_t)(i * 37 + 0x0f);
	char h[KILN_SIG_HEX];
	memset(h, 'X', sizeof(h));
	kiln_sig_to_hex(sig, h);
	cr_assert_eq(strlen(h), 64);
	for (int i = 0; i < 64; i++)
		cr_assert((h[i] >= '0' && h[i] <= '9') ||
			      (h[i] >= 'a' && h[i] <= 'f'),
			  "not lower-case hex: %s", h);
	cr_assert_eq(strncmp(h, "0f34", 4), 0, "%s", h);
	cr_assert_eq(kiln_sig_from_hex(h, 64, back), 0);
	cr_assert_arr_eq(sig, back, KILN_SIG_BYTES);

	memset(sig, 0xff, sizeof(sig));
	kiln_sig_to_hex(sig, h);
	cr_assert_str_eq(h, "ffffffffffffffffffffffffffffffff"
			    "ffffffffffffffffffffffffffffffff");
	memset(sig, 0, sizeof(sig));
	kiln_sig_to_hex(sig, h);
	cr_assert_eq(kiln_sig_from_hex(h, 64, back), 0);
	cr_assert_arr_eq(sig, back, KILN_SIG_BYTES);
}

Test(signature, hex_rejects_bad_input)
{
	char good[KILN_SIG_HEX];
	uint8_t sig[KILN_SIG_BYTES];
	memset(sig, 0xab, sizeof(sig));
	kiln_sig_to_hex(sig, good);
	uint8_t out[KILN_SIG_BYTES];
	cr_assert_eq(kiln_sig_from_hex(good, 63, out), KILN_EBADREQ);
	cr_assert_eq(kiln_sig_from_hex(good, 0, out), KILN_EBADREQ);
	cr_assert_eq(kiln_sig_from_hex(good, 62, out), KILN_EBADREQ);
	char longer[80];
	snprintf(longer, sizeof(longer), "%s0", good);
	cr_assert_eq(kiln_sig_from_hex(longer, 65, out), KILN_EBADREQ);
	static const char bad_chars[] = {'g', 'G', ' ', 'x', '-', '\0',
					 ':', '/', '@', '`', 'z'};
	for (size_t k = 0; k < sizeof(bad_chars); k++) {
		for (int pos = 0; pos < 64; pos += 21) {
			char h[KILN_SIG_HEX];
			memcpy(h, good, sizeof(h));
			h[pos] = bad_chars[k];
			cr_assert_eq(kiln_sig_from_hex(h, 64, out),
				     KILN_EBADREQ, "char 0x%02x at %d",
				     bad_chars[k], pos);
		}
	}
}

/* ------------------------------------------------------------------------ */
/* Target and options                                                         */
/* ------------------------------------------------------------------------ */

static int target_of(const char *text, kiln_target_t *t, char *err,
		     size_t errlen)
{
	mp_obj_t o;
	const msgpack_object *m = mp_obj(&o, text);
	err[0] = '\0';
	int rc = kiln_target_from_object(m, t, err, errlen);
	mp_obj_free(&o);
	return rc;
}

static void target_ok(const char *text, const char *backend, const char *arch,
		      const char *features)
{
	kiln_target_t t;
	char err[256];
	int rc = target_of(text, &t, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s rejected: %s", text, err);
	cr_assert_str_eq(t.backend, backend);
	cr_assert_str_eq(t.arch, arch);
	cr_assert_str_eq(t.features, features);
}

static void target_bad(const char *text, const char *needle)
{
	kiln_target_t t;
	char err[256];
	int rc = target_of(text, &t, err, sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%s: rc %d", text, rc);
	cr_assert_not_null(strstr(err, needle),
			   "%s: message \"%s\" lacks \"%s\"", text, err,
			   needle);
}

Test(target, accepts_good_values)
{
	target_ok("{'backend': 'cpu'}", "cpu", "", "");
	target_ok("{'backend': 'cpu', 'arch': 'x86-64', 'features': "
		  "'+avx2,+fma'}",
		  "cpu", "x86-64", "+avx2,+fma");
	target_ok("{'backend': 'cpu', 'arch': nil, 'features': nil, "
		  "'extra': 1}",
		  "cpu", "", "");
	target_ok("{'backend': 'cuda', 'arch': 'sm_90'}", "cuda", "sm_90", "");
	target_ok("{'backend': 'cuda', 'arch': 'sm_90a'}", "cuda", "sm_90a",
		  "");
	target_ok("{'backend': 'cuda', 'arch': 'sm_100'}", "cuda", "sm_100",
		  "");
	target_ok("{'backend': 'cuda', 'arch': 'sm_8'}", "cuda", "sm_8", "");
	target_ok("{'arch': 'sm_75', 'backend': 'cuda', 'features': '+ptx80'}",
		  "cuda", "sm_75", "+ptx80");
	/* 15 bytes fit backend[16]; a long feature string fits too. */
	char text[3000], feat[2048];
	memset(feat, 'f', 2047);
	feat[2047] = '\0';
	snprintf(text, sizeof(text), "{'backend': 'cpu', 'features': '%s'}",
		 feat);
	target_ok(text, "cpu", "", feat);
}

Test(target, rejects_bad_values)
{
	target_bad("[1]", "\"target\" must be a map");
	target_bad("'cpu'", "\"target\" must be a map");
	target_bad("{}", "target needs \"backend\"");
	target_bad("{'arch': 'x86-64'}", "needs \"backend\"");
	target_bad("{'backend': 1}", "target \"backend\" must be a string");
	target_bad("{'backend': nil}", "\"backend\" must be a string");
	target_bad("{'backend': 'tpu'}", "unknown backend \"tpu\"");
	target_bad("{'backend': 'CPU'}", "unknown backend");
	target_bad("{'backend': ''}", "unknown backend");
	target_bad("{'backend': 'cpu', 'arch': 5}",
		   "target \"arch\" must be a string");
	target_bad("{'backend': 'cpu', 'features': ['+avx2']}",
		   "target \"features\" must be a string");
	target_bad("{'backend': 'cuda'}", "cuda target needs \"arch\"");
	target_bad("{'backend': 'cuda', 'arch': nil}", "needs \"arch\"");
	static const char *const bad_arch[] = {
	    "x86-64", "sm_",  "sm_0",	"sm_9x",  "sm_90ab", "compute_90",
	    "SM_90",  "sm_a", "sm_90b", " sm_90", "sm_9a0",  "sm_90\\0"};
	for (size_t i = 0; i < sizeof(bad_arch) / sizeof(bad_arch[0]); i++) {
		char text[128];
		snprintf(text, sizeof(text),
			 "{'backend': 'cuda', 'arch': '%s'}", bad_arch[i]);
		kiln_target_t t;
		char err[256];
		cr_assert_eq(target_of(text, &t, err, sizeof(err)),
			     KILN_EBADREQ, "%s accepted", text);
		cr_assert(err[0] != '\0');
	}
	/* Too long for the fixed fields. */
	target_bad("{'backend': 'cpuuuuuuuuuuuuuu'}",
		   "target \"backend\" longer than 15 bytes");
	target_bad("{'backend': 'cpu', 'arch': "
		   "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'}",
		   "\"arch\" longer than 31 bytes");
	char text[3000], feat[2049];
	memset(feat, 'f', 2048);
	feat[2048] = '\0';
	snprintf(text, sizeof(text), "{'backend': 'cpu', 'features': '%s'}",
		 feat);
	target_bad(text, "\"features\" longer than 2047 bytes");
	/* An embedded NUL. */
	target_bad("{'backend': 'cpu\\0x'}", "contains NUL");
	target_bad("{'backend': 'cpu', 'arch': 'x86\\0-64'}", "contains NUL");
	/* NULL object. */
	kiln_target_t t;
	char err[128] = "";
	cr_assert_eq(kiln_target_from_object(NULL, &t, err, sizeof(err)),
		     KILN_EBADREQ);
	ASSERT_MSG_HAS(err, "must be a map");
}

static int opts_of(const char *text, kiln_compile_opts_t *o, int *dyn,
		   char *err, size_t errlen)
{
	mp_obj_t obj;
	const msgpack_object *m = mp_obj(&obj, text);
	err[0] = '\0';
	*dyn = 42;
	int rc = kiln_opts_from_object(m, o, dyn, err, errlen);
	mp_obj_free(&obj);
	return rc;
}

static void opts_ok(const char *text, const char *want_mode, int want_dyn)
{
	kiln_compile_opts_t o;
	int dyn;
	char err[256];
	int rc = opts_of(text, &o, &dyn, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s rejected: %s", text, err);
	cr_assert_str_eq(o.mode, want_mode, "%s", text);
	cr_assert_eq(dyn, want_dyn, "%s: dynamic %d", text, dyn);
}

static void opts_bad(const char *text, const char *needle)
{
	kiln_compile_opts_t o;
	int dyn;
	char err[256];
	int rc = opts_of(text, &o, &dyn, err, sizeof(err));
	cr_assert_eq(rc, KILN_EBADREQ, "%s: rc %d", text, rc);
	cr_assert_not_null(strstr(err, needle),
			   "%s: message \"%s\" lacks \"%s\"", text, err,
			   needle);
}

Test(options, accepts_good_values)
{
	kiln_compile_opts_t o;
	int dyn = 42;
	char err[128];
	cr_assert_eq(kiln_opts_from_object(NULL, &o, &dyn, err, sizeof(err)),
		     0);
	cr_assert_str_eq(o.mode, "default");
	cr_assert_eq(dyn, -1);
	opts_ok("nil", "default", -1);
	opts_ok("{}", "default", -1);
	opts_ok("{'mode': 'default'}", "default", -1);
	opts_ok("{'mode': 'reduce-overhead'}", "reduce-overhead", -1);
	opts_ok("{'mode': 'max-autotune', 'dynamic': true}", "max-autotune", 1);
	opts_ok("{'dynamic': false}", "default", 0);
	opts_ok("{'dynamic': nil, 'mode': nil}", "default", -1);
	opts_ok("{'priority': 'batch', 'future': [1, 2]}", "default", -1);
}

Test(options, rejects_bad_values)
{
	opts_bad("[1]", "\"options\" must be a map");
	opts_bad("'default'", "\"options\" must be a map");
	opts_bad("{'mode': 'fast'}", "\"mode\" must be");
	opts_bad("{'mode': 'Default'}", "\"mode\" must be");
	opts_bad("{'mode': 'max-autotune-no-cudagraphs'}", "\"mode\" must be");
	opts_bad("{'mode': ''}", "\"mode\" must be");
	opts_bad("{'mode': 1}", "\"mode\" must be");
	opts_bad("{'dynamic': 1}", "\"dynamic\" must be null, true or false");
	opts_bad("{'dynamic': 'true'}", "\"dynamic\" must be");
	opts_bad("{'dynamic': 0}", "\"dynamic\" must be");
}
