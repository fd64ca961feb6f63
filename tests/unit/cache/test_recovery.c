/*
 * test_recovery.c — the kernel store's recovery rules (cache.h, open() and
 * get()): a blob with a flipped byte, truncated or deleted is a miss whose
 * row is dropped (corrupt_dropped); a deleted index or one overwritten with
 * garbage (moved aside as index.db.bad-<time>) or with damaged pages is
 * rebuilt from the journal and the blobs (rebuilds), also when the
 * journal's last record is torn; a replaced key keeps its latest bytes
 * through a rebuild; after an unclean shutdown (a forked child that
 * _exit()s without close) leftover temp files and blobs without a row are
 * removed (temp_removed, orphan_blobs); an index from a newer kiln
 * (user_version 99) is refused with KILN_EVERSION and left untouched.
 * After every recovery the healthy entries read back byte for byte and
 * PRAGMA quick_check on index.db says "ok".
 */
#include "helpers.h"

#define N_ENTRIES 6

static char *dir;
static kiln_cache_t *store;

static void setup(void)
{
	dir = tmpdir_new();
}

static void teardown(void)
{
	kiln_cache_close(store);
	store = NULL;
	rm_rf(dir);
	free(dir);
	dir = NULL;
}

TestSuite(recovery, .init = setup, .fini = teardown);

static size_t size_of(uint64_t n)
{
	return 1000 + (size_t)n * 3001;
}

static const char *target_of(uint64_t n)
{
	return n % 2 ? "cuda-sm_90" : "x86_64-avx512";
}

/* Stores keys 0..N_ENTRIES-1 (gen_bytes(n, size_of(n)), with metadata) and
 * closes the store cleanly. */
static void populate(void)
{
	store = store_open(dir, NULL);
	for (uint64_t n = 0; n < N_ENTRIES; n++) {
		char fp[64];
		snprintf(fp, sizeof(fp), "fp-%llu", (unsigned long long)n);
		kiln_cache_meta_t m = {
		    .target = target_of(n),
		    .fingerprint = fp,
		    .compile_ms = 100 + (uint32_t)n,
		    .source = n == 3 ? KILN_CACHE_SOURCE_REMOTE
				     : KILN_CACHE_SOURCE_COMPILED,
		};
		put_gen(store, n, size_of(n), &m);
	}
	kiln_cache_close(store);
	store = NULL;
}

/* The blob path of entry n. */
static void entry_blob(uint64_t n, char p[PATH_MAX])
{
	uint8_t *b = gen_bytes(n, size_of(n));
	blob_path(dir, b, size_of(n), p);
	free(b);
}

/* Asserts every entry but those in bad[] (mask of key numbers) is a hit
 * with its bytes and, when meta is set, its put metadata. */
static void expect_entries(unsigned bad, bool meta)
{
	for (uint64_t n = 0; n < N_ENTRIES; n++) {
		if (bad & (1u << n)) {
			expect_miss(store, n);
			continue;
		}
		uint8_t *b = gen_bytes(n, size_of(n));
		kiln_cache_blob_t h;
		expect_hit(store, n, b, size_of(n), &h);
		if (meta) {
			char fp[64];
			snprintf(fp, sizeof(fp), "fp-%llu",
				 (unsigned long long)n);
			cr_assert_str_eq(h.entry.target, target_of(n));
			cr_assert_str_eq(h.entry.fingerprint, fp);
			cr_assert_eq(h.entry.compile_ms, 100 + n);
			cr_assert_eq(h.entry.source,
				     n == 3 ? KILN_CACHE_SOURCE_REMOTE
					    : KILN_CACHE_SOURCE_COMPILED);
			cr_assert_gt(h.entry.created, 0);
		}
		kiln_cache_blob_release(&h);
		free(b);
	}
}

/* Closes the store and checks index.db. */
static void close_and_check(void)
{
	kiln_cache_close(store);
	store = NULL;
	expect_quick_check(dir);
}

static void rm_index(void)
{
	char p[PATH_MAX];
	static const char *const sfx[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		path_fmt(p, "%s/index.db%s", dir, sfx[i]);
		cr_assert(unlink(p) == 0 || errno == ENOENT, "unlink %s", p);
	}
}

