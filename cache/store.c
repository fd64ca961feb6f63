/*
 * store.c — opening and closing a store: the lock, the SQLite connections
 * and their statements, the schema and its migrations, and the recovery
 * that runs at open (quick_check, rebuild from the blobs and the journal,
 * removal of temp files and orphan blobs after an unclean shutdown).
 *
 * Invariants after a successful open: the lock is held; the index passed
 * quick_check and is at schema KILN__CACHE_SCHEMA; every blob file has a
 * row when the last shutdown was clean or the scan ran; meta 'clean' is 0
 * until close sets it to 1.
 *
 * Threads: open and close on one thread with nothing else in flight;
 * kiln__conn_get/put and kiln__build_* from any thread.
 */
#include "cache/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define GIB (1024ull * 1024 * 1024)

/* Schema steps: migrations[v] takes an index from user_version v to v + 1.
 * A new version appends a step; old steps never change. */
static const char *const migrations[KILN__CACHE_SCHEMA] = {
    /* 0 -> 1: the first schema. */
    "CREATE TABLE blobs(id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE,"
    " size INTEGER NOT NULL, refs INTEGER NOT NULL);"
    "CREATE TABLE builds(id INTEGER PRIMARY KEY, target TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL, UNIQUE(target, fingerprint));"
    "CREATE TABLE entries(key BLOB PRIMARY KEY, blob INTEGER NOT NULL,"
    " size INTEGER NOT NULL, build INTEGER NOT NULL,"
    " created INTEGER NOT NULL, last_used INTEGER NOT NULL,"
    " hits INTEGER NOT NULL DEFAULT 0, compile_ms INTEGER NOT NULL DEFAULT 0,"
    " source INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
    "CREATE INDEX entries_lru ON entries(last_used, created);"
    "CREATE TABLE meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID;",
    /* 1 -> 2: the CRC-64 each read checks (NULL until the blob's first
     * read after the migration checks its SHA-256 and fills it in). */
    "ALTER TABLE blobs ADD COLUMN crc BLOB;",
};

int64_t kiln__cache_now(void)
{
	return (int64_t)time(NULL);
}

int64_t kiln__cache_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kiln_cache_options_init(kiln_cache_options_t *o)
{
	memset(o, 0, sizeof(*o));
}

const char *kiln_cache_dir(const kiln_cache_t *c)
{
	return c->dir;
}

/* ---- SQLite ------------------------------------------------------------ */

int kiln__sqlerr(kiln__conn_t *k, int rc, const char *what, char *err,
		 size_t errlen)
{
	int code;
	switch (rc & 0xff) {
	case SQLITE_FULL: code = -ENOSPC; break;
	case SQLITE_IOERR: code = -EIO; break;
	case SQLITE_READONLY: code = -EROFS; break;
	case SQLITE_NOMEM: code = -ENOMEM; break;
	case SQLITE_BUSY:
	case SQLITE_LOCKED: code = KILN_EBUSY; break;
	case SQLITE_CANTOPEN: code = -EACCES; break;
	default: code = KILN_EINTERNAL; break;
	}
	return kiln__errf(err, errlen, code, "index %s %s: %s (sqlite %d)",
			  k != NULL && k->path != NULL ? k->path : "", what,
			  k != NULL && k->db != NULL ? sqlite3_errmsg(k->db)
						     : sqlite3_errstr(rc),
			  rc);
}

sqlite3_stmt *kiln__stmt(kiln__conn_t *k, int which)
{
	static const char *const sql[KILN__ST_COUNT] = {
#define KILN__STMT_SQL(name, text) text,
	    KILN__CACHE_STMTS(KILN__STMT_SQL)
#undef KILN__STMT_SQL
	};
	sqlite3_stmt *st = k->st[which];
	if (st == NULL) {
		if (sqlite3_prepare_v3(k->db, sql[which], -1,
				       SQLITE_PREPARE_PERSISTENT, &st,
				       NULL) != SQLITE_OK)
			return NULL;
		k->st[which] = st;
	} else {
		sqlite3_reset(st);
		sqlite3_clear_bindings(st);
	}
	return st;
}

int kiln__exec_stmt(kiln__conn_t *k, sqlite3_stmt *st, const char *what,
		    char *err, size_t errlen)
{
	if (st == NULL)
		return kiln__sqlerr(k, sqlite3_errcode(k->db), what, err,
				    errlen);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc == SQLITE_DONE || rc == SQLITE_ROW)
		return 0;
	return kiln__sqlerr(k, rc, what, err, errlen);
}

static int exec_sql(kiln__conn_t *k, const char *sql, const char *what,
		    char *err, size_t errlen)
{
	int rc = sqlite3_exec(k->db, sql, NULL, NULL, NULL);
	return rc == SQLITE_OK ? 0 : kiln__sqlerr(k, rc, what, err, errlen);
}

