"""kiln.explain: what kiln did with a model, and where the time went.

    report = kiln.explain(model, x)                # inference (under torch.no_grad())
    report = kiln.explain(model, x, train=True)    # forward + backward
    print(report)

explain() resets Dynamo (``torch._dynamo.reset()``, as torch._dynamo.explain
does, so the model is traced afresh; kiln's per-process cache of compiled
graphs stays), compiles the model with the kiln backend (``compile_kwargs``
go to torch.compile: mode, dynamic, fullgraph, options), calls it once --
the first call: tracing, compiling, loading, running -- and ``steps`` more
times for the steady step. With ``train=True`` each call is forward, a loss
(the output when it is a scalar, else the mean of the squared outputs) and
backward; the parameters' gradients are put back as they were afterwards,
and so are the module's buffers (BatchNorm's running statistics).

The report (str() prints it) has one entry per ATen graph kiln was given
(``report.graphs``: dicts with kind, nodes, signature, source, fallback,
why, kernels, kernel_ops, fallback_ops and their times in ms), the totals
(``report.totals``: graphs, hits, misses, fallbacks, by_source, kernels,
fallback_ops, graph_breaks), where the time went (``report.times``, ms) and
Dynamo's graph breaks (``report.graph_breaks``: reason -> count).

``Observer`` watches the kiln backend from outside (it wraps
kiln.backend's _compile_aten, _fallback_backend and export_graph while it
is active); ``python -m kiln warm`` and ``explain SCRIPT`` use it too.
"""
import statistics
import sys
import textwrap
import threading
import time
from collections import Counter

from . import backend as kb

__all__ = ["explain", "Report", "Observer", "HIT_SOURCES", "MISS_SOURCES"]

# where a graph's artifact came from (kiln.backend records' "source")
HIT_SOURCES = ("memory", "disk", "remote", "local", "process")
MISS_SOURCES = ("compiled", "joined")
SOURCE_TEXT = {
    "compiled": "compiled by kilnd",
    "joined": "compiled by kilnd (joined a compile already in flight)",
    "memory": "cache hit: kilnd's memory",
    "disk": "cache hit: kilnd's store (disk)",
    "remote": "cache hit: kilnd's remote store",
    "local": "cache hit: libkiln's in-process cache",
    "process": "cache hit: this process (kiln backend)",
    "eager": "fallback: runs eagerly",
    "fallback": "fallback",
}
MAX_KERNELS_SHOWN = 12
MAX_STEPS_SHOWN = 10
WIDTH = 100


def _wrap(head, text):
    return textwrap.fill(text, WIDTH, initial_indent=head, subsequent_indent="      ",
                         break_on_hyphens=False)


