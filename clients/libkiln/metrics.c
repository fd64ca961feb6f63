/*
 * metrics.c — kiln_metrics_format (kiln.h § 4): a status reply's "stats"
 * map as Prometheus text exposition, version 0.0.4.
 *
 * Names. A value at path a.b.c of the map becomes kiln_a_b_c (characters
 * outside [a-zA-Z0-9_] become '_'). Counters (things that only grow:
 * requests, hits, compiles, errors ...) end in _total and are typed
 * `counter`; gauges (current values: connections open, bytes, queue depth,
 * busy workers, RSS, uptime, latency quantiles) are `gauge`. A gauge whose
 * last path element is "total" (workers.total: the size of the pool) drops
 * it, so no gauge ends in _total.
 *
 * A name is written once: kilnd's own store_put_errors (named
 * kiln_artifacts_unstored_total) would otherwise clash with the store's
 * put_errors, and a clash among keys of a newer kilnd keeps the first.
 *
 * Families with labels. Four maps of the stats map are one metric each,
 * with a label per key:
 *
 *     requests.<op>     kiln_requests_total{op="compile"}
 *     hits.<source>     kiln_hits_total{source="memory"}
 *     errors.<code>     kiln_errors_total{code="not_found"}
 *     compile_ms.pNN    kiln_compile_ms{quantile="0.NN"}   (a gauge)
 *
 * The known keys (daemon/README.md "Status", daemon/ops.c kilnd_pack_stats,
 * cache/cache.h KILN_CACHE_STATS) have a type and a # HELP text in the table
 * below; a key a newer kilnd adds is exported too, typed by its name (see
 * guess_gauge; a boolean or a negative value is a gauge) with a generic
 * help text. Values that are not numbers (strings, arrays, nil) are
 * skipped; booleans are 0 or 1.
 *
 * Needs only protocol/ (for msgpack_object) and libc: kilnd's metrics
 * listener links it as well. Pure function: no globals, any thread.
 */
#include "clients/libkiln/kiln.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 256 /* longer paths are cut (never in kilnd's map) */
#define MAX_DEPTH    8	 /* deeper maps are not exported */

/* ---- output buffer ------------------------------------------------------ */

typedef struct outbuf {
	char *p;
	size_t len, cap;
	int err;      /* sticky: -ENOMEM */
	char **names; /* the families written so far (n_names) */
	size_t n_names, cap_names;
} outbuf_t;

static void ob_grow(outbuf_t *o, size_t more)
{
	if (o->err != 0 || o->len + more + 1 <= o->cap)
		return;
	size_t cap = o->cap ? o->cap : 4096;
	while (cap < o->len + more + 1)
		cap *= 2;
	char *p = realloc(o->p, cap);
	if (p == NULL) {
		o->err = -ENOMEM;
		return;
	}
	o->p = p;
	o->cap = cap;
}

static void ob_put(outbuf_t *o, const char *s, size_t n)
{
	ob_grow(o, n);
	if (o->err != 0)
		return;
	memcpy(o->p + o->len, s, n);
	o->len += n;
	o->p[o->len] = '\0';
}

