/*
 * ops_conv.c — convolution (1-d, 2-d and 3-d, stride, padding, dilation,
 * groups; transposed too) and its backward.
 *
 * Forward, by shape:
 *   1x1, stride 1, no padding, groups == 1: out[n] = W @ x[n] viewed as
 *     [C, H·W] (the input is its own im2col: no copy).
 *   tiled im2col + GEMM (groups == 1, one output row's columns within
 *     512 KiB, tiles of >= 128 columns and >= 8 tiles in all, or as
 *     max-autotune chooses): one kernel; each unit writes the im2col columns of
 * a block of output rows into a stack scratch of <= 512 KiB and multiplies W by
 * it there through BLAS (conv_tiled, gen_conv_body in codegen.c), so the
 * columns never reach memory. im2col + GEMM (the rest): col[n·g, (cg,kh,kw),
 * (oh,ow)] = x[n, g·Cg + cg, oh·sh - ph + kh·dh, ow·sw - pw + kw·dw] (0
 * outside) is materialized, then out[n·g] = W[g] @ col[n·g] through BLAS (for
 *     a batch of small images, groups == 1: col[(c,kh,kw), (n,oh,ow)] and
 *     one product W @ col, read as [N, O, OH, OW] through a view; in f32
 *     with the GEMM template, when N·OH·OW makes 4 units of columns, that
 *     product is implicit GEMM, conv_implicit, whose packing reads x itself
 *     and no col is built, as it also is in place of the whole-image
 *     im2col below); the
 *     bias, and the eval batch_norm / relu / residual add that follow in the
 *     graph, fuse into one pointwise kernel after it.
 *   direct kernel (groups == 1, stride 1, f32 with AVX-512, at most 16
 *     output channels: conv_fdirect, codegen.c gen_conv_fdirect_body): a
 *     unit's output channels' rows in registers over (c, kh, kw), the
 *     input rows shifted by each tap, no im2col.
 *   direct (depthwise and other convolutions with Cg·KH·KW <= 32, or <= 64
 *     over rows of a multiple of 4 columns): a reduction over (cg, kh, kw)
 *     of x·w, vectorized across output columns.
 *   depthwise past the direct form (or where the graph wants channels-last
 *     output): the same sum channels-last, the channels the vector
 *     (conv_depthwise_nhwc).
 *   grouped past the direct form: a product per group, W[g] [Og, Cg·KH·KW]
 *     @ col[g] [Cg·KH·KW, N·OH·OW], the batch in its columns: implicit GEMM
 *     per group (f32 on AVX-512, at least 8 rows a group), else the batched
 *     im2col (conv_cols).
 * Backward (output_mask decides which), groups == 1 or grouped past the
 * direct form (a product per group, the batch in its columns) and a BLAS
 * (conv_bw_gemm; also for small Cg·KH·KW such as 1x1 convolutions of few
 * channels: their backward reduces over O and over N·OH·OW, which are
 * large -- MobileNetV2's training step 1.06x → 0.72x eager): grad_weight = Σ_n
 * gO[n] @ col[n]ᵀ (im2col as in the forward, one batched GEMM, then a sum over
 * n) and grad_input = col2im(Wᵀ @ gO[n]) (one batched GEMM, then a gather-sum
 * over KH·KW; for a stride-1 convolution on AVX-512 grad_input is instead
 * the forward convolution of gO by the flipped weight, bw_input_forward,
 * and with 32 output channels or fewer grad_weight's product is taken
 * transposed, bw_weight_swap; a stride-1 one's of at most 64 output
 * channels a group is instead a direct kernel, bw_weight_direct:
 * grad_output times the input shifted by each tap, summed in registers,
 * no im2col). Otherwise the direct forms: grad_bias   =
 * Σ_{n,oh,ow} gO grad_input  = Σ_{o in group, kh, kw} gO[n, o, oh, ow] · w[o, c
 * - g·Cg, kh, kw] with oh = (h + ph - kh·dh) / sh when exact and in range
 * grad_weight = Σ_{n,oh,ow} gO[n, o, oh, ow] · x[n, g·Cg + cg, ih, iw] as
 * reductions over virtual higher-rank tensors. Transposed (conv_transposed,
 * conv_transposed_bw, for every rank): the forward is the input gradient above
 * (conv3d_bw's in 3-d) with x as grad_output; its backward is a forward
 * convolution (grad_input) and the weight gradient above with the roles of x
 * and grad_output swapped. 3-d (conv3d, conv3d_bw): the 2-d convolution over
 * (H, W) of the input with its depth taps folded into the channels, [N·OD,
 * C·KDe, H, W] by the weight viewed [O, Cg·KDe, KH, KW], in any 2-d form; only
 * the KDe taps that read the input at some output depth are kept (R3D's last
 * layers, depth 1 padded by 1: the middle one), and the runs of output depths
 * that read fewer taps (the first and last of a padded one) are parts of their
 * own without the padding's taps (conv3_parts). A transposed 3-d one whose
 * output_padding is its stride or more is not lowered (a fallback step).
 */
#include "compiler/ops.h"

#include <errno.h>
#include <string.h>

typedef struct conv {
	uint32_t nd; /* spatial dims: 1, 2 or 3 */
	int64_t s[3], p[3], d[3];
	int64_t op[3]; /* output_padding (a transposed convolution's) */
	int64_t groups;
	bool transposed;
} conv_t;

static int conv_params(lnode_t *n, uint32_t first, uint32_t nd, conv_t *cv)
{
	int64_t v[4];
	uint32_t k;
	memset(cv, 0, sizeof(*cv));
	cv->nd = nd;
	static const char *const names[3] = {"stride", "padding", "dilation"};
	for (int i = 0; i < 3; i++) {
		int rc = lintlist(n, first + (uint32_t)i, names[i], v, &k, 4);
		if (rc != 0)
			return rc;
		int64_t *dst = i == 0 ? cv->s : i == 1 ? cv->p : cv->d;
		for (uint32_t j = 0; j < nd; j++)
			dst[j] = k == 0	  ? (i == 1 ? 0 : 1)
				 : k == 1 ? v[0]
					  : (j < k ? v[j] : v[k - 1]);
		for (uint32_t j = 0; j < nd; j++)
			if ((i != 1 && dst[j] < 1) || (i == 1 && dst[j] < 0))
				return lerr(n, KILN_EINVGRAPH,
					    "%s must be positive", names[i]);
	}
	int rc = lbool(n, first + 3, "transposed", false, &cv->transposed);
	if (rc == 0)
		rc = lintlist(n, first + 4, "output_padding", v, &k, 4);
	if (rc != 0)
		return rc;
	for (uint32_t j = 0; j < nd; j++) {
		cv->op[j] = k == 0   ? 0
			    : k == 1 ? v[0]
				     : (j < k ? v[j] : v[k - 1]);
		if (cv->op[j] < 0)
			return lerr(n, KILN_EINVGRAPH,
				    "output_padding must not be negative");
	}
	rc = lint(n, first + 5, "groups", 1, &cv->groups);
	if (rc != 0)
		return rc;
	if (cv->groups < 1)
		return lerr(n, KILN_EINVGRAPH, "groups must be >= 1");
	return 0;
}

/* 1-d tensors get a unit H dim so everything below is 2-d. */
static lt_t *as2d(cctx_t *c, lt_t *t)
{
	return t->rank == 3 ? lt_unsqueeze(c, t, 2) : t;
}

/* The direct forms: a sum over the dims `rmask` of a 7-d product space. */
static int sum7(lnode_t *n, kiln_dtype_t acc, const kiln_dim_t *fs,
		const sx_t *body, uint32_t rmask, lt_t **out)
{
	lt_t *full = lt_fn(n->c, acc, 7, fs, body);
	if (full == NULL)
		return -ENOMEM;
	return lred(n, full, rmask, false, RED_SUM, acc, out);
}

/* sum7 as output `out` of the node (1-d convolutions drop the dummy
 * spatial dim 2). */
static int sum7_out(lnode_t *n, kiln_dtype_t acc, const kiln_dim_t *fs,
		    const sx_t *body, uint32_t rmask, uint32_t nd, uint32_t out)
{
	lt_t *r;
	int rc = sum7(n, acc, fs, body, rmask, &r);
	if (rc != 0)
		return rc;
	if (nd == 1)
		r = lt_squeeze_dim(n->c, r, 2);
	return lset(n, out, r);
}

/* Whether the input position (ih, iw) lies in an image of H x W. A
 * coordinate the variables' known ranges keep inside (set_var_ranges: a
 * convolution without padding) adds no test; with neither, the constant
 * true, which sx_guard and sx_where drop. A 1x1 convolution's im2col over
 * a concatenation (DenseNet's) had kept a window test that moves with
 * the vectorized column, and so masked loads where the concatenation's
 * channel test alone is the same in every lane (codegen.c
 * load_guarded_row). */
static const sx_t *in_image(cctx_t *c, const kiln_expr_t *ih,
			    const kiln_expr_t *iw, kiln_dim_t H, kiln_dim_t W)
{
	const kiln_expr_t *pos[2] = {ih, iw};
	const kiln_dim_t lim[2] = {H, W};
	const sx_t *ok = NULL;
	for (int k = 0; k < 2; k++) {
		int64_t lo, hi;
		if (lim[k].e == NULL && ix_bounds(c, pos[k], &lo, &hi) &&
		    lo >= 0 && hi < lim[k].c)
			continue;
		const sx_t *v = sx_index(c, pos[k]);
		const sx_t *in =
		    sx_bin(c, OP_AND,
			   sx_bin(c, OP_GE, v, sx_consti(c, 0, KILN_DT_I64)),
			   sx_bin(c, OP_LT, v, sx_index(c, ix_dim(c, lim[k]))));
		ok = ok ? sx_bin(c, OP_AND, ok, in) : in;
	}
	return ok ? ok : sx_consti(c, 1, KILN_DT_BOOL);
}

/* x[n, ch, ih, iw] with ih/iw from output and kernel positions; guarded. */
static const sx_t *xin(cctx_t *c, const lt_t *x, const kiln_expr_t *n,
		       const kiln_expr_t *ch, const kiln_expr_t *ih,
		       const kiln_expr_t *iw)
{
	const kiln_expr_t *idx[4] = {n, ch, ih, iw};
	const sx_t *ok = in_image(c, ih, iw, x->sizes[2], x->sizes[3]);
	const sx_t *val = sx_guard(c, lt_at(c, x, idx), ok);
	return sx_where(c, ok, val, sxf(c, 0, x->dtype));
}

/* Below this many output positions per image, a groups == 1
 * convolution of a batch puts the images side by side in the columns of
 * one product: ResNet-18's two 7² layers at batch 16 went from 0.50 and
 * 0.64x eager to 0.69 and 0.79x (a product per image of 49 columns keeps
 * BLAS from streaming); at 14² and 28² (196, 784 columns) it measured no
 * better. */
#define CONV_BATCH_COLS_P 128

#define IC(v) ix_const(c, (v))
#define IV(k) ix_var(c, (k))

/* The input position along spatial dim k (0: H, 1: W) of output
 * position VAR o and kernel tap VAR t: o·stride + t·dilation - padding. */
static const kiln_expr_t *win_pos(cctx_t *c, const conv_t *cv, int k,
				  uint32_t o, uint32_t t)
{
	return ix_add(c, ix_mul(c, ix_var(c, o), ix_const(c, cv->s[k])),
		      ix_sub(c, ix_mul(c, ix_var(c, t), ix_const(c, cv->d[k])),
			     ix_const(c, cv->p[k])));
}

/* The im2col buffer (realized) over the 6-d space cs whose vars 4, 5 are
 * the output position (oh, ow) and vars vkh, vkw the kernel tap:
 * x[nn, ch, oh·sh - ph + kh·dh, ow·sw - pw + kw·dw], 0 in the padding. */
static int im2col(lnode_t *n, lt_t *x, const conv_t *cv, kiln_dtype_t acc,
		  const kiln_dim_t cs[6], const kiln_expr_t *nn,
		  const kiln_expr_t *ch, uint32_t vkh, uint32_t vkw, lt_t **col)
{
	cctx_t *c = n->c;
	/* the ranges of cs's vars, for in_image (and reset) */
	set_var_ranges(c, 6, cs);
	const kiln_expr_t *ih = win_pos(c, cv, 0, 4, vkh);
	const kiln_expr_t *iw = win_pos(c, cv, 1, 5, vkw);
	lt_t *t =
	    lt_fn(c, acc, 6, cs, sx_cast(c, xin(c, x, nn, ch, ih, iw), acc));
	set_var_ranges(c, 0, NULL);
	if (t == NULL)
		return -ENOMEM;
	return lt_realize(c, t, (int32_t)n->index, col);
}

/* Scratch per tile of the tiled template, in elements: 512 KiB of f32,
 * so a tile of columns stays in L2 between the im2col that writes it and
 * the product that reads it. */
#define CONV_TILE_BYTES (512 * 1024)
/* ... and the most the GEMM template's tiles take where that fills its
 * register tiles' columns better (conv_tile_rows_tmpl) */
#define CONV_TILE_BYTES_MAX (1024 * 1024)
/* The tiled template is chosen when its tiles have at least this many
 * columns (BLAS slows down on narrower products: 56 columns for
 * resnet18's 256->256 3x3 at 14², 0.68 -> 0.62x eager at batch 16) and
 * there are this many tiles in all (at batch 1 the whole-image im2col of
 * a deep layer stays in cache and its product splits better: 512->512 at
 * 7² 1.09 vs 0.57x eager). Measured on resnet18's layers
 * (tests/bench/bench_ops.py --conv). */
#define CONV_TILE_MIN_COLS  128
#define CONV_TILE_MIN_UNITS 8

/* Whether the tiled template's product is codegen's register-tiled GEMM
 * template (tgemm: f32 on 16-lane vectors) rather than BLAS. Measured
 * with max-autotune on resnet18's 3x3 layers at batch 16 (2 threads),
 * tiled + template against the best BLAS form: 64->64 at 56^2 20.4 vs
 * 39.8 (whole-image) and 17.5 vs 20.9 ms (tiled + BLAS), 128->128 at 28^2
 * (112 columns) 20.1 vs 24.7, 256->256 at 14^2 (56 columns) 22.0 vs 26.7,
 * 128->256 s2 10.7 vs 10.9, 512->512 at 7^2 (28 columns) 21.2 vs 21.8:
 * the template keeps its speed on narrow tiles, so with it a tile needs
 * only one register tile's width (CG_TG_NR columns), not
 * CONV_TILE_MIN_COLS. */
static bool conv_template(const cctx_t *c, const lnode_t *n, kiln_dtype_t acc)
{
	return acc == KILN_DT_F32 && c->vec_width == 16 &&
	       !(c->tune != NULL && c->tune[n->index] == 2);
}

/* Output rows per tile: as many as fit CONV_TILE_BYTES, 1 to OH. */
static int64_t conv_tile_rows(int64_t ckk, int64_t oh, int64_t ow,
			      kiln_dtype_t acc)
{
	int64_t esz = acc == KILN_DT_F64 ? 8 : 4;
	int64_t rows = CONV_TILE_BYTES / esz / (ckk * ow);
	return rows < 1 ? 1 : rows > oh ? oh : rows;
}

/* The register tiles' column panels an image's tiles of `rows` output rows
 * take (each tile's columns rounded up to CG_TG_NR). */
static int64_t conv_tile_panels(int64_t rows, int64_t oh, int64_t ow)
{
	int64_t full = oh / rows, left = oh % rows;
	return full * ((rows * ow + CG_TG_NR - 1) / CG_TG_NR) +
	       (left * ow + CG_TG_NR - 1) / CG_TG_NR;
}

/* Output rows per tile for the GEMM template (f32): the row count of at
 * most CONV_TILE_BYTES that wastes the fewest masked columns of the
 * register tiles, the most rows among equals; up to CONV_TILE_BYTES_MAX
 * where that wastes at least 1/16 of the columns less. A tile's columns
 * round up to whole panels of CG_TG_NR: 128 -> 128 at 28² (K = 1152) had
 * tiles of 4 rows, 112 columns in 4 panels, 12.5% of the products masked
 * off; 8 rows (1008 KiB), 224 columns in 7: 10.4-12.0 -> 9.7-9.8 ms at
 * batch 8 (torch's oneDNN 8.6). */
static int64_t conv_tile_rows_tmpl(int64_t ckk, int64_t oh, int64_t ow)
{
	int64_t r1 = conv_tile_rows(ckk, oh, ow, KILN_DT_F32);
	int64_t r2 = CONV_TILE_BYTES_MAX / 4 / (ckk * ow);
	r2 = r2 < r1 ? r1 : r2 > oh ? oh : r2;
	int64_t best = r1, bp = conv_tile_panels(r1, oh, ow);
	for (int64_t r = r1 - 1; r >= 1; r--) {
		int64_t p = conv_tile_panels(r, oh, ow);
		if (p < bp)
			best = r, bp = p;
	}
	int64_t far = best, fp = bp;
	for (int64_t r = r1 + 1; r <= r2; r++) {
		int64_t p = conv_tile_panels(r, oh, ow);
		if (p < fp) /* the fewest rows among equals */
			far = r, fp = p;
	}
	/* panels: the fewer, the fewer masked columns (the columns are
	 * the same) */
	return 16 * (bp - fp) >= bp ? far : best;
}

/* The GEMM template's rows per tile for n images: conv_tile_rows_tmpl's
 * where they make CONV_TILE_MIN_UNITS units, else the fewer rows (of at
 * least CG_TG_NR columns) that make them in the fewest panels, at most
 * 1/8 more than r0's; 0 where none does. The template keeps its speed on narrow
 * tiles, where the whole-image im2col and BLAS had taken small images: U-Net's
 * 3x3 128 -> 64 at 16², batch 2, 0.46-0.50 -> 0.35-0.36 ms in tiles of 4 rows,
 * 8 units (torch 0.38), its inference 3.75-3.79 -> 3.29-3.31 ms; at 8², 4 units
 * at most, it stays BLAS's. */
