/*
 * test_frame.c — length-prefixed frames (protocol/frame.c): the incremental
 * decoder (byte-at-a-time, several frames per buffer, truncation, bad
 * lengths, sticky failure) and the encoder.
 */
#include "helpers.h"

#include <errno.h>

#define MIB ((size_t)1 << 20)

/* Builds one frame holding text into sb (initialised here). */
static void make_frame(msgpack_sbuffer *sb, const char *text)
{
	msgpack_sbuffer_init(sb);
	cr_assert_eq(kiln_frame_begin(sb), 0);
	cr_assert_eq(sb->size, 4);
	mp_append(sb, text);
	cr_assert_eq(kiln_frame_end(sb, 64 * MIB), 0);
}

static uint32_t hdr_len(const msgpack_sbuffer *sb)
{
	const uint8_t *p = (const uint8_t *)sb->data;
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

Test(frame, encoder_writes_big_endian_length)
{
	msgpack_sbuffer sb;
	make_frame(&sb, "{'a': 1}");
	/* {'a': 1} is 0x81 0xa1 'a' 0x01: 4 bytes */
	const uint8_t want[] = {0, 0, 0, 4, 0x81, 0xa1, 'a', 0x01};
	cr_assert_eq(sb.size, sizeof(want));
	cr_assert_arr_eq(sb.data, want, sizeof(want));
	msgpack_sbuffer_destroy(&sb);

	/* A body over 255 and 65535 bytes uses the higher length bytes. */
	char *text = malloc(70000 + 16);
	cr_assert_not_null(text);
	strcpy(text, "{'s': '");
	memset(text + 7, 'x', 70000);
	strcpy(text + 7 + 70000, "'}");
	make_frame(&sb, text);
	cr_assert_eq(hdr_len(&sb), sb.size - 4);
	cr_assert_eq(hdr_len(&sb), 70000 + 8); /* map, key, str32 header */
	free(text);
	msgpack_sbuffer_destroy(&sb);
}

Test(frame, encode_decode_round_trip)
{
	msgpack_sbuffer sb;
	make_frame(&sb, "{'v': 1, 'id': 7, 'op': 'hello', 'x': [1, 2.5, nil]}");
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 64 * MIB);
	const uint8_t *p = (const uint8_t *)sb.data;
	size_t len = sb.size;
	uint8_t *body = NULL;
	size_t body_len = 0;
	char err[256] = "";
	int rc =
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err));
	cr_assert_eq(rc, 1, "rc %d: %s", rc, err);
	cr_assert_eq(len, 0);
	cr_assert_eq(p, (const uint8_t *)sb.data + sb.size);
	cr_assert_eq(body_len, sb.size - 4);
	cr_assert_arr_eq(body, sb.data + 4, body_len);

	/* The body is one map that the guarded unpacker accepts. */
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	msgpack_zone zone;
	cr_assert(msgpack_zone_init(&zone, 1024));
	msgpack_object obj;
	rc = kiln_msgpack_unpack_map(body, body_len, &lim, &zone, &obj, err,
				     sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert(kiln_obj_streq(kiln_map_get(&obj, "op"), "hello"));
	msgpack_zone_destroy(&zone);

	/* Nothing more: 0 with no bytes. */
	rc = kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err));
	cr_assert_eq(rc, 0);
	free(body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&sb);
}

/* Three frames of different sizes concatenated into all (initialised
 * here); bodies[i] point into it. */
static const char *const texts[3] = {
    "{'a': 1}",
    "{'id': 18446744073709551615, 'op': 'compile', 'l': [1, 2, 3, 4]}",
    NULL, /* built: a 300-byte string, so the length needs 2 bytes */
};

static void three_frames(msgpack_sbuffer *all, size_t off[3], size_t len[3])
{
	char big[400];
	strcpy(big, "{'s': '");
	memset(big + 7, 'y', 300);
	strcpy(big + 307, "'}");
	msgpack_sbuffer_init(all);
	for (int i = 0; i < 3; i++) {
		msgpack_sbuffer f;
		make_frame(&f, texts[i] != NULL ? texts[i] : big);
		off[i] = all->size + 4;
		len[i] = f.size - 4;
		msgpack_sbuffer_write(all, f.data, f.size);
		msgpack_sbuffer_destroy(&f);
	}
}

Test(frame, byte_at_a_time)
{
	msgpack_sbuffer all;
	size_t off[3], blen[3];
	three_frames(&all, off, blen);
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	int got = 0;
	char err[256] = "";
	for (size_t i = 0; i < all.size; i++) {
		const uint8_t *p = (const uint8_t *)all.data + i;
		size_t len = 1;
		uint8_t *body = NULL;
		size_t body_len = 0;
		int rc = kiln_frame_feed(&d, &p, &len, &body, &body_len, err,
					 sizeof(err));
		cr_assert_eq(len, 0, "byte %zu not consumed", i);
		bool last_of_frame = got < 3 && i == off[got] + blen[got] - 1;
		if (last_of_frame) {
			cr_assert_eq(rc, 1, "byte %zu: rc %d (%s)", i, rc, err);
			cr_assert_eq(body_len, blen[got]);
			cr_assert_arr_eq(body, all.data + off[got], body_len);
			free(body);
			got++;
		} else {
			cr_assert_eq(rc, 0, "byte %zu: rc %d (%s)", i, rc, err);
		}
	}
	cr_assert_eq(got, 3);
	cr_assert_null(d.body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&all);
}

