/*
 * testdata.c — loaders for the test data files and numeric helpers; the
 * contract is in testdata.h.
 *
 * Invariants: every tensor built here is contiguous in its own dtype with a
 * malloc'd, non-NULL `data` (at least 1 byte); a failed decode frees what it
 * had built, so callers only ever free complete objects.
 */
#include "tests/common/testdata.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- files --------------------------------------------------------------- */

int kiln_td_read_file(const char *path, uint8_t **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return -errno;
	size_t cap = 1 << 16, n = 0;
	uint8_t *b = malloc(cap);
	for (;;) {
		if (b == NULL) {
			fclose(f);
			return -ENOMEM;
		}
		n += fread(b + n, 1, cap - n, f);
		if (n < cap)
			break;
		uint8_t *nb = realloc(b, cap * 2);
		if (nb == NULL)
			free(b);
		b = nb;
		cap *= 2;
	}
	int rc = ferror(f) ? -EIO : 0;
	fclose(f);
	if (rc != 0) {
		free(b);
		return rc;
	}
	*buf = b;
	*len = n;
	return 0;
}

int kiln_td_graph_load(const char *path, kiln_graph_t **g, char *err,
		       size_t errlen)
{
	uint8_t *buf;
	size_t len;
	int rc = kiln_td_read_file(path, &buf, &len);
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "%s: %s", path,
				  kiln_strerror(rc));
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	rc = kiln_graph_decode(buf, len, &lim, g, err, errlen);
	free(buf);
	return rc;
}

/* ---- scalar conversions -------------------------------------------------- */

/* Rounds |x| (bits ab, finite, nonzero exponent field) to a binary format
 * with `mbits` mantissa bits and minimum normal exponent `emin`; returns the
 * magnitude bits (inf_bits on overflow). */
static uint32_t round_bits(uint64_t ab, int mbits, int emin, uint32_t inf_bits)
{
	int e = (int)(ab >> 52) - 1023;
	uint64_t m = (ab & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52);
	if ((ab >> 52) == 0)
		return 0; /* f64 subnormal: far below both formats */
	int shift = 52 - mbits + (e >= emin ? 0 : emin - e);
	if (shift > 63)
		return 0;
	uint64_t q = m >> shift;
	uint64_t rem = m & ((UINT64_C(1) << shift) - 1);
	uint64_t half = UINT64_C(1) << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	uint64_t h = e >= emin ? ((uint64_t)(e - emin) << mbits) + q : q;
	if (e > 1000 || h >= inf_bits)
		return inf_bits;
	return (uint32_t)h;
}

uint16_t kiln_td_f16_from_f64(double x)
{
	uint64_t b;
	memcpy(&b, &x, 8);
	uint16_t sign = (uint16_t)((b >> 48) & 0x8000);
	uint64_t ab = b & ~(UINT64_C(1) << 63);
	if (ab >= UINT64_C(0x7ff0000000000000))
		return sign |
		       (ab > UINT64_C(0x7ff0000000000000) ? 0x7e00 : 0x7c00);
	return sign | (uint16_t)round_bits(ab, 10, -14, 0x7c00);
}

uint16_t kiln_td_bf16_from_f64(double x)
{
	uint64_t b;
	memcpy(&b, &x, 8);
	uint16_t sign = (uint16_t)((b >> 48) & 0x8000);
	uint64_t ab = b & ~(UINT64_C(1) << 63);
	if (ab >= UINT64_C(0x7ff0000000000000))
		return sign |
		       (ab > UINT64_C(0x7ff0000000000000) ? 0x7fc0 : 0x7f80);
	return sign | (uint16_t)round_bits(ab, 7, -126, 0x7f80);
}

