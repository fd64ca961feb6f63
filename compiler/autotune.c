/*
 * autotune.c — mode "max-autotune": the template of each matrix product
 * and convolution chosen by measurement on this machine.
 *
 * For every node that has a choice (a convolution: tiled im2col with the
 * GEMM template or with BLAS, or whole-image im2col + a product; mm, bmm,
 * addmm, baddbmm: BLAS on row blocks alone or on row and column blocks, or
 * the GEMM template), the node alone
 * becomes a graph of one node (its tensor arguments the inputs, static
 * shapes only). That graph is compiled once per variant; variants that
 * give the same kernels as an earlier one drop out, and with one left
 * there is nothing to choose. Otherwise they are loaded and run on the
 * same deterministic data, interleaved (A B C A B C ..., so that the rest of
 * the machine slows all alike): a warm-up of at least 100 ms, then rounds
 * until 60 ms or 20 rounds (at least 3); the fastest run of each decides,
 * and that variant is the node's in the real compile (--emit=kernels
 * prints each time). Choices are remembered per compiler by the one-node
 * graph's bytes, so a shape that repeats (ResNet's blocks) is measured
 * once per process. Without max-autotune the recorded heuristics of
 * ops_conv.c and codegen.c choose (their comments give the measurements).
 */
#include "clients/libkiln/kiln.h"
#include "compiler/compiler.h"
#include "compiler/cpu.h"
#include "compiler/internal_tune.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_CACHE 256

typedef struct tune_entry {
	uint8_t *key; /* the packed one-node graph */
	size_t len;
	int8_t variant;
	char why[KILN_TUNE_WHY];
} tune_entry_t;

struct kiln_tune_cache {
	pthread_mutex_t mu;
	tune_entry_t e[TUNE_CACHE];
	uint32_t next;
};

kiln_tune_cache_t *kiln__tune_cache_new(void)
{
	kiln_tune_cache_t *t = calloc(1, sizeof(*t));
	if (t != NULL)
		pthread_mutex_init(&t->mu, NULL);
	return t;
}

void kiln__tune_cache_free(kiln_tune_cache_t *t)
{
	if (t == NULL)
		return;
	for (uint32_t i = 0; i < TUNE_CACHE; i++)
		free(t->e[i].key);
	pthread_mutex_destroy(&t->mu);
	free(t);
}

static bool cache_get(kiln_tune_cache_t *t, const void *key, size_t len,
		      int8_t *variant, char *why)
{
	bool hit = false;
	pthread_mutex_lock(&t->mu);
	for (uint32_t i = 0; i < TUNE_CACHE && !hit; i++)
		if (t->e[i].key != NULL && t->e[i].len == len &&
		    memcmp(t->e[i].key, key, len) == 0) {
			*variant = t->e[i].variant;
			memcpy(why, t->e[i].why, KILN_TUNE_WHY);
			hit = true;
		}
	pthread_mutex_unlock(&t->mu);
	return hit;
}

static void cache_put(kiln_tune_cache_t *t, const void *key, size_t len,
		      int8_t variant, const char *why)
{
	uint8_t *k = malloc(len ? len : 1);
	if (k == NULL)
		return;
	memcpy(k, key, len);
	pthread_mutex_lock(&t->mu);
	tune_entry_t *e = &t->e[t->next++ % TUNE_CACHE];
	free(e->key);
	e->key = k;
	e->len = len;
	e->variant = variant;
	snprintf(e->why, sizeof(e->why), "%s", why);
	pthread_mutex_unlock(&t->mu);
}

static void note_refs(const kiln_arg_t *a, bool *used, uint32_t n);

/* readers[v]: how many nodes read value v, plus 2 when it is a graph
 * output (so that an output is never a single node's), for the rule
 * below. */
static uint32_t *count_readers(const kiln_graph_t *g)
{
	uint32_t *readers = calloc(g->n_values + 1, sizeof(uint32_t));
	bool *seen = calloc(g->n_values + 1, sizeof(bool));
	if (readers == NULL || seen == NULL) {
		free(readers);
		free(seen);
		return NULL;
	}
	for (uint32_t j = 0; j < g->n_nodes; j++) {
		memset(seen, 0, (g->n_values + 1) * sizeof(bool));
		for (uint32_t a = 0; a < g->nodes[j].n_args; a++)
			note_refs(&g->nodes[j].args[a], seen, g->n_values);
		for (uint32_t a = 0; a < g->nodes[j].n_kwargs; a++)
			note_refs(&g->nodes[j].kwargs[a].val, seen,
				  g->n_values);
		for (uint32_t v = 0; v < g->n_values; v++)
			readers[v] += seen[v];
	}
	for (uint32_t o = 0; o < g->n_outputs; o++)
		if (g->outputs[o].kind == KILN_ARG_REF &&
		    g->outputs[o].u.ref < g->n_values)
			readers[g->outputs[o].u.ref] += 2;
	free(seen);
	return readers;
}

