/*
 * helpers.h — shared helpers for the protocol/ unit tests: build msgpack
 * inputs from a compact text notation, decode graphs from it, and assert on
 * error codes and messages.
 *
 * Text notation ("mp text"): JSON-like, with single- or double-quoted
 * strings (escapes \\ \' \" \n \0), null/nil, true/false, ints (any size
 * that fits int64/uint64), floats (a '.', 'e' or 'E' makes a float64), inf,
 * -inf, nan, and forced encodings that msgpack-c's packer never produces:
 *   i64(N) -> 0xd3 + 8 bytes     u64(N) -> 0xcf + 8 bytes
 *   i32(N) -> 0xd2 + 4 bytes     u8(N)  -> 0xcc + 1 byte
 *   f32(X) -> 0xca float32       f64(X) -> 0xcb float64
 *   bin('..') -> bin8            ext(T, '..') -> ext8 of type T
 * Map keys may repeat (the packer writes what the text says).
 *
 * Every function is static and only used by some test files.
 */
#ifndef KILN_TEST_PROTOCOL_HELPERS_H
#define KILN_TEST_PROTOCOL_HELPERS_H

#include "protocol/protocol.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HELPER __attribute__((unused)) static

typedef struct mpt {
	const char *s, *start;
	msgpack_sbuffer *sb;
	msgpack_packer pk;
} mpt_t;

__attribute__((noreturn)) HELPER void mpt_fail(const mpt_t *p, const char *why)
{
	cr_assert_fail("bad mp text: %s at offset %d of \"%s\"", why,
		       (int)(p->s - p->start), p->start);
	abort(); /* not reached */
}

HELPER void mpt_ws(mpt_t *p)
{
	while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n')
		p->s++;
}

HELPER void mpt_expect(mpt_t *p, char c)
{
	mpt_ws(p);
	if (*p->s != c) {
		char why[32];
		snprintf(why, sizeof(why), "expected '%c'", c);
		mpt_fail(p, why);
	}
	p->s++;
}

/* Counts the comma-separated items of a container; s is just past the
 * opening bracket. */
HELPER uint32_t mpt_count(const char *s)
{
	uint32_t n = 0;
	int depth = 0;
	bool any = false;
	for (; *s != '\0'; s++) {
		char c = *s;
		if (c == '\'' || c == '"') {
			any = true;
			for (s++; *s != '\0' && *s != c; s++)
				if (*s == '\\' && s[1] != '\0')
					s++;
			if (*s == '\0')
				break;
			continue;
		}
		if (c == '[' || c == '{' || c == '(') {
			depth++;
			any = true;
		} else if (c == ']' || c == '}' || c == ')') {
			if (depth == 0)
				break;
			depth--;
		} else if (c == ',' && depth == 0) {
			n++;
		} else if (c != ' ' && c != '\t' && c != '\n') {
			any = true;
		}
	}
	return any ? n + 1 : 0;
}

/* Reads a quoted string into a malloc'd buffer; *len gets its length. */
HELPER char *mpt_string(mpt_t *p, size_t *len)
{
	char q = *p->s++;
	char *buf = malloc(strlen(p->s) + 1);
	cr_assert_not_null(buf);
	size_t n = 0;
	while (*p->s != q) {
		if (*p->s == '\0') {
			free(buf);
			mpt_fail(p, "unterminated string");
		}
		char c = *p->s++;
		if (c == '\\') {
			c = *p->s++;
			switch (c) {
			case 'n': c = '\n'; break;
			case '0': c = '\0'; break;
			case '\\':
			case '\'':
			case '"': break;
			default: free(buf); mpt_fail(p, "bad escape");
			}
		}
		buf[n++] = c;
	}
	p->s++;
	*len = n;
	return buf;
}

