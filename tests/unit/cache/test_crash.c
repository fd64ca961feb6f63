/*
 * test_crash.c — crash safety of the kernel store (cache/): a forked child
 * opens the store (real fsync, default options but min_free_bytes = 1) and
 * puts entries in a loop; the parent SIGKILLs it after a random 1-40 ms,
 * then opens the store itself and checks that every acknowledged put is a
 * hit with its exact bytes, that no get returns bytes other than the key's
 * (a miss is allowed only for a put that was never acknowledged), that keys
 * never put are misses, and that PRAGMA quick_check on index.db says "ok"
 * after it closed the store again. Repeated for 200 iterations; the keys
 * continue from one iteration to the next, so each child's open recovers
 * from the previous child's death and from the parent's session.
 *
 * The child logs to <tmp>/acked with one write(2) of a fixed-size record
 * before each put (started) and after it returns 0 (acked); nothing is
 * buffered, so a record that is in the file was written before the kill.
 * Entry k holds crash_size(k) bytes of fill_bytes(crash_seed(k)): mostly
 * under 16 KiB, one in eight up to 300 KiB, every 41st empty.
 *
 * KILN_CRASH_ITERATIONS and KILN_CRASH_SEED (environment) override the
 * iteration count and the seed of the kill delays.
 */
#include "helpers.h"

#include <signal.h>

#define ITERATIONS_DEFAULT 200
#define SEED_DEFAULT	   0x6b696c6eULL
#define MAX_KEYS	   (1u << 20)
#define MAX_SIZE	   (300 * KIB)
#define REC_MAGIC	   0x4b524543u

enum {
	REC_OPENED = 1,	     /* key: the first key this child will put */
	REC_STARTED = 2,     /* put of key begins */
	REC_ACKED = 3,	     /* put of key returned 0 */
	REC_OPEN_FAILED = 4, /* rc: kiln_cache_open's code */
	REC_PUT_FAILED = 5   /* rc: kiln_cache_put's code */
};

struct rec {
	uint32_t key;
	uint32_t kind;
	int32_t rc;
	uint32_t magic;
};

enum { K_NONE = 0, K_STARTED = 1, K_ACKED = 2 };

static size_t crash_size(uint32_t k)
{
	uint64_t s = k;
	uint64_t h = splitmix64(&s);
	if (k % 41 == 0)
		return 0;
	if (h % 8 == 0)
		return (size_t)(h >> 8) % (MAX_SIZE + 1);
	return (size_t)(h >> 8) % (16 * KIB);
}

static uint64_t crash_seed(uint32_t k)
{
	return 0xc0ffee0000000000ULL + k;
}

static void crash_opts(kiln_cache_options_t *o)
{
	kiln_cache_options_init(o);
	o->min_free_bytes = 1;
}

static void rec_write(int fd, uint32_t key, uint32_t kind, int32_t rc)
{
	struct rec r = {key, kind, rc, REC_MAGIC};
	if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(10);
}

/* The child: puts keys first, first + 1, ... until it is killed. */
__attribute__((noreturn)) static void
child_main(const char *sdir, const char *log, uint32_t first)
{
	int fd = open(log, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (fd < 0)
		_exit(11);
	kiln_cache_options_t o;
	crash_opts(&o);
	kiln_cache_t *c = NULL;
	char err[512] = "";
	int rc = kiln_cache_open(sdir, &o, &c, err, sizeof(err));
	if (rc != 0) {
		rec_write(fd, first, REC_OPEN_FAILED, rc);
		dprintf(2, "crash child: open: %s: %s\n", kiln_strerror(rc),
			err);
		_exit(12);
	}
	rec_write(fd, first, REC_OPENED, 0);
	uint8_t *buf = malloc(MAX_SIZE + 1);
	if (buf == NULL)
		_exit(13);
	for (uint32_t k = first; k < MAX_KEYS; k++) {
		size_t n = crash_size(k);
		fill_bytes(crash_seed(k), buf, n);
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(k, key);
		kiln_cache_meta_t m = {.target = "crash", .compile_ms = k};
		rec_write(fd, k, REC_STARTED, 0);
		rc = kiln_cache_put(c, key, buf, n, &m, err, sizeof(err));
		if (rc != 0) {
			rec_write(fd, k, REC_PUT_FAILED, rc);
			dprintf(2, "crash child: put %u: %s: %s\n", k,
				kiln_strerror(rc), err);
			_exit(14);
		}
		rec_write(fd, k, REC_ACKED, 0);
	}
	kiln_cache_close(c);
	_exit(0);
}

/* PRAGMA quick_check's first row into out ("" when it cannot run). */
static void quick_check_text(const char *sdir, char *out, size_t outlen)
{
	char p[PATH_MAX];
	path_fmt(p, "%s/index.db", sdir);
	snprintf(out, outlen, "cannot open index.db");
	sqlite3 *db = NULL;
	if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
		sqlite3_close(db);
		return;
	}
	sqlite3_busy_timeout(db, 5000);
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL) ==
		SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW) {
		const unsigned char *t = sqlite3_column_text(st, 0);
		snprintf(out, outlen, "%s", t ? (const char *)t : "(null)");
	} else {
		snprintf(out, outlen, "quick_check failed: %s",
			 sqlite3_errmsg(db));
	}
	sqlite3_finalize(st);
	sqlite3_close(db);
}

