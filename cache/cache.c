/*
 * cache.c — the operations on an open store: get, put, touch, evict, gc,
 * list, stats, verify; and the pin table that keeps eviction away from the
 * blobs being read or put.
 *
 * Invariants:
 *   - a row is committed only after its blob is durable under its name;
 *   - blobs.refs is the number of entries rows that name the blob; a blob
 *     row and its file go when refs reaches 0;
 *   - gc never picks a blob with a pin; a blob gc has picked is marked
 *     dying until its file is gone, and a get that meets a dying blob is a
 *     miss; a put that meets one waits for the unlink, then writes anew;
 *   - evict (and dropping a corrupt blob) unlinks a pinned blob's file only
 *     when the last pin goes, unless a put re-used the blob meanwhile;
 *   - the gauges (entries, blobs, bytes) change only under write_mu.
 *
 * Threads: every function here may run on any thread, concurrently (see
 * cache.h). Lock order in internal.h.
 */
#include "cache/internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define GC_BATCH 256

/* ---- pins -------------------------------------------------------------- */

static kiln__pin_t *pin_find(kiln_cache_t *c, const uint8_t hash[32])
{
	for (size_t i = 0; i < c->npins; i++)
		if (memcmp(c->pins[i].hash, hash, 32) == 0)
			return &c->pins[i];
	return NULL;
}

static kiln__pin_t *pin_add(kiln_cache_t *c, const uint8_t hash[32])
{
	if (c->npins == c->cap_pins) {
		size_t cap = c->cap_pins ? 2 * c->cap_pins : 16;
		kiln__pin_t *np = realloc(c->pins, cap * sizeof(*np));
		if (np == NULL)
			return NULL;
		c->pins = np;
		c->cap_pins = cap;
	}
	kiln__pin_t *p = &c->pins[c->npins++];
	memset(p, 0, sizeof(*p));
	memcpy(p->hash, hash, 32);
	return p;
}

static void pin_remove(kiln_cache_t *c, kiln__pin_t *p)
{
	*p = c->pins[--c->npins];
}

/* A reader's pin: false when gc is removing the blob (or no memory). */
static bool pin_read(kiln_cache_t *c, const uint8_t hash[32])
{
	pthread_mutex_lock(&c->pin_mu);
	kiln__pin_t *p = pin_find(c, hash);
	if (p == NULL)
		p = pin_add(c, hash);
	bool ok = p != NULL && !p->dying;
	if (ok)
		p->count++;
	pthread_mutex_unlock(&c->pin_mu);
	return ok;
}

/* A writer's pin: waits out a gc that is removing the blob. */
static int pin_write(kiln_cache_t *c, const uint8_t hash[32])
{
	pthread_mutex_lock(&c->pin_mu);
	kiln__pin_t *p;
	while ((p = pin_find(c, hash)) != NULL && p->dying)
		pthread_cond_wait(&c->pin_cv, &c->pin_mu);
	if (p == NULL)
		p = pin_add(c, hash);
	if (p != NULL)
		p->count++;
	pthread_mutex_unlock(&c->pin_mu);
	return p != NULL ? 0 : -ENOMEM;
}

static void unpin(kiln_cache_t *c, const uint8_t hash[32])
{
	pthread_mutex_lock(&c->pin_mu);
	kiln__pin_t *p = pin_find(c, hash);
	if (p != NULL) {
		if (--p->count == 0) {
			if (p->unlink_on_release)
				kiln__blob_unlink(c, hash);
			pin_remove(c, p);
		}
	}
	pthread_mutex_unlock(&c->pin_mu);
}

/* The blob's row is gone: remove its file now, or when the last of the
 * other pins goes. self is 1 when the caller holds a pin on it. Call under
 * write_mu, so that the decision is ordered with puts that re-create the
 * row (they clear the mark under write_mu, see put_index). */
static void release_file(kiln_cache_t *c, const uint8_t hash[32], int self)
{
	pthread_mutex_lock(&c->pin_mu);
	kiln__pin_t *p = pin_find(c, hash);
	if (p != NULL && p->count > (uint32_t)self)
		p->unlink_on_release = true;
	else
		kiln__blob_unlink(c, hash);
	pthread_mutex_unlock(&c->pin_mu);
}

/* A put committed a row for hash: a pending unlink must not happen. Call
 * under write_mu. */
static void keep_file(kiln_cache_t *c, const uint8_t hash[32])
{
	pthread_mutex_lock(&c->pin_mu);
	kiln__pin_t *p = pin_find(c, hash);
	if (p != NULL)
		p->unlink_on_release = false;
	pthread_mutex_unlock(&c->pin_mu);
}

/* ---- small helpers ----------------------------------------------------- */

/* A 32-byte column; zeros when the stored value has another length (a
 * damaged row then names no blob, and reads as a miss). */
static void col32(sqlite3_stmt *st, int i, uint8_t out[32])
{
	const void *p = sqlite3_column_blob(st, i);
	if (p != NULL && sqlite3_column_bytes(st, i) == 32)
		memcpy(out, p, 32);
	else
		memset(out, 0, 32);
}

static uint64_t fs_free(const kiln_cache_t *c)
{
	struct statvfs v;
	if (statvfs(c->dir, &v) < 0)
		return UINT64_MAX; /* unknown: do not evict for it */
	return (uint64_t)v.f_bavail * v.f_frsize;
}

static int begin(kiln__conn_t *k, char *err, size_t errlen)
{
	return kiln__exec_stmt(k, kiln__stmt(k, KILN__ST_BEGIN), "begin", err,
			       errlen);
}

static int commit(kiln__conn_t *k, char *err, size_t errlen)
{
	return kiln__exec_stmt(k, kiln__stmt(k, KILN__ST_COMMIT), "commit", err,
			       errlen);
}

static void rollback(kiln__conn_t *k)
{
	if (!sqlite3_get_autocommit(k->db))
		sqlite3_exec(k->db, "ROLLBACK", NULL, NULL, NULL);
}

#define STMT_OR_FAIL(st, k, which, what)                                       \
	sqlite3_stmt *st = kiln__stmt((k), (which));                           \
	if (st == NULL)                                                        \
	return kiln__sqlerr((k), sqlite3_errcode((k)->db), (what), err, errlen)

/* The row's CRC-64 into out; false when it has none (NULL: a row from
 * before schema 2, not read since) or a malformed one. */
static bool col_crc(sqlite3_stmt *st, int i, uint8_t out[KILN__CRC_BYTES])
{
	if (sqlite3_column_type(st, i) != SQLITE_BLOB ||
	    sqlite3_column_bytes(st, i) != KILN__CRC_BYTES)
		return false;
	memcpy(out, sqlite3_column_blob(st, i), KILN__CRC_BYTES);
	return true;
}

/* Finds a blob row: 1 found (id, size, refs set; its checksum into crc and
 * *has_crc when those are not NULL), 0 absent, <0 error. */
