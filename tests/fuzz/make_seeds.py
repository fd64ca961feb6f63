#!/usr/bin/env python3
"""make_seeds.py — writes the committed seed corpus of fuzz_protocol.

    .venv/bin/python tests/fuzz/make_seeds.py [OUTDIR]   # default: tests/fuzz/corpus
    .venv/bin/python tests/fuzz/make_seeds.py --work DIR [--dict FILE]

--work DIR also writes, into DIR, each tests/data/graphs/*.graph.msgpack
wrapped as a framed compile request (a working corpus for a fuzzing run;
not committed: the regression test reads the graphs directly). --dict FILE
writes a libFuzzer dictionary of the protocol's keys and tokens.

Every file is one input of LLVMFuzzerTestOneInput: a byte stream of frames
(uint32 big-endian length + one msgpack map, PROTOCOL.md § Frames), or a bare
Graph v1 map (the fuzz target also decodes the raw bytes as a graph). The
files are small (< 4 KiB each) and deterministic: rerunning the script
rewrites the same bytes. Reproducers of fuzzer findings are added by hand,
named `regress_*` (the ones found so far are written by this script too).
"""
import math
import os
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
GRAPHS = os.path.join(HERE, "..", "data", "graphs")


def pack(obj, single_float=False):
    return msgpack.packb(obj, use_bin_type=True, use_single_float=single_float)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def req(op, id_=1, **fields):
    m = {"v": 1, "id": id_, "op": op}
    m.update(fields)
    return m


files = {}


def put(name, data: bytes):
    assert name not in files, name
    assert len(data) < 4096, (name, len(data))
    files["seed_" + name] = data


# ---- graphs (GRAPH.md examples and variations) ----------------------------

G_GELU = {
    "format": "kiln.graph/1",
    "inputs": [
        {"dtype": "f32", "shape": [8, 64], "name": "x"},
        {"dtype": "f32", "shape": [64, 32], "name": "w"},
        {"dtype": "f32", "shape": [32], "name": "b"},
    ],
    "nodes": [
        {"op": "aten.addmm.default",
         "args": [{"ref": 2}, {"ref": 0}, {"ref": 1}],
         "out": [{"dtype": "f32", "shape": [8, 32]}]},
        {"op": "aten.gelu.default", "args": [{"ref": 3}],
         "kwargs": {"approximate": "tanh"},
         "out": [{"dtype": "f32", "shape": [8, 32]}]},
    ],
    "outputs": [{"ref": 4}],
}

G_DYN = {
    "format": "kiln.graph/1",
    "symbols": {"s0": {"min": 2, "max": 4096, "hint": 16}},
    "inputs": [
        {"sym": "s0"},
        {"dtype": "f32", "shape": [4, "s0", 64]},
        {"dtype": "f32", "shape": [64]},
        {"dtype": "f32", "shape": [64]},
    ],
    "nodes": [
        {"op": "aten.native_layer_norm.default",
         "args": [{"ref": 1}, [64], {"ref": 2}, {"ref": 3}, 1e-05],
         "out": [{"dtype": "f32", "shape": [4, "s0", 64]},
                 {"dtype": "f32", "shape": [4, "s0", 1]},
                 {"dtype": "f32", "shape": [4, "s0", 1]}]},
        {"op": "aten.view.default",
         "args": [{"ref": 4}, [{"sym": "4*s0"}, 64]],
         "out": [{"dtype": "f32", "shape": ["4*s0", 64]}]},
    ],
    "outputs": [{"ref": 7}, {"ref": 5}, {"ref": 6}, {"sym": "s0"}],
}

