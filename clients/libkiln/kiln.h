/*
 * kiln.h — libkiln, kiln's C client library: the one public header of
 * clients/libkiln.
 *
 * Sections:
 *   1. Thread pool   — the persistent worker threads kernels run on.
 *   2. Modules       — an artifact (protocol/ARTIFACT.md) with its CPU code
 *                      loaded: memfd + dlopen, one function per kernel.
 *   3. Running       — bind symbols from the inputs, check them against the
 *                      specs, run the plan, hand out the outputs.
 *   4. Client        — connect to kilnd, compile, lookup (a later issue).
 *
 * Conventions (DESIGN.md "House style"): fallible functions return 0 or a
 * negative code (KILN_E* from protocol.h, or -errno); detail goes into the
 * caller's err[errlen] buffer (may be NULL), never a global. _free(NULL) is
 * a no-op. Ownership is stated on every function.
 *
 * Threads: a pool may be shared by any number of threads, each of which may
 * submit work at the same time. A module is immutable after it is loaded and
 * may be run from several threads at once; each concurrent run gets its own
 * scratch arena. The only global state is the default pool, created once.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include "protocol/protocol.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* 1. Thread pool                                                            */
/* ======================================================================== */

/*
 * A fixed set of worker threads that split a range [0, extent) into
 * contiguous pieces. The thread that submits the range works on it too, so a
 * pool of n threads has n - 1 workers. Idle workers spin briefly (tens of
 * microseconds, so back-to-back kernel steps find them awake) and then sleep
 * on a futex. Several threads may submit at once: their ranges queue up and
 * idle workers help whichever has pieces left.
 */
typedef struct kiln_pool kiln_pool_t;

/* Work on [begin, end): called once per piece, from any pool thread. */
typedef void (*kiln_range_fn)(void *ctx, int64_t begin, int64_t end);

#define KILN_POOL_MAX_THREADS 1024

/*
 * Creates a pool of n_threads participants (n_threads - 1 workers; 0 means
 * the number of CPUs this process may run on). On success *out is owned by
 * the caller: kiln_pool_free. Errors: -EINVAL (n_threads over
 * KILN_POOL_MAX_THREADS), -ENOMEM, -EAGAIN (a thread could not be started).
 */
int kiln_pool_new(unsigned n_threads, kiln_pool_t **out);

/*
 * Stops and joins the workers and frees the pool. No range may be running on
 * it. NULL is a no-op. Never call it on kiln_pool_default().
 */
void kiln_pool_free(kiln_pool_t *p);

/*
 * The process-wide pool, created on first use (pthread_once) with
 * $KILN_THREADS participants when that is set to 1 .. KILN_POOL_MAX_THREADS,
 * else one per online CPU this process may run on (in OpenMP mode,
 * kiln_pool_kind: omp_get_max_threads() at each range). Owned by libkiln
 * and never freed. NULL only when even a one-thread pool could not be
 * allocated (callers then run inline).
 */
kiln_pool_t *kiln_pool_default(void);

/* The number of participants (workers + the submitting thread). */
unsigned kiln_pool_threads(const kiln_pool_t *p);

/*
 * "kiln" (a pool of kiln's own threads), "openmp" (the default pool in a
 * process with GNU OpenMP loaded, torch's: its ranges run as parallel
 * regions of that runtime, on its threads; KILN_POOL=auto|openmp|own, see
 * clients/libkiln/README.md) or "none" (p NULL).
 */
const char *kiln_pool_kind(const kiln_pool_t *p);

/*
 * Calls fn(ctx, b, e) over contiguous pieces that cover [0, extent) exactly
 * once, each at least `grain` units long (grain < 1 counts as 1), using at
 * most kiln_pool_threads(p) pieces, and returns when all are done. The
 * calling thread takes part. extent <= grain (or a one-thread pool, or
 * p == NULL) runs fn(ctx, 0, extent) inline with no pool round trip;
 * extent <= 0 calls nothing. Cannot fail.
 */
void kiln_pool_parallel_for(kiln_pool_t *p, int64_t extent, int64_t grain,
			    kiln_range_fn fn, void *ctx);

/* ======================================================================== */
/* 2. Modules                                                                */
/* ======================================================================== */

