/*
 * bench_cache.c — the kernel store (cache/) against a plain read of the same
 * bytes: hit latency, put throughput, and the index's size on disk.
 *
 *   bench_cache [--dir D] [--entries N[,N...]]... [--gets N] [--quick]
 *
 *   --dir D      the stores live in a fresh mkdtemp under D (default
 *                /var/tmp: a disk, not tmpfs), removed at the end
 *   --entries N  index sizes to measure, repeatable or comma-separated
 *                (default 10000,1000000)
 *   --gets N     gets per measurement for 4 KB blobs and for the small
 *                entries; 256 KB gets N/4, 4 MB gets N/40 (default 20000)
 *   --quick      --entries 10000 and 1 s instead of 2 s per put
 *                measurement (what `meson test --benchmark` runs)
 *
 * For each N: a store is populated with N entries of distinct small blobs
 * (64-200 bytes, one blob file and one index row each) with no_fsync set,
 * then PROBES entries each of 4 KB, 256 KB and 4 MB. It is flushed and
 * closed, and the sizes of its files are printed (index.db and its WAL, the
 * journal, objects/); then it is reopened with the default options (the
 * open is timed: quick_check included) and, warm (every byte in the page
 * cache), every probe is read once and checked, then for random probes:
 *   kiln  kiln_cache_get + kiln_cache_blob_release (the key's row from the
 *         hot-row memo or the index, blob read, CRC-64 check, the
 *         batched last_used write when it falls due);
 *   peer  open + fstat + malloc + read of the whole blob file (its path,
 *         objects/ab/<62 hex>, computed here from the bytes) + close + free:
 *         what any program pays to read a file whose name it knows.
 * kiln and peer alternate per probe (and which goes first), so both see the
 * same cache state and the same machine load. p50, p99 and mean of each
 * (the mean carries the batched last_used writes, done by one get in 256),
 * and the ratio of the p50s; the target is kiln <= 1.5x peer. The same for
 * random small entries over the whole index (peer: the same small file).
 * Then a breakdown: CRC-64 (the check a get makes) and SHA-256 (the
 * blob's name, checked by put and verify) of a blob alone (over bytes just
 * read, p50), a get of an absent key (the key lookup alone, without the join to
 * the blob row) and kiln_cache_touch (the same lookup + queueing the hit).
 *
 * Put throughput: on fresh stores, default options (fsync of blob and
 * directory) and no_fsync, distinct 4 KB, 256 KB and 4 MB blobs for 2 s
 * each: puts/s, MB/s, p50 and p99; peer: the same durable write without
 * hash or index (temp file, write, fsync, close, rename, fsync of the
 * directory; no fsyncs beside no_fsync), alternating with the puts.
 *
 * Timing only; the targets are printed as met or missed, never an exit
 * status. CLOCK_MONOTONIC around each call. MB = 10^6 bytes, KB = 1024.
 */
#include "cache/cache.h"
#include "cache/checksum.h"
#include "protocol/protocol.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define PROBES	    64 /* entries of each probe size */
#define N_SIZES	    3
#define MAX_ENTRIES 8
#define SMALL_MIN   64
#define SMALL_SPAN  137 /* small blobs: 64 .. 200 bytes */
#define MB	    1e6

/* Key and content families: a tag and an index make each distinct. */
enum { TAG_POP = 1, TAG_PROBE = 2, TAG_PUT = 3, TAG_ABSENT = 4 };

static const size_t sizes[N_SIZES] = {4096, 256 * 1024, 4 * 1024 * 1024};
static const char *const size_names[N_SIZES] = {"4 KB", "256 KB", "4 MB"};
static const unsigned get_div[N_SIZES] = {1, 4, 40};

static volatile unsigned sink;

/* ---- helpers ------------------------------------------------------------ */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static uint64_t rng_state = 0x6b696c6e; /* the probe order */

static uint64_t rnd(uint64_t n)
{
	return splitmix(&rng_state) % n;
}

static void make_key(int tag, uint64_t i, uint8_t key[KILN_CACHE_KEY_BYTES])
{
	uint64_t s = ((uint64_t)tag << 56) ^ i;
	for (int k = 0; k < KILN_CACHE_KEY_BYTES; k += 8) {
		uint64_t v = splitmix(&s);
		memcpy(key + k, &v, 8);
	}
}

/* Deterministic bytes for (tag, i); the first 16 name them, so that no two
 * (tag, i) share a blob. */
static void fill(uint8_t *buf, size_t size, int tag, uint64_t i)
{
	uint64_t s = ((uint64_t)tag << 56) ^ (i * 0x2545f4914f6cdd1du) ^ size;
	uint64_t head[2] = {((uint64_t)tag << 56) | size, i};
	size_t k = 0;
	for (; k + 8 <= size; k += 8) {
		uint64_t v = splitmix(&s);
		memcpy(buf + k, &v, 8);
	}
	for (; k < size; k++)
		buf[k] = (uint8_t)splitmix(&s);
	memcpy(buf, head, size < 16 ? size : 16);
}

static size_t small_size(uint64_t i)
{
	uint64_t s = i ^ 0x736d616c6cu;
	return SMALL_MIN + (size_t)(splitmix(&s) % SMALL_SPAN);
}

static EVP_MD *sha256_md;
static volatile uint64_t crc_sink; /* keeps the timed CRC */
static EVP_MD_CTX *sha_ctx;

