/*
 * sched.c — fusion: compute nodes → kernels.
 *
 * Compute nodes arrive in topological order. Each joins the latest kernel it
 * is compatible with, or starts a new one:
 *
 *   - a pointwise kernel iterates one shape; a pointwise node of that shape
 *     joins it (vertical fusion when it reads a member at the same point,
 *     horizontal otherwise);
 *   - a row kernel iterates outer (parallel) × reduced dims; it takes
 *     reductions over the same space, pointwise nodes over the full space
 *     ("full" members, inner loops) and pointwise nodes over the outer space
 *     ("row" members: one value per row, e.g. layer_norm's rstd);
 *   - a member may read another member of its kernel only at the point being
 *     computed (same row for row values and reductions, same element for full
 *     members); anything else must wait for a later kernel.
 *
 * Then each row kernel is cut into passes: loops over the reduced dims, each
 * followed by the row values that its reductions complete. softmax becomes
 * one kernel with three passes (max; sum of exp; write), layer_norm one with
 * three (sum; sum of squares; write). A buffer is stored to memory only when
 * something outside its loop reads it, or it is a graph output.
 */
#include "compiler/lower.h"

#include <errno.h>
#include <string.h>

/* scatter kernels by scat_op_t: the report's names and verbs */
static const char *const scat_names[] = {
    "scatter-add", "scatter (the last source wins)", "scatter-prod",
    "scatter-amax", "scatter-amin"};
static const char *const scat_verbs[] = {"adds", "stores", "multiplies",
					 "maxes", "mins"};

#define MAX_MEMBERS 64

void sched_mark_fallback_input(cctx_t *c, uint32_t buf, int32_t kernel);

static bool sizes_eq(uint32_t ra, const kiln_dim_t *a, uint32_t rb,
		     const kiln_dim_t *b)
{
	if (ra != rb)
		return false;
	for (uint32_t k = 0; k < ra; k++)
		if (!dim_eq(a[k], b[k]))
			return false;
	return true;
}

/* Store index of buffer b when its dims map to kernel vars vmap[0..rank). */
static const kiln_expr_t *store_index(cctx_t *c, const cbuf_t *b,
				      const kiln_expr_t *const *vmap)
{
	const kiln_expr_t *e = ix_const(c, 0);
	for (uint32_t k = 0; k < b->rank; k++) {
		if (dim_is(b->sizes[k], 1))
			continue;
		e = ix_add(c, e, ix_mul(c, vmap[k], ix_dim(c, b->strides[k])));
	}
	return e;
}

/* How node n would sit in kernel k: its role and its var map (its dim i ↦
 * kernel var vmap[i] or 0). false when it cannot. */
static bool place(cctx_t *c, const kernel_t *k, const cnode_t *n, role_t *role,
		  const kiln_expr_t **vmap)
{
	const cbuf_t *b = &c->bufs[n->buf];
	if (n->red != RED_NONE) {
		if (!k->is_row && k->n_members > 0 && k->rmask == 0) {
			/* a pointwise kernel may become a row kernel */
			if (!sizes_eq(k->frank, k->fsizes, n->frank, n->fsizes))
				return false;
		} else if (!sizes_eq(k->frank, k->fsizes, n->frank,
				     n->fsizes) ||
			   k->rmask != n->rmask) {
			return false;
		}
		*role = ROLE_RED;
		for (uint32_t i = 0; i < n->frank; i++)
			vmap[i] = ix_var(c, i);
		return true;
	}
	if (sizes_eq(k->frank, k->fsizes, b->rank, b->sizes)) {
		*role = ROLE_FULL;
		for (uint32_t i = 0; i < b->rank; i++)
			vmap[i] = ix_var(c, i);
		return true;
	}
	if (!k->is_row)
		return false;
	/* row-shaped: keepdim form */
	if (b->rank == k->frank) {
		bool ok = true;
		for (uint32_t i = 0; i < b->rank && ok; i++) {
			if (k->rmask >> i & 1) {
				ok = dim_is(b->sizes[i], 1);
				vmap[i] = ix_const(c, 0);
			} else {
				ok = dim_eq(b->sizes[i], k->fsizes[i]);
				vmap[i] = ix_var(c, i);
			}
		}
		if (ok) {
			*role = ROLE_ROW;
			return true;
		}
	}
	/* row-shaped: reduced dims dropped */
	uint32_t j = 0;
	for (uint32_t i = 0; i < k->frank; i++) {
		if (k->rmask >> i & 1)
			continue;
		if (j >= b->rank || !dim_eq(b->sizes[j], k->fsizes[i]))
			return false;
		vmap[j++] = ix_var(c, i);
	}
	if (j != b->rank)
		return false;
	*role = ROLE_ROW;
	return true;
}

/* The store index of member m's buffer in kernel vars. */
static const kiln_expr_t *member_sidx(cctx_t *c, const kernel_t *k,
				      const cnode_t *n, role_t role,
				      const kiln_expr_t *const *vmap)
{
	const cbuf_t *b = &c->bufs[n->buf];
	if (role != ROLE_RED)
		return store_index(c, b, vmap);
	/* reduction: buffer dims are the outer dims (reduced ones dropped
	 * or kept as size 1) */
	const kiln_expr_t *bm[CIR_MAX_RANK];
	uint32_t j = 0;
	for (uint32_t i = 0; i < k->frank; i++) {
		if (n->rmask >> i & 1) {
			if (n->keepdim)
				bm[j++] = ix_const(c, 0);
		} else {
			bm[j++] = ix_var(c, i);
		}
	}
	return store_index(c, b, bm);
}

typedef struct loadchk {
	cctx_t *c;
	const kernel_t *k;
	role_t role;
	bool ok;
	uint64_t dep_kernels_max; /* max kernel id + 1 over deps */
} loadchk_t;

static const kmember_t *member_of(const kernel_t *k, uint32_t cnode)
{
	for (uint32_t i = 0; i < k->n_members; i++)
		if (k->members[i].node == cnode)
			return &k->members[i];
	return NULL;
}

static void check_load(void *arg, const sx_t *ld)
{
	loadchk_t *lc = arg;
	cctx_t *c = lc->c;
	const cbuf_t *b = &c->bufs[ld->buf];
	if (b->kind != CB_TEMP || b->producer < 0)
		return;
	const cnode_t *p = &c->nodes[b->producer];
	if (p->kernel < 0 || lc->k == NULL || &c->kernels[p->kernel] != lc->k)
		return;
	const kmember_t *m = member_of(lc->k, (uint32_t)b->producer);
	if (m == NULL || ld->b != NULL || ld->idx != m->sidx) {
		lc->ok = false;
		return;
	}
	/* a row value cannot read a full-space value */
	if (lc->role == ROLE_ROW && m->role == ROLE_FULL)
		lc->ok = false;
}