Test(frame, several_frames_in_one_buffer)
{
	msgpack_sbuffer all;
	size_t off[3], blen[3];
	three_frames(&all, off, blen);
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = (const uint8_t *)all.data;
	size_t len = all.size;
	char err[256] = "";
	for (int i = 0; i < 3; i++) {
		uint8_t *body = NULL;
		size_t body_len = 0;
		int rc = kiln_frame_feed(&d, &p, &len, &body, &body_len, err,
					 sizeof(err));
		cr_assert_eq(rc, 1, "frame %d: rc %d (%s)", i, rc, err);
		cr_assert_eq(body_len, blen[i]);
		cr_assert_arr_eq(body, all.data + off[i], body_len);
		/* Exactly this frame was consumed. */
		cr_assert_eq(len, all.size - (off[i] + blen[i]));
		free(body);
	}
	uint8_t *body = NULL;
	size_t body_len = 0;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    0);
	cr_assert_null(body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&all);
}

Test(frame, chunks_of_seven_bytes)
{
	msgpack_sbuffer all;
	size_t off[3], blen[3];
	three_frames(&all, off, blen);
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	int got = 0;
	char err[256] = "";
	for (size_t i = 0; i < all.size; i += 7) {
		const uint8_t *p = (const uint8_t *)all.data + i;
		size_t len = all.size - i < 7 ? all.size - i : 7;
		for (;;) {
			uint8_t *body = NULL;
			size_t body_len = 0;
			int rc = kiln_frame_feed(&d, &p, &len, &body, &body_len,
						 err, sizeof(err));
			cr_assert_geq(rc, 0, "%s", err);
			if (rc == 0)
				break;
			cr_assert_lt(got, 3);
			cr_assert_eq(body_len, blen[got]);
			cr_assert_arr_eq(body, all.data + off[got], body_len);
			free(body);
			got++;
		}
		cr_assert_eq(len, 0);
	}
	cr_assert_eq(got, 3);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&all);
}

Test(frame, truncated_frame_waits_for_more)
{
	msgpack_sbuffer sb;
	make_frame(&sb, "{'key': 'value', 'n': 12345}");
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	char err[256] = "";
	uint8_t *body = NULL;
	size_t body_len = 0;

	/* Two header bytes: 0, all consumed. */
	const uint8_t *p = (const uint8_t *)sb.data;
	size_t len = 2;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    0);
	cr_assert_eq(len, 0);
	cr_assert_null(body);
	/* The rest of the header and half the body: still 0. */
	size_t half = 2 + (sb.size - 4) / 2;
	len = half;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    0);
	cr_assert_eq(len, 0);
	cr_assert_null(body);
	/* Zero bytes: 0. */
	len = 0;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    0);
	/* The remainder completes it. */
	len = sb.size - 2 - half;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    1);
	cr_assert_eq(body_len, sb.size - 4);
	cr_assert_arr_eq(body, sb.data + 4, body_len);
	free(body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&sb);
}

Test(frame, free_with_a_partial_body)
{
	/* A decoder freed mid-body releases the partial body (ASan's leak
	 * check would report it otherwise) and can be re-initialised. */
	msgpack_sbuffer sb;
	make_frame(&sb, "{'key': 'value'}");
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = (const uint8_t *)sb.data;
	size_t len = sb.size - 1;
	uint8_t *body = NULL;
	size_t body_len = 0;
	cr_assert_eq(kiln_frame_feed(&d, &p, &len, &body, &body_len, NULL, 0),
		     0);
	cr_assert_not_null(d.body);
	kiln_frame_decoder_free(&d);
	cr_assert_null(d.body);
	kiln_frame_decoder_free(&d); /* twice is harmless */
	kiln_frame_decoder_init(&d, 1024);
	p = (const uint8_t *)sb.data;
	len = sb.size;
	cr_assert_eq(kiln_frame_feed(&d, &p, &len, &body, &body_len, NULL, 0),
		     1);
	free(body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&sb);
}

Test(frame, oversize_length_rejected_before_allocating)
{
	/* max 1 KiB, a header claiming 4 GiB - 1. */
	const uint8_t hdr[] = {0xff, 0xff, 0xff, 0xff, 0x80};
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = hdr;
	size_t len = sizeof(hdr);
	uint8_t *body = NULL;
	size_t body_len = 0;
	char err[256] = "";
	int rc =
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err));
	cr_assert_eq(rc, KILN_EBADFRAME, "rc %d", rc);
	ASSERT_MSG_HAS(err, "4294967295");
	ASSERT_MSG_HAS(err, "exceeds max_frame_bytes 1024");
	cr_assert_null(d.body, "no body may be allocated");
	cr_assert_null(body);
	cr_assert(d.failed);
	kiln_frame_decoder_free(&d);
}

