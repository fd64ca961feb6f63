/*
 * interp_pw.c — the reference interpreter's pointwise and creation ops: one
 * broadcasting engine (pw_eval) that reads every operand in double (rounded
 * to the computation dtype) or int64 and stores through the output dtype's
 * rounding or wrapping, and the ops built on it: unary math, binary
 * arithmetic and comparisons with PyTorch's type promotion, where,
 * masked_fill, clamp, lerp, the pointwise backward ops, dtype conversion,
 * and the creation ops (full, zeros, ones, empty, new_*, *_like, fill,
 * scalar_tensor, arange).
 * Conventions and representation: interp_internal.h.
 *
 * Scalars combined with f16/bf16 tensors are kept in f32 (torch's opmath)
 * for arithmetic and rounded to the common dtype for comparisons, as torch
 * does on CPU.
 *
 * Threads: any; no global state.
 */
#include "compiler/interp_internal.h"
#include "compiler/rng.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Pointwise engine                                                           */
/* ------------------------------------------------------------------------ */

typedef struct pw {
	int code;
	double p[4];	  /* parameters (alpha, bounds, slopes, approximate) */
	bool fl;	  /* compute in double (else int64) */
	kiln_dtype_t rdt; /* operands rounded to this dtype when fl */
	bool ierr;	  /* integer division by zero */
} pw_t;

static double gelu_f(double x, bool tanh_approx)
{
	if (tanh_approx) {
		double k = sqrt(2.0 / M_PI);
		return 0.5 * x * (1 + tanh(k * (x + 0.044715 * x * x * x)));
	}
	return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

static double gelu_bw(double g, double x, bool tanh_approx)
{
	if (tanh_approx) {
		double k = sqrt(2.0 / M_PI), c = 0.044715;
		double inner = k * (x + c * x * x * x);
		double t = tanh(inner);
		double dinner = k * (1 + 3 * c * x * x);
		return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * dinner);
	}
	double cdf = 0.5 * (1 + erf(x / sqrt(2.0)));
	double pdf = exp(-0.5 * x * x) / sqrt(2 * M_PI);
	return g * (cdf + x * pdf);
}

static double floordiv_f(double a, double b)
{
	if (b == 0)
		return a / b;
	double mod = fmod(a, b);
	double div = (a - mod) / b;
	if (mod != 0 && ((b < 0) != (mod < 0)))
		div -= 1;
	double fd;
	if (div != 0) {
		fd = floor(div);
		if (div - fd > 0.5)
			fd += 1;
	} else {
		fd = copysign(0, a / b);
	}
	return fd;
}