static int add_member(cctx_t *c, kernel_t *k, uint32_t node, role_t role,
		      const sx_t *body, const kiln_expr_t *sidx)
{
	if (k->n_members == k->cap) {
		uint32_t nc = k->cap ? k->cap * 2 : 8;
		kmember_t *nm = kiln_arena_calloc(c->arena, nc, sizeof(*nm));
		if (nm == NULL)
			return -ENOMEM;
		if (k->n_members)
			memcpy(nm, k->members, k->n_members * sizeof(*nm));
		k->members = nm;
		k->cap = nc;
	}
	kmember_t *m = &k->members[k->n_members++];
	m->node = node;
	m->role = role;
	m->body = body;
	m->sidx = sidx;
	m->pass = 0;
	c->nodes[node].kernel = (int32_t)(k - c->kernels);
	c->bufs[c->nodes[node].buf].kernel = (int32_t)(k - c->kernels);
	return 0;
}

static int new_kernel(cctx_t *c, const cnode_t *n, kernel_t **out)
{
	if (c->n_kernels == c->cap_kernels) {
		uint32_t nc = c->cap_kernels ? c->cap_kernels * 2 : 16;
		kernel_t *nk = kiln_arena_calloc(c->arena, nc, sizeof(*nk));
		if (nk == NULL)
			return -ENOMEM;
		if (c->n_kernels)
			memcpy(nk, c->kernels, c->n_kernels * sizeof(*nk));
		c->kernels = nk;
		c->cap_kernels = nc;
	}
	kernel_t *k = &c->kernels[c->n_kernels];
	memset(k, 0, sizeof(*k));
	k->is_row = n->red != RED_NONE;
	k->frank = n->frank;
	for (uint32_t i = 0; i < n->frank; i++)
		k->fsizes[i] = n->fsizes[i];
	k->rmask = n->red != RED_NONE ? n->rmask : 0;
	snprintf(k->name, sizeof(k->name), "kiln_k%u", c->n_kernels);
	c->n_kernels++;
	*out = k;
	return 0;
}

struct depscan {
	cctx_t *c;
	int32_t max_kernel;
	uint32_t self;
};

static void dep_kernel(void *arg, const sx_t *ld)
{
	struct depscan *d = arg;
	const cbuf_t *b = &d->c->bufs[ld->buf];
	if (b->kind == CB_TEMP && b->kernel > d->max_kernel)
		d->max_kernel = b->kernel;
}

static int64_t est_outer_rows(cctx_t *c, const kernel_t *k, uint32_t rmask)
{
	int64_t rows = 1;
	for (uint32_t i = 0; i < k->frank; i++)
		if (!(rmask >> i & 1))
			rows *= ix_estimate(c, ix_dim(c, k->fsizes[i]));
	return rows;
}

struct rscan {
	uint32_t r;
	bool strided;
};

/* An affine load that reads along var r with a stride (a dynamic or
 * non-affine index is a gather either way). */
static void scan_strided(void *arg, const sx_t *ld)
{
	struct rscan *q = arg;
	int64_t cr = 0;
	if (ld->b == NULL && ix_coef(ld->idx, q->r, &cr) && cr != 0 && cr != 1)
		q->strided = true;
}

/* Whether putting a member (node n: role, body, sidx) into kernel k would
 * make a row kernel vectorized along its last, reduced dim (cg_inner_vec)
 * where that dim is read with a stride, so that the member stays out:
 * - a row kernel vectorized across its rows (the statistics of a
 *   LayerNorm2d: cg_inner_vec) would be vectorized along that dim, by a
 *   member that does not read or store its rows side by side;
 * - a full member that reads along that dim with a stride (a training
 *   graph's NHWC copy of an NCHW activation, saved for the backward) would
 *   join a row kernel vectorized along it;
 * - a pointwise kernel with such a full member would become a row kernel
 *   vectorized along that dim, by a reduction.
 * Every such load would be a gather of 16 lines (ConvNeXt-nano's training
 * forward: a kernel of LayerNorm2d statistics and such copies took 4.3
 * ms). Apart, the reduction reads rows side by side or the copy's rows
 * contiguously, and the copy is a pointwise kernel that transposes
 * through tiles. */
static bool loses_across(cctx_t *c, const kernel_t *k, const cnode_t *n,
			 uint32_t ni, role_t role, const sx_t *body,
			 const kiln_expr_t *sidx)
{
	kernel_t t = *k;
	if (!t.is_row && role == ROLE_RED) {
		t.is_row = true;
		t.rmask = n->rmask;
	}
	uint32_t f = t.frank;
	if (!t.is_row || f == 0 || !(t.rmask >> (f - 1) & 1))
		return false;
	kmember_t ms[MAX_MEMBERS]; /* try_join: k has fewer */
	if (k->n_members > 0)
		memcpy(ms, k->members, k->n_members * sizeof(*ms));
	ms[k->n_members] = (kmember_t){ni, role, 0, body, sidx};
	t.members = ms;
	t.n_members = k->n_members + 1;
	if (!cg_inner_vec(c, &t))
		return false;
	if (k->is_row && !cg_inner_vec(c, k))
		return true;
	struct rscan q = {f - 1, false};
	if (role == ROLE_FULL)
		sx_each_load(body, scan_strided, &q);
	for (uint32_t i = 0; !k->is_row && i < k->n_members && !q.strided; i++)
		if (k->members[i].role == ROLE_FULL)
			sx_each_load(k->members[i].body, scan_strided, &q);
	return q.strided;
}

/* Tries to put node ni into kernel k. */
static int try_join(cctx_t *c, kernel_t *k, uint32_t ni, bool *joined)
{
	cnode_t *n = &c->nodes[ni];
	*joined = false;
	if (k->n_members >= MAX_MEMBERS || k->is_fallback || k->is_gemm ||
	    k->is_scatter)
		return 0;
	role_t role;
	const kiln_expr_t *vmap[CIR_MAX_RANK];
	if (!place(c, k, n, &role, vmap))
		return 0;
	bool convert = !k->is_row && role == ROLE_RED;
	if (convert && est_outer_rows(c, k, n->rmask) < 16)
		return 0; /* keep the parallelism of the pointwise kernel */
	const sx_t *body = n->body;
	if (role == ROLE_ROW || (role == ROLE_FULL && k->frank != 0)) {
		const cbuf_t *b = &c->bufs[n->buf];
		bool ident = true;
		for (uint32_t i = 0; i < b->rank; i++)
			ident = ident && vmap[i] == ix_var(c, i);
		if (!ident || b->rank != k->frank)
			body = sx_subst(c, body, vmap, b->rank);
	}
	if (body == NULL)
		return -ENOMEM;
	loadchk_t lc = {c, k, role, true, 0};
	sx_each_load(body, check_load, &lc);
	if (!lc.ok)
		return 0;
	const kiln_expr_t *sidx = member_sidx(c, k, n, role, vmap);
	if (loses_across(c, k, n, ni, role, body, sidx))
		return 0;
	if (convert) {
		k->is_row = true;
		k->rmask = n->rmask;
	}
	/* a row member that does not load the columns as lanes (a gather:
	 * the copy of a convolution's input to channel blocks, whose shape
	 * matches a depthwise sum's rows) would cost the row kernel its
	 * column blocks (cg_outer_blocks): it runs in a kernel of its own
	 * instead (ConvMixer's depthwise input gradient 0.63 -> 0.13 ms) */
	int ob = role == ROLE_ROW && !convert ? cg_outer_blocks(c, k) : 1;
	int32_t nk = n->kernel, bk = c->bufs[n->buf].kernel;
	int rc = add_member(c, k, ni, role, body, sidx);
	if (rc == 0 && ob > 1 && cg_outer_blocks(c, k) < ob) {
		k->n_members--;
		n->kernel = nk;
		c->bufs[n->buf].kernel = bk;
		return 0;
	}
	if (rc == 0)
		*joined = true;
	return rc;
}