# Every expression form, every dtype, strides given, every arg kind.
G_EXPR = {
    "format": "kiln.graph/1",
    "symbols": {"s0": {"min": 1, "max": None}, "s1": {"min": 0, "max": 64},
                "unused": {"min": 3}, "_S9": {"hint": 7}},
    "inputs": [
        {"sym": "s0"},
        {"sym": "s1 * 2 + 1"},
        {"dtype": "f16", "shape": ["s0", "(s1 - 1)//2 + 1", "max(1, s0)"],
         "strides": ["max(1, s0)*((s1 - 1)//2 + 1)", "max(1,s0)", 1]},
        {"dtype": "bf16", "shape": ["min(s0, s1) % 7", "-(-s0)", "s0*s1 - s1"]},
        {"dtype": "i64", "shape": []},
        {"dtype": "bool", "shape": [0, 3]},
        {"dtype": "u8", "shape": [2], "strides": [0]},
        {"dtype": "i8", "shape": [1]},
        {"dtype": "i16", "shape": [1]},
        {"dtype": "i32", "shape": ["_S9"]},
        {"dtype": "f64", "shape": [" 2 * 3 "]},
    ],
    "nodes": [
        {"op": "prims.convert_element_type.default",
         "args": [{"ref": 2}, "f32"],
         "kwargs": {"zeta": None, "alpha": True, "beta": -3, "gamma": 2.5,
                    "delta": [1, [2, [3, None]], "x"], "eps": float("inf"),
                    "neg_zero": -0.0, "ninf": float("-inf"),
                    "sym": {"sym": "s0 + s1"}, "big": 2**63 - 1,
                    "small": -2**63},
         "out": [{"dtype": "f32", "shape": ["s0", "(s1 - 1)//2 + 1", "max(1, s0)"]}],
         "name": "convert"},
        {"op": "aten.max_pool2d_with_indices.default",
         "args": [{"ref": 11}, [2, 2], [], [0, 0], [1, 1], False],
         "out": [{"dtype": "f32", "shape": [1]}, {"dtype": "i64", "shape": [1]}]},
        {"op": "aten.sym_size.int", "args": [{"ref": 12}, 0], "out": []},
        {"op": "aten._to_copy.default", "args": [{"ref": 3}],
         "kwargs": {"dtype": "f32", "layout": "strided", "device": "cuda:0",
                    "memory_format": "channels_last"},
         "out": [{"dtype": "f32", "shape": ["min(s0, s1) % 7", "s0", "s0*s1 - s1"],
                  "strides": [1, 1, 1]}]},
    ],
    "outputs": [{"ref": 13}, {"ref": 0}, {"ref": 13}, {"sym": "s0 // 2"},
                {"sym": "3"}, {"ref": 14}],
}

G_MIN = {"format": "kiln.graph/1", "inputs": [], "nodes": [], "outputs": []}

for name, g in [("graph_gelu", G_GELU), ("graph_dyn", G_DYN),
                ("graph_expr", G_EXPR), ("graph_min", G_MIN)]:
    put(name + ".msgpack", pack(g))
put("graph_dyn_f32floats.msgpack", pack(G_DYN, single_float=True))
put("graph_min.frame", frame(pack(G_MIN)))

# ---- requests, one per op ---------------------------------------------------

SIG = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
put("req_hello", frame(pack(req("hello", client="fuzz/1 python/3", pid=4242))))
put("req_compile_gelu", frame(pack(req(
    "compile", 2, graph=G_GELU, target={"backend": "cpu"},
    options={"mode": "default", "dynamic": None}, priority="interactive"))))
put("req_compile_dyn_cuda", frame(pack(req(
    "compile", 3, graph=G_DYN,
    target={"backend": "cuda", "arch": "sm_90a", "features": "+ptx78"},
    options={"mode": "max-autotune", "dynamic": True}, priority="batch"))))
put("req_compile_expr", frame(pack(req(
    "compile", 4, graph=G_EXPR,
    target={"backend": "cpu", "arch": "x86-64", "features": "+avx2,+fma"},
    options={"mode": "reduce-overhead", "dynamic": False}))))
put("req_compile_min_noopts", frame(pack(req(
    "compile", 5, graph=G_MIN, target={"backend": "cpu"}))))
