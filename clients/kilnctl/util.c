/*
 * util.c — kilnctl's small helpers: one-line messages, option values
 * (durations, sizes), human formatting (bytes, durations, times), msgpack
 * to JSON, and reading fields of a reply map by dotted path. No state; one
 * thread.
 */
#include "clients/kilnctl/kilnctl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ======================================================================== */
/* Messages                                                                  */
/* ======================================================================== */

void ctl_errmsg(const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* one line: newlines in a daemon's message become spaces */
	for (char *p = line; *p != '\0'; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	fprintf(stderr, "kilnctl: %s\n", line);
}

int ctl_usage_error(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "kilnctl: %s (kilnctl --help)\n", line);
	return EX_USAGE;
}

/* ======================================================================== */
/* Parsing values                                                            */
/* ======================================================================== */

/*
 * If argv[*i] is the option `name` ("--limit"): its value is the text after
 * '=' or the next argument (consumed). Returns 1 (found, *val set), 0 (not
 * this option), -1 (found, value missing: a usage error was printed).
 */
int ctl_opt_value(int argc, char **argv, int *i, const char *name,
		  const char **val)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n) != 0)
		return 0;
	if (a[n] == '=') {
		*val = a + n + 1;
		return 1;
	}
	if (a[n] != '\0')
		return 0;
	if (*i + 1 >= argc) {
		ctl_usage_error("%s needs a value", name);
		return -1;
	}
	*val = argv[++*i];
	return 1;
}

bool ctl_parse_u64(const char *s, uint64_t *out)
{
	if (s == NULL || *s == '\0' || *s == '-' || *s == '+')
		return false;
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return false;
	*out = v;
	return true;
}

bool ctl_parse_seconds(const char *s, double *out)
{
	if (s == NULL || *s == '\0')
		return false;
	errno = 0;
	char *end;
	double v = strtod(s, &end);
	if (errno != 0 || *end != '\0' || !(v > 0) || v > 86400.0 * 365)
		return false;
	*out = v;
	return true;
}

/* "90", "45s", "30m", "2h", "7d", "1w", "1h30m" -> seconds. */
bool ctl_parse_duration(const char *s, uint64_t *out)
{
	uint64_t total = 0;
	if (s == NULL || *s == '\0')
		return false;
	while (*s != '\0') {
		if (*s < '0' || *s > '9')
			return false;
		errno = 0;
		char *end;
		unsigned long long v = strtoull(s, &end, 10);
		if (errno != 0)
			return false;
		uint64_t mul = 1;
		switch (*end) {
		case '\0': mul = 1; break;
		case 's': mul = 1; break;
		case 'm': mul = 60; break;
		case 'h': mul = 3600; break;
		case 'd': mul = 86400; break;
		case 'w': mul = 7 * 86400; break;
		default: return false;
		}
		if (v > (UINT64_MAX - total) / mul)
			return false;
		total += v * mul;
		s = *end != '\0' ? end + 1 : end;
	}
	*out = total;
	return true;
}

/* "1048576", "500M", "1.5G", "64MiB", "2T" -> bytes (powers of 1024). */
bool ctl_parse_size(const char *s, uint64_t *out)
{
	if (s == NULL || *s < '0' || *s > '9')
		return false;
	errno = 0;
	char *end;
	double v = strtod(s, &end);
	if (errno != 0 || !(v >= 0))
		return false;
	double mul = 1;
	switch (*end) {
	case '\0': break;
	case 'k':
	case 'K': mul = 1024.0, end++; break;
	case 'M': mul = 1024.0 * 1024, end++; break;
	case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
	case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
	case 'B': break;
	default: return false;
	}
	if (strcmp(end, "iB") == 0 && mul > 1)
		end += 2;
	else if (strcmp(end, "B") == 0)
		end += 1;
	if (*end != '\0' || v * mul >= 18446744073709551615.0)
		return false;
	*out = (uint64_t)(v * mul);
	return true;
}

/* ======================================================================== */
/* Formatting                                                                */
/* ======================================================================== */

/* "512 B", "12.3 KiB", "1.2 GiB". */
const char *ctl_fmt_bytes(uint64_t b, char *buf, size_t n)
{
	static const char *const U[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
	if (b < 1024) {
		snprintf(buf, n, "%" PRIu64 " B", b);
		return buf;
	}
	double v = (double)b / 1024;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, n, "%.1f %s", v, U[u]);
	return buf;
}