static int blob_find_crc(kiln__conn_t *k, const uint8_t hash[32], int64_t *id,
			 uint64_t *size, int64_t *refs, uint8_t *crc,
			 bool *has_crc, char *err, size_t errlen)
{
	STMT_OR_FAIL(st, k, KILN__ST_BLOB_FIND, "find blob");
	sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*id = sqlite3_column_int64(st, 0);
		*size = (uint64_t)sqlite3_column_int64(st, 1);
		*refs = sqlite3_column_int64(st, 2);
		if (has_crc != NULL)
			*has_crc = col_crc(st, 3, crc);
	}
	sqlite3_reset(st);
	if (rc == SQLITE_ROW)
		return 1;
	if (rc == SQLITE_DONE)
		return 0;
	return kiln__sqlerr(k, rc, "find blob", err, errlen);
}

static int blob_find(kiln__conn_t *k, const uint8_t hash[32], int64_t *id,
		     uint64_t *size, int64_t *refs, char *err, size_t errlen)
{
	return blob_find_crc(k, hash, id, size, refs, NULL, NULL, err, errlen);
}

/* Records the blob's CRC-64 (a single-statement transaction). Call under
 * write_mu. */
static int blob_set_crc(kiln__conn_t *k, const uint8_t hash[32],
			const uint8_t crc[KILN__CRC_BYTES], char *err,
			size_t errlen)
{
	STMT_OR_FAIL(st, k, KILN__ST_BLOB_CRC, "record checksum");
	sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
	sqlite3_bind_blob(st, 2, crc, KILN__CRC_BYTES, SQLITE_STATIC);
	return kiln__exec_stmt(k, st, "record checksum", err, errlen);
}

/* Drops one reference to blob id; when it was the last, deletes the row
 * and reports the hash and size (*freed). Inside a write transaction. */
static int blob_unref(kiln__conn_t *k, int64_t id, bool *freed,
		      uint8_t hash[32], uint64_t *size, char *err,
		      size_t errlen)
{
	*freed = false;
	STMT_OR_FAIL(ref, k, KILN__ST_BLOB_REFS, "unref blob");
	sqlite3_bind_int64(ref, 1, id);
	sqlite3_bind_int64(ref, 2, -1);
	int rc = kiln__exec_stmt(k, ref, "unref blob", err, errlen);
	if (rc < 0)
		return rc;
	STMT_OR_FAIL(by, k, KILN__ST_BLOB_BY_ID, "read blob");
	sqlite3_bind_int64(by, 1, id);
	rc = sqlite3_step(by);
	if (rc != SQLITE_ROW) {
		sqlite3_reset(by);
		return rc == SQLITE_DONE
			   ? 0
			   : kiln__sqlerr(k, rc, "read blob", err, errlen);
	}
	col32(by, 0, hash);
	*size = (uint64_t)sqlite3_column_int64(by, 1);
	int64_t refs = sqlite3_column_int64(by, 2);
	sqlite3_reset(by);
	if (refs > 0)
		return 0;
	STMT_OR_FAIL(del, k, KILN__ST_BLOB_DEL, "delete blob");
	sqlite3_bind_int64(del, 1, id);
	rc = kiln__exec_stmt(k, del, "delete blob", err, errlen);
	if (rc == 0)
		*freed = true;
	return rc;
}

int kiln__index_put(kiln_cache_t *c, kiln__conn_t *k, const kiln__jrec_t *r,
		    int64_t last_used, uint64_t hits, kiln__put_effect_t *fx,
		    char *err, size_t errlen)
{
	memset(fx, 0, sizeof(*fx));
	int64_t build;
	int rc = kiln__build_id(c, k, r->target, r->fingerprint, &build, err,
				errlen);
	if (rc < 0)
		return rc;
	int64_t id, refs;
	uint64_t size;
	uint8_t crc[KILN__CRC_BYTES];
	bool has_crc = false;
	rc = blob_find_crc(k, r->hash, &id, &size, &refs, crc, &has_crc, err,
			   errlen);
	if (rc < 0)
		return rc;
	if (rc == 1) {
		STMT_OR_FAIL(st, k, KILN__ST_BLOB_REFS, "ref blob");
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int64(st, 2, 1);
		rc = kiln__exec_stmt(k, st, "ref blob", err, errlen);
		if (rc == 0 && r->has_crc &&
		    (!has_crc || memcmp(crc, r->crc, KILN__CRC_BYTES) != 0)) {
			rc = blob_set_crc(k, r->hash, r->crc, err, errlen);
			fx->crc_changed = true;
		}
	} else {
		STMT_OR_FAIL(st, k, KILN__ST_BLOB_INS, "insert blob");
		sqlite3_bind_blob(st, 1, r->hash, 32, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, (int64_t)r->size);
		sqlite3_bind_int64(st, 3, 1);
		if (r->has_crc)
			sqlite3_bind_blob(st, 4, r->crc, KILN__CRC_BYTES,
					  SQLITE_STATIC);
		else
			sqlite3_bind_null(st, 4);
		rc = kiln__exec_stmt(k, st, "insert blob", err, errlen);
		id = sqlite3_last_insert_rowid(k->db);
		fx->new_blob = true;
	}
	if (rc < 0)
		return rc;
	STMT_OR_FAIL(old, k, KILN__ST_ENTRY_BLOB, "read entry");
	sqlite3_bind_blob(old, 1, r->key, KILN_CACHE_KEY_BYTES, SQLITE_STATIC);
	rc = sqlite3_step(old);
	int64_t old_id = rc == SQLITE_ROW ? sqlite3_column_int64(old, 0) : 0;
	sqlite3_reset(old);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return kiln__sqlerr(k, rc, "read entry", err, errlen);
	if (rc == SQLITE_ROW) {
		fx->had_old = true;
		rc = blob_unref(k, old_id, &fx->old_freed, fx->old_hash,
				&fx->old_size, err, errlen);
		if (rc < 0)
			return rc;
	}
	STMT_OR_FAIL(st, k, KILN__ST_ENTRY_PUT, "insert entry");
	sqlite3_bind_blob(st, 1, r->key, KILN_CACHE_KEY_BYTES, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, id);
	sqlite3_bind_int64(st, 3, (int64_t)r->size);
	sqlite3_bind_int64(st, 4, build);
	sqlite3_bind_int64(st, 5, r->created);
	sqlite3_bind_int64(st, 6, last_used);
	sqlite3_bind_int64(st, 7, (int64_t)hits);
	sqlite3_bind_int64(st, 8, r->compile_ms);
	sqlite3_bind_int64(st, 9, r->source);
	return kiln__exec_stmt(k, st, "insert entry", err, errlen);
}

static void gauges_put(kiln_cache_t *c, const kiln__put_effect_t *fx,
		       uint64_t size)
{
	if (!fx->had_old)
		atomic_fetch_add(&c->entries, 1);
	if (fx->new_blob) {
		atomic_fetch_add(&c->blobs, 1);
		atomic_fetch_add(&c->bytes, size);
	}
	if (fx->old_freed) {
		atomic_fetch_sub(&c->blobs, 1);
		atomic_fetch_sub(&c->bytes, fx->old_size);
	}
}

/* ---- touches ----------------------------------------------------------- */

static int touch_cmp(const void *a, const void *b)
{
	return memcmp(((const kiln__touch_t *)a)->key,
		      ((const kiln__touch_t *)b)->key, 32);
}

