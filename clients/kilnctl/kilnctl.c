/*
 * kilnctl.c — kiln's admin command: what an operator types to see whether
 * the node's kilnd is healthy, how full its store is and what it is doing
 * (kilnctl(1), deploy/man/kilnctl.1).
 *
 *   kilnctl [--socket PATH] [--timeout SECONDS] COMMAND [ARGS]
 *
 * Commands: status, list, evict, gc, verify, compile, ping, settings,
 * shutdown, metrics. Every command but verify is one or two requests to kilnd
 * through libkiln's client (clients/libkiln/kiln.h § 4), connected with
 * auto-start off: kilnctl never starts a daemon. verify opens the store
 * directly (cache/cache.h), which kilnd holds locked while it runs.
 *
 * Conventions: results on stdout, errors one line each on stderr prefixed
 * "kilnctl: ", and the exit status says what went wrong (kilnctl.h):
 *
 *   0  success
 *   1  kilnd answered with an error (or a local failure; verify: corrupt
 *      blobs found)
 *   2  usage: an unknown command or option, a malformed value
 *   3  kilnd is not running or cannot be reached (no socket, nothing
 *      listening, no answer within --timeout, shutting down)
 *   4  permission denied (the socket, an admin op, a file)
 *   5  not found (a signature evict names, a file compile names, a store)
 *
 * One thread; the only process-wide state is the SIGINT flag of --watch.
 */
#include "clients/kilnctl/kilnctl.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: kilnctl [--socket PATH] [--timeout SECONDS] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  status [--json] [--watch[=SECONDS]] [--settings]\n"
    "                        uptime, connections, requests and hit rate,\n"
    "                        compiles, queue, workers, store, latency\n"
    "  list [--sort size|last_used|hits|created] [--limit N] [--target T]\n"
    "       [--json]         the store's entries\n"
    "  evict SIG | --older-than DUR | --all [--json]\n"
    "                        remove entries (DUR: 90, 30m, 2h, 7d, 1w)\n"
    "  gc [--max-bytes SIZE] [--json]\n"
    "                        evict least recently used entries down to the\n"
    "                        store's limit (or SIZE: 500M, 2G)\n"
    "  verify [--store DIR]  re-hash every blob of a stopped kilnd's store\n"
    "  compile FILE [--target cpu|cuda:sm_90] [--mode MODE] [--dynamic|\n"
    "       --static] [--batch] [--dump] [-o FILE]\n"
    "                        compile a Graph v1 file (.msgpack) through "
    "kilnd\n"
    "  ping [--count N]      hello and its round-trip time\n"
    "  settings [--json]     every setting of kilnd and its value\n"
    "  shutdown [--no-drain] [--wait]\n"
    "                        stop kilnd (after running compiles, unless\n"
    "                        --no-drain)\n"
    "  metrics               the status counters in Prometheus text format\n"
    "\n"
    "options:\n"
    "  --socket PATH         kilnd's socket (default: $KILN_SOCKET, else\n"
    "                        /run/kiln/kilnd.sock for root, else\n"
    "                        $XDG_RUNTIME_DIR/kiln/kilnd.sock or\n"
    "                        /tmp/kiln-UID/kilnd.sock, else the system one)\n"
    "  --timeout SECONDS     per request (default 60; compile 600)\n"
    "  -h, --help            this text\n"
    "  -V, --version         kilnctl's version\n"
    "\n"
    "exit status: 0 ok, 1 error reply from kilnd, 2 usage, 3 kilnd not\n"
    "running or not reachable, 4 permission denied, 5 not found.\n"
    "kilnctl never starts kilnd. See kilnctl(1).\n";

/* ======================================================================== */
/* Talking to kilnd                                                          */
/* ======================================================================== */

/*
 * The socket as libkiln finds it ($KILN_SOCKET; /run/kiln/kilnd.sock for
 * root; $XDG_RUNTIME_DIR/kiln/kilnd.sock; /tmp/kiln-<uid>/kilnd.sock),
 * except that an operator without a per-user kilnd gets the system one when
 * it exists.
 */
