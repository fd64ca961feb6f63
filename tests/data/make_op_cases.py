#!/usr/bin/env python3
"""Generate kiln's per-op test cases into tests/data/ops/ and the rejection
cases into tests/data/bad/.

    .venv/bin/python tests/data/make_op_cases.py [OP ...]

For every ATen op the reference interpreter implements (compiler/interp*.c)
a few small cases are traced with make_fx (tracing_mode="real") from a
function that calls the op directly, exported to Graph v1 with
clients/python/kiln/export.py, and run eagerly by torch for the expected
outputs.  Shapes are seeded-random and include size-0 and size-1 dims,
non-contiguous inputs (transposed, sliced or expanded views: the exported
input spec then carries strides), broadcasting, negative dims and the
dtypes the op takes.  Each op's cases go to

  ops/<op>.cases.msgpack = {"format": "kiln.opcases/1", "op": <op>,
                            "cases": [{"name", "graph", "io"}, ...]}

where io is the kiln.io/1 map of tests/data/README.md with every input
stored as data.  Two io keys are added: "nocheck" lists outputs whose values
torch leaves undefined (empty, new_empty: only dtype and shape count), and
"rtol"/"atol" are given where torch's own f32/f16 rounding (measured against
the same op run in f64) needs more than the default tolerance of
tests/common/testdata.h.

bad/<name>.msgpack = {"format": "kiln.badcase/1", "name", "graph", "io",
                      "error": "invalid_graph" | "unsupported_op",
                      "message": <substring the error message must hold>}
are hand-written graphs the interpreter must reject.

Everything is deterministic (seeds derive from the case names).
"""

import math
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import msgpack  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from kiln.export import DTYPE_NAMES, export_graph  # noqa: E402
import kiln.ops  # noqa: E402,F401  (torch.ops.kiln.dropout)

A = torch.ops.aten
OPS_DIR = os.path.join(HERE, "ops")
BAD_DIR = os.path.join(HERE, "bad")
f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
i32, i64, u8, i8, b8 = torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool
DEFAULT_TOL = {f64: (1e-7, 1e-9), f32: (1e-5, 1e-6), f16: (2e-3, 1e-3),
               bf16: (1.6e-2, 1e-2)}

# --------------------------------------------------------------------------
# inputs

_gen = torch.Generator()


def seed(name):
    _gen.manual_seed(zlib.crc32(name.encode()))


def U(*shape, lo=-2.0, hi=2.0, dt=f32):
    """Uniform floats in [lo, hi)."""
    return (torch.rand(shape, generator=_gen, dtype=f64) * (hi - lo) + lo).to(dt)


def P(*shape, lo=0.2, hi=3.0, dt=f32):
    """Positive floats."""
    return U(*shape, lo=lo, hi=hi, dt=dt)


def NZ(*shape, dt=f32):
    """Floats bounded away from zero (divisors)."""
    s = torch.randint(0, 2, shape, generator=_gen) * 2 - 1
    return (U(*shape, lo=0.5, hi=2.0, dt=f64) * s).to(dt)


def I(*shape, lo=-5, hi=6, dt=i64):
    return torch.randint(lo, hi, shape, generator=_gen).to(dt)


def B(*shape):
    return torch.randint(0, 2, shape, generator=_gen).to(b8)


def SMALL(*shape, dt=f32):
    """Small integers as floats: ties and equalities happen."""
    return torch.randint(-3, 4, shape, generator=_gen).to(dt)


def T(x):
    """A transposed (non-contiguous) view of a 2-D tensor built as its
    transpose."""
    return x.t().contiguous().t()


def perm(n):
    return torch.randperm(n, generator=_gen)


# --------------------------------------------------------------------------
# cases

CASES = {}  # op -> [case dict]
ACC = set()  # ops whose results accumulate rounding (auto tolerance)


def drop_none(r):
    """A multi-output result without the outputs an output_mask switched off
    (the graph still lists them in the node's "out"; they are not graph
    outputs)."""
    if isinstance(r, (list, tuple)):
        return type(r)(o for o in r if o is not None)
    return r


def exact_arity(fn, n):
    """fn wrapped as a function of exactly n positional parameters (make_fx
    counts defaulted parameters, used here to bind loop variables)."""
    names = ", ".join(f"a{i}" for i in range(n))
    return eval(f"lambda {names}: drop_none(fn({names}))", {"fn": fn, "drop_none": drop_none})


def case(op, name, fn, *args, acc=None, nocheck=(), f64ref=True, alt=None, min_atol=0.0):
    """Registers a case: fn(*args) calls the op; args are tensors (the graph
    inputs); everything else is closed over.  With alt (other inputs of other
    sizes) the graph is traced with symbolic shapes from args and the io map
    holds alt and torch's results for alt.  min_atol: an atol floor for sums
    long enough that f32 rounding in another order than torch's can exceed
    the tolerance measured from torch's own rounding."""
    fn = exact_arity(fn, len(args))
    CASES.setdefault(op, []).append(dict(name=name, fn=fn, args=args,
                                         acc=(op in ACC) if acc is None else acc,
                                         nocheck=list(nocheck), f64ref=f64ref,
                                         alt=alt, min_atol=min_atol))


def unary_float_cases(op, fn, dom=U, ints=True, halves=True):
    seed(op)
    case(op, "f32", fn, dom(3, 4))
    case(op, "f32_t", fn, T(dom(4, 5)))
    case(op, "f32_empty", fn, dom(0, 3))
    case(op, "f64", fn, dom(2, 3, dt=f64))
    if halves:
        case(op, "f16", fn, dom(4, 4, dt=f16))
        case(op, "bf16", fn, dom(4, 4, dt=bf16))
    if ints:
        case(op, "i64", fn, I(7, lo=1, hi=5) if dom is P else I(7))


def build_unary():
    for name, dom, ints in [("exp", U, True), ("exp2", U, True), ("log", P, True),
                            ("log1p", P, True), ("log2", P, True), ("expm1", U, True),
                            ("sqrt", P, True), ("rsqrt", P, True), ("reciprocal", NZ, True),
                            ("sin", U, True), ("cos", U, True), ("tanh", U, True),
                            ("sigmoid", U, True), ("erf", U, True)]:
        unary_float_cases(name, getattr(A, name).default, dom, ints)
    seed("tan")
    unary_float_cases("tan", A.tan.default, lambda *s, dt=f32: U(*s, lo=-1.2, hi=1.2, dt=dt))
    for name in ["abs", "neg", "relu", "sign", "floor", "ceil", "trunc"]:
        unary_float_cases(name, getattr(A, name).default, U, True)
    seed("sign_bool")
    case("sign", "bool", A.sign.default, B(5))
    seed("round")
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 3.7, -3.2, 1e7 + 0.5])
    case("round", "ties", A.round.default, ties)
    case("round", "f32_t", A.round.default, T(U(3, 4, lo=-5, hi=5)))
    case("round", "i64", A.round.default, I(5))
    case("round", "f16", A.round.default, U(6, lo=-5, hi=5, dt=f16))
    case("round", "decimals0", lambda x: A.round.decimals(x, decimals=0), ties)
    for name in ["gelu", "silu", "hardswish", "hardsigmoid"]:
        unary_float_cases(name, getattr(A, name).default,
                          lambda *s, dt=f32: U(*s, lo=-4, hi=4, dt=dt), ints=False)
    seed("gelu_tanh")
    case("gelu", "tanh", lambda x: A.gelu.default(x, approximate="tanh"), U(3, 5, lo=-4, hi=4))
    case("gelu", "tanh_f16", lambda x: A.gelu.default(x, approximate="tanh"), U(8, lo=-4, hi=4, dt=f16))
    seed("hardtanh")
    case("hardtanh", "default", A.hardtanh.default, U(3, 4))
    case("hardtanh", "bounds", lambda x: A.hardtanh.default(x, -0.5, 0.75), T(U(4, 3)))
    case("hardtanh", "i64", lambda x: A.hardtanh.default(x, -2, 3), I(8))
    case("hardtanh", "f16", A.hardtanh.default, U(6, dt=f16))
    seed("leaky_relu")
    case("leaky_relu", "default", A.leaky_relu.default, U(3, 4))
    case("leaky_relu", "slope", lambda x: A.leaky_relu.default(x, 0.2), T(U(4, 3)))
    case("leaky_relu", "bf16", A.leaky_relu.default, U(6, dt=bf16))
    seed("elu")
    case("elu", "default", A.elu.default, U(3, 4))
    case("elu", "params", lambda x: A.elu.default(x, 1.5, 1.0507, 0.5), T(U(4, 3)))
    case("elu", "empty", A.elu.default, U(0, 2))
    case("elu", "f64", A.elu.default, U(5, dt=f64))
    # the rest of the activations (ops_act.c), past their thresholds too
    seed("act_more")
    case("softplus", "default", A.softplus.default, U(3, 4, lo=-30, hi=30))
    case("softplus", "beta_thresh", lambda x: A.softplus.default(x, 2.0, 5.0), T(U(4, 3, lo=-5, hi=5)))
    case("softplus", "bf16", A.softplus.default, U(6, lo=-4, hi=4, dt=bf16))
    case("mish", "default", A.mish.default, U(3, 4, lo=-8, hi=8))
    case("mish", "f64", A.mish.default, U(5, lo=-40, hi=40, dt=f64))
    case("celu", "default", A.celu.default, U(3, 4))
    case("celu", "alpha", lambda x: A.celu.default(x, 0.5), T(U(4, 3)))
    case("threshold", "default", lambda x: A.threshold.default(x, 0.1, 20.0), U(3, 4))
    case("threshold", "f64", lambda x: A.threshold.default(x, -0.5, -1.0), U(7, dt=f64))
    case("threshold", "i64", lambda x: A.threshold.default(x, 0, 5), I(6))
    case("log_sigmoid_forward", "default", A.log_sigmoid_forward.default, U(3, 4, lo=-30, hi=30))
    case("log_sigmoid_forward", "f64_t", A.log_sigmoid_forward.default, T(U(4, 3, dt=f64)))
    case("_prelu_kernel", "channels", A._prelu_kernel.default, U(2, 3, 4), U(3, 1))
    case("_prelu_kernel", "one", A._prelu_kernel.default, U(5, 4), U(1, 1))
    case("glu", "last", A.glu.default, U(3, 8))
    case("glu", "dim1", lambda x: A.glu.default(x, 1), U(2, 6, 3))
    case("glu", "f64_neg", lambda x: A.glu.default(x, -2), U(4, 2, 5, dt=f64))
    case("sgn", "f32", A.sgn.default, SMALL(8))
    case("sgn", "i64", A.sgn.default, I(6))
    seed("act_more_bw")
    case("softplus_backward", "default", lambda g, x: A.softplus_backward.default(g, x, 1.0, 20.0),
         U(3, 4), U(3, 4, lo=-30, hi=30))
    case("softplus_backward", "beta", lambda g, x: A.softplus_backward.default(g, x, 2.0, 5.0),
         U(6), U(6, lo=-5, hi=5))
    case("mish_backward", "default", A.mish_backward.default, U(3, 4), U(3, 4, lo=-8, hi=8))
    case("mish_backward", "f64", A.mish_backward.default, U(5, dt=f64), U(5, lo=-40, hi=40, dt=f64))
    case("leaky_relu_backward", "default", lambda g, x: A.leaky_relu_backward.default(g, x, 0.2, False),
         U(3, 4), U(3, 4))
    case("leaky_relu_backward", "bcast", lambda g, x: A.leaky_relu_backward.default(g, x, 0.01, False),
         U(3, 4), U(4))
    case("log_sigmoid_backward", "default",
         lambda g, x: A.log_sigmoid_backward.default(g, x, torch.exp(-x.abs())), U(3, 4), U(3, 4, lo=-30, hi=30))
    case("elu_backward", "input", lambda g, x: A.elu_backward.default(g, 1.0, 1.0, 1.0, False, x), U(3, 4), U(3, 4))
    case("elu_backward", "selu_result",
         lambda g, y: A.elu_backward.default(g, 1.6732632423543772, 1.0507009873554805, 1.0, True, y), U(3, 4),
         A.selu.default(U(3, 4)))
    case("elu_backward", "celu_f64", lambda g, x: A.elu_backward.default(g, 0.5, 1.0, 2.0, False, x),
         U(5, dt=f64), U(5, dt=f64))
    case("_prelu_kernel_backward", "channels", A._prelu_kernel_backward.default, U(2, 3, 4), U(2, 3, 4), U(3, 1))
    case("_prelu_kernel_backward", "one", A._prelu_kernel_backward.default, U(5, 4), U(5, 4), U(1, 1))
    case("glu_backward", "last", lambda g, x: A.glu_backward.default(g, x, -1), U(3, 4), U(3, 8))
    case("glu_backward", "dim1", lambda g, x: A.glu_backward.default(g, x, 1), U(2, 3, 3), U(2, 6, 3))
    seed("logical_not")
    case("logical_not", "bool", A.logical_not.default, B(3, 4))
    case("logical_not", "f32", A.logical_not.default, SMALL(6))
    case("logical_not", "i64_t", A.logical_not.default, T(I(3, 3, lo=-1, hi=2)))
    seed("bitwise_not")
    case("bitwise_not", "bool", A.bitwise_not.default, B(3, 4))
    case("bitwise_not", "i64", A.bitwise_not.default, I(6))
    case("bitwise_not", "i32", A.bitwise_not.default, I(6, dt=i32))
    case("bitwise_not", "u8", A.bitwise_not.default, I(6, lo=0, hi=255, dt=u8))
    seed("isnan")
    nan = torch.tensor([1.0, float("nan"), -float("inf"), 0.0, float("nan")])
    case("isnan", "f32", A.isnan.default, nan)
    case("isnan", "f16", A.isnan.default, nan.half())
    case("isnan", "i64", A.isnan.default, I(4))


