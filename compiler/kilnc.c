/*
 * kilnc.c — the compiler without the daemon, for people and for tests.
 *
 *   kilnc GRAPH [--emit=summary|graph|kernels|llvm|llvm-raw|asm|artifact]
 *               [-o FILE] [--run IO] [--interp IO] [--bench]
 *               [--profile[=N|all]]
 *               [--signature]
 *
 * --run IO compiles, loads the artifact with the runtime, runs it on the
 * inputs of an io file (tests/data/README.md) and compares with its
 * outputs; fallback steps run in the reference interpreter. --interp IO
 * does the same with the interpreter alone. --bench times the compile
 * (median of 5) and, with --run, the run. --profile (with --run) times
 * each plan step over 20 runs and lists the steps that take the most (25;
 * N with --profile=N, every one with --profile=all).
 *
 * Exit codes: 0 success; 1 the input is invalid, the compile failed, or a
 * result differs from the expected one; 2 usage.
 */
#include "clients/libkiln/kiln.h"
#include "compiler/compiler.h"
#include "tests/common/testdata.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: kilnc GRAPH [options]\n"
	    "  GRAPH                a Graph v1 file (msgpack), or - for stdin\n"
	    "  --emit=summary       counts, ops, signature (default)\n"
	    "  --emit=graph         the validated graph, re-encoded\n"
	    "  --emit=kernels       the fusion decisions: kernels and members\n"
	    "  --emit=llvm-raw|llvm LLVM IR before / after O3\n"
	    "  --emit=asm           assembly\n"
	    "  --emit=artifact      the artifact (msgpack; use -o)\n"
	    "  --run IO             compile, run on IO's inputs, compare\n"
	    "  --interp IO          run the reference interpreter on IO\n"
	    "  --bench              time the compile (and the run)\n"
	    "  --profile[=N|all]    with --run: time each plan step (the\n"
	    "                       costliest 25, N, or all)\n"
	    "  --signature          print the signature (64 hex chars)\n"
	    "  --structure          with --signature: the structure hash\n"
	    "  --target=T           cpu (default) or cuda:sm_NN\n"
	    "  --mode=M             default | reduce-overhead | max-autotune\n"
	    "  --fingerprint=S      fingerprint for --signature\n"
	    "  -o FILE              write output to FILE\n"
	    "  -h, --help           this text\n");
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static bool g_profile;		     /* --profile */
static uint32_t g_profile_rows = 25; /* --profile=N (0: all) */

typedef struct prof_row {
	double ms;
	uint32_t step;
} prof_row_t;

static int cmp_prof(const void *a, const void *b)
{
	double x = ((const prof_row_t *)a)->ms, y = ((const prof_row_t *)b)->ms;
	return x > y ? -1 : x < y;
}

/* --profile: each step's mean time over 20 runs, the costliest first (at
 * most 25 lines, --profile=N N, --profile=all every step), with the kernel
 * it runs (kilnc --emit=kernels describes it) or "fallback". */
static void profile_run(kiln_module_t *m, const kiln_artifact_t *a,
			const kiln_io_t *args, uint32_t n_args, void **bufs,
			kiln_io_t *outs, FILE *out)
{
	enum { RUNS = 20 };
	uint32_t ns = kiln_module_n_steps(m);
	uint32_t shown = g_profile_rows == 0 ? ns : g_profile_rows;
	double *ms = calloc(ns + 1, sizeof(double));
	prof_row_t *row = calloc(ns + 1, sizeof(*row));
	if (ms == NULL || row == NULL) {
		free(ms);
		free(row);
		return;
	}
	kiln_run_opts_t ro = {.fallback = kiln_interp_fallback, .step_ms = ms};
	char err[512] = "";
	double t0 = now_ms();
	for (int r = 0; r < RUNS; r++)
		if (kiln_module_run(m, args, n_args, bufs, outs, &ro, err,
				    sizeof(err)) != 0) {
			fprintf(out, "profile: run failed: %s\n", err);
			free(ms);
			free(row);
			return;
		}
	double total = (now_ms() - t0) / RUNS, steps = 0;
	for (uint32_t s = 0; s < ns; s++) {
		row[s].ms = ms[s] / RUNS;
		row[s].step = s;
		steps += row[s].ms;
	}
	qsort(row, ns, sizeof(*row), cmp_prof);
	/* the kernels' BLAS, where a product loaded it (blas.c) */
	const char *core = kiln_blas_corename(getenv("KILN_BLAS"));
	if (core != NULL) {
		const char *set = kiln_blas_prepare();
		fprintf(out, "blas: OpenBLAS, %s kernels (%s)\n", core,
			set != NULL ? "OPENBLAS_CORETYPE set by kiln from the "
				      "CPU's features"
			: getenv("OPENBLAS_CORETYPE") != NULL
			    ? "OPENBLAS_CORETYPE as given"
			    : "OpenBLAS's own choice");
	}
	fprintf(out,
		"profile: %.3f ms per run over %d runs, %.3f ms in %u steps\n"
		"  step  kernel              ms       %%\n",
		total, RUNS, steps, ns);
	for (uint32_t i = 0; i < ns && i < shown; i++) {
		const kiln_art_step_t *st = &a->steps[row[i].step];
		const char *name = st->kind == KILN_STEP_FALLBACK
				       ? "fallback"
				       : a->kernels[st->kernel].name;
		fprintf(out, "  %4u  %-16s %8.3f %6.1f\n", row[i].step, name,
			row[i].ms, steps > 0 ? 100.0 * row[i].ms / steps : 0.0);
	}
	if (ns > shown)
		fprintf(out, "  (%u more steps: --profile=all shows them)\n",
			ns - shown);
	free(ms);
	free(row);
}