static void conn_close(kiln__conn_t *k)
{
	if (k == NULL)
		return;
	for (int i = 0; i < KILN__ST_COUNT; i++)
		sqlite3_finalize(k->st[i]);
	sqlite3_close_v2(k->db);
	free(k);
}

/* A new connection. On failure *sqlrc (may be NULL) gets SQLite's code,
 * so that open can tell "not a database" from other trouble. */
static kiln__conn_t *conn_open(kiln_cache_t *c, int flags, int *rc, int *sqlrc,
			       char *err, size_t errlen)
{
	kiln__conn_t *k = calloc(1, sizeof(*k));
	if (k == NULL) {
		*rc = -ENOMEM;
		return NULL;
	}
	k->path = c->index_path;
	int s = sqlite3_open_v2(
	    c->index_path, &k->db,
	    flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, NULL);
	/* A 16 MiB page cache per connection, and reads through mmap (the
	 * OS page cache, shared by all connections): a million-entry index
	 * is ~200 MB, and hits touch random pages of it. */
	if (s == SQLITE_OK)
		s = sqlite3_exec(k->db,
				 "PRAGMA synchronous=NORMAL; "
				 "PRAGMA cache_size=-16384; "
				 "PRAGMA mmap_size=268435456",
				 NULL, NULL, NULL);
	if (s != SQLITE_OK) {
		if (sqlrc != NULL)
			*sqlrc = s;
		*rc = kiln__sqlerr(k, s, "open", err, errlen);
		conn_close(k);
		return NULL;
	}
	/* synchronous=NORMAL (above) is safe here: in WAL mode it never
	 * corrupts the database, and a commit lost to a power cut is only a
	 * row the blobs and journal can bring back (or a miss); blobs are
	 * fsync'ed before their row is written and verified on every read. */
	sqlite3_busy_timeout(k->db, (int)c->opts.busy_timeout_ms);
	*rc = 0;
	return k;
}

kiln__conn_t *kiln__conn_get(kiln_cache_t *c, int *rc, char *err, size_t errlen)
{
	*rc = 0;
	pthread_mutex_lock(&c->pool_mu);
	kiln__conn_t *k = c->pool;
	if (k != NULL)
		c->pool = k->next;
	pthread_mutex_unlock(&c->pool_mu);
	if (k != NULL)
		return k;
	return conn_open(c, SQLITE_OPEN_READWRITE, rc, NULL, err, errlen);
}

void kiln__conn_put(kiln_cache_t *c, kiln__conn_t *k)
{
	if (k == NULL)
		return;
	pthread_mutex_lock(&c->pool_mu);
	k->next = c->pool;
	c->pool = k;
	pthread_mutex_unlock(&c->pool_mu);
}

/* ---- builds: (target, fingerprint) -> id, cached ------------------------ */

static int builds_add(kiln_cache_t *c, int64_t id, const char *t, const char *f)
{
	if (c->nbuilds == c->cap_builds) {
		size_t cap = c->cap_builds ? 2 * c->cap_builds : 8;
		kiln__build_t *nb = realloc(c->builds, cap * sizeof(*nb));
		if (nb == NULL)
			return -ENOMEM;
		c->builds = nb;
		c->cap_builds = cap;
	}
	kiln__build_t *b = &c->builds[c->nbuilds++];
	b->id = id;
	snprintf(b->target, sizeof(b->target), "%s", t);
	snprintf(b->fingerprint, sizeof(b->fingerprint), "%s", f);
	return 0;
}

int kiln__build_id(kiln_cache_t *c, kiln__conn_t *k, const char *target,
		   const char *fp, int64_t *id, char *err, size_t errlen)
{
	pthread_mutex_lock(&c->builds_mu);
	for (size_t i = 0; i < c->nbuilds; i++) {
		if (strcmp(c->builds[i].target, target) == 0 &&
		    strcmp(c->builds[i].fingerprint, fp) == 0) {
			*id = c->builds[i].id;
			pthread_mutex_unlock(&c->builds_mu);
			return 0;
		}
	}
	pthread_mutex_unlock(&c->builds_mu);
	/* INSERT OR IGNORE + SELECT: correct whether or not the row (or a
	 * stale cache) already has it. */
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_BUILD_INS);
	if (st == NULL)
		return kiln__sqlerr(k, sqlite3_errcode(k->db), "insert build",
				    err, errlen);
	sqlite3_bind_text(st, 1, target, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, fp, -1, SQLITE_STATIC);
	int rc = kiln__exec_stmt(k, st, "insert build", err, errlen);
	if (rc < 0)
		return rc;
	st = kiln__stmt(k, KILN__ST_BUILD_FIND);
	if (st == NULL)
		return kiln__sqlerr(k, sqlite3_errcode(k->db), "find build",
				    err, errlen);
	sqlite3_bind_text(st, 1, target, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, fp, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*id = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	if (rc != SQLITE_ROW)
		return kiln__sqlerr(k, rc, "find build", err, errlen);
	/* The row is in the caller's transaction; should it roll back, the
	 * cached id names no row and the next put of this build would
	 * point at nothing. Drop the cache entry then (see put). */
	pthread_mutex_lock(&c->builds_mu);
	rc = builds_add(c, *id, target, fp);
	pthread_mutex_unlock(&c->builds_mu);
	return rc;
}

