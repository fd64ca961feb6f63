/*
 * protocol.h — kiln's wire protocol: frames, the message envelope, Graph v1,
 * signatures, error codes, and the small utilities every part shares (arena,
 * logging).
 *
 * This is the one public header of protocol/. kilnd and every client use it,
 * so the same bytes mean the same thing on both sides. The formats are
 * specified in protocol/PROTOCOL.md and protocol/GRAPH.md; this header is the
 * C view of them.
 *
 * Threads: nothing here has global mutable state. Every object (decoder,
 * graph, arena) belongs to the thread that uses it; distinct objects may be
 * used from distinct threads at once. kiln_strerror() and the name tables are
 * immutable.
 *
 * Untrusted input: every decoder checks its input against a kiln_limits_t
 * before it allocates in proportion to a count found in that input.
 */
#ifndef KILN_PROTOCOL_H
#define KILN_PROTOCOL_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_STRING   "0.1.0"
#define KILN_PROTOCOL_VERSION 1

/* ------------------------------------------------------------------------ */
/* Errors                                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Fallible functions return 0 or a negative code: either -errno (system
 * errors) or one of these. Each KILN_E* code that has a wire name maps 1:1 to
 * an error code of the envelope (PROTOCOL.md, "Error codes"). The values sit
 * far below any errno.
 */
#define KILN_ERRNO_MAP(X)                                                      \
	X(BADFRAME, -3001, "bad_frame", "malformed frame")                     \
	X(BADREQ, -3002, "bad_request", "malformed request")                   \
	X(VERSION, -3003, "unsupported_version",                               \
	  "unsupported protocol version")                                      \
	X(INVGRAPH, -3004, "invalid_graph", "invalid graph")                   \
	X(UNSUPOP, -3005, "unsupported_op", "unsupported operator")            \
	X(COMPILE, -3006, "compile_failed", "compile failed")                  \
	X(TOOLARGE, -3007, "too_large", "input exceeds a limit")               \
	X(BUSY, -3008, "busy", "server busy")                                  \
	X(TIMEOUT, -3009, "timeout", "timed out")                              \
	X(NOTFOUND, -3010, "not_found", "not found")                           \
	X(PERM, -3011, "permission_denied", "permission denied")               \
	X(SHUTDOWN, -3012, "shutting_down", "server shutting down")            \
	X(INTERNAL, -3013, "internal", "internal error")

enum {
#define KILN__ERR_ENUM(name, val, wire, text) KILN_E##name = (val),
	KILN_ERRNO_MAP(KILN__ERR_ENUM)
#undef KILN__ERR_ENUM
};

/* Human text for any return code (KILN_E* or -errno). Never NULL. */
const char *kiln_strerror(int err);

/*
 * The envelope's error-code string for a return code: KILN_E* codes map to
 * their wire name; -ENOMEM and every other system error map to "internal".
 */
const char *kiln_err_wire_name(int err);

/* The KILN_E* code for a wire name, or 0 when the name is not in the list. */
int kiln_err_from_wire_name(const char *name, size_t len);

/*
 * The socket kilnd listens on by default and clients look for
 * (daemon/README.md "Where things are"): $KILN_SOCKET; /run/kiln/kilnd.sock
 * for root; $XDG_RUNTIME_DIR/kiln/kilnd.sock; else
 * /tmp/kiln-<uid>/kilnd.sock. 0, or -ENAMETOOLONG when it does not fit.
 */
int kiln_default_socket(char *out, size_t n);

/* Writes printf-style detail into err[errlen] (if err != NULL) and returns
 * code. */
int kiln__errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ------------------------------------------------------------------------ */
/* Logging                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum {
	KILN_LOG_ERROR = 0,
	KILN_LOG_WARN = 1,
	KILN_LOG_INFO = 2,
	KILN_LOG_DEBUG = 3
} kiln_log_level_t;

/* The process-wide threshold; set once at start-up, read by any thread. */
extern int kiln_log_level;

/* Writes one "level=... key=value ..." line to stderr. Use KILN_LOG. */
void kiln__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Tests the level before evaluating or formatting anything. */
#define KILN_LOG(level, ...)                                                   \
	do {                                                                   \
		if ((level) <= kiln_log_level)                                 \
			kiln__log((level), __VA_ARGS__);                       \
	} while (0)

