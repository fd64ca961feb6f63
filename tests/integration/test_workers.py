"""kilnd's compile worker processes (daemon/pool.c, daemon/worker.c).

kilnd links no LLVM: compiles run in kiln-compile-worker processes. A worker
that dies in the middle of a compile fails that compile alone (the client
gets compile_failed) and the next compile starts a fresh worker; an idle
worker is stopped after worker_idle_s; a worker that cannot start fails
kilnd's start-up with a message naming it.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, ROOT)  # tests.integration.pyclient
KILND = os.environ.get("KILND", os.path.join(ROOT, "build", "daemon", "kilnd"))
GRAPHS = os.path.join(ROOT, "tests", "data", "graphs")


def load(name):
    with open(os.path.join(GRAPHS, name + ".graph.msgpack"), "rb") as f:
        return msgpack.unpackb(f.read(), raw=False)


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def start(d, *extra):
    from tests.integration.pyclient import Client
    sock = os.path.join(d, "k.sock")
    proc = subprocess.Popen([KILND, "--socket", sock, "--store-dir",
                             os.path.join(d, "store"), "--log-level", "warn",
                             *extra])
    for _ in range(200):
        try:
            Client(sock).close()
            return proc, sock
        except OSError:
            if proc.poll() is not None:
                return proc, None
            time.sleep(0.05)
    proc.kill()
    pytest.fail("kilnd did not start")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_kilnd_itself_maps_no_llvm():
    with tempfile.TemporaryDirectory() as d:
        proc, sock = start(d)
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                assert "libLLVM" not in f.read()
            kids = children(proc.pid)
            assert len(kids) == 1  # the first worker, started for hello
            with open(f"/proc/{kids[0]}/maps") as f:
                assert "libLLVM" in f.read()
        finally:
            stop(proc)


def test_worker_killed_mid_compile_fails_that_compile_only():
    from tests.integration.pyclient import Client, KilnError
    with tempfile.TemporaryDirectory() as d:
        proc, sock = start(d, "--workers", "1")
        try:
            slow = load("efficientnet_fwd")  # the largest graph
            got = {}

            def compile_slow():
                with Client(sock) as c:
                    try:
                        got["r"] = c.compile(slow)
                    except KilnError as e:
                        got["e"] = e

            t = threading.Thread(target=compile_slow)
            t.start()
            # Kill the worker once it is compiling (the busy thread).
            with Client(sock) as c:
                for _ in range(1000):
                    if c.status()["stats"]["workers"]["busy"] == 1:
                        break
                    time.sleep(0.005)
            kids = children(proc.pid)
            assert len(kids) == 1
            os.kill(kids[0], signal.SIGKILL)
            t.join(timeout=60)
            assert "e" in got, got
            assert got["e"].code == "compile_failed"
            assert "signal 9" in got["e"].message
            # The daemon serves on: a new worker compiles the next graph.
            with Client(sock) as c:
                r = c.compile(load("mlp_fwd"))
                assert r["source"] == "compiled"
                st = c.status()["stats"]["workers"]
                assert st["crashes"] == 1
                assert st["spawns"] == 2
        finally:
            stop(proc)


def test_idle_worker_is_stopped_and_restarted_on_demand():
    from tests.integration.pyclient import Client
    with tempfile.TemporaryDirectory() as d:
        proc, sock = start(d, "--workers", "1", "--worker-idle-s", "1")
        try:
            for _ in range(100):
                if not children(proc.pid):
                    break
                time.sleep(0.1)
            assert children(proc.pid) == []
            with Client(sock) as c:
                assert c.compile(load("mlp_fwd"))["source"] == "compiled"
                assert c.status()["stats"]["workers"]["spawns"] == 2
        finally:
            stop(proc)


def test_missing_worker_fails_start_with_its_name():
    with tempfile.TemporaryDirectory() as d:
        bogus = os.path.join(d, "no-such-worker")
        r = subprocess.run([KILND, "--socket", os.path.join(d, "k.sock"),
                            "--store-dir", os.path.join(d, "store"),
                            "--compile-worker", bogus],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert bogus in r.stderr