/* How many index.db.bad-* files (not counting their -wal/-shm) lie in dir;
 * the name of the last one seen goes to name (may be NULL). */
static int count_bad_index(char name[PATH_MAX])
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, "index.db.bad-", 13) != 0)
			continue;
		size_t len = strlen(e->d_name);
		if (len > 4 && (!strcmp(e->d_name + len - 4, "-wal") ||
				!strcmp(e->d_name + len - 4, "-shm")))
			continue;
		n++;
		if (name != NULL)
			path_fmt(name, "%s", e->d_name);
	}
	closedir(d);
	return n;
}

/* ---- damaged blobs ------------------------------------------------------- */

/* Reopens after damage to entry 2's blob; checks the drop and the rest. */
static void expect_blob_damage_recovered(void)
{
	store = store_open(dir, NULL);
	expect_miss(store, 2);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 1);
	cr_assert_eq(s.misses, 1);
	cr_assert_eq(s.entries, N_ENTRIES - 1);
	/* The others are hits; the row is gone, so key 2 is now a plain
	 * miss (expect_entries gets it once more). */
	expect_entries(1u << 2, true);
	s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 1);
	cr_assert_eq(s.misses, 2);
	cr_assert_eq(s.hits, N_ENTRIES - 1);
	kiln_cache_verify_result_t r;
	char err[256] = "";
	cr_assert_eq(kiln_cache_verify(store, &r, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(r.blobs_bad, 0);
	cr_assert_eq(r.blobs_checked, N_ENTRIES - 1);
	/* Storing the bytes again heals the key. */
	put_gen(store, 2, size_of(2), NULL);
	expect_gen(store, 2, size_of(2));
	close_and_check();
	store = store_open(dir, NULL);
	expect_entries(0, false);
	close_and_check();
}

Test(recovery, flipped_byte_in_blob)
{
	populate();
	char p[PATH_MAX];
	entry_blob(2, p);
	file_flip_byte(p, (off_t)size_of(2) / 2);
	expect_blob_damage_recovered();
}

Test(recovery, flipped_last_byte_in_blob)
{
	populate();
	char p[PATH_MAX];
	entry_blob(2, p);
	file_flip_byte(p, (off_t)size_of(2) - 1);
	expect_blob_damage_recovered();
}

Test(recovery, truncated_blob)
{
	populate();
	char p[PATH_MAX];
	entry_blob(2, p);
	file_truncate(p, (off_t)size_of(2) / 3);
	expect_blob_damage_recovered();
}

Test(recovery, blob_with_extra_bytes)
{
	populate();
	char p[PATH_MAX];
	entry_blob(2, p);
	file_truncate(p, (off_t)size_of(2) + 10);
	expect_blob_damage_recovered();
}

Test(recovery, deleted_blob)
{
	populate();
	char p[PATH_MAX];
	entry_blob(2, p);
	cr_assert_eq(unlink(p), 0);
	expect_blob_damage_recovered();
}

Test(recovery, damaged_shared_blob_drops_every_row)
{
	store = store_open(dir, NULL);
	uint8_t *b = gen_bytes(42, 9000);
	put_ok(store, 1, b, 9000, NULL);
	put_ok(store, 2, b, 9000, NULL);
	put_gen(store, 3, 500, NULL);
	kiln_cache_close(store);
	store = NULL;
	char p[PATH_MAX];
	blob_path(dir, b, 9000, p);
	file_flip_byte(p, 0);

	store = store_open(dir, NULL);
	expect_miss(store, 1);
	expect_miss(store, 2);
	expect_gen(store, 3, 500);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 2);
	cr_assert_eq(s.entries, 1);
	cr_assert_eq(s.blobs, 1);
	close_and_check();
	free(b);
}

/* ---- lost or damaged index ----------------------------------------------- */

