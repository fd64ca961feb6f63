"""python -m kiln (the console script ``kiln``): status, warm, explain.

    kiln status [--json]              kilnd's status: `kilnctl status` when kilnctl is found
    kiln warm SCRIPT [ARGS...]        run SCRIPT, compiling every graph it gives kiln through
                                      kilnd, with a progress line; a summary at the end
    kiln explain SCRIPT [ARGS...]     run SCRIPT, then report what kiln did with its graphs
    kiln explain --model NAME         the same for a model: a corpus model (mlp, cnn, ... of
                                      tests/data/capture_corpus.py) or module:factory

``warm`` and ``explain SCRIPT`` run the script in this process (runpy, as
``__main__``, with sys.argv = [SCRIPT, *ARGS]); a ``torch.compile`` call
with the default backend is routed to backend="kiln" meanwhile.
"""
import argparse
import contextlib
import functools
import json
import os
import runpy
import shutil
import subprocess
import sys
import threading
import time
import traceback

from . import __version__

PROG = "kiln"
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))  # the checkout, if any


class _Usage(Exception):
    """A command-line mistake: message on stderr, exit status 2."""


def _err(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------
# status


def _kilnctl_candidates():
    """kilnctl next to the libkiln kiln.runtime would load, without loading
    it (importing kiln.runtime imports torch): $KILN_LIB's directory, the
    build trees ($KILN_BUILD_DIR, build/ of this checkout or of the one
    whose .venv runs us), then $PATH."""
    def near(libdir):
        return [os.path.join(libdir, "kilnctl", "kilnctl"),
                os.path.join(libdir, "..", "bin", "kilnctl"),
                os.path.join(libdir, "..", "..", "bin", "kilnctl")]

    cands = []
    if os.environ.get("KILN_LIB"):
        cands += near(os.path.dirname(os.path.abspath(os.environ["KILN_LIB"])))
    builds = [os.environ["KILN_BUILD_DIR"]] if os.environ.get("KILN_BUILD_DIR") else []
    builds += [os.path.join(r, "build") for r in (_ROOT, os.path.dirname(sys.prefix))]
    for b in builds:
        if os.path.exists(os.path.join(b, "clients", "libkiln.so")):
            cands.append(os.path.join(b, "clients", "kilnctl", "kilnctl"))
    return cands


def find_kilnctl():
    """The kilnctl to run for `kiln status`, or None."""
    for c in _kilnctl_candidates():
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.normpath(c)
    w = shutil.which("kilnctl")
    if w:
        return w
    try:  # libkiln found elsewhere (pkg-config, a prefix): kilnctl beside it
        from .runtime import lib
        path = getattr(lib(), "_kiln_path", "")
    except Exception:
        return None
    if os.path.isabs(path):
        d = os.path.dirname(os.path.realpath(path))
        for c in (os.path.join(d, "..", "bin", "kilnctl"),
                  os.path.join(d, "..", "..", "bin", "kilnctl")):
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return os.path.normpath(c)
    return None


def _fmt_value(v):
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt_value(x) for x in v) or "none"
    return str(v)


def status_text(reply, hello=None, socket=None):
    """The status reply as readable lines (when kilnctl is not at hand)."""
    head = "kilnd"
    if hello:
        head += f" {hello.get('version', '?')} (protocol {hello.get('protocol', '?')})"
    if socket:
        head += f" at {socket}"
    lines = [head]
    body = {k: v for k, v in reply.items() if k not in ("v", "id", "ok")}
    stats = body.pop("stats", {})
    for k, v in list(stats.items()) + list(body.items()):
        lines.append(f"  {k:<18} {_fmt_value(v)}")
    return "\n".join(lines)


def _status_python(as_json):
    try:
        from .runtime import Client, KilnError
    except ImportError as e:
        _err(f"cannot reach kilnd: kilnctl is not found and kiln.runtime needs {e.name}")
        return 1
    try:
        c = Client(os.environ.get("KILN_SOCKET") or None, autostart=0)
        try:
            reply = c.call("status")
            try:
                hello = c.call("hello")
            except KilnError:
                hello = None
        finally:
            c.close()
    except KilnError as e:
        _err(f"kilnd is not reachable: {e}")
        return 1
    if as_json:
        print(json.dumps({k: v for k, v in reply.items() if k not in ("v", "id", "ok")},
                         indent=2, default=str))
    else:
        print(status_text(reply, hello, c.socket))
    return 0


