"""Fits the table of polynomials that kiln's AVX-512 Φ evaluates (mathfn.c
phi_f32_avx512) and prints it as C, with the error it measures.

    .venv/bin/python compiler/fit_phi.py > /tmp/phi_tab.inc

The kernel evaluates q = Φ(-|x|) = erfc(|x|/√2)/2 and returns 1 - q for
x > 0, q otherwise. |x|, clamped to 31·H, is cut into 32 intervals of width
H centred on j·H, j = 0..31 (interval 0 is [0, H/2]). u = |x|/H in f32; j =
round(u) (to even) and s = u - j ∈ [-0.5, 0.5] (vreduceps, exact). On each
interval Φ(-H·(j + s)) is a polynomial of degree 4 in s, fitted by least
squares weighted towards minimax absolute error (Lawson's iteration), its
coefficients rounded to f32. Entry j of each 32-entry row is interval j's
coefficient (vpermt2ps indexes two registers of 16 lanes by the low 5 bits
of u + 1.5·2^23, which are j). Interval 31 (|x| > 30.5·H = 5.4805, where
Φ is within 2.1e-8 of 0 or 1) is the constant 0, so gelu(x) is -0 and x
there, as torch's f32 formula gives them beyond 5.5437.

The check evaluates the table as the kernel does (f32 products, FMAs
rounded once, Horner's order, 1 - q rounded to f32) at 9 million points of
[-XC, XC] against Φ in f64 and prints the largest error.
"""
import re
import sys

import numpy as np
import torch

H = 0.1796875  # 23/128: exact in f32
AC = 31 * H  # |x| is clamped here: u = 31, the zero interval
XC = 5.6  # the check's range: beyond the clamp
N = 32
DEG = 4


def phi(x):
    t = torch.as_tensor(np.asarray(x, np.float64))
    return (0.5 * torch.special.erfc(-t / 2**0.5)).numpy()


def fit(j):
    lo, hi = (0.0, 0.5) if j == 0 else (-0.5, 0.5)
    n = 400
    s = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (np.arange(n) + 0.5) / n)
    y = phi(-H * (j + s))
    w = np.ones(n)
    for _ in range(80):
        v = np.vander(s, DEG + 1)
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(v * sw[:, None], y * sw, rcond=None)
        e = np.abs(v @ c - y)
        w = w * e
        w /= w.sum()
    return c.astype(np.float32)


def table():
    t = np.zeros((DEG + 1, N), np.float32)
    for j in range(N - 1):  # j = 31 stays 0
        t[:, j] = fit(j)
    return t


def fma(a, b, c):
    # f32 FMA: the f64 product of two f32 is exact, one rounding to f32
    return (a.astype(np.float64) * b.astype(np.float64) + c).astype(np.float32)


def evaluate(t, x):
    a = np.minimum(np.abs(x), np.float32(AC))
    u = (a.astype(np.float64) * np.float64(np.float32(1 / H))).astype(np.float32)
    j = np.round(u.astype(np.float64))
    s = (u - j).astype(np.float32)
    c = t[:, j.astype(np.int64)]
    q = c[0]
    for k in range(1, DEG + 1):
        q = fma(q, s, c[k])
    return np.where(x > 0, (np.float32(1) - q).astype(np.float32), q)


def c_float(v):
    v = float(v)
    if v == 0:
        return "0.0f"
    m = re.match(r"(-?0x1\.)([0-9a-f]*)p([+-]\d+)", v.hex())
    return "%s%sp%sf" % (m.group(1), m.group(2).rstrip("0") or "0",
                         m.group(3).lstrip("+"))


def main():
    t = table()
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-XC, XC, 6_000_000),
                        np.linspace(-XC, XC, 3_000_001)]).astype(np.float32)
    err = np.abs(evaluate(t, x) - phi(x))
    print("max |error| %.3g at x = %.9g" % (err.max(), x[err.argmax()]),
          file=sys.stderr)
    print("/* compiler/fit_phi.py: row k holds the coefficients of s^(%d-k) */" % DEG)
    print("/* clang-format off */")
    print("static const float phi_tab[%d][%d] = {" % (DEG + 1, N))
    for k in range(DEG + 1):
        vals = [c_float(v) for v in t[k]]
        lines = [", ".join(vals[i:i + 4]) for i in range(0, N, 4)]
        print("\t{" + ",\n\t ".join(lines) + "},")
    print("};")
    print("/* clang-format on */")


if __name__ == "__main__":
    main()
