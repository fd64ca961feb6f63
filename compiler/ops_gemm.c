/*
 * ops_gemm.c — matrix products: mm, bmm, addmm, baddbmm.
 *
 * A product becomes a gemm compute node, P[b, m, n] = sum_k A[b,m,k] *
 * B[b,k,n], over strided views of two buffers (a transposed weight is just
 * a view: BLAS reads it as "transposed", no copy). The kernel it gets calls
 * a BLAS sgemm/dgemm, or runs kiln's GEMM template (which packs a
 * transposed or large B a panel at a time itself), on row blocks in
 * parallel (codegen.c cg_gemm_tmpl); addmm's
 * beta*bias + alpha*P, and whatever pointwise ops follow, fuse into the
 * next kernel, which becomes the product's epilogue when it reads the
 * product element for element and alone (sched.c fuse_epilogues): the
 * product kernel writes each 64-row block to a stack scratch and runs the
 * epilogue on those rows there, so P never reaches memory.
 *
 * Without a BLAS library on the compiling machine, or for a dtype BLAS has
 * no routine for (f16, bf16, ints), the product is an unsupported variant:
 * a fallback step.
 */
#include "compiler/ops.h"

#include <errno.h>
#include <string.h>

static kiln_dtype_t decl_dt(lnode_t *n, kiln_dtype_t fallback)
{
	const kiln_value_t *v = lout(n, 0);
	return v != NULL && v->kind == KILN_VAL_TENSOR ? v->dtype : fallback;
}

/* A BLAS can read a matrix view whose last or second-to-last dim has unit
 * stride (the other being the leading dimension). */
static bool blas_layout(const lt_t *t)
{
	uint32_t r = t->rank;
	if (!t->is_buf || r < 2)
		return false;
	bool row = dim_is(t->strides[r - 1], 1) || dim_is(t->sizes[r - 1], 1);
	bool col = dim_is(t->strides[r - 2], 1) || dim_is(t->sizes[r - 2], 1);
	return row || col;
}

/* Makes t a buffer view BLAS can read (a contiguous copy when not). */
static int blas_operand(lnode_t *n, lt_t *t, lt_t **out)
{
	if (blas_layout(t)) {
		*out = t;
		return 0;
	}
	lt_t *u = lt_fn(n->c, t->dtype, t->rank, t->sizes, lt_body(n->c, t));
	if (u == NULL)
		return -ENOMEM;
	return lt_realize(n->c, u, (int32_t)n->index, out);
}

/* Whether the product (A [.., M, K] @ B [.., K, N], shapes checked) is a
 * matrix-vector one kiln computes as a reduction (lgemv): M == 1 with B
 * contiguous along K or N, or N == 1 with A contiguous along K, or K == 1
 * (an outer product). A BLAS sgemm packs the whole of the large operand
 * for a single row or column: MobileNetV2's classifier, [1, 1280] @ [1280,
 * 1000]ᵀ, took 0.48 ms of a 2.8 ms forward on this 2-core VM (5 MB read
 * at 10 GB/s), where a reduction reads B once. */
static bool gemv_ok(const lt_t *a, const lt_t *b)
{
	uint32_t r = a->rank;
	if (!a->is_buf || !b->is_buf)
		return false;
	for (uint32_t i = 0; i < r; i++)
		if (a->sizes[i].e != NULL || b->sizes[i].e != NULL)
			return false;
	if (dim_is(a->sizes[r - 1], 1))
		return true;
	if (dim_is(a->sizes[r - 2], 1))
		return dim_is(b->strides[r - 2], 1) ||
		       dim_is(b->strides[r - 1], 1);
	if (dim_is(b->sizes[r - 1], 1))
		return dim_is(a->strides[r - 1], 1);
	return false;
}

/* Whether a small product is a reduction too (lgemv, vectorized across N)
 * rather than a BLAS call: f32 on 16-lane vectors, where BLAS runs
 * pre-AVX-512 kernels (cctx blas_avx512: an OPENBLAS_CORETYPE=Haswell set
 * by the environment), under the GEMM template's CG_TG_MIN_MACS, static
 * sizes and B contiguous along N (a weight of GPT-2's Conv1D, the
 * backward's products). Each unit multiplies a row of A by up to 64
 * columns of B, A's element a broadcast and B's row a vector load, with
 * no call, packing or threading of BLAS's to pay: GPT-2's corpus graphs,
 * products of 16 to 256 rows and columns, forward 0.102-0.104 -> 0.083-
 * 0.086 ms, backward 0.21 -> 0.142-0.145 (`kilnc --run --bench`, 2
 * threads). Against SkylakeX's kernels they measured 0.067-0.072 and
 * 0.137-0.139 ms, so AVX-512 BLAS keeps them. A transposed B (x @ Wᵀ)
 * would be a gather across N, and stays BLAS's; so do the products of
 * convolutions (a 1x1 one's W @ X, the backward's): cnn_bwd 0.026 ->
 * 0.029 ms, resnet18_fwd 4% slower as reductions. */