static double pw_f(pw_t *pw, const double *x)
{
	double a = x[0], b = x[1];
	switch (pw->code) {
	case U_COPY: return a;
	case U_ABS: return fabs(a);
	case U_NEG: return -a;
	case U_EXP: return exp(a);
	case U_EXP2: return exp2(a);
	case U_LOG: return log(a);
	case U_LOG1P: return log1p(a);
	case U_LOG2: return log2(a);
	case U_LOG10: return log10(a);
	case U_EXPM1: return expm1(a);
	case U_SQRT: return sqrt(a);
	case U_RSQRT: return 1 / sqrt(a);
	case U_RECIP: return 1 / a;
	case U_SIN: return sin(a);
	case U_COS: return cos(a);
	case U_TAN: return tan(a);
	case U_ASIN: return asin(a);
	case U_ACOS: return acos(a);
	case U_ATAN: return atan(a);
	case U_SINH: return sinh(a);
	case U_COSH: return cosh(a);
	case U_TANH: return tanh(a);
	case U_SIGMOID: return 1 / (1 + exp(-a));
	case U_RELU: return a > 0 || isnan(a) ? a : 0;
	case U_GELU: return gelu_f(a, pw->p[0] != 0);
	case U_SILU: return a / (1 + exp(-a));
	case U_ERF: return erf(a);
	case U_SIGN: return a > 0 ? 1 : a < 0 ? -1 : (isnan(a) ? 0 : a);
	case U_FLOOR: return floor(a);
	case U_CEIL: return ceil(a);
	case U_ROUND:
		if (pw->p[0] == 0)
			return nearbyint(a);
		if (pw->p[0] > 0) {
			double s = pow(10, pw->p[0]);
			return nearbyint(a * s) / s;
		} else {
			double s = pow(10, -pw->p[0]);
			return nearbyint(a / s) * s;
		}
	case U_TRUNC: return trunc(a);
	case U_HARDSWISH: return a * fmin(fmax(a + 3, 0), 6) / 6;
	case U_HARDSIGMOID: return fmin(fmax(a + 3, 0), 6) / 6;
	case U_LNOT: return a == 0;
	case U_ISNAN: return isnan(a);
	case U_ISINF: return isinf(a);
	case U_HARDTANH:
		return isnan(a)	      ? a
		       : a < pw->p[0] ? pw->p[0]
		       : a > pw->p[1] ? pw->p[1]
				      : a;
	case U_LEAKY: return a > 0 ? a : a * pw->p[0];
	case U_ELU:
		return a <= 0 ? (exp(a * pw->p[2]) - 1) * pw->p[0] * pw->p[1]
			      : a * pw->p[1];
	case U_SOFTPLUS:
		return a * pw->p[0] > pw->p[1]
			   ? a
			   : log1p(exp(a * pw->p[0])) / pw->p[0];
	case U_MISH: return a * tanh(log1p(exp(a)));
	case U_CELU: return a > 0 ? a : pw->p[0] * expm1(a / pw->p[0]);
	case U_THRESH: return a <= pw->p[0] ? pw->p[1] : a;
	case U_LOGSIG: return fmin(a, 0) - log1p(exp(-fabs(a)));
	case U_LOGSIG_BUF: return exp(-fabs(a));
	case U_FILL: return b;
	case B_ADD: return a + pw->p[0] * b;
	case B_SUB: return a - pw->p[0] * b;
	case B_RSUB: return b - pw->p[0] * a;
	case B_MUL: return a * b;
	case B_DIV: return a / b;
	case B_DIVT: return trunc(a / b);
	case B_DIVF: return floordiv_f(a, b);
	case B_REM: {
		double m = fmod(a, b);
		if (m != 0 && ((b < 0) != (m < 0)))
			m += b;
		return m;
	}
	case B_FMOD: return fmod(a, b);
	case B_POW: return pow(a, b);
	case B_MAX: return isnan(a) || isnan(b) ? NAN : fmax(a, b);
	case B_MIN: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
	case B_ATAN2: return atan2(a, b);
	case B_EQ: return a == b;
	case B_NE: return a != b;
	case B_LT: return a < b;
	case B_LE: return a <= b;
	case B_GT: return a > b;
	case B_GE: return a >= b;
	case B_LAND: return (a != 0) && (b != 0);
	case B_LOR: return (a != 0) || (b != 0);
	case B_LXOR: return (a != 0) != (b != 0);
	case T_WHERE: return a != 0 ? b : x[2];
	case T_CLAMP: {
		double r = a;
		if (isnan(r))
			return r;
		if (pw->p[0] != 0)
			r = isnan(b) ? b : (r < b ? b : r);
		if (pw->p[1] != 0)
			r = isnan(x[2]) ? x[2] : (r > x[2] ? x[2] : r);
		return r;
	}
	case T_ADDCMUL: return a + pw->p[0] * (b * x[2]);
	case T_ADDCDIV: return a + pw->p[0] * (b / x[2]);
	case T_LERP: {
		double w = x[2];
		return fabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w);
	}
	case T_THRESH_BW: return b <= pw->p[0] ? 0 : a;
	case T_HARDTANH_BW: return b <= pw->p[0] || b >= pw->p[1] ? 0 : a;
	case T_GELU_BW: return gelu_bw(a, b, pw->p[0] != 0);
	case T_SIGMOID_BW: return a * (1 - b) * b;
	case T_TANH_BW: return a * (1 - b * b);
	case T_SILU_BW: {
		double sg = 1 / (1 + exp(-b));
		return a * sg * (1 + b * (1 - sg));
	}
	case T_HARDSWISH_BW: return b <= -3 ? 0 : b < 3 ? a * (b / 3 + 0.5) : a;
	case T_HARDSIGMOID_BW: return b > -3 && b < 3 ? a / 6 : 0;
	case T_SOFTPLUS_BW: {
		double z = exp(b * pw->p[0]);
		return b * pw->p[0] > pw->p[1] ? a : a * z / (z + 1);
	}
	case T_MISH_BW: {
		double sg = 1 / (1 + exp(-b)), ts = tanh(log1p(exp(b)));
		return a * (ts + b * sg * (1 - ts * ts));
	}
	case T_LEAKY_BW: return b > 0 ? a : a * pw->p[0];
	case T_LOGSIG_BW: {
		double z = exp(-fabs(b));
		return b < 0 ? a * (1 - z / (1 + z)) : a * (z / (1 + z));
	}
	case T_ELU_BW: {
		/* p: alpha, scale, input_scale, is_result; b: self or result */
		double neg = pw->p[0] * pw->p[1];
		if (b > 0)
			return a * pw->p[1];
		return pw->p[3] != 0 ? a * pw->p[2] * (b + neg)
				     : a * pw->p[2] * neg * exp(b * pw->p[2]);
	}
	case T_PRELU: return a > 0 ? a : b * a;
	case T_PRELU_GI: return b > 0 ? a : x[2] * a;
	case T_PRELU_GW: return b > 0 ? 0 : b * a;
	case T_GLU: return a / (1 + exp(-b));
	case T_GLU_GA: return a / (1 + exp(-x[2]));
	case T_GLU_GB: {
		double sg = 1 / (1 + exp(-x[2]));
		return a * b * sg * (1 - sg);
	}
	default: return NAN;
	}
}

static int64_t ipow(int64_t a, int64_t b)
{
	if (b < 0)
		return a == 1 ? 1 : a == -1 ? (b % 2 ? -1 : 1) : 0;
	uint64_t r = 1, base = (uint64_t)a;
	while (b) {
		if (b & 1)
			r *= base;
		base *= base;
		b >>= 1;
	}
	return (int64_t)r;
}

/* Wrapping arithmetic without signed-overflow UB. */
#define WADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define WSUB(a, b) ((int64_t)((uint64_t)(a) - (uint64_t)(b)))
#define WMUL(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

static int64_t pw_i(pw_t *pw, const int64_t *x)
{
	int64_t a = x[0], b = x[1];
	int64_t alpha = (int64_t)pw->p[0];
	switch (pw->code) {
	case T_ADDCMUL: return WADD(a, WMUL(alpha, WMUL(b, x[2])));
	case U_COPY: return a;
	case U_ABS: return a < 0 ? WSUB(0, a) : a;
	case U_NEG: return WSUB(0, a);
	case U_RELU: return a > 0 ? a : 0;
	case U_SIGN: return a > 0 ? 1 : a < 0 ? -1 : 0;
	case U_THRESH: return (double)a <= pw->p[0] ? (int64_t)pw->p[1] : a;
	case U_FLOOR:
	case U_CEIL:
	case U_ROUND:
	case U_TRUNC: return a;
	case U_LNOT: return a == 0;
	case U_BNOT: return ~a;
	case U_ISNAN:
	case U_ISINF: return 0;
	case U_HARDTANH: {
		int64_t lo = (int64_t)pw->p[0], hi = (int64_t)pw->p[1];
		return a < lo ? lo : a > hi ? hi : a;
	}
	case U_FILL: return b;
	case B_ADD: return WADD(a, WMUL(alpha, b));
	case B_SUB: return WSUB(a, WMUL(alpha, b));
	case B_RSUB: return WSUB(b, WMUL(alpha, a));
	case B_MUL: return WMUL(a, b);
	case B_DIVT:
	case B_DIVF:
	case B_REM:
	case B_FMOD: {
		if (b == 0) {
			pw->ierr = true;
			return 0;
		}
		if (b == -1)
			return pw->code == B_REM || pw->code == B_FMOD
				   ? 0
				   : WSUB(0, a);
		int64_t q = a / b, r = a % b;
		if (pw->code == B_DIVT)
			return q;
		if (pw->code == B_FMOD)
			return r;
		bool adj = r != 0 && ((r < 0) != (b < 0));
		if (pw->code == B_DIVF)
			return adj ? q - 1 : q;
		return adj ? r + b : r;
	}
	case B_POW: return ipow(a, b);
	case B_MAX: return a > b ? a : b;
	case B_MIN: return a < b ? a : b;
	case B_EQ: return a == b;
	case B_NE: return a != b;
	case B_LT: return a < b;
	case B_LE: return a <= b;
	case B_GT: return a > b;
	case B_GE: return a >= b;
	case B_LAND: return a && b;
	case B_LOR: return a || b;
	case B_LXOR: return (a != 0) != (b != 0);
	case B_BAND: return a & b;
	case B_BOR: return a | b;
	case B_BXOR: return a ^ b;
	case T_WHERE: return a ? b : x[2];
	case T_CLAMP: {
		int64_t r = a;
		if (pw->p[0] != 0 && r < b)
			r = b;
		if (pw->p[1] != 0 && r > x[2])
			r = x[2];
		return r;
	}
	case T_THRESH_BW: return (double)b <= pw->p[0] ? 0 : a;
	case T_HARDTANH_BW:
		return (double)b <= pw->p[0] || (double)b >= pw->p[1] ? 0 : a;
	default: return 0;
	}
}

