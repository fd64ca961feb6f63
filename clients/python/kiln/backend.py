"""kiln's torch.compile backends.

    torch.compile(model, backend="kiln")          # through kilnd (the entry point)
    kiln.compile(model, **torch_compile_kwargs)   # the same
    torch.compile(model, backend=kiln.backend.kiln_local)   # in-process kilnc, no daemon

``kiln`` runs through AOTAutograd: the forward and backward ATen graphs (or
the inference graph) are exported to Graph v1 (kiln.export), compiled by
kilnd through libkiln (kiln.runtime.Client: the signature, lookup, compile,
libkiln's in-process artifact cache and kilnd's auto-start are C), and run
by libkiln (kiln.runtime.Module). A per-process cache maps each graph's
bytes to its loaded module, so a graph seen again (another model instance,
a recompile, ``torch._dynamo.reset()``) costs a hash and a dict lookup.

Failure never reaches a training loop unless asked to: a graph kiln cannot
take (the exporter refuses it, kilnd answers unsupported_op / invalid_graph /
compile_failed), a daemon that is down, unreachable, busy or timing out, and
CUDA tensors (kiln's CUDA backend is not built yet) make that graph run
through the fallback -- Inductor by default, or eager ATen -- with one
warning (``KilnWarning``) that says why. With ``fullgraph=True`` or
``KILN_STRICT=1`` the same conditions raise ``KilnError``.

Settings (environment, or ``options={...}`` of torch.compile):

  KILN_STRICT=1        | "strict": True        raise instead of falling back
  KILN_FALLBACK=eager  | "fallback": "eager"   fallback: "inductor" (default) or "eager"
  KILN_SOCKET=path     | "socket": path        kilnd's socket (default discovery)
                       | "priority": "batch"   queue behind interactive compiles
  KILN_AOT_CACHE=0     | "aot_cache": False    keep no graphs in torch's AOTAutograd cache

A warm start skips AOTAutograd's tracing: kiln's graphs go into torch's
AOTAutograd cache (kiln/_aotcache.py), and a hit hands kilnd the graph
bytes the entry kept.
"""
import contextlib
import hashlib
import logging
import operator
import os
import threading
import time
import warnings

import torch

from . import ops as _ops  # noqa: F401  (registers torch.ops.kiln.dropout)
from .export import ExportError, dumps, export_graph
from .runtime import Client, KilnError, Module, eval_expr

__all__ = ["kiln", "kiln_local", "compile_bytes", "compile_graph", "KilnWarning", "records",
           "stats", "reset"]

log = logging.getLogger("kiln")

MODES = {None: "default", "default": "default", "reduce-overhead": "reduce-overhead",
         "max-autotune": "max-autotune", "max-autotune-no-cudagraphs": "max-autotune"}
OPTIONS = {"strict", "fallback", "socket", "priority", "aot_cache", "specialize"}
# error codes meaning "kiln cannot take this graph" vs "kilnd is not there"
_GRAPH_CODES = {"unsupported_op", "invalid_graph", "compile_failed", "too_large"}


class KilnWarning(UserWarning):
    """A graph ran without kiln (the message says why and what ran it)."""


# ---------------------------------------------------------------------------
# per-process state


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.clients = {}     # socket (None: default) -> Client, for this pid
        self.pid = os.getpid()
        self.modules = {}     # (sha256 of graph bytes, mode, dynamic) -> (Module, info)
        self.records = []     # one per graph handed to the backend (kiln.explain)
        self.warned = set()
        self.down_until = 0.0  # after a failed connect: do not retry before this
        self.counts = {"graphs": 0, "compiled": 0, "memory": 0, "disk": 0, "remote": 0,
                       "joined": 0, "local": 0, "process": 0, "fallback": 0, "aot_cache": 0,
                       "specialized": 0}


_state = _State()


def reset():
    """Forgets the per-process cache, records and warnings (connections stay)."""
    with _state.lock:
        _state.modules.clear()
        _state.records.clear()
        _state.warned.clear()
        _state.down_until = 0.0
        for k in _state.counts:
            _state.counts[k] = 0


def records():
    """One dict per graph the backend was given, in order (kiln.explain)."""
    return list(_state.records)


def stats():
    """Counters of this process: graphs, and where each came from
    (compiled / memory / disk / joined by kilnd, local: libkiln's cache,
    process: this module's cache, fallback)."""
    return dict(_state.counts)


