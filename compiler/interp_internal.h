/*
 * interp_internal.h — what the reference interpreter's files share:
 * interp.c (values, arguments, type promotion, the run loop, the op table),
 * interp_pw.c (pointwise and creation ops), interp_ops.c (reductions,
 * softmax, norms), interp_view.c (views and layout), interp_nn.c (matmul,
 * indexing, losses) and interp_conv.c (convolution, pooling, upsampling,
 * attention). Not a public header: only compiler/interp*.c include it.
 *
 * Adding an op: write `int kiln__op_NAME(ictx_t *c, int code)` in the file
 * of its family, add NAME to KI_OPS_FUNCS below, and add a row per overload
 * to optab[] in interp.c. The op reads its arguments with kiln__i_* (which
 * turn a malformed argument into an invalid_graph naming the node), fills
 * c->out[0 .. n_out) with new tensors, and returns 0; the run loop then
 * checks every output against the node's declared dtype and shape.
 *
 * Representation: a value is a strided view (kiln__it_t) of a refcounted
 * buffer (kiln__ibuf_t) that holds doubles for floating dtypes and int64 for
 * integer and bool dtypes. A floating value's doubles are always rounded to
 * its dtype (an f32 value holds f32-representable doubles); an integer
 * value's int64s are always wrapped to its dtype's range; bool is 0/1.
 * Views share the buffer; graphs are functional, so nothing writes a buffer
 * after the op that made it returns.
 *
 * Threads: one run belongs to one thread; there is no global state.
 */
#ifndef KILN_COMPILER_INTERP_INTERNAL_H
#define KILN_COMPILER_INTERP_INTERNAL_H

#include "compiler/compiler.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define KI_MAXR KILN_MAX_RANK_HARD
#define KI_REQ	INT64_MIN /* kiln__i_int: no default, the arg is required */

typedef struct kiln__ibuf {
	int64_t refs;
	int64_t n;  /* elements */
	double *f;  /* floating storage, or NULL */
	int64_t *i; /* integer/bool storage, or NULL */
} kiln__ibuf_t;

typedef struct kiln__it {
	kiln_dtype_t dt;
	bool wrapped; /* a Python number standing in for a tensor (promotion) */
	uint32_t rank;
	int64_t off;
	int64_t size[KI_MAXR];
	int64_t stride[KI_MAXR];
	kiln__ibuf_t *buf; /* NULL: empty slot */
} kiln__it_t;

/* The state of one node's evaluation. */
typedef struct kiln__ictx {
	const kiln_graph_t *g;
	const kiln_node_t *nd;
	uint32_t ni;
	const int64_t *syms;
	kiln__it_t *vals; /* g->n_values slots */
	kiln__it_t *out;  /* nd->n_out slots the op fills */
	char *err;
	size_t errlen;
} kiln__ictx_t;

typedef kiln__it_t it_t;
typedef kiln__ictx_t ictx_t;

typedef int (*kiln__op_fn)(ictx_t *c, int code);

