"""Export an AOTAutograd ATen FX graph to kiln's Graph v1 (protocol/GRAPH.md).

``export_graph(gm, example_inputs=None)`` takes the ``torch.fx.GraphModule`` a
torch 2.x AOTAutograd forward/backward/inference compiler receives
(functionalized ATen ops, ``node.meta["val"]`` holding FakeTensors, SymInts
for dynamic sizes) and returns the Graph v1 map as a Python dict;
``dumps(graph)`` packs it as msgpack.

What does not fit Graph v1 raises ``ExportError`` naming the node.  A
constant tensor (``get_attr``: transformers' ``torch.tensor([])``, a scalar
mask value) whose elements are all one value becomes an ``aten.full`` node;
one of several values cannot be exported.  Two AOTAutograd habits are
handled with extra top-level keys (which kiln's decoder ignores):

* a backward graph returns ``None`` for inputs that need no gradient; those
  outputs are left out of ``outputs`` and their positions (in the graph's own
  output tuple) are listed in ``"none_outputs"``;
* a multi-output op may return ``None`` for an output it was told not to
  compute (``convolution_backward`` with ``output_mask[0] = False``); such an
  output still takes its value number (so ``out[i]`` is the schema's output
  ``i``) and is described as an empty tensor ``{"dtype": ..., "shape": [0],
  "none": true}`` that nothing references.
"""

import math
import operator
import re

import msgpack
import sympy
import torch
import torch.fx
from torch.utils._sympy import functions as _symfn
from torch.utils._sympy.numbers import int_oo as _int_oo

__all__ = ["ExportError", "export_graph", "dumps", "FORMAT", "DTYPE_NAMES"]

FORMAT = "kiln.graph/1"

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
}

_OP_RE = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_SYM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Python-level targets whose result is a SymInt computed from sizes: folded
# into {"sym": expr} args from node.meta["val"].
_SYM_FOLD_TARGETS = {
    operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.mod, operator.neg, operator.pos, abs,
    torch.sym_max, torch.sym_min, torch.sym_int,
    math.ceil, math.floor,
}
for _name in ("sym_size", "sym_stride", "sym_numel", "sym_storage_offset"):
    _pkt = getattr(torch.ops.aten, _name, None)
    if _pkt is not None:
        for _ov in _pkt.overloads():
            _SYM_FOLD_TARGETS.add(getattr(_pkt, _ov))


class ExportError(Exception):
    """The graph holds something Graph v1 cannot represent."""


def dumps(graph):
    """The Graph v1 dict (or any io dict) packed as msgpack bytes."""
    return msgpack.packb(graph, use_bin_type=True)


# --------------------------------------------------------------------------
# sympy -> GRAPH.md expression strings

_P_SUM, _P_TERM, _P_UNARY, _P_ATOM = 0, 1, 2, 3


