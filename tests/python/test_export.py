"""Tests of the Python side of Graph v1: the corpus, the exporter, the test
PRNG, and round trips through the C decoder (kilnc, skipped until built).

Offline, CPU only; captures only the small MLP."""

import glob
import json
import math
import os
import random
import re
import subprocess

import msgpack
import numpy as np
import pytest

from conftest import CORPUS_DIR

# --------------------------------------------------------------------------
# GRAPH.md in Python: expressions, a validator, a normal form

DTYPES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "i16": 2, "i32": 4,
          "i64": 8, "u8": 1, "bool": 1}
OP_RE = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
SYM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_RANK = 12
_TOK = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),]))")


def parse_expr(s):
    """GRAPH.md expression grammar -> AST tuples; raises ValueError."""
    toks, pos = [], 0
    s = s.rstrip()
    while pos < len(s):
        m = _TOK.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad character at {pos} in {s!r}")
        pos = m.end()
        if m.group(1) is not None:
            toks.append(("int", int(m.group(1))))
        elif m.group(2) is not None:
            toks.append(("name", m.group(2)))
        else:
            toks.append(("op", m.group(3)))
    toks.append(("end", None))
    i = 0

    def peek():
        return toks[i]

    def take(kind, val=None):
        nonlocal i
        t = toks[i]
        if t[0] != kind or (val is not None and t[1] != val):
            raise ValueError(f"expected {val or kind} in {s!r}, got {t}")
        i += 1
        return t

    def expr():
        a = term()
        while peek() in (("op", "+"), ("op", "-")):
            op = take("op")[1]
            a = (op, a, term())
        return a

    def term():
        a = unary()
        while peek() in (("op", "*"), ("op", "//"), ("op", "%")):
            op = take("op")[1]
            a = (op, a, unary())
        return a

    def unary():
        if peek() == ("op", "-"):
            take("op", "-")
            return ("neg", unary())
        return atom()

    def atom():
        t = peek()
        if t[0] == "int":
            take("int")
            return ("c", t[1])
        if t[0] == "name":
            take("name")
            if t[1] in ("min", "max"):
                take("op", "(")
                a = expr()
                take("op", ",")
                b = expr()
                take("op", ")")
                return (t[1], a, b)
            return ("s", t[1])
        if t == ("op", "("):
            take("op", "(")
            a = expr()
            take("op", ")")
            return a
        raise ValueError(f"unexpected {t} in {s!r}")

    tree = expr()
    take("end")
    return tree


def expr_symbols(tree, acc):
    if tree[0] == "s":
        if tree[1] not in acc:
            acc.append(tree[1])
    elif tree[0] != "c":
        for sub in tree[1:]:
            expr_symbols(sub, acc)
    return acc


def eval_expr(tree, vals):
    k = tree[0]
    if k == "c":
        return tree[1]
    if k == "s":
        return vals[tree[1]]
    if k == "neg":
        return -eval_expr(tree[1], vals)
    a, b = eval_expr(tree[1], vals), eval_expr(tree[2], vals)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
            "//": lambda: a // b, "%": lambda: a % b,
            "max": lambda: max(a, b), "min": lambda: min(a, b)}[k]()


def eval_dim(d, vals):
    if isinstance(d, int) and not isinstance(d, bool):
        return d
    return eval_expr(parse_expr(d), vals)


def contiguous_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return list(reversed(st))


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def validate_graph(g):
    """Asserts g is a valid Graph v1 map (GRAPH.md § Validation)."""
    assert isinstance(g, dict), "graph is not a map"
    assert g.get("format") == "kiln.graph/1", "bad format"
    for k in ("inputs", "nodes", "outputs"):
        assert isinstance(g.get(k), list), f"{k} missing or not a list"
    syms = g.get("symbols", {}) or {}
    assert isinstance(syms, dict)
    for name, info in syms.items():
        assert SYM_RE.match(name) and name not in ("min", "max"), f"bad symbol name {name}"
        lo, hi = info.get("min", 0), info.get("max")
        assert _is_int(lo) and lo >= 0, f"symbol {name}: bad min"
        assert hi is None or (_is_int(hi) and hi >= lo), f"symbol {name}: bad max"
        if "hint" in info and info["hint"] is not None:
            assert _is_int(info["hint"]) and info["hint"] >= lo
            assert hi is None or info["hint"] <= hi

    def check_expr(s, where):
        assert isinstance(s, str), f"{where}: expression is not a string"
        try:
            tree = parse_expr(s)
        except ValueError as ex:
            raise AssertionError(f"{where}: {ex}") from None
        for name in expr_symbols(tree, []):
            assert name in syms, f"{where}: undeclared symbol {name}"

    def check_dim(d, where):
        if _is_int(d):
            assert d >= 0, f"{where}: negative"
        else:
            check_expr(d, where)

    def check_spec(sp, where):
        assert isinstance(sp, dict), f"{where}: spec is not a map"
        assert sp.get("dtype") in DTYPES, f"{where}: bad dtype {sp.get('dtype')}"
        shape = sp.get("shape")
        assert isinstance(shape, list) and len(shape) <= MAX_RANK, f"{where}: bad shape"
        for d in shape:
            check_dim(d, where)
        if "strides" in sp:
            assert isinstance(sp["strides"], list) and len(sp["strides"]) == len(shape), \
                f"{where}: strides length"
            for d in sp["strides"]:
                check_dim(d, where)

    nval = 0
    for i, inp in enumerate(g["inputs"]):
        if "sym" in inp:
            check_expr(inp["sym"], f"input {i}")
        else:
            check_spec(inp, f"input {i}")
        nval += 1

    def check_arg(a, where):
        if a is None or isinstance(a, (bool, str)):
            return
        if _is_int(a):
            assert -(1 << 63) <= a < (1 << 64)
            return
        if isinstance(a, float):
            assert not math.isnan(a), f"{where}: NaN"
            return
        if isinstance(a, list):
            for x in a:
                check_arg(x, where)
            return
        if isinstance(a, dict):
            if set(a) == {"ref"}:
                assert _is_int(a["ref"]) and 0 <= a["ref"] < nval, \
                    f"{where}: ref {a['ref']} is not defined before this node"
                return
            if set(a) == {"sym"}:
                check_expr(a["sym"], where)
                return
        raise AssertionError(f"{where}: bad argument {a!r}")

    for j, n in enumerate(g["nodes"]):
        where = f"node {j} ({n.get('op')})"
        assert isinstance(n.get("op"), str) and OP_RE.match(n["op"]), f"{where}: bad op"
        for a in n.get("args", []):
            check_arg(a, where)
        kw = n.get("kwargs", {})
        assert isinstance(kw, dict)
        for k, a in kw.items():
            assert isinstance(k, str)
            check_arg(a, where)
        assert isinstance(n.get("out"), list), f"{where}: out"
        for o in n["out"]:
            check_spec(o, where)
        nval += len(n["out"])
    for i, o in enumerate(g["outputs"]):
        if "ref" in o:
            assert set(o) == {"ref"} and _is_int(o["ref"]) and 0 <= o["ref"] < nval, \
                f"output {i}: bad ref"
        else:
            assert set(o) == {"sym"}, f"output {i}: not ref/sym"
            check_expr(o["sym"], f"output {i}")
    return nval