def build_binary():
    arith = {"add": A.add, "sub": A.sub, "mul": A.mul}
    for name, pk in arith.items():
        seed(name)
        case(name, "f32", pk.Tensor, U(3, 4), U(3, 4))
        case(name, "bcast", pk.Tensor, U(3, 1, 4), U(2, 4))
        case(name, "bcast_t", pk.Tensor, T(U(4, 3)), U(1, 3))
        case(name, "empty", pk.Tensor, U(0, 3), U(1, 3))
        case(name, "i64", pk.Tensor, I(5), I(5))
        case(name, "i32_i64_0d", pk.Tensor, I(4, dt=i32), torch.tensor(7))
        case(name, "i64_f32", pk.Tensor, I(4), U(4))
        case(name, "f32_f64_0d", pk.Tensor, U(4), torch.tensor(1.25, dtype=f64))
        case(name, "i64_f64_0d", pk.Tensor, I(4), torch.tensor(1.25, dtype=f64))
        case(name, "f16", pk.Tensor, U(4, 4, dt=f16), U(4, dt=f16))
        case(name, "bf16", pk.Tensor, U(4, 4, dt=bf16), U(4, 4, dt=bf16))
        case(name, "f16_bf16", pk.Tensor, U(4, dt=f16), U(4, dt=bf16))
        case(name, "u8_i8", pk.Tensor, I(4, lo=0, hi=9, dt=u8), I(4, dt=i8))
        case(name, "scalar_float", lambda x, pk=pk: pk.Tensor(x, 2.5), U(3, 2))
        case(name, "scalar_f16", lambda x, pk=pk: pk.Tensor(x, 1.0004), U(8, lo=500, hi=1000, dt=f16))
        case(name, "Scalar", lambda x, pk=pk: pk.Scalar(x, 3), I(4))
        case(name, "Scalar_float_on_int", lambda x, pk=pk: pk.Scalar(x, 0.5), I(4))
        if name != "sub":
            case(name, "bool", pk.Tensor, B(6), B(6))
        if name != "mul":
            case(name, "alpha", lambda x, y, pk=pk: pk.Tensor(x, y, alpha=2), U(3), U(3))
            case(name, "alpha_float", lambda x, y, pk=pk: pk.Tensor(x, y, alpha=-0.5), U(3), U(2, 3))
            case(name, "alpha_int", lambda x, y, pk=pk: pk.Tensor(x, y, alpha=3), I(3), I(3))
            case(name, "Scalar_alpha", lambda x, pk=pk: pk.Scalar(x, 1.5, 2), U(3))
    seed("rsub")
    case("rsub", "Tensor", A.rsub.Tensor, U(3, 4), U(4))
    case("rsub", "Scalar", lambda x: A.rsub.Scalar(x, 1.0), U(3))
    case("rsub", "alpha", lambda x, y: A.rsub.Tensor(x, y, alpha=2), I(3), I(3))
    seed("div")
    case("div", "f32", A.div.Tensor, U(3, 4), NZ(3, 4))
    case("div", "bcast_t", A.div.Tensor, T(U(4, 3)), NZ(3))
    case("div", "i64", A.div.Tensor, I(5), I(5, lo=1, hi=4))
    case("div", "Scalar", lambda x: A.div.Scalar(x, 3), U(4))
    case("div", "f16", A.div.Tensor, U(6, dt=f16), NZ(6, dt=f16))
    case("div", "trunc_f32", lambda x, y: A.div.Tensor_mode(x, y, rounding_mode="trunc"),
         U(3, 4, lo=-9, hi=9), NZ(3, 4))
    case("div", "floor_f32", lambda x, y: A.div.Tensor_mode(x, y, rounding_mode="floor"),
         U(3, 4, lo=-9, hi=9), NZ(3, 4))
    case("div", "floor_i64", lambda x, y: A.div.Tensor_mode(x, y, rounding_mode="floor"),
         I(8, lo=-20, hi=20), torch.tensor([3, -3, 2, -2, 7, -7, 1, 5]))
    case("div", "trunc_i64", lambda x, y: A.div.Tensor_mode(x, y, rounding_mode="trunc"),
         I(8, lo=-20, hi=20), torch.tensor([3, -3, 2, -2, 7, -7, 1, 5]))
    case("div", "none_mode", lambda x, y: A.div.Tensor_mode(x, y, rounding_mode=None),
         U(4), NZ(4))
    case("div", "Scalar_mode", lambda x: A.div.Scalar_mode(x, -3, rounding_mode="floor"),
         I(6, lo=-9, hi=9))
    seed("pow")
    case("pow", "Tensor_Tensor", A.pow.Tensor_Tensor, P(3, 4), U(3, 4))
    case("pow", "Tensor_Scalar2", lambda x: A.pow.Tensor_Scalar(x, 2.0), U(3, 4))
    case("pow", "Tensor_Scalar3", lambda x: A.pow.Tensor_Scalar(x, 3), T(U(4, 3)))
    case("pow", "Tensor_Scalar_half", lambda x: A.pow.Tensor_Scalar(x, 0.5), P(5))
    case("pow", "i64", lambda x: A.pow.Tensor_Scalar(x, 3), I(5))
    case("pow", "i64_float", lambda x: A.pow.Tensor_Scalar(x, 2.0), I(5))
    case("pow", "i64_tt", A.pow.Tensor_Tensor, I(5), I(5, lo=0, hi=4))
    case("pow", "Scalar", lambda x: A.pow.Scalar(2.0, x), U(4))
    case("pow", "Scalar_int", lambda x: A.pow.Scalar(2, x), I(4, lo=0, hi=9))
    case("pow", "f16", lambda x: A.pow.Tensor_Scalar(x, 2.0), U(6, dt=f16))
    for name in ["maximum", "minimum"]:
        seed(name)
        fn = getattr(A, name).default
        case(name, "f32", fn, U(3, 4), U(4))
        case(name, "nan", fn, torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([float("nan"), 0.0, 3.0]))
        case(name, "i64", fn, I(5), I(5))
        case(name, "bool", fn, B(5), B(5))
        case(name, "f16_t", fn, T(U(3, 3, dt=f16)), U(3, 3, dt=f16))
    seed("max_other")
    case("max", "other", A.max.other, U(3), U(3))
    case("min", "other", A.min.other, U(3), U(3))
    for name in ["remainder", "fmod"]:
        seed(name)
        pk = getattr(A, name)
        case(name, "f32", pk.Tensor, U(3, 4, lo=-9, hi=9), NZ(3, 4))
        case(name, "i64", pk.Tensor, I(8, lo=-20, hi=20), torch.tensor([3, -3, 2, -2, 7, -7, 1, 5]))
        case(name, "Scalar", lambda x, pk=pk: pk.Scalar(x, -2.5), U(5, lo=-9, hi=9))
        case(name, "Scalar_i64", lambda x, pk=pk: pk.Scalar(x, 3), I(6, lo=-9, hi=9))
        case(name, "f16", pk.Tensor, U(5, lo=-9, hi=9, dt=f16), NZ(5, dt=f16))
    case("remainder", "Scalar_Tensor", lambda x: A.remainder.Scalar_Tensor(7, x),
         torch.tensor([3, -3, 2, -2, 5]))
    seed("atan2")
    case("atan2", "f32", A.atan2.default, U(3, 4), U(3, 4))
    case("atan2", "bcast", A.atan2.default, U(3, 1), U(4))
    case("atan2", "i64", A.atan2.default, I(5), I(5))
    for name in ["eq", "ne", "lt", "le", "gt", "ge"]:
        seed(name)
        pk = getattr(A, name)
        case(name, "f32", pk.Tensor, SMALL(3, 4), SMALL(4))
        case(name, "i64_t", pk.Tensor, T(I(4, 3, lo=-2, hi=2)), I(3, lo=-2, hi=2))
        case(name, "Scalar", lambda x, pk=pk: pk.Scalar(x, 1), SMALL(6))
        case(name, "Scalar_float", lambda x, pk=pk: pk.Scalar(x, 0.5), I(6, lo=-2, hi=3))
        case(name, "f16_scalar", lambda x, pk=pk: pk.Scalar(x, 1.0001),
             torch.tensor([1.0, 1.0009765625, 0.99951171875, 2.0], dtype=f16))
        case(name, "bool", pk.Tensor, B(5), B(5))
        case(name, "mixed", pk.Tensor, SMALL(4), I(4, lo=-2, hi=2))
        case(name, "empty", pk.Tensor, U(0, 2), U(2))
    for name in ["logical_and", "logical_or", "logical_xor"]:
        seed(name)
        fn = getattr(A, name).default
        case(name, "bool", fn, B(3, 4), B(4))
        case(name, "f32_i64", fn, SMALL(5), I(5, lo=-1, hi=2))
        case(name, "empty", fn, B(0), B(1))
    for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
        seed(name)
        pk = getattr(A, name)
        case(name, "bool", pk.Tensor, B(3, 4), B(4))
        case(name, "i64", pk.Tensor, I(6, lo=-50, hi=50), I(6, lo=-50, hi=50))
        case(name, "i32_t", pk.Tensor, T(I(3, 3, lo=0, hi=64, dt=i32)), I(3, lo=0, hi=64, dt=i32))
        case(name, "Scalar", lambda x, pk=pk: pk.Scalar(x, 6), I(6, lo=0, hi=16))
        case(name, "Scalar_Tensor", lambda x, pk=pk: pk.Scalar_Tensor(12, x), I(6, lo=0, hi=16))
        case(name, "u8", pk.Tensor, I(5, lo=0, hi=255, dt=u8), I(5, lo=0, hi=255, dt=u8))


def build_select_fill():
    seed("where")
    case("where", "self", A.where.self, B(3, 4), U(3, 4), U(4))
    case("where", "promote", A.where.self, B(4), I(4), U(4))
    case("where", "f16_0d", A.where.self, B(4), U(4, dt=f16), torch.tensor(1.5))
    case("where", "ScalarOther", lambda c, x: A.where.ScalarOther(c, x, -1.0), B(2, 3), U(2, 3))
    case("where", "ScalarSelf", lambda c, x: A.where.ScalarSelf(c, 2, x), B(2, 3), I(3))
    case("where", "Scalar", lambda c: A.where.Scalar(c, 1.0, 0.0), B(5))
    case("where", "empty", A.where.self, B(0, 1), U(1, 3), U(3))
    seed("masked_fill")
    case("masked_fill", "Scalar", lambda x, m: A.masked_fill.Scalar(x, m, -1e9), U(3, 4), B(3, 4))
    case("masked_fill", "bcast", lambda x, m: A.masked_fill.Scalar(x, m, 0.5), U(3, 4), B(4))
    case("masked_fill", "i64_float", lambda x, m: A.masked_fill.Scalar(x, m, 2.7), I(5), B(5))
    case("masked_fill", "Tensor", A.masked_fill.Tensor, T(U(4, 3)), B(3), torch.tensor(7.0))
    case("masked_fill", "ninf", lambda x, m: A.masked_fill.Scalar(x, m, float("-inf")), U(2, 3, dt=f16), B(2, 3))
    seed("clamp")
    case("clamp", "both", lambda x: A.clamp.default(x, -0.5, 0.5), U(3, 4))
    case("clamp", "min", lambda x: A.clamp.default(x, min=0.0), U(3, 4))
    case("clamp", "max", lambda x: A.clamp.default(x, None, 0.25), T(U(4, 3)))
    case("clamp", "i64", lambda x: A.clamp.default(x, -2, 2), I(8))
    case("clamp", "i64_float", lambda x: A.clamp.default(x, 0.5), I(5))
    case("clamp", "nan", lambda x: A.clamp.default(x, 0.0, 1.0), torch.tensor([float("nan"), -1.0, 2.0]))
    case("clamp", "inverted", lambda x: A.clamp.default(x, 1.0, 0.0), U(4))
    case("clamp", "Tensor", A.clamp.Tensor, U(3, 4), U(4, lo=-2, hi=0), U(3, 1, lo=0, hi=2))
    case("clamp", "f16", lambda x: A.clamp.default(x, -1.0, 1.0), U(6, dt=f16))
    seed("clamp_min")
    case("clamp_min", "default", lambda x: A.clamp_min.default(x, 0.1), U(3, 4))
    case("clamp_min", "Tensor", A.clamp_min.Tensor, U(3, 4), U(4))
    case("clamp_min", "i64", lambda x: A.clamp_min.default(x, 0), I(6))
    seed("clamp_max")
    case("clamp_max", "default", lambda x: A.clamp_max.default(x, 0.1), U(3, 4))
    case("clamp_max", "Tensor", A.clamp_max.Tensor, U(3, 4), U(3, 1))
    seed("addcmul")
    case("addcmul", "bcast", lambda x, a, b: A.addcmul.default(x, a, b, value=0.5), U(3, 4), U(4), U(3, 1))
    case("addcmul", "plain", A.addcmul.default, U(2, 3), U(2, 3), U(2, 3))
    case("addcmul", "i64", lambda x, a, b: A.addcmul.default(x, a, b, value=3), I(4), I(4), I(4))
    case("addcdiv", "bcast", lambda x, a, b: A.addcdiv.default(x, a, b, value=-2.0), U(3, 4), U(4), NZ(3, 1))
    case("addcdiv", "f64", A.addcdiv.default, U(5, dt=f64), U(5, dt=f64), NZ(5, dt=f64))
    seed("floor_divide")
    case("floor_divide", "f32", A.floor_divide.default, U(3, 4), NZ(3, 4))
    case("floor_divide", "i64_neg", A.floor_divide.default, I(6, lo=-9, hi=9), I(6, lo=1, hi=4) * -1)
    case("floor_divide", "Scalar", lambda x: A.floor_divide.Scalar(x, 3), I(5, lo=-9, hi=9))
    seed("lerp")
    case("lerp", "Scalar", lambda x, y: A.lerp.Scalar(x, y, 0.3), U(3, 4), U(4))
    case("lerp", "Scalar_hi", lambda x, y: A.lerp.Scalar(x, y, 0.8), U(3, 4), U(3, 4))
    case("lerp", "Tensor", A.lerp.Tensor, U(3, 4), U(3, 4), U(3, 4, lo=0, hi=1))
    seed("to_copy")
    op = "_to_copy"
    case(op, "f32_f16", lambda x: A._to_copy.default(x, dtype=f16), U(3, 4, lo=-100, hi=100))
    case(op, "f32_bf16", lambda x: A._to_copy.default(x, dtype=bf16), U(3, 4, lo=-100, hi=100))
    case(op, "f32_i64", lambda x: A._to_copy.default(x, dtype=i64), U(8, lo=-9, hi=9))
    case(op, "f32_bool", lambda x: A._to_copy.default(x, dtype=b8), torch.tensor([0.0, 0.5, -0.0, -2.0]))
    case(op, "i64_f32", lambda x: A._to_copy.default(x, dtype=f32), I(5))
    case(op, "bool_f32", lambda x: A._to_copy.default(x, dtype=f32), B(5))
    case(op, "i64_i8", lambda x: A._to_copy.default(x, dtype=i8), I(6, lo=-300, hi=300))
    case(op, "f16_f32_t", lambda x: A._to_copy.default(x, dtype=f32), T(U(3, 4, dt=f16)))
    case(op, "same", lambda x: A._to_copy.default(x), T(U(3, 2)))
    case(op, "f64_f32", lambda x: A._to_copy.default(x, dtype=f32, layout=torch.strided,
                                                     device="cpu"), U(5, dt=f64))
    seed("convert_element_type")
    op = "convert_element_type"
    case(op, "f32_f16", lambda x: torch.ops.prims.convert_element_type.default(x, f16), U(3, 4))
    case(op, "i64_f32", lambda x: torch.ops.prims.convert_element_type.default(x, f32), I(5))
    case(op, "bf16_f32", lambda x: torch.ops.prims.convert_element_type.default(x, f32), U(5, dt=bf16))
    seed("clone")
    case("clone", "t", A.clone.default, T(U(3, 4)))
    case("clone", "fmt", lambda x: A.clone.default(x, memory_format=torch.contiguous_format), U(2, 3)[:, ::2])
    case("clone", "i64", A.clone.default, I(4))
    case("clone", "empty", A.clone.default, U(0, 3))
    seed("copy")
    case("copy", "bcast", A.copy.default, U(3, 4), U(4, dt=f64))
    seed("fill")
    case("fill", "Scalar", lambda x: A.fill.Scalar(x, 2.5), U(3, 4))
    case("fill", "Scalar_int", lambda x: A.fill.Scalar(x, 3.7), I(3))
    case("fill", "Tensor", A.fill.Tensor, U(3, 2), torch.tensor(-1.5))
    seed("full")
    case("full", "float", lambda x: A.add.Tensor(A.full.default([2, 3], 1.5), x), U(3))
    case("full", "int", lambda x: A.full.default([4], 7, device="cpu"), U(1))
    case("full", "bool", lambda x: A.full.default([2, 2], True), U(1))
    case("full", "dtype", lambda x: A.full.default([3, 0], 2, dtype=f16), U(1))
    case("zeros", "default", lambda x: A.zeros.default([2, 3]), U(1))
    case("zeros", "dtype", lambda x: A.zeros.default([3], dtype=i64), U(1))
    case("ones", "default", lambda x: A.ones.default([2, 3]), U(1))
    case("ones", "dtype", lambda x: A.ones.default([0, 2], dtype=b8), U(1))
    case("empty", "memory_format", lambda x: A.empty.memory_format([2, 3], dtype=f32, device="cpu"),
         U(1), nocheck=[0])
    case("empty", "empty_strided", lambda x: A.empty_strided.default([2, 3], [3, 1], dtype=f32),
         U(1), nocheck=[0])
    case("new_ones", "default", lambda x: A.new_ones.default(x, [2, 2]), U(3, dt=f16))
    case("new_ones", "dtype", lambda x: A.new_ones.default(x, [], dtype=b8, pin_memory=False), U(3))
    case("new_zeros", "default", lambda x: A.new_zeros.default(x, [3]), I(2))
    case("new_empty", "default", lambda x: A.new_empty.default(x, [3, 1]), U(2), nocheck=[0])
    case("new_empty", "strided", lambda x: A.new_empty_strided.default(x, [2, 3], [3, 1]),
         U(2), nocheck=[0])
    # AOTAutograd's clone: new_empty_strided, then copy into it
    case("new_empty", "strided_copy",
         lambda x: A.copy.default(A.new_empty_strided.default(x, [2, 3, 4], [12, 4, 1]), x),
         U(2, 3, 4))
    # strides that are not row-major: a fallback step
    case("new_empty", "strided_cols",
         lambda x: A.copy.default(A.new_empty_strided.default(x, [2, 3], [1, 2]), x), U(2, 3))
    case("new_full", "default", lambda x: A.new_full.default(x, [2, 3], 4.5), U(2))
    case("new_full", "int", lambda x: A.new_full.default(x, [2], 4.5), I(2))
    case("full_like", "default", lambda x: A.full_like.default(x, 2.0), T(U(3, 2)))
    case("zeros_like", "default", lambda x: A.zeros_like.default(x, dtype=i64), U(3, 2))
    case("ones_like", "default", A.ones_like.default, I(3))
    seed("arange")
    case("arange", "default", lambda x: A.arange.default(5, device="cpu", pin_memory=False), U(1))
    case("arange", "start", lambda x: A.arange.start(2, 9), U(1))
    case("arange", "start_step", lambda x: A.arange.start_step(0, 1, 0.1), U(1))
    case("arange", "neg_step", lambda x: A.arange.start_step(10, 1, -3), U(1))
    case("arange", "dtype", lambda x: A.arange.start_step(0, 5, 1, dtype=f32), U(1))
    case("arange", "empty", lambda x: A.arange.start(3, 3), U(1))
    case("scalar_tensor", "float", lambda x: A.scalar_tensor.default(-float("inf"), dtype=f32, device="cpu"), U(1))
    case("scalar_tensor", "int", lambda x: A.scalar_tensor.default(3), U(1))
    case("scalar_tensor", "i64", lambda x: A.scalar_tensor.default(3, dtype=i64), U(1))


def NANROWS():
    """rows of 20 (a vector body and a tail) with a NaN first, in the body,
    in the tail, beside +inf and beside -inf, and one clean row: the row max
    that shifts an exp may drop a NaN (RED_MAXNP); the outputs may not"""
    x = torch.linspace(-3.0, 3.0, 6 * 20).reshape(6, 20)
    nan, inf = float("nan"), float("inf")
    x[0, 0] = nan
    x[1, 9] = nan
    x[2, 18] = nan
    x[3, 4], x[3, 11] = inf, nan
    x[4, 2], x[4, 7] = -inf, nan
    return x