static bool small_ok(lnode_t *n, const lt_t *a, const lt_t *b, kiln_dtype_t dt)
{
	cctx_t *c = n->c;
	uint32_t r = a->rank;
	if (dt != KILN_DT_F32 || c->blas_avx512 || c->vec_width != 16 ||
	    strncmp(n->n->op, "aten.convolution", 16) == 0 || !a->is_buf ||
	    !b->is_buf || !dim_is(b->strides[r - 1], 1))
		return false;
	int64_t macs = 1;
	for (uint32_t i = 0; i < r; i++) {
		if (a->sizes[i].e != NULL || b->sizes[i].e != NULL)
			return false;
		if (i < r - 2)
			macs *= a->sizes[i].c;
	}
	macs *= a->sizes[r - 2].c * a->sizes[r - 1].c * b->sizes[r - 1].c;
	return macs < CG_TG_MIN_MACS;
}

/* P = A @ B as a sum over k of A[.., m, k]·B[.., k, n] (gemv_ok): the
 * full space is [.., M, N, K] with K innermost where the large operand is
 * contiguous along K (a transposed weight: rows of dot products, each
 * vectorized along K), else [.., M, K, N] (vectorized across N, K an
 * outer reduced dim). The sum is in dt, as BLAS's. */
static int lgemv(lnode_t *n, const lt_t *a, const lt_t *b, kiln_dtype_t dt,
		 lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t r = a->rank, nb = r - 2;
	const lt_t *big = dim_is(a->sizes[r - 2], 1) ? b : a;
	bool k_inner = !dim_is(a->sizes[r - 1], 1) &&
		       dim_is(big->strides[big == b ? r - 2 : r - 1], 1);
	/* vars: batch (0), then m, and n, k in the chosen order */
	uint32_t vm = nb, vn = k_inner ? nb + 1 : nb + 2,
		 vk = k_inner ? nb + 2 : nb + 1;
	kiln_dim_t fs[4];
	if (nb)
		fs[0] = a->sizes[0];
	fs[vm] = a->sizes[r - 2];
	fs[vn] = b->sizes[r - 1];
	fs[vk] = a->sizes[r - 1];
	const kiln_expr_t *ia[3], *ib[3];
	if (nb)
		ia[0] = ib[0] = ix_var(c, 0);
	ia[nb] = ix_var(c, vm);
	ia[nb + 1] = ix_var(c, vk);
	ib[nb] = ix_var(c, vk);
	ib[nb + 1] = ix_var(c, vn);
	const sx_t *body = sx_bin(c, OP_MUL, lt_at(c, a, ia), lt_at(c, b, ib));
	lt_t *full = lt_fn(c, dt, r + 1, fs, body);
	if (full == NULL)
		return -ENOMEM;
	/* either way the dims left are [.., M, N] */
	return lred(n, full, 1u << vk, false, RED_SUM, dt, out);
}

/* P = A @ B over the trailing two dims (batched when rank 3). */
int lgemm(lnode_t *n, lt_t *a, lt_t *b, kiln_dtype_t dt, lt_t **out)
{
	cctx_t *c = n->c;
	if (c->blas == NULL)
		return lerr(n, KILN_EUNSUPOP,
			    "no BLAS library on the compiling machine");
	if (dt == KILN_DT_F16 || dt == KILN_DT_BF16) {
		/* half types: operands widened to f32 (one copy each), the
		 * product in f32, rounded when stored, as torch's CPU path */
		if (a->dtype != dt || b->dtype != dt)
			return lerr(n, KILN_EINVGRAPH,
				    "matmul operands must have the result "
				    "dtype %s",
				    kiln_dtype_name(dt));
		lt_t *a32 = lt_fn(c, KILN_DT_F32, a->rank, a->sizes,
				  sx_cast(c, lt_body(c, a), KILN_DT_F32));
		lt_t *b32 = lt_fn(c, KILN_DT_F32, b->rank, b->sizes,
				  sx_cast(c, lt_body(c, b), KILN_DT_F32));
		if (a32 == NULL || b32 == NULL)
			return -ENOMEM;
		int rc = lt_realize(c, a32, (int32_t)n->index, &a);
		if (rc == 0)
			rc = lt_realize(c, b32, (int32_t)n->index, &b);
		if (rc != 0)
			return rc;
		dt = KILN_DT_F32;
	}
	if (dt != KILN_DT_F32 && dt != KILN_DT_F64)
		return lerr(n, KILN_EUNSUPOP,
			    "matmul in %s has no BLAS routine",
			    kiln_dtype_name(dt));
	if (a->rank != b->rank || (a->rank != 2 && a->rank != 3))
		return lerr(
		    n, KILN_EINVGRAPH,
		    "matmul operands must both be 2-d (mm) or 3-d (bmm)");
	if (a->dtype != dt || b->dtype != dt)
		return lerr(n, KILN_EINVGRAPH,
			    "matmul operands must have the result dtype %s",
			    kiln_dtype_name(dt));
	uint32_t r = a->rank;
	if (!dim_eq(a->sizes[r - 1], b->sizes[r - 2]))
		return lerr(n, KILN_EINVGRAPH,
			    "inner dimensions differ: [.., K] @ [K', ..]");
	if (r == 3 && !dim_eq(a->sizes[0], b->sizes[0]))
		return lerr(n, KILN_EINVGRAPH, "batch sizes differ");
	int rc = blas_operand(n, a, &a);
	if (rc == 0)
		rc = blas_operand(n, b, &b);
	if (rc != 0)
		return rc;
	if (gemv_ok(a, b) || small_ok(n, a, b, dt))
		return lgemv(n, a, b, dt, out);
	kiln_dim_t sz[3];
	if (r == 3)
		sz[0] = a->sizes[0];
	sz[r - 2] = a->sizes[r - 2];
	sz[r - 1] = b->sizes[r - 1];
	return lgemm_node(n, a, b, NULL, dt, r, sz, out);
}