def _in_dynamo():
    """True while Dynamo is compiling a frame in this thread (the backend
    was called from it; a lazily compiled backward graph is not)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        return InstructionTranslator.current_tx() is not None
    except Exception:
        return False


def _short_op(op):
    """"aten.native_layer_norm.default" -> "native_layer_norm"."""
    if not op:
        return "?"
    parts = op.split(".")
    if parts[0] == "aten":
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] == "default":
        parts = parts[:-1]
    return ".".join(parts)


class Observer:
    """Watches every graph handed to the kiln backend while active (a
    context manager; nestable). ``on_event(what, entry)`` is called with
    what = "start" before a graph is compiled and "done" after (entry: a
    dict, see graphs()). Also takes Dynamo's compile time, graph breaks and
    graph count over the same span.

    aot_cache: leave torch's AOTAutograd cache to the backend (kiln warm:
    the run fills it for the jobs after it; a graph it gives back is
    observed too). Off (explain): every graph is traced and exported, so
    the report shows each one's export."""

    def __init__(self, on_event=None, aot_cache=False):
        self.on_event = on_event
        self.aot_cache = aot_cache
        self.entries = []
        self.active = None  # the entry being compiled now, if any
        self._lock = threading.Lock()
        self._tls = threading.local()
        self.t0 = self.t1 = None
        self.dynamo_ms = None
        self.graph_breaks = Counter()
        self.dynamo_graphs = 0

    # -- patching ---------------------------------------------------------
    def __enter__(self):
        import torch._dynamo.utils as du
        self._saved = (kb._compile_aten, kb._fallback_backend, kb.export_graph,
                       kb._aot_cache_off, kb._load_cached)
        kb._aot_cache_off = not self.aot_cache
        kb._load_cached = self._load_cached
        kb._compile_aten = self._compile_aten
        kb._fallback_backend = self._fallback_backend
        kb.export_graph = self._export_graph
        self._metrics0 = {k: len(v) for k, v in du.compilation_time_metrics.items()}
        self._breaks0 = Counter(du.counters["graph_break"])
        self._unique0 = du.counters["stats"]["unique_graphs"]
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.t1 = time.perf_counter()
        (kb._compile_aten, kb._fallback_backend, kb.export_graph,
         kb._aot_cache_off, kb._load_cached) = self._saved
        import torch._dynamo.utils as du
        m = du.compilation_time_metrics.get("_compile.compile_inner")
        if m is not None:
            self.dynamo_ms = sum(m[self._metrics0.get("_compile.compile_inner", 0):]) * 1e3
        self.graph_breaks = Counter(du.counters["graph_break"]) - self._breaks0
        self.dynamo_graphs = du.counters["stats"]["unique_graphs"] - self._unique0
        return False

    def elapsed(self):
        return (self.t1 or time.perf_counter()) - self.t0

    def _emit(self, what, entry):
        if self.on_event is not None:
            try:
                self.on_event(what, entry)
            except Exception:  # a progress display never breaks a compile
                pass

    def _export_graph(self, gm, example_inputs=None):
        g = self._saved[2](gm, example_inputs)
        self._tls.graph = g
        return g

    def _compile_aten(self, gm, example_inputs, settings, kind):
        nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        return self._observe(kind, nodes, settings.fallback, lambda: self._saved[0](
            gm, example_inputs, settings, kind))

    def _load_cached(self, out):
        """A graph torch's AOTAutograd cache gave back (kb._load_cached)."""
        return self._observe(out.kind, out.nodes, "eager", lambda: self._saved[4](out))

    def _observe(self, kind, nodes, fallback_to, call):
        e = {"kind": kind, "nodes": nodes,
             "record": None, "state": "compiling", "in_dynamo": _in_dynamo(), "error": None,
             "fallback_to": fallback_to, "kernel_ops": [], "wall_ms": 0.0,
             "fallback_ms": 0.0, "dynamo_level": False}
        with self._lock:
            self.entries.append(e)
        n0 = len(kb._state.records)
        self._tls.graph = None
        self.active = e
        self._emit("start", e)
        t = time.perf_counter()
        try:
            got = call()  # a Module (_compile_aten) or a runner (_load_cached)
            mod = getattr(got, "kiln_module", got)
            graph = getattr(self._tls, "graph", None)
            e["kernel_ops"] = self._kernel_ops(mod, graph)
            if hasattr(mod, "start_profile"):
                e["module"] = mod
                e["step_ops"] = self._step_ops(mod, graph)
            return got
        except kb._Fallback as ex:
            e["error"] = str(ex)
            raise
        except BaseException as ex:
            e["error"] = f"{type(ex).__name__}: {ex}"
            raise
        finally:
            e["wall_ms"] = (time.perf_counter() - t) * 1e3
            for rec in kb._state.records[n0:]:
                if rec.get("kind") == kind:
                    e["record"] = rec
                    break
            e["state"] = "done"
            self.active = None
            self._tls.graph = None
            self._emit("done", e)

    @staticmethod
    def _kernel_ops(mod, graph):
        """The ATen op each kernel was generated for (the node of its first step)."""
        kernels = getattr(mod, "_kernels", None) or []
        ops = [None] * len(kernels)
        nodes = (graph or {}).get("nodes") or []
        for st in getattr(mod, "_steps", None) or []:
            k, n = st.get("kernel"), st.get("node")
            if st.get("kind") != "kernel" or not isinstance(k, int) or not 0 <= k < len(ops):
                continue
            if ops[k] is None and isinstance(n, int) and 0 <= n < len(nodes):
                ops[k] = _short_op(nodes[n].get("op"))
        return ops

    @staticmethod
    def _step_ops(mod, graph):
        """Per plan step: (kernel name or None for a fallback step, ATen op)."""
        kernels = getattr(mod, "_kernels", None) or []
        nodes = (graph or {}).get("nodes") or []
        out = []
        for st in mod.steps():
            n, k = st.get("node"), st.get("kernel")
            op = st.get("op")
            if op is None and isinstance(n, int) and 0 <= n < len(nodes):
                op = nodes[n].get("op")
            name = None
            if st.get("kind") == "kernel" and isinstance(k, int) and 0 <= k < len(kernels):
                name = kernels[k].get("name")
            out.append((name, _short_op(op) if op else None))
        return out

    def modules(self):
        """(graph index, entry) of every graph kiln runs (profiling)."""
        with self._lock:
            return [(i + 1, e) for i, e in enumerate(self.entries) if e.get("module")]

    def _fallback_backend(self, gm, example_inputs, settings, why, key):
        """A whole Dynamo graph going to the fallback: either an ATen graph
        seen above failed (same message), or kiln refused it before
        AOTAutograd (kilnd down, CUDA tensors, AOTAutograd failed)."""
        e = None
        with self._lock:
            for x in reversed(self.entries):
                if x["error"] == why and "whole" not in x:
                    e = x
                    break
            if e is None:
                e = {"kind": "dynamo", "nodes": sum(1 for n in gm.graph.nodes
                                                    if n.op == "call_function"),
                     "record": None, "state": "compiling", "in_dynamo": True, "error": why,
                     "fallback_to": settings.fallback, "kernel_ops": [], "wall_ms": 0.0,
                     "fallback_ms": 0.0, "dynamo_level": True}
                self.entries.append(e)
                new = True
            else:
                new = False
            e["whole"] = settings.fallback
        if new:
            self.active = e
            self._emit("start", e)
        t = time.perf_counter()
        try:
            return self._saved[1](gm, example_inputs, settings, why, key)
        finally:
            e["fallback_ms"] = (time.perf_counter() - t) * 1e3
            if new:
                e["state"] = "done"
                self.active = None
                self._emit("done", e)

    # -- results ----------------------------------------------------------
    def graphs(self):
        with self._lock:
            entries = list(self.entries)
        return [graph_info(e, i + 1) for i, e in enumerate(entries)]


