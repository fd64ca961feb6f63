/*
 * test_artifact.c — the artifact codec (protocol/artifact.c): pack and
 * decode round trips, and the decoder's rejections of untrusted bytes
 * (every index check, types, limits, truncation and byte flips).
 */
#include "helpers.h"

/* Every kind of field: two symbols (one from a dim, one from an int
 * input), strided and contiguous inputs, kernels with symbolic extents,
 * input/output/arena buffers, views, kernel and fallback steps, ref and sym
 * outputs. The code is a few fake bytes (the codec never looks inside). */
static ab_t full_artifact(void)
{
	ab_t b = ab_new(NULL);
	static const uint8_t code[] = "\x7f"
				      "ELF fake code";
	b.a->code = code;
	b.a->code_len = sizeof(code) - 1;
	snprintf(b.a->target.features, sizeof(b.a->target.features),
		 "+avx2,+fma");
	memset(b.a->signature, 'a', 64);
	b.a->kernels_text = "kernel 0: add\nkernel 1: scale\n";
	ab_sym(&b, "s0", 2, 4096, 1, 0);
	b.a->symbols[0].hint = 16;
	ab_sym(&b, "batch", 1, -1, 0, -1);
	ab_input_int(&b, "batch");			  /* input 0 */
	ab_input(&b, KILN_DT_F32, "s0, 64", NULL);	  /* input 1 */
	ab_input(&b, KILN_DT_BF16, "64, batch", "1, 64"); /* input 2 */
	uint32_t k0 = ab_kernel(&b, "k_add_f32", "64*s0", 4096, 3);
	uint32_t k1 = ab_kernel(&b, "k_scale2_f32", "(s0 - 1)//2 + 1", 1, 2);
	uint32_t b1 = ab_buf_input(&b, 1);	      /* buffer 0 */
	uint32_t b2 = ab_buf_input(&b, 2);	      /* buffer 1 */
	uint32_t t = ab_buf_arena(&b, "0", "256*s0"); /* buffer 2 */
	uint32_t o = ab_buf_output(&b, "256*s0");     /* buffer 3 */
	uint32_t v0 = ab_view(&b, t, KILN_DT_F32, "s0, 64", "64, 1", "0");
	uint32_t v1 = ab_view(&b, o, KILN_DT_F32, "s0, 64", "64, 1", "0");
	uint32_t v2 = ab_view(&b, b2, KILN_DT_BF16, "batch, 64", "64, 1", "3");
	ab_kstep(&b, k0, 3, b1, b1, t);
	ab_fstep(&b, 5, "aten.gelu.default", v0, v1);
	ab_kstep(&b, k1, 2, o, o);
	(void)b2;
	ab_out_ref(&b, v1);
	ab_out_ref(&b, v2);
	ab_out_sym(&b, "s0*batch");
	ab_arena(&b, "256*s0");
	return b;
}

static void pack_bytes(const kiln_artifact_t *a, msgpack_sbuffer *sb)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_artifact_pack(a, &pk), 0);
}

static void fmt_dim(const kiln_artifact_t *a, kiln_dim_t d, char *buf, size_t n)
{
	kiln_graph_t g;
	memset(&g, 0, sizeof(g));
	g.symbols = a->symbols;
	g.n_symbols = a->n_symbols;
	if (d.e == NULL)
		snprintf(buf, n, "%lld", (long long)d.c);
	else
		kiln_expr_format(&g, d.e, buf, n);
}

#define ASSERT_DIM(a, d, want)                                                 \
	do {                                                                   \
		char buf_[128];                                                \
		fmt_dim((a), (d), buf_, sizeof(buf_));                         \
		cr_assert_str_eq(buf_, (want));                                \
	} while (0)

