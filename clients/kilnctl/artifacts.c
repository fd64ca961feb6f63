/*
 * artifacts.c — the commands that handle artifact bytes: `kilnctl compile
 * FILE` (through kilnd; --dump decodes the artifact and prints its
 * kernels, -o writes its bytes) and `kilnctl verify` (opens a stopped
 * kilnd's store with cache/cache.h and re-hashes every blob).
 */
#include "cache/cache.h"
#include "clients/kilnctl/kilnctl.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ======================================================================== */
/* compile                                                                   */
/* ======================================================================== */

/* "cpu", "cpu:x86-64", "cuda:sm_90". */
static bool parse_target(const char *s, kiln_target_t *t)
{
	memset(t, 0, sizeof(*t));
	const char *colon = strchr(s, ':');
	size_t bn = colon != NULL ? (size_t)(colon - s) : strlen(s);
	if (bn >= sizeof(t->backend))
		return false;
	memcpy(t->backend, s, bn);
	if (colon != NULL) {
		if (strlen(colon + 1) == 0 ||
		    strlen(colon + 1) >= sizeof(t->arch))
			return false;
		snprintf(t->arch, sizeof(t->arch), "%s", colon + 1);
	}
	if (strcmp(t->backend, "cpu") == 0)
		return true;
	return strcmp(t->backend, "cuda") == 0 &&
	       strncmp(t->arch, "sm_", 3) == 0 && t->arch[3] >= '0' &&
	       t->arch[3] <= '9';
}

static const char *fmt_dim(const kiln_graph_t *g, kiln_dim_t d, char *buf,
			   size_t n)
{
	if (d.e == NULL)
		snprintf(buf, n, "%" PRId64, d.c);
	else
		kiln_expr_format(g, d.e, buf, n);
	return buf;
}

