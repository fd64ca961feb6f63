/*
 * test_basic.c — the kernel store (cache/) on a healthy store: put/get round
 * trips with metadata, replacing a key, deduplication (one blob for equal
 * bytes, kept until its last key goes), misses of get/touch/evict, list()
 * with every order, filter and a limit, the counters, gc in LRU order,
 * automatic gc on put, verify() on a healthy and on a damaged store, bad
 * input, NULL meta, empty blobs, close(NULL), opening a regular file, the
 * one-owner lock (-EBUSY "in use by pid N" from a forked child), and four
 * threads doing get/put/evict/gc on overlapping keys at once.
 */
#include "helpers.h"

#include <pthread.h>
#include <stdatomic.h>

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

TestSuite(basic, .init = setup, .fini = teardown);

static void reopen(const kiln_cache_options_t *o)
{
	kiln_cache_close(store);
	store = store_open(dir, o);
}

static void close_store(void)
{
	kiln_cache_close(store);
	store = NULL;
}

static int put_rc(uint64_t n, const void *bytes, size_t size,
		  const kiln_cache_meta_t *m, char *err, size_t errlen)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	return kiln_cache_put(store, key, bytes, size, m, err, errlen);
}

static int evict_n(uint64_t n)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	char err[256] = "";
	return kiln_cache_evict(store, key, err, sizeof(err));
}

static int touch_n(uint64_t n)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	char err[256] = "";
	return kiln_cache_touch(store, key, err, sizeof(err));
}

static void flush_ok(void)
{
	char err[256] = "";
	int rc = kiln_cache_flush(store, err, sizeof(err));
	cr_assert_eq(rc, 0, "flush: %s: %s", kiln_strerror(rc), err);
}

/* list() into a malloc'd array; asserts success. */
static kiln_cache_entry_t *list_ok(const kiln_cache_filter_t *f,
				   kiln_cache_order_t order, size_t limit,
				   size_t *n)
{
	kiln_cache_entry_t *e = (kiln_cache_entry_t *)1;
	char err[256] = "";
	*n = 12345;
	int rc =
	    kiln_cache_list(store, f, order, limit, &e, n, err, sizeof(err));
	cr_assert_eq(rc, 0, "list: %s: %s", kiln_strerror(rc), err);
	if (*n == 0)
		cr_assert_null(e, "an empty list must be NULL");
	return e;
}

/* Asserts list(f, order, limit) returns exactly the keys want[0..nwant). */
static void expect_list(const kiln_cache_filter_t *f, kiln_cache_order_t order,
			size_t limit, const uint64_t *want, size_t nwant)
{
	size_t n;
	kiln_cache_entry_t *e = list_ok(f, order, limit, &n);
	char got[256] = "", exp[256] = "";
	for (size_t i = 0; i < n; i++)
		snprintf(got + strlen(got), sizeof(got) - strlen(got), " %llu",
			 (unsigned long long)key_num(e[i].key));
	for (size_t i = 0; i < nwant; i++)
		snprintf(exp + strlen(exp), sizeof(exp) - strlen(exp), " %llu",
			 (unsigned long long)want[i]);
	cr_assert_str_eq(got, exp, "order %d: got [%s ], want [%s ]",
			 (int)order, got, exp);
	free(e);
}

/* ---- round trips --------------------------------------------------------- */

Test(basic, put_get_roundtrip_with_metadata)
{
	store = store_open(dir, NULL);
	cr_assert_str_eq(kiln_cache_dir(store), dir);
	const size_t size = 5000;
	uint8_t *b = gen_bytes(1, size);
	kiln_cache_meta_t m = {
	    .target = "x86_64-avx2",
	    .fingerprint = "llvm-16.0.6;-O3;+avx2,+fma",
	    .compile_ms = 1234,
	    .source = KILN_CACHE_SOURCE_REMOTE,
	};
	int64_t t0 = time(NULL);
	put_ok(store, 1, b, size, &m);
	int64_t t1 = time(NULL);

	kiln_cache_blob_t h;
	expect_hit(store, 1, b, size, &h);
	const kiln_cache_entry_t *e = &h.entry;
	cr_assert_str_eq(e->target, "x86_64-avx2");
	cr_assert_str_eq(e->fingerprint, "llvm-16.0.6;-O3;+avx2,+fma");
	cr_assert_eq(e->compile_ms, 1234);
	cr_assert_eq(e->source, KILN_CACHE_SOURCE_REMOTE);
	cr_assert(e->created >= t0 && e->created <= t1, "created %lld",
		  (long long)e->created);
	cr_assert(e->last_used >= e->created && e->last_used <= time(NULL),
		  "last_used %lld", (long long)e->last_used);
	cr_assert_eq(e->hits, 0, "the entry as it was before this hit");
	kiln_cache_blob_release(&h);

	/* The blob is a file named by the SHA-256 of the bytes. */
	char p[PATH_MAX];
	blob_path(dir, b, size, p);
	size_t flen;
	uint8_t *fb = file_read(p, &flen);
	cr_assert_eq(flen, size);
	cr_assert(memcmp(fb, b, size) == 0);
	free(fb);

	/* The first hit is in the index once flushed. */
	flush_ok();
	expect_hit(store, 1, b, size, &h);
	cr_assert_eq(h.entry.hits, 1);
	cr_assert_str_eq(h.entry.target, "x86_64-avx2");
	kiln_cache_blob_release(&h);

	/* ... and everything survives a clean reopen. */
	reopen(NULL);
	expect_hit(store, 1, b, size, &h);
	cr_assert_eq(h.entry.hits, 2);
	cr_assert_str_eq(h.entry.fingerprint, "llvm-16.0.6;-O3;+avx2,+fma");
	cr_assert_eq(h.entry.compile_ms, 1234);
	cr_assert_eq(h.entry.source, KILN_CACHE_SOURCE_REMOTE);
	cr_assert(h.entry.created >= t0 && h.entry.created <= t1);
	kiln_cache_blob_release(&h);
	free(b);
}

