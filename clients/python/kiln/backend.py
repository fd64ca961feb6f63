"""A torch.compile backend that compiles with kiln (in-process, no daemon).

    import torch, kiln.backend
    m = torch.compile(model, backend=kiln.backend.kiln_local)

AOTAutograd hands the forward and backward ATen graphs to ``compile_graph``,
which exports them to Graph v1, compiles them with ``kilnc`` into an
artifact, and returns a boxed callable that runs it through libkiln
(kiln.runtime). The daemon-backed backend (shared cache, single flight)
builds on the same pieces.
"""
import os
import subprocess
import tempfile

from .export import dumps, export_graph
from .runtime import KilnError, Module


def _kilnc():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    build = os.environ.get("KILN_BUILD_DIR", os.path.join(root, "build"))
    return os.environ.get("KILNC", os.path.join(build, "compiler", "kilnc"))


def compile_bytes(graph_bytes: bytes) -> bytes:
    """Graph v1 bytes → artifact bytes, with kilnc."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "a.kiln")
        r = subprocess.run([_kilnc(), "-", "--emit=artifact", "-o", out], input=graph_bytes,
                           capture_output=True)
        if r.returncode != 0:
            raise KilnError(r.stderr.decode(errors="replace").strip())
        with open(out, "rb") as f:
            return f.read()


def compile_graph(gm, example_inputs):
    graph = export_graph(gm, example_inputs)
    mod = Module(compile_bytes(dumps(graph)), graph.get("none_outputs", []))

    def run(args):
        outs = mod(*args)
        args.clear()  # boxed convention: the callee owns the argument list
        return outs

    run._boxed_call = True
    run.kiln_module = mod
    return run


def _make():
    from torch._dynamo.backends.common import aot_autograd
    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph)


def kiln_local(gm, example_inputs):
    return _make()(gm, example_inputs)