def cmd_status(a):
    ctl = find_kilnctl()
    if ctl:
        cmd = [ctl, "status"] + (["--json"] if a.json else [])
        try:
            rc = subprocess.call(cmd)
        except OSError as e:
            _err(f"cannot run {ctl}: {e}; asking kilnd directly")
        else:
            # kilnctl: 1 error reply, 3 not reachable, 4 permission denied, ...
            return 0 if rc == 0 else 1
    return _status_python(a.json)


# ---------------------------------------------------------------------------
# running a script


class _Stderr:
    """Writes kiln's lines to stderr; with a live progress line on a tty,
    clears it first and redraws it after (see _Clearing)."""

    def __init__(self):
        self.stream = sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.lock = threading.RLock()
        self.live = None  # callable -> the progress line, or None
        self.drawn = False  # the progress line is on the screen
        self.bol = True  # the script's last output ended a line

    def line(self, msg):
        with self.lock:
            self._wipe()
            self.stream.write(msg + "\n")
            self._draw()
            self.stream.flush()

    def redraw(self):
        with self.lock:
            self._draw()
            self.stream.flush()

    def _wipe(self):
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def _draw(self):
        if self.tty and self.live and self.bol:
            cols = shutil.get_terminal_size((100, 24)).columns
            self.stream.write("\r\x1b[K" + self.live()[:max(20, cols - 1)])
            self.drawn = True

    def clear(self):
        with self.lock:
            self._wipe()
            self.live = None


class _Clearing:
    """sys.stdout / sys.stderr for the script while a progress line is
    live: a write wipes the progress line first; it is redrawn (by the
    ticker) once the script's output ends a line."""

    def __init__(self, stream, out):
        self._stream = stream
        self._out = out

    def write(self, s):
        with self._out.lock:
            self._out._wipe()
            n = self._stream.write(s)
            if s:
                self._out.bol = s.endswith("\n")
            self._stream.flush()
            return n

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _clearing(out):
    if not out.tty:
        yield
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Clearing(sys.stdout, out), _Clearing(sys.stderr, out)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _name(obj):
    if obj is None:
        return ""
    return getattr(obj, "__qualname__", None) or type(obj).__name__


@contextlib.contextmanager
def route_torch_compile(note):
    """While active, torch.compile(...) without backend= uses backend="kiln"
    (unless its options= are Inductor's, which kiln does not take); note(msg)
    says so for each call."""
    import torch
    from . import backend as kb
    orig = torch.compile

    @functools.wraps(orig)
    def compile(*args, **kwargs):
        model = args[0] if args else kwargs.get("model")
        if "backend" not in kwargs:
            opts = kwargs.get("options") or {}
            if set(opts) - kb.OPTIONS:
                note(f"torch.compile({_name(model)}) with Inductor options "
                     f"{sorted(set(opts) - kb.OPTIONS)}: left on Inductor")
            else:
                kwargs["backend"] = "kiln"
                note(f"torch.compile({_name(model)}): the default backend is routed to "
                     f"backend=\"kiln\"")
        return orig(*args, **kwargs)

    torch.compile = compile
    try:
        yield
    finally:
        torch.compile = orig


def run_script(path, args, out):
    """Runs path as __main__ with sys.argv = [path, *args]. Returns
    (rc, exit): rc 0 when it finished, 1 when it raised (the traceback is
    printed, from the script's frames on), 130 on ^C; exit is the
    script's SystemExit, to be raised again by the caller."""
    apath = os.path.abspath(path)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [path] + list(args)
    if sys.path:
        sys.path[0] = os.path.dirname(apath)
    else:
        sys.path.insert(0, os.path.dirname(apath))
    try:
        runpy.run_path(apath, run_name="__main__")
        return 0, None
    except SystemExit as e:
        return 0, e
    except KeyboardInterrupt:
        out.clear()
        out.line(f"{PROG}: interrupted")
        return 130, None
    except BaseException as e:  # noqa: B902 -- the script's failure, reported
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != apath:
            tb = tb.tb_next
        out.clear()
        sys.stdout.flush()
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        sys.stderr.flush()
        return 1, None
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0


