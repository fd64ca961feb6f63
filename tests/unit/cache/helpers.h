/*
 * helpers.h — shared helpers for the cache/ unit tests: temporary
 * directories (mkdtemp under /tmp) and their recursive removal,
 * deterministic content (bytes from a seed), keys from integers, the path of
 * the blob that holds some bytes (SHA-256 via OpenSSL EVP), file damage
 * (byte flips, truncation), a census of objects/, direct access to index.db
 * with SQLite while the store is closed, and asserting wrappers around the
 * store's calls.
 *
 * Keys: key_of(n) holds n big-endian in its first 8 bytes, so keys compare
 * (memcmp, as SQLite compares BLOBs) like their numbers; the remaining
 * bytes are derived from n.
 *
 * The cr_assert wrappers may only be used on the test's main thread and
 * never in a forked child (children report through their exit status).
 * Every function is static and used by some test files only.
 */
#ifndef KILN_TEST_CACHE_HELPERS_H
#define KILN_TEST_CACHE_HELPERS_H

#include "cache/cache.h"
#include "protocol/protocol.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HELPER __attribute__((unused)) static

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* ---- paths and directories ----------------------------------------------- */

/* snprintf into a PATH_MAX buffer; asserts it fits. */
__attribute__((format(printf, 2, 3))) HELPER void path_fmt(char *out,
							   const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(out, PATH_MAX, fmt, ap);
	va_end(ap);
	cr_assert(n > 0 && n < PATH_MAX, "path too long");
}

/* A new empty directory under /tmp (malloc'd path; free() it). */
HELPER char *tmpdir_new(void)
{
	char tmpl[] = "/tmp/kiln-cache-test-XXXXXX";
	char *d = mkdtemp(tmpl);
	cr_assert_not_null(d, "mkdtemp: %s", strerror(errno));
	char *p = strdup(d);
	cr_assert_not_null(p);
	return p;
}

HELPER int rm_rf_one(const char *path, const struct stat *st, int flag,
		     struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Removes path and everything below it (NULL: nothing). */
HELPER void rm_rf(const char *path)
{
	if (path != NULL)
		nftw(path, rm_rf_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- deterministic content ----------------------------------------------- */

HELPER uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Fills buf with n bytes that depend only on seed (a shorter run is a prefix
 * of a longer one). */
HELPER void fill_bytes(uint64_t seed, uint8_t *buf, size_t n)
{
	uint64_t s = seed ^ 0x6a09e667f3bcc908ULL;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = splitmix64(&s);
		memcpy(buf + i, &v, 8);
	}
	if (i < n) {
		uint64_t v = splitmix64(&s);
		memcpy(buf + i, &v, n - i);
	}
}

/* n bytes from seed, malloc'd (never NULL, even for n == 0; free()). */
HELPER uint8_t *gen_bytes(uint64_t seed, size_t n)
{
	uint8_t *p = malloc(n > 0 ? n : 1);
	cr_assert_not_null(p);
	fill_bytes(seed, p, n);
	return p;
}

/* Key number n (see the file comment). */
HELPER void key_of(uint64_t n, uint8_t key[KILN_CACHE_KEY_BYTES])
{
	for (int i = 0; i < 8; i++)
		key[i] = (uint8_t)(n >> (56 - 8 * i));
	uint64_t s = n;
	for (int i = 8; i < KILN_CACHE_KEY_BYTES; i += 8) {
		uint64_t v = splitmix64(&s);
		memcpy(key + i, &v, 8);
	}
}

/* The number key_of() made key from. */
HELPER uint64_t key_num(const uint8_t key[KILN_CACHE_KEY_BYTES])
{
	uint64_t n = 0;
	for (int i = 0; i < 8; i++)
		n = n << 8 | key[i];
	return n;
}

/* ---- hashes and blob paths ----------------------------------------------- */

HELPER void sha256(const void *p, size_t n, uint8_t out[32])
{
	static const uint8_t none[1];
	unsigned int len = 0;
	cr_assert_eq(
	    EVP_Digest(n > 0 ? p : none, n, out, &len, EVP_sha256(), NULL), 1);
	cr_assert_eq(len, 32);
}

/* Lowercase hex of n bytes into out (2n + 1 chars). */
HELPER void hex_of(const uint8_t *p, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * n] = '\0';
}

/* <dir>/objects/ab/<62 hex> for a blob hash. */
HELPER void blob_path_of_hash(const char *dir, const uint8_t hash[32],
			      char out[PATH_MAX])
{
	char h[65];
	hex_of(hash, 32, h);
	path_fmt(out, "%s/objects/%.2s/%s", dir, h, h + 2);
}

/* The path of the blob that holds bytes[0..n). */
HELPER void blob_path(const char *dir, const void *bytes, size_t n,
		      char out[PATH_MAX])
{
	uint8_t h[32];
	sha256(bytes, n, h);
	blob_path_of_hash(dir, h, out);
}

/* ---- files --------------------------------------------------------------- */

HELPER bool file_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

HELPER off_t file_size(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
	return st.st_size;
}

/* Inverts every bit of the byte at off. */
HELPER void file_flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	uint8_t b;
	cr_assert_eq(pread(fd, &b, 1, off), 1, "pread %s", path);
	b ^= 0xff;
	cr_assert_eq(pwrite(fd, &b, 1, off), 1, "pwrite %s", path);
	cr_assert_eq(close(fd), 0);
}

