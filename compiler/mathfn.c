/*
 * mathfn.c — transcendental functions emitted as IR, so they vectorize and
 * inline into the kernels (and later carry over to NVPTX unchanged).
 *
 * f32: Cephes-style range reduction + minimax polynomials: exp, log, tanh,
 * sigmoid, sin, cos, tan, atan and the functions built from them
 * (exp2, log2, log1p, expm1). Accuracy: within ~2-4 ulp of the correctly
 * rounded result on the normal range (exp: 1.42, exhaustively); results
 * that would be f32 denormals flush to zero (exp below -87.3); sin/cos
 * lose accuracy for |x| > 8192. erf: a rational approximation, within
 * 3.6e-7 relative (see erf_f32); Φ, the normal cdf gelu uses, is the same
 * rational (phi_f32), or on 16 AVX-512 lanes a table of polynomials
 * (phi_f32_avx512, 6.19e-8 absolute). OP_EXPNP is the exp without an overflow
 * end, for arguments the lowering knows are <= 0 (exp_nonpos_f32); OP_EXPSUB
 * is exp(a - b) for a b that is one value a row (softmax's, log_softmax's and
 * attention's exp(x - max)), in base 2 on AVX-512 (expsub_f32_avx512). On
 * AVX-512, exp (and what is built on it) scales by 2^n with vscalefps
 * (exp_f32_avx512): half the instructions; softmax runs 1.5x faster. f64 and
 * the rare binary functions (pow, atan2) call libm per lane.
 *
 * The alternative, glibc's libmvec (_ZGVeN16v_expf ...), is selected with
 * KILN_MATH=libmvec for exp/log/sin/cos; compiler/README.md records the
 * measurement that made the polynomials the default.
 */
#include "compiler/cg.h"

#include <math.h>
#include <string.h>

#define F(v)		 cg_const_f(g, (v), KILN_DT_F32, w)
#define I(v)		 cg_const_i(g, (v), KILN_DT_I32, w)
#define FADD(x_, y_)	 LLVMBuildFAdd(g->b, (x_), (y_), "")
#define FSUB(x_, y_)	 LLVMBuildFSub(g->b, (x_), (y_), "")
#define FMUL(x_, y_)	 LLVMBuildFMul(g->b, (x_), (y_), "")
#define FDIV(x_, y_)	 LLVMBuildFDiv(g->b, (x_), (y_), "")
#define SEL(c_, x_, y_)	 LLVMBuildSelect(g->b, (c_), (x_), (y_), "")
#define FCMP(p_, x_, y_) LLVMBuildFCmp(g->b, (p_), (x_), (y_), "")

static LLVMValueRef fma_(gen_t *g, LLVMValueRef a, LLVMValueRef b,
			 LLVMValueRef c)
{
	LLVMTypeRef t = LLVMTypeOf(a);
	LLVMValueRef args[3] = {a, b, c};
	return cg_intr(g, "llvm.fma", &t, 1, args, 3);
}

static LLVMValueRef un_intr(gen_t *g, const char *name, LLVMValueRef x)
{
	LLVMTypeRef t = LLVMTypeOf(x);
	return cg_intr(g, name, &t, 1, &x, 1);
}

/* Horner: c[0]*x^(n-1) + ... + c[n-1] */
static LLVMValueRef poly(gen_t *g, LLVMValueRef x, const double *c, int n,
			 int w)
{
	LLVMValueRef y = F(c[0]);
	for (int i = 1; i < n; i++)
		y = fma_(g, y, x, F(c[i]));
	return y;
}

static LLVMValueRef as_int(gen_t *g, LLVMValueRef x, int w)
{
	return LLVMBuildBitCast(g->b, x, cg_type(g, KILN_DT_I32, w), "");
}

static LLVMValueRef as_float(gen_t *g, LLVMValueRef x, int w)
{
	return LLVMBuildBitCast(g->b, x, cg_type(g, KILN_DT_F32, w), "");
}

static bool has_dq(gen_t *g)
{
	return strstr(g->c->target->features, "+avx512dq") != NULL;
}

/* vreduceps of 16 lanes with immediate imm: x less x rounded (imm's low
 * bits: 0 to nearest, 1 down) to 2^-(imm >> 4) (AVX512DQ). */
static LLVMValueRef vreduce_ps(gen_t *g, LLVMValueRef x, int imm)
{
	LLVMValueRef ra[5] = {x, LLVMConstInt(g->i32, (unsigned)imm, 0), x,
			      LLVMConstInt(g->i16, 0xffff, 0),
			      LLVMConstInt(g->i32, 4, 0)};
	return cg_intr(g, "llvm.x86.avx512.mask.reduce.ps.512", NULL, 0, ra, 5);
}

/* exp on 16 f32 lanes of an AVX-512 target: x clamped to [-150, 88.8]
 * (NaN passes the ordered comparisons), n = round(x·log2 e), r = x - n·ln 2
 * in two steps, e^r by a degree-5 minimax polynomial on [-ln2/2, ln2/2]
 * (XNNPACK's rr2-p5 coefficients), then vscalefps multiplies by 2^n and
 * itself gives +inf above the range, denormals and 0 below it and NaN for
 * NaN: 13 instructions where the portable form needs 25. Same accuracy
 * (<= 2 ulp on the normal range); denormal results are kept instead of
 * flushed. nonpos (OP_EXPNP, x <= 88.3): without the upper clamp, which
 * is there for x = +inf (whose r would be NaN) and which such an x never
 * reaches (one instruction fewer on softmax's critical path: its kernel
 * over rows of 1024 ran 8.8 cycles a vector in L1 on a Zen 5 instead of
 * 9.45, 10.4 instead of 11.0 at 4 MB: bench README), and with r = x - n·ln 2
 * in one FMA with ln 2 rounded to f32 (0x1.62E430p-1, 1.9e-9 above ln 2),
 * as PyTorch's Vectorized<float>::exp_u20 reduces: r is then off by
 * n·1.9e-9, a relative error of |n|·1.9e-9 in the result. Max 4.73 ulp
 * over every f32 in [-87.33, 0] (at -86.9, results near 2^-126), 2.44 ulp
 * on [-20, 0], against 1.98 with the two-step r; absolute error 1.12e-7
 * either way. One FMA fewer on the FMA pipes, which bound softmax's exp
 * pass: with prefetch_pass (codegen.c), softmax over rows of 1024
 * (bench_kernels --threads 2, alternated, two rounds each) 4 MB 119-123
 * -> 127 GB/s; 16 MB 120 -> 138 in the round where memory was as fast as
 * before (86 in the other, with memcpy slow too). */