def graph_info(e, index):
    """One observed graph as a plain dict (Report.graphs' entries)."""
    rec = e.get("record") or {}
    src = rec.get("source")
    if e.get("dynamo_level") or src is None:
        source = "fallback" if e.get("state") == "done" or e.get("error") else "compiling"
    else:
        source = src
    fallback = source in ("fallback", "eager")
    runs_with = None
    if source == "eager":
        runs_with = "eager"
    elif source == "fallback":
        runs_with = e.get("whole") or e.get("fallback_to")
    kernels = list(rec.get("kernels") or [])
    kops = list(e.get("kernel_ops") or [])
    kops += [None] * (len(kernels) - len(kops))
    return {
        "index": index, "kind": e["kind"], "nodes": e["nodes"],
        "signature": rec.get("signature"), "source": source, "fallback": fallback,
        "runs_with": runs_with,
        "why": (e.get("error") or rec.get("why")) if fallback else None,
        "kernels": kernels, "kernel_ops": kops[:len(kernels)],
        "fallback_ops": list(rec.get("fallback_ops") or []),
        "export_ms": rec.get("export_ms", 0.0), "rpc_ms": rec.get("rpc_ms", 0.0),
        "compile_ms": rec.get("compile_ms", 0.0) if source in MISS_SOURCES else 0.0,
        "load_ms": rec.get("load_ms", 0.0), "wall_ms": e.get("wall_ms", 0.0),
        "fallback_ms": e.get("fallback_ms", 0.0), "in_dynamo": e.get("in_dynamo", True),
        "specialized": rec.get("specialized") or 0,
        "specialized_why": rec.get("specialized_why"),
    }


