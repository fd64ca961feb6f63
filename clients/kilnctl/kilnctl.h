/*
 * kilnctl.h — what the files of kilnctl share (kilnctl.c: main, the
 * connection and the admin commands; status.c: status and its --watch;
 * artifacts.c: compile and verify; util.c: parsing, formatting, JSON).
 *
 * Exit statuses (kilnctl(1)):
 *
 *   0  success
 *   1  kilnd answered with an error (or a local failure; verify: corrupt
 *      blobs found)
 *   2  usage: an unknown command or option, a malformed value
 *   3  kilnd is not running or cannot be reached (no socket, nothing
 *      listening, no answer within --timeout, shutting down)
 *   4  permission denied (the socket, an admin op, a file)
 *   5  not found (a signature evict names, a file compile names, a store)
 */
#ifndef KILN_KILNCTL_H
#define KILN_KILNCTL_H

#include "clients/libkiln/kiln.h"
#include "protocol/protocol.h"

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum {
	EX_OK = 0,
	EX_ERROR = 1,
	EX_USAGE = 2,
	EX_DOWN = 3,
	EX_PERM = 4,
	EX_NOTFOUND = 5,
};

#define SYSTEM_SOCKET	   "/run/kiln/kilnd.sock"
#define DEFAULT_TIMEOUT_S  60.0
#define COMPILE_TIMEOUT_S  600.0
#define CONNECT_TIMEOUT_MS 5000
#define BAR_WIDTH	   20

/* The run's context: options and the connection (NULL until needed). */
typedef struct ctl {
	const char *socket; /* --socket, else discovered into sockbuf */
	char sockbuf[PATH_MAX];
	bool socket_given;
	double timeout_s; /* --timeout; < 0: the command's default */
	kiln_client_t *c;
	int connect_ms, call_ms; /* the timeouts c was connected with */
	kiln_limits_t lim;
	const char *what; /* the request in messages; NULL: the op's name */
	char err[1024];
} ctl_t;

/* A decoded reply: the response map, pointing into bytes and zone. */
typedef struct reply {
	uint8_t *bytes;
	msgpack_zone zone;
	bool has_zone;
	msgpack_object map;
} reply_t;

/* Set by SIGINT / SIGTERM during status --watch (status.c). */
extern volatile sig_atomic_t ctl_interrupted;

/* ---- kilnctl.c: talking to kilnd --------------------------------------- */

/* Connects unless connected (auto-start off). Returns an exit status, with
 * the reason on stderr when it is not EX_OK. */
int ctl_connect(ctl_t *x, double dflt_timeout_s);
void ctl_disconnect(ctl_t *x);
/* The exit status of a failed request `what`, its line on stderr. */
int ctl_call_failed(ctl_t *x, const char *what, int rc);
/* One request with the fields in sb (NULL: none); r->map is the reply map
 * (ctl_reply_free). Returns an exit status. */
int ctl_call(ctl_t *x, kiln_op_t op, const msgpack_sbuffer *sb, reply_t *r,
	     double dflt_timeout_s);
void ctl_reply_free(reply_t *r);
void ctl_fields_init(msgpack_sbuffer *sb, msgpack_packer *pk);
void ctl_pack_kbool(msgpack_packer *pk, const char *k, bool v);

/* ---- the commands ------------------------------------------------------- */

int cmd_status(ctl_t *x, int argc, char **argv);  /* status.c */
int cmd_compile(ctl_t *x, int argc, char **argv); /* artifacts.c */
int cmd_verify(ctl_t *x, int argc, char **argv);  /* artifacts.c */
/* The settings map as a two-column table (status.c). */
void ctl_print_settings(const msgpack_object *set);

/* ---- util.c ------------------------------------------------------------- */

/* "kilnctl: ..." on stderr, one line. */
void ctl_errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same with "(kilnctl --help)"; returns EX_USAGE. */
int ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * If argv[*i] is the option `name` ("--limit"): its value is the text after
 * '=' or the next argument (consumed). Returns 1 (found, *val set), 0 (not
 * this option), -1 (found, value missing: a usage error was printed).
 */
int ctl_opt_value(int argc, char **argv, int *i, const char *name,
		  const char **val);
bool ctl_parse_u64(const char *s, uint64_t *out);
bool ctl_parse_seconds(const char *s, double *out); /* > 0, <= a year */
/* "90", "45s", "30m", "2h", "7d", "1w", "1h30m" -> seconds. */
bool ctl_parse_duration(const char *s, uint64_t *out);
/* "1048576", "500M", "1.5G", "64MiB", "2T" -> bytes (powers of 1024). */
bool ctl_parse_size(const char *s, uint64_t *out);

const char *ctl_fmt_bytes(uint64_t b, char *buf, size_t n);	/* 12.3 KiB */
const char *ctl_fmt_duration(double s, char *buf, size_t n);	/* 3h 02m */
const char *ctl_fmt_ms(double ms, char *buf, size_t n);		/* 41.7 ms */
const char *ctl_fmt_time(uint64_t unix_s, char *buf, size_t n); /* local */

/* o as JSON; indent < 0: on one line. */
void ctl_json_write(FILE *f, const msgpack_object *o, int indent);
/* A reply map without its envelope (v, id, ok) as JSON, and a newline. */
void ctl_json_reply(FILE *f, const msgpack_object *map, bool one_line);

/* The object at a dotted path ("connections.current"), or NULL. */
const msgpack_object *ctl_mget(const msgpack_object *m, const char *path);
double ctl_num(const msgpack_object *m, const char *path);   /* 0: absent */
uint64_t ctl_u64(const msgpack_object *m, const char *path); /* 0: absent */
/* A str field into buf, "" when absent. */
const char *ctl_str(const msgpack_object *m, const char *path, char *buf,
		    size_t n);
/* one or other, as n says. */
const char *ctl_plural(uint64_t n, const char *one, const char *other);
/* lstat succeeds (else *err = errno). */
bool ctl_exists(const char *path, int *err);

#endif /* KILN_KILNCTL_H */