def _client(socket):
    """This process's connection to kilnd for socket (None: the default).
    A failed connect is remembered for 5 s so a model with many graphs
    falls back at once instead of waiting on each."""
    st = _state
    with st.lock:
        if st.pid != os.getpid():  # forked: the parent's sockets are not ours
            st.clients = {}
            st.pid = os.getpid()
        c = st.clients.get(socket)
        if c is not None:
            return c
        if time.monotonic() < st.down_until:
            raise KilnError("kilnd was unreachable moments ago", code="unavailable")
        try:
            c = Client(socket)
        except KilnError as e:
            st.down_until = time.monotonic() + 5.0
            if e.code == "internal":
                e.code = "unavailable"
            raise
        st.clients[socket] = c
        return c


def _setting(options, key, env, default=None):
    if options and key in options:
        return options[key]
    v = os.environ.get(env)
    return v if v not in (None, "") else default


def _fullgraph():
    """True when the frame being compiled was asked for fullgraph=True."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        return bool(getattr(InstructionTranslator.current_tx(), "one_graph", False))
    except Exception:
        return False


def _dynamic_flag():
    """torch.compile's dynamic= as Dynamo's config shows it while compiling:
    False -> 0 (kilnd never generalizes), True -> 1, None -> automatic."""
    import torch._dynamo.config as dc
    if not dc.assume_static_by_default:
        return True
    if not dc.automatic_dynamic_shapes:
        return False
    return None


class _Settings:
    def __init__(self, mode, options):
        if mode not in MODES:
            raise ValueError(f"kiln: unknown mode {mode!r}: want one of "
                             + ", ".join(repr(m) for m in MODES if m))
        options = dict(options or {})
        bad = set(options) - OPTIONS
        if bad:
            raise ValueError(f"kiln: unknown options {sorted(bad)}: want {sorted(OPTIONS)}")
        self.mode = MODES[mode]
        self.torch_mode = mode
        strict = _setting(options, "strict", "KILN_STRICT", False)
        self.strict = strict not in (False, 0, "0", "", "false", "no")
        self.fallback = _setting(options, "fallback", "KILN_FALLBACK", "inductor")
        if self.fallback not in ("inductor", "eager"):
            raise ValueError(f"kiln: fallback {self.fallback!r}: want 'inductor' or 'eager'")
        self.socket = _setting(options, "socket", "KILN_SOCKET", None)
        self.priority = _setting(options, "priority", "KILN_PRIORITY", None)
        aot_cache = _setting(options, "aot_cache", "KILN_AOT_CACHE", True)
        self.aot_cache = aot_cache not in (False, 0, "0", "", "false", "no")
        spec = _setting(options, "specialize", "KILN_SPECIALIZE", True)
        self.specialize = spec not in (False, 0, "0", "", "false", "no")
        self.dynamic = None


class _Fallback(Exception):
    """This graph cannot go through kiln; the message says why."""

    def __init__(self, why, code):
        super().__init__(why)
        self.code = code


def _new_record(kind, nodes, why=None):
    """The fields of a records() entry, before anything is known."""
    return {"kind": kind, "nodes": nodes, "source": None, "signature": None, "kernels": [],
            "fallback_ops": [], "export_ms": 0.0, "compile_ms": 0.0, "rpc_ms": 0.0,
            "load_ms": 0.0, "why": why}


def _record(kind, gm, why=None):
    """A new entry of records() (and the graphs counter), under the lock."""
    rec = _new_record(kind, sum(1 for n in gm.graph.nodes if n.op == "call_function"), why)
    with _state.lock:
        _state.records.append(rec)
        _state.counts["graphs"] += 1
    return rec


def _warn(settings, key, msg):
    st = _state
    with st.lock:
        st.counts["fallback"] += 1
        first = key not in st.warned
        st.warned.add(key)
    if first:
        warnings.warn(msg, KilnWarning, stacklevel=3)
    log.warning("%s", msg)


# ---------------------------------------------------------------------------
# one ATen graph -> a runner


def _boxed(fn):
    def run(args):
        outs = fn(*args)
        args.clear()  # boxed convention: the callee owns the argument list
        return outs

    run._boxed_call = True
    return run


def _boxed_seeded(fn):
    """_boxed for a graph whose last input is the dropout seed: a fresh
    int64 from torch's default generator on every call."""
    def run(args):
        args.append(torch.empty((), dtype=torch.int64).random_())
        outs = fn(*args)
        args.clear()
        return outs

    run._boxed_call = True
    return run


