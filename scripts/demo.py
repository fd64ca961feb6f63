#!/usr/bin/env python3
"""kiln's demo (run by `./dev demo`).

What exists today: capture a real PyTorch model's forward and backward ATen
graphs through Dynamo + AOTAutograd, export them to Graph v1, and have the C
protocol library decode, validate and sign them (kilnc). Then the committed
corpus, with each graph's signature, and corpus graphs compiled to fused
kernels and run against torch's outputs. Last, kilnd (on its default store)
compiles the captured graphs, serves the repeats from memory, and after a
restart from disk.
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
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
KILNC = os.path.join(BUILD, "compiler", "kilnc")
KILND = os.path.join(BUILD, "daemon", "kilnd")


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
    demo_kilnd(captured)


def start_kilnd(sock):
    """kilnd on its default store (~/.cache/kiln, or $XDG_CACHE_HOME/kiln),
    listening on a private socket; returns once it answers hello."""
    from kiln.client import Client
    proc = subprocess.Popen([KILND, "--socket", sock, "--log-level", "warn"])
    for _ in range(200):
        try:
            with Client(sock) as c:
                return proc, c.hello()
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("demo: kilnd did not start")


def stop_kilnd(proc):
    proc.terminate()
    if proc.wait(timeout=60) != 0:
        sys.exit(f"demo: kilnd exited {proc.returncode}")


def demo_kilnd(captured):
    from kiln.client import Client
    from kiln.export import dumps
    import msgpack
    print("\n== 5. kilnd: the captured MLP graphs and a corpus graph (ResNet-18) "
          "compiled through the daemon, then served again")
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "kilnd.sock")
        proc, hello = start_kilnd(sock)
        print(f"   kilnd {hello['version']} on {sock}, fingerprint "
              f"\"{hello['fingerprint']}\"")
        sigs = []
        gdir = os.path.join(ROOT, "tests", "data", "graphs")
        with open(os.path.join(gdir, "resnet18_fwd.graph.msgpack"), "rb") as f:
            corpus = [("resnet18", msgpack.unpackb(f.read(), raw=False))]
        with Client(sock) as c:
            for kind, g in [(k, msgpack.unpackb(dumps(gr), raw=False))
                            for k, gr in captured] + corpus:
                for attempt in (1, 2):
                    t0 = time.perf_counter()
                    r = c.compile(g)
                    ms = (time.perf_counter() - t0) * 1e3
                    note = ("  (an earlier run stored it)"
                            if r["source"] == "disk" else "")
                    print(f"   {kind:8} request {attempt}: {r['source']:8} "
                          f"{ms:8.2f} ms round trip, artifact "
                          f"{len(r['artifact'])} bytes, compile "
                          f"{r['compile_ms']:.0f} ms{note}")
                sigs.append((kind, r["signature"]))
            st = c.status()["stats"]
            print(f"   status: hits {st['hits']}, compiled {st['compiled']}, "
                  f"store {st['store']['entries']} entries / "
                  f"{st['store']['bytes']} bytes")
        stop_kilnd(proc)
        print("   kilnd restarted on the same store: lookups by signature")
        proc, _ = start_kilnd(sock)
        with Client(sock) as c:
            for kind, sig in sigs:
                t0 = time.perf_counter()
                r = c.lookup(sig)
                ms = (time.perf_counter() - t0) * 1e3
                print(f"   {kind:8} lookup {sig[:16]}…: {r['source']:6} "
                      f"{ms:8.2f} ms")
        stop_kilnd(proc)


if __name__ == "__main__":
    main()
