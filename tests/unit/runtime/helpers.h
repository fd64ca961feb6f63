/*
 * helpers.h — shared helpers for the runtime unit tests: an artifact
 * builder (ab_*) that assembles a kiln_artifact_t in C around the bytes of
 * the test kernels' shared object, packs it, and decodes or loads it; and
 * top-level field surgery on packed artifacts for the decoder's rejection
 * tests (text notation from ../protocol/helpers.h).
 *
 * Dimensions are written as GRAPH.md expression strings ("s0", "4*s0",
 * "16"); shapes as comma-separated lists of them ("s0, 4"). Every function
 * is static and used by some test files only.
 */
#ifndef KILN_TEST_RUNTIME_HELPERS_H
#define KILN_TEST_RUNTIME_HELPERS_H

#include "../protocol/helpers.h"
#include "clients/libkiln/kiln.h"
#include "protocol/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define AB_MAX	     64
#define AB_MAX_STEPS 4096

typedef struct ab {
	kiln_arena_t *ar;
	kiln_artifact_t *a; /* tables of AB_MAX entries (steps: AB_MAX_STEPS) */
} ab_t;

/* The bytes of a file (malloc'd; free()). */
HELPER uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
	cr_assert_not_null(p);
	cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return p;
}

/* A new CPU artifact whose code is the file at so_path (NULL: no code). */
HELPER ab_t ab_new(const char *so_path)
{
	ab_t b;
	b.ar = kiln_arena_new(1 << 16);
	cr_assert_not_null(b.ar);
	kiln_artifact_t *a = kiln_arena_calloc(b.ar, 1, sizeof(*a));
	b.a = a;
	snprintf(a->target.backend, sizeof(a->target.backend), "cpu");
	snprintf(a->target.arch, sizeof(a->target.arch), "x86-64");
	if (so_path != NULL) {
		size_t n;
		uint8_t *p = read_file(so_path, &n);
		uint8_t *q = kiln_arena_alloc(b.ar, n);
		memcpy(q, p, n);
		free(p);
		a->code = q;
		a->code_len = n;
	}
	a->symbols = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_symbol_t));
	a->bindings =
	    kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_art_binding_t));
	a->inputs = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_value_t));
	a->kernels = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_art_kernel_t));
	a->buffers = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_art_buffer_t));
	a->views = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_art_view_t));
	a->steps =
	    kiln_arena_calloc(b.ar, AB_MAX_STEPS, sizeof(kiln_art_step_t));
	a->outputs = kiln_arena_calloc(b.ar, AB_MAX, sizeof(kiln_arg_t));
	return b;
}

HELPER void ab_free(ab_t *b)
{
	kiln_arena_free(b->ar);
	b->ar = NULL;
	b->a = NULL;
}

/* Parses one dimension expression over the symbols declared so far. */
HELPER kiln_dim_t ab_dim(ab_t *b, const char *s)
{
	kiln__expr_ctx_t ex = {b->ar, b->a->symbols, b->a->n_symbols, 64};
	const kiln_expr_t *e;
	char err[256];
	int rc = kiln__expr_parse(&ex, s, strlen(s), &e, err, sizeof(err));
	cr_assert_eq(rc, 0, "bad test expression \"%s\": %s", s, err);
	kiln_dim_t d = {0, NULL};
	if (e->kind == KILN_EX_CONST)
		d.c = e->c;
	else
		d.e = e;
	return d;
}

/* Parses "d0, d1, ..." (commas inside parentheses do not split) into a new
 * array; returns the count. */
HELPER uint32_t ab_dims(ab_t *b, const char *s, kiln_dim_t **out)
{
	*out = kiln_arena_calloc(b->ar, KILN_MAX_RANK_HARD, sizeof(kiln_dim_t));
	uint32_t n = 0;
	const char *p = s;
	while (*p == ' ')
		p++;
	if (*p == '\0')
		return 0;
	for (;;) {
		const char *e = p;
		int depth = 0;
		while (*e != '\0' && !(*e == ',' && depth == 0)) {
			depth += *e == '(' ? 1 : *e == ')' ? -1 : 0;
			e++;
		}
		char tmp[128];
		cr_assert_lt((size_t)(e - p), sizeof(tmp));
		memcpy(tmp, p, (size_t)(e - p));
		tmp[e - p] = '\0';
		cr_assert_lt(n, KILN_MAX_RANK_HARD);
		(*out)[n++] = ab_dim(b, tmp);
		if (*e == '\0')
			return n;
		p = e + 1;
	}
}