void kiln__build_lookup(kiln_cache_t *c, int64_t id, kiln_cache_entry_t *e)
{
	e->target[0] = e->fingerprint[0] = '\0';
	pthread_mutex_lock(&c->builds_mu);
	for (size_t i = 0; i < c->nbuilds; i++) {
		if (c->builds[i].id == id) {
			memcpy(e->target, c->builds[i].target,
			       sizeof(e->target));
			memcpy(e->fingerprint, c->builds[i].fingerprint,
			       sizeof(e->fingerprint));
			break;
		}
	}
	pthread_mutex_unlock(&c->builds_mu);
}

int kiln__builds_load(kiln_cache_t *c, kiln__conn_t *k, char *err,
		      size_t errlen)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(
	    k->db, "SELECT id, target, fingerprint FROM builds", -1, &st, NULL);
	if (rc != SQLITE_OK)
		return kiln__sqlerr(k, rc, "read builds", err, errlen);
	/* Load into a scratch store, swap in only when complete. */
	kiln_cache_t tmp;
	tmp.builds = NULL;
	tmp.nbuilds = tmp.cap_builds = 0;
	int out = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW && out == 0) {
		const char *t = (const char *)sqlite3_column_text(st, 1);
		const char *f = (const char *)sqlite3_column_text(st, 2);
		out = builds_add(&tmp, sqlite3_column_int64(st, 0), t ? t : "",
				 f ? f : "");
	}
	if (out == 0 && rc != SQLITE_DONE)
		out = kiln__sqlerr(k, rc, "read builds", err, errlen);
	sqlite3_finalize(st);
	if (out < 0) {
		free(tmp.builds);
		return out;
	}
	pthread_mutex_lock(&c->builds_mu);
	free(c->builds);
	c->builds = tmp.builds;
	c->nbuilds = tmp.nbuilds;
	c->cap_builds = tmp.cap_builds;
	pthread_mutex_unlock(&c->builds_mu);
	return 0;
}

/* ---- the lock ---------------------------------------------------------- */

static int take_lock(kiln_cache_t *c, char *err, size_t errlen)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/lock", c->dir);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		int rc = -errno;
		return kiln__errf(err, errlen, rc, "open %s: %s", path,
				  kiln_strerror(rc));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		char buf[32] = {0};
		ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
		close(fd);
		if (e == EWOULDBLOCK) {
			long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
			return kiln__errf(err, errlen, -EBUSY,
					  "store %s is in use by pid %ld "
					  "(lock %s)",
					  c->dir, pid, path);
		}
		return kiln__errf(err, errlen, -e, "flock %s: %s", path,
				  strerror(e));
	}
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
		int rc = -errno;
		close(fd);
		return kiln__errf(err, errlen, rc, "write %s: %s", path,
				  kiln_strerror(rc));
	}
	c->lock_fd = fd;
	return 0;
}

/* ---- schema, checks, recovery ------------------------------------------ */

static int pragma_int(kiln__conn_t *k, const char *sql, int64_t *out)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(k->db, sql, -1, &st, NULL);
	if (rc != SQLITE_OK)
		return rc;
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*out = sqlite3_column_int64(st, 0);
		rc = SQLITE_OK;
	}
	sqlite3_finalize(st);
	return rc;
}

/* 1 when quick_check says ok, 0 when it reports a problem or the file is
 * not a database, <0 on other errors (kept: an EIO is not a corrupt
 * index). */
static int quick_check(kiln__conn_t *k, char *what, size_t whatlen)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(k->db, "PRAGMA quick_check", -1, &st, NULL);
	if (rc == SQLITE_OK) {
		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			const char *r =
			    (const char *)sqlite3_column_text(st, 0);
			snprintf(what, whatlen, "%s", r ? r : "(null)");
			int ok = r != NULL && strcmp(r, "ok") == 0;
			sqlite3_finalize(st);
			return ok;
		}
		sqlite3_finalize(st);
	}
	snprintf(what, whatlen, "%s", sqlite3_errmsg(k->db));
	int prim = rc & 0xff;
	if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB)
		return 0;
	return kiln__sqlerr(k, rc, "quick_check", NULL, 0);
}