static void summary(FILE *out, const kiln_graph_t *g)
{
	fprintf(out, "inputs %u  nodes %u  values %u  outputs %u  symbols %u\n",
		g->n_inputs, g->n_nodes, g->n_values, g->n_outputs,
		g->n_symbols);
	for (uint32_t i = 0; i < g->n_symbols; i++) {
		const kiln_symbol_t *s = &g->symbols[i];
		fprintf(out, "  symbol %s: min %lld max ", s->name,
			(long long)s->min);
		if (s->max >= 0)
			fprintf(out, "%lld", (long long)s->max);
		else
			fprintf(out, "inf");
		if (s->hint >= 0)
			fprintf(out, " hint %lld", (long long)s->hint);
		fputc('\n', out);
	}
	const char **ops = calloc(g->n_nodes + 1, sizeof(*ops));
	uint32_t *cnt = calloc(g->n_nodes + 1, sizeof(*cnt));
	uint32_t n_ops = 0, n_fb = 0;
	for (uint32_t i = 0; ops != NULL && cnt != NULL && i < g->n_nodes;
	     i++) {
		uint32_t k = 0;
		while (k < n_ops && strcmp(ops[k], g->nodes[i].op) != 0)
			k++;
		if (k == n_ops)
			ops[n_ops++] = g->nodes[i].op;
		cnt[k]++;
	}
	fprintf(out, "ops (%u distinct):\n", n_ops);
	for (uint32_t k = 0; k < n_ops; k++) {
		bool sup = kiln_compiler_supports(ops[k]);
		n_fb += sup ? 0 : cnt[k];
		fprintf(out, "  %5u  %s%s\n", cnt[k], ops[k],
			sup ? "" : "  (fallback)");
	}
	fprintf(out, "nodes lowered to kernels: %u of %u\n", g->n_nodes - n_fb,
		g->n_nodes);
	free(ops);
	free(cnt);
}

static int run_io(kiln_artifact_t *a, const kiln_graph_t *g, kiln_td_io_t *iop,
		  const char *iopath, bool bench, FILE *out);

/* Runs an artifact on io's inputs; compares with io's outputs. */
static int run_and_compare(kiln_artifact_t *a, const kiln_graph_t *g,
			   const char *iopath, bool bench, FILE *out)
{
	char err[512] = "";
	kiln_td_io_t io;
	memset(&io, 0, sizeof(io));
	int rc = kiln_td_io_load(iopath, &io, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", iopath, err);
		kiln_artifact_free(a);
		return 1;
	}
	int st = run_io(a, g, &io, iopath, bench, out);
	kiln_td_io_free(&io);
	return st;
}