def build_reductions():
    for op in ["sum", "mean", "prod", "var", "std", "logsumexp", "cumsum", "_softmax",
               "_safe_softmax", "_log_softmax", "native_layer_norm", "native_layer_norm_backward",
               "native_batch_norm", "_native_batch_norm_legit_no_training",
               "_native_batch_norm_legit_functional", "native_batch_norm_backward",
               "native_group_norm", "native_group_norm_backward",
               "_softmax_backward_data", "_log_softmax_backward_data"]:
        ACC.add(op)
    seed("sum")
    case("sum", "dim", lambda x: A.sum.dim_IntList(x, [1]), U(3, 4))
    case("sum", "dims_neg_keep", lambda x: A.sum.dim_IntList(x, [-1, 0], True), U(2, 3, 4))
    case("sum", "all_empty_list", lambda x: A.sum.dim_IntList(x, []), U(3, 4))
    case("sum", "none", lambda x: A.sum.dim_IntList(x, None), T(U(4, 3)))
    case("sum", "default", A.sum.default, U(5, 6))
    case("sum", "dtype", lambda x: A.sum.default(x, dtype=f64), U(5))
    case("sum", "i32", lambda x: A.sum.dim_IntList(x, [0]), I(4, 3, dt=i32))
    case("sum", "bool", A.sum.default, B(9))
    case("sum", "size0", lambda x: A.sum.dim_IntList(x, [0]), U(0, 3))
    case("sum", "f16", lambda x: A.sum.dim_IntList(x, [1]), U(4, 64, dt=f16))
    case("sum", "bf16", lambda x: A.sum.dim_IntList(x, [0], True), U(32, 3, dt=bf16))
    case("sum", "sliced", lambda x: A.sum.dim_IntList(x, [0]), U(6, 4)[::2, 1:])
    case("sum", "scalar", A.sum.default, torch.tensor(2.5))
    seed("mean")
    case("mean", "dim", lambda x: A.mean.dim(x, [-1]), U(3, 4))
    case("mean", "keep", lambda x: A.mean.dim(x, [-1, -2], True), U(2, 3, 4, 5))
    case("mean", "default", A.mean.default, T(U(4, 3)))
    case("mean", "f16", lambda x: A.mean.dim(x, [0]), U(16, 3, dt=f16))
    case("mean", "dtype", lambda x: A.mean.dim(x, [0], dtype=f64), U(3, 2))
    for op, pk in [("amax", A.amax), ("amin", A.amin)]:
        seed(op)
        case(op, "dim", lambda x, pk=pk: pk.default(x, [1]), U(3, 4))
        case(op, "all", lambda x, pk=pk: pk.default(x), U(3, 4))
        case(op, "keep_neg", lambda x, pk=pk: pk.default(x, [-1], True), T(U(4, 3)))
        case(op, "i64", lambda x, pk=pk: pk.default(x, [0]), I(4, 3))
        case(op, "nan", lambda x, pk=pk: pk.default(x, [0]), torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]))
        case(op, "bool", lambda x, pk=pk: pk.default(x, [0]), B(3, 2))
        case(op, "f16", lambda x, pk=pk: pk.default(x, [1]), U(2, 7, dt=f16))
    for op, ismax in [("max", True), ("min", False)]:
        seed(op)
        pk = getattr(A, op)
        case(op, "dim", lambda x, pk=pk: pk.dim(x, 1), SMALL(4, 5))
        case(op, "dim_keep_neg", lambda x, pk=pk: pk.dim(x, -2, True), T(SMALL(4, 3)))
        case(op, "dim_i64", lambda x, pk=pk: pk.dim(x, 0), I(5, 3))
        case(op, "dim_nan", lambda x, pk=pk: pk.dim(x, 1), torch.tensor([[1.0, float("nan"), 3.0, float("nan")]]))
        case(op, "default", pk.default, U(3, 4))
    for op in ["argmax", "argmin"]:
        seed(op)
        pk = getattr(A, op)
        case(op, "dim", lambda x, pk=pk: pk.default(x, 1), SMALL(4, 5))
        case(op, "none", lambda x, pk=pk: pk.default(x), SMALL(4, 5))
        case(op, "none_keep", lambda x, pk=pk: pk.default(x, None, True), SMALL(2, 3))
        case(op, "neg_keep", lambda x, pk=pk: pk.default(x, -1, True), T(SMALL(3, 3)))
        case(op, "i64", lambda x, pk=pk: pk.default(x, 0), I(5, 2))
    seed("prod")
    case("prod", "default", A.prod.default, U(3, 4, lo=0.5, hi=1.5))
    case("prod", "dim", lambda x: A.prod.dim_int(x, 1), U(3, 4))
    case("prod", "dim_keep", lambda x: A.prod.dim_int(x, -1, True), I(3, 4, lo=-3, hi=4))
    case("prod", "bool", A.prod.default, B(4))
    case("prod", "empty", lambda x: A.prod.dim_int(x, 0), U(0, 2))
    for op in ["var", "std"]:
        seed(op)
        pk = getattr(A, op)
        case(op, "correction", lambda x, pk=pk: pk.correction(x, [1]), U(3, 5))
        case(op, "correction0_keep", lambda x, pk=pk: pk.correction(x, [0, -1], correction=0, keepdim=True), U(3, 4, 2))
        case(op, "correction2", lambda x, pk=pk: pk.correction(x, None, correction=2), T(U(4, 3)))
        case(op, "dim", lambda x, pk=pk: pk.dim(x, [1], False, True), U(3, 4))
        case(op, "default", pk.default, U(6))
        case(op, "f64", lambda x, pk=pk: pk.correction(x, [0]), U(7, 2, dt=f64))
    for op, pk in [("any", A.any), ("all", A.all)]:
        seed(op)
        case(op, "default", pk.default, B(3, 4))
        case(op, "dim", lambda x, pk=pk: pk.dim(x, 1), B(3, 4))
        case(op, "dim_keep", lambda x, pk=pk: pk.dim(x, -1, True), SMALL(3, 2))
        case(op, "dims", lambda x, pk=pk: pk.dims(x, [0, 1]), B(2, 3, 2))
        case(op, "empty", pk.default, B(0))
        case(op, "i64", pk.default, I(4, lo=0, hi=2))
    seed("linalg_vector_norm")
    op = "linalg_vector_norm"
    vn = A.linalg_vector_norm.default
    case(op, "l2_all", vn, U(3, 4))
    case(op, "l2_dim_keep", lambda x: vn(x, 2, [-1], True), U(3, 5))
    case(op, "l1_dims", lambda x: vn(x, 1, [0, 2]), U(2, 3, 4))
    case(op, "inf", lambda x: vn(x, float("inf"), [1]), U(3, 4))
    case(op, "neg_inf", lambda x: vn(x, float("-inf"), [1]), U(3, 4))
    case(op, "zero", lambda x: vn(x, 0, [1]), SMALL(3, 6))
    case(op, "p3_f64", lambda x: vn(x, 3, [0]), U(4, 2, dt=f64))
    case(op, "l2_f64_dtype", lambda x: vn(x, 2, [1], dtype=f64), U(3, 4))
    seed("logsumexp")
    case("logsumexp", "dim", lambda x: A.logsumexp.default(x, [1]), U(3, 4, lo=-20, hi=20))
    case("logsumexp", "keep", lambda x: A.logsumexp.default(x, [0, 1], True), U(3, 4, 2))
    case("logsumexp", "ninf", lambda x: A.logsumexp.default(x, [1]),
         torch.tensor([[float("-inf"), float("-inf")], [0.0, float("-inf")]]))
    case("logsumexp", "i64", lambda x: A.logsumexp.default(x, [0]), I(4))
    case("logsumexp", "nan", lambda x: A.logsumexp.default(x, [1]), NANROWS())
    seed("cumsum")
    case("cumsum", "dim", lambda x: A.cumsum.default(x, 1), U(3, 4))
    case("cumsum", "neg", lambda x: A.cumsum.default(x, -1), T(U(4, 3)))
    case("cumsum", "i32", lambda x: A.cumsum.default(x, 0), I(5, dt=i32))
    case("cumsum", "bool", lambda x: A.cumsum.default(x, 0), B(6))
    case("cumsum", "dtype", lambda x: A.cumsum.default(x, 0, dtype=f64), U(4))
    case("cumsum", "f16", lambda x: A.cumsum.default(x, 0), U(20, dt=f16))


def build_norms():
    seed("softmax")
    for op, pk in [("_softmax", A._softmax), ("_log_softmax", A._log_softmax)]:
        case(op, "last", lambda x, pk=pk: pk.default(x, -1, False), U(3, 5, lo=-5, hi=5))
        case(op, "dim0", lambda x, pk=pk: pk.default(x, 0, False), T(U(4, 3)))
        case(op, "ninf", lambda x, pk=pk: pk.default(x, 1, False),
             torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf"), 2.0, 2.0]]))
        case(op, "f16", lambda x, pk=pk: pk.default(x, 1, False), U(2, 8, dt=f16))
        case(op, "empty", lambda x, pk=pk: pk.default(x, 1, False), U(0, 4))
        case(op, "scalar", lambda x, pk=pk: pk.default(x, 0, False), torch.tensor(1.5))
        case(op, "nan", lambda x, pk=pk: pk.default(x, 1, False), NANROWS())
    seed("safe_softmax")
    ninf = float("-inf")
    sm = A._safe_softmax
    case("_safe_softmax", "last", lambda x, sm=sm: sm.default(x, -1), U(3, 5, lo=-5, hi=5))
    case("_safe_softmax", "masked_rows", lambda x, sm=sm: sm.default(x, 1),
         torch.tensor([[0.0, ninf, 1.0], [ninf, ninf, ninf], [ninf, 2.0, 2.0]]))
    case("_safe_softmax", "dim0_masked", lambda x, sm=sm: sm.default(x, 0),
         torch.tensor([[ninf, 1.0, ninf], [ninf, 2.0, ninf]]))
    case("_safe_softmax", "dtype", lambda x, sm=sm: sm.default(x, 1, f64), U(2, 4))
    case("_safe_softmax", "long_rows", lambda x, sm=sm: sm.default(x, -1), U(4, 37, lo=-5, hi=5))
    case("_safe_softmax", "scalar_ninf", lambda x, sm=sm: sm.default(x, 0), torch.tensor(ninf))
    case("_safe_softmax", "nan", lambda x, sm=sm: sm.default(x, 1), NANROWS())
    seed("softmax_bw")
    y = torch.softmax(U(3, 5), 1)
    case("_softmax_backward_data", "f32", lambda g, y: A._softmax_backward_data.default(g, y, 1, f32), U(3, 5), y)
    y0 = torch.softmax(U(4, 3), 0)
    case("_softmax_backward_data", "dim0", lambda g, y: A._softmax_backward_data.default(g, y, 0, f32), U(4, 3), y0)
    yl = torch.log_softmax(U(3, 5), -1)
    case("_log_softmax_backward_data", "f32", lambda g, y: A._log_softmax_backward_data.default(g, y, -1, f32), U(3, 5), yl)
    yh = torch.log_softmax(U(2, 6, dt=f16), 1)
    case("_log_softmax_backward_data", "f16", lambda g, y: A._log_softmax_backward_data.default(g, y, 1, f16), U(2, 6, dt=f16), yh)
    seed("layer_norm")
    op = "native_layer_norm"
    case(op, "wb", lambda x, w, b: A.native_layer_norm.default(x, [4], w, b, 1e-5), U(2, 3, 4), U(4), U(4))
    case(op, "none", lambda x: A.native_layer_norm.default(x, [3, 4], None, None, 1e-5), U(2, 3, 4))
    case(op, "t", lambda x, w: A.native_layer_norm.default(x, [3], w, None, 1e-6), T(U(3, 5)).t(), U(3))
    case(op, "f16", lambda x, w, b: A.native_layer_norm.default(x, [8], w, b, 1e-5),
         U(3, 8, dt=f16), U(8, dt=f16), U(8, dt=f16))
    case(op, "rows0", lambda x: A.native_layer_norm.default(x, [4], None, None, 1e-5), U(0, 4))
    seed("layer_norm_bw")
    op = "native_layer_norm_backward"
    x, w, b = U(2, 3, 4), U(4), U(4)
    _, m, r = A.native_layer_norm.default(x, [4], w, b, 1e-5)
    case(op, "all", lambda g, x, m, r, w, b: A.native_layer_norm_backward.default(
        g, x, [4], m, r, w, b, [True, True, True]), U(2, 3, 4), x, m, r, w, b)
    case(op, "mask", lambda g, x, m, r, w, b: A.native_layer_norm_backward.default(
        g, x, [4], m, r, w, b, [True, False, True]), U(2, 3, 4), x, m, r, w, b)
    x2 = U(3, 2, 5)
    _, m2, r2 = A.native_layer_norm.default(x2, [2, 5], None, None, 1e-5)
    case(op, "noweight", lambda g, x, m, r: A.native_layer_norm_backward.default(
        g, x, [2, 5], m, r, None, None, [True, False, False]), U(3, 2, 5), x2, m2, r2)
    seed("batch_norm")
    x, w, b, rm, rv = U(2, 3, 4, 4), U(3), U(3), U(3), P(3)
    op = "native_batch_norm"
    case(op, "train", lambda x, w, b, rm, rv: A.native_batch_norm.default(x, w, b, rm, rv, True, 0.1, 1e-5),
         x, w, b, rm, rv)
    case(op, "eval", lambda x, w, b, rm, rv: A.native_batch_norm.default(x, w, b, rm, rv, False, 0.1, 1e-5),
         x, w, b, rm, rv)
    case(op, "nostats", lambda x: A.native_batch_norm.default(x, None, None, None, None, True, 0.1, 1e-5),
         U(4, 2, 3))
    case(op, "f16", lambda x, w, b, rm, rv: A.native_batch_norm.default(x, w, b, rm, rv, True, 0.1, 1e-5),
         U(2, 3, 5, dt=f16), U(3), U(3), U(3), P(3))
    op = "_native_batch_norm_legit_no_training"
    case(op, "default", lambda x, w, b, rm, rv: A._native_batch_norm_legit_no_training.default(
        x, w, b, rm, rv, 0.1, 1e-5), x, w, b, rm, rv)
    case(op, "noweight", lambda x, rm, rv: A._native_batch_norm_legit_no_training.default(
        x, None, None, rm, rv, 0.1, 1e-3), U(3, 3), rm, rv)
    op = "_native_batch_norm_legit_functional"
    case(op, "train", lambda x, w, b, rm, rv: A._native_batch_norm_legit_functional.default(
        x, w, b, rm, rv, True, 0.1, 1e-5), x, w, b, rm, rv)
    case(op, "eval", lambda x, w, b, rm, rv: A._native_batch_norm_legit_functional.default(
        x, w, b, rm, rv, False, 0.1, 1e-5), x, w, b, rm, rv)
    case(op, "t", lambda x, w, b, rm, rv: A._native_batch_norm_legit_functional.default(
        x, w, b, rm, rv, True, 0.3, 1e-5), T(U(3, 6)).t(), w, b, rm, rv)
    seed("batch_norm_bw")
    op = "native_batch_norm_backward"
    _, sm, si = A.native_batch_norm.default(x, w, b, rm, rv, True, 0.1, 1e-5)
    case(op, "train", lambda g, x, w, rm, rv, sm, si: A.native_batch_norm_backward.default(
        g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]), U(2, 3, 4, 4), x, w, rm, rv, sm, si)
    case(op, "eval", lambda g, x, w, rm, rv: A.native_batch_norm_backward.default(
        g, x, w, rm, rv, None, None, False, 1e-5, [True, True, False]), U(2, 3, 4, 4), x, w, rm, rv)
    case(op, "noweight", lambda g, x, sm, si: A.native_batch_norm_backward.default(
        g, x, None, None, None, sm, si, True, 1e-5, [True, False, True]), U(2, 3, 4, 4), x, sm, si)
    seed("group_norm")
    op = "native_group_norm"
    xg, wg, bg = U(2, 6, 3, 2), U(6), U(6)
    case(op, "wb", lambda x, w, b: A.native_group_norm.default(x, w, b, 2, 6, 6, 3, 1e-5), xg, wg, bg)
    case(op, "none", lambda x: A.native_group_norm.default(x, None, None, 3, 4, 5, 2, 1e-5), U(3, 4, 5))
    case(op, "g1", lambda x, w: A.native_group_norm.default(x, w, None, 2, 4, 1, 1, 1e-5), U(2, 4), U(4))
    op = "native_group_norm_backward"
    _, mg, rg = A.native_group_norm.default(xg, wg, bg, 2, 6, 6, 3, 1e-5)
    case(op, "all", lambda g, x, m, r, w: A.native_group_norm_backward.default(
        g, x, m, r, w, 2, 6, 6, 3, [True, True, True]), U(2, 6, 3, 2), xg, mg, rg, wg)
    case(op, "noweight", lambda g, x, m, r: A.native_group_norm_backward.default(
        g, x, m, r, None, 2, 6, 6, 3, [True, False, False]), U(2, 6, 3, 2), xg, mg, rg)
    seed("weight_norm")
    for op in ["_weight_norm_interface", "_weight_norm_interface_backward"]:
        ACC.add(op)
    op = "_weight_norm_interface"
    vw, gw = U(4, 3, 5), P(4, 1, 1)
    case(op, "dim0", lambda v, g: A._weight_norm_interface.default(v, g, 0), vw, gw)
    vl, gl = U(6, 3, 5), P(1, 1, 5)
    case(op, "last", lambda v, g: A._weight_norm_interface.default(v, g, 2), vl, gl)
    case(op, "rank2_last", lambda v, g: A._weight_norm_interface.default(v, g, 1), U(5, 4), P(1, 4))
    case(op, "f64", lambda v, g: A._weight_norm_interface.default(v, g, 0), U(4, 7, dt=f64),
         P(4, 1, dt=f64))
    op = "_weight_norm_interface_backward"
    _, nw = A._weight_norm_interface.default(vw, gw, 0)
    case(op, "dim0", lambda gr, v, g, n: A._weight_norm_interface_backward.default(gr, v, g, n, 0),
         U(4, 3, 5), vw, gw, nw)
    _, nl = A._weight_norm_interface.default(vl, gl, 2)
    case(op, "last", lambda gr, v, g, n: A._weight_norm_interface_backward.default(gr, v, g, n, 2),
         U(6, 3, 5), vl, gl, nl)
    seed("pw_bw")
    op = "gelu_backward"
    case(op, "none", A.gelu_backward.default, U(3, 4), U(3, 4, lo=-4, hi=4))
    case(op, "tanh", lambda g, x: A.gelu_backward.default(g, x, approximate="tanh"), U(3, 4), U(3, 4, lo=-4, hi=4))
    case(op, "f16", A.gelu_backward.default, U(6, dt=f16), U(6, dt=f16))
    op = "threshold_backward"
    case(op, "zero", lambda g, x: A.threshold_backward.default(g, x, 0), U(3, 4), U(3, 4))
    case(op, "thr", lambda g, x: A.threshold_backward.default(g, x, 0.5), U(3, 4), T(U(3, 4)))
    case(op, "bcast", lambda g, x: A.threshold_backward.default(g, x, 0), U(3, 4), U(4))
    op = "sigmoid_backward"
    case(op, "f32", A.sigmoid_backward.default, U(3, 4), torch.sigmoid(U(3, 4)))
    case(op, "f64", A.sigmoid_backward.default, U(5, dt=f64), torch.sigmoid(U(5, dt=f64)))
    op = "tanh_backward"
    case(op, "f32", A.tanh_backward.default, U(3, 4), torch.tanh(U(3, 4)))
    case(op, "bf16", A.tanh_backward.default, U(5, dt=bf16), torch.tanh(U(5, dt=bf16)))
    seed("silu_backward")
    op = "silu_backward"
    case(op, "f32", A.silu_backward.default, U(3, 4), U(3, 4, lo=-6, hi=6))
    case(op, "f64", A.silu_backward.default, U(5, dt=f64), U(5, lo=-6, hi=6, dt=f64))
    # the breakpoints -3 and 3 themselves, and both sides of each
    edges = torch.tensor([-4.0, -3.0, -2.5, 0.0, 1.0, 3.0, 3.5, 5.0])
    op = "hardswish_backward"
    case(op, "edges", A.hardswish_backward.default, U(8), edges)
    case(op, "f32", A.hardswish_backward.default, U(3, 4), U(3, 4, lo=-5, hi=5))
    op = "hardsigmoid_backward"
    case(op, "edges", A.hardsigmoid_backward.default, U(8), edges)
    case(op, "f32", A.hardsigmoid_backward.default, T(U(4, 3)), U(4, 3, lo=-5, hi=5))
    seed("hardtanh_backward")
    op = "hardtanh_backward"
    case(op, "relu6", lambda g, x: A.hardtanh_backward.default(g, x, 0.0, 6.0), U(3, 4), U(3, 4, lo=-2, hi=8))
    case(op, "bounds", lambda g, x: A.hardtanh_backward.default(g, x, -1.0, 1.0), U(2, 3),
         torch.tensor([[-1.0, 1.0, 0.5], [-2.0, float("nan"), 0.0]]))
    case(op, "bcast", lambda g, x: A.hardtanh_backward.default(g, x, -0.5, 0.5), U(3, 4), U(4))