def _check_script(path):
    if not os.path.isfile(path):
        raise _Usage(f"cannot open script {path!r}: no such file")


# ---------------------------------------------------------------------------
# warm


class _Warm:
    """The progress of `kiln warm`: counts per graph done; on a tty a bar
    redrawn every 0.2 s, otherwise one line per graph."""

    BAR = 16

    def __init__(self, out):
        from ._explain import HIT_SOURCES, MISS_SOURCES
        self.hit, self.miss = HIT_SOURCES, MISS_SOURCES
        self.out = out
        self.t0 = time.monotonic()
        self.marks = []  # one char per graph done: # compiled, = cached, x fallback
        self.active = None
        self.n_compiled = self.n_cached = self.n_fallback = 0
        self.stop = threading.Event()
        self.ticker = None

    def start(self):
        if self.out.tty:
            self.out.live = self.line
            self.ticker = threading.Thread(target=self._tick, name="kiln-warm", daemon=True)
            self.ticker.start()

    def _tick(self):
        while not self.stop.wait(0.2):
            self.out.redraw()

    def close(self):
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
        self.out.clear()

    def counts(self):
        n = len(self.marks)
        return (f"{n} graph{'' if n == 1 else 's'}: {self.n_compiled} compiled, "
                f"{self.n_cached} cached, {self.n_fallback} fallbacks")

    def line(self):
        marks = "".join(self.marks)
        if len(marks) > self.BAR:  # proportional, in the same order
            n = len(marks)
            c = round(self.BAR * self.n_compiled / n)
            h = round(self.BAR * self.n_cached / n)
            marks = "#" * c + "=" * h + "x" * max(0, self.BAR - c - h)
        doing = ""
        a = self.active
        if a is not None:
            spin = "|/-\\"[int(time.monotonic() * 5) % 4]
            doing = f" | {spin} {a['kind']} ({a['nodes']} nodes)"
        return (f"kiln warm [{marks:<{self.BAR}}] {self.counts()} | "
                f"{time.monotonic() - self.t0:.1f} s{doing}")

    def event(self, what, entry):
        from ._explain import SOURCE_TEXT, fallback_text, graph_info
        if what == "start":
            self.active = entry
            if self.out.tty:
                self.out.redraw()
            return
        self.active = None
        g = graph_info(entry, len(self.marks) + 1)
        if g["fallback"]:
            self.n_fallback += 1
            self.marks.append("x")
            how = fallback_text(g)
        elif g["source"] in self.miss:
            self.n_compiled += 1
            self.marks.append("#")
            how = f"{SOURCE_TEXT[g['source']]} in {g['compile_ms']:.0f} ms"
        else:
            self.n_cached += 1
            self.marks.append("=")
            how = SOURCE_TEXT.get(g["source"], g["source"])
        if self.out.tty:
            self.out.redraw()
        else:
            self.out.line(f"kiln warm: graph {g['index']} ({g['kind']}, {g['nodes']} nodes): "
                          f"{how} -- {self.counts()}, {time.monotonic() - self.t0:.1f} s")


def summary_lines(graphs, seconds, verb="warm"):
    from ._explain import HIT_SOURCES, MISS_SOURCES, fallback_text, totals_of
    t = totals_of(graphs)
    by = t["by_source"]
    if not graphs:
        return [f"kiln {verb}: the script gave kiln no graph in {seconds:.1f} s "
                f"(does it call torch.compile?)"]
    cached = ", ".join(f"{s} {by[s]}" for s in HIT_SOURCES if by.get(s))
    joined = f" ({by['joined']} joined)" if by.get("joined") else ""
    lines = [f"kiln {verb}: {len(graphs)} graphs in {seconds:.1f} s: "
             f"{t['misses']} compiled by kilnd{joined}, "
             f"{t['hits']} already cached{f' ({cached})' if cached else ''}, "
             f"{t['fallbacks']} fallbacks"]
    kms = sum(g["compile_ms"] for g in graphs if g["source"] in MISS_SOURCES)
    if kms:
        lines.append(f"  kilnd compile time: {kms / 1e3:.2f} s")
    for g in graphs:
        if g["fallback"]:
            lines.append(f"  fallback: graph {g['index']} ({g['kind']}, {g['nodes']} nodes), "
                         f"{fallback_text(g)}: {g['why']}")
    return lines


