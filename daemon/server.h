/*
 * server.h — the loop thread's state, shared by server.c (sockets,
 * connections, replies, jobs, signals) and ops.c (what each op does).
 *
 * Threads: everything here belongs to the loop thread, except what is
 * marked otherwise (the done queue, the counters, the latency window).
 */
#ifndef KILND_SERVER_H
#define KILND_SERVER_H

#include "daemon/kilnd.h"

#include <sys/types.h>

#define KILND_MAX_LISTENERS 8

typedef struct kilnd_conn kilnd_conn_t;

/* memo.c: where the id sits in a request's bytes, and their hash. */
typedef struct kilnd_memo_key {
	bool valid;
	uint64_t hash, id;
	size_t id_start, id_end, len;
	const uint8_t *body;
} kilnd_memo_key_t;

/* Automatic dynamic shapes: what kilnd knows of one graph structure. */
typedef enum {
	KILND_DYN_FREE = 0,
	KILND_DYN_SEEN,		/* one static size set compiled */
	KILND_DYN_GENERALIZING, /* the symbolic version is compiling */
	KILND_DYN_GENERAL,	/* the symbolic version serves instances */
	KILND_DYN_STATIC	/* cannot be generalized: static only */
} kilnd_dyn_state_t;

typedef struct kilnd_dyn {
	uint8_t h[KILN_SIG_BYTES]; /* structure hash */
	kilnd_dyn_state_t state;
	kiln_graph_t *seen; /* SEEN: the first static graph */
	uint8_t seen_sig[KILN_SIG_BYTES];
	kiln_graph_t *gg; /* GENERALIZING / GENERAL */
	uint8_t gsig[KILN_SIG_BYTES];
	uint64_t used;
	bool eager; /* generalized at once (dynamic: true), not automatic */
} kilnd_dyn_t;

#define KILND_DYN_MAX 256

struct kilnd_waiter {
	kilnd_conn_t *conn;
	uint64_t id;
	uint64_t deadline_ms; /* loop time when it gets timeout */
	uint64_t t0_ms;
	kilnd_waiter_t *next;
};

struct kilnd_conn {
	union {
		uv_stream_t stream;
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} h;
	kilnd_server_t *srv;
	kiln_frame_decoder_t dec;
	kilnd_conn_t *prev, *next;
	uint64_t num;		/* for logs */
	uint32_t inflight;	/* requests not yet answered */
	uint64_t pending_write; /* reply bytes not yet written */
	uint32_t refs;		/* the handle + waiters + work items */
	bool closing, paused, is_unix, creds;
	bool close_when_written; /* shutting down: close after the replies */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint64_t last_active_ms;
};

struct kilnd_server {
	uv_loop_t *loop;
	kilnd_config_t cfg;
	kilnd_cli_t cli;
	int argc;
	char **argv;
	kiln_limits_t lim;
	kiln_cache_t *store;
	kilnd_pool_t *pool;
	kilnd_hot_t *hot;
	unsigned nworkers;
	kilnd_counters_t ctr;	/* the loop's block */
	kilnd_counters_t *wctr; /* one block per worker */
	kilnd_latency_t lat;
	char fingerprint[256];
	kiln_target_t target;
	char store_dir[4096];

	union {
		uv_handle_t handle;
		uv_stream_t stream;
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} listeners[KILND_MAX_LISTENERS];
	bool listener_unix[KILND_MAX_LISTENERS];
	int nlisteners;
	char socket_path[4096]; /* created by us: unlinked at exit */
	bool socket_created;

	kilnd_conn_t *conns;
	uint32_t nconns;
	uint64_t conn_seq;

	struct kilnd_memo_entry *memo; /* memo.c */
	uint64_t memo_bytes;
	const kilnd_memo_key_t *cur_memo; /* the request being dispatched */
	kilnd_dyn_t *dyn;		  /* KILND_DYN_MAX entries */
	uint64_t dyn_clock;

	kilnd_job_t **jobs; /* in-flight table (chained) */
	size_t jobs_cap, njobs;
	uint32_t pending_work; /* uv_queue_work items outstanding */

	/* Workers push finished jobs here (done_mu) and wake the loop. */
	pthread_mutex_t done_mu;
	kilnd_job_t *done_head, *done_tail;
	uv_async_t done_async;

	uv_signal_t sig_term, sig_int, sig_hup;
	uv_timer_t tick; /* 1 s: timeouts, idle, watchdog, status, drain */
	uint64_t watchdog_usec, last_watchdog_ms;
	bool draining, stopped, async_init;
	bool flushing; /* drain done: writing the last replies */
	uint64_t flush_deadline_ms;
	uint64_t drain_deadline_ms;
	uint64_t last_busy_ms; /* exit_idle_s: last time anything was open */
	/* Signatures served from the hot map since the last tick: the store
	 * hears of them (last_used, hits) from libuv's pool, so that its LRU
	 * does not evict the kernels served most. */
	uint8_t (*mem_hits)[KILN_SIG_BYTES];
	size_t n_mem_hits;
	bool mem_hits_busy;
	uv_tcp_t metrics; /* metrics_listen */
	bool metrics_on;
	uint64_t started_ms;
	int exit_code;
};