/* ------------------------------------------------------------------------ */
/* Arena                                                                      */
/* ------------------------------------------------------------------------ */

/*
 * A bump allocator: many small allocations, one free. Used for decoded graphs
 * and (later) for a compile job. Not thread-safe: one owner thread.
 */
typedef struct kiln_arena kiln_arena_t;

/* Returns a new arena or NULL on out-of-memory. Free with kiln_arena_free. */
kiln_arena_t *kiln_arena_new(size_t first_block);
/* Frees every allocation of the arena and the arena. NULL is a no-op. */
void kiln_arena_free(kiln_arena_t *a);
/* 16-byte aligned, uninitialised; NULL on out-of-memory or overflow. */
void *kiln_arena_alloc(kiln_arena_t *a, size_t n);
/* Zeroed array of n elements of size sz; NULL on out-of-memory or overflow. */
void *kiln_arena_calloc(kiln_arena_t *a, size_t n, size_t sz);
/* A NUL-terminated copy of s[0..len); NULL on out-of-memory. */
char *kiln_arena_strndup(kiln_arena_t *a, const char *s, size_t len);
/* Bytes handed out so far (for stats and limits). */
size_t kiln_arena_used(const kiln_arena_t *a);

/* ------------------------------------------------------------------------ */
/* Limits on untrusted input                                                 */
/* ------------------------------------------------------------------------ */

typedef struct kiln_limits {
	size_t max_frame_bytes; /* frame body length; default 64 MiB */
	uint32_t max_depth;	/* msgpack nesting; default 24, at most 30 */
	uint32_t max_objects;	/* msgpack objects in one frame; default 4 Mi */
	uint32_t max_nodes;	/* graph nodes; default 100 000 */
	uint32_t max_values;	/* graph values (inputs + node outputs); 1 Mi */
	uint32_t max_rank;	/* tensor rank; default 12, at most 16 */
	uint32_t max_str_bytes; /* any string (op name, kwarg key); 4 KiB */
	uint32_t max_symbols;	/* declared symbols; default 1024 */
	uint32_t max_expr_nodes; /* size of one dim expression; default 64 */
} kiln_limits_t;

#define KILN_MAX_RANK_HARD  16
#define KILN_MAX_DEPTH_HARD 30

/* The defaults above. */
void kiln_limits_default(kiln_limits_t *lim);

/* ------------------------------------------------------------------------ */
/* Frames                                                                     */
/* ------------------------------------------------------------------------ */

/*
 * A frame is a uint32 big-endian length N, then N bytes holding exactly one
 * msgpack map. The decoder is incremental: feed it whatever a read returned,
 * get whole frames out. It checks N against max_frame_bytes (and N == 0)
 * before it allocates.
 */
typedef struct kiln_frame_decoder {
	size_t max_frame_bytes;
	uint8_t hdr[4];
	uint32_t hdr_have; /* header bytes seen of the current frame */
	uint8_t *body;	   /* owned; NULL between frames */
	size_t body_len;   /* N of the current frame */
	size_t body_have;
	int failed; /* sticky: once a frame is bad, the stream is done */
} kiln_frame_decoder_t;

void kiln_frame_decoder_init(kiln_frame_decoder_t *d, size_t max_frame_bytes);
/* Frees a partial body. The decoder may be re-initialised afterwards. */
void kiln_frame_decoder_free(kiln_frame_decoder_t *d);

/*
 * Consumes bytes from *data (at most *len) and advances *data and *len past
 * them. Returns:
 *   1  a frame is complete: *body (malloc'd, owned by the caller, free()) and
 *      *body_len are set; call again with the remaining bytes;
 *   0  every byte was consumed and no frame is complete yet;
 *   KILN_EBADFRAME  the length is 0 or exceeds max_frame_bytes (detail in err);
 *      the decoder stays failed: the stream cannot be resynchronised;
 *   -ENOMEM.
 */
int kiln_frame_feed(kiln_frame_decoder_t *d, const uint8_t **data, size_t *len,
		    uint8_t **body, size_t *body_len, char *err, size_t errlen);

