/*
 * test_regress.c — regression tests for the bugs a review of cache/ found
 * (its demonstration programs, made deterministic). Each test names the
 * scenario; all of them assert behaviour (what reads back, what is left on
 * disk), never timing.
 *
 * Crash points: a forked child opens the store with stderr replaced by a
 * fopencookie(3) stream that SIGKILLs the process inside the write of a
 * chosen log line ("index schema", "corrupt blob removed", "index
 * rebuilt"), so the crash lands at the same point of open() every time.
 *
 * Races: this file interposes pthread_mutex_unlock, fsync and fdatasync
 * (the executable's definitions win; the real ones come from
 * dlsym(RTLD_NEXT)). A worker thread armed with a pause point stops right
 * after its n-th unlock of a given store mutex (write_mu or pin_mu, hence
 * cache/internal.h), or inside the fsync of a directory, until the test
 * thread has run the racing call to completion. That forces exactly the
 * interleavings the review's demos widened with sleeps: evict || put of the
 * same bytes, replacing put || put of the old bytes, evict between a put's
 * commit and its unpin, a failed directory fsync || put of the same bytes,
 * evict while a get holds its pin. A multi-threaded loop with a fixed
 * number of operations checks the same invariants statistically.
 *
 * Power cut: the child records the size of index.db-wal at each successful
 * fsync/fdatasync of it; after its SIGKILL the test cuts the WAL back to
 * the last synced size (everything written after it is what a power cut
 * may lose) and removes the -shm file.
 *
 * Full disk: two tests (the min_free_bytes watermark, an unclean open on
 * a full disk) mount a small tmpfs (root and mount(2) needed, in a private
 * mount namespace when unshare(2) allows) and skip, saying why, when they
 * cannot.
 */
#include "helpers.h"

#include "cache/internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

/* ---- interposed libc calls ----------------------------------------------- */

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
	       "dlsym results are converted to function pointers");

typedef int (*unlock_fn)(pthread_mutex_t *);
typedef int (*sync_fn)(int);

static _Atomic(unlock_fn) real_unlock;
static _Atomic(sync_fn) real_fsync, real_fdatasync;

static void *next_sym(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);
	if (p == NULL) {
		fprintf(stderr, "dlsym(RTLD_NEXT, %s): %s\n", name, dlerror());
		abort();
	}
	return p;
}

static unlock_fn get_unlock(void)
{
	unlock_fn f = atomic_load_explicit(&real_unlock, memory_order_relaxed);
	if (f == NULL) {
		void *p = next_sym("pthread_mutex_unlock");
		memcpy(&f, &p, sizeof(f));
		atomic_store_explicit(&real_unlock, f, memory_order_relaxed);
	}
	return f;
}

static sync_fn get_sync(_Atomic(sync_fn) *slot, const char *name)
{
	sync_fn f = atomic_load_explicit(slot, memory_order_relaxed);
	if (f == NULL) {
		void *p = next_sym(name);
		memcpy(&f, &p, sizeof(f));
		atomic_store_explicit(slot, f, memory_order_relaxed);
	}
	return f;
}

/* The pause point of the armed thread (see the file comment). */
static _Atomic(pthread_mutex_t *) pause_mu;
static _Thread_local int pause_after;	   /* unlocks of pause_mu left */
static _Thread_local bool pause_dir_fsync; /* next dir fsync: pause, EIO */
static _Thread_local bool paused;	   /* this thread did pause */
static sem_t pause_reached, pause_go;

static void pause_here(void)
{
	int e = errno;
	paused = true;
	sem_post(&pause_reached);
	while (sem_wait(&pause_go) < 0 && errno == EINTR)
		;
	errno = e;
}

int pthread_mutex_unlock(pthread_mutex_t *m)
{
	int r = get_unlock()(m);
	if (pause_after > 0 &&
	    m == atomic_load_explicit(&pause_mu, memory_order_relaxed) &&
	    --pause_after == 0)
		pause_here();
	return r;
}

/* Child side of the power-cut test: the WAL's path and its size at the
 * last successful sync (-1: never synced). */
static char wal_track[PATH_MAX + 32];
static long long wal_synced = -1;

