/*
 * test_config.c — kilnd's settings (daemon/config.c): defaults, the INI
 * file (sections, comments, quotes, suffixes), every error with its
 * file:line, the order file < environment < command line, the command-line
 * forms and flags, kilnd_config_each, the usage text, and the sample config
 * deploy/kilnd.conf.
 *
 * Every test starts with the KILN_* variables of the settings (and
 * KILN_CONFIG) unset and puts them back afterwards. The suite also runs
 * under ASan, which catches leaks on every path exercised here.
 */
#include "daemon/config.h"
#include "protocol/protocol.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KILN_SOURCE_ROOT
#error                                                                         \
    "KILN_SOURCE_ROOT must name the source tree (tests/unit/daemon/meson.build)"
#endif

/* Internal parsers of config.c (the list has no BOOL setting yet). */
int kilnd__config_parse_u64(const char *s, uint64_t max, uint64_t *out,
			    const char **why);
int kilnd__config_parse_bool(const char *s, bool *out);

/* ---- the settings, as the test sees them --------------------------------- */

typedef struct {
	const char *name;
	const char *env;
} name_t;

#define ROW(name, type, def, reload, doc) {#name, NULL},
static name_t names[] = {KILND_SETTINGS(ROW)};
#undef ROW
#define NNAMES (sizeof(names) / sizeof(names[0]))