HELPER void mpt_raw(mpt_t *p, uint8_t tag, uint64_t v, int bytes)
{
	uint8_t b[9];
	b[0] = tag;
	for (int i = 0; i < bytes; i++)
		b[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
	msgpack_sbuffer_write(p->sb, (const char *)b, (size_t)bytes + 1);
}

HELPER void mpt_value(mpt_t *p);

/* Reads a number token: a float (*is_float) in *f, else a negative int in
 * *i or a non-negative one in *u (*is_neg says which). */
HELPER void mpt_number(mpt_t *p, bool *is_float, int64_t *i, uint64_t *u,
		       double *f, bool *is_neg)
{
	mpt_ws(p);
	const char *b = p->s;
	*is_neg = *b == '-';
	if (*p->s == '-' || *p->s == '+')
		p->s++;
	if (strncmp(p->s, "inf", 3) == 0) {
		p->s += 3;
		*is_float = true;
		*f = *b == '-' ? -INFINITY : INFINITY;
		return;
	}
	if (strncmp(p->s, "nan", 3) == 0) {
		p->s += 3;
		*is_float = true;
		*f = NAN;
		return;
	}
	*is_float = false;
	while ((*p->s >= '0' && *p->s <= '9') || *p->s == '.' || *p->s == 'e' ||
	       *p->s == 'E' ||
	       ((*p->s == '-' || *p->s == '+') &&
		(p->s[-1] == 'e' || p->s[-1] == 'E'))) {
		if (*p->s == '.' || *p->s == 'e' || *p->s == 'E')
			*is_float = true;
		p->s++;
	}
	if (p->s == b)
		mpt_fail(p, "expected a value");
	char tok[64];
	size_t n = (size_t)(p->s - b);
	if (n >= sizeof(tok))
		mpt_fail(p, "number too long");
	memcpy(tok, b, n);
	tok[n] = '\0';
	*is_neg = tok[0] == '-';
	if (*is_float)
		*f = strtod(tok, NULL);
	else if (*is_neg)
		*i = strtoll(tok, NULL, 10);
	else
		*u = strtoull(tok, NULL, 10);
}

HELPER void mpt_word(mpt_t *p)
{
	const char *b = p->s;
	while ((*p->s >= 'a' && *p->s <= 'z') || (*p->s >= '0' && *p->s <= '9'))
		p->s++;
	size_t n = (size_t)(p->s - b);
#define W(lit) (n == sizeof(lit) - 1 && memcmp(b, lit, n) == 0)
	if (W("null") || W("nil")) {
		msgpack_pack_nil(&p->pk);
	} else if (W("true")) {
		msgpack_pack_true(&p->pk);
	} else if (W("false")) {
		msgpack_pack_false(&p->pk);
	} else if (W("inf") || W("nan")) {
		p->s = b;
		bool fl, neg;
		int64_t i = 0;
		uint64_t u = 0;
		double f = 0;
		mpt_number(p, &fl, &i, &u, &f, &neg);
		msgpack_pack_double(&p->pk, f);
	} else if (W("bin") || W("ext")) {
		bool ext = W("ext");
		mpt_expect(p, '(');
		int8_t type = 0;
		if (ext) {
			bool fl, neg;
			int64_t i = 0;
			uint64_t u = 0;
			double f = 0;
			mpt_number(p, &fl, &i, &u, &f, &neg);
			type = (int8_t)(neg ? i : (int64_t)u);
			mpt_expect(p, ',');
		}
		mpt_ws(p);
		size_t len;
		char *s = mpt_string(p, &len);
		if (ext) {
			msgpack_pack_ext(&p->pk, len, type);
			msgpack_pack_ext_body(&p->pk, s, len);
		} else {
			msgpack_pack_bin(&p->pk, len);
			msgpack_pack_bin_body(&p->pk, s, len);
		}
		free(s);
		mpt_expect(p, ')');
	} else if (W("i64") || W("u64") || W("i32") || W("u8") || W("f32") ||
		   W("f64")) {
		char k0 = b[0], k1 = b[1];
		mpt_expect(p, '(');
		bool fl, neg;
		int64_t i = 0;
		uint64_t u = 0;
		double f = 0;
		mpt_number(p, &fl, &i, &u, &f, &neg);
		mpt_expect(p, ')');
		uint64_t bits = neg ? (uint64_t)i : u;
		if (k0 == 'f') {
			double d = fl ? f : neg ? (double)i : (double)u;
			if (k1 == '3')
				msgpack_pack_float(&p->pk, (float)d);
			else
				msgpack_pack_double(&p->pk, d);
		} else if (k0 == 'i' && k1 == '6') {
			mpt_raw(p, 0xd3, bits, 8);
		} else if (k0 == 'u' && k1 == '6') {
			mpt_raw(p, 0xcf, bits, 8);
		} else if (k0 == 'i') {
			mpt_raw(p, 0xd2, bits & 0xffffffffu, 4);
		} else {
			mpt_raw(p, 0xcc, bits & 0xffu, 1);
		}
	} else {
		mpt_fail(p, "unknown word");
	}
#undef W
}

HELPER void mpt_value(mpt_t *p)
{
	mpt_ws(p);
	char c = *p->s;
	if (c == '{' || c == '[') {
		bool map = c == '{';
		p->s++;
		uint32_t n = mpt_count(p->s);
		if (map)
			msgpack_pack_map(&p->pk, n);
		else
			msgpack_pack_array(&p->pk, n);
		for (uint32_t i = 0; i < n; i++) {
			if (i > 0)
				mpt_expect(p, ',');
			mpt_value(p);
			if (map) {
				mpt_expect(p, ':');
				mpt_value(p);
			}
		}
		mpt_expect(p, map ? '}' : ']');
	} else if (c == '\'' || c == '"') {
		size_t len;
		char *s = mpt_string(p, &len);
		msgpack_pack_str_with_body(&p->pk, s, len);
		free(s);
	} else if (c >= 'a' && c <= 'z') {
		mpt_word(p);
	} else {
		bool fl, neg;
		int64_t i = 0;
		uint64_t u = 0;
		double f = 0;
		mpt_number(p, &fl, &i, &u, &f, &neg);
		if (fl)
			msgpack_pack_double(&p->pk, f);
		else if (neg)
			msgpack_pack_int64(&p->pk, i);
		else
			msgpack_pack_uint64(&p->pk, u);
	}
}

/* Appends the msgpack encoding of text to sb (initialised by the caller). */
HELPER void mp_append(msgpack_sbuffer *sb, const char *text)
{
	mpt_t p = {text, text, sb, {0}};
	msgpack_packer_init(&p.pk, sb, msgpack_sbuffer_write);
	mpt_value(&p);
	mpt_ws(&p);
	if (*p.s != '\0')
		mpt_fail(&p, "trailing text");
}

/* Initialises sb and packs text into it. msgpack_sbuffer_destroy after. */
HELPER void mp_pack(msgpack_sbuffer *sb, const char *text)
{
	msgpack_sbuffer_init(sb);
	mp_append(sb, text);
}

/* An unpacked object (plain msgpack_unpack, no guard) with its storage. */
typedef struct mp_obj {
	msgpack_sbuffer sb;
	msgpack_zone zone;
	msgpack_object obj;
} mp_obj_t;

HELPER const msgpack_object *mp_obj(mp_obj_t *o, const char *text)
{
	mp_pack(&o->sb, text);
	cr_assert(msgpack_zone_init(&o->zone, 4096));
	size_t off = 0;
	msgpack_unpack_return r =
	    msgpack_unpack(o->sb.data, o->sb.size, &off, &o->zone, &o->obj);
	cr_assert_eq(r, MSGPACK_UNPACK_SUCCESS, "unpack of \"%s\": %d", text,
		     (int)r);
	return &o->obj;
}

HELPER void mp_obj_free(mp_obj_t *o)
{
	msgpack_zone_destroy(&o->zone);
	msgpack_sbuffer_destroy(&o->sb);
}

/* Asserts that err contains needle. */
#define ASSERT_MSG_HAS(err, needle)                                            \
	cr_assert_not_null(strstr((err), (needle)),                            \
			   "error message \"%s\" does not contain \"%s\"",     \
			   (err), (needle))

/* Decodes text as a Graph v1 (kiln_graph_decode: guard + decoder). */
HELPER int graph_from_text(const char *text, const kiln_limits_t *lim,
			   kiln_graph_t **g, char *err, size_t errlen)
{
	msgpack_sbuffer sb;
	mp_pack(&sb, text);
	int rc = kiln_graph_decode((const uint8_t *)sb.data, sb.size, lim, g,
				   err, errlen);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

/* Decodes text that must be a valid graph. */
HELPER kiln_graph_t *graph_ok(const char *text, const kiln_limits_t *lim)
{
	char err[512] = "";
	kiln_graph_t *g = NULL;
	int rc = graph_from_text(text, lim, &g, err, sizeof(err));
	cr_assert_eq(rc, 0, "graph rejected: %d (%s): %s\n  text: %s", rc,
		     kiln_strerror(rc), err, text);
	cr_assert_not_null(g);
	return g;
}

/* Asserts that text is rejected with code and a message containing needle
 * (and needle2 when not NULL). */
HELPER void graph_err(const char *text, const kiln_limits_t *lim, int code,
		      const char *needle, const char *needle2)
{
	char err[512] = "";
	kiln_graph_t *g = (kiln_graph_t *)(uintptr_t)1;
	int rc = graph_from_text(text, lim, &g, err, sizeof(err));
	bool out_null = g == NULL;
	if (rc == 0)
		kiln_graph_free(g); /* before a failing assert: no leak */
	cr_assert_eq(rc, code,
		     "rc %d (%s), expected %d (%s); message \"%s\"\n  text: %s",
		     rc, kiln_strerror(rc), code, kiln_strerror(code), err,
		     text);
	cr_assert(out_null, "*out must be NULL on error");
	cr_assert_not_null(strstr(err, needle),
			   "message \"%s\" does not contain \"%s\"\n  text: %s",
			   err, needle, text);
	if (needle2 != NULL)
		cr_assert_not_null(
		    strstr(err, needle2),
		    "message \"%s\" does not contain \"%s\"\n  text: %s", err,
		    needle2, text);
}

/* A default CPU target and fingerprint for signature tests. */
HELPER kiln_target_t test_target(const char *backend, const char *arch,
				 const char *features)
{
	kiln_target_t t;
	memset(&t, 0, sizeof(t));
	snprintf(t.backend, sizeof(t.backend), "%s", backend);
	snprintf(t.arch, sizeof(t.arch), "%s", arch);
	snprintf(t.features, sizeof(t.features), "%s", features);
	return t;
}

/* The two examples of GRAPH.md, verbatim but for the comments. */
#define GRAPH_EX1                                                              \
	"{'format': 'kiln.graph/1',"                                           \
	" 'inputs': ["                                                         \
	"   {'dtype': 'f32', 'shape': [8, 64], 'name': 'x'},"                  \
	"   {'dtype': 'f32', 'shape': [64, 32], 'name': 'w'},"                 \
	"   {'dtype': 'f32', 'shape': [32], 'name': 'b'}],"                    \
	" 'nodes': ["                                                          \
	"   {'op': 'aten.addmm.default',"                                      \
	"    'args': [{'ref': 2}, {'ref': 0}, {'ref': 1}],"                    \
	"    'out': [{'dtype': 'f32', 'shape': [8, 32]}]},"                    \
	"   {'op': 'aten.gelu.default', 'args': [{'ref': 3}],"                 \
	"    'kwargs': {'approximate': 'tanh'},"                               \
	"    'out': [{'dtype': 'f32', 'shape': [8, 32]}]}],"                   \
	" 'outputs': [{'ref': 4}]}"

#define GRAPH_EX2                                                              \
	"{'format': 'kiln.graph/1',"                                           \
	" 'symbols': {'s0': {'min': 2, 'max': 4096, 'hint': 16}},"             \
	" 'inputs': ["                                                         \
	"   {'sym': 's0'},"                                                    \
	"   {'dtype': 'f32', 'shape': [4, 's0', 64]},"                         \
	"   {'dtype': 'f32', 'shape': [64]},"                                  \
	"   {'dtype': 'f32', 'shape': [64]}],"                                 \
	" 'nodes': ["                                                          \
	"   {'op': 'aten.native_layer_norm.default',"                          \
	"    'args': [{'ref': 1}, [64], {'ref': 2}, {'ref': 3}, 1e-05],"       \
	"    'out': [{'dtype': 'f32', 'shape': [4, 's0', 64]},"                \
	"            {'dtype': 'f32', 'shape': [4, 's0', 1]},"                 \
	"            {'dtype': 'f32', 'shape': [4, 's0', 1]}]},"               \
	"   {'op': 'aten.view.default',"                                       \
	"    'args': [{'ref': 4}, [{'sym': '4*s0'}, 64]],"                     \
	"    'out': [{'dtype': 'f32', 'shape': ['4*s0', 64]}]}],"              \
	" 'outputs': [{'ref': 7}, {'ref': 5}, {'ref': 6}, {'sym': 's0'}]}"

/* Wraps a fragment: F(inputs, nodes, outputs) with symbols s0 and s1. */
#define GRAPH_SYMS_PRE                                                         \
	"{'format': 'kiln.graph/1',"                                           \
	" 'symbols': {'s0': {'min': 0}, 's1': {'min': 1, 'max': 100}},"

#endif