static void note_sync(int fd)
{
	if (wal_track[0] == '\0')
		return;
	char link[64], path[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return;
	path[n] = '\0';
	struct stat st;
	if (strcmp(path, wal_track) == 0 && fstat(fd, &st) == 0)
		wal_synced = (long long)st.st_size;
}

int fsync(int fd)
{
	struct stat st;
	if (pause_dir_fsync && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		pause_dir_fsync = false;
		pause_here();
		errno = EIO;
		return -1;
	}
	int r = get_sync(&real_fsync, "fsync")(fd);
	if (r == 0)
		note_sync(fd);
	return r;
}

int fdatasync(int fd)
{
	int r = get_sync(&real_fdatasync, "fdatasync")(fd);
	if (r == 0)
		note_sync(fd);
	return r;
}

/* ---- the suite ----------------------------------------------------------- */

static char *dir;
static kiln_cache_t *store;
static char *mnt; /* a tmpfs mount point, when a test mounted one */

static void setup(void)
{
	dir = tmpdir_new();
	cr_assert_eq(sem_init(&pause_reached, 0, 0), 0);
	cr_assert_eq(sem_init(&pause_go, 0, 0), 0);
}

static void teardown(void)
{
	kiln_cache_close(store);
	store = NULL;
	if (mnt != NULL) {
		if (umount2(mnt, 0) != 0)
			umount2(mnt, MNT_DETACH);
		rm_rf(mnt);
		free(mnt);
		mnt = NULL;
	}
	rm_rf(dir);
	free(dir);
	dir = NULL;
}

TestSuite(regress, .init = setup, .fini = teardown);

static void expect_census(const char *d, size_t blobs)
{
	objects_census_t oc = objects_census(d);
	cr_assert_eq(oc.temps, 0, "%zu temp files left", oc.temps);
	cr_assert_eq(oc.other, 0, "%zu unexpected files", oc.other);
	cr_assert_eq(oc.blobs, blobs, "%zu blob files on disk, expected %zu",
		     oc.blobs, blobs);
}

static void close_store(void)
{
	kiln_cache_close(store);
	store = NULL;
}

/* ---- (a) a crash while open() rebuilds a lost index ---------------------- */

#define RB_KEYS 40

/* Keys 9, 19, 29, 39 hold the bytes of 8, 18, 28, 38 (one blob, refs 2);
 * key 5 is put twice, first with other bytes. */
static uint64_t rb_seed(uint64_t n)
{
	return n % 10 == 9 ? n - 1 : n;
}

static size_t rb_size(uint64_t n)
{
	return 512 + (size_t)(rb_seed(n) * 7919 % (24 * KIB));
}

#define RB_BLOBS (RB_KEYS - RB_KEYS / 10)

static void rb_populate(void)
{
	store = store_open(dir, NULL);
	put_gen(store, 5, 3 * KIB + 1, NULL); /* replaced below */
	for (uint64_t n = 0; n < RB_KEYS; n++) {
		kiln_cache_meta_t m = {.target = n % 2 ? "cuda-sm_90" : "x86",
				       .fingerprint = "fp",
				       .compile_ms = (uint32_t)n,
				       .source = KILN_CACHE_SOURCE_COMPILED};
		uint8_t *b = gen_bytes(rb_seed(n), rb_size(n));
		put_ok(store, n, b, rb_size(n), &m);
		free(b);
	}
	close_store();
}

static void rb_expect_all(void)
{
	for (uint64_t n = 0; n < RB_KEYS; n++) {
		uint8_t *b = gen_bytes(rb_seed(n), rb_size(n));
		expect_hit(store, n, b, rb_size(n), NULL);
		free(b);
	}
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, RB_KEYS, "entries %llu",
		     (unsigned long long)s.entries);
	cr_assert_eq(s.blobs, RB_BLOBS, "blobs %llu",
		     (unsigned long long)s.blobs);
	expect_census(dir, RB_BLOBS);
}

static void rm_index(void)
{
	static const char *const sfx[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		char p[PATH_MAX];
		path_fmt(p, "%s/index.db%s", dir, sfx[i]);
		cr_assert(unlink(p) == 0 || errno == ENOENT, "unlink %s", p);
	}
}

/* The child's log sink: SIGKILLs the process inside the write of the
 * first line that contains crash_at. */
static const char *crash_at;
static char crash_line[4096];
static size_t crash_len;

static ssize_t crash_write(void *cookie, const char *buf, size_t n)
{
	(void)cookie;
	for (size_t i = 0; i < n; i++) {
		if (crash_len < sizeof(crash_line) - 1)
			crash_line[crash_len++] = buf[i];
		if (buf[i] != '\n')
			continue;
		crash_line[crash_len] = '\0';
		crash_len = 0;
		if (strstr(crash_line, crash_at) != NULL)
			kill(getpid(), SIGKILL);
	}
	return (ssize_t)n;
}

/* A child opens dir and is killed when open() logs a line containing
 * what; asserts that it died there. */
static void crash_open_at(const char *what)
{
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		cookie_io_functions_t io = {.write = crash_write};
		FILE *f = fopencookie(NULL, "w", io);
		if (f == NULL)
			_exit(2);
		setvbuf(f, NULL, _IONBF, 0);
		stderr = f;
		crash_at = what;
		kiln_log_level = KILN_LOG_INFO;
		kiln_cache_options_t o;
		opts_fast(&o);
		kiln_cache_t *c = NULL;
		int rc = kiln_cache_open(dir, &o, &c, NULL, 0);
		_exit(rc == 0 ? 0 : 3);
	}
	int st = wait_child(pid);
	cr_assert_eq(st, 128 + SIGKILL,
		     "the child was to be killed at \"%s\"; status %d", what,
		     st);
}