Test(basic, options_and_filter_init)
{
	kiln_cache_options_t o;
	memset(&o, 0x5a, sizeof(o));
	kiln_cache_options_init(&o);
	cr_assert_eq(o.max_bytes, 0);
	cr_assert_eq(o.min_free_bytes, 0);
	cr_assert_eq(o.busy_timeout_ms, 0);
	cr_assert_eq(o.touch_batch, 0);
	cr_assert_eq(o.touch_flush_ms, 0);
	cr_assert_eq(o.no_fsync, 0);

	kiln_cache_filter_t f;
	memset(&f, 0x5a, sizeof(f));
	kiln_cache_filter_init(&f);
	cr_assert_null(f.target);
	cr_assert_null(f.fingerprint);
	cr_assert_eq(f.source, -1);
	cr_assert_eq(f.unused_since, 0);
	cr_assert_eq(f.min_size, 0);

	/* opts NULL means the defaults. */
	kiln_cache_t *c = NULL;
	char err[256] = "";
	int rc = kiln_cache_open(dir, NULL, &c, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	store = c;
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_gt(s.max_bytes, 0);
	cr_assert_leq(s.max_bytes, (uint64_t)20 << 30);
	cr_assert_gt(s.min_free_bytes, 0);
	cr_assert_leq(s.min_free_bytes, (uint64_t)1 << 30);
}

Test(basic, replace_key)
{
	store = store_open(dir, NULL);
	uint8_t *a = gen_bytes(100, 3000);
	uint8_t *b = gen_bytes(200, 4000);
	kiln_cache_meta_t ma = {.target = "a", .compile_ms = 1};
	kiln_cache_meta_t mb = {.target = "b", .compile_ms = 2};
	put_ok(store, 1, a, 3000, &ma);
	put_ok(store, 1, b, 4000, &mb);

	kiln_cache_blob_t h;
	expect_hit(store, 1, b, 4000, &h);
	cr_assert_str_eq(h.entry.target, "b");
	cr_assert_eq(h.entry.compile_ms, 2);
	kiln_cache_blob_release(&h);

	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, 1);
	cr_assert_eq(s.puts, 2);
	cr_assert_eq(s.blobs, 1, "the replaced blob has no key left");
	cr_assert_eq(s.bytes, 4000);

	char pa[PATH_MAX], pb[PATH_MAX];
	blob_path(dir, a, 3000, pa);
	blob_path(dir, b, 4000, pb);
	cr_assert(!file_exists(pa), "replaced blob %s still there", pa);
	cr_assert(file_exists(pb));
	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.blobs, 1);
	cr_assert_eq(oc.temps, 0);

	size_t n;
	kiln_cache_entry_t *e = list_ok(NULL, KILN_CACHE_ORDER_LRU, 0, &n);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].size, 4000);
	free(e);
	free(a);
	free(b);
}

/* A get keeps the row it read in memory (the hot-row memo): every write
 * that changes or removes the row must be seen by the next get. */
Test(basic, gets_follow_every_write_after_a_hit)
{
	store = store_open(dir, NULL);
	uint8_t *a = gen_bytes(300, 5000);
	uint8_t *b = gen_bytes(301, 6000);
	kiln_cache_meta_t ma = {.target = "a", .compile_ms = 1};
	kiln_cache_meta_t mb = {.target = "b", .compile_ms = 2};

	/* replace */
	put_ok(store, 1, a, 5000, &ma);
	expect_hit(store, 1, a, 5000, NULL);
	put_ok(store, 1, b, 6000, &mb);
	kiln_cache_blob_t h;
	expect_hit(store, 1, b, 6000, &h);
	cr_assert_str_eq(h.entry.target, "b");
	cr_assert_eq(h.entry.compile_ms, 2);
	kiln_cache_blob_release(&h);

	/* hits counted before they are written */
	expect_hit(store, 1, b, 6000, &h);
	uint64_t hits = h.entry.hits;
	kiln_cache_blob_release(&h);
	expect_hit(store, 1, b, 6000, &h);
	cr_assert_eq(h.entry.hits, hits + 1);
	kiln_cache_blob_release(&h);

	/* evict, then put back */
	cr_assert_eq(evict_n(1), 0);
	expect_miss(store, 1);
	put_ok(store, 1, a, 5000, &ma);
	expect_hit(store, 1, a, 5000, NULL);

	/* gc */
	uint64_t ev = 0;
	char err[256] = "";
	cr_assert_eq(kiln_cache_gc(store, 0, &ev, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(ev, 1);
	expect_miss(store, 1);

	/* a shared blob that rots: both keys miss, through the memo too */
	put_ok(store, 2, a, 5000, &ma);
	put_ok(store, 3, a, 5000, &mb);
	expect_hit(store, 2, a, 5000, NULL);
	expect_hit(store, 3, a, 5000, NULL);
	char pa[PATH_MAX];
	blob_path(dir, a, 5000, pa);
	file_flip_byte(pa, 4999);
	expect_miss(store, 2);
	expect_miss(store, 3);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 2);
	cr_assert_eq(s.entries, 0);

	/* the same bytes put again heal both */
	put_ok(store, 2, a, 5000, &ma);
	put_ok(store, 3, a, 5000, &mb);
	expect_hit(store, 2, a, 5000, NULL);
	expect_hit(store, 3, a, 5000, NULL);
	close_store();
	free(a);
	free(b);
}

/* last_used as a get reports it is the index's, memo or not: it moves
 * when a hit rewrites it (an entry last used over a minute ago), not with
 * every hit in between, so a hot entry's row keeps being refreshed (an
 * entry hit more often than once a minute must not look idle to gc). */
Test(basic, memo_reports_the_index_last_used)
{
	store = store_open(dir, NULL);
	put_gen(store, 1, 3000, NULL);
	close_store();
	int64_t old = (int64_t)time(NULL) - 3600;
	db_set_entry(dir, 1, old, old, 0);
	store = store_open(dir, NULL);
	kiln_cache_blob_t h;
	expect_gen(store, 1, 3000); /* fills the memo; rewrites last_used */
	expect_gen(store, 1, 3000);
	struct timespec pause = {1, 200000000};
	nanosleep(&pause, NULL); /* the next hits fall in later seconds */
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(get_n(store, 1, &h), 0);
		int64_t reported = h.entry.last_used;
		kiln_cache_blob_release(&h);
		flush_ok();
		size_t n;
		kiln_cache_entry_t *e =
		    list_ok(NULL, KILN_CACHE_ORDER_LRU, 0, &n);
		cr_assert_eq(n, 1);
		cr_assert_gt(e[0].last_used, old, "the first hit rewrote it");
		cr_assert_eq(reported, e[0].last_used,
			     "get reports %lld, the index holds %lld",
			     (long long)reported, (long long)e[0].last_used);
		cr_assert_eq(e[0].hits, 3u + (unsigned)i);
		free(e);
	}
	close_store();
}