static int move_aside(kiln_cache_t *c, char *err, size_t errlen)
{
	char dst[PATH_MAX], src[PATH_MAX];
	long t = (long)kiln__cache_now();
	snprintf(dst, sizeof(dst), "%s.bad-%ld", c->index_path, t);
	for (int i = 1; access(dst, F_OK) == 0 && i < 1000; i++)
		snprintf(dst, sizeof(dst), "%s.bad-%ld.%d", c->index_path, t,
			 i);
	static const char *const sfx[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		char d[PATH_MAX + 8];
		snprintf(src, sizeof(src), "%s%s", c->index_path, sfx[i]);
		snprintf(d, sizeof(d), "%s%s", dst, sfx[i]);
		if (rename(src, d) < 0 && errno != ENOENT) {
			int rc = -errno;
			return kiln__errf(err, errlen, rc,
					  "move %s aside to %s: %s", src, d,
					  kiln_strerror(rc));
		}
	}
	KILN_LOG(KILN_LOG_WARN, "msg=\"index moved aside\" path=%s", dst);
	return 0;
}

/* Brings the index to KILN__CACHE_SCHEMA. When it starts from nothing
 * (version 0) and mark_rebuild, meta 'rebuild' = 1 commits together with
 * the schema, so that a crash before the rebuild's own commit leaves an
 * index that says "rebuild me", never an empty one that looks complete. */
static int migrate(kiln_cache_t *c, kiln__conn_t *k, bool mark_rebuild,
		   int64_t *from, char *err, size_t errlen)
{
	int64_t v = 0;
	int rc = pragma_int(k, "PRAGMA user_version", &v);
	if (rc != SQLITE_OK)
		return kiln__sqlerr(k, rc, "user_version", err, errlen);
	*from = v;
	if (v > KILN__CACHE_SCHEMA)
		return kiln__errf(err, errlen, KILN_EVERSION,
				  "index %s has schema %lld, newer than this "
				  "kiln's %d; left untouched",
				  c->index_path, (long long)v,
				  KILN__CACHE_SCHEMA);
	for (; v < KILN__CACHE_SCHEMA; v++) {
		char set[64];
		snprintf(set, sizeof(set), "PRAGMA user_version=%lld",
			 (long long)v + 1);
		if ((rc = exec_sql(k, "BEGIN IMMEDIATE", "migrate", err,
				   errlen)) < 0)
			return rc;
		const char *mark = v == 0 && mark_rebuild
				       ? "INSERT OR REPLACE INTO meta(k, v) "
					 "VALUES('rebuild', 1)"
				       : "SELECT 1";
		if ((rc = exec_sql(k, migrations[v], "migrate", err, errlen)) <
			0 ||
		    (rc = exec_sql(k, mark, "migrate", err, errlen)) < 0 ||
		    (rc = exec_sql(k, set, "migrate", err, errlen)) < 0 ||
		    (rc = exec_sql(k, "COMMIT", "migrate", err, errlen)) < 0) {
			sqlite3_exec(k->db, "ROLLBACK", NULL, NULL, NULL);
			return rc;
		}
		KILN_LOG(KILN_LOG_INFO,
			 "msg=\"index schema\" path=%s version=%lld",
			 c->index_path, (long long)v + 1);
	}
	return 0;
}

typedef struct found_blob {
	uint8_t hash[32];
	uint64_t size;
	bool used;
	uint8_t crc[KILN__CRC_BYTES];
} found_blob_t;

typedef struct rebuild {
	kiln_cache_t *c;
	kiln__conn_t *k;
	found_blob_t *v;
	size_t n, cap;
	uint64_t replayed;
	int rc;
	char *err;
	size_t errlen;
} rebuild_t;

static int cmp_found(const void *a, const void *b)
{
	return memcmp(((const found_blob_t *)a)->hash,
		      ((const found_blob_t *)b)->hash, 32);
}

static int rebuild_blob(const uint8_t hash[32], const char *path, uint64_t size,
			void *arg)
{
	rebuild_t *r = arg;
	uint8_t crc[KILN__CRC_BYTES];
	int v = kiln__blob_check(r->c, hash, size, NULL, crc);
	if (v == KILN__BLOB_BAD) {
		KILN_LOG(KILN_LOG_WARN, "msg=\"corrupt blob removed\" path=%s",
			 path);
		unlink(path);
		KILN__COUNT(r->c, corrupt_dropped, 1);
		return 0;
	}
	if (v != KILN__BLOB_OK)
		return v < 0 ? v : 0; /* EIO: leave the file, skip it */
	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 1024;
		found_blob_t *nv = realloc(r->v, cap * sizeof(*nv));
		if (nv == NULL)
			return -ENOMEM;
		r->v = nv;
		r->cap = cap;
	}
	memcpy(r->v[r->n].hash, hash, 32);
	r->v[r->n].size = size;
	r->v[r->n].used = false;
	memcpy(r->v[r->n].crc, crc, KILN__CRC_BYTES);
	r->n++;
	return 0;
}