/* --dump: what the artifact holds, for people. */
static int dump_artifact(ctl_t *x, const uint8_t *p, size_t n)
{
	kiln_artifact_t *a = NULL;
	int rc =
	    kiln_artifact_decode(p, n, &x->lim, &a, x->err, sizeof(x->err));
	if (rc < 0) {
		ctl_errmsg("compile: the artifact does not decode: %s", x->err);
		return EX_ERROR;
	}
	/* symbol names for the expressions: a graph with only symbols */
	kiln_graph_t g;
	memset(&g, 0, sizeof(g));
	g.n_symbols = a->n_symbols;
	g.symbols = a->symbols;
	char b1[64], b2[64], b3[256];
	printf("artifact     %s, %s %s, %s (code %s%s)\n", KILN_ARTIFACT_FORMAT,
	       a->target.backend, a->target.arch,
	       ctl_fmt_bytes(n, b1, sizeof(b1)),
	       ctl_fmt_bytes(a->code_len, b2, sizeof(b2)),
	       a->cubin_len > 0 ? ", cubin" : "");
	printf("symbols      %u", a->n_symbols);
	for (uint32_t i = 0; i < a->n_symbols; i++) {
		const kiln_symbol_t *s = &a->symbols[i];
		printf("%s%s in [%" PRId64 ", ", i == 0 ? ": " : ", ", s->name,
		       s->min);
		if (s->max < 0)
			printf("inf)");
		else
			printf("%" PRId64 "]", s->max);
	}
	putchar('\n');
	printf("inputs       %u, outputs %u (%u output buffers), arena %s "
	       "bytes\n",
	       a->n_inputs, a->n_outputs, a->n_out_buffers,
	       fmt_dim(&g, a->arena_bytes, b3, sizeof(b3)));
	printf("kernels      %u\n", a->n_kernels);
	for (uint32_t k = 0; k < a->n_kernels; k++) {
		const kiln_art_kernel_t *kk = &a->kernels[k];
		printf("  %-4u %-24s extent %s, grain %" PRId64
		       ", %u buffers\n",
		       k, kk->name, fmt_dim(&g, kk->extent, b3, sizeof(b3)),
		       kk->grain, kk->n_bufs);
	}
	uint32_t nk = 0, nf = 0;
	for (uint32_t s = 0; s < a->n_steps; s++)
		if (a->steps[s].kind == KILN_STEP_KERNEL)
			nk++;
		else
			nf++;
	printf("steps        %u: %u kernel, %u fallback\n", a->n_steps, nk, nf);
	for (uint32_t s = 0; s < a->n_steps; s++)
		if (a->steps[s].kind == KILN_STEP_FALLBACK)
			printf("  step %u: fallback %s (node %d)\n", s,
			       a->steps[s].op, a->steps[s].node);
	if (a->kernels_text != NULL && a->kernels_text[0] != '\0') {
		size_t l = strlen(a->kernels_text);
		printf("fusion report:\n%s%s", a->kernels_text,
		       a->kernels_text[l - 1] == '\n' ? "" : "\n");
	}
	kiln_artifact_free(a);
	return EX_OK;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int cmd_compile(ctl_t *x, int argc, char **argv)
{
	const char *file = NULL, *out = NULL, *priority = NULL, *v;
	kiln_target_t target;
	bool has_target = false, dump = false;
	kiln_compile_opts_t opts;
	memset(&opts, 0, sizeof(opts));
	int dynamic = -1;
	for (int i = 1; i < argc; i++) {
		int got;
		const char *a = argv[i];
		if (strcmp(a, "--dump") == 0) {
			dump = true;
		} else if (strcmp(a, "--dynamic") == 0) {
			dynamic = 1;
		} else if (strcmp(a, "--static") == 0) {
			dynamic = 0;
		} else if (strcmp(a, "--batch") == 0) {
			priority = "batch";
		} else if ((got = ctl_opt_value(argc, argv, &i, "--target",
						&v))) {
			if (got < 0)
				return EX_USAGE;
			if (!parse_target(v, &target))
				return ctl_usage_error(
				    "compile: --target %s: want "
				    "cpu or cuda:sm_NN",
				    v);
			has_target = strcmp(target.backend, "cpu") != 0 ||
				     target.arch[0] != '\0';
		} else if ((got =
				ctl_opt_value(argc, argv, &i, "--mode", &v))) {
			if (got < 0)
				return EX_USAGE;
			if (strcmp(v, "default") &&
			    strcmp(v, "reduce-overhead") &&
			    strcmp(v, "max-autotune"))
				return ctl_usage_error(
				    "compile: --mode %s: want "
				    "default, reduce-overhead "
				    "or max-autotune",
				    v);
			snprintf(opts.mode, sizeof(opts.mode), "%s", v);
		} else if ((got = ctl_opt_value(argc, argv, &i, "--output",
						&v)) ||
			   (got = ctl_opt_value(argc, argv, &i, "-o", &v))) {
			if (got < 0)
				return EX_USAGE;
			out = v;
		} else if (a[0] == '-' && a[1] != '\0') {
			return ctl_usage_error("compile: unknown option %s", a);
		} else if (file == NULL) {
			file = a;
		} else {
			return ctl_usage_error("compile: one FILE only (%s)",
					       a);
		}
	}
	if (file == NULL)
		return ctl_usage_error("compile: which FILE? (a Graph v1 "
				       ".msgpack file)");
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		ctl_errmsg("compile: %s: %s", file, strerror(e));
		return e == ENOENT		   ? EX_NOTFOUND
		       : e == EACCES || e == EPERM ? EX_PERM
						   : EX_ERROR;
	}
	close(fd);
	int ex = ctl_connect(x, COMPILE_TIMEOUT_S);
	if (ex != EX_OK)
		return ex;
	kiln_result_t res;
	memset(&res, 0, sizeof(res));
	res.err_node = -1;
	x->err[0] = '\0';
	int rc = kiln_client_compile_file(
	    x->c, file, has_target ? &target : NULL,
	    opts.mode[0] != '\0' ? &opts : NULL, dynamic, priority, &res,
	    x->err, sizeof(x->err));
	if (rc < 0) {
		int node = res.err_node >= 0 && x->err[0] != '\0';
		if (node)
			ctl_errmsg("compile: %s: node %" PRId64 ": %s (%s)",
				   file, res.err_node, x->err,
				   kiln_err_wire_name(rc));
		kiln_result_free(&res);
		return node ? EX_ERROR : ctl_call_failed(x, "compile", rc);
	}
	ex = EX_OK;
	bool to_stdout = out != NULL && strcmp(out, "-") == 0;
	if (out != NULL) {
		int ofd =
		    to_stdout
			? STDOUT_FILENO
			: open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			       0644);
		int wrc = ofd < 0
			      ? -errno
			      : write_all(ofd, res.artifact, res.artifact_len);
		if (ofd >= 0 && !to_stdout && close(ofd) < 0 && wrc == 0)
			wrc = -errno;
		if (wrc < 0) {
			ctl_errmsg("compile: %s: %s",
				   to_stdout ? "stdout" : out, strerror(-wrc));
			ex = EX_ERROR;
		}
	}
	if (!to_stdout && ex == EX_OK) {
		char b1[32], b2[32];
		printf("%s  %s  %s  compile %s\n", res.signature, res.source,
		       ctl_fmt_bytes(res.artifact_len, b1, sizeof(b1)),
		       ctl_fmt_ms(res.compile_ms, b2, sizeof(b2)));
		if (dump)
			ex = dump_artifact(x, res.artifact, res.artifact_len);
	}
	kiln_result_free(&res);
	return ex;
}