def cmd_warm(a):
    _check_script(a.script)
    out = _Stderr()
    from . import backend as kb
    from ._explain import Observer
    from .runtime import KilnError
    socket = os.environ.get("KILN_SOCKET") or None
    try:
        client = kb._client(socket)
    except KilnError as e:
        _err(f"warm: kilnd is not available ({e.code}): {e}")
        return 1
    out.line(f"kiln warm: running {a.script} with kilnd at {client.socket}")
    prog = _Warm(out)
    t0 = time.monotonic()
    exit_ = None
    with Observer(on_event=prog.event, aot_cache=True) as obs:
        prog.start()
        try:
            with route_torch_compile(lambda m: out.line(f"kiln warm: {m}")), _clearing(out):
                rc, exit_ = run_script(a.script, a.args, out)
        finally:
            prog.close()
    for line in summary_lines(obs.graphs(), time.monotonic() - t0):
        out.line(line)
    _save_precompile(out)
    if exit_ is not None:
        raise exit_
    return rc


def _save_precompile(out):
    """Under torch's precompile (TORCH_CACHING_PRECOMPILE=1), writes what the
    script compiled to torch's Dynamo cache: a later process loads it at
    torch.compile() and neither Dynamo nor AOTAutograd traces."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch._dynamo.config, "caching_precompile", False):
        return
    try:
        torch.compiler.save_cache_artifacts()
    except Exception as e:  # the compiles themselves are kept either way
        out.line(f"kiln warm: torch's precompile cache was not saved: {type(e).__name__}: {e}")
        return
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    out.line(f"kiln warm: saved torch's precompile cache (TORCH_CACHING_PRECOMPILE=1) "
             f"under {cache_dir()}")


# ---------------------------------------------------------------------------
# explain


def _corpus():
    """tests/data/capture_corpus.py of this checkout (or of the current
    directory), imported; None when there is none."""
    import importlib.util
    for root in (_ROOT, os.getcwd()):
        path = os.path.join(root, "tests", "data", "capture_corpus.py")
        if os.path.isfile(path):
            if "capture_corpus" in sys.modules:
                return sys.modules["capture_corpus"]
            spec = importlib.util.spec_from_file_location("capture_corpus", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["capture_corpus"] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                del sys.modules["capture_corpus"]
                raise
            return mod
    return None


def load_model(spec):
    """NAME (corpus) or module:factory -> (model, args, train, title)."""
    import importlib
    if ":" in spec:
        modname, attr = spec.split(":", 1)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = importlib.import_module(modname)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise _Usage(f"--model {spec}: {e}") from e
        factory = obj
    else:
        cc = _corpus()
        if cc is None:
            raise _Usage(f"--model {spec}: no model corpus here (tests/data/capture_corpus.py "
                         f"of a kiln checkout); use module:factory")
        if spec not in cc.MODELS:
            raise _Usage(f"--model {spec}: not a corpus model; one of {', '.join(cc.MODELS)}, "
                         f"or module:factory")
        factory = cc.MODELS[spec]
    if not callable(factory):
        raise _Usage(f"--model {spec}: not callable")
    r = factory()
    if not isinstance(r, (tuple, list)) or len(r) < 2:
        raise _Usage(f"--model {spec}: the factory must return (model, args) or "
                     f"(model, args, train, ...)")
    model, args = r[0], r[1]
    if not isinstance(args, (tuple, list)):
        args = (args,)
    train = bool(r[2]) if len(r) > 2 else False
    return model, tuple(args), train


def cmd_explain(a):
    if (a.model is None) == (a.script is None):
        raise _Usage("explain: give a SCRIPT or --model NAME (not both)")
    if a.model is not None:
        if a.args:
            raise _Usage(f"explain --model: unexpected arguments {a.args}")
        from ._explain import explain
        model, args, train = load_model(a.model)
        if a.train is not None:
            train = a.train
        report = explain(model, *args, train=train, steps=a.steps)
        report.title = f"--model {a.model}, {'training' if train else 'inference'}"
        _print_report(report, a.json)
        return 0
    _check_script(a.script)
    out = _Stderr()
    from ._explain import Observer, Report, build_times
    t0 = time.perf_counter()
    with Observer() as obs:
        with route_torch_compile(lambda m: out.line(f"kiln explain: {m}")):
            rc, exit_ = run_script(a.script, a.args, out)
    wall = (time.perf_counter() - t0) * 1e3
    graphs = obs.graphs()
    report = Report(a.script, graphs, build_times(obs, graphs, wall, first_call=False),
                    obs.graph_breaks, obs.dynamo_graphs, total_label="script")
    sys.stdout.flush()
    _print_report(report, a.json)
    if exit_ is not None:
        raise exit_
    return rc


def _print_report(report, as_json):
    if as_json:
        print(json.dumps(report.as_dict(), indent=1, default=str))
    else:
        print(report)
    sys.stdout.flush()


# ---------------------------------------------------------------------------


def _parser():
    p = argparse.ArgumentParser(
        prog=PROG, description="kiln: compile PyTorch graphs through the kilnd server.")
    p.add_argument("-V", "--version", action="version", version=f"kiln {__version__}")
    p.add_argument("--socket", metavar="PATH",
                   help="kilnd's socket (default: $KILN_SOCKET, else kilnd's discovery)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = sub.add_parser("status", help="kilnd's status (kilnctl status)",
                       description="kilnd's status: runs `kilnctl status` when kilnctl is "
                                   "found, else asks kilnd through libkiln. Exit status 1 "
                                   "when kilnd is not reachable.")
    s.add_argument("--json", action="store_true", help="the status reply as JSON")
    s.set_defaults(func=cmd_status)

    w = sub.add_parser("warm", help="run a script, compiling all its graphs through kilnd",
                       description="Runs SCRIPT (as __main__, sys.argv = [SCRIPT, ARGS...]) "
                                   "with every graph it gives the kiln backend compiled "
                                   "through kilnd; torch.compile with the default backend "
                                   "uses kiln meanwhile. Progress on stderr, a summary at the "
                                   "end. Exit status: the script's (1 if it raised).")
    w.add_argument("script", metavar="SCRIPT")
    w.add_argument("args", metavar="ARGS", nargs=argparse.REMAINDER)
    w.set_defaults(func=cmd_warm)

    e = sub.add_parser("explain", help="what kiln does with a script's or a model's graphs",
                       description="Runs SCRIPT (as warm does) or compiles and runs a model, "
                                   "then reports each graph (kernels, fallback ops, cache "
                                   "source), cache hits and misses, graph breaks and where "
                                   "the time went.")
    e.add_argument("--model", metavar="NAME",
                   help="a corpus model (tests/data/capture_corpus.py: mlp, cnn, ...) or "
                        "module:factory, a callable returning (model, args[, train, ...])")
    tr = e.add_mutually_exclusive_group()
    tr.add_argument("--train", dest="train", action="store_true", default=None,
                    help="--model: forward + backward (default: the factory's choice)")
    tr.add_argument("--inference", dest="train", action="store_false",
                    help="--model: inference only, under torch.no_grad()")
    e.add_argument("--steps", type=int, default=5, metavar="N",
                   help="--model: calls after the first, for the steady step (default 5)")
    e.add_argument("--json", action="store_true", help="the report as JSON")
    e.add_argument("script", metavar="SCRIPT", nargs="?")
    e.add_argument("args", metavar="ARGS", nargs=argparse.REMAINDER)
    e.set_defaults(func=cmd_explain)
    return p


def main(argv=None):
    p = _parser()
    a = p.parse_args(argv)
    if a.cmd is None:
        p.print_help(sys.stderr)
        return 2
    saved = os.environ.get("KILN_SOCKET")
    if a.socket:  # for this command (and a script it runs), not after it
        os.environ["KILN_SOCKET"] = a.socket
    try:
        return a.func(a)
    except _Usage as e:
        _err(str(e))
        return 2
    finally:
        if a.socket:
            if saved is None:
                os.environ.pop("KILN_SOCKET", None)
            else:
                os.environ["KILN_SOCKET"] = saved


if __name__ == "__main__":
    sys.exit(main())