/* The compute node of a product (conv: a convolution's tiled template,
 * else NULL) writing a new buffer of sizes sz. */
int lgemm_node(lnode_t *n, const lt_t *a, const lt_t *b, const convspec_t *conv,
	       kiln_dtype_t dt, uint32_t rank, const kiln_dim_t *sz, lt_t **out)
{
	cctx_t *c = n->c;
	uint32_t buf = new_buf(c, CB_TEMP, dt, rank, sz);
	int32_t ni = new_cnode(c);
	if (buf == UINT32_MAX || ni < 0)
		return -ENOMEM;
	cnode_t *cn = &c->nodes[ni];
	cn->buf = buf;
	cn->gemm = true;
	cn->ga = a;
	cn->gb = b;
	cn->conv = conv;
	cn->node = (int32_t)n->index;
	cn->frank = rank;
	for (uint32_t i = 0; i < rank; i++)
		cn->fsizes[i] = sz[i];
	cn->body = sx_consti(c, 0, KILN_DT_I64); /* no element body */
	if (cn->body == NULL)
		return -ENOMEM;
	c->bufs[buf].producer = ni;
	*out = lt_buf(c, buf);
	return *out ? 0 : -ENOMEM;
}

/* mm(self, mat2), bmm(self, mat2) */
int low_mm(cctx_t *c, lnode_t *n)
{
	(void)c;
	lt_t *a, *b, *p;
	int rc = ltensor(n, 0, "self", &a);
	if (rc == 0)
		rc = ltensor(n, 1, "mat2", &b);
	if (rc != 0)
		return rc;
	rc = lgemm(n, a, b, decl_dt(n, a->dtype), &p);
	if (rc != 0)
		return rc;
	return lset(n, 0, p);
}

/* addmm(self, mat1, mat2, beta, alpha) = beta*self + alpha*(mat1 @ mat2);
 * baddbmm likewise over batches. The sum is a lazy epilogue. */
int low_addmm(cctx_t *c, lnode_t *n)
{
	lt_t *bias, *a, *b, *p;
	double beta, alpha;
	int rc = ltensor(n, 0, "self", &bias);
	if (rc == 0)
		rc = ltensor(n, 1, n->param ? "batch1" : "mat1", &a);
	if (rc == 0)
		rc = ltensor(n, 2, n->param ? "batch2" : "mat2", &b);
	if (rc == 0)
		rc = lfloat(n, 3, "beta", 1.0, &beta);
	if (rc == 0)
		rc = lfloat(n, 4, "alpha", 1.0, &alpha);
	if (rc != 0)
		return rc;
	kiln_dtype_t dt = decl_dt(n, a->dtype);
	rc = lgemm(n, a, b, dt, &p);
	if (rc != 0)
		return rc;
	dt = p->dtype; /* f32 for half types: the epilogue computes in it */
	operand_t ops[2] = {{NULL, bias}, {NULL, p}};
	uint32_t rank;
	kiln_dim_t sizes[CIR_MAX_RANK];
	rc = lbroadcast(n, ops, 2, &rank, sizes);
	if (rc != 0)
		return rc;
	const sx_t *pb = lt_body(c, p);
	const sx_t *bb = sx_cast(c, lt_bcast_body(c, bias, rank, sizes), dt);
	if (alpha != 1.0)
		pb = sx_bin(c, OP_MUL, pb, sxf(c, alpha, dt));
	if (beta == 0.0)
		return lset(n, 0, lt_fn(c, dt, rank, sizes, pb));
	if (beta != 1.0)
		bb = sx_bin(c, OP_MUL, bb, sxf(c, beta, dt));
	return lset(n, 0, lt_fn(c, dt, rank, sizes, sx_bin(c, OP_ADD, bb, pb)));
}