static int64_t conv_tile_rows_units(int64_t ckk, int64_t oh, int64_t ow,
				    int64_t n)
{
	int64_t r0 = conv_tile_rows_tmpl(ckk, oh, ow);
	if (n * ((oh + r0 - 1) / r0) >= CONV_TILE_MIN_UNITS)
		return r0 * ow >= CG_TG_NR ? r0 : 0;
	/* and no more than 1/8 more panels than r0's: 12² in tiles of 3
	 * rows, 36 columns in 2 panels, would mask off 44% */
	int64_t best = 0, bp = conv_tile_panels(r0, oh, ow);
	bp += bp / 8 + 1;
	for (int64_t r = r0 - 1; r >= 1 && r * ow >= CG_TG_NR; r--) {
		if (n * ((oh + r - 1) / r) < CONV_TILE_MIN_UNITS)
			continue;
		int64_t p = conv_tile_panels(r, oh, ow);
		if (p < bp)
			best = r, bp = p;
	}
	return best;
}

/* t as a buffer of dtype acc (a copy when it is not one already, or when
 * unit_last asks for a unit stride along its last dim and it has not). */
static int acc_buf(lnode_t *n, lt_t *t, kiln_dtype_t acc, bool unit_last,
		   lt_t **out)
{
	cctx_t *c = n->c;
	if (t->is_buf && t->dtype == acc &&
	    (!unit_last || dim_is(t->strides[t->rank - 1], 1))) {
		*out = t;
		return 0;
	}
	lt_t *u =
	    lt_fn(c, acc, t->rank, t->sizes, sx_cast(c, lt_body(c, t), acc));
	if (u == NULL)
		return -ENOMEM;
	return lt_realize(c, u, (int32_t)n->index, out);
}

/* A rank-4 buffer view with unit stride along dim 1 (channels-last). */
static bool chan_unit(const lt_t *t)
{
	return t->is_buf && t->rank == 4 && dim_is(t->strides[1], 1);
}

/* t [N, C, H, W] as the row-major [N·H·W, C] matrix of its channels-last
 * data in dtype acc (*rows), realized channels-last first where t is not
 * such a buffer of dtype acc; *view (where asked) the [N, C, H, W] view of
 * that data. */
static int nhwc_rows(lnode_t *n, lt_t *t, kiln_dtype_t acc, lt_t **view,
		     lt_t **rows)
{
	cctx_t *c = n->c;
	static const uint32_t nhwc[4] = {0, 2, 3, 1};
	if (!chan_unit(t) || t->dtype != acc) {
		lt_t *u =
		    lt_fn(c, acc, 4, t->sizes, sx_cast(c, lt_body(c, t), acc));
		if (u == NULL)
			return -ENOMEM;
		int rc = lt_realize_nhwc(c, u, (int32_t)n->index, &t);
		if (rc != 0)
			return rc;
	}
	if (view != NULL)
		*view = t;
	kiln_dim_t r2[2] = {
	    dim_const(t->sizes[0].c * t->sizes[2].c * t->sizes[3].c),
	    dim_const(t->sizes[1].c)};
	lt_t *p = lt_permute(c, t, nhwc);
	*rows = p ? lt_reshape(c, p, 2, r2) : NULL;
	return *rows ? 0 : -ENOMEM;
}

/* The weight w as the product's A: [O, K] (K = C·KH·KW, or C for a 1x1),
 * a buffer of dtype acc with unit stride along K. */
static int weight_2d(lnode_t *n, lt_t *w, int64_t O, int64_t K,
		     kiln_dtype_t acc, lt_t **out)
{
	kiln_dim_t w2[2] = {dim_const(O), dim_const(K)};
	lt_t *wv = lt_reshape(n->c, w, 2, w2);
	if (wv == NULL)
		return -ENOMEM;
	return acc_buf(n, wv, acc, true, out);
}

/* A convspec in the arena for dims {N, C, H, W, O, KH, KW, OH, OW} and
 * cv's stride, padding and dilation (rows, tmpl, implicit left 0). */
static convspec_t *new_convspec(cctx_t *c, const conv_t *cv,
				const int64_t *dims)
{
	convspec_t *cs = kiln_arena_calloc(c->arena, 1, sizeof(*cs));
	if (cs == NULL)
		return NULL;
	*cs = (convspec_t){.N = dims[0],
			   .C = dims[1],
			   .H = dims[2],
			   .W = dims[3],
			   .O = dims[4],
			   .KH = dims[5],
			   .KW = dims[6],
			   .OH = dims[7],
			   .OW = dims[8],
			   .G = 1};
	for (int k = 0; k < 2; k++) {
		cs->s[k] = cv->s[k];
		cs->p[k] = cv->p[k];
		cs->d[k] = cv->d[k];
	}
	return cs;
}

/* The tiled template (groups == 1): one compute node whose kernel, for
 * each unit (image, block of output rows),
 * writes that block's im2col columns into a scratch of at most
 * CONV_TILE_BYTES and multiplies W by it there (the GEMM template or
 * BLAS: conv_template), so the columns never go to memory (the whole-image
 * im2col wrote and read back C·KH·KW times the input: 115 MB for resnet18's
 * 64->64 3x3 at batch 16). */
static int conv_tiled(lnode_t *n, lt_t *x, lt_t *w, const conv_t *cv,
		      kiln_dtype_t acc, const int64_t *dims, lt_t **out)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], C = dims[1], O = dims[4], KH = dims[5],
		KW = dims[6], OH = dims[7], OW = dims[8];
	int64_t CKK = C * KH * KW;
	lt_t *xb, *wb;
	int rc = acc_buf(n, x, acc, false, &xb);
	if (rc != 0)
		return rc;
	rc = weight_2d(n, w, O, CKK, acc, &wb);
	if (rc != 0)
		return rc;
	convspec_t *cs = new_convspec(c, cv, dims);
	if (cs == NULL)
		return -ENOMEM;
	cs->tmpl = conv_template(c, n, acc);
	int64_t ru = cs->tmpl ? conv_tile_rows_units(CKK, OH, OW, N) : 0;
	cs->rows = ru > 0     ? ru /* max-autotune may take it with none */
		   : cs->tmpl ? conv_tile_rows_tmpl(CKK, OH, OW)
			      : conv_tile_rows(CKK, OH, OW, acc);
	kiln_dim_t sz[4] = {dim_const(N), dim_const(O), dim_const(OH),
			    dim_const(OW)};
	return lgemm_node(n, wb, xb, cs, acc, 4, sz, out);
}

/* out[O, N·OH·OW] (a product over a batch's columns) as y[N, O, OH, OW]:
 * a view (OH·OW stays the contiguous inner run), NULL when out of memory */
static lt_t *cols_nchw(cctx_t *c, lt_t *o2, int64_t N, int64_t O, int64_t OH,
		       int64_t OW)
{
	kiln_dim_t o4[4] = {dim_const(O), dim_const(N), dim_const(OH),
			    dim_const(OW)};
	static const uint32_t perm[4] = {1, 0, 2, 3};
	lt_t *y4 = lt_reshape(c, o2, 4, o4);
	return y4 ? lt_permute(c, y4, perm) : NULL;
}

/* [N, H, W, X] (channels-last order) as [N, X, H, W]: a permuted view */
static const uint32_t nhwc_to_nchw[4] = {0, 3, 1, 2};

/* out[N·H·W, X] (a product over every position, channels-last) as y[N, X,
 * H, W]: a view, NULL when out of memory */
static lt_t *rows_nchw(cctx_t *c, lt_t *o2, int64_t N, int64_t H, int64_t W,
		       int64_t X)
{
	kiln_dim_t o4[4] = {dim_const(N), dim_const(H), dim_const(W),
			    dim_const(X)};
	lt_t *y4 = lt_reshape(c, o2, 4, o4);
	return y4 ? lt_permute(c, y4, nhwc_to_nchw) : NULL;
}

/* t [G·rows, cols] as the product operand of G groups: [G, rows, cols]
 * (a view) where G > 1, else t itself; NULL when out of memory. */
static lt_t *per_group(cctx_t *c, lt_t *t, int64_t G)
{
	if (t == NULL || G == 1)
		return t;
	kiln_dim_t g3[3] = {dim_const(G), dim_const(t->sizes[0].c / G),
			    t->sizes[1]};
	return lt_reshape(c, t, 3, g3);
}

/* The batched im2col col[(c, kh, kw), (n, oh, ow)] of x (dims {N, C, H,
 * W, O, KH, KW, OH, OW}), realized, as the product operand [C·KH·KW,
 * N·OH·OW], per group [G, Cg·KH·KW, N·OH·OW] where G > 1. */
static int batch_cols(lnode_t *n, lt_t *x, const conv_t *cv, kiln_dtype_t acc,
		      const int64_t *dims, lt_t **col)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], C = dims[1], KH = dims[5], KW = dims[6],
		OH = dims[7], OW = dims[8];
	kiln_dim_t cs[6] = {dim_const(C), dim_const(KH), dim_const(KW),
			    dim_const(N), dim_const(OH), dim_const(OW)};
	lt_t *t;
	int rc = im2col(n, x, cv, acc, cs, IV(3), IV(0), 1, 2, &t);
	if (rc != 0)
		return rc;
	kiln_dim_t c2[2] = {dim_const(C * KH * KW), dim_const(N * OH * OW)};
	*col = per_group(c, lt_reshape(c, t, 2, c2), cv->groups);
	return *col ? 0 : -ENOMEM;
}

/* A convolution of a batch of small images (groups == 1), or a grouped
 * one that is not direct: a product per group with the batch in its
 * columns, W[g] [Og, Cg·KH·KW] @ col[g] [Cg·KH·KW, N·OH·OW] (batch_cols;
 * W read as it lies), whose result [O, N·OH·OW] is read as [N, O, OH, OW]
 * (cols_nchw). A grouped one had been a product per image and group, of
 * OH·OW columns, over W copied once per image: RegNetY's groups of 16
 * channels at 4², batch 4, were 192 products of 16 columns. */
static int conv_cols(lnode_t *n, lt_t *x, lt_t *w, const conv_t *cv,
		     kiln_dtype_t acc, const int64_t *dims, lt_t **y)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], C = dims[1], O = dims[4], KH = dims[5],
		KW = dims[6], OH = dims[7], OW = dims[8], G = cv->groups;
	lt_t *col;
	int rc = batch_cols(n, x, cv, acc, dims, &col);
	if (rc != 0)
		return rc;
	lt_t *wa = w;
	if (wa->dtype != acc)
		wa = lt_fn(c, acc, 4, w->sizes, sx_cast(c, lt_body(c, w), acc));
	kiln_dim_t w2[2] = {dim_const(O), dim_const(C / G * KH * KW)};
	lt_t *wv = per_group(c, wa ? lt_reshape(c, wa, 2, w2) : NULL, G), *p;
	if (wv == NULL)
		return -ENOMEM;
	rc = lgemm(n, wv, col, acc, &p);
	if (rc != 0)
		return rc;
	kiln_dim_t o2[2] = {dim_const(O), dim_const(N * OH * OW)};
	if (G > 1)
		p = lt_reshape(c, p, 2, o2);
	*y = p ? cols_nchw(c, p, N, O, OH, OW) : NULL;
	return *y ? 0 : -ENOMEM;
}

/* Whether implicit GEMM takes a groups == 1 convolution that would
 * otherwise build a whole-image or batched im2col: f32 with the GEMM
 * template, N·OH·OW making at least CG_CONV_IMPLICIT_MIN_UNITS units of
 * columns (cir.h has the figures), and x's offsets within the packing's
 * 32-bit gather indices (x as conv_implicit reads it: itself when it is a
 * buffer of dtype acc, else a contiguous copy). */
static bool conv_implicit_ok(cctx_t *c, const lnode_t *n, const lt_t *x,
			     kiln_dtype_t acc, const int64_t *dims, int64_t G)
{
	int64_t N = dims[0], OH = dims[7], OW = dims[8];
	if (!conv_template(c, n, acc) ||
	    G * cg_conv_implicit_units(N * OH * OW) <
		CG_CONV_IMPLICIT_MIN_UNITS ||
	    N * dims[1] * dims[2] * dims[3] >= INT32_MAX ||
	    N * OH * OW >= INT32_MAX)
		return false;
	if (!x->is_buf || x->dtype != acc)
		return true;
	int64_t last = 0;
	for (int k = 0; k < 4; k++) {
		if (x->strides[k].e != NULL)
			return false;
		last += (x->sizes[k].c - 1) * x->strides[k].c;
	}
	return x->offset.e == NULL && x->offset.c + last < INT32_MAX;
}

/* Implicit GEMM (where conv_implicit_ok): one product node W[O, CKK] @
 * col[CKK, N·OH·OW] whose B blocks the blocked template packs straight
 * from x (codegen.c gen_conv_implicit_body), into out[O, N·OH·OW], and *y
 * that read as [N, O, OH, OW] (cols_nchw). The
 * im2col buffer it replaces was 14 MB for ResNet-18's 512->512 at 7² at
 * batch 16, its kernel 1.8 ms of 14.5. */
static int conv_implicit(lnode_t *n, lt_t *x, lt_t *w, const conv_t *cv,
			 kiln_dtype_t acc, const int64_t *dims, lt_t **y)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], C = dims[1], O = dims[4], KH = dims[5],
		KW = dims[6], OH = dims[7], OW = dims[8];
	lt_t *xb, *wb;
	int rc = acc_buf(n, x, acc, false, &xb);
	if (rc == 0)
		rc = weight_2d(n, w, O, C / cv->groups * KH * KW, acc, &wb);
	if (rc != 0)
		return rc;
	convspec_t *cs = new_convspec(c, cv, dims);
	if (cs == NULL)
		return -ENOMEM;
	cs->tmpl = true;
	cs->implicit = true;
	cs->G = cv->groups;
	kiln_dim_t sz[2] = {dim_const(O), dim_const(N * OH * OW)};
	lt_t *o2;
	rc = lgemm_node(n, wb, xb, cs, acc, 2, sz, &o2);
	if (rc != 0)
		return rc;
	*y = cols_nchw(c, o2, N, O, OH, OW);
	return *y ? 0 : -ENOMEM;
}

/* The direct forward's rows a unit and output channels a unit for rows
 * of nv vectors: rows·nv (at most 4) vectors of the input a tap, each
 * feeding mo FMAs, mo·rows·nv accumulators within 24 registers; rows
 * divides OH. */
static void fdirect_block(int64_t O, int64_t OH, int64_t nv, int64_t *mo,
			  int64_t *rows)
{
	int64_t r = 1;
	for (int64_t k = 4; k > 1; k--)
		if (k * nv <= 4 && OH % k == 0) {
			r = k;
			break;
		}
	int64_t m = 24 / (r * nv);
	if (m > 16)
		m = 16;
	*rows = r;
	*mo = m < O ? m : O;
}

/* Whether the forward convolution dims {N, C, H, W, O, KH, KW, OH, OW} is
 * the direct kernel (conv_fdirect): f32 on AVX-512, groups 1, stride 1,
 * more than one tap, KW at most 8, rows of at most 4 vectors (OW <= 64)
 * at least 3/4 full; max-autotune's variant 3, else by the heuristic at
 * most CG_FDIRECT_MAX_O output channels (the template's tiles feed two row
 * blocks at most) and at least CG_FDIRECT_MIN_CKK multiply-adds an output.
 * max-autotune's timings (interleaved runs, 2 threads, the Zen 4), tiles
 * against direct (ms): U-Net's 3x3 32 -> 16 at 64², batch 2, 0.403 and
 * 0.327; 16 -> 16 0.201 and 0.166; its inference forward 3.36 -> 3.26
 * (kilnc --profile, least of 8 alternated runs). Not past 16: 64 -> 32 at
 * 32² 0.365 and 0.417, 5x5 32 -> 32 0.510 and 0.578 (the template's tiles
 * feed 4 row blocks there); 3 -> 16 at 64² (27 taps in all) 0.085 as
 * implicit GEMM against 0.21 (kilnc --profile). */
static bool conv_fdirect_ok(const cctx_t *c, const lnode_t *n, const conv_t *cv,
			    const int64_t *dims, kiln_dtype_t acc)
{
	int64_t O = dims[4], KH = dims[5], KW = dims[6], OW = dims[8];
	if (!conv_template(c, n, acc) || cv->groups != 1 || cv->s[0] != 1 ||
	    cv->s[1] != 1 || KH * KW < 2 || KW > 8 || OW > 64)
		return false;
	if (c->tune != NULL && c->tune[n->index] >= 0)
		return c->tune[n->index] == 3;
	if (c->no_conv_direct)
		return false;
	int64_t nv = (OW + 15) / 16;
	return O <= CG_FDIRECT_MAX_O &&
	       dims[1] * KH * KW >= CG_FDIRECT_MIN_CKK && 4 * OW >= 3 * 16 * nv;
}

/* y [N, O, OH, OW] of a stride-1 convolution of few output channels,
 * direct (conv_fdirect_ok): one compute node whose kernel (codegen.c
 * gen_conv_fdirect_body) sums the weights times the input shifted by
 * each tap in registers, with no im2col. */
static int conv_fdirect(lnode_t *n, lt_t *x, lt_t *w, const conv_t *cv,
			kiln_dtype_t acc, const int64_t *dims, lt_t **y)
{
	cctx_t *c = n->c;
	lt_t *xb, *wb;
	int rc = acc_buf(n, x, acc, true, &xb);
	if (rc == 0)
		rc = acc_buf(n, w, acc, false, &wb);
	if (rc != 0)
		return rc;
	convspec_t *cs = new_convspec(c, cv, dims);
	if (cs == NULL)
		return -ENOMEM;
	cs->fdirect = true;
	fdirect_block(dims[4], dims[7], (dims[8] + 15) / 16, &cs->fd_mo,
		      &cs->fd_r);
	kiln_dim_t sz[4] = {dim_const(dims[0]), dim_const(dims[4]),
			    dim_const(dims[7]), dim_const(dims[8])};
	return lgemm_node(n, wb, xb, cs, acc, 4, sz, y);
}

/* Whether a groups == 1 convolution takes the tiled template: the
 * max-autotune choice for the node (variant 0: tiled with the GEMM
 * template, 1: whole-image im2col, 2: tiled with BLAS; autotune.c), else
 * the recorded heuristic above; with fewer, for the GEMM template, also
 * where tiles of fewer rows make the units (conv_tile_rows_units). fewer
 * is asked only where implicit GEMM has not taken the convolution: one
 * image of 28², 128 -> 128, ran in 1.18-1.20 ms as implicit GEMM and 1.31
 * in tiles of 3 rows; [1, 16, 30²] -> 20 (K = 144) 0.070-0.076 and 0.032,
 * left to implicit GEMM all the same. */