def totals_of(graphs, graph_breaks=None):
    by = Counter(g["source"] for g in graphs)
    hits = sum(by[s] for s in HIT_SOURCES)
    misses = sum(by[s] for s in MISS_SOURCES)
    return {"graphs": len(graphs), "hits": hits, "misses": misses,
            "compiled": misses, "cached": hits,
            "fallbacks": sum(1 for g in graphs if g["fallback"]),
            "by_source": dict(by),
            "kernels": sum(len(g["kernels"]) for g in graphs),
            "fallback_ops": sum(len(g["fallback_ops"]) for g in graphs),
            "graph_breaks": sum((graph_breaks or {}).values())}


def _plural(n, word, many=None):
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _by_source_text(by, sources):
    parts = [f"{s} {by[s]}" for s in sources if by.get(s)]
    return f" ({', '.join(parts)})" if parts else ""


def fallback_text(g):
    who = {"inductor": "Inductor", "eager": "eager"}.get(g["runs_with"], g["runs_with"])
    return f"fallback, runs with {who}" if who else "fallback"


def _blas_core():
    try:
        from .runtime import blas_core
        return blas_core()
    except Exception:  # no libkiln here: nothing ran
        return None


def _pool():
    try:
        from .runtime import pool
        return pool()
    except Exception:  # no libkiln here: nothing ran
        return None