Test(basic, dedup_one_blob_for_equal_bytes)
{
	store = store_open(dir, NULL);
	const size_t size = 10000;
	uint8_t *b = gen_bytes(7, size);
	kiln_cache_meta_t m1 = {.target = "one"};
	kiln_cache_meta_t m2 = {.target = "two"};
	put_ok(store, 1, b, size, &m1);
	put_ok(store, 2, b, size, &m2);

	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.blobs, 1, "%zu blob files for one content", oc.blobs);
	cr_assert_eq(oc.bytes, size);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.blobs, 1);
	cr_assert_eq(s.entries, 2);
	cr_assert_eq(s.bytes, size);
	cr_assert_eq(s.puts, 2);
	cr_assert_eq(s.dedup_puts, 1);

	kiln_cache_blob_t h;
	expect_hit(store, 1, b, size, &h);
	cr_assert_str_eq(h.entry.target, "one");
	kiln_cache_blob_release(&h);
	expect_hit(store, 2, b, size, &h);
	cr_assert_str_eq(h.entry.target, "two");
	kiln_cache_blob_release(&h);

	char p[PATH_MAX];
	blob_path(dir, b, size, p);
	cr_assert_eq(evict_n(1), 0);
	expect_miss(store, 1);
	expect_hit(store, 2, b, size, NULL);
	cr_assert(file_exists(p), "blob removed while key 2 uses it");
	s = stats_of(store);
	cr_assert_eq(s.blobs, 1);
	cr_assert_eq(s.entries, 1);
	cr_assert_eq(s.bytes, size);

	cr_assert_eq(evict_n(2), 0);
	expect_miss(store, 2);
	cr_assert(!file_exists(p), "blob kept after its last key went");
	s = stats_of(store);
	cr_assert_eq(s.blobs, 0);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.bytes, 0);
	cr_assert_eq(s.evictions, 2);
	cr_assert_eq(s.evicted_bytes, size);
	oc = objects_census(dir);
	cr_assert_eq(oc.blobs, 0);

	/* The same bytes stored again make a new blob. */
	put_ok(store, 3, b, size, NULL);
	expect_hit(store, 3, b, size, NULL);
	cr_assert(file_exists(p));
	free(b);
}

Test(basic, misses)
{
	store = store_open(dir, NULL);
	put_gen(store, 1, 100, NULL);

	kiln_cache_blob_t h;
	cr_assert_eq(get_n(store, 2, &h), KILN_ENOTFOUND);
	cr_assert_eq(touch_n(2), KILN_ENOTFOUND);
	cr_assert_eq(evict_n(2), KILN_ENOTFOUND);
	cr_assert_eq(touch_n(1), 0);
	cr_assert_eq(evict_n(1), 0);
	cr_assert_eq(evict_n(1), KILN_ENOTFOUND);
	cr_assert_eq(touch_n(1), KILN_ENOTFOUND);
	cr_assert_eq(get_n(store, 1, &h), KILN_ENOTFOUND);

	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.misses, 2);
	cr_assert_eq(s.hits, 0);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.evictions, 1);
}

/* ---- list ---------------------------------------------------------------- */