put("req_lookup", frame(pack(req("lookup", 6, signature=SIG))))
put("req_lookup_upper", frame(pack(req("lookup", 7, signature=SIG.upper()))))
put("req_status", frame(pack(req("status", 8, settings=True))))
put("req_list", frame(pack(req("list", 9, order="size", limit=10, target="cpu"))))
put("req_evict_sig", frame(pack(req("evict", 10, signature=SIG))))
put("req_evict_all", frame(pack(req("evict", 11, all=True))))
put("req_evict_older", frame(pack(req("evict", 12, older_than_s=3600))))
put("req_gc", frame(pack(req("gc", 13, max_bytes=1 << 30))))
put("req_shutdown", frame(pack(req("shutdown", 2**64 - 1, drain=False))))
# A stream of several frames, as a connection would carry them.
put("stream_hello_lookup_compile",
    frame(pack(req("hello", 1, client="c"))) +
    frame(pack(req("lookup", 2, signature=SIG))) +
    frame(pack(req("compile", 3, graph=G_GELU, target={"backend": "cpu"}))))
# A request then the start of the next (partial frame left in the decoder).
put("stream_partial_tail",
    frame(pack(req("status", 1))) + frame(pack(req("hello", 2)))[:7])

# ---- responses ----------------------------------------------------------------

put("resp_hello", frame(pack({
    "v": 1, "id": 1, "ok": True, "server": "kilnd", "version": "0.1.0",
    "protocol": 1, "fingerprint": "kiln/0.1.0 llvm/16.0.6 build/3f2a9c1",
    "targets": [{"backend": "cpu", "arch": "x86-64", "features": "+avx2"}],
    "limits": {"max_frame_bytes": 67108864, "max_nodes": 100000,
               "max_inflight": 64}})))
put("resp_compile", frame(pack({
    "v": 1, "id": 3, "ok": True, "signature": SIG, "source": "compiled",
    "compile_ms": 41.7, "artifact": b"\x7fELF\x02\x01\x01"})))
put("resp_error_node", frame(pack({
    "v": 1, "id": 4, "ok": False,
    "error": {"code": "invalid_graph",
              "message": "node 1: arg 0: ref 9 is not defined before this node",
              "node": 1}})))
put("resp_error_unknown_code", frame(pack({
    "v": 1, "id": 5, "ok": False,
    "error": {"code": "from_the_future", "message": None, "node": -1}})))
put("resp_error_not_found", frame(pack({
    "v": 1, "id": 6, "ok": False,
    "error": {"code": "not_found", "message": "no artifact"}})))

# ---- hostile frames and envelopes -------------------------------------------