Test(regress, crash_after_schema_commit_of_rebuild)
{
	rb_populate();
	rm_index();
	/* The empty schema has just committed; nothing is rebuilt yet. */
	crash_open_at("msg=\"index schema\"");
	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 1, "the next open must rebuild");
	cr_assert_eq(s.orphan_blobs, 0, "%llu blobs removed as orphans",
		     (unsigned long long)s.orphan_blobs);
	rb_expect_all();
	close_store();
	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 0);
	rb_expect_all();
	close_store();
	expect_quick_check(dir);
}

Test(regress, crash_during_blob_scan_of_rebuild)
{
	rb_populate();
	rm_index();
	/* A blob file whose bytes do not match its name: the rebuild's scan
	 * removes it and logs, and the child dies right there. */
	uint8_t *x = gen_bytes(777, 1000), *y = gen_bytes(778, 1000);
	char p[PATH_MAX];
	blob_path(dir, x, 1000, p);
	uint8_t h[32];
	sha256(x, 1000, h);
	char hex[65];
	hex_of(h, 1, hex);
	objects_subdir(dir, hex);
	file_write(p, y, 1000);
	free(x);
	free(y);
	crash_open_at("msg=\"corrupt blob removed\"");
	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 1);
	cr_assert_eq(stats_of(store).orphan_blobs, 0);
	rb_expect_all();
	close_store();
	expect_quick_check(dir);
}

Test(regress, crash_after_rebuild_commit_before_journal_rewrite)
{
	rb_populate();
	rm_index();
	crash_open_at("msg=\"index rebuilt\"");
	store = store_open(dir, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.rebuilds, 0, "the rebuild had committed");
	cr_assert_eq(s.orphan_blobs, 0);
	rb_expect_all();
	close_store();
	/* The journal this open rewrote still rebuilds everything. */
	rm_index();
	store = store_open(dir, NULL);
	cr_assert_eq(stats_of(store).rebuilds, 1);
	rb_expect_all();
	close_store();
	expect_quick_check(dir);
}

Test(regress, two_crashed_rebuilds_then_open)
{
	rb_populate();
	rm_index();
	crash_open_at("msg=\"index schema\"");
	/* The second attempt finds the schema in place and dies when it
	 * reports its rebuild. */
	crash_open_at("msg=\"index rebuilt\"");
	store = store_open(dir, NULL);
	rb_expect_all();
	close_store();
	expect_quick_check(dir);
}

/* ---- (b) races between evict, put and get ------------------------------- */

enum job_op { JOB_PUT, JOB_EVICT, JOB_GET };

typedef struct job {
	enum job_op op;
	uint64_t key;
	const uint8_t *bytes;
	size_t size;
	pthread_mutex_t *mu; /* pause after the nth unlock of mu ... */
	int nth;
	bool dir_fsync; /* ... or in the first directory fsync */
	int rc;
	bool paused;
	kiln_cache_blob_t got;
	char err[512];
	pthread_t th;
} job_t;

static void *job_main(void *arg)
{
	job_t *j = arg;
	pause_after = j->mu != NULL ? j->nth : 0;
	pause_dir_fsync = j->dir_fsync;
	paused = false;
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(j->key, key);
	switch (j->op) {
	case JOB_PUT:
		j->rc = kiln_cache_put(store, key, j->bytes, j->size, NULL,
				       j->err, sizeof(j->err));
		break;
	case JOB_EVICT:
		j->rc = kiln_cache_evict(store, key, j->err, sizeof(j->err));
		break;
	case JOB_GET:
		j->rc =
		    kiln_cache_get(store, key, &j->got, j->err, sizeof(j->err));
		break;
	}
	pause_after = 0;
	pause_dir_fsync = false;
	j->paused = paused;
	if (!paused)
		sem_post(&pause_reached); /* never paused: do not hang */
	return NULL;
}

/* Starts the job and waits until it stands at its pause point. */
static void job_start(job_t *j)
{
	atomic_store(&pause_mu, j->mu);
	cr_assert_eq(pthread_create(&j->th, NULL, job_main, j), 0);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 120; /* a hang guard, not a timing assumption */
	int rc;
	while ((rc = sem_timedwait(&pause_reached, &ts)) < 0 && errno == EINTR)
		;
	cr_assert_eq(rc, 0, "the job never reached its pause point");
}

/* Lets the job go on and waits for it. */
static void job_finish(job_t *j)
{
	sem_post(&pause_go);
	cr_assert_eq(pthread_join(j->th, NULL), 0);
	atomic_store(&pause_mu, NULL);
	cr_assert(j->paused, "the job finished without pausing (rc %d: %s)",
		  j->rc, j->err);
}

static kiln_cache_options_t race_opts(void)
{
	kiln_cache_options_t o;
	opts_fast(&o);
	o.max_bytes = (uint64_t)1 << 40;
	return o;
}

#define RACE_SIZE (8 * KIB)

/* evict(K1) has committed and released the write lock; before it returns,
 * put(K2) of the same bytes runs to completion. The acknowledged K2 must
 * stay readable after the evict returns. */