static void discover_socket(ctl_t *x)
{
	kiln_default_socket(x->sockbuf, sizeof(x->sockbuf));
	const char *env = getenv("KILN_SOCKET");
	if ((env != NULL && env[0] != '\0') || geteuid() == 0)
		return;
	int e = 0, se = 0;
	if (!ctl_exists(x->sockbuf, &e) && e == ENOENT &&
	    (ctl_exists(SYSTEM_SOCKET, &se) || se == EACCES))
		snprintf(x->sockbuf, sizeof(x->sockbuf), "%s", SYSTEM_SOCKET);
}

static int timeout_ms(const ctl_t *x, double dflt)
{
	double s = x->timeout_s > 0 ? x->timeout_s : dflt;
	double ms = s * 1000;
	return ms > INT_MAX ? INT_MAX : ms < 1 ? 1 : (int)ms;
}

/* Why a connect failed, as one line and an exit status. */
static int connect_failed(const ctl_t *x, int rc)
{
	switch (rc) {
	case -ENOENT:
		ctl_errmsg("kilnd is not running (no socket at %s)", x->socket);
		return EX_DOWN;
	case -ECONNREFUSED:
		ctl_errmsg("kilnd is not running (nothing listens on %s)",
			   x->socket);
		return EX_DOWN;
	case -EACCES:
	case -EPERM:
		ctl_errmsg(
		    "permission denied: cannot connect to %s (kilnd's "
		    "socket is for its user and group; ask to join it, or "
		    "use sudo)",
		    x->socket);
		return EX_PERM;
	case KILN_ETIMEOUT:
		ctl_errmsg("kilnd at %s did not answer within %g s", x->socket,
			   x->connect_ms / 1000.0);
		return EX_DOWN;
	case -ENOMEM: ctl_errmsg("out of memory"); return EX_ERROR;
	default:
		ctl_errmsg("cannot reach kilnd at %s: %s", x->socket,
			   x->err[0] != '\0' ? x->err : kiln_strerror(rc));
		return EX_DOWN;
	}
}

int ctl_connect(ctl_t *x, double dflt_timeout_s)
{
	if (x->c != NULL)
		return EX_OK;
	kiln_client_opts_t o;
	kiln_client_opts_init(&o);
	o.socket = x->socket;
	o.autostart = 0; /* kilnctl never starts a daemon */
	o.timeout_ms = x->call_ms = timeout_ms(x, dflt_timeout_s);
	o.connect_timeout_ms = x->connect_ms =
	    x->timeout_s > 0 ? timeout_ms(x, 0) : CONNECT_TIMEOUT_MS;
	o.cache_disable = true;
	x->err[0] = '\0';
	int rc = kiln_client_connect(&o, &x->c, x->err, sizeof(x->err));
	if (rc < 0) {
		x->c = NULL;
		return connect_failed(x, rc);
	}
	return EX_OK;
}

void ctl_disconnect(ctl_t *x)
{
	kiln_client_free(x->c);
	x->c = NULL;
}

static bool is_transport(int rc)
{
	return rc == -EPIPE || rc == -ECONNRESET || rc == -ENOTCONN ||
	       rc == -ECONNABORTED || rc == -ESHUTDOWN || rc == -ENOENT ||
	       rc == -ECONNREFUSED;
}

/*
 * The exit status for a failed request `what` (an op name or a command),
 * with its one line on stderr. A daemon's error reply is 1, or 4 / 5 for
 * permission_denied / not_found; the transport failing is 3.
 */
int ctl_call_failed(ctl_t *x, const char *what, int rc)
{
	const char *msg = x->err[0] != '\0' ? x->err : kiln_strerror(rc);
	if (rc == KILN_EPERM) {
		ctl_errmsg("%s: permission denied: %s", what, msg);
		return EX_PERM;
	}
	if (rc == KILN_ENOTFOUND) {
		ctl_errmsg("%s: %s", what, msg);
		return EX_NOTFOUND;
	}
	if (rc == KILN_ESHUTDOWN) {
		ctl_errmsg("%s: kilnd is shutting down (%s)", what, msg);
		return EX_DOWN;
	}
	if (rc == KILN_ETIMEOUT && strcmp(what, "compile") != 0) {
		ctl_errmsg("%s: kilnd at %s did not answer within %g s", what,
			   x->socket, x->call_ms / 1000.0);
		return EX_DOWN;
	}
	if (is_transport(rc)) {
		ctl_errmsg("%s: lost the connection to kilnd at %s (%s)", what,
			   x->socket, msg);
		return EX_DOWN;
	}
	if (rc <= KILN_EBADFRAME && rc >= KILN_EINTERNAL) /* a wire code */
		ctl_errmsg("%s: %s (%s)", what, msg, kiln_err_wire_name(rc));
	else
		ctl_errmsg("%s: %s", what, msg);
	return EX_ERROR;
}