/*
 * The kernel ABI (ARTIFACT.md § Kernel ABI): every kernel of a CPU artifact
 * is an exported C function
 *
 *     void k(void **bufs, const int64_t *syms, int64_t begin, int64_t end);
 *
 * bufs[] holds the step's buffers as pointers (in the step's order), syms[]
 * the values of the artifact's symbols (declaration order), and the kernel
 * does units [begin, end) of its parallel extent. It may be called from
 * several threads at once with disjoint ranges.
 */
typedef void (*kiln_kernel_fn)(void **bufs, const int64_t *syms, int64_t begin,
			       int64_t end);

/* An artifact with its code loaded. Immutable; any thread may run it. */
typedef struct kiln_module kiln_module_t;

/*
 * Decodes the artifact bytes p[0..n) (untrusted: kiln_artifact_decode with
 * lim, NULL for the defaults) and loads it as kiln_module_from_artifact
 * does. The bytes are not referenced afterwards. On success *out is owned by
 * the caller: kiln_module_free. Errors: those of kiln_artifact_decode and of
 * kiln_module_from_artifact.
 */
int kiln_module_load(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		     kiln_module_t **out, char *err, size_t errlen);

/*
 * Loads a decoded artifact, taking ownership of `a` in every case: on
 * success the module frees it (kiln_module_free), on failure this function
 * has already freed it. CPU code is written to a memfd and dlopen'ed from
 * /proc/self/fd/N (the fd is closed right after), then every kernel is
 * looked up by name. Errors:
 *   KILN_EUNSUPOP   a CUDA (or any non-CPU) target: not loadable yet;
 *   KILN_EINVGRAPH  the code is not an ELF shared object for this machine,
 *                   dlopen refused it (its message is quoted), or a kernel's
 *                   symbol is missing ("kernel 2: symbol \"k2\" not found");
 *   -EINVAL         KILN_NT_BYTES is set to something other than a byte
 *                   count or "off" (the message names it);
 *   -errno          memfd_create / write failed; -ENOMEM.
 */
int kiln_module_from_artifact(kiln_artifact_t *a, kiln_module_t **out,
			      char *err, size_t errlen);

/*
 * The size in bytes from which kernels write a buffer with streaming
 * (non-temporal) stores, set in every module this process loads:
 * KILN_NT_BYTES (a byte count with an optional K, M or G suffix, or "off"),
 * else 3/4 of the host's L3 cache (INT64_MAX, never, where none is known).
 * Read once. -1 when KILN_NT_BYTES is malformed (module loads then fail).
 */
int64_t kiln_nt_min_bytes(void);

/*
 * dlcloses the code and frees the artifact, the cached arenas and the
 * module. No run may be in progress. Tensors that runs handed out that point
 * into caller-owned or runtime-allocated output buffers stay valid (those
 * buffers are not the module's). NULL is a no-op.
 */
void kiln_module_free(kiln_module_t *m);

/* The module's artifact (owned by the module; valid until it is freed). */
const kiln_artifact_t *kiln_module_artifact(const kiln_module_t *m);

/* The kernel function of kernels[k] (NULL when k is out of range). */
kiln_kernel_fn kiln_module_kernel(const kiln_module_t *m, uint32_t k);

/* Counters since the module was loaded (memcached-style, for status). */
typedef struct kiln_module_stats {
	uint64_t runs;	       /* kiln_module_run calls that succeeded */
	uint64_t failed_runs;  /* ... that returned an error */
	uint64_t contexts;     /* run contexts created (peak concurrency) */
	uint64_t arena_allocs; /* scratch arenas allocated or grown */
	uint64_t fallbacks;    /* fallback steps handed to a callback */
} kiln_module_stats_t;

/* Copies the counters (a consistent-enough snapshot; relaxed reads). */
void kiln_module_stats(const kiln_module_t *m, kiln_module_stats_t *out);

/* ======================================================================== */
/* 3. Running                                                                */
/* ======================================================================== */

/* A run's input or output value: a tensor or (SymInt) an integer. */
typedef enum { KILN_IO_TENSOR, KILN_IO_INT } kiln_io_kind_t;

typedef struct kiln_io {
	kiln_io_kind_t kind;
	int64_t i;	 /* KILN_IO_INT */
	kiln_tensor_t t; /* KILN_IO_TENSOR; t.data is never owned by kiln_io */
} kiln_io_t;