Test(basic, list_orders_filters_limit)
{
	store = store_open(dir, NULL);
	static const struct {
		size_t size;
		const char *target, *fp;
		kiln_cache_source_t src;
		int created, last_used, hits;
	} ent[] = {
	    /* key 0 unused */
	    {0, NULL, NULL, 0, 0, 0, 0},
	    {1000, "cpu", "fpA", KILN_CACHE_SOURCE_COMPILED, 50, 100, 7},
	    {5000, "cpu", "fpB", KILN_CACHE_SOURCE_REMOTE, 10, 500, 3},
	    {3000, "cuda", "fpA", KILN_CACHE_SOURCE_COMPILED, 40, 300, 9},
	    {2000, "cuda", "fpB", KILN_CACHE_SOURCE_REMOTE, 20, 200, 1},
	    {4000, "cpu", "fpA", KILN_CACHE_SOURCE_COMPILED, 30, 400, 5},
	};
	for (uint64_t i = 1; i <= 5; i++) {
		kiln_cache_meta_t m = {.target = ent[i].target,
				       .fingerprint = ent[i].fp,
				       .compile_ms = (uint32_t)i * 10,
				       .source = ent[i].src};
		put_gen(store, i, ent[i].size, &m);
	}
	close_store();
	const int64_t base = (int64_t)time(NULL) - 100000;
	for (uint64_t i = 1; i <= 5; i++)
		db_set_entry(dir, i, base + ent[i].created,
			     base + ent[i].last_used, ent[i].hits);
	store = store_open(dir, NULL);

	/* All entries, each order. */
	static const uint64_t lru[] = {1, 4, 3, 5, 2};
	static const uint64_t mru[] = {2, 5, 3, 4, 1};
	static const uint64_t bysize[] = {2, 5, 3, 4, 1};
	static const uint64_t byhits[] = {3, 1, 5, 2, 4};
	static const uint64_t created[] = {1, 3, 5, 4, 2};
	expect_list(NULL, KILN_CACHE_ORDER_LRU, 0, lru, 5);
	expect_list(NULL, KILN_CACHE_ORDER_MRU, 0, mru, 5);
	expect_list(NULL, KILN_CACHE_ORDER_SIZE, 0, bysize, 5);
	expect_list(NULL, KILN_CACHE_ORDER_HITS, 0, byhits, 5);
	expect_list(NULL, KILN_CACHE_ORDER_CREATED, 0, created, 5);

	/* Every field of the entries. */
	size_t n;
	kiln_cache_entry_t *e = list_ok(NULL, KILN_CACHE_ORDER_LRU, 0, &n);
	cr_assert_eq(n, 5);
	for (size_t j = 0; j < n; j++) {
		uint64_t i = key_num(e[j].key);
		cr_assert(i >= 1 && i <= 5);
		cr_assert_eq(e[j].size, ent[i].size);
		cr_assert_str_eq(e[j].target, ent[i].target);
		cr_assert_str_eq(e[j].fingerprint, ent[i].fp);
		cr_assert_eq(e[j].source, ent[i].src);
		cr_assert_eq(e[j].compile_ms, i * 10);
		cr_assert_eq(e[j].created, base + ent[i].created);
		cr_assert_eq(e[j].last_used, base + ent[i].last_used);
		cr_assert_eq(e[j].hits, (uint64_t)ent[i].hits);
		uint8_t *b = gen_bytes(i, ent[i].size);
		uint8_t h[32];
		sha256(b, ent[i].size, h);
		cr_assert_arr_eq(e[j].blob, h, 32);
		free(b);
	}
	free(e);

	/* A filter from filter_init matches everything. */
	kiln_cache_filter_t f;
	kiln_cache_filter_init(&f);
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, lru, 5);

	f.target = "cpu";
	static const uint64_t cpu[] = {1, 5, 2};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, cpu, 3);

	kiln_cache_filter_init(&f);
	f.fingerprint = "fpB";
	static const uint64_t fpb[] = {4, 2};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, fpb, 2);

	kiln_cache_filter_init(&f);
	f.source = KILN_CACHE_SOURCE_REMOTE;
	static const uint64_t remote[] = {4, 2};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, remote, 2);
	f.source = KILN_CACHE_SOURCE_COMPILED;
	static const uint64_t compiled[] = {1, 3, 5};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, compiled, 3);

	kiln_cache_filter_init(&f);
	f.min_size = 3000;
	static const uint64_t big[] = {3, 5, 2};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, big, 3);

	kiln_cache_filter_init(&f);
	f.unused_since = base + 300; /* last_used < base + 300 */
	static const uint64_t old[] = {1, 4};
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, old, 2);

	kiln_cache_filter_init(&f);
	f.target = "cuda";
	f.fingerprint = "fpA";
	static const uint64_t both[] = {3};
	expect_list(&f, KILN_CACHE_ORDER_SIZE, 0, both, 1);

	kiln_cache_filter_init(&f);
	f.target = "rocm";
	expect_list(&f, KILN_CACHE_ORDER_LRU, 0, NULL, 0);

	/* A limit takes the first ones of the order. */
	static const uint64_t top2[] = {2, 5};
	expect_list(NULL, KILN_CACHE_ORDER_SIZE, 2, top2, 2);
	static const uint64_t lru1[] = {1};
	expect_list(NULL, KILN_CACHE_ORDER_LRU, 1, lru1, 1);
	expect_list(NULL, KILN_CACHE_ORDER_LRU, 99, lru, 5);
	kiln_cache_filter_init(&f);
	f.target = "cpu";
	static const uint64_t cpu_mru2[] = {2, 5};
	expect_list(&f, KILN_CACHE_ORDER_MRU, 2, cpu_mru2, 2);

	/* A hit makes an entry the most recently used one (pending touches
	 * are flushed by list). */
	expect_gen(store, 1, ent[1].size);
	static const uint64_t lru_after[] = {4, 3, 5, 2, 1};
	expect_list(NULL, KILN_CACHE_ORDER_LRU, 0, lru_after, 5);
	cr_assert_eq(touch_n(4), 0);
	/* 1 and 4 were both used just now (in one second or two): they lead
	 * the MRU order in either order; the rest follow by last_used. */
	static const uint64_t mru_tail[] = {2, 5, 3};
	e = list_ok(NULL, KILN_CACHE_ORDER_MRU, 0, &n);
	cr_assert_eq(n, 5);
	uint64_t k0 = key_num(e[0].key), k1 = key_num(e[1].key);
	cr_assert((k0 == 1 && k1 == 4) || (k0 == 4 && k1 == 1),
		  "MRU starts with %llu %llu", (unsigned long long)k0,
		  (unsigned long long)k1);
	for (size_t j = 2; j < 5; j++)
		cr_assert_eq(key_num(e[j].key), mru_tail[j - 2]);
	free(e);
}

/* ---- counters ------------------------------------------------------------ */

struct each_acc {
	size_t n;
	const char *names[64];
	uint64_t values[64];
};

static void each_cb(const char *name, const char *doc, uint64_t value,
		    void *arg)
{
	struct each_acc *a = arg;
	cr_assert_not_null(name);
	cr_assert_not_null(doc);
	cr_assert(a->n < 64);
	a->names[a->n] = name;
	a->values[a->n] = value;
	a->n++;
}

Test(basic, stats_counters)
{
	kiln_cache_options_t o;
	opts_fast(&o);
	o.max_bytes = 64 * MIB;
	store = store_open(dir, &o);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.blobs, 0);
	cr_assert_eq(s.bytes, 0);
	cr_assert_eq(s.hits, 0);
	cr_assert_eq(s.misses, 0);
	cr_assert_eq(s.puts, 0);
	cr_assert_eq(s.put_errors, 0);
	cr_assert_eq(s.rebuilds, 0);
	cr_assert_eq(s.max_bytes, 64 * MIB);
	cr_assert_eq(s.min_free_bytes, 1);
	cr_assert_gt(s.fs_free_bytes, 0);
	cr_assert_gt(s.index_bytes, 0);

	put_gen(store, 1, 100, NULL);
	put_gen(store, 2, 200, NULL);
	put_gen(store, 3, 300, NULL);
	expect_gen(store, 1, 100);
	expect_gen(store, 3, 300);
	expect_gen(store, 3, 300);
	expect_miss(store, 4);
	char longtarget[KILN_CACHE_TARGET_MAX + 1];
	memset(longtarget, 't', sizeof(longtarget) - 1);
	longtarget[sizeof(longtarget) - 1] = '\0';
	kiln_cache_meta_t bad = {.target = longtarget};
	uint8_t x[10] = {0};
	cr_assert_eq(put_rc(5, x, sizeof(x), &bad, NULL, 0), KILN_ETOOLARGE);

	s = stats_of(store);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.blobs, 3);
	cr_assert_eq(s.bytes, 600);
	cr_assert_eq(s.hits, 3);
	cr_assert_eq(s.misses, 1);
	cr_assert_eq(s.puts, 3);
	cr_assert_eq(s.put_errors, 1);
	cr_assert_eq(s.dedup_puts, 0);
	cr_assert_eq(s.evictions, 0);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.orphan_blobs, 0);
	cr_assert_eq(s.temp_removed, 0);
	cr_assert_geq(s.touch_flushes, 1, "stats flushes the pending hits");

	/* The counters reach the index: hits per entry. */
	size_t n;
	kiln_cache_entry_t *e = list_ok(NULL, KILN_CACHE_ORDER_HITS, 0, &n);
	cr_assert_eq(n, 3);
	cr_assert_eq(key_num(e[0].key), 3);
	cr_assert_eq(e[0].hits, 2);
	cr_assert_eq(key_num(e[1].key), 1);
	cr_assert_eq(e[1].hits, 1);
	cr_assert_eq(e[2].hits, 0);
	free(e);

	/* stats_each walks every field in X-macro order. */
	struct each_acc acc = {0};
	kiln_cache_stats_each(&s, each_cb, &acc);
	static const char *const names[] = {
#define NAME(name, doc) #name,
	    KILN_CACHE_STATS(NAME)
#undef NAME
	};
	const uint64_t values[] = {
#define VALUE(name, doc) s.name,
	    KILN_CACHE_STATS(VALUE)
#undef VALUE
	};
	size_t nf = sizeof(names) / sizeof(names[0]);
	cr_assert_eq(acc.n, nf);
	for (size_t i = 0; i < nf; i++) {
		cr_assert_str_eq(acc.names[i], names[i]);
		cr_assert_eq(acc.values[i], values[i], "%s", names[i]);
	}
	cr_assert_str_eq(acc.names[0], "entries");
	cr_assert_str_eq(acc.names[nf - 1], "rebuilds");

	/* Counters are since open; gauges are not. */
	reopen(&o);
	s = stats_of(store);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(s.bytes, 600);
	cr_assert_eq(s.hits, 0);
	cr_assert_eq(s.puts, 0);
}