Test(regress, evict_vs_put_of_same_bytes)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE);
	put_ok(store, 1, b1, RACE_SIZE, NULL);

	job_t j = {.op = JOB_EVICT, .key = 1, .mu = &store->write_mu, .nth = 1};
	job_start(&j);
	put_ok(store, 2, b1, RACE_SIZE, NULL);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "evict: %s", j.err);

	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	expect_miss(store, 1);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.entries, 1);
	cr_assert_eq(s.blobs, 1);
	close_store();
	store = store_open(dir, &o);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	expect_census(dir, 1);
	free(b1);
}

/* The other order: put(K2) of K1's bytes has committed (the blob is
 * shared) and released the write lock but not its pin; evict(K1), which
 * drops the other reference, runs to completion. */
Test(regress, put_of_same_bytes_vs_evict_before_unpin)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE);
	put_ok(store, 1, b1, RACE_SIZE, NULL);

	job_t j = {.op = JOB_PUT,
		   .key = 2,
		   .bytes = b1,
		   .size = RACE_SIZE,
		   .mu = &store->write_mu,
		   .nth = 1};
	job_start(&j);
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(1, key);
	char err[512];
	cr_assert_eq(kiln_cache_evict(store, key, err, sizeof(err)), 0, "%s",
		     err);
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "put: %s", j.err);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	cr_assert_eq(stats_of(store).corrupt_dropped, 0);
	close_store();
	store = store_open(dir, &o);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	expect_census(dir, 1);
	free(b1);
}

/* put(K1, B2) replaces K1's B1, drops B1's last reference and releases
 * the write lock; before it returns, put(K3, B1) runs to completion. */
Test(regress, replacing_put_vs_put_of_old_bytes)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE), *b2 = gen_bytes(2, RACE_SIZE);
	put_ok(store, 1, b1, RACE_SIZE, NULL);

	job_t j = {.op = JOB_PUT,
		   .key = 1,
		   .bytes = b2,
		   .size = RACE_SIZE,
		   .mu = &store->write_mu,
		   .nth = 1};
	job_start(&j);
	put_ok(store, 3, b1, RACE_SIZE, NULL);
	expect_hit(store, 3, b1, RACE_SIZE, NULL);
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "put: %s", j.err);

	expect_hit(store, 3, b1, RACE_SIZE, NULL);
	expect_hit(store, 1, b2, RACE_SIZE, NULL);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.entries, 2);
	cr_assert_eq(s.blobs, 2);
	close_store();
	store = store_open(dir, &o);
	expect_hit(store, 3, b1, RACE_SIZE, NULL);
	expect_hit(store, 1, b2, RACE_SIZE, NULL);
	expect_census(dir, 2);
	free(b1);
	free(b2);
}

/* put(K1, B1) has committed and released the write lock but not yet its
 * pin; evict(K1) runs to completion. Once the put returns, B1's file must
 * be gone (no blob without a row survives a clean close and reopen). */
Test(regress, evict_between_put_commit_and_unpin)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE);

	job_t j = {.op = JOB_PUT,
		   .key = 1,
		   .bytes = b1,
		   .size = RACE_SIZE,
		   .mu = &store->write_mu,
		   .nth = 1};
	job_start(&j);
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(1, key);
	char err[512];
	cr_assert_eq(kiln_cache_evict(store, key, err, sizeof(err)), 0, "%s",
		     err);
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "put: %s", j.err);
	expect_miss(store, 1);
	expect_census(dir, 0);
	close_store();
	store = store_open(dir, &o);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, 0);
	cr_assert_eq(s.blobs, 0);
	expect_census(dir, 0);
	free(b1);
}

/* A get of K1 holds its pin (before reading); evict(K1) runs, then
 * put(K2) of the same bytes. The get still returns the bytes, K2 stays
 * readable, and nothing is left over. */
Test(regress, evict_and_reput_while_a_get_holds_the_pin)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE);
	put_ok(store, 1, b1, RACE_SIZE, NULL);

	job_t j = {.op = JOB_GET, .key = 1, .mu = &store->pin_mu, .nth = 1};
	job_start(&j);
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(1, key);
	char err[512];
	cr_assert_eq(kiln_cache_evict(store, key, err, sizeof(err)), 0, "%s",
		     err);
	put_ok(store, 2, b1, RACE_SIZE, NULL);
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "get: %s", j.err);
	cr_assert_eq(j.got.size, RACE_SIZE);
	cr_assert(memcmp(j.got.data, b1, RACE_SIZE) == 0);
	kiln_cache_blob_release(&j.got);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	cr_assert_eq(stats_of(store).corrupt_dropped, 0);
	close_store();
	store = store_open(dir, &o);
	expect_hit(store, 2, b1, RACE_SIZE, NULL);
	expect_census(dir, 1);
	free(b1);
}