def _seed_dropout(gm):
    """A copy of gm in which every training aten.native_dropout (0 < p < 1)
    is kiln.dropout (kiln/ops.py) drawing from one new last input, the seed,
    and every aten.bernoulli.p(x, p) of a floating x (stochastic depth:
    torchvision's StochasticDepth, timm's DropPath draw
    ``x.new_empty(shape).bernoulli_(keep)``) is kiln.dropout's mask of a
    ones_like(x) with drop probability 1 - p, converted to x's dtype: 1 with
    probability p, as torch's; None when gm has neither. gm itself is left
    as it is (a fallback compiles it)."""
    def params(n):
        """("dropout" | "bernoulli", input, p) of a node to rewrite, else None."""
        if n.op != "call_function":
            return None
        if n.target is torch.ops.aten.bernoulli.p:
            x = n.args[0] if len(n.args) > 0 else n.kwargs.get("input")
            p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
            val = getattr(x, "meta", {}).get("val")
            ok = (isinstance(p, (int, float)) and 0 <= p <= 1
                  and n.kwargs.get("generator") is None
                  and isinstance(val, torch.Tensor) and val.is_floating_point()
                  and isinstance(n.meta.get("val"), torch.Tensor))
            return ("bernoulli", x, float(p)) if ok else None
        if n.target is not torch.ops.aten.native_dropout.default:
            return None
        x = n.args[0] if len(n.args) > 0 else n.kwargs.get("input")
        p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p")
        train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train")
        ok = train is True and isinstance(p, (int, float)) and 0 < p < 1
        return ("dropout", x, float(p)) if ok and x is not None else None

    if not any(params(n) for n in gm.graph.nodes):
        return None
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    phs = [n for n in g.nodes if n.op == "placeholder"]
    if phs:
        with g.inserting_after(phs[-1]):
            seed = g.placeholder("kiln_seed")
    else:
        with g.inserting_before(next(iter(g.nodes))):
            seed = g.placeholder("kiln_seed")
    seed.meta["val"] = torch.zeros((), dtype=torch.int64)
    stream = 0
    for n in list(g.nodes):
        what = params(n)
        if what is None:
            continue
        kind, x, p = what
        with g.inserting_before(n):
            if kind == "dropout":
                new = g.call_function(torch.ops.kiln.dropout.default, (x, p, seed, stream))
            else:
                val = n.meta["val"]  # a fake tensor of x's shape and dtype
                ones = g.call_function(torch.ops.aten.ones_like.default, (x,))
                ones.meta["val"] = val
                drop = g.call_function(torch.ops.kiln.dropout.default,
                                       (ones, 1.0 - p, seed, stream))
                mask_val = val.to(torch.bool)
                drop.meta["val"] = (val, mask_val)
                mask = g.call_function(operator.getitem, (drop, 1))
                mask.meta["val"] = mask_val
                new = g.call_function(torch.ops.aten._to_copy.default, (mask,),
                                      {"dtype": val.dtype})
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        stream += 1
    return torch.fx.GraphModule(gm, g)


def _compile_aten(gm, example_inputs, settings, kind):
    """Exports, compiles through kilnd (or the process cache) and loads one
    AOTAutograd graph. Raises _Fallback when kiln cannot take it."""
    rec = _record(kind, gm)
    t0 = time.perf_counter()
    # a forward draws the masks its backward reuses (saved): a dropout in a
    # backward graph (recomputed) must draw eager's, so it stays torch's
    seeded = _seed_dropout(gm) if kind in ("forward", "inference") else None
    if seeded is not None:
        gm = seeded
        example_inputs = list(example_inputs) + [torch.zeros((), dtype=torch.int64)]
    try:
        graph = export_graph(gm, example_inputs)
    except ExportError as e:
        raise _fallback(rec, f"export: {e}",
                        f"the {kind} graph cannot be exported to Graph v1: {e}",
                        "unsupported_op") from e
    data = dumps(graph)
    t1 = time.perf_counter()
    rec["export_ms"] = (t1 - t0) * 1e3
    mod = _load(data, graph.get("none_outputs", []), seeded is not None, settings, kind, rec,
                graph)
    mod._kiln_data = data  # (what torch's AOTAutograd cache keeps of it)
    return mod