struct bufscan {
	uint32_t buf;
	bool hit;
};

static void scan_buf(void *arg, const sx_t *ld)
{
	struct bufscan *q = arg;
	if (ld->buf == q->buf)
		q->hit = true;
}

/* Cuts a row kernel into passes. */
static void make_passes(cctx_t *c, kernel_t *k)
{
	int32_t npass = 0;
	for (uint32_t i = 0; i < k->n_members; i++) {
		kmember_t *m = &k->members[i];
		/* requirements from in-kernel deps */
		int32_t after_final = -1; /* deps final after this pass */
		int32_t same_loop = 0;	  /* full deps' pass */
		for (uint32_t j = 0; j < i; j++) {
			kmember_t *d = &k->members[j];
			struct bufscan q = {c->nodes[d->node].buf, false};
			sx_each_load(m->body, scan_buf, &q);
			if (!q.hit)
				continue;
			if (d->role == ROLE_FULL) {
				if (d->pass > same_loop)
					same_loop = d->pass;
			} else if (d->role == ROLE_RED || d->role == ROLE_ROW) {
				if (d->pass > after_final)
					after_final = d->pass;
			}
		}
		if (!k->is_row) {
			m->pass = 0;
			continue;
		}
		if (m->role == ROLE_ROW) {
			int32_t p = after_final;
			if (same_loop > p)
				p = same_loop; /* cannot happen (checked) */
			m->pass = p;
		} else {
			int32_t p = after_final + 1;
			if (same_loop > p)
				p = same_loop;
			m->pass = p;
		}
		if (m->pass + 1 > npass)
			npass = m->pass + 1;
	}
	k->n_passes = k->is_row ? (npass > 0 ? npass : 1) : 1;
}

/* Which buffers must be in memory: read by another kernel, read in a later
 * pass from a full member, or a graph output. */
struct memscan {
	cctx_t *c;
	int32_t kernel;
	int32_t pass;
	role_t role;
};

static void mark_mem(void *arg, const sx_t *ld)
{
	struct memscan *s = arg;
	cbuf_t *b = &s->c->bufs[ld->buf];
	b->n_readers++;
	if (b->kind != CB_TEMP)
		return;
	if (b->kernel != s->kernel) {
		b->in_memory = true;
		b->ext_read = true;
		if (s->kernel > b->last_use)
			b->last_use = s->kernel;
		return;
	}
	const kernel_t *k = &s->c->kernels[s->kernel];
	const kmember_t *m = member_of(k, (uint32_t)b->producer);
	if (m != NULL && m->role == ROLE_FULL && m->pass != s->pass)
		b->in_memory = true;
	if (s->kernel > b->last_use)
		b->last_use = s->kernel;
}

static void mark_fb_arg(cctx_t *c, const kiln_arg_t *a, int32_t kernel)
{
	if (a->kind == KILN_ARG_LIST) {
		for (uint32_t i = 0; i < a->n; i++)
			mark_fb_arg(c, &a->u.list[i], kernel);
		return;
	}
	if (a->kind != KILN_ARG_REF || c->vals[a->u.ref] == NULL ||
	    !c->vals[a->u.ref]->is_buf)
		return;
	sched_mark_fallback_input(c, c->vals[a->u.ref]->buf, kernel);
}

/* A full member of an inner-vectorized row kernel that only later passes
 * of the same kernel read (softmax's exp(x - max)) lives in a per-row
 * scratch instead of memory: one transcendental per element, no extra
 * memory traffic. Static rows of at most ROW_LOCAL_MAX elements. */
#define ROW_LOCAL_MAX 16384

static bool member_reads(const kmember_t *m, uint32_t buf)
{
	struct bufscan q = {buf, false};
	sx_each_load(m->body, scan_buf, &q);
	return q.hit;
}

/* The scratch of row-local member i in the row of the kernel's output, when
 * one is written in the last pass at the same positions: softmax's
 * exp(x - max) goes straight into the output row, which the last pass then
 * scales in place. The output's lines are then brought into the cache (and
 * written) during the exp pass, under its arithmetic, instead of in a last
 * pass that is only stores; and the row's working set is two rows, not
 * three. Conditions: the output's store index is the row's base plus the
 * row-major position in the reduced dims (so unit stride along the
 * vectorized last dim), its dtype is the scratch's (f32 or f64: no
 * conversion), it is the last pass's store, and no member after it in that
 * pass reads the scratch (each element is read before it is overwritten). */
static void row_in_output(cctx_t *c, kernel_t *k, uint32_t i)
{
	const kmember_t *m = &k->members[i];
	uint32_t bi = c->nodes[m->node].buf;
	cbuf_t *b = &c->bufs[bi];
	if (m->role != ROLE_FULL || !b->row_local || b->row_out != 0 ||
	    (b->dtype != KILN_DT_F32 && b->dtype != KILN_DT_F64))
		return;
	int32_t last = k->n_passes - 1;
	for (uint32_t j = 0; j < k->n_members; j++) {
		const kmember_t *o = &k->members[j];
		uint32_t oi = c->nodes[o->node].buf;
		const cbuf_t *ob = &c->bufs[oi];
		if (o->role != ROLE_FULL || o->pass != last ||
		    o->pass <= m->pass || !ob->is_output ||
		    ob->dtype != b->dtype || o->sidx == NULL)
			continue;
		bool taken = false;
		for (uint32_t x = 0; x < c->n_bufs; x++)
			taken |= c->bufs[x].row_out == oi + 1;
		if (taken)
			continue;
		/* row-major in the reduced dims, from the last one up */
		bool ok = true;
		int64_t stride = 1;
		for (uint32_t d = k->frank; d-- > 0 && ok;) {
			if (!(k->rmask >> d & 1))
				continue;
			int64_t coef;
			/* a dim of size 1: its var is 0 (its coefficient,
			 * often dropped, does not matter) */
			ok = k->fsizes[d].c == 1 ||
			     (ix_coef(o->sidx, d, &coef) && coef == stride);
			stride *= k->fsizes[d].c;
		}
		for (uint32_t x = j + 1; x < k->n_members && ok; x++)
			ok = k->members[x].pass != last ||
			     !member_reads(&k->members[x], bi);
		if (!ok)
			continue;
		b->row_out = oi + 1;
		return;
	}
}