Test(recovery, deleted_index_rebuilt_from_journal)
{
	populate();
	rm_index();
	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 1);
	cr_assert_eq(s.entries, N_ENTRIES);
	cr_assert_eq(s.blobs, N_ENTRIES);
	cr_assert_eq(s.orphan_blobs, 0, "every blob has its journal record");
	expect_entries(0, true);
	/* Metadata that cannot be recovered gets defaults. */
	size_t n;
	kiln_cache_entry_t *e = NULL;
	char err[256] = "";
	cr_assert_eq(kiln_cache_list(store, NULL, KILN_CACHE_ORDER_LRU, 0, &e,
				     &n, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(n, N_ENTRIES);
	for (size_t i = 0; i < n; i++)
		cr_assert_geq(e[i].last_used, e[i].created);
	free(e);
	close_and_check();

	/* The rebuilt index is the index from now on. */
	store = store_open(dir, NULL);
	s = stats_of(store);
	cr_assert_eq(s.rebuilds, 0);
	cr_assert_eq(s.entries, N_ENTRIES);
	expect_entries(0, true);
	close_and_check();
}

Test(recovery, rebuild_keeps_the_latest_put_of_a_key)
{
	store = store_open(dir, NULL);
	uint8_t *x = gen_bytes(100, 4000);
	uint8_t *y = gen_bytes(200, 5000);
	kiln_cache_meta_t mx = {.target = "old"};
	kiln_cache_meta_t my = {.target = "new"};
	put_ok(store, 1, x, 4000, &mx);
	put_ok(store, 2, x, 4000, NULL); /* keeps blob x alive */
	put_ok(store, 1, y, 5000, &my);
	kiln_cache_close(store);
	store = NULL;
	rm_index();

	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 1);
	kiln_cache_blob_t h;
	expect_hit(store, 1, y, 5000, &h);
	cr_assert_str_eq(h.entry.target, "new");
	kiln_cache_blob_release(&h);
	expect_hit(store, 2, x, 4000, NULL);
	cr_assert_eq(stats_of(store).entries, 2);
	close_and_check();
	free(x);
	free(y);
}

Test(recovery, deleted_index_with_torn_journal_tail)
{
	populate();
	char jp[PATH_MAX];
	path_fmt(jp, "%s/journal", dir);
	cr_assert(file_exists(jp), "no journal at %s", jp);
	store = store_open(dir, NULL);
	off_t before = file_size(jp);
	put_gen(store, 50, 2000, NULL);
	off_t after = file_size(jp);
	cr_assert_gt(after, before, "the put was not journalled");
	kiln_cache_close(store);
	store = NULL;
	/* Tear the last record in its middle (close may have rewritten the
	 * journal: count from its end), then lose the index. */
	off_t rec = after - before;
	file_truncate(jp, file_size(jp) - rec + rec / 2);
	rm_index();

	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 1);
	expect_entries(0, true);
	/* Key 50 may be lost with its record, but never wrong. */
	kiln_cache_blob_t h;
	if (get_n(store, 50, &h) == 0) {
		kiln_cache_blob_release(&h);
		expect_gen(store, 50, 2000);
	}
	/* The journal takes new records after the torn one. */
	put_gen(store, 51, 3000, NULL);
	close_and_check();
	rm_index();
	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 1);
	expect_entries(0, true);
	expect_gen(store, 51, 3000);
	close_and_check();
}

Test(recovery, garbage_index_moved_aside_and_rebuilt)
{
	populate();
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", dir);
	const size_t glen = 16 * KIB;
	uint8_t *garbage = gen_bytes(0xbad, glen);
	file_write(p, garbage, glen);
	path_fmt(p, "%s/index.db-wal", dir);
	unlink(p);
	path_fmt(p, "%s/index.db-shm", dir);
	unlink(p);
	int64_t t0 = time(NULL);

	store = store_open(dir, NULL);
	int64_t t1 = time(NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 1);
	cr_assert_eq(s.entries, N_ENTRIES);
	expect_entries(0, true);

	char name[PATH_MAX];
	cr_assert_eq(count_bad_index(name), 1);
	char *end = NULL;
	long long t = strtoll(name + 13, &end, 10);
	cr_assert(end != name + 13 && *end == '\0', "odd name %s", name);
	cr_assert(t >= t0 - 1 && t <= t1 + 1,
		  "%s: time %lld not in [%lld, "
		  "%lld]",
		  name, t, (long long)t0, (long long)t1);
	path_fmt(p, "%s/%s", dir, name);
	size_t n;
	uint8_t *kept = file_read(p, &n);
	cr_assert_eq(n, glen);
	cr_assert(memcmp(kept, garbage, glen) == 0, "%s is not the old index",
		  name);
	free(kept);
	free(garbage);
	close_and_check();

	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 0);
	expect_entries(0, true);
	close_and_check();
}