def symbol_order(g):
    """Symbol names in order of first use (inputs, nodes, outputs)."""
    order = []

    def visit(x):
        if isinstance(x, str):
            try:
                expr_symbols(parse_expr(x), order)
            except ValueError:
                pass

    def visit_spec(sp):
        for d in sp.get("shape", []) + sp.get("strides", []):
            visit(d)

    def visit_arg(a):
        if isinstance(a, list):
            for x in a:
                visit_arg(x)
        elif isinstance(a, dict) and "sym" in a:
            visit(a["sym"])

    for inp in g["inputs"]:
        visit(inp["sym"]) if "sym" in inp else visit_spec(inp)
    for n in g["nodes"]:
        for a in n.get("args", []):
            visit_arg(a)
        for k in sorted(n.get("kwargs", {})):
            visit_arg(n["kwargs"][k])
        for o in n["out"]:
            visit_spec(o)
    for o in g["outputs"]:
        if "sym" in o:
            visit(o["sym"])
    for name in g.get("symbols", {}) or {}:
        if name not in order:
            order.append(name)
    return order


def normal_form(g, values):
    """g with symbols bound positionally (order of first use) to values:
    every dimension, stride and sym evaluated; unknown keys dropped; absent
    strides made explicit; ints, floats and bools told apart."""
    order = symbol_order(g)
    vals = {name: values[i] for i, name in enumerate(order)}
    syms = g.get("symbols", {}) or {}

    def spec(sp):
        shape = [eval_dim(d, vals) for d in sp["shape"]]
        strides = ([eval_dim(d, vals) for d in sp["strides"]] if "strides" in sp
                   else contiguous_strides(shape))
        return (sp["dtype"], tuple(shape), tuple(strides))

    def arg(a):
        if a is None:
            return ("nil",)
        if isinstance(a, bool):
            return ("bool", a)
        if _is_int(a):
            return ("int", a)
        if isinstance(a, float):
            return ("float", a)
        if isinstance(a, str):
            return ("str", a)
        if isinstance(a, list):
            return ("list", tuple(arg(x) for x in a))
        if "ref" in a:
            return ("ref", a["ref"])
        return ("sym", eval_dim(a["sym"], vals))

    inputs = tuple(("sym", eval_dim(i["sym"], vals)) if "sym" in i else spec(i)
                   for i in g["inputs"])
    nodes = tuple((n["op"], tuple(arg(a) for a in n.get("args", [])),
                   tuple(sorted((k, arg(a)) for k, a in n.get("kwargs", {}).items())),
                   tuple(spec(o) for o in n["out"])) for n in g["nodes"])
    outputs = tuple(("ref", o["ref"]) if "ref" in o else ("sym", eval_dim(o["sym"], vals))
                    for o in g["outputs"])
    symbols = tuple((syms[n].get("min", 0), syms[n].get("max"), syms[n].get("hint"))
                    for n in order if n in syms)
    return {"inputs": inputs, "nodes": nodes, "outputs": outputs, "symbols": symbols}


def sample_values(g, k=4, seed=0):
    """k assignments of values to g's symbols (first-use order), hints first."""
    syms = g.get("symbols", {}) or {}
    order = symbol_order(g)
    rnd = random.Random(seed)
    res = [[syms[n].get("hint") or max(2, syms[n].get("min", 0)) for n in order]]
    for _ in range(k - 1):
        row = []
        for n in order:
            lo = max(syms[n].get("min", 0), 1)
            hi = syms[n].get("max") or lo + 100
            row.append(rnd.randint(lo, min(hi, lo + 100)))
        res.append(row)
    return res


def load(path):
    with open(path, "rb") as f:
        return msgpack.unpackb(f.read(), raw=False, strict_map_key=False)