Test(artifact, round_trip_keeps_every_field)
{
	ab_t b = full_artifact();
	msgpack_sbuffer sb1, sb2;
	pack_bytes(b.a, &sb1);
	char err[512] = "";
	kiln_artifact_t *a = NULL;
	int rc = kiln_artifact_decode((const uint8_t *)sb1.data, sb1.size, NULL,
				      &a, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);

	cr_assert_str_eq(a->target.backend, "cpu");
	cr_assert_str_eq(a->target.arch, "x86-64");
	cr_assert_str_eq(a->target.features, "+avx2,+fma");
	cr_assert_eq(strlen(a->signature), 64);
	cr_assert_eq(a->code_len, b.a->code_len);
	cr_assert_arr_eq(a->code, b.a->code, a->code_len);
	cr_assert(a->code < (const uint8_t *)sb1.data ||
		      a->code >= (const uint8_t *)sb1.data + sb1.size,
		  "code must be copied, not point into the input");
	cr_assert_null(a->cubin);
	cr_assert_str_eq(a->kernels_text, b.a->kernels_text);

	cr_assert_eq(a->n_symbols, 2);
	cr_assert_str_eq(a->symbols[0].name, "s0");
	cr_assert_eq(a->symbols[0].min, 2);
	cr_assert_eq(a->symbols[0].max, 4096);
	cr_assert_eq(a->symbols[0].hint, 16);
	cr_assert_str_eq(a->symbols[1].name, "batch");
	cr_assert_eq(a->symbols[1].max, -1);
	cr_assert_eq(a->bindings[0].input, 1);
	cr_assert_eq(a->bindings[0].dim, 0);
	cr_assert_eq(a->bindings[1].input, 0);
	cr_assert_eq(a->bindings[1].dim, -1);

	cr_assert_eq(a->n_inputs, 3);
	cr_assert_eq(a->inputs[0].kind, KILN_VAL_SYMINT);
	cr_assert_eq(a->inputs[1].kind, KILN_VAL_TENSOR);
	cr_assert_eq(a->inputs[1].strides_given, false);
	ASSERT_DIM(a, a->inputs[1].sizes[0], "s0");
	ASSERT_DIM(a, a->inputs[1].strides[0], "64");
	cr_assert_eq(a->inputs[2].dtype, KILN_DT_BF16);
	cr_assert_eq(a->inputs[2].strides_given, true);
	ASSERT_DIM(a, a->inputs[2].strides[1], "64");

	cr_assert_eq(a->n_kernels, 2);
	cr_assert_str_eq(a->kernels[0].name, "k_add_f32");
	ASSERT_DIM(a, a->kernels[0].extent, "64*s0");
	cr_assert_eq(a->kernels[0].grain, 4096);
	cr_assert_eq(a->kernels[0].n_bufs, 3);
	ASSERT_DIM(a, a->kernels[1].extent, "1 + (s0 - 1)//2");

	cr_assert_eq(a->n_buffers, 4);
	cr_assert_eq(a->buffers[0].kind, KILN_BUF_INPUT);
	cr_assert_eq(a->buffers[1].index, 2);
	cr_assert_eq(a->buffers[2].kind, KILN_BUF_ARENA);
	ASSERT_DIM(a, a->buffers[2].bytes, "256*s0");
	cr_assert_eq(a->buffers[3].kind, KILN_BUF_OUTPUT);
	cr_assert_eq(a->buffers[3].index, 0);
	cr_assert_eq(a->n_out_buffers, 1);

	cr_assert_eq(a->n_views, 3);
	cr_assert_eq(a->views[2].buffer, 1);
	cr_assert_eq(a->views[2].dtype, KILN_DT_BF16);
	ASSERT_DIM(a, a->views[2].sizes[0], "batch");
	ASSERT_DIM(a, a->views[2].offset, "3");

	cr_assert_eq(a->n_steps, 3);
	cr_assert_eq(a->steps[0].kind, KILN_STEP_KERNEL);
	cr_assert_eq(a->steps[0].node, 0);
	cr_assert_eq(a->steps[0].n_bufs, 3);
	cr_assert_eq(a->steps[0].bufs[2], 2);
	const kiln_art_step_t *f = &a->steps[1];
	cr_assert_eq(f->kind, KILN_STEP_FALLBACK);
	cr_assert_eq(f->node, 5);
	cr_assert_str_eq(f->op, "aten.gelu.default");
	cr_assert_eq(f->n_args, 3);
	cr_assert_eq(f->args[0].kind, KILN_ARG_REF);
	cr_assert_eq(f->args[0].u.ref, 0);
	cr_assert_eq(f->args[1].u.f, 2.5);
	cr_assert_eq(f->args[2].u.list[1].u.ref, 0);
	cr_assert_eq(f->n_kwargs, 2);
	cr_assert_str_eq(f->kwargs[1].val.u.s, "x");
	cr_assert_eq(f->n_out, 1);
	cr_assert_eq(f->out[0], 1);

	cr_assert_eq(a->n_outputs, 3);
	cr_assert_eq(a->outputs[1].u.ref, 2);
	cr_assert_eq(a->outputs[2].kind, KILN_ARG_SYM);
	kiln_dim_t osym = {0, a->outputs[2].u.sym};
	ASSERT_DIM(a, osym, "s0*batch");
	ASSERT_DIM(a, a->arena_bytes, "256*s0");

	/* packing the decoded artifact gives the same bytes */
	pack_bytes(a, &sb2);
	cr_assert_eq(sb1.size, sb2.size);
	cr_assert_arr_eq(sb1.data, sb2.data, sb1.size);
	msgpack_sbuffer_destroy(&sb1);
	msgpack_sbuffer_destroy(&sb2);
	kiln_artifact_free(a);
	ab_free(&b);
}