Test(recovery, index_with_damaged_pages_rebuilt)
{
	populate();
	/* Overwrite every page of the index but the first (the header stays
	 * valid, the b-trees do not); first move any WAL content into it. */
	db_exec(dir, "PRAGMA wal_checkpoint(TRUNCATE)");
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", dir);
	off_t len = file_size(p);
	cr_assert_geq(len, 8192, "index.db is only %lld bytes", (long long)len);
	int fd = open(p, O_WRONLY);
	cr_assert(fd >= 0);
	uint8_t *junk = gen_bytes(77, (size_t)len);
	cr_assert_eq(pwrite(fd, junk + 4096, (size_t)len - 4096, 4096),
		     (ssize_t)len - 4096);
	close(fd);
	free(junk);

	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 1);
	cr_assert_eq(s.entries, N_ENTRIES);
	expect_entries(0, true);
	cr_assert_eq(count_bad_index(NULL), 1);
	close_and_check();
}

/* ---- unclean shutdown ---------------------------------------------------- */

Test(recovery, leftover_temp_files_removed)
{
	populate();
	pid_t dead = unclean_session(dir, 100, 3000);
	/* Temp files as a put killed midway leaves them. */
	char t1[PATH_MAX], t2[PATH_MAX];
	objects_subdir(dir, "0f");
	objects_subdir(dir, "a7");
	path_fmt(t1, "%s/objects/0f/.tmp.%d.0", dir, (int)dead);
	path_fmt(t2, "%s/objects/a7/.tmp.%d.17", dir, (int)dead);
	uint8_t *b = gen_bytes(5, 2500);
	file_write(t1, b, 2500);
	file_write(t2, b, 10);
	free(b);
	cr_assert_eq(objects_census(dir).temps, 2);

	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.temp_removed, 2);
	cr_assert_eq(s.orphan_blobs, 0);
	cr_assert(!file_exists(t1), "%s left", t1);
	cr_assert(!file_exists(t2), "%s left", t2);
	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.temps, 0);
	cr_assert_eq(oc.other, 0);
	cr_assert_eq(oc.blobs, N_ENTRIES + 1);
	expect_entries(0, true);
	expect_gen(store, 100, 3000);
	close_and_check();

	/* After a clean close there is nothing to remove. */
	store = store_open(dir, NULL);
	s = stats_of(store);
	cr_assert_eq(s.temp_removed, 0);
	cr_assert_eq(s.orphan_blobs, 0);
	close_and_check();
}

Test(recovery, orphan_blobs_removed_after_unclean_shutdown)
{
	populate();
	/* A valid blob file that no row names. */
	const size_t olen = 7777;
	uint8_t *ob = gen_bytes(999, olen);
	char op[PATH_MAX];
	blob_path(dir, ob, olen, op);
	char sub[3] = {0};
	memcpy(sub, op + strlen(dir) + strlen("/objects/"), 2);
	objects_subdir(dir, sub);
	file_write(op, ob, olen);
	free(ob);

	unclean_session(dir, 100, 4000);
	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.orphan_blobs, 1);
	cr_assert_eq(s.temp_removed, 0);
	cr_assert_eq(s.rebuilds, 0);
	cr_assert(!file_exists(op), "orphan %s left", op);
	/* The unclean session's committed put survives. */
	expect_gen(store, 100, 4000);
	expect_entries(0, true);
	s = stats_of(store);
	cr_assert_eq(s.entries, N_ENTRIES + 1);
	cr_assert_eq(s.blobs, N_ENTRIES + 1);
	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.blobs, N_ENTRIES + 1);
	cr_assert_eq(oc.bytes, s.bytes);
	close_and_check();
}