/* Declares a symbol and binds it to input `input` size `dim` (-1: the int
 * input itself). Declare symbols before the inputs that use them; the
 * binding may name an input added later. */
HELPER uint32_t ab_sym(ab_t *b, const char *name, int64_t min, int64_t max,
		       uint32_t input, int32_t dim)
{
	kiln_artifact_t *a = b->a;
	uint32_t i = a->n_symbols++;
	a->symbols[i].name = kiln_arena_strndup(b->ar, name, strlen(name));
	a->symbols[i].min = min;
	a->symbols[i].max = max;
	a->symbols[i].hint = -1;
	a->bindings[i].input = input;
	a->bindings[i].dim = dim;
	return i;
}

/* A tensor input; strides NULL: contiguous (not written on the wire). */
HELPER uint32_t ab_input(ab_t *b, kiln_dtype_t dt, const char *shape,
			 const char *strides)
{
	kiln_artifact_t *a = b->a;
	uint32_t i = a->n_inputs++;
	kiln_value_t *v = &a->inputs[i];
	v->kind = KILN_VAL_TENSOR;
	v->producer = -1;
	v->dtype = dt;
	v->rank = ab_dims(b, shape, &v->sizes);
	v->strides_given = strides != NULL;
	if (strides != NULL) {
		cr_assert_eq(ab_dims(b, strides, &v->strides), v->rank);
	} else {
		/* contiguous, constant only (what the tests' checks need) */
		v->strides = kiln_arena_calloc(b->ar, KILN_MAX_RANK_HARD,
					       sizeof(kiln_dim_t));
	}
	return i;
}

/* An int (SymInt) input equal to expr. */
HELPER uint32_t ab_input_int(ab_t *b, const char *expr)
{
	kiln_artifact_t *a = b->a;
	uint32_t i = a->n_inputs++;
	kiln_value_t *v = &a->inputs[i];
	v->kind = KILN_VAL_SYMINT;
	v->producer = -1;
	kiln_dim_t d = ab_dim(b, expr);
	v->sym = d.e != NULL
		     ? d.e
		     : kiln__expr_new(b->ar, KILN_EX_CONST, d.c, 0, NULL, NULL);
	return i;
}

HELPER uint32_t ab_kernel(ab_t *b, const char *name, const char *extent,
			  int64_t grain, uint32_t n_bufs)
{
	kiln_artifact_t *a = b->a;
	uint32_t k = a->n_kernels++;
	a->kernels[k].name = kiln_arena_strndup(b->ar, name, strlen(name));
	a->kernels[k].extent = ab_dim(b, extent);
	a->kernels[k].grain = grain;
	a->kernels[k].n_bufs = n_bufs;
	return k;
}

HELPER uint32_t ab_buf_input(ab_t *b, uint32_t input)
{
	uint32_t i = b->a->n_buffers++;
	b->a->buffers[i].kind = KILN_BUF_INPUT;
	b->a->buffers[i].index = input;
	return i;
}

/* The next output buffer, of `bytes`. */
HELPER uint32_t ab_buf_output(ab_t *b, const char *bytes)
{
	uint32_t i = b->a->n_buffers++;
	b->a->buffers[i].kind = KILN_BUF_OUTPUT;
	b->a->buffers[i].index = b->a->n_out_buffers++;
	b->a->buffers[i].bytes = ab_dim(b, bytes);
	return i;
}

HELPER uint32_t ab_buf_arena(ab_t *b, const char *offset, const char *bytes)
{
	uint32_t i = b->a->n_buffers++;
	b->a->buffers[i].kind = KILN_BUF_ARENA;
	b->a->buffers[i].offset = ab_dim(b, offset);
	b->a->buffers[i].bytes = ab_dim(b, bytes);
	return i;
}

HELPER uint32_t ab_view(ab_t *b, uint32_t buffer, kiln_dtype_t dt,
			const char *shape, const char *strides,
			const char *offset)
{
	uint32_t i = b->a->n_views++;
	kiln_art_view_t *v = &b->a->views[i];
	v->buffer = buffer;
	v->dtype = dt;
	v->rank = ab_dims(b, shape, &v->sizes);
	cr_assert_eq(ab_dims(b, strides, &v->strides), v->rank);
	v->offset = ab_dim(b, offset);
	return i;
}

