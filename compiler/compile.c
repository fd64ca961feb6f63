/*
 * compile.c — the driver: graph → lower → outputs → schedule → LLVM →
 * object → .so → memory plan → artifact.
 *
 * A kiln_compiler_t owns its LLVM TargetMachines and is used by one thread
 * at a time. A compile splits its kernels over twice as many modules as
 * it has threads (compile_threads()), each in an LLVMContext of its own;
 * the threads (one TargetMachine each) claim the modules in turn and
 * optimize and emit them; the objects are linked into one .so. Nothing LLVM is
 * shared between threads, within a compile or between two compilers.
 */
#include "clients/libkiln/kiln.h"
#include "compiler/cpu.h"
#include "compiler/lower.h"

#include <dlfcn.h>
#include <errno.h>
#include <llvm-c/Core.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "build_id.h"
#include "compiler/internal_tune.h"

struct kiln_compiler {
	cpu_target_t cpu;
	int threads;	   /* a compile's threads (compile_threads) */
	bool share_bodies; /* KILN_SHARE_BODIES (share_bodies) */
	char fingerprint[160];
	char blas[256];	  /* "" when no BLAS library is loadable */
	bool blas_avx512; /* its products run AVX-512 kernels (probe_blas) */
	const char *blas_kind;	 /* the fingerprint's blas/: probe_blas */
	kiln_tune_cache_t *tune; /* max-autotune's decisions (autotune.c) */
	int64_t tmpl_block_a;	 /* tests: the template's blocked bound */
	bool no_conv_direct;	 /* tests: the direct forward by mode only */
};

/* Whether the OpenBLAS core `name` (openblas_get_corename) runs AVX-512
 * sgemm kernels: SkylakeX's, which Cooperlake and SapphireRapids share. */
static bool core_avx512(const char *name)
{
	static const char *const wide[] = {"skylakex", "cooperlake",
					   "sapphirerapids"};
	for (size_t i = 0; i < sizeof(wide) / sizeof(wide[0]); i++)
		if (strcasecmp(name, wide[i]) == 0)
			return true;
	return false;
}

/* The BLAS library kernels call for matrix products: KILN_BLAS (a path or
 * soname; "none" disables), else OpenBLAS when it loads here. And whether
 * its products run AVX-512 kernels: an OpenBLAS says which core it chose
 * (here, from OPENBLAS_CORETYPE, which kiln_blas_prepare sets unless it is
 * set already: a "Haswell" set by the environment runs AVX2 ones); a BLAS
 * that is not OpenBLAS (KILN_BLAS) is taken to. The GEMM template's heuristic
 * (codegen.c tmpl_form) leaves products to BLAS only where it does. */
static void probe_blas(kiln_compiler_t *c)
{
	const char *env = getenv("KILN_BLAS");
	const char *cand = env != NULL ? env : "libopenblas.so.0";
	c->blas[0] = '\0';
	c->blas_avx512 = false;
	c->blas_kind = "none";
	if (strcmp(cand, "none") == 0)
		return;
	/* OpenBLAS chooses its kernels as it loads, here for every product
	 * max-autotune runs in this process (libkiln blas.c) */
	kiln_blas_prepare();
	void *h = dlopen(cand, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL)
		return;
	if (dlsym(h, "cblas_sgemm") != NULL &&
	    dlsym(h, "cblas_dgemm") != NULL) {
		snprintf(c->blas, sizeof(c->blas), "%s", cand);
		char *(*corename)(void) = NULL;
		*(void **)&corename = dlsym(h, "openblas_get_corename");
		const char *core = corename != NULL ? corename() : NULL;
		c->blas_avx512 =
		    corename == NULL || (core != NULL && core_avx512(core));
		c->blas_kind = corename == NULL ? "other"
			       : c->blas_avx512 ? "openblas-avx512"
						: "openblas-pre-avx512";
	}
	dlclose(h);
}

/* Threads a compile optimizes and emits on: KILN_COMPILE_THREADS (1 to
 * CPU_PAR_MAX; anything else is an error naming it), else the CPUs this
 * process may run on, at most 4. Read once, when the compiler is made. */
static int compile_threads(int *out, char *err, size_t errlen)
{
	const char *env = getenv("KILN_COMPILE_THREADS");
	if (env != NULL && env[0] != '\0') {
		char *end;
		long n = strtol(env, &end, 10);
		if (*end != '\0' || n < 1 || n > CPU_PAR_MAX)
			return kiln__errf(err, errlen, KILN_EBADREQ,
					  "KILN_COMPILE_THREADS=\"%.40s\": "
					  "expected a count from 1 to %d",
					  env, CPU_PAR_MAX);
		*out = (int)n;
		return 0;
	}
	cpu_set_t set;
	int n =
	    sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	*out = n < 1 ? 1 : n > 4 ? 4 : n;
	return 0;
}

/* Whether a compile shares identical kernel bodies (codegen.c share_body):
 * KILN_SHARE_BODIES unset, empty or "1": yes; "0": no; anything else is an
 * error naming it (so that "off" does not silently leave it on). Read once,
 * when the compiler is made. */
static int share_bodies(bool *out, char *err, size_t errlen)
{
	const char *env = getenv("KILN_SHARE_BODIES");
	*out = true;
	if (env == NULL || env[0] == '\0' || strcmp(env, "1") == 0)
		return 0;
	if (strcmp(env, "0") == 0) {
		*out = false;
		return 0;
	}
	return kiln__errf(err, errlen, KILN_EBADREQ,
			  "KILN_SHARE_BODIES=\"%.40s\": expected 0 or 1", env);
}

