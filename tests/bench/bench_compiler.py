#!/usr/bin/env python3
"""kiln's compiler benchmarks with their peers, all measured in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python tests/bench/bench_compiler.py [--kernels] [--compile]

--kernels  fused kernels (add, gelu(x*w+b), softmax, layer_norm at 1-64 MB):
           kiln (build/tests/bench/bench_kernels) against a memcpy of the same
           bytes, torch eager, and torch.compile with Inductor, in GB/s; each
           point in --rounds rounds (3) of all four in turn, medians.
--compile  compile latency per corpus model: kiln (kilnc --bench: median of
           5, in-process, cold: every compile starts from nothing) against
           Inductor's cold compile of the same model (an empty
           TORCHINDUCTOR_CACHE_DIR, FX graph cache off, torch._dynamo.reset()
           before each model; one compile, it takes seconds).
Both run by default. Threads: every side uses the same count (default: the
machine's cores; --threads N).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def median_time(fn, reps=15, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_kernels(threads, mbs, rounds=3):
    """Each point (workload, size) is measured in `rounds` rounds, one after
    the other: kiln and the memcpy (bench_kernels for that point alone:
    median of 15, the two interleaved), then eager, then Inductor (median of
    15 each). Every figure is the median over the rounds, so the two sides
    of each ratio are measured seconds apart, not minutes (this host's
    speed at 16 MB, the size where input and output fill its L3, changed
    by 3x between whole runs)."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)

    def kiln_point(name, mb):
        r = subprocess.run([os.path.join(BUILD, "tests", "bench", "bench_kernels"), "--json",
                            "--threads", str(threads), "--mb", str(mb), "--workload", name],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def work(name, mb):
        n = mb << 18
        cols = 1024
        rows = n // cols
        x = torch.randn(rows, cols)
        if name == "add":
            y = torch.randn(rows, cols)
            return (lambda a, b: a + b), (x, y), 3
        if name == "gelu":
            w, b = torch.randn(cols), torch.randn(cols)
            return (lambda a, w_, b_: F.gelu(a * w_ + b_)), (x, w, b), 2
        if name == "softmax":
            return (lambda a: torch.softmax(a, -1)), (x,), 2
        w, b = torch.randn(cols), torch.randn(cols)
        return (lambda a, w_, b_: F.layer_norm(a, (cols,), w_, b_)), (x, w, b), 2

    print(f"\n== kernels ({threads} threads): GB/s (bytes a perfect kernel moves / time), "
          f"median of {rounds} rounds of kiln+memcpy, eager, Inductor in turn (each a median of 15)")
    print("   kiln: outputs reused (vs memcpy); kiln*: fresh outputs every call, as torch "
          "allocates its results (vs eager and Inductor)")
    print(f"{'workload':10} {'MB':>4} {'memcpy':>8} {'kiln':>8} {'kiln*':>8} {'eager':>8} "
          f"{'inductor':>9} {'kiln/memcpy':>12} {'kiln*/eager':>11} {'kiln*/ind':>9}")
    rows_out = []
    med = statistics.median
    for name in ("add", "gelu", "softmax", "layernorm"):
        for mb in mbs:
            fn, args, passes = work(name, mb)
            nbytes = (mb << 20) * passes
            torch._dynamo.reset()
            cf = torch.compile(fn)
            cf(*args)  # Inductor's compile, outside the rounds
            rs = []
            for _ in range(rounds):
                k = kiln_point(name, mb)
                te = median_time(lambda: fn(*args))
                ti = median_time(lambda: cf(*args))
                rs.append((k["memcpy_gbs"], k["kiln_gbs"], k["kiln_fresh_gbs"],
                           nbytes / te / 1e9, nbytes / ti / 1e9))
            gm, gk, gf, ge, gi = (med(r[i] for r in rs) for i in range(5))
            # the ratios: medians of the per-round ratios
            rk = med(r[1] / r[0] for r in rs)
            re_ = med(r[2] / r[3] for r in rs)
            ri = med(r[2] / r[4] for r in rs)
            rows_out.append((name, mb, gm, gk, gf, ge, gi))
            print(f"{name:10} {mb:4} {gm:8.1f} {gk:8.1f} {gf:8.1f} {ge:8.1f} {gi:9.1f} "
                  f"{rk:11.0%} {re_:10.2f}x {ri:8.2f}x", flush=True)
    return rows_out


def kiln_compile_ms(graph):
    r = subprocess.run([os.path.join(BUILD, "compiler", "kilnc"), graph, "--bench"],
                       capture_output=True, text=True, check=True)
    line = [l for l in r.stdout.splitlines() if l.startswith("compile:")][0]
    ms = float(line.split("median ")[1].split(" ms")[0])
    # kernels compiled: plan kernels and the epilogues their products run
    kernels = int(line.split("); ")[1].split(" kernels")[0])
    if "epilogues)" in line:
        kernels += int(line.split("(+")[1].split(" epilogues")[0])
    per_kernel = float(line.split("; ")[-1].split(" ms per kernel")[0])
    return ms, kernels, per_kernel


def inductor_cold_ms(name):
    import torch
    import capture_corpus as cc
    m, args, train, dyn = cc.MODELS[name]()
    torch._dynamo.reset()
    t0 = time.perf_counter()
    cm = torch.compile(m, dynamic=bool(dyn) or None)
    if train:
        out = cm(*args)
        (out if out.dim() == 0 else out.float().sum()).backward()
    else:
        with torch.no_grad():
            cm(*args)
    return (time.perf_counter() - t0) * 1e3


def bench_compile(threads):
    import torch
    torch.set_num_threads(threads)
    gdir = os.path.join(ROOT, "tests", "data", "graphs")
    with open(os.path.join(gdir, "index.json")) as f:
        index = json.load(f)["graphs"]
    models = []
    for e in index:
        if e["model"] not in models:
            models.append(e["model"])
    print("\n== compile latency: kiln (median of 5, cold, in-process) vs Inductor cold "
          "(empty cache)")
    print(f"{'model':20} {'graphs':>6} {'kernels':>7} {'kiln ms':>9} {'ms/kernel':>9} "
          f"{'inductor ms':>12} {'speedup':>8}")
    out = []
    for model in models:
        graphs = [e for e in index if e["model"] == model]
        tot = kern = 0
        for e in graphs:
            ms, k, _ = kiln_compile_ms(os.path.join(gdir, e["graph"]))
            tot += ms
            kern += k
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
            os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
            ind = inductor_cold_ms(model)
        out.append((model, len(graphs), kern, tot, ind))
        print(f"{model:20} {len(graphs):6} {kern:7} {tot:9.1f} {tot / max(kern, 1):9.2f} "
              f"{ind:12.0f} {ind / tot:7.1f}x")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--mb", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per kernel point, kiln and its peers in turn (default 3)")
    a = ap.parse_args()
    both = not a.kernels and not a.compile
    if a.kernels or both:
        bench_kernels(a.threads, [int(x) for x in a.mb.split(",")], max(1, a.rounds))
    if a.compile or both:
        bench_compile(a.threads)


if __name__ == "__main__":
    main()