static bool conv_use_tiled(cctx_t *c, const lnode_t *n, int64_t CKK, int64_t OH,
			   int64_t OW, int64_t N, kiln_dtype_t acc, bool fewer)
{
	/* the scratch (one tile: at least one output row's columns) lives
	 * on the stack: never more than CONV_TILE_BYTES */
	int64_t esz = acc == KILN_DT_F64 ? 8 : 4;
	if (CKK * OW > CONV_TILE_BYTES / esz)
		return false;
	if (c->tune != NULL && c->tune[n->index] >= 0)
		return c->tune[n->index] != 1;
	if (conv_template(c, n, acc) && fewer)
		return conv_tile_rows_units(CKK, OH, OW, N) > 0;
	int64_t rows = conv_tile_rows(CKK, OH, OW, acc);
	int64_t min_cols =
	    conv_template(c, n, acc) ? CG_TG_NR : CONV_TILE_MIN_COLS;
	return rows * OW >= min_cols &&
	       N * ((OH + rows - 1) / rows) >= CONV_TILE_MIN_UNITS;
}

/* y[N, O, OH, OW] = a[N, O, K] @ b[N, K, OH·OW] (a batched product). */
static int gemm_nchw(lnode_t *n, lt_t *a, lt_t *b, kiln_dtype_t acc, int64_t N,
		     int64_t O, int64_t OH, int64_t OW, lt_t **y)
{
	lt_t *o3;
	int rc = lgemm(n, a, b, acc, &o3);
	if (rc != 0)
		return rc;
	kiln_dim_t o4[4] = {dim_const(N), dim_const(O), dim_const(OH),
			    dim_const(OW)};
	*y = lt_reshape(n->c, o3, 4, o4);
	return *y ? 0 : -ENOMEM;
}

/* Whether node n computes its output channels-last: the graph does
 * (cctx_t.nhwc) and declares that output so. */
static bool nhwc_out(lnode_t *n)
{
	const kiln_value_t *v = lout(n, 0);
	return n->c->nhwc && v != NULL && decl_nhwc(v);
}

/* A 1x1, stride-1, unpadded convolution (groups == 1) in channels-last
 * order: y[N·H·W, O] = x[N·H·W, C] @ Wᵀ[C, O], one product whose rows are
 * every position of the batch, read back as [N, O, H, W] through a view.
 * Where the graph wants the output channels-last, this writes it in that
 * order (no transposing copy of each saved activation, 5.5 ms of
 * ConvNeXt-nano's 47 ms forward at batch 8, 128²), and a channels-last
 * input is read as it lies. */
static int conv_1x1_nhwc(lnode_t *n, lt_t *x, lt_t *w, kiln_dtype_t acc,
			 int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
			 lt_t **y)
{
	cctx_t *c = n->c;
	lt_t *a, *wa;
	int rc = nhwc_rows(n, x, acc, NULL, &a); /* [N·H·W, C] */
	if (rc == 0)
		rc = weight_2d(n, w, O, C, acc, &wa);
	if (rc != 0)
		return rc;
	const uint32_t tr[2] = {1, 0};
	lt_t *bt = lt_permute(c, wa, tr);
	if (bt == NULL)
		return -ENOMEM;
	lt_t *o2;
	rc = lgemm(n, a, bt, acc, &o2);
	if (rc != 0)
		return rc;
	*y = rows_nchw(c, o2, N, H, W, O);
	return *y ? 0 : -ENOMEM;
}

/* A depthwise convolution's weights [C, 1, KH, KW] as [KH, KW, C] (a
 * small copy): along C, w[c, 0, kh, kw] is KH·KW elements apart. */
static int dw_weight_khwc(lnode_t *n, lt_t *w, int64_t C, int64_t KH,
			  int64_t KW, lt_t **wt)
{
	cctx_t *c = n->c;
	kiln_dim_t w3[3] = {dim_const(C), dim_const(KH), dim_const(KW)};
	static const uint32_t khwc[3] = {1, 2, 0};
	lt_t *wr = lt_reshape(c, w, 3, w3);
	lt_t *p = wr ? lt_permute(c, wr, khwc) : NULL;
	if (p == NULL)
		return -ENOMEM;
	return lt_realize(c, p, (int32_t)n->index, wt);
}

/* The channels a channels-last depthwise sum reads the windows of at
 * once, in bytes: past this (49 taps of 768 channels are 150 KiB), the
 * channels are taken in blocks. */
#define DW_BLOCK_BYTES (32 << 10)

/* The channel block CB of a channels-last depthwise sum over C channels:
 * all of them where the window of every channel (taps·C elements) fits
 * DW_BLOCK_BYTES, else 64 channels (4 vectors) or fewer where that
 * divides C; C where no multiple of the vector width does. */
static int64_t dw_chan_block(int64_t C, int64_t taps, int64_t esz, int64_t vw)
{
	if (taps * C * esz <= DW_BLOCK_BYTES)
		return C;
	for (int64_t cb = 4 * vw; cb >= vw; cb /= 2)
		if (C % cb == 0 && cb < C)
			return cb;
	return C;
}

/* src [N, C, H, W] copied to [C/CB, N, H, W, CB]: channels-last in
 * blocks of CB channels, each block's positions together. A computed src
 * that is not channels-last is written as it is first: the copy reads it
 * a gather a vector, which would otherwise compute each lane apart. */
static int dw_blocked(lnode_t *n, lt_t *src, int64_t CB, lt_t **out)
{
	cctx_t *c = n->c;
	if (!src->is_buf && !chan_unit(src)) {
		int rc = lt_realize(c, src, (int32_t)n->index, &src);
		if (rc != 0)
			return rc;
	}
	const kiln_dim_t bs[5] = {dim_const(src->sizes[1].c / CB),
				  src->sizes[0], src->sizes[2], src->sizes[3],
				  dim_const(CB)};
	const kiln_expr_t *si[4] = {
	    IV(1), ix_add(c, ix_mul(c, IV(0), IC(CB)), IV(4)), IV(2), IV(3)};
	lt_t *sb = lt_fn(c, src->dtype, 5, bs, lt_at(c, src, si));
	if (sb == NULL)
		return -ENOMEM;
	return lt_realize(c, sb, (int32_t)n->index, out);
}

/* A depthwise sum over the taps, channels-last: y[n, c, yh, yw] = Σ
 * src[n, c, sh, sw]·w[c, 0, kh, kw] over (kh, kw) where ok holds; sh,
 * sw and ok are expressions of the vars 1 n, 2 yh, 3 yw, 4 kh, 5 kw of the
 * sum's space [OB, N, YH, YW, KH*, KW*, CB], whose channels c = ob·CB + cb
 * come in blocks of CB outermost (dw_chan_block), so that a block's
 * weights and the windows its next outputs read stay in L1. With one
 * block that is the channels-last order, src is made channels-last where
 * it is not and w is [KH, KW, C]. With more, src and w are copied to
 * [OB, N, SH, SW, CB] and [OB, KH, KW, CB] first: read in place, the
 * taps of a window lie C elements apart, which maps them onto a quarter
 * of L1's sets at 768 channels (7x7 at 18², 768 channels: 0.33 -> 0.11
 * ms). The sum is written as a dense [N, YH, YW, C] buffer, read as [N,
 * C, YH, YW]. */
static int dw_cl_sum(lnode_t *n, lt_t *src, lt_t *w, kiln_dtype_t acc,
		     int64_t YH, int64_t YW, int64_t KH, int64_t KW,
		     const kiln_expr_t *sh, const kiln_expr_t *sw,
		     const sx_t *ok, lt_t **blk, lt_t **y)
{
	cctx_t *c = n->c;
	int64_t N = src->sizes[0].c, C = src->sizes[1].c;
	int64_t CB = dw_chan_block(C, KH * KW,
				   (int64_t)kiln_dtype_size(src->dtype),
				   c->vec_width),
		OB = C / CB;
	const kiln_expr_t *ch =
	    OB == 1 ? IV(6) : ix_add(c, ix_mul(c, IV(0), IC(CB)), IV(6));
	const sx_t *sv, *wv;
	lt_t *wt;
	int rc;
	if (OB == 1) {
		if (!chan_unit(src)) {
			rc = lt_realize_nhwc(c, src, (int32_t)n->index, &src);
			if (rc != 0)
				return rc;
		}
		rc = dw_weight_khwc(n, w, C, KH, KW, &wt);
		if (rc != 0)
			return rc;
		const kiln_expr_t *si[4] = {IV(1), ch, sh, sw};
		const kiln_expr_t *wi[3] = {IV(4), IV(5), ch};
		sv = lt_at(c, src, si);
		wv = lt_at(c, wt, wi);
	} else {
		const kiln_dim_t ws[4] = {dim_const(OB), dim_const(KH),
					  dim_const(KW), dim_const(CB)};
		const kiln_expr_t *wi[4] = {
		    ix_add(c, ix_mul(c, IV(0), IC(CB)), IV(3)), IC(0), IV(1),
		    IV(2)};
		lt_t *sb = blk != NULL ? *blk : NULL;
		if (sb == NULL) {
			rc = dw_blocked(n, src, CB, &sb);
			if (rc != 0)
				return rc;
			if (blk != NULL)
				*blk = sb;
		}
		lt_t *wb = lt_fn(c, w->dtype, 4, ws, lt_at(c, w, wi));
		if (wb == NULL)
			return -ENOMEM;
		rc = lt_realize(c, wb, (int32_t)n->index, &wt);
		if (rc != 0)
			return rc;
		const kiln_expr_t *bi[5] = {IV(0), IV(1), sh, sw, IV(6)};
		const kiln_expr_t *bw[4] = {IV(0), IV(4), IV(5), IV(6)};
		sv = lt_at(c, sb, bi);
		wv = lt_at(c, wt, bw);
	}
	const sx_t *body =
	    sx_bin(c, OP_MUL, sx_cast(c, sx_guard(c, sv, ok), acc),
		   sx_cast(c, wv, acc));
	body = sx_where(c, ok, body, sxf(c, 0, acc));
	const kiln_dim_t fs[7] = {dim_const(OB), dim_const(N),	dim_const(YH),
				  dim_const(YW), dim_const(KH), dim_const(KW),
				  dim_const(CB)};
	/* one block: the space without its leading dim */
	uint32_t b1 = OB == 1 ? 1 : 0;
	if (b1) {
		const kiln_expr_t *drop[7] = {IC(0), IV(0), IV(1), IV(2),
					      IV(3), IV(4), IV(5)};
		body = sx_subst(c, body, drop, 7);
	}
	lt_t *full = lt_fn(c, acc, 7 - b1, fs + b1, body), *r;
	if (full == NULL)
		return -ENOMEM;
	rc = lred(n, full, (3u << 4) >> b1, false, RED_SUM, acc, &r);
	if (rc != 0)
		return rc;
	if (b1) {
		*y = lt_permute(c, r, nhwc_to_nchw);
		return *y ? 0 : -ENOMEM;
	}
	/* r [OB, N, YH, YW, CB] laid out as [N, YH, YW, C] */
	const int64_t st[5] = {CB, YH * YW * C, YW * C, C, 1};
	cbuf_t *b = &c->bufs[r->buf];
	for (int k = 0; k < 5; k++)
		b->strides[k] = dim_const(st[k]);
	b->custom_strides = true;
	lt_t *v = lt_buf(c, r->buf);
	if (v == NULL)
		return -ENOMEM;
	const int64_t vs[4] = {N, YH, YW, C};
	v->rank = 4;
	for (int k = 0; k < 4; k++) {
		v->sizes[k] = dim_const(vs[k]);
		v->strides[k] = dim_const(st[k + 1]);
	}
	*y = lt_permute(c, v, nhwc_to_nchw);
	return *y ? 0 : -ENOMEM;
}

/* A depthwise convolution (Cg == Og == 1) in channels-last order, where
 * the graph wants its output channels-last, or where the direct form is
 * not taken: a sum over the taps with the channels last and not reduced
 * (dw_cl_sum), so the row kernel runs 16 channels a vector and reads x
 * and w contiguously. The direct form along OW would read a
 * channels-last x C elements apart (a gather a vector). */
static int conv_depthwise_nhwc(lnode_t *n, lt_t *x, lt_t *w, const conv_t *cv,
			       kiln_dtype_t acc, const int64_t *dims, lt_t **y)
{
	cctx_t *c = n->c;
	const kiln_expr_t *pos[2] = {win_pos(c, cv, 0, 2, 4),
				     win_pos(c, cv, 1, 3, 5)};
	const sx_t *ok =
	    in_image(c, pos[0], pos[1], dim_const(dims[2]), dim_const(dims[3]));
	return dw_cl_sum(n, x, w, acc, dims[7], dims[8], dims[5], dims[6],
			 pos[0], pos[1], ok, NULL, y);
}

/* Whether a convolution takes the direct form (a reduction over cg, kh,
 * kw vectorized across output columns) rather than a product: small
 * (Cg·KH·KW <= 32) grouped ones (depthwise), grouped ones of up to 64 taps
 * (ConvNeXt's 7x7 depthwise, ResNeXt's 4-channel groups) whose output rows
 * are a multiple of 4 columns, and 1x1 stride-1 ones of at
 * most 16 input channels. The other small ones (which took it before) measured
 * faster as im2col + BLAS (`kilnc --run --bench` against the code before, 2
 * threads, AMD EPYC Zen 3): a stride along W makes every vector load a
 * gather (3->32 3x3 stride 2 at 224²: 3.1-5.1 against 0.40-0.46 ms; 3->16
 * at 64²: 0.11-0.16 against 0.05, MobileNetV2's and EfficientNet's first
 * layer), and 3x3 over 3 channels lost at stride 1 as well (3->16 at 224²
 * 1.80 against 0.77 ms, 3->64 at 32² 0.125 against 0.083); 1x1 8->48 at
 * 32² is the other way (0.021 against 0.032), 32->16 at 56² not (0.088
 * against 0.063), and so are outputs of at most 16384 elements at stride
 * 1, where the im2col kernel and the BLAS call cost more than they save
 * (the corpus cnn's 3->8 at 16², batch 2: forward 0.042 against 0.049).
 * The grouped ones of 33-64 taps had taken im2col (a [N·G, Cg·KH·KW,
 * OH·OW] buffer: 128 MB for ConvNeXt's 80-channel 7x7 depthwise at 32²,
 * batch 8) and a product per group: direct, 2 threads, Zen 5, against
 * eager: 7x7 depthwise [8, 80, 32²] 5.95 -> 0.38 ms (eager 0.84), [8,
 * 160, 16²] 2.76 -> 0.27 (0.30), [8, 320, 8²] 1.87 -> 0.27 (0.09), [1,
 * 96, 56²] 8.58 -> 0.27 (0.47); 3x3 in groups of 4 channels [8, 128,
 * 28²] 3.98 -> 0.57 (1.28); 5x5 in groups of 2 [8, 96, 32²] 6.81 -> 0.58
 * (5.13). Where a row ends in scalar columns the direct form can be far
 * slower (7x7 depthwise [8, 384, 7²]: 37.5 against 2.75 ms; 3x3 in groups
 * of 16 at 7²: 68 against 2.2), hence OW % 4 == 0. */
static bool direct_ok(int64_t G, int64_t Cg, int64_t KH, int64_t KW,
		      int64_t outputs, int64_t OW, const conv_t *cv)
{
	if (G > 1)
		return Cg * KH * KW <= 32 ||
		       (Cg * KH * KW <= 64 && OW % 4 == 0);
	if (Cg * KH * KW > 32)
		return false;
	if (cv->s[1] != 1)
		return false;
	return (KH == 1 && KW == 1 && cv->s[0] == 1 && Cg <= 16) ||
	       outputs <= 16384;
}

/* A 1-d convolution's parameters moved to W, the dim it runs along once
 * as2d has given it a unit H. */
static void conv_as2d(conv_t *cv)
{
	if (cv->nd != 1)
		return;
	cv->s[1] = cv->s[0], cv->p[1] = cv->p[0], cv->d[1] = cv->d[0];
	cv->op[1] = cv->op[0];
	cv->s[0] = 1, cv->p[0] = 0, cv->d[0] = 1, cv->op[0] = 0;
}

/* The convolution of x0 by w0, plus b where given: output 0 of n (or
 * capture[0], for a transposed convolution's backward). */
