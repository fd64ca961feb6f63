/*
 * test_msg.c — the msgpack guard (protocol/mpack.c), the message envelope
 * (protocol/msg.c) and the error names (protocol/util.c).
 */
#include "helpers.h"

#include <errno.h>
#include <time.h>

static kiln_limits_t deflim(void)
{
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	return lim;
}

/* ------------------------------------------------------------------------ */
/* The test helper's forced encodings (other tests rely on them)              */
/* ------------------------------------------------------------------------ */

static void expect_bytes(const char *text, const uint8_t *want, size_t n)
{
	msgpack_sbuffer sb;
	mp_pack(&sb, text);
	cr_assert_eq(sb.size, n, "%s: %zu bytes", text, sb.size);
	cr_assert_arr_eq(sb.data, want, n, "%s", text);
	msgpack_sbuffer_destroy(&sb);
}

Test(helpers, forced_encodings)
{
	expect_bytes("5", (const uint8_t[]){0x05}, 1);
	expect_bytes("i64(5)", (const uint8_t[]){0xd3, 0, 0, 0, 0, 0, 0, 0, 5},
		     9);
	expect_bytes("i64(-1)",
		     (const uint8_t[]){0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
				       0xff, 0xff},
		     9);
	expect_bytes("u64(64)",
		     (const uint8_t[]){0xcf, 0, 0, 0, 0, 0, 0, 0, 64}, 9);
	expect_bytes("i32(2)", (const uint8_t[]){0xd2, 0, 0, 0, 2}, 5);
	expect_bytes("u8(1)", (const uint8_t[]){0xcc, 1}, 2);
	expect_bytes("f32(0.5)", (const uint8_t[]){0xca, 0x3f, 0, 0, 0}, 5);
	expect_bytes("0.5",
		     (const uint8_t[]){0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0}, 9);
	expect_bytes("{'a': [nil, true]}",
		     (const uint8_t[]){0x81, 0xa1, 'a', 0x92, 0xc0, 0xc3}, 6);
	expect_bytes("{'k': 1, 'k': 2}",
		     (const uint8_t[]){0x82, 0xa1, 'k', 1, 0xa1, 'k', 2}, 7);
	expect_bytes("'a\\0b'", (const uint8_t[]){0xa3, 'a', 0, 'b'}, 4);
}

/* ------------------------------------------------------------------------ */
/* msgpack prescan / unpack                                                   */
/* ------------------------------------------------------------------------ */

static int prescan(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		   size_t *end, uint32_t *objs, char *err, size_t errlen)
{
	kiln_limits_t d = deflim();
	err[0] = '\0';
	return kiln_msgpack_prescan(p, n, lim != NULL ? lim : &d, end, objs,
				    err, errlen);
}