static int rebuild_record(const kiln__jrec_t *rec, void *arg)
{
	rebuild_t *r = arg;
	found_blob_t key;
	memcpy(key.hash, rec->hash, 32);
	found_blob_t *f = bsearch(&key, r->v, r->n, sizeof(*r->v), cmp_found);
	if (f == NULL || f->size != rec->size)
		return 0;
	kiln__jrec_t full = *rec; /* with the checksum of the blob read */
	full.has_crc = true;
	memcpy(full.crc, f->crc, KILN__CRC_BYTES);
	kiln__put_effect_t fx;
	int rc = kiln__index_put(r->c, r->k, &full, rec->created, 0, &fx,
				 r->err, r->errlen);
	if (rc < 0)
		return rc;
	f->used = true;
	if (fx.old_freed) {
		found_blob_t ok;
		memcpy(ok.hash, fx.old_hash, 32);
		found_blob_t *o =
		    bsearch(&ok, r->v, r->n, sizeof(*r->v), cmp_found);
		if (o != NULL)
			o->used = false;
	}
	r->replayed++;
	return 0;
}

/* A fresh index from the blob files and the journal. */
static int rebuild(kiln_cache_t *c, kiln__conn_t *k, char *err, size_t errlen)
{
	rebuild_t r = {.c = c, .k = k, .err = err, .errlen = errlen};
	int rc = kiln__objects_walk(c, rebuild_blob, &r);
	if (rc < 0) {
		free(r.v);
		return kiln__errf(err, errlen, rc, "scan %s: %s",
				  c->objects_path, kiln_strerror(rc));
	}
	qsort(r.v, r.n, sizeof(*r.v), cmp_found);
	if ((rc = exec_sql(k, "BEGIN IMMEDIATE", "rebuild", err, errlen)) < 0) {
		free(r.v);
		return rc;
	}
	/* An interrupted earlier rebuild may have left rows: start over. The
	 * rebuild flag clears in the same transaction as the new rows. */
	rc =
	    exec_sql(k,
		     "DELETE FROM entries; DELETE FROM blobs; "
		     "DELETE FROM builds; DELETE FROM meta WHERE k = 'rebuild'",
		     "rebuild", err, errlen);
	if (rc == 0) {
		pthread_mutex_lock(&c->builds_mu);
		c->nbuilds = 0;
		pthread_mutex_unlock(&c->builds_mu);
		rc = kiln__journal_replay(c, rebuild_record, &r);
	}
	if (rc == 0)
		rc = exec_sql(k, "COMMIT", "rebuild", err, errlen);
	if (rc < 0) {
		sqlite3_exec(k->db, "ROLLBACK", NULL, NULL, NULL);
		free(r.v);
		return rc;
	}
	uint64_t orphans = 0;
	for (size_t i = 0; i < r.n; i++) {
		if (!r.v[i].used) {
			kiln__blob_unlink(c, r.v[i].hash);
			orphans++;
		}
	}
	KILN__COUNT(c, orphan_blobs, orphans);
	KILN__COUNT(c, rebuilds, 1);
	KILN_LOG(KILN_LOG_WARN,
		 "msg=\"index rebuilt\" path=%s blobs=%zu entries=%llu "
		 "orphans=%llu",
		 c->index_path, r.n, (unsigned long long)r.replayed,
		 (unsigned long long)orphans);
	free(r.v);
	return 0;
}

typedef struct orphan_scan {
	kiln_cache_t *c;
	kiln__conn_t *k;
} orphan_scan_t;

static int orphan_blob(const uint8_t hash[32], const char *path, uint64_t size,
		       void *arg)
{
	(void)size;
	orphan_scan_t *o = arg;
	sqlite3_stmt *st = kiln__stmt(o->k, KILN__ST_BLOB_FIND);
	if (st == NULL)
		return KILN_EINTERNAL;
	sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc == SQLITE_DONE) {
		if (unlink(path) == 0)
			KILN__COUNT(o->c, orphan_blobs, 1);
		return 0;
	}
	return rc == SQLITE_ROW ? 0 : kiln__sqlerr(o->k, rc, "scan", NULL, 0);
}

static int meta_get_int(kiln__conn_t *k, const char *key, int64_t *v)
{
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_META_GET);
	if (st == NULL)
		return -1;
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	int found = rc == SQLITE_ROW;
	if (found)
		*v = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	return found;
}

