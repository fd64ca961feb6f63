/*
 * bench_kernels.c — speed of kiln's fused kernels against a memcpy of the
 * same bytes, measured in the same run.
 *
 *   bench_kernels [--json] [--mb 1,4,16,64] [--threads N] [--workload W]
 *
 * --workload runs one of the four below (bench_compiler.py runs each
 * point in turn with torch's, so that all of them see the same minute).
 * Workloads over an f32 tensor of the given size (the "main" tensor):
 *   add        y = a + b                     (bytes: 2 reads + 1 write)
 *   gelu       y = gelu(x * w + b), w, b [C] (1 read + 1 write)
 *   softmax    softmax over rows of 1024     (1 read + 1 write)
 *   layernorm  layer_norm over rows of 1024  (1 read + 1 write)
 * GB/s counts the bytes a perfect kernel must move (above). The peer is a
 * memcpy of the same number of bytes (reads + writes) split over the same
 * thread pool. Each figure is the median of 15 runs, with the outputs
 * reused across runs: the kernel and the memcpy take turns in three blocks
 * of WARM warm-ups and 5 timed runs each, so that both halves of a ratio
 * see the same machine (whose speed here changes from one minute to the
 * next). WARM is 12: with 3, a memcpy of 4 MB that followed the kernel had
 * not reached its speed (softmax's: 53-60 GB/s against 79-81 after 12),
 * which would have flattered the kernels; the single memcpy measurement
 * this bench made before (3 warm-ups, after the kernel) read anywhere from
 * 38 to 87 GB/s at 1-4 MB on this VM. --json also reports runs
 * that allocate fresh outputs every time (as torch does), for comparing
 * with torch.
 */
#include "clients/libkiln/kiln.h"
#include "compiler/compiler.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

typedef struct gb {
	msgpack_sbuffer sb;
	msgpack_packer pk;
} gb_t;

static void s(gb_t *b, const char *x)
{
	kiln_pack_cstr(&b->pk, x);
}
static void spec(gb_t *b, int64_t r, int64_t c)
{
	msgpack_pack_map(&b->pk, 2);
	s(b, "dtype");
	s(b, "f32");
	s(b, "shape");
	if (r < 0) {
		msgpack_pack_array(&b->pk, 1);
		msgpack_pack_int64(&b->pk, c);
	} else {
		msgpack_pack_array(&b->pk, 2);
		msgpack_pack_int64(&b->pk, r);
		msgpack_pack_int64(&b->pk, c);
	}
}
static void ref(gb_t *b, uint32_t v)
{
	msgpack_pack_map(&b->pk, 1);
	s(b, "ref");
	msgpack_pack_uint32(&b->pk, v);
}
static void node_head(gb_t *b, const char *op, uint32_t nargs)
{
	msgpack_pack_map(&b->pk, 3);
	s(b, "op");
	s(b, op);
	s(b, "args");
	msgpack_pack_array(&b->pk, nargs);
}

