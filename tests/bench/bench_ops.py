#!/usr/bin/env python3
"""Operator-coverage benchmarks: kiln's artifacts against torch, same run.

    HF_HUB_OFFLINE=1 .venv/bin/python tests/bench/bench_ops.py [--gemm] [--conv] [--models]

--gemm    GEMM GFLOP/s at 256..2048 square and at transformer shapes, against
          torch.mm (torch's BLAS)
--conv    resnet18's convolution layers at batch 1 and 16, against torch
          eager (oneDNN)
--models  whole-model inference time: the corpus graphs run by kiln's
          runtime against torch eager and Inductor on the same model

kiln figures come from `kilnc GRAPH --run IO --bench` (median of 21 runs of
the loaded artifact, outputs checked against torch first); torch figures
are medians of 21 calls in this process. Same thread count on both sides.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
KILNC = os.path.join(BUILD, "compiler", "kilnc")
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tmed(fn, reps=21, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# 0.5 s was not always enough: a run on 2026-11-30 had 512^3 and
# 512x768x768 at half speed again (120, 124 GFLOP/s; 218, 244 with 1 s)
QUIET_S = 1.0


def spec(shape):
    return {"dtype": "f32", "shape": list(shape)}


def tensor(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    return {"dtype": "f32", "shape": list(a.shape), "data": a.tobytes()}


def kilnc_bench_ms(g, io):
    """kilnc G --run IO --bench: the run's median in ms."""
    r = subprocess.run([KILNC, g, "--run", io, "--bench"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stdout + r.stderr)
    line = [l for l in r.stdout.splitlines() if l.startswith("run:")][0]
    return float(line.split("median ")[1].split(" ms")[0])


def kiln_run_ms(graph, inputs, outputs):
    """Writes the graph and io files, runs kilnc --run --bench.

    First it waits QUIET_S: torch's OpenMP threads spin for a while after
    the peer's last call in this process, and a kilnc started at once
    shares the 2 cores with them (measured: 512^3 and 512x768x768 GEMMs at
    half speed, exactly the shapes timed right after a torch.mm)."""
    time.sleep(QUIET_S)
    with tempfile.TemporaryDirectory() as d:
        g = os.path.join(d, "g.graph.msgpack")
        io = os.path.join(d, "g.io.msgpack")
        with open(g, "wb") as f:
            f.write(msgpack.packb(graph, use_bin_type=True))
        with open(io, "wb") as f:
            f.write(msgpack.packb({"format": "kiln.io/1",
                                   "inputs": [tensor(x) for x in inputs],
                                   "outputs": [tensor(y) for y in outputs],
                                   "rtol": 1e-3, "atol": 1e-3}, use_bin_type=True))
        return kilnc_bench_ms(g, io)


def bench_gemm(torch):
    print("\n== GEMM: GFLOP/s (kiln: the GEMM template or BLAS, by the recorded heuristic, on kiln's pool)")
    print(f"{'shape (MxKxN)':>22} {'kiln':>8} {'torch.mm':>9} {'ratio':>6}")
    shapes = [(n, n, n) for n in (256, 512, 1024, 2048)]
    shapes += [(512, 768, 768), (512, 768, 3072), (512, 3072, 768), (2048, 64, 64)]
    for m, k, n in shapes:
        a = torch.randn(m, k)
        b = torch.randn(k, n)
        graph = {"format": "kiln.graph/1", "inputs": [spec((m, k)), spec((k, n))],
                 "nodes": [{"op": "aten.mm.default", "args": [{"ref": 0}, {"ref": 1}],
                            "out": [spec((m, n))]}],
                 "outputs": [{"ref": 2}]}
        ms = kiln_run_ms(graph, [a.numpy(), b.numpy()], [(a @ b).numpy()])
        tt = tmed(lambda: a @ b)
        fl = 2.0 * m * n * k
        gk, gt = fl / ms / 1e6, fl / tt / 1e9
        print(f"{f'{m}x{k}x{n}':>22} {gk:8.1f} {gt:9.1f} {gk / gt:6.2f}")


RESNET18_CONVS = [  # (C, O, K, stride, pad, H) at a 224 input
    (3, 64, 7, 2, 3, 224), (64, 64, 3, 1, 1, 56), (64, 128, 3, 2, 1, 56),
    (128, 128, 3, 1, 1, 28), (128, 256, 3, 2, 1, 28), (256, 256, 3, 1, 1, 14),
    (256, 512, 3, 2, 1, 14), (512, 512, 3, 1, 1, 7), (64, 128, 1, 2, 0, 56)]


def bench_conv(torch):
    import torch.nn.functional as F
    print("\n== resnet18 convolutions (224 input): ms per call")
    print(f"{'layer':>24} {'batch':>5} {'kiln':>9} {'eager':>9} {'eager/kiln':>10}")
    for bsz in (1, 16):
        for (c, o, k, s, p, h) in RESNET18_CONVS:
            x = torch.randn(bsz, c, h, h)
            w = torch.randn(o, c, k, k) * 0.1
            y = F.conv2d(x, w, stride=s, padding=p)
            graph = {"format": "kiln.graph/1",
                     "inputs": [spec(x.shape), spec(w.shape)],
                     "nodes": [{"op": "aten.convolution.default",
                                "args": [{"ref": 0}, {"ref": 1}, None, [s, s], [p, p], [1, 1],
                                         False, [0, 0], 1],
                                "out": [spec(y.shape)]}],
                     "outputs": [{"ref": 2}]}
            ms = kiln_run_ms(graph, [x.numpy(), w.numpy()], [y.numpy()])
            te = tmed(lambda: F.conv2d(x, w, stride=s, padding=p), reps=11) * 1e3
            name = f"{c}->{o} k{k} s{s} @{h}"
            print(f"{name:>24} {bsz:5} {ms:9.3f} {te:9.3f} {te / ms:10.2f}")


def model_row(torch, name, ms, m, args, reps=21):
    """Times m(*args) eagerly and through Inductor, prints kiln's ms beside."""
    with torch.no_grad():
        te = tmed(lambda: m(*args), reps=reps) * 1e3
        torch._dynamo.reset()
        cm = torch.compile(m)
        ti = tmed(lambda: cm(*args), reps=reps) * 1e3
    print(f"{name:>20} {ms:9.3f} {te:9.3f} {ti:9.3f} {ms / te:10.2f} {ms / ti:9.2f}")


def bench_models(torch):
    import json
    import capture_corpus as cc
    gdir = os.path.join(ROOT, "tests", "data", "graphs")
    print("\n== whole-model inference (forward graphs of the corpus): ms per call")
    print(f"{'model':>20} {'kiln':>9} {'eager':>9} {'inductor':>9} {'kiln/eager':>10} "
          f"{'kiln/ind':>9}")
    for name in ("resnet18", "transformer_layer", "mlp", "gpt2", "bert", "vit"):
        g = os.path.join(gdir, f"{name}_fwd.graph.msgpack")
        io = os.path.join(gdir, f"{name}_fwd.io.msgpack")
        ms = kilnc_bench_ms(g, io)
        m, args, train, _ = cc.MODELS[name]()
        m.eval()
        model_row(torch, name, ms, m, args)
    # the corpus resnet18 is batch 1 at 64x64; training-size inputs too:
    # batch 16 at 224x224, captured here (not stored: 150 KB of io)
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None).eval()
    x = cc._prng_input(3, (16, 3, 224, 224))
    cap = cc.capture(m, (x,), False)
    with tempfile.TemporaryDirectory() as d:
        cc.export_capture("r18b16", cap, out_dir=d)
        time.sleep(QUIET_S)
        ms = kilnc_bench_ms(os.path.join(d, "r18b16_fwd.graph.msgpack"),
                            os.path.join(d, "r18b16_fwd.io.msgpack"))
    model_row(torch, "resnet18 b16 224^2", ms, m, (x,), reps=7)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--conv", action="store_true")
    ap.add_argument("--models", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    os.environ["KILN_THREADS"] = str(a.threads)
    every = not (a.gemm or a.conv or a.models)
    if a.gemm or every:
        bench_gemm(torch)
    if a.conv or every:
        bench_conv(torch)
    if a.models or every:
        bench_models(torch)


if __name__ == "__main__":
    main()