double kiln_td_f16_to_f64(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	int m = h & 0x3ff;
	double v;
	if (e == 0)
		v = ldexp((double)m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp((double)(m | 0x400), e - 25);
	return (h & 0x8000) ? -v : v;
}

double kiln_td_bf16_to_f64(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return (double)f;
}

/* ---- PRNG ---------------------------------------------------------------- */

uint64_t kiln_td_prng_raw(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * UINT64_C(0x9E3779B97F4A7C15);
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

double kiln_td_prng_uniform(uint64_t seed, uint64_t i, double lo, double hi)
{
	double u = (double)(kiln_td_prng_raw(seed, i) >> 40) * 0x1p-24;
	return lo + (hi - lo) * u;
}

int64_t kiln_td_prng_randint(uint64_t seed, uint64_t i, int64_t lo, int64_t hi)
{
	uint64_t span = (uint64_t)hi - (uint64_t)lo;
	return (int64_t)((uint64_t)lo + kiln_td_prng_raw(seed, i) % span);
}

/* ---- tensors
 * ------------------------------------------------------------------ */

int64_t kiln_td_numel(const kiln_tensor_t *t)
{
	int64_t n = 1;
	for (uint32_t d = 0; d < t->rank; d++)
		n *= t->sizes[d];
	return n;
}

int kiln_td_tensor_alloc(kiln_tensor_t *t, kiln_dtype_t dt, uint32_t rank,
			 const int64_t *sizes)
{
	memset(t, 0, sizeof(*t));
	if (rank > KILN_MAX_RANK_HARD)
		return -EINVAL;
	int64_t n = 1;
	for (uint32_t d = rank; d-- > 0;) {
		if (sizes[d] < 0 ||
		    (sizes[d] > 0 && n > (INT64_MAX >> 4) / sizes[d]))
			return -EINVAL;
		t->sizes[d] = sizes[d];
		t->strides[d] = n;
		n *= sizes[d];
	}
	t->dtype = dt;
	t->rank = rank;
	size_t bytes = (size_t)n * kiln_dtype_size(dt);
	t->data = calloc(bytes ? bytes : 1, 1);
	return t->data ? 0 : -ENOMEM;
}

void kiln_td_tensor_free(kiln_tensor_t *t)
{
	if (t == NULL)
		return;
	free(t->data);
	t->data = NULL;
}

/* Offset in elements of row-major logical index i. */
static int64_t elem_off(const kiln_tensor_t *t, int64_t i)
{
	int64_t off = 0;
	for (uint32_t d = t->rank; d-- > 0;) {
		int64_t s = t->sizes[d];
		if (s <= 0)
			return 0;
		off += (i % s) * t->strides[d];
		i /= s;
	}
	return off;
}

static double load_f64(const void *data, kiln_dtype_t dt, int64_t off)
{
	const uint8_t *p =
	    (const uint8_t *)data + off * (int64_t)kiln_dtype_size(dt);
	switch (dt) {
	case KILN_DT_F32: {
		float v;
		memcpy(&v, p, 4);
		return v;
	}
	case KILN_DT_F64: {
		double v;
		memcpy(&v, p, 8);
		return v;
	}
	case KILN_DT_F16: {
		uint16_t v;
		memcpy(&v, p, 2);
		return kiln_td_f16_to_f64(v);
	}
	case KILN_DT_BF16: {
		uint16_t v;
		memcpy(&v, p, 2);
		return kiln_td_bf16_to_f64(v);
	}
	case KILN_DT_I8: return (int8_t)*p;
	case KILN_DT_U8: return *p;
	case KILN_DT_BOOL: return *p != 0;
	case KILN_DT_I16: {
		int16_t v;
		memcpy(&v, p, 2);
		return v;
	}
	case KILN_DT_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	case KILN_DT_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		return (double)v;
	}
	default: return NAN;
	}
}

double kiln_td_get(const kiln_tensor_t *t, int64_t i)
{
	return load_f64(t->data, t->dtype, elem_off(t, i));
}

int64_t kiln_td_get_i64(const kiln_tensor_t *t, int64_t i)
{
	int64_t off = elem_off(t, i);
	if (t->dtype == KILN_DT_I64) {
		int64_t v;
		memcpy(&v, (const uint8_t *)t->data + off * 8, 8);
		return v;
	}
	double v = load_f64(t->data, t->dtype, off);
	if (!(v > -9.2e18 && v < 9.2e18))
		return isnan(v) ? 0 : (v < 0 ? INT64_MIN : INT64_MAX);
	return (int64_t)v;
}

/* ---- io decoding
 * ------------------------------------------------------------------ */

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	if (err != NULL && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return KILN_EBADREQ;
}

static bool obj_int(const msgpack_object *o, int64_t *v)
{
	if (o == NULL)
		return false;
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
	    o->via.u64 <= INT64_MAX) {
		*v = (int64_t)o->via.u64;
		return true;
	}
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*v = o->via.i64;
		return true;
	}
	return false;
}

