/*
 * journal.c — the append-only record of puts from which a lost index is
 * rebuilt.
 *
 * The index is derived data: the blobs say which bytes exist, and the
 * journal says which key each of them was stored under, with the metadata
 * of that put. A record is
 *
 *   u32 magic "KJR1" | u32 body length | body | 8 bytes: SHA-256(body)[0..8)
 *   body = key[32] hash[32] u64 size i64 created u32 compile_ms u8 source
 *          u8 target length | u16 fingerprint length | target | fingerprint
 *
 * little-endian. A record is written with one write(2) under write_mu and
 * before the index row is committed; a short write is cut back, so a torn
 * record can only be the last one (a crash in the middle of the write) and
 * replay stops there. The journal is not fsync'ed: after a power loss it may
 * miss the last puts, which only makes those keys misses if the index is
 * lost too. After an unclean shutdown or a rebuild the journal is rewritten
 * from the index (compaction), which also drops evicted and replaced keys.
 *
 * Threads: append under write_mu; replay and compaction at open only.
 */
#include "cache/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JMAGIC	0x31524a4bu /* "KJR1" little-endian */
#define JFIXED	(32 + 32 + 8 + 8 + 4 + 1 + 1 + 2)
#define JMAX	(JFIXED + KILN_CACHE_TARGET_MAX + KILN_CACHE_FINGERPRINT_MAX)
#define JRECMAX (8 + JMAX + 8)

static void put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Encodes r into out[JRECMAX]; returns the record's length. */
static size_t encode(const kiln_cache_t *c, const kiln__jrec_t *r, uint8_t *out)
{
	size_t tl = strlen(r->target), fl = strlen(r->fingerprint);
	uint8_t *b = out + 8;
	memcpy(b, r->key, 32);
	memcpy(b + 32, r->hash, 32);
	put_u64(b + 64, r->size);
	put_u64(b + 72, (uint64_t)r->created);
	put_u32(b + 80, r->compile_ms);
	b[84] = r->source;
	b[85] = (uint8_t)tl;
	put_u16(b + 86, (uint16_t)fl);
	memcpy(b + JFIXED, r->target, tl);
	memcpy(b + JFIXED + tl, r->fingerprint, fl);
	size_t body = JFIXED + tl + fl;
	put_u32(out, JMAGIC);
	put_u32(out + 4, (uint32_t)body);
	uint8_t d[32];
	kiln__sha256(c, b, body, d);
	memcpy(b + body, d, 8);
	return 8 + body + 8;
}

int kiln__journal_append(kiln_cache_t *c, const kiln__jrec_t *r, char *err,
			 size_t errlen)
{
	if (c->journal_fd < 0)
		return 0; /* journal_bad: rewritten at the next open */
	uint8_t rec[JRECMAX];
	size_t n = encode(c, r, rec);
	struct stat st;
	if (fstat(c->journal_fd, &st) < 0) {
		int rc = -errno;
		return kiln__errf(err, errlen, rc, "stat %s: %s",
				  c->journal_path, kiln_strerror(rc));
	}
	ssize_t w;
	do
		w = write(c->journal_fd, rec, n);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)n)
		return 0;
	int rc = w < 0 ? -errno : -ENOSPC;
	/* Cut a partial record back so later records stay reachable. */
	if (w > 0 && ftruncate(c->journal_fd, st.st_size) < 0) {
		/* Later records would sit behind a torn one that replay
		 * stops at: stop appending until the next open rewrites. */
		close(c->journal_fd);
		c->journal_fd = -1;
		c->journal_bad = true;
		KILN_LOG(KILN_LOG_WARN,
			 "msg=\"journal has a torn record; rewritten at next "
			 "open\" path=%s",
			 c->journal_path);
	}
	return kiln__errf(err, errlen, rc, "append %s: %s", c->journal_path,
			  kiln_strerror(rc));
}

