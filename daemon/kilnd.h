/*
 * kilnd.h — the daemon's internal interfaces: the server (loop thread), the
 * hot map, the compile pool, the counters. Not installed.
 *
 * Threads (DESIGN.md "Daemon"):
 *   - the loop thread owns sockets, connections, the in-flight table, the
 *     hot map and every job's waiter list; it never compiles and never
 *     touches disk;
 *   - store reads, list/evict/gc run on libuv's thread pool
 *     (uv_queue_work), and hand results back in their after_work callback
 *     on the loop thread;
 *   - compiles run on kiln's own workers (pool.c), one kiln_compiler_t each,
 *     fed by a bounded priority queue; a finished job goes on the done queue
 *     and one uv_async_t wakes the loop.
 */
#ifndef KILND_H
#define KILND_H

#include "cache/cache.h"
#include "daemon/config.h"
#include "protocol/protocol.h"

#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

/* ---- artifact bytes shared by replies, the hot map and jobs ------------- */

/* Immutable once made; freed when the last reference goes. References are
 * taken and dropped on the loop thread, except that a worker makes one and
 * hands it over. */
typedef struct kilnd_blob {
	atomic_uint refs;
	uint8_t sig[KILN_SIG_BYTES];
	double compile_ms;
	size_t len;
	uint8_t data[];
} kilnd_blob_t;

kilnd_blob_t *kilnd_blob_new(const uint8_t sig[KILN_SIG_BYTES],
			     const void *data, size_t len, double compile_ms);
kilnd_blob_t *kilnd_blob_ref(kilnd_blob_t *b);
void kilnd_blob_unref(kilnd_blob_t *b);

/* ---- hot map (hot.c): loop thread only ---------------------------------- */

typedef struct kilnd_hot kilnd_hot_t;

kilnd_hot_t *kilnd_hot_new(uint64_t max_bytes);
void kilnd_hot_free(kilnd_hot_t *h);
/* A new reference to the blob for sig (and marks it recently used), or
 * NULL. */
kilnd_blob_t *kilnd_hot_get(kilnd_hot_t *h, const uint8_t sig[KILN_SIG_BYTES]);
/* Inserts (taking a new reference; replacing an older blob for the same
 * sig) and evicts least recently used blobs down to max_bytes. A blob
 * larger than max_bytes is not kept. */
void kilnd_hot_put(kilnd_hot_t *h, kilnd_blob_t *b);
void kilnd_hot_remove(kilnd_hot_t *h, const uint8_t sig[KILN_SIG_BYTES]);
void kilnd_hot_clear(kilnd_hot_t *h);
void kilnd_hot_set_max(kilnd_hot_t *h, uint64_t max_bytes);
uint64_t kilnd_hot_bytes(const kilnd_hot_t *h);
uint64_t kilnd_hot_count(const kilnd_hot_t *h);

/* ---- counters (stats.c) ------------------------------------------------- */

/* Counters kept per thread (loop, each worker) and summed on read.
 * X(name, doc) */
/* clang-format off */
#define KILND_COUNTERS(X)                                                      \
	X(conn_total, "connections accepted")                                  \
	X(conn_rejected, "connections refused (max_connections)")              \
	X(conn_idle_closed, "connections closed for idleness")                 \
	X(bad_frames, "connections closed for a bad frame")                    \
	X(req_hello, "hello requests")                                         \
	X(req_compile, "compile requests")                                     \
	X(req_lookup, "lookup requests")                                       \
	X(req_status, "status requests")                                       \
	X(req_list, "list requests")                                           \
	X(req_evict, "evict requests")                                         \
	X(req_gc, "gc requests")                                               \
	X(req_shutdown, "shutdown requests")                                   \
	X(hit_memory, "answered from the hot map")                             \
	X(hit_disk, "answered from the local store")                           \
	X(hit_remote, "answered from the remote tier")                         \
	X(compiled, "compiles finished")                                       \
	X(joined, "requests that joined a running compile")                    \
	X(lookup_misses, "lookups (and evicts) of signatures not stored")       \
	X(failed, "compiles that failed")                                      \
	X(timeouts, "requests answered timeout")                               \
	X(busy, "requests answered busy")                                      \
	X(store_put_errors, "compiled artifacts the store could not keep")     \
	X(dynamic_compiles, "generalized (symbolic) graphs compiled")          \
	X(dynamic_hits, "static requests served by a generalized artifact")    \
	X(dynamic_refused, "structures that could not be generalized")         \
	X(read_paused, "times a connection's reads paused (backpressure)")    \
	X(worker_spawns, "compile worker processes started")                   \
	X(worker_crashes, "compile workers that died or were killed")
/* clang-format on */

enum {
#define KILND__CTR_ENUM(name, doc) KILND_C_##name,
	KILND_COUNTERS(KILND__CTR_ENUM)
#undef KILND__CTR_ENUM
	    KILND_C__COUNT
};

typedef struct kilnd_counters {
	_Atomic uint64_t v[KILND_C__COUNT];
	_Atomic uint64_t errors[32]; /* by -code - 3000 (KILN_E*) */
} kilnd_counters_t;