/* "41s", "12m 05s", "3h 02m", "5d 03h". */
const char *ctl_fmt_duration(double secs, char *buf, size_t n)
{
	uint64_t s = secs > 0 ? (uint64_t)secs : 0;
	if (s < 60)
		snprintf(buf, n, "%" PRIu64 "s", s);
	else if (s < 3600)
		snprintf(buf, n, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, n, "%" PRIu64 "h %02" PRIu64 "m", s / 3600,
			 s / 60 % 60);
	else
		snprintf(buf, n, "%" PRIu64 "d %02" PRIu64 "h", s / 86400,
			 s / 3600 % 24);
	return buf;
}

/* "0.42 ms", "41.7 ms", "1.25 s". */
const char *ctl_fmt_ms(double ms, char *buf, size_t n)
{
	if (ms < 10)
		snprintf(buf, n, "%.2f ms", ms);
	else if (ms < 1000)
		snprintf(buf, n, "%.1f ms", ms);
	else
		snprintf(buf, n, "%.2f s", ms / 1000);
	return buf;
}

const char *ctl_fmt_time(uint64_t unix_s, char *buf, size_t n)
{
	time_t t = (time_t)unix_s;
	struct tm tm;
	if (unix_s == 0 || localtime_r(&t, &tm) == NULL)
		snprintf(buf, n, "-");
	else
		strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
	return buf;
}

/* The shortest decimal form of d that reads back as d. */
static void put_double(FILE *f, double d)
{
	char buf[40];
	if (d == floor(d) && fabs(d) < 1e15) { /* 120, not 1.2e+02 */
		snprintf(buf, sizeof(buf), "%.0f", d);
		fputs(buf, f);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	fputs(buf, f);
}

/* ---- msgpack -> JSON ---------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;
	if (s[0] < 0x80)
		return 1;
	if ((s[0] & 0xe0) == 0xc0)
		len = 2, cp = s[0] & 0x1f;
	else if ((s[0] & 0xf0) == 0xe0)
		len = 3, cp = s[0] & 0x0f;
	else if ((s[0] & 0xf8) == 0xf0)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	static const uint32_t MIN[] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < MIN[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static void json_str(FILE *f, const char *p, size_t n)
{
	const unsigned char *s = (const unsigned char *)p;
	fputc('"', f);
	for (size_t i = 0; i < n;) {
		unsigned char ch = s[i];
		if (ch == '"' || ch == '\\') {
			fputc('\\', f);
			fputc(ch, f);
			i++;
		} else if (ch == '\n') {
			fputs("\\n", f), i++;
		} else if (ch == '\t') {
			fputs("\\t", f), i++;
		} else if (ch < 0x20 || ch == 0x7f) {
			fprintf(f, "\\u%04x", ch), i++;
		} else {
			size_t l = utf8_len(s + i, n - i);
			if (l == 0) {
				fputs("\\ufffd", f), i++;
			} else {
				fwrite(s + i, 1, l, f);
				i += l;
			}
		}
	}
	fputc('"', f);
}

static void json_indent(FILE *f, int indent)
{
	if (indent < 0)
		return;
	fputc('\n', f);
	for (int i = 0; i < indent; i++)
		fputs("  ", f);
}

/* Writes o as JSON; indent < 0: one line. Binary data as a hex string;
 * NaN, infinities and ext values as null. */
void ctl_json_write(FILE *f, const msgpack_object *o, int indent)
{
	int in = indent < 0 ? -1 : indent + 1;
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: fputs("null", f); break;
	case MSGPACK_OBJECT_BOOLEAN:
		fputs(o->via.boolean ? "true" : "false", f);
		break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		fprintf(f, "%" PRIu64, o->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		fprintf(f, "%" PRId64, o->via.i64);
		break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		if (isfinite(o->via.f64))
			put_double(f, o->via.f64);
		else
			fputs("null", f);
		break;
	case MSGPACK_OBJECT_STR:
		json_str(f, o->via.str.ptr, o->via.str.size);
		break;
	case MSGPACK_OBJECT_BIN:
		fputc('"', f);
		for (uint32_t i = 0; i < o->via.bin.size; i++)
			fprintf(f, "%02x", (unsigned char)o->via.bin.ptr[i]);
		fputc('"', f);
		break;
	case MSGPACK_OBJECT_ARRAY:
		fputc('[', f);
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			if (i > 0)
				fputc(indent < 0 ? ',' : ',', f);
			json_indent(f, in);
			ctl_json_write(f, &o->via.array.ptr[i], in);
		}
		if (o->via.array.size > 0)
			json_indent(f, indent);
		fputc(']', f);
		break;
	case MSGPACK_OBJECT_MAP:
		fputc('{', f);
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			const msgpack_object *k = &o->via.map.ptr[i].key;
			if (i > 0)
				fputc(',', f);
			json_indent(f, in);
			if (k->type == MSGPACK_OBJECT_STR) {
				json_str(f, k->via.str.ptr, k->via.str.size);
			} else if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
				fprintf(f, "\"%" PRIu64 "\"", k->via.u64);
			} else if (k->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
				fprintf(f, "\"%" PRId64 "\"", k->via.i64);
			} else {
				fprintf(f, "\"#%u\"", i);
			}
			fputs(indent < 0 ? ":" : ": ", f);
			ctl_json_write(f, &o->via.map.ptr[i].val, in);
		}
		if (o->via.map.size > 0)
			json_indent(f, indent);
		fputc('}', f);
		break;
	default: fputs("null", f); break;
	}
}

