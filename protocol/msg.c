/*
 * msg.c — the message envelope: requests {"v","id","op",...} and responses
 * {"v","id","ok",...} / {"v","id","ok":false,"error":{...}}.
 *
 * Decoders take untrusted frame bodies: they run the msgpack guard first
 * (mpack.c), then check the envelope keys. Unknown keys are tolerated (the
 * op's own fields live beside the envelope keys). Pure functions; any thread.
 */
#include "protocol/protocol.h"

#include <errno.h>
#include <string.h>

static const char *const op_names[] = {
#define KILN__OP_NAME(name, str, admin) str,
    KILN_OP_MAP(KILN__OP_NAME)
#undef KILN__OP_NAME
};
static const bool op_admin[] = {
#define KILN__OP_ADMIN(name, str, admin) (admin),
    KILN_OP_MAP(KILN__OP_ADMIN)
#undef KILN__OP_ADMIN
};

const char *kiln_op_name(kiln_op_t op)
{
	return (unsigned)op < KILN_OP__COUNT ? op_names[op] : NULL;
}

int kiln_op_from_name(const char *s, size_t len)
{
	for (int i = 0; i < KILN_OP__COUNT; i++)
		if (strlen(op_names[i]) == len &&
		    memcmp(op_names[i], s, len) == 0)
			return i;
	return -1;
}

bool kiln_op_is_admin(kiln_op_t op)
{
	return (unsigned)op < KILN_OP__COUNT && op_admin[op];
}

/* Reads "v" and "id" common to both directions. */
static int decode_common(const msgpack_object *m, uint64_t *id, bool *has_id,
			 char *err, size_t errlen)
{
	const msgpack_object *id_o = kiln_map_get(m, "id");
	*has_id = false;
	if (id_o != NULL && id_o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		*id = id_o->via.u64;
		*has_id = true;
	}
	const msgpack_object *v = kiln_map_get(m, "v");
	if (v == NULL)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "missing \"v\" (protocol version)");
	if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"v\" must be a non-negative integer");
	if (v->via.u64 != KILN_PROTOCOL_VERSION)
		return kiln__errf(err, errlen, KILN_EVERSION,
				  "protocol version %llu is not supported "
				  "(this side speaks %d)",
				  (unsigned long long)v->via.u64,
				  KILN_PROTOCOL_VERSION);
	if (id_o == NULL)
		return kiln__errf(err, errlen, KILN_EBADREQ, "missing \"id\"");
	if (!*has_id)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"id\" must be a non-negative integer");
	return 0;
}

int kiln_request_decode(const uint8_t *body, size_t len,
			const kiln_limits_t *lim, msgpack_zone *zone,
			kiln_request_t *req, char *err, size_t errlen)
{
	memset(req, 0, sizeof(*req));
	int rc = kiln_msgpack_unpack_map(body, len, lim, zone, &req->body, err,
					 errlen);
	if (rc != 0)
		return rc;
	rc = decode_common(&req->body, &req->id, &req->has_id, err, errlen);
	if (rc != 0)
		return rc;
	const msgpack_object *op = kiln_map_get(&req->body, "op");
	if (op == NULL)
		return kiln__errf(err, errlen, KILN_EBADREQ, "missing \"op\"");
	if (op->type != MSGPACK_OBJECT_STR)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"op\" must be a string");
	int o = kiln_op_from_name(op->via.str.ptr, op->via.str.size);
	if (o < 0) {
		int shown = op->via.str.size > 64 ? 64 : (int)op->via.str.size;
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "unknown op \"%.*s\"", shown,
				  op->via.str.ptr);
	}
	req->op = (kiln_op_t)o;
	return 0;
}