/* The compiler's fingerprint (PROTOCOL.md § signature): what changes the
 * code it makes besides the graph, the target and the mode. */
static void set_fingerprint(kiln_compiler_t *c)
{
	unsigned maj, min, pat;
	LLVMGetVersion(&maj, &min, &pat);
	int n = snprintf(c->fingerprint, sizeof(c->fingerprint),
			 "kiln/%s llvm/%u.%u.%u build/%s blas/%s math/%s",
			 KILN_VERSION_STRING, maj, min, pat, KILN_BUILD_ID,
			 c->blas_kind, c->cpu.libmvec[0] ? "libmvec" : "poly");
	if (c->tmpl_block_a > 0 && n > 0 && (size_t)n < sizeof(c->fingerprint))
		n += snprintf(c->fingerprint + n,
			      sizeof(c->fingerprint) - (size_t)n,
			      " tblock/%lld", (long long)c->tmpl_block_a);
	if (c->no_conv_direct && n > 0 && (size_t)n < sizeof(c->fingerprint))
		snprintf(c->fingerprint + n, sizeof(c->fingerprint) - (size_t)n,
			 " nodirect");
}

int kiln_compiler_new(const kiln_target_t *target, kiln_compiler_t **out,
		      char *err, size_t errlen)
{
	*out = NULL;
	if (target != NULL && target->backend[0] != '\0' &&
	    strcmp(target->backend, "cpu") != 0)
		return kiln__errf(err, errlen, KILN_EUNSUPOP,
				  "backend \"%s\" is not available in this "
				  "build (cpu only)",
				  target->backend);
	kiln_compiler_t *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	int rc = compile_threads(&c->threads, err, errlen);
	if (rc == 0)
		rc = share_bodies(&c->share_bodies, err, errlen);
	if (rc == 0)
		rc = cpu_target_init(&c->cpu, target, err, errlen);
	if (rc != 0) {
		free(c);
		return rc;
	}
	probe_blas(c);
	c->tune = kiln__tune_cache_new();
	if (c->tune == NULL) {
		cpu_target_free(&c->cpu);
		free(c);
		return -ENOMEM;
	}
	set_fingerprint(c);
	*out = c;
	return 0;
}

void kiln__compiler_set_blas_avx512(kiln_compiler_t *c, bool avx512)
{
	if (c->blas[0] == '\0')
		return;
	c->blas_avx512 = avx512;
	c->blas_kind = avx512 ? "openblas-avx512" : "openblas-pre-avx512";
	set_fingerprint(c);
}

void kiln__compiler_set_conv_direct(kiln_compiler_t *c, bool on)
{
	c->no_conv_direct = !on;
	set_fingerprint(c);
}

void kiln__compiler_set_tmpl_block_a(kiln_compiler_t *c, int64_t bytes)
{
	c->tmpl_block_a = bytes > 0 ? bytes : 0;
	set_fingerprint(c);
}

void kiln_compiler_free(kiln_compiler_t *c)
{
	if (c == NULL)
		return;
	cpu_target_free(&c->cpu);
	kiln__tune_cache_free(c->tune);
	free(c);
}

const char *kiln_compiler_fingerprint(const kiln_compiler_t *c)
{
	return c->fingerprint;
}

const kiln_target_t *kiln_compiler_target(const kiln_compiler_t *c)
{
	return &c->cpu.target;
}

const char *kiln_compiler_linker(const kiln_compiler_t *c)
{
	return c->cpu.linker;
}

bool kiln_compiler_supports(const char *op)
{
	return kiln__op_supported(op);
}

/* ---- outputs ------------------------------------------------------------- */

