/*
 * config.h — kilnd's settings: one X-macro list, read from the INI file
 * (/etc/kiln/kilnd.conf, section [kilnd]), then the environment
 * (KILN_<NAME in upper case>), then the command line (--name=value), each
 * overriding the one before. `status` with settings: true and
 * `kilnd --check-config` echo every setting.
 *
 * Threads: loaded on the main thread before the loop starts, and again on
 * SIGHUP on the loop thread (kilnd_config_load into a fresh struct, then
 * the loop applies what may change at run time). Read-only otherwise.
 */
#ifndef KILND_CONFIG_H
#define KILND_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Types: STR (char *, malloc'd, "" when unset), U64, U32, BOOL.
 * X(name, type, default, reloadable, doc). Sizes accept k/M/G suffixes
 * (powers of 1024); booleans accept true/false/yes/no/on/off/1/0. */
/* clang-format off */
#define KILND_SETTINGS(X)                                                       \
	X(socket, STR, "", 0,                                                   \
	  "Unix socket path; empty: $KILN_SOCKET, else /run/kiln/kilnd.sock "  \
	  "for a system service, else $XDG_RUNTIME_DIR/kiln/kilnd.sock")       \
	X(tcp_listen, STR, "", 0,                                               \
	  "host:port of an optional TCP listener; empty: none")                 \
	X(store_dir, STR, "", 0,                                                \
	  "the kernel store; empty: $CACHE_DIRECTORY (systemd), else "          \
	  "$XDG_CACHE_HOME/kiln or ~/.cache/kiln")                              \
	X(store_max_bytes, U64, 0, 1,                                           \
	  "store size limit; 0: 10% of the filesystem, at most 20 GiB")         \
	X(store_min_free_bytes, U64, 0, 1,                                      \
	  "free space the store leaves on its filesystem; 0: 2%, at most 1 GiB")\
	X(hot_bytes, U64, 268435456, 1,                                         \
	  "bytes of artifacts kept in memory (the hot map)")                    \
	X(workers, U32, 0, 0,                                                   \
	  "compile threads; 0: one per CPU")                                    \
	X(compile_worker, STR, "", 0,                                           \
	  "the kiln-compile-worker executable compiles run in; empty: next to " \
	  "kilnd, else the installed one")                                      \
	X(worker_idle_s, U32, 300, 0,                                           \
	  "stop a compile worker process idle this long (its LLVM memory goes " \
	  "with it); 0: never")                                                 \
	X(queue_depth, U32, 256, 1,                                             \
	  "compile jobs waiting at most; beyond it clients get busy")           \
	X(compile_timeout_s, U32, 600, 1,                                       \
	  "a client waits this long for a compile, then gets timeout (the "     \
	  "result is still stored)")                                            \
	X(max_connections, U32, 1024, 1,                                        \
	  "connections at once; more are refused")                              \
	X(max_frame_bytes, U64, 67108864, 1,                                    \
	  "largest request frame")                                              \
	X(max_nodes, U32, 100000, 1,                                            \
	  "largest graph, in nodes")                                            \
	X(max_inflight, U32, 64, 1,                                             \
	  "requests in flight per connection")                                  \
	X(max_pending_write_bytes, U64, 268435456, 1,                           \
	  "replies waiting for a client to read them; past it kilnd stops "     \
	  "reading from that client")                                           \
	X(idle_timeout_s, U32, 600, 1,                                          \
	  "close a connection idle this long; 0: never")                        \
	X(drain_timeout_s, U32, 30, 1,                                          \
	  "on SIGTERM, wait this long for running compiles")                    \
	X(exit_idle_s, U32, 0, 1,                                               \
	  "exit (0) after this long with no connection and no work; 0: never "  \
	  "(libkiln's auto-started per-user kilnd sets it)")                    \
	X(metrics_listen, STR, "", 0,                                           \
	  "host:port of an HTTP listener serving GET /metrics (Prometheus "     \
	  "text); empty: none")                                                 \
	X(admin_group, STR, "", 1,                                              \
	  "group whose members may run admin ops (besides root and kilnd's "    \
	  "own user)")                                                          \
	X(log_level, STR, "info", 1,                                            \
	  "error, warn, info or debug")
/* clang-format on */

typedef struct kilnd_config {
#define KILND__CFG_STR				       char *
#define KILND__CFG_U64				       uint64_t
#define KILND__CFG_U32				       uint32_t
#define KILND__CFG_BOOL				       bool
#define KILND__CFG_FIELD(name, type, def, reload, doc) KILND__CFG_##type name;
	KILND_SETTINGS(KILND__CFG_FIELD)
#undef KILND__CFG_FIELD
	/* Where each value came from: "default", the file path, "env",
	 * "cli" (for --check-config). Static strings or config_path. */
#define KILND__CFG_SRC(name, type, def, reload, doc) const char *src_##name;
	KILND_SETTINGS(KILND__CFG_SRC)
#undef KILND__CFG_SRC
	char *config_path; /* the file read, or NULL */
} kilnd_config_t;

/* What the command line asked for besides settings. */
typedef struct kilnd_cli {
	const char *config_path; /* --config PATH; NULL: the default */
	bool help, version, check_config;
} kilnd_cli_t;

/* Sets every setting to its default. */
void kilnd_config_defaults(kilnd_config_t *cfg);
/* Frees the strings; cfg may then be reused. */
void kilnd_config_free(kilnd_config_t *cfg);

/*
 * Parses argv into cli (flags) and the --name=value / --name value
 * settings, without applying them yet. Unknown options, a missing value
 * or a bad value are errors (message in err). 0 or -EINVAL.
 */
int kilnd_cli_parse(int argc, char **argv, kilnd_cli_t *cli, char *err,
		    size_t errlen);

/*
 * Loads the configuration: defaults, then the file (cli->config_path, else
 * /etc/kiln/kilnd.conf if it exists; an explicit path that does not exist
 * is an error), then KILN_* environment variables, then the command line
 * settings in argv. Unknown keys in the file, unknown sections, and bad
 * values are errors naming the file and line (err). 0 or -EINVAL/-errno.
 */
int kilnd_config_load(kilnd_config_t *cfg, const kilnd_cli_t *cli, int argc,
		      char **argv, char *err, size_t errlen);

/* Calls fn(name, value_as_text, source, doc, arg) for every setting. */
void kilnd_config_each(const kilnd_config_t *cfg,
		       void (*fn)(const char *name, const char *value,
				  const char *source, const char *doc,
				  void *arg),
		       void *arg);

/* Writes `kilnd --help` text (every option and setting) to f. */
void kilnd_config_usage(FILE *f);

/* The log level number for cfg->log_level (KILN_LOG_*), or -1. */
int kilnd_config_log_level(const char *name);

#endif /* KILND_CONFIG_H */