/*
 * Evaluates pw over n operands (NULL operands read as 0) broadcast
 * together, into a new tensor of dtype odt. Operands are read in double
 * (pw->fl, each rounded to pw->rdt) or int64, and the result is stored
 * into odt with its rounding or wrapping.
 */
static int pw_eval(ictx_t *c, pw_t *pw, int n, it_t *const *ops,
		   kiln_dtype_t odt, it_t *out)
{
	uint32_t rank;
	int64_t size[KI_MAXR], idx[KI_MAXR] = {0};
	it_t v[3];
	KI_TRY(kiln__i_bshape(c, ops, n, &rank, size));
	for (int k = 0; k < n; k++)
		if (ops[k] != NULL)
			kiln__i_bview(ops[k], rank, size, &v[k]);
	KI_TRY(kiln__i_alloc(c, out, odt, rank, size));
	if (kiln__i_numel(out) == 0)
		return 0;
	int64_t o = 0;
	do {
		if (pw->fl) {
			double x[3] = {0, 0, 0};
			for (int k = 0; k < n; k++)
				if (ops[k] != NULL)
					x[k] = kiln__i_round(
					    pw->rdt,
					    ki_getf(&v[k], ki_off(&v[k], idx)));
			ki_setf(out, o++, pw_f(pw, x));
		} else {
			int64_t x[3] = {0, 0, 0};
			for (int k = 0; k < n; k++)
				if (ops[k] != NULL)
					x[k] =
					    ki_geti(&v[k], ki_off(&v[k], idx));
			ki_seti(out, o++, pw_i(pw, x));
		}
	} while (ki_next(idx, size, rank));
	if (pw->ierr) {
		kiln__i_release(out);
		return kiln__i_bad(c, "integer division by zero");
	}
	return 0;
}

/* The dtype operands are rounded to: f16/bf16 arithmetic runs in f32. */
static kiln_dtype_t opmath(kiln_dtype_t dt)
{
	return dt == KILN_DT_F16 || dt == KILN_DT_BF16 ? KILN_DT_F32 : dt;
}

static kiln_dtype_t to_float(kiln_dtype_t dt)
{
	return ki_isf(dt) ? dt : KILN_DT_F32;
}

/* ------------------------------------------------------------------------ */
/* Pointwise ops                                                              */
/* ------------------------------------------------------------------------ */

int kiln__op_unary(ictx_t *c, int code)
{
	it_t *x;
	pw_t pw = {.code = code};
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	kiln_dtype_t dt = x->dt, odt = dt;
	const char *dn = kiln_dtype_name(dt);
	switch (code) {
	case U_EXP:
	case U_EXP2:
	case U_LOG:
	case U_LOG1P:
	case U_LOG2:
	case U_LOG10:
	case U_EXPM1:
	case U_SQRT:
	case U_RSQRT:
	case U_RECIP:
	case U_SIN:
	case U_COS:
	case U_TAN:
	case U_ASIN:
	case U_ACOS:
	case U_ATAN:
	case U_SINH:
	case U_COSH:
	case U_TANH:
	case U_SIGMOID:
	case U_ERF: odt = to_float(dt); break;
	case U_GELU:
	case U_SILU:
	case U_HARDSWISH:
	case U_HARDSIGMOID:
	case U_LEAKY:
	case U_ELU:
	case U_SOFTPLUS:
	case U_MISH:
	case U_CELU:
		if (!ki_isf(dt))
			return kiln__i_bad(c, "takes a floating tensor, not %s",
					   dn);
		break;
	case U_ABS:
	case U_NEG:
	case U_RELU:
	case U_FLOOR:
	case U_CEIL:
	case U_ROUND:
	case U_TRUNC:
	case U_HARDTANH:
		if (dt == KILN_DT_BOOL)
			return kiln__i_bad(c, "does not take a bool tensor");
		break;
	case U_LNOT:
	case U_ISNAN:
	case U_ISINF: odt = KILN_DT_BOOL; break;
	case U_BNOT:
		if (ki_isf(dt))
			return kiln__i_bad(
			    c, "takes an integer or bool tensor, not %s", dn);
		if (dt == KILN_DT_BOOL)
			pw.code = code = U_LNOT;
		break;
	default: break;
	}
	if (code == U_GELU) {
		const char *ap;
		KI_TRY(kiln__i_str(c, -1, "approximate", &ap));
		if (ap != NULL && strcmp(ap, "tanh") != 0 &&
		    strcmp(ap, "none") != 0)
			return kiln__i_bad(
			    c, "approximate must be none or tanh, not \"%s\"",
			    ap);
		pw.p[0] = ap != NULL && strcmp(ap, "tanh") == 0;
	} else if (code == U_ROUND) {
		int64_t d;
		KI_TRY(kiln__i_int(c, -1, "decimals", 0, &d));
		pw.p[0] = (double)d;
		if (d != 0 && !ki_isf(dt))
			return kiln__i_bad(
			    c, "round with decimals takes a floating tensor");
	} else if (code == U_HARDTANH) {
		KI_TRY(kiln__i_num(c, 1, "min_val", false, -1, &pw.p[0]));
		KI_TRY(kiln__i_num(c, 2, "max_val", false, 1, &pw.p[1]));
	} else if (code == U_LEAKY) {
		KI_TRY(
		    kiln__i_num(c, 1, "negative_slope", false, 0.01, &pw.p[0]));
	} else if (code == U_ELU) {
		KI_TRY(kiln__i_num(c, 1, "alpha", false, 1, &pw.p[0]));
		KI_TRY(kiln__i_num(c, 2, "scale", false, 1, &pw.p[1]));
		KI_TRY(kiln__i_num(c, 3, "input_scale", false, 1, &pw.p[2]));
	} else if (code == U_SOFTPLUS) {
		KI_TRY(kiln__i_num(c, 1, "beta", false, 1, &pw.p[0]));
		KI_TRY(kiln__i_num(c, 2, "threshold", false, 20, &pw.p[1]));
		if (pw.p[0] == 0)
			return kiln__i_bad(c, "beta must not be 0");
	} else if (code == U_CELU) {
		KI_TRY(kiln__i_num(c, 1, "alpha", false, 1, &pw.p[0]));
		if (pw.p[0] == 0)
			return kiln__i_bad(c, "alpha must not be 0");
	} else if (code == U_THRESH) {
		KI_TRY(kiln__i_num(c, 1, "threshold", true, 0, &pw.p[0]));
		KI_TRY(kiln__i_num(c, 2, "value", true, 0, &pw.p[1]));
		if (dt == KILN_DT_BOOL)
			return kiln__i_bad(c, "does not take a bool tensor");
	}
	pw.fl = ki_isf(odt) || ki_isf(dt);
	pw.rdt = opmath(to_float(dt));
	if (code == U_LNOT || code == U_ISNAN || code == U_ISINF)
		pw.rdt = KILN_DT_F64;
	return pw_eval(c, &pw, 1, &x, odt, &c->out[0]);
}

