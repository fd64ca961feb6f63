"""Integration tests of kilnctl (clients/kilnctl, kilnctl(1)) against a real
kilnd started by conftest.py's fixtures (issue 7, "kilnctl" and "Tests"):

- golden output of `status`, `list` and `settings` with the volatile fields
  (numbers, sizes, times, paths, signatures) masked, kept under golden/
  (KILN_UPDATE_GOLDEN=1 rewrites them);
- every --json output parses with `python3 -m json.tool`;
- `metrics` through a small parser of the Prometheus text format;
- the documented exit status of every command: 0 ok, 1 an error reply,
  2 usage, 3 kilnd not running / not reachable (never auto-started),
  4 permission denied (as nobody, when root), 5 not found;
- what evict, gc, compile, ping, shutdown, verify and status --watch do.

The kilnctl under test is $KILNCTL (default <build>/clients/kilnctl/kilnctl,
with <build> $KILN_BUILD_DIR or build/).
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import pytest


def _conftest():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and os.path.abspath(f) == here:
            return m
    spec = importlib.util.spec_from_file_location("kilnd_it_conftest", here)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


_c = _conftest()
ROOT, GRAPHS_DIR, wait_for = _c.ROOT, _c.GRAPHS_DIR, _c.wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(HERE, "golden")
SIG_RE = re.compile(r"^[0-9a-f]{64}$")
ZERO_SIG = "0" * 64

# exit statuses (kilnctl(1), clients/kilnctl/kilnctl.h)
OK, ERROR, USAGE, DOWN, PERM, NOTFOUND = 0, 1, 2, 3, 4, 5


def kilnctl_path():
    p = os.environ.get("KILNCTL")
    if not p:
        build = os.environ.get("KILN_BUILD_DIR") or os.path.join(ROOT, "build")
        p = os.path.join(build, "clients", "kilnctl", "kilnctl")
    if not os.path.isabs(p):
        p = os.path.join(ROOT, p)
    return p


@pytest.fixture(scope="session")
def kilnctl_bin():
    p = kilnctl_path()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.skip(f"kilnctl not built: {p} is missing (ninja -C build, or set KILNCTL)")
    return p


def graph_file(name):
    return os.path.join(GRAPHS_DIR, name + ".graph.msgpack")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KILN_", "LISTEN_", "NOTIFY_SOCKET"))}
    env.pop("CACHE_DIRECTORY", None)
    env["KILN_AUTOSTART"] = "0"
    env.update(extra or {})
    return env


class Ctl:
    """Runs kilnctl against one socket."""

    def __init__(self, binary, socket_path):
        self.binary = binary
        self.socket = socket_path

    def run(self, *args, socket_path=None, env=None, timeout=120, user=None,
            stdin=subprocess.DEVNULL, text=True, cmd_prefix=()):
        sock = self.socket if socket_path is None else socket_path
        argv = list(cmd_prefix) + [self.binary]
        if sock:
            argv += ["--socket", sock]
        argv += list(args)
        kw = {}
        if user is not None:
            kw.update(user=user, group="nogroup", extra_groups=[])
        return subprocess.run(argv, capture_output=True, text=text, timeout=timeout,
                              env=clean_env(env), stdin=stdin, **kw)

    def ok(self, *args, **kw):
        p = self.run(*args, **kw)
        assert p.returncode == OK, f"kilnctl {' '.join(args)}: rc {p.returncode}\n{p.stderr}"
        assert p.stderr == "", p.stderr
        return p.stdout

    def fails(self, rc, *args, **kw):
        """Runs, expects exit status rc and exactly one "kilnctl: " line on
        stderr; returns that line."""
        p = self.run(*args, **kw)
        assert p.returncode == rc, (
            f"kilnctl {' '.join(args)}: rc {p.returncode}, want {rc}\n"
            f"stdout: {p.stdout}\nstderr: {p.stderr}")
        lines = p.stderr.splitlines()
        assert len(lines) == 1, f"want one line on stderr, got {p.stderr!r}"
        assert lines[0].startswith("kilnctl: "), lines[0]
        return lines[0]


@pytest.fixture
def ctl(kilnctl_bin, kilnd):
    c = Ctl(kilnctl_bin, kilnd.socket_path)
    c.d = kilnd
    return c


def compile_two(ctl):
    """kilnctl compile of two corpus graphs, then the first again (a memory
    hit); returns their signatures."""
    sigs = []
    for name in ("mlp_fwd", "mlp_bwd"):
        out = ctl.ok("compile", graph_file(name))
        sig, source = out.split()[:2]
        assert SIG_RE.match(sig) and source == "compiled", out
        sigs.append(sig)
    out = ctl.ok("compile", graph_file("mlp_fwd"))
    assert out.split()[:2] == [sigs[0], "memory"], out
    return sigs


# ---- golden output -------------------------------------------------------------


def mask(text, d):
    """The volatile parts of kilnctl's human output as placeholders."""
    t = text.replace(d.workdir, "<WORKDIR>")
    t = re.sub(r"\b[0-9a-f]{64}\b", "<SIG>", t)
    t = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<TIME>", t)
    t = re.sub(r"\d+(\.\d+)? (B|KiB|MiB|GiB|TiB|PiB)\b", "<SIZE>", t)
    t = re.sub(r"\d+(\.\d+)? (ms|s)\b", "<MS>", t)
    t = re.sub(r"\b\d+[dhms]( \d+[hms])?\b", "<DUR>", t)
    t = re.sub(r"\[[#.]{20}\] +\d+%", "[<BAR>] N%", t)
    t = re.sub(r"kilnd \d+\.\d+\.\d+", "kilnd <VERSION>", t)
    t = re.sub(r"\((protocol) \d+, (cpu|cuda) [^)\s]+\)", r"(\1 N, \2 <ARCH>)", t)
    t = re.sub(r"worker process(es)?\b", "worker process(es)", t)
    t = re.sub(r"(?<![\w.<])\d+(\.\d+)?", "N", t)
    return t