int kiln__journal_replay(kiln_cache_t *c,
			 int (*fn)(const kiln__jrec_t *r, void *arg), void *arg)
{
	FILE *f = fopen(c->journal_path, "rbe");
	if (f == NULL)
		return errno == ENOENT ? 0 : -errno;
	uint8_t hdr[8], body[JMAX + 8];
	int rc = 0;
	uint64_t good = 0;
	while (fread(hdr, 1, 8, f) == 8) {
		uint32_t len = (uint32_t)get_le(hdr + 4, 4);
		if (get_le(hdr, 4) != JMAGIC || len < JFIXED || len > JMAX)
			break;
		if (fread(body, 1, len + 8, f) != len + 8)
			break;
		uint8_t d[32];
		kiln__sha256(c, body, len, d);
		if (memcmp(d, body + len, 8) != 0)
			break;
		size_t tl = body[85], fl = (size_t)get_le(body + 86, 2);
		if (JFIXED + tl + fl != len || tl >= KILN_CACHE_TARGET_MAX ||
		    fl >= KILN_CACHE_FINGERPRINT_MAX)
			break;
		kiln__jrec_t r;
		memcpy(r.key, body, 32);
		memcpy(r.hash, body + 32, 32);
		r.size = get_le(body + 64, 8);
		r.created = (int64_t)get_le(body + 72, 8);
		r.compile_ms = (uint32_t)get_le(body + 80, 4);
		r.source = body[84];
		r.has_crc = false;
		memcpy(r.target, body + JFIXED, tl);
		r.target[tl] = '\0';
		memcpy(r.fingerprint, body + JFIXED + tl, fl);
		r.fingerprint[fl] = '\0';
		good++;
		rc = fn(&r, arg);
		if (rc != 0)
			break;
	}
	fclose(f);
	KILN_LOG(KILN_LOG_DEBUG, "msg=\"journal replayed\" records=%llu",
		 (unsigned long long)good);
	return rc;
}

int kiln__journal_compact(kiln_cache_t *c, kiln__conn_t *k, char *err,
			  size_t errlen)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s.tmp", c->journal_path);
	FILE *f = fopen(tmp, "wbe");
	if (f == NULL) {
		int rc = -errno;
		return kiln__errf(err, errlen, rc, "create %s: %s", tmp,
				  kiln_strerror(rc));
	}
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(
	    k->db,
	    "SELECT e.key, b.hash, e.size, e.created, e.compile_ms, e.source, "
	    "e.build FROM entries e JOIN blobs b ON b.id = e.blob "
	    "ORDER BY e.created",
	    -1, &st, NULL);
	if (rc != SQLITE_OK) {
		fclose(f);
		unlink(tmp);
		return kiln__sqlerr(k, rc, "journal compaction", err, errlen);
	}
	int wrc = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		kiln__jrec_t r = {.has_crc = false};
		kiln_cache_entry_t e;
		memcpy(r.key, sqlite3_column_blob(st, 0), 32);
		memcpy(r.hash, sqlite3_column_blob(st, 1), 32);
		r.size = (uint64_t)sqlite3_column_int64(st, 2);
		r.created = sqlite3_column_int64(st, 3);
		r.compile_ms = (uint32_t)sqlite3_column_int64(st, 4);
		r.source = (uint8_t)sqlite3_column_int(st, 5);
		kiln__build_lookup(c, sqlite3_column_int64(st, 6), &e);
		memcpy(r.target, e.target, sizeof(r.target));
		memcpy(r.fingerprint, e.fingerprint, sizeof(r.fingerprint));
		uint8_t rec[JRECMAX];
		size_t n = encode(c, &r, rec);
		if (fwrite(rec, 1, n, f) != n) {
			wrc = errno ? -errno : -EIO;
			break;
		}
	}
	sqlite3_finalize(st);
	if (wrc == 0 && rc != SQLITE_DONE && rc != SQLITE_ROW)
		wrc = kiln__sqlerr(k, rc, "journal compaction", err, errlen);
	if (wrc == 0 && fflush(f) != 0)
		wrc = -errno;
	if (wrc == 0 && !c->opts.no_fsync && fsync(fileno(f)) < 0)
		wrc = -errno;
	if (fclose(f) != 0 && wrc == 0)
		wrc = -errno;
	if (wrc == 0 && rename(tmp, c->journal_path) < 0)
		wrc = -errno;
	if (wrc < 0) {
		unlink(tmp);
		return kiln__errf(err, errlen, wrc, "rewrite %s: %s",
				  c->journal_path, kiln_strerror(wrc));
	}
	/* Reopen the append descriptor on the new file. */
	if (c->journal_fd >= 0)
		close(c->journal_fd);
	c->journal_fd = open(c->journal_path,
			     O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (c->journal_fd < 0) {
		int rc = -errno;
		c->journal_bad = true;
		return kiln__errf(err, errlen, rc, "reopen %s: %s",
				  c->journal_path, kiln_strerror(rc));
	}
	c->journal_bad = false;
	return 0;
}