/* The reply map without its envelope (v, id, ok), as JSON. */
void ctl_json_reply(FILE *f, const msgpack_object *map, bool one_line)
{
	int indent = one_line ? -1 : 0;
	fputc('{', f);
	bool first = true;
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type != MSGPACK_OBJECT_STR || kiln_obj_streq(k, "v") ||
		    kiln_obj_streq(k, "id") || kiln_obj_streq(k, "ok"))
			continue;
		if (!first)
			fputc(',', f);
		first = false;
		json_indent(f, one_line ? -1 : 1);
		json_str(f, k->via.str.ptr, k->via.str.size);
		fputs(one_line ? ":" : ": ", f);
		ctl_json_write(f, &map->via.map.ptr[i].val, one_line ? -1 : 1);
	}
	if (!first)
		json_indent(f, indent);
	fputs("}\n", f);
}

/* ---- reading the reply maps --------------------------------------------- */

/* The object at a dotted path ("connections.current"), or NULL. */
const msgpack_object *ctl_mget(const msgpack_object *m, const char *path)
{
	char key[64];
	while (m != NULL && m->type == MSGPACK_OBJECT_MAP) {
		size_t n = strcspn(path, ".");
		if (n >= sizeof(key))
			return NULL;
		memcpy(key, path, n);
		key[n] = '\0';
		m = kiln_map_get(m, key);
		if (path[n] == '\0')
			return m;
		path += n + 1;
	}
	return NULL;
}

double ctl_num(const msgpack_object *m, const char *path)
{
	const msgpack_object *o = ctl_mget(m, path);
	if (o == NULL)
		return 0;
	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return (double)o->via.u64;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return (double)o->via.i64;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: return o->via.f64;
	case MSGPACK_OBJECT_BOOLEAN: return o->via.boolean;
	default: return 0;
	}
}

uint64_t ctl_u64(const msgpack_object *m, const char *path)
{
	const msgpack_object *o = ctl_mget(m, path);
	if (o != NULL && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		return o->via.u64;
	double d = ctl_num(m, path);
	return d > 0 ? (uint64_t)d : 0;
}

/* A str field into buf (NUL-terminated), "" when absent. */
const char *ctl_str(const msgpack_object *m, const char *path, char *buf,
		    size_t n)
{
	const msgpack_object *o = ctl_mget(m, path);
	buf[0] = '\0';
	if (o != NULL && o->type == MSGPACK_OBJECT_STR)
		snprintf(buf, n, "%.*s", (int)o->via.str.size, o->via.str.ptr);
	return buf;
}

bool ctl_exists(const char *path, int *err)
{
	struct stat st;
	if (lstat(path, &st) == 0)
		return true;
	*err = errno;
	return false;
}

const char *ctl_plural(uint64_t n, const char *one, const char *other)
{
	return n == 1 ? one : other;
}