static int run_io(kiln_artifact_t *a, const kiln_graph_t *g, kiln_td_io_t *iop,
		  const char *iopath, bool bench, FILE *out)
{
	char err[512] = "";
	int rc;
	kiln_td_io_t io = *iop;
	kiln_tensor_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	rc = kiln_td_make_inputs(g, &io, in, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", iopath, err);
		free(in);
		kiln_td_io_free(&io);
		kiln_artifact_free(a);
		return 1;
	}
	kiln_module_t *m = NULL;
	rc = kiln_module_from_artifact(a, &m, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: loading the artifact: %s\n", err);
		kiln_td_inputs_free(in, g->n_inputs);
		free(in);
		kiln_td_io_free(&io);
		return 1;
	}
	kiln_io_t *args = calloc(g->n_inputs + 1, sizeof(*args));
	for (uint32_t i = 0; i < g->n_inputs; i++) {
		if (g->values[i].kind == KILN_VAL_SYMINT) {
			args[i].kind = KILN_IO_INT;
			args[i].i = *(const int64_t *)in[i].data;
		} else {
			args[i].kind = KILN_IO_TENSOR;
			args[i].t = in[i];
		}
	}
	uint32_t nob = kiln_module_n_out_buffers(m);
	uint32_t nout = kiln_module_n_outputs(m);
	void **bufs = calloc(nob + 1, sizeof(void *));
	kiln_io_t *outs = calloc(nout + 1, sizeof(*outs));
	kiln_run_opts_t ro = {.fallback = kiln_interp_fallback};
	int status = 0;
	rc = kiln_module_run(m, args, g->n_inputs, bufs, outs, &ro, err,
			     sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: run: %s\n", err);
		status = 1;
	}
	for (uint32_t i = 0; rc == 0 && i < nout && i < io.n_outputs; i++) {
		kiln_td_value_t *w = &io.outputs[i];
		if (outs[i].kind == KILN_IO_INT || w->is_int) {
			bool ok = outs[i].kind == KILN_IO_INT && w->is_int &&
				  outs[i].i == w->ival;
			fprintf(out, "output %u: int %lld %s\n", i,
				(long long)outs[i].i, ok ? "ok" : "MISMATCH");
			status |= !ok;
			continue;
		}
		double rtol, atol;
		kiln_td_tolerance(w->t.dtype, &rtol, &atol);
		if (io.rtol > rtol)
			rtol = io.rtol;
		if (io.atol > atol)
			atol = io.atol;
		kiln_td_cmp_t cr;
		bool ok = kiln_td_compare(&outs[i].t, &w->t, rtol, atol, &cr);
		fprintf(out, "output %u: %s %s\n", i, ok ? "ok  " : "FAIL",
			cr.msg);
		status |= !ok;
	}
	if (rc == 0 && io.n_outputs != nout) {
		fprintf(out, "output count: artifact %u, io file %u\n", nout,
			io.n_outputs);
		status = 1;
	}
	if (bench && rc == 0) {
		/* each of the 21 samples repeats the run until it lasts about
		 * a millisecond (a graph of microseconds is timed over many
		 * calls, not at the clock's resolution) */
		double t0 = now_ms();
		kiln_module_run(m, args, g->n_inputs, bufs, outs, &ro, err,
				sizeof(err));
		double first = now_ms() - t0;
		int inner = first >= 1.0   ? 1
			    : first < 1e-5 ? 100000
					   : (int)(1.0 / first) + 1;
		if (inner > 100000)
			inner = 100000;
		double t[21];
		for (int r = 0; r < 21; r++) {
			t0 = now_ms();
			for (int i = 0; i < inner; i++)
				kiln_module_run(m, args, g->n_inputs, bufs,
						outs, &ro, err, sizeof(err));
			t[r] = (now_ms() - t0) / inner;
		}
		qsort(t, 21, sizeof(double), cmp_double);
		fprintf(out,
			"run: median %.4f ms (min %.4f) over 21 samples of %d "
			"run%s\n",
			t[10], t[0], inner, inner == 1 ? "" : "s");
	}
	if (g_profile && rc == 0)
		profile_run(m, a, args, g->n_inputs, bufs, outs, out);
	for (uint32_t i = 0; i < nob; i++)
		free(bufs[i]);
	free(bufs);
	free(outs);
	free(args);
	kiln_module_free(m);
	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
	return status;
}