HELPER void file_truncate(const char *path, off_t len)
{
	cr_assert_eq(truncate(path, len), 0, "truncate %s: %s", path,
		     strerror(errno));
}

/* Creates or replaces path with bytes[0..n). */
HELPER void file_write(const char *path, const void *bytes, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	cr_assert_eq(write(fd, bytes, n), (ssize_t)n, "write %s", path);
	cr_assert_eq(close(fd), 0);
}

/* The bytes of a file (malloc'd, never NULL; free()). */
HELPER uint8_t *file_read(const char *path, size_t *n)
{
	int fd = open(path, O_RDONLY);
	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	size_t len = (size_t)st.st_size;
	uint8_t *p = malloc(len > 0 ? len : 1);
	cr_assert_not_null(p);
	size_t got = 0;
	while (got < len) {
		ssize_t r = read(fd, p + got, len - got);
		cr_assert(r > 0, "read %s", path);
		got += (size_t)r;
	}
	close(fd);
	*n = len;
	return p;
}

/* Creates <dir>/objects/<sub> when it does not exist. */
HELPER void objects_subdir(const char *dir, const char *sub)
{
	char p[PATH_MAX];
	path_fmt(p, "%s/objects", dir);
	cr_assert(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s", p);
	path_fmt(p, "%s/objects/%s", dir, sub);
	cr_assert(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s", p);
}

typedef struct objects_census {
	size_t blobs;	/* objects/xx/<62 hex> */
	size_t temps;	/* objects/xx/.tmp.* */
	size_t other;	/* anything else in objects/xx */
	uint64_t bytes; /* of the blobs */
} objects_census_t;

HELPER bool is_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') ||
		      (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return s[n] == '\0';
}

/* Counts what lies in <dir>/objects/xx/ (an absent objects/ is empty). */
HELPER objects_census_t objects_census(const char *dir)
{
	objects_census_t c = {0};
	char p[PATH_MAX];
	path_fmt(p, "%s/objects", dir);
	DIR *top = opendir(p);
	if (top == NULL)
		return c;
	struct dirent *d;
	while ((d = readdir(top)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		char sub[PATH_MAX];
		path_fmt(sub, "%s/%s", p, d->d_name);
		DIR *s = opendir(sub);
		if (s == NULL) {
			c.other++;
			continue;
		}
		struct dirent *e;
		while ((e = readdir(s)) != NULL) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			char f[PATH_MAX];
			path_fmt(f, "%s/%s", sub, e->d_name);
			if (!strncmp(e->d_name, ".tmp.", 5)) {
				c.temps++;
			} else if (strlen(d->d_name) == 2 &&
				   is_hex(d->d_name, 2) &&
				   is_hex(e->d_name, 62)) {
				c.blobs++;
				c.bytes += (uint64_t)file_size(f);
			} else {
				c.other++;
			}
		}
		closedir(s);
	}
	closedir(top);
	return c;
}

/* ---- the store ----------------------------------------------------------- */

/* Options for throwaway test stores: no fsync, watermark off. */
HELPER void opts_fast(kiln_cache_options_t *o)
{
	kiln_cache_options_init(o);
	o->no_fsync = 1;
	o->min_free_bytes = 1;
}

/* Opens dir (o NULL: opts_fast); asserts success. */
HELPER kiln_cache_t *store_open(const char *dir, const kiln_cache_options_t *o)
{
	kiln_cache_options_t def;
	if (o == NULL) {
		opts_fast(&def);
		o = &def;
	}
	kiln_cache_t *c = NULL;
	char err[512] = "";
	int rc = kiln_cache_open(dir, o, &c, err, sizeof(err));
	cr_assert_eq(rc, 0, "open %s: %d (%s): %s", dir, rc, kiln_strerror(rc),
		     err);
	cr_assert_not_null(c);
	return c;
}

HELPER void put_ok(kiln_cache_t *c, uint64_t n, const void *bytes, size_t size,
		   const kiln_cache_meta_t *m)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	char err[512] = "";
	int rc = kiln_cache_put(c, key, bytes, size, m, err, sizeof(err));
	cr_assert_eq(rc, 0, "put %llu (%zu bytes): %d (%s): %s",
		     (unsigned long long)n, size, rc, kiln_strerror(rc), err);
}

/* Puts gen_bytes(n, size) under key n. */
HELPER void put_gen(kiln_cache_t *c, uint64_t n, size_t size,
		    const kiln_cache_meta_t *m)
{
	uint8_t *b = gen_bytes(n, size);
	put_ok(c, n, b, size, m);
	free(b);
}

/* Gets key n; returns the kiln_cache_get code (0 fills out). */
HELPER int get_n(kiln_cache_t *c, uint64_t n, kiln_cache_blob_t *out)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	char err[512] = "";
	memset(out, 0, sizeof(*out));
	int rc = kiln_cache_get(c, key, out, err, sizeof(err));
	cr_assert(rc == 0 || rc == KILN_ENOTFOUND, "get %llu: %d (%s): %s",
		  (unsigned long long)n, rc, kiln_strerror(rc), err);
	return rc;
}