/* Makes every graph output a view of an input or of an output buffer. */
static int lower_outputs(cctx_t *c, lt_t **outs)
{
	const kiln_graph_t *g = c->g;
	uint32_t n_out_bufs = 0;
	/* owner[b]: 1 + the value whose storage output buffer b is (the
	 * base its outputs view, cir_view_base); each output adds at most
	 * two buffers */
	uint32_t n_owner = c->n_bufs + 2 * g->n_outputs + 1;
	uint32_t *owner = cir_alloc(c, sizeof(uint32_t) * n_owner);
	if (owner == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->n_outputs; i++) {
		const kiln_arg_t *o = &g->outputs[i];
		outs[i] = NULL;
		if (o->kind != KILN_ARG_REF)
			continue;
		uint32_t v = o->u.ref;
		lt_t *t = c->vals[v];
		if (t == NULL)
			return cir_err(c, KILN_EINVGRAPH,
				       "output %u: value %u is not a tensor", i,
				       v);
		/* an output is a view of an input only when the graph made
		 * it one (view ops all the way back to the input); otherwise
		 * it is computed into a buffer laid out with the declared
		 * strides (AOTAutograd and the graphs that consume it, e.g. a
		 * backward, rely on them) */
		uint32_t base = cir_view_base(g, v);
		bool input_view = t->is_buf &&
				  c->bufs[t->buf].kind == CB_INPUT &&
				  g->values[base].producer < 0;
		if (!input_view) {
			const kiln_value_t *dv = &g->values[v];
			kiln_dim_t want[CIR_MAX_RANK];
			for (uint32_t k = 0; k < dv->rank; k++)
				want[k] = dim_of(ix_dim(c, dv->strides[k]));
			bool same = t->is_buf &&
				    c->bufs[t->buf].kind == CB_TEMP &&
				    t->rank == dv->rank;
			for (uint32_t k = 0; same && k < t->rank; k++)
				same = dim_is(t->sizes[k], 1) ||
				       dim_is(t->sizes[k], 0) ||
				       dim_eq(t->strides[k], want[k]);
			/* a buffer another value's outputs are views of (a
			 * clone's, lowered as the value itself) is torch's
			 * storage of that value, not this one's: a copy */
			bool taken = t->is_buf && t->buf < n_owner &&
				     owner[t->buf] != 0 &&
				     owner[t->buf] != base + 1;
			if (taken)
				same = false;
			if (!same && !taken && wants_nhwc(c, dv, t)) {
				/* written in NHWC order: a view of a new
				 * buffer (or of t's own where t is one) */
				int rc = lt_realize_nhwc(
				    c, t, g->values[v].producer, &t);
				if (rc != 0)
					return rc;
				same = true;
				for (uint32_t k = 0; same && k < t->rank; k++)
					same = dim_is(t->sizes[k], 1) ||
					       dim_eq(t->strides[k], want[k]);
			}
			if (!same) {
				const sx_t *b = lt_body(c, t);
				uint32_t nb = new_buf(c, CB_TEMP, t->dtype,
						      t->rank, t->sizes);
				int32_t ni = new_cnode(c);
				if (b == NULL || nb == UINT32_MAX || ni < 0)
					return -ENOMEM;
				for (uint32_t k = 0; k < t->rank; k++)
					c->bufs[nb].strides[k] = want[k];
				c->bufs[nb].custom_strides = true;
				cnode_t *cn = &c->nodes[ni];
				cn->buf = nb;
				cn->frank = t->rank;
				memcpy(cn->fsizes, t->sizes,
				       t->rank * sizeof(kiln_dim_t));
				cn->body = b;
				cn->node = g->values[v].producer;
				c->bufs[nb].producer = ni;
				t = lt_buf(c, nb);
				if (t == NULL)
					return -ENOMEM;
			}
		}
		cbuf_t *b = &c->bufs[t->buf];
		if (b->kind == CB_TEMP && !b->is_output) {
			b->is_output = true;
			b->out_index = (int32_t)n_out_bufs++;
		}
		if (b->kind == CB_TEMP && t->buf < n_owner &&
		    owner[t->buf] == 0)
			owner[t->buf] = base + 1;
		outs[i] = t;
	}
	return 0;
}

/* ---- artifact construction ---------------------------------------------- */

static const kiln_expr_t *copy_expr(kiln_arena_t *a, const kiln_expr_t *e)
{
	if (e == NULL)
		return NULL;
	kiln_expr_t *n = kiln_arena_alloc(a, sizeof(*n));
	if (n == NULL)
		return NULL;
	*n = *e;
	n->a = e->a ? copy_expr(a, e->a) : NULL;
	n->b = e->b ? copy_expr(a, e->b) : NULL;
	return n;
}

static kiln_dim_t copy_dim(kiln_arena_t *a, kiln_dim_t d)
{
	if (d.e != NULL)
		d.e = copy_expr(a, d.e);
	return d;
}

typedef struct abuild {
	cctx_t *c;
	kiln_artifact_t *a;
	int32_t *art_of; /* cbuf → artifact buffer id */
	uint32_t cap_views;
} abuild_t;

static int art_buffer(abuild_t *ab, uint32_t cb)
{
	if (ab->art_of[cb] >= 0)
		return ab->art_of[cb];
	cctx_t *c = ab->c;
	kiln_artifact_t *a = ab->a;
	const cbuf_t *b = &c->bufs[cb];
	kiln_art_buffer_t *ob = &a->buffers[a->n_buffers];
	memset(ob, 0, sizeof(*ob));
	if (b->kind == CB_INPUT) {
		ob->kind = KILN_BUF_INPUT;
		ob->index = (uint32_t)b->input;
	} else if (b->is_output) {
		ob->kind = KILN_BUF_OUTPUT;
		ob->index = (uint32_t)b->out_index;
	} else {
		ob->kind = KILN_BUF_ARENA;
	}
	if (b->kind != CB_INPUT) {
		const kiln_expr_t *n = ix_const(c, 1);
		if (b->custom_strides) {
			/* the extent of the strided layout */
			for (uint32_t k = 0; k < b->rank; k++)
				n = ix_add(
				    c, n,
				    ix_mul(c,
					   ix_sub(c, ix_dim(c, b->sizes[k]),
						  ix_const(c, 1)),
					   ix_dim(c, b->strides[k])));
			for (uint32_t k = 0; k < b->rank; k++)
				if (dim_is(b->sizes[k], 0))
					n = ix_const(c, 0);
		} else {
			for (uint32_t k = 0; k < b->rank; k++)
				n = ix_mul(c, n, ix_dim(c, b->sizes[k]));
		}
		n = ix_mul(c, n,
			   ix_const(c, (int64_t)kiln_dtype_size(b->dtype)));
		ob->bytes = copy_dim(a->arena, dim_of(n));
	}
	ab->art_of[cb] = (int32_t)a->n_buffers;
	return (int)a->n_buffers++;
}