put("bad_zero_length", b"\x00\x00\x00\x00")
put("bad_oversize_length", b"\xff\xff\xff\xff\x80")
put("bad_just_over_1MiB", struct.pack(">I", (1 << 20) + 1) + b"\x80")
put("bad_truncated_body", struct.pack(">I", 100) + pack(req("hello"))[:10])
put("bad_truncated_header", b"\x00\x00")
put("bad_array32_huge", frame(b"\x81\xa1a\xdd\xff\xff\xff\xff"))
put("bad_map32_huge", frame(b"\x81\xa1a\xdf\xff\xff\xff\xff\x00"))
put("bad_array16_over", frame(b"\x81\xa1a\xdc\x01\x00" + b"\xc0" * 200))
put("bad_str32_huge", frame(b"\x81\xa1a\xdb\x7f\xff\xff\xff"))
put("bad_bin32_huge", frame(b"\x81\xa1a\xc6\xff\xff\xff\xf0abc"))
put("bad_ext32_huge", frame(b"\x81\xa1a\xc9\xff\xff\xff\xf0\x01abc"))
put("bad_reserved_c1", frame(b"\x82\xa1v\x01\xa1a\xc1"))
deep = b"\x81\xa1a" + b"\x91" * 40 + b"\xc0"
put("bad_deep_nesting_40", frame(deep))
put("bad_deep_nesting_25", frame(b"\x81\xa1a" + b"\x91" * 24 + b"\xc0"))
put("ok_nesting_23", frame(b"\x81\xa1a" + b"\x91" * 22 + b"\xc0"))
put("bad_not_a_map", frame(pack([1, 2, 3])))
put("bad_trailing_bytes", frame(pack(req("hello")) + b"\xc0"))
put("bad_v2", frame(pack({"v": 2, "id": 1, "op": "hello"})))
put("bad_v_str", frame(pack({"v": "1", "id": 1, "op": "hello"})))
put("bad_missing_id", frame(pack({"v": 1, "op": "hello"})))
put("bad_negative_id", frame(pack({"v": 1, "id": -1, "op": "hello"})))
put("bad_unknown_op", frame(pack(req("explode", 1))))
put("bad_op_not_str", frame(pack({"v": 1, "id": 1, "op": 7})))
put("bad_int_keys", frame(pack({1: 1, 2: 2, "v": 1, "id": 3, "op": "gc"})))
put("bad_ext_fixext", frame(b"\x84\xa1v\x01\xa2id\x01\xa2op\xa5hello"
                            b"\xa1x\xd4\x01\x02"))
put("bad_lookup_sig_short", frame(pack(req("lookup", 1, signature="abc"))))
put("bad_lookup_sig_nonhex", frame(pack(req("lookup", 1, signature="z" * 64))))
put("bad_target_cuda_noarch", frame(pack(req(
    "compile", 1, graph=G_MIN, target={"backend": "cuda"}))))
put("bad_target_nul", frame(pack(req(
    "compile", 1, graph=G_MIN, target={"backend": "cpu", "arch": "x8\x006"}))))
put("bad_target_long_features", frame(pack(req(
    "compile", 1, graph=G_MIN,
    target={"backend": "cpu", "features": "+a" * 1100}))))
put("bad_options_mode", frame(pack(req(
    "compile", 1, graph=G_MIN, target={"backend": "cpu"},
    options={"mode": "fast", "dynamic": 1}))))
put("bad_graph_not_map", frame(pack(req("compile", 1, graph=[1],
                                        target={"backend": "cpu"}))))


# ---- hostile graphs (each also wrapped in a compile request) -----------------

def bad_graph(name, mutate):
    g = {
        "format": "kiln.graph/1",
        "symbols": {"s0": {"min": 2, "max": 8}},
        "inputs": [{"dtype": "f32", "shape": [4, "s0"]}],
        "nodes": [{"op": "aten.relu.default", "args": [{"ref": 0}],
                   "out": [{"dtype": "f32", "shape": [4, "s0"]}]}],
        "outputs": [{"ref": 1}],
    }
    mutate(g)
    put("badgraph_" + name, frame(pack(req(
        "compile", 1, graph=g, target={"backend": "cpu"}))))


def node(g):
    return g["nodes"][0]


bad_graph("nan_arg", lambda g: node(g)["args"].append(float("nan")))
bad_graph("forward_ref", lambda g: node(g)["args"].append({"ref": 1}))
bad_graph("ref_huge", lambda g: node(g)["args"].append({"ref": 2**64 - 1}))
bad_graph("ref_negative", lambda g: node(g)["args"].append({"ref": -1}))
bad_graph("unknown_dtype", lambda g: g["inputs"][0].update(dtype="f8"))
bad_graph("rank13", lambda g: g["inputs"][0].update(shape=[1] * 13))
bad_graph("negative_size", lambda g: g["inputs"][0].update(shape=[-1]))
bad_graph("neg_expr_size", lambda g: g["inputs"][0].update(shape=["2 - 3"]))
bad_graph("strides_len", lambda g: g["inputs"][0].update(strides=[1]))
bad_graph("undeclared_sym", lambda g: g["inputs"][0].update(shape=["s1"]))
bad_graph("expr_too_large", lambda g: g["inputs"][0].update(
    shape=["+".join(["s0"] * 40)]))