/*
 * Encoding: kiln_frame_begin reserves the 4 length bytes at the start of an
 * empty sbuffer; pack one map after it; kiln_frame_end writes the length.
 * Returns 0, or KILN_ETOOLARGE if the body exceeds max_frame_bytes.
 */
int kiln_frame_begin(msgpack_sbuffer *sb);
int kiln_frame_end(msgpack_sbuffer *sb, size_t max_frame_bytes);

/* ------------------------------------------------------------------------ */
/* Safe msgpack decoding                                                      */
/* ------------------------------------------------------------------------ */

/*
 * Walks the msgpack object at p[0..n) without allocating and checks it
 * against lim: each container's count fits in the bytes left (two per map
 * entry), nesting is at most max_depth, at most max_objects objects, every
 * str/bin/ext length fits. On success returns 0 and sets *end to the offset
 * just past the object. Errors: KILN_EBADFRAME (truncated or malformed bytes,
 * a count larger than the bytes left, a reserved type byte), KILN_ETOOLARGE
 * (depth or object count over the limit).
 */
int kiln_msgpack_prescan(const uint8_t *p, size_t n, const kiln_limits_t *lim,
			 size_t *end, uint32_t *n_objects, char *err,
			 size_t errlen);

/*
 * Prescan, then unpack exactly one msgpack map filling the whole buffer into
 * zone. Trailing bytes, a non-map top-level object or a prescan failure are
 * errors (codes as for kiln_msgpack_prescan; a non-map is KILN_EBADFRAME).
 * str/bin objects point into p, which must outlive *out.
 */
int kiln_msgpack_unpack_map(const uint8_t *p, size_t n,
			    const kiln_limits_t *lim, msgpack_zone *zone,
			    msgpack_object *out, char *err, size_t errlen);

/* Map lookup by key (linear; maps here are small). NULL when absent. */
const msgpack_object *kiln_map_get(const msgpack_object *map, const char *key);
/* True when o is a str equal to s. */
bool kiln_obj_streq(const msgpack_object *o, const char *s);

/* ------------------------------------------------------------------------ */
/* Envelope                                                                   */
/* ------------------------------------------------------------------------ */

#define KILN_OP_MAP(X)                                                         \
	X(HELLO, "hello", 0)                                                   \
	X(COMPILE, "compile", 0)                                               \
	X(LOOKUP, "lookup", 0)                                                 \
	X(STATUS, "status", 0)                                                 \
	X(LIST, "list", 1)                                                     \
	X(EVICT, "evict", 1)                                                   \
	X(GC, "gc", 1)                                                         \
	X(SHUTDOWN, "shutdown", 1)

typedef enum {
#define KILN__OP_ENUM(name, str, admin) KILN_OP_##name,
	KILN_OP_MAP(KILN__OP_ENUM)
#undef KILN__OP_ENUM
	    KILN_OP__COUNT
} kiln_op_t;

/* "compile" etc.; NULL for an out-of-range op. */
const char *kiln_op_name(kiln_op_t op);
/* The op for a name, or -1. */
int kiln_op_from_name(const char *s, size_t len);
/* Whether the op needs an admin peer (list, evict, gc, shutdown). */
bool kiln_op_is_admin(kiln_op_t op);

/*
 * A decoded request. `body` is the whole request map (the op's own fields
 * are read from it with kiln_map_get); it points into the frame bytes and the
 * zone the caller passed, both of which must outlive it.
 */
typedef struct kiln_request {
	uint64_t id;
	bool has_id; /* false when the id itself was missing or malformed */
	kiln_op_t op;
	msgpack_object body;
} kiln_request_t;

/*
 * Decodes one frame body as a request. Errors:
 *   KILN_EBADFRAME  not exactly one complete msgpack map (close the stream);
 *   KILN_ETOOLARGE  nesting or object count over the limits;
 *   KILN_EBADREQ    "v", "id" or "op" missing or of the wrong type, unknown op;
 *   KILN_EVERSION   "v" is not 1.
 * On error req->has_id/req->id say whether the id could be read, so the
 * error reply can carry it.
 */