static bool is_cmp(int code)
{
	return code >= B_EQ && code <= B_GE;
}

int kiln__op_binary(ictx_t *c, int code)
{
	it_t a, b;
	pw_t pw = {.code = code, .p = {1}};
	int rc = kiln__i_operand(c, 0, "self", &a);
	if (rc == 0)
		rc = kiln__i_operand(c, 1, code == B_POW ? "exponent" : "other",
				     &b);
	if (rc < 0) {
		kiln__i_release(&a);
		return rc;
	}
	it_t *ops[2] = {&a, &b};
	kiln_dtype_t ct = kiln__i_result_type(ops, 2), odt = ct;
	const char *mode = NULL;
	if (code == B_DIV)
		rc = kiln__i_str(c, -1, "rounding_mode", &mode);
	if (rc == 0 && mode != NULL) {
		if (strcmp(mode, "trunc") == 0)
			pw.code = code = B_DIVT;
		else if (strcmp(mode, "floor") == 0)
			pw.code = code = B_DIVF;
		else
			rc = kiln__i_bad(
			    c,
			    "rounding_mode must be trunc or floor, not \"%s\"",
			    mode);
	}
	if (rc == 0 && (code == B_ADD || code == B_SUB || code == B_RSUB)) {
		const kiln_arg_t *al = kiln__i_arg(c, 2, "alpha");
		rc = kiln__i_num(c, 2, "alpha", false, 1, &pw.p[0]);
		if (rc == 0 && al != NULL && al->kind == KILN_ARG_FLOAT &&
		    !ki_isf(ct))
			rc = kiln__i_bad(
			    c, "alpha must not be a float for integer inputs");
	}
	if (rc < 0)
		goto out;
	switch (code) {
	case B_SUB:
	case B_RSUB:
	case B_REM:
	case B_FMOD:
	case B_POW:
		if (ct == KILN_DT_BOOL)
			rc = kiln__i_bad(c, "does not take bool operands");
		break;
	case B_DIV:
	case B_ATAN2: odt = ct = to_float(ct); break;
	case B_BAND:
	case B_BOR:
	case B_BXOR:
		if (ki_isf(ct))
			rc = kiln__i_bad(
			    c, "takes integer or bool operands, not %s",
			    kiln_dtype_name(ct));
		break;
	case B_LAND:
	case B_LOR:
	case B_LXOR: odt = KILN_DT_BOOL; break;
	default:
		if (is_cmp(code))
			odt = KILN_DT_BOOL;
		break;
	}
	if (rc < 0)
		goto out;
	pw.fl = ki_isf(ct);
	pw.rdt = is_cmp(code) ? ct : opmath(ct);
	rc = pw_eval(c, &pw, 2, ops, odt, &c->out[0]);
out:
	kiln__i_release(&a);
	kiln__i_release(&b);
	return rc;
}

/* where.self / where.ScalarOther / where.ScalarSelf / where.Scalar */
int kiln__op_where(ictx_t *c, int code)
{
	(void)code;
	it_t *cond, a, b;
	KI_TRY(kiln__i_tensor(c, 0, "condition", &cond));
	if (cond->dt != KILN_DT_BOOL && cond->dt != KILN_DT_U8)
		return kiln__i_bad(c, "condition must be bool, not %s",
				   kiln_dtype_name(cond->dt));
	KI_TRY(kiln__i_operand(c, 1, "self", &a));
	int rc = kiln__i_operand(c, 2, "other", &b);
	if (rc == 0) {
		it_t *ab[2] = {&a, &b}, *ops[3] = {cond, &a, &b};
		kiln_dtype_t ct = kiln__i_result_type(ab, 2);
		pw_t pw = {.code = T_WHERE, .fl = ki_isf(ct), .rdt = ct};
		rc = pw_eval(c, &pw, 3, ops, ct, &c->out[0]);
	}
	kiln__i_release(&a);
	kiln__i_release(&b);
	return rc;
}