static int unpack(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		  char *err, size_t errlen)
{
	kiln_limits_t d = deflim();
	msgpack_zone zone;
	cr_assert(msgpack_zone_init(&zone, 1024));
	msgpack_object obj;
	err[0] = '\0';
	int rc = kiln_msgpack_unpack_map(p, n, lim != NULL ? lim : &d, &zone,
					 &obj, err, errlen);
	if (rc == 0)
		cr_assert_eq(obj.type, MSGPACK_OBJECT_MAP);
	msgpack_zone_destroy(&zone);
	return rc;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(mpack, prescan_accepts_and_counts)
{
	msgpack_sbuffer sb;
	mp_pack(&sb, "{'a': [1, 2, 'x'], 'b': nil}");
	/* map, 'a', array, 1, 2, 'x', 'b', nil */
	size_t end = 0;
	uint32_t objs = 0;
	char err[256];
	cr_assert_eq(prescan((const uint8_t *)sb.data, sb.size, NULL, &end,
			     &objs, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(end, sb.size);
	cr_assert_eq(objs, 8);
	/* n_objects may be NULL. */
	cr_assert_eq(prescan((const uint8_t *)sb.data, sb.size, NULL, &end,
			     NULL, err, sizeof(err)),
		     0);
	/* Two objects back to back: *end is the end of the first. */
	size_t first = sb.size;
	mp_append(&sb, "[1, 2]");
	cr_assert_eq(prescan((const uint8_t *)sb.data, sb.size, NULL, &end,
			     &objs, err, sizeof(err)),
		     0);
	cr_assert_eq(end, first);
	msgpack_sbuffer_destroy(&sb);
}

Test(mpack, every_type_accepted)
{
	/* A map of 26 entries, keys 0..25, one value of each msgpack form. */
	/* clang-format off */
	static const uint8_t b[] = {
	    0xde, 0x00, 26,				    /* map16 */
	    0, 0x05,					    /* +fixint */
	    1, 0xff,					    /* -fixint */
	    2, 0xc0,					    /* nil */
	    3, 0xc2,					    /* false */
	    4, 0xc3,					    /* true */
	    5, 0xcc, 0xff,				    /* u8 */
	    6, 0xcd, 0xff, 0xff,			    /* u16 */
	    7, 0xce, 0xff, 0xff, 0xff, 0xff,		    /* u32 */
	    8, 0xcf, 0, 0, 0, 0, 0, 0, 0, 1,		    /* u64 */
	    9, 0xd0, 0x80,				    /* i8 */
	    10, 0xd1, 0x80, 0x00,			    /* i16 */
	    11, 0xd2, 0x80, 0, 0, 0,			    /* i32 */
	    12, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0,	    /* i64 */
	    13, 0xca, 0x3f, 0x00, 0x00, 0x00,		    /* f32 0.5 */
	    14, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0,	    /* f64 0.5 */
	    15, 0xd9, 2, 'h', 'i',			    /* str8 */
	    16, 0xda, 0, 1, 'x',			    /* str16 */
	    17, 0xdb, 0, 0, 0, 1, 'y',			    /* str32 */
	    18, 0xc4, 1, 0xaa,				    /* bin8 */
	    19, 0xc5, 0, 1, 0xbb,			    /* bin16 */
	    20, 0xc6, 0, 0, 0, 1, 0xcc,			    /* bin32 */
	    21, 0xd4, 1, 0x11,				    /* fixext1 */
	    22, 0xd8, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
	    15,						    /* fixext16 */
	    23, 0xc7, 1, 5, 0x22,			    /* ext8 */
	    24, 0xdc, 0, 2, 0x90, 0xdd, 0, 0, 0, 1, 0x80,   /* array16/32 */
	    25, 0xdf, 0, 0, 0, 1, 0xa0, 0xc9, 0, 0, 0, 0, 7 /* map32, ext32 */
	};
	/* clang-format on */
	size_t end = 0;
	char err[256];
	int rc = prescan(b, sizeof(b), NULL, &end, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(end, sizeof(b));
	cr_assert_eq(unpack(b, sizeof(b), NULL, err, sizeof(err)), 0, "%s",
		     err);
}

Test(mpack, every_truncation_rejected)
{
	msgpack_sbuffer sb;
	mp_pack(&sb, "{'name': 'kiln', 'list': [1, -300, 70000, 2.5, "
		     "f32(0.5), true, nil, bin('ab'), ext(3, 'xyz')], "
		     "'big': 18446744073709551615, 'm': {'k': [[]]}}");
	kiln_limits_t lim = deflim();
	for (size_t n = 0; n < sb.size; n++) {
		size_t end = 0;
		char err[256] = "";
		int rc = kiln_msgpack_prescan((const uint8_t *)sb.data, n, &lim,
					      &end, NULL, err, sizeof(err));
		cr_assert_eq(rc, KILN_EBADFRAME, "prefix %zu of %zu: rc %d", n,
			     sb.size, rc);
		cr_assert(strstr(err, "truncated") != NULL ||
			      strstr(err, "larger than") != NULL,
			  "prefix %zu: message \"%s\"", n, err);
		cr_assert_eq(
		    unpack((const uint8_t *)sb.data, n, NULL, err, sizeof(err)),
		    KILN_EBADFRAME, "prefix %zu", n);
	}
	msgpack_sbuffer_destroy(&sb);
}

Test(mpack, empty_input)
{
	char err[256];
	size_t end;
	const uint8_t b[1] = {0x80};
	cr_assert_eq(prescan(b, 0, NULL, &end, NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "truncated msgpack at byte 0");
	cr_assert_eq(unpack(b, 0, NULL, err, sizeof(err)), KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "empty body");
}

Test(mpack, huge_array32_and_map32_headers_rejected_fast)
{
	char err[256];
	size_t end;
	double t0 = now_s();

	/* array32 of 2^32-1 elements in 5 bytes. */
	const uint8_t arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(
	    prescan(arr, sizeof(arr), NULL, &end, NULL, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "array of 4294967295 elements");
	ASSERT_MSG_HAS(err, "larger than the 0 bytes left");

	/* map32 of 2^32-1 entries: a map header, so unpack_map gets past
	 * its top-level check and must rely on the prescan. */
	const uint8_t map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(unpack(map, sizeof(map), NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "map of 4294967295 elements");

	/* The same inside a valid map. */
	const uint8_t nested[] = {0x81, 0xa1, 'a',  0xdd,
				  0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(unpack(nested, sizeof(nested), NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "array of 4294967295");

	/* array16 of 65535 in 3 bytes. */
	const uint8_t a16[] = {0xdc, 0xff, 0xff};
	cr_assert_eq(
	    prescan(a16, sizeof(a16), NULL, &end, NULL, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "array of 65535");

	/* Rejected without walking or allocating anything big. */
	cr_assert_lt(now_s() - t0, 0.5);
}

Test(mpack, map_entry_needs_two_bytes)
{
	/* fixmap of 2 entries needs >= 4 bytes; 3 are left. */
	const uint8_t b[] = {0x82, 0xc0, 0xc0, 0xc0};
	char err[256];
	size_t end;
	cr_assert_eq(prescan(b, sizeof(b), NULL, &end, NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "map of 2 elements");
	ASSERT_MSG_HAS(err, "3 bytes left");
}

/* n nested arrays around a nil. */
static size_t nested_arrays(uint8_t *b, int n)
{
	for (int i = 0; i < n; i++)
		b[i] = 0x91;
	b[n] = 0xc0;
	return (size_t)n + 1;
}

Test(mpack, nesting_limit)
{
	uint8_t b[128];
	char err[256];
	size_t end;
	kiln_limits_t lim = deflim(); /* max_depth 24 */

	size_t n = nested_arrays(b, 100);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)),
		     KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "nesting deeper than 24");

	n = nested_arrays(b, 24);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(end, n);
	n = nested_arrays(b, 25);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)),
		     KILN_ETOOLARGE);

	/* Empty containers count as a level too. */
	n = nested_arrays(b, 24);
	b[24] = 0x90;
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)),
		     KILN_ETOOLARGE);

	/* A configured depth above the hard maximum is clamped to 30. */
	lim.max_depth = 100;
	n = nested_arrays(b, 30);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)), 0, "%s",
		     err);
	n = nested_arrays(b, 31);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)),
		     KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "nesting deeper than 30");
	n = nested_arrays(b, 100);
	cr_assert_eq(prescan(b, n, &lim, &end, NULL, err, sizeof(err)),
		     KILN_ETOOLARGE);

	/* Through unpack_map: nested maps. */
	uint8_t m[320];
	size_t k = 0;
	for (int i = 0; i < 100; i++) {
		m[k++] = 0x81;
		m[k++] = 0xa1;
		m[k++] = 'a';
	}
	m[k++] = 0xc0;
	cr_assert_eq(unpack(m, k, NULL, err, sizeof(err)), KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "nesting deeper than 24");
}