/*
 * Executes a FALLBACK step (an ATen op kiln did not compile), normally
 * through torch. views[0 .. a->n_views) are all of the artifact's views
 * resolved for this run; the step a->steps[step_index] names its tensor
 * arguments {"ref": k} as views[k] and must have its results written into
 * views[step.out[j]] (same dtype and shape; the memory is the runtime's or
 * the caller's, valid during the call only). Returns 0, or a negative code
 * with detail in err[errlen], which fails the run.
 */
typedef int (*kiln_fallback_fn)(void *user, const kiln_artifact_t *a,
				uint32_t step_index, const kiln_tensor_t *views,
				char *err, size_t errlen);

/*
 * During a fallback callback, the values of the artifact's symbols bound for
 * the run that called it (syms[i] is the i-th entry of a->symbols), for a
 * step whose arguments hold {"sym": expr}; *n gets the count. NULL (and *n
 * 0) on a thread that is not inside a fallback callback. The array is valid
 * during the callback only.
 */
const int64_t *kiln_fallback_syms(uint32_t *n);

/* Run options. Initialize to zero ({0} or designated initializers): new
 * fields are appended, NULL/0 meaning the old behaviour. libkiln has no
 * stable ABI yet: a program must be built against the kiln.h of the
 * libkiln it loads (step_ms was appended on 2026-11-30; a binary built
 * before would leave it as garbage). */
typedef struct kiln_run_opts {
	kiln_pool_t *pool;	   /* NULL: kiln_pool_default() */
	kiln_fallback_fn fallback; /* NULL: a fallback step fails the run */
	void *fallback_user;	   /* passed to fallback as `user` */
	/* NULL, or kiln_module_n_steps(m) entries: each plan step's wall
	 * time in ms is added to its entry (kilnc --profile); not atomic:
	 * runs at the same time need an array each */
	double *step_ms;
} kiln_run_opts_t;

/* The artifact's counts, for sizing the arrays below. */
uint32_t kiln_module_n_inputs(const kiln_module_t *m);
uint32_t kiln_module_n_outputs(const kiln_module_t *m);
uint32_t kiln_module_n_out_buffers(const kiln_module_t *m);
/* The plan's steps (kernel launches and fallback steps), in run order. */
uint32_t kiln_module_n_steps(const kiln_module_t *m);

/*
 * Checks the inputs as kiln_module_run does and writes the byte size of each
 * output buffer for them into sizes[0 .. kiln_module_n_out_buffers(m)), so
 * the caller can allocate them (e.g. as torch tensors). Nothing runs.
 * Errors: KILN_EINVGRAPH (the inputs do not match; see kiln_module_run),
 * -ENOMEM.
 */
int kiln_module_out_sizes(kiln_module_t *m, const kiln_io_t *inputs,
			  uint32_t n_inputs, size_t *sizes, char *err,
			  size_t errlen);

/*
 * Runs the module once.
 *
 * inputs[0 .. n_inputs): one per artifact input, a tensor (dtype, rank,
 * sizes and strides must match the spec once the symbols are bound; strides
 * of dimensions of size <= 1, and all strides of an empty tensor, are not
 * compared) or an int for a SymInt input. Symbols are bound from the places
 * the artifact's bindings name and checked against their min/max. The
 * caller keeps ownership of the input memory, which must stay valid and
 * unchanged during the run.
 *
 * out_bufs[0 .. kiln_module_n_out_buffers(m)) (NULL when there are none):
 * a non-NULL entry is a caller-owned buffer of at least the size
 * kiln_module_out_sizes reports, 64-byte alignment recommended; a NULL entry
 * is allocated by the runtime (64-byte aligned) and stored back: the caller
 * owns it and releases it with free(). On failure the entries the runtime
 * allocated are freed and reset to NULL.
 *
 * outputs[0 .. kiln_module_n_outputs(m)) are filled: a tensor whose data
 * points into an output buffer or into an input (an output may be a view of
 * an input), or an int. They own nothing. Several outputs may point into
 * one output buffer (views of one value, as torch's own would be), so
 * release the buffers, not the outputs' data.
 *
 * opts may be NULL (default pool, no fallback callback). Kernel steps run in
 * order on the pool; a fallback step calls opts->fallback on this thread.
 *
 * Errors: KILN_EINVGRAPH ("input 2: strides [1, 4] but the artifact was
 * compiled for [4, 1]", symbol bounds, an expression that overflows, a view
 * outside its buffer), KILN_EUNSUPOP (a fallback step and no callback: the
 * message names the step, node and op), the fallback's own code (a
 * positive one becomes KILN_EINTERNAL), -EINVAL (out_bufs or outputs NULL
 * where entries are needed), -ENOMEM. Safe to call from several threads at
 * once on the same module.
 */