def check_golden(name, text):
    path = os.path.join(GOLDEN_DIR, name)
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    assert os.path.exists(path), f"{path} missing (KILN_UPDATE_GOLDEN=1 writes it)"
    with open(path) as f:
        want = f.read()
    assert text == want, (
        f"kilnctl output differs from {path} (KILN_UPDATE_GOLDEN=1 rewrites it)\n"
        f"--- want\n{want}--- got\n{text}")


def test_golden_status_list_settings(ctl):
    compile_two(ctl)
    status = ctl.ok("status")
    # every row of the table is there, and the store has its bar
    for label in ("uptime", "connections", "requests", "hit rate", "compiles",
                  "queue", "workers", "store", "latency", "hot map", "errors"):
        assert re.search(r"^  %s " % re.escape(label), status, re.M), status
    assert re.search(r"\[[#.]{20}\] +\d+%", status), status
    assert "compile p50 " in status and ", p99 " in status
    check_golden("kilnctl_status.txt", mask(status, ctl.d))

    listing = ctl.ok("list")
    assert len(re.findall(r"^[0-9a-f]{64}  cpu ", listing, re.M)) == 2, listing
    check_golden("kilnctl_list.txt", re.sub(r" {2,}", "  ", mask(listing, ctl.d)))

    settings = ctl.ok("settings")
    assert re.search(r"^workers +2$", settings, re.M), settings
    check_golden("kilnctl_settings.txt", mask_settings(settings, ctl.d))


def mask_settings(text, d):
    # the values are kilnd's settings: only the paths change between runs
    return text.replace(d.workdir, "<WORKDIR>")


def test_status_settings_flag_appends_the_table(ctl):
    out = ctl.ok("status", "--settings")
    assert "\nSETTING" in out and re.search(r"^queue_depth +256$", out, re.M), out


# ---- JSON --------------------------------------------------------------------------