/* Builds the workload graph; sets the number of inputs and their shapes. */
static kiln_graph_t *build(const char *w, int64_t rows, int64_t cols, int *n_in,
			   int64_t in_shape[][2])
{
	gb_t b;
	msgpack_sbuffer_init(&b.sb);
	msgpack_packer_init(&b.pk, &b.sb, msgpack_sbuffer_write);
	msgpack_pack_map(&b.pk, 4);
	s(&b, "format");
	s(&b, "kiln.graph/1");
	s(&b, "inputs");
	if (strcmp(w, "add") == 0) {
		*n_in = 2;
		msgpack_pack_array(&b.pk, 2);
		spec(&b, rows, cols);
		spec(&b, rows, cols);
		s(&b, "nodes");
		msgpack_pack_array(&b.pk, 1);
		node_head(&b, "aten.add.Tensor", 2);
		ref(&b, 0);
		ref(&b, 1);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 1);
		ref(&b, 2);
		in_shape[0][0] = in_shape[1][0] = rows;
		in_shape[0][1] = in_shape[1][1] = cols;
	} else if (strcmp(w, "gelu") == 0) {
		*n_in = 3;
		msgpack_pack_array(&b.pk, 3);
		spec(&b, rows, cols);
		spec(&b, -1, cols);
		spec(&b, -1, cols);
		s(&b, "nodes");
		msgpack_pack_array(&b.pk, 3);
		node_head(&b, "aten.mul.Tensor", 2);
		ref(&b, 0);
		ref(&b, 1);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		node_head(&b, "aten.add.Tensor", 2);
		ref(&b, 3);
		ref(&b, 2);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		node_head(&b, "aten.gelu.default", 1);
		ref(&b, 4);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 1);
		ref(&b, 5);
		in_shape[0][0] = rows;
		in_shape[0][1] = cols;
		in_shape[1][0] = in_shape[2][0] = -1;
		in_shape[1][1] = in_shape[2][1] = cols;
	} else if (strcmp(w, "softmax") == 0) {
		*n_in = 1;
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		s(&b, "nodes");
		msgpack_pack_array(&b.pk, 1);
		node_head(&b, "aten._softmax.default", 3);
		ref(&b, 0);
		msgpack_pack_int64(&b.pk, -1);
		msgpack_pack_false(&b.pk);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 1);
		spec(&b, rows, cols);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 1);
		ref(&b, 1);
		in_shape[0][0] = rows;
		in_shape[0][1] = cols;
	} else { /* layernorm */
		*n_in = 3;
		msgpack_pack_array(&b.pk, 3);
		spec(&b, rows, cols);
		spec(&b, -1, cols);
		spec(&b, -1, cols);
		s(&b, "nodes");
		msgpack_pack_array(&b.pk, 1);
		node_head(&b, "aten.native_layer_norm.default", 5);
		ref(&b, 0);
		msgpack_pack_array(&b.pk, 1);
		msgpack_pack_int64(&b.pk, cols);
		ref(&b, 1);
		ref(&b, 2);
		msgpack_pack_double(&b.pk, 1e-5);
		s(&b, "out");
		msgpack_pack_array(&b.pk, 3);
		spec(&b, rows, cols);
		spec(&b, rows, 1);
		spec(&b, rows, 1);
		s(&b, "outputs");
		msgpack_pack_array(&b.pk, 1);
		ref(&b, 3);
		in_shape[0][0] = rows;
		in_shape[0][1] = cols;
		in_shape[1][0] = in_shape[2][0] = -1;
		in_shape[1][1] = in_shape[2][1] = cols;
	}
	kiln_graph_t *g = NULL;
	char err[256];
	if (kiln_graph_decode((const uint8_t *)b.sb.data, b.sb.size, NULL, &g,
			      err, sizeof(err)) != 0)
		fprintf(stderr, "bench: %s\n", err);
	msgpack_sbuffer_destroy(&b.sb);
	return g;
}

typedef struct cpy {
	char *dst;
	const char *src;
	size_t n;
} cpy_t;

static void copy_range(void *ctx, int64_t begin, int64_t end)
{
	cpy_t *c = ctx;
	size_t chunk = 1 << 16;
	for (int64_t i = begin; i < end; i++) {
		size_t off = (size_t)i * chunk;
		size_t len = off + chunk > c->n ? c->n - off : chunk;
		memcpy(c->dst + off, c->src + off, len);
	}
}

enum { WARM = 12 };

/* A memcpy of n bytes over the pool, its buffers touched beforehand. */
static void mc_init(cpy_t *c, size_t n)
{
	char *a = aligned_alloc(64, (n + 63) / 64 * 64);
	char *b = aligned_alloc(64, (n + 63) / 64 * 64);
	if (a == NULL || b == NULL) {
		fprintf(stderr, "bench: out of memory\n");
		exit(1);
	}
	memset(a, 1, n);
	memset(b, 2, n);
	*c = (cpy_t){b, a, n};
}

static void mc_run(kiln_pool_t *p, cpy_t *c)
{
	int64_t chunks = (int64_t)((c->n + 65535) / 65536);
	kiln_pool_parallel_for(p, chunks, 4, copy_range, c);
}