/* masked_fill.Scalar / .Tensor */
int kiln__op_masked_fill(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *mask, v;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 1, "mask", &mask));
	if (mask->dt != KILN_DT_BOOL)
		return kiln__i_bad(c, "mask must be bool, not %s",
				   kiln_dtype_name(mask->dt));
	KI_TRY(kiln__i_operand(c, 2, "value", &v));
	int rc = 0;
	if (v.rank != 0)
		rc = kiln__i_bad(c, "value must be a 0-dim tensor");
	if (rc == 0) {
		it_t *ops[3] = {mask, &v, x};
		pw_t pw = {
		    .code = T_WHERE, .fl = ki_isf(x->dt), .rdt = KILN_DT_F64};
		rc = pw_eval(c, &pw, 3, ops, x->dt, &c->out[0]);
	}
	kiln__i_release(&v);
	return rc;
}

/* clamp.default / .Tensor, clamp_min / clamp_max (.default / .Tensor) */
int kiln__op_clamp(ictx_t *c, int code)
{
	it_t *x, lo = {0}, hi = {0};
	int rc = kiln__i_tensor(c, 0, "self", &x);
	const char *nlo = "min", *nhi = "max";
	int plo = 1, phi = 2;
	if (code == CL_MAX)
		phi = 1, plo = -1;
	if (code == CL_MIN)
		phi = -1;
	if (rc == 0 && plo >= 0 && kiln__i_arg(c, plo, nlo) != NULL)
		rc = kiln__i_operand(c, plo, nlo, &lo);
	if (rc == 0 && phi >= 0 && kiln__i_arg(c, phi, nhi) != NULL)
		rc = kiln__i_operand(c, phi, nhi, &hi);
	if (rc == 0 && lo.buf == NULL && hi.buf == NULL)
		rc =
		    kiln__i_bad(c, "at least one of min and max must be given");
	if (rc == 0) {
		it_t *ops[3] = {x, lo.buf ? &lo : NULL, hi.buf ? &hi : NULL};
		kiln_dtype_t ct = kiln__i_result_type(ops, 3);
		pw_t pw = {.code = T_CLAMP,
			   .fl = ki_isf(ct),
			   .rdt = ct,
			   .p = {lo.buf != NULL, hi.buf != NULL}};
		rc = pw_eval(c, &pw, 3, ops, ct, &c->out[0]);
	}
	kiln__i_release(&lo);
	kiln__i_release(&hi);
	return rc;
}

/* lerp.Scalar / lerp.Tensor */
int kiln__op_lerp(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *end, w;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, 1, "end", &end));
	if (!ki_isf(x->dt) || end->dt != x->dt)
		return kiln__i_bad(c, "takes floating tensors of one dtype");
	KI_TRY(kiln__i_operand(c, 2, "weight", &w));
	it_t *ops[3] = {x, end, &w};
	pw_t pw = {.code = T_LERP, .fl = true, .rdt = opmath(x->dt)};
	int rc = pw_eval(c, &pw, 3, ops, x->dt, &c->out[0]);
	kiln__i_release(&w);
	return rc;
}

/* addcmul (code 0) and addcdiv (1) (self, tensor1, tensor2, value=1):
 * self + value · (tensor1 ∘ tensor2), in the operands' result type; addcdiv
 * of integers refused, as torch refuses it */
int kiln__op_addcmul(ictx_t *c, int code)
{
	it_t a[3];
	memset(a, 0, sizeof(a));
	int rc = kiln__i_operand(c, 0, "self", &a[0]);
	if (rc == 0)
		rc = kiln__i_operand(c, 1, "tensor1", &a[1]);
	if (rc == 0)
		rc = kiln__i_operand(c, 2, "tensor2", &a[2]);
	pw_t pw = {.code = code ? T_ADDCDIV : T_ADDCMUL};
	if (rc == 0)
		rc = kiln__i_num(c, 3, "value", false, 1, &pw.p[0]);
	it_t *ops[3] = {&a[0], &a[1], &a[2]};
	kiln_dtype_t ct = kiln__i_result_type(ops, 3);
	if (rc == 0 && code == 1 && !ki_isf(ct))
		rc = kiln__i_bad(c, "addcdiv of integer tensors is not "
				    "supported (torch refuses it too)");
	if (rc == 0) {
		pw.fl = ki_isf(ct);
		pw.rdt = opmath(ct);
		rc = pw_eval(c, &pw, 3, ops, ct, &c->out[0]);
	}
	for (int i = 0; i < 3; i++)
		kiln__i_release(&a[i]);
	return rc;
}

/* threshold_backward, hardtanh_backward, gelu_backward, sigmoid_backward,
 * tanh_backward, silu_backward, hardswish_backward, hardsigmoid_backward */
int kiln__op_pw_backward(ictx_t *c, int code)
{
	it_t *g, *x;
	pw_t pw = {.code = code};
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(
	    c, 1, code == T_SIGMOID_BW || code == T_TANH_BW ? "output" : "self",
	    &x));
	it_t *ops[2] = {g, x};
	kiln_dtype_t ct = kiln__i_result_type(ops, 2);
	if (code == T_THRESH_BW) {
		KI_TRY(kiln__i_num(c, 2, "threshold", true, 0, &pw.p[0]));
	} else if (code == T_SOFTPLUS_BW || code == T_LEAKY_BW) {
		if (!ki_isf(ct))
			return kiln__i_bad(c, "takes floating tensors");
		if (code == T_SOFTPLUS_BW) {
			KI_TRY(kiln__i_num(c, 2, "beta", true, 1, &pw.p[0]));
			KI_TRY(
			    kiln__i_num(c, 3, "threshold", true, 20, &pw.p[1]));
		} else {
			KI_TRY(kiln__i_num(c, 2, "negative_slope", true, 0.01,
					   &pw.p[0]));
		}
	} else if (code == T_HARDTANH_BW) {
		KI_TRY(kiln__i_num(c, 2, "min_val", false, -1, &pw.p[0]));
		KI_TRY(kiln__i_num(c, 3, "max_val", false, 1, &pw.p[1]));
	} else if (!ki_isf(ct)) {
		return kiln__i_bad(c, "takes floating tensors");
	}
	if (code == T_GELU_BW) {
		const char *ap;
		KI_TRY(kiln__i_str(c, -1, "approximate", &ap));
		if (ap != NULL && strcmp(ap, "tanh") != 0 &&
		    strcmp(ap, "none") != 0)
			return kiln__i_bad(c,
					   "approximate must be none or tanh");
		pw.p[0] = ap != NULL && strcmp(ap, "tanh") == 0;
	}
	pw.fl = ki_isf(ct);
	pw.rdt = opmath(ct);
	return pw_eval(c, &pw, 2, ops, ct, &c->out[0]);
}