void ctl_reply_free(reply_t *r)
{
	if (r->has_zone)
		msgpack_zone_destroy(&r->zone);
	free(r->bytes);
	memset(r, 0, sizeof(*r));
}

/*
 * One request: op with the fields packed in sb (NULL: none). On success
 * r->map is the response map (reply_free). Returns an exit status.
 */
int ctl_call(ctl_t *x, kiln_op_t op, const msgpack_sbuffer *sb, reply_t *r,
	     double dflt_timeout_s)
{
	memset(r, 0, sizeof(*r));
	int ex = ctl_connect(x, dflt_timeout_s);
	if (ex != EX_OK)
		return ex;
	size_t len = 0;
	x->err[0] = '\0';
	int rc = kiln_client_call(x->c, op, sb != NULL ? sb->data : NULL,
				  sb != NULL ? sb->size : 0, &r->bytes, &len,
				  x->err, sizeof(x->err));
	if (rc < 0) {
		r->bytes = NULL;
		return ctl_call_failed(x, x->what ? x->what : kiln_op_name(op),
				       rc);
	}
	if (!msgpack_zone_init(&r->zone, 4096)) {
		ctl_reply_free(r);
		ctl_errmsg("out of memory");
		return EX_ERROR;
	}
	r->has_zone = true;
	rc = kiln_msgpack_unpack_map(r->bytes, len, &x->lim, &r->zone, &r->map,
				     x->err, sizeof(x->err));
	if (rc < 0) {
		ctl_reply_free(r);
		ctl_errmsg("%s: malformed reply from kilnd: %s",
			   kiln_op_name(op), x->err);
		return EX_ERROR;
	}
	return EX_OK;
}

/* A field map for a request: sb is initialised; pack into *pk. */
void ctl_fields_init(msgpack_sbuffer *sb, msgpack_packer *pk)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

static void pack_kstr(msgpack_packer *pk, const char *k, const char *v)
{
	kiln_pack_cstr(pk, k);
	kiln_pack_cstr(pk, v);
}

static void pack_ku64(msgpack_packer *pk, const char *k, uint64_t v)
{
	kiln_pack_cstr(pk, k);
	msgpack_pack_uint64(pk, v);
}

