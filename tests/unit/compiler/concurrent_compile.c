/*
 * concurrent_compile.c — two threads compile different corpus graphs at the
 * same time, each with its own compiler (LLVMContext, TargetMachine), then
 * load and run the artifacts and check them against torch's outputs. Then
 * both load and free their artifacts LOADS times at once: their memfds take
 * each other's fd numbers, so one thread's NOLOAD probe (runtime.c
 * load_code) finds the other's live module as the other loads and frees
 * (a race ThreadSanitizer reported inside glibc's loader, where kiln had
 * no lock of its own around its dlopen and dlclose calls).
 *
 * A plain program (no Criterion) so that it also runs under ThreadSanitizer
 * (-Db_sanitize=thread) and Helgrind, which Criterion's process model does
 * not support. Exit 0 when every result matches; prints one line per thread.
 *
 *   concurrent_compile DATA_DIR [ROUNDS]
 */
#include "clients/libkiln/kiln.h"
#include "compiler/compiler.h"
#include "protocol/protocol.h"
#include "tests/common/testdata.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
	char graph[1024], io[1024];
	int rounds, failures;
	char msg[1024];
} job_t;

enum { LOADS = 2000 };
static pthread_barrier_t loads_start;

/* Compiles g once more and loads and frees the artifact LOADS times, from
 * its bytes, once every thread is ready to. */
static int load_loop(kiln_compiler_t *kc, const kiln_graph_t *g, char *msg,
		     size_t msglen)
{
	char err[1024] = "";
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int bad = 0;
	if (kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err)) != 0) {
		snprintf(msg, msglen, "compile: %s", err);
		bad = 1;
	} else {
		msgpack_packer pk;
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		if (kiln_artifact_pack(a, &pk) != 0) {
			snprintf(msg, msglen, "packing the artifact failed");
			bad = 1;
		}
		kiln_artifact_free(a);
	}
	pthread_barrier_wait(&loads_start);
	for (int i = 0; !bad && i < LOADS; i++) {
		kiln_module_t *m = NULL;
		if (kiln_module_load((const uint8_t *)sb.data, sb.size, NULL,
				     &m, err, sizeof(err)) != 0) {
			snprintf(msg, msglen, "load %d: %s", i, err);
			bad = 1;
		}
		kiln_module_free(m);
	}
	msgpack_sbuffer_destroy(&sb);
	return bad;
}

static int run_once(kiln_compiler_t *kc, const kiln_graph_t *g,
		    kiln_td_io_t *io, char *msg, size_t msglen)
{
	char err[1024] = "";
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	kiln_artifact_t *a = NULL;
	int rc = kiln_compile(kc, g, &opts, &a, NULL, err, sizeof(err));
	if (rc != 0) {
		snprintf(msg, msglen, "compile: %s", err);
		return 1;
	}
	kiln_module_t *m = NULL;
	if (kiln_module_from_artifact(a, &m, err, sizeof(err)) != 0) {
		snprintf(msg, msglen, "load: %s", err);
		return 1;
	}
	kiln_tensor_t *in = calloc(g->n_inputs + 1, sizeof(*in));
	kiln_io_t *args = calloc(g->n_inputs + 1, sizeof(*args));
	int bad = 0;
	if (kiln_td_make_inputs(g, io, in, err, sizeof(err)) != 0) {
		snprintf(msg, msglen, "inputs: %s", err);
		bad = 1;
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
	uint32_t nob = kiln_module_n_out_buffers(m);
	void **bufs = calloc(nob + 1, sizeof(void *));
	kiln_io_t *outs = calloc(kiln_module_n_outputs(m) + 1, sizeof(*outs));
	kiln_run_opts_t ro = {.fallback = kiln_interp_fallback};
	if (kiln_module_run(m, args, g->n_inputs, bufs, outs, &ro, err,
			    sizeof(err)) != 0) {
		snprintf(msg, msglen, "run: %s", err);
		bad = 1;
	}
	for (uint32_t k = 0; !bad && k < io->n_outputs; k++) {
		if (io->outputs[k].is_int)
			continue;
		double rtol, atol;
		kiln_td_tolerance(io->outputs[k].t.dtype, &rtol, &atol);
		if (io->rtol > rtol)
			rtol = io->rtol;
		if (io->atol > atol)
			atol = io->atol;
		kiln_td_cmp_t cr;
		if (!kiln_td_compare(&outs[k].t, &io->outputs[k].t, rtol, atol,
				     &cr)) {
			snprintf(msg, msglen, "output %u: %s", k, cr.msg);
			bad = 1;
		}
	}
	for (uint32_t i = 0; i < nob; i++)
		free(bufs[i]);
	free(bufs);
	free(outs);
out:
	kiln_td_inputs_free(in, g->n_inputs);
	free(in);
	free(args);
	kiln_module_free(m);
	return bad;
}

static void *worker(void *arg)
{
	job_t *j = arg;
	char err[1024];
	kiln_compiler_t *kc = NULL;
	kiln_graph_t *g = NULL;
	kiln_td_io_t io;
	memset(&io, 0, sizeof(io));
	if (kiln_compiler_new(NULL, &kc, err, sizeof(err)) != 0 ||
	    kiln_td_graph_load(j->graph, &g, err, sizeof(err)) != 0 ||
	    kiln_td_io_load(j->io, &io, err, sizeof(err)) != 0) {
		snprintf(j->msg, sizeof(j->msg), "%s", err);
		j->failures++;
	} else {
		for (int r = 0; r < j->rounds; r++)
			j->failures +=
			    run_once(kc, g, &io, j->msg, sizeof(j->msg));
	}
	if (g != NULL && kc != NULL)
		j->failures += load_loop(kc, g, j->msg, sizeof(j->msg));
	else
		pthread_barrier_wait(&loads_start);
	kiln_td_io_free(&io);
	kiln_graph_free(g);
	kiln_compiler_free(kc);
	return NULL;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "tests/data";
	int rounds = argc > 2 ? atoi(argv[2]) : 3;
	static const char *names[2] = {"transformer_layer_fwd", "mlp_bwd"};
	job_t jobs[2];
	pthread_t th[2];
	if (pthread_barrier_init(&loads_start, NULL, 2) != 0)
		return 2;
	for (int i = 0; i < 2; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		snprintf(jobs[i].graph, sizeof(jobs[i].graph),
			 "%s/graphs/%s.graph.msgpack", dir, names[i]);
		snprintf(jobs[i].io, sizeof(jobs[i].io),
			 "%s/graphs/%s.io.msgpack", dir, names[i]);
		jobs[i].rounds = rounds;
		if (pthread_create(&th[i], NULL, worker, &jobs[i]) != 0)
			return 2;
	}
	int bad = 0;
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		printf("%s: %d rounds and %d loads, %d failures%s%s\n",
		       names[i], rounds, LOADS, jobs[i].failures,
		       jobs[i].failures ? ": " : "", jobs[i].msg);
		bad |= jobs[i].failures != 0;
	}
	pthread_barrier_destroy(&loads_start);
	return bad;
}
