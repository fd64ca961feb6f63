/*
 * test_metrics.c — kiln_metrics_format (clients/libkiln/metrics.c): a
 * status "stats" map as Prometheus text (format 0.0.4).
 *
 * The map is packed the way kilnd's kilnd_pack_stats packs it (daemon/ops.c:
 * the same keys, in the same nesting), the store's part from cache.h's
 * KILN_CACHE_STATS (the macro only: nothing of the store is linked), so a
 * key added there without a type and help text in metrics.c's table shows
 * up here. Every output is also run through a small parser of
 * the text format: each line a # HELP / # TYPE comment or a sample
 * `name{labels} value`, each sample's family typed before it and exactly
 * once, counters (and only counters) ending in _total.
 */
#include "cache/cache.h"
#include "clients/libkiln/kiln.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- packing a stats map ------------------------------------------------ */

typedef struct packed {
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_unpacked up;
} packed_t;

static void pk_init(packed_t *p)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	msgpack_unpacked_init(&p->up);
}

static const msgpack_object *pk_done(packed_t *p)
{
	cr_assert_eq(msgpack_unpack_next(&p->up, p->sb.data, p->sb.size, NULL),
		     MSGPACK_UNPACK_SUCCESS);
	return &p->up.data;
}

static void pk_fini(packed_t *p)
{
	msgpack_unpacked_destroy(&p->up);
	msgpack_sbuffer_destroy(&p->sb);
}

static void key(msgpack_packer *pk, const char *k)
{
	kiln_pack_cstr(pk, k);
}

static void ku(msgpack_packer *pk, const char *k, uint64_t v)
{
	key(pk, k);
	msgpack_pack_uint64(pk, v);
}

static void kf(msgpack_packer *pk, const char *k, double v)
{
	key(pk, k);
	msgpack_pack_double(pk, v);
}

/* A stats map as kilnd packs it (daemon/ops.c kilnd_pack_stats). */
static void pack_kilnd_stats(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 20);
	kf(pk, "uptime_s", 12.5);
	ku(pk, "rss_bytes", 8171520);
	key(pk, "connections");
	msgpack_pack_map(pk, 4);
	ku(pk, "current", 2);
	ku(pk, "total", 5);
	ku(pk, "rejected", 0);
	ku(pk, "idle_closed", 1);
	key(pk, "requests");
	msgpack_pack_map(pk, KILN_OP__COUNT);
	for (int op = 0; op < KILN_OP__COUNT; op++)
		ku(pk, kiln_op_name((kiln_op_t)op),
		   op == KILN_OP_COMPILE ? 12 : (uint64_t)op);
	key(pk, "hits");
	msgpack_pack_map(pk, 3);
	ku(pk, "memory", 7);
	ku(pk, "disk", 2);
	ku(pk, "remote", 0);
	ku(pk, "compiled", 3);
	ku(pk, "joined", 1);
	ku(pk, "failed", 0);
	ku(pk, "timeouts", 0);
	ku(pk, "busy", 3);
	ku(pk, "bad_frames", 0);
	ku(pk, "read_paused", 0);
	ku(pk, "store_put_errors", 0);
	key(pk, "dynamic");
	msgpack_pack_map(pk, 3);
	ku(pk, "compiles", 1);
	ku(pk, "hits", 4);
	ku(pk, "refused", 0);
	key(pk, "queue");
	msgpack_pack_map(pk, 3);
	ku(pk, "depth", 0);
	ku(pk, "max", 256);
	ku(pk, "in_flight", 1);
	key(pk, "workers");
	msgpack_pack_map(pk, 5);
	ku(pk, "busy", 1);
	ku(pk, "total", 4);
	ku(pk, "processes", 2);
	ku(pk, "spawns", 3);
	ku(pk, "crashes", 1);
	key(pk, "compile_ms");
	msgpack_pack_map(pk, 3);
	kf(pk, "p50", 41.7);
	kf(pk, "p90", 120.0);
	kf(pk, "p99", 800.25);
	key(pk, "hot");
	msgpack_pack_map(pk, 3);
	ku(pk, "entries", 3);
	ku(pk, "bytes", 52000);
	ku(pk, "max_bytes", 268435456);
	key(pk, "store");
	uint32_t n = 0;