static bool obj_num(const msgpack_object *o, double *v)
{
	int64_t i;
	if (o == NULL)
		return false;
	if (o->type == MSGPACK_OBJECT_FLOAT32 ||
	    o->type == MSGPACK_OBJECT_FLOAT64) {
		*v = o->via.f64;
		return true;
	}
	if (obj_int(o, &i)) {
		*v = (double)i;
		return true;
	}
	return false;
}

static bool obj_u64(const msgpack_object *o, uint64_t *v)
{
	if (o != NULL && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		*v = o->via.u64;
		return true;
	}
	if (o != NULL && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*v = (uint64_t)o->via.i64;
		return true;
	}
	return false;
}

/* Stores double v into element off of a dtype-dt buffer (rounding). */
static void store_f64(void *data, kiln_dtype_t dt, int64_t off, double v)
{
	uint8_t *p = (uint8_t *)data + off * (int64_t)kiln_dtype_size(dt);
	switch (dt) {
	case KILN_DT_F32: {
		float f = (float)v;
		memcpy(p, &f, 4);
		break;
	}
	case KILN_DT_F64: memcpy(p, &v, 8); break;
	case KILN_DT_F16: {
		uint16_t h = kiln_td_f16_from_f64(v);
		memcpy(p, &h, 2);
		break;
	}
	case KILN_DT_BF16: {
		uint16_t h = kiln_td_bf16_from_f64(v);
		memcpy(p, &h, 2);
		break;
	}
	default: break;
	}
}

static void store_i64(void *data, kiln_dtype_t dt, int64_t off, int64_t v)
{
	uint8_t *p = (uint8_t *)data + off * (int64_t)kiln_dtype_size(dt);
	switch (dt) {
	case KILN_DT_I8: *p = (uint8_t)(int8_t)v; break;
	case KILN_DT_U8: *p = (uint8_t)v; break;
	case KILN_DT_BOOL: *p = v != 0; break;
	case KILN_DT_I16: {
		int16_t x = (int16_t)v;
		memcpy(p, &x, 2);
		break;
	}
	case KILN_DT_I32: {
		int32_t x = (int32_t)v;
		memcpy(p, &x, 4);
		break;
	}
	case KILN_DT_I64: memcpy(p, &v, 8); break;
	default: store_f64(data, dt, off, (double)v); break;
	}
}