/* Writes the pending hits; call with write_mu held. */
static int flush_locked(kiln_cache_t *c, char *err, size_t errlen)
{
	pthread_mutex_lock(&c->touch_mu);
	size_t n = c->ntouches;
	kiln__touch_t *t = NULL;
	if (n > 0) {
		t = malloc(n * sizeof(*t));
		if (t != NULL)
			memcpy(t, c->touches, n * sizeof(*t));
	}
	c->ntouches = 0;
	pthread_mutex_unlock(&c->touch_mu);
	if (n == 0)
		return 0;
	if (t == NULL) {
		KILN__COUNT(c, touch_dropped, n);
		return kiln__errf(err, errlen, -ENOMEM, "no memory for hits");
	}
	/* One row update per key, however often it was hit; keys in
	 * order, so neighbouring rows share page writes. */
	qsort(t, n, sizeof(*t), touch_cmp);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (m > 0 && memcmp(t[m - 1].key, t[i].key, 32) == 0) {
			t[m - 1].hits += t[i].hits;
			/* last_used is the time of the latest hit that
			 * rewrites it, as the memo has it (memo.c) */
			if (t[i].refresh &&
			    (!t[m - 1].refresh || t[i].when > t[m - 1].when))
				t[m - 1].when = t[i].when;
			t[m - 1].refresh |= t[i].refresh;
		} else {
			t[m++] = t[i];
		}
	}
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k != NULL) {
		rc = begin(k, err, errlen);
		for (size_t i = 0; rc == 0 && i < m; i++) {
			bool full = t[i].refresh;
			sqlite3_stmt *st = kiln__stmt(k, full ? KILN__ST_TOUCH
							      : KILN__ST_HITS);
			if (st == NULL) {
				rc = kiln__sqlerr(k, sqlite3_errcode(k->db),
						  "touch", err, errlen);
				break;
			}
			sqlite3_bind_blob(st, 1, t[i].key, KILN_CACHE_KEY_BYTES,
					  SQLITE_STATIC);
			if (full) {
				sqlite3_bind_int64(st, 2, t[i].when);
				sqlite3_bind_int64(st, 3, t[i].hits);
			} else {
				sqlite3_bind_int64(st, 2, t[i].hits);
			}
			rc = kiln__exec_stmt(k, st, "touch", err, errlen);
		}
		if (rc == 0)
			rc = commit(k, err, errlen);
		if (rc < 0)
			rollback(k);
		kiln__conn_put(c, k);
	}
	free(t);
	if (rc < 0) {
		KILN__COUNT(c, touch_dropped, n);
		/* the memo counted these hits (and last_used) as written */
		kiln__memo_forget_all(c);
		return rc;
	}
	KILN__COUNT(c, touch_flushes, 1);
	return 0;
}

int kiln_cache_flush(kiln_cache_t *c, char *err, size_t errlen)
{
	pthread_mutex_lock(&c->write_mu);
	int rc = flush_locked(c, err, errlen);
	pthread_mutex_unlock(&c->write_mu);
	return rc;
}

/* Queues a hit; flushes when the batch is full or old. Never fails: a hit
 * whose write fails is counted in touch_dropped. */
static void touch_queue(kiln_cache_t *c, const uint8_t key[32],
			int64_t last_used, uint32_t hits)
{
	int64_t now_ms = kiln__cache_now_ms(), when = kiln__cache_now();
	bool queued = false, refresh = false;
	pthread_mutex_lock(&c->touch_mu);
	if (c->ntouches < 4 * (size_t)c->opts.touch_batch) {
		if (c->ntouches == 0)
			c->touch_oldest_ms = now_ms;
		kiln__touch_t *t = &c->touches[c->ntouches++];
		memcpy(t->key, key, 32);
		t->when = when;
		t->hits = hits;
		t->refresh = last_used < when - KILN__LRU_GRANULARITY_S;
		queued = true;
		refresh = t->refresh;
	} else {
		KILN__COUNT(c, touch_dropped, 1);
	}
	bool due =
	    c->ntouches >= c->opts.touch_batch ||
	    now_ms - c->touch_oldest_ms >= (int64_t)c->opts.touch_flush_ms;
	pthread_mutex_unlock(&c->touch_mu);
	/* After touch_mu (both are leaf locks). The memo's last_used follows
	 * the index's: it moves only with a hit that rewrites it, so the
	 * next rewrite still comes a minute later. */
	if (queued)
		kiln__memo_hit(c, key, refresh ? when : INT64_MIN, hits);
	/* A get never waits for a writer to write its hit: when the write
	 * lock is busy, a later hit (or gc, list, stats, close) flushes. */
	if (due && pthread_mutex_trylock(&c->write_mu) == 0) {
		char err[256];
		if (flush_locked(c, err, sizeof(err)) < 0)
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"hits not written\" err=\"%s\"", err);
		pthread_mutex_unlock(&c->write_mu);
	}
}

/* ---- get --------------------------------------------------------------- */

/* A blob failed its check while pinned by the caller: if its row still
 * exists and the file fails its SHA-256 too, drop every row that names
 * it. A file whose SHA-256 holds was good all along: the row's checksum
 * was wrong (the index rotted, or the checksum came from a different
 * read), and it is recorded anew. Returns the rows dropped; DROP_GOOD
 * when the file's SHA-256 holds (its checksum then in good, when not NULL);
 * or -1 when the row went meanwhile or the file could not be read. */