int kiln_request_decode(const uint8_t *body, size_t len,
			const kiln_limits_t *lim, msgpack_zone *zone,
			kiln_request_t *req, char *err, size_t errlen);

typedef struct kiln_response {
	uint64_t id;
	bool ok;
	int err_code;	      /* KILN_E* from error.code, or KILN_EINTERNAL */
	const char *err_name; /* not NUL-terminated: err_name_len bytes */
	size_t err_name_len;
	const char *message; /* not NUL-terminated */
	size_t message_len;
	int64_t err_node; /* -1 when absent */
	msgpack_object body;
} kiln_response_t;

/* Decodes a response frame body. Errors as kiln_request_decode. */
int kiln_response_decode(const uint8_t *body, size_t len,
			 const kiln_limits_t *lim, msgpack_zone *zone,
			 kiln_response_t *res, char *err, size_t errlen);

/*
 * Packing. A request or success response is a map: these write its header
 * and the envelope keys; the caller then packs exactly n_fields more
 * key/value pairs.
 */
int kiln_pack_request_head(msgpack_packer *pk, uint64_t id, kiln_op_t op,
			   uint32_t n_fields);
int kiln_pack_ok_head(msgpack_packer *pk, uint64_t id, uint32_t n_fields);
/* A complete error response; node < 0 omits "node". */
int kiln_pack_error(msgpack_packer *pk, uint64_t id, int code,
		    const char *message, int64_t node);
/* Packs a NUL-terminated string. */
int kiln_pack_cstr(msgpack_packer *pk, const char *s);

/* ------------------------------------------------------------------------ */
/* Graph v1                                                                   */
/* ------------------------------------------------------------------------ */

#define KILN_DTYPE_MAP(X)                                                      \
	X(F32, "f32", 4)                                                       \
	X(F64, "f64", 8)                                                       \
	X(F16, "f16", 2)                                                       \
	X(BF16, "bf16", 2)                                                     \
	X(I8, "i8", 1)                                                         \
	X(I16, "i16", 2)                                                       \
	X(I32, "i32", 4)                                                       \
	X(I64, "i64", 8)                                                       \
	X(U8, "u8", 1)                                                         \
	X(BOOL, "bool", 1)

typedef enum {
#define KILN__DT_ENUM(name, str, size) KILN_DT_##name,
	KILN_DTYPE_MAP(KILN__DT_ENUM)
#undef KILN__DT_ENUM
	    KILN_DT__COUNT
} kiln_dtype_t;

const char *kiln_dtype_name(kiln_dtype_t dt);
int kiln_dtype_from_name(const char *s, size_t len); /* -1 when unknown */
size_t kiln_dtype_size(kiln_dtype_t dt);
bool kiln_dtype_is_float(kiln_dtype_t dt);

/*
 * Symbolic integer expressions (sizes, strides, symbolic int args). Trees
 * allocated in the graph's arena. Division and modulo are floor division and
 * Python modulo (the sign of the divisor), as in sympy's FloorDiv / Mod.
 */
typedef enum {
	KILN_EX_CONST,
	KILN_EX_SYM,
	KILN_EX_ADD,
	KILN_EX_SUB,
	KILN_EX_MUL,
	KILN_EX_FLOORDIV,
	KILN_EX_MOD,
	KILN_EX_MIN,
	KILN_EX_MAX,
	KILN_EX_NEG,
	KILN_EX_VAR /* compiler-internal: loop variable number `sym`; never
		       decoded from the wire */
} kiln_expr_kind_t;

typedef struct kiln_expr {
	kiln_expr_kind_t kind;
	int64_t c;    /* KILN_EX_CONST */
	uint32_t sym; /* KILN_EX_SYM: index into graph->symbols */
	const struct kiln_expr *a, *b;
} kiln_expr_t;

/* A dimension or stride: the constant c when e == NULL, else e. */
typedef struct kiln_dim {
	int64_t c;
	const kiln_expr_t *e;
} kiln_dim_t;

typedef struct kiln_symbol {
	const char *name; /* as declared in the graph */
	int64_t min;	  /* >= 0 */
	int64_t max;	  /* -1: unbounded */
	int64_t hint;	  /* -1: none */
} kiln_symbol_t;