class _ExprPrinter:
    def __init__(self, on_symbol):
        self.on_symbol = on_symbol

    def __call__(self, e):
        return self.p(sympy.sympify(e))[0]

    def paren(self, e, need):
        s, prec = self.p(e)
        return s if prec >= need else f"({s})"

    def p(self, e):
        if isinstance(e, bool) or e is sympy.true or e is sympy.false:
            raise ExportError(f"boolean expression {e} is not an integer")
        if e.is_Integer:
            v = int(e)
            return (str(v), _P_ATOM) if v >= 0 else (str(v), _P_UNARY)
        if e.is_Symbol:
            name = str(e.name)
            if not _SYM_RE.match(name) or name in ("min", "max"):
                raise ExportError(f"symbol name {name!r} is not valid in Graph v1")
            self.on_symbol(e)
            return name, _P_ATOM
        if e.is_Add:
            parts = []
            for i, t in enumerate(e.as_ordered_terms()):
                c, rest = t.as_coeff_Mul()
                if c.is_negative:
                    mag = self.p(-t)
                    s = mag[0] if mag[1] >= _P_TERM else f"({mag[0]})"
                    parts.append(("-" if i == 0 else " - ") + s)
                else:
                    s, prec = self.p(t)
                    s = s if prec >= _P_TERM else f"({s})"
                    parts.append(s if i == 0 else " + " + s)
            return "".join(parts), _P_SUM
        if e.is_Mul:
            c, rest = e.as_coeff_Mul()
            if not c.is_Integer:
                raise ExportError(f"non-integer coefficient in {e}")
            if c == -1:
                s = self.paren(rest, _P_UNARY)
                return "-" + s, _P_UNARY
            factors = []
            if c != 1:
                factors.append(str(int(c)) if c > 0 else f"({int(c)})")
            for f in rest.as_ordered_factors():
                if f.is_Pow:
                    base, ex = f.args
                    if not (ex.is_Integer and int(ex) > 0):
                        raise ExportError(f"non-natural power in {e}")
                    factors += [self.paren(base, _P_ATOM)] * int(ex)
                else:
                    factors.append(self.paren(f, _P_ATOM))
            return "*".join(factors), _P_TERM
        if e.is_Pow:
            base, ex = e.args
            if not (ex.is_Integer and int(ex) > 0):
                raise ExportError(f"non-natural power {e}")
            return "*".join([self.paren(base, _P_ATOM)] * int(ex)), _P_TERM
        if isinstance(e, _symfn.PowByNatural):
            base, ex = e.args
            if not (ex.is_Integer and int(ex) > 0):
                raise ExportError(f"non-constant power {e}")
            return "*".join([self.paren(base, _P_ATOM)] * int(ex)), _P_TERM
        if isinstance(e, (_symfn.FloorDiv, _symfn.CleanDiv)):
            a, b = e.args
            return f"{self.paren(a, _P_TERM)}//{self.paren(b, _P_ATOM)}", _P_TERM
        if isinstance(e, (_symfn.Mod, _symfn.PythonMod)):
            a, b = e.args
            return f"{self.paren(a, _P_TERM)}%{self.paren(b, _P_ATOM)}", _P_TERM
        if isinstance(e, _symfn.ModularIndexing):
            x, d, m = e.args
            return (f"({self.paren(x, _P_TERM)}//{self.paren(d, _P_ATOM)})"
                    f"%{self.paren(m, _P_ATOM)}"), _P_TERM
        if isinstance(e, _symfn.CeilDiv):
            a, b = e.args
            # ceil(a/b) == -((-a)//b)
            return f"-((-{self.paren(a, _P_ATOM)})//{self.paren(b, _P_ATOM)})", _P_UNARY
        if isinstance(e, (_symfn.Max, _symfn.Min, sympy.Max, sympy.Min)):
            fn = "max" if isinstance(e, (_symfn.Max, sympy.Max)) else "min"
            args = [self(a) for a in e.args]
            s = args[-1]
            for a in reversed(args[:-1]):
                s = f"{fn}({a}, {s})"
            return s, _P_ATOM
        if isinstance(e, _symfn.Identity):
            return self.p(e.args[0])
        raise ExportError(f"cannot print expression {e} ({type(e).__name__})")


# --------------------------------------------------------------------------
# the exporter

# ops that read their self's storage from its start (torch's storage offset)
_STORAGE_READERS = {"aten.as_strided.default", "aten._reshape_alias.default"}


def _is_symint(v):
    return isinstance(v, torch.SymInt)