#define DROP_GOOD (-2)
static int drop_bad(kiln_cache_t *c, const uint8_t hash[32], uint8_t *good)
{
	char err[256];
	int rc, dropped = -1;
	pthread_mutex_lock(&c->write_mu);
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, sizeof(err));
	if (k == NULL)
		goto out;
	int64_t id, refs;
	uint64_t size;
	uint8_t crc[KILN__CRC_BYTES], sum[KILN__CRC_BYTES];
	bool has_crc = false;
	rc = blob_find_crc(k, hash, &id, &size, &refs, crc, &has_crc, err,
			   sizeof(err));
	if (rc != 1)
		goto put; /* evicted meanwhile */
	int v = kiln__blob_check(c, hash, size, NULL, sum);
	if (v == KILN__BLOB_OK) {
		/* The caller checked against a checksum that does not hold
		 * for good bytes: a wrong row, or a memo row older than a
		 * repair. */
		if ((!has_crc || memcmp(crc, sum, KILN__CRC_BYTES) != 0) &&
		    blob_set_crc(k, hash, sum, err, sizeof(err)) == 0) {
			KILN__COUNT(c, checksums_repaired, 1);
			char hex[KILN__HASH_HEX];
			kiln__hex(hash, 32, hex);
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"blob checksum repaired\" blob=%s", hex);
		}
		kiln__memo_forget_all(c);
		if (good != NULL)
			memcpy(good, sum, KILN__CRC_BYTES);
		dropped = DROP_GOOD;
	}
	if (v != KILN__BLOB_BAD)
		goto put; /* re-put meanwhile, repaired, or an I/O error */
	rc = begin(k, err, sizeof(err));
	sqlite3_stmt *st =
	    rc == 0 ? kiln__stmt(k, KILN__ST_ENTRY_DEL_BLOB) : NULL;
	if (st != NULL) {
		sqlite3_bind_int64(st, 1, id);
		rc = kiln__exec_stmt(k, st, "drop entries", err, sizeof(err));
		dropped = sqlite3_changes(k->db);
	} else if (rc == 0) {
		rc = KILN_EINTERNAL;
	}
	if (rc == 0 && dropped < 0)
		dropped = 0;
	if (rc == 0) {
		st = kiln__stmt(k, KILN__ST_BLOB_DEL);
		if (st == NULL)
			rc = KILN_EINTERNAL;
		else
			sqlite3_bind_int64(st, 1, id);
		if (rc == 0)
			rc = kiln__exec_stmt(k, st, "drop blob", err,
					     sizeof(err));
	}
	if (rc == 0)
		rc = commit(k, err, sizeof(err));
	if (rc < 0) {
		rollback(k);
		KILN_LOG(KILN_LOG_WARN,
			 "msg=\"corrupt blob not dropped\" err=\"%s\"", err);
		dropped = -1;
		goto put;
	}
	kiln__memo_forget_all(c); /* every key that named the blob */
	atomic_fetch_sub(&c->entries, (uint64_t)dropped);
	atomic_fetch_sub(&c->blobs, 1);
	atomic_fetch_sub(&c->bytes, size);
	KILN__COUNT(c, corrupt_dropped, dropped);
	release_file(c, hash, 1);
	char hex[KILN__HASH_HEX];
	kiln__hex(hash, 32, hex);
	KILN_LOG(KILN_LOG_WARN,
		 "msg=\"corrupt blob dropped\" blob=%s entries=%d", hex,
		 dropped);
put:
	kiln__conn_put(c, k);
out:
	pthread_mutex_unlock(&c->write_mu);
	return dropped;
}

/* Reads key's row (from the memo, or from the index, then kept in the
 * memo); 1 found, 0 absent, <0 error. */
static int lookup(kiln_cache_t *c, const uint8_t key[32], kiln__memo_row_t *m,
		  char *err, size_t errlen)
{
	if (kiln__memo_get(c, key, m))
		return 1;
	uint64_t gen = kiln__memo_gen(c, key);
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL)
		return rc;
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_GET);
	if (st == NULL) {
		rc =
		    kiln__sqlerr(k, sqlite3_errcode(k->db), "get", err, errlen);
		kiln__conn_put(c, k);
		return rc;
	}
	sqlite3_bind_blob(st, 1, key, KILN_CACHE_KEY_BYTES, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		memset(m, 0, sizeof(*m));
		memcpy(m->key, key, KILN_CACHE_KEY_BYTES);
		col32(st, 0, m->blob);
		m->size = (uint64_t)sqlite3_column_int64(st, 1);
		m->build = sqlite3_column_int64(st, 2);
		m->created = sqlite3_column_int64(st, 3);
		m->last_used = sqlite3_column_int64(st, 4);
		m->hits = (uint64_t)sqlite3_column_int64(st, 5);
		m->compile_ms = (uint32_t)sqlite3_column_int64(st, 6);
		m->source = (uint8_t)sqlite3_column_int(st, 7);
		m->has_crc = col_crc(st, 8, m->crc);
		rc = 1;
	} else if (rc == SQLITE_DONE) {
		rc = 0;
	} else {
		rc = kiln__sqlerr(k, rc, "get", err, errlen);
	}
	sqlite3_reset(st); /* ends the read transaction now */
	kiln__conn_put(c, k);
	if (rc == 1)
		kiln__memo_fill(c, m, gen);
	return rc;
}

/* A blob whose row had no checksum (schema 1) passed its SHA-256: record
 * the checksum so later reads take the fast check (and in key's memo row,
 * when key is not NULL). Best effort: a store on a read-only filesystem
 * keeps reading by SHA-256. */
static int record_crc(kiln_cache_t *c, const uint8_t *key,
		      const uint8_t hash[32],
		      const uint8_t crc[KILN__CRC_BYTES])
{
	char err[256] = "";
	int rc = 0;
	pthread_mutex_lock(&c->write_mu);
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, sizeof(err));
	if (k != NULL) {
		rc = blob_set_crc(k, hash, crc, err, sizeof(err));
		kiln__conn_put(c, k);
	}
	pthread_mutex_unlock(&c->write_mu);
	if (rc < 0)
		KILN_LOG(KILN_LOG_DEBUG,
			 "msg=\"checksum not recorded\" err=\"%s\"", err);
	else if (key != NULL)
		kiln__memo_set_crc(c, key, hash, crc);
	return rc;
}

int kiln_cache_get(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		   kiln_cache_blob_t *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	kiln__memo_row_t m;
	int rc = lookup(c, key, &m, err, errlen);
	if (rc <= 0) {
		if (rc == 0) {
			KILN__COUNT(c, misses, 1);
			rc = kiln__errf(err, errlen, KILN_ENOTFOUND,
					"not in the store");
		}
		return rc;
	}
	kiln_cache_entry_t *e = &out->entry;
	memcpy(e->key, key, KILN_CACHE_KEY_BYTES);
	memcpy(e->blob, m.blob, 32);
	e->size = m.size;
	e->created = m.created;
	e->last_used = m.last_used;
	e->hits = m.hits;
	e->compile_ms = m.compile_ms;
	e->source = (kiln_cache_source_t)m.source;
	kiln__build_lookup(c, m.build, e);
	const uint8_t *hash = m.blob;
	if (!pin_read(c, hash)) { /* being evicted right now */
		KILN__COUNT(c, misses, 1);
		return kiln__errf(err, errlen, KILN_ENOTFOUND,
				  "evicted while looked up");
	}
	uint8_t sum[KILN__CRC_BYTES];
	rc = kiln__blob_read(c, hash, m.size, m.has_crc ? m.crc : NULL, sum,
			     &out->data, err, errlen);
	if (rc == KILN__BLOB_BAD &&
	    drop_bad(c, hash, m.has_crc ? m.crc : NULL) == DROP_GOOD &&
	    m.has_crc) /* the row's checksum was wrong: read again */
		rc = kiln__blob_read(c, hash, m.size, m.crc, NULL, &out->data,
				     err, errlen);
	unpin(c, hash);
	if (rc == KILN__BLOB_OK) {
		if (!m.has_crc)
			record_crc(c, key, hash, sum);
		out->size = (size_t)m.size;
		KILN__COUNT(c, hits, 1);
		touch_queue(c, key, m.last_used, 1);
		return 0;
	}
	KILN__COUNT(c, misses, 1);
	if (rc < 0)
		return rc;
	if (rc == KILN__BLOB_IOERR)
		KILN_LOG(KILN_LOG_WARN, "msg=\"blob unreadable\" err=\"%s\"",
			 err != NULL ? err : "");
	return KILN_ENOTFOUND; /* err holds the reason */
}

void kiln_cache_blob_release(kiln_cache_blob_t *b)
{
	if (b == NULL)
		return;
	free(b->data);
	b->data = NULL;
	b->size = 0;
}

