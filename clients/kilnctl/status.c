/*
 * status.c — `kilnctl status`: the human table (uptime and connections,
 * requests and hit rate, compiles, queue and workers, the store against its
 * limit with a bar, compile latency, the hot map, errors), --json, --watch
 * and --settings; and the settings table `kilnctl settings` shares.
 *
 * --watch refreshes every N seconds until SIGINT or SIGTERM
 * (ctl_interrupted); when kilnd goes away it says so and keeps trying.
 */
#include "clients/kilnctl/kilnctl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t ctl_interrupted;

/* ======================================================================== */
/* status                                                                    */
/* ======================================================================== */

static bool in_list(const msgpack_object *k, const char *const *list, size_t n)
{
	for (size_t j = 0; j < n; j++)
		if (kiln_obj_streq(k, list[j]))
			return true;
	return false;
}

/* "compile 30, lookup 4": the non-zero counts of map m, the keys of
 * `first` in that order, then the others as they come; "none" if none. */
static void print_counts(const msgpack_object *m, const char *const *first,
			 size_t n_first)
{
	bool any = false;
	if (m != NULL && m->type == MSGPACK_OBJECT_MAP) {
		for (size_t j = 0; j < n_first; j++) {
			const msgpack_object *v = kiln_map_get(m, first[j]);
			if (v == NULL ||
			    v->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    v->via.u64 == 0)
				continue;
			printf("%s%s %" PRIu64, any ? ", " : "", first[j],
			       v->via.u64);
			any = true;
		}
		for (uint32_t i = 0; i < m->via.map.size; i++) {
			const msgpack_object *k = &m->via.map.ptr[i].key;
			const msgpack_object *v = &m->via.map.ptr[i].val;
			if (k->type != MSGPACK_OBJECT_STR ||
			    v->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    v->via.u64 == 0 || in_list(k, first, n_first))
				continue;
			printf("%s%.*s %" PRIu64, any ? ", " : "",
			       (int)k->via.str.size, k->via.str.ptr,
			       v->via.u64);
			any = true;
		}
	}
	if (!any)
		printf("none");
}

static uint64_t sum_map(const msgpack_object *m)
{
	uint64_t s = 0;
	if (m == NULL || m->type != MSGPACK_OBJECT_MAP)
		return 0;
	for (uint32_t i = 0; i < m->via.map.size; i++)
		if (m->via.map.ptr[i].val.type ==
		    MSGPACK_OBJECT_POSITIVE_INTEGER)
			s += m->via.map.ptr[i].val.via.u64;
	return s;
}

static void print_bar(uint64_t used, uint64_t max)
{
	double frac = (double)used / (double)max;
	int fill = (int)(frac * BAR_WIDTH + 0.5);
	if (fill > BAR_WIDTH)
		fill = BAR_WIDTH;
	putchar('[');
	for (int i = 0; i < BAR_WIDTH; i++)
		putchar(i < fill ? '#' : '.');
	printf("] %3.0f%%", frac * 100);
}

