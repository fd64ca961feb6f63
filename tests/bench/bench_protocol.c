/*
 * bench_protocol.c — how fast kiln turns Graph v1 bytes into a signature,
 * against the floor of bare msgpack-c.
 *
 *   bench_protocol [GRAPHS_DIR]     (default: the source tree's
 *                                    tests/data/graphs)
 *
 * For every GRAPHS_DIR/ *.graph.msgpack, and for the corpus as a whole:
 *   peer  msgpack_zone_init + msgpack_unpack + msgpack_zone_destroy: what
 *         any msgpack-c program pays just to read the bytes;
 *   kiln  kiln_graph_decode (prescan + unpack + validate into the arena) +
 *         kiln_signature (structure=false) + kiln_graph_free: what a client
 *         or the daemon pays from bytes to signature.
 * The target is kiln within 2x of bare unpack (ratio kiln/peer <= 2.0).
 * Then a breakdown of kiln's time over the corpus: prescan alone, unpack
 * alone, decode/validate alone (kiln_graph_from_object on an unpacked
 * object, + free), signature alone.
 *
 * Method: each measurement is calibrated to rounds of >= ROUND_S seconds,
 * ROUNDS rounds are run (>= 0.3 s in all), and the median round gives the
 * time per operation; peer and kiln rounds alternate, so that a change in
 * machine load affects both alike. CLOCK_MONOTONIC. MB = 10^6 bytes.
 */
#include "protocol/protocol.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef KILN_BENCH_GRAPHS_DIR
#define KILN_BENCH_GRAPHS_DIR "tests/data/graphs"
#endif

#define ROUNDS	7
#define ROUND_S 0.06 /* 7 x 0.06 s >= 0.3 s per measurement */
#define SUFFIX	".graph.msgpack"

typedef struct graph_file {
	char *name;
	uint8_t *bytes;
	size_t len;
	uint32_t nodes;
	/* for the breakdown */
	msgpack_zone zone;
	msgpack_object obj;
	kiln_graph_t *g;
} graph_file_t;

static graph_file_t *files;
static size_t n_files;
static kiln_limits_t lim;
static kiln_target_t target;
static kiln_compile_opts_t opts;
static const char *fingerprint = "kiln/0.1.0 llvm/16.0.6 build/bench";
static volatile unsigned sink;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the operations (one call = one operation on one graph) ----------- */

typedef void (*op_fn)(const graph_file_t *f);

static void op_peer(const graph_file_t *f)
{
	msgpack_zone z;
	msgpack_object o;
	size_t off = 0;
	if (!msgpack_zone_init(&z, 65536))
		abort();
	msgpack_unpack_return r =
	    msgpack_unpack((const char *)f->bytes, f->len, &off, &z, &o);
	if (r != MSGPACK_UNPACK_SUCCESS)
		abort();
	sink += (unsigned)o.type;
	msgpack_zone_destroy(&z);
}

static void op_kiln(const graph_file_t *f)
{
	kiln_graph_t *g;
	uint8_t sig[KILN_SIG_BYTES];
	if (kiln_graph_decode(f->bytes, f->len, &lim, &g, NULL, 0) != 0 ||
	    kiln_signature(g, &target, &opts, fingerprint, false, sig) != 0)
		abort();
	sink += sig[0];
	kiln_graph_free(g);
}

static void op_prescan(const graph_file_t *f)
{
	size_t end;
	uint32_t n;
	if (kiln_msgpack_prescan(f->bytes, f->len, &lim, &end, &n, NULL, 0) !=
	    0)
		abort();
	sink += n;
}

static void op_validate(const graph_file_t *f)
{
	kiln_graph_t *g;
	if (kiln_graph_from_object(&f->obj, &lim, &g, NULL, 0) != 0)
		abort();
	sink += g->n_nodes;
	kiln_graph_free(g);
}

static void op_signature(const graph_file_t *f)
{
	uint8_t sig[KILN_SIG_BYTES];
	if (kiln_signature(f->g, &target, &opts, fingerprint, false, sig) != 0)
		abort();
	sink += sig[0];
}

/* ---- measurement -------------------------------------------------------- */