struct crash_run {
	uint8_t *state; /* K_* per key */
	uint32_t next;	/* keys below were started at some time */
	uint64_t acked, started_unacked, unacked_hits, killed_in_open;
	uint64_t torn_records, gets, hit_bytes;
	unsigned anomalies;
	char first_anomaly[1024];
};

__attribute__((format(printf, 2, 3))) static void anomaly(struct crash_run *r,
							  const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "crash: ANOMALY: %s\n", msg);
	if (r->anomalies++ == 0)
		snprintf(r->first_anomaly, sizeof(r->first_anomaly), "%s", msg);
}

/* Reads the records the last child appended after *off. */
static void read_records(struct crash_run *r, const char *log, off_t *off,
			 int it, bool *opened)
{
	int fd = open(log, O_RDWR);
	cr_assert(fd >= 0, "open %s: %s", log, strerror(errno));
	struct rec rec;
	ssize_t n;
	while ((n = pread(fd, &rec, sizeof(rec), *off)) ==
	       (ssize_t)sizeof(rec)) {
		*off += (off_t)sizeof(rec);
		if (rec.magic != REC_MAGIC || rec.key >= MAX_KEYS) {
			anomaly(r, "iteration %d: bad log record", it);
			continue;
		}
		switch (rec.kind) {
		case REC_OPENED: *opened = true; break;
		case REC_STARTED:
			if (r->state[rec.key] == K_NONE)
				r->state[rec.key] = K_STARTED;
			if (rec.key + 1 > r->next)
				r->next = rec.key + 1;
			break;
		case REC_ACKED:
			r->state[rec.key] = K_ACKED;
			r->acked++;
			break;
		case REC_OPEN_FAILED:
			anomaly(r, "iteration %d: child's open failed: %d (%s)",
				it, rec.rc, kiln_strerror(rec.rc));
			break;
		case REC_PUT_FAILED:
			anomaly(r,
				"iteration %d: child's put %u failed: %d "
				"(%s)",
				it, rec.key, rec.rc, kiln_strerror(rec.rc));
			break;
		default: anomaly(r, "iteration %d: bad record kind", it);
		}
	}
	if (n > 0) {
		/* A record cut by the kill: drop it so the next ones align. */
		r->torn_records++;
		cr_assert_eq(ftruncate(fd, *off), 0);
	}
	close(fd);
}

/* The parent's check after a kill. */
static void check_store(struct crash_run *r, const char *sdir, int it,
			uint32_t first_this, uint8_t *buf)
{
	kiln_cache_options_t o;
	crash_opts(&o);
	kiln_cache_t *c = NULL;
	char err[512] = "";
	int rc = kiln_cache_open(sdir, &o, &c, err, sizeof(err));
	if (rc != 0) {
		anomaly(r, "iteration %d: parent's open: %d (%s): %s", it, rc,
			kiln_strerror(rc), err);
		return;
	}
	/* Every key ever started, plus two never started. */
	for (uint32_t k = 0; k < r->next + 2; k++) {
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(k, key);
		kiln_cache_blob_t h;
		memset(&h, 0, sizeof(h));
		err[0] = '\0';
		rc = kiln_cache_get(c, key, &h, err, sizeof(err));
		r->gets++;
		if (rc == KILN_ENOTFOUND) {
			if (k < r->next && r->state[k] == K_ACKED)
				anomaly(r, "iteration %d: acked key %u lost",
					it, k);
			continue;
		}
		if (rc != 0) {
			anomaly(r, "iteration %d: get %u: %d (%s): %s", it, k,
				rc, kiln_strerror(rc), err);
			continue;
		}
		size_t n = crash_size(k);
		fill_bytes(crash_seed(k), buf, n);
		if (k >= r->next || r->state[k] == K_NONE)
			anomaly(r, "iteration %d: key %u never put is a hit",
				it, k);
		else if (h.size != n || (n > 0 && memcmp(h.data, buf, n)))
			anomaly(r,
				"iteration %d: key %u: wrong bytes (%zu, "
				"expected %zu)",
				it, k, h.size, n);
		else if (h.entry.size != n ||
			 memcmp(h.entry.key, key, sizeof(key)) != 0)
			anomaly(r, "iteration %d: key %u: wrong entry", it, k);
		else if (r->state[k] == K_STARTED && k >= first_this)
			r->unacked_hits++;
		r->hit_bytes += h.size;
		kiln_cache_blob_release(&h);
	}
	kiln_cache_close(c);
	char qc[512];
	quick_check_text(sdir, qc, sizeof(qc));
	if (strcmp(qc, "ok") != 0)
		anomaly(r, "iteration %d: quick_check: %s", it, qc);
}

