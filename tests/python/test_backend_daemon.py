"""backend="kiln" and kilnd: the cache across processes, concurrent processes,
dynamic shapes, a daemon that is down or restarted, strict mode, the
package's entry point.

Each test starts its own kilnd (tests/python/conftest.py `daemons`) on a
fresh store, so the daemon's counters are the test's own. Child processes
run tests/python/_backend_child.py.
"""
import json
import os
import pickle
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHILD = os.path.join(HERE, "_backend_child.py")
PY = sys.executable


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16))


def _child(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    e["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([PY, CHILD, *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _compiled(d):
    return d.stats()["compiled"]


def _train_steps(m, model, x, n):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---- the cache across processes ---------------------------------------------------

def test_second_process_gets_the_cache_and_nothing_compiles(daemons):
    d = daemons.start("a")
    daemons.use(d)
    first = _child("train", "mlp")
    assert first["sources"] == ["compiled", "compiled"], first  # forward, backward
    n = _compiled(d)
    assert n == 2
    second = _child("train", "mlp")
    assert second["sources"] == ["memory", "memory"], second
    assert second["losses"] == first["losses"]
    assert _compiled(d) == n  # the daemon compiled nothing for it
    # a restarted daemon on the same store: the blobs, not the hot map
    d.stop()
    d.start()
    third = _child("train", "mlp")
    assert third["sources"] == ["disk", "disk"], third
    assert _compiled(d) == 0  # this daemon process never compiled
    assert third["losses"] == first["losses"]


def test_products_run_openblas_with_the_kernels_the_cpu_allows(daemons):
    # mlp's products are small: BLAS's. OpenBLAS 0.3.21 takes this image's
    # CPU model for a Prescott (SSE3) unless told; libkiln tells it
    if os.environ.get("OPENBLAS_CORETYPE"):
        pytest.skip("OPENBLAS_CORETYPE is set here: kiln leaves it")
    from kiln.runtime import lib
    want = lib().kiln_blas_coretype()
    daemons.use(daemons.start("a"))
    r = _child("train", "mlp")
    assert r["blas"] is not None, r  # a product loaded OpenBLAS
    if want is not None:
        assert r["blas"].lower() == want.decode().lower(), r


# ---- torch's AOTAutograd cache: a warm start does not trace again ------------------

def test_a_warm_process_skips_aotautograd_and_kilnd_answers(daemons, tmp_path):
    d = daemons.start("aot")
    daemons.use(d)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    first = _child("train", "gpt2", env=env)  # GPT-2 has dropout (the seeded forward)
    assert first["aot"] == [False, False] and first["stats"]["aot_cache"] == 0, first
    assert first["aot_counters"].get("autograd_cache_saved") == 1, first
    n = _compiled(d)
    second = _child("train", "gpt2", env=env)
    # AOTAutograd did not trace: both graphs came back from its cache, and
    # kilnd served their artifacts from memory
    assert second["aot_counters"].get("autograd_cache_hit") == 1, second
    assert second["aot"] == [True, True] and second["stats"]["aot_cache"] == 2, second
    assert second["sources"] == ["memory", "memory"], second
    assert second["signatures"] == first["signatures"]
    assert second["losses"] == first["losses"]
    assert _compiled(d) == n
    # a daemon on a new, empty store: the entries hold the graphs, so kilnd
    # compiles them again and the process still does not trace
    d.stop()
    d2 = daemons.start("aot2")
    daemons.use(d2)
    third = _child("train", "gpt2", env=env)
    assert third["aot"] == [True, True] and third["sources"] == ["compiled", "compiled"], third
    assert third["losses"] == first["losses"]


def test_torch_precompile_skips_dynamo_too_and_survives_a_missing_daemon(daemons, tmp_path):
    d = daemons.start("pre")
    daemons.use(d)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch"), "TORCH_CACHING_PRECOMPILE": "1"}
    first = _child("train", "mlp", env=dict(env, KILN_CHILD_SAVE_PRECOMPILE="1"))
    assert first["sources"] == ["compiled", "compiled"] and first["dynamo_graphs"] == 1, first
    assert (tmp_path / "torch" / "dynamo").is_dir()
    second = _child("train", "mlp", env=env)
    # loaded at torch.compile(): Dynamo traced nothing, AOTAutograd nothing
    assert second["dynamo_graphs"] == 0, second
    assert second["aot"] == [True, True] and second["sources"] == ["memory", "memory"], second
    assert second["losses"] == first["losses"]
    # kilnd gone: torch's precompile has no fallback once loaded, so the
    # ATen graphs the entries kept run eagerly, with kiln's warning
    d.stop()
    third = _child("train", "mlp", env=dict(env, KILN_CHILD_WARNINGS="1"))
    assert third["sources"] == ["eager", "eager"] and third["stats"]["fallback"] == 2, third
    assert any("from torch's precompile cache) runs eagerly" in w for w in third["warnings"])
    torch.testing.assert_close(third["losses"], first["losses"], rtol=1e-5, atol=1e-6)


def test_torch_precompile_loads_guards_on_keyword_defaults(daemons, tmp_path):
    # torch 2.11 pickles a DefaultsSource with its derived fields and cannot
    # load it back (TypeError: DefaultsSource.__init__() takes from 3 to 4
    # positional arguments but 6 were given): kiln mends that on import
    # (backend._mend_source_pickling), so the second process loads the entry,
    # and so does one that loads an entry saved without the mend
    d = daemons.start("prekw")
    daemons.use(d)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch"), "TORCH_CACHING_PRECOMPILE": "1"}
    first = _child("train", "kwdefaults", env=dict(env, KILN_CHILD_SAVE_PRECOMPILE="1"))
    assert first["dynamo_graphs"] == 1 and first["sources"] == ["compiled", "compiled"], first
    second = _child("train", "kwdefaults", env=env)
    assert second["dynamo_graphs"] == 0 and second["sources"] == ["memory", "memory"], second
    assert second["losses"] == first["losses"]
    # an entry saved the way torch does without the mend loads as well
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "torch-unmended")
    _child("train", "kwdefaults",
           env=dict(env, KILN_CHILD_SAVE_PRECOMPILE="1", KILN_CHILD_TORCH_PICKLING="1"))
    third = _child("train", "kwdefaults", env=env)
    assert third["dynamo_graphs"] == 0 and third["losses"] == first["losses"], third


def test_dynamo_guard_sources_survive_a_pickle_round_trip_once_kiln_is_imported():
    import dataclasses
    import pickle

    import kiln.backend as kb
    from torch._dynamo import source as S
    for s in (S.DefaultsSource(S.LocalSource("f"), 1),
              S.DefaultsSource(S.GlobalSource("g"), "k", is_kw=True)):
        t = pickle.loads(pickle.dumps(s))
        assert t == s and t._name == s._name and t.field == s.field
        # what torch 2.11 pickles without the mend (every field): loads too
        every = tuple(getattr(s, f.name) for f in dataclasses.fields(s))
        assert len(every) > 3 and type(s)(*every) == s
    assert kb._mend_source_pickling() is False  # nothing is left to mend


def test_kiln_and_inductor_never_take_each_others_entries(daemons, tmp_path):
    d = daemons.start("aotind")
    daemons.use(d)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    ind = _child("train", "mlp", "inductor", env=env)
    assert ind["stats"]["graphs"] == 0 and ind["aot_counters"].get("autograd_cache_saved"), ind
    k = _child("train", "mlp", env=env)
    assert k["aot"] == [False, False] and k["sources"] == ["compiled", "compiled"], k
    assert not k["aot_counters"].get("autograd_cache_hit"), k
    ind2 = _child("train", "mlp", "inductor", env=env)
    # Inductor finds its own entry, never kiln's (which would run kiln)
    assert ind2["stats"]["graphs"] == 0 and ind2["aot_counters"].get("autograd_cache_hit"), ind2
    k2 = _child("train", "mlp", env=env)
    assert k2["aot"] == [True, True], k2
    assert k2["losses"] == k["losses"]


def test_aot_cache_off_and_corrupt_entries_trace_as_before(daemons, tmp_path):
    d = daemons.start("aotoff")
    daemons.use(d)
    cache = tmp_path / "torch"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    first = _child("train", "mlp", env=env)
    off = _child("train", "mlp", env=dict(env, KILN_AOT_CACHE="0"))
    assert off["aot"] == [False, False] and off["stats"]["aot_cache"] == 0, off
    assert not off["aot_counters"].get("autograd_cache_hit"), off
    assert off["losses"] == first["losses"]
    # every entry file truncated: the cache cannot load them, so AOTAutograd
    # traces and kiln compiles through kilnd; nothing fails
    entries = [p for p in (cache / "aotautograd").rglob("*") if p.is_file()]
    assert entries
    for p in entries:
        p.write_bytes(p.read_bytes()[:7])
    bad = _child("train", "mlp", env=env)
    assert bad["aot"] == [False, False] and bad["sources"] == ["memory", "memory"], bad
    assert bad["losses"] == first["losses"]


def test_a_backward_left_to_eager_is_not_cached(daemons, monkeypatch, tmp_path):
    import kiln.backend as kb
    from torch._dynamo.utils import counters
    d = daemons.start("aoteager")
    daemons.use(d)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch"))
    real = kb._compile_aten

    def no_backward(gm, example_inputs, settings, kind):
        if kind == "backward":
            raise kb._Fallback("refused by the test", "unsupported_op")
        return real(gm, example_inputs, settings, kind)

    monkeypatch.setattr(kb, "_compile_aten", no_backward)
    model = _mlp()
    x = torch.randn(8, 32)
    counters.clear()
    for i in range(2):
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            losses = _train_steps(torch.compile(model, backend="kiln"), model, x, 2)
        assert losses[1] < losses[0]
        if i == 0:  # (kiln warns once per process and cause)
            assert any("this backward graph runs eagerly" in str(m.message) for m in w)
    # the entry would hold an eager graph kiln cannot give back: it is not
    # written, and the second compile traces again
    assert counters["aot_autograd"]["autograd_cache_bypass"] >= 1
    assert not counters["aot_autograd"].get("autograd_cache_saved")
    assert not counters["aot_autograd"].get("autograd_cache_hit")
    assert kb.stats()["aot_cache"] == 0


def test_the_cache_tag_names_kiln_its_mode_and_the_users_tag(monkeypatch):
    import kiln.backend as kb
    from kiln import _aotcache
    a = _aotcache.cache_tag(kb._Settings(None, None))
    b = _aotcache.cache_tag(kb._Settings("max-autotune", None))
    assert a.startswith("kiln/") and a != b
    with torch.compiler.config.patch(cache_key_tag="team-7"):
        assert _aotcache.cache_tag(kb._Settings(None, None)) == "team-7|" + a
    with pytest.raises(ValueError, match="unknown options"):
        kb._Settings(None, {"aot_cachee": False})


def _key_of(gm, inputs, **aot):
    import types
    from kiln import _aotcache
    cfg = dict(num_params_buffers=0, keep_inference_input_mutations=False, is_export=False,
               no_tangents=False, dynamic_shapes=False, aot_autograd_arg_pos_to_source=None,
               pre_dispatch=False)
    cfg.update(aot)
    _aotcache._tls.tag = "kiln/test"
    try:
        return _aotcache._kiln_key(gm, inputs, types.SimpleNamespace(**cfg))
    finally:
        _aotcache._tls.tag = None


def test_kilns_cache_key_tells_apart_what_changes_the_graph():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("steps", torch.tensor(3))  # a 0-d attribute

        def forward(self, x):
            return torch.relu(x * self.steps)

    gm = torch.fx.symbolic_trace(M())
    x = torch.randn(4, 8)
    k = _key_of(gm, [x])
    assert k is not None and k == _key_of(gm, [x.clone()])
    assert _key_of(gm, [x.clone().requires_grad_()]) != k
    assert _key_of(gm, [x.double()]) != k
    assert _key_of(gm, [torch.randn(8, 4).t()]) != k          # strides
    assert _key_of(gm, [x], keep_inference_input_mutations=True) != k
    with torch.no_grad():
        assert _key_of(gm, [x]) != k
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = _key_of(gm, [x])
    with torch.autocast("cpu", dtype=torch.float16):
        assert _key_of(gm, [x]) != a
    gm.steps.fill_(4)                                          # a constant's value
    assert _key_of(gm, [x]) != k
    # what kiln's key does not cover goes to torch's key
    gm.obj = object()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (fx: "no underlying reference" for a non-tensor)
        gm.graph.get_attr("obj")
    gm.recompile()
    assert _key_of(gm, [x]) is None


def test_a_precompiled_entry_kiln_cannot_serve_runs_its_aten_graph(monkeypatch):
    import kiln.backend as kb
    from kiln import _aotcache
    gm = torch.fx.symbolic_trace(lambda a, b: torch.relu(torch.add(a, b)))
    out = _aotcache.KilnOutput(None, "forward", data=b"graph", gm=gm)
    out = pickle.loads(pickle.dumps(out))  # as torch's cache gives it back
    assert out._runner is None and out.nodes == 2
    out.package = "an older kiln"
    a, b = torch.randn(3), torch.randn(3)
    with pytest.warns(kb.KilnWarning, match="another version of kiln.*runs eagerly"):
        run = kb._load_cached(out)  # outside kiln(): torch's precompile path
    torch.testing.assert_close(run([a, b]), (a + b).relu())
    assert kb.stats()["fallback"] == 1 and kb.records()[-1]["source"] == "eager"
    # strict: raised as kiln's error, not run
    monkeypatch.setenv("KILN_STRICT", "1")
    with pytest.raises(kb.KilnError, match="another version of kiln"):
        kb._load_cached(out)


def test_an_artifact_that_does_not_load_is_a_fallback(monkeypatch):
    import kiln.backend as kb

    class Client:
        def compile(self, *a):
            return b"not an artifact", "sig", "memory", 0.0

    monkeypatch.setattr(kb, "_client", lambda socket: Client())
    rec = {}
    with pytest.raises(kb._Fallback, match="artifact cannot be loaded") as e:
        kb._load(b"graph", [], False, kb._Settings(None, None), "forward", rec)
    assert e.value.code == "internal" and rec["why"].startswith("load:")


def test_eight_processes_at_once_compile_each_graph_once(daemons):
    d = daemons.start("c", args=["--workers", "2"])
    daemons.use(d)
    procs = []
    e = dict(os.environ, HF_HUB_OFFLINE="1")
    for _ in range(8):
        procs.append(subprocess.Popen([PY, CHILD, "train", "gpt2"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, out + err
        results.append(json.loads(out.strip().splitlines()[-1]))
    distinct = {s for r in results for s in r["signatures"]}
    assert len(distinct) == 2  # GPT-2's forward and backward
    assert _compiled(d) == len(distinct)
    srcs = [s for r in results for s in r["sources"]]
    assert srcs.count("compiled") == len(distinct), srcs
    assert set(srcs) <= {"compiled", "joined", "memory"}, srcs
    assert all(r["losses"] == results[0]["losses"] for r in results)


# ---- dynamic shapes ----------------------------------------------------------------

def test_changing_sequence_length_recompiles_once(daemons):
    import kiln.backend as kb
    d = daemons.start("dyn")
    daemons.use(d)
    torch.manual_seed(0)
    # train(): eval() would take PyTorch's fused fast path (one opaque op);
    # dropout is 0, so the layer computes the same
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True).train()
    m = torch.compile(layer, backend="kiln")
    with torch.no_grad():
        for n in (8, 12, 16, 24, 31):
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(m(x), layer(x), rtol=1e-4, atol=1e-5)
    graphs = kb.records()
    # the first length is compiled static; the second makes Dynamo (and so
    # the graph kiln gets) symbolic in the length; every later one reuses it
    assert len(graphs) == 2, [(g["kind"], g["source"]) for g in graphs]
    assert _compiled(d) == 2
    assert all(not g["fallback_ops"] for g in graphs), graphs
    assert kb.stats()["fallback"] == 0


def _small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


def test_a_smaller_batch_keeps_its_convolutions_in_kernels(daemons):
    """A smaller last batch makes Dynamo's graph symbolic in the batch, and
    kiln does not lower a convolution at symbolic sizes (a torch step each).
    The backend runs each new batch size's static instance instead (a
    compile each, at most 8 a graph), and the symbolic artifact nowhere."""
    import kiln.backend as kb
    d = daemons.start("spec")
    daemons.use(d)
    model = _small_cnn().eval()
    m = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for b in (8, 5, 3, 5):
            x = torch.randn(b, 3, 12, 12)
            torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)
    recs = kb.records()
    assert len(recs) == 2, [(r["kind"], r["source"]) for r in recs]
    assert not recs[0]["fallback_ops"]
    # the symbolic graph leaves its two convolutions to torch: sizes 5 and 3
    # ran their static instances
    assert recs[1]["fallback_ops"].count("aten.convolution.default") == 2
    assert recs[1]["specialized"] == 2, recs[1]
    assert kb.stats()["specialized"] == 2
    assert _compiled(d) == 4  # batch 8, the symbolic graph, batches 5 and 3


def test_a_smaller_batch_trains_through_static_instances(daemons):
    """The same in training: the forward and the backward graph each run
    their static instance at the new batch size; losses and parameters as
    eager's."""
    import kiln.backend as kb
    d = daemons.start("spec_train")
    daemons.use(d)
    model, ref = _small_cnn().train(), _small_cnn().train()
    m = torch.compile(model, backend="kiln")
    optk = torch.optim.SGD(model.parameters(), lr=0.05)
    opte = torch.optim.SGD(ref.parameters(), lr=0.05)
    for b in (8, 5, 5):
        x = torch.randn(b, 3, 12, 12)
        for f, opt in ((m, optk), (ref, opte)):
            opt.zero_grad()
            loss = f(x).pow(2).mean()
            loss.backward()
            opt.step()
            if f is m:
                lk = loss.item()
        assert abs(lk - loss.item()) <= 1e-4 * max(1.0, abs(loss.item()))
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    sym = [r for r in kb.records() if r.get("specialized")]
    assert sorted(r["kind"] for r in sym) == ["backward", "forward"], kb.records()
    assert kb.stats()["specialized"] == 2


def test_kilnd_refuses_a_generalization_that_costs_kernels(daemons):
    """A second process (here: Dynamo reset) compiling the same CNN at
    another batch sends a static graph; kilnd generalizes it (its second
    size set), but the generalized graph leaves the convolutions to torch:
    kilnd refuses it (not stored) and answers with the static graph's
    artifact, and the structure stays static."""
    import kiln.backend as kb
    d = daemons.start("spec_gen")
    daemons.use(d)
    model = _small_cnn().eval()
    with torch.no_grad():
        for b in (8, 5):
            torch._dynamo.reset()
            kb.reset()
            m = torch.compile(model, backend="kiln")
            x = torch.randn(b, 3, 12, 12)
            torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)
    (rec,) = kb.records()
    assert rec["fallback_ops"] == [] and not rec.get("specialized"), rec
    st = d.stats()
    assert st["dynamic"]["compiles"] == 0 and st["dynamic"]["refused"] == 1, st["dynamic"]
    assert st["compiled"] == 3  # batch 8, the refused generalization, batch 5


def test_a_graph_with_torch_steps_at_every_size_is_not_specialized(daemons, monkeypatch):
    """topk is never lowered: the static instance leaves it to torch too,
    so the backend compiles that one instance and then keeps the symbolic
    artifact (no compile per size). KILN_SPECIALIZE=0 skips even that."""
    import kiln.backend as kb
    d = daemons.start("spec_topk")
    daemons.use(d)

    def f(x):
        return torch.topk(x * 2, 3).values + 1
    m = torch.compile(f, backend="kiln")
    for n in (6, 7, 9, 11):
        x = torch.randn(n, 10)
        torch.testing.assert_close(m(x), f(x))
    recs = kb.records()
    assert len(recs) == 2
    assert "leaves 1 steps to torch too" in recs[1]["specialized_why"], recs[1]
    assert not recs[1].get("specialized")
    assert _compiled(d) == 3  # n = 6, the symbolic graph, its instance at 7
    torch._dynamo.reset()
    kb.reset()
    monkeypatch.setenv("KILN_SPECIALIZE", "0")
    model = _small_cnn().eval()
    m = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for b in (8, 5):
            x = torch.randn(b, 3, 12, 12)
            torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)
    assert kb.stats()["specialized"] == 0


