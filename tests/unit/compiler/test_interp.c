/*
 * test_interp.c — the reference interpreter (compiler/interp*.c) against
 * torch: every per-op case in tests/data/ops/ (tests/data/make_op_cases.py),
 * every graph of the corpus in tests/data/graphs/, and every rejection case
 * in tests/data/bad/ (plus a few built here), which must fail with the
 * right code and a message naming the node.
 *
 * Tolerances are tests/common/testdata.h's per-dtype defaults, loosened (never
 * tightened) by the rtol/atol an io map carries. The data directory comes
 * from the build (-DKILN_TEST_DATA_DIR).
 */
#include "compiler/compiler.h"
#include "tests/common/testdata.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_TEST_DATA_DIR
#error "build with -DKILN_TEST_DATA_DIR=\"<source>/tests/data\""
#endif

/* Criterion runs each test in a fresh process, so parameters must hold
 * their data inline (a pointer to a string literal would dangle). */
typedef struct pname {
	char s[96];
} pname_t;

/* tests/data/ops/<name>.cases.msgpack (make_op_cases.py writes them) */
static const pname_t op_files[] = {
    {"_adaptive_avg_pool2d"},
    {"_adaptive_avg_pool2d_backward"},
    {"_log_softmax"},
    {"_log_softmax_backward_data"},
    {"_native_batch_norm_legit_functional"},
    {"_native_multi_head_attention"},
    {"_native_batch_norm_legit_no_training"},
    {"_reshape_alias"},
    {"_safe_softmax"},
    {"_scaled_dot_product_flash_attention_for_cpu"},
    {"_scaled_dot_product_flash_attention_for_cpu_backward"},
    {"_softmax"},
    {"_weight_norm_interface"},
    {"_weight_norm_interface_backward"},
    {"_softmax_backward_data"},
    {"_to_copy"},
    {"_transformer_encoder_layer_fwd"},
    {"_unsafe_index"},
    {"_unsafe_index_put"},
    {"_unsafe_view"},
    {"abs"},
    {"add"},
    {"addmm"},
    {"alias"},
    {"all"},
    {"amax"},
    {"amin"},
    {"any"},
    {"arange"},
    {"argmax"},
    {"argmin"},
    {"as_strided"},
    {"as_strided_scatter"},
    {"atan2"},
    {"avg_pool2d"},
    {"avg_pool2d_backward"},
    {"baddbmm"},
    {"bitwise_and"},
    {"bitwise_not"},
    {"bitwise_or"},
    {"bitwise_xor"},
    {"bmm"},
    {"cat"},
    {"ceil"},
    {"clamp"},
    {"clamp_max"},
    {"clamp_min"},
    {"clone"},
    {"constant_pad_nd"},
    {"convert_element_type"},
    {"convolution"},
    {"convolution_backward"},
    {"copy"},
    {"cos"},
    {"cumsum"},
    {"detach"},
    {"div"},
    {"dynamic"},
    {"elu"},
    {"embedding"},
    {"embedding_dense_backward"},
    {"empty"},
    {"eq"},
    {"erf"},
    {"exp"},
    {"exp2"},
    {"expand"},
    {"expm1"},
    {"fill"},
    {"flip"},
    {"floor"},
    {"fmod"},
    {"full"},
    {"full_like"},
    {"gather"},
    {"ge"},
    {"gelu"},
    {"gelu_backward"},
    {"gt"},
    {"hardsigmoid"},
    {"hardsigmoid_backward"},
    {"hardswish"},
    {"hardswish_backward"},
    {"hardtanh"},
    {"index"},
    {"index_add"},
    {"index_put"},
    {"index_select"},
    {"isnan"},
    {"kiln_dropout"},
    {"le"},
    {"leaky_relu"},
    {"lerp"},
    {"log"},
    {"log1p"},
    {"log2"},
    {"logical_and"},
    {"logical_not"},
    {"logical_or"},
    {"logical_xor"},
    {"logsumexp"},
    {"lt"},
    {"masked_fill"},
    {"max"},
    {"max_pool2d_with_indices"},
    {"max_pool2d_with_indices_backward"},
    {"maximum"},
    {"mean"},
    {"min"},
    {"minimum"},
    {"mm"},
    {"mse_loss"},
    {"mse_loss_backward"},
    {"mul"},
    {"native_batch_norm"},
    {"native_batch_norm_backward"},
    {"native_dropout"},
    {"native_dropout_backward"},
    {"native_group_norm"},
    {"native_group_norm_backward"},
    {"native_layer_norm"},
    {"native_layer_norm_backward"},
    {"ne"},
    {"neg"},
    {"new_empty"},
    {"new_full"},
    {"new_ones"},
    {"new_zeros"},
    {"nll_loss_backward"},
    {"nll_loss_forward"},
    {"ones"},
    {"ones_like"},
    {"permute"},
    {"pow"},
    {"prod"},
    {"reciprocal"},
    {"relu"},
    {"remainder"},
    {"repeat"},
    {"roll"},
    {"reshape"},
    {"round"},
    {"rsqrt"},
    {"rsub"},
    {"scalar_tensor"},
    {"scatter"},
    {"scatter_add"},
    {"scatter_reduce"},
    {"select"},
    {"select_backward"},
    {"sigmoid"},
    {"sigmoid_backward"},
    {"sign"},
    {"silu"},
    {"silu_backward"},
    {"sin"},
    {"slice"},
    {"slice_backward"},
    {"split"},
    {"split_with_sizes"},
    {"sqrt"},
    {"squeeze"},
    {"stack"},
    {"std"},
    {"sub"},
    {"sum"},
    {"t"},
    {"tan"},
    {"tanh"},
    {"tanh_backward"},
    {"threshold_backward"},
    {"hardtanh_backward"},
    {"transpose"},
    {"tril"},
    {"triu"},
    {"trunc"},
    {"unbind"},
    {"unsqueeze"},
    {"upsample_bilinear2d"},
    {"upsample_nearest2d"},
    {"var"},
    {"view"},
    {"where"},
    {"zeros"},
    {"zeros_like"},
    {"addcdiv"},
    {"addcmul"},
    {"floor_divide"},
    {"linalg_vector_norm"},
    {"select_scatter"},
    {"slice_scatter"},
    {"softplus"},
    {"mish"},
    {"celu"},
    {"threshold"},
    {"log_sigmoid_forward"},
    {"_prelu_kernel"},
    {"glu"},
    {"sgn"},
    {"softplus_backward"},
    {"mish_backward"},
    {"leaky_relu_backward"},
    {"log_sigmoid_backward"},
    {"elu_backward"},
    {"_prelu_kernel_backward"},
    {"glu_backward"},
};
#define N_OP_FILES (sizeof(op_files) / sizeof(op_files[0]))

