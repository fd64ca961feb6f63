/*
 * cache.h — kiln's kernel store: bytes under 32-byte keys, kept in
 * content-addressed blob files and indexed by SQLite. It knows nothing of
 * graphs: a key is a signature computed elsewhere, a value is an artifact's
 * bytes plus a little metadata. Layout, crash-safety argument and recovery
 * rules: cache/README.md.
 *
 * Threads. kiln_cache_open() and kiln_cache_close() run on one thread while
 * no other call on the same store is in flight. Every other function may be
 * called from any number of threads at once: each call borrows its own SQLite
 * connection from the store's pool (one connection is never used by two
 * threads at a time), the counters are atomic, and the pin table that keeps
 * gc away from blobs being read is guarded by a mutex. Results handed out
 * (kiln_cache_blob_t, entry arrays) belong to the caller's thread.
 *
 * Processes. One process owns a store directory at a time: open() takes an
 * exclusive flock on <dir>/lock and a second opener gets -EBUSY with
 * "in use by pid N" in its error buffer.
 *
 * Errors. 0 or a negative code (KILN_E* from protocol/protocol.h, or -errno:
 * -ENOSPC, -EIO, -EROFS, ...); kiln_strerror() names them, and the caller's
 * err buffer (may be NULL) gets the detail. A miss is KILN_ENOTFOUND.
 */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CACHE_KEY_BYTES	   32  /* a signature (SHA-256) */
#define KILN_CACHE_TARGET_MAX	   64  /* incl. NUL */
#define KILN_CACHE_FINGERPRINT_MAX 256 /* incl. NUL */

typedef struct kiln_cache kiln_cache_t;

typedef enum {
	KILN_CACHE_SOURCE_COMPILED = 0, /* compiled by this node */
	KILN_CACHE_SOURCE_REMOTE = 1	/* fetched from the remote tier */
} kiln_cache_source_t;

typedef struct kiln_cache_options {
	/* Bytes of blobs to keep; 0 = 10% of the filesystem, capped at
	 * 20 GiB. When a put takes the store over it, the putting thread
	 * evicts least recently used entries down to 90% of it. */
	uint64_t max_bytes;
	/* Free space to leave on the filesystem; 0 = 2% of it, capped at
	 * 1 GiB. A put that leaves less runs gc until there is this much
	 * again (never evicting the entry just put). A put never evicts
	 * before it writes: on a full disk it fails with -ENOSPC and
	 * everything stored stays. */
	uint64_t min_free_bytes;
	/* SQLite busy_timeout for every connection; 0 = 5000 ms. */
	uint32_t busy_timeout_ms;
	/* Hits are recorded in memory and written in one transaction when
	 * this many are pending (0 = 256) or the oldest is older than
	 * touch_flush_ms (0 = 1000). */
	uint32_t touch_batch;
	uint32_t touch_flush_ms;
	/* Skip fsync of blobs and directories. For tests and benchmarks of
	 * throwaway stores only: a power loss may then lose or tear blobs
	 * (reads still verify, so a torn blob is a miss, never a wrong
	 * byte). */
	int no_fsync;
} kiln_cache_options_t;

/* The metadata of one entry. Strings are NUL-terminated. */
typedef struct kiln_cache_entry {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	uint8_t blob[32]; /* SHA-256 of the bytes: the blob's name */
	uint64_t size;	  /* bytes */
	char target[KILN_CACHE_TARGET_MAX];
	char fingerprint[KILN_CACHE_FINGERPRINT_MAX]; /* compiler fingerprint */
	int64_t created;			      /* Unix seconds */
	int64_t last_used;			      /* Unix seconds */
	uint64_t hits;
	uint32_t compile_ms;
	kiln_cache_source_t source;
} kiln_cache_entry_t;

/* What put() records besides the bytes. target and fingerprint must fit
 * their arrays above (else KILN_ETOOLARGE); NULL means "". */
typedef struct kiln_cache_meta {
	const char *target;
	const char *fingerprint;
	uint32_t compile_ms;
	kiln_cache_source_t source;
} kiln_cache_meta_t;

/* A hit: the verified bytes (malloc'd, owned by the caller) and the entry as
 * the index had it before this hit. Release with kiln_cache_blob_release. */
typedef struct kiln_cache_blob {
	uint8_t *data;
	size_t size;
	kiln_cache_entry_t entry;
} kiln_cache_blob_t;