static int meta_set_int(kiln__conn_t *k, const char *key, int64_t v, char *err,
			size_t errlen)
{
	sqlite3_stmt *st = kiln__stmt(k, KILN__ST_META_SET);
	if (st == NULL)
		return kiln__sqlerr(k, sqlite3_errcode(k->db), "meta", err,
				    errlen);
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, v);
	return kiln__exec_stmt(k, st, "meta", err, errlen);
}

/* True when path is a file, or a directory with anything in it. */
static bool has_content(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return false;
	if (!S_ISDIR(st.st_mode))
		return st.st_size > 0;
	DIR *d = opendir(path);
	if (d == NULL)
		return true;
	struct dirent *e;
	bool any = false;
	while (!any && (e = readdir(d)) != NULL)
		any =
		    strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return any;
}

/* Rewrites the journal; a failure is not fatal (the old one still
 * replays) but leaves the store marked unclean so the next open tries
 * again. */
static void journal_rewrite(kiln_cache_t *c, kiln__conn_t *k)
{
	char err[256];
	if (kiln__journal_compact(c, k, err, sizeof(err)) < 0) {
		KILN_LOG(KILN_LOG_WARN,
			 "msg=\"journal not rewritten\" err=\"%s\"", err);
		atomic_store(&c->dirty, true);
	}
}

uint64_t kiln__journal_limit(const kiln_cache_t *c)
{
	return 2 * atomic_load(&c->entries) * 256 + (1u << 20);
}

/* Opens, checks, migrates or rebuilds the index; returns the first
 * connection. */
static int open_index(kiln_cache_t *c, kiln__conn_t **out, bool *scan,
		      char *err, size_t errlen)
{
	int rc;
	bool exists = access(c->index_path, F_OK) == 0;
	bool need_rebuild = false;
	kiln__conn_t *k = NULL;
	if (exists) {
		int sqlrc = SQLITE_OK;
		k = conn_open(c, SQLITE_OPEN_READWRITE, &rc, &sqlrc, err,
			      errlen);
		int prim = sqlrc & 0xff;
		if (k == NULL && prim != SQLITE_NOTADB &&
		    prim != SQLITE_CORRUPT)
			return rc;
		char what[256] = "";
		int q = 0;
		if (k != NULL)
			q = quick_check(k, what, sizeof(what));
		else
			snprintf(what, sizeof(what), "%s",
				 sqlite3_errstr(sqlrc));
		if (q < 0) {
			conn_close(k);
			return kiln__errf(err, errlen, q,
					  "index %s: quick_check: %s",
					  c->index_path, what);
		}
		if (q == 0) {
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"index failed quick_check\" path=%s "
				 "result=\"%s\"",
				 c->index_path, what);
			conn_close(k);
			k = NULL;
			if ((rc = move_aside(c, err, errlen)) < 0)
				return rc;
		}
	}
	if (k == NULL) {
		k = conn_open(c, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
			      &rc, NULL, err, errlen);
		if (k == NULL)
			return rc;
	}
	char mode[32] = "";
	sqlite3_stmt *st;
	if (sqlite3_prepare_v2(k->db, "PRAGMA journal_mode=WAL", -1, &st,
			       NULL) == SQLITE_OK) {
		if (sqlite3_step(st) == SQLITE_ROW)
			snprintf(mode, sizeof(mode), "%s",
				 (const char *)sqlite3_column_text(st, 0));
		sqlite3_finalize(st);
	}
	if (strcmp(mode, "wal") != 0) {
		rc = kiln__sqlerr(k, sqlite3_errcode(k->db), "journal_mode=WAL",
				  err, errlen);
		conn_close(k);
		return rc;
	}
	/* A new (missing, empty or moved-aside) index in a store that has
	 * blobs or a journal is rebuilt from them. */
	bool content =
	    has_content(c->journal_path) || has_content(c->objects_path);
	int64_t from = 0, flag = 0;
	if ((rc = migrate(c, k, content, &from, err, errlen)) < 0 ||
	    (rc = kiln__builds_load(c, k, err, errlen)) < 0) {
		conn_close(k);
		return rc;
	}
	need_rebuild = meta_get_int(k, "rebuild", &flag) == 1 && flag == 1;
	if (need_rebuild) {
		rc = rebuild(c, k, err, errlen);
		*scan = false;
		if (rc == 0)
			rc = kiln__builds_load(c, k, err, errlen);
		if (rc == 0)
			journal_rewrite(c, k);
	} else {
		int64_t clean = 0;
		int found = meta_get_int(k, "clean", &clean);
		*scan = exists && !(found == 1 && clean == 1);
		if (!exists)
			*scan = false;
	}
	if (rc < 0) {
		conn_close(k);
		return rc;
	}
	*out = k;
	return 0;
}