class _Exporter:
    def __init__(self, gm, example_inputs):
        self.gm = gm
        self.example_inputs = list(example_inputs) if example_inputs is not None else None
        self.symbols = {}  # name -> sympy.Symbol, in order of first use
        self.shape_env = None
        self.printer = _ExprPrinter(self._use_symbol)
        self.node = None  # node being exported, for messages

    # ---- errors, symbols ----
    def err(self, msg):
        n = self.node
        if n is None:
            raise ExportError(msg)
        raise ExportError(f"node {n.name} ({n.op} {_target_name(n.target)}): {msg}")

    def _use_symbol(self, s):
        self.symbols.setdefault(s.name, s)

    def _find_shape_env(self):
        for n in self.gm.graph.nodes:
            v = n.meta.get("val")
            vals = v if isinstance(v, (list, tuple)) else [v]
            for x in vals:
                if _is_symint(x):
                    return x.node.shape_env
                fm = getattr(x, "fake_mode", None)
                if fm is not None and getattr(fm, "shape_env", None) is not None:
                    return fm.shape_env
        return None

    # ---- integers / expressions ----
    def sym_expr(self, v):
        """A SymInt or int as (is_const, int or expression string)."""
        if isinstance(v, bool):
            self.err(f"boolean {v} where an integer was expected")
        if isinstance(v, int):
            return True, v
        if _is_symint(v):
            e = v.node.expr
            if self.shape_env is None:
                self.shape_env = v.node.shape_env
            if getattr(e, "is_Integer", False):
                return True, int(e)
            try:
                return False, self.printer(e)
            except ExportError as ex:
                self.err(str(ex))
        self.err(f"{type(v).__name__} {v!r} is not an integer")

    def dim(self, v):
        const, x = self.sym_expr(v)
        return x

    # ---- tensors ----
    def dtype_name(self, dt):
        name = DTYPE_NAMES.get(dt)
        if name is None:
            self.err(f"dtype {dt} is not supported by Graph v1")
        return name

    def spec(self, t):
        if not isinstance(t, torch.Tensor):
            self.err(f"expected a tensor value, got {type(t).__name__}")
        if t.layout != torch.strided:
            self.err(f"layout {t.layout} is not supported (strided only)")
        shape = list(t.shape)
        strides = list(t.stride())
        spec = {"dtype": self.dtype_name(t.dtype), "shape": [self.dim(d) for d in shape]}
        if not _is_contiguous(shape, strides):
            spec["strides"] = [self.dim(s) for s in strides]
        return spec

    # ---- constants ----
    def constant(self, n):
        """The node that makes get_attr n's tensor: aten.full of its one
        value (an empty tensor, a scalar such as transformers' masks, a
        filled buffer). A tensor of several values has no op that makes it
        in Graph v1 (it would have to be an input)."""
        v = self.gm
        for part in str(n.target).split("."):
            v = getattr(v, part, None)
        if not isinstance(v, torch.Tensor):
            self.err(f"get_attr of a {type(v).__name__} (only tensor constants are supported)")
        if v.layout != torch.strided or v.is_complex() or v.dtype not in DTYPE_NAMES:
            self.err(f"constant tensor of layout {v.layout}, dtype {v.dtype} is not supported")
        fill = _uniform_fill(v)
        if fill is None:
            self.err(f"a constant tensor of {v.numel()} elements that are not all the same "
                     "value is not supported (Graph v1 has no op that makes it); make it an "
                     "input or a buffer of the module")
        return {"op": "aten.full.default", "name": n.name,
                "args": [[int(d) for d in v.shape], self.arg(fill)],
                "kwargs": {"dtype": self.dtype_name(v.dtype)},
                "out": [{"dtype": self.dtype_name(v.dtype), "shape": [int(d) for d in v.shape]}]}

    # ---- arguments ----
    def arg(self, a):
        if a is None:
            return None
        if isinstance(a, bool):
            return a
        if isinstance(a, int):
            if not -(1 << 63) <= a < (1 << 64):
                self.err(f"integer argument {a} does not fit 64 bits")
            return a
        if isinstance(a, float):
            if math.isnan(a):
                self.err("NaN argument is not supported by Graph v1")
            return a
        if isinstance(a, str):
            return a
        if isinstance(a, torch.dtype):
            return self.dtype_name(a)
        if isinstance(a, torch.device):
            return str(a)
        if isinstance(a, (torch.layout, torch.memory_format)):
            s = str(a)
            return s[len("torch."):] if s.startswith("torch.") else s
        if isinstance(a, (list, tuple)):
            return [self.arg(x) for x in a]
        if isinstance(a, torch.fx.Node):
            kind, x = self.env[a]
            if kind == "ref":
                return {"ref": x}
            if kind == "sym":
                return {"sym": x} if isinstance(x, str) else x
            if kind == "multi":
                self.err(f"multi-output value {a.name} used without getitem")
            self.err(f"argument {a.name} has no value ({kind})")
        if _is_symint(a):
            const, x = self.sym_expr(a)
            return x if const else {"sym": x}
        if isinstance(a, (torch.SymFloat, torch.SymBool)):
            self.err(f"symbolic {type(a).__name__} argument is not supported")
        if isinstance(a, torch.Tensor):
            self.err("constant tensor argument is not supported (lift it to an input)")
        if isinstance(a, complex):
            self.err("complex argument is not supported")
        self.err(f"argument of type {type(a).__name__} is not supported")

    # ---- main ----
    def check_storage(self, n):
        """as_strided (or _reshape_alias) reads its self's storage, from the
        storage's start. kiln passes a graph input from its first element
        (data_ptr), so a view of an input that starts at a storage offset
        would be read from the wrong place: refused."""
        m = n.args[0] if n.args else None
        while isinstance(m, torch.fx.Node) and m.op == "call_function":
            t = m.target
            if t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and t.is_view
                                         and m.args):
                m = m.args[0]
                continue
            return
        if not isinstance(m, torch.fx.Node) or m.op != "placeholder":
            return
        v = m.meta.get("val", None)
        if isinstance(v, torch.Tensor):
            off = v.storage_offset()
            if _is_symint(off) or off != 0:
                self.err(f"reads the storage of input {m.name}, a view that starts at "
                         f"storage offset {off}: kiln passes an input from its first element")

    def run(self):
        g = self.gm.graph
        self.shape_env = self._find_shape_env()
        self.env = {}  # node -> (kind, payload)
        inputs, nodes, outputs, none_outputs = [], [], [], []
        nval = 0
        for n in g.nodes:
            self.node = n
            if n.op == "placeholder":
                idx = len(inputs)
                v = n.meta.get("val", None)
                if v is None and self.example_inputs is not None and idx < len(self.example_inputs):
                    v = self.example_inputs[idx]
                if isinstance(v, torch.Tensor):
                    spec = self.spec(v)
                    spec["name"] = n.name
                    inputs.append(spec)
                    self.env[n] = ("ref", nval)
                elif isinstance(v, int) or _is_symint(v):
                    const, x = self.sym_expr(v)
                    inputs.append({"sym": str(x), "name": n.name})
                    self.env[n] = ("sym", x)
                else:
                    self.err(f"input value of type {type(v).__name__} is not supported")
                nval += 1
            elif n.op == "call_function":
                t = n.target
                v = n.meta.get("val", None)
                if t is operator.getitem:
                    src, i = n.args
                    kind, outs = self.env.get(src, (None, None))
                    if kind != "multi" or not isinstance(i, int):
                        self.err("getitem on something other than a multi-output op")
                    if outs[i] is None:
                        self.err(f"getitem {i} of an output that is None")
                    self.env[n] = ("ref", outs[i])
                    continue
                is_int = _is_symint(v) or (isinstance(v, int) and not isinstance(v, bool))
                if t in _SYM_FOLD_TARGETS or (not isinstance(t, torch._ops.OpOverload) and is_int):
                    # sym_size / operator.* / torch.sym_* on sizes: fold
                    if not is_int:
                        self.err(f"symbolic op result {v!r} is not an integer")
                    const, x = self.sym_expr(v)
                    self.env[n] = ("sym", x)
                    continue
                if not isinstance(t, torch._ops.OpOverload):
                    self.err("call_function target is not an ATen OpOverload and cannot be folded")
                name = str(t)
                if not _OP_RE.match(name):
                    self.err(f"op name {name!r} does not have the form namespace.name.overload")
                if name in _STORAGE_READERS:
                    self.check_storage(n)
                node = {"op": name, "name": n.name}
                node["args"] = [self.arg(a) for a in n.args]
                if n.kwargs:
                    node["kwargs"] = {str(k): self.arg(a) for k, a in n.kwargs.items()}
                if isinstance(v, torch.Tensor):
                    node["out"] = [self.spec(v)]
                    self.env[n] = ("ref", nval)
                    nval += 1
                elif isinstance(v, (list, tuple)):
                    outs, nums = [], []
                    sibling = next((x for x in v if isinstance(x, torch.Tensor)), None)
                    for x in v:
                        if x is None:
                            dt = self.dtype_name(sibling.dtype) if sibling is not None else "f32"
                            outs.append({"dtype": dt, "shape": [0], "none": True})
                            nums.append(None)
                        elif isinstance(x, torch.Tensor):
                            outs.append(self.spec(x))
                            nums.append(nval)
                        else:
                            self.err(f"multi-output op returns a {type(x).__name__}")
                        nval += 1
                    node["out"] = outs
                    self.env[n] = ("multi", nums)
                elif v is None:
                    if t._schema.returns:
                        self.err("node has no meta['val'] (was the graph traced with fake tensors?)")
                    node["out"] = []
                    self.env[n] = ("none", None)
                else:
                    self.err(f"op returns a non-tensor value of type {type(v).__name__}")
                nodes.append(node)
            elif n.op == "output":
                res = n.args[0]
                if not isinstance(res, (list, tuple)):
                    res = [res]
                for pos, r in enumerate(res):
                    if r is None:
                        none_outputs.append(pos)
                        continue
                    if isinstance(r, torch.fx.Node):
                        kind, x = self.env[r]
                        if kind == "ref":
                            outputs.append({"ref": x})
                        elif kind == "sym":
                            outputs.append({"sym": str(x)})
                        else:
                            self.err(f"output {pos} ({r.name}) is not a tensor or integer")
                    elif isinstance(r, int) and not isinstance(r, bool):
                        outputs.append({"sym": str(r)})
                    elif _is_symint(r):
                        const, x = self.sym_expr(r)
                        outputs.append({"sym": str(x)})
                    else:
                        self.err(f"output {pos} of type {type(r).__name__} is not supported")
            elif n.op == "get_attr":
                nodes.append(self.constant(n))
                self.env[n] = ("ref", nval)
                nval += 1
            else:
                self.err(f"FX node kind {n.op!r} is not supported")
        self.node = None
        graph = {"format": FORMAT, "inputs": inputs, "nodes": nodes, "outputs": outputs}
        if self.symbols:
            graph["symbols"] = {name: self._symbol_info(s) for name, s in self.symbols.items()}
        if none_outputs:
            graph["none_outputs"] = none_outputs
        return graph

    def _symbol_info(self, s):
        lo, hi, hint = 0, None, None
        env = self.shape_env
        if env is not None:
            vr = env.var_to_range.get(s)
            if vr is not None:
                lo = _bound(vr.lower, 0)
                hi = _bound(vr.upper, None)
                if lo is None:
                    lo = 0
                lo = max(lo, 0)
            table = getattr(env, "backed_var_to_val", None)
            if table is None:
                table = env.var_to_val
            val = table.get(s)
            if val is not None:
                try:
                    hint = int(val)
                except TypeError:
                    hint = None
        info = {"min": lo, "max": hi}
        if hint is not None:
            info["hint"] = hint
        return info


