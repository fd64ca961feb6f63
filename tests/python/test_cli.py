"""python -m kiln (status, warm, explain) and kiln.explain, against real kilnds.

The commands run as subprocesses of the venv's python (KILN_SOCKET pointing
at a test kilnd, KILN_AUTOSTART=0, HF_HUB_OFFLINE=1, cwd the checkout);
a few paths (kilnctl missing, SystemExit) are driven in-process through
kiln.__main__.main. Models: the corpus' mlp and cnn (small, fast).
"""
import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TRAIN_SCRIPT = """\
import sys
import torch
sys.path.insert(0, {data!r})
import capture_corpus as cc

model, args, train, _ = cc.MODELS["mlp"]()
compiled = torch.compile(model)          # the default backend: warm routes it to kiln
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = compiled(*args).float().pow(2).mean()
loss.backward()
opt.step()
print("loss", round(loss.item(), 4), "argv", sys.argv[1:])
"""

RAISING_SCRIPT = """\
def helper():
    raise ValueError("the script failed on purpose")

helper()
"""


def _env(socket):
    env = dict(os.environ)
    env.update(KILN_SOCKET=socket, KILN_AUTOSTART="0", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    py = os.path.join(ROOT, "clients", "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def kiln_cli(socket, *args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "kiln", *args], cwd=ROOT,
                          env=dict(_env(socket), **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


def _script(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text.format(data=os.path.join(ROOT, "tests", "data")))
    return str(p)


def _no_socket(tmp_path):
    return str(tmp_path / "nobody-home.sock")


# ---- status ---------------------------------------------------------------------


def test_status_prints_the_daemons_status(kiln_daemon):
    r = kiln_cli(kiln_daemon.socket_path, "status")
    assert r.returncode == 0, r.stderr
    assert kiln_daemon.socket_path in r.stdout
    assert "kilnd" in r.stdout and "compiled" in r.stdout
    r = kiln_cli(kiln_daemon.socket_path, "status", "--json")
    assert r.returncode == 0, r.stderr
    assert "compiled" in json.loads(r.stdout)["stats"]


def test_status_without_kilnctl_asks_kilnd(kiln_daemon, monkeypatch, capsys):
    import kiln.__main__ as cli
    monkeypatch.setattr(cli, "find_kilnctl", lambda: None)
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert kiln_daemon.socket_path in out
    assert re.search(r"^  compiled\s+\d+$", out, re.M), out
    assert cli.main(["status", "--json"]) == 0
    assert "compiled" in json.loads(capsys.readouterr().out)["stats"]


def test_status_without_a_daemon_fails_in_one_line(tmp_path, monkeypatch, capsys):
    r = kiln_cli(_no_socket(tmp_path), "status")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "not" in r.stderr, r.stderr
    # the same without kilnctl
    import kiln.__main__ as cli
    monkeypatch.setattr(cli, "find_kilnctl", lambda: None)
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    assert cli.main(["--socket", _no_socket(tmp_path), "status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: kilnd is not reachable") and len(err.splitlines()) == 1, err


# ---- warm -----------------------------------------------------------------------


def test_warm_compiles_then_everything_is_cached(daemons, tmp_path):
    d = daemons.start("warm")
    script = _script(tmp_path, "train.py", TRAIN_SCRIPT)
    before = d.stats()["compiled"]

    r = kiln_cli(d.socket_path, "warm", script, "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert "argv ['--lr', '0.1']" in r.stdout
    assert 'routed to backend="kiln"' in r.stderr
    assert re.search(r"2 graphs in [\d.]+ s: 2 compiled by kilnd, 0 already cached, "
                     r"0 fallbacks", r.stderr), r.stderr
    assert "graph 2 (backward" in r.stderr  # a progress line per graph (not a tty)
    compiled = d.stats()["compiled"]
    assert compiled - before == 2

    r = kiln_cli(d.socket_path, "warm", script)
    assert r.returncode == 0, r.stderr
    assert re.search(r"2 graphs in [\d.]+ s: 0 compiled by kilnd, 2 already cached "
                     r"\(memory 2\), 0 fallbacks", r.stderr), r.stderr
    assert d.stats()["compiled"] == compiled

    # explain SCRIPT: the same graphs, all cache hits
    r = kiln_cli(d.socket_path, "explain", script)
    assert r.returncode == 0, r.stderr
    assert "graph 1: forward" in r.stdout and "graph 2: backward" in r.stdout
    assert "cache: 2 hits (memory 2), 0 misses" in r.stdout
    assert d.stats()["compiled"] == compiled


def test_warm_fills_torchs_caches_for_the_jobs_after_it(daemons, tmp_path):
    d = daemons.start("warmpre")
    script = _script(tmp_path, "train.py", TRAIN_SCRIPT)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch"), "TORCH_CACHING_PRECOMPILE": "1"}
    r = kiln_cli(d.socket_path, "warm", script, env=env)
    assert r.returncode == 0, r.stderr
    assert "2 compiled by kilnd" in r.stderr
    assert "kiln warm: saved torch's precompile cache (TORCH_CACHING_PRECOMPILE=1)" in r.stderr
    assert (tmp_path / "torch" / "dynamo").is_dir() and (tmp_path / "torch" / "aotautograd").is_dir()
    # the next run loads both graphs at torch.compile(): they are observed
    # (from kilnd's memory), and kilnd compiles nothing
    compiled = d.stats()["compiled"]
    r = kiln_cli(d.socket_path, "warm", script, env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"2 graphs in [\d.]+ s: 0 compiled by kilnd, 2 already cached "
                     r"\(memory 2\), 0 fallbacks", r.stderr), r.stderr
    assert d.stats()["compiled"] == compiled


def test_warm_script_that_raises(kiln_daemon, tmp_path):
    script = _script(tmp_path, "bad.py", RAISING_SCRIPT)
    r = kiln_cli(kiln_daemon.socket_path, "warm", script)
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr
    assert "ValueError: the script failed on purpose" in r.stderr
    assert 'in helper' in r.stderr and "runpy" not in r.stderr
    assert "kiln warm: the script gave kiln no graph" in r.stderr


def test_warm_passes_system_exit_through(kiln_daemon, tmp_path):
    import kiln.__main__ as cli
    script = _script(tmp_path, "exit.py", "import sys\nsys.exit(sys.argv[1])\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["warm", script, "7"])
    assert e.value.code == "7"
    script = _script(tmp_path, "exit3.py", "raise SystemExit(3)\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["warm", script])
    assert e.value.code == 3


def test_warm_without_a_daemon(tmp_path, monkeypatch, capsys):
    import kiln.__main__ as cli
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    script = _script(tmp_path, "never.py", "raise AssertionError('must not run')\n")
    assert cli.main(["--socket", _no_socket(tmp_path), "warm", script]) == 1
    err = capsys.readouterr().err
    assert "kilnd is not available" in err and "must not run" not in err


# ---- explain --------------------------------------------------------------------


def test_explain_model_prints_graphs_kernels_and_time(kiln_daemon):
    r = kiln_cli(kiln_daemon.socket_path, "explain", "--model", "mlp", "--steps", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "graph 1: forward" in out and "graph 2: backward" in out
    assert re.search(r"kernels \(\d+\): kiln_k0 \w+", out), out
    assert "cache:" in out and "graph breaks: none" in out
    for row in ("time (ms):", "first call", "Dynamo + AOTAutograd tracing", "kilnd round trips",
                "first run", "steady step (median of 2)", "kiln's plan steps in a steady step"):
        assert row in out, out
    # the costliest plan steps: ms, graph, kind, step, kernel and its op
    assert re.search(r"\n +\d+\.\d{3}  graph [12] \((forward|backward)\) step \d+: kiln_k\d+",
                     out), out
    # mlp's products are BLAS's: which kernels OpenBLAS ran
    from kiln.runtime import lib
    want = lib().kiln_blas_coretype()
    if want is not None and not os.environ.get("OPENBLAS_CORETYPE"):
        assert f"blas: OpenBLAS with its {want.decode()} kernels" in out, out
    else:
        assert "blas: OpenBLAS with its " in out, out
    # kiln's kernels ran on torch's OpenMP team (libgomp, which torch loads)
    assert "threads: kernels run on the OpenMP team torch's ops use" in out, out


def test_kernels_run_on_torchs_openmp_team_unless_told_otherwise(tmp_path):
    """In a torch process the default pool is torch's OpenMP team, sized by
    torch.set_num_threads (KILN_THREADS when set); KILN_POOL=own keeps
    kiln's own threads. A model run through kiln matches eager either way."""
    code = ("import sys, torch; sys.path.insert(0, {data!r}); torch.set_num_threads(2)\n"
            "import kiln.runtime as r, capture_corpus as cc\n"
            "print(r.pool())\n")
    script = _script(tmp_path, "pool.py", code)
    for extra, want in (({}, "('openmp', 2)"), ({"KILN_THREADS": "3"}, "('openmp', 3)"),
                        ({"KILN_POOL": "own", "KILN_THREADS": "2"}, "('kiln', 2)")):
        env = {k: v for k, v in os.environ.items() if k not in ("KILN_THREADS", "KILN_POOL")}
        env.update(extra)
        r = subprocess.run([sys.executable, script], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == want, (extra, r.stdout, r.stderr)


def test_explain_in_process_sources_and_cache_hits(kiln_daemon):
    import capture_corpus as cc
    import kiln
    from kiln._explain import HIT_SOURCES, MISS_SOURCES, Report

    model, args, train, _ = cc.MODELS["cnn"]()
    assert train
    r = kiln.explain(model, *args, train=True, steps=2)
    assert isinstance(r, Report)
    assert [g["kind"] for g in r.graphs] == ["forward", "backward"]
    for g in r.graphs:
        assert g["source"] in MISS_SOURCES + HIT_SOURCES and not g["fallback"], g
        assert g["kernels"] and len(g["kernel_ops"]) == len(g["kernels"])
        assert g["signature"] and g["nodes"] > 0
    assert r.totals["graphs"] == 2 and r.totals["fallbacks"] == 0
    assert r.totals["hits"] + r.totals["misses"] == 2
    assert r.times["total"] > 0 and r.times["step"] > 0 and "tracing" in r.times
    assert "graph 2: backward" in str(r)
    # every plan step of both graphs, timed over the 2 steady steps
    prof = r.profile
    assert {p["graph"] for p in prof} == {1, 2}
    assert len(prof) == sum(len(g["kernels"]) for g in r.graphs) + sum(
        len(g["fallback_ops"]) for g in r.graphs)
    assert [p["ms"] for p in prof] == sorted((p["ms"] for p in prof), reverse=True)
    assert all(p["ms"] >= 0 and p["calls"] == 1 for p in prof), prof
    for p in prof:
        g = r.graphs[p["graph"] - 1]
        assert p["kind"] == g["kind"]
        assert p["kernel"] is None or p["kernel"] in g["kernels"], p
    assert sum(p["ms"] for p in prof) <= r.times["step"] * 1.5
    assert "kiln's plan steps in a steady step" in str(r)

    # the same model again: this process' cache serves both graphs
    again = kiln.explain(model, *args, train=True, steps=1)
    assert [g["source"] for g in again.graphs] == ["process", "process"]
    assert again.totals["hits"] == 2 and again.totals["misses"] == 0
    assert [g["signature"] for g in again.graphs] == [g["signature"] for g in r.graphs]

    m2, a2, _, _ = cc.MODELS["mlp"]()
    inf = kiln.explain(m2, *a2)
    assert [g["kind"] for g in inf.graphs] == ["inference"]


def test_explain_leaves_grads_and_buffers_alone(kiln_daemon):
    import capture_corpus as cc
    import kiln
    model, args, _, _ = cc.MODELS["cnn"]()
    bufs = [b.clone() for b in model.buffers()]
    kiln.explain(model, *args, train=True, steps=1)
    assert all(p.grad is None for p in model.parameters())
    for b, want in zip(model.buffers(), bufs):
        assert torch.equal(b, want)


class _FFT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.fft.rfft(self.lin(x)).abs()


def test_explain_reports_fallbacks_and_why(kiln_daemon, daemons, tmp_path, monkeypatch):
    import kiln
    monkeypatch.setenv("KILN_FALLBACK", "eager")  # no Inductor compile: fast
    x = torch.randn(4, 8)
    r = kiln.explain(_FFT(), x, steps=1)
    (g,) = r.graphs
    assert g["fallback"] and g["source"] == "fallback" and g["runs_with"] == "eager"
    assert "Graph v1" in g["why"] and r.totals["fallbacks"] == 1
    assert "why:" in str(r)

    # kilnd not there: the Dynamo graph falls back before AOTAutograd
    monkeypatch.setenv("KILN_SOCKET", _no_socket(tmp_path))
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    r = kiln.explain(torch.nn.Linear(8, 8), x, steps=1)
    (g,) = r.graphs
    assert g["kind"] == "dynamo" and g["fallback"] and "kilnd is not available" in g["why"]


# ---- tests/bench/bench_models.py's arguments --------------------------------------


@pytest.mark.parametrize("args,msg", [
    (["--models", "gpt2,nope"], "unknown model 'nope'"),
    (["--modes", "fast"], "unknown mode 'fast'"),
    (["--rounds", "0"], "--rounds and --threads take a positive count"),
    (["--threads", "-1"], "--rounds and --threads take a positive count"),
    (["--rounds", "x"], "invalid int value"),
])
def test_bench_models_rejects_bad_arguments(args, msg):
    """A bad argument is a usage error (exit 2) before any model is built."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench", "bench_models.py"),
                        *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert msg in r.stderr, r.stderr
    assert "== steps" not in r.stdout