def _fallback(rec, why, msg, code):
    """The _Fallback for msg, carrying rec (whose why it sets)."""
    rec["why"] = why
    f = _Fallback(msg, code)
    f.record = rec
    return f


def _load(data, none_outputs, seeded, settings, kind, rec, graph=None):
    """Graph v1 bytes -> the loaded Module: the process cache, else kilnd
    (which compiles on a miss). Raises _Fallback when kiln cannot take it.
    graph: the exported dict, to name the node kilnd points at."""
    t1 = time.perf_counter()
    key = (hashlib.sha256(data).digest(), settings.mode, settings.dynamic)
    hit = _state.modules.get(key)
    if hit is not None:
        mod, info = hit
        rec.update(info, source="process", compile_ms=0.0)
        with _state.lock:
            _state.counts["process"] += 1
        return mod
    try:
        client = _client(settings.socket)
        art, sig, source, cms = client.compile(data, settings.mode, settings.dynamic,
                                               settings.priority)
    except KilnError as e:
        if e.code in _GRAPH_CODES:
            node = ""
            nodes = (graph or {}).get("nodes", [])
            if e.node is not None and 0 <= e.node < len(nodes):
                node = f" (node {e.node}: {nodes[e.node].get('op')})"
            msg = f"kilnd cannot compile the {kind} graph{node}: {e}"
        else:
            msg = f"kilnd is not available ({e.code}): {e}"
        raise _fallback(rec, f"{e.code}: {e}", msg, e.code) from e
    t2 = time.perf_counter()
    try:
        mod = Module(art, none_outputs)
    except KilnError as e:
        raise _fallback(rec, f"load: {e}", f"the {kind} graph's artifact cannot be loaded: {e}",
                        "internal") from e
    mod._kiln_seeded = seeded
    mod._kiln_data = data  # the Graph v1 bytes (an AOTAutograd cache hit too)
    t3 = time.perf_counter()
    steps = mod._steps
    kernels = [k.get("name") for k in mod._kernels]
    fb = [s.get("op") for s in steps if s.get("kind") == "fallback"]
    info = {"signature": sig, "kernels": kernels, "fallback_ops": fb,
            "compile_ms": cms, "steps": len(steps)}
    rec.update(info, source=source, rpc_ms=(t2 - t1) * 1e3, load_ms=(t3 - t2) * 1e3)
    if fb and mod._sym_names and settings.dynamic is None and settings.specialize:
        mod = _specialized(mod, data, graph, none_outputs, seeded, settings, rec)
    with _state.lock:
        _state.counts[source if source in _state.counts else "compiled"] += 1
        _state.modules[key] = (mod, info)
    return mod


def _n_fallback(mod):
    return sum(1 for s in mod._steps if s.get("kind") == "fallback")


def _specialized(mod, data, graph, none_outputs, seeded, settings, rec):
    """A _Specializing around mod, an artifact with symbols and torch steps,
    where the graph sent has symbols (Dynamo's); else mod. (A static graph
    that kilnd generalized comes back generalized only where that leaves
    no op kiln lowers to torch: kilnd refuses the others.)"""
    if graph is None:
        import msgpack
        graph = msgpack.unpackb(data, raw=False)
    if graph.get("symbols"):
        return _Specializing.make(mod, graph, none_outputs, seeded, settings, rec) or mod
    return mod


def _instance(graph, env):
    """The static graph that the symbolic graph is at symbol values env:
    every size, stride and symbolic argument evaluated (libkiln's
    evaluator), an int input {"sym": e} kept as an input of its value."""
    def dim(d):
        return d if isinstance(d, int) else eval_expr(d, env)

    def spec(sp):
        if "sym" in sp:
            return {"sym": str(eval_expr(sp["sym"], env))}
        out = dict(sp, shape=[dim(d) for d in sp["shape"]])
        if "strides" in sp:
            out["strides"] = [dim(d) for d in sp["strides"]]
        return out

    def arg(a):
        if isinstance(a, dict):
            return eval_expr(a["sym"], env) if "sym" in a else a
        if isinstance(a, list):
            return [arg(x) for x in a]
        return a
    g = {k: v for k, v in graph.items() if k != "symbols"}
    g["inputs"] = [spec(i) for i in graph["inputs"]]
    g["nodes"] = [dict(n, args=[arg(a) for a in n.get("args", [])],
                       kwargs={k: arg(v) for k, v in (n.get("kwargs") or {}).items()},
                       out=[spec(o) for o in n.get("out", [])])
                  for n in graph["nodes"]]
    g["outputs"] = [spec(o) if "sym" in o else o for o in graph["outputs"]]
    return g