class Report:
    """What kiln did. graphs: list of dicts (see graph_info), totals: dict,
    times: dict of ms (keys below; a missing one was not measured),
    graph_breaks: {reason: count}; title, dynamo_graphs, steps."""

    TIME_ROWS = [
        ("tracing", "Dynamo + AOTAutograd tracing"),
        ("export", "export to Graph v1"),
        ("kilnd", "kilnd round trips"),
        ("load", "loading artifacts"),
        ("backend_other", "other kiln backend work"),
        ("fallback_compile", "fallback compiles"),
        ("first_run", "first run"),
        ("rest", "the rest of the script"),
    ]

    def __init__(self, title, graphs, times, graph_breaks=None, dynamo_graphs=None, steps=0,
                 total_label="first call", profile=None):
        self.title = title
        # the steady steps' plan steps, costliest first (explain with steps)
        self.profile = list(profile or [])
        self.graphs = graphs
        self.graph_breaks = dict(graph_breaks or {})
        self.totals = totals_of(graphs, self.graph_breaks)
        self.times = times
        self.dynamo_graphs = dynamo_graphs
        self.steps = steps
        self.total_label = total_label
        # the kernels OpenBLAS runs, once a product has loaded it
        self.blas = _blas_core()
        # the threads kiln's kernels ran on: (kind, count)
        self.pool = _pool()

    def as_dict(self):
        return {"title": self.title, "graphs": self.graphs, "totals": self.totals,
                "times": self.times, "graph_breaks": self.graph_breaks,
                "dynamo_graphs": self.dynamo_graphs, "blas": self.blas,
                "pool": list(self.pool) if self.pool else None,
                "profile": self.profile}

    def __repr__(self):
        t = self.totals
        return (f"<kiln.explain.Report {self.title}: {t['graphs']} graphs, {t['hits']} hits, "
                f"{t['misses']} misses, {t['fallbacks']} fallbacks>")

    def __str__(self):
        t = self.totals
        out = [f"kiln.explain: {self.title}: {_plural(t['graphs'], 'graph')}"]
        if not self.graphs:
            out.append("  no graph was handed to the kiln backend")
        for g in self.graphs:
            out += ["", self._graph_lines(g)]
            if g["fallback"]:
                if g["why"]:
                    out.append(_wrap("  why: ", g["why"]))
                continue
            ks = [f"{k} {o}" if o else k for k, o in zip(g["kernels"], g["kernel_ops"])]
            more = len(ks) - MAX_KERNELS_SHOWN
            shown = ks[:MAX_KERNELS_SHOWN] + ([f"... (+{more} more)"] if more > 0 else [])
            out.append(_wrap(f"  kernels ({len(ks)}): ", ", ".join(shown) if ks else "none"))
            fb = g["fallback_ops"]
            if fb:
                c = Counter(fb)
                out.append(_wrap(f"  fallback ops ({len(fb)}, run through torch): ",
                                 ", ".join(f"{op} x{n}" if n > 1 else op
                                           for op, n in c.items())))
            if g.get("specialized"):
                out.append(_wrap("  static instances: ",
                                 f"{g['specialized']} (the sizes met so far run their own "
                                 "static artifact, not these symbolic steps)"))
            elif g.get("specialized_why"):
                out.append(_wrap("  no static instances: ", g["specialized_why"]))
            else:
                out.append("  fallback ops: none")
        by = t["by_source"]
        out += ["", f"cache: {_plural(t['hits'], 'hit')}{_by_source_text(by, HIT_SOURCES)}, "
                    f"{_plural(t['misses'], 'miss', 'misses')}"
                    f"{_by_source_text(by, MISS_SOURCES)}, "
                    f"{_plural(t['fallbacks'], 'fallback')}"]
        if self.graph_breaks:
            out.append(f"graph breaks: {sum(self.graph_breaks.values())}")
            for reason, n in sorted(self.graph_breaks.items(), key=lambda kv: -kv[1]):
                reason = " ".join(str(reason).split())
                if len(reason) > 300:
                    reason = reason[:297] + "..."
                out.append(_wrap(f"  {n} x ", reason))
        else:
            dg = self.dynamo_graphs
            dg = "" if dg is None else f" ({_plural(dg, 'Dynamo graph')})"
            out.append(f"graph breaks: none{dg}")
        out += ["", "time (ms):"]
        tm = self.times
        if "total" in tm:
            out.append(f"  {self.total_label:<34}{tm['total']:>10.1f}")
        for key, label in self.TIME_ROWS:
            if key not in tm:
                continue
            line = f"    {label:<32}{tm[key]:>10.1f}"
            if key == "kilnd" and tm.get("kilnd_compile"):
                line += f"   (kilnd compiling: {tm['kilnd_compile']:.1f})"
            if key == "tracing" and tm.get("tracing_estimated"):
                line += "   (estimated)"
            out.append(line)
        if "step" in tm:
            out.append(f"  {'steady step (median of %d)' % self.steps:<34}{tm['step']:>10.2f}")
        if self.profile:
            total = sum(r["ms"] for r in self.profile)
            fb = sum(r["ms"] for r in self.profile if r["kernel"] is None)
            out += ["", f"kiln's plan steps in a steady step: {total:.2f} ms "
                        f"({fb:.2f} in fallback steps); the costliest:"]
            for r in self.profile[:MAX_STEPS_SHOWN]:
                what = r["kernel"] or "fallback step"
                op = f"  {r['op']}" if r["op"] else ""
                out.append(f"  {r['ms']:>9.3f}  graph {r['graph']} ({r['kind']}) "
                           f"step {r['step']}: {what}{op}")
        if self.blas:
            out += ["", f"blas: OpenBLAS with its {self.blas} kernels"]
        if self.pool:
            kind, n = self.pool
            where = ("the OpenMP team torch's ops use" if kind == "openmp"
                     else "kiln's own threads")
            out += [f"threads: kernels run on {where}, {n} at most"]
        return "\n".join(out)

    @staticmethod
    def _graph_lines(g):
        sig = f", signature {g['signature'][:12]}" if g.get("signature") else ""
        if g["kind"] == "dynamo":  # refused before AOTAutograd: a Dynamo (Torch IR) graph
            return (f"graph {g['index']}: a Dynamo graph, {g['nodes']} Torch IR nodes -- "
                    f"{fallback_text(g)}")
        kind = g["kind"]
        src = fallback_text(g) if g["source"] == "fallback" else SOURCE_TEXT.get(
            g["source"], g["source"])
        ms = ""
        if g["source"] in MISS_SOURCES and g["compile_ms"]:
            ms = f" in {g['compile_ms']:.0f} ms"
        return f"graph {g['index']}: {kind}, {g['nodes']} ATen nodes{sig} -- {src}{ms}"