static int load_gauges(kiln_cache_t *c, kiln__conn_t *k, char *err,
		       size_t errlen)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(
	    k->db,
	    "SELECT (SELECT count(*) FROM entries), (SELECT count(*) FROM "
	    "blobs), (SELECT coalesce(sum(size), 0) FROM blobs)",
	    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return kiln__sqlerr(k, rc, "count", err, errlen);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		atomic_store(&c->entries,
			     (uint64_t)sqlite3_column_int64(st, 0));
		atomic_store(&c->blobs, (uint64_t)sqlite3_column_int64(st, 1));
		atomic_store(&c->bytes, (uint64_t)sqlite3_column_int64(st, 2));
		rc = 0;
	} else {
		rc = kiln__sqlerr(k, rc, "count", err, errlen);
	}
	sqlite3_finalize(st);
	return rc;
}

static int resolve_options(kiln_cache_t *c, const kiln_cache_options_t *o,
			   char *err, size_t errlen)
{
	if (o != NULL)
		c->opts = *o;
	struct statvfs vfs;
	if (statvfs(c->dir, &vfs) < 0) {
		int rc = -errno;
		return kiln__errf(err, errlen, rc, "statvfs %s: %s", c->dir,
				  kiln_strerror(rc));
	}
	c->fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	if (c->opts.max_bytes == 0) {
		c->opts.max_bytes = c->fs_bytes / 10;
		if (c->opts.max_bytes > 20 * GIB)
			c->opts.max_bytes = 20 * GIB;
	}
	if (c->opts.min_free_bytes == 0) {
		c->opts.min_free_bytes = c->fs_bytes / 50;
		if (c->opts.min_free_bytes > GIB)
			c->opts.min_free_bytes = GIB;
	}
	atomic_store(&c->max_bytes, c->opts.max_bytes);
	atomic_store(&c->min_free_bytes, c->opts.min_free_bytes);
	if (c->opts.busy_timeout_ms == 0)
		c->opts.busy_timeout_ms = 5000;
	if (c->opts.touch_batch == 0)
		c->opts.touch_batch = 256;
	if (c->opts.touch_flush_ms == 0)
		c->opts.touch_flush_ms = 1000;
	return 0;
}

void kiln_cache_set_limits(kiln_cache_t *c, uint64_t max_bytes,
			   uint64_t min_free_bytes)
{
	pthread_mutex_lock(&c->write_mu);
	kiln_cache_options_t o = c->opts;
	o.max_bytes = max_bytes;
	o.min_free_bytes = min_free_bytes;
	resolve_options(c, &o, NULL, 0); /* stores the atomics */
	pthread_mutex_unlock(&c->write_mu);
}

static char *path_join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = malloc(n);
	if (p != NULL)
		snprintf(p, n, "%s/%s", a, b);
	return p;
}

static void cache_free(kiln_cache_t *c)
{
	while (c->pool != NULL) {
		kiln__conn_t *k = c->pool;
		c->pool = k->next;
		conn_close(k);
	}
	if (c->journal_fd >= 0)
		close(c->journal_fd);
	if (c->lock_fd >= 0)
		close(c->lock_fd); /* releases the flock */
	EVP_MD_free(c->sha256);
	kiln__memo_free(c);
	pthread_mutex_destroy(&c->write_mu);
	pthread_mutex_destroy(&c->pool_mu);
	pthread_mutex_destroy(&c->pin_mu);
	pthread_cond_destroy(&c->pin_cv);
	pthread_mutex_destroy(&c->touch_mu);
	pthread_mutex_destroy(&c->builds_mu);
	free(c->pins);
	free(c->touches);
	free(c->builds);
	free(c->dir);
	free(c->index_path);
	free(c->journal_path);
	free(c->objects_path);
	free(c);
}