def test_a_static_instance_without_kilnd_runs_the_symbolic_artifact(daemons):
    """kilnd gone when a new batch size needs its static instance: that call
    runs the symbolic artifact (torch runs its convolutions), right numbers,
    no exception; with kilnd back, a later call at that size gets its
    instance."""
    import kiln.backend as kb
    d = daemons.start("spec_down")
    daemons.use(d)
    model = _small_cnn().eval()
    m = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for b in (8, 5):
            m(torch.randn(b, 3, 12, 12))
        d.stop()
        x = torch.randn(3, 3, 12, 12)
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)
        rec = kb.records()[1]
        assert rec["specialized"] == 1 and "static instance at" in rec["specialized_why"], rec
        d.start()
        kb._state.down_until = 0.0  # (the failed connect is remembered for 5 s)
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)
        assert rec["specialized"] == 2, rec


def test_dynamic_false_compiles_every_length(daemons):
    import kiln.backend as kb
    d = daemons.start("static")
    daemons.use(d)
    lin = nn.Linear(16, 16).eval()
    m = torch.compile(lin, backend="kiln", dynamic=False)
    with torch.no_grad():
        for n in (3, 5, 7):
            x = torch.randn(n, 16)
            torch.testing.assert_close(m(x), lin(x), rtol=1e-5, atol=1e-6)
    assert len(kb.records()) == 3 and _compiled(d) == 3