/* The same without the re-put: the evicted blob goes when the read ends. */
Test(regress, evict_while_a_get_holds_the_pin)
{
	kiln_cache_options_t o = race_opts();
	store = store_open(dir, &o);
	uint8_t *b1 = gen_bytes(1, RACE_SIZE);
	put_ok(store, 1, b1, RACE_SIZE, NULL);

	job_t j = {.op = JOB_GET, .key = 1, .mu = &store->pin_mu, .nth = 1};
	job_start(&j);
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(1, key);
	char err[512];
	cr_assert_eq(kiln_cache_evict(store, key, err, sizeof(err)), 0, "%s",
		     err);
	expect_census(dir, 1); /* kept for the reader */
	job_finish(&j);
	cr_assert_eq(j.rc, 0, "get: %s", j.err);
	cr_assert(memcmp(j.got.data, b1, RACE_SIZE) == 0);
	kiln_cache_blob_release(&j.got);
	expect_census(dir, 0);
	close_store();
	store = store_open(dir, &o);
	expect_census(dir, 0);
	free(b1);
}

/* put(K2) renames its blob, then the directory fsync fails (EIO); before
 * it cleans up, put(K1) of the same bytes runs to completion. K2 fails;
 * the acknowledged K1 must stay readable. */
Test(regress, failed_dir_fsync_vs_put_of_same_bytes)
{
	kiln_cache_options_t o = race_opts();
	o.no_fsync = 0;
	store = store_open(dir, &o);
	uint8_t *b = gen_bytes(5, 6000);
	uint8_t h[32];
	sha256(b, 6000, h);
	char sub[3];
	hex_of(h, 1, sub);
	objects_subdir(dir, sub); /* so the only dir fsync is the blob's */

	job_t j = {.op = JOB_PUT,
		   .key = 2,
		   .bytes = b,
		   .size = 6000,
		   .dir_fsync = true};
	job_start(&j);
	put_ok(store, 1, b, 6000, NULL);
	job_finish(&j);
	cr_assert_eq(j.rc, -EIO, "put with a failing dir fsync: %d (%s): %s",
		     j.rc, kiln_strerror(j.rc), j.err);
	expect_hit(store, 1, b, 6000, NULL);
	expect_miss(store, 2);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.entries, 1);
	close_store();
	store = store_open(dir, &o);
	expect_hit(store, 1, b, 6000, NULL);
	expect_census(dir, 1);
	free(b);
}

/* The failing put alone: no row, so its blob goes again. */
Test(regress, failed_dir_fsync_leaves_nothing)
{
	kiln_cache_options_t o = race_opts();
	o.no_fsync = 0;
	store = store_open(dir, &o);
	uint8_t *b = gen_bytes(5, 6000);
	uint8_t h[32];
	sha256(b, 6000, h);
	char sub[3];
	hex_of(h, 1, sub);
	objects_subdir(dir, sub);
	job_t j = {.op = JOB_PUT,
		   .key = 2,
		   .bytes = b,
		   .size = 6000,
		   .dir_fsync = true};
	job_start(&j);
	job_finish(&j);
	cr_assert_eq(j.rc, -EIO, "%d: %s", j.rc, j.err);
	expect_miss(store, 2);
	expect_census(dir, 0);
	close_store();
	store = store_open(dir, &o);
	expect_census(dir, 0);
	free(b);
}

/* Threads on 40 keys whose contents repeat every 13 keys (many shared
 * blobs), a small max_bytes (gc on most puts), evicts and gc passes: with
 * no damage injected, no get may see a bad blob (corrupt_dropped stays 0)
 * or wrong bytes, and after a clean close and reopen every blob file has
 * a row. A fixed number of operations per thread. */
#define ST_THREADS 8
#define ST_OPS	   3000
#define ST_KEYS	   40

static uint8_t *st_content[13];
static atomic_int st_bad;
static char st_why[512];
static pthread_mutex_t st_why_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t st_size(uint64_t k)
{
	return 1000 + (size_t)(k % 13) * 100;
}