static int tensor_from_object(const msgpack_object *o, kiln_td_value_t *v,
			      const char *where, char *err, size_t errlen)
{
	memset(v, 0, sizeof(*v));
	if (o->type != MSGPACK_OBJECT_MAP)
		return bad(err, errlen, "%s: not a map", where);
	const msgpack_object *io = kiln_map_get(o, "int");
	if (io != NULL) {
		if (!obj_int(io, &v->ival))
			return bad(err, errlen, "%s: \"int\" is not an integer",
				   where);
		v->is_int = true;
		return 0;
	}
	const msgpack_object *dto = kiln_map_get(o, "dtype");
	const msgpack_object *sho = kiln_map_get(o, "shape");
	if (dto == NULL || dto->type != MSGPACK_OBJECT_STR)
		return bad(err, errlen, "%s: missing \"dtype\"", where);
	int dt = kiln_dtype_from_name(dto->via.str.ptr, dto->via.str.size);
	if (dt < 0)
		return bad(err, errlen, "%s: unknown dtype", where);
	if (sho == NULL || sho->type != MSGPACK_OBJECT_ARRAY ||
	    sho->via.array.size > KILN_MAX_RANK_HARD)
		return bad(err, errlen, "%s: missing or bad \"shape\"", where);
	int64_t sizes[KILN_MAX_RANK_HARD];
	uint32_t rank = sho->via.array.size;
	for (uint32_t d = 0; d < rank; d++)
		if (!obj_int(&sho->via.array.ptr[d], &sizes[d]) || sizes[d] < 0)
			return bad(err, errlen, "%s: shape[%u] is not a size",
				   where, d);
	int rc = kiln_td_tensor_alloc(&v->t, (kiln_dtype_t)dt, rank, sizes);
	if (rc == -EINVAL)
		return bad(err, errlen, "%s: shape too large", where);
	if (rc < 0)
		return rc;
	int64_t n = kiln_td_numel(&v->t);
	size_t esz = kiln_dtype_size((kiln_dtype_t)dt);
	const msgpack_object *data = kiln_map_get(o, "data");
	const msgpack_object *gen = kiln_map_get(o, "gen");
	if (data != NULL) {
		if (data->type != MSGPACK_OBJECT_BIN ||
		    data->via.bin.size != (uint64_t)n * esz) {
			kiln_td_tensor_free(&v->t);
			return bad(err, errlen,
				   "%s: \"data\" is not %lld bytes of bin",
				   where, (long long)((uint64_t)n * esz));
		}
		if (n > 0)
			memcpy(v->t.data, data->via.bin.ptr, (size_t)n * esz);
		return 0;
	}
	if (gen == NULL || gen->type != MSGPACK_OBJECT_MAP) {
		kiln_td_tensor_free(&v->t);
		return bad(err, errlen, "%s: neither \"data\" nor \"gen\"",
			   where);
	}
	const msgpack_object *kind = kiln_map_get(gen, "kind");
	uint64_t seed;
	if (!obj_u64(kiln_map_get(gen, "seed"), &seed)) {
		kiln_td_tensor_free(&v->t);
		return bad(err, errlen, "%s: gen has no integer \"seed\"",
			   where);
	}
	if (kind != NULL && kiln_obj_streq(kind, "uniform") &&
	    kiln_dtype_is_float((kiln_dtype_t)dt)) {
		double lo, hi;
		if (!obj_num(kiln_map_get(gen, "lo"), &lo) ||
		    !obj_num(kiln_map_get(gen, "hi"), &hi)) {
			kiln_td_tensor_free(&v->t);
			return bad(err, errlen, "%s: uniform gen needs lo, hi",
				   where);
		}
		for (int64_t i = 0; i < n; i++)
			store_f64(
			    v->t.data, (kiln_dtype_t)dt, i,
			    kiln_td_prng_uniform(seed, (uint64_t)i, lo, hi));
		return 0;
	}
	if (kind != NULL && kiln_obj_streq(kind, "randint")) {
		int64_t lo, hi;
		if (!obj_int(kiln_map_get(gen, "lo"), &lo) ||
		    !obj_int(kiln_map_get(gen, "hi"), &hi) || hi <= lo) {
			kiln_td_tensor_free(&v->t);
			return bad(err, errlen, "%s: randint gen needs lo < hi",
				   where);
		}
		for (int64_t i = 0; i < n; i++)
			store_i64(
			    v->t.data, (kiln_dtype_t)dt, i,
			    kiln_td_prng_randint(seed, (uint64_t)i, lo, hi));
		return 0;
	}
	kiln_td_tensor_free(&v->t);
	return bad(err, errlen, "%s: unknown gen kind for dtype %s", where,
		   kiln_dtype_name((kiln_dtype_t)dt));
}

static int values_from_object(const msgpack_object *arr, const char *what,
			      kiln_td_value_t **out, uint32_t *n, char *err,
			      size_t errlen)
{
	if (arr == NULL || arr->type != MSGPACK_OBJECT_ARRAY)
		return bad(err, errlen, "missing or non-array \"%s\"", what);
	uint32_t cnt = arr->via.array.size;
	kiln_td_value_t *v = calloc(cnt ? cnt : 1, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < cnt; i++) {
		char where[64];
		snprintf(where, sizeof(where), "%s[%u]", what, i);
		int rc = tensor_from_object(&arr->via.array.ptr[i], &v[i],
					    where, err, errlen);
		if (rc < 0) {
			for (uint32_t j = 0; j < i; j++)
				if (!v[j].is_int)
					kiln_td_tensor_free(&v[j].t);
			free(v);
			return rc;
		}
	}
	*out = v;
	*n = cnt;
	return 0;
}