def build_views():
    seed("view")
    case("view", "infer", lambda x: A.view.default(x, [2, -1]), U(3, 4))
    case("view", "flat", lambda x: A.view.default(x, [-1]), U(2, 3, 2))
    case("view", "split_dim", lambda x: A.view.default(x, [3, 2, 2]), U(3, 4))
    case("view", "sliced", lambda x: A.view.default(x, [2, 2, 3]), U(4, 6)[:, :3])
    case("view", "size0", lambda x: A.view.default(x, [3, 0, 5]), U(0, 3))
    case("view", "scalar", lambda x: A.view.default(x, [1, 1]), torch.tensor(3.0))
    case("view", "i64", lambda x: A.view.default(x, [4]), I(2, 2))
    case("_unsafe_view", "default", lambda x: A._unsafe_view.default(x, [6, 2]), U(3, 4))
    case("reshape", "t", lambda x: A.reshape.default(x, [12]), T(U(3, 4)))
    case("_reshape_alias", "default", lambda x: A._reshape_alias.default(x, [4, 3], [1, 4]), U(3, 4))
    seed("permute")
    case("permute", "3d", lambda x: A.permute.default(x, [2, 0, 1]), U(2, 3, 4))
    case("permute", "neg", lambda x: A.permute.default(x, [-1, 0]), T(U(4, 3)))
    case("permute", "0d", lambda x: A.permute.default(x, []), torch.tensor(2.0))
    case("transpose", "int", lambda x: A.transpose.int(x, 0, 2), U(2, 3, 4))
    case("transpose", "neg", lambda x: A.transpose.int(x, -1, -2), U(2, 3, 4))
    case("transpose", "same", lambda x: A.transpose.int(x, 1, 1), U(2, 3))
    case("t", "2d", A.t.default, U(2, 3))
    case("t", "1d", A.t.default, U(4))
    case("t", "t", A.t.default, T(U(3, 2)))
    seed("expand")
    case("expand", "size1", lambda x: A.expand.default(x, [3, 4]), U(1, 4))
    case("expand", "lead", lambda x: A.expand.default(x, [2, -1, 4]), U(3, 1))
    case("expand", "same", lambda x: A.expand.default(x, [3, 2]), U(3, 2))
    case("expand", "size0", lambda x: A.expand.default(x, [0, 3]), U(1, 3))
    case("expand", "bool", lambda x: A.expand.default(x, [2, -1, 16, 16]), B(2, 1, 16, 1))
    case("expand", "input_stride0", lambda x: A.add.Tensor(x, 1.0), U(1, 3).expand(4, 3))
    seed("squeeze")
    case("squeeze", "default", A.squeeze.default, U(1, 3, 1, 2))
    case("squeeze", "dim", lambda x: A.squeeze.dim(x, 0), U(1, 3))
    case("squeeze", "dim_noop", lambda x: A.squeeze.dim(x, 1), U(1, 3))
    case("squeeze", "dim_neg", lambda x: A.squeeze.dim(x, -2), U(3, 1, 2))
    case("squeeze", "dims", lambda x: A.squeeze.dims(x, [0, 2, 3]), U(1, 3, 1, 2))
    case("squeeze", "0d", lambda x: A.squeeze.dim(x, 0), torch.tensor(1.0))
    case("unsqueeze", "front", lambda x: A.unsqueeze.default(x, 0), U(3, 4))
    case("unsqueeze", "end", lambda x: A.unsqueeze.default(x, -1), T(U(4, 3)))
    case("unsqueeze", "mid", lambda x: A.unsqueeze.default(x, 1), I(3, 4))
    case("unsqueeze", "0d", lambda x: A.unsqueeze.default(x, 0), torch.tensor(1.0))
    seed("slice_scatter")
    case("slice_scatter", "dim1_step", lambda x, y: A.slice_scatter.default(x, y, 1, 1, 6, 2), U(3, 7), U(3, 3))
    case("slice_scatter", "defaults", lambda x, y: A.slice_scatter.default(x, y), U(4, 2), U(4, 2))
    case("slice_scatter", "neg_start_t", lambda x, y: A.slice_scatter.default(x, y, 0, -2), T(U(3, 5)), U(2, 5))
    case("select_scatter", "mid", lambda x, y: A.select_scatter.default(x, y, 1, 2), U(3, 4, 2), U(3, 2))
    case("select_scatter", "neg_i64", lambda x, y: A.select_scatter.default(x, y, 0, -1), I(3, 4), I(4))
    seed("slice")
    case("slice", "basic", lambda x: A.slice.Tensor(x, 1, 1, 3), U(3, 5))
    case("slice", "step", lambda x: A.slice.Tensor(x, 0, 0, 9223372036854775807, 2), U(7, 2))
    case("slice", "neg", lambda x: A.slice.Tensor(x, -1, -3, -1), U(3, 5))
    case("slice", "clamp", lambda x: A.slice.Tensor(x, 1, -100, 100), U(3, 5))
    case("slice", "empty", lambda x: A.slice.Tensor(x, 1, 4, 2), U(3, 5))
    case("slice", "defaults", lambda x: A.slice.Tensor(x), T(U(5, 3)))
    case("slice", "step3_t", lambda x: A.slice.Tensor(x, 1, 1, None, 3), T(U(8, 3)))
    case("select", "int", lambda x: A.select.int(x, 1, 2), U(3, 4))
    case("select", "neg", lambda x: A.select.int(x, -1, -1), T(U(4, 3)))
    case("select", "1d", lambda x: A.select.int(x, 0, 0), U(3))
    seed("split")
    case("split", "uneven", lambda x: A.split.Tensor(x, 2, 1), U(3, 5))
    case("split", "even", lambda x: A.split.Tensor(x, 2), U(4, 2))
    case("split", "big", lambda x: A.split.Tensor(x, 10, -1), U(2, 3))
    case("split_with_sizes", "default", lambda x: A.split_with_sizes.default(x, [1, 0, 2], 1), T(U(6, 3)))
    case("unbind", "dim0", lambda x: A.unbind.int(x), U(3, 2))
    case("unbind", "neg", lambda x: A.unbind.int(x, -1), U(2, 3))
    seed("cat")
    case("cat", "dim0", lambda x, y: A.cat.default([x, y]), U(2, 3), U(1, 3))
    case("cat", "neg", lambda x, y, z: A.cat.default([x, y, z], -1), U(2, 1), T(U(2, 3)), U(2, 0))
    case("cat", "legacy_empty", lambda x, y: A.cat.default([x, y], 1), U(2, 3), U(0))
    case("cat", "promote", lambda x, y: A.cat.default([x, y]), I(2), U(3))
    case("cat", "bool_i64", lambda x, y: A.cat.default([x, y]), B(2), I(3))
    case("stack", "dim0", lambda x, y: A.stack.default([x, y]), U(2, 3), U(2, 3))
    case("stack", "neg", lambda x, y: A.stack.default([x, y], -1), U(2, 3), T(U(2, 3)))
    case("stack", "mid", lambda x: A.stack.default([x, x, x], 1), I(2, 2))
    case("alias", "default", A.alias.default, T(U(3, 2)))
    case("detach", "default", A.detach.default, U(3))
    seed("pad")
    op = "constant_pad_nd"
    case(op, "last", lambda x: A.constant_pad_nd.default(x, [1, 2]), U(2, 3))
    case(op, "two", lambda x: A.constant_pad_nd.default(x, [1, 0, 0, 2], 1.5), U(2, 3))
    case(op, "neg", lambda x: A.constant_pad_nd.default(x, [-1, 2, 1, -1]), T(U(4, 3)))
    case(op, "i64", lambda x: A.constant_pad_nd.default(x, [0, 1], -100.0), I(2, 3))
    case(op, "to_empty", lambda x: A.constant_pad_nd.default(x, [-2, -1]), U(2, 3))
    seed("flip")
    case("flip", "one", lambda x: A.flip.default(x, [0]), U(3, 4))
    case("flip", "two", lambda x: A.flip.default(x, [-1, 0]), T(U(4, 3)))
    case("flip", "none", lambda x: A.flip.default(x, []), U(2))
    seed("roll")  # Swin's shifted windows: (-3, -3) over H and W
    case("roll", "swin", lambda x: A.roll.default(x, [-3, -3], [1, 2]), U(2, 7, 7, 4))
    case("roll", "one", lambda x: A.roll.default(x, [2], [0]), T(U(4, 3)))
    case("roll", "same_dim_twice", lambda x: A.roll.default(x, [5, -1], [-1, -1]), U(3, 5))
    case("roll", "flat", lambda x: A.roll.default(x, [7]), U(3, 4))
    case("roll", "int", lambda x: A.roll.default(x, [-9], [1]), I(2, 4))
    case("roll", "empty", lambda x: A.roll.default(x, [1], [0]), U(0, 3))
    # AOTAutograd's backward of a view (ConvNeXt's head): new_zeros,
    # as_strided, copy, as_strided_scatter. The compiler lowers a view that
    # is a block of a contiguous result; the others are fallback steps
    seed("as_strided_scatter")
    ASS = A.as_strided_scatter.default
    case("as_strided_scatter", "whole", lambda x, s: ASS(x, s, [2, 320], [320, 1], 0), U(640), U(2, 320))
    case("as_strided_scatter", "block_offset", lambda x, s: ASS(x, s, [2, 1, 3], [3, 9, 1], 4), U(3, 4), U(2, 1, 3))
    case("as_strided_scatter", "f64_src", lambda x, s: ASS(x, s, [4], [1], 2), U(2, 3), U(4, dt=f64))
    case("as_strided_scatter", "strided", lambda x, s: ASS(x, s, [2, 2], [1, 3], 1), U(2, 3), U(2, 2))
    case("as_strided_scatter", "t_self", lambda x, s: ASS(x, s, [2, 2], [1, 2], 0), T(U(2, 3)), U(2, 2))
    case("copy", "broadcast", lambda x, s: A.copy.default(x, s), U(2, 3), U(3))
    case("copy", "dtype", lambda x, s: A.copy.default(x, s), U(2, 3), I(2, 3))
    case("repeat", "same_rank", lambda x: A.repeat.default(x, [2, 3]), U(2, 2))
    case("repeat", "lead", lambda x: A.repeat.default(x, [2, 1, 2]), T(U(3, 2)))
    case("repeat", "zero", lambda x: A.repeat.default(x, [0, 2]), I(2))
    seed("select_bw")
    case("select_backward", "default", lambda g: A.select_backward.default(g, [3, 4, 2], 1, -1), U(3, 2))
    case("select_backward", "t", lambda g: A.select_backward.default(g, [3, 4], 0, 2), T(U(1, 4)).view(4))
    case("slice_backward", "default", lambda g: A.slice_backward.default(g, [5, 3], 0, 1, 5, 2), U(2, 3))
    case("slice_backward", "clamp", lambda g: A.slice_backward.default(g, [2, 6], 1, -4, 100, 1), U(2, 4))
    seed("tri")
    for op in ("tril", "triu"):
        pk = getattr(A, op)
        case(op, "default", pk.default, U(4, 5))
        case(op, "diag_batch", lambda x, pk=pk: pk.default(x, 1), U(2, 3, 4))
        case(op, "neg_t", lambda x, pk=pk: pk.default(x, -1), T(I(4, 3)))
        case(op, "bool", lambda x, pk=pk: pk.default(x, 0), B(3, 3))
    seed("dropout")
    case("native_dropout", "eval", lambda x: A.native_dropout.default(x, 0.5, False), U(3, 4))
    case("native_dropout", "p0", lambda x: A.native_dropout.default(x, 0.0, True), T(U(4, 3)))
    case("native_dropout", "p1", lambda x: A.native_dropout.default(x, 1.0, True), U(5))
    seed("kiln_dropout")
    K = torch.ops.kiln.dropout.default

    def S(v):
        return torch.tensor(v, dtype=i64)

    case("kiln_dropout", "f32", lambda x, s: K(x, 0.5, s, 0), U(3, 4), S(12345))
    case("kiln_dropout", "f32_t_stream3", lambda x, s: K(x, 0.2, s, 3), T(U(4, 3)), S(-77))
    case("kiln_dropout", "f32_odd", lambda x, s: K(x, 0.5, s, 1), U(67, 33), S(2**62 + 5))
    case("kiln_dropout", "f64", lambda x, s: K(x, 0.9, s, 2), U(5, dt=f64), S(9))
    case("kiln_dropout", "f16", lambda x, s: K(x, 0.3, s, 0), U(6, 5, dt=f16), S(-(2**63)))
    case("kiln_dropout", "bf16", lambda x, s: K(x, 0.1, s, 7), U(9, dt=bf16), S(1))
    case("kiln_dropout", "f32_scale_inexact", lambda x, s: K(x, 0.1, s, 0), U(8, 9, lo=-50, hi=50), S(21))
    case("kiln_dropout", "f16_scale_inexact", lambda x, s: K(x, 0.3, s, 5), U(8, 9, dt=f16), S(22))
    case("kiln_dropout", "p0", lambda x, s: K(x, 0.0, s, 0), U(4, 3), S(3))
    case("kiln_dropout", "p1", lambda x, s: K(x, 1.0, s, 0), U(4, 3), S(3))
    case("kiln_dropout", "empty", lambda x, s: K(x, 0.5, s, 0), U(0, 3), S(3))
    case("kiln_dropout", "scalar", lambda x, s: K(x, 0.5, s, 4), U(dt=f32), S(11))
    case("kiln_dropout", "nan_inf", lambda x, s: K(x, 0.5, s, 0),
         torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0] * 4), S(5))
    case("native_dropout_backward", "default", lambda g, m: A.native_dropout_backward.default(g, m, 2.0),
         U(3, 4), B(3, 4))
    case("native_dropout_backward", "nan_dropped",
         lambda g, m: A.native_dropout_backward.default(g, m, 1.25),
         torch.tensor([1.0, float("nan"), -2.0, float("inf")]),
         torch.tensor([True, False, True, False]))
    case("native_dropout_backward", "f16", lambda g, m: A.native_dropout_backward.default(g, m, 1.25),
         U(6, dt=f16), B(6))
    seed("as_strided")
    case("as_strided", "default", lambda x: A.as_strided.default(x, [2, 2], [1, 2], 1), U(3, 3))
    case("as_strided", "overlap", lambda x: A.as_strided.default(x, [3, 3], [1, 1]), U(6))
    # the storage offset counts from self's storage: a clone's own (kiln
    # lowers clone of a slice to the slice), a lazy value's, a channels-last
    # value's (in its declared order)
    case("as_strided", "clone_of_slice",
         lambda a, b: A.mul.Tensor(A.as_strided.default(
             A.clone.default(A.slice.Tensor(A.mm.default(a, b), 0, 2, 4)), [2, 6], [6, 1], 0), 2.0),
         U(6, 5), U(5, 6))
    case("as_strided", "lazy_offset",
         lambda x: A.mul.Tensor(A.as_strided.default(
             A.slice.Tensor(A.add.Tensor(x, 1.0), 0, 2, 4), [2, 5], [5, 1], 10), 2.0),
         U(6, 5))
    # no storage offset (self's own) and _reshape_alias: self a view of a
    # lazy value
    case("as_strided", "no_offset_lazy_slice",
         lambda x: A.mul.Tensor(A.as_strided.default(
             A.slice.Tensor(A.slice.Tensor(A.relu.default(x), 0, 1, 3), 1, 1, 3), [2, 2], [4, 1]), 2.0),
         U(4, 4))
    case("as_strided", "reshape_alias_of_t",
         lambda x: A.mul.Tensor(A._reshape_alias.default(
             A.t.default(A.relu.default(x)), [5, 3, 2], [1, 10, 5]), 2.0),
         U(6, 5))
    case("as_strided", "channels_last",
         lambda x: A.add.Tensor(A.as_strided.default(A.mul.Tensor(x, 3.0), [2, 60], [60, 1], 0), 1.0),
         U(2, 3, 4, 5).contiguous(memory_format=torch.channels_last))


def build_dynamic():
    """Graphs traced with symbolic shapes, run at other sizes."""
    seed("dynamic")
    op = "dynamic"
    case(op, "view_sum", lambda x, y: (A.view.default(A.add.Tensor(x, y), [-1]),
                                       A.sum.dim_IntList(x, [0])),
         U(5, 3), U(3), alt=(U(7, 4), U(4)))
    case(op, "new_zeros_sym", lambda x: A.new_zeros.default(x, [x.shape[0] * 2]),
         U(5, 3), alt=(U(2, 3),))
    case(op, "cat_slice", lambda x, y: A.slice.Tensor(A.cat.default([x, y], 1), 1, 1, x.shape[1] + 1),
         U(3, 4), U(3, 2), alt=(U(3, 6), U(3, 5)))
    case(op, "softmax_mm", lambda x, w: A._softmax.default(A.mm.default(x, w), -1, False),
         U(4, 8), U(8, 5), alt=(U(6, 8), U(8, 3)), acc=True)
    case(op, "expand_t", lambda x: A.clone.default(A.expand.default(A.t.default(x), [2, x.shape[1], x.shape[0]])),
         U(3, 4), alt=(U(5, 2),))