static void sha256(const void *p, size_t n, uint8_t out[32])
{
	if (EVP_DigestInit_ex2(sha_ctx, sha256_md, NULL) != 1 ||
	    EVP_DigestUpdate(sha_ctx, p, n) != 1 ||
	    EVP_DigestFinal_ex(sha_ctx, out, NULL) != 1) {
		fprintf(stderr, "bench_cache: SHA-256 failed\n");
		exit(1);
	}
}

/* <dir>/objects/ab/<62 hex>: where cache/ keeps the blob of these bytes. */
static void blob_path(const char *dir, const uint8_t sha[32], char *out,
		      size_t len)
{
	int n = snprintf(out, len, "%s/objects/%02x/", dir, sha[0]);
	for (int k = 1; k < 32 && n > 0 && (size_t)n + 3 <= len; k++)
		n += snprintf(out + n, len - (size_t)n, "%02x", sha[k]);
}

static void die_kiln(const char *what, int rc, const char *err)
{
	fprintf(stderr, "bench_cache: %s: %s (%s)\n", what, kiln_strerror(rc),
		err[0] ? err : "no detail");
	exit(1);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (p == NULL) {
		fprintf(stderr, "bench_cache: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

/* The peer: read a file whose name is known into a malloc'd buffer. The
 * buffer is returned when keep is not NULL, else freed. Bytes read, or -1. */
static long peer_read(const char *path, uint8_t **keep)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return -1;
	}
	size_t n = (size_t)st.st_size, off = 0;
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL) {
		close(fd);
		return -1;
	}
	while (off < n) {
		ssize_t r = read(fd, buf + off, n - off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	close(fd);
	sink += buf[0];
	if (keep != NULL)
		*keep = buf;
	else
		free(buf);
	return off == n ? (long)n : -1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Sorts v; the p-th percentile in microseconds. */
static double pct_us(uint64_t *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(v[0]), cmp_u64);
	size_t k = (size_t)(p / 100.0 * (double)n);
	return (double)v[k < n ? k : n - 1] / 1e3;
}

static double mean_us(const uint64_t *v, size_t n)
{
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += (double)v[i];
	return n ? sum / (double)n / 1e3 : 0;
}

static double pct_sorted_us(const uint64_t *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	size_t k = (size_t)(p / 100.0 * (double)n);
	return (double)v[k < n ? k : n - 1] / 1e3;
}

/* Other work on the machine skews every figure: say how much there was. */
static void print_load(const char *indent, const char *when)
{
	double l[3];
	if (getloadavg(l, 3) == 3)
		printf("%sload average %s: %.2f %.2f %.2f (%ld CPUs)\n", indent,
		       when, l[0], l[1], l[2], sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- files -------------------------------------------------------------- */

static uint64_t walk_bytes, walk_alloc, walk_files;

static int walk_cb(const char *path, const struct stat *st, int type,
		   struct FTW *f)
{
	(void)path;
	(void)f;
	if (type == FTW_F) {
		walk_bytes += (uint64_t)st->st_size;
		walk_alloc += (uint64_t)st->st_blocks * 512;
		walk_files++;
	}
	return 0;
}

static int rm_cb(const char *path, const struct stat *st, int type,
		 struct FTW *f)
{
	(void)st;
	(void)type;
	(void)f;
	if (remove(path) != 0 && errno != ENOENT)
		fprintf(stderr, "bench_cache: remove %s: %s\n", path,
			strerror(errno));
	return 0;
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_cb, 64, FTW_DEPTH | FTW_PHYS);
}

/* st_size and allocated bytes of one file; 0 when absent. */
static void file_size(const char *path, uint64_t *size, uint64_t *alloc)
{
	struct stat st;
	*size = *alloc = 0;
	if (stat(path, &st) == 0) {
		*size = (uint64_t)st.st_size;
		*alloc = (uint64_t)st.st_blocks * 512;
	}
}

/* ---- results for the summary -------------------------------------------- */

typedef struct hit_row {
	double kiln_p50, kiln_p99, kiln_mean, peer_p50, peer_p99, peer_mean;
	double sha_p50, crc_p50;
	size_t gets;
} hit_row_t;

typedef struct n_result {
	uint64_t n;
	int skipped;
	char why[160];
	double pop_rate;     /* small puts/s */
	double probe_mbs;    /* probe puts, MB/s */
	uint64_t index_size; /* index.db + -wal after close (allocated) */
	uint64_t journal_size;
	uint64_t objects_alloc, objects_files;
	double open_ms;
	hit_row_t hit[N_SIZES + 1]; /* the sizes, then the small entries */
	double miss_p50, touch_p50;
	double flush_rand_us, flush_probe_us; /* per queued hit */
} n_result_t;

typedef struct put_row {
	double puts_s, mbs, p50, p99, peer_p50, peer_p99;
	size_t puts;
} put_row_t;

static char base_dir[1024]; /* so that every path under it fits PATH_MAX */
static int quick;
static size_t gets_base = 20000;
static double put_seconds = 2.0;
static put_row_t put_rows[2][N_SIZES]; /* [no_fsync][size] */
static int put_skipped;
static char put_why[160];

/* ---- put throughput ----------------------------------------------------- */

static int enough_space(uint64_t bytes, uint64_t inodes, char *why, size_t len)
{
	struct statvfs vfs;
	if (statvfs(base_dir, &vfs) != 0) {
		snprintf(why, len, "statvfs: %s", strerror(errno));
		return 0;
	}
	uint64_t free_b = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	uint64_t free_i = (uint64_t)vfs.f_favail;
	if (free_b < bytes) {
		snprintf(why, len, "needs ~%.1f GB free, has %.1f GB",
			 bytes / 1e9, free_b / 1e9);
		return 0;
	}
	if (vfs.f_files != 0 && free_i < inodes) {
		snprintf(why, len, "needs ~%llu free inodes, has %llu",
			 (unsigned long long)inodes,
			 (unsigned long long)free_i);
		return 0;
	}
	return 1;
}

/* The peer of a put: the same durable write without the hash and the
 * index (temp file, write, fsync, close, rename, fsync of the directory;
 * the fsyncs only when sync), into dir/xx/. */
static void peer_write(const char *dir, uint64_t id, const void *p, size_t n,
		       int sync)
{
	char sub[PATH_MAX], tmp[PATH_MAX], fin[PATH_MAX];
	int a =
	    snprintf(sub, sizeof(sub), "%s/%02x", dir, (unsigned)(id & 255));
	int b = snprintf(tmp, sizeof(tmp), "%s/.tmp.%llx", sub,
			 (unsigned long long)id);
	int e =
	    snprintf(fin, sizeof(fin), "%s/%llx", sub, (unsigned long long)id);
	if (a < 0 || b < 0 || e < 0 || (size_t)b >= sizeof(tmp) ||
	    (size_t)e >= sizeof(fin))
		exit(1);
	if (mkdir(sub, 0755) != 0 && errno != EEXIST)
		goto fail;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		goto fail;
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, (const uint8_t *)p + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			goto fail;
		off += (size_t)w;
	}
	if ((sync && fsync(fd) != 0) || close(fd) != 0 || rename(tmp, fin) != 0)
		goto fail;
	if (sync) {
		int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || fsync(dfd) != 0)
			goto fail;
		close(dfd);
	}
	return;
fail:
	fprintf(stderr, "bench_cache: peer write %s: %s\n", fin,
		strerror(errno));
	exit(1);
}

static void bench_puts(void)
{
	char err[512] = "";
	/* at most ~2 GB/s for put_seconds per size, plus the watermark */
	if (!enough_space((uint64_t)(put_seconds * 2.5e9) + (2ull << 30), 1e5,
			  put_why, sizeof(put_why))) {
		put_skipped = 1;
		printf("put throughput: skipped: %s\n\n", put_why);
		return;
	}
	printf("put throughput: fresh store, distinct blobs, %.0f s per size; "
	       "peer = temp file + write + close + rename (+ fsync of file and "
	       "dir when kiln fsyncs), alternating with the puts; puts/s and "
	       "MB/s over the time spent in kiln_cache_put\n",
	       put_seconds);
	printf("  %-9s %-7s %6s %8s %8s %9s %9s %9s %9s %7s\n", "mode", "size",
	       "puts", "puts/s", "MB/s", "p50 us", "p99 us", "peer p50",
	       "peer p99", "ratio");
	uint8_t *buf = xmalloc(sizes[N_SIZES - 1]);
	uint64_t counter = 0;
	for (int nf = 0; nf < 2; nf++) {
		char dir[PATH_MAX], pdir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s/puts-%s", base_dir,
			 nf ? "nofsync" : "fsync");
		snprintf(pdir, sizeof(pdir), "%s/peer-%s", base_dir,
			 nf ? "nofsync" : "fsync");
		if (mkdir(pdir, 0755) != 0) {
			fprintf(stderr, "bench_cache: mkdir %s: %s\n", pdir,
				strerror(errno));
			exit(1);
		}
		kiln_cache_options_t o;
		kiln_cache_options_init(&o);
		o.no_fsync = nf;
		kiln_cache_t *c;
		int rc = kiln_cache_open(dir, &o, &c, err, sizeof(err));
		if (rc != 0)
			die_kiln("open", rc, err);
		for (int s = 0; s < N_SIZES; s++) {
			size_t cap = 1024, n = 0;
			uint64_t *kl = xmalloc(cap * sizeof(*kl));
			uint64_t *pl = xmalloc(cap * sizeof(*pl));
			uint64_t in_kiln = 0;
			fill(buf, sizes[s], TAG_PUT, (uint64_t)s);
			uint64_t limit =
			    now_ns() + (uint64_t)(put_seconds * 1e9);
			do {
				uint8_t key[KILN_CACHE_KEY_BYTES];
				counter++;
				memcpy(buf + 8, &counter, 8); /* distinct */
				make_key(TAG_PUT, counter, key);
				if (n == cap) {
					cap *= 2;
					kl = realloc(kl, cap * sizeof(*kl));
					pl = realloc(pl, cap * sizeof(*pl));
					if (kl == NULL || pl == NULL)
						exit(1);
				}
				uint64_t t0 = now_ns();
				rc = kiln_cache_put(c, key, buf, sizes[s], NULL,
						    err, sizeof(err));
				uint64_t t1 = now_ns();
				if (rc != 0)
					die_kiln("put", rc, err);
				peer_write(pdir, counter, buf, sizes[s], !nf);
				pl[n] = now_ns() - t1;
				kl[n++] = t1 - t0;
				in_kiln += t1 - t0;
			} while (n < 3 || now_ns() < limit);
			double secs = (double)in_kiln / 1e9;
			put_row_t *r = &put_rows[nf][s];
			r->puts = n;
			r->puts_s = (double)n / secs;
			r->mbs = (double)n * (double)sizes[s] / secs / MB;
			r->p50 = pct_us(kl, n, 50);
			r->p99 = pct_sorted_us(kl, n, 99);
			r->peer_p50 = pct_us(pl, n, 50);
			r->peer_p99 = pct_sorted_us(pl, n, 99);
			printf("  %-9s %-7s %6zu %8.0f %8.1f %9.1f %9.1f %9.1f "
			       "%9.1f %6.2fx\n",
			       nf ? "no_fsync" : "fsync", size_names[s],
			       r->puts, r->puts_s, r->mbs, r->p50, r->p99,
			       r->peer_p50, r->peer_p99, r->p50 / r->peer_p50);
			fflush(stdout);
			free(kl);
			free(pl);
		}
		kiln_cache_close(c);
		rm_tree(dir);
		rm_tree(pdir);
	}
	free(buf);
	printf("\n");
}