GRAPH_FILES = sorted(glob.glob(os.path.join(CORPUS_DIR, "*.graph.msgpack")))
IO_FILES = sorted(glob.glob(os.path.join(CORPUS_DIR, "*.io.msgpack")))
EXPECTED_MODELS = {"mlp", "cnn", "resnet18", "transformer_layer", "gpt2", "bert", "vit",
                   "transformer_dyn"}


def _ids(paths):
    return [os.path.basename(p).split(".")[0] for p in paths]


# --------------------------------------------------------------------------
# (a) the corpus


def test_corpus_present():
    with open(os.path.join(CORPUS_DIR, "index.json")) as f:
        index = json.load(f)
    models = {e["model"] for e in index["graphs"]}
    assert EXPECTED_MODELS <= models
    assert len(GRAPH_FILES) == len(IO_FILES) == len(index["graphs"])
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(CORPUS_DIR, "*")))
    assert total < 16e6, f"corpus is {total / 1e6:.1f} MB"
    assert any(e["dynamic"] for e in index["graphs"])
    for e in index["graphs"]:
        g = load(os.path.join(CORPUS_DIR, e["graph"]))
        assert len(g["nodes"]) == e["nodes"]
        assert sorted({n["op"] for n in g["nodes"]}) == e["ops"]
        assert os.path.exists(os.path.join(CORPUS_DIR, e["io"]))


@pytest.mark.parametrize("path", GRAPH_FILES, ids=_ids(GRAPH_FILES))
def test_corpus_graph_valid(path):
    g = load(path)
    validate_graph(g)
    assert g["nodes"], "empty graph"
    # exported graphs use no getitem and only ATen/prims ops
    for n in g["nodes"]:
        assert n["op"].split(".")[0] in ("aten", "prims"), n["op"]
    # every value a node defines is a tensor spec; none_outputs are positions
    for p in g.get("none_outputs", []):
        assert _is_int(p) and p >= 0


def _value_specs(g):
    specs = list(g["inputs"])
    for n in g["nodes"]:
        specs += n["out"]
    return specs


@pytest.mark.parametrize("path", IO_FILES, ids=_ids(IO_FILES))
def test_corpus_io_matches_graph(path):
    from kiln import testrng
    io = load(path)
    g = load(path.replace(".io.msgpack", ".graph.msgpack"))
    assert io["format"] == "kiln.io/1"
    syms = g.get("symbols", {}) or {}
    vals = io.get("symbols", {}) or {}
    assert set(vals) == set(syms)
    for k, v in vals.items():
        assert v >= syms[k].get("min", 0) and (syms[k].get("max") is None or v <= syms[k]["max"])
    assert io["rtol"] > 0 and io["atol"] > 0
    assert io.get("none_outputs", []) == g.get("none_outputs", [])

    def check_tensor(e, sp, where, is_output):
        assert e["dtype"] == sp["dtype"], where
        shape = [eval_dim(d, vals) for d in sp["shape"]]
        assert e["shape"] == shape, f"{where}: shape {e['shape']} != {shape}"
        n = int(np.prod(shape, dtype=np.int64))
        if "data" in e:
            assert isinstance(e["data"], bytes) and len(e["data"]) == n * DTYPES[e["dtype"]], where
            if e["dtype"] in ("f32", "f64") and is_output:
                a = np.frombuffer(e["data"], dtype="<f4" if e["dtype"] == "f32" else "<f8")
                assert not np.isnan(a).any(), f"{where}: NaN in output"  # -inf masks occur
        else:
            assert not is_output, f"{where}: outputs must be data"
            gen = e["gen"]
            if gen["kind"] == "uniform":
                assert e["dtype"] in ("f32", "f64", "f16", "bf16") and gen["lo"] <= gen["hi"]
            else:
                assert gen["kind"] == "randint" and gen["lo"] < gen["hi"]
            assert n > 4096, f"{where}: small inputs are stored as data"
            a = testrng.generate(gen, e["dtype"], shape)
            assert a.shape == tuple(shape)

    assert len(io["inputs"]) == len(g["inputs"])
    for i, (e, sp) in enumerate(zip(io["inputs"], g["inputs"])):
        if "sym" in sp:
            assert e == {"int": eval_dim(sp["sym"], vals)}, f"input {i}"
        else:
            check_tensor(e, sp, f"input {i}", False)
    specs = _value_specs(g)
    assert len(io["outputs"]) == len(g["outputs"])
    for i, (e, o) in enumerate(zip(io["outputs"], g["outputs"])):
        if "sym" in o:
            assert e == {"int": eval_dim(o["sym"], vals)}, f"output {i}"
        else:
            sp = specs[o["ref"]]
            if "sym" in sp:
                assert e == {"int": eval_dim(sp["sym"], vals)}
            else:
                check_tensor(e, sp, f"output {i}", True)
    if path.endswith("_bwd.io.msgpack"):
        assert all("gen" not in e for e in io["inputs"]), "backward inputs are stored as data"


# --------------------------------------------------------------------------
# (b) the test PRNG

M64 = (1 << 64) - 1


def scalar_z(seed, i):
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


GOLDEN_Z = {  # computed once from the spec by scalar_z; seed 0 is SplitMix64's own first output
    0: [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC],
    42: [0xBDD732262FEB6E95, 0x28EFE333B266F103, 0x47526757130F9F52, 0x581CE1FF0E4AE394],
    (1 << 63) + 5: [0x54A64D19D7534F30, 0x122F831FDB27D31F, 0x46A5E4F0BD582C07,
                    0x39D296E2AD6189C5],
}