def json_tool(text):
    p = subprocess.run([sys.executable, "-m", "json.tool"], input=text,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"json.tool: {p.stderr}\n{text}"
    return json.loads(text)


def test_json_outputs_parse(ctl):
    sigs = compile_two(ctl)
    st = json_tool(ctl.ok("status", "--json"))
    stats = st["stats"]
    assert stats["requests"]["compile"] >= 2
    assert stats["compiled"] == 2 and stats["hits"]["memory"] >= 1
    assert set(stats) >= {"uptime_s", "rss_bytes", "connections", "requests",
                          "hits", "queue", "workers", "compile_ms", "hot",
                          "store", "errors"}
    both = json_tool(ctl.ok("status", "--json", "--settings"))
    assert both["settings"]["workers"] == "2"
    lst = json_tool(ctl.ok("list", "--json"))
    assert sorted(e["signature"] for e in lst["entries"]) == sorted(sigs)
    assert all(e["target"] == "cpu" and e["size"] > 0 for e in lst["entries"])
    s = json_tool(ctl.ok("settings", "--json"))
    assert s["settings"]["store_dir"] == ctl.d.store_dir
    g = json_tool(ctl.ok("gc", "--json"))
    assert set(g) == {"evicted", "bytes", "entries", "store_bytes"}
    e = json_tool(ctl.ok("evict", sigs[0], "--json"))
    assert e["evicted"] == 1 and e["bytes"] > 0


def test_status_watch(ctl):
    """--watch refreshes until SIGINT (exit 0); with --json, one object a
    line."""
    for args, check in ((["--watch=0.2"], "every"), (["--watch=0.2", "--json"], None)):
        p = subprocess.Popen([ctl.binary, "--socket", ctl.socket, "status"] + args,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=clean_env())
        time.sleep(1.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        if check:
            assert out.count(check) >= 3, out
            assert out.count("  connections  ") >= 3
        else:
            lines = [l for l in out.splitlines() if l]
            assert len(lines) >= 3
            for l in lines:
                assert "stats" in json_tool(l)


def test_status_watch_survives_a_restart(kilnctl_bin, make_kilnd):
    d = make_kilnd(args=["--workers", "1"])
    p = subprocess.Popen([kilnctl_bin, "--socket", d.socket_path, "status",
                          "--watch=0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=clean_env())
    time.sleep(0.6)
    d.stop()
    time.sleep(0.6)
    d.start()
    time.sleep(0.8)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "kilnctl: " in err and "kilnd is not running" in err, err
    # served before and after the restart (uptime starts again)
    assert out.count("  connections  ") >= 2, out


# ---- metrics --------------------------------------------------------------------------

SAMPLE_RE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)\})?'
    r' ([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|Inf))$')


def parse_prometheus(text):
    """A parser of the text exposition format 0.0.4, strict about what
    kiln writes: {family: {"type", "help", "samples": [(labels, value)]}}.
    Every line is a # HELP / # TYPE comment or a sample; a family's
    comments come before its samples, its samples are contiguous, every
    sample's family has a TYPE, counters end in _total."""
    assert text.endswith("\n"), "the text must end in a newline"
    fams, order, current = {}, [], None
    for n, line in enumerate(text.splitlines(), 1):
        assert line, f"line {n} is empty"
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$", line)
            assert m, f"line {n}: not a HELP or TYPE comment: {line!r}"
            kind, name, rest = m.groups()
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if name not in order:
                order.append(name)
            assert not f["samples"], f"line {n}: {kind} of {name} after its samples"
            if kind == "TYPE":
                assert f["type"] is None, f"line {n}: second TYPE of {name}"
                assert rest in ("counter", "gauge"), f"line {n}: type {rest}"
                f["type"] = rest
            else:
                assert f["help"] is None, f"line {n}: second HELP of {name}"
                f["help"] = rest
            current = name
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"line {n}: not a sample: {line!r}"
        name, labels, value = m.group(1), m.group(3), m.group(4)
        assert name in fams and fams[name]["type"], f"line {n}: {name} has no TYPE"
        assert name == current, f"line {n}: {name} is not next to its TYPE"
        lab = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or ""))
        fams[name]["samples"].append((lab, float(value)))
    for name, f in fams.items():
        assert f["type"], f"{name} has no TYPE"
        assert f["help"], f"{name} has no HELP"
        assert name.startswith("kiln_"), name
        if f["type"] == "counter":
            assert name.endswith("_total"), f"counter {name} does not end in _total"
            for _, v in f["samples"]:
                assert v >= 0, f"counter {name} is negative"
        else:
            assert not name.endswith("_total"), f"gauge {name} ends in _total"
    return fams


def sample(fams, name, **labels):
    for lab, v in fams[name]["samples"]:
        if lab == labels:
            return v
    raise AssertionError(f"no sample {name}{labels}")


