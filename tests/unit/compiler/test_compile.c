/*
 * test_compile.c — the compiler end to end: every per-op case and every
 * corpus graph is compiled, loaded with the runtime, run (fallback steps in
 * the reference interpreter) and compared with torch's outputs and with the
 * interpreter's; fusion decisions (kernel counts); dynamic shapes (one
 * artifact, several sizes); two threads compiling at once; and the
 * rejection of semantically invalid graphs.
 *
 * Tolerances: those of tests/common/testdata.h (f32: rtol 1e-5, atol 1e-6),
 * loosened to an io file's own "rtol"/"atol" where it carries them. The
 * transcendental approximations (compiler/mathfn.c) stay inside them.
 */
#include "clients/libkiln/kiln.h"
#include "compiler/compiler.h"
#include "compiler/cpu.h"
#include "compiler/internal_tune.h"
#include "tests/common/testdata.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef KILN_TEST_DATA_DIR
#error "KILN_TEST_DATA_DIR must be defined"
#endif

static kiln_compiler_t *new_compiler(void)
{
	char err[512];
	kiln_compiler_t *kc = NULL;
	int rc = kiln_compiler_new(NULL, &kc, err, sizeof(err));
	cr_assert_eq(rc, 0, "kiln_compiler_new: %s", err);
	return kc;
}

static kiln_graph_t *graph_from_json_like(const char *what, msgpack_sbuffer *sb)
{
	kiln_graph_t *g = NULL;
	char err[512];
	int rc = kiln_graph_decode((const uint8_t *)sb->data, sb->size, NULL,
				   &g, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", what, err);
	return g;
}

/* Ops whose outputs are undefined memory in torch. */
static bool undefined_values(const kiln_graph_t *g)
{
	for (uint32_t i = 0; i < g->n_nodes; i++)
		if (strstr(g->nodes[i].op, "empty") != NULL)
			return true;
	return false;
}

typedef struct runres {
	bool ok;
	char msg[1200];
	uint32_t kernels, fallbacks;
} runres_t;

/* Compiles g, runs it on io's inputs, compares with io's outputs (torch)
 * and with the interpreter. */
static void check(kiln_compiler_t *kc, const kiln_graph_t *g, kiln_td_io_t *io,
		  runres_t *r)
{
	char err[1024] = "";
	memset(r, 0, sizeof(*r));
	r->ok = true;
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	strcpy(opts.mode, "default");
	kiln_artifact_t *a = NULL;
	kiln_compile_stats_t st;
	int rc = kiln_compile(kc, g, &opts, &a, &st, err, sizeof(err));
	if (rc != 0) {
		r->ok = false;
		snprintf(r->msg, sizeof(r->msg), "compile: %s: %s",
			 kiln_err_wire_name(rc), err);
		return;
	}
	r->kernels = st.n_kernels;
	r->fallbacks = st.n_fallbacks;
	kiln_tensor_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	kiln_tensor_t *ref = calloc(g->n_outputs + 1, sizeof(*ref));
	kiln_io_t *args = calloc(g->n_inputs + 1, sizeof(*args));
	kiln_module_t *m = NULL;
	void **bufs = NULL;
	kiln_io_t *outs = NULL;
	bool have_ref = false;
	rc = kiln_td_make_inputs(g, io, in, err, sizeof(err));
	if (rc != 0) {
		kiln_artifact_free(a);
		r->ok = false;
		snprintf(r->msg, sizeof(r->msg), "inputs: %s", err);
		goto out;
	}
	rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	if (rc != 0) {
		r->ok = false;
		snprintf(r->msg, sizeof(r->msg), "load: %s", err);
		goto out;
	}
	for (uint32_t i = 0; i < g->n_inputs; i++) {
		if (g->values[i].kind == KILN_VAL_SYMINT) {
			args[i].kind = KILN_IO_INT;
			args[i].i = *(const int64_t *)in[i].data;
		} else {
			args[i].kind = KILN_IO_TENSOR;
			args[i].t = in[i];
		}
	}
	bufs = calloc(kiln_module_n_out_buffers(m) + 1, sizeof(void *));
	outs = calloc(kiln_module_n_outputs(m) + 1, sizeof(*outs));
	kiln_run_opts_t ro = {.fallback = kiln_interp_fallback};
	rc = kiln_module_run(m, args, g->n_inputs, bufs, outs, &ro, err,
			     sizeof(err));
	if (rc != 0) {
		r->ok = false;
		snprintf(r->msg, sizeof(r->msg), "run: %s", err);
		goto out;
	}
	have_ref = kiln_interp_run(g, in, ref, err, sizeof(err)) == 0;
	bool undef = undefined_values(g);
	for (uint32_t k = 0; k < g->n_outputs && k < io->n_outputs && !undef;
	     k++) {
		kiln_td_value_t *w = &io->outputs[k];
		if (w->is_int) {
			if (outs[k].kind != KILN_IO_INT ||
			    outs[k].i != w->ival) {
				r->ok = false;
				snprintf(r->msg, sizeof(r->msg),
					 "output %u: int %lld, want %lld", k,
					 (long long)outs[k].i,
					 (long long)w->ival);
			}
			continue;
		}
		double rtol, atol;
		kiln_td_tolerance(w->t.dtype, &rtol, &atol);
		if (io->rtol > rtol)
			rtol = io->rtol;
		if (io->atol > atol)
			atol = io->atol;
		kiln_td_cmp_t cr;
		if (!kiln_td_compare(&outs[k].t, &w->t, rtol, atol, &cr)) {
			r->ok = false;
			snprintf(r->msg, sizeof(r->msg),
				 "output %u vs torch: %s", k, cr.msg);
			continue;
		}
		if (have_ref &&
		    !kiln_td_compare(&outs[k].t, &ref[k], rtol, atol, &cr)) {
			r->ok = false;
			snprintf(r->msg, sizeof(r->msg),
				 "output %u vs interpreter: %s", k, cr.msg);
		}
	}
out:
	if (bufs != NULL)
		for (uint32_t i = 0;
		     m != NULL && i < kiln_module_n_out_buffers(m); i++)
			free(bufs[i]);
	free(bufs);
	free(outs);
	if (have_ref)
		for (uint32_t k = 0; k < g->n_outputs; k++)
			free(ref[k].data);
	free(ref);
	free(args);
	kiln_module_free(m);
	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
}

static int list_dir(const char *dir, const char *suffix, char ***out)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "cannot open %s", dir);
	int n = 0, cap = 64;
	char **names = malloc(sizeof(char *) * (size_t)cap);
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t l = strlen(e->d_name), sl = strlen(suffix);
		if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0)
			continue;
		if (n == cap) {
			cap *= 2;
			names = realloc(names, sizeof(char *) * (size_t)cap);
		}
		names[n++] = strdup(e->d_name);
	}
	closedir(d);
	*out = names;
	return n;
}

/* ---- every per-op case --------------------------------------------------- */

/* Every op case matches torch's outputs and the interpreter's, with no
 * fallback step but in these (what kiln leaves to torch on purpose): a
 * fallback step in any other is an op whose lowering declined, or a
 * regression. */
Test(compile, op_cases, .timeout = 900)
{
	static const char *const allowed[] = {
	    "mm/i64",			  /* no BLAS routine for integers */
	    "new_empty/strided_cols",	  /* strides that are not row-major */
	    "as_strided_scatter/strided", /* a view of self that is strided */
	    "as_strided_scatter/t_self",
	    "native_dropout/eval", /* the torch backend rewrites dropout */
	    "native_dropout/p0",
	    "native_dropout/p1",
	    "scatter_reduce/mean_i64", /* integer scatter_reduce */
	    "threshold/i64",	       /* integer threshold */
	    /* a transposed 3-d convolution whose output_padding is its
	     * stride (below the dilation) */
	    "convolution/transposed_3d_op_dil",
	    "convolution_backward/transposed_3d_op_dil",
	};
	kiln_compiler_t *kc = new_compiler();
	char **files;
	int nf = list_dir(KILN_TEST_DATA_DIR "/ops", ".cases.msgpack", &files);
	cr_assert_gt(nf, 50, "too few op case files");
	int failed = 0, total = 0;
	for (int f = 0; f < nf; f++) {
		char path[1024], err[1024];
		snprintf(path, sizeof(path), "%s/ops/%s", KILN_TEST_DATA_DIR,
			 files[f]);
		kiln_td_cases_t cs;
		int rc = kiln_td_cases_load(path, &cs, err, sizeof(err));
		cr_expect_eq(rc, 0, "%s: %s", path, err);
		for (uint32_t i = 0; rc == 0 && i < cs.n; i++) {
			runres_t r;
			check(kc, cs.cases[i].graph, &cs.cases[i].io, &r);
			total++;
			if (!r.ok) {
				failed++;
				cr_log_error("%s / %s: %s", files[f],
					     cs.cases[i].name, r.msg);
			}
			char name[256];
			snprintf(
			    name, sizeof(name), "%.*s/%s",
			    (int)(strlen(files[f]) - strlen(".cases.msgpack")),
			    files[f], cs.cases[i].name);
			bool fb_ok = false;
			for (size_t a = 0;
			     a < sizeof(allowed) / sizeof(allowed[0]); a++)
				fb_ok = fb_ok || strcmp(allowed[a], name) == 0;
			if (r.ok && r.fallbacks > 0 && !fb_ok) {
				failed++;
				cr_log_error("%s: %u fallback steps", name,
					     r.fallbacks);
			}
		}
		if (rc == 0)
			kiln_td_cases_free(&cs);
		free(files[f]);
	}
	free(files);
	kiln_compiler_free(kc);
	cr_expect_eq(failed, 0, "%d of %d op cases failed", failed, total);
}

/* ---- the corpus ---------------------------------------------------------- */

Test(compile, corpus, .timeout = 900)
{
	kiln_compiler_t *kc = new_compiler();
	char **files;
	int nf =
	    list_dir(KILN_TEST_DATA_DIR "/graphs", ".graph.msgpack", &files);
	cr_assert_geq(nf, 12, "the corpus has %d graphs", nf);
	for (int f = 0; f < nf; f++) {
		char gpath[1024], iopath[1024], err[1024];
		snprintf(gpath, sizeof(gpath), "%s/graphs/%s",
			 KILN_TEST_DATA_DIR, files[f]);
		snprintf(iopath, sizeof(iopath), "%s", gpath);
		strcpy(strstr(iopath, ".graph.msgpack"), ".io.msgpack");
		kiln_graph_t *g = NULL;
		int rc = kiln_td_graph_load(gpath, &g, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s: %s", gpath, err);
		kiln_td_io_t io;
		memset(&io, 0, sizeof(io));
		rc = kiln_td_io_load(iopath, &io, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s: %s", iopath, err);
		runres_t r;
		check(kc, g, &io, &r);
		cr_expect(r.ok, "%s: %s", files[f], r.msg);
		bool all_supported = true;
		for (uint32_t i = 0; i < g->n_nodes; i++)
			all_supported = all_supported &&
					kiln_compiler_supports(g->nodes[i].op);
		if (all_supported)
			cr_expect_eq(r.fallbacks, 0,
				     "%s uses only lowered ops but has %u "
				     "fallback steps",
				     files[f], r.fallbacks);
		kiln_td_io_free(&io);
		kiln_graph_free(g);
		free(files[f]);
	}
	free(files);
	kiln_compiler_free(kc);
}

/* ---- hand-built graphs --------------------------------------------------- */

typedef struct gb {
	msgpack_sbuffer sb;
	msgpack_packer pk;
} gb_t;

static void gb_init(gb_t *b)
{
	msgpack_sbuffer_init(&b->sb);
	msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void s(gb_t *b, const char *str)
{
	kiln_pack_cstr(&b->pk, str);
}

/* A tensor spec {dtype, shape} of rank dims d. */
static void specn(gb_t *b, const char *dt, const int64_t *d, uint32_t rank)
{
	msgpack_pack_map(&b->pk, 2);
	s(b, "dtype");
	s(b, dt);
	s(b, "shape");
	msgpack_pack_array(&b->pk, rank);
	for (uint32_t i = 0; i < rank; i++)
		msgpack_pack_int64(&b->pk, d[i]);
}

static void spec2(gb_t *b, const char *dt, int64_t d0, int64_t d1)
{
	const int64_t d[2] = {d0, d1};
	specn(b, dt, d, 2);
}

/* A graph's head: its format, then the key of its n_inputs input specs
 * (written next by the caller). */
static void graph_head(gb_t *b, uint32_t n_inputs)
{
	msgpack_pack_map(&b->pk, 4);
	s(b, "format");
	s(b, "kiln.graph/1");
	s(b, "inputs");
	msgpack_pack_array(&b->pk, n_inputs);
}

static void ref(gb_t *b, uint32_t v)
{
	msgpack_pack_map(&b->pk, 1);
	s(b, "ref");
	msgpack_pack_uint32(&b->pk, v);
}

/* A node's "op" and the head of its "args" (the caller packs n args, then
 * "out"). */
static void node_head(gb_t *b, const char *op, uint32_t nargs)
{
	msgpack_pack_map(&b->pk, 3);
	s(b, "op");
	s(b, op);
	s(b, "args");
	msgpack_pack_array(&b->pk, nargs);
}

static void expect_matches_interp(kiln_compiler_t *kc, const kiln_graph_t *g,
				  const char *mode, uint64_t seed, double tol,
				  const char *what);

/* The text a compile emits as `kind` (the caller frees it); st, when not
 * NULL, gets its stats. */
static char *emit_text(kiln_compiler_t *kc, const kiln_graph_t *g, int kind,
		       kiln_compile_stats_t *st)
{
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	char *text = NULL;
	int rc = kiln_compile_ex(kc, g, &opts, NULL, &text, kind, st, err,
				 sizeof(err));
	cr_assert_eq(rc, 0, "compile: %s", err);
	return text;
}

/* The kernel count of a graph's fusion report. */
static uint32_t n_kernels(kiln_compiler_t *kc, const kiln_graph_t *g,
			  char **report)
{
	kiln_compile_stats_t st;
	char *text = emit_text(kc, g, KILN_EMIT_KERNELS, &st);
	if (report)
		*report = text;
	else
		free(text);
	return st.n_kernels + st.n_fallbacks;
}

/* Bodies a compile to an artifact did not emit, sharing an earlier one's
 * (kiln_compile_stats_t.n_shared), and the bodies it compiled in all. */
static uint32_t n_shared(kiln_compiler_t *kc, const kiln_graph_t *g,
			 uint32_t *n_bodies)
{
	char err[512];
	kiln_compile_stats_t st;
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	cr_assert_eq(kiln_compile(kc, g, &opts, &a, &st, err, sizeof(err)), 0,
		     "compile: %s", err);
	kiln_artifact_free(a);
	*n_bodies = st.n_kernels + st.n_epilogues;
	return st.n_shared;
}

/* Repeated layers: a body whose IR equals one generated before is not
 * emitted again; its wrapper calls the first (in another module: four
 * compile threads put the kernels in eight modules). gpt2_fwd and bert_fwd
 * (two layers each) share a quarter of their bodies or more, none with
 * KILN_SHARE_BODIES=0, and match torch's outputs either way. */
Test(codegen, repeated_layers_share_bodies, .timeout = 300)
{
	static const char *const names[] = {"gpt2_fwd", "bert_fwd"};
	setenv("KILN_COMPILE_THREADS", "4", 1);
	for (int share = 1; share >= 0; share--) {
		/* read when the compiler is made */
		setenv("KILN_SHARE_BODIES", share ? "1" : "0", 1);
		kiln_compiler_t *kc = new_compiler();
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			char gpath[1024], iopath[1024], err[1024];
			snprintf(gpath, sizeof(gpath),
				 "%s/graphs/%s.graph.msgpack",
				 KILN_TEST_DATA_DIR, names[i]);
			snprintf(iopath, sizeof(iopath),
				 "%s/graphs/%s.io.msgpack", KILN_TEST_DATA_DIR,
				 names[i]);
			kiln_graph_t *g = NULL;
			cr_assert_eq(
			    kiln_td_graph_load(gpath, &g, err, sizeof(err)), 0,
			    "%s: %s", gpath, err);
			kiln_td_io_t io;
			memset(&io, 0, sizeof(io));
			cr_assert_eq(
			    kiln_td_io_load(iopath, &io, err, sizeof(err)), 0,
			    "%s: %s", iopath, err);
			uint32_t all, shared = n_shared(kc, g, &all);
			if (share)
				cr_expect_geq(shared, all / 4,
					      "%s: %u of %u bodies shared",
					      names[i], shared, all);
			else
				cr_expect_eq(shared, 0,
					     "%s: %u bodies shared with "
					     "KILN_SHARE_BODIES=0",
					     names[i], shared);
			runres_t r;
			check(kc, g, &io, &r);
			cr_expect(r.ok, "%s (share %d): %s", names[i], share,
				  r.msg);
			kiln_td_io_free(&io);
			kiln_graph_free(g);
		}
		kiln_compiler_free(kc);
	}
}

/* op (_softmax or _log_softmax) over dim of an f32 input of sizes d. */
static void row_op_nd_graph(gb_t *b, const char *op, const int64_t *d,
			    uint32_t rank, int64_t dim)
{
	gb_init(b);
	graph_head(b, 1);
	specn(b, "f32", d, rank);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 1);
	node_head(b, op, 3);
	ref(b, 0);
	msgpack_pack_int64(&b->pk, dim);
	msgpack_pack_false(&b->pk);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	specn(b, "f32", d, rank);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, 1);
}

/* op (_softmax or _log_softmax) over dim of an f32 [r, c] input. */
static void row_op_dim_graph(gb_t *b, const char *op, int64_t r, int64_t c,
			     int64_t dim)
{
	const int64_t d[2] = {r, c};
	row_op_nd_graph(b, op, d, 2, dim);
}

/* softmax over dim of an f32 [r, c] input: the graph of several tests. */
static void softmax_graph(gb_t *b, int64_t r, int64_t c, int64_t dim)
{
	row_op_dim_graph(b, "aten._softmax.default", r, c, dim);
}

/* op over the last dim of an f32 [r, c] input. */
static void row_op_graph(gb_t *b, const char *op, int64_t r, int64_t c)
{
	row_op_dim_graph(b, op, r, c, 1);
}

/* layer_norm(layer_norm(x) @ w) over rows of 64, with the same eps and
 * with another: the two row kernels are the same but for the constant, so
 * the body is shared exactly when the eps are equal (body_key keys
 * constants by their printed value). Against the interpreter both ways. */
static void ln_mm_ln(gb_t *b, double eps1, double eps2)
{
	gb_init(b);
	graph_head(b, 2);
	spec2(b, "f32", 8, 64);
	spec2(b, "f32", 64, 64);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 3);
	for (int i = 0; i < 3; i++) {
		if (i == 1) {
			node_head(b, "aten.mm.default", 2);
			ref(b, 2);
			ref(b, 1);
			s(b, "out");
			msgpack_pack_array(&b->pk, 1);
			spec2(b, "f32", 8, 64);
			continue;
		}
		node_head(b, "aten.native_layer_norm.default", 5);
		ref(b, i == 0 ? 0 : 5);
		msgpack_pack_array(&b->pk, 1);
		msgpack_pack_int64(&b->pk, 64);
		msgpack_pack_nil(&b->pk);
		msgpack_pack_nil(&b->pk);
		msgpack_pack_double(&b->pk, i == 0 ? eps1 : eps2);
		s(b, "out");
		msgpack_pack_array(&b->pk, 3);
		spec2(b, "f32", 8, 64);
		spec2(b, "f32", 8, 1);
		spec2(b, "f32", 8, 1);
	}
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, 6);
}

Test(codegen, bodies_differing_in_a_constant_are_not_shared)
{
	setenv("KILN_SHARE_BODIES", "1", 1);
	kiln_compiler_t *kc = new_compiler();
	const double eps2[] = {1e-5, 0.25};
	for (int i = 0; i < 2; i++) {
		gb_t b;
		ln_mm_ln(&b, 1e-5, eps2[i]);
		kiln_graph_t *g = graph_from_json_like("ln mm ln", &b.sb);
		uint32_t all, shared = n_shared(kc, g, &all);
		cr_expect_eq(shared, i == 0 ? 1u : 0u,
			     "eps 1e-5 and %g: %u of %u bodies shared", eps2[i],
			     shared, all);
		expect_matches_interp(kc, g, "default", 11, 1e-5,
				      i == 0 ? "ln mm ln, same eps"
					     : "ln mm ln, eps 0.25");
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
	unsetenv("KILN_SHARE_BODIES");
}

Test(fusion, softmax_is_one_kernel)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	softmax_graph(&b, 64, 1000, -1);
	kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
	char *rep;
	uint32_t n = n_kernels(kc, g, &rep);
	cr_expect_eq(n, 1, "softmax: %u kernels:\n%s", n, rep);
	cr_expect(strstr(rep, "3 passes") != NULL, "%s", rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* g is one row kernel whose one row scratch lives in an output's row, and
 * every output is the interpreter's; g is freed. */
static void expect_one_row_out(kiln_compiler_t *kc, kiln_graph_t *g,
			       const char *what, uint64_t seed)
{
	char *rep;
	uint32_t n = n_kernels(kc, g, &rep);
	cr_expect_eq(n, 1, "%s: %u kernels:\n%s", what, n, rep);
	const char *at = strstr(rep, "(row scratch in buf");
	cr_expect(at != NULL, "%s: %s", what, rep);
	if (at != NULL)
		cr_expect(strstr(at + 1, "(row scratch") == NULL, "%s: %s",
			  what, rep);
	free(rep);
	expect_matches_interp(kc, g, "default", seed, 1e-5, what);
	kiln_graph_free(g);
}

/* softmax's exp(x - max), read by the last pass only, is kept in the
 * output's row instead of a stack scratch (sched.c row_in_output), and the
 * results are the interpreter's, over row lengths that leave partial
 * vectors and a scalar rest. */
Test(fusion, softmax_exp_lives_in_its_output_row)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t cols[] = {1000, 1024, 37, 3};
	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
		gb_t b;
		softmax_graph(&b, 6, cols[i], -1);
		char what[64];
		snprintf(what, sizeof(what), "softmax [6, %lld]",
			 (long long)cols[i]);
		expect_one_row_out(kc, graph_from_json_like(what, &b.sb), what,
				   (uint64_t)cols[i]);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* e = exp(x - amax(x)), s = sum(e); outputs e / s and e + s, both written
 * in the last pass and both reading e: e lives in one output's row (the
 * one written last: no member after it reads e), not in both, and both
 * outputs are the interpreter's. */
Test(fusion, two_outputs_reading_one_row_scratch)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t cols[] = {1000, 37};
	for (size_t t = 0; t < sizeof(cols) / sizeof(cols[0]); t++) {
		int64_t C = cols[t];
		gb_t b;
		gb_init(&b);
		graph_head(&b, 1);
		spec2(&b, "f32", 5, C);
		s(&b, "nodes");
		msgpack_pack_array(&b.pk, 6);
		for (int red = 0; red < 2; red++) {
			node_head(&b,
				  red ? "aten.sum.dim_IntList"
				      : "aten.amax.default",
				  3);
			ref(&b, red ? 3 : 0);
			msgpack_pack_array(&b.pk, 1);
			msgpack_pack_int64(&b.pk, 1);
			msgpack_pack_true(&b.pk);
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			spec2(&b, "f32", 5, 1);
			if (red)
				break;
			node_head(&b, "aten.sub.Tensor", 2);
			ref(&b, 0);
			ref(&b, 1);
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			spec2(&b, "f32", 5, C);
			node_head(&b, "aten.exp.default", 1);
			ref(&b, 2);
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			spec2(&b, "f32", 5, C);
		}
		const char *ops[] = {"aten.div.Tensor", "aten.add.Tensor"};
		for (int i = 0; i < 2; i++) {
			node_head(&b, ops[i], 2);
			ref(&b, 3);
			ref(&b, 4);
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			spec2(&b, "f32", 5, C);
		}
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 2);
		ref(&b, 5);
		ref(&b, 6);
		char what[64];
		snprintf(what, sizeof(what), "e/s and e+s [5, %lld]",
			 (long long)C);
		expect_one_row_out(kc, graph_from_json_like(what, &b.sb), what,
				   (uint64_t)C);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* softmax over dim 0 of [9, C]: a row kernel vectorized across the columns
 * (outer-vectorized), whose last block of C % 16 columns runs 8, then 4
 * columns at once where that many are left, the rest one at a time (on
 * AVX2, 4 then scalar). Every C from 1 to 37 against the interpreter. */
Test(codegen, outer_vectorized_rows_partial_blocks)
{
	kiln_compiler_t *kc = new_compiler();
	for (int64_t C = 1; C <= 37; C++) {
		gb_t b;
		softmax_graph(&b, 9, C, 0);
		kiln_graph_t *g = graph_from_json_like("softmax dim 0", &b.sb);
		char what[64];
		snprintf(what, sizeof(what), "softmax dim 0 of [9, %lld]",
			 (long long)C);
		expect_matches_interp(kc, g, "default", (uint64_t)C, 1e-5,
				      what);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* Expects the kernels report of g to hold needle (present) or not. */
static void expect_report_has(kiln_compiler_t *kc, const kiln_graph_t *g,
			      const char *needle, bool present,
			      const char *what)
{
	char *rep = NULL;
	n_kernels(kc, g, &rep);
	cr_assert(rep != NULL, "%s: no report", what);
	cr_expect_eq(strstr(rep, needle) != NULL, present, "%s:\n%s", what,
		     rep);
	free(rep);
}

/* Packs "outputs" (refs first .. first + n - 1), decodes the graph and
 * frees the buffer. */
static kiln_graph_t *end_graph(gb_t *b, uint32_t first, uint32_t n,
			       const char *what)
{
	s(b, "outputs");
	msgpack_pack_array(&b->pk, n);
	for (uint32_t i = 0; i < n; i++)
		ref(b, first + i);
	kiln_graph_t *g = graph_from_json_like(what, &b->sb);
	msgpack_sbuffer_destroy(&b->sb);
	return g;
}

/* sum, amax, argmax and var (two passes) over dim `d` of an f32 input of
 * rank 2 ([R, C], d = 0) or 3 ([4, R, C], d = 1): row kernels vectorized
 * across the columns. */
static kiln_graph_t *column_reductions_graph(int64_t R, int64_t C, int rank)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	const int64_t in3[3] = {4, R, C}, in2[2] = {R, C};
	const int64_t o3[2] = {4, C}, o2[1] = {C};
	int64_t d = rank - 2;
	specn(&b, "f32", rank == 3 ? in3 : in2, (uint32_t)rank);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 4);
	const char *ops[4] = {"aten.sum.dim_IntList", "aten.amax.default",
			      "aten.argmax.default", "aten.var.correction"};
	for (int i = 0; i < 4; i++) {
		node_head(&b, ops[i], 2);
		ref(&b, 0);
		if (i == 2) {
			msgpack_pack_int64(&b.pk, d);
		} else {
			msgpack_pack_array(&b.pk, 1);
			msgpack_pack_int64(&b.pk, d);
		}
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, i == 2 ? "i64" : "f32", rank == 3 ? o3 : o2,
		      (uint32_t)rank - 1);
	}
	return end_graph(&b, 1, 4, "column reductions");
}

/* A unit of a reduction over the rows reduces several blocks of columns
 * side by side (codegen.c cg_outer_blocks; one block a unit walked the
 * rows a cache line at a time), where the columns make enough units and
 * at least one whole block (the cases hold at 8 and 16 lanes); the report
 * says so. The last unit's whole
 * blocks of W, its partial block and its single columns, the two passes
 * of var and argmax's index lanes against the interpreter. */
Test(codegen, outer_blocks_reduce_columns_side_by_side)
{
	kiln_compiler_t *kc = new_compiler();
	const struct {
		int64_t R, C;
		int rank;
		bool blocks;
	} cs[] = {{40, 1024, 2, true}, {40, 1000, 2, true}, {33, 1100, 2, true},
		  {40, 200, 2, false}, {17, 200, 3, true},  {17, 37, 3, false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    column_reductions_graph(cs[i].R, cs[i].C, cs[i].rank);
		char what[80];
		snprintf(what, sizeof(what),
			 "column reductions of [%s%lld, %lld]",
			 cs[i].rank == 3 ? "4, " : "", (long long)cs[i].R,
			 (long long)cs[i].C);
		expect_report_has(kc, g, "blocks of", cs[i].blocks, what);
		expect_matches_interp(kc, g, "default", 77 + i, 1e-5, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A product with one block of rows and many columns is split into column
 * blocks (so every thread of the pool gets a share), and the report says
 * so; one with many row blocks is not. Values: the mm op cases (cols_t,
 * wide_epilogue). */
/* y = a[m, k] @ b[k, n], f32 */
static kiln_graph_t *mm_graph(int64_t m, int64_t k, int64_t n)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 2);
	spec2(&b, "f32", m, k);
	spec2(&b, "f32", k, n);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.mm.default", 2);
	ref(&b, 0);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "f32", m, n);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 2);
	kiln_graph_t *g = graph_from_json_like("mm", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

static char *mm_report(kiln_compiler_t *kc, int64_t m, int64_t k, int64_t n)
{
	kiln_graph_t *g = mm_graph(m, k, n);
	char *rep;
	uint32_t nk = n_kernels(kc, g, &rep);
	cr_expect_eq(nk, 1, "mm: %u kernels:\n%s", nk, rep);
	kiln_graph_free(g);
	return rep;
}

/* mm -> + bias -> gelu: the pointwise kernel becomes the product's
 * epilogue (no plan step of its own); when the product is also a graph
 * output it stays in memory and the epilogue a kernel of its own. Values:
 * the mm/addmm/bmm *_epilogue op cases. */
static char *epi_report(kiln_compiler_t *kc, bool product_out, uint32_t *nk)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 2);
	spec2(&b, "f32", 200, 32);
	spec2(&b, "f32", 32, 96);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	node_head(&b, "aten.mm.default", 2);
	ref(&b, 0);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "f32", 200, 96);
	node_head(&b, "aten.gelu.default", 1);
	ref(&b, 2);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "f32", 200, 96);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, product_out ? 2 : 1);
	ref(&b, 3);
	if (product_out)
		ref(&b, 2);
	kiln_graph_t *g = graph_from_json_like("mm gelu", &b.sb);
	char *rep;
	*nk = n_kernels(kc, g, &rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	return rep;
}

Test(fusion, gemm_epilogue_runs_on_its_blocks)
{
	kiln_compiler_t *kc = new_compiler();
	/* the heuristic as with AVX-512 BLAS (small_products_are_...) */
	kiln__compiler_set_blas_avx512(kc, true);
	uint32_t nk;
	char *rep = epi_report(kc, false, &nk);
	cr_expect_eq(nk, 1, "%s", rep);
	cr_expect(strstr(rep, "epilogue kiln_k1 on each block of 64 rows") !=
		      NULL,
		  "%s", rep);
	cr_expect(strstr(rep, "run by kiln_k0") != NULL, "%s", rep);
	free(rep);
	rep = epi_report(kc, true, &nk);
	cr_expect_eq(nk, 2, "%s", rep);
	cr_expect(strstr(rep, "epilogue") == NULL, "%s", rep);
	free(rep);
	kiln_compiler_free(kc);
}

Test(fusion, few_row_blocks_split_columns)
{
	kiln_compiler_t *kc = new_compiler();
	/* the heuristic as with AVX-512 BLAS (with an older one the first
	 * product is the template's: products_take_the_template_...) */
	kiln__compiler_set_blas_avx512(kc, true);
	/* 1 row block: 3136 / 12 columns (at least 256 each), rounded up
	 * to a multiple of 16 (BLAS: B row-major, under 512 rows) */
	char *rep = mm_report(kc, 64, 576, 3136);
	cr_expect(strstr(rep, "columns in blocks of 272") != NULL, "%s", rep);
	free(rep);
	/* 8 row blocks: 1000 / 3 columns (at least 256 each), rounded up to
	 * a whole 32-column panel for the packed template (AVX-512 f32), to
	 * 16 for BLAS */
	bool packed = __builtin_cpu_supports("avx512f");
	rep = mm_report(kc, 512, 300, 1000);
	cr_expect(strstr(rep, packed ? "columns in blocks of 352"
				     : "columns in blocks of 336") != NULL,
		  "%s", rep);
	free(rep);
	/* many row blocks: rows alone */
	rep = mm_report(kc, 4096, 64, 3136);
	cr_expect(strstr(rep, packed ? "B packed a panel at a time"
				     : "matmul via BLAS") != NULL,
		  "%s", rep);
	cr_expect(strstr(rep, "columns in blocks") == NULL, "%s", rep);
	free(rep);
	kiln_compiler_free(kc);
}

/* A product under 2^21 multiply-adds goes to BLAS; the kernel that runs it
 * loads OpenBLAS with the core kiln chose from the CPU's features (blas.c),
 * not the SSE3 one OpenBLAS 0.3.21 takes for a CPU model it does not know. */

Test(blas, kernels_load_openblas_with_the_cpus_core)
{
	if (getenv("OPENBLAS_CORETYPE") != NULL)
		cr_skip_test("OPENBLAS_CORETYPE is set (%s): kiln keeps it",
			     getenv("OPENBLAS_CORETYPE"));
	kiln_compiler_t *kc = new_compiler();
	char *rep = mm_report(kc, 64, 32, 48);
	bool blas = strstr(rep, "matmul via BLAS") != NULL;
	free(rep);
	if (!blas) {
		kiln_compiler_free(kc);
		cr_skip_test("no BLAS library here: products use the template");
	}
	kiln_graph_t *g = mm_graph(64, 32, 48);
	expect_matches_interp(kc, g, "default", 7, 1e-5, "mm via BLAS");
	const char *want = kiln_blas_coretype();
	const char *core = kiln_blas_corename(NULL);
	cr_assert_not_null(core, "the kernel did not load libopenblas.so.0");
	if (want != NULL)
		cr_expect(strcasecmp(core, want) == 0,
			  "OpenBLAS runs %s kernels, not %s", core, want);
	cr_expect_eq(kiln_blas_prepare(), want);
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

/* The compiler asks the OpenBLAS it probes which core it chose (from
 * OPENBLAS_CORETYPE, which this environment may set to "Haswell") and its
 * fingerprint says whether that core runs AVX-512 kernels, which the GEMM
 * template's heuristic depends on (products_take_the_template_...). The
 * test holds the library loaded, so that the core can be read after. */
Test(blas, the_fingerprint_says_whether_blas_runs_avx512_kernels)
{
	if (getenv("KILN_BLAS") != NULL)
		cr_skip_test("KILN_BLAS is set (%s)", getenv("KILN_BLAS"));
	kiln_blas_prepare();
	void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL)
		cr_skip_test("no libopenblas.so.0: %s", dlerror());
	kiln_compiler_t *kc = new_compiler();
	const char *core = kiln_blas_corename(NULL);
	cr_assert_not_null(core);
	bool wide = strcasecmp(core, "SkylakeX") == 0 ||
		    strcasecmp(core, "Cooperlake") == 0 ||
		    strcasecmp(core, "SapphireRapids") == 0;
	const char *fp = kiln_compiler_fingerprint(kc);
	cr_expect(strstr(fp, wide ? " blas/openblas-avx512 "
				  : " blas/openblas-pre-avx512 ") != NULL,
		  "OpenBLAS runs %s kernels; fingerprint %s", core, fp);
	kiln_compiler_free(kc);
	dlclose(h);
}

/* Where match_interp puts input 0: in a calloc'd block (GUARD_NONE), or
 * in mapped pages right against an inaccessible page after its last byte
 * (GUARD_END) or before its first (GUARD_START), so that a kernel that
 * reads outside the tensor faults instead of reading the heap. */
enum { GUARD_NONE, GUARD_END, GUARD_START };

typedef struct guarded {
	void *map;
	size_t len;
} guarded_t;

static void *guarded_alloc(guarded_t *gd, size_t bytes, int where)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t body = (bytes + pg - 1) / pg * pg;
	gd->len = body + 2 * pg;
	gd->map = mmap(NULL, gd->len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(gd->map != MAP_FAILED);
	char *lo = gd->map;
	cr_assert_eq(mprotect(lo, pg, PROT_NONE), 0);
	cr_assert_eq(mprotect(lo + pg + body, pg, PROT_NONE), 0);
	return where == GUARD_END ? lo + pg + body - bytes : lo + pg;
}

/* the pool match_interp and run_f32_graph_on run their modules on (NULL:
 * the default pool) */
static kiln_pool_t *match_pool;

/* Compiles g in mode, runs it on inputs drawn uniform in [-1, 1) (input t
 * from the stream seed + t; every input a tensor of its declared dtype and
 * static shape; input 0 placed as guard says) and expects every output (up
 * to 4) to match the interpreter's within rtol = atol = tol; what names
 * the case when it does not. */