/* Asserts key n is a hit whose bytes are bytes[0..size); fills out when not
 * NULL (release it), else releases the hit. */
HELPER void expect_hit(kiln_cache_t *c, uint64_t n, const void *bytes,
		       size_t size, kiln_cache_blob_t *out)
{
	kiln_cache_blob_t b;
	int rc = get_n(c, n, &b);
	cr_assert_eq(rc, 0, "key %llu: expected a hit, got %s",
		     (unsigned long long)n, kiln_strerror(rc));
	cr_assert_eq(b.size, size, "key %llu: %zu bytes, expected %zu",
		     (unsigned long long)n, b.size, size);
	if (size > 0)
		cr_assert(memcmp(b.data, bytes, size) == 0,
			  "key %llu: wrong bytes", (unsigned long long)n);
	cr_assert_eq(b.entry.size, size);
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	cr_assert_arr_eq(b.entry.key, key, sizeof(key));
	uint8_t h[32];
	sha256(bytes, size, h);
	cr_assert_arr_eq(b.entry.blob, h, 32, "key %llu: wrong blob hash",
			 (unsigned long long)n);
	if (out != NULL)
		*out = b;
	else
		kiln_cache_blob_release(&b);
}

/* expect_hit() for the content put_gen(n, size) stored. */
HELPER void expect_gen(kiln_cache_t *c, uint64_t n, size_t size)
{
	uint8_t *b = gen_bytes(n, size);
	expect_hit(c, n, b, size, NULL);
	free(b);
}

HELPER void expect_miss(kiln_cache_t *c, uint64_t n)
{
	kiln_cache_blob_t b;
	int rc = get_n(c, n, &b);
	if (rc == 0)
		kiln_cache_blob_release(&b);
	cr_assert_eq(rc, KILN_ENOTFOUND, "key %llu: expected a miss",
		     (unsigned long long)n);
}