def test_prng_golden():
    from kiln import testrng
    for seed, want in GOLDEN_Z.items():
        assert [scalar_z(seed, i) for i in range(4)] == want
        assert [int(x) for x in testrng.raw(seed, 4)] == want
    u = testrng.uniform(42, (2, 2), -1.0, 1.0, "f32")
    assert u.dtype == np.float32
    assert [hex(x) for x in u.view(np.uint32).ravel()] == \
        ["0x3ef75cc8", "0xbf2e203a", "0xbee2b664", "0xbe9f8c7c"]
    assert testrng.uniform(7, (4,), 0.5, 1.5, "f64").tolist() == \
        [0.889829695224762, 0.5167882442474365, 1.4007606506347656, 1.0829302668571472]
    assert testrng.randint(9, (6,), -3, 7, "i64").tolist() == [5, 3, 5, 1, -2, -3]
    assert testrng.randint(123, (2, 3), 0, 512, "i32").tolist() == [[299, 380, 488],
                                                                    [511, 306, 16]]


def test_prng_matches_scalar_spec():
    from kiln import testrng
    rnd = random.Random(1)
    for _ in range(20):
        seed = rnd.getrandbits(64)
        n = 257
        z = testrng.raw(seed, n)
        idx = [0, 1, 2, 100, 255, 256]
        assert [int(z[i]) for i in idx] == [scalar_z(seed, i) for i in idx]
        lo, hi = -rnd.random() * 3, rnd.random() * 3
        v = testrng.uniform(seed, (n,), lo, hi, "f32")
        for i in idx:
            want = np.float32(lo + (hi - lo) * ((scalar_z(seed, i) >> 40) * 2.0 ** -24))
            assert v[i] == want
        r = testrng.randint(seed, (n,), -5, 1000, "i64")
        for i in idx:
            assert r[i] == -5 + scalar_z(seed, i) % 1005
    # bf16 rounds f64 straight to bf16 (ties to even), like torch
    import torch
    f = testrng.uniform_f64(3, 1000, -2.0, 2.0)
    want = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (testrng.uniform(3, (1000,), -2.0, 2.0, "bf16") == want).all()


# --------------------------------------------------------------------------
# the exporter (no kilnc needed)


def _capture_mlp(batch=8):
    import capture_corpus as cc
    import torch
    m, (x,), train, dyn = cc.model_mlp()
    if batch != x.shape[0]:
        x = torch.from_numpy(cc.testrng.uniform(1, (batch, x.shape[1]), -1, 1, "f32"))
    return cc.capture(m, (x,), train, dyn)


@pytest.fixture(scope="module")
def mlp_graphs():
    from kiln.export import export_graph
    cap = _capture_mlp()
    return cap, [export_graph(g["gm"], g["example_inputs"]) for g in cap.graphs]


def test_export_mlp_matches_corpus(mlp_graphs, tmp_path):
    """The checked-in corpus is what the current exporter produces."""
    import capture_corpus as cc
    cap, graphs = mlp_graphs
    for g in graphs:
        validate_graph(g)
    for kind, g in zip(("fwd", "bwd"), graphs):
        assert load(os.path.join(CORPUS_DIR, f"mlp_{kind}.graph.msgpack")) == g
    cc.export_capture("mlp", cap, out_dir=str(tmp_path))
    for kind in ("fwd", "bwd"):
        new = load(tmp_path / f"mlp_{kind}.io.msgpack")
        old = load(os.path.join(CORPUS_DIR, f"mlp_{kind}.io.msgpack"))
        if kind == "fwd":
            assert new["inputs"] == old["inputs"]  # regenerated bit-exactly
        for a, b in zip(new["outputs"] + new["inputs"], old["outputs"] + old["inputs"]):
            if "data" in a and a["dtype"] == "f32":
                x = np.frombuffer(a["data"], "<f4")
                y = np.frombuffer(b["data"], "<f4")
                np.testing.assert_allclose(x, y, rtol=old["rtol"], atol=old["atol"])
            else:
                assert a == b


def test_export_structure(mlp_graphs):
    _, (fw, bw) = mlp_graphs
    ops = [n["op"] for n in fw["nodes"]]
    assert "aten.addmm.default" in ops and "aten.native_layer_norm.default" in ops
    ln = next(n for n in fw["nodes"] if n["op"] == "aten.native_layer_norm.default")
    assert len(ln["out"]) == 3  # getitems folded into the producer
    assert all("getitem" not in n["op"] for n in fw["nodes"] + bw["nodes"])
    # AOT backward returns None for the input x: dropped and recorded
    assert bw["none_outputs"] == [2]
    t = next(n for n in fw["nodes"] if n["op"] == "aten.t.default")
    assert t["out"][0]["strides"] == [1, 32]  # non-contiguous: strides given
    assert "strides" not in fw["inputs"][0]