/* Counters (all since open, except the gauges marked so). */
/* clang-format off */
#define KILN_CACHE_STATS(X)                                                     \
	X(entries,          "entries in the index (gauge)")                     \
	X(blobs,            "distinct blob files (gauge)")                      \
	X(bytes,            "bytes of blob files (gauge)")                      \
	X(max_bytes,        "size limit in effect (gauge)")                     \
	X(min_free_bytes,   "free-space watermark in effect (gauge)")           \
	X(fs_free_bytes,    "free bytes on the filesystem (gauge)")             \
	X(index_bytes,      "bytes of the SQLite index incl. WAL (gauge)")      \
	X(hits,             "gets that returned verified bytes")                \
	X(misses,           "gets that found no usable entry")                  \
	X(puts,             "puts that stored an entry")                        \
	X(put_errors,       "puts that failed")                                 \
	X(dedup_puts,       "puts whose bytes were already a blob")             \
	X(evictions,        "entries evicted (gc or evict)")                    \
	X(evicted_bytes,    "blob bytes removed by eviction")                   \
	X(gc_runs,          "gc passes")                                        \
	X(corrupt_dropped,  "entries dropped: blob missing or hash mismatch")   \
	X(checksums_repaired, "blob checksums in the index found wrong, rewritten") \
	X(touch_flushes,    "batched last_used writes")                         \
	X(touch_dropped,    "hits whose last_used write failed (disk full)")    \
	X(orphan_blobs,     "blob files without a row, removed at open")        \
	X(temp_removed,     "leftover temp files removed at open")              \
	X(rebuilds,         "index rebuilt from the blobs at open")
/* clang-format on */

typedef struct kiln_cache_stats {
#define KILN__CACHE_STAT_FIELD(name, doc) uint64_t name;
	KILN_CACHE_STATS(KILN__CACHE_STAT_FIELD)
#undef KILN__CACHE_STAT_FIELD
} kiln_cache_stats_t;

/* Fills o with the defaults (all zero: "use the default"). */
void kiln_cache_options_init(kiln_cache_options_t *o);

/*
 * Opens (creating if needed) the store in dir. On success *out is the store;
 * free it with kiln_cache_close. Opening:
 *   - takes <dir>/lock (-EBUSY "in use by pid N" when another process
 *     holds it);
 *   - runs PRAGMA quick_check; an index that is missing, corrupt or not a
 *     database is moved aside (index.db.bad-<time>) and rebuilt from the
 *     blobs and the journal;
 *   - migrates an older schema; an index written by a newer kiln is refused
 *     (KILN_EVERSION) and left as it is;
 *   - after an unclean shutdown, removes temp files and blobs without a row.
 * opts may be NULL (defaults).
 */
int kiln_cache_open(const char *dir, const kiln_cache_options_t *opts,
		    kiln_cache_t **out, char *err, size_t errlen);

/* Flushes pending hits, marks the shutdown clean, closes every connection
 * and releases the lock. NULL is a no-op. */
void kiln_cache_close(kiln_cache_t *c);

/*
 * Looks key up and reads its blob, verifying its CRC-64 against the
 * index row (the SHA-256 of its name for a row written before schema 2,
 * which then gets its checksum). 0 on a hit (out filled; release it),
 * KILN_ENOTFOUND on a miss. A blob that is missing, short or fails the
 * check is a miss: when its SHA-256 fails too, its rows are dropped and
 * counted in corrupt_dropped (when it holds, the row's checksum was wrong
 * and is rewritten: checksums_repaired). Other errors (-ENOMEM, -EIO from the
 * index) are returned as such. A blob being read is never evicted.
 */
int kiln_cache_get(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		   kiln_cache_blob_t *out, char *err, size_t errlen);

/* Frees the bytes of a hit; b itself is the caller's. NULL is a no-op. */
void kiln_cache_blob_release(kiln_cache_blob_t *b);

/*
 * Stores bytes under key (replacing an entry of the same key). The blob is
 * durable before the index row is committed; the same bytes stored under
 * two keys are one blob. On -ENOSPC, -EIO, -EROFS (or any failure) nothing
 * already stored is touched, no temp file is left behind, and the error
 * names the path. meta may be NULL.
 */
int kiln_cache_put(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		   const void *bytes, size_t size,
		   const kiln_cache_meta_t *meta, char *err, size_t errlen);