/* A kernel step over n buffers (varargs: uint32_t buffer ids). */
HELPER uint32_t ab_kstep(ab_t *b, uint32_t kernel, uint32_t n, ...)
{
	kiln_artifact_t *a = b->a;
	cr_assert_lt(a->n_steps, AB_MAX_STEPS);
	uint32_t s = a->n_steps++;
	kiln_art_step_t *st = &a->steps[s];
	st->kind = KILN_STEP_KERNEL;
	st->node = (int32_t)s;
	st->kernel = kernel;
	st->n_bufs = n;
	st->bufs = kiln_arena_calloc(b->ar, n ? n : 1, sizeof(uint32_t));
	va_list ap;
	va_start(ap, n);
	for (uint32_t j = 0; j < n; j++)
		st->bufs[j] = va_arg(ap, uint32_t);
	va_end(ap);
	return s;
}

/* A fallback step: args = [{"ref": in_view}, 2.5, [1, {"ref": in_view}]],
 * kwargs = {"alpha": 3, "mode": "x"}, out = [out_view]. */
HELPER uint32_t ab_fstep(ab_t *b, int32_t node, const char *op,
			 uint32_t in_view, uint32_t out_view)
{
	kiln_artifact_t *a = b->a;
	uint32_t s = a->n_steps++;
	kiln_art_step_t *st = &a->steps[s];
	st->kind = KILN_STEP_FALLBACK;
	st->node = node;
	st->op = kiln_arena_strndup(b->ar, op, strlen(op));
	st->n_args = 3;
	st->args = kiln_arena_calloc(b->ar, 3, sizeof(kiln_arg_t));
	st->args[0].kind = KILN_ARG_REF;
	st->args[0].u.ref = in_view;
	st->args[1].kind = KILN_ARG_FLOAT;
	st->args[1].u.f = 2.5;
	st->args[2].kind = KILN_ARG_LIST;
	st->args[2].n = 2;
	st->args[2].u.list = kiln_arena_calloc(b->ar, 2, sizeof(kiln_arg_t));
	st->args[2].u.list[0].kind = KILN_ARG_INT;
	st->args[2].u.list[0].u.i = 1;
	st->args[2].u.list[1].kind = KILN_ARG_REF;
	st->args[2].u.list[1].u.ref = in_view;
	st->n_kwargs = 2;
	st->kwargs = kiln_arena_calloc(b->ar, 2, sizeof(kiln_kwarg_t));
	st->kwargs[0].key = "alpha";
	st->kwargs[0].val.kind = KILN_ARG_INT;
	st->kwargs[0].val.u.i = 3;
	st->kwargs[1].key = "mode";
	st->kwargs[1].val.kind = KILN_ARG_STR;
	st->kwargs[1].val.n = 1;
	st->kwargs[1].val.u.s = "x";
	st->n_out = 1;
	st->out = kiln_arena_calloc(b->ar, 1, sizeof(uint32_t));
	st->out[0] = out_view;
	return s;
}

HELPER void ab_out_ref(ab_t *b, uint32_t view)
{
	kiln_arg_t *o = &b->a->outputs[b->a->n_outputs++];
	o->kind = KILN_ARG_REF;
	o->u.ref = view;
}

HELPER void ab_out_sym(ab_t *b, const char *expr)
{
	kiln_arg_t *o = &b->a->outputs[b->a->n_outputs++];
	kiln_dim_t d = ab_dim(b, expr);
	o->kind = KILN_ARG_SYM;
	o->u.sym = d.e != NULL ? d.e
			       : kiln__expr_new(b->ar, KILN_EX_CONST, d.c, 0,
						NULL, NULL);
}

HELPER void ab_arena(ab_t *b, const char *bytes)
{
	b->a->arena_bytes = ab_dim(b, bytes);
}

/* Packs the artifact into sb (initialised here; destroy after). */
HELPER void ab_pack(const ab_t *b, msgpack_sbuffer *sb)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	cr_assert_eq(kiln_artifact_pack(b->a, &pk), 0);
}