static void match_interp(kiln_compiler_t *kc, const kiln_graph_t *g,
			 const char *mode, uint64_t seed, double tol,
			 const char *what, int guard)
{
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	snprintf(opts.mode, sizeof(opts.mode), "%s", mode);
	kiln_artifact_t *a = NULL;
	int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", what, err);
	kiln_module_t *m = NULL;
	rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", what, err);
	uint32_t nin = g->n_inputs;
	guarded_t gd = {NULL, 0};
	kiln_tensor_t *in = calloc(nin + 1, sizeof(*in));
	kiln_io_t *args = calloc(nin + 1, sizeof(*args));
	cr_assert(in != NULL && args != NULL);
	for (uint32_t t = 0; t < nin; t++) {
		const kiln_value_t *v = &g->values[t];
		int64_t sz[KILN_MAX_RANK_HARD], cnt = 1;
		for (uint32_t k = 0; k < v->rank; k++)
			cnt *= sz[k] = v->sizes[k].c;
		cr_assert_eq(
		    kiln_td_tensor_alloc(&in[t], v->dtype, v->rank, sz), 0);
		if (t == 0 && guard != GUARD_NONE) {
			free(in[0].data);
			in[0].data = guarded_alloc(
			    &gd, (size_t)cnt * kiln_dtype_size(v->dtype),
			    guard);
		}
		for (int64_t i = 0; i < cnt; i++) {
			double x =
			    kiln_td_prng_uniform(seed + t, (uint64_t)i, -1, 1);
			if (v->dtype == KILN_DT_F64)
				((double *)in[t].data)[i] = x;
			else
				((float *)in[t].data)[i] = (float)x;
		}
		args[t] = (kiln_io_t){KILN_IO_TENSOR, 0, in[t]};
	}
	/* every output (up to 4) */
	uint32_t nout = g->n_outputs;
	cr_assert(nout >= 1 && nout <= 4, "%s: %u outputs", what, nout);
	void *ob[4] = {NULL, NULL, NULL, NULL};
	kiln_io_t out[4];
	kiln_run_opts_t ro;
	memset(&ro, 0, sizeof(ro));
	ro.pool = match_pool;
	rc = kiln_module_run(m, args, nin, ob, out, match_pool ? &ro : NULL,
			     err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: %s", what, err);
	kiln_tensor_t want[4];
	rc = kiln_interp_run(g, in, want, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s: interp: %s", what, err);
	for (uint32_t o = 0; o < nout; o++) {
		kiln_td_cmp_t cr;
		cr_expect(kiln_td_compare(&out[o].t, &want[o], tol, tol, &cr),
			  "%s: output %u: %s", what, o, cr.msg);
		free(want[o].data);
	}
	/* after every comparison: outputs may be views of one buffer */
	for (uint32_t o = 0; o < 4; o++)
		free(ob[o]);
	if (gd.map != NULL) {
		munmap(gd.map, gd.len);
		in[0].data = NULL;
	}
	for (uint32_t t = 0; t < nin; t++)
		kiln_td_tensor_free(&in[t]);
	free(in);
	free(args);
	kiln_module_free(m);
}

static void expect_matches_interp(kiln_compiler_t *kc, const kiln_graph_t *g,
				  const char *mode, uint64_t seed, double tol,
				  const char *what)
{
	match_interp(kc, g, mode, seed, tol, what, GUARD_NONE);
}

/* A product through the GEMM template (codegen.c cg_gemm_tmpl: f32, at
 * least 2^21 multiply-adds; B read in place when row-major with at most
 * 256 KiB per unit, else packed a panel at a time or blocked) against the
 * interpreter: y = relu(a @ b) with a [B, M, K] (stored as [B, K, M] and
 * transposed when at: broadcasts along a column) and b [B, K, N] (stored
 * as [B, N, K] and transposed when bt: a weight as linear has it, packed
 * 16 k at a time by loads and transposes in registers, a tail of k by
 * gathers); relu becomes the product's epilogue. */
/* The template's blocked bound in gemm_template_matches_the_interpreter:
 * 2 MiB of A, so that products the interpreter checks quickly run blocked
 * (kiln__compiler_set_tmpl_block_a; the default is 8 MiB). */
#define TMPL_TEST_BLOCK_A (2 << 20)

static void check_tmpl_mm(kiln_compiler_t *kc, int64_t B, int64_t M, int64_t K,
			  int64_t N, bool at, bool bt)
{
	int64_t as[3] = {B, at ? K : M, at ? M : K};
	int64_t bs[3] = {B, bt ? N : K, bt ? K : N};
	int64_t ys[3] = {B, M, N}, am[3] = {B, M, K}, bm[3] = {B, K, N};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 2);
	specn(&b, "f32", as, 3);
	specn(&b, "f32", bs, 3);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2 + at + bt);
	/* values: 0 a, 1 b, then each node's output */
	uint32_t v = 2, av = 0, bv = 1;
	const int64_t *shapes[4] = {am, bm, ys, ys};
	for (int k = 0; k < 4; k++) {
		if ((k == 0 && !at) || (k == 1 && !bt))
			continue;
		if (k < 2) {
			node_head(&b, "aten.transpose.int", 3);
			ref(&b, (uint32_t)k);
			msgpack_pack_int64(&b.pk, 1);
			msgpack_pack_int64(&b.pk, 2);
			if (k == 0)
				av = v;
			else
				bv = v;
		} else if (k == 2) {
			node_head(&b, "aten.bmm.default", 2);
			ref(&b, av);
			ref(&b, bv);
		} else {
			node_head(&b, "aten.relu.default", 1);
			ref(&b, v - 1);
		}
		v++;
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", shapes[k], 3);
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, v - 1);
	kiln_graph_t *g = graph_from_json_like("bmm", &b.sb);
	char *rep = NULL;
	n_kernels(kc, g, &rep);
	/* at least 512 columns: few row blocks split into column blocks,
	 * which rule out the epilogue */
	/* B's rows in fewer than 64 sets of L1 (4096 / gcd(N·4, 4096)),
	 * over 8 of the panel's lines to a set: packed (panel_thrashes) */
	int64_t gs = 4096, gr = N * 4 % 4096;
	while (gr != 0) {
		int64_t t = gs % gr;
		gs = gr;
		gr = t;
	}
	bool crowds = 4096 / gs < 64 && 2 * K / (4096 / gs) > 8;
	bool packed = bt || K * N * 4 > 256 * 1024 || crowds, epi = N < 512;
	/* the test's compiler blocks from 2 MiB of A (TMPL_TEST_BLOCK_A) */
	bool blocked = K > 4096 || M * K * 4 > TMPL_TEST_BLOCK_A;
	const char *form = !packed    ? "register tiles)"
			   : !blocked ? "register tiles, B packed a panel at "
					"a time)"
				      : "register tiles, blocked, A and B "
					"packed)";
	if (__builtin_cpu_supports("avx512f"))
		cr_expect(strstr(rep, form) != NULL &&
			      (strstr(rep, "epilogue") != NULL) == epi,
			  "%s", rep);
	free(rep);
	char what[96];
	snprintf(what, sizeof(what), "B=%lld M=%lld K=%lld N=%lld at=%d bt=%d",
		 (long long)B, (long long)M, (long long)K, (long long)N, at,
		 bt);
	expect_matches_interp(kc, g, "default", 21, 1e-4, what);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
}

/* Units of 64 rows and a last one of 22 (blocks of 8, the last
 * overlapping) or of 6 (one block repeating its last row), 77, 100 and
 * 500 columns (masked tails), a transposed A, a batch of 3 with 45 rows;
 * the batch of 1 checks that a size-1 dim does not keep relu from being
 * the epilogue. Packed B: a transposed B (transposed in registers, a
 * tail of 12 k gathered) with a tail of 13 columns, a classifier's 8 rows
 * of 2048 by a transposed 1000 (its last panel's 8 columns read the last
 * one again, stored as 0), a row-major B small enough for L2 whose rows
 * are 1 KiB apart (in 4 sets of L1: packed), both operands transposed in
 * a batch of 3, a
 * row-major B of 1.1 MiB (masked loads, 512 rows and more), its last panel's
 * tail zero-filled, and both forms of B in column blocks (few row blocks).
 * Blocked (A over 2 MiB, the bound this test sets; 8 MiB by default, where
 * a product of 3 MiB packs B a panel at a time): K of 1100 (blocks of 512,
 * 512 and 76, the later ones
 * adding to C) with a transposed B and 77 columns, 520 rows (A's blocks of 64
 * rows, a last one of 8) and 515 (a last micro-panel of 3 rows, repeating its
 * last one while later K blocks add to C); a transposed A (gathered) with a
 * row-major B; a batch of 3; column blocks (9 panels in two blocks). */
Test(fusion, gemm_template_matches_the_interpreter)
{
	kiln_compiler_t *kc = new_compiler();
	/* the template's forms, not the choice for BLAS that AVX-512
	 * OpenBLAS kernels (no OPENBLAS_CORETYPE=Haswell) would make */
	kiln__compiler_set_blas_avx512(kc, false);
	if (__builtin_cpu_supports("avx512f")) {
		/* by default, 3 MiB of A packs B a panel at a time */
		char *rep = mm_report(kc, 1024, 768, 512);
		cr_expect(strstr(rep, "B packed a panel at a time") != NULL,
			  "%s", rep);
		free(rep);
	}
	kiln__compiler_set_tmpl_block_a(kc, TMPL_TEST_BLOCK_A);
	check_tmpl_mm(kc, 1, 150, 200, 77, true, false);
	check_tmpl_mm(kc, 1, 70, 300, 100, false, false);
	check_tmpl_mm(kc, 3, 45, 100, 500, false, false);
	check_tmpl_mm(kc, 1, 100, 300, 77, false, true);
	check_tmpl_mm(kc, 1, 8, 2048, 1000, false, true);
	check_tmpl_mm(kc, 2, 256, 64, 256, false, false);
	check_tmpl_mm(kc, 3, 200, 128, 90, true, true);
	check_tmpl_mm(kc, 1, 520, 600, 500, false, false);
	check_tmpl_mm(kc, 1, 512, 300, 1000, false, false);
	check_tmpl_mm(kc, 1, 64, 256, 1000, false, true);
	check_tmpl_mm(kc, 1, 520, 1100, 77, false, true);
	check_tmpl_mm(kc, 1, 515, 1030, 100, false, true);
	check_tmpl_mm(kc, 1, 520, 1030, 100, true, false);
	check_tmpl_mm(kc, 3, 520, 1030, 50, false, true);
	check_tmpl_mm(kc, 1, 520, 1030, 520, false, false);
	kiln_compiler_free(kc);
}

static void ints(gb_t *b, int64_t v0, int64_t v1)
{
	msgpack_pack_array(&b->pk, 2);
	msgpack_pack_int64(&b->pk, v0);
	msgpack_pack_int64(&b->pk, v1);
}

/* g against the interpreter with input 0 in a calloc'd block and against
 * an inaccessible page at either end (a load past what a lane wants
 * faults), compiled for this CPU and, where it has AVX2 and FMA, for an
 * AVX2 one (8 lanes). */
/* A compiler for an AVX2 CPU (8 lanes), or NULL where this one lacks
 * AVX2 or FMA. */
static kiln_compiler_t *avx2_compiler(void)
{
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return NULL;
	kiln_target_t t;
	memset(&t, 0, sizeof(t));
	strcpy(t.backend, "cpu");
	strcpy(t.arch, "x86-64");
	strcpy(t.features, "+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,"
			   "+avx,+avx2,+fma,+f16c,+cx16,+fxsr");
	char err[512];
	kiln_compiler_t *kc = NULL;
	cr_assert_eq(kiln_compiler_new(&t, &kc, err, sizeof(err)), 0, "%s",
		     err);
	return kc;
}

static void match_everywhere(kiln_compiler_t *kc, const kiln_graph_t *g,
			     uint64_t seed, double tol, const char *what)
{
	for (int gu = GUARD_NONE; gu <= GUARD_START; gu++)
		match_interp(kc, g, "default", seed, tol, what, gu);
	kiln_compiler_t *k8 = avx2_compiler();
	if (k8 == NULL)
		return;
	for (int gu = GUARD_NONE; gu <= GUARD_START; gu++)
		match_interp(k8, g, "default", seed, tol, what, gu);
	kiln_compiler_free(k8);
}

/* Nearest 2x upsampling as Inductor's decomposition traces it (torch's
 * interpolate, mode "nearest"): per axis, source = i64((f32 arange(2·S) +
 * 0.0) · 0.5), rows unsqueezed to a column, then _unsafe_index(x, [None,
 * None, rows, cols]). The conversion of that product is the index i // 2
 * (ops_pointwise.c scaled_index), which index.Tensor's lowering takes as
 * a plain index (ops_index.c static_index): one kernel, whose loads are
 * no gathers; against the interpreter, on 16 and 8 lanes, x against an
 * inaccessible page at either end. */
static void node_head_kw(gb_t *b, const char *op, uint32_t nargs)
{
	msgpack_pack_map(&b->pk, 4);
	s(b, "op");
	s(b, op);
	s(b, "args");
	msgpack_pack_array(&b->pk, nargs);
}

Test(fusion, nearest_upsampling_reads_its_sources_without_gathers)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t xs[4] = {2, 3, 8, 8}, ys[4] = {2, 3, 16, 16},
		      one[1] = {16}, col[2] = {16, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	specn(&b, "f32", xs, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 10);
	/* per axis: values 1.. (rows: 1-5, cols: 6-9) */
	for (int axis = 0; axis < 2; axis++) {
		uint32_t v0 = axis == 0 ? 1 : 6;
		node_head_kw(&b, "aten.arange.default", 1);
		msgpack_pack_int64(&b.pk, 16);
		s(&b, "kwargs");
		msgpack_pack_map(&b.pk, 1);
		s(&b, "dtype");
		s(&b, "f32");
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", one, 1);
		node_head(&b, "aten.add.Tensor", 2);
		ref(&b, v0);
		msgpack_pack_double(&b.pk, 0.0);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", one, 1);
		node_head(&b, "aten.mul.Tensor", 2);
		ref(&b, v0 + 1);
		msgpack_pack_double(&b.pk, 0.5);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", one, 1);
		node_head_kw(&b, "aten._to_copy.default", 1);
		ref(&b, v0 + 2);
		s(&b, "kwargs");
		msgpack_pack_map(&b.pk, 1);
		s(&b, "dtype");
		s(&b, "i64");
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "i64", one, 1);
		if (axis == 0) {
			node_head(&b, "aten.unsqueeze.default", 2);
			ref(&b, 4);
			msgpack_pack_int64(&b.pk, -1);
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			specn(&b, "i64", col, 2);
		}
	}
	/* 10 */
	node_head(&b, "aten._unsafe_index.Tensor", 2);
	ref(&b, 0);
	msgpack_pack_array(&b.pk, 4);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_nil(&b.pk);
	ref(&b, 5);
	ref(&b, 9);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ys, 4);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 10);
	kiln_graph_t *g = graph_from_json_like("nearest upsampling", &b.sb);
	char *rep = NULL;
	cr_expect_eq(n_kernels(kc, g, &rep), 1, "%s", rep);
	free(rep);
	if (__builtin_cpu_supports("avx512f")) {
		char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
		cr_expect(strstr(ir, "llvm.masked.gather") == NULL,
			  "a gather in the IR");
		free(ir);
	}
	match_everywhere(kc, g, 31, 0, "nearest upsampling");
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* ResNet's stem in training: relu's backward of max_pool2d's (3x3,
 * stride 2, padding 1: each element the sum of up to four windows'
 * gathered index and gradient, the gradient itself the sum of two
 * branches') is batch_norm's backward grad_out, which training reads three
 * times (its sum, its dot with x, grad_input). It is written once by a
 * kernel of its own (ops_nn.c low_batch_norm_backward), not gathered again
 * by every one of them, and its windows' elements are vector loads and
 * permutes, not gathers; against the interpreter, on 16 and 8 lanes. */
Test(fusion, a_costly_batch_norm_gradient_is_written_once)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t xs[4] = {2, 8, 16, 16}, ps[4] = {2, 8, 8, 8}, cs[1] = {8};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 7);
	specn(&b, "f32", xs, 4); /* 0 x */
	specn(&b, "f32", ps, 4); /* 1, 2: the pooled output's gradients */
	specn(&b, "f32", ps, 4);
	specn(&b, "f32", cs, 1); /* 3 weight */
	specn(&b, "f32", cs, 1); /* 4 save_mean */
	specn(&b, "f32", cs, 1); /* 5 save_invstd */
	specn(&b, "f32", xs, 4); /* 6 relu's output */
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 5);
	/* 7, 8: the pooled x and its indices (an output, so a buffer, as
	 * the training forward saves them) */
	node_head(&b, "aten.max_pool2d_with_indices.default", 4);
	ref(&b, 0);
	ints(&b, 3, 3);
	ints(&b, 2, 2);
	ints(&b, 1, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 2);
	specn(&b, "f32", ps, 4);
	specn(&b, "i64", ps, 4);
	/* 9: the two branches' gradient */
	node_head(&b, "aten.add.Tensor", 2);
	ref(&b, 1);
	ref(&b, 2);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ps, 4);
	/* 10: max_pool2d's grad_input */
	node_head(&b, "aten.max_pool2d_with_indices_backward.default", 8);
	ref(&b, 9);
	ref(&b, 0);
	ints(&b, 3, 3);
	ints(&b, 2, 2);
	ints(&b, 1, 1);
	ints(&b, 1, 1);
	msgpack_pack_false(&b.pk);
	ref(&b, 8);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", xs, 4);
	/* 11: relu's */
	node_head(&b, "aten.threshold_backward.default", 3);
	ref(&b, 10);
	ref(&b, 6);
	msgpack_pack_int64(&b.pk, 0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", xs, 4);
	/* 12, 13, 14: grad_input, grad_weight, grad_bias */
	node_head(&b, "aten.native_batch_norm_backward.default", 10);
	ref(&b, 11);
	ref(&b, 0);
	ref(&b, 3);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_nil(&b.pk);
	ref(&b, 4);
	ref(&b, 5);
	msgpack_pack_true(&b.pk);
	msgpack_pack_double(&b.pk, 1e-5);
	msgpack_pack_array(&b.pk, 3);
	for (int k = 0; k < 3; k++)
		msgpack_pack_true(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	specn(&b, "f32", xs, 4);
	specn(&b, "f32", cs, 1);
	specn(&b, "f32", cs, 1);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 4);
	ref(&b, 8);
	for (uint32_t v = 12; v < 15; v++)
		ref(&b, v);
	kiln_graph_t *g = graph_from_json_like("pool, batch_norm bw", &b.sb);
	char *rep = NULL;
	n_kernels(kc, g, &rep);
	/* after the pooling's kernel, one writes grad_out; the sums read it */
	const char *k1 = strstr(rep, "kiln_k1: "),
		   *k2 = strstr(rep, "kiln_k2: ");
	cr_expect(k1 != NULL && k2 != NULL &&
		      strncmp(k1, "kiln_k1: pointwise kernel [2, 8, 16, 16]",
			      40) == 0 &&
		      strstr(k1, "(stored)  <- node 4 ") < k2 &&
		      strncmp(k2, "kiln_k2: row kernel", 19) == 0,
		  "%s", rep);
	free(rep);
	/* the windows' (w + 1) / 2 - j lanes: loads and permutes
	 * (codegen.c load_lane_perm), no gathers */
	if (__builtin_cpu_supports("avx512f")) {
		char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
		cr_expect(strstr(ir, "llvm.masked.gather") == NULL,
			  "a gather in the IR");
		free(ir);
	}
	match_everywhere(kc, g, 29, 1e-4, "pool, bn bw");
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* y = a @ x[:, 1].unsqueeze(1): B is [K, 1] with strides (4, 0), unit
 * along neither dim. With N = 1 and A row-major the product is a row
 * reduction (ops_gemm.c gemv_ok) that reads the column at k·4, on every
 * target; before 8689404 it was a BLAS call, and this test checked that
 * on AVX-512 only, where it went stale unseen. */
Test(fusion, a_strided_column_product_is_a_reduction)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t M = 1024, K = 2048;
	int64_t as[2] = {M, K}, xs[2] = {K, 4}, cs[1] = {K}, bs[2] = {K, 1};
	int64_t ys[2] = {M, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 2);
	specn(&b, "f32", as, 2);
	specn(&b, "f32", xs, 2);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	const int64_t *shapes[3] = {cs, bs, ys};
	const uint32_t ranks[3] = {1, 2, 2};
	for (int k = 0; k < 3; k++) {
		if (k == 0) {
			node_head(&b, "aten.select.int", 3);
			ref(&b, 1);
			msgpack_pack_int64(&b.pk, 1);
			msgpack_pack_int64(&b.pk, 1);
		} else if (k == 1) {
			node_head(&b, "aten.unsqueeze.default", 2);
			ref(&b, 2);
			msgpack_pack_int64(&b.pk, 1);
		} else {
			node_head(&b, "aten.mm.default", 2);
			ref(&b, 0);
			ref(&b, 3);
		}
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", shapes[k], ranks[k]);
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 4);
	kiln_graph_t *g = graph_from_json_like("strided column", &b.sb);
	char *rep = NULL;
	cr_expect_eq(n_kernels(kc, g, &rep), 1);
	cr_expect(strstr(rep, "reduce sum") != NULL &&
		      strstr(rep, "matmul via BLAS") == NULL,
		  "%s", rep);
	free(rep);
	expect_matches_interp(kc, g, "default", 23, 1e-4, "strided column");
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* The tiled convolution template (ops_conv.c conv_tiled, codegen.c
 * gen_conv_body) against the interpreter, on shapes large enough to take
 * it: several tiles per image with a shorter last one, padding on every
 * side (the zero runs of a tile row), stride and dilation (the gather
 * loop), an input that is a permuted view (non-unit stride along W), and
 * f64 through dgemm. */
typedef struct convcase {
	const char *dt;
	int64_t N, C, H, W, O, K, s[2], p[2], d[2];
	bool permuted; /* x arrives as [N, C, W, H] and is permuted */
	/* y = relu(conv · s + r), s [O, 1, 1], r [N, O, OH, OW]: the
	 * pointwise kernel after the convolution, its epilogue */
	bool epilogue;
} convcase_t;

static void spec4(gb_t *b, const char *dt, const int64_t *d)
{
	specn(b, dt, d, 4);
}

static void ints2(gb_t *b, const int64_t *v)
{
	msgpack_pack_array(&b->pk, 2);
	msgpack_pack_int64(&b->pk, v[0]);
	msgpack_pack_int64(&b->pk, v[1]);
}

static void check_conv_case(kiln_compiler_t *kc, const convcase_t *cc,
			    const char *mode, char **report)
{
	int64_t OH =
	    (cc->H + 2 * cc->p[0] - cc->d[0] * (cc->K - 1) - 1) / cc->s[0] + 1;
	int64_t OW =
	    (cc->W + 2 * cc->p[1] - cc->d[1] * (cc->K - 1) - 1) / cc->s[1] + 1;
	int64_t xin[4] = {cc->N, cc->C, cc->permuted ? cc->W : cc->H,
			  cc->permuted ? cc->H : cc->W};
	int64_t x4[4] = {cc->N, cc->C, cc->H, cc->W};
	int64_t w4[4] = {cc->O, cc->C, cc->K, cc->K};
	int64_t y4[4] = {cc->N, cc->O, OH, OW};
	int64_t s4[4] = {1, cc->O, 1, 1};
	uint32_t nin = cc->epilogue ? 4 : 2;
	gb_t b;
	gb_init(&b);
	graph_head(&b, nin);
	spec4(&b, cc->dt, xin);
	spec4(&b, cc->dt, w4);
	if (cc->epilogue) {
		spec4(&b, cc->dt, s4);
		spec4(&b, cc->dt, y4);
	}
	s(&b, "nodes");
	msgpack_pack_array(&b.pk,
			   (cc->permuted ? 2 : 1) + (cc->epilogue ? 3 : 0));
	if (cc->permuted) {
		node_head(&b, "aten.permute.default", 2);
		ref(&b, 0);
		msgpack_pack_array(&b.pk, 4);
		static const int64_t perm[4] = {0, 1, 3, 2};
		for (int i = 0; i < 4; i++)
			msgpack_pack_int64(&b.pk, perm[i]);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec4(&b, cc->dt, x4);
	}
	uint32_t v = nin; /* the next value */
	node_head(&b, "aten.convolution.default", 9);
	ref(&b, cc->permuted ? v++ : 0);
	ref(&b, 1);
	msgpack_pack_nil(&b.pk);
	ints2(&b, cc->s);
	ints2(&b, cc->p);
	ints2(&b, cc->d);
	msgpack_pack_false(&b.pk);
	static const int64_t zero2[2] = {0, 0};
	ints2(&b, zero2);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec4(&b, cc->dt, y4);
	if (cc->epilogue) {
		static const char *const ops[3] = {
		    "aten.mul.Tensor", "aten.add.Tensor", "aten.relu.default"};
		for (int k = 0; k < 3; k++) {
			node_head(&b, ops[k], k < 2 ? 2 : 1);
			ref(&b, v++);
			if (k < 2)
				ref(&b, (uint32_t)(2 + k));
			s(&b, "out");
			msgpack_pack_array(&b.pk, 1);
			spec4(&b, cc->dt, y4);
		}
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, v);
	kiln_graph_t *g = graph_from_json_like("convolution", &b.sb);
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	snprintf(opts.mode, sizeof(opts.mode), "%s", mode);
	char *rep = NULL;
	int rc = kiln_compile_ex(kc, g, &opts, NULL, &rep, KILN_EMIT_KERNELS,
				 NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "compile: %s", err);
	if (report == NULL) {
		cr_expect(strstr(rep, "im2col tiles") != NULL, "%s", rep);
		free(rep);
	} else {
		*report = rep;
	}
	/* sums of C·K·K products: f32 rounding grows with their number */
	bool f64 = strcmp(cc->dt, "f64") == 0;
	char what[96];
	snprintf(what, sizeof(what), "%s N=%lld C=%lld %lldx%lld O=%lld k%lld",
		 cc->dt, (long long)cc->N, (long long)cc->C, (long long)cc->H,
		 (long long)cc->W, (long long)cc->O, (long long)cc->K);
	expect_matches_interp(kc, g, mode, 11, f64 ? 1e-12 : 1e-4, what);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
}

/* check_conv_case on each case, its kernel report holding every one of
 * the nwant texts. */
static void check_conv_cases(kiln_compiler_t *kc, const convcase_t *cases,
			     size_t n, const char *const *want, size_t nwant)
{
	for (size_t i = 0; i < n; i++) {
		char *rep = NULL;
		check_conv_case(kc, &cases[i], "default", &rep);
		for (size_t w = 0; w < nwant; w++)
			cr_expect(strstr(rep, want[w]) != NULL, "%s", rep);
		free(rep);
	}
}

/* A product of fewer than 32 columns against an A of 4 MiB or more (a
 * small batch's late convolution: ResNet-18's 512 -> 512 at 2², batch 4,
 * [512, 16] K=4608) is the GEMM template reading A in place, B up to 512
 * KiB (codegen.c one_panel_streamed), where BLAS packed all of A for its
 * 16 columns; with 128 rows (A of 2.25 MiB) it stays BLAS's.
 * Against the interpreter. Without AVX-512 both are BLAS's. */
Test(fusion, few_columns_against_a_large_a_stream_it)
{
	kiln_compiler_t *kc = new_compiler();
	bool avx = __builtin_cpu_supports("avx512f");
	static const int64_t mm[2][3] = {{512, 4608, 16}, {128, 4608, 16}};
	for (int i = 0; i < 2; i++) {
		kiln_graph_t *g = mm_graph(mm[i][0], mm[i][1], mm[i][2]);
		char what[64];
		snprintf(what, sizeof(what), "mm %lldx%lldx%lld",
			 (long long)mm[i][0], (long long)mm[i][1],
			 (long long)mm[i][2]);
		expect_report_has(kc, g, "against an A of 4 MiB or more",
				  avx && i == 0, what);
		expect_matches_interp(kc, g, "default", 150 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

static kiln_module_t *module_of(kiln_compiler_t *kc, const kiln_graph_t *g,
				const char *what);

/* An f32 spec {dtype, shape, strides}. */
static void spec_strided(gb_t *b, const int64_t *d, const int64_t *st,
			 uint32_t rank)
{
	msgpack_pack_map(&b->pk, 3);
	s(b, "dtype");
	s(b, "f32");
	s(b, "shape");
	msgpack_pack_array(&b->pk, rank);
	for (uint32_t i = 0; i < rank; i++)
		msgpack_pack_int64(&b->pk, d[i]);
	s(b, "strides");
	msgpack_pack_array(&b->pk, rank);
	for (uint32_t i = 0; i < rank; i++)
		msgpack_pack_int64(&b->pk, st[i]);
}

/* A qkv projection as attention saves it for its backward: addmm(bias, x,
 * t(w)) [8, 48], viewed [8, 3, 16], permuted [3, 8, 16] and unbound into
 * q, k and v ([8, 16], strides [48, 1], as torch declares them); the
 * graph returns the first n_qkv of them, and relu of the projection where
 * relu (a reader of the projection besides the views). */
static kiln_graph_t *qkv_graph(uint32_t n_qkv, bool relu)
{
	static const int64_t xs[2] = {8, 16}, ws[2] = {48, 16}, bs[1] = {48},
			     wt[2] = {16, 48}, wts[2] = {1, 16},
			     ps[2] = {8, 48}, vs[3] = {8, 3, 16},
			     pm[3] = {3, 8, 16}, pms[3] = {16, 48, 1},
			     qs[2] = {8, 16}, qss[2] = {48, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", xs, 2);
	specn(&b, "f32", ws, 2);
	specn(&b, "f32", bs, 1);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, relu ? 6 : 5);
	node_head(&b, "aten.t.default", 1); /* 3 */
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, wt, wts, 2);
	node_head(&b, "aten.addmm.default", 3); /* 4 */
	ref(&b, 2);
	ref(&b, 0);
	ref(&b, 3);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ps, 2);
	node_head(&b, "aten.view.default", 2); /* 5 */
	ref(&b, 4);
	msgpack_pack_array(&b.pk, 3);
	for (int i = 0; i < 3; i++)
		msgpack_pack_int64(&b.pk, vs[i]);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", vs, 3);
	node_head(&b, "aten.permute.default", 2); /* 6 */
	ref(&b, 5);
	msgpack_pack_array(&b.pk, 3);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 0);
	msgpack_pack_int64(&b.pk, 2);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, pm, pms, 3);
	node_head(&b, "aten.unbind.int", 1); /* 7, 8, 9 */
	ref(&b, 6);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	for (int i = 0; i < 3; i++)
		spec_strided(&b, qs, qss, 2);
	if (relu) {
		node_head(&b, "aten.relu.default", 1); /* 10 */
		ref(&b, 4);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", ps, 2);
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, n_qkv + relu);
	for (uint32_t i = 0; i < n_qkv; i++)
		ref(&b, 7 + i);
	if (relu)
		ref(&b, 10);
	kiln_graph_t *g = graph_from_json_like("qkv", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

/* y = x * 2 declared [4, 6, 8] laid out [6, 4, 8] (strides [8, 32, 1], as
 * attention's output [B, H, N, D] is laid out [B, N, H, D]); the graph
 * returns detach(y) and relu(transpose(y, 0, 1)) ([6, 4, 8], contiguous,
 * in y's memory order). */
static kiln_graph_t *permuted_value_graph(void)
{
	static const int64_t xs[3] = {4, 6, 8}, ys[3] = {4, 6, 8},
			     yst[3] = {8, 32, 1}, ts[3] = {6, 4, 8},
			     tst[3] = {32, 8, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	specn(&b, "f32", xs, 3);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 4);
	node_head(&b, "aten.mul.Tensor", 2); /* 1 */
	ref(&b, 0);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, ys, yst, 3);
	node_head(&b, "aten.detach.default", 1); /* 2 */
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, ys, yst, 3);
	node_head(&b, "aten.transpose.int", 3); /* 3 */
	ref(&b, 1);
	msgpack_pack_int64(&b.pk, 0);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, ts, tst, 3);
	node_head(&b, "aten.relu.default", 1); /* 4 */
	ref(&b, 3);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ts, 3);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 2);
	ref(&b, 2);
	ref(&b, 4);
	kiln_graph_t *g = graph_from_json_like("permuted value", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

/* clone_of: y = x * 3 [4, 6]; the graph returns view(y, [24]) and
 * clone(y). Else: the graph returns slice(clone(x), 0, 0, 2). */
static kiln_graph_t *clone_graph(bool clone_of)
{
	static const int64_t xs[2] = {4, 6}, fl[1] = {24}, sl[2] = {2, 6},
			     sls[2] = {6, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	specn(&b, "f32", xs, 2);
	s(&b, "nodes");
	if (clone_of) {
		msgpack_pack_array(&b.pk, 3);
		node_head(&b, "aten.mul.Tensor", 2); /* 1 */
		ref(&b, 0);
		msgpack_pack_double(&b.pk, 3.0);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", xs, 2);
		node_head(&b, "aten.view.default", 2); /* 2 */
		ref(&b, 1);
		msgpack_pack_array(&b.pk, 1);
		msgpack_pack_int64(&b.pk, 24);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", fl, 1);
		node_head(&b, "aten.clone.default", 1); /* 3 */
		ref(&b, 1);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", xs, 2);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 2);
		ref(&b, 2);
		ref(&b, 3);
	} else {
		msgpack_pack_array(&b.pk, 2);
		node_head(&b, "aten.clone.default", 1); /* 1 */
		ref(&b, 0);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", xs, 2);
		node_head(&b, "aten.slice.Tensor", 4); /* 2 */
		ref(&b, 1);
		msgpack_pack_int64(&b.pk, 0);
		msgpack_pack_int64(&b.pk, 0);
		msgpack_pack_int64(&b.pk, 2);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec_strided(&b, sl, sls, 2);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 1);
		ref(&b, 2);
	}
	kiln_graph_t *g = graph_from_json_like("clone", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

/* Outputs that are views of a value the graph computes, all of it (q, k
 * and v unbound from one projection), are views of one output buffer that
 * the value is realized into where it is made (lower.c
 * output_view_bases), not copies computed again at the end into a buffer
 * each: no kernel writes the unbind's outputs, and the three share one
 * buffer. Returning only q keeps the copy (realizing all of the
 * projection for a third of it would cost more). Each against the
 * interpreter, with relu reading the projection too. A value declared in
 * another dense layout (attention's output) is realized in that layout.
 * A clone's output never shares the storage of the value it copies, nor of
 * an input. */
Test(fusion, outputs_viewing_all_of_a_value_share_its_buffer)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		uint32_t n_qkv;
		bool copied;
		uint32_t out_buffers;
	} cases[] = {{3, false, 1}, {1, true, 1}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "%u of q, k, v returned",
			 cases[i].n_qkv);
		kiln_graph_t *g = qkv_graph(cases[i].n_qkv, false);
		expect_report_has(kc, g, "aten.unbind.int", cases[i].copied,
				  what);
		kiln_module_t *m = module_of(kc, g, what);
		cr_expect_eq(kiln_module_n_out_buffers(m), cases[i].out_buffers,
			     "%s: %u out buffers", what,
			     kiln_module_n_out_buffers(m));
		kiln_module_free(m);
		kiln_graph_free(g);
		g = qkv_graph(cases[i].n_qkv, true);
		expect_matches_interp(kc, g, "default", 170 + i, 1e-5, what);
		kiln_graph_free(g);
	}
	/* a value declared in another dense layout is realized in it: the
	 * detached output is a view of it, no copy at the end */
	kiln_graph_t *g = permuted_value_graph();
	expect_report_has(kc, g, "aten.detach.default", false,
			  "permuted value");
	expect_matches_interp(kc, g, "default", 172, 0, "permuted value");
	kiln_graph_free(g);
	/* a clone's output has storage of its own, as in torch: a view of
	 * y and clone(y) take two buffers, and slice(clone(x)) is not a
	 * view of the input x */
	for (int k = 0; k < 2; k++) {
		const char *what = k ? "view(y), clone(y)" : "slice(clone(x))";
		g = clone_graph(k != 0);
		kiln_module_t *m = module_of(kc, g, what);
		cr_expect_eq(kiln_module_n_out_buffers(m), k ? 2u : 1u,
			     "%s: %u out buffers", what,
			     kiln_module_n_out_buffers(m));
		kiln_module_free(m);
		expect_matches_interp(kc, g, "default", 173 + k, 0, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* x + 1 declared [2, 3] with strides [4, 1] (gaps in its storage, as
 * empty_strided leaves them), viewed as_strided([2, 2], [4, 1], 1), times
 * 2: the view reads the storage in the declared layout. */
static kiln_graph_t *strided_base_graph(void)
{
	static const int64_t xs[2] = {2, 3}, xst[2] = {4, 1}, vs[2] = {2, 2},
			     vst[2] = {4, 1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	specn(&b, "f32", xs, 2);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	node_head(&b, "aten.add.Tensor", 2); /* 1 */
	ref(&b, 0);
	msgpack_pack_double(&b.pk, 1.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, xs, xst, 2);
	node_head(&b, "aten.as_strided.default", 4); /* 2 */
	ref(&b, 1);
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, 2);
	msgpack_pack_int64(&b.pk, 2);
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, 4);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, vs, vst, 2);
	node_head(&b, "aten.mul.Tensor", 2); /* 3 */
	ref(&b, 2);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", vs, 2);
	return end_graph(&b, 3, 1, "strided base");
}

/* relu(x) [4, 4], narrowed to rows 1..2 (narrow, as a hand-written graph
 * has it: traced graphs have slice), viewed as_strided([4], [1], 0), times
 * 2: the view reads relu(x)'s storage from its start. */
static kiln_graph_t *narrow_base_graph(void)
{
	static const int64_t xs[2] = {4, 4}, ns[2] = {2, 4}, ss[1] = {4},
			     sst[1] = {1};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	specn(&b, "f32", xs, 2);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 4);
	node_head(&b, "aten.relu.default", 1); /* 1 */
	ref(&b, 0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", xs, 2);
	node_head(&b, "aten.narrow.default", 4); /* 2 */
	ref(&b, 1);
	msgpack_pack_int64(&b.pk, 0);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 2);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ns, 2);
	node_head(&b, "aten.as_strided.default", 4); /* 3 */
	ref(&b, 2);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 4);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec_strided(&b, ss, sst, 1);
	node_head(&b, "aten.mul.Tensor", 2); /* 4 */
	ref(&b, 3);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", ss, 1);
	return end_graph(&b, 4, 1, "narrow base");
}

/* as_strided's storage offset counts from the storage of self's view base,
 * laid out as the graph declares it (lower.c lstorage): a base declared
 * with gaps between its rows is realized so, and the view reads past the
 * gap, as torch does (out[a][b] = 2 (x[a][b + 1] + 1)); no fallback step.
 * The interpreter lays the base out so too. A view of narrow (a view op
 * kiln lowers as a slice) reads the narrowed value's storage: relu(x)'s
 * first row, 2 relu(x[0]). (Clones of slices, lazy bases, channels-last
 * ones, no storage offset, _reshape_alias: the as_strided op cases.) */