/* Runs op over files[first .. first+count) `iters` times; seconds. */
static double run(op_fn op, size_t first, size_t count, long iters)
{
	double t0 = now();
	for (long i = 0; i < iters; i++)
		for (size_t k = first; k < first + count; k++)
			op(&files[k]);
	return now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Iterations of op over files[first .. first+count) for a round of
 * >= ROUND_S seconds. */
static long calibrate(op_fn op, size_t first, size_t count)
{
	long iters = 1;
	run(op, first, count, 1); /* warm up */
	for (;;) {
		double t = run(op, first, count, iters);
		if (t >= ROUND_S)
			return iters;
		long next = t > 0 ? (long)(iters * (ROUND_S * 1.2 / t)) + 1
				  : iters * 10;
		iters = next > iters * 10 ? iters * 10 : next;
	}
}

static double median(double *r, int n)
{
	qsort(r, (size_t)n, sizeof(r[0]), cmp_double);
	return r[n / 2];
}

/* Median seconds for one pass of op over files[first .. first+count). */
static double measure(op_fn op, size_t first, size_t count)
{
	long iters = calibrate(op, first, count);
	double r[ROUNDS];
	for (int i = 0; i < ROUNDS; i++)
		r[i] = run(op, first, count, iters) / (double)iters;
	return median(r, ROUNDS);
}

/* The same for two ops, their rounds interleaved (a, b, a, b, ...) so
 * that a change in machine load hits both alike and their ratio holds. */
static void measure_pair(op_fn a, op_fn b, size_t first, size_t count,
			 double *ta, double *tb)
{
	long ia = calibrate(a, first, count), ib = calibrate(b, first, count);
	double ra[ROUNDS], rb[ROUNDS];
	for (int i = 0; i < ROUNDS; i++) {
		ra[i] = run(a, first, count, ia) / (double)ia;
		rb[i] = run(b, first, count, ib) / (double)ib;
	}
	*ta = median(ra, ROUNDS);
	*tb = median(rb, ROUNDS);
}

/* ---- loading ------------------------------------------------------------ */

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const graph_file_t *)a)->name,
		      ((const graph_file_t *)b)->name);
}

static int load(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL) {
		perror(dir);
		return -1;
	}
	struct dirent *e;
	size_t cap = 0;
	while ((e = readdir(d)) != NULL) {
		size_t nl = strlen(e->d_name), sl = strlen(SUFFIX);
		if (nl <= sl || strcmp(e->d_name + nl - sl, SUFFIX) != 0)
			continue;
		if (n_files == cap) {
			cap = cap ? 2 * cap : 32;
			graph_file_t *nf = realloc(files, cap * sizeof(*files));
			if (nf == NULL)
				abort();
			files = nf;
		}
		graph_file_t *f = &files[n_files];
		memset(f, 0, sizeof(*f));
		f->name = strndup(e->d_name, nl - sl);
		size_t plen = strlen(dir) + nl + 2;
		char *path = malloc(plen);
		if (f->name == NULL || path == NULL)
			abort();
		snprintf(path, plen, "%s/%s", dir, e->d_name);
		FILE *fp = fopen(path, "rb");
		if (fp == NULL || fseek(fp, 0, SEEK_END) != 0) {
			perror(path);
			return -1;
		}
		long len = ftell(fp);
		rewind(fp);
		f->len = len > 0 ? (size_t)len : 0;
		f->bytes = malloc(f->len ? f->len : 1);
		if (f->bytes == NULL ||
		    fread(f->bytes, 1, f->len, fp) != f->len) {
			fprintf(stderr, "%s: read failed\n", path);
			return -1;
		}
		fclose(fp);
		free(path);
		n_files++;
	}
	closedir(d);
	qsort(files, n_files, sizeof(*files), cmp_name);
	return 0;
}

/* Decodes each file once (drops and reports the ones that do not decode)
 * and prepares the breakdown's inputs. */