typedef enum { KILN_VAL_TENSOR, KILN_VAL_SYMINT } kiln_value_kind_t;

typedef struct kiln_value {
	kiln_value_kind_t kind;
	int32_t producer; /* node index, or -1 for a graph input */
	/* KILN_VAL_TENSOR: */
	kiln_dtype_t dtype;
	uint32_t rank;
	bool strides_given;  /* false: contiguous strides were computed */
	kiln_dim_t *sizes;   /* rank entries */
	kiln_dim_t *strides; /* rank entries, always filled */
	/* KILN_VAL_SYMINT: an int input bound to this expression (usually one
	 * symbol) */
	const kiln_expr_t *sym;
} kiln_value_t;

typedef enum {
	KILN_ARG_NIL,
	KILN_ARG_BOOL,
	KILN_ARG_INT,
	KILN_ARG_FLOAT,
	KILN_ARG_STR,
	KILN_ARG_LIST,
	KILN_ARG_REF,
	KILN_ARG_SYM
} kiln_arg_kind_t;

typedef struct kiln_arg {
	kiln_arg_kind_t kind;
	uint32_t n; /* STR: length; LIST: element count */
	union {
		bool b;
		int64_t i;
		double f;
		const char *s; /* NUL-terminated, n bytes */
		struct kiln_arg *list;
		uint32_t ref; /* value number */
		const kiln_expr_t *sym;
	} u;
} kiln_arg_t;

typedef struct kiln_kwarg {
	const char *key; /* NUL-terminated */
	kiln_arg_t val;
} kiln_kwarg_t;

typedef struct kiln_node {
	const char *op; /* "aten.add.Tensor" */
	uint32_t n_args, n_kwargs, n_out;
	kiln_arg_t *args;
	kiln_kwarg_t *kwargs; /* sorted by key (bytewise), keys unique */
	uint32_t out_first;   /* value number of the first output */
} kiln_node_t;

typedef struct kiln_graph {
	kiln_arena_t *arena; /* owns everything below */
	uint32_t n_inputs, n_nodes, n_values, n_outputs, n_symbols;
	kiln_value_t *values; /* values[0 .. n_inputs) are the inputs */
	kiln_node_t *nodes;
	kiln_arg_t *outputs; /* each KILN_ARG_REF or KILN_ARG_SYM */
	kiln_symbol_t *symbols;
} kiln_graph_t;

/*
 * Decodes and validates a Graph v1 map (already unpacked, e.g. the "graph"
 * field of a compile request). On success *out is a new graph owned by the
 * caller (kiln_graph_free); it does not point into `map`. Errors:
 * KILN_EINVGRAPH (structure: the message names the node, input or output
 * index and the reason), KILN_ETOOLARGE (a count over the limits).
 */
int kiln_graph_from_object(const msgpack_object *map, const kiln_limits_t *lim,
			   kiln_graph_t **out, char *err, size_t errlen);

/* Prescans, unpacks and decodes a Graph v1 held in bytes (a .msgpack file). */
int kiln_graph_decode(const uint8_t *p, size_t n, const kiln_limits_t *lim,
		      kiln_graph_t **out, char *err, size_t errlen);

void kiln_graph_free(kiln_graph_t *g);

/*
 * Re-encodes the graph as a Graph v1 map. Optional input keys (names) are
 * not kept; strides are written only where they were given. The result
 * decodes to an equal graph with an equal signature.
 */
int kiln_graph_pack(const kiln_graph_t *g, msgpack_packer *pk);

/* Prints an expression in GRAPH.md's syntax ("2*s0+1"). Returns chars that
 * would have been written (snprintf contract). */
int kiln_expr_format(const kiln_graph_t *g, const kiln_expr_t *e, char *buf,
		     size_t n);

/*
 * Evaluates an expression with symbol values syms[0 .. n_symbols). Returns 0,
 * or KILN_EINVGRAPH on division by zero or overflow.
 */
int kiln_expr_eval(const kiln_expr_t *e, const int64_t *syms, int64_t *out);

/*
 * Parses s (GRAPH.md's expression syntax) over the symbols named names[0 ..
 * n) and evaluates it with vals[0 .. n). Returns 0, or KILN_EINVGRAPH with
 * the reason in err (a syntax error, an unknown symbol, division by zero,
 * overflow), or -ENOMEM.
 */