static LLVMValueRef exp_f32_avx512(gen_t *g, LLVMValueRef x, int w, bool nonpos)
{
	static const double c[] = {0x1.0F9F9Cp-7, 0x1.573A1Ap-5, 0x1.555A80p-3,
				   0x1.FFFDC6p-2, 0x1.FFFFF6p-1, 1.0};
	LLVMValueRef xc =
	    nonpos ? x : SEL(FCMP(LLVMRealOGT, x, F(88.8)), F(88.8), x);
	xc = SEL(FCMP(LLVMRealOLT, xc, F(-150.0)), F(-150.0), xc);
	LLVMValueRef n =
	    un_intr(g, "llvm.roundeven", FMUL(xc, F(1.44269504088896341)));
	LLVMValueRef r;
	if (nonpos) {
		r = fma_(g, n, F(-0x1.62E430p-1), xc);
	} else {
		r = fma_(g, n, F(-0x1.62E400p-1), xc);
		r = fma_(g, n, F(-0x1.7F7D1Cp-20), r);
	}
	LLVMValueRef p = poly(g, r, c, 6, w);
	LLVMValueRef args[5] = {p, n, p, LLVMConstInt(g->i16, 0xffff, 0),
				LLVMConstInt(g->i32, 4, 0)};
	return cg_intr(g, "llvm.x86.avx512.mask.scalef.ps.512", NULL, 0, args,
		       5);
}

/* exp elsewhere (AVX2, SSE, scalar): x clamped below at -87.34 (NaN
 * passes the ordered comparison), n = round(x·log2 e) by adding 1.5·2^23 +
 * 127 in the FMA (t's low mantissa bits are then n + 127, so 2^n = s is t's
 * bits shifted left by 23: no conversion), n <= 127 so that s stays finite,
 * r = x - n·ln 2 in two steps, then e^x = s + (r·s)·p(r) with p of degree
 * 5, fitted (Lawson-weighted least squares, minimax relative error) on
 * [-ln 2/2, ln 2]: the wider r is the one n = 127 leaves for x up to
 * 88.72. Then the overflow (+inf from 88.7228..., where expf overflows)
 * and underflow (0) results by x. Max error 1.42 ulp over every f32 in
 * [-87.33, 88.72] (checked exhaustively against exp in f64), where the
 * Cephes form it replaced had 5.1 ulp; 18 instructions and 12 vector
 * constants where that took 21 and 15, so AVX2's 16 registers hold more
 * of them. x needs no clamp from above: +inf and large x make r and p
 * +inf (every coefficient is positive), never NaN, and the select gives
 * +inf anyway. NaN propagates: every step keeps it. */
static LLVMValueRef exp_f32(gen_t *g, LLVMValueRef x, int w)
{
	if (w == 16 && g->c->vec_width == 16)
		return exp_f32_avx512(g, x, w, false);
	static const double p[] = {0.001631438982736419, 0.008318852521173259,
				   0.04162001604093293,	 0.16667202859966074,
				   0.5000022760403067,	 0.999999878208344};
	const double hi = 88.72283935546875, lo = -87.33654475;
	const double magic = 12582912.0 + 127.0; /* 1.5·2^23 + bias */
	LLVMValueRef xc = SEL(FCMP(LLVMRealOLT, x, F(lo)), F(lo), x);
	LLVMValueRef t = fma_(g, xc, F(1.44269504088896341), F(magic));
	t = SEL(FCMP(LLVMRealOGT, t, F(magic + 127.0)), F(magic + 127.0), t);
	LLVMValueRef n = FSUB(t, F(magic));
	LLVMValueRef r = fma_(g, n, F(-0.693359375), xc);
	r = fma_(g, n, F(2.12194440e-4), r);
	LLVMValueRef s =
	    as_float(g, LLVMBuildShl(g->b, as_int(g, t, w), I(23), ""), w);
	LLVMValueRef y = fma_(g, FMUL(r, s), poly(g, r, p, 6, w), s);
	y = SEL(FCMP(LLVMRealOGE, x, F(hi)), F(INFINITY), y);
	return SEL(FCMP(LLVMRealOLT, x, F(lo)), F(0.0), y);
}

/* exp of an x known not to be large and positive (OP_EXPNP): the lowering
 * uses it where x <= 0 up to rounding (x - max(x) in softmax, -x²/2), and
 * it is exact enough for any x <= 88.3. Without the overflow end, n needs
 * no clamp and r stays in [-ln 2/2, ln 2/2], where a degree-4 p (XNNPACK's
 * rr2-p5 coefficients) is within 1.98 ulp (every f32 in [-87.33, 0],
 * exhaustively): 14 instructions and 10 constants against the general
 * exp's 18 and 12. Below -87.34 the result is 0, and NaN propagates. On
 * AVX-512 vectors it is the vscalefps exp without its upper clamp. */
static LLVMValueRef exp_nonpos_f32(gen_t *g, LLVMValueRef x, int w)
{
	if (w == 16 && g->c->vec_width == 16)
		return exp_f32_avx512(g, x, w, true);
	static const double c[] = {0x1.0F9F9Cp-7, 0x1.573A1Ap-5, 0x1.555A80p-3,
				   0x1.FFFDC6p-2, 0x1.FFFFF6p-1};
	const double lo = -87.33654475;
	const double magic = 12582912.0 + 127.0;
	LLVMValueRef xc = SEL(FCMP(LLVMRealOLT, x, F(lo)), F(lo), x);
	LLVMValueRef t = fma_(g, xc, F(1.44269504088896341), F(magic));
	LLVMValueRef n = FSUB(t, F(magic));
	LLVMValueRef r = fma_(g, n, F(-0x1.62E400p-1), xc);
	r = fma_(g, n, F(-0x1.7F7D1Cp-20), r);
	LLVMValueRef s =
	    as_float(g, LLVMBuildShl(g->b, as_int(g, t, w), I(23), ""), w);
	LLVMValueRef y = fma_(g, FMUL(r, s), poly(g, r, c, 5, w), s);
	return SEL(FCMP(LLVMRealOLT, x, F(lo)), F(0.0), y);
}

