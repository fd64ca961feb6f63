/*
 * kilnc.c — the compiler without the daemon, for people and tests.
 *
 * Today it is the front end only: read a Graph v1 file, decode and validate
 * it, print a summary, re-encode it, or print its signature. The compiler
 * pipeline (--emit=ir|kernels|llvm|asm|artifact, --run, --interp, --bench)
 * joins it with the compiler-core issue.
 *
 * Exit codes: 0 success; 1 the input is invalid or unreadable; 2 usage.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: kilnc GRAPH [options]\n"
	    "  GRAPH               a Graph v1 file (msgpack), or - for stdin\n"
	    "  --emit=summary      print a summary of the graph (default)\n"
	    "  --emit=graph        re-encode the validated graph as msgpack\n"
	    "  --signature         print the signature (64 hex chars)\n"
	    "  --structure         with --signature: the structure hash\n"
	    "  --target=T          cpu (default) or cuda:sm_NN\n"
	    "  --mode=M            default | reduce-overhead | max-autotune\n"
	    "  --fingerprint=S     compiler fingerprint (default kiln/%s)\n"
	    "  -o FILE             write output to FILE instead of stdout\n"
	    "  -h, --help          this text\n",
	    KILN_VERSION_STRING);
}

static int read_all(const char *path, uint8_t **out, size_t *len)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (f == NULL)
		return -errno;
	size_t cap = 1 << 16, n = 0;
	uint8_t *buf = malloc(cap);
	while (buf != NULL) {
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (n < cap)
			break;
		if (cap > ((size_t)1 << 31)) {
			free(buf);
			buf = NULL;
			break;
		}
		uint8_t *nb = realloc(buf, cap * 2);
		if (nb == NULL) {
			free(buf);
			buf = NULL;
		}
		buf = nb;
		cap *= 2;
	}
	int rc = ferror(f) ? -EIO : 0;
	if (f != stdin)
		fclose(f);
	if (buf == NULL)
		return -ENOMEM;
	if (rc != 0) {
		free(buf);
		return rc;
	}
	*out = buf;
	*len = n;
	return 0;
}

static int write_out(FILE *out, const void *p, size_t n)
{
	return fwrite(p, 1, n, out) == n ? 0 : -EIO;
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
	/* op histogram, in order of first appearance */
	const char **ops = calloc(g->n_nodes + 1, sizeof(*ops));
	uint32_t *cnt = calloc(g->n_nodes + 1, sizeof(*cnt));
	uint32_t n_ops = 0;
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
	for (uint32_t k = 0; k < n_ops; k++)
		fprintf(out, "  %5u  %s\n", cnt[k], ops[k]);
	free(ops);
	free(cnt);
}

int main(int argc, char **argv)
{
	const char *path = NULL, *outpath = NULL, *emit = "summary";
	const char *fingerprint = "kiln/" KILN_VERSION_STRING;
	bool want_sig = false, structure = false;
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
			if (strcmp(emit, "summary") != 0 &&
			    strcmp(emit, "graph") != 0) {
				fprintf(stderr,
					"kilnc: --emit=%s is not available "
					"yet (summary, graph)\n",
					emit);
				return 2;
			}
		} else if (strcmp(a, "--signature") == 0) {
			want_sig = true;
		} else if (strcmp(a, "--structure") == 0) {
			structure = true;
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
	if (path == NULL) {
		usage(stderr);
		return 2;
	}

	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = read_all(path, &buf, &len);
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s: %s\n", path, kiln_strerror(rc));
		return 1;
	}
	char err[512] = "";
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
	if (want_sig) {
		uint8_t sig[KILN_SIG_BYTES];
		char hex[KILN_SIG_HEX];
		rc = kiln_signature(g, &target, &opts, fingerprint, structure,
				    sig);
		if (rc == 0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "%s\n", hex);
		}
	} else if (strcmp(emit, "graph") == 0) {
		msgpack_sbuffer sb;
		msgpack_sbuffer_init(&sb);
		msgpack_packer pk;
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		rc = kiln_graph_pack(g, &pk);
		if (rc == 0)
			rc = write_out(out, sb.data, sb.size);
		msgpack_sbuffer_destroy(&sb);
	} else {
		summary(out, g);
		uint8_t sig[KILN_SIG_BYTES];
		char hex[KILN_SIG_HEX];
		if (kiln_signature(g, &target, &opts, fingerprint, false,
				   sig) == 0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "signature %s\n", hex);
		}
		if (kiln_signature(g, &target, &opts, fingerprint, true, sig) ==
		    0) {
			kiln_sig_to_hex(sig, hex);
			fprintf(out, "structure %s\n", hex);
		}
	}
	kiln_graph_free(g);
	if (out != stdout && fclose(out) != 0 && rc == 0)
		rc = -errno;
	if (rc != 0) {
		fprintf(stderr, "kilnc: %s\n", kiln_strerror(rc));
		return 1;
	}
	return 0;
}