/* ======================================================================== */
/* verify                                                                    */
/* ======================================================================== */

/* kilnd's default store_dir (daemon/README.md "Where things are"). */
static void default_store(char *buf, size_t n)
{
	const char *e = getenv("KILN_STORE_DIR");
	if (e != NULL && e[0] != '\0') {
		snprintf(buf, n, "%s", e);
		return;
	}
	e = getenv("CACHE_DIRECTORY"); /* systemd: may be a:b */
	if (e != NULL && e[0] != '\0') {
		snprintf(buf, n, "%.*s", (int)strcspn(e, ":"), e);
		return;
	}
	e = getenv("XDG_CACHE_HOME");
	if (e != NULL && e[0] != '\0') {
		snprintf(buf, n, "%s/kiln", e);
		return;
	}
	e = getenv("HOME");
	snprintf(buf, n, "%s/.cache/kiln", e != NULL && e[0] ? e : "");
}

/* The owner to give back what a root verify created in the store. */
static uid_t owner_uid;
static gid_t owner_gid;

static int chown_root_owned(const char *path, const struct stat *st, int flag,
			    struct FTW *ftw)
{
	(void)flag;
	(void)ftw;
	if (st->st_uid == 0 && lchown(path, owner_uid, owner_gid) < 0)
		ctl_errmsg("verify: chown %s: %s", path, strerror(errno));
	return 0;
}

/*
 * A root operator may verify a store that belongs to kilnd's user: opening
 * it can create files (the SQLite WAL, a rewritten journal) that must not
 * stay root's, or that kilnd could not open afterwards. They are given to
 * the store directory's owner after the store is closed. (Dropping to that
 * user instead would not do: systemd's DynamicUser keeps the path to the
 * store, /var/cache/private, closed to it.)
 */
static void restore_owner(const char *dir, const struct stat *st)
{
	if (geteuid() != 0 || st->st_uid == 0)
		return;
	owner_uid = st->st_uid;
	owner_gid = st->st_gid;
	nftw(dir, chown_root_owned, 16, FTW_PHYS);
}