int kiln_expr_eval_str(const char *s, const char *const *names,
		       const int64_t *vals, uint32_t n, int64_t *out, char *err,
		       size_t errlen);

/* ------------------------------------------------------------------------ */
/* Signatures                                                                 */
/* ------------------------------------------------------------------------ */

#define KILN_TARGET_FEATURES_MAX 2048

/* A target; empty strings mean "unset" (the daemon fills in its own). */
typedef struct kiln_target {
	char backend[16];			 /* "cpu" or "cuda" */
	char arch[32];				 /* "x86-64", "sm_90" */
	char features[KILN_TARGET_FEATURES_MAX]; /* LLVM feature string */
} kiln_target_t;

typedef struct kiln_compile_opts {
	char mode[32]; /* "default", "reduce-overhead", "max-autotune" */
} kiln_compile_opts_t;

#define KILN_SIG_BYTES 32
#define KILN_SIG_HEX   65 /* 64 hex chars + NUL */

/*
 * SHA-256 over the canonical encoding of (graph, target, options,
 * fingerprint), as PROTOCOL.md "Signature" specifies. `fingerprint` is the
 * compiler fingerprint string the daemon reports in `hello`. With
 * `structure` true, every dimension size, stride and integer argument is
 * erased (the structure hash). Returns 0 or -ENOMEM / KILN_EINTERNAL.
 */
int kiln_signature(const kiln_graph_t *g, const kiln_target_t *target,
		   const kiln_compile_opts_t *opts, const char *fingerprint,
		   bool structure, uint8_t out[KILN_SIG_BYTES]);

/* Lower-case hex of a signature into out[KILN_SIG_HEX]. */
void kiln_sig_to_hex(const uint8_t sig[KILN_SIG_BYTES], char out[KILN_SIG_HEX]);
/* Parses 64 hex chars; 0 or KILN_EBADREQ. */
int kiln_sig_from_hex(const char *hex, size_t len, uint8_t out[KILN_SIG_BYTES]);

/* Decodes a target map ({"backend": "cpu"} ...) into t (copied). The backend
 * must be "cpu" or "cuda"; a cuda target needs an arch "sm_NN". 0 or
 * KILN_EBADREQ. */
int kiln_target_from_object(const msgpack_object *o, kiln_target_t *t,
			    char *err, size_t errlen);
/* Decodes an options map (NULL or nil: defaults); unknown keys are ignored.
 * mode must be one of the three names. *dynamic is -1 (null/absent,
 * automatic), 0 or 1. 0 or KILN_EBADREQ. */