#define COUNT(name, doc) n++;
	KILN_CACHE_STATS(COUNT)
#undef COUNT
	msgpack_pack_map(pk, n);
#define PACK(name, doc)                                                        \
	ku(pk, #name,                                                          \
	   strcmp(#name, "entries") == 0 ? 10                                  \
	   : strcmp(#name, "hits") == 0	 ? 6                                   \
					 : 0);
	KILN_CACHE_STATS(PACK)
#undef PACK
	key(pk, "errors");
	msgpack_pack_map(pk, 2);
	ku(pk, "bad_request", 1);
	ku(pk, "not_found", 2);
}

/* ---- a parser of the text format ---------------------------------------- */

#define MAX_FAMILIES 256

typedef struct family {
	char name[128];
	char type[16];
	bool help;
	int samples;
} family_t;

typedef struct parsed {
	family_t fam[MAX_FAMILIES];
	int n;
	int samples;
} parsed_t;

static family_t *fam_find(parsed_t *p, const char *name)
{
	for (int i = 0; i < p->n; i++)
		if (strcmp(p->fam[i].name, name) == 0)
			return &p->fam[i];
	return NULL;
}

/* A metric name [a-zA-Z_:][a-zA-Z0-9_:]* at s; its length (0: none). */
static size_t name_len(const char *s)
{
	size_t i = 0;
	if (!(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
		return 0;
	while (isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':')
		i++;
	return i;
}

/* Checks the whole text; every failure names the line. */
static void parse_exposition(const char *text, parsed_t *p)
{
	memset(p, 0, sizeof(*p));
	const family_t *current = NULL;
	int lineno = 0;
	for (const char *line = text; *line != '\0';) {
		const char *nl = strchr(line, '\n');
		cr_assert_not_null(nl, "the text must end in a newline");
		char buf[1024];
		size_t len = (size_t)(nl - line);
		cr_assert_lt(len, sizeof(buf));
		memcpy(buf, line, len);
		buf[len] = '\0';
		line = nl + 1;
		lineno++;
		cr_assert_gt(len, 0, "line %d is empty", lineno);
		if (strncmp(buf, "# HELP ", 7) == 0 ||
		    strncmp(buf, "# TYPE ", 7) == 0) {
			const char *nm = buf + 7;
			size_t l = name_len(nm);
			cr_assert_gt(l, 0, "line %d: bad name: %s", lineno,
				     buf);
			cr_assert_eq(nm[l], ' ', "line %d: %s", lineno, buf);
			char name[128];
			cr_assert_lt(l, sizeof(name));
			memcpy(name, nm, l);
			name[l] = '\0';
			family_t *f = fam_find(p, name);
			if (f == NULL) {
				cr_assert_lt(p->n, MAX_FAMILIES);
				f = &p->fam[p->n++];
				snprintf(f->name, sizeof(f->name), "%s", name);
			}
			cr_assert_eq(f->samples, 0,
				     "line %d: %s after its samples", lineno,
				     buf);
			if (buf[2] == 'H') {
				cr_assert(!f->help, "line %d: second HELP",
					  lineno);
				f->help = true;
				cr_assert_gt(strlen(nm + l + 1), 0,
					     "line %d: empty HELP", lineno);
			} else {
				cr_assert_eq(f->type[0], '\0',
					     "line %d: second TYPE", lineno);
				const char *t = nm + l + 1;
				cr_assert(strcmp(t, "counter") == 0 ||
					      strcmp(t, "gauge") == 0,
					  "line %d: type %s", lineno, t);
				snprintf(f->type, sizeof(f->type), "%s", t);
			}
			current = f;
			continue;
		}
		cr_assert_neq(buf[0], '#', "line %d: unknown comment %s",
			      lineno, buf);
		/* a sample: name{label="value",...} value */
		size_t l = name_len(buf);
		cr_assert_gt(l, 0, "line %d: %s", lineno, buf);
		char name[128];
		memcpy(name, buf, l);
		name[l] = '\0';
		const char *q = buf + l;
		if (*q == '{') {
			q++;
			while (*q != '}') {
				size_t ll = name_len(q);
				cr_assert_gt(ll, 0, "line %d: label", lineno);
				q += ll;
				cr_assert_eq(*q, '=', "line %d", lineno);
				q++;
				cr_assert_eq(*q, '"', "line %d", lineno);
				q++;
				while (*q != '"') {
					cr_assert_neq(*q, '\0', "line %d",
						      lineno);
					if (*q == '\\') {
						q++;
						cr_assert(
						    *q == '\\' || *q == '"' ||
							*q == 'n',
						    "line %d: escape", lineno);
					}
					q++;
				}
				q++;
				if (*q == ',')
					q++;
				else
					cr_assert_eq(*q, '}', "line %d",
						     lineno);
			}
			q++;
		}
		cr_assert_eq(*q, ' ', "line %d: %s", lineno, buf);
		q++;
		char *end;
		if (strcmp(q, "NaN") != 0 && strcmp(q, "+Inf") != 0 &&
		    strcmp(q, "-Inf") != 0) {
			strtod(q, &end);
			cr_assert(end != q && *end == '\0', "line %d: value %s",
				  lineno, q);
		}
		family_t *f = fam_find(p, name);
		cr_assert_not_null(f, "line %d: %s has no TYPE", lineno, name);
		cr_assert_neq(f->type[0], '\0', "line %d: %s has no TYPE",
			      lineno, name);
		cr_assert_eq(f, current, "line %d: %s is not next to its TYPE",
			     lineno, name);
		f->samples++;
		p->samples++;
	}
	for (int i = 0; i < p->n; i++) {
		const family_t *f = &p->fam[i];
		size_t l = strlen(f->name);
		bool total = l > 6 && strcmp(f->name + l - 6, "_total") == 0;
		cr_assert(f->help, "%s has no HELP", f->name);
		cr_assert_neq(f->type[0], '\0', "%s has no TYPE", f->name);
		if (strcmp(f->type, "counter") == 0)
			cr_assert(total, "counter %s must end in _total",
				  f->name);
		else
			cr_assert(!total, "gauge %s ends in _total", f->name);
		cr_assert_eq(strncmp(f->name, "kiln_", 5), 0, "%s", f->name);
	}
}

/* Formats obj, checks the text, returns it (free()). */
static char *format_checked(const msgpack_object *obj, parsed_t *p)
{
	char *text = NULL;
	size_t len = 12345;
	cr_assert_eq(kiln_metrics_format(obj, &text, &len), 0);
	cr_assert_not_null(text);
	cr_assert_eq(len, strlen(text));
	parse_exposition(text, p);
	return text;
}

static void has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *s = text; (s = strstr(s, line)) != NULL; s++)
		if ((s == text || s[-1] == '\n') && s[n] == '\n')
			return;
	cr_assert_fail("no line \"%s\" in:\n%s", line, text);
}

/* ---- tests --------------------------------------------------------------- */

Test(metrics, kilnd_stats_map)
{
	packed_t pk;
	pk_init(&pk);
	pack_kilnd_stats(&pk.pk);
	parsed_t *p = calloc(1, sizeof(*p));
	char *t = format_checked(pk_done(&pk), p);

	has_line(t, "# TYPE kiln_uptime_s gauge");
	has_line(t, "kiln_uptime_s 12.5");
	has_line(t, "# TYPE kiln_rss_bytes gauge");
	has_line(t, "kiln_rss_bytes 8171520");
	has_line(t, "# TYPE kiln_connections_current gauge");
	has_line(t, "kiln_connections_current 2");
	has_line(t, "# TYPE kiln_connections_total counter");
	has_line(t, "kiln_connections_total 5");
	has_line(t, "kiln_connections_idle_closed_total 1");
	has_line(t, "# TYPE kiln_requests_total counter");
	has_line(t, "kiln_requests_total{op=\"compile\"} 12");
	has_line(t, "kiln_requests_total{op=\"shutdown\"} 7");
	has_line(t, "# TYPE kiln_hits_total counter");
	has_line(t, "kiln_hits_total{source=\"memory\"} 7");
	has_line(t, "kiln_hits_total{source=\"disk\"} 2");
	has_line(t, "kiln_compiled_total 3");
	has_line(t, "# TYPE kiln_busy_total counter");
	has_line(t, "kiln_busy_total 3");
	has_line(t, "kiln_dynamic_hits_total 4");
	has_line(t, "# TYPE kiln_queue_depth gauge");
	has_line(t, "kiln_queue_max 256");
	has_line(t, "kiln_queue_in_flight 1");
	has_line(t, "# TYPE kiln_workers_busy gauge");
	has_line(t, "kiln_workers_busy 1");
	has_line(t, "# TYPE kiln_workers gauge"); /* workers.total */
	has_line(t, "kiln_workers 4");
	has_line(t, "kiln_workers_processes 2");
	has_line(t, "kiln_workers_spawns_total 3");
	has_line(t, "kiln_workers_crashes_total 1");
	has_line(t, "# TYPE kiln_compile_ms gauge");
	has_line(t, "kiln_compile_ms{quantile=\"0.5\"} 41.7");
	has_line(t, "kiln_compile_ms{quantile=\"0.9\"} 120");
	has_line(t, "kiln_compile_ms{quantile=\"0.99\"} 800.25");
	has_line(t, "kiln_hot_entries 3");
	has_line(t, "kiln_hot_max_bytes 268435456");
	has_line(t, "kiln_store_entries 10");
	has_line(t, "kiln_store_hits_total 6");
	has_line(t, "# TYPE kiln_store_put_errors_total counter");
	has_line(t, "# TYPE kiln_artifacts_unstored_total counter");
	has_line(t, "# TYPE kiln_errors_total counter");
	has_line(t, "kiln_errors_total{code=\"bad_request\"} 1");
	has_line(t, "kiln_errors_total{code=\"not_found\"} 2");
	has_line(t, "# HELP kiln_requests_total Requests received, by op.");
	/* 8 ops + 3 hits + 3 quantiles + 2 errors in 4 families, and every
	 * other key one sample */
	cr_assert_eq(p->samples, p->n - 4 + 8 + 3 + 3 + 2,
		     "%d samples, %d "
		     "families",
		     p->samples, p->n);
	free(t);
	free(p);
	pk_fini(&pk);
}

static void check_store_type(const char *name, const char *doc, const char *t)
{
	char line[160];
	if (strstr(doc, "(gauge)") != NULL)
		snprintf(line, sizeof(line), "# TYPE kiln_store_%s gauge",
			 name);
	else
		snprintf(line, sizeof(line),
			 "# TYPE kiln_store_%s_total counter", name);
	has_line(t, line);
	/* and a HELP of its own, not the generic one */
	char generic[160];
	snprintf(generic, sizeof(generic), "kilnd status store.%s.", name);
	cr_assert_null(strstr(t, generic), "store.%s has no HELP in metrics.c",
		       name);
}

Test(metrics, store_counters_follow_cache_h)
{
	packed_t pk;
	pk_init(&pk);
	pack_kilnd_stats(&pk.pk);
	parsed_t *p = calloc(1, sizeof(*p));
	char *t = format_checked(pk_done(&pk), p);
#define CHECK(name, doc) check_store_type(#name, doc, t);
	KILN_CACHE_STATS(CHECK)
#undef CHECK
	free(t);
	free(p);
	pk_fini(&pk);
}

Test(metrics, unknown_keys_are_typed_by_name)
{
	packed_t pk;
	pk_init(&pk);
	msgpack_pack_map(&pk.pk, 9);
	ku(&pk.pk, "widgets_total", 1);	    /* a clash: the first is kept */
	ku(&pk.pk, "widgets", 3);	    /* an event count */
	ku(&pk.pk, "cache-size.bytes", 77); /* sanitized; a gauge */
	key(&pk.pk, "pool");
	msgpack_pack_map(&pk.pk, 4);
	ku(&pk.pk, "idle_bytes", 5);
	ku(&pk.pk, "steals", 9);
	kf(&pk.pk, "p999", 2.5);
	key(&pk.pk, "deeper");
	msgpack_pack_map(&pk.pk, 1);
	ku(&pk.pk, "current", 1);
	key(&pk.pk, "version");
	kiln_pack_cstr(&pk.pk, "0.1.0"); /* not a number: skipped */
	key(&pk.pk, "draining");
	msgpack_pack_true(&pk.pk);
	key(&pk.pk, "offset");
	msgpack_pack_int64(&pk.pk, -4);
	kf(&pk.pk, "ratio", 0.1);
	key(&pk.pk, "list");
	msgpack_pack_array(&pk.pk, 1);
	msgpack_pack_uint8(&pk.pk, 1);
	parsed_t *p = calloc(1, sizeof(*p));
	char *t = format_checked(pk_done(&pk), p);
	has_line(t, "# TYPE kiln_widgets_total counter");
	has_line(t, "kiln_widgets_total 1");
	has_line(t, "# TYPE kiln_cache_size_bytes gauge");
	has_line(t, "kiln_cache_size_bytes 77");
	has_line(t, "kiln_pool_idle_bytes 5");
	has_line(t, "kiln_pool_steals_total 9");
	has_line(t, "# TYPE kiln_pool_p999 gauge");
	has_line(t, "kiln_pool_deeper_current 1");
	has_line(t, "# TYPE kiln_draining gauge"); /* a flag */
	has_line(t, "kiln_draining 1");
	has_line(t, "kiln_offset -4");
	has_line(t, "kiln_ratio 0.1");
	has_line(t, "# HELP kiln_widgets_total kilnd status widgets_total.");
	cr_assert_null(strstr(t, "version"));
	cr_assert_null(strstr(t, "list"));
	cr_assert_eq(p->samples, 9);
	free(t);
	free(p);
	pk_fini(&pk);
}

Test(metrics, label_values_and_odd_numbers)
{
	packed_t pk;
	pk_init(&pk);
	msgpack_pack_map(&pk.pk, 3);
	key(&pk.pk, "errors");
	msgpack_pack_map(&pk.pk, 2);
	ku(&pk.pk, "a\"b\\c\nd", 1);
	ku(&pk.pk, "internal", 0);
	key(&pk.pk, "compile_ms");
	msgpack_pack_map(&pk.pk, 3);
	kf(&pk.pk, "p50", NAN);
	kf(&pk.pk, "p90", INFINITY);
	kf(&pk.pk, "max", 1e300);
	kf(&pk.pk, "uptime_s", 1.0 / 3);
	parsed_t *p = calloc(1, sizeof(*p));
	char *t = format_checked(pk_done(&pk), p);
	has_line(t, "kiln_errors_total{code=\"a\\\"b\\\\c\\nd\"} 1");
	has_line(t, "kiln_errors_total{code=\"internal\"} 0");
	has_line(t, "kiln_compile_ms{quantile=\"0.5\"} NaN");
	has_line(t, "kiln_compile_ms{quantile=\"0.9\"} +Inf");
	has_line(t, "kiln_compile_ms{quantile=\"max\"} 1e+300");
	/* the shortest form that reads back exactly */
	has_line(t, "kiln_uptime_s 0.3333333333333333");
	free(t);
	free(p);
	pk_fini(&pk);
}

Test(metrics, empty_families_still_typed)
{
	packed_t pk;
	pk_init(&pk);
	msgpack_pack_map(&pk.pk, 1);
	key(&pk.pk, "errors");
	msgpack_pack_map(&pk.pk, 0);
	parsed_t *p = calloc(1, sizeof(*p));
	char *t = format_checked(pk_done(&pk), p);
	has_line(t, "# TYPE kiln_errors_total counter");
	cr_assert_eq(p->samples, 0);
	free(t);
	free(p);
	pk_fini(&pk);
}

Test(metrics, empty_map_and_bad_arguments)
{
	packed_t pk;
	pk_init(&pk);
	msgpack_pack_map(&pk.pk, 0);
	char *t = NULL;
	size_t len = 99;
	cr_assert_eq(kiln_metrics_format(pk_done(&pk), &t, &len), 0);
	cr_assert_not_null(t);
	cr_assert_str_eq(t, "");
	cr_assert_eq(len, 0);
	free(t);
	t = NULL;
	cr_assert_eq(kiln_metrics_format(pk_done(&pk), &t, NULL), 0);
	free(t);
	pk_fini(&pk);

	t = (char *)"untouched";
	cr_assert_eq(kiln_metrics_format(NULL, &t, &len), -EINVAL);
	cr_assert_null(t);
	msgpack_object arr;
	memset(&arr, 0, sizeof(arr));
	arr.type = MSGPACK_OBJECT_ARRAY;
	cr_assert_eq(kiln_metrics_format(&arr, &t, &len), -EINVAL);
	cr_assert_null(t);
	cr_assert_eq(kiln_metrics_format(&arr, NULL, &len), -EINVAL);
}