/* ---- gc ---------------------------------------------------------------- */

typedef struct victim {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	uint8_t hash[32];
	int64_t blob;
	uint64_t size;
	int64_t refs_left; /* refs of the blob after this batch so far */
	bool last;	   /* this victim drops the blob's last reference */
} victim_t;

/* One batch: picks up to GC_BATCH unpinned LRU entries until need bytes
 * are freed, deletes them, unlinks their blobs. Call under write_mu.
 * Returns the number evicted (0 = nothing evictable) or an error. */
static int gc_batch(kiln_cache_t *c, kiln__conn_t *k, uint64_t need,
		    int64_t *skip, uint64_t *freed, char *err, size_t errlen)
{
	victim_t *v = calloc(GC_BATCH, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_LRU);
	if (st == NULL) {
		free(v);
		return kiln__sqlerr(k, sqlite3_errcode(k->db), "lru", err,
				    errlen);
	}
	sqlite3_bind_int64(st, 1, GC_BATCH + *skip);
	int n = 0, rc, seen = 0;
	while (n < GC_BATCH && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (seen++ < *skip)
			continue;
		col32(st, 0, v[n].key);
		v[n].blob = sqlite3_column_int64(st, 1);
		col32(st, 2, v[n].hash);
		v[n].size = (uint64_t)sqlite3_column_int64(st, 3);
		v[n].refs_left = sqlite3_column_int64(st, 4);
		n++;
	}
	sqlite3_reset(st);
	/* Choose: skip pinned blobs; mark the blobs that lose their last
	 * reference dying so no reader starts on them. */
	int chosen = 0;
	uint64_t got = 0;
	pthread_mutex_lock(&c->pin_mu);
	for (int i = 0; i < n && got < need; i++) {
		kiln__pin_t *p = pin_find(c, v[i].hash);
		if (p != NULL && (p->count > 0 || p->dying)) {
			if (p->count > 0) {
				(*skip)++;
				continue;
			}
		}
		/* refs_left is per blob; later rows of the same blob see
		 * the decrements of earlier ones. */
		int64_t left = v[i].refs_left;
		for (int j = 0; j < chosen; j++)
			if (v[j].blob == v[i].blob)
				left = v[j].refs_left;
		v[i].refs_left = left - 1;
		v[i].last = v[i].refs_left <= 0;
		if (v[i].last) {
			if (p == NULL)
				p = pin_add(c, v[i].hash);
			if (p == NULL) { /* no memory: leave it be */
				v[i].refs_left++;
				continue;
			}
			p->dying = true;
			got += v[i].size;
		}
		if (chosen != i)
			v[chosen] = v[i];
		chosen++;
	}
	pthread_mutex_unlock(&c->pin_mu);

	rc = chosen > 0 ? begin(k, err, errlen) : 0;
	for (int i = 0; rc == 0 && i < chosen; i++) {
		sqlite3_stmt *d = kiln__stmt(k, KILN__ST_ENTRY_DEL);
		sqlite3_stmt *r = d ? kiln__stmt(k, KILN__ST_BLOB_REFS) : NULL;
		if (r == NULL) {
			rc = KILN_EINTERNAL;
			break;
		}
		sqlite3_bind_blob(d, 1, v[i].key, 32, SQLITE_STATIC);
		rc = kiln__exec_stmt(k, d, "evict", err, errlen);
		if (rc == 0 && !v[i].last) {
			sqlite3_bind_int64(r, 1, v[i].blob);
			sqlite3_bind_int64(r, 2, -1);
			rc = kiln__exec_stmt(k, r, "evict", err, errlen);
		} else if (rc == 0) {
			sqlite3_stmt *b = kiln__stmt(k, KILN__ST_BLOB_DEL);
			if (b == NULL) {
				rc = KILN_EINTERNAL;
				break;
			}
			sqlite3_bind_int64(b, 1, v[i].blob);
			rc = kiln__exec_stmt(k, b, "evict", err, errlen);
		}
	}
	if (rc == 0 && chosen > 0)
		rc = commit(k, err, errlen);
	if (rc < 0)
		rollback(k);
	for (int i = 0; rc == 0 && i < chosen; i++)
		kiln__memo_forget(c, v[i].key);
	uint64_t blobs_gone = 0;
	pthread_mutex_lock(&c->pin_mu);
	for (int i = 0; i < chosen; i++) {
		if (!v[i].last)
			continue;
		kiln__pin_t *p = pin_find(c, v[i].hash);
		if (rc == 0) {
			kiln__blob_unlink(c, v[i].hash);
			blobs_gone++;
		}
		if (p != NULL && p->count == 0)
			pin_remove(c, p);
		else if (p != NULL)
			p->dying = false;
	}
	pthread_cond_broadcast(&c->pin_cv);
	pthread_mutex_unlock(&c->pin_mu);
	if (rc == 0) {
		atomic_fetch_sub(&c->entries, (uint64_t)chosen);
		atomic_fetch_sub(&c->blobs, blobs_gone);
		atomic_fetch_sub(&c->bytes, got);
		KILN__COUNT(c, evictions, chosen);
		KILN__COUNT(c, evicted_bytes, got);
		*freed += got;
	}
	free(v);
	if (rc < 0)
		return rc;
	return chosen > 0 ? chosen : (n > 0 && *skip > 0 ? -EAGAIN : 0);
}

/* Evicts until bytes + extra <= target and the disk keeps min_free_bytes
 * free with extra more bytes written. Call under write_mu. */
static int gc_locked(kiln_cache_t *c, uint64_t target, uint64_t extra,
		     uint64_t *evicted, char *err, size_t errlen)
{
	char ferr[256];
	if (flush_locked(c, ferr, sizeof(ferr)) < 0)
		KILN_LOG(KILN_LOG_WARN, "msg=\"hits not written\" err=\"%s\"",
			 ferr);
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL)
		return rc;
	int64_t skip = 0;
	uint64_t total = 0, freed = 0;
	for (;;) {
		uint64_t bytes = atomic_load(&c->bytes), free_b = fs_free(c);
		uint64_t need = 0,
			 want_free = atomic_load(&c->min_free_bytes) + extra;
		if (bytes + extra > target)
			need = bytes + extra - target;
		if (free_b < want_free && want_free - free_b > need)
			need = want_free - free_b;
		if (need == 0)
			break;
		rc = gc_batch(c, k, need, &skip, &freed, err, errlen);
		if (rc == -EAGAIN)
			continue; /* a batch of pinned entries: look further */
		if (rc <= 0)
			break;
		total += (uint64_t)rc;
	}
	kiln__conn_put(c, k);
	KILN__COUNT(c, gc_runs, 1);
	if (evicted != NULL)
		*evicted = total;
	if (total > 0)
		KILN_LOG(KILN_LOG_INFO,
			 "msg=\"gc\" evicted=%llu freed_bytes=%llu bytes=%llu",
			 (unsigned long long)total, (unsigned long long)freed,
			 (unsigned long long)atomic_load(&c->bytes));
	return rc < 0 ? rc : 0;
}

