/*
 * internal.h — the store's private structure and the functions its files
 * share. Not installed; nothing outside cache/ includes it.
 *
 * Locks, in the order they may nest (never the other way round):
 *   write_mu  serialises index writes (put, evict, gc, touch flush, drop)
 *             and the in-memory gauges they change; journal appends too.
 *   pool_mu   the free list of connections.
 *   pin_mu    the pin table (blobs being read or put; blobs being evicted).
 *   touch_mu  the buffer of pending hits.
 *   builds_mu the (target, fingerprint) table cache.
 *   memo_mu   the hot-row memo's stripes (memo.c).
 * pool_mu, pin_mu, touch_mu, builds_mu and memo_mu are leaves: nothing
 * else is taken while one is held.
 */
#ifndef KILN_CACHE_INTERNAL_H
#define KILN_CACHE_INTERNAL_H

#include "cache/cache.h"
#include "cache/checksum.h"
#include "protocol/protocol.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>

#define KILN__CACHE_SCHEMA 2
#define KILN__HASH_HEX	   65

/* Prepared statements every connection keeps (name, SQL). */
/* clang-format off */
#define KILN__CACHE_STMTS(X)                                                    \
	X(BEGIN, "BEGIN IMMEDIATE")                                             \
	X(COMMIT, "COMMIT")                                                     \
	X(ROLLBACK, "ROLLBACK")                                                 \
	X(GET, "SELECT b.hash, b.size, e.build, e.created, e.last_used, "      \
	       "e.hits, e.compile_ms, e.source, b.crc FROM entries e "          \
	       "JOIN blobs b ON b.id = e.blob WHERE e.key = ?1")                \
	X(EXISTS, "SELECT 1 FROM entries WHERE key = ?1")                       \
	X(ENTRY_BLOB, "SELECT blob FROM entries WHERE key = ?1")                \
	X(ENTRY_PUT, "INSERT OR REPLACE INTO entries(key, blob, size, build, " \
		     "created, last_used, hits, compile_ms, source) "           \
		     "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")              \
	X(ENTRY_DEL, "DELETE FROM entries WHERE key = ?1")                      \
	X(ENTRY_DEL_BLOB, "DELETE FROM entries WHERE blob = ?1")                \
	X(HITS, "UPDATE entries SET hits = hits + ?2 WHERE key = ?1")          \
	X(TOUCH, "UPDATE entries SET last_used = max(last_used, ?2), "          \
		 "hits = hits + ?3 WHERE key = ?1")                             \
	X(BLOB_FIND, "SELECT id, size, refs, crc FROM blobs WHERE hash = ?1")   \
	X(BLOB_BY_ID, "SELECT hash, size, refs FROM blobs WHERE id = ?1")       \
	X(BLOB_INS, "INSERT INTO blobs(hash, size, refs, crc) "                 \
		    "VALUES(?1, ?2, ?3, ?4)")                                   \
	X(BLOB_CRC, "UPDATE blobs SET crc = ?2 WHERE hash = ?1")                \
	X(BLOB_REFS, "UPDATE blobs SET refs = refs + ?2 WHERE id = ?1")         \
	X(BLOB_DEL, "DELETE FROM blobs WHERE id = ?1")                          \
	X(LRU, "SELECT e.key, e.blob, b.hash, b.size, b.refs FROM entries e "   \
	       "JOIN blobs b ON b.id = e.blob "                                 \
	       "ORDER BY e.last_used, e.created, e.key LIMIT ?1")               \
	X(BUILD_INS, "INSERT OR IGNORE INTO builds(target, fingerprint) "       \
		     "VALUES(?1, ?2)")                                          \
	X(BUILD_FIND, "SELECT id FROM builds WHERE target = ?1 "                \
		      "AND fingerprint = ?2")                                   \
	X(META_SET, "INSERT OR REPLACE INTO meta(k, v) VALUES(?1, ?2)")         \
	X(META_GET, "SELECT v FROM meta WHERE k = ?1")
/* clang-format on */