/* tests/data/graphs/<name>.{graph,io}.msgpack (capture_corpus.py) */
static const pname_t corpus[] = {
    {"mlp_fwd"},
    {"mlp_bwd"},
    {"cnn_fwd"},
    {"cnn_bwd"},
    {"resnet18_fwd"},
    {"transformer_layer_fwd"},
    {"transformer_layer_bwd"},
    {"gpt2_fwd"},
    {"gpt2_bwd"},
    {"bert_fwd"},
    {"vit_fwd"},
    {"transformer_dyn_fwd"},
    {"mobilenet_v2_fwd"},
    {"efficientnet_fwd"},
};
#define N_CORPUS (sizeof(corpus) / sizeof(corpus[0]))

/* tests/data/bad/<name>.msgpack (make_op_cases.py writes them) */
static const pname_t bad_files[] = {{"split_fewer_outputs"},
				    {"split_with_sizes_mismatch"},
				    {"split_past_end"},
				    {"unbind_more_outputs"},
				    {"as_strided_past_storage"},
				    {"as_strided_negative_stride"},
				    {"pad_unpadded_dim"},
				    {"repeat_shape"},
				    {"slice_backward_grad_shape"},
				    {"select_backward_grad_shape"},
				    {"view_symbolic_count"},
				    {"slice_past_end"},
				    {"narrow_past_end"},
				    {"narrow_start_range"},
				    {"as_strided_scatter_outside"},
				    {"as_strided_scatter_src"},
				    {"broadcast"},
				    {"cat_shapes"},
				    {"conv_channels"},
				    {"conv3d_channels"},
				    {"act_softplus_beta0"},
				    {"act_glu_odd"},
				    {"act_mish_int"},
				    {"act_threshold_no_value"},
				    {"act_glu_bw_shape"},
				    {"copy_broadcast"},
				    {"tconv_channels"},
				    {"tconv_output_padding"},
				    {"tconv3d_channels"},
				    {"tconv3d_bw_shape"},
				    {"dtype_bitwise_float"},
				    {"dtype_gelu_int"},
				    {"dtype_mean_int"},
				    {"dtype_mm_mixed"},
				    {"dtype_sub_bool"},
				    {"embedding_range"},
				    {"expand_bad"},
				    {"gelu_approx"},
				    {"input_shape"},
				    {"int_div_zero"},
				    {"kiln_dropout_int"},
				    {"kiln_dropout_p"},
				    {"kiln_dropout_seed_dtype"},
				    {"kiln_dropout_seed_shape"},
				    {"kiln_dropout_stream"},
				    {"later_node"},
				    {"layer_norm_shape"},
				    {"missing_arg"},
				    {"mm_shapes"},
				    {"out_dtype"},
				    {"out_rank"},
				    {"out_shape"},
				    {"permute_dup"},
				    {"reduce_dim_range"},
				    {"reduce_dim_range_neg"},
				    {"roll_dim_range"},
				    {"new_empty_strided_stride_len"},
				    {"weight_norm_g_shape"},
				    {"weight_norm_v_int"},
				    {"weight_norm_bw_norms_shape"},
				    {"index_add_source_shape"},
				    {"index_add_index_2d"},
				    {"index_add_source_dtype"},
				    {"index_add_int_alpha"},
				    {"mha_heads_divide"},
				    {"scatter_reduce_bad_reduce"},
				    {"tri_rank1"},
				    {"fill_tensor_rank1"},
				    {"lerp_dtype"},
				    {"addcdiv_int"},
				    {"vector_norm_int"},
				    {"slice_scatter_src_shape"},
				    {"mha_embed_dim"},
				    {"mha_weight_dtype"},
				    {"mha_mask_shape"},
				    {"mha_mask_type"},
				    {"mha_qkv_weight_shape"},
				    {"weight_norm_bw_grad_shape"},
				    {"roll_lengths"},
				    {"roll_no_dims"},
				    {"select_range"},
				    {"split_outputs"},
				    {"symbol_conflict"},
				    {"symbol_expr_dim"},
				    {"symbol_max"},
				    {"symbol_min"},
				    {"unknown_op"},
				    {"unknown_overload"},
				    {"view_infer"},
				    {"view_size"},
				    {"view_two_infer"},
				    {"wrong_arg_kind"}};