void kiln_td_io_free(kiln_td_io_t *io)
{
	if (io == NULL)
		return;
	for (uint32_t i = 0; i < io->n_inputs; i++)
		if (!io->inputs[i].is_int)
			kiln_td_tensor_free(&io->inputs[i].t);
	for (uint32_t i = 0; i < io->n_outputs; i++)
		if (!io->outputs[i].is_int)
			kiln_td_tensor_free(&io->outputs[i].t);
	for (uint32_t i = 0; i < io->n_symbols; i++)
		free(io->sym_names[i]);
	free(io->inputs);
	free(io->outputs);
	free(io->sym_names);
	free(io->sym_values);
	free(io->nocheck);
	memset(io, 0, sizeof(*io));
}

int kiln_td_io_from_object(const msgpack_object *map, kiln_td_io_t *io,
			   char *err, size_t errlen)
{
	memset(io, 0, sizeof(*io));
	io->rtol = io->atol = -1;
	if (map->type != MSGPACK_OBJECT_MAP)
		return bad(err, errlen, "io: not a map");
	const msgpack_object *fmt = kiln_map_get(map, "format");
	if (fmt == NULL || !kiln_obj_streq(fmt, "kiln.io/1"))
		return bad(err, errlen, "io: \"format\" is not \"kiln.io/1\"");
	int rc = values_from_object(kiln_map_get(map, "inputs"), "inputs",
				    &io->inputs, &io->n_inputs, err, errlen);
	if (rc == 0)
		rc = values_from_object(kiln_map_get(map, "outputs"), "outputs",
					&io->outputs, &io->n_outputs, err,
					errlen);
	const msgpack_object *sy = kiln_map_get(map, "symbols");
	if (rc == 0 && sy != NULL && sy->type == MSGPACK_OBJECT_MAP &&
	    sy->via.map.size > 0) {
		uint32_t n = sy->via.map.size;
		io->sym_names = calloc(n, sizeof(char *));
		io->sym_values = calloc(n, sizeof(int64_t));
		if (io->sym_names == NULL || io->sym_values == NULL)
			rc = -ENOMEM;
		for (uint32_t i = 0; rc == 0 && i < n; i++) {
			const msgpack_object_kv *kv = &sy->via.map.ptr[i];
			if (kv->key.type != MSGPACK_OBJECT_STR ||
			    !obj_int(&kv->val, &io->sym_values[i])) {
				rc = bad(err, errlen,
					 "io: symbols[%u] is not name: int", i);
				break;
			}
			io->sym_names[i] =
			    strndup(kv->key.via.str.ptr, kv->key.via.str.size);
			if (io->sym_names[i] == NULL)
				rc = -ENOMEM;
			io->n_symbols = i + 1;
		}
	} else if (rc == 0 && sy != NULL && sy->type != MSGPACK_OBJECT_MAP &&
		   sy->type != MSGPACK_OBJECT_NIL) {
		rc = bad(err, errlen, "io: \"symbols\" is not a map");
	}
	const msgpack_object *nc = kiln_map_get(map, "nocheck");
	if (rc == 0 && nc != NULL && nc->type == MSGPACK_OBJECT_ARRAY) {
		io->nocheck =
		    calloc(io->n_outputs ? io->n_outputs : 1, sizeof(bool));
		if (io->nocheck == NULL)
			rc = -ENOMEM;
		for (uint32_t i = 0; rc == 0 && i < nc->via.array.size; i++) {
			int64_t k;
			if (!obj_int(&nc->via.array.ptr[i], &k) || k < 0 ||
			    k >= (int64_t)io->n_outputs)
				rc = bad(
				    err, errlen,
				    "io: nocheck[%u] is not an output index",
				    i);
			else
				io->nocheck[k] = true;
		}
	}
	if (rc == 0) {
		double v;
		if (obj_num(kiln_map_get(map, "rtol"), &v))
			io->rtol = v;
		if (obj_num(kiln_map_get(map, "atol"), &v))
			io->atol = v;
	}
	if (rc < 0)
		kiln_td_io_free(io);
	return rc;
}

/* Unpacks a whole file holding one msgpack map into zone/obj; *buf must
 * outlive obj. */