int kiln_cache_open(const char *dir, const kiln_cache_options_t *opts,
		    kiln_cache_t **out, char *err, size_t errlen)
{
	*out = NULL;
	if (dir == NULL || dir[0] == '\0')
		return kiln__errf(err, errlen, -EINVAL, "no store directory");
	if (strlen(dir) > PATH_MAX - 128)
		return kiln__errf(err, errlen, -ENAMETOOLONG,
				  "store path is %zu bytes; at most %d",
				  strlen(dir), PATH_MAX - 128);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		int rc = -errno;
		return kiln__errf(err, errlen, rc, "mkdir %s: %s", dir,
				  kiln_strerror(rc));
	}
	struct stat st;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return kiln__errf(err, errlen, -ENOTDIR,
				  "store %s is not a directory", dir);
	kiln_cache_t *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	c->lock_fd = c->journal_fd = -1;
	pthread_mutex_init(&c->write_mu, NULL);
	pthread_mutex_init(&c->pool_mu, NULL);
	pthread_mutex_init(&c->pin_mu, NULL);
	pthread_cond_init(&c->pin_cv, NULL);
	pthread_mutex_init(&c->touch_mu, NULL);
	pthread_mutex_init(&c->builds_mu, NULL);
	c->dir = strdup(dir);
	c->index_path = path_join(dir, "index.db");
	c->journal_path = path_join(dir, "journal");
	c->objects_path = path_join(dir, "objects");
	c->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	int rc;
	if (c->dir == NULL || c->index_path == NULL ||
	    c->journal_path == NULL || c->objects_path == NULL ||
	    c->sha256 == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = resolve_options(c, opts, err, errlen)) < 0 ||
	    (rc = take_lock(c, err, errlen)) < 0)
		goto fail;
	c->touches =
	    calloc(4 * (size_t)c->opts.touch_batch, sizeof(*c->touches));
	if (c->touches == NULL || kiln__memo_init(c) < 0) {
		rc = -ENOMEM;
		goto fail;
	}
	if (mkdir(c->objects_path, 0755) < 0 && errno != EEXIST) {
		rc = -errno;
		kiln__errf(err, errlen, rc, "mkdir %s: %s", c->objects_path,
			   kiln_strerror(rc));
		goto fail;
	}
	kiln__conn_t *k = NULL;
	bool scan = false;
	if ((rc = open_index(c, &k, &scan, err, errlen)) < 0)
		goto fail;
	if (c->journal_fd < 0) /* a rebuild's rewrite opened it already */
		c->journal_fd =
		    open(c->journal_path,
			 O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (c->journal_fd < 0) {
		rc = -errno;
		kiln__errf(err, errlen, rc, "open %s: %s", c->journal_path,
			   kiln_strerror(rc));
		conn_close(k);
		goto fail;
	}
	if (scan) {
		/* Unclean shutdown: temp files and blobs whose row never
		 * committed; the journal may end in a torn record. */
		KILN_LOG(KILN_LOG_INFO,
			 "msg=\"unclean shutdown: scanning blobs\" dir=%s",
			 c->dir);
		orphan_scan_t o = {c, k};
		rc = kiln__objects_walk(c, orphan_blob, &o);
		if (rc < 0) {
			kiln__errf(err, errlen, rc, "recover %s: %s", c->dir,
				   kiln_strerror(rc));
			conn_close(k);
			goto fail;
		}
		journal_rewrite(c, k);
	}
	if ((rc = load_gauges(c, k, err, errlen)) < 0) {
		conn_close(k);
		goto fail;
	}
	struct stat js;
	if (!scan && fstat(c->journal_fd, &js) == 0 &&
	    (uint64_t)js.st_size > kiln__journal_limit(c))
		journal_rewrite(c, k);
	/* The unclean mark must be durable before any put can leave debris
	 * behind: this one commit syncs the WAL (synchronous=FULL). */
	rc = exec_sql(k, "PRAGMA synchronous=FULL", "pragma", err, errlen);
	if (rc == 0)
		rc = meta_set_int(k, "clean", 0, err, errlen);
	if (rc == 0)
		rc = exec_sql(k, "PRAGMA synchronous=NORMAL", "pragma", err,
			      errlen);
	if (rc < 0) {
		conn_close(k);
		goto fail;
	}
	kiln__conn_put(c, k);
	KILN_LOG(KILN_LOG_INFO,
		 "msg=\"store open\" dir=%s entries=%llu bytes=%llu "
		 "max_bytes=%llu min_free_bytes=%llu",
		 c->dir, (unsigned long long)atomic_load(&c->entries),
		 (unsigned long long)atomic_load(&c->bytes),
		 (unsigned long long)atomic_load(&c->max_bytes),
		 (unsigned long long)atomic_load(&c->min_free_bytes));
	*out = c;
	return 0;
fail:
	cache_free(c);
	return rc;
}

void kiln_cache_close(kiln_cache_t *c)
{
	if (c == NULL)
		return;
	char err[256];
	if (kiln_cache_flush(c, err, sizeof(err)) < 0)
		KILN_LOG(KILN_LOG_WARN, "msg=\"hits not written\" err=\"%s\"",
			 err);
	int rc;
	kiln__conn_t *k = kiln__conn_get(c, &rc, err, sizeof(err));
	if (k != NULL) {
		/* A journal with a torn record is rewritten at the next
		 * open, which an unclean mark triggers. */
		if (!c->journal_bad && !atomic_load(&c->dirty) &&
		    meta_set_int(k, "clean", 1, err, sizeof(err)) < 0)
			KILN_LOG(KILN_LOG_WARN,
				 "msg=\"clean shutdown not recorded\" "
				 "err=\"%s\"",
				 err);
		kiln__conn_put(c, k);
	}
	cache_free(c);
}