/* log_sigmoid_forward(self) -> (output, buffer = exp(-|x|)), as torch's
 * CPU kernel */
int kiln__op_log_sigmoid(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	KI_TRY(kiln__i_tensor(c, 0, "self", &x));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "takes a floating tensor, not %s",
				   kiln_dtype_name(x->dt));
	pw_t pw = {.code = U_LOGSIG, .fl = true, .rdt = opmath(x->dt)};
	KI_TRY(pw_eval(c, &pw, 1, &x, x->dt, &c->out[0]));
	pw.code = U_LOGSIG_BUF;
	return pw_eval(c, &pw, 1, &x, x->dt, &c->out[1]);
}

/* elu_backward(grad_output, alpha, scale, input_scale, is_result,
 * self_or_result) */
int kiln__op_elu_backward(ictx_t *c, int code)
{
	it_t *g, *x;
	pw_t pw = {.code = code};
	bool is_result;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_num(c, 1, "alpha", true, 1, &pw.p[0]));
	KI_TRY(kiln__i_num(c, 2, "scale", true, 1, &pw.p[1]));
	KI_TRY(kiln__i_num(c, 3, "input_scale", true, 1, &pw.p[2]));
	KI_TRY(kiln__i_bool(c, 4, "is_result", false, &is_result));
	KI_TRY(kiln__i_tensor(c, 5, "self_or_result", &x));
	pw.p[3] = is_result;
	it_t *ops[2] = {g, x};
	kiln_dtype_t ct = kiln__i_result_type(ops, 2);
	if (!ki_isf(ct))
		return kiln__i_bad(c, "takes floating tensors");
	pw.fl = true;
	pw.rdt = opmath(ct);
	return pw_eval(c, &pw, 2, ops, ct, &c->out[0]);
}

/* _prelu_kernel(self, weight) (code T_PRELU), and its backward
 * _prelu_kernel_backward(grad_output, self, weight) -> (grad_self,
 * grad_weight), both of the broadcast shape (code T_PRELU_GI) */
int kiln__op_prelu(ictx_t *c, int code)
{
	bool bw = code != T_PRELU;
	it_t *g = NULL, *x, *w;
	if (bw)
		KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, bw ? 1 : 0, "self", &x));
	KI_TRY(kiln__i_tensor(c, bw ? 2 : 1, "weight", &w));
	it_t *ops[3] = {g, x, w};
	kiln_dtype_t ct = kiln__i_result_type(bw ? ops : ops + 1, bw ? 3 : 2);
	if (!ki_isf(ct))
		return kiln__i_bad(c, "takes floating tensors");
	pw_t pw = {.code = code, .fl = true, .rdt = opmath(ct)};
	if (!bw)
		return pw_eval(c, &pw, 2, ops + 1, ct, &c->out[0]);
	KI_TRY(pw_eval(c, &pw, 3, ops, ct, &c->out[0]));
	pw.code = T_PRELU_GW;
	return pw_eval(c, &pw, 3, ops, ct, &c->out[1]);
}

/* x's half h (0 or 1) along dim d, a view */
static void half_view(const it_t *x, uint32_t d, int h, it_t *v)
{
	*v = *x;
	v->size[d] = x->size[d] / 2;
	v->off += h * v->size[d] * x->stride[d];
}

/* glu(self, dim) = a · sigmoid(b), a and b self's halves along dim
 * (code T_GLU); glu_backward(grad_output, self, dim): the gradients of a
 * and b side by side along dim (code T_GLU_GA) */
int kiln__op_glu(ictx_t *c, int code)
{
	bool bw = code != T_GLU;
	it_t *g = NULL, *x;
	int64_t dim;
	if (bw)
		KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, bw ? 1 : 0, "self", &x));
	KI_TRY(kiln__i_int(c, bw ? 2 : 1, "dim", -1, &dim));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "takes a floating tensor, not %s",
				   kiln_dtype_name(x->dt));
	if (x->rank == 0)
		return kiln__i_bad(c, "glu does not take a 0-dim tensor");
	uint32_t d;
	KI_TRY(kiln__i_dim(c, dim, x->rank, &d));
	if (x->size[d] % 2 != 0)
		return kiln__i_bad(c, "halving dim %u must be even, not %lld",
				   d, (long long)x->size[d]);
	it_t a, b;
	half_view(x, d, 0, &a);
	half_view(x, d, 1, &b);
	pw_t pw = {.code = code, .fl = true, .rdt = opmath(x->dt)};
	if (!bw) {
		it_t *ops[2] = {&a, &b};
		return pw_eval(c, &pw, 2, ops, x->dt, &c->out[0]);
	}
	for (uint32_t k = 0; k < x->rank; k++)
		if (g->rank != x->rank ||
		    g->size[k] != (k == d ? x->size[k] / 2 : x->size[k]))
			return kiln__i_bad(c, "grad_output must be self's "
					      "shape halved along dim");
	it_t ga = {0}, gb = {0}, *ops[3] = {g, &a, &b};
	KI_TRY(pw_eval(c, &pw, 3, ops, x->dt, &ga));
	pw.code = T_GLU_GB;
	int rc = pw_eval(c, &pw, 3, ops, x->dt, &gb);
	double *fa = NULL, *fb = NULL, *out = NULL;
	int64_t n = kiln__i_numel(x), inner = 1, outer = 1, h = x->size[d] / 2;
	for (uint32_t k = d + 1; k < x->rank; k++)
		inner *= x->size[k];
	for (uint32_t k = 0; k < d; k++)
		outer *= x->size[k];
	if (rc == 0)
		rc = kiln__i_to_f(c, &ga, &fa);
	if (rc == 0)
		rc = kiln__i_to_f(c, &gb, &fb);
	if (rc == 0 &&
	    (out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double))) == NULL)
		rc = kiln__i_oom(c);
	for (int64_t o = 0; rc == 0 && o < outer; o++)
		for (int64_t s = 0; s < 2 * h; s++)
			memcpy(out + (o * 2 * h + s) * inner,
			       s < h ? fa + (o * h + s) * inner
				     : fb + (o * h + s - h) * inner,
			       (size_t)inner * sizeof(double));
	if (rc == 0)
		rc =
		    kiln__i_from_f(c, &c->out[0], x->dt, x->rank, x->size, out);
	free(fa);
	free(fb);
	free(out);
	kiln__i_release(&ga);
	kiln__i_release(&gb);
	return rc;
}