static int unpack_file(const char *path, uint8_t **buf, msgpack_zone *zone,
		       msgpack_object *obj, char *err, size_t errlen)
{
	size_t len;
	int rc = kiln_td_read_file(path, buf, &len);
	if (rc < 0)
		return kiln__errf(err, errlen, rc, "%s: %s", path,
				  kiln_strerror(rc));
	kiln_limits_t lim;
	kiln_limits_default(&lim);
	lim.max_objects = UINT32_MAX / 2;
	rc = kiln_msgpack_unpack_map(*buf, len, &lim, zone, obj, err, errlen);
	if (rc < 0) {
		free(*buf);
		*buf = NULL;
	}
	return rc;
}

int kiln_td_io_load(const char *path, kiln_td_io_t *io, char *err,
		    size_t errlen)
{
	uint8_t *buf = NULL;
	msgpack_zone zone;
	msgpack_object obj;
	memset(io, 0, sizeof(*io));
	if (!msgpack_zone_init(&zone, 4096))
		return -ENOMEM;
	int rc = unpack_file(path, &buf, &zone, &obj, err, errlen);
	if (rc == 0)
		rc = kiln_td_io_from_object(&obj, io, err, errlen);
	msgpack_zone_destroy(&zone);
	free(buf);
	return rc;
}

int kiln_td_io_symbols(const kiln_graph_t *g, const kiln_td_io_t *io,
		       int64_t *syms, char *err, size_t errlen)
{
	for (uint32_t s = 0; s < g->n_symbols; s++) {
		uint32_t i;
		for (i = 0; i < io->n_symbols; i++)
			if (strcmp(io->sym_names[i], g->symbols[s].name) == 0)
				break;
		if (i == io->n_symbols)
			return bad(err, errlen, "io has no value for symbol %s",
				   g->symbols[s].name);
		syms[s] = io->sym_values[i];
	}
	return 0;
}

static int eval_dim(const kiln_dim_t *d, const int64_t *syms, int64_t *out)
{
	if (d->e == NULL) {
		*out = d->c;
		return 0;
	}
	return kiln_expr_eval(d->e, syms, out);
}

void kiln_td_inputs_free(kiln_tensor_t *inputs, uint32_t n)
{
	if (inputs == NULL)
		return;
	for (uint32_t i = 0; i < n; i++)
		kiln_td_tensor_free(&inputs[i]);
}

int kiln_td_make_inputs(const kiln_graph_t *g, const kiln_td_io_t *io,
			kiln_tensor_t *inputs, char *err, size_t errlen)
{
	int64_t syms[1024];
	int rc = 0;
	memset(inputs, 0, sizeof(*inputs) * g->n_inputs);
	if (g->n_symbols > 1024)
		return bad(err, errlen, "too many symbols");
	if (io->n_inputs != g->n_inputs)
		return bad(err, errlen, "io has %u inputs, the graph %u",
			   io->n_inputs, g->n_inputs);
	rc = kiln_td_io_symbols(g, io, syms, err, errlen);
	for (uint32_t i = 0; rc == 0 && i < g->n_inputs; i++) {
		const kiln_value_t *v = &g->values[i];
		const kiln_td_value_t *x = &io->inputs[i];
		kiln_tensor_t *t = &inputs[i];
		if (v->kind == KILN_VAL_SYMINT) {
			if (!x->is_int) {
				rc = bad(
				    err, errlen,
				    "input %u: graph says int, io a tensor", i);
				break;
			}
			rc = kiln_td_tensor_alloc(t, KILN_DT_I64, 0, NULL);
			if (rc == 0)
				memcpy(t->data, &x->ival, 8);
			continue;
		}
		if (x->is_int || x->t.dtype != v->dtype ||
		    x->t.rank != v->rank) {
			rc = bad(err, errlen,
				 "input %u: io tensor does not match the "
				 "graph's dtype/rank",
				 i);
			break;
		}
		/* lay out with the declared strides */
		int64_t extent = 1, n = kiln_td_numel(&x->t);
		*t = x->t;
		for (uint32_t d = 0; d < v->rank && rc == 0; d++) {
			int64_t st;
			rc = eval_dim(&v->strides[d], syms, &st);
			if (rc < 0 || st < 0) {
				rc = bad(err, errlen, "input %u: bad stride %u",
					 i, d);
				break;
			}
			t->strides[d] = st;
			if (t->sizes[d] > 0)
				extent += (t->sizes[d] - 1) * st;
		}
		if (rc < 0) {
			t->data = NULL;
			break;
		}
		if (n == 0)
			extent = 1;
		size_t esz = kiln_dtype_size(v->dtype);
		t->data = calloc((size_t)extent, esz);
		if (t->data == NULL) {
			rc = -ENOMEM;
			break;
		}
		for (int64_t e = 0; e < n; e++)
			memcpy(
			    (uint8_t *)t->data + elem_off(t, e) * (int64_t)esz,
			    (const uint8_t *)x->t.data + e * (int64_t)esz, esz);
	}
	if (rc < 0)
		kiln_td_inputs_free(inputs, g->n_inputs);
	return rc;
}

