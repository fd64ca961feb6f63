/*
 * example.c — compile a Graph v1 file with kilnd through libkiln and print
 * where the artifact came from (clients/libkiln/README.md).
 *
 *   cc example.c $(pkg-config --cflags --libs kiln) -o kiln-example
 *   ./kiln-example model.graph.msgpack
 *
 * The socket is found as kilnd finds it ($KILN_SOCKET, ...); a per-user
 * kilnd is started when none answers, unless $KILN_AUTOSTART is 0.
 */
#include <kiln/kiln.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s GRAPH.msgpack\n", argv[0]);
		return 2;
	}
	kiln_client_opts_t o;
	kiln_client_opts_init(&o);
	kiln_client_t *c;
	char err[512];
	int rc = kiln_client_connect(&o, &c, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "connect: %s\n", err);
		return 1;
	}
	kiln_result_t r;
	rc = kiln_client_compile_file(c, argv[1], NULL, NULL, -1, NULL, &r, err,
				      sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "compile: %s: %s\n", kiln_err_wire_name(rc),
			err);
		kiln_client_free(c);
		return 1;
	}
	printf("source %s\nsignature %s\nsize %zu\n", r.source, r.signature,
	       r.artifact_len);
	kiln_result_free(&r);
	kiln_client_free(c);
	return 0;
}