/* The scalar a splat of cg_splat's form (insertelement at 0, shuffle by
 * zeros) spreads over the lanes, or NULL. */
static LLVMValueRef splat_scalar(LLVMValueRef v)
{
	if (LLVMIsAShuffleVectorInst(v) == NULL)
		return NULL;
	unsigned n = LLVMGetNumMaskElements(v);
	for (unsigned i = 0; i < n; i++)
		if (LLVMGetMaskValue(v, i) != 0)
			return NULL;
	LLVMValueRef ins = LLVMGetOperand(v, 0);
	if (LLVMIsAInsertElementInst(ins) == NULL)
		return NULL;
	LLVMValueRef ix = LLVMGetOperand(ins, 2);
	if (!LLVMIsAConstantInt(ix) || LLVMConstIntGetZExtValue(ix) != 0)
		return NULL;
	return LLVMGetOperand(ins, 1);
}

/* t - floor(t), in [0, 1): one vreduceps with AVX512DQ; 0 at ±inf, as
 * vreduceps gives. */
static LLVMValueRef frac_f32_avx512(gen_t *g, LLVMValueRef t, int w)
{
	if (has_dq(g)) /* imm 9: round down, precision exception suppressed */
		return vreduce_ps(g, t, 9);
	LLVMValueRef f = FSUB(t, un_intr(g, "llvm.floor", t));
	return SEL(FCMP(LLVMRealOEQ, un_intr(g, "llvm.fabs", t), F(INFINITY)),
		   F(0.0), f);
}

/* 2^t on 16 AVX-512 lanes: gv·(1 + f·q(f))·2^floor(t), f = t - floor(t),
 * with q's coefficients (and the 1) times the vector gv (NULL: 1). */
static LLVMValueRef exp2_f32_avx512(gen_t *g, LLVMValueRef t, LLVMValueRef gv,
				    int w)
{
	static const double q[] = {0x1.e97500p-10, 0x1.277854p-7, 0x1.c91ce6p-5,
				   0x1.ebdb56p-3,  0x1.62e4bap-1, 1.0};
	LLVMValueRef f = frac_f32_avx512(g, t, w);
	LLVMValueRef p = NULL;
	for (int k = 0; k < 6; k++) {
		LLVMValueRef ck = gv != NULL ? FMUL(F(q[k]), gv) : F(q[k]);
		p = p == NULL ? ck : fma_(g, p, f, ck);
	}
	LLVMValueRef args[5] = {p, t, p, LLVMConstInt(g->i16, 0xffff, 0),
				LLVMConstInt(g->i32, 4, 0)};
	return cg_intr(g, "llvm.x86.avx512.mask.scalef.ps.512", NULL, 0, args,
		       5);
}

/* exp(a - b) on 16 AVX-512 lanes (OP_EXPSUB: softmax's and log_softmax's
 * exp(x - max), attention's exp(s - m) and exp(s - lse); a <= b up to
 * rounding or NaN) where b is one value for all lanes (a row's, whose own
 * work the loop hoists), in base 2 without forming a - b: t = a·L - b·L in
 * one FMA (L = log2 e rounded to f32), f = t - floor(t) ∈ [0, 1) in one
 * vreduceps (exact, but for a tiny negative t: 1 - 2^-24), 2^f = 1 + f·q(f)
 * with q of degree 4 (minimax relative error on [0, 1]: 9.4e-8 with the
 * coefficients rounded to f32), and vscalefps multiplies by 2^floor(t) (its
 * own floor). 6 FMAs, a vreduceps and a vscalefps a vector, where
 * exp_f32_avx512(a - b) takes a subtraction, a clamp, a multiply, a
 * vrndscaleps, 6 FMAs and a vscalefps: softmax's exp pass is bound by those
 * pipes; its kernel over rows of 1024 ran 5-8% faster (one thread,
 * compiler/README.md). b·L is rounded to c = -(b·L) before the FMA adds it,
 * so t is off by the residual r = b·L + c (exact in f32, one FMA, up to
 * ulp(b·L)/2) for the whole row: 2^-r multiplies q's coefficients (once a
 * row), so the result is e^(a - b) per element with no factor left over, and
 * lanes computed another way (the loop's scalar rest) agree. |b| > 2^30
 * takes t = 2a - 2b (below 2^126) or a - b: every nonzero a - b is then at
 * least 128 (b's ulp, or a below 2^30), where 2^(2(a - b)) and 2^(a - b)
 * (|b| >= 2^126) are 0 as e^(a - b) is, and 1 at a = b (at b = 2^30 itself,
 * a = 2^30 - 64 is a float, so 2^30 stays in the first way); this keeps r <=
 * 64 (|b·L| < 2^31) so 2^-r is a normal f32. Specials: a = -inf gives t =
 * -inf, f = 0 and 0; NaN stays NaN; b = ±inf or NaN give t = NaN or -inf (a
 * - b's NaN or 0). Accuracy: t is rounded once where the exp of the f32 a -
 * b had its own rounding of a - b (exact only for a near b): ln 2·ulp(t)/2
 * relative, up to |a - b| ulp, plus 0.22·|a - b| ulp from L's rounding;
 * softmax within 6 + 1.25·|x - max| ulp of f64 (codegen::softmax_exp; 62 ulp
 * at -86 on rows whose max is 0, where x - max is exact and exp_f32_avx512
 * had 4.7; on rows of random logits the max error is the same as before, the
 * mean 1.1-1.6x: compiler/README.md). A b that is not one value for all
 * lanes (softmax over columns, vectorized across rows) takes
 * exp_f32_avx512(a - b): its per-row work would be per vector. */
