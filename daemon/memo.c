/*
 * memo.c — the repeat-compile fast path: request bytes → signature.
 *
 * A `compile` that asks again for a graph the hot map already holds would
 * otherwise pay, on the loop thread, the prescan and unpack of the whole
 * request, the graph's decode and validation and its signature (~85 µs for
 * a 13 KB graph) just to learn a signature kilnd has seen. The memo maps the
 * request's exact bytes — everything but the value of "id" — to the
 * signature that answered it. A request whose bytes match an entry
 * byte for byte (a 64-bit hash picks the slot, memcmp decides) is answered
 * from the hot map without being decoded; anything else (a miss, a hot map
 * that no longer holds the artifact, a draining daemon) takes the normal
 * path, which records the answer here.
 *
 * Sound because the signature is a function of the graph, target and
 * options, all of which are in the bytes compared; a dynamic-shapes answer
 * (a generalized graph's signature) is equally a function of them while
 * its artifact is in the hot map. Only requests whose "id" comes before any
 * large value are memoized (every kiln client writes v, id, op first).
 *
 * Threads: the loop thread only.
 */
#include "daemon/server.h"

#include <stdlib.h>
#include <string.h>

#define MEMO_SLOTS     1024
#define MEMO_MAX_BYTES (1u << 20)  /* requests larger than this: not kept */
#define MEMO_TOTAL     (32u << 20) /* all entries together */

struct kilnd_memo_entry {
	uint64_t hash;
	uint8_t *bytes; /* the request without the id value */
	size_t len;
	uint8_t sig[KILN_SIG_BYTES];
};

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v * 0x9e3779b97f4a7c15ull;
	h = (h << 27 | h >> 37) * 0xbf58476d1ce4e5b9ull;
	return h;
}

/* A fast 64-bit hash of p[0..n); not cryptographic (memcmp confirms). */
static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		h = mix(h, v);
		p += 8;
		n -= 8;
	}
	uint64_t t = 0;
	memcpy(&t, p, n);
	return mix(h, t ^ (uint64_t)n << 56);
}

/* Size of a small scalar at p (what may precede "id"), or 0. */
static size_t scalar_len(const uint8_t *p, size_t n)
{
	if (n == 0)
		return 0;
	uint8_t b = p[0];
	size_t l = 0;
	if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
		l = 1;
	else if (b >= 0xa0 && b <= 0xbf)
		l = 1 + (size_t)(b & 0x1f);
	else if (b == 0xcc || b == 0xd0)
		l = 2;
	else if (b == 0xcd || b == 0xd1)
		l = 3;
	else if (b == 0xce || b == 0xd2)
		l = 5;
	else if (b == 0xcf || b == 0xd3)
		l = 9;
	else if (b == 0xd9 && n >= 2)
		l = 2 + (size_t)p[1];
	return l <= n ? l : 0;
}

bool kilnd_memo_key(const uint8_t *body, size_t len, kilnd_memo_key_t *k)
{
	memset(k, 0, sizeof(*k));
	if (len < 4 || len > MEMO_MAX_BYTES)
		return false;
	size_t pairs, off;
	if (body[0] >= 0x80 && body[0] <= 0x8f) {
		pairs = body[0] & 0x0f;
		off = 1;
	} else {
		return false;
	}
	for (size_t i = 0; i < pairs && i < 4; i++) {
		size_t kl = scalar_len(body + off, len - off);
		if (kl == 0 || body[off] < 0xa0 || body[off] > 0xbf)
			return false;
		bool is_id =
		    kl == 3 && body[off + 1] == 'i' && body[off + 2] == 'd';
		off += kl;
		size_t vl = scalar_len(body + off, len - off);
		if (vl == 0)
			return false;
		if (is_id) {
			uint8_t b = body[off];
			uint64_t id = 0;
			if (b <= 0x7f)
				id = b;
			else if (b >= 0xcc && b <= 0xcf)
				for (size_t j = 1; j < vl; j++)
					id = id << 8 | body[off + j];
			else
				return false;
			k->id = id;
			k->id_start = off;
			k->id_end = off + vl;
			k->body = body;
			k->len = len;
			k->hash = hash_bytes(hash_bytes(0x6b696c6e, body, off),
					     body + off + vl, len - off - vl);
			k->valid = true;
			return true;
		}
		off += vl;
	}
	return false;
}

static bool same(const struct kilnd_memo_entry *e, const kilnd_memo_key_t *k)
{
	size_t a = k->id_start, b = k->len - k->id_end;
	return e->bytes != NULL && e->hash == k->hash && e->len == a + b &&
	       memcmp(e->bytes, k->body, a) == 0 &&
	       memcmp(e->bytes + a, k->body + k->id_end, b) == 0;
}

bool kilnd_memo_get(kilnd_server_t *s, const kilnd_memo_key_t *k,
		    uint8_t sig[KILN_SIG_BYTES])
{
	if (s->memo == NULL || !k->valid)
		return false;
	struct kilnd_memo_entry *e = &s->memo[k->hash % MEMO_SLOTS];
	if (!same(e, k))
		return false;
	memcpy(sig, e->sig, KILN_SIG_BYTES);
	return true;
}

void kilnd_memo_put(kilnd_server_t *s, const kilnd_memo_key_t *k,
		    const uint8_t sig[KILN_SIG_BYTES])
{
	if (s->memo == NULL || k == NULL || !k->valid)
		return;
	struct kilnd_memo_entry *e = &s->memo[k->hash % MEMO_SLOTS];
	size_t a = k->id_start, b = k->len - k->id_end;
	if (same(e, k)) {
		memcpy(e->sig, sig, KILN_SIG_BYTES);
		return;
	}
	/* Direct-mapped: the newer request wins the slot; all entries
	 * together stay under MEMO_TOTAL bytes. */
	s->memo_bytes -= e->bytes != NULL ? e->len : 0;
	free(e->bytes);
	e->bytes = NULL;
	if (s->memo_bytes + a + b > MEMO_TOTAL)
		return;
	uint8_t *copy = malloc(a + b);
	if (copy == NULL)
		return;
	memcpy(copy, k->body, a);
	memcpy(copy + a, k->body + k->id_end, b);
	s->memo_bytes += a + b;
	e->bytes = copy;
	e->len = a + b;
	e->hash = k->hash;
	memcpy(e->sig, sig, KILN_SIG_BYTES);
}

int kilnd_memo_init(kilnd_server_t *s)
{
	s->memo = calloc(MEMO_SLOTS, sizeof(*s->memo));
	return s->memo != NULL ? 0 : -1;
}

void kilnd_memo_free(kilnd_server_t *s)
{
	for (size_t i = 0; s->memo != NULL && i < MEMO_SLOTS; i++)
		free(s->memo[i].bytes);
	free(s->memo);
	s->memo = NULL;
}