int kiln_cache_gc(kiln_cache_t *c, uint64_t target_bytes, uint64_t *evicted,
		  char *err, size_t errlen)
{
	if (target_bytes == UINT64_MAX)
		target_bytes = atomic_load(&c->max_bytes);
	pthread_mutex_lock(&c->write_mu);
	int rc = gc_locked(c, target_bytes, 0, evicted, err, errlen);
	pthread_mutex_unlock(&c->write_mu);
	return rc;
}

/* ---- put --------------------------------------------------------------- */

/* 1 when the blob already has a row and a file that verifies (a rotted
 * one is written anew from the caller's bytes, which heals it for every
 * key that shares it). The caller holds a pin on hash. */
static int blob_present(kiln_cache_t *c, const uint8_t hash[32])
{
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, NULL, 0);
	if (k == NULL)
		return 0;
	int64_t id, refs;
	uint64_t size;
	uint8_t crc[KILN__CRC_BYTES];
	bool has_crc = false;
	int found =
	    blob_find_crc(k, hash, &id, &size, &refs, crc, &has_crc, NULL, 0);
	kiln__conn_put(c, k);
	if (found != 1)
		return 0;
	return kiln__blob_check(c, hash, size, has_crc ? crc : NULL, NULL) ==
	       KILN__BLOB_OK;
}

static int check_meta(const kiln_cache_meta_t *m, char *err, size_t errlen)
{
	if (m->target != NULL && strlen(m->target) >= KILN_CACHE_TARGET_MAX)
		return kiln__errf(err, errlen, KILN_ETOOLARGE,
				  "target is %zu bytes; at most %d",
				  strlen(m->target), KILN_CACHE_TARGET_MAX - 1);
	if (m->fingerprint != NULL &&
	    strlen(m->fingerprint) >= KILN_CACHE_FINGERPRINT_MAX)
		return kiln__errf(err, errlen, KILN_ETOOLARGE,
				  "fingerprint is %zu bytes; at most %d",
				  strlen(m->fingerprint),
				  KILN_CACHE_FINGERPRINT_MAX - 1);
	if (m->source != KILN_CACHE_SOURCE_COMPILED &&
	    m->source != KILN_CACHE_SOURCE_REMOTE)
		return kiln__errf(err, errlen, -EINVAL, "unknown source %d",
				  (int)m->source);
	return 0;
}

static int put_index(kiln_cache_t *c, const kiln__jrec_t *r, bool wrote,
		     kiln__put_effect_t *fx, char *err, size_t errlen)
{
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL) {
		if (wrote) /* cannot tell whether a row names it: scan */
			atomic_store(&c->dirty, true);
		return rc;
	}
	pthread_mutex_lock(&c->builds_mu);
	size_t nbuilds = c->nbuilds;
	pthread_mutex_unlock(&c->builds_mu);
	rc = begin(k, err, errlen);
	if (rc == 0)
		rc = kiln__journal_append(c, r, err, errlen);
	if (rc == 0)
		rc = kiln__index_put(c, k, r, r->created, 0, fx, err, errlen);
	if (rc == 0)
		rc = commit(k, err, errlen);
	if (rc < 0) {
		rollback(k);
		pthread_mutex_lock(&c->builds_mu);
		bool reload = c->nbuilds != nbuilds;
		pthread_mutex_unlock(&c->builds_mu);
		if (reload)
			kiln__builds_load(c, k, NULL, 0);
		/* A blob this put wrote and no row names goes again. */
		int64_t id, refs;
		uint64_t size;
		int f = wrote
			    ? blob_find(k, r->hash, &id, &size, &refs, NULL, 0)
			    : 1;
		if (f == 0)
			release_file(c, r->hash, 1);
		else if (f < 0)
			atomic_store(&c->dirty, true);
	} else {
		if (fx->crc_changed) /* other keys' rows name the blob */
			kiln__memo_forget_all(c);
		else
			kiln__memo_forget(c, r->key);
		gauges_put(c, fx, r->size);
		keep_file(c, r->hash);
		if (fx->old_freed)
			release_file(c, fx->old_hash, 0);
		if (++c->puts_since_journal_check >= 1024) {
			c->puts_since_journal_check = 0;
			struct stat js;
			if (c->journal_fd >= 0 &&
			    fstat(c->journal_fd, &js) == 0 &&
			    (uint64_t)js.st_size > kiln__journal_limit(c)) {
				char jerr[256];
				if (kiln__journal_compact(c, k, jerr,
							  sizeof(jerr)) < 0) {
					KILN_LOG(KILN_LOG_WARN,
						 "msg=\"journal not "
						 "rewritten\" err=\"%s\"",
						 jerr);
					atomic_store(&c->dirty, true);
				}
			}
		}
	}
	kiln__conn_put(c, k);
	return rc;
}

/* A blob this put named but could not make durable: remove it unless a
 * row (another put's) names it. Call under write_mu, holding its pin. */
static void put_forget(kiln_cache_t *c, const uint8_t hash[32])
{
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, NULL, 0);
	int64_t id, refs;
	uint64_t size;
	int f = k != NULL ? blob_find(k, hash, &id, &size, &refs, NULL, 0) : -1;
	kiln__conn_put(c, k);
	if (f == 0)
		release_file(c, hash, 1);
	else if (f < 0)
		atomic_store(&c->dirty, true);
}

int kiln_cache_put(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		   const void *bytes, size_t size,
		   const kiln_cache_meta_t *meta, char *err, size_t errlen)
{
	static const kiln_cache_meta_t none = {NULL, NULL, 0, 0};
	const kiln_cache_meta_t *m = meta != NULL ? meta : &none;
	int rc = check_meta(m, err, errlen);
	if (rc == 0 && bytes == NULL && size > 0)
		rc = kiln__errf(err, errlen, -EINVAL, "no bytes");
	if (rc == 0 && size > atomic_load(&c->max_bytes))
		rc =
		    kiln__errf(err, errlen, KILN_ETOOLARGE,
			       "blob of %zu bytes exceeds max_bytes %llu", size,
			       (unsigned long long)atomic_load(&c->max_bytes));
	if (rc < 0) {
		KILN__COUNT(c, put_errors, 1);
		return rc;
	}
	kiln__jrec_t r;
	memcpy(r.key, key, KILN_CACHE_KEY_BYTES);
	kiln__sha256(c, size > 0 ? bytes : "", size, r.hash);
	kiln__crc_bytes(kiln__crc64(0, bytes, size), r.crc);
	r.has_crc = true;
	r.size = size;
	r.created = kiln__cache_now();
	r.compile_ms = m->compile_ms;
	r.source = (uint8_t)m->source;
	snprintf(r.target, sizeof(r.target), "%s", m->target ? m->target : "");
	snprintf(r.fingerprint, sizeof(r.fingerprint), "%s",
		 m->fingerprint ? m->fingerprint : "");

	if ((rc = pin_write(c, r.hash)) < 0) {
		KILN__COUNT(c, put_errors, 1);
		return rc;
	}
	bool wrote = false, named = false;
	/* No eviction before the write: on a full disk the put fails and
	 * everything stored stays. The gc after a put restores the limits. */
	if (!blob_present(c, r.hash)) {
		rc = kiln__blob_write(c, r.hash, bytes, size, &named, err,
				      errlen);
		wrote = named;
	}
	kiln__put_effect_t fx;
	pthread_mutex_lock(&c->write_mu);
	if (rc == 0)
		rc = put_index(c, &r, wrote, &fx, err, errlen);
	else if (named) /* renamed, then the directory fsync failed */
		put_forget(c, r.hash);
	if (rc == 0 && (atomic_load(&c->bytes) > atomic_load(&c->max_bytes) ||
			fs_free(c) < atomic_load(&c->min_free_bytes))) {
		/* Still pinned: gc cannot pick the blob just put. */
		char gerr[256];
		if (gc_locked(c, atomic_load(&c->max_bytes) / 10 * 9, 0, NULL,
			      gerr, sizeof(gerr)) < 0)
			KILN_LOG(KILN_LOG_WARN, "msg=\"gc failed\" err=\"%s\"",
				 gerr);
	}
	pthread_mutex_unlock(&c->write_mu);
	unpin(c, r.hash);
	if (rc < 0) {
		KILN__COUNT(c, put_errors, 1);
		KILN_LOG(KILN_LOG_WARN, "msg=\"put failed\" err=\"%s\"",
			 err != NULL ? err : kiln_strerror(rc));
		return rc;
	}
	KILN__COUNT(c, puts, 1);
	if (!fx.new_blob)
		KILN__COUNT(c, dedup_puts, 1);
	return 0;
}