Test(recovery, unclean_shutdown_alone_loses_nothing)
{
	populate();
	unclean_session(dir, 100, 0);
	unclean_session(dir, 101, 300 * KIB);
	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.orphan_blobs, 0);
	cr_assert_eq(s.temp_removed, 0);
	cr_assert_eq(s.corrupt_dropped, 0);
	expect_entries(0, true);
	expect_gen(store, 100, 0);
	expect_gen(store, 101, 300 * KIB);
	close_and_check();
}

/* ---- newer schema -------------------------------------------------------- */

Test(recovery, newer_schema_refused_and_left_untouched)
{
	populate();
	char *v = db_text(dir, "PRAGMA user_version");
	cr_assert_str_eq(v, "2");
	free(v);
	db_exec(dir, "PRAGMA user_version = 99");
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", dir);
	size_t n0;
	uint8_t *before = file_read(p, &n0);
	struct stat st0;
	cr_assert_eq(stat(p, &st0), 0);

	for (int i = 0; i < 2; i++) {
		kiln_cache_t *c = NULL;
		char err[512] = "";
		int rc = kiln_cache_open(dir, NULL, &c, err, sizeof(err));
		cr_assert_eq(rc, KILN_EVERSION, "open: %d (%s): %s", rc,
			     kiln_strerror(rc), err);
		cr_assert_null(c);
		cr_assert_neq(err[0], '\0');
	}
	size_t n1;
	uint8_t *after = file_read(p, &n1);
	cr_assert_eq(n1, n0);
	cr_assert(memcmp(before, after, n0) == 0, "index.db was modified");
	struct stat st1;
	cr_assert_eq(stat(p, &st1), 0);
	cr_assert_eq(st1.st_ino, st0.st_ino, "index.db was replaced");
	cr_assert_eq(count_bad_index(NULL), 0);
	free(before);
	free(after);
	v = db_text(dir, "PRAGMA user_version");
	cr_assert_str_eq(v, "99");
	free(v);
	expect_quick_check(dir);
	cr_assert_eq(objects_census(dir).blobs, N_ENTRIES,
		     "blobs removed by a refused open");

	/* Back to version 2, everything is there. */
	db_exec(dir, "PRAGMA user_version = 2");
	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 0);
	expect_entries(0, true);
	close_and_check();
}

/* ---- the read checksum (schema 2) ---------------------------------------- */

static int64_t db_count(const char *sql)
{
	char *v = db_text(dir, sql);
	int64_t n = strtoll(v, NULL, 10);
	free(v);
	return n;
}

/* A store written before schema 2 (no crc column, user_version 1) is
 * migrated at open; its blobs are read by SHA-256 until their first read
 * records the CRC (and verify records the rest); a flipped byte in a
 * migrated blob is still a miss. */