/* ---- errors ---- */
/* "node N (op): <fmt>" into c->err; return KILN_EINVGRAPH / KILN_EUNSUPOP. */
int kiln__i_bad(ictx_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int kiln__i_unsup(ictx_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int kiln__i_oom(ictx_t *c);
/* "[2,3]" */
void kiln__i_fmt_shape(char *buf, size_t n, uint32_t rank, const int64_t *size);

#define KI_TRY(x)                                                              \
	do {                                                                   \
		int rc_ = (x);                                                 \
		if (rc_ < 0)                                                   \
			return rc_;                                            \
	} while (0)

/* ---- values ---- */
/* A new zeroed contiguous tensor. */
int kiln__i_alloc(ictx_t *c, it_t *t, kiln_dtype_t dt, uint32_t rank,
		  const int64_t *size);
/* *dst = a view sharing src's buffer (one more reference). */
void kiln__i_ref(it_t *dst, const it_t *src);
/* Drops t's reference and clears it. NULL-safe, empty-safe. */
void kiln__i_release(it_t *t);
int64_t kiln__i_numel(const it_t *t);
/* Saturating (INT64_MAX on overflow). */
int64_t kiln__i_numel_of(uint32_t rank, const int64_t *size);
/* The largest tensor (elements) the interpreter makes or views. */
#define KI_MAX_ELEMS (INT64_C(1) << 28)
/* 0 when a shape is non-negative and within KI_MAX_ELEMS, else an error. */
int kiln__i_check_numel(ictx_t *c, uint32_t rank, const int64_t *size);
/* Contiguous row-major strides for a shape. */
void kiln__i_contig_strides(uint32_t rank, const int64_t *size, int64_t *st);
/* malloc'd contiguous copies of t's elements (caller frees). */
int kiln__i_to_f(ictx_t *c, const it_t *t, double **out);
int kiln__i_to_i(ictx_t *c, const it_t *t, int64_t **out);
/* A new contiguous tensor of dtype dt from n doubles (rounded to dt). */
int kiln__i_from_f(ictx_t *c, it_t *t, kiln_dtype_t dt, uint32_t rank,
		   const int64_t *size, const double *v);
/* A contiguous copy of src converted to dtype dt. */
int kiln__i_convert(ictx_t *c, const it_t *src, kiln_dtype_t dt, it_t *out);
/* Makes c->out[k] an empty [0] tensor of the declared dtype (an output an
 * output_mask switched off). */
int kiln__i_none_out(ictx_t *c, uint32_t k);

double kiln__i_round(kiln_dtype_t dt, double v);
int64_t kiln__i_wrap(kiln_dtype_t dt, int64_t v);
int64_t kiln__i_f2i(double v);

static inline bool ki_isf(kiln_dtype_t dt)
{
	return kiln_dtype_is_float(dt);
}
static inline bool ki_isint(kiln_dtype_t dt)
{
	return !kiln_dtype_is_float(dt) && dt != KILN_DT_BOOL;
}

/* calloc of n doubles / int64s (at least one, so never NULL for n == 0) */
static inline double *ki_dcalloc(int64_t n)
{
	return (double *)calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}
static inline int64_t *ki_icalloc(int64_t n)
{
	return (int64_t *)calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
}

static inline int64_t ki_off(const it_t *t, const int64_t *idx)
{
	int64_t o = t->off;
	for (uint32_t d = 0; d < t->rank; d++)
		o += idx[d] * t->stride[d];
	return o;
}

/* Advances a row-major index over size[0..rank); false after the last. */
static inline bool ki_next(int64_t *idx, const int64_t *size, uint32_t rank)
{
	for (uint32_t d = rank; d-- > 0;) {
		if (++idx[d] < size[d])
			return true;
		idx[d] = 0;
	}
	return false;
}

static inline double ki_getf(const it_t *t, int64_t off)
{
	return t->buf->f ? t->buf->f[off] : (double)t->buf->i[off];
}

static inline int64_t ki_geti(const it_t *t, int64_t off)
{
	return t->buf->i ? t->buf->i[off] : kiln__i_f2i(t->buf->f[off]);
}

static inline void ki_setf(it_t *t, int64_t off, double v)
{
	if (t->buf->f)
		t->buf->f[off] = kiln__i_round(t->dt, v);
	else
		t->buf->i[off] = t->dt == KILN_DT_BOOL
				     ? (v != 0)
				     : kiln__i_wrap(t->dt, kiln__i_f2i(v));
}

static inline void ki_seti(it_t *t, int64_t off, int64_t v)
{
	if (t->buf->f)
		t->buf->f[off] = kiln__i_round(t->dt, (double)v);
	else
		t->buf->i[off] = kiln__i_wrap(t->dt, v);
}

/* ---- arguments ---- */
/* The arg at position pos, else the kwarg `name`; NULL when absent or nil. */
const kiln_arg_t *kiln__i_arg(ictx_t *c, int pos, const char *name);
int kiln__i_tensor(ictx_t *c, int pos, const char *name, it_t **t);
int kiln__i_tensor_opt(ictx_t *c, int pos, const char *name, it_t **t);
/* def == KI_REQ: required. Accepts int, bool-free sym expressions. */
int kiln__i_int(ictx_t *c, int pos, const char *name, int64_t def, int64_t *v);
int kiln__i_num(ictx_t *c, int pos, const char *name, bool required, double def,
		double *v);
int kiln__i_bool(ictx_t *c, int pos, const char *name, bool def, bool *v);
/* An int list (a single int counts as a list of one); *n = -1 when absent. */
int kiln__i_ints(ictx_t *c, int pos, const char *name, int64_t *v, int cap,
		 int *n);
int kiln__i_bools(ictx_t *c, int pos, const char *name, bool *v, int cap,
		  int *n);
int kiln__i_str(ictx_t *c, int pos, const char *name, const char **s);
int kiln__i_dtype(ictx_t *c, int pos, const char *name, kiln_dtype_t *dt,
		  bool *given);
/* A tensor (a new view of it) or a number (a wrapped rank-0 tensor); the
 * caller releases *t. */
int kiln__i_operand(ictx_t *c, int pos, const char *name, it_t *t);
/* A list of tensor refs; *ts points into a malloc'd array (caller frees). */
int kiln__i_tensor_list(ictx_t *c, int pos, const char *name, it_t ***ts,
			uint32_t *n, bool allow_nil);

/* ---- shapes and dtypes ---- */
/* Wraps dim d for a tensor of rank `rank` (rank 0 allows -1 and 0). */
int kiln__i_dim(ictx_t *c, int64_t d, uint32_t rank, uint32_t *out);
/* The broadcast shape of n tensors. */
int kiln__i_bshape(ictx_t *c, it_t *const *ts, int n, uint32_t *rank,
		   int64_t *size);
/* A read-only view of t broadcast to (rank, size): no reference taken. */
void kiln__i_bview(const it_t *t, uint32_t rank, const int64_t *size, it_t *v);
kiln_dtype_t kiln__i_promote(kiln_dtype_t a, kiln_dtype_t b);
/* torch.result_type over operands (wrapped numbers, 0-dim and dim tensors). */
kiln_dtype_t kiln__i_result_type(it_t *const *ts, int n);
/* A view with a new shape if strides allow it, else a contiguous copy. */
int kiln__i_reshape(ictx_t *c, const it_t *x, uint32_t rank,
		    const int64_t *size, it_t *out);

/* Parses a dim list (or one dim) into mask[0..KI_MAXR); None or [] mean
 * every dim when none_all, else None is an error and [] names no dim. */
int kiln__i_parse_dims(ictx_t *c, const it_t *x, int pos, const char *name,
		       bool none_all, bool *mask, int *count);
/* 0 when t has shape (rank, size), else an error naming `what`. */
int kiln__i_need_shape(ictx_t *c, const it_t *t, const char *what,
		       uint32_t rank, const int64_t *size);
static inline bool ki_same_shape(const it_t *a, const it_t *b)
{
	if (a->rank != b->rank)
		return false;
	for (uint32_t d = 0; d < a->rank; d++)
		if (a->size[d] != b->size[d])
			return false;
	return true;
}

/* ---- op entry points (code selects the variant) ---- */
/* clang-format off */
#define KI_OPS_FUNCS(X)                                                        \
	X(unary) X(binary) X(where) X(masked_fill) X(clamp) X(lerp) X(addcmul) \
	X(pw_backward) X(convert) X(create) X(arange) X(dropout)               \
	X(dropout_bw) X(kiln_dropout) X(tri) X(reduce) X(argred) X(minmax_dim) X(varstd)       \
	X(cumsum) X(softmax) X(softmax_bw) X(layer_norm) X(layer_norm_bw)      \
	X(batch_norm) X(batch_norm_bw) X(group_norm) X(group_norm_bw) X(view)  \
	X(permute) X(transpose) X(expand) X(squeeze) X(unsqueeze) X(slice)     \
	X(select) X(split) X(cat) X(stack) X(alias) X(pad) X(flip) X(roll) X(repeat)   \
	X(select_bw) X(slice_bw) X(as_strided) X(as_strided_scatter) X(mm) X(embedding) \
	X(embedding_bw) X(index_select) X(gather) X(scatter) X(index)          \
	X(index_put) X(nll) X(nll_bw) X(mse) X(mse_bw) X(conv) X(conv_bw)      \
	X(maxpool) X(maxpool_bw) X(avgpool) X(avgpool_bw) X(adaptive)          \
	X(adaptive_bw) X(upsample) X(sdpa) X(sdpa_bw) X(weight_norm) X(index_add) \
	X(mha) X(scatter_reduce) X(log_sigmoid) X(elu_backward) X(prelu) X(glu)
/* clang-format on */

#define KI_DECL_OP(name) int kiln__op_##name(ictx_t *c, int code);
KI_OPS_FUNCS(KI_DECL_OP)
#undef KI_DECL_OP

/* Variant codes shared with the op table in interp.c. */
enum {
	/* unary */
	U_COPY,
	U_ABS,
	U_NEG,
	U_EXP,
	U_EXP2,
	U_LOG,
	U_LOG1P,
	U_LOG2,
	U_LOG10,
	U_EXPM1,
	U_SQRT,
	U_RSQRT,
	U_RECIP,
	U_SIN,
	U_COS,
	U_TAN,
	U_ASIN,
	U_ACOS,
	U_ATAN,
	U_SINH,
	U_COSH,
	U_TANH,
	U_SIGMOID,
	U_RELU,
	U_GELU,
	U_SILU,
	U_ERF,
	U_SIGN,
	U_FLOOR,
	U_CEIL,
	U_ROUND,
	U_TRUNC,
	U_HARDSWISH,
	U_HARDSIGMOID,
	U_LNOT,
	U_BNOT,
	U_ISNAN,
	U_ISINF,
	U_HARDTANH,
	U_LEAKY,
	U_ELU,
	U_SOFTPLUS,
	U_MISH,
	U_CELU,
	U_THRESH,
	U_LOGSIG,
	U_LOGSIG_BUF,
	U_FILL,
	/* binary */
	B_ADD,
	B_SUB,
	B_RSUB,
	B_MUL,
	B_DIV,
	B_DIVT,
	B_DIVF,
	B_REM,
	B_FMOD,
	B_POW,
	B_MAX,
	B_MIN,
	B_ATAN2,
	B_EQ,
	B_NE,
	B_LT,
	B_LE,
	B_GT,
	B_GE,
	B_LAND,
	B_LOR,
	B_LXOR,
	B_BAND,
	B_BOR,
	B_BXOR,
	/* ternary and backward */
	T_WHERE,
	T_CLAMP,
	T_LERP,
	T_ADDCMUL,
	T_ADDCDIV,
	T_THRESH_BW,
	T_HARDTANH_BW,
	T_GELU_BW,
	T_SIGMOID_BW,
	T_TANH_BW,
	T_SILU_BW,
	T_HARDSWISH_BW,
	T_HARDSIGMOID_BW,
	T_SOFTPLUS_BW,
	T_MISH_BW,
	T_LEAKY_BW,
	T_LOGSIG_BW,
	T_ELU_BW,
	T_PRELU,
	T_PRELU_GI,
	T_PRELU_GW,
	T_GLU,
	T_GLU_GA,
	T_GLU_GB
};
enum { CL_BOTH, CL_MIN, CL_MAX };
enum { CV_TO_COPY, CV_CONVERT, CV_CLONE, CV_COPY };
enum {
	CR_FULL,
	CR_ZEROS,
	CR_ONES,
	CR_EMPTY,
	CR_EMPTY_STRIDED,
	CR_NEW_FULL,
	CR_NEW_ZEROS,
	CR_NEW_ONES,
	CR_NEW_EMPTY,
	CR_NEW_EMPTY_STRIDED,
	CR_FULL_LIKE,
	CR_ZEROS_LIKE,
	CR_ONES_LIKE,
	CR_EMPTY_LIKE,
	CR_FILL,
	CR_SCALAR_TENSOR
};

enum {
	R_SUM,
	R_MEAN,
	R_AMAX,
	R_AMIN,
	R_PROD,
	R_ANY,
	R_ALL,
	R_LSE,
	R_MAXALL,
	R_MINALL,
	R_NORM
};
enum { V_VAR, V_STD };
enum { VW_VIEW, VW_RESHAPE_ALIAS };
enum { NORM_BN, NORM_BN_NOTRAIN, NORM_BN_FUNC, NORM_BN_NOSTATS };
enum { SPLIT_SIZE, SPLIT_SIZES, SPLIT_UNBIND };
enum { MM_MM, MM_BMM, MM_ADDMM, MM_BADDBMM };
enum { SC_SRC, SC_VALUE, SC_ADD };
enum { UP_NEAREST, UP_NEAREST_VEC, UP_BILINEAR, UP_BILINEAR_VEC };

#endif /* KILN_COMPILER_INTERP_INTERNAL_H */