int kiln_response_decode(const uint8_t *body, size_t len,
			 const kiln_limits_t *lim, msgpack_zone *zone,
			 kiln_response_t *res, char *err, size_t errlen)
{
	memset(res, 0, sizeof(*res));
	res->err_node = -1;
	int rc = kiln_msgpack_unpack_map(body, len, lim, zone, &res->body, err,
					 errlen);
	if (rc != 0)
		return rc;
	bool has_id;
	rc = decode_common(&res->body, &res->id, &has_id, err, errlen);
	if (rc != 0)
		return rc;
	const msgpack_object *ok = kiln_map_get(&res->body, "ok");
	if (ok == NULL || ok->type != MSGPACK_OBJECT_BOOLEAN)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "missing or non-boolean \"ok\"");
	res->ok = ok->via.boolean;
	if (res->ok)
		return 0;
	const msgpack_object *e = kiln_map_get(&res->body, "error");
	if (e == NULL || e->type != MSGPACK_OBJECT_MAP)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "\"ok\": false without an \"error\" map");
	const msgpack_object *code = kiln_map_get(e, "code");
	const msgpack_object *msg = kiln_map_get(e, "message");
	if (code == NULL || code->type != MSGPACK_OBJECT_STR)
		return kiln__errf(err, errlen, KILN_EBADREQ,
				  "error without a string \"code\"");
	res->err_name = code->via.str.ptr;
	res->err_name_len = code->via.str.size;
	res->err_code =
	    kiln_err_from_wire_name(res->err_name, res->err_name_len);
	if (res->err_code == 0)
		res->err_code = KILN_EINTERNAL; /* a code from a newer peer */
	if (msg != NULL && msg->type == MSGPACK_OBJECT_STR) {
		res->message = msg->via.str.ptr;
		res->message_len = msg->via.str.size;
	} else {
		res->message = "";
	}
	const msgpack_object *node = kiln_map_get(e, "node");
	if (node != NULL && node->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
	    node->via.u64 <= INT64_MAX)
		res->err_node = (int64_t)node->via.u64;
	return 0;
}

int kiln_pack_cstr(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	return msgpack_pack_str_with_body(pk, s, n);
}

int kiln_pack_request_head(msgpack_packer *pk, uint64_t id, kiln_op_t op,
			   uint32_t n_fields)
{
	int rc = msgpack_pack_map(pk, 3 + n_fields);
	rc |= kiln_pack_cstr(pk, "v");
	rc |= msgpack_pack_uint32(pk, KILN_PROTOCOL_VERSION);
	rc |= kiln_pack_cstr(pk, "id");
	rc |= msgpack_pack_uint64(pk, id);
	rc |= kiln_pack_cstr(pk, "op");
	rc |= kiln_pack_cstr(pk, kiln_op_name(op));
	return rc ? -ENOMEM : 0;
}

int kiln_pack_ok_head(msgpack_packer *pk, uint64_t id, uint32_t n_fields)
{
	int rc = msgpack_pack_map(pk, 3 + n_fields);
	rc |= kiln_pack_cstr(pk, "v");
	rc |= msgpack_pack_uint32(pk, KILN_PROTOCOL_VERSION);
	rc |= kiln_pack_cstr(pk, "id");
	rc |= msgpack_pack_uint64(pk, id);
	rc |= kiln_pack_cstr(pk, "ok");
	rc |= msgpack_pack_true(pk);
	return rc ? -ENOMEM : 0;
}

int kiln_pack_error(msgpack_packer *pk, uint64_t id, int code,
		    const char *message, int64_t node)
{
	int rc = msgpack_pack_map(pk, 4);
	rc |= kiln_pack_cstr(pk, "v");
	rc |= msgpack_pack_uint32(pk, KILN_PROTOCOL_VERSION);
	rc |= kiln_pack_cstr(pk, "id");
	rc |= msgpack_pack_uint64(pk, id);
	rc |= kiln_pack_cstr(pk, "ok");
	rc |= msgpack_pack_false(pk);
	rc |= kiln_pack_cstr(pk, "error");
	rc |= msgpack_pack_map(pk, node >= 0 ? 3 : 2);
	rc |= kiln_pack_cstr(pk, "code");
	rc |= kiln_pack_cstr(pk, kiln_err_wire_name(code));
	rc |= kiln_pack_cstr(pk, "message");
	rc |=
	    kiln_pack_cstr(pk, message != NULL ? message : kiln_strerror(code));
	if (node >= 0) {
		rc |= kiln_pack_cstr(pk, "node");
		rc |= msgpack_pack_int64(pk, node);
	}
	return rc ? -ENOMEM : 0;
}