__attribute__((format(printf, 1, 2))) static void st_fail(const char *fmt, ...)
{
	pthread_mutex_lock(&st_why_mu);
	if (atomic_fetch_add(&st_bad, 1) == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(st_why, sizeof(st_why), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&st_why_mu);
}

static void *st_main(void *arg)
{
	uint64_t s = (uint64_t)(uintptr_t)arg * 7919 + 1;
	char err[512];
	for (int i = 0; i < ST_OPS && atomic_load(&st_bad) == 0; i++) {
		uint64_t r = splitmix64(&s);
		uint64_t k = (r >> 8) % ST_KEYS;
		unsigned op = (unsigned)(r >> 32) % 10;
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(k, key);
		int rc = 0;
		if (op < 4) {
			kiln_cache_blob_t b;
			rc = kiln_cache_get(store, key, &b, err, sizeof(err));
			if (rc == 0) {
				if (b.size != st_size(k) ||
				    memcmp(b.data, st_content[k % 13],
					   b.size) != 0)
					st_fail("key %llu: wrong bytes",
						(unsigned long long)k);
				kiln_cache_blob_release(&b);
			} else if (rc == KILN_ENOTFOUND) {
				rc = 0;
			}
		} else if (op < 7) {
			rc = kiln_cache_put(store, key, st_content[k % 13],
					    st_size(k), NULL, err, sizeof(err));
		} else if (op == 7) {
			rc = kiln_cache_evict(store, key, err, sizeof(err));
			if (rc == KILN_ENOTFOUND)
				rc = 0;
		} else if (op == 8) {
			rc =
			    kiln_cache_gc(store, 20000, NULL, err, sizeof(err));
		} else {
			rc = kiln_cache_touch(store, key, err, sizeof(err));
			if (rc == KILN_ENOTFOUND)
				rc = 0;
			kiln_cache_stats_t st;
			if (rc == 0)
				rc = kiln_cache_stats(store, &st, err,
						      sizeof(err));
		}
		if (rc != 0)
			st_fail("op %u key %llu: %d (%s): %s", op,
				(unsigned long long)k, rc, kiln_strerror(rc),
				err);
	}
	return NULL;
}

Test(regress, threads_never_see_a_bad_blob, .timeout = 240)
{
	kiln_cache_options_t o;
	opts_fast(&o);
	o.max_bytes = 30000;
	o.touch_batch = 8;
	store = store_open(dir, &o);
	for (int i = 0; i < 13; i++)
		st_content[i] = gen_bytes((uint64_t)i + 100, st_size(12));
	pthread_t t[ST_THREADS];
	for (int i = 0; i < ST_THREADS; i++)
		cr_assert_eq(
		    pthread_create(&t[i], NULL, st_main, (void *)(uintptr_t)i),
		    0);
	for (int i = 0; i < ST_THREADS; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(atomic_load(&st_bad), 0, "%s", st_why);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 0, "%llu entries dropped as corrupt",
		     (unsigned long long)s.corrupt_dropped);
	kiln_cache_verify_result_t v;
	char err[512];
	cr_assert_eq(kiln_cache_verify(store, &v, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(v.blobs_bad, 0);
	cr_assert_eq(v.blobs_checked, s.blobs);
	uint64_t blobs = s.blobs, entries = s.entries;
	close_store();
	store = store_open(dir, &o);
	s = stats_of(store);
	cr_assert_eq(s.blobs, blobs);
	cr_assert_eq(s.entries, entries);
	expect_census(dir, (size_t)blobs);
	for (uint64_t k = 0; k < ST_KEYS; k++) {
		kiln_cache_blob_t b;
		if (get_n(store, k, &b) == 0) {
			cr_assert_eq(b.size, st_size(k));
			cr_assert(memcmp(b.data, st_content[k % 13], b.size) ==
				  0);
			kiln_cache_blob_release(&b);
		}
	}
	cr_assert_eq(stats_of(store).corrupt_dropped, 0);
	for (int i = 0; i < 13; i++)
		free(st_content[i]);
}

/* ---- (c) a put whose bytes are an existing, damaged blob ----------------- */

static void dedup_damaged(void (*damage)(const char *path, size_t size))
{
	store = store_open(dir, NULL);
	const size_t size = 10000;
	uint8_t *b = gen_bytes(7, size);
	put_ok(store, 1, b, size, NULL);
	char p[PATH_MAX];
	blob_path(dir, b, size, p);
	damage(p, size);

	put_ok(store, 2, b, size, NULL);
	expect_hit(store, 2, b, size, NULL);
	expect_hit(store, 1, b, size, NULL); /* healed for both keys */
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.corrupt_dropped, 0);
	cr_assert_eq(s.entries, 2);
	cr_assert_eq(s.blobs, 1);
	size_t n;
	uint8_t *on_disk = file_read(p, &n);
	cr_assert_eq(n, size);
	cr_assert(memcmp(on_disk, b, size) == 0, "the blob was not rewritten");
	free(on_disk);
	close_store();
	store = store_open(dir, NULL);
	expect_hit(store, 1, b, size, NULL);
	expect_hit(store, 2, b, size, NULL);
	expect_census(dir, 1);
	free(b);
}

static void flip_middle(const char *path, size_t size)
{
	file_flip_byte(path, (off_t)size / 20);
}

static void cut_short(const char *path, size_t size)
{
	file_truncate(path, (off_t)size - 1);
}

static void delete_file(const char *path, size_t size)
{
	(void)size;
	cr_assert_eq(unlink(path), 0);
}

Test(regress, put_over_rotted_blob_rewrites_it)
{
	dedup_damaged(flip_middle);
}

Test(regress, put_over_short_blob_rewrites_it)
{
	dedup_damaged(cut_short);
}

Test(regress, put_over_missing_blob_rewrites_it)
{
	dedup_damaged(delete_file);
}

/* ---- (d) descriptors ----------------------------------------------------- */

static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	cr_assert_not_null(d, "/proc/self/fd: %s", strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void open_close_same_fds(const char *why)
{
	int before = fd_count();
	store = store_open(dir, NULL);
	close_store();
	int after = fd_count();
	cr_assert_eq(after, before, "%s: %d descriptors before, %d after", why,
		     before, after);
}

Test(regress, open_through_recovery_leaks_no_fd)
{
	store = store_open(dir, NULL);
	for (uint64_t n = 0; n < 4; n++)
		put_gen(store, n, 100 + n, NULL);
	close_store();
	open_close_same_fds("warm-up");
	for (int i = 0; i < 3; i++) {
		rm_index();
		open_close_same_fds("open through a rebuild (index lost)");
		expect_census(dir, 4);
	}
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", dir);
	file_write(p, "this is not a database", 22);
	open_close_same_fds("open through a rebuild (index moved aside)");
	unclean_session(dir, 10, 200);
	open_close_same_fds("open after an unclean shutdown");
	open_close_same_fds("plain open");
	store = store_open(dir, NULL);
	for (uint64_t n = 0; n < 4; n++)
		expect_gen(store, n, 100 + n);
	expect_gen(store, 10, 200);
}

/* ---- (e) the unclean mark survives a power cut --------------------------- */

Test(regress, unclean_mark_survives_power_cut)
{
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.max_bytes = (uint64_t)1 << 40;
	o.min_free_bytes = 1;
	store = store_open(dir, &o);
	put_gen(store, 1, 4096, NULL);
	close_store(); /* clean = 1; WAL checkpointed and removed */

	char real[PATH_MAX], wal[PATH_MAX], shm[PATH_MAX], synced[PATH_MAX];
	cr_assert_not_null(realpath(dir, real));
	path_fmt(wal, "%s/index.db-wal", dir);
	path_fmt(shm, "%s/index.db-shm", dir);
	path_fmt(synced, "%s/synced", dir);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* The next session: puts, a put caught in its blob write,
		 * then the power goes. */
		snprintf(wal_track, sizeof(wal_track), "%s/index.db-wal", real);
		kiln_cache_t *c = NULL;
		if (kiln_cache_open(dir, &o, &c, NULL, 0) != 0)
			_exit(2);
		uint8_t b[4096], key[KILN_CACHE_KEY_BYTES];
		for (uint64_t n = 2; n < 12; n++) {
			fill_bytes(n, b, sizeof(b));
			key_of(n, key);
			if (kiln_cache_put(c, key, b, sizeof(b), NULL, NULL,
					   0) != 0)
				_exit(3);
		}
		char t[PATH_MAX + 64];
		snprintf(t, sizeof(t), "%s/objects/00", dir);
		mkdir(t, 0755);
		snprintf(t, sizeof(t), "%s/objects/00/.tmp.%ld.99", dir,
			 (long)getpid());
		int fd = open(t, O_CREAT | O_WRONLY, 0644);
		if (fd < 0 || write(fd, b, 100) != 100 || fsync(fd) != 0)
			_exit(4);
		close(fd);
		fd = open(synced, O_CREAT | O_WRONLY | O_TRUNC, 0644);
		if (fd < 0 || write(fd, &wal_synced, sizeof(wal_synced)) !=
				  (ssize_t)sizeof(wal_synced))
			_exit(5);
		close(fd);
		kill(getpid(), SIGKILL);
		_exit(6);
	}
	cr_assert_eq(wait_child(pid), 128 + SIGKILL);

	/* Power cut: the WAL keeps what was synced, the rest is lost. */
	long long keep;
	size_t n;
	uint8_t *raw = file_read(synced, &n);
	cr_assert_eq(n, sizeof(keep));
	memcpy(&keep, raw, sizeof(keep));
	free(raw);
	unlink(synced);
	off_t wal_size = file_size(wal);
	fprintf(stderr, "power cut: WAL %lld bytes, %lld synced\n",
		(long long)wal_size, keep);
	if (keep < 0)
		cr_assert_eq(unlink(wal), 0);
	else
		file_truncate(wal, (off_t)keep);
	cr_assert(unlink(shm) == 0 || errno == ENOENT);
	objects_census_t before = objects_census(dir);
	cr_assert_eq(before.blobs, 11);
	cr_assert_eq(before.temps, 1);

	store = store_open(dir, &o);
	kiln_cache_stats_t s = stats_of(store);
	/* Entries whose commit was synced survive with their blobs; every
	 * other blob is an orphan and goes, and so does the temp file. */
	cr_assert_geq(s.entries, 1);
	cr_assert_eq(s.temp_removed, 1, "temp_removed %llu",
		     (unsigned long long)s.temp_removed);
	cr_assert_eq(s.orphan_blobs + (s.entries - 1), 10,
		     "orphan_blobs %llu, entries %llu",
		     (unsigned long long)s.orphan_blobs,
		     (unsigned long long)s.entries);
	expect_gen(store, 1, 4096);
	expect_census(dir, (size_t)s.blobs);
	close_store();
	store = store_open(dir, &o);
	expect_census(dir, (size_t)stats_of(store).blobs);
	expect_gen(store, 1, 4096);
}

/* ---- full disks (tmpfs) -------------------------------------------------- */

/* Mounts a tmpfs of size bytes at mnt (skips the test when it cannot). */
static void mount_tmpfs(size_t size)
{
	char why[256] = "";
	if (geteuid() != 0) {
		snprintf(why, sizeof(why), "needs root to mount a tmpfs");
	} else {
		if (unshare(CLONE_NEWNS) == 0)
			mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
		mnt = tmpdir_new();
		char opt[64];
		snprintf(opt, sizeof(opt), "size=%zu,mode=0755", size);
		if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opt) !=
		    0) {
			snprintf(why, sizeof(why), "mount(tmpfs, %s): %s", mnt,
				 strerror(errno));
			rm_rf(mnt);
			free(mnt);
			mnt = NULL;
		}
	}
	if (why[0] != '\0') {
		fprintf(stderr, "test_regress: skipped: %s\n", why);
		teardown(); /* a skipped test does not reach the fini */
		cr_skip_test("%s", why);
	}
}