/* ---- gc ------------------------------------------------------------------ */

Test(basic, gc_evicts_lru_first)
{
	store = store_open(dir, NULL);
	const size_t sz = 10 * KIB;
	for (uint64_t i = 0; i < 10; i++)
		put_gen(store, i, sz, NULL);
	close_store();
	/* Key i last used at base + 10 i: 0 is the least recently used. */
	const int64_t base = (int64_t)time(NULL) - 10000;
	for (uint64_t i = 0; i < 10; i++)
		db_set_entry(dir, i, base, base + (int64_t)i * 10, 0);
	store = store_open(dir, NULL);

	/* A hit on 0 makes it the most recently used: LRU order is now
	 * 1, 2, ..., 9, 0. */
	expect_gen(store, 0, sz);

	/* A target above the size evicts nothing. */
	uint64_t ev = 99;
	char err[256] = "";
	int rc = kiln_cache_gc(store, 1000 * KIB, &ev, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc: %s: %s", kiln_strerror(rc), err);
	cr_assert_eq(ev, 0);
	rc = kiln_cache_gc(store, UINT64_MAX, &ev, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc: %s: %s", kiln_strerror(rc), err);
	cr_assert_eq(ev, 0);

	/* Down to 35 KiB: three entries stay, the three most recent. */
	rc = kiln_cache_gc(store, 35 * KIB, &ev, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc: %s: %s", kiln_strerror(rc), err);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_leq(s.bytes, 35 * KIB);
	cr_assert_eq(s.evictions, ev);
	cr_assert_geq(s.gc_runs, 1);

	char got[128] = "";
	for (uint64_t i = 0; i < 10; i++) {
		kiln_cache_blob_t h;
		if (get_n(store, i, &h) == 0) {
			kiln_cache_blob_release(&h);
			snprintf(got + strlen(got), sizeof(got) - strlen(got),
				 " %llu", (unsigned long long)i);
		}
	}
	cr_assert_str_eq(got, " 0 8 9",
			 "kept [%s ] after gc to 35 KiB (%llu evicted); want "
			 "the three most recently used [ 0 8 9 ]",
			 got, (unsigned long long)ev);
	cr_assert_eq(ev, 7);
	cr_assert_eq(s.entries, 3);
	cr_assert_eq(objects_census(dir).blobs, 3);

	/* gc to 0 empties the store. */
	rc = kiln_cache_gc(store, 0, &ev, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc: %s: %s", kiln_strerror(rc), err);
	cr_assert_eq(ev, 3);
	s = stats_of(store);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.bytes, 0);
	cr_assert_eq(objects_census(dir).blobs, 0);
	rc = kiln_cache_gc(store, 0, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc on an empty store: %s", err);
}

Test(basic, gc_lru_ties_broken_by_created_then_key)
{
	store = store_open(dir, NULL);
	for (uint64_t i = 0; i < 6; i++)
		put_gen(store, i, 1000, NULL);
	close_store();
	/* All used in the same second; created: 5 oldest, then 0..4 in the
	 * same second (ties by key). LRU order: 5, 0, 1, 2, 3, 4. */
	const int64_t base = (int64_t)time(NULL) - 5000;
	for (uint64_t i = 0; i < 5; i++)
		db_set_entry(dir, i, base, base + 100, 0);
	db_set_entry(dir, 5, base - 10, base + 100, 0);
	store = store_open(dir, NULL);
	static const uint64_t lru[] = {5, 0, 1, 2, 3, 4};
	expect_list(NULL, KILN_CACHE_ORDER_LRU, 0, lru, 6);
	uint64_t ev = 0;
	char err[256] = "";
	int rc = kiln_cache_gc(store, 3000, &ev, err, sizeof(err));
	cr_assert_eq(rc, 0, "gc: %s", err);
	cr_assert_eq(ev, 3);
	expect_miss(store, 5);
	expect_miss(store, 0);
	expect_miss(store, 1);
	expect_gen(store, 2, 1000);
	expect_gen(store, 3, 1000);
	expect_gen(store, 4, 1000);
}

Test(basic, auto_gc_on_put_over_max_bytes)
{
	kiln_cache_options_t o;
	opts_fast(&o);
	o.max_bytes = 100 * KIB;
	store = store_open(dir, &o);
	const size_t sz = 20 * KIB;
	for (uint64_t i = 0; i < 12; i++) {
		put_gen(store, i, sz, NULL);
		kiln_cache_stats_t s = stats_of(store);
		cr_assert_leq(s.bytes, 100 * KIB,
			      "after put %llu: %llu bytes over max_bytes",
			      (unsigned long long)i,
			      (unsigned long long)s.bytes);
	}
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_gt(s.evictions, 0);
	cr_assert_eq(s.bytes, s.entries * sz);
	cr_assert_eq(s.puts, 12);
	cr_assert_eq(objects_census(dir).blobs, s.entries);

	/* The survivors are the newest puts (equal last_used and created
	 * seconds are ordered by key, which is put order here). */
	uint64_t first_hit = 12;
	for (uint64_t i = 0; i < 12; i++) {
		kiln_cache_blob_t h;
		int rc = get_n(store, i, &h);
		if (rc == 0) {
			kiln_cache_blob_release(&h);
			if (first_hit == 12)
				first_hit = i;
		} else {
			cr_assert_eq(first_hit, 12,
				     "key %llu evicted but older key %llu "
				     "kept",
				     (unsigned long long)i,
				     (unsigned long long)first_hit);
		}
	}
	cr_assert_lt(first_hit, 12);
	cr_assert_eq(12 - first_hit, s.entries);
	expect_gen(store, 11, sz);
}

/* ---- verify -------------------------------------------------------------- */

Test(basic, verify_healthy_and_damaged)
{
	store = store_open(dir, NULL);
	uint64_t total = 0;
	for (uint64_t i = 0; i < 5; i++) {
		put_gen(store, i, 3000 + i * 1000, NULL);
		total += 3000 + i * 1000;
	}
	/* Key 5 shares key 4's blob. */
	uint8_t *b4 = gen_bytes(4, 7000);
	put_ok(store, 5, b4, 7000, NULL);

	kiln_cache_verify_result_t r;
	memset(&r, 0xa5, sizeof(r));
	char err[256] = "";
	int rc = kiln_cache_verify(store, &r, err, sizeof(err));
	cr_assert_eq(rc, 0, "verify: %s: %s", kiln_strerror(rc), err);
	cr_assert_eq(r.blobs_checked, 5);
	cr_assert_eq(r.bytes_checked, total);
	cr_assert_eq(r.blobs_bad, 0);
	cr_assert_eq(r.entries_dropped, 0);

	char p[PATH_MAX];
	uint8_t *b2 = gen_bytes(2, 5000);
	blob_path(dir, b2, 5000, p);
	file_flip_byte(p, 1234);
	rc = kiln_cache_verify(store, &r, err, sizeof(err));
	cr_assert_eq(rc, 0, "verify: %s: %s", kiln_strerror(rc), err);
	cr_assert_eq(r.blobs_checked, 5);
	cr_assert_eq(r.blobs_bad, 1);
	cr_assert_eq(r.entries_dropped, 1);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 1);
	cr_assert_eq(s.entries, 5);
	cr_assert_eq(s.blobs, 4);
	expect_miss(store, 2);
	for (uint64_t i = 0; i < 5; i++) {
		if (i != 2)
			expect_gen(store, i, 3000 + i * 1000);
	}
	expect_hit(store, 5, b4, 7000, NULL);

	/* A shared blob that goes bad drops both of its rows. */
	char p4[PATH_MAX];
	blob_path(dir, b4, 7000, p4);
	file_truncate(p4, 6999);
	rc = kiln_cache_verify(store, &r, err, sizeof(err));
	cr_assert_eq(rc, 0, "verify: %s", err);
	cr_assert_eq(r.blobs_checked, 4);
	cr_assert_eq(r.blobs_bad, 1);
	cr_assert_eq(r.entries_dropped, 2);
	expect_miss(store, 4);
	expect_miss(store, 5);

	rc = kiln_cache_verify(store, &r, err, sizeof(err));
	cr_assert_eq(rc, 0);
	cr_assert_eq(r.blobs_checked, 3);
	cr_assert_eq(r.blobs_bad, 0);
	s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 3);
	cr_assert_eq(s.entries, 3);

	/* Storing the bytes again heals the key. */
	put_ok(store, 2, b2, 5000, NULL);
	expect_hit(store, 2, b2, 5000, NULL);
	free(b2);
	free(b4);
}

/* ---- input and edge cases ------------------------------------------------ */

Test(basic, bad_input_too_long_strings)
{
	store = store_open(dir, NULL);
	char target[KILN_CACHE_TARGET_MAX + 1];
	char fp[KILN_CACHE_FINGERPRINT_MAX + 1];
	memset(target, 't', sizeof(target));
	memset(fp, 'f', sizeof(fp));
	uint8_t *b = gen_bytes(1, 1000);

	/* 64 chars do not fit target[64] with its NUL. */
	target[KILN_CACHE_TARGET_MAX] = '\0';
	kiln_cache_meta_t m = {.target = target};
	char err[256] = "";
	int rc = put_rc(1, b, 1000, &m, err, sizeof(err));
	cr_assert_eq(rc, KILN_ETOOLARGE, "long target: %s", kiln_strerror(rc));
	cr_assert_neq(err[0], '\0');

	fp[KILN_CACHE_FINGERPRINT_MAX] = '\0';
	m = (kiln_cache_meta_t){.fingerprint = fp};
	err[0] = '\0';
	rc = put_rc(2, b, 1000, &m, err, sizeof(err));
	cr_assert_eq(rc, KILN_ETOOLARGE, "long fingerprint: %s",
		     kiln_strerror(rc));
	cr_assert_neq(err[0], '\0');

	/* Nothing stored. */
	expect_miss(store, 1);
	expect_miss(store, 2);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.blobs, 0);
	cr_assert_eq(s.puts, 0);
	cr_assert_eq(s.put_errors, 2);
	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.blobs, 0);
	cr_assert_eq(oc.temps, 0);

	/* The longest strings that fit are stored as they are. */
	target[KILN_CACHE_TARGET_MAX - 1] = '\0';
	fp[KILN_CACHE_FINGERPRINT_MAX - 1] = '\0';
	m = (kiln_cache_meta_t){.target = target, .fingerprint = fp};
	put_ok(store, 3, b, 1000, &m);
	kiln_cache_blob_t h;
	expect_hit(store, 3, b, 1000, &h);
	cr_assert_str_eq(h.entry.target, target);
	cr_assert_str_eq(h.entry.fingerprint, fp);
	kiln_cache_blob_release(&h);
	free(b);
}