/* Whether node ni's result is read by exactly one other node and is not
 * a graph output: that node may become the product's epilogue
 * (sched.c fuse_epilogues), which column blocks rule out and which a
 * one-node timing cannot see, so such a product keeps the heuristic. */
static bool single_reader(const kiln_graph_t *g, const uint32_t *readers,
			  uint32_t ni)
{
	const kiln_node_t *nd = &g->nodes[ni];
	uint32_t total = 0;
	for (uint32_t o = 0; o < nd->n_out; o++)
		total += readers[nd->out_first + o];
	return total == 1;
}

static bool tunable_op(const char *op)
{
	static const char *const ops[] = {
	    "aten.convolution.default", "aten.mm.default", "aten.bmm.default",
	    "aten.addmm.default", "aten.baddbmm.default"};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(op, ops[i]) == 0)
			return true;
	return false;
}

/* Copies an argument, value numbers through map (UINT32_MAX: not a
 * tensor input of the one-node graph); false for a symbolic argument. */
static bool copy_arg(kiln_arena_t *ar, const kiln_arg_t *in, kiln_arg_t *out,
		     const uint32_t *map, uint32_t n_map)
{
	*out = *in;
	switch (in->kind) {
	case KILN_ARG_SYM: return false;
	case KILN_ARG_REF:
		if (in->u.ref >= n_map || map[in->u.ref] == UINT32_MAX)
			return false;
		out->u.ref = map[in->u.ref];
		return true;
	case KILN_ARG_LIST:
		out->u.list =
		    kiln_arena_calloc(ar, in->n + 1, sizeof(kiln_arg_t));
		if (out->u.list == NULL)
			return false;
		for (uint32_t i = 0; i < in->n; i++)
			if (!copy_arg(ar, &in->u.list[i], &out->u.list[i], map,
				      n_map))
				return false;
		return true;
	default: return true;
	}
}

/* Marks the tensor values an argument refers to. */
static void note_refs(const kiln_arg_t *a, bool *used, uint32_t n)
{
	if (a->kind == KILN_ARG_REF && a->u.ref < n)
		used[a->u.ref] = true;
	else if (a->kind == KILN_ARG_LIST)
		for (uint32_t i = 0; i < a->n; i++)
			note_refs(&a->u.list[i], used, n);
}

static bool static_value(const kiln_value_t *v)
{
	if (v->kind != KILN_VAL_TENSOR)
		return false;
	for (uint32_t k = 0; k < v->rank; k++)
		if (v->sizes[k].e != NULL || v->strides[k].e != NULL)
			return false;
	return true;
}

/* Node ni of g alone, packed as a Graph v1 (sb); false when it cannot be
 * (a symbolic size, a non-tensor input). */