void ctl_pack_kbool(msgpack_packer *pk, const char *k, bool v)
{
	kiln_pack_cstr(pk, k);
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

/* ======================================================================== */
/* list, settings, metrics                                                   */
/* ======================================================================== */

static int cmd_list(ctl_t *x, int argc, char **argv)
{
	const char *sort = NULL, *target = NULL, *v;
	uint64_t limit = 100;
	bool json = false;
	for (int i = 1; i < argc; i++) {
		int got;
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if ((got =
				ctl_opt_value(argc, argv, &i, "--sort", &v))) {
			if (got < 0)
				return EX_USAGE;
			if (strcmp(v, "size") && strcmp(v, "last_used") &&
			    strcmp(v, "hits") && strcmp(v, "created"))
				return ctl_usage_error(
				    "list: --sort %s: want "
				    "size, last_used, hits or "
				    "created",
				    v);
			sort = v;
		} else if ((got =
				ctl_opt_value(argc, argv, &i, "--limit", &v))) {
			if (got < 0)
				return EX_USAGE;
			if (!ctl_parse_u64(v, &limit) || limit > 1000000)
				return ctl_usage_error("list: --limit %s: want "
						       "0..1000000 (0: all)",
						       v);
		} else if ((got = ctl_opt_value(argc, argv, &i, "--target",
						&v))) {
			if (got < 0)
				return EX_USAGE;
			target = v;
		} else {
			return ctl_usage_error("list: unknown argument %s",
					       argv[i]);
		}
	}
	if (limit == 0)
		limit = 1000000; /* "all": kilnd's largest */
	msgpack_sbuffer sb;
	msgpack_packer pk;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, 1 + (sort != NULL) + (target != NULL));
	pack_ku64(&pk, "limit", limit);
	if (sort != NULL)
		pack_kstr(&pk, "order", sort);
	if (target != NULL)
		pack_kstr(&pk, "target", target);
	reply_t r;
	int ex = ctl_call(x, KILN_OP_LIST, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	if (json) {
		ctl_json_reply(stdout, &r.map, false);
		ctl_reply_free(&r);
		return EX_OK;
	}
	const msgpack_object *e = kiln_map_get(&r.map, "entries");
	if (e == NULL || e->type != MSGPACK_OBJECT_ARRAY) {
		ctl_reply_free(&r);
		ctl_errmsg("list: the reply has no entries array");
		return EX_ERROR;
	}
	printf("%-64s  %-6s  %10s  %6s  %8s  %-19s  %-19s  %s\n", "SIGNATURE",
	       "TARGET", "SIZE", "HITS", "COMPILE", "CREATED", "LAST USED",
	       "SOURCE");
	uint64_t total = 0;
	for (uint32_t i = 0; i < e->via.array.size; i++) {
		const msgpack_object *m = &e->via.array.ptr[i];
		char sig[80], tgt[64], src[32], sz[32], cms[32], t1[32], t2[32];
		total += ctl_u64(m, "size");
		snprintf(cms, sizeof(cms), "%" PRIu64 " ms",
			 ctl_u64(m, "compile_ms"));
		printf("%-64s  %-6s  %10s  %6" PRIu64
		       "  %8s  %-19s  %-19s  %s\n",
		       ctl_str(m, "signature", sig, sizeof(sig)),
		       ctl_str(m, "target", tgt, sizeof(tgt)),
		       ctl_fmt_bytes(ctl_u64(m, "size"), sz, sizeof(sz)),
		       ctl_u64(m, "hits"), cms,
		       ctl_fmt_time(ctl_u64(m, "created"), t1, sizeof(t1)),
		       ctl_fmt_time(ctl_u64(m, "last_used"), t2, sizeof(t2)),
		       ctl_str(m, "source", src, sizeof(src)));
	}
	char tb[32];
	static const char *const ORDER[][2] = {
	    {"last_used", "least recently used first"},
	    {"size", "largest first"},
	    {"hits", "most hits first"},
	    {"created", "newest first"},
	};
	const char *how = ORDER[0][1];
	for (size_t i = 0; sort != NULL && i < 4; i++)
		if (strcmp(sort, ORDER[i][0]) == 0)
			how = ORDER[i][1];
	printf("%u %s, %s (%s)", e->via.array.size,
	       e->via.array.size == 1 ? "entry" : "entries",
	       ctl_fmt_bytes(total, tb, sizeof(tb)), how);
	if (e->via.array.size >= limit)
		printf("; the first %" PRIu64 " (--limit)", limit);
	putchar('\n');
	ctl_reply_free(&r);
	return EX_OK;
}

static int cmd_settings(ctl_t *x, int argc, char **argv)
{
	bool json = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else
			return ctl_usage_error("settings: unknown argument %s",
					       argv[i]);
	}
	msgpack_sbuffer sb;
	msgpack_packer pk;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, 1);
	ctl_pack_kbool(&pk, "settings", true);
	reply_t r;
	int ex = ctl_call(x, KILN_OP_STATUS, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	const msgpack_object *set = kiln_map_get(&r.map, "settings");
	if (json) {
		fputs("{\n  \"settings\": ", stdout);
		if (set != NULL)
			ctl_json_write(stdout, set, 1);
		else
			fputs("{}", stdout);
		fputs("\n}\n", stdout);
	} else {
		ctl_print_settings(set);
	}
	ctl_reply_free(&r);
	return EX_OK;
}

