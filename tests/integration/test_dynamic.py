"""Automatic dynamic shapes in kilnd (daemon/dynamic.c).

A model captured statically at several batch sizes gives graphs of one
structure. The first size compiles as it is; the second compiles a
generalized graph (the batch a symbol); later sizes are served from it
without compiling. The generalized artifact must compute what torch does at
every size it serves. dynamic=False never generalizes; a size that varies
between 1 and more is not generalized (broadcasting depends on it).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import msgpack
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, ROOT)  # tests.integration.pyclient
KILND = os.environ.get("KILND", os.path.join(ROOT, "build", "daemon", "kilnd"))

torch = pytest.importorskip("torch")


@pytest.fixture
def dyn_kilnd():
    from tests.integration.pyclient import Client
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "k.sock")
        proc = subprocess.Popen([KILND, "--socket", sock, "--store-dir",
                                 os.path.join(d, "store"), "--log-level", "warn"])
        for _ in range(200):
            try:
                Client(sock).close()
                break
            except OSError:
                time.sleep(0.05)
        yield sock
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def capture(batch, seed=0, cnn=False):
    """The forward graph of a small MLP (or CNN) at one batch size, with the
    inputs (parameters and the batch) it was captured with and torch's
    outputs."""
    from torch._dynamo.backends.common import aot_autograd
    from kiln.export import dumps, export_graph
    torch._dynamo.reset()
    got, real = [], []

    def fw(gm, example_inputs):
        got.append(export_graph(gm, example_inputs))

        def run(*args):  # records the real inputs of the first call
            real.append([a.detach() if isinstance(a, torch.Tensor) else a
                         for a in args])
            return gm(*args)
        return run

    torch.manual_seed(seed)
    nn = torch.nn
    if cnn:
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                          nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
        x = torch.randn(batch, 3, 10, 10)
    else:
        m = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.LayerNorm(48), nn.Linear(48, 8))
        x = torch.randn(batch, 32)
    cm = torch.compile(m, backend=aot_autograd(fw_compiler=fw), dynamic=False,
                       fullgraph=True)
    with torch.no_grad():
        want = cm(x)
    graph, inputs = got[0], real[0]
    return msgpack.unpackb(dumps(graph), raw=False), inputs, want


def run_artifact(artifact, inputs):
    from kiln.runtime import Module
    outs = Module(artifact)(*inputs)
    return outs if isinstance(outs, (list, tuple)) else [outs]


def check_outputs(got, want):
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_second_size_generalizes_and_serves_later_sizes(dyn_kilnd):
    from tests.integration.pyclient import Client
    with Client(dyn_kilnd) as c:
        g8, in8, want8 = capture(8)
        r8 = c.compile(g8)
        assert r8["source"] == "compiled"
        check_outputs(run_artifact(r8["artifact"], in8), want8)

        g16, in16, want16 = capture(16)
        r16 = c.compile(g16)
        assert r16["source"] == "compiled"
        assert r16["signature"] != r8["signature"]
        check_outputs(run_artifact(r16["artifact"], in16), want16)
        st = c.status()["stats"]["dynamic"]
        assert st["compiles"] == 1

        # Later sizes: no compile, the generalized artifact, right numbers.
        for b in (24, 5, 64):
            g, inputs, want = capture(b)
            r = c.compile(g)
            assert r["source"] == "memory", b
            assert r["signature"] == r16["signature"]
            check_outputs(run_artifact(r["artifact"], inputs), want)
        st = c.status()["stats"]
        assert st["dynamic"]["hits"] == 3
        assert st["compiled"] == 2


def test_a_generalization_that_costs_kernels_is_refused(dyn_kilnd):
    """kiln lowers a convolution at static sizes only: the CNN's graph
    generalized in the batch would run both convolutions in torch. kilnd
    refuses it (not stored), answers with the static graph's artifact, and
    compiles every later batch as it is."""
    from tests.integration.pyclient import Client
    with Client(dyn_kilnd) as c:
        for k, b in enumerate((8, 16, 24)):
            g, inputs, want = capture(b, cnn=True)
            r = c.compile(g)
            assert r["source"] == "compiled", b
            a = msgpack.unpackb(r["artifact"], raw=False)
            assert not a.get("symbols"), b
            assert [s for s in a["steps"] if s["kind"] == "fallback"] == [], b
            check_outputs(run_artifact(r["artifact"], inputs), want)
        st = c.status()["stats"]
        assert st["dynamic"]["compiles"] == 0
        assert st["dynamic"]["refused"] == 1
        assert st["compiled"] == 4  # three static graphs and the refused one
        sigs = {e["signature"] for e in c.call("list", limit=10)["entries"]}
        assert len(sigs) == 3


def test_dynamic_false_never_generalizes(dyn_kilnd):
    from tests.integration.pyclient import Client
    with Client(dyn_kilnd) as c:
        for b in (8, 16, 24):
            g, _, _ = capture(b)
            r = c.compile(g, options={"dynamic": False})
            assert r["source"] == "compiled"
        st = c.status()["stats"]
        assert st["compiled"] == 3
        assert st["dynamic"]["compiles"] == 0


def test_size_one_is_not_generalized(dyn_kilnd):
    from tests.integration.pyclient import Client
    with Client(dyn_kilnd) as c:
        g1, in1, want1 = capture(1)
        assert c.compile(g1)["source"] == "compiled"
        g4, in4, want4 = capture(4)
        r4 = c.compile(g4)
        assert r4["source"] == "compiled"
        check_outputs(run_artifact(r4["artifact"], in4), want4)
        st = c.status()["stats"]["dynamic"]
        assert st["compiles"] == 0
        assert st["refused"] == 1


def test_generalized_version_survives_a_restart_on_disk(dyn_kilnd):
    """The generalized artifact is stored like any other: after the hot map
    is cleared (evict all would drop the store too, so use a fresh client
    and rely on the store lookup path), a later size is still served."""
    from tests.integration.pyclient import Client
    with Client(dyn_kilnd) as c:
        c.compile(capture(8)[0])
        r16 = c.compile(capture(16)[0])
        lst = c.call("list", limit=10)["entries"]
        assert r16["signature"] in {e["signature"] for e in lst}
