#!/usr/bin/env python3
"""kiln's demo (run by `./dev demo`).

Starts kilnd on its embedded default store (~/.cache/kiln, or
$XDG_CACHE_HOME/kiln) on a private socket, then compiles two real models --
torchvision's ResNet-18 (inference) and a Hugging Face GPT-2 (small config,
random weights; a training step) -- three ways in one process: eager,
torch.compile's default backend (Inductor) and torch.compile(backend="kiln"),
and prints each one's compile time (the first call) and step time. kiln's
graphs go through the daemon; the line "kiln graphs" says where each came
from: "compiled" the first time, "disk" (kilnd's store) when the demo runs
again, and nothing is compiled twice.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
KILND = os.path.join(BUILD, "daemon", "kilnd")


def start_kilnd(sock):
    """kilnd on its default store, on a private socket; returns once it
    answers (through libkiln)."""
    from kiln.runtime import Client, KilnError
    proc = subprocess.Popen([KILND, "--socket", sock, "--log-level", "warn"])
    for _ in range(400):
        try:
            c = Client(sock, autostart=0)
            return proc, c
        except KilnError:
            if proc.poll() is not None:
                sys.exit(f"demo: kilnd exited {proc.returncode} at start")
            time.sleep(0.05)
    proc.kill()
    sys.exit("demo: kilnd did not start")


def resnet18():
    import torch
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(4, 3, 64, 64)

    def step(f):
        with torch.no_grad():
            return f(x)
    return "ResNet-18 (torchvision), inference, batch 4x3x64x64", m, step


def gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg)
    m.loss_type = "ForCausalLM"
    m.train()
    ids = torch.randint(0, 1024, (4, 32), generator=torch.Generator().manual_seed(1))

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids, labels=ids, use_cache=False).loss

    w = WithLoss(m)
    opt = torch.optim.SGD(w.parameters(), lr=1e-3)

    def step(f):
        opt.zero_grad(set_to_none=True)
        loss = f(ids)
        loss.backward()
        return loss
    return "GPT-2 (Hugging Face, 2 layers, d=128), training step, batch 4x32", w, step


def measure(step, f, n):
    t0 = time.perf_counter()
    step(f)  # the first call: Dynamo + AOTAutograd + the backend's compile
    first = time.perf_counter() - t0
    for _ in range(3):
        step(f)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(f)
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main():
    import torch
    import kiln
    import kiln.backend as kb
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "kilnd.sock")
        proc, client = start_kilnd(sock)
        os.environ["KILN_SOCKET"] = sock
        os.environ["KILN_AUTOSTART"] = "0"
        hello = client.call("hello")
        st = client.call("status")["stats"]["store"]
        print(f"kilnd {hello['version']} on its default store: {st['entries']} entries, "
              f"{st['bytes'] / 1e6:.1f} MB")
        print(f"  fingerprint \"{hello['fingerprint']}\"\n")
        try:
            for make in (resnet18, gpt2):
                title, model, step = make()
                print(f"== {title}")
                _, eager = measure(step, model, 20)
                torch._dynamo.reset()
                from torch._dynamo.utils import counters
                hit0 = counters["inductor"]["fxgraph_cache_hit"]
                miss0 = counters["inductor"]["fxgraph_cache_miss"]
                ind_first, ind = measure(step, torch.compile(model), 20)
                ind_hit = counters["inductor"]["fxgraph_cache_hit"] - hit0
                ind_miss = counters["inductor"]["fxgraph_cache_miss"] - miss0
                torch._dynamo.reset()
                kb.reset()
                k_first, k = measure(step, kiln.compile(model), 20)
                srcs = [r["source"] for r in kb.records()]
                kernels = sum(len(r["kernels"]) for r in kb.records())
                fallback_ops = sum(len(r["fallback_ops"]) for r in kb.records())
                print(f"   {'':10} {'first call (compile)':>22} {'step':>10}")
                print(f"   {'eager':10} {'-':>22} {eager * 1e3:8.2f} ms")
                print(f"   {'Inductor':10} {ind_first:20.2f} s {ind * 1e3:8.2f} ms")
                print(f"   {'kiln':10} {k_first:20.2f} s {k * 1e3:8.2f} ms")
                print(f"   kiln graphs: {', '.join(srcs)}  ({kernels} fused kernels, "
                      f"{fallback_ops} ops through torch)")
                print(f"   Inductor graphs: {ind_miss} compiled, {ind_hit} from its "
                      "FX-graph cache")
                r = ind_first / k_first
                than = (f"{r:.1f}x faster than" if r >= 1.05 else
                        f"{1 / r:.1f}x slower than" if r <= 1 / 1.05 else "as fast as")
                print(f"   first call: kiln {than} Inductor; "
                      f"step: kiln {k / ind:.2f}x Inductor's, {k / eager:.2f}x eager's\n")
            s = client.call("status")["stats"]
            print(f"kilnd: compiled {s['compiled']} graphs in this run; store "
                  f"{s['store']['entries']} entries. Run the demo again: kiln's graphs "
                  "come from the store (disk), nothing is compiled.")
        finally:
            client.close()
            proc.terminate()
            if proc.wait(timeout=60) != 0:
                print(f"demo: kilnd exited {proc.returncode}", file=sys.stderr)


if __name__ == "__main__":
    main()