Test(basic, null_meta)
{
	store = store_open(dir, NULL);
	put_gen(store, 1, 777, NULL);
	kiln_cache_meta_t m = {.target = NULL, .fingerprint = NULL};
	put_gen(store, 2, 778, &m);
	for (uint64_t i = 1; i <= 2; i++) {
		kiln_cache_blob_t h;
		uint8_t *b = gen_bytes(i, 776 + i);
		expect_hit(store, i, b, 776 + i, &h);
		cr_assert_str_eq(h.entry.target, "");
		cr_assert_str_eq(h.entry.fingerprint, "");
		cr_assert_eq(h.entry.compile_ms, 0);
		cr_assert_eq(h.entry.source, KILN_CACHE_SOURCE_COMPILED);
		kiln_cache_blob_release(&h);
		free(b);
	}
}

Test(basic, zero_length_blob)
{
	store = store_open(dir, NULL);
	static const uint8_t none[1];
	put_ok(store, 1, none, 0, NULL);
	kiln_cache_blob_t h;
	expect_hit(store, 1, none, 0, &h);
	cr_assert_eq(h.size, 0);
	cr_assert_eq(h.entry.size, 0);
	static const char empty_sha[] = "e3b0c44298fc1c149afbf4c8996fb924"
					"27ae41e4649b934ca495991b7852b855";
	char hx[65];
	hex_of(h.entry.blob, 32, hx);
	cr_assert_str_eq(hx, empty_sha);
	kiln_cache_blob_release(&h);

	char p[PATH_MAX];
	blob_path(dir, none, 0, p);
	cr_assert(file_exists(p), "no blob file %s", p);
	cr_assert_eq(file_size(p), 0);

	/* A second key with no bytes shares the blob; it survives a reopen
	 * and verify. */
	put_ok(store, 2, none, 0, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.blobs, 1);
	cr_assert_eq(s.bytes, 0);
	cr_assert_eq(s.entries, 2);
	reopen(NULL);
	expect_hit(store, 2, none, 0, NULL);
	kiln_cache_verify_result_t r;
	cr_assert_eq(kiln_cache_verify(store, &r, NULL, 0), 0);
	cr_assert_eq(r.blobs_checked, 1);
	cr_assert_eq(r.blobs_bad, 0);
}