/* ---- case files
 * ----------------------------------------------------------------- */

void kiln_td_cases_free(kiln_td_cases_t *c)
{
	if (c == NULL)
		return;
	for (uint32_t i = 0; i < c->n; i++) {
		free(c->cases[i].name);
		kiln_graph_free(c->cases[i].graph);
		kiln_td_io_free(&c->cases[i].io);
	}
	free(c->cases);
	free(c->op);
	memset(c, 0, sizeof(*c));
}

int kiln_td_cases_load(const char *path, kiln_td_cases_t *out, char *err,
		       size_t errlen)
{
	uint8_t *buf = NULL;
	msgpack_zone zone;
	msgpack_object obj;
	memset(out, 0, sizeof(*out));
	if (!msgpack_zone_init(&zone, 4096))
		return -ENOMEM;
	int rc = unpack_file(path, &buf, &zone, &obj, err, errlen);
	const msgpack_object *fmt, *op, *cases = NULL;
	if (rc == 0) {
		fmt = kiln_map_get(&obj, "format");
		op = kiln_map_get(&obj, "op");
		cases = kiln_map_get(&obj, "cases");
		if (fmt == NULL || !kiln_obj_streq(fmt, "kiln.opcases/1"))
			rc = bad(err, errlen,
				 "%s: format is not kiln.opcases/1", path);
		else if (op == NULL || op->type != MSGPACK_OBJECT_STR ||
			 cases == NULL || cases->type != MSGPACK_OBJECT_ARRAY)
			rc = bad(err, errlen, "%s: missing \"op\" or \"cases\"",
				 path);
		else if ((out->op = strndup(op->via.str.ptr,
					    op->via.str.size)) == NULL)
			rc = -ENOMEM;
	}
	if (rc == 0) {
		uint32_t n = cases->via.array.size;
		out->cases = calloc(n ? n : 1, sizeof(*out->cases));
		if (out->cases == NULL)
			rc = -ENOMEM;
		kiln_limits_t lim;
		kiln_limits_default(&lim);
		for (uint32_t i = 0; rc == 0 && i < n; i++) {
			const msgpack_object *c = &cases->via.array.ptr[i];
			kiln_td_case_t *tc = &out->cases[i];
			out->n = i + 1;
			const msgpack_object *nm = kiln_map_get(c, "name");
			const msgpack_object *gr = kiln_map_get(c, "graph");
			const msgpack_object *io = kiln_map_get(c, "io");
			if (nm == NULL || nm->type != MSGPACK_OBJECT_STR ||
			    gr == NULL || io == NULL) {
				rc = bad(err, errlen,
					 "%s: case %u lacks name/graph/io",
					 path, i);
				break;
			}
			tc->name = strndup(nm->via.str.ptr, nm->via.str.size);
			if (tc->name == NULL) {
				rc = -ENOMEM;
				break;
			}
			char e2[256];
			rc = kiln_graph_from_object(gr, &lim, &tc->graph, e2,
						    sizeof(e2));
			if (rc < 0) {
				kiln__errf(err, errlen, rc,
					   "%s: case %s: graph: %s", path,
					   tc->name, e2);
				break;
			}
			rc =
			    kiln_td_io_from_object(io, &tc->io, e2, sizeof(e2));
			if (rc < 0)
				kiln__errf(err, errlen, rc,
					   "%s: case %s: io: %s", path,
					   tc->name, e2);
		}
	}
	msgpack_zone_destroy(&zone);
	free(buf);
	if (rc < 0)
		kiln_td_cases_free(out);
	return rc;
}