/* _to_copy, prims.convert_element_type, clone, copy */
int kiln__op_convert(ictx_t *c, int code)
{
	it_t *x;
	KI_TRY(kiln__i_tensor(c, 0, code == CV_CONVERT ? "a" : "self", &x));
	kiln_dtype_t dt = x->dt;
	bool given = false;
	if (code == CV_TO_COPY)
		KI_TRY(kiln__i_dtype(c, -1, "dtype", &dt, &given));
	if (code == CV_CONVERT) {
		KI_TRY(kiln__i_dtype(c, 1, "dtype", &dt, &given));
		if (!given)
			return kiln__i_bad(c, "missing dtype");
	}
	if (code == CV_COPY) {
		/* copy(self, src): src broadcast to self's shape, in self's
		 * dtype */
		it_t *src, v;
		KI_TRY(kiln__i_tensor(c, 1, "src", &src));
		bool fits = src->rank <= x->rank;
		for (uint32_t k = 0; fits && k < src->rank; k++) {
			int64_t s = src->size[k],
				t = x->size[x->rank - src->rank + k];
			fits = s == 1 || s == t;
		}
		if (!fits)
			return kiln__i_bad(
			    c, "src does not broadcast to self's shape");
		kiln__i_bview(src, x->rank, x->size, &v);
		return kiln__i_convert(c, &v, x->dt, &c->out[0]);
	}
	return kiln__i_convert(c, x, dt, &c->out[0]);
}

/* ------------------------------------------------------------------------ */
/* Creation ops                                                               */
/* ------------------------------------------------------------------------ */

/* Fills a new tensor of (dt, rank, size) with the number v (a wrapped
 * rank-0 tensor, or NULL for zero). */
static int make_filled(ictx_t *c, kiln_dtype_t dt, uint32_t rank,
		       const int64_t *size, const it_t *v, it_t *out)
{
	KI_TRY(kiln__i_alloc(c, out, dt, rank, size));
	int64_t n = kiln__i_numel(out);
	if (v == NULL)
		return 0;
	for (int64_t k = 0; k < n; k++) {
		if (v->buf->f)
			ki_setf(out, k, v->buf->f[v->off]);
		else
			ki_seti(out, k, v->buf->i[v->off]);
	}
	return 0;
}

int kiln__op_create(ictx_t *c, int code)
{
	it_t *self = NULL, val = {0}, one = {0};
	int64_t size[KI_MAXR];
	int n = 0, rc = 0, pos_size = 0, pos_val = -1;
	bool like = code >= CR_FULL_LIKE && code <= CR_EMPTY_LIKE;
	bool newop = code >= CR_NEW_FULL && code <= CR_NEW_EMPTY_STRIDED;
	if (like || newop || code == CR_FILL)
		KI_TRY(kiln__i_tensor(c, 0, "self", &self));
	if (newop)
		pos_size = 1;
	if (code == CR_FULL)
		pos_val = 1;
	if (code == CR_NEW_FULL)
		pos_val = 2;
	if (code == CR_FULL_LIKE || code == CR_FILL)
		pos_val = 1;
	if (code == CR_SCALAR_TENSOR)
		pos_val = 0;
	if (like || code == CR_FILL) {
		n = (int)self->rank;
		memcpy(size, self->size, sizeof(size));
	} else if (code != CR_SCALAR_TENSOR) {
		KI_TRY(kiln__i_ints(c, pos_size, "size", size, KI_MAXR, &n));
		if (n < 0)
			return kiln__i_bad(c, "missing size");
		for (int d = 0; d < n; d++)
			if (size[d] < 0)
				return kiln__i_bad(c, "negative size %lld",
						   (long long)size[d]);
	}
	if (code == CR_EMPTY_STRIDED || code == CR_NEW_EMPTY_STRIDED) {
		/* the strides matter only to as_strided views of the result
		 * (the values are undefined): their count must be the rank */
		int64_t st[KI_MAXR];
		int ns = 0;
		KI_TRY(
		    kiln__i_ints(c, pos_size + 1, "stride", st, KI_MAXR, &ns));
		if (ns != n)
			return kiln__i_bad(
			    c, "stride has %d entries for %d dims", ns, n);
	}
	if (pos_val >= 0)
		KI_TRY(kiln__i_operand(c, pos_val,
				       code == CR_SCALAR_TENSOR ? "s"
				       : code == CR_FILL	? "value"
								: "fill_value",
				       &val));
	kiln_dtype_t dt = self ? self->dt : KILN_DT_F32;
	if (code == CR_FULL && val.wrapped)
		dt = val.dt == KILN_DT_F64 ? KILN_DT_F32 : val.dt;
	bool given = false;
	if (code != CR_FILL)
		rc = kiln__i_dtype(c, -1, "dtype", &dt, &given);
	if (rc == 0 && val.buf != NULL && val.rank != 0)
		rc = kiln__i_bad(
		    c, "the fill value must be a number or a 0-dim tensor");
	if (rc == 0 &&
	    (code == CR_ONES || code == CR_NEW_ONES || code == CR_ONES_LIKE)) {
		rc = kiln__i_alloc(c, &one, KILN_DT_I64, 0, NULL);
		if (rc == 0)
			one.buf->i[0] = 1;
	}
	if (rc == 0)
		rc = make_filled(c, dt, (uint32_t)n, size,
				 val.buf   ? &val
				 : one.buf ? &one
					   : NULL,
				 &c->out[0]);
	kiln__i_release(&val);
	kiln__i_release(&one);
	return rc;
}