/* Packs and decodes; returns the decoder's code. */
HELPER int ab_decode(const ab_t *b, kiln_artifact_t **out, char *err,
		     size_t errlen)
{
	msgpack_sbuffer sb;
	ab_pack(b, &sb);
	int rc = kiln_artifact_decode((const uint8_t *)sb.data, sb.size, NULL,
				      out, err, errlen);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

/* Asserts the packed artifact is rejected with code and a message that
 * contains needle. */
HELPER void ab_reject(const ab_t *b, int code, const char *needle)
{
	char err[512] = "";
	kiln_artifact_t *a = (kiln_artifact_t *)(uintptr_t)1;
	int rc = ab_decode(b, &a, err, sizeof(err));
	cr_assert_eq(rc, code, "rc %d (%s), expected %d (%s); message \"%s\"",
		     rc, kiln_strerror(rc), code, kiln_strerror(code), err);
	cr_assert_null(a, "*out must be NULL on error");
	cr_assert_not_null(strstr(err, needle),
			   "message \"%s\" does not contain \"%s\"", err,
			   needle);
}

/* Pack -> decode -> load; asserts success. */
HELPER kiln_module_t *ab_load(const ab_t *b)
{
	msgpack_sbuffer sb;
	ab_pack(b, &sb);
	char err[512] = "";
	kiln_module_t *m = NULL;
	int rc = kiln_module_load((const uint8_t *)sb.data, sb.size, NULL, &m,
				  err, sizeof(err));
	msgpack_sbuffer_destroy(&sb);
	cr_assert_eq(rc, 0, "load failed: %d (%s): %s", rc, kiln_strerror(rc),
		     err);
	cr_assert_not_null(m);
	return m;
}

/* Re-packs the packed artifact `in` with top-level field `key` replaced by
 * the mp text `text` (NULL: removed; a key not present: added). */
HELPER void art_edit(const msgpack_sbuffer *in, const char *key,
		     const char *text, msgpack_sbuffer *out)
{
	msgpack_zone zone;
	cr_assert(msgpack_zone_init(&zone, 4096));
	msgpack_object obj;
	size_t off = 0;
	cr_assert_eq(msgpack_unpack(in->data, in->size, &off, &zone, &obj),
		     MSGPACK_UNPACK_SUCCESS);
	mp_obj_t rep;
	const msgpack_object *val = text != NULL ? mp_obj(&rep, text) : NULL;
	msgpack_sbuffer_init(out);
	msgpack_packer pk;
	msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
	uint32_t n = obj.via.map.size;
	bool found = false;
	for (uint32_t i = 0; i < n; i++)
		found |= kiln_obj_streq(&obj.via.map.ptr[i].key, key);
	msgpack_pack_map(&pk, n - (found && val == NULL) + (!found && val));
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object_kv *kv = &obj.via.map.ptr[i];
		if (kiln_obj_streq(&kv->key, key)) {
			if (val == NULL)
				continue;
			msgpack_pack_object(&pk, kv->key);
			msgpack_pack_object(&pk, *val);
		} else {
			msgpack_pack_object(&pk, kv->key);
			msgpack_pack_object(&pk, kv->val);
		}
	}
	if (!found && val != NULL) {
		kiln_pack_cstr(&pk, key);
		msgpack_pack_object(&pk, *val);
	}
	if (val != NULL)
		mp_obj_free(&rep);
	msgpack_zone_destroy(&zone);
}

/* A contiguous tensor over data with sizes[0 .. rank). */
HELPER kiln_io_t io_tensor(void *data, kiln_dtype_t dt, uint32_t rank,
			   const int64_t *sizes)
{
	kiln_io_t io;
	memset(&io, 0, sizeof(io));
	io.kind = KILN_IO_TENSOR;
	io.t.data = data;
	io.t.dtype = dt;
	io.t.rank = rank;
	int64_t s = 1;
	for (uint32_t i = rank; i-- > 0;) {
		io.t.sizes[i] = sizes[i];
		io.t.strides[i] = s;
		s *= sizes[i] > 1 ? sizes[i] : 1;
	}
	return io;
}

/* IOT(data, KILN_DT_F32, 4, 8): a contiguous [4, 8] tensor. */
#define IOT(data, dt, ...)                                                     \
	io_tensor(                                                             \
	    (data), (dt),                                                      \
	    (uint32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),    \
	    (int64_t[]){__VA_ARGS__})

HELPER kiln_io_t io_int(int64_t v)
{
	kiln_io_t io;
	memset(&io, 0, sizeof(io));
	io.kind = KILN_IO_INT;
	io.i = v;
	return io;
}

HELPER double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