class _Specializing:
    """A graph with symbols whose artifact leaves steps to torch that the
    same graph at static sizes may not (a lowering that declines symbolic
    sizes: every convolution, after Dynamo's automatic dynamic shapes made
    the batch a symbol at a smaller last batch). Each call binds the
    symbols from its inputs' sizes; the first call at a new set of sizes compiles the static
    instance (kilnd, dynamic false: shared with every process) and later
    ones at those sizes run it. At most LIMIT instances a graph, then the
    symbolic artifact; and none at all once an instance leaves as many
    torch steps as the symbolic artifact (the steps are torch's either way:
    one artifact saves the compiles). Every other attribute is the
    symbolic module's."""

    LIMIT = 8

    def __init__(self, generic, graph, binders, none_outputs, seeded, settings, rec):
        self.generic = generic
        self.graph = graph
        self.binders = binders  # (symbol, input index, dim or None: an int input)
        self.none_outputs = none_outputs
        self.seeded = seeded
        self.settings = settings
        self.rec = rec
        self.n_fb = _n_fallback(generic)
        self.instances = {}  # the symbols' values -> Module
        self.off = False
        self.lock = threading.Lock()

    @classmethod
    def make(cls, generic, graph, none_outputs, seeded, settings, rec):
        names = set(generic._sym_names)
        binders, seen = [], set()
        for i, sp in enumerate(graph.get("inputs", [])):
            if "sym" in sp:
                if sp["sym"] in names and sp["sym"] not in seen:
                    binders.append((sp["sym"], i, None))
                    seen.add(sp["sym"])
                continue
            for d, e in enumerate(sp.get("shape", [])):
                if isinstance(e, str) and e in names and e not in seen:
                    binders.append((e, i, d))
                    seen.add(e)
        if seen != names:
            return None  # a symbol no input size binds alone: keep the one artifact
        return cls(generic, graph, binders, none_outputs, seeded, settings, rec)

    def __getattr__(self, name):
        return getattr(self.generic, name)

    def __call__(self, *args):
        if self.off:
            return self.generic(*args)
        key = tuple(args[i].shape[d] if d is not None else int(args[i])
                    for _, i, d in self.binders)
        m = self.instances.get(key)
        if m is None:
            m = self._specialize(key)
        return m(*args)

    def _specialize(self, key):
        with self.lock:
            m = self.instances.get(key)
            if m is not None:
                return m
            if self.off or len(self.instances) >= self.LIMIT:
                return self.generic
            env = {name: v for (name, _, _), v in zip(self.binders, key)}
            st = self.settings
            try:
                data = dumps(_instance(self.graph, env))
                art, _sig, _src, _cms = _client(st.socket).compile(data, st.mode, False,
                                                                   st.priority)
                m = Module(art, self.none_outputs)
            except (KilnError, ExportError, ValueError, TypeError, KeyError) as e:
                # kilnd away or busy: the symbolic artifact this time, and
                # a later call at these sizes asks again; anything else
                # (the instance cannot be had): the symbolic one always
                transient = getattr(e, "code", None) in ("unavailable", "busy", "timeout",
                                                         "shutting_down")
                self.off = not transient
                self.rec["specialized_why"] = f"static instance at {env}: {e}"
                log.info("kiln: %s", self.rec["specialized_why"])
                return self.generic
            fb = _n_fallback(m)
            if fb >= self.n_fb:
                self.off = True
                self.rec["specialized_why"] = (f"the static instance at {env} leaves {fb} "
                                               f"steps to torch too")
                return self.generic
            m._kiln_seeded = self.seeded
            self.instances[key] = m
            self.rec["specialized"] = len(self.instances)
            with _state.lock:
                _state.counts["specialized"] += 1
            return m