int kiln_opts_from_object(const msgpack_object *o, kiln_compile_opts_t *opts,
			  int *dynamic, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * A strided tensor in memory, as the runtime and the reference interpreter
 * see it. `data` points at element [0, ..., 0]; strides are in elements.
 * Ownership of `data` is stated by whichever function hands one out.
 */
typedef struct kiln_tensor {
	void *data;
	kiln_dtype_t dtype;
	uint32_t rank;
	int64_t sizes[KILN_MAX_RANK_HARD];
	int64_t strides[KILN_MAX_RANK_HARD];
} kiln_tensor_t;

/* ------------------------------------------------------------------------ */
/* Artifacts (ARTIFACT.md)                                                    */
/* ------------------------------------------------------------------------ */

/*
 * The compiled form of one graph for one target: code plus the plan that
 * runs it. Every size below is a kiln_dim_t: a constant, or an expression of
 * the artifact's symbols (the graph's symbols, same numbering), so one
 * artifact serves every size the symbol constraints allow.
 */
typedef struct kiln_art_kernel {
	const char *name;  /* exported symbol in the code object */
	kiln_dim_t extent; /* parallel extent, in units */
	int64_t grain;	   /* minimum units per task (>= 1) */
	uint32_t n_bufs;   /* pointers the kernel takes in its bufs[] */
} kiln_art_kernel_t;

typedef enum {
	KILN_BUF_INPUT,	 /* graph input `index` (its data pointer) */
	KILN_BUF_OUTPUT, /* output buffer `index`, allocated by the caller */
	KILN_BUF_ARENA	 /* bytes [offset, offset+bytes) of the scratch arena */
} kiln_buf_kind_t;

typedef struct kiln_art_buffer {
	kiln_buf_kind_t kind;
	uint32_t index;
	kiln_dim_t offset; /* ARENA: byte offset, a multiple of 64 */
	kiln_dim_t bytes;  /* OUTPUT and ARENA: size in bytes */
} kiln_art_buffer_t;

/* A typed strided view of a buffer (what outputs and fallbacks see). */
typedef struct kiln_art_view {
	uint32_t buffer;
	kiln_dtype_t dtype;
	uint32_t rank;
	kiln_dim_t *sizes;   /* rank entries, elements */
	kiln_dim_t *strides; /* rank entries, elements */
	kiln_dim_t offset;   /* elements from the buffer's start */
} kiln_art_view_t;

typedef enum { KILN_STEP_KERNEL, KILN_STEP_FALLBACK } kiln_step_kind_t;

typedef struct kiln_art_step {
	kiln_step_kind_t kind;
	int32_t node; /* the graph node it came from (messages), or -1 */
	/* KILN_STEP_KERNEL: run kernels[kernel] with bufs[] = these buffers */
	uint32_t kernel;
	uint32_t n_bufs;
	uint32_t *bufs;
	/* KILN_STEP_FALLBACK: run ATen `op` (through torch, by the Python
	 * runtime) on args/kwargs in which {"ref": k} names view k; its
	 * results are copied into the views out[0 .. n_out) */
	const char *op;
	uint32_t n_args, n_kwargs, n_out;
	kiln_arg_t *args;
	kiln_kwarg_t *kwargs;
	uint32_t *out;
} kiln_art_step_t;

/* Where the runtime reads a symbol's value: input `input`'s size `dim`, or
 * (dim == -1) the value of int input `input`. */
typedef struct kiln_art_binding {
	uint32_t input;
	int32_t dim;
} kiln_art_binding_t;

typedef struct kiln_artifact {
	kiln_arena_t *arena; /* owns everything below */
	kiln_target_t target;
	char signature[KILN_SIG_HEX]; /* "" when unknown */
	const uint8_t *code; /* ELF shared object (cpu) or PTX (cuda) */
	size_t code_len;
	const uint8_t *cubin; /* optional, cuda */
	size_t cubin_len;
	uint32_t n_symbols;
	kiln_symbol_t *symbols;
	kiln_art_binding_t *bindings; /* n_symbols entries */
	uint32_t n_inputs;
	kiln_value_t *inputs; /* the graph's input specs, checked at run */
	uint32_t n_kernels;
	kiln_art_kernel_t *kernels;
	uint32_t n_buffers;
	kiln_art_buffer_t *buffers;
	uint32_t n_views;
	kiln_art_view_t *views;
	uint32_t n_steps;
	kiln_art_step_t *steps;
	uint32_t n_outputs;
	kiln_arg_t *outputs; /* {"ref": view id} or {"sym": expr} */
	uint32_t n_out_buffers;
	kiln_dim_t arena_bytes;
	const char *kernels_text; /* optional: the fusion report, for people */
} kiln_artifact_t;

#define KILN_ARTIFACT_FORMAT "kiln.artifact/1"

/* Packs an artifact as one msgpack map (ARTIFACT.md). 0 or -ENOMEM. */
int kiln_artifact_pack(const kiln_artifact_t *a, msgpack_packer *pk);

/*
 * Decodes and validates an artifact (untrusted bytes: prescan first). Every
 * index is checked against its table, every expression against the symbol
 * table. On success *out is owned by the caller (kiln_artifact_free); the
 * code bytes are copied into its arena. KILN_EBADREQ-free: errors are
 * KILN_EBADFRAME (msgpack), KILN_EINVGRAPH (structure), -ENOMEM.
 */
int kiln_artifact_decode(const uint8_t *p, size_t n, const kiln_limits_t *lim,
			 kiln_artifact_t **out, char *err, size_t errlen);

void kiln_artifact_free(kiln_artifact_t *a);

#ifdef __cplusplus
}
#endif
#endif /* KILN_PROTOCOL_H */