static LLVMValueRef expsub_f32_avx512(gen_t *g, LLVMValueRef a, LLVMValueRef b,
				      int w)
{
	LLVMValueRef bs = splat_scalar(b);
	if (bs == NULL || LLVMTypeOf(bs) != g->f32)
		return exp_f32_avx512(g, FSUB(a, b), w, true);
	const double l2e = 1.44269504088896341;
#define S(v_) cg_const_f(g, (v_), KILN_DT_F32, 1) /* one lane */
	LLVMValueRef bl = LLVMBuildFMul(g->b, bs, S(l2e), "");
	LLVMValueRef r = fma_(g, bs, S(l2e), LLVMBuildFNeg(g->b, bl, ""));
	LLVMValueRef ab = un_intr(g, "llvm.fabs", bs);
	LLVMValueRef ra = LLVMBuildFCmp(g->b, LLVMRealOLE, ab, S(1073741824.0),
					""); /* 2^30 */
	LLVMValueRef rb = LLVMBuildFCmp(g->b, LLVMRealOLE, ab, S(0x1p126), "");
	LLVMValueRef lr = SEL(ra, S(l2e), SEL(rb, S(2.0), S(1.0)));
	LLVMValueRef cr = LLVMBuildFNeg(
	    g->b, SEL(ra, bl, SEL(rb, LLVMBuildFMul(g->b, bs, S(2.0), ""), bs)),
	    "");
	LLVMValueRef nr = SEL(ra, LLVMBuildFNeg(g->b, r, ""), S(0.0));
	LLVMValueRef nv = cg_splat(g, nr, w);
	LLVMValueRef gv = exp2_f32_avx512(g, nv, NULL, w);
	LLVMValueRef t = fma_(g, a, cg_splat(g, lr, w), cg_splat(g, cr, w));
	return exp2_f32_avx512(g, t, gv, w);
#undef S
}