Test(mpack, object_limit)
{
	kiln_limits_t lim = deflim();
	lim.max_objects = 10;
	uint8_t b[16];
	char err[256];
	size_t end;
	uint32_t objs = 0;
	b[0] = 0x99; /* array of 9 nils: 10 objects */
	memset(b + 1, 0xc0, 9);
	cr_assert_eq(prescan(b, 10, &lim, &end, &objs, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(objs, 10);
	b[0] = 0x9a; /* 10 nils: 11 objects */
	memset(b + 1, 0xc0, 10);
	cr_assert_eq(prescan(b, 11, &lim, &end, &objs, err, sizeof(err)),
		     KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "more than 10 msgpack objects");

	const uint8_t m[] = {0x85, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}; /* 11 */
	cr_assert_eq(unpack(m, sizeof(m), &lim, err, sizeof(err)),
		     KILN_ETOOLARGE);
	ASSERT_MSG_HAS(err, "more than 10");
}

Test(mpack, trailing_bytes_rejected)
{
	const uint8_t b[] = {0x81, 0xa1, 'a', 0x01, 0xc0, 0xc0};
	char err[256];
	cr_assert_eq(unpack(b, 4, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(unpack(b, 5, NULL, err, sizeof(err)), KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "1 trailing bytes");
	cr_assert_eq(unpack(b, 6, NULL, err, sizeof(err)), KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "2 trailing bytes");
}

Test(mpack, non_map_top_level_rejected)
{
	static const char *const texts[] = {"[1, 2]", "1",   "'str'",	"nil",
					    "-5",     "2.5", "bin('x')"};
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		msgpack_sbuffer sb;
		mp_pack(&sb, texts[i]);
		char err[256];
		cr_assert_eq(unpack((const uint8_t *)sb.data, sb.size, NULL,
				    err, sizeof(err)),
			     KILN_EBADFRAME, "%s", texts[i]);
		ASSERT_MSG_HAS(err, "not a msgpack map");
		msgpack_sbuffer_destroy(&sb);
	}
	/* map16 and map32 top levels are maps. */
	const uint8_t m16[] = {0xde, 0, 1, 0xa1, 'a', 1};
	const uint8_t m32[] = {0xdf, 0, 0, 0, 1, 0xa1, 'a', 1};
	char err[256];
	cr_assert_eq(unpack(m16, sizeof(m16), NULL, err, sizeof(err)), 0);
	cr_assert_eq(unpack(m32, sizeof(m32), NULL, err, sizeof(err)), 0);
}

Test(mpack, reserved_byte_rejected)
{
	char err[256];
	size_t end;
	const uint8_t b[] = {0xc1};
	cr_assert_eq(prescan(b, 1, NULL, &end, NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "reserved msgpack type byte 0xc1 at byte 0");
	const uint8_t m[] = {0x81, 0xa1, 'a', 0xc1};
	cr_assert_eq(unpack(m, sizeof(m), NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "0xc1 at byte 3");
}

Test(mpack, lengths_past_the_end_rejected)
{
	char err[256];
	size_t end;
	/* str32 claiming 4096 bytes with 2 present. */
	const uint8_t s32[] = {0xdb, 0, 0, 0x10, 0, 'a', 'b'};
	cr_assert_eq(
	    prescan(s32, sizeof(s32), NULL, &end, NULL, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "truncated msgpack payload");
	/* str32 claiming 4 GiB - 1. */
	const uint8_t s32b[] = {0x81, 0xa1, 'k', 0xdb, 0xff, 0xff, 0xff, 0xff};
	cr_assert_eq(unpack(s32b, sizeof(s32b), NULL, err, sizeof(err)),
		     KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "truncated msgpack payload");
	/* bin32, ext32, str8, fixstr past the end. */
	const uint8_t b32[] = {0xc6, 0, 0, 1, 0, 1};
	const uint8_t e32[] = {0xc9, 0, 0, 0, 2, 1, 'x'};
	const uint8_t s8[] = {0xd9, 5, 'a'};
	const uint8_t fs[] = {0xa3, 'a', 'b'};
	const uint8_t f64[] = {0xcb, 0, 0, 0};
	const uint8_t fx[] = {0xd8, 1, 2, 3};
	const struct {
		const uint8_t *b;
		size_t n;
	} cases[] = {{b32, sizeof(b32)}, {e32, sizeof(e32)}, {s8, sizeof(s8)},
		     {fs, sizeof(fs)},	 {f64, sizeof(f64)}, {fx, sizeof(fx)}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(prescan(cases[i].b, cases[i].n, NULL, &end, NULL,
				     err, sizeof(err)),
			     KILN_EBADFRAME, "case %zu", i);
		ASSERT_MSG_HAS(err, "truncated msgpack payload");
	}
	/* The length field itself cut short. */
	const uint8_t l16[] = {0xda, 0x00};
	cr_assert_eq(
	    prescan(l16, sizeof(l16), NULL, &end, NULL, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "truncated msgpack length");
	const uint8_t l32[] = {0xdd, 0, 0};
	cr_assert_eq(
	    prescan(l32, sizeof(l32), NULL, &end, NULL, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "truncated msgpack length");
}

Test(mpack, map_get_and_streq)
{
	mp_obj_t o;
	const msgpack_object *m =
	    mp_obj(&o, "{'ab': 1, 'a': 'x', 5: 'int key', 'abc': nil}");
	const msgpack_object *v = kiln_map_get(m, "a");
	cr_assert_not_null(v);
	cr_assert(kiln_obj_streq(v, "x"));
	cr_assert_not(kiln_obj_streq(v, "xy"));
	cr_assert_not(kiln_obj_streq(v, ""));
	cr_assert_eq(kiln_map_get(m, "ab")->via.u64, 1);
	cr_assert_eq(kiln_map_get(m, "abc")->type, MSGPACK_OBJECT_NIL);
	cr_assert_null(kiln_map_get(m, "b"));
	cr_assert_null(kiln_map_get(m, "abcd"));
	cr_assert_null(kiln_map_get(NULL, "a"));
	cr_assert_null(kiln_map_get(kiln_map_get(m, "ab"), "a")); /* non-map */
	cr_assert_not(kiln_obj_streq(kiln_map_get(m, "ab"), "1"));
	cr_assert_not(kiln_obj_streq(NULL, "x"));
	mp_obj_free(&o);
}

/* ------------------------------------------------------------------------ */
/* Requests                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct req_ctx {
	msgpack_sbuffer sb;
	msgpack_zone zone;
	kiln_request_t req;
	char err[256];
} req_ctx_t;

static int req_decode_bytes(req_ctx_t *c, const uint8_t *p, size_t n)
{
	kiln_limits_t lim = deflim();
	cr_assert(msgpack_zone_init(&c->zone, 1024));
	c->err[0] = '\0';
	return kiln_request_decode(p, n, &lim, &c->zone, &c->req, c->err,
				   sizeof(c->err));
}

/* Packs text and decodes it as a request; req_done() after. */
static int req_decode(req_ctx_t *c, const char *text)
{
	mp_pack(&c->sb, text);
	return req_decode_bytes(c, (const uint8_t *)c->sb.data, c->sb.size);
}

static void req_done(req_ctx_t *c)
{
	msgpack_zone_destroy(&c->zone);
	msgpack_sbuffer_destroy(&c->sb);
}

/* Asserts text is rejected as a request with code/needle; returns has_id. */
static bool req_err(const char *text, int code, const char *needle)
{
	req_ctx_t c;
	int rc = req_decode(&c, text);
	cr_assert_eq(rc, code, "rc %d (%s) for %s: %s", rc, kiln_strerror(rc),
		     text, c.err);
	cr_assert_not_null(strstr(c.err, needle),
			   "message \"%s\" lacks \"%s\" (%s)", c.err, needle,
			   text);
	bool has_id = c.req.has_id;
	if (has_id)
		cr_assert_eq(c.req.id, 7, "%s", text);
	req_done(&c);
	return has_id;
}

Test(request, decodes_and_tolerates_extra_keys)
{
	req_ctx_t c;
	int rc = req_decode(&c, "{'v': 1, 'id': 7, 'op': 'hello', "
				"'client': 'test/1', 'pid': 42, "
				"'future': {'x': [1]}}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert(c.req.has_id);
	cr_assert_eq(c.req.id, 7);
	cr_assert_eq(c.req.op, KILN_OP_HELLO);
	cr_assert(
	    kiln_obj_streq(kiln_map_get(&c.req.body, "client"), "test/1"));
	cr_assert_eq(kiln_map_get(&c.req.body, "pid")->via.u64, 42);
	req_done(&c);

	/* Key order does not matter; the largest id. */
	rc = req_decode(&c, "{'op': 'status', 'id': 18446744073709551615, "
			    "'v': u64(1)}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert_eq(c.req.id, UINT64_MAX);
	cr_assert_eq(c.req.op, KILN_OP_STATUS);
	req_done(&c);
}

Test(request, version_checks)
{
	cr_assert(
	    req_err("{'id': 7, 'op': 'hello'}", KILN_EBADREQ, "missing \"v\""));
	cr_assert(req_err("{'v': '1', 'id': 7, 'op': 'hello'}", KILN_EBADREQ,
			  "\"v\" must be a non-negative integer"));
	cr_assert(req_err("{'v': -1, 'id': 7, 'op': 'hello'}", KILN_EBADREQ,
			  "\"v\" must be"));
	cr_assert(req_err("{'v': 1.0, 'id': 7, 'op': 'hello'}", KILN_EBADREQ,
			  "\"v\" must be"));
	cr_assert(req_err("{'v': nil, 'id': 7, 'op': 'hello'}", KILN_EBADREQ,
			  "\"v\" must be"));
	cr_assert(req_err("{'v': 2, 'id': 7, 'op': 'hello'}", KILN_EVERSION,
			  "protocol version 2 is not supported"));
	cr_assert(req_err("{'v': 0, 'id': 7, 'op': 'hello'}", KILN_EVERSION,
			  "protocol version 0"));
	/* Even with an unknown op, the version is reported first. */
	cr_assert(req_err("{'v': 2, 'id': 7, 'op': 'nope'}", KILN_EVERSION,
			  "version 2"));
}

Test(request, id_checks)
{
	cr_assert_not(
	    req_err("{'v': 1, 'op': 'hello'}", KILN_EBADREQ, "missing \"id\""));
	cr_assert_not(req_err("{'v': 1, 'id': -1, 'op': 'hello'}", KILN_EBADREQ,
			      "\"id\" must be a non-negative integer"));
	cr_assert_not(req_err("{'v': 1, 'id': '7', 'op': 'hello'}",
			      KILN_EBADREQ, "\"id\" must be"));
	cr_assert_not(req_err("{'v': 1, 'id': 7.0, 'op': 'hello'}",
			      KILN_EBADREQ, "\"id\" must be"));
	cr_assert_not(req_err("{'v': 1, 'id': nil, 'op': 'hello'}",
			      KILN_EBADREQ, "\"id\" must be"));
	/* A missing v with a readable id: the error reply can carry it. */
	cr_assert(req_err("{'id': 7, 'op': 'hello'}", KILN_EBADREQ, "\"v\""));
}

Test(request, op_checks)
{
	cr_assert(req_err("{'v': 1, 'id': 7}", KILN_EBADREQ, "missing \"op\""));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': 3}", KILN_EBADREQ,
			  "\"op\" must be a string"));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': nil}", KILN_EBADREQ,
			  "\"op\" must be a string"));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': bin('hello')}", KILN_EBADREQ,
			  "\"op\" must be a string"));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': 'frobnicate'}", KILN_EBADREQ,
			  "unknown op \"frobnicate\""));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': 'HELLO'}", KILN_EBADREQ,
			  "unknown op \"HELLO\""));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': 'hell'}", KILN_EBADREQ,
			  "unknown op"));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': 'hello\\0'}", KILN_EBADREQ,
			  "unknown op"));
	cr_assert(req_err("{'v': 1, 'id': 7, 'op': ''}", KILN_EBADREQ,
			  "unknown op \"\""));
	/* A long unknown op is cut in the message. */
	char text[400];
	char op[201];
	memset(op, 'q', 200);
	op[200] = '\0';
	snprintf(text, sizeof(text), "{'v': 1, 'id': 7, 'op': '%s'}", op);
	cr_assert(req_err(text, KILN_EBADREQ, "unknown op \"qqqq"));
}

