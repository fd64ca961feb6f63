"""Fits the table of polynomials that kiln's AVX-512 Φ evaluates (mathfn.c
phi_f32_avx512) and prints it as C, with the error it measures.

    .venv/bin/python compiler/fit_phi.py > /tmp/phi_tab.inc

Φ(x) = (1 + erf(x/√2))/2 on [-XC, XC] is cut into 31 intervals of width H
centred on j·H, j = -15..15. u = x/H in f32; j = round(u) (to even) and
s = u - j ∈ [-0.5, 0.5] (vreduceps, exact). On each interval Φ(H·(j + s))
is a polynomial of degree 5 in s, fitted by least squares weighted
towards minimax absolute error (Lawson's iteration), its coefficients
rounded to f32. Entry j mod 32 of each 32-entry row is interval j's
coefficient (vpermt2ps indexes two registers of 16 lanes by the low 5
bits of u + 1.5·2^23, which are j mod 32); entry 16 is unused. The
intervals at ±15 (|x| >= 14.5·H = 5.21, where Φ is within 9.4e-8 of 0 or
1) are the constants 0 and 1, so gelu(x) is -0 and x there as beyond XC,
where torch's f32 formula gives them.

The check evaluates the table as the kernel does (f32 products, FMAs
rounded once, the same Estrin order) at 9 million points of [-XC, XC]
against Φ in f64 and prints the largest error.
"""
import re
import sys

import numpy as np
import torch

H = 0.359375  # 23/64: exact in f32
XC = float.fromhex("0x1.62cbfcp+2")  # 3.92·√2 in f32: Φ is 0 or 1 beyond
J = 15
DEG = 5


def phi(x):
    t = torch.as_tensor(np.asarray(x, np.float64))
    return (0.5 * torch.special.erfc(-t / 2**0.5)).numpy()


def fit(j):
    lo, hi = -0.5, 0.5
    n = 400
    s = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (np.arange(n) + 0.5) / n)
    y = phi(H * (j + s))
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
    t = np.zeros((DEG + 1, 32), np.float32)
    for j in range(-J + 1, J):
        t[:, j % 32] = fit(j)
    t[DEG, J % 32] = 1.0  # j = 15: Φ = 1; j = -15 stays 0
    return t


def fma(a, b, c):
    # f32 FMA: the f64 product of two f32 is exact, one rounding to f32
    return (a.astype(np.float64) * b.astype(np.float64) + c).astype(np.float32)


def evaluate(t, x):
    u = (x.astype(np.float64) * np.float64(np.float32(1 / H))).astype(np.float32)
    j = np.round(u.astype(np.float64))
    s = (u - j).astype(np.float32)
    c = t[:, j.astype(np.int64) % 32]
    s2 = (s * s).astype(np.float32)
    a = fma(c[0], s, c[1])
    b = fma(c[2], s, c[3])
    d = fma(c[4], s, c[5])
    p = fma(fma(a, s2, b), s2, d)
    return np.where(x > XC, 1.0, np.where(x < -XC, 0.0, p))


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
    print("/* compiler/fit_phi.py: row k holds the coefficients of s^(5-k) */")
    print("/* clang-format off */")
    print("static const float phi_tab[%d][32] = {" % (DEG + 1))
    for k in range(DEG + 1):
        vals = [c_float(v) for v in t[k]]
        lines = [", ".join(vals[i:i + 4]) for i in range(0, 32, 4)]
        print("\t{" + ",\n\t ".join(lines) + "},")
    print("};")
    print("/* clang-format on */")


if __name__ == "__main__":
    main()