/* Every case of an op-case file: compile, run, compare with torch. */
static int run_cases(kiln_compiler_t *kc, const char *path, FILE *out)
{
	char err[1024] = "";
	kiln_td_cases_t cs;
	memset(&cs, 0, sizeof(cs));
	int rc = kiln_td_cases_load(path, &cs, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", path, err);
		return 1;
	}
	int status = 0;
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	strcpy(opts.mode, "default");
	for (uint32_t i = 0; i < cs.n; i++) {
		kiln_td_case_t *tc = &cs.cases[i];
		kiln_artifact_t *a = NULL;
		kiln_compile_stats_t st;
		rc = kiln_compile(kc, tc->graph, &opts, &a, &st, err,
				  sizeof(err));
		if (rc != 0) {
			fprintf(out, "case %s: compile: %s: %s\n", tc->name,
				kiln_err_wire_name(rc), err);
			status = 1;
			continue;
		}
		fprintf(out, "case %s: %u kernels, %u fallbacks\n", tc->name,
			st.n_kernels, st.n_fallbacks);
		status |= run_io(a, tc->graph, &tc->io, tc->name, false, out);
	}
	kiln_td_cases_free(&cs);
	return status;
}

static int interp_and_compare(const kiln_graph_t *g, const char *iopath,
			      FILE *out)
{
	char err[512] = "";
	kiln_td_io_t io;
	memset(&io, 0, sizeof(io));
	int rc = kiln_td_io_load(iopath, &io, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", iopath, err);
		return 1;
	}
	kiln_tensor_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	kiln_tensor_t *res = calloc(g->n_outputs + 1, sizeof(*res));
	int status = 0;
	rc = kiln_td_make_inputs(g, &io, in, err, sizeof(err));
	if (rc == 0) {
		rc = kiln_interp_run(g, in, res, err, sizeof(err));
		kiln_td_inputs_free(in, g->n_inputs);
	}
	if (rc != 0) {
		fprintf(stderr, "kilnc: interp: %s: %s\n",
			kiln_err_wire_name(rc), err);
		status = 1;
	}
	for (uint32_t i = 0; rc == 0 && i < g->n_outputs && i < io.n_outputs;
	     i++) {
		kiln_td_value_t *w = &io.outputs[i];
		if (w->is_int) {
			bool ok = *(const int64_t *)res[i].data == w->ival;
			fprintf(out, "output %u: int %s\n", i,
				ok ? "ok" : "MISMATCH");
			status |= !ok;
		} else {
			double rtol, atol;
			kiln_td_tolerance(w->t.dtype, &rtol, &atol);
			if (io.rtol > rtol)
				rtol = io.rtol;
			if (io.atol > atol)
				atol = io.atol;
			kiln_td_cmp_t cr;
			bool ok =
			    kiln_td_compare(&res[i], &w->t, rtol, atol, &cr);
			fprintf(out, "output %u: %s %s\n", i,
				ok ? "ok  " : "FAIL", cr.msg);
			status |= !ok;
		}
		free(res[i].data);
	}
	free(in);
	free(res);
	kiln_td_io_free(&io);
	return status;
}

