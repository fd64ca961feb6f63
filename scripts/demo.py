#!/usr/bin/env python3
"""kiln's demo (run by `./dev demo`).

Starts kilnd on its embedded default store (~/.cache/kiln, or
$XDG_CACHE_HOME/kiln) on a private socket, then compiles two real models --
torchvision's ResNet-18 (inference) and a Hugging Face GPT-2 (small config,
random weights; a training step) -- three ways in one process: eager,
torch.compile's default backend (Inductor) and torch.compile(backend="kiln"),
and prints each one's compile time (the first call) and step time (each on
its own copy of the model, the steps in rounds that take turns). kiln's
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


def measure(make, rounds=6, per_round=5):
    """Each way on its own copy of the model (make() builds one: same seed,
    same weights, its own optimizer): the first call of each (Dynamo,
    AOTAutograd and the backend's compile; nothing for eager), 3 warm-up
    steps each, then `rounds` rounds in which each runs `per_round` steps in
    turn, the order rotating, so that a change of the machine's load (other
    jobs on these cores) hits all three alike. Prints the model's title;
    returns per way (first call s, median step s, the way's stats)."""
    import torch
    import kiln
    import kiln.backend as kb
    from torch._dynamo.utils import counters
    ways, out = {}, {}
    for name in ("eager", "Inductor", "kiln"):
        title, model, step = make()
        stats = {}
        if name == "eager":
            print(f"== {title}", flush=True)
            f = model
        elif name == "Inductor":
            hit0 = counters["inductor"]["fxgraph_cache_hit"]
            miss0 = counters["inductor"]["fxgraph_cache_miss"]
            f = torch.compile(model)
        else:
            kb.reset()
            f = kiln.compile(model)
        t0 = time.perf_counter()
        step(f)
        first = time.perf_counter() - t0
        if name == "Inductor":
            stats = {"hit": counters["inductor"]["fxgraph_cache_hit"] - hit0,
                     "miss": counters["inductor"]["fxgraph_cache_miss"] - miss0}
        elif name == "kiln":
            stats = {"records": kb.records()}
        ways[name] = (step, f)
        out[name] = [first, [], stats]
    for step, f in ways.values():
        for _ in range(3):
            step(f)
    names = list(ways)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            step, f = ways[name]
            for _ in range(per_round):
                t0 = time.perf_counter()
                step(f)
                out[name][1].append(time.perf_counter() - t0)
    return {n: (v[0], statistics.median(v[1]), v[2]) for n, v in out.items()}


def main():
    import torch
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
                res = measure(make)
                (_, eager, _), (ind_first, ind, ist), (k_first, k, kst) = (
                    res["eager"], res["Inductor"], res["kiln"])
                recs = kst["records"]
                srcs = [r["source"] for r in recs]
                kernels = sum(len(r["kernels"]) for r in recs)
                fallback_ops = sum(len(r["fallback_ops"]) for r in recs)
                print(f"   {'':10} {'first call (compile)':>22} {'step':>10}  "
                      "(median of 30, in rounds that take turns)")
                print(f"   {'eager':10} {'-':>22} {eager * 1e3:8.2f} ms")
                print(f"   {'Inductor':10} {ind_first:20.2f} s {ind * 1e3:8.2f} ms")
                print(f"   {'kiln':10} {k_first:20.2f} s {k * 1e3:8.2f} ms")
                print(f"   kiln graphs: {', '.join(srcs)}  ({kernels} fused kernels, "
                      f"{fallback_ops} ops through torch)")
                print(f"   Inductor graphs: {ist['miss']} compiled, {ist['hit']} from its "
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