Test(frame, length_at_and_over_the_limit)
{
	kiln_frame_decoder_t d;
	char err[256] = "";
	uint8_t *body = NULL;
	size_t body_len = 0;

	/* 1024 == max: accepted, waits for the body. */
	const uint8_t ok[] = {0, 0, 0x04, 0x00};
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = ok;
	size_t len = 4;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    0, "%s", err);
	kiln_frame_decoder_free(&d);

	/* 1025: rejected, naming the length. */
	const uint8_t bad[] = {0, 0, 0x04, 0x01};
	kiln_frame_decoder_init(&d, 1024);
	p = bad;
	len = 4;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "1025");
	kiln_frame_decoder_free(&d);
}

Test(frame, oversize_header_split_across_feeds)
{
	const uint8_t hdr[] = {0x01, 0x00, 0x00, 0x00}; /* 16 MiB */
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	char err[256] = "";
	uint8_t *body = NULL;
	size_t body_len = 0;
	for (int i = 0; i < 3; i++) {
		const uint8_t *p = hdr + i;
		size_t len = 1;
		cr_assert_eq(kiln_frame_feed(&d, &p, &len, &body, &body_len,
					     err, sizeof(err)),
			     0);
	}
	const uint8_t *p = hdr + 3;
	size_t len = 1;
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "16777216");
	cr_assert_null(d.body);
	kiln_frame_decoder_free(&d);
}

Test(frame, zero_length_rejected)
{
	const uint8_t hdr[] = {0, 0, 0, 0, 0x80};
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = hdr;
	size_t len = sizeof(hdr);
	uint8_t *body = NULL;
	size_t body_len = 0;
	char err[256] = "";
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    KILN_EBADFRAME);
	ASSERT_MSG_HAS(err, "zero-length");
	cr_assert(d.failed);
	cr_assert_null(d.body);
	kiln_frame_decoder_free(&d);
}

Test(frame, failure_is_sticky)
{
	msgpack_sbuffer good;
	make_frame(&good, "{'a': 1}");
	const uint8_t bad[] = {0, 0, 0, 0};
	kiln_frame_decoder_t d;
	kiln_frame_decoder_init(&d, 1024);
	const uint8_t *p = bad;
	size_t len = sizeof(bad);
	uint8_t *body = NULL;
	size_t body_len = 0;
	char err[256] = "";
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    KILN_EBADFRAME);

	/* A valid frame afterwards is refused, and nothing is consumed. */
	for (int i = 0; i < 2; i++) {
		p = (const uint8_t *)good.data;
		len = good.size;
		err[0] = '\0';
		cr_assert_eq(kiln_frame_feed(&d, &p, &len, &body, &body_len,
					     err, sizeof(err)),
			     KILN_EBADFRAME);
		ASSERT_MSG_HAS(err, "already failed");
		cr_assert_eq(len, good.size);
		cr_assert_null(body);
	}
	/* A NULL error buffer is fine too. */
	cr_assert_eq(kiln_frame_feed(&d, &p, &len, &body, &body_len, NULL, 0),
		     KILN_EBADFRAME);

	/* Re-initialised, the decoder works again. */
	kiln_frame_decoder_free(&d);
	kiln_frame_decoder_init(&d, 1024);
	cr_assert_eq(
	    kiln_frame_feed(&d, &p, &len, &body, &body_len, err, sizeof(err)),
	    1);
	free(body);
	kiln_frame_decoder_free(&d);
	msgpack_sbuffer_destroy(&good);
}

Test(frame, end_rejects_a_body_over_the_limit)
{
	char text[2100];
	strcpy(text, "{'s': '");
	memset(text + 7, 'z', 2000);
	strcpy(text + 2007, "'}");
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	cr_assert_eq(kiln_frame_begin(&sb), 0);
	mp_append(&sb, text);
	cr_assert_eq(kiln_frame_end(&sb, 1024), KILN_ETOOLARGE);
	size_t body = sb.size - 4;
	cr_assert_eq(kiln_frame_end(&sb, body - 1), KILN_ETOOLARGE);
	cr_assert_eq(kiln_frame_end(&sb, body), 0); /* exactly at the max */
	cr_assert_eq(hdr_len(&sb), body);
	msgpack_sbuffer_destroy(&sb);
}

Test(frame, end_rejects_an_empty_body_and_a_missing_header)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	cr_assert_eq(kiln_frame_begin(&sb), 0);
	cr_assert_eq(kiln_frame_end(&sb, 1024), KILN_ETOOLARGE);
	msgpack_sbuffer_destroy(&sb);

	msgpack_sbuffer_init(&sb);
	msgpack_sbuffer_write(&sb, "ab", 2);
	cr_assert_eq(kiln_frame_end(&sb, 1024), KILN_EINTERNAL);
	msgpack_sbuffer_destroy(&sb);
}
