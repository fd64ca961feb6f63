"""kiln's test PRNG (tests/data/README.md), vectorized with numpy, bit-exact.

For element i (row-major, 0-based), with 64-bit unsigned wrap-around::

    z = seed + (i + 1) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z =  z ^ (z >> 31)

uniform: ``u = (z >> 40) * 2**-24``; ``value = lo + (hi - lo) * u`` in f64,
rounded to the dtype.  randint: ``value = lo + z % (hi - lo)``.
"""

import numpy as np

_M64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)

FLOAT_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
INT_DTYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
              "u8": np.uint8, "bool": np.bool_}


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def raw(seed, n):
    """The n 64-bit outputs z_0 .. z_{n-1} for seed, as a uint64 array."""
    seed = np.uint64(int(seed) & _M64)
    with np.errstate(over="ignore"):
        z = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN) + seed
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        z = z ^ (z >> np.uint64(31))
    return z


def uniform_f64(seed, n, lo, hi):
    """The values lo + (hi - lo) * u in f64 (before rounding to the dtype)."""
    u = (raw(seed, n) >> np.uint64(40)).astype(np.float64) * (2.0 ** -24)
    return float(lo) + (float(hi) - float(lo)) * u


def _f64_to_bf16_bits(x):
    """Round f64 to the nearest bf16 (ties to even); returns uint16 bits.

    Exact for normal bf16 values (the only ones the corpus uses)."""
    b = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    with np.errstate(over="ignore"):
        lsb = (b >> np.uint64(45)) & np.uint64(1)
        b = (b + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    f = b.view(np.float64).astype(np.float32)  # exact: fits in 8 mantissa bits
    return (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def uniform(seed, shape, lo, hi, dtype="f32"):
    """A numpy array of the given shape; bf16 comes back as uint16 bit patterns."""
    n = _numel(shape)
    v = uniform_f64(seed, n, lo, hi)
    if dtype == "bf16":
        return _f64_to_bf16_bits(v).reshape(shape)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"uniform: unsupported dtype {dtype!r}")
    return v.astype(FLOAT_DTYPES[dtype]).reshape(shape)


def randint(seed, shape, lo, hi, dtype="i64"):
    """Integers in [lo, hi) as a numpy array of the given shape."""
    lo, hi = int(lo), int(hi)
    if hi <= lo:
        raise ValueError("randint: need hi > lo")
    n = _numel(shape)
    r = raw(seed, n) % np.uint64(hi - lo)
    if lo >= 0:
        v = r + np.uint64(lo)
    else:
        v = r.astype(np.int64) + np.int64(lo)
    if dtype not in INT_DTYPES:
        raise ValueError(f"randint: unsupported dtype {dtype!r}")
    return v.astype(INT_DTYPES[dtype]).reshape(shape)


def generate(gen, dtype, shape):
    """Materialises an io-file ``gen`` entry as a numpy array."""
    kind = gen["kind"]
    if kind == "uniform":
        return uniform(gen["seed"], shape, gen["lo"], gen["hi"], dtype)
    if kind == "randint":
        return randint(gen["seed"], shape, gen["lo"], gen["hi"], dtype)
    raise ValueError(f"unknown gen kind {kind!r}")


def scalar_z(seed, i):
    """Direct scalar Python implementation of the spec (for tests)."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)