static LLVMValueRef log_f32(gen_t *g, LLVMValueRef x, int w)
{
	static const double p[] = {
	    7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
	    -1.2420140846E-1, 1.4249322787E-1,	-1.6668057665E-1,
	    2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
	/* scale denormals up */
	LLVMValueRef den = FCMP(LLVMRealOLT, x, F(1.17549435e-38));
	LLVMValueRef xs = SEL(den, FMUL(x, F(8388608.0)), x);
	LLVMValueRef eoff = SEL(den, F(-23.0), F(0.0));
	LLVMValueRef xi = as_int(g, xs, w);
	LLVMValueRef e =
	    LLVMBuildSub(g->b, LLVMBuildLShr(g->b, xi, I(23), ""), I(126), "");
	LLVMValueRef m = as_float(
	    g,
	    LLVMBuildOr(g->b, LLVMBuildAnd(g->b, xi, I(0x007fffff), ""),
			I(0x3f000000), ""),
	    w); /* [0.5, 1) */
	LLVMValueRef ef = FADD(
	    LLVMBuildSIToFP(g->b, e, cg_type(g, KILN_DT_F32, w), ""), eoff);
	LLVMValueRef small = FCMP(LLVMRealOLT, m, F(0.707106781186547524));
	ef = SEL(small, FSUB(ef, F(1.0)), ef);
	m = SEL(small, FSUB(FADD(m, m), F(1.0)), FSUB(m, F(1.0)));
	LLVMValueRef z = FMUL(m, m);
	LLVMValueRef y = FMUL(FMUL(poly(g, m, p, 9, w), m), z);
	y = fma_(g, ef, F(-2.12194440e-4), y);
	y = fma_(g, z, F(-0.5), y);
	LLVMValueRef r = FADD(m, y);
	r = fma_(g, ef, F(0.693359375), r);
	/* specials */
	r = SEL(FCMP(LLVMRealOEQ, x, F(INFINITY)), F(INFINITY), r);
	r = SEL(FCMP(LLVMRealOEQ, x, F(0.0)), F(-INFINITY), r);
	r = SEL(FCMP(LLVMRealOLT, x, F(0.0)), F(NAN), r);
	return SEL(FCMP(LLVMRealUNO, x, x), x, r);
}

static LLVMValueRef tanh_f32(gen_t *g, LLVMValueRef x, int w)
{
	static const double p[] = {-5.70498872745E-3, 2.06390887954E-2,
				   -5.37397155531E-2, 1.33314422036E-1,
				   -3.33332819422E-1};
	LLVMValueRef ax = un_intr(g, "llvm.fabs", x);
	LLVMValueRef z = FMUL(x, x);
	LLVMValueRef small = fma_(g, FMUL(poly(g, z, p, 5, w), z), x, x);
	/* tanh |x| = (1 - e)/(1 + e) with e = exp(-2|x|) in (0, 1]: the exp
	 * without an overflow end, and 0 (so 1) beyond |x| = 43.7 */
	LLVMValueRef e = exp_nonpos_f32(g, FMUL(ax, F(-2.0)), w);
	LLVMValueRef big = FDIV(FSUB(F(1.0), e), FADD(F(1.0), e));
	LLVMValueRef xt = as_int(g, x, w);
	LLVMValueRef sign = LLVMBuildAnd(g->b, xt, I((int32_t)0x80000000), "");
	big = as_float(g, LLVMBuildOr(g->b, as_int(g, big, w), sign, ""), w);
	LLVMValueRef r = SEL(FCMP(LLVMRealOLT, ax, F(0.625)), small, big);
	return SEL(FCMP(LLVMRealUNO, x, x), x, r);
}

static LLVMValueRef sigmoid_f32(gen_t *g, LLVMValueRef x, int w)
{
	LLVMValueRef e = exp_f32(g, LLVMBuildFNeg(g->b, x, ""), w);
	return FDIV(F(1.0), FADD(F(1.0), e));
}

/* erf(x) = x·P(x²)/Q(x²) on |x| <= 3.92, ±1 beyond (where erf rounds to ±1
 * in f32): a rational approximation of the shape Eigen and XLA use
 * (generic_fast_erf_float), refitted for kiln (Lawson-weighted least
 * squares for minimax absolute error on [0, 3.92], the first coefficient
 * fixed at 2/√π so small x keep their relative accuracy: 5.1e-8 in f64). 12
 * FMAs, one division, no exp and no select between two branches, so the whole
 * function stays in vector registers: twice the speed of the erfc·exp
 * formulation it replaced (an AVX-512 reciprocal estimate in place of the
 * division measured no faster). Measured error in f32 (FMA Horner): <= 3.2e-7
 * absolute, about 5 ulp just below 1; torch's own is 0.5 ulp. NaN
 * propagates through the ordered comparisons. */
static const double erf_a[] = {1.9878696022601616e-08, -1.9690251065185294e-06,
			       0.00014454012853093445, 0.00380995636805892,
			       0.050912633538246155,   0.20242539048194885,
			       1.1283791670955126};
static const double erf_b[] = {0.0009826034074649215, 0.014571679756045341,
			       0.11603943258523941, 0.5127262473106384, 1.0};

static LLVMValueRef erf_f32(gen_t *g, LLVMValueRef x, int w)
{
	const double *a = erf_a, *b = erf_b;
	LLVMValueRef ax = un_intr(g, "llvm.fabs", x);
	LLVMValueRef big = FCMP(LLVMRealOGT, ax, F(3.92));
	LLVMValueRef xc = SEL(big, F(0.0), x);
	LLVMValueRef z = FMUL(xc, xc);
	LLVMValueRef r =
	    FDIV(FMUL(xc, poly(g, z, a, 7, w)), poly(g, z, b, 5, w));
	LLVMTypeRef t = LLVMTypeOf(x);
	LLVMValueRef cs[2] = {F(1.0), x};
	LLVMValueRef one = cg_intr(g, "llvm.copysign", &t, 1, cs, 2);
	return SEL(big, one, r);
}

/* compiler/fit_phi.py: row k holds the coefficients of s^(4-k) */
/* clang-format off */
static const float phi_tab[5][32] = {
	{-0x1.38bb9ap-19f, -0x1.30652p-17f, -0x1.188f7ap-16f, -0x1.6e6cc8p-16f,
	 -0x1.900cc8p-16f, -0x1.7df044p-16f, -0x1.41bb36p-16f, -0x1.d5e342p-17f,
	 -0x1.15e444p-17f, -0x1.896914p-19f, 0x1.772a1ep-20f, 0x1.26318cp-18f,
	 0x1.9368dep-18f, 0x1.b3434ep-18f, 0x1.9ae5b4p-18f, 0x1.616dfcp-18f,
	 0x1.1a5c84p-18f, 0x1.a7b95cp-19f, 0x1.2cade8p-19f, 0x1.957acep-20f,
	 0x1.04a88p-20f, 0x1.404a7ap-21f, 0x1.78dc02p-22f, 0x1.a9399cp-23f,
	 0x1.cca858p-24f, 0x1.df992ap-25f, 0x1.e03f48p-26f, 0x1.ced734p-27f,
	 0x1.ad8fb2p-28f, 0x1.801caep-29f, 0x1.4b109cp-30f, 0.0f},
	{0x1.958fd6p-12f, 0x1.809a3ap-12f, 0x1.49cc16p-12f, 0x1.efd288p-13f,
	 0x1.2dfdb4p-13f, 0x1.a20636p-15f, -0x1.236a7ap-15f, -0x1.a983cep-14f,
	 -0x1.3243b6p-13f, -0x1.60c60ep-13f, -0x1.6658f8p-13f, -0x1.4d21cp-13f,
	 -0x1.20a492p-13f, -0x1.d7137p-14f, -0x1.6c6834p-14f, -0x1.0c671ap-14f,
	 -0x1.79a26ep-15f, -0x1.fca2p-16f, -0x1.487afap-16f, -0x1.9769a8p-17f,
	 -0x1.e5c15ap-18f, -0x1.169de4p-18f, -0x1.33bbe8p-19f, -0x1.47749ap-20f,
	 -0x1.4fdbdcp-21f, -0x1.4c2e86p-22f, -0x1.3cef48p-23f, -0x1.23cb8ap-24f,
	 -0x1.034fbap-25f, -0x1.bcfa1cp-27f, -0x1.70b05p-28f, 0.0f},
	{-0x1.8622e2p-23f, 0x1.2a8304p-10f, 0x1.1c6624p-9f, 0x1.89846p-9f,
	 0x1.d49fb2p-9f, 0x1.fa904ep-9f, 0x1.fcf878p-9f, 0x1.e1632p-9f,
	 0x1.afd61ep-9f, 0x1.7137aap-9f, 0x1.2de01cp-9f, 0x1.d92b3ap-10f,
	 0x1.641494p-10f, 0x1.01a684p-10f, 0x1.66e038p-11f, 0x1.e184e4p-12f,
	 0x1.37623ap-12f, 0x1.8467eep-13f, 0x1.d376c2p-14f, 0x1.0f8744p-14f,
	 0x1.30918ep-15f, 0x1.49f2a4p-16f, 0x1.594cdep-17f, 0x1.5d299ap-18f,
	 0x1.55342cp-19f, 0x1.4245aap-20f, 0x1.263f78p-21f, 0x1.03bd5cp-22f,
	 0x1.bb60c6p-24f, 0x1.6def1ep-25f, 0x1.2412c2p-26f, 0.0f},
	{-0x1.259f18p-4f, -0x1.20eb56p-4f, -0x1.13428ep-4f, -0x1.fbd42cp-5f,
	 -0x1.c59092p-5f, -0x1.883a7p-5f, -0x1.4868eep-5f, -0x1.0a3d1cp-5f,
	 -0x1.a1f58ap-6f, -0x1.3da584p-6f, -0x1.d37a9ap-7f, -0x1.4d105cp-7f,
	 -0x1.cb841ap-8f, -0x1.32ead4p-8f, -0x1.8cf66cp-9f, -0x1.f11cfep-10f,
	 -0x1.2d603ep-10f, -0x1.61cf32p-11f, -0x1.922afep-12f, -0x1.ba9cap-13f,
	 -0x1.d7a55p-14f, -0x1.e69da4p-15f, -0x1.e61becp-16f, -0x1.d62c86p-17f,
	 -0x1.b84fe2p-18f, -0x1.8f3ec8p-19f, -0x1.5e81a8p-20f, -0x1.29f0bep-21f,
	 -0x1.ea6bfep-23f, -0x1.86cd68p-24f, -0x1.2d8612p-25f, 0.0f},
	{0x1.0p-1f, 0x1.b6fcdcp-2f, 0x1.704ap-2f, 0x1.2ep-2f,
	 0x1.e3a14ap-3f, 0x1.79cea6p-3f, 0x1.1fb8bp-3f, 0x1.aaecdap-4f,
	 0x1.34612cp-4f, 0x1.b182fep-5f, 0x1.285e34p-5f, 0x1.89f65cp-6f,
	 0x1.fcf47cp-7f, 0x1.3f65dcp-7f, 0x1.855abap-8f, 0x1.ccddd2p-9f,
	 0x1.08c89p-9f, 0x1.274c82p-10f, 0x1.3f93eep-11f, 0x1.4f8de4p-12f,
	 0x1.55c93cp-13f, 0x1.51ab82p-14f, 0x1.43895ap-15f, 0x1.2c9b5p-16f,
	 0x1.0ed0e4p-17f, 0x1.d9160ep-19f, 0x1.9096fep-20f, 0x1.48d04ep-21f,
	 0x1.059cf8p-22f, 0x1.937cfep-24f, 0x1.2d9022p-25f, 0.0f},
};
/* clang-format on */

/* Φ on 16 lanes of an AVX-512 target (OP_PHI; gelu is x·Φ(x)): q =
 * Φ(-|x|) from a table of 32 polynomials of degree 4, one for each interval
 * of width H = 23/128 centred on j·H, j = 0..31, then Φ(x) = 1 - q for x >
 * 0 and q otherwise. |x| is clamped to 31·H; u = |x|/H; s = u - round(u) ∈
 * [-1/2, 1/2] is one vreduceps (exact; u - roundeven(u) without AVX512DQ)
 * and j is the low 5 bits of u + 1.5·2^23; each coefficient is one
 * vpermt2ps from two registers of 16 lanes (a row of phi_tab); the
 * polynomial in s runs in Horner's order. Interval 31 (|x| > 30.5·H =
 * 5.4805, where Φ is within 2.1e-8 of 0 or 1) is 0, so gelu(x) is x and -0
 * there as
 * torch's is beyond 5.5437; +inf gives +inf, -inf NaN (-inf·0, as torch)
 * and NaN NaN (the clamp keeps it, and x > 0 is false). Error: 6.19e-8
 * absolute (Φ's f32 ulp just below 1 is 6e-8); compiler/fit_phi.py fits
 * the table and measures it.
 * The table over both signs it replaced (31 intervals of width 23/64 on
 * [-5.54, 5.54], degree 5 in Estrin's order) took 7 multiplies and FMAs
 * and 6 permutes, with 1.02e-7; this takes 5 and 5, and three operations
 * off the FMA pipes (the abs, the clamp and 1 - q). The rational below
 * takes 12 multiplies and FMAs and a division for Φ. It stays
 * compute-bound: on Zen 5 the permutes issue on the FMA pipes (measured:
 * 8 FMAs and 8 vpermt2ps take as long as 16 FMAs). */
static LLVMValueRef phi_f32_avx512(gen_t *g, LLVMValueRef x, int w)
{
	const double h = 0.1796875, magic = 12582912.0;
	LLVMValueRef a = un_intr(g, "llvm.fabs", x);
	a = SEL(FCMP(LLVMRealOGT, a, F(31.0 * h)), F(31.0 * h), a);
	LLVMValueRef u = FMUL(a, F(1.0 / h));
	LLVMValueRef s;
	if (has_dq(g)) {
		s = vreduce_ps(g, u, 0);
	} else {
		s = FSUB(u, un_intr(g, "llvm.roundeven", u));
	}
	LLVMValueRef idx = as_int(g, FADD(u, F(magic)), w);
	LLVMValueRef q = NULL;
	for (int k = 0; k < 5; k++) {
		LLVMValueRef lo[16], hi[16];
		for (int e = 0; e < 16; e++) {
			lo[e] = LLVMConstReal(g->f32, phi_tab[k][e]);
			hi[e] = LLVMConstReal(g->f32, phi_tab[k][e + 16]);
		}
		LLVMValueRef args[3] = {LLVMConstVector(lo, 16), idx,
					LLVMConstVector(hi, 16)};
		LLVMValueRef ck = cg_intr(
		    g, "llvm.x86.avx512.vpermi2var.ps.512", NULL, 0, args, 3);
		q = q == NULL ? ck : fma_(g, q, s, ck);
	}
	return SEL(FCMP(LLVMRealOGT, x, F(0.0)), FSUB(F(1.0), q), q);
}

/* Φ(x) = (1 + erf(x/√2))/2, the normal cdf that gelu multiplies by
 * (OP_PHI): erf_f32's rational function with its variable and the /2
 * folded into the coefficients, so Φ(x) = 1/2 + x·P(x²)/Q(x²): the
 * scaling of x² by 1/2 is exact in the powers of 2 it puts on each
 * coefficient; 1/(2√2) rounds P's once more. Where erf is ±1 (|x/√2| >
 * 3.92) x is clamped to ±5.5437, at which the rational is exactly ±1/2 in
 * f32, so Φ is exactly 1 and 0 beyond (gelu(-100) is -0, as torch's).
 * gelu is x·Φ(x): 19 instructions a vector on AVX2 where x/2 (1 + erf(x
 * / √2)) took 25, and 14 of them on the FMA pipes instead of 16; 3 fewer
 * constants. Error: 1.98e-7 absolute over every f32 in [-12, 12] (2.09e-7
 * before), the same cancellation for negative x as torch's formula. NaN
 * passes the ordered comparisons.
 * Tried and measured no faster on Zen 3 (old and new kernel linked into one
 * harness and timed alternately, gelu(x·w + b) over 16 rows of 1024 in L2:
 * 3.6 ns a vector each): Q made monic (one constant fewer, with a clamp at
 * which the monic rational is also ±1/2), the clamp as an integer min of
 * |x|'s bits (off the FMA pipes), and Estrin's scheme for P and Q (a
 * shorter dependency chain). A multiply in place of the division saved 9%:
 * the loop is bound by its FMAs and multiplies. */
static LLVMValueRef phi_f32(gen_t *g, LLVMValueRef x, int w)
{
	if (w == 16 && g->c->vec_width == 16)
		return phi_f32_avx512(g, x, w);
	double p[7], q[5];
	for (int k = 0; k < 7; k++)
		p[k] = ldexp(erf_a[k], -(6 - k)) * 0.35355339059327378;
	for (int k = 0; k < 5; k++)
		q[k] = ldexp(erf_b[k], -(4 - k));
	const double xc = 0x1.62cbfcp+2; /* 3.92·√2 in f32 */
	LLVMValueRef c = SEL(FCMP(LLVMRealOGT, x, F(xc)), F(xc), x);
	c = SEL(FCMP(LLVMRealOLT, c, F(-xc)), F(-xc), c);
	LLVMValueRef u = FMUL(c, c);
	LLVMValueRef r =
	    FDIV(FMUL(c, poly(g, u, p, 7, w)), poly(g, u, q, 5, w));
	return FADD(F(0.5), r);
}

/* sin (want_cos false) or cos of x. */
static LLVMValueRef sincos_f32(gen_t *g, LLVMValueRef x, int w, bool want_cos)
{
	static const double sp[] = {-1.9515295891E-4, 8.3321608736E-3,
				    -1.6666654611E-1};
	static const double cp[] = {2.443315711809948E-005,
				    -1.388731625493765E-003,
				    4.166664568298827E-002};
	LLVMTypeRef it = cg_type(g, KILN_DT_I32, w);
	LLVMValueRef ax = un_intr(g, "llvm.fabs", x);
	LLVMValueRef j =
	    LLVMBuildFPToSI(g->b, FMUL(ax, F(1.27323954473516)), it, "");
	LLVMValueRef odd = LLVMBuildAnd(g->b, j, I(1), "");
	j = LLVMBuildAdd(g->b, j, odd, "");
	LLVMValueRef y =
	    LLVMBuildSIToFP(g->b, j, cg_type(g, KILN_DT_F32, w), "");
	j = LLVMBuildAnd(g->b, j, I(7), "");
	LLVMValueRef gt3 = LLVMBuildICmp(g->b, LLVMIntSGT, j, I(3), "");
	j = SEL(gt3, LLVMBuildSub(g->b, j, I(4), ""), j);
	LLVMValueRef r = fma_(g, y, F(-0.78515625), ax);
	r = fma_(g, y, F(-2.4187564849853515625e-4), r);
	r = fma_(g, y, F(-3.77489497744594108e-8), r);
	LLVMValueRef z = FMUL(r, r);
	LLVMValueRef s = fma_(g, FMUL(poly(g, z, sp, 3, w), z), r, r);
	LLVMValueRef cc = FADD(fma_(g, z, F(-0.5), F(1.0)),
			       FMUL(FMUL(poly(g, z, cp, 3, w), z), z));
	LLVMValueRef j12 =
	    LLVMBuildOr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, j, I(1), ""),
			LLVMBuildICmp(g->b, LLVMIntEQ, j, I(2), ""), "");
	LLVMValueRef res, neg;
	if (!want_cos) {
		res = SEL(j12, cc, s);
		neg = LLVMBuildXor(g->b, FCMP(LLVMRealOLT, x, F(0.0)), gt3, "");
	} else {
		res = SEL(j12, s, cc);
		neg = LLVMBuildXor(g->b, gt3,
				   LLVMBuildICmp(g->b, LLVMIntSGT, j, I(1), ""),
				   "");
	}
	res = SEL(neg, LLVMBuildFNeg(g->b, res, ""), res);
	res = SEL(FCMP(LLVMRealOEQ, ax, F(INFINITY)), F(NAN), res);
	return SEL(FCMP(LLVMRealUNO, x, x), x, res);
}