def _aten_compiler(settings, kind, cached):
    """AOTAutograd's compiler for kind. cached: return KilnOutput (what
    torch's AOTAutograd cache stores; kiln/_aotcache.py) around the runner."""
    def compiler(gm, example_inputs):
        try:
            mod = _compile_aten(gm, example_inputs, settings, kind)
        except _Fallback as e:
            if settings.strict or kind == "forward" or kind == "inference":
                raise
            # a backward graph is compiled at the first backward(), after
            # the forward already runs through kiln: it runs eagerly
            _warn(settings, ("bw", e.code), f"kiln: {e}; this backward graph runs eagerly")
            if getattr(e, "record", None) is not None:
                e.record["source"] = "eager"
            return cached(_boxed(gm), kind, settings=settings, gm=gm) if cached else _boxed(gm)
        if not mod._kernels:
            # every step is a torch op (e.g. the fused
            # _transformer_encoder_layer_fwd of an eval() layer): the ATen
            # graph itself does the same without the plan's copies
            runner = _boxed(gm)
        else:
            runner = _runner(mod)
        if cached:
            return cached(runner, kind, mod._kiln_data, mod.none_outputs, mod._kiln_seeded,
                          settings, gm)
        return runner

    return compiler


def _runner(mod):
    runner = _boxed_seeded(mod) if getattr(mod, "_kiln_seeded", False) else _boxed(mod)
    runner.kiln_module = mod
    return runner


_tls = threading.local()  # .settings: those of the kiln() call in progress
_aot_cache_off = False  # kiln.explain: trace every graph (see _explain.py)


def _load_cached(out):
    """KilnOutput.post_compile: the runner of a graph torch's AOTAutograd
    cache gave back (AOTAutograd did not trace it). The artifact comes from
    the process cache or kilnd, which compiles it again if its store lost it.
    Raises when it cannot be had: the cache then counts a bypass and
    AOTAutograd traces as on a miss."""
    settings = getattr(_tls, "settings", None)
    precompiled = settings is None
    if precompiled:
        # torch's precompile, at torch.compile(): the entry's mode and
        # dynamic flag, the rest (socket, priority, strict) from the
        # environment (torch.compile's options= are not seen here)
        settings = _Settings(getattr(out, "mode", None), None)
        settings.dynamic = getattr(out, "dynamic", None)
    rec = dict(_new_record(out.kind, getattr(out, "nodes", None)), aot_cache=True)
    if not precompiled:
        # inside kiln(): any failure makes torch's cache count a bypass, and
        # AOTAutograd traces as on a miss
        if not out.current():
            from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
            raise BypassAOTAutogradCache("kiln: an entry another version of kiln wrote")
        mod = _load(out.data, out.none_outputs, out.seeded, settings, out.kind, rec)
        _count_hit(rec)
        return _kept_runner(out, mod)
    try:
        if not out.current():
            raise _Fallback("the entry was written by another version of kiln (save torch's "
                            "precompile cache again: python -m kiln warm)", "internal")
        mod = _load(out.data, out.none_outputs, out.seeded, settings, out.kind, rec)
        runner = _kept_runner(out, mod)
    except Exception as e:
        # torch's precompile has no fallback of its own once Dynamo's part
        # is loaded (an exception here fails torch.compile): the ATen graph
        # the entry kept runs eagerly
        f = e if isinstance(e, _Fallback) else _Fallback(f"{type(e).__name__}: {e}", "internal")
        try:
            eager = out.eager()
        except Exception:
            eager = None
        if eager is None or settings.strict:
            raise KilnError(f"kiln: {f}", code=f.code) from e
        rec.update(source="eager", runs_with="eager", why=str(f))
        _count_hit(rec)
        _warn(settings, ("precompiled", f.code), f"kiln: {f}; this {out.kind} graph (from "
              f"torch's precompile cache) runs eagerly")
        return eager
    _count_hit(rec)
    return runner


def _count_hit(rec):
    """Counts a graph torch's cache gave back (records(), stats())."""
    with _state.lock:
        _state.records.append(rec)
        _state.counts["graphs"] += 1
        _state.counts["aot_cache"] += 1
    hits = getattr(_tls, "hits", None)
    if hits is not None:
        hits.append(rec)


def _kept_runner(out, mod):
    """The runner of a loaded entry: as on a cold compile, a plan without
    kernels runs as its ATen graph (when the entry kept it)."""
    if not mod._kernels:
        eager = out.eager()
        if eager is not None:
            return eager
    return _runner(mod)


# ---------------------------------------------------------------------------
# the Dynamo backends


def _fallback_backend(gm, example_inputs, settings, why, key):
    if settings.fallback == "inductor":
        _warn(settings, key, f"kiln: {why}; this graph runs through Inductor")
        from torch._inductor.compile_fx import compile_fx
        cfg = {} if settings.torch_mode in (None, "default") else {"mode": settings.torch_mode}
        if cfg:
            from torch._inductor import list_mode_options
            return compile_fx(gm, example_inputs, config_patches=list_mode_options(
                settings.torch_mode))
        return compile_fx(gm, example_inputs)
    _warn(settings, key, f"kiln: {why}; this graph runs eagerly")
    return gm.forward