def test_metrics_parse(ctl):
    compile_two(ctl)
    ctl.fails(NOTFOUND, "evict", ZERO_SIG)
    fams = parse_prometheus(ctl.ok("metrics"))
    st = json.loads(ctl.ok("status", "--json"))["stats"]
    assert fams["kiln_requests_total"]["type"] == "counter"
    assert sample(fams, "kiln_requests_total", op="compile") == st["requests"]["compile"]
    assert sample(fams, "kiln_hits_total", source="memory") == st["hits"]["memory"]
    assert sample(fams, "kiln_compiled_total") == 2
    # A signature kilnd does not have is counted as a miss, not an error.
    assert sample(fams, "kiln_lookup_misses_total") >= 1
    assert fams["kiln_connections_current"]["type"] == "gauge"
    assert fams["kiln_workers_busy"]["type"] == "gauge"
    assert sample(fams, "kiln_workers") == 2  # workers.total, a gauge
    assert fams["kiln_compile_ms"]["type"] == "gauge"
    qs = {lab["quantile"] for lab, _ in fams["kiln_compile_ms"]["samples"]}
    assert qs == {"0.5", "0.9", "0.99"}
    assert sample(fams, "kiln_compile_ms", quantile="0.5") > 0
    assert sample(fams, "kiln_store_entries") == 2
    assert fams["kiln_store_bytes"]["type"] == "gauge"
    assert fams["kiln_store_puts_total"]["type"] == "counter"
    assert fams["kiln_uptime_s"]["type"] == "gauge"
    # every number of the stats map is exported somewhere
    def leaves(m, path=()):
        for k, v in m.items():
            if isinstance(v, dict):
                yield from leaves(v, path + (k,))
            elif isinstance(v, (int, float)):
                yield path + (k,)
    n_samples = sum(len(f["samples"]) for f in fams.values())
    assert n_samples == len(list(leaves(st))), (n_samples, len(list(leaves(st))))


# ---- exit statuses -----------------------------------------------------------------


def test_not_running_says_so_and_starts_nothing(kilnctl_bin, kilnd_binary, workdir):
    ctl = Ctl(kilnctl_bin, os.path.join(workdir, "run", "kilnd.sock"))
    # even with auto-start switched on for libkiln, kilnctl starts nothing
    env = {"KILN_AUTOSTART": "1", "KILND": kilnd_binary}
    for cmd in (["status"], ["list"], ["metrics"], ["ping"], ["settings"],
                ["gc"], ["evict", "--all"], ["shutdown"],
                ["compile", graph_file("mlp_fwd")]):
        line = ctl.fails(DOWN, *cmd, env=env)
        assert line == f"kilnctl: kilnd is not running (no socket at {ctl.socket})", line
    assert not os.path.exists(ctl.socket)
    assert not os.path.exists(os.path.dirname(ctl.socket))
    # the discovered socket: $KILN_SOCKET
    p = ctl.run("status", socket_path="", env={"KILN_SOCKET": ctl.socket})
    assert p.returncode == DOWN and ctl.socket in p.stderr
    # a socket file nobody listens on
    os.makedirs(os.path.dirname(ctl.socket))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(ctl.socket)
    s.close()
    line = ctl.fails(DOWN, "status")
    assert line == f"kilnctl: kilnd is not running (nothing listens on {ctl.socket})"