int kiln_module_run(kiln_module_t *m, const kiln_io_t *inputs,
		    uint32_t n_inputs, void **out_bufs, kiln_io_t *outputs,
		    const kiln_run_opts_t *opts, char *err, size_t errlen);

/* ======================================================================== */
/* 4. Client (kilnd connection)                                              */
/* ======================================================================== */

/*
 * A connection to kilnd (PROTOCOL.md). A handle is thread-safe: calls on
 * one handle are serialized by its mutex (one request on the wire at a
 * time); threads that want parallel requests open one handle each. A call
 * that finds the connection broken (kilnd restarted) reconnects once and
 * retries, except for the ops that change state (evict, gc, shutdown).
 * Every call has a timeout (opts.timeout_ms); past it the call fails with
 * KILN_ETIMEOUT and the connection is dropped (a late reply cannot be
 * mistaken for the next one's).
 */
typedef struct kiln_client kiln_client_t;

typedef struct kiln_client_opts {
	/* The socket; NULL: as kilnd finds it ($KILN_SOCKET; /run/kiln/
	 * kilnd.sock for root; $XDG_RUNTIME_DIR/kiln/kilnd.sock; else
	 * /tmp/kiln-<uid>/kilnd.sock). */
	const char *socket;
	int timeout_ms; /* per call; 0: 600000 (a compile may be slow) */
	int connect_timeout_ms; /* 0: 5000 (covers an auto-start) */
	/* Start a per-user kilnd when none answers on the socket: -1 reads
	 * $KILN_AUTOSTART (on unless "0"), 0 never, 1 always. Never for the
	 * system socket (/run/kiln). Race-free: connect, take
	 * <socket dir>/autostart.lock, connect again, spawn, wait. */
	int autostart;
	const char *kilnd_path;	   /* NULL: $KILND, else "kilnd" in $PATH */
	uint32_t autostart_idle_s; /* the started kilnd exits when idle this
				      long; 0: 600 */
	size_t cache_bytes;	   /* in-process artifact cache; 0: 64 MiB; to
				      disable, set cache_disable */
	bool cache_disable;
} kiln_client_opts_t;

void kiln_client_opts_init(kiln_client_opts_t *o);

/* Connects (auto-starting kilnd as the options say). *out: free with
 * kiln_client_free. Errors: -ENOENT/-ECONNREFUSED (no kilnd, err says
 * where it looked), KILN_ETIMEOUT, -ENOMEM. */
int kiln_client_connect(const kiln_client_opts_t *o, kiln_client_t **out,
			char *err, size_t errlen);
void kiln_client_free(kiln_client_t *c);
/* The socket path in use. */
const char *kiln_client_socket(const kiln_client_t *c);

typedef struct kiln_server_info {
	char server[32];
	char version[32];
	uint32_t protocol;
	char fingerprint[256];
	kiln_target_t target; /* the first (CPU) target */
	uint64_t max_frame_bytes;
	uint32_t max_nodes, max_inflight;
} kiln_server_info_t;

/* hello (cached after the first call on a connection). */
int kiln_client_hello(kiln_client_t *c, kiln_server_info_t *out, char *err,
		      size_t errlen);

typedef struct kiln_result {
	uint8_t *artifact; /* malloc'd; kiln_result_free */
	size_t artifact_len;
	char signature[KILN_SIG_HEX];
	char source[16]; /* memory|disk|remote|compiled|joined, or "local":
			    the in-process cache */
	double compile_ms;
	int64_t err_node; /* on an error reply naming a node, else -1 */
} kiln_result_t;

void kiln_result_free(kiln_result_t *r);

/*
 * Compiles g: the in-process cache first, then `lookup` by the signature
 * computed here (with hello's fingerprint and target), then `compile` with
 * the graph. t NULL: the daemon's CPU target; o NULL: defaults; dynamic -1
 * (automatic), 0, 1; priority NULL ("interactive") or "batch". On success
 * *out holds the artifact. Errors: the daemon's (KILN_E*, message in err,
 * out->err_node set when it names a node), transport errors.
 */
int kiln_client_compile(kiln_client_t *c, const kiln_graph_t *g,
			const kiln_target_t *t, const kiln_compile_opts_t *o,
			int dynamic, const char *priority, kiln_result_t *out,
			char *err, size_t errlen);