def build_nn():
    for op in ["mm", "bmm", "addmm", "baddbmm", "embedding_dense_backward", "scatter_add", "index_add",
               "index_put", "nll_loss_forward", "nll_loss_backward", "mse_loss",
               "mse_loss_backward", "convolution", "convolution_backward", "avg_pool2d",
               "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
               "upsample_bilinear2d", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_flash_attention_for_cpu_backward",
               "max_pool2d_with_indices_backward"]:
        ACC.add(op)
    seed("mm")
    case("mm", "f32", A.mm.default, U(3, 4), U(4, 5))
    case("mm", "t", A.mm.default, T(U(3, 4)), T(U(4, 2)))
    case("mm", "k0", A.mm.default, U(3, 0), U(0, 2))
    case("mm", "f16", A.mm.default, U(3, 8, dt=f16), U(8, 2, dt=f16))
    case("mm", "i64", A.mm.default, I(2, 3), I(3, 2))
    case("mm", "f64", A.mm.default, U(2, 3, dt=f64), U(3, 2, dt=f64))
    case("bmm", "f32", A.bmm.default, U(2, 3, 4), U(2, 4, 5))
    case("bmm", "t", A.bmm.default, U(2, 4, 3).transpose(1, 2), U(2, 4, 2))
    case("addmm", "bias1d", A.addmm.default, U(5), U(3, 4), U(4, 5))
    case("addmm", "bias2d_ab", lambda b, x, y: A.addmm.default(b, x, y, beta=0.5, alpha=2.0), U(3, 5), U(3, 4), U(4, 5))
    case("addmm", "beta0_nan", lambda b, x, y: A.addmm.default(b, x, y, beta=0), torch.full((3, 2), float("nan")), U(3, 4), U(4, 2))
    case("addmm", "t", A.addmm.default, U(1, 2), U(3, 4), T(U(4, 2)))
    case("baddbmm", "default", A.baddbmm.default, U(2, 3, 5), U(2, 3, 4), U(2, 4, 5))
    case("baddbmm", "ab", lambda b, x, y: A.baddbmm.default(b, x, y, beta=2.0, alpha=0.5), U(5), U(2, 3, 4), U(2, 4, 5))
    # products followed by pointwise ops (several 64-row blocks; a 3-d view
    # of a 2-d product as in GPT-2's Conv1D; batches; a last dim over one
    # 8192-element chunk): the cases a gemm epilogue must get right
    case("addmm", "gelu_epilogue", lambda b, x, y: A.gelu.default(A.addmm.default(b, x, y)), U(70), U(130, 8), T(U(8, 70)))
    case("addmm", "view3d_epilogue",
         lambda b, x, y: A.tanh.default(A.mul.Tensor(A.view.default(A.addmm.default(b, x, y), [2, 65, 70]), 2.0)),
         U(70), U(130, 8), U(8, 70))
    case("bmm", "relu_epilogue", lambda x, y: A.relu.default(A.mul.Tensor(A.bmm.default(x, y), 0.5)), U(2, 70, 8), U(2, 8, 33))
    case("mm", "wide_epilogue", lambda x, y, b: A.sigmoid.default(A.add.Tensor(A.mm.default(x, y), b)), U(2, 3), U(3, 8200), U(8200))
    # few row blocks, many columns: units split over column blocks (the
    # last one shorter), also with a transposed B and over batches
    case("mm", "cols_t", A.mm.default, U(4, 6), T(U(6, 1030)))
    case("bmm", "cols_t", A.bmm.default, U(2, 5, 3), U(2, 600, 3).transpose(1, 2))
    # an epilogue of two members (gelu's result used twice) and a product
    # of no rows over many columns
    case("mm", "two_member_epilogue", lambda x, y: (lambda t: A.mul.Tensor(t, t))(A.gelu.default(A.mm.default(x, y))),
         U(200, 32), U(32, 96))
    case("mm", "m0_cols", A.mm.default, U(0, 8), U(8, 1024))
    seed("embedding")
    w = U(10, 4)
    case("embedding", "default", A.embedding.default, w, I(2, 3, lo=0, hi=10))
    case("embedding", "pad", lambda w, i: A.embedding.default(w, i, 0), w, I(5, lo=0, hi=10))
    case("embedding", "t", A.embedding.default, T(U(4, 10)).t().contiguous(), I(3, lo=0, hi=10, dt=i32))
    case("embedding", "scalar_idx", A.embedding.default, w, torch.tensor(3))
    op = "embedding_dense_backward"
    idx = I(2, 3, lo=0, hi=6)
    case(op, "default", lambda g, i: A.embedding_dense_backward.default(g, i, 6, -1, False), U(2, 3, 4), idx)
    case(op, "pad_freq", lambda g, i: A.embedding_dense_backward.default(g, i, 6, 2, True), U(2, 3, 4), idx)
    seed("index_select")
    case("index_select", "dim0", lambda x, i: A.index_select.default(x, 0, i), U(5, 3), I(4, lo=0, hi=5))
    case("index_select", "neg", lambda x, i: A.index_select.default(x, -1, i), T(U(3, 4)), torch.tensor([2, 0, 2]))
    case("index_select", "scalar_idx", lambda x, i: A.index_select.default(x, 1, i), U(2, 3), torch.tensor(1))
    seed("gather")
    case("gather", "dim1", lambda x, i: A.gather.default(x, 1, i), U(3, 4), I(3, 2, lo=0, hi=4))
    case("gather", "dim0_small", lambda x, i: A.gather.default(x, 0, i), U(4, 3), I(2, 2, lo=0, hi=4))
    case("gather", "neg_t", lambda x, i: A.gather.default(x, -1, i), T(U(4, 3)), I(3, 5, lo=0, hi=3))
    op = "scatter"
    seed(op)
    idx = torch.stack([perm(4)[:3] for _ in range(2)])  # unique per row
    case(op, "src", lambda x, i, s: A.scatter.src(x, 1, i, s), U(2, 4), idx, U(2, 3))
    case(op, "value", lambda x, i: A.scatter.value(x, 1, i, -1.0), U(2, 4), idx)
    case(op, "dim0", lambda x, i, s: A.scatter.src(x, 0, i, s), U(4, 2), perm(4)[:3].view(3, 1), U(3, 2))
    case("scatter_add", "dups", lambda x, i, s: A.scatter_add.default(x, 1, i, s), U(2, 4), I(2, 5, lo=0, hi=4), U(2, 5))
    case("scatter_add", "i64", lambda x, i, s: A.scatter_add.default(x, 0, i, s), I(3), I(6, lo=0, hi=3), I(6))
    op = "scatter_reduce"
    seed(op)
    ACC.add(op)
    sr = A.scatter_reduce.two
    for how in ["sum", "prod", "mean", "amax", "amin"]:
        for inc in [True, False]:
            # dim 1 with repeats and a column no source names; src wider
            # than index (its extra elements unread)
            case(op, f"{how}_{'self' if inc else 'noself'}",
                 lambda x, i, s, how=how, inc=inc: sr(x, 1, i, s, how, include_self=inc),
                 U(3, 5), I(3, 4, lo=0, hi=4), U(3, 6))
    case(op, "amax_dim0_index_narrower", lambda x, i, s: sr(x, 0, i, s, "amax", include_self=False),
         U(5, 4), I(6, 3, lo=0, hi=5), U(6, 4))
    nan_src = U(3, 4)
    nan_src[1, 2] = float("nan")
    case(op, "amin_nan_f64", lambda x, i, s: sr(x, -1, i, s, "amin"), U(3, 5, dt=f64),
         I(3, 4, lo=0, hi=5), nan_src.to(f64))
    case(op, "mean_i64", lambda x, i, s: sr(x, 0, i, s, "mean", include_self=True), I(4, 2, lo=-9, hi=9),
         I(6, 2, lo=0, hi=4), I(6, 2, lo=-9, hi=9))
    op = "index_add"
    case(op, "rows", lambda x, i, s: A.index_add.default(x, 0, i, s), U(5, 3), I(7, lo=0, hi=5), U(7, 3))
    case(op, "dim1_alpha", lambda x, i, s: A.index_add.default(x, 1, i, s, alpha=2.5), U(2, 4, 3),
         I(6, lo=0, hi=4), U(2, 3, 6).transpose(1, 2))
    case(op, "neg_dim_f64", lambda x, i, s: A.index_add.default(x, -1, i, s), U(3, 4, dt=f64),
         I(5, lo=0, hi=4), U(3, 5, dt=f64))
    case(op, "scalar_index", lambda x, i, s: A.index_add.default(x, 0, i, s), U(4, 2),
         torch.tensor(2), U(1, 2))
    case(op, "i64", lambda x, i, s: A.index_add.default(x, 0, i, s, alpha=3), I(4), I(6, lo=0, hi=4), I(6))
    case(op, "empty", lambda x, i, s: A.index_add.default(x, 0, i, s), U(3, 2), I(0, lo=0, hi=3), U(0, 2))
    op = "index"
    seed(op)
    case(op, "one", lambda x, i: A.index.Tensor(x, [i]), U(5, 3), I(4, lo=-5, hi=5))
    case(op, "two_bcast", lambda x, i, j: A.index.Tensor(x, [i, j]), U(4, 5), I(3, 1, lo=0, hi=4), I(2, lo=0, hi=5))
    case(op, "none_first", lambda x, i: A.index.Tensor(x, [None, i]), U(3, 4, 2), I(2, 2, lo=0, hi=4))
    case(op, "nonadjacent", lambda x, i, j: A.index.Tensor(x, [i, None, j]), U(3, 4, 5), I(2, lo=0, hi=3), I(2, lo=0, hi=5))
    case(op, "bool", lambda x, m: A.index.Tensor(x, [m]), U(4, 3), torch.tensor([True, False, True, True]))
    case(op, "t", lambda x, i: A.index.Tensor(x, [None, i]), T(U(4, 3)), I(2, lo=-3, hi=3))
    op = "_unsafe_index"  # upsample_nearest2d's decomposition: broadcast [H, 1] and [W] rows
    seed(op)
    case(op, "upsample", lambda x, i, j: A._unsafe_index.Tensor(x, [None, None, i, j]), U(2, 3, 4, 5),
         (torch.arange(8) // 2).view(8, 1), torch.arange(10) // 2)
    case(op, "one", lambda x, i: A._unsafe_index.Tensor(x, [i]), U(5, 3), I(4, lo=0, hi=5))
    op = "_unsafe_index_put"
    seed(op)
    case(op, "acc", lambda x, i, v: A._unsafe_index_put.default(x, [i], v, True), U(4, 2), I(6, lo=0, hi=4), U(6, 2))
    op = "index_put"
    seed(op)
    case(op, "put", lambda x, i, v: A.index_put.default(x, [i], v), U(5, 3), perm(5)[:3], U(3, 3))
    case(op, "bcast", lambda x, i, v: A.index_put.default(x, [None, i], v), U(3, 4), perm(4)[:2], U(2))
    case(op, "acc", lambda x, i, v: A.index_put.default(x, [i], v, True), U(4, 2), I(6, lo=0, hi=4), U(6, 2))
    case(op, "two", lambda x, i, j, v: A.index_put.default(x, [i, j], v, True), U(3, 3), I(4, lo=0, hi=3), I(4, lo=0, hi=3), U(4))
    seed("nll")
    op = "nll_loss_forward"
    x = torch.log_softmax(U(5, 4), 1)
    t = torch.tensor([0, 3, -100, 1, 2])
    for red in (0, 1, 2):
        case(op, f"red{red}", lambda x, t, red=red: A.nll_loss_forward.default(x, t, None, red, -100), x, t)
    case(op, "weight", lambda x, t, w: A.nll_loss_forward.default(x, t, w, 1, 2), x, t.clamp(min=0), P(4))
    case(op, "1d", lambda x, t: A.nll_loss_forward.default(x, t, None, 1, -100), x[0], torch.tensor(2))
    op = "nll_loss_backward"
    for red in (0, 1, 2):
        _, tw = A.nll_loss_forward.default(x, t, None, red, -100)
        g = U(5) if red == 0 else U(1).view([])
        case(op, f"red{red}", lambda g, x, t, tw, red=red: A.nll_loss_backward.default(g, x, t, None, red, -100, tw), g, x, t, tw)
    wv = P(4)
    _, tw = A.nll_loss_forward.default(x, t.clamp(min=0), wv, 1, 2)
    case(op, "weight", lambda g, x, t, w, tw: A.nll_loss_backward.default(g, x, t, w, 1, 2, tw), U(1).view([]), x, t.clamp(min=0), wv, tw)
    seed("mse")
    for red in (0, 1, 2):
        case("mse_loss", f"red{red}", lambda x, y, red=red: A.mse_loss.default(x, y, red), U(3, 4), U(3, 4))
        g = U(3, 4) if red == 0 else U(1).view([])
        case("mse_loss_backward", f"red{red}", lambda g, x, y, red=red: A.mse_loss_backward.default(g, x, y, red), g, U(3, 4), U(3, 4))
    seed("conv")
    op = "convolution"
    conv = A.convolution.default
    case(op, "2d", lambda x, w, b: conv(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), U(2, 3, 6, 5), U(4, 3, 3, 3), U(4))
    case(op, "2d_stride_nobias", lambda x, w: conv(x, w, None, [2, 1], [0, 2], [1, 1], False, [0, 0], 1), U(1, 2, 7, 6), U(3, 2, 3, 2))
    case(op, "2d_dil_groups", lambda x, w, b: conv(x, w, b, [1, 1], [2, 2], [2, 2], False, [0, 0], 2), U(1, 4, 6, 6), U(6, 2, 3, 3), U(6))
    case(op, "1d", lambda x, w, b: conv(x, w, b, [2], [1], [1], False, [0], 1), U(2, 3, 9), U(5, 3, 3), U(5))
    case(op, "depthwise", lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 3), U(1, 3, 5, 5), U(3, 1, 3, 3))
    case(op, "transposed", lambda x, w, b: conv(x, w, b, [2, 2], [1, 1], [1, 1], True, [1, 0], 1), U(1, 3, 4, 3), U(3, 2, 3, 3), U(2))
    case(op, "f64_t", lambda x, w: conv(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), U(1, 2, 4, 4, dt=f64).transpose(2, 3), U(2, 2, 2, 2, dt=f64))
    op = "convolution_backward"
    cb = A.convolution_backward.default
    x, w = U(2, 3, 6, 5), U(4, 3, 3, 3)
    case(op, "2d", lambda g, x, w: cb(g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]), U(2, 4, 6, 5), x, w)
    case(op, "mask", lambda g, x, w: cb(g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True]), U(2, 4, 6, 5), x, w)
    x2, w2 = U(1, 4, 7, 7), U(6, 2, 3, 3)
    case(op, "stride_dil_groups", lambda g, x, w: cb(g, x, w, None, [2, 2], [2, 1], [2, 1], False, [0, 0], 2, [True, True, False]),
         U(1, 6, 4, 4), x2, w2)
    case(op, "1d", lambda g, x, w: cb(g, x, w, [5], [2], [1], [1], False, [0], 1, [True, True, True]), U(2, 5, 5), U(2, 3, 9), U(5, 3, 3))
    case(op, "transposed", lambda g, x, w: cb(g, x, w, [2], [2, 2], [1, 1], [1, 1], True, [1, 0], 1, [True, True, True]),
         U(1, 2, 8, 5), U(1, 3, 4, 3), U(3, 2, 3, 3))
    # transposed convolutions (ops_conv.c conv_transposed): the input
    # gradient of the convolution their weight is; their backward a
    # convolution and that convolution's weight gradient. A 4x4 stride-2
    # upsampling (a GAN's, col2im by phases), grouped and dilated, 1-d,
    # depthwise, a 2x2 stride-2 in f64 (U-Net's), an output_padding past the
    # stride (below the dilation), a 1x1
    tconv_cases = [
        ("gemm_s2", U(2, 16, 8, 8), U(16, 8, 4, 4), U(8), [2, 2], [1, 1], [1, 1], [0, 0], 1),
        ("groups_dil", U(1, 4, 5, 6), U(4, 3, 3, 3), U(6), [2, 1], [1, 0], [2, 1], [1, 0], 2),
        ("1d", U(2, 6, 9), U(6, 4, 5), U(4), [3], [2], [1], [1], 1),
        ("depthwise", U(1, 4, 5, 5), U(4, 1, 3, 3), None, [2, 2], [1, 1], [1, 1], [1, 1], 4),
        ("f64_2x2", U(2, 8, 5, 5, dt=f64), U(8, 4, 2, 2, dt=f64), U(4, dt=f64), [2, 2], [0, 0], [1, 1], [0, 0], 1),
        ("op_dil", U(1, 2, 4, 4), U(2, 3, 3, 3), None, [1, 1], [1, 1], [2, 2], [1, 1], 1),
        ("1x1", U(2, 8, 4, 4), U(8, 6, 1, 1), U(6), [1, 1], [0, 0], [1, 1], [0, 0], 1),
        # transposed 3-d (ops_conv.c conv_transposed: conv3d_bw's forms):
        # a volumetric U-Net's 2x2x2 stride-2 up-convolution, a 3x3x3 in
        # groups with an output_padding, and one whose output_padding is
        # the stride (below the dilation): left to torch
        ("3d_2x2", U(2, 8, 3, 4, 4), U(8, 4, 2, 2, 2), U(4), [2, 2, 2], [0, 0, 0], [1, 1, 1], [0, 0, 0], 1),
        ("3d_k3_op", U(1, 4, 3, 4, 3), U(4, 3, 3, 3, 3), None, [2, 2, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], 2),
        ("3d_op_dil", U(1, 2, 3, 3, 3), U(2, 2, 3, 3, 3), None, [1, 1, 1], [1, 1, 1], [2, 2, 2], [1, 1, 1], 1),
    ]
    # 3-d convolutions (ops_conv.c conv3d: the 2-d convolution over (H, W)
    # with the depth taps folded into the channels): padded, strided in
    # depth, dilated, grouped, with and without bias, f64
    c3_cases = [
        ("3d", U(2, 3, 5, 6, 6), U(4, 3, 3, 3, 3), U(4), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
        ("3d_stride_groups", U(1, 4, 7, 6, 5), U(6, 2, 3, 2, 3), None, [2, 1, 2], [1, 0, 1], [1, 1, 1], 2),
        ("3d_dil_f64", U(1, 2, 6, 5, 5, dt=f64), U(3, 2, 2, 3, 3, dt=f64), U(3, dt=f64), [1, 2, 1], [2, 1, 0],
         [2, 1, 1], 1),
        ("3d_gemm", U(2, 16, 4, 8, 8), U(16, 16, 3, 3, 3), U(16), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
        # depth 1 padded by 1 (R3D's last layers): only the middle tap reads
        # the input; depth 2 at stride 2: the first tap reads padding only
        ("3d_depth1", U(2, 8, 1, 5, 5), U(6, 8, 3, 3, 3), U(6), [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
        ("3d_depth2_s2", U(1, 4, 2, 6, 6), U(4, 2, 3, 3, 3), None, [2, 1, 1], [1, 1, 1], [1, 1, 1], 2),
    ]
    for name, x, w, b, st, pd, dl, gr in c3_cases:
        if b is None:
            case("convolution", name, lambda x, w, st=st, pd=pd, dl=dl, gr=gr:
                 conv(x, w, None, st, pd, dl, False, [0, 0, 0], gr), x, w, min_atol=1e-5)
        else:
            case("convolution", name, lambda x, w, b, st=st, pd=pd, dl=dl, gr=gr:
                 conv(x, w, b, st, pd, dl, False, [0, 0, 0], gr), x, w, b, min_atol=1e-5)
        y = conv(x, w, None, st, pd, dl, False, [0, 0, 0], gr)
        mk = [True, True, b is not None]
        case("convolution_backward", name,
             lambda g, x, w, st=st, pd=pd, dl=dl, gr=gr, mk=mk, nb=w.shape[0]:
             cb(g, x, w, [nb], st, pd, dl, False, [0, 0, 0], gr, mk), U(*y.shape, dt=y.dtype), x, w,
             min_atol=1e-5)
    case("convolution_backward", "3d_input_only",
         lambda g, x, w: cb(g, x, w, None, [2, 2, 2], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1,
                            [True, False, False]),
         U(1, 4, 3, 3, 3), U(1, 3, 6, 6, 6), U(4, 3, 3, 3, 3), min_atol=1e-5)
    for name, x, w, b, st, pd, dl, op_, gr in tconv_cases:
        if b is None:
            case("convolution", f"transposed_{name}",
                 lambda x, w, st=st, pd=pd, dl=dl, op_=op_, gr=gr: conv(x, w, None, st, pd, dl, True, op_, gr), x, w,
                 min_atol=1e-5)
        else:
            case("convolution", f"transposed_{name}",
                 lambda x, w, b, st=st, pd=pd, dl=dl, op_=op_, gr=gr: conv(x, w, b, st, pd, dl, True, op_, gr), x, w, b,
                 min_atol=1e-5)
        y = conv(x, w, None, st, pd, dl, True, op_, gr)
        masks = {"1d": [True, True, False], "op_dil": [True, False, False], "f64_2x2": [False, True, True]}
        mk = masks.get(name, [True, True, True])
        g = U(*y.shape, dt=y.dtype)
        case("convolution_backward", f"transposed_{name}",
             lambda g, x, w, st=st, pd=pd, dl=dl, op_=op_, gr=gr, mk=mk, nb=w.shape[1] * gr:
             cb(g, x, w, [nb], st, pd, dl, True, op_, gr, mk), g, x, w, min_atol=1e-5)
    # im2col + GEMM (C·KH·KW > 32): one image; a batch of small images in
    # the columns of one product (read back through a permuted view, here
    # into a relu epilogue); the same in f64
    op = "convolution"
    case(op, "im2col_dil", lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 2], False, [0, 0], 1), U(1, 5, 9, 8), U(6, 5, 3, 3))
    case(op, "batch_cols_relu", lambda x, w, b: A.relu.default(conv(x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)),
         U(3, 5, 9, 8), U(7, 5, 3, 3), U(7))
    case(op, "batch_cols_f64", lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), U(2, 5, 4, 4, dt=f64), U(3, 5, 3, 3, dt=f64))
    # grouped, Cg·KH·KW > 64: a product per group with the batch in its
    # columns (ops_conv.c conv_cols), or where there are units enough,
    # implicit GEMM per group (f32 on AVX-512: 2 groups of 8 rows over 448
    # columns, dilated along W); their backward as products per group
    case(op, "groups_gemm_stride", lambda x, w, b: conv(x, w, b, [2, 1], [1, 1], [1, 1], False, [0, 0], 2),
         U(2, 16, 9, 8), U(8, 8, 3, 3), U(8), min_atol=1e-5)
    case(op, "groups_implicit_dil", lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 2], False, [0, 0], 2),
         U(2, 16, 16, 16), U(16, 8, 3, 3), min_atol=1e-5)
    case(op, "groups_gemm_f64", lambda x, w: conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4),
         U(2, 32, 5, 5, dt=f64), U(8, 8, 3, 3, dt=f64))
    op = "convolution_backward"
    case(op, "groups_gemm_stride", lambda g, x, w: cb(g, x, w, [8], [2, 1], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]),
         U(2, 8, 5, 8), U(2, 16, 9, 8), U(8, 8, 3, 3), min_atol=1e-5)
    case(op, "groups_gemm_dil_mask", lambda g, x, w: cb(g, x, w, None, [1, 1], [2, 1], [2, 1], False, [0, 0], 3, [True, False, False]),
         U(1, 6, 5, 6), U(1, 24, 5, 6), U(6, 8, 3, 3), min_atol=1e-5)
    case(op, "groups_gemm_weight", lambda g, x, w: cb(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [False, True, False]),
         U(3, 16, 4, 4), U(3, 16, 4, 4), U(16, 8, 3, 3), min_atol=1e-5)
    # strided, the strides dividing the input: grad_input's col2im by the
    # input positions' phases (ops_conv.c col2im_phases): 3x3 at stride 2;
    # stride (2, 1) dilated along W; a 1x1 at stride 2 (one phase of four
    # gets taps); 1-d in groups
    case(op, "phases_s2", lambda g, x, w: cb(g, x, w, [4], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]),
         U(2, 4, 4, 3), U(2, 5, 8, 6), U(4, 5, 3, 3), min_atol=1e-5)
    case(op, "phases_s21_dil", lambda g, x, w: cb(g, x, w, None, [2, 1], [0, 2], [1, 2], False, [0, 0], 1, [True, False, False]),
         U(1, 4, 3, 7), U(1, 6, 8, 7), U(4, 6, 3, 3), min_atol=1e-5)
    case(op, "phases_1x1_s2", lambda g, x, w: cb(g, x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]),
         U(2, 8, 3, 3), U(2, 40, 6, 6), U(8, 40, 1, 1), min_atol=1e-5)
    case(op, "phases_1d_groups", lambda g, x, w: cb(g, x, w, None, [2], [2], [1], False, [0], 2, [True, True, False]),
         U(2, 8, 5), U(2, 16, 10), U(8, 8, 5), min_atol=1e-5)
    seed("pool")
    op = "max_pool2d_with_indices"
    mp = A.max_pool2d_with_indices.default
    case(op, "k2", lambda x: mp(x, [2, 2], [2, 2]), U(2, 3, 6, 6))
    case(op, "k3s2p1", lambda x: mp(x, [3, 3], [2, 2], [1, 1]), U(1, 2, 7, 5))
    case(op, "ceil_dil", lambda x: mp(x, [2, 3], [2, 2], [1, 1], [1, 2], True), U(1, 2, 7, 8))
    case(op, "3d_ties", lambda x: mp(x, [2, 2]), SMALL(2, 4, 4))
    case(op, "default_stride", lambda x: mp(x, [3, 3], []), U(1, 1, 7, 7))
    op = "max_pool2d_with_indices_backward"
    xm = U(1, 2, 7, 5)
    _, ind = mp(xm, [3, 3], [2, 2], [1, 1])
    case(op, "k3s2p1", lambda g, x, i: A.max_pool2d_with_indices_backward.default(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i),
         U(1, 2, 4, 3), xm, ind)
    xm2 = U(2, 3, 6, 6)
    _, ind2 = mp(xm2, [2, 2], [2, 2])
    case(op, "k2", lambda g, x, i: A.max_pool2d_with_indices_backward.default(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i),
         U(2, 3, 3, 3), xm2, ind2)
    op = "avg_pool2d"
    ap = A.avg_pool2d.default
    case(op, "k2", lambda x: ap(x, [2, 2]), U(2, 3, 6, 6))
    case(op, "pad", lambda x: ap(x, [3, 3], [2, 2], [1, 1]), U(1, 2, 7, 5))
    case(op, "nopad_count", lambda x: ap(x, [3, 3], [2, 2], [1, 1], False, False), U(1, 2, 7, 5))
    case(op, "ceil", lambda x: ap(x, [3, 2], [2, 2], [1, 0], True), U(1, 1, 6, 5))
    case(op, "divisor", lambda x: ap(x, [2, 2], [1, 1], [0, 0], False, True, 3), U(3, 4, 4))
    op = "avg_pool2d_backward"
    apb = A.avg_pool2d_backward.default
    case(op, "pad", lambda g, x: apb(g, x, [3, 3], [2, 2], [1, 1], False, True, None), U(1, 2, 4, 3), U(1, 2, 7, 5))
    case(op, "nocount_ceil", lambda g, x: apb(g, x, [3, 2], [2, 2], [1, 0], True, False, None), U(1, 1, 4, 3), U(1, 1, 6, 5))
    case(op, "divisor", lambda g, x: apb(g, x, [2, 2], [1, 1], [0, 0], False, True, 3), U(3, 3, 3), U(3, 4, 4))
    op = "_adaptive_avg_pool2d"
    case(op, "even", lambda x: A._adaptive_avg_pool2d.default(x, [2, 2]), U(2, 3, 4, 4))
    case(op, "uneven", lambda x: A._adaptive_avg_pool2d.default(x, [3, 2]), U(1, 2, 7, 5))
    case(op, "one", lambda x: A._adaptive_avg_pool2d.default(x, [1, 1]), U(2, 5, 3))
    case(op, "up", lambda x: A._adaptive_avg_pool2d.default(x, [5, 4]), U(1, 1, 3, 2))
    op = "_adaptive_avg_pool2d_backward"
    case(op, "uneven", A._adaptive_avg_pool2d_backward.default, U(1, 2, 3, 2), U(1, 2, 7, 5))
    case(op, "one", A._adaptive_avg_pool2d_backward.default, U(2, 5, 1, 1), U(2, 5, 3, 3))
    seed("upsample")
    op = "upsample_nearest2d"
    case(op, "x2", lambda x: A.upsample_nearest2d.default(x, [6, 8]), U(1, 2, 3, 4))
    case(op, "odd", lambda x: A.upsample_nearest2d.default(x, [5, 7]), U(1, 2, 3, 4))
    case(op, "down", lambda x: A.upsample_nearest2d.default(x, [2, 3]), U(1, 1, 5, 7))
    case(op, "scales", lambda x: A.upsample_nearest2d.default(x, [7, 5], 2.5, 1.5), U(1, 1, 3, 4))
    case(op, "vec", lambda x: A.upsample_nearest2d.vec(x, None, [1.5, 2.0]), U(1, 2, 4, 3))
    op = "upsample_bilinear2d"
    case(op, "ac_false", lambda x: A.upsample_bilinear2d.default(x, [6, 7], False), U(1, 2, 3, 4))
    case(op, "ac_true", lambda x: A.upsample_bilinear2d.default(x, [6, 7], True), U(1, 2, 3, 4))
    case(op, "down", lambda x: A.upsample_bilinear2d.default(x, [2, 3], False), U(2, 1, 5, 7))
    case(op, "vec", lambda x: A.upsample_bilinear2d.vec(x, None, False, [2.0, 1.5]), U(1, 2, 3, 4))
    case(op, "one", lambda x: A.upsample_bilinear2d.default(x, [1, 3], True), U(1, 1, 3, 3))
    seed("sdpa")
    op = "_scaled_dot_product_flash_attention_for_cpu"
    sd = A._scaled_dot_product_flash_attention_for_cpu.default
    q, k, v = U(2, 2, 5, 4), U(2, 2, 6, 4), U(2, 2, 6, 4)
    case(op, "plain", sd, q, k, v)
    case(op, "causal", lambda q, k, v: sd(q, k, v, 0.0, True), U(1, 2, 5, 4), U(1, 2, 5, 4), U(1, 2, 5, 4))
    mask = B(5, 6)
    mask[:, 0] = True
    ninf = torch.zeros(5, 6).masked_fill(~mask, float("-inf"))
    case(op, "ninf_mask", lambda q, k, v, m: sd(q, k, v, attn_mask=m), q, k, v, ninf)
    case(op, "float_mask_scale", lambda q, k, v, m: sd(q, k, v, attn_mask=m, scale=0.3), q, k, v, U(2, 1, 5, 6))
    qt = U(2, 5, 2, 4).transpose(1, 2)
    case(op, "strided", sd, qt, k, v)
    # a NaN score (from the mask, or from a key): the row max may drop it
    # (RED_MAXNP), the exp sum may not; torch gives that query's output and
    # lse as NaN (a key's NaN: every query of the head). No random draws, so
    # the cases below keep their inputs.
    nm = torch.zeros(2, 1, 5, 6)
    nm[0, 0, 1, 2] = float("nan")
    nm[1, 0, 3, 5] = float("nan")
    case(op, "nan_mask", lambda q, k, v, m: sd(q, k, v, attn_mask=m), q, k, v, nm)
    kn = k.clone()
    kn[0, 1, 4, 0] = float("nan")
    case(op, "nan_key", sd, q, kn, v)
    op = "_scaled_dot_product_flash_attention_for_cpu_backward"
    sdb = A._scaled_dot_product_flash_attention_for_cpu_backward.default
    o, l = sd(q, k, v)
    case(op, "plain", lambda g, q, k, v, o, l: sdb(g, q, k, v, o, l, 0.0, False), U(2, 2, 5, 4), q, k, v, o, l)
    qc, kc, vc = U(1, 2, 5, 4), U(1, 2, 5, 4), U(1, 2, 5, 4)
    oc, lc = sd(qc, kc, vc, 0.0, True)
    case(op, "causal", lambda g, q, k, v, o, l: sdb(g, q, k, v, o, l, 0.0, True), U(1, 2, 5, 4), qc, kc, vc, oc, lc)
    fm = U(2, 1, 5, 6)
    om, lm = sd(q, k, v, attn_mask=fm, scale=0.3)
    case(op, "mask_scale", lambda g, q, k, v, o, l, m: sdb(g, q, k, v, o, l, 0.0, False, attn_mask=m, scale=0.3),
         U(2, 2, 5, 4), q, k, v, om, lm, fm)
    build_fused_attention()


