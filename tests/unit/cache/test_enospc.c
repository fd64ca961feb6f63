/*
 * test_enospc.c — the kernel store (cache/) on a full and on a read-only
 * filesystem. Needs root and mount(2): each test mounts a 4 MiB tmpfs on a
 * fresh temporary directory (in a private mount namespace when unshare(2)
 * allows, so nothing outlives the test process) and skips itself, saying
 * why, when it cannot.
 *
 * Full: 200 KiB puts until one fails; it must fail with -ENOSPC and an
 * error naming the path; every acknowledged entry still reads back, no
 * temp file is left, a further put fails the same clean way, and evicting
 * some entries lets puts succeed again.
 *
 * Read-only: the filesystem goes read-only under an open store; a put must
 * fail with a negative code (-EROFS expected, another clear code accepted)
 * and an error text, and gets
 * still return the stored bytes. A tmpfs with files open for writing (the
 * store's index) cannot be remounted read-only (EBUSY), so when that
 * happens the test bind-mounts the directory over itself and makes that
 * mount read-only: every path lookup from then on sees a read-only
 * filesystem, while descriptors opened before keep writing.
 *
 * The fini closes the store and unmounts in every case.
 */
#include "helpers.h"

#include <sched.h>
#include <sys/mount.h>

#define PUT_SIZE (200 * KIB)

static char *root;	    /* the mount point */
static char sdir[PATH_MAX]; /* the store: <root>/store */
static bool mounted, bind_mounted;
static char skip_reason[256];
static kiln_cache_t *store;

static void setup(void)
{
	if (geteuid() != 0) {
		snprintf(skip_reason, sizeof(skip_reason),
			 "needs root to mount a tmpfs (euid %d)",
			 (int)geteuid());
		return;
	}
	/* Our own mount namespace: the tmpfs goes with the process even if
	 * it dies before the fini. Optional. */
	if (unshare(CLONE_NEWNS) == 0)
		mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
	root = tmpdir_new();
	if (mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV,
		  "size=4m,mode=0755") != 0) {
		snprintf(skip_reason, sizeof(skip_reason),
			 "mount(tmpfs, %s): %s", root, strerror(errno));
		return;
	}
	mounted = true;
	path_fmt(sdir, "%s/store", root);
}

static void unmount(const char *what)
{
	if (umount2(root, 0) != 0) {
		fprintf(stderr, "umount %s %s: %s; detaching\n", what, root,
			strerror(errno));
		umount2(root, MNT_DETACH);
	}
}

static void teardown(void)
{
	kiln_cache_close(store);
	store = NULL;
	if (bind_mounted)
		unmount("(bind)");
	if (mounted)
		unmount("(tmpfs)");
	bind_mounted = mounted = false;
	if (root != NULL) {
		rm_rf(root);
		free(root);
		root = NULL;
	}
}

TestSuite(enospc, .init = setup, .fini = teardown);

static void skip_unless_mounted(void)
{
	if (!mounted) {
		fprintf(stderr, "test_enospc: skipped: %s\n", skip_reason);
		cr_skip_test("%s", skip_reason);
	}
}

static int put_rc(uint64_t n, size_t size, char *err, size_t errlen)
{
	uint8_t key[KILN_CACHE_KEY_BYTES];
	key_of(n, key);
	uint8_t *b = gen_bytes(n, size);
	err[0] = '\0';
	int rc = kiln_cache_put(store, key, b, size, NULL, err, errlen);
	free(b);
	return rc;
}

