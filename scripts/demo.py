#!/usr/bin/env python3
"""kiln's demo (run by `./dev demo`).

What exists today: capture a real PyTorch model's forward and backward ATen
graphs through Dynamo + AOTAutograd, export them to Graph v1, and have the C
protocol library decode, validate and sign them (kilnc). Then the committed
corpus, with each graph's signature, and corpus graphs compiled to fused
kernels and run against torch's outputs. Later issues grow this into the full
demo: kilnd compiling the model, and the cache hit on a second run.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
KILNC = os.path.join(os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build")),
                     "compiler", "kilnc")


def kilnc(*args):
    r = subprocess.run([KILNC, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"demo: kilnc {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def main():
    import torch
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from kiln.export import export_graph, dumps

    print("== 1. Capture a real model (MLP: Linear/GELU/LayerNorm), forward and backward")
    captured = []

    def compiler(kind):
        def comp(gm, example_inputs):
            captured.append((kind, export_graph(gm, example_inputs)))
            return gm.forward if hasattr(gm, "forward") else gm
        return comp

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.LayerNorm(128), torch.nn.Linear(128, 10))
    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))
    cm = torch.compile(model, backend=backend, fullgraph=True)
    t0 = time.perf_counter()
    cm(torch.randn(32, 64)).sum().backward()
    print(f"   captured {len(captured)} graphs in {time.perf_counter() - t0:.2f} s")

    with tempfile.TemporaryDirectory() as d:
        for kind, graph in captured:
            path = os.path.join(d, f"mlp_{kind}.graph.msgpack")
            with open(path, "wb") as f:
                f.write(dumps(graph))
            print(f"\n== 2. {kind} graph ({os.path.getsize(path)} bytes of Graph v1): "
                  "decoded, validated and signed by the C library")
            for line in kilnc(path).splitlines():
                print("   " + line)

    print("\n== 3. The committed corpus (tests/data/graphs): real captured graphs")
    gdir = os.path.join(ROOT, "tests", "data", "graphs")
    with open(os.path.join(gdir, "index.json")) as f:
        index = json.load(f)["graphs"]
    print(f"   {'graph':24} {'nodes':>5} {'ops':>4} {'bytes':>7}  signature")
    for e in index:
        path = os.path.join(gdir, e["graph"])
        sig = kilnc(path, "--signature").strip()
        dyn = "  (dynamic: " + ", ".join(e["symbols"]) + ")" if e["dynamic"] else ""
        print(f"   {e['name']:24} {e['nodes']:5} {len(e['ops']):4} "
              f"{os.path.getsize(path):7}  {sig[:16]}…{dyn}")
    print("\n== 4. Compile corpus graphs to fused CPU kernels and run them against "
          "torch's outputs")
    for name in ("transformer_layer_fwd", "gpt2_fwd", "mlp_bwd"):
        g = os.path.join(gdir, name + ".graph.msgpack")
        io = os.path.join(gdir, name + ".io.msgpack")
        rep = kilnc(g, "--emit=kernels").splitlines()
        run = kilnc(g, "--run", io, "--bench").splitlines()
        comp = [l for l in run if l.startswith("compile:")][0]
        ok = sum(1 for l in run if l.startswith("output") and " ok" in l)
        n = sum(1 for l in run if l.startswith("output"))
        print(f"   {name}: {rep[0]}")
        print(f"      {comp}")
        print(f"      {ok} of {n} outputs match torch; "
              + [l for l in run if l.startswith("run:")][0])
    print("\nNext: kilnd compiles these graphs and serves repeats from its store "
          "(see README.md, Status).")


if __name__ == "__main__":
    main()