/* ---- server.c ----------------------------------------------------------- */

/* Loads the settings, opens the store and the pool, listens, runs the loop
 * until a drain finishes. Returns the exit status. */
int kilnd_run(int argc, char **argv);

/* Replies (each finishes one request: conn->inflight--). The artifact
 * reply writes the blob's bytes straight from the blob (no copy). */
void kilnd_reply_error(kilnd_conn_t *c, uint64_t id, int code, const char *msg,
		       int64_t node);
void kilnd_reply_artifact(kilnd_conn_t *c, uint64_t id, kilnd_blob_t *b,
			  const char *source, double compile_ms);
/* A success reply already packed into sb after kiln_frame_begin and a
 * kiln_pack_ok_head; takes sb's memory. */
void kilnd_reply_packed(kilnd_conn_t *c, msgpack_sbuffer *sb);
void kilnd_conn_ref(kilnd_conn_t *c);
void kilnd_conn_unref(kilnd_conn_t *c);
bool kilnd_conn_is_admin(kilnd_conn_t *c);

/* Single flight: the job for sig in flight, or NULL. */
kilnd_job_t *kilnd_job_find(kilnd_server_t *s, const uint8_t sig[32]);
/* Starts a job (store lookup, then compile) with its first waiter; takes
 * the graph. */
void kilnd_job_start(kilnd_server_t *s, kilnd_conn_t *c, uint64_t id,
		     kiln_graph_t *g, const kiln_target_t *t,
		     const kiln_compile_opts_t *o, kilnd_prio_t prio,
		     const uint8_t sig[32]);
void kilnd_job_join(kilnd_server_t *s, kilnd_job_t *j, kilnd_conn_t *c,
		    uint64_t id);
/* Answers the request with the artifact for sig: hot map, a job in flight,
 * else a new job for g (taken; freed when not needed). */
void kilnd_serve(kilnd_server_t *s, kilnd_conn_t *c, uint64_t id,
		 kiln_graph_t *g, const kiln_target_t *t,
		 const kiln_compile_opts_t *o, kilnd_prio_t prio,
		 const uint8_t sig[32], kilnd_dyn_t *dyn,
		 kiln_graph_t *fallback, const uint8_t *fallback_sig);
/* Starts draining (stop accepting, finish in-flight work, exit). */
void kilnd_drain(kilnd_server_t *s, bool wait_for_compiles);
uint64_t kilnd_now_ms(kilnd_server_t *s);
/* host:port (IPv4, or IPv6 with or without brackets) into *sa; errors name
 * the setting. */
int kilnd_parse_hostport(const char *setting, const char *hostport,
			 struct sockaddr_storage *sa, char *err, size_t errlen);
/* Counts a hot-map hit and queues the store's touch of it. */
void kilnd_memory_hit(kilnd_server_t *s, const uint8_t sig[32]);

/* ---- metrics.c ---------------------------------------------------------- */

/* Starts the HTTP listener of metrics_listen (GET /metrics). */
int kilnd_metrics_listen(kilnd_server_t *s, const char *hostport, char *err,
			 size_t errlen);
void kilnd_metrics_close(kilnd_server_t *s);

/* ---- memo.c ------------------------------------------------------------- */

/* Finds the id in a request's bytes (a fixmap whose "id" comes among its
 * first small scalars); false when the request cannot be memoized. */
bool kilnd_memo_key(const uint8_t *body, size_t len, kilnd_memo_key_t *k);
/* The signature that answered these exact bytes before, if any. */
bool kilnd_memo_get(kilnd_server_t *s, const kilnd_memo_key_t *k,
		    uint8_t sig[KILN_SIG_BYTES]);
/* Records it (k may be NULL: nothing to record). */
void kilnd_memo_put(kilnd_server_t *s, const kilnd_memo_key_t *k,
		    const uint8_t sig[KILN_SIG_BYTES]);
int kilnd_memo_init(kilnd_server_t *s);
void kilnd_memo_free(kilnd_server_t *s);

/* ---- ops.c -------------------------------------------------------------- */

/* Packs the "stats" map of a status reply (st: the store's counters). */
void kilnd_pack_stats(kilnd_server_t *s, msgpack_packer *pk,
		      const kiln_cache_stats_t *st);

/* Handles one decoded request (the request's memory lives until return). */
void kilnd_dispatch(kilnd_conn_t *c, const kiln_request_t *req);

#endif /* KILND_SERVER_H */