static void prepare(void)
{
	size_t kept = 0;
	for (size_t i = 0; i < n_files; i++) {
		graph_file_t *f = &files[i];
		char err[256] = "";
		int rc = kiln_graph_decode(f->bytes, f->len, &lim, &f->g, err,
					   sizeof(err));
		if (rc != 0) {
			printf("skipped %s: %s (%s)\n", f->name,
			       kiln_strerror(rc), err);
			free(f->bytes);
			free(f->name);
			continue;
		}
		f->nodes = f->g->n_nodes;
		files[kept++] = *f;
	}
	n_files = kept;
	for (size_t i = 0; i < n_files; i++) {
		graph_file_t *f = &files[i];
		if (!msgpack_zone_init(&f->zone, 65536) ||
		    kiln_msgpack_unpack_map(f->bytes, f->len, &lim, &f->zone,
					    &f->obj, NULL, 0) != 0)
			abort();
	}
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : KILN_BENCH_GRAPHS_DIR;
	kiln_limits_default(&lim);
	memset(&target, 0, sizeof(target));
	strcpy(target.backend, "cpu");
	strcpy(target.arch, "x86-64");
	strcpy(target.features, "+avx,+avx2,+bmi,+bmi2,+f16c,+fma,+sse4.2");
	memset(&opts, 0, sizeof(opts));
	strcpy(opts.mode, "default");

	if (load(dir) != 0)
		return 1;
	prepare();
	if (n_files == 0) {
		fprintf(stderr, "%s: no decodable *%s files\n", dir, SUFFIX);
		return 1;
	}
	printf("bench_protocol: %zu graphs from %s; median of %d rounds of "
	       ">= %.2f s each; MB = 10^6 bytes\n\n",
	       n_files, dir, ROUNDS, ROUND_S);
	printf("%-24s %8s %6s %10s %10s %11s %7s\n", "graph", "bytes", "nodes",
	       "peer MB/s", "kiln MB/s", "kiln grph/s", "ratio");
	size_t total_bytes = 0;
	uint64_t total_nodes = 0;
	for (size_t i = 0; i < n_files; i++) {
		const graph_file_t *f = &files[i];
		double tp, tk;
		measure_pair(op_peer, op_kiln, i, 1, &tp, &tk);
		printf("%-24s %8zu %6u %10.1f %10.1f %11.0f %7.2f\n", f->name,
		       f->len, f->nodes, (double)f->len / tp / 1e6,
		       (double)f->len / tk / 1e6, 1.0 / tk, tk / tp);
		fflush(stdout);
		total_bytes += f->len;
		total_nodes += f->nodes;
	}

	/* The corpus as one workload: one pass = every graph once. */
	double tp, tk;
	measure_pair(op_peer, op_kiln, 0, n_files, &tp, &tk);
	double ratio = tk / tp;
	printf("%-24s %8zu %6llu %10.1f %10.1f %11.0f %7.2f\n",
	       "TOTAL (corpus)", total_bytes, (unsigned long long)total_nodes,
	       (double)total_bytes / tp / 1e6, (double)total_bytes / tk / 1e6,
	       (double)n_files / tk, ratio);
	printf("\npeer: %.1f MB/s, %.0f graphs/s; kiln: %.1f MB/s, %.0f "
	       "graphs/s; kiln/peer time %.2fx\n",
	       (double)total_bytes / tp / 1e6, (double)n_files / tp,
	       (double)total_bytes / tk / 1e6, (double)n_files / tk, ratio);
	printf("target \"kiln within 2x of bare unpack\": %s (%.2fx)\n",
	       ratio <= 2.0 ? "PASS" : "MISS", ratio);

	/* Breakdown over the corpus, microseconds per graph (mean over the
	 * corpus). */
	for (size_t i = 0; i < n_files; i++) {
		kiln_graph_free(files[i].g);
		if (kiln_graph_decode(files[i].bytes, files[i].len, &lim,
				      &files[i].g, NULL, 0) != 0)
			abort();
	}
	double n = (double)n_files;
	double b_pre = measure(op_prescan, 0, n_files) / n * 1e6;
	double b_unp = measure(op_peer, 0, n_files) / n * 1e6;
	double b_val = measure(op_validate, 0, n_files) / n * 1e6;
	double b_sig = measure(op_signature, 0, n_files) / n * 1e6;
	double b_all = tk / n * 1e6;
	printf("\nbreakdown, us per graph (corpus mean):\n");
	printf("  %-44s %9.2f\n", "prescan (kiln_msgpack_prescan)", b_pre);
	printf("  %-44s %9.2f\n",
	       "unpack (zone init + msgpack_unpack + destroy)", b_unp);
	printf("  %-44s %9.2f\n",
	       "decode/validate (kiln_graph_from_object+free)", b_val);
	printf("  %-44s %9.2f\n", "signature (kiln_signature, structure=false)",
	       b_sig);
	printf("  %-44s %9.2f\n", "sum of the parts",
	       b_pre + b_unp + b_val + b_sig);
	printf("  %-44s %9.2f\n", "measured kiln total (decode+sign+free)",
	       b_all);

	for (size_t i = 0; i < n_files; i++) {
		kiln_graph_free(files[i].g);
		msgpack_zone_destroy(&files[i].zone);
		free(files[i].bytes);
		free(files[i].name);
	}
	free(files);
	return 0;
}
