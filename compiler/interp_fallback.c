/*
 * interp_fallback.c — runs an artifact's fallback steps with the reference
 * interpreter, for kilnc and the tests (the Python runtime runs them through
 * torch instead).
 *
 * A step becomes a one-node Graph v1 (its tensor arguments as inputs, with
 * their concrete sizes and strides), which the interpreter evaluates; the
 * results are converted to the output views' dtypes and written through
 * their strides.
 */
#include "compiler/compiler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fbctx {
	const kiln_tensor_t *views;
	uint32_t map[256]; /* view id → graph input */
	uint32_t n_in;
	uint32_t in_view[256];
} fbctx_t;

static void pack_spec(msgpack_packer *pk, const kiln_tensor_t *t)
{
	msgpack_pack_map(pk, 3);
	kiln_pack_cstr(pk, "dtype");
	kiln_pack_cstr(pk, kiln_dtype_name(t->dtype));
	kiln_pack_cstr(pk, "shape");
	msgpack_pack_array(pk, t->rank);
	for (uint32_t k = 0; k < t->rank; k++)
		msgpack_pack_int64(pk, t->sizes[k]);
	kiln_pack_cstr(pk, "strides");
	msgpack_pack_array(pk, t->rank);
	for (uint32_t k = 0; k < t->rank; k++)
		msgpack_pack_int64(pk, t->strides[k] < 0 ? 0 : t->strides[k]);
}

static int collect(fbctx_t *f, const kiln_arg_t *a)
{
	if (a->kind == KILN_ARG_LIST) {
		for (uint32_t i = 0; i < a->n; i++) {
			int rc = collect(f, &a->u.list[i]);
			if (rc != 0)
				return rc;
		}
		return 0;
	}
	if (a->kind == KILN_ARG_SYM)
		return KILN_EUNSUPOP;
	if (a->kind != KILN_ARG_REF)
		return 0;
	if (a->u.ref >= 256 || f->n_in >= 256)
		return KILN_EUNSUPOP;
	if (f->map[a->u.ref] != UINT32_MAX)
		return 0;
	f->map[a->u.ref] = f->n_in;
	f->in_view[f->n_in++] = a->u.ref;
	return 0;
}

static void pack_arg(fbctx_t *f, msgpack_packer *pk, const kiln_arg_t *a)
{
	switch (a->kind) {
	case KILN_ARG_NIL: msgpack_pack_nil(pk); return;
	case KILN_ARG_BOOL:
		if (a->u.b)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		return;
	case KILN_ARG_INT: msgpack_pack_int64(pk, a->u.i); return;
	case KILN_ARG_FLOAT: msgpack_pack_double(pk, a->u.f); return;
	case KILN_ARG_STR: msgpack_pack_str_with_body(pk, a->u.s, a->n); return;
	case KILN_ARG_LIST:
		msgpack_pack_array(pk, a->n);
		for (uint32_t i = 0; i < a->n; i++)
			pack_arg(f, pk, &a->u.list[i]);
		return;
	case KILN_ARG_REF:
		msgpack_pack_map(pk, 1);
		kiln_pack_cstr(pk, "ref");
		msgpack_pack_uint32(pk, f->map[a->u.ref]);
		return;
	default: msgpack_pack_nil(pk); return;
	}
}

__extension__ typedef _Float16 kiln_f16_t;

static uint16_t to_f16(double x)
{
	kiln_f16_t h = (kiln_f16_t)(float)x;
	uint16_t u;
	memcpy(&u, &h, 2);
	return u;
}