def build_fused_attention():
    """nn.TransformerEncoderLayer's and nn.MultiheadAttention's fused
    inference ops (torch's fast path): a float mask masks where non-zero."""
    for op in ["_transformer_encoder_layer_fwd", "_native_multi_head_attention"]:
        ACC.add(op)

    def casef(*a, **kw):
        # f32 through two products, a softmax and two layer norms, summed
        # in another order than torch's: an atol floor of 2e-5
        case(*a, min_atol=2e-5, **kw)
    seed("encoder_layer")
    op = "_transformer_encoder_layer_fwd"
    tel = A._transformer_encoder_layer_fwd.default
    E, H, F, L = 8, 2, 12, 5

    def layer_w(dt=f32):
        s = 0.4
        return [U(3 * E, E, dt=dt) * s, U(3 * E, dt=dt) * s, U(E, E, dt=dt) * s, U(E, dt=dt) * s,
                P(E, dt=dt), U(E, dt=dt), P(E, dt=dt), U(E, dt=dt),
                U(F, E, dt=dt) * s, U(F, dt=dt) * s, U(E, F, dt=dt) * s, U(E, dt=dt) * s]

    def enc(gelu, nf, mt=None):
        def fn(x, qw, qb, pw, pb, n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b, m=None):
            return tel(x, E, H, qw, qb, pw, pb, gelu, nf, 1e-5, n1w, n1b, n2w, n2b,
                       f1w, f1b, f2w, f2b, m, mt)
        return fn
    w = layer_w()
    x = U(2, L, E)
    casef(op, "relu_post_norm", enc(False, False), x, *w)
    casef(op, "gelu_pre_norm", enc(True, True), x, *w)
    kp = torch.zeros(2, L, dtype=b8)
    kp[0, 3:] = True
    casef(op, "key_padding_bool", enc(False, False, 1), x, *w, kp)
    causal = torch.ones(L, L, dtype=b8).triu(1)
    casef(op, "causal_bool_type0", enc(True, False, 0), x, *w, causal)
    # a float mask masks where it is not 0 (its values are not added)
    fm = torch.where(B(2, H, L, L), U(2, H, L, L), torch.zeros(2, H, L, L))
    fm[:, :, :, 0] = 0
    casef(op, "float_mask_type2", enc(True, True, 2), x, *w, fm)
    casef(op, "f64", enc(True, False), x.to(f64), *[t.to(f64) for t in w])
    seed("native_mha")
    op = "_native_multi_head_attention"
    nmha = A._native_multi_head_attention.default
    qw, qb, pw, pb = w[:4]

    def mha(need_w, avg, mt=None, self_attn=False):
        if self_attn:
            return lambda x, qw, qb, pw, pb: nmha(x, x, x, E, H, qw, qb, pw, pb, None, need_w, avg)
        return lambda q, k, v, qw, qb, pw, pb, m=None: nmha(q, k, v, E, H, qw, qb, pw, pb, m,
                                                            need_w, avg, mt)
    casef(op, "self_avg_weights", mha(True, True, self_attn=True), x, qw, qb, pw, pb)
    kx, vx = U(2, L, E), U(2, L, E)  # torch's kernel wants S == L
    casef(op, "cross_head_weights", mha(True, False), x, kx, vx, qw, qb, pw, pb)
    casef(op, "no_weights", mha(False, True), x, kx, vx, qw, qb, pw, pb)
    kp6 = torch.zeros(2, L, dtype=b8)
    kp6[1, 2:] = True
    casef(op, "key_padding_avg", mha(True, True, 1), x, kx, vx, qw, qb, pw, pb, kp6)
    # a batch element with every key masked: NaN there, as torch
    kpa = torch.zeros(2, L, dtype=b8)
    kpa[0, :] = True
    casef(op, "all_keys_masked", mha(True, False, 1), x, kx, vx, qw, qb, pw, pb, kpa)


