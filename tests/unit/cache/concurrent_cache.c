/*
 * concurrent_cache.c — threads hammering one store: get, put, touch, evict,
 * gc and verify on overlapping keys, with shared blobs (two keys per
 * content). Every hit must return exactly the bytes put under that key, and
 * the store must be consistent afterwards. A plain program (not Criterion)
 * so that it also runs under ThreadSanitizer (build-tsan/, see ./dev test).
 *
 * Usage: concurrent_cache [SECONDS]   (default 2)
 */
#include "cache/cache.h"
#include "protocol/protocol.h"

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define KEYS	64 /* key k holds content k % (KEYS / 2) */

static kiln_cache_t *store;
static uint8_t *content[KEYS / 2];
static size_t content_size[KEYS / 2];
static atomic_int failed;
static double deadline;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void key_of(uint64_t k, uint8_t key[KILN_CACHE_KEY_BYTES])
{
	memset(key, 0, KILN_CACHE_KEY_BYTES);
	memcpy(key, &k, sizeof(k));
	key[31] = 0x5a;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void fail(const char *what, uint64_t k, int rc, const char *err)
{
	fprintf(stderr, "FAIL %s key=%llu rc=%d (%s) %s\n", what,
		(unsigned long long)k, rc, kiln_strerror(rc), err);
	atomic_store(&failed, 1);
}

static void *worker(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
	char err[512];
	uint8_t key[KILN_CACHE_KEY_BYTES];
	while (now() < deadline && !atomic_load(&failed)) {
		uint64_t k = rnd(&seed) % KEYS, op = rnd(&seed) % 100;
		size_t ci = (size_t)(k % (KEYS / 2));
		key_of(k, key);
		err[0] = '\0';
		if (op < 55) {
			kiln_cache_blob_t b;
			int rc =
			    kiln_cache_get(store, key, &b, err, sizeof(err));
			if (rc == 0) {
				if (b.size != content_size[ci] ||
				    (b.size > 0 &&
				     memcmp(b.data, content[ci], b.size) != 0))
					fail("wrong bytes", k, 0, "");
				kiln_cache_blob_release(&b);
			} else if (rc != KILN_ENOTFOUND) {
				fail("get", k, rc, err);
			}
		} else if (op < 85) {
			kiln_cache_meta_t m = {"x86_64", "kiln/test", 1,
					       KILN_CACHE_SOURCE_COMPILED};
			int rc = kiln_cache_put(store, key, content[ci],
						content_size[ci], &m, err,
						sizeof(err));
			if (rc != 0)
				fail("put", k, rc, err);
		} else if (op < 90) {
			int rc = kiln_cache_touch(store, key, err, sizeof(err));
			if (rc != 0 && rc != KILN_ENOTFOUND)
				fail("touch", k, rc, err);
		} else if (op < 96) {
			int rc = kiln_cache_evict(store, key, err, sizeof(err));
			if (rc != 0 && rc != KILN_ENOTFOUND)
				fail("evict", k, rc, err);
		} else if (op < 99) {
			int rc = kiln_cache_gc(store, 64 * 1024, NULL, err,
					       sizeof(err));
			if (rc != 0)
				fail("gc", k, rc, err);
		} else {
			kiln_cache_verify_result_t v;
			int rc = kiln_cache_verify(store, &v, err, sizeof(err));
			if (rc != 0 || v.blobs_bad != 0)
				fail("verify", k, rc, err);
		}
	}
	return NULL;
}

static int rm_one(const char *p, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 2.0;
	char dir[] = "/tmp/kiln-concurrent-XXXXXX";
	if (mkdtemp(dir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	for (size_t i = 0; i < KEYS / 2; i++) {
		content_size[i] = i == 0 ? 0 : 100 + (i * 7919) % 20000;
		content[i] = malloc(content_size[i] + 1);
		for (size_t j = 0; j < content_size[i]; j++)
			content[i][j] = (uint8_t)(i * 131 + j * 7);
	}
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.no_fsync = 1;
	o.max_bytes = 200 * 1024; /* puts run gc now and then */
	o.min_free_bytes = 1;
	o.touch_batch = 8;
	char err[512];
	int rc = kiln_cache_open(dir, &o, &store, err, sizeof(err));
	if (rc != 0) {
		fprintf(stderr, "open: %s\n", err);
		return 1;
	}
	deadline = now() + seconds;
	pthread_t th[THREADS];
	for (uintptr_t i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(i + 1));
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	kiln_cache_stats_t s;
	kiln_cache_stats(store, &s, err, sizeof(err));
	kiln_cache_verify_result_t v;
	rc = kiln_cache_verify(store, &v, err, sizeof(err));
	if (rc != 0 || v.blobs_bad != 0 || v.blobs_checked != s.blobs)
		fail("final verify", 0, rc, err);
	printf("hits=%llu misses=%llu puts=%llu evictions=%llu gc_runs=%llu "
	       "entries=%llu blobs=%llu\n",
	       (unsigned long long)s.hits, (unsigned long long)s.misses,
	       (unsigned long long)s.puts, (unsigned long long)s.evictions,
	       (unsigned long long)s.gc_runs, (unsigned long long)s.entries,
	       (unsigned long long)s.blobs);
	kiln_cache_close(store);
	/* Reopen: a clean close leaves nothing to recover. */
	rc = kiln_cache_open(dir, &o, &store, err, sizeof(err));
	if (rc != 0) {
		fail("reopen", 0, rc, err);
	} else {
		kiln_cache_stats(store, &s, err, sizeof(err));
		if (s.orphan_blobs || s.temp_removed || s.rebuilds)
			fail("reopen found debris", 0, 0, "");
		kiln_cache_close(store);
	}
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	for (size_t i = 0; i < KEYS / 2; i++)
		free(content[i]);
	if (atomic_load(&failed)) {
		fprintf(stderr, "concurrent_cache: FAILED\n");
		return 1;
	}
	printf("concurrent_cache: ok\n");
	return 0;
}