static uint64_t free_bytes(const char *path)
{
	struct statvfs v;
	cr_assert_eq(statvfs(path, &v), 0);
	return (uint64_t)v.f_bavail * v.f_frsize;
}

/* A put that takes the disk under min_free_bytes is kept: gc runs while
 * the new entry is pinned and evicts older entries, never it. */
Test(regress, watermark_gc_keeps_the_entry_just_put)
{
	mount_tmpfs(6 * MIB);
	char sdir[PATH_MAX];
	path_fmt(sdir, "%s/store", mnt);
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.max_bytes = (uint64_t)1 << 40;
	o.min_free_bytes = 3 * MIB;
	o.no_fsync = 1;
	store = store_open(sdir, &o);

	/* Alone: nothing else to evict, the entry stays although the disk is
	 * now under the watermark. */
	put_gen(store, 1, 4 * MIB, NULL);
	cr_assert_lt(free_bytes(sdir), o.min_free_bytes);
	expect_gen(store, 1, 4 * MIB);
	cr_assert_eq(stats_of(store).entries, 1);

	/* With older entries: they go, the new one stays. */
	char err[512];
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(1, key);
	cr_assert_eq(kiln_cache_evict(store, key, err, sizeof(err)), 0, "%s",
		     err);
	put_gen(store, 2, 1 * MIB, NULL);
	put_gen(store, 3, 1 * MIB, NULL); /* LRU order: 2, 3, then 4 */
	put_gen(store, 4, 2 * MIB, NULL);
	expect_gen(store, 4, 2 * MIB);
	expect_miss(store, 2);
	cr_assert_geq(free_bytes(sdir) + 64 * KIB, o.min_free_bytes,
		      "gc did not restore the watermark: %llu free",
		      (unsigned long long)free_bytes(sdir));
	cr_assert_eq(objects_census(sdir).temps, 0);
}