# Valid: a symbolic division by zero is only an evaluation error.
bad_graph("sym_div_zero_valid", lambda g: g["inputs"][0].update(
    shape=["s0 // 0"]))
bad_graph("expr_const_div_zero", lambda g: g["inputs"][0].update(
    shape=["4 // (2 - 2)"]))
bad_graph("expr_overflow", lambda g: g["inputs"][0].update(
    shape=["9223372036854775807 + 1"]))
bad_graph("expr_syntax", lambda g: g["inputs"][0].update(shape=["(s0 +"]))
bad_graph("sym_named_min", lambda g: g.update(symbols={"min": {"min": 0}}))
bad_graph("sym_max_lt_min", lambda g: g["symbols"]["s0"].update(max=1))
bad_graph("sym_min_float", lambda g: g["symbols"]["s0"].update(min=1.5))
bad_graph("bad_op_name", lambda g: node(g).update(op="Aten.relu"))
bad_graph("map_arg", lambda g: node(g)["args"].append({"x": 1}))
bad_graph("bin_arg", lambda g: node(g)["args"].append(b"\x00"))
bad_graph("output_not_ref", lambda g: g.update(outputs=[1]))
bad_graph("output_dangling", lambda g: g.update(outputs=[{"ref": 2}]))
bad_graph("format_wrong", lambda g: g.update(format="kiln.graph/2"))
bad_graph("contig_overflow", lambda g: g["inputs"][0].update(
    shape=[2**40, 2**40, 2**40]))
bad_graph("kwarg_key_int", lambda g: node(g).update(kwargs={1: 1}))

# A repeated kwarg key needs hand-built msgpack (Python dicts dedupe keys).
rep = (b"\x83\xa6format\xackiln.graph/1\xa6inputs\x91\x82\xa5dtype\xa3f32"
       b"\xa5shape\x91\x04\xa5nodes\x91\x84\xa2op\xb1aten.relu.default"
       b"\xa4args\x91\x81\xa3ref\x00\xa6kwargs\x82\xa1a\x01\xa1a\x02"
       b"\xa3out\x91\x82\xa5dtype\xa3f32\xa5shape\x91\x04")
# (the map header says 3 entries but "outputs" is missing: add it and fix)
rep = (b"\x84" + rep[1:] + b"\xa7outputs\x91\x81\xa3ref\x01")
put("badgraph_repeated_kwarg_raw.msgpack", rep)
# NaN as float32 on the wire, hand-built.
nan32 = pack({"format": "kiln.graph/1", "inputs": [],
              "nodes": [{"op": "aten.full.default", "args": [[1], 0.5],
                         "out": [{"dtype": "f32", "shape": [1]}]}],
              "outputs": [{"ref": 0}]}, single_float=True)
assert nan32.count(struct.pack(">f", 0.5)) == 1
put("badgraph_nan32.msgpack", nan32.replace(struct.pack(">f", 0.5),
                                            struct.pack(">f", math.nan)))
# Expressions at the edges of int64 inside a symbolic expression.
EDGE = {"format": "kiln.graph/1", "symbols": {"s0": {"min": 0}},
        "inputs": [{"sym": "s0"}],
        "nodes": [{"op": "aten.view.default",
                   "args": [[{"sym": "s0 + 9223372036854775807"},
                             {"sym": "s0 * (0 - 9223372036854775807)"},
                             {"sym": "-s0 % -3"}]],
                   "out": []}],
        "outputs": [{"sym": "s0"}]}
put("graph_int64_edges.msgpack", pack(EDGE))


# ---- artifacts (ARTIFACT.md example and variations) --------------------------