enum {
#define KILN__STMT_ENUM(name, sql) KILN__ST_##name,
	KILN__CACHE_STMTS(KILN__STMT_ENUM)
#undef KILN__STMT_ENUM
	    KILN__ST_COUNT
};

/* One SQLite connection and its statements; used by one thread at a time
 * (borrowed from the pool for the length of one call). */
typedef struct kiln__conn {
	sqlite3 *db;
	const char *path;		  /* the index file, for messages */
	sqlite3_stmt *st[KILN__ST_COUNT]; /* prepared on first use */
	struct kiln__conn *next;
} kiln__conn_t;

/* A blob that some thread is reading or putting (count > 0), or that gc is
 * removing (dying). */
typedef struct kiln__pin {
	uint8_t hash[32];
	uint32_t count;
	bool dying;
	bool unlink_on_release; /* evicted while pinned: unlink when free */
} kiln__pin_t;

typedef struct kiln__touch {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	int64_t when;
	uint32_t hits; /* merged per key at flush */
	bool refresh;  /* last_used is stale: rewrite it (and the LRU index) */
} kiln__touch_t;

/* A hit whose entry was used less than this long ago only adds to `hits`:
 * last_used (and its index) is rewritten at most once a minute per entry,
 * which is all an LRU measured in seconds needs. */
#define KILN__LRU_GRANULARITY_S 60

/* What a get needs of an entry's row (memo.c). */
typedef struct kiln__memo_row {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	uint8_t blob[32];
	uint8_t crc[KILN__CRC_BYTES];
	bool has_crc; /* false: a row from before schema 2, not yet read */
	bool valid;
	uint8_t source;
	uint32_t compile_ms;
	uint64_t size, hits;
	int64_t build, created, last_used;
} kiln__memo_row_t;

#define KILN__MEMO_SLOTS   8192 /* ~1 MB */
#define KILN__MEMO_STRIPES 64

typedef struct kiln__build {
	int64_t id;
	char target[KILN_CACHE_TARGET_MAX];
	char fingerprint[KILN_CACHE_FINGERPRINT_MAX];
} kiln__build_t;

struct kiln_cache {
	char *dir;
	char *index_path;
	char *journal_path;
	char *objects_path;
	kiln_cache_options_t opts; /* resolved: no zero "defaults" left */
	/* The limits in effect (kiln_cache_set_limits may change them while
	 * other threads read them). */
	_Atomic uint64_t max_bytes, min_free_bytes;
	uint64_t fs_bytes; /* filesystem size at open */
	int lock_fd;
	int journal_fd;	  /* O_APPEND; -1 when it could not be opened */
	bool journal_bad; /* under write_mu: appends stopped */
	/* Set when this session may have left a file without a row (an
	 * error path could not clean up): close then leaves the store
	 * marked unclean, so the next open scans. */
	atomic_bool dirty;
	uint64_t puts_since_journal_check; /* under write_mu */
	EVP_MD *sha256;

	pthread_mutex_t write_mu;
	pthread_mutex_t pool_mu;
	kiln__conn_t *pool;

	pthread_mutex_t pin_mu;
	pthread_cond_t pin_cv;
	kiln__pin_t *pins;
	size_t npins, cap_pins;

	pthread_mutex_t touch_mu;
	kiln__touch_t *touches;
	size_t ntouches;
	int64_t touch_oldest_ms;

	pthread_mutex_t builds_mu;
	kiln__build_t *builds;
	size_t nbuilds, cap_builds;

	kiln__memo_row_t *memo; /* KILN__MEMO_SLOTS */
	pthread_mutex_t memo_mu[KILN__MEMO_STRIPES];
	uint64_t memo_gen[KILN__MEMO_STRIPES]; /* under memo_mu */

	/* Gauges, changed under write_mu, read anywhere. */
	_Atomic uint64_t entries, blobs, bytes;
	_Atomic uint64_t tmp_seq;
	/* Counters. */
#define KILN__CACHE_ATOMIC(name, doc) _Atomic uint64_t n_##name;
	KILN_CACHE_STATS(KILN__CACHE_ATOMIC)
#undef KILN__CACHE_ATOMIC
};