/* arange.default(end) / .start(start, end) / .start_step(start, end, step) */
int kiln__op_arange(ictx_t *c, int code)
{
	double v[3] = {0, 0, 1};
	bool isf = false;
	int pos[3] = {-1, 0, -1};
	if (code >= 1)
		pos[0] = 0, pos[1] = 1;
	if (code == 2)
		pos[2] = 2;
	const char *names[3] = {"start", "end", "step"};
	for (int k = 0; k < 3; k++) {
		if (pos[k] < 0)
			continue;
		const kiln_arg_t *a = kiln__i_arg(c, pos[k], names[k]);
		if (a == NULL)
			continue;
		isf |= a->kind == KILN_ARG_FLOAT;
		KI_TRY(kiln__i_num(c, pos[k], names[k], true, 0, &v[k]));
	}
	kiln_dtype_t dt = isf ? KILN_DT_F32 : KILN_DT_I64;
	bool given;
	KI_TRY(kiln__i_dtype(c, -1, "dtype", &dt, &given));
	if (v[2] == 0)
		return kiln__i_bad(c, "step must be nonzero");
	double nd = ceil((v[1] - v[0]) / v[2]);
	if (!(nd >= 0) || nd > 1e12)
		return kiln__i_bad(c, "invalid range [%g, %g) step %g", v[0],
				   v[1], v[2]);
	int64_t n = (int64_t)nd;
	KI_TRY(kiln__i_alloc(c, &c->out[0], dt, 1, &n));
	for (int64_t k = 0; k < n; k++)
		ki_setf(&c->out[0], k, v[0] + (double)k * v[2]);
	return 0;
}

/* native_dropout(input, p, train?): deterministic only when it keeps
 * everything (train false, or p == 0) or drops everything (p == 1) */
int kiln__op_dropout(ictx_t *c, int code)
{
	(void)code;
	it_t *x;
	double p;
	bool train;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(kiln__i_num(c, 1, "p", true, 0, &p));
	KI_TRY(kiln__i_bool(c, 2, "train", true, &train));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	if (train && p != 0 && p != 1)
		return kiln__i_unsup(
		    c, "dropout with p=%g draws random numbers", p);
	bool keep = !train || p == 0;
	KI_TRY(kiln__i_convert(c, x, x->dt, &c->out[0]));
	KI_TRY(kiln__i_alloc(c, &c->out[1], KILN_DT_BOOL, x->rank, x->size));
	int64_t n = kiln__i_numel(x);
	for (int64_t k = 0; k < n; k++) {
		c->out[1].buf->i[k] = keep;
		if (!keep)
			c->out[0].buf->f[k] = 0;
	}
	return 0;
}

/* kiln.dropout(input, p, seed, stream) -> (output, mask): the bits of
 * rng.h, element by element in row-major order; output = input * mask *
 * 1/(1-p) (0 for p = 1), in f32 for f32/f16/bf16 (one rounding to the
 * dtype at the end), as torch and the kernels compute it, so the outputs
 * are bit-exact too. */
int kiln__op_kiln_dropout(ictx_t *c, int code)
{
	(void)code;
	it_t *x, *s;
	double p;
	int64_t stream;
	KI_TRY(kiln__i_tensor(c, 0, "input", &x));
	KI_TRY(kiln__i_num(c, 1, "p", true, 0, &p));
	KI_TRY(kiln__i_tensor(c, 2, "seed", &s));
	KI_TRY(kiln__i_int(c, 3, "stream", 0, &stream));
	if (!ki_isf(x->dt))
		return kiln__i_bad(c, "input must be floating");
	if (!(p >= 0 && p <= 1))
		return kiln__i_bad(c, "p must be in [0, 1], not %g", p);
	if (s->dt != KILN_DT_I64 || s->rank != 0)
		return kiln__i_bad(
		    c, "seed must be an i64 scalar tensor (shape [])");
	if (stream < 0)
		return kiln__i_bad(c, "stream must be >= 0");
	uint64_t seed = (uint64_t)ki_geti(s, s->off);
	int64_t from = kiln_rng_keep_from(p);
	double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
	KI_TRY(kiln__i_alloc(c, &c->out[0], x->dt, x->rank, x->size));
	KI_TRY(kiln__i_alloc(c, &c->out[1], KILN_DT_BOOL, x->rank, x->size));
	int64_t idx[KI_MAXR] = {0};
	int64_t n = kiln__i_numel(x);
	for (int64_t k = 0; k < n; k++) {
		bool keep = (int64_t)kiln_rng_bits(seed, (uint64_t)stream,
						   (uint64_t)k) >= from;
		c->out[1].buf->i[k] = keep;
		double xv = ki_getf(x, ki_off(x, idx)), v;
		if (x->dt == KILN_DT_F64) {
			v = xv * (keep ? 1.0 : 0.0) * scale;
		} else { /* f32 arithmetic, as torch and the kernels do */
			float fv = (float)xv * (keep ? 1.0f : 0.0f);
			v = (double)(fv * (float)scale);
		}
		ki_setf(&c->out[0], k, v);
		ki_next(idx, x->size, x->rank);
	}
	return 0;
}

/* native_dropout_backward(grad_output, mask, scale) = grad * mask * scale */
int kiln__op_dropout_bw(ictx_t *c, int code)
{
	(void)code;
	it_t *g, *m;
	double scale;
	KI_TRY(kiln__i_tensor(c, 0, "grad_output", &g));
	KI_TRY(kiln__i_tensor(c, 1, "mask", &m));
	KI_TRY(kiln__i_num(c, 2, "scale", true, 0, &scale));
	if (!ki_isf(g->dt))
		return kiln__i_bad(c, "grad_output must be floating");
	if (m->dt != KILN_DT_BOOL && m->dt != KILN_DT_U8)
		return kiln__i_bad(c, "mask must be bool, not %s",
				   kiln_dtype_name(m->dt));
	it_t *ops[2] = {g, m};
	pw_t pw = {.code = B_MUL, .fl = true, .rdt = KILN_DT_F64};
	KI_TRY(pw_eval(c, &pw, 2, ops, g->dt, &c->out[0]));
	int64_t n = kiln__i_numel(&c->out[0]);
	for (int64_t k = 0; k < n; k++)
		ki_setf(&c->out[0], k, c->out[0].buf->f[k] * scale);
	return 0;
}