Test(request, malformed_bodies)
{
	req_ctx_t c;
	/* Not a map. */
	cr_assert_eq(req_decode(&c, "[1, 7, 'hello']"), KILN_EBADFRAME);
	ASSERT_MSG_HAS(c.err, "not a msgpack map");
	cr_assert_not(c.req.has_id);
	req_done(&c);
	/* Trailing bytes. */
	mp_pack(&c.sb, "{'v': 1, 'id': 7, 'op': 'hello'}");
	mp_append(&c.sb, "nil");
	cr_assert_eq(
	    req_decode_bytes(&c, (const uint8_t *)c.sb.data, c.sb.size),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(c.err, "trailing");
	req_done(&c);
	/* Truncated. */
	mp_pack(&c.sb, "{'v': 1, 'id': 7, 'op': 'hello'}");
	cr_assert_eq(
	    req_decode_bytes(&c, (const uint8_t *)c.sb.data, c.sb.size - 1),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(c.err, "truncated");
	req_done(&c);
	/* Nested too deep. */
	uint8_t deep[64] = {0x84, 0xa1, 'v', 1,	   0xa2, 'i', 'd',
			    7,	  0xa2, 'o', 'p',  0xa5, 'h', 'e',
			    'l',  'l',	'o', 0xa1, 'x'};
	size_t n = 19;
	for (int i = 0; i < 30; i++)
		deep[n++] = 0x91;
	deep[n++] = 0xc0;
	msgpack_sbuffer_init(&c.sb);
	cr_assert_eq(req_decode_bytes(&c, deep, n), KILN_ETOOLARGE);
	ASSERT_MSG_HAS(c.err, "nesting");
	req_done(&c);
}

Test(request, every_op_round_trips)
{
	for (int i = 0; i < KILN_OP__COUNT; i++) {
		const char *name = kiln_op_name((kiln_op_t)i);
		cr_assert_not_null(name, "op %d", i);
		cr_assert_eq(kiln_op_from_name(name, strlen(name)), i, "%s",
			     name);
		/* A prefix is not a name. */
		cr_assert_eq(kiln_op_from_name(name, strlen(name) - 1), -1);

		req_ctx_t c;
		msgpack_sbuffer_init(&c.sb);
		msgpack_packer pk;
		msgpack_packer_init(&pk, &c.sb, msgpack_sbuffer_write);
		cr_assert_eq(kiln_pack_request_head(&pk, 1000 + (uint64_t)i,
						    (kiln_op_t)i, 1),
			     0);
		cr_assert_eq(kiln_pack_cstr(&pk, "field"), 0);
		cr_assert_eq(kiln_pack_cstr(&pk, name), 0);
		int rc =
		    req_decode_bytes(&c, (const uint8_t *)c.sb.data, c.sb.size);
		cr_assert_eq(rc, 0, "%s: %s", name, c.err);
		cr_assert_eq(c.req.op, (kiln_op_t)i);
		cr_assert_eq(c.req.id, 1000 + (uint64_t)i);
		cr_assert(c.req.has_id);
		cr_assert(
		    kiln_obj_streq(kiln_map_get(&c.req.body, "field"), name));
		req_done(&c);
	}
	cr_assert_null(kiln_op_name(KILN_OP__COUNT));
	cr_assert_null(kiln_op_name((kiln_op_t)-1));
	cr_assert_eq(kiln_op_from_name("", 0), -1);
	cr_assert_str_eq(kiln_op_name(KILN_OP_COMPILE), "compile");
	cr_assert_str_eq(kiln_op_name(KILN_OP_SHUTDOWN), "shutdown");
}

Test(request, admin_ops_flagged)
{
	cr_assert_not(kiln_op_is_admin(KILN_OP_HELLO));
	cr_assert_not(kiln_op_is_admin(KILN_OP_COMPILE));
	cr_assert_not(kiln_op_is_admin(KILN_OP_LOOKUP));
	cr_assert_not(kiln_op_is_admin(KILN_OP_STATUS));
	cr_assert(kiln_op_is_admin(KILN_OP_LIST));
	cr_assert(kiln_op_is_admin(KILN_OP_EVICT));
	cr_assert(kiln_op_is_admin(KILN_OP_GC));
	cr_assert(kiln_op_is_admin(KILN_OP_SHUTDOWN));
	cr_assert_not(kiln_op_is_admin(KILN_OP__COUNT));
	cr_assert_not(kiln_op_is_admin((kiln_op_t)-1));
}

/* ------------------------------------------------------------------------ */
/* Responses                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct res_ctx {
	msgpack_sbuffer sb;
	msgpack_zone zone;
	kiln_response_t res;
	char err[256];
} res_ctx_t;

static int res_decode_sb(res_ctx_t *c)
{
	kiln_limits_t lim = deflim();
	cr_assert(msgpack_zone_init(&c->zone, 1024));
	c->err[0] = '\0';
	return kiln_response_decode((const uint8_t *)c->sb.data, c->sb.size,
				    &lim, &c->zone, &c->res, c->err,
				    sizeof(c->err));
}

static int res_decode(res_ctx_t *c, const char *text)
{
	mp_pack(&c->sb, text);
	return res_decode_sb(c);
}

static void res_done(res_ctx_t *c)
{
	msgpack_zone_destroy(&c->zone);
	msgpack_sbuffer_destroy(&c->sb);
}

static bool span_eq(const char *p, size_t n, const char *s)
{
	return n == strlen(s) && memcmp(p, s, n) == 0;
}

Test(response, ok_head)
{
	res_ctx_t c;
	msgpack_sbuffer_init(&c.sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &c.sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_pack_ok_head(&pk, 5, 1), 0);
	kiln_pack_cstr(&pk, "server");
	kiln_pack_cstr(&pk, "kilnd");
	cr_assert_eq(res_decode_sb(&c), 0, "%s", c.err);
	cr_assert(c.res.ok);
	cr_assert_eq(c.res.id, 5);
	cr_assert_eq(c.res.err_node, -1);
	cr_assert(kiln_obj_streq(kiln_map_get(&c.res.body, "server"), "kilnd"));
	res_done(&c);
}

Test(response, error_with_node)
{
	res_ctx_t c;
	int rc = res_decode(
	    &c, "{'v': 1, 'id': 3, 'ok': false, 'error': {'code': "
		"'invalid_graph', 'message': 'node 4: bad', 'node': 4}}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert_not(c.res.ok);
	cr_assert_eq(c.res.id, 3);
	cr_assert_eq(c.res.err_code, KILN_EINVGRAPH);
	cr_assert(span_eq(c.res.err_name, c.res.err_name_len, "invalid_graph"));
	cr_assert(span_eq(c.res.message, c.res.message_len, "node 4: bad"));
	cr_assert_eq(c.res.err_node, 4);
	res_done(&c);
}

Test(response, error_variants)
{
	res_ctx_t c;
	/* A code from a newer peer maps to internal, the name is kept. */
	int rc = res_decode(&c, "{'v': 1, 'id': 3, 'ok': false, 'error': "
				"{'code': 'quota_exceeded', 'message': 'm'}}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert_eq(c.res.err_code, KILN_EINTERNAL);
	cr_assert(
	    span_eq(c.res.err_name, c.res.err_name_len, "quota_exceeded"));
	cr_assert_eq(c.res.err_node, -1);
	res_done(&c);
	/* No message: empty; node of the wrong type or negative: -1. */
	rc = res_decode(&c, "{'v': 1, 'id': 3, 'ok': false, 'error': "
			    "{'code': 'busy', 'node': -2}}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert_eq(c.res.err_code, KILN_EBUSY);
	cr_assert_not_null(c.res.message);
	cr_assert_eq(c.res.message_len, 0);
	cr_assert_eq(c.res.err_node, -1);
	res_done(&c);
	rc = res_decode(&c, "{'v': 1, 'id': 3, 'ok': false, 'error': "
			    "{'code': 'busy', 'message': 5, 'node': '4'}}");
	cr_assert_eq(rc, 0, "%s", c.err);
	cr_assert_eq(c.res.message_len, 0);
	cr_assert_eq(c.res.err_node, -1);
	res_done(&c);
}

static void res_err(const char *text, int code, const char *needle)
{
	res_ctx_t c;
	int rc = res_decode(&c, text);
	cr_assert_eq(rc, code, "rc %d (%s) for %s: %s", rc, kiln_strerror(rc),
		     text, c.err);
	ASSERT_MSG_HAS(c.err, needle);
	res_done(&c);
}

Test(response, rejections)
{
	res_err("{'v': 1, 'id': 3}", KILN_EBADREQ, "\"ok\"");
	res_err("{'v': 1, 'id': 3, 'ok': 1}", KILN_EBADREQ,
		"non-boolean \"ok\"");
	res_err("{'v': 1, 'id': 3, 'ok': false}", KILN_EBADREQ,
		"without an \"error\" map");
	res_err("{'v': 1, 'id': 3, 'ok': false, 'error': 'busy'}", KILN_EBADREQ,
		"\"error\" map");
	res_err("{'v': 1, 'id': 3, 'ok': false, 'error': {'message': 'x'}}",
		KILN_EBADREQ, "string \"code\"");
	res_err("{'v': 1, 'id': 3, 'ok': false, 'error': {'code': 4}}",
		KILN_EBADREQ, "string \"code\"");
	res_err("{'v': 2, 'id': 3, 'ok': true}", KILN_EVERSION, "version 2");
	res_err("{'id': 3, 'ok': true}", KILN_EBADREQ, "missing \"v\"");
	res_err("{'v': 1, 'ok': true}", KILN_EBADREQ, "missing \"id\"");
	res_err("{'v': 1, 'id': -3, 'ok': true}", KILN_EBADREQ, "\"id\"");
	res_err("[1]", KILN_EBADFRAME, "not a msgpack map");
}

/* ------------------------------------------------------------------------ */
/* Error codes                                                                */
/* ------------------------------------------------------------------------ */

static const struct {
	int code;
	const char *wire;
	const char *text;
} codes[] = {
    {KILN_EBADFRAME, "bad_frame", "malformed frame"},
    {KILN_EBADREQ, "bad_request", "malformed request"},
    {KILN_EVERSION, "unsupported_version", "unsupported protocol version"},
    {KILN_EINVGRAPH, "invalid_graph", "invalid graph"},
    {KILN_EUNSUPOP, "unsupported_op", "unsupported operator"},
    {KILN_ECOMPILE, "compile_failed", "compile failed"},
    {KILN_ETOOLARGE, "too_large", "input exceeds a limit"},
    {KILN_EBUSY, "busy", "server busy"},
    {KILN_ETIMEOUT, "timeout", "timed out"},
    {KILN_ENOTFOUND, "not_found", "not found"},
    {KILN_EPERM, "permission_denied", "permission denied"},
    {KILN_ESHUTDOWN, "shutting_down", "server shutting down"},
    {KILN_EINTERNAL, "internal", "internal error"},
};
#define N_CODES (sizeof(codes) / sizeof(codes[0]))

Test(errors, thirteen_wire_names)
{
	cr_assert_eq(N_CODES, 13);
	for (size_t i = 0; i < N_CODES; i++) {
		cr_assert_str_eq(kiln_err_wire_name(codes[i].code),
				 codes[i].wire);
		cr_assert_eq(kiln_err_from_wire_name(codes[i].wire,
						     strlen(codes[i].wire)),
			     codes[i].code, "%s", codes[i].wire);
		/* Prefixes and extensions are not names. */
		cr_assert_eq(kiln_err_from_wire_name(codes[i].wire,
						     strlen(codes[i].wire) - 1),
			     0);
		char longer[64];
		snprintf(longer, sizeof(longer), "%sx", codes[i].wire);
		cr_assert_eq(kiln_err_from_wire_name(longer, strlen(longer)),
			     0);
		for (size_t k = 0; k < i; k++)
			cr_assert_neq(codes[i].code, codes[k].code);
		/* Far below any errno (Linux's are under 134). */
		cr_assert_lt(codes[i].code, -1000);
	}
	cr_assert_eq(kiln_err_from_wire_name("", 0), 0);
	cr_assert_eq(kiln_err_from_wire_name("BUSY", 4), 0);
	cr_assert_str_eq(kiln_err_wire_name(-ENOMEM), "internal");
	cr_assert_str_eq(kiln_err_wire_name(-EIO), "internal");
	cr_assert_str_eq(kiln_err_wire_name(-12345), "internal");
}

Test(errors, strerror_texts)
{
	for (size_t i = 0; i < N_CODES; i++)
		cr_assert_str_eq(kiln_strerror(codes[i].code), codes[i].text);
	cr_assert_str_eq(kiln_strerror(0), "success");
	cr_assert_str_eq(kiln_strerror(-ENOENT), strerror(ENOENT));
	cr_assert_str_eq(kiln_strerror(-ENOMEM), strerror(ENOMEM));
	cr_assert_str_eq(kiln_strerror(-EPIPE), strerror(EPIPE));
	cr_assert_str_eq(kiln_strerror(1), "unknown error");
	cr_assert_str_eq(kiln_strerror(-5000), "unknown error");
	/* Unused codes next to the KILN_E* range still get some text. */
	cr_assert_not_null(kiln_strerror(-3000));
	cr_assert_not_null(kiln_strerror(-3014));
	cr_assert_str_eq(kiln_strerror(INT32_MIN), "unknown error");
}

Test(errors, pack_error_round_trips)
{
	for (size_t i = 0; i < N_CODES; i++) {
		for (int with_node = 0; with_node < 2; with_node++) {
			res_ctx_t c;
			msgpack_sbuffer_init(&c.sb);
			msgpack_packer pk;
			msgpack_packer_init(&pk, &c.sb, msgpack_sbuffer_write);
			int64_t node = with_node ? (int64_t)i * 1000 + 7 : -1;
			cr_assert_eq(kiln_pack_error(&pk, 77 + i, codes[i].code,
						     "node 7: went wrong",
						     node),
				     0);
			cr_assert_eq(res_decode_sb(&c), 0, "%s", c.err);
			cr_assert_not(c.res.ok);
			cr_assert_eq(c.res.id, 77 + i);
			cr_assert_eq(c.res.err_code, codes[i].code);
			cr_assert(span_eq(c.res.err_name, c.res.err_name_len,
					  codes[i].wire));
			cr_assert(span_eq(c.res.message, c.res.message_len,
					  "node 7: went wrong"));
			cr_assert_eq(c.res.err_node, node);
			/* node absent from the map when < 0 */
			const msgpack_object *e =
			    kiln_map_get(&c.res.body, "error");
			cr_assert_eq(kiln_map_get(e, "node") != NULL,
				     with_node == 1);
			res_done(&c);
		}
	}
	/* NULL message: the code's text; a system error: internal. */
	res_ctx_t c;
	msgpack_sbuffer_init(&c.sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &c.sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_pack_error(&pk, 1, KILN_EBUSY, NULL, -1), 0);
	cr_assert_eq(res_decode_sb(&c), 0, "%s", c.err);
	cr_assert(span_eq(c.res.message, c.res.message_len, "server busy"));
	res_done(&c);
	msgpack_sbuffer_init(&c.sb);
	msgpack_packer_init(&pk, &c.sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_pack_error(&pk, 2, -ENOMEM, NULL, -1), 0);
	cr_assert_eq(res_decode_sb(&c), 0, "%s", c.err);
	cr_assert_eq(c.res.err_code, KILN_EINTERNAL);
	cr_assert(span_eq(c.res.err_name, c.res.err_name_len, "internal"));
	cr_assert(span_eq(c.res.message, c.res.message_len, strerror(ENOMEM)));
	res_done(&c);
}