static int name_index(const char *name)
{
	for (size_t i = 0; i < NNAMES; i++)
		if (strcmp(names[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* ---- environment: unset at init, restored at fini ------------------------ */

#define NVARS (NNAMES + 3)
static char var_names[NVARS][64];
static char *saved[NVARS];

static void env_init(void)
{
	for (size_t i = 0; i < NVARS; i++) {
		if (i < NNAMES) {
			size_t n = (size_t)snprintf(var_names[i], 64, "KILN_%s",
						    names[i].name);
			for (size_t j = 5; j < n; j++)
				if (var_names[i][j] >= 'a' &&
				    var_names[i][j] <= 'z')
					var_names[i][j] -= 32;
			names[i].env = var_names[i];
		} else if (i == NNAMES) {
			strcpy(var_names[i], "KILN_CONFIG");
		} else if (i == NNAMES + 1) {
			strcpy(var_names[i], "KILN_MATH");
		} else {
			strcpy(var_names[i], "KILN_THREADS");
		}
		const char *v = getenv(var_names[i]);
		saved[i] = v != NULL ? strdup(v) : NULL;
		unsetenv(var_names[i]);
	}
}

static void env_fini(void)
{
	for (size_t i = 0; i < NVARS; i++) {
		if (saved[i] != NULL)
			setenv(var_names[i], saved[i], 1);
		else
			unsetenv(var_names[i]);
		free(saved[i]);
		saved[i] = NULL;
	}
}

TestSuite(config, .init = env_init, .fini = env_fini);

/* ---- helpers ------------------------------------------------------------- */

/* Writes text to a new temporary file; returns its malloc'd path. */
static char *write_tmp(const char *text)
{
	const char *dir = getenv("TMPDIR");
	char *path = NULL;
	cr_assert(asprintf(&path, "%s/kilnd-conf-XXXXXX",
			   dir != NULL && dir[0] != '\0' ? dir : "/tmp") > 0);
	int fd = mkstemp(path);
	cr_assert(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
	size_t len = strlen(text);
	cr_assert_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

static void drop_tmp(char *path)
{
	unlink(path);
	free(path);
}

/* Loads with --config path (and argv after it). */
static int load_with(kilnd_config_t *cfg, const char *path, int argc,
		     char **argv, char *err, size_t errlen)
{
	kilnd_cli_t cli;
	memset(&cli, 0, sizeof(cli));
	cli.config_path = path;
	return kilnd_config_load(cfg, &cli, argc, argv, err, errlen);
}

/* Loads text as the config file; returns rc, message in err. */
static int load_text(kilnd_config_t *cfg, const char *text, char **path_out,
		     char *err, size_t errlen)
{
	char *path = write_tmp(text);
	int rc = load_with(cfg, path, 0, NULL, err, errlen);
	if (path_out != NULL)
		*path_out = path;
	else
		drop_tmp(path);
	return rc;
}

/* Every setting as name=value text, for comparisons. */
typedef struct {
	char value[NNAMES][256];
	const char *source[NNAMES];
	int seen[NNAMES];
} dump_t;

static void dump_one(const char *name, const char *value, const char *source,
		     const char *doc, void *arg)
{
	dump_t *d = arg;
	int i = name_index(name);
	cr_assert(i >= 0, "unknown setting %s", name);
	cr_assert_not_null(doc);
	cr_assert_not_null(value);
	cr_assert_not_null(source);
	d->seen[i]++;
	snprintf(d->value[i], sizeof(d->value[i]), "%s", value);
	d->source[i] = source;
}

static void dump(const kilnd_config_t *cfg, dump_t *d)
{
	memset(d, 0, sizeof(*d));
	kilnd_config_each(cfg, dump_one, d);
	for (size_t i = 0; i < NNAMES; i++)
		cr_assert_eq(d->seen[i], 1, "%s seen %d times", names[i].name,
			     d->seen[i]);
}

static void assert_defaults(const kilnd_config_t *cfg)
{
	kilnd_config_t def;
	kilnd_config_defaults(&def);
	dump_t a, b;
	dump(cfg, &a);
	dump(&def, &b);
	for (size_t i = 0; i < NNAMES; i++)
		cr_assert_str_eq(a.value[i], b.value[i], "%s: %s, want %s",
				 names[i].name, a.value[i], b.value[i]);
	kilnd_config_free(&def);
}

static const char *source_of(const kilnd_config_t *cfg, const char *name)
{
	static dump_t d; /* tests run one at a time */
	dump(cfg, &d);
	int i = name_index(name);
	cr_assert(i >= 0);
	return d.source[i];
}

/* ---- defaults ------------------------------------------------------------ */

Test(config, defaults)
{
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	cr_assert_str_eq(cfg.socket, "");
	cr_assert_str_eq(cfg.tcp_listen, "");
	cr_assert_str_eq(cfg.store_dir, "");
	cr_assert_eq(cfg.store_max_bytes, 0);
	cr_assert_eq(cfg.store_min_free_bytes, 0);
	cr_assert_eq(cfg.hot_bytes, 268435456);
	cr_assert_eq(cfg.workers, 0);
	cr_assert_eq(cfg.queue_depth, 256);
	cr_assert_eq(cfg.compile_timeout_s, 600);
	cr_assert_eq(cfg.max_connections, 1024);
	cr_assert_eq(cfg.max_frame_bytes, 67108864);
	cr_assert_eq(cfg.max_nodes, 100000);
	cr_assert_eq(cfg.max_inflight, 64);
	cr_assert_eq(cfg.max_pending_write_bytes, 268435456);
	cr_assert_eq(cfg.idle_timeout_s, 600);
	cr_assert_eq(cfg.drain_timeout_s, 30);
	cr_assert_str_eq(cfg.admin_group, "");
	cr_assert_str_eq(cfg.log_level, "info");
	cr_assert_null(cfg.config_path);
	dump_t d;
	dump(&cfg, &d);
	for (size_t i = 0; i < NNAMES; i++)
		cr_assert_str_eq(d.source[i], "default");
	/* free is idempotent and leaves the defaults */
	kilnd_config_free(&cfg);
	kilnd_config_free(&cfg);
	kilnd_config_free(NULL);
	cr_assert_str_eq(cfg.log_level, "info");
	cr_assert_eq(cfg.queue_depth, 256);
}

Test(config, zeroed_struct_can_be_loaded_and_each_tolerates_it)
{
	kilnd_config_t cfg;
	memset(&cfg, 0, sizeof(cfg));
	dump_t d;
	dump(&cfg, &d); /* NULL strings and sources read as "" / default */
	cr_assert_str_eq(d.value[name_index("socket")], "");
	cr_assert_str_eq(d.source[name_index("socket")], "default");
	char *path = NULL;
	char err[256];
	cr_assert_eq(load_text(&cfg, "workers = 3\n", &path, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(cfg.workers, 3);
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, no_file_means_defaults)
{
	if (access("/etc/kiln/kilnd.conf", F_OK) == 0)
		cr_skip_test("/etc/kiln/kilnd.conf exists here");
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256] = "x";
	cr_assert_eq(kilnd_config_load(&cfg, NULL, 0, NULL, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_null(cfg.config_path);
	assert_defaults(&cfg);
	kilnd_config_free(&cfg);
}

Test(config, log_level_names)
{
	cr_assert_eq(kilnd_config_log_level("error"), KILN_LOG_ERROR);
	cr_assert_eq(kilnd_config_log_level("warn"), KILN_LOG_WARN);
	cr_assert_eq(kilnd_config_log_level("info"), KILN_LOG_INFO);
	cr_assert_eq(kilnd_config_log_level("debug"), KILN_LOG_DEBUG);
	cr_assert_eq(kilnd_config_log_level("warning"), -1);
	cr_assert_eq(kilnd_config_log_level("INFO"), -1);
	cr_assert_eq(kilnd_config_log_level(""), -1);
	cr_assert_eq(kilnd_config_log_level(NULL), -1);
}

/* ---- the file ------------------------------------------------------------ */

Test(config, file_sections_comments_quotes_suffixes)
{
	const char *text =
	    "; a comment\n"
	    "# another\n"
	    "\n"
	    "workers = 4\n" /* before any section: kilnd's */
	    "[kilnd]\n"
	    "  socket = \"/tmp/a b.sock\"\n" /* indented, quoted */
	    "\tstore_dir = '/var/lib/x'\n"
	    "hot_bytes = 2M\n"
	    "max_frame_bytes = 1k\n"
	    "max_pending_write_bytes=5K\n"
	    "store_max_bytes=3G\n"
	    "store_min_free_bytes = 1T\n"
	    "queue_depth = 8 ; inline comment\n"
	    "max-connections = 10\n" /* dash form */
	    "log_level = debug\n"
	    "tcp_listen = 127.0.0.1:9000\n"
	    "[ kilnd ]\r\n" /* again, blanks, CRLF */
	    "admin_group = wheel\r\n"
	    "compile_timeout_s = 0\n"
	    "max_nodes = 007\n"
	    "idle_timeout_s = 1\n"
	    "idle_timeout_s = 2\n"	 /* the last one wins */
	    "max_inflight = 4294967295"; /* no final newline */
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char *path = NULL;
	char err[256];
	cr_assert_eq(load_text(&cfg, text, &path, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_str_eq(cfg.config_path, path);
	cr_assert_eq(cfg.workers, 4);
	cr_assert_str_eq(cfg.socket, "/tmp/a b.sock");
	cr_assert_str_eq(cfg.store_dir, "/var/lib/x");
	cr_assert_eq(cfg.hot_bytes, 2u << 20);
	cr_assert_eq(cfg.max_frame_bytes, 1024);
	cr_assert_eq(cfg.max_pending_write_bytes, 5 * 1024);
	cr_assert_eq(cfg.store_max_bytes, 3ull << 30);
	cr_assert_eq(cfg.store_min_free_bytes, 1ull << 40);
	cr_assert_eq(cfg.queue_depth, 8);
	cr_assert_eq(cfg.max_connections, 10);
	cr_assert_str_eq(cfg.log_level, "debug");
	cr_assert_str_eq(cfg.tcp_listen, "127.0.0.1:9000");
	cr_assert_str_eq(cfg.admin_group, "wheel");
	cr_assert_eq(cfg.compile_timeout_s, 0);
	cr_assert_eq(cfg.max_nodes, 7);
	cr_assert_eq(cfg.idle_timeout_s, 2);
	cr_assert_eq(cfg.max_inflight, 4294967295u);
	/* the sources: the file for what it set, default for the rest */
	cr_assert_eq(cfg.src_workers, cfg.config_path);
	cr_assert_str_eq(source_of(&cfg, "socket"), path);
	cr_assert_str_eq(source_of(&cfg, "drain_timeout_s"), "default");
	cr_assert_eq(cfg.drain_timeout_s, 30);
	kilnd_config_free(&cfg);
	cr_assert_null(cfg.config_path);
	drop_tmp(path);
}

Test(config, empty_values_and_empty_file)
{
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256];
	cr_assert_eq(load_text(&cfg, "", NULL, err, sizeof(err)), 0, "%s", err);
	assert_defaults(&cfg);
	cr_assert_not_null(cfg.config_path); /* the file read, though empty */
	cr_assert_eq(load_text(&cfg, "[kilnd]\nsocket =\nstore_dir = \"\"\n",
			       NULL, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_str_eq(cfg.socket, "");
	cr_assert_str_eq(cfg.store_dir, "");
	cr_assert_str_neq((char *)cfg.src_socket, "default");
	kilnd_config_free(&cfg);
}

/* Loads text, expects -EINVAL and a message holding every piece. */
static void expect_error(const char *text, int line, const char *piece1,
			 const char *piece2)
{
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char *path = NULL;
	char err[512] = "";
	int rc = load_text(&cfg, text, &path, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "rc %d for:\n%s", rc, text);
	char where[300];
	snprintf(where, sizeof(where), "%s:%d: ", path, line);
	cr_assert(strncmp(err, where, strlen(where)) == 0,
		  "message \"%s\" does not start with \"%s\"", err, where);
	cr_assert(strstr(err, piece1) != NULL, "\"%s\" lacks \"%s\"", err,
		  piece1);
	if (piece2 != NULL)
		cr_assert(strstr(err, piece2) != NULL, "\"%s\" lacks \"%s\"",
			  err, piece2);
	/* a failed load leaves the defaults, and nothing to leak */
	assert_defaults(&cfg);
	cr_assert_null(cfg.config_path);
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, file_errors_name_file_and_line)
{
	expect_error("[kilnd]\n# c\nbogus_key = 1\n", 3, "unknown setting",
		     "bogus_key");
	expect_error("workers = 4\nworkers2 = 1\n", 2, "unknown setting",
		     "workers2");
	expect_error("[kilnd]\nworkers = many\n", 2, "workers", "not a number");
	expect_error("workers = 4x\n", 1, "workers", "not a number");
	expect_error("workers = 4m\n", 1, "workers", "not a number");
	expect_error("workers = 4 M\n", 1, "workers", "not a number");
	expect_error("workers = 0x10\n", 1, "workers", "not a number");
	expect_error("workers = +3\n", 1, "workers", "not a number");
	expect_error("workers =\n", 1, "workers", "not a number");
	expect_error("workers = -1\n", 1, "workers", "negative");
	expect_error("workers = 4294967296\n", 1, "workers", "too large");
	expect_error("workers = 4194304k\n", 1, "workers", "too large");
	expect_error("hot_bytes = 18446744073709551616\n", 1, "hot_bytes",
		     "too large");
	expect_error("hot_bytes = 16777216T\n", 1, "hot_bytes", "too large");
	expect_error("hot_bytes = 99999999999999999999999\n", 1, "hot_bytes",
		     "too large");
	expect_error("\n\nlog_level = verbose\n", 3, "log_level",
		     "error, warn, info, debug");
	expect_error("log_level = INFO\n", 1, "log_level", NULL);
	expect_error("[kilnd]\nworkers = 1\n[other]\nworkers = 2\n", 3,
		     "unknown section", "[other]");
	/* an unknown section with nothing in it is still an error */
	expect_error("[kilnd]\n[server]\n", 2, "unknown section", "[server]");
	expect_error("[kilnd]\nthis is not a setting\n", 2, "syntax error",
		     NULL);
	expect_error("[kilnd\n", 1, "syntax error", NULL);
	/* the first error wins, syntax or not */
	expect_error("nonsense\nbogus = 1\n", 1, "syntax error", NULL);
	expect_error("bogus = 1\nnonsense\n", 1, "unknown setting", NULL);
	/* a line too long for inih's buffer is refused, not split */
	char longline[1200];
	snprintf(longline, sizeof(longline), "workers = 1\nsocket = /%01000d\n",
		 0);
	expect_error(longline, 2, "line longer than", NULL);
}

Test(config, file_nul_byte_is_an_error)
{
	char *path = write_tmp("");
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fwrite("workers = 1\nsock\0et = x\n", 1, 24, f);
	fclose(f);
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[512];
	cr_assert_eq(load_with(&cfg, path, 0, NULL, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, ":2: NUL byte") != NULL, "%s", err);
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, missing_explicit_file_is_an_error)
{
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[512];
	const char *nope = "/nonexistent/kiln/kilnd.conf";
	int rc = load_with(&cfg, nope, 0, NULL, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT);
	cr_assert(strstr(err, nope) != NULL, "%s", err);
	/* KILN_CONFIG is explicit too */
	setenv("KILN_CONFIG", nope, 1);
	rc = kilnd_config_load(&cfg, NULL, 0, NULL, err, sizeof(err));
	cr_assert_eq(rc, -ENOENT);
	cr_assert(strstr(err, nope) != NULL, "%s", err);
	/* a directory cannot be read */
	rc = load_with(&cfg, "/", 0, NULL, err, sizeof(err));
	cr_assert_lt(rc, 0);
	cr_assert(strstr(err, "/") != NULL, "%s", err);
	assert_defaults(&cfg);
	kilnd_config_free(&cfg);
}

Test(config, kiln_config_env_names_the_file)
{
	char *path = write_tmp("[kilnd]\nmax_nodes = 12\n");
	setenv("KILN_CONFIG", path, 1);
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256];
	cr_assert_eq(kilnd_config_load(&cfg, NULL, 0, NULL, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(cfg.max_nodes, 12);
	cr_assert_str_eq(cfg.src_max_nodes, path);
	/* --config wins over KILN_CONFIG */
	char *other = write_tmp("max_nodes = 13\n");
	cr_assert_eq(load_with(&cfg, other, 0, NULL, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(cfg.max_nodes, 13);
	cr_assert_str_eq(cfg.config_path, other);
	kilnd_config_free(&cfg);
	drop_tmp(path);
	drop_tmp(other);
}

/* ---- parsers ------------------------------------------------------------- */

Test(config, bool_parser)
{
	const char *yes[] = {"true", "yes", "on", "1", "TRUE", " Yes ", "On"};
	const char *no[] = {"false", "no", "off", "0", "False", "NO ", "OFF"};
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		bool b = false;
		cr_assert_eq(kilnd__config_parse_bool(yes[i], &b), 0, "%s",
			     yes[i]);
		cr_assert(b, "%s", yes[i]);
		cr_assert_eq(kilnd__config_parse_bool(no[i], &b), 0, "%s",
			     no[i]);
		cr_assert(!b, "%s", no[i]);
	}
	const char *bad[] = {"", "2", "y", "n", "truth", "enable", "-1", "o"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		bool b;
		cr_assert_eq(kilnd__config_parse_bool(bad[i], &b), -EINVAL,
			     "\"%s\"", bad[i]);
	}
}

Test(config, number_parser)
{
	const char *why = NULL;
	uint64_t v = 0;
	cr_assert_eq(kilnd__config_parse_u64("18446744073709551615", UINT64_MAX,
					     &v, &why),
		     0);
	cr_assert_eq(v, UINT64_MAX);
	cr_assert_eq(kilnd__config_parse_u64("16777215T", UINT64_MAX, &v, &why),
		     0);
	cr_assert_eq(v, 16777215ull << 40);
	cr_assert_eq(kilnd__config_parse_u64("4G", UINT64_MAX, &v, &why), 0);
	cr_assert_eq(v, 4ull << 30);
	cr_assert_eq(kilnd__config_parse_u64("4G", UINT32_MAX, &v, &why),
		     -EINVAL);
	cr_assert_str_eq(why, "too large");
	cr_assert_eq(kilnd__config_parse_u64("4194303k", UINT32_MAX, &v, &why),
		     0);
	cr_assert_eq(v, 4194303ull * 1024);
	cr_assert_eq(kilnd__config_parse_u64("-0", UINT64_MAX, &v, &why),
		     -EINVAL);
	cr_assert_eq(kilnd__config_parse_u64("1KK", UINT64_MAX, &v, &why),
		     -EINVAL);
	cr_assert_eq(kilnd__config_parse_u64("k", UINT64_MAX, &v, &why),
		     -EINVAL);
	cr_assert_eq(kilnd__config_parse_u64("1.5M", UINT64_MAX, &v, &why),
		     -EINVAL);
}

/* ---- environment and command line ---------------------------------------- */

Test(config, env_overrides_file_and_cli_overrides_env)
{
	char *path = write_tmp("[kilnd]\n"
			       "workers = 2\n"
			       "queue_depth = 3\n"
			       "store_dir = /from/file\n"
			       "log_level = warn\n");
	setenv("KILN_QUEUE_DEPTH", "30", 1);
	setenv("KILN_STORE_DIR", "/from/env", 1);
	setenv("KILN_LOG_LEVEL", "debug", 1);
	setenv("KILN_MAX_CONNECTIONS", "1k", 1);
	setenv("KILN_SOCKET", "/run/env.sock", 1);
	setenv("KILN_IDLE_TIMEOUT_S", "", 1); /* empty: as if unset */
	setenv("KILN_MATH", "fast", 1);	      /* not settings: ignored */
	setenv("KILN_THREADS", "many", 1);
	char *argv[] = {"kilnd",       "--config",  path, "--log-level=error",
			"--store_dir", "/from/cli", NULL};
	int argc = 6;
	kilnd_cli_t cli;
	char err[256];
	cr_assert_eq(kilnd_cli_parse(argc, argv, &cli, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_str_eq(cli.config_path, path);
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	cr_assert_eq(
	    kilnd_config_load(&cfg, &cli, argc, argv, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(cfg.workers, 2);
	cr_assert_str_eq(cfg.src_workers, path);
	cr_assert_eq(cfg.queue_depth, 30);
	cr_assert_str_eq(cfg.src_queue_depth, "env");
	cr_assert_eq(cfg.max_connections, 1024);
	cr_assert_str_eq(cfg.src_max_connections, "env");
	cr_assert_str_eq(cfg.socket, "/run/env.sock");
	cr_assert_str_eq(cfg.src_socket, "env");
	cr_assert_eq(cfg.idle_timeout_s, 600);
	cr_assert_str_eq(cfg.src_idle_timeout_s, "default");
	cr_assert_str_eq(cfg.store_dir, "/from/cli");
	cr_assert_str_eq(cfg.src_store_dir, "cli");
	cr_assert_str_eq(cfg.log_level, "error");
	cr_assert_str_eq(cfg.src_log_level, "cli");
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, bad_env_value_names_the_variable)
{
	if (access("/etc/kiln/kilnd.conf", F_OK) == 0)
		cr_skip_test("/etc/kiln/kilnd.conf exists here");
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256];
	setenv("KILN_MAX_NODES", "lots", 1);
	cr_assert_eq(kilnd_config_load(&cfg, NULL, 0, NULL, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "KILN_MAX_NODES") != NULL, "%s", err);
	cr_assert(strstr(err, "not a number") != NULL, "%s", err);
	setenv("KILN_MAX_NODES", "5", 1);
	setenv("KILN_LOG_LEVEL", "loud", 1);
	cr_assert_eq(kilnd_config_load(&cfg, NULL, 0, NULL, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "KILN_LOG_LEVEL") != NULL, "%s", err);
	assert_defaults(&cfg);
	kilnd_config_free(&cfg);
}

/* Parses then loads argv (no file); returns rc of the first that fails. */
static int cli_load(kilnd_config_t *cfg, kilnd_cli_t *cli, char **argv,
		    char *err, size_t errlen)
{
	int argc = 0;
	while (argv[argc] != NULL)
		argc++;
	int rc = kilnd_cli_parse(argc, argv, cli, err, errlen);
	if (rc != 0)
		return rc;
	char *empty = write_tmp("");
	if (cli->config_path == NULL)
		cli->config_path = empty;
	rc = kilnd_config_load(cfg, cli, argc, argv, err, errlen);
	if (cli->config_path == empty)
		cli->config_path = NULL;
	drop_tmp(empty);
	return rc;
}

Test(config, cli_forms)
{
	char *argv[] = {"kilnd",
			"--max-connections=10",
			"--max_inflight",
			"7",
			"--queue-depth",
			"2k",
			"--hot_bytes=1M",
			"--socket=",
			"--tcp-listen",
			"[::1]:80",
			"--admin-group=a=b",
			"--log_level",
			"debug",
			"--workers=1",
			"--workers=5", /* the last one wins */
			NULL};
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	kilnd_cli_t cli;
	char err[256];
	cr_assert_eq(cli_load(&cfg, &cli, argv, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(!cli.help && !cli.version && !cli.check_config);
	cr_assert_eq(cfg.max_connections, 10);
	cr_assert_eq(cfg.max_inflight, 7);
	cr_assert_eq(cfg.queue_depth, 2048);
	cr_assert_eq(cfg.hot_bytes, 1 << 20);
	cr_assert_str_eq(cfg.socket, "");
	cr_assert_str_eq(cfg.src_socket, "cli");
	cr_assert_str_eq(cfg.tcp_listen, "[::1]:80");
	cr_assert_str_eq(cfg.admin_group, "a=b");
	cr_assert_str_eq(cfg.log_level, "debug");
	cr_assert_eq(cfg.workers, 5);
	cr_assert_str_eq(cfg.src_workers, "cli");
	cr_assert_str_eq(cfg.src_idle_timeout_s, "default");
	kilnd_config_free(&cfg);
}

Test(config, cli_flags)
{
	kilnd_cli_t cli;
	char err[256];
	char *a1[] = {"kilnd", "--help", NULL};
	cr_assert_eq(kilnd_cli_parse(2, a1, &cli, err, sizeof(err)), 0);
	cr_assert(cli.help && !cli.version && !cli.check_config);
	cr_assert_null(cli.config_path);
	char *a2[] = {"kilnd", "-h", NULL};
	cr_assert_eq(kilnd_cli_parse(2, a2, &cli, err, sizeof(err)), 0);
	cr_assert(cli.help);
	char *a3[] = {"kilnd", "--version", NULL};
	cr_assert_eq(kilnd_cli_parse(2, a3, &cli, err, sizeof(err)), 0);
	cr_assert(cli.version && !cli.help);
	char *a4[] = {"kilnd", "-V", NULL};
	cr_assert_eq(kilnd_cli_parse(2, a4, &cli, err, sizeof(err)), 0);
	cr_assert(cli.version);
	char *a5[] = {
	    "kilnd", "--check-config", "--config=/x/y.conf", "--workers", "3",
	    NULL};
	cr_assert_eq(kilnd_cli_parse(5, a5, &cli, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(cli.check_config && !cli.help && !cli.version);
	cr_assert_str_eq(cli.config_path, "/x/y.conf");
	char *a6[] = {"kilnd", "--check_config", "--config", "/z.conf", NULL};
	cr_assert_eq(kilnd_cli_parse(4, a6, &cli, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(cli.check_config);
	cr_assert_str_eq(cli.config_path, "/z.conf");
	/* flags are ignored by load; a settings-free argv loads defaults */
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char *a7[] = {"kilnd", "--check-config", "-h", "-V", NULL};
	cr_assert_eq(cli_load(&cfg, &cli, a7, err, sizeof(err)), 0, "%s", err);
	cr_assert(cli.check_config && cli.help && cli.version);
	assert_defaults(&cfg);
	kilnd_config_free(&cfg);
	/* no arguments at all */
	cr_assert_eq(kilnd_cli_parse(1, a1, &cli, err, sizeof(err)), 0);
	cr_assert(!cli.help);
	cr_assert_eq(kilnd_cli_parse(0, NULL, &cli, err, sizeof(err)), 0);
}

static void expect_cli_error(char **argv, const char *piece)
{
	int argc = 0;
	while (argv[argc] != NULL)
		argc++;
	kilnd_cli_t cli;
	char err[256] = "";
	cr_assert_eq(kilnd_cli_parse(argc, argv, &cli, err, sizeof(err)),
		     -EINVAL, "argv[1] %s", argv[1]);
	cr_assert(strstr(err, piece) != NULL, "\"%s\" lacks \"%s\"", err,
		  piece);
	/* load reports the same without leaking what it stored before */
	char *path = write_tmp("");
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err2[256] = "";
	cr_assert_eq(load_with(&cfg, path, argc, argv, err2, sizeof(err2)),
		     -EINVAL);
	cr_assert_str_eq(err2, err);
	assert_defaults(&cfg);
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, cli_errors)
{
	char *a1[] = {"kilnd", "--socket=/s", "--no-such-option=1", NULL};
	expect_cli_error(a1, "unknown option --no-such-option");
	char *a2[] = {"kilnd", "--bogus", NULL};
	expect_cli_error(a2, "unknown option --bogus");
	char *a3[] = {"kilnd", "--socket=/s", "--workers", NULL};
	expect_cli_error(a3, "--workers needs a value");
	char *a4[] = {"kilnd", "--socket", "--workers=3", NULL};
	expect_cli_error(a4, "--socket needs a value");
	char *a5[] = {"kilnd", "--workers=ten", NULL};
	expect_cli_error(a5, "not a number");
	char *a6[] = {"kilnd", "--workers", "-1", NULL};
	expect_cli_error(a6, "negative");
	char *a7[] = {"kilnd", "--queue-depth=99999999999", NULL};
	expect_cli_error(a7, "too large");
	char *a8[] = {"kilnd", "--log-level=trace", NULL};
	expect_cli_error(a8, "log_level");
	char *a9[] = {"kilnd", "stray", NULL};
	expect_cli_error(a9, "unexpected argument \"stray\"");
	char *a10[] = {"kilnd", "-x", NULL};
	expect_cli_error(a10, "unexpected argument \"-x\"");
	char *a11[] = {"kilnd", "--help=yes", NULL};
	expect_cli_error(a11, "--help takes no value");
	char *a12[] = {"kilnd", "--config", NULL};
	expect_cli_error(a12, "--config needs a value");
	char *a13[] = {"kilnd", "--config=", NULL};
	expect_cli_error(a13, "empty path");
	char *a14[] = {"kilnd", "--", NULL};
	expect_cli_error(a14, "unexpected argument");
	char *a15[] = {"kilnd", "--=3", NULL};
	expect_cli_error(a15, "unexpected argument");
	char *a16[] = {"kilnd", "--config_path=/x", NULL};
	expect_cli_error(a16, "unknown option --config_path");
}

/* ---- each, usage --------------------------------------------------------- */

Test(config, each_visits_every_setting_once_with_its_source)
{
	char *path = write_tmp("[kilnd]\nworkers = 9\nsocket = /f.sock\n");
	setenv("KILN_SOCKET", "/e.sock", 1);
	setenv("KILN_MAX_NODES", "100", 1);
	char *argv[] = {"kilnd", "--max-nodes=200", "--hot-bytes", "2k", NULL};
	kilnd_cli_t cli = {.config_path = path};
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256];
	cr_assert_eq(kilnd_config_load(&cfg, &cli, 4, argv, err, sizeof(err)),
		     0, "%s", err);
	dump_t d;
	dump(&cfg, &d); /* asserts exactly once each */
	for (size_t i = 0; i < NNAMES; i++) {
		const char *n = names[i].name;
		const char *want = "default";
		if (strcmp(n, "workers") == 0)
			want = path;
		else if (strcmp(n, "socket") == 0)
			want = "env";
		else if (strcmp(n, "max_nodes") == 0 ||
			 strcmp(n, "hot_bytes") == 0)
			want = "cli";
		cr_assert_str_eq(d.source[i], want, "%s", n);
	}
	cr_assert_str_eq(d.value[name_index("workers")], "9");
	cr_assert_str_eq(d.value[name_index("socket")], "/e.sock");
	cr_assert_str_eq(d.value[name_index("max_nodes")], "200");
	cr_assert_str_eq(d.value[name_index("hot_bytes")], "2048");
	cr_assert_str_eq(d.value[name_index("max_frame_bytes")], "67108864");
	cr_assert_str_eq(d.value[name_index("log_level")], "info");
	cr_assert_str_eq(d.value[name_index("tcp_listen")], "");
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, reload_into_a_used_struct_does_not_leak)
{
	char *path = write_tmp("socket = /a\nstore_dir = /b\nadmin_group = g\n"
			       "log_level = warn\ntcp_listen = h:1\n");
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[256];
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(load_with(&cfg, path, 0, NULL, err, sizeof(err)),
			     0, "%s", err);
		cr_assert_str_eq(cfg.admin_group, "g");
	}
	/* moving a string out, as the loop does on SIGHUP */
	kilnd_config_t fresh;
	memset(&fresh, 0, sizeof(fresh));
	cr_assert_eq(load_with(&fresh, path, 0, NULL, err, sizeof(err)), 0);
	kilnd_config_free(&cfg);
	cfg.log_level = fresh.log_level;
	fresh.log_level = NULL;
	kilnd_config_free(&fresh);
	cr_assert_str_eq(cfg.log_level, "warn");
	kilnd_config_free(&cfg);
	drop_tmp(path);
}

Test(config, usage_lists_everything_within_80_columns)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	kilnd_config_usage(f);
	fclose(f);
	cr_assert(strstr(buf, "Usage: kilnd") != NULL);
	const char *flags[] = {"--config PATH", "--check-config",
			       "--help",	"-h",
			       "--version",	"-V"};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		cr_assert(strstr(buf, flags[i]) != NULL, "%s", flags[i]);
	for (size_t i = 0; i < NNAMES; i++) {
		char opt[80];
		size_t n =
		    (size_t)snprintf(opt, sizeof(opt), "--%s=", names[i].name);
		for (size_t j = 0; j < n; j++)
			if (opt[j] == '_')
				opt[j] = '-';
		cr_assert(strstr(buf, opt) != NULL, "%s", opt);
		cr_assert(strstr(buf, names[i].env) != NULL, "%s",
			  names[i].env);
	}
	cr_assert(strstr(buf, "default 268435456") != NULL);
	cr_assert(strstr(buf, "default \"info\"") != NULL);
	cr_assert(strstr(buf, "connections at once") != NULL);
	const char *line = buf;
	int lineno = 1;
	while (*line != '\0') {
		size_t l = strcspn(line, "\n");
		cr_assert_leq(l, 80, "line %d is %zu wide: %.*s", lineno, l,
			      (int)l, line);
		cr_assert(memchr(line, '\t', l) == NULL);
		line += l;
		if (*line == '\n')
			line++;
		lineno++;
	}
	free(buf);
}

/* ---- deploy/kilnd.conf --------------------------------------------------- */

/* Reads a whole file into a malloc'd string. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	long size = ftell(f);
	cr_assert_geq(size, 0);
	rewind(f);
	char *buf = malloc((size_t)size + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	buf[size] = '\0';
	fclose(f);
	return buf;
}

/* If line is "# name = ..." for a setting, returns its index, else -1. */
static int commented_setting(const char *line, size_t len)
{
	if (len < 2 || line[0] != '#' || line[1] != ' ')
		return -1;
	const char *p = line + 2;
	size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_0123456789");
	if (n == 0 || n >= 64 || p + n > line + len)
		return -1;
	const char *q = p + n;
	while (*q == ' ')
		q++;
	if (*q != '=')
		return -1;
	char name[64];
	memcpy(name, p, n);
	name[n] = '\0';
	int i = name_index(name);
	cr_assert(i >= 0, "the sample sets an unknown setting: %.*s", (int)len,
		  line);
	return i;
}

Test(config, sample_config_has_every_setting_and_the_defaults)
{
	char *text = slurp(KILN_SOURCE_ROOT "/deploy/kilnd.conf");
	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	cr_assert_not_null(f);
	int count[NNAMES] = {0};
	bool section = false;
	const char *line = text;
	while (*line != '\0') {
		size_t l = strcspn(line, "\n");
		cr_assert_leq(l, 80, "sample line too wide: %.*s", (int)l,
			      line);
		if (l == 7 && memcmp(line, "[kilnd]", 7) == 0)
			section = true;
		int i = commented_setting(line, l);
		if (i >= 0) {
			cr_assert(section, "%s before [kilnd]", names[i].name);
			count[i]++;
			/* uncommented, and the line before must be a doc */
			fprintf(f, "%.*s\n", (int)(l - 2), line + 2);
		} else {
			fprintf(f, "%.*s\n", (int)l, line);
		}
		line += l;
		if (*line == '\n')
			line++;
	}
	fclose(f);
	for (size_t i = 0; i < NNAMES; i++) {
		cr_assert_eq(count[i], 1, "%s appears %d times in the sample",
			     names[i].name, count[i]);
		char doc_then_name[128];
		snprintf(doc_then_name, sizeof(doc_then_name),
			 "\n# %s =", names[i].name);
		const char *at = strstr(text, doc_then_name);
		cr_assert_not_null(at);
		/* preceded by a comment line (its doc), not a blank one */
		cr_assert(at > text && at[-1] != '\n', "%s has no doc comment",
			  names[i].name);
	}

	/* the uncommented copy sets every setting to its default */
	char *path = write_tmp(out);
	kilnd_config_t cfg;
	kilnd_config_defaults(&cfg);
	char err[512];
	cr_assert_eq(load_with(&cfg, path, 0, NULL, err, sizeof(err)), 0, "%s",
		     err);
	assert_defaults(&cfg);
	dump_t d;
	dump(&cfg, &d);
	for (size_t i = 0; i < NNAMES; i++)
		cr_assert_str_eq(d.source[i], path, "%s not set by the sample",
				 names[i].name);
	kilnd_config_free(&cfg);
	drop_tmp(path);
	free(out);
	free(text);
}