def _bound(b, default):
    """An int from a ValueRanges bound; default for +-oo / int_oo / None."""
    if b is None:
        return default
    try:
        if not b.is_finite or b in (_int_oo, -_int_oo):
            return default
    except AttributeError:
        pass
    try:
        f = float(b)
    except (TypeError, ValueError, OverflowError):
        return default
    if math.isinf(f):
        return default
    return int(b)


_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _uniform_fill(t):
    """The Python value every element of t holds, bit for bit (0 for an
    empty t); None when they differ or the value is a NaN (Graph v1 has no
    NaN argument)."""
    # AOTAutograd calls its compilers under a FakeTensorMode, which refuses
    # operations on the real constant
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return _uniform_fill_real(t.detach())


def _uniform_fill_real(t):
    if t.numel() == 0:
        return False if t.dtype == torch.bool else 0
    flat = t.reshape(-1)
    first = flat[0].item()
    if isinstance(first, float) and math.isnan(first):
        return None
    ref = torch.full_like(flat, first)
    if t.is_floating_point():
        iv = _INT_VIEW[t.element_size()]
        same = torch.equal(flat.contiguous().view(iv), ref.view(iv))
    else:
        same = torch.equal(flat, ref)
    return first if same else None


def _is_contiguous(shape, strides):
    """True when strides equal the row-major strides of shape (exactly)."""
    if any((isinstance(d, int) and d == 0) for d in shape):
        return False  # zero-size: say the strides out loud
    expect = 1
    for d, s in zip(reversed(shape), reversed(strides)):
        if not _eq(s, expect):
            return False
        expect = expect * d
    return True


def _eq(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    ea = a.node.expr if _is_symint(a) else sympy.Integer(a) if isinstance(a, int) else a
    eb = b.node.expr if _is_symint(b) else sympy.Integer(b) if isinstance(b, int) else b
    return sympy.expand(ea - eb) == 0


def _target_name(t):
    if isinstance(t, str):
        return t
    try:
        return str(t) if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))
    except Exception:  # pragma: no cover
        return repr(t)


def export_graph(gm, example_inputs=None):
    """The Graph v1 dict for an AOTAutograd ATen GraphModule.

    ``example_inputs`` (optional) supplies the value of a placeholder that has
    no ``meta["val"]``.  Raises ExportError for anything Graph v1 cannot
    represent."""
    return _Exporter(gm, example_inputs).run()
