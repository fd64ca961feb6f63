"""A fresh process for test_backend_daemon.py: compiles a model with
backend="kiln" (KILN_SOCKET names the daemon), trains 2 steps, prints one
JSON line: the source and signature of each graph, and the losses.

    python _backend_child.py train mlp|kwdefaults|gpt2 [kiln|inductor]

The line also has kiln.backend.stats(), which graphs came from torch's
AOTAutograd cache (aot), Dynamo's AOTAutograd counters (aot_counters), the
graphs Dynamo traced, the KilnWarnings when KILN_CHILD_WARNINGS=1 (else
one is an error), and the kernels OpenBLAS ran (blas). KILN_CHILD_SAVE_PRECOMPILE=1: save torch's precompile
cache at the end (torch.compiler.save_cache_artifacts); KILN_CHILD_TORCH_PICKLING=1:
save Dynamo's DefaultsSource as torch 2.11 does without kiln's mend.
"""
import json
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))
sys.path.insert(0, HERE)

import kiln.backend as kb  # noqa: E402
from kiln.runtime import blas_core  # noqa: E402


def _scaled(x, *, k=0.5, shift=None):
    """Read through its keyword defaults: Dynamo guards on them (a
    DefaultsSource), as on inspect.signature's in Hugging Face BERT."""
    return x * k if shift is None else x * k + shift


class KwDefaults(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return _scaled(self.lin(x))


def model(name):
    if name == "kwdefaults":
        torch.manual_seed(0)
        return KwDefaults(), (torch.rand(2, 8, generator=torch.Generator().manual_seed(1)),)
    if name == "mlp":
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 16))
        g = torch.Generator().manual_seed(1)
        return m, (torch.rand(8, 32, generator=g),)
    import test_backend
    return test_backend.MODELS[name]()


def main():
    if os.environ.get("KILN_CHILD_TORCH_PICKLING") == "1":
        # save as torch 2.11 does without kiln's mend: every field
        import dataclasses
        from torch._dynamo import source as S
        S.DefaultsSource.__reduce__ = lambda self: (
            type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
    _, what, name, *rest = sys.argv
    backend = rest[0] if rest else "kiln"
    torch.set_num_threads(1)
    warned = []
    if os.environ.get("KILN_CHILD_WARNINGS") == "1":  # recorded, not errors
        warnings.showwarning = lambda m, c, *a, **k: warned.append(f"{c.__name__}: {m}")
        warnings.simplefilter("always", kb.KilnWarning)
    else:
        warnings.simplefilter("error", kb.KilnWarning)
    m, args = model(name)
    cm = torch.compile(m, backend=backend)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        out = cm(*args)
        loss = out if out.dim() == 0 else out.pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if os.environ.get("KILN_CHILD_SAVE_PRECOMPILE") == "1":
        torch.compiler.save_cache_artifacts()
    recs = kb.records()
    from torch._dynamo.utils import counters
    print(json.dumps({"sources": [r["source"] for r in recs],
                      "signatures": [r["signature"] for r in recs], "losses": losses,
                      "aot": [bool(r.get("aot_cache")) for r in recs], "stats": kb.stats(),
                      "aot_counters": dict(counters["aot_autograd"]),
                      "dynamo_graphs": int(counters["stats"]["unique_graphs"]),
                      "warnings": warned, "blas": blas_core()}))


if __name__ == "__main__":
    main()