static void mark_row_local(cctx_t *c)
{
	for (uint32_t ki = 0; ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		uint32_t f = k->frank;
		if (k->is_fallback || !cg_inner_vec(c, k))
			continue;
		int64_t r = 1;
		bool stat = true;
		for (uint32_t d = 0; d < f; d++)
			if (k->rmask >> d & 1) {
				stat = stat && k->fsizes[d].e == NULL;
				r *= k->fsizes[d].c;
			}
		if (!stat || r > ROW_LOCAL_MAX || r == 0)
			continue;
		for (uint32_t i = 0; i < k->n_members; i++) {
			const kmember_t *m = &k->members[i];
			cbuf_t *b = &c->bufs[c->nodes[m->node].buf];
			if (m->role != ROLE_FULL || !b->in_memory ||
			    b->ext_read || b->is_output)
				continue;
			b->row_local = true;
			b->in_memory = false;
		}
		for (uint32_t i = 0; i < k->n_members; i++)
			row_in_output(c, k, i);
	}
}

/* Whether every load of buf in e reads element i of a kernel over sizes
 * fs[0..f) at the row-major flat index of i (no guard, no extra offset). */
struct idscan {
	cctx_t *c;
	uint32_t buf, frank;
	int64_t stride[CIR_MAX_RANK];
	bool ok;
};

static void check_identity(void *arg, const sx_t *ld)
{
	struct idscan *s = arg;
	if (ld->buf != s->buf || !s->ok)
		return;
	if (ld->a != NULL || ld->b != NULL || ld->idx == NULL) {
		s->ok = false;
		return;
	}
	const kiln_expr_t *zero[CIR_MAX_VARS];
	for (uint32_t v = 0; v < s->frank; v++) {
		int64_t coef;
		/* a dim of size 1 (stride -1) is always 0: its coefficient,
		 * often dropped, does not matter */
		if (s->stride[v] >= 0 &&
		    (!ix_coef(ld->idx, v, &coef) || coef != s->stride[v])) {
			s->ok = false;
			return;
		}
		zero[v] = ix_const(s->c, 0);
	}
	const kiln_expr_t *at0 = ix_subst(s->c, ld->idx, zero, s->frank);
	if (at0 == NULL || at0->kind != KILN_EX_CONST || at0->c != 0)
		s->ok = false;
}

/* A pointwise kernel right after a product (BLAS or the GEMM template)
 * that reads the product element for element (row-major, the same rows:
 * its extent is the product's rows, as PW_CHUNK lets a last dim of up to
 * 8192 be one unit) and is the product's only reader becomes its
 * epilogue: the product kernel writes each block of 64 rows to a scratch
 * and runs this kernel on those rows at once, so the product never goes
 * to memory (addmm's bias, an activation, a residual add). Static shapes,
 * f32/f64, scratch <= 512 KiB, no column blocks. After a tiled
 * convolution the product goes to its buffer and the epilogue runs on
 * each tile's rows of every channel right after the tile's product,
 * while they are in cache (batchnorm's scale and shift, relu, a shortcut
 * add). */
#define EPI_SCRATCH_MAX (512 * 1024)

static void fuse_epilogues(cctx_t *c)
{
	if (c->nofuse)
		return;
	for (uint32_t ki = 0; ki + 1 < c->n_kernels; ki++) {
		kernel_t *gk = &c->kernels[ki], *ek = &c->kernels[ki + 1];
		if (!gk->is_gemm || ek->is_gemm || ek->is_fallback ||
		    ek->is_scatter || ek->is_row || ek->frank < 1 ||
		    ek->n_members == 0)
			continue;
		const cnode_t *n = &c->nodes[gk->members[0].node];
		cbuf_t *pb = &c->bufs[n->buf];
		bool conv = n->conv != NULL;
		/* implicit GEMM writes [O, N·OH·OW], which the kernel after
		 * it reads through a permutation: no tile of its rows */
		if (conv && (n->conv->implicit || n->conv->wgrad))
			continue;
		if ((!conv && cg_gemm_col_block(c, n) > 0) || pb->is_output ||
		    pb->custom_strides || pb->last_use != (int32_t)(ki + 1) ||
		    (pb->dtype != KILN_DT_F32 && pb->dtype != KILN_DT_F64))
			continue;
		bool stat = true;
		int64_t prows = 1, ncols = 0, erows = 1;
		for (uint32_t i = 0; i < pb->rank; i++) {
			if (pb->sizes[i].e != NULL)
				stat = false;
			else if (i + 1 < pb->rank)
				prows *= pb->sizes[i].c;
			else
				ncols = pb->sizes[i].c;
		}
		for (uint32_t i = 0; i < ek->frank; i++) {
			if (ek->fsizes[i].e != NULL)
				stat = false;
			else if (i + 1 < ek->frank)
				erows *= ek->fsizes[i].c;
		}
		if (!stat || ncols < 1 || ncols > CG_PW_CHUNK ||
		    ek->fsizes[ek->frank - 1].c != ncols || erows != prows)
			continue;
		int64_t esz = pb->dtype == KILN_DT_F64 ? 8 : 4;
		if (!conv && CG_GEMM_MB * ncols * esz > EPI_SCRATCH_MAX)
			continue;
		struct idscan s = {c, n->buf, ek->frank, {0}, true};
		int64_t st = 1;
		for (uint32_t i = ek->frank; i-- > 0;) {
			s.stride[i] = ek->fsizes[i].c == 1 ? -1 : st;
			st *= ek->fsizes[i].c;
		}
		for (uint32_t i = 0; i < ek->n_members && s.ok; i++)
			sx_each_load(ek->members[i].body, check_identity, &s);
		if (!s.ok)
			continue;
		gk->has_epilogue = true;
		ek->is_epilogue = true;
		/* a convolution's tile goes to its buffer (an output row block
		 * of every channel: no whole rows of a scratch), which the
		 * epilogue reads back while it is in cache */
		pb->in_memory = conv;
		/* what the epilogue writes is written while the product runs:
		 * memplan starts those buffers' lives at the product's step
		 * (their kernel stays the epilogue's, which its codegen needs
		 * for values passed between its members) */
		ki++; /* the epilogue is not a product */
	}
}

/* ---- pointwise kernels that transpose -------------------------------------
 *
 * A pointwise kernel is vectorized along its last dim. An access strided
 * along it (a channels-last tensor read or written in NCHW order:
 * ConvNeXt's permutes around its LayerNorms, whose forward saves [8,
 * 1280, 8, 8] activations with strides [81920, 1, 10240, 1280]) is a
 * gather or 16 scalar stores, and the 16 elements of one of its cache
 * lines (16 channels of one position) are written by 16 vectors that are
 * a whole channel plane apart in time: each line is fetched and evicted
 * over and over. Such a kernel's dim d along which that access is
 * contiguous is split into blocks of TBLK, and the block's inner part
 * moved just inside the last dim's loop: [N, C, H, W] runs as [N, C/16,
 * H, 16, W], so a vector's 16 lines are complete after 16 consecutive
 * iterations (the same values, in another order). A kernel of at least
 * TILE_MIN elements is also tiled (kernel_t.tiled): codegen.c moves those
 * accesses through tiles transposed in registers. */