static int art_view(abuild_t *ab, const lt_t *t)
{
	kiln_artifact_t *a = ab->a;
	if (a->n_views == ab->cap_views) {
		uint32_t nc = ab->cap_views ? ab->cap_views * 2 : 16;
		kiln_art_view_t *nv =
		    kiln_arena_calloc(a->arena, nc, sizeof(*nv));
		if (nv == NULL)
			return -ENOMEM;
		if (a->n_views)
			memcpy(nv, a->views, a->n_views * sizeof(*nv));
		a->views = nv;
		ab->cap_views = nc;
	}
	kiln_art_view_t *v = &a->views[a->n_views];
	v->buffer = (uint32_t)art_buffer(ab, t->buf);
	v->dtype = t->dtype;
	v->rank = t->rank;
	v->sizes = kiln_arena_calloc(a->arena, t->rank + 1, sizeof(kiln_dim_t));
	v->strides =
	    kiln_arena_calloc(a->arena, t->rank + 1, sizeof(kiln_dim_t));
	if (v->sizes == NULL || v->strides == NULL)
		return -ENOMEM;
	for (uint32_t k = 0; k < t->rank; k++) {
		v->sizes[k] = copy_dim(a->arena, t->sizes[k]);
		v->strides[k] = copy_dim(a->arena, t->strides[k]);
	}
	v->offset = copy_dim(a->arena, t->offset);
	return (int)a->n_views++;
}

/* Copies a fallback argument, refs becoming view ids. */
static int fb_arg(abuild_t *ab, const kiln_arg_t *in, kiln_arg_t *out,
		  int32_t kernel)
{
	cctx_t *c = ab->c;
	kiln_artifact_t *a = ab->a;
	*out = *in;
	switch (in->kind) {
	case KILN_ARG_STR:
		out->u.s = kiln_arena_strndup(a->arena, in->u.s, in->n);
		return out->u.s ? 0 : -ENOMEM;
	case KILN_ARG_SYM:
		out->u.sym = copy_expr(a->arena, in->u.sym);
		return out->u.sym ? 0 : -ENOMEM;
	case KILN_ARG_LIST:
		out->u.list =
		    kiln_arena_calloc(a->arena, in->n + 1, sizeof(kiln_arg_t));
		if (out->u.list == NULL)
			return -ENOMEM;
		for (uint32_t i = 0; i < in->n; i++) {
			int rc =
			    fb_arg(ab, &in->u.list[i], &out->u.list[i], kernel);
			if (rc != 0)
				return rc;
		}
		return 0;
	case KILN_ARG_REF: {
		const lt_t *t = c->vals[in->u.ref];
		if (t == NULL || !t->is_buf)
			return cir_err(c, KILN_EINTERNAL,
				       "fallback input %u is not a buffer",
				       in->u.ref);
		(void)kernel; /* marked by the scheduler */
		int v = art_view(ab, t);
		if (v < 0)
			return v;
		out->u.ref = (uint32_t)v;
		return 0;
	}
	default: return 0;
	}
}

/* Arena offsets by liveness: a buffer lives from its kernel to its last
 * reader; static sizes are packed first-fit, symbolic ones appended. */
int memplan(cctx_t *c, kiln_artifact_t *a)
{
	typedef struct slot {
		int64_t off, size;
		int32_t from, to;
	} slot_t;
	slot_t *slots = calloc(c->n_bufs + 1, sizeof(*slots));
	if (slots == NULL)
		return -ENOMEM;
	uint32_t ns = 0;
	int64_t top = 0;
	const kiln_expr_t *dyn_top = NULL;
	for (uint32_t i = 0; i < a->n_buffers; i++) {
		kiln_art_buffer_t *b = &a->buffers[i];
		if (b->kind != KILN_BUF_ARENA)
			continue;
		/* find the cbuf for liveness */
		int32_t from = 0, to = (int32_t)c->n_kernels;
		for (uint32_t cb = 0; cb < c->n_bufs; cb++)
			if (c->bufs[cb].art_buf == (int32_t)i) {
				from = c->bufs[cb].kernel;
				/* an epilogue runs inside the product before
				 * it (sched.c fuse_epilogues) */
				if (from > 0 && c->kernels[from].is_epilogue)
					from--;
				to = c->bufs[cb].last_use > from
					 ? c->bufs[cb].last_use
					 : from;
				break;
			}
		if (b->bytes.e != NULL) {
			const kiln_expr_t *base =
			    dyn_top ? dyn_top : ix_const(c, 0);
			b->offset = dim_of(base); /* after every static slot */
			const kiln_expr_t *sz = ix_intern(c, b->bytes.e);
			sz = ix_mul(c,
				    ix_floordiv(c,
						ix_add(c, sz, ix_const(c, 63)),
						ix_const(c, 64)),
				    ix_const(c, 64));
			dyn_top = ix_add(c, base, sz);
			continue;
		}
		int64_t size = (b->bytes.c + 63) / 64 * 64;
		if (size == 0)
			size = 64;
		/* first fit among offsets of slots not live at once */
		int64_t off = 0;
		for (;;) {
			bool clash = false;
			for (uint32_t s = 0; s < ns; s++) {
				slot_t *o = &slots[s];
				bool live = !(o->to < from || to < o->from);
				bool overlap = off < o->off + o->size &&
					       o->off < off + size;
				if (live && overlap) {
					off = o->off + o->size;
					clash = true;
				}
			}
			if (!clash)
				break;
		}
		slots[ns++] = (slot_t){off, size, from, to};
		b->offset = dim_const(off);
		if (off + size > top)
			top = off + size;
	}
	/* symbolic slots start after the static ones */
	for (uint32_t i = 0; i < a->n_buffers; i++) {
		kiln_art_buffer_t *b = &a->buffers[i];
		if (b->kind == KILN_BUF_ARENA && b->bytes.e != NULL) {
			const kiln_expr_t *o =
			    ix_add(c, ix_const(c, top), ix_dim(c, b->offset));
			b->offset = copy_dim(a->arena, dim_of(o));
		}
	}
	const kiln_expr_t *total = ix_const(c, top);
	if (dyn_top != NULL)
		total = ix_add(c, total, dyn_top);
	a->arena_bytes = copy_dim(a->arena, dim_of(total));
	free(slots);
	return 0;
}