/* ---- one index size ----------------------------------------------------- */

typedef struct probe {
	uint8_t key[KILN_CACHE_KEY_BYTES];
	uint8_t sha[32];
	char path[PATH_MAX];
} probe_t;

static probe_t probes[N_SIZES][PROBES];

static void populate(kiln_cache_t *c, const char *dir, n_result_t *r)
{
	char err[512] = "";
	uint8_t buf[SMALL_MIN + SMALL_SPAN], key[KILN_CACHE_KEY_BYTES];
	uint64_t step = r->n / 10 ? r->n / 10 : 1;
	uint64_t t0 = now_ns(), tl = t0;
	for (uint64_t i = 0; i < r->n; i++) {
		size_t sz = small_size(i);
		fill(buf, sz, TAG_POP, i);
		make_key(TAG_POP, i, key);
		int rc =
		    kiln_cache_put(c, key, buf, sz, NULL, err, sizeof(err));
		if (rc != 0)
			die_kiln("populate: put", rc, err);
		if ((i + 1) % step == 0 && r->n >= 100000) {
			uint64_t t = now_ns();
			fprintf(stderr,
				"  populate: %llu / %llu, %.0f puts/s over the "
				"last %llu\n",
				(unsigned long long)(i + 1),
				(unsigned long long)r->n,
				(double)step / ((double)(t - tl) / 1e9),
				(unsigned long long)step);
			tl = t;
		}
	}
	double secs = (double)(now_ns() - t0) / 1e9;
	r->pop_rate = (double)r->n / secs;
	printf("  populate: %llu small entries (64-200 B, one blob each), "
	       "no_fsync: %.1f s, %.0f puts/s\n",
	       (unsigned long long)r->n, secs, r->pop_rate);

	uint8_t *big = xmalloc(sizes[N_SIZES - 1]);
	uint64_t bytes = 0;
	t0 = now_ns();
	for (int s = 0; s < N_SIZES; s++) {
		for (int j = 0; j < PROBES; j++) {
			probe_t *p = &probes[s][j];
			uint64_t id = (uint64_t)s * PROBES + (uint64_t)j;
			fill(big, sizes[s], TAG_PROBE, id);
			make_key(TAG_PROBE, id, p->key);
			sha256(big, sizes[s], p->sha);
			blob_path(dir, p->sha, p->path, sizeof(p->path));
			int rc = kiln_cache_put(c, p->key, big, sizes[s], NULL,
						err, sizeof(err));
			if (rc != 0)
				die_kiln("probe: put", rc, err);
			bytes += sizes[s];
		}
	}
	secs = (double)(now_ns() - t0) / 1e9;
	r->probe_mbs = (double)bytes / secs / MB;
	printf("  probes: %d each of 4 KB, 256 KB, 4 MB, no_fsync: %.2f s, "
	       "%.0f MB/s\n",
	       PROBES, secs, r->probe_mbs);
	free(big);
}