# ---- failure -------------------------------------------------------------------------

def test_daemon_down_runs_with_one_warning(daemons, monkeypatch, tmp_path):
    import kiln.backend as kb
    monkeypatch.setenv("KILN_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setenv("KILN_FALLBACK", "eager")
    model = _mlp()
    x = torch.randn(8, 32)
    with pytest.warns(kb.KilnWarning, match="kilnd is not available") as w:
        m = torch.compile(model, backend="kiln")
        losses = _train_steps(m, model, x, 3)
    assert len([x for x in w if issubclass(x.category, kb.KilnWarning)]) == 1
    assert losses[2] < losses[0]
    assert kb.stats()["fallback"] == 1
    rec = kb.records()[0]
    assert rec["kind"] == "dynamo" and rec["source"] == "fallback" and rec["runs_with"] == "eager"


def test_daemon_down_falls_back_to_inductor(monkeypatch, tmp_path):
    import kiln.backend as kb
    monkeypatch.setenv("KILN_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    lin = nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    with pytest.warns(kb.KilnWarning, match="runs through Inductor"):
        with torch.no_grad():
            got = torch.compile(lin, backend="kiln")(x)
    torch.testing.assert_close(got, lin(x))


def test_strict_and_fullgraph_raise_when_the_daemon_is_down(monkeypatch, tmp_path):
    from torch._dynamo.exc import BackendCompilerFailed
    monkeypatch.setenv("KILN_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    monkeypatch.setenv("KILN_STRICT", "1")
    with pytest.raises(BackendCompilerFailed, match="kilnd is not available"):
        torch.compile(lin, backend="kiln")(x)
    monkeypatch.delenv("KILN_STRICT")
    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed, match="kilnd is not available"):
        torch.compile(lin, backend="kiln", fullgraph=True)(x)


def test_daemon_restarted_mid_training(daemons):
    import kiln.backend as kb
    d = daemons.start("r")
    daemons.use(d)
    model = _mlp()
    m = torch.compile(model, backend="kiln")
    x8, x16 = torch.randn(8, 32), torch.randn(16, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kb.KilnWarning)  # no fallback anywhere
        _train_steps(m, model, x8, 2)
        d.kill9()                        # the daemon dies mid-training ...
        _train_steps(m, model, x8, 2)    # ... compiled graphs need no daemon
        d.start()                        # restarted (same store)
        # a new batch size: new graphs, through the restarted daemon (libkiln
        # reconnects; the first daemon's store serves what it had)
        losses = _train_steps(m, model, x16, 2)
    assert all(l == l for l in losses)
    srcs = [r["source"] for r in kb.records()]
    assert srcs[:2] == ["compiled", "compiled"] and len(srcs) == 4, srcs
    assert kb.stats()["fallback"] == 0


def test_daemon_gone_for_a_recompile_falls_back_and_training_continues(daemons, monkeypatch):
    import kiln.backend as kb
    d = daemons.start("g")
    daemons.use(d)
    monkeypatch.setenv("KILN_FALLBACK", "eager")
    model = _mlp()
    m = torch.compile(model, backend="kiln", dynamic=False)
    _train_steps(m, model, torch.randn(8, 32), 2)
    d.stop()
    with pytest.warns(kb.KilnWarning, match="kilnd is not available"):
        losses = _train_steps(m, model, torch.randn(4, 32), 2)  # a recompile: no daemon
    assert losses[1] < losses[0]


# ---- settings ------------------------------------------------------------------------

def test_mode_and_options(kiln_daemon):
    import kiln
    import kiln.backend as kb
    lin = nn.Linear(8, 8).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        got = kiln.compile(lin, mode="max-autotune")(x)
    torch.testing.assert_close(got, lin(x))
    assert kb.records()[-1]["source"] in ("compiled", "memory")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(lin, backend="kiln", options={"bogus": 1})(x)
    with pytest.raises(ValueError, match="unknown mode"):
        kiln.compile(lin, mode="fastest")


def test_kiln_compile_is_torch_compile_with_backend_kiln(kiln_daemon):
    import kiln
    import kiln.backend as kb
    model = _mlp()
    x = torch.randn(8, 32)

    @kiln.compile(dynamic=False)
    def f(t):
        return model(t).relu()
    torch.testing.assert_close(f(x), model(x).relu())
    # the parameters require grad: a training graph, whose backward is
    # compiled with the forward (so both go into torch's AOTAutograd cache)
    assert [r["kind"] for r in kb.records()] == ["forward", "backward"]


def test_the_package_declares_the_entry_point(tmp_path):
    r = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), os.path.join(ROOT, "clients", "python")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import zipfile
    whl = [f for f in os.listdir(tmp_path) if f.endswith(".whl")]
    assert len(whl) == 1
    with zipfile.ZipFile(tmp_path / whl[0]) as z:
        names = z.namelist()
        ep = z.read([n for n in names if n.endswith("entry_points.txt")][0]).decode()
    assert "[torch_dynamo_backends]" in ep and "kiln = kiln.backend:kiln" in ep
    assert "kiln/backend.py" in names and "kiln/runtime.py" in names
    from torch._dynamo.backends.registry import lookup_backend
    import kiln.backend
    assert lookup_backend("kiln") is kiln.backend.kiln


@pytest.mark.parametrize("first", ["kiln", "torch"])
def test_the_backend_is_found_whichever_is_imported_first(first):
    """Importing kiln.backend registers it with Dynamo, so torch.compile's
    lookup of "kiln" does not import Dynamo's other backends and scan the
    entry points; where Dynamo looked the name up first, through the entry
    point, the import does not register it twice."""
    lookup = ("import torch._dynamo.backends.registry as R\n"
              "f = R.lookup_backend('kiln')\n")
    code = ("import torch, torch._dynamo\n"
            + ("import kiln.backend as kb\n" + lookup if first == "kiln"
               else lookup + "import kiln.backend as kb\n")
            + "print(f is kb.kiln, R._lazy_import.cache_info().currsize)\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == (["True", "0"] if first == "kiln" else ["True", "1"])


def test_a_graph_without_kernels_runs_as_its_aten_graph(daemons):
    """topk is an ATen op kiln has no kernel for: the plan would be a single
    fallback step plus copies, so the ATen graph runs as it is (same
    result, no copies)."""
    import kiln.backend as kb
    daemons.use(daemons.start("nk"))  # a fresh store: the static graph
    torch.manual_seed(0)

    def f(x):
        return torch.topk(x, 3)
    x = torch.randn(4, 16)
    got = torch.compile(f, backend="kiln")(x)
    torch.testing.assert_close(tuple(got), tuple(f(x)))
    (rec,) = kb.records()
    assert rec["kernels"] == [] and rec["fallback_ops"] == ["aten.topk.default"], rec
    assert rec["source"] in ("compiled", "memory")


def test_a_symbolic_argument_to_a_torch_op_runs(daemons):
    """kilnd generalizes the second graph of another size: topk's k, the
    size of the last dim, becomes a symbol, which the fallback step binds
    from the run's symbols (kiln_fallback_syms); the kernels around it run
    in kiln, no graph falls back, and the results are right at both
    sizes."""
    import kiln.backend as kb
    daemons.use(daemons.start("sym"))
    sym_steps = 0
    for d in (32, 48):
        torch._dynamo.reset()

        def f(x):
            return torch.topk(x * 2 + 1, x.shape[-1]).values.exp() - 1
        x = torch.randn(2, 8, d)
        with warnings.catch_warnings():
            warnings.simplefilter("error", kb.KilnWarning)
            torch.testing.assert_close(torch.compile(f, backend="kiln")(x), f(x))
        rec = kb.records()[-1]
        assert rec["kernels"] and "aten.topk.default" in rec["fallback_ops"], rec
        mod = kb._state.modules[next(reversed(kb._state.modules))][0]
        sym_steps += sum(1 for st in mod._steps if st.get("kind") == "fallback"
                         and "'sym'" in repr(st.get("args")))
    assert kb.stats()["fallback"] == 0, kb.records()
    assert sym_steps >= 1, "kilnd did not generalize the second graph"


def test_an_eval_encoder_layer_is_kernels_at_every_length(daemons):
    """eval() nn.TransformerEncoderLayer is one fused ATen op
    (_transformer_encoder_layer_fwd, torch's fast path): kiln lowers it to
    products, attention and layer norms, with a key padding mask too, and
    the graph kilnd generalizes over the sequence length runs every length
    in kernels, no torch step."""
    import kiln.backend as kb
    daemons.use(daemons.start("tel"))
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True).eval()
    for L in (8, 12, 5):
        torch._dynamo.reset()
        x = torch.randn(2, L, 32)
        pad = torch.zeros(2, L, dtype=torch.bool)
        pad[1, L // 2:] = True
        with warnings.catch_warnings():
            warnings.simplefilter("error", kb.KilnWarning)
            with torch.no_grad():
                got = torch.compile(layer, backend="kiln")(x, src_key_padding_mask=pad)
                torch.testing.assert_close(got, layer(x, src_key_padding_mask=pad),
                                           rtol=1e-4, atol=2e-5)
        rec = kb.records()[-1]
        assert rec["kernels"] and rec["fallback_ops"] == [], rec
    assert kb.stats()["fallback"] == 0, kb.records()


def test_symbolic_expressions_evaluate_as_python_ints():
    from kiln.runtime import KilnError, eval_expr
    env = {"s0": 7, "s1": 3}
    assert eval_expr("s0", env) == 7
    assert eval_expr("(s0 - 1)//2 + 1", env) == 4
    assert eval_expr("-s0 // 2", env) == -4 and eval_expr("-s0 % 3", env) == 2
    assert eval_expr("max(1, s1*s0) - min(s0, 2)", env) == 19
    assert eval_expr(5, env) == 5
    for bad in ("s9", "__import__('os')", "s0.real", "s0; 1", "[s0]"):
        with pytest.raises(KilnError):
            eval_expr(bad, env)