# --------------------------------------------------------------------------
# encoding

def tensor_entry(t):
    t = t.detach().contiguous()
    name = DTYPE_NAMES[t.dtype]
    if t.dtype == bf16:
        data = t.view(torch.int16).numpy().tobytes()
    else:
        data = t.numpy().tobytes()
    return {"dtype": name, "shape": list(t.shape), "data": data}


def flat_outputs(r):
    if isinstance(r, torch.Tensor):
        return [r]
    out = []
    for x in r:
        out.extend(flat_outputs(x))
    return out


def up64(a):
    return a.to(f64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def measured_tol(c, outs):
    """rtol/atol that cover torch's rounding, measured against the same op
    run in f64 (only for accumulating ops with floating outputs)."""
    if not c["acc"] or not c["f64ref"]:
        return None
    try:
        ref = flat_outputs(c["fn"](*[up64(a) for a in c["args"]]))
    except Exception:
        return None
    if len(ref) != len(outs):
        return None
    rtol = atol = 0.0
    for o, r in zip(outs, ref):
        if not o.is_floating_point() or o.shape != r.shape or o.numel() == 0:
            continue
        dr, da = DEFAULT_TOL.get(o.dtype, (1e-5, 1e-6))
        a, b = o.to(f64), r.to(f64)
        fin = torch.isfinite(a) & torch.isfinite(b)
        if not fin.any():
            continue
        excess = ((a - b).abs() - dr * b.abs())[fin].max().item()
        rtol = max(rtol, dr)
        atol = max(atol, da, 2 * excess)
    atol = max(atol, c.get("min_atol", 0.0))
    if atol <= 0:
        return None
    return rtol, atol


def run_case(op, c):
    args = c["args"]
    gm = make_fx(c["fn"], tracing_mode="symbolic" if c["alt"] else "real")(*args)
    gm.graph.eliminate_dead_code()  # unused getitems of None outputs
    gm.recompile()
    graph = export_graph(gm, list(args))
    graph.pop("none_outputs", None)
    symbols = {}
    if c["alt"] is not None:
        args = c["alt"]
        for spec_, a in zip(graph["inputs"], args):
            for d, dim in enumerate(spec_.get("shape", [])):
                if isinstance(dim, str) and dim.isidentifier():
                    symbols[dim] = int(a.shape[d])
        c = dict(c, args=args)
    outs = flat_outputs(c["fn"](*args))
    # undefined values (empty): store zeros so the files are reproducible
    outs = [torch.zeros_like(o) if k in c["nocheck"] else o for k, o in enumerate(outs)]
    io = {"format": "kiln.io/1", "symbols": symbols,
          "inputs": [tensor_entry(a) for a in args],
          "outputs": [tensor_entry(o) for o in outs]}
    if c["nocheck"]:
        io["nocheck"] = c["nocheck"]
    tol = measured_tol(c, outs)
    if tol is not None:
        dt = next((o.dtype for o in outs if o.is_floating_point()), f32)
        dr, da = DEFAULT_TOL.get(dt, (1e-5, 1e-6))
        if tol[1] > da * 1.0001:
            io["rtol"], io["atol"] = tol[0], float(f"{tol[1]:.3g}")
    ops = {n["op"] for n in graph["nodes"]}
    return {"name": c["name"], "graph": graph, "io": io}, ops


# --------------------------------------------------------------------------
# rejection cases (graphs the interpreter must refuse)

def spec(dt, shape, **kw):
    d = {"dtype": dt, "shape": shape}
    d.update(kw)
    return d


def zeros_entry(dt, shape):
    n = 1
    for s in shape:
        n *= s
    size = {"f32": 4, "f64": 8, "i64": 8, "bool": 1, "f16": 2}[dt]
    return {"dtype": dt, "shape": shape, "data": bytes(n * size)}


def graph1(inputs, nodes, outputs, symbols=None):
    g = {"format": "kiln.graph/1", "inputs": inputs, "nodes": nodes, "outputs": outputs}
    if symbols:
        g["symbols"] = symbols
    return g


def node(op, args, out, kwargs=None):
    n = {"op": op, "args": args, "out": out}
    if kwargs:
        n["kwargs"] = kwargs
    return n


R0, R1, R2 = {"ref": 0}, {"ref": 1}, {"ref": 2}


def fused_attention_bad_cases():
    """The fused encoder-layer and multi-head attention ops with weights of
    the wrong shape or dtype, heads that do not divide embed_dim, an
    embed_dim that is not the input's, a mask of the wrong shape."""
    E, F = 8, 12

    def enc(heads=2, embed=E, dts=None, shapes=None, mask=None, mask_type=None):
        shp = [[2, 5, E], [3 * E, E], [3 * E], [E, E], [E], [E], [E], [E], [E],
               [F, E], [F], [E, F], [E]]
        dts = dts or {}
        shapes = shapes or {}
        ins = [spec(dts.get(k, "f32"), shapes.get(k, sh)) for k, sh in enumerate(shp)]
        ents = [zeros_entry(dts.get(k, "f32"), shapes.get(k, sh)) for k, sh in enumerate(shp)]
        mref = None
        if mask is not None:
            ins.append(spec(mask[0], mask[1]))
            ents.append(zeros_entry(mask[0], mask[1]))
            mref = {"ref": 13}
        r = [{"ref": k} for k in range(13)]
        args = [r[0], embed, heads] + r[1:5] + [False, False, 1e-5] + r[5:13] + [mref, mask_type]
        out = len(ins)
        g = graph1(ins, [node("aten._transformer_encoder_layer_fwd.default", args,
                              [spec("f32", [2, 5, E])])], [{"ref": out}])
        return g, ents
    g, e = enc(heads=3)
    yield ("mha_heads_divide", g, e, "invalid_graph", "num_heads 3 does not divide embed_dim 8")
    g, e = enc(embed=16)
    yield ("mha_embed_dim", g, e, "invalid_graph", "embed_dim 16 is not the input's last dim 8")
    g, e = enc(dts={12: "f64"})
    yield ("mha_weight_dtype", g, e, "invalid_graph",
           "the weights must have the input's dtype f32, not f64")
    g, e = enc(mask=("bool", [5, 5]), mask_type=1)
    yield ("mha_mask_shape", g, e, "invalid_graph",
           "a mask of mask_type 1 has shape [5,5], expected [2,5]")
    g, e = enc(mask=("bool", [5, 5]), mask_type=3)
    yield ("mha_mask_type", g, e, "invalid_graph", "mask_type must be 0, 1 or 2, not 3")
    qs = [[2, 5, E], [2, 5, E], [2, 5, E], [3 * E, E + 1], [3 * E], [E, E], [E]]
    ins = [spec("f32", sh) for sh in qs]
    r = [{"ref": k} for k in range(7)]
    g = graph1(ins, [node("aten._native_multi_head_attention.default",
                          r[:3] + [E, 2] + r[3:7] + [None, False, True, None],
                          [spec("f32", [2, 5, E]), spec("f32", [0])])], [{"ref": 7}])
    yield ("mha_qkv_weight_shape", g, [zeros_entry("f32", sh) for sh in qs], "invalid_graph",
           "qkv_weight has shape [24,9], expected [24,8]")


def bad_cases():
    """(name, graph, io inputs, error, message substring)"""
    f23, f4 = spec("f32", [2, 3]), spec("f32", [4])
    z23, z4 = zeros_entry("f32", [2, 3]), zeros_entry("f32", [4])
    yield ("broadcast", graph1([f23, f4], [node("aten.add.Tensor", [R0, R1], [f23])], [{"ref": 2}]),
           [z23, z4], "invalid_graph", "node 0 (aten.add.Tensor): shapes [2,3] and [4] do not broadcast")
    yield ("reduce_dim_range", graph1([f23], [node("aten.sum.dim_IntList", [R0, [2]], [spec("f32", [2])])], [R1]),
           [z23], "invalid_graph", "dim 2 out of range")
    yield ("reduce_dim_range_neg", graph1([f23], [node("aten.amax.default", [R0, [-3]], [spec("f32", [2])])], [R1]),
           [z23], "invalid_graph", "dim -3 out of range")
    yield ("dtype_bitwise_float", graph1([f23, f23], [node("aten.bitwise_and.Tensor", [R0, R1], [f23])], [{"ref": 2}]),
           [z23, z23], "invalid_graph", "integer or bool")
    yield ("dtype_mean_int", graph1([spec("i64", [3])], [node("aten.mean.default", [R0], [spec("i64", [])])], [R1]),
           [zeros_entry("i64", [3])], "invalid_graph", "floating dtype")
    yield ("dtype_sub_bool", graph1([spec("bool", [3])] * 2, [node("aten.sub.Tensor", [R0, R1], [spec("bool", [3])])], [{"ref": 2}]),
           [zeros_entry("bool", [3])] * 2, "invalid_graph", "bool")
    yield ("dtype_gelu_int", graph1([spec("i64", [3])], [node("aten.gelu.default", [R0], [spec("i64", [3])])], [R1]),
           [zeros_entry("i64", [3])], "invalid_graph", "floating")
    # kiln.dropout (kiln/ops.py): input f32[2,3], seed i64[] unless named
    def kdrop(name, x, sd, p, stream, msg):
        outs = [spec(x["dtype"], x["shape"]), spec("bool", x["shape"])]
        return (name, graph1([x, sd], [node("kiln.dropout.default", [R0, p, R1, stream], outs)], [R2]),
                [zeros_entry(x["dtype"], x["shape"]), zeros_entry(sd["dtype"], sd["shape"])],
                "invalid_graph", msg)
    s0 = spec("i64", [])
    yield kdrop("kiln_dropout_p", f23, s0, 1.5, 0, "p must be in [0, 1]")
    yield kdrop("kiln_dropout_seed_dtype", f23, spec("f32", []), 0.5, 0, "seed must be an i64 scalar")
    yield kdrop("kiln_dropout_seed_shape", f23, spec("i64", [2]), 0.5, 0, "seed must be an i64 scalar")
    yield kdrop("kiln_dropout_int", spec("i64", [2, 3]), s0, 0.5, 0, "input must be floating")
    yield kdrop("kiln_dropout_stream", f23, s0, 0.5, -1, "stream must be >= 0")
    yield ("dtype_mm_mixed", graph1([spec("f32", [2, 2]), spec("f64", [2, 2])],
                                    [node("aten.mm.default", [R0, R1], [spec("f32", [2, 2])])], [{"ref": 2}]),
           [zeros_entry("f32", [2, 2]), zeros_entry("f64", [2, 2])], "invalid_graph", "one dtype")
    # roll: shifts and dims of different lengths, several shifts without
    # dims, a dim out of range (each also rejected by the compiler)
    yield ("roll_lengths", graph1([f23], [node("aten.roll.default", [R0, [1, 2], [0]], [f23])], [R1]),
           [z23], "invalid_graph", "shifts and dims must have the same length")
    yield ("roll_no_dims", graph1([f23], [node("aten.roll.default", [R0, [1, 2]], [f23])], [R1]),
           [z23], "invalid_graph", "without dims, shifts must be one shift")
    yield ("roll_dim_range", graph1([f23], [node("aten.roll.default", [R0, [1], [2]], [f23])], [R1]),
           [z23], "invalid_graph", "dim 2 out of range")
    # new_empty_strided: a stride list that is not one stride a dim
    yield ("new_empty_strided_stride_len",
           graph1([f23], [node("aten.new_empty_strided.default", [R0, [2, 3], [3]], [f23])],
                  [R1]),
           [z23], "invalid_graph", "stride has 1 entries for 2 dims")
    # _weight_norm_interface(_backward): g or saved_norms not of v's shape
    # with 1 in every dim but dim, an integer v
    f45, f41, f31 = spec("f32", [4, 5]), spec("f32", [4, 1]), spec("f32", [3, 1])
    yield ("weight_norm_g_shape",
           graph1([f45, f31], [node("aten._weight_norm_interface.default", [R0, R1, 0], [f45, f31])],
                  [R2]),
           [zeros_entry("f32", [4, 5]), zeros_entry("f32", [3, 1])], "invalid_graph",
           "g has shape [3,1], expected [4,1]")
    yield ("weight_norm_v_int",
           graph1([spec("i64", [4, 5]), f41],
                  [node("aten._weight_norm_interface.default", [R0, R1, 0], [f45, f41])], [R2]),
           [zeros_entry("i64", [4, 5]), zeros_entry("f32", [4, 1])], "invalid_graph",
           "v must be floating, not i64")
    yield ("weight_norm_bw_norms_shape",
           graph1([f45, f45, f41, spec("f32", [1, 5])],
                  [node("aten._weight_norm_interface_backward.default",
                        [R0, R1, R2, {"ref": 3}, 0], [f45, f41])], [{"ref": 4}]),
           [zeros_entry("f32", [4, 5])] * 2 + [zeros_entry("f32", [4, 1]), zeros_entry("f32", [1, 5])],
           "invalid_graph", "saved_norms has shape [1,5], expected [4,1]")
    yield ("weight_norm_bw_grad_shape",
           graph1([spec("f32", [4, 4]), f45, f41, f41],
                  [node("aten._weight_norm_interface_backward.default",
                        [R0, R1, R2, {"ref": 3}, 0], [f45, f41])], [{"ref": 4}]),
           [zeros_entry("f32", [4, 4]), zeros_entry("f32", [4, 5])] + [zeros_entry("f32", [4, 1])] * 2,
           "invalid_graph", "grad_w has shape [4,4], expected [4,5]")
    # index_add: source not of self's shape with index's length at dim
    yield ("index_add_source_shape",
           graph1([f23, spec("i64", [2]), spec("f32", [3, 3])],
                  [node("aten.index_add.default", [R0, 0, R1, R2], [f23])], [{"ref": 3}]),
           [z23, zeros_entry("i64", [2]), zeros_entry("f32", [3, 3])], "invalid_graph",
           "source must have self's shape with index's length at dim 0 (dim 0 differs)")
    yield ("index_add_index_2d",
           graph1([f23, spec("i64", [2, 1]), f23],
                  [node("aten.index_add.default", [R0, 0, R1, R2], [f23])], [{"ref": 3}]),
           [z23, zeros_entry("i64", [2, 1]), z23], "invalid_graph", "index must be 0-D or 1-D")
    yield ("index_add_int_alpha",
           graph1([spec("i64", [2, 3]), spec("i64", [2]), spec("i64", [2, 3])],
                  [node("aten.index_add.default", [R0, 0, R1, R2], [spec("i64", [2, 3])],
                        kwargs={"alpha": 2.5})], [{"ref": 3}]),
           [zeros_entry("i64", [2, 3]), zeros_entry("i64", [2]), zeros_entry("i64", [2, 3])],
           "invalid_graph", "alpha must be an integer for an integer self, not 2.5")
    yield ("index_add_source_dtype",
           graph1([f23, spec("i64", [2]), spec("f64", [2, 3])],
                  [node("aten.index_add.default", [R0, 0, R1, R2], [f23])], [{"ref": 3}]),
           [z23, zeros_entry("i64", [2]), zeros_entry("f64", [2, 3])], "invalid_graph",
           "source must have self's dtype")
    # as_strided_scatter: src not of the view's size, a view past self's
    # elements; copy: src that does not broadcast (each also rejected by
    # the compiler)
    yield ("as_strided_scatter_src", graph1([f23, spec("f32", [2, 2])],
                                            [node("aten.as_strided_scatter.default", [R0, R1, [2, 3], [3, 1], 0], [f23])],
                                            [R2]),
           [z23, zeros_entry("f32", [2, 2])], "invalid_graph", "src must have the view's size")
    yield ("as_strided_scatter_outside", graph1([f23, spec("f32", [2, 2])],
                                                [node("aten.as_strided_scatter.default", [R0, R1, [2, 2], [2, 1], 3], [f23])],
                                                [R2]),
           [z23, zeros_entry("f32", [2, 2])], "invalid_graph", "outside self's 6 elements")
    f44 = spec("f32", [4, 4])
    z44 = zeros_entry("f32", [4, 4])
    yield ("slice_past_end", graph1([f44], [node("aten.slice.Tensor", [R0, 0, 3, 10], [spec("f32", [5, 4])])],
                                    [R1]),
           [z44], "invalid_graph", "computed f32[1,4] but the node declares f32[5,4]")
    yield ("narrow_past_end", graph1([f44], [node("aten.narrow.default", [R0, 0, 3, 2], [spec("f32", [2, 4])])],
                                     [R1]),
           [z44], "invalid_graph", "start (3) + length (2) exceeds dim 0 of size 4")
    yield ("narrow_start_range", graph1([f44], [node("aten.narrow.default", [R0, 0, -9, 2],
                                                     [spec("f32", [2, 4])])], [R1]),
           [z44], "invalid_graph", "start -9 out of range for dim 0 of size 4")
    # declared shapes a kernel would read past its input with (the
    # compiler takes lengths from them): rejected, as the interpreter does
    yield ("split_past_end", graph1([f44], [node("aten.split.Tensor", [R0, 2, 0],
                                                 [spec("f32", [3, 4]), spec("f32", [3, 4])])], [R1]),
           [z44], "invalid_graph", "computed f32[2,4] but the node declares f32[3,4]")
    yield ("split_fewer_outputs", graph1([f44], [node("aten.split.Tensor", [R0, 1, 0], [spec("f32", [1, 4])])],
                                         [R1]),
           [z44], "invalid_graph", "makes 4 outputs but the node declares 1")
    yield ("split_with_sizes_mismatch",
           graph1([f44], [node("aten.split_with_sizes.default", [R0, [1, 3], 0],
                               [spec("f32", [3, 4]), spec("f32", [1, 4])])], [R1]),
           [z44], "invalid_graph", "computed f32[1,4] but the node declares f32[3,4]")
    f24 = spec("f32", [2, 4])
    yield ("unbind_more_outputs", graph1([f24], [node("aten.unbind.int", [R0, 0], [spec("f32", [4])] * 6)],
                                         [R1]),
           [zeros_entry("f32", [2, 4])], "invalid_graph", "makes 2 outputs but the node declares 6")
    yield ("as_strided_past_storage",
           graph1([f44], [node("aten.as_strided.default", [R0, [64, 64], [64, 1], 0],
                               [spec("f32", [64, 64])])], [R1]),
           [z44], "invalid_graph", "as_strided reaches outside the storage (16 elements)")
    yield ("as_strided_negative_stride",
           graph1([f44], [node("aten.as_strided.default", [R0, [4], [-1000], 0], [spec("f32", [4])])],
                  [R1]),
           [z44], "invalid_graph", "negative stride")
    yield ("pad_unpadded_dim", graph1([f44], [node("aten.constant_pad_nd.default", [R0, [1, 1]],
                                                   [spec("f32", [40, 6])])], [R1]),
           [z44], "invalid_graph", "computed f32[4,6] but the node declares f32[40,6]")
    yield ("repeat_shape", graph1([spec("f32", [0, 4])], [node("aten.repeat.default", [R0, [2, 1]],
                                                               [spec("f32", [2, 4])])], [R1]),
           [zeros_entry("f32", [0, 4])], "invalid_graph",
           "computed f32[0,4] but the node declares f32[2,4]")
    yield ("slice_backward_grad_shape",
           graph1([f24], [node("aten.slice_backward.default", [R0, [4, 64], 0, 0, 2, 1],
                               [spec("f32", [4, 64])])], [R1]),
           [zeros_entry("f32", [2, 4])], "invalid_graph", "grad_output has shape [2,4], expected [2,64]")
    yield ("select_backward_grad_shape",
           graph1([spec("f32", [4])], [node("aten.select_backward.default", [R0, [3, 64], 0, 1],
                                            [spec("f32", [3, 64])])], [R1]),
           [zeros_entry("f32", [4])], "invalid_graph", "grad_output has shape [4], expected [64]")
    yield ("view_symbolic_count",
           graph1([spec("f32", ["s0", 4])], [node("aten.view.default", [R0, [{"sym": "s0"}, 64]],
                                                  [spec("f32", ["s0", 64])])], [R1],
                  symbols={"s0": {"min": 2, "max": None, "hint": 4}}),
           [zeros_entry("f32", [4, 4])], "invalid_graph",
           "shape [4,64] is invalid for input of shape [4,4]")
    yield ("copy_broadcast", graph1([f23, f4], [node("aten.copy.default", [R0, R1], [f23])], [R2]),
           [z23, z4], "invalid_graph", "src does not broadcast to self's shape")
    yield ("view_size", graph1([f23], [node("aten.view.default", [R0, [4, 2]], [spec("f32", [4, 2])])], [R1]),
           [z23], "invalid_graph", "shape [4,2] is invalid for input of shape [2,3]")
    yield ("view_infer", graph1([f23], [node("aten.view.default", [R0, [4, -1]], [spec("f32", [4, 1])])], [R1]),
           [z23], "invalid_graph", "invalid for input")
    yield ("view_two_infer", graph1([f23], [node("aten.view.default", [R0, [-1, -1]], [spec("f32", [6, 1])])], [R1]),
           [z23], "invalid_graph", "only one dimension")
    yield ("expand_bad", graph1([f23], [node("aten.expand.default", [R0, [4, 3]], [spec("f32", [4, 3])])], [R1]),
           [z23], "invalid_graph", "cannot be expanded")
    yield ("out_shape", graph1([f23, f23], [node("aten.add.Tensor", [R0, R1], [spec("f32", [2, 4])])], [{"ref": 2}]),
           [z23, z23], "invalid_graph", "output 0: computed f32[2,3] but the node declares f32[2,4]")
    yield ("out_dtype", graph1([f23, f23], [node("aten.add.Tensor", [R0, R1], [spec("f64", [2, 3])])], [{"ref": 2}]),
           [z23, z23], "invalid_graph", "computed f32[2,3] but the node declares f64[2,3]")
    yield ("out_rank", graph1([f23], [node("aten.sum.dim_IntList", [R0, [1], True], [spec("f32", [2])])], [R1]),
           [z23], "invalid_graph", "computed f32[2,1]")
    sym = {"s0": {"min": 2, "max": 8}}
    yield ("symbol_min", graph1([spec("f32", ["s0", 3])], [node("aten.relu.default", [R0], [spec("f32", ["s0", 3])])], [R1], sym),
           [zeros_entry("f32", [1, 3])], "invalid_graph", "symbol s0 = 1 violates its constraint [2, 8]")
    yield ("symbol_max", graph1([spec("f32", ["s0", 3])], [node("aten.relu.default", [R0], [spec("f32", ["s0", 3])])], [R1], sym),
           [zeros_entry("f32", [9, 3])], "invalid_graph", "violates its constraint")
    yield ("symbol_conflict", graph1([spec("f32", ["s0"]), spec("f32", ["s0"])],
                                     [node("aten.add.Tensor", [R0, R1], [spec("f32", ["s0"])])], [{"ref": 2}], sym),
           [zeros_entry("f32", [3]), zeros_entry("f32", [4])], "invalid_graph", "symbol s0")
    yield ("symbol_expr_dim", graph1([spec("f32", ["s0"]), spec("f32", ["2*s0"])],
                                     [node("aten.relu.default", [R1], [spec("f32", ["2*s0"])])], [{"ref": 2}], sym),
           [zeros_entry("f32", [3]), zeros_entry("f32", [5])], "invalid_graph", "input 1: shape [5] does not match the declared [6]")
    yield ("input_shape", graph1([f23], [node("aten.relu.default", [R0], [f23])], [R1]),
           [zeros_entry("f32", [3, 2])], "invalid_graph", "input 0: shape [3,2] does not match the declared [2,3]")
    yield ("unknown_op", graph1([f23], [node("aten.frobnicate.default", [R0], [f23])], [R1]),
           [z23], "unsupported_op", "node 0 (aten.frobnicate.default)")
    yield ("unknown_overload", graph1([f23], [node("aten.relu.weird", [R0], [f23])], [R1]),
           [z23], "unsupported_op", "aten.relu.weird")
    yield ("later_node", graph1([f23], [node("aten.relu.default", [R0], [f23]),
                                         node("aten.sum.dim_IntList", [R1, [5]], [spec("f32", [2])])], [R2]),
           [z23], "invalid_graph", "node 1 (aten.sum.dim_IntList): dim 5 out of range")
    yield ("permute_dup", graph1([f23], [node("aten.permute.default", [R0, [0, 0]], [f23])], [R1]),
           [z23], "invalid_graph", "not a permutation")
    yield ("cat_shapes", graph1([f23, spec("f32", [3, 3])], [node("aten.cat.default", [[R0, R1], 1], [spec("f32", [2, 6])])], [{"ref": 2}]),
           [z23, zeros_entry("f32", [3, 3])], "invalid_graph", "does not match")
    yield ("mm_shapes", graph1([f23, f23], [node("aten.mm.default", [R0, R1], [spec("f32", [2, 3])])], [{"ref": 2}]),
           [z23, z23], "invalid_graph", "cannot be multiplied")
    yield ("layer_norm_shape", graph1([f23], [node("aten.native_layer_norm.default", [R0, [4], None, None, 1e-5],
                                                   [f23, spec("f32", [2, 1]), spec("f32", [2, 1])])], [R1]),
           [z23], "invalid_graph", "normalized_shape [4] does not match")
    yield ("select_range", graph1([f23], [node("aten.select.int", [R0, 1, 3], [spec("f32", [2])])], [R1]),
           [z23], "invalid_graph", "index 3 out of range")
    yield ("split_outputs", graph1([f23], [node("aten.split.Tensor", [R0, 2, 1], [spec("f32", [2, 2])])], [R1]),
           [z23], "invalid_graph", "makes 2 outputs but the node declares 1")
    yield ("conv_channels", graph1([spec("f32", [1, 2, 4, 4]), spec("f32", [3, 3, 1, 1])],
                                   [node("aten.convolution.default", [R0, R1, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1],
                                         [spec("f32", [1, 3, 4, 4])])], [{"ref": 2}]),
           [zeros_entry("f32", [1, 2, 4, 4]), zeros_entry("f32", [3, 3, 1, 1])], "invalid_graph", "do not fit groups")
    # the activations of ops_act.c with arguments torch refuses
    yield ("act_softplus_beta0", graph1([f23], [node("aten.softplus.default", [R0, 0.0, 20.0], [f23])], [R1]),
           [z23], "invalid_graph", "beta must not be 0")
    yield ("act_glu_odd", graph1([spec("f32", [3, 5])], [node("aten.glu.default", [R0, -1], [spec("f32", [3, 2])])],
                                 [R1]),
           [zeros_entry("f32", [3, 5])], "invalid_graph", "halving dim 1 must be even, not 5")
    yield ("act_threshold_no_value", graph1([f23], [node("aten.threshold.default", [R0, 0.5], [f23])], [R1]),
           [z23], "invalid_graph", "value: missing number")
    yield ("act_glu_bw_shape", graph1([f23, spec("f32", [2, 8])],
                                      [node("aten.glu_backward.default", [R0, R1, -1], [spec("f32", [2, 8])])],
                                      [{"ref": 2}]),
           [z23, zeros_entry("f32", [2, 8])], "invalid_graph", "grad_output must be self's shape halved along dim")
    yield ("act_mish_int", graph1([spec("i64", [4])], [node("aten.mish.default", [R0], [spec("i64", [4])])], [R1]),
           [zeros_entry("i64", [4])], "invalid_graph", "takes a floating tensor, not i64")
    yield ("conv3d_channels", graph1([spec("f32", [1, 4, 3, 4, 4]), spec("f32", [2, 3, 1, 1, 1])],
                                     [node("aten.convolution.default",
                                           [R0, R1, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], False, [0, 0, 0], 1],
                                           [spec("f32", [1, 2, 3, 4, 4])])], [{"ref": 2}]),
           [zeros_entry("f32", [1, 4, 3, 4, 4]), zeros_entry("f32", [2, 3, 1, 1, 1])], "invalid_graph",
           "do not fit groups")
    # a transposed convolution's weight is [C_in, C_out / groups, ..]; its
    # output_padding must be below the stride or the dilation (torch's rule)
    yield ("tconv_channels", graph1([spec("f32", [1, 2, 4, 4]), spec("f32", [3, 3, 1, 1])],
                                    [node("aten.convolution.default", [R0, R1, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1],
                                          [spec("f32", [1, 3, 4, 4])])], [{"ref": 2}]),
           [zeros_entry("f32", [1, 2, 4, 4]), zeros_entry("f32", [3, 3, 1, 1])], "invalid_graph",
           "weight's dim 0 must equal the input channels")
    yield ("tconv_output_padding", graph1([spec("f32", [1, 2, 4, 4]), spec("f32", [2, 3, 3, 3])],
                                          [node("aten.convolution.default",
                                                [R0, R1, None, [2, 2], [1, 1], [1, 1], True, [2, 0], 1],
                                                [spec("f32", [1, 3, 9, 7])])], [{"ref": 2}]),
           [zeros_entry("f32", [1, 2, 4, 4]), zeros_entry("f32", [2, 3, 3, 3])], "invalid_graph",
           "output_padding 2 must be smaller than the stride 2 or the dilation 1")
    # the same in 3-d: a weight whose dim 0 is not the input's channels; a
    # backward whose grad_output is not the transposed convolution's shape
    yield ("tconv3d_channels", graph1([spec("f32", [1, 2, 3, 4, 4]), spec("f32", [3, 3, 1, 1, 1])],
                                      [node("aten.convolution.default",
                                            [R0, R1, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], True, [0, 0, 0], 1],
                                            [spec("f32", [1, 3, 3, 4, 4])])], [{"ref": 2}]),
           [zeros_entry("f32", [1, 2, 3, 4, 4]), zeros_entry("f32", [3, 3, 1, 1, 1])], "invalid_graph",
           "weight's dim 0 must equal the input channels")
    yield ("tconv3d_bw_shape", graph1([spec("f32", [1, 3, 6, 8, 7]), spec("f32", [1, 2, 3, 4, 4]),
                                       spec("f32", [2, 3, 2, 2, 2])],
                                      [node("aten.convolution_backward.default",
                                            [R0, R1, {"ref": 2}, [3], [2, 2, 2], [0, 0, 0], [1, 1, 1], True,
                                             [0, 0, 0], 1, [True, True, True]],
                                            [spec("f32", [1, 2, 3, 4, 4]), spec("f32", [2, 3, 2, 2, 2]),
                                             spec("f32", [3])])],
                                      [{"ref": 3}, {"ref": 4}, {"ref": 5}]),
           [zeros_entry("f32", [1, 3, 6, 8, 7]), zeros_entry("f32", [1, 2, 3, 4, 4]),
            zeros_entry("f32", [2, 3, 2, 2, 2])], "invalid_graph",
           "does not have the convolution's output shape")
    yield ("gelu_approx", graph1([f23], [node("aten.gelu.default", [R0], [f23], {"approximate": "erf"})], [R1]),
           [z23], "invalid_graph", "approximate")
    yield ("embedding_range", graph1([spec("f32", [4, 2]), spec("i64", [1])],
                                     [node("aten.embedding.default", [R0, R1], [spec("f32", [1, 2])])], [{"ref": 2}]),
           [zeros_entry("f32", [4, 2]), {"dtype": "i64", "shape": [1], "data": (7).to_bytes(8, "little")}],
           "invalid_graph", "index 7 out of range for 4 rows")
    yield ("int_div_zero", graph1([spec("i64", [2])] * 2,
                                  [node("aten.div.Tensor_mode", [R0, R1], [spec("i64", [2])], {"rounding_mode": "floor"})],
                                  [{"ref": 2}]),
           [zeros_entry("i64", [2])] * 2, "invalid_graph", "integer division by zero")
    yield ("missing_arg", graph1([f23], [node("aten.transpose.int", [R0, 0], [f23])], [R1]),
           [z23], "invalid_graph", "dim1: missing int argument")
    yield ("wrong_arg_kind", graph1([f23], [node("aten.unsqueeze.default", [R0, "x"], [f23])], [R1]),
           [z23], "invalid_graph", "dim: expected an int")
    # the ops that were fallback steps, with arguments torch refuses
    i23, i3, f3, f4x = spec("i64", [2, 3]), spec("i64", [3]), spec("f32", [3]), spec("f64", [3])
    yield ("tri_rank1", graph1([f4], [node("aten.triu.default", [R0], [f4])], [R1]),
           [z4], "invalid_graph", "input must have at least 2 dims")
    yield ("fill_tensor_rank1",
           graph1([f23, f3], [node("aten.fill.Tensor", [R0, R1], [f23])], [R2]),
           [z23, zeros_entry("f32", [3])], "invalid_graph",
           "the fill value must be a number or a 0-dim tensor")
    yield ("lerp_dtype",
           graph1([f3, f4x], [node("aten.lerp.Scalar", [R0, R1, 0.5], [f3])], [R2]),
           [zeros_entry("f32", [3]), zeros_entry("f64", [3])], "invalid_graph",
           "takes floating tensors of one dtype")
    yield ("addcdiv_int",
           graph1([i3, i3, i3], [node("aten.addcdiv.default", [R0, R1, R2], [i3])], [{"ref": 3}]),
           [zeros_entry("i64", [3])] * 3, "invalid_graph",
           "addcdiv of integer tensors is not supported")
    yield ("vector_norm_int",
           graph1([i3], [node("aten.linalg_vector_norm.default", [R0], [spec("i64", [])])], [R1]),
           [zeros_entry("i64", [3])], "invalid_graph",
           "linalg_vector_norm takes floating tensors, not i64")
    yield ("slice_scatter_src_shape",
           graph1([spec("f32", [3, 4]), spec("f32", [2, 4])],
                  [node("aten.slice_scatter.default", [R0, R1, 1], [spec("f32", [3, 4])])], [R2]),
           [zeros_entry("f32", [3, 4]), zeros_entry("f32", [2, 4])], "invalid_graph",
           "src has shape [2,4], expected [3,4]")
    yield ("scatter_reduce_bad_reduce",
           graph1([f23, spec("i64", [2, 3]), f23],
                  [node("aten.scatter_reduce.two", [R0, 1, R1, R2, "max"], [f23])], [{"ref": 3}]),
           [z23, zeros_entry("i64", [2, 3]), z23], "invalid_graph",
           "reduce must be sum, prod, mean, amax or amin, not max")
    yield from fused_attention_bad_cases()


