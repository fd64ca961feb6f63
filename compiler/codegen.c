/*
 * codegen.c — kernels → LLVM IR, with the LLVM-C API (InContext calls only;
 * one context per compile).
 *
 * Every kernel is
 *
 *   void kiln_kN(void **bufs, const int64_t *syms, int64_t begin, int64_t end)
 *
 * over its parallel extent ("units"); it loads its buffer pointers and calls
 * an always-inlined body whose pointer parameters are `noalias`. kiln
 * vectorizes explicitly rather than relying on the loop vectorizer: each
 * kernel has one vectorized variable (the innermost dim), every scalar
 * expression is emitted at width W (the target's f32 lanes) in the main loop
 * and in the tail at W/2 and W/4 where that many elements are left (down to
 * 4 lanes; pointwise loops and rows vectorized across, not reductions along
 * the vector), then at width 1; loads and stores are contiguous vector
 * accesses when their index has unit stride in that variable (broadcast when
 * 0, gathers otherwise), and reductions keep W-lane accumulators that are
 * combined pairwise once per row.
 *
 * Floating-point contract: reductions reassociate (W partial sums per row,
 * combined pairwise); everything else is evaluated in program order without
 * fast-math flags; transcendentals come from mathfn.c (within 2-4 ulp of the
 * correctly rounded f32 result; OP_EXPNP's on AVX-512 vectors 4.73 at worst,
 * for results near 2^-126). f16/bf16 are computed in f32 and rounded at
 * stores and explicit casts.
 */
#include "compiler/cg.h"
#include "compiler/cpu.h"

#include <llvm-c/DebugInfo.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- types and constants ------------------------------------------------- */

LLVMTypeRef cg_scalar_type(gen_t *g, kiln_dtype_t dt)
{
	switch (dt) {
	case KILN_DT_F32: return g->f32;
	case KILN_DT_F64: return g->f64;
	case KILN_DT_F16: return g->f16;
	case KILN_DT_BF16: return g->i16;
	case KILN_DT_I8:
	case KILN_DT_U8: return g->i8;
	case KILN_DT_I16: return g->i16;
	case KILN_DT_I32: return g->i32;
	case KILN_DT_I64: return g->i64;
	case KILN_DT_BOOL: return g->i1;
	default: return g->f32;
	}
}

LLVMTypeRef cg_type(gen_t *g, kiln_dtype_t dt, int w)
{
	LLVMTypeRef t = cg_scalar_type(g, dt);
	return w > 1 ? LLVMVectorType(t, (unsigned)w) : t;
}

LLVMValueRef cg_splat(gen_t *g, LLVMValueRef s, int w)
{
	if (w <= 1)
		return s;
	LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(s), (unsigned)w);
	LLVMValueRef v = LLVMGetUndef(vt);
	v = LLVMBuildInsertElement(g->b, v, s, LLVMConstInt(g->i32, 0, 0), "");
	LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(g->i32, (unsigned)w));
	return LLVMBuildShuffleVector(g->b, v, LLVMGetUndef(vt), zeros, "");
}

LLVMValueRef cg_const_f(gen_t *g, double v, kiln_dtype_t dt, int w)
{
	LLVMValueRef s = LLVMConstReal(cg_scalar_type(g, dt), v);
	if (w <= 1)
		return s;
	LLVMValueRef e[64];
	for (int i = 0; i < w; i++)
		e[i] = s;
	return LLVMConstVector(e, (unsigned)w);
}

LLVMValueRef cg_const_i(gen_t *g, int64_t v, kiln_dtype_t dt, int w)
{
	LLVMValueRef s = LLVMConstInt(cg_scalar_type(g, dt), (uint64_t)v, 1);
	if (w <= 1)
		return s;
	LLVMValueRef e[64];
	for (int i = 0; i < w; i++)
		e[i] = s;
	return LLVMConstVector(e, (unsigned)w);
}

static LLVMValueRef cconst(gen_t *g, double f, int64_t i, kiln_dtype_t dt,
			   int w)
{
	return kiln_dtype_is_float(dt) ? cg_const_f(g, f, dt, w)
				       : cg_const_i(g, i, dt, w);
}

LLVMValueRef cg_intr(gen_t *g, const char *name, LLVMTypeRef *over,
		     unsigned n_over, LLVMValueRef *args, unsigned n_args)
{
	unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
	LLVMValueRef f = LLVMGetIntrinsicDeclaration(g->mod, id, over, n_over);
	LLVMTypeRef ft = LLVMIntrinsicGetType(g->ctx, id, over, n_over);
	return LLVMBuildCall2(g->b, ft, f, args, n_args, "");
}

static LLVMValueRef lane_ids(gen_t *g, int w)
{
	LLVMValueRef e[64];
	for (int i = 0; i < w; i++)
		e[i] = LLVMConstInt(g->i64, (uint64_t)i, 0);
	return LLVMConstVector(e, (unsigned)w);
}

/* ---- memo ---------------------------------------------------------------- */

static void memo_clear(gen_t *g)
{
	if (g->memo.n == 0 || g->memo.key == NULL)
		return;
	memset(g->memo.key, 0, g->memo.cap * sizeof(*g->memo.key));
	g->memo.n = 0;
}

static LLVMValueRef memo_get(gen_t *g, const sx_t *e)
{
	if (g->memo.cap == 0)
		return NULL;
	uint32_t j = (e->hash * 0x9e3779b1u) & (g->memo.cap - 1);
	while (g->memo.key[j] != NULL) {
		if (g->memo.key[j] == e)
			return g->memo.val[j];
		j = (j + 1) & (g->memo.cap - 1);
	}
	return NULL;
}

static void memo_put(gen_t *g, const sx_t *e, LLVMValueRef v)
{
	if ((g->memo.n + 1) * 2 > g->memo.cap) {
		uint32_t oc = g->memo.cap;
		const sx_t **ok = g->memo.key;
		LLVMValueRef *ov = g->memo.val;
		g->memo.cap = oc ? oc * 2 : 1024;
		g->memo.key = calloc(g->memo.cap, sizeof(*g->memo.key));
		g->memo.val = calloc(g->memo.cap, sizeof(*g->memo.val));
		g->memo.n = 0;
		if (g->memo.key == NULL || g->memo.val == NULL) {
			g->memo.cap = 0;
			free(ok);
			free(ov);
			return;
		}
		for (uint32_t i = 0; i < oc; i++)
			if (ok[i] != NULL)
				memo_put(g, ok[i], ov[i]);
		free(ok);
		free(ov);
	}
	uint32_t j = (e->hash * 0x9e3779b1u) & (g->memo.cap - 1);
	while (g->memo.key[j] != NULL)
		j = (j + 1) & (g->memo.cap - 1);
	g->memo.key[j] = e;
	g->memo.val[j] = v;
	g->memo.n++;
}

/* ---- index expressions -------------------------------------------------- */

static LLVMValueRef sym_value(gen_t *g, uint32_t s)
{
	if (s < 64 && g->sym_val[s] != NULL)
		return g->sym_val[s];
	/* load at the entry so it dominates every use */
	LLVMBasicBlockRef cur = LLVMGetInsertBlock(g->b);
	LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(g->fn);
	LLVMValueRef term = LLVMGetBasicBlockTerminator(entry);
	if (term != NULL)
		LLVMPositionBuilderBefore(g->b, term);
	else
		LLVMPositionBuilderAtEnd(g->b, entry);
	LLVMValueRef idx = LLVMConstInt(g->i64, s, 0);
	LLVMValueRef p = LLVMBuildGEP2(g->b, g->i64, g->syms, &idx, 1, "");
	LLVMValueRef v = LLVMBuildLoad2(g->b, g->i64, p, "");
	LLVMPositionBuilderAtEnd(g->b, cur);
	if (s < 64)
		g->sym_val[s] = v;
	return v;
}

static LLVMValueRef ifloordiv(gen_t *g, LLVMValueRef a, LLVMValueRef b)
{
	/* floor division; b == 0 gives 0 (never UB) */
	LLVMTypeRef t = LLVMTypeOf(a);
	LLVMValueRef zero = LLVMConstNull(t),
		     one = LLVMConstInt(LLVMGetTypeKind(t) == LLVMVectorTypeKind
					    ? LLVMGetElementType(t)
					    : t,
					1, 0);
	if (LLVMGetTypeKind(t) == LLVMVectorTypeKind)
		one = cg_splat(g, one, (int)LLVMGetVectorSize(t));
	LLVMValueRef bz = LLVMBuildICmp(g->b, LLVMIntEQ, b, zero, "");
	LLVMValueRef bs = LLVMBuildSelect(g->b, bz, one, b, "");
	LLVMValueRef q = LLVMBuildSDiv(g->b, a, bs, "");
	LLVMValueRef r = LLVMBuildSRem(g->b, a, bs, "");
	LLVMValueRef rnz = LLVMBuildICmp(g->b, LLVMIntNE, r, zero, "");
	LLVMValueRef sgn = LLVMBuildICmp(
	    g->b, LLVMIntNE, LLVMBuildICmp(g->b, LLVMIntSLT, r, zero, ""),
	    LLVMBuildICmp(g->b, LLVMIntSLT, bs, zero, ""), "");
	LLVMValueRef adj = LLVMBuildAnd(g->b, rnz, sgn, "");
	q = LLVMBuildSub(g->b, q, LLVMBuildZExt(g->b, adj, t, ""), "");
	return LLVMBuildSelect(g->b, bz, zero, q, "");
}

static LLVMValueRef imod(gen_t *g, LLVMValueRef a, LLVMValueRef b)
{
	LLVMTypeRef t = LLVMTypeOf(a);
	LLVMValueRef zero = LLVMConstNull(t);
	LLVMTypeRef et = LLVMGetTypeKind(t) == LLVMVectorTypeKind
			     ? LLVMGetElementType(t)
			     : t;
	LLVMValueRef one = LLVMConstInt(et, 1, 0);
	if (LLVMGetTypeKind(t) == LLVMVectorTypeKind)
		one = cg_splat(g, one, (int)LLVMGetVectorSize(t));
	LLVMValueRef bz = LLVMBuildICmp(g->b, LLVMIntEQ, b, zero, "");
	LLVMValueRef bs = LLVMBuildSelect(g->b, bz, one, b, "");
	LLVMValueRef r = LLVMBuildSRem(g->b, a, bs, "");
	LLVMValueRef rnz = LLVMBuildICmp(g->b, LLVMIntNE, r, zero, "");
	LLVMValueRef sgn = LLVMBuildICmp(
	    g->b, LLVMIntNE, LLVMBuildICmp(g->b, LLVMIntSLT, r, zero, ""),
	    LLVMBuildICmp(g->b, LLVMIntSLT, bs, zero, ""), "");
	LLVMValueRef adj = LLVMBuildAnd(g->b, rnz, sgn, "");
	r = LLVMBuildSelect(g->b, adj, LLVMBuildAdd(g->b, r, bs, ""), r, "");
	return LLVMBuildSelect(g->b, bz, zero, r, "");
}

/* Whether e is >= 0 wherever a kernel evaluates it: loop variables run
 * from 0 and symbols are sizes (min >= 0). Conservative: a subtraction or a
 * negative constant anywhere says no. */
static bool ix_nonneg(const kiln_expr_t *e)
{
	switch (e->kind) {
	case KILN_EX_CONST: return e->c >= 0;
	case KILN_EX_SYM:
	case KILN_EX_VAR: return true;
	case KILN_EX_ADD:
	case KILN_EX_MUL:
	case KILN_EX_MIN:
	case KILN_EX_MAX:
	case KILN_EX_FLOORDIV: return ix_nonneg(e->a) && ix_nonneg(e->b);
	case KILN_EX_MOD: return ix_nonneg(e->b); /* sign of the divisor */
	default: return false;
	}
}

/* a // b and a % b where b is a positive constant and a is known >= 0:
 * plain unsigned division (shifts and masks for powers of two, a multiply
 * otherwise), none of the floor fix-ups. */
static bool ix_unsigned_div(const kiln_expr_t *e)
{
	return e->b->kind == KILN_EX_CONST && e->b->c > 0 && ix_nonneg(e->a);
}

static LLVMValueRef ix_binop(gen_t *g, const kiln_expr_t *e, LLVMValueRef a,
			     LLVMValueRef b)
{
	switch (e->kind) {
	case KILN_EX_ADD: return LLVMBuildAdd(g->b, a, b, "");
	case KILN_EX_SUB: return LLVMBuildSub(g->b, a, b, "");
	case KILN_EX_MUL: return LLVMBuildMul(g->b, a, b, "");
	case KILN_EX_FLOORDIV:
		return ix_unsigned_div(e) ? LLVMBuildUDiv(g->b, a, b, "")
					  : ifloordiv(g, a, b);
	case KILN_EX_MOD:
		return ix_unsigned_div(e) ? LLVMBuildURem(g->b, a, b, "")
					  : imod(g, a, b);
	case KILN_EX_MIN:
		return LLVMBuildSelect(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, a, b, ""), a, b, "");
	case KILN_EX_MAX:
		return LLVMBuildSelect(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSGT, a, b, ""), a, b, "");
	default: return a;
	}
}

/* Scalar i64 value of e, with the vectorized var at its base. */
static LLVMValueRef emit_ix(gen_t *g, const kiln_expr_t *e)
{
	switch (e->kind) {
	case KILN_EX_CONST: return LLVMConstInt(g->i64, (uint64_t)e->c, 1);
	case KILN_EX_SYM: return sym_value(g, e->sym);
	case KILN_EX_VAR: return g->var[e->sym];
	case KILN_EX_NEG: return LLVMBuildNeg(g->b, emit_ix(g, e->a), "");
	default: break;
	}
	LLVMValueRef a = emit_ix(g, e->a);
	LLVMValueRef b = emit_ix(g, e->b);
	return ix_binop(g, e, a, b);
}

/* Per-lane i64 values of e at width w (vector when it depends on the
 * vectorized var): affine parts as base + lane·coef, the rest as vector
 * operations on those (one vector op where per-lane scalar code would be
 * w of them, which is what made O3 slow on convolution index math). */
static LLVMValueRef emit_ix_w(gen_t *g, const kiln_expr_t *e, int w)
{
	if (w <= 1 || g->vvar < 0 || !ix_uses_var(e, (uint32_t)g->vvar))
		return cg_splat(g, emit_ix(g, e), w);
	int64_t coef;
	if (ix_coef(e, (uint32_t)g->vvar, &coef)) {
		LLVMValueRef lanes = lane_ids(g, w);
		if (coef != 1)
			lanes = LLVMBuildMul(
			    g->b, lanes,
			    cg_splat(g, LLVMConstInt(g->i64, (uint64_t)coef, 1),
				     w),
			    "");
		return LLVMBuildAdd(g->b, cg_splat(g, emit_ix(g, e), w), lanes,
				    "");
	}
	if (e->kind == KILN_EX_NEG)
		return LLVMBuildNeg(g->b, emit_ix_w(g, e->a, w), "");
	LLVMValueRef a = emit_ix_w(g, e->a, w);
	LLVMValueRef b = emit_ix_w(g, e->b, w);
	return ix_binop(g, e, a, b);
}

/* ---- loads and stores ---------------------------------------------------- */

static const kiln_expr_t *lane_form(gen_t *g, const kiln_expr_t *e, int w,
				    int64_t *coef);
static LLVMValueRef emit_lane0(gen_t *g, const kiln_expr_t *e2, int w);

static int arg_index(gen_t *g, uint32_t buf)
{
	for (uint32_t i = 0; i < g->n_args; i++)
		if (g->args[i] == buf)
			return (int)i;
	return -1;
}

/* Converts a loaded storage value to its compute type. */
static LLVMValueRef from_storage(gen_t *g, LLVMValueRef v, kiln_dtype_t dt,
				 int w)
{
	switch (dt) {
	case KILN_DT_F16:
		return LLVMBuildFPExt(g->b, v, cg_type(g, KILN_DT_F32, w), "");
	case KILN_DT_BF16: {
		LLVMValueRef x =
		    LLVMBuildZExt(g->b, v, cg_type(g, KILN_DT_I32, w), "");
		x = LLVMBuildShl(g->b, x, cg_const_i(g, 16, KILN_DT_I32, w),
				 "");
		return LLVMBuildBitCast(g->b, x, cg_type(g, KILN_DT_F32, w),
					"");
	}
	case KILN_DT_BOOL:
		return LLVMBuildICmp(g->b, LLVMIntNE, v,
				     cg_const_i(g, 0, KILN_DT_I8, w), "");
	default: return v;
	}
}

/* f32 → bf16 bits, round to nearest even, NaN kept quiet. */
static LLVMValueRef to_bf16_bits(gen_t *g, LLVMValueRef x, int w)
{
	LLVMValueRef u =
	    LLVMBuildBitCast(g->b, x, cg_type(g, KILN_DT_I32, w), "");
	LLVMValueRef lsb = LLVMBuildAnd(
	    g->b, LLVMBuildLShr(g->b, u, cg_const_i(g, 16, KILN_DT_I32, w), ""),
	    cg_const_i(g, 1, KILN_DT_I32, w), "");
	LLVMValueRef r = LLVMBuildAdd(
	    g->b, u,
	    LLVMBuildAdd(g->b, cg_const_i(g, 0x7fff, KILN_DT_I32, w), lsb, ""),
	    "");
	LLVMValueRef isnan = LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, "");
	r = LLVMBuildSelect(
	    g->b, isnan,
	    LLVMBuildOr(g->b, u, cg_const_i(g, 0x400000, KILN_DT_I32, w), ""),
	    r, "");
	r = LLVMBuildLShr(g->b, r, cg_const_i(g, 16, KILN_DT_I32, w), "");
	return LLVMBuildTrunc(g->b, r, cg_type(g, KILN_DT_I16, w), "");
}

static LLVMValueRef to_storage(gen_t *g, LLVMValueRef v, kiln_dtype_t dt, int w)
{
	switch (dt) {
	case KILN_DT_F16:
		return LLVMBuildFPTrunc(g->b, v, cg_type(g, KILN_DT_F16, w),
					"");
	case KILN_DT_BF16: return to_bf16_bits(g, v, w);
	case KILN_DT_BOOL:
		return LLVMBuildZExt(g->b, v, cg_type(g, KILN_DT_I8, w), "");
	default: return v;
	}
}

static LLVMTypeRef storage_type(gen_t *g, kiln_dtype_t dt, int w)
{
	if (dt == KILN_DT_BOOL)
		return cg_type(g, KILN_DT_I8, w);
	return cg_type(g, dt, w);
}

static LLVMValueRef buf_ptr(gen_t *g, uint32_t buf)
{
	int a = arg_index(g, buf);
	return a >= 0 ? g->argp[a] : NULL;
}

static LLVMValueRef emit_sx(gen_t *g, const sx_t *e);
static const kiln_expr_t *reduce_linear(gen_t *g);
static LLVMValueRef entry_alloca(gen_t *g, LLVMTypeRef t);

/* The address of the current element of a row-local buffer kept in an
 * output's row (sched.c row_in_output): the output's own store address, in
 * the pass that computes it and in the passes that read it. */
static LLVMValueRef row_out_ptr(gen_t *g, const cbuf_t *b)
{
	uint32_t ob = b->row_out - 1;
	for (uint32_t i = 0; i < g->k->n_members; i++) {
		const kmember_t *m = &g->k->members[i];
		if (m->role != ROLE_FULL || g->c->nodes[m->node].buf != ob)
			continue;
		LLVMValueRef idx = emit_ix(g, m->sidx);
		return LLVMBuildGEP2(g->b, storage_type(g, b->dtype, 1),
				     buf_ptr(g, ob), &idx, 1, "");
	}
	return NULL;
}

/* The per-row scratch of a row-local buffer (allocated once per kernel). */
static LLVMValueRef scratch_ptr(gen_t *g, uint32_t buf)
{
	for (uint32_t i = 0; i < g->n_scratch; i++)
		if (g->scratch_buf[i] == buf)
			return g->scratch[i];
	if (g->n_scratch == 16)
		return NULL;
	int64_t r = 1;
	for (uint32_t d = 0; d < g->k->frank; d++)
		if (g->k->rmask >> d & 1)
			r *= g->k->fsizes[d].c;
	const cbuf_t *b = &g->c->bufs[buf];
	LLVMTypeRef at = LLVMArrayType(
	    cg_scalar_type(g, compute_dtype(b->dtype) == KILN_DT_BOOL
				  ? KILN_DT_I8
				  : compute_dtype(b->dtype)),
	    (unsigned)r);
	LLVMValueRef a = entry_alloca(g, at);
	LLVMSetAlignment(a, 64);
	g->scratch_buf[g->n_scratch] = buf;
	g->scratch[g->n_scratch++] = a;
	return a;
}

/* In vector code the vectorized var's base is a multiple of W, so
 * v = W*T + L with lane L in [0, W). An index that is not affine in v (a
 * reshape's v//16, v%16) is often affine in L: then it is a vector access
 * after all. Returns the index in terms of T and L, or NULL. */
#define VAR_T (CIR_MAX_VARS - 2)
#define VAR_L (CIR_MAX_VARS - 1)

/* e with the vector variable v := w·T + L, simplified knowing L < w; the
 * lane form of lane_form and lane_offsets (NULL: no vector variable) */
static const kiln_expr_t *lane_subst(gen_t *g, const kiln_expr_t *e, int w)
{
	cctx_t *c = g->c;
	if (g->vvar < 0 || w <= 1)
		return NULL;
	bool kt = c->var_known[VAR_T], kl = c->var_known[VAR_L];
	kiln_dim_t sl = c->var_size[VAR_L];
	c->var_known[VAR_T] = false;
	c->var_known[VAR_L] = true;
	c->var_size[VAR_L] = dim_const(w);
	const kiln_expr_t *map[CIR_MAX_RANK];
	for (int k = 0; k < CIR_MAX_RANK; k++)
		map[k] = NULL;
	map[g->vvar] = ix_add(c, ix_mul(c, ix_const(c, w), ix_var(c, VAR_T)),
			      ix_var(c, VAR_L));
	const kiln_expr_t *e2 = ix_subst(c, e, map, CIR_MAX_RANK);
	c->var_known[VAR_T] = kt;
	c->var_known[VAR_L] = kl;
	c->var_size[VAR_L] = sl;
	return e2;
}

static const kiln_expr_t *lane_form(gen_t *g, const kiln_expr_t *e, int w,
				    int64_t *coef)
{
	const kiln_expr_t *e2 = lane_subst(g, e, w);
	if (e2 == NULL || !ix_coef(e2, VAR_L, coef))
		return NULL;
	return e2;
}

/* The scalar index of lane 0 of a lane form. */
static LLVMValueRef emit_lane0(gen_t *g, const kiln_expr_t *e2, int w)
{
	unsigned sh = 0;
	while ((1 << sh) < w)
		sh++;
	g->var[VAR_T] = LLVMBuildLShr(g->b, g->var[g->vvar],
				      LLVMConstInt(g->i64, sh, 0), "");
	g->var[VAR_L] = LLVMConstInt(g->i64, 0, 0);
	return emit_ix(g, e2);
}

/* A load whose element is the same in every lane (its index does not
 * move with the vector variable) under a lane mask: the element loaded
 * once, from the zero page where no lane wants it, then splat, and 0 in
 * the lanes the mask drops (what a masked gather gives them). A
 * per-channel parameter inside a padded window (batch norm before a
 * padded max pool) had been one gather a lane-uniform element: 16-20
 * cycles each on a Zen 5, against a load and a blend. */
static LLVMValueRef load_uniform_masked(gen_t *g, LLVMValueRef p,
					LLVMValueRef mask, kiln_dtype_t dt,
					int w)
{
	LLVMTypeRef mt = LLVMTypeOf(mask);
	LLVMValueRef any =
	    cg_intr(g, "llvm.vector.reduce.or", &mt, 1, &mask, 1);
	p = LLVMBuildSelect(g->b, any, p, g->zero_page, "");
	LLVMTypeRef st = storage_type(g, dt, 1);
	LLVMValueRef v = LLVMBuildLoad2(g->b, st, p, "");
	LLVMSetAlignment(v, (unsigned)kiln_dtype_size(dt));
	v = cg_splat(g, from_storage(g, v, dt, 1), w);
	return LLVMBuildSelect(g->b, mask, v, LLVMConstNull(LLVMTypeOf(v)), "");
}

/* Whether e reads the loop variable v anywhere (an index, a load's). */
static bool sx_uses_var(const sx_t *e, uint32_t v)
{
	if (e == NULL)
		return false;
	if (e->idx != NULL && ix_uses_var(e->idx, v))
		return true;
	return sx_uses_var(e->a, v) || sx_uses_var(e->b, v) ||
	       sx_uses_var(e->c, v);
}

/* w contiguous elements from p under a guard that is the same in every
 * lane (it does not read the vector variable: a padded convolution's
 * window test with the channels as the vector): one plain vector load,
 * from the zero block where the guard is false. A masked load there
 * (llvm.masked.load) was 4x slower on a Zen 5 where its masked-off
 * address fell among lines the kernel had just written (ConvNeXt's
 * channels-last 7x7 depthwise at 8², 0.27 against 1.2 ms, the same code
 * over other buffers). */
static LLVMValueRef load_guarded_row(gen_t *g, LLVMValueRef p,
				     LLVMValueRef mask, LLVMTypeRef vt)
{
	LLVMValueRef ok =
	    LLVMBuildExtractElement(g->b, mask, LLVMConstInt(g->i32, 0, 0), "");
	p = LLVMBuildSelect(g->b, ok, p, g->zero_page, "");
	return LLVMBuildLoad2(g->b, vt, p, "");
}

/* Lanes i = 0 .. w-1 of elements p[s·i] (1 <= s <= CG_MAX_STRIDE, under
 * an optional lane mask): s vector loads of the w·s elements from p, then
 * one shuffle that keeps every s-th, instead of a gather (at s = 1, one
 * load). A load reads
 * only memory a lane needs or that lies between two such elements (so
 * inside the tensor): without a mask, the first s - 1 vectors whole and
 * the last up to element s·(w-1); with one, each loaded element is one a
 * lane wants and the mask keeps (fault-suppressing masked loads: a
 * padded window may begin before its buffer). Lanes the mask drops are 0,
 * as a masked gather gives them. A stride-2 max pool or the im2col of a
 * stride-2 convolution ran one 16-lane gather (16-20 cycles on a Zen 5)
 * where this is two loads and a vpermt2ps. */
static LLVMValueRef load_strided(gen_t *g, LLVMValueRef p, int64_t s,
				 LLVMValueRef mask, kiln_dtype_t dt, int w)
{
	LLVMTypeRef st = storage_type(g, dt, 1);
	LLVMTypeRef vt = storage_type(g, dt, w);
	LLVMTypeRef mt =
	    LLVMVectorType(LLVMInt1TypeInContext(g->ctx), (unsigned)w);
	unsigned align = (unsigned)kiln_dtype_size(dt);
	LLVMValueRef part[CG_MAX_STRIDE] = {NULL};
	for (int64_t j = 0; j < s; j++) {
		LLVMValueRef off = LLVMConstInt(g->i64, (uint64_t)(j * w), 0);
		LLVMValueRef pj = LLVMBuildGEP2(g->b, st, p, &off, 1, "");
		LLVMValueRef mj;
		if (mask == NULL && j < s - 1) {
			part[j] = LLVMBuildLoad2(g->b, vt, pj, "");
			LLVMSetAlignment(part[j], align);
			continue;
		}
		if (mask == NULL) {
			/* the last vector: elements up to s·(w-1) */
			LLVMValueRef bits[64];
			for (int t = 0; t < w; t++)
				bits[t] =
				    LLVMConstInt(LLVMInt1TypeInContext(g->ctx),
						 j * w + t <= s * (w - 1), 0);
			mj = LLVMConstVector(bits, (unsigned)w);
		} else if (s == 1) {
			mj = mask;
		} else {
			/* element j·w + t: lane (j·w + t)/s's mask where it
			 * is a multiple of s, else off (lane w of the second
			 * operand, a false) */
			LLVMValueRef ix[64];
			for (int t = 0; t < w; t++) {
				int64_t k = j * w + t;
				ix[t] = LLVMConstInt(
				    g->i32, (uint64_t)(k % s == 0 ? k / s : w),
				    0);
			}
			mj = LLVMBuildShuffleVector(
			    g->b, mask, LLVMConstNull(mt),
			    LLVMConstVector(ix, (unsigned)w), "");
		}
		LLVMTypeRef over[2] = {vt, g->ptr};
		LLVMValueRef args[4] = {pj, LLVMConstInt(g->i32, align, 0), mj,
					LLVMConstNull(vt)};
		part[j] = cg_intr(g, "llvm.masked.load", over, 2, args, 4);
	}
	if (s == 1)
		return from_storage(g, part[0], dt, w);
	/* concatenate pairs (the last alone with zeros), then pick */
	LLVMValueRef a = part[0], b = part[1];
	if (s > 2) {
		LLVMValueRef ix[128];
		for (int t = 0; t < 2 * w; t++)
			ix[t] = LLVMConstInt(g->i32, (uint64_t)t, 0);
		LLVMValueRef cat = LLVMConstVector(ix, (unsigned)(2 * w));
		a = LLVMBuildShuffleVector(g->b, part[0], part[1], cat, "");
		b = LLVMBuildShuffleVector(g->b, part[2],
					   s > 3 ? part[3] : LLVMConstNull(vt),
					   cat, "");
	}
	LLVMValueRef pick[64];
	for (int i = 0; i < w; i++)
		pick[i] = LLVMConstInt(g->i32, (uint64_t)(s * i), 0);
	LLVMValueRef v = LLVMBuildShuffleVector(
	    g->b, a, b, LLVMConstVector(pick, (unsigned)w), "");
	return from_storage(g, v, dt, w);
}

/* A load whose index, with the vector variable v = w·T + L, moves from
 * lane to lane by amounts that are constants but not one affine step:
 * (v + c) // d (a nearest upsampling's source, a pooling backward's
 * window), reading lanes' elements within one vector's span. Gives the
 * span's first element in lane form (*e2out: its index where L = 0) and
 * each lane's offset from it (off), or returns false. */
static bool lane_offsets(gen_t *g, const kiln_expr_t *e, int w,
			 const kiln_expr_t **e2out, int64_t *off)
{
	cctx_t *c = g->c;
	if (w > 64)
		return false;
	const kiln_expr_t *e2 = lane_subst(g, e, w);
	const kiln_expr_t *map[CIR_MAX_VARS];
	for (int k = 0; k < CIR_MAX_VARS; k++)
		map[k] = NULL;
	bool ok = e2 != NULL;
	const kiln_expr_t *at0 = NULL;
	int64_t lo = 0, hi = 0;
	for (int l = 0; ok && l < w; l++) {
		map[VAR_L] = ix_const(c, l);
		const kiln_expr_t *el = ix_subst(c, e2, map, CIR_MAX_VARS);
		if (l == 0)
			at0 = el;
		const kiln_expr_t *d = el && at0 ? ix_sub(c, el, at0) : NULL;
		ok = d != NULL && d->kind == KILN_EX_CONST;
		if (ok) {
			off[l] = d->c;
			lo = off[l] < lo ? off[l] : lo;
			hi = off[l] > hi ? off[l] : hi;
		}
	}
	if (!ok || hi - lo >= w)
		return false;
	for (int l = 0; l < w; l++)
		off[l] -= lo;
	*e2out = ix_add(c, e2, ix_const(c, lo));
	return true;
}

/* The load of lane_offsets: the span's elements by one masked vector load
 * (an element only where a lane wants it and, under a guard, the guard
 * keeps that lane: fault-suppressing, as a padded window may begin before
 * its buffer), then one permute to the lanes; lanes the guard drops are 0,
 * as a masked gather gives them. ResNet's stem max_pool2d backward (3x3,
 * stride 2: (w + 1) // 2 and (w + 1) // 2 - 1 per window) ran 24 gathers
 * a vector of 16 elements. */
static LLVMValueRef load_lane_perm(gen_t *g, const kiln_expr_t *e2,
				   const int64_t *off, LLVMValueRef base,
				   LLVMValueRef guard, kiln_dtype_t dt, int w)
{
	LLVMTypeRef st = storage_type(g, dt, 1);
	LLVMTypeRef vt = storage_type(g, dt, w);
	LLVMTypeRef i1 = LLVMInt1TypeInContext(g->ctx);
	LLVMTypeRef mt = LLVMVectorType(i1, (unsigned)w);
	unsigned align = (unsigned)kiln_dtype_size(dt);
	LLVMValueRef i0 = emit_lane0(g, e2, w);
	LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &i0, 1, "");
	/* element j is wanted by the lanes l with off[l] == j: the mask of
	 * element j is the OR of their guards, one shuffle per lane of the
	 * longest such run */
	int runs = 0, cnt[64] = {0};
	for (int l = 0; l < w; l++) {
		int j = (int)off[l];
		cnt[j]++;
		runs = cnt[j] > runs ? cnt[j] : runs;
	}
	LLVMValueRef emask = NULL;
	if (guard == NULL) {
		LLVMValueRef bits[64];
		for (int j = 0; j < w; j++)
			bits[j] = LLVMConstInt(i1, cnt[j] > 0, 0);
		emask = LLVMConstVector(bits, (unsigned)w);
	} else {
		for (int r = 0; r < runs; r++) {
			/* element j: its r-th lane (its first where it has
			 * fewer), or lane w of the zeros where none wants it */
			LLVMValueRef ix[64];
			for (int j = 0; j < w; j++) {
				int pick = w, seen = 0;
				for (int l = 0; l < w; l++) {
					if (off[l] != j)
						continue;
					if (seen == 0 || seen == r)
						pick = l;
					if (seen++ == r)
						break;
				}
				ix[j] = LLVMConstInt(g->i32, (uint64_t)pick, 0);
			}
			LLVMValueRef m = LLVMBuildShuffleVector(
			    g->b, guard, LLVMConstNull(mt),
			    LLVMConstVector(ix, (unsigned)w), "");
			emask = emask ? LLVMBuildOr(g->b, emask, m, "") : m;
		}
	}
	LLVMTypeRef over[2] = {vt, g->ptr};
	LLVMValueRef args[4] = {p, LLVMConstInt(g->i32, align, 0), emask,
				LLVMConstNull(vt)};
	LLVMValueRef v = cg_intr(g, "llvm.masked.load", over, 2, args, 4);
	LLVMValueRef pick[64];
	for (int l = 0; l < w; l++)
		pick[l] = LLVMConstInt(g->i32, (uint64_t)off[l], 0);
	v = LLVMBuildShuffleVector(g->b, v, LLVMGetUndef(vt),
				   LLVMConstVector(pick, (unsigned)w), "");
	if (guard != NULL)
		v = LLVMBuildSelect(g->b, guard, v, LLVMConstNull(vt), "");
	return from_storage(g, v, dt, w);
}

static LLVMValueRef emit_load(gen_t *g, const sx_t *e)
{
	cctx_t *c = g->c;
	const cbuf_t *b = &c->bufs[e->buf];
	int w = g->W;
	/* a load a tiled kernel transposed for this vector (tiles) */
	for (uint32_t t = 0; t < g->n_tld; t++) {
		if (g->tld_e[t] != e)
			continue;
		LLVMTypeRef vt = storage_type(g, b->dtype, g->tile_w);
		LLVMTypeRef at = LLVMArrayType(vt, CIR_TBLK);
		LLVMValueRef ix[2] = {LLVMConstInt(g->i64, 0, 0),
				      g->var[g->tile_var]};
		LLVMValueRef v = LLVMBuildLoad2(
		    g->b, vt, LLVMBuildGEP2(g->b, at, g->tld_mem[t], ix, 2, ""),
		    "");
		LLVMSetAlignment(v, 4);
		return from_storage(g, v, b->dtype, g->tile_w);
	}
	/* a value computed in this kernel at this point? */
	if (b->kind == CB_TEMP && b->kernel == (int32_t)(g->k - c->kernels)) {
		for (uint32_t i = 0; i < g->k->n_members; i++) {
			const kmember_t *m = &g->k->members[i];
			if (c->nodes[m->node].buf != e->buf ||
			    g->mval[i] == NULL)
				continue;
			if (e->idx != m->sidx || e->b != NULL)
				break;
			LLVMValueRef v = g->mval[i];
			if (g->mval_width[i] == w)
				return v;
			if (g->mval_width[i] == 1)
				return cg_splat(g, v, w);
			break;
		}
	}
	if (b->row_local) {
		/* computed in an earlier pass of this row: from the scratch,
		 * in the compute dtype, at the reduce position */
		kiln_dtype_t cdt = compute_dtype(b->dtype);
		LLVMTypeRef et =
		    cg_scalar_type(g, cdt == KILN_DT_BOOL ? KILN_DT_I8 : cdt);
		LLVMValueRef p =
		    b->row_out != 0
			? row_out_ptr(g, b)
			: LLVMBuildGEP2(
			      g->b, et, scratch_ptr(g, e->buf),
			      (LLVMValueRef[]){emit_ix(g, reduce_linear(g))}, 1,
			      "");
		LLVMValueRef v = LLVMBuildLoad2(
		    g->b, w > 1 ? LLVMVectorType(et, (unsigned)w) : et, p, "");
		LLVMSetAlignment(v, (unsigned)kiln_dtype_size(cdt));
		if (cdt == KILN_DT_BOOL)
			v = LLVMBuildTrunc(g->b, v, cg_type(g, KILN_DT_BOOL, w),
					   "");
		return v;
	}
	LLVMValueRef base = buf_ptr(g, e->buf);
	kiln_dtype_t dt = b->dtype;
	LLVMTypeRef st = storage_type(g, dt, 1);
	unsigned align = (unsigned)kiln_dtype_size(dt);
	LLVMValueRef idx = emit_ix(g, e->idx);
	if (e->b != NULL) {
		/* a data-dependent offset: per-lane addresses */
		LLVMValueRef dyn = emit_sx(g, e->b); /* i64 at width w */
		if (w == 1) {
			idx = LLVMBuildAdd(g->b, idx, dyn, "");
		} else {
			LLVMValueRef iv = LLVMBuildAdd(
			    g->b, emit_ix_w(g, e->idx, w), dyn, "");
			LLVMValueRef ptrs = LLVMBuildGEP2(
			    g->b, st, cg_splat(g, base, w), &iv, 1, "");
			LLVMValueRef mask =
			    e->a ? emit_sx(g, e->a)
				 : cg_const_i(g, 1, KILN_DT_BOOL, w);
			LLVMTypeRef vt = storage_type(g, dt, w);
			LLVMTypeRef over[2] = {vt, LLVMTypeOf(ptrs)};
			LLVMValueRef args[4] = {ptrs,
						LLVMConstInt(g->i32, align, 0),
						mask, LLVMConstNull(vt)};
			LLVMValueRef v =
			    cg_intr(g, "llvm.masked.gather", over, 2, args, 4);
			return from_storage(g, v, dt, w);
		}
	}
	if (w == 1) {
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &idx, 1, "");
		if (e->a != NULL) {
			LLVMValueRef ok = emit_sx(g, e->a);
			p = LLVMBuildSelect(g->b, ok, p, g->zero_page, "");
		}
		LLVMValueRef v = LLVMBuildLoad2(g->b, st, p, "");
		LLVMSetAlignment(v, align);
		return from_storage(g, v, dt, 1);
	}
	int64_t coef = -1;
	bool affine = g->vvar < 0 || ix_coef(e->idx, (uint32_t)g->vvar, &coef);
	if (g->vvar < 0)
		coef = 0;
	LLVMTypeRef vt = storage_type(g, dt, w);
	if (affine && coef == 0 && e->a == NULL) {
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &idx, 1, "");
		LLVMValueRef v = LLVMBuildLoad2(g->b, st, p, "");
		LLVMSetAlignment(v, align);
		return cg_splat(g, from_storage(g, v, dt, 1), w);
	}
	if (affine && coef == 0)
		return load_uniform_masked(
		    g, LLVMBuildGEP2(g->b, st, base, &idx, 1, ""),
		    emit_sx(g, e->a), dt, w);
	if (affine && coef >= 2 && coef <= CG_MAX_STRIDE && w <= 64 &&
	    align >= 4)
		return load_strided(
		    g, LLVMBuildGEP2(g->b, st, base, &idx, 1, ""), coef,
		    e->a ? emit_sx(g, e->a) : NULL, dt, w);
	if (affine && coef == 1) {
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &idx, 1, "");
		if (e->a != NULL && g->vvar >= 0 &&
		    !sx_uses_var(e->a, (uint32_t)g->vvar) &&
		    (int64_t)w * kiln_dtype_size(dt) <= CG_ZERO_BYTES) {
			LLVMValueRef v =
			    load_guarded_row(g, p, emit_sx(g, e->a), vt);
			LLVMSetAlignment(v, align);
			return from_storage(g, v, dt, w);
		}
		if (e->a != NULL) {
			LLVMValueRef mask = emit_sx(g, e->a);
			LLVMTypeRef over[2] = {vt, g->ptr};
			LLVMValueRef args[4] = {p,
						LLVMConstInt(g->i32, align, 0),
						mask, LLVMConstNull(vt)};
			LLVMValueRef v =
			    cg_intr(g, "llvm.masked.load", over, 2, args, 4);
			return from_storage(g, v, dt, w);
		}
		LLVMValueRef v = LLVMBuildLoad2(g->b, vt, p, "");
		LLVMSetAlignment(v, align);
		return from_storage(g, v, dt, w);
	}
	if (!affine && e->a == NULL) {
		int64_t lc;
		const kiln_expr_t *e2 = lane_form(g, e->idx, w, &lc);
		if (e2 != NULL && (lc == 1 || lc == 0)) {
			LLVMValueRef i0 = emit_lane0(g, e2, w);
			LLVMValueRef p =
			    LLVMBuildGEP2(g->b, st, base, &i0, 1, "");
			if (lc == 0) {
				LLVMValueRef v =
				    LLVMBuildLoad2(g->b, st, p, "");
				LLVMSetAlignment(v, align);
				return cg_splat(g, from_storage(g, v, dt, 1),
						w);
			}
			LLVMValueRef v = LLVMBuildLoad2(g->b, vt, p, "");
			LLVMSetAlignment(v, align);
			return from_storage(g, v, dt, w);
		}
	}
	if (!affine) {
		const kiln_expr_t *e2;
		int64_t off[64];
		if (lane_offsets(g, e->idx, w, &e2, off))
			return load_lane_perm(g, e2, off, base,
					      e->a ? emit_sx(g, e->a) : NULL,
					      dt, w);
	}
	LLVMValueRef iv = emit_ix_w(g, e->idx, w);
	LLVMValueRef ptrs =
	    LLVMBuildGEP2(g->b, st, cg_splat(g, base, w), &iv, 1, "");
	LLVMValueRef mask =
	    e->a ? emit_sx(g, e->a) : cg_const_i(g, 1, KILN_DT_BOOL, w);
	LLVMTypeRef over[2] = {vt, LLVMTypeOf(ptrs)};
	LLVMValueRef args[4] = {ptrs, LLVMConstInt(g->i32, align, 0), mask,
				LLVMConstNull(vt)};
	LLVMValueRef v = cg_intr(g, "llvm.masked.gather", over, 2, args, 4);
	return from_storage(g, v, dt, w);
}

/* ---- streaming stores ----------------------------------------------------
 *
 * A kernel that writes a buffer larger than the last-level cache gains
 * nothing from keeping it there: no reader finds it in cache later, and
 * each line of a plain store is read from memory first (read for
 * ownership) and written back when evicted. Streaming (non-temporal)
 * stores write whole lines to memory without the read. Whether a call
 * streams a buffer is decided when it runs: its size in bytes (symbols
 * included) against @kiln_nt_min, a global of the code object that the
 * runtime sets when it loads the module (clients/libkiln runtime.c
 * kiln__nt_min: 3/4 of the host's L3, glibc's threshold for memcpy, or
 * KILN_NT_BYTES). A module nobody set streams nothing. Buffers whose size
 * is a constant under NT_FLOOR get no such code. Only contiguous vector
 * stores of 32 bytes or more stream, and each only where its address is
 * aligned to min(its size, 64) (movntps faults otherwise); masked tails,
 * scalar stores and the rest stay plain. Streaming stores are weakly
 * ordered: the kernel ends with an sfence.
 *
 * A buffer streams only where the kernel's rows (its last dim, along
 * which it stores vectors) are whole cache lines, or where it has one
 * row (nt_rows_whole): rows of another length start now on a line,
 * streamed, now within one, stored plainly, and that alternation of
 * streamed and plain rows cost far more than either (an im2col of [8, 64,
 * 3, 3, 56, 56] rows, 58 MB: 24 ms streamed against 2.5 plain; of
 * 60-float rows 7.3 against 1.8; of 64-float rows 1.4 against 1.6;
 * gelu(x)·2 + 1 over 64 MB in rows of 200 f32 9.4-10.0 ms against 3.7-4.5,
 * of 1000 4.8-5.9 against 3.4-3.6, of 1024 streamed 2.6-2.8 against 3.6:
 * kilnc --profile, 2 threads, a Zen 4). */
#define NT_FLOOR (1 << 20)

/* Whether the rows of a space `sizes` (rank > 0) of esz-byte elements
 * are whole 64-byte lines, or there is one row (an i1, folded where the
 * sizes are constants). */
static LLVMValueRef nt_rows_whole(gen_t *g, uint32_t rank,
				  const kiln_dim_t *sizes, int64_t esz)
{
	cctx_t *c = g->c;
	LLVMValueRef last =
	    LLVMBuildMul(g->b, emit_ix(g, ix_dim(c, sizes[rank - 1])),
			 LLVMConstInt(g->i64, (uint64_t)esz, 0), "");
	LLVMValueRef whole = LLVMBuildICmp(
	    g->b, LLVMIntEQ,
	    LLVMBuildAnd(g->b, last, LLVMConstInt(g->i64, 63, 0), ""),
	    LLVMConstInt(g->i64, 0, 0), "");
	LLVMValueRef rows = LLVMConstInt(g->i64, 1, 0);
	for (uint32_t d = 0; d + 1 < rank; d++)
		rows = LLVMBuildMul(g->b, rows, emit_ix(g, ix_dim(c, sizes[d])),
				    "");
	return LLVMBuildOr(g->b, whole,
			   LLVMBuildICmp(g->b, LLVMIntSLE, rows,
					 LLVMConstInt(g->i64, 1, 0), ""),
			   "");
}

static LLVMValueRef nt_min_global(gen_t *g)
{
	LLVMValueRef gv = LLVMGetNamedGlobal(g->mod, "kiln_nt_min");
	if (gv == NULL) {
		gv = LLVMAddGlobal(g->mod, g->i64, "kiln_nt_min");
		LLVMSetInitializer(gv, LLVMConstInt(g->i64, INT64_MAX, 0));
		/* one variable in the linked object, whichever module of
		 * the compile defines it; exported for the runtime's dlsym */
		LLVMSetLinkage(gv, LLVMWeakAnyLinkage);
		LLVMSetAlignment(gv, 8);
	}
	return gv;
}

static const cnode_t *mnode(gen_t *g, uint32_t i);

/* Whether buffer buf's rows hold a row scratch of the kernel (sched.c
 * row_in_output): its lines are in cache, written, when the last pass
 * stores it, so streaming would save no read (softmax at 64 MB measured
 * 85-99% of memcpy streamed, median 90, against 89-98%, median 97). */
static bool holds_row_scratch(gen_t *g, uint32_t buf)
{
	for (uint32_t i = 0; i < g->k->n_members; i++)
		if (g->c->bufs[mnode(g, i)->buf].row_out == buf + 1)
			return true;
	return false;
}

/* At the start of a kernel's body: the nt flag of each buffer it stores
 * that may be large enough. x86 only (the fence). */
static void nt_setup(gen_t *g)
{
	cctx_t *c = g->c;
	g->any_nt = false;
	for (uint32_t i = 0; i < g->n_args; i++)
		g->nt_flag[i] = NULL;
	if (strncmp(c->target->arch, "x86", 3) != 0)
		return;
	LLVMValueRef min = NULL;
	for (uint32_t i = 0; i < g->n_args; i++) {
		const cbuf_t *b = &c->bufs[g->args[i]];
		if (!(b->in_memory || b->is_output) || b->row_local ||
		    holds_row_scratch(g, g->args[i]))
			continue;
		int64_t cb = (int64_t)kiln_dtype_size(b->dtype);
		bool known = true;
		for (uint32_t d = 0; d < b->rank; d++) {
			if (b->sizes[d].e != NULL)
				known = false;
			else if (cb < INT64_MAX / 2)
				cb *= b->sizes[d].c > 0 ? b->sizes[d].c : 0;
		}
		if (known && cb < NT_FLOOR)
			continue;
		/* a scatter stores rows of its output, other kernels the
		 * rows of their space; where they are known not to be whole
		 * lines, no streaming code at all */
		int64_t esz = (int64_t)kiln_dtype_size(b->dtype);
		LLVMValueRef rows =
		    g->k->is_scatter || g->k->frank == 0
			? nt_rows_whole(g, b->rank, b->sizes, esz)
			: nt_rows_whole(g, g->k->frank, g->k->fsizes, esz);
		if (LLVMIsAConstantInt(rows) &&
		    LLVMConstIntGetZExtValue(rows) == 0)
			continue;
		LLVMValueRef n = LLVMConstInt(g->i64, (uint64_t)esz, 0);
		for (uint32_t d = 0; d < b->rank; d++)
			n = LLVMBuildMul(
			    g->b, n, emit_ix(g, ix_dim(c, b->sizes[d])), "");
		if (min == NULL) {
			min =
			    LLVMBuildLoad2(g->b, g->i64, nt_min_global(g), "");
			LLVMSetAlignment(min, 8);
		}
		g->nt_flag[i] = LLVMBuildAnd(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSGE, n, min, ""), rows,
		    "");
	}
}

/* Stores the vector sv at p: streaming where the buffer's flag and the
 * address's alignment allow (nt_setup), else plain. */
static void store_vec(gen_t *g, uint32_t buf, LLVMValueRef sv, LLVMValueRef p,
		      unsigned align)
{
	int a = arg_index(g, buf);
	LLVMTypeRef vt = LLVMTypeOf(sv);
	LLVMValueRef flag = a >= 0 ? g->nt_flag[a] : NULL;
	unsigned long long vb = 0;
	if (flag != NULL && LLVMGetTypeKind(vt) == LLVMVectorTypeKind) {
		LLVMTypeRef et = LLVMGetElementType(vt);
		unsigned eb = 0;
		switch (LLVMGetTypeKind(et)) {
		case LLVMFloatTypeKind: eb = 4; break;
		case LLVMDoubleTypeKind: eb = 8; break;
		case LLVMHalfTypeKind:
		case LLVMBFloatTypeKind: eb = 2; break;
		case LLVMIntegerTypeKind:
			eb = LLVMGetIntTypeWidth(et) / 8;
			break;
		default: break;
		}
		vb = (unsigned long long)LLVMGetVectorSize(vt) * eb;
	}
	if (vb < 32 || (vb & (vb - 1)) != 0) {
		LLVMValueRef s = LLVMBuildStore(g->b, sv, p);
		LLVMSetAlignment(s, align);
		return;
	}
	unsigned na = vb < 64 ? (unsigned)vb : 64;
	LLVMValueRef pi = LLVMBuildPtrToInt(g->b, p, g->i64, "");
	LLVMValueRef mis =
	    LLVMBuildAnd(g->b, pi, LLVMConstInt(g->i64, na - 1, 0), "");
	LLVMValueRef ok = LLVMBuildAnd(
	    g->b, flag,
	    LLVMBuildICmp(g->b, LLVMIntEQ, mis, LLVMConstInt(g->i64, 0, 0), ""),
	    "");
	LLVMBasicBlockRef bn =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "nt");
	LLVMBasicBlockRef bp =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "plain");
	LLVMBasicBlockRef bj =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "stored");
	LLVMBuildCondBr(g->b, ok, bn, bp);
	LLVMPositionBuilderAtEnd(g->b, bn);
	LLVMValueRef sn = LLVMBuildStore(g->b, sv, p);
	LLVMSetAlignment(sn, na);
	LLVMValueRef one = LLVMConstInt(g->i32, 1, 0);
	LLVMSetMetadata(sn, LLVMGetMDKindIDInContext(g->ctx, "nontemporal", 11),
			LLVMMDNodeInContext(g->ctx, &one, 1));
	LLVMBuildBr(g->b, bj);
	LLVMPositionBuilderAtEnd(g->b, bp);
	LLVMValueRef s = LLVMBuildStore(g->b, sv, p);
	LLVMSetAlignment(s, align);
	LLVMBuildBr(g->b, bj);
	LLVMPositionBuilderAtEnd(g->b, bj);
	g->any_nt = true;
}

static void emit_store(gen_t *g, uint32_t buf, const kiln_expr_t *sidx,
		       LLVMValueRef val, int w)
{
	const cbuf_t *b = &g->c->bufs[buf];
	kiln_dtype_t dt = b->dtype;
	LLVMValueRef base = buf_ptr(g, buf);
	if (base == NULL)
		return;
	LLVMTypeRef st = storage_type(g, dt, 1);
	unsigned align = (unsigned)kiln_dtype_size(dt);
	LLVMValueRef sv = to_storage(g, val, dt, w);
	LLVMValueRef idx = emit_ix(g, sidx);
	int64_t coef = 0;
	bool affine = g->vvar < 0 || ix_coef(sidx, (uint32_t)g->vvar, &coef);
	if (w == 1 || (affine && coef == 1)) {
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &idx, 1, "");
		store_vec(g, buf, sv, p, align);
		return;
	}
	if (!affine) {
		int64_t lc;
		const kiln_expr_t *e2 = lane_form(g, sidx, w, &lc);
		if (e2 != NULL && lc == 1) {
			LLVMValueRef i0 = emit_lane0(g, e2, w);
			LLVMValueRef p =
			    LLVMBuildGEP2(g->b, st, base, &i0, 1, "");
			store_vec(g, buf, sv, p, align);
			return;
		}
	}
	if (affine && coef == 0) {
		/* every lane writes the same element: the last lane's value */
		LLVMValueRef last = LLVMBuildExtractElement(
		    g->b, sv, LLVMConstInt(g->i32, (uint64_t)(w - 1), 0), "");
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &idx, 1, "");
		LLVMValueRef s = LLVMBuildStore(g->b, last, p);
		LLVMSetAlignment(s, align);
		return;
	}
	LLVMValueRef iv = emit_ix_w(g, sidx, w);
	for (int l = 0; l < w; l++) {
		LLVMValueRef li = LLVMConstInt(g->i32, (uint64_t)l, 0);
		LLVMValueRef ix = LLVMBuildExtractElement(g->b, iv, li, "");
		LLVMValueRef p = LLVMBuildGEP2(g->b, st, base, &ix, 1, "");
		LLVMValueRef s = LLVMBuildStore(
		    g->b, LLVMBuildExtractElement(g->b, sv, li, ""), p);
		LLVMSetAlignment(s, align);
	}
}

/* ---- scalar expressions ------------------------------------------------- */

static bool is_unsigned(kiln_dtype_t dt)
{
	return dt == KILN_DT_U8 || dt == KILN_DT_BOOL;
}

static LLVMValueRef emit_cast(gen_t *g, LLVMValueRef v, kiln_dtype_t from,
			      kiln_dtype_t to, int w)
{
	if (from == to)
		return v;
	LLVMTypeRef tt = cg_type(g, to, w);
	bool ff = kiln_dtype_is_float(from), tf = kiln_dtype_is_float(to);
	if (to == KILN_DT_BOOL) {
		if (ff)
			return LLVMBuildFCmp(g->b, LLVMRealUNE, v,
					     cg_const_f(g, 0, from, w), "");
		return LLVMBuildICmp(g->b, LLVMIntNE, v,
				     cg_const_i(g, 0, from, w), "");
	}
	if (ff && tf) {
		if (kiln_dtype_size(to) > kiln_dtype_size(from))
			return LLVMBuildFPExt(g->b, v, tt, "");
		return LLVMBuildFPTrunc(g->b, v, tt, "");
	}
	if (ff)
		return is_unsigned(to) ? LLVMBuildFPToUI(g->b, v, tt, "")
				       : LLVMBuildFPToSI(g->b, v, tt, "");
	if (tf)
		return is_unsigned(from) ? LLVMBuildUIToFP(g->b, v, tt, "")
					 : LLVMBuildSIToFP(g->b, v, tt, "");
	size_t fs = from == KILN_DT_BOOL ? 0 : kiln_dtype_size(from);
	size_t ts = kiln_dtype_size(to);
	if (ts > fs || from == KILN_DT_BOOL)
		return is_unsigned(from) ? LLVMBuildZExt(g->b, v, tt, "")
					 : LLVMBuildSExt(g->b, v, tt, "");
	if (ts < fs)
		return LLVMBuildTrunc(g->b, v, tt, "");
	return v;
}

static LLVMValueRef emit_narrow_round(gen_t *g, LLVMValueRef v,
				      kiln_dtype_t narrow, int w)
{
	if (narrow == KILN_DT_F16) {
		LLVMValueRef h =
		    LLVMBuildFPTrunc(g->b, v, cg_type(g, KILN_DT_F16, w), "");
		return LLVMBuildFPExt(g->b, h, cg_type(g, KILN_DT_F32, w), "");
	}
	return from_storage(g, to_bf16_bits(g, v, w), KILN_DT_BF16, w);
}

/* NaN-propagating max/min (torch.maximum): llvm.maximum does not select on
 * x86 in LLVM 16, so compare and select. */
static LLVMValueRef fmax_nan(gen_t *g, LLVMValueRef a, LLVMValueRef b,
			     bool is_max)
{
	LLVMValueRef gt =
	    LLVMBuildFCmp(g->b, is_max ? LLVMRealOGT : LLVMRealOLT, a, b, "");
	LLVMValueRef r = LLVMBuildSelect(g->b, gt, a, b, "");
	LLVMValueRef an = LLVMBuildFCmp(g->b, LLVMRealUNO, a, a, "");
	return LLVMBuildSelect(g->b, an, a, r, "");
}

static LLVMValueRef emit_unary(gen_t *g, const sx_t *e, LLVMValueRef x)
{
	kiln_dtype_t dt = (kiln_dtype_t)e->a->dt;
	int w = g->W;
	bool fl = kiln_dtype_is_float(dt);
	LLVMTypeRef t = LLVMTypeOf(x);
	switch ((sx_op_t)e->op) {
	case OP_NEG:
		return fl ? LLVMBuildFNeg(g->b, x, "")
			  : LLVMBuildNeg(g->b, x, "");
	case OP_ABS:
		if (fl)
			return cg_intr(g, "llvm.fabs", &t, 1, &x, 1);
		if (is_unsigned(dt))
			return x;
		{
			LLVMValueRef args[2] = {x, LLVMConstInt(g->i1, 0, 0)};
			return cg_intr(g, "llvm.abs", &t, 1, args, 2);
		}
	case OP_SQRT: return cg_intr(g, "llvm.sqrt", &t, 1, &x, 1);
	case OP_RSQRT:
		return LLVMBuildFDiv(g->b, cg_const_f(g, 1, dt, w),
				     cg_intr(g, "llvm.sqrt", &t, 1, &x, 1), "");
	case OP_RECIP:
		return LLVMBuildFDiv(g->b, cg_const_f(g, 1, dt, w), x, "");
	case OP_FLOOR: return cg_intr(g, "llvm.floor", &t, 1, &x, 1);
	case OP_CEIL: return cg_intr(g, "llvm.ceil", &t, 1, &x, 1);
	case OP_TRUNC: return cg_intr(g, "llvm.trunc", &t, 1, &x, 1);
	case OP_ROUND: return cg_intr(g, "llvm.roundeven", &t, 1, &x, 1);
	case OP_SIGN: {
		if (!fl) {
			LLVMValueRef z = cg_const_i(g, 0, dt, w);
			LLVMValueRef gt = LLVMBuildZExt(
			    g->b, LLVMBuildICmp(g->b, LLVMIntSGT, x, z, ""), t,
			    "");
			LLVMValueRef lt = LLVMBuildZExt(
			    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, x, z, ""), t,
			    "");
			return LLVMBuildSub(g->b, gt, lt, "");
		}
		LLVMValueRef z = cg_const_f(g, 0, dt, w);
		LLVMValueRef pos = LLVMBuildFCmp(g->b, LLVMRealOGT, x, z, "");
		LLVMValueRef neg = LLVMBuildFCmp(g->b, LLVMRealOLT, x, z, "");
		LLVMValueRef r =
		    LLVMBuildSelect(g->b, neg, cg_const_f(g, -1, dt, w), z, "");
		r = LLVMBuildSelect(g->b, pos, cg_const_f(g, 1, dt, w), r, "");
		LLVMValueRef nan = LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, "");
		return LLVMBuildSelect(g->b, nan, x, r, "");
	}
	case OP_NOT: return LLVMBuildNot(g->b, x, "");
	case OP_BITNOT: return LLVMBuildNot(g->b, x, "");
	case OP_ISNAN: return LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, "");
	default: return cg_math(g, (sx_op_t)e->op, x, NULL, dt, w);
	}
}

static LLVMValueRef emit_binary(gen_t *g, const sx_t *e, LLVMValueRef a,
				LLVMValueRef b)
{
	kiln_dtype_t dt = (kiln_dtype_t)e->a->dt;
	int w = g->W;
	bool fl = kiln_dtype_is_float(dt);
	bool us = is_unsigned(dt);
	switch ((sx_op_t)e->op) {
	case OP_ADD:
		return fl ? LLVMBuildFAdd(g->b, a, b, "")
			  : (dt == KILN_DT_BOOL ? LLVMBuildOr(g->b, a, b, "")
						: LLVMBuildAdd(g->b, a, b, ""));
	case OP_SUB:
		return fl ? LLVMBuildFSub(g->b, a, b, "")
			  : LLVMBuildSub(g->b, a, b, "");
	case OP_MUL:
		return fl ? LLVMBuildFMul(g->b, a, b, "")
			  : (dt == KILN_DT_BOOL ? LLVMBuildAnd(g->b, a, b, "")
						: LLVMBuildMul(g->b, a, b, ""));
	case OP_DIV:
		return fl ? LLVMBuildFDiv(g->b, a, b, "") : ifloordiv(g, a, b);
	case OP_FLOORDIV:
		if (fl) {
			LLVMValueRef q = LLVMBuildFDiv(g->b, a, b, "");
			LLVMTypeRef t = LLVMTypeOf(q);
			return cg_intr(g, "llvm.floor", &t, 1, &q, 1);
		}
		return ifloordiv(g, a, b);
	case OP_TRUNCDIV: {
		LLVMValueRef z = cg_const_i(g, 0, dt, w);
		LLVMValueRef bz = LLVMBuildICmp(g->b, LLVMIntEQ, b, z, "");
		LLVMValueRef bs =
		    LLVMBuildSelect(g->b, bz, cg_const_i(g, 1, dt, w), b, "");
		LLVMValueRef q = us ? LLVMBuildUDiv(g->b, a, bs, "")
				    : LLVMBuildSDiv(g->b, a, bs, "");
		return LLVMBuildSelect(g->b, bz, z, q, "");
	}
	case OP_REM:
		if (fl) {
			/* Python remainder: sign of the divisor */
			LLVMValueRef r = LLVMBuildFRem(g->b, a, b, "");
			LLVMValueRef z = cg_const_f(g, 0, dt, w);
			LLVMValueRef rnz =
			    LLVMBuildFCmp(g->b, LLVMRealONE, r, z, "");
			LLVMValueRef diff = LLVMBuildXor(
			    g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, r, z, ""),
			    LLVMBuildFCmp(g->b, LLVMRealOLT, b, z, ""), "");
			return LLVMBuildSelect(
			    g->b, LLVMBuildAnd(g->b, rnz, diff, ""),
			    LLVMBuildFAdd(g->b, r, b, ""), r, "");
		}
		return imod(g, a, b);
	case OP_FMOD:
		if (fl)
			return LLVMBuildFRem(g->b, a, b, "");
		{
			LLVMValueRef z = cg_const_i(g, 0, dt, w);
			LLVMValueRef bz =
			    LLVMBuildICmp(g->b, LLVMIntEQ, b, z, "");
			LLVMValueRef bs = LLVMBuildSelect(
			    g->b, bz, cg_const_i(g, 1, dt, w), b, "");
			return LLVMBuildSelect(
			    g->b, bz, z, LLVMBuildSRem(g->b, a, bs, ""), "");
		}
	case OP_EXPSUB: return cg_math(g, OP_EXPSUB, a, b, dt, w);
	case OP_POW:
	case OP_ATAN2:
		if (fl)
			return cg_math(g, (sx_op_t)e->op, a, b, dt, w);
		{
			/* integer power by squaring (exponent >= 0) */
			LLVMValueRef fa = emit_cast(g, a, dt, KILN_DT_F64, w);
			LLVMValueRef fb = emit_cast(g, b, dt, KILN_DT_F64, w);
			LLVMValueRef r =
			    cg_math(g, OP_POW, fa, fb, KILN_DT_F64, w);
			LLVMTypeRef t = LLVMTypeOf(r);
			r = cg_intr(g, "llvm.round", &t, 1, &r, 1);
			return emit_cast(g, r, KILN_DT_F64, dt, w);
		}
	case OP_MAX:
	case OP_MIN: {
		bool mx = e->op == OP_MAX;
		if (fl)
			return fmax_nan(g, a, b, mx);
		LLVMIntPredicate p = mx ? (us ? LLVMIntUGT : LLVMIntSGT)
					: (us ? LLVMIntULT : LLVMIntSLT);
		return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, p, a, b, ""),
				       a, b, "");
	}
	case OP_EQ:
	case OP_NE:
	case OP_LT:
	case OP_LE:
	case OP_GT:
	case OP_GE: {
		static const LLVMRealPredicate fp[] = {
		    LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT,
		    LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
		static const LLVMIntPredicate sp[] = {LLVMIntEQ,  LLVMIntNE,
						      LLVMIntSLT, LLVMIntSLE,
						      LLVMIntSGT, LLVMIntSGE};
		static const LLVMIntPredicate up[] = {LLVMIntEQ,  LLVMIntNE,
						      LLVMIntULT, LLVMIntULE,
						      LLVMIntUGT, LLVMIntUGE};
		int i = e->op - OP_EQ;
		if (fl)
			return LLVMBuildFCmp(g->b, fp[i], a, b, "");
		return LLVMBuildICmp(g->b, us ? up[i] : sp[i], a, b, "");
	}
	case OP_AND:
	case OP_BITAND: return LLVMBuildAnd(g->b, a, b, "");
	case OP_OR:
	case OP_BITOR: return LLVMBuildOr(g->b, a, b, "");
	case OP_XOR:
	case OP_BITXOR: return LLVMBuildXor(g->b, a, b, "");
	case OP_SHL: return LLVMBuildShl(g->b, a, b, "");
	case OP_SHR:
		return us ? LLVMBuildLShr(g->b, a, b, "")
			  : LLVMBuildAShr(g->b, a, b, "");
	default: return a;
	}
}

static LLVMValueRef emit_sx(gen_t *g, const sx_t *e)
{
	LLVMValueRef v = memo_get(g, e);
	if (v != NULL)
		return v;
	int w = g->W;
	for (uint32_t i = 0; i < g->n_hoist; i++) {
		if (g->hoist_e[i] != e)
			continue;
		if (g->hoist_w[i] == w)
			return g->hoist_v[i];
		if (g->hoist_w[i] == 1) {
			v = cg_splat(g, g->hoist_v[i], w);
			memo_put(g, e, v);
			return v;
		}
		break;
	}
	switch ((sx_kind_t)e->kind) {
	case SX_CONST:
		v = cconst(g, e->k.f, e->k.i, (kiln_dtype_t)e->dt, w);
		break;
	case SX_LOAD: v = emit_load(g, e); break;
	case SX_INDEX: v = emit_ix_w(g, e->idx, w); break;
	case SX_UN: v = emit_unary(g, e, emit_sx(g, e->a)); break;
	case SX_BIN: {
		LLVMValueRef a = emit_sx(g, e->a);
		LLVMValueRef b = emit_sx(g, e->b);
		v = emit_binary(g, e, a, b);
		break;
	}
	case SX_WHERE: {
		LLVMValueRef cnd = emit_sx(g, e->a);
		LLVMValueRef a = emit_sx(g, e->b);
		LLVMValueRef b = emit_sx(g, e->c);
		v = LLVMBuildSelect(g->b, cnd, a, b, "");
		break;
	}
	case SX_CAST: {
		LLVMValueRef a = emit_sx(g, e->a);
		if (e->op == KILN_DT_F16 || e->op == KILN_DT_BF16) {
			a = emit_cast(g, a, (kiln_dtype_t)e->a->dt, KILN_DT_F32,
				      w);
			v = emit_narrow_round(g, a, (kiln_dtype_t)e->op, w);
		} else {
			v = emit_cast(g, a, (kiln_dtype_t)e->a->dt,
				      (kiln_dtype_t)e->dt, w);
		}
		break;
	}
	}
	memo_put(g, e, v);
	return v;
}

/* ---- loops --------------------------------------------------------------- */

typedef struct loop {
	LLVMValueRef iv; /* alloca */
	LLVMValueRef i;	 /* current value in the body */
	LLVMBasicBlockRef cond, body, exit;
	LLVMValueRef step;
} loop_t;

static LLVMValueRef entry_alloca(gen_t *g, LLVMTypeRef t)
{
	LLVMBasicBlockRef cur = LLVMGetInsertBlock(g->b);
	LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(g->fn);
	LLVMValueRef first = LLVMGetFirstInstruction(entry);
	if (first != NULL)
		LLVMPositionBuilderBefore(g->b, first);
	else
		LLVMPositionBuilderAtEnd(g->b, entry);
	LLVMValueRef a = LLVMBuildAlloca(g->b, t, "");
	LLVMPositionBuilderAtEnd(g->b, cur);
	return a;
}

/* for (i = lo; i + span <= hi; i += step) — span is step for a vector
 * main loop, 1 for a scalar one. */
static void loop_begin(gen_t *g, loop_t *L, LLVMValueRef lo, LLVMValueRef hi,
		       int64_t step)
{
	L->iv = entry_alloca(g, g->i64);
	LLVMBuildStore(g->b, lo, L->iv);
	L->cond = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "cond");
	L->body = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "body");
	L->exit = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "exit");
	L->step = LLVMConstInt(g->i64, (uint64_t)step, 0);
	LLVMBuildBr(g->b, L->cond);
	LLVMPositionBuilderAtEnd(g->b, L->cond);
	LLVMValueRef i = LLVMBuildLoad2(g->b, g->i64, L->iv, "i");
	LLVMValueRef last = LLVMBuildAdd(g->b, i, L->step, "");
	LLVMValueRef ok = LLVMBuildICmp(g->b, LLVMIntSLE, last, hi, "");
	LLVMBuildCondBr(g->b, ok, L->body, L->exit);
	LLVMPositionBuilderAtEnd(g->b, L->body);
	L->i = i;
	memo_clear(g);
}

/* Returns the back edge (a branch to the condition). */
static LLVMValueRef loop_end(gen_t *g, loop_t *L)
{
	LLVMValueRef n = LLVMBuildAdd(g->b, L->i, L->step, "");
	LLVMBuildStore(g->b, n, L->iv);
	LLVMValueRef br = LLVMBuildBr(g->b, L->cond);
	LLVMPositionBuilderAtEnd(g->b, L->exit);
	memo_clear(g);
	return br;
}

/* loop_end for a loop whose body codegen has unrolled already: its back
 * edge carries llvm.loop.unroll.disable (in a loop ID of its own, which
 * LLVM wants self-referential), so that O3 does not unroll it again. */
static void loop_end_unrolled(gen_t *g, loop_t *L)
{
	LLVMValueRef br = loop_end(g, L);
	static const char dis[] = "llvm.loop.unroll.disable";
	LLVMMetadataRef ds =
	    LLVMMDStringInContext2(g->ctx, dis, sizeof(dis) - 1);
	LLVMMetadataRef tmp = LLVMTemporaryMDNode(g->ctx, NULL, 0);
	LLVMMetadataRef ops[2] = {tmp, LLVMMDNodeInContext2(g->ctx, &ds, 1)};
	LLVMMetadataRef id = LLVMMDNodeInContext2(g->ctx, ops, 2);
	LLVMMetadataReplaceAllUsesWith(tmp, id);
	LLVMSetMetadata(br, LLVMGetMDKindIDInContext(g->ctx, "llvm.loop", 9),
			LLVMMetadataAsValue(g->ctx, id));
}

static LLVMValueRef K64(gen_t *g, int64_t v)
{
	return LLVMConstInt(g->i64, (uint64_t)v, 1);
}

/* ceil(x / d) for x >= 0 and a constant d > 0 */
static LLVMValueRef udiv_up(gen_t *g, LLVMValueRef x, int64_t d)
{
	return LLVMBuildUDiv(
	    g->b,
	    LLVMBuildAdd(g->b, x, LLVMConstInt(g->i64, (uint64_t)d - 1, 0), ""),
	    LLVMConstInt(g->i64, (uint64_t)d, 0), "");
}

/* ---- reductions ---------------------------------------------------------- */

#define RED_UNROLL 4 /* independent accumulators in vector reduce loops */
/* ... and in a pass whose body has a transcendental (exp, erf, ...) on a
 * target with 16 vector registers (AVX2): its body's
 * constants and temporaries, four copies of them at once, spilled: the
 * exp pass of softmax over rows of 1024 took 31 instructions and 8.5
 * cycles a vector with four (llvm-mca -mcpu=znver3), 26.5 and 7.3 with
 * two, and ran 1.1-1.4x faster at 4 MB (bench_kernels --threads 2, four
 * rounds interleaved). With two the adds into each accumulator are still
 * far apart next to the body's own latency. */
#define RED_UNROLL_HEAVY 2
/* rows shorter than this are not prefetched (gen_iteration) */
#define PF_MIN_ROW_BYTES 1024

typedef struct racc {
	LLVMValueRef v, i; /* allocas: value and index accumulators */
	LLVMValueRef uv[RED_UNROLL], ui[RED_UNROLL]; /* uv[0] = v */
	LLVMValueRef sv, si; /* scalar (tail) accumulators */
	int w;		     /* width of v/i */
	int nu;		     /* slots of uv/ui the loop updates */
	kiln_dtype_t dt;     /* compute dtype */
	red_op_t op;
} racc_t;

static LLVMValueRef red_identity(gen_t *g, red_op_t op, kiln_dtype_t dt, int w)
{
	bool fl = kiln_dtype_is_float(dt);
	switch (op) {
	case RED_SUM:
	case RED_ANY: return cconst(g, 0, 0, dt, w);
	case RED_PROD:
	case RED_ALL: return cconst(g, 1, 1, dt, w);
	case RED_MAX:
	case RED_MAXNP:
	case RED_ARGMAX:
		if (fl)
			return cg_const_f(g, -INFINITY, dt, w);
		return cg_const_i(g,
				  dt == KILN_DT_U8    ? 0
				  : dt == KILN_DT_I8  ? INT8_MIN
				  : dt == KILN_DT_I16 ? INT16_MIN
				  : dt == KILN_DT_I32 ? INT32_MIN
						      : INT64_MIN,
				  dt, w);
	case RED_MIN:
	case RED_ARGMIN:
		if (fl)
			return cg_const_f(g, INFINITY, dt, w);
		return cg_const_i(g,
				  dt == KILN_DT_U8    ? 255
				  : dt == KILN_DT_I8  ? INT8_MAX
				  : dt == KILN_DT_I16 ? INT16_MAX
				  : dt == KILN_DT_I32 ? INT32_MAX
						      : INT64_MAX,
				  dt, w);
	default: return cconst(g, 0, 0, dt, w);
	}
}

/* Whether x should replace acc for an arg-reduction (first occurrence;
 * NaN wins, like torch). */
static LLVMValueRef arg_take(gen_t *g, red_op_t op, kiln_dtype_t dt,
			     LLVMValueRef x, LLVMValueRef acc)
{
	if (!kiln_dtype_is_float(dt)) {
		bool us = is_unsigned(dt);
		LLVMIntPredicate p = op == RED_ARGMAX
					 ? (us ? LLVMIntUGT : LLVMIntSGT)
					 : (us ? LLVMIntULT : LLVMIntSLT);
		return LLVMBuildICmp(g->b, p, x, acc, "");
	}
	LLVMValueRef better = LLVMBuildFCmp(
	    g->b, op == RED_ARGMAX ? LLVMRealOGT : LLVMRealOLT, x, acc, "");
	LLVMValueRef xnan = LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, "");
	LLVMValueRef anan = LLVMBuildFCmp(g->b, LLVMRealUNO, acc, acc, "");
	return LLVMBuildOr(
	    g->b, better,
	    LLVMBuildAnd(g->b, xnan, LLVMBuildNot(g->b, anan, ""), ""), "");
}

static LLVMValueRef red_combine(gen_t *g, red_op_t op, kiln_dtype_t dt,
				LLVMValueRef acc, LLVMValueRef x)
{
	bool fl = kiln_dtype_is_float(dt);
	if (op == RED_MAXNP && !fl) /* ints have no NaN: the plain max */
		op = RED_MAX;
	switch (op) {
	case RED_SUM:
		return fl ? LLVMBuildFAdd(g->b, acc, x, "")
			  : LLVMBuildAdd(g->b, acc, x, "");
	case RED_PROD:
		return fl ? LLVMBuildFMul(g->b, acc, x, "")
			  : LLVMBuildMul(g->b, acc, x, "");
	case RED_MAX:
	case RED_MIN:
		if (fl)
			return fmax_nan(g, acc, x, op == RED_MAX);
		{
			bool us = is_unsigned(dt);
			LLVMIntPredicate p =
			    op == RED_MAX ? (us ? LLVMIntUGT : LLVMIntSGT)
					  : (us ? LLVMIntULT : LLVMIntSLT);
			return LLVMBuildSelect(
			    g->b, LLVMBuildICmp(g->b, p, x, acc, ""), x, acc,
			    "");
		}
	case RED_MAXNP: /* x86 maxps: x wins where either is NaN */
		return LLVMBuildSelect(
		    g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, acc, x, ""), acc, x,
		    "");
	case RED_ANY: return LLVMBuildOr(g->b, acc, x, "");
	case RED_ALL: return LLVMBuildAnd(g->b, acc, x, "");
	default: return acc;
	}
}

static void racc_init(gen_t *g, racc_t *r, red_op_t op, kiln_dtype_t dt, int w)
{
	r->op = op;
	r->dt = dt;
	r->w = w;
	r->nu = g->red_unroll;
	bool arg = op == RED_ARGMAX || op == RED_ARGMIN;
	for (int u = 0; u < RED_UNROLL; u++) {
		r->uv[u] = entry_alloca(g, cg_type(g, dt, w));
		LLVMBuildStore(g->b, red_identity(g, op, dt, w), r->uv[u]);
		r->ui[u] = NULL;
	}
	r->v = r->uv[0];
	r->sv = entry_alloca(g, cg_type(g, dt, 1));
	LLVMBuildStore(g->b, red_identity(g, op, dt, 1), r->sv);
	r->i = r->si = NULL;
	if (arg) {
		for (int u = 0; u < RED_UNROLL; u++) {
			r->ui[u] = entry_alloca(g, cg_type(g, KILN_DT_I64, w));
			LLVMBuildStore(g->b, cg_const_i(g, 0, KILN_DT_I64, w),
				       r->ui[u]);
		}
		r->i = r->ui[0];
		r->si = entry_alloca(g, g->i64);
		LLVMBuildStore(g->b, LLVMConstInt(g->i64, 0, 0), r->si);
	}
}

/* acc ⊕= x at width w (w == r->w: the vector accumulator; 1: the scalar
 * one); ridx is the reduce index (width w) for arg reductions. */
static void racc_update(gen_t *g, racc_t *r, LLVMValueRef x, LLVMValueRef ridx,
			int w)
{
	LLVMValueRef av = w == r->w ? r->uv[g->slot] : r->sv;
	LLVMValueRef ai = w == r->w ? r->ui[g->slot] : r->si;
	LLVMTypeRef t = cg_type(g, r->dt, w);
	LLVMValueRef acc = LLVMBuildLoad2(g->b, t, av, "");
	if (r->op == RED_ARGMAX || r->op == RED_ARGMIN) {
		LLVMValueRef take = arg_take(g, r->op, r->dt, x, acc);
		LLVMBuildStore(g->b, LLVMBuildSelect(g->b, take, x, acc, ""),
			       av);
		LLVMValueRef ia =
		    LLVMBuildLoad2(g->b, cg_type(g, KILN_DT_I64, w), ai, "");
		LLVMBuildStore(g->b, LLVMBuildSelect(g->b, take, ridx, ia, ""),
			       ai);
		return;
	}
	LLVMBuildStore(g->b, red_combine(g, r->op, r->dt, acc, x), av);
}

/* Folds accumulator slot b into slot a (vectors, fixed order). */
static void racc_merge(gen_t *g, racc_t *r, int a, int b)
{
	LLVMTypeRef t = cg_type(g, r->dt, r->w);
	LLVMValueRef va = LLVMBuildLoad2(g->b, t, r->uv[a], "");
	LLVMValueRef vb = LLVMBuildLoad2(g->b, t, r->uv[b], "");
	if (r->op != RED_ARGMAX && r->op != RED_ARGMIN) {
		LLVMBuildStore(g->b, red_combine(g, r->op, r->dt, va, vb),
			       r->uv[a]);
		return;
	}
	LLVMTypeRef it = cg_type(g, KILN_DT_I64, r->w);
	LLVMValueRef ia = LLVMBuildLoad2(g->b, it, r->ui[a], "");
	LLVMValueRef ib = LLVMBuildLoad2(g->b, it, r->ui[b], "");
	LLVMValueRef take = arg_take(g, r->op, r->dt, vb, va);
	LLVMValueRef eq =
	    kiln_dtype_is_float(r->dt)
		? LLVMBuildOr(
		      g->b, LLVMBuildFCmp(g->b, LLVMRealOEQ, va, vb, ""),
		      LLVMBuildAnd(
			  g->b, LLVMBuildFCmp(g->b, LLVMRealUNO, va, va, ""),
			  LLVMBuildFCmp(g->b, LLVMRealUNO, vb, vb, ""), ""),
		      "")
		: LLVMBuildICmp(g->b, LLVMIntEQ, va, vb, "");
	take = LLVMBuildOr(
	    g->b, take,
	    LLVMBuildAnd(g->b, eq, LLVMBuildICmp(g->b, LLVMIntSLT, ib, ia, ""),
			 ""),
	    "");
	LLVMBuildStore(g->b, LLVMBuildSelect(g->b, take, vb, va, ""), r->uv[a]);
	LLVMBuildStore(g->b, LLVMBuildSelect(g->b, take, ib, ia, ""), r->ui[a]);
}

/* Combines the lanes of the vector accumulator and the scalar tail
 * accumulator into one scalar (inner-vectorized rows). Pairwise, so the
 * order is fixed. */
static void racc_final_scalar(gen_t *g, racc_t *r, LLVMValueRef *val,
			      LLVMValueRef *idx)
{
	int w = r->w;
	LLVMValueRef vals[64], ids[64];
	/* the slots the loop did not update hold the identity: merged in,
	 * an arg-reduction's would tie at index 0 */
	if (w > 1 && r->nu == 4) {
		racc_merge(g, r, 0, 1);
		racc_merge(g, r, 2, 3);
		racc_merge(g, r, 0, 2);
	} else if (w > 1 && r->nu == 2) {
		racc_merge(g, r, 0, 1);
	}
	LLVMValueRef vv = LLVMBuildLoad2(g->b, cg_type(g, r->dt, w), r->v, "");
	LLVMValueRef vi =
	    r->i ? LLVMBuildLoad2(g->b, cg_type(g, KILN_DT_I64, w), r->i, "")
		 : NULL;
	if (w == 1) {
		vals[0] = vv;
		ids[0] = vi;
	} else {
		for (int l = 0; l < w; l++) {
			LLVMValueRef li = LLVMConstInt(g->i32, (uint64_t)l, 0);
			vals[l] = LLVMBuildExtractElement(g->b, vv, li, "");
			ids[l] = vi ? LLVMBuildExtractElement(g->b, vi, li, "")
				    : NULL;
		}
	}
	int n = w;
	bool arg = r->op == RED_ARGMAX || r->op == RED_ARGMIN;
	while (n > 1) {
		int h = n / 2;
		for (int l = 0; l < h; l++) {
			LLVMValueRef a = vals[l], b = vals[l + h];
			if (arg) {
				/* b wins if strictly better, or equal with a
				 * smaller index */
				LLVMValueRef take =
				    arg_take(g, r->op, r->dt, b, a);
				LLVMValueRef eq =
				    kiln_dtype_is_float(r->dt)
					? LLVMBuildFCmp(g->b, LLVMRealOEQ, a, b,
							"")
					: LLVMBuildICmp(g->b, LLVMIntEQ, a, b,
							"");
				LLVMValueRef bothnan =
				    kiln_dtype_is_float(r->dt)
					? LLVMBuildAnd(
					      g->b,
					      LLVMBuildFCmp(g->b, LLVMRealUNO,
							    a, a, ""),
					      LLVMBuildFCmp(g->b, LLVMRealUNO,
							    b, b, ""),
					      "")
					: LLVMConstInt(g->i1, 0, 0);
				LLVMValueRef smaller = LLVMBuildICmp(
				    g->b, LLVMIntSLT, ids[l + h], ids[l], "");
				take = LLVMBuildOr(
				    g->b, take,
				    LLVMBuildAnd(
					g->b,
					LLVMBuildOr(g->b, eq, bothnan, ""),
					smaller, ""),
				    "");
				vals[l] = LLVMBuildSelect(g->b, take, b, a, "");
				ids[l] = LLVMBuildSelect(g->b, take, ids[l + h],
							 ids[l], "");
			} else {
				vals[l] = red_combine(g, r->op, r->dt, a, b);
			}
		}
		if (n % 2) {
			vals[h] = vals[n - 1];
			ids[h] = ids[n - 1];
			n = h + 1;
		} else {
			n = h;
		}
	}
	/* the scalar tail accumulator covers later indices */
	LLVMValueRef sv = LLVMBuildLoad2(g->b, cg_type(g, r->dt, 1), r->sv, "");
	if (arg) {
		LLVMValueRef si = LLVMBuildLoad2(g->b, g->i64, r->si, "");
		LLVMValueRef take = arg_take(g, r->op, r->dt, sv, vals[0]);
		*val = LLVMBuildSelect(g->b, take, sv, vals[0], "");
		*idx = LLVMBuildSelect(g->b, take, si, ids[0], "");
	} else {
		*val = red_combine(g, r->op, r->dt, vals[0], sv);
		*idx = NULL;
	}
}

/* ---- kernel bodies ------------------------------------------------------ */

static const cnode_t *mnode(gen_t *g, uint32_t i)
{
	return &g->c->nodes[g->k->members[i].node];
}

static bool stored(gen_t *g, uint32_t i)
{
	const cbuf_t *b = &g->c->bufs[mnode(g, i)->buf];
	return b->in_memory || b->is_output;
}

/* Index of the reduce linear position (row-major over the reduced dims). */
static const kiln_expr_t *reduce_linear(gen_t *g)
{
	cctx_t *c = g->c;
	const kernel_t *k = g->k;
	const kiln_expr_t *e = ix_const(c, 0);
	for (uint32_t i = 0; i < k->frank; i++)
		if (k->rmask >> i & 1)
			e = ix_add(c, ix_mul(c, e, ix_dim(c, k->fsizes[i])),
				   ix_var(c, i));
	return e;
}

/* Prefetches of the next row: for each load of e from memory (a buffer
 * this kernel does not compute, at unit stride along the vectorized var),
 * the same element one row on (its coefficient of g->pf_var), into L1,
 * in the slots that start a 64-byte line of it. Up to *n distinct loads,
 * listed in seen. */
static void prefetch_loads(gen_t *g, const sx_t *e, const sx_t **seen, int *n,
			   int depth)
{
	if (e == NULL || depth > 64 || *n >= 8)
		return;
	if (e->kind == SX_LOAD) {
		for (int i = 0; i < *n; i++)
			if (seen[i] == e)
				return;
		seen[(*n)++] = e;
		const cctx_t *c = g->c;
		const cbuf_t *b = &c->bufs[e->buf];
		int64_t cv = 0, cr = 0;
		if (e->b != NULL || b->row_local ||
		    (b->kind == CB_TEMP &&
		     b->kernel == (int32_t)(g->k - c->kernels)) ||
		    !ix_coef(e->idx, (uint32_t)g->vvar, &cv) || cv != 1 ||
		    !ix_coef(e->idx, (uint32_t)g->pf_var, &cr) ||
		    cr * kiln_dtype_size(b->dtype) < PF_MIN_ROW_BYTES ||
		    (g->slot * g->W * kiln_dtype_size(b->dtype)) % 64 != 0)
			return;
		LLVMTypeRef st = storage_type(g, b->dtype, 1);
		LLVMValueRef idx =
		    LLVMBuildAdd(g->b, emit_ix(g, e->idx),
				 LLVMConstInt(g->i64, (uint64_t)cr, 0), "");
		LLVMValueRef ptr =
		    LLVMBuildGEP2(g->b, st, buf_ptr(g, e->buf), &idx, 1, "");
		LLVMTypeRef pt = g->ptr;
		LLVMValueRef args[4] = {ptr, LLVMConstInt(g->i32, 0, 0),
					LLVMConstInt(g->i32, 3, 0),
					LLVMConstInt(g->i32, 1, 0)};
		cg_intr(g, "llvm.prefetch", &pt, 1, args, 4);
		return;
	}
	prefetch_loads(g, e->a, seen, n, depth + 1);
	prefetch_loads(g, e->b, seen, n, depth + 1);
	prefetch_loads(g, e->c, seen, n, depth + 1);
}

/* Member i's value v at the current point of the tile var into its store
 * tile (tiles). */
static void tile_put(gen_t *g, uint32_t i, LLVMValueRef v, int w)
{
	const cbuf_t *b = &g->c->bufs[mnode(g, i)->buf];
	LLVMTypeRef at = LLVMArrayType(storage_type(g, b->dtype, w), CIR_TBLK);
	LLVMValueRef ix[2] = {K64(g, 0), g->var[g->tile_var]};
	LLVMValueRef s =
	    LLVMBuildStore(g->b, to_storage(g, v, b->dtype, w),
			   LLVMBuildGEP2(g->b, at, g->tst_mem[i], ix, 2, ""));
	LLVMSetAlignment(s, 4);
}

static void gen_iteration_at(gen_t *g, int32_t p, racc_t *acc, int w);

/* One iteration of pass p at width w; in a rotated wavefront kernel
 * (rot_var), at column (j + p·rot_step) mod rot_cols for the loop's j
 * (rot_cols a power of two: an add and an and; the select a wrap at
 * another length takes made LLVM compute the indices in vector registers
 * and cost more than the aliasing it avoids). */
static void gen_iteration(gen_t *g, int32_t p, racc_t *acc, int w)
{
	if (g->rot_var < 0 || p <= 0) {
		gen_iteration_at(g, p, acc, w);
		return;
	}
	LLVMValueRef j = g->var[g->rot_var];
	LLVMValueRef r = LLVMBuildAnd(
	    g->b, LLVMBuildAdd(g->b, j, K64(g, p * g->rot_step), ""),
	    K64(g, g->rot_cols - 1), "");
	memo_clear(g);
	g->var[g->rot_var] = r;
	gen_iteration_at(g, p, acc, w);
	g->var[g->rot_var] = j;
	memo_clear(g);
}

/* The body of one loop iteration at width w for the members of pass p. */
static void gen_iteration_at(gen_t *g, int32_t p, racc_t *acc, int w)
{
	g->W = w;
	const kernel_t *k = g->k;
	const kiln_expr_t *rl = NULL;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass != p || m->role == ROLE_ROW)
			continue;
		LLVMValueRef v = emit_sx(g, m->body);
		if (m->role == ROLE_FULL) {
			g->mval[i] = v;
			g->mval_width[i] = w;
			const cbuf_t *mb = &g->c->bufs[mnode(g, i)->buf];
			if (mb->row_local) {
				kiln_dtype_t cdt = compute_dtype(mb->dtype);
				LLVMValueRef sv =
				    cdt == KILN_DT_BOOL
					? LLVMBuildZExt(
					      g->b, v,
					      cg_type(g, KILN_DT_I8, w), "")
					: v;
				LLVMTypeRef et = cg_scalar_type(
				    g, cdt == KILN_DT_BOOL ? KILN_DT_I8 : cdt);
				LLVMValueRef p =
				    mb->row_out != 0
					? row_out_ptr(g, mb)
					: LLVMBuildGEP2(
					      g->b, et,
					      scratch_ptr(g, mnode(g, i)->buf),
					      (LLVMValueRef[]){
						  emit_ix(g, reduce_linear(g))},
					      1, "");
				LLVMValueRef st = LLVMBuildStore(g->b, sv, p);
				LLVMSetAlignment(
				    st, (unsigned)kiln_dtype_size(cdt));
			} else if (g->tst_mem[i] != NULL) {
				tile_put(g, i, v, w);
			} else if (stored(g, i)) {
				emit_store(g, mnode(g, i)->buf, m->sidx, v, w);
			}
			continue;
		}
		const cnode_t *n = mnode(g, i);
		LLVMValueRef ridx = NULL;
		if (n->red == RED_ARGMAX || n->red == RED_ARGMIN) {
			if (rl == NULL)
				rl = reduce_linear(g);
			ridx = emit_ix_w(g, rl, w);
		}
		racc_update(g, &acc[i], v, ridx, w);
	}
	/* one prefetch per 64-byte line of the row (prefetch_loads) */
	if (g->pf_on && w == g->c->vec_width) {
		const sx_t *seen[8];
		int n = 0;
		for (uint32_t i = 0; i < k->n_members; i++)
			if (k->members[i].pass == p &&
			    k->members[i].role != ROLE_ROW)
				prefetch_loads(g, k->members[i].body, seen, &n,
					       0);
	}
}

static void clear_full_vals(gen_t *g)
{
	for (uint32_t i = 0; i < g->k->n_members; i++)
		if (g->k->members[i].role == ROLE_FULL)
			g->mval[i] = NULL;
}

/* A partial vector block of hw elements in [*from, end): branches to a new
 * block, where the caller emits the hw-wide unit starting at the returned
 * index, when at least hw are left, and advances *from past them; *rest
 * is where both paths meet (part_end). */
static LLVMValueRef part_begin(gen_t *g, LLVMValueRef *from, LLVMValueRef end,
			       int hw, LLVMBasicBlockRef *rest)
{
	LLVMValueRef j0 = *from;
	LLVMValueRef j1 =
	    LLVMBuildAdd(g->b, j0, LLVMConstInt(g->i64, (uint64_t)hw, 0), "");
	LLVMValueRef fits = LLVMBuildICmp(g->b, LLVMIntSLE, j1, end, "");
	LLVMBasicBlockRef bh =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "part");
	*rest = LLVMAppendBasicBlockInContext(g->ctx, g->fn, "rest");
	*from = LLVMBuildSelect(g->b, fits, j1, j0, "");
	LLVMBuildCondBr(g->b, fits, bh, *rest);
	LLVMPositionBuilderAtEnd(g->b, bh);
	memo_clear(g);
	return j0;
}

static void part_end(gen_t *g, LLVMBasicBlockRef rest)
{
	LLVMBuildBr(g->b, rest);
	LLVMPositionBuilderAtEnd(g->b, rest);
	memo_clear(g);
}

/* ---- tiles: transposes in registers ---------------------------------------
 *
 * A tiled pointwise kernel (sched.c block_transposes) runs [..., d/16, ...,
 * 16, last] with the 16 (the tile var) inside a unit: an access that is
 * contiguous along d and strided along the last dim (a channels-last
 * tensor read or written in NCHW order) would be a gather of w lanes a
 * vector (16-29 cycles on a Zen 5) or w scalar stores. Instead, for each
 * vector of w lanes along the last dim, such a load reads w vectors of 16
 * elements contiguous along d (one a lane) and transposes them in
 * registers into 16 vectors of w lanes, which the loop over the tile var
 * reads from a tile on the stack; such a store writes into a tile,
 * transposed after that loop into w vectors of 16 stored contiguously.
 * The same values in the same order of operations: only the memory
 * accesses move. Narrower parts than 4 lanes and the scalar rest run the
 * loop over the tile var as it was (scalar accesses). */

/* The log2(w) stages of a perfect-shuffle transpose over w vectors of 16
 * lanes, each holding 16/w segments of w lanes that are transposed side by
 * side: vectors 2i and 2i+1 of a stage are the low and the high interleave,
 * segment by segment, of vectors i and i + w/2 of the one before (each
 * one two-operand shuffle: a vpermt2ps or an unpack). After them, segment
 * s of vector j holds element s·w + j of every input vector, in order. */
static void tile_zip(gen_t *g, LLVMValueRef *r, int w)
{
	LLVMValueRef lo[16], hi[16], t[16];
	for (int s = 0; s < 16 / w; s++)
		for (int k = 0; k < w / 2; k++) {
			int b = s * w;
			lo[b + 2 * k] =
			    LLVMConstInt(g->i32, (uint64_t)(b + k), 0);
			lo[b + 2 * k + 1] =
			    LLVMConstInt(g->i32, (uint64_t)(16 + b + k), 0);
			hi[b + 2 * k] =
			    LLVMConstInt(g->i32, (uint64_t)(b + w / 2 + k), 0);
			hi[b + 2 * k + 1] = LLVMConstInt(
			    g->i32, (uint64_t)(16 + b + w / 2 + k), 0);
		}
	LLVMValueRef mlo = LLVMConstVector(lo, 16),
		     mhi = LLVMConstVector(hi, 16);
	for (int st = 1; st < w; st *= 2) {
		for (int i = 0; i < w / 2; i++) {
			t[2 * i] = LLVMBuildShuffleVector(
			    g->b, r[i], r[i + w / 2], mlo, "");
			t[2 * i + 1] = LLVMBuildShuffleVector(
			    g->b, r[i], r[i + w / 2], mhi, "");
		}
		memcpy(r, t, sizeof(LLVMValueRef) * (size_t)w);
	}
}

/* Lanes [at, at + n) of v, or a and b side by side (n lanes each) when b
 * is given. */
static LLVMValueRef tile_lanes(gen_t *g, LLVMValueRef a, LLVMValueRef b, int at,
			       int n)
{
	LLVMValueRef ix[32];
	int m = b != NULL ? 2 * n : n;
	for (int l = 0; l < m; l++)
		ix[l] = LLVMConstInt(g->i32, (uint64_t)(at + l), 0);
	return LLVMBuildShuffleVector(
	    g->b, a, b != NULL ? b : LLVMGetUndef(LLVMTypeOf(a)),
	    LLVMConstVector(ix, (unsigned)m), "");
}

/* A load tile: rows[l] (l < w) holds the 16 elements along the tile var
 * at lane l; out[i] gets the w lanes of element i. */
static void tile_transpose_in(gen_t *g, LLVMValueRef *rows, int w,
			      LLVMValueRef *out)
{
	tile_zip(g, rows, w);
	for (int j = 0; j < w; j++)
		for (int s = 0; s < 16 / w; s++)
			out[s * w + j] =
			    w == 16 ? rows[j]
				    : tile_lanes(g, rows[j], NULL, s * w, w);
}

/* A store tile: rows[i] (i < 16) holds the w lanes of element i along
 * the tile var; out[l] (l < w) gets the 16 elements of lane l. Rows i, i
 * + w, ... are first put side by side, a segment each. */
static void tile_transpose_out(gen_t *g, const LLVMValueRef *rows, int w,
			       LLVMValueRef *out)
{
	for (int i = 0; i < w; i++) {
		LLVMValueRef seg[16] = {0};
		int n = 16 / w;
		for (int s = 0; s < n; s++)
			seg[s] = rows[i + s * w];
		for (int len = w; n > 1; len *= 2, n /= 2)
			for (int s = 0; s < n / 2; s++)
				seg[s] = tile_lanes(g, seg[2 * s],
						    seg[2 * s + 1], 0, len);
		out[i] = seg[0];
	}
	tile_zip(g, out, w);
}

/* Whether an access of dtype dt at idx goes through a tile: 4-byte
 * elements, coefficient 1 along the tile var and at least CIR_TBLK (in
 * size) along the vector var, which is *cv. */
static bool tile_access(gen_t *g, const kiln_expr_t *idx, kiln_dtype_t dt,
			int64_t *cv)
{
	int64_t ct = 0, cl = 0;
	if (dt == KILN_DT_BOOL || kiln_dtype_size(dt) != 4)
		return false;
	if (!ix_coef(idx, (uint32_t)g->tile_var, &ct) || ct != 1)
		return false;
	if (!ix_coef(idx, (uint32_t)g->vvar, &cl) ||
	    (cl < CIR_TBLK && cl > -CIR_TBLK))
		return false;
	*cv = cl;
	return true;
}

struct tld_scan {
	gen_t *g;
	const sx_t *e[CG_MAX_TILES];
	int64_t cv[CG_MAX_TILES];
	uint32_t n;
};

static void tile_find_load(void *arg, const sx_t *e)
{
	struct tld_scan *s = arg;
	gen_t *g = s->g;
	const cbuf_t *b = &g->c->bufs[e->buf];
	int64_t cv = 0;
	if (s->n == CG_MAX_TILES || e->a != NULL || e->b != NULL ||
	    b->row_local ||
	    (b->kind == CB_TEMP &&
	     b->kernel == (int32_t)(g->k - g->c->kernels)) ||
	    !tile_access(g, e->idx, b->dtype, &cv))
		return;
	for (uint32_t i = 0; i < s->n; i++)
		if (s->e[i] == e)
			return;
	s->e[s->n] = e;
	s->cv[s->n++] = cv;
}

/* The leaf of a tiled kernel's loops at width w: the loop over the tile
 * var, with the transposed loads' tiles read before it (w >= 4) and the
 * transposed stores' tiles written after it. */
static void gen_tile_leaf(gen_t *g, int w)
{
	const kernel_t *k = g->k;
	int tv = g->tile_var;
	uint32_t nm = k->n_members;
	g->n_tld = 0;
	g->tile_w = w;
	if (w >= 4) {
		struct tld_scan sc = {g, {0}, {0}, 0};
		for (uint32_t i = 0; i < nm; i++)
			sx_each_load(k->members[i].body, tile_find_load, &sc);
		g->var[tv] = K64(g, 0);
		for (uint32_t t = 0; t < sc.n; t++) {
			const sx_t *e = sc.e[t];
			kiln_dtype_t dt = g->c->bufs[e->buf].dtype;
			LLVMTypeRef st = storage_type(g, dt, 1);
			LLVMTypeRef rt = storage_type(g, dt, CIR_TBLK);
			LLVMValueRef base = buf_ptr(g, e->buf);
			LLVMValueRef i0 = emit_ix(g, e->idx);
			LLVMValueRef rows[16], cols[16];
			for (int l = 0; l < w; l++) {
				LLVMValueRef ix = LLVMBuildAdd(
				    g->b, i0, K64(g, l * sc.cv[t]), "");
				rows[l] = LLVMBuildLoad2(
				    g->b, rt,
				    LLVMBuildGEP2(g->b, st, base, &ix, 1, ""),
				    "");
				LLVMSetAlignment(rows[l], 4);
			}
			tile_transpose_in(g, rows, w, cols);
			LLVMTypeRef at =
			    LLVMArrayType(storage_type(g, dt, w), CIR_TBLK);
			LLVMValueRef mem = entry_alloca(g, at);
			for (int i = 0; i < CIR_TBLK; i++) {
				LLVMValueRef ix[2] = {K64(g, 0), K64(g, i)};
				LLVMValueRef sv = LLVMBuildStore(
				    g->b, cols[i],
				    LLVMBuildGEP2(g->b, at, mem, ix, 2, ""));
				LLVMSetAlignment(sv, 4);
			}
			g->tld_e[t] = e;
			g->tld_mem[t] = mem;
		}
		g->n_tld = sc.n;
		for (uint32_t i = 0; i < nm && i < CG_MAX_TILE_MEMBERS; i++) {
			const kmember_t *m = &k->members[i];
			const cbuf_t *b = &g->c->bufs[mnode(g, i)->buf];
			if (m->role != ROLE_FULL || m->sidx == NULL ||
			    b->row_local || !stored(g, i) ||
			    !tile_access(g, m->sidx, b->dtype, &g->tst_cv[i]))
				continue;
			g->tst_mem[i] = entry_alloca(
			    g, LLVMArrayType(storage_type(g, b->dtype, w),
					     CIR_TBLK));
		}
	}
	loop_t D;
	loop_begin(g, &D, K64(g, 0), K64(g, CIR_TBLK), 1);
	g->var[tv] = D.i;
	gen_iteration(g, 0, NULL, w);
	clear_full_vals(g);
	loop_end_unrolled(g, &D);
	g->n_tld = 0;
	g->var[tv] = K64(g, 0);
	for (uint32_t i = 0; i < nm && i < CG_MAX_TILE_MEMBERS; i++) {
		if (g->tst_mem[i] == NULL)
			continue;
		const cbuf_t *b = &g->c->bufs[mnode(g, i)->buf];
		kiln_dtype_t dt = b->dtype;
		LLVMTypeRef vt = storage_type(g, dt, w);
		LLVMTypeRef at = LLVMArrayType(vt, CIR_TBLK);
		LLVMValueRef rows[16], cols[16];
		for (int r = 0; r < CIR_TBLK; r++) {
			LLVMValueRef ix[2] = {K64(g, 0), K64(g, r)};
			rows[r] = LLVMBuildLoad2(
			    g->b, vt,
			    LLVMBuildGEP2(g->b, at, g->tst_mem[i], ix, 2, ""),
			    "");
			LLVMSetAlignment(rows[r], 4);
		}
		tile_transpose_out(g, rows, w, cols);
		LLVMValueRef base = buf_ptr(g, mnode(g, i)->buf);
		LLVMValueRef i0 = emit_ix(g, k->members[i].sidx);
		LLVMTypeRef st = storage_type(g, dt, 1);
		for (int l = 0; l < w; l++) {
			LLVMValueRef ix = LLVMBuildAdd(
			    g->b, i0, K64(g, l * g->tst_cv[i]), "");
			LLVMValueRef sv = LLVMBuildStore(
			    g->b, cols[l],
			    LLVMBuildGEP2(g->b, st, base, &ix, 1, ""));
			LLVMSetAlignment(sv, 4);
		}
		g->tst_mem[i] = NULL;
	}
	g->W = w;
}

/* ---- row kernels as a wavefront -----------------------------------------
 *
 * An inner-vectorized row kernel of n passes (cg_row_wave) runs step s of
 * its range with pass p on unit s - p, all n of them in one loop over the
 * reduced dims: softmax's max of row s, exp and sum of row s - 1, and
 * scaling of row s - 2 side by side. Each pass alone leaves a pipe idle
 * (the max's maxps and the exp's FMAs run on different ones; the scale
 * pass is loads, multiplies and stores), and each ends with a chain of
 * dependent instructions (its horizontal reduction, then a division or a
 * root) that the next pass of its row waits for; in the wavefront the
 * other rows' passes are the work the core runs meanwhile. Each unit's
 * passes still run in order over its own row (pass p of a unit at step
 * s, pass p + 1 at step s + 1), on its own values: the results are the
 * same bits. A value a pass computes for its unit (a reduction, a row
 * member) waits in a shift register of allocas, one a step, until the
 * last of its unit's passes that reads it. The first and last n - 1 steps
 * of a range, where some passes have no unit, run the passes that have
 * one a loop each. */
#define CG_WAVE_MAX_PASSES 4

typedef struct cgwave {
	int np;
	uint32_t no;
	uint32_t od[CIR_MAX_RANK];
	/* per pass: its unit's outer vars (along od), the member values it
	 * reads (its unit's earlier passes, the rows before the first) and
	 * its hoisted values */
	LLVMValueRef var[CG_WAVE_MAX_PASSES][CIR_MAX_RANK];
	LLVMValueRef mval[CG_WAVE_MAX_PASSES][64];
	uint32_t n_hoist[CG_WAVE_MAX_PASSES];
	const struct sx *hoist_e[CG_WAVE_MAX_PASSES][CG_MAX_HOIST];
	LLVMValueRef hoist_v[CG_WAVE_MAX_PASSES][CG_MAX_HOIST];
	int hoist_w[CG_WAVE_MAX_PASSES][CG_MAX_HOIST];
} cgwave_t;

/* The body of one iteration of the wavefront's loop at width w: every
 * pass, on its own unit. */
static void wave_leaf(gen_t *g, racc_t *acc, int w)
{
	cgwave_t *wv = g->wave;
	uint32_t nm = g->k->n_members;
	for (int p = 0; p < wv->np; p++) {
		for (uint32_t j = 0; j < wv->no; j++)
			g->var[wv->od[j]] = wv->var[p][j];
		memcpy(g->mval, wv->mval[p], nm * sizeof(LLVMValueRef));
		for (uint32_t i = 0; i < nm; i++)
			g->mval_width[i] = 1;
		g->n_hoist = wv->n_hoist[p];
		memcpy(g->hoist_e, wv->hoist_e[p], sizeof(g->hoist_e));
		memcpy(g->hoist_v, wv->hoist_v[p], sizeof(g->hoist_v));
		memcpy(g->hoist_w, wv->hoist_w[p], sizeof(g->hoist_w));
		memo_clear(g);
		gen_iteration(g, p, acc, w);
		clear_full_vals(g);
	}
	g->n_hoist = 0;
	memo_clear(g);
}

/* Nested loops over the dims in `dims` (outermost first); the last one is
 * the vectorized var when vec is set. lo/hi bound the last dim. */
static void gen_loops(gen_t *g, const uint32_t *dims, uint32_t nd, uint32_t at,
		      int32_t p, racc_t *acc, int w, bool vec, LLVMValueRef lo,
		      LLVMValueRef hi)
{
	if (at == nd) {
		if (g->tile_var >= 0) {
			gen_tile_leaf(g, w);
			return;
		}
		if (g->wave != NULL) {
			wave_leaf(g, acc, w);
			return;
		}
		gen_iteration(g, p, acc, w);
		clear_full_vals(g);
		return;
	}
	uint32_t d = dims[at];
	bool last = at + 1 == nd;
	LLVMValueRef L0 = last && lo ? lo : LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef H =
	    last && hi ? hi : emit_ix(g, ix_dim(g->c, g->k->fsizes[d]));
	if (last && vec && w > 1) {
		/* A span known when codegen runs (a static extent) or known
		 * to be a multiple of w (g->span_whole_vectors: chunks of a
		 * static row whose length w divides) needs no code for the
		 * pieces that would do no work: not emitting them saves O3
		 * and instruction selection a copy of the body each. rem is
		 * what is left for the pieces after those emitted so far;
		 * -1: not known. */
		int64_t rem = -1;
		if (LLVMIsAConstantInt(L0) && LLVMIsAConstantInt(H))
			rem = LLVMConstIntGetSExtValue(H) -
			      LLVMConstIntGetSExtValue(L0);
		bool whole = g->span_whole_vectors && lo != NULL;
		int ru = g->red_unroll;
		if (acc != NULL && ru > 1 &&
		    (rem < 0 || rem >= (int64_t)w * ru)) {
			/* reductions: ru independent accumulators, so the
			 * loop is not one long dependency chain */
			loop_t U;
			loop_begin(g, &U, L0, H, (int64_t)w * ru);
			for (int u = 0; u < ru; u++) {
				memo_clear(g);
				g->slot = u;
				g->var[d] = LLVMBuildAdd(
				    g->b, U.i,
				    LLVMConstInt(g->i64, (uint64_t)(u * w), 0),
				    "");
				gen_loops(g, dims, nd, at + 1, p, acc, w, vec,
					  lo, hi);
			}
			g->slot = 0;
			loop_end_unrolled(g, &U);
			L0 = LLVMBuildLoad2(g->b, g->i64, U.iv, "");
			if (rem >= 0)
				rem %= (int64_t)w * ru;
		}
		LLVMValueRef from = L0;
		if (rem < 0 || rem >= w) {
			loop_t L;
			loop_begin(g, &L, L0, H, w);
			g->var[d] = L.i;
			gen_loops(g, dims, nd, at + 1, p, acc, w, vec, lo, hi);
			loop_end(g, &L);
			/* the tail, from where the vector loop stopped */
			from = LLVMBuildLoad2(g->b, g->i64, L.iv, "");
			if (rem >= 0)
				rem %= w;
		}
		if (whole)
			rem = 0;
		/* without accumulators (pointwise): w/2, then w/4 elements
		 * at once where that many are left, down to 4 lanes */
		for (int hw = w / 2; acc == NULL && hw >= 4; hw /= 2) {
			if (rem >= 0 && rem < hw)
				continue;
			LLVMBasicBlockRef rest;
			g->var[d] = part_begin(g, &from, H, hw, &rest);
			gen_loops(g, dims, nd, at + 1, p, acc, hw, vec, lo, hi);
			part_end(g, rest);
			if (rem >= 0)
				rem -= hw;
		}
		if (rem != 0) {
			loop_t T;
			loop_begin(g, &T, from, H, 1);
			g->var[d] = T.i;
			gen_loops(g, dims, nd, at + 1, p, acc, 1, vec, lo, hi);
			loop_end(g, &T);
		}
		g->W = w;
		return;
	}
	loop_t L;
	loop_begin(g, &L, L0, H, 1);
	g->var[d] = L.i;
	gen_loops(g, dims, nd, at + 1, p, acc, w, vec, lo, hi);
	loop_end(g, &L);
}

/* Row values and reduction results for the current unit at width w. */
static void gen_row_members(gen_t *g, int32_t p, int w)
{
	g->W = w;
	const kernel_t *k = g->k;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass != p || m->role != ROLE_ROW)
			continue;
		LLVMValueRef v = emit_sx(g, m->body);
		g->mval[i] = v;
		g->mval_width[i] = w;
		if (stored(g, i))
			emit_store(g, mnode(g, i)->buf, m->sidx, v, w);
	}
}

/* ---- row-invariant values ------------------------------------------------ */

/* Whether e has the same value at every reduced position of the current
 * row: its indices use no reduced var (rvars), and its loads are values
 * this unit has already computed (a reduction of an earlier pass, a row
 * member). Memory loads are left in the loop, as they cost one load and
 * need not be safe to make when the reduced extent is 0; so are integer
 * divisions, which could trap there. inv caches the answers by node
 * (1: invariant, 2: not), so a shared subtree is looked at once. */
typedef struct {
	const sx_t *key[256];
	uint8_t val[256];
} invset_t;

static bool row_invariant(gen_t *g, const sx_t *e, uint64_t rvars,
			  invset_t *inv)
{
	uint32_t h = (e->hash * 0x9e3779b1u) & 255u, j = h;
	while (inv->key[j] != NULL) {
		if (inv->key[j] == e)
			return inv->val[j] == 1;
		j = (j + 1) & 255u;
		if (j == h)
			return false; /* full: no answer, so not hoisted */
	}
	bool ok = false;
	switch ((sx_kind_t)e->kind) {
	case SX_CONST: ok = true; break;
	case SX_INDEX: ok = (ix_vars(e->idx) & rvars) == 0; break;
	case SX_LOAD: {
		const cbuf_t *b = &g->c->bufs[e->buf];
		if (e->b != NULL || e->a != NULL || b->kind != CB_TEMP ||
		    b->kernel != (int32_t)(g->k - g->c->kernels))
			break;
		for (uint32_t i = 0; i < g->k->n_members; i++) {
			const kmember_t *m = &g->k->members[i];
			if (g->c->nodes[m->node].buf != e->buf ||
			    g->mval[i] == NULL)
				continue;
			ok = e->idx == m->sidx;
			break;
		}
		break;
	}
	case SX_UN: ok = row_invariant(g, e->a, rvars, inv); break;
	case SX_BIN:
		ok = (kiln_dtype_is_float((kiln_dtype_t)e->dt) ||
		      (e->op != OP_DIV && e->op != OP_FLOORDIV &&
		       e->op != OP_TRUNCDIV && e->op != OP_REM &&
		       e->op != OP_FMOD)) &&
		     row_invariant(g, e->a, rvars, inv) &&
		     row_invariant(g, e->b, rvars, inv);
		break;
	case SX_WHERE:
		ok = row_invariant(g, e->a, rvars, inv) &&
		     row_invariant(g, e->b, rvars, inv) &&
		     row_invariant(g, e->c, rvars, inv);
		break;
	case SX_CAST: ok = row_invariant(g, e->a, rvars, inv); break;
	}
	inv->key[j] = e;
	inv->val[j] = ok ? 1 : 2;
	return ok;
}

/* Finds the largest row-invariant subtrees of e that compute something
 * (not a bare load, constant or index) and emits each once, at the unit's
 * width, into g's hoist table. */
static void hoist_collect(gen_t *g, const sx_t *e, uint64_t rvars,
			  invset_t *inv)
{
	if (e == NULL || g->n_hoist == CG_MAX_HOIST)
		return;
	bool op = e->kind == SX_UN || e->kind == SX_BIN ||
		  e->kind == SX_WHERE || e->kind == SX_CAST;
	if (op && row_invariant(g, e, rvars, inv)) {
		for (uint32_t i = 0; i < g->n_hoist; i++)
			if (g->hoist_e[i] == e)
				return;
		LLVMValueRef v = emit_sx(g, e);
		g->hoist_e[g->n_hoist] = e;
		g->hoist_v[g->n_hoist] = v;
		g->hoist_w[g->n_hoist] = g->W;
		g->n_hoist++;
		return;
	}
	if (e->kind == SX_LOAD) {
		hoist_collect(g, e->a, rvars, inv);
		hoist_collect(g, e->b, rvars, inv);
		return;
	}
	if (op) {
		hoist_collect(g, e->a, rvars, inv);
		hoist_collect(g, e->b, rvars, inv);
		hoist_collect(g, e->c, rvars, inv);
	}
}

/* Hoists what pass p's members compute once per row (a softmax's
 * log(sum) + max, a layer norm's rsqrt(var + eps)) out of its loops. */
static void hoist_pass(gen_t *g, int32_t p, uint64_t rvars)
{
	invset_t *inv = calloc(1, sizeof(*inv));
	if (inv == NULL)
		return;
	memo_clear(g);
	for (uint32_t i = 0; i < g->k->n_members; i++) {
		const kmember_t *m = &g->k->members[i];
		if (m->pass == p && m->role != ROLE_ROW)
			hoist_collect(g, m->body, rvars, inv);
	}
	free(inv);
}

/* The pass of a row kernel that prefetches the next row: the first whose
 * body has a transcendental (softmax's exp pass), where the row's own data
 * is in L1 and the compute is long enough to hide the next row's misses;
 * -1 (none) for a kernel without one. A row of 1024 f32 is a 4 KB page,
 * where the hardware prefetchers stop. Prefetching in the first pass
 * instead, while that pass's own loads miss, had cost softmax (whose
 * scratch is its output's row) 15-20% at 64 MB; from its exp pass it
 * gains 20-35% at 4-16 MB (compiler/README.md, mathfn). */
static int32_t prefetch_pass(gen_t *g)
{
	for (int32_t p = 0; p < g->k->n_passes; p++)
		for (uint32_t i = 0; i < g->k->n_members; i++) {
			const kmember_t *m = &g->k->members[i];
			if (m->pass == p && m->role != ROLE_ROW &&
			    sx_has_transcendental(m->body))
				return p;
		}
	return -1;
}

/* Accumulators per reduction in pass p's vector loop (RED_UNROLL_HEAVY
 * above). */
static int pass_unroll(gen_t *g, int32_t p)
{
	if (g->c->vec_width >= 16)
		return RED_UNROLL;
	for (uint32_t i = 0; i < g->k->n_members; i++) {
		const kmember_t *m = &g->k->members[i];
		if (m->pass == p && m->role != ROLE_ROW &&
		    sx_has_transcendental(m->body))
			return RED_UNROLL_HEAVY;
	}
	return RED_UNROLL;
}

/* Decomposes unit index u into the vars of `dims` (row-major). */
static void decompose(gen_t *g, LLVMValueRef u, const uint32_t *dims,
		      uint32_t nd, const LLVMValueRef *sizes)
{
	for (uint32_t j = nd; j-- > 0;) {
		if (j == 0) {
			g->var[dims[j]] = u;
			break;
		}
		g->var[dims[j]] = LLVMBuildURem(g->b, u, sizes[j], "");
		u = LLVMBuildUDiv(g->b, u, sizes[j], "");
	}
}

/* The accumulators of pass p's reductions, at their identity (lw lanes). */
static void pass_init(gen_t *g, int32_t p, racc_t *acc, int lw)
{
	const kernel_t *k = g->k;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass == p && m->role == ROLE_RED) {
			const cnode_t *n = mnode(g, i);
			kiln_dtype_t dt = (kiln_dtype_t)n->body->dt;
			racc_init(g, &acc[i], n->red, dt, lw);
		}
	}
}

/* The reduced dims' bits among the kernel vars. */
static uint64_t rvar_bits(const uint32_t *rd, uint32_t nr)
{
	uint64_t rvars = 0;
	for (uint32_t i = 0; i < nr; i++)
		rvars |= 1ull << rd[i];
	return rvars;
}

/* Pass p's reductions' final values (and stores), then the row members
 * computed after it, for the unit g->var points at. */
static void pass_finish(gen_t *g, int32_t p, int uw, bool inner_vec,
			racc_t *acc)
{
	const kernel_t *k = g->k;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass != p || m->role != ROLE_RED)
			continue;
		const cnode_t *n = mnode(g, i);
		LLVMValueRef val, idx = NULL;
		if (inner_vec) {
			racc_final_scalar(g, &acc[i], &val, &idx);
		} else {
			racc_t *r = &acc[i];
			val = LLVMBuildLoad2(g->b, cg_type(g, r->dt, uw), r->v,
					     "");
			if (r->i)
				idx = LLVMBuildLoad2(
				    g->b, cg_type(g, KILN_DT_I64, uw), r->i,
				    "");
		}
		LLVMValueRef res =
		    n->red == RED_ARGMAX || n->red == RED_ARGMIN ? idx : val;
		kiln_dtype_t bdt = g->c->bufs[n->buf].dtype;
		kiln_dtype_t rdt = n->red == RED_ARGMAX || n->red == RED_ARGMIN
				       ? KILN_DT_I64
				       : (kiln_dtype_t)n->body->dt;
		res = emit_cast(g, res, rdt, compute_dtype(bdt), uw);
		g->mval[i] = res;
		g->mval_width[i] = uw;
		if (stored(g, i))
			emit_store(g, n->buf, m->sidx, res, uw);
	}
	gen_row_members(g, p, uw);
}

/* Pass p of a row unit: its loops over the reduced dims, then its
 * reductions' final values (and stores) and the row members computed after
 * it. rd/nr: the reduced dims. */
static void gen_pass(gen_t *g, int32_t p, int uw, bool inner_vec, racc_t *acc,
		     const uint32_t *rd, uint32_t nr, int32_t pf_pass)
{
	int lw = inner_vec ? g->c->vec_width : uw;
	g->red_unroll = pass_unroll(g, p);
	/* the pass with the row's heavy compute prefetches the next row's
	 * lines (prefetch_loads) */
	g->pf_on = p == pf_pass && inner_vec && g->pf_var >= 0;
	pass_init(g, p, acc, lw);
	g->W = uw;
	hoist_pass(g, p, rvar_bits(rd, nr));
	memo_clear(g);
	gen_loops(g, rd, nr, 0, p, acc, lw, inner_vec, NULL, NULL);
	memo_clear(g);
	g->n_hoist = 0;
	g->W = uw;
	g->pf_on = false;
	pass_finish(g, p, uw, inner_vec, acc);
}

/* The start of a row unit: no member values yet, then the row members of
 * before the first pass. Returns the number of reduced dims, listed in rd. */
static uint32_t row_unit_begin(gen_t *g, int uw, uint32_t *rd)
{
	const kernel_t *k = g->k;
	uint32_t nr = 0;
	for (uint32_t i = 0; i < k->frank; i++)
		if (k->rmask >> i & 1)
			rd[nr++] = i;
	for (uint32_t i = 0; i < k->n_members; i++)
		g->mval[i] = NULL;
	memo_clear(g);
	gen_row_members(g, -1, uw);
	return nr;
}

/* One unit of a row kernel. uw: the unit's width (outer-vectorized: W lanes
 * = W rows; inner-vectorized: 1). */
static void gen_row_unit(gen_t *g, int uw, bool inner_vec)
{
	const kernel_t *k = g->k;
	uint32_t rd[CIR_MAX_RANK];
	uint32_t nr = row_unit_begin(g, uw, rd);
	racc_t acc[64];
	int32_t pf_pass = prefetch_pass(g);
	for (int32_t p = 0; p < k->n_passes; p++)
		gen_pass(g, p, uw, inner_vec, acc, rd, nr, pf_pass);
}

/* Whether a row kernel runs its first pass one unit ahead
 * (gen_row_unit_ahead): inner-vectorized; two passes or more; a first pass
 * whose members are reductions and row members (no full member: no element of a
 * scratch or an output that the next unit's would overwrite before this
 * unit's later passes read it; what they store goes to their own unit's
 * index); before it, row members only, none of them stored (the ahead
 * block computes them again for the next unit). It relies on two things the
 * scheduler guarantees: a pass reads no value of a later pass (so the
 * next unit's first pass cannot see this unit's later values, which are
 * still in g->mval while it is built), and no kernel reads another unit's
 * row of a buffer it writes (units already run on several threads in any
 * order). */
bool cg_row_ahead(cctx_t *c, const kernel_t *k)
{
	if (!cg_inner_vec(c, k) || k->n_passes < 2 || k->n_members > 64)
		return false;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		const cbuf_t *b = &c->bufs[c->nodes[m->node].buf];
		if (m->pass == 0 && m->role == ROLE_FULL)
			return false;
		if (m->pass < 0 &&
		    (m->role != ROLE_ROW || b->in_memory || b->is_output))
			return false;
	}
	return true;
}

/* Pass 0 for the unit g->var points at, its values (its reductions and the
 * row members after it) stored into their allocas (made on first use); the
 * member values from before it are put back. */
static void first_pass_to_slots(gen_t *g, racc_t *acc, const uint32_t *rd,
				uint32_t nr, int32_t pf_pass,
				LLVMValueRef *slot)
{
	uint32_t n = g->k->n_members;
	LLVMValueRef mv[64];
	memcpy(mv, g->mval, sizeof(LLVMValueRef) * n);
	gen_pass(g, 0, 1, true, acc, rd, nr, pf_pass);
	for (uint32_t i = 0; i < n; i++) {
		if (g->k->members[i].pass != 0 || g->mval[i] == NULL)
			continue;
		if (slot[i] == NULL)
			slot[i] = entry_alloca(g, LLVMTypeOf(g->mval[i]));
		LLVMBuildStore(g->b, g->mval[i], slot[i]);
	}
	memcpy(g->mval, mv, sizeof(LLVMValueRef) * n);
	for (uint32_t i = 0; i < n; i++)
		g->mval_width[i] = 1;
}

/* One unit of an inner-vectorized row kernel (cg_row_ahead) with its first
 * pass run one unit ahead: the unit's later passes, and between its last
 * two the first pass of unit u + 1, whose values wait in allocas for the
 * next iteration (the first unit of the range runs its own first). The
 * horizontal reductions that end each pass, and the division or root
 * after them, are chains of dependent instructions (40-60 cycles on a Zen
 * 5) that the next pass waits for; the other unit's first pass is work
 * the core runs meanwhile, and the next unit's first reduction ends while
 * this unit's last pass runs. */
static void gen_row_unit_ahead(gen_t *g, LLVMValueRef u, LLVMValueRef begin,
			       LLVMValueRef end, const uint32_t *od,
			       uint32_t no, const LLVMValueRef *osz)
{
	const kernel_t *k = g->k;
	uint32_t rd[CIR_MAX_RANK];
	uint32_t nr = row_unit_begin(g, 1, rd);
	racc_t acc[64];
	LLVMValueRef slot[64] = {0};
	LLVMValueRef var_u[CIR_MAX_VARS];
	int32_t pf_pass = prefetch_pass(g);
	/* the range's first unit: its own first pass */
	LLVMBasicBlockRef first =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "first");
	LLVMBasicBlockRef have =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "have");
	LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, u, begin, ""),
			first, have);
	LLVMPositionBuilderAtEnd(g->b, first);
	first_pass_to_slots(g, acc, rd, nr, pf_pass, slot);
	LLVMBuildBr(g->b, have);
	LLVMPositionBuilderAtEnd(g->b, have);
	memo_clear(g);
	for (uint32_t i = 0; i < k->n_members; i++)
		if (slot[i] != NULL) {
			g->mval[i] = LLVMBuildLoad2(
			    g->b, LLVMGetAllocatedType(slot[i]), slot[i], "");
			g->mval_width[i] = 1;
		}
	for (int32_t p = 1; p < k->n_passes; p++) {
		if (p == k->n_passes - 1) {
			/* the next unit's first pass */
			LLVMValueRef u1 = LLVMBuildAdd(g->b, u, K64(g, 1), "");
			LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(
			    g->ctx, g->fn, "ahead");
			LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(
			    g->ctx, g->fn, "joined");
			LLVMBuildCondBr(
			    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, u1, end, ""),
			    next, join);
			LLVMPositionBuilderAtEnd(g->b, next);
			LLVMValueRef mv[64];
			memcpy(mv, g->mval,
			       sizeof(LLVMValueRef) * k->n_members);
			memcpy(var_u, g->var, sizeof(var_u));
			memo_clear(g);
			decompose(g, u1, od, no, osz);
			gen_row_members(g, -1, 1);
			first_pass_to_slots(g, acc, rd, nr, pf_pass, slot);
			memcpy(g->var, var_u, sizeof(var_u));
			memcpy(g->mval, mv,
			       sizeof(LLVMValueRef) * k->n_members);
			LLVMBuildBr(g->b, join);
			LLVMPositionBuilderAtEnd(g->b, join);
			memo_clear(g);
		}
		gen_pass(g, p, 1, true, acc, rd, nr, pf_pass);
	}
}

/* Whether an inner-vectorized row kernel runs its passes as a wavefront
 * (the section above wave_leaf, gen_row_wave), and when: 0 never, 1
 * always, 2 where its iteration space is at most CG_WAVE_MAX_BYTES when
 * it runs (a symbolic size: its kernel has both bodies and picks one
 * per call; by the hint alone, a dynamic softmax first seen small would
 * run as a wavefront at every size). It takes a first pass run a unit
 * ahead (cg_row_ahead: what makes the passes of different units
 * independent), 2 to CG_WAVE_MAX_PASSES passes, 16 lanes (on 8, the
 * transcendental passes already run out of registers: pass_unroll), a
 * later pass with a transcendental (softmax's exp: the compute the other
 * passes' loads and reductions hide under; layer_norm's light passes ran
 * 5-15% slower side by side), at most CG_WAVE_MAX_BYTES where the sizes
 * are static, no row scratch on the stack (one row, which two units'
 * passes would share: a scratch in an output's row is the unit's own),
 * and every value a pass hands to a later one an f32 (the shift
 * registers' type). */
int cg_row_wave(cctx_t *c, const kernel_t *k)
{
	if (c->vec_width < 16 || k->n_passes > CG_WAVE_MAX_PASSES ||
	    !cg_row_ahead(c, k))
		return 0;
	double bytes = 4;
	bool sym = false;
	for (uint32_t i = 0; i < k->frank; i++) {
		sym = sym || k->fsizes[i].e != NULL;
		bytes *= (double)ix_estimate(c, ix_dim(c, k->fsizes[i]));
	}
	if (!sym && bytes > CG_WAVE_MAX_BYTES)
		return 0;
	bool heavy = false;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass >= 1 && m->role != ROLE_ROW &&
		    sx_has_transcendental(m->body))
			heavy = true;
	}
	if (!heavy)
		return 0;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		const cnode_t *n = &c->nodes[m->node];
		const cbuf_t *b = &c->bufs[n->buf];
		if (b->row_local && b->row_out == 0)
			return 0;
		if (m->pass < 0 || m->pass >= k->n_passes - 1 ||
		    m->role == ROLE_FULL)
			continue;
		if (b->dtype != KILN_DT_F32 || m->body->dt != KILN_DT_F32 ||
		    n->red == RED_ARGMAX || n->red == RED_ARGMIN)
			return 0;
	}
	return sym ? 2 : 1;
}

/* The state pass p starts from at step s: its unit's vars (unit s - p),
 * the values of its unit's earlier passes (from the shift registers) and
 * the row members from before the first pass. */
static void wave_pass_state(gen_t *g, int p, LLVMValueRef s, const uint32_t *od,
			    uint32_t no, const LLVMValueRef *osz,
			    LLVMValueRef (*slot)[CG_WAVE_MAX_PASSES])
{
	const kernel_t *k = g->k;
	memo_clear(g);
	decompose(g, LLVMBuildSub(g->b, s, K64(g, p), ""), od, no, osz);
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		g->mval[i] = NULL;
		if (slot[i][0] != NULL && m->pass < p) {
			g->mval[i] = LLVMBuildLoad2(
			    g->b, g->f32, slot[i][p - m->pass - 1], "");
			g->mval_width[i] = 1;
		}
	}
	gen_row_members(g, -1, 1);
}

/* A branch on c to a new block, where the caller emits; returns the block
 * both paths meet in (the caller branches there). */
static LLVMBasicBlockRef wave_if(gen_t *g, LLVMValueRef c)
{
	LLVMBasicBlockRef on =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "wave_on");
	LLVMBasicBlockRef off =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "wave_off");
	LLVMBuildCondBr(g->b, c, on, off);
	LLVMPositionBuilderAtEnd(g->b, on);
	return off;
}

/* The units [begin, end) of an inner-vectorized row kernel as a wavefront
 * (cg_row_wave): steps s = begin .. end + n - 2, pass p on unit s - p
 * where that is in the range. */
static void gen_row_wave(gen_t *g, LLVMValueRef begin, LLVMValueRef end,
			 const uint32_t *od, uint32_t no,
			 const LLVMValueRef *osz)
{
	const kernel_t *k = g->k;
	int np = k->n_passes, W = g->c->vec_width;
	uint32_t nm = k->n_members;
	uint32_t rd[CIR_MAX_RANK], nr = 0;
	for (uint32_t i = 0; i < k->frank; i++)
		if (k->rmask >> i & 1)
			rd[nr++] = i;
	uint64_t rvars = rvar_bits(rd, nr);
	racc_t acc[64];
	/* slot[i][d]: member i's value for the unit its pass ran on d + 1
	 * steps before the current one; fresh[i]: this step's */
	LLVMValueRef slot[64][CG_WAVE_MAX_PASSES] = {{0}}, fresh[64] = {0};
	for (uint32_t i = 0; i < nm; i++) {
		const kmember_t *m = &k->members[i];
		if (m->pass < 0 || m->pass >= np - 1 || m->role == ROLE_FULL)
			continue;
		for (int d = 0; d < np - 1 - m->pass; d++)
			slot[i][d] = entry_alloca(g, g->f32);
		fresh[i] = entry_alloca(g, g->f32);
	}
	cgwave_t wv = {.np = np, .no = no};
	memcpy(wv.od, od, no * sizeof(*od));
	g->red_unroll = RED_UNROLL;
	g->pf_on = false;
	loop_t S;
	loop_begin(g, &S, begin, LLVMBuildAdd(g->b, end, K64(g, np - 1), ""),
		   1);
	LLVMValueRef s = S.i, act[CG_WAVE_MAX_PASSES];
	for (int p = 0; p < np; p++) {
		LLVMValueRef u = LLVMBuildSub(g->b, s, K64(g, p), "");
		act[p] = LLVMBuildAnd(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSGE, u, begin, ""),
		    LLVMBuildICmp(g->b, LLVMIntSLT, u, end, ""), "");
		pass_init(g, p, acc, W);
	}
	LLVMValueRef all = LLVMBuildAnd(
	    g->b,
	    LLVMBuildICmp(g->b, LLVMIntSGE, s,
			  LLVMBuildAdd(g->b, begin, K64(g, np - 1), ""), ""),
	    LLVMBuildICmp(g->b, LLVMIntSLT, s, end, ""), "");
	LLVMBasicBlockRef ramp = wave_if(g, all);
	/* every pass has a unit: one loop */
	for (int p = 0; p < np; p++) {
		wave_pass_state(g, p, s, od, no, osz, slot);
		for (uint32_t j = 0; j < no; j++)
			wv.var[p][j] = g->var[od[j]];
		memcpy(wv.mval[p], g->mval, nm * sizeof(LLVMValueRef));
		g->W = 1;
		hoist_pass(g, p, rvars);
		wv.n_hoist[p] = g->n_hoist;
		memcpy(wv.hoist_e[p], g->hoist_e, sizeof(g->hoist_e));
		memcpy(wv.hoist_v[p], g->hoist_v, sizeof(g->hoist_v));
		memcpy(wv.hoist_w[p], g->hoist_w, sizeof(g->hoist_w));
		g->n_hoist = 0;
	}
	g->wave = &wv;
	memo_clear(g);
	gen_loops(g, rd, nr, 0, 0, acc, W, true, NULL, NULL);
	g->wave = NULL;
	memo_clear(g);
	LLVMBasicBlockRef done =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "wave_fin");
	LLVMBuildBr(g->b, done);
	/* the ramps: the passes that have a unit, a loop each */
	LLVMPositionBuilderAtEnd(g->b, ramp);
	for (int p = 0; p < np; p++) {
		LLVMBasicBlockRef off = wave_if(g, act[p]);
		wave_pass_state(g, p, s, od, no, osz, slot);
		g->W = 1;
		hoist_pass(g, p, rvars);
		memo_clear(g);
		gen_loops(g, rd, nr, 0, p, acc, W, true, NULL, NULL);
		memo_clear(g);
		g->n_hoist = 0;
		LLVMBuildBr(g->b, off);
		LLVMPositionBuilderAtEnd(g->b, off);
	}
	LLVMBuildBr(g->b, done);
	LLVMPositionBuilderAtEnd(g->b, done);
	/* each pass's results for its unit; then the registers shift */
	for (int p = 0; p < np; p++) {
		LLVMBasicBlockRef off = wave_if(g, act[p]);
		wave_pass_state(g, p, s, od, no, osz, slot);
		g->W = 1;
		pass_finish(g, p, 1, true, acc);
		for (uint32_t i = 0; i < nm; i++)
			if (fresh[i] != NULL && k->members[i].pass == p)
				LLVMBuildStore(g->b, g->mval[i], fresh[i]);
		LLVMBuildBr(g->b, off);
		LLVMPositionBuilderAtEnd(g->b, off);
	}
	for (uint32_t i = 0; i < nm; i++) {
		if (fresh[i] == NULL)
			continue;
		for (int d = np - 2 - k->members[i].pass; d > 0; d--)
			LLVMBuildStore(
			    g->b,
			    LLVMBuildLoad2(g->b, g->f32, slot[i][d - 1], ""),
			    slot[i][d]);
		LLVMBuildStore(g->b, LLVMBuildLoad2(g->b, g->f32, fresh[i], ""),
			       slot[i][0]);
	}
	memo_clear(g);
	for (uint32_t i = 0; i < nm; i++)
		g->mval[i] = NULL;
	loop_end(g, &S);
}

#define PW_CHUNK CG_PW_CHUNK

static void gen_kernel_units(gen_t *g, LLVMValueRef begin, LLVMValueRef end);

/* The column step between a wavefront kernel's passes (cg_row_wave): pass
 * p starts each row at column p·step and wraps; 0 for none. A static row
 * of C = 2^k >= 1024 f32 (a multiple of 4 KB) takes step C/n rounded to
 * whole vectors. With every pass at the same column, the scale pass's
 * load from row s - 2 is 4096 bytes below the exp pass's store to row
 * s - 1 just before it, which the core takes for a store it must wait
 * for (4K aliasing), and with input and output both page-aligned every
 * pass's accesses alias each other: softmax over rows of 1024 ran 4-17%
 * faster rotated (compiler/README.md). Every loop of such a kernel (the
 * wavefront and its ramps) rotates alike, so a row's sums come out the
 * same bits whichever steps run it. Not rotated: the classic body of a
 * kernel whose row count is a symbol (wave 2, past 8 MiB: rotated,
 * softmax over 4096 rows of 1024 ran 40% slower there, where memory
 * bounds it; so one such artifact sums a row in another order past 8
 * MiB), and a kernel with an argmax or argmin, whose lanes keep the first
 * index they visit on a tie or NaN (torch's is the first in the row). */
int64_t cg_row_rotation(cctx_t *c, const kernel_t *k)
{
	uint32_t f = k->frank;
	if (f == 0 || cg_row_wave(c, k) == 0)
		return 0;
	int64_t C = k->fsizes[f - 1].e == NULL ? k->fsizes[f - 1].c : -1;
	int W = c->vec_width, np = k->n_passes;
	for (uint32_t i = 0; i < k->n_members; i++) {
		red_op_t r = c->nodes[k->members[i].node].red;
		if (r == RED_ARGMAX || r == RED_ARGMIN)
			return 0;
	}
	if (k->rmask != 1u << (f - 1) || C < 1024 || (C & (C - 1)) != 0 ||
	    C / W < 2 * np)
		return 0;
	return C / np / W * W;
}

static void gen_kernel_body(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	kernel_t *k = g->k;
	uint32_t f = k->frank;
	int wave = k->is_row ? cg_row_wave(c, k) : 0;
	if (wave == 0) {
		gen_kernel_units(g, begin, end);
		return;
	}
	uint32_t od[CIR_MAX_RANK] = {0};
	LLVMValueRef osz[CIR_MAX_RANK + 1] = {0};
	uint32_t no = 0;
	LLVMValueRef bytes = K64(g, 4);
	for (uint32_t i = 0; i < f; i++) {
		LLVMValueRef n = emit_ix(g, ix_dim(c, k->fsizes[i]));
		bytes = LLVMBuildMul(g->b, bytes, n, "");
		if (!(k->rmask >> i & 1)) {
			od[no] = i;
			osz[no++] = n;
		}
	}
	LLVMBasicBlockRef classic = NULL;
	if (wave == 2)
		classic = wave_if(
		    g, LLVMBuildICmp(g->b, LLVMIntSLE, bytes,
				     K64(g, (int64_t)CG_WAVE_MAX_BYTES), ""));
	g->vvar = (int)(f - 1);
	/* each pass from its own column (cg_row_rotation) */
	g->rot_var = -1;
	int64_t step = cg_row_rotation(c, k);
	if (step > 0) {
		g->rot_var = (int)(f - 1);
		g->rot_cols = k->fsizes[f - 1].c;
		g->rot_step = step;
	}
	gen_row_wave(g, begin, end, od, no, osz);
	if (classic == NULL) {
		g->rot_var = -1;
		return;
	}
	LLVMBasicBlockRef join =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "wave_join");
	LLVMBuildBr(g->b, join);
	LLVMPositionBuilderAtEnd(g->b, classic);
	memo_clear(g);
	g->rot_var = -1;
	gen_kernel_units(g, begin, end);
	LLVMBuildBr(g->b, join);
	LLVMPositionBuilderAtEnd(g->b, join);
	memo_clear(g);
}

/* The units [begin, end) of a kernel, one after another. */
static void gen_kernel_units(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	kernel_t *k = g->k;
	int W = c->vec_width;
	uint32_t f = k->frank;
	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef u = U.i;
	if (!k->is_row) {
		if (f == 0) {
			g->vvar = -1;
			gen_iteration(g, 0, NULL, 1);
			clear_full_vals(g);
		} else {
			uint32_t od[CIR_MAX_RANK];
			LLVMValueRef osz[CIR_MAX_RANK + 1];
			uint32_t no = 0;
			/* a tiled kernel's unit runs all of its tile var */
			bool tiled = k->tiled && f >= 2;
			for (uint32_t i = 0; i + 1 < f; i++) {
				if (tiled && i + 2 == f)
					continue;
				od[no] = i;
				osz[no++] = emit_ix(g, ix_dim(c, k->fsizes[i]));
			}
			uint32_t last = f - 1;
			LLVMValueRef n = emit_ix(g, ix_dim(c, k->fsizes[last]));
			LLVMValueRef lo, hi;
			bool chunked = !(k->fsizes[last].e == NULL &&
					 k->fsizes[last].c <= PW_CHUNK);
			if (chunked) {
				LLVMValueRef ch =
				    LLVMConstInt(g->i64, PW_CHUNK, 0);
				LLVMValueRef nch = udiv_up(g, n, PW_CHUNK);
				LLVMValueRef ci =
				    LLVMBuildURem(g->b, u, nch, "");
				LLVMValueRef rest =
				    LLVMBuildUDiv(g->b, u, nch, "");
				decompose(g, rest, od, no, osz);
				lo = LLVMBuildMul(g->b, ci, ch, "");
				hi = LLVMBuildAdd(g->b, lo, ch, "");
				hi = LLVMBuildSelect(
				    g->b,
				    LLVMBuildICmp(g->b, LLVMIntSLT, hi, n, ""),
				    hi, n, "");
			} else {
				decompose(g, u, od, no, osz);
				lo = LLVMConstInt(g->i64, 0, 0);
				hi = n;
			}
			g->vvar = (int)last;
			uint32_t dims[1] = {last};
			/* chunks of a static row that W divides are whole
			 * vectors (PW_CHUNK is a multiple of every W) */
			g->span_whole_vectors =
			    chunked && k->fsizes[last].e == NULL &&
			    k->fsizes[last].c % W == 0 && PW_CHUNK % W == 0;
			g->tile_var = tiled ? (int)(f - 2) : -1;
			gen_loops(g, dims, 1, 0, 0, NULL, W, true, lo, hi);
			g->tile_var = -1;
			g->span_whole_vectors = false;
		}
	} else {
		bool inner_vec = cg_inner_vec(c, k);
		uint32_t od[CIR_MAX_RANK] = {0};
		LLVMValueRef osz[CIR_MAX_RANK + 1] = {0};
		uint32_t no = 0;
		for (uint32_t i = 0; i < f; i++)
			if (!(k->rmask >> i & 1)) {
				od[no] = i;
				osz[no++] = emit_ix(g, ix_dim(c, k->fsizes[i]));
			}
		if (inner_vec || no == 0) {
			g->vvar = inner_vec ? (int)(f - 1) : -1;
			decompose(g, u, od, no, osz);
			g->pf_var = no > 0 ? (int)od[no - 1] : -1;
			if (inner_vec && cg_row_ahead(c, k))
				gen_row_unit_ahead(g, u, begin, end, od, no,
						   osz);
			else
				gen_row_unit(g, 1, inner_vec);
			g->pf_var = -1;
			g->pf_on = false;
		} else {
			/* outer-vectorized: the last outer dim in blocks of W
			 */
			uint32_t v = od[no - 1];
			LLVMValueRef nv = osz[no - 1];
			int B = W * k->oblk;
			LLVMValueRef wv = LLVMConstInt(g->i64, (uint64_t)B, 0);
			LLVMValueRef nb = udiv_up(g, nv, B);
			LLVMValueRef bi = LLVMBuildURem(g->b, u, nb, "");
			LLVMValueRef rest = LLVMBuildUDiv(g->b, u, nb, "");
			decompose(g, rest, od, no - 1, osz);
			LLVMValueRef j0 = LLVMBuildMul(g->b, bi, wv, "");
			LLVMValueRef full = LLVMBuildICmp(
			    g->b, LLVMIntSLE, LLVMBuildAdd(g->b, j0, wv, ""),
			    nv, "");
			LLVMBasicBlockRef bv =
			    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "vec");
			LLVMBasicBlockRef bs = LLVMAppendBasicBlockInContext(
			    g->ctx, g->fn, "rows");
			LLVMBasicBlockRef bj = LLVMAppendBasicBlockInContext(
			    g->ctx, g->fn, "join");
			LLVMBuildCondBr(g->b, full, bv, bs);
			LLVMPositionBuilderAtEnd(g->b, bv);
			g->vvar = (int)v;
			g->var[v] = j0;
			gen_row_unit(g, B, false);
			LLVMBuildBr(g->b, bj);
			LLVMPositionBuilderAtEnd(g->b, bs);
			memo_clear(g);
			LLVMValueRef from = j0;
			if (k->oblk > 1) {
				/* the last unit's whole blocks of W */
				loop_t Bl;
				loop_begin(g, &Bl, j0, nv, W);
				g->var[v] = Bl.i;
				gen_row_unit(g, W, false);
				loop_end(g, &Bl);
				from = LLVMBuildLoad2(g->b, g->i64, Bl.iv, "");
				memo_clear(g);
			}
			/* a partial block: W/2, then W/4 rows at once where
			 * that many are left (the depthwise convolutions'
			 * late layers: rows of 8 and 4 at 16 lanes), down to
			 * 4 lanes; the rest one at a time */
			for (int hw = W / 2; hw >= 4; hw /= 2) {
				LLVMBasicBlockRef rest;
				g->var[v] = part_begin(g, &from, nv, hw, &rest);
				gen_row_unit(g, hw, false);
				part_end(g, rest);
			}
			loop_t R;
			loop_begin(g, &R, from, nv, 1);
			g->var[v] = R.i;
			gen_row_unit(g, 1, false);
			loop_end(g, &R);
			LLVMBuildBr(g->b, bj);
			LLVMPositionBuilderAtEnd(g->b, bj);
			memo_clear(g);
		}
	}
	loop_end(g, &U);
}

/* Blocks of W columns one unit of an outer-vectorized row kernel reduces
 * side by side (at width oblk·W, which LLVM splits into oblk vectors with
 * an accumulator each). One block a unit walked the reduced rows W columns
 * (one cache line) at a time, a row stride apart: each load was another
 * page and no prefetcher followed, and the next unit came back to the same
 * pages for the next line. A sum over the rows of [4096, 1024] f32 took
 * 1.26 ms at one block, 0.64 at two, 0.25 at four (2 threads). Each
 * column still sums its rows in order: the results are the same bits. As
 * many blocks as fit 64 lanes (the widest vector codegen builds) and the
 * columns, fewer where that would leave under OBLK_UNITS units to share
 * among threads (sizes by their hints where they are symbols). */
#define OBLK_LANES 64
#define OBLK_UNITS 16

typedef struct sxseen {
	const sx_t *n[256];
	int k;
} sxseen_t;

/* Whether every load in e reads its lanes (along v) contiguously or all
 * from one element (coefficient 1 or 0 of v): other accesses (a gather, or
 * what lane_form turns into vector loads at W lanes only) keep one block.
 * With r < CIR_MAX_RANK, also none of those that read along v reads along
 * var r contiguously too (a per-channel weight may, reading all its lanes
 * from one element); *along: one reads along v. */
static bool loads_lanes(const sx_t *e, uint32_t v, uint32_t r, sxseen_t *s,
			bool *along)
{
	if (e == NULL)
		return true;
	for (int i = 0; i < s->k; i++)
		if (s->n[i] == e)
			return true;
	if (s->k == 256)
		return false;
	s->n[s->k++] = e;
	if (e->kind == SX_LOAD) {
		int64_t cv = 0, cr = 0;
		if (e->b != NULL || !ix_coef(e->idx, v, &cv) ||
		    (cv != 0 && cv != 1))
			return false;
		if (r < CIR_MAX_RANK &&
		    (!ix_coef(e->idx, r, &cr) || (cv == 1 && cr == 1)))
			return false;
		*along = *along || cv == 1;
	}
	return loads_lanes(e->a, v, r, s, along) &&
	       loads_lanes(e->b, v, r, s, along) &&
	       loads_lanes(e->c, v, r, s, along);
}

bool cg_inner_vec(cctx_t *c, const kernel_t *k)
{
	uint32_t f = k->frank;
	if (!k->is_row || f == 0 || !(k->rmask >> (f - 1) & 1))
		return false;
	if (c->vec_width < 4)
		return true;
	uint32_t v = f;
	for (uint32_t i = 0; i < f; i++)
		if (!(k->rmask >> i & 1))
			v = i;
	if (v == f || ix_estimate(c, ix_dim(c, k->fsizes[v])) < 4)
		return true;
	sxseen_t seen = {.k = 0};
	bool along = false;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		int64_t cv = 0;
		if (!loads_lanes(m->body, v, f - 1, &seen, &along) ||
		    (m->sidx != NULL &&
		     (!ix_coef(m->sidx, v, &cv) || (cv != 0 && cv != 1))))
			return true;
	}
	return !along;
}

int cg_outer_blocks(cctx_t *c, const kernel_t *k)
{
	int W = c->vec_width;
	uint32_t f = k->frank;
	if (!k->is_row || W < 4 || f == 0 || cg_inner_vec(c, k))
		return 1;
	uint32_t v = f;
	for (uint32_t i = 0; i < f; i++)
		if (!(k->rmask >> i & 1))
			v = i;
	if (v == f)
		return 1;
	sxseen_t *seen = kiln_arena_alloc(c->arena, sizeof(*seen));
	if (seen == NULL)
		return 1;
	seen->k = 0;
	for (uint32_t i = 0; i < k->n_members; i++) {
		const kmember_t *m = &k->members[i];
		int64_t cv = 0;
		bool along = false;
		if (!loads_lanes(m->body, v, CIR_MAX_RANK, seen, &along) ||
		    (m->sidx != NULL &&
		     (!ix_coef(m->sidx, v, &cv) || (cv != 0 && cv != 1))))
			return 1;
	}
	int64_t others = 1;
	for (uint32_t i = 0; i < k->frank; i++)
		if (!(k->rmask >> i & 1) && i != v)
			others *= ix_estimate(c, ix_dim(c, k->fsizes[i]));
	int64_t nv = ix_estimate(c, ix_dim(c, k->fsizes[v]));
	for (int b = OBLK_LANES / W; b > 1; b /= 2) {
		int64_t B = (int64_t)b * W;
		if (B <= nv && others * ((nv + B - 1) / B) >= OBLK_UNITS)
			return b;
	}
	return 1;
}

/* Parallel extent and grain of a kernel (must match gen_kernel_body). */
static void kernel_extent(cctx_t *c, kernel_t *k)
{
	uint32_t f = k->frank;
	int W = c->vec_width;
	const kiln_expr_t *ext = ix_const(c, 1);
	int64_t per_unit = 1;
	if (!k->is_row) {
		if (f > 0) {
			/* a tiled kernel's unit runs all of its tile var */
			bool tiled = k->tiled && f >= 2;
			for (uint32_t i = 0; i + 1 < f; i++)
				if (!tiled || i + 2 != f)
					ext = ix_mul(c, ext,
						     ix_dim(c, k->fsizes[i]));
			kiln_dim_t last = k->fsizes[f - 1];
			if (last.e == NULL && last.c <= PW_CHUNK) {
				per_unit = last.c > 0 ? last.c : 1;
			} else {
				ext = ix_mul(
				    c, ext,
				    ix_floordiv(
					c,
					ix_add(c, ix_dim(c, last),
					       ix_const(c, PW_CHUNK - 1)),
					ix_const(c, PW_CHUNK)));
				per_unit = PW_CHUNK;
			}
			if (tiled)
				per_unit *= CIR_TBLK;
		}
	} else {
		bool inner_vec = cg_inner_vec(c, k);
		int32_t lastouter = -1;
		for (uint32_t i = 0; i < f; i++) {
			if (k->rmask >> i & 1) {
				per_unit *=
				    ix_estimate(c, ix_dim(c, k->fsizes[i]));
				continue;
			}
			lastouter = (int32_t)i;
		}
		k->oblk = cg_outer_blocks(c, k);
		for (uint32_t i = 0; i < f; i++) {
			if (k->rmask >> i & 1)
				continue;
			if (!inner_vec && (int32_t)i == lastouter) {
				int B = W * k->oblk;
				ext = ix_mul(
				    c, ext,
				    ix_floordiv(c,
						ix_add(c,
						       ix_dim(c, k->fsizes[i]),
						       ix_const(c, B - 1)),
						ix_const(c, B)));
				per_unit *= B;
			} else {
				ext = ix_mul(c, ext, ix_dim(c, k->fsizes[i]));
			}
		}
	}
	k->extent = dim_of(ext);
	if (per_unit < 1)
		per_unit = 1;
	int64_t grain = 16384 / per_unit;
	k->grain = grain < 1 ? 1 : grain;
}

/* ---- matrix products through BLAS ---------------------------------------- */

/* A module-level constant string under a fixed name, made on first use:
 * bodies that use it print alike (unnamed globals are numbered across the
 * module, which would make every body that names one unique). */
static LLVMValueRef mod_str(gen_t *g, const char *name, const char *text)
{
	LLVMValueRef gv = LLVMGetNamedGlobal(g->mod, name);
	if (gv != NULL)
		return gv;
	LLVMValueRef init =
	    LLVMConstStringInContext(g->ctx, text, (unsigned)strlen(text), 0);
	gv = LLVMAddGlobal(g->mod, LLVMTypeOf(init), name);
	LLVMSetInitializer(gv, init);
	LLVMSetGlobalConstant(gv, 1);
	LLVMSetLinkage(gv, LLVMPrivateLinkage);
	LLVMSetUnnamedAddr(gv, 1);
	return gv;
}

/* A module-level pointer to cblas_?gemm, found on first use with
 * dlopen(path) + dlsym on that handle (so it is the BLAS the compiler
 * probed, never another library's symbol of the same name); OpenBLAS is
 * told to stay single-threaded, as kiln's own pool runs the row blocks in
 * parallel. Racing first uses store the same pointer (monotonic atomics). */
static LLVMValueRef blas_fn(gen_t *g, bool f64)
{
	const char *gname = f64 ? "kiln_dgemm_fp" : "kiln_sgemm_fp";
	LLVMValueRef gv = LLVMGetNamedGlobal(g->mod, gname);
	if (gv == NULL) {
		gv = LLVMAddGlobal(g->mod, g->ptr, gname);
		LLVMSetInitializer(gv, LLVMConstNull(g->ptr));
		LLVMSetLinkage(gv, LLVMInternalLinkage);
		LLVMSetAlignment(gv, 8);
	}
	LLVMValueRef cur = LLVMBuildLoad2(g->b, g->ptr, gv, "");
	LLVMSetOrdering(cur, LLVMAtomicOrderingMonotonic);
	LLVMSetAlignment(cur, 8);
	LLVMBasicBlockRef here = LLVMGetInsertBlock(g->b);
	LLVMBasicBlockRef init =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blas_init");
	LLVMBasicBlockRef done =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blas_done");
	LLVMBuildCondBr(g->b, LLVMBuildIsNull(g->b, cur, ""), init, done);
	LLVMPositionBuilderAtEnd(g->b, init);
	LLVMTypeRef pt2[2] = {g->ptr, g->i32};
	LLVMTypeRef dlopen_t = LLVMFunctionType(g->ptr, pt2, 2, 0);
	LLVMValueRef dlopen_f = LLVMGetNamedFunction(g->mod, "dlopen");
	if (dlopen_f == NULL)
		dlopen_f = LLVMAddFunction(g->mod, "dlopen", dlopen_t);
	LLVMTypeRef pp[2] = {g->ptr, g->ptr};
	LLVMTypeRef dlsym_t = LLVMFunctionType(g->ptr, pp, 2, 0);
	LLVMValueRef dlsym_f = LLVMGetNamedFunction(g->mod, "dlsym");
	if (dlsym_f == NULL)
		dlsym_f = LLVMAddFunction(g->mod, "dlsym", dlsym_t);
	LLVMValueRef path = mod_str(g, "kiln_blas_path", g->c->blas);
	LLVMValueRef oargs[2] = {path,
				 LLVMConstInt(g->i32, 2 /* RTLD_NOW */, 0)};
	LLVMValueRef h = LLVMBuildCall2(g->b, dlopen_t, dlopen_f, oargs, 2, "");
	LLVMValueRef sargs[2] = {
	    h, f64 ? mod_str(g, "kiln_s_dgemm", "cblas_dgemm")
		   : mod_str(g, "kiln_s_sgemm", "cblas_sgemm")};
	LLVMValueRef fn = LLVMBuildCall2(g->b, dlsym_t, dlsym_f, sargs, 2, "");
	LLVMValueRef targs[2] = {
	    h, mod_str(g, "kiln_s_set_threads", "openblas_set_num_threads")};
	LLVMValueRef st = LLVMBuildCall2(g->b, dlsym_t, dlsym_f, targs, 2, "");
	LLVMBasicBlockRef setn =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blas_threads");
	LLVMBasicBlockRef store =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blas_store");
	LLVMBuildCondBr(g->b, LLVMBuildIsNull(g->b, st, ""), store, setn);
	LLVMPositionBuilderAtEnd(g->b, setn);
	LLVMTypeRef i32t = g->i32;
	LLVMTypeRef setn_t = LLVMFunctionType(g->voidt, &i32t, 1, 0);
	LLVMValueRef one = LLVMConstInt(g->i32, 1, 0);
	LLVMBuildCall2(g->b, setn_t, st, &one, 1, "");
	LLVMBuildBr(g->b, store);
	LLVMPositionBuilderAtEnd(g->b, store);
	LLVMValueRef sto = LLVMBuildStore(g->b, fn, gv);
	LLVMSetOrdering(sto, LLVMAtomicOrderingMonotonic);
	LLVMSetAlignment(sto, 8);
	LLVMBuildBr(g->b, done);
	LLVMPositionBuilderAtEnd(g->b, done);
	LLVMValueRef phi = LLVMBuildPhi(g->b, g->ptr, "");
	LLVMValueRef iv[2] = {cur, fn};
	LLVMBasicBlockRef ib[2] = {here, store};
	LLVMAddIncoming(phi, iv, ib, 2);
	return phi;
}

#define GEMM_MB CG_GEMM_MB /* rows of C per unit */

/* Columns of C per unit, or 0 for all of them. A product with few row
 * blocks (a convolution's W[O, C·KH·KW] @ col[.., OH·OW] at batch 1 has
 * one or two: O is 64 or 128) would otherwise run on one or two threads
 * whatever the pool's size; it is split into column blocks until there are
 * GEMM_UNITS units, each at least GEMM_NB_MIN columns wide (so each BLAS
 * call still streams whole panels) and a multiple of 16 (a cache line of
 * f32), or of CG_TG_NR (a whole panel) for the packed template. Only for
 * static M, N (and batch): a symbolic size keeps the row blocks alone. */
#define GEMM_UNITS  32
#define GEMM_NB_MIN 256

/* Whether graph node `node` is a plain product: mm, bmm, addmm or
 * baddbmm (not a convolution's, attention's or a backward op's). */
static bool plain_product(cctx_t *c, int32_t node)
{
	if (node < 0)
		return false;
	const char *op = c->g->nodes[node].op;
	return strcmp(op, "aten.mm.default") == 0 ||
	       strcmp(op, "aten.bmm.default") == 0 ||
	       strcmp(op, "aten.addmm.default") == 0 ||
	       strcmp(op, "aten.baddbmm.default") == 0;
}

/* Whether product n is a convolution's weight gradient: a product of
 * convolution_backward whose B is not row-major (gO @ colᵀ, or col @ gOᵀ
 * where few channels take it transposed). With AVX-512 BLAS the template
 * takes these as it takes plain products: ResNet-18's 3x3s (2 threads,
 * kilnc --profile, a Zen 4) 64 -> 64 at 56², batch 8, 12.1 -> 10.5 ms;
 * 128 -> 128 at 28² 11.1 -> 9.5; 256 -> 256 at 14² 10.8 -> 9.7; 512 -> 512
 * at 7² 10.0 -> 9.2 (the batch in the columns: one product). The input
 * gradient's Wᵀ @ gO stays BLAS's (as fast either way). */
static bool wgrad_product(cctx_t *c, const cnode_t *n)
{
	const lt_t *b = n->gb;
	return n->node >= 0 &&
	       strcmp(c->g->nodes[n->node].op,
		      "aten.convolution_backward.default") == 0 &&
	       !dim_is(b->strides[b->rank - 1], 1);
}

/* max-autotune's variant for a product node (autotune.c: 0 row blocks,
 * 1 row and column blocks, 2 the GEMM template), else -1 */
static int gemm_forced(cctx_t *c, int32_t node)
{
	if (c->tune == NULL || !plain_product(c, node))
		return -1;
	return c->tune[node];
}

/* The GEMM template for a product (not BLAS): f32 on 16-lane vectors.
 * B is read in place when it has unit stride along N and the part of B one
 * unit multiplies (K x its columns) is at most TG_B_MAX, so that it stays
 * in L2 while the unit's row blocks pass over it, and its rows do not
 * crowd one set of L1 (panel_thrashes). Measured with
 * max-autotune (2 threads), in-place template against the best BLAS
 * variant: 256^3 (256 KiB of B) 0.123 vs 0.131 ms, 2048x64x64 0.053 vs
 * 0.078, 128x64x256 0.014 vs 0.021, 37x100x77 0.004 both; from 512 KiB it
 * loses (panel rows ldb apart conflict in the caches): 512^3 in column
 * blocks of 256 (512 KiB) 1.244 vs 1.018, 1024^3 26.5 vs 8.4. Beyond
 * TG_B_MAX, or with B transposed, the template packs B a panel at a time
 * (tgemm_pack; compiler/README.md has the figures against BLAS). */
#define TG_B_MAX (256 * 1024)
/* ... and when it has at least CG_TG_MIN_MACS multiply-adds (cir.h) */
#define TG_MIN_MACS CG_TG_MIN_MACS
/* ... and, packing B, by the heuristic A of at most this many bytes (per
 * batch): beyond it BLAS measured as fast or faster (blocked, best of
 * three: 2048^3, 16 MiB, 47.2 vs BLAS's 45.9 ms; 512x4608x784, a batched
 * 7² convolution's product, 9 MiB, 13.9 vs 13.4; within it 1024^3 5.87 vs
 * 6.18) */
#define TG_A_MAX (8 << 20)
/* A packed product is blocked (tgemm_blocked) rather than packed a whole
 * panel at a time when A (per batch) is over TG_BLOCK_A bytes, read again
 * per panel from beyond L2 otherwise, or K over TG_PANEL_K (the panel's
 * K x 32 floats on the stack, 512 KiB). Panel vs blocked, run back to back:
 * 512^3 (1 MiB) 0.684 vs 0.699 ms, 4096x64x3136 (1 MiB) 4.56 vs 5.02,
 * linear 512x768x768 (1.5 MiB) 1.60 vs 1.68, 128x1152x784 (576 KiB) 1.02
 * vs 1.11. The bound was 2 MiB, from an older host, where against BLAS in
 * each run 1024^3 (4 MiB) took 0.95-0.98 of its time blocked vs 1.04 in
 * panels; on the Zen 5 host (32 MiB of L3; `kilnc --run --bench`, 2
 * threads, medians of two alternations) panels were as fast or faster up
 * to 8 MiB: 768x768x324 (ConvMixer's 1x1 convolutions, 2.25 MiB) 0.91 ->
 * 0.89 ms, 1024x768x2304 (GPT-2's attention input at 1024 tokens, 3 MiB)
 * 9.7 -> 7.6, 1024^3 4.36 -> 4.11, 1536x1024x1024 (6 MiB) 6.68 -> 6.28,
 * 2048x768x3072 20.7 -> 19.5, 2048x1024x512 (8 MiB) 4.42 -> 4.15,
 * 512x3072x768 5.1 either way. Past 8 MiB (where BLAS runs older
 * kernels, so that these stay the template's), panels still won with K
 * under 4096: 1024x3072x768 (12 MiB) 10.3 -> 9.65, 4096x768x768 10.6 ->
 * 9.4, 2048x2048x1024 18.6 -> 16.9, 8192x1024x1024 (32 MiB) 39.3 -> 35.4;
 * with K of 4096 blocks did: 4096x4096x512 38.6 against 46.3,
 * 2048x4096x256 9.2 against 9.5 (512x4096x1024, 8 MiB: panels 9.0
 * against 9.6). */
#define TG_BLOCK_A (8 << 20)
#define TG_BLOCK_K 4096
/* ... and where A is not row-major (transposed: its rows are a line per
 * k, M elements apart), 2 MiB, the older bound: 2048x1024x768 (8 MiB) 7.9
 * ms blocked against 10.4 in panels, 8192x1024x768 (GPT-2's LM head
 * weight gradient at 1024 tokens) 42 against 89; at 2-3 MiB within 3% of
 * each other (1024x768x768 2.95 against 3.03, 768x768x1024 3.08 against
 * 2.75) */
#define TG_BLOCK_AT (2 << 20)
/* ... and, by the heuristic, a row-major B only with at least this many
 * rows: with fewer, BLAS packs B more cheaply for them (ResNet-18's
 * batch-1 whole-image products, 128x1152x784, 256x2304x196, 128x576x784:
 * 1.06, 1.04 and 1.02 of BLAS's time; 512^3 0.86-0.93); a transposed B
 * (BLAS's slower case) at any M (linear 32x768x3072: 0.66-0.74) */
#define TG_PACK_MIN_M 512
#define TG_PANEL_K    4096

/* The column block of a product's units (0: all of N), for A and B of
 * graph node `node`; pack: B packed in panels (blocks whole panels). */
static int64_t col_block(cctx_t *c, const lt_t *a, const lt_t *b, int32_t node,
			 bool pack)
{
	uint32_t r = a->rank;
	kiln_dim_t M = a->sizes[r - 2], N = b->sizes[r - 1];
	if (M.e != NULL || N.e != NULL)
		return 0;
	int64_t batch = 1;
	if (r == 3) {
		if (a->sizes[0].e != NULL)
			return 0;
		batch = a->sizes[0].c;
	}
	/* max-autotune's choice for a product node (variant 0: row blocks
	 * alone, 1: row and column blocks; 2, the template, takes the rule),
	 * else the rule */
	int forced = gemm_forced(c, node);
	int64_t units = (M.c + GEMM_MB - 1) / GEMM_MB * (batch > 0 ? batch : 1);
	if (units <= 0 || forced == 0 || N.c < 2 * GEMM_NB_MIN ||
	    (units >= GEMM_UNITS && forced != 1))
		return 0;
	int64_t nnb = (GEMM_UNITS + units - 1) / units;
	if (nnb < 2)
		nnb = 2;
	if (nnb > N.c / GEMM_NB_MIN)
		nnb = N.c / GEMM_NB_MIN;
	if (nnb <= 1)
		return 0;
	int64_t q = pack ? CG_TG_NR : 16;
	int64_t nb = (N.c + nnb - 1) / nnb;
	nb = (nb + q - 1) / q * q;
	return nb < N.c ? nb : 0;
}

/* Whether a B panel read in place (K rows of CG_TG_NR floats, two cache
 * lines each, s = ldb·4 bytes apart) crowds a few sets of L1 (64 sets of
 * 64-byte lines, 4 KiB a way): its rows start at multiples of gcd(s,
 * 4096) within a way, so where that is 64 bytes or more they fall in
 * only 4096 / gcd(s, 4096) sets, one set where ldb is a multiple of 1024.
 * Over TG_SET_LINES lines to a set, each block of rows reads the panel
 * again from L2, and the template packs it instead (tgemm_pack).
 * `kilnc --bench`, 2 threads, in place -> packed: [8, 256, 1024] K = 64
 * (ResNet-50's 1x1 convolutions at 32², B's rows 4 KiB apart) 1.15 ->
 * 0.54 ms (992 columns in place: 0.47), 4096x64x1024 2.0-2.2 -> 1.1,
 * 512x256x512 in column blocks 0.28-0.32 -> 0.245, 1024x128x256 0.134-
 * 0.144 -> 0.125, 256^3 and 128x64x256 the same (0.063, 0.0086). */
#define TG_SET_LINES 8
static bool panel_thrashes(kiln_dim_t ldb, int64_t K)
{
	if (ldb.e != NULL)
		return false;
	int64_t a = 4096, b = ldb.c * 4 % 4096;
	while (b != 0) { /* a := gcd(s, 4096) */
		int64_t t = a % b;
		a = b;
		b = t;
	}
	int64_t sets = 4096 / a;
	return sets < 64 && 2 * K / sets > TG_SET_LINES;
}

/* The batch of a product's A (1 unbatched or symbolic): the template's
 * MAC floor counts the whole batch, whose kernel's compile it pays once
 * (RegNetY's grouped weight gradients, 20 products of 16x512x144, had
 * been BLAS's under the floor of one). */
static int64_t tmpl_batch(const lt_t *a)
{
	return a->rank == 3 && a->sizes[0].e == NULL ? a->sizes[0].c : 1;
}

/* A product of fewer than one panel of columns (N < CG_TG_NR) and an A of
 * at least TG_ONE_PANEL_A bytes is the template's unpacked form with B
 * up to TG_ONE_PANEL_B (past TG_B_MAX): it streams A once, where BLAS
 * packs all of it (read, write, read again) for its few columns.
 * ResNet-18's three 512 -> 512 3x3s at 2², batch 4 ([512, 16] K=4608, 9
 * MiB of weights, B 288 KiB), BLAS's before: 0.78-0.88 -> 0.39-0.48 ms
 * each (kilnc --profile, 2 threads, the Zen 4, two alternations; its
 * other products there had B within TG_B_MAX and the template already).
 * 512 KiB of B is half the L2 of every AVX-512 core the template runs on
 * (1 MiB and more); the floor on A keeps it to products whose A is read
 * from beyond L2. */
#define TG_ONE_PANEL_A (4 << 20)
#define TG_ONE_PANEL_B (512 * 1024)

static bool one_panel_streamed(int64_t M, int64_t K, int64_t N)
{
	return N < CG_TG_NR && M * K * 4 >= TG_ONE_PANEL_A &&
	       K * N * 4 <= TG_ONE_PANEL_B;
}

/* Whether the template takes the product as it is (B row-major, small
 * enough to stay in L2, or a few columns against a large A:
 * one_panel_streamed), by the heuristic or by max-autotune's choice. */
static bool tmpl_unpacked(cctx_t *c, const cnode_t *n)
{
	const lt_t *a = n->ga, *b = n->gb;
	uint32_t r = b->rank;
	if (!dim_is(b->strides[r - 1], 1))
		return false;
	int f = gemm_forced(c, n->node);
	kiln_dim_t M = a->sizes[r - 2], K = a->sizes[r - 1],
		   N = b->sizes[r - 1];
	bool stat = M.e == NULL && K.e == NULL && N.e == NULL;
	int64_t nb = col_block(c, a, b, n->node, false);
	bool fits = stat &&
		    (K.c * (nb > 0 ? nb : N.c) * 4 <= TG_B_MAX ||
		     (nb <= 0 && one_panel_streamed(M.c, K.c, N.c))) &&
		    !panel_thrashes(b->strides[r - 2], K.c);
	if (f >= 0) /* max-autotune: packed where B does not fit */
		return f == 2 && (fits || !stat);
	return fits && M.c * N.c * K.c * tmpl_batch(a) >= TG_MIN_MACS;
}

/* The product's form (cg_gemm_tmpl) and in *why the reason for it, as
 * --emit=kernels prints it under a heuristic's choice. Packing B (a panel
 * at a time, or blocked with A packed too) needs static sizes and at least
 * one panel of columns (narrower, most of each vector would be padding).
 * Where BLAS runs AVX-512 kernels (c->blas_avx512: OpenBLAS's SkylakeX
 * core, or a BLAS that is not OpenBLAS), by the heuristic plain products
 * only (a convolution's keeps BLAS, which packs its few rows' B faster:
 * ResNet-18's 256->512 at 14², batch 16, 512x2304x784 in column blocks of
 * 288, the blocked template 1.03-1.15 of BLAS's time; attention's and the
 * backward ops' products were not measured), a row-major B with 512 rows
 * or more and A of at most 8 MiB. Where it runs older ones (Haswell's
 * AVX2, which an OPENBLAS_CORETYPE set by the environment may ask for),
 * the template takes those too: ResNet-50's forward at batch 8, 128²,
 * 80 -> 63 ms, its 3x3 layers at 8² 2.5 -> 1.4 ms each; GPT-2's training
 * step 454 -> 357 ms (tests/bench/bench_models.py, compiler/README.md). */
static int tmpl_form(cctx_t *c, const cnode_t *n, const char **why)
{
	const lt_t *a = n->ga, *b = n->gb;
	uint32_t r = b->rank;
	const char *w = NULL;
	int form = 0;
	int64_t M = 0, K = 0, N = 0;
	bool stat = true;
	for (uint32_t d = 0; d < r; d++)
		stat = stat && a->sizes[d].e == NULL && b->sizes[d].e == NULL;
	if (stat) {
		M = a->sizes[r - 2].c;
		K = a->sizes[r - 1].c;
		N = b->sizes[r - 1].c;
	}
	int f = gemm_forced(c, n->node);
	if (n->conv != NULL)
		w = "a tiled convolution's product (ops_conv.c)";
	else if (c->bufs[n->buf].dtype != KILN_DT_F32)
		w = "BLAS: the template is f32 only";
	else if (c->vec_width != 16)
		w = "BLAS: the template needs 16-lane vectors (AVX-512)";
	else if (tmpl_unpacked(c, n)) {
		form = 1;
		w = stat && one_panel_streamed(M, K, N) && K * N * 4 > TG_B_MAX
			? "template: under 32 columns against an A of 4 MiB "
			  "or more, streamed once (BLAS would pack it), B "
			  "within 512 KiB"
			: "template: B's columns per unit fit in 256 KiB (L2), "
			  "at least 2^21 multiply-adds";
	} else if (!stat)
		w = "BLAS: symbolic sizes";
	else if (f >= 0) {
		form = f == 2 ? 2 : 0;
		w = "chosen by max-autotune";
	} else if (M * N * K * tmpl_batch(a) < TG_MIN_MACS)
		w = "BLAS: under 2^21 multiply-adds (the template's compile "
		    "costs more than it saves)";
	else if (N < CG_TG_NR)
		w = "BLAS: under 32 columns (a panel would be mostly padding)";
	else if (c->blas_avx512 && !plain_product(c, n->node) &&
		 !wgrad_product(c, n))
		w = "BLAS: not mm, bmm, addmm or baddbmm nor a weight "
		    "gradient's (a convolution's product measured faster "
		    "with AVX-512 BLAS; others unmeasured)";
	else if (c->blas_avx512 && dim_is(b->strides[r - 1], 1) &&
		 M < TG_PACK_MIN_M)
		w = "BLAS: B row-major and too large for L2, under 512 rows "
		    "(AVX-512 BLAS packs it more cheaply)";
	else if (c->blas_avx512 && M * K * 4 > TG_A_MAX)
		w = "BLAS: A over 8 MiB (AVX-512 BLAS measured as fast as the "
		    "template or faster)";
	else
		form = 2;
	/* an A that is not row-major (a transposed one: the gradient of a
	 * weight, gO^T @ x) is read a line per k in panels, its rows M
	 * elements apart: blocked past TG_BLOCK_AT, where packing it pays */
	bool a_rows = a->is_buf && dim_is(a->strides[r - 1], 1);
	bool big_a = c->tmpl_block_a > 0 ? M * K * 4 > c->tmpl_block_a
		     : !a_rows		 ? M * K * 4 > TG_BLOCK_AT
			       : M * K * 4 > TG_BLOCK_A && K >= TG_BLOCK_K;
	if (form == 2 && (K > TG_PANEL_K || big_a)) {
		form = 3;
		if (f < 0 && !c->blas_avx512)
			w = "template blocked, A and B packed: at least 2^21 "
			    "multiply-adds and 32 columns, and K over 4096, K "
			    "of 4096 with A over 8 MiB, or A over 2 MiB not "
			    "row-major (BLAS runs pre-AVX-512 kernels)";
		else if (f < 0)
			w = "template blocked, A and B packed: mm/bmm/addmm/"
			    "baddbmm or a weight gradient's, at least 2^21 "
			    "multiply-adds and 32 columns, B transposed or 512 "
			    "rows and more, A at most 8 MiB, and K over 4096 "
			    "or A over 2 MiB not row-major";
	} else if (form == 2 && f < 0 && !c->blas_avx512) {
		w = "template packing B a panel at a time: at least 2^21 "
		    "multiply-adds and 32 columns, K at most 4096, A at most "
		    "2 MiB where not row-major and 8 MiB where K is 4096 "
		    "(BLAS runs pre-AVX-512 kernels)";
	} else if (form == 2 && f < 0) {
		w = "template packing B a panel at a time: mm/bmm/addmm/"
		    "baddbmm or a weight gradient's, at least 2^21 "
		    "multiply-adds and 32 columns, B transposed or 512 rows "
		    "and more, A at most 8 MiB (2 MiB where not row-major), "
		    "K at most 4096";
	}
	if (why != NULL)
		*why = w;
	return form;
}

int cg_gemm_tmpl(cctx_t *c, const cnode_t *n)
{
	return tmpl_form(c, n, NULL);
}

const char *cg_gemm_why(cctx_t *c, const cnode_t *n)
{
	const char *w;
	tmpl_form(c, n, &w);
	return w;
}

int64_t cg_gemm_col_block(cctx_t *c, const cnode_t *n)
{
	if (n->conv != NULL)
		return 0;
	return col_block(c, n->ga, n->gb, n->node, cg_gemm_tmpl(c, n) >= 2);
}

static LLVMValueRef imax(gen_t *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, a, b, ""),
			       a, b, "");
}

static LLVMValueRef imin(gen_t *g, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, a, b, ""),
			       a, b, "");
}

/* cblas_?gemm(RowMajor, ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
 * through the pointer fn (blas_fn); sizes are i64 values, ta/tb i32 (111:
 * no transpose, 112: transpose). */
static void blas_call(gen_t *g, LLVMValueRef fn, bool f64, LLVMValueRef ta,
		      LLVMValueRef tb, const LLVMValueRef mnk[3],
		      LLVMValueRef a, LLVMValueRef lda, LLVMValueRef b,
		      LLVMValueRef ldb, LLVMValueRef c, LLVMValueRef ldc)
{
	LLVMTypeRef et = f64 ? g->f64 : g->f32;
#define I32(v) LLVMBuildTrunc(g->b, (v), g->i32, "")
	LLVMValueRef args[14] = {LLVMConstInt(g->i32, 101, 0), /* row major */
				 ta,
				 tb,
				 I32(mnk[0]),
				 I32(mnk[1]),
				 I32(mnk[2]),
				 LLVMConstReal(et, 1.0),
				 a,
				 I32(lda),
				 b,
				 I32(ldb),
				 LLVMConstReal(et, 0.0),
				 c,
				 I32(ldc)};
#undef I32
	LLVMTypeRef pt[14] = {g->i32, g->i32, g->i32, g->i32, g->i32,
			      g->i32, et,     g->ptr, g->i32, g->ptr,
			      g->i32, et,     g->ptr, g->i32};
	LLVMTypeRef ft = LLVMFunctionType(g->voidt, pt, 14, 0);
	LLVMBuildCall2(g->b, ft, fn, args, 14, "");
}

/* ---- the GEMM template: a register-tiled f32 micro-kernel ---------------
 *
 * C[M, N] = A[M, K] @ B[K, N]; B (read in place by tgemm) and C
 * row-major with unit stride along N (ldb, ldc their row strides), or B
 * packed first (tgemm_pack, tgemm_blocked: any strides); A with any
 * strides (its elements are broadcast one at a time). C is tiled in
 * blocks of TG_MR rows by TG_NV vectors of columns; each block keeps its
 * TG_MR·TG_NV accumulators in registers for the whole of K: per k, TG_NV
 * vector loads of B's row k and TG_MR broadcasts of A's column k feed
 * TG_MR·TG_NV FMAs (8 x 2 x 16 lanes on AVX-512: 16 accumulators, 10 loads
 * per 16 FMAs). Column tails are masked (B loads and C stores), so any N
 * works. When TG_MR does not divide M the last row block overlaps the one
 * before it (it writes the same values again); a static M under TG_MR is
 * one block of M rows, and where M is only known at run time (a product's
 * rows per unit) a block with fewer rows left repeats its last row. One
 * block's code in all, which keeps the template's compile cost at about
 * 10-15 ms per kernel (a separate 1-row remainder loop and blocks of K
 * doubled it). The column panel is
 * the outer loop: B's K x 32 floats stay in L2 while every row block
 * passes over them. Blocking K by 128 or 256 in place (so that B's block
 * stays in L1; C then accumulates across blocks) measured no faster on
 * resnet18's 3x3 layers (K = 576 to 2304) and was left out there (the
 * blocked form packs A as well, which made it pay); so was unrolling k
 * by 4 in the IR. */
#define TG_MR CG_TG_MR
#define TG_NV 2	 /* vectors: CG_TG_NR columns at 16 lanes */
#define TG_PF 16 /* rows of B prefetched ahead */
/* tgemm_blocked's blocks: TG_KC rows of B by TG_NC columns (512 KiB in
 * L2, a panel 64 KiB), TG_MC rows of A by TG_KC (128 KiB). Measured on
 * 2048^3, 1024^3, 512x3072x768 and 512x4608x784 against KC/NC/MC of
 * 256/512/128, 256/512/64, 512/512/64, 256/256/64, 128/1024/128 and
 * 384/384/96: 512/512/64 and 512/256/64 were best, within the noise of
 * each other (2048^3 47.8 and 48.8 ms, 256/512/128 50.9-56.2); the
 * smaller B block keeps the stack at 640 KiB. */
#define TG_KC 512
#define TG_NC 256
#define TG_MC 64
_Static_assert(TG_NC % CG_TG_NR == 0, "blocks of whole panels");
_Static_assert(TG_MC % CG_TG_MR == 0, "blocks of whole micro-panels");

/* One block of mr rows: row i of the block is row min(i, rmax) when rmax
 * is given (fewer rows than mr left: the extra rows repeat the last one,
 * computing and storing its values again), else row i. */
static void tgemm_block(gen_t *g, int mr, LLVMValueRef rmax, LLVMValueRef K,
			LLVMValueRef ar, LLVMValueRef lda, LLVMValueRef sak,
			LLVMValueRef bc, LLVMValueRef ldb, bool pf,
			LLVMValueRef accum, LLVMValueRef cr, LLVMValueRef ldc,
			const LLVMValueRef *mask, int vw)
{
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, (unsigned)vw);
	LLVMTypeRef over[2] = {vt, g->ptr};
	LLVMValueRef row[TG_MR];
	for (int i = 0; i < mr; i++) {
		row[i] = LLVMConstInt(g->i64, (uint64_t)i, 0);
		if (rmax != NULL)
			row[i] = imin(g, row[i], rmax);
	}
	/* accumulators: zero, or where accum is true at run time C's values
	 * (a later block of K adding to them) */
	LLVMValueRef acc[TG_MR][TG_NV];
	for (int i = 0; i < mr; i++)
		for (int v = 0; v < TG_NV; v++) {
			acc[i][v] = entry_alloca(g, vt);
			LLVMValueRef init = LLVMConstNull(vt);
			if (accum != NULL) {
				LLVMValueRef o = LLVMBuildAdd(
				    g->b, LLVMBuildMul(g->b, row[i], ldc, ""),
				    LLVMConstInt(g->i64, (uint64_t)(v * vw), 0),
				    "");
				LLVMValueRef args[4] = {
				    LLVMBuildGEP2(g->b, et, cr, &o, 1, ""),
				    LLVMConstInt(g->i32, 4, 0),
				    LLVMBuildAnd(g->b, mask[v],
						 cg_splat(g, accum, vw), ""),
				    LLVMConstNull(vt)};
				init = cg_intr(g, "llvm.masked.load", over, 2,
					       args, 4);
			}
			LLVMBuildStore(g->b, init, acc[i][v]);
		}
	loop_t Kl;
	loop_begin(g, &Kl, LLVMConstInt(g->i64, 0, 0), K, 1);
	LLVMValueRef brow = LLVMBuildMul(g->b, Kl.i, ldb, "");
	/* B's row k + TG_PF asked for now (read, to L1): the panel's rows
	 * are ldb apart, too far for the hardware prefetchers to run ahead
	 * (256->256 at 14², K = 2304: 17.8-19.2 -> 16.6-17.2 ms; distances 4
	 * and 8 less, K = 576 layers unchanged). Past the panel's end a
	 * prefetch does not fault. A packed panel's rows are contiguous: no
	 * prefetch. */
	for (int v = 0; v < TG_NV && pf; v++) {
		LLVMValueRef o = LLVMBuildAdd(
		    g->b,
		    LLVMBuildMul(g->b,
				 LLVMBuildAdd(g->b, Kl.i,
					      LLVMConstInt(g->i64, TG_PF, 0),
					      ""),
				 ldb, ""),
		    LLVMConstInt(g->i64, (uint64_t)(v * vw), 0), "");
		LLVMValueRef pa[4] = {LLVMBuildGEP2(g->b, et, bc, &o, 1, ""),
				      LLVMConstInt(g->i32, 0, 0),
				      LLVMConstInt(g->i32, 3, 0),
				      LLVMConstInt(g->i32, 1, 0)};
		LLVMTypeRef pt = g->ptr;
		cg_intr(g, "llvm.prefetch", &pt, 1, pa, 4);
	}
	LLVMValueRef bv[TG_NV];
	for (int v = 0; v < TG_NV; v++) {
		LLVMValueRef o = LLVMBuildAdd(
		    g->b, brow, LLVMConstInt(g->i64, (uint64_t)(v * vw), 0),
		    "");
		LLVMValueRef args[4] = {LLVMBuildGEP2(g->b, et, bc, &o, 1, ""),
					LLVMConstInt(g->i32, 4, 0), mask[v],
					LLVMConstNull(vt)};
		bv[v] = cg_intr(g, "llvm.masked.load", over, 2, args, 4);
	}
	for (int i = 0; i < mr; i++) {
		LLVMValueRef o =
		    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row[i], lda, ""),
				 LLVMBuildMul(g->b, Kl.i, sak, ""), "");
		LLVMValueRef as = cg_splat(
		    g,
		    LLVMBuildLoad2(g->b, et,
				   LLVMBuildGEP2(g->b, et, ar, &o, 1, ""), ""),
		    vw);
		for (int v = 0; v < TG_NV; v++) {
			LLVMValueRef fa[3] = {
			    as, bv[v], LLVMBuildLoad2(g->b, vt, acc[i][v], "")};
			LLVMBuildStore(g->b,
				       cg_intr(g, "llvm.fma", &vt, 1, fa, 3),
				       acc[i][v]);
		}
	}
	loop_end(g, &Kl);
	for (int i = 0; i < mr; i++)
		for (int v = 0; v < TG_NV; v++) {
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, LLVMBuildMul(g->b, row[i], ldc, ""),
			    LLVMConstInt(g->i64, (uint64_t)(v * vw), 0), "");
			LLVMValueRef args[4] = {
			    LLVMBuildLoad2(g->b, vt, acc[i][v], ""),
			    LLVMBuildGEP2(g->b, et, cr, &o, 1, ""),
			    LLVMConstInt(g->i32, 4, 0), mask[v]};
			cg_intr(g, "llvm.masked.store", over, 2, args, 4);
		}
}

/* Row blocks [0, M) of one column panel, of mr rows each: the last one
 * overlaps the one before it (M >= mr), or, with clamp (M only known at
 * run time, perhaps under mr), starts at max(M - mr, 0) and repeats its
 * last row as needed. */
static void tgemm_rows(gen_t *g, int mr, bool clamp, LLVMValueRef M,
		       LLVMValueRef K, LLVMValueRef a, LLVMValueRef lda,
		       LLVMValueRef sak, LLVMValueRef bc, LLVMValueRef ldb,
		       bool pf, LLVMValueRef cc, LLVMValueRef ldc,
		       const LLVMValueRef *mask, int vw)
{
	LLVMTypeRef et = g->f32;
	LLVMValueRef mrv = LLVMConstInt(g->i64, (uint64_t)mr, 0);
	LLVMValueRef zero = LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef nblk = udiv_up(g, M, mr);
	loop_t I;
	loop_begin(g, &I, zero, nblk, 1);
	/* block i's first row: i·mr, the last block's M - mr (or 0) */
	LLVMValueRef r0 = imin(g, LLVMBuildMul(g->b, I.i, mrv, ""),
			       imax(g, LLVMBuildSub(g->b, M, mrv, ""), zero));
	LLVMValueRef rmax =
	    clamp ? LLVMBuildSub(g->b, LLVMBuildSub(g->b, M, r0, ""),
				 LLVMConstInt(g->i64, 1, 0), "")
		  : NULL;
	LLVMValueRef ao = LLVMBuildMul(g->b, r0, lda, "");
	LLVMValueRef co = LLVMBuildMul(g->b, r0, ldc, "");
	tgemm_block(g, mr, rmax, K, LLVMBuildGEP2(g->b, et, a, &ao, 1, ""), lda,
		    sak, bc, ldb, pf, NULL,
		    LLVMBuildGEP2(g->b, et, cc, &co, 1, ""), ldc, mask, vw);
	loop_end(g, &I);
}

/* Vector v of row k of a packed panel (TG_NV vectors of vw floats a row,
 * 64-byte aligned) := val. */
static void tg_panel_store(gen_t *g, LLVMValueRef pk, LLVMValueRef k, int v,
			   int vw, LLVMValueRef val)
{
	LLVMValueRef o = LLVMBuildAdd(
	    g->b,
	    LLVMBuildMul(g->b, k,
			 LLVMConstInt(g->i64, (uint64_t)(TG_NV * vw), 0), ""),
	    LLVMConstInt(g->i64, (uint64_t)(v * vw), 0), "");
	LLVMValueRef st = LLVMBuildStore(
	    g->b, val, LLVMBuildGEP2(g->b, g->f32, pk, &o, 1, ""));
	LLVMSetAlignment(st, 64);
}

/* Lanes [s·u, ..) of x's and y's units of u floats, interleaved: x's
 * unit s, y's unit s, x's unit s + 1, .. (16 lanes in all). */
static LLVMValueRef il_units(gen_t *g, LLVMValueRef x, LLVMValueRef y, int u,
			     int s)
{
	LLVMValueRef m[16];
	for (int l = 0; l < 16; l++) {
		int pair = l / (2 * u), side = (l / u) % 2, e = l % u;
		m[l] = LLVMConstInt(
		    g->i32, (uint64_t)(side * 16 + (s + pair) * u + e), 0);
	}
	return LLVMBuildShuffleVector(g->b, x, y, LLVMConstVector(m, 16), "");
}

/* tgemm_pack's panel for a B with unit stride along k (a transposed
 * weight, x @ Wᵀ: column j is row j of W), 16 k at a time: each of the
 * panel's 32 columns' 16 floats by one vector load, then two 16x16
 * transposes in registers (four rounds of sixteen two-vector zips,
 * rows i and i + 8 each), so panel row k is two vector stores; columns
 * past N read column N - 1 and are stored as 0. Returns the first k left
 * (a multiple of 16), for the gathers. The gathers, 16 rows of W a
 * vector, ran at about 4 GB/s where W's rows are a multiple of 4 KiB
 * apart (K of 1024, 2048, 3072: each of a panel's 32 lines in one L1
 * set, evicted before its next float is read): ResNet-50's classifier,
 * [8, 2048] @ [2048, 1000], 1.3 ms. */
static LLVMValueRef pack_bt_rows(gen_t *g, LLVMValueRef K, LLVMValueRef b,
				 LLVMValueRef sbn, LLVMValueRef j,
				 LLVMValueRef N, LLVMValueRef pk,
				 const LLVMValueRef *mask)
{
	_Static_assert(TG_NV == 2, "a panel of two 16-lane vectors");
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, 16);
	LLVMValueRef last = LLVMBuildSub(g->b, N, K64(g, 1), "");
	LLVMValueRef rp[32];
	for (int l = 0; l < 32; l++) {
		LLVMValueRef col =
		    imin(g, LLVMBuildAdd(g->b, j, K64(g, l), ""), last);
		LLVMValueRef o = LLVMBuildMul(g->b, col, sbn, "");
		rp[l] = LLVMBuildGEP2(g->b, et, b, &o, 1, "");
	}
	LLVMValueRef zero = LLVMConstNull(vt);
	loop_t Kv;
	loop_begin(g, &Kv, K64(g, 0),
		   LLVMBuildAnd(g->b, K, K64(g, ~(int64_t)15), ""), 16);
	for (int v = 0; v < TG_NV; v++) {
		LLVMValueRef r[16], t[16];
		for (int l = 0; l < 16; l++) {
			r[l] = LLVMBuildLoad2(g->b, vt,
					      LLVMBuildGEP2(g->b, et,
							    rp[v * 16 + l],
							    &Kv.i, 1, ""),
					      "");
			LLVMSetAlignment(r[l], 4);
		}
		/* after four rounds vector kk holds (column l, k + kk) in
		 * lane l */
		for (int round = 0; round < 4; round++) {
			for (int i = 0; i < 8; i++) {
				t[2 * i] = il_units(g, r[i], r[i + 8], 1, 0);
				t[2 * i + 1] =
				    il_units(g, r[i], r[i + 8], 1, 8);
			}
			memcpy(r, t, sizeof(r));
		}
		for (int kk = 0; kk < 16; kk++)
			tg_panel_store(
			    g, pk, LLVMBuildAdd(g->b, Kv.i, K64(g, kk), ""), v,
			    16,
			    LLVMBuildSelect(g->b, mask[v], r[kk], zero, ""));
	}
	loop_end(g, &Kv);
	return LLVMBuildLoad2(g->b, g->i64, Kv.iv, "");
}

/* Copies B's columns [j, j + nr) (masks: those under N), element (k, j)
 * at b[k·ldb + j·sbn], to the panel pk: row k at pk[k·nr], zeros past N.
 * Unit sbn: masked vector loads; unit ldb (a transposed weight): loads
 * and transposes in registers (pack_bt_rows); else gathers. */
static void tgemm_pack(gen_t *g, LLVMValueRef K, LLVMValueRef b,
		       LLVMValueRef ldb, LLVMValueRef sbn, bool unit,
		       LLVMValueRef j, LLVMValueRef N, LLVMValueRef pk,
		       const LLVMValueRef *mask, int vw)
{
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, (unsigned)vw);
	LLVMTypeRef pvt = LLVMVectorType(g->ptr, (unsigned)vw);
	LLVMTypeRef over[2] = {vt, g->ptr}, gover[2] = {vt, pvt};
	LLVMValueRef lane[TG_NV];
	LLVMValueRef k0 = K64(g, 0);
	if (!unit && vw == 16 && LLVMIsAConstantInt(ldb) &&
	    LLVMConstIntGetZExtValue(ldb) == 1)
		k0 = pack_bt_rows(g, K, b, sbn, j, N, pk, mask);
	if (!unit) {
		/* lane l of vector v: column j + v·vw + l, at (..)·sbn */
		for (int v = 0; v < TG_NV; v++) {
			LLVMValueRef ls[64];
			for (int l = 0; l < vw; l++)
				ls[l] = LLVMConstInt(g->i64,
						     (uint64_t)(v * vw + l), 0);
			LLVMValueRef col =
			    LLVMBuildAdd(g->b, cg_splat(g, j, vw),
					 LLVMConstVector(ls, (unsigned)vw), "");
			lane[v] =
			    LLVMBuildMul(g->b, col, cg_splat(g, sbn, vw), "");
		}
	}
	loop_t Kl;
	loop_begin(g, &Kl, k0, K, 1);
	LLVMValueRef row = LLVMBuildMul(g->b, Kl.i, ldb, "");
	for (int v = 0; v < TG_NV; v++) {
		LLVMValueRef val;
		if (unit) {
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, LLVMBuildAdd(g->b, row, j, ""),
			    LLVMConstInt(g->i64, (uint64_t)(v * vw), 0), "");
			LLVMValueRef args[4] = {
			    LLVMBuildGEP2(g->b, et, b, &o, 1, ""),
			    LLVMConstInt(g->i32, 4, 0), mask[v],
			    LLVMConstNull(vt)};
			val = cg_intr(g, "llvm.masked.load", over, 2, args, 4);
		} else {
			LLVMValueRef o = LLVMBuildAdd(g->b, lane[v],
						      cg_splat(g, row, vw), "");
			LLVMValueRef args[4] = {
			    LLVMBuildGEP2(g->b, et, b, &o, 1, ""),
			    LLVMConstInt(g->i32, 4, 0), mask[v],
			    LLVMConstNull(vt)};
			val =
			    cg_intr(g, "llvm.masked.gather", gover, 2, args, 4);
		}
		tg_panel_store(g, pk, Kl.i, v, vw, val);
	}
	loop_end(g, &Kl);
}

/* The masks of the TG_NV vectors of the column panel at j: vector v's
 * the low min(max(N - j - v·vw, 0), vw) bits. */
static void tg_masks(gen_t *g, LLVMValueRef N, LLVMValueRef j,
		     LLVMValueRef *mask, int vw)
{
	LLVMTypeRef mt = LLVMIntTypeInContext(g->ctx, (unsigned)vw);
	for (int v = 0; v < TG_NV; v++) {
		LLVMValueRef left = LLVMBuildSub(
		    g->b, N,
		    LLVMBuildAdd(g->b, j,
				 LLVMConstInt(g->i64, (uint64_t)(v * vw), 0),
				 ""),
		    "");
		left = imax(
		    g, imin(g, left, LLVMConstInt(g->i64, (uint64_t)vw, 0)),
		    LLVMConstInt(g->i64, 0, 0));
		/* (1 << left) - 1 in i64, then truncated */
		LLVMValueRef bits = LLVMBuildSub(
		    g->b,
		    LLVMBuildShl(g->b, LLVMConstInt(g->i64, 1, 0), left, ""),
		    LLVMConstInt(g->i64, 1, 0), "");
		mask[v] =
		    LLVMBuildBitCast(g->b, LLVMBuildTrunc(g->b, bits, mt, ""),
				     LLVMVectorType(g->i1, (unsigned)vw), "");
	}
}

/* M: static (ms >= 0; a convolution's O) or only known at run time (ms <
 * 0; a product's rows per unit, which may be under TG_MR: the one block
 * then repeats its last row). A element (i, k) is a[i·lda + k·sak]. B
 * element (k, j) at b[k·ldb + j] read in place, or with a panel scratch
 * pk (K x nr floats, 64-byte aligned) at b[k·ldb + j·sbn], each panel
 * copied there first (tgemm_pack) and read from there. */
static void tgemm(gen_t *g, int64_t ms, LLVMValueRef M, LLVMValueRef N,
		  LLVMValueRef K, LLVMValueRef a, LLVMValueRef lda,
		  LLVMValueRef sak, LLVMValueRef b, LLVMValueRef ldb,
		  LLVMValueRef pk, LLVMValueRef sbn, bool unit, LLVMValueRef c,
		  LLVMValueRef ldc)
{
	LLVMTypeRef et = g->f32;
	int vw = g->c->vec_width;
	int64_t nr = (int64_t)vw * TG_NV;
	if (ms == 0)
		return;
	/* whole steps of nr up to N rounded up (the masks cut the last) */
	loop_t J;
	loop_begin(g, &J, LLVMConstInt(g->i64, 0, 0),
		   LLVMBuildAdd(g->b, N,
				LLVMConstInt(g->i64, (uint64_t)nr - 1, 0), ""),
		   nr);
	LLVMValueRef mask[TG_NV];
	tg_masks(g, N, J.i, mask, vw);
	LLVMValueRef bc = LLVMBuildGEP2(g->b, et, b, &J.i, 1, "");
	LLVMValueRef bld = ldb;
	if (pk != NULL) {
		tgemm_pack(g, K, b, ldb, sbn, unit, J.i, N, pk, mask, vw);
		bc = pk;
		bld = LLVMConstInt(g->i64, (uint64_t)nr, 0);
	}
	LLVMValueRef cc = LLVMBuildGEP2(g->b, et, c, &J.i, 1, "");
	tgemm_rows(g, ms >= 0 && ms < TG_MR ? (int)ms : TG_MR, ms < 0, M, K, a,
		   lda, sak, bc, bld, pk == NULL, cc, ldc, mask, vw);
	loop_end(g, &J);
}

/* tgemm_pack_a's micro-panel for an A with unit stride along k, 16 k at
 * a time: the TG_MR (8) rows' 16 floats by one vector load each, then an
 * 8x16 transpose in registers (three rounds of eight two-vector
 * shuffles: units of 1, 2 and 4 floats interleaved) gives 8 vectors of
 * two k's each, stored contiguously to dst (k·MR + i). rows: the rows'
 * offsets (<TG_MR x i64>). Returns the first k left (a multiple of 16),
 * for the gathers. A gather of 8 per k cost about a tenth of the blocked
 * template's time on a convolution's W (512 x 4608). */
static LLVMValueRef pack_a_rows(gen_t *g, LLVMValueRef a, LLVMValueRef rows,
				LLVMValueRef kc, LLVMValueRef dst)
{
	_Static_assert(TG_MR == 8, "an 8x16 transpose");
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, 16);
	LLVMValueRef rp[8];
	for (int l = 0; l < 8; l++) {
		LLVMValueRef o = LLVMBuildExtractElement(
		    g->b, rows, LLVMConstInt(g->i32, (uint64_t)l, 0), "");
		rp[l] = LLVMBuildGEP2(g->b, et, a, &o, 1, "");
	}
	loop_t Kv;
	loop_begin(g, &Kv, LLVMConstInt(g->i64, 0, 0), kc, 16);
	LLVMValueRef r[8], p[8], q[8];
	for (int l = 0; l < 8; l++) {
		r[l] = LLVMBuildLoad2(
		    g->b, vt, LLVMBuildGEP2(g->b, et, rp[l], &Kv.i, 1, ""), "");
		LLVMSetAlignment(r[l], 4);
	}
	/* p: row pairs over k 0..7 and 8..15; q: quads over k by fours */
	for (int j = 0; j < 4; j++) {
		p[2 * j] = il_units(g, r[2 * j], r[2 * j + 1], 1, 0);
		p[2 * j + 1] = il_units(g, r[2 * j], r[2 * j + 1], 1, 8);
	}
	for (int j = 0; j < 2; j++)
		for (int h = 0; h < 2; h++) {
			q[4 * j + 2 * h] =
			    il_units(g, p[4 * j + h], p[4 * j + 2 + h], 2, 0);
			q[4 * j + 2 * h + 1] =
			    il_units(g, p[4 * j + h], p[4 * j + 2 + h], 2, 4);
		}
	/* q[j·4 + f]: rows 4j..4j+3 over k 4f..4f+3 */
	LLVMValueRef o0 = LLVMBuildMul(g->b, Kv.i, K64(g, TG_MR), "");
	for (int f = 0; f < 4; f++)
		for (int h = 0; h < 2; h++) {
			LLVMValueRef v = il_units(g, q[f], q[4 + f], 4, 2 * h);
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, o0, K64(g, (int64_t)(f * 2 + h) * 16), "");
			LLVMValueRef st = LLVMBuildStore(
			    g->b, v, LLVMBuildGEP2(g->b, et, dst, &o, 1, ""));
			LLVMSetAlignment(st, 4);
		}
	loop_end(g, &Kv);
	return LLVMBuildLoad2(g->b, g->i64, Kv.iv, "");
}

/* A's rows [0, mc) by columns [0, kc) (element (i, k) at a[i·lda +
 * k·sak]) to ap in micro-panels of TG_MR rows: (i, k) at (i / MR)·kc·MR +
 * k·MR + i % MR, rows past mc repeating row mc - 1; one gather of MR
 * elements per k. */
static void tgemm_pack_a(gen_t *g, LLVMValueRef mc, LLVMValueRef kc,
			 LLVMValueRef a, LLVMValueRef lda, LLVMValueRef sak,
			 LLVMValueRef ap)
{
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, TG_MR);
	LLVMTypeRef over[2] = {vt, LLVMVectorType(g->ptr, TG_MR)};
	LLVMValueRef mrv = LLVMConstInt(g->i64, TG_MR, 0);
	LLVMValueRef one = LLVMConstInt(g->i64, 1, 0);
	LLVMValueRef nblk = udiv_up(g, mc, TG_MR);
	loop_t I;
	loop_begin(g, &I, LLVMConstInt(g->i64, 0, 0), nblk, 1);
	/* the rows' offsets, min(I·MR + l, mc - 1)·lda */
	LLVMValueRef ls[TG_MR];
	for (int l = 0; l < TG_MR; l++)
		ls[l] = LLVMConstInt(g->i64, (uint64_t)l, 0);
	LLVMValueRef rows = LLVMBuildAdd(
	    g->b, cg_splat(g, LLVMBuildMul(g->b, I.i, mrv, ""), TG_MR),
	    LLVMConstVector(ls, TG_MR), "");
	LLVMValueRef last = cg_splat(g, LLVMBuildSub(g->b, mc, one, ""), TG_MR);
	rows = LLVMBuildSelect(g->b,
			       LLVMBuildICmp(g->b, LLVMIntSLT, rows, last, ""),
			       rows, last, "");
	rows = LLVMBuildMul(g->b, rows, cg_splat(g, lda, TG_MR), "");
	LLVMValueRef base =
	    LLVMBuildMul(g->b, LLVMBuildMul(g->b, I.i, kc, ""), mrv, "");
	LLVMValueRef all[TG_MR];
	for (int l = 0; l < TG_MR; l++)
		all[l] = LLVMConstInt(g->i1, 1, 0);
	LLVMValueRef k0 = LLVMConstInt(g->i64, 0, 0);
	if (LLVMIsAConstantInt(sak) && LLVMConstIntGetZExtValue(sak) == 1 &&
	    g->c->vec_width == 16)
		k0 = pack_a_rows(g, a, rows, kc,
				 LLVMBuildGEP2(g->b, et, ap, &base, 1, ""));
	loop_t Kl;
	loop_begin(g, &Kl, k0, kc, 1);
	LLVMValueRef o = LLVMBuildAdd(
	    g->b, rows, cg_splat(g, LLVMBuildMul(g->b, Kl.i, sak, ""), TG_MR),
	    "");
	LLVMValueRef args[4] = {LLVMBuildGEP2(g->b, et, a, &o, 1, ""),
				LLVMConstInt(g->i32, 4, 0),
				LLVMConstVector(all, TG_MR), LLVMConstNull(vt)};
	LLVMValueRef v = cg_intr(g, "llvm.masked.gather", over, 2, args, 4);
	LLVMValueRef so =
	    LLVMBuildAdd(g->b, base, LLVMBuildMul(g->b, Kl.i, mrv, ""), "");
	LLVMValueRef st =
	    LLVMBuildStore(g->b, v, LLVMBuildGEP2(g->b, et, ap, &so, 1, ""));
	LLVMSetAlignment(st, 32);
	loop_end(g, &Kl);
	loop_end(g, &I);
}

/* A loop over [0, n) in blocks of `step` (loop_begin takes whole steps:
 * the bound rounded up); returns the block's length, the last one cut
 * short. */
static LLVMValueRef block_begin(gen_t *g, loop_t *L, LLVMValueRef n,
				int64_t step)
{
	LLVMValueRef st = LLVMConstInt(g->i64, (uint64_t)step, 0);
	loop_begin(g, L, LLVMConstInt(g->i64, 0, 0),
		   LLVMBuildAdd(g->b, n,
				LLVMConstInt(g->i64, (uint64_t)step - 1, 0),
				""),
		   step);
	return imin(g, st, LLVMBuildSub(g->b, n, L->i, ""));
}

/* Block i of nb over the np panels of nr columns of an N-column
 * product, the panels [i·np / nb, (i + 1)·np / nb) (widths within a
 * panel of each other): its first column *j0 and its *nc columns (the
 * last block cut at N). */
static void panel_block(gen_t *g, LLVMValueRef i, LLVMValueRef np,
			LLVMValueRef nb, LLVMValueRef N, int64_t nr,
			LLVMValueRef *j0, LLVMValueRef *nc)
{
	LLVMValueRef p0 =
	    LLVMBuildUDiv(g->b, LLVMBuildMul(g->b, i, np, ""), nb, "");
	LLVMValueRef p1 = LLVMBuildUDiv(
	    g->b,
	    LLVMBuildMul(g->b, LLVMBuildAdd(g->b, i, K64(g, 1), ""), np, ""),
	    nb, "");
	*j0 = LLVMBuildMul(g->b, p0, K64(g, nr), "");
	*nc = LLVMBuildSub(
	    g->b, imin(g, LLVMBuildMul(g->b, p1, K64(g, nr), ""), N), *j0, "");
}

/* A convolution's B for implicit GEMM (gen_conv_implicit_body): element
 * (k, j) of im2col(x)[C·KH·KW, N·OH·OW], k = (ch, kh, kw) and j = (n, oh,
 * ow), is x[n, ch, oh·sh - ph + kh·dh, ow·sw - pw + kw·dw], 0 in the
 * padding; col0 is the first column of B the caller's block starts at. */
typedef struct tg_convb {
	const convspec_t *cs;
	LLVMValueRef x;	   /* the input's first element */
	LLVMValueRef col0; /* i64 */
	int64_t xs[4];	   /* the input's strides, in elements */
} tg_convb_t;

/* tgemm_pack for implicit GEMM: rows [k0, k0 + kc) of B's panel of
 * columns col .. col + CG_TG_NR to pk, gathered from x with 32-bit
 * offsets (ops_conv.c checks they fit). Per panel each lane's image,
 * output row and column, and its offset without the tap; per k the tap's
 * (ch, kh, kw) as scalars, so a vector of the panel costs two adds, two
 * range checks and one masked gather (lanes in the padding, and past
 * the last column, are 0). */
static void tgemm_pack_conv(gen_t *g, const tg_convb_t *cb, LLVMValueRef k0,
			    LLVMValueRef kc, LLVMValueRef col, LLVMValueRef pk,
			    const LLVMValueRef *mask, int vw)
{
	const convspec_t *cs = cb->cs;
	LLVMTypeRef et = g->f32, vt = LLVMVectorType(et, (unsigned)vw);
	LLVMTypeRef over[2] = {vt, LLVMVectorType(g->ptr, (unsigned)vw)};
#define S32(v) cg_splat(g, LLVMConstInt(g->i32, (uint64_t)(v), 1), vw)
	LLVMValueRef c32 = LLVMBuildTrunc(g->b, col, g->i32, "");
	LLVMValueRef ihb[TG_NV], iwb[TG_NV], base[TG_NV];
	for (int v = 0; v < TG_NV; v++) {
		LLVMValueRef ls[64];
		for (int l = 0; l < vw; l++)
			ls[l] = LLVMConstInt(g->i32, (uint64_t)(v * vw + l), 0);
		LLVMValueRef j =
		    LLVMBuildAdd(g->b, cg_splat(g, c32, vw),
				 LLVMConstVector(ls, (unsigned)vw), "");
		LLVMValueRef P = S32(cs->OH * cs->OW);
		LLVMValueRef ni = LLVMBuildUDiv(g->b, j, P, "");
		LLVMValueRef pi = LLVMBuildURem(g->b, j, P, "");
		LLVMValueRef oh = LLVMBuildUDiv(g->b, pi, S32(cs->OW), "");
		LLVMValueRef ow = LLVMBuildURem(g->b, pi, S32(cs->OW), "");
		ihb[v] = LLVMBuildSub(g->b,
				      LLVMBuildMul(g->b, oh, S32(cs->s[0]), ""),
				      S32(cs->p[0]), "");
		iwb[v] = LLVMBuildSub(g->b,
				      LLVMBuildMul(g->b, ow, S32(cs->s[1]), ""),
				      S32(cs->p[1]), "");
		base[v] = LLVMBuildAdd(
		    g->b, LLVMBuildMul(g->b, ni, S32(cb->xs[0]), ""),
		    LLVMBuildAdd(
			g->b, LLVMBuildMul(g->b, ihb[v], S32(cb->xs[2]), ""),
			LLVMBuildMul(g->b, iwb[v], S32(cb->xs[3]), ""), ""),
		    "");
	}
	loop_t Kl;
	loop_begin(g, &Kl, LLVMConstInt(g->i64, 0, 0), kc, 1);
	LLVMValueRef kk = LLVMBuildAdd(g->b, k0, Kl.i, "");
	LLVMValueRef ch = LLVMBuildUDiv(g->b, kk, K64(g, cs->KH * cs->KW), "");
	LLVMValueRef kr = LLVMBuildURem(g->b, kk, K64(g, cs->KH * cs->KW), "");
	LLVMValueRef dh =
	    LLVMBuildMul(g->b, LLVMBuildUDiv(g->b, kr, K64(g, cs->KW), ""),
			 K64(g, cs->d[0]), "");
	LLVMValueRef dw =
	    LLVMBuildMul(g->b, LLVMBuildURem(g->b, kr, K64(g, cs->KW), ""),
			 K64(g, cs->d[1]), "");
	LLVMValueRef koff = LLVMBuildAdd(
	    g->b, LLVMBuildMul(g->b, ch, K64(g, cb->xs[1]), ""),
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, dh, K64(g, cb->xs[2]), ""),
			 LLVMBuildMul(g->b, dw, K64(g, cb->xs[3]), ""), ""),
	    "");
	LLVMValueRef dhv =
	    cg_splat(g, LLVMBuildTrunc(g->b, dh, g->i32, ""), vw);
	LLVMValueRef dwv =
	    cg_splat(g, LLVMBuildTrunc(g->b, dw, g->i32, ""), vw);
	LLVMValueRef kov =
	    cg_splat(g, LLVMBuildTrunc(g->b, koff, g->i32, ""), vw);
	/* lane l reading lane 0's element + l·sw, one masked load (two and
	 * a permute at stride 2: load_strided) instead of a gather: over an
	 * x contiguous along W, where a vector's lanes lie in one output row
	 * (OW a multiple of the lanes; panels start at multiples of them),
	 * or at stride 1 with rows as wide as the input's, whose positions
	 * run on from row to row, in one image (OH·OW a multiple of the
	 * lanes). RegNetY-800MF's 3x3 convolutions in groups of 16, batch 8
	 * (2 threads): at 32² 0.60 -> 0.26 ms, the stride-2 one into 32²
	 * 1.60 -> 0.69, at 8² 0.37 -> 0.19; its inference 17.3 -> 13.6 ms */
	int64_t ls = cs->s[1];
	bool rowv = cb->xs[3] == 1 &&
		    ((cs->OW % vw == 0 && ls <= CG_MAX_STRIDE) ||
		     (cs->s[0] == 1 && ls == 1 && cs->W == cs->OW &&
		      cb->xs[2] == cs->W && cs->OH * cs->OW % vw == 0));
	for (int v = 0; v < TG_NV; v++) {
		/* unsigned: a negative row or column is out of range too */
		LLVMValueRef ih = LLVMBuildAdd(g->b, ihb[v], dhv, "");
		LLVMValueRef iw = LLVMBuildAdd(g->b, iwb[v], dwv, "");
		LLVMValueRef m = LLVMBuildAnd(
		    g->b, mask[v],
		    LLVMBuildAnd(
			g->b,
			LLVMBuildICmp(g->b, LLVMIntULT, ih, S32(cs->H), ""),
			LLVMBuildICmp(g->b, LLVMIntULT, iw, S32(cs->W), ""),
			""),
		    "");
		LLVMValueRef o = LLVMBuildAdd(g->b, base[v], kov, "");
		LLVMValueRef val;
		if (rowv) {
			LLVMValueRef o0 = LLVMBuildSExt(
			    g->b,
			    LLVMBuildExtractElement(
				g->b, o, LLVMConstInt(g->i32, 0, 0), ""),
			    g->i64, "");
			val = load_strided(
			    g, LLVMBuildGEP2(g->b, et, cb->x, &o0, 1, ""), ls,
			    m, KILN_DT_F32, vw);
		} else {
			LLVMValueRef args[4] = {
			    LLVMBuildGEP2(g->b, et, cb->x, &o, 1, ""),
			    LLVMConstInt(g->i32, 4, 0), m, LLVMConstNull(vt)};
			val =
			    cg_intr(g, "llvm.masked.gather", over, 2, args, 4);
		}
		tg_panel_store(g, pk, Kl.i, v, vw, val);
	}
#undef S32
	loop_end(g, &Kl);
}

/* C[M, N] = A @ B blocked and packed as BLIS does, for a B too large for
 * L2 or transposed: per block of TG_NC columns and TG_KC rows of B, its
 * panels are packed to bp (tgemm_pack: kc x CG_TG_NR floats each, 64 KiB,
 * in L2 while the register tiles pass over them); per block of TG_MC rows of
 * A, those rows' kc columns to ap (tgemm_pack_a: micro-panels of TG_MR
 * rows, contiguous broadcasts, kept in L2); the tiles of a later block of
 * K add to C. A element (i, k) at a[i·lda + k·sak], B's (k, j) at
 * b[k·ldb + j·sbn] (unit: sbn is 1 or N is 1), or with cb a convolution's
 * im2col, packed from its input (tgemm_pack_conv; b, ldb, sbn unused). K
 * is static. */
static void tgemm_blocked(gen_t *g, LLVMValueRef M, LLVMValueRef N, int64_t K,
			  LLVMValueRef a, LLVMValueRef lda, LLVMValueRef sak,
			  LLVMValueRef b, LLVMValueRef ldb, LLVMValueRef sbn,
			  bool unit, LLVMValueRef c, LLVMValueRef ldc,
			  LLVMValueRef bp, LLVMValueRef ap,
			  const tg_convb_t *cb)
{
	LLVMTypeRef et = g->f32;
	int vw = g->c->vec_width;
	int64_t nr = (int64_t)vw * TG_NV;
	LLVMValueRef zero = LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef one = LLVMConstInt(g->i64, 1, 0);
	LLVMValueRef mrv = LLVMConstInt(g->i64, TG_MR, 0);
	LLVMValueRef nrv = LLVMConstInt(g->i64, (uint64_t)nr, 0);
	loop_t JC, PC, J, IC, J2, I;
	/* N's P panels in ncb = ceil(P / (NC / nr)) blocks, block JC the
	 * panels [JC·P / ncb, (JC + 1)·P / ncb): widths within a panel of
	 * each other, at most NC. A last block of a few columns would pack
	 * A again for little work (512x2304x784 in column blocks of 288:
	 * 256 + 32 measured 1.13-1.15 of BLAS's time, as one block 1.03) */
	LLVMValueRef nrm1 = LLVMConstInt(g->i64, (uint64_t)nr - 1, 0);
	LLVMValueRef np = udiv_up(g, N, nr);
	int64_t bpn = TG_NC / nr; /* panels per block at most */
	LLVMValueRef ncb = udiv_up(g, np, bpn);
	loop_begin(g, &JC, zero, ncb, 1);
	LLVMValueRef j0, nc;
	panel_block(g, JC.i, np, ncb, N, nr, &j0, &nc);
	LLVMValueRef kc =
	    block_begin(g, &PC, LLVMConstInt(g->i64, (uint64_t)K, 0), TG_KC);
	LLVMValueRef accum = LLVMBuildICmp(g->b, LLVMIntSGT, PC.i, zero, "");
	LLVMValueRef bblk = NULL;
	if (cb == NULL) {
		LLVMValueRef bo =
		    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, PC.i, ldb, ""),
				 LLVMBuildMul(g->b, j0, sbn, ""), "");
		bblk = LLVMBuildGEP2(g->b, et, b, &bo, 1, "");
	}
	LLVMValueRef mask[TG_NV];
	/* B's block: panel J at bp + J·kc */
	LLVMValueRef ncr = LLVMBuildAdd(g->b, nc, nrm1, "");
	loop_begin(g, &J, zero, ncr, nr);
	tg_masks(g, nc, J.i, mask, vw);
	LLVMValueRef po = LLVMBuildMul(g->b, J.i, kc, "");
	LLVMValueRef pdst = LLVMBuildGEP2(g->b, et, bp, &po, 1, "");
	if (cb != NULL)
		tgemm_pack_conv(g, cb, PC.i, kc,
				LLVMBuildAdd(g->b, cb->col0,
					     LLVMBuildAdd(g->b, j0, J.i, ""),
					     ""),
				pdst, mask, vw);
	else
		tgemm_pack(g, kc, bblk, ldb, sbn, unit, J.i, nc, pdst, mask,
			   vw);
	loop_end(g, &J);
	/* A's blocks of rows, each packed, then every tile over them */
	LLVMValueRef mc = block_begin(g, &IC, M, TG_MC);
	LLVMValueRef ao = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, IC.i, lda, ""),
				       LLVMBuildMul(g->b, PC.i, sak, ""), "");
	tgemm_pack_a(g, mc, kc, LLVMBuildGEP2(g->b, et, a, &ao, 1, ""), lda,
		     sak, ap);
	loop_begin(g, &J2, zero, ncr, nr);
	tg_masks(g, nc, J2.i, mask, vw);
	LLVMValueRef pj = LLVMBuildMul(g->b, J2.i, kc, "");
	LLVMValueRef bc = LLVMBuildGEP2(g->b, et, bp, &pj, 1, "");
	LLVMValueRef nblk = udiv_up(g, mc, TG_MR);
	loop_begin(g, &I, zero, nblk, 1);
	LLVMValueRef r0 = LLVMBuildMul(g->b, I.i, mrv, "");
	/* the block's last row: fewer than MR left repeat it */
	LLVMValueRef rmax =
	    LLVMBuildSub(g->b, LLVMBuildSub(g->b, mc, r0, ""), one, "");
	LLVMValueRef apo =
	    LLVMBuildMul(g->b, LLVMBuildMul(g->b, I.i, kc, ""), mrv, "");
	LLVMValueRef co = LLVMBuildAdd(
	    g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, IC.i, r0, ""), ldc, ""),
	    LLVMBuildAdd(g->b, j0, J2.i, ""), "");
	tgemm_block(g, TG_MR, rmax, kc,
		    LLVMBuildGEP2(g->b, et, ap, &apo, 1, ""), one, mrv, bc, nrv,
		    false, accum, LLVMBuildGEP2(g->b, et, c, &co, 1, ""), ldc,
		    mask, vw);
	loop_end(g, &I);
	loop_end(g, &J2);
	loop_end(g, &IC);
	loop_end(g, &PC);
	loop_end(g, &JC);
}

/* Calls the product kernel's epilogue (the kernel after it, whose body is
 * generated first: sched.c fuse_epilogues) on units [u0, u1) of its
 * extent; its reads of the product's buffer pbuf go to prod instead (NULL:
 * the buffer itself). */
static void call_epilogue(gen_t *g, uint32_t pbuf, LLVMValueRef prod,
			  LLVMValueRef u0, LLVMValueRef u1)
{
	const kernel_t *ek = g->k + 1;
	char ename[48];
	snprintf(ename, sizeof(ename), "%s_body", ek->name);
	LLVMValueRef ef = LLVMGetNamedFunction(g->mod, ename);
	LLVMValueRef eargs[CG_MAX_ARGS + 3];
	for (uint32_t i = 0; i < ek->n_args; i++)
		eargs[i] = prod != NULL && ek->args[i] == pbuf
			       ? prod
			       : buf_ptr(g, ek->args[i]);
	eargs[ek->n_args] = g->syms;
	eargs[ek->n_args + 1] = u0;
	eargs[ek->n_args + 2] = u1;
	LLVMBuildCall2(g->b, LLVMGlobalGetValueType(ef), ef, eargs,
		       ek->n_args + 3, "");
}

/* One unit: rows [m0, m0 + MB) of batch bi. Operand layout per matrix:
 * unit stride on its last dim → "no transpose" with the other stride as
 * the leading dimension; else (unit stride on the second-to-last dim) →
 * "transpose". */
static void gen_gemm_body(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const lt_t *a = n->ga, *b = n->gb;
	const cbuf_t *cb = &c->bufs[n->buf];
	bool f64 = cb->dtype == KILN_DT_F64;
	LLVMTypeRef et = f64 ? g->f64 : g->f32;
	uint32_t r = a->rank;
	LLVMValueRef M = emit_ix(g, ix_dim(c, a->sizes[r - 2]));
	LLVMValueRef K = emit_ix(g, ix_dim(c, a->sizes[r - 1]));
	LLVMValueRef N = emit_ix(g, ix_dim(c, b->sizes[r - 1]));
#define DIMV(t, k) emit_ix(g, ix_dim(c, (t)->strides[k]))
	LLVMValueRef sam = DIMV(a, r - 2), sak = DIMV(a, r - 1);
	LLVMValueRef sbk = DIMV(b, r - 2), sbn = DIMV(b, r - 1);
	LLVMValueRef sab = r == 3 ? DIMV(a, 0) : LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef sbb = r == 3 ? DIMV(b, 0) : LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef offa = emit_ix(g, ix_dim(c, a->offset));
	LLVMValueRef offb = emit_ix(g, ix_dim(c, b->offset));
#undef DIMV
	LLVMValueRef one = LLVMConstInt(g->i64, 1, 0);
	/* A: no-transpose when its k stride is 1 (or K == 1) */
	LLVMValueRef a_nt =
	    LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, sak, one, ""),
			LLVMBuildICmp(g->b, LLVMIntEQ, K, one, ""), "");
	LLVMValueRef b_nt =
	    LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, sbn, one, ""),
			LLVMBuildICmp(g->b, LLVMIntEQ, N, one, ""), "");
	LLVMValueRef nmb = udiv_up(g, M, GEMM_MB);
	nmb = imax(g, nmb, one);
	int64_t nb_c = cg_gemm_col_block(c, n);
	/* column blocks: nnb of NB columns (one of all N when unblocked) */
	LLVMValueRef NB =
	    nb_c > 0 ? LLVMConstInt(g->i64, (uint64_t)nb_c, 0) : N;
	LLVMValueRef nnb =
	    nb_c > 0 ? LLVMConstInt(
			   g->i64,
			   (uint64_t)((b->sizes[r - 1].c + nb_c - 1) / nb_c), 0)
		     : one;
	/* the product of a unit: the GEMM template, or BLAS */
	int tk = cg_gemm_tmpl(c, n);
	bool tmpl = tk != 0;
	LLVMValueRef fn = tmpl ? NULL : blas_fn(g, f64);
	/* the packed template's panel: K x CG_TG_NR floats */
	int64_t kst = a->sizes[r - 1].c;
	bool blocked = tk == 3;
	LLVMValueRef pk = NULL;
	LLVMValueRef pa = NULL;
	if (blocked) {
		pk = entry_alloca(g,
				  LLVMArrayType(et, (unsigned)(TG_KC * TG_NC)));
		pa = entry_alloca(g,
				  LLVMArrayType(et, (unsigned)(TG_MC * TG_KC)));
		LLVMSetAlignment(pa, 64);
	} else if (tk == 2) { /* K <= TG_PANEL_K: at most 512 KiB */
		pk = entry_alloca(
		    g, LLVMArrayType(et, (unsigned)(kst * CG_TG_NR)));
	}
	if (pk != NULL)
		LLVMSetAlignment(pk, 64);
	/* with an epilogue: each 64-row block goes to a scratch, and the
	 * epilogue runs on those rows (its body reading the product from
	 * there) */
	bool epi = g->k->has_epilogue;
	LLVMValueRef scratch = NULL;
	if (epi) {
		scratch = entry_alloca(
		    g,
		    LLVMArrayType(et, (unsigned)(GEMM_MB * b->sizes[r - 1].c)));
		LLVMSetAlignment(scratch, 64);
	}
	/* units: (batch, column block, row block), row blocks fastest; one
	 * BLAS call per (batch, column block) for the whole [begin, end)
	 * range of row blocks a task gets (a call per 64-row block would
	 * repack B each time) */
	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef gi = LLVMBuildUDiv(g->b, U.i, nmb, "");
	LLVMValueRef bi = LLVMBuildUDiv(g->b, gi, nnb, "");
	LLVMValueRef n0 =
	    LLVMBuildMul(g->b, LLVMBuildURem(g->b, gi, nnb, ""), NB, "");
	LLVMValueRef ncols = LLVMBuildSub(g->b, N, n0, "");
	ncols = LLVMBuildSelect(g->b,
				LLVMBuildICmp(g->b, LLVMIntSLT, ncols, NB, ""),
				ncols, NB, "");
	LLVMValueRef bstart = LLVMBuildMul(g->b, gi, nmb, "");
	LLVMValueRef bend = LLVMBuildAdd(g->b, bstart, nmb, "");
	LLVMValueRef last = LLVMBuildSelect(
	    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, end, bend, ""), end, bend,
	    "");
	if (epi) /* one block at a time: the scratch holds one */
		last = LLVMBuildAdd(g->b, U.i, one, "");
	LLVMValueRef mbk = LLVMConstInt(g->i64, GEMM_MB, 0);
	LLVMValueRef m0 =
	    LLVMBuildMul(g->b, LLVMBuildSub(g->b, U.i, bstart, ""), mbk, "");
	LLVMValueRef m1 =
	    LLVMBuildMul(g->b, LLVMBuildSub(g->b, last, bstart, ""), mbk, "");
	m1 = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, m1, M, ""),
			     m1, M, "");
	LLVMValueRef rows = LLVMBuildSub(g->b, m1, m0, "");
	LLVMValueRef aoff =
	    LLVMBuildAdd(g->b, offa,
			 LLVMBuildAdd(g->b, LLVMBuildMul(g->b, bi, sab, ""),
				      LLVMBuildMul(g->b, m0, sam, ""), ""),
			 "");
	LLVMValueRef boff =
	    LLVMBuildAdd(g->b, offb,
			 LLVMBuildAdd(g->b, LLVMBuildMul(g->b, bi, sbb, ""),
				      LLVMBuildMul(g->b, n0, sbn, ""), ""),
			 "");
	LLVMValueRef coff = LLVMBuildAdd(
	    g->b, LLVMBuildMul(g->b, bi, LLVMBuildMul(g->b, M, N, ""), ""),
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, m0, N, ""), n0, ""), "");
	LLVMValueRef ap =
	    LLVMBuildGEP2(g->b, et, buf_ptr(g, n->ga->buf), &aoff, 1, "");
	LLVMValueRef bp =
	    LLVMBuildGEP2(g->b, et, buf_ptr(g, n->gb->buf), &boff, 1, "");
	LLVMValueRef zero = LLVMConstInt(g->i64, 0, 0);
	LLVMValueRef cp =
	    epi ? LLVMBuildGEP2(g->b, et, scratch, &zero, 1, "")
		: LLVMBuildGEP2(g->b, et, buf_ptr(g, n->buf), &coff, 1, "");
	/* leading dimensions, at least what BLAS requires */
	LLVMValueRef lda =
	    LLVMBuildSelect(g->b, a_nt, imax(g, sam, imax(g, K, one)),
			    imax(g, sak, imax(g, rows, one)), "");
	LLVMValueRef ldb =
	    LLVMBuildSelect(g->b, b_nt, imax(g, sbk, imax(g, N, one)),
			    imax(g, sbn, imax(g, K, one)), "");
	LLVMValueRef ta =
	    LLVMBuildSelect(g->b, a_nt, LLVMConstInt(g->i32, 111, 0),
			    LLVMConstInt(g->i32, 112, 0), "");
	LLVMValueRef tb =
	    LLVMBuildSelect(g->b, b_nt, LLVMConstInt(g->i32, 111, 0),
			    LLVMConstInt(g->i32, 112, 0), "");
	LLVMBasicBlockRef call =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "gemm_call");
	LLVMBasicBlockRef skip =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "gemm_skip");
	LLVMValueRef ok =
	    LLVMBuildAnd(g->b,
			 LLVMBuildICmp(g->b, LLVMIntSGT, rows,
				       LLVMConstInt(g->i64, 0, 0), ""),
			 LLVMBuildICmp(g->b, LLVMIntSGT, ncols,
				       LLVMConstInt(g->i64, 0, 0), ""),
			 "");
	if (!tmpl)
		ok = LLVMBuildAnd(g->b, LLVMBuildIsNotNull(g->b, fn, ""), ok,
				  "");
	LLVMBuildCondBr(g->b, ok, call, skip);
	LLVMPositionBuilderAtEnd(g->b, call);
	if (tmpl) {
		/* B in place (unit stride along N), or packed (any strides)
		 * a panel at a time into pk, or blocked with A packed too;
		 * A any strides */
		bool unit =
		    dim_is(b->strides[r - 1], 1) || dim_is(b->sizes[r - 1], 1);
		if (blocked)
			tgemm_blocked(g, rows, ncols, kst, ap, sam, sak, bp,
				      sbk, sbn, unit, cp, imax(g, N, one), pk,
				      pa, NULL);
		else
			tgemm(g, -1, rows, ncols, K, ap, sam, sak, bp, sbk, pk,
			      sbn, unit, cp, imax(g, N, one));
	} else {
		LLVMValueRef mnk[3] = {rows, ncols, K};
		blas_call(g, fn, f64, ta, tb, mnk, ap, lda, bp, ldb, cp,
			  imax(g, N, one));
	}
	if (epi) {
		/* the epilogue over rows [bi·M + m0, + rows) of its extent,
		 * the product's buffer being the scratch less that offset */
		LLVMValueRef row0 =
		    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, bi, M, ""), m0, "");
		LLVMValueRef back =
		    LLVMBuildNeg(g->b, LLVMBuildMul(g->b, row0, N, ""), "");
		call_epilogue(g, n->buf,
			      LLVMBuildGEP2(g->b, et, scratch, &back, 1, ""),
			      row0, LLVMBuildAdd(g->b, row0, rows, ""));
	}
	LLVMBuildBr(g->b, skip);
	LLVMPositionBuilderAtEnd(g->b, skip);
	/* next: the first block of the next batch (or the end) */
	LLVMBuildStore(g->b, last, U.iv);
	LLVMBuildBr(g->b, U.cond);
	LLVMPositionBuilderAtEnd(g->b, U.exit);
	memo_clear(g);
}

/* ---- convolution: im2col tiles multiplied in place ----------------------- */

static int64_t conv_tiles(const convspec_t *cs)
{
	return (cs->OH + cs->rows - 1) / cs->rows;
}

/* One unit u = (image, tile of `rows` output rows). The tile's columns,
 * col[ckk, r·OW + ow] for ckk = (c, kh, kw), go to a stack scratch of
 * [C·KH·KW, rows·OW] elements (at most CONV_TILE_BYTES: ops_conv.c only
 * takes this template when one output row's columns fit): per (ckk,
 * output row), over a unit-stride row at a stride of 1 to CG_MAX_STRIDE,
 * whole vectors of masked loads (load_strided beyond 1: a stride-2 stem
 * convolution's tiles had been one element at a time; 0 where the tap
 * falls in the padding; the vector past the row's end lands on the next
 * row's start, written after it, or on the scratch's one vector of
 * slack); otherwise zeros, a strided loop and zeros again; then out[n, :, tile]
 * = W @ col with ldc = OH·OW, by the GEMM template (tgemm, when ops_conv.c
 * chose it) or one ?gemm call. */
static void gen_conv_body(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const convspec_t *cs = n->conv;
	const lt_t *wt = n->ga, *xt = n->gb;
	bool f64 = c->bufs[n->buf].dtype == KILN_DT_F64;
	LLVMTypeRef et = f64 ? g->f64 : g->f32;
	unsigned esz = f64 ? 8 : 4;
	int64_t CKK = cs->C * cs->KH * cs->KW, P = cs->OH * cs->OW;
	int64_t T = conv_tiles(cs);
	/* vector width; the scratch has one vector of slack for the last
	 * row's whole-vector stores */
	int vw = g->c->vec_width > 1 ? (int)g->c->vec_width / (f64 ? 2 : 1) : 1;
	if (vw < 1)
		vw = 1;
	LLVMValueRef scratch = entry_alloca(
	    g, LLVMArrayType(et, (unsigned)(CKK * cs->rows * cs->OW + vw)));
	LLVMSetAlignment(scratch, 64);
	LLVMValueRef xs[4];
	for (int k = 0; k < 4; k++)
		xs[k] = emit_ix(g, ix_dim(c, xt->strides[k]));
	LLVMValueRef xoff = emit_ix(g, ix_dim(c, xt->offset));
	LLVMValueRef woff = emit_ix(g, ix_dim(c, wt->offset));
	LLVMValueRef lda = emit_ix(g, ix_dim(c, wt->strides[0]));
	/* unit_w: a row of taps is a unit-stride row of x; else, with x's
	 * rows contiguous and a stride of 2-4, every s-th element of one
	 * (load_strided) */
	bool unit_w = dim_is(xt->strides[3], 1) && cs->s[1] == 1;
	bool vec_w = unit_w || (dim_is(xt->strides[3], 1) && vw > 1 &&
				cs->s[1] <= CG_MAX_STRIDE);
	LLVMValueRef xp = buf_ptr(g, xt->buf), wp = buf_ptr(g, wt->buf),
		     op = buf_ptr(g, n->buf);
	/* the product: the GEMM template (ops_conv.c chose it) or BLAS */
	bool tmpl = cs->tmpl && !f64 && vw > 1;
	LLVMValueRef fn = tmpl ? NULL : blas_fn(g, f64);
	LLVMValueRef zero8 = LLVMConstInt(g->i8, 0, 0);

	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef ti = LLVMBuildURem(g->b, U.i, K64(g, T), "");
	LLVMValueRef ni = LLVMBuildUDiv(g->b, U.i, K64(g, T), "");
	LLVMValueRef oh0 = LLVMBuildMul(g->b, ti, K64(g, cs->rows), "");
	LLVMValueRef nr = imin(g, K64(g, cs->rows),
			       LLVMBuildSub(g->b, K64(g, cs->OH), oh0, ""));
	LLVMValueRef pt = LLVMBuildMul(g->b, nr, K64(g, cs->OW), "");
	LLVMValueRef xn =
	    LLVMBuildAdd(g->b, xoff, LLVMBuildMul(g->b, ni, xs[0], ""), "");

	/* im2col of the tile: one row of the scratch per ckk */
	loop_t Kl;
	loop_begin(g, &Kl, K64(g, 0), K64(g, CKK), 1);
	LLVMValueRef ck = Kl.i;
	LLVMValueRef ch = LLVMBuildUDiv(g->b, ck, K64(g, cs->KH * cs->KW), "");
	LLVMValueRef kh =
	    LLVMBuildURem(g->b, LLVMBuildUDiv(g->b, ck, K64(g, cs->KW), ""),
			  K64(g, cs->KH), "");
	LLVMValueRef kw = LLVMBuildURem(g->b, ck, K64(g, cs->KW), "");
	/* iw = ow·sw + iwo; in range for ow in [lo, hi) */
	LLVMValueRef iwo =
	    LLVMBuildSub(g->b, LLVMBuildMul(g->b, kw, K64(g, cs->d[1]), ""),
			 K64(g, cs->p[1]), "");
	/* lo = ceil(-iwo / sw) when iwo < 0, else 0 */
	LLVMValueRef neg = LLVMBuildSub(g->b, K64(g, 0), iwo, "");
	LLVMValueRef lo = LLVMBuildSDiv(
	    g->b, LLVMBuildAdd(g->b, neg, K64(g, cs->s[1] - 1), ""),
	    K64(g, cs->s[1]), "");
	lo = imax(g, lo, K64(g, 0));
	lo = imin(g, lo, K64(g, cs->OW));
	/* hi = floor((W - 1 - iwo) / sw) + 1 when W - 1 - iwo >= 0, else 0 */
	LLVMValueRef room = LLVMBuildSub(g->b, K64(g, cs->W - 1), iwo, "");
	LLVMValueRef hi = LLVMBuildAdd(
	    g->b,
	    LLVMBuildSDiv(g->b, imax(g, room, K64(g, 0)), K64(g, cs->s[1]), ""),
	    K64(g, 1), "");
	hi = LLVMBuildSelect(
	    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, room, K64(g, 0), ""),
	    K64(g, 0), hi, "");
	hi = imin(g, hi, K64(g, cs->OW));
	hi = imax(g, hi, lo);
	LLVMValueRef xc =
	    LLVMBuildAdd(g->b, xn, LLVMBuildMul(g->b, ch, xs[1], ""), "");
	LLVMValueRef rowk = LLVMBuildMul(g->b, ck, pt, "");
	loop_t R;
	loop_begin(g, &R, K64(g, 0), nr, 1);
	LLVMValueRef ih = LLVMBuildAdd(
	    g->b,
	    LLVMBuildMul(g->b, LLVMBuildAdd(g->b, oh0, R.i, ""),
			 K64(g, cs->s[0]), ""),
	    LLVMBuildSub(g->b, LLVMBuildMul(g->b, kh, K64(g, cs->d[0]), ""),
			 K64(g, cs->p[0]), ""),
	    "");
	LLVMValueRef didx = LLVMBuildAdd(
	    g->b, rowk, LLVMBuildMul(g->b, R.i, K64(g, cs->OW), ""), "");
	LLVMValueRef dst = LLVMBuildGEP2(g->b, et, scratch, &didx, 1, "");
	LLVMValueRef inh = LLVMBuildAnd(
	    g->b, LLVMBuildICmp(g->b, LLVMIntSGE, ih, K64(g, 0), ""),
	    LLVMBuildICmp(g->b, LLVMIntSLT, ih, K64(g, cs->H), ""), "");
	LLVMBasicBlockRef bin =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "conv_in");
	LLVMBasicBlockRef bpad =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "conv_pad");
	LLVMBasicBlockRef bnext =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "conv_next");
	LLVMBuildCondBr(g->b, inh, bin, bpad);
	/* whole vectors over [0, OW rounded up to vw): the slack past a
	 * row is the next row's start, written after it (or the scratch's
	 * slack) */
	int64_t owv = (cs->OW + vw - 1) / vw * vw;
	LLVMTypeRef vt = LLVMVectorType(et, (unsigned)vw);
	LLVMPositionBuilderAtEnd(g->b, bpad);
	if (vec_w) {
		loop_t Z;
		loop_begin(g, &Z, K64(g, 0), K64(g, owv), vw);
		LLVMValueRef st =
		    LLVMBuildStore(g->b, LLVMConstNull(vt),
				   LLVMBuildGEP2(g->b, et, dst, &Z.i, 1, ""));
		LLVMSetAlignment(st, esz);
		loop_end(g, &Z);
	} else {
		LLVMBuildMemSet(g->b, dst, zero8, K64(g, cs->OW * (int64_t)esz),
				4);
	}
	LLVMBuildBr(g->b, bnext);
	LLVMPositionBuilderAtEnd(g->b, bin);
	LLVMValueRef xrow =
	    LLVMBuildAdd(g->b, xc, LLVMBuildMul(g->b, ih, xs[2], ""), "");
	if (vec_w) {
		/* iw = ow·sw + iwo: lanes in [lo, hi) load x[.., ow·sw + iwo],
		 * the others are 0 (masked lanes are not read) */
		LLVMValueRef lanes[16];
		for (int l = 0; l < vw; l++)
			lanes[l] = LLVMConstInt(g->i64, (uint64_t)l, 0);
		LLVMValueRef lv = LLVMConstVector(lanes, (unsigned)vw);
		LLVMValueRef lov = cg_splat(g, lo, vw);
		LLVMValueRef hiv = cg_splat(g, hi, vw);
		LLVMValueRef sbase = LLVMBuildAdd(g->b, xrow, iwo, "");
		loop_t V;
		loop_begin(g, &V, K64(g, 0), K64(g, owv), vw);
		LLVMValueRef idx =
		    LLVMBuildAdd(g->b, cg_splat(g, V.i, vw), lv, "");
		LLVMValueRef mask = LLVMBuildAnd(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSGE, idx, lov, ""),
		    LLVMBuildICmp(g->b, LLVMIntSLT, idx, hiv, ""), "");
		LLVMValueRef si = LLVMBuildAdd(
		    g->b, sbase, LLVMBuildMul(g->b, V.i, K64(g, cs->s[1]), ""),
		    "");
		LLVMValueRef src = LLVMBuildGEP2(g->b, et, xp, &si, 1, "");
		LLVMValueRef v =
		    load_strided(g, src, cs->s[1], mask,
				 f64 ? KILN_DT_F64 : KILN_DT_F32, vw);
		LLVMValueRef st = LLVMBuildStore(
		    g->b, v, LLVMBuildGEP2(g->b, et, dst, &V.i, 1, ""));
		LLVMSetAlignment(st, esz);
		loop_end(g, &V);
	} else {
		LLVMValueRef esz_v = K64(g, esz);
		LLVMBuildMemSet(g->b, dst, zero8,
				LLVMBuildMul(g->b, lo, esz_v, ""), 4);
		LLVMValueRef tail = LLVMBuildGEP2(g->b, et, dst, &hi, 1, "");
		LLVMBuildMemSet(
		    g->b, tail, zero8,
		    LLVMBuildMul(g->b,
				 LLVMBuildSub(g->b, K64(g, cs->OW), hi, ""),
				 esz_v, ""),
		    4);
		loop_t Wl;
		loop_begin(g, &Wl, lo, hi, 1);
		LLVMValueRef iw = LLVMBuildAdd(
		    g->b, LLVMBuildMul(g->b, Wl.i, K64(g, cs->s[1]), ""), iwo,
		    "");
		LLVMValueRef si = LLVMBuildAdd(
		    g->b, xrow, LLVMBuildMul(g->b, iw, xs[3], ""), "");
		LLVMValueRef v = LLVMBuildLoad2(
		    g->b, et, LLVMBuildGEP2(g->b, et, xp, &si, 1, ""), "");
		LLVMBuildStore(g->b, v,
			       LLVMBuildGEP2(g->b, et, dst, &Wl.i, 1, ""));
		loop_end(g, &Wl);
	}
	LLVMBuildBr(g->b, bnext);
	LLVMPositionBuilderAtEnd(g->b, bnext);
	loop_end(g, &R);
	loop_end(g, &Kl);

	/* out[n, :, oh0·OW ..] = W @ col (ldc = OH·OW) */
	LLVMValueRef coff =
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, ni, K64(g, cs->O * P), ""),
			 LLVMBuildMul(g->b, oh0, K64(g, cs->OW), ""), "");
	LLVMValueRef zero = K64(g, 0);
	LLVMValueRef sp = LLVMBuildGEP2(g->b, et, scratch, &zero, 1, "");
	LLVMBasicBlockRef call =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "conv_gemm");
	LLVMBasicBlockRef skip =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "conv_skip");
	if (tmpl) {
		LLVMBuildBr(g->b, call);
		LLVMPositionBuilderAtEnd(g->b, call);
		tgemm(g, cs->O, K64(g, cs->O), pt, K64(g, CKK),
		      LLVMBuildGEP2(g->b, et, wp, &woff, 1, ""), lda, K64(g, 1),
		      sp, pt, NULL, NULL, true,
		      LLVMBuildGEP2(g->b, et, op, &coff, 1, ""), K64(g, P));
	} else {
		LLVMBuildCondBr(g->b, LLVMBuildIsNotNull(g->b, fn, ""), call,
				skip);
		LLVMPositionBuilderAtEnd(g->b, call);
		LLVMValueRef nt =
		    LLVMConstInt(g->i32, 111, 0); /* no transpose */
		LLVMValueRef mnk[3] = {K64(g, cs->O), pt, K64(g, CKK)};
		blas_call(g, fn, f64, nt, nt, mnk,
			  LLVMBuildGEP2(g->b, et, wp, &woff, 1, ""),
			  imax(g, lda, K64(g, CKK)), sp, imax(g, pt, K64(g, 1)),
			  LLVMBuildGEP2(g->b, et, op, &coff, 1, ""), K64(g, P));
	}
	if (g->k->has_epilogue) {
		/* the epilogue (sched.c fuse_epilogues) on the tile's rows of
		 * each output channel: units (n·O + o)·OH + oh0 .. + nr of
		 * its [N, O, OH, OW] extent */
		loop_t E;
		loop_begin(g, &E, K64(g, 0), K64(g, cs->O), 1);
		LLVMValueRef u0 = LLVMBuildAdd(
		    g->b,
		    LLVMBuildMul(
			g->b,
			LLVMBuildAdd(g->b,
				     LLVMBuildMul(g->b, ni, K64(g, cs->O), ""),
				     E.i, ""),
			K64(g, cs->OH), ""),
		    oh0, "");
		call_epilogue(g, n->buf, NULL, u0,
			      LLVMBuildAdd(g->b, u0, nr, ""));
		loop_end(g, &E);
	}
	LLVMBuildBr(g->b, skip);
	LLVMPositionBuilderAtEnd(g->b, skip);
	loop_end(g, &U);
}

/* Implicit GEMM's units: the N·OH·OW columns' panels in blocks of at
 * most TG_NC columns, their widths within a panel of each other (as
 * tgemm_blocked splits them); each unit packs its B block once per block
 * of K and passes every row of W over it. Smaller blocks, for more
 * units, pack W again for each: ResNet-18's 512->512 at 7², batch 16,
 * 784 columns in 4 units 13.0-13.2 ms, in 7 (4 panels each) 14.9-15.3. */
int64_t cg_conv_implicit_units(int64_t cols)
{
	int64_t np = (cols + CG_TG_NR - 1) / CG_TG_NR;
	int64_t bpn = TG_NC / CG_TG_NR;
	return (np + bpn - 1) / bpn;
}

static int64_t conv_implicit_units(const convspec_t *cs)
{
	return cs->G * cg_conv_implicit_units(cs->N * cs->OH * cs->OW);
}

/* One unit u of conv_implicit_units: out[:, j0 .. j0 + nc) = W @
 * im2col(x)[:, j0 .. j0 + nc) by the blocked template, whose B blocks
 * tgemm_pack_conv gathers from x (so the im2col never reaches memory).
 * With groups, unit u is group g = u / (units a group) and its block of
 * columns: W's rows [g·Og, (g + 1)·Og) over x's channels from g·Cg. */
static void gen_conv_implicit_body(gen_t *g, LLVMValueRef begin,
				   LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const convspec_t *cs = n->conv;
	const lt_t *wt = n->ga, *xt = n->gb;
	LLVMTypeRef et = g->f32;
	int64_t NP = cs->N * cs->OH * cs->OW,
		CKK = cs->C / cs->G * cs->KH * cs->KW, Og = cs->O / cs->G;
	int64_t np = (NP + CG_TG_NR - 1) / CG_TG_NR;
	int64_t nub = cg_conv_implicit_units(NP);
	LLVMValueRef bp =
	    entry_alloca(g, LLVMArrayType(et, (unsigned)(TG_KC * TG_NC)));
	LLVMValueRef ap =
	    entry_alloca(g, LLVMArrayType(et, (unsigned)(TG_MC * TG_KC)));
	LLVMSetAlignment(bp, 64);
	LLVMSetAlignment(ap, 64);
	tg_convb_t cb = {.cs = cs};
	for (int k = 0; k < 4; k++)
		cb.xs[k] = xt->strides[k].c;
	LLVMValueRef xoff = emit_ix(g, ix_dim(c, xt->offset));
	LLVMValueRef xp =
	    LLVMBuildGEP2(g->b, et, buf_ptr(g, xt->buf), &xoff, 1, "");
	LLVMValueRef woff = emit_ix(g, ix_dim(c, wt->offset));
	LLVMValueRef wp =
	    LLVMBuildGEP2(g->b, et, buf_ptr(g, wt->buf), &woff, 1, "");
	LLVMValueRef lda = emit_ix(g, ix_dim(c, wt->strides[0]));
	LLVMValueRef sak = emit_ix(g, ix_dim(c, wt->strides[1]));
	LLVMValueRef op = buf_ptr(g, n->buf);
	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef gi = K64(g, 0), ui = U.i;
	if (cs->G > 1) {
		gi = LLVMBuildUDiv(g->b, U.i, K64(g, nub), "");
		ui = LLVMBuildURem(g->b, U.i, K64(g, nub), "");
	}
	LLVMValueRef j0, nc;
	panel_block(g, ui, K64(g, np), K64(g, nub), K64(g, NP), CG_TG_NR, &j0,
		    &nc);
	cb.col0 = j0;
	LLVMValueRef r0 = LLVMBuildMul(g->b, gi, K64(g, Og), "");
	LLVMValueRef xg =
	    LLVMBuildMul(g->b, gi, K64(g, cs->C / cs->G * cb.xs[1]), "");
	cb.x = LLVMBuildGEP2(g->b, et, xp, &xg, 1, "");
	LLVMValueRef wg = LLVMBuildMul(g->b, r0, lda, "");
	LLVMValueRef og =
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, r0, K64(g, NP), ""), j0, "");
	tgemm_blocked(
	    g, K64(g, Og), nc, CKK, LLVMBuildGEP2(g->b, et, wp, &wg, 1, ""),
	    lda, sak, NULL, NULL, NULL, false,
	    LLVMBuildGEP2(g->b, et, op, &og, 1, ""), K64(g, NP), bp, ap, &cb);
	loop_end(g, &U);
}

/* The sum of a vector's w lanes, halves added pairwise. */
static LLVMValueRef hsum(gen_t *g, LLVMValueRef v, int w)
{
	while (w > 1) {
		int h = w / 2;
		LLVMValueRef lo[16], hi[16];
		for (int l = 0; l < h; l++) {
			lo[l] = LLVMConstInt(g->i32, (uint64_t)l, 0);
			hi[l] = LLVMConstInt(g->i32, (uint64_t)(l + h), 0);
		}
		LLVMValueRef u = LLVMGetUndef(LLVMTypeOf(v));
		v = LLVMBuildFAdd(
		    g->b,
		    LLVMBuildShuffleVector(
			g->b, v, u, LLVMConstVector(lo, (unsigned)h), ""),
		    LLVMBuildShuffleVector(
			g->b, v, u, LLVMConstVector(hi, (unsigned)h), ""),
		    "");
		w = h;
	}
	return LLVMBuildExtractElement(g->b, v, LLVMConstInt(g->i32, 0, 0), "");
}

/* The lanes of vector v of an output row (ow = v·16 + l) where tap kw reads
 * the input: ow < OW and 0 <= ow + kw·dw - pw < W (kw < 0: ow < OW alone),
 * as a bit mask. */
static uint32_t conv_row_lanes(const convspec_t *cs, int64_t v, int64_t kw,
			       int vw)
{
	uint32_t m = 0;
	for (int l = 0; l < vw; l++) {
		int64_t ow = v * vw + l, iw = ow + kw * cs->d[1] - cs->p[1];
		if (ow < cs->OW && (kw < 0 || (iw >= 0 && iw < cs->W)))
			m |= 1u << l;
	}
	return m;
}

/* A vector of vw floats at p: a plain load where every lane is in, a
 * masked one (zeros elsewhere, nothing read there) where some are. */
static LLVMValueRef conv_row_load(gen_t *g, LLVMValueRef p, uint32_t lanes,
				  int vw)
{
	LLVMTypeRef vt = LLVMVectorType(g->f32, (unsigned)vw);
	if (lanes == (vw == 32 ? 0xffffffffu : (1u << vw) - 1)) {
		LLVMValueRef v = LLVMBuildLoad2(g->b, vt, p, "");
		LLVMSetAlignment(v, 4);
		return v;
	}
	LLVMValueRef bits[16];
	for (int l = 0; l < vw; l++)
		bits[l] = LLVMConstInt(g->i1, (lanes >> l) & 1, 0);
	LLVMTypeRef over[2] = {vt, g->ptr};
	LLVMValueRef args[4] = {p, LLVMConstInt(g->i32, 4, 0),
				LLVMConstVector(bits, (unsigned)vw),
				LLVMConstNull(vt)};
	return cg_intr(g, "llvm.masked.load", over, 2, args, 4);
}

/* A stride-1 convolution's weight gradient, direct (convspec wgrad; f32,
 * 16 lanes). Unit u = ((g · OB + ob) · Cg + c) · KH + kh sums, for the MO
 * = wg_mo output channels o0 .. o0 + MO of block ob of group g (the last
 * block those left, a variant of its own), input channel g·Cg + c, and
 * every tap kw of
 * row kh, grad_output's rows times the input's row oh + kh·dh - ph
 * shifted by kw·dw - pw, over the images and the output rows that row
 * exists for: MO·KW accumulators of 16 lanes in registers, each output
 * row's vectors unrolled with their lane masks known here (the padding
 * and the row's tail: masked loads, a tap whose lanes are all out skipped),
 * so a vector of the input feeds MO FMAs and one of grad_output KW. Each
 * weight is its accumulator's lanes summed at the end. In place of
 * im2col's columns and a product whose few output channels made it run at
 * half speed (U-Net's 32 -> 16 3x3 at 64², batch 2: 0.77-0.85 ms). */
/* A direct kernel's unit code for output-channel block ob of OB blocks of
 * MO channels: unit(g, MO, arg) for every block but the last, and for the
 * last, of the tail channels left, unit(g, tail, arg), a variant of its own
 * (so no two units write the same outputs); one variant where tail == MO. */
static void by_block_width(gen_t *g, LLVMValueRef ob, int64_t OB, int64_t MO,
			   int64_t tail, void (*unit)(gen_t *, int64_t, void *),
			   void *arg)
{
	if (tail == MO) {
		unit(g, MO, arg);
		return;
	}
	LLVMBasicBlockRef bfull =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blk_full");
	LLVMBasicBlockRef btail =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blk_tail");
	LLVMBasicBlockRef bnext =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "blk_next");
	LLVMBuildCondBr(g->b,
			LLVMBuildICmp(g->b, LLVMIntULT, ob, K64(g, OB - 1), ""),
			bfull, btail);
	LLVMPositionBuilderAtEnd(g->b, bfull);
	unit(g, MO, arg);
	LLVMBuildBr(g->b, bnext);
	LLVMPositionBuilderAtEnd(g->b, btail);
	unit(g, tail, arg);
	LLVMBuildBr(g->b, bnext);
	LLVMPositionBuilderAtEnd(g->b, bnext);
}

/* gen_conv_wgrad_body's unit for mo output channels from o0, input
 * channel ci and tap row kh: acc[m·KW + kw] */
typedef struct wg_arg {
	const convspec_t *cs;
	LLVMValueRef o0, ci, xc, kh; /* ci in the group, xc in the input */
	const LLVMValueRef *acc;
} wg_arg_t;

static void wg_unit(gen_t *g, int64_t mo, void *arg)
{
	const wg_arg_t *wa = arg;
	const convspec_t *cs = wa->cs;
	LLVMValueRef o0 = wa->o0, ci = wa->ci, kh = wa->kh;
	int64_t Cg = cs->C / cs->G;
	const LLVMValueRef *acc = wa->acc;
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const lt_t *gt = n->ga, *xt = n->gb;
	LLVMTypeRef et = g->f32;
	const int vw = 16;
	LLVMTypeRef vt = LLVMVectorType(et, vw);
	int64_t MO = mo, KW = cs->KW, KH = cs->KH;
	int64_t nv = (cs->OW + vw - 1) / vw;
	LLVMValueRef gs[4], xs[4];
	for (int k = 0; k < 4; k++) {
		gs[k] = emit_ix(g, ix_dim(c, gt->strides[k]));
		xs[k] = emit_ix(g, ix_dim(c, xt->strides[k]));
	}
	LLVMValueRef gp = buf_ptr(g, gt->buf), xp = buf_ptr(g, xt->buf),
		     op = buf_ptr(g, n->buf);
	LLVMValueRef goff = emit_ix(g, ix_dim(c, gt->offset));
	LLVMValueRef xoff = emit_ix(g, ix_dim(c, xt->offset));
	/* ih = oh + iho; oh in [lo, hi) keeps it in [0, H) */
	LLVMValueRef iho =
	    LLVMBuildSub(g->b, LLVMBuildMul(g->b, kh, K64(g, cs->d[0]), ""),
			 K64(g, cs->p[0]), "");
	LLVMValueRef lo =
	    imax(g, LLVMBuildSub(g->b, K64(g, 0), iho, ""), K64(g, 0));
	LLVMValueRef hi =
	    imin(g, LLVMBuildSub(g->b, K64(g, cs->H), iho, ""), K64(g, cs->OH));
	for (int64_t i = 0; i < MO * KW; i++)
		LLVMBuildStore(g->b, LLVMConstNull(vt), acc[i]);
	LLVMValueRef gc =
	    LLVMBuildAdd(g->b, goff, LLVMBuildMul(g->b, o0, gs[1], ""), "");
	LLVMValueRef xc =
	    LLVMBuildAdd(g->b, xoff, LLVMBuildMul(g->b, wa->xc, xs[1], ""), "");
	loop_t Nl;
	loop_begin(g, &Nl, K64(g, 0), K64(g, cs->N), 1);
	LLVMValueRef gn =
	    LLVMBuildAdd(g->b, gc, LLVMBuildMul(g->b, Nl.i, gs[0], ""), "");
	LLVMValueRef xn =
	    LLVMBuildAdd(g->b, xc, LLVMBuildMul(g->b, Nl.i, xs[0], ""), "");
	loop_t R;
	loop_begin(g, &R, lo, hi, 1);
	LLVMValueRef gr =
	    LLVMBuildAdd(g->b, gn, LLVMBuildMul(g->b, R.i, gs[2], ""), "");
	LLVMValueRef xr = LLVMBuildAdd(
	    g->b, xn,
	    LLVMBuildMul(g->b, LLVMBuildAdd(g->b, R.i, iho, ""), xs[2], ""),
	    "");
	LLVMValueRef a[16 * 8];
	for (int64_t i = 0; i < MO * KW; i++)
		a[i] = LLVMBuildLoad2(g->b, vt, acc[i], "");
	for (int64_t v = 0; v < nv; v++) {
		LLVMValueRef xv[8];
		for (int64_t kw = 0; kw < KW; kw++) {
			uint32_t m = conv_row_lanes(cs, v, kw, vw);
			xv[kw] = NULL;
			if (m == 0)
				continue;
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, xr, K64(g, v * vw + kw * cs->d[1] - cs->p[1]),
			    "");
			xv[kw] = conv_row_load(
			    g, LLVMBuildGEP2(g->b, et, xp, &o, 1, ""), m, vw);
		}
		uint32_t gm = conv_row_lanes(cs, v, -1, vw);
		for (int64_t mo = 0; mo < MO; mo++) {
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, gr,
			    LLVMBuildAdd(
				g->b, LLVMBuildMul(g->b, K64(g, mo), gs[1], ""),
				K64(g, v * vw), ""),
			    "");
			LLVMValueRef gv = conv_row_load(
			    g, LLVMBuildGEP2(g->b, et, gp, &o, 1, ""), gm, vw);
			for (int64_t kw = 0; kw < KW; kw++) {
				if (xv[kw] == NULL)
					continue;
				LLVMValueRef fa[3] = {gv, xv[kw],
						      a[mo * KW + kw]};
				a[mo * KW + kw] =
				    cg_intr(g, "llvm.fma", &vt, 1, fa, 3);
			}
		}
	}
	for (int64_t i = 0; i < MO * KW; i++)
		LLVMBuildStore(g->b, a[i], acc[i]);
	loop_end(g, &R);
	loop_end(g, &Nl);
	/* buf[o0 + mo, ci, kh, kw] (contiguous [O, Cg, KH, KW]) */
	LLVMValueRef orow = LLVMBuildAdd(
	    g->b,
	    LLVMBuildMul(g->b,
			 LLVMBuildAdd(g->b,
				      LLVMBuildMul(g->b, o0, K64(g, Cg), ""),
				      ci, ""),
			 K64(g, KH * KW), ""),
	    LLVMBuildMul(g->b, kh, K64(g, KW), ""), "");
	for (int64_t mo = 0; mo < MO; mo++)
		for (int64_t kw = 0; kw < KW; kw++) {
			LLVMValueRef s = hsum(
			    g, LLVMBuildLoad2(g->b, vt, acc[mo * KW + kw], ""),
			    vw);
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, orow, K64(g, mo * Cg * KH * KW + kw), "");
			LLVMBuildStore(g->b, s,
				       LLVMBuildGEP2(g->b, et, op, &o, 1, ""));
		}
}

static void gen_conv_wgrad_body(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const convspec_t *cs = n->conv;
	LLVMTypeRef vt = LLVMVectorType(g->f32, 16);
	int64_t MO = cs->wg_mo, KW = cs->KW, KH = cs->KH;
	int64_t Cg = cs->C / cs->G, Og = cs->O / cs->G;
	int64_t OB = (Og + MO - 1) / MO, tail = Og - (OB - 1) * MO;
	LLVMValueRef acc[16 * 8];
	for (int64_t i = 0; i < MO * KW; i++) {
		acc[i] = entry_alloca(g, vt);
		LLVMSetAlignment(acc[i], 64);
	}

	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	/* u = ((gi · OB + ob) · Cg + ci) · KH + kh */
	LLVMValueRef kh = LLVMBuildURem(g->b, U.i, K64(g, KH), "");
	LLVMValueRef t = LLVMBuildUDiv(g->b, U.i, K64(g, KH), "");
	LLVMValueRef ci = LLVMBuildURem(g->b, t, K64(g, Cg), "");
	t = LLVMBuildUDiv(g->b, t, K64(g, Cg), "");
	LLVMValueRef ob = LLVMBuildURem(g->b, t, K64(g, OB), "");
	LLVMValueRef gi = LLVMBuildUDiv(g->b, t, K64(g, OB), "");
	wg_arg_t wa = {
	    cs,
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, gi, K64(g, Og), ""),
			 LLVMBuildMul(g->b, ob, K64(g, MO), ""), ""),
	    ci,
	    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, gi, K64(g, Cg), ""), ci, ""),
	    kh,
	    acc};
	by_block_width(g, ob, OB, MO, tail, wg_unit, &wa);
	loop_end(g, &U);
}

/* The vectors of a row of OW outputs */
static int64_t fd_nv(const convspec_t *cs)
{
	return (cs->OW + 15) / 16;
}

int64_t cg_fdirect_units(const convspec_t *cs)
{
	return cs->N * ((cs->O + cs->fd_mo - 1) / cs->fd_mo) *
	       (cs->OH / cs->fd_r);
}

/* gen_conv_fdirect_body's unit for mo output channels from o0, the rows
 * oh0 .. oh0 + R of image ni: acc[(m·R + r)·NV + v] */
typedef struct fd_arg {
	const convspec_t *cs;
	LLVMValueRef o0, ni, oh0, zrow;
	const LLVMValueRef *acc;
} fd_arg_t;

static void fd_unit(gen_t *g, int64_t mo, void *arg)
{
	const fd_arg_t *fda = arg;
	const convspec_t *cs = fda->cs;
	LLVMValueRef o0 = fda->o0, ni = fda->ni, oh0 = fda->oh0,
		     zrow = fda->zrow;
	const LLVMValueRef *acc = fda->acc;
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const lt_t *wt = n->ga, *xt = n->gb;
	LLVMTypeRef et = g->f32;
	const int vw = 16;
	LLVMTypeRef vt = LLVMVectorType(et, vw);
	int64_t R = cs->fd_r, NV = fd_nv(cs), KW = cs->KW;
	int64_t na = mo * R * NV;
	LLVMValueRef ws[4], xs[4];
	for (int k = 0; k < 4; k++) {
		ws[k] = emit_ix(g, ix_dim(c, wt->strides[k]));
		xs[k] = emit_ix(g, ix_dim(c, xt->strides[k]));
	}
	LLVMValueRef wp = buf_ptr(g, wt->buf), xp = buf_ptr(g, xt->buf);
	LLVMValueRef woff = emit_ix(g, ix_dim(c, wt->offset));
	LLVMValueRef xoff = emit_ix(g, ix_dim(c, xt->offset));
	for (int64_t i = 0; i < na; i++)
		LLVMBuildStore(g->b, LLVMConstNull(vt), acc[i]);
	LLVMValueRef xn =
	    LLVMBuildAdd(g->b, xoff, LLVMBuildMul(g->b, ni, xs[0], ""), "");
	LLVMValueRef wo =
	    LLVMBuildAdd(g->b, woff, LLVMBuildMul(g->b, o0, ws[0], ""), "");
	/* one row (R == 1): only the taps kh whose input row exists */
	LLVMValueRef klo = K64(g, 0), khi = K64(g, cs->KH);
	if (R == 1) {
		/* ih = oh0 + kh·dh - ph in [0, H) */
		LLVMValueRef t = LLVMBuildSub(g->b, K64(g, cs->p[0]), oh0, "");
		klo = imax(g, K64(g, 0),
			   LLVMBuildSDiv(
			       g->b,
			       LLVMBuildAdd(g->b, t, K64(g, cs->d[0] - 1), ""),
			       K64(g, cs->d[0]), ""));
		LLVMValueRef u =
		    LLVMBuildAdd(g->b, t, K64(g, cs->H - 1 + cs->d[0]), "");
		/* kh <= (H - 1 - oh0 + ph) / dh; u >= dh > 0 here */
		khi = imin(g, K64(g, cs->KH),
			   LLVMBuildSDiv(g->b, imax(g, u, K64(g, 0)),
					 K64(g, cs->d[0]), ""));
		khi = imax(g, khi, klo);
	}
	loop_t Cl;
	loop_begin(g, &Cl, K64(g, 0), K64(g, cs->C), 1);
	LLVMValueRef xc =
	    LLVMBuildAdd(g->b, xn, LLVMBuildMul(g->b, Cl.i, xs[1], ""), "");
	LLVMValueRef wc =
	    LLVMBuildAdd(g->b, wo, LLVMBuildMul(g->b, Cl.i, ws[1], ""), "");
	loop_t Kl;
	loop_begin(g, &Kl, klo, khi, 1);
	LLVMValueRef ihb = LLVMBuildAdd(
	    g->b, oh0,
	    LLVMBuildSub(g->b, LLVMBuildMul(g->b, Kl.i, K64(g, cs->d[0]), ""),
			 K64(g, cs->p[0]), ""),
	    "");
	LLVMValueRef row[4];
	for (int64_t r = 0; r < R; r++) {
		LLVMValueRef ih = LLVMBuildAdd(g->b, ihb, K64(g, r), "");
		LLVMValueRef o = LLVMBuildAdd(
		    g->b, xc, LLVMBuildMul(g->b, ih, xs[2], ""), "");
		row[r] = LLVMBuildGEP2(g->b, et, xp, &o, 1, "");
		if (R > 1) {
			LLVMValueRef in = LLVMBuildAnd(
			    g->b,
			    LLVMBuildICmp(g->b, LLVMIntSGE, ih, K64(g, 0), ""),
			    LLVMBuildICmp(g->b, LLVMIntSLT, ih, K64(g, cs->H),
					  ""),
			    "");
			row[r] = LLVMBuildSelect(g->b, in, row[r], zrow, "");
		}
	}
	LLVMValueRef wk =
	    LLVMBuildAdd(g->b, wc, LLVMBuildMul(g->b, Kl.i, ws[2], ""), "");
	LLVMValueRef a[24];
	for (int64_t i = 0; i < na; i++)
		a[i] = LLVMBuildLoad2(g->b, vt, acc[i], "");
	for (int64_t kw = 0; kw < KW; kw++) {
		LLVMValueRef xv[4][4];
		for (int64_t r = 0; r < R; r++)
			for (int64_t v = 0; v < NV; v++) {
				uint32_t m = conv_row_lanes(cs, v, kw, vw);
				xv[r][v] = NULL;
				if (m == 0)
					continue;
				LLVMValueRef o =
				    K64(g, v * vw + kw * cs->d[1] - cs->p[1]);
				xv[r][v] = conv_row_load(
				    g,
				    LLVMBuildGEP2(g->b, et, row[r], &o, 1, ""),
				    m, vw);
			}
		LLVMValueRef wkw = LLVMBuildAdd(
		    g->b, wk, LLVMBuildMul(g->b, K64(g, kw), ws[3], ""), "");
		for (int64_t m = 0; m < mo; m++) {
			LLVMValueRef o = LLVMBuildAdd(
			    g->b, wkw, LLVMBuildMul(g->b, K64(g, m), ws[0], ""),
			    "");
			LLVMValueRef wv = cg_splat(
			    g,
			    LLVMBuildLoad2(
				g->b, et,
				LLVMBuildGEP2(g->b, et, wp, &o, 1, ""), ""),
			    vw);
			for (int64_t r = 0; r < R; r++)
				for (int64_t v = 0; v < NV; v++) {
					if (xv[r][v] == NULL)
						continue;
					int64_t i = (m * R + r) * NV + v;
					LLVMValueRef fa[3] = {wv, xv[r][v],
							      a[i]};
					a[i] = cg_intr(g, "llvm.fma", &vt, 1,
						       fa, 3);
				}
		}
	}
	for (int64_t i = 0; i < na; i++)
		LLVMBuildStore(g->b, a[i], acc[i]);
	loop_end(g, &Kl);
	loop_end(g, &Cl);
	/* out[ni, o0 + m, oh0 + r, :] (contiguous [N, O, OH, OW]) */
	LLVMValueRef op = buf_ptr(g, n->buf);
	LLVMValueRef ob = LLVMBuildAdd(
	    g->b,
	    LLVMBuildMul(g->b,
			 LLVMBuildAdd(g->b,
				      LLVMBuildMul(g->b, ni, K64(g, cs->O), ""),
				      o0, ""),
			 K64(g, cs->OH * cs->OW), ""),
	    LLVMBuildMul(g->b, oh0, K64(g, cs->OW), ""), "");
	uint32_t tail = conv_row_lanes(cs, NV - 1, -1, vw);
	LLVMValueRef bits[16];
	for (int l = 0; l < vw; l++)
		bits[l] = LLVMConstInt(g->i1, (tail >> l) & 1, 0);
	LLVMValueRef tmask = LLVMConstVector(bits, vw);
	LLVMTypeRef over[2] = {vt, g->ptr};
	for (int64_t m = 0; m < mo; m++)
		for (int64_t r = 0; r < R; r++)
			for (int64_t v = 0; v < NV; v++) {
				LLVMValueRef o = LLVMBuildAdd(
				    g->b, ob,
				    K64(g, (m * cs->OH + r) * cs->OW + v * vw),
				    "");
				LLVMValueRef p =
				    LLVMBuildGEP2(g->b, et, op, &o, 1, "");
				LLVMValueRef val = LLVMBuildLoad2(
				    g->b, vt, acc[(m * R + r) * NV + v], "");
				if (v == NV - 1 && tail != 0xffffu) {
					LLVMValueRef args[4] = {
					    val, p, LLVMConstInt(g->i32, 4, 0),
					    tmask};
					cg_intr(g, "llvm.masked.store", over, 2,
						args, 4);
				} else {
					LLVMValueRef st =
					    LLVMBuildStore(g->b, val, p);
					LLVMSetAlignment(st, 4);
				}
			}
	if (g->k->has_epilogue) {
		/* the epilogue on these rows of each channel: units (n·O +
		 * o)·OH + oh0 .. + R of its [N, O, OH, OW] extent */
		for (int64_t m = 0; m < mo; m++) {
			LLVMValueRef u0 = LLVMBuildAdd(
			    g->b,
			    LLVMBuildMul(
				g->b,
				LLVMBuildAdd(
				    g->b,
				    LLVMBuildMul(g->b, ni, K64(g, cs->O), ""),
				    LLVMBuildAdd(g->b, o0, K64(g, m), ""), ""),
				K64(g, cs->OH), ""),
			    oh0, "");
			call_epilogue(g, n->buf, NULL, u0,
				      LLVMBuildAdd(g->b, u0, K64(g, R), ""));
		}
	}
}

/* A stride-1 convolution of few output channels, direct (convspec
 * fdirect; f32, 16 lanes). Unit u = (ni · RB + rb) · OB + ob computes
 * output channels o0 = ob·MO .. + MO (the last block the MO' left, a
 * variant of its own) at the fd_r output rows from rb·fd_r of image ni:
 * MO·fd_r·NV accumulators of 16 lanes in registers over the sum of
 * (c, kh, kw), a vector of the input (rows shifted by kw, their lane masks
 * known here; a row in the padding reads a zero row) feeding MO FMAs and
 * each weight, broadcast, fd_r·NV. Then its rows are stored, and the
 * epilogue (sched.c fuse_epilogues) runs on them while they are in
 * cache. In place of im2col tiles whose columns fed few rows: U-Net's
 * 32 -> 16 3x3 at 64², batch 2. */
static void gen_conv_fdirect_body(gen_t *g, LLVMValueRef begin,
				  LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const convspec_t *cs = n->conv;
	LLVMTypeRef et = g->f32;
	const int vw = 16;
	LLVMTypeRef vt = LLVMVectorType(et, vw);
	int64_t MO = cs->fd_mo, R = cs->fd_r, NV = fd_nv(cs);
	int64_t OB = (cs->O + MO - 1) / MO, RB = cs->OH / R;
	int64_t tail = cs->O - (OB - 1) * MO;
	LLVMValueRef acc[24];
	for (int64_t i = 0; i < MO * R * NV; i++) {
		acc[i] = entry_alloca(g, vt);
		LLVMSetAlignment(acc[i], 64);
	}
	/* a row of zeros for the rows in the padding (R > 1): W floats */
	LLVMValueRef zrow = NULL;
	if (R > 1) {
		zrow = entry_alloca(g, LLVMArrayType(et, (unsigned)cs->W));
		LLVMSetAlignment(zrow, 64);
		LLVMBuildMemSet(g->b, zrow, LLVMConstInt(g->i8, 0, 0),
				K64(g, cs->W * 4), 64);
		LLVMValueRef z = K64(g, 0);
		zrow = LLVMBuildGEP2(g->b, et, zrow, &z, 1, "");
	}
	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef ob = LLVMBuildURem(g->b, U.i, K64(g, OB), "");
	LLVMValueRef t = LLVMBuildUDiv(g->b, U.i, K64(g, OB), "");
	LLVMValueRef rb = LLVMBuildURem(g->b, t, K64(g, RB), "");
	LLVMValueRef ni = LLVMBuildUDiv(g->b, t, K64(g, RB), "");
	LLVMValueRef o0 = LLVMBuildMul(g->b, ob, K64(g, MO), "");
	LLVMValueRef oh0 = LLVMBuildMul(g->b, rb, K64(g, R), "");
	fd_arg_t fda = {cs, o0, ni, oh0, zrow, acc};
	by_block_width(g, ob, OB, MO, tail, fd_unit, &fda);
	loop_end(g, &U);
}

int64_t cg_wgrad_units(const convspec_t *cs)
{
	int64_t Og = cs->O / cs->G;
	return cs->G * ((Og + cs->wg_mo - 1) / cs->wg_mo) * (cs->C / cs->G) *
	       cs->KH;
}

int64_t cg_scatter_cols(cctx_t *c, const cnode_t *n)
{
	/* 512 bytes of each row (a multiple of any vector): [8192, 512] from
	 * 512 rows 0.37-0.40 ms with 256 bytes, 0.26-0.27 with 512, 0.23-0.29
	 * with 1024; [50272, 768] from 1024 rows (3 units of 1024 bytes
	 * leave a thread idle on 2) 8.3-8.5, 7.7-8.1 and 10.6 ms (kilnc
	 * --bench, 2 threads, a Zen 4). Narrower, down to a cache line,
	 * where that leaves fewer than 4 units: a [50272, 64] gradient was
	 * one unit, one thread zeroing all of it. */
	kiln_dtype_t dt = c->bufs[n->buf].dtype;
	int64_t es = dt == KILN_DT_F64 ? 8 : 4, cols = 512 / es;
	int64_t units = 1;
	for (uint32_t k = 0; k + 2 < n->frank; k++)
		units *= n->fsizes[k].e == NULL ? n->fsizes[k].c : 4;
	kiln_dim_t D = n->fsizes[n->frank - 1];
	if (D.e == NULL)
		while (cols * es > 64 && units * ((D.c + cols - 1) / cols) < 4)
			cols /= 2;
	return cols;
}

/* Adds the columns [d0, d1) of a source row s into the output row o (add),
 * or stores s's there (!add; fill where s is NULL): vectors of w, then
 * one at a time. */
static void scatter_cols(gen_t *g, uint32_t buf, LLVMTypeRef et, int w,
			 LLVMValueRef o, LLVMValueRef s, bool add,
			 LLVMValueRef d0, LLVMValueRef d1, double fill)
{
	kiln_dtype_t dt = LLVMGetTypeKind(et) == LLVMDoubleTypeKind
			      ? KILN_DT_F64
			      : KILN_DT_F32;
	unsigned al =
	    (unsigned)(LLVMGetTypeKind(et) == LLVMDoubleTypeKind ? 8 : 4);
	LLVMValueRef from = d0;
	for (int vw = w; vw >= 1; vw = vw > 1 ? 1 : 0) {
		LLVMTypeRef vt = vw > 1 ? LLVMVectorType(et, (unsigned)vw) : et;
		loop_t L;
		loop_begin(g, &L, from, d1, vw);
		LLVMValueRef op = LLVMBuildGEP2(g->b, et, o, &L.i, 1, "");
		LLVMValueRef v =
		    fill != 0 ? cg_const_f(g, fill, dt, vw) : LLVMConstNull(vt);
		if (s != NULL) {
			LLVMValueRef sp =
			    LLVMBuildGEP2(g->b, et, s, &L.i, 1, "");
			v = LLVMBuildLoad2(g->b, vt, sp, "");
			LLVMSetAlignment(v, al);
		}
		if (add) {
			LLVMValueRef y = LLVMBuildLoad2(g->b, vt, op, "");
			LLVMSetAlignment(y, al);
			v = LLVMBuildFAdd(g->b, y, v, "");
		}
		if (add || vw == 1)
			LLVMSetAlignment(LLVMBuildStore(g->b, v, op), al);
		else /* streaming where the output is large (nt_setup) */
			store_vec(g, buf, v, op, al);
		loop_end(g, &L);
		from = LLVMBuildLoad2(g->b, g->i64, L.iv, "");
	}
}

/* The row a scatter's index element at io names (as i64, counted from V
 * where negative and n->scat_wrap), *ok whether it is in [0, V). */
static LLVMValueRef scatter_row(gen_t *g, const cnode_t *n, LLVMTypeRef it,
				LLVMValueRef ip, LLVMValueRef io,
				LLVMValueRef V, LLVMValueRef *ok)
{
	LLVMValueRef v = LLVMBuildLoad2(
	    g->b, it, LLVMBuildGEP2(g->b, it, ip, &io, 1, ""), "");
	if (it != g->i64)
		v = n->ga->dtype == KILN_DT_U8
			? LLVMBuildZExt(g->b, v, g->i64, "")
			: LLVMBuildSExt(g->b, v, g->i64, "");
	if (n->scat_wrap)
		v = LLVMBuildSelect(
		    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, v, K64(g, 0), ""),
		    LLVMBuildAdd(g->b, v, V, ""), v, "");
	*ok = LLVMBuildAnd(g->b,
			   LLVMBuildICmp(g->b, LLVMIntSGE, v, K64(g, 0), ""),
			   LLVMBuildICmp(g->b, LLVMIntSLT, v, V, ""), "");
	return v;
}

/* A scatter-add kernel (cnode_t.scatter): unit u owns the output columns
 * [u·cols, (u+1)·cols) of every row: it zeroes them, then for each source
 * position q in order adds the source row's columns into the row its
 * index names (skipping an index outside [0, V) and the padding row).
 * Units never share an element, and each element sums its sources in
 * order, so the result does not depend on the threads. */
static void gen_scatter_body(gen_t *g, LLVMValueRef begin, LLVMValueRef end)
{
	cctx_t *c = g->c;
	const cnode_t *n = &c->nodes[g->k->members[0].node];
	const lt_t *ix = n->ga, *src = n->gb;
	kiln_dtype_t dt = c->bufs[n->buf].dtype;
	LLVMTypeRef et = cg_scalar_type(g, dt);
	int64_t cols = cg_scatter_cols(c, n);
	int w = c->vec_width > 0 ? c->vec_width : 8;
	if (dt == KILN_DT_F64)
		w = w > 1 ? w / 2 : 1;
	/* a leading dim P (frank 3): out [P, V, D], src [P, q..., D] */
	uint32_t pre = n->frank == 3 ? 1 : 0;
	LLVMValueRef V = emit_ix(g, ix_dim(c, n->fsizes[pre]));
	LLVMValueRef D = emit_ix(g, ix_dim(c, n->fsizes[pre + 1]));
	LLVMValueRef pad = n->scat_pad ? emit_ix(g, n->scat_pad) : NULL;
	LLVMValueRef op0 = buf_ptr(g, n->buf);
	LLVMValueRef ioff = emit_ix(g, ix_dim(c, ix->offset));
	LLVMValueRef soff0 = emit_ix(g, ix_dim(c, src->offset));
	LLVMTypeRef it = storage_type(g, ix->dtype, 1);
	LLVMValueRef ip = buf_ptr(g, ix->buf), sp = buf_ptr(g, src->buf);
	uint32_t r = ix->rank;
	LLVMValueRef isz[CIR_MAX_RANK], ist[CIR_MAX_RANK], sst[CIR_MAX_RANK];
	for (uint32_t k = 0; k < r; k++) {
		isz[k] = emit_ix(g, ix_dim(c, ix->sizes[k]));
		ist[k] = emit_ix(g, ix_dim(c, ix->strides[k]));
		/* (an element scatter's ix has src's rank: P is its own) */
		sst[k] = pre + k < src->rank
			     ? emit_ix(g, ix_dim(c, src->strides[pre + k]))
			     : K64(g, 0);
	}
	/* units: (p, block of columns), p outer */
	LLVMValueRef nblk = imax(
	    g,
	    LLVMBuildUDiv(g->b, LLVMBuildAdd(g->b, D, K64(g, cols - 1), ""),
			  K64(g, cols), ""),
	    K64(g, 1));
	const lt_t *bt = n->scat_base;
	loop_t U;
	loop_begin(g, &U, begin, end, 1);
	LLVMValueRef blk = U.i, pi = K64(g, 0);
	if (pre) {
		pi = LLVMBuildUDiv(g->b, U.i, nblk, "");
		blk = LLVMBuildURem(g->b, U.i, nblk, "");
	}
	LLVMValueRef d0 = LLVMBuildMul(g->b, blk, K64(g, cols), "");
	LLVMValueRef d1 = imin(g, LLVMBuildAdd(g->b, d0, K64(g, cols), ""), D);
	LLVMValueRef po =
	    LLVMBuildMul(g->b, pi, LLVMBuildMul(g->b, V, D, ""), "");
	LLVMValueRef op = LLVMBuildGEP2(g->b, et, op0, &po, 1, "");
	LLVMValueRef soff = soff0;
	if (pre)
		soff = LLVMBuildAdd(
		    g->b, soff,
		    LLVMBuildMul(g->b, pi,
				 emit_ix(g, ix_dim(c, src->strides[0])), ""),
		    "");
	/* the unit's columns of every row: zeros, or base's */
	LLVMValueRef bp = NULL, bst = NULL;
	if (bt != NULL) {
		LLVMValueRef boff = emit_ix(g, ix_dim(c, bt->offset));
		if (pre)
			boff = LLVMBuildAdd(
			    g->b, boff,
			    LLVMBuildMul(g->b, pi,
					 emit_ix(g, ix_dim(c, bt->strides[0])),
					 ""),
			    "");
		bp = LLVMBuildGEP2(g->b, et, buf_ptr(g, bt->buf), &boff, 1, "");
		bst = emit_ix(g, ix_dim(c, bt->strides[pre]));
	}
	/* without a base, the start: the combining op's identity */
	double fill = n->scat_op == SCAT_MUL   ? 1
		      : n->scat_op == SCAT_MAX ? -INFINITY
		      : n->scat_op == SCAT_MIN ? INFINITY
					       : 0;
	kiln_dim_t Dd = n->fsizes[pre + 1];
	if (dim_is(Dd, 1) && (bt == NULL || dim_is(bt->strides[pre], 1))) {
		/* one column: the unit's V elements are contiguous (a gather's
		 * gradient along its last dim), one run of vectors */
		scatter_cols(g, n->buf, et, w, op, bp, false, K64(g, 0), V,
			     fill);
	} else {
		loop_t Z;
		loop_begin(g, &Z, K64(g, 0), V, 1);
		LLVMValueRef zo = LLVMBuildMul(g->b, Z.i, D, "");
		LLVMValueRef brow = NULL;
		if (bp != NULL) {
			LLVMValueRef bo = LLVMBuildMul(g->b, Z.i, bst, "");
			brow = LLVMBuildGEP2(g->b, et, bp, &bo, 1, "");
		}
		scatter_cols(g, n->buf, et, w,
			     LLVMBuildGEP2(g->b, et, op, &zo, 1, ""), brow,
			     false, d0, d1, fill);
		loop_end(g, &Z);
	}
	if (g->any_nt) /* the streamed zeros land before the adds read them */
		cg_intr(g, "llvm.x86.sse.sfence", NULL, 0, NULL, 0);
	if (n->scat_elem) {
		/* ix and src [P, K, D]: for k in order, each of the unit's
		 * columns d goes to row ix[p, k, d] */
		LLVMValueRef io = LLVMBuildAdd(
		    g->b, ioff, LLVMBuildMul(g->b, pi, ist[0], ""), "");
		loop_t Kl, Dl;
		loop_begin(g, &Kl, K64(g, 0), isz[1], 1);
		LLVMValueRef iok = LLVMBuildAdd(
		    g->b, io, LLVMBuildMul(g->b, Kl.i, ist[1], ""), "");
		LLVMValueRef sok = LLVMBuildAdd(
		    g->b, soff, LLVMBuildMul(g->b, Kl.i, sst[0], ""), "");
		loop_begin(g, &Dl, d0, d1, 1);
		LLVMValueRef iod = LLVMBuildAdd(
		    g->b, iok, LLVMBuildMul(g->b, Dl.i, ist[2], ""), "");
		LLVMValueRef ok, v = scatter_row(g, n, it, ip, iod, V, &ok);
		LLVMBasicBlockRef put =
		    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "put");
		LLVMBasicBlockRef skip =
		    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "skip");
		LLVMBuildCondBr(g->b, ok, put, skip);
		LLVMPositionBuilderAtEnd(g->b, put);
		LLVMValueRef oo =
		    LLVMBuildAdd(g->b, LLVMBuildMul(g->b, v, D, ""), Dl.i, "");
		LLVMValueRef opp = LLVMBuildGEP2(g->b, et, op, &oo, 1, "");
		LLVMValueRef so = LLVMBuildAdd(g->b, sok, Dl.i, "");
		LLVMValueRef x = LLVMBuildLoad2(
		    g->b, et, LLVMBuildGEP2(g->b, et, sp, &so, 1, ""), "");
		if (n->scat_op != SCAT_STORE) {
			LLVMValueRef y = LLVMBuildLoad2(g->b, et, opp, "");
			switch ((scat_op_t)n->scat_op) {
			case SCAT_MUL: x = LLVMBuildFMul(g->b, y, x, ""); break;
			case SCAT_MAX:
			case SCAT_MIN:
				/* NaN wins, from either side (torch) */
				x = fmax_nan(g, y, x, n->scat_op == SCAT_MAX);
				break;
			default: x = LLVMBuildFAdd(g->b, y, x, ""); break;
			}
		}
		LLVMBuildStore(g->b, x, opp);
		LLVMBuildBr(g->b, skip);
		LLVMPositionBuilderAtEnd(g->b, skip);
		loop_end(g, &Dl);
		loop_end(g, &Kl);
		loop_end(g, &U);
		return;
	}
	/* the source positions in order, nested loops over ix's dims */
	loop_t Q[CIR_MAX_RANK];
	LLVMValueRef io = ioff, so = soff;
	for (uint32_t k = 0; k < r; k++) {
		loop_begin(g, &Q[k], K64(g, 0), isz[k], 1);
		io = LLVMBuildAdd(g->b, io,
				  LLVMBuildMul(g->b, Q[k].i, ist[k], ""), "");
		so = LLVMBuildAdd(g->b, so,
				  LLVMBuildMul(g->b, Q[k].i, sst[k], ""), "");
	}
	LLVMValueRef ok, v = scatter_row(g, n, it, ip, io, V, &ok);
	if (pad != NULL)
		ok = LLVMBuildAnd(
		    g->b, ok, LLVMBuildICmp(g->b, LLVMIntNE, v, pad, ""), "");
	LLVMBasicBlockRef add =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "add");
	LLVMBasicBlockRef next =
	    LLVMAppendBasicBlockInContext(g->ctx, g->fn, "next");
	LLVMBuildCondBr(g->b, ok, add, next);
	LLVMPositionBuilderAtEnd(g->b, add);
	LLVMValueRef ro = LLVMBuildMul(g->b, v, D, "");
	scatter_cols(g, n->buf, et, w, LLVMBuildGEP2(g->b, et, op, &ro, 1, ""),
		     LLVMBuildGEP2(g->b, et, sp, &so, 1, ""), true, d0, d1, 0);
	LLVMBuildBr(g->b, next);
	LLVMPositionBuilderAtEnd(g->b, next);
	for (uint32_t k = r; k-- > 0;)
		loop_end(g, &Q[k]);
	loop_end(g, &U);
}

static void scatter_extent(cctx_t *c, kernel_t *k)
{
	const cnode_t *n = &c->nodes[k->members[0].node];
	int64_t cols = cg_scatter_cols(c, n);
	uint32_t pre = n->frank == 3 ? 1 : 0;
	const kiln_expr_t *e = ix_floordiv(
	    c, ix_add(c, ix_dim(c, n->fsizes[pre + 1]), ix_const(c, cols - 1)),
	    ix_const(c, cols));
	if (pre)
		e = ix_mul(c, e, ix_dim(c, n->fsizes[0]));
	k->extent = dim_of(e);
	k->grain = 1;
}

static void gemm_extent(cctx_t *c, kernel_t *k)
{
	const cnode_t *n = &c->nodes[k->members[0].node];
	if (n->conv != NULL && n->conv->fdirect) {
		k->extent = dim_const(cg_fdirect_units(n->conv));
		k->grain = 1;
		return;
	}
	if (n->conv != NULL && n->conv->wgrad) {
		k->extent = dim_const(cg_wgrad_units(n->conv));
		k->grain = 1;
		return;
	}
	if (n->conv != NULL && n->conv->implicit) {
		k->extent = dim_const(conv_implicit_units(n->conv));
		k->grain = 1;
		return;
	}
	if (n->conv != NULL) {
		k->extent = dim_const(n->conv->N * conv_tiles(n->conv));
		k->grain = 1;
		return;
	}
	const lt_t *a = n->ga;
	uint32_t r = a->rank;
	const kiln_expr_t *m = ix_dim(c, a->sizes[r - 2]);
	const kiln_expr_t *nmb = ix_floordiv(
	    c, ix_add(c, m, ix_const(c, GEMM_MB - 1)), ix_const(c, GEMM_MB));
	nmb = ix_max(c, nmb, ix_const(c, 1));
	if (r == 3)
		nmb = ix_mul(c, nmb, ix_dim(c, a->sizes[0]));
	int64_t nb = cg_gemm_col_block(c, n);
	if (nb > 0)
		nmb = ix_mul(
		    c, nmb, ix_const(c, (n->gb->sizes[r - 1].c + nb - 1) / nb));
	k->extent = dim_of(nmb);
	k->grain = 1;
}

struct argscan {
	gen_t *g;
};

static void add_arg(gen_t *g, uint32_t buf)
{
	if (arg_index(g, buf) >= 0 || g->n_args >= CG_MAX_ARGS ||
	    g->c->bufs[buf].row_local)
		return;
	g->args[g->n_args++] = buf;
}

static void arg_from_load(void *arg, const sx_t *ld)
{
	gen_t *g = arg;
	add_arg(g, ld->buf);
}

static int gen_kernel(gen_t *g, kernel_t *k)
{
	cctx_t *c = g->c;
	g->k = k;
	g->n_args = 0;
	g->n_scratch = 0;
	memset(g->sym_val, 0, sizeof(g->sym_val));
	/* arguments: stored members first, then everything loaded */
	for (uint32_t i = 0; i < k->n_members; i++) {
		const cnode_t *n = &c->nodes[k->members[i].node];
		const cbuf_t *b = &c->bufs[n->buf];
		if (b->in_memory || b->is_output)
			add_arg(g, n->buf);
	}
	for (uint32_t i = 0; i < k->n_members; i++)
		sx_each_load(k->members[i].body, arg_from_load, g);
	if (g->n_args >= CG_MAX_ARGS)
		return cir_err(c, KILN_EUNSUPOP,
			       "kernel %s needs more than %d buffers", k->name,
			       CG_MAX_ARGS);
	if (k->is_gemm) {
		const cnode_t *gn = &c->nodes[k->members[0].node];
		g->n_args = 0;
		if (!k->has_epilogue || gn->conv != NULL)
			add_arg(g, gn->buf);
		add_arg(g, gn->ga->buf);
		add_arg(g, gn->gb->buf);
		if (k->has_epilogue) {
			/* the epilogue's buffers (generated before this
			 * kernel), its product read from the scratch */
			const kernel_t *ek = k + 1;
			for (uint32_t i = 0; i < ek->n_args; i++)
				if (ek->args[i] != gn->buf)
					add_arg(g, ek->args[i]);
		}
		gemm_extent(c, k);
	} else if (k->is_scatter) {
		const cnode_t *sn = &c->nodes[k->members[0].node];
		g->n_args = 0;
		add_arg(g, sn->buf);
		add_arg(g, sn->ga->buf);
		add_arg(g, sn->gb->buf);
		if (sn->scat_base != NULL)
			add_arg(g, sn->scat_base->buf);
		scatter_extent(c, k);
	} else {
		kernel_extent(c, k);
	}
	k->n_args = g->n_args;
	k->args = kiln_arena_calloc(c->arena, g->n_args ? g->n_args : 1,
				    sizeof(uint32_t));
	if (k->args == NULL)
		return -ENOMEM;
	memcpy(k->args, g->args, g->n_args * sizeof(uint32_t));

	/* body function: (ptr noalias ..., ptr syms, i64 begin, i64 end) */
	LLVMTypeRef pt[CG_MAX_ARGS + 3];
	for (uint32_t i = 0; i < g->n_args; i++)
		pt[i] = g->ptr;
	pt[g->n_args] = g->ptr;
	pt[g->n_args + 1] = g->i64;
	pt[g->n_args + 2] = g->i64;
	LLVMTypeRef bft = LLVMFunctionType(g->voidt, pt, g->n_args + 3, 0);
	char bname[48];
	snprintf(bname, sizeof(bname), "%s_body", k->name);
	LLVMValueRef bf = LLVMAddFunction(g->mod, bname, bft);
	LLVMSetLinkage(bf, LLVMInternalLinkage);
	unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
	unsigned inl;
	unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
	for (uint32_t i = 0; i < g->n_args; i++)
		LLVMAddAttributeAtIndex(
		    bf, i + 1, LLVMCreateEnumAttribute(g->ctx, noalias, 0));
	/* the body stays a function of its own (noinline), which the
	 * exported wrapper tail-calls: inlined, O3 optimized every body
	 * twice, before and after inlining (single-threaded O3 of
	 * mobilenet_v2_fwd 729 -> 488 ms, transformer_dyn_fwd 144 -> 96 ms;
	 * the same vector code, the kernels' speed unchanged); an epilogue's
	 * body inlined into its product's loop cost 50% more O3 and
	 * instruction selection (a small addmm + gelu: 41 -> 61 ms) */
	inl = LLVMGetEnumAttributeKindForName("noinline", 8);
	LLVMAddAttributeAtIndex(bf, LLVMAttributeFunctionIndex,
				LLVMCreateEnumAttribute(g->ctx, inl, 0));
	LLVMAddAttributeAtIndex(bf, LLVMAttributeFunctionIndex,
				LLVMCreateEnumAttribute(g->ctx, nounwind, 0));
	/* scratches of up to 1.2 MiB live in the body's frame: probe it a
	 * page at a time, so that a thread short of stack faults on its
	 * guard page instead of writing past it */
	LLVMAddAttributeAtIndex(bf, LLVMAttributeFunctionIndex,
				LLVMCreateStringAttribute(g->ctx, "probe-stack",
							  11, "inline-asm",
							  10));
	g->fn = bf;
	LLVMBasicBlockRef entry =
	    LLVMAppendBasicBlockInContext(g->ctx, bf, "entry");
	LLVMBasicBlockRef start =
	    LLVMAppendBasicBlockInContext(g->ctx, bf, "start");
	LLVMPositionBuilderAtEnd(g->b, entry);
	LLVMBuildBr(g->b, start);
	LLVMPositionBuilderAtEnd(g->b, start);
	for (uint32_t i = 0; i < g->n_args; i++)
		g->argp[i] = LLVMGetParam(bf, i);
	g->syms = LLVMGetParam(bf, g->n_args);
	LLVMValueRef begin = LLVMGetParam(bf, g->n_args + 1);
	LLVMValueRef end = LLVMGetParam(bf, g->n_args + 2);
	g->mval =
	    kiln_arena_calloc(c->arena, k->n_members + 1, sizeof(LLVMValueRef));
	g->mval_width =
	    kiln_arena_calloc(c->arena, k->n_members + 1, sizeof(int));
	if (g->mval == NULL || g->mval_width == NULL)
		return -ENOMEM;
	memo_clear(g);
	const convspec_t *kcs =
	    k->is_gemm ? c->nodes[k->members[0].node].conv : NULL;
	if (kcs != NULL && kcs->fdirect)
		gen_conv_fdirect_body(g, begin, end);
	else if (kcs != NULL && kcs->wgrad)
		gen_conv_wgrad_body(g, begin, end);
	else if (kcs != NULL && kcs->implicit)
		gen_conv_implicit_body(g, begin, end);
	else if (kcs != NULL)
		gen_conv_body(g, begin, end);
	else if (k->is_gemm)
		gen_gemm_body(g, begin, end);
	else if (k->is_scatter) {
		nt_setup(g);
		gen_scatter_body(g, begin, end);
		for (uint32_t i = 0; i < g->n_args; i++)
			g->nt_flag[i] = NULL;
	} else {
		nt_setup(g);
		gen_kernel_body(g, begin, end);
		for (uint32_t i = 0; i < g->n_args; i++)
			g->nt_flag[i] = NULL;
		if (g->any_nt)
			cg_intr(g, "llvm.x86.sse.sfence", NULL, 0, NULL, 0);
	}
	LLVMBuildRetVoid(g->b);
	if (k->is_epilogue)
		return 0; /* called by its product's kernel alone */

	/* the exported wrapper */
	LLVMTypeRef wt[4] = {g->ptr, g->ptr, g->i64, g->i64};
	LLVMTypeRef wft = LLVMFunctionType(g->voidt, wt, 4, 0);
	LLVMValueRef wf = LLVMAddFunction(g->mod, k->name, wft);
	LLVMAddAttributeAtIndex(wf, LLVMAttributeFunctionIndex,
				LLVMCreateEnumAttribute(g->ctx, nounwind, 0));
	LLVMBasicBlockRef we =
	    LLVMAppendBasicBlockInContext(g->ctx, wf, "entry");
	LLVMPositionBuilderAtEnd(g->b, we);
	LLVMValueRef cargs[CG_MAX_ARGS + 3];
	for (uint32_t i = 0; i < g->n_args; i++) {
		LLVMValueRef ix = LLVMConstInt(g->i64, i, 0);
		LLVMValueRef p = LLVMBuildGEP2(g->b, g->ptr,
					       LLVMGetParam(wf, 0), &ix, 1, "");
		cargs[i] = LLVMBuildLoad2(g->b, g->ptr, p, "");
	}
	cargs[g->n_args] = LLVMGetParam(wf, 1);
	cargs[g->n_args + 1] = LLVMGetParam(wf, 2);
	cargs[g->n_args + 2] = LLVMGetParam(wf, 3);
	LLVMBuildCall2(g->b, bft, bf, cargs, g->n_args + 3, "");
	LLVMBuildRetVoid(g->b);
	return 0;
}

static void gen_init(gen_t *g, cctx_t *c, void *llvm_ctx, void *llvm_mod)
{
	memset(g, 0, sizeof(*g));
	g->c = c;
	g->red_unroll = RED_UNROLL;
	g->pf_var = -1;
	g->rot_var = -1;
	g->tile_var = -1;
	g->ctx = llvm_ctx;
	g->mod = llvm_mod;
	g->b = LLVMCreateBuilderInContext(g->ctx);
	g->i1 = LLVMInt1TypeInContext(g->ctx);
	g->i8 = LLVMInt8TypeInContext(g->ctx);
	g->i16 = LLVMInt16TypeInContext(g->ctx);
	g->i32 = LLVMInt32TypeInContext(g->ctx);
	g->i64 = LLVMInt64TypeInContext(g->ctx);
	g->f16 = LLVMHalfTypeInContext(g->ctx);
	g->f32 = LLVMFloatTypeInContext(g->ctx);
	g->f64 = LLVMDoubleTypeInContext(g->ctx);
	g->ptr = LLVMPointerTypeInContext(g->ctx, 0);
	g->voidt = LLVMVoidTypeInContext(g->ctx);
	g->use_libmvec = c->use_libmvec;
	/* a zeroed block that masked-off scalar loads, and vector loads
	 * under a lane-uniform guard (load_guarded_row), read instead */
	LLVMTypeRef zt = LLVMArrayType(g->i64, CG_ZERO_BYTES / 8);
	g->zero_page = LLVMAddGlobal(g->mod, zt, "kiln_zero_page");
	LLVMSetInitializer(g->zero_page, LLVMConstNull(zt));
	LLVMSetLinkage(g->zero_page, LLVMInternalLinkage);
	LLVMSetGlobalConstant(g->zero_page, 1);
	LLVMSetAlignment(g->zero_page, 64);
}

static void gen_fini(gen_t *g)
{
	free(g->memo.key);
	free(g->memo.val);
	LLVMDisposeBuilder(g->b);
}

/* IR instructions in the functions after `after` (NULL: all). */
static uint64_t funcs_size(LLVMModuleRef m, LLVMValueRef after)
{
	uint64_t n = 0;
	for (LLVMValueRef f = after ? LLVMGetNextFunction(after)
				    : LLVMGetFirstFunction(m);
	     f != NULL; f = LLVMGetNextFunction(f))
		for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f);
		     bb != NULL; bb = LLVMGetNextBasicBlock(bb))
			for (LLVMValueRef in = LLVMGetFirstInstruction(bb);
			     in != NULL; in = LLVMGetNextInstruction(in))
				n++;
	return n;
}

/* ---- identical bodies ----------------------------------------------------
 * Models repeat themselves: every transformer block, every residual block of
 * a stage has the same kernels over other buffers. A body whose IR is that of
 * a body generated before is not optimized and emitted again: its callers
 * call the first one (in another module: a hidden symbol the linker resolves
 * inside the .so). The key (body_key) is the body's printed IR without its
 * own name and its loop-metadata numbers (which count across the module);
 * equal keys are compared in full. */

/* Pointer-keyed table of strings or numbers (open addressing). */
typedef struct ptab {
	const void **key;
	char **str;
	uint32_t *num;
	uint32_t cap, n;
} ptab_t;

static uint32_t ptab_slot(const ptab_t *t, const void *k)
{
	uint64_t h = (uint64_t)(uintptr_t)k * 0x9e3779b97f4a7c15ull;
	uint32_t j = (uint32_t)(h >> 32) & (t->cap - 1);
	while (t->key[j] != NULL && t->key[j] != k)
		j = (j + 1) & (t->cap - 1);
	return j;
}

static bool ptab_grow(ptab_t *t)
{
	if ((t->n + 1) * 2 <= t->cap)
		return true;
	ptab_t o = *t;
	t->cap = o.cap ? 2 * o.cap : 256;
	t->n = 0;
	t->key = calloc(t->cap, sizeof(*t->key));
	t->str = calloc(t->cap, sizeof(*t->str));
	t->num = calloc(t->cap, sizeof(*t->num));
	if (t->key == NULL || t->str == NULL || t->num == NULL) {
		free(t->key);
		free(t->str);
		free(t->num);
		*t = o;
		return false;
	}
	for (uint32_t i = 0; i < o.cap; i++)
		if (o.key[i] != NULL) {
			uint32_t j = ptab_slot(t, o.key[i]);
			t->key[j] = o.key[i];
			t->str[j] = o.str[i];
			t->num[j] = o.num[i];
			t->n++;
		}
	free(o.key);
	free(o.str);
	free(o.num);
	return true;
}

/* Enters k with number num (k not yet in t). */
static bool ptab_number(ptab_t *t, const void *k, uint32_t num)
{
	if (!ptab_grow(t))
		return false;
	uint32_t j = ptab_slot(t, k);
	t->key[j] = k;
	t->num[j] = num;
	t->n++;
	return true;
}

static void ptab_free(ptab_t *t, bool strings)
{
	for (uint32_t i = 0; strings && i < t->cap; i++)
		if (t->key[i] != NULL)
			LLVMDisposeMessage(t->str[i]);
	free(t->key);
	free(t->str);
	free(t->num);
	memset(t, 0, sizeof(*t));
}

typedef struct body_rec {
	uint64_t shape; /* body_shape: compared first */
	uint64_t h;	/* of key, once printed */
	char *key;	/* NULL until another body has the same shape */
	LLVMValueRef fn;
	int mod;
	bool exported;
} body_rec_t;

typedef struct body_set {
	body_rec_t *r;
	uint32_t n, cap;
	ptab_t text; /* printed constants and types (body_key) */
} body_set_t;

/* Appends n bytes to a growing string (NULL when out of memory). */
static char *key_cat(char *k, size_t *len, size_t *cap, const char *t, size_t n)
{
	if (k == NULL)
		return NULL;
	if (*len + n + 1 > *cap) {
		size_t c = *cap * 2 > *len + n + 1 ? *cap * 2 : *len + n + 1;
		char *nk = realloc(k, c);
		if (nk == NULL) {
			free(k);
			return NULL;
		}
		k = nk;
		*cap = c;
	}
	memcpy(k + *len, t, n);
	*len += n;
	k[*len] = '\0';
	return k;
}

/* The text of a constant or type, printed once per LLVM object (constants
 * and types are unique within a context, and live as long as it). */
static const char *printed(ptab_t *t, const void *obj, bool is_type)
{
	if (!ptab_grow(t))
		return NULL;
	uint32_t j = ptab_slot(t, obj);
	if (t->key[j] == NULL) {
		char *s = is_type ? LLVMPrintTypeToString((LLVMTypeRef)obj)
				  : LLVMPrintValueToString((LLVMValueRef)obj);
		if (s == NULL)
			return NULL;
		t->key[j] = obj;
		t->str[j] = s;
		t->n++;
	}
	return t->str[j];
}

typedef struct keyb {
	char *k;
	size_t len, cap;
	ptab_t *text; /* constants and types, shared by every key */
	ptab_t local; /* this body's arguments, blocks, instructions */
} keyb_t;

static void kb_put(keyb_t *b, const char *t, size_t n)
{
	b->k = key_cat(b->k, &b->len, &b->cap, t, n);
}

static void kb_str(keyb_t *b, const char *t)
{
	if (t == NULL) {
		free(b->k);
		b->k = NULL;
		return;
	}
	kb_put(b, t, strlen(t));
	kb_put(b, "\x1f", 1);
}

static void kb_num(keyb_t *b, char tag, long long v)
{
	char t[32];
	int n = snprintf(t, sizeof(t), "%c%lld", tag, v);
	kb_put(b, t, (size_t)n);
}

static void kb_type(keyb_t *b, LLVMTypeRef t)
{
	kb_str(b, printed(b->text, t, true));
}

/* An operand: a local value by its number, a global by its name, a
 * constant by its text. */
static void kb_operand(keyb_t *b, LLVMValueRef v)
{
	if (v == NULL) {
		kb_put(b, "~", 1);
		return;
	}
	uint32_t j = ptab_slot(&b->local, v);
	if (b->local.key[j] != NULL) {
		kb_num(b, '%', b->local.num[j]);
	} else if (LLVMIsAGlobalValue(v)) {
		size_t n;
		const char *name = LLVMGetValueName2(v, &n);
		kb_put(b, "@", 1);
		kb_put(b, name, n);
		kb_put(b, "\x1f", 1);
	} else {
		kb_put(b, "=", 1);
		kb_str(b, printed(b->text, v, false));
	}
}

static void kb_attrs(keyb_t *b, LLVMValueRef call, LLVMAttributeIndex idx)
{
	unsigned n = LLVMGetCallSiteAttributeCount(call, idx);
	kb_num(b, 'a', n);
	if (n == 0 || n > 64)
		return;
	LLVMAttributeRef at[64];
	LLVMGetCallSiteAttributes(call, idx, at);
	for (unsigned i = 0; i < n; i++) {
		if (LLVMIsEnumAttribute(at[i])) {
			kb_num(b, 'e', LLVMGetEnumAttributeKind(at[i]));
			kb_num(b, 'v',
			       (long long)LLVMGetEnumAttributeValue(at[i]));
		} else if (LLVMIsStringAttribute(at[i])) {
			unsigned kl, vl;
			const char *k = LLVMGetStringAttributeKind(at[i], &kl);
			const char *v = LLVMGetStringAttributeValue(at[i], &vl);
			kb_put(b, k, kl);
			kb_put(b, "=", 1);
			kb_put(b, v, vl);
		} else {
			kb_put(b, "?", 1); /* a type attribute */
			kb_type(b, LLVMGetTypeAttributeValue(at[i]));
		}
	}
}

/* The key of a body: its signature (its type, each parameter's noalias,
 * the number of its function attributes: gen_kernel gives every body the
 * same ones), then every instruction: opcode, type, operands (local values
 * numbered in order, globals by name, constants by their printed text) and
 * what else the instruction holds (predicates, alignment, atomic ordering,
 * allocated and GEP element types, shuffle masks, call-site attributes,
 * phi blocks, whether it carries metadata). Codegen sets no
 * nsw/nuw/exact or fast-math flags, which the LLVM 16 C API cannot read.
 * Printing each body whole cost 90 ms for a 133-kernel model (0.7 ms a
 * body, most of it formatting the same vector constants again); this
 * prints each distinct constant and type once. */
static char *body_key(LLVMValueRef f, ptab_t *text)
{
	keyb_t b = {malloc(8192), 0, 8192, text, {0}};
	if (b.k == NULL)
		return NULL;
	b.k[0] = '\0';
	uint32_t id = 0;
	bool ok = true;
	for (unsigned i = 0; i < LLVMCountParams(f) && ok; i++) {
		LLVMValueRef a = LLVMGetParam(f, i);
		ok = ptab_number(&b.local, a, id++);
	}
	for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb && ok;
	     bb = LLVMGetNextBasicBlock(bb)) {
		LLVMValueRef bv = LLVMBasicBlockAsValue(bb);
		for (LLVMValueRef v = bv; v != NULL && ok;
		     v = v == bv ? LLVMGetFirstInstruction(bb)
				 : LLVMGetNextInstruction(v)) {
			ok = ptab_number(&b.local, v, id++);
		}
	}
	if (!ok) {
		free(b.k);
		ptab_free(&b.local, false);
		return NULL;
	}
	kb_type(&b, LLVMGlobalGetValueType(f));
	unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
	for (unsigned i = 0; i < LLVMCountParams(f); i++)
		kb_num(&b, 'n',
		       LLVMGetEnumAttributeAtIndex(f, i + 1, noalias) != NULL);
	kb_num(&b, '#',
	       LLVMGetAttributeCountAtIndex(
		   f, (LLVMAttributeIndex)LLVMAttributeFunctionIndex));
	for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f);
	     bb != NULL && b.k != NULL; bb = LLVMGetNextBasicBlock(bb)) {
		kb_put(&b, "\n:", 2);
		for (LLVMValueRef in = LLVMGetFirstInstruction(bb);
		     in != NULL && b.k != NULL;
		     in = LLVMGetNextInstruction(in)) {
			LLVMOpcode op = LLVMGetInstructionOpcode(in);
			kb_num(&b, '\n', op);
			kb_type(&b, LLVMTypeOf(in));
			int n = LLVMGetNumOperands(in);
			kb_num(&b, '(', n);
			for (int i = 0; i < n; i++)
				kb_operand(&b, LLVMGetOperand(in, (unsigned)i));
			kb_num(&b, 'm', LLVMHasMetadata(in));
			switch (op) {
			case LLVMICmp:
				kb_num(&b, 'p', LLVMGetICmpPredicate(in));
				break;
			case LLVMFCmp:
				kb_num(&b, 'p', LLVMGetFCmpPredicate(in));
				break;
			case LLVMLoad:
			case LLVMStore:
				kb_num(&b, 'l', LLVMGetAlignment(in));
				kb_num(&b, 'v', LLVMGetVolatile(in));
				kb_num(&b, 'o', LLVMGetOrdering(in));
				break;
			case LLVMAlloca:
				kb_num(&b, 'l', LLVMGetAlignment(in));
				kb_type(&b, LLVMGetAllocatedType(in));
				break;
			case LLVMGetElementPtr:
				kb_num(&b, 'i', LLVMIsInBounds(in));
				kb_type(&b, LLVMGetGEPSourceElementType(in));
				break;
			case LLVMShuffleVector:
				for (unsigned i = 0;
				     i < LLVMGetNumMaskElements(in); i++)
					kb_num(&b, 's',
					       LLVMGetMaskValue(in, i));
				break;
			case LLVMPHI:
				for (unsigned i = 0; i < LLVMCountIncoming(in);
				     i++)
					kb_operand(&b, LLVMBasicBlockAsValue(
							   LLVMGetIncomingBlock(
							       in, i)));
				break;
			case LLVMCall:
				kb_type(&b, LLVMGetCalledFunctionType(in));
				kb_num(&b, 't', LLVMIsTailCall(in));
				kb_attrs(&b, in, LLVMAttributeReturnIndex);
				kb_attrs(&b, in,
					 (LLVMAttributeIndex)
					     LLVMAttributeFunctionIndex);
				for (unsigned i = 0;
				     i < LLVMGetNumArgOperands(in); i++)
					kb_attrs(&b, in, i + 1);
				break;
			default: break;
			}
		}
	}
	ptab_free(&b.local, false);
	return b.k;
}

static uint64_t fnv(uint64_t h, uint64_t v)
{
	return (h ^ v) * 1099511628211ull;
}

static uint64_t text_hash(const char *t)
{
	uint64_t h = 1469598103934665603ull;
	for (; *t; t++)
		h = fnv(h, (uint8_t)*t);
	return h;
}

/* A cheap summary of a body (blocks, instructions, their opcodes and
 * operand counts): printing every body to compare keys cost more than the
 * sharing saved; only bodies of equal shape are printed. */
static uint64_t body_shape(LLVMValueRef f)
{
	uint64_t h = fnv(1469598103934665603ull, LLVMCountParams(f));
	for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb != NULL;
	     bb = LLVMGetNextBasicBlock(bb)) {
		h = fnv(h, 0xb10c);
		for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in != NULL;
		     in = LLVMGetNextInstruction(in))
			h = fnv(h, (uint64_t)LLVMGetInstructionOpcode(in) << 8 |
				       (uint64_t)LLVMGetNumOperands(in));
	}
	return h;
}

/* f, just generated in module p: an earlier identical body takes its place
 * (f is deleted; returns true), else f is recorded. Out of memory: f stays,
 * unshared. */
static bool share_body(gen_t *g, int p, body_set_t *bs, LLVMValueRef f)
{
	uint64_t shape = body_shape(f);
	char *key = NULL;
	uint64_t h = 0;
	for (uint32_t i = 0; i < bs->n; i++) {
		body_rec_t *r = &bs->r[i];
		if (r->shape != shape)
			continue;
		if (r->key == NULL) {
			r->key = body_key(r->fn, &bs->text);
			if (r->key == NULL)
				continue;
			r->h = text_hash(r->key);
		}
		if (key == NULL) {
			key = body_key(f, &bs->text);
			if (key == NULL)
				return false;
			h = text_hash(key);
		}
		if (r->h != h || strcmp(r->key, key) != 0)
			continue;
		free(key);
		LLVMValueRef to = r->fn;
		if (r->mod != p) {
			if (!r->exported) {
				LLVMSetLinkage(r->fn, LLVMExternalLinkage);
				LLVMSetVisibility(r->fn, LLVMHiddenVisibility);
				r->exported = true;
			}
			size_t nlen;
			const char *name = LLVMGetValueName2(r->fn, &nlen);
			to = LLVMGetNamedFunction(g[p].mod, name);
			if (to == NULL) {
				to = LLVMAddFunction(g[p].mod, name,
						     LLVMGlobalGetValueType(f));
				LLVMSetVisibility(to, LLVMHiddenVisibility);
			}
		}
		LLVMReplaceAllUsesWith(f, to);
		LLVMDeleteFunction(f);
		return true;
	}
	if (bs->n == bs->cap) {
		uint32_t cap = bs->cap ? 2 * bs->cap : 32;
		body_rec_t *r = realloc(bs->r, cap * sizeof(*r));
		if (r == NULL) {
			free(key);
			return false;
		}
		bs->r = r;
		bs->cap = cap;
	}
	bs->r[bs->n++] = (body_rec_t){shape, h, key, f, p, false};
	return false;
}

static LLVMValueRef body_of(gen_t *g, const kernel_t *k)
{
	char bname[48];
	snprintf(bname, sizeof(bname), "%s_body", k->name);
	return LLVMGetNamedFunction(g->mod, bname);
}

int codegen_modules(cctx_t *c, int n, void **llvm_ctx, void **llvm_mod,
		    bool share, uint32_t *n_shared)
{
	gen_t g[CPU_PAR_MAX];
	uint64_t size[CPU_PAR_MAX];
	if (n < 1 || n > CPU_PAR_MAX)
		return cir_err(c, KILN_EINTERNAL, "codegen: %d modules", n);
	for (int p = 0; p < n; p++) {
		gen_init(&g[p], c, llvm_ctx[p], llvm_mod[p]);
		size[p] = 0;
	}
	body_set_t bs;
	memset(&bs, 0, sizeof(bs));
	*n_shared = 0;
	int rc = 0;
	for (uint32_t i = 0; i < c->n_kernels && rc == 0; i++) {
		if (c->kernels[i].is_fallback || c->kernels[i].is_epilogue)
			continue;
		int p = 0;
		for (int q = 1; q < n; q++)
			if (size[q] < size[p])
				p = q;
		LLVMValueRef last = LLVMGetLastFunction(g[p].mod);
		/* an epilogue first, in its product's module: the product
		 * calls its body */
		bool epi = c->kernels[i].has_epilogue;
		if (epi)
			rc = gen_kernel(&g[p], &c->kernels[i + 1]);
		if (rc == 0)
			rc = gen_kernel(&g[p], &c->kernels[i]);
		/* the epilogue's body first: the product's IR names it */
		if (rc == 0 && share && epi)
			*n_shared += share_body(
			    g, p, &bs, body_of(&g[p], &c->kernels[i + 1]));
		if (rc == 0 && share)
			*n_shared += share_body(g, p, &bs,
						body_of(&g[p], &c->kernels[i]));
		if (n > 1)
			size[p] += funcs_size(g[p].mod, last);
	}
	for (uint32_t i = 0; i < bs.n; i++)
		free(bs.r[i].key);
	free(bs.r);
	ptab_free(&bs.text, true);
	for (int p = 0; p < n; p++)
		gen_fini(&g[p]);
	return rc;
}