#define KILND_COUNT(ctr, name)                                                 \
	atomic_fetch_add_explicit(&(ctr)->v[KILND_C_##name], 1,                \
				  memory_order_relaxed)

void kilnd_count_error(kilnd_counters_t *c, int code);

/* A window of recent compile times for p50/p90/p99 (mutex inside). */
typedef struct kilnd_latency {
	pthread_mutex_t mu;
	double ms[1024];
	uint32_t n, next;
} kilnd_latency_t;

void kilnd_latency_init(kilnd_latency_t *l);
void kilnd_latency_add(kilnd_latency_t *l, double ms);
/* q in [0,1]; 0 when empty. */
void kilnd_latency_quantiles(kilnd_latency_t *l, double *p50, double *p90,
			     double *p99);
/* Resident set size in bytes (from /proc/self/statm), 0 if unknown. */
uint64_t kilnd_rss_bytes(void);

/* ---- the compile pool (pool.c) ------------------------------------------ */

typedef struct kilnd_server kilnd_server_t;
typedef struct kilnd_job kilnd_job_t;

typedef enum { KILND_PRIO_INTERACTIVE = 0, KILND_PRIO_BATCH = 1 } kilnd_prio_t;

typedef struct kilnd_waiter kilnd_waiter_t;

/* One compile (or store lookup) that any number of requests wait for. */
struct kilnd_job {
	/* Set on the loop thread before the job is queued; read-only while a
	 * worker has it. */
	uint8_t sig[KILN_SIG_BYTES];
	char sig_hex[KILN_SIG_HEX];
	kiln_graph_t *graph;
	kiln_target_t target;
	kiln_compile_opts_t opts;
	kilnd_prio_t prio;
	kilnd_server_t *srv;
	uint64_t req_id;  /* of the request that started it (logs) */
	int64_t peer_pid; /* of that request's peer (logs) */
	/* Written by the worker, read by the loop after done. */
	int rc;
	char err[512];
	int64_t err_node;
	kilnd_blob_t *result;
	double compile_ms;
	/* Pool queue link (under the pool's mutex). */
	kilnd_job_t *qnext;
	/* Loop thread only. */
	struct kilnd_dyn *dyn; /* a generalized compile: its table entry */
	uint8_t dyn_h[KILN_SIG_BYTES]; /* ... whose structure hash is this */
	kiln_graph_t *fallback; /* ... and the static graph to compile if it
				   fails */
	/* ... refused (failed, so the static graph compiles) when it leaves
	 * an op kiln lowers to torch at a symbolic size: automatic dynamic
	 * shapes, not dynamic: true (set before the job is queued) */
	bool dyn_strict;
	uint8_t fallback_sig[KILN_SIG_BYTES];
	kilnd_waiter_t *waiters;
	kilnd_job_t *hnext; /* in-flight table chain */
	uv_timer_t timer;   /* compile_timeout_s */
	uv_work_t work;	    /* the store lookup before compiling */
	int state;
	bool timer_on;
	kilnd_job_t *dnext; /* done-queue link */
};

typedef struct kilnd_pool kilnd_pool_t;

/* A compile worker process (kiln-compile-worker, worker.c), owned by one
 * pool thread: started on first use, stopped when idle. */
typedef struct kilnd_child kilnd_child_t;

typedef struct kilnd_pool_opts {
	unsigned threads;	 /* compile threads (0: 1) */
	const char *worker_path; /* the kiln-compile-worker executable */
	uint32_t worker_idle_s;	 /* stop a worker idle this long (0: never) */
	uint32_t kill_after_s;	 /* kill a compile running this long */
	uint32_t queue_depth;
} kilnd_pool_opts_t;

/* Starts the threads. The first thread's worker process is started before
 * returning (its hello gives the fingerprint and the target), so a missing
 * or broken worker fails here. done is called on a pool thread after each
 * job (it must only queue and wake the loop). */
int kilnd_pool_new(const kilnd_pool_opts_t *o, kilnd_counters_t *workers_ctr,
		   void (*done)(kilnd_job_t *job, void *arg), void *arg,
		   kilnd_pool_t **out, char *err, size_t errlen);
/* Compiles g in the thread's worker process (starting it if needed):
 * *art (malloc'd) holds the artifact's bytes. Errors: the worker's (as
 * KILN_E* codes, message in err), or KILN_ECOMPILE when the worker died or
 * was killed (it is restarted for the next job). */
int kilnd_child_compile(kilnd_child_t *ch, const kiln_graph_t *g,
			const kiln_compile_opts_t *opts, const char *sig_hex,
			uint8_t **art, size_t *len, double *compile_ms,
			uint32_t *sym_fallbacks, char *err, size_t errlen);
/* Worker processes alive now. */
uint32_t kilnd_pool_alive(kilnd_pool_t *p);
/* Queues a job; KILN_EBUSY when the queue is full, KILN_ESHUTDOWN when
 * stopping. */
int kilnd_pool_submit(kilnd_pool_t *p, kilnd_job_t *job, kilnd_prio_t prio);
void kilnd_pool_set_depth(kilnd_pool_t *p, uint32_t depth);
/* Queued jobs, busy workers, workers. */
void kilnd_pool_load(kilnd_pool_t *p, uint32_t *queued, uint32_t *busy,
		     uint32_t *total);
/* Seconds since the oldest running job started (0 when idle): the
 * watchdog's check that workers make progress. */
double kilnd_pool_oldest_running_s(kilnd_pool_t *p);
/* Stops taking jobs; queued ones are handed to done with
 * job->rc = KILN_ESHUTDOWN. Workers finish their current job. */
void kilnd_pool_stop(kilnd_pool_t *p);
/* Joins the workers (after stop) and frees the pool. */
void kilnd_pool_free(kilnd_pool_t *p);
/* The fingerprint and resolved target of the pool's compilers. */
const char *kilnd_pool_fingerprint(kilnd_pool_t *p);
const kiln_target_t *kilnd_pool_target(kilnd_pool_t *p);

/* Called on a pool thread to compile job (pool.c calls this, server.c
 * implements it): compile in ch, store, set job->result / job->rc. ctr is
 * the thread's own counter block. */
void kilnd_job_run(kilnd_child_t *ch, kilnd_counters_t *ctr, kilnd_job_t *job);

#endif /* KILND_H */