int main(int argc, char **argv)
{
	bool json = false;
	const char *only = NULL;
	int mbs[8] = {1, 4, 16, 64}, n_mb = 4;
	unsigned threads = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) {
			n_mb = 0;
			const char *p = argv[++i];
			for (;;) {
				char *end = NULL;
				long v = strtol(p, &end, 10);
				if (end == p || (*end != ',' && *end != '\0') ||
				    v < 1 || v > 4096 || n_mb == 8) {
					fprintf(stderr,
						"bench_kernels: --mb takes up "
						"to 8 sizes of 1 to 4096 MB, "
						"comma-separated (got '%s')\n",
						argv[i]);
					return 2;
				}
				mbs[n_mb++] = (int)v;
				if (*end == '\0')
					break;
				p = end + 1;
			}
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			char *end = NULL;
			long v = strtol(argv[++i], &end, 10);
			if (end == argv[i] || *end != '\0' || v < 0 ||
			    v > 1024) {
				fprintf(stderr,
					"bench_kernels: --threads takes 0 (one "
					"per CPU) to 1024 (got '%s')\n",
					argv[i]);
				return 2;
			}
			threads = (unsigned)v;
		} else if (strcmp(argv[i], "--workload") == 0 && i + 1 < argc) {
			only = argv[++i];
		} else {
			fprintf(stderr,
				"bench_kernels: unknown argument '%s' (usage: "
				"bench_kernels [--json] [--mb 1,4,16,64] "
				"[--threads N] [--workload "
				"add|gelu|softmax|layernorm])\n",
				argv[i]);
			return 2;
		}
	}
	const char *works[] = {"add", "gelu", "softmax", "layernorm"};
	if (only != NULL) {
		int found = 0;
		for (int wi = 0; wi < 4; wi++)
			found |= strcmp(works[wi], only) == 0;
		if (!found) {
			fprintf(stderr,
				"bench_kernels: unknown workload '%s' (add, "
				"gelu, softmax or layernorm)\n",
				only);
			return 2;
		}
	}
	char err[512];
	kiln_compiler_t *kc = NULL;
	if (kiln_compiler_new(NULL, &kc, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench: %s\n", err);
		return 1;
	}
	kiln_pool_t *pool = NULL;
	if (kiln_pool_new(threads, &pool) != 0)
		return 1;
	if (!json)
		printf("%-10s %6s %10s %10s %10s %8s\n", "workload", "MB",
		       "kiln ms", "kiln GB/s", "memcpy GB/s", "ratio");
	for (int wi = 0; wi < 4; wi++) {
		if (only != NULL && strcmp(works[wi], only) != 0)
			continue;
		for (int mi = 0; mi < n_mb; mi++) {
			int64_t elems = (int64_t)mbs[mi] << 18; /* MB of f32 */
			int64_t cols = 1024, rows = elems / cols;
			int n_in;
			int64_t shp[3][2];
			kiln_graph_t *g =
			    build(works[wi], rows, cols, &n_in, shp);
			kiln_compile_opts_t opts;
			memset(&opts, 0, sizeof(opts));
			kiln_artifact_t *a = NULL;
			if (g == NULL || kiln_compile(kc, g, &opts, &a, NULL,
						      err, sizeof(err)) != 0) {
				fprintf(stderr, "bench %s: %s\n", works[wi],
					err);
				return 1;
			}
			kiln_module_t *m = NULL;
			if (kiln_module_from_artifact(a, &m, err,
						      sizeof(err)) != 0) {
				fprintf(stderr, "bench: %s\n", err);
				return 1;
			}
			kiln_io_t in[3];
			for (int i = 0; i < n_in; i++) {
				memset(&in[i], 0, sizeof(in[i]));
				in[i].kind = KILN_IO_TENSOR;
				kiln_tensor_t *t = &in[i].t;
				t->dtype = KILN_DT_F32;
				int64_t n = shp[i][1];
				if (shp[i][0] >= 0) {
					t->rank = 2;
					t->sizes[0] = shp[i][0];
					t->sizes[1] = shp[i][1];
					t->strides[0] = shp[i][1];
					t->strides[1] = 1;
					n *= shp[i][0];
				} else {
					t->rank = 1;
					t->sizes[0] = shp[i][1];
					t->strides[0] = 1;
				}
				float *d =
				    aligned_alloc(64, (size_t)n * 4 + 64);
				for (int64_t e = 0; e < n; e++)
					d[e] =
					    (float)((e * 7919 % 1000) - 500) /
					    250.0f;
				t->data = d;
			}
			uint32_t nob = kiln_module_n_out_buffers(m);
			void *ob[4] = {NULL, NULL, NULL, NULL};
			kiln_io_t outs[4];
			kiln_run_opts_t ro = {.pool = pool};
			/* outputs reused across runs, in turns with the memcpy
			 * of the same bytes (neither side touches fresh
			 * memory); then outputs allocated by the runtime on
			 * every run (as torch allocates its results: fresh
			 * pages) */
			double bytes = (double)elems * 4 *
				       (strcmp(works[wi], "add") == 0 ? 3 : 2);
			cpy_t mc;
			mc_init(&mc, (size_t)(bytes / 2));
			double t[15], tm15[15], tf[15];
			for (int blk = 0; blk < 3; blk++) {
				for (int r = 0; r < WARM + 5; r++) {
					double t0 = now_s();
					if (kiln_module_run(
						m, in, (uint32_t)n_in, ob, outs,
						&ro, err, sizeof(err)) != 0) {
						fprintf(stderr, "bench: %s\n",
							err);
						return 1;
					}
					if (r >= WARM)
						t[blk * 5 + r - WARM] =
						    now_s() - t0;
				}
				for (int r = 0; r < WARM + 5; r++) {
					double t0 = now_s();
					mc_run(pool, &mc);
					if (r >= WARM)
						tm15[blk * 5 + r - WARM] =
						    now_s() - t0;
				}
			}
			free((void *)mc.src);
			free(mc.dst);
			for (uint32_t i = 0; i < nob; i++) {
				free(ob[i]);
				ob[i] = NULL;
			}
			for (int r = 0; r < 18; r++) {
				double t0 = now_s();
				if (kiln_module_run(m, in, (uint32_t)n_in, ob,
						    outs, &ro, err,
						    sizeof(err)) != 0) {
					fprintf(stderr, "bench: %s\n", err);
					return 1;
				}
				for (uint32_t i = 0; i < nob; i++) {
					free(ob[i]);
					ob[i] = NULL;
				}
				if (r >= 3)
					tf[r - 3] = now_s() - t0;
			}
			qsort(t, 15, sizeof(double), cmpd);
			qsort(tm15, 15, sizeof(double), cmpd);
			qsort(tf, 15, sizeof(double), cmpd);
			double tk = t[7], tkf = tf[7], tm = tm15[7];
			double gk = bytes / tk / 1e9, gm = bytes / tm / 1e9;
			if (json)
				printf("{\"workload\": \"%s\", \"mb\": %d, "
				       "\"kiln_ms\": %.4f, \"kiln_gbs\": %.2f, "
				       "\"kiln_fresh_gbs\": %.2f, "
				       "\"memcpy_gbs\": %.2f}\n",
				       works[wi], mbs[mi], tk * 1e3, gk,
				       bytes / tkf / 1e9, gm);
			else
				printf(
				    "%-10s %6d %10.3f %10.2f %10.2f %7.0f%%\n",
				    works[wi], mbs[mi], tk * 1e3, gk, gm,
				    100 * gk / gm);
			for (uint32_t i = 0; i < nob; i++)
				free(ob[i]);
			for (int i = 0; i < n_in; i++)
				free(in[i].t.data);
			kiln_module_free(m);
			kiln_graph_free(g);
		}
	}
	kiln_pool_free(pool);
	kiln_compiler_free(kc);
	return 0;
}