Test(recovery, schema_1_store_migrates_and_gains_checksums)
{
	populate();
	db_exec(dir, "ALTER TABLE blobs DROP COLUMN crc;"
		     "PRAGMA user_version = 1");
	store = store_open(dir, NULL);
	char *v = db_text(dir, "PRAGMA user_version");
	cr_assert_str_eq(v, "2");
	free(v);
	cr_assert_eq(db_count("SELECT count(*) FROM blobs WHERE crc IS NULL"),
		     N_ENTRIES);
	char p[PATH_MAX];
	entry_blob(5, p);
	file_flip_byte(p, 77);
	/* Read 0..2 (and 5, rotted); 3 and 4 stay unread. */
	for (uint64_t n = 0; n < 3; n++)
		expect_gen(store, n, size_of(n));
	expect_miss(store, 5);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 1);
	cr_assert_eq(s.checksums_repaired, 0);
	cr_assert_eq(db_count("SELECT count(*) FROM blobs WHERE crc IS NULL"),
		     2, "the reads recorded their checksums");
	kiln_cache_verify_result_t r;
	char err[512] = "";
	cr_assert_eq(kiln_cache_verify(store, &r, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(r.blobs_bad, 0);
	cr_assert_eq(r.checksums_repaired, 0);
	cr_assert_eq(db_count("SELECT count(*) FROM blobs WHERE crc IS NULL"),
		     0, "verify recorded the rest");
	cr_assert_eq(db_count("SELECT count(*) FROM blobs WHERE length(crc) "
			      "= 8"),
		     N_ENTRIES - 1);
	expect_entries(1u << 5, true);
	close_and_check();
}

/* A row whose checksum is wrong for good bytes (the index, not the blob,
 * rotted) is rewritten: the get still hits, nothing is dropped. */
Test(recovery, wrong_checksum_in_the_index_is_repaired_not_dropped)
{
	populate();
	db_exec(dir, "UPDATE blobs SET crc = x'0123456789abcdef' "
		     "WHERE size = 4001");
	store = store_open(dir, NULL);
	expect_entries(0, true); /* key 1 (4001 bytes) included */
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.checksums_repaired, 1);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.entries, N_ENTRIES);
	close_and_check();
	cr_assert_eq(
	    db_count(
		"SELECT count(*) FROM blobs WHERE crc = x'0123456789abcdef'"),
	    0);
	store = store_open(dir, NULL);
	expect_entries(0, true);
	cr_assert_eq(stats_of(store).checksums_repaired, 0);
	kiln_cache_close(store);
	store = NULL;

	/* verify finds and rewrites the same damage without any get. */
	db_exec(dir, "UPDATE blobs SET crc = zeroblob(8) WHERE size > 10000");
	int64_t damaged =
	    db_count("SELECT count(*) FROM blobs WHERE crc = zeroblob(8)");
	cr_assert_eq(damaged, 3);
	store = store_open(dir, NULL);
	kiln_cache_verify_result_t r;
	char err[512] = "";
	cr_assert_eq(kiln_cache_verify(store, &r, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(r.checksums_repaired, 3);
	cr_assert_eq(r.blobs_bad, 0);
	cr_assert_eq(r.entries_dropped, 0);
	expect_entries(0, true);
	close_and_check();
}

/* Blob files that are not the bytes the row describes, found through the
 * CRC (and the size, without an fstat): one byte longer, cut short by one
 * byte, a FIFO (must not block), a directory. Each is a miss whose row is
 * dropped; the others read back. */
Test(recovery, longer_shorter_fifo_and_directory_blobs_are_misses)
{
	populate();
	store = store_open(dir, NULL);
	expect_entries(0, true); /* the memo holds every row now */
	char p[PATH_MAX];
	entry_blob(1, p);
	size_t n;
	uint8_t *b = file_read(p, &n);
	uint8_t *longer = malloc(n + 1);
	memcpy(longer, b, n);
	longer[n] = 0x5a;
	file_write(p, longer, n + 1);
	free(longer);
	free(b);
	entry_blob(2, p);
	file_truncate(p, (off_t)size_of(2) - 1);
	entry_blob(3, p);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkfifo(p, 0644), 0, "mkfifo %s: %s", p, strerror(errno));
	entry_blob(4, p);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkdir(p, 0755), 0);
	expect_entries(0x1eu, true);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 4);
	cr_assert_eq(s.entries, N_ENTRIES - 4);
	expect_entries(0x1eu, true); /* and they stay misses */
	kiln_cache_close(store);
	store = NULL;
	entry_blob(4, p);
	rmdir(p); /* the store leaves a directory it did not make alone */
	expect_quick_check(dir);
}

/* A row whose size is no blob's (a damaged index: 2^50 bytes) is a miss
 * whose rows are dropped, not an allocation of that size. */
Test(recovery, implausible_size_in_the_index_is_a_miss)
{
	populate();
	db_exec(dir, "UPDATE blobs SET size = 1125899906842624 "
		     "WHERE size = 4001");
	store = store_open(dir, NULL);
	expect_entries(1u << 1, true);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 1);
	cr_assert_eq(s.entries, N_ENTRIES - 1);
	close_and_check();
}