#define TBLK	 CIR_TBLK
#define TILE_MIN (1 << 16)

struct tscan {
	cctx_t *c;
	int32_t kernel;
	const kernel_t *k;
	int64_t cnt[CIR_MAX_RANK];
};

static void count_transposed(struct tscan *t, const kiln_expr_t *idx)
{
	uint32_t last = t->k->frank - 1;
	int64_t cl = 0;
	if (!ix_coef(idx, last, &cl) || (cl < TBLK && cl > -TBLK))
		return;
	for (uint32_t d = 0; d < last; d++) {
		int64_t cf = 0;
		if (ix_coef(idx, d, &cf) && cf == 1) {
			t->cnt[d]++;
			return;
		}
	}
}

static void count_transposed_load(void *arg, const sx_t *ld)
{
	struct tscan *t = arg;
	const cbuf_t *b = &t->c->bufs[ld->buf];
	if (ld->b != NULL || (b->kind == CB_TEMP && b->kernel == t->kernel))
		return;
	count_transposed(t, ld->idx);
}

static void block_transposes(cctx_t *c)
{
	for (uint32_t ki = 0; ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		if (k->is_row || k->is_gemm || k->is_fallback ||
		    k->is_scatter || k->is_epilogue || k->frank < 2 ||
		    k->frank + 1 > CIR_MAX_RANK || k->n_members > 64)
			continue;
		struct tscan t = {c, (int32_t)ki, k, {0}};
		for (uint32_t i = 0; i < k->n_members; i++) {
			const kmember_t *m = &k->members[i];
			const cbuf_t *b = &c->bufs[c->nodes[m->node].buf];
			sx_each_load(m->body, count_transposed_load, &t);
			if ((b->in_memory || b->is_output) && m->sidx != NULL)
				count_transposed(&t, m->sidx);
		}
		/* tiles (codegen.c) take compile time, about 10 ms a kernel,
		 * to save a gather of 16 lanes (16-29 cycles) a vector: only
		 * for kernels of at least TILE_MIN elements (a blocked dim of
		 * exactly TBLK changes nothing without them) */
		int64_t elems = 1;
		for (uint32_t i = 0; i < k->frank && elems < TILE_MIN; i++)
			elems *= ix_estimate(c, ix_dim(c, k->fsizes[i]));
		bool big = elems >= TILE_MIN;
		uint32_t last = k->frank - 1, d = last;
		for (uint32_t i = 0; i < last; i++) {
			const kiln_dim_t *sz = &k->fsizes[i];
			if (t.cnt[i] > 0 && sz->e == NULL &&
			    (sz->c > TBLK || (big && sz->c == TBLK)) &&
			    sz->c % TBLK == 0 &&
			    (d == last || t.cnt[i] > t.cnt[d]))
				d = i;
		}
		if (d == last)
			continue;
		/* old var i -> new var: dims before d keep theirs, d is
		 * (block d)·TBLK + (var last), dims after d move up by
		 * none, the inner part is new var `last`, the old last dim
		 * new var last + 1 */
		const kiln_expr_t *map[CIR_MAX_RANK] = {0};
		kiln_dim_t sz[CIR_MAX_RANK];
		for (uint32_t i = 0; i < last; i++) {
			sz[i] = i == d ? dim_const(k->fsizes[d].c / TBLK)
				       : k->fsizes[i];
			map[i] = i == d ? ix_add(c,
						 ix_mul(c, ix_var(c, d),
							ix_const(c, TBLK)),
						 ix_var(c, last))
					: ix_var(c, i);
		}
		sz[last] = dim_const(TBLK);
		sz[last + 1] = k->fsizes[last];
		map[last] = ix_var(c, last + 1);
		const sx_t *body[64];
		const kiln_expr_t *sidx[64];
		bool ok = true;
		for (uint32_t i = 0; i < k->n_members && ok; i++) {
			const kmember_t *m = &k->members[i];
			body[i] = sx_subst(c, m->body, map, k->frank);
			sidx[i] = m->sidx != NULL
				      ? ix_subst(c, m->sidx, map, k->frank)
				      : NULL;
			ok = body[i] != NULL && (m->sidx == NULL || sidx[i]);
		}
		if (!ok)
			continue;
		for (uint32_t i = 0; i < k->n_members; i++) {
			k->members[i].body = body[i];
			k->members[i].sidx = sidx[i];
		}
		k->frank++;
		memcpy(k->fsizes, sz, sizeof(kiln_dim_t) * k->frank);
		k->tiled = big;
	}
}

int sched_graph(cctx_t *c)
{
	for (uint32_t ni = 0; ni < c->n_nodes; ni++) {
		cnode_t *n = &c->nodes[ni];
		if (n->gemm || n->scatter) {
			kernel_t *k;
			int rc = new_kernel(c, n, &k);
			if (rc != 0)
				return rc;
			k->is_gemm = n->gemm;
			k->is_scatter = n->scatter;
			k->is_row = false;
			rc = add_member(c, k, ni, ROLE_FULL, n->body, NULL);
			if (rc != 0)
				return rc;
			int32_t ki = (int32_t)(k - c->kernels);
			sched_mark_fallback_input(c, n->ga->buf, ki);
			sched_mark_fallback_input(c, n->gb->buf, ki);
			if (n->scat_base != NULL)
				sched_mark_fallback_input(c, n->scat_base->buf,
							  ki);
			c->bufs[n->buf].in_memory = true;
			continue;
		}
		if (n->fallback) {
			kernel_t *k;
			int rc = new_kernel(c, n, &k);
			if (rc != 0)
				return rc;
			k->is_fallback = true;
			k->is_row = false;
			int32_t ki = (int32_t)(k - c->kernels);
			snprintf(k->name, sizeof(k->name), "fallback%u", ki);
			rc = add_member(c, k, ni, ROLE_FULL, n->body, NULL);
			if (rc != 0)
				return rc;
			for (uint32_t j = 0; j < n->n_fbout; j++)
				if (n->fbout[j] != UINT32_MAX)
					c->bufs[n->fbout[j]].kernel = ki;
			continue;
		}
		struct depscan d = {c, -1, ni};
		sx_each_load(n->body, dep_kernel, &d);
		bool joined = false;
		/* latest kernel first; never before a dependency's kernel.
		 * KILN_NOFUSE=1 gives every node its own kernel (debugging) */
		for (int32_t ki = (int32_t)c->n_kernels - 1;
		     !c->nofuse && ki >= 0 && ki >= d.max_kernel && !joined;
		     ki--) {
			int rc = try_join(c, &c->kernels[ki], ni, &joined);
			if (rc != 0)
				return rc;
		}
		if (joined)
			continue;
		kernel_t *k;
		int rc = new_kernel(c, n, &k);
		if (rc == 0)
			rc = try_join(c, k, ni, &joined);
		if (rc != 0)
			return rc;
		if (!joined)
			return cir_err(c, KILN_EINTERNAL,
				       "scheduler: node %u fits no kernel", ni);
	}
	for (uint32_t ki = 0; ki < c->n_kernels; ki++)
		if (!c->kernels[ki].is_fallback && !c->kernels[ki].is_gemm &&
		    !c->kernels[ki].is_scatter)
			make_passes(c, &c->kernels[ki]);
	for (uint32_t ki = 0; ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		for (uint32_t i = 0; i < k->n_members; i++) {
			struct memscan s = {c, (int32_t)ki, k->members[i].pass,
					    k->members[i].role};
			sx_each_load(k->members[i].body, mark_mem, &s);
		}
	}
	for (uint32_t ki = 0; ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		if (!k->is_fallback)
			continue;
		const kiln_node_t *nd =
		    &c->g->nodes[c->nodes[k->members[0].node].node];
		for (uint32_t i = 0; i < nd->n_args; i++)
			mark_fb_arg(c, &nd->args[i], (int32_t)ki);
		for (uint32_t i = 0; i < nd->n_kwargs; i++)
			mark_fb_arg(c, &nd->kwargs[i].val, (int32_t)ki);
	}
	for (uint32_t b = 0; b < c->n_bufs; b++)
		if (c->bufs[b].is_output)
			c->bufs[b].in_memory = true;
	mark_row_local(c);
	fuse_epilogues(c);
	if (!c->nofuse)
		block_transposes(c);
	return 0;
}