Test(enospc, full_filesystem)
{
	skip_unless_mounted();
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.max_bytes = (uint64_t)1 << 30;
	o.min_free_bytes = 1;
	store = store_open(sdir, &o);

	char err[512];
	int rc = 0;
	uint64_t acked = 0;
	while (acked < 100) {
		rc = put_rc(acked, PUT_SIZE, err, sizeof(err));
		if (rc != 0)
			break;
		acked++;
	}
	fprintf(stderr,
		"enospc: %llu puts of %zu bytes fit; then %d (%s): "
		"%s\n",
		(unsigned long long)acked, PUT_SIZE, rc, kiln_strerror(rc),
		err);
	cr_assert_neq(rc, 0, "100 puts of 200 KiB fit on a 4 MiB tmpfs");
	cr_assert_eq(rc, -ENOSPC, "put on a full fs: %d (%s): %s", rc,
		     kiln_strerror(rc), err);
	cr_assert_not_null(strstr(err, sdir),
			   "the error does not name the path: \"%s\"", err);
	cr_assert_gt(acked, 3, "only %llu puts fit", (unsigned long long)acked);

	/* Nothing stored was touched, nothing half-written is left. */
	for (uint64_t n = 0; n < acked; n++)
		expect_gen(store, n, PUT_SIZE);
	expect_miss(store, acked);
	objects_census_t oc = objects_census(sdir);
	cr_assert_eq(oc.temps, 0, "%zu temp files left", oc.temps);
	cr_assert_eq(oc.blobs, acked);
	kiln_cache_stats_t s = stats_of(store);
	cr_assert_eq(s.entries, acked);
	cr_assert_eq(s.puts, acked);
	cr_assert_geq(s.put_errors, 1);

	/* A further put fails the same clean way. */
	rc = put_rc(1000, PUT_SIZE, err, sizeof(err));
	cr_assert_eq(rc, -ENOSPC, "second put on a full fs: %d (%s): %s", rc,
		     kiln_strerror(rc), err);
	cr_assert_not_null(strstr(err, sdir), "\"%s\"", err);
	cr_assert_eq(objects_census(sdir).temps, 0);
	for (uint64_t n = 0; n < acked; n++)
		expect_gen(store, n, PUT_SIZE);

	/* Evicting some entries makes room again. */
	for (uint64_t n = 0; n < 4; n++) {
		uint8_t key[KILN_CACHE_KEY_BYTES];
		key_of(n, key);
		rc = kiln_cache_evict(store, key, err, sizeof(err));
		cr_assert_eq(rc, 0, "evict %llu on a full fs: %s: %s",
			     (unsigned long long)n, kiln_strerror(rc), err);
	}
	rc = put_rc(1001, PUT_SIZE, err, sizeof(err));
	cr_assert_eq(rc, 0, "put after evictions: %d (%s): %s", rc,
		     kiln_strerror(rc), err);
	expect_gen(store, 1001, PUT_SIZE);
	for (uint64_t n = 4; n < acked; n++)
		expect_gen(store, n, PUT_SIZE);
	cr_assert_eq(objects_census(sdir).temps, 0);

	/* And the store survives a reopen on the still nearly full fs. */
	kiln_cache_close(store);
	store = store_open(sdir, &o);
	for (uint64_t n = 4; n < acked; n++)
		expect_gen(store, n, PUT_SIZE);
	expect_gen(store, 1001, PUT_SIZE);
	kiln_cache_close(store);
	store = NULL;
	expect_quick_check(sdir);
}

Test(enospc, read_only_filesystem)
{
	skip_unless_mounted();
	kiln_cache_options_t o;
	kiln_cache_options_init(&o);
	o.max_bytes = (uint64_t)1 << 30;
	o.min_free_bytes = 1;
	store = store_open(sdir, &o);
	for (uint64_t n = 0; n < 3; n++)
		put_gen(store, n, 10 * KIB, NULL);

	const char *how = "remount,ro";
	if (mount(NULL, root, NULL, MS_REMOUNT | MS_RDONLY, NULL) != 0) {
		cr_assert_eq(errno, EBUSY, "remount ro: %s", strerror(errno));
		how = "bind,remount,ro";
		cr_assert_eq(mount(root, root, NULL, MS_BIND, NULL), 0,
			     "bind mount: %s", strerror(errno));
		bind_mounted = true;
		cr_assert_eq(mount(NULL, root, NULL,
				   MS_REMOUNT | MS_BIND | MS_RDONLY, NULL),
			     0, "remount bind ro: %s", strerror(errno));
	}
	/* The premise: new files cannot be made there any more. */
	char probe[PATH_MAX];
	path_fmt(probe, "%s/objects/probe", sdir);
	int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
	cr_assert_lt(fd, 0, "%s: created a file on a read-only mount", how);
	cr_assert_eq(errno, EROFS);

	char err[512];
	int rc = put_rc(10, 10 * KIB, err, sizeof(err));
	fprintf(stderr, "enospc: put on a read-only fs (%s): %d (%s): %s\n",
		how, rc, kiln_strerror(rc), err);
	cr_assert_lt(rc, 0, "put on a read-only fs (%s) succeeded", how);
	cr_assert_neq(err[0], '\0', "no error text");
	if (rc != -EROFS)
		cr_log_warn("put on a read-only fs: %d (%s), not -EROFS", rc,
			    kiln_strerror(rc));
	expect_miss(store, 10);
	for (uint64_t n = 0; n < 3; n++)
		expect_gen(store, n, 10 * KIB);
	cr_assert_eq(objects_census(sdir).temps, 0);

	/* Back to read-write: puts work again. */
	if (bind_mounted) {
		cr_assert_eq(umount2(root, 0), 0, "umount bind: %s",
			     strerror(errno));
		bind_mounted = false;
	} else {
		cr_assert_eq(mount(NULL, root, NULL, MS_REMOUNT, NULL), 0,
			     "remount rw: %s", strerror(errno));
	}
	put_gen(store, 11, 10 * KIB, NULL);
	expect_gen(store, 11, 10 * KIB);
	for (uint64_t n = 0; n < 3; n++)
		expect_gen(store, n, 10 * KIB);
	kiln_cache_close(store);
	store = NULL;
	expect_quick_check(sdir);
}