def test_export_dynamic_shapes():
    import capture_corpus as cc
    import torch
    from kiln.export import export_graph
    m, (x,), _, _ = cc.model_mlp()
    x = torch.from_numpy(cc.testrng.uniform(1, (4, 10, 32), -1, 1, "f32"))
    cap = cc.capture(m, (x,), True, ((0, 1),))
    fw, bw = (export_graph(g["gm"], g["example_inputs"]) for g in cap.graphs)
    for g in (fw, bw):
        validate_graph(g)
        (name,) = g["symbols"]
        assert g["symbols"][name] == {"min": 2, "max": None, "hint": 10}
    sym_inputs = [i["sym"] for i in fw["inputs"] if "sym" in i]
    assert sym_inputs == [name]
    xin = next(i for i in fw["inputs"] if i.get("shape", [None])[:1] == [4])
    assert xin["shape"] == [4, name, 32]
    # sym_size / SymInt arithmetic is folded into {"sym": expr} args
    views = [n for n in fw["nodes"] if n["op"] == "aten.view.default"]
    assert {"sym": f"4*{name}"} in views[0]["args"][1]
    # backward: a SymInt input bound to an expression
    assert any(i.get("sym") == f"4*{name}" for i in bw["inputs"])
    assert any(o.get("sym") == name for o in fw["outputs"])


def _printer():
    from kiln.export import _ExprPrinter
    return _ExprPrinter(lambda s: None)


def test_expression_printer():
    import sympy
    from torch.utils._sympy.functions import (CeilDiv, FloorDiv, Max, Min, Mod,
                                              ModularIndexing, PythonMod)
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cases = [
        s0, 64 * s0, s0 + 1, s0 - 1, 2 - 3 * s0, -s0, -2 * s0 * s1, s0 * s1 + s0 - 7,
        s0 ** 2, FloorDiv(s0 - 1, 2) + 1, FloorDiv(s0, s1), 3 * FloorDiv(s0 + 5, 4),
        PythonMod(s0, 3), Mod(s0 + s1, 5), Max(1, s0), Min(s0, s1 + 2), Max(s0, s1, 4),
        ModularIndexing(s0, 2, 3), CeilDiv(s0, 4), FloorDiv(s0 * s1, 8) * s1,
        s0 * FloorDiv(s1, 3), FloorDiv(-s0 + 7, 2), sympy.Integer(-4), sympy.Integer(0),
    ]
    p = _printer()
    for e in cases:
        s = p(e)
        tree = parse_expr(s)
        for v0, v1 in ((1, 1), (2, 3), (7, 5), (64, 9), (100, 100)):
            want = int(e.subs({s0: v0, s1: v1}))
            assert eval_expr(tree, {"s0": v0, "s1": v1}) == want, (e, s, v0, v1)
    assert p(s0 + 1) == "s0 + 1"
    assert p(FloorDiv(s0 - 1, 2) + 1) == "(s0 - 1)//2 + 1"
    assert p(Max(2, s0)) in ("max(2, s0)", "max(s0, 2)")


# --------------------------------------------------------------------------
# (e) ExportError


def _fx(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode="fake")(*args)


def test_export_error_complex():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: torch.view_as_complex(x) * 2, torch.randn(4, 2))
    with pytest.raises(ExportError, match=r"node .*complex"):
        export_graph(gm)


def test_export_error_nan_arg():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: torch.ops.aten.add.Tensor(x, float("nan")), torch.randn(3))
    with pytest.raises(ExportError, match="NaN"):
        export_graph(gm)


def test_export_error_non_aten_target():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: torch.ops.aten.relu.default(x), torch.randn(3))
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.target = torch.sigmoid  # a Python-level function, not an OpOverload
    with pytest.raises(ExportError, match=r"node relu.*not an ATen OpOverload"):
        export_graph(gm)


def test_export_error_get_attr():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: x + torch.tensor([1.0, 2.0, 3.0]), torch.randn(3))
    if not any(n.op == "get_attr" for n in gm.graph.nodes):
        pytest.skip("make_fx did not produce a get_attr constant")
    with pytest.raises(ExportError, match="get_attr"):
        export_graph(gm)


def test_export_uniform_constants_become_full():
    """A constant tensor of one value (transformers' torch.tensor([]), a
    scalar) is an aten.full node of that value, bit for bit (-0.0 stays
    negative); an empty one is a full of zero elements."""
    import torch
    from kiln.export import export_graph
    gm = _fx(lambda x: torch.cat([(x + torch.tensor([4.0, 4.0, 4.0])) * torch.tensor(-0.0),
                                  torch.tensor([])]), torch.randn(3))
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"]
    if not consts:
        pytest.skip("make_fx did not produce a get_attr constant")
    g = export_graph(gm)
    validate_graph(g)
    fulls = [n for n in g["nodes"] if n["op"] == "aten.full.default"]
    assert len(fulls) == len(consts) == 3
    got = {(tuple(n["args"][0]), n["args"][1], math.copysign(1.0, n["args"][1]))
           for n in fulls}
    assert got == {((3,), 4.0, 1.0), ((), 0.0, -1.0), ((0,), 0, 1.0)}
    for n in fulls:
        assert n["kwargs"] == {"dtype": "f32"}
        assert n["out"] == [{"dtype": "f32", "shape": n["args"][0]}]


def test_export_error_constant_of_several_values():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: x * torch.tensor([-0.0, 0.0]), torch.randn(2))
    if not any(n.op == "get_attr" for n in gm.graph.nodes):
        pytest.skip("make_fx did not produce a get_attr constant")
    with pytest.raises(ExportError, match="get_attr.*not all the same value"):
        export_graph(gm)


def test_export_error_unknown_arg_type():
    import torch
    from kiln.export import ExportError, export_graph
    gm = _fx(lambda x: torch.ops.aten.relu.default(x), torch.randn(3))
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.args = (relu.args[0], object())
    with pytest.raises(ExportError, match="argument of type object"):
        export_graph(gm)