/* ---- touch, evict ------------------------------------------------------ */

int kiln_cache_touch(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		     char *err, size_t errlen)
{
	return kiln_cache_touch_n(c, key, 1, err, errlen);
}

int kiln_cache_touch_n(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		       uint32_t hits, char *err, size_t errlen)
{
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL)
		return rc;
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_EXISTS);
	if (st == NULL) {
		rc = kiln__sqlerr(k, sqlite3_errcode(k->db), "touch", err,
				  errlen);
	} else {
		sqlite3_bind_blob(st, 1, key, KILN_CACHE_KEY_BYTES,
				  SQLITE_STATIC);
		rc = sqlite3_step(st);
		sqlite3_reset(st);
		rc = rc == SQLITE_ROW ? 0
		     : rc == SQLITE_DONE
			 ? kiln__errf(err, errlen, KILN_ENOTFOUND,
				      "not in the store")
			 : kiln__sqlerr(k, rc, "touch", err, errlen);
	}
	kiln__conn_put(c, k);
	if (rc == 0)
		touch_queue(c, key, INT64_MIN, hits); /* explicit: always */
	return rc;
}

int kiln_cache_evict(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		     char *err, size_t errlen)
{
	int rc = 0;
	pthread_mutex_lock(&c->write_mu);
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL) {
		pthread_mutex_unlock(&c->write_mu);
		return rc;
	}
	bool freed = false;
	uint8_t hash[32];
	uint64_t size = 0;
	rc = begin(k, err, errlen);
	sqlite3_stmt *st = rc == 0 ? kiln__stmt(k, KILN__ST_ENTRY_BLOB) : NULL;
	if (rc == 0 && st == NULL)
		rc = KILN_EINTERNAL;
	if (rc == 0) {
		sqlite3_bind_blob(st, 1, key, KILN_CACHE_KEY_BYTES,
				  SQLITE_STATIC);
		int s = sqlite3_step(st);
		int64_t id = s == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
		sqlite3_reset(st);
		if (s == SQLITE_DONE)
			rc = kiln__errf(err, errlen, KILN_ENOTFOUND,
					"not in the store");
		else if (s != SQLITE_ROW)
			rc = kiln__sqlerr(k, s, "evict", err, errlen);
		if (rc == 0) {
			sqlite3_stmt *d = kiln__stmt(k, KILN__ST_ENTRY_DEL);
			if (d == NULL)
				rc = KILN_EINTERNAL;
			else
				sqlite3_bind_blob(d, 1, key,
						  KILN_CACHE_KEY_BYTES,
						  SQLITE_STATIC);
			if (rc == 0)
				rc =
				    kiln__exec_stmt(k, d, "evict", err, errlen);
		}
		if (rc == 0)
			rc =
			    blob_unref(k, id, &freed, hash, &size, err, errlen);
	}
	if (rc == 0)
		rc = commit(k, err, errlen);
	if (rc < 0) {
		rollback(k);
	} else {
		kiln__memo_forget(c, key);
		atomic_fetch_sub(&c->entries, 1);
		KILN__COUNT(c, evictions, 1);
		if (freed) {
			atomic_fetch_sub(&c->blobs, 1);
			atomic_fetch_sub(&c->bytes, size);
			KILN__COUNT(c, evicted_bytes, size);
		}
	}
	if (rc == 0 && freed)
		release_file(c, hash, 0);
	kiln__conn_put(c, k);
	pthread_mutex_unlock(&c->write_mu);
	return rc;
}

/* ---- list, stats, verify ----------------------------------------------- */

void kiln_cache_filter_init(kiln_cache_filter_t *f)
{
	memset(f, 0, sizeof(*f));
	f->source = -1;
}