/* After an unclean shutdown on a nearly full disk, open succeeds (the
 * journal rewrite it attempts, 150 KB here, is optional) and the store
 * serves what it has. */
#define FULL_KEYS 1500

Test(regress, unclean_open_on_a_full_disk)
{
	mount_tmpfs(16 * MIB);
	char sdir[PATH_MAX], filler[PATH_MAX];
	path_fmt(sdir, "%s/store", mnt);
	path_fmt(filler, "%s/filler", mnt);
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.max_bytes = (uint64_t)1 << 40;
	o.min_free_bytes = 1;
	o.no_fsync = 1;
	fflush(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		kiln_cache_t *c = NULL;
		if (kiln_cache_open(sdir, &o, &c, NULL, 0) != 0)
			_exit(2);
		uint8_t b[16], key[KILN_CACHE_KEY_BYTES];
		for (uint64_t n = 0; n < FULL_KEYS; n++) {
			fill_bytes(n, b, sizeof(b));
			key_of(n, key);
			if (kiln_cache_put(c, key, b, sizeof(b), NULL, NULL,
					   0) != 0)
				_exit(3);
		}
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	cr_assert_eq(wait_child(pid), 128 + SIGKILL);

	/* Something else fills the disk, leaving 16 KiB. */
	int fd = open(filler, O_CREAT | O_WRONLY, 0644);
	cr_assert(fd >= 0);
	static uint8_t z[64 * 1024];
	while (write(fd, z, sizeof(z)) > 0)
		;
	while (write(fd, z, 4096) > 0)
		;
	off_t end = lseek(fd, 0, SEEK_END);
	cr_assert_eq(ftruncate(fd, end - 16 * 1024), 0);
	close(fd);

	kiln_cache_t *c = NULL;
	char err[512] = "";
	int rc = kiln_cache_open(sdir, &o, &c, err, sizeof(err));
	cr_assert_eq(rc, 0,
		     "open after an unclean shutdown on a full disk: "
		     "%d (%s): %s",
		     rc, kiln_strerror(rc), err);
	store = c;
	for (uint64_t n = 0; n < FULL_KEYS; n++) {
		uint8_t b[16];
		fill_bytes(n, b, sizeof(b));
		expect_hit(store, n, b, sizeof(b), NULL);
	}
	cr_assert_eq(stats_of(store).entries, FULL_KEYS);
	cr_assert_eq(objects_census(sdir).blobs, FULL_KEYS);
}