/* Marks key used now (as a hit does), without reading it. KILN_ENOTFOUND
 * when the key is not stored. */
int kiln_cache_touch(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		     char *err, size_t errlen);

/* As touch, counting `hits` uses (a caller that served key from its own
 * memory that many times since it last told the store). */
int kiln_cache_touch_n(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		       uint32_t hits, char *err, size_t errlen);

/* Removes key's entry (and its blob when no other key shares it; a blob
 * being read is unlinked only after that read). KILN_ENOTFOUND when absent.
 */
int kiln_cache_evict(kiln_cache_t *c, const uint8_t key[KILN_CACHE_KEY_BYTES],
		     char *err, size_t errlen);

/*
 * Evicts least recently used entries, in batches, until the blobs take at
 * most target_bytes and the filesystem has min_free_bytes free (or the
 * store is empty). target_bytes == UINT64_MAX means the configured
 * max_bytes. Entries being read are skipped. *evicted (may be NULL) gets
 * the number of entries removed.
 */
int kiln_cache_gc(kiln_cache_t *c, uint64_t target_bytes, uint64_t *evicted,
		  char *err, size_t errlen);

/* Changes max_bytes and min_free_bytes (0: the default, as at open); the
 * next put or gc applies them. */
void kiln_cache_set_limits(kiln_cache_t *c, uint64_t max_bytes,
			   uint64_t min_free_bytes);

/* Writes pending hits to the index now. */
int kiln_cache_flush(kiln_cache_t *c, char *err, size_t errlen);

typedef enum {
	KILN_CACHE_ORDER_LRU = 0,    /* least recently used first */
	KILN_CACHE_ORDER_MRU = 1,    /* most recently used first */
	KILN_CACHE_ORDER_SIZE = 2,   /* largest first */
	KILN_CACHE_ORDER_HITS = 3,   /* most hits first */
	KILN_CACHE_ORDER_CREATED = 4 /* newest first */
} kiln_cache_order_t;

/* Which entries list() returns; zero/NULL fields match everything. */
typedef struct kiln_cache_filter {
	const char *target;	 /* exact */
	const char *fingerprint; /* exact */
	int source;		 /* -1 = any, else a kiln_cache_source_t */
	int64_t unused_since;	 /* only entries with last_used < this */
	uint64_t min_size;	 /* only entries of at least this size */
} kiln_cache_filter_t;

/* Fills f to match everything. */
void kiln_cache_filter_init(kiln_cache_filter_t *f);

/*
 * The entries that match filter (NULL: all), in order, at most limit of
 * them (0: no limit). *out is a malloc'd array of *n entries (NULL when
 * none) that the caller frees with free().
 */
int kiln_cache_list(kiln_cache_t *c, const kiln_cache_filter_t *filter,
		    kiln_cache_order_t order, size_t limit,
		    kiln_cache_entry_t **out, size_t *n, char *err,
		    size_t errlen);

/* Reads every counter and gauge (pending hits are flushed first). */
int kiln_cache_stats(kiln_cache_t *c, kiln_cache_stats_t *out, char *err,
		     size_t errlen);

/* Calls fn(name, doc, value, arg) for each field of s, in X-macro order. */
void kiln_cache_stats_each(const kiln_cache_stats_t *s,
			   void (*fn)(const char *name, const char *doc,
				      uint64_t value, void *arg),
			   void *arg);

typedef struct kiln_cache_verify_result {
	uint64_t blobs_checked;
	uint64_t bytes_checked;
	uint64_t blobs_bad;	     /* missing, short or hash mismatch */
	uint64_t entries_dropped;    /* rows that pointed at a bad blob */
	uint64_t checksums_repaired; /* good blobs whose row checksum was
					wrong: rewritten */
} kiln_cache_verify_result_t;

/* Re-hashes every blob with SHA-256 (the name); drops the rows of those
 * that fail (counted in corrupt_dropped too), and records the CRC-64
 * that gets check wherever a row lacks it or has it wrong. Long: runs on the
 * caller's thread while gets and puts go on. */
int kiln_cache_verify(kiln_cache_t *c, kiln_cache_verify_result_t *out,
		      char *err, size_t errlen);

/* The directory the store was opened on (owned by c). */
const char *kiln_cache_dir(const kiln_cache_t *c);

#ifdef __cplusplus
}
#endif

#endif /* KILN_CACHE_H */