static LLVMValueRef atan_f32(gen_t *g, LLVMValueRef x, int w)
{
	static const double p[] = {8.05374449538e-2, -1.38776856032E-1,
				   1.99777106478E-1, -3.33329491539E-1};
	LLVMValueRef ax = un_intr(g, "llvm.fabs", x);
	LLVMValueRef big = FCMP(LLVMRealOGT, ax, F(2.414213562373095));
	LLVMValueRef mid = FCMP(LLVMRealOGT, ax, F(0.4142135623730950));
	LLVMValueRef xr =
	    SEL(big, FDIV(F(-1.0), ax),
		SEL(mid, FDIV(FSUB(ax, F(1.0)), FADD(ax, F(1.0))), ax));
	LLVMValueRef y0 = SEL(big, F(1.5707963267948966),
			      SEL(mid, F(0.7853981633974483), F(0)));
	LLVMValueRef z = FMUL(xr, xr);
	LLVMValueRef y =
	    FADD(y0, fma_(g, FMUL(poly(g, z, p, 4, w), z), xr, xr));
	LLVMValueRef xt = as_int(g, x, w);
	LLVMValueRef sign = LLVMBuildAnd(g->b, xt, I((int32_t)0x80000000), "");
	y = as_float(g, LLVMBuildOr(g->b, as_int(g, y, w), sign, ""), w);
	return SEL(FCMP(LLVMRealUNO, x, x), x, y);
}