ART = {
    "format": "kiln.artifact/1",
    "target": {"backend": "cpu", "arch": "x86-64", "features": "+avx2,+fma"},
    "signature": SIG,
    "code": b"\x7fELF\x02\x01\x01\x00fake-shared-object",
    "cubin": None,
    "symbols": {"s0": {"min": 2, "max": 4096, "hint": 16}},
    "bindings": [{"input": 0, "dim": 0}],
    "inputs": [{"dtype": "f32", "shape": ["s0", 64]},
               {"dtype": "f32", "shape": [64]}],
    "kernels": [
        {"name": "kiln_k0_add", "extent": "s0", "grain": 16, "n_bufs": 3},
        {"name": "kiln_k1_mul2", "extent": "64*s0", "grain": 4096, "n_bufs": 2}],
    "buffers": [
        {"kind": "input", "index": 0},
        {"kind": "input", "index": 1},
        {"kind": "arena", "offset": 0, "bytes": "256*s0"},
        {"kind": "arena", "offset": "256*s0", "bytes": "256*s0"},
        {"kind": "output", "index": 0, "bytes": "256*s0"}],
    "views": [
        {"buffer": 2, "dtype": "f32", "shape": ["s0", 64], "strides": [64, 1], "offset": 0},
        {"buffer": 3, "dtype": "f32", "shape": ["s0", 64], "strides": [64, 1], "offset": 0},
        {"buffer": 4, "dtype": "f32", "shape": ["s0", 64], "strides": [64, 1], "offset": 0},
        {"buffer": 0, "dtype": "f32", "shape": [64, "s0"], "strides": [1, 64], "offset": 0}],
    "steps": [
        {"kind": "kernel", "node": 0, "kernel": 0, "bufs": [0, 1, 2]},
        {"kind": "fallback", "node": 1, "op": "aten.gelu.default",
         "args": [{"ref": 0}], "kwargs": {"approximate": "none"}, "out": [1]},
        {"kind": "kernel", "node": 2, "kernel": 1, "bufs": [3, 4]}],
    "outputs": [{"ref": 2}, {"ref": 3}, {"sym": "s0"}],
    "n_out_buffers": 1,
    "arena_bytes": "512*s0",
    "kernels_text": "k0 kiln_k0_add: add [s0 rows]\nk1 kiln_k1_mul2: mul [64*s0]\n",
}
ART_MIN = {"format": "kiln.artifact/1", "target": {"backend": "cuda", "arch": "sm_90"},
           "code": b"", "symbols": {}, "bindings": [], "inputs": [{"sym": "7"}],
           "kernels": [], "buffers": [], "views": [], "steps": [],
           "outputs": [{"sym": "3"}], "n_out_buffers": 0, "arena_bytes": 0}
put("artifact_example.msgpack", pack(ART))
put("artifact_min.msgpack", pack(ART_MIN))
put("resp_compile_artifact", frame(pack({
    "v": 1, "id": 3, "ok": True, "signature": SIG, "source": "compiled",
    "compile_ms": 1.5, "artifact": pack(ART)})))


def bad_art(name, mutate):
    import copy
    a = copy.deepcopy(ART)
    mutate(a)
    put("badart_" + name + ".msgpack", pack(a))


bad_art("buffer_oob", lambda a: a["steps"][0].update(bufs=[0, 1, 9]))
bad_art("bufs_len", lambda a: a["steps"][2].update(bufs=[3]))
bad_art("arena_ref_output", lambda a: a.update(outputs=[{"ref": 0}]))
bad_art("binding_not_sym", lambda a: a.update(bindings=[{"input": 1, "dim": 0}]))
bad_art("fallback_ref_oob", lambda a: a["steps"][1].update(args=[[{"ref": 4}]]))
bad_art("arena_misaligned", lambda a: a["buffers"][2].update(offset=3))
bad_art("kernel_name", lambda a: a["kernels"][0].update(name="k-0"))
bad_art("output_twice", lambda a: a["buffers"].append(
    {"kind": "output", "index": 0, "bytes": 4}))