int cmd_verify(ctl_t *x, int argc, char **argv)
{
	char dir[PATH_MAX];
	const char *v;
	dir[0] = '\0';
	for (int i = 1; i < argc; i++) {
		int got = ctl_opt_value(argc, argv, &i, "--store", &v);
		if (got < 0)
			return EX_USAGE;
		if (got == 0)
			return ctl_usage_error("verify: unknown argument %s",
					       argv[i]);
		snprintf(dir, sizeof(dir), "%s", v);
	}
	if (dir[0] == '\0')
		default_store(dir, sizeof(dir));
	struct stat st;
	char probe[PATH_MAX + 16];
	if (stat(dir, &st) < 0) {
		int e = errno;
		ctl_errmsg("verify: no store at %s (%s; give --store DIR)", dir,
			   strerror(e));
		return e == EACCES ? EX_PERM : EX_NOTFOUND;
	}
	int e1 = 0, e2 = 0;
	snprintf(probe, sizeof(probe), "%s/index.db", dir);
	bool has_index = ctl_exists(probe, &e1);
	snprintf(probe, sizeof(probe), "%s/objects", dir);
	bool has_objects = ctl_exists(probe, &e2);
	if (!S_ISDIR(st.st_mode) || (!has_index && !has_objects)) {
		if (e1 == EACCES || e2 == EACCES) {
			ctl_errmsg("verify: %s: permission denied", dir);
			return EX_PERM;
		}
		ctl_errmsg("verify: %s is not a kiln store (no index.db, no "
			   "objects/; give --store DIR)",
			   dir);
		return EX_NOTFOUND;
	}
	kiln_cache_t *c = NULL;
	x->err[0] = '\0';
	int rc = kiln_cache_open(dir, NULL, &c, x->err, sizeof(x->err));
	if (rc == -EBUSY) {
		const char *p = strstr(x->err, "in use by pid ");
		ctl_errmsg("verify: store %s is in use by pid %ld: stop kilnd "
			   "first (verify needs the store to itself), then run "
			   "kilnctl verify again",
			   dir, p != NULL ? strtol(p + 14, NULL, 10) : 0L);
		return EX_ERROR;
	}
	if (rc < 0) {
		ctl_errmsg("verify: cannot open the store %s: %s", dir,
			   x->err[0] ? x->err : kiln_strerror(rc));
		restore_owner(dir, &st);
		return rc == -EACCES || rc == -EPERM || rc == -EROFS ? EX_PERM
								     : EX_ERROR;
	}
	kiln_cache_stats_t s0;
	kiln_cache_stats(c, &s0, NULL, 0);
	char b1[32], b2[32];
	printf("store %s: %" PRIu64 " %s, %" PRIu64 " %s, %s\n", dir,
	       s0.entries, ctl_plural(s0.entries, "entry", "entries"), s0.blobs,
	       ctl_plural(s0.blobs, "blob", "blobs"),
	       ctl_fmt_bytes(s0.bytes, b1, sizeof(b1)));
	if (s0.orphan_blobs + s0.temp_removed + s0.rebuilds > 0)
		printf("at open: removed %" PRIu64 " orphan %s and %" PRIu64
		       " temp %s%s\n",
		       s0.orphan_blobs,
		       ctl_plural(s0.orphan_blobs, "blob", "blobs"),
		       s0.temp_removed,
		       ctl_plural(s0.temp_removed, "file", "files"),
		       s0.rebuilds > 0 ? ", index rebuilt from the blobs" : "");
	kiln_cache_verify_result_t vr;
	rc = kiln_cache_verify(c, &vr, x->err, sizeof(x->err));
	kiln_cache_close(c);
	restore_owner(dir, &st);
	if (rc < 0) {
		ctl_errmsg("verify: %s: %s", dir,
			   x->err[0] ? x->err : kiln_strerror(rc));
		return EX_ERROR;
	}
	printf("checked %" PRIu64 " %s (%s): %" PRIu64 " bad, %" PRIu64
	       " %s dropped",
	       vr.blobs_checked, ctl_plural(vr.blobs_checked, "blob", "blobs"),
	       ctl_fmt_bytes(vr.bytes_checked, b2, sizeof(b2)), vr.blobs_bad,
	       vr.entries_dropped,
	       ctl_plural(vr.entries_dropped, "entry", "entries"));
	if (vr.checksums_repaired > 0) /* the index row was wrong, not the
					  blob */
		printf(
		    ", %" PRIu64 " index %s rewritten", vr.checksums_repaired,
		    ctl_plural(vr.checksums_repaired, "checksum", "checksums"));
	printf("\n");
	if (vr.blobs_bad > 0) {
		ctl_errmsg("verify: %" PRIu64 " corrupt %s in %s (the "
			   "entries were dropped: the next request for them "
			   "compiles again)",
			   vr.blobs_bad,
			   ctl_plural(vr.blobs_bad, "blob", "blobs"), dir);
		return EX_ERROR;
	}
	return EX_OK;
}