static long env_long(const char *name, long def)
{
	const char *v = getenv(name);
	return v != NULL && *v != '\0' ? strtol(v, NULL, 0) : def;
}

Test(crash, sigkill_during_puts, .timeout = 590)
{
	int iterations =
	    (int)env_long("KILN_CRASH_ITERATIONS", ITERATIONS_DEFAULT);
	uint64_t rng =
	    (uint64_t)env_long("KILN_CRASH_SEED", (long)SEED_DEFAULT);
	fprintf(stderr, "crash: %d iterations, seed 0x%llx\n", iterations,
		(unsigned long long)rng);

	char *root = tmpdir_new();
	char sdir[PATH_MAX], log[PATH_MAX];
	path_fmt(sdir, "%s/store", root);
	path_fmt(log, "%s/acked", root);
	file_write(log, "", 0);

	struct crash_run r;
	memset(&r, 0, sizeof(r));
	r.state = calloc(MAX_KEYS, 1);
	cr_assert_not_null(r.state);
	uint8_t *buf = malloc(MAX_SIZE + 1);
	cr_assert_not_null(buf);
	off_t off = 0;
	int it;
	for (it = 0; it < iterations && r.anomalies == 0; it++) {
		uint32_t first = r.next;
		pid_t pid = fork();
		cr_assert(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0)
			child_main(sdir, log, first);
		uint64_t us = 1000 + splitmix64(&rng) % 39001;
		struct timespec ts = {0, (long)us * 1000};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		kill(pid, SIGKILL);
		int st = wait_child(pid);
		if (st != 128 + SIGKILL)
			anomaly(&r, "iteration %d: child exited with %d", it,
				st);
		bool opened = false;
		read_records(&r, log, &off, it, &opened);
		if (!opened)
			r.killed_in_open++;
		for (uint32_t k = first; k < r.next; k++)
			if (r.state[k] == K_STARTED)
				r.started_unacked++;
		check_store(&r, sdir, it, first, buf);
	}
	objects_census_t oc = objects_census(sdir);
	fprintf(stderr,
		"crash: %d iterations, %u keys started, %llu puts acked, "
		"%llu started but not acked (%llu of them hits), %llu kills "
		"during open, %llu torn log records, %llu gets (%llu bytes "
		"verified), %zu blobs / %llu bytes on disk, %zu temp files, "
		"%u anomalies\n",
		it, r.next, (unsigned long long)r.acked,
		(unsigned long long)r.started_unacked,
		(unsigned long long)r.unacked_hits,
		(unsigned long long)r.killed_in_open,
		(unsigned long long)r.torn_records, (unsigned long long)r.gets,
		(unsigned long long)r.hit_bytes, oc.blobs,
		(unsigned long long)oc.bytes, oc.temps, r.anomalies);
	cr_assert_eq(r.anomalies, 0, "%u anomalies; the first: %s", r.anomalies,
		     r.first_anomaly);
	cr_assert_eq(it, iterations);
	cr_assert_gt(r.acked, 0, "no put was ever acknowledged");

	/* A last clean session: everything acked is there and verifies. */
	kiln_cache_t *c = store_open(sdir, NULL);
	kiln_cache_verify_result_t vr;
	char err[256] = "";
	cr_assert_eq(kiln_cache_verify(c, &vr, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(vr.blobs_bad, 0);
	kiln_cache_close(c);
	expect_quick_check(sdir);
	free(buf);
	free(r.state);
	rm_rf(root);
	free(root);
}
