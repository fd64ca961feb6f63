/*
 * memo.c — the hot-row memo: what a get needs from an entry's row (its
 * blob's SHA-256 and CRC-64, the size and the metadata), kept in memory
 * for keys read recently, so that a repeated get skips SQLite.
 *
 * Why it is coherent: the store's lock file means this process is the
 * only writer of the index, and every path here that changes or removes
 * an entry row (put, evict, gc, a dropped or repaired blob) forgets the
 * keys it changed after its commit. A get fills the memo from a lookup
 * only when no forget touched the slot's stripe since before that
 * lookup began (the stripe's generation), so a fill can never put back a
 * row that a concurrent writer has just replaced. Hits are added to the
 * memo when they are queued, so a get reports them before they are
 * written; last_used moves only with a hit that will rewrite it in the
 * index (once a minute per entry), so the memo's value is the index's and
 * the decision to rewrite it is the same as without the memo. A batch of
 * hits that fails to write forgets the whole memo.
 *
 * The table is direct-mapped (KILN__MEMO_SLOTS slots, a new key takes its
 * slot), with KILN__MEMO_STRIPES mutexes. Every lock here is a leaf.
 *
 * Threads: any.
 */
#include "cache/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Keys are SHA-256 signatures, but tests and tools use any 32 bytes: mix
 * all of them. */
static size_t slot_of(const uint8_t key[KILN_CACHE_KEY_BYTES])
{
	uint64_t w[4];
	memcpy(w, key, sizeof(w));
	uint64_t h =
	    (w[0] ^ (w[1] * 0x9e3779b97f4a7c15ull) ^
	     (w[2] * 0xc2b2ae3d27d4eb4full) ^ (w[3] * 0x165667b19e3779f9ull)) *
	    0xff51afd7ed558ccdull;
	return (size_t)(h >> 32) & (KILN__MEMO_SLOTS - 1);
}

static pthread_mutex_t *stripe(kiln_cache_t *c, size_t slot)
{
	return &c->memo_mu[slot & (KILN__MEMO_STRIPES - 1)];
}

int kiln__memo_init(kiln_cache_t *c)
{
	c->memo = calloc(KILN__MEMO_SLOTS, sizeof(*c->memo));
	if (c->memo == NULL)
		return -ENOMEM;
	for (int i = 0; i < KILN__MEMO_STRIPES; i++)
		pthread_mutex_init(&c->memo_mu[i], NULL);
	return 0;
}

void kiln__memo_free(kiln_cache_t *c)
{
	if (c->memo == NULL)
		return;
	for (int i = 0; i < KILN__MEMO_STRIPES; i++)
		pthread_mutex_destroy(&c->memo_mu[i]);
	free(c->memo);
	c->memo = NULL;
}

uint64_t kiln__memo_gen(kiln_cache_t *c, const uint8_t key[32])
{
	size_t s = slot_of(key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	uint64_t g = c->memo_gen[s & (KILN__MEMO_STRIPES - 1)];
	pthread_mutex_unlock(mu);
	return g;
}

bool kiln__memo_get(kiln_cache_t *c, const uint8_t key[32],
		    kiln__memo_row_t *out)
{
	size_t s = slot_of(key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	const kiln__memo_row_t *m = &c->memo[s];
	bool hit = m->valid && memcmp(m->key, key, KILN_CACHE_KEY_BYTES) == 0;
	if (hit)
		*out = *m;
	pthread_mutex_unlock(mu);
	return hit;
}

void kiln__memo_fill(kiln_cache_t *c, const kiln__memo_row_t *row, uint64_t gen)
{
	size_t s = slot_of(row->key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	if (c->memo_gen[s & (KILN__MEMO_STRIPES - 1)] == gen) {
		c->memo[s] = *row;
		c->memo[s].valid = true;
	}
	pthread_mutex_unlock(mu);
}

void kiln__memo_forget(kiln_cache_t *c, const uint8_t key[32])
{
	size_t s = slot_of(key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	c->memo_gen[s & (KILN__MEMO_STRIPES - 1)]++;
	if (memcmp(c->memo[s].key, key, KILN_CACHE_KEY_BYTES) == 0)
		c->memo[s].valid = false;
	pthread_mutex_unlock(mu);
}

void kiln__memo_forget_all(kiln_cache_t *c)
{
	for (size_t st = 0; st < KILN__MEMO_STRIPES; st++) {
		pthread_mutex_lock(&c->memo_mu[st]);
		c->memo_gen[st]++;
		for (size_t s = st; s < KILN__MEMO_SLOTS;
		     s += KILN__MEMO_STRIPES)
			c->memo[s].valid = false;
		pthread_mutex_unlock(&c->memo_mu[st]);
	}
}

void kiln__memo_hit(kiln_cache_t *c, const uint8_t key[32], int64_t when,
		    uint32_t hits)
{
	size_t s = slot_of(key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	kiln__memo_row_t *m = &c->memo[s];
	if (m->valid && memcmp(m->key, key, KILN_CACHE_KEY_BYTES) == 0) {
		m->hits += hits;
		if (when > m->last_used) /* INT64_MIN: hits only */
			m->last_used = when;
	}
	pthread_mutex_unlock(mu);
}

void kiln__memo_set_crc(kiln_cache_t *c, const uint8_t key[32],
			const uint8_t hash[32],
			const uint8_t crc[KILN__CRC_BYTES])
{
	size_t s = slot_of(key);
	pthread_mutex_t *mu = stripe(c, s);
	pthread_mutex_lock(mu);
	kiln__memo_row_t *m = &c->memo[s];
	/* the same key may name another blob by now (a replacing put) */
	if (m->valid && memcmp(m->key, key, KILN_CACHE_KEY_BYTES) == 0 &&
	    memcmp(m->blob, hash, 32) == 0) {
		memcpy(m->crc, crc, KILN__CRC_BYTES);
		m->has_crc = true;
	}
	pthread_mutex_unlock(mu);
}