/* Calls a libm function lane by lane. */
static LLVMValueRef libm_lanes(gen_t *g, const char *name, LLVMValueRef x,
			       LLVMValueRef y, kiln_dtype_t dt, int w)
{
	LLVMTypeRef st = cg_scalar_type(g, dt);
	LLVMTypeRef pt[2] = {st, st};
	unsigned np = y ? 2 : 1;
	LLVMTypeRef ft = LLVMFunctionType(st, pt, np, 0);
	LLVMValueRef f = LLVMGetNamedFunction(g->mod, name);
	if (f == NULL) {
		f = LLVMAddFunction(g->mod, name, ft);
		unsigned nounwind =
		    LLVMGetEnumAttributeKindForName("nounwind", 8);
		LLVMAddAttributeAtIndex(
		    f, LLVMAttributeFunctionIndex,
		    LLVMCreateEnumAttribute(g->ctx, nounwind, 0));
	}
	if (w <= 1) {
		LLVMValueRef args[2] = {x, y};
		return LLVMBuildCall2(g->b, ft, f, args, np, "");
	}
	LLVMValueRef v = LLVMGetUndef(LLVMVectorType(st, (unsigned)w));
	for (int l = 0; l < w; l++) {
		LLVMValueRef li = LLVMConstInt(g->i32, (uint64_t)l, 0);
		LLVMValueRef args[2] = {
		    LLVMBuildExtractElement(g->b, x, li, ""),
		    y ? LLVMBuildExtractElement(g->b, y, li, "") : NULL};
		v = LLVMBuildInsertElement(
		    g->b, v, LLVMBuildCall2(g->b, ft, f, args, np, ""), li, "");
	}
	return v;
}