# --------------------------------------------------------------------------

def main(argv):
    build_unary()
    build_binary()
    build_select_fill()
    build_reductions()
    build_norms()
    build_views()
    build_nn()
    build_dynamic()
    only = set(argv[1:])
    os.makedirs(OPS_DIR, exist_ok=True)
    os.makedirs(BAD_DIR, exist_ok=True)
    total = 0
    failed = []
    for op, cases in sorted(CASES.items()):
        if only and op not in only:
            continue
        out = []
        for c in cases:
            try:
                entry, ops = run_case(op, c)
            except Exception as e:  # report every broken case, then fail
                failed.append(f"{op}/{c['name']}: {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            out.append(entry)
        doc = {"format": "kiln.opcases/1", "op": op, "cases": out}
        data = msgpack.packb(doc, use_bin_type=True)
        with open(os.path.join(OPS_DIR, f"{op}.cases.msgpack"), "wb") as f:
            f.write(data)
        total += len(data)
        print(f"{op}: {len(out)} cases, {len(data)} bytes")
    names = []
    for name, g, inputs, err, msg in bad_cases():
        doc = {"format": "kiln.badcase/1", "name": name, "graph": g,
               "io": {"format": "kiln.io/1", "symbols": {}, "inputs": inputs, "outputs": []},
               "error": err, "message": msg}
        if "symbols" in g:
            doc["io"]["symbols"] = {"s0": inputs[0]["shape"][0]}
        with open(os.path.join(BAD_DIR, f"{name}.msgpack"), "wb") as f:
            f.write(msgpack.packb(doc, use_bin_type=True))
        names.append(name)
    print(f"{len(CASES)} ops, {sum(len(v) for v in CASES.values())} cases, {total} bytes; "
          f"{len(names)} bad cases")
    for f in failed:
        print("FAILED", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