#define KILN__COUNT(c, name, v)                                                \
	atomic_fetch_add_explicit(&(c)->n_##name, (uint64_t)(v),               \
				  memory_order_relaxed)

/* ---- store.c: connections, schema, builds ------------------------------ */

/* Borrows a connection (opening one when the pool is empty). NULL with err
 * filled on failure; *rc gets the code. */
kiln__conn_t *kiln__conn_get(kiln_cache_t *c, int *rc, char *err,
			     size_t errlen);
void kiln__conn_put(kiln_cache_t *c, kiln__conn_t *k);
/* The statement, prepared on first use and reset+cleared for reuse. */
sqlite3_stmt *kiln__stmt(kiln__conn_t *k, int which);
/* A KILN_E or -errno code for an SQLite result code, detail into err. */
int kiln__sqlerr(kiln__conn_t *k, int rc, const char *what, char *err,
		 size_t errlen);
/* Runs a statement that returns no rows; 0 or an error. */
int kiln__exec_stmt(kiln__conn_t *k, sqlite3_stmt *st, const char *what,
		    char *err, size_t errlen);
/* The id of (target, fingerprint), inserting it (call under write_mu and
 * inside a write transaction). */
int kiln__build_id(kiln_cache_t *c, kiln__conn_t *k, const char *target,
		   const char *fp, int64_t *id, char *err, size_t errlen);
/* Copies the strings of build id into e (empty when unknown). */
void kiln__build_lookup(kiln_cache_t *c, int64_t id, kiln_cache_entry_t *e);
int64_t kiln__cache_now(void);
int64_t kiln__cache_now_ms(void);

/* ---- blob.c: files ----------------------------------------------------- */

void kiln__hex(const uint8_t *b, size_t n, char *out);
int kiln__unhex(const char *s, size_t n, uint8_t *out);
/* <objects>/ab/<62 hex> into out (PATH_MAX). */
void kiln__blob_path(const kiln_cache_t *c, const uint8_t hash[32], char *out,
		     size_t outlen);
void kiln__sha256(const kiln_cache_t *c, const void *p, size_t n,
		  uint8_t out[32]);
/* Writes the blob durably (temp, fsync, rename, fsync dir). 0 or -errno,
 * with the path in err; no temp file survives a failure. *named is true
 * once the rename happened: on a failure after it (the directory fsync)
 * the caller decides, under write_mu, whether the name goes again. */
int kiln__blob_write(kiln_cache_t *c, const uint8_t hash[32], const void *bytes,
		     size_t n, bool *named, char *err, size_t errlen);

enum { KILN__BLOB_OK = 0, KILN__BLOB_BAD = 1, KILN__BLOB_IOERR = 2 };
/* Reads and verifies a blob of the given size into a malloc'd buffer:
 * against crc (the row's CRC-64) when it is not NULL, else against the
 * SHA-256 of its name, then also writing its CRC-64 to crc_out (when not
 * NULL). KILN__BLOB_OK (*out set), KILN__BLOB_BAD (missing, wrong size,
 * hash mismatch), KILN__BLOB_IOERR (EIO and the like: not the blob's
 * fault), or -ENOMEM. */
int kiln__blob_read(kiln_cache_t *c, const uint8_t hash[32], uint64_t size,
		    const uint8_t *crc, uint8_t *crc_out, uint8_t **out,
		    char *err, size_t errlen);
/* Checks a blob file without keeping its bytes (same arguments and
 * results). */
int kiln__blob_check(kiln_cache_t *c, const uint8_t hash[32], uint64_t size,
		     const uint8_t *crc, uint8_t *crc_out);
/* Unlinks the blob file (ENOENT is fine). */
void kiln__blob_unlink(kiln_cache_t *c, const uint8_t hash[32]);

/* Walks objects/: fn(hash, path, size, arg) for each blob-named file;
 * temp files are removed (and counted); other names are left alone. */