static int cmd_metrics(ctl_t *x, int argc, char **argv)
{
	if (argc > 1)
		return ctl_usage_error("metrics: unknown argument %s", argv[1]);
	reply_t r;
	int ex = ctl_call(x, KILN_OP_STATUS, NULL, &r, DEFAULT_TIMEOUT_S);
	if (ex != EX_OK)
		return ex;
	const msgpack_object *st = kiln_map_get(&r.map, "stats");
	char *text = NULL;
	size_t len = 0;
	int rc = st != NULL ? kiln_metrics_format(st, &text, &len) : -EINVAL;
	ctl_reply_free(&r);
	if (rc < 0) {
		ctl_errmsg("metrics: cannot format the stats: %s",
			   kiln_strerror(rc));
		return EX_ERROR;
	}
	fwrite(text, 1, len, stdout);
	free(text);
	return EX_OK;
}

/* ======================================================================== */
/* evict, gc, shutdown                                                       */
/* ======================================================================== */

static bool is_sig(const char *s)
{
	if (strlen(s) != 64)
		return false;
	for (const char *p = s; *p != '\0'; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
		      (*p >= 'A' && *p <= 'F')))
			return false;
	return true;
}

static int cmd_evict(ctl_t *x, int argc, char **argv)
{
	const char *sig = NULL, *v;
	uint64_t older = 0;
	bool has_older = false, all = false, json = false;
	int given = 0;
	for (int i = 1; i < argc; i++) {
		int got;
		if (strcmp(argv[i], "--all") == 0) {
			all = true, given++;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if ((got = ctl_opt_value(argc, argv, &i, "--older-than",
						&v))) {
			if (got < 0)
				return EX_USAGE;
			if (!ctl_parse_duration(v, &older))
				return ctl_usage_error(
				    "evict: --older-than %s: "
				    "want a duration (90, 30m, "
				    "2h, 7d, 1w)",
				    v);
			has_older = true, given++;
		} else if (argv[i][0] == '-') {
			return ctl_usage_error("evict: unknown option %s",
					       argv[i]);
		} else {
			if (!is_sig(argv[i]))
				return ctl_usage_error("evict: %s is not a "
						       "signature (64 hex "
						       "characters)",
						       argv[i]);
			sig = argv[i], given++;
		}
	}
	if (given != 1)
		return ctl_usage_error("evict: give exactly one of SIG, "
				       "--older-than DUR, --all");
	char low[65], what[80];
	msgpack_sbuffer sb;
	msgpack_packer pk;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, 1);
	if (sig != NULL) {
		for (int i = 0; i < 64; i++)
			low[i] = (char)(sig[i] >= 'A' && sig[i] <= 'F'
					    ? sig[i] - 'A' + 'a'
					    : sig[i]);
		low[64] = '\0';
		pack_kstr(&pk, "signature", low);
		snprintf(what, sizeof(what), "evict %s", low);
		x->what = what;
	} else if (has_older) {
		pack_ku64(&pk, "older_than_s", older);
	} else {
		ctl_pack_kbool(&pk, "all", all);
	}
	reply_t r;
	int ex = ctl_call(x, KILN_OP_EVICT, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	if (json) {
		ctl_json_reply(stdout, &r.map, false);
	} else {
		char b[32];
		uint64_t n = ctl_u64(&r.map, "evicted");
		printf("evicted %" PRIu64 " %s, %s freed\n", n,
		       n == 1 ? "entry" : "entries",
		       ctl_fmt_bytes(ctl_u64(&r.map, "bytes"), b, sizeof(b)));
	}
	ctl_reply_free(&r);
	return EX_OK;
}

static int cmd_gc(ctl_t *x, int argc, char **argv)
{
	uint64_t max = 0;
	bool has_max = false, json = false;
	const char *v;
	for (int i = 1; i < argc; i++) {
		int got;
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if ((got = ctl_opt_value(argc, argv, &i, "--max-bytes",
						&v))) {
			if (got < 0)
				return EX_USAGE;
			if (!ctl_parse_size(v, &max))
				return ctl_usage_error(
				    "gc: --max-bytes %s: want a "
				    "size (1048576, 500M, 2G)",
				    v);
			has_max = true;
		} else {
			return ctl_usage_error("gc: unknown argument %s",
					       argv[i]);
		}
	}
	msgpack_sbuffer sb;
	msgpack_packer pk;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, has_max ? 1 : 0);
	if (has_max)
		pack_ku64(&pk, "max_bytes", max);
	reply_t r;
	int ex = ctl_call(x, KILN_OP_GC, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	if (json) {
		ctl_json_reply(stdout, &r.map, false);
	} else {
		char a[32], b[32];
		uint64_t n = ctl_u64(&r.map, "evicted"),
			 left = ctl_u64(&r.map, "entries");
		printf("gc: evicted %" PRIu64 " %s, %s freed; the store holds "
		       "%" PRIu64 " %s, %s\n",
		       n, n == 1 ? "entry" : "entries",
		       ctl_fmt_bytes(ctl_u64(&r.map, "bytes"), a, sizeof(a)),
		       left, left == 1 ? "entry" : "entries",
		       ctl_fmt_bytes(ctl_u64(&r.map, "store_bytes"), b,
				     sizeof(b)));
	}
	ctl_reply_free(&r);
	return EX_OK;
}

/* kilnd's pid, from the lock file of its store (the store_dir setting);
 * 0 when it cannot be read. Quiet: only --wait uses it. */
static long kilnd_pid(ctl_t *x)
{
	static const uint8_t FIELDS[] = {0x81, 0xa8, 's', 'e', 't', 't',
					 'i',  'n',  'g', 's', 0xc3};
	uint8_t *body = NULL;
	size_t len = 0;
	long pid = 0;
	if (kiln_client_call(x->c, KILN_OP_STATUS, FIELDS, sizeof(FIELDS),
			     &body, &len, NULL, 0) < 0)
		return 0;
	msgpack_zone zone;
	msgpack_object map;
	char dir[PATH_MAX], path[PATH_MAX + 8], buf[32];
	if (msgpack_zone_init(&zone, 4096)) {
		if (kiln_msgpack_unpack_map(body, len, &x->lim, &zone, &map,
					    NULL, 0) == 0 &&
		    ctl_str(&map, "settings.store_dir", dir, sizeof(dir))[0]) {
			snprintf(path, sizeof(path), "%s/lock", dir);
			FILE *f = fopen(path, "r");
			if (f != NULL && fgets(buf, sizeof(buf), f) != NULL)
				pid = strtol(buf, NULL, 10);
			if (f != NULL)
				fclose(f);
		}
		msgpack_zone_destroy(&zone);
	}
	free(body);
	return pid > 0 ? pid : 0;
}

/* pid runs (a zombie waiting for its parent counts as gone: its files,
 * the store's lock among them, are closed). */
static bool alive(long pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return kill((pid_t)pid, 0) == 0 || errno == EPERM;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
	return p == NULL || (p[1] == ' ' && p[2] != 'Z' && p[2] != 'X');
}

static bool still_answers(const ctl_t *x)
{
	kiln_client_opts_t o;
	kiln_client_opts_init(&o);
	o.socket = x->socket;
	o.autostart = 0;
	o.connect_timeout_ms = 1000;
	o.timeout_ms = 1000;
	o.cache_disable = true;
	kiln_client_t *c = NULL;
	kiln_server_info_t hi;
	int rc = kiln_client_connect(&o, &c, NULL, 0);
	if (rc == 0)
		rc = kiln_client_hello(c, &hi, NULL, 0);
	kiln_client_free(c);
	return rc == 0 || rc == KILN_ETIMEOUT;
}

static int cmd_shutdown(ctl_t *x, int argc, char **argv)
{
	bool drain = true, wait = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--no-drain") == 0)
			drain = false;
		else if (strcmp(argv[i], "--wait") == 0)
			wait = true;
		else
			return ctl_usage_error("shutdown: unknown argument %s",
					       argv[i]);
	}
	long pid = 0;
	if (wait) {
		int ex = ctl_connect(x, DEFAULT_TIMEOUT_S);
		if (ex != EX_OK)
			return ex;
		pid = kilnd_pid(x);
	}
	msgpack_sbuffer sb;
	msgpack_packer pk;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, 1);
	ctl_pack_kbool(&pk, "drain", drain);
	reply_t r;
	int ex = ctl_call(x, KILN_OP_SHUTDOWN, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	ctl_reply_free(&r);
	ctl_disconnect(x);
	printf("kilnd at %s is shutting down (%s)\n", x->socket,
	       drain ? "running compiles finish first"
		     : "not waiting for running compiles");
	if (!wait)
		return EX_OK;
	/* --wait: until nothing answers on the socket and (when its store's
	 * lock file named it) the process is gone, so that the store is free
	 * for kilnctl verify */
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	double limit = x->timeout_s > 0 ? x->timeout_s : DEFAULT_TIMEOUT_S;
	while (still_answers(x) || (pid > 0 && alive(pid))) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - t0.tv_sec) +
			(double)(now.tv_nsec - t0.tv_nsec) / 1e9 >
		    limit) {
			ctl_errmsg("shutdown: kilnd at %s has not stopped "
				   "after %.0f s",
				   x->socket, limit);
			return EX_ERROR;
		}
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	printf("kilnd has stopped\n");
	return EX_OK;
}