static int bind_symbols(cctx_t *c, kiln_artifact_t *a)
{
	const kiln_graph_t *g = c->g;
	a->n_symbols = g->n_symbols;
	a->symbols = kiln_arena_calloc(a->arena, g->n_symbols + 1,
				       sizeof(kiln_symbol_t));
	a->bindings = kiln_arena_calloc(a->arena, g->n_symbols + 1,
					sizeof(kiln_art_binding_t));
	if (a->symbols == NULL || a->bindings == NULL)
		return -ENOMEM;
	for (uint32_t s = 0; s < g->n_symbols; s++) {
		a->symbols[s] = g->symbols[s];
		a->symbols[s].name = kiln_arena_strndup(
		    a->arena, g->symbols[s].name, strlen(g->symbols[s].name));
		bool found = false;
		for (uint32_t i = 0; i < g->n_inputs && !found; i++) {
			const kiln_value_t *v = &g->values[i];
			if (v->kind == KILN_VAL_SYMINT) {
				if (v->sym->kind == KILN_EX_SYM &&
				    v->sym->sym == s) {
					a->bindings[s] =
					    (kiln_art_binding_t){i, -1};
					found = true;
				}
				continue;
			}
			for (uint32_t d = 0; d < v->rank && !found; d++)
				if (v->sizes[d].e != NULL &&
				    v->sizes[d].e->kind == KILN_EX_SYM &&
				    v->sizes[d].e->sym == s) {
					a->bindings[s] =
					    (kiln_art_binding_t){i, (int32_t)d};
					found = true;
				}
		}
		if (!found)
			return cir_err(c, KILN_EINVGRAPH,
				       "symbol \"%s\" is not the size of any "
				       "input dim nor an int input, so it "
				       "cannot be bound at run time",
				       g->symbols[s].name);
	}
	return 0;
}

static int build_artifact(cctx_t *c, cpu_target_t *t, lt_t **outs,
			  const uint8_t *so, size_t solen,
			  kiln_artifact_t **out)
{
	const kiln_graph_t *g = c->g;
	kiln_arena_t *ar = kiln_arena_new(65536);
	if (ar == NULL)
		return -ENOMEM;
	kiln_artifact_t *a = kiln_arena_calloc(ar, 1, sizeof(*a));
	int32_t *art_of = calloc(c->n_bufs + 1, sizeof(int32_t));
	if (a == NULL || art_of == NULL) {
		free(art_of);
		kiln_arena_free(ar);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < c->n_bufs; i++)
		art_of[i] = -1;
	a->arena = ar;
	a->target = t->target;
	uint8_t *code = kiln_arena_alloc(ar, solen ? solen : 1);
	int rc = code ? 0 : -ENOMEM;
	if (rc == 0) {
		memcpy(code, so, solen);
		a->code = code;
		a->code_len = solen;
	}
	a->buffers =
	    kiln_arena_calloc(ar, c->n_bufs + 1, sizeof(kiln_art_buffer_t));
	a->kernels =
	    kiln_arena_calloc(ar, c->n_kernels + 1, sizeof(kiln_art_kernel_t));
	a->steps =
	    kiln_arena_calloc(ar, c->n_kernels + 1, sizeof(kiln_art_step_t));
	a->outputs =
	    kiln_arena_calloc(ar, g->n_outputs + 1, sizeof(kiln_arg_t));
	a->inputs =
	    kiln_arena_calloc(ar, g->n_inputs + 1, sizeof(kiln_value_t));
	if (a->buffers == NULL || a->kernels == NULL || a->steps == NULL ||
	    a->outputs == NULL || a->inputs == NULL)
		rc = -ENOMEM;
	abuild_t ab = {c, a, art_of, 0};
	/* inputs */
	for (uint32_t i = 0; rc == 0 && i < g->n_inputs; i++) {
		kiln_value_t *v = &a->inputs[i];
		*v = g->values[i];
		if (v->kind == KILN_VAL_SYMINT) {
			v->sym = copy_expr(ar, v->sym);
			continue;
		}
		v->sizes =
		    kiln_arena_calloc(ar, v->rank + 1, sizeof(kiln_dim_t));
		v->strides =
		    kiln_arena_calloc(ar, v->rank + 1, sizeof(kiln_dim_t));
		if (v->sizes == NULL || v->strides == NULL) {
			rc = -ENOMEM;
			break;
		}
		for (uint32_t k = 0; k < v->rank; k++) {
			v->sizes[k] = copy_dim(ar, g->values[i].sizes[k]);
			v->strides[k] = copy_dim(ar, g->values[i].strides[k]);
		}
	}
	a->n_inputs = g->n_inputs;
	if (rc == 0)
		rc = bind_symbols(c, a);
	/* steps */
	for (uint32_t ki = 0; rc == 0 && ki < c->n_kernels; ki++) {
		kernel_t *k = &c->kernels[ki];
		if (k->is_epilogue)
			continue; /* run by the product kernel before it */
		kiln_art_step_t *st = &a->steps[a->n_steps++];
		if (k->is_fallback) {
			const cnode_t *n = &c->nodes[k->members[0].node];
			const kiln_node_t *nd = &g->nodes[n->node];
			st->kind = KILN_STEP_FALLBACK;
			st->node = n->node;
			st->op = kiln_arena_strndup(ar, nd->op, strlen(nd->op));
			st->n_args = nd->n_args;
			st->n_kwargs = nd->n_kwargs;
			st->args = kiln_arena_calloc(ar, nd->n_args + 1,
						     sizeof(kiln_arg_t));
			st->kwargs = kiln_arena_calloc(ar, nd->n_kwargs + 1,
						       sizeof(kiln_kwarg_t));
			st->out = kiln_arena_calloc(ar, n->n_fbout + 1,
						    sizeof(uint32_t));
			if (st->op == NULL || st->args == NULL ||
			    st->kwargs == NULL || st->out == NULL) {
				rc = -ENOMEM;
				break;
			}
			for (uint32_t i = 0; rc == 0 && i < nd->n_args; i++)
				rc = fb_arg(&ab, &nd->args[i], &st->args[i],
					    (int32_t)ki);
			for (uint32_t i = 0; rc == 0 && i < nd->n_kwargs; i++) {
				st->kwargs[i].key = kiln_arena_strndup(
				    ar, nd->kwargs[i].key,
				    strlen(nd->kwargs[i].key));
				rc = fb_arg(&ab, &nd->kwargs[i].val,
					    &st->kwargs[i].val, (int32_t)ki);
			}
			st->n_out = 0;
			for (uint32_t j = 0; rc == 0 && j < n->n_fbout; j++) {
				if (n->fbout[j] == UINT32_MAX)
					continue;
				lt_t *bt = lt_buf(c, n->fbout[j]);
				int v = bt ? art_view(&ab, bt) : -ENOMEM;
				if (v < 0)
					rc = v;
				else
					st->out[st->n_out++] = (uint32_t)v;
			}
			continue;
		}
		kiln_art_kernel_t *ak = &a->kernels[a->n_kernels];
		ak->name = kiln_arena_strndup(ar, k->name, strlen(k->name));
		ak->extent = copy_dim(ar, k->extent);
		ak->grain = k->grain;
		ak->n_bufs = k->n_args;
		st->kind = KILN_STEP_KERNEL;
		st->node =
		    k->n_members ? c->nodes[k->members[0].node].node : -1;
		st->kernel = a->n_kernels++;
		st->n_bufs = k->n_args;
		st->bufs =
		    kiln_arena_calloc(ar, k->n_args + 1, sizeof(uint32_t));
		if (st->bufs == NULL || ak->name == NULL) {
			rc = -ENOMEM;
			break;
		}
		for (uint32_t i = 0; i < k->n_args; i++)
			st->bufs[i] = (uint32_t)art_buffer(&ab, k->args[i]);
	}
	/* outputs */
	a->n_outputs = g->n_outputs;
	for (uint32_t i = 0; rc == 0 && i < g->n_outputs; i++) {
		if (g->outputs[i].kind == KILN_ARG_SYM) {
			a->outputs[i].kind = KILN_ARG_SYM;
			a->outputs[i].u.sym =
			    copy_expr(ar, g->outputs[i].u.sym);
			continue;
		}
		int v = art_view(&ab, outs[i]);
		if (v < 0) {
			rc = v;
			break;
		}
		a->outputs[i].kind = KILN_ARG_REF;
		a->outputs[i].u.ref = (uint32_t)v;
	}
	uint32_t nob = 0;
	for (uint32_t i = 0; i < c->n_bufs; i++) {
		c->bufs[i].art_buf = art_of[i];
		if (c->bufs[i].is_output && art_of[i] >= 0)
			nob++;
	}
	a->n_out_buffers = nob;
	if (rc == 0)
		rc = memplan(c, a);
	free(art_of);
	if (rc != 0) {
		kiln_arena_free(ar);
		return rc;
	}
	*out = a;
	return 0;
}