/* A fallback reads its inputs from memory. */
void sched_mark_fallback_input(cctx_t *c, uint32_t buf, int32_t kernel)
{
	cbuf_t *b = &c->bufs[buf];
	b->n_readers++;
	if (b->kind != CB_TEMP)
		return;
	b->in_memory = true;
	b->ext_read = true;
	if (kernel > b->last_use)
		b->last_use = kernel;
}

/* ---- report ----------------------------------------------------------- */

typedef struct sbuf {
	char *p;
	size_t n, cap;
} sbuf_t;

__attribute__((format(printf, 2, 3))) static void
sb_printf(sbuf_t *s, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		size_t room = s->cap - s->n;
		int w = vsnprintf(s->p ? s->p + s->n : NULL, s->p ? room : 0,
				  fmt, ap);
		va_end(ap);
		if (w < 0)
			return;
		if (s->p != NULL && (size_t)w < room) {
			s->n += (size_t)w;
			return;
		}
		size_t nc = (s->cap ? s->cap * 2 : 4096) + (size_t)w;
		char *np = realloc(s->p, nc);
		if (np == NULL)
			return;
		s->p = np;
		s->cap = nc;
	}
}

static void sb_dims(cctx_t *c, sbuf_t *s, uint32_t rank, const kiln_dim_t *d,
		    uint32_t rmask)
{
	sb_printf(s, "[");
	for (uint32_t i = 0; i < rank; i++) {
		char buf[64];
		kiln_expr_format(c->g, ix_dim(c, d[i]), buf, sizeof(buf));
		sb_printf(s, "%s%s%s", i ? ", " : "", buf,
			  rmask >> i & 1 ? "*" : "");
	}
	sb_printf(s, "]");
}

static const char *const role_names[] = {"full", "reduce", "row"};
static const char *const red_names[] = {
    [RED_NONE] = "",	     [RED_SUM] = "sum", [RED_PROD] = "prod",
    [RED_MAX] = "max",	     [RED_MIN] = "min", [RED_ARGMAX] = "argmax",
    [RED_ARGMIN] = "argmin", [RED_ANY] = "any", [RED_ALL] = "all",
    [RED_MAXNP] = "max"}; /* by red_op_t, whatever its order */

/* max-autotune's decision for graph node `node`, when it made one:
 * whether a line was written */
static bool report_tune(cctx_t *c, sbuf_t *s, int32_t node)
{
	if (c->tune_why == NULL || node < 0 || c->tune_why[node][0] == '\0')
		return false;
	sb_printf(s, "    %s\n", c->tune_why[node]);
	return true;
}