static void ob_puts(outbuf_t *o, const char *s)
{
	ob_put(o, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void
ob_printf(outbuf_t *o, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(small)) {
		ob_put(o, small, (size_t)n);
		return;
	}
	ob_grow(o, (size_t)n);
	if (o->err != 0)
		return;
	va_start(ap, fmt);
	vsnprintf(o->p + o->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	o->len += (size_t)n;
}

/* ---- what the stats map holds ------------------------------------------- */

typedef enum { COUNTER, GAUGE } mtype_t;

typedef struct known {
	const char *path; /* dotted; "requests.*": every key of that map */
	mtype_t type;
	const char *help;
} known_t;

/* clang-format off */
static const known_t KNOWN[] = {
	{"uptime_s", GAUGE, "Seconds since kilnd started."},
	{"rss_bytes", GAUGE, "Resident set size of kilnd, in bytes."},
	{"connections.current", GAUGE, "Client connections open now."},
	{"connections.total", COUNTER, "Client connections accepted."},
	{"connections.rejected", COUNTER,
	 "Connections refused over max_connections."},
	{"connections.idle_closed", COUNTER,
	 "Connections closed after idle_timeout_s."},
	{"requests.*", COUNTER, "Requests received, by op."},
	{"hits.*", COUNTER,
	 "Artifacts served without compiling, by where they came from."},
	{"compiled", COUNTER, "Compiles run (requests answered \"compiled\")."},
	{"joined", COUNTER,
	 "Requests that joined a compile already running for another."},
	{"failed", COUNTER, "Compiles that failed."},
	{"timeouts", COUNTER,
	 "Requests answered timeout after compile_timeout_s."},
	{"busy", COUNTER, "Requests answered busy (queue or in-flight limit)."},
	{"bad_frames", COUNTER, "Malformed frames (connection closed)."},
	{"read_paused", COUNTER,
	 "Times reading from a client stopped over max_pending_write_bytes."},
	{"store_put_errors", COUNTER,
	 "Compiled artifacts the store failed to keep (kilnd's count)."},
	{"dynamic.compiles", COUNTER,
	 "Generalized (dynamic-shape) graphs compiled."},
	{"dynamic.hits", COUNTER,
	 "Static requests served by a generalized graph."},
	{"dynamic.refused", COUNTER,
	 "Generalized graphs that failed and fell back to static."},
	{"queue.depth", GAUGE, "Compile jobs waiting in the queue."},
	{"queue.max", GAUGE, "Queue depth beyond which clients get busy."},
	{"queue.in_flight", GAUGE,
	 "Compile jobs in flight (queued or running)."},
	{"workers.busy", GAUGE, "Compile workers compiling now."},
	{"workers.total", GAUGE, "Compile workers configured."},
	{"workers.processes", GAUGE, "kiln-compile-worker processes alive."},
	{"workers.spawns", COUNTER, "kiln-compile-worker processes started."},
	{"workers.crashes", COUNTER,
	 "kiln-compile-worker processes that died during a compile."},
	{"compile_ms.*", GAUGE,
	 "Compile time in milliseconds over the last 1024 compiles."},
	{"hot.entries", GAUGE, "Artifacts in the in-memory hot map."},
	{"hot.bytes", GAUGE, "Bytes of artifacts in the hot map."},
	{"hot.max_bytes", GAUGE, "Hot map size limit (hot_bytes)."},
	/* cache/cache.h KILN_CACHE_STATS; tests/unit/metrics/test_metrics.c
	 * checks that this list follows it. */
	{"store.entries", GAUGE, "Entries in the store's index."},
	{"store.blobs", GAUGE, "Distinct blob files in the store."},
	{"store.bytes", GAUGE, "Bytes of blob files in the store."},
	{"store.max_bytes", GAUGE, "Store size limit in effect."},
	{"store.min_free_bytes", GAUGE,
	 "Free-space watermark the store keeps on its filesystem."},
	{"store.fs_free_bytes", GAUGE, "Free bytes on the store's filesystem."},
	{"store.index_bytes", GAUGE,
	 "Bytes of the store's SQLite index, WAL included."},
	{"store.hits", COUNTER, "Store reads that returned verified bytes."},
	{"store.misses", COUNTER, "Store reads that found no usable entry."},
	{"store.puts", COUNTER, "Entries stored."},
	{"store.put_errors", COUNTER, "Store puts that failed."},
	{"store.dedup_puts", COUNTER, "Puts whose bytes were already a blob."},
	{"store.evictions", COUNTER, "Entries evicted (gc or evict)."},
	{"store.evicted_bytes", COUNTER, "Blob bytes removed by eviction."},
	{"store.gc_runs", COUNTER, "Store gc passes."},
	{"store.corrupt_dropped", COUNTER,
	 "Entries dropped: blob missing or hash mismatch."},
	{"store.checksums_repaired", COUNTER,
	 "Blob checksums in the index found wrong for good bytes, rewritten."},
	{"store.touch_flushes", COUNTER, "Batched last_used writes."},
	{"store.touch_dropped", COUNTER,
	 "Hits whose last_used write failed (disk full)."},
	{"store.orphan_blobs", COUNTER,
	 "Blob files without an index row, removed at open."},
	{"store.temp_removed", COUNTER, "Leftover temp files removed at open."},
	{"store.rebuilds", COUNTER, "Index rebuilt from the blobs at open."},
	{"errors.*", COUNTER, "Error replies, by error code."},
};
/* clang-format on */

/* Keys named by another path: kilnd's store_put_errors would clash with
 * the store's put_errors (kiln_store_put_errors_total). */
static const struct {
	const char *path, *as;
} RENAMED[] = {
    {"store_put_errors", "artifacts_unstored"},
};

/* The maps whose keys are a label of one metric, and the label's name. */
static const struct {
	const char *path;
	const char *label;
} LABELED[] = {
    {"requests", "op"},
    {"hits", "source"},
    {"errors", "code"},
    {"compile_ms", "quantile"},
};

static const known_t *find_known(const char *path)
{
	for (size_t i = 0; i < sizeof(KNOWN) / sizeof(KNOWN[0]); i++)
		if (strcmp(KNOWN[i].path, path) == 0)
			return &KNOWN[i];
	return NULL;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && strcmp(s + n - m, suf) == 0;
}

static bool word_in(const char *s, const char *w)
{
	/* w as a whole '_'-separated word of s */
	size_t m = strlen(w);
	for (const char *p = s; (p = strstr(p, w)) != NULL; p++) {
		bool start = p == s || p[-1] == '_' || p[-1] == '.';
		bool end = p[m] == '\0' || p[m] == '_' || p[m] == '.';
		if (start && end)
			return true;
	}
	return false;
}

/*
 * The type of a key kilnd added after this table: current values are
 * gauges (current, bytes, size, depth, busy, rss, uptime, max, entries,
 * processes, in_flight, free, a quantile pNN, *_s, *_ms), everything else
 * counts events.
 */
static bool guess_gauge(const char *path)
{
	static const char *const GAUGE_WORDS[] = {
	    "current", "bytes", "size",	 "depth",     "busy",	   "rss",
	    "uptime",  "max",	"min",	 "entries",   "processes", "in_flight",
	    "free",    "open",	"alive", "connected", "ratio",	   "percent",
	};
	const char *leaf = strrchr(path, '.');
	leaf = leaf != NULL ? leaf + 1 : path;
	for (size_t i = 0; i < sizeof(GAUGE_WORDS) / sizeof(GAUGE_WORDS[0]);
	     i++)
		if (word_in(leaf, GAUGE_WORDS[i]))
			return true;
	if (leaf[0] == 'p' && leaf[1] >= '0' && leaf[1] <= '9')
		return true;
	return ends_with(leaf, "_s") || ends_with(leaf, "_ms");
}

/* ---- names, labels, values ---------------------------------------------- */

/* Appends s[0..n) to name[*len..], '.' and anything outside
 * [a-zA-Z0-9_] as '_'. */
static void name_append(char *name, size_t *len, const char *s, size_t n)
{
	for (size_t i = 0; i < n && *len + 1 < NAME_MAX_LEN; i++) {
		char ch = s[i];
		bool okc = (ch >= 'a' && ch <= 'z') ||
			   (ch >= 'A' && ch <= 'Z') ||
			   (ch >= '0' && ch <= '9') || ch == '_';
		name[(*len)++] = okc ? ch : '_';
	}
	name[*len] = '\0';
}

/* The metric name of a dotted path: kiln_<path>, with _total for counters
 * (unless the path already ends in "total"; a gauge drops a trailing
 * "total"). */
static void metric_name(const char *path, mtype_t t, char name[NAME_MAX_LEN])
{
	size_t len = 0;
	name_append(name, &len, "kiln_", 5);
	size_t plen = strlen(path);
	bool last_total =
	    plen >= 5 && strcmp(path + plen - 5, "total") == 0 &&
	    (plen == 5 || path[plen - 6] == '.' || path[plen - 6] == '_');
	if (t == GAUGE && last_total && plen > 5)
		plen -= 6; /* "workers.total" -> kiln_workers */
	name_append(name, &len, path, plen);
	if (t == COUNTER && !last_total)
		name_append(name, &len, "_total", 6);
}

/* A label value with \, " and newline escaped (text format 0.0.4). */
static void put_label_value(outbuf_t *o, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\\')
			ob_puts(o, "\\\\");
		else if (s[i] == '"')
			ob_puts(o, "\\\"");
		else if (s[i] == '\n')
			ob_puts(o, "\\n");
		else
			ob_put(o, &s[i], 1);
	}
}

static void put_help(outbuf_t *o, const char *name, const char *help)
{
	ob_printf(o, "# HELP %s ", name);
	for (const char *p = help; *p != '\0'; p++) {
		if (*p == '\\')
			ob_puts(o, "\\\\");
		else if (*p == '\n')
			ob_puts(o, "\\n");
		else
			ob_put(o, p, 1);
	}
	ob_puts(o, "\n");
}

static void put_head(outbuf_t *o, const char *name, mtype_t t, const char *help)
{
	put_help(o, name, help);
	ob_printf(o, "# TYPE %s %s\n", name,
		  t == COUNTER ? "counter" : "gauge");
}

/* The shortest decimal form of d that reads back as d. */
static void put_double(outbuf_t *o, double d)
{
	if (isnan(d)) {
		ob_puts(o, "NaN");
		return;
	}
	if (isinf(d)) {
		ob_puts(o, d > 0 ? "+Inf" : "-Inf");
		return;
	}
	char buf[40];
	if (d == floor(d) && fabs(d) < 1e15) { /* 120, not 1.2e+02 */
		snprintf(buf, sizeof(buf), "%.0f", d);
		ob_puts(o, buf);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	ob_puts(o, buf);
}

static bool is_number(const msgpack_object *v)
{
	return v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
	       v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
	       v->type == MSGPACK_OBJECT_FLOAT32 ||
	       v->type == MSGPACK_OBJECT_FLOAT64 ||
	       v->type == MSGPACK_OBJECT_BOOLEAN;
}

static void put_value(outbuf_t *o, const msgpack_object *v)
{
	switch (v->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		ob_printf(o, "%" PRIu64, v->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		ob_printf(o, "%" PRId64, v->via.i64);
		break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: put_double(o, v->via.f64); break;
	case MSGPACK_OBJECT_BOOLEAN:
		ob_puts(o, v->via.boolean ? "1" : "0");
		break;
	default: ob_puts(o, "NaN"); break;
	}
	ob_puts(o, "\n");
}

/* "p50" -> "0.5", "p99" -> "0.99", "p999" -> "0.999"; other keys as they
 * are. */
static void quantile_label(const char *k, size_t n, char *out, size_t outn)
{
	bool digits = n >= 2 && k[0] == 'p';
	for (size_t i = 1; digits && i < n; i++)
		digits = k[i] >= '0' && k[i] <= '9';
	if (!digits) {
		snprintf(out, outn, "%.*s", (int)n, k);
		return;
	}
	size_t e = n; /* drop trailing zeros: p50 -> 0.5 */
	while (e > 2 && k[e - 1] == '0')
		e--;
	if (e == 2 && k[1] == '0')
		snprintf(out, outn, "0");
	else
		snprintf(out, outn, "0.%.*s", (int)(e - 1), k + 1);
}

/* ---- the walk ----------------------------------------------------------- */

/* Records a family's name; false when it was written already (a key of a
 * newer kilnd whose name clashes): the exposition must not repeat it. */
static bool claim(outbuf_t *o, const char *name)
{
	for (size_t i = 0; i < o->n_names; i++)
		if (strcmp(o->names[i], name) == 0)
			return false;
	if (o->n_names == o->cap_names) {
		size_t cap = o->cap_names ? 2 * o->cap_names : 64;
		char **n = realloc(o->names, cap * sizeof(*n));
		if (n == NULL) {
			o->err = -ENOMEM;
			return false;
		}
		o->names = n;
		o->cap_names = cap;
	}
	if ((o->names[o->n_names] = strdup(name)) == NULL) {
		o->err = -ENOMEM;
		return false;
	}
	o->n_names++;
	return true;
}

static const char *labeled_name(const char *path)
{
	for (size_t i = 0; i < sizeof(LABELED) / sizeof(LABELED[0]); i++)
		if (strcmp(LABELED[i].path, path) == 0)
			return LABELED[i].label;
	return NULL;
}

/* One map of LABELED: one family, a sample per numeric key. */
static void emit_labeled(outbuf_t *o, const char *path, const char *label,
			 const msgpack_object *map)
{
	char kp[NAME_MAX_LEN + 2];
	snprintf(kp, sizeof(kp), "%s.*", path);
	const known_t *k = find_known(kp);
	mtype_t t = k != NULL ? k->type : guess_gauge(path) ? GAUGE : COUNTER;
	char name[NAME_MAX_LEN];
	metric_name(path, t, name);
	if (!claim(o, name))
		return;
	char help[NAME_MAX_LEN + 64];
	snprintf(help, sizeof(help), "kilnd status %s, by %s.", path, label);
	put_head(o, name, t, k != NULL ? k->help : help);
	const msgpack_object_kv *kv = map->via.map.ptr;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *key = &kv[i].key;
		if (key->type != MSGPACK_OBJECT_STR || !is_number(&kv[i].val))
			continue;
		char q[64];
		const char *lv = key->via.str.ptr;
		size_t ln = key->via.str.size;
		if (strcmp(label, "quantile") == 0) {
			quantile_label(lv, ln, q, sizeof(q));
			lv = q;
			ln = strlen(q);
		}
		ob_printf(o, "%s{%s=\"", name, label);
		put_label_value(o, lv, ln);
		ob_puts(o, "\"} ");
		put_value(o, &kv[i].val);
	}
}

static void emit_plain(outbuf_t *o, const char *path, const msgpack_object *v)
{
	const known_t *k = find_known(path);
	/* a flag or a negative value is a state, never a count */
	bool state = v->type == MSGPACK_OBJECT_BOOLEAN ||
		     v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
	mtype_t t = k != NULL			 ? k->type
		    : state || guess_gauge(path) ? GAUGE
						 : COUNTER;
	char name[NAME_MAX_LEN];
	const char *as = path;
	for (size_t i = 0; i < sizeof(RENAMED) / sizeof(RENAMED[0]); i++)
		if (strcmp(RENAMED[i].path, path) == 0)
			as = RENAMED[i].as;
	metric_name(as, t, name);
	if (!claim(o, name))
		return;
	char help[NAME_MAX_LEN + 32];
	snprintf(help, sizeof(help), "kilnd status %s.", path);
	put_head(o, name, t, k != NULL ? k->help : help);
	ob_printf(o, "%s ", name);
	put_value(o, v);
}

static void walk(outbuf_t *o, const msgpack_object *map, const char *prefix,
		 int depth)
{
	const msgpack_object_kv *kv = map->via.map.ptr;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *key = &kv[i].key;
		const msgpack_object *v = &kv[i].val;
		if (key->type != MSGPACK_OBJECT_STR || key->via.str.size == 0)
			continue;
		char path[NAME_MAX_LEN];
		int n = snprintf(path, sizeof(path), "%s%s%.*s", prefix,
				 prefix[0] != '\0' ? "." : "",
				 (int)key->via.str.size, key->via.str.ptr);
		if (n < 0 || (size_t)n >= sizeof(path))
			continue;
		if (v->type == MSGPACK_OBJECT_MAP) {
			const char *label = labeled_name(path);
			if (label != NULL)
				emit_labeled(o, path, label, v);
			else if (depth + 1 < MAX_DEPTH)
				walk(o, v, path, depth + 1);
		} else if (is_number(v)) {
			emit_plain(o, path, v);
		}
	}
}

int kiln_metrics_format(const msgpack_object *stats, char **out, size_t *len)
{
	if (out == NULL)
		return -EINVAL;
	*out = NULL;
	if (len != NULL)
		*len = 0;
	if (stats == NULL || stats->type != MSGPACK_OBJECT_MAP)
		return -EINVAL;
	outbuf_t o = {0};
	ob_grow(&o, 0); /* an empty map still yields "" */
	if (o.p != NULL)
		o.p[0] = '\0';
	walk(&o, stats, "", 0);
	for (size_t i = 0; i < o.n_names; i++)
		free(o.names[i]);
	free(o.names);
	if (o.err != 0) {
		free(o.p);
		return o.err;
	}
	*out = o.p;
	if (len != NULL)
		*len = o.len;
	return 0;
}