/* ---- the pipeline -------------------------------------------------------- */

/* Whether a size of value v is symbolic. */
static bool value_symbolic(const kiln_graph_t *g, uint32_t v)
{
	const kiln_value_t *x = &g->values[v];
	if (x->kind != KILN_VAL_TENSOR)
		return false;
	for (uint32_t k = 0; k < x->rank; k++)
		if (x->sizes[k].e != NULL)
			return true;
	return false;
}

static bool arg_symbolic(const kiln_graph_t *g, const kiln_arg_t *a)
{
	if (a->kind == KILN_ARG_REF)
		return value_symbolic(g, a->u.ref);
	if (a->kind == KILN_ARG_SYM)
		return true;
	if (a->kind == KILN_ARG_LIST)
		for (uint32_t i = 0; i < a->n; i++)
			if (arg_symbolic(g, &a->u.list[i]))
				return true;
	return false;
}

/* Whether graph node ni reads or makes a tensor of a symbolic size, or
 * takes a symbolic argument. */
static bool node_symbolic(const kiln_graph_t *g, int32_t ni)
{
	if (ni < 0 || g->n_symbols == 0)
		return false;
	const kiln_node_t *nd = &g->nodes[ni];
	for (uint32_t i = 0; i < nd->n_args; i++)
		if (arg_symbolic(g, &nd->args[i]))
			return true;
	for (uint32_t i = 0; i < nd->n_kwargs; i++)
		if (arg_symbolic(g, &nd->kwargs[i].val))
			return true;
	for (uint32_t k = 0; k < nd->n_out; k++)
		if (value_symbolic(g, nd->out_first + k))
			return true;
	return false;
}

static int front(cctx_t *c, lt_t **outs, kiln_compile_stats_t *st)
{
	double t0 = kiln__now_ms();
	int rc = lower_graph(c);
	if (rc == 0)
		rc = lower_outputs(c, outs);
	double t1 = kiln__now_ms();
	if (rc == 0)
		rc = sched_graph(c);
	double t2 = kiln__now_ms();
	if (st != NULL) {
		st->lower_ms = t1 - t0;
		st->sched_ms = t2 - t1;
	}
	return rc;
}