/* glibc libmvec variants (AVX-512: 16 lanes, AVX2: 8). */
static LLVMValueRef libmvec(gen_t *g, const char *base, LLVMValueRef x, int w)
{
	char name[48];
	if (w == 16)
		snprintf(name, sizeof(name), "_ZGVeN16v_%sf", base);
	else if (w == 8)
		snprintf(name, sizeof(name), "_ZGVdN8v_%sf", base);
	else if (w == 4)
		snprintf(name, sizeof(name), "_ZGVbN4v_%sf", base);
	else
		return NULL;
	LLVMTypeRef vt = LLVMTypeOf(x);
	LLVMTypeRef ft = LLVMFunctionType(vt, &vt, 1, 0);
	LLVMValueRef f = LLVMGetNamedFunction(g->mod, name);
	if (f == NULL)
		f = LLVMAddFunction(g->mod, name, ft);
	return LLVMBuildCall2(g->b, ft, f, &x, 1, "");
}

static const char *libm_name(sx_op_t op, bool f32)
{
	switch (op) {
	case OP_EXP:
	case OP_EXPNP: return f32 ? "expf" : "exp";
	case OP_EXP2: return f32 ? "exp2f" : "exp2";
	case OP_LOG: return f32 ? "logf" : "log";
	case OP_LOG2: return f32 ? "log2f" : "log2";
	case OP_LOG1P: return f32 ? "log1pf" : "log1p";
	case OP_EXPM1: return f32 ? "expm1f" : "expm1";
	case OP_SIN: return f32 ? "sinf" : "sin";
	case OP_COS: return f32 ? "cosf" : "cos";
	case OP_TAN: return f32 ? "tanf" : "tan";
	case OP_TANH: return f32 ? "tanhf" : "tanh";
	case OP_ERF: return f32 ? "erff" : "erf";
	case OP_ATAN: return f32 ? "atanf" : "atan";
	case OP_POW: return f32 ? "powf" : "pow";
	case OP_ATAN2: return f32 ? "atan2f" : "atan2";
	default: return NULL;
	}
}

LLVMValueRef cg_math(gen_t *g, sx_op_t op, LLVMValueRef x, LLVMValueRef y,
		     kiln_dtype_t dt, int w)
{
	if (dt != KILN_DT_F32) {
		if (op == OP_SIGMOID) {
			LLVMValueRef e = libm_lanes(
			    g, "exp", LLVMBuildFNeg(g->b, x, ""), NULL, dt, w);
			return FDIV(cg_const_f(g, 1, dt, w),
				    FADD(cg_const_f(g, 1, dt, w), e));
		}
		if (op == OP_PHI) { /* erfc(-x/√2)/2 */
			LLVMValueRef e = libm_lanes(
			    g, "erfc",
			    FMUL(x, cg_const_f(g, -0.70710678118654752, dt, w)),
			    NULL, dt, w);
			return FMUL(e, cg_const_f(g, 0.5, dt, w));
		}
		if (op == OP_EXPSUB)
			return libm_lanes(g, "exp", FSUB(x, y), NULL, dt, w);
		return libm_lanes(g, libm_name(op, false), x, y, dt, w);
	}
	if (op == OP_EXPSUB) {
		if (w == 16 && g->c->vec_width == 16 && !g->use_libmvec)
			return expsub_f32_avx512(g, x, y, w);
		op = OP_EXPNP;
		x = FSUB(x, y);
	}
	if (g->use_libmvec && w > 1 &&
	    (op == OP_EXP || op == OP_EXPNP || op == OP_LOG || op == OP_SIN ||
	     op == OP_COS)) {
		const char *b = op == OP_EXP || op == OP_EXPNP ? "exp"
				: op == OP_LOG		       ? "log"
				: op == OP_SIN		       ? "sin"
							       : "cos";
		LLVMValueRef r = libmvec(g, b, x, w);
		if (r != NULL)
			return r;
	}
	switch (op) {
	case OP_EXP: return exp_f32(g, x, w);
	case OP_EXPNP: return exp_nonpos_f32(g, x, w);
	case OP_EXP2: return exp_f32(g, FMUL(x, F(0.693147180559945309)), w);
	case OP_LOG: return log_f32(g, x, w);
	case OP_LOG2: return FMUL(log_f32(g, x, w), F(1.44269504088896341));
	case OP_LOG1P: {
		LLVMValueRef u = FADD(x, F(1.0));
		LLVMValueRef d = FSUB(u, F(1.0));
		LLVMValueRef r = FDIV(FMUL(log_f32(g, u, w), x), d);
		r = SEL(FCMP(LLVMRealOEQ, d, F(0.0)), x, r);
		return SEL(FCMP(LLVMRealOEQ, u, F(INFINITY)), u, r);
	}
	case OP_EXPM1: {
		LLVMValueRef u = exp_f32(g, x, w);
		LLVMValueRef d = FSUB(u, F(1.0));
		LLVMValueRef r = FDIV(FMUL(d, x), log_f32(g, u, w));
		r = SEL(FCMP(LLVMRealOEQ, u, F(1.0)), x, r);
		r = SEL(FCMP(LLVMRealOEQ, d, F(-1.0)), F(-1.0), r);
		return SEL(FCMP(LLVMRealOEQ, u, F(INFINITY)), u, r);
	}
	case OP_TANH: return tanh_f32(g, x, w);
	case OP_SIGMOID: return sigmoid_f32(g, x, w);
	case OP_ERF: return erf_f32(g, x, w);
	case OP_PHI: return phi_f32(g, x, w);
	case OP_SIN: return sincos_f32(g, x, w, false);
	case OP_COS: return sincos_f32(g, x, w, true);
	case OP_TAN:
		return FDIV(sincos_f32(g, x, w, false),
			    sincos_f32(g, x, w, true));
	case OP_ATAN: return atan_f32(g, x, w);
	default: return libm_lanes(g, libm_name(op, true), x, y, dt, w);
	}
}