static void print_stats(kiln_cache_t *c, const char *when)
{
	char err[512] = "";
	kiln_cache_stats_t st;
	int rc = kiln_cache_stats(c, &st, err, sizeof(err));
	if (rc != 0)
		die_kiln("stats", rc, err);
	printf(
	    "  stats %s: entries %llu, blobs %llu, bytes %llu, "
	    "index_bytes %llu, hits %llu, misses %llu, touch_flushes "
	    "%llu, dedup_puts %llu, evictions %llu, corrupt_dropped %llu\n",
	    when, (unsigned long long)st.entries, (unsigned long long)st.blobs,
	    (unsigned long long)st.bytes, (unsigned long long)st.index_bytes,
	    (unsigned long long)st.hits, (unsigned long long)st.misses,
	    (unsigned long long)st.touch_flushes,
	    (unsigned long long)st.dedup_puts, (unsigned long long)st.evictions,
	    (unsigned long long)st.corrupt_dropped);
}

/* Sizes of the closed store's files. */
static void measure_files(const char *dir, n_result_t *r)
{
	char path[PATH_MAX + 512];
	uint64_t db, db_a, wal, wal_a, shm, shm_a;
	snprintf(path, sizeof(path), "%s/index.db", dir);
	file_size(path, &db, &db_a);
	snprintf(path, sizeof(path), "%s/index.db-wal", dir);
	file_size(path, &wal, &wal_a);
	snprintf(path, sizeof(path), "%s/index.db-shm", dir);
	file_size(path, &shm, &shm_a);
	r->index_size = db_a + wal_a;
	printf("  index after flush + close: index.db %.1f MB (%.1f MB "
	       "allocated), -wal %.1f MB, -shm %.3f MB; %.0f bytes/entry\n",
	       db / MB, db_a / MB, wal / MB, shm / MB,
	       (double)(db_a + wal_a) / (double)(r->n + N_SIZES * PROBES));

	/* everything else at the top: the journal, the lock, ... */
	DIR *d = opendir(dir);
	r->journal_size = 0;
	printf("  other files at the top:");
	for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (strncmp(e->d_name, "index.db", 8) == 0 ||
		    stat(path, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		printf(" %s %.1f MB;", e->d_name, (double)st.st_size / MB);
		if (strstr(e->d_name, "journal") != NULL)
			r->journal_size += (uint64_t)st.st_blocks * 512;
	}
	printf("\n");
	if (d != NULL)
		closedir(d);

	snprintf(path, sizeof(path), "%s/objects", dir);
	walk_bytes = walk_alloc = walk_files = 0;
	nftw(path, walk_cb, 64, FTW_PHYS);
	r->objects_files = walk_files;
	r->objects_alloc = walk_alloc;
	printf("  objects/: %llu files, %.1f MB of bytes, %.1f MB allocated\n",
	       (unsigned long long)walk_files, walk_bytes / MB,
	       walk_alloc / MB);
}

/* ---- hits ---------------------------------------------------------------- */

/* One timed get + release of key, which must hit with `expect` bytes. */
static uint64_t time_get(kiln_cache_t *c, const uint8_t *key, size_t expect)
{
	char err[512];
	kiln_cache_blob_t b;
	err[0] = '\0';
	uint64_t t0 = now_ns();
	int rc = kiln_cache_get(c, key, &b, err, sizeof(err));
	size_t got = 0;
	if (rc == 0) {
		got = b.size;
		sink += b.data[got / 2];
		kiln_cache_blob_release(&b);
	}
	uint64_t t = now_ns() - t0;
	if (rc != 0)
		die_kiln("get", rc, err);
	if (got != expect) {
		fprintf(stderr,
			"bench_cache: get returned %zu bytes, not %zu\n", got,
			expect);
		exit(1);
	}
	return t;
}

/* One timed peer read of path, which must hold `expect` bytes. */
static uint64_t time_peer(const char *path, size_t expect)
{
	uint64_t t0 = now_ns();
	long n = peer_read(path, NULL);
	uint64_t t = now_ns() - t0;
	if (n != (long)expect) {
		fprintf(stderr,
			"bench_cache: peer read of %s: %s (blob layout is not "
			"objects/ab/<62 hex>?)\n",
			path, n < 0 ? strerror(errno) : "wrong size");
		exit(1);
	}
	return t;
}

/* Every probe once, untimed: checks the bytes, the blob's name and its path
 * (the peer's), and brings it all into the page cache. */
static void warm_and_check(kiln_cache_t *c)
{
	char err[512] = "";
	uint8_t *want = xmalloc(sizes[N_SIZES - 1]);
	for (int s = 0; s < N_SIZES; s++) {
		for (int j = 0; j < PROBES; j++) {
			probe_t *p = &probes[s][j];
			kiln_cache_blob_t b;
			int rc =
			    kiln_cache_get(c, p->key, &b, err, sizeof(err));
			if (rc != 0)
				die_kiln("warm-up get", rc, err);
			fill(want, sizes[s], TAG_PROBE,
			     (uint64_t)s * PROBES + (uint64_t)j);
			if (b.size != sizes[s] ||
			    memcmp(b.data, want, sizes[s]) != 0 ||
			    memcmp(b.entry.blob, p->sha, 32) != 0) {
				fprintf(stderr,
					"bench_cache: probe %d/%d: "
					"wrong bytes or blob name\n",
					s, j);
				exit(1);
			}
			kiln_cache_blob_release(&b);
			time_peer(p->path, sizes[s]);
		}
	}
	free(want);
}

/* What writing hits costs: FLUSH_HITS hits queued with kiln_cache_touch
 * (below the batch, so none is written on the way), then one timed
 * kiln_cache_flush; the median of FLUSH_ROUNDS, per hit, in us. The keys
 * are random entries of the whole index, or the 4 KB probes. */
#define FLUSH_HITS   200
#define FLUSH_ROUNDS 15

static double flush_cost(kiln_cache_t *c, const n_result_t *r, int probe)
{
	char err[512] = "";
	uint64_t t[FLUSH_ROUNDS];
	int rc = kiln_cache_flush(c, err, sizeof(err));
	if (rc != 0)
		die_kiln("flush", rc, err);
	for (int k = 0; k < FLUSH_ROUNDS; k++) {
		for (int j = 0; j < FLUSH_HITS; j++) {
			uint8_t key[KILN_CACHE_KEY_BYTES];
			if (probe)
				memcpy(key, probes[0][rnd(PROBES)].key,
				       sizeof(key));
			else
				make_key(TAG_POP, rnd(r->n), key);
			rc = kiln_cache_touch(c, key, err, sizeof(err));
			if (rc != 0)
				die_kiln("touch", rc, err);
		}
		uint64_t t0 = now_ns();
		rc = kiln_cache_flush(c, err, sizeof(err));
		t[k] = now_ns() - t0;
		if (rc != 0)
			die_kiln("flush", rc, err);
	}
	double ms = pct_us(t, FLUSH_ROUNDS, 50) / 1e3;
	printf("  writing %d queued hits (kiln_cache_flush, median of %d), "
	       "%s: %.2f ms, %.1f us per hit\n",
	       FLUSH_HITS, FLUSH_ROUNDS,
	       probe ? "64 hot 4 KB probes" : "random keys of the index", ms,
	       ms * 1e3 / FLUSH_HITS);
	return ms * 1e3 / FLUSH_HITS;
}

static void hits(kiln_cache_t *c, n_result_t *r)
{
	printf("  hits, warm, random order (kiln and peer alternate per "
	       "probe):\n");
	printf("    %-7s %6s %9s %9s %9s %9s %9s %9s %7s\n", "size", "gets",
	       "kiln p50", "kiln p99", "kiln mean", "peer p50", "peer p99",
	       "peer mean", "ratio");
	for (int s = 0; s <= N_SIZES; s++) {
		int small = s == N_SIZES;
		size_t n = small ? gets_base : gets_base / get_div[s];
		if (n < 50)
			n = 50;
		uint64_t *kl = xmalloc(n * sizeof(*kl));
		uint64_t *pl = xmalloc(n * sizeof(*pl));
		uint8_t buf[SMALL_MIN + SMALL_SPAN], sha[32], key[32];
		char path[PATH_MAX];
		for (size_t k = 0; k < n; k++) {
			const uint8_t *kp;
			const char *pp;
			size_t sz;
			if (small) {
				uint64_t i = rnd(r->n);
				sz = small_size(i);
				fill(buf, sz, TAG_POP, i);
				sha256(buf, sz, sha);
				blob_path(kiln_cache_dir(c), sha, path,
					  sizeof(path));
				make_key(TAG_POP, i, key);
				kp = key;
				pp = path;
			} else {
				probe_t *p = &probes[s][rnd(PROBES)];
				kp = p->key;
				pp = p->path;
				sz = sizes[s];
			}
			if (k & 1) {
				pl[k] = time_peer(pp, sz);
				kl[k] = time_get(c, kp, sz);
			} else {
				kl[k] = time_get(c, kp, sz);
				pl[k] = time_peer(pp, sz);
			}
		}
		hit_row_t *h = &r->hit[s];
		h->gets = n;
		h->kiln_mean = mean_us(kl, n);
		h->kiln_p50 = pct_us(kl, n, 50);
		h->kiln_p99 = pct_sorted_us(kl, n, 99);
		h->peer_mean = mean_us(pl, n);
		h->peer_p50 = pct_us(pl, n, 50);
		h->peer_p99 = pct_sorted_us(pl, n, 99);
		printf("    %-7s %6zu %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f "
		       "%6.2fx\n",
		       small ? "small" : size_names[s], n, h->kiln_p50,
		       h->kiln_p99, h->kiln_mean, h->peer_p50, h->peer_p99,
		       h->peer_mean, h->kiln_p50 / h->peer_p50);
		fflush(stdout);

		/* SHA-256 alone, over bytes just read as the peer reads them */
		for (size_t k = 0; k < n; k++) {
			uint8_t *data;
			long len;
			if (small) {
				uint64_t i = rnd(r->n);
				len = (long)small_size(i);
				fill(buf, (size_t)len, TAG_POP, i);
				sha256(buf, (size_t)len, sha);
				blob_path(kiln_cache_dir(c), sha, path,
					  sizeof(path));
				len = peer_read(path, &data);
			} else {
				len = peer_read(probes[s][rnd(PROBES)].path,
						&data);
			}
			if (len < 0)
				exit(1);
			uint64_t t0 = now_ns();
			sha256(data, (size_t)len, sha);
			uint64_t t1 = now_ns();
			crc_sink = kiln__crc64(0, data, (size_t)len);
			kl[k] = t1 - t0;
			pl[k] = now_ns() - t1;
			free(data);
		}
		h->sha_p50 = pct_us(kl, n, 50);
		h->crc_p50 = pct_us(pl, n, 50);
		free(kl);
		free(pl);
	}

	/* the index alone: a miss, and a touch (lookup + the hit's record) */
	size_t n = gets_base;
	uint64_t *ml = xmalloc(n * sizeof(*ml));
	uint64_t *tl = xmalloc(n * sizeof(*tl));
	for (size_t k = 0; k < n; k++) {
		char err[512] = "";
		uint8_t key[KILN_CACHE_KEY_BYTES];
		kiln_cache_blob_t b;
		make_key(TAG_ABSENT, k, key);
		uint64_t t0 = now_ns();
		int rc = kiln_cache_get(c, key, &b, err, sizeof(err));
		ml[k] = now_ns() - t0;
		if (rc != KILN_ENOTFOUND)
			die_kiln("get of an absent key", rc, err);
		make_key(TAG_POP, rnd(r->n), key);
		t0 = now_ns();
		rc = kiln_cache_touch(c, key, err, sizeof(err));
		tl[k] = now_ns() - t0;
		if (rc != 0)
			die_kiln("touch", rc, err);
	}
	r->miss_p50 = pct_us(ml, n, 50);
	r->touch_p50 = pct_us(tl, n, 50);
	printf("  index alone (%zu each): get of an absent key p50 %.1f us, "
	       "p99 %.1f us; touch p50 %.1f us, p99 %.1f us\n",
	       n, r->miss_p50, pct_sorted_us(ml, n, 99), r->touch_p50,
	       pct_sorted_us(tl, n, 99));
	free(ml);
	free(tl);
	r->flush_rand_us = flush_cost(c, r, 0);
	r->flush_probe_us = flush_cost(c, r, 1);

	printf("  breakdown of a hit, p50 us: %10s %10s %10s %10s\n",
	       size_names[0], size_names[1], size_names[2], "small");
	printf("    %-34s", "peer read (open..close)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %10.1f", r->hit[s].peer_p50);
	printf("\n    %-34s", "CRC-64 alone (ISA-L)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %10.1f", r->hit[s].crc_p50);
	printf("\n    %-34s", "SHA-256 alone (put, verify)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %10.1f", r->hit[s].sha_p50);
	printf("\n    %-34s", "key lookup alone (absent-key get)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %10.1f", r->miss_p50);
	printf("\n    %-34s", "kiln get (measured)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %10.1f", r->hit[s].kiln_p50);
	printf("\n    %-34s", "kiln / (peer + CRC-64)");
	for (int s = 0; s <= N_SIZES; s++)
		printf(" %9.2fx", r->hit[s].kiln_p50 /
				      (r->hit[s].peer_p50 + r->hit[s].crc_p50));
	printf("\n");
}

/* ---- one index size, start to end -------------------------------------- */

static void run_n(n_result_t *r)
{
	char dir[PATH_MAX], err[512] = "";
	uint64_t probe_bytes = 0;
	for (int s = 0; s < N_SIZES; s++)
		probe_bytes += (uint64_t)PROBES * sizes[s];
	/* a block, an inode and ~600 bytes of index + journal per entry, the
	 * probes, the store's own free-space watermark (<= 1 GiB) and 1 GiB */
	uint64_t need = r->n * (4096 + 600) + probe_bytes + (2ull << 30);
	printf("N = %llu entries\n", (unsigned long long)r->n);
	if (!enough_space(need, r->n + 10000, r->why, sizeof(r->why))) {
		r->skipped = 1;
		printf("  skipped: %s\n\n", r->why);
		return;
	}
	snprintf(dir, sizeof(dir), "%s/store-%llu", base_dir,
		 (unsigned long long)r->n);

	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.no_fsync = 1; /* population speed: a throwaway store */
	kiln_cache_t *c;
	int rc = kiln_cache_open(dir, &o, &c, err, sizeof(err));
	if (rc != 0)
		die_kiln("open", rc, err);
	populate(c, dir, r);
	print_stats(c, "after population");
	uint64_t t0 = now_ns();
	rc = kiln_cache_flush(c, err, sizeof(err));
	if (rc != 0)
		die_kiln("flush", rc, err);
	kiln_cache_close(c);
	printf("  flush + close: %.1f ms\n", (double)(now_ns() - t0) / 1e6);
	measure_files(dir, r);

	/* reopen as the daemon would: default options */
	kiln_cache_options_init(&o);
	t0 = now_ns();
	rc = kiln_cache_open(dir, &o, &c, err, sizeof(err));
	r->open_ms = (double)(now_ns() - t0) / 1e6;
	if (rc != 0)
		die_kiln("reopen", rc, err);
	printf("  open of the populated store (default options, quick_check "
	       "included, warm): %.1f ms\n",
	       r->open_ms);
	warm_and_check(c);
	hits(c, r);
	print_load("  ", "after the gets");
	print_stats(c, "after gets");
	kiln_cache_close(c);
	t0 = now_ns();
	rm_tree(dir);
	fprintf(stderr, "  removed the store in %.1f s\n",
		(double)(now_ns() - t0) / 1e9);
	printf("\n");
}

/* ---- summary, main ------------------------------------------------------ */

static void summary(const n_result_t *res, size_t nres)
{
	printf("summary (us; ratio = kiln p50 / peer p50, target <= 1.5; "
	       "peer = open+fstat+read+close of the blob file):\n");
	printf("  %-8s %-7s %9s %9s %9s %9s %9s %9s %7s %6s\n", "entries",
	       "size", "kiln p50", "kiln p99", "kiln mean", "peer p50",
	       "peer p99", "peer mean", "ratio", "target");
	for (size_t i = 0; i < nres; i++) {
		const n_result_t *r = &res[i];
		if (r->skipped) {
			printf("  %-8llu skipped: %s\n",
			       (unsigned long long)r->n, r->why);
			continue;
		}
		for (int s = 0; s <= N_SIZES; s++) {
			const hit_row_t *h = &r->hit[s];
			double ratio = h->kiln_p50 / h->peer_p50;
			printf("  %-8llu %-7s %9.1f %9.1f %9.1f %9.1f %9.1f "
			       "%9.1f %6.2fx %6s\n",
			       (unsigned long long)r->n,
			       s == N_SIZES ? "small" : size_names[s],
			       h->kiln_p50, h->kiln_p99, h->kiln_mean,
			       h->peer_p50, h->peer_p99, h->peer_mean, ratio,
			       ratio <= 1.5 ? "met" : "MISS");
		}
	}
	printf("\n  %-8s %10s %10s %11s %9s %10s %12s %8s\n", "entries",
	       "index MB", "B/entry", "journal MB", "open ms", "populate/s",
	       "objects MB", "target");
	for (size_t i = 0; i < nres; i++) {
		const n_result_t *r = &res[i];
		if (r->skipped)
			continue;
		/* the target is for 1M entries: scale the index to it */
		double per =
		    (double)r->index_size / (double)(r->n + N_SIZES * PROBES);
		printf("  %-8llu %10.1f %10.0f %11.1f %9.1f %10.0f %12.1f "
		       "%8s\n",
		       (unsigned long long)r->n, r->index_size / MB, per,
		       r->journal_size / MB, r->open_ms, r->pop_rate,
		       r->objects_alloc / MB,
		       per * 1e6 <= 300e6 ? "met" : "MISS");
	}
	printf("  (index MB: index.db + -wal allocated after close; target: "
	       "1M entries <= 300 MB, i.e. <= 300 B/entry)\n");
	printf("\n  %-8s %15s %15s %15s %15s\n", "entries", "write/hit rnd",
	       "write/hit hot", "lookup p50", "touch p50");
	for (size_t i = 0; i < nres; i++) {
		const n_result_t *r = &res[i];
		if (r->skipped)
			continue;
		printf("  %-8llu %15.1f %15.1f %15.1f %15.1f\n",
		       (unsigned long long)r->n, r->flush_rand_us,
		       r->flush_probe_us, r->miss_p50, r->touch_p50);
	}
	printf("  (us; write/hit: kiln_cache_flush of %d queued hits over "
	       "random keys of the index (rnd) or the 64 4 KB probes (hot), "
	       "per hit; lookup: get of an absent key; touch: lookup + "
	       "queueing a hit)\n",
	       FLUSH_HITS);
	if (put_skipped) {
		printf("\n  puts: skipped: %s\n", put_why);
		return;
	}
	printf("\n  %-9s %-7s %8s %8s %9s %9s %9s %9s %7s\n", "puts", "size",
	       "puts/s", "MB/s", "p50 us", "p99 us", "peer p50", "peer p99",
	       "ratio");
	for (int nf = 0; nf < 2; nf++)
		for (int s = 0; s < N_SIZES; s++) {
			const put_row_t *p = &put_rows[nf][s];
			printf("  %-9s %-7s %8.0f %8.1f %9.1f %9.1f %9.1f "
			       "%9.1f %6.2fx\n",
			       nf ? "no_fsync" : "fsync", size_names[s],
			       p->puts_s, p->mbs, p->p50, p->p99, p->peer_p50,
			       p->peer_p99, p->p50 / p->peer_p50);
		}
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_cache [--dir D] [--entries N[,N...]]... "
			"[--gets N] [--quick]\n");
	exit(2);
}