def test_no_answer_within_timeout(kilnctl_bin, workdir):
    """A listener that accepts and never answers: --timeout, then exit 3."""
    path = os.path.join(workdir, "mute.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except socket.timeout:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        ctl = Ctl(kilnctl_bin, path)
        t0 = time.monotonic()
        line = ctl.fails(DOWN, "--timeout", "0.5", "status")
        assert time.monotonic() - t0 < 10
        assert "did not answer within" in line, line
    finally:
        stop.set()
        t.join()
        srv.close()
        for c in held:
            c.close()


@pytest.mark.parametrize("args", [
    [], ["bogus"], ["status", "--bogus"], ["status", "--watch=x"],
    ["list", "--sort", "name"], ["list", "--limit", "-1"], ["list", "--limit"],
    ["evict"], ["evict", "abc"], ["evict", ZERO_SIG, "--all"],
    ["evict", "--older-than", "3 days"], ["evict", "--older-than", "5x"],
    ["gc", "--max-bytes", "12Q"], ["gc", "extra"], ["compile"],
    ["compile", "a", "b"], ["compile", "f", "--target", "tpu"],
    ["compile", "f", "--target", "cuda:90"], ["compile", "f", "--mode", "fast"],
    ["ping", "--count", "0"], ["settings", "x"], ["shutdown", "--now"],
    ["metrics", "x"], ["verify", "--bogus"], ["--timeout", "x", "status"],
    ["--timeout", "-1", "status"], ["--socket"],
])
def test_usage_errors(kilnctl_bin, args):
    # usage is checked before anything is connected: no daemon needed
    p = subprocess.run([kilnctl_bin] + args, capture_output=True, text=True,
                       timeout=30, env=clean_env({"KILN_SOCKET": "/nonexistent/k.sock"}))
    assert p.returncode == USAGE, (args, p.returncode, p.stderr)
    assert p.stdout == ""
    if args:
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("kilnctl: "), p.stderr
    else:
        assert p.stderr.startswith("usage: kilnctl")


def test_help_and_version(kilnctl_bin):
    for flag in ("--help", "-h"):
        p = subprocess.run([kilnctl_bin, flag], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and p.stderr == ""
        for cmd in ("status", "list", "evict", "gc", "verify", "compile", "ping",
                    "settings", "shutdown", "metrics", "exit status"):
            assert cmd in p.stdout, cmd
    p = subprocess.run([kilnctl_bin, "--version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and re.match(r"^kilnctl \d+\.\d+\.\d+ \(protocol 1\)\n$", p.stdout)


def test_not_found(ctl, workdir):
    line = ctl.fails(NOTFOUND, "evict", ZERO_SIG)
    assert ZERO_SIG in line, line
    line = ctl.fails(NOTFOUND, "compile", os.path.join(workdir, "missing.graph.msgpack"))
    assert "No such file" in line
    line = ctl.fails(NOTFOUND, "verify", "--store", os.path.join(workdir, "nostore"))
    assert "no store at" in line
    os.makedirs(os.path.join(workdir, "notastore"))
    line = ctl.fails(NOTFOUND, "verify", "--store", os.path.join(workdir, "notastore"))
    assert "not a kiln store" in line


def test_error_replies_exit_1(ctl, workdir):
    # kilnd answers unsupported_op: no CUDA backend in this kilnd
    line = ctl.fails(ERROR, "compile", graph_file("mlp_fwd"), "--target", "cuda:sm_90")
    assert "unsupported_op" in line, line
    # a file that is not a graph: the message names it
    bad = os.path.join(workdir, "bad.graph.msgpack")
    with open(bad, "wb") as f:
        f.write(msgpack.packb({"nodes": 3}))
    line = ctl.fails(ERROR, "compile", bad)
    assert "invalid_graph" in line or "bad_frame" in line, line
    with open(bad, "wb") as f:
        f.write(b"not msgpack at all")
    ctl.fails(ERROR, "compile", bad)


@pytest.fixture
def nobody_kilnctl(kilnctl_bin):
    """kilnctl copied where the user nobody can run it."""
    if os.geteuid() != 0:
        pytest.skip("needs root (runs kilnctl as nobody)")
    d = tempfile.mkdtemp(prefix="kilnctl-bin-", dir="/tmp")
    os.chmod(d, 0o755)
    b = os.path.join(d, "kilnctl")
    shutil.copy(kilnctl_bin, b)
    os.chmod(b, 0o755)
    yield b
    shutil.rmtree(d, ignore_errors=True)


def test_permission_denied_as_nobody(nobody_kilnctl, kilnd):
    ctl = Ctl(nobody_kilnctl, kilnd.socket_path)
    # the socket's directories are root's 0700/0750: connect() is refused
    line = ctl.fails(PERM, "status", user="nobody")
    assert "permission denied" in line and kilnd.socket_path in line, line
    # open the socket to everyone: status works, the admin commands do not
    os.chmod(kilnd.workdir, 0o755)
    os.chmod(os.path.dirname(kilnd.socket_path), 0o755)
    os.chmod(kilnd.socket_path, 0o666)
    out = ctl.ok("status", user="nobody")
    assert "  connections  " in out
    ctl.ok("metrics", user="nobody")
    ctl.ok("ping", user="nobody")
    for cmd in (["list"], ["settings"], ["status", "--settings"], ["gc"],
                ["evict", "--all"], ["evict", ZERO_SIG], ["shutdown"]):
        line = ctl.fails(PERM, *cmd, user="nobody")
        assert "permission denied" in line, (cmd, line)
    assert kilnd.running()


# ---- what the commands do ---------------------------------------------------------


def test_compile_sources_dump_and_output(ctl, workdir):
    sigs = compile_two(ctl)
    out = ctl.ok("compile", graph_file("mlp_bwd"), "--dump")
    first, rest = out.split("\n", 1)
    assert first.split()[:2] == [sigs[1], "memory"]
    assert re.search(r"^artifact +kiln\.artifact/1, cpu ", rest, re.M), rest
    assert re.search(r"^kernels +\d+$", rest, re.M)
    assert re.search(r"^  0 +kiln_k0 +extent ", rest, re.M), rest
    assert re.search(r"^steps +\d+: \d+ kernel, 0 fallback$", rest, re.M), rest
    art = os.path.join(workdir, "a.kart")
    out = ctl.ok("compile", graph_file("mlp_fwd"), "-o", art)
    assert out.startswith(sigs[0])
    with open(art, "rb") as f:
        a = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
    assert a["format"] == "kiln.artifact/1" and a["signature"] == sigs[0]
    p = ctl.run("compile", graph_file("mlp_fwd"), "-o", "-", text=False)
    assert p.returncode == 0 and p.stderr == b""
    assert msgpack.unpackb(p.stdout, raw=False, strict_map_key=False)["signature"] == sigs[0]
    # after a restart the store answers: "disk"
    ctl.d.stop()
    ctl.d.start()
    out = ctl.ok("compile", graph_file("mlp_fwd"))
    assert out.split()[:2] == [sigs[0], "disk"], out


def test_evict(ctl):
    sigs = compile_two(ctl)
    assert ctl.ok("evict", sigs[0]).startswith("evicted 1 entry, ")
    assert sigs[0] not in ctl.ok("list")
    ctl.fails(NOTFOUND, "evict", sigs[0].upper())  # upper-case hex is fine
    assert ctl.ok("evict", "--older-than", "1h").startswith("evicted 0 entries")
    time.sleep(2.1)
    assert ctl.ok("evict", "--older-than", "1s").startswith("evicted 1 entry")
    ctl.ok("compile", graph_file("mlp_fwd"))
    ctl.ok("compile", graph_file("mlp_bwd"))
    out = ctl.ok("evict", "--all")
    assert out.startswith("evicted 2 entries, ") and not out.endswith(" 0 B freed\n")
    assert ctl.ok("list").splitlines()[-1].startswith("0 entries")
    # evicted from the hot map too: the next compile compiles
    assert ctl.ok("compile", graph_file("mlp_fwd")).split()[1] == "compiled"


def test_list_options(ctl):
    compile_two(ctl)
    out = ctl.ok("list", "--sort", "size", "--limit", "1")
    rows = [l for l in out.splitlines() if SIG_RE.match(l[:64])]
    assert len(rows) == 1 and "the first 1 (--limit)" in out and "largest first" in out
    lst = json.loads(ctl.ok("list", "--json", "--sort", "size"))["entries"]
    assert lst[0]["size"] >= lst[1]["size"]
    assert rows[0].startswith(lst[0]["signature"])
    assert len(json.loads(ctl.ok("list", "--json", "--limit", "0"))["entries"]) == 2
    assert json.loads(ctl.ok("list", "--json", "--target", "cuda"))["entries"] == []
    for order in ("last_used", "hits", "created"):
        assert len(json.loads(ctl.ok("list", "--json", "--sort", order))["entries"]) == 2


def test_gc(ctl):
    compile_two(ctl)
    out = ctl.ok("gc")
    assert re.match(r"^gc: evicted 0 entries, 0 B freed; the store holds 2 entries, ", out), out
    out = ctl.ok("gc", "--max-bytes", "1")
    assert re.match(r"^gc: evicted 2 entries, .* freed; the store holds 0 entries, 0 B$", out), out


def test_ping(ctl):
    out = ctl.ok("ping")
    assert re.match(r"^kilnd \d+\.\d+\.\d+ \(protocol 1\) at ", out)
    assert re.search(r"^  fingerprint  kiln/", out, re.M)
    assert re.search(r"^  round trip   [\d.]+ (ms|s) \(connect ", out, re.M), out
    out = ctl.ok("ping", "--count", "5")
    assert re.search(r"^  round trip   5 hellos: min .*, avg .*, max ", out, re.M), out


def test_shutdown_wait_then_verify(ctl):
    compile_two(ctl)
    # verify needs the store to itself: with kilnd running it names the pid
    line = ctl.fails(ERROR, "verify", "--store", ctl.d.store_dir)
    assert f"in use by pid {ctl.d.pid}" in line and "stop kilnd" in line, line
    out = ctl.ok("shutdown", "--wait")
    assert "shutting down" in out and out.endswith("kilnd has stopped\n"), out
    assert ctl.d.wait_exit(10) == 0
    ctl.fails(DOWN, "status")
    out = ctl.ok("verify", "--store", ctl.d.store_dir)
    assert "checked 2 blobs" in out and ": 0 bad, 0 entries dropped" in out, out
    # a blob that rotted: reported, its entry dropped, exit 1
    blobs = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(ctl.d.store_dir, "objects"))
             for f in fs if not f.startswith(".")]
    assert len(blobs) == 2
    with open(blobs[0], "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xfe\xfd")
    p = ctl.run("verify", "--store", ctl.d.store_dir)
    assert p.returncode == ERROR, p.stderr
    assert ": 1 bad, 1 entry dropped" in p.stdout, p.stdout
    assert p.stderr.count("\n") == 1 and "corrupt blob" in p.stderr
    out = ctl.ok("verify", "--store", ctl.d.store_dir)
    assert "checked 1 blob " in out and ": 0 bad" in out
    # the default store: $KILN_STORE_DIR, as kilnd finds its own
    out = ctl.ok("verify", env={"KILN_STORE_DIR": ctl.d.store_dir})
    assert f"store {ctl.d.store_dir}: 1 entry" in out


def test_shutdown_no_drain(ctl):
    assert "not waiting for running compiles" in ctl.ok("shutdown", "--no-drain")
    assert ctl.d.wait_exit(30) == 0
    ctl.fails(DOWN, "ping")


def test_verify_as_root_keeps_the_owner(nobody_kilnctl, kilnctl_bin, make_kilnd, workdir):
    """root verifying a store that belongs to another user (kilnd's) gives
    what opening it created back to that user: no file becomes root's."""
    d = make_kilnd(args=["--workers", "1"])
    ctl = Ctl(kilnctl_bin, d.socket_path)
    ctl.ok("compile", graph_file("mlp_fwd"))
    d.kill9()  # unclean: opening the store rewrites its journal
    # workdir stays root's 0700: kilnctl walks there as root, then drops
    for r, ds, fs in os.walk(d.store_dir):
        for n in ds + fs + ["."]:
            os.chown(os.path.join(r, n), 65534, 65534)
    out = ctl.ok("verify", "--store", d.store_dir)
    assert "checked 1 blob " in out, out
    for r, ds, fs in os.walk(d.store_dir):
        for n in ds + fs:
            st = os.stat(os.path.join(r, n))
            assert st.st_uid == 65534, f"{os.path.join(r, n)} is owned by {st.st_uid}"


def test_metrics_http_listener(make_kilnd):
    """kilnd's metrics_listen: GET /metrics over HTTP gives the same text
    format (parsed and checked like `kilnctl metrics`); other paths 404;
    off by default (no listener without the setting)."""
    import http.client
    import socket as socketmod
    s = socketmod.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = make_kilnd(args=["--metrics-listen", f"127.0.0.1:{port}"])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read().decode()
    assert r.status == 200
    assert r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    fams = parse_prometheus(body)
    assert fams["kiln_connections_current"]["type"] == "gauge"
    assert fams["kiln_requests_total"]["type"] == "counter"
    assert sample(fams, "kiln_compiled_total") == 0
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/other")
    assert conn.getresponse().status == 404
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/metrics", body="x")
    assert conn.getresponse().status == 405
    conn.close()
    # A client that connects and says nothing is dropped, kilnd serves on.
    idle = socketmod.create_connection(("127.0.0.1", port))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200
    conn.close()
    idle.close()