/* ---- comparison
 * ------------------------------------------------------------------ */

void kiln_td_tolerance(kiln_dtype_t dt, double *rtol, double *atol)
{
	switch (dt) {
	case KILN_DT_F64:
		*rtol = 1e-7;
		*atol = 1e-9;
		break;
	case KILN_DT_F32:
		*rtol = 1e-5;
		*atol = 1e-6;
		break;
	case KILN_DT_F16:
		*rtol = 2e-3;
		*atol = 1e-3;
		break;
	case KILN_DT_BF16:
		*rtol = 1.6e-2;
		*atol = 1e-2;
		break;
	default:
		*rtol = 0;
		*atol = 0;
		break;
	}
}

static void shape_str(const kiln_tensor_t *t, char *buf, size_t n)
{
	size_t k = 0;
	k += (size_t)snprintf(buf + k, n - k, "[");
	for (uint32_t d = 0; d < t->rank && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "",
				      (long long)t->sizes[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

bool kiln_td_compare(const kiln_tensor_t *got, const kiln_tensor_t *want,
		     double rtol, double atol, kiln_td_cmp_t *r)
{
	memset(r, 0, sizeof(*r));
	r->worst = -1;
	bool same = got->rank == want->rank;
	for (uint32_t d = 0; same && d < got->rank; d++)
		same = got->sizes[d] == want->sizes[d];
	if (!same) {
		char a[128], b[128];
		shape_str(got, a, sizeof(a));
		shape_str(want, b, sizeof(b));
		snprintf(r->msg, sizeof(r->msg), "shape %s, expected %s", a, b);
		return r->ok = false;
	}
	int64_t n = kiln_td_numel(want);
	double worst_score = 0;
	bool exact = !kiln_dtype_is_float(want->dtype) &&
		     !kiln_dtype_is_float(got->dtype);
	for (int64_t i = 0; i < n; i++) {
		double g, w, score;
		if (exact) {
			int64_t gi = kiln_td_get_i64(got, i),
				wi = kiln_td_get_i64(want, i);
			g = (double)gi;
			w = (double)wi;
			double diff = fabs(g - w);
			if (diff > r->max_abs)
				r->max_abs = diff;
			score = gi == wi ? 0 : INFINITY;
		} else {
			g = kiln_td_get(got, i);
			w = kiln_td_get(want, i);
			if (isnan(g) || isnan(w))
				score = (isnan(g) && isnan(w)) ? 0 : INFINITY;
			else if (isinf(g) || isinf(w))
				score = g == w ? 0 : INFINITY;
			else {
				double diff = fabs(g - w);
				if (diff > r->max_abs)
					r->max_abs = diff;
				if (w != 0 && diff / fabs(w) > r->max_rel)
					r->max_rel = diff / fabs(w);
				double tol = atol + rtol * fabs(w);
				score = diff == 0
					    ? 0
					    : (tol > 0 ? diff / tol : INFINITY);
			}
		}
		if (score > 1)
			r->n_bad++;
		if (score > worst_score || (r->worst < 0 && score > 0)) {
			worst_score = score;
			r->worst = i;
			r->got = g;
			r->want = w;
		}
	}
	r->ok = r->n_bad == 0;
	if (r->worst < 0)
		snprintf(r->msg, sizeof(r->msg), "%lld elements equal",
			 (long long)n);
	else
		snprintf(
		    r->msg, sizeof(r->msg),
		    "%lld of %lld elements outside rtol=%g atol=%g; worst at "
		    "[%lld]: got %.9g, expected %.9g; max abs err %.3g, max "
		    "rel "
		    "err %.3g",
		    (long long)r->n_bad, (long long)n, rtol, atol,
		    (long long)r->worst, r->got, r->want, r->max_abs,
		    r->max_rel);
	return r->ok;
}