static bool one_node_graph(const kiln_graph_t *g, uint32_t ni,
			   msgpack_sbuffer *sb)
{
	const kiln_node_t *nd = &g->nodes[ni];
	kiln_arena_t *ar = kiln_arena_new(4096);
	bool *used = calloc(g->n_values + 1, sizeof(bool));
	uint32_t *map = malloc((g->n_values + 1) * sizeof(uint32_t));
	bool ok = ar != NULL && used != NULL && map != NULL;
	kiln_graph_t sg;
	memset(&sg, 0, sizeof(sg));
	if (ok) {
		for (uint32_t i = 0; i < nd->n_args; i++)
			note_refs(&nd->args[i], used, g->n_values);
		for (uint32_t i = 0; i < nd->n_kwargs; i++)
			note_refs(&nd->kwargs[i].val, used, g->n_values);
		for (uint32_t v = 0; v < g->n_values; v++)
			map[v] = UINT32_MAX;
		uint32_t nin = 0;
		for (uint32_t v = 0; v < g->n_values && ok; v++)
			if (used[v]) {
				ok = static_value(&g->values[v]);
				map[v] = nin++;
			}
		for (uint32_t o = 0; o < nd->n_out && ok; o++)
			ok = static_value(&g->values[nd->out_first + o]);
		sg.n_inputs = nin;
		sg.n_nodes = 1;
		sg.n_values = nin + nd->n_out;
		sg.n_outputs = nd->n_out;
		sg.values = kiln_arena_calloc(ar, sg.n_values + 1,
					      sizeof(kiln_value_t));
		sg.nodes = kiln_arena_calloc(ar, 1, sizeof(kiln_node_t));
		sg.outputs =
		    kiln_arena_calloc(ar, nd->n_out + 1, sizeof(kiln_arg_t));
		ok = ok && sg.values && sg.nodes && sg.outputs;
		for (uint32_t v = 0; v < g->n_values && ok; v++)
			if (map[v] != UINT32_MAX) {
				sg.values[map[v]] = g->values[v];
				sg.values[map[v]].producer = -1;
			}
		for (uint32_t o = 0; o < nd->n_out && ok; o++) {
			sg.values[nin + o] = g->values[nd->out_first + o];
			sg.values[nin + o].producer = 0;
			sg.outputs[o].kind = KILN_ARG_REF;
			sg.outputs[o].u.ref = nin + o;
		}
		kiln_node_t *sn = sg.nodes;
		if (ok) {
			*sn = *nd;
			sn->out_first = nin;
			sn->args = kiln_arena_calloc(ar, nd->n_args + 1,
						     sizeof(kiln_arg_t));
			sn->kwargs = kiln_arena_calloc(ar, nd->n_kwargs + 1,
						       sizeof(kiln_kwarg_t));
			ok = sn->args && sn->kwargs;
		}
		for (uint32_t i = 0; i < nd->n_args && ok; i++)
			ok = copy_arg(ar, &nd->args[i], &sn->args[i], map,
				      g->n_values);
		for (uint32_t i = 0; i < nd->n_kwargs && ok; i++) {
			sn->kwargs[i].key = nd->kwargs[i].key;
			ok = copy_arg(ar, &nd->kwargs[i].val,
				      &sn->kwargs[i].val, map, g->n_values);
		}
	}
	if (ok) {
		msgpack_packer pk;
		msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
		ok = kiln_graph_pack(&sg, &pk) == 0;
	}
	free(used);
	free(map);
	kiln_arena_free(ar);
	return ok;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Deterministic inputs for g (uniform in [-0.5, 0.5)); false on OOM. */
static bool make_inputs(const kiln_graph_t *g, kiln_io_t *in)
{
	uint64_t seed = 0x9e3779b97f4a7c15u;
	for (uint32_t i = 0; i < g->n_inputs; i++) {
		const kiln_value_t *v = &g->values[i];
		kiln_tensor_t *t = &in[i].t;
		in[i].kind = KILN_IO_TENSOR;
		t->dtype = v->dtype;
		t->rank = v->rank;
		/* the declared strides (a transposed weight of nn.Linear is a
		 * view): the elements of its span */
		int64_t count = 1;
		bool empty = false;
		for (uint32_t k = 0; k < v->rank; k++) {
			t->sizes[k] = v->sizes[k].c;
			t->strides[k] = v->strides[k].c;
			if (v->sizes[k].c == 0)
				empty = true;
			else if (v->strides[k].c > 0)
				count += (v->sizes[k].c - 1) * v->strides[k].c;
		}
		if (empty)
			count = 0;
		size_t esz = kiln_dtype_size(v->dtype);
		t->data = calloc((size_t)(count > 0 ? count : 1), esz);
		if (t->data == NULL)
			return false;
		for (int64_t e = 0; e < count; e++) {
			seed =
			    seed * 6364136223846793005u + 1442695040888963407u;
			double x =
			    (double)(seed >> 40) / (double)(1u << 24) - 0.5;
			if (v->dtype == KILN_DT_F32)
				((float *)t->data)[e] = (float)x;
			else if (v->dtype == KILN_DT_F64)
				((double *)t->data)[e] = x;
		}
	}
	return true;
}

#define MAX_VARIANTS 4 /* per node: see variant_name */

/* Times the variants' artifacts (nv of them, consumed) on the same inputs,
 * runs interleaved (A B C A B C ..., so that whatever else the machine
 * does slows all alike): a warm-up, then rounds until 60 ms or 20 rounds
 * (at least 3); ms[v] is variant v's fastest run (the least disturbed),
 * < 0 when it failed. */
static void time_variants(kiln_artifact_t **a, int nv, const kiln_graph_t *g,
			  double *ms)
{
	kiln_module_t *m[MAX_VARIANTS] = {NULL};
	void **ob[MAX_VARIANTS] = {NULL};
	char err[256];
	bool ok = true;
	for (int v = 0; v < nv; v++) {
		ms[v] = -1;
		if (kiln_module_from_artifact(a[v], &m[v], err, sizeof(err)) !=
		    0)
			ok = false;
		a[v] = NULL; /* the module owns it, or it was freed */
		ob[v] = calloc(g->n_outputs + 1, sizeof(void *));
		ok = ok && ob[v] != NULL;
	}
	kiln_io_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	kiln_io_t *out = calloc(g->n_outputs + 1, sizeof(*out));
	ok = ok && in && out && make_inputs(g, in);
	double ts[MAX_VARIANTS][20];
	int n = 0;
	/* warm-up: at least 2 runs each and 100 ms (a BLAS library loaded
	 * by the first run keeps a thread spinning on the other core for a
	 * while: timed at once, the parallel variant measured 1.5-2x slow in
	 * one process of four) */
	double t_w = kiln__now_ms();
	for (int w = 0;
	     ok && (w < 2 || kiln__now_ms() - t_w < 100.0) && w < 200; w++)
		for (int v = 0; v < nv && ok; v++)
			ok = kiln_module_run(m[v], in, g->n_inputs, ob[v], out,
					     NULL, err, sizeof(err)) == 0;
	double spent = 0;
	while (ok && n < 20 && (n < 3 || spent < 60.0)) {
		for (int v = 0; v < nv && ok; v++) {
			double t0 = kiln__now_ms();
			ok = kiln_module_run(m[v], in, g->n_inputs, ob[v], out,
					     NULL, err, sizeof(err)) == 0;
			ts[v][n] = kiln__now_ms() - t0;
			spent += ts[v][n];
		}
		n++;
	}
	for (int v = 0; ok && v < nv; v++) {
		qsort(ts[v], (size_t)n, sizeof(double), cmp_d);
		ms[v] = ts[v][0];
	}
	for (uint32_t i = 0; in && i < g->n_inputs; i++)
		free(in[i].t.data);
	for (int v = 0; v < nv; v++) {
		for (uint32_t i = 0; ob[v] && i < g->n_outputs; i++)
			free(ob[v][i]);
		free(ob[v]);
		kiln_module_free(m[v]);
	}
	free(in);
	free(out);
}

/* A convolution: 0 the tiled template with the GEMM template as its
 * product (ops_conv.c; where the target has none, the same kernels as 2),
 * 1 the whole-image (or batched) im2col and a product (BLAS, or the GEMM
 * template by codegen.c's rule for products; in f32 on AVX-512 implicit
 * GEMM where it has the units, ops_conv.c conv_implicit), 2 the tiled
 * template with BLAS (where a tiled form does not apply, 0 and 2 build
 * what 1 does, 2 without the GEMM template: the im2col buffer and BLAS), 3
 * the direct kernel (f32 on AVX-512, stride 1, rows of at most 4 vectors:
 * ops_conv.c conv_fdirect; elsewhere what 0 builds). A
 * convolution whose result feeds exactly one node is timed as 0 and 2 only:
 * that node may become the tiled form's epilogue, which the whole-image form
 * rules out and a one-node timing cannot see. A product: 0 BLAS on row blocks,
 * 1 BLAS on row and column blocks, 2 the GEMM template (codegen.c cg_gemm_tmpl:
 * B in place, or packed a panel at a time where it is transposed or does not
 * fit in L2; where the template does not apply, the same kernels as 0 or 1). */
static const char *variant_name(const char *op, int v, const char *text)
{
	/* a convolution's variant is named by the form its kernels took
	 * (where a form does not apply another is built: implicit GEMM
	 * where the tiled template's scratch would be too large) */
	if (strcmp(op, "aten.convolution.default") == 0)
		return strstr(text, "convolution, direct") ? "direct"
		       : strstr(text, "as implicit GEMM")  ? "implicit GEMM"
		       : strstr(text, "im2col tiles + GEMM template")
			   ? "tiled im2col + GEMM template"
		       : strstr(text, "im2col tiles + BLAS")
			   ? "tiled im2col + BLAS"
			   : "whole-image im2col + product";
	return v == 0	? "BLAS in row blocks"
	       : v == 1 ? "BLAS in row and column blocks"
			: "GEMM template";
}

int kiln__autotune(kiln_compiler_t *kc, kiln_tune_cache_t *cache,
		   const kiln_graph_t *g, int8_t *tune,
		   char (*why)[KILN_TUNE_WHY])
{
	uint32_t *readers = count_readers(g);
	for (uint32_t ni = 0; ni < g->n_nodes; ni++) {
		tune[ni] = -1;
		why[ni][0] = '\0';
		if (!tunable_op(g->nodes[ni].op))
			continue;
		if (strcmp(g->nodes[ni].op, "aten.convolution.default") != 0 &&
		    (readers == NULL || single_reader(g, readers, ni)))
			continue;
		msgpack_sbuffer sb;
		msgpack_sbuffer_init(&sb);
		kiln_graph_t *sg = NULL;
		char err[256];
		if (!one_node_graph(g, ni, &sb) ||
		    kiln_graph_decode((const uint8_t *)sb.data, sb.size, NULL,
				      &sg, err, sizeof(err)) != 0) {
			msgpack_sbuffer_destroy(&sb);
			continue;
		}
		/* the key: the one-node graph, and for a convolution whether
		 * its result feeds one node (fewer variants are timed) */
		bool conv1 =
		    strcmp(g->nodes[ni].op, "aten.convolution.default") == 0 &&
		    readers != NULL && single_reader(g, readers, ni);
		if (conv1)
			msgpack_sbuffer_write(&sb, "\x01", 1);
		if (cache_get(cache, sb.data, sb.size, &tune[ni], why[ni])) {
			msgpack_sbuffer_destroy(&sb);
			kiln_graph_free(sg);
			continue;
		}
		/* the variants' kernels: those that give the same text as
		 * an earlier one drop out; one left, nothing to choose */
		int nv = MAX_VARIANTS, nd = 0;
		int8_t vs[MAX_VARIANTS];
		char *text[MAX_VARIANTS] = {NULL};
		for (int v = 0; v < nv; v++) {
			int8_t t1 = (int8_t)v;
			if ((conv1 && v == 1) ||
			    (v == 3 && strcmp(g->nodes[ni].op,
					      "aten.convolution.default") != 0))
				continue;
			if (kiln__compile_tuned(kc, sg, &t1, NULL, NULL,
						&text[nd], KILN_EMIT_KERNELS,
						NULL, err, sizeof(err)) != 0)
				continue;
			bool dup = false;
			for (int d = 0; d < nd && !dup; d++)
				dup = strcmp(text[d], text[nd]) == 0;
			if (dup) {
				free(text[nd]);
				text[nd] = NULL;
			} else {
				vs[nd++] = t1;
			}
		}
		const char *names[MAX_VARIANTS];
		for (int d = 0; d < nd; d++) {
			names[d] =
			    variant_name(g->nodes[ni].op, vs[d], text[d]);
			free(text[d]);
		}
		int8_t best = -1;
		char w[KILN_TUNE_WHY] = "";
		if (nd > 1) {
			double ms[MAX_VARIANTS];
			kiln_artifact_t *a[MAX_VARIANTS] = {NULL};
			bool built = true;
			for (int d = 0; d < nd && built; d++)
				built = kiln__compile_tuned(
					    kc, sg, &vs[d], NULL, &a[d], NULL,
					    KILN_EMIT_ARTIFACT, NULL, err,
					    sizeof(err)) == 0;
			if (built) {
				time_variants(a, nd, sg, ms);
				int len = snprintf(
				    w, sizeof(w),
				    "chosen by measurement (max-autotune):");
				int bi = 0;
				for (int d = 0; d < nd; d++) {
					if (ms[d] < 0)
						bi = -1;
					else if (bi >= 0 && ms[d] < ms[bi])
						bi = d;
					if (len >= 0 && (size_t)len < sizeof(w))
						len += snprintf(
						    w + len,
						    sizeof(w) - (size_t)len,
						    "%s %s %.3f ms",
						    d ? "," : "", names[d],
						    ms[d]);
				}
				if (bi >= 0)
					best = vs[bi];
				else
					w[0] = '\0';
			}
			for (int d = 0; d < nd; d++)
				kiln_artifact_free(a[d]);
		}
		cache_put(cache, sb.data, sb.size, best, w);
		tune[ni] = best;
		memcpy(why[ni], w, KILN_TUNE_WHY);
		msgpack_sbuffer_destroy(&sb);
		kiln_graph_free(sg);
	}
	free(readers);
	return 0;
}