int kiln__objects_walk(kiln_cache_t *c,
		       int (*fn)(const uint8_t hash[32], const char *path,
				 uint64_t size, void *arg),
		       void *arg);

/* ---- memo.c: the hot-row memo ---------------------------------------- */

int kiln__memo_init(kiln_cache_t *c);
void kiln__memo_free(kiln_cache_t *c);
/* The key's stripe generation: read before a lookup, passed to fill. */
uint64_t kiln__memo_gen(kiln_cache_t *c, const uint8_t key[32]);
/* Copies key's row into out; false when the memo does not hold it. */
bool kiln__memo_get(kiln_cache_t *c, const uint8_t key[32],
		    kiln__memo_row_t *out);
/* Keeps row unless a forget hit its stripe since gen was read. */
void kiln__memo_fill(kiln_cache_t *c, const kiln__memo_row_t *row,
		     uint64_t gen);
/* After a commit that changed or removed key's row. */
void kiln__memo_forget(kiln_cache_t *c, const uint8_t key[32]);
/* After a commit that changed rows of keys not known (a blob's). */
void kiln__memo_forget_all(kiln_cache_t *c);
/* A queued hit: hits added, last_used raised to when (INT64_MIN: not). */
void kiln__memo_hit(kiln_cache_t *c, const uint8_t key[32], int64_t when,
		    uint32_t hits);
/* The blob's checksum, recorded after its first read under schema 2 (kept
 * only while key's memo row still names that blob). */
void kiln__memo_set_crc(kiln_cache_t *c, const uint8_t key[32],
			const uint8_t hash[32],
			const uint8_t crc[KILN__CRC_BYTES]);

/* ---- journal.c --------------------------------------------------------- */

typedef struct kiln__jrec {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	uint8_t hash[32];
	uint64_t size;
	int64_t created;
	uint32_t compile_ms;
	uint8_t source;
	char target[KILN_CACHE_TARGET_MAX];
	char fingerprint[KILN_CACHE_FINGERPRINT_MAX];
	/* Not in the journal: the CRC-64 of the bytes when known (a put, a
	 * rebuild that read the blob), for the blob's row. */
	bool has_crc;
	uint8_t crc[KILN__CRC_BYTES];
} kiln__jrec_t;

/* Appends one record (call under write_mu). A short write is cut back so
 * the journal never holds a torn record followed by good ones. */
int kiln__journal_append(kiln_cache_t *c, const kiln__jrec_t *r, char *err,
			 size_t errlen);
/* Calls fn for each valid record in order, stopping at the first torn or
 * invalid one. */
int kiln__journal_replay(kiln_cache_t *c,
			 int (*fn)(const kiln__jrec_t *r, void *arg),
			 void *arg);
/* The journal size above which it is rewritten. */
uint64_t kiln__journal_limit(const kiln_cache_t *c);
/* Rewrites the journal from the index (temp, fsync, rename). */
int kiln__journal_compact(kiln_cache_t *c, kiln__conn_t *k, char *err,
			  size_t errlen);

/* ---- cache.c ----------------------------------------------------------- */

/* What recording a put changed, for the gauges and the blob files. */
typedef struct kiln__put_effect {
	bool new_blob;	  /* a blobs row was inserted */
	bool had_old;	  /* the key had an entry before */
	bool old_freed;	  /* ... whose blob lost its last reference */
	bool crc_changed; /* the blob's checksum was recorded anew */
	uint8_t old_hash[32];
	uint64_t old_size;
} kiln__put_effect_t;

/* Records a put's rows (build, blob refs, entry) inside the caller's write
 * transaction; used by put and by rebuild. */
int kiln__index_put(kiln_cache_t *c, kiln__conn_t *k, const kiln__jrec_t *r,
		    int64_t last_used, uint64_t hits, kiln__put_effect_t *fx,
		    char *err, size_t errlen);
/* Reloads the build cache from the index. */
int kiln__builds_load(kiln_cache_t *c, kiln__conn_t *k, char *err,
		      size_t errlen);

#endif /* KILN_CACHE_INTERNAL_H */