def test_export_none_output_and_multi_output():
    import torch
    from kiln.export import dumps, export_graph

    def f(x):
        mx, idx = torch.ops.aten.max.dim(x, 1)
        return (None, idx, torch.ops.aten.relu.default(x))

    g = export_graph(_fx(f, torch.randn(3, 4)))
    validate_graph(g)
    assert g["none_outputs"] == [0]
    (mx,) = [n for n in g["nodes"] if n["op"] == "aten.max.dim"]
    assert [o["dtype"] for o in mx["out"]] == ["f32", "i64"]  # unused output still listed
    assert g["outputs"] == [{"ref": 2}, {"ref": 3}]
    assert msgpack.unpackb(dumps(g)) == g


# --------------------------------------------------------------------------
# (c) kilnc round trip and (d) signatures


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _signature(kilnc, path):
    r = _run([kilnc, "--signature", str(path)])
    assert r.returncode == 0, f"kilnc --signature {path}: {r.stderr}"
    sig = r.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", sig), sig
    return sig


@pytest.mark.parametrize("path", GRAPH_FILES, ids=_ids(GRAPH_FILES))
def test_kilnc_roundtrip(kilnc, path, tmp_path):
    out = tmp_path / "re.graph.msgpack"
    r = _run([kilnc, "--emit=graph", path, "-o", str(out)])
    assert r.returncode == 0, r.stderr
    g, back = load(path), load(out)
    validate_graph(back)
    for vals in sample_values(g):
        assert normal_form(back, vals) == normal_form(g, vals)
    assert _signature(kilnc, path) == _signature(kilnc, out)


def test_kilnc_profile_times_every_step(kilnc):
    g = os.path.join(CORPUS_DIR, "mlp_fwd.graph.msgpack")
    io = os.path.join(CORPUS_DIR, "mlp_fwd.io.msgpack")
    r = _run([kilnc, g, "--run", io, "--profile"])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("profile: ")]
    assert len(head) == 1, r.stdout
    m = re.match(r"profile: ([0-9.]+) ms per run over 20 runs, ([0-9.]+) ms in (\d+) steps",
                 lines[head[0]])
    assert m, lines[head[0]]
    n = int(m.group(3))
    rows = lines[head[0] + 2:head[0] + 2 + n]
    assert 0 < n <= 25 and len(rows) == n, r.stdout
    steps, ms, pct = [], [], 0.0
    for row in rows:
        f = row.split()
        assert re.fullmatch(r"kiln_k\d+|fallback", f[1]), row
        steps.append(int(f[0]))
        ms.append(float(f[2]))
        pct += float(f[3])
    assert sorted(steps) == list(range(n))  # every step once
    assert ms == sorted(ms, reverse=True)  # the costliest first
    assert abs(pct - 100.0) < 0.5 * n  # rounded shares of the whole


def test_kilnc_profile_all_and_n_rows(kilnc):
    """--profile lists the costliest 25 steps and says how many it left
    out; --profile=all lists every one, --profile=N N; a count that is not
    one is a usage error."""
    g = os.path.join(CORPUS_DIR, "resnet18_fwd.graph.msgpack")
    io = os.path.join(CORPUS_DIR, "resnet18_fwd.io.msgpack")

    def rows(arg):
        r = _run([kilnc, g, "--run", io, arg])
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        h = [i for i, l in enumerate(lines) if l.startswith("profile: ")][0]
        n = int(re.search(r"in (\d+) steps", lines[h]).group(1))
        got = [l for l in lines[h + 2:] if re.match(r"\s+\d+\s+(kiln_k\d+|fallback)\s", l)]
        more = [l for l in lines[h + 2:] if "more steps" in l]
        return n, got, more

    n, got, more = rows("--profile")
    assert n > 25 and len(got) == 25, (n, got)
    assert more == [f"  ({n - 25} more steps: --profile=all shows them)"], more
    n, got, more = rows("--profile=all")
    assert len(got) == n and not more
    assert sorted(int(l.split()[0]) for l in got) == list(range(n))
    n, got, more = rows("--profile=3")
    assert len(got) == 3 and more == [f"  ({n - 3} more steps: --profile=all shows them)"]
    for bad in ("0", "-1", "x", "3x", ""):
        r = _run([kilnc, g, "--run", io, f"--profile={bad}"])
        assert r.returncode == 2, (bad, r.stdout)
        assert f"--profile={bad}: want a number of rows (1 or more) or all" in r.stderr


def test_kilnc_dynamic_reshape_divides_by_constants(kilnc):
    """transformer_dyn_fwd's attention reshapes [2*s50, 192] into [s50, 2, 3,
    8, 16]: (16*i1 + i2 + 16*s50*i0) // (64*s50) is i0 // 4, as i1 < s50 and
    i2 < 16 (ix.c symsplit_factor). No index of the lowered graph divides by
    an expression of the symbol; a division per element by 64*s50 made
    LLVM scalarize 8-lane 64-bit divisions and gather."""
    g = os.path.join(CORPUS_DIR, "transformer_dyn_fwd.graph.msgpack")
    r = _run([kilnc, g, "--emit=ir"])
    assert r.returncode == 0, r.stderr
    assert "(i0//4)" in r.stdout, r.stdout
    assert not re.search(r"(//|%)\(?[0-9*]*s50", r.stdout), r.stdout


def _output_members(kilnc, tmp_path, name, graph):
    """The (node, op) of every kernel member that writes a graph output."""
    p = _write(tmp_path, name, graph)
    r = _run([kilnc, str(p), "--emit=kernels"])
    assert r.returncode == 0, r.stderr
    return sorted(re.findall(r"\(output\)\s+<- node (\d+) (\S+)", r.stdout))