def kiln(gm, example_inputs, mode=None, options=None):
    """The Dynamo backend registered as "kiln" (entry point
    torch_dynamo_backends). mode and options come from torch.compile."""
    import torch
    settings = _Settings(mode, options)
    settings.dynamic = _dynamic_flag()
    strict = settings.strict or _fullgraph()
    settings.strict = strict
    devs = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if devs - {"cpu"}:
        why = (f"{'/'.join(sorted(devs - {'cpu'}))} tensors: kiln compiles for the CPU only "
               f"until its CUDA backend exists")
        if strict:
            raise KilnError(f"kiln: {why}", code="unsupported_op")
        _record("dynamo", gm, why).update(source="fallback", runs_with=settings.fallback)
        return _fallback_backend(gm, example_inputs, settings, why, ("device",))
    try:
        _client(settings.socket)
    except KilnError as e:
        why = f"kilnd is not available ({e.code}): {e}"
        if strict:
            raise KilnError(f"kiln: {why}", code=e.code) from e
        _record("dynamo", gm, why).update(source="fallback", runs_with=settings.fallback)
        return _fallback_backend(gm, example_inputs, settings, why, ("down",))
    from torch._dynamo.backends.common import aot_autograd
    use = _aot_cache_use(settings)
    if use is not None:
        wrap, cached, ctx = use
        fw, bw, inf = (wrap(cached, _aten_compiler(settings, k, cached))
                       for k in ("forward", "backward", "inference"))
    else:
        ctx = contextlib.nullcontext()
        fw, bw, inf = (_aten_compiler(settings, k, None) for k in ("forward", "backward",
                                                                   "inference"))
    aot = aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inf)
    prior = getattr(_tls, "settings", None)
    _tls.settings = settings
    _tls.hits = []
    n0 = len(_state.records)
    try:
        with ctx:
            out = aot(gm, example_inputs)
        _forget_failed_hits(n0)
        return out
    except Exception as e:
        if _restart is not None and isinstance(e, _restart):
            # Dynamo's own control flow (e.g. a float argument such as
            # dropout's p under dynamic=True: it re-traces with the float
            # specialized and calls the backend again), not a failure
            raise
        f = e
        while f is not None and not isinstance(f, _Fallback):
            f = f.__cause__ or f.__context__
        if f is None:
            if strict:
                raise
            f = _Fallback(f"AOTAutograd failed: {type(e).__name__}: {e}", "internal")
        if strict:
            raise KilnError(f"kiln: {f}", code=f.code) from e
        rec = getattr(f, "record", None)
        if rec is not None:
            rec.update(source="fallback", runs_with=settings.fallback)
        else:
            _record("dynamo", gm, str(f)).update(source="fallback", runs_with=settings.fallback)
        return _fallback_backend(gm, example_inputs, settings, str(f), ("graph", f.code, str(f)))
    finally:
        _tls.settings = prior
        _tls.hits = None


def _register():
    """Registers kiln with Dynamo when this module is imported, so that
    torch.compile(backend="kiln") finds it at once. Otherwise Dynamo's first
    lookup of a name it does not know imports all of its own backends and
    scans the installed packages' entry points: 14 ms, of which 6 ms are not
    spent anyway (the rest imports modules torch.compile needs later),
    measured on the 2-core VM, part of every warm first call. Skipped where
    Dynamo already knows the name from the entry point (it may be importing
    this module to load it)."""
    try:
        from torch._dynamo.backends import registry
    except Exception:  # a torch without Dynamo: the entry point still works
        return
    if "kiln" not in registry._BACKENDS and "kiln" not in registry._COMPILER_FNS:
        registry.register_backend(kiln, name="kiln")


_register()