Test(artifact, minimal_and_optional_fields)
{
	/* no symbols, no kernels, empty code, nil signature/cubin/text */
	ab_t b = ab_new(NULL);
	ab_arena(&b, "0");
	msgpack_sbuffer sb, e1, e2, e3;
	ab_pack(&b, &sb);
	art_edit(&sb, "signature", "nil", &e1);
	art_edit(&e1, "kernels_text", NULL, &e2);
	art_edit(&e2, "cubin", "bin('ptx?')", &e3);
	kiln_artifact_t *a = NULL;
	char err[256];
	cr_assert_eq(kiln_artifact_decode((const uint8_t *)e3.data, e3.size,
					  NULL, &a, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_str_eq(a->signature, "");
	cr_assert_null(a->kernels_text);
	cr_assert_eq(a->cubin_len, 4);
	cr_assert_eq(a->code_len, 0);
	kiln_artifact_free(a);
	msgpack_sbuffer_destroy(&sb);
	msgpack_sbuffer_destroy(&e1);
	msgpack_sbuffer_destroy(&e2);
	msgpack_sbuffer_destroy(&e3);
	ab_free(&b);
}

/* ---- rejections through the C struct (pack writes what it is given) ---- */

Test(reject, kernel_table)
{
	ab_t b = full_artifact();
	b.a->steps[0].kernel = 2;
	ab_reject(&b, KILN_EINVGRAPH,
		  "step 0: kernel 2 out of range (2 kernels)");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[2].n_bufs = 3;
	b.a->steps[2].bufs = b.a->steps[0].bufs;
	ab_reject(&b, KILN_EINVGRAPH,
		  "step 2: 3 buffers but kernel 1 (k_scale2_f32) takes 2");
	ab_free(&b);

	b = full_artifact();
	b.a->kernels[1].name = "k-bad";
	ab_reject(&b, KILN_EINVGRAPH,
		  "kernel 1: \"name\" must be a C identifier");
	ab_free(&b);

	b = full_artifact();
	b.a->kernels[1].name = "9lives";
	ab_reject(&b, KILN_EINVGRAPH, "C identifier");
	ab_free(&b);

	char longname[300];
	memset(longname, 'k', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	b = full_artifact();
	b.a->kernels[0].name = longname;
	ab_reject(&b, KILN_EINVGRAPH, "at most 255 bytes");
	ab_free(&b);

	b = full_artifact();
	b.a->kernels[0].grain = 0;
	ab_reject(&b, KILN_EINVGRAPH, "kernel 0 (k_add_f32): \"grain\"");
	ab_free(&b);
}

Test(reject, buffer_indices)
{
	ab_t b = full_artifact();
	b.a->steps[0].bufs[1] = 9;
	ab_reject(&b, KILN_EINVGRAPH,
		  "step 0: bufs[1]: buffer 9 out of range (4 buffers)");
	ab_free(&b);

	b = full_artifact();
	b.a->buffers[0].index = 3;
	ab_reject(&b, KILN_EINVGRAPH,
		  "buffer 0: \"index\" must be an input index (3 inputs)");
	ab_free(&b);

	b = full_artifact();
	b.a->buffers[0].index = 0; /* the int input */
	ab_reject(&b, KILN_EINVGRAPH, "buffer 0: input 0 is an int");
	ab_free(&b);

	b = full_artifact();
	b.a->buffers[3].index = 1;
	ab_reject(&b, KILN_EINVGRAPH,
		  "buffer 3: \"index\" must be an output buffer index (1 "
		  "output buffers)");
	ab_free(&b);

	b = full_artifact();
	b.a->n_out_buffers = 2;
	ab_reject(&b, KILN_EINVGRAPH,
		  "output buffer 1 is not described by any buffer");
	ab_free(&b);

	b = full_artifact();
	b.a->buffers[2].kind = KILN_BUF_OUTPUT;
	b.a->buffers[2].index = 0;
	ab_reject(&b, KILN_EINVGRAPH,
		  "buffer 3: output buffer 0 is also buffer 2");
	ab_free(&b);

	b = full_artifact();
	b.a->buffers[2].offset = (kiln_dim_t){32, NULL};
	ab_reject(&b, KILN_EINVGRAPH,
		  "buffer 2: offset 32 is not a multiple of 64");
	ab_free(&b);

	b = full_artifact();
	b.a->arena_bytes = (kiln_dim_t){100, NULL};
	b.a->buffers[2].offset = (kiln_dim_t){64, NULL};
	b.a->buffers[2].bytes = (kiln_dim_t){64, NULL};
	ab_reject(&b, KILN_EINVGRAPH, "buffer 2: bytes [64, +64) exceed");
	ab_free(&b);
}

Test(reject, view_indices)
{
	ab_t b = full_artifact();
	b.a->views[1].buffer = 4;
	ab_reject(&b, KILN_EINVGRAPH,
		  "view 1: \"buffer\" must be a buffer index (4 buffers)");
	ab_free(&b);

	b = full_artifact();
	b.a->outputs[0].u.ref = 3;
	ab_reject(&b, KILN_EINVGRAPH,
		  "output 0: view 3 out of range (3 views)");
	ab_free(&b);

	b = full_artifact();
	b.a->outputs[0].u.ref = 0; /* a view of the arena */
	ab_reject(&b, KILN_EINVGRAPH,
		  "output 0: view 0 lies in the scratch arena");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[1].args[0].u.ref = 7;
	ab_reject(&b, KILN_EINVGRAPH,
		  "step 1 (aten.gelu.default): arg 0: ref 7 out of range (3 "
		  "views)");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[1].args[2].u.list[1].u.ref = 3;
	ab_reject(&b, KILN_EINVGRAPH, "arg 2[1]: ref 3 out of range");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[1].kwargs[0].val.kind = KILN_ARG_REF;
	b.a->steps[1].kwargs[0].val.u.ref = 99;
	ab_reject(&b, KILN_EINVGRAPH, "kwarg \"alpha\": ref 99 out of range");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[1].out[0] = 3;
	ab_reject(&b, KILN_EINVGRAPH,
		  "step 1 (aten.gelu.default): out[0]: view 3 out of range (3 "
		  "views)");
	ab_free(&b);

	b = full_artifact();
	b.a->steps[1].op = "gelu";
	ab_reject(&b, KILN_EINVGRAPH, "step 1: malformed op name \"gelu\"");
	ab_free(&b);
}

Test(reject, bindings)
{
	ab_t b = full_artifact();
	b.a->bindings[0].input = 3;
	ab_reject(&b, KILN_EINVGRAPH,
		  "binding 0 (s0): \"input\" must be an input index (3 "
		  "inputs)");
	ab_free(&b);

	b = full_artifact();
	b.a->bindings[0].dim = 2;
	ab_reject(&b, KILN_EINVGRAPH,
		  "binding 0 (s0): dim 2 out of range for input 1 of rank 2");
	ab_free(&b);

	b = full_artifact();
	b.a->bindings[0].dim = 1; /* size 1 of input 1 is 64, not s0 */
	ab_reject(&b, KILN_EINVGRAPH,
		  "binding 0 (s0): size 1 of input 1 is not exactly this "
		  "symbol");
	ab_free(&b);

	b = full_artifact();
	b.a->bindings[0].dim = -1;
	ab_reject(&b, KILN_EINVGRAPH, "input 1 is a tensor: give \"dim\"");
	ab_free(&b);

	b = full_artifact();
	b.a->bindings[1].dim = 0;
	ab_reject(&b, KILN_EINVGRAPH,
		  "binding 1 (batch): input 0 is an int: \"dim\" must be -1");
	ab_free(&b);

	b = full_artifact();
	b.a->bindings[1].input = 1;
	b.a->bindings[1].dim = 0;
	ab_reject(&b, KILN_EINVGRAPH, "is not exactly this symbol");
	ab_free(&b);
}

/* ---- rejections through field surgery on the packed bytes --------------- */

static void edit_reject(const char *key, const char *text, int code,
			const char *needle)
{
	ab_t b = full_artifact();
	msgpack_sbuffer sb, ed;
	ab_pack(&b, &sb);
	art_edit(&sb, key, text, &ed);
	char err[512] = "";
	kiln_artifact_t *a = (kiln_artifact_t *)(uintptr_t)1;
	int rc = kiln_artifact_decode((const uint8_t *)ed.data, ed.size, NULL,
				      &a, err, sizeof(err));
	cr_assert_eq(rc, code, "%s = %s: rc %d (%s): \"%s\"", key,
		     text ? text : "(removed)", rc, kiln_strerror(rc), err);
	cr_assert_null(a);
	cr_assert_not_null(strstr(err, needle),
			   "%s = %s: message \"%s\" does not contain \"%s\"",
			   key, text ? text : "(removed)", err, needle);
	msgpack_sbuffer_destroy(&sb);
	msgpack_sbuffer_destroy(&ed);
	ab_free(&b);
}

Test(reject, fields_and_types)
{
	int E = KILN_EINVGRAPH;
	edit_reject("format", NULL, E, "missing \"format\"");
	edit_reject("format", "'kiln.artifact/2'", E,
		    "\"format\" must be \"kiln.artifact/1\"");
	edit_reject("target", "{'backend': 'tpu'}", E,
		    "target: unknown backend \"tpu\"");
	edit_reject("target", NULL, E, "target: \"target\" must be a map");
	edit_reject("signature", "'abc'", E, "\"signature\" must be 64 hex");
	edit_reject("code", NULL, E, "missing \"code\" bin");
	edit_reject("code", "'not bin'", E, "missing \"code\" bin");
	edit_reject("cubin", "7", E, "\"cubin\" must be bin or nil");
	edit_reject("kernels_text", "[1]", E, "\"kernels_text\" must be str");
	edit_reject("n_out_buffers", NULL, E, "missing \"n_out_buffers\"");
	edit_reject("n_out_buffers", "-1", E, "missing \"n_out_buffers\"");
	edit_reject("arena_bytes", NULL, E, "missing \"arena_bytes\"");
	edit_reject("arena_bytes", "'s7'", E, "undeclared symbol \"s7\"");
	edit_reject("arena_bytes", "-64", E, "arena_bytes is negative");
	edit_reject("symbols", "{'min': {}}", E, "invalid symbol name");
	edit_reject("bindings", "[]", E, "\"bindings\" has 0 entries for 2");
	edit_reject("bindings", "[{'input': 1, 'dim': 0}, 5]", E,
		    "binding 1 (batch): must be a map");
	edit_reject("bindings",
		    "[{'input': 1, 'dim': 'x'}, {'input': 0, 'dim': -1}]", E,
		    "\"dim\" must be -1, nil or a dimension index");
	edit_reject("inputs", NULL, E, "missing \"inputs\" array");
	edit_reject("inputs",
		    "[{'sym': 'batch'}, {'dtype': 'f33', 'shape': ['s0', 64]}, "
		    "{'dtype': 'f32', 'shape': [1]}]",
		    E, "input 1: unknown dtype \"f33\"");
	edit_reject("kernels", "{}", E, "missing \"kernels\" array");
	edit_reject("kernels", "[5]", E, "kernel 0: must be a map");
	edit_reject("kernels",
		    "[{'name': 'a', 'extent': 's9', 'grain': 1, 'n_bufs': 3}]",
		    E, "kernel 0 (a): extent: expression \"s9\": undeclared");
	edit_reject("kernels",
		    "[{'name': 7, 'extent': 1, 'grain': 1, 'n_bufs': 3}]", E,
		    "kernel 0: \"name\" must be a C identifier");
	edit_reject("kernels", "[{'name': 'a', 'grain': 1, 'n_bufs': 3}]", E,
		    "kernel 0 (a): missing \"extent\"");
	edit_reject("kernels", "[{'name': 'a', 'extent': 1, 'grain': 1}]", E,
		    "kernel 0 (a): \"n_bufs\" must be an int >= 0");
	edit_reject("buffers", "[{'kind': 'heap', 'index': 0}]", E,
		    "buffer 0: \"kind\" must be \"input\", \"output\" or "
		    "\"arena\"");
	edit_reject("buffers", "[{'kind': 'arena', 'bytes': 4}]", E,
		    "buffer 0: missing \"offset\"");
	edit_reject("buffers", "[{'kind': 'output', 'index': 0}]", E,
		    "buffer 0: missing \"bytes\"");
	edit_reject("views", "[{'buffer': 0, 'dtype': 'f32'}]", E,
		    "view 0: spec needs a \"shape\" array");
	edit_reject("views",
		    "[{'buffer': 0, 'dtype': 'q8', 'shape': [1], 'strides': "
		    "[1]}]",
		    E, "view 0: unknown dtype \"q8\"");
	edit_reject("views",
		    "[{'buffer': 0, 'dtype': 'f32', 'shape': [1, 2], "
		    "'strides': [1]}]",
		    E, "view 0: \"strides\" must be an array of 2 entries");
	edit_reject("views", "[{'buffer': -1, 'dtype': 'f32', 'shape': [1]}]",
		    E, "view 0: \"buffer\" must be a buffer index");
	edit_reject("steps", "[{'kind': 'alias'}]", E,
		    "step 0: \"kind\" must be \"kernel\" or \"fallback\"");
	edit_reject("steps", "[{'kind': 'kernel', 'kernel': 0}]", E,
		    "step 0: missing \"bufs\" array");
	edit_reject("steps", "[{'kind': 'kernel', 'kernel': 'k'}]", E,
		    "step 0: \"kernel\" must be a kernel index");
	edit_reject("steps",
		    "[{'kind': 'kernel', 'kernel': 0, 'bufs': [0, 'x', 1]}]", E,
		    "step 0: bufs[1]: not a buffer index");
	edit_reject("steps",
		    "[{'kind': 'kernel', 'node': -2, 'kernel': 0, 'bufs': [0, "
		    "0, 2]}]",
		    E, "step 0: \"node\" must be a node index, -1 or nil");
	edit_reject("steps",
		    "[{'kind': 'fallback', 'op': 'aten.x.default', 'args': "
		    "[nan], 'out': []}]",
		    E, "step 0 (aten.x.default): arg 0: NaN");
	edit_reject("steps",
		    "[{'kind': 'fallback', 'op': 'aten.x.default', 'kwargs': "
		    "{'a': 1, 'a': 2}, 'out': []}]",
		    E, "kwarg \"a\" given twice");
	edit_reject("steps",
		    "[{'kind': 'fallback', 'op': 'aten.x.default', 'args': "
		    "[{'ref': 1, 'x': 2}], 'out': [0]}]",
		    E, "arg 0: a map argument must be");
	edit_reject("steps", "[{'kind': 'fallback', 'op': 'aten.x.default'}]",
		    E, "step 0 (aten.x.default): missing \"out\" array");
	edit_reject("outputs", "[5]", E,
		    "output 0: must be {\"ref\": view} or {\"sym\": expr}");
	edit_reject("outputs", "[{'ref': 0, 'sym': 's0'}]", E,
		    "output 0: must be {\"ref\": view}");
	edit_reject("outputs", "[{'sym': 's0 +'}]", E,
		    "output 0: sym: expression \"s0 +\"");
}

Test(reject, limits_and_bytes)
{
	ab_t b = full_artifact();
	msgpack_sbuffer sb;
	ab_pack(&b, &sb);
	const uint8_t *p = (const uint8_t *)sb.data;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	char err[512];
	kiln_artifact_t *a = NULL;

	lim.max_nodes = 2;
	cr_assert_eq(
	    kiln_artifact_decode(p, sb.size, &lim, &a, err, sizeof(err)),
	    KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "3 steps exceed the limit 2");
	kiln_limits_default(&lim);
	lim.max_values = 3;
	cr_assert_eq(
	    kiln_artifact_decode(p, sb.size, &lim, &a, err, sizeof(err)),
	    KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "4 buffers exceed the limit 3");
	kiln_limits_default(&lim);
	lim.max_rank = 1;
	cr_assert_eq(
	    kiln_artifact_decode(p, sb.size, &lim, &a, err, sizeof(err)),
	    KILN_EINVGRAPH);
	ASSERT_MSG_HAS(err, "input 1: rank 2 exceeds the limit 1");
	kiln_limits_default(&lim);
	lim.max_symbols = 1;
	cr_assert_eq(
	    kiln_artifact_decode(p, sb.size, &lim, &a, err, sizeof(err)),
	    KILN_ETOOLARGE);
	kiln_limits_default(&lim);
	lim.max_depth = 3;
	cr_assert_eq(
	    kiln_artifact_decode(p, sb.size, &lim, &a, err, sizeof(err)),
	    KILN_ETOOLARGE);

	/* not msgpack / not a map / trailing bytes */
	static const uint8_t junk[] = {0xc1, 0x00};
	cr_assert_eq(kiln_artifact_decode(junk, sizeof(junk), NULL, &a, err,
					  sizeof(err)),
		     KILN_EBADFRAME);
	static const uint8_t arr[] = {0x91, 0x01};
	cr_assert_eq(
	    kiln_artifact_decode(arr, sizeof(arr), NULL, &a, err, sizeof(err)),
	    KILN_EBADFRAME);
	uint8_t *more = malloc(sb.size + 1);
	memcpy(more, p, sb.size);
	more[sb.size] = 0xc0;
	cr_assert_eq(
	    kiln_artifact_decode(more, sb.size + 1, NULL, &a, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "trailing");
	free(more);
	cr_assert_null(a);
	msgpack_sbuffer_destroy(&sb);
	ab_free(&b);
}

/* Every prefix fails cleanly; every single-byte change decodes or fails
 * cleanly (ASan/UBSan watch). */
Test(reject, truncation_and_byte_flips)
{
	ab_t b = full_artifact();
	msgpack_sbuffer sb;
	ab_pack(&b, &sb);
	const uint8_t *p = (const uint8_t *)sb.data;
	char err[512];
	kiln_artifact_t *a;
	for (size_t n = 0; n < sb.size; n++) {
		a = (kiln_artifact_t *)(uintptr_t)1;
		int rc = kiln_artifact_decode(p, n, NULL, &a, err, sizeof(err));
		cr_assert_neq(rc, 0, "a %zu-byte prefix decoded", n);
		cr_assert_null(a);
	}
	uint8_t *q = malloc(sb.size);
	unsigned ok = 0, bad = 0;
	for (size_t i = 0; i < sb.size; i++) {
		static const uint8_t xors[] = {0x01, 0x10, 0x80, 0xff};
		for (size_t k = 0; k < sizeof(xors); k++) {
			memcpy(q, p, sb.size);
			q[i] ^= xors[k];
			a = NULL;
			int rc = kiln_artifact_decode(q, sb.size, NULL, &a, err,
						      sizeof(err));
			if (rc == 0) {
				ok++;
				kiln_artifact_free(a);
			} else {
				bad++;
				cr_assert_null(a);
				cr_assert(rc == KILN_EBADFRAME ||
					      rc == KILN_EINVGRAPH ||
					      rc == KILN_ETOOLARGE,
					  "byte %zu ^ %#x: rc %d (%s)", i,
					  xors[k], rc, err);
			}
		}
	}
	cr_assert_gt(bad, 0);
	cr_log_info("byte flips: %u decoded, %u rejected", ok, bad);
	free(q);
	msgpack_sbuffer_destroy(&sb);
	ab_free(&b);
}

/* The example of ARTIFACT.md decodes (comments dropped, code shortened). */
Test(artifact, the_documented_example_decodes)
{
	const char *text =
	    "{'format': 'kiln.artifact/1',"
	    " 'target': {'backend': 'cpu', 'arch': 'x86-64', 'features': "
	    "'+avx2,+fma'},"
	    " 'signature': "
	    "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'"
	    ","
	    " 'code': bin('ELF'), 'cubin': nil,"
	    " 'symbols': {'s0': {'min': 2, 'max': 4096, 'hint': 16}},"
	    " 'bindings': [{'input': 0, 'dim': 0}],"
	    " 'inputs': [{'dtype': 'f32', 'shape': ['s0', 64]},"
	    "            {'dtype': 'f32', 'shape': [64]}],"
	    " 'kernels': ["
	    "   {'name': 'kiln_k0_add', 'extent': 's0', 'grain': 16, "
	    "'n_bufs': 3},"
	    "   {'name': 'kiln_k1_mul2', 'extent': '64*s0', 'grain': 4096, "
	    "'n_bufs': 2}],"
	    " 'buffers': ["
	    "   {'kind': 'input', 'index': 0},"
	    "   {'kind': 'input', 'index': 1},"
	    "   {'kind': 'arena', 'offset': 0, 'bytes': '256*s0'},"
	    "   {'kind': 'arena', 'offset': '256*s0', 'bytes': '256*s0'},"
	    "   {'kind': 'output', 'index': 0, 'bytes': '256*s0'}],"
	    " 'views': ["
	    "   {'buffer': 2, 'dtype': 'f32', 'shape': ['s0', 64], 'strides': "
	    "[64, 1], 'offset': 0},"
	    "   {'buffer': 3, 'dtype': 'f32', 'shape': ['s0', 64], 'strides': "
	    "[64, 1], 'offset': 0},"
	    "   {'buffer': 4, 'dtype': 'f32', 'shape': ['s0', 64], 'strides': "
	    "[64, 1], 'offset': 0},"
	    "   {'buffer': 0, 'dtype': 'f32', 'shape': [64, 's0'], 'strides': "
	    "[1, 64], 'offset': 0}],"
	    " 'steps': ["
	    "   {'kind': 'kernel', 'node': 0, 'kernel': 0, 'bufs': [0, 1, 2]},"
	    "   {'kind': 'fallback', 'node': 1, 'op': 'aten.gelu.default',"
	    "    'args': [{'ref': 0}], 'kwargs': {'approximate': 'none'}, "
	    "'out': [1]},"
	    "   {'kind': 'kernel', 'node': 2, 'kernel': 1, 'bufs': [3, 4]}],"
	    " 'outputs': [{'ref': 2}, {'ref': 3}, {'sym': 's0'}],"
	    " 'n_out_buffers': 1,"
	    " 'arena_bytes': '512*s0',"
	    " 'kernels_text': 'k0 kiln_k0_add: add [s0 rows]\\n'}";
	msgpack_sbuffer sb;
	mp_pack(&sb, text);
	char err[512] = "";
	kiln_artifact_t *a = NULL;
	int rc = kiln_artifact_decode((const uint8_t *)sb.data, sb.size, NULL,
				      &a, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(a->n_steps, 3);
	cr_assert_eq(a->steps[1].kind, KILN_STEP_FALLBACK);
	ASSERT_DIM(a, a->arena_bytes, "512*s0");
	kiln_artifact_free(a);
	msgpack_sbuffer_destroy(&sb);
}