#define N_BAD_FILES (sizeof(bad_files) / sizeof(bad_files[0]))

/* ---- helpers ------------------------------------------------------------- */

typedef struct result {
	bool ok;
	char msg[1024];
	double max_abs; /* over every compared floating element */
	double max_rel;
} result_t;

static void free_outputs(kiln_tensor_t *out, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		free(out[k].data);
	free(out);
}

/*
 * Runs graph g on io's inputs and compares every output with io's. Fills
 * *r (ok, a message for the first failure, the largest errors seen).
 */
static void check_graph(const kiln_graph_t *g, const kiln_td_io_t *io,
			result_t *r)
{
	char err[512] = "";
	memset(r, 0, sizeof(*r));
	kiln_tensor_t *in = calloc(g->n_inputs ? g->n_inputs : 1, sizeof(*in));
	kiln_tensor_t *out =
	    calloc(g->n_outputs ? g->n_outputs : 1, sizeof(*out));
	cr_assert(in != NULL && out != NULL);
	int rc = kiln_td_make_inputs(g, io, in, err, sizeof(err));
	if (rc < 0) {
		snprintf(r->msg, sizeof(r->msg), "inputs: %s", err);
		goto done;
	}
	rc = kiln_interp_run(g, in, out, err, sizeof(err));
	if (rc < 0) {
		snprintf(r->msg, sizeof(r->msg), "interp failed (%s): %s",
			 kiln_strerror(rc), err);
		goto done;
	}
	if (io->n_outputs != g->n_outputs) {
		snprintf(r->msg, sizeof(r->msg),
			 "io has %u outputs, the graph %u", io->n_outputs,
			 g->n_outputs);
		goto done;
	}
	r->ok = true;
	for (uint32_t k = 0; k < g->n_outputs && r->ok; k++) {
		const kiln_td_value_t *w = &io->outputs[k];
		kiln_tensor_t want;
		int64_t iv;
		if (w->is_int) {
			memset(&want, 0, sizeof(want));
			iv = w->ival;
			want.dtype = KILN_DT_I64;
			want.data = &iv;
		} else {
			want = w->t;
		}
		double rtol, atol;
		kiln_td_tolerance(want.dtype, &rtol, &atol);
		if (io->rtol > rtol)
			rtol = io->rtol;
		if (io->atol > atol)
			atol = io->atol;
		kiln_td_cmp_t cmp;
		if (io->nocheck != NULL && io->nocheck[k]) {
			/* values undefined: dtype kind and shape only */
			bool same = out[k].rank == want.rank &&
				    kiln_dtype_is_float(out[k].dtype) ==
					kiln_dtype_is_float(want.dtype);
			for (uint32_t d = 0; same && d < want.rank; d++)
				same = out[k].sizes[d] == want.sizes[d];
			if (!same) {
				r->ok = false;
				snprintf(r->msg, sizeof(r->msg),
					 "output %u: wrong shape", k);
			}
			continue;
		}
		if (!kiln_td_compare(&out[k], &want, rtol, atol, &cmp)) {
			r->ok = false;
			snprintf(r->msg, sizeof(r->msg), "output %u (%s): %s",
				 k, kiln_dtype_name(want.dtype), cmp.msg);
		}
		if (kiln_dtype_is_float(want.dtype)) {
			if (cmp.max_abs > r->max_abs)
				r->max_abs = cmp.max_abs;
			if (cmp.max_rel > r->max_rel)
				r->max_rel = cmp.max_rel;
		}
	}
done:
	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
	free_outputs(out, g->n_outputs);
}