Test(fusion, as_strided_reads_its_base_as_declared)
{
	kiln_compiler_t *kc = new_compiler();
	kiln_graph_t *g = strided_base_graph();
	expect_report_has(kc, g, "fallback", false, "strided base");
	kiln_module_t *m = module_of(kc, g, "strided base");
	int64_t sz[2] = {2, 3};
	kiln_tensor_t x;
	cr_assert_eq(kiln_td_tensor_alloc(&x, KILN_DT_F32, 2, sz), 0);
	for (int i = 0; i < 6; i++)
		((float *)x.data)[i] = (float)(i * i) - 4.0f;
	kiln_io_t in = {KILN_IO_TENSOR, 0, x};
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	char err[512];
	cr_assert_eq(
	    kiln_module_run(m, &in, 1, ob, out, NULL, err, sizeof(err)), 0,
	    "%s", err);
	const float *xv = x.data;
	for (int a = 0; a < 2; a++)
		for (int c = 0; c < 2; c++) {
			float got = ((const float *)out[0].t.data)[a * 2 + c],
			      want = 2.0f * (xv[a * 3 + c + 1] + 1.0f);
			cr_expect_eq(got, want, "out[%d][%d] = %g, want %g", a,
				     c, (double)got, (double)want);
		}
	kiln_tensor_t ref[1];
	cr_assert_eq(kiln_interp_run(g, &x, ref, err, sizeof(err)), 0, "%s",
		     err);
	kiln_td_cmp_t cr;
	cr_expect(kiln_td_compare(&out[0].t, &ref[0], 0, 0, &cr), "interp: %s",
		  cr.msg);
	free(ref[0].data);
	free(ob[0]);
	kiln_td_tensor_free(&x);
	kiln_module_free(m);
	kiln_graph_free(g);

	g = narrow_base_graph();
	expect_report_has(kc, g, "fallback", false, "narrow base");
	m = module_of(kc, g, "narrow base");
	int64_t nsz[2] = {4, 4};
	cr_assert_eq(kiln_td_tensor_alloc(&x, KILN_DT_F32, 2, nsz), 0);
	for (int i = 0; i < 16; i++)
		((float *)x.data)[i] = (float)(i % 5) - 2.0f;
	in.t = x;
	ob[0] = NULL;
	cr_assert_eq(
	    kiln_module_run(m, &in, 1, ob, out, NULL, err, sizeof(err)), 0,
	    "%s", err);
	xv = x.data;
	for (int k = 0; k < 4; k++) {
		float got = ((const float *)out[0].t.data)[k],
		      want = 2.0f * (xv[k] > 0 ? xv[k] : 0.0f);
		cr_expect_eq(got, want, "narrow: out[%d] = %g, want %g", k,
			     (double)got, (double)want);
	}
	cr_assert_eq(kiln_interp_run(g, &x, ref, err, sizeof(err)), 0, "%s",
		     err);
	cr_expect(kiln_td_compare(&out[0].t, &ref[0], 0, 0, &cr),
		  "narrow: interp: %s", cr.msg);
	free(ref[0].data);
	free(ob[0]);
	kiln_td_tensor_free(&x);
	kiln_module_free(m);
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

/* What the GEMM template's heuristic leaves to BLAS where BLAS runs
 * AVX-512 kernels (codegen.c tmpl_form) it takes where BLAS runs older
 * ones (OPENBLAS_CORETYPE=Haswell on an AVX-512 machine: ResNet-50's
 * forward 80 -> 63 ms): a convolution's product (two 8x8 images' im2col,
 * 64x576 by 128 columns), a row-major B under 512 rows (64x576x3136) and
 * an A over 8 MiB (2048x1056x64). The fingerprint says which heuristic
 * made the code. Each against the interpreter. */
Test(fusion, products_take_the_template_where_blas_is_pre_avx512)
{
	if (!__builtin_cpu_supports("avx512f"))
		cr_skip_test("no AVX-512: the template is not used");
	kiln_compiler_t *kc = new_compiler();
	if (strstr(kiln_compiler_fingerprint(kc), "blas/none") != NULL) {
		kiln_compiler_free(kc);
		cr_skip_test("no BLAS library here: products use the template");
	}
	static const convcase_t conv = {
	    "f32", 2, 64, 8, 8, 64, 3, {1, 1}, {1, 1}, {1, 1}, false, false};
	static const int64_t mm[2][3] = {{64, 576, 3136}, {2048, 1056, 64}};
	for (int avx512 = 1; avx512 >= 0; avx512--) {
		kiln__compiler_set_blas_avx512(kc, avx512 != 0);
		const char *fp = kiln_compiler_fingerprint(kc);
		cr_expect(strstr(fp, avx512
					 ? "blas/openblas-avx512 "
					 : "blas/openblas-pre-avx512 ") != NULL,
			  "%s", fp);
		const char *want = avx512 ? "matmul via BLAS sgemm"
					  : "matmul via GEMM template";
		char *rep = NULL;
		check_conv_case(kc, &conv, "default", &rep);
		cr_expect(strstr(rep, want) != NULL, "avx512 %d:\n%s", avx512,
			  rep);
		cr_expect(avx512 || strstr(rep, "(BLAS runs pre-AVX-512 "
						"kernels)") != NULL,
			  "%s", rep);
		free(rep);
		for (int i = 0; i < 2; i++) {
			rep = mm_report(kc, mm[i][0], mm[i][1], mm[i][2]);
			cr_expect(strstr(rep, avx512 ? "matmul via BLAS"
						     : want) != NULL,
				  "avx512 %d:\n%s", avx512, rep);
			free(rep);
			kiln_graph_t *g =
			    mm_graph(mm[i][0], mm[i][1], mm[i][2]);
			char what[64];
			snprintf(what, sizeof(what), "mm %d, avx512 %d", i,
				 avx512);
			expect_matches_interp(kc, g, "default", 31 + i, 1e-4,
					      what);
			kiln_graph_free(g);
		}
	}
	kiln_compiler_free(kc);
}

/* hardtanh(x·s, 0, 6) -> convolution (MobileNetV2's eval batch_norm and
 * relu6 before a depthwise or a small 1x1 one, both the direct form): the
 * direct form reads each input element Og·KH·KW times, so the computed
 * input is a kernel of its own (written once) instead of being recomputed
 * at every read (MobileNetV2 forward 2.3x, EfficientNet-B0 3x faster);
 * with a buffer input (the same convolution alone) it stays one kernel.
 * Against the interpreter. */
static void act_conv_graph(gb_t *b, int64_t C, int64_t O, int64_t K,
			   int64_t groups, bool act)
{
	const int64_t x4[4] = {1, C, 12, 12}, s4[4] = {1, C, 1, 1},
		      w4[4] = {O, C / groups, K, K}, y4[4] = {1, O, 12, 12};
	gb_init(b);
	graph_head(b, 3);
	specn(b, "f32", x4, 4);
	specn(b, "f32", s4, 4);
	specn(b, "f32", w4, 4);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, act ? 3 : 1);
	uint32_t xin = 0;
	if (act) {
		node_head(b, "aten.mul.Tensor", 2);
		ref(b, 0);
		ref(b, 1);
		s(b, "out");
		msgpack_pack_array(&b->pk, 1);
		specn(b, "f32", x4, 4);
		node_head(b, "aten.hardtanh.default", 3);
		ref(b, 3);
		msgpack_pack_double(&b->pk, 0.0);
		msgpack_pack_double(&b->pk, 6.0);
		s(b, "out");
		msgpack_pack_array(&b->pk, 1);
		specn(b, "f32", x4, 4);
		xin = 4;
	}
	node_head(b, "aten.convolution.default", 9);
	ref(b, xin);
	ref(b, 2);
	msgpack_pack_nil(&b->pk);
	const int64_t one[2] = {1, 1}, pad[2] = {K / 2, K / 2},
		      zero[2] = {0, 0};
	ints2(b, one);
	ints2(b, pad);
	ints2(b, one);
	msgpack_pack_false(&b->pk);
	ints2(b, zero);
	msgpack_pack_int64(&b->pk, groups);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	specn(b, "f32", y4, 4);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, act ? 5 : 3);
}

Test(conv, direct_form_reads_a_computed_input_once)
{
	kiln_compiler_t *kc = new_compiler();
	/* depthwise 3x3 (Og·KH·KW = 9), 1x1 8 -> 24 (24), grouped 3x3 */
	static const int64_t cases[][4] = {
	    {8, 8, 3, 8}, {8, 24, 1, 1}, {8, 16, 3, 4}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int act = 0; act < 2; act++) {
			gb_t b;
			act_conv_graph(&b, cases[i][0], cases[i][1],
				       cases[i][2], cases[i][3], act);
			kiln_graph_t *g = graph_from_json_like("conv", &b.sb);
			char *rep;
			uint32_t nk = n_kernels(kc, g, &rep);
			cr_expect_eq(nk, act ? 2u : 1u, "case %zu act %d:\n%s",
				     i, act, rep);
			free(rep);
			char what[64];
			snprintf(what, sizeof(what), "conv case %zu act %d", i,
				 act);
			expect_matches_interp(kc, g, "default", 7 + i, 1e-4,
					      what);
			kiln_graph_free(g);
			msgpack_sbuffer_destroy(&b.sb);
		}
	}
	kiln_compiler_free(kc);
}

/* A convolution's stride [1, 1], padding [pad, pad], dilation [1, 1],
 * transposed false, output_padding [0, 0] and groups. */
static void conv_args_s1(gb_t *b, int64_t pad, int64_t groups)
{
	const int64_t one[2] = {1, 1}, p2[2] = {pad, pad}, zero[2] = {0, 0};
	ints2(b, one);
	ints2(b, p2);
	ints2(b, one);
	msgpack_pack_false(&b->pk);
	ints2(b, zero);
	msgpack_pack_int64(&b->pk, groups);
}

/* x [2, C, H, H] * w [C, C/G, K, K], stride S, padding K/2, G groups, no
 * bias (K odd, H a multiple of S) */
static kiln_graph_t *grouped_conv_graph_s(int64_t C, int64_t H, int64_t K,
					  int64_t G, int64_t S)
{
	gb_t b;
	const int64_t x4[4] = {2, C, H, H}, w4[4] = {C, C / G, K, K},
		      y4[4] = {2, C, H / S, H / S};
	gb_init(&b);
	graph_head(&b, 2);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.convolution.default", 9);
	ref(&b, 0);
	ref(&b, 1);
	msgpack_pack_nil(&b.pk);
	const int64_t st[2] = {S, S}, p2[2] = {K / 2, K / 2}, one[2] = {1, 1},
		      zero[2] = {0, 0};
	ints2(&b, st);
	ints2(&b, p2);
	ints2(&b, one);
	msgpack_pack_false(&b.pk);
	ints2(&b, zero);
	msgpack_pack_int64(&b.pk, G);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", y4, 4);
	return end_graph(&b, 2, 1, "grouped conv");
}

static kiln_graph_t *grouped_conv_graph(int64_t C, int64_t H, int64_t K,
					int64_t G)
{
	return grouped_conv_graph_s(C, H, K, G, 1);
}

/* Grouped convolutions of 33-64 taps take the direct form where the
 * output rows are a multiple of 4 columns (ops_conv.c direct_ok): a 7x7
 * depthwise (ConvNeXt's) built a 49x im2col buffer before (5.95 -> 0.38 ms
 * at [8, 80, 32²]); at rows of 7 columns (a depthwise one takes the
 * channels-last form there: the next test), and past 64 taps, they are
 * not. Against the interpreter. */