/* ======================================================================== */
/* ping                                                                      */
/* ======================================================================== */

static double since_ms(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 +
	       (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int cmd_ping(ctl_t *x, int argc, char **argv)
{
	uint64_t count = 1;
	const char *v;
	for (int i = 1; i < argc; i++) {
		int got = ctl_opt_value(argc, argv, &i, "--count", &v);
		if (got == 0)
			got = ctl_opt_value(argc, argv, &i, "-c", &v);
		if (got < 0)
			return EX_USAGE;
		if (got == 0)
			return ctl_usage_error("ping: unknown argument %s",
					       argv[i]);
		if (!ctl_parse_u64(v, &count) || count < 1 || count > 1000000)
			return ctl_usage_error(
			    "ping: --count %s: want 1 or more", v);
	}
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int ex = ctl_connect(x, DEFAULT_TIMEOUT_S);
	if (ex != EX_OK)
		return ex;
	double connect_ms = since_ms(&t0);
	kiln_server_info_t hi;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	x->err[0] = '\0';
	int rc = kiln_client_hello(x->c, &hi, x->err, sizeof(x->err));
	if (rc < 0)
		return ctl_call_failed(x, "hello", rc);
	double first = since_ms(&t0), lo = first, hi_ms = first, sum = first;
	for (uint64_t i = 1; i < count && !ctl_interrupted; i++) {
		uint8_t *rep = NULL;
		size_t len = 0;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = kiln_client_call(x->c, KILN_OP_HELLO, NULL, 0, &rep, &len,
				      x->err, sizeof(x->err));
		free(rep);
		if (rc < 0)
			return ctl_call_failed(x, "hello", rc);
		double ms = since_ms(&t0);
		lo = ms < lo ? ms : lo;
		hi_ms = ms > hi_ms ? ms : hi_ms;
		sum += ms;
	}
	char a[32], b[32], c[32], d[32];
	printf("kilnd %s (protocol %u) at %s\n", hi.version, hi.protocol,
	       x->socket);
	printf("  fingerprint  %s\n", hi.fingerprint);
	unsigned nfeat = 0; /* "+avx2,-sse4a,...": the enabled ones */
	for (const char *f = hi.target.features; *f != '\0'; f++)
		nfeat += (f == hi.target.features || f[-1] == ',') && *f == '+';
	printf("  target       %s %s (%u CPU features)\n", hi.target.backend,
	       hi.target.arch, nfeat);
	printf("  limits       frames %s, %u nodes, %u requests in flight\n",
	       ctl_fmt_bytes(hi.max_frame_bytes, a, sizeof(a)), hi.max_nodes,
	       hi.max_inflight);
	if (count == 1)
		printf("  round trip   %s (connect %s)\n",
		       ctl_fmt_ms(first, a, sizeof(a)),
		       ctl_fmt_ms(connect_ms, b, sizeof(b)));
	else
		printf("  round trip   %" PRIu64 " hellos: min %s, avg %s, "
		       "max %s (connect %s)\n",
		       count, ctl_fmt_ms(lo, a, sizeof(a)),
		       ctl_fmt_ms(sum / (double)count, b, sizeof(b)),
		       ctl_fmt_ms(hi_ms, c, sizeof(c)),
		       ctl_fmt_ms(connect_ms, d, sizeof(d)));
	return EX_OK;
}

/* ======================================================================== */
/* main                                                                      */
/* ======================================================================== */

typedef struct command {
	const char *name;
	int (*fn)(ctl_t *x, int argc, char **argv);
} command_t;

static const command_t COMMANDS[] = {
    {"status", cmd_status},	{"list", cmd_list},
    {"evict", cmd_evict},	{"gc", cmd_gc},
    {"verify", cmd_verify},	{"compile", cmd_compile},
    {"ping", cmd_ping},		{"settings", cmd_settings},
    {"shutdown", cmd_shutdown}, {"metrics", cmd_metrics},
};

/* Finishes stdout: a write error (a full disk, a closed pipe) fails. */
static int finish_stdout(int ex)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		if (errno != EPIPE)
			ctl_errmsg("stdout: %s", strerror(errno));
		return ex == EX_OK ? EX_ERROR : ex;
	}
	return ex;
}

