/*
 * frame.c — length-prefixed frames: the incremental decoder and the encoder.
 *
 * Wire: uint32 big-endian N, then N bytes (one msgpack map, checked by the
 * caller). The decoder never allocates before it has checked N against
 * max_frame_bytes, and allocates exactly N then. Once a length is bad the
 * decoder stays failed: a stream cannot be resynchronised after that.
 *
 * Threads: a decoder belongs to one connection, used by one thread.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kiln_frame_decoder_init(kiln_frame_decoder_t *d, size_t max_frame_bytes)
{
	memset(d, 0, sizeof(*d));
	d->max_frame_bytes = max_frame_bytes;
}

void kiln_frame_decoder_free(kiln_frame_decoder_t *d)
{
	free(d->body);
	d->body = NULL;
	d->hdr_have = 0;
	d->body_have = 0;
	d->body_len = 0;
}

int kiln_frame_feed(kiln_frame_decoder_t *d, const uint8_t **data, size_t *len,
		    uint8_t **body, size_t *body_len, char *err, size_t errlen)
{
	if (d->failed)
		return kiln__errf(err, errlen, KILN_EBADFRAME,
				  "stream already failed");
	while (*len > 0 || (d->hdr_have == 4 && d->body_have == d->body_len)) {
		if (d->hdr_have < 4) {
			size_t take = 4 - d->hdr_have;
			if (take > *len)
				take = *len;
			memcpy(d->hdr + d->hdr_have, *data, take);
			d->hdr_have += (uint32_t)take;
			*data += take;
			*len -= take;
			if (d->hdr_have < 4)
				return 0;
			uint32_t n = (uint32_t)d->hdr[0] << 24 |
				     (uint32_t)d->hdr[1] << 16 |
				     (uint32_t)d->hdr[2] << 8 | d->hdr[3];
			if (n == 0) {
				d->failed = 1;
				return kiln__errf(err, errlen, KILN_EBADFRAME,
						  "zero-length frame");
			}
			if ((size_t)n > d->max_frame_bytes) {
				d->failed = 1;
				return kiln__errf(
				    err, errlen, KILN_EBADFRAME,
				    "frame length %u exceeds max_frame_bytes "
				    "%zu",
				    n, d->max_frame_bytes);
			}
			d->body = malloc(n);
			if (d->body == NULL) {
				d->failed = 1;
				return kiln__errf(err, errlen, -ENOMEM,
						  "out of memory for a %u-byte "
						  "frame",
						  n);
			}
			d->body_len = n;
			d->body_have = 0;
			continue;
		}
		if (d->body_have < d->body_len) {
			size_t take = d->body_len - d->body_have;
			if (take > *len)
				take = *len;
			memcpy(d->body + d->body_have, *data, take);
			d->body_have += take;
			*data += take;
			*len -= take;
		}
		if (d->body_have == d->body_len) {
			*body = d->body;
			*body_len = d->body_len;
			d->body = NULL;
			d->body_len = 0;
			d->body_have = 0;
			d->hdr_have = 0;
			return 1;
		}
	}
	return 0;
}

int kiln_frame_begin(msgpack_sbuffer *sb)
{
	static const char zero[4] = {0, 0, 0, 0};
	return msgpack_sbuffer_write(sb, zero, 4) == 0 ? 0 : -ENOMEM;
}

int kiln_frame_end(msgpack_sbuffer *sb, size_t max_frame_bytes)
{
	if (sb->size < 4)
		return KILN_EINTERNAL;
	size_t n = sb->size - 4;
	if (n == 0 || n > max_frame_bytes || n > UINT32_MAX)
		return KILN_ETOOLARGE;
	uint8_t *p = (uint8_t *)sb->data;
	p[0] = (uint8_t)(n >> 24);
	p[1] = (uint8_t)(n >> 16);
	p[2] = (uint8_t)(n >> 8);
	p[3] = (uint8_t)n;
	return 0;
}