static uint64_t parse_u64(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v == 0 || *s == '-')
		usage();
	return v;
}

int main(int argc, char **argv)
{
	const char *parent = "/var/tmp";
	n_result_t res[MAX_ENTRIES];
	size_t nres = 0;
	memset(res, 0, sizeof(res));
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
			parent = argv[++i];
		} else if (strcmp(argv[i], "--entries") == 0 && i + 1 < argc) {
			char *list = argv[++i], *save = NULL;
			for (char *t = strtok_r(list, ",", &save); t != NULL;
			     t = strtok_r(NULL, ",", &save)) {
				if (nres == MAX_ENTRIES)
					usage();
				res[nres++].n = parse_u64(t);
			}
		} else if (strcmp(argv[i], "--gets") == 0 && i + 1 < argc) {
			gets_base = (size_t)parse_u64(argv[++i]);
		} else if (strcmp(argv[i], "--quick") == 0) {
			quick = 1;
		} else {
			usage();
		}
	}
	if (nres == 0) {
		res[nres++].n = 10000;
		if (!quick)
			res[nres++].n = 1000000;
	}
	if (quick)
		put_seconds = 1.0;

	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
	sha_ctx = EVP_MD_CTX_new();
	if (sha256_md == NULL || sha_ctx == NULL) {
		fprintf(stderr, "bench_cache: no SHA-256 in libcrypto\n");
		return 1;
	}
	int bl = snprintf(base_dir, sizeof(base_dir), "%s/bench_cache.XXXXXX",
			  parent);
	if (bl < 0 || (size_t)bl >= sizeof(base_dir)) {
		fprintf(stderr, "bench_cache: --dir: path too long\n");
		return 2;
	}
	if (mkdtemp(base_dir) == NULL) {
		fprintf(stderr, "bench_cache: mkdtemp %s: %s\n", base_dir,
			strerror(errno));
		return 1;
	}
	printf("bench_cache: stores under %s (removed at the end); %d probes "
	       "per size; MB = 10^6 bytes, KB = 1024; CLOCK_MONOTONIC\n",
	       base_dir, PROBES);
	print_load("", "at the start");
	printf("\n");
	fflush(stdout);

	bench_puts();
	for (size_t i = 0; i < nres; i++) {
		run_n(&res[i]);
		fflush(stdout);
	}
	summary(res, nres);
	printf("\n");
	print_load("", "at the end");
	rm_tree(base_dir);
	EVP_MD_CTX_free(sha_ctx);
	EVP_MD_free(sha256_md);
	return 0;
}