Test(basic, close_and_release_null)
{
	kiln_cache_close(NULL);
	kiln_cache_blob_release(NULL);
}

Test(basic, open_regular_file_fails_clearly)
{
	char p[PATH_MAX];
	path_fmt(p, "%s/afile", dir);
	file_write(p, "x", 1);
	kiln_cache_t *c = NULL;
	char err[512] = "";
	int rc = kiln_cache_open(p, NULL, &c, err, sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert_null(c);
	cr_assert_neq(err[0], '\0', "no error text");
	cr_assert_not_null(strstr(err, p), "error text does not name %s: %s", p,
			   err);
	cr_assert_str_neq(kiln_strerror(rc), "");
	/* The file is left alone. */
	cr_assert_eq(file_size(p), 1);

	/* Also with a NULL error buffer. */
	rc = kiln_cache_open(p, NULL, &c, NULL, 0);
	cr_assert_lt(rc, 0);
	cr_assert_null(c);
}

/* ---- one owner ----------------------------------------------------------- */

Test(basic, second_opener_gets_ebusy)
{
	store = store_open(dir, NULL);
	put_gen(store, 1, 1000, NULL);
	pid_t owner = getpid();

	char p[PATH_MAX];
	path_fmt(p, "%s/lock", dir);
	size_t n;
	uint8_t *lock = file_read(p, &n);
	char text[64] = "";
	memcpy(text, lock, n < sizeof(text) - 1 ? n : sizeof(text) - 1);
	free(lock);
	cr_assert_eq(strtol(text, NULL, 10), owner, "lock holds \"%s\"", text);

	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		kiln_cache_t *c = NULL;
		char err[512] = "";
		int rc = kiln_cache_open(dir, NULL, &c, err, sizeof(err));
		char msg[600];
		int len =
		    snprintf(msg, sizeof(msg), "%d %d %s", rc, c != NULL, err);
		if (write(fds[1], msg, (size_t)len) != len)
			_exit(2);
		_exit(0);
	}
	close(fds[1]);
	char msg[600] = "";
	size_t got = 0;
	ssize_t r;
	while ((r = read(fds[0], msg + got, sizeof(msg) - 1 - got)) > 0)
		got += (size_t)r;
	close(fds[0]);
	cr_assert_eq(wait_child(pid), 0);
	int rc = 0, has = 0, off = 0;
	cr_assert_eq(sscanf(msg, "%d %d %n", &rc, &has, &off), 2, "%s", msg);
	cr_assert_eq(rc, -EBUSY, "second opener: %d (%s): %s", rc,
		     kiln_strerror(rc), msg + off);
	cr_assert_eq(has, 0, "second opener got a store");
	char want[64];
	snprintf(want, sizeof(want), "in use by pid %d", (int)owner);
	cr_assert_not_null(strstr(msg + off, want), "\"%s\" lacks \"%s\"",
			   msg + off, want);

	/* The owner is unaffected, and the lock goes with close(). */
	expect_gen(store, 1, 1000);
	close_store();
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		kiln_cache_t *c = NULL;
		int rc2 = kiln_cache_open(dir, NULL, &c, NULL, 0);
		if (rc2 != 0)
			_exit(1);
		kiln_cache_close(c);
		_exit(0);
	}
	cr_assert_eq(wait_child(pid), 0, "open after the owner closed");
}

/* ---- threads ------------------------------------------------------------- */

#define TH_THREADS 4
#define TH_KEYS	   48 /* key k holds content k % (TH_KEYS / 2) */
#define TH_SECONDS 1.5

static uint8_t *th_content[TH_KEYS / 2];
static size_t th_size[TH_KEYS / 2];

struct th_state {
	kiln_cache_t *c;
	uint64_t seed;
	uint64_t ops, hits, misses, puts, evicts, gcs, lists;
	char fail[512];
};

static pthread_mutex_t th_fail_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int th_failed;