def _mend_source_pickling():
    """Makes Dynamo's DefaultsSource survive a pickle round trip where this
    torch's does not, so that torch's precompile (TORCH_CACHING_PRECOMPILE=1)
    can load what it saved. torch 2.11's Source.__reduce__ (torch/_guards.py,
    dataclass_with_cached_hash) pickles every dataclass field, the init=False
    ones too, and unpickling passes them all to the constructor:
    DefaultsSource (a guard on a function's default argument, as in Hugging
    Face BERT's forward) then fails to load with "DefaultsSource.__init__()
    takes from 3 to 4 positional arguments but 6 were given", and so does
    torch.compile() of the whole model, whatever the backend. It is the only
    Source with init=False fields in torch 2.11. When a round trip of one
    fails, its __reduce__ pickles the constructor's fields only
    (__post_init__ derives the others again), and its constructor also takes
    every field, as entries saved without this mend (by another process, or
    with Inductor) hold them, and drops the derived ones. A torch that
    pickles it right is left as it is; True when something was mended."""
    try:
        import dataclasses
        import functools
        import pickle

        from torch._dynamo import source as S
        cls = S.DefaultsSource
        fields = dataclasses.fields(cls)
        if all(f.init for f in fields):
            return False
        saved = pickle.dumps(cls(S.LocalSource("kiln"), 0))
    except Exception as e:  # a torch without these, or another shape: left as it is
        log.info("kiln: Dynamo's DefaultsSource pickling not checked: %s: %s",
                 type(e).__name__, e)
        return False
    try:  # only the load's TypeError is the bug mended here
        pickle.loads(saved)
        return False  # it pickles right
    except TypeError:
        pass
    except Exception as e:
        log.info("kiln: Dynamo's DefaultsSource pickling not mended: %s: %s",
                 type(e).__name__, e)
        return False

    def reduce_init_fields(self):
        return (type(self), tuple(getattr(self, f.name) for f in fields if f.init))

    old_init = cls.__init__

    @functools.wraps(old_init)
    def init_all_fields(self, *args, **kwargs):
        if len(args) == len(fields) and not kwargs:  # every field, the derived ones too
            args = tuple(a for a, f in zip(args, fields) if f.init)
        old_init(self, *args, **kwargs)

    cls.__reduce__ = reduce_init_fields
    cls.__init__ = init_all_fields
    return True


_mend_source_pickling()


def _aot_cache_use(settings):
    """(SerializableAOTDispatchCompiler, KilnOutput, the patches around
    kiln's AOTAutograd call) when kiln's graphs go into torch's AOTAutograd
    cache now, else None: turned off, kiln.explain, a torch without the
    pieces (never an error), or torch's cache not in use -- then nothing is
    patched and the backward compiles lazily, as before."""
    if not settings.aot_cache or _aot_cache_off:
        return None
    try:
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
        from . import _aotcache
        return SerializableAOTDispatchCompiler, _aotcache.KilnOutput, _aotcache.patches(settings)
    except Exception as e:  # ImportError, a torch without these configs, ...
        log.info("kiln: torch's AOTAutograd cache is not used: %s: %s", type(e).__name__, e)
        return None


def _forget_failed_hits(n0):
    """After kiln's AOTAutograd call: when some graphs came back from torch's
    cache but the entry as a whole could not be used (a later graph of it
    failed to load, so AOTAutograd traced and compiled them all again), the
    records and counts of those first loads are dropped: each graph is
    counted once, as what ran."""
    hits = getattr(_tls, "hits", None) or []
    new = _state.records[n0:]
    if not hits or all(r.get("aot_cache") for r in new):
        return
    with _state.lock:
        for rec in hits:
            if rec in _state.records:
                _state.records.remove(rec)
                _state.counts["graphs"] -= 1
                _state.counts["aot_cache"] -= 1
                src = rec.get("source")
                if src in _state.counts and src not in ("graphs", "aot_cache"):
                    _state.counts[src] -= 1


try:
    from torch._dynamo.exc import RestartAnalysis as _restart
except ImportError:  # pragma: no cover (torch without it)
    _restart = None

kiln.compiler_name = "kiln"


# ---------------------------------------------------------------------------
# in-process: kilnc, no daemon (tests, debugging)


def _kilnc():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    build = os.environ.get("KILN_BUILD_DIR", os.path.join(root, "build"))
    return os.environ.get("KILNC", os.path.join(build, "compiler", "kilnc"))


def compile_bytes(graph_bytes: bytes) -> bytes:
    """Graph v1 bytes → artifact bytes, with kilnc."""
    import subprocess
    import tempfile
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
    runner = _boxed(mod)
    runner.kiln_module = mod
    return runner


def kiln_local(gm, example_inputs):
    from torch._dynamo.backends.common import aot_autograd
    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph)(gm, example_inputs)