static void print_status(const ctl_t *x, const kiln_server_info_t *hi,
			 const msgpack_object *st)
{
	char a[64], b[64], c[64];
	static const char *const OPS[] = {"compile", "lookup",	"hello",
					  "status",  "list",	"evict",
					  "gc",	     "shutdown"};
	static const char *const ERRS[] = {"busy", "timeout", "invalid_graph",
					   "not_found"};

	printf("kilnd %s (protocol %u, %s %s) at %s\n", hi->version,
	       hi->protocol, hi->target.backend, hi->target.arch, x->socket);
	printf("  uptime       %s, rss %s\n",
	       ctl_fmt_duration(ctl_num(st, "uptime_s"), a, sizeof(a)),
	       ctl_fmt_bytes(ctl_u64(st, "rss_bytes"), b, sizeof(b)));
	printf("  connections  %" PRIu64 " open, %" PRIu64 " total, %" PRIu64
	       " rejected, %" PRIu64 " closed idle\n",
	       ctl_u64(st, "connections.current"),
	       ctl_u64(st, "connections.total"),
	       ctl_u64(st, "connections.rejected"),
	       ctl_u64(st, "connections.idle_closed"));

	printf("  requests     %" PRIu64, sum_map(ctl_mget(st, "requests")));
	if (sum_map(ctl_mget(st, "requests")) > 0) {
		printf(": ");
		print_counts(ctl_mget(st, "requests"), OPS, 8);
	}
	putchar('\n');

	uint64_t hits = ctl_u64(st, "hits.memory") + ctl_u64(st, "hits.disk") +
			ctl_u64(st, "hits.remote");
	uint64_t served =
	    hits + ctl_u64(st, "compiled") + ctl_u64(st, "joined");
	if (served > 0)
		printf("  hit rate     %.1f%% (%" PRIu64 " of %" PRIu64
		       " from a cache: memory %" PRIu64 ", disk %" PRIu64
		       ", remote %" PRIu64 ")\n",
		       100.0 * (double)hits / (double)served, hits, served,
		       ctl_u64(st, "hits.memory"), ctl_u64(st, "hits.disk"),
		       ctl_u64(st, "hits.remote"));
	else
		printf("  hit rate     -    (no artifacts served yet)\n");

	printf("  compiles     %" PRIu64 " compiled, %" PRIu64
	       " joined, %" PRIu64 " failed, %" PRIu64 " timed out, %" PRIu64
	       " busy\n",
	       ctl_u64(st, "compiled"), ctl_u64(st, "joined"),
	       ctl_u64(st, "failed"), ctl_u64(st, "timeouts"),
	       ctl_u64(st, "busy"));
	printf("  queue        %" PRIu64 " waiting (max %" PRIu64 "), %" PRIu64
	       " jobs in flight\n",
	       ctl_u64(st, "queue.depth"), ctl_u64(st, "queue.max"),
	       ctl_u64(st, "queue.in_flight"));
	uint64_t procs = ctl_u64(st, "workers.processes");
	printf("  workers      %" PRIu64 " of %" PRIu64 " busy; %" PRIu64
	       " worker process%s (%" PRIu64 " started, %" PRIu64 " crashed)\n",
	       ctl_u64(st, "workers.busy"), ctl_u64(st, "workers.total"), procs,
	       procs == 1 ? "" : "es", ctl_u64(st, "workers.spawns"),
	       ctl_u64(st, "workers.crashes"));

	uint64_t sb = ctl_u64(st, "store.bytes"),
		 smax = ctl_u64(st, "store.max_bytes");
	printf("  store        %s", ctl_fmt_bytes(sb, a, sizeof(a)));
	if (smax > 0) {
		printf(" of %s ", ctl_fmt_bytes(smax, b, sizeof(b)));
		print_bar(sb, smax);
	}
	uint64_t ne = ctl_u64(st, "store.entries"),
		 nb = ctl_u64(st, "store.blobs");
	printf("\n               %" PRIu64 " %s, %" PRIu64
	       " %s; %s free on disk\n",
	       ne, ctl_plural(ne, "entry", "entries"), nb,
	       ctl_plural(nb, "blob", "blobs"),
	       ctl_fmt_bytes(ctl_u64(st, "store.fs_free_bytes"), c, sizeof(c)));

	if (ctl_u64(st, "compiled") + ctl_u64(st, "failed") > 0 ||
	    ctl_num(st, "compile_ms.p50") > 0)
		printf("  latency      compile p50 %s, p90 %s, p99 %s\n",
		       ctl_fmt_ms(ctl_num(st, "compile_ms.p50"), a, sizeof(a)),
		       ctl_fmt_ms(ctl_num(st, "compile_ms.p90"), b, sizeof(b)),
		       ctl_fmt_ms(ctl_num(st, "compile_ms.p99"), c, sizeof(c)));
	else
		printf("  latency      -    (no compiles yet)\n");
	uint64_t nh = ctl_u64(st, "hot.entries");
	printf("  hot map      %" PRIu64 " %s, %s of %s\n", nh,
	       ctl_plural(nh, "entry", "entries"),
	       ctl_fmt_bytes(ctl_u64(st, "hot.bytes"), a, sizeof(a)),
	       ctl_fmt_bytes(ctl_u64(st, "hot.max_bytes"), b, sizeof(b)));
	printf("  dynamic      %" PRIu64 " generalized, %" PRIu64
	       " hits, %" PRIu64 " refused\n",
	       ctl_u64(st, "dynamic.compiles"), ctl_u64(st, "dynamic.hits"),
	       ctl_u64(st, "dynamic.refused"));
	printf("  errors       ");
	print_counts(ctl_mget(st, "errors"), ERRS, 4);
	putchar('\n');
}