static int conv_forward(lnode_t *n, lt_t *x0, lt_t *w0, lt_t *b, conv_t cv)
{
	cctx_t *c = n->c;
	int rc;
	lt_t *x = as2d(c, x0), *w = as2d(c, w0);
	conv_as2d(&cv);
	for (int k = 0; k < 4; k++)
		if (x->sizes[k].e != NULL || w->sizes[k].e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "symbolic convolution shapes are not "
				    "lowered");
	int64_t N = x->sizes[0].c, C = x->sizes[1].c, H = x->sizes[2].c,
		W = x->sizes[3].c;
	int64_t O = w->sizes[0].c, Cg = w->sizes[1].c, KH = w->sizes[2].c,
		KW = w->sizes[3].c, G = cv.groups;
	if (C != Cg * G || O % G != 0)
		return lerr(
		    n, KILN_EINVGRAPH,
		    "%lld input channels and weight [%lld, %lld, ..] do not "
		    "fit groups=%lld",
		    (long long)C, (long long)O, (long long)Cg, (long long)G);
	int64_t OH = (H + 2 * cv.p[0] - cv.d[0] * (KH - 1) - 1) / cv.s[0] + 1;
	int64_t OW = (W + 2 * cv.p[1] - cv.d[1] * (KW - 1) - 1) / cv.s[1] + 1;
	if (OH <= 0 || OW <= 0)
		return lerr(n, KILN_EINVGRAPH,
			    "the kernel is larger than the "
			    "padded input");
	kiln_dtype_t odt = lout(n, 0) ? lout(n, 0)->dtype : x->dtype;
	kiln_dtype_t acc = compute_dtype(odt);
	int64_t Og = O / G, CKK = Cg * KH * KW;
	lt_t *y; /* [N, O, OH, OW] */
	/* a batch of small images: the batch in the product's columns */
	bool batched = G == 1 && N > 1 && OH * OW < CONV_BATCH_COLS_P &&
		       !(c->tune != NULL && c->tune[n->index] >= 0 &&
			 c->tune[n->index] != 1);
	/* 1x1, stride 1, no padding: the input is its own im2col */
	bool one = G == 1 && KH == 1 && KW == 1 && cv.s[0] == 1 &&
		   cv.s[1] == 1 && cv.p[0] == 0 && cv.p[1] == 0;
	const int64_t dims[9] = {N, C, H, W, O, KH, KW, OH, OW};
	bool direct = direct_ok(G, Cg, KH, KW, N * O * OH * OW, OW, &cv) ||
		      c->blas == NULL ||
		      (acc != KILN_DT_F32 && acc != KILN_DT_F64);
	if (!direct && one && nhwc_out(n)) {
		rc = conv_1x1_nhwc(n, x, w, acc, N, C, H, W, O, &y);
		if (rc != 0)
			return rc;
	} else if (G > 1 && Cg == 1 && Og == 1 &&
		   ((direct && nhwc_out(n)) ||
		    (!direct && O % c->vec_width == 0))) {
		/* depthwise, channels-last: where the graph wants that, and
		 * where the direct form along OW is not taken (rows that end
		 * in scalar lanes, or more than 64 taps), in place of an
		 * im2col of KH·KW times the input and a product of one row a
		 * channel. x and y are transposed around it. 7x7 at 7²,
		 * batch 8, 384 channels: 3.0 -> 0.22 ms; ConvMixer-768/32's
		 * 7x7 at 18²: 111 -> 45 ms a forward. The direct form stays
		 * where it is taken (3x3 at 14², 576 channels: 0.29 ms along
		 * OW, 0.33 channels-last) */
		rc = conv_depthwise_nhwc(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if (direct) {
		/* direct: full space [N, O, Cg, KH, KW, OH, OW]. It reads each
		 * input element Og·KH·KW times: a computed input (the eval
		 * batch_norm and relu6 after the convolution before, in
		 * MobileNetV2) is written once first, where that producer's
		 * kernel can compute it, instead of being recomputed at
		 * every read */
		if (!x->is_buf && Og * KH * KW > 1) {
			rc = lt_realize(c, x, (int32_t)n->index, &x);
			if (rc != 0)
				return rc;
		}
		kiln_dim_t fs[7] = {dim_const(N),  dim_const(O),  dim_const(Cg),
				    dim_const(KH), dim_const(KW), dim_const(OH),
				    dim_const(OW)};
		set_var_ranges(c, 7, fs); /* for in_image */
		const kiln_expr_t *ch = ix_add(
		    c, ix_mul(c, ix_floordiv(c, IV(1), IC(Og)), IC(Cg)), IV(2));
		const kiln_expr_t *ih = win_pos(c, &cv, 0, 5, 3);
		const kiln_expr_t *iw = win_pos(c, &cv, 1, 6, 4);
		const kiln_expr_t *wi[4] = {IV(1), IV(2), IV(3), IV(4)};
		const sx_t *body = sx_bin(
		    c, OP_MUL, sx_cast(c, xin(c, x, IV(0), ch, ih, iw), acc),
		    sx_cast(c, lt_at(c, w, wi), acc));
		set_var_ranges(c, 0, NULL);
		rc = sum7(n, acc, fs, body, (1u << 2) | (1u << 3) | (1u << 4),
			  &y);
		if (rc != 0)
			return rc;
	} else if (conv_fdirect_ok(c, n, &cv, dims, acc)) {
		rc = conv_fdirect(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if ((batched ||
		    (G == 1 && !one &&
		     !conv_use_tiled(c, n, CKK, OH, OW, N, acc, false))) &&
		   conv_implicit_ok(c, n, x, acc, dims, 1)) {
		/* implicit GEMM in place of the batched or whole-image
		 * im2col below */
		rc = conv_implicit(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if (batched) {
		/* small images: the batch goes into the columns, col[(c, kh,
		 * kw), (n, oh, ow)], and one product W[O, CKK] @ col gives
		 * [O, N, OH, OW], read back as [N, O, OH, OW] through a view
		 * (OH·OW stays the contiguous inner run) */
		rc = conv_cols(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if (one) {
		/* 1x1, stride 1, no padding: the input is its own im2col,
		 * out[n] = W[O, C] @ x[n] viewed as [C, H·W] */
		lt_t *xb;
		rc = acc_buf(n, x, acc, false, &xb);
		if (rc != 0)
			return rc;
		kiln_dim_t x3[3] = {dim_const(N), dim_const(C),
				    dim_const(H * W)};
		lt_t *b3 = lt_reshape(c, xb, 3, x3);
		if (b3 == NULL)
			return -ENOMEM;
		lt_t *wa;
		rc = weight_2d(n, w, O, C, acc, &wa);
		if (rc != 0)
			return rc;
		kiln_dim_t e3[3] = {dim_const(N), dim_const(O), dim_const(C)};
		lt_t *w3 = lt_expand(c, wa, 3, e3);
		if (w3 == NULL)
			return -ENOMEM;
		rc = gemm_nchw(n, w3, b3, acc, N, O, OH, OW, &y);
		if (rc != 0)
			return rc;
	} else if (G == 1 && conv_use_tiled(c, n, CKK, OH, OW, N, acc, true)) {
		rc = conv_tiled(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if (G > 1 && Og >= CG_TG_MR &&
		   conv_implicit_ok(c, n, x, acc, dims, G)) {
		/* a product per group, packed from x (at least one register
		 * tile's rows a group: depthwise ones of few columns are
		 * products of one row) */
		rc = conv_implicit(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else if (G > 1) {
		rc = conv_cols(n, x, w, &cv, acc, dims, &y);
		if (rc != 0)
			return rc;
	} else {
		/* im2col: [N, C, KH, KW, OH, OW], realized contiguous */
		kiln_dim_t cs[6] = {dim_const(N),  dim_const(C),
				    dim_const(KH), dim_const(KW),
				    dim_const(OH), dim_const(OW)};
		lt_t *col;
		rc = im2col(n, x, &cv, acc, cs, IV(0), IV(1), 2, 3, &col);
		if (rc != 0)
			return rc;
		kiln_dim_t c3[3] = {dim_const(N), dim_const(CKK),
				    dim_const(OH * OW)};
		lt_t *col3 = lt_reshape(c, col, 3, c3);
		/* weights as [N, O, CKK]: a stride-0 view */
		lt_t *wa = w;
		if (wa->dtype != acc)
			wa = lt_fn(c, acc, 4, w->sizes,
				   sx_cast(c, lt_body(c, w), acc));
		if (wa == NULL)
			return -ENOMEM;
		kiln_dim_t w2[2] = {dim_const(O), dim_const(CKK)};
		lt_t *wv = lt_reshape(c, wa, 2, w2);
		kiln_dim_t e3[3] = {dim_const(N), dim_const(O), dim_const(CKK)};
		lt_t *w3 = wv ? lt_expand(c, wv, 3, e3) : NULL;
		if (w3 != NULL && !w3->is_buf) {
			rc = lt_realize(c, w3, (int32_t)n->index, &w3);
			if (rc != 0)
				return rc;
		}
		if (w3 == NULL || col3 == NULL)
			return -ENOMEM;
		rc = gemm_nchw(n, w3, col3, acc, N, O, OH, OW, &y);
		if (rc != 0)
			return rc;
	}
	if (b != NULL) {
		const kiln_expr_t *bi[1] = {IV(1)};
		y = lt_fn(c, acc, 4, y->sizes,
			  sx_bin(c, OP_ADD, lt_body(c, y),
				 sx_cast(c, lt_at(c, b, bi), acc)));
		if (y == NULL)
			return -ENOMEM;
	}
	if (cv.nd == 1)
		y = lt_squeeze_dim(c, y, 2);
	return lset(n, 0, y);
}

static int conv_transposed(lnode_t *n, lt_t *x0, lt_t *w0, lt_t *b,
			   const conv_t *cv);
static int conv3d(lnode_t *n, lt_t *x, lt_t *w, lt_t *b, const conv_t *cv);

int low_convolution(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *x0, *w0, *b;
	int rc = ltensor(n, 0, "input", &x0);
	if (rc == 0)
		rc = ltensor(n, 1, "weight", &w0);
	if (rc == 0)
		rc = ltensor_opt(n, 2, "bias", &b);
	if (rc != 0)
		return rc;
	if (x0->rank < 3 || x0->rank > 5 || w0->rank != x0->rank)
		return lerr(n, KILN_EUNSUPOP,
			    "only 1-d, 2-d and 3-d convolutions are lowered");
	conv_t cv;
	rc = conv_params(n, 3, x0->rank - 2, &cv);
	if (rc != 0)
		return rc;
	if (cv.transposed)
		return conv_transposed(n, x0, w0, b, &cv);
	return cv.nd == 3 ? conv3d(n, x0, w0, b, &cv)
			  : conv_forward(n, x0, w0, b, cv);
}

/* Over a grad_input space whose vars vk[0..3] are the tap (kh, kw) and
 * the input position (h, w) ([N, C, *, KH, KW, H, W]: 3, 4, 5, 6): the
 * output position (oh, ow) that the tap of the input position came from,
 * oh·sh = h + ph - kh·dh (and w alike), and whether it exists (the
 * division is exact and 0 <= oh < OH, 0 <= ow < OW). */
static const sx_t *bw_taps_at(cctx_t *c, const conv_t *cv, int64_t OH,
			      int64_t OW, const uint32_t vk[4],
			      const kiln_expr_t **oh, const kiln_expr_t **ow)
{
	const kiln_expr_t *th = ix_sub(c, ix_add(c, IV(vk[2]), IC(cv->p[0])),
				       ix_mul(c, IV(vk[0]), IC(cv->d[0])));
	const kiln_expr_t *tw = ix_sub(c, ix_add(c, IV(vk[3]), IC(cv->p[1])),
				       ix_mul(c, IV(vk[1]), IC(cv->d[1])));
	*oh = ix_floordiv(c, th, IC(cv->s[0]));
	*ow = ix_floordiv(c, tw, IC(cv->s[1]));
	const sx_t *ok = NULL;
	const kiln_expr_t *tt[2] = {th, tw}, *oo[2] = {*oh, *ow};
	int64_t lim[2] = {OH, OW}, st[2] = {cv->s[0], cv->s[1]};
	for (int k = 0; k < 2; k++) {
		const sx_t *v = sx_index(c, tt[k]);
		const sx_t *in =
		    sx_bin(c, OP_AND,
			   sx_bin(c, OP_GE, v, sx_consti(c, 0, KILN_DT_I64)),
			   sx_bin(c, OP_LT, sx_index(c, oo[k]),
				  sx_consti(c, lim[k], KILN_DT_I64)));
		if (st[k] > 1)
			in = sx_bin(
			    c, OP_AND, in,
			    sx_bin(c, OP_EQ,
				   sx_index(c, ix_mod(c, tt[k], IC(st[k]))),
				   sx_consti(c, 0, KILN_DT_I64)));
		ok = ok ? sx_bin(c, OP_AND, ok, in) : in;
	}
	return ok;
}

static const sx_t *bw_taps(cctx_t *c, const conv_t *cv, int64_t OH, int64_t OW,
			   const kiln_expr_t **oh, const kiln_expr_t **ow)
{
	static const uint32_t vk[4] = {3, 4, 5, 6};
	return bw_taps_at(c, cv, OH, OW, vk, oh, ow);
}

/* grad_weight as one product over the whole batch (conv_bw_gemm) where
 * the images have fewer than CONV_BATCH_COLS_P output positions and a
 * product per image would make at least this many elements ([N, O, CKK],
 * then summed over N): ResNet-50's 4² and 8² layers at batch 8 (a [8,
 * 512, 4608] product of K = 16 took 16 ms of the backward). Smaller ones
 * keep the product per image (their sums in the order they had). */
#define CONV_BW_ONE_MIN (1 << 18)

/* Whether grad_weight [O, CKK] = gO @ colᵀ is computed as its transpose,
 * col @ gOᵀ [CKK, O], read back transposed: where O is a few rows and CKK
 * many, OpenBLAS's sgemm of O rows runs at half speed (one thread: [16 x
 * 4096] @ [4096 x 288] 1.18 ms, its transpose 0.56; 32 x 576 at K 1024
 * 0.78 -> 0.44; from 64 rows on the two are even). U-Net's 3x3 32 -> 16
 * at 64², batch 2: its weight gradient's products 1.28-1.37 -> 0.55-0.66
 * ms (kilnc --profile). */
static bool bw_weight_swap(int64_t O, int64_t CKK)
{
	return O <= 32 && CKK >= 2 * O;
}

/* grad_weight [O, CKK] = gO2 (O x N·OHW) @ colK^T (N·OHW x CKK): one
 * product whose K is the batch's positions. go3: grad_output [N, O,
 * OHW]. */
static int bw_weight_one(lnode_t *n, const conv_t *cv, lt_t *x, lt_t *go2,
			 int64_t N, int64_t KH, int64_t KW, int64_t OW,
			 kiln_dtype_t acc, lt_t **gw)
{
	cctx_t *c = n->c;
	int64_t P = go2->sizes[1].c / N, O = go2->sizes[0].c, G = cv->groups;
	const int64_t dims[9] = {
	    N, x->sizes[1].c, x->sizes[2].c, x->sizes[3].c, O, KH, KW, P / OW,
	    OW};
	lt_t *col;
	int rc = batch_cols(n, x, cv, acc, dims, &col);
	if (rc != 0)
		return rc;
	/* per group g: gO2[g] (Og x N·OHW) @ col[g]ᵀ (N·OHW x Cg·KH·KW), or
	 * its transpose (bw_weight_swap) read back transposed */
	static const uint32_t t2[2] = {1, 0}, t3[3] = {0, 2, 1};
	const uint32_t *tr = G > 1 ? t3 : t2;
	lt_t *gg = per_group(c, go2, G), *p;
	if (gg == NULL)
		return -ENOMEM;
	if (bw_weight_swap(O / G, col->sizes[G > 1 ? 1 : 0].c)) {
		lt_t *ggt = lt_permute(c, gg, tr);
		if (ggt == NULL)
			return -ENOMEM;
		rc = lgemm(n, col, ggt, acc, &p);
		if (rc == 0 && (p = lt_permute(c, p, tr)) == NULL)
			rc = -ENOMEM;
	} else {
		lt_t *colt = lt_permute(c, col, tr);
		if (colt == NULL)
			return -ENOMEM;
		rc = lgemm(n, gg, colt, acc, &p);
	}
	if (rc != 0 || G == 1) {
		*gw = p;
		return rc;
	}
	kiln_dim_t w2[2] = {dim_const(O), dim_const(col->sizes[1].c)};
	*gw = lt_reshape(c, p, 2, w2);
	return *gw ? 0 : -ENOMEM;
}

/* grad_output [N, O, OHW] as the product operand [O, N·OHW] that
 * bw_weight_one and the batched grad_input share (realized once). */
static int go_cols(lnode_t *n, lt_t *go3, lt_t **go2)
{
	cctx_t *c = n->c;
	int64_t N = go3->sizes[0].c, O = go3->sizes[1].c, P = go3->sizes[2].c;
	const uint32_t t3[3] = {1, 0, 2};
	lt_t *gp = lt_permute(c, go3, t3); /* [O, N, OHW] */
	if (gp == NULL)
		return -ENOMEM;
	int rc = lt_realize(c, gp, (int32_t)n->index, &gp);
	if (rc != 0)
		return rc;
	kiln_dim_t o2[2] = {dim_const(O), dim_const(N * P)};
	*go2 = lt_reshape(c, gp, 2, o2);
	return *go2 ? 0 : -ENOMEM;
}

/* grad_weight [O, CKK] = sum_n gO[n] (O x OHW) @ col[n]^T (OHW x CKK) */
static int bw_weight_per_image(lnode_t *n, const conv_t *cv, lt_t *x, lt_t *go3,
			       int64_t KH, int64_t KW, int64_t OW,
			       kiln_dtype_t acc, lt_t **gw)
{
	cctx_t *c = n->c;
	int64_t N = go3->sizes[0].c, P = go3->sizes[2].c;
	int64_t C = x->sizes[1].c, OH = P / OW, CKK = C * KH * KW;
	kiln_dim_t cs[6] = {dim_const(N),  dim_const(C),  dim_const(KH),
			    dim_const(KW), dim_const(OH), dim_const(OW)};
	lt_t *col;
	int rc = im2col(n, x, cv, acc, cs, IV(0), IV(1), 2, 3, &col);
	if (rc != 0)
		return rc;
	kiln_dim_t c3[3] = {dim_const(N), dim_const(CKK), dim_const(P)};
	lt_t *col3 = lt_reshape(c, col, 3, c3);
	const uint32_t tr[3] = {0, 2, 1};
	lt_t *colT = col3 ? lt_permute(c, col3, tr) : NULL;
	if (colT == NULL)
		return -ENOMEM;
	lt_t *p;
	if (bw_weight_swap(go3->sizes[1].c, CKK)) {
		/* [N, CKK, O] = col @ gOᵀ, summed as [N, O, CKK] */
		const uint32_t t3[3] = {0, 2, 1};
		lt_t *goT = lt_permute(c, go3, t3);
		if (goT == NULL)
			return -ENOMEM;
		rc = lgemm(n, col3, goT, acc, &p);
		if (rc != 0)
			return rc;
		p = lt_permute(c, p, t3);
		if (p == NULL)
			return -ENOMEM;
	} else {
		rc = lgemm(n, go3, colT, acc, &p); /* [N, O, CKK] */
		if (rc != 0)
			return rc;
	}
	return lred(n, p, 1u, false, RED_SUM, acc, gw);
}

/* grad_input from gcol [N, C·KH·KW, OH·OW] of a strided convolution whose
 * strides divide the input (ops_conv.c conv_bw_gemm): col2im by the input
 * positions' phases (h mod sh, w mod sw). Within a phase each tap hits
 * every position or none, at a fixed offset: for h = sh·a + ph, oh = a +
 * (ph + pad - kh·dh)/sh where sh divides ph + pad - kh·dh. So the sum over
 * [N, C, SH, SW, KH*, KW*, H/sh, W/sw] tests each tap once a row and loads
 * gcol contiguously along W, where the sum over [N, C, KH*, KW*, H, W]
 * gathered every vector with at least half of its lanes masked off. The
 * phases are written back as [N, C, H, W] once (a gather a vector), which
 * the ops after read contiguously: read through index arithmetic, the
 * batch_norm backward after it cost what the sum saved. RegNetY-800MF's
 * four stride-2 3x3s in groups (batch 8, 128²): their col2im 5.6 -> 2.1
 * ms, the backward 46.3-47.9 -> 43.6-44.2 ms (`kilnc --run --bench`, four
 * alternations). Op cases convolution_backward phases_*. */
static int col2im_phases(lnode_t *n, const conv_t *cv, lt_t *gcol,
			 const int64_t *dims, kiln_dtype_t acc)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], C = dims[1], H = dims[2], W = dims[3],
		KH = dims[5], KW = dims[6], OH = dims[7], OW = dims[8];
	const int64_t st[2] = {cv->s[0], cv->s[1]}, lim[2] = {OH, OW};
	/* vars: 0 n, 1 c, 2 ph, 3 pw, 4 kh, 5 kw, 6 a, 7 b */
	const kiln_dim_t fs[8] = {dim_const(N),		dim_const(C),
				  dim_const(st[0]),	dim_const(st[1]),
				  dim_const(KH),	dim_const(KW),
				  dim_const(H / st[0]), dim_const(W / st[1])};
	const kiln_expr_t *o[2];
	const sx_t *ok = NULL;
	for (int k = 0; k < 2; k++) {
		/* ph + pad - kh·dh: a multiple of the stride for the taps
		 * that hit the phase, whose offset it gives */
		const kiln_expr_t *t =
		    ix_sub(c, ix_add(c, IV(2 + k), IC(cv->p[k])),
			   ix_mul(c, IV(4 + k), IC(cv->d[k])));
		o[k] = ix_add(c, IV(6 + k), ix_floordiv(c, t, IC(st[k])));
		const sx_t *v = sx_index(c, o[k]);
		const sx_t *in = sx_bin(
		    c, OP_AND,
		    sx_bin(c, OP_GE, v, sx_consti(c, 0, KILN_DT_I64)),
		    sx_bin(c, OP_LT, v, sx_consti(c, lim[k], KILN_DT_I64)));
		if (st[k] > 1)
			in = sx_bin(c, OP_AND, in,
				    sx_bin(c, OP_EQ,
					   sx_index(c, ix_mod(c, t, IC(st[k]))),
					   sx_consti(c, 0, KILN_DT_I64)));
		ok = ok ? sx_bin(c, OP_AND, ok, in) : in;
	}
	const kiln_expr_t *ck = ix_add(
	    c,
	    ix_add(c, ix_mul(c, IV(1), IC(KH * KW)), ix_mul(c, IV(4), IC(KW))),
	    IV(5));
	const kiln_expr_t *gi[3] = {IV(0), ck,
				    ix_add(c, ix_mul(c, o[0], IC(OW)), o[1])};
	const sx_t *g = sx_guard(c, lt_at(c, gcol, gi), ok);
	lt_t *full = lt_fn(c, acc, 8, fs, sx_where(c, ok, g, sxf(c, 0, acc)));
	if (full == NULL)
		return -ENOMEM;
	lt_t *r; /* [N, C, SH, SW, H/sh, W/sw] */
	int rc = lred(n, full, (1u << 4) | (1u << 5), false, RED_SUM, acc, &r);
	if (rc != 0)
		return rc;
	const kiln_dim_t ys[4] = {dim_const(N), dim_const(C), dim_const(H),
				  dim_const(W)};
	set_var_ranges(c, 4, ys);
	const kiln_expr_t *ri[6] = {IV(0),
				    IV(1),
				    ix_mod(c, IV(2), IC(st[0])),
				    ix_mod(c, IV(3), IC(st[1])),
				    ix_floordiv(c, IV(2), IC(st[0])),
				    ix_floordiv(c, IV(3), IC(st[1]))};
	set_var_ranges(c, 0, NULL);
	lt_t *y = lt_fn(c, acc, 4, ys, lt_at(c, r, ri));
	if (y == NULL)
		return -ENOMEM;
	rc = lt_realize(c, y, (int32_t)n->index, &y);
	if (rc != 0)
		return rc;
	if (cv->nd == 1)
		y = lt_squeeze_dim(c, y, 2);
	return y ? lset(n, 0, y) : -ENOMEM;
}

/* The direct weight gradient's output channels a unit: its accumulators,
 * wg_mo·KW vectors, within 24 of AVX-512's 32 registers (the rest hold
 * a row's loads). */
static int64_t wgrad_mo(int64_t O, int64_t KW)
{
	int64_t mo = 24 / KW;
	if (mo > 16)
		mo = 16;
	return mo < O ? mo : O;
}

/* Whether grad_weight of the convolution dims {N, C, H, W, O, KH, KW, OH,
 * OW} is the direct kernel (bw_weight_direct): f32 on AVX-512, stride 1,
 * more than one tap, at most 8 taps a row and 256 output columns (a
 * row's vectors are unrolled), groups of at least WGRAD_MIN_OG output
 * channels (grouped ones past the direct reductions: RegNet-like groups
 * of 8, 64 channels at 32², batch 2, 0.48-0.52 -> 0.09-0.13 ms); by the
 * heuristic, at most WGRAD_MAX_O output channels a group, a row's
 * vectors at least 3/4 full and at least WGRAD_MIN_VECS rows' vectors a
 * unit. Single convolutions' backward (kilnc --profile, least of 4
 * alternated runs, 2 threads, the Zen 4; unfold + product -> direct, ms):
 * U-Net's 32 -> 16 at 64², batch 2, 0.64 -> 0.33; 64 -> 64 at 56² 2.83
 * -> 2.32; 64 -> 64 at 32², batch 8, 3.74 -> 2.83; 5x5 32 -> 32 at 32²
 * 0.64 -> 0.48. Where the im2col product's many rows run at full speed
 * and its columns cost little, or the rows are short, it stays:
 * 128 -> 128 at 28² 2.43 against 2.54, 256 -> 256 at 14² 2.5 against
 * 2.85, 512 -> 512 at 7² 2.45 against 6.2 (9 lanes in 16 idle, and each
 * unit's 24 sums as costly as its few rows), 128 -> 128 at 8² 0.42
 * against 0.74. */
#define WGRAD_MAX_O    64
#define WGRAD_MIN_VECS 32
#define WGRAD_MIN_OG   4
static bool bw_weight_direct_ok(const cctx_t *c, const lnode_t *n,
				const conv_t *cv, const int64_t *dims,
				kiln_dtype_t acc)
{
	int64_t N = dims[0], O = dims[4], KH = dims[5], KW = dims[6],
		OH = dims[7], OW = dims[8], Og = O / cv->groups;
	if (!conv_template(c, n, acc) || cv->s[0] != 1 || cv->s[1] != 1 ||
	    KH * KW < 2 || KW > 8 || OW > 256 ||
	    (cv->groups > 1 && Og < WGRAD_MIN_OG))
		return false;
	int64_t nv = (OW + 15) / 16;
	return Og <= WGRAD_MAX_O && 4 * OW >= 3 * 16 * nv &&
	       N * OH * nv >= WGRAD_MIN_VECS;
}

/* grad_weight [O, C/G, KH, KW] of a stride-1 convolution, direct
 * (bw_weight_direct_ok): one compute node whose kernel
 * (codegen.c gen_conv_wgrad_body) sums grad_output times the input
 * shifted by each tap, with no im2col buffer. */
static int bw_weight_direct(lnode_t *n, const conv_t *cv, lt_t *x, lt_t *go,
			    const int64_t *dims, kiln_dtype_t acc, lt_t **gw)
{
	cctx_t *c = n->c;
	lt_t *xb, *gb;
	int rc = acc_buf(n, x, acc, true, &xb);
	if (rc == 0)
		rc = acc_buf(n, go, acc, true, &gb);
	if (rc != 0)
		return rc;
	convspec_t *cs = new_convspec(c, cv, dims);
	if (cs == NULL)
		return -ENOMEM;
	cs->wgrad = true;
	cs->G = cv->groups;
	cs->wg_mo = wgrad_mo(dims[4] / cv->groups, dims[6]);
	kiln_dim_t sz[4] = {dim_const(dims[4]), dim_const(dims[1] / cv->groups),
			    dim_const(dims[5]), dim_const(dims[6])};
	return lgemm_node(n, gb, xb, cs, acc, 4, sz, gw);
}

/*
 * The backward of a groups == 1 convolution through BLAS (the forward's
 * im2col + GEMM template, run backwards):
 *   grad_weight[O, CKK] = sum_n gO[n] (O x OHW) @ col[n]^T (OHW x CKK)
 *   gcol[n] (CKK x OHW) = W^T (CKK x O) @ gO[n] (O x OHW), then col2im:
 *   grad_input[n, c, h, w] = sum_{kh,kw} gcol[n, (c,kh,kw), (oh,ow)] over
 *   the (oh, ow) that h = oh*sh - ph + kh*dh (and w alike) hit exactly.
 * gO3 is grad_output as [N, O, OHW] in acc.
 */
static int conv_bw_gemm(lnode_t *n, const conv_t *cv, lt_t *x, lt_t *w,
			lt_t *go, const bool *mask, kiln_dtype_t acc)
{
	cctx_t *c = n->c;
	int64_t N = x->sizes[0].c, C = x->sizes[1].c, H = x->sizes[2].c,
		W = x->sizes[3].c;
	int64_t O = w->sizes[0].c, KH = w->sizes[2].c, KW = w->sizes[3].c;
	int64_t OH = go->sizes[2].c, OW = go->sizes[3].c, CKK = C * KH * KW;
	int64_t G = cv->groups, Cg = C / G, CKKg = CKK / G;
	lt_t *gb;
	int rc = acc_buf(n, go, acc, false, &gb);
	if (rc != 0)
		return rc;
	kiln_dim_t g3[3] = {dim_const(N), dim_const(O), dim_const(OH * OW)};
	lt_t *go3 = lt_reshape(c, gb, 3, g3);
	if (go3 == NULL)
		return -ENOMEM;
	/* small images: the batch side by side in the columns of one
	 * product for grad_input (as in the forward), and for grad_weight
	 * where a product per image would be large */
	bool small = G > 1 || (N > 1 && OH * OW < CONV_BATCH_COLS_P);
	const int64_t dims[9] = {N, C, H, W, O, KH, KW, OH, OW};
	bool direct = mask[1] && n->n->n_out > 1 &&
		      bw_weight_direct_ok(c, n, cv, dims, acc);
	bool wone = mask[1] && n->n->n_out > 1 && small && !direct &&
		    (G > 1 || N * O * CKK >= CONV_BW_ONE_MIN);
	lt_t *go2 = NULL; /* [O, N·OHW] */
	if (wone || (mask[0] && small)) {
		rc = go_cols(n, go3, &go2);
		if (rc != 0)
			return rc;
	}
	if (direct) {
		lt_t *gw; /* [O, C/G, KH, KW] */
		rc = bw_weight_direct(n, cv, x, gb, dims, acc, &gw);
		if (rc == 0 && cv->nd == 1)
			gw = lt_squeeze_dim(c, gw, 2);
		if (rc == 0)
			rc = gw ? lset(n, 1, gw) : -ENOMEM;
		if (rc != 0)
			return rc;
	} else if (mask[1] && n->n->n_out > 1) {
		lt_t *gw; /* [O, CKK] */
		if (wone)
			rc = bw_weight_one(n, cv, x, go2, N, KH, KW, OW, acc,
					   &gw);
		else
			rc = bw_weight_per_image(n, cv, x, go3, KH, KW, OW, acc,
						 &gw);
		if (rc != 0)
			return rc;
		kiln_dim_t w4[4] = {dim_const(O), dim_const(Cg), dim_const(KH),
				    dim_const(KW)};
		gw = lt_reshape(c, gw, 4, w4);
		if (gw == NULL)
			return -ENOMEM;
		if (cv->nd == 1)
			gw = lt_squeeze_dim(c, gw, 2);
		rc = lset(n, 1, gw);
		if (rc != 0)
			return rc;
	}
	if (mask[0]) {
		lt_t *wb;
		rc = acc_buf(n, w, acc, false, &wb);
		if (rc != 0)
			return rc;
		kiln_dim_t w2[2] = {dim_const(O), dim_const(CKKg)};
		lt_t *wv = lt_reshape(c, wb, 2, w2);
		const uint32_t tr[2] = {1, 0};
		lt_t *wt = wv ? lt_permute(c, wv, tr) : NULL; /* [CKKg, O] */
		if (wt == NULL)
			return -ENOMEM;
		lt_t *gcol; /* [N, CKK, OHW] */
		if (G > 1 || small) {
			/* g2 [CKK, N·OHW] = Wᵀ @ go2, read as [N, CKK, OHW]:
			 * one product of N·OHW columns packs Wᵀ once
			 * (ConvNeXt-nano's 640 -> 2560 at 4², batch 8: 8
			 * products of 16 columns took 5.5 ms); with groups,
			 * per group g: g2[g] [Cg·KH·KW, N·OHW] = W[g]ᵀ
			 * (Cg·KH·KW x Og) @ go2[g] (Og x N·OHW), the groups'
			 * rows stacked */
			lt_t *g2;
			if (G > 1) {
				kiln_dim_t wg[3] = {dim_const(G),
						    dim_const(O / G),
						    dim_const(CKKg)};
				kiln_dim_t gg[3] = {dim_const(G),
						    dim_const(O / G),
						    dim_const(N * OH * OW)};
				const uint32_t t3[3] = {0, 2, 1};
				lt_t *w3 = lt_reshape(c, wb, 3, wg);
				lt_t *wt3 = w3 ? lt_permute(c, w3, t3) : NULL;
				lt_t *g3 = lt_reshape(c, go2, 3, gg);
				if (wt3 == NULL || g3 == NULL)
					return -ENOMEM;
				rc = lgemm(n, wt3, g3, acc, &g2);
			} else {
				rc = lgemm(n, wt, go2, acc, &g2);
			}
			if (rc != 0)
				return rc;
			kiln_dim_t c3[3] = {dim_const(CKK), dim_const(N),
					    dim_const(OH * OW)};
			const uint32_t t3[3] = {1, 0, 2};
			lt_t *g3 = lt_reshape(c, g2, 3, c3);
			gcol = g3 ? lt_permute(c, g3, t3) : NULL;
			if (gcol == NULL)
				return -ENOMEM;
		} else {
			kiln_dim_t e3[3] = {dim_const(N), dim_const(CKK),
					    dim_const(O)};
			lt_t *wt3 = lt_expand(c, wt, 3, e3);
			if (wt3 == NULL)
				return -ENOMEM;
			if (!wt3->is_buf) {
				rc =
				    lt_realize(c, wt3, (int32_t)n->index, &wt3);
				if (rc != 0)
					return rc;
			}
			rc = lgemm(n, wt3, go3, acc, &gcol);
			if (rc != 0)
				return rc;
		}
		if ((cv->s[0] > 1 || cv->s[1] > 1) && H % cv->s[0] == 0 &&
		    W % cv->s[1] == 0) {
			const int64_t dims[9] = {N, C, H, W, O, KH, KW, OH, OW};
			return col2im_phases(n, cv, gcol, dims, acc);
		}
		/* col2im over [N, C, 1, KH, KW, H, W], reduce (1, KH, KW) */
		kiln_dim_t fs[7] = {dim_const(N),  dim_const(C),  dim_const(1),
				    dim_const(KH), dim_const(KW), dim_const(H),
				    dim_const(W)};
		const kiln_expr_t *oh, *ow;
		const sx_t *ok = bw_taps(c, cv, OH, OW, &oh, &ow);
		const kiln_expr_t *ck =
		    ix_add(c,
			   ix_add(c, ix_mul(c, IV(1), IC(KH * KW)),
				  ix_mul(c, IV(3), IC(KW))),
			   IV(4));
		const kiln_expr_t *gi[3] = {
		    IV(0), ck, ix_add(c, ix_mul(c, oh, IC(OW)), ow)};
		const sx_t *g = sx_guard(c, lt_at(c, gcol, gi), ok);
		const sx_t *body = sx_where(c, ok, g, sxf(c, 0, acc));
		rc = sum7_out(n, acc, fs, body,
			      (1u << 2) | (1u << 3) | (1u << 4), cv->nd, 0);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* The backward of a 1x1, stride-1, unpadded convolution (groups == 1)
 * over a channels-last input x whose grad_input the graph declares
 * channels-last (ConvNeXt's pointwise convolutions, a model run
 * channels-last): with grad_output gO made channels-last first where it is
 * not, [N·H·W, O] row-major,
 *   grad_input [N·H·W, C] = gO @ W, channels-last as declared;
 *   grad_weight [O, C] = gOᵀ @ x [N·H·W, C], one product with K = N·H·W.
 * *gop becomes the channels-last gO, which grad_bias then sums with the
 * channels as vectors. The NCHW form (conv_bw_gemm) transposed gO and
 * wrote grad_input NCHW, which the LayerNorm2d backward after it read
 * across its channels (a gather a vector). */
static int conv_bw_1x1_nhwc(lnode_t *n, lt_t *x, lt_t *w, lt_t **gop,
			    const bool *mask, kiln_dtype_t acc)
{
	cctx_t *c = n->c;
	int64_t N = x->sizes[0].c, C = x->sizes[1].c, H = x->sizes[2].c,
		W = x->sizes[3].c, O = w->sizes[0].c;
	const uint32_t tr[2] = {1, 0};
	lt_t *go2, *xb;
	int rc = nhwc_rows(n, *gop, acc, gop, &go2); /* [N·H·W, O] */
	if (rc != 0)
		return rc;
	if (mask[0]) {
		lt_t *wb, *gi2;
		rc = weight_2d(n, w, O, C, acc, &wb);
		if (rc == 0)
			rc = lgemm(n, go2, wb, acc, &gi2);
		if (rc != 0)
			return rc;
		rc = lset(n, 0, rows_nchw(c, gi2, N, H, W, C));
		if (rc != 0)
			return rc;
	}
	if (mask[1] && n->n->n_out > 1) {
		rc = nhwc_rows(n, x, acc, NULL, &xb); /* [N·H·W, C] */
		if (rc != 0)
			return rc;
		lt_t *gt = lt_permute(c, go2, tr), *gw;
		if (gt == NULL)
			return -ENOMEM;
		rc = lgemm(n, gt, xb, acc, &gw); /* [O, C] */
		if (rc != 0)
			return rc;
		kiln_dim_t w4[4] = {dim_const(O), dim_const(C), dim_const(1),
				    dim_const(1)};
		rc = lset(n, 1, lt_reshape(c, gw, 4, w4));
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* A depthwise convolution's weight gradient (Cg == Og == 1) whose input x
 * is channels-last (unit stride along C, as ConvNeXt's blocks leave it):
 * the direct form below runs along OW, where such an x is C elements apart
 * (a gather a vector). This one sums over [KH, KW, N, OH, OW, O] with the
 * channels last and not reduced, so that the row kernel runs them as
 * vectors (blocks of 16 channels): x and grad_output (made channels-last
 * first where it is not) are both read contiguously. The sum over (N, OH,
 * OW) of each weight runs in order, one channel a lane. */
static int bw_weight_depthwise_cl(lnode_t *n, const conv_t *cv, lt_t *x,
				  lt_t *go, int64_t O, int64_t KH, int64_t KW,
				  int64_t N, int64_t OH, int64_t OW,
				  kiln_dtype_t acc)
{
	cctx_t *c = n->c;
	if (!chan_unit(go)) {
		/* [N, O, OH, OW] over a channels-last buffer */
		int rc = lt_realize_nhwc(c, go, (int32_t)n->index, &go);
		if (rc != 0)
			return rc;
	}
	/* vars: 0 kh, 1 kw, 2 n, 3 oh, 4 ow, 5 o (the channels last: not a
	 * reduced dim, so the row kernel vectorizes them) */
	kiln_dim_t fs[6] = {dim_const(KH), dim_const(KW), dim_const(N),
			    dim_const(OH), dim_const(OW), dim_const(O)};
	const kiln_expr_t *ih = win_pos(c, cv, 0, 3, 0);
	const kiln_expr_t *iw = win_pos(c, cv, 1, 4, 1);
	const kiln_expr_t *gi[4] = {IV(2), IV(5), IV(3), IV(4)};
	const sx_t *body =
	    sx_bin(c, OP_MUL, sx_cast(c, lt_at(c, go, gi), acc),
		   sx_cast(c, xin(c, x, IV(2), IV(5), ih, iw), acc));
	lt_t *full = lt_fn(c, acc, 6, fs, body);
	if (full == NULL)
		return -ENOMEM;
	lt_t *r; /* [KH, KW, O] */
	int rc = lred(n, full, (1u << 2) | (1u << 3) | (1u << 4), false,
		      RED_SUM, acc, &r);
	if (rc != 0)
		return rc;
	static const uint32_t okk[3] = {2, 0, 1};
	lt_t *gw = lt_permute(c, r, okk);
	gw = gw ? lt_unsqueeze(c, gw, 1) : NULL; /* [O, 1, KH, KW] */
	if (gw == NULL)
		return -ENOMEM;
	if (cv->nd == 1)
		gw = lt_squeeze_dim(c, gw, 2);
	return gw ? lset(n, 1, gw) : -ENOMEM;
}

/* A depthwise convolution's input gradient (Cg == Og == 1) channels-last,
 * where the direct form along W is not taken in the forward (rows that
 * end in scalar lanes, or more than 64 taps): a sum (dw_cl_sum) over [N,
 * H, W, KH*, KW*, C] of the taps that hit each input position, the
 * channels last and not reduced, so that the row kernel runs them as
 * vectors; grad_output is made channels-last first, in channel blocks
 * where the sum takes them (gob: the copy, which the weight gradient
 * shares); the result is read as [N, C, H, W] through a view. */
static int bw_input_depthwise_cl(lnode_t *n, const conv_t *cv, lt_t *go,
				 lt_t *w, const int64_t *dims, kiln_dtype_t acc,
				 lt_t **gob)
{
	cctx_t *c = n->c;
	int64_t H = dims[2], W = dims[3], KH = dims[5], KW = dims[6],
		OH = dims[7], OW = dims[8];
	static const uint32_t vk[4] = {4, 5, 2, 3};
	const kiln_expr_t *oh, *ow;
	const sx_t *ok = bw_taps_at(c, cv, OH, OW, vk, &oh, &ow);
	lt_t *gx;
	int rc = dw_cl_sum(n, go, w, acc, H, W, KH, KW, oh, ow, ok, gob, &gx);
	if (rc != 0)
		return rc;
	if (cv->nd == 1)
		gx = lt_squeeze_dim(c, gx, 2);
	return gx ? lset(n, 0, gx) : -ENOMEM;
}

/* A depthwise convolution's weight gradient where its channels come in
 * blocks (dw_chan_block: 7x7 over 768 channels): a sum over [OB, KH, KW,
 * N*, OH*, OW*, CB] of grad_output and x copied to blocks (dw_blocked;
 * grad_output's copy is the input gradient's, gob), each unit a tap of
 * one block, its CB channels the vectors. The direct form runs along OW,
 * whose rows of 18 end in scalar lanes at 18² (ConvMixer-768/32: 0.80 ->
 * 0.2 ms a layer). */
static int bw_weight_depthwise_blocked(lnode_t *n, const conv_t *cv, lt_t *x,
				       lt_t *go, const int64_t *dims,
				       int64_t CB, kiln_dtype_t acc, lt_t **gob)
{
	cctx_t *c = n->c;
	int64_t N = dims[0], H = dims[2], W = dims[3], O = dims[4],
		KH = dims[5], KW = dims[6], OH = dims[7], OW = dims[8],
		OB = O / CB;
	int rc;
	lt_t *xb;
	if (*gob == NULL) {
		rc = dw_blocked(n, go, CB, gob);
		if (rc != 0)
			return rc;
	}
	rc = dw_blocked(n, x, CB, &xb);
	if (rc != 0)
		return rc;
	/* vars: 0 ob, 1 kh, 2 kw, 3 n, 4 oh, 5 ow, 6 cb */
	const kiln_dim_t fs[7] = {dim_const(OB), dim_const(KH), dim_const(KW),
				  dim_const(N),	 dim_const(OH), dim_const(OW),
				  dim_const(CB)};
	const kiln_expr_t *pos[2] = {win_pos(c, cv, 0, 4, 1),
				     win_pos(c, cv, 1, 5, 2)};
	const sx_t *ok =
	    in_image(c, pos[0], pos[1], dim_const(H), dim_const(W));
	const kiln_expr_t *gi[5] = {IV(0), IV(3), IV(4), IV(5), IV(6)};
	const kiln_expr_t *xi[5] = {IV(0), IV(3), pos[0], pos[1], IV(6)};
	const sx_t *xv = sx_guard(c, sx_cast(c, lt_at(c, xb, xi), acc), ok);
	const sx_t *body = sx_where(
	    c, ok, sx_bin(c, OP_MUL, sx_cast(c, lt_at(c, *gob, gi), acc), xv),
	    sxf(c, 0, acc));
	lt_t *full = lt_fn(c, acc, 7, fs, body), *r;
	if (full == NULL)
		return -ENOMEM;
	rc = lred(n, full, (1u << 3) | (1u << 4) | (1u << 5), false, RED_SUM,
		  acc, &r);
	if (rc != 0)
		return rc;
	/* r [OB, KH, KW, CB] -> [O, 1, KH, KW] */
	static const uint32_t obkk[4] = {0, 3, 1, 2};
	const kiln_dim_t w4[4] = {dim_const(O), dim_const(1), dim_const(KH),
				  dim_const(KW)};
	lt_t *gw = lt_permute(c, r, obkk);
	gw = gw ? lt_reshape(c, gw, 4, w4) : NULL;
	if (gw != NULL && cv->nd == 1)
		gw = lt_squeeze_dim(c, gw, 2);
	return gw ? lset(n, 1, gw) : -ENOMEM;
}

struct clvote {
	/* loads contiguous along C (var 1) and 16 or more apart along W
	 * (var 3); loads contiguous along W. Loads that do not move with W
	 * (a per-channel parameter) do not count. */
	int64_t c, w;
};

static void clvote_load(void *arg, const sx_t *ld)
{
	struct clvote *v = arg;
	int64_t k = 0, kw = 0;
	if (ld->b != NULL || !ix_coef(ld->idx, 3, &kw))
		return;
	if (kw == 1)
		v->w++;
	else if ((kw >= 16 || kw <= -16) && ix_coef(ld->idx, 1, &k) && k == 1)
		v->c++;
}

/* Whether an [N, C, H, W] value reads channels-last data at least as
 * often as data contiguous along W (a channels-last grad_output, or one
 * computed from channels-last activations: ConvNeXt's GELU backward over
 * its saved inputs). A sum over (N, H, W) of it then runs with the
 * channels as vectors: a channels-last read is a contiguous load there,
 * where along W it was a gather whose cache lines every channel's unit
 * fetched again; a read along W becomes a gather whose lines stay in L1
 * while W advances. */
static bool reads_channels_last(const lt_t *t)
{
	if (t->rank != 4)
		return false;
	if (t->is_buf)
		return chan_unit(t) && !dim_is(t->strides[3], 1);
	struct clvote v = {0, 0};
	sx_each_load(t->body, clvote_load, &v);
	return v.c > 0 && v.c >= v.w;
}

/* The sum of grad_output over all but its channels: grad_bias. */
static int conv_grad_bias(lnode_t *n, lt_t *go, kiln_dtype_t acc, lt_t **gb)
{
	cctx_t *c = n->c;
	lt_t *g = go->dtype == acc ? go
				   : lt_fn(c, acc, go->rank, go->sizes,
					   sx_cast(c, lt_body(c, go), acc));
	if (g == NULL)
		return -ENOMEM;
	if (go->rank == 4 && reads_channels_last(g)) {
		/* over [N, H, W, C]: the channels are the row kernel's
		 * vectors, the reads contiguous along them */
		static const uint32_t nhwc[4] = {0, 2, 3, 1};
		lt_t *p = lt_permute(c, g, nhwc);
		return p ? lred(n, p, 7u, false, RED_SUM, acc, gb) : -ENOMEM;
	}
	uint32_t rmask = 1u;
	for (uint32_t k = 2; k < go->rank; k++)
		rmask |= 1u << k;
	return lred(n, g, rmask, false, RED_SUM, acc, gb);
}

/* The backward of the convolution of x0 by w0 given grad_output go0: the
 * gradients mask asks for, as outputs 0-2 of n (or in capture). */
/* Whether grad_input of a convolution (2-d form, cv after conv_as2d) is
 * taken as a forward convolution (bw_input_forward): groups == 1, stride
 * 1, more than one tap, a padding of at most the dilated kernel's reach,
 * f32 with the GEMM template (the forward's implicit and tiled forms). */
static bool bw_input_forward_ok(cctx_t *c, const lnode_t *n, const conv_t *cv,
				const lt_t *go, int64_t G, const int64_t *dims,
				kiln_dtype_t acc)
{
	int64_t N = dims[0], C = dims[1], H = dims[2], W = dims[3], O = dims[4],
		KH = dims[5], KW = dims[6], OH = dims[7], OW = dims[8];
	/* (a transposed convolution's output_padding leaves the input
	 * positions past the last window: they are not this form's) */
	if (!(G == 1 && KH * KW > 1 && cv->s[0] == 1 && cv->s[1] == 1 &&
	      cv->p[0] <= cv->d[0] * (KH - 1) &&
	      cv->p[1] <= cv->d[1] * (KW - 1) &&
	      H == OH + cv->d[0] * (KH - 1) - 2 * cv->p[0] &&
	      W == OW + cv->d[1] * (KW - 1) - 2 * cv->p[1] && c->blas != NULL &&
	      conv_template(c, n, acc)))
		return false;
	/* the flipped weight is a gather of O·C·KH·KW elements: it pays
	 * where the positions outnumber the weight's rows (ResNet's 512 ->
	 * 512 at 7², batch 8: the product and col2im 10.2 ms, the flip 2.5
	 * and the template 10); and the forward must take the template (the
	 * whole-image im2col and BLAS it would take otherwise is the
	 * backward's product over again: [2, 64, 16²] -> 128 0.41 -> 0.47
	 * ms) */
	if (N * OH * OW < 2 * O)
		return false;
	const int64_t fd[9] = {N, O, OH, OW, C, KH, KW, H, W};
	bool batched = N > 1 && H * W < CONV_BATCH_COLS_P;
	return !direct_ok(1, O, KH, KW, N * C * H * W, W, cv) &&
	       (conv_implicit_ok(c, n, go, acc, fd, 1) ||
		(!batched &&
		 conv_use_tiled(c, n, O * KH * KW, H, W, N, acc, false)));
}

static int tc_capture(lnode_t *n, bool fwd, lt_t *a, lt_t *x, lt_t *w,
		      const conv_t *fw, const bool *mask, int k, lt_t **out);

/* grad_input of a stride-1 convolution (where bw_input_forward_ok) as the
 * forward convolution of grad_output by the weight flipped along its taps
 * and with its channel dims swapped, W'[c, o, kh, kw] = W[o, c, KH-1-kh,
 * KW-1-kw], padded by d·(K-1) - p: gI[n, c, h] = sum_{o, k} gO[n, o, h + p
 * - k·d]·W[o, c, k], and with k = K-1-k', h + p - (K-1-k')·d = h - (d·(K-1)
 * - p) + k'·d. So conv_forward's forms take it (the implicit GEMM template
 * packing from gO, the tiled one), where the product Wᵀ @ gO wrote KH·KW
 * times gI's size and the col2im read it back: U-Net's 3x3 32 -> 16 at
 * 64², batch 2, 0.84 + 0.11 ms -> 0.38-0.45; 64 -> 32 at 32² 0.58 + 0.05
 * -> 0.38; ResNet's 64 -> 64 at 56², batch 8, 11.5-12.5 + 2.0 -> 9.5-10.5
 * (kilnc --profile, 2 threads, a Zen 4). go and w are in the 2-d form. */
static int bw_input_forward(lnode_t *n, lt_t *go, lt_t *w, const conv_t *cv,
			    lt_t **gi)
{
	cctx_t *c = n->c;
	int64_t O = w->sizes[0].c, C = w->sizes[1].c, KH = w->sizes[2].c,
		KW = w->sizes[3].c;
	/* written as [C, O·KH·KW], rows of whole vectors: as [C, O, KH, KW]
	 * the rows were KW long (512 -> 512 3x3: 4 ms) */
	int64_t KK = KH * KW;
	kiln_dim_t w2[2] = {dim_const(O), dim_const(C * KK)};
	lt_t *wv = lt_reshape(c, w, 2, w2);
	if (wv == NULL)
		return -ENOMEM;
	kiln_dim_t ws[2] = {dim_const(C), dim_const(O * KK)};
	const kiln_expr_t *wi[2] = {
	    ix_floordiv(c, IV(1), IC(KK)),
	    ix_add(c, ix_mul(c, IV(0), IC(KK)),
		   ix_sub(c, IC(KK - 1), ix_mod(c, IV(1), IC(KK))))};
	lt_t *wf = lt_fn(c, w->dtype, 2, ws, lt_at(c, wv, wi));
	if (wf == NULL)
		return -ENOMEM;
	int rc = lt_realize(c, wf, (int32_t)n->index, &wf);
	if (rc != 0)
		return rc;
	kiln_dim_t w4[4] = {dim_const(C), dim_const(O), dim_const(KH),
			    dim_const(KW)};
	wf = lt_reshape(c, wf, 4, w4);
	if (wf == NULL)
		return -ENOMEM;
	conv_t fw = *cv;
	fw.nd = 2; /* already in the 2-d form: conv_forward leaves it */
	fw.groups = 1;
	fw.transposed = false;
	for (int j = 0; j < 2; j++) {
		fw.p[j] = cv->d[j] * ((j == 0 ? KH : KW) - 1) - cv->p[j];
		fw.op[j] = 0;
	}
	return tc_capture(n, true, go, NULL, wf, &fw, NULL, 0, gi);
}

static int conv_backward(lnode_t *n, lt_t *go0, lt_t *x0, lt_t *w0, conv_t cv,
			 const bool *want)
{
	cctx_t *c = n->c;
	int rc;
	bool mask[3] = {want[0], want[1], want[2]};
	lt_t *x = as2d(c, x0), *w = as2d(c, w0), *go = as2d(c, go0);
	conv_as2d(&cv);
	for (int k = 0; k < 4; k++)
		if (x->sizes[k].e || w->sizes[k].e || go->sizes[k].e)
			return lerr(n, KILN_EUNSUPOP,
				    "symbolic convolution shapes are not "
				    "lowered");
	int64_t N = x->sizes[0].c, C = x->sizes[1].c, H = x->sizes[2].c,
		W = x->sizes[3].c;
	int64_t O = w->sizes[0].c, Cg = w->sizes[1].c, KH = w->sizes[2].c,
		KW = w->sizes[3].c, G = cv.groups;
	int64_t OH = go->sizes[2].c, OW = go->sizes[3].c;
	if (C != Cg * G || O % G != 0 || go->sizes[1].c != O ||
	    go->sizes[0].c != N)
		return lerr(
		    n, KILN_EINVGRAPH,
		    "grad_output does not have the convolution's output shape");
	int64_t Og = O / G;
	kiln_dtype_t odt = lout(n, 1) ? lout(n, 1)->dtype : x->dtype;
	kiln_dtype_t acc = compute_dtype(odt);
	const int64_t fdims[9] = {N, C, H, W, O, KH, KW, OH, OW};
	if (mask[0] && bw_input_forward_ok(c, n, &cv, go, G, fdims, acc)) {
		lt_t *gi;
		rc = bw_input_forward(n, go, w, &cv, &gi);
		if (rc != 0)
			return rc;
		if (cv.nd == 1)
			gi = lt_squeeze_dim(c, gi, 2);
		rc = lset(n, 0, gi);
		if (rc != 0)
			return rc;
		mask[0] = false;
	}
	bool one = G == 1 && cv.nd == 2 && KH == 1 && KW == 1 && cv.s[0] == 1 &&
		   cv.s[1] == 1 && cv.p[0] == 0 && cv.p[1] == 0;
	if (one && c->blas != NULL &&
	    (acc == KILN_DT_F32 || acc == KILN_DT_F64) && chan_unit(x) &&
	    lout(n, 0) != NULL && decl_nhwc(lout(n, 0))) {
		/* channels-last; grad_bias below, over the channels-last gO */
		rc = conv_bw_1x1_nhwc(n, x, w, &go, mask, acc);
		if (rc != 0)
			return rc;
		mask[0] = false;
		mask[1] = false;
	} else if ((G == 1 ||
		    (Og > 1 &&
		     !direct_ok(G, Cg, KH, KW, N * O * OH * OW, OW, &cv))) &&
		   c->blas != NULL &&
		   (acc == KILN_DT_F32 || acc == KILN_DT_F64)) {
		/* grad_input and grad_weight through BLAS (a product per
		 * group where the forward took one, but for depthwise ones:
		 * 3x3 in 16 groups of 8 over [8, 128, 14²] 4.4 -> 1.0 ms, of
		 * 4 over [8, 64, 14²] 1.06 -> 0.49, of 2 into 64 1.06 ->
		 * 0.96, but 7x7 depthwise over [8, 384, 7²] 2.9 -> 8.1);
		 * grad_bias below */
		rc = conv_bw_gemm(n, &cv, x, w, go, mask, acc);
		if (rc != 0)
			return rc;
		mask[0] = false;
		mask[1] = false;
	}
	/* depthwise where the forward is not direct along OW and grad_output
	 * is channels-last (a channels-last model's), or the sums take
	 * channel blocks (dw_chan_block): grad_input channels-last too (7x7
	 * over [8, 384, 7²]: 1.42 -> 0.45 ms the backward), and where x is
	 * contiguous and the channels come in blocks the weight gradient as
	 * well (ConvMixer-768/32's backward, 7x7 at 18² over 768 channels:
	 * 117 -> 96 ms; the two of a layer 1.37 -> 0.52 ms). Where grad_output
	 * is contiguous and the channels fit one block, copying it and x
	 * channels-last cost what the sums saved (ConvMixer's backward before
	 * the blocks: 118 against 127 ms) */
	int64_t dw_cb =
	    G > 1 && Cg == 1 && Og == 1
		? dw_chan_block(O, KH * KW, (int64_t)kiln_dtype_size(go->dtype),
				c->vec_width)
		: O;
	bool dw_cl = G > 1 && Cg == 1 && Og == 1 && O >= 16 &&
		     O % c->vec_width == 0 && (chan_unit(go) || dw_cb < O) &&
		     !direct_ok(G, Cg, KH, KW, N * O * OH * OW, OW, &cv);
	const int64_t dims[9] = {N, C, H, W, O, KH, KW, OH, OW};
	lt_t *gob = NULL; /* grad_output in channel blocks, once */
	if (mask[0] && dw_cl) {
		rc = bw_input_depthwise_cl(n, &cv, go, w, dims, acc, &gob);
		if (rc != 0)
			return rc;
		mask[0] = false;
	}
	if (mask[1] && n->n->n_out > 1 && dw_cl && dw_cb < O && !chan_unit(x)) {
		rc = bw_weight_depthwise_blocked(n, &cv, x, go, dims, dw_cb,
						 acc, &gob);
		if (rc != 0)
			return rc;
		mask[1] = false;
	}
	/* the direct forms read each element of grad_output Cg·KH·KW times
	 * and each of the input Og·KH·KW times: a computed one (relu6's
	 * backward mask, a forward activation AOTAutograd recomputes) is
	 * written once first, as in the forward */
	if ((mask[0] || mask[1]) && !go->is_buf && Cg * KH * KW > 1) {
		rc = lt_realize(c, go, (int32_t)n->index, &go);
		if (rc != 0)
			return rc;
	}
	if (mask[1] && n->n->n_out > 1 && !x->is_buf && Og * KH * KW > 1) {
		rc = lt_realize(c, x, (int32_t)n->index, &x);
		if (rc != 0)
			return rc;
	}
	if (mask[0]) {
		/* gI over [N, C, Og, KH, KW, H, W], reduce (Og, KH, KW) */
		kiln_dim_t fs[7] = {dim_const(N),  dim_const(C),  dim_const(Og),
				    dim_const(KH), dim_const(KW), dim_const(H),
				    dim_const(W)};
		const kiln_expr_t *o = ix_add(
		    c, ix_mul(c, ix_floordiv(c, IV(1), IC(Cg)), IC(Og)), IV(2));
		const kiln_expr_t *oh, *ow;
		const sx_t *ok = bw_taps(c, &cv, OH, OW, &oh, &ow);
		const kiln_expr_t *gi[4] = {IV(0), o, oh, ow};
		const kiln_expr_t *wi[4] = {o, ix_mod(c, IV(1), IC(Cg)), IV(3),
					    IV(4)};
		const sx_t *g =
		    sx_guard(c, sx_cast(c, lt_at(c, go, gi), acc), ok);
		const sx_t *body = sx_where(
		    c, ok,
		    sx_bin(c, OP_MUL, g, sx_cast(c, lt_at(c, w, wi), acc)),
		    sxf(c, 0, acc));
		rc = sum7_out(n, acc, fs, body,
			      (1u << 2) | (1u << 3) | (1u << 4), cv.nd, 0);
		if (rc != 0)
			return rc;
	}
	if (mask[1] && n->n->n_out > 1 && Cg == 1 && Og == 1 && KH * KW > 1 &&
	    O >= 16 && chan_unit(x)) {
		rc = bw_weight_depthwise_cl(n, &cv, x, go, O, KH, KW, N, OH, OW,
					    acc);
		if (rc != 0)
			return rc;
	} else if (mask[1] && n->n->n_out > 1) {
		/* gW over [O, Cg, KH, KW, N, OH, OW], reduce (N, OH, OW) */
		kiln_dim_t fs[7] = {dim_const(O),  dim_const(Cg), dim_const(KH),
				    dim_const(KW), dim_const(N),  dim_const(OH),
				    dim_const(OW)};
		const kiln_expr_t *ch = ix_add(
		    c, ix_mul(c, ix_floordiv(c, IV(0), IC(Og)), IC(Cg)), IV(1));
		const kiln_expr_t *ih = win_pos(c, &cv, 0, 5, 2);
		const kiln_expr_t *iw = win_pos(c, &cv, 1, 6, 3);
		const kiln_expr_t *gi[4] = {IV(4), IV(0), IV(5), IV(6)};
		const sx_t *body =
		    sx_bin(c, OP_MUL, sx_cast(c, lt_at(c, go, gi), acc),
			   sx_cast(c, xin(c, x, IV(4), ch, ih, iw), acc));
		rc = sum7_out(n, acc, fs, body,
			      (1u << 4) | (1u << 5) | (1u << 6), cv.nd, 1);
		if (rc != 0)
			return rc;
	}
	if (mask[2] && n->n->n_out > 2) {
		lt_t *gb;
		rc = conv_grad_bias(n, go, acc, &gb);
		if (rc == 0)
			rc = lset(n, 2, gb);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static int conv_transposed_bw(lnode_t *n, lt_t *go0, lt_t *x0, lt_t *w0,
			      const conv_t *cv, const bool *mask);
static int conv3d_bw(lnode_t *n, lt_t *go, lt_t *x, lt_t *w, const conv_t *cv,
		     const bool *mask);

int low_convolution_backward(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *go0, *x0, *w0;
	int rc = ltensor(n, 0, "grad_output", &go0);
	if (rc == 0)
		rc = ltensor(n, 1, "input", &x0);
	if (rc == 0)
		rc = ltensor(n, 2, "weight", &w0);
	if (rc != 0)
		return rc;
	if (x0->rank < 3 || x0->rank > 5 || w0->rank != x0->rank ||
	    go0->rank != x0->rank)
		return lerr(n, KILN_EUNSUPOP,
			    "only 1-d, 2-d and 3-d convolutions are lowered");
	conv_t cv;
	rc = conv_params(n, 4, x0->rank - 2, &cv);
	if (rc != 0)
		return rc;
	const kiln_arg_t *om = larg(n, 10, "output_mask");
	bool mask[3] = {true, true, true};
	if (om != NULL && om->kind == KILN_ARG_LIST && om->n == 3)
		for (uint32_t i = 0; i < 3; i++)
			mask[i] = om->u.list[i].kind == KILN_ARG_BOOL &&
				  om->u.list[i].u.b;
	if (cv.transposed)
		return conv_transposed_bw(n, go0, x0, w0, &cv, mask);
	return cv.nd == 3 ? conv3d_bw(n, go0, x0, w0, &cv, mask)
			  : conv_backward(n, go0, x0, w0, cv, mask);
}

/* A transposed convolution's checks and output sizes: x0 [N, Ci, (H,) W]
 * and w0 [Ci, Co/G, (KH,) KW] give ys [N, Co, (OH,) OW], OH = (H - 1)·sh -
 * 2·ph + dh·(KH - 1) + output_padding + 1. */
static int tconv_shape(lnode_t *n, const lt_t *x0, const lt_t *w0,
		       const conv_t *cv, kiln_dim_t *ys)
{
	for (uint32_t k = 0; k < x0->rank; k++)
		if (x0->sizes[k].e != NULL || w0->sizes[k].e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "symbolic convolution shapes are not "
				    "lowered");
	int64_t Ci = x0->sizes[1].c, G = cv->groups;
	if (w0->sizes[0].c != Ci || Ci % G != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "transposed: weight's dim 0 must equal the input "
			    "channels (weight [%lld, %lld, ..], %lld channels "
			    "in %lld groups)",
			    (long long)w0->sizes[0].c,
			    (long long)w0->sizes[1].c, (long long)Ci,
			    (long long)G);
	ys[0] = x0->sizes[0];
	ys[1] = dim_const(w0->sizes[1].c * G);
	for (uint32_t j = 0; j < cv->nd; j++) {
		int64_t s = cv->s[j], d = cv->d[j], op = cv->op[j];
		if (op >= s && op >= d)
			return lerr(n, KILN_EINVGRAPH,
				    "output_padding %lld must be smaller than "
				    "the stride %lld or the dilation %lld",
				    (long long)op, (long long)s, (long long)d);
		int64_t o = (x0->sizes[2 + j].c - 1) * s - 2 * cv->p[j] +
			    d * (w0->sizes[2 + j].c - 1) + op + 1;
		if (o <= 0)
			return lerr(n, KILN_EINVGRAPH,
				    "transposed: padding %lld leaves no output",
				    (long long)cv->p[j]);
		ys[2 + j] = dim_const(o);
	}
	return 0;
}

/* The convolution a transposed one of parameters cv is the input gradient
 * of (*fw: cv, not transposed, without the output_padding, which only
 * sizes the output), and the forms of its rank that it runs (conv3d's
 * for 3-d ones: the depth taps folded into the channels). A 3-d one whose
 * output_padding is its stride or more (torch allows it below the
 * dilation) is not lowered: those positions are past every window of the
 * folded depth. */
static int tconv_fw(lnode_t *n, const conv_t *cv, conv_t *fw)
{
	for (uint32_t j = 0; cv->nd == 3 && j < 3; j++)
		if (cv->op[j] >= cv->s[j])
			return lerr(n, KILN_EUNSUPOP,
				    "transposed 3-d convolutions with an "
				    "output_padding of the stride or more are "
				    "not lowered");
	*fw = *cv;
	fw->transposed = false;
	memset(fw->op, 0, sizeof(fw->op));
	return 0;
}

static int tc_forward(lnode_t *n, lt_t *x, lt_t *w, const conv_t *fw)
{
	return fw->nd == 3 ? conv3d(n, x, w, NULL, fw)
			   : conv_forward(n, x, w, NULL, *fw);
}

static int tc_backward(lnode_t *n, lt_t *go, lt_t *x, lt_t *w, const conv_t *fw,
		       const bool *mask)
{
	return fw->nd == 3 ? conv3d_bw(n, go, x, w, fw, mask)
			   : conv_backward(n, go, x, w, *fw, mask);
}

/* Output k of the forms run by tc_forward (fwd) or tc_backward with
 * mask, captured: into *out. */
static int tc_capture(lnode_t *n, bool fwd, lt_t *a, lt_t *x, lt_t *w,
		      const conv_t *fw, const bool *mask, int k, lt_t **out)
{
	lt_t **saved = n->capture, *cap[3] = {NULL, NULL, NULL};
	n->capture = cap;
	int rc =
	    fwd ? tc_forward(n, a, w, fw) : tc_backward(n, a, x, w, fw, mask);
	n->capture = saved;
	if (rc == 0 && cap[k] == NULL)
		rc = lerr(n, KILN_EUNSUPOP, "no form for this shape");
	*out = cap[k];
	return rc;
}

/* A transposed convolution is the input gradient of the convolution whose
 * weight w0 is, taken with x0 as that convolution's grad_output: y[n] =
 * col2im(Wᵀ @ x[n]) in conv_backward's forms (products through BLAS, a
 * product per group, the col2im by phases where the strides divide the
 * output; the direct sum where there is no BLAS or a depthwise one), in
 * 3-d conv3d_bw's (ConvTranspose3d: a volumetric U-Net's up-convolutions),
 * then the bias. The convolution's input is a stand-in of y's sizes,
 * which grad_input alone never reads. */
static int conv_transposed(lnode_t *n, lt_t *x0, lt_t *w0, lt_t *b,
			   const conv_t *cv)
{
	cctx_t *c = n->c;
	kiln_dim_t ys[5];
	conv_t fw;
	int rc = tconv_shape(n, x0, w0, cv, ys);
	if (rc == 0)
		rc = tconv_fw(n, cv, &fw);
	if (rc != 0)
		return rc;
	if (b != NULL && (b->rank != 1 || !dim_eq(b->sizes[0], ys[1])))
		return lerr(n, KILN_EINVGRAPH,
			    "bias must have one element per output channel "
			    "(%lld)",
			    (long long)ys[1].c);
	lt_t *shape = lt_fn(c, x0->dtype, x0->rank, ys, sxf(c, 0, x0->dtype));
	if (shape == NULL)
		return -ENOMEM;
	static const bool mask[3] = {true, false, false};
	lt_t *y;
	rc = tc_capture(n, false, x0, shape, w0, &fw, mask, 0, &y);
	if (rc != 0)
		return rc;
	if (b != NULL) {
		const kiln_expr_t *bi[1] = {IV(1)};
		y = lt_fn(c, y->dtype, y->rank, y->sizes,
			  sx_bin(c, OP_ADD, lt_body(c, y),
				 sx_cast(c, lt_at(c, b, bi), y->dtype)));
	}
	return lset(n, 0, y);
}

/* The backward of y = a transposed convolution of x0 by w0: grad_input is
 * the convolution of grad_output by w0 (w0 [Ci, Co/G, ..] is that
 * convolution's weight: conv_forward's forms, conv3d's in 3-d),
 * grad_weight that convolution's weight gradient with grad_output as its
 * input and x0 as its grad_output (conv_backward's, conv3d_bw's),
 * grad_bias grad_output's sum. */
static int conv_transposed_bw(lnode_t *n, lt_t *go0, lt_t *x0, lt_t *w0,
			      const conv_t *cv, const bool *mask)
{
	cctx_t *c = n->c;
	kiln_dim_t ys[5];
	conv_t fw;
	int rc = tconv_shape(n, x0, w0, cv, ys);
	if (rc == 0)
		rc = tconv_fw(n, cv, &fw);
	if (rc != 0)
		return rc;
	for (uint32_t k = 0; k < go0->rank; k++)
		if (!dim_eq(go0->sizes[k], ys[k]))
			return lerr(n, KILN_EINVGRAPH,
				    "grad_output does not have the "
				    "convolution's output shape");
	if (mask[0]) {
		lt_t *gi;
		rc = tc_capture(n, true, go0, NULL, w0, &fw, NULL, 0, &gi);
		if (rc != 0)
			return rc;
		/* an output_padding of the stride or more (below the
		 * dilation) gives the convolution positions past the input:
		 * the first ones are grad_input */
		for (uint32_t k = 2; gi != NULL && k < x0->rank; k++)
			if (gi->sizes[k].c > x0->sizes[k].c)
				gi = lt_slice(c, gi, k, IC(0),
					      IC(x0->sizes[k].c), 1);
		rc = lset(n, 0, gi);
		if (rc != 0)
			return rc;
	}
	if (mask[1] && n->n->n_out > 1) {
		static const bool wmask[3] = {false, true, false};
		lt_t *gw;
		rc = tc_capture(n, false, x0, go0, w0, &fw, wmask, 1, &gw);
		if (rc == 0)
			rc = lset(n, 1, gw);
		if (rc != 0)
			return rc;
	}
	if (mask[2] && n->n->n_out > 2) {
		const kiln_value_t *v = lout(n, 2);
		kiln_dtype_t acc = compute_dtype(
		    v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype
							    : go0->dtype);
		lt_t *gb;
		rc = conv_grad_bias(n, go0, acc, &gb);
		if (rc == 0)
			rc = lset(n, 2, gb);
	}
	return rc;
}

/* ---- 3-d convolutions: 2-d ones with the depth taps in the channels ---- */

typedef struct conv3 {
	int64_t N, C, D, H, W, O, Cg, KD, KH, KW, G, OD, OH, OW;
	/* the depth taps that read the input at some output depth: kd0 ..
	 * kd0 + KDe - 1 (the others read only padding) */
	int64_t kd0, KDe;
	/* the output depths computed: od0 .. od0 + nod - 1 (a part, see
	 * conv3_parts; else all of them) */
	int64_t od0, nod;
	conv_t c2; /* the 2-d convolution over (H, W) */
} conv3_t;

/* The depth taps kd that read the input at output depth od: *lo .. *hi
 * (*lo > *hi: none). The input depth od·sd - pd + kd·dd grows with kd, so
 * they are a range. */
static void conv3_taps(const conv3_t *g, const conv_t *cv, int64_t od,
		       int64_t *lo, int64_t *hi)
{
	*lo = 0, *hi = -1;
	for (int64_t kd = 0; kd < g->KD; kd++) {
		int64_t dep = od * cv->s[0] - cv->p[0] + kd * cv->d[0];
		if (dep < 0 || dep >= g->D)
			continue;
		if (*hi < *lo)
			*lo = kd;
		*hi = kd;
	}
}

#define CONV3_MAX_PARTS 8

/* The parts a 3-d convolution is computed in: runs of output depths whose
 * taps read the same depth taps, each its own 2-d convolution with only
 * those taps in its channels. The first and last depths of a padded
 * convolution read fewer taps (R3D's 3x3x3 over 4 frames: 2, 3, 3, 2 of
 * them), and their multiply-adds with the padding are skipped, as oneDNN's
 * direct convolution does. Split only where that saves an eighth of the
 * multiply-adds, else one part: all depths by the kept taps (g itself). */
static int conv3_parts(const conv3_t *g, const conv_t *cv, conv3_t *parts)
{
	int np = 0;
	int64_t kept = 0;
	for (int64_t od = 0; od < g->OD; od++) {
		int64_t lo, hi;
		conv3_taps(g, cv, od, &lo, &hi);
		if (hi < lo)
			break; /* a depth of padding only: one part */
		kept += hi - lo + 1;
		if (np > 0 && parts[np - 1].kd0 == lo &&
		    parts[np - 1].KDe == hi - lo + 1) {
			parts[np - 1].nod++;
			continue;
		}
		if (np == CONV3_MAX_PARTS)
			break;
		conv3_t *q = &parts[np++];
		*q = *g;
		q->od0 = od, q->nod = 1, q->kd0 = lo, q->KDe = hi - lo + 1;
	}
	int64_t whole = 0;
	for (int k = 0; k < np; k++)
		whole += parts[k].nod;
	if (np > 1 && whole == g->OD && 8 * kept <= 7 * g->OD * g->KDe)
		return np;
	parts[0] = *g;
	return 1;
}

/* The geometry of a 3-d convolution of x [N, C, D, H, W] by w [O, Cg, KD,
 * KH, KW], checked. */
static int conv3_geo(lnode_t *n, const lt_t *x, const lt_t *w, const conv_t *cv,
		     conv3_t *g)
{
	for (int k = 0; k < 5; k++)
		if (x->sizes[k].e != NULL || w->sizes[k].e != NULL)
			return lerr(n, KILN_EUNSUPOP,
				    "symbolic convolution shapes are not "
				    "lowered");
	memset(g, 0, sizeof(*g));
	g->N = x->sizes[0].c, g->C = x->sizes[1].c, g->D = x->sizes[2].c;
	g->H = x->sizes[3].c, g->W = x->sizes[4].c;
	g->O = w->sizes[0].c, g->Cg = w->sizes[1].c, g->KD = w->sizes[2].c;
	g->KH = w->sizes[3].c, g->KW = w->sizes[4].c, g->G = cv->groups;
	if (g->C != g->Cg * g->G || g->O % g->G != 0)
		return lerr(n, KILN_EINVGRAPH,
			    "%lld input channels and weight [%lld, %lld, ..] "
			    "do not fit groups=%lld",
			    (long long)g->C, (long long)g->O, (long long)g->Cg,
			    (long long)g->G);
	const int64_t in[3] = {g->D, g->H, g->W}, kk[3] = {g->KD, g->KH, g->KW};
	int64_t out[3];
	for (int k = 0; k < 3; k++) {
		out[k] = (in[k] + 2 * cv->p[k] - cv->d[k] * (kk[k] - 1) - 1) /
			     cv->s[k] +
			 1;
		if (in[k] + 2 * cv->p[k] < cv->d[k] * (kk[k] - 1) + 1)
			return lerr(n, KILN_EINVGRAPH,
				    "the kernel is larger than the padded "
				    "input");
	}
	g->OD = out[0], g->OH = out[1], g->OW = out[2];
	int64_t lo = -1, hi = -1;
	for (int64_t od = 0; od < g->OD; od++) {
		int64_t l, h;
		conv3_taps(g, cv, od, &l, &h);
		if (h >= l) {
			lo = lo < 0 || l < lo ? l : lo;
			hi = h > hi ? h : hi;
		}
	}
	if (lo < 0)
		return lerr(n, KILN_EUNSUPOP,
			    "every depth tap reads padding only");
	g->kd0 = lo, g->KDe = hi - lo + 1;
	g->od0 = 0, g->nod = g->OD;
	g->c2 = *cv;
	g->c2.nd = 2;
	for (int k = 0; k < 2; k++) {
		g->c2.s[k] = cv->s[k + 1], g->c2.p[k] = cv->p[k + 1];
		g->c2.d[k] = cv->d[k + 1], g->c2.op[k] = 0;
	}
	g->c2.s[2] = g->c2.d[2] = 1, g->c2.p[2] = g->c2.op[2] = 0;
	return 0;
}

/* Whether 0 <= e < lim. */
static const sx_t *in_range(cctx_t *c, const kiln_expr_t *e, int64_t lim)
{
	const sx_t *v = sx_index(c, e);
	return sx_bin(c, OP_AND,
		      sx_bin(c, OP_GE, v, sx_consti(c, 0, KILN_DT_I64)),
		      sx_bin(c, OP_LT, v, sx_consti(c, lim, KILN_DT_I64)));
}

/* The input of the 2-d convolution that the 3-d one (or its part) is: xc
 * [N·nod, C·KDe, H, W], xc[n·nod + i, c·KDe + k, h, w] = x[n, c, od·sd -
 * pd + kd·dd, h, w] with od = od0 + i, kd = kd0 + k (0 past the depth),
 * realized: each depth tap a copy of the input. A group's channels stay
 * together (c = g·Cg + cg). */
static int conv3_fold_x(lnode_t *n, lt_t *x, const conv3_t *g, const conv_t *cv,
			lt_t **xc)
{
	cctx_t *c = n->c;
	kiln_dim_t fs[4] = {dim_const(g->N * g->nod), dim_const(g->C * g->KDe),
			    dim_const(g->H), dim_const(g->W)};
	set_var_ranges(c, 4, fs);
	const kiln_expr_t *od =
	    ix_add(c, ix_mod(c, IV(0), IC(g->nod)), IC(g->od0));
	const kiln_expr_t *kd =
	    ix_add(c, ix_mod(c, IV(1), IC(g->KDe)), IC(g->kd0));
	const kiln_expr_t *ch = ix_floordiv(c, IV(1), IC(g->KDe));
	const kiln_expr_t *dep =
	    ix_add(c, ix_sub(c, ix_mul(c, od, IC(cv->s[0])), IC(cv->p[0])),
		   ix_mul(c, kd, IC(cv->d[0])));
	const kiln_expr_t *xi[5] = {ix_floordiv(c, IV(0), IC(g->nod)), ch, dep,
				    IV(2), IV(3)};
	const sx_t *ok = in_range(c, dep, g->D);
	const sx_t *body = sx_where(c, ok, sx_guard(c, lt_at(c, x, xi), ok),
				    sxf(c, 0, x->dtype));
	set_var_ranges(c, 0, NULL);
	lt_t *t = lt_fn(c, x->dtype, 4, fs, body);
	return t ? lt_realize(c, t, (int32_t)n->index, xc) : -ENOMEM;
}

/* The weight of that 2-d convolution: w [O, Cg, KD, KH, KW] as [O,
 * Cg·KDe, KH, KW]: a view where every depth tap is kept, else the kept
 * ones copied. */
static int conv3_fold_w(lnode_t *n, lt_t *w, const conv3_t *g, lt_t **w2)
{
	cctx_t *c = n->c;
	kiln_dim_t fs[4] = {dim_const(g->O), dim_const(g->Cg * g->KDe),
			    dim_const(g->KH), dim_const(g->KW)};
	lt_t *t = w;
	if (g->KDe < g->KD) {
		/* the kept taps, written as [O, Cg, KDe·KH·KW]: rows of KW
		 * elements ([O, Cg, KDe, KH, KW]) had copied R3D's three 512
		 * -> 512 weights in 3.83-3.97 ms, its 256 -> 512 in 0.74-1.0
		 * (now 3.74-3.78 and 0.57-0.59; written as [O, Cg·KDe·KH·KW],
		 * a gather a vector, 1.5x slower) */
		kiln_dim_t r3[3] = {dim_const(g->O), dim_const(g->Cg),
				    dim_const(g->KDe * g->KH * g->KW)};
		t = lt_slice(c, w, 2, IC(g->kd0), IC(g->KDe), 1);
		t = t ? lt_reshape(c, t, 3, r3) : NULL;
		int rc = t ? lt_realize(c, t, (int32_t)n->index, &t) : -ENOMEM;
		if (rc != 0)
			return rc;
	}
	*w2 = lt_reshape(c, t, 4, fs);
	return *w2 ? 0 : -ENOMEM;
}

/* A 3-d convolution (Conv3d: video models' and volumetric U-Nets'): the
 * 2-d convolution over (H, W) of the input with its depth taps folded into
 * the channels, [N·nod, G·KDe·Cg, H, W] by [O, KDe·Cg, KH, KW], in any of
 * the 2-d forms (conv_forward, its output captured), then [N·nod, O, OH,
 * OW] read as [N, O, nod, OH, OW]; for each part (conv3_parts), the parts
 * concatenated along the depth. */
static int conv3d(lnode_t *n, lt_t *x, lt_t *w, lt_t *b, const conv_t *cv)
{
	cctx_t *c = n->c;
	conv3_t g, parts[CONV3_MAX_PARTS];
	int rc = conv3_geo(n, x, w, cv, &g);
	if (rc != 0)
		return rc;
	if (b != NULL && (b->rank != 1 || !dim_is(b->sizes[0], g.O)))
		return lerr(n, KILN_EINVGRAPH,
			    "bias must have one element per output channel "
			    "(%lld)",
			    (long long)g.O);
	int np = conv3_parts(&g, cv, parts);
	lt_t *ys[CONV3_MAX_PARTS];
	static const uint32_t perm[5] = {0, 2, 1, 3, 4};
	for (int k = 0; k < np; k++) {
		const conv3_t *q = &parts[k];
		lt_t *xc, *w2;
		rc = conv3_fold_x(n, x, q, cv, &xc);
		if (rc == 0)
			rc = conv3_fold_w(n, w, q, &w2);
		if (rc != 0)
			return rc;
		lt_t **saved = n->capture, *cap[3] = {NULL, NULL, NULL};
		n->capture = cap;
		rc = conv_forward(n, xc, w2, b, q->c2);
		n->capture = saved;
		if (rc == 0 && cap[0] == NULL)
			rc = lerr(n, KILN_EUNSUPOP, "no form for this shape");
		if (rc != 0)
			return rc;
		kiln_dim_t y5[5] = {dim_const(g.N), dim_const(q->nod),
				    dim_const(g.O), dim_const(g.OH),
				    dim_const(g.OW)};
		lt_t *r = lt_reshape(c, cap[0], 5, y5);
		ys[k] = r ? lt_permute(c, r, perm) : NULL;
		if (ys[k] == NULL)
			return -ENOMEM;
	}
	if (np == 1)
		return lset(n, 0, ys[0]);
	kiln_dim_t ys5[5] = {dim_const(g.N), dim_const(g.O), dim_const(g.OD),
			     dim_const(g.OH), dim_const(g.OW)};
	return lset(n, 0, lt_cat(c, ys, (uint32_t)np, 2, ys[0]->dtype, 5, ys5));
}

/* Its backward: for each part, that 2-d convolution's (conv_backward,
 * outputs captured) over the part's depths of grad_output as [N·nod, O,
 * OH, OW]; grad_input the sum of the folded inputs' gradients over the
 * depth taps that read each depth, d = od·sd - pd + kd·dd, each from the
 * part of od; grad_weight the folded weights' gradients, unfolded and
 * summed over the parts. */
static int conv3d_bw(lnode_t *n, lt_t *go, lt_t *x, lt_t *w, const conv_t *cv,
		     const bool *mask)
{
	cctx_t *c = n->c;
	conv3_t g, parts[CONV3_MAX_PARTS];
	int rc = conv3_geo(n, x, w, cv, &g);
	if (rc != 0)
		return rc;
	const int64_t gs[5] = {g.N, g.O, g.OD, g.OH, g.OW};
	for (int k = 0; k < 5; k++)
		if (!dim_is(go->sizes[k], gs[k]))
			return lerr(
			    n, KILN_EINVGRAPH,
			    "grad_output does not have the convolution's "
			    "output shape");
	bool want[3] = {mask[0], mask[1] && n->n->n_out > 1,
			mask[2] && n->n->n_out > 2};
	int np = conv3_parts(&g, cv, parts);
	/* the parts' bias gradients would be summed: one over grad_output */
	bool pwant[3] = {want[0], want[1], want[2] && np == 1};
	lt_t *gx[CONV3_MAX_PARTS], *gw[CONV3_MAX_PARTS], *gb = NULL;
	static const uint32_t perm[5] = {0, 2, 1, 3, 4};
	for (int k = 0; k < np; k++) {
		const conv3_t *q = &parts[k];
		lt_t *xc, *w2;
		kiln_dim_t xs[4] = {dim_const(g.N * q->nod),
				    dim_const(g.C * q->KDe), dim_const(g.H),
				    dim_const(g.W)};
		/* grad_input reads only the folded input's sizes */
		rc = want[1] ? conv3_fold_x(n, x, q, cv, &xc) : 0;
		if (!want[1])
			xc = lt_fn(c, x->dtype, 4, xs, sxf(c, 0, x->dtype));
		if (rc == 0)
			rc = conv3_fold_w(n, w, q, &w2);
		if (rc != 0 || xc == NULL)
			return rc != 0 ? rc : -ENOMEM;
		kiln_dim_t g4[4] = {dim_const(g.N * q->nod), dim_const(g.O),
				    dim_const(g.OH), dim_const(g.OW)};
		lt_t *gp = np == 1
			       ? go
			       : lt_slice(c, go, 2, IC(q->od0), IC(q->nod), 1);
		gp = gp ? lt_permute(c, gp, perm) : NULL;
		lt_t *go2 = gp ? lt_reshape(c, gp, 4, g4) : NULL;
		if (go2 == NULL)
			return -ENOMEM;
		lt_t **saved = n->capture, *cap[3] = {NULL, NULL, NULL};
		n->capture = cap;
		rc = conv_backward(n, go2, xc, w2, q->c2, pwant);
		n->capture = saved;
		for (int j = 0; rc == 0 && j < 3; j++)
			if (pwant[j] && cap[j] == NULL)
				rc = lerr(n, KILN_EUNSUPOP,
					  "no form for this shape");
		if (rc != 0)
			return rc;
		gx[k] = cap[0], gw[k] = cap[1], gb = cap[2];
	}
	if (want[0]) {
		/* over [N, C, D, KDe, H, W], reduce KDe; the taps kd0 ..
		 * kd0 + KDe - 1 of every depth, where od's part reads them */
		kiln_dim_t fs[6] = {dim_const(g.N), dim_const(g.C),
				    dim_const(g.D), dim_const(g.KDe),
				    dim_const(g.H), dim_const(g.W)};
		set_var_ranges(c, 6, fs);
		const kiln_expr_t *kd = ix_add(c, IV(3), IC(g.kd0));
		const kiln_expr_t *t = ix_sub(c, ix_add(c, IV(2), IC(cv->p[0])),
					      ix_mul(c, kd, IC(cv->d[0])));
		const kiln_expr_t *od = ix_floordiv(c, t, IC(cv->s[0]));
		const sx_t *ok = in_range(c, od, g.OD);
		if (cv->s[0] > 1) /* the tap lands on an output depth */
			ok = sx_bin(
			    c, OP_AND, ok,
			    sx_bin(c, OP_EQ,
				   sx_index(c, ix_mod(c, t, IC(cv->s[0]))),
				   sx_consti(c, 0, KILN_DT_I64)));
		const sx_t *body = sxf(c, 0, gx[0]->dtype);
		for (int k = np; k-- > 0;) {
			const conv3_t *q = &parts[k];
			const kiln_expr_t *i = ix_sub(c, od, IC(q->od0));
			const kiln_expr_t *j = ix_sub(c, kd, IC(q->kd0));
			const sx_t *in =
			    np == 1 ? ok
				    : sx_bin(c, OP_AND,
					     sx_bin(c, OP_AND, ok,
						    in_range(c, i, q->nod)),
					     in_range(c, j, q->KDe));
			const kiln_expr_t *gi[4] = {
			    ix_add(c, ix_mul(c, IV(0), IC(q->nod)), i),
			    ix_add(c, ix_mul(c, IV(1), IC(q->KDe)), j), IV(4),
			    IV(5)};
			body = sx_where(
			    c, in, sx_guard(c, lt_at(c, gx[k], gi), in), body);
		}
		set_var_ranges(c, 0, NULL);
		lt_t *full = lt_fn(c, gx[0]->dtype, 6, fs, body), *r;
		if (full == NULL)
			return -ENOMEM;
		rc = lred(n, full, 1u << 3, false, RED_SUM, gx[0]->dtype, &r);
		if (rc == 0)
			rc = lset(n, 0, r);
		if (rc != 0)
			return rc;
	}
	if (want[1]) {
		/* [O, Cg·KDe, KH, KW] as [O, Cg, KD, KH, KW] for each part,
		 * summed: 0 at the taps that read padding only */
		kiln_dim_t ws[5] = {dim_const(g.O), dim_const(g.Cg),
				    dim_const(g.KD), dim_const(g.KH),
				    dim_const(g.KW)};
		lt_t *r;
		if (np == 1 && g.KDe == g.KD) {
			r = lt_reshape(c, gw[0], 5, ws);
		} else {
			/* over [O·Cg, KD·KH·KW]: a part's taps are a range
			 * of its columns, their loads contiguous ([O, Cg,
			 * KD, KH, KW], rows of KW, had unfolded R3D's three
			 * 512 -> 512 gradients in 9.5 ms) */
			const int64_t T = g.KH * g.KW;
			kiln_dim_t f2[2] = {dim_const(g.O * g.Cg),
					    dim_const(g.KD * T)};
			set_var_ranges(c, 2, f2);
			const sx_t *body = NULL;
			for (int k = 0; k < np; k++) {
				const conv3_t *q = &parts[k];
				kiln_dim_t p2[2] = {f2[0],
						    dim_const(q->KDe * T)};
				lt_t *gk = lt_reshape(c, gw[k], 2, p2);
				if (gk == NULL)
					return -ENOMEM;
				const kiln_expr_t *j =
				    ix_sub(c, IV(1), IC(q->kd0 * T));
				const sx_t *ok = in_range(c, j, q->KDe * T);
				const kiln_expr_t *wi[2] = {IV(0), j};
				const sx_t *v = sx_where(
				    c, ok, sx_guard(c, lt_at(c, gk, wi), ok),
				    sxf(c, 0, gk->dtype));
				body = body ? sx_bin(c, OP_ADD, body, v) : v;
			}
			set_var_ranges(c, 0, NULL);
			lt_t *t = lt_fn(c, gw[0]->dtype, 2, f2, body);
			rc = t ? lt_realize(c, t, (int32_t)n->index, &t)
			       : -ENOMEM;
			if (rc != 0)
				return rc;
			r = lt_reshape(c, t, 5, ws);
		}
		rc = lset(n, 1, r);
		if (rc != 0)
			return rc;
	}
	if (want[2] && np > 1) {
		const kiln_value_t *v = lout(n, 2);
		kiln_dtype_t acc = compute_dtype(
		    v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype
							    : go->dtype);
		rc = conv_grad_bias(n, go, acc, &gb);
	}
	if (rc == 0 && want[2])
		rc = lset(n, 2, gb);
	return rc;
}