static uint16_t to_bf16(double x)
{
	float f = (float)x;
	uint32_t u;
	memcpy(&u, &f, 4);
	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static void put(const kiln_tensor_t *t, int64_t off, double f, int64_t i,
		bool is_int)
{
	char *p = (char *)t->data + off * (int64_t)kiln_dtype_size(t->dtype);
	double v = is_int ? (double)i : f;
	int64_t iv = is_int ? i : (int64_t)f;
	switch (t->dtype) {
	case KILN_DT_F32: {
		float x = (float)v;
		memcpy(p, &x, 4);
		break;
	}
	case KILN_DT_F64: memcpy(p, &v, 8); break;
	case KILN_DT_F16: {
		uint16_t h = to_f16(v);
		memcpy(p, &h, 2);
		break;
	}
	case KILN_DT_BF16: {
		uint16_t h = to_bf16(v);
		memcpy(p, &h, 2);
		break;
	}
	case KILN_DT_I8: *(int8_t *)p = (int8_t)iv; break;
	case KILN_DT_U8: *(uint8_t *)p = (uint8_t)iv; break;
	case KILN_DT_I16: {
		int16_t x = (int16_t)iv;
		memcpy(p, &x, 2);
		break;
	}
	case KILN_DT_I32: {
		int32_t x = (int32_t)iv;
		memcpy(p, &x, 4);
		break;
	}
	case KILN_DT_I64: memcpy(p, &iv, 8); break;
	case KILN_DT_BOOL: *(uint8_t *)p = v != 0; break;
	default: break;
	}
}

int kiln_interp_fallback(void *user, const kiln_artifact_t *a,
			 uint32_t step_index, const kiln_tensor_t *views,
			 char *err, size_t errlen)
{
	(void)user;
	const kiln_art_step_t *st = &a->steps[step_index];
	fbctx_t f;
	memset(&f, 0, sizeof(f));
	f.views = views;
	for (uint32_t i = 0; i < 256; i++)
		f.map[i] = UINT32_MAX;
	int rc = 0;
	for (uint32_t i = 0; rc == 0 && i < st->n_args; i++)
		rc = collect(&f, &st->args[i]);
	for (uint32_t i = 0; rc == 0 && i < st->n_kwargs; i++)
		rc = collect(&f, &st->kwargs[i].val);
	if (rc != 0)
		return kiln__errf(err, errlen, KILN_EUNSUPOP,
				  "step %u (%s): the interpreter fallback "
				  "cannot take symbolic or very many arguments",
				  step_index, st->op);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4);
	kiln_pack_cstr(&pk, "format");
	kiln_pack_cstr(&pk, "kiln.graph/1");
	kiln_pack_cstr(&pk, "inputs");
	msgpack_pack_array(&pk, f.n_in);
	for (uint32_t i = 0; i < f.n_in; i++)
		pack_spec(&pk, &views[f.in_view[i]]);
	kiln_pack_cstr(&pk, "nodes");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_map(&pk, 4);
	kiln_pack_cstr(&pk, "op");
	kiln_pack_cstr(&pk, st->op);
	kiln_pack_cstr(&pk, "args");
	msgpack_pack_array(&pk, st->n_args);
	for (uint32_t i = 0; i < st->n_args; i++)
		pack_arg(&f, &pk, &st->args[i]);
	kiln_pack_cstr(&pk, "kwargs");
	msgpack_pack_map(&pk, st->n_kwargs);
	for (uint32_t i = 0; i < st->n_kwargs; i++) {
		kiln_pack_cstr(&pk, st->kwargs[i].key);
		pack_arg(&f, &pk, &st->kwargs[i].val);
	}
	kiln_pack_cstr(&pk, "out");
	msgpack_pack_array(&pk, st->n_out);
	for (uint32_t j = 0; j < st->n_out; j++) {
		kiln_tensor_t t = views[st->out[j]];
		/* the interpreter returns contiguous results */
		int64_t s = 1;
		for (uint32_t k = t.rank; k-- > 0;) {
			t.strides[k] = s;
			s *= t.sizes[k] > 1 ? t.sizes[k] : 1;
		}
		pack_spec(&pk, &t);
	}
	kiln_pack_cstr(&pk, "outputs");
	msgpack_pack_array(&pk, st->n_out);
	for (uint32_t j = 0; j < st->n_out; j++) {
		msgpack_pack_map(&pk, 1);
		kiln_pack_cstr(&pk, "ref");
		msgpack_pack_uint32(&pk, f.n_in + j);
	}
	kiln_graph_t *g = NULL;
	rc = kiln_graph_decode((const uint8_t *)sb.data, sb.size, NULL, &g, err,
			       errlen);
	msgpack_sbuffer_destroy(&sb);
	if (rc != 0)
		return rc;
	kiln_tensor_t in[256];
	for (uint32_t i = 0; i < f.n_in; i++)
		in[i] = views[f.in_view[i]];
	kiln_tensor_t out[16];
	if (st->n_out > 16) {
		kiln_graph_free(g);
		return kiln__errf(err, errlen, KILN_EUNSUPOP,
				  "too many outputs");
	}
	rc = kiln_interp_run(g, in, out, err, errlen);
	kiln_graph_free(g);
	if (rc != 0)
		return rc;
	for (uint32_t j = 0; j < st->n_out; j++) {
		const kiln_tensor_t *dst = &views[st->out[j]];
		int64_t n = 1;
		for (uint32_t k = 0; k < dst->rank; k++)
			n *= dst->sizes[k];
		bool is_int = out[j].dtype != KILN_DT_F64;
		for (int64_t e = 0; e < n; e++) {
			int64_t rem = e, off = 0;
			for (uint32_t k = dst->rank; k-- > 0;) {
				int64_t ik = rem % dst->sizes[k];
				rem /= dst->sizes[k];
				off += ik * dst->strides[k];
			}
			double fv = 0;
			int64_t iv = 0;
			if (!is_int)
				fv = ((const double *)out[j].data)[e];
			else if (out[j].dtype == KILN_DT_BOOL)
				iv = ((const uint8_t *)out[j].data)[e];
			else
				iv = ((const int64_t *)out[j].data)[e];
			put(dst, off, fv, iv, is_int);
		}
		free(out[j].data);
	}
	return 0;
}