int main(int argc, char **argv)
{
	ctl_t x;
	memset(&x, 0, sizeof(x));
	x.timeout_s = -1;
	kiln_limits_default(&x.lim);
	/* The store's log lines (verify) are not kilnctl's one-line errors:
	 * kilnctl reports what matters itself. */
	kiln_log_level = -1;
	signal(SIGPIPE, SIG_IGN);

	/* Global options anywhere; the rest is the command and its args. */
	char **rest = calloc((size_t)argc + 1, sizeof(char *));
	if (rest == NULL) {
		ctl_errmsg("out of memory");
		return EX_ERROR;
	}
	int nrest = 0;
	bool dashdash = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v;
		int got;
		if (dashdash) {
			rest[nrest++] = argv[i];
		} else if (strcmp(a, "--") == 0) {
			dashdash = true;
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0 ||
			   strcmp(a, "help") == 0) {
			fputs(USAGE, stdout);
			free(rest);
			return finish_stdout(EX_OK);
		} else if (strcmp(a, "-V") == 0 ||
			   strcmp(a, "--version") == 0) {
			printf("kilnctl %s (protocol %d)\n",
			       KILN_VERSION_STRING, KILN_PROTOCOL_VERSION);
			free(rest);
			return finish_stdout(EX_OK);
		} else if ((got = ctl_opt_value(argc, argv, &i, "--socket",
						&v))) {
			if (got < 0 || v[0] == '\0') {
				free(rest);
				return got < 0
					   ? EX_USAGE
					   : ctl_usage_error("--socket: empty "
							     "path");
			}
			snprintf(x.sockbuf, sizeof(x.sockbuf), "%s", v);
			x.socket_given = true;
		} else if ((got = ctl_opt_value(argc, argv, &i, "--timeout",
						&v))) {
			if (got < 0) {
				free(rest);
				return EX_USAGE;
			}
			if (!ctl_parse_seconds(v, &x.timeout_s)) {
				free(rest);
				return ctl_usage_error("--timeout %s: want "
						       "seconds (> 0)",
						       v);
			}
		} else {
			rest[nrest++] = argv[i];
		}
	}
	if (nrest == 0) {
		fputs(USAGE, stderr);
		free(rest);
		return EX_USAGE;
	}
	const command_t *cmd = NULL;
	for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++)
		if (strcmp(rest[0], COMMANDS[i].name) == 0)
			cmd = &COMMANDS[i];
	if (cmd == NULL) {
		int ex = ctl_usage_error("unknown command %s", rest[0]);
		free(rest);
		return ex;
	}
	if (!x.socket_given)
		discover_socket(&x);
	x.socket = x.sockbuf;
	int ex = cmd->fn(&x, nrest, rest);
	ctl_disconnect(&x);
	free(rest);
	return finish_stdout(ex);
}
