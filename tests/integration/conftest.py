"""pytest setup for kilnd's integration tests: a real kilnd on a Unix socket
in a temporary directory, with its own store, and a tiny protocol client.

The daemon under test is $KILND (default build/daemon/kilnd relative to the
repository root). Frames are PROTOCOL.md's: a 4-byte big-endian length, then
exactly one msgpack map.
"""

import functools
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import msgpack
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GRAPHS_DIR = os.path.join(ROOT, "tests", "data", "graphs")


def kilnd_path():
    p = os.environ.get("KILND") or os.path.join("build", "daemon", "kilnd")
    if not os.path.isabs(p):
        p = os.path.join(ROOT, p)
    return p


# ---- frames and the client ---------------------------------------------------


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def frame(obj):
    """One frame: length + msgpack map (obj may already be bytes)."""
    body = obj if isinstance(obj, (bytes, bytearray)) else pack(obj)
    return struct.pack(">I", len(body)) + body


def unpack(body):
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


class Closed(Exception):
    """The daemon closed the connection."""


class Client:
    """A blocking client on one connection. Replies may come in any order;
    request() keeps the ones for other ids until they are asked for."""

    def __init__(self, path=None, tcp=None, timeout=60.0):
        if tcp is not None:
            self.sock = socket.create_connection(tcp, timeout=timeout)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.pending = {}

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, msg):
        """Sends a request map (v and id filled in unless present); returns
        its id."""
        msg = dict(msg)
        msg.setdefault("v", 1)
        if "id" not in msg:
            msg["id"] = self.next_id
            self.next_id += 1
        self.sock.sendall(frame(msg))
        return msg["id"]

    def _read_exact(self, n):
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed("connection closed by kilnd")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """The next reply frame, decoded."""
        (n,) = struct.unpack(">I", self._read_exact(4))
        return unpack(self._read_exact(n))

    def wait(self, rid):
        if rid in self.pending:
            return self.pending.pop(rid)
        while True:
            r = self.recv()
            if r.get("id") == rid:
                return r
            self.pending[r.get("id")] = r

    def request(self, op, **fields):
        msg = {"op": op}
        msg.update(fields)
        return self.wait(self.send(msg))

    def closed_within(self, timeout):
        """True when the daemon closes the connection within timeout (any
        replies still in flight are read and dropped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not chunk:
                return True
        return False


def ok(reply):
    assert reply.get("ok") is True, f"expected success, got {reply!r}"
    assert reply.get("v") == 1
    return reply


def err(reply, code):
    assert reply.get("ok") is False, f"expected error {code}, got {reply!r}"
    assert reply["error"]["code"] == code, f"expected {code}, got {reply['error']!r}"
    assert isinstance(reply["error"].get("message"), str) and reply["error"]["message"]
    return reply["error"]


# ---- graphs ------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _graph_bytes(name):
    with open(os.path.join(GRAPHS_DIR, name + ".graph.msgpack"), "rb") as f:
        return f.read()


def graph(name):
    """A fresh copy of a corpus graph (a dict)."""
    return unpack(_graph_bytes(name))


def variant(name, k):
    """A corpus graph with its first float argument nudged by k: a distinct
    graph (another signature) that costs the same to compile."""
    g = graph(name)
    if k == 0:
        return g
    for n in g["nodes"]:
        args = n.get("args", [])
        for i, a in enumerate(args):
            if isinstance(a, float):
                args[i] = a + k * 1e-6
                return g
        kw = n.get("kwargs") or {}
        for key, a in kw.items():
            if isinstance(a, float):
                kw[key] = a + k * 1e-6
                return g
    raise AssertionError(f"{name} has no float argument to vary")


CPU = {"backend": "cpu"}


def compile_msg(g, target=None, **extra):
    m = {"op": "compile", "graph": g, "target": target or CPU}
    m.update(extra)
    return m


# ---- the daemon --------------------------------------------------------------


def wait_for(pred, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Kilnd:
    """One kilnd process. args are extra command-line settings."""

    def __init__(self, workdir, store_dir=None, socket_path=None, args=(),
                 env=None, config=None, cmd_prefix=None):
        self.workdir = workdir
        self.store_dir = store_dir or os.path.join(workdir, "store")
        self.socket_path = socket_path or os.path.join(workdir, "run", "kilnd.sock")
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.config = config
        self.cmd_prefix = list(cmd_prefix or [])
        self.proc = None
        self.returncode = None
        self.log_path = os.path.join(workdir, "kilnd.%d.log" % id(self))
        self.starts = 0

    def command(self):
        cfg = self.config
        if cfg is None:  # never read /etc/kiln/kilnd.conf
            cfg = os.path.join(self.workdir, "empty.conf")
            if not os.path.exists(cfg):
                with open(cfg, "w") as f:
                    f.write("[kilnd]\n")
        return self.cmd_prefix + [
            kilnd_path(), "--config", cfg, "--socket", self.socket_path,
            "--store-dir", self.store_dir, "--log-level", "debug",
        ] + self.args

    def environ(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("KILN_", "LISTEN_", "NOTIFY_SOCKET", "WATCHDOG_"))}
        env.pop("RUNTIME_DIRECTORY", None)
        env.pop("CACHE_DIRECTORY", None)
        # compiles on one thread each: the tests that need a compile still
        # running (timeouts, drain, kills) are sized by single-thread times
        env["KILN_COMPILE_THREADS"] = "1"
        env.update(self.extra_env)
        return env

    def start(self, wait=True, timeout=60):
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        self.log = open(self.log_path, "ab")
        self.log.write(b"==== start %d: %s\n" % (self.starts, " ".join(self.command()).encode()))
        self.log.flush()
        self.proc = subprocess.Popen(self.command(), env=self.environ(),
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.returncode = None
        if wait:
            self.wait_ready(timeout)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout=60):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"kilnd exited with {self.proc.returncode} at start:\n{self.read_log()}")
            try:
                with self.client(timeout=5) as c:
                    return c.request("hello").get("ok")
            except (OSError, Closed):
                return False

        wait_for(ready, timeout, what="kilnd to serve hello")

    def client(self, timeout=60.0):
        return Client(self.socket_path, timeout=timeout)

    def wait_exit(self, timeout=60):
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=60):
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(timeout) is None:
                self.proc.kill()
                self.proc.wait()
                self.returncode = "killed after SIGTERM timeout"
        self.returncode = self.proc.returncode if self.returncode is None else self.returncode
        self.log.close()
        return self.returncode

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.returncode = self.proc.returncode
        self.log.close()

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-8000:]
        except OSError:
            return ""

    # ---- convenience ----
    def status(self, settings=False):
        with self.client() as c:
            return ok(c.request("status", settings=settings) if settings
                      else c.request("status"))

    def stats(self):
        return self.status()["stats"]


@pytest.fixture(scope="session")
def kilnd_binary():
    p = kilnd_path()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.skip(f"kilnd not built: {p} is missing (ninja -C build, or set KILND)")
    return p


@pytest.fixture
def workdir():
    # Short: a socket path must fit in sun_path (108 bytes); pytest's
    # tmp_path can be too long.
    d = tempfile.mkdtemp(prefix="kilnd-it-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_kilnd(kilnd_binary, workdir, request):
    """Factory: make_kilnd(args=[...], start=True, ...) -> Kilnd. Every
    daemon is stopped at teardown (SIGTERM, then SIGKILL); one still
    running then must exit 0 unless the test set d.expect_clean = False."""
    made = []

    def make(args=(), start=True, store_dir=None, socket_path=None, env=None,
             config=None, cmd_prefix=None, wait=True):
        d = Kilnd(workdir, store_dir=store_dir, socket_path=socket_path,
                  args=args, env=env, config=config, cmd_prefix=cmd_prefix)
        d.expect_clean = True
        made.append(d)
        if start:
            d.start(wait=wait)
        return d

    yield make
    failures = []
    for d in made:
        if d.proc is None:
            continue
        was_running = d.running()
        rc = d.stop()
        if was_running and d.expect_clean and rc != 0:
            failures.append(f"kilnd exited {rc} at teardown:\n{d.read_log()}")
    if getattr(request.node, "rep_call_failed", False):
        for d in made:  # the daemons' logs, for the report
            print(d.read_log())
    assert not failures, "\n".join(failures)


@pytest.fixture
def kilnd(make_kilnd):
    """A default kilnd: 2 workers, on a fresh store."""
    return make_kilnd(args=["--workers", "2"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call_failed = rep.failed


__all__ = [
    "Client", "Closed", "Kilnd", "CPU", "ROOT", "GRAPHS_DIR", "compile_msg",
    "err", "frame", "graph", "ok", "pack", "unpack", "variant", "wait_for",
]