static void data_path(char *buf, size_t n, const char *sub, const char *name,
		      const char *ext)
{
	snprintf(buf, n, "%s/%s/%s%s", KILN_TEST_DATA_DIR, sub, name, ext);
}

/* ---- per-op cases -------------------------------------------------------- */

ParameterizedTestParameters(interp, op_cases)
{
	return cr_make_param_array(pname_t, (void *)op_files, N_OP_FILES);
}

ParameterizedTest(const pname_t *p, interp, op_cases)
{
	const char *name = p->s;
	char path[1024], err[1024];
	kiln_td_cases_t cs;
	data_path(path, sizeof(path), "ops", name, ".cases.msgpack");
	int rc = kiln_td_cases_load(path, &cs, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", path, err);
	cr_assert_gt(cs.n, 0, "%s has no cases", path);
	int failed = 0;
	char first[1400] = "";
	for (uint32_t i = 0; i < cs.n; i++) {
		result_t r;
		check_graph(cs.cases[i].graph, &cs.cases[i].io, &r);
		if (!r.ok) {
			cr_log_error("%s/%s: %s", name, cs.cases[i].name,
				     r.msg);
			if (failed++ == 0)
				snprintf(first, sizeof(first), "%s/%s: %s",
					 name, cs.cases[i].name, r.msg);
		}
	}
	uint32_t n = cs.n;
	kiln_td_cases_free(&cs);
	cr_expect_eq(failed, 0, "%d of %u cases of %s failed; first: %s",
		     failed, n, name, first);
}

/* Every case file on disk is in op_files (and so is run). */
Test(interp, op_case_list_complete)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/ops", KILN_TEST_DATA_DIR);
	DIR *d = opendir(dir);
	cr_assert(d != NULL, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	size_t found = 0;
	while ((e = readdir(d)) != NULL) {
		const char *suf = ".cases.msgpack";
		size_t l = strlen(e->d_name), ls = strlen(suf);
		if (l <= ls || strcmp(e->d_name + l - ls, suf) != 0)
			continue;
		bool listed = false;
		for (size_t k = 0; k < N_OP_FILES && !listed; k++)
			listed = strlen(op_files[k].s) == l - ls &&
				 strncmp(op_files[k].s, e->d_name, l - ls) == 0;
		cr_expect(listed, "%s is not in op_files[] of test_interp.c",
			  e->d_name);
		found++;
	}
	closedir(d);
	cr_expect_eq(found, N_OP_FILES, "%zu case files on disk, %zu listed",
		     found, (size_t)N_OP_FILES);
}

/* Every op a case uses is one the interpreter says it supports. */
Test(interp, supports)
{
	cr_expect(kiln_interp_supports("aten.add.Tensor"));
	cr_expect(kiln_interp_supports("aten.native_layer_norm.default"));
	cr_expect(kiln_interp_supports("prims.convert_element_type.default"));
	cr_expect(!kiln_interp_supports("aten.add"));
	cr_expect(!kiln_interp_supports("aten.frobnicate.default"));
	cr_expect(!kiln_interp_supports(""));
	cr_expect(!kiln_interp_supports(NULL));
}

/* ---- the corpus ---------------------------------------------------------- */

ParameterizedTestParameters(interp, corpus)
{
	return cr_make_param_array(pname_t, (void *)corpus, N_CORPUS);
}

ParameterizedTest(const pname_t *p, interp, corpus)
{
	const char *name = p->s;
	char gpath[1024], iopath[1024], err[1024];
	kiln_graph_t *g = NULL;
	kiln_td_io_t io;
	data_path(gpath, sizeof(gpath), "graphs", name, ".graph.msgpack");
	data_path(iopath, sizeof(iopath), "graphs", name, ".io.msgpack");
	int rc = kiln_td_graph_load(gpath, &g, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", gpath, err);
	for (uint32_t n = 0; n < g->n_nodes; n++)
		cr_expect(kiln_interp_supports(g->nodes[n].op),
			  "%s: node %u: %s is "
			  "not supported",
			  name, n, g->nodes[n].op);
	rc = kiln_td_io_load(iopath, &io, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", iopath, err);
	result_t r;
	check_graph(g, &io, &r);
	cr_log_info(
	    "corpus %s: %u nodes, %u outputs, max abs err %.3g, max rel "
	    "err %.3g",
	    name, g->n_nodes, g->n_outputs, r.max_abs, r.max_rel);
	fprintf(stderr, "corpus %s: %u nodes, %u outputs, max abs err %.3g\n",
		name, g->n_nodes, g->n_outputs, r.max_abs);
	kiln_td_io_free(&io);
	kiln_graph_free(g);
	cr_expect(r.ok, "%s: %s", name, r.msg);
}

/* index.json names exactly the graphs listed in corpus[]. */
Test(interp, corpus_list_complete)
{
	char path[1024];
	uint8_t *buf;
	size_t len;
	snprintf(path, sizeof(path), "%s/graphs/index.json",
		 KILN_TEST_DATA_DIR);
	cr_assert_eq(kiln_td_read_file(path, &buf, &len), 0, "%s", path);
	char *s = malloc(len + 1);
	cr_assert(s != NULL);
	memcpy(s, buf, len);
	s[len] = 0;
	free(buf);
	size_t names = 0;
	for (const char *p = s; (p = strstr(p, "\"graph\":")) != NULL; p++)
		names++;
	for (size_t k = 0; k < N_CORPUS; k++) {
		char key[160];
		snprintf(key, sizeof(key), "\"%.100s.graph.msgpack\"",
			 corpus[k].s);
		cr_expect(strstr(s, key) != NULL, "index.json lacks %s",
			  corpus[k].s);
	}
	cr_expect_eq(names, N_CORPUS,
		     "index.json lists %zu graphs, corpus[] %zu", names,
		     (size_t)N_CORPUS);
	free(s);
}

/* ---- rejections
 * -------------------------------------------------------------- */

ParameterizedTestParameters(interp, bad)
{
	return cr_make_param_array(pname_t, (void *)bad_files, N_BAD_FILES);
}

ParameterizedTest(const pname_t *p, interp, bad)
{
	const char *name = p->s;
	char path[1024], err[1024] = "";
	uint8_t *buf;
	size_t len;
	msgpack_zone zone;
	msgpack_object obj;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	data_path(path, sizeof(path), "bad", name, ".msgpack");
	cr_assert_eq(kiln_td_read_file(path, &buf, &len), 0, "%s", path);
	cr_assert(msgpack_zone_init(&zone, 4096));
	cr_assert_eq(kiln_msgpack_unpack_map(buf, len, &lim, &zone, &obj, err,
					     sizeof(err)),
		     0, "%s: %s", path, err);
	const msgpack_object *go = kiln_map_get(&obj, "graph");
	const msgpack_object *ioo = kiln_map_get(&obj, "io");
	const msgpack_object *eo = kiln_map_get(&obj, "error");
	const msgpack_object *mo = kiln_map_get(&obj, "message");
	cr_assert(go && ioo && eo && mo && eo->type == MSGPACK_OBJECT_STR &&
		      mo->type == MSGPACK_OBJECT_STR,
		  "%s: malformed", path);
	int want = kiln_err_from_wire_name(eo->via.str.ptr, eo->via.str.size);
	char msg[512];
	snprintf(msg, sizeof(msg), "%.*s", (int)mo->via.str.size,
		 mo->via.str.ptr);
	kiln_graph_t *g;
	kiln_td_io_t io;
	cr_assert_eq(kiln_graph_from_object(go, &lim, &g, err, sizeof(err)), 0,
		     "%s: the graph must decode (%s)", path, err);
	cr_assert_eq(kiln_td_io_from_object(ioo, &io, err, sizeof(err)), 0,
		     "%s: %s", path, err);
	msgpack_zone_destroy(&zone);
	free(buf);
	kiln_tensor_t in[16], out[16];
	cr_assert(g->n_inputs <= 16 && g->n_outputs <= 16);
	cr_assert_eq(kiln_td_make_inputs(g, &io, in, err, sizeof(err)), 0,
		     "%s: %s", path, err);
	memset(out, 0xab, sizeof(out));
	err[0] = 0;
	int rc = kiln_interp_run(g, in, out, err, sizeof(err));
	cr_expect_eq(rc, want, "%s: got %d (%s) \"%s\", expected %s", name, rc,
		     kiln_strerror(rc), err, kiln_strerror(want));
	cr_expect(strstr(err, msg) != NULL, "%s: message \"%s\" lacks \"%s\"",
		  name, err, msg);
	for (uint32_t k = 0; k < g->n_outputs; k++)
		cr_expect(out[k].data == NULL, "%s: output %u left allocated",
			  name, k);
	kiln_td_inputs_free(in, g->n_inputs);
	kiln_td_io_free(&io);
	kiln_graph_free(g);
}

/* Every bad case file on disk is in bad_files[]. */
Test(interp, bad_list_complete)
{
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/bad", KILN_TEST_DATA_DIR);
	DIR *d = opendir(dir);
	cr_assert(d != NULL, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	size_t found = 0;
	while ((e = readdir(d)) != NULL) {
		size_t l = strlen(e->d_name);
		if (l <= 8 || strcmp(e->d_name + l - 8, ".msgpack") != 0)
			continue;
		bool listed = false;
		for (size_t k = 0; k < N_BAD_FILES && !listed; k++)
			listed = strlen(bad_files[k].s) == l - 8 &&
				 strncmp(bad_files[k].s, e->d_name, l - 8) == 0;
		cr_expect(listed, "%s is not in bad_files[] of test_interp.c",
			  e->d_name);
		found++;
	}
	closedir(d);
	cr_expect_eq(found, N_BAD_FILES);
}

/* Input tensors that do not match the declared spec (rank, dtype, symint). */
static kiln_graph_t *load_bad_graph(const char *name)
{
	char path[1024], err[512];
	uint8_t *buf;
	size_t len;
	msgpack_zone zone;
	msgpack_object obj;
	kiln_limits_t lim;
	kiln_graph_t *g;
	kiln_limits_default(&lim);
	data_path(path, sizeof(path), "bad", name, ".msgpack");
	cr_assert_eq(kiln_td_read_file(path, &buf, &len), 0, "%s", path);
	cr_assert(msgpack_zone_init(&zone, 4096));
	cr_assert_eq(kiln_msgpack_unpack_map(buf, len, &lim, &zone, &obj, err,
					     sizeof(err)),
		     0);
	cr_assert_eq(kiln_graph_from_object(kiln_map_get(&obj, "graph"), &lim,
					    &g, err, sizeof(err)),
		     0, "%s", err);
	msgpack_zone_destroy(&zone);
	free(buf);
	return g;
}

Test(interp, input_rank_and_dtype)
{
	/* input_shape.msgpack: f32[2,3] -> relu */
	kiln_graph_t *g = load_bad_graph("input_shape");
	float data[6] = {0};
	kiln_tensor_t in = {.data = data,
			    .dtype = KILN_DT_F32,
			    .rank = 1,
			    .sizes = {6},
			    .strides = {1}};
	kiln_tensor_t out[1];
	char err[512];
	int rc = kiln_interp_run(g, &in, out, err, sizeof(err));
	cr_expect_eq(rc, KILN_EINVGRAPH);
	cr_expect(
	    strstr(err,
		   "input 0: got f32 rank 1, the graph declares f32 rank 2"),
	    "%s", err);
	kiln_tensor_t in2 = {.data = data,
			     .dtype = KILN_DT_I32,
			     .rank = 2,
			     .sizes = {2, 3},
			     .strides = {3, 1}};
	rc = kiln_interp_run(g, &in2, out, err, sizeof(err));
	cr_expect_eq(rc, KILN_EINVGRAPH);
	cr_expect(strstr(err, "input 0: got i32") != NULL, "%s", err);
	/* the right input, strided: accepted */
	kiln_tensor_t in3 = {.data = data,
			     .dtype = KILN_DT_F32,
			     .rank = 2,
			     .sizes = {2, 3},
			     .strides = {1, 2}};
	rc = kiln_interp_run(g, &in3, out, err, sizeof(err));
	cr_expect_eq(rc, 0, "%s", err);
	cr_expect_eq(out[0].dtype, KILN_DT_F64);
	cr_expect_eq(out[0].rank, 2);
	free(out[0].data);
	kiln_graph_free(g);
}

Test(interp, symint_input)
{
	/* transformer_dyn_fwd: input 0 is the symint s50, bound to input 1's
	 * dim 1 too */
	char path[1024], err[512];
	kiln_graph_t *g;
	kiln_td_io_t io;
	data_path(path, sizeof(path), "graphs", "transformer_dyn_fwd",
		  ".graph.msgpack");
	cr_assert_eq(kiln_td_graph_load(path, &g, err, sizeof(err)), 0, "%s",
		     err);
	data_path(path, sizeof(path), "graphs", "transformer_dyn_fwd",
		  ".io.msgpack");
	cr_assert_eq(kiln_td_io_load(path, &io, err, sizeof(err)), 0, "%s",
		     err);
	kiln_tensor_t *in = calloc(g->n_inputs, sizeof(*in));
	kiln_tensor_t *out = calloc(g->n_outputs, sizeof(*out));
	cr_assert_eq(kiln_td_make_inputs(g, &io, in, err, sizeof(err)), 0);
	int64_t *sv = in[0].data;
	(*sv)++; /* the int no longer matches the tensor's dim */
	int rc = kiln_interp_run(g, in, out, err, sizeof(err));
	cr_expect_eq(rc, KILN_EINVGRAPH);
	cr_expect(strstr(err, "symbol s50") != NULL, "%s", err);
	(*sv)--;
	in[0].dtype = KILN_DT_F32; /* a symint must be an integer tensor */
	rc = kiln_interp_run(g, in, out, err, sizeof(err));
	cr_expect_eq(rc, KILN_EINVGRAPH);
	cr_expect(strstr(err, "input 0: a symint input must be") != NULL, "%s",
		  err);
	in[0].dtype = KILN_DT_I64;
	rc = kiln_interp_run(g, in, out, err, sizeof(err));
	cr_expect_eq(rc, 0, "%s", err);
	free_outputs(out, g->n_outputs);
	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
	kiln_td_io_free(&io);
	kiln_graph_free(g);
}

/* ---- testdata.c itself --------------------------------------------------- */

Test(testdata, conversions)
{
	cr_expect_eq(kiln_td_f16_from_f64(1.0), 0x3c00);
	cr_expect_eq(kiln_td_f16_from_f64(-2.0), 0xc000);
	cr_expect_eq(kiln_td_f16_from_f64(65504.0), 0x7bff);
	cr_expect_eq(kiln_td_f16_from_f64(65520.0), 0x7c00); /* rounds to inf */
	cr_expect_eq(kiln_td_f16_from_f64(65519.99), 0x7bff);
	cr_expect_eq(kiln_td_f16_from_f64(0x1p-24), 0x0001); /* subnormal */
	cr_expect_eq(kiln_td_f16_from_f64(0x1p-25), 0x0000); /* tie to even */
	cr_expect_eq(kiln_td_f16_from_f64(0x1.8p-25), 0x0001);
	cr_expect_eq(kiln_td_f16_from_f64(1.0 + 0x1p-11),
		     0x3c00); /* tie: even */
	cr_expect_eq(kiln_td_f16_from_f64(1.0 + 0x3p-11), 0x3c02);
	cr_expect_eq(kiln_td_f16_from_f64(1e-30), 0);
	cr_expect_eq(kiln_td_f16_from_f64(1e30), 0x7c00);
	cr_expect_eq(kiln_td_f16_from_f64(NAN) & 0x7e00, 0x7e00);
	cr_expect_eq(kiln_td_f16_to_f64(0x3555), 0x1.554p-2);
	cr_expect_eq(kiln_td_f16_to_f64(0x0001), 0x1p-24);
	cr_expect(isinf(kiln_td_f16_to_f64(0xfc00)));
	cr_expect_eq(kiln_td_bf16_from_f64(1.0), 0x3f80);
	cr_expect_eq(kiln_td_bf16_from_f64(1.0 + 0x1p-8), 0x3f80); /* tie */
	cr_expect_eq(kiln_td_bf16_from_f64(1.0 + 0x3p-8), 0x3f82);
	cr_expect_eq(kiln_td_bf16_from_f64(-3.0e38), 0xff62);
	cr_expect_eq(kiln_td_bf16_from_f64(1e39), 0x7f80);
	cr_expect_eq(kiln_td_bf16_to_f64(0x4049), 3.140625);
	for (int i = -200; i <= 200; i++) {
		double x = i * 0.37;
		cr_expect_eq(kiln_td_f16_to_f64(kiln_td_f16_from_f64(
				 kiln_td_f16_to_f64(kiln_td_f16_from_f64(x)))),
			     kiln_td_f16_to_f64(kiln_td_f16_from_f64(x)));
	}
}

Test(testdata, prng)
{
	/* values from clients/python/kiln/testrng.py (the Python spec) */
	cr_expect_eq(kiln_td_prng_raw(7, 0), UINT64_C(0x63cbe1e459320dd7));
	cr_expect_eq(kiln_td_prng_raw(7, 5), UINT64_C(0x3fdabe86cbbeaa11));
	cr_expect_eq(kiln_td_prng_uniform(42, 3, -1, 1), -0.3116186857223511);
	static const int64_t ri[5] = {-1, -1, 3, -3, 2};
	for (int i = 0; i < 5; i++)
		cr_expect_eq(kiln_td_prng_randint(9, (uint64_t)i, -3, 4),
			     ri[i]);
	cr_expect_eq(kiln_td_bf16_from_f64(kiln_td_prng_uniform(11, 2, -1, 1)),
		     0x3e8d);
	cr_expect_eq(kiln_td_f16_from_f64(kiln_td_prng_uniform(11, 2, -1, 1)),
		     0x346b);
}

Test(testdata, compare)
{
	double a[4] = {1, 2, 3, NAN}, b[4] = {1, 2.00001, 3.5, NAN};
	kiln_tensor_t ta = {.data = a,
			    .dtype = KILN_DT_F64,
			    .rank = 1,
			    .sizes = {4},
			    .strides = {1}};
	kiln_tensor_t tb = ta;
	tb.data = b;
	kiln_td_cmp_t r;
	cr_expect(!kiln_td_compare(&ta, &tb, 1e-5, 1e-6, &r));
	cr_expect_eq(r.n_bad, 1);
	cr_expect_eq(r.worst, 2);
	cr_expect_eq(r.want, 3.5);
	cr_expect(strstr(r.msg, "worst at [2]") != NULL, "%s", r.msg);
	cr_expect(kiln_td_compare(&ta, &tb, 0.2, 0, &r), "%s", r.msg);
	tb.sizes[0] = 3;
	cr_expect(!kiln_td_compare(&ta, &tb, 1, 1, &r));
	cr_expect(strstr(r.msg, "shape [4], expected [3]") != NULL, "%s",
		  r.msg);
}