int kiln_cache_list(kiln_cache_t *c, const kiln_cache_filter_t *filter,
		    kiln_cache_order_t order, size_t limit,
		    kiln_cache_entry_t **out, size_t *n, char *err,
		    size_t errlen)
{
	static const char *const orders[] = {
	    [KILN_CACHE_ORDER_LRU] = "e.last_used, e.created, e.key",
	    [KILN_CACHE_ORDER_MRU] = "e.last_used DESC, e.created DESC, e.key",
	    [KILN_CACHE_ORDER_SIZE] = "e.size DESC, e.key",
	    [KILN_CACHE_ORDER_HITS] = "e.hits DESC, e.key",
	    [KILN_CACHE_ORDER_CREATED] = "e.created DESC, e.key",
	};
	*out = NULL;
	*n = 0;
	if ((unsigned)order > KILN_CACHE_ORDER_CREATED)
		return kiln__errf(err, errlen, -EINVAL, "unknown order %d",
				  (int)order);
	kiln_cache_filter_t all;
	kiln_cache_filter_init(&all);
	const kiln_cache_filter_t *f = filter != NULL ? filter : &all;
	char ferr[256];
	if (kiln_cache_flush(c, ferr, sizeof(ferr)) < 0)
		KILN_LOG(KILN_LOG_WARN, "msg=\"hits not written\" err=\"%s\"",
			 ferr);
	char sql[1024];
	int len = snprintf(
	    sql, sizeof(sql),
	    "SELECT e.key, b.hash, e.size, u.target, u.fingerprint, e.created,"
	    " e.last_used, e.hits, e.compile_ms, e.source FROM entries e"
	    " JOIN blobs b ON b.id = e.blob JOIN builds u ON u.id = e.build"
	    " WHERE (?1 IS NULL OR u.target = ?1)"
	    " AND (?2 IS NULL OR u.fingerprint = ?2)"
	    " AND (?3 < 0 OR e.source = ?3)"
	    " AND (?4 = 0 OR e.last_used < ?4) AND e.size >= ?5"
	    " ORDER BY %s",
	    orders[order]);
	if (limit > 0)
		snprintf(sql + len, sizeof(sql) - (size_t)len, " LIMIT %zu",
			 limit);
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL)
		return rc;
	sqlite3_stmt *st;
	rc = sqlite3_prepare_v2(k->db, sql, -1, &st, NULL);
	if (rc != SQLITE_OK) {
		rc = kiln__sqlerr(k, rc, "list", err, errlen);
		kiln__conn_put(c, k);
		return rc;
	}
	if (f->target != NULL)
		sqlite3_bind_text(st, 1, f->target, -1, SQLITE_STATIC);
	if (f->fingerprint != NULL)
		sqlite3_bind_text(st, 2, f->fingerprint, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 3, f->source);
	sqlite3_bind_int64(st, 4, f->unused_since);
	sqlite3_bind_int64(st, 5, (int64_t)f->min_size);
	kiln_cache_entry_t *v = NULL;
	size_t cnt = 0, cap = 0;
	int out_rc = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (cnt == cap) {
			cap = cap ? 2 * cap : 64;
			kiln_cache_entry_t *nv = realloc(v, cap * sizeof(*nv));
			if (nv == NULL) {
				out_rc = -ENOMEM;
				break;
			}
			v = nv;
		}
		kiln_cache_entry_t *e = &v[cnt++];
		memset(e, 0, sizeof(*e));
		col32(st, 0, e->key);
		col32(st, 1, e->blob);
		e->size = (uint64_t)sqlite3_column_int64(st, 2);
		snprintf(e->target, sizeof(e->target), "%s",
			 (const char *)sqlite3_column_text(st, 3));
		snprintf(e->fingerprint, sizeof(e->fingerprint), "%s",
			 (const char *)sqlite3_column_text(st, 4));
		e->created = sqlite3_column_int64(st, 5);
		e->last_used = sqlite3_column_int64(st, 6);
		e->hits = (uint64_t)sqlite3_column_int64(st, 7);
		e->compile_ms = (uint32_t)sqlite3_column_int64(st, 8);
		e->source = (kiln_cache_source_t)sqlite3_column_int(st, 9);
	}
	if (out_rc == 0 && rc != SQLITE_DONE)
		out_rc = kiln__sqlerr(k, rc, "list", err, errlen);
	sqlite3_finalize(st);
	kiln__conn_put(c, k);
	if (out_rc < 0) {
		free(v);
		return out_rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

int kiln_cache_stats(kiln_cache_t *c, kiln_cache_stats_t *out, char *err,
		     size_t errlen)
{
	(void)err;
	(void)errlen;
	char ferr[256];
	if (kiln_cache_flush(c, ferr, sizeof(ferr)) < 0)
		KILN_LOG(KILN_LOG_WARN, "msg=\"hits not written\" err=\"%s\"",
			 ferr);
#define KILN__STAT_READ(name, doc)                                             \
	out->name = atomic_load_explicit(&c->n_##name, memory_order_relaxed);
	KILN_CACHE_STATS(KILN__STAT_READ)
#undef KILN__STAT_READ
	out->entries = atomic_load(&c->entries);
	out->blobs = atomic_load(&c->blobs);
	out->bytes = atomic_load(&c->bytes);
	out->max_bytes = atomic_load(&c->max_bytes);
	out->min_free_bytes = atomic_load(&c->min_free_bytes);
	uint64_t f = fs_free(c);
	out->fs_free_bytes = f == UINT64_MAX ? 0 : f;
	char wal[PATH_MAX];
	snprintf(wal, sizeof(wal), "%s-wal", c->index_path);
	out->index_bytes = file_size(c->index_path) + file_size(wal);
	return 0;
}

void kiln_cache_stats_each(const kiln_cache_stats_t *s,
			   void (*fn)(const char *name, const char *doc,
				      uint64_t value, void *arg),
			   void *arg)
{
#define KILN__STAT_EACH(name, doc) fn(#name, doc, s->name, arg);
	KILN_CACHE_STATS(KILN__STAT_EACH)
#undef KILN__STAT_EACH
}

int kiln_cache_verify(kiln_cache_t *c, kiln_cache_verify_result_t *out,
		      char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	int rc = 0;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, errlen);
	if (k == NULL)
		return rc;
	sqlite3_stmt *st;
	rc = sqlite3_prepare_v2(k->db,
				"SELECT id, hash, size, refs, crc FROM blobs "
				"WHERE id > ?1 ORDER BY id LIMIT 256",
				-1, &st, NULL);
	if (rc != SQLITE_OK) {
		rc = kiln__sqlerr(k, rc, "verify", err, errlen);
		kiln__conn_put(c, k);
		return rc;
	}
	int64_t last = 0;
	typedef struct {
		uint8_t hash[32];
		uint64_t size;
		int64_t refs;
		bool has_crc;
		uint8_t crc[KILN__CRC_BYTES];
	} item_t;
	item_t page[256];
	for (;;) {
		/* One short read transaction per page, so that a long
		 * verify never holds back checkpoints. */
		int n = 0;
		sqlite3_bind_int64(st, 1, last);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			last = sqlite3_column_int64(st, 0);
			col32(st, 1, page[n].hash);
			page[n].size = (uint64_t)sqlite3_column_int64(st, 2);
			page[n].refs = sqlite3_column_int64(st, 3);
			page[n].has_crc = col_crc(st, 4, page[n].crc);
			n++;
		}
		sqlite3_reset(st);
		if (rc != SQLITE_DONE) {
			rc = kiln__sqlerr(k, rc, "verify", err, errlen);
			break;
		}
		rc = 0;
		if (n == 0)
			break;
		for (int i = 0; i < n; i++) {
			if (!pin_read(c, page[i].hash))
				continue; /* being evicted */
			/* The SHA-256 decides; the row's checksum is
			 * filled in (schema 1) or set right (a rotted
			 * row) from the same read. */
			uint8_t sum[KILN__CRC_BYTES];
			int v = kiln__blob_check(c, page[i].hash, page[i].size,
						 NULL, sum);
			if (v == KILN__BLOB_OK && !page[i].has_crc) {
				record_crc(c, NULL, page[i].hash, sum);
			} else if (v == KILN__BLOB_OK &&
				   memcmp(sum, page[i].crc, KILN__CRC_BYTES) &&
				   record_crc(c, NULL, page[i].hash, sum) ==
				       0) {
				kiln__memo_forget_all(c);
				KILN__COUNT(c, checksums_repaired, 1);
				out->checksums_repaired++;
			}
			out->blobs_checked++;
			out->bytes_checked += page[i].size;
			int d = v == KILN__BLOB_BAD
				    ? drop_bad(c, page[i].hash, NULL)
				    : -1;
			if (d >= 0) { /* still bad under the write lock */
				out->blobs_bad++;
				out->entries_dropped += (uint64_t)d;
			}
			unpin(c, page[i].hash);
		}
	}
	sqlite3_finalize(st);
	kiln__conn_put(c, k);
	return rc;
}