int main(int argc, char **argv)
{
	const char *path = NULL, *outpath = NULL, *emit = "summary";
	const char *runio = NULL, *interpio = NULL;
	const char *fingerprint = NULL;
	bool want_sig = false, structure = false, bench = false;
	kiln_target_t target;
	kiln_compile_opts_t opts;
	memset(&target, 0, sizeof(target));
	memset(&opts, 0, sizeof(opts));
	strcpy(target.backend, "cpu");
	strcpy(opts.mode, "default");

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 0;
		} else if (strncmp(a, "--emit=", 7) == 0) {
			emit = a + 7;
			static const char *const ok[] = {
			    "summary",	"graph", "ir",	"kernels",
			    "llvm-raw", "llvm",	 "asm", "artifact"};
			bool found = false;
			for (size_t k = 0; k < 8; k++)
				found = found || strcmp(emit, ok[k]) == 0;
			if (!found) {
				fprintf(stderr, "kilnc: unknown --emit=%s\n",
					emit);
				return 2;
			}
		} else if (strcmp(a, "--signature") == 0) {
			want_sig = true;
		} else if (strcmp(a, "--structure") == 0) {
			structure = true;
		} else if (strcmp(a, "--bench") == 0) {
			bench = true;
		} else if (strcmp(a, "--profile") == 0) {
			g_profile = true;
		} else if (strncmp(a, "--profile=", 10) == 0) {
			const char *v = a + 10;
			char *end = NULL;
			unsigned long k = strtoul(v, &end, 10);
			if (strcmp(v, "all") == 0) {
				k = 0;
			} else if (*v < '1' || *v > '9' || *end != '\0' ||
				   k > UINT32_MAX) {
				fprintf(stderr,
					"kilnc: --profile=%s: want a number "
					"of rows (1 or more) or all\n",
					v);
				return 2;
			}
			g_profile = true;
			g_profile_rows = (uint32_t)k;
		} else if (strcmp(a, "--run") == 0 && i + 1 < argc) {
			runio = argv[++i];
		} else if (strcmp(a, "--interp") == 0 && i + 1 < argc) {
			interpio = argv[++i];
		} else if (strncmp(a, "--target=", 9) == 0) {
			const char *t = a + 9;
			if (strcmp(t, "cpu") == 0) {
				strcpy(target.backend, "cpu");
			} else if (strncmp(t, "cuda:", 5) == 0 &&
				   strlen(t + 5) < sizeof(target.arch)) {
				strcpy(target.backend, "cuda");
				strcpy(target.arch, t + 5);
			} else {
				fprintf(stderr, "kilnc: bad --target %s\n", t);
				return 2;
			}
		} else if (strncmp(a, "--mode=", 7) == 0) {
			const char *m = a + 7;
			if (strcmp(m, "default") != 0 &&
			    strcmp(m, "reduce-overhead") != 0 &&
			    strcmp(m, "max-autotune") != 0) {
				fprintf(stderr, "kilnc: bad --mode %s\n", m);
				return 2;
			}
			snprintf(opts.mode, sizeof(opts.mode), "%s", m);
		} else if (strncmp(a, "--fingerprint=", 14) == 0) {
			fingerprint = a + 14;
		} else if (strcmp(a, "-o") == 0 && i + 1 < argc) {
			outpath = argv[++i];
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "kilnc: unknown option %s\n", a);
			usage(stderr);
			return 2;
		} else if (path == NULL) {
			path = a;
		} else {
			fprintf(stderr, "kilnc: more than one GRAPH given\n");
			return 2;
		}
	}
	if (g_profile && runio == NULL) {
		fprintf(stderr, "kilnc: --profile needs --run IO (it times "
				"the run's plan steps)\n");
		return 2;
	}
	if (path != NULL && strstr(path, ".cases.msgpack") != NULL) {
		char err[512];
		kiln_compiler_t *kc = NULL;
		if (kiln_compiler_new(&target, &kc, err, sizeof(err)) != 0) {
			fprintf(stderr, "kilnc: %s\n", err);
			return 1;
		}
		int st = run_cases(kc, path, stdout);
		kiln_compiler_free(kc);
		return st;
	}
	if (path == NULL) {
		usage(stderr);
		return 2;
	}

	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = strcmp(path, "-") == 0
		     ? kiln_td_read_file("/dev/stdin", &buf, &len)
		     : kiln_td_read_file(path, &buf, &len);
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", path, kiln_strerror(rc));
		return 1;
	}
	char err[1024] = "";
	kiln_graph_t *g = NULL;
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	rc = kiln_graph_decode(buf, len, &lim, &g, err, sizeof(err));
	free(buf);
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s: %s\n", path,
			kiln_err_wire_name(rc),
			err[0] ? err : kiln_strerror(rc));
		return 1;
	}
	FILE *out = stdout;
	if (outpath != NULL && (out = fopen(outpath, "wb")) == NULL) {
		fprintf(stderr, "kilnc: %s: %s\n", outpath, strerror(errno));
		kiln_graph_free(g);
		return 1;
	}
	int status = 0;
	if (interpio != NULL) {
		status = interp_and_compare(g, interpio, out);
		goto finish;
	}
	bool need_compiler = want_sig ? fingerprint == NULL
				      : strcmp(emit, "summary") != 0 &&
					    strcmp(emit, "graph") != 0;
	need_compiler = need_compiler || runio != NULL || bench;
	kiln_compiler_t *kc = NULL;
	if (need_compiler) {
		rc = kiln_compiler_new(&target, &kc, err, sizeof(err));
		if (rc != 0) {
			fprintf(stderr, "kilnc: %s\n", err);
			status = 1;
			goto finish;
		}
	}
	const kiln_target_t *rt = kc ? kiln_compiler_target(kc) : &target;
	const char *fp = fingerprint ? fingerprint
			 : kc	     ? kiln_compiler_fingerprint(kc)
				     : "kiln/" KILN_VERSION_STRING;
	if (want_sig) {
		uint8_t sig[KILN_SIG_BYTES];
		char hex[KILN_SIG_HEX];
		rc = kiln_signature(g, rt, &opts, fp, structure, sig);
		if (rc == 0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "%s\n", hex);
		}
		status = rc != 0;
	} else if (strcmp(emit, "graph") == 0) {
		msgpack_sbuffer sb;
		msgpack_sbuffer_init(&sb);
		msgpack_packer pk;
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		rc = kiln_graph_pack(g, &pk);
		if (rc == 0 && fwrite(sb.data, 1, sb.size, out) != sb.size)
			rc = -EIO;
		msgpack_sbuffer_destroy(&sb);
		status = rc != 0;
	} else if (strcmp(emit, "summary") == 0 && runio == NULL && !bench) {
		summary(out, g);
		uint8_t sig[KILN_SIG_BYTES];
		char hex[KILN_SIG_HEX];
		if (kiln_signature(g, rt, &opts, fp, false, sig) == 0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "signature %s\n", hex);
		}
		if (kiln_signature(g, rt, &opts, fp, true, sig) == 0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "structure %s\n", hex);
		}
	} else if (strcmp(emit, "artifact") == 0 && runio == NULL) {
		kiln_artifact_t *a = NULL;
		rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
		if (rc == 0) {
			msgpack_sbuffer sb;
			msgpack_sbuffer_init(&sb);
			msgpack_packer pk;
			msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
			rc = kiln_artifact_pack(a, &pk);
			if (rc == 0 &&
			    fwrite(sb.data, 1, sb.size, out) != sb.size)
				rc = -EIO;
			msgpack_sbuffer_destroy(&sb);
			kiln_artifact_free(a);
		}
		status = rc != 0;
	} else if (runio == NULL && !bench) {
		int what = strcmp(emit, "ir") == 0	   ? KILN_EMIT_IR
			   : strcmp(emit, "kernels") == 0  ? KILN_EMIT_KERNELS
			   : strcmp(emit, "llvm-raw") == 0 ? KILN_EMIT_LLVM_RAW
			   : strcmp(emit, "llvm") == 0	   ? KILN_EMIT_LLVM
							   : KILN_EMIT_ASM;
		char *text = NULL;
		rc = kiln_compile_ex(kc, g, &opts, NULL, &text, what, NULL, err,
				     sizeof(err));
		if (rc == 0 && text != NULL)
			fputs(text, out);
		free(text);
		status = rc != 0;
	} else {
		kiln_compile_stats_t st;
		kiln_artifact_t *a = NULL;
		double times[5];
		int reps = bench ? 5 : 1;
		for (int r = 0; r < reps && rc == 0; r++) {
			if (a != NULL)
				kiln_artifact_free(a);
			a = NULL;
			rc = kiln_compile(kc, g, &opts, &a, &st, err,
					  sizeof(err));
			times[r] = st.total_ms;
		}
		if (rc == 0 && bench) {
			qsort(times, (size_t)reps, sizeof(double), cmp_double);
			fprintf(out,
				"compile: median %.1f ms over %d (lower %.1f, "
				"sched %.1f, codegen %.1f, O3 %.1f, emit %.1f, "
				"link %.1f); %u kernels (+%u epilogues), %u "
				"fallback steps, %u bodies shared; %.2f ms per "
				"kernel\n",
				times[reps / 2], reps, st.lower_ms, st.sched_ms,
				st.codegen_ms, st.opt_ms, st.emit_ms,
				st.link_ms, st.n_kernels, st.n_epilogues,
				st.n_fallbacks, st.n_shared,
				st.n_kernels + st.n_epilogues
				    ? times[reps / 2] /
					  (st.n_kernels + st.n_epilogues)
				    : 0.0);
		}
		if (rc == 0 && runio != NULL) {
			status = run_and_compare(a, g, runio, bench, out);
			a = NULL;
		} else {
			kiln_artifact_free(a);
		}
		status |= rc != 0;
	}
	if (rc != 0)
		fprintf(stderr, "kilnc: %s: %s\n", kiln_err_wire_name(rc),
			err[0] ? err : kiln_strerror(rc));
	kiln_compiler_free(kc);
finish:
	kiln_graph_free(g);
	if (out != stdout && fclose(out) != 0)
		status = 1;
	return status;
}
