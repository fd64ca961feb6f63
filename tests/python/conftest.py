"""pytest setup for kiln's Python tests (offline, CPU only)."""

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's caches (Inductor's, and the AOTAutograd entries kiln's backend
# writes) in a directory of this session: nothing from an earlier run
if "KILN_TEST_TORCH_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["KILN_TEST_TORCH_CACHE"] = tempfile.mkdtemp(prefix="kiln-torch-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["KILN_TEST_TORCH_CACHE"]
    atexit.register(shutil.rmtree, os.environ["KILN_TEST_TORCH_CACHE"], True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (os.path.join(ROOT, "clients", "python"), os.path.join(ROOT, "tests", "data")):
    if p not in sys.path:
        sys.path.insert(0, p)

CORPUS_DIR = os.path.join(ROOT, "tests", "data", "graphs")


def kilnc_path():
    build = os.environ.get("KILN_BUILD_DIR") or os.path.join(ROOT, "build")
    return os.path.join(build, "compiler", "kilnc")


@pytest.fixture(scope="session")
def corpus_dir():
    return CORPUS_DIR


@pytest.fixture(scope="session")
def kilnc():
    path = kilnc_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kilnc not built: {path} is missing (set KILN_BUILD_DIR)")
    return path


# ---- kilnd for the backend tests ----------------------------------------------
# The torch backend talks to kilnd through libkiln. These fixtures start a real
# kilnd (build/daemon/kilnd, or $KILND) on a Unix socket in a short temp dir with
# its own store, point the backend at it ($KILN_SOCKET) and never auto-start a
# per-user daemon ($KILN_AUTOSTART=0). Each daemon is stopped by its fixture.

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _kilnd_class():
    from tests.integration.conftest import Kilnd, kilnd_path
    p = kilnd_path()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.skip(f"kilnd not built: {p} is missing (ninja -C build, or set KILND)")
    return Kilnd


class _Daemons:
    """Starts kilnds in one temp dir; stops them all at teardown."""

    def __init__(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="kiln-py-", dir="/tmp")
        self.made = []

    def start(self, name="d", args=("--workers", "2"), store_dir=None):
        Kilnd = _kilnd_class()
        wd = os.path.join(self.dir, name)
        os.makedirs(wd, exist_ok=True)
        d = Kilnd(wd, store_dir=store_dir, args=list(args))
        d.start()
        self.made.append(d)
        return d

    def close(self):
        import shutil
        for d in self.made:
            if d.proc is not None and d.running():
                d.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _use(d, monkeypatch=None):
    env = {"KILN_SOCKET": d.socket_path, "KILN_AUTOSTART": "0"}
    for k, v in env.items():
        if monkeypatch is not None:
            monkeypatch.setenv(k, v)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def kiln_daemon():
    """One kilnd for the session (a fresh store): models compiled by one test
    are memory hits for the next. Sets KILN_SOCKET / KILN_AUTOSTART=0."""
    ds = _Daemons()
    d = ds.start("session")
    old = {k: os.environ.get(k) for k in ("KILN_SOCKET", "KILN_AUTOSTART")}
    _use(d)
    yield d
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    ds.close()


@pytest.fixture
def daemons(monkeypatch):
    """Factory for private kilnds: daemons.start(name, args, store_dir) -> Kilnd;
    use(d) points the backend (and child processes) at d."""
    ds = _Daemons()
    ds.use = lambda d: _use(d, monkeypatch)
    monkeypatch.setenv("KILN_AUTOSTART", "0")
    yield ds
    ds.close()


@pytest.fixture(autouse=True)
def _fresh_backend():
    """Every test starts with an empty per-process kiln cache and Dynamo reset."""
    try:
        import torch
        import kiln.backend as kb
    except ImportError:
        yield
        return
    torch._dynamo.reset()
    kb.reset()
    kb._state.clients.clear()
    yield
    torch._dynamo.reset()
    kb._state.clients.clear()
