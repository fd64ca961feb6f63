/*
 * mpack.c — hostile-input guard for msgpack-c, and small object helpers.
 *
 * msgpack-c's C unpacker has no limits: an array32 header makes it allocate
 * count * 24 bytes at once, and nesting past 32 fails as NOMEM. So every
 * untrusted buffer is walked first by kiln_msgpack_prescan, which allocates
 * nothing and proves: each container's count fits in the bytes that remain
 * (an element takes at least one byte, a map entry two), nesting is bounded,
 * the object count is bounded, and every length fits. Only then does
 * msgpack_unpack run, so its allocations are bounded by
 * 48 * max_objects bytes.
 *
 * Threads: pure functions; any thread.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <string.h>

static uint32_t be16(const uint8_t *p)
{
	return (uint32_t)p[0] << 8 | p[1];
}
static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

int kiln_msgpack_prescan(const uint8_t *p, size_t n, const kiln_limits_t *lim,
			 size_t *end, uint32_t *n_objects, char *err,
			 size_t errlen)
{
	uint64_t remain[KILN_MAX_DEPTH_HARD + 2];
	uint32_t max_depth = lim->max_depth;
	if (max_depth > KILN_MAX_DEPTH_HARD)
		max_depth = KILN_MAX_DEPTH_HARD;
	int depth = 0;
	remain[0] = 1;
	size_t pos = 0;
	uint32_t objects = 0;

	while (depth >= 0) {
		if (remain[depth] == 0) {
			depth--;
			continue;
		}
		remain[depth]--;
		if (pos >= n)
			return kiln__errf(err, errlen, KILN_EBADFRAME,
					  "truncated msgpack at byte %zu", pos);
		if (++objects > lim->max_objects)
			return kiln__errf(err, errlen, KILN_ETOOLARGE,
					  "more than %u msgpack objects",
					  lim->max_objects);
		uint8_t t = p[pos++];
		size_t left = n - pos;
		uint64_t skip = 0;  /* payload bytes */
		uint64_t count = 0; /* container elements */
		int container = 0, is_map = 0;
		size_t hdr = 0; /* length-field bytes */

		if (t <= 0x7f || t >= 0xe0 ||
		    (t >= 0xc0 && t <= 0xc3 && t != 0xc1)) {
			/* fixint, nil, bool */
		} else if (t >= 0x80 && t <= 0x8f) {
			container = 1, is_map = 1, count = t & 0x0f;
		} else if (t >= 0x90 && t <= 0x9f) {
			container = 1, count = t & 0x0f;
		} else if (t >= 0xa0 && t <= 0xbf) {
			skip = t & 0x1f;
		} else {
			switch (t) {
			case 0xc4:
			case 0xd9: hdr = 1; break; /* bin8, str8 */
			case 0xc5:
			case 0xda: hdr = 2; break;
			case 0xc6:
			case 0xdb: hdr = 4; break;
			case 0xc7:
				hdr = 1;
				skip = 1;
				break; /* ext8: +type */
			case 0xc8:
				hdr = 2;
				skip = 1;
				break;
			case 0xc9:
				hdr = 4;
				skip = 1;
				break;
			case 0xca: skip = 4; break;
			case 0xcb: skip = 8; break;
			case 0xcc:
			case 0xd0: skip = 1; break;
			case 0xcd:
			case 0xd1: skip = 2; break;
			case 0xce:
			case 0xd2: skip = 4; break;
			case 0xcf:
			case 0xd3: skip = 8; break;
			case 0xd4: skip = 2; break; /* fixext1 */
			case 0xd5: skip = 3; break;
			case 0xd6: skip = 5; break;
			case 0xd7: skip = 9; break;
			case 0xd8: skip = 17; break;
			case 0xdc:
				container = 1;
				hdr = 2;
				break;
			case 0xdd:
				container = 1;
				hdr = 4;
				break;
			case 0xde:
				container = 1;
				is_map = 1;
				hdr = 2;
				break;
			case 0xdf:
				container = 1;
				is_map = 1;
				hdr = 4;
				break;
			default: /* 0xc1 */
				return kiln__errf(err, errlen, KILN_EBADFRAME,
						  "reserved msgpack type byte "
						  "0x%02x at byte %zu",
						  t, pos - 1);
			}
		}
		if (hdr > 0) {
			if (left < hdr)
				return kiln__errf(err, errlen, KILN_EBADFRAME,
						  "truncated msgpack length at "
						  "byte %zu",
						  pos);
			uint64_t v = hdr == 1	? p[pos]
				     : hdr == 2 ? be16(p + pos)
						: be32(p + pos);
			pos += hdr;
			left -= hdr;
			if (container)
				count = v;
			else
				skip += v;
		}
		if (container) {
			uint64_t need = is_map ? 2 * count : count;
			if (need > left)
				return kiln__errf(
				    err, errlen, KILN_EBADFRAME,
				    "msgpack %s of %llu elements at byte %zu "
				    "is larger than the %zu bytes left",
				    is_map ? "map" : "array",
				    (unsigned long long)count, pos, left);
			if ((uint32_t)depth + 1 > max_depth)
				return kiln__errf(err, errlen, KILN_ETOOLARGE,
						  "msgpack nesting deeper than "
						  "%u",
						  max_depth);
			if (need > 0) {
				depth++;
				remain[depth] = need;
			}
		} else {
			if (skip > left)
				return kiln__errf(err, errlen, KILN_EBADFRAME,
						  "truncated msgpack payload "
						  "at byte %zu",
						  pos);
			pos += skip;
		}
	}
	*end = pos;
	if (n_objects != NULL)
		*n_objects = objects;
	return 0;
}

int kiln_msgpack_unpack_map(const uint8_t *p, size_t n,
			    const kiln_limits_t *lim, msgpack_zone *zone,
			    msgpack_object *out, char *err, size_t errlen)
{
	size_t end = 0;
	if (n == 0)
		return kiln__errf(err, errlen, KILN_EBADFRAME, "empty body");
	if (!((p[0] >= 0x80 && p[0] <= 0x8f) || p[0] == 0xde || p[0] == 0xdf))
		return kiln__errf(err, errlen, KILN_EBADFRAME,
				  "body is not a msgpack map");
	int rc = kiln_msgpack_prescan(p, n, lim, &end, NULL, err, errlen);
	if (rc != 0)
		return rc;
	if (end != n)
		return kiln__errf(err, errlen, KILN_EBADFRAME,
				  "%zu trailing bytes after the map", n - end);
	size_t off = 0;
	msgpack_unpack_return r =
	    msgpack_unpack((const char *)p, n, &off, zone, out);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR)
		return kiln__errf(err, errlen, -ENOMEM,
				  "out of memory unpacking msgpack");
	if (r != MSGPACK_UNPACK_SUCCESS || off != n ||
	    out->type != MSGPACK_OBJECT_MAP)
		return kiln__errf(err, errlen, KILN_EBADFRAME,
				  "malformed msgpack (unpack returned %d)",
				  (int)r);
	return 0;
}

const msgpack_object *kiln_map_get(const msgpack_object *map, const char *key)
{
	if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	size_t klen = strlen(key);
	const msgpack_object_map *m = &map->via.map;
	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object *k = &m->ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
		    memcmp(k->via.str.ptr, key, klen) == 0)
			return &m->ptr[i].val;
	}
	return NULL;
}

bool kiln_obj_streq(const msgpack_object *o, const char *s)
{
	size_t len = strlen(s);
	return o != NULL && o->type == MSGPACK_OBJECT_STR &&
	       o->via.str.size == len && memcmp(o->via.str.ptr, s, len) == 0;
}