char *sched_report(cctx_t *c)
{
	sbuf_t s = {NULL, 0, 0};
	uint32_t nfused = 0;
	for (uint32_t i = 0; i < c->n_nodes; i++)
		nfused++;
	uint32_t nk = 0;
	for (uint32_t ki = 0; ki < c->n_kernels; ki++)
		nk += !c->kernels[ki].is_epilogue;
	sb_printf(&s, "%u kernels from %u graph nodes (%u compute nodes)\n", nk,
		  c->g->n_nodes, nfused);
	for (uint32_t ki = 0; ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		if (k->is_fallback) {
			const cnode_t *n = &c->nodes[k->members[0].node];
			sb_printf(&s,
				  "%s: fallback step <- node %d %s (run by "
				  "torch%s%s)\n",
				  k->name, n->node, c->g->nodes[n->node].op,
				  n->fb_why != NULL ? ": " : "",
				  n->fb_why != NULL ? n->fb_why : "");
			continue;
		}
		if (k->is_gemm && c->nodes[k->members[0].node].conv != NULL) {
			const cnode_t *n = &c->nodes[k->members[0].node];
			const convspec_t *cs = n->conv;
			bool f64 = c->bufs[n->buf].dtype == KILN_DT_F64;
			int64_t ckk = cs->C / cs->G * cs->KH * cs->KW;
			if (cs->fdirect) {
				sb_printf(&s,
					  "%s: convolution, direct (no "
					  "im2col: %lld output channels' "
					  "%lld output row%s in registers a "
					  "unit, %lld units) ",
					  k->name, (long long)cs->fd_mo,
					  (long long)cs->fd_r,
					  cs->fd_r > 1 ? "s" : "",
					  (long long)cg_fdirect_units(cs));
				sb_dims(c, &s, n->frank, n->fsizes, 0);
				sb_printf(
				    &s, " K=%lld, buf%u%s  <- node %d %s\n",
				    (long long)ckk, n->buf,
				    c->bufs[n->buf].is_output ? " (output)"
							      : "",
				    n->node, c->g->nodes[n->node].op);
				if (k->has_epilogue)
					sb_printf(&s,
						  "    epilogue %s on each "
						  "unit's rows, right after "
						  "them (in cache)\n",
						  c->kernels[ki + 1].name);
				if (!report_tune(c, &s, n->node))
					sb_printf(&s,
						  "    by the heuristic: f32 "
						  "with AVX-512, stride 1, "
						  "rows of at most 4 vectors "
						  "at least 3/4 full, at most "
						  "%d output channels and %d "
						  "multiply-adds an output\n",
						  CG_FDIRECT_MAX_O,
						  CG_FDIRECT_MIN_CKK);
				continue;
			}
			if (cs->wgrad) {
				sb_printf(&s,
					  "%s: convolution's weight gradient, "
					  "direct (no im2col: grad_output "
					  "times the input shifted by each "
					  "tap, %lld output channels' taps "
					  "of a row in registers a unit, %lld "
					  "units) ",
					  k->name, (long long)cs->wg_mo,
					  (long long)cg_wgrad_units(cs));
				sb_dims(c, &s, n->frank, n->fsizes, 0);
				if (cs->G > 1)
					sb_printf(&s, " in %lld groups",
						  (long long)cs->G);
				sb_printf(&s,
					  " over [%lld, %lld, %lld], buf%u%s  "
					  "<- node %d %s\n",
					  (long long)cs->N, (long long)cs->OH,
					  (long long)cs->OW, n->buf,
					  c->bufs[n->buf].is_output
					      ? " (output)"
					      : "",
					  n->node, c->g->nodes[n->node].op);
				continue;
			}
			if (cs->implicit) {
				sb_printf(&s,
					  "%s: convolution as implicit GEMM, "
					  "blocked GEMM template (%dx%d "
					  "register tiles, B's blocks packed "
					  "from the input, no im2col buffer) ",
					  k->name, CG_TG_MR, CG_TG_NR);
				sb_dims(c, &s, n->frank, n->fsizes, 0);
				if (cs->G > 1)
					sb_printf(&s, " in %lld groups",
						  (long long)cs->G);
				sb_printf(
				    &s, " K=%lld, buf%u%s  <- node %d %s\n",
				    (long long)ckk, n->buf,
				    c->bufs[n->buf].is_output ? " (output)"
							      : "",
				    n->node, c->g->nodes[n->node].op);
				int64_t cols = cs->N * cs->OH * cs->OW;
				if (!report_tune(c, &s, n->node))
					sb_printf(
					    &s,
					    "    by the heuristic: in place "
					    "of a whole-image or batched "
					    "im2col, f32 with AVX-512, %lld "
					    "output positions in %lld units "
					    "of columns (at least %d)\n",
					    (long long)cols,
					    (long long)(cs->G *
							cg_conv_implicit_units(
							    cols)),
					    CG_CONV_IMPLICIT_MIN_UNITS);
				continue;
			}
			if (cs->tmpl)
				sb_printf(&s,
					  "%s: convolution as im2col tiles + "
					  "GEMM template (%dx%d register "
					  "tiles) ",
					  k->name, CG_TG_MR, CG_TG_NR);
			else
				sb_printf(&s,
					  "%s: convolution as im2col tiles + "
					  "BLAS %s ",
					  k->name, f64 ? "dgemm" : "sgemm");
			sb_dims(c, &s, n->frank, n->fsizes, 0);
			sb_printf(&s,
				  " K=%lld, tiles of %lld output rows (%lld "
				  "columns, %lld KiB scratch)",
				  (long long)ckk, (long long)cs->rows,
				  (long long)(cs->rows * cs->OW),
				  (long long)((ckk * cs->rows * cs->OW *
						   (f64 ? 8 : 4) +
					       1023) /
					      1024));
			sb_printf(&s, ", buf%u%s  <- node %d %s\n", n->buf,
				  c->bufs[n->buf].is_output ? " (output)" : "",
				  n->node, c->g->nodes[n->node].op);
			if (k->has_epilogue)
				sb_printf(&s,
					  "    epilogue %s on each tile, "
					  "right after its product (in "
					  "cache)\n",
					  c->kernels[ki + 1].name);
			report_tune(c, &s, n->node);
			continue;
		}
		if (k->is_scatter) {
			const cnode_t *n = &c->nodes[k->members[0].node];
			sb_printf(&s, "%s: %s ", k->name,
				  scat_names[n->scat_op]);
			sb_dims(c, &s, n->frank, n->fsizes, 0);
			sb_printf(&s, " of ");
			sb_dims(c, &s, n->ga->rank, n->ga->sizes, 0);
			sb_printf(
			    &s,
			    " source %s, columns in blocks of %lld "
			    "(a unit %s and %s every %s into them), "
			    "buf%u%s  <- node %d %s\n",
			    n->scat_elem ? "elements, an index each" : "rows",
			    (long long)cg_scatter_cols(c, n),
			    n->scat_base != NULL ? "copies self's columns"
			    : n->scat_op == SCAT_ADD || n->scat_op == SCAT_STORE
				? "zeroes its columns"
				: "fills its columns with the identity",
			    scat_verbs[n->scat_op],
			    n->scat_elem ? "element" : "row", n->buf,
			    c->bufs[n->buf].is_output ? " (output)" : "",
			    n->node, c->g->nodes[n->node].op);
			continue;
		}
		if (k->is_gemm) {
			const cnode_t *n = &c->nodes[k->members[0].node];
			const lt_t *a = n->ga, *b = n->gb;
			uint32_t r = a->rank;
			int tk = cg_gemm_tmpl(c, n);
			if (tk != 0)
				sb_printf(&s,
					  "%s: matmul via GEMM template "
					  "(%dx%d register tiles%s) ",
					  k->name, CG_TG_MR, CG_TG_NR,
					  tk == 2   ? ", B packed a panel at a "
						      "time"
					  : tk == 3 ? ", blocked, A and B "
						      "packed"
						    : "");
			else
				sb_printf(&s, "%s: matmul via BLAS %s ",
					  k->name,
					  c->bufs[n->buf].dtype == KILN_DT_F64
					      ? "dgemm"
					      : "sgemm");
			sb_dims(c, &s, n->frank, n->fsizes, 0);
			sb_printf(&s, " K=");
			sb_dims(c, &s, 1, &a->sizes[r - 1], 0);
			int64_t nb = cg_gemm_col_block(c, n);
			if (nb > 0)
				sb_printf(&s,
					  ", columns in blocks of %lld "
					  "(few row blocks)",
					  (long long)nb);
			sb_printf(&s, ", A %s, B %s, buf%u%s  <- node %d %s\n",
				  dim_is(a->strides[r - 1], 1) ? "row-major"
							       : "transposed",
				  dim_is(b->strides[r - 1], 1) ? "row-major"
							       : "transposed",
				  n->buf,
				  c->bufs[n->buf].is_output ? " (output)" : "",
				  n->node, c->g->nodes[n->node].op);
			if (k->has_epilogue) {
				const cbuf_t *pb = &c->bufs[n->buf];
				int64_t cols = pb->sizes[pb->rank - 1].c;
				sb_printf(
				    &s,
				    "    epilogue %s on each block of %d "
				    "rows in a %lld KiB scratch (the "
				    "product never reaches memory)\n",
				    c->kernels[ki + 1].name, CG_GEMM_MB,
				    (long long)((CG_GEMM_MB * cols *
						     (pb->dtype == KILN_DT_F64
							  ? 8
							  : 4) +
						 1023) /
						1024));
			}
			if (!report_tune(c, &s, n->node))
				sb_printf(&s, "    by the heuristic: %s\n",
					  cg_gemm_why(c, n));
			continue;
		}
		sb_printf(&s, "%s: %s ", k->name,
			  k->is_row ? "row kernel" : "pointwise kernel");
		sb_dims(c, &s, k->frank, k->fsizes, k->rmask);
		if (k->is_row)
			sb_printf(&s, ", %d pass%s", k->n_passes,
				  k->n_passes == 1 ? "" : "es");
		if (k->is_row && k->frank > 0 &&
		    (k->rmask >> (k->frank - 1) & 1) && !cg_inner_vec(c, k))
			sb_printf(&s, ", vectorized across rows (the reduced "
				      "dim is strided)");
		int ob = cg_outer_blocks(c, k);
		if (ob > 1)
			sb_printf(&s, ", %d blocks of %d columns a unit", ob,
				  c->vec_width);
		if (k->tiled)
			sb_printf(&s, ", transposes through tiles of %d", TBLK);
		int wave = cg_row_wave(c, k);
		if (wave == 1)
			sb_printf(&s, ", passes as a wavefront (pass p on "
				      "row s - p)");
		else if (wave == 2)
			sb_printf(&s,
				  ", passes as a wavefront (pass p on row s - "
				  "p) up to %.0f MiB, checked when it runs",
				  CG_WAVE_MAX_BYTES / (1024 * 1024));
		else if (cg_row_ahead(c, k))
			sb_printf(&s, ", first pass a row ahead");
		int64_t rot = cg_row_rotation(c, k);
		if (rot > 0)
			sb_printf(&s, ", pass p from column p*%lld",
				  (long long)rot);
		if (k->is_epilogue)
			sb_printf(&s, ", run by %s", c->kernels[ki - 1].name);
		sb_printf(&s, ", %u member%s\n", k->n_members,
			  k->n_members == 1 ? "" : "s");
		for (uint32_t i = 0; i < k->n_members; i++) {
			kmember_t *m = &k->members[i];
			cnode_t *n = &c->nodes[m->node];
			cbuf_t *b = &c->bufs[n->buf];
			const char *op =
			    n->node >= 0 ? c->g->nodes[n->node].op : "output";
			char rl[48] = " (row scratch)";
			if (b->row_out != 0)
				snprintf(rl, sizeof(rl),
					 " (row scratch in buf%u's row)",
					 b->row_out - 1);
			sb_printf(&s,
				  "    %-6s %-6s pass %d  buf%u %s%s  <- node "
				  "%d %s\n",
				  role_names[m->role],
				  n->red != RED_NONE ? red_names[n->red] : "",
				  m->pass, n->buf, kiln_dtype_name(b->dtype),
				  b->is_output	 ? " (output)"
				  : b->in_memory ? " (stored)"
				  : b->row_local ? rl
						 : " (register)",
				  n->node, op);
		}
	}
	if (s.p == NULL)
		return NULL;
	return s.p;
}

