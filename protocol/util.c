/*
 * util.c — error names, logging, limits: the small shared pieces of
 * protocol/.
 *
 * Invariants: the tables are immutable; kiln_log_level is written once at
 * start-up before threads exist. Any thread may call anything here.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kiln_log_level = KILN_LOG_INFO;

const char *kiln_strerror(int err)
{
	switch (err) {
	case 0: return "success";
#define KILN__ERR_TEXT(name, val, wire, text)                                  \
	case (val): return text;
		KILN_ERRNO_MAP(KILN__ERR_TEXT)
#undef KILN__ERR_TEXT
	default: break;
	}
	if (err < 0 && err > -4096) {
		/* strerror() is not thread-safe in general; glibc returns
		 * static strings for known codes, which is all we need. */
		return strerror(-err);
	}
	return "unknown error";
}

const char *kiln_err_wire_name(int err)
{
	switch (err) {
#define KILN__ERR_WIRE(name, val, wire, text)                                  \
	case (val): return wire;
		KILN_ERRNO_MAP(KILN__ERR_WIRE)
#undef KILN__ERR_WIRE
	default: return "internal";
	}
}

int kiln_err_from_wire_name(const char *name, size_t len)
{
#define KILN__ERR_FROM(ename, val, wire, text)                                 \
	if (len == sizeof(wire) - 1 && memcmp(name, wire, len) == 0)           \
		return (val);
	KILN_ERRNO_MAP(KILN__ERR_FROM)
#undef KILN__ERR_FROM
	return 0;
}

int kiln_default_socket(char *out, size_t n)
{
	const char *e = getenv("KILN_SOCKET");
	int k;
	if (e != NULL && e[0] != '\0')
		k = snprintf(out, n, "%s", e);
	else if (geteuid() == 0)
		k = snprintf(out, n, "/run/kiln/kilnd.sock");
	else if ((e = getenv("XDG_RUNTIME_DIR")) != NULL && e[0] != '\0')
		k = snprintf(out, n, "%s/kiln/kilnd.sock", e);
	else
		k = snprintf(out, n, "/tmp/kiln-%u/kilnd.sock",
			     (unsigned)geteuid());
	return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

int kiln__errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err != NULL && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

void kiln__log(int level, const char *fmt, ...)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	char line[2048];
	int n = snprintf(line, sizeof(line), "level=%s ",
			 names[level < 0 ? 0 : (level > 3 ? 3 : level)]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	/* One write per line so concurrent threads do not interleave. */
	fwrite(line, 1, len, stderr);
}

void kiln_limits_default(kiln_limits_t *lim)
{
	lim->max_frame_bytes = (size_t)64 << 20;
	lim->max_depth = 24;
	lim->max_objects = 4u << 20;
	lim->max_nodes = 100000;
	lim->max_values = 1u << 20;
	lim->max_rank = 12;
	lim->max_str_bytes = 4096;
	lim->max_symbols = 1024;
	lim->max_expr_nodes = 64;
}

static const char *const dtype_names[] = {
#define KILN__DT_NAME(name, str, size) str,
    KILN_DTYPE_MAP(KILN__DT_NAME)
#undef KILN__DT_NAME
};
static const uint8_t dtype_sizes[] = {
#define KILN__DT_SIZE(name, str, size) size,
    KILN_DTYPE_MAP(KILN__DT_SIZE)
#undef KILN__DT_SIZE
};

const char *kiln_dtype_name(kiln_dtype_t dt)
{
	return (unsigned)dt < KILN_DT__COUNT ? dtype_names[dt] : NULL;
}

int kiln_dtype_from_name(const char *s, size_t len)
{
	for (int i = 0; i < KILN_DT__COUNT; i++)
		if (strlen(dtype_names[i]) == len &&
		    memcmp(dtype_names[i], s, len) == 0)
			return i;
	return -1;
}

size_t kiln_dtype_size(kiln_dtype_t dt)
{
	return (unsigned)dt < KILN_DT__COUNT ? dtype_sizes[dt] : 0;
}

bool kiln_dtype_is_float(kiln_dtype_t dt)
{
	return dt == KILN_DT_F32 || dt == KILN_DT_F64 || dt == KILN_DT_F16 ||
	       dt == KILN_DT_BF16;
}
