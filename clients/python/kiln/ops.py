"""kiln's own torch operator: ``torch.ops.kiln.dropout``.

AOTAutograd traces ``nn.Dropout`` in training as ``aten.native_dropout``,
which draws from torch's global generator inside the op.  kiln compiles
dropout with a counter-based generator instead (compiler/rng.h): the bits of
element ``i`` are a pure function of ``(seed, stream, i)``, so a kernel draws
any element on any thread, and the seed is an ordinary graph input.  The
backend rewrites each training ``native_dropout`` of a forward graph into

    kiln.dropout(Tensor input, float p, Tensor seed, int stream) -> (Tensor, Tensor)

with one extra i64 scalar input ``seed`` that it draws from torch's default
generator on every call (so ``torch.manual_seed`` makes runs reproducible)
and ``stream`` numbering the graph's dropouts.  The outputs are those of
``native_dropout``: ``input * mask * 1/(1-p)`` (0 for p = 1) and the bool
mask of kept elements, which the backward's ``native_dropout_backward``
uses unchanged.

The CPU implementation here is the reference (numpy bits, the same masks as
the C interpreter and the compiled kernels, and the same f32 arithmetic for
the output; tests/data/ops/kiln_dropout.cases);
it also runs a fallback step of an older kilnd that does not lower the op.
"""

import math

import numpy as np
import torch

__all__ = ["dropout_bits", "keep_from"]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_STREAM = 0xD1B54A32D192ED03
BITS = 24


def keep_from(p):
    """The smallest 24-bit draw that keeps an element: ceil(p * 2**24)."""
    return math.ceil(float(p) * float(1 << BITS))


def dropout_bits(seed, stream, n):
    """The 24-bit draws of elements 0..n-1 (numpy int64)."""
    base = np.uint64((int(seed) + int(stream) * _STREAM) & _M64)
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = base + i * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(64 - BITS)).astype(np.int64)


def _check(input, p, seed, stream):
    if not input.is_floating_point():
        raise RuntimeError("kiln.dropout: input must be floating")
    if not 0.0 <= p <= 1.0:
        raise RuntimeError(f"kiln.dropout: p must be in [0, 1], not {p}")
    if seed.dtype != torch.int64 or seed.dim() != 0:
        raise RuntimeError("kiln.dropout: seed must be an int64 scalar tensor")
    if stream < 0:
        raise RuntimeError("kiln.dropout: stream must be >= 0")


def _dropout_cpu(input, p, seed, stream):
    _check(input, p, seed, stream)
    # the seed's bits as unsigned: the C side reads the i64 as uint64
    u = dropout_bits(int(seed.item()) & _M64, stream, input.numel())
    keep = torch.from_numpy(u >= keep_from(p)).reshape(input.shape)
    # the outputs take the input's layout, as native_dropout's do
    mask = torch.empty_like(input, dtype=torch.bool).copy_(keep)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return input * mask * scale, mask


def _dropout_meta(input, p, seed, stream):
    _check(input, p, seed, stream)
    return torch.empty_like(input), torch.empty_like(input, dtype=torch.bool)


def _register():
    if hasattr(torch.ops, "kiln") and hasattr(torch.ops.kiln, "dropout"):
        return None
    lib = torch.library.Library("kiln", "DEF")
    lib.define("dropout(Tensor input, float p, Tensor seed, int stream) -> (Tensor, Tensor)")
    lib.impl("dropout", _dropout_cpu, "CPU")
    lib.impl("dropout", _dropout_meta, "Meta")
    return lib


_LIB = _register()  # kept alive: the registration lasts as long as it does