/* The same for a Graph v1 file (.msgpack). */
int kiln_client_compile_file(kiln_client_t *c, const char *path,
			     const kiln_target_t *t,
			     const kiln_compile_opts_t *o, int dynamic,
			     const char *priority, kiln_result_t *out,
			     char *err, size_t errlen);
/* The same for Graph v1 bytes (the Python package's entry): the daemon's
 * CPU target; mode NULL or "" is "default". */
int kiln_client_compile_bytes(kiln_client_t *c, const uint8_t *p, size_t n,
			      const char *mode, int dynamic,
			      const char *priority, kiln_result_t *out,
			      char *err, size_t errlen);
/* lookup by 64 hex chars: KILN_ENOTFOUND when the daemon does not have it. */
int kiln_client_lookup(kiln_client_t *c, const char *sig_hex,
		       kiln_result_t *out, char *err, size_t errlen);

/*
 * Any op: fields is NULL or one msgpack map of the op's fields (packed by
 * the caller). On success *reply is the whole response map's msgpack
 * bytes (malloc'd, free()). An error reply is returned as its code with
 * the message in err. Used by status, list, evict, gc, shutdown and
 * kilnctl.
 */
int kiln_client_call(kiln_client_t *c, kiln_op_t op, const void *fields,
		     size_t fields_len, uint8_t **reply, size_t *reply_len,
		     char *err, size_t errlen);

/* Compiles (as kiln_client_compile) and loads the artifact: *out is a
 * module ready for kiln_module_run (kiln_module_free). */
int kiln_compile_and_load(kiln_client_t *c, const kiln_graph_t *g,
			  const kiln_target_t *t, const kiln_compile_opts_t *o,
			  kiln_module_t **out, char *err, size_t errlen);

/* kiln_run: runs a loaded module's plan on the caller's buffers (the same
 * as kiln_module_run). */
#define kiln_run kiln_module_run

/*
 * Prometheus text exposition (version 0.0.4) of a `status` reply's "stats"
 * map: every counter and gauge as kiln_<path>{...}, with # HELP and
 * # TYPE lines. *out is malloc'd text (free()). Used by `kilnctl metrics`
 * and kilnd's metrics listener.
 */
int kiln_metrics_format(const msgpack_object *stats, char **out, size_t *len);

/* ======================================================================== */
/* 5. BLAS                                                                   */
/* ======================================================================== */

/*
 * Kernels call BLAS (OpenBLAS by default, KILN_BLAS) for the matrix products
 * kiln's GEMM template does not take. OpenBLAS picks its kernels once, when
 * it is loaded: from $OPENBLAS_CORETYPE, else from the CPU's model number,
 * and 0.3.21 (Debian 12) runs its SSE3 "Prescott" kernels on a model it
 * does not know (most VMs, recent Xeons): 2-5x slower on AVX-512 machines.
 *
 * kiln_blas_prepare sets OPENBLAS_CORETYPE to kiln_blas_coretype(), once
 * per process, unless it is set already (the user's choice wins) or
 * OpenBLAS (libopenblas.so.0, or $KILN_BLAS) is loaded already (it has
 * chosen). It is left set, for the kernels' own load of OpenBLAS at their
 * first product and for child processes. kiln_module_from_artifact calls it
 * before loading CPU code, the compiler before it probes BLAS. Returns the
 * value it set, or NULL where it set nothing. Once per process
 * (pthread_once), but setenv itself is not safe against a getenv or setenv
 * of another thread running at the same moment: a program with threads of
 * its own that read the environment calls it early (the Python runtime
 * loads modules holding the GIL).
 */
const char *kiln_blas_prepare(void);

/* The OpenBLAS core kiln asks for, by the CPU's features: "SkylakeX"
 * (AVX-512 F, CD, BW, DQ, VL; its sgemm/dgemm kernels are also those of
 * Cooperlake and SapphireRapids), "Haswell" (AVX2, FMA), else NULL (and
 * NULL off x86-64). */
const char *kiln_blas_coretype(void);

/* The core of the OpenBLAS at path (NULL: libopenblas.so.0), as its
 * openblas_get_corename says ("SkylakeX", "Prescott"), if it is loaded in
 * this process; NULL if it is not loaded or is not OpenBLAS. The string
 * is OpenBLAS's: valid while the library stays loaded (a kernel's or the
 * caller's reference). */
const char *kiln_blas_corename(const char *path);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