HELPER kiln_cache_stats_t stats_of(kiln_cache_t *c)
{
	kiln_cache_stats_t s;
	char err[512] = "";
	memset(&s, 0xa5, sizeof(s));
	int rc = kiln_cache_stats(c, &s, err, sizeof(err));
	cr_assert_eq(rc, 0, "stats: %s: %s", kiln_strerror(rc), err);
	return s;
}

/* ---- index.db, read and edited directly while the store is closed -------- */

HELPER sqlite3 *db_open(const char *dir)
{
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", dir);
	sqlite3 *db = NULL;
	int rc = sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE, NULL);
	cr_assert_eq(rc, SQLITE_OK, "sqlite3_open %s: %s", p,
		     db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
	sqlite3_busy_timeout(db, 5000);
	return db;
}

HELPER void db_close(sqlite3 *db)
{
	cr_assert_eq(sqlite3_close(db), SQLITE_OK);
}

HELPER void db_exec(const char *dir, const char *sql)
{
	sqlite3 *db = db_open(dir);
	char *msg = NULL;
	int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
	cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
	db_close(db);
}

/* The first column of the first row of sql (malloc'd; free()). */
HELPER char *db_text(const char *dir, const char *sql)
{
	sqlite3 *db = db_open(dir);
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	rc = sqlite3_step(st);
	cr_assert_eq(rc, SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
	const unsigned char *t = sqlite3_column_text(st, 0);
	char *r = strdup(t ? (const char *)t : "");
	cr_assert_not_null(r);
	sqlite3_finalize(st);
	db_close(db);
	return r;
}

/* Asserts PRAGMA quick_check on <dir>/index.db says "ok". */
HELPER void expect_quick_check(const char *dir)
{
	char *r = db_text(dir, "PRAGMA quick_check");
	cr_assert_str_eq(r, "ok", "quick_check of %s/index.db: %s", dir, r);
	free(r);
}

/* Sets created, last_used and hits of key n's row. */
HELPER void db_set_entry(const char *dir, uint64_t n, int64_t created,
			 int64_t last_used, int64_t hits)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	sqlite3 *db = db_open(dir);
	sqlite3_stmt *st = NULL;
	const char *sql = "UPDATE entries SET created = ?1, last_used = ?2, "
			  "hits = ?3 WHERE key = ?4";
	cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK,
		     "%s", sqlite3_errmsg(db));
	sqlite3_bind_int64(st, 1, created);
	sqlite3_bind_int64(st, 2, last_used);
	sqlite3_bind_int64(st, 3, hits);
	sqlite3_bind_blob(st, 4, key, sizeof(key), SQLITE_STATIC);
	cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s", sqlite3_errmsg(db));
	cr_assert_eq(sqlite3_changes(db), 1, "no row for key %llu",
		     (unsigned long long)n);
	sqlite3_finalize(st);
	db_close(db);
}

/* ---- processes ----------------------------------------------------------- */

/* Waits for pid; returns its exit status, or 128 + signal. */
HELPER int wait_child(pid_t pid)
{
	int st;
	pid_t r;
	do {
		r = waitpid(pid, &st, 0);
	} while (r < 0 && errno == EINTR);
	cr_assert_eq(r, pid, "waitpid: %s", strerror(errno));
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

/*
 * An unclean shutdown: a child opens dir, puts gen_bytes(n, size) under key
 * n and _exit()s without closing. Returns the (reaped) child's pid.
 */
HELPER pid_t unclean_session(const char *dir, uint64_t n, size_t size)
{
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		kiln_cache_options_t o;
		kiln_cache_options_init(&o);
		o.no_fsync = 1;
		o.min_free_bytes = 1;
		kiln_cache_t *c = NULL;
		if (kiln_cache_open(dir, &o, &c, NULL, 0) != 0)
			_exit(2);
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(n, key);
		uint8_t *b = malloc(size > 0 ? size : 1);
		if (b == NULL)
			_exit(3);
		fill_bytes(n, b, size);
		if (kiln_cache_put(c, key, b, size, NULL, NULL, 0) != 0)
			_exit(4);
		_exit(0);
	}
	int st = wait_child(pid);
	cr_assert_eq(st, 0, "unclean session child failed (%d)", st);
	return pid;
}

#endif /* KILN_TEST_CACHE_HELPERS_H */