def test_kilnc_dynamic_training_forward_returns_views_like_static(kilnc, tmp_path):
    """A transformer layer's training forward with a dynamic sequence length
    saves q, k and v (selected from its qkv projection and viewed) and the
    attention output for the backward. At symbolic sizes, as at static ones,
    they are views of the buffers those values are computed into (lower.c
    output_view_bases; ops_view.c view_strides), not copies made again
    at the end: the kernels that write outputs come from the same nodes."""
    import capture_corpus as cc
    from kiln.export import export_graph
    torch = pytest.importorskip("torch")
    members = {}
    for dyn in (False, True):
        torch.manual_seed(0)
        m = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             dropout=0.0, batch_first=True).train()
        x = torch.rand(2, 16, 32)
        cap = cc.capture(m, (x,), True, ((0, 1),) if dyn else ())
        fw = export_graph(cap.graphs[0]["gm"], cap.graphs[0]["example_inputs"])
        assert bool(fw.get("symbols")) == dyn
        members[dyn] = _output_members(kilnc, tmp_path, f"fw{int(dyn)}.msgpack", fw)
    assert members[True] == members[False], members
    # the saved views are no kernel's output; only a clone's view is
    assert [op for _, op in members[True] if op == "aten.view.default"] == \
        ["aten.view.default"], members[True]


def test_export_refuses_as_strided_of_an_input_view_at_a_storage_offset():
    """as_strided reads its self's storage from the storage's start; kiln
    passes a graph input from its first element, so a graph whose as_strided
    reads an input that is a view at a storage offset (big[1:5]) cannot be
    exported: a clear ExportError (the backend then warns and falls back).
    The same graph traced with an input at offset 0 exports."""
    torch = pytest.importorskip("torch")
    from torch._dynamo.backends.common import aot_autograd
    from kiln.export import ExportError, export_graph
    got = []

    def fw(gm, example_inputs):
        try:
            export_graph(gm, example_inputs)
            got.append("ok")
        except ExportError as e:
            got.append(str(e))
        return gm

    def f(x):
        return x.as_strided((2, 2), (2, 1), 1) * 2

    big = torch.arange(6.0)
    for x in (big[1:5], big[:4]):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(f, backend=aot_autograd(fw_compiler=fw))(x)
    assert len(got) == 2, got
    assert "reads the storage of input" in got[0] and "storage offset 1" in got[0], got
    assert got[1] == "ok", got


def test_kilnc_symbolic_index_out_of_range_reads_nothing(kilnc, tmp_path):
    """A select or slice whose index or start is a symbol bound only when
    the graph runs (an int input) cannot be checked at compile time: where
    it is not provably in range, its reads are guarded (ops_view.c
    lt_in_range), so an index past the dim -- 2^33 once read 32 GiB past
    the buffer and crashed -- gives zeros, kiln's rule for out-of-range
    indices, and an index in range gives torch's values."""
    import capture_corpus as cc
    torch = pytest.importorskip("torch")
    x = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    syms = {"s1": {"min": 0, "max": 1 << 40}}
    graphs = {
        "select": ({"op": "aten.select.int", "args": [{"ref": 0}, 0, {"sym": "s1"}],
                    "out": [{"dtype": "f32", "shape": [4]}]},
                   lambda i: x[i] if i < 4 else torch.zeros(4)),
        "slice": ({"op": "aten.slice.Tensor",
                   "args": [{"ref": 0}, 0, {"sym": "s1"}, {"sym": "s1 + 2"}],
                   "out": [{"dtype": "f32", "shape": [2, 4]}]},
                  lambda i: x[i:i + 2] if i + 2 <= 4 else torch.zeros(2, 4)),
    }
    for name, (nd, want) in graphs.items():
        out_shape = nd["out"][0]["shape"]
        g = {"format": "kiln.graph/1", "inputs": [{"dtype": "f32", "shape": [4, 4]}, {"sym": "s1"}],
             "nodes": [nd, {"op": "aten.mul.Tensor", "args": [{"ref": 2}, 2.0],
                            "out": [{"dtype": "f32", "shape": out_shape}]}],
             "outputs": [{"ref": 3}], "symbols": syms}
        gp = _write(tmp_path, f"{name}.graph.msgpack", g)
        for i in (1, 2, 1 << 33):
            io = {"format": "kiln.io/1", "symbols": {"s1": i},
                  "inputs": [cc.tensor_entry_data(x), {"int": i}],
                  "outputs": [cc.tensor_entry_data(want(i) * 2)]}
            iop = _write(tmp_path, f"{name}{i}.io.msgpack", io)
            r = _run([kilnc, str(gp), "--run", str(iop)])
            assert r.returncode == 0 and "ok" in r.stdout, (name, i, r.stdout, r.stderr)


def test_kilnc_profile_without_run_is_a_usage_error(kilnc):
    g = os.path.join(CORPUS_DIR, "mlp_fwd.graph.msgpack")
    r = _run([kilnc, g, "--profile"])
    assert r.returncode == 2
    assert "--profile needs --run IO" in r.stderr


def _write(tmp_path, name, g):
    p = tmp_path / name
    p.write_bytes(msgpack.packb(g, use_bin_type=True))
    return p