static void cctx_init(cctx_t *c, kiln_compiler_t *kc, const kiln_graph_t *g,
		      char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	c->g = g;
	c->target = &kc->cpu.target;
	c->err = err;
	c->errlen = errlen;
	c->vec_width = kc->cpu.vec_width;
	c->use_libmvec = kc->cpu.libmvec[0] != '\0';
	const char *nf = getenv("KILN_NOFUSE");
	c->nofuse = nf != NULL && nf[0] == '1';
	c->hint_default = 64;
	c->blas = kc->blas[0] ? kc->blas : NULL;
	c->blas_avx512 = kc->blas_avx512;
	c->tmpl_block_a = kc->tmpl_block_a;
	c->no_conv_direct = kc->no_conv_direct;
}

static void cctx_free(cctx_t *c)
{
	free(c->ex_tab);
	free(c->sx_tab);
	kiln_arena_free(c->arena);
}

/* One module of a compile: O3 then the object, on whichever thread
 * claims it. */
typedef struct part {
	LLVMContextRef ctx;
	LLVMModuleRef mod;
	uint8_t *obj;
	size_t objlen;
	double opt_ms, emit_ms;
	int rc;
	char err[512];
} part_t;

/* The threads of a compile claim modules in turn (there are about twice
 * as many modules as threads: a module's IR size predicts its O3 time only
 * roughly, and the one that takes longest should not hold the others). */
typedef struct crew {
	cpu_target_t *cpu;
	part_t *parts;
	int n;
	_Atomic int next;
} crew_t;

typedef struct hand {
	crew_t *crew;
	LLVMTargetMachineRef tm; /* this thread's */
} hand_t;

static void *crew_run(void *arg)
{
	hand_t *h = arg;
	crew_t *cw = h->crew;
	int i;
	while ((i = atomic_fetch_add(&cw->next, 1)) < cw->n) {
		part_t *p = &cw->parts[i];
		double t0 = kiln__now_ms();
		p->rc = cpu_optimize(cw->cpu, h->tm, p->mod, p->err,
				     sizeof(p->err));
		double t1 = kiln__now_ms();
		p->opt_ms = t1 - t0;
		if (p->rc == 0)
			p->rc = cpu_emit(h->tm, p->mod, false, &p->obj,
					 &p->objlen, p->err, sizeof(p->err));
		p->emit_ms = kiln__now_ms() - t1;
	}
	return NULL;
}

int kiln_compile_ex(kiln_compiler_t *kc, const kiln_graph_t *g,
		    const kiln_compile_opts_t *opts, kiln_artifact_t **out,
		    char **text, int emit, kiln_compile_stats_t *st, char *err,
		    size_t errlen)
{
	if (opts == NULL || strcmp(opts->mode, "max-autotune") != 0 ||
	    g->n_nodes == 0)
		return kiln__compile_tuned(kc, g, NULL, NULL, out, text, emit,
					   st, err, errlen);
	if (out)
		*out = NULL;
	if (text)
		*text = NULL;
	int8_t *tune = malloc(g->n_nodes);
	char(*why)[KILN_TUNE_WHY] = malloc(g->n_nodes * sizeof(*why));
	int rc = tune && why ? kiln__autotune(kc, kc->tune, g, tune, why)
			     : kiln__errf(err, errlen, -ENOMEM,
					  "max-autotune: out of memory");
	if (rc == 0)
		rc = kiln__compile_tuned(kc, g, tune, why, out, text, emit, st,
					 err, errlen);
	free(tune);
	free(why);
	return rc;
}