void ctl_print_settings(const msgpack_object *set)
{
	size_t w = 8;
	if (set == NULL || set->type != MSGPACK_OBJECT_MAP) {
		printf("(no settings in the reply)\n");
		return;
	}
	for (uint32_t i = 0; i < set->via.map.size; i++) {
		const msgpack_object *k = &set->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size > w)
			w = k->via.str.size;
	}
	printf("%-*s  %s\n", (int)w, "SETTING", "VALUE");
	for (uint32_t i = 0; i < set->via.map.size; i++) {
		const msgpack_object *k = &set->via.map.ptr[i].key;
		const msgpack_object *v = &set->via.map.ptr[i].val;
		if (k->type != MSGPACK_OBJECT_STR)
			continue;
		printf("%-*.*s  ", (int)w, (int)k->via.str.size,
		       k->via.str.ptr);
		if (v->type == MSGPACK_OBJECT_STR && v->via.str.size > 0)
			printf("%.*s", (int)v->via.str.size, v->via.str.ptr);
		else if (v->type == MSGPACK_OBJECT_STR)
			printf("\"\""); /* unset */
		else
			ctl_json_write(stdout, v, -1);
		putchar('\n');
	}
}

/* One status request (with settings when asked), printed. */
static int status_once(ctl_t *x, bool json, bool settings, bool one_line)
{
	kiln_server_info_t hi;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	reply_t r;
	ctl_fields_init(&sb, &pk);
	msgpack_pack_map(&pk, 1);
	ctl_pack_kbool(&pk, "settings", settings);
	int ex = ctl_call(x, KILN_OP_STATUS, &sb, &r, DEFAULT_TIMEOUT_S);
	msgpack_sbuffer_destroy(&sb);
	if (ex != EX_OK)
		return ex;
	if (json) {
		ctl_json_reply(stdout, &r.map, one_line);
	} else {
		memset(&hi, 0, sizeof(hi));
		x->err[0] = '\0';
		int rc = kiln_client_hello(x->c, &hi, x->err, sizeof(x->err));
		if (rc < 0) {
			ctl_reply_free(&r);
			return ctl_call_failed(x, "hello", rc);
		}
		const msgpack_object *st = kiln_map_get(&r.map, "stats");
		if (st == NULL || st->type != MSGPACK_OBJECT_MAP) {
			ctl_reply_free(&r);
			ctl_errmsg("status: the reply has no stats map");
			return EX_ERROR;
		}
		print_status(x, &hi, st);
		if (settings) {
			putchar('\n');
			ctl_print_settings(kiln_map_get(&r.map, "settings"));
		}
	}
	ctl_reply_free(&r);
	return EX_OK;
}

static void on_sigint(int sig)
{
	(void)sig;
	ctl_interrupted = 1;
}

int cmd_status(ctl_t *x, int argc, char **argv)
{
	bool json = false, settings = false, watch = false;
	double every = 2.0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--json") == 0) {
			json = true;
		} else if (strcmp(a, "--settings") == 0) {
			settings = true;
		} else if (strcmp(a, "--watch") == 0) {
			watch = true;
		} else if (strncmp(a, "--watch=", 8) == 0) {
			watch = true;
			if (!ctl_parse_seconds(a + 8, &every))
				return ctl_usage_error(
				    "status: --watch=%s: want "
				    "seconds",
				    a + 8);
		} else {
			return ctl_usage_error("status: unknown argument %s",
					       a);
		}
	}
	if (!watch)
		return status_once(x, json, settings, false);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	bool tty = isatty(STDOUT_FILENO);
	while (!ctl_interrupted) {
		if (tty && !json)
			fputs("\033[H\033[2J", stdout);
		if (!json) {
			char t[64];
			printf(
			    "every %gs, %s (Ctrl-C stops)\n", every,
			    ctl_fmt_time((uint64_t)time(NULL), t, sizeof(t)));
		}
		fflush(stdout);
		int ex = status_once(x, json, settings, true);
		if (ctl_interrupted) /* Ctrl-C during the request */
			break;
		if (ex == EX_DOWN)
			ctl_disconnect(x); /* connect afresh next time */
		else if (ex != EX_OK)
			return ex;
		if (!tty && !json)
			putchar('\n');
		fflush(stdout);
		struct timespec ts = {(time_t)every,
				      (long)((every - floor(every)) * 1e9)};
		while (!ctl_interrupted && nanosleep(&ts, &ts) != 0 &&
		       errno == EINTR)
			;
	}
	return EX_OK;
}