__attribute__((format(printf, 2, 3))) static void th_fail(struct th_state *t,
							  const char *fmt, ...)
{
	pthread_mutex_lock(&th_fail_lock);
	if (t->fail[0] == '\0') {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(t->fail, sizeof(t->fail), fmt, ap);
		va_end(ap);
	}
	atomic_store(&th_failed, 1);
	pthread_mutex_unlock(&th_fail_lock);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *th_main(void *arg)
{
	struct th_state *t = arg;
	double end = now_s() + TH_SECONDS;
	uint64_t s = t->seed;
	char err[512];
	while (now_s() < end && !atomic_load(&th_failed)) {
		uint64_t r = splitmix64(&s);
		unsigned op = (unsigned)(r % 100);
		uint64_t k = (r >> 8) % TH_KEYS;
		size_t ci = (size_t)(k % (TH_KEYS / 2));
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(k, key);
		err[0] = '\0';
		t->ops++;
		int rc;
		if (op < 50) {
			kiln_cache_blob_t h;
			rc = kiln_cache_get(t->c, key, &h, err, sizeof(err));
			if (rc == KILN_ENOTFOUND) {
				t->misses++;
				continue;
			}
			if (rc != 0) {
				th_fail(t, "get %llu: %s: %s",
					(unsigned long long)k,
					kiln_strerror(rc), err);
				break;
			}
			t->hits++;
			if (h.size != th_size[ci] ||
			    h.entry.size != th_size[ci] ||
			    (h.size > 0 &&
			     memcmp(h.data, th_content[ci], h.size) != 0) ||
			    memcmp(h.entry.key, key, sizeof(key)) != 0)
				th_fail(t,
					"get %llu: wrong bytes (%zu bytes, "
					"expected %zu)",
					(unsigned long long)k, h.size,
					th_size[ci]);
			kiln_cache_blob_release(&h);
		} else if (op < 85) {
			kiln_cache_meta_t m = {.target = "cpu",
					       .compile_ms = (uint32_t)k};
			rc = kiln_cache_put(t->c, key, th_content[ci],
					    th_size[ci], &m, err, sizeof(err));
			if (rc != 0) {
				th_fail(t, "put %llu: %s: %s",
					(unsigned long long)k,
					kiln_strerror(rc), err);
				break;
			}
			t->puts++;
		} else if (op < 92) {
			rc = kiln_cache_evict(t->c, key, err, sizeof(err));
			if (rc != 0 && rc != KILN_ENOTFOUND) {
				th_fail(t, "evict %llu: %s: %s",
					(unsigned long long)k,
					kiln_strerror(rc), err);
				break;
			}
			t->evicts++;
		} else if (op < 96) {
			rc = kiln_cache_touch(t->c, key, err, sizeof(err));
			if (rc != 0 && rc != KILN_ENOTFOUND) {
				th_fail(t, "touch %llu: %s: %s",
					(unsigned long long)k,
					kiln_strerror(rc), err);
				break;
			}
		} else if (op < 98) {
			uint64_t ev;
			rc = kiln_cache_gc(t->c, 128 * KIB, &ev, err,
					   sizeof(err));
			if (rc != 0) {
				th_fail(t, "gc: %d (%s): %s", rc,
					kiln_strerror(rc), err);
				break;
			}
			t->gcs++;
		} else {
			kiln_cache_entry_t *e = NULL;
			size_t n = 0;
			rc = kiln_cache_list(t->c, NULL, KILN_CACHE_ORDER_LRU,
					     0, &e, &n, err, sizeof(err));
			if (rc != 0) {
				th_fail(t, "list: %s: %s", kiln_strerror(rc),
					err);
				break;
			}
			for (size_t i = 0; i < n; i++) {
				uint64_t kk = key_num(e[i].key);
				size_t cj = (size_t)(kk % (TH_KEYS / 2));
				if (kk >= TH_KEYS || e[i].size != th_size[cj])
					th_fail(t, "list: bad entry %llu",
						(unsigned long long)kk);
			}
			free(e);
			t->lists++;
		}
	}
	return NULL;
}

Test(basic, threads_get_put_gc_on_overlapping_keys)
{
	kiln_cache_options_t o;
	opts_fast(&o);
	o.max_bytes = 256 * KIB; /* puts trigger gc now and then */
	o.touch_batch = 16;
	store = store_open(dir, &o);
	for (size_t i = 0; i < TH_KEYS / 2; i++) {
		th_size[i] = i == 0 ? 0 : 512 + (i * 7919) % (24 * KIB);
		th_content[i] = gen_bytes(1000 + i, th_size[i]);
	}

	pthread_t th[TH_THREADS];
	struct th_state st[TH_THREADS];
	for (int i = 0; i < TH_THREADS; i++) {
		memset(&st[i], 0, sizeof(st[i]));
		st[i].c = store;
		st[i].seed = 0x1234 + (uint64_t)i;
		cr_assert_eq(pthread_create(&th[i], NULL, th_main, &st[i]), 0);
	}
	uint64_t hits = 0, puts = 0, misses = 0, ops = 0;
	for (int i = 0; i < TH_THREADS; i++) {
		cr_assert_eq(pthread_join(th[i], NULL), 0);
		hits += st[i].hits;
		puts += st[i].puts;
		misses += st[i].misses;
		ops += st[i].ops;
	}
	for (int i = 0; i < TH_THREADS; i++)
		cr_assert_eq(st[i].fail[0], '\0', "thread %d: %s", i,
			     st[i].fail);
	fprintf(stderr,
		"threads: %llu ops, %llu hits, %llu misses, %llu puts\n",
		(unsigned long long)ops, (unsigned long long)hits,
		(unsigned long long)misses, (unsigned long long)puts);
	cr_assert_gt(hits, 0);
	cr_assert_gt(puts, 0);

	/* The store is consistent afterwards. */
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.hits, hits);
	cr_assert_eq(s.puts, puts);
	cr_assert_geq(s.misses, misses);
	cr_assert_gt(s.evictions, 0);
	size_t n;
	kiln_cache_entry_t *e = list_ok(NULL, KILN_CACHE_ORDER_LRU, 0, &n);
	cr_assert_eq(n, s.entries);
	free(e);
	kiln_cache_verify_result_t r;
	char err[256] = "";
	cr_assert_eq(kiln_cache_verify(store, &r, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(r.blobs_bad, 0);
	cr_assert_eq(r.blobs_checked, s.blobs);
	objects_census_t oc = objects_census(dir);
	cr_assert_eq(oc.temps, 0);
	cr_assert_eq(oc.blobs, s.blobs);
	cr_assert_eq(oc.bytes, s.bytes);
	for (uint64_t k = 0; k < TH_KEYS; k++) {
		kiln_cache_blob_t h;
		if (get_n(store, k, &h) != 0)
			continue;
		size_t ci = (size_t)(k % (TH_KEYS / 2));
		cr_assert_eq(h.size, th_size[ci]);
		cr_assert(h.size == 0 ||
			  memcmp(h.data, th_content[ci], h.size) == 0);
		kiln_cache_blob_release(&h);
	}
	close_store();
	expect_quick_check(dir);
	for (size_t i = 0; i < TH_KEYS / 2; i++)
		free(th_content[i]);
}