def build_times(obs, graphs, total_ms, first_call=True):
    """Splits total_ms (the first call, or a whole script) into where it went."""
    times = {"total": total_ms}
    wall_in = sum(g["wall_ms"] for g in graphs if g["in_dynamo"])
    wall_out = sum(g["wall_ms"] for g in graphs if not g["in_dynamo"])
    fb = sum(g["fallback_ms"] for g in graphs)
    export = sum(g["export_ms"] for g in graphs)
    rpc = sum(g["rpc_ms"] for g in graphs)
    load = sum(g["load_ms"] for g in graphs)
    times.update(export=export, kilnd=rpc, load=load,
                 kilnd_compile=sum(g["compile_ms"] for g in graphs),
                 backend_other=max(0.0, wall_in + wall_out - export - rpc - load))
    if fb:
        times["fallback_compile"] = fb
    dyn = obs.dynamo_ms
    if dyn is not None:
        times["dynamo"] = dyn
        times["tracing"] = max(0.0, dyn - wall_in - fb)
        rest = max(0.0, total_ms - dyn - wall_out)
    else:  # no Dynamo timing: everything but kiln's own work counts as tracing
        times["tracing"] = max(0.0, total_ms - wall_in - wall_out - fb)
        times["tracing_estimated"] = True
        rest = 0.0
    times["first_run" if first_call else "rest"] = rest
    return times


def _loss(out):
    import torch
    if isinstance(out, torch.Tensor):
        if out.dim() == 0:
            return out
        outs = [out]
    elif isinstance(out, dict):
        outs = list(out.values())
    elif isinstance(out, (list, tuple)):
        outs = list(out)
    else:
        outs = [out]
    ts = [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]
    if not ts:
        raise ValueError("kiln.explain(train=True): the model returned no floating-point tensor")
    return sum(o.float().pow(2).mean() for o in ts)


def _describe(model, train):
    name = getattr(model, "__name__", None) or type(model).__name__
    return f"{name}, {'training (forward + backward)' if train else 'inference'}"


def explain(model, *args, train=False, steps=5, **compile_kwargs):
    """Compiles model with kiln, runs it on args (forward + backward when
    train=True, else under torch.no_grad()) once and then ``steps`` more
    times, and returns a Report. See the module's docstring."""
    import torch

    if "backend" in compile_kwargs and compile_kwargs["backend"] not in ("kiln", kb.kiln):
        raise ValueError("kiln.explain: the backend is kiln's")
    compile_kwargs.pop("backend", None)
    mode = compile_kwargs.get("mode")
    if mode not in kb.MODES:
        raise ValueError(f"kiln.explain: unknown mode {mode!r}")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=kb.kiln, **compile_kwargs)
    is_module = isinstance(model, torch.nn.Module)
    grads = {p: p.grad for p in model.parameters()} if is_module and train else {}
    bufs = [(b, b.detach().clone()) for b in model.buffers()] if is_module else []

    def call():
        if train:
            _loss(compiled(*args)).backward()
        else:
            with torch.no_grad():
                compiled(*args)

    try:
        with Observer() as obs:
            t0 = time.perf_counter()
            call()
            first = (time.perf_counter() - t0) * 1e3
        # the steady step: outside the observer, so it costs what a training
        # loop pays, with each kiln graph's plan steps timed by libkiln (a
        # clock read around each step)
        samples = []
        mods = obs.modules()
        for _, e in mods:
            e["module"].start_profile()
        try:
            for _ in range(max(0, int(steps))):
                t = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t) * 1e3)
        finally:
            profile = _profile_rows(mods, len(samples))
    finally:
        with torch.no_grad():
            for p, g in grads.items():
                p.grad = g
            for b, saved in bufs:
                b.copy_(saved)
    graphs = obs.graphs()
    times = build_times(obs, graphs, first)
    if samples:
        times["step"] = statistics.median(samples)
    return Report(_describe(model, train), graphs, times, obs.graph_breaks, obs.dynamo_graphs,
                  steps=len(samples), profile=profile)


def _profile_rows(mods, n_steps):
    """Stops profiling every module; its plan steps' ms per model step
    (summed over the module's calls, over n_steps), costliest first."""
    rows = []
    for index, e in mods:
        calls, ms = e["module"].stop_profile()
        if not calls or not n_steps:
            continue
        ops = e.get("step_ops") or []
        for i, t in enumerate(ms):
            name, op = ops[i] if i < len(ops) else (None, None)
            rows.append({"graph": index, "kind": e["kind"], "step": i, "kernel": name,
                         "op": op, "ms": t / n_steps, "calls": calls / n_steps})
    rows.sort(key=lambda r: -r["ms"])
    return rows