# ---- reproducers of findings (see README.md § Findings) ----------------------

# kiln_graph_pack wrote a symbolic expression holding the constant INT64_MIN
# as "(-9223372036854775808)", which does not parse back (fixed in 7252394).
REPRO_INT64_MIN = {"format": "kiln.graph/1", "symbols": {"s": {}},
                   "inputs": [{"sym": "s+(-9223372036854775807-1)"}],
                   "nodes": [], "outputs": []}
files["regress_pack_int64_min.msgpack"] = pack(REPRO_INT64_MIN)
# kiln_graph_pack failed (-ENOMEM) on a valid expression whose printed form
# exceeds its 1024-byte buffer: 16 terms of a 64-byte symbol name (fixed in
# 7252394).
LONG = "s" * 64
files["regress_pack_long_expr.msgpack"] = pack(
    {"format": "kiln.graph/1", "symbols": {LONG: {}},
     "inputs": [{"sym": "+".join([LONG] * 16)}], "nodes": [], "outputs": []})


DICT_TOKENS = [
    "v", "id", "op", "ok", "error", "code", "message", "node", "graph",
    "target", "options", "priority", "signature", "backend", "arch",
    "features", "mode", "dynamic", "format", "kiln.graph/1", "inputs",
    "nodes", "outputs", "symbols", "dtype", "shape", "strides", "args",
    "kwargs", "out", "ref", "sym", "min", "max", "hint", "name",
    "cpu", "cuda", "sm_90", "default", "reduce-overhead", "max-autotune",
    "aten.add.Tensor", "prims.convert_element_type.default",
] + [n for n in ("hello compile lookup status list evict gc shutdown "
                 "f32 f64 f16 bf16 i8 i16 i32 i64 u8 bool").split()] + \
    [e for e in ("bad_frame bad_request unsupported_version invalid_graph "
                 "unsupported_op compile_failed too_large busy timeout "
                 "not_found permission_denied shutting_down internal").split()]
DICT_RAW = ["s0", "//", "%", "min(", "max(", "(", ")", "-", "*", "+", ",",
            "9223372036854775807"]


def write_dict(path):
    with open(path, "w") as f:
        for t in DICT_TOKENS:
            f.write('"%s"\n' % "".join("\\x%02x" % b for b in pack(t)))
        for t in DICT_RAW:
            f.write('"%s"\n' % t)
        # msgpack headers: array32/map32/str32 with big counts, f64 NaN.
        for raw in (b"\xdd\xff\xff\xff\xff", b"\xdf\x00\x01\x00\x00",
                    b"\xdb\x00\x00\x10\x00", b"\xcb\x7f\xf8\0\0\0\0\0\0",
                    b"\xca\x7f\xc0\0\0", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
                    b"\xd3\x80\0\0\0\0\0\0\0", b"\x81\xa3ref", b"\x81\xa3sym"):
            f.write('"%s"\n' % "".join("\\x%02x" % b for b in raw))


def main():
    args = sys.argv[1:]
    dict_path = None
    if "--dict" in args:
        i = args.index("--dict")
        dict_path = args[i + 1]
        del args[i:i + 2]
    work = "--work" in args
    if work:
        args.remove("--work")
    out = args[0] if args else os.path.join(HERE, "corpus")
    if work:
        for fn in sorted(os.listdir(GRAPHS)):
            if fn.endswith(".graph.msgpack"):
                with open(os.path.join(GRAPHS, fn), "rb") as f:
                    g = msgpack.unpackb(f.read(), raw=False)
                files["graphwrap_" + fn[:-len(".graph.msgpack")]] = frame(
                    pack(req("compile", 1, graph=g, target={"backend": "cpu"})))
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(files.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(files)} seeds, {sum(map(len, files.values()))} bytes -> {out}")
    if dict_path:
        write_dict(dict_path)
        print(f"dictionary -> {dict_path}")


if __name__ == "__main__":
    main()