/* ---- the lowered program (kilnc --emit=ir) ---------------------------- */

static void sb_expr(cctx_t *c, sbuf_t *s, const kiln_expr_t *e)
{
	char buf[256];
	kiln_expr_format(c->g, e, buf, sizeof(buf));
	sb_printf(s, "%s", buf);
}

static void sb_sx(cctx_t *c, sbuf_t *s, const sx_t *e, int depth)
{
	if (depth > 40) {
		sb_printf(s, "...");
		return;
	}
	switch ((sx_kind_t)e->kind) {
	case SX_CONST:
		if (kiln_dtype_is_float((kiln_dtype_t)e->dt))
			sb_printf(s, "%.9g", e->k.f);
		else
			sb_printf(s, "%lld", (long long)e->k.i);
		return;
	case SX_LOAD:
		sb_printf(s, "buf%u[", e->buf);
		sb_expr(c, s, e->idx);
		if (e->b != NULL) {
			sb_printf(s, " + ");
			sb_sx(c, s, e->b, depth + 1);
		}
		sb_printf(s, "]");
		if (e->a != NULL) {
			sb_printf(s, " if ");
			sb_sx(c, s, e->a, depth + 1);
		}
		return;
	case SX_INDEX:
		sb_printf(s, "index(");
		sb_expr(c, s, e->idx);
		sb_printf(s, ")");
		return;
	case SX_UN:
		sb_printf(s, "%s(", sx_op_name((sx_op_t)e->op));
		sb_sx(c, s, e->a, depth + 1);
		sb_printf(s, ")");
		return;
	case SX_BIN:
		sb_printf(s, "%s(", sx_op_name((sx_op_t)e->op));
		sb_sx(c, s, e->a, depth + 1);
		sb_printf(s, ", ");
		sb_sx(c, s, e->b, depth + 1);
		sb_printf(s, ")");
		return;
	case SX_WHERE:
		sb_printf(s, "where(");
		sb_sx(c, s, e->a, depth + 1);
		sb_printf(s, ", ");
		sb_sx(c, s, e->b, depth + 1);
		sb_printf(s, ", ");
		sb_sx(c, s, e->c, depth + 1);
		sb_printf(s, ")");
		return;
	case SX_CAST:
		sb_printf(s, "%s(",
			  kiln_dtype_name(e->op ? (kiln_dtype_t)e->op
						: (kiln_dtype_t)e->dt));
		sb_sx(c, s, e->a, depth + 1);
		sb_printf(s, ")");
		return;
	}
}

char *sched_ir(cctx_t *c)
{
	sbuf_t s = {NULL, 0, 0};
	sb_printf(&s, "; compute nodes (i0.. index the node's space; * marks "
		      "reduced dims)\n");
	for (uint32_t i = 0; i < c->n_nodes; i++) {
		const cnode_t *n = &c->nodes[i];
		const cbuf_t *b = &c->bufs[n->buf];
		const char *op =
		    n->node >= 0 ? c->g->nodes[n->node].op : "output";
		if (n->fallback) {
			sb_printf(&s, "%%%u = fallback %s  ; node %d\n", i, op,
				  n->node);
			continue;
		}
		sb_printf(&s, "buf%u: %s ", n->buf, kiln_dtype_name(b->dtype));
		sb_dims(c, &s, b->rank, b->sizes, 0);
		if (n->scatter) {
			sb_printf(&s,
				  " = %s of buf%u's %s at the "
				  "indices in buf%u  ; node %d %s\n",
				  scat_names[n->scat_op], n->gb->buf,
				  n->scat_elem ? "elements" : "rows",
				  n->ga->buf, n->node, op);
			continue;
		}
		if (n->red != RED_NONE) {
			sb_printf(&s, " = %s over ", red_names[n->red]);
			sb_dims(c, &s, n->frank, n->fsizes, n->rmask);
			sb_printf(&s, " of ");
		} else {
			sb_printf(&s, " = ");
		}
		sb_sx(c, &s, n->body, 0);
		sb_printf(&s, "  ; node %d %s\n", n->node, op);
	}
	return s.p;
}