int kiln__compile_tuned(kiln_compiler_t *kc, const kiln_graph_t *g,
			const int8_t *tune, char (*why)[KILN_TUNE_WHY],
			kiln_artifact_t **out, char **text, int emit,
			kiln_compile_stats_t *st, char *err, size_t errlen)
{
	if (out)
		*out = NULL;
	if (text)
		*text = NULL;
	kiln_compile_stats_t lst;
	if (st == NULL)
		st = &lst;
	memset(st, 0, sizeof(*st));
	double t0 = kiln__now_ms();
	cctx_t c;
	cctx_init(&c, kc, g, err, errlen);
	c.tune = tune;
	c.tune_why = why;
	c.arena = kiln_arena_new(1 << 16);
	if (c.arena == NULL)
		return -ENOMEM;
	lt_t **outs =
	    kiln_arena_calloc(c.arena, g->n_outputs + 1, sizeof(lt_t *));
	int rc = outs ? front(&c, outs, st) : -ENOMEM;
	if (rc != 0) {
		cctx_free(&c);
		return rc;
	}
	for (uint32_t i = 0; i < c.n_kernels; i++) {
		if (c.kernels[i].is_fallback) {
			const cnode_t *n =
			    &c.nodes[c.kernels[i].members[0].node];
			st->n_fallbacks++;
			if (n->fb_why != NULL && node_symbolic(g, n->node))
				st->n_sym_fallbacks++;
		} else if (!c.kernels[i].is_epilogue)
			st->n_kernels++;
		else
			st->n_epilogues++;
	}
	if (emit == KILN_EMIT_KERNELS || emit == KILN_EMIT_IR) {
		*text = emit == KILN_EMIT_IR ? sched_ir(&c) : sched_report(&c);
		cctx_free(&c);
		return *text ? 0 : -ENOMEM;
	}
	double t1 = kiln__now_ms();
	/* nt threads (text output: one), np modules: twice as many, at
	 * most one per kernel */
	int nt = emit == KILN_EMIT_ARTIFACT ? kc->threads : 1;
	if ((uint32_t)nt > st->n_kernels)
		nt = st->n_kernels > 0 ? (int)st->n_kernels : 1;
	for (int t = 1; t < nt; t++)
		if (cpu_tm(&kc->cpu, t) == NULL)
			nt = t;
	int np = nt == 1 ? 1 : 2 * nt;
	if (np > CPU_PAR_MAX)
		np = CPU_PAR_MAX;
	if ((uint32_t)np > st->n_kernels)
		np = st->n_kernels > 0 ? (int)st->n_kernels : 1;
	part_t parts[CPU_PAR_MAX];
	void *ctxs[CPU_PAR_MAX], *mods[CPU_PAR_MAX];
	memset(parts, 0, sizeof(parts));
	for (int p = 0; p < np; p++) {
		parts[p].ctx = LLVMContextCreate();
		parts[p].mod =
		    LLVMModuleCreateWithNameInContext("kiln", parts[p].ctx);
		cpu_prepare_module(&kc->cpu, parts[p].mod);
		ctxs[p] = parts[p].ctx;
		mods[p] = parts[p].mod;
	}
	rc = codegen_modules(&c, np, ctxs, mods, kc->share_bodies,
			     &st->n_shared);
	double t2 = kiln__now_ms();
	st->codegen_ms = t2 - t1;
	if (rc == 0 && emit == KILN_EMIT_LLVM_RAW) {
		*text = LLVMPrintModuleToString(parts[0].mod);
		char *copy = *text ? strdup(*text) : NULL;
		LLVMDisposeMessage(*text);
		*text = copy;
		goto done;
	}
	if (rc == 0 && (emit == KILN_EMIT_LLVM || emit == KILN_EMIT_ASM)) {
		rc = cpu_optimize(&kc->cpu, kc->cpu.tm, parts[0].mod, err,
				  errlen);
		double t3 = kiln__now_ms();
		st->opt_ms = t3 - t2;
		if (rc == 0 && emit == KILN_EMIT_LLVM) {
			char *s = LLVMPrintModuleToString(parts[0].mod);
			*text = s ? strdup(s) : NULL;
			LLVMDisposeMessage(s);
		} else if (rc == 0) {
			uint8_t *obj = NULL;
			size_t objlen = 0;
			rc = cpu_emit(kc->cpu.tm, parts[0].mod, true, &obj,
				      &objlen, err, errlen);
			*text = (char *)obj;
			st->emit_ms = kiln__now_ms() - t3;
		}
		goto done;
	}
	/* optimize and emit: helper threads 1.. and this one claim modules */
	crew_t crew = {&kc->cpu, parts, np, 0};
	hand_t hands[CPU_PAR_MAX];
	pthread_t th[CPU_PAR_MAX];
	bool started[CPU_PAR_MAX] = {false};
	for (int t = 0; t < nt; t++)
		hands[t] = (hand_t){&crew, cpu_tm(&kc->cpu, t)};
	for (int t = 1; t < nt && rc == 0; t++)
		started[t] =
		    pthread_create(&th[t], NULL, crew_run, &hands[t]) == 0;
	if (rc == 0)
		crew_run(&hands[0]);
	for (int t = 1; t < nt; t++)
		if (started[t])
			pthread_join(th[t], NULL);
	double t4 = kiln__now_ms();
	uint8_t *objs[CPU_PAR_MAX];
	size_t lens[CPU_PAR_MAX];
	double sum_opt = 0, sum_emit = 0;
	for (int p = 0; p < np && rc == 0; p++) {
		sum_opt += parts[p].opt_ms;
		sum_emit += parts[p].emit_ms;
		if (parts[p].rc != 0) {
			rc = parts[p].rc;
			snprintf(err, errlen, "%s", parts[p].err);
		}
		objs[p] = parts[p].obj;
		lens[p] = parts[p].objlen;
	}
	/* the wall time of the parallel phase, split in the two phases'
	 * proportion */
	st->opt_ms = sum_opt + sum_emit > 0
			 ? (t4 - t2) * sum_opt / (sum_opt + sum_emit)
			 : 0;
	st->emit_ms = t4 - t2 - st->opt_ms;
	uint8_t *so = NULL;
	size_t solen = 0;
	if (rc == 0)
		rc = cpu_link(&kc->cpu, np, objs, lens, &so, &solen, err,
			      errlen);
	double t5 = kiln__now_ms();
	st->link_ms = t5 - t4;
	if (rc == 0)
		rc = build_artifact(&c, &kc->cpu, outs, so, solen, out);
	if (rc == 0 && *out != NULL) {
		char *rep = sched_report(&c);
		if (rep != NULL) {
			(*out)->kernels_text =
			    kiln_arena_strndup((*out)->arena, rep, strlen(rep));
			free(rep);
		}
	}
	free(so);
done:
	for (int p = 0; p < np; p++) {
		free(parts[p].obj);
		LLVMDisposeModule(parts[p].mod);
		LLVMContextDispose(parts[p].ctx);
	}
	cctx_free(&c);
	st->total_ms = kiln__now_ms() - t0;
	return rc;
}

int kiln_compile(kiln_compiler_t *kc, const kiln_graph_t *g,
		 const kiln_compile_opts_t *opts, kiln_artifact_t **out,
		 kiln_compile_stats_t *stats, char *err, size_t errlen)
{
	return kiln_compile_ex(kc, g, opts, out, NULL, KILN_EMIT_ARTIFACT,
			       stats, err, errlen);
}