def test_kilnc_signature_ignores_names_and_contiguous_strides(kilnc, tmp_path):
    g = load(os.path.join(CORPUS_DIR, "transformer_dyn_fwd.graph.msgpack"))
    base = _signature(kilnc, _write(tmp_path, "a.msgpack", g))
    # names dropped, contiguous strides spelled out, symbol renamed
    h = json.loads(json.dumps(g))
    (old,) = h["symbols"]
    h = json.loads(re.sub(rf"\b{old}\b", "zz", json.dumps(h)))
    assert "zz" in h["symbols"]
    n_strided = 0
    for inp in h["inputs"] + [o for n in h["nodes"] for o in n["out"]]:
        inp.pop("name", None)
        if "shape" in inp and "strides" not in inp:
            st = _contiguous_strides_if_static(inp["shape"])
            if st is not None:
                inp["strides"] = st
                n_strided += 1
    for n in h["nodes"]:
        n.pop("name", None)
    assert n_strided > 0
    assert _signature(kilnc, _write(tmp_path, "b.msgpack", h)) == base


def _contiguous_strides_if_static(shape):
    return contiguous_strides(shape) if all(_is_int(d) for d in shape) else None


BAD_GRAPHS = {
    "forward_ref": lambda g: g["nodes"][0]["args"].__setitem__(0, {"ref": 10 ** 6}),
    "self_ref": lambda g: g["nodes"][0]["args"].__setitem__(0, {"ref": len(g["inputs"])}),
    "nan_arg": lambda g: g["nodes"][0]["args"].append(float("nan")),
    "bad_dtype": lambda g: g["inputs"][0].__setitem__("dtype", "c64"),
    "bad_format": lambda g: g.__setitem__("format", "kiln.graph/2"),
    "undeclared_symbol": lambda g: g["inputs"][0].__setitem__("shape", ["s99", 1]),
    "bad_expr": lambda g: g["symbols"].__setitem__("s0", {"min": 2}) or
        g["inputs"][0].__setitem__("shape", ["s0 +", 1]),
    "bad_op": lambda g: g["nodes"][0].__setitem__("op", "Aten add"),
    "negative_size": lambda g: g["inputs"][0].__setitem__("shape", [-1, 2]),
    "bad_output": lambda g: g["outputs"].append({"ref": 10 ** 6}),
    "strides_length": lambda g: g["inputs"][0].__setitem__("strides", [1]),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_kilnc_rejects_invalid(kilnc, case, tmp_path):
    g = load(os.path.join(CORPUS_DIR, "mlp_fwd.graph.msgpack"))
    g.setdefault("symbols", {})
    BAD_GRAPHS[case](g)
    with pytest.raises(AssertionError):
        validate_graph(g)  # our validator agrees it is invalid
    p = _write(tmp_path, "bad.msgpack", g)
    for cmd in ([kilnc, "--signature", str(p)],
                [kilnc, "--emit=graph", str(p), "-o", str(tmp_path / "out.msgpack")]):
        r = _run(cmd)
        assert r.returncode == 1, (case, r.returncode, r.stdout, r.stderr)
        assert (r.stderr + r.stdout).strip(), f"{case}: no message"


def test_kilnc_rejects_garbage(kilnc, tmp_path):
    p = tmp_path / "garbage.msgpack"
    p.write_bytes(b"\xc1\x00not msgpack")
    r = _run([kilnc, "--signature", str(p)])
    assert r.returncode == 1 and (r.stderr + r.stdout).strip()


def test_signature_stability(kilnc, tmp_path):
    import torch
    from kiln.export import dumps, export_graph
    sigs = []
    for run, batch in ((0, 8), (1, 8), (2, 4)):
        torch._dynamo.reset()
        cap = _capture_mlp(batch)
        fw = export_graph(cap.graphs[0]["gm"], cap.graphs[0]["example_inputs"])
        p = tmp_path / f"mlp{run}.graph.msgpack"
        p.write_bytes(dumps(fw))
        sigs.append(_signature(kilnc, p))
    assert sigs[0] == sigs[1], "two fresh captures of the same model differ"
    assert sigs[2] != sigs[0], "batch size change kept the signature"


def test_capture_is_deterministic_without_kilnc():
    """(d) without kilnc: two fresh captures export identical graphs."""
    import torch
    from kiln.export import export_graph
    gs = []
    for _ in range(2):
        torch._dynamo.reset()
        cap = _capture_mlp()
        gs.append([export_graph(g["gm"], g["example_inputs"]) for g in cap.graphs])
    assert gs[0] == gs[1]


# ---- torch.ops.kiln.dropout: bad arguments get a clear error ----------------

@pytest.mark.parametrize("what,args,msg", [
    ("p above 1", lambda t: (t.randn(3), 1.5, t.tensor(1), 0), "p must be in [0, 1]"),
    ("p below 0", lambda t: (t.randn(3), -0.1, t.tensor(1), 0), "p must be in [0, 1]"),
    ("int input", lambda t: (t.arange(3), 0.5, t.tensor(1), 0), "input must be floating"),
    ("float seed", lambda t: (t.randn(3), 0.5, t.tensor(1.0), 0), "seed must be an int64 scalar"),
    ("seed shape", lambda t: (t.randn(3), 0.5, t.tensor([1, 2]), 0), "seed must be an int64 scalar"),
    ("stream", lambda t: (t.randn(3), 0.5, t.tensor(1), -1), "stream must be >= 0"),
])
def test_kiln_dropout_rejects_bad_arguments(what, args, msg):
    torch = pytest.importorskip("torch")
    import kiln.ops  # noqa: F401  (registers the op)
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        torch.ops.kiln.dropout(*args(torch))