Test(conv, grouped_convolutions_of_up_to_64_taps_are_direct)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H, K, G;
		const char *dims; /* the direct form's reduced dims */
		bool direct;
	} cs[] = {{16, 12, 7, 16, "1*, 7*, 7*", true},
		  {16, 12, 3, 4, "4*, 3*, 3*", true},
		  {16, 7, 7, 16, "1*, 7*, 7*", false},
		  {16, 12, 3, 2, "8*, 3*, 3*", false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    grouped_conv_graph(cs[i].C, cs[i].H, cs[i].K, cs[i].G);
		char what[96];
		snprintf(what, sizeof(what),
			 "%lldx%lld conv, %lld groups of %lld, %lldx%lld",
			 (long long)cs[i].K, (long long)cs[i].K,
			 (long long)cs[i].G, (long long)(cs[i].C / cs[i].G),
			 (long long)cs[i].H, (long long)cs[i].H);
		expect_report_has(kc, g, cs[i].dims, cs[i].direct, what);
		expect_matches_interp(kc, g, "default", 90 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A depthwise convolution that the direct form along OW does not take
 * (more than 32 taps over rows that are not a multiple of 4 columns, or
 * more than 64) runs channels-last (ops_conv.c conv_depthwise_nhwc: the
 * channels the vector, x and y transposed around it) where the channels
 * fill vectors, in place of an im2col of KH·KW times the input and a
 * product of one row a channel (ConvMixer-768/32, 7x7 at 18², batch 1:
 * 111 -> 45 ms a forward; a 9x9 at 32² over 1536 channels 23.6 -> 5.2
 * ms). A 3x3 stays direct at rows of 7; with 24 channels on 16 lanes the
 * product stays. Against the interpreter on 16 and 8 lanes. */
Test(conv, depthwise_convolutions_past_the_direct_form_run_channels_last)
{
	kiln_compiler_t *kc = new_compiler();
	int lanes = __builtin_cpu_supports("avx512f") ? 16 : 8;
	static const struct {
		int64_t C, H, K;
		bool direct;
	} cs[] = {{32, 18, 7, false},
		  {16, 16, 9, false},
		  {16, 7, 3, true},
		  {24, 9, 7, false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		int64_t C = cs[i].C, H = cs[i].H, K = cs[i].K;
		kiln_graph_t *g = grouped_conv_graph(C, H, K, C);
		char what[96], cl[64];
		snprintf(what, sizeof(what),
			 "%lldx%lld depthwise, %lld channels, %lld²",
			 (long long)K, (long long)K, (long long)C,
			 (long long)H);
		snprintf(cl, sizeof(cl), "[2, %lld, %lld, %lld*, %lld*, %lld]",
			 (long long)H, (long long)H, (long long)K, (long long)K,
			 (long long)C);
		expect_report_has(kc, g, cl, !cs[i].direct && C % lanes == 0,
				  what);
		match_everywhere(kc, g, 110 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

static kiln_graph_t *grouped_conv_bw_graph(int64_t C, int64_t H, int64_t G,
					   int64_t K);

/* The channel block of a channels-last depthwise sum over C channels that
 * takes blocks (ops_conv.c dw_chan_block): 4 vectors, or fewer where that
 * divides C. */
static int64_t dw_block(int64_t C, int lanes)
{
	for (int64_t cb = 4 * lanes; cb >= lanes; cb /= 2)
		if (C % cb == 0)
			return cb;
	return C;
}

/* A channels-last depthwise sum whose window over every channel passes 32
 * KiB (taps·C·4 bytes: 49 taps of 192 channels) takes the channels in
 * blocks of 4 vectors, or fewer where that divides C, outermost
 * (ops_conv.c dw_cl_sum): x and w are copied to [C/CB, N, H, W, CB] and
 * [C/CB, KH, KW, CB] first, so that a block's window stays in L1 (read in
 * place, the taps lie C elements apart and crowd a quarter of L1's sets at
 * 768 channels: ConvMixer-768/32's 7x7 at 18² 0.33 -> 0.11 ms). The
 * backward takes the same blocks for the input and the weight gradient
 * with grad_output and x contiguous (ConvMixer's backward 117 -> 96 ms),
 * and the copies run as kernels of their own: as row members of a sum
 * (their shape matches its rows) they would cost it its column blocks
 * (sched.c try_join). Under 32 KiB (49 taps of 96 channels) one block is
 * the channels-last order. All outputs against the interpreter on 16 and 8
 * lanes. */
Test(conv, depthwise_sums_over_many_channels_run_in_channel_blocks)
{
	kiln_compiler_t *kc = new_compiler();
	int lanes = __builtin_cpu_supports("avx512f") ? 16 : 8;
	static const struct {
		int64_t C, H, K, S;
	} fw[] = {{192, 10, 7, 1}, {176, 9, 7, 1}, {192, 12, 9, 2}};
	for (size_t i = 0; i < sizeof(fw) / sizeof(fw[0]); i++) {
		int64_t C = fw[i].C, H = fw[i].H, K = fw[i].K, S = fw[i].S,
			CB = dw_block(C, lanes), OH = H / S;
		kiln_graph_t *g = grouped_conv_graph_s(C, H, K, C, S);
		char what[96], dims[80];
		snprintf(what, sizeof(what),
			 "%lldx%lld depthwise, stride %lld, %lld channels, "
			 "%lld²",
			 (long long)K, (long long)K, (long long)S, (long long)C,
			 (long long)H);
		snprintf(dims, sizeof(dims),
			 "row kernel [%lld, 2, %lld, %lld, %lld*, %lld*, %lld]",
			 (long long)(C / CB), (long long)OH, (long long)OH,
			 (long long)K, (long long)K, (long long)CB);
		expect_report_has(kc, g, dims, true, what);
		match_everywhere(kc, g, 160 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_graph_t *g = grouped_conv_graph(96, 10, 7, 96);
	expect_report_has(kc, g, "row kernel [2, 10, 10, 7*, 7*, 96]", true,
			  "7x7 depthwise, 96 channels");
	kiln_graph_free(g);
	static const int64_t bw[][2] = {{192, 10}, {176, 9}};
	for (size_t i = 0; i < sizeof(bw) / sizeof(bw[0]); i++) {
		int64_t C = bw[i][0], H = bw[i][1], CB = dw_block(C, lanes);
		g = grouped_conv_bw_graph(C, H, C, 7);
		char what[96], gi[96], gw[96];
		snprintf(what, sizeof(what),
			 "7x7 depthwise backward, %lld channels at %lld²",
			 (long long)C, (long long)H);
		const char *blocks =
		    CB == 64 ? ", 1 pass, 4 blocks of 16 columns a unit" : "";
		snprintf(gi, sizeof(gi),
			 "row kernel [%lld, 2, %lld, %lld, 7*, 7*, %lld]%s",
			 (long long)(C / CB), (long long)H, (long long)H,
			 (long long)CB, blocks);
		snprintf(gw, sizeof(gw),
			 "row kernel [%lld, 7, 7, 2*, %lld*, %lld*, %lld]%s",
			 (long long)(C / CB), (long long)H, (long long)H,
			 (long long)CB, blocks);
		expect_report_has(kc, g, gi, true, what);
		expect_report_has(kc, g, gw, true, what);
		match_everywhere(kc, g, 170 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* Grouped convolutions past the direct form's taps are a product per
 * group (ops_conv.c): implicit GEMM per group where it has the units and
 * each group a register tile's rows (f32 on AVX-512: "in G groups"),
 * else one product per group whose columns are the whole batch,
 * [G, Og, N·OH·OW] (conv_cols). Before, each image and group was a
 * product of its own over a copy of W per image, and the im2col a kernel
 * of its own: RegNetY-800MF's inference 13.3 -> 8.8 ms. Against the
 * interpreter on 16 and 8 lanes, the input against an inaccessible page
 * at either end. */
Test(conv, grouped_convolutions_are_a_product_per_group)
{
	kiln_compiler_t *kc = new_compiler();
	kiln_compiler_t *k8 = avx2_compiler();
	bool wide = __builtin_cpu_supports("avx512f");
	/* implicit GEMM's packing loads a vector's lanes where they are
	 * consecutive in x (a row of 16 columns, at strides 1 and 2; rows of
	 * 8 running on at stride 1), else gathers them (rows of 6) */
	static const struct {
		int64_t C, H, G, S;
		const char *wide, *narrow; /* in the report, 16 and 8 lanes */
	} cs[] = {{32, 16, 2, 1, "in 2 groups K=144", "[2, 16, 512] K=[144]"},
		  {32, 32, 2, 2, "in 2 groups K=144", "[2, 16, 512] K=[144]"},
		  {64, 8, 4, 1, "in 4 groups K=144", "[4, 16, 128] K=[144]"},
		  {32, 6, 4, 1, "in 4 groups K=72", "[4, 8, 72] K=[72]"},
		  {32, 6, 2, 1, "[2, 16, 72] K=[144]", "[2, 16, 72] K=[144]"}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    grouped_conv_graph_s(cs[i].C, cs[i].H, 3, cs[i].G, cs[i].S);
		char what[96];
		snprintf(what, sizeof(what),
			 "3x3 conv, stride %lld, %lld groups of %lld, %lld²",
			 (long long)cs[i].S, (long long)cs[i].G,
			 (long long)(cs[i].C / cs[i].G), (long long)cs[i].H);
		if (wide)
			expect_report_has(kc, g, cs[i].wide, true, what);
		if (k8 != NULL)
			expect_report_has(k8, g, cs[i].narrow, true, what);
		match_everywhere(kc, g, 120 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	if (k8 != NULL)
		kiln_compiler_free(k8);
	kiln_compiler_free(kc);
}

/* A convolution_backward node (stride 1, padding pad, groups) of values
 * go, x and w, asking for all three gradients: grad_input of x4's shape,
 * grad_weight of w4's, grad_bias [w4[0]]. */
static void conv_bw_node(gb_t *b, uint32_t go, uint32_t x, uint32_t w,
			 const int64_t *x4, const int64_t *w4, int64_t pad,
			 int64_t groups)
{
	const int64_t b1[1] = {w4[0]};
	node_head(b, "aten.convolution_backward.default", 11);
	ref(b, go);
	ref(b, x);
	ref(b, w);
	msgpack_pack_array(&b->pk, 1);
	msgpack_pack_int64(&b->pk, w4[0]);
	conv_args_s1(b, pad, groups);
	msgpack_pack_array(&b->pk, 3);
	for (int i = 0; i < 3; i++)
		msgpack_pack_true(&b->pk);
	s(b, "out");
	msgpack_pack_array(&b->pk, 3);
	specn(b, "f32", x4, 4);
	specn(b, "f32", w4, 4);
	specn(b, "f32", b1, 1);
}

/* convolution_backward of a 3x3, padding 1 convolution x [N, C, H, H] ->
 * [N, O, H, H]: grad_input, grad_weight and grad_bias */
static kiln_graph_t *conv_bw_graph(int64_t N, int64_t C, int64_t O, int64_t H)
{
	gb_t b;
	const int64_t g4[4] = {N, O, H, H}, x4[4] = {N, C, H, H},
		      w4[4] = {O, C, 3, 3};
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", g4, 4);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	conv_bw_node(&b, 0, 1, 2, x4, w4, 1, 1);
	return end_graph(&b, 3, 3, "conv backward");
}

/* convolution_backward of a KxK, padding K/2 convolution of G groups
 * over x [2, C, H, H] -> [2, C, H, H] */
static kiln_graph_t *grouped_conv_bw_graph(int64_t C, int64_t H, int64_t G,
					   int64_t K)
{
	gb_t b;
	const int64_t x4[4] = {2, C, H, H}, w4[4] = {C, C / G, K, K};
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	conv_bw_node(&b, 0, 1, 2, x4, w4, K / 2, G);
	return end_graph(&b, 3, 3, "grouped conv backward");
}

/* The backward of a grouped convolution past the direct form's taps is
 * products per group, as the forward: grad_weight[g] = gO[g] (Og x
 * N·OH·OW) @ col[g]ᵀ, grad_input the col2im of W[g]ᵀ @ gO[g]. Before, both
 * were reductions over 7-d spaces, one dot product per element, which
 * took 76 of RegNetY-800MF's 89 ms backward (now 25 in all). A depthwise
 * one (a product of one row a group) keeps the direct forms: products
 * measured 2.8x slower there. All three gradients against the
 * interpreter. */
Test(conv, grouped_convolution_backward_is_a_product_per_group)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H, G, K;
		bool product;
	} cs[] = {
	    {32, 8, 2, 3, true}, {24, 5, 3, 3, true}, {16, 6, 16, 7, false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    grouped_conv_bw_graph(cs[i].C, cs[i].H, cs[i].G, cs[i].K);
		char what[96], direct[48];
		snprintf(
		    what, sizeof(what), "%lldx%lld conv backward, %lld groups",
		    (long long)cs[i].K, (long long)cs[i].K, (long long)cs[i].G);
		/* the direct grad_input's reduced (o, kh, kw) */
		snprintf(direct, sizeof(direct), "%lld*, %lld*, %lld*",
			 (long long)(cs[i].C / cs[i].G), (long long)cs[i].K,
			 (long long)cs[i].K);
		expect_report_has(kc, g, direct, !cs[i].product, what);
		expect_report_has(kc, g, "matmul", cs[i].product, what);
		expect_matches_interp(kc, g, "default", 130 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* convolution_backward (stride 1, every gradient) of x [N, C, H, W] by w
 * [O, C, KH, KW], padding p and dilation d */
typedef struct wgcase {
	int64_t N, C, H, W, O, KH, KW, p[2], d[2];
	bool direct; /* the direct weight gradient's kernel, by the heuristic */
	int64_t G;   /* groups */
} wgcase_t;

static kiln_graph_t *wgrad_graph(const wgcase_t *k)
{
	int64_t G = k->G;
	int64_t OH = k->H + 2 * k->p[0] - k->d[0] * (k->KH - 1);
	int64_t OW = k->W + 2 * k->p[1] - k->d[1] * (k->KW - 1);
	const int64_t g4[4] = {k->N, k->O, OH, OW},
		      x4[4] = {k->N, k->C, k->H, k->W},
		      w4[4] = {k->O, k->C / G, k->KH, k->KW}, b1[1] = {k->O},
		      one[2] = {1, 1}, zero[2] = {0, 0};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", g4, 4);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.convolution_backward.default", 11);
	ref(&b, 0);
	ref(&b, 1);
	ref(&b, 2);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, k->O);
	ints2(&b, one);
	ints2(&b, k->p);
	ints2(&b, k->d);
	msgpack_pack_false(&b.pk);
	ints2(&b, zero);
	msgpack_pack_int64(&b.pk, G);
	msgpack_pack_array(&b.pk, 3);
	for (int i = 0; i < 3; i++)
		msgpack_pack_true(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w4, 4);
	specn(&b, "f32", b1, 1);
	return end_graph(&b, 3, 3, "conv backward");
}

/* The direct weight gradient of a stride-1 convolution (ops_conv.c
 * bw_weight_direct, codegen.c gen_conv_wgrad_body: f32 on AVX-512, no
 * im2col) against the interpreter, all three gradients: 10 output
 * channels in blocks of 8 (the last block overlapping the first); 5x5
 * taps over rows of 30 (two vectors, the second's tail masked; blocks
 * of 4 channels over 5); no padding (every tap inside, W != OW);
 * dilation 2; a 1x7 and a 7x1 kernel (16 channels a block); 2 groups
 * of 8 channels, 4 groups of 5 output channels from 8 input channels
 * (blocks of 5 within each group). Where the heuristic leaves it (128
 * channels at 8², rows of 8 lanes in 16; groups of 2 output channels),
 * the other forms, which must agree too. Without AVX-512 none is direct. */
Test(conv, direct_weight_gradient_matches_the_interpreter, .timeout = 120)
{
	kiln_compiler_t *kc = new_compiler();
	bool avx = __builtin_cpu_supports("avx512f");
	static const wgcase_t cs[] = {
	    {2, 3, 16, 16, 10, 3, 3, {1, 1}, {1, 1}, true, 1},
	    {1, 4, 16, 30, 5, 5, 5, {2, 2}, {1, 1}, true, 1},
	    {2, 3, 18, 18, 8, 3, 3, {0, 0}, {1, 1}, true, 1},
	    {2, 3, 24, 24, 6, 3, 3, {2, 2}, {2, 2}, true, 1},
	    {2, 3, 16, 32, 16, 1, 7, {0, 3}, {1, 1}, true, 1},
	    {2, 3, 22, 16, 16, 7, 1, {3, 0}, {1, 1}, true, 1},
	    {2, 16, 8, 8, 128, 3, 3, {1, 1}, {1, 1}, false, 1},
	    {2, 16, 32, 32, 16, 3, 3, {1, 1}, {1, 1}, true, 2},
	    {2, 32, 16, 24, 20, 3, 3, {1, 1}, {1, 1}, true, 4},
	    {2, 16, 16, 16, 16, 3, 3, {1, 1}, {1, 1}, false, 8},
	};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g = wgrad_graph(&cs[i]);
		char what[96];
		snprintf(what, sizeof(what),
			 "%lldx%lld conv backward %zu, [%lld, %lld, %lld, "
			 "%lld] -> %lld",
			 (long long)cs[i].KH, (long long)cs[i].KW, i,
			 (long long)cs[i].N, (long long)cs[i].C,
			 (long long)cs[i].H, (long long)cs[i].W,
			 (long long)cs[i].O);
		expect_report_has(kc, g, "weight gradient, direct",
				  avx && cs[i].direct, what);
		expect_matches_interp(kc, g, "default", 140 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A spec {dtype, shape, strides} of rank 4. */
static void spec4_strided(gb_t *b, const int64_t *d, const int64_t *st)
{
	spec_strided(b, d, st, 4);
}

/* permute(t, [0, 3, 1, 2]) of input t [N, H, W, C]: the [N, C, H, W] view
 * with channels-last strides (node `at` of a graph being built). */
static void nhwc_to_nchw(gb_t *b, uint32_t t, int64_t N, int64_t C, int64_t H,
			 int64_t W)
{
	const int64_t d[4] = {N, C, H, W}, st[4] = {H * W * C, 1, W * C, C};
	node_head(b, "aten.permute.default", 2);
	ref(b, t);
	msgpack_pack_array(&b->pk, 4);
	msgpack_pack_int64(&b->pk, 0);
	msgpack_pack_int64(&b->pk, 3);
	msgpack_pack_int64(&b->pk, 1);
	msgpack_pack_int64(&b->pk, 2);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	spec4_strided(b, d, st);
}

/* convolution_backward of a 7x7, padding 3 depthwise convolution of C
 * channels over x [2, C, H, H] given channels-last (a permuted [2, H, H,
 * C] input), with grad_output [2, C, H, H] contiguous or channels-last
 * (go_cl) */
static kiln_graph_t *dw_bw_graph(int64_t C, int64_t H, bool go_cl)
{
	gb_t b;
	const int64_t g4[4] = {2, C, H, H}, nhwc[4] = {2, H, H, C},
		      w4[4] = {C, 1, 7, 7};
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", go_cl ? nhwc : g4, 4);
	specn(&b, "f32", nhwc, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, go_cl ? 3 : 2);
	nhwc_to_nchw(&b, 1, 2, C, H, H); /* value 3 */
	if (go_cl)
		nhwc_to_nchw(&b, 0, 2, C, H, H); /* value 4 */
	conv_bw_node(&b, go_cl ? 4 : 0, 3, 2, g4, w4, 3, C);
	return end_graph(&b, go_cl ? 5 : 4, 3, "depthwise conv backward");
}

/* A depthwise convolution's weight gradient over a channels-last input
 * sums with the channels as the vector ([7, 7, N*, H*, W*, C]: x and
 * grad_output read contiguously, grad_output made channels-last first
 * where it is not; ops_conv.c bw_weight_depthwise_cl) instead of along W
 * (a gather a vector there: ConvNeXt-nano's backward 39 -> 7 ms); under
 * 16 channels it keeps the form along W. All three gradients against the
 * interpreter. */
Test(conv, depthwise_weight_gradient_of_channels_last_runs_along_channels)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H;
		bool go_cl;
		const char *dims;
		bool cl;
	} cs[] = {{32, 12, false, "[7, 7, 2*, 12*, 12*, 32]", true},
		  {48, 8, true, "[7, 7, 2*, 8*, 8*, 48]", true},
		  {8, 12, false, "[8, 1, 7, 7, 2*, 12*, 12*]", false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g = dw_bw_graph(cs[i].C, cs[i].H, cs[i].go_cl);
		char what[96];
		snprintf(what, sizeof(what),
			 "7x7 depthwise backward, %lld channels-last "
			 "channels at %lld², grad_output %s",
			 (long long)cs[i].C, (long long)cs[i].H,
			 cs[i].go_cl ? "channels-last" : "contiguous");
		expect_report_has(kc, g, cs[i].dims, true, what);
		expect_matches_interp(kc, g, "default", 120 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A depthwise convolution's input gradient whose grad_output is
 * channels-last, where the direct form along W is not taken (7x7 over
 * rows that are not a multiple of 4 columns): a sum over [N, H, W, KH*,
 * KW*, C], the channels the vector (ops_conv.c bw_input_depthwise_cl),
 * in place of the direct form along W, whose rows end in scalar lanes
 * (7x7 over [8, 384, 7²] channels-last: 1.42 -> 0.45 ms the backward, at
 * [8, 192, 14²] 2.7 -> 0.96). With grad_output contiguous, or rows of a
 * multiple of 4, the direct form stays. All three gradients against the
 * interpreter, on 16 and 8 lanes. */
Test(conv, depthwise_input_gradient_of_channels_last_runs_along_channels)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H;
		bool go_cl, cl;
	} cs[] = {{32, 7, true, true},
		  {32, 10, true, true},
		  {32, 7, false, false},
		  {32, 8, true, false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g = dw_bw_graph(cs[i].C, cs[i].H, cs[i].go_cl);
		char what[96], dims[64];
		snprintf(what, sizeof(what),
			 "7x7 depthwise backward, %lld channels at %lld², "
			 "grad_output %s",
			 (long long)cs[i].C, (long long)cs[i].H,
			 cs[i].go_cl ? "channels-last" : "contiguous");
		snprintf(dims, sizeof(dims), "[2, %lld, %lld, 7*, 7*, %lld]",
			 (long long)cs[i].H, (long long)cs[i].H,
			 (long long)cs[i].C);
		expect_report_has(kc, g, dims, cs[i].cl, what);
		match_everywhere(kc, g, 140 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* convolution_backward of a 1x1 convolution whose grad_output is g * x,
 * with x the convolution's input given channels-last (a permuted [2, H,
 * H, C] input) when x_cl, else contiguous, and g contiguous */
static kiln_graph_t *bias_bw_graph(int64_t C, int64_t H, bool x_cl)
{
	gb_t b;
	const int64_t g4[4] = {2, C, H, H}, nhwc[4] = {2, H, H, C},
		      w4[4] = {C, C, 1, 1};
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", g4, 4);
	specn(&b, "f32", x_cl ? nhwc : g4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, x_cl ? 3 : 2);
	if (x_cl)
		nhwc_to_nchw(&b, 1, 2, C, H, H); /* value 3 */
	uint32_t x = x_cl ? 3 : 1, go = x_cl ? 4 : 3;
	node_head(&b, "aten.mul.Tensor", 2);
	ref(&b, 0);
	ref(&b, x);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", g4, 4);
	conv_bw_node(&b, go, x, 2, g4, w4, 0, 1);
	return end_graph(&b, go + 1, 3, "conv backward, grad_output g * x");
}

/* A convolution's grad_bias (the sum over N, H, W of grad_output) runs
 * with the channels as vectors ([2*, H*, W*, C]) where grad_output reads
 * channels-last data at least as often as data contiguous along W
 * (ConvNeXt's GELU backward over its saved channels-last activations:
 * its 17 such sums 24 -> 8 ms a training step), and along W otherwise (here g
 * * x with x contiguous; a per-channel parameter does not count). All
 * three gradients against the interpreter. */
Test(conv, bias_gradient_of_channels_last_reads_runs_along_channels)
{
	kiln_compiler_t *kc = new_compiler();
	for (int x_cl = 0; x_cl < 2; x_cl++) {
		kiln_graph_t *g = bias_bw_graph(32, 8, x_cl);
		const char *what = x_cl ? "grad_bias of g * x, x channels-last"
					: "grad_bias of g * x, x contiguous";
		expect_report_has(kc, g, "row kernel [2*, 8*, 8*, 32]", x_cl,
				  what);
		expect_report_has(kc, g, "row kernel [2*, 32, 8*, 8*]", !x_cl,
				  what);
		expect_matches_interp(kc, g, "default", 130 + x_cl, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* The gradients of a batch of small images (under 128 output positions
 * each) are one product each over the batch's positions:
 * - grad_weight, whose K is every image's output positions ([O,
 *   N·OH·OW] @ [N·OH·OW, C·KH·KW]), where a product per image would make
 *   [N, O, C·KH·KW] of at least 2^18 elements (ResNet-50's late layers:
 *   K = 16 a product before); smaller ones keep the product per image;
 * - grad_input, Wᵀ [C·KH·KW, O] @ gO [O, N·OH·OW] read back through a
 *   view (ConvNeXt-nano's 640 -> 2560 at 4², batch 8: 8 products of 16
 *   columns, Wᵀ packed for each, took 5.5 ms).
 * Larger images keep a product per image. Against the interpreter. (With
 * 32 or fewer output channels the weight gradient is computed transposed,
 * col @ gOᵀ: ops_conv.c bw_weight_swap.) */
Test(conv, small_images_gradients_are_one_product_each)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t N, C, O, H;
		const char *gw, *gi;
	} cs[] = {
	    {4, 64, 128, 8, "[128, 576] K=[256]", "[576, 256] K=[128]"},
	    {2, 8, 16, 8, "[2, 72, 16] K=[64]", "[72, 128] K=[16]"},
	    {2, 16, 32, 12, "[2, 144, 32] K=[144]", "[2, 144, 144] K=[32]"}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    conv_bw_graph(cs[i].N, cs[i].C, cs[i].O, cs[i].H);
		char what[64];
		snprintf(
		    what, sizeof(what), "conv backward [%lld, %lld, %lld²]",
		    (long long)cs[i].N, (long long)cs[i].C, (long long)cs[i].H);
		expect_report_has(kc, g, cs[i].gw, true, what);
		expect_report_has(kc, g, cs[i].gi, true, what);
		expect_matches_interp(kc, g, "default", 60 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* convolution_backward of a 1x1 convolution x [2, C, H, W] -> [2, O, H,
 * W] with x given channels-last (a permuted [2, H, W, C] input) and
 * grad_output g [2, O, H, W] contiguous; grad_input declared
 * channels-last (cl) or contiguous. */
static kiln_graph_t *pw_bw_graph(int64_t C, int64_t O, int64_t H, int64_t W,
				 bool cl)
{
	gb_t b;
	const int64_t g4[4] = {2, O, H, W}, nhwc[4] = {2, H, W, C},
		      x4[4] = {2, C, H, W}, w4[4] = {O, C, 1, 1}, b1[1] = {O};
	const int64_t xcl[4] = {H * W * C, 1, W * C, C},
		      xco[4] = {C * H * W, H * W, W, 1};
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, "f32", g4, 4);
	specn(&b, "f32", nhwc, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	nhwc_to_nchw(&b, 1, 2, C, H, W); /* value 3 */
	node_head(&b, "aten.convolution_backward.default", 11);
	ref(&b, 0);
	ref(&b, 3);
	ref(&b, 2);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, O);
	conv_args_s1(&b, 0, 1);
	msgpack_pack_array(&b.pk, 3);
	for (int i = 0; i < 3; i++)
		msgpack_pack_true(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	spec4_strided(&b, x4, cl ? xcl : xco);
	specn(&b, "f32", w4, 4);
	specn(&b, "f32", b1, 1);
	return end_graph(&b, 4, 3, "1x1 conv backward");
}

/* The backward of a 1x1 convolution over a channels-last input whose
 * grad_input the graph declares channels-last is two products over every
 * position, grad_output made channels-last first: grad_input [N·H·W, C] =
 * gO @ W, written channels-last, and grad_weight [O, C] = gOᵀ @ x with K =
 * N·H·W (ConvNeXt-nano's backward 299 -> 226 kernels, its training step
 * 156-160 -> 137-138 ms); grad_bias then sums gO with the channels as
 * vectors. Declared contiguous, it keeps the NCHW form (a product per
 * image). All three gradients against the interpreter. */
Test(conv, channels_last_pointwise_backward_is_two_products)
{
	kiln_compiler_t *kc = new_compiler();
	for (int cl = 0; cl < 2; cl++) {
		kiln_graph_t *g = pw_bw_graph(64, 48, 8, 16, cl);
		const char *what = cl ? "1x1 backward, grad_input channels-last"
				      : "1x1 backward, grad_input contiguous";
		expect_report_has(kc, g, "[256, 64] K=[48]", cl, what);
		expect_report_has(kc, g, "[48, 64] K=[256]", cl, what);
		expect_report_has(kc, g, "row kernel [2*, 8*, 16*, 48]", cl,
				  what);
		expect_matches_interp(kc, g, "default", 150 + cl, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A channels-last block: x [2, H, W, C] permuted to [2, C, H, W] (a
 * channels-last view), y = conv1x1(x; w1 [O, C], b1) and z =
 * depthwise 7x7 (padding 3) of y (wd [O, 1, 7, 7], bd), both outputs,
 * declared channels-last (cl) or contiguous. */
static kiln_graph_t *cl_block_graph(int64_t C, int64_t O, int64_t H, int64_t W,
				    bool cl)
{
	gb_t b;
	const int64_t x4[4] = {2, H, W, C}, w1[4] = {O, C, 1, 1}, b1[1] = {O},
		      wd[4] = {O, 1, 7, 7}, y4[4] = {2, O, H, W};
	const int64_t ycl[4] = {H * W * O, 1, W * O, O},
		      yco[4] = {O * H * W, H * W, W, 1};
	gb_init(&b);
	graph_head(&b, 5);
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", w1, 4);
	specn(&b, "f32", b1, 1);
	specn(&b, "f32", wd, 4);
	specn(&b, "f32", b1, 1);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	nhwc_to_nchw(&b, 0, 2, C, H, W);	      /* value 5 */
	node_head(&b, "aten.convolution.default", 9); /* value 6 */
	ref(&b, 5);
	ref(&b, 1);
	ref(&b, 2);
	conv_args_s1(&b, 0, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec4_strided(&b, y4, cl ? ycl : yco);
	node_head(&b, "aten.convolution.default", 9); /* value 7 */
	ref(&b, 6);
	ref(&b, 3);
	ref(&b, 4);
	conv_args_s1(&b, 3, O);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec4_strided(&b, y4, cl ? ycl : yco);
	return end_graph(&b, 6, 2, "channels-last block");
}

/* Where a graph hands back channels-last activations (a training forward
 * saving them for the backward, the model run channels-last), a 1x1
 * convolution is one product over every position, [N·H·W, C] @ Wᵀ, and a
 * depthwise one sums its taps with the channels as the vector ([N, H, W,
 * 7*, 7*, C]), both writing channels-last: no transposing copy of any
 * output (ConvNeXt-nano's training forward 47-49 -> 43-45 ms). The
 * depthwise kernel's padding test is the same in every lane: it reads
 * whole rows from x or from a zeroed block, with no masked load (4x slower
 * on a Zen 5 where the masked-off addresses met lines just written).
 * Declared contiguous, the same graph keeps the NCHW forms. Against the
 * interpreter. */
Test(conv, channels_last_graphs_compute_convolutions_channels_last)
{
	kiln_compiler_t *kc = new_compiler();
	for (int cl = 0; cl < 2; cl++) {
		kiln_graph_t *g = cl_block_graph(64, 48, 8, 12, cl);
		const char *what = cl ? "1x1 + depthwise, channels-last"
				      : "1x1 + depthwise, contiguous";
		expect_report_has(kc, g, "[192, 48] K=[64]", cl, what);
		expect_report_has(kc, g, "row kernel [2, 8, 12, 7*, 7*, 48]",
				  cl, what);
		expect_report_has(kc, g, "1*, 7*, 7*, 8, 12]", !cl, what);
		expect_report_has(kc, g, "through tiles", false, what);
		if (cl) {
			char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
			cr_assert(ir != NULL);
			cr_expect(strstr(ir, "llvm.masked.load") == NULL,
				  "%s: a masked load", what);
			free(ir);
		}
		expect_matches_interp(kc, g, "default", 140 + cl, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* DenseNet's layer: relu(cat([a, b, c], 1)) into a 1x1 convolution over
 * [2, 32, 4, 4] (the im2col realizes the concatenation, each input's load
 * guarded by its channel range). Without padding the window test is known
 * true from the variables' ranges and is dropped, so each guard is the
 * channel test alone, the same in every lane: plain loads from the input
 * or a zeroed block, no masked load. With 25 inputs, the masked loads of
 * the inputs a channel is not in had read far outside them at about 100
 * cycles each (a microcode assist, by the cost; a Zen 4): DenseNet-121's
 * transition im2col 6.6 -> 0.13 ms,
 * its inference graph (batch 2, 64²) 115 -> 13 ms. Against the
 * interpreter. */
Test(conv, a_1x1_convolution_over_a_concatenation_loads_without_masks)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	const int64_t a4[4] = {2, 8, 4, 4}, b4[4] = {2, 16, 4, 4},
		      w4[4] = {24, 32, 1, 1}, cat4[4] = {2, 32, 4, 4},
		      y4[4] = {2, 24, 4, 4};
	gb_init(&b);
	graph_head(&b, 4);
	specn(&b, "f32", a4, 4);
	specn(&b, "f32", b4, 4);
	specn(&b, "f32", a4, 4);
	specn(&b, "f32", w4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	node_head(&b, "aten.cat.default", 2); /* value 4 */
	msgpack_pack_array(&b.pk, 3);
	ref(&b, 0);
	ref(&b, 1);
	ref(&b, 2);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", cat4, 4);
	node_head(&b, "aten.relu.default", 1); /* value 5 */
	ref(&b, 4);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", cat4, 4);
	node_head(&b, "aten.convolution.default", 9); /* value 6 */
	ref(&b, 5);
	ref(&b, 3);
	msgpack_pack_nil(&b.pk);
	conv_args_s1(&b, 0, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", y4, 4);
	kiln_graph_t *g = end_graph(&b, 6, 1, "cat, relu, 1x1 convolution");
	cr_assert(g != NULL);
	char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
	cr_assert(ir != NULL);
	cr_expect(strstr(ir, "llvm.masked.load") == NULL,
		  "a masked load in the concatenation's im2col");
	free(ir);
	expect_matches_interp(kc, g, "default", 160, 1e-4,
			      "cat, relu, 1x1 convolution");
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

/* A small convolution (Cg·KH·KW <= 32) with groups 1 takes the direct
 * form only at stride 1 along W and where it is 1x1 over at most 16
 * channels or makes at most 16384 outputs (ops_conv.c direct_ok): at a
 * stride every vector load of the direct form is a gather (3->32 3x3
 * stride 2 at 224²: 3.1-5.1 ms against 0.40-0.46 as a product). Against
 * the interpreter, and the report has no reduction over (c, kh, kw). */
Test(conv, small_strided_convolution_is_a_product)
{
	kiln_compiler_t *kc = new_compiler();
	static const convcase_t cases[] = {
	    /* stride 2: a product */
	    {"f32", 1, 3, 40, 40, 16, 3, {2, 2}, {1, 1}, {1, 1}, false, false},
	    /* 3x3 at stride 1, 16 x 40 x 40 outputs: a product */
	    {"f32", 1, 3, 40, 40, 16, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	    /* 8 x 10 x 10 outputs: direct */
	    {"f32", 1, 3, 10, 10, 8, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *rep = NULL;
		check_conv_case(kc, &cases[i], "default", &rep);
		bool direct = strstr(rep, "3*, 3*, 3*") != NULL;
		cr_expect_eq(direct, i == 2, "case %zu:\n%s", i, rep);
		free(rep);
	}
	kiln_compiler_free(kc);
}

/* y = op(a) @ op(b), op a transpose where asked: [batch,] m x k @ k x n */
static kiln_graph_t *mm_t_graph(int64_t batch, int64_t m, int64_t k, int64_t n,
				bool at, bool bt)
{
	gb_t b;
	gb_init(&b);
	uint32_t r = batch ? 3 : 2;
	int64_t ad[3], bd[3], yd[3], atd[3], btd[3];
	uint32_t o = 0;
	if (batch)
		ad[0] = bd[0] = yd[0] = atd[0] = btd[0] = batch, o = 1;
	ad[o] = at ? k : m, ad[o + 1] = at ? m : k;
	bd[o] = bt ? n : k, bd[o + 1] = bt ? k : n;
	atd[o] = m, atd[o + 1] = k;
	btd[o] = k, btd[o + 1] = n;
	yd[o] = m, yd[o + 1] = n;
	graph_head(&b, 2);
	specn(&b, "f32", ad, r);
	specn(&b, "f32", bd, r);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1 + at + bt);
	uint32_t va = 0, vb = 1, v = 2;
	for (int t = 0; t < 2; t++) {
		if (!(t ? bt : at))
			continue;
		node_head(&b, "aten.transpose.int", 3);
		ref(&b, t ? 1 : 0);
		msgpack_pack_int64(&b.pk, -1);
		msgpack_pack_int64(&b.pk, -2);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", t ? btd : atd, r);
		*(t ? &vb : &va) = v++;
	}
	node_head(&b, batch ? "aten.bmm.default" : "aten.mm.default", 2);
	ref(&b, va);
	ref(&b, vb);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", yd, r);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, v);
	kiln_graph_t *g = graph_from_json_like("mm", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

/* A product with one row (M = 1: a classifier at batch 1, B row-major or
 * a transposed weight), one column (N = 1, A row-major) or K = 1 is a
 * reduction kernel, not a BLAS call (ops_gemm.c gemv_ok: sgemm packs the
 * whole weight for one row: MobileNetV2's classifier 0.48 -> 0.12 ms);
 * N = 1 with a transposed A stays with BLAS. Against the interpreter. */
Test(fusion, matrix_vector_products_are_reductions)
{
	kiln_compiler_t *kc = new_compiler();
	/* the heuristic as with AVX-512 BLAS (small_products_are_...) */
	kiln__compiler_set_blas_avx512(kc, true);
	static const struct {
		int64_t batch, m, k, n;
		bool at, bt, blas;
	} cases[] = {
	    {0, 1, 300, 77, false, false, false},
	    {0, 1, 300, 77, false, true, false},
	    {0, 50, 300, 1, false, false, false},
	    {0, 50, 300, 1, true, false, true},
	    {0, 50, 1, 60, false, false, false},
	    {3, 1, 37, 5, false, false, false},
	    {3, 1, 37, 5, false, true, false},
	    {3, 7, 37, 1, false, false, false},
	    {0, 1, 1, 1, false, false, false},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kiln_graph_t *g =
		    mm_t_graph(cases[i].batch, cases[i].m, cases[i].k,
			       cases[i].n, cases[i].at, cases[i].bt);
		char *rep;
		n_kernels(kc, g, &rep);
		bool blas = strstr(rep, "matmul via BLAS") != NULL;
		cr_expect_eq(blas, cases[i].blas, "case %zu:\n%s", i, rep);
		free(rep);
		char what[64];
		snprintf(what, sizeof(what), "mm case %zu", i);
		expect_matches_interp(kc, g, "default", 3 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* Where BLAS runs pre-AVX-512 kernels, a small f32 product (under the
 * template's 2^21 multiply-adds) with B contiguous along N is a reduction
 * kernel vectorized across N too (ops_gemm.c small_ok: no BLAS call,
 * packing or threading; GPT-2's corpus backward 0.18-0.21 -> 0.14 ms); a
 * transposed B stays BLAS's, and with AVX-512 BLAS all do. Rows and
 * columns that leave partial blocks of 64 and 16 lanes, a batch, and A
 * transposed (read one element a k). Against the interpreter. */
Test(fusion, small_products_are_reductions_where_blas_is_pre_avx512)
{
	if (!__builtin_cpu_supports("avx512f"))
		cr_skip_test("no AVX-512: small products are BLAS's");
	kiln_compiler_t *kc = new_compiler();
	if (strstr(kiln_compiler_fingerprint(kc), "blas/none") != NULL) {
		kiln_compiler_free(kc);
		cr_skip_test("no BLAS library here");
	}
	static const struct {
		int64_t batch, m, k, n;
		bool at, bt;
	} cases[] = {
	    {0, 32, 64, 256, false, false}, {0, 37, 50, 100, true, false},
	    {8, 16, 16, 16, false, false},  {3, 9, 40, 70, false, false},
	    {0, 32, 64, 256, false, true},
	};
	for (int avx512 = 1; avx512 >= 0; avx512--) {
		kiln__compiler_set_blas_avx512(kc, avx512 != 0);
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			kiln_graph_t *g =
			    mm_t_graph(cases[i].batch, cases[i].m, cases[i].k,
				       cases[i].n, cases[i].at, cases[i].bt);
			char *rep;
			n_kernels(kc, g, &rep);
			bool blas = strstr(rep, "matmul via BLAS") != NULL;
			cr_expect_eq(blas, avx512 || cases[i].bt,
				     "avx512 %d case %zu:\n%s", avx512, i, rep);
			free(rep);
			char what[64];
			snprintf(what, sizeof(what), "small mm %zu, avx512 %d",
				 i, avx512);
			expect_matches_interp(kc, g, "default", 71 + i, 1e-4,
					      what);
			kiln_graph_free(g);
		}
	}
	kiln_compiler_free(kc);
}

Test(conv, tiled_template_matches_the_interpreter)
{
	kiln_compiler_t *kc = new_compiler();
	/* the tiled forms on few output channels: not the direct one */
	kiln__compiler_set_conv_direct(kc, false);
	static const convcase_t cases[] = {
	    /* 5x5, padding 2: tiles of 8 rows over 20 (8, 8, 4) */
	    {"f32", 3, 16, 20, 40, 5, 5, {1, 1}, {2, 2}, {1, 1}, false, false},
	    /* stride 2, dilation 2 along W, uneven padding: gathers */
	    {"f32", 4, 32, 30, 70, 6, 3, {2, 2}, {1, 2}, {1, 2}, false, false},
	    /* an input with stride H along W */
	    {"f32", 3, 16, 20, 40, 5, 5, {1, 1}, {2, 2}, {1, 1}, true, false},
	    {"f64", 3, 16, 20, 40, 5, 5, {1, 1}, {2, 2}, {1, 1}, false, false},
	};
	static const char *const want[] = {"im2col tiles"};
	check_conv_cases(kc, cases, sizeof(cases) / sizeof(cases[0]), want, 1);
	kiln_compiler_free(kc);
}

/* The GEMM template (codegen.c tgemm, the tiled template's product on
 * f32 with 16-lane vectors): a last block of 8 rows that overlaps the
 * one before it (O = 13, 70), fewer rows than one block (O = 6), tiles
 * whose columns are no multiple of its 32 (37·rows, 175), K = 315, 180
 * and 45, stride 2. On a target without AVX-512 the product is BLAS's,
 * which must agree too. */
Test(conv, gemm_template_matches_the_interpreter)
{
	kiln_compiler_t *kc = new_compiler();
	/* the tiled forms on few output channels: not the direct one */
	kiln__compiler_set_conv_direct(kc, false);
	static const convcase_t cases[] = {
	    {"f32", 3, 35, 24, 37, 13, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	    {"f32", 8, 20, 9, 70, 70, 3, {2, 2}, {1, 1}, {1, 1}, false, false},
	    {"f32", 9, 5, 40, 40, 6, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	};
	const char *want[] = {"im2col tiles",
			      __builtin_cpu_supports("avx512f")
				  ? "GEMM template (8x32 register tiles)"
				  : "BLAS sgemm"};
	check_conv_cases(kc, cases, sizeof(cases) / sizeof(cases[0]), want, 2);
	kiln_compiler_free(kc);
}

/* The GEMM template's tiles take the output rows that waste the fewest of
 * its 32-column register tiles (ops_conv.c conv_tile_rows_tmpl): ResNet's
 * 128 -> 128 3x3 at 28² (K = 1152) in tiles of 8 rows, 224 columns in 7
 * panels and 1008 KiB, where tiles of 4 rows (the most in 512 KiB) had 112
 * columns in 4; a 56-wide image keeps 4 rows (224 columns in 504 KiB).
 * Two images of 16² (U-Net's 128 -> 64) take tiles of 4 rows, 8 units of
 * 64 columns (conv_tile_rows_units), where 7 rows made 6 units and the
 * whole-image im2col and BLAS took them. Against the interpreter, with 16
 * output channels (64 at 16²). */
Test(conv, template_tiles_fill_the_register_tiles_columns, .timeout = 120)
{
	kiln_compiler_t *kc = new_compiler();
	/* the tiled forms on few output channels: not the direct one */
	kiln__compiler_set_conv_direct(kc, false);
	bool tmpl = __builtin_cpu_supports("avx512f");
	static const convcase_t c28[] = {
	    {"f32",
	     2,
	     128,
	     28,
	     28,
	     16,
	     3,
	     {1, 1},
	     {1, 1},
	     {1, 1},
	     false,
	     false},
	};
	static const convcase_t c56[] = {
	    {"f32", 2, 64, 56, 56, 16, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	};
	static const convcase_t c16[] = {
	    {"f32",
	     2,
	     128,
	     16,
	     16,
	     64,
	     3,
	     {1, 1},
	     {1, 1},
	     {1, 1},
	     false,
	     false},
	};
	const char *w28[] = {tmpl ? "tiles of 8 output rows (224 columns"
				  : "im2col tiles"};
	const char *w56[] = {tmpl ? "tiles of 4 output rows (224 columns"
				  : "im2col tiles"};
	const char *w16[] = {tmpl ? "tiles of 4 output rows (64 columns"
				  : "matmul via BLAS"};
	check_conv_cases(kc, c28, 1, w28, 1);
	check_conv_cases(kc, c56, 1, w56, 1);
	check_conv_cases(kc, c16, 1, w16, 1);
	kiln_compiler_free(kc);
}

/* The direct forward of a stride-1 convolution of few output channels
 * (ops_conv.c conv_fdirect, codegen.c gen_conv_fdirect_body: f32 on
 * AVX-512, no im2col) against the interpreter: 16 channels in blocks of 6
 * (a last block of 4, its own variant) with the batch_norm-like epilogue
 * fused; rows of two vectors, two rows a unit (a row in the padding reads
 * the zero row) and 10 channels; 5x5 over 16², four rows a unit; dilation
 * 2 (rows of 24: a half-masked second vector); no padding; an input
 * permuted to [N, C, H, W] (copied first). Where the heuristic leaves it
 * (20 output channels; 3 input channels, 27 taps in all; f64) the other
 * forms, which must agree too. Without AVX-512 none is direct. */
Test(conv, direct_forward_of_few_channels_matches_the_interpreter,
     .timeout = 120)
{
	kiln_compiler_t *kc = new_compiler();
	bool avx = __builtin_cpu_supports("avx512f");
	static const struct {
		convcase_t cc;
		bool direct;
	} cs[] = {
	    {{"f32", 2, 8, 64, 64, 16, 3, {1, 1}, {1, 1}, {1, 1}, false, true},
	     true},
	    {{"f32",
	      2,
	      16,
	      32,
	      32,
	      10,
	      3,
	      {1, 1},
	      {1, 1},
	      {1, 1},
	      false,
	      false},
	     true},
	    {{"f32", 1, 4, 16, 16, 8, 5, {1, 1}, {2, 2}, {1, 1}, false, false},
	     true},
	    {{"f32", 2, 8, 24, 24, 12, 3, {1, 1}, {2, 2}, {2, 2}, false, false},
	     true},
	    {{"f32", 2, 8, 18, 18, 16, 3, {1, 1}, {0, 0}, {1, 1}, false, false},
	     true},
	    {{"f32", 2, 8, 32, 32, 16, 3, {1, 1}, {1, 1}, {1, 1}, true, false},
	     true},
	    {{"f32", 2, 8, 32, 32, 20, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	     false},
	    {{"f32", 2, 3, 32, 32, 16, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	     false},
	    {{"f64", 2, 8, 32, 32, 16, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	     false},
	};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		char *rep = NULL;
		check_conv_case(kc, &cs[i].cc, "default", &rep);
		cr_expect_eq(strstr(rep, "convolution, direct") != NULL,
			     avx && cs[i].direct, "case %zu:\n%s", i, rep);
		if (avx && cs[i].direct && cs[i].cc.epilogue)
			cr_expect(strstr(rep, "epilogue") != NULL, "%s", rep);
		free(rep);
	}
	kiln_compiler_free(kc);
}

/* Implicit GEMM (ops_conv.c conv_implicit, codegen.c
 * gen_conv_implicit_body: f32 with AVX-512, where a batched or
 * whole-image im2col would be built and N·OH·OW makes 4 units of columns
 * or more) against the interpreter: C·K·K of 576 (a second block of K,
 * 64 rows), 784 columns in four units and a last panel of 16, O = 40;
 * O = 9, 10 and 12 (micro-panels that repeat their last row); stride 2,
 * dilation 2 along W and uneven padding (lanes in the padding on every side);
 * an input with stride H along W; the kernel after it (not an epilogue: it
 * reads the product permuted); one image of 30x30 (the whole-image form's
 * place). Under 4 units (5 images of 6x6) and in f64 the im2col buffer and BLAS
 * remain. Without AVX-512 every case is im2col and BLAS, which must agree too.
 */
Test(conv, implicit_gemm_matches_the_interpreter)
{
	kiln_compiler_t *kc = new_compiler();
	static const convcase_t cases[] = {
	    {"f32", 16, 64, 7, 7, 40, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	    {"f32", 24, 8, 13, 11, 9, 3, {2, 2}, {1, 2}, {1, 2}, false, false},
	    {"f32", 10, 16, 9, 9, 10, 3, {1, 1}, {1, 1}, {1, 1}, true, false},
	    {"f32", 13, 16, 8, 8, 12, 3, {1, 1}, {1, 1}, {1, 1}, false, true},
	    {"f32", 1, 16, 30, 30, 20, 3, {1, 1}, {1, 1}, {1, 1}, false, false},
	};
	const char *want[] = {__builtin_cpu_supports("avx512f")
				  ? "convolution as implicit GEMM"
				  : "matmul via BLAS sgemm"};
	check_conv_cases(kc, cases, sizeof(cases) / sizeof(cases[0]), want, 1);
	static const convcase_t few[] = {
	    {"f32", 5, 8, 13, 11, 9, 3, {2, 2}, {1, 2}, {1, 2}, false, false},
	    {"f64", 24, 8, 13, 11, 9, 3, {2, 2}, {1, 2}, {1, 2}, false, false},
	};
	const char *want_few[] = {"pointwise kernel [8, 3, 3,",
				  "matmul via BLAS"};
	check_conv_cases(kc, few, 2, want_few, 2);
	kiln_compiler_free(kc);
}

/* The pointwise kernel after a tiled convolution (a per-channel scale,
 * a residual add and relu: what eval batchnorm, a ResNet block's
 * shortcut and its activation lower to) becomes its epilogue, run on
 * each tile right after its product: one step, the same values as the
 * interpreter, with the GEMM template and with BLAS (f64), over tiles
 * whose last one is short and rows of O that end mid-block; and with
 * KILN_NOFUSE set it stays a step of its own. */
Test(conv, epilogue_runs_on_each_tile)
{
	kiln_compiler_t *kc = new_compiler();
	/* the tiled forms on few output channels: not the direct one */
	kiln__compiler_set_conv_direct(kc, false);
	static const convcase_t cases[] = {
	    {"f32", 3, 16, 20, 40, 13, 5, {1, 1}, {2, 2}, {1, 1}, false, true},
	    {"f64", 3, 16, 20, 40, 13, 5, {1, 1}, {2, 2}, {1, 1}, false, true},
	};
	static const char *const want[] = {
	    "im2col tiles", "epilogue kiln_k1 on each tile", "run by kiln_k0"};
	check_conv_cases(kc, cases, sizeof(cases) / sizeof(cases[0]), want, 3);
	/* criterion runs each test in a process of its own */
	setenv("KILN_NOFUSE", "1", 1);
	char *rep = NULL;
	check_conv_case(kc, &cases[0], "default", &rep);
	cr_expect(strstr(rep, "epilogue") == NULL, "%s", rep);
	cr_expect(strstr(rep, "kiln_k1: pointwise kernel") != NULL, "%s", rep);
	free(rep);
	unsetenv("KILN_NOFUSE");
	kiln_compiler_free(kc);
}

/* mode "max-autotune": a product with a choice (one row block, 1024
 * columns: BLAS on row blocks alone or on row and column blocks, or the
 * GEMM template with AVX-512) and a convolution (tiled with the GEMM
 * template or BLAS, or whole-image im2col) are timed every way, the
 * report says which won and by how much, the artifact computes the same
 * values as the interpreter, and a second compile of the same shapes
 * reuses the decision (the same text, times included). */
static char *tuned_report(kiln_compiler_t *kc, const kiln_graph_t *g)
{
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	strcpy(opts.mode, "max-autotune");
	char *text = NULL;
	int rc = kiln_compile_ex(kc, g, &opts, NULL, &text, KILN_EMIT_KERNELS,
				 NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "compile: %s", err);
	return text;
}

Test(autotune, products_and_convolutions_are_chosen_by_measurement,
     .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	/* the heuristic as with AVX-512 BLAS: with an older one a product
	 * this small is a reduction (small_products_are_reductions_...) */
	kiln__compiler_set_blas_avx512(kc, true);
	kiln_graph_t *g = mm_graph(48, 40, 1024);
	char *r1 = tuned_report(kc, g);
	cr_expect(strstr(r1, "chosen by measurement (max-autotune): BLAS in "
			     "row blocks ") != NULL,
		  "%s", r1);
	if (__builtin_cpu_supports("avx512f"))
		cr_expect(strstr(r1, ", GEMM template ") != NULL, "%s", r1);
	char *r2 = tuned_report(kc, g);
	cr_expect_str_eq(r1, r2, "the second compile measured again");
	/* the default mode measures nothing */
	char *r0;
	n_kernels(kc, g, &r0);
	cr_expect(strstr(r0, "max-autotune") == NULL, "%s", r0);
	free(r0);
	free(r1);
	free(r2);
	/* the tuned artifact against the interpreter */
	expect_matches_interp(kc, g, "max-autotune", 3, 1e-5, "mm");
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

Test(autotune, convolution_template_is_chosen_by_measurement, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	/* shapes of conv/tiled_template_matches_the_interpreter's first
	 * case: both templates apply */
	convcase_t cc = {"f32", 3,	16,	20,	40,    5,
			 5,	{1, 1}, {2, 2}, {1, 1}, false, false};
	char *rep = NULL;
	check_conv_case(kc, &cc, "max-autotune", &rep);
	cr_expect(strstr(rep, "chosen by measurement (max-autotune): ") != NULL,
		  "%s", rep);
	/* with AVX-512 four variants: the GEMM template's on tiles,
	 * implicit GEMM (in the whole-image form's place: 6000 columns),
	 * BLAS's on the same tiles and the direct kernel (5 output
	 * channels); the fastest is taken, and the kernel is its form */
	if (__builtin_cpu_supports("avx512f")) {
		cr_expect(strstr(rep, "tiled im2col + GEMM template ") !=
				  NULL &&
			      strstr(rep, "implicit GEMM ") != NULL &&
			      strstr(rep, "tiled im2col + BLAS ") != NULL &&
			      strstr(rep, "direct ") != NULL,
			  "%s", rep);
		/* the direct kernel where its time is the least */
		static const char *const vn[4] = {
		    "tiled im2col + GEMM template ", "implicit GEMM ",
		    "tiled im2col + BLAS ", "direct "};
		double ms[4];
		for (int v = 0; v < 4; v++) {
			const char *p = strstr(rep, "(max-autotune): ");
			p = p != NULL ? strstr(p, vn[v]) : NULL;
			ms[v] =
			    p != NULL ? strtod(p + strlen(vn[v]), NULL) : 1e9;
		}
		bool direct = ms[3] < ms[0] && ms[3] < ms[1] && ms[3] < ms[2];
		cr_expect_eq(strstr(rep, "convolution, direct") != NULL, direct,
			     "%s", rep);
	} else {
		cr_expect(strstr(rep, "chosen by measurement (max-autotune): "
				      "tiled im2col ") != NULL,
			  "%s", rep);
	}
	free(rep);
	/* feeding one node (the scale of relu(conv · s + r)), only the tiled
	 * forms and the direct one are timed: that node becomes their
	 * epilogue */
	cc.epilogue = true;
	check_conv_case(kc, &cc, "max-autotune", &rep);
	/* without AVX-512 the two tiled forms build the same kernels (BLAS
	 * on the tiles) and there is no direct one: one variant, nothing to
	 * measure */
	if (__builtin_cpu_supports("avx512f"))
		cr_expect(
		    strstr(rep, "chosen by measurement (max-autotune): ") !=
			    NULL &&
			strstr(rep, "implicit GEMM") == NULL,
		    "%s", rep);
	else
		cr_expect(strstr(rep, "max-autotune") == NULL &&
			      strstr(rep, "im2col tiles + BLAS") != NULL,
			  "%s", rep);
	cr_expect(strstr(rep, "whole-image") == NULL, "%s", rep);
	cr_expect(strstr(rep, "epilogue kiln_k1 on each ") != NULL, "%s", rep);
	free(rep);
	kiln_compiler_free(kc);
}

Test(fusion, layer_norm_is_one_kernel)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	spec2(&b, "f32", 128, 768);
	msgpack_pack_map(&b.pk, 2);
	s(&b, "dtype");
	s(&b, "f32");
	s(&b, "shape");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 768);
	msgpack_pack_map(&b.pk, 2);
	s(&b, "dtype");
	s(&b, "f32");
	s(&b, "shape");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 768);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.native_layer_norm.default", 5);
	ref(&b, 0);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 768);
	ref(&b, 1);
	ref(&b, 2);
	msgpack_pack_double(&b.pk, 1e-5);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	spec2(&b, "f32", 128, 768);
	spec2(&b, "f32", 128, 1);
	spec2(&b, "f32", 128, 1);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 3);
	ref(&b, 3);
	ref(&b, 4);
	ref(&b, 5);
	kiln_graph_t *g = graph_from_json_like("layer_norm", &b.sb);
	char *rep;
	uint32_t n = n_kernels(kc, g, &rep);
	cr_expect_eq(n, 1, "layer_norm: %u kernels:\n%s", n, rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* gelu(x * w + b), elementwise with broadcast w, b: one pointwise
 * kernel. */
Test(fusion, gelu_chain_is_one_kernel)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	spec2(&b, "f32", 512, 1024);
	spec2(&b, "f32", 1, 1024);
	spec2(&b, "f32", 1, 1024);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	const char *ops[3] = {"aten.mul.Tensor", "aten.add.Tensor",
			      "aten.gelu.default"};
	for (int i = 0; i < 3; i++) {
		msgpack_pack_map(&b.pk, 3);
		s(&b, "op");
		s(&b, ops[i]);
		s(&b, "args");
		msgpack_pack_array(&b.pk, i < 2 ? 2 : 1);
		ref(&b, i == 0 ? 0 : (uint32_t)(2 + i));
		if (i < 2)
			ref(&b, (uint32_t)(1 + i));
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec2(&b, "f32", 512, 1024);
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 5);
	kiln_graph_t *g = graph_from_json_like("gelu chain", &b.sb);
	char *rep;
	uint32_t n = n_kernels(kc, g, &rep);
	cr_expect_eq(n, 1, "gelu(x*w+b): %u kernels:\n%s", n, rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* Views are index arithmetic: permute + expand + add is one kernel, and
 * an output that is a view of an input needs no kernel at all. */
Test(fusion, views_are_not_copies)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	gb_init(&b);
	graph_head(&b, 1);
	spec2(&b, "f32", 32, 48);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	node_head(&b, "aten.t.default", 1);
	ref(&b, 0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_map(&b.pk, 3);
	s(&b, "dtype");
	s(&b, "f32");
	s(&b, "shape");
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, 48);
	msgpack_pack_int64(&b.pk, 32);
	s(&b, "strides");
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 48);
	node_head(&b, "aten.relu.default", 1);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "f32", 48, 32);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 2);
	ref(&b, 1);
	ref(&b, 2);
	kiln_graph_t *g = graph_from_json_like("views", &b.sb);
	char *rep;
	uint32_t n = n_kernels(kc, g, &rep);
	cr_expect_eq(n, 1, "t + relu: %u kernels:\n%s", n, rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* ---- dynamic shapes: one artifact, several sizes
 * ------------------------- */

/* The spec of an f32 [s0, cols]. */
static void sym_rows_spec(gb_t *b, int64_t cols)
{
	msgpack_pack_map(&b->pk, 2);
	s(b, "dtype");
	s(b, "f32");
	s(b, "shape");
	msgpack_pack_array(&b->pk, 2);
	s(b, "s0");
	msgpack_pack_int64(&b->pk, cols);
}

/* A fresh graph's head with the symbol s0 >= 1 and one input, an f32 [s0,
 * cols] (the caller packs "nodes", then "outputs"). */
static void sym_rows_head(gb_t *b, int64_t cols)
{
	gb_init(b);
	msgpack_pack_map(&b->pk, 5);
	s(b, "format");
	s(b, "kiln.graph/1");
	s(b, "symbols");
	msgpack_pack_map(&b->pk, 1);
	s(b, "s0");
	msgpack_pack_map(&b->pk, 2);
	s(b, "min");
	msgpack_pack_int64(&b->pk, 1);
	s(b, "max");
	msgpack_pack_nil(&b->pk);
	s(b, "inputs");
	msgpack_pack_array(&b->pk, 1);
	sym_rows_spec(b, cols);
}

static void dynamic_softmax_many_sizes(void)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	/* y = softmax(x * 2 + 1) over [s0, 48], then layer_norm-free
	 * sum */
	sym_rows_head(&b, 48);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	node_head(&b, "aten.mul.Tensor", 2);
	ref(&b, 0);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	sym_rows_spec(&b, 48);
	node_head(&b, "aten._softmax.default", 3);
	ref(&b, 1);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_false(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	sym_rows_spec(&b, 48);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 2);
	kiln_graph_t *g = graph_from_json_like("dynamic softmax", &b.sb);
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	kiln_module_t *m = NULL;
	rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	/* its rows run as a wavefront up to 8 MiB, checked when the kernel
	 * runs (codegen.c cg_row_wave): 50000 rows of 48 are 9.2 MiB, the
	 * passes one after another */
	if (__builtin_cpu_supports("avx512f")) {
		char *rep = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		cr_expect(strstr(rep, "up to 8 MiB, checked when it runs") !=
			      NULL,
			  "%s", rep);
		free(rep);
	}
	const int64_t rows[] = {1, 7, 33, 130, 50000};
	for (size_t t = 0; t < sizeof(rows) / sizeof(rows[0]); t++) {
		int64_t sz[2] = {rows[t], 48};
		kiln_tensor_t x;
		cr_assert_eq(kiln_td_tensor_alloc(&x, KILN_DT_F32, 2, sz), 0);
		for (int64_t i = 0; i < rows[t] * 48; i++)
			((float *)x.data)[i] =
			    (float)kiln_td_prng_uniform(7, (uint64_t)i, -3, 3);
		kiln_io_t in = {KILN_IO_TENSOR, 0, x};
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		rc =
		    kiln_module_run(m, &in, 1, ob, out, NULL, err, sizeof(err));
		cr_assert_eq(rc, 0, "rows %lld: %s", (long long)rows[t], err);
		kiln_tensor_t ref[1];
		rc = kiln_interp_run(g, &x, ref, err, sizeof(err));
		cr_assert_eq(rc, 0, "interp: %s", err);
		kiln_td_cmp_t cr;
		cr_expect(kiln_td_compare(&out[0].t, &ref[0], 1e-5, 1e-6, &cr),
			  "rows %lld: %s", (long long)rows[t], cr.msg);
		free(ref[0].data);
		free(ob[0]);
		kiln_td_tensor_free(&x);
	}
	/* a size that violates min: a clear error, not a crash */
	int64_t z[2] = {0, 48};
	kiln_tensor_t x0;
	cr_assert_eq(kiln_td_tensor_alloc(&x0, KILN_DT_F32, 2, z), 0);
	kiln_io_t in0 = {KILN_IO_TENSOR, 0, x0};
	void *ob0[1] = {NULL};
	kiln_io_t out0[1];
	rc = kiln_module_run(m, &in0, 1, ob0, out0, NULL, err, sizeof(err));
	cr_expect_neq(rc, 0, "s0 = 0 violates min 1 but ran");
	cr_expect(strstr(err, "s0") != NULL, "%s", err);
	kiln_td_tensor_free(&x0);
	kiln_module_free(m);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

Test(dynamic, one_artifact_many_sizes)
{
	dynamic_softmax_many_sizes();
}

/* The same with every buffer streamed (KILN_NT_BYTES=0): a symbolic
 * size's flag is computed when the kernel runs. */
Test(dynamic, one_artifact_many_sizes_streaming)
{
	setenv("KILN_NT_BYTES", "0", 1);
	cr_assert_eq(kiln_nt_min_bytes(), 0);
	dynamic_softmax_many_sizes();
}

/* softmax over [s0, 1024], one artifact: its rows run as a wavefront up
 * to 8 MiB, walking each pass from its own column, and one pass after
 * another beyond, in order (two bodies, picked when the kernel runs:
 * codegen.c gen_kernel_body). Batches of 8, 300 and 2100 rows (the last
 * 8.6 MB) match softmax in f64 (1e-6 relative plus 1e-9); every row of
 * the batch of 300 holds row r % 8 of the batch of 8 and comes out the
 * same bits (both wavefronts, on a pool of three threads, which splits the
 * 300 rows: rows run in the ramps in one batch and in the loop in the
 * other). */
Test(dynamic, softmax_rows_of_4k_at_every_batch)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	sym_rows_head(&b, 1024);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten._softmax.default", 3);
	ref(&b, 0);
	msgpack_pack_int64(&b.pk, 1);
	msgpack_pack_false(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	sym_rows_spec(&b, 1024);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 1);
	kiln_graph_t *g = graph_from_json_like("dynamic softmax 1024", &b.sb);
	kiln_module_t *m = module_of(kc, g, "dynamic softmax 1024");
	enum { C = 1024 };
	const int64_t rows[3] = {8, 300, 2100};
	float *y[3] = {NULL, NULL, NULL};
	char err[512];
	kiln_pool_t *pool = NULL;
	cr_assert_eq(kiln_pool_new(3, &pool), 0);
	kiln_run_opts_t ro;
	memset(&ro, 0, sizeof(ro));
	ro.pool = pool;
	for (int t = 0; t < 3; t++) {
		int64_t sz[2] = {rows[t], C};
		kiln_tensor_t x;
		cr_assert_eq(kiln_td_tensor_alloc(&x, KILN_DT_F32, 2, sz), 0);
		float *xd = x.data;
		/* row r holds row r % 8 of the first batch */
		for (int64_t i = 0; i < rows[t] * C; i++)
			xd[i] =
			    (float)(kiln_td_prng_uniform(
					13, (uint64_t)(i % (8 * C)), -5, 5) +
				    (double)(i % C) / 100.0);
		kiln_io_t in = {KILN_IO_TENSOR, 0, x};
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		cr_assert_eq(
		    kiln_module_run(m, &in, 1, ob, out, &ro, err, sizeof(err)),
		    0, "rows %lld: %s", (long long)rows[t], err);
		y[t] = ob[0];
		int bad = 0;
		for (int64_t r = 0; r < rows[t] && bad < 3; r++) {
			double mx = -INFINITY, sum = 0;
			for (int64_t c = 0; c < C; c++)
				mx = fmax(mx, xd[r * C + c]);
			for (int64_t c = 0; c < C; c++)
				sum += exp((double)xd[r * C + c] - mx);
			for (int64_t c = 0; c < C; c++) {
				double want =
				    exp((double)xd[r * C + c] - mx) / sum;
				double got = y[t][r * C + c];
				if (fabs(got - want) <= 1e-6 * want + 1e-9)
					continue;
				bad++;
				cr_expect(false,
					  "rows %lld: row %lld col %lld: %.9g, "
					  "want %.9g",
					  (long long)rows[t], (long long)r,
					  (long long)c, got, want);
				break;
			}
		}
		kiln_td_tensor_free(&x);
	}
	for (int64_t r = 0; r < rows[1]; r++)
		cr_expect(memcmp(y[0] + (r % 8) * C, y[1] + r * C,
				 sizeof(float) * C) == 0,
			  "row %lld of 300 differs from row %lld of 8",
			  (long long)r, (long long)(r % 8));
	for (int t = 0; t < 3; t++)
		free(y[t]);
	kiln_pool_free(pool);
	kiln_module_free(m);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* ---- scatters: dense below a size, a scatter-add kernel above ------------ */

/* embedding_dense_backward(grad * 2, idx, V, pad, freq) -> [V, D], grad
 * [I0, I1, D] of dtype dt, idx [I0, I1] i64; the gradient is a lazy
 * product, so the scatter realizes its source */
static kiln_graph_t *embedding_bw_graph_ex(const char *dt, int64_t V,
					   int64_t I0, int64_t I1, int64_t D,
					   int64_t pad, bool freq)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 2);
	const int64_t gs[3] = {I0, I1, D}, is[2] = {I0, I1};
	specn(&b, dt, gs, 3);
	specn(&b, "i64", is, 2);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	node_head(&b, "aten.mul.Tensor", 2); /* value 2 */
	ref(&b, 0);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, dt, gs, 3);
	node_head(&b, "aten.embedding_dense_backward.default", 5);
	ref(&b, 2);
	ref(&b, 1);
	msgpack_pack_int64(&b.pk, V);
	msgpack_pack_int64(&b.pk, pad);
	if (freq)
		msgpack_pack_true(&b.pk);
	else
		msgpack_pack_false(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, dt, V, D);
	return end_graph(&b, 3, 1, "embedding backward");
}

static kiln_graph_t *embedding_bw_graph(int64_t V, int64_t N, int64_t D,
					bool freq)
{
	return embedding_bw_graph_ex("f32", V, 1, N, D, -1, freq);
}

/* g compiled in the default mode and loaded (what names it in a failure) */
static kiln_module_t *module_of(kiln_compiler_t *kc, const kiln_graph_t *g,
				const char *what)
{
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	cr_assert_eq(kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err)), 0,
		     "%s: %s", what, err);
	kiln_module_t *m = NULL;
	cr_assert_eq(kiln_module_from_artifact(a, &m, err, sizeof(err)), 0,
		     "%s: %s", what, err);
	return m;
}

/* Runs an embedding_dense_backward graph (embedding_bw_graph_ex) on a
 * gradient drawn from a seed and on indices that repeat, and expects the
 * interpreter's result. With a padding row (pad >= 0) it runs again with
 * every fifth index outside [0, V), past either end: torch raises there,
 * and so does the interpreter, but kiln's kernels cannot, and skip the
 * index, which must equal the interpreter's result with the padding row in
 * its place. */
static void check_embedding_bw(kiln_compiler_t *kc, const kiln_graph_t *g,
			       int64_t V, int64_t pad, const char *what)
{
	char err[512];
	kiln_module_t *m = module_of(kc, g, what);
	kiln_tensor_t in[2];
	for (uint32_t t = 0; t < 2; t++) {
		const kiln_value_t *v = &g->values[t];
		int64_t sz[KILN_MAX_RANK_HARD];
		for (uint32_t k = 0; k < v->rank; k++)
			sz[k] = v->sizes[k].c;
		cr_assert_eq(
		    kiln_td_tensor_alloc(&in[t], v->dtype, v->rank, sz), 0);
	}
	int64_t ng = in[0].sizes[0] * in[0].sizes[1] * in[0].sizes[2];
	for (int64_t i = 0; i < ng; i++) {
		double x = kiln_td_prng_uniform(31, (uint64_t)i, -1, 1);
		if (in[0].dtype == KILN_DT_F64)
			((double *)in[0].data)[i] = x;
		else
			((float *)in[0].data)[i] = (float)x;
	}
	int64_t ni = in[1].sizes[0] * in[1].sizes[1];
	int64_t *idx = in[1].data;
	for (int pass = 0; pass < (pad >= 0 ? 2 : 1); pass++) {
		for (int64_t i = 0; i < ni; i++)
			idx[i] = (i * 7919) % V;
		if (pass == 1)
			for (int64_t i = 0; i < ni; i += 5)
				idx[i] = i % 2 ? V + i % 7 : -1 - i % 7;
		kiln_io_t args[2] = {{KILN_IO_TENSOR, 0, in[0]},
				     {KILN_IO_TENSOR, 0, in[1]}};
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		cr_assert_eq(kiln_module_run(m, args, 2, ob, out, NULL, err,
					     sizeof(err)),
			     0, "%s: %s", what, err);
		if (pass == 1)
			for (int64_t i = 0; i < ni; i += 5)
				idx[i] = pad;
		kiln_tensor_t want[1];
		cr_assert_eq(kiln_interp_run(g, in, want, err, sizeof(err)), 0,
			     "%s: interp: %s", what, err);
		kiln_td_cmp_t cr;
		cr_expect(kiln_td_compare(&out[0].t, &want[0], 1e-5, 1e-5, &cr),
			  "%s%s: %s", what,
			  pass ? " (indices out of range)" : "", cr.msg);
		free(want[0].data);
		free(ob[0]);
	}
	kiln_td_tensor_free(&in[0]);
	kiln_td_tensor_free(&in[1]);
	kiln_module_free(m);
}

/* Runs g on inputs of their declared shapes: floats drawn from a seed,
 * integer indices (i · 7919) mod 2V − V, in [−V, V) (a negative one
 * counts from V) where neg, else (i · 7919) mod V, and expects the
 * interpreter's outputs (one). */
static void check_scatter_graph(kiln_compiler_t *kc, const kiln_graph_t *g,
				int64_t V, bool neg, const char *what)
{
	char err[512];
	kiln_module_t *m = module_of(kc, g, what);
	uint32_t nin = g->n_inputs;
	kiln_tensor_t in[4];
	kiln_io_t args[4];
	cr_assert(nin <= 4);
	for (uint32_t t = 0; t < nin; t++) {
		const kiln_value_t *v = &g->values[t];
		int64_t sz[KILN_MAX_RANK_HARD], cnt = 1;
		for (uint32_t k = 0; k < v->rank; k++)
			cnt *= sz[k] = v->sizes[k].c;
		cr_assert_eq(
		    kiln_td_tensor_alloc(&in[t], v->dtype, v->rank, sz), 0);
		for (int64_t i = 0; i < cnt; i++) {
			double x =
			    kiln_td_prng_uniform(40 + t, (uint64_t)i, -1, 1);
			if (v->dtype == KILN_DT_F64)
				((double *)in[t].data)[i] = x;
			else if (v->dtype == KILN_DT_F32)
				((float *)in[t].data)[i] = (float)x;
			else
				((int64_t *)in[t].data)[i] =
				    neg ? (i * 7919) % (2 * V) - V
					: (i * 7919) % V;
		}
		args[t] = (kiln_io_t){KILN_IO_TENSOR, 0, in[t]};
	}
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	cr_assert_eq(
	    kiln_module_run(m, args, nin, ob, out, NULL, err, sizeof(err)), 0,
	    "%s: %s", what, err);
	kiln_tensor_t want[1];
	cr_assert_eq(kiln_interp_run(g, in, want, err, sizeof(err)), 0,
		     "%s: interp: %s", what, err);
	kiln_td_cmp_t cr;
	cr_expect(kiln_td_compare(&out[0].t, &want[0], 1e-5, 1e-5, &cr),
		  "%s: %s", what, cr.msg);
	free(want[0].data);
	free(ob[0]);
	for (uint32_t t = 0; t < nin; t++)
		kiln_td_tensor_free(&in[t]);
	kiln_module_free(m);
}

/* g (freed here) compiles to a scatter-add kernel that matches the
 * interpreter (check_scatter_graph) */
static void expect_scatter_kernel(kiln_compiler_t *kc, kiln_graph_t *g,
				  int64_t V, bool neg, const char *what)
{
	cr_assert(g != NULL, "%s", what);
	expect_report_has(kc, g, "scatter-add", true, what);
	check_scatter_graph(kc, g, V, neg, what);
	kiln_graph_free(g);
}

/* op (scatter_add, scatter.src, or scatter.value with value 1) of self
 * [xs], dim k, an index [is] (self's sizes outside k) and src [is, with
 * one more in its last dim: its elements past index's are not read] */
static kiln_graph_t *scatter_elem_graph(const char *op, const char *dt,
					const int64_t *xs, const int64_t *is,
					uint32_t r, uint32_t k)
{
	bool value = strstr(op, "value") != NULL;
	/* scatter_reduce.two:<reduce>[:noself] */
	char how[16] = "";
	bool reduce = strncmp(op, "aten.scatter_reduce.two:", 24) == 0;
	bool noself = reduce && strstr(op, ":noself") != NULL;
	if (reduce)
		snprintf(how, sizeof(how), "%.*s", (int)strcspn(op + 24, ":"),
			 op + 24);
	int64_t ss[8];
	for (uint32_t j = 0; j < r; j++)
		ss[j] = is[j] + (j == r - 1 ? 1 : 0);
	gb_t b;
	gb_init(&b);
	graph_head(&b, value ? 2 : 3);
	specn(&b, dt, xs, r);
	specn(&b, "i64", is, r);
	if (!value)
		specn(&b, dt, ss, r);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, reduce ? "aten.scatter_reduce.two" : op, reduce ? 6 : 4);
	ref(&b, 0);
	msgpack_pack_int64(&b.pk, k);
	ref(&b, 1);
	if (value)
		msgpack_pack_double(&b.pk, 1.0);
	else
		ref(&b, 2);
	if (reduce) {
		s(&b, how);
		if (noself)
			msgpack_pack_false(&b.pk);
		else
			msgpack_pack_true(&b.pk);
	}
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, dt, xs, r);
	return end_graph(&b, value ? 2 : 3, 1, "a scatter of elements");
}

/* Past 2^22 (output, source) pairs a scatter whose index differs from
 * element to element (the gradient of a gather, a one-hot scatter of a
 * value, scatter_add along any dim) is a scatter kernel too: each unit
 * owns whole fibers along the scattered dim (a block of columns for
 * each of the dims before it), zeroes or copies them, then adds (stores:
 * scatter, the last source wins) each source element into the row its
 * index names, in order. Against the interpreter: f32 and f64, dims 0,
 * 1 (the middle of three) and last, negative indices, a source larger
 * than the index. */
Test(lowering, element_scatters_are_scatter_kernels, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *op, *dt, *kind;
		uint32_t r, k;
		int64_t xs[3], is[3];
		bool neg;
	} cases[] = {
	    {"aten.scatter_add.default",
	     "f32",
	     "scatter-add",
	     2,
	     0,
	     {4096, 64},
	     {512, 64},
	     true},
	    {"aten.scatter_add.default",
	     "f64",
	     "scatter-add",
	     2,
	     1,
	     {1024, 5000},
	     {1024, 1},
	     false},
	    {"aten.scatter_add.default",
	     "f32",
	     "scatter-add",
	     3,
	     2,
	     {4, 300, 5000},
	     {4, 300, 3},
	     true},
	    {"aten.scatter.src",
	     "f32",
	     "scatter (the last source wins)",
	     3,
	     1,
	     {8, 3000, 40},
	     {8, 20, 40},
	     false},
	    {"aten.scatter.value",
	     "f64",
	     "scatter (the last source wins)",
	     2,
	     1,
	     {2048, 4096},
	     {2048, 1},
	     false},
	    /* scatter_reduce: a graph network's max aggregation (onto the
	     * identity, a count kernel beside it), and the others */
	    {"aten.scatter_reduce.two:amax:noself",
	     "f32",
	     "scatter-amax",
	     2,
	     0,
	     {4096, 64},
	     {512, 64},
	     false},
	    {"aten.scatter_reduce.two:amin:noself",
	     "f32",
	     "scatter-amin",
	     3,
	     1,
	     {8, 3000, 40},
	     {8, 20, 40},
	     false},
	    {"aten.scatter_reduce.two:prod",
	     "f64",
	     "scatter-prod",
	     2,
	     1,
	     {1024, 5000},
	     {1024, 2},
	     false},
	    {"aten.scatter_reduce.two:mean",
	     "f32",
	     "scatter-add",
	     3,
	     2,
	     {4, 300, 5000},
	     {4, 300, 3},
	     false},
	    {"aten.scatter_reduce.two:sum:noself",
	     "f64",
	     "scatter-add",
	     2,
	     0,
	     {4096, 64},
	     {512, 64},
	     false},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[160];
		snprintf(what, sizeof(what), "%s %s dim %u of %u", cases[i].op,
			 cases[i].dt, cases[i].k, cases[i].r);
		kiln_graph_t *g =
		    scatter_elem_graph(cases[i].op, cases[i].dt, cases[i].xs,
				       cases[i].is, cases[i].r, cases[i].k);
		cr_assert(g != NULL, "%s", what);
		char want[160];
		snprintf(want, sizeof(want), "%s [", cases[i].kind);
		expect_report_has(kc, g, want, true, what);
		expect_report_has(kc, g, "source elements, an index each", true,
				  what);
		expect_report_has(kc, g, "fallback", false, what);
		check_scatter_graph(kc, g, cases[i].xs[cases[i].k],
				    cases[i].neg, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* scatter_add(self [V, D], 0, idx [E] viewed [E, 1] and expanded to [E,
 * D], src [E, D]): a graph network's messages summed per node */
static kiln_graph_t *scatter_rows_graph(const char *dt, int64_t V, int64_t E,
					int64_t D)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	spec2(&b, dt, V, D);
	spec2(&b, dt, E, D);
	const int64_t e1[1] = {E};
	specn(&b, "i64", e1, 1);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 3);
	node_head(&b, "aten.view.default", 2); /* value 3 */
	ref(&b, 2);
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, E);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "i64", E, 1);
	node_head(&b, "aten.expand.default", 2); /* value 4 */
	ref(&b, 3);
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_int64(&b.pk, E);
	msgpack_pack_int64(&b.pk, D);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, "i64", E, D);
	node_head(&b, "aten.scatter_add.default", 4); /* value 5 */
	ref(&b, 0);
	msgpack_pack_int64(&b.pk, 0);
	ref(&b, 4);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec2(&b, dt, V, D);
	return end_graph(&b, 5, 1, "scatter_add of rows");
}

/* index_put(self xs, [None] * k + [idx is], vals, accumulate) with values
 * of the indexed shape xs[:k] + is + xs[k+1:] (LeViT's attention biases:
 * [heads, positions] indexed on dim 1 by [N, N]) */
static kiln_graph_t *index_put_dim_graph(const char *dt, const int64_t *xs,
					 uint32_t xr, uint32_t k,
					 const int64_t *is, uint32_t ir)
{
	int64_t vs[8];
	uint32_t vr = 0;
	for (uint32_t j = 0; j < k; j++)
		vs[vr++] = xs[j];
	for (uint32_t j = 0; j < ir; j++)
		vs[vr++] = is[j];
	for (uint32_t j = k + 1; j < xr; j++)
		vs[vr++] = xs[j];
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, dt, xs, xr);
	specn(&b, "i64", is, ir);
	specn(&b, dt, vs, vr);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.index_put.default", 4); /* value 3 */
	ref(&b, 0);
	msgpack_pack_array(&b.pk, k + 1);
	for (uint32_t j = 0; j < k; j++)
		msgpack_pack_nil(&b.pk);
	ref(&b, 1);
	ref(&b, 2);
	msgpack_pack_true(&b.pk);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, dt, xs, xr);
	return end_graph(&b, 3, 1, "index_put along a dim");
}

/* index_add(self xs, k, idx [E], src xs with E at k, alpha) */
static kiln_graph_t *index_add_dim_graph(const char *dt, const int64_t *xs,
					 uint32_t xr, uint32_t k, int64_t E,
					 double alpha)
{
	int64_t ss[8];
	for (uint32_t j = 0; j < xr; j++)
		ss[j] = j == k ? E : xs[j];
	gb_t b;
	gb_init(&b);
	graph_head(&b, 3);
	specn(&b, dt, xs, xr);
	const int64_t e1[1] = {E};
	specn(&b, "i64", e1, 1);
	specn(&b, dt, ss, xr);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head_kw(&b, "aten.index_add.default", 4); /* value 3 */
	ref(&b, 0);
	msgpack_pack_int64(&b.pk, k);
	ref(&b, 1);
	ref(&b, 2);
	s(&b, "kwargs");
	msgpack_pack_map(&b.pk, 1);
	s(&b, "alpha");
	msgpack_pack_double(&b.pk, alpha);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, dt, xs, xr);
	return end_graph(&b, 3, 1, "index_add along a dim");
}

/* index_put(self [V, D], [idx [I0, I1]], vals [I0, I1, D], accumulate):
 * the gradient of weight[ids] */
static kiln_graph_t *index_put_rows_graph(const char *dt, int64_t V, int64_t I0,
					  int64_t I1, int64_t D)
{
	const int64_t xs[2] = {V, D}, is[2] = {I0, I1};
	return index_put_dim_graph(dt, xs, 2, 0, is, 2);
}

/* index_add(self [V, D], 0, idx [E], src [E, D], alpha): a mixture of
 * experts summing its experts' outputs per token */
static kiln_graph_t *index_add_rows_graph(const char *dt, int64_t V, int64_t E,
					  int64_t D, double alpha)
{
	const int64_t xs[2] = {V, D};
	return index_add_dim_graph(dt, xs, 2, 0, E, alpha);
}

/* Scatters along dim 1 (a leading dim P scattered p by p: units over p
 * and blocks of columns), of a vector (a unit dim of columns) and of dims
 * with nothing after them are scatter-add kernels too, against the
 * interpreter: LeViT's bias gradient (index_put of [4, 400] on dim 1 by
 * [60, 60]), index_put of [3, 500, 7] on dim 1, of a [5000] vector,
 * index_add of [2, 700, 9] and [3, 2000] on dim 1. */
Test(lowering, scatters_along_dim_1_are_scatter_kernels)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *dt;
		int64_t xs[3];
		uint32_t xr, k;
		int64_t is[2];
		uint32_t ir;
	} ip[] = {
	    {"f32", {4, 400, 0}, 2, 1, {60, 60}, 2},
	    {"f64", {3, 500, 7}, 3, 1, {900, 0}, 1},
	    {"f32", {5000, 0, 0}, 1, 0, {1200, 0}, 1},
	};
	for (size_t i = 0; i < sizeof(ip) / sizeof(ip[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "index_put case %zu", i);
		kiln_graph_t *g = index_put_dim_graph(
		    ip[i].dt, ip[i].xs, ip[i].xr, ip[i].k, ip[i].is, ip[i].ir);
		expect_scatter_kernel(kc, g, ip[i].xs[ip[i].k], true, what);
	}
	static const struct {
		const char *dt;
		int64_t xs[3];
		uint32_t xr;
		int64_t E;
	} ia[] = {{"f32", {2, 700, 9}, 3, 500}, {"f64", {3, 2000, 0}, 2, 1000}};
	for (size_t i = 0; i < sizeof(ia) / sizeof(ia[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "index_add case %zu", i);
		kiln_graph_t *g = index_add_dim_graph(
		    ia[i].dt, ia[i].xs, ia[i].xr, 1, ia[i].E, 2.0);
		expect_scatter_kernel(kc, g, ia[i].xs[1], false, what);
	}
	kiln_compiler_free(kc);
}

/* A large scatter_add of whole rows and an accumulating index_put or an
 * index_add of whole rows are scatter-add kernels onto self, against the
 * interpreter: negative indices count from V (but index_add's, which
 * torch and the interpreter reject: its indices here are in range); small
 * ones stay dense reductions. */
Test(lowering, row_scatters_onto_self_are_scatter_kernels)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *dt;
		int64_t V, E, D;
	} sc[] = {{"f32", 3001, 2000, 70}, {"f64", 1000, 5000, 17}};
	for (size_t i = 0; i < sizeof(sc) / sizeof(sc[0]); i++) {
		char what[80];
		snprintf(what, sizeof(what),
			 "scatter_add %s V=%lld E=%lld D=%lld", sc[i].dt,
			 (long long)sc[i].V, (long long)sc[i].E,
			 (long long)sc[i].D);
		kiln_graph_t *g =
		    scatter_rows_graph(sc[i].dt, sc[i].V, sc[i].E, sc[i].D);
		expect_scatter_kernel(kc, g, sc[i].V, true, what);
	}
	kiln_graph_t *small = scatter_rows_graph("f32", 16, 20, 8);
	expect_report_has(kc, small, "scatter-add", false, "small scatter_add");
	check_scatter_graph(kc, small, 16, true, "small scatter_add");
	kiln_graph_free(small);
	static const struct {
		const char *dt;
		int64_t V, I0, I1, D;
	} ip[] = {{"f32", 4001, 3, 400, 96}, {"f64", 2000, 2, 999, 5}};
	for (size_t i = 0; i < sizeof(ip) / sizeof(ip[0]); i++) {
		char what[80];
		snprintf(what, sizeof(what),
			 "index_put %s V=%lld [%lld, %lld, %lld]", ip[i].dt,
			 (long long)ip[i].V, (long long)ip[i].I0,
			 (long long)ip[i].I1, (long long)ip[i].D);
		kiln_graph_t *g = index_put_rows_graph(
		    ip[i].dt, ip[i].V, ip[i].I0, ip[i].I1, ip[i].D);
		expect_scatter_kernel(kc, g, ip[i].V, true, what);
	}
	static const struct {
		const char *dt;
		int64_t V, E, D;
		double alpha;
	} ia[] = {{"f32", 3001, 2000, 70, 1.0}, {"f64", 1000, 5000, 17, -0.5}};
	for (size_t i = 0; i < sizeof(ia) / sizeof(ia[0]); i++) {
		char what[80];
		snprintf(what, sizeof(what),
			 "index_add %s V=%lld E=%lld D=%lld", ia[i].dt,
			 (long long)ia[i].V, (long long)ia[i].E,
			 (long long)ia[i].D);
		kiln_graph_t *g = index_add_rows_graph(
		    ia[i].dt, ia[i].V, ia[i].E, ia[i].D, ia[i].alpha);
		expect_scatter_kernel(kc, g, ia[i].V, false, what);
	}
	kiln_compiler_free(kc);
}

/* kiln lowers a small scatter as a reduction over every (output, source)
 * pair, fused with what surrounds it: an embedding gradient of a 512-row
 * vocabulary. Past 2^22 pairs (an [8192, 512] embedding over 512 tokens is
 * 2^31: 160 ms a training step as a reduction) the gradient is a
 * scatter-add kernel, O(V·D + N·D), whose units own blocks of columns;
 * with scale_grad_by_freq a second one counts each row's tokens. A
 * scatter of single elements that large stays a fallback step that torch
 * runs, and the report says why. */
Test(lowering, large_embedding_gradients_are_scatter_kernels)
{
	kiln_compiler_t *kc = new_compiler();
	kiln_graph_t *small = embedding_bw_graph(512, 32, 64, false);
	expect_report_has(kc, small, "fallback", false, "[512, 64] of 32");
	expect_report_has(kc, small, "scatter-add", false, "[512, 64] of 32");
	kiln_graph_free(small);
	kiln_graph_t *big = embedding_bw_graph(8192, 512, 512, false);
	expect_report_has(kc, big, "fallback", false, "[8192, 512] of 512");
	expect_report_has(kc, big,
			  "scatter-add [8192, 512] of [1, 512] source rows",
			  true, "[8192, 512] of 512");
	kiln_graph_free(big);
	/* 64 columns: blocks of 16 (a cache line), 4 units, not one */
	kiln_graph_t *narrow = embedding_bw_graph(50272, 32, 64, false);
	expect_report_has(kc, narrow, "columns in blocks of 16 ", true,
			  "[50272, 64] of 32");
	kiln_graph_free(narrow);
	kiln_graph_t *freq = embedding_bw_graph(8192, 512, 512, true);
	expect_report_has(kc, freq, "fallback", false,
			  "scale_grad_by_freq, [8192, 512] of 512");
	expect_report_has(kc, freq,
			  "scatter-add [8192, 1] of [1, 512] source rows", true,
			  "scale_grad_by_freq, [8192, 512] of 512");
	kiln_graph_free(freq);
	/* an integer scatter_add takes no scatter kernel: past 2^22 pairs a
	 * fallback step, and the report says why */
	const int64_t xs[2] = {4096, 64}, is[2] = {512, 64};
	kiln_graph_t *el =
	    scatter_elem_graph("aten.scatter_add.default", "i64", xs, is, 2, 0);
	cr_assert(el != NULL);
	expect_report_has(kc, el,
			  "fallback step <- node 0 aten.scatter_add.default "
			  "(run by torch: as a dense reduction it would visit "
			  "more than 4194304 elements (kiln's scatter kernels "
			  "take f32 and f64, with an index that spans self in "
			  "every other dim)",
			  true, "an integer scatter_add of elements");
	kiln_graph_free(el);
	kiln_compiler_free(kc);
}

/* The scatter-add kernel against the interpreter: f32 and f64, a width
 * that is not a multiple of the unit's columns or of a vector (a tail of
 * each), one under a vector, 2-D indices with repeats, a padding row,
 * indices outside [0, V), which it skips, and scale_grad_by_freq. */
Test(lowering, scatter_kernels_match_the_interpreter)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *dt;
		int64_t V, I0, I1, D, pad;
		bool freq;
	} cases[] = {
	    {"f32", 4099, 3, 700, 100, 7, false},
	    {"f64", 4099, 3, 700, 100, -1, false},
	    {"f32", 65536, 2, 300, 3, 11, false},
	    {"f32", 2053, 4, 513, 64, 0, false},
	    {"f64", 3001, 2, 1024, 77, 5, false},
	    {"f32", 4099, 3, 700, 100, 7, true},
	    {"f64", 3001, 2, 1024, 77, -1, true},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[96];
		snprintf(what, sizeof(what), "%s V=%lld [%lld, %lld, %lld]%s",
			 cases[i].dt, (long long)cases[i].V,
			 (long long)cases[i].I0, (long long)cases[i].I1,
			 (long long)cases[i].D,
			 cases[i].freq ? " scale_grad_by_freq" : "");
		kiln_graph_t *g = embedding_bw_graph_ex(
		    cases[i].dt, cases[i].V, cases[i].I0, cases[i].I1,
		    cases[i].D, cases[i].pad, cases[i].freq);
		cr_assert(g != NULL, "%s", what);
		expect_report_has(kc, g, "scatter-add", true, what);
		check_embedding_bw(kc, g, cases[i].V, cases[i].pad, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* ---- pointwise kernels that transpose (sched.c block_transposes) -------- */

/* y = x * 2 with x [2, C, H, W] (NCHW, or channels-last when x_cl) and y
 * declared channels-last when y_cl */
static kiln_graph_t *transpose_graph(int64_t C, int64_t H, int64_t W, bool x_cl,
				     bool y_cl)
{
	gb_t b;
	const int64_t d4[4] = {2, C, H, W};
	const int64_t cl[4] = {C * H * W, 1, W * C, C};
	gb_init(&b);
	graph_head(&b, 1);
	if (x_cl)
		spec4_strided(&b, d4, cl);
	else
		specn(&b, "f32", d4, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.mul.Tensor", 2);
	ref(&b, 0);
	msgpack_pack_double(&b.pk, 2.0);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	if (y_cl)
		spec4_strided(&b, d4, cl);
	else
		specn(&b, "f32", d4, 4);
	return end_graph(&b, 1, 1, "transpose");
}

/* A pointwise kernel that writes (or reads) channels-last while it runs
 * along W runs its channels in blocks of 16 just outside the W loop, so
 * the 16 channels of one position (a cache line) are written by 16
 * consecutive iterations: [2, 64, 8, 8] runs as [2, 4, 8, 16, 8]. One
 * whose channels are not a multiple of 16, or that does not transpose,
 * is left as it is. Against the interpreter (the outputs exactly). */
Test(fusion, transposing_pointwise_kernels_run_channels_in_blocks)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H, W;
		bool x_cl, y_cl;
		const char *dims;
	} cs[] = {{64, 8, 8, false, true, "[2, 4, 8, 16, 8]"},
		  {64, 8, 8, true, false, "[2, 4, 8, 16, 8]"},
		  {48, 5, 7, false, true, "[2, 3, 5, 16, 7]"},
		  {24, 8, 8, false, true, "[2, 24, 8, 8]"},
		  {64, 8, 8, false, false, "[2, 64, 8, 8]"}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g = transpose_graph(cs[i].C, cs[i].H, cs[i].W,
						  cs[i].x_cl, cs[i].y_cl);
		char what[80];
		snprintf(
		    what, sizeof(what), "x*2 [2, %lld, %lld, %lld] %s -> %s",
		    (long long)cs[i].C, (long long)cs[i].H, (long long)cs[i].W,
		    cs[i].x_cl ? "NHWC" : "NCHW", cs[i].y_cl ? "NHWC" : "NCHW");
		expect_report_has(kc, g, cs[i].dims, true, what);
		expect_report_has(kc, g, "through tiles", false, what);
		/* (the harness makes contiguous inputs: the report only for
		 * a channels-last x) */
		if (!cs[i].x_cl)
			expect_matches_interp(kc, g, "default", 70 + i, 0,
					      what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* y = a.permute(0, 3, 1, 2) + b with a [2, H, W, C] and b [2, C, H, W]
 * (both contiguous), y [2, C, H, W] contiguous or channels-last (y_cl):
 * a's loads are contiguous along C and C apart along W, and so are y's
 * stores when y_cl. */
static kiln_graph_t *tiles_graph(int64_t C, int64_t H, int64_t W, bool y_cl)
{
	gb_t b;
	const int64_t nhwc[4] = {2, H, W, C}, nchw[4] = {2, C, H, W};
	const int64_t cl[4] = {C * H * W, 1, W * C, C};
	const int64_t co[4] = {C * H * W, H * W, W, 1};
	gb_init(&b);
	graph_head(&b, 2);
	specn(&b, "f32", nhwc, 4);
	specn(&b, "f32", nchw, 4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	nhwc_to_nchw(&b, 0, 2, C, H, W); /* value 2 */
	node_head(&b, "aten.add.Tensor", 2);
	ref(&b, 2);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec4_strided(&b, nchw, y_cl ? cl : co);
	return end_graph(&b, 3, 1, "tiles");
}

/* A tiled kernel (one of at least 2^16 elements) reads, and with a
 * channels-last y writes, its transposed accesses through 16 x w tiles
 * transposed in registers (codegen.c tiles): no gathers (nor scalar
 * stores) in its IR, and the outputs exactly the interpreter's, at widths
 * of 16 (W 64, 20), 8 (W 8) and 4 (W 7, 20) and the scalar rest (W 7),
 * with 1 to 3 blocks of 16 channels. A smaller one is blocked but keeps
 * its gathers (the test before). */
Test(fusion, tiled_kernels_transpose_in_registers)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		int64_t C, H, W;
	} cs[] = {{32, 32, 64}, {48, 40, 20}, {16, 600, 7}, {32, 128, 8}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		for (int y_cl = 0; y_cl < 2; y_cl++) {
			kiln_graph_t *g =
			    tiles_graph(cs[i].C, cs[i].H, cs[i].W, y_cl);
			char what[80], dims[64];
			snprintf(what, sizeof(what),
				 "a.permute + b [2, %lld, %lld, %lld] -> %s",
				 (long long)cs[i].C, (long long)cs[i].H,
				 (long long)cs[i].W, y_cl ? "NHWC" : "NCHW");
			snprintf(dims, sizeof(dims),
				 "[2, %lld, %lld, 16, %lld]",
				 (long long)(cs[i].C / 16), (long long)cs[i].H,
				 (long long)cs[i].W);
			expect_report_has(kc, g, dims, true, what);
			expect_report_has(kc, g,
					  "transposes through tiles of 16",
					  true, what);
			char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
			cr_expect(strstr(ir, "masked.gather") == NULL,
				  "%s: gathers", what);
			cr_expect(strstr(ir, "shufflevector") != NULL,
				  "%s: no transposes", what);
			free(ir);
			expect_matches_interp(kc, g, "default",
					      (uint64_t)(90 + 2 * i + y_cl), 0,
					      what);
			kiln_graph_free(g);
		}
	}
	kiln_compiler_free(kc);
}

/* ---- streaming stores (codegen.c nt_setup) ------------------------------ */

/* The assembly of g (the caller frees it). */
static char *asm_of(kiln_compiler_t *kc, const kiln_graph_t *g)
{
	char *text = emit_text(kc, g, KILN_EMIT_ASM, NULL);
	cr_assert(text != NULL);
	return text;
}

/* With KILN_NT_BYTES=0 every output of at least 1 MiB whose kernel rows
 * are whole 64-byte lines is written with streaming stores where a
 * vector's address is aligned, and the kernel fences them: log_softmax
 * over rows (inner-vectorized) and softmax over columns (4 blocks of
 * columns a unit) of [600, 1024]. Not streamed: softmax over rows (its
 * exp lives in the output's rows, in cache when the last pass scales it),
 * a 160 KB output, and rows of 1000 f32 (every other row starting off a
 * line, stored plainly: the alternation cost more than either, codegen.c
 * nt_rows_whole). All against the interpreter. */
Test(nt, large_outputs_stream_and_match_the_interpreter)
{
	setenv("KILN_NT_BYTES", "0", 1);
	cr_assert_eq(kiln_nt_min_bytes(), 0);
	kiln_compiler_t *kc = new_compiler();
	const struct {
		const char *op;
		int64_t r, c, dim;
		bool big;
	} cs[] = {{"aten._log_softmax.default", 600, 1024, 1, true},
		  {"aten._softmax.default", 600, 1024, 0, true},
		  {"aten._softmax.default", 600, 1024, 1, false},
		  {"aten._log_softmax.default", 40, 1000, 1, false},
		  {"aten._log_softmax.default", 600, 1000, 1, false},
		  {"aten._softmax.default", 600, 1000, 0, false}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		gb_t b;
		row_op_dim_graph(&b, cs[i].op, cs[i].r, cs[i].c, cs[i].dim);
		kiln_graph_t *g = graph_from_json_like(cs[i].op, &b.sb);
		char what[96];
		snprintf(what, sizeof(what), "%s dim %lld of [%lld, %lld]",
			 cs[i].op, (long long)cs[i].dim, (long long)cs[i].r,
			 (long long)cs[i].c);
		char *text = asm_of(kc, g);
		/* streaming needs vectors of 32 bytes or more (AVX) */
		bool wide = strstr(text, "ymm") || strstr(text, "zmm");
		if (wide) {
			cr_expect_eq(strstr(text, "movnt") != NULL, cs[i].big,
				     "%s: streaming stores", what);
			cr_expect_eq(strstr(text, "sfence") != NULL, cs[i].big,
				     "%s: sfence", what);
		}
		free(text);
		expect_matches_interp(kc, g, "default", 31 + i, 1e-5, what);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* With KILN_NT_BYTES=0 a scatter-add kernel whose output is 1 MiB or more
 * zeroes its columns (or copies self's) with streaming stores, fenced
 * before its adds read the rows back: an embedding gradient of [50272,
 * 768] from 1024 tokens 8.1-9.1 -> 1.8-1.9 ms (kilnc --bench, 2 threads,
 * a Zen 4). Against the interpreter. */
Test(nt, a_large_scatter_streams_its_zeros_and_matches_the_interpreter)
{
	setenv("KILN_NT_BYTES", "0", 1);
	cr_assert_eq(kiln_nt_min_bytes(), 0);
	kiln_compiler_t *kc = new_compiler();
	kiln_graph_t *g[3] = {
	    embedding_bw_graph_ex("f32", 4099, 3, 700, 96, 7, false),
	    index_put_rows_graph("f32", 4001, 3, 400, 96),
	    embedding_bw_graph_ex("f32", 4099, 3, 700, 100, 7, false)};
	const char *what[3] = {"embedding backward", "index_put of rows",
			       "embedding backward, rows of 400 bytes"};
	for (int i = 0; i < 3; i++) {
		cr_assert(g[i] != NULL);
		char *text = asm_of(kc, g[i]);
		if (strstr(text, "ymm") || strstr(text, "zmm")) {
			/* rows that are not whole lines stay plain */
			cr_expect_eq(strstr(text, "movnt") != NULL, i < 2,
				     "%s: streaming stores", what[i]);
			cr_expect_eq(strstr(text, "sfence") != NULL, i < 2,
				     "%s: sfence", what[i]);
		}
		free(text);
		if (i != 1)
			check_embedding_bw(kc, g[i], 4099, 7, what[i]);
		else
			check_scatter_graph(kc, g[i], 4001, true, what[i]);
		kiln_graph_free(g[i]);
	}
	kiln_compiler_free(kc);
}

/* A KILN_NT_BYTES that is not a size fails every module load with a
 * message naming it; nothing runs. */
Test(nt, malformed_env_fails_the_load)
{
	setenv("KILN_NT_BYTES", "12Q", 1);
	cr_expect_eq(kiln_nt_min_bytes(), -1);
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	softmax_graph(&b, 4, 8, 1);
	kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
	char err[512];
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	cr_assert_eq(kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err)), 0,
		     "%s", err);
	kiln_module_t *m = NULL;
	int rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	cr_expect_eq(rc, -EINVAL, "rc %d: %s", rc, err);
	cr_expect(m == NULL);
	cr_expect(strstr(err, "KILN_NT_BYTES=\"12Q\"") != NULL, "%s", err);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

Test(nt, env_sizes_with_suffixes)
{
	setenv("KILN_NT_BYTES", "24M", 1);
	cr_expect_eq(kiln_nt_min_bytes(), 24LL << 20);
}

Test(nt, env_off)
{
	setenv("KILN_NT_BYTES", "off", 1);
	cr_expect_eq(kiln_nt_min_bytes(), INT64_MAX);
}

/* Unset: 3/4 of the L3 that sysfs lists for cpu0, where it lists one. */
Test(nt, default_is_three_quarters_of_the_l3)
{
	unsetenv("KILN_NT_BYTES");
	int64_t v = kiln_nt_min_bytes();
	cr_expect_gt(v, 0);
	for (int i = 0; i < 16; i++) {
		char path[96], buf[64];
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			break;
		bool l3 = fgets(buf, sizeof(buf), f) != NULL && atoi(buf) == 3;
		fclose(f);
		if (!l3)
			continue;
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "r");
		cr_assert(f != NULL);
		long long kb = 0;
		char unit = 0;
		cr_assert_eq(fscanf(f, "%lld%c", &kb, &unit), 2);
		fclose(f);
		cr_assert_eq(unit, 'K', "sysfs size unit %c", unit);
		cr_expect_eq(v, (kb << 10) / 4 * 3);
		break;
	}
}

/* transformer_dyn_fwd (a TransformerEncoderLayer, sequence first, its
 * length the symbol s50) at lengths it was not captured at, against the
 * interpreter. Its attention reshapes [2*s50, 192] into [s50, 2, 3, 8, 16]
 * and reads the pieces transposed: index arithmetic that divides by
 * 64*s50, which ix.c reduces to a division by 4 (symsplit_factor); and its
 * softmax hoists log(sum) + max out of the row loop. Both are checked by
 * the numbers here, at sizes where a wrong reduction would read the wrong
 * rows. */
Test(dynamic, transformer_dyn_many_lengths, .timeout = 120)
{
	kiln_compiler_t *kc = new_compiler();
	char path[1024], err[512];
	kiln_graph_t *g = NULL;
	snprintf(path, sizeof(path),
		 "%s/graphs/transformer_dyn_fwd.graph.msgpack",
		 KILN_TEST_DATA_DIR);
	cr_assert_eq(kiln_td_graph_load(path, &g, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(g->n_symbols, 1);
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	kiln_module_t *m = NULL;
	rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	const int64_t lens[] = {2, 3, 9, 21};
	for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
		int64_t sv = lens[t];
		uint32_t n = g->n_inputs;
		kiln_tensor_t *x = calloc(n, sizeof(*x));
		kiln_io_t *in = calloc(n, sizeof(*in));
		cr_assert(x != NULL && in != NULL);
		for (uint32_t i = 0; i < n; i++) {
			const kiln_value_t *v = &g->values[i];
			if (v->kind == KILN_VAL_SYMINT) {
				cr_assert_eq(kiln_td_tensor_alloc(
						 &x[i], KILN_DT_I64, 0, NULL),
					     0);
				*(int64_t *)x[i].data = sv;
				in[i] = (kiln_io_t){KILN_IO_INT, sv, x[i]};
				continue;
			}
			int64_t sz[8];
			cr_assert_leq(v->rank, 8);
			for (uint32_t d = 0; d < v->rank; d++) {
				sz[d] = v->sizes[d].c;
				if (v->sizes[d].e != NULL)
					cr_assert_eq(
					    kiln_expr_eval(v->sizes[d].e, &sv,
							   &sz[d]),
					    0);
			}
			cr_assert_eq(
			    kiln_td_tensor_alloc(&x[i], v->dtype, v->rank, sz),
			    0);
			int64_t ne = kiln_td_numel(&x[i]);
			cr_assert_eq(v->dtype, KILN_DT_F32);
			for (int64_t e = 0; e < ne; e++)
				((float *)x[i].data)[e] =
				    (float)kiln_td_prng_uniform(
					(uint64_t)(100 * t + i), (uint64_t)e,
					-1, 1);
			in[i] = (kiln_io_t){KILN_IO_TENSOR, 0, x[i]};
		}
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		cr_assert_eq(g->n_outputs, 1);
		rc = kiln_module_run(m, in, n, ob, out, NULL, err, sizeof(err));
		cr_assert_eq(rc, 0, "s50 = %lld: %s", (long long)sv, err);
		kiln_tensor_t ref[1];
		rc = kiln_interp_run(g, x, ref, err, sizeof(err));
		cr_assert_eq(rc, 0, "interp: %s", err);
		/* [2, s50, 64] */
		cr_expect(out[0].t.rank == 3 && out[0].t.sizes[1] == sv &&
			      ref[0].rank == 3 && ref[0].sizes[1] == sv,
			  "s50 = %lld: rank %u, dim 1 %lld", (long long)sv,
			  out[0].t.rank, (long long)out[0].t.sizes[1]);
		kiln_td_cmp_t cr;
		cr_expect(kiln_td_compare(&out[0].t, &ref[0], 1e-4, 1e-5, &cr),
			  "s50 = %lld: %s", (long long)sv, cr.msg);
		free(ref[0].data);
		free(ob[0]);
		for (uint32_t i = 0; i < n; i++)
			kiln_td_tensor_free(&x[i]);
		free(x);
		free(in);
	}
	kiln_module_free(m);
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

/* ---- two threads compiling at once
 * --------------------------------------- */

typedef struct thr {
	const char *graph, *io;
	int failures;
	char msg[1200];
} thr_t;

static void *compile_loop(void *arg)
{
	thr_t *t = arg;
	char err[1024];
	kiln_compiler_t *kc = NULL;
	if (kiln_compiler_new(NULL, &kc, err, sizeof(err)) != 0) {
		t->failures++;
		snprintf(t->msg, sizeof(t->msg), "%s", err);
		return NULL;
	}
	kiln_graph_t *g = NULL;
	kiln_td_io_t io;
	memset(&io, 0, sizeof(io));
	if (kiln_td_graph_load(t->graph, &g, err, sizeof(err)) != 0 ||
	    kiln_td_io_load(t->io, &io, err, sizeof(err)) != 0) {
		t->failures++;
		snprintf(t->msg, sizeof(t->msg), "%s", err);
	} else {
		for (int i = 0; i < 4; i++) {
			runres_t r;
			check(kc, g, &io, &r);
			if (!r.ok) {
				t->failures++;
				snprintf(t->msg, sizeof(t->msg), "%s", r.msg);
			}
		}
	}
	kiln_td_io_free(&io);
	kiln_graph_free(g);
	kiln_compiler_free(kc);
	return NULL;
}

Test(concurrency, two_threads_compile_different_graphs, .timeout = 300)
{
	thr_t t[2] = {
	    {KILN_TEST_DATA_DIR "/graphs/transformer_layer_fwd.graph.msgpack",
	     KILN_TEST_DATA_DIR "/graphs/transformer_layer_fwd.io.msgpack", 0,
	     ""},
	    {KILN_TEST_DATA_DIR "/graphs/mlp_bwd.graph.msgpack",
	     KILN_TEST_DATA_DIR "/graphs/mlp_bwd.io.msgpack", 0, ""}};
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, compile_loop, &t[i]),
			     0);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++)
		cr_expect_eq(t[i].failures, 0, "%s: %s", t[i].graph, t[i].msg);
}

/* ---- semantically invalid graphs
 * ----------------------------------------- */

static void expect_invalid(const char *what, gb_t *b, const char *needle)
{
	kiln_compiler_t *kc = new_compiler();
	kiln_graph_t *g = graph_from_json_like(what, &b->sb);
	char err[512] = "";
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
	cr_expect_eq(rc, KILN_EINVGRAPH, "%s: rc %d (%s)", what, rc, err);
	cr_expect(strstr(err, "node 0") != NULL, "%s: %s", what, err);
	cr_expect(strstr(err, needle) != NULL, "%s: \"%s\" not in: %s", what,
		  needle, err);
	cr_expect_null(a);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b->sb);
	kiln_compiler_free(kc);
}

static void one_node(gb_t *b, const char *op, int64_t a0, int64_t a1,
		     int64_t b0, int64_t b1, int64_t o0, int64_t o1,
		     int n_extra, const int64_t *extra)
{
	gb_init(b);
	graph_head(b, b0 >= 0 ? 2 : 1);
	spec2(b, "f32", a0, a1);
	if (b0 >= 0)
		spec2(b, "f32", b0, b1);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 1);
	msgpack_pack_map(&b->pk, 3);
	s(b, "op");
	s(b, op);
	s(b, "args");
	msgpack_pack_array(&b->pk, (b0 >= 0 ? 2 : 1) + (uint32_t)n_extra);
	ref(b, 0);
	if (b0 >= 0)
		ref(b, 1);
	for (int i = 0; i < n_extra; i++) {
		if (extra[i] == INT64_MIN) {
			msgpack_pack_array(&b->pk, 2);
			msgpack_pack_int64(&b->pk, 5);
			msgpack_pack_int64(&b->pk, 7);
		} else {
			msgpack_pack_int64(&b->pk, extra[i]);
		}
	}
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	spec2(b, "f32", o0, o1);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, b0 >= 0 ? 2 : 1);
}

/* A pointwise kernel's last-dim tail of C % 16 elements runs 8, then 4
 * elements at once where that many are left, the rest one at a time: add
 * of [3, C] and [3, C], and of [3, C] and a broadcast [1, C], every C from
 * 1 to 37, against the interpreter. */
Test(codegen, pointwise_tails)
{
	kiln_compiler_t *kc = new_compiler();
	for (int64_t C = 1; C <= 37; C++) {
		for (int bc = 0; bc < 2; bc++) {
			gb_t b;
			one_node(&b, "aten.add.Tensor", 3, C, bc ? 1 : 3, C, 3,
				 C, 0, NULL);
			kiln_graph_t *g = graph_from_json_like("add", &b.sb);
			char what[64];
			snprintf(what, sizeof(what),
				 "add [3, %lld] + [%d, %lld]", (long long)C,
				 bc ? 1 : 3, (long long)C);
			expect_matches_interp(kc, g, "default", (uint64_t)C,
					      1e-6, what);
			kiln_graph_free(g);
			msgpack_sbuffer_destroy(&b.sb);
		}
	}
	kiln_compiler_free(kc);
}

/* A static row is generated with only the pieces that do work (codegen.c
 * gen_loops): the 4-accumulator loop where the row holds 4 vectors, the
 * one-vector loop where a vector is left, the scalar rest where the width
 * does not divide it. softmax over rows of every length from 1 to 40 and
 * around 64 and 128 takes each combination; pointwise rows longer than a
 * chunk (8192) that the width divides have no tail at all. Against the
 * interpreter. */
Test(codegen, static_row_lengths, .timeout = 120)
{
	kiln_compiler_t *kc = new_compiler();
	int64_t lens[48];
	int n = 0;
	for (int64_t C = 1; C <= 40; C++)
		lens[n++] = C;
	const int64_t more[] = {63, 64, 65, 100, 127, 128, 129};
	for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
		lens[n++] = more[i];
	for (int i = 0; i < n; i++) {
		int64_t C = lens[i];
		gb_t b;
		softmax_graph(&b, 3, C, 1);
		kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
		char what[64];
		snprintf(what, sizeof(what), "softmax [3, %lld]", (long long)C);
		expect_matches_interp(kc, g, "default", (uint64_t)C, 1e-5,
				      what);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	const int64_t wide[] = {16384, 8195, 8192 * 2 + 8};
	for (size_t i = 0; i < sizeof(wide) / sizeof(wide[0]); i++) {
		gb_t b;
		one_node(&b, "aten.add.Tensor", 3, wide[i], 1, wide[i], 3,
			 wide[i], 0, NULL);
		kiln_graph_t *g = graph_from_json_like("add", &b.sb);
		char what[64];
		snprintf(what, sizeof(what), "add [3, %lld] + [1, %lld]",
			 (long long)wide[i], (long long)wide[i]);
		expect_matches_interp(kc, g, "default", (uint64_t)wide[i], 1e-6,
				      what);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* Compiles the one-input graph in b, runs it on the n0 x n1 f32 values x
 * and returns its f32 output (the caller frees it); b is destroyed. */
static float *run_f32_graph_on(kiln_compiler_t *kc, gb_t *b, const char *what,
			       const float *x, int64_t n0, int64_t n1)
{
	kiln_graph_t *g = graph_from_json_like(what, &b->sb);
	char err[512];
	kiln_module_t *m = module_of(kc, g, what);
	kiln_tensor_t in;
	int64_t sz[2] = {n0, n1};
	cr_assert_eq(kiln_td_tensor_alloc(&in, KILN_DT_F32, 2, sz), 0);
	memcpy(in.data, x, sizeof(float) * (size_t)(n0 * n1));
	kiln_io_t arg = {KILN_IO_TENSOR, 0, in};
	void *ob[1] = {NULL};
	kiln_io_t out[1];
	kiln_run_opts_t ro;
	memset(&ro, 0, sizeof(ro));
	ro.pool = match_pool;
	cr_assert_eq(kiln_module_run(m, &arg, 1, ob, out,
				     match_pool ? &ro : NULL, err, sizeof(err)),
		     0, "%s: %s", what, err);
	/* the output is the whole of out buffer 0 */
	cr_assert_eq(out[0].t.data, ob[0]);
	float *y = ob[0];
	kiln_td_tensor_free(&in);
	kiln_module_free(m); /* and the artifact, which it owns */
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b->sb);
	return y;
}

static float *run_f32_graph(gb_t *b, const char *what, const float *x,
			    int64_t n0, int64_t n1)
{
	kiln_compiler_t *kc = new_compiler();
	float *y = run_f32_graph_on(kc, b, what, x, n0, n1);
	kiln_compiler_free(kc);
	return y;
}

/* |got - want| in units in the last place of want as an f32 */
static double ulps_f32(float got, double want)
{
	if (want == 0)
		return got == 0 ? 0 : INFINITY;
	return fabs((double)got - want) / ldexp(1.0, ilogb(want) - 23);
}

/* A row kernel with a transcendental whose rows are 1 KiB or longer
 * prefetches the next row in its first pass (codegen.c prefetch_loads:
 * softmax 1.2-1.3x at 16-64 MB); short rows and a layer norm (which lost
 * at 1 MB with it) do not. The IR before O3 has llvm.prefetch or not, and
 * softmax over rows of 1024 still matches the interpreter. */
static bool raw_ir_has(kiln_compiler_t *kc, gb_t *b, const char *what,
		       const char *needle)
{
	kiln_graph_t *g = graph_from_json_like(what, &b->sb);
	char *text = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
	bool has = strstr(text, needle) != NULL;
	free(text);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b->sb);
	return has;
}

/* y = -x[:, ::step] over x [R, C] of dtype dt: a load whose index moves by
 * step along the vectorized dim */
static void slice_step_graph(gb_t *b, const char *dt, int64_t R, int64_t C,
			     int64_t step)
{
	int64_t n = (C + step - 1) / step;
	gb_init(b);
	graph_head(b, 1);
	spec2(b, dt, R, C);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 2);
	node_head(b, "aten.slice.Tensor", 5);
	ref(b, 0);
	msgpack_pack_int64(&b->pk, 1);
	msgpack_pack_int64(&b->pk, 0);
	msgpack_pack_int64(&b->pk, C);
	msgpack_pack_int64(&b->pk, step);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	spec2(b, dt, R, n);
	node_head(b, "aten.neg.default", 1);
	ref(b, 1);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	spec2(b, dt, R, n);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, 2);
}

/* max_pool2d (k x k, stride st, padding 1) of x + bias, x [N, C, H, W],
 * bias [C, 1, 1]: the window's loads of x move by st along the vectorized
 * dim under the padding's mask, and its loads of the bias are the same in
 * every lane under that mask */
static void bias_pool_graph(gb_t *b, int64_t N, int64_t C, int64_t H, int64_t W,
			    int64_t k, int64_t st)
{
	const int64_t xd[4] = {N, C, H, W}, bd[3] = {C, 1, 1};
	const int64_t od[4] = {N, C, (H + 2 - k) / st + 1,
			       (W + 2 - k) / st + 1};
	gb_init(b);
	graph_head(b, 2);
	specn(b, "f32", xd, 4);
	specn(b, "f32", bd, 3);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 2);
	node_head(b, "aten.add.Tensor", 2);
	ref(b, 0);
	ref(b, 1);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	specn(b, "f32", xd, 4);
	node_head(b, "aten.max_pool2d_with_indices.default", 4);
	ref(b, 2);
	for (int a = 0; a < 3; a++) {
		int64_t v = a == 0 ? k : a == 1 ? st : 1;
		msgpack_pack_array(&b->pk, 2);
		msgpack_pack_int64(&b->pk, v);
		msgpack_pack_int64(&b->pk, v);
	}
	s(b, "out");
	msgpack_pack_array(&b->pk, 2);
	specn(b, "f32", od, 4);
	specn(b, "i64", od, 4);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, 3);
}

/* A convolution of x [N, C, HW, HW] by w [O, C, k, k] at stride st,
 * padding p, no bias */
static void strided_conv_graph(gb_t *b, const int64_t *cv)
{
	int64_t N = cv[0], C = cv[1], O = cv[2], HW = cv[3], k = cv[4],
		st = cv[5], p = cv[6];
	int64_t oh = (HW + 2 * p - k) / st + 1;
	const int64_t xd[4] = {N, C, HW, HW}, wd[4] = {O, C, k, k},
		      yd[4] = {N, O, oh, oh};
	const int64_t sv[2] = {st, st}, pv[2] = {p, p}, one[2] = {1, 1},
		      zero[2] = {0, 0};
	gb_init(b);
	graph_head(b, 2);
	specn(b, "f32", xd, 4);
	specn(b, "f32", wd, 4);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 1);
	node_head(b, "aten.convolution.default", 9);
	ref(b, 0);
	ref(b, 1);
	msgpack_pack_nil(&b->pk);
	ints2(b, sv);
	ints2(b, pv);
	ints2(b, one);
	msgpack_pack_false(&b->pk);
	ints2(b, zero);
	msgpack_pack_int64(&b->pk, 1);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	specn(b, "f32", yd, 4);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, 2);
}

/* Loads with a constant stride of 2-4 along the vectorized dim are vector
 * loads and a shuffle, and lane-uniform loads under a mask one load and a
 * blend (codegen.c load_strided, load_uniform_masked), not gathers: no
 * llvm.masked.gather in the IR, the interpreter's results, and no read
 * outside the input, which lies against an inaccessible page after its
 * end and then before its start (a row whose last lane is the tensor's
 * last element; a padded window that begins before the tensor). */
static void strided_loads_check(kiln_compiler_t *kc)
{
	const char *dts[2] = {"f32", "f64"};
	for (int d = 0; d < 2; d++) {
		for (int64_t step = 2; step <= 4; step++) {
			/* C: the last lane of the last row is x's last
			 * element (32 lanes), then a width with a tail */
			const int64_t Cs[2] = {step * 31 + 1, step * 37 + 2};
			for (int c = 0; c < 2; c++) {
				char what[96];
				snprintf(what, sizeof(what),
					 "-x[:, ::%lld] %s [5, %lld]",
					 (long long)step, dts[d],
					 (long long)Cs[c]);
				gb_t b;
				slice_step_graph(&b, dts[d], 5, Cs[c], step);
				cr_expect(!raw_ir_has(kc, &b, "slice",
						      "masked.gather"),
					  "%s: a gather", what);
				slice_step_graph(&b, dts[d], 5, Cs[c], step);
				kiln_graph_t *g =
				    graph_from_json_like("slice", &b.sb);
				for (int gu = GUARD_NONE; gu <= GUARD_START;
				     gu++)
					match_interp(kc, g, "default",
						     (uint64_t)(step + c), 0,
						     what, gu);
				kiln_graph_free(g);
				msgpack_sbuffer_destroy(&b.sb);
			}
		}
	}
	/* 3x3 windows at strides 2 and 3, 2x2 at stride 4 (over rows of
	 * 33, 64 and 65), padding 1 */
	const int64_t pools[4][3] = {
	    {3, 2, 33}, {3, 3, 64}, {2, 4, 65}, {3, 2, 64}};
	for (int i = 0; i < 4; i++) {
		int64_t k = pools[i][0], st = pools[i][1], hw = pools[i][2];
		char what[96];
		snprintf(what, sizeof(what),
			 "max_pool2d %lldx%lld stride %lld of x + bias, "
			 "[2, 3, %lld, %lld]",
			 (long long)k, (long long)k, (long long)st,
			 (long long)hw, (long long)hw);
		gb_t b;
		bias_pool_graph(&b, 2, 3, hw, hw, k, st);
		cr_expect(!raw_ir_has(kc, &b, "pool", "masked.gather"),
			  "%s: a gather", what);
		bias_pool_graph(&b, 2, 3, hw, hw, k, st);
		kiln_graph_t *g = graph_from_json_like("pool", &b.sb);
		for (int gu = GUARD_NONE; gu <= GUARD_START; gu++)
			match_interp(kc, g, "default", (uint64_t)(11 + i), 0,
				     what, gu);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	/* convolutions whose tiles of im2col (gen_conv_body) read every
	 * st-th element of x's rows: a 7x7/2 stem, 3x3/3 and 5x5/4, padded
	 * (where an AVX-512 CPU takes that path: the pick mask of
	 * load_strided is in the IR) */
	const int64_t convs[3][7] = {{4, 3, 16, 64, 7, 2, 3},
				     {8, 3, 16, 40, 3, 3, 1},
				     {8, 3, 16, 48, 5, 4, 2}};
	for (int i = 0; i < 3; i++) {
		const int64_t *cv = convs[i];
		char what[96], pick[48];
		snprintf(what, sizeof(what),
			 "conv %lldx%lld stride %lld of [%lld, 3, %lld, %lld]",
			 (long long)cv[4], (long long)cv[4], (long long)cv[5],
			 (long long)cv[0], (long long)cv[3], (long long)cv[3]);
		snprintf(pick, sizeof(pick), "<i32 0, i32 %lld, i32 %lld,",
			 (long long)cv[5], (long long)(2 * cv[5]));
		gb_t b;
		strided_conv_graph(&b, cv);
		kiln_graph_t *g = graph_from_json_like("conv", &b.sb);
		char *k = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		bool tiles = strstr(k, "im2col tiles") != NULL;
		free(k);
		if (tiles) {
			char *ir = emit_text(kc, g, KILN_EMIT_LLVM_RAW, NULL);
			cr_expect(strstr(ir, pick) != NULL,
				  "%s: no strided loads in its im2col tiles",
				  what);
			free(ir);
		}
		for (int gu = GUARD_NONE; gu <= GUARD_START; gu++)
			match_interp(kc, g, "default", (uint64_t)(21 + i), 1e-4,
				     what, gu);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
}

Test(codegen, strided_and_uniform_masked_loads_are_not_gathers)
{
	kiln_compiler_t *kc = new_compiler();
	strided_loads_check(kc);
	kiln_compiler_free(kc);
	/* and on 8 lanes, as an AVX2 CPU compiles them (vmaskmovps
	 * instead of AVX-512's masked moves) */
	kc = avx2_compiler();
	if (kc == NULL)
		return;
	gb_t b;
	slice_step_graph(&b, "f32", 5, 63, 2);
	cr_expect(raw_ir_has(kc, &b, "slice", "<8 x float>"),
		  "the AVX2 compiler's kernels are not 8 lanes wide");
	strided_loads_check(kc);
	kiln_compiler_free(kc);
}

Test(codegen, long_rows_prefetch_the_next)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	/* 4096 rows: 16 MiB, past the wavefront's limit (codegen.c
	 * CG_WAVE_MAX_BYTES), where the passes run one after another */
	row_op_graph(&b, "aten._log_softmax.default", 4096, 1024);
	cr_expect(raw_ir_has(kc, &b, "log_softmax", "llvm.prefetch"));
	row_op_graph(&b, "aten._log_softmax.default", 4096, 64);
	cr_expect(!raw_ir_has(kc, &b, "log_softmax", "llvm.prefetch"));
	/* softmax keeps exp(x - max) in its output's row, and prefetches
	 * in that exp pass (prefetch_pass), where the row is in L1 */
	softmax_graph(&b, 4096, 1024, 1);
	cr_expect(raw_ir_has(kc, &b, "softmax", "llvm.prefetch"));
	/* layer_norm over rows of 1024 (rsqrt is no transcendental here) */
	gb_init(&b);
	graph_head(&b, 1);
	spec2(&b, "f32", 8, 1024);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.native_layer_norm.default", 5);
	ref(&b, 0);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, 1024);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_double(&b.pk, 1e-5);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	spec2(&b, "f32", 8, 1024);
	spec2(&b, "f32", 8, 1);
	spec2(&b, "f32", 8, 1);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 1);
	cr_expect(!raw_ir_has(kc, &b, "layer_norm", "llvm.prefetch"));
	softmax_graph(&b, 8, 1024, 1);
	kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
	expect_matches_interp(kc, g, "default", 5, 1e-5, "softmax [8, 1024]");
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* native_layer_norm over the rows of an f32 [r, c] input, without weight
 * and bias; nout = 1 outputs y, 3 also the mean and rstd. */
static void layer_norm_graph(gb_t *b, int64_t r, int64_t c, int nout)
{
	gb_init(b);
	graph_head(b, 1);
	spec2(b, "f32", r, c);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, 1);
	node_head(b, "aten.native_layer_norm.default", 5);
	ref(b, 0);
	msgpack_pack_array(&b->pk, 1);
	msgpack_pack_int64(&b->pk, c);
	msgpack_pack_nil(&b->pk);
	msgpack_pack_nil(&b->pk);
	msgpack_pack_double(&b->pk, 1e-5);
	s(b, "out");
	msgpack_pack_array(&b->pk, 3);
	spec2(b, "f32", r, c);
	spec2(b, "f32", r, 1);
	spec2(b, "f32", r, 1);
	s(b, "outputs");
	msgpack_pack_array(&b->pk, (size_t)nout);
	for (int i = 0; i < nout; i++)
		ref(b, 1 + (uint32_t)i);
}

/* timm's LayerNorm2d after a convolution's bias: y = permute(layer_norm(
 * permute(x + cb, [0, 2, 3, 1]), [C], w, b), [0, 3, 1, 2]), with the mean
 * and rstd as outputs too. The statistics' row kernel reduces the last
 * dim of its space, C, whose elements lie H·W apart: vectorized along it,
 * every load was a gather of 16 lines on 16 pages (ConvNeXt-nano's
 * [8, 80, 32, 32]: 1.14 ms). It is vectorized across rows instead, along
 * W, where x's loads are contiguous and cb's uniform (codegen.c
 * cg_inner_vec): 0.05 ms. W of 32 (two blocks of 16 lanes), 20 (16 lanes
 * and a partial block of 4) and 7 (4 lanes and single rows), against the
 * interpreter; a layer norm over contiguous rows stays inner-vectorized. */
/* copy: 0 none; 1 the NHWC view is also an output (declared contiguous:
 * a copy the compiler makes); 2 layer_norm reads a clone of it, also an
 * output. What a training graph saves for the backward. */
static kiln_graph_t *layer_norm_2d_graph(int64_t N, int64_t C, int64_t H,
					 int64_t W, int copy)
{
	gb_t b;
	gb_init(&b);
	graph_head(&b, 4);
	const int64_t x4[4] = {N, C, H, W}, cb4[4] = {1, C, 1, 1},
		      p4[4] = {N, H, W, C}, r4[4] = {N, H, W, 1};
	specn(&b, "f32", x4, 4);
	specn(&b, "f32", cb4, 4);
	specn(&b, "f32", &C, 1);
	specn(&b, "f32", &C, 1);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, copy == 2 ? 5 : 4);
	node_head(&b, "aten.add.Tensor", 2);
	ref(&b, 0);
	ref(&b, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", x4, 4);
	static const int64_t to_last[4] = {0, 2, 3, 1}, back[4] = {0, 3, 1, 2};
	node_head(&b, "aten.permute.default", 2);
	ref(&b, 4);
	msgpack_pack_array(&b.pk, 4);
	for (int i = 0; i < 4; i++)
		msgpack_pack_int64(&b.pk, to_last[i]);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", p4, 4);
	uint32_t v = 5; /* layer_norm's input */
	if (copy == 2) {
		node_head(&b, "aten.clone.default", 1);
		ref(&b, 5);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		specn(&b, "f32", p4, 4);
		v = 6;
	}
	node_head(&b, "aten.native_layer_norm.default", 5);
	ref(&b, v);
	msgpack_pack_array(&b.pk, 1);
	msgpack_pack_int64(&b.pk, C);
	ref(&b, 2);
	ref(&b, 3);
	msgpack_pack_double(&b.pk, 1e-6);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 3);
	specn(&b, "f32", p4, 4);
	specn(&b, "f32", r4, 4);
	specn(&b, "f32", r4, 4);
	node_head(&b, "aten.permute.default", 2);
	ref(&b, v + 1);
	msgpack_pack_array(&b.pk, 4);
	for (int i = 0; i < 4; i++)
		msgpack_pack_int64(&b.pk, back[i]);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	specn(&b, "f32", x4, 4);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, copy ? 4 : 3);
	ref(&b, v + 4);
	ref(&b, v + 2);
	ref(&b, v + 3);
	if (copy)
		ref(&b, v);
	kiln_graph_t *g = graph_from_json_like("layer norm 2d", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

Test(codegen, strided_row_reductions_vectorize_across_rows)
{
	kiln_compiler_t *kc = new_compiler();
	const int64_t cs[3][4] = {
	    {2, 80, 8, 32}, {3, 24, 5, 20}, {2, 48, 3, 7}};
	for (int i = 0; i < 3; i++) {
		kiln_graph_t *g = layer_norm_2d_graph(cs[i][0], cs[i][1],
						      cs[i][2], cs[i][3], 0);
		char what[80];
		snprintf(what, sizeof(what),
			 "layer norm 2d [%lld, %lld, %lld, "
			 "%lld]",
			 (long long)cs[i][0], (long long)cs[i][1],
			 (long long)cs[i][2], (long long)cs[i][3]);
		expect_report_has(kc, g, "vectorized across rows", true, what);
		expect_matches_interp(kc, g, "default", 41 + i, 1e-5, what);
		kiln_graph_free(g);
	}
	gb_t b;
	layer_norm_graph(&b, 8, 80, 3);
	kiln_graph_t *g = graph_from_json_like("layer_norm", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	expect_report_has(kc, g, "vectorized across rows", false,
			  "layer norm [8, 80]");
	kiln_graph_free(g);
	kiln_compiler_free(kc);
}

/* The head line ("kiln_kN: ...") of the kernel whose member line holds
 * needle in report rep, as a new string; NULL where none does. */
static char *kernel_of(const char *rep, const char *needle)
{
	const char *m = strstr(rep, needle);
	if (m == NULL)
		return NULL;
	const char *h = NULL;
	for (const char *p = strstr(rep, "kiln_k"); p != NULL && p < m;
	     p = strstr(p + 1, "\nkiln_k"))
		h = *p == '\n' ? p + 1 : p;
	if (h == NULL)
		return NULL;
	const char *e = strchr(h, '\n');
	return strndup(h, e != NULL ? (size_t)(e - h) : strlen(h));
}

/* The training graph of a LayerNorm2d also saves the NHWC tensor for the
 * backward (the permuted view declared contiguous, or a clone of it): a
 * copy stored along C, a full member whose loads read C with a stride.
 * It stays out of the statistics' row kernel (sched.c loses_across), in
 * a pointwise kernel of its own, and the statistics stay vectorized
 * across rows: in one kernel, every load of both had been a gather
 * (ConvNeXt-nano's training forward: 4.3 ms). Against the interpreter. */
Test(fusion, transposing_copies_stay_out_of_strided_row_kernels)
{
	kiln_compiler_t *kc = new_compiler();
	for (int copy = 1; copy <= 2; copy++) {
		kiln_graph_t *g = layer_norm_2d_graph(2, 48, 4, 32, copy);
		char what[64];
		snprintf(what, sizeof(what), "layer norm 2d, copy %d", copy);
		char *rep = NULL;
		n_kernels(kc, g, &rep);
		char *k = kernel_of(rep, copy == 1 ? "<- node 1 aten.permute"
						   : "<- node 2 aten.clone");
		cr_expect(k != NULL && strstr(k, "pointwise kernel") != NULL,
			  "%s:\n%s", what, rep);
		k = (free(k), kernel_of(rep, "reduce sum"));
		cr_expect(k != NULL &&
			      strstr(k, "vectorized across rows") != NULL,
			  "%s:\n%s", what, rep);
		free(k);
		free(rep);
		expect_matches_interp(kc, g, "default", 51 + copy, 1e-5, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* An inner-vectorized row kernel of two passes or more whose first pass
 * only reduces runs that pass one row ahead (codegen.c
 * gen_row_unit_ahead): the next row's, between this row's last two
 * passes; the first row of each thread's range runs its own. On a pool of
 * three threads, 50 rows of 1000 (a grain of 16 rows: ranges [0, 17),
 * [17, 34), [34, 50); on 16 lanes the rows end in a partial vector), 1
 * row and 2 rows:
 * - against the interpreter, softmax and log_softmax (three passes: max,
 *   sum, output) and layer_norm (three: mean, variance, output), also with
 *   its mean, which the first pass stores, and rstd as outputs;
 * - softmax and log_softmax of rows shifted by multiples of 150 (row r by
 *   150·(r·7 mod 5) - 300), against both in f64: softmax's and
 *   log_softmax's values do not depend on the max they shift by, but with
 *   another row's max every exp of a row overflows or underflows.
 * A first pass of the wrong row, or a first row that skipped its own,
 * fails it. */
Test(codegen, row_kernels_run_their_first_pass_a_row_ahead)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	/* (softmax past the wavefront's limit: below it, the next test) */
	softmax_graph(&b, 4096, 1024, 1);
	cr_expect(raw_ir_has(kc, &b, "softmax", "\nahead"),
		  "softmax's first pass does not run a row ahead");
	layer_norm_graph(&b, 8, 1024, 3);
	cr_expect(raw_ir_has(kc, &b, "layer_norm", "\nahead"),
		  "layer_norm's first pass does not run a row ahead");
	/* the report says so; softmax over the outer dim (rows vectorized
	 * across) does not run ahead */
	for (int dim = 1; dim >= 0; dim--) {
		softmax_graph(&b, 4096, 1024, dim);
		kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
		char *k = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		cr_expect_eq(strstr(k, ", first pass a row ahead,") != NULL,
			     dim == 1, "softmax over dim %d:\n%s", dim, k);
		free(k);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	cr_assert_eq(kiln_pool_new(3, &match_pool), 0);
	/* softmax and log_softmax over these run as a wavefront (the next
	 * test): 1 to 4 rows are ranges shorter than, as long as and longer
	 * than its three passes */
	const int64_t rows[5] = {50, 1, 2, 3, 4};
	for (int i = 0; i < 5; i++) {
		int64_t r = rows[i];
		for (int op = 0; op < 4; op++) {
			char what[96];
			static const char *const ops[4] = {
			    "aten._softmax.default",
			    "aten._log_softmax.default", "layer_norm",
			    "layer_norm (3 outputs)"};
			snprintf(what, sizeof(what), "%s over [%lld, 1000]",
				 ops[op], (long long)r);
			if (op < 2)
				row_op_graph(&b, ops[op], r, 1000);
			else
				layer_norm_graph(&b, r, 1000, op == 2 ? 1 : 3);
			kiln_graph_t *g = graph_from_json_like(what, &b.sb);
			expect_matches_interp(kc, g, "default",
					      (uint64_t)(40 + op), 1e-5, what);
			kiln_graph_free(g);
			msgpack_sbuffer_destroy(&b.sb);
		}
	}
	enum { R = 50, C = 1000 };
	static float x[R * C];
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] =
			    (float)(kiln_td_prng_uniform(
					7, (uint64_t)(r * C + c), -1, 1) +
				    150.0 * ((r * 7) % 5) - 300.0);
	for (int op = 0; op < 2; op++) {
		const char *name = op == 0 ? "aten._softmax.default"
					   : "aten._log_softmax.default";
		row_op_graph(&b, name, R, C);
		float *y = run_f32_graph_on(kc, &b, name, x, R, C);
		int bad = 0;
		for (int r = 0; r < R && bad < 3; r++) {
			double mx = -INFINITY, sum = 0;
			for (int c = 0; c < C; c++)
				mx = fmax(mx, x[r * C + c]);
			for (int c = 0; c < C; c++)
				sum += exp((double)x[r * C + c] - mx);
			for (int c = 0; c < C; c++) {
				double d = (double)x[r * C + c] - mx;
				double want =
				    op == 0 ? exp(d) / sum : d - log(sum);
				double got = y[r * C + c];
				if (fabs(got - want) <=
				    1e-5 * fabs(want) + 1e-6)
					continue;
				bad++;
				cr_expect(false,
					  "%s of shifted rows: row %d col %d: "
					  "%.9g, want %.9g",
					  name, r, c, got, want);
				break;
			}
		}
		free(y);
	}
	kiln_pool_free(match_pool);
	match_pool = NULL;
	kiln_compiler_free(kc);
}

/* A wavefront over rows of 2^k >= 1024 f32 (codegen.c gen_kernel_body)
 * walks pass p of each row from column p·C/n and wraps, so that its passes'
 * accesses are not 4096 bytes apart. softmax and log_softmax over [R,
 * 1024] and [R, 2048], R = 1 to 5, 37 and 300 (ranges shorter than, as long as
 * and longer than the three passes, where rows run in the ramps or the
 * wavefront's loop): against the interpreter on three threads, and the
 * same bits on one thread as on three (a row's sums do not depend on
 * which loop ran it). The IR before O3 has the wrap (an and with C - 1)
 * for rows of 1024 and not for rows of 1000. */
Test(codegen, wavefront_rows_of_4k_rotate_their_passes)
{
	kiln_compiler_t *kc = new_compiler();
	bool avx = __builtin_cpu_supports("avx512f");
	gb_t b;
	softmax_graph(&b, 8, 1024, 1);
	cr_expect_eq(raw_ir_has(kc, &b, "softmax", ", 1023\n"), avx,
		     "softmax over [8, 1024]: the wrap in the IR");
	softmax_graph(&b, 8, 1000, 1);
	cr_expect(!raw_ir_has(kc, &b, "softmax", ", 999\n"),
		  "softmax over [8, 1000] wraps");
	/* the report says so: 1024 / 3 passes, in whole vectors of 16 */
	for (int cc = 0; cc < 2; cc++) {
		softmax_graph(&b, 8, cc ? 1000 : 1024, 1);
		kiln_graph_t *g = graph_from_json_like("softmax", &b.sb);
		char *k = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		cr_expect_eq(strstr(k, ", pass p from column p*336,") != NULL,
			     avx && cc == 0, "%s", k);
		free(k);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	static const int64_t rows[] = {1, 2, 3, 4, 5, 37, 300};
	for (int op = 0; op < 2; op++)
		for (int cc = 0; cc < 2; cc++)
			for (size_t i = 0; i < sizeof(rows) / sizeof(*rows);
			     i++) {
				int64_t R = rows[i], C = cc ? 2048 : 1024;
				const char *name =
				    op ? "aten._log_softmax.default"
				       : "aten._softmax.default";
				char what[96];
				snprintf(what, sizeof(what),
					 "%s over [%lld, %lld]", name,
					 (long long)R, (long long)C);
				float *x =
				    malloc(sizeof(float) * (size_t)(R * C));
				cr_assert_not_null(x);
				for (int64_t e = 0; e < R * C; e++)
					x[e] = (float)(kiln_td_prng_uniform(
							   11, (uint64_t)e, -6,
							   6) +
						       (double)(e % C) / 64.0);
				float *y[2];
				for (int pool = 0; pool < 2; pool++) {
					cr_assert_eq(kiln_pool_new(pool ? 3 : 1,
								   &match_pool),
						     0);
					row_op_graph(&b, name, R, C);
					y[pool] = run_f32_graph_on(kc, &b, what,
								   x, R, C);
					if (pool == 1) {
						row_op_graph(&b, name, R, C);
						kiln_graph_t *g =
						    graph_from_json_like(what,
									 &b.sb);
						expect_matches_interp(
						    kc, g, "default",
						    (uint64_t)(70 + op), 1e-5,
						    what);
						kiln_graph_free(g);
						msgpack_sbuffer_destroy(&b.sb);
					}
					kiln_pool_free(match_pool);
					match_pool = NULL;
				}
				cr_expect(memcmp(y[0], y[1],
						 sizeof(float) *
						     (size_t)(R * C)) == 0,
					  "%s: other bits on 3 threads", what);
				free(y[0]);
				free(y[1]);
				free(x);
			}
	kiln_compiler_free(kc);
}

/* argmax(softmax(x)) over rows of 1024 and 2048: one wavefront kernel
 * with the argmax in its last pass, not rotated (a lane keeps the first
 * index it visits on a tie: rotated, rows of equal values gave 672, not
 * 0). Rows of zeros (every column ties: 0) and of (7·c) % 5 (first max at
 * column 2), on one thread and on three. */
Test(codegen, wavefront_argmax_keeps_the_first_index)
{
	kiln_compiler_t *kc = new_compiler();
	bool avx = __builtin_cpu_supports("avx512f");
	enum { R = 8 };
	for (int cc = 0; cc < 2; cc++) {
		int64_t C = cc ? 2048 : 1024;
		for (int fill = 0; fill < 2; fill++)
			for (int pool = 0; pool < 2; pool++) {
				gb_t b;
				gb_init(&b);
				graph_head(&b, 1);
				spec2(&b, "f32", R, C);
				s(&b, "nodes");
				msgpack_pack_array(&b.pk, 2);
				node_head(&b, "aten._softmax.default", 3);
				ref(&b, 0);
				msgpack_pack_int64(&b.pk, 1);
				msgpack_pack_false(&b.pk);
				s(&b, "out");
				msgpack_pack_array(&b.pk, 1);
				spec2(&b, "f32", R, C);
				node_head(&b, "aten.argmax.default", 3);
				ref(&b, 1);
				msgpack_pack_int64(&b.pk, 1);
				msgpack_pack_false(&b.pk);
				s(&b, "out");
				msgpack_pack_array(&b.pk, 1);
				const int64_t d1[1] = {R};
				specn(&b, "i64", d1, 1);
				s(&b, "outputs");
				msgpack_pack_array(&b.pk, 2);
				ref(&b, 1);
				ref(&b, 2);
				if (fill == 0 && pool == 0) {
					kiln_graph_t *g = graph_from_json_like(
					    "argmax(softmax)", &b.sb);
					char *k = emit_text(
					    kc, g, KILN_EMIT_KERNELS, NULL);
					cr_expect_eq(
					    strstr(k,
						   ", passes as a wavefront") !=
						NULL,
					    avx, "%s", k);
					cr_expect(strstr(k, "from column") ==
						      NULL,
						  "%s", k);
					free(k);
					kiln_graph_free(g);
				}
				float *x =
				    malloc(sizeof(float) * (size_t)(R * C));
				cr_assert_not_null(x);
				for (int64_t e = 0; e < R * C; e++)
					x[e] = fill ? (float)((7 * (e % C)) % 5)
						    : 0.0f;
				cr_assert_eq(
				    kiln_pool_new(pool ? 3 : 1, &match_pool),
				    0);
				kiln_graph_t *g = graph_from_json_like(
				    "argmax(softmax)", &b.sb);
				kiln_module_t *m = module_of(kc, g, "argmax");
				kiln_tensor_t in;
				int64_t sz[2] = {R, C};
				cr_assert_eq(kiln_td_tensor_alloc(
						 &in, KILN_DT_F32, 2, sz),
					     0);
				memcpy(in.data, x,
				       sizeof(float) * (size_t)(R * C));
				kiln_io_t arg = {KILN_IO_TENSOR, 0, in};
				void *ob[2] = {NULL, NULL};
				kiln_io_t out[2];
				kiln_run_opts_t ro;
				memset(&ro, 0, sizeof(ro));
				ro.pool = match_pool;
				char err[512];
				cr_assert_eq(kiln_module_run(m, &arg, 1, ob,
							     out, &ro, err,
							     sizeof(err)),
					     0, "%s", err);
				const int64_t *y = out[1].t.data;
				for (int r = 0; r < R; r++)
					cr_expect_eq(
					    y[r], fill ? 2 : 0,
					    "argmax(softmax) over [%d, "
					    "%lld], %s, %d threads: row "
					    "%d gives %lld",
					    R, (long long)C,
					    fill ? "(7c) % 5" : "zeros",
					    pool ? 3 : 1, r, (long long)y[r]);
				free(ob[0]);
				free(ob[1]);
				kiln_td_tensor_free(&in);
				kiln_module_free(m);
				kiln_graph_free(g);
				msgpack_sbuffer_destroy(&b.sb);
				kiln_pool_free(match_pool);
				match_pool = NULL;
				free(x);
			}
	}
	kiln_compiler_free(kc);
}

/* A row kernel with a transcendental in a later pass, at most 8 MiB
 * (softmax, log_softmax) runs its passes as a wavefront (codegen.c
 * gen_row_wave): step s runs pass p on row s - p, all passes in one loop;
 * layer_norm (light passes) and 16 MiB of softmax run them one after
 * another. The previous test checks softmax and log_softmax of 1 to 50
 * rows on three threads against the interpreter and rows whose maxes
 * differ by hundreds (a pass on another row's values overflows). Here:
 * - the report and the IR (its wavefront blocks);
 * - softmax over the last dim of [3, 5, 200] (two outer vars: each pass's
 *   unit is decomposed) and of [7, 33] (rows of two vectors and a rest),
 *   on three threads and on one, against the interpreter;
 * - softmax of rows with -inf entries, a row of one finite value among
 *   -inf and a row of -inf only (torch's NaN), against f64, each row
 *   different from its neighbours. */
Test(codegen, softmax_rows_run_as_a_wavefront)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	static const struct {
		const char *op;
		int64_t r;
		bool wave;
	} cases[] = {{"aten._softmax.default", 8, true},
		     {"aten._log_softmax.default", 8, true},
		     {"aten._softmax.default", 4096, false},
		     {"layer_norm", 8, false}};
	/* 16 lanes only (cg_row_wave) */
	bool avx = __builtin_cpu_supports("avx512f");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		bool wave = cases[i].wave && avx;
		if (strcmp(cases[i].op, "layer_norm") == 0)
			layer_norm_graph(&b, cases[i].r, 1024, 1);
		else
			row_op_graph(&b, cases[i].op, cases[i].r, 1024);
		kiln_graph_t *g = graph_from_json_like(cases[i].op, &b.sb);
		char *k = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		cr_expect_eq(strstr(k, ", passes as a wavefront") != NULL, wave,
			     "%s over [%lld, 1024]:\n%s", cases[i].op,
			     (long long)cases[i].r, k);
		cr_expect_eq(strstr(k, ", first pass a row ahead") != NULL,
			     !wave, "%s over [%lld, 1024]:\n%s", cases[i].op,
			     (long long)cases[i].r, k);
		free(k);
		kiln_graph_free(g);
		cr_expect_eq(raw_ir_has(kc, &b, cases[i].op, "\nwave_on"), wave,
			     "%s over [%lld, 1024]: IR", cases[i].op,
			     (long long)cases[i].r);
	}
	for (int pool = 0; pool < 2; pool++) {
		if (pool == 1)
			cr_assert_eq(kiln_pool_new(3, &match_pool), 0);
		const int64_t d3[3] = {3, 5, 200};
		row_op_nd_graph(&b, "aten._softmax.default", d3, 3, -1);
		kiln_graph_t *g = graph_from_json_like("softmax 3d", &b.sb);
		char *k = emit_text(kc, g, KILN_EMIT_KERNELS, NULL);
		cr_expect_eq(strstr(k, ", passes as a wavefront") != NULL, avx,
			     "%s", k);
		free(k);
		expect_matches_interp(kc, g, "default", (uint64_t)(60 + pool),
				      1e-5, "softmax over [3, 5, 200]");
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
		softmax_graph(&b, 7, 33, 1);
		g = graph_from_json_like("softmax [7, 33]", &b.sb);
		expect_matches_interp(kc, g, "default", (uint64_t)(62 + pool),
				      1e-5, "softmax over [7, 33]");
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	enum { R = 9, C = 100 };
	static float x[R * C];
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++) {
			float v = (float)(kiln_td_prng_uniform(
					      9, (uint64_t)(r * C + c), -4, 4) +
					  40.0 * (r % 3));
			/* every third column of even rows is -inf; row 5
			 * has one finite value, row 7 none */
			if ((r % 2 == 0 && c % 3 == 0) || (r == 5 && c != 17) ||
			    r == 7)
				v = -INFINITY;
			x[r * C + c] = v;
		}
	softmax_graph(&b, R, C, 1);
	float *y = run_f32_graph_on(kc, &b, "softmax with -inf", x, R, C);
	for (int r = 0; r < R; r++) {
		double mx = -INFINITY, sum = 0;
		for (int c = 0; c < C; c++)
			mx = fmax(mx, x[r * C + c]);
		for (int c = 0; c < C; c++)
			sum += exp((double)x[r * C + c] - mx);
		for (int c = 0; c < C; c++) {
			double want = exp((double)x[r * C + c] - mx) / sum;
			double got = y[r * C + c];
			bool ok = isnan(want) ? isnan(got)
					      : fabs(got - want) <=
						    1e-5 * fabs(want) + 1e-7;
			if (!ok) {
				cr_expect(false,
					  "softmax with -inf: row %d col %d: "
					  "%.9g, want %.9g",
					  r, c, got, want);
				break;
			}
		}
	}
	free(y);
	kiln_pool_free(match_pool);
	match_pool = NULL;
	kiln_compiler_free(kc);
}

/* exp at its edges, each value at every lane position of a row of 37
 * (the 16- or 8-wide body, the 8 and 4 parts, the scalar rest), against
 * libm's expf: relative 2e-6 on the finite range, 0 below -87.34
 * (denormal results flush; AVX-512's 16-lane exp keeps them), +inf above
 * 88.72, NaN for NaN, exact at 0. */
Test(codegen, exp_edges)
{
	static const float xs[] = {
	    -INFINITY, -1000.0f, -103.0f, -87.4f,   -87.33f,
	    -87.0f,    -50.5f,	 -1.0f,	  -1e-30f,  0.0f,
	    1e-7f,     0.5f,	 1.0f,	  10.25f,   63.0f,
	    88.0f,     88.3f,	 88.5f,	  88.72f,   88.72283935546875f,
	    88.723f,   89.0f,	 1000.0f, INFINITY, NAN};
	enum { N = sizeof(xs) / sizeof(xs[0]), C = 37 };
	gb_t b;
	one_node(&b, "aten.exp.default", N, C, -1, 0, N, C, 0, NULL);
	/* row v: value v at column v % C, its neighbours elsewhere, so every
	 * value meets every lane position over the rows */
	static float x[N * C];
	for (int r = 0; r < N; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] = xs[(r + c) % N];
	float *y = run_f32_graph(&b, "exp", x, N, C);
	for (int i = 0; i < N * C; i++) {
		float v = x[i], got = y[i], want = expf(v);
		if (isnan(v)) {
			cr_expect(isnan(got), "exp(nan) = %g at %d", got, i);
			continue;
		}
		if (v < -87.34f) {
			/* flushed to 0, or (AVX-512's vscalefps) the denormal
			 */
			cr_expect(got == 0.0f || fabsf(got - want) <=
						     2e-6f * want + 1e-44f,
				  "exp(%g) = %g, not 0 or %g", v, got, want);
			continue;
		}
		if (isinf(want) || v == 0.0f) {
			cr_expect(got == want, "exp(%g) = %g, not %g", v, got,
				  want);
			continue;
		}
		cr_expect(fabsf(got - want) <= 2e-6f * want,
			  "exp(%g) = %.9g, libm %.9g (column %d)", v, got, want,
			  i % C);
	}
	free(y);
}

/* op over 37 x 2048 values spread evenly over [lo, hi] (every lane
 * position), against ref in f64: within max_ulp. */
static void expect_sweep_ulps(const char *op, double (*ref)(double), double lo,
			      double hi, double max_ulp)
{
	enum { N = 2048, C = 37 };
	static float x[N * C];
	for (int i = 0; i < N * C; i++)
		x[i] = (float)(lo + (hi - lo) * (double)i / (N * C - 1));
	gb_t b;
	one_node(&b, op, N, C, -1, 0, N, C, 0, NULL);
	float *y = run_f32_graph(&b, op, x, N, C);
	double worst = 0;
	int at = 0;
	for (int i = 0; i < N * C; i++) {
		double e = ulps_f32(y[i], ref((double)x[i]));
		if (e > worst) {
			worst = e;
			at = i;
		}
	}
	cr_expect(worst <= max_ulp, "%s(%.9g) = %.9g, %.2f ulp from %.9g", op,
		  x[at], y[at], worst, ref((double)x[at]));
	free(y);
}

/* exp over [-87.33, 88.72] (the top end is where n = 127 widens the
 * reduced argument): within 2 ulp (mathfn.c: 1.42 over every f32 on AVX2
 * and in tails, measured exhaustively; vscalefps's <= 2). tanh over
 * [-10, 10] (both of its branches and the switch at 0.625): within 3 (1.78
 * measured; 1.20 with exp(2|x|) before). */
Test(codegen, math_accuracy_sweeps)
{
	expect_sweep_ulps("aten.exp.default", exp, -87.33, 88.72, 2.0);
	expect_sweep_ulps("aten.tanh.default", tanh, -10.0, 10.0, 3.0);
}

/* A compiler for the host CPU with some of its features off: each
 * "+feature" that is drop, or that starts with drop where drop ends in
 * '*', becomes "-feature". NULL where the host lacks the feature need. */
static kiln_compiler_t *host_compiler_without(const char *need,
					      const char *drop)
{
	kiln_compiler_t *host = new_compiler();
	kiln_target_t t = *kiln_compiler_target(host);
	kiln_compiler_free(host);
	size_t nl = strlen(need), dl = strlen(drop);
	bool prefix = dl > 0 && drop[dl - 1] == '*', has = false;
	if (prefix)
		dl--;
	for (char *tok = t.features; *tok != '\0';) {
		size_t n = strcspn(tok, ",");
		has |= n == nl && strncmp(tok, need, nl) == 0;
		if ((prefix ? n >= dl : n == dl) && strncmp(tok, drop, dl) == 0)
			tok[0] = '-';
		tok += n + (tok[n] == ',');
	}
	if (!has)
		return NULL;
	kiln_compiler_t *kc = NULL;
	char err[512];
	cr_assert_eq(kiln_compiler_new(&t, &kc, err, sizeof(err)), 0, "%s",
		     err);
	return kc;
}

/* gelu is x·Φ(x) with Φ one function (mathfn.c: phi_f32_avx512's table of
 * polynomials on 16 lanes of AVX-512, the rational phi_f32 elsewhere):
 * over 37 x 2048 values spread over [-12, 12] and at its edges, against x
 * (1 + erf(x/√2)) / 2 in f64: within 3e-7·|x| (Φ: 6.19e-8 measured for
 * the table, 1.98e-7 for the rational over every f32 in [-12, 12]);
 * exactly x beyond 5.5437 and -0 below -5.5437 (where torch's f32 formula
 * gives those), +inf at +inf, NaN at -inf (-inf·0, as torch) and NaN, -0
 * at -0, and ±5.49 (the table's zero interval, below 5.5437) within the
 * tolerance. The 37 columns put values at every lane of the 16-lane body
 * and the scalar rest. Run by the host's compiler, by one without
 * AVX512DQ (the table's s = u - round(u) without vreduceps) and by an AVX2
 * one (the rational on 8 lanes). */
static void expect_gelu_phi(kiln_compiler_t *kc, const char *what, bool table,
			    bool reduce)
{
	gb_t ir;
	one_node(&ir, "aten.gelu.default", 64, 64, -1, 0, 64, 64, 0, NULL);
	cr_expect_eq(raw_ir_has(kc, &ir, what, "vpermi2var"), table,
		     "%s: the table of polynomials %s", what,
		     table ? "is not used" : "is used");
	one_node(&ir, "aten.gelu.default", 64, 64, -1, 0, 64, 64, 0, NULL);
	cr_expect_eq(raw_ir_has(kc, &ir, what, "reduce.ps"), reduce,
		     "%s: vreduceps %s", what,
		     reduce ? "is not used" : "is used");
	enum { N = 2048, C = 37, E = 11 };
	static float x[N * C];
	static const float edges[E] = {INFINITY, -INFINITY, NAN,   -0.0f,
				       5.5437f,	 5.6f,	    -5.6f, -100.0f,
				       1e30f,	 5.49f,	    -5.49f};
	for (int i = 0; i < N * C; i++)
		x[i] = i < E ? edges[i]
			     : (float)(-12.0 + 24.0 * (double)i / (N * C - 1));
	gb_t b;
	one_node(&b, "aten.gelu.default", N, C, -1, 0, N, C, 0, NULL);
	float *y = run_f32_graph_on(kc, &b, what, x, N, C);
	cr_expect(isinf(y[0]) && y[0] > 0, "%s: gelu(inf) = %g", what, y[0]);
	cr_expect(isnan(y[1]), "%s: gelu(-inf) = %g, not NaN", what, y[1]);
	cr_expect(isnan(y[2]), "%s: gelu(nan) = %g", what, y[2]);
	cr_expect(y[3] == 0 && signbit(y[3]), "%s: gelu(-0) = %g, not -0", what,
		  y[3]);
	int bad = 0;
	for (int i = 3; i < N * C && bad < 5; i++) {
		double v = x[i], want = v * 0.5 * (1 + erf(v / sqrt(2.0)));
		if (fabs(v) >= 5.5437) {
			float exact = v > 0 ? x[i] : -0.0f;
			bool ok =
			    y[i] == exact && signbit(y[i]) == signbit(exact);
			bad += !ok;
			cr_expect(ok, "%s: gelu(%.9g) = %.9g, not %.9g", what,
				  v, y[i], exact);
			continue;
		}
		bool ok = fabs(y[i] - want) <= 3e-7 * fabs(v) + 1e-30;
		bad += !ok;
		cr_expect(ok, "%s: gelu(%.9g) = %.9g, want %.9g", what, v, y[i],
			  want);
	}
	free(y);
}

Test(codegen, gelu_phi)
{
	kiln_compiler_t *kc = new_compiler();
	const char *f = kiln_compiler_target(kc)->features;
	bool avx512 = strstr(f, "+avx512f,") != NULL ||
		      strstr(f, "+avx512f") == f + strlen(f) - 8;
	expect_gelu_phi(kc, "gelu (host)", avx512,
			avx512 && strstr(f, "+avx512dq") != NULL);
	kiln_compiler_free(kc);
	kc = host_compiler_without("+avx512f", "+avx512dq");
	if (kc != NULL) {
		expect_gelu_phi(kc, "gelu (AVX-512 without DQ)", true, false);
		kiln_compiler_free(kc);
	}
	kc = host_compiler_without("+avx2", "+avx512*");
	if (kc != NULL) {
		expect_gelu_phi(kc, "gelu (AVX2)", false, false);
		kiln_compiler_free(kc);
	}
}

/* softmax's exp(x - max) (OP_EXPSUB; mathfn.c: in base 2 on 16 AVX-512
 * lanes, exp_nonpos_f32(x - max) elsewhere). Rows [m, m + v1, ...,
 * m + v36] with the v spread over [-87.3, 0] (softmax's row [m, m + v] is
 * e^v / (1 + ...), so each output carries that exp's error), m = 0 (x -
 * max exact) or 37.25 (x - max rounded, as most rows' are); rows of
 * edges: -inf and -1000 (0), -87.4 (below the flush), -0.0, a NaN row (all
 * NaN), an all -inf row (NaN, as torch), a row with +inf (NaN: inf - inf);
 * rows whose max·log2 e overflows f32 (FLT_MAX, 3e38, -3e38, where only
 * the elements equal to the max count) or nearly does (2.3e38), and rows
 * whose max is 1e6, 2^30 (with 2^30 - 64: e^-64 counts), 1.5e9 or -3e9
 * (the three ways mathfn.c takes b·log2 e, and the edge between two).
 * Against softmax in f64 from the same f32 inputs: within 6 + 1.25·|x -
 * max| ulp, or 0 where the true value is below 2^-126. The base-2 form
 * rounds t = x·log2 e - max·log2 e once (ln 2·ulp(t)/2 relative: up to
 * |x - max| ulp) and log2 e's f32 rounding adds |x - max|·1.3e-8 (up to
 * 0.22·|x - max| ulp); measured: 62 ulp at x - max = -86 with max 0
 * (where x - max is exact and the exp of it had <= 4.73), 53 at -44.4
 * with max 37.25. Run by the host's compiler, by one without AVX512DQ (f
 * = t - floor(t) without vreduceps) and by an AVX2 one (the exp of x -
 * max). */
static void expect_softmax_exp(kiln_compiler_t *kc, const char *what)
{
	enum { N = 1048, C = 37, HALF = (N - 16) / 2 };
	static float x[N * C];
	for (int r = 0; r < N - 16; r++) {
		float m = r < HALF ? 0.0f : 37.25f;
		int rr = r % HALF;
		x[r * C] = m;
		for (int c = 1; c < C; c++)
			x[r * C + c] =
			    m + (float)(-87.3 * (double)(rr * (C - 1) + c - 1) /
					(HALF * (C - 1) - 1));
	}
	static const float edges[] = {-INFINITY, -1000.0f, -87.4f, -0.0f,
				      -1e-30f,	 -88.0f,   -1.5f};
	for (int r = N - 16; r < N - 12; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] = c == 0 ? 0.0f : edges[(r + c) % 7];
	x[(N - 14) * C + 5] = NAN;
	for (int c = 0; c < C; c++)
		x[(N - 13) * C + c] = -INFINITY;
	/* max·log2 e beyond FLT_MAX, and just below */
	static const float big[][4] = {{FLT_MAX, 1e38f, -FLT_MAX, FLT_MAX},
				       {3e38f, -INFINITY, 0.0f, 2e38f},
				       {-3e38f, -FLT_MAX, -INFINITY, -3e38f},
				       {2.3e38f, 2.2e38f, 2.3e38f, 1.0f},
				       {-2.3e38f, -2.3e38f, -3e38f, -1e30f},
				       {INFINITY, 0.0f, -1.0f, 1e30f},
				       {1e30f, 1e30f, -1e30f, 5.0f},
				       {-1e-30f, -87.0f, -INFINITY, 0.0f}};
	static const float mid[][4] = {
	    {1e6f, 1e6f - 0.0625f, 1e6f - 30.0f, 1e6f - 1.0f},
	    {1.5e9f, 1.5e9f - 128.0f, 1.5e9f, -1.5e9f},
	    {-3e9f, -3e9f - 256.0f, -3e9f, -3.5e9f},
	    {0x1p30f, 0x1p30f - 64.0f, 0x1p30f - 128.0f, -0x1p30f}};
	for (int r = N - 12; r < N - 8; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] = mid[r - (N - 12)][c % 4];
	for (int r = N - 8; r < N; r++)
		for (int c = 0; c < C; c++)
			x[r * C + c] = big[r - (N - 8)][c % 4];
	gb_t b;
	softmax_graph(&b, N, C, 1);
	float *y = run_f32_graph_on(kc, &b, what, x, N, C);
	double worst = 0, wwant = 0;
	float wx = 0, wgot = 0, wm = 0;
	for (int r = 0; r < N; r++) {
		double mx = -INFINITY, sum = 0;
		bool nan = false;
		for (int c = 0; c < C; c++) {
			nan |= isnan(x[r * C + c]) || x[r * C + c] == INFINITY;
			mx = fmax(mx, x[r * C + c]);
		}
		for (int c = 0; c < C; c++)
			sum += exp((double)x[r * C + c] - mx);
		for (int c = 0; c < C; c++) {
			float got = y[r * C + c];
			if (nan || r == N - 13) {
				cr_expect(isnan(got), "%s row %d: %g, not NaN",
					  what, r, got);
				continue;
			}
			double want = exp((double)x[r * C + c] - mx) / sum;
			if (want < 0x1p-126) {
				cr_expect(got == 0.0f ||
					      fabs(got - want) <= 0x1p-140,
					  "%s: softmax(%g) = %g, not 0 or %g",
					  what, x[r * C + c], got, want);
				continue;
			}
			double e =
			    ulps_f32(got, want) /
			    (6.0 + 1.25 * fabs((double)x[r * C + c] - mx));
			if (e > worst) {
				worst = e;
				wx = x[r * C + c];
				wm = (float)mx;
				wgot = got;
				wwant = want;
			}
		}
	}
	cr_expect(worst <= 1.0,
		  "%s: softmax(%.9g) (max %.9g) = %.9g, %.2f of the bound from "
		  "%.9g",
		  what, wx, wm, wgot, worst, wwant);
	free(y);
}

Test(codegen, softmax_exp)
{
	kiln_compiler_t *kc = new_compiler();
	expect_softmax_exp(kc, "softmax (host)");
	kiln_compiler_free(kc);
	kc = host_compiler_without("+avx512f", "+avx512dq");
	if (kc != NULL) {
		expect_softmax_exp(kc, "softmax (AVX-512 without DQ)");
		kiln_compiler_free(kc);
	}
	kc = host_compiler_without("+avx2", "+avx512*");
	if (kc != NULL) {
		expect_softmax_exp(kc, "softmax (AVX2)");
		kiln_compiler_free(kc);
	}
}

Test(invalid, add_shape_mismatch)
{
	gb_t b;
	one_node(&b, "aten.add.Tensor", 3, 4, 5, 4, 3, 4, 0, NULL);
	expect_invalid("add", &b, "broadcast");
}

Test(invalid, reduction_dim_out_of_range)
{
	gb_t b;
	int64_t dims = 5;
	one_node(&b, "aten._softmax.default", 3, 4, -1, 0, 3, 4, 1, &dims);
	expect_invalid("softmax dim 5", &b, "out of range");
}

Test(invalid, impossible_view)
{
	gb_t b;
	int64_t sz = INT64_MIN; /* [5, 7] */
	one_node(&b, "aten.view.default", 3, 4, -1, 0, 5, 7, 1, &sz);
	expect_invalid("view 12 as 35", &b, "cannot view");
}

Test(invalid, declared_shape_disagrees)
{
	gb_t b;
	one_node(&b, "aten.relu.default", 3, 4, -1, 0, 4, 3, 0, NULL);
	expect_invalid("relu out shape", &b, "declared size");
}

/* KILN_COMPILE_THREADS is read when the compiler is made: anything but
 * a count from 1 to 8 is an error naming it; a valid count compiles. */
Test(settings, compile_threads_are_checked)
{
	char err[512];
	kiln_compiler_t *kc = NULL;
	const char *bad[] = {"abc", "0", "9", "2x", "-1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("KILN_COMPILE_THREADS", bad[i], 1);
		int rc = kiln_compiler_new(NULL, &kc, err, sizeof(err));
		cr_assert_neq(rc, 0, "%s accepted", bad[i]);
		cr_assert_null(kc);
		cr_expect(strstr(err, "KILN_COMPILE_THREADS=") != NULL, "%s",
			  err);
	}
	setenv("KILN_COMPILE_THREADS", "3", 1);
	cr_assert_eq(kiln_compiler_new(NULL, &kc, err, sizeof(err)), 0, "%s",
		     err);
	kiln_compiler_free(kc);
}

/* KILN_SHARE_BODIES is read when the compiler is made: anything but 0 or
 * 1 (or unset, or empty) is an error naming it, so that "off" cannot leave
 * sharing on unnoticed; 0 and 1 make a compiler. */
Test(settings, share_bodies_is_checked)
{
	char err[512];
	kiln_compiler_t *kc = NULL;
	const char *bad[] = {"off", "false", "2", "yes", "01"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("KILN_SHARE_BODIES", bad[i], 1);
		int rc = kiln_compiler_new(NULL, &kc, err, sizeof(err));
		cr_assert_neq(rc, 0, "%s accepted", bad[i]);
		cr_assert_null(kc);
		cr_expect(strstr(err, "KILN_SHARE_BODIES=") != NULL, "%s", err);
	}
	const char *good[] = {"0", "1", ""};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		setenv("KILN_SHARE_BODIES", good[i], 1);
		cr_assert_eq(kiln_compiler_new(NULL, &kc, err, sizeof(err)), 0,
			     "%s: %s", good[i], err);
		kiln_compiler_free(kc);
		kc = NULL;
	}
}

/* KILN_MATH is read once, when the compiler is made: an unknown value
 * is an error naming it, and the choice is part of the fingerprint.
 * (Each Criterion test runs in its own process: setenv stays here.) */
Test(settings, math_choice_is_checked_and_fingerprinted)
{
	char err[512];
	kiln_compiler_t *kc = NULL;
	setenv("KILN_MATH", "fast", 1);
	int rc = kiln_compiler_new(NULL, &kc, err, sizeof(err));
	cr_assert_neq(rc, 0);
	cr_assert_null(kc);
	cr_expect(strstr(err, "KILN_MATH=\"fast\"") != NULL, "%s", err);

	setenv("KILN_MATH", "poly", 1);
	cr_assert_eq(kiln_compiler_new(NULL, &kc, err, sizeof(err)), 0, "%s",
		     err);
	cr_expect(strstr(kiln_compiler_fingerprint(kc), "math/poly") != NULL,
		  "%s", kiln_compiler_fingerprint(kc));
	kiln_compiler_free(kc);

	if (access("/lib/x86_64-linux-gnu/libmvec.so.1", R_OK) == 0) {
		setenv("KILN_MATH", "libmvec", 1);
		cr_assert_eq(kiln_compiler_new(NULL, &kc, err, sizeof(err)), 0,
			     "%s", err);
		cr_expect(strstr(kiln_compiler_fingerprint(kc),
				 "math/libmvec") != NULL,
			  "%s", kiln_compiler_fingerprint(kc));
		kiln_compiler_free(kc);
	}
	unsetenv("KILN_MATH");
}

/* Compiles g in mode "default". */
static int compile_default(kiln_compiler_t *kc, const kiln_graph_t *g,
			   kiln_artifact_t **a, char *err, size_t errlen)
{
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	strcpy(opts.mode, "default");
	kiln_compile_stats_t st;
	return kiln_compile(kc, g, &opts, a, &st, err, errlen);
}

/* A linker that cannot run fails the compile with its path, and the
 * compiler stays usable. */
Test(settings, a_linker_that_cannot_run_is_a_clear_error)
{
	setenv("KILN_LINKER", "/nonexistent/ld", 1);
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	one_node(&b, "aten.add.Tensor", 3, 4, 3, 4, 3, 4, 0, NULL);
	kiln_graph_t *g = graph_from_json_like("add", &b.sb);
	char err[512];
	kiln_artifact_t *a = NULL;
	int rc = compile_default(kc, g, &a, err, sizeof(err));
	cr_expect_eq(rc, KILN_ECOMPILE, "rc %d: %s", rc, err);
	cr_expect_null(a);
	cr_expect(strstr(err, "/nonexistent/ld") != NULL, "%s", err);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
	unsetenv("KILN_LINKER");
}

/* Whether the ELF64 shared object p[0..n) records DT_NEEDED `lib`. */
static bool so_needs(const uint8_t *p, size_t n, const char *lib)
{
	Elf64_Ehdr eh;
	cr_assert_geq(n, sizeof(eh));
	memcpy(&eh, p, sizeof(eh));
	cr_assert_leq(eh.e_shoff + eh.e_shnum * sizeof(Elf64_Shdr), n);
	for (unsigned i = 0; i < eh.e_shnum; i++) {
		Elf64_Shdr sh, st;
		memcpy(&sh, p + eh.e_shoff + i * sizeof(sh), sizeof(sh));
		if (sh.sh_type != SHT_DYNAMIC)
			continue;
		memcpy(&st, p + eh.e_shoff + sh.sh_link * sizeof(st),
		       sizeof(st));
		for (size_t k = 0; k + sizeof(Elf64_Dyn) <= sh.sh_size;
		     k += sizeof(Elf64_Dyn)) {
			Elf64_Dyn d;
			memcpy(&d, p + sh.sh_offset + k, sizeof(d));
			if (d.d_tag == DT_NEEDED &&
			    strcmp((const char *)p + st.sh_offset +
				       d.d_un.d_val,
				   lib) == 0)
				return true;
		}
	}
	return false;
}

/* libm is linked only where a kernel calls it: fmod's f32 remainder is
 * libm's fmodf, add calls nothing. Both artifacts load and run. */
Test(compile, libm_is_linked_only_when_a_kernel_calls_it)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *op;
		bool libm;
		float want; /* out[0] for a = 7.5, b = 2 */
	} cases[] = {{"aten.add.Tensor", false, 9.5f},
		     {"aten.fmod.Tensor", true, 1.5f}};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		gb_t b;
		one_node(&b, cases[c].op, 3, 4, 3, 4, 3, 4, 0, NULL);
		kiln_graph_t *g = graph_from_json_like(cases[c].op, &b.sb);
		char err[512];
		kiln_artifact_t *a = NULL;
		int rc = compile_default(kc, g, &a, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s: rc %d: %s", cases[c].op, rc, err);
		cr_expect_eq(so_needs(a->code, a->code_len, "libm.so.6"),
			     cases[c].libm, "%s", cases[c].op);
		kiln_module_t *m = NULL;
		rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s: %s", cases[c].op, err);
		kiln_tensor_t in[2];
		kiln_io_t args[2];
		const int64_t sz[2] = {3, 4};
		for (int t = 0; t < 2; t++) {
			cr_assert_eq(
			    kiln_td_tensor_alloc(&in[t], KILN_DT_F32, 2, sz),
			    0);
			for (int i = 0; i < 12; i++)
				((float *)in[t].data)[i] = t == 0 ? 7.5f : 2;
			args[t] = (kiln_io_t){KILN_IO_TENSOR, 0, in[t]};
		}
		void *ob[1] = {NULL};
		kiln_io_t out[1];
		rc = kiln_module_run(m, args, 2, ob, out, NULL, err,
				     sizeof(err));
		cr_assert_eq(rc, 0, "%s: %s", cases[c].op, err);
		cr_expect_eq(((const float *)out[0].t.data)[11], cases[c].want,
			     "%s: %g", cases[c].op,
			     (double)((const float *)out[0].t.data)[11]);
		free(ob[0]);
		for (int t = 0; t < 2; t++)
			kiln_td_tensor_free(&in[t]);
		kiln_module_free(m);
		kiln_graph_free(g);
		msgpack_sbuffer_destroy(&b.sb);
	}
	kiln_compiler_free(kc);
}

/* A buffer that is not an ELF64 object counts as importing libm and
 * libmvec: linking a library the code does not call costs time, leaving
 * out one it does would break the load. */
Test(compile, an_unreadable_object_links_every_library)
{
	static const uint8_t junk[] = "not an object at all, not even close";
	const int all = CPU_IMPORTS_LIBM | CPU_IMPORTS_LIBMVEC;
	cr_expect_eq(cpu_object_imports(junk, sizeof(junk)), all);
	cr_expect_eq(cpu_object_imports(junk, 3), all);
	uint8_t hdr[sizeof(Elf64_Ehdr)];
	memset(hdr, 0, sizeof(hdr));
	memcpy(hdr, ELFMAG, SELFMAG);
	hdr[EI_CLASS] = ELFCLASS64;
	Elf64_Ehdr eh;
	memcpy(&eh, hdr, sizeof(eh));
	eh.e_shentsize = sizeof(Elf64_Shdr);
	eh.e_shoff = 1u << 20; /* past the end */
	eh.e_shnum = 4;
	memcpy(hdr, &eh, sizeof(eh));
	cr_expect_eq(cpu_object_imports(hdr, sizeof(hdr)), all);
}

/* KILN_LLVM_PASSES: a pipeline LLVM cannot parse fails the compile with
 * LLVM's message; one it can (O2) compiles the graph. */
Test(settings, llvm_passes_override)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	one_node(&b, "aten.add.Tensor", 3, 4, 3, 4, 3, 4, 0, NULL);
	kiln_graph_t *g = graph_from_json_like("add", &b.sb);
	char err[512];
	kiln_artifact_t *a = NULL;
	setenv("KILN_LLVM_PASSES", "no-such-pass", 1);
	int rc = compile_default(kc, g, &a, err, sizeof(err));
	cr_expect_eq(rc, KILN_ECOMPILE, "rc %d: %s", rc, err);
	cr_expect_null(a);
	cr_expect(strstr(err, "LLVM passes") != NULL &&
		      strstr(err, "no-such-pass") != NULL,
		  "%s", err);
	setenv("KILN_LLVM_PASSES", "default<O2>", 1);
	rc = compile_default(kc, g, &a, err, sizeof(err));
	cr_expect_eq(rc, 0, "rc %d: %s", rc, err);
	cr_expect_not_null(a);
	if (a != NULL)
		cr_expect_gt(a->n_kernels, 0u);
	kiln_artifact_free(a);
	unsetenv("KILN_LLVM_PASSES");
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

typedef struct badcase {
	const char *name, *msg;
} badcase_t;

/* Compiles each tests/data/bad case of bad[] (the interpreter's rejection
 * cases) and expects invalid_graph naming node 0 and holding msg. */
static void expect_bad_cases(const badcase_t *bad, size_t n)
{
	kiln_compiler_t *kc = new_compiler();
	for (size_t i = 0; i < n; i++) {
		char path[1024], err[512] = "";
		snprintf(path, sizeof(path), "%s/bad/%s.msgpack",
			 KILN_TEST_DATA_DIR, bad[i].name);
		uint8_t *buf;
		size_t len;
		cr_assert_eq(kiln_td_read_file(path, &buf, &len), 0, "%s",
			     path);
		msgpack_zone zone;
		msgpack_object obj;
		kiln_limits_t lim;
		kiln_limits_default(&lim);
		cr_assert(msgpack_zone_init(&zone, 4096));
		cr_assert_eq(kiln_msgpack_unpack_map(buf, len, &lim, &zone,
						     &obj, err, sizeof(err)),
			     0, "%s: %s", path, err);
		kiln_graph_t *g = NULL;
		cr_assert_eq(kiln_graph_from_object(kiln_map_get(&obj, "graph"),
						    &lim, &g, err, sizeof(err)),
			     0, "%s: %s", path, err);
		msgpack_zone_destroy(&zone);
		free(buf);
		kiln_compile_opts_t opts;
		memset(&opts, 0, sizeof(opts));
		kiln_artifact_t *a = NULL;
		int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
		cr_expect_eq(rc, KILN_EINVGRAPH, "%s: rc %d (%s)", bad[i].name,
			     rc, err);
		cr_expect(strstr(err, "node 0") != NULL, "%s: %s", bad[i].name,
			  err);
		cr_expect(strstr(err, bad[i].msg) != NULL,
			  "%s: \"%s\" not in: %s", bad[i].name, bad[i].msg,
			  err);
		cr_expect_null(a);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* kiln.dropout with invalid arguments (tests/data/bad/kiln_dropout_*):
 * the compiler's lowering rejects each as the interpreter does, naming
 * the node and the argument. */
Test(compile, kiln_dropout_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"kiln_dropout_p", "p must be in [0, 1]"},
	    {"kiln_dropout_seed_dtype", "seed must be an i64 scalar"},
	    {"kiln_dropout_seed_shape", "seed must be an i64 scalar"},
	    {"kiln_dropout_int", "input must be floating"},
	    {"kiln_dropout_stream", "stream must be >= 0"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* roll with invalid arguments (tests/data/bad/roll_*): rejected as the
 * interpreter rejects them. */
Test(compile, roll_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"roll_lengths", "shifts and dims must have the same length"},
	    {"roll_no_dims", "without dims, shifts must be one shift"},
	    {"roll_dim_range", "dim 2 out of range"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* as_strided_scatter and copy with invalid arguments
 * (tests/data/bad/as_strided_scatter_*, copy_broadcast): rejected as the
 * interpreter rejects them. */
Test(compile, view_scatter_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"as_strided_scatter_src", "src must have the view's size"},
	    {"as_strided_scatter_outside", "outside self's 6 elements"},
	    {"copy_broadcast", "src does not broadcast to self's shape"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* A slice or narrow whose declared length reaches past its dim's end, and
 * a narrow whose start is outside the dim (tests/data/bad/slice_past_end,
 * narrow_*): rejected as the interpreter rejects them, not compiled into
 * a kernel that reads past the buffer. */
Test(compile, slice_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"slice_past_end", "the declared 5 elements from 3 (step 1) reach "
			       "past dim 0's end"},
	    {"narrow_past_end", "the declared 2 elements from 3 (step 1) "
				"reach past dim 0's end"},
	    {"narrow_start_range",
	     "narrow's start -9 is outside dim 0 of size 4"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* Declared shapes a kernel would read past its input with, where the
 * lowering takes a length or a shape from the declaration (a fuzz of the
 * view ops found each compiling into kernels that read past the buffer or
 * crashed): a split's parts past the dim's end, more unbind outputs than
 * the dim holds, an as_strided view past its storage or with a negative
 * stride, a pad that changes an unpadded dim, a repeat not of self's
 * sizes times repeats, a slice_backward or select_backward grad_output
 * not of input_sizes, and a symbolic view whose counts differ for every
 * size; and a split whose declared parts leave part of the dim out or are
 * not of split_sizes (tests/data/bad): rejected as the interpreter
 * rejects them. */
Test(compile, declared_shapes_past_the_input)
{
	static const badcase_t bad[] = {
	    {"split_past_end", "the declared 3 elements from 3 (step 1) reach "
			       "past dim 0's end (4)"},
	    {"unbind_more_outputs", "the declared 1 elements from 2 (step 1) "
				    "reach past dim 0's end (2)"},
	    {"as_strided_past_storage",
	     "the view reaches past the end of its storage"},
	    {"as_strided_negative_stride",
	     "a negative size, stride or storage offset"},
	    {"pad_unpadded_dim", "dim 0 is not padded but its size changes"},
	    {"repeat_shape",
	     "the declared output is not self's sizes times repeats"},
	    {"slice_backward_grad_shape",
	     "grad_output must have input_sizes but at dim 0"},
	    {"select_backward_grad_shape",
	     "grad_output must have input_sizes but at dim 0"},
	    {"view_symbolic_count",
	     "the counts differ for every size the symbols allow"},
	    /* no read past the input, but not torch's split either */
	    {"split_fewer_outputs",
	     "the declared outputs leave part of dim 0 out"},
	    {"split_with_sizes_mismatch", "out 0 is not of its split size"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* new_empty_strided with a stride list that is not one stride a dim
 * (tests/data/bad/new_empty_strided_stride_len): rejected as the
 * interpreter rejects it. */
Test(compile, empty_strided_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"new_empty_strided_stride_len", "stride has 1 entries for 2 dims"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* _weight_norm_interface and its backward with g or saved_norms not of
 * v's shape with 1 in every dim but dim, grad_w not of v's shape, or an
 * integer v
 * (tests/data/bad/weight_norm_*): rejected as the interpreter rejects
 * them. */
Test(compile, weight_norm_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"weight_norm_g_shape",
	     "g must have v's shape with 1 in every dim but dim"},
	    {"weight_norm_v_int", "v must be floating, not i64"},
	    {"weight_norm_bw_norms_shape",
	     "norms must have v's shape with 1 in every dim but dim"},
	    {"weight_norm_bw_grad_shape", "grad_w must have v's shape"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* index_add with a source not of self's shape with index's length at dim,
 * a 2-D index, a source of another dtype or a fractional alpha for an
 * integer self (tests/data/bad/index_add_*): rejected as the interpreter
 * rejects them (torch rejects the alpha too). */
Test(compile, index_add_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"index_add_source_shape",
	     "source must have self's shape with index's length at dim 0 "
	     "(dim 0 differs)"},
	    {"index_add_index_2d", "index must be 0-D or 1-D"},
	    {"index_add_source_dtype", "source must have self's dtype"},
	    {"index_add_int_alpha",
	     "alpha must be an integer for an integer self, not 2.5"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* The fused inference ops of nn.TransformerEncoderLayer and
 * nn.MultiheadAttention (every case of theirs: post- and pre-norm, relu and
 * gelu, bool and float masks of the three mask types, attention weights
 * averaged or per head or none, self- and cross-attention, f64) are
 * kernels, no fallback step, and match torch and the interpreter. */
Test(lowering, fused_attention_ops_are_kernels, .timeout = 300)
{
	static const char *const files[] = {"_transformer_encoder_layer_fwd",
					    "_native_multi_head_attention"};
	kiln_compiler_t *kc = new_compiler();
	for (size_t f = 0; f < 2; f++) {
		char path[1024], err[1024];
		snprintf(path, sizeof(path), "%s/ops/%s.cases.msgpack",
			 KILN_TEST_DATA_DIR, files[f]);
		kiln_td_cases_t cs;
		int rc = kiln_td_cases_load(path, &cs, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s: %s", path, err);
		cr_expect_geq(cs.n, 4, "%s: too few cases", files[f]);
		for (uint32_t i = 0; i < cs.n; i++) {
			runres_t r;
			check(kc, cs.cases[i].graph, &cs.cases[i].io, &r);
			cr_expect(r.ok, "%s / %s: %s", files[f],
				  cs.cases[i].name, r.msg);
			cr_expect(r.kernels > 3 && r.fallbacks == 0,
				  "%s / %s: %u kernels, %u fallback steps",
				  files[f], cs.cases[i].name, r.kernels,
				  r.fallbacks);
		}
		kiln_td_cases_free(&cs);
	}
	kiln_compiler_free(kc);
}

/* The fused encoder-layer and multi-head attention ops with heads that do
 * not divide embed_dim, an embed_dim that is not the input's, a weight of
 * another dtype, a mask of the wrong shape or type, a qkv_weight of the
 * wrong shape (tests/data/bad/mha_*): rejected as the interpreter rejects
 * them. */
Test(compile, fused_attention_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"mha_heads_divide", "num_heads 3 does not divide embed_dim 8"},
	    {"mha_embed_dim", "embed_dim 16 is not the input's last dim 8"},
	    {"mha_weight_dtype",
	     "the weights must have the input's dtype f32, not f64"},
	    {"mha_mask_shape", "a mask of mask_type 1 must be [B, S]"},
	    {"mha_mask_type", "mask_type must be 0, 1 or 2, not 3"},
	    {"mha_qkv_weight_shape",
	     "qkv_weight must be [3*embed_dim, embed_dim]"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* scatter_reduce with a reduce torch does not name ("max": torch's is
 * "amax"), tests/data/bad/scatter_reduce_bad_reduce: rejected as the
 * interpreter rejects it. */
Test(compile, scatter_reduce_bad_reduce)
{
	static const badcase_t bad[] = {
	    {"scatter_reduce_bad_reduce",
	     "reduce must be sum, prod, mean, amax or amin, not max"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* The ops that were fallback steps, with arguments torch refuses
 * (tests/data/bad/{tri_rank1, fill_tensor_rank1, lerp_dtype, addcdiv_int,
 * vector_norm_int, slice_scatter_src_shape}): rejected as the interpreter
 * rejects them. */
Test(compile, newly_lowered_ops_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"tri_rank1", "input must have at least 2 dims"},
	    {"fill_tensor_rank1",
	     "the fill value must be a number or a 0-dim tensor"},
	    {"lerp_dtype", "takes floating tensors of one dtype"},
	    {"addcdiv_int", "addcdiv of integer tensors is not supported"},
	    {"vector_norm_int",
	     "linalg_vector_norm takes floating tensors, not i64"},
	    {"slice_scatter_src_shape",
	     "src must have self's shape but at dim 1"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* A product whose weight is a transposed view (nn.Linear's t()) is
 * timed on inputs laid out as declared; a product whose result feeds
 * one other node keeps the heuristic (that node may become its
 * epilogue, which a one-node timing cannot see). */
static kiln_graph_t *linear_graph(gb_t *b, bool gelu)
{
	gb_init(b);
	graph_head(b, 2);
	spec2(b, "f32", 48, 40);
	spec2(b, "f32", 1024, 40);
	s(b, "nodes");
	msgpack_pack_array(&b->pk, gelu ? 3 : 2);
	node_head(b, "aten.t.default", 1);
	ref(b, 1);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	msgpack_pack_map(&b->pk, 3);
	s(b, "dtype");
	s(b, "f32");
	s(b, "shape");
	msgpack_pack_array(&b->pk, 2);
	msgpack_pack_int64(&b->pk, 40);
	msgpack_pack_int64(&b->pk, 1024);
	s(b, "strides");
	msgpack_pack_array(&b->pk, 2);
	msgpack_pack_int64(&b->pk, 1);
	msgpack_pack_int64(&b->pk, 40);
	node_head(b, "aten.mm.default", 2);
	ref(b, 0);
	ref(b, 2);
	s(b, "out");
	msgpack_pack_array(&b->pk, 1);
	spec2(b, "f32", 48, 1024);
	if (gelu) {
		node_head(b, "aten.gelu.default", 1);
		ref(b, 3);
		s(b, "out");
		msgpack_pack_array(&b->pk, 1);
		spec2(b, "f32", 48, 1024);
	}
	s(b, "outputs");
	msgpack_pack_array(&b->pk, 1);
	ref(b, gelu ? 4 : 3);
	return graph_from_json_like("linear", &b->sb);
}

Test(autotune, transposed_weights_are_timed_and_epilogues_kept, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	kiln_graph_t *g = linear_graph(&b, false);
	char *rep = tuned_report(kc, g);
	cr_expect(strstr(rep, "chosen by measurement") != NULL, "%s", rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	g = linear_graph(&b, true);
	rep = tuned_report(kc, g);
	cr_expect(strstr(rep, "chosen by measurement") == NULL, "%s", rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* The tiled template keeps its stack scratch within 512 KiB: a
 * convolution whose one output row of columns is larger (1024 channels
 * x 3x3 x 258 columns: 9 MiB) takes another form, also when max-autotune
 * times its variants (with AVX-512: implicit GEMM against the whole-image
 * im2col and BLAS, each named by the form it took). Compiled and tuned
 * only: the reports. */
Test(conv, tiled_scratch_stays_within_its_bound)
{
	kiln_compiler_t *kc = new_compiler();
	gb_t b;
	gb_init(&b);
	int64_t x4[4] = {2, 1024, 8, 258}, w4[4] = {2, 1024, 3, 3},
		y4[4] = {2, 2, 8, 258};
	graph_head(&b, 2);
	spec4(&b, "f32", x4);
	spec4(&b, "f32", w4);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	node_head(&b, "aten.convolution.default", 9);
	ref(&b, 0);
	ref(&b, 1);
	msgpack_pack_nil(&b.pk);
	static const int64_t one2[2] = {1, 1}, zero2[2] = {0, 0};
	ints2(&b, one2);
	ints2(&b, one2);
	ints2(&b, one2);
	msgpack_pack_false(&b.pk);
	ints2(&b, zero2);
	msgpack_pack_int64(&b.pk, 1);
	s(&b, "out");
	msgpack_pack_array(&b.pk, 1);
	spec4(&b, "f32", y4);
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, 2);
	kiln_graph_t *g = graph_from_json_like("wide convolution", &b.sb);
	char *rep;
	n_kernels(kc, g, &rep);
	cr_expect(strstr(rep, "im2col tiles") == NULL, "%s", rep);
	free(rep);
	rep = tuned_report(kc, g);
	cr_expect(strstr(rep, "im2col tiles") == NULL, "%s", rep);
	cr_expect(strstr(rep, "tiled") == NULL, "%s", rep);
	if (__builtin_cpu_supports("avx512f"))
		cr_expect(strstr(rep, "max-autotune): implicit GEMM") != NULL &&
			      strstr(rep, "whole-image im2col + product") !=
				  NULL,
			  "%s", rep);
	else
		cr_expect(strstr(rep, "max-autotune") == NULL, "%s", rep);
	free(rep);
	kiln_graph_free(g);
	msgpack_sbuffer_destroy(&b.sb);
	kiln_compiler_free(kc);
}

/* A transposed convolution whose weight's dim 0 is not the input's
 * channels, or whose output_padding is not below its stride or dilation
 * (tests/data/bad/tconv_*), a 2-d and a 3-d one whose weight does not take
 * the input's channels (conv_channels, conv3d_channels), a transposed 3-d
 * one of the wrong channels and the backward of one whose grad_output is
 * not its output's shape (tconv3d_*): rejected as the interpreter rejects
 * them. */
Test(compile, convolution_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"tconv_channels", "weight's dim 0 must equal the input channels"},
	    {"conv_channels", "do not fit groups"},
	    {"conv3d_channels", "do not fit groups"},
	    {"tconv_output_padding",
	     "output_padding 2 must be smaller than the stride 2 or the "
	     "dilation 1"},
	    {"tconv3d_channels",
	     "weight's dim 0 must equal the input channels"},
	    {"tconv3d_bw_shape",
	     "does not have the convolution's output shape"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}

/* A list of n ints. */
static void ints_n(gb_t *b, const int64_t *v, uint32_t n)
{
	msgpack_pack_array(&b->pk, n);
	for (uint32_t k = 0; k < n; k++)
		msgpack_pack_int64(&b->pk, v[k]);
}

/* y = a convolution of x by w plus b over nd spatial dims (transposed or
 * not; output_padding op for a transposed one; dilation dl, NULL for 1)
 * and its backward (convolution_backward, every gradient asked for) in
 * one graph: outputs y, grad_input, grad_weight, grad_bias. */
static kiln_graph_t *conv_fwd_bwd_graph(const char *dt, uint32_t nd,
					const int64_t *xs, const int64_t *ws,
					const int64_t *st, const int64_t *pd,
					const int64_t *op, int64_t G,
					bool transposed, const int64_t *dl)
{
	uint32_t r = nd + 2;
	int64_t Co = transposed ? ws[1] * G : ws[0], ys[5] = {xs[0], Co};
	static const int64_t one3[3] = {1, 1, 1};
	if (dl == NULL)
		dl = one3;
	for (uint32_t k = 0; k < nd; k++) {
		int64_t reach = dl[k] * (ws[2 + k] - 1) + 1;
		ys[2 + k] =
		    transposed
			? (xs[2 + k] - 1) * st[k] - 2 * pd[k] + reach + op[k]
			: (xs[2 + k] + 2 * pd[k] - reach) / st[k] + 1;
	}
	const int64_t b1[1] = {Co};
	gb_t b;
	gb_init(&b);
	graph_head(&b, 4);
	specn(&b, dt, xs, r);
	specn(&b, dt, ws, r);
	specn(&b, dt, b1, 1);
	specn(&b, dt, ys, r);
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 2);
	for (int bw = 0; bw < 2; bw++) {
		node_head(&b,
			  bw ? "aten.convolution_backward.default"
			     : "aten.convolution.default",
			  bw ? 11 : 9);
		if (bw)
			ref(&b, 3);
		ref(&b, 0);
		ref(&b, 1);
		if (bw)
			ints_n(&b, b1, 1);
		else
			ref(&b, 2);
		ints_n(&b, st, nd);
		ints_n(&b, pd, nd);
		ints_n(&b, dl, nd);
		if (transposed)
			msgpack_pack_true(&b.pk);
		else
			msgpack_pack_false(&b.pk);
		ints_n(&b, op, nd);
		msgpack_pack_int64(&b.pk, G);
		if (bw) {
			msgpack_pack_array(&b.pk, 3);
			for (int k = 0; k < 3; k++)
				msgpack_pack_true(&b.pk);
		}
		s(&b, "out");
		msgpack_pack_array(&b.pk, bw ? 3 : 1);
		if (!bw) {
			specn(&b, dt, ys, r); /* value 4 */
			continue;
		}
		specn(&b, dt, xs, r); /* values 5, 6, 7 */
		specn(&b, dt, ws, r);
		specn(&b, dt, b1, 1);
	}
	return end_graph(&b, 4, 4, "convolution and its backward");
}

/* Transposed convolutions, forward and backward, are kernels (no fallback
 * step): the forward is the input gradient of the convolution of its
 * weight, a product Wᵀ @ x through BLAS and a col2im (by the output's
 * phases where the stride divides it), the bias added after; the backward
 * a convolution (grad_input) and that convolution's weight gradient (x as
 * its grad_output). Against the interpreter: a GAN generator's 4x4
 * stride-2 upsampling, a U-Net's 2x2 stride 2 in f64, one in 2 groups with
 * an output_padding (no phases: the stride does not divide the output). */
Test(lowering, transposed_convolutions_are_kernels, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *dt;
		int64_t x4[4], w4[4], st[2], pd[2], op[2], G;
	} cases[] = {
	    {"f32", {2, 64, 8, 8}, {64, 32, 4, 4}, {2, 2}, {1, 1}, {0, 0}, 1},
	    {"f64", {2, 32, 6, 6}, {32, 16, 2, 2}, {2, 2}, {0, 0}, {0, 0}, 1},
	    {"f32", {2, 32, 7, 5}, {32, 12, 3, 3}, {2, 2}, {1, 1}, {1, 0}, 2},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[96];
		snprintf(what, sizeof(what),
			 "%s [%lld, %lld, %lld, %lld] k%lld", cases[i].dt,
			 (long long)cases[i].x4[0], (long long)cases[i].x4[1],
			 (long long)cases[i].x4[2], (long long)cases[i].x4[3],
			 (long long)cases[i].w4[2]);
		kiln_graph_t *g = conv_fwd_bwd_graph(
		    cases[i].dt, 2, cases[i].x4, cases[i].w4, cases[i].st,
		    cases[i].pd, cases[i].op, cases[i].G, true, NULL);
		cr_assert(g != NULL, "%s", what);
		expect_report_has(kc, g, "fallback", false, what);
		expect_report_has(kc, g, "BLAS", true, what);
		bool f64 = strcmp(cases[i].dt, "f64") == 0;
		expect_matches_interp(kc, g, "default", 31 + i,
				      f64 ? 1e-12 : 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* A spec whose dim 0 is the symbol s0 and the rest dims d[1 ..]. */
static void spec_s0(gb_t *b, const char *dt, const int64_t *d, uint32_t rank)
{
	msgpack_pack_map(&b->pk, 2);
	s(b, "dtype");
	s(b, dt);
	s(b, "shape");
	msgpack_pack_array(&b->pk, rank);
	s(b, "s0");
	for (uint32_t i = 1; i < rank; i++)
		msgpack_pack_int64(&b->pk, d[i]);
}

/* One node over x [s0, ...]: a convolution (x [s0, 3, 8, 8], w [4, 3, 3,
 * 3]) or topk(x [s0, 10], 3). */
static kiln_graph_t *sym_one_node_graph(bool conv)
{
	gb_t b;
	gb_init(&b);
	msgpack_pack_map(&b.pk, 5);
	s(&b, "format");
	s(&b, "kiln.graph/1");
	s(&b, "symbols");
	msgpack_pack_map(&b.pk, 1);
	s(&b, "s0");
	msgpack_pack_map(&b.pk, 1);
	s(&b, "min");
	msgpack_pack_int64(&b.pk, 2);
	s(&b, "inputs");
	msgpack_pack_array(&b.pk, conv ? 2 : 1);
	static const int64_t x4[4] = {0, 3, 8, 8}, w4[4] = {4, 3, 3, 3},
			     y4[4] = {0, 4, 6, 6}, x2[2] = {0, 10},
			     k2[2] = {0, 3}, one2[2] = {1, 1},
			     zero2[2] = {0, 0};
	if (conv) {
		spec_s0(&b, "f32", x4, 4);
		specn(&b, "f32", w4, 4);
	} else {
		spec_s0(&b, "f32", x2, 2);
	}
	s(&b, "nodes");
	msgpack_pack_array(&b.pk, 1);
	if (conv) {
		node_head(&b, "aten.convolution.default", 9);
		ref(&b, 0);
		ref(&b, 1);
		msgpack_pack_nil(&b.pk);
		ints2(&b, one2);
		ints2(&b, zero2);
		ints2(&b, one2);
		msgpack_pack_false(&b.pk);
		ints2(&b, zero2);
		msgpack_pack_int64(&b.pk, 1);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec_s0(&b, "f32", y4, 4);
	} else {
		node_head(&b, "aten.topk.default", 2);
		ref(&b, 0);
		msgpack_pack_int64(&b.pk, 3);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 2);
		spec_s0(&b, "f32", k2, 2);
		spec_s0(&b, "i64", k2, 2);
	}
	s(&b, "outputs");
	msgpack_pack_array(&b.pk, 1);
	ref(&b, conv ? 2 : 1);
	kiln_graph_t *g =
	    graph_from_json_like("symbolic one-node graph", &b.sb);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

/* The compile stats count, of the fallback steps, those of ops kiln
 * lowers that declined at a symbolic size (kilnd refuses a generalized
 * graph with any: daemon/README.md): a convolution over a symbolic batch
 * is one, topk (never lowered) is not. */
Test(dynamic, symbolic_fallbacks_are_counted)
{
	kiln_compiler_t *kc = new_compiler();
	for (int conv = 0; conv < 2; conv++) {
		kiln_graph_t *g = sym_one_node_graph(conv);
		kiln_compile_opts_t opts;
		memset(&opts, 0, sizeof(opts));
		kiln_compile_stats_t st;
		kiln_artifact_t *a = NULL;
		char err[512];
		int rc = kiln_compile(kc, g, &opts, &a, &st, err, sizeof(err));
		cr_assert_eq(rc, 0, "%s", err);
		cr_expect_eq(st.n_fallbacks, 1, "conv %d", conv);
		cr_expect_eq(st.n_sym_fallbacks, (uint32_t)conv, "conv %d",
			     conv);
		kiln_artifact_free(a);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* 3-d convolutions, forward and backward, are kernels (no fallback step):
 * the 2-d convolution over (H, W) with the depth taps that read the input
 * folded into the channels, its products through BLAS or kiln's templates.
 * The output depths whose taps read fewer input depths (the first and last
 * of a padded one) are their own parts, without the padding's taps: R3D's
 * 3x3x3 at depth 4 is a product of K = 16·18 for depths 0 and 3 and one of
 * 16·27 for 1 and 2. A weight gradient with taps left out is unfolded over
 * [O·Cg, KD·KH·KW]. Against the interpreter: that one, its last layers'
 * depth 1 (only the middle tap reads the input: a third of the products),
 * one strided in depth and grouped in f64 (three parts). */
Test(lowering, conv3d_is_kernels, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	static const struct {
		const char *dt;
		int64_t x5[5], w5[5], st[3], pd[3], G;
		const char *k, *gw;
	} cases[] = {
	    {"f32",
	     {2, 16, 4, 12, 12},
	     {32, 16, 3, 3, 3},
	     {1, 1, 1},
	     {1, 1, 1},
	     1,
	     "K=[288]",
	     "pointwise kernel [512, 27]"},
	    {"f32",
	     {2, 64, 1, 6, 6},
	     {64, 64, 3, 3, 3},
	     {1, 1, 1},
	     {1, 1, 1},
	     1,
	     "K=[576]",
	     "pointwise kernel [4096, 27]"},
	    {"f64",
	     {1, 8, 5, 7, 7},
	     {8, 4, 3, 3, 3},
	     {2, 1, 1},
	     {1, 1, 1},
	     2,
	     "K=[72]",
	     "pointwise kernel [32, 27]"},
	};
	static const int64_t zero3[3] = {0, 0, 0};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char what[96];
		snprintf(what, sizeof(what), "%s [%lld, %lld, %lld, ..] k%lld",
			 cases[i].dt, (long long)cases[i].x5[0],
			 (long long)cases[i].x5[1], (long long)cases[i].x5[2],
			 (long long)cases[i].w5[2]);
		kiln_graph_t *g = conv_fwd_bwd_graph(
		    cases[i].dt, 3, cases[i].x5, cases[i].w5, cases[i].st,
		    cases[i].pd, zero3, cases[i].G, false, NULL);
		cr_assert(g != NULL, "%s", what);
		expect_report_has(kc, g, "fallback", false, what);
		/* the folded product's depth, the unfolded weight gradient */
		expect_report_has(kc, g, cases[i].k, true, what);
		expect_report_has(kc, g, cases[i].gw, true, what);
		bool f64 = strcmp(cases[i].dt, "f64") == 0;
		expect_matches_interp(kc, g, "default", 41 + i,
				      f64 ? 1e-12 : 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* The input gradient of a stride-1 convolution is the forward
 * convolution of grad_output by the weight flipped along its taps, its
 * channel dims swapped and padded by d·(K-1) - p (ops_conv.c
 * bw_input_forward): with AVX-512 it takes the forward's forms (the
 * templates, or the direct kernel for 16 channels or fewer), where
 * the product Wᵀ @ gO wrote KH·KW times grad_input's size for a col2im to
 * read back. Not taken where the weight outweighs the positions (512 ->
 * 512-like: 256 channels at 7², batch 2) nor for a transposed convolution
 * with an output_padding. The weight gradient is the direct kernel
 * (bw_weight_direct) at 64² and at 32²; where the heuristic leaves it
 * (two 12² images: 24 rows' vectors a unit) and there are 32 or fewer
 * output channels, its product is computed transposed (bw_weight_swap).
 * Against the interpreter: U-Net's 3x3 32 -> 16 at 64², a 5x5 with
 * padding 2, the 3x3 at 12², a
 * dilated 3x3, an unpadded one, a 1-d one, a 1-d one whose weight
 * gradient is the direct kernel (its grad_input too small for the
 * forward's templates), the weight-heavy one, a
 * transposed one with an output_padding and one without (a transposed
 * convolution's backward input gradient is a forward convolution
 * already: its forward, the input gradient of the convolution of its
 * weight, is the one checked). */
Test(conv, stride_1_grad_input_is_a_forward_convolution, .timeout = 300)
{
	kiln_compiler_t *kc = new_compiler();
	bool tmpl = __builtin_cpu_supports("avx512f");
	static const struct {
		uint32_t nd;
		int64_t xs[4], ws[4], pd[2], dl[2];
		bool fwd, transposed;
		const char *gw;
		int64_t op; /* a transposed one's output_padding */
	} cs[] = {
	    {2,
	     {2, 32, 64, 64},
	     {16, 32, 3, 3},
	     {1, 1},
	     {1, 1},
	     true,
	     false,
	     "[16, 32, 3, 3] over [2, 64, 64]",
	     0},
	    {2,
	     {2, 16, 32, 32},
	     {24, 16, 5, 5},
	     {2, 2},
	     {1, 1},
	     true,
	     false,
	     "[24, 16, 5, 5] over [2, 32, 32]",
	     0},
	    {2,
	     {2, 32, 12, 12},
	     {16, 32, 3, 3},
	     {1, 1},
	     {1, 1},
	     false,
	     false,
	     "[2, 288, 16] K=[144]",
	     0},
	    {2,
	     {2, 16, 32, 32},
	     {16, 16, 3, 3},
	     {2, 2},
	     {2, 2},
	     true,
	     false,
	     NULL,
	     0},
	    {2,
	     {2, 16, 34, 34},
	     {16, 16, 3, 3},
	     {0, 0},
	     {1, 1},
	     true,
	     false,
	     NULL,
	     0},
	    {1,
	     {2, 32, 1024, 0},
	     {32, 32, 3, 0},
	     {1, 0},
	     {1, 0},
	     true,
	     false,
	     NULL,
	     0},
	    {1,
	     {2, 16, 256, 0},
	     {16, 16, 3, 0},
	     {1, 0},
	     {1, 0},
	     false,
	     false,
	     "[16, 16, 1, 3] over [2, 1, 256]",
	     0},
	    {2,
	     {2, 256, 7, 7},
	     {256, 256, 3, 3},
	     {1, 1},
	     {1, 1},
	     false,
	     false,
	     NULL,
	     0},
	    {2,
	     {2, 32, 31, 31},
	     {32, 16, 3, 3},
	     {1, 1},
	     {2, 2},
	     false,
	     true,
	     NULL,
	     1},
	    {2,
	     {2, 32, 32, 32},
	     {32, 16, 3, 3},
	     {1, 1},
	     {1, 1},
	     true,
	     true,
	     NULL,
	     0},
	};
	static const int64_t st[2] = {1, 1};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		char what[96];
		snprintf(what, sizeof(what),
			 "%ud [%lld, %lld, %lld] -> %lld, k%lld p%lld d%lld%s",
			 cs[i].nd, (long long)cs[i].xs[0],
			 (long long)cs[i].xs[1], (long long)cs[i].xs[2],
			 (long long)cs[i].ws[cs[i].transposed ? 1 : 0],
			 (long long)cs[i].ws[2], (long long)cs[i].pd[0],
			 (long long)cs[i].dl[0],
			 cs[i].transposed ? " transposed" : "");
		const int64_t op[2] = {cs[i].op, cs[i].op};
		kiln_graph_t *g = conv_fwd_bwd_graph(
		    "f32", cs[i].nd, cs[i].xs, cs[i].ws, st, cs[i].pd, op, 1,
		    cs[i].transposed, cs[i].dl);
		cr_assert(g != NULL, "%s", what);
		char *rep = NULL;
		n_kernels(kc, g, &rep);
		cr_assert(rep != NULL, "%s", what);
		/* the forward's template forms, in a kernel of the node
		 * whose input gradient it is (node 0 for a transposed one) */
		const char *node = cs[i].transposed
				       ? "node 0 aten.convolution.default"
				       : "node 1 aten.convolution_backward";
		bool fwd = false;
		for (const char *l = rep; l != NULL && *l != '\0';) {
			const char *e = strchr(l, '\n');
			size_t len = e != NULL ? (size_t)(e - l) : strlen(l);
			char line[512];
			snprintf(line, sizeof(line), "%.*s", (int)len, l);
			if (strstr(line, node) &&
			    (strstr(line, "implicit GEMM") ||
			     strstr(line, "im2col tiles") ||
			     strstr(line, "convolution, direct")))
				fwd = true;
			l = e != NULL ? e + 1 : NULL;
		}
		if (tmpl)
			cr_expect_eq(fwd, cs[i].fwd, "%s:\n%s", what, rep);
		else
			cr_expect(!fwd, "%s:\n%s", what, rep);
		if (cs[i].gw != NULL && tmpl)
			cr_expect(strstr(rep, cs[i].gw) != NULL, "%s:\n%s",
				  what, rep);
		free(rep);
		expect_matches_interp(kc, g, "default", 71 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* With AVX-512 BLAS (OpenBLAS's SkylakeX kernels) a convolution's weight
 * gradient, gO @ colᵀ per image, takes the GEMM template as plain
 * products do (codegen.c wgrad_product: ResNet-18's 3x3s 8-13% faster):
 * ResNet-18's 128 -> 128 at 28² (batch 2, the input gradient a forward
 * convolution) and 256 -> 256 at 7² (batch 2: the weight heavier than the
 * positions, the input gradient the product Wᵀ @ gO and a col2im).
 * Against the interpreter. */
Test(conv, weight_gradients_take_the_template_with_avx512_blas, .timeout = 300)
{
	if (!__builtin_cpu_supports("avx512f"))
		cr_skip_test("no AVX-512: the template is not used");
	kiln_compiler_t *kc = new_compiler();
	if (strstr(kiln_compiler_fingerprint(kc), "blas/none") != NULL) {
		kiln_compiler_free(kc);
		cr_skip_test("no BLAS library here: products use the template");
	}
	kiln__compiler_set_blas_avx512(kc, true);
	static const struct {
		int64_t N, C, H;
		const char *gw, *gi;
	} cs[] = {
	    {2, 128, 28,
	     "GEMM template (8x32 register tiles, B packed a "
	     "panel at a time) [2, 128, 1152] K=[784]",
	     NULL},
	    {2, 256, 7, "GEMM template", "[2304, 98] K=[256], A transposed"},
	};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		kiln_graph_t *g =
		    conv_bw_graph(cs[i].N, cs[i].C, cs[i].C, cs[i].H);
		char what[64];
		snprintf(
		    what, sizeof(what), "conv backward [%lld, %lld, %lld²]",
		    (long long)cs[i].N, (long long)cs[i].C, (long long)cs[i].H);
		expect_report_has(kc, g, cs[i].gw, true, what);
		expect_report_has(kc, g, "a weight gradient's", true, what);
		if (cs[i].gi != NULL)
			expect_report_has(kc, g, cs[i].gi, true, what);
		expect_matches_interp(kc, g, "default", 81 + i, 1e-4, what);
		kiln_graph_free(g);
	}
	kiln_compiler_free(kc);
}

/* The activations of ops_act.c with arguments torch refuses (softplus with
 * beta 0, glu along an odd size, mish of an integer tensor, threshold
 * without its value, glu_backward's grad_output not half of self;
 * tests/data/bad/act_*): rejected as the interpreter rejects them. */
Test(compile, activation_bad_arguments)
{
	static const badcase_t bad[] = {
	    {"act_softplus_beta0", "beta must not be 0"},
	    {"act_glu_odd", "halving dim 1 must be even, not 5"},
	    {"act_mish_int", "takes a floating tensor, not i64"},
	    {"act_threshold_no_value", "value: missing number"},
	    {"act_glu_bw_shape",
	     "grad_output must be self's shape halved along dim"},
	};
	expect_bad_cases(bad, sizeof(bad) / sizeof(bad[0]));
}
